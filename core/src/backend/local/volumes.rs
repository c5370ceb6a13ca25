//! Named persistent volumes: directories under the state directory, bound into sandboxes.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::config::{self, HostMount, Record, UidMapping};
use super::{sys, LocalBackend};
use crate::{now_millis, Error, Result, VolumeInfo, VolumeMount};

#[derive(Debug, Serialize, Deserialize)]
struct Meta {
    name: String,
    created_at: u64,
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

fn make_dir(backend: &LocalBackend, path: &Path) -> Result<()> {
    std::fs::DirBuilder::new()
        .mode(0o755)
        .create(path)
        .map_err(|e| Error::from_io(&e, &format!("volume directory {}", path.display())))?;
    if let Some((uid, gid)) = default_user_host_ids(backend) {
        std::os::unix::fs::chown(path, Some(uid), Some(gid))
            .map_err(|e| Error::from_io(&e, "volume owner"))?;
    }
    Ok(())
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
    Ok(VolumeInfo {
        name: meta.name,
        created_at: meta.created_at,
        size: size_of(&dir.join("data")),
    })
}

/// Create a volume.
pub fn create(backend: &LocalBackend, name: &str) -> Result<VolumeInfo> {
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
    make_dir(backend, &dir.join("data"))?;
    let meta = Meta {
        name: name.to_string(),
        created_at: now_millis(),
    };
    let text = serde_json::to_vec(&meta).map_err(|e| Error::backend(e.to_string()))?;
    std::fs::write(dir.join("meta.json"), text)
        .map_err(|e| Error::from_io(&e, "volume metadata"))?;
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
    let sandboxes = backend.state_dir().join("sandboxes");
    for sandbox in crate::Backend::list(backend, Default::default()).await? {
        let record = sandboxes.join(&sandbox.id).join("record.json");
        let Ok(text) = std::fs::read(record) else {
            continue;
        };
        let Ok(record) = serde_json::from_slice::<Record>(&text) else {
            continue;
        };
        if record.mounts.iter().any(|m| m.host_path.starts_with(&data)) {
            return Err(Error::InvalidState {
                id: sandbox.id,
                state: "running".into(),
                message: format!(
                    "it mounts volume {name:?}; destroy it before deleting the volume"
                ),
            });
        }
    }
    std::fs::remove_dir_all(&dir).map_err(|e| Error::from_io(&e, &format!("volume {name:?}")))
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
        let data = dir.join("data");
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
            open_source(&data, Some(sub), true, default_user_host_ids(backend))
                .map_err(|e| subpath_error(&m.volume, sub, e))?;
        }
        out.push(HostMount {
            host_path: data.to_string_lossy().into_owned(),
            subpath: m.subpath.clone(),
            path: m.path.clone(),
            read_only: m.read_only,
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
