//! Named persistent volumes under the state directory, mounted into sandboxes, each bounded
//! by a size quota the engine enforces.
//!
//! # How the quota is enforced
//!
//! A volume is an ext4 filesystem in an image file (`volumes/NAME/image`, sparse, its apparent
//! size the quota) served by `fuse2fs` (Debian package `fuse2fs`). The filesystem itself
//! refuses a write past its size with `ENOSPC`, and the image never takes more host disk than
//! its size. The alternatives were weighed for the product's default, rootless: a tmpfs holds
//! the data in memory and persists nothing; a loop device and project quotas need root; ext4
//! cannot be mounted in a user namespace. FUSE can, so one mechanism serves both modes.
//!
//! Sandboxes share a volume, and two `fuse2fs` on one image would corrupt it, so each volume
//! in use has one *holder* (see `volume_holder`): a re-executed process that runs `fuse2fs`
//! in a private mount namespace (rootless, in a user namespace of its own mapping only the
//! engine's uid) and hands each sandbox's monitor a detached copy of the mount
//! (`open_tree`), which the agent attaches in the sandbox (`move_mount`). Each monitor keeps
//! a connection to the holder for its sandbox's life; when the last one closes, the holder
//! unmounts and ends, and `fuse2fs` flushes and exits. An exclusive lock on the image, held
//! by the holder and inherited by `fuse2fs`, keeps a second holder from serving the image
//! until the first `fuse2fs` is gone.
//!
//! Access: rootless, every sandbox process runs as the engine's uid, the owner the FUSE mount
//! admits; as root, `fuse2fs` runs in the host's user namespace with
//! `allow_other,default_permissions`, so the kernel checks modes for each sandbox uid.
//!
//! Volumes made before quotas (a `data/` directory, no image) are mounted as before and stay
//! unbounded: [`VolumeInfo::size_limit`] is `None` for them. Recreate such a volume (and copy
//! its files over) to bound it.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::config::{self, HostMount, Record, UidMapping};
use super::{sys, LocalBackend};
use sandcove_core::{now_millis, Error, Result, VolumeInfo, VolumeMount};

#[derive(Debug, Serialize, Deserialize)]
struct Meta {
    name: String,
    created_at: u64,
    /// The quota in MiB; absent for a volume made before quotas (a plain `data/` directory).
    #[serde(default)]
    size_mib: Option<u64>,
}

/// The quota of a volume when the engine is given none
/// ([`LocalBackend::with_volume_size_mib`]).
pub const DEFAULT_VOLUME_SIZE_MIB: u64 = 1024;
/// The smallest quota: ext4's own metadata needs a few MiB.
pub const MIN_VOLUME_SIZE_MIB: u64 = 8;
/// The largest quota (1 TiB).
pub const MAX_VOLUME_SIZE_MIB: u64 = 1 << 20;

/// A volume's image file, its lock, the holder's socket and log, and the holder's mount point
/// (an empty directory on the host: the mount exists only in the holder's namespace).
pub(super) const IMAGE: &str = "image";
pub(super) const LOCK: &str = "lock";
pub(super) const SOCKET: &str = "holder.sock";
pub(super) const LOG: &str = "holder.log";
pub(super) const MOUNT_POINT: &str = "mnt";

/// System directories searched for the filesystem tools, in order (never `PATH`: a root
/// engine runs what it finds as root).
pub(super) const TOOL_DIRS: [&str; 6] = [
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
    "/usr/local/sbin",
    "/usr/local/bin",
];

/// The path of tool `name`, or why a quota cannot be enforced.
pub(super) fn tool(name: &str) -> Result<PathBuf> {
    TOOL_DIRS
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| quota_unavailable(&format!("{name} is not installed")))
}

/// A volume whose quota cannot be enforced here is refused, never made unbounded.
pub(super) fn quota_unavailable(reason: &str) -> Error {
    Error::Unavailable {
        reason: format!("cannot enforce a volume's size quota: {reason}"),
        remedy: "install e2fsprogs and fuse2fs (Debian: apt-get install e2fsprogs fuse2fs) and \
                 make /dev/fuse usable by the engine's user (mode 0666, the usual default)"
            .into(),
    }
}

/// Run a tool to completion, failing with (the start of) its stderr.
pub(super) fn run_tool(argv: &[&std::ffi::OsStr]) -> std::result::Result<(), String> {
    let out = std::process::Command::new(argv[0])
        .args(&argv[1..])
        .env_clear()
        .env("PATH", TOOL_DIRS.join(":"))
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("{}: {e}", Path::new(argv[0]).display()))?;
    if out.status.success() {
        return Ok(());
    }
    let mut text = String::from_utf8_lossy(&out.stderr).into_owned();
    text.truncate(2000);
    Err(format!(
        "{} failed ({}): {}",
        Path::new(argv[0]).display(),
        out.status,
        text.trim()
    ))
}

/// Make the ext4 image of a new volume: sparse, `size_mib` large, no journal (`fuse2fs`
/// replays none), nothing reserved for root, the top directory owned by `owner` (ids as the
/// holder sees them) and empty (no `lost+found`).
fn make_image(image: &Path, size_mib: u64, owner: (u32, u32)) -> Result<()> {
    let mkfs = tool("mke2fs")?;
    let debugfs = tool("debugfs")?;
    tool("fuse2fs")?;
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        return Err(quota_unavailable(&format!("/dev/fuse: {e}")));
    }
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(image)
        .map_err(|e| Error::from_io(&e, "volume image"))?;
    file.set_len(size_mib << 20)
        .map_err(|e| Error::from_io(&e, "volume image"))?;
    drop(file);
    let options = format!(
        "root_owner={}:{},lazy_itable_init=1,nodiscard",
        owner.0, owner.1
    );
    let failed = |e: String| Error::backend(format!("make the volume's filesystem: {e}"));
    let argv: [&std::ffi::OsStr; 12] = [
        mkfs.as_os_str(),
        "-q".as_ref(),
        "-F".as_ref(),
        "-t".as_ref(),
        "ext4".as_ref(),
        "-O".as_ref(),
        "^has_journal".as_ref(),
        "-m".as_ref(),
        "0".as_ref(),
        "-E".as_ref(),
        options.as_ref(),
        image.as_os_str(),
    ];
    run_tool(&argv).map_err(failed)?;
    let argv: [&std::ffi::OsStr; 5] = [
        debugfs.as_os_str(),
        "-w".as_ref(),
        "-R".as_ref(),
        "rmdir lost+found".as_ref(),
        image.as_os_str(),
    ];
    run_tool(&argv).map_err(failed)
}

/// The top directory's owner in a new volume's image, as the holder sees ids: the default
/// sandbox user's host ids as root; rootless, the holder's own root, which is the engine's
/// uid (and so every sandbox's).
fn image_owner(backend: &LocalBackend) -> (u32, u32) {
    default_user_host_ids(backend).unwrap_or((0, 0))
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && !name.starts_with('.')
}

fn dir_of(backend: &LocalBackend, name: &str) -> Result<PathBuf> {
    if !valid_name(name) {
        return Err(Error::invalid(format!(
            "volume name {name:?} must be 1-63 letters, digits, '-', '_' or '.', not starting with '.'"
        )));
    }
    Ok(backend.state_dir().join("volumes").join(name))
}

/// Host owner of files the default sandbox user writes: volumes are made writable for it.
fn default_user_host_ids(backend: &LocalBackend) -> Option<(u32, u32)> {
    match backend.mapping {
        UidMapping::Range => {
            let id = config::HOST_ID_BASE + config::DEFAULT_USER_UID;
            Some((id, id))
        }
        UidMapping::Single { .. } => None,
    }
}

/// Open the directory a volume mount binds: `data_dir` itself (a directory only the host
/// controls), or `subpath` beneath it, so that no symlink, `..` or mount a sandbox planted in
/// the volume is ever followed (see [`dirs_beneath`]). The result is an `O_PATH` descriptor
/// for `mount(2)` through `/proc/self/fd`.
pub(super) fn open_source(
    data_dir: &Path,
    subpath: Option<&str>,
    create: bool,
    owner: Option<(u32, u32)>,
) -> std::io::Result<OwnedFd> {
    let dir = sys::open_dir_path(data_dir)?;
    match subpath {
        None => Ok(dir),
        Some(sub) => dirs_beneath(dir.as_fd(), Path::new(sub), create, owner, true),
    }
}

/// Walk `rel` from the directory `dir` one component at a time with `openat2`
/// (`RESOLVE_BENEATH`, no symlinks, no magic links; with `same_fs`, no other mounts), making
/// missing directories (mode 0755) when `create` and giving them to `owner` through their
/// descriptors. Returns an `O_PATH` descriptor of the last directory.
pub(super) fn dirs_beneath(
    dir: std::os::fd::BorrowedFd<'_>,
    rel: &Path,
    create: bool,
    owner: Option<(u32, u32)>,
    same_fs: bool,
) -> std::io::Result<OwnedFd> {
    let flags = libc::O_PATH | libc::O_DIRECTORY;
    let mut current = sys::open_beneath(dir, Path::new("."), flags, same_fs)?;
    for component in rel.iter() {
        let name = Path::new(component);
        if name == Path::new("/") || name == Path::new(".") {
            continue;
        }
        let at = current.as_fd();
        let next = match sys::open_beneath(at, name, flags, same_fs) {
            Err(e) if create && e.raw_os_error() == Some(libc::ENOENT) => {
                match sys::mkdir_at(at, name.as_os_str(), 0o755) {
                    Err(e) if e.raw_os_error() != Some(libc::EEXIST) => return Err(e),
                    _ => {}
                }
                let made = sys::open_beneath(at, name, flags, same_fs)?;
                if let Some((uid, gid)) = owner {
                    sys::chown_fd(made.as_fd(), uid, gid)?;
                }
                made
            }
            other => other?,
        };
        current = next;
    }
    Ok(current)
}

/// Bytes of regular files in a volume. Sandboxes write its contents, so every directory is
/// entered through a descriptor opened beneath its parent with no symlinks: a directory
/// swapped for a link to a host tree is skipped, never walked. Depth-first, one descriptor per
/// level, at most `MAX_DEPTH` levels and `MAX_ENTRIES` entries (a bound, not an exact count).
fn size_of(dir: &Path) -> u64 {
    let Ok(root) = sys::open_dir_path(dir) else {
        return 0;
    };
    let mut budget = MAX_ENTRIES;
    size_beneath(root.as_fd(), Path::new("."), 0, &mut budget)
}

const MAX_DEPTH: usize = 256;
const MAX_ENTRIES: usize = 1_000_000;

fn size_beneath(
    parent: std::os::fd::BorrowedFd<'_>,
    name: &Path,
    depth: usize,
    budget: &mut usize,
) -> u64 {
    let flags = libc::O_RDONLY | libc::O_DIRECTORY;
    let Ok(dir) = sys::open_beneath(parent, name, flags, true) else {
        return 0;
    };
    let Ok(entries) = std::fs::read_dir(sys::fd_path(dir.as_raw_fd())) else {
        return 0;
    };
    let mut total = 0;
    for e in entries.flatten() {
        if *budget == 0 {
            break;
        }
        *budget -= 1;
        // `DirEntry::metadata` does not follow symlinks.
        match e.metadata() {
            Ok(m) if m.is_dir() && depth < MAX_DEPTH => {
                total += size_beneath(dir.as_fd(), Path::new(&e.file_name()), depth + 1, budget)
            }
            Ok(m) if m.is_file() => total += m.len(),
            _ => {}
        }
    }
    total
}

fn info_of(dir: &Path) -> Result<VolumeInfo> {
    let text = std::fs::read(dir.join("meta.json")).map_err(|e| {
        Error::from_io(
            &e,
            &format!("volume {:?}", dir.file_name().unwrap_or_default()),
        )
    })?;
    let meta: Meta = serde_json::from_slice(&text)
        .map_err(|e| Error::backend(format!("volume metadata: {e}")))?;
    // A bounded volume's size is the host disk its image takes (no holder may be running);
    // a legacy one's, the bytes of its files.
    let size = match meta.size_mib {
        Some(_) => std::fs::metadata(dir.join(IMAGE))
            .map(|m| std::os::unix::fs::MetadataExt::blocks(&m) * 512)
            .unwrap_or(0),
        None => size_of(&dir.join("data")),
    };
    Ok(VolumeInfo {
        name: meta.name,
        created_at: meta.created_at,
        size,
        size_limit: meta.size_mib.map(|m| m << 20),
    })
}

/// Create a volume of `size_mib` MiB (its quota). Without the tools to enforce it, nothing
/// is made and the error is [`Error::Unavailable`] with the remedy.
pub fn create(backend: &LocalBackend, name: &str, size_mib: u64) -> Result<VolumeInfo> {
    let dir = dir_of(backend, name)?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(backend.state_dir().join("volumes"))
        .map_err(|e| Error::from_io(&e, "volumes directory"))?;
    match std::fs::DirBuilder::new().mode(0o755).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(Error::AlreadyExists {
                what: format!("volume {name:?}"),
            })
        }
        Err(e) => return Err(Error::from_io(&e, "volume directory")),
    }
    let made = (|| {
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(dir.join(MOUNT_POINT))
            .map_err(|e| Error::from_io(&e, "volume directory"))?;
        make_image(&dir.join(IMAGE), size_mib, image_owner(backend))?;
        let meta = Meta {
            name: name.to_string(),
            created_at: now_millis(),
            size_mib: Some(size_mib),
        };
        let text = serde_json::to_vec(&meta).map_err(|e| Error::backend(e.to_string()))?;
        std::fs::write(dir.join("meta.json"), text)
            .map_err(|e| Error::from_io(&e, "volume metadata"))
    })();
    if let Err(e) = made {
        // Nothing half-made stays behind (no sandbox has seen this directory).
        let _ = std::fs::remove_dir_all(&dir);
        return Err(e);
    }
    info_of(&dir)
}

/// Describe a volume.
pub fn get(backend: &LocalBackend, name: &str) -> Result<VolumeInfo> {
    let dir = dir_of(backend, name).map_err(|_| Error::not_found(format!("volume {name:?}")))?;
    if !dir.join("meta.json").exists() {
        return Err(Error::not_found(format!("volume {name:?}")));
    }
    info_of(&dir)
}

/// All volumes, by name.
pub fn list(backend: &LocalBackend) -> Result<Vec<VolumeInfo>> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(backend.state_dir().join("volumes")) {
        for e in entries.flatten() {
            if let Ok(info) = info_of(&e.path()) {
                out.push(info);
            }
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Delete a volume that no live sandbox mounts.
pub async fn delete(backend: &LocalBackend, name: &str) -> Result<()> {
    let dir = dir_of(backend, name).map_err(|_| Error::not_found(format!("volume {name:?}")))?;
    if !dir.join("meta.json").exists() {
        return Err(Error::not_found(format!("volume {name:?}")));
    }
    let data = dir.join("data").to_string_lossy().into_owned();
    let whole = dir.to_string_lossy().into_owned();
    let sandboxes = backend.state_dir().join("sandboxes");
    for sandbox in sandcove_core::Backend::list(backend, Default::default()).await? {
        let record = sandboxes.join(&sandbox.id).join("record.json");
        let Ok(text) = std::fs::read(record) else {
            continue;
        };
        let Ok(record) = serde_json::from_slice::<Record>(&text) else {
            continue;
        };
        if record
            .mounts
            .iter()
            .any(|m| m.host_path.starts_with(&data) || (m.bounded && m.host_path == whole))
        {
            return Err(Error::InvalidState {
                id: sandbox.id,
                state: "running".into(),
                message: format!(
                    "it mounts volume {name:?}; destroy it before deleting the volume"
                ),
            });
        }
    }
    // A holder still serving the volume keeps it: one whose last sandbox was just destroyed
    // stops as soon as that sandbox's monitor has exited (waited for, bounded); one serving
    // a sandbox being made with the volume does not.
    let deadline = std::time::Instant::now() + HOLDER_STOP_WAIT;
    loop {
        let lock = open_lock(&dir)?;
        let locked =
            sys::try_lock_exclusive(&lock).map_err(|e| Error::from_io(&e, "volume lock"))?;
        if locked && std::os::unix::net::UnixStream::connect(dir.join(SOCKET)).is_err() {
            return std::fs::remove_dir_all(&dir)
                .map_err(|e| Error::from_io(&e, &format!("volume {name:?}")));
        }
        drop(lock);
        if std::time::Instant::now() > deadline {
            return Err(Error::InvalidState {
                id: name.to_string(),
                state: "in use".into(),
                message: format!("a sandbox is mounting volume {name:?}; destroy it first"),
            });
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// How long deleting a volume waits for its holder to stop.
const HOLDER_STOP_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Open (making it) the lock serialising a volume's holder start, stop and deletion.
pub(super) fn open_lock(dir: &Path) -> Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(dir.join(LOCK))
        .map_err(|e| Error::from_io(&e, "volume lock"))
}

/// Resolve a sandbox's volume mounts to host directories (creating subpaths).
pub fn mounts_for(backend: &LocalBackend, mounts: &[VolumeMount]) -> Result<Vec<HostMount>> {
    let mut out = Vec::new();
    for m in mounts {
        let dir = dir_of(backend, &m.volume)?;
        if !dir.join("meta.json").exists() {
            return Err(Error::not_found(format!("volume {:?}", m.volume)));
        }
        let target = Path::new(&m.path);
        let reserved = [
            "/proc", "/dev", "/usr", "/etc", "/bin", "/sbin", "/lib", "/lib64",
        ];
        if !target.is_absolute()
            || m.path.split('/').any(|c| c == "..")
            || target == Path::new("/")
            || reserved.iter().any(|r| target.starts_with(r))
        {
            return Err(Error::invalid(format!(
                "volume mount path {:?} must be absolute, outside the system directories",
                m.path
            )));
        }
        let text = std::fs::read(dir.join("meta.json"))
            .map_err(|e| Error::from_io(&e, &format!("volume {:?}", m.volume)))?;
        let meta: Meta = serde_json::from_slice(&text)
            .map_err(|e| Error::backend(format!("volume metadata: {e}")))?;
        let bounded = meta.size_mib.is_some();
        let data = if bounded {
            dir.clone()
        } else {
            tracing::warn!(
                "volume {:?} predates size quotas: mounted unbounded (recreate it to bound it)",
                m.volume
            );
            dir.join("data")
        };
        if let Some(sub) = &m.subpath {
            if Path::new(sub).is_absolute()
                || sub.split('/').any(|c| c == "..")
                || sub.contains('\0')
                || sub.split('/').all(|c| c.is_empty() || c == ".")
            {
                return Err(Error::invalid(format!(
                    "volume subpath {sub:?} must be relative and stay inside the volume"
                )));
            }
            // Create it now, as the host user; the monitor and agent resolve it again the same
            // way and never create anything in a volume.
            // (A bounded volume's holder makes it, beneath the mount only it sees.)
            if !bounded {
                open_source(&data, Some(sub), true, default_user_host_ids(backend))
                    .map_err(|e| subpath_error(&m.volume, sub, e))?;
            }
        }
        out.push(HostMount {
            host_path: data.to_string_lossy().into_owned(),
            subpath: m.subpath.clone(),
            path: m.path.clone(),
            read_only: m.read_only,
            bounded,
        });
    }
    Ok(out)
}

/// The error for a subpath that cannot be resolved inside its volume.
pub(super) fn subpath_error(volume: &str, sub: &str, e: std::io::Error) -> Error {
    match e.raw_os_error() {
        Some(libc::ELOOP | libc::EXDEV | libc::ENOTDIR) => Error::invalid(format!(
            "volume {volume:?} subpath {sub:?} is not a plain directory inside the volume \
             (a symlink or a file is in the way)"
        )),
        _ => Error::from_io(&e, &format!("volume {volume:?} subpath {sub:?}")),
    }
}
