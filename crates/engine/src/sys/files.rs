//! Files beneath a directory descriptor: `openat2` and its `RESOLVE_*` rules, the `*at` calls on
//! entries of a held directory, changes made through a descriptor rather than a path, filesystem
//! facts (type, usage, access), and inotify.

use super::{cstr, cvt};
use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

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

/// The path through which the kernel reaches the object `fd` refers to (for `mount(2)`,
/// which takes paths): `/proc/self/fd/N`.
pub fn fd_path(fd: RawFd) -> std::path::PathBuf {
    std::path::PathBuf::from(format!("/proc/self/fd/{fd}"))
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

/// The kernel's bound of one extended attribute's value (`XATTR_SIZE_MAX`) and of the list
/// of a file's attribute names (`XATTR_LIST_MAX`): buffers this large always fit.
pub const XATTR_MAX: usize = 65536;

/// `flistxattr(2)` into `buf`: the file's attribute names, each ending in NUL; the length.
pub fn list_attributes(fd: impl AsFd, buf: &mut [u8]) -> io::Result<usize> {
    Ok(rustix::fs::flistxattr(fd, buf)?)
}

/// `fgetxattr(2)` into `buf`: the value of attribute `name`; its length.
pub fn get_attribute(fd: impl AsFd, name: &[u8], buf: &mut [u8]) -> io::Result<usize> {
    let name = CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    Ok(rustix::fs::fgetxattr(fd, name.as_c_str(), buf)?)
}

/// `fsetxattr(2)`: create or replace attribute `name` of the file `fd` holds.
pub fn set_attribute(fd: impl AsFd, name: &str, value: &[u8]) -> io::Result<()> {
    let name = CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    Ok(rustix::fs::fsetxattr(
        fd,
        name.as_c_str(),
        value,
        rustix::fs::XattrFlags::empty(),
    )?)
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

/// Change the owner of the object `fd` refers to (also an `O_PATH` descriptor), never a path.
pub fn chown_fd(fd: impl AsFd, uid: u32, gid: u32) -> io::Result<()> {
    fchown(fd, uid, gid)
}

/// The filesystem type (`f_type`) of what `fd` refers to.
pub fn fs_type(fd: impl AsFd) -> io::Result<i64> {
    Ok(rustix::fs::fstatfs(fd)?.f_type as i64)
}

/// `statvfs` of a path: `(total bytes, available bytes)`.
pub fn fs_usage(path: &Path) -> io::Result<(u64, u64)> {
    let st = rustix::fs::statvfs(path)?;
    Ok((
        st.f_blocks.saturating_mul(st.f_frsize),
        st.f_bavail.saturating_mul(st.f_frsize),
    ))
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
