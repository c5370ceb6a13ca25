//! Every raw syscall the local engine makes, each `unsafe` block with its justification.
//!
//! Nothing outside this module calls `libc` functions that need `unsafe`.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn cstr(path: &Path) -> io::Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

/// A `SOCK_SEQPACKET` socketpair, both ends close-on-exec.
pub fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType};
    Ok(rustix::net::socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?)
}

/// A pipe, both ends close-on-exec.
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?)
}

/// A close-on-exec pipe for a child's output: `(ours, theirs)`, the read end non-blocking
/// (for the event loop), the write end blocking (as programs expect their stdout).
pub fn output_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    use rustix::pipe::PipeFlags;
    let (ours, theirs) = rustix::pipe::pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK)?;
    // Each end is its own open file description: this clears the write end's flag only.
    rustix::fs::fcntl_setfl(&theirs, rustix::fs::OFlags::empty())?;
    Ok((ours, theirs))
}

/// Send one message with optional file descriptors attached (`SCM_RIGHTS`).
pub fn send_with_fds(sock: RawFd, data: &[u8], fds: &[RawFd]) -> io::Result<usize> {
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let fd_bytes = std::mem::size_of_val(fds);
    // SAFETY: CMSG_SPACE is a pure computation on its argument.
    let space = unsafe { libc::CMSG_SPACE(fd_bytes as u32) } as usize;
    let mut cbuf = vec![0u64; space.div_ceil(8).max(1)];
    // SAFETY: msghdr is plain old data; zeroed is a valid initial value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = space;
        // SAFETY: msg_control points at `space` bytes, enough for one header carrying
        // `fds.len()` descriptors; CMSG_FIRSTHDR/CMSG_DATA stay inside that buffer.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(fd_bytes as u32) as usize;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr() as *const u8,
                libc::CMSG_DATA(cmsg),
                fd_bytes,
            );
        }
    }
    // SAFETY: msg and everything it points to are valid for the duration of the call.
    let n = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Receive one message and any descriptors attached to it (made close-on-exec).
/// Returns `(0, [])` at end of stream.
pub fn recv_with_fds(sock: RawFd, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    let mut cbuf = [0u64; 32];
    // SAFETY: msghdr is plain old data; zeroed is a valid initial value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = std::mem::size_of_val(&cbuf);
    // SAFETY: msg points at valid buffers owned by this frame.
    let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut fds = Vec::new();
    // SAFETY: the kernel filled msg_control with well-formed headers up to msg_controllen;
    // the CMSG_* macros walk exactly that region, and each SCM_RIGHTS payload is an array of
    // freshly installed descriptors that we now own.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg);
                let len = (*cmsg).cmsg_len as usize - (data as usize - cmsg as usize);
                let count = len / std::mem::size_of::<RawFd>();
                for i in 0..count {
                    let fd = std::ptr::read_unaligned((data as *const RawFd).add(i));
                    fds.push(OwnedFd::from_raw_fd(fd));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if msg.msg_flags & libc::MSG_TRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "control message larger than the receive buffer",
        ));
    }
    Ok((n as usize, fds))
}

/// The uid of the peer of a connected unix socket.
pub fn peer_uid(sock: impl AsFd) -> io::Result<u32> {
    Ok(rustix::net::sockopt::socket_peercred(sock)?.uid.as_raw())
}

/// The socket buffer size asked for on a connection between the engine and an agent: a
/// whole file frame (`proto::MAX_BODY` and its header) fits, so a 1 MiB frame moves in one
/// write and wakes its reader about once, where the default (about 208 KiB) takes several
/// rounds of each side. It bounds the bytes queued, it is not memory set aside.
pub const AGENT_SOCKET_BUFFER: usize = 1 << 20;

/// Ask for [`AGENT_SOCKET_BUFFER`]-sized send and receive buffers on a unix stream socket to
/// or from an agent (on such a socket the sender's buffer bounds the bytes in flight). Best
/// effort, on purpose: without `CAP_NET_ADMIN` (rootless) the kernel caps the size at
/// `net.core.wmem_max` / `rmem_max`, and a refused or capped size only leaves the socket
/// slower. This is a speed knob; nothing relies on it as a bound.
pub fn grow_socket_buffers(sock: impl AsFd) {
    let _ = rustix::net::sockopt::set_socket_send_buffer_size(&sock, AGENT_SOCKET_BUFFER);
    let _ = rustix::net::sockopt::set_socket_recv_buffer_size(&sock, AGENT_SOCKET_BUFFER);
}

/// Effective uid of this process.
pub fn geteuid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// Effective gid of this process.
pub fn getegid() -> u32 {
    rustix::process::getegid().as_raw()
}

/// `setresgid` then `setresuid` to the same ids.
pub fn set_all_ids(uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: plain id syscalls.
    unsafe {
        cvt(libc::setresgid(gid, gid, gid))?;
        cvt(libc::setresuid(uid, uid, uid))?;
    }
    Ok(())
}

/// Ignore SIGPIPE: a closed peer must be an error return, not a dead process. (Rust's runtime
/// does this for `main`, but the engine's roles start before `main`.)
pub fn ignore_sigpipe() {
    // SAFETY: installing SIG_IGN has no memory-safety preconditions.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
}

/// Give every signal its default action again, SIGPIPE excepted (kept ignored, see
/// [`ignore_sigpipe`]), and block none: an ignored disposition and the signal mask survive
/// `fork` and `exec`, so whatever the launching program ignored (`nohup`'s SIGHUP, the
/// SIGINT and SIGQUIT a shell ignores for background jobs, even the real-time signals the C
/// library reserves) would otherwise reach every monitor, agent and sandbox process.
/// Handlers need no reset: `exec` already did that.
pub fn default_signal_dispositions() {
    // SAFETY: an empty set, then unblocking all, through valid pointers.
    unsafe {
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
    }
    for signal in 1..=KERNEL_LAST_SIGNAL {
        if signal == libc::SIGPIPE || signal == libc::SIGKILL || signal == libc::SIGSTOP {
            continue;
        }
        if kernel_signal_handler(signal) == Some(libc::SIG_IGN) {
            let _ = kernel_default_signal(signal);
        }
    }
}

/// The last signal number of the kernel's `rt_sigaction` (`_NSIG` on Linux).
const KERNEL_LAST_SIGNAL: libc::c_int = 64;

/// The kernel's `struct sigaction` on the architectures we build for (x86_64, aarch64): the
/// handler first, then flags, restorer and a 64-bit mask; 32 bytes in all.
type KernelSigaction = [u64; 4];

/// The handler of `signal` as the kernel holds it, by a raw `rt_sigaction`: the C library's
/// wrapper refuses the real-time signals it reserves for itself (32 and 33), whose
/// dispositions are inherited all the same. `None` for a number the kernel refuses.
/// Async-signal-safe: one syscall on stack memory.
pub fn kernel_signal_handler(signal: libc::c_int) -> Option<usize> {
    let mut old: KernelSigaction = [0; 4];
    // SAFETY: no new action; the old one is written to `old`, of the kernel's size, whose
    // mask size (8 bytes) is passed.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_rt_sigaction,
            signal,
            std::ptr::null::<KernelSigaction>(),
            &mut old as *mut KernelSigaction,
            8,
        )
    };
    (rc == 0).then_some(old[0] as usize)
}

/// Give `signal` its default disposition, by a raw `rt_sigaction` (see
/// [`kernel_signal_handler`]). Async-signal-safe.
pub fn kernel_default_signal(signal: libc::c_int) -> io::Result<()> {
    // All zeroes: SIG_DFL, no flags, no restorer, an empty mask.
    let default: KernelSigaction = [0; 4];
    // SAFETY: `default` is a valid kernel sigaction; the old one is not asked for.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_rt_sigaction,
            signal,
            &default as *const KernelSigaction,
            std::ptr::null_mut::<KernelSigaction>(),
            8,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `true`: children of this process are reaped by the kernel as they exit (`SIGCHLD`
/// ignored), so nothing waits for them; `false`: the default disposition back. Inherited by
/// `fork` and kept across `execve`, so a process that starts others with `true` resets it
/// in each child that waits for children of its own.
pub fn set_child_autoreap(on: bool) -> io::Result<()> {
    let handler = if on { libc::SIG_IGN } else { libc::SIG_DFL };
    // SAFETY: sigaction is plain data; zeroed (empty mask, no flags) is a valid value.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = handler;
    // SAFETY: installing SIG_IGN or SIG_DFL has no memory-safety preconditions; `action` is
    // a valid sigaction and the old one is not asked for.
    cvt(unsafe { libc::sigaction(libc::SIGCHLD, &action, std::ptr::null_mut()) }).map(drop)
}

/// `unshare(2)`.
pub fn unshare(flags: libc::c_int) -> io::Result<()> {
    // SAFETY: unshare takes plain flags.
    cvt(unsafe { libc::unshare(flags) }).map(drop)
}

/// Set close-on-exec on `fd`.
pub fn set_cloexec(fd: impl AsFd) -> io::Result<()> {
    Ok(rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::CLOEXEC)?)
}

/// Clear close-on-exec on `fd` so a child keeps it across `exec`. Takes a raw descriptor: it
/// runs in a forked child, on descriptor numbers inherited from the parent.
pub fn clear_cloexec(fd: RawFd) -> io::Result<()> {
    // SAFETY: F_SETFD takes an integer flag.
    cvt(unsafe { libc::fcntl(fd, libc::F_SETFD, 0) }).map(drop)
}

/// Register an owned descriptor with the tokio reactor.
pub fn async_fd(fd: OwnedFd) -> io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    // SAFETY: the AsyncFd takes ownership of `fd`, so the descriptor stays open (and is not
    // reused) for as long as it is registered, and is closed only after deregistration.
    Ok(unsafe { tokio::io::unix::AsyncFd::register(fd) }?)
}

/// Fork. The caller must be single-threaded (it is: the spawner, which has no threads).
pub fn fork() -> io::Result<libc::pid_t> {
    // SAFETY: called only from the single-threaded spawner, so the child inherits no locks
    // held by other threads.
    cvt(unsafe { libc::fork() })
}

/// `clone(2)` with fork semantics (new stack copy) into fresh namespaces.
/// Returns 0 in the child. The caller must be single-threaded.
pub fn clone_into_namespaces(flags: libc::c_int) -> io::Result<libc::pid_t> {
    // SAFETY: with a null stack the raw clone syscall behaves like fork: the child gets a
    // copy-on-write copy of this (single-threaded) process and returns 0.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (flags | libc::SIGCHLD) as libc::c_ulong,
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::c_void>(),
            0 as libc::c_ulong,
        )
    };
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret as libc::pid_t)
    }
}

/// Leave the process group and session of the parent.
pub fn setsid() -> io::Result<()> {
    rustix::process::setsid()?;
    Ok(())
}

/// Exit immediately without running destructors or atexit handlers (after fork).
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit never returns and is async-signal-safe.
    unsafe { libc::_exit(code) }
}

/// Ask the kernel to send `signal` to us when the parent thread dies.
pub fn set_parent_death_signal(signal: i32) -> io::Result<()> {
    // SAFETY: PR_SET_PDEATHSIG takes a signal number; no pointers involved.
    cvt(unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, signal as libc::c_ulong, 0, 0, 0) }).map(drop)
}

/// Make this process non-dumpable: no core dumps, no ptrace or `/proc/<pid>` access by
/// processes of the same uid that lack privileges over it.
pub fn set_non_dumpable() -> io::Result<()> {
    Ok(rustix::process::set_dumpable_behavior(
        rustix::process::DumpableBehavior::NotDumpable,
    )?)
}

/// Name this thread/process as shown by `ps`.
pub fn set_process_name(name: &str) {
    let name = CString::new(name.replace('\0', "")).unwrap_or_default();
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes (the kernel
    // truncates); `name` lives across the call.
    unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr() as libc::c_ulong, 0, 0, 0) };
}

/// Make descriptor `to` a copy of `fd` (`dup2(2)`; the copy is not close-on-exec).
pub fn dup2(fd: impl AsFd, to: RawFd) -> io::Result<()> {
    // SAFETY: a plain syscall on integers; `fd` is open for the call.
    cvt(unsafe { libc::dup2(fd.as_fd().as_raw_fd(), to) }).map(drop)
}

/// `kill(2)`.
pub fn kill(pid: libc::pid_t, signal: i32) -> io::Result<()> {
    // SAFETY: kill has no memory-safety preconditions.
    cvt(unsafe { libc::kill(pid, signal) }).map(drop)
}

/// How a waited-for child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitStatus {
    /// Exited with a code.
    Exited(i32),
    /// Killed by a signal.
    Signaled(i32),
}

/// `waitpid(pid, WNOHANG)`: `Ok(None)` while nothing has ended.
pub fn waitpid_nohang(pid: libc::pid_t) -> io::Result<Option<(libc::pid_t, WaitStatus)>> {
    let mut status = 0;
    // SAFETY: status is a valid out-pointer.
    let ret = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    if ret == 0 {
        return Ok(None);
    }
    Ok(Some((ret, decode_status(status))))
}

/// Blocking `waitpid(pid)`, retried on EINTR.
pub fn waitpid_blocking(pid: libc::pid_t) -> io::Result<WaitStatus> {
    loop {
        let mut status = 0;
        // SAFETY: status is a valid out-pointer.
        let ret = unsafe { libc::waitpid(pid, &mut status, 0) };
        if ret >= 0 {
            return Ok(decode_status(status));
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

fn decode_status(status: libc::c_int) -> WaitStatus {
    if libc::WIFSIGNALED(status) {
        WaitStatus::Signaled(libc::WTERMSIG(status))
    } else {
        WaitStatus::Exited(libc::WEXITSTATUS(status))
    }
}

/// `flock(LOCK_EX | LOCK_NB)`: `Ok(false)` when another open file description holds it.
pub fn try_lock_exclusive(fd: impl AsFd) -> io::Result<bool> {
    match rustix::fs::flock(fd, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(true),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// `flock(LOCK_EX)`, waiting for the holder; retried when a signal interrupts the wait.
pub fn lock_exclusive(fd: impl AsFd) -> io::Result<()> {
    loop {
        match rustix::fs::flock(&fd, rustix::fs::FlockOperation::LockExclusive) {
            Ok(()) => return Ok(()),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Set or clear `O_NONBLOCK`.
pub fn set_nonblocking(fd: impl AsFd, on: bool) -> io::Result<()> {
    use rustix::fs::OFlags;
    let mut flags = rustix::fs::fcntl_getfl(&fd)?;
    flags.set(OFlags::NONBLOCK, on);
    Ok(rustix::fs::fcntl_setfl(&fd, flags)?)
}

/// `mount(2)`. `None` arguments are passed as NULL.
pub fn mount(
    source: Option<&Path>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> io::Result<()> {
    let source = source.map(cstr).transpose()?;
    let target = cstr(target)?;
    let fstype = fstype.map(|s| CString::new(s).unwrap_or_default());
    let data = data.map(|s| CString::new(s).unwrap_or_default());
    let ptr = |c: &Option<CString>| c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: every pointer is NULL or a NUL-terminated string alive for the call.
    cvt(unsafe {
        libc::mount(
            ptr(&source),
            target.as_ptr(),
            ptr(&fstype),
            flags,
            ptr(&data) as *const libc::c_void,
        )
    })
    .map(drop)
    .map_err(|e| io::Error::new(e.kind(), format!("mount {}: {e}", target.to_string_lossy())))
}

/// Mount flags of the filesystem holding `path` that a bind remount must keep (the kernel
/// refuses to clear locked flags inherited from a more privileged namespace).
pub fn locked_mount_flags(path: &Path) -> io::Result<libc::c_ulong> {
    let c = cstr(path)?;
    // SAFETY: statvfs is plain old data; `c` is a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid path pointer and output buffer.
    cvt(unsafe { libc::statvfs(c.as_ptr(), &mut st) })?;
    let mut flags = 0;
    for (st_flag, ms_flag) in [
        (libc::ST_NOSUID, libc::MS_NOSUID),
        (libc::ST_NODEV, libc::MS_NODEV),
        (libc::ST_NOEXEC, libc::MS_NOEXEC),
        (libc::ST_NOATIME, libc::MS_NOATIME),
        (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
        (libc::ST_RELATIME, libc::MS_RELATIME),
    ] {
        if st.f_flag & st_flag != 0 {
            flags |= ms_flag;
        }
    }
    Ok(flags)
}

/// Switch the root of this mount namespace to the current directory and detach the old one.
pub fn pivot_root_here() -> io::Result<()> {
    let dot = CString::new(".").unwrap_or_default();
    // SAFETY: pivot_root(".", ".") stacks the old root on top of the new one; both pointers
    // are valid C strings. umount2 then detaches the old root.
    unsafe {
        cvt(libc::syscall(libc::SYS_pivot_root, dot.as_ptr(), dot.as_ptr()) as libc::c_int)?;
        cvt(libc::umount2(dot.as_ptr(), libc::MNT_DETACH))?;
    }
    Ok(())
}

/// Set the hostname of this UTS namespace.
pub fn sethostname(name: &str) -> io::Result<()> {
    Ok(rustix::system::sethostname(name.as_bytes())?)
}

/// Bring the loopback interface up (in a fresh network namespace it starts down).
pub fn loopback_up() -> io::Result<()> {
    // SAFETY: a plain socket for the ioctl; closed by OwnedFd.
    let sock =
        cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: socket() returned a fresh fd.
    let sock = unsafe { OwnedFd::from_raw_fd(sock) };
    // SAFETY: ifreq is plain old data.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS/SIOCSIFFLAGS read and write `req`, a valid ifreq.
    unsafe {
        cvt(libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req))?;
        req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        cvt(libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req))?;
    }
    Ok(())
}

/// Set a resource limit (soft and hard).
pub fn setrlimit(resource: libc::__rlimit_resource_t, limit: u64) -> io::Result<()> {
    let rl = libc::rlimit {
        rlim_cur: limit,
        rlim_max: limit,
    };
    // SAFETY: rl is a valid rlimit value.
    cvt(unsafe { libc::setrlimit(resource, &rl) }).map(drop)
}

/// `getrlimit(2)`: (soft, hard).
pub fn getrlimit(resource: libc::__rlimit_resource_t) -> io::Result<(u64, u64)> {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: rl is a valid, writable rlimit value.
    cvt(unsafe { libc::getrlimit(resource, &mut rl) })?;
    Ok((rl.rlim_cur, rl.rlim_max))
}

/// `setrlimit(2)` with distinct soft and hard values.
pub fn setrlimit_pair(resource: libc::__rlimit_resource_t, soft: u64, hard: u64) -> io::Result<()> {
    let rl = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: rl is a valid rlimit value.
    cvt(unsafe { libc::setrlimit(resource, &rl) }).map(drop)
}

/// Change the working directory to `/`.
pub fn chdir_root() -> io::Result<()> {
    // SAFETY: a NUL-terminated static path.
    cvt(unsafe { libc::chdir(c"/".as_ptr()) }).map(drop)
}

/// Raise this process's soft `RLIMIT_NOFILE` to its hard limit, once per process.
///
/// An engine holding hundreds of sandboxes keeps pipes, sockets and lock files for each, and
/// the usual soft limit (1024) is reached near 400 sandboxes while the hard limit allows far
/// more. Sandboxed processes never inherit the raised value: the agent sets their own limit.
/// Best effort: a limit that cannot be read or raised stays as it was.
pub fn raise_nofile_soft_limit() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let mut rl = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: rl is a valid, writable rlimit value.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } != 0
            || rl.rlim_cur >= rl.rlim_max
        {
            return;
        }
        rl.rlim_cur = rl.rlim_max;
        // SAFETY: rl is a valid rlimit value with rlim_cur <= rlim_max.
        let _ = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &rl) };
    });
}

/// The capability sets of the calling thread, as `capget`/`capset` take them (version 3: two
/// 32-bit words per set, low word first).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

const CAP_HEADER_V3: CapHeader = CapHeader {
    version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
    pid: 0,
};

/// Empty the calling thread's capability bounding set, keeping every capability it holds
/// reachable through `execve` for its own helpers as uid 0. Run once by the agent,
/// single-threaded, before any thread or process exists that would keep the old sets
/// (bounding and inheritable sets are per thread and copied at `clone`).
///
/// Why this is enough, and why it weakens nothing:
///
/// - For a uid-0 `execve` the kernel gives P' = (P(I) & F(I)) | (F(P) & bounding) | ambient,
///   with F(I) = F(P) = all. With an empty bounding set that is exactly the caller's
///   inheritable set. So the inheritable set is raised to the permitted set first (the
///   kernel refuses an inheritable capability outside the bounding set, so the order
///   matters), and the agent's helpers (`tar` for snapshots, run as the sandbox's root from
///   the read-only host `/usr`) keep the capabilities they had. `no_new_privs` (set by the
///   seccomp install) caps P' at the caller's permitted set, which is unchanged.
/// - A sandbox process (`harden_child`) sets its inheritable, permitted and effective sets to
///   zero and clears the ambient set. With I = 0, A = 0 and the bounding set inherited empty,
///   every `execve` it or its descendants make yields P' = 0: as uid 0, as a setuid-root
///   program, or as a program with file capabilities (the host directories are also
///   mounted `nosuid`, and `no_new_privs` forbids any gain). Nothing can refill the
///   inheritable set either: `capset` may only add an inheritable capability that is in the
///   bounding set (empty) and in the permitted set (empty), and the bounding set can only
///   shrink.
/// - Before, each sandbox process emptied its own bounding set (41 `PR_CAPBSET_DROP` calls, a
///   credential copy each); the result at its `execve` is the same, now reached once.
/// - Processes the agent starts without `harden_child` are its helpers only (`tar`, whose
///   argument list the agent builds and which reads no program from the sandbox); they
///   held every capability before through the full bounding set and hold the same now.
///
/// Async-signal-safe.
pub fn empty_bounding_set_keep_inheritable() -> io::Result<()> {
    let header = CAP_HEADER_V3;
    let mut data = [CapData::default(); 2];
    // SAFETY: `header` and `data` are valid for the call; v3 reads two `CapData` entries.
    cvt(unsafe { libc::syscall(libc::SYS_capget, &header, data.as_mut_ptr()) } as libc::c_int)?;
    for set in &mut data {
        set.inheritable = set.permitted;
    }
    // SAFETY: as above; the kernel reads two entries.
    cvt(unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) } as libc::c_int)?;
    for cap in 0..=63 {
        // SAFETY: a plain prctl on integers.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) } == -1 {
            match io::Error::last_os_error().raw_os_error() {
                Some(libc::EINVAL) => break, // past the last capability this kernel knows
                _ => return Err(io::Error::last_os_error()),
            }
        }
    }
    Ok(())
}

/// Everything a freshly forked child does before `exec` to become an unprivileged sandbox
/// process. Only async-signal-safe syscalls: it runs between fork and exec.
///
/// It relies on what the agent set up once for every process it starts: an empty bounding set
/// (see [`empty_bounding_set_keep_inheritable`]; checked here, fail closed) and
/// `no_new_privs` with the seccomp filter (`seccomp::install`; checked before the spawn).
pub fn harden_child(uid: u32, gid: u32, nproc: u64, nofile: u64) -> io::Result<()> {
    // SAFETY: each call is a plain syscall on integers or on stack values valid for the call.
    unsafe {
        // The agent empties the bounding set all at once or fails its setup, so one
        // capability still in it means this line of threads never went through that.
        const CAP_CHOWN: libc::c_ulong = 0;
        if cvt(libc::prctl(libc::PR_CAPBSET_READ, CAP_CHOWN, 0, 0, 0))? != 0 {
            return Err(io::Error::from_raw_os_error(libc::EPERM));
        }
        cvt(libc::setsid())?;
        let nproc_rl = libc::rlimit {
            rlim_cur: nproc,
            rlim_max: nproc,
        };
        cvt(libc::setrlimit(libc::RLIMIT_NPROC, &nproc_rl))?;
        let nofile_rl = libc::rlimit {
            rlim_cur: nofile,
            rlim_max: nofile,
        };
        cvt(libc::setrlimit(libc::RLIMIT_NOFILE, &nofile_rl))?;
        // setgroups is denied in a single-uid namespace; there are no groups to drop then.
        // Raw syscalls, not the C library's wrappers: in a child that shares its parent's
        // memory (see `spawn`), those would try to change every thread of the parent too.
        let groups: [libc::gid_t; 0] = [];
        if libc::syscall(libc::SYS_setgroups, 0, groups.as_ptr()) == -1
            && *libc::__errno_location() != libc::EPERM
        {
            return Err(io::Error::last_os_error());
        }
        cvt(libc::syscall(libc::SYS_setresgid, gid, gid, gid) as libc::c_int)?;
        cvt(libc::syscall(libc::SYS_setresuid, uid, uid, uid) as libc::c_int)?;
        // Then the ambient, effective, permitted and inheritable sets. The inheritable set
        // is the agent's full one until here: clearing it is what keeps a uid-0 exec from
        // regaining it, so a failure stops the start.
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        );
        let header = CAP_HEADER_V3;
        let data = [CapData::default(); 2];
        cvt(libc::syscall(libc::SYS_capset, &header, data.as_ptr()) as libc::c_int)?;
    }
    Ok(())
}

/// Write a whole file at a `/proc` path (uid_map and friends need a single write).
pub fn write_proc_file(path: &str, contents: &str) -> io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().write(true).open(path)?;
    f.write_all(contents.as_bytes())
        .map_err(|e| io::Error::new(e.kind(), format!("write {path}: {e}")))
}

/// A new pseudo-terminal pair `(master, slave)` of the given size, both close-on-exec.
pub fn openpty(cols: u16, rows: u16) -> io::Result<(OwnedFd, OwnedFd)> {
    // SAFETY: posix_openpt returns a fresh fd or -1.
    let master =
        cvt(unsafe { libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC) })?;
    // SAFETY: `master` was just opened and is owned by nobody else.
    let master = unsafe { OwnedFd::from_raw_fd(master) };
    let mut name = [0 as libc::c_char; 128];
    // SAFETY: grantpt/unlockpt take the master fd; ptsname_r writes a NUL-terminated name of at
    // most `name.len()` bytes into our buffer.
    unsafe {
        cvt(libc::grantpt(master.as_raw_fd()))?;
        cvt(libc::unlockpt(master.as_raw_fd()))?;
        let r = libc::ptsname_r(master.as_raw_fd(), name.as_mut_ptr(), name.len());
        if r != 0 {
            return Err(io::Error::from_raw_os_error(r));
        }
    }
    // SAFETY: ptsname_r NUL-terminated the buffer.
    let slave = cvt(unsafe {
        libc::open(
            name.as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        )
    })?;
    // SAFETY: fresh fd.
    let slave = unsafe { OwnedFd::from_raw_fd(slave) };
    set_winsize(master.as_fd(), cols, rows)?;
    Ok((master, slave))
}

/// Set a terminal's size.
pub fn set_winsize(fd: impl AsFd, cols: u16, rows: u16) -> io::Result<()> {
    let size = rustix::termios::Winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    Ok(rustix::termios::tcsetwinsize(fd, size)?)
}

/// In a forked child: make fd 0 (a terminal) the controlling terminal of the new session.
pub fn set_controlling_tty() -> io::Result<()> {
    // SAFETY: TIOCSCTTY on fd 0 with argument 0; no pointers.
    cvt(unsafe { libc::ioctl(0, libc::TIOCSCTTY, 0) }).map(drop)
}

/// Read from a descriptor (non-blocking ones return `WouldBlock`).
pub fn read_fd(fd: impl AsFd, buf: &mut [u8]) -> io::Result<usize> {
    Ok(rustix::io::read(fd, buf)?)
}

/// Write to a descriptor (non-blocking ones return `WouldBlock`).
pub fn write_fd(fd: impl AsFd, buf: &[u8]) -> io::Result<usize> {
    Ok(rustix::io::write(fd, buf)?)
}

/// Send on a socket without raising `SIGPIPE` (a gone peer is `BrokenPipe`) and without
/// blocking (a full socket is `WouldBlock`).
pub fn send_nosignal(sock: impl AsFd, buf: &[u8]) -> io::Result<usize> {
    use rustix::net::SendFlags;
    Ok(rustix::net::send(
        sock,
        buf,
        SendFlags::NOSIGNAL | SendFlags::DONTWAIT,
    )?)
}

/// A non-blocking, close-on-exec inotify instance.
pub fn inotify_init() -> io::Result<OwnedFd> {
    use rustix::fs::inotify::CreateFlags;
    Ok(rustix::fs::inotify::init(
        CreateFlags::NONBLOCK | CreateFlags::CLOEXEC,
    )?)
}

/// Watch `path` for the given inotify event mask; returns the watch descriptor. Takes a raw
/// descriptor: the watch scan runs on a blocking thread while the instance is owned elsewhere.
pub fn inotify_add_watch(fd: RawFd, path: &Path, mask: u32) -> io::Result<i32> {
    let c = cstr(path)?;
    // SAFETY: valid fd and C string.
    cvt(unsafe { libc::inotify_add_watch(fd, c.as_ptr(), mask) })
}

/// One decoded inotify event.
#[derive(Debug, Clone)]
pub struct InotifyEvent {
    /// Watch descriptor.
    pub wd: i32,
    /// Event mask.
    pub mask: u32,
    /// Name within the watched directory (empty for the directory itself), as raw bytes.
    pub name: std::ffi::OsString,
}

/// Decode a buffer of `struct inotify_event` records as read from an inotify fd.
pub fn parse_inotify(buf: &[u8]) -> Vec<InotifyEvent> {
    let header = std::mem::size_of::<libc::inotify_event>();
    let mut out = Vec::new();
    let mut off = 0;
    while off + header <= buf.len() {
        // SAFETY: at least `header` bytes remain; read_unaligned copes with any alignment.
        let ev: libc::inotify_event =
            unsafe { std::ptr::read_unaligned(buf[off..].as_ptr() as *const libc::inotify_event) };
        let name_start = off + header;
        let name_end = (name_start + ev.len as usize).min(buf.len());
        let raw = &buf[name_start..name_end];
        let name = <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(
            raw.split(|b| *b == 0).next().unwrap_or(&[]),
        )
        .to_os_string();
        out.push(InotifyEvent {
            wd: ev.wd,
            mask: ev.mask,
            name,
        });
        off = name_end;
    }
    out
}

/// `statvfs` of a path: `(total bytes, available bytes)`.
pub fn fs_usage(path: &Path) -> io::Result<(u64, u64)> {
    let st = rustix::fs::statvfs(path)?;
    Ok((
        st.f_blocks.saturating_mul(st.f_frsize),
        st.f_bavail.saturating_mul(st.f_frsize),
    ))
}

/// Clock ticks per second (for `/proc/<pid>/stat` CPU times).
pub fn clock_ticks() -> u64 {
    rustix::param::clock_ticks_per_second()
}

/// Page size in bytes.
pub fn page_size() -> u64 {
    rustix::param::page_size() as u64
}

/// Adopt orphaned descendants (so they can be found and ended with us).
pub fn set_child_subreaper() -> io::Result<()> {
    Ok(rustix::process::set_child_subreaper(Some(
        rustix::process::getpid(),
    ))?)
}

/// Every pid in `/proc`.
pub fn all_pids() -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .collect()
}

/// The parent pid of `pid`, from `/proc/<pid>/stat`.
pub fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Every descendant of `root` among `pids`.
pub fn descendants(root: i32, pids: &[i32]) -> Vec<i32> {
    let parents: Vec<(i32, i32)> = pids
        .iter()
        .filter_map(|&p| Some((p, parent_of(p)?)))
        .collect();
    let mut out = Vec::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for &(child, ppid) in &parents {
            if ppid == parent && !out.contains(&child) {
                out.push(child);
                frontier.push(child);
            }
        }
    }
    out
}

/// `openat2(2)` `resolve` flag: refuse to cross a mount point.
pub const RESOLVE_NO_XDEV: u64 = 0x01;
/// `openat2(2)` `resolve` flag: refuse `/proc` magic links (`/proc/<pid>/exe`, `fd/<n>`, …).
pub const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
/// `openat2(2)` `resolve` flag: refuse every symlink.
pub const RESOLVE_NO_SYMLINKS: u64 = 0x04;
/// `openat2(2)` `resolve` flag: fail on anything resolving outside the directory fd.
pub const RESOLVE_BENEATH: u64 = 0x08;
/// `openat2(2)` `resolve` flag: resolve as if the directory fd were the root (`..` and
/// absolute symlinks stay beneath it).
pub const RESOLVE_IN_ROOT: u64 = 0x10;
/// `statfs` magic of procfs.
pub const PROC_SUPER_MAGIC: i64 = 0x9fa0;

/// `openat2(2)`: open `path` relative to `dir` under the given `RESOLVE_*` rules
/// (close-on-exec always). Retried on `EAGAIN`, which the kernel returns when a concurrent
/// rename may have let a `..` step escape its check.
pub fn openat2(
    dir: impl AsFd,
    path: &Path,
    flags: libc::c_int,
    mode: u32,
    resolve: u64,
) -> io::Result<OwnedFd> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    let oflags = OFlags::from_bits_retain(flags as u32) | OFlags::CLOEXEC;
    let mode = if flags & (libc::O_CREAT | libc::O_TMPFILE) != 0 {
        Mode::from_raw_mode(mode)
    } else {
        Mode::empty()
    };
    let resolve = ResolveFlags::from_bits_retain(resolve);
    for _ in 0..64 {
        match rustix::fs::openat2(&dir, path, oflags, mode, resolve) {
            Ok(fd) => return Ok(fd),
            Err(rustix::io::Errno::AGAIN) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(io::Error::from_raw_os_error(libc::EAGAIN))
}

/// Reopen the object a descriptor (often `O_PATH`) refers to, with new flags. This goes
/// through our own `/proc/self/fd/<n>`, which leads to exactly that inode, never to whatever
/// a path names now.
pub fn reopen(fd: RawFd, flags: libc::c_int) -> io::Result<OwnedFd> {
    let path = CString::new(format!("/proc/self/fd/{fd}"))
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `path` is a valid C string; open returns a fresh descriptor or -1.
    let new = cvt(unsafe { libc::open(path.as_ptr(), flags | libc::O_CLOEXEC) })?;
    // SAFETY: fresh descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

/// `fstat(2)` (works on `O_PATH` descriptors).
pub fn fstat(fd: impl AsFd) -> io::Result<rustix::fs::Stat> {
    Ok(rustix::fs::fstat(fd)?)
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`: the entry itself, never what a link names.
pub fn lstat_at(dir: impl AsFd, name: &std::ffi::OsStr) -> io::Result<rustix::fs::Stat> {
    Ok(rustix::fs::statat(
        dir,
        name,
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )?)
}

/// `readlinkat(2)`: the target of the symlink `name` in `dir` (at most `PATH_MAX` bytes).
pub fn readlink_at(dir: impl AsFd, name: &std::ffi::OsStr) -> io::Result<std::ffi::OsString> {
    use std::os::unix::ffi::OsStringExt;
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    let len = rustix::fs::readlinkat_raw(dir, name, &mut buf[..])?;
    buf.truncate(len);
    Ok(std::ffi::OsString::from_vec(buf))
}

/// `mkdirat(2)`.
pub fn mkdir_at(dir: impl AsFd, name: &std::ffi::OsStr, mode: u32) -> io::Result<()> {
    Ok(rustix::fs::mkdirat(
        dir,
        name,
        rustix::fs::Mode::from_raw_mode(mode),
    )?)
}

/// `unlinkat(2)` (`AT_REMOVEDIR` when `dir_entry`); never follows a symlink.
pub fn unlink_at(dir: impl AsFd, name: &std::ffi::OsStr, dir_entry: bool) -> io::Result<()> {
    let flags = if dir_entry {
        rustix::fs::AtFlags::REMOVEDIR
    } else {
        rustix::fs::AtFlags::empty()
    };
    Ok(rustix::fs::unlinkat(dir, name, flags)?)
}

/// `renameat(2)`: move an entry between two held directories; never follows a symlink.
pub fn rename_at(
    from_dir: impl AsFd,
    from: &std::ffi::OsStr,
    to_dir: impl AsFd,
    to: &std::ffi::OsStr,
) -> io::Result<()> {
    Ok(rustix::fs::renameat(from_dir, from, to_dir, to)?)
}

/// `renameat2(2)` with `RENAME_NOREPLACE`: like [`rename_at`], but an existing `to` is
/// `EEXIST`, decided atomically by the kernel (no look-then-act window).
pub fn rename_noreplace_at(
    from_dir: impl AsFd,
    from: &std::ffi::OsStr,
    to_dir: impl AsFd,
    to: &std::ffi::OsStr,
) -> io::Result<()> {
    Ok(rustix::fs::renameat_with(
        from_dir,
        from,
        to_dir,
        to,
        rustix::fs::RenameFlags::NOREPLACE,
    )?)
}

/// `symlinkat(2)`: a new symlink `name` in `dir` holding `target` verbatim.
pub fn symlink_at(
    target: &std::ffi::OsStr,
    dir: impl AsFd,
    name: &std::ffi::OsStr,
) -> io::Result<()> {
    Ok(rustix::fs::symlinkat(target, dir, name)?)
}

/// `fchmod(2)` on an open (not `O_PATH`) descriptor.
pub fn fchmod(fd: impl AsFd, mode: u32) -> io::Result<()> {
    Ok(rustix::fs::fchmod(
        fd,
        rustix::fs::Mode::from_raw_mode(mode),
    )?)
}

/// Change the mode of what an `O_PATH` descriptor refers to, through `/proc/self/fd/<n>`
/// (`fchmod` refuses `O_PATH` descriptors). Never resolves a path that others control.
pub fn chmod_fd_path(fd: RawFd, mode: u32) -> io::Result<()> {
    let path = CString::new(format!("/proc/self/fd/{fd}"))
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: valid C string.
    cvt(unsafe { libc::chmod(path.as_ptr(), mode as libc::mode_t) }).map(drop)
}

/// `fchownat(fd, "", uid, gid, AT_EMPTY_PATH)`: change the owner of exactly what `fd` (also
/// an `O_PATH` one) refers to.
pub fn fchown(fd: impl AsFd, uid: u32, gid: u32) -> io::Result<()> {
    use rustix::fs::{AtFlags, Gid, Uid};
    Ok(rustix::fs::chownat(
        fd,
        c"",
        Some(Uid::from_raw(uid)),
        Some(Gid::from_raw(gid)),
        AtFlags::EMPTY_PATH,
    )?)
}

/// The filesystem type (`f_type`) of what `fd` refers to.
pub fn fs_type(fd: impl AsFd) -> io::Result<i64> {
    Ok(rustix::fs::fstatfs(fd)?.f_type as i64)
}

/// Eight random bytes from the kernel.
pub fn random_u64() -> io::Result<u64> {
    let mut buf = [0u8; 8];
    getrandom::fill(&mut buf).map_err(|e| io::Error::other(e.to_string()))?;
    Ok(u64::from_ne_bytes(buf))
}

/// Point fds 0, 1 and 2 at `/dev/null`, so no descriptor of ours leads outside the sandbox.
pub fn stdio_to_dev_null() -> io::Result<()> {
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")?;
    for fd in 0..3 {
        // SAFETY: dup2 onto the standard descriptors; `null` stays open across the calls.
        cvt(unsafe { libc::dup2(null.as_raw_fd(), fd) })?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Descriptors and sandbox-controlled directories
// ---------------------------------------------------------------------------------------------

/// Open `path` relative to the directory `dir`, refusing (`EXDEV`/`ELOOP`) anything that
/// would leave it: `..` above it, absolute paths, symlinks, `/proc` magic links, and with
/// `same_fs` other mounts. For paths a sandbox controls (volume contents): whatever it
/// planted, the result is inside `dir`. Always close-on-exec.
pub fn open_beneath(
    dir: impl AsFd,
    path: &Path,
    flags: libc::c_int,
    same_fs: bool,
) -> io::Result<OwnedFd> {
    let resolve = RESOLVE_BENEATH
        | RESOLVE_NO_SYMLINKS
        | RESOLVE_NO_MAGICLINKS
        | if same_fs { RESOLVE_NO_XDEV } else { 0 };
    openat2(dir, path, flags, 0, resolve)
}

/// Open a trusted directory (one only the host controls) as an `O_PATH` descriptor, refusing
/// a symlink in its last component.
pub fn open_dir_path(path: &Path) -> io::Result<OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    Ok(rustix::fs::open(
        path,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// A detached copy of the mount tree rooted at the directory `dir` refers to
/// (`open_tree(OPEN_TREE_CLONE)`; a directory below a mount's root gives a bind of that
/// directory). The descriptor can cross to a process in other namespaces, which attaches it
/// with [`attach_mount`]; the copy is gone when the descriptor is closed unattached.
pub fn clone_mount(dir: impl AsFd) -> io::Result<OwnedFd> {
    use rustix::mount::OpenTreeFlags;
    Ok(rustix::mount::open_tree(
        dir,
        "",
        OpenTreeFlags::OPEN_TREE_CLONE
            | OpenTreeFlags::OPEN_TREE_CLOEXEC
            | OpenTreeFlags::AT_EMPTY_PATH,
    )?)
}

/// Attach the detached mount `tree` (from [`clone_mount`]) on the directory `target` refers
/// to (`move_mount`, both by descriptor: no path is resolved).
pub fn attach_mount(tree: impl AsFd, target: impl AsFd) -> io::Result<()> {
    use rustix::mount::MoveMountFlags;
    Ok(rustix::mount::move_mount(
        tree,
        "",
        target,
        "",
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH | MoveMountFlags::MOVE_MOUNT_T_EMPTY_PATH,
    )?)
}

/// Detach the mount at `path` from this mount namespace (`umount2(MNT_DETACH)`).
pub fn unmount_detach(path: &Path) -> io::Result<()> {
    Ok(rustix::mount::unmount(
        path,
        rustix::mount::UnmountFlags::DETACH,
    )?)
}

/// Change the owner of the object `fd` refers to (also an `O_PATH` descriptor), never a path.
pub fn chown_fd(fd: impl AsFd, uid: u32, gid: u32) -> io::Result<()> {
    fchown(fd, uid, gid)
}

/// The path through which the kernel reaches the object `fd` refers to (for `mount(2)`,
/// which takes paths): `/proc/self/fd/N`.
pub fn fd_path(fd: RawFd) -> std::path::PathBuf {
    std::path::PathBuf::from(format!("/proc/self/fd/{fd}"))
}

/// Mark every descriptor from `first` up close-on-exec (`close_range(2)` with
/// `CLOSE_RANGE_CLOEXEC`): nothing reaches the next program but what is re-opened on purpose.
/// Async-signal-safe, so usable between fork and exec; unlike closing, it keeps the pipe
/// through which `std::process::Command` learns whether `exec` failed.
pub fn cloexec_from(first: u32) -> io::Result<()> {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: a plain syscall on integers.
    let ret = unsafe { libc::syscall(libc::SYS_close_range, first, u32::MAX, CLOSE_RANGE_CLOEXEC) };
    cvt(ret as libc::c_int).map(drop)
}

/// Close every descriptor above 2 except those in `keep` (`close_range(2)` over the gaps).
/// Used at the start of a re-executed or cloned engine process, which must hold nothing its
/// launcher leaked.
pub fn close_fds_except(keep: &[RawFd]) -> io::Result<()> {
    let mut keep: Vec<u32> = keep
        .iter()
        .filter(|&&fd| fd > 2)
        .map(|&fd| fd as u32)
        .collect();
    keep.sort_unstable();
    keep.dedup();
    let mut first = 3u32;
    for fd in keep.into_iter().chain(std::iter::once(u32::MAX)) {
        if fd > first {
            let last = if fd == u32::MAX { u32::MAX } else { fd - 1 };
            // SAFETY: a plain syscall on integers; the caller owns no descriptor in the range.
            let ret = unsafe { libc::syscall(libc::SYS_close_range, first, last, 0) };
            cvt(ret as libc::c_int)?;
        }
        first = fd.saturating_add(1);
    }
    Ok(())
}

/// Set `no_new_privs` on the calling thread (required before an unprivileged Landlock or
/// seccomp restriction). Async-signal-safe.
pub fn set_no_new_privs() -> io::Result<()> {
    // SAFETY: a plain prctl on integers.
    cvt(unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) }).map(drop)
}

/// `seccomp(SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC)`: install a classic BPF
/// program on every thread of the calling process (so no thread is left unfiltered); what
/// they start later inherits it. Needs `no_new_privs` or `CAP_SYS_ADMIN`.
pub fn seccomp_filter_all_threads(program: &[libc::sock_filter]) -> io::Result<()> {
    let len =
        u16::try_from(program.len()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let prog = libc::sock_fprog {
        len,
        filter: program.as_ptr().cast_mut(),
    };
    // SAFETY: `prog` points at `program`, alive for the call; the kernel copies it.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            libc::SECCOMP_FILTER_FLAG_TSYNC,
            &prog as *const libc::sock_fprog,
        )
    };
    match ret {
        0 => Ok(()),
        -1 => Err(io::Error::last_os_error()),
        // With TSYNC, a positive value is the id of a thread that could not be synchronized.
        _ => Err(io::Error::from_raw_os_error(libc::ESRCH)),
    }
}

/// `landlock_restrict_self(2)`: enforce the ruleset `ruleset` on the calling thread and what
/// it starts. Async-signal-safe.
pub fn landlock_restrict_self(ruleset: RawFd) -> io::Result<()> {
    // SAFETY: a plain syscall on integers.
    let ret = unsafe { libc::syscall(libc::SYS_landlock_restrict_self, ruleset, 0u32) };
    cvt(ret as libc::c_int).map(drop)
}

/// Whether this process may create entries in directory `dir` (`faccessat` W_OK|X_OK with
/// the effective ids).
pub fn access_writable(dir: &Path) -> io::Result<bool> {
    let c = cstr(dir)?;
    // SAFETY: valid C string; a plain syscall.
    let ret = unsafe {
        libc::faccessat(
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::W_OK | libc::X_OK,
            libc::AT_EACCESS,
        )
    };
    Ok(ret == 0)
}

/// Set this process's OOM score adjustment (`/proc/self/oom_score_adj`). Async-signal-safe:
/// no allocation, so usable between fork and exec.
pub fn set_oom_score_adj(value: i16) -> io::Result<()> {
    let mut text = [0u8; 8];
    let mut len = 0;
    if value < 0 {
        text[0] = b'-';
        len = 1;
    }
    let mut digits = [0u8; 5];
    let (mut n, mut count) = (value.unsigned_abs(), 0);
    loop {
        digits[count] = b'0' + (n % 10) as u8;
        count += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for d in digits[..count].iter().rev() {
        text[len] = *d;
        len += 1;
    }
    // SAFETY: a NUL-terminated literal path; `text[..len]` is initialized; the fd is closed.
    unsafe {
        let fd = cvt(libc::open(
            c"/proc/self/oom_score_adj".as_ptr(),
            libc::O_WRONLY | libc::O_CLOEXEC,
        ))?;
        let written = libc::write(fd, text.as_ptr().cast(), len);
        libc::close(fd);
        if written < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The hard limit of `resource` for this process (`u64::MAX` for unlimited).
pub fn hard_rlimit(resource: libc::__rlimit_resource_t) -> io::Result<u64> {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `rl` is a valid output buffer.
    cvt(unsafe { libc::getrlimit(resource, &mut rl) })?;
    Ok(rl.rlim_max)
}

// ---------------------------------------------------------------------------------------------
// Sandbox networking: the user-mode networking helper and routing-policy rules
// ---------------------------------------------------------------------------------------------

/// Whether `/dev/net/tun` opens read-write for this user (what `pasta` needs). Opening the
/// clone device without `TUNSETIFF` creates nothing.
pub fn tun_usable() -> io::Result<()> {
    openat2(
        rustix::fs::CWD,
        Path::new("/dev/net/tun"),
        libc::O_RDWR,
        0,
        RESOLVE_NO_MAGICLINKS,
    )
    .map(drop)
}

/// Make `cmd` receive SIGKILL when the calling thread dies, and hand it `fd` as descriptor 3
/// (cleared of close-on-exec), all between fork and exec.
pub fn helper_command(cmd: &mut std::process::Command, fd: RawFd) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs between fork and exec and only makes async-signal-safe
    // syscalls on integers (prctl, dup2, fcntl).
    unsafe {
        cmd.pre_exec(move || {
            cvt(libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ))?;
            if fd == 3 {
                let flags = cvt(libc::fcntl(3, libc::F_GETFD))?;
                cvt(libc::fcntl(3, libc::F_SETFD, flags & !libc::FD_CLOEXEC))?;
            } else {
                cvt(libc::dup2(fd, 3))?;
            }
            Ok(())
        });
    }
}

/// Wait up to `timeout_ms` for `fd` to become readable (or hung up): `Ok(false)` on timeout.
pub fn poll_readable(fd: RawFd, timeout_ms: i32) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: pfd is one valid pollfd for the duration of the call.
        let ret = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
        if ret >= 0 {
            return Ok(ret > 0);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// What a routing-policy rule does with the traffic it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleAction {
    /// Fail locally with `ENETUNREACH`: the packet never leaves the network namespace.
    Unreachable,
    /// Route through the main table as usual (an exception placed before the blocks).
    LookupMain,
}

/// The kernel's rtnetlink ABI for rules (linux/fib_rules.h, linux/netlink.h).
mod nl {
    pub const RTM_NEWRULE: u16 = 32;
    pub const NLMSG_ERROR: u16 = 2;
    pub const NLM_F_REQUEST: u16 = 0x1;
    pub const NLM_F_ACK: u16 = 0x4;
    pub const NLM_F_EXCL: u16 = 0x200;
    pub const NLM_F_CREATE: u16 = 0x400;
    pub const FRA_DST: u16 = 1;
    pub const FRA_PRIORITY: u16 = 6;
    pub const FRA_TABLE: u16 = 15;
    pub const FRA_IP_PROTO: u16 = 22;
    pub const FRA_DPORT_RANGE: u16 = 24;
    pub const FR_ACT_TO_TBL: u8 = 1;
    pub const FR_ACT_UNREACHABLE: u8 = 7;
    pub const RT_TABLE_MAIN: u32 = 254;
}

/// One routing-policy rule for [`add_rules`]: destination prefix, optional protocol and
/// destination port, priority and action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Destination prefix address.
    pub dst: std::net::IpAddr,
    /// Destination prefix length.
    pub len: u8,
    /// Only this IP protocol and destination port (e.g. UDP 53), if set.
    pub proto_port: Option<(u8, u16)>,
    /// Rule priority (lower is consulted first).
    pub priority: u32,
    /// What to do with matching traffic.
    pub action: RuleAction,
}

/// The `RTM_NEWRULE` request for `rule` (pure: built as data before anything is sent).
pub fn rule_message(rule: &Rule, seq: u32) -> Vec<u8> {
    fn attr(buf: &mut Vec<u8>, kind: u16, data: &[u8]) {
        let len = 4 + data.len();
        buf.extend_from_slice(&(len as u16).to_ne_bytes());
        buf.extend_from_slice(&kind.to_ne_bytes());
        buf.extend_from_slice(data);
        while buf.len() % 4 != 0 {
            buf.push(0);
        }
    }
    let (family, addr): (u8, Vec<u8>) = match rule.dst {
        std::net::IpAddr::V4(a) => (libc::AF_INET as u8, a.octets().to_vec()),
        std::net::IpAddr::V6(a) => (libc::AF_INET6 as u8, a.octets().to_vec()),
    };
    let action = match rule.action {
        RuleAction::Unreachable => nl::FR_ACT_UNREACHABLE,
        RuleAction::LookupMain => nl::FR_ACT_TO_TBL,
    };
    let mut body = Vec::with_capacity(64);
    // struct fib_rule_hdr: family, dst_len, src_len, tos, table, res1, res2, action, flags.
    body.extend_from_slice(&[family, rule.len, 0, 0, 0, 0, 0, action]);
    body.extend_from_slice(&0u32.to_ne_bytes());
    attr(&mut body, nl::FRA_DST, &addr);
    attr(&mut body, nl::FRA_PRIORITY, &rule.priority.to_ne_bytes());
    if rule.action == RuleAction::LookupMain {
        attr(&mut body, nl::FRA_TABLE, &nl::RT_TABLE_MAIN.to_ne_bytes());
    }
    if let Some((proto, port)) = rule.proto_port {
        attr(&mut body, nl::FRA_IP_PROTO, &[proto]);
        let mut range = port.to_ne_bytes().to_vec();
        range.extend_from_slice(&port.to_ne_bytes());
        attr(&mut body, nl::FRA_DPORT_RANGE, &range);
    }
    let flags = nl::NLM_F_REQUEST | nl::NLM_F_ACK | nl::NLM_F_CREATE | nl::NLM_F_EXCL;
    let mut msg = Vec::with_capacity(16 + body.len());
    msg.extend_from_slice(&((16 + body.len()) as u32).to_ne_bytes());
    msg.extend_from_slice(&nl::RTM_NEWRULE.to_ne_bytes());
    msg.extend_from_slice(&flags.to_ne_bytes());
    msg.extend_from_slice(&seq.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
    msg.extend(body);
    msg
}

/// Install routing-policy rules in this network namespace over rtnetlink, each acknowledged;
/// the first refusal is returned (needs `CAP_NET_ADMIN` over the namespace).
pub fn add_rules(rules: &[Rule]) -> io::Result<()> {
    // SAFETY: a plain netlink socket; owned by OwnedFd below.
    let sock = cvt(unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )
    })?;
    // SAFETY: socket() returned a fresh fd.
    let sock = unsafe { OwnedFd::from_raw_fd(sock) };
    let mut buf = vec![0u8; 8192];
    for (i, rule) in rules.iter().enumerate() {
        let seq = i as u32 + 1;
        let msg = rule_message(rule, seq);
        // SAFETY: msg is a valid buffer of msg.len() bytes; the kernel is the default
        // destination of an unbound netlink socket's send.
        let sent = unsafe {
            libc::send(
                sock.as_raw_fd(),
                msg.as_ptr() as *const libc::c_void,
                msg.len(),
                0,
            )
        };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        loop {
            // SAFETY: buf is a valid writable buffer of buf.len() bytes.
            let n = unsafe {
                libc::recv(
                    sock.as_raw_fd(),
                    buf.as_mut_ptr() as *mut libc::c_void,
                    buf.len(),
                    0,
                )
            };
            if n < 0 {
                let err = io::Error::last_os_error();
                if err.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(err);
            }
            match parse_ack(&buf[..n as usize], seq) {
                Some(0) => break,
                Some(errno) => return Err(io::Error::from_raw_os_error(errno)),
                None => continue,
            }
        }
    }
    Ok(())
}

/// The errno of the acknowledgement for `seq` in a netlink reply (0 = success), if it is one.
fn parse_ack(reply: &[u8], seq: u32) -> Option<i32> {
    let mut off = 0;
    while off + 16 <= reply.len() {
        let len = u32::from_ne_bytes(reply[off..off + 4].try_into().ok()?) as usize;
        let kind = u16::from_ne_bytes(reply[off + 4..off + 6].try_into().ok()?);
        let got = u32::from_ne_bytes(reply[off + 8..off + 12].try_into().ok()?);
        if len < 16 || off + len > reply.len() {
            return None;
        }
        if kind == nl::NLMSG_ERROR && got == seq && len >= 20 {
            let err = i32::from_ne_bytes(reply[off + 16..off + 20].try_into().ok()?);
            return Some(-err);
        }
        off += (len + 3) & !3;
    }
    None
}

/// Give the calling thread, and only it, the filesystem identity of `uid`/`gid` with no
/// supplementary groups, so the kernel checks that user's permissions on every later path
/// lookup and new files are that user's.
///
/// Raw syscalls on purpose: the kernel keeps credentials per thread, and the libc wrappers
/// (`setgroups` here) would broadcast the change to every thread of the process. Moving the
/// fs uid from 0 to another uid also drops the thread's effective filesystem capabilities
/// (`CAP_DAC_OVERRIDE`, `CAP_FOWNER`, …). The change cannot be undone safely by the caller:
/// run this only on a dedicated thread that ends after its work. Each step is checked: an
/// identity that did not fully take is an error, never a thread running as root.
pub fn set_thread_fs_identity(uid: u32, gid: u32) -> io::Result<()> {
    let none: *const libc::gid_t = std::ptr::null();
    // SAFETY: setgroups with a count of 0 reads nothing through the (null) list pointer.
    let ret = unsafe { libc::syscall(libc::SYS_setgroups, 0usize, none) };
    if ret == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: setfsgid/setfsuid take an integer and return the previous id; they cannot
    // fail in a way that touches memory. A call with -1 (never valid) changes nothing and
    // returns the current id, which is how the change is verified.
    let (fsgid, fsuid) = unsafe {
        libc::syscall(libc::SYS_setfsgid, gid);
        let fsgid = libc::syscall(libc::SYS_setfsgid, u32::MAX) as u32;
        libc::syscall(libc::SYS_setfsuid, uid);
        let fsuid = libc::syscall(libc::SYS_setfsuid, u32::MAX) as u32;
        (fsgid, fsuid)
    };
    if (fsuid, fsgid) != (uid, gid) {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("could not take the identity {uid}:{gid} (got {fsuid}:{fsgid})"),
        ));
    }
    Ok(())
}

/// A close-on-exec pipe for moving bytes with `splice`, grown towards `want` bytes of
/// capacity where the kernel allows (a user over its pipe-buffer allowance keeps the
/// default); returns both ends and the capacity it got.
pub fn splice_pipe(want: usize) -> io::Result<(OwnedFd, OwnedFd, usize)> {
    let (r, w) = pipe()?;
    let cap = match rustix::pipe::fcntl_setpipe_size(&w, want) {
        Ok(cap) => cap,
        Err(_) => rustix::pipe::fcntl_getpipe_size(&w)?,
    };
    Ok((r, w, cap))
}

/// Move up to `len` bytes from `from` to `to` at their current positions, one of them a
/// pipe (`splice`). `nonblock` makes the pipe side non-blocking (the other side blocks or
/// not by its own flags).
pub fn splice(from: impl AsFd, to: impl AsFd, len: usize, nonblock: bool) -> io::Result<usize> {
    use rustix::pipe::SpliceFlags;
    let mut flags = SpliceFlags::MOVE;
    if nonblock {
        flags |= SpliceFlags::NONBLOCK;
    }
    Ok(rustix::pipe::splice(from, None, to, None, len, flags)?)
}

/// Wait until `fd` is readable (or writable), or has hung up or failed; a `TimedOut` error
/// once `limit` has passed without that.
pub fn wait_ready(fd: impl AsFd, writable: bool, limit: std::time::Duration) -> io::Result<()> {
    use rustix::event::{PollFd, PollFlags, Timespec};
    let want = if writable {
        PollFlags::OUT
    } else {
        PollFlags::IN
    };
    let mut fds = [PollFd::new(&fd, want)];
    let deadline = std::time::Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let timeout = Timespec::try_from(left).map_err(|_| io::ErrorKind::InvalidInput)?;
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(0) if left.is_zero() => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no progress for {} ms", limit.as_millis()),
                ))
            }
            // Woken early (a timer rounding): wait out what is left.
            Ok(0) => {}
            Ok(_) => return Ok(()),
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// A close-on-exec duplicate of a descriptor (the same open file: flags and position are
/// shared).
pub fn dup_cloexec(fd: impl AsFd) -> io::Result<OwnedFd> {
    Ok(rustix::io::fcntl_dupfd_cloexec(fd, 3)?)
}

/// Whether a file was opened for appending (`splice` refuses to write to such a file).
pub fn is_append(fd: impl AsFd) -> io::Result<bool> {
    Ok(rustix::fs::fcntl_getfl(fd)?.contains(rustix::fs::OFlags::APPEND))
}

/// Shut a socket down both ways: a peer mid-frame sees the end of the stream, never bytes
/// that would desynchronise it.
pub fn shutdown_both(sock: impl AsFd) -> io::Result<()> {
    Ok(rustix::net::shutdown(sock, rustix::net::Shutdown::Both)?)
}

/// Everything a child started by [`spawn`] needs, built before the clone so the child only
/// makes syscalls on memory prepared for it (no allocation, no locks, no global state).
pub struct SpawnPlan {
    /// Paths `execve` tries in order: the program itself if it names a path, else one per
    /// entry of the environment's `PATH`, as `execvp` searches them.
    candidates: Vec<CString>,
    /// Kept alive for the pointer arrays below.
    _strings: Vec<CString>,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    /// `argv` for running a candidate that is a script without `#!` with `/bin/sh`, as
    /// `execvp` does; slot 1 takes the candidate's path in the child.
    sh_argv: Vec<*const libc::c_char>,
    stdio: [RawFd; 3],
    cwd: RawFd,
}

impl SpawnPlan {
    /// A plan to run `argv` with exactly the environment `envs`, stdin/stdout/stderr from
    /// `stdio`, in the directory open at `cwd`. `NUL` bytes anywhere are refused.
    pub fn new<'a>(
        argv: &[String],
        envs: impl IntoIterator<Item = (&'a String, &'a String)>,
        stdio: [RawFd; 3],
        cwd: RawFd,
    ) -> io::Result<SpawnPlan> {
        let nul = || {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "nul byte found in provided data",
            )
        };
        let c = |s: &[u8]| CString::new(s).map_err(|_| nul());
        let program = argv
            .first()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "empty argv"))?;
        let mut strings = Vec::with_capacity(argv.len() + 16);
        for a in argv {
            strings.push(c(a.as_bytes())?);
        }
        let mut path = None;
        for (k, v) in envs {
            let mut kv = Vec::with_capacity(k.len() + v.len() + 1);
            kv.extend_from_slice(k.as_bytes());
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            strings.push(c(&kv)?);
            if k == "PATH" {
                path = Some(v.clone());
            }
        }
        // execvp's search: a name with a slash is used as is; otherwise each entry of PATH
        // (the C library's default when unset), an empty entry meaning the working directory.
        let candidates = if program.contains('/') {
            vec![c(program.as_bytes())?]
        } else if program.is_empty() {
            Vec::new()
        } else {
            let path = path.unwrap_or_else(|| "/bin:/usr/bin".into());
            let mut out = Vec::new();
            for dir in path.split(':') {
                let full = if dir.is_empty() {
                    program.clone()
                } else {
                    format!("{}/{program}", dir.trim_end_matches('/'))
                };
                out.push(c(full.as_bytes())?);
            }
            out
        };
        let argc = argv.len();
        let mut ptrs: Vec<*const libc::c_char> = strings.iter().map(|s| s.as_ptr()).collect();
        let envp_part = ptrs.split_off(argc);
        let mut argv_ptrs = ptrs;
        argv_ptrs.push(std::ptr::null());
        let mut envp = envp_part;
        envp.push(std::ptr::null());
        let mut sh_argv = Vec::with_capacity(argc + 2);
        sh_argv.push(c"/bin/sh".as_ptr());
        sh_argv.push(std::ptr::null());
        sh_argv.extend_from_slice(&argv_ptrs[1..]);
        Ok(SpawnPlan {
            candidates,
            _strings: strings,
            argv: argv_ptrs,
            envp,
            sh_argv,
            stdio,
            cwd,
        })
    }
}

/// What the child of [`spawn`] shares with its parent: the plan, the hook, and the error.
struct SpawnShared<'a, F> {
    plan: &'a mut SpawnPlan,
    pre_exec: F,
    /// The signal mask to restore just before `execve` (the parent thread's).
    mask: libc::sigset_t,
    /// The errno that stopped the child before or at `execve`; 0 if it reached the program.
    error: std::sync::atomic::AtomicI32,
}

/// Start `plan` in a child that shares the caller's memory until it calls `execve`
/// (`clone(CLONE_VM | CLONE_VFORK)`, as `posix_spawn` does), instead of copying the whole
/// caller with `fork`. In the child, in this order: signal handlers reset (see below), the
/// plan's stdio on 0–2, `fchdir` to its directory, `pre_exec`, the caller's signal mask
/// restored, then `execve` of each candidate (`execvp`'s rules). Returns the child's pid once
/// it runs the program; any failure on the way is returned as its `errno`, the child exited
/// and reaped.
///
/// `pre_exec` runs in that child: it must only make async-signal-safe raw syscalls (no
/// allocation, no locks, no C library calls that act on all threads such as `setuid`), and
/// return an error to stop the spawn.
pub fn spawn<F: FnMut() -> io::Result<()>>(plan: &mut SpawnPlan, pre_exec: F) -> io::Result<u32> {
    let spare = SPARE_STACK.lock().unwrap_or_else(|e| e.into_inner()).take();
    let stack = match spare {
        Some(stack) => stack,
        None => ChildStack::new()?,
    };
    let result = spawn_on(&stack, plan, pre_exec);
    // The child has exec'd or exited: the stack is free for the next spawn.
    let mut slot = SPARE_STACK.lock().unwrap_or_else(|e| e.into_inner());
    if slot.is_none() {
        *slot = Some(stack);
    }
    result
}

/// The stack of a [`spawn`] child: a private mapping whose lowest page is a guard.
struct ChildStack {
    base: *mut libc::c_void,
    len: usize,
}

// SAFETY: a plain mapping, used by one spawn at a time (it is taken out of `SPARE_STACK`).
unsafe impl Send for ChildStack {}

/// One stack kept for the next spawn. A fresh one for each spawn cost a mapping, the split
/// of it that its guard page makes, and a zeroed page for each page the child touched.
/// Spawns at once each take a stack; one is kept.
static SPARE_STACK: std::sync::Mutex<Option<ChildStack>> = std::sync::Mutex::new(None);

impl ChildStack {
    const SIZE: usize = 64 * 1024;

    fn new() -> io::Result<Self> {
        let page = page_size() as usize;
        let len = Self::SIZE + page;
        // SAFETY: a fresh private anonymous mapping; the lowest page becomes a guard below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let stack = ChildStack { base, len };
        // SAFETY: the first page of our own mapping.
        cvt(unsafe { libc::mprotect(base, page, libc::PROT_NONE) })?;
        Ok(stack)
    }

    /// The top of the stack, 16-byte aligned (the mapping is page-aligned).
    fn top(&self) -> *mut libc::c_void {
        // SAFETY: one past the end of our own mapping.
        unsafe { (self.base as *mut u8).add(self.len) as *mut libc::c_void }
    }
}

impl Drop for ChildStack {
    fn drop(&mut self) {
        // SAFETY: our own mapping, no longer used (no child runs on it).
        unsafe { libc::munmap(self.base, self.len) };
    }
}

/// [`spawn`] with the child running on `stack`.
fn spawn_on<F: FnMut() -> io::Result<()>>(
    stack: &ChildStack,
    plan: &mut SpawnPlan,
    pre_exec: F,
) -> io::Result<u32> {
    // Block every signal across the clone: a handler of the parent must never run in the
    // child, which shares its memory. The child restores this mask just before `execve`.
    // SAFETY: sigset_t is plain data (all zeroes is a valid value), filled by sigfillset and
    // pthread_sigmask through valid pointers.
    let mask = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut mask: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        let rc = libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut mask);
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        mask
    };
    let mut shared = SpawnShared {
        plan,
        pre_exec,
        mask,
        error: std::sync::atomic::AtomicI32::new(0),
    };
    // SAFETY: the child runs `spawn_child` on `stack`, which no one else uses meanwhile,
    // with a pointer to `shared`, which outlives it: CLONE_VFORK suspends this thread until
    // the child has called execve or exited. CLONE_VM without CLONE_FILES or CLONE_SIGHAND:
    // the child has its own descriptor table and signal dispositions.
    let pid = unsafe {
        libc::clone(
            spawn_child::<F>,
            stack.top(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            &mut shared as *mut SpawnShared<F> as *mut libc::c_void,
        )
    };
    let clone_error = io::Error::last_os_error();
    // SAFETY: restores the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &shared.mask, std::ptr::null_mut()) };
    if pid == -1 {
        return Err(clone_error);
    }
    match shared.error.load(std::sync::atomic::Ordering::SeqCst) {
        0 => Ok(pid as u32),
        errno => {
            // The child has exited (CLONE_VFORK returned); collect it unless the reaper did.
            let _ = rustix::process::waitpid(
                rustix::process::Pid::from_raw(pid),
                rustix::process::WaitOptions::empty(),
            );
            Err(io::Error::from_raw_os_error(errno))
        }
    }
}

/// The child of [`spawn`]. Never returns to the caller's code: it execs or exits.
extern "C" fn spawn_child<F: FnMut() -> io::Result<()>>(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `SpawnShared` the parent keeps alive while suspended.
    let shared = unsafe { &mut *(arg as *mut SpawnShared<F>) };
    let errno = match child_steps(shared) {
        Ok(never) => match never {},
        Err(e) => e.raw_os_error().unwrap_or(libc::EINVAL),
    };
    shared
        .error
        .store(errno.max(1), std::sync::atomic::Ordering::SeqCst);
    // SAFETY: _exit is async-signal-safe and ends only this child.
    unsafe { libc::_exit(127) }
}

fn child_steps<F: FnMut() -> io::Result<()>>(
    shared: &mut SpawnShared<'_, F>,
) -> io::Result<std::convert::Infallible> {
    // SAFETY: raw syscalls on integers and on memory of the plan, prepared before the clone.
    unsafe {
        // Handlers go back to the default: one running here would run on the parent's
        // memory (an ignored signal stays ignored across exec, as with fork). SIGPIPE, which
        // the Rust runtime ignores, goes back to the default as `std::process` does.
        for sig in 1..=KERNEL_LAST_SIGNAL {
            let Some(handler) = kernel_signal_handler(sig) else {
                continue; // SIGKILL/SIGSTOP, or past this kernel's last signal
            };
            if handler != libc::SIG_DFL && (handler != libc::SIG_IGN || sig == libc::SIGPIPE) {
                kernel_default_signal(sig)?;
            }
        }
        let plan = &mut *shared.plan;
        for (target, &fd) in plan.stdio.iter().enumerate() {
            let target = target as libc::c_int;
            if fd == target {
                // Already in place: only its close-on-exec flag must go.
                cvt(libc::fcntl(fd, libc::F_SETFD, 0))?;
            } else {
                loop {
                    match cvt(libc::dup2(fd, target)) {
                        Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                        r => {
                            r?;
                            break;
                        }
                    }
                }
            }
        }
        cvt(libc::fchdir(plan.cwd))?;
        (shared.pre_exec)()?;
        let rc = libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &shared.mask as *const libc::sigset_t,
            std::ptr::null_mut::<libc::sigset_t>(),
            8,
        );
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        // execvp's rules: go on past a candidate that is missing or not executable by us
        // (reporting EACCES if one was), stop at any other error; a file the kernel cannot
        // execute is run by /bin/sh.
        let mut eacces = false;
        let mut last = libc::ENOENT;
        for cand in &plan.candidates {
            libc::execve(cand.as_ptr(), plan.argv.as_ptr(), plan.envp.as_ptr());
            let e = *libc::__errno_location();
            if e == libc::ENOEXEC {
                plan.sh_argv[1] = cand.as_ptr();
                libc::execve(
                    c"/bin/sh".as_ptr(),
                    plan.sh_argv.as_ptr(),
                    plan.envp.as_ptr(),
                );
                return Err(io::Error::last_os_error());
            }
            match e {
                libc::EACCES => eacces = true,
                libc::ENOENT | libc::ESTALE | libc::ENOTDIR | libc::ENODEV | libc::ETIMEDOUT => {}
                _ => return Err(io::Error::from_raw_os_error(e)),
            }
            last = e;
        }
        Err(io::Error::from_raw_os_error(if eacces {
            libc::EACCES
        } else {
            last
        }))
    }
}
