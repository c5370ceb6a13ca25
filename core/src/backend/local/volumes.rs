//! Named persistent volumes: directories under the state directory, bound into sandboxes.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::config::{self, HostMount, Record, UidMapping};
use super::LocalBackend;
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
        .recursive(true)
        .mode(0o755)
        .create(path)
        .map_err(|e| Error::from_io(&e, &format!("volume directory {}", path.display())))?;
    if let Some((uid, gid)) = default_user_host_ids(backend) {
        std::os::unix::fs::chown(path, Some(uid), Some(gid))
            .map_err(|e| Error::from_io(&e, "volume owner"))?;
    }
    Ok(())
}

fn size_of(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => stack.push(e.path()),
                Ok(m) => total += m.len(),
                Err(_) => {}
            }
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
        let mut host = dir.join("data");
        if let Some(sub) = &m.subpath {
            let sub_path = Path::new(sub);
            if sub_path.is_absolute() || sub.split('/').any(|c| c == "..") || sub.contains('\0') {
                return Err(Error::invalid(format!(
                    "volume subpath {sub:?} must be relative and stay inside the volume"
                )));
            }
            host = host.join(sub_path);
            make_dir(backend, &host)?;
        }
        out.push(HostMount {
            host_path: host.to_string_lossy().into_owned(),
            path: m.path.clone(),
            read_only: m.read_only,
        });
    }
    Ok(out)
}
