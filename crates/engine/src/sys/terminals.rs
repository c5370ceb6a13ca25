//! Terminals: new pseudo-terminal pairs, their size, and the controlling terminal of a session.

use super::cvt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

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
