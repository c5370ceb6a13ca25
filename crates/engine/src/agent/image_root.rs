//! An image sandbox's root: the image's layers under a writable layer, shaped for the engine.
//!
//! Every step here runs before the agent pivots into the root, so the host's tree is still
//! what an absolute symlink names: the image's paths are reached beneath the merged root's
//! descriptor with no symlinks and no magic links followed, and a path the engine needs that
//! the image holds as something else (a symlink, a file) is replaced in the sandbox's own
//! writable layer (the image's layers are never written).

use super::*;
use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd};

/// The largest `/etc/passwd` or `/etc/group` of an image the engine reads to add its users.
const MAX_USER_DATABASE: u64 = 1 << 20;

/// The image's layer directories, opened while the agent still holds the engine's host
/// credentials (the store may be closed to the sandbox's root); top layer first, as overlayfs
/// stacks `lowerdir`s.
pub(super) fn open_layers(image: &crate::images::ImageRoot) -> Result<Vec<OwnedFd>> {
    image
        .layers
        .iter()
        .rev()
        .map(|dir| {
            sys::open_dir_path(dir).map_err(|e| Error::Unavailable {
                reason: format!(
                    "image {} is missing a layer ({}): {e}",
                    image.reference,
                    dir.display()
                ),
                remedy: "pull or import the image again".into(),
            })
        })
        .collect()
}

/// An image sandbox's root as setup made it.
pub(super) struct ImageRootMade {
    /// The root's path (a mount point, for the pivot).
    pub(super) root: PathBuf,
    /// What its snapshots archive (`O_PATH`, opened before anything was mounted in the root):
    /// overlayfs's upper directory, or the whole root where [`ImageRootMade::whole_root`].
    pub(super) writable: OwnedFd,
    /// The root is a copy, not an overlay: a snapshot holds all of it.
    pub(super) whole_root: bool,
}

/// Compose the image's root under `tmp` (the sandbox's root tmpfs, which holds the writable
/// layer, so the disk limit bounds what the sandbox writes): overlayfs where the record's
/// mode allows and the mount succeeds, else the layers copied (see [`super::image_copy`]).
/// `layers` come from [`open_layers`] (top first); `restore` is a snapshot's archive,
/// unpacked into the writable layer first (a whole root's snapshot is that root as it is).
pub(super) fn mount(
    tmp: &Path,
    layers: &[OwnedFd],
    restore: Option<std::fs::File>,
    record: &Record,
) -> Result<ImageRootMade> {
    use crate::images::ImageRootMode;
    let step = |what: &str| {
        let what = what.to_string();
        move |e: std::io::Error| super::setup::unavailable(&what, e)
    };
    std::fs::create_dir(tmp.join("upper")).map_err(step("make the image's writable layer"))?;
    let upper = sys::open_dir_path(&tmp.join("upper")).map_err(step("open the writable layer"))?;
    let mut whole_root = false;
    if let Some(archive) = restore {
        let (archive, whole) = whole_root_archive(archive)
            .map_err(|e| Error::from_io(&e, "read the snapshot's archive"))?;
        whole_root = whole;
        restore_layer(upper.as_fd(), archive, record)?;
    }
    if whole_root {
        // The snapshot of a copied root: its files are the whole root, nothing under them.
        return bind_as_root(tmp, "upper", upper);
    }
    let mode = record.image_root_mode;
    if mode != ImageRootMode::Copy {
        match mount_overlay(tmp, layers) {
            Ok(root) => {
                return Ok(ImageRootMade {
                    root,
                    writable: upper,
                    whole_root: false,
                })
            }
            Err(e) if mode == ImageRootMode::Overlay => return Err(e),
            // Auto: this host's kernel or policy refuses it; the copy needs neither.
            Err(_) => {}
        }
    }
    copy_layers(tmp, layers, upper, record)
}

/// overlayfs on `tmp/root`: the layers under `tmp/upper`.
fn mount_overlay(tmp: &Path, layers: &[OwnedFd]) -> Result<PathBuf> {
    for dir in ["work", "root"] {
        match std::fs::create_dir(tmp.join(dir)) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                return Err(super::setup::unavailable(
                    "make the image's writable layer",
                    e,
                ))
            }
            _ => {}
        }
    }
    // Each lower layer through our own descriptor (`/proc/self/fd/N`): overlayfs resolves the
    // magic link to exactly the directory opened above, whatever the store's path names now.
    let lower = layers
        .iter()
        .map(|fd| sys::fd_path(fd.as_raw_fd()).to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(":");
    let root = tmp.join("root");
    let options = format!(
        "userxattr,lowerdir={lower},upperdir={},workdir={}",
        tmp.join("upper").display(),
        tmp.join("work").display()
    );
    sys::mount(
        Some(Path::new("overlay")),
        &root,
        Some("overlay"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some(&options),
    )
    .map_err(|e| Error::Unavailable {
        reason: format!("cannot mount the image's layers (overlayfs): {e}"),
        remedy: format!(
            "run on Linux 5.11 or later with overlayfs (mounted in user namespaces with \
             userxattr), or let the engine copy the layers ({}=copy or auto), or create the \
             sandbox on the host base",
            crate::images::IMAGE_ROOT_ENV
        ),
    })?;
    Ok(root)
}

/// The layers copied, lowest first, into `tmp/copy`, then the restored writable layer
/// `upper` (a snapshot's changes) over them; `upper` is removed after.
fn copy_layers(
    tmp: &Path,
    layers: &[OwnedFd],
    upper: OwnedFd,
    record: &Record,
) -> Result<ImageRootMade> {
    let reference = record
        .image
        .as_ref()
        .map(|image| image.reference.as_str())
        .unwrap_or_default();
    let disk_mib = record.disk_mib();
    let failed = |e: std::io::Error| match e.raw_os_error() {
        Some(libc::ENOSPC | libc::EDQUOT) => Error::invalid(format!(
            "image {reference} does not fit the sandbox's disk ({disk_mib} MiB) as a copied \
             root (this host runs images by copying their layers): create it with a larger \
             disk (resources.disk_mib)"
        )),
        _ => super::setup::unavailable("copy the image's layers", e),
    };
    std::fs::create_dir(tmp.join("copy")).map_err(failed)?;
    let copy = sys::open_dir_path(&tmp.join("copy")).map_err(failed)?;
    for layer in layers.iter().rev().chain(std::iter::once(&upper)) {
        super::image_copy::apply_layer(layer.as_fd(), copy.as_fd()).map_err(failed)?;
    }
    let tmp_fd = sys::open_dir_path(tmp).map_err(failed)?;
    super::image_copy::remove_entry(tmp_fd.as_fd(), b"upper").map_err(failed)?;
    drop(upper);
    bind_as_root(tmp, "copy", copy)
}

/// `tmp/name` bound onto itself (the pivot needs a mount point), `dir` (opened before: it
/// sees none of the mounts setup makes in the root) kept for snapshots.
fn bind_as_root(tmp: &Path, name: &str, dir: OwnedFd) -> Result<ImageRootMade> {
    let root = tmp.join(name);
    sys::mount(
        Some(&root),
        &root,
        None,
        libc::MS_BIND | libc::MS_NOSUID | libc::MS_NODEV,
        None,
    )
    .map_err(|e| super::setup::unavailable("bind the image's copied root", e))?;
    Ok(ImageRootMade {
        root,
        writable: dir,
        whole_root: true,
    })
}

/// Whether `archive` is a whole root's snapshot (its first entry the root's opaque marker,
/// as [`super::layer_tar::write_layer`] writes one), with the archive to unpack: past that
/// marker (the root needs no mark), or from its start.
fn whole_root_archive(mut archive: std::fs::File) -> std::io::Result<(std::fs::File, bool)> {
    use std::io::Seek;
    let mut block = [0u8; 512];
    let whole = match archive.read_exact(&mut block) {
        Ok(()) => super::layer_tar::is_root_marker(&block),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => false,
        Err(e) => return Err(e),
    };
    if !whole {
        archive.rewind()?;
    }
    Ok((archive, whole))
}

/// Unpack a snapshot's archive (an OCI layer tar a sandbox's files made, so hostile input)
/// into the writable layer `upper`, before the overlay is mounted on it: with the image
/// store's unpacker (entries beneath the layer only, no symlink followed, no device node,
/// `.wh.` entries as whiteouts), bounded as the snapshot was (its bytes by the archive bound
/// of the sandbox's disk, its entries by the root's inodes; the tmpfs bounds what lands).
/// Owners are the archive's where the sandbox's user namespace maps them.
fn restore_layer(upper: BorrowedFd<'_>, archive: impl Read, record: &Record) -> Result<()> {
    let dir = sys::open_beneath(
        upper,
        Path::new("."),
        libc::O_RDONLY | libc::O_DIRECTORY,
        false,
    )
    .map_err(|e| super::setup::unavailable("open the writable layer", e))?;
    let disk_mib = record.disk_mib();
    let limits = sandcove_image::UnpackLimits {
        max_bytes: crate::snapshots::snapshot_limit(disk_mib),
        max_entries: record.bounds.inodes_for(disk_mib),
        owner: match record.mapping {
            // Ids as they are: the namespace maps 0..HOST_ID_COUNT (nobody among them).
            crate::config::UidMapping::Range => sandcove_image::OwnerMap::Shift {
                base: 0,
                count: crate::config::HOST_ID_COUNT,
            },
            // One id: everything is its; other owners are recorded, as an image's are.
            crate::config::UidMapping::Single { .. } => sandcove_image::OwnerMap::Caller,
        },
    };
    let reader = std::io::BufReader::with_capacity(1 << 16, archive);
    sandcove_image::unpack_archive(dir.as_fd(), reader, &limits, "the snapshot's archive")
        .map(|_| ())
        .map_err(|e| match e {
            e @ (sandcove_image::ImageError::HostileLayer { .. }
            | sandcove_image::ImageError::Malformed { .. }
            | sandcove_image::ImageError::TooLarge { .. }) => {
                Error::invalid(format!("the snapshot cannot be restored: {e}"))
            }
            other => Error::Unavailable {
                reason: format!("cannot restore the snapshot's files: {other}"),
                remedy: "check the sandbox's disk size (the snapshot's files must fit it)".into(),
            },
        })
}

/// Shape the merged root for the engine: the directories every sandbox has, the users' homes,
/// and the engine's `/etc` files (the users added to the image's databases).
pub(super) fn prepare(
    root: &Path,
    record: &Record,
    hostname: &str,
    resolv_conf: Option<&[u8]>,
) -> Result<()> {
    let root_fd = sys::open_dir_path(root)
        .map_err(|e| super::setup::unavailable("open the image root", e))?;
    let root_fd = root_fd.as_fd();
    let shown = |path: &str| {
        let path = path.to_string();
        move |e: std::io::Error| {
            Error::invalid(format!(
                "the image's {path} cannot be made a directory of the sandbox: {e}"
            ))
        }
    };
    // The engine's own mount points and directories: made where missing, replaced where the
    // image holds something other than a directory there.
    for (dir, mode) in [
        ("proc", 0o555),
        ("dev", 0o755),
        ("tmp", 0o1777),
        ("var/tmp", 0o1777),
        ("run", 0o755),
        ("root", 0o700),
        ("home", 0o755),
        ("mnt", 0o755),
        ("srv", 0o755),
        ("workspace", 0o755),
        ("etc", 0o755),
        (".sandcove", 0o755),
    ] {
        let fd = own_dir(root_fd, Path::new(dir)).map_err(shown(dir))?;
        if matches!(dir, "tmp" | "var/tmp" | "root") {
            sys::chmod_fd_path(fd.as_raw_fd(), mode).map_err(shown(dir))?;
        }
    }
    for user in &record.users {
        let home = user.home.trim_start_matches('/');
        let fd = own_dir(root_fd, Path::new(home)).map_err(shown(&user.home))?;
        sys::chown_fd(fd.as_fd(), user.uid, user.gid).map_err(shown(&user.home))?;
    }
    let etc = sys::open_beneath(
        root_fd,
        Path::new("etc"),
        libc::O_RDONLY | libc::O_DIRECTORY,
        false,
    )
    .map_err(shown("/etc"))?;
    let has_bash = sys::open_beneath(root_fd, Path::new("bin/bash"), libc::O_PATH, false).is_ok()
        || sys::open_beneath(root_fd, Path::new("usr/bin/bash"), libc::O_PATH, false).is_ok();
    let shell = if has_bash { "/bin/bash" } else { "/bin/sh" };
    let passwd = merge_database(
        &read_small(etc.as_fd(), "passwd"),
        &record
            .passwd()
            .replace(":/bin/bash\n", &format!(":{shell}\n")),
    );
    let group = merge_database(&read_small(etc.as_fd(), "group"), &record.group());
    let mut files: Vec<(&str, Vec<u8>)> = vec![
        ("passwd", passwd.into_bytes()),
        ("group", group.into_bytes()),
        ("hostname", format!("{hostname}\n").into_bytes()),
        (
            "hosts",
            format!("127.0.0.1 localhost {hostname}\n::1 localhost ip6-localhost\n").into_bytes(),
        ),
    ];
    if let Some(resolv) = resolv_conf {
        files.push(("resolv.conf", resolv.to_vec()));
    }
    for (name, contents) in files {
        replace_file(etc.as_fd(), OsStr::new(name), &contents)
            .map_err(|e| Error::invalid(format!("cannot write the image's /etc/{name}: {e}")))?;
    }
    Ok(())
}

/// The directory `rel` beneath `root`, each component made where missing and replaced where
/// the image has a non-directory (in the writable layer: a whiteout hides the image's entry).
fn own_dir(root: BorrowedFd<'_>, rel: &Path) -> std::io::Result<OwnedFd> {
    let flags = libc::O_PATH | libc::O_DIRECTORY;
    let mut current = sys::open_beneath(root, Path::new("."), flags, false)?;
    for component in rel.iter() {
        let name = component;
        let at = current.as_fd();
        let next = match sys::open_beneath(at, Path::new(name), flags, false) {
            Ok(fd) => fd,
            Err(e) => {
                match e.raw_os_error() {
                    Some(libc::ENOENT) => {}
                    // A symlink (ELOOP), a file (ENOTDIR): the image's entry gives way.
                    Some(libc::ELOOP | libc::ENOTDIR) => {
                        sys::unlink_at(at, name, false)?;
                    }
                    _ => return Err(e),
                }
                match sys::mkdir_at(at, name, 0o755) {
                    Err(e) if e.raw_os_error() != Some(libc::EEXIST) => return Err(e),
                    _ => {}
                }
                sys::open_beneath(at, Path::new(name), flags, false)?
            }
        };
        current = next;
    }
    Ok(current)
}

/// A small file of the image's `/etc`, or empty when it is missing, not a regular file, a
/// symlink, or too large (the engine's users are then the whole database).
fn read_small(etc: BorrowedFd<'_>, name: &str) -> String {
    let Ok(fd) = sys::open_beneath(etc, Path::new(name), libc::O_RDONLY, false) else {
        return String::new();
    };
    match sys::fstat(fd.as_fd()) {
        Ok(st) if (st.st_mode & libc::S_IFMT) == libc::S_IFREG => {}
        _ => return String::new(),
    }
    let mut text = Vec::new();
    let file = std::fs::File::from(fd);
    if file
        .take(MAX_USER_DATABASE + 1)
        .read_to_end(&mut text)
        .is_err()
        || text.len() as u64 > MAX_USER_DATABASE
    {
        return String::new();
    }
    String::from_utf8(text).unwrap_or_default()
}

/// `image`'s lines with `ours` in place of any line of the same name (the first field), ours
/// last.
fn merge_database(image: &str, ours: &str) -> String {
    let name = |line: &str| line.split(':').next().unwrap_or_default().to_string();
    let our_names: Vec<String> = ours.lines().map(name).collect();
    let mut out = String::new();
    for line in image.lines() {
        if line.trim().is_empty() || our_names.contains(&name(line)) {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out.push_str(ours);
    out
}

/// Replace `name` in `dir` with a new regular file holding `contents` (mode 0644): whatever
/// was there (a symlink included) is unlinked first, and the file is made with `O_EXCL`.
fn replace_file(dir: BorrowedFd<'_>, name: &OsStr, contents: &[u8]) -> std::io::Result<()> {
    match sys::unlink_at(dir, name, false) {
        Err(e) if e.raw_os_error() == Some(libc::EISDIR) => sys::unlink_at(dir, name, true)?,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
        other => other?,
    }
    let fd = sys::openat2(
        dir,
        Path::new(name),
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
        0o644,
        crate::sys::RESOLVE_BENEATH | crate::sys::RESOLVE_NO_SYMLINKS,
    )?;
    let mut file = std::fs::File::from(fd);
    std::io::Write::write_all(&mut file, contents)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::merge_database;

    #[test]
    fn our_users_replace_the_image_lines_of_their_names() {
        let image = "root:x:0:0:root:/root:/bin/sh\nuser:x:1:1::/x:/bin/false\nnode:x:1000:1000::/home/node:/bin/sh\n";
        let ours = "user:x:1000:1000::/home/user:/bin/bash\n";
        assert_eq!(
            merge_database(image, ours),
            "root:x:0:0:root:/root:/bin/sh\nnode:x:1000:1000::/home/node:/bin/sh\nuser:x:1000:1000::/home/user:/bin/bash\n"
        );
        assert_eq!(merge_database("", ours), ours);
    }
}
