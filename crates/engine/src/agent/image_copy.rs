//! An image's root composed by copying its layers, where overlayfs cannot be mounted (or the
//! operator chose it, see [`crate::images::ImageRootMode`]).
//!
//! The layers are applied lowest first onto a directory of the sandbox's root tmpfs, as
//! overlayfs would stack them: a whiteout (a 0:0 character device) deletes what lower layers
//! have at its name, an opaque directory (`user.overlay.opaque=y`) replaces the lower layers'
//! directory, directories are merged (their attributes the topmost layer's), and regular
//! files and symlinks replace what was there, copied with their modes, owners and times (a
//! hard link within a layer becomes a copy). Every entry, in the layers and in the root, is
//! reached beneath a directory descriptor with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`; symlinks are read as text, never followed.
//! The tmpfs's size and inode bounds bound the copy: running out of either is the image not
//! fitting the sandbox's disk.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags, Timespec, Timestamps};
use rustix::io::Errno;

// The layer walk's small helpers, shared with the snapshot writer (which reads the same
// overlayfs format).
use super::layer_tar::{is_opaque, join, list};

const RESOLVE: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);

/// Apply the layer beneath `layer` onto the root beneath `root` (see the module docs).
pub(super) fn apply_layer(layer: BorrowedFd<'_>, root: BorrowedFd<'_>) -> io::Result<()> {
    // Directories still to copy, by path beneath the layer (empty: the layer's root).
    let mut pending: Vec<Vec<u8>> = vec![Vec::new()];
    while let Some(rel) = pending.pop() {
        let from = open_beneath(layer, &rel, OFlags::RDONLY | OFlags::DIRECTORY)?;
        let into = open_beneath(root, &rel, OFlags::RDONLY | OFlags::DIRECTORY)?;
        for name in list(from.as_fd())? {
            let stat = rustix::fs::statat(&from, name.as_slice(), AtFlags::SYMLINK_NOFOLLOW)?;
            let path = join(&rel, &name);
            match FileType::from_raw_mode(stat.st_mode) {
                FileType::CharacterDevice if stat.st_rdev == 0 => {
                    remove_entry(root, &path)?;
                }
                FileType::Directory => {
                    let dir = open_beneath(layer, &path, OFlags::RDONLY | OFlags::DIRECTORY)?;
                    let existing =
                        rustix::fs::statat(&into, name.as_slice(), AtFlags::SYMLINK_NOFOLLOW);
                    let merge = match existing {
                        Ok(st) => FileType::from_raw_mode(st.st_mode) == FileType::Directory,
                        Err(Errno::NOENT) => false,
                        Err(e) => return Err(e.into()),
                    };
                    if !merge || is_opaque(dir.as_fd()) {
                        remove_entry(root, &path)?;
                        rustix::fs::mkdirat(&into, name.as_slice(), Mode::from_raw_mode(0o700))?;
                    }
                    let made = open_beneath(root, &path, OFlags::RDONLY | OFlags::DIRECTORY)?;
                    set_owner(made.as_fd(), &stat)?;
                    rustix::fs::fchmod(&made, mode_of(&stat))?;
                    pending.push(path);
                }
                FileType::RegularFile => {
                    remove_entry(root, &path)?;
                    copy_file(from.as_fd(), into.as_fd(), &name, &stat)?;
                }
                FileType::Symlink => {
                    remove_entry(root, &path)?;
                    let target = rustix::fs::readlinkat(&from, name.as_slice(), Vec::new())?;
                    rustix::fs::symlinkat(target.as_c_str(), &into, name.as_slice())?;
                    match rustix::fs::chownat(
                        &into,
                        name.as_slice(),
                        Some(rustix::fs::Uid::from_raw(stat.st_uid)),
                        Some(rustix::fs::Gid::from_raw(stat.st_gid)),
                        AtFlags::SYMLINK_NOFOLLOW,
                    ) {
                        // An owner this namespace does not map: the copy stays root's.
                        Ok(()) | Err(Errno::INVAL) => {}
                        Err(e) => return Err(e.into()),
                    }
                    rustix::fs::utimensat(
                        &into,
                        name.as_slice(),
                        &times_of(&stat),
                        AtFlags::SYMLINK_NOFOLLOW,
                    )?;
                }
                // Device nodes, fifos, sockets: the store never unpacks them.
                _ => {}
            }
        }
    }
    Ok(())
}

/// Copy the regular file `name` of `from` into `into` (where nothing has that name now).
fn copy_file(
    from: BorrowedFd<'_>,
    into: BorrowedFd<'_>,
    name: &[u8],
    stat: &rustix::fs::Stat,
) -> io::Result<()> {
    let source = rustix::fs::openat2(
        from,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        RESOLVE,
    )?;
    let made = rustix::fs::openat(
        into,
        name,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )?;
    let out = std::fs::File::from(made);
    copy_data(&std::fs::File::from(source), &out, stat.st_size as u64)?;
    set_owner(out.as_fd(), stat)?;
    rustix::fs::fchmod(&out, mode_of(stat))?;
    rustix::fs::futimens(&out, &times_of(stat))?;
    Ok(())
}

/// Copy the `size` bytes of `source` into the empty `out`: only its data segments are
/// written, and the size is set after, so a sparse file's holes stay holes (written out as
/// zeros, a file of a few KiB of data and a large apparent size would fill the sandbox's
/// disk).
fn copy_data(source: &std::fs::File, out: &std::fs::File, size: u64) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; 1 << 16];
    for (offset, length) in super::layer_tar::data_segments(source.as_fd(), size)? {
        let mut done = 0u64;
        while done < length {
            let want = (length - done).min(buf.len() as u64) as usize;
            let n = source.read_at(&mut buf[..want], offset + done)?;
            // The file shrank: what is left reads as the hole the size leaves.
            if n == 0 {
                break;
            }
            out.write_all_at(&buf[..n], offset + done)?;
            done += n as u64;
        }
    }
    out.set_len(size)
}

/// Own `fd` as the layer's entry is owned, as this namespace sees it.
fn set_owner(fd: BorrowedFd<'_>, stat: &rustix::fs::Stat) -> io::Result<()> {
    match rustix::fs::fchown(
        fd,
        Some(rustix::fs::Uid::from_raw(stat.st_uid)),
        Some(rustix::fs::Gid::from_raw(stat.st_gid)),
    ) {
        // An owner this namespace does not map: the copy stays root's.
        Ok(()) | Err(Errno::INVAL) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The permission bits to copy: never setuid or setgid (the store strips them on disk
/// already; the root is `nosuid` as well).
fn mode_of(stat: &rustix::fs::Stat) -> Mode {
    Mode::from_raw_mode(stat.st_mode & 0o1777)
}

/// The entry's access and modification times. (The casts: `stat`'s field types differ
/// between architectures.)
#[allow(clippy::unnecessary_cast)]
fn times_of(stat: &rustix::fs::Stat) -> Timestamps {
    let at = |sec: i64, nsec: u64| Timespec {
        tv_sec: sec,
        tv_nsec: nsec as _,
    };
    Timestamps {
        last_access: at(stat.st_atime as i64, stat.st_atime_nsec as u64),
        last_modification: at(stat.st_mtime as i64, stat.st_mtime_nsec as u64),
    }
}

/// Remove the entry at `rel` beneath `root`, a directory with everything in it; nothing
/// there is no error. Iterative (a deep tree cannot exhaust the stack) and path-based from
/// `root` (no descriptor per level is held).
pub(super) fn remove_entry(root: BorrowedFd<'_>, rel: &[u8]) -> io::Result<()> {
    let mut stack = vec![rel.to_vec()];
    while let Some(path) = stack.last().cloned() {
        let (parent, name) = match path.iter().rposition(|&b| b == b'/') {
            Some(i) => (&path[..i], &path[i + 1..]),
            None => (&b""[..], path.as_slice()),
        };
        let dir = match open_beneath(root, parent, OFlags::PATH | OFlags::DIRECTORY) {
            Ok(dir) => dir,
            Err(Errno::NOENT | Errno::NOTDIR) => {
                stack.pop();
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        match rustix::fs::unlinkat(&dir, name, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => {
                stack.pop();
                continue;
            }
            Err(Errno::ISDIR) => {}
            Err(e) => return Err(e.into()),
        }
        match rustix::fs::unlinkat(&dir, name, AtFlags::REMOVEDIR) {
            Ok(()) | Err(Errno::NOENT) => {
                stack.pop();
            }
            Err(Errno::NOTEMPTY | Errno::EXIST) => {
                let full = open_beneath(root, &path, OFlags::RDONLY | OFlags::DIRECTORY)?;
                for child in list(full.as_fd())? {
                    stack.push(join(&path, &child));
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn open_beneath(root: BorrowedFd<'_>, rel: &[u8], flags: OFlags) -> rustix::io::Result<OwnedFd> {
    let rel: &[u8] = if rel.is_empty() { b"." } else { rel };
    rustix::fs::openat2(root, rel, flags | OFlags::CLOEXEC, Mode::empty(), RESOLVE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    /// A sparse file is copied as its data segments: the holes stay holes, the size and
    /// the bytes are the source's.
    #[test]
    fn a_sparse_file_is_copied_sparse() {
        use std::os::unix::fs::FileExt;
        let base = std::env::temp_dir().join(format!(
            "sandcove-sparse-copy-{}-{}",
            std::process::id(),
            crate::config::new_id()
        ));
        std::fs::create_dir_all(&base).unwrap();
        let (source, copy) = (base.join("source"), base.join("copy"));
        let file = std::fs::File::create(&source).unwrap();
        file.write_all_at(b"head", 0).unwrap();
        file.write_all_at(&[9u8; 4096], 512 << 20).unwrap();
        file.set_len(1 << 30).unwrap();
        let out = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&copy)
            .unwrap();
        copy_data(&std::fs::File::open(&source).unwrap(), &out, 1 << 30).unwrap();
        let meta = std::fs::metadata(&copy).unwrap();
        assert_eq!(meta.len(), 1 << 30);
        assert!(meta.blocks() * 512 < 1 << 20, "{} blocks", meta.blocks());
        let mut buf = [0u8; 4];
        out.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"head");
        out.read_exact_at(&mut buf, (512 << 20) + 4092).unwrap();
        assert_eq!(buf, [9u8; 4]);
        out.read_exact_at(&mut buf, (1 << 30) - 4).unwrap();
        assert_eq!(buf, [0u8; 4]);
        let _ = std::fs::remove_dir_all(&base);
    }

    /// Two layers copied as overlayfs stacks them: a whiteout deletes, an opaque directory
    /// hides the lower one's entries, a symlink is copied as text (never followed), a file
    /// replaces a lower directory, modes are kept without setuid.
    #[test]
    fn layers_copy_as_overlayfs_stacks_them() {
        let base = std::env::temp_dir().join(format!(
            "sandcove-image-copy-{}-{}",
            std::process::id(),
            crate::config::new_id()
        ));
        let (lower, upper, root) = (base.join("lower"), base.join("upper"), base.join("root"));
        for dir in ["data/sub", "opq", "was-dir/deep"] {
            std::fs::create_dir_all(lower.join(dir)).unwrap();
        }
        std::fs::create_dir_all(upper.join("opq")).unwrap();
        std::fs::create_dir_all(upper.join("data")).unwrap();
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(lower.join("data/keep"), "kept\n").unwrap();
        std::fs::write(lower.join("data/sub/gone"), "gone\n").unwrap();
        std::fs::write(lower.join("opq/old"), "old\n").unwrap();
        std::fs::write(lower.join("was-dir/deep/x"), "x\n").unwrap();
        std::fs::write(lower.join("tool"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(lower.join("tool"), std::fs::Permissions::from_mode(0o4755))
            .unwrap();
        std::os::unix::fs::symlink("/etc/passwd", lower.join("link")).unwrap();
        std::fs::write(upper.join("opq/new"), "new\n").unwrap();
        std::fs::write(upper.join("was-dir"), "a file now\n").unwrap();
        let status = std::process::Command::new("mknod")
            .arg(upper.join("data/sub"))
            .args(["c", "0", "0"])
            .status()
            .unwrap();
        assert!(status.success());
        rustix::fs::setxattr(
            upper.join("opq"),
            crate::agent::layer_tar::XATTR_OPAQUE,
            b"y",
            rustix::fs::XattrFlags::empty(),
        )
        .unwrap();
        let open = |p: &std::path::Path| {
            rustix::fs::open(p, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap()
        };
        let root_fd = open(&root);
        for layer in [&lower, &upper] {
            apply_layer(open(layer).as_fd(), root_fd.as_fd()).unwrap();
        }
        let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap();
        assert_eq!(read("data/keep"), "kept\n");
        assert!(!root.join("data/sub").exists(), "whited out");
        assert_eq!(read("opq/new"), "new\n");
        assert!(
            !root.join("opq/old").exists(),
            "hidden by the opaque directory"
        );
        assert_eq!(read("was-dir"), "a file now\n");
        let link = std::fs::symlink_metadata(root.join("link")).unwrap();
        assert!(link.is_symlink());
        assert_eq!(
            std::fs::read_link(root.join("link")).unwrap(),
            std::path::Path::new("/etc/passwd")
        );
        let tool = std::fs::metadata(root.join("tool")).unwrap();
        assert_eq!(tool.mode() & 0o7777, 0o755, "setuid never copied");
        remove_entry(root_fd.as_fd(), b"data").unwrap();
        assert!(!root.join("data").exists());
        std::fs::remove_dir_all(&base).unwrap();
    }
}
