//! Descriptors: pipes and socket pairs, descriptors passed over a socket, descriptor flags,
//! file locks, and plain reads, writes and splices between descriptors.

use super::cvt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};

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

/// Make descriptor `to` a copy of `fd` (`dup2(2)`; the copy is not close-on-exec).
pub fn dup2(fd: impl AsFd, to: RawFd) -> io::Result<()> {
    // SAFETY: a plain syscall on integers; `fd` is open for the call.
    cvt(unsafe { libc::dup2(fd.as_fd().as_raw_fd(), to) }).map(drop)
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
