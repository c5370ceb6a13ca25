//! The agent's file API: every call resolves its path beneath a descriptor of the sandbox
//! root and changes only what it holds a descriptor for.
//!
//! Why it is built this way: sandbox code runs beside the agent and can swap any name for a
//! symlink at any moment, and the agent's own `/proc/1/{exe,fd,map_files,root}` are magic
//! links to host objects. So:
//!
//! - paths resolve with `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)` from the root
//!   descriptor: ordinary symlinks are followed as the sandbox sees them (an absolute link is
//!   read from the sandbox root, `..` stops there) and magic links are refused by the kernel;
//!   below a directory already held, entries are opened with
//!   `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`;
//! - metadata changes (`chmod`, `chown`) go through a descriptor, names are removed and
//!   renamed with `unlinkat`/`renameat` relative to a held directory, never by path;
//! - nothing is served from procfs (its files are the agent's own view, sized 0, and its
//!   links lead to host objects);
//! - reads take regular files only (checked on an `O_PATH` descriptor before any real open,
//!   so a FIFO or device is never opened) and stop at the size the file had when opened;
//! - file names that are not UTF-8 travel in a reversible form ([`encode_name`]);
//! - extended attributes are set on the written file's descriptor before it lands, and read
//!   from a descriptor of the entry opened beneath its held directory (an `O_PATH` probe
//!   first, reopened for reading only once it is known to be the regular file or directory
//!   that was looked at), never by name.
//!
//! Everything here blocks; the agent runs it on its blocking pool, never on its event loop.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Component, Path, PathBuf};

use super::config::Record;
use super::sys;
use sandcove_core::validate::{
    MAX_FILE_ATTRIBUTES, MAX_FILE_ATTRIBUTE_BYTES, USER_ATTRIBUTE_PREFIX,
};
use sandcove_core::{
    now_millis, Error, FileAttributes, FileKind, FileStat, ListDirOptions, MkdirOptions, Result,
};

/// Resolution from the sandbox root: in-sandbox symlinks followed, magic links refused.
const FROM_ROOT: u64 = sys::RESOLVE_IN_ROOT | sys::RESOLVE_NO_MAGICLINKS;
/// Resolution of one entry of a held directory: no link of any kind.
const ENTRY: u64 = sys::RESOLVE_BENEATH | sys::RESOLVE_NO_SYMLINKS | sys::RESOLVE_NO_MAGICLINKS;
/// Symlinks followed for one write target before giving up (as the kernel's own limit).
const MAX_HOPS: usize = 40;
/// Directory levels a recursive remove descends (one descriptor held per level).
const MAX_REMOVE_DEPTH: usize = 256;
/// Code points U+EF80..=U+EFFF stand for the raw bytes 0x80..=0xFF in names that are not
/// UTF-8 (see [`encode_name`]).
const RAW_BASE: u32 = 0xEF00;

/// Represent a file name (or path) that may not be UTF-8 as a `String`, reversibly.
///
/// Valid UTF-8 passes through unchanged, except characters in U+EF80..=U+EFFF (private use).
/// Each byte of an invalid sequence, and each byte of the UTF-8 encoding of a character in
/// that range, becomes the character U+EF00 + byte. [`decode_name`] maps those characters
/// back to the bytes, so every name the API returns can be passed back to address the same
/// file. (A name typed by a user that contains U+EF80..=U+EFFF itself must be given in this
/// escaped form, as `list` returns it.)
pub fn encode_name(raw: &OsStr) -> String {
    let mut out = String::new();
    let mut rest = raw.as_bytes();
    let escape = |out: &mut String, bytes: &[u8]| {
        for b in bytes {
            out.push(char::from_u32(RAW_BASE + *b as u32).unwrap_or('\u{FFFD}'));
        }
    };
    while !rest.is_empty() {
        let (valid, bad) = match std::str::from_utf8(rest) {
            Ok(s) => (s, 0),
            Err(e) => {
                // `valid_up_to` ends on a character boundary.
                let s = std::str::from_utf8(&rest[..e.valid_up_to()]).unwrap_or("");
                (s, e.error_len().unwrap_or(rest.len() - e.valid_up_to()))
            }
        };
        for c in valid.chars() {
            if (RAW_BASE + 0x80..=RAW_BASE + 0xFF).contains(&(c as u32)) {
                let mut buf = [0u8; 4];
                escape(&mut out, c.encode_utf8(&mut buf).as_bytes());
            } else {
                out.push(c);
            }
        }
        let start = valid.len();
        escape(&mut out, &rest[start..start + bad]);
        rest = &rest[start + bad..];
    }
    out
}

/// The raw bytes a name given to the API stands for (the inverse of [`encode_name`]).
pub fn decode_name(name: &str) -> OsString {
    let mut out = Vec::with_capacity(name.len());
    for c in name.chars() {
        let u = c as u32;
        if (RAW_BASE + 0x80..=RAW_BASE + 0xFF).contains(&u) {
            out.push((u - RAW_BASE) as u8);
        } else {
            let mut buf = [0u8; 4];
            out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
        }
    }
    OsString::from_vec(out)
}

/// A path named by a caller: relative to the sandbox root, `..` already applied.
struct Target {
    /// Components below the root (empty for the root itself).
    rel: PathBuf,
    /// The path as the caller wrote it, for messages.
    shown: String,
}

impl Target {
    fn parse(record: &Record, path: &str) -> Result<Target> {
        if path.is_empty() {
            return Err(Error::invalid("empty path"));
        }
        if path.contains('\0') {
            return Err(Error::invalid("path contains a NUL byte"));
        }
        let raw = PathBuf::from(decode_name(path));
        let full = if raw.is_absolute() {
            raw
        } else {
            Path::new(&record.default_user().home).join(raw)
        };
        Ok(Target {
            rel: normalize(&full),
            shown: path.to_string(),
        })
    }

    fn name(&self) -> Option<&OsStr> {
        self.rel.file_name()
    }
}

/// Apply `.` and `..` lexically, clamped at the root, so every path names something beneath
/// the sandbox root and has a last component to act on.
fn normalize(path: &Path) -> PathBuf {
    let mut parts: Vec<&OsStr> = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(n) => parts.push(n),
            Component::ParentDir => {
                parts.pop();
            }
            _ => {}
        }
    }
    parts.iter().collect()
}

/// The sandbox path (as the API shows it) of a root-relative path.
fn shown_path(rel: &Path) -> String {
    encode_name(Path::new("/").join(rel).as_os_str())
}

/// The sandbox root as a directory descriptor: `/` for the agent of an isolated sandbox (its
/// root is the sandbox root), the host directory standing for it otherwise.
pub(super) fn open_root(record: &Record) -> Result<OwnedFd> {
    let root = record.root_prefix.as_deref().unwrap_or("/");
    sys::openat2(
        rustix::fs::CWD,
        Path::new(root),
        libc::O_PATH | libc::O_DIRECTORY,
        0,
        0,
    )
    .map_err(|e| Error::from_io(&e, "the sandbox root"))
}

/// Map a resolution error; `ELOOP` is a magic link (or a symlink loop) on the way.
fn resolve_err(e: std::io::Error, shown: &str) -> Error {
    if e.raw_os_error() == Some(libc::ELOOP) {
        Error::PermissionDenied {
            what: format!(
                "{shown}: the path passes through a /proc magic link or a symlink loop, \
                 which the file API does not follow"
            ),
        }
    } else {
        Error::from_io(&e, shown)
    }
}

/// Open `rel` from the root, following in-sandbox symlinks, refusing magic links.
fn open_from_root(root: &OwnedFd, rel: &Path, flags: libc::c_int, shown: &str) -> Result<OwnedFd> {
    let rel = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    sys::openat2(root.as_fd(), rel, flags, 0, FROM_ROOT).map_err(|e| resolve_err(e, shown))
}

/// Open entry `name` of the held directory `dir` without following any link.
fn open_entry(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    flags: libc::c_int,
    mode: u32,
) -> std::io::Result<OwnedFd> {
    sys::openat2(dir, Path::new(name), flags | libc::O_NOFOLLOW, mode, ENTRY)
}

/// Refuse procfs: its files are the agent's own view and its links lead to host objects.
fn refuse_procfs(fd: &OwnedFd, shown: &str) -> Result<()> {
    match sys::fs_type(fd.as_fd()) {
        Ok(sys::PROC_SUPER_MAGIC) => Err(Error::PermissionDenied {
            what: format!(
                "{shown}: the file API does not serve /proc (it would show the agent, not your \
                 processes); read it from a process in the sandbox, e.g. `cat`"
            ),
        }),
        Ok(_) => Ok(()),
        Err(e) => Err(Error::from_io(&e, shown)),
    }
}

/// The directory holding a target (resolved from the root) and the target's last name.
fn parent_of(root: &OwnedFd, t: &Target) -> Result<(OwnedFd, OsString)> {
    let name = t
        .name()
        .ok_or_else(|| Error::invalid(format!("{}: the sandbox root itself", t.shown)))?
        .to_os_string();
    let parent = t.rel.parent().unwrap_or(Path::new(""));
    let dir = open_from_root(root, parent, libc::O_PATH | libc::O_DIRECTORY, &t.shown)?;
    refuse_procfs(&dir, &t.shown)?;
    Ok((dir, name))
}

fn name_of(users: &[sandcove_core::UserInfo], id: u32, group: bool) -> String {
    users
        .iter()
        .find(|u| if group { u.gid == id } else { u.uid == id })
        .map(|u| u.name.clone())
        .unwrap_or_else(|| {
            if id == 65534 {
                "nobody".into()
            } else {
                id.to_string()
            }
        })
}

fn kind_of(mode: u32) -> FileKind {
    match mode & libc::S_IFMT {
        libc::S_IFLNK => FileKind::Symlink,
        libc::S_IFDIR => FileKind::Dir,
        libc::S_IFREG => FileKind::File,
        _ => FileKind::Other,
    }
}

fn stat_of(record: &Record, rel: &Path, st: &rustix::fs::Stat, link: Option<OsString>) -> FileStat {
    let mtime = st.st_mtime.max(0) as u64 * 1000 + st.st_mtime_nsec / 1_000_000;
    FileStat {
        path: shown_path(rel),
        name: rel
            .file_name()
            .map(encode_name)
            .unwrap_or_else(|| "/".into()),
        kind: kind_of(st.st_mode),
        size: st.st_size.max(0) as u64,
        mode: st.st_mode & 0o7777,
        uid: st.st_uid,
        gid: st.st_gid,
        owner: name_of(&record.users, st.st_uid, false),
        group: name_of(&record.users, st.st_gid, true),
        modified: mtime,
        symlink_target: link.map(|l| encode_name(&l)),
        attributes: None,
    }
}

/// Whether an attribute call failed because the filesystem has no user attributes.
fn attributes_unsupported(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(libc::EOPNOTSUPP)
}

/// A failure to set attributes on `shown`, typed: a filesystem without user attributes is
/// `NotSupported`, one without room for them an `Io` error of errno `ENOSPC`.
fn attribute_err(e: std::io::Error, shown: &str) -> Error {
    match e.raw_os_error() {
        Some(libc::EOPNOTSUPP) => Error::not_supported(
            format!("extended attributes on the filesystem holding {shown}"),
            "keep them in a sidecar file beside it, or write the file where the sandbox's own \
             filesystem is (its root has user attributes)",
        ),
        Some(libc::ENOSPC | libc::E2BIG | libc::EDQUOT) => Error::Io {
            message: format!("{shown}: no room for these extended attributes on its filesystem"),
            errno: Some(libc::ENOSPC),
        },
        _ => Error::from_io(&e, shown),
    }
}

/// Set `attributes` (validated names) on the file `fd` holds.
fn set_attributes(fd: BorrowedFd<'_>, attributes: &FileAttributes, shown: &str) -> Result<()> {
    for (name, value) in attributes {
        sys::set_attribute(fd, name, value).map_err(|e| attribute_err(e, shown))?;
    }
    Ok(())
}

/// Buffers for reading attributes, reused across the entries of a listing.
struct AttributeReader {
    names: Vec<u8>,
    value: Vec<u8>,
}

impl AttributeReader {
    fn new() -> AttributeReader {
        AttributeReader {
            names: vec![0; sys::XATTR_MAX],
            value: vec![0; sys::XATTR_MAX],
        }
    }

    /// The `user.` attributes of the file `fd` holds, in name order within the bounds
    /// (names that are not UTF-8 left out); none where the filesystem has no user attributes.
    fn read(&mut self, fd: BorrowedFd<'_>) -> std::io::Result<FileAttributes> {
        let mut out = FileAttributes::new();
        let len = match sys::list_attributes(fd, &mut self.names) {
            Ok(len) => len,
            Err(e) if attributes_unsupported(&e) => return Ok(out),
            Err(e) => return Err(e),
        };
        let mut names: Vec<&str> = self.names[..len]
            .split(|b| *b == 0)
            .filter_map(|n| std::str::from_utf8(n).ok())
            .filter(|n| n.starts_with(USER_ATTRIBUTE_PREFIX))
            .collect();
        names.sort_unstable();
        let mut total = 0usize;
        for name in names {
            let len = match sys::get_attribute(fd, name.as_bytes(), &mut self.value) {
                Ok(len) => len,
                // Removed since it was listed.
                Err(e) if e.raw_os_error() == Some(libc::ENODATA) => continue,
                Err(e) => return Err(e),
            };
            total += name.len() + len;
            if out.len() == MAX_FILE_ATTRIBUTES || total > MAX_FILE_ATTRIBUTE_BYTES {
                break;
            }
            out.insert(name.to_string(), self.value[..len].to_vec());
        }
        Ok(out)
    }

    /// The attributes of entry `name` of `dir`, which `lstat_at` just described as `st`.
    /// Only a regular file or a directory is opened (others have none here), and only once an
    /// `O_PATH` probe shows it is still what `st` describes, so a FIFO or device swapped in
    /// meanwhile is never opened. `None` when it cannot be read (the acting user may not read
    /// it, or it is gone).
    fn of_entry(
        &mut self,
        dir: BorrowedFd<'_>,
        name: &OsStr,
        st: &rustix::fs::Stat,
    ) -> Option<FileAttributes> {
        let flags = match st.st_mode & libc::S_IFMT {
            libc::S_IFREG => libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY,
            libc::S_IFDIR => libc::O_RDONLY | libc::O_DIRECTORY,
            _ => return Some(FileAttributes::new()),
        };
        let probe = open_entry(dir, name, libc::O_PATH, 0).ok()?;
        self.of_probe(&probe, st, flags)
    }

    /// The attributes of what `probe` (an `O_PATH` descriptor) holds, opened with `flags`
    /// only if it is the object `st` describes.
    fn of_probe(
        &mut self,
        probe: &OwnedFd,
        st: &rustix::fs::Stat,
        flags: libc::c_int,
    ) -> Option<FileAttributes> {
        let now = sys::fstat(probe.as_fd()).ok()?;
        if (now.st_dev, now.st_ino, now.st_mode & libc::S_IFMT)
            != (st.st_dev, st.st_ino, st.st_mode & libc::S_IFMT)
        {
            return None;
        }
        let fd = sys::reopen(probe.as_raw_fd(), flags).ok()?;
        self.read(fd.as_fd()).ok()
    }
}

/// Stat entry `name` of `dir` itself (a symlink is reported, not followed), with its
/// attributes when `attributes` holds buffers to read them.
fn stat_entry(
    record: &Record,
    dir: &OwnedFd,
    name: &OsStr,
    rel: &Path,
    attributes: Option<&mut AttributeReader>,
) -> std::io::Result<FileStat> {
    let st = sys::lstat_at(dir.as_fd(), name)?;
    let link = if st.st_mode & libc::S_IFMT == libc::S_IFLNK {
        sys::readlink_at(dir.as_fd(), name).ok()
    } else {
        None
    };
    let mut stat = stat_of(record, rel, &st, link);
    if let Some(reader) = attributes {
        stat.attributes = reader.of_entry(dir.as_fd(), name, &st);
    }
    Ok(stat)
}

/// Metadata of a path; symlinks are reported, not followed. A path through something that
/// is not a directory names nothing (`ENOTDIR` is not found, as for `exists`). With
/// `attributes`, the entry's `user.` attributes too (see [`FileStat::attributes`]).
pub(super) fn stat(record: &Record, path: &str, attributes: bool) -> Result<FileStat> {
    let root = open_root(record)?;
    let t = Target::parse(record, path)?;
    let mut reader = attributes.then(AttributeReader::new);
    if t.name().is_none() {
        let st = sys::fstat(root.as_fd()).map_err(|e| Error::from_io(&e, path))?;
        let mut stat = stat_of(record, &t.rel, &st, None);
        if let Some(reader) = &mut reader {
            stat.attributes = reader.of_probe(&root, &st, libc::O_RDONLY | libc::O_DIRECTORY);
        }
        return Ok(stat);
    }
    let missing = |e: std::io::Error| {
        if e.raw_os_error() == Some(libc::ENOTDIR) {
            Error::not_found(format!("file {path:?}"))
        } else {
            resolve_err(e, path)
        }
    };
    let name = t.name().unwrap_or_default().to_os_string();
    let parent = t.rel.parent().unwrap_or(Path::new(""));
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let dir = sys::openat2(
        root.as_fd(),
        parent,
        libc::O_PATH | libc::O_DIRECTORY,
        0,
        FROM_ROOT,
    )
    .map_err(missing)?;
    refuse_procfs(&dir, path)?;
    stat_entry(record, &dir, &name, &t.rel, reader.as_mut()).map_err(missing)
}

/// The entries of a held directory, sorted by name.
fn entries(dir: &OwnedFd) -> std::io::Result<Vec<OsString>> {
    let mut names: Vec<OsString> = std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd()))?
        .filter_map(|e| e.ok().map(|e| e.file_name()))
        .collect();
    names.sort();
    Ok(names)
}

/// Open a directory to list or watch: followed from the root, never on procfs.
pub(super) fn open_dir(root: &OwnedFd, record: &Record, path: &str) -> Result<(OwnedFd, PathBuf)> {
    let t = Target::parse(record, path)?;
    let dir = open_from_root(root, &t.rel, libc::O_PATH | libc::O_DIRECTORY, path)?;
    refuse_procfs(&dir, path)?;
    Ok((dir, t.rel))
}

/// Open subdirectory `name` of a held directory for descending into it: no links, and not
/// into procfs (listing the agent's `/proc/1/map_files` would name host files).
pub(super) fn open_subdir(dir: &OwnedFd, name: &OsStr) -> Option<OwnedFd> {
    let sub = open_entry(dir.as_fd(), name, libc::O_PATH | libc::O_DIRECTORY, 0).ok()?;
    match sys::fs_type(sub.as_fd()) {
        Ok(sys::PROC_SUPER_MAGIC) | Err(_) => None,
        Ok(_) => Some(sub),
    }
}

/// List a directory to `depth` levels (entries' symlinks reported, never followed).
pub(super) fn list_dir(
    record: &Record,
    path: &str,
    options: ListDirOptions,
) -> Result<Vec<FileStat>> {
    if options.depth == 0 {
        return Err(Error::invalid("depth must be at least 1"));
    }
    let root = open_root(record)?;
    let (top, rel) = open_dir(&root, record, path)?;
    let mut out = Vec::new();
    let mut reader = options.attributes.then(AttributeReader::new);
    let mut queue = std::collections::VecDeque::from([(top, rel, 1u32)]);
    while let Some((dir, rel, level)) = queue.pop_front() {
        let names = match entries(&dir) {
            Ok(names) => names,
            // The directory asked for must be readable (as a user, by that user); deeper
            // levels that cannot be read are left out, as `find` would.
            Err(e) if level == 1 => return Err(Error::from_io(&e, path)),
            Err(_) => continue,
        };
        for name in names {
            let child = rel.join(&name);
            let Ok(stat) = stat_entry(record, &dir, &name, &child, reader.as_mut()) else {
                continue; // gone meanwhile
            };
            if stat.kind == FileKind::Dir && level < options.depth {
                if let Some(sub) = open_subdir(&dir, &name) {
                    queue.push_back((sub, child, level + 1));
                }
            }
            out.push(stat);
        }
    }
    Ok(out)
}

/// Give a fresh entry to `user` (when that is not the agent's own root).
fn give_to(record: &Record, fd: &OwnedFd, user: Option<&str>, shown: &str) -> Result<()> {
    let u = record.user(user)?;
    if u.uid != 0 || u.gid != 0 {
        sys::fchown(fd.as_fd(), u.uid, u.gid).map_err(|e| Error::from_io(&e, shown))?;
    }
    Ok(())
}

/// Create directory `name` in `dir` (owned by `user`, with `mode`) and return it, opened
/// without following links. `Ok(None)` when something already has that name.
fn create_dir_in(
    record: &Record,
    dir: &OwnedFd,
    name: &OsStr,
    mode: u32,
    user: Option<&str>,
    shown: &str,
) -> Result<Option<OwnedFd>> {
    match sys::mkdir_at(dir.as_fd(), name, 0o700) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(None),
        Err(e) => return Err(Error::from_io(&e, shown)),
    }
    let fd = open_entry(dir.as_fd(), name, libc::O_PATH | libc::O_DIRECTORY, 0)
        .map_err(|e| resolve_err(e, shown))?;
    give_to(record, &fd, user, shown)?;
    sys::chmod_fd_path(fd.as_raw_fd(), mode).map_err(|e| Error::from_io(&e, shown))?;
    Ok(Some(fd))
}

/// `mkdir -p` of `rel`: every missing level created (owned by `user`); the last one held.
fn mkdir_all(
    root: &OwnedFd,
    record: &Record,
    rel: &Path,
    user: Option<&str>,
    shown: &str,
) -> Result<OwnedFd> {
    let mut cur = open_from_root(root, Path::new(""), libc::O_PATH | libc::O_DIRECTORY, shown)?;
    let mut prefix = PathBuf::new();
    for name in rel.iter() {
        prefix.push(name);
        let next = match open_from_root(root, &prefix, libc::O_PATH | libc::O_DIRECTORY, shown) {
            Ok(fd) => fd,
            Err(e) if e.is_not_found() => {
                refuse_procfs(&cur, shown)?;
                match create_dir_in(record, &cur, name, 0o755, user, shown)? {
                    Some(fd) => fd,
                    // Created meanwhile by someone else: take what is there now.
                    None => open_from_root(root, &prefix, libc::O_PATH | libc::O_DIRECTORY, shown)?,
                }
            }
            Err(e) => return Err(e),
        };
        cur = next;
    }
    refuse_procfs(&cur, shown)?;
    Ok(cur)
}

/// Create a directory (with its parents when asked).
pub(super) fn mkdir(record: &Record, path: &str, options: MkdirOptions) -> Result<FileStat> {
    let root = open_root(record)?;
    let t = Target::parse(record, path)?;
    let user = options.user.as_deref();
    record.user(user)?;
    let exists = || Error::AlreadyExists {
        what: format!("path {path}"),
    };
    let Some(name) = t.name().map(OsStr::to_os_string) else {
        return if options.parents {
            stat(record, "/", false)
        } else {
            Err(exists())
        };
    };
    let parent_rel = t.rel.parent().unwrap_or(Path::new(""));
    let parent = if options.parents {
        mkdir_all(&root, record, parent_rel, user, path)?
    } else {
        let (dir, _) = parent_of(&root, &t)?;
        dir
    };
    let mode = options.mode.map(|m| m & 0o7777).unwrap_or(0o755);
    match create_dir_in(record, &parent, &name, mode, user, path)? {
        Some(fd) => {
            let st = sys::fstat(fd.as_fd()).map_err(|e| Error::from_io(&e, path))?;
            Ok(stat_of(record, &t.rel, &st, None))
        }
        None => {
            // Something has the name: fine for `mkdir -p` when it is (or leads to) a directory.
            let is_dir = options.parents
                && open_from_root(&root, &t.rel, libc::O_PATH | libc::O_DIRECTORY, path).is_ok();
            if !is_dir {
                return Err(exists());
            }
            stat_entry(record, &parent, &name, &t.rel, None).map_err(|e| Error::from_io(&e, path))
        }
    }
}

/// Remove everything in the held directory `dir`, then the directory itself from `parent`.
/// Descends by descriptor, never through a link, never into another mount.
fn remove_tree(parent: &OwnedFd, name: &OsStr, depth: usize, shown: &str) -> Result<()> {
    if depth > MAX_REMOVE_DEPTH {
        return Err(Error::invalid(format!(
            "{shown}: more than {MAX_REMOVE_DEPTH} directory levels; remove it from a process \
             (rm -r)"
        )));
    }
    let dir = sys::openat2(
        parent.as_fd(),
        Path::new(name),
        libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        0,
        ENTRY | sys::RESOLVE_NO_XDEV,
    )
    .map_err(|e| {
        if e.raw_os_error() == Some(libc::EXDEV) {
            Error::invalid(format!("{shown}: contains a mount point (a volume?)"))
        } else {
            resolve_err(e, shown)
        }
    })?;
    for entry in entries(&dir).map_err(|e| Error::from_io(&e, shown))? {
        let Ok(st) = sys::lstat_at(dir.as_fd(), &entry) else {
            continue;
        };
        if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
            remove_tree(&dir, &entry, depth + 1, shown)?;
        } else {
            match sys::unlink_at(dir.as_fd(), &entry, false) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::from_io(&e, shown)),
            }
        }
    }
    sys::unlink_at(parent.as_fd(), name, true).map_err(|e| Error::from_io(&e, shown))
}

/// Remove a file, a symlink (not its target) or a directory.
pub(super) fn remove(record: &Record, path: &str, recursive: bool) -> Result<()> {
    let root = open_root(record)?;
    let t = Target::parse(record, path)?;
    if t.name().is_none() {
        return Err(Error::invalid("refusing to remove /"));
    }
    let (dir, name) = parent_of(&root, &t)?;
    let st = sys::lstat_at(dir.as_fd(), &name).map_err(|e| Error::from_io(&e, path))?;
    if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
        if recursive {
            remove_tree(&dir, &name, 0, path)
        } else {
            sys::unlink_at(dir.as_fd(), &name, true).map_err(|e| Error::from_io(&e, path))
        }
    } else {
        sys::unlink_at(dir.as_fd(), &name, false).map_err(|e| Error::from_io(&e, path))
    }
}

/// Rename an entry (a symlink moves as itself). Without `overwrite`, an existing destination
/// is refused by the rename itself (`RENAME_NOREPLACE`), never by a look before it.
pub(super) fn rename(record: &Record, from: &str, to: &str, overwrite: bool) -> Result<FileStat> {
    let root = open_root(record)?;
    let (f, t) = (Target::parse(record, from)?, Target::parse(record, to)?);
    let (fdir, fname) = parent_of(&root, &f)?;
    let (tdir, tname) = parent_of(&root, &t)?;
    sys::lstat_at(fdir.as_fd(), &fname).map_err(|e| Error::from_io(&e, from))?;
    land(&fdir, &fname, &tdir, &tname, overwrite)
        .map_err(|e| landing_err(e, &format!("{from} -> {to}"), to))?;
    stat_entry(record, &tdir, &tname, &t.rel, None).map_err(|e| Error::from_io(&e, to))
}

/// Move `from` (in `fdir`) to `to` (in `tdir`): replacing, or refusing any existing `to`.
fn land(
    fdir: &OwnedFd,
    from: &OsStr,
    tdir: &OwnedFd,
    to: &OsStr,
    overwrite: bool,
) -> std::io::Result<()> {
    if overwrite {
        sys::rename_at(fdir.as_fd(), from, tdir.as_fd(), to)
    } else {
        sys::rename_noreplace_at(fdir.as_fd(), from, tdir.as_fd(), to)
    }
}

/// A failed landing: `EEXIST` is the no-clobber refusal, named after the destination.
fn landing_err(e: std::io::Error, subject: &str, to: &str) -> Error {
    if e.raw_os_error() == Some(libc::EEXIST) {
        Error::AlreadyExists {
            what: format!("path {to} (not overwritten)"),
        }
    } else {
        Error::from_io(&e, subject)
    }
}

/// Directory levels a copy descends (one descriptor held per level on each side).
const MAX_COPY_DEPTH: usize = 256;

/// One copy in progress: what it needs at every level.
struct Copy<'a> {
    record: &'a Record,
    user: Option<&'a str>,
    recursive: bool,
    shown: &'a str,
    /// Directories this copy created (device, inode): met again in the source, the
    /// destination lies inside the source, and the copy would never end.
    made: Vec<(u64, u64)>,
}

/// Copy a file, a symlink (as itself) or, with `recursive`, a directory tree.
///
/// Everything below the two parents is reached by descriptor with no link followed
/// (`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`), so a symlink or a
/// directory swapped in by sandbox code while the copy runs can never lead it outside the
/// tree, let alone the sandbox. Data is streamed kernel-side (`copy_file_range`), never held.
/// A file, or a new tree, is built under a temporary name and lands by one rename (without
/// `overwrite`, `RENAME_NOREPLACE`); on failure the temporary entry is removed before the
/// error is returned.
pub(super) fn copy(
    record: &Record,
    from: &str,
    to: &str,
    options: &sandcove_core::CopyOptions,
) -> Result<FileStat> {
    let root = open_root(record)?;
    let user = options.user.as_deref();
    record.user(user)?;
    let (f, t) = (Target::parse(record, from)?, Target::parse(record, to)?);
    let (fdir, fname) = parent_of(&root, &f)?;
    let (tdir, tname) = parent_of(&root, &t)?;
    let shown = format!("{from} -> {to}");
    let mut job = Copy {
        record,
        user,
        recursive: options.recursive,
        shown: &shown,
        made: Vec::new(),
    };
    job.entry(&fdir, &fname, &tdir, &tname, options.overwrite, 0)?;
    stat_entry(record, &tdir, &tname, &t.rel, None).map_err(|e| Error::from_io(&e, to))
}

impl Copy<'_> {
    fn io(&self, e: std::io::Error) -> Error {
        resolve_err(e, self.shown)
    }

    /// Copy entry `sname` of `sdir` to `dname` in `ddir`.
    fn entry(
        &mut self,
        sdir: &OwnedFd,
        sname: &OsStr,
        ddir: &OwnedFd,
        dname: &OsStr,
        overwrite: bool,
        depth: usize,
    ) -> Result<()> {
        if depth > MAX_COPY_DEPTH {
            return Err(Error::invalid(format!(
                "{}: more than {MAX_COPY_DEPTH} directory levels; copy it from a process \
                 (cp -a)",
                self.shown
            )));
        }
        let st = sys::lstat_at(sdir.as_fd(), sname).map_err(|e| self.io(e))?;
        match st.st_mode & libc::S_IFMT {
            libc::S_IFDIR => self.dir(sdir, sname, ddir, dname, overwrite, depth),
            libc::S_IFREG => self.file(sdir, sname, &st, ddir, dname, overwrite),
            libc::S_IFLNK => {
                let target = sys::readlink_at(sdir.as_fd(), sname).map_err(|e| self.io(e))?;
                self.build_and_land(ddir, dname, overwrite, |job, temp| {
                    sys::symlink_at(&target, ddir.as_fd(), temp).map_err(|e| job.io(e))?;
                    let fd =
                        open_entry(ddir.as_fd(), temp, libc::O_PATH, 0).map_err(|e| job.io(e))?;
                    give_to(job.record, &fd, job.user, job.shown)
                })
            }
            _ => Err(Error::invalid(format!(
                "{}: {} is not a regular file, directory or symlink; the file API copies those \
                 only",
                self.shown,
                encode_name(sname)
            ))),
        }
    }

    /// Build an entry under a fresh temporary name in `ddir` with `build`, then land it at
    /// `dname`; on any failure the temporary entry is removed first.
    fn build_and_land(
        &mut self,
        ddir: &OwnedFd,
        dname: &OsStr,
        overwrite: bool,
        build: impl FnOnce(&mut Self, &OsStr) -> Result<()>,
    ) -> Result<()> {
        let random = sys::random_u64().map_err(|e| Error::from_io(&e, "random"))?;
        let temp = temp_name_for(dname, false, random);
        let result = build(self, &temp).and_then(|()| {
            land(ddir, &temp, ddir, dname, overwrite)
                .map_err(|e| landing_err(e, self.shown, &encode_name(dname)))
        });
        if result.is_err() {
            match sys::lstat_at(ddir.as_fd(), &temp) {
                Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => {
                    let _ = remove_tree(ddir, &temp, 0, self.shown);
                }
                Ok(_) => {
                    let _ = sys::unlink_at(ddir.as_fd(), &temp, false);
                }
                Err(_) => {}
            }
        }
        result
    }

    /// Copy a regular file: opened without following links and without blocking (should it
    /// have become a FIFO meanwhile), checked to be the file just looked at.
    fn file(
        &mut self,
        sdir: &OwnedFd,
        sname: &OsStr,
        st: &rustix::fs::Stat,
        ddir: &OwnedFd,
        dname: &OsStr,
        overwrite: bool,
    ) -> Result<()> {
        let src = open_entry(
            sdir.as_fd(),
            sname,
            libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY,
            0,
        )
        .map_err(|e| self.io(e))?;
        let again = sys::fstat(src.as_fd()).map_err(|e| self.io(e))?;
        if again.st_mode & libc::S_IFMT != libc::S_IFREG
            || (again.st_dev, again.st_ino) != (st.st_dev, st.st_ino)
        {
            return Err(Error::backend(format!(
                "{}: the source changed while it was copied",
                self.shown
            )));
        }
        sys::set_nonblocking(src.as_fd(), false).map_err(|e| self.io(e))?;
        let mode = again.st_mode & 0o1777;
        self.build_and_land(ddir, dname, overwrite, |job, temp| {
            let out = open_entry(
                ddir.as_fd(),
                temp,
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
                0o600,
            )
            .map_err(|e| job.io(e))?;
            let (mut from, mut into) = (std::fs::File::from(src), std::fs::File::from(out));
            std::io::copy(&mut from, &mut into).map_err(|e| job.io(e))?;
            let out = OwnedFd::from(into);
            // Owner first: a chown clears set-id bits a mode may carry.
            give_to(job.record, &out, job.user, job.shown)?;
            sys::fchmod(out.as_fd(), mode).map_err(|e| job.io(e))
        })
    }

    /// Copy a directory: into a new tree that lands whole, or (overwriting) merged into a
    /// directory already at the destination.
    fn dir(
        &mut self,
        sdir: &OwnedFd,
        sname: &OsStr,
        ddir: &OwnedFd,
        dname: &OsStr,
        overwrite: bool,
        depth: usize,
    ) -> Result<()> {
        if !self.recursive {
            return Err(Error::invalid(format!(
                "{}: is a directory (copy it with recursive)",
                self.shown
            )));
        }
        let src = open_entry(sdir.as_fd(), sname, libc::O_RDONLY | libc::O_DIRECTORY, 0)
            .map_err(|e| self.io(e))?;
        refuse_procfs(&src, self.shown)?;
        let st = sys::fstat(src.as_fd()).map_err(|e| self.io(e))?;
        if self.made.contains(&(st.st_dev, st.st_ino)) {
            return Err(Error::invalid(format!(
                "{}: cannot copy a directory into itself",
                self.shown
            )));
        }
        let names = entries(&src).map_err(|e| self.io(e))?;
        let mode = st.st_mode & 0o1777;
        if overwrite {
            if let Ok(existing) =
                open_entry(ddir.as_fd(), dname, libc::O_RDONLY | libc::O_DIRECTORY, 0)
            {
                let est = sys::fstat(existing.as_fd()).map_err(|e| self.io(e))?;
                if (est.st_dev, est.st_ino) == (st.st_dev, st.st_ino) {
                    return Err(Error::invalid(format!(
                        "{}: source and destination are the same directory",
                        self.shown
                    )));
                }
                self.made.push((est.st_dev, est.st_ino));
                for name in &names {
                    self.entry(&src, name, &existing, name, true, depth + 1)?;
                }
                return Ok(());
            }
        }
        self.build_and_land(ddir, dname, overwrite, |job, temp| {
            sys::mkdir_at(ddir.as_fd(), temp, 0o700).map_err(|e| job.io(e))?;
            let new = open_entry(ddir.as_fd(), temp, libc::O_RDONLY | libc::O_DIRECTORY, 0)
                .map_err(|e| job.io(e))?;
            let nst = sys::fstat(new.as_fd()).map_err(|e| job.io(e))?;
            job.made.push((nst.st_dev, nst.st_ino));
            for name in &names {
                job.entry(&src, name, &new, name, false, depth + 1)?;
            }
            give_to(job.record, &new, job.user, job.shown)?;
            sys::fchmod(new.as_fd(), mode).map_err(|e| job.io(e))
        })
    }
}

/// Change the mode of what a path names (in-sandbox symlinks followed), through a descriptor.
pub(super) fn chmod(record: &Record, path: &str, mode: u32) -> Result<FileStat> {
    if mode > 0o7777 {
        return Err(Error::invalid(format!(
            "mode {mode:o} has bits beyond 07777"
        )));
    }
    let root = open_root(record)?;
    let t = Target::parse(record, path)?;
    let fd = open_from_root(&root, &t.rel, libc::O_PATH, path)?;
    refuse_procfs(&fd, path)?;
    sys::chmod_fd_path(fd.as_raw_fd(), mode).map_err(|e| Error::from_io(&e, path))?;
    let st = sys::fstat(fd.as_fd()).map_err(|e| Error::from_io(&e, path))?;
    Ok(stat_of(record, &t.rel, &st, None))
}

/// Open a regular file for reading; returns it and its size at open (read no further).
pub(super) fn open_for_read(record: &Record, path: &str) -> Result<(std::fs::File, u64)> {
    let root = open_root(record)?;
    let t = Target::parse(record, path)?;
    // O_PATH first: it never opens the object, so a FIFO cannot block us and a device sees
    // nothing; the real open happens only once the object is known to be a regular file.
    let probe = open_from_root(&root, &t.rel, libc::O_PATH, path)?;
    refuse_procfs(&probe, path)?;
    let st = sys::fstat(probe.as_fd()).map_err(|e| Error::from_io(&e, path))?;
    match st.st_mode & libc::S_IFMT {
        libc::S_IFREG => {}
        libc::S_IFDIR => return Err(Error::invalid(format!("{path}: is a directory"))),
        _ => {
            return Err(Error::invalid(format!(
                "{path}: not a regular file (a device, FIFO or socket); the file API reads \
                 regular files only"
            )))
        }
    }
    let fd = sys::reopen(probe.as_raw_fd(), libc::O_RDONLY | libc::O_NOCTTY)
        .map_err(|e| Error::from_io(&e, path))?;
    let again = sys::fstat(fd.as_fd()).map_err(|e| Error::from_io(&e, path))?;
    if (again.st_dev, again.st_ino) != (st.st_dev, st.st_ino) {
        return Err(Error::backend(format!(
            "{path}: changed while it was opened"
        )));
    }
    Ok((std::fs::File::from(fd), again.st_size.max(0) as u64))
}

/// A write in progress: the file being written and where it lands.
pub(super) struct PendingWrite {
    dir: OwnedFd,
    name: OsString,
    /// The temporary name beside the target (`None` for an append, written in place).
    temp: Option<OsString>,
    /// Land without replacing anything (`RENAME_NOREPLACE`).
    noreplace: bool,
    /// Owner and mode to give the file before it lands.
    owner: Option<(u32, u32)>,
    mode: Option<u32>,
    rel: PathBuf,
    /// Whether the write set attributes (reported, read back, when it lands).
    attributes: bool,
    /// The file, written by the caller.
    pub file: std::fs::File,
}

/// The temporary name an API write uses beside its target (renamed over it at the end). It
/// records whether the target existed, so a watch can report the landing as a create or a
/// write without racing the rename; its digits are random, so sandbox code cannot plant
/// something at the name in advance.
pub(super) fn temp_name_for(target: &OsStr, existed: bool, random: u64) -> OsString {
    let new = if existed { "" } else { "new-" };
    let mut name = OsString::from(".");
    name.push(target);
    name.push(format!(".sandcove-{new}{}{random:020}", now_millis()));
    name
}

/// For an API write's temporary file: its target name and whether the target existed.
pub(super) fn temp_target(name: &OsStr) -> Option<(OsString, bool)> {
    let bytes = name.as_bytes().strip_prefix(b".")?;
    let marker = b".sandcove-";
    let at = bytes.windows(marker.len()).rposition(|w| w == marker)?;
    let (head, tail) = (&bytes[..at], &bytes[at + marker.len()..]);
    let (existed, digits) = match tail.strip_prefix(b"new-") {
        Some(d) => (false, d),
        None => (true, tail),
    };
    (!head.is_empty() && !digits.is_empty() && digits.iter().all(u8::is_ascii_digit))
        .then(|| (OsStr::from_bytes(head).to_os_string(), existed))
}

/// Resolve a write target (following in-sandbox symlinks of its last component, as `open(2)`
/// would) and open the file to write: a fresh temporary file beside it, or the target itself
/// for an append.
pub(super) fn begin_write(
    record: &Record,
    path: &str,
    options: &sandcove_core::WriteOptions,
) -> Result<PendingWrite> {
    options.validate()?;
    let root = open_root(record)?;
    let user = options.user.as_deref();
    record.user(user)?;
    let mut t = Target::parse(record, path)?;
    let mut hops = 0;
    let (dir, name, existing) = loop {
        let Some(name) = t.name().map(OsStr::to_os_string) else {
            return Err(Error::invalid(format!("{path}: is a directory")));
        };
        let parent_rel = t.rel.parent().unwrap_or(Path::new("")).to_path_buf();
        let dir = if options.create_parents && hops == 0 {
            mkdir_all(&root, record, &parent_rel, user, path)?
        } else {
            parent_of(&root, &t)?.0
        };
        match sys::lstat_at(dir.as_fd(), &name) {
            // No-clobber: anything with the name, a symlink included, is kept as it is.
            Ok(_) if !options.overwrite => {
                return Err(Error::AlreadyExists {
                    what: format!("path {path} (not overwritten)"),
                })
            }
            Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFLNK => {
                hops += 1;
                if hops > MAX_HOPS {
                    return Err(resolve_err(
                        std::io::Error::from_raw_os_error(libc::ELOOP),
                        path,
                    ));
                }
                let link =
                    sys::readlink_at(dir.as_fd(), &name).map_err(|e| Error::from_io(&e, path))?;
                // Relative links start at the directory really holding the link.
                let base = canonical_rel(record, &dir, path)?;
                t = Target {
                    rel: normalize(&Path::new("/").join(base).join(link)),
                    shown: path.to_string(),
                };
            }
            Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => {
                return Err(Error::invalid(format!("{path}: is a directory")));
            }
            Ok(st) => break (dir, name, Some(st)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => break (dir, name, None),
            Err(e) => return Err(Error::from_io(&e, path)),
        }
    };
    let mode = options.mode.map(|m| m & 0o7777);
    // Owner and mode come from the target entry itself (never from anything a link leads to).
    let u = record.user(user)?;
    let as_user = user.is_some() && (u.uid, u.gid) != (0, 0);
    if let (true, Some(st)) = (as_user, &existing) {
        if st.st_mode & libc::S_IFMT == libc::S_IFREG {
            // The replacement lands by rename, which the kernel checks on the directory only;
            // replacing a file needs write permission on the file itself, so ask for it as
            // this user (no truncation, non-blocking: nothing changes, nothing can hang).
            open_entry(
                dir.as_fd(),
                &name,
                libc::O_WRONLY | libc::O_NONBLOCK | libc::O_NOCTTY,
                0,
            )
            .map_err(|e| resolve_err(e, path))?;
        }
    }
    let owner = match &existing {
        // A user cannot give a file away: replacing someone else's file leaves it theirs.
        Some(st) if as_user && st.st_uid != u.uid => Some((u.uid, u.gid)),
        Some(st) => Some((st.st_uid, st.st_gid)),
        None => (u.uid != 0 || u.gid != 0).then_some((u.uid, u.gid)),
    };
    if options.append {
        let file = match &existing {
            Some(st) if st.st_mode & libc::S_IFMT != libc::S_IFREG => {
                return Err(Error::invalid(format!(
                    "{path}: not a regular file; the file API appends to regular files only"
                )))
            }
            // Non-blocking: should the name turn into a FIFO meanwhile, the open cannot hang.
            Some(_) => open_entry(
                dir.as_fd(),
                &name,
                libc::O_WRONLY | libc::O_APPEND | libc::O_NONBLOCK | libc::O_NOCTTY,
                0,
            ),
            None => open_entry(
                dir.as_fd(),
                &name,
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
                0o600,
            ),
        }
        .map_err(|e| resolve_err(e, path))?;
        let st = sys::fstat(file.as_fd()).map_err(|e| Error::from_io(&e, path))?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(Error::invalid(format!("{path}: not a regular file")));
        }
        sys::set_nonblocking(file.as_fd(), false).map_err(|e| Error::from_io(&e, path))?;
        let new = existing.is_none();
        if let Err(e) = set_attributes(file.as_fd(), &options.attributes, path) {
            // A file this append created is removed again: a refused append leaves no trace.
            if new {
                let _ = sys::unlink_at(dir.as_fd(), &name, false);
            }
            return Err(e);
        }
        return Ok(PendingWrite {
            dir,
            name,
            temp: None,
            noreplace: !options.overwrite,
            owner: if new { owner } else { None },
            mode: if new {
                Some(mode.unwrap_or(0o644))
            } else {
                mode
            },
            rel: t.rel,
            attributes: !options.attributes.is_empty(),
            file: std::fs::File::from(file),
        });
    }
    refuse_procfs(&dir, path)?;
    let mut attempt = 0;
    let (temp, file) = loop {
        let random = sys::random_u64().map_err(|e| Error::from_io(&e, "random"))?;
        let temp = temp_name_for(&name, existing.is_some(), random);
        // O_EXCL never follows a link: this is a new file of ours, or nothing.
        match open_entry(
            dir.as_fd(),
            &temp,
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
            0o600,
        ) {
            Ok(fd) => break (temp, fd),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 8 => {
                attempt += 1;
            }
            Err(e) => return Err(resolve_err(e, path)),
        }
    };
    let mode = mode.or(existing.as_ref().map(|st| st.st_mode & 0o7777));
    let pending = PendingWrite {
        dir,
        name,
        temp: Some(temp),
        noreplace: !options.overwrite,
        owner,
        mode: Some(mode.unwrap_or(0o644)),
        rel: t.rel,
        attributes: !options.attributes.is_empty(),
        file: std::fs::File::from(file),
    };
    // On the temporary file, before any byte is taken: a refusal leaves nothing behind, and
    // the file lands with its attributes (the rename keeps them).
    if let Err(e) = set_attributes(pending.file.as_fd(), &options.attributes, path) {
        pending.discard();
        return Err(e);
    }
    Ok(pending)
}

/// The root-relative path of a held directory (where a relative symlink in it starts).
fn canonical_rel(record: &Record, dir: &OwnedFd, shown: &str) -> Result<PathBuf> {
    let real = std::fs::read_link(format!("/proc/self/fd/{}", dir.as_raw_fd()))
        .map_err(|e| Error::from_io(&e, shown))?;
    let root = Path::new(record.root_prefix.as_deref().unwrap_or("/"));
    real.strip_prefix(root)
        .map(Path::to_path_buf)
        .map_err(|_| Error::PermissionDenied {
            what: format!("{shown}: resolves outside the sandbox"),
        })
}

impl PendingWrite {
    /// Give the written file its owner and mode (on the descriptor) and move it into place.
    pub(super) fn finish(self, record: &Record, shown: &str) -> Result<FileStat> {
        let fd = self.file.as_fd();
        let result = (|| {
            // Owner first: a chown clears set-id bits the mode may carry.
            if let Some((uid, gid)) = self.owner {
                sys::fchown(fd, uid, gid).map_err(|e| Error::from_io(&e, shown))?;
            }
            if let Some(mode) = self.mode {
                sys::fchmod(fd, mode).map_err(|e| Error::from_io(&e, shown))?;
            }
            if let Some(temp) = &self.temp {
                land(&self.dir, temp, &self.dir, &self.name, !self.noreplace)
                    .map_err(|e| landing_err(e, shown, shown))?;
            }
            Ok(())
        })();
        if let Err(e) = result {
            self.discard();
            return Err(e);
        }
        let st = sys::fstat(fd).map_err(|e| Error::from_io(&e, shown))?;
        let mut stat = stat_of(record, &self.rel, &st, None);
        if self.attributes {
            // Read back through the descriptor written to (attribute calls do not depend on
            // its access mode): what the file really has, not what was asked for.
            stat.attributes = AttributeReader::new().read(fd).ok();
        }
        Ok(stat)
    }

    /// Abandon the write: the temporary file is gone when this returns.
    pub(super) fn discard(&self) {
        if let Some(temp) = &self.temp {
            let _ = sys::unlink_at(self.dir.as_fd(), temp, false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_are_not_utf8_round_trip() {
        let cases: &[&[u8]] = &[
            b"plain.txt",
            b"caf\xc3\xa9",
            b"bad\xff\xfe",
            b"\x80",
            b"half\xc3",
            "\u{EF80}\u{EFFF}x".as_bytes(),
            b"mixed\xe2\x82-\xef\xbe\x80",
        ];
        for raw in cases {
            let os = OsStr::from_bytes(raw);
            let text = encode_name(os);
            assert_eq!(decode_name(&text).as_bytes(), *raw, "{text:?}");
        }
        assert_eq!(encode_name(OsStr::new("plain/é")), "plain/é");
        assert_eq!(encode_name(OsStr::from_bytes(b"a\xff")), "a\u{EFFF}");
        assert_ne!(
            encode_name(OsStr::from_bytes(b"\xff")),
            encode_name(OsStr::new("\u{FFFD}")),
            "distinct names stay distinct"
        );
    }

    #[test]
    fn attribute_refusals_are_typed() {
        use sandcove_core::ErrorCode;
        let err = |errno| attribute_err(std::io::Error::from_raw_os_error(errno), "/data/f");
        let refused = err(libc::EOPNOTSUPP);
        assert_eq!(refused.code(), ErrorCode::NotSupported, "{refused}");
        assert!(refused.to_string().contains("sidecar"), "{refused}");
        for errno in [libc::ENOSPC, libc::E2BIG, libc::EDQUOT] {
            assert!(
                matches!(
                    err(errno),
                    Error::Io {
                        errno: Some(libc::ENOSPC),
                        ..
                    }
                ),
                "{errno}"
            );
        }
        assert_eq!(err(libc::EPERM).code(), ErrorCode::PermissionDenied);
    }

    #[test]
    fn paths_normalize_beneath_the_root() {
        for (path, want) in [
            ("/a/b/../c", "a/c"),
            ("/../../etc/passwd", "etc/passwd"),
            ("/", ""),
            ("/a/./b/", "a/b"),
            ("/a/..", ""),
        ] {
            assert_eq!(normalize(Path::new(path)), Path::new(want), "{path}");
        }
    }

    #[test]
    fn api_write_temporary_names_round_trip() {
        let t = |n: &str, e| temp_target(&temp_name_for(OsStr::new(n), e, 42));
        assert_eq!(t("a.txt", true), Some((OsString::from("a.txt"), true)));
        assert_eq!(t("a.txt", false), Some((OsString::from("a.txt"), false)));
        let raw = OsStr::from_bytes(b"x\xff");
        assert_eq!(
            temp_target(&temp_name_for(raw, false, 7)),
            Some((raw.to_os_string(), false))
        );
        for not_temp in [
            "notes.txt",
            ".notes.sandcove-",
            ".sandcove-12",
            ".a.sandcove-1x",
            "a.sandcove-1",
        ] {
            assert_eq!(temp_target(OsStr::new(not_temp)), None, "{not_temp}");
        }
    }
}
