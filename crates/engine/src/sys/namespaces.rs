//! Namespaces and mounts: entering fresh namespaces, the writes that map uids into them, the
//! hostname and loopback of a new namespace, and mounting, moving and detaching trees.

use super::{cstr, cvt};
use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

/// `unshare(2)`.
pub fn unshare(flags: libc::c_int) -> io::Result<()> {
    // SAFETY: unshare takes plain flags.
    cvt(unsafe { libc::unshare(flags) }).map(drop)
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

/// Write a whole file at a `/proc` path (uid_map and friends need a single write).
pub fn write_proc_file(path: &str, contents: &str) -> io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().write(true).open(path)?;
    f.write_all(contents.as_bytes())
        .map_err(|e| io::Error::new(e.kind(), format!("write {path}: {e}")))
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
