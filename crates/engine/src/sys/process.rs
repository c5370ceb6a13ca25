//! Processes and signals: ids, `fork` and exit, waiting for children, signal dispositions
//! (also those the C library hides), resource limits, and the process table read from `/proc`.

use super::cvt;
use std::ffi::CString;
use std::io;

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
pub(super) const KERNEL_LAST_SIGNAL: libc::c_int = 64;

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

/// Fork. The caller must be single-threaded (it is: the spawner, which has no threads).
pub fn fork() -> io::Result<libc::pid_t> {
    // SAFETY: called only from the single-threaded spawner, so the child inherits no locks
    // held by other threads.
    cvt(unsafe { libc::fork() })
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

/// Eight random bytes from the kernel.
pub fn random_u64() -> io::Result<u64> {
    let mut buf = [0u8; 8];
    getrandom::fill(&mut buf).map_err(|e| io::Error::other(e.to_string()))?;
    Ok(u64::from_ne_bytes(buf))
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
