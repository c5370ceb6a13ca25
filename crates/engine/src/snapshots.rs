//! Snapshots: where their archives and metadata live, capturing a paused sandbox's filesystem into
//! one (bounded by its disk size), restoring one into a fresh sandbox, and the outcome of a
//! snapshot or fork whose source then failed to resume.
//!
//! A host-base sandbox's snapshot is a tar of its root tmpfs (the host's directories left
//! out). An image sandbox's is its writable layer only, as an OCI layer tar, with the image
//! it runs recorded in the metadata ([`SnapshotImage`]) and held in the image store by the
//! snapshot's id (released when the snapshot is deleted), so neither `image rm` nor `prune`
//! takes it away; a sandbox created from it runs that image with the archive unpacked into
//! its writable layer at setup.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use futures::StreamExt;
use sandcove_core::{now_millis, Error, Result, SandboxInfo, SnapshotInfo};
use serde::{Deserialize, Serialize};

use crate::{config, proto, LocalBackend};

/// The image an image sandbox's snapshot was taken from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SnapshotImage {
    /// The reference its sandbox was created with.
    pub(crate) reference: String,
    /// The image's manifest digest.
    pub(crate) digest: String,
}

/// A snapshot's metadata file: what the API shows, and the image (none for the host base).
#[derive(Serialize, Deserialize)]
struct SnapshotMeta {
    #[serde(flatten)]
    info: SnapshotInfo,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    image: Option<SnapshotImage>,
}

impl LocalBackend {
    pub(crate) fn snapshots_dir(&self) -> PathBuf {
        self.state_dir.join("snapshots")
    }

    /// `(metadata, archive)` paths of a snapshot id.
    pub(crate) fn snapshot_paths(&self, snapshot_id: &str) -> Result<(PathBuf, PathBuf)> {
        if !config::valid_id(snapshot_id) {
            return Err(Error::not_found(format!("snapshot {snapshot_id:?}")));
        }
        let dir = self.snapshots_dir();
        Ok((
            dir.join(format!("{snapshot_id}.json")),
            dir.join(format!("{snapshot_id}.tar")),
        ))
    }

    /// Stream the sandbox's filesystem into a new snapshot, at most [`snapshot_limit`] bytes
    /// for a sandbox of `disk_mib` MiB: a larger archive is refused with
    /// [`Error::FileTooLarge`] and nothing of it is kept. The agent's `tar` stores sparse
    /// files sparse, but the bound is counted here, on the host side, whatever the sandbox
    /// streams.
    /// An image sandbox's snapshot (`image`) holds the image for the snapshot before its
    /// metadata is written.
    pub(crate) async fn capture(
        &self,
        id: &str,
        name: Option<String>,
        disk_mib: u64,
        image: Option<SnapshotImage>,
    ) -> Result<SnapshotInfo> {
        use tokio::io::AsyncWriteExt as _;
        let snapshot_id = format!("snap-{}", config::new_id());
        let (meta, tar) = self.snapshot_paths(&snapshot_id)?;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(self.snapshots_dir())
            .map_err(|e| Error::from_io(&e, "snapshot directory"))?;
        let partial = tar.with_extension("partial");
        let mut file = tokio::fs::File::create(&partial)
            .await
            .map_err(|e| Error::from_io(&e, "snapshot file"))?;
        let mut size = 0u64;
        let limit = snapshot_limit(disk_mib);
        let result: Result<()> = async {
            let mut archive = self.agent(id)?.while_paused().export_fs().await?;
            while let Some(chunk) = archive.next().await {
                let chunk = chunk?;
                size += chunk.len() as u64;
                if size > limit {
                    // Dropping the stream ends the agent's `tar`.
                    return Err(Error::FileTooLarge {
                        what: format!("the snapshot of sandbox {id}"),
                        limit,
                        remedy: format!(
                            "its files take more than its disk size ({disk_mib} MiB) allows; \
                             remove files, or keep large data in a volume"
                        ),
                    });
                }
                file.write_all(&chunk)
                    .await
                    .map_err(|e| Error::from_io(&e, "snapshot file"))?;
            }
            file.flush()
                .await
                .map_err(|e| Error::from_io(&e, "snapshot file"))
        }
        .await;
        drop(file);
        if let Err(e) = result {
            let _ = std::fs::remove_file(&partial);
            return Err(e);
        }
        if let Err(e) = std::fs::rename(&partial, &tar) {
            let _ = std::fs::remove_file(&partial);
            return Err(Error::from_io(&e, "snapshot file"));
        }
        let info = SnapshotInfo {
            id: snapshot_id.clone(),
            name,
            sandbox_id: id.to_string(),
            created_at: now_millis(),
            size,
            source_resume_error: None,
        };
        if let Some(image) = &image {
            if let Err(e) = self.hold_image(&image.digest, &snapshot_id).await {
                let _ = std::fs::remove_file(&tar);
                return Err(e);
            }
        }
        let held = image.is_some();
        let text = serde_json::to_vec_pretty(&SnapshotMeta {
            info: info.clone(),
            image,
        })
        .map_err(|e| Error::backend(format!("encode snapshot: {e}")))?;
        if let Err(e) = std::fs::write(&meta, text) {
            // No snapshot without its metadata: nothing half-made stays behind.
            let _ = std::fs::remove_file(&meta);
            let _ = std::fs::remove_file(&tar);
            if held {
                self.release_image(&snapshot_id).await;
            }
            return Err(Error::from_io(&e, "snapshot metadata"));
        }
        Ok(info)
    }

    /// The image a snapshot was taken from (`None`: a host-base sandbox's), or `NotFound`.
    pub(crate) fn snapshot_image(&self, snapshot_id: &str) -> Result<Option<SnapshotImage>> {
        let (meta, _) = self.snapshot_paths(snapshot_id)?;
        let text = std::fs::read(&meta).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                Error::not_found(format!("snapshot {snapshot_id:?}"))
            } else {
                Error::from_io(&e, "snapshot metadata")
            }
        })?;
        let meta: SnapshotMeta = serde_json::from_slice(&text)
            .map_err(|e| Error::backend(format!("snapshot {snapshot_id:?}: {e}")))?;
        Ok(meta.image)
    }

    /// The images the snapshots of this state directory were taken from (digests).
    pub(crate) fn snapshot_images(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(self.snapshots_dir()) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|entry| {
                let name = entry.file_name().to_string_lossy().into_owned();
                let id = name.strip_suffix(".json")?;
                self.snapshot_image(id).ok().flatten().map(|i| i.digest)
            })
            .collect()
    }

    /// Keep `digest`'s image in the store for `holder` (off the event loop: the store's lock
    /// may be held by a prune).
    async fn hold_image(&self, digest: &str, holder: &str) -> Result<()> {
        let Some(source) = self.images.clone() else {
            return Ok(());
        };
        let (digest, holder) = (digest.to_string(), holder.to_string());
        tokio::task::spawn_blocking(move || source.hold(&digest, &holder))
            .await
            .map_err(|e| Error::backend(format!("image hold task failed: {e}")))?
    }

    /// End `holder`'s hold on its image (a no-op where it holds none).
    pub(crate) async fn release_image(&self, holder: &str) {
        if let Some(source) = self.images.clone() {
            let holder = holder.to_string();
            let _ = tokio::task::spawn_blocking(move || source.release(&holder)).await;
        }
    }

    /// Unpack a snapshot archive into a fresh sandbox.
    pub(crate) async fn restore(&self, id: &str, tar: &Path) -> Result<()> {
        let file = tokio::fs::File::open(tar)
            .await
            .map_err(|e| Error::from_io(&e, "snapshot file"))?;
        let chunks = futures::stream::unfold(Some(file), |state| async move {
            use tokio::io::AsyncReadExt as _;
            let mut file = state?;
            let mut buf = vec![0u8; proto::CHUNK];
            match file.read(&mut buf).await {
                Ok(0) => None,
                Ok(n) => {
                    buf.truncate(n);
                    Some((Ok(buf), Some(file)))
                }
                Err(e) => Some((Err(Error::from_io(&e, "snapshot file")), None)),
            }
        });
        self.agent(id)?.import_fs(Box::pin(chunks)).await
    }
}

/// The largest snapshot archive of a sandbox whose disk is `disk_mib` MiB: the data its disk
/// holds (sparse files are archived without their holes) and an allowance for `tar`'s
/// headers, an eighth of the disk and at least 1 MiB (each entry takes 512 bytes or more
/// whatever its size, so very many empty files can reach it first).
pub(crate) fn snapshot_limit(disk_mib: u64) -> u64 {
    let disk = disk_mib.saturating_mul(1 << 20);
    disk.saturating_add((disk / 8).max(1 << 20))
}

/// A snapshot's result once its source was resumed: a capture error wins; a snapshot taken
/// whose source then failed to resume is still returned (it exists and the caller needs its
/// id), carrying the resume error.
pub(crate) fn snapshot_outcome(
    captured: Result<SnapshotInfo>,
    resumed: Result<()>,
) -> Result<SnapshotInfo> {
    let mut info = captured?;
    if let Err(e) = resumed {
        info.source_resume_error = Some(e.to_string());
    }
    Ok(info)
}

/// A fork's result: a create error wins; a fork made whose source then failed to resume is
/// still returned (it exists and the caller needs its id), carrying the resume error, as a
/// snapshot's is.
pub(crate) fn fork_outcome(
    created: Result<SandboxInfo>,
    source_resume_error: Option<String>,
) -> Result<SandboxInfo> {
    let mut info = created?;
    info.source_resume_error = source_resume_error;
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taken() -> SnapshotInfo {
        SnapshotInfo {
            id: "snap-1".into(),
            name: None,
            sandbox_id: "sb".into(),
            created_at: 1,
            size: 2,
            source_resume_error: None,
        }
    }

    /// A snapshot taken whose source then fails to resume is returned, carrying the resume
    /// error; a failed capture stays the error.
    #[test]
    fn a_snapshot_survives_its_sources_failed_resume() {
        let info = snapshot_outcome(Ok(taken()), Err(Error::backend("agent gone")))
            .expect("the snapshot exists: its reference is returned");
        assert_eq!(info.id, "snap-1");
        let why = info.source_resume_error.expect("the resume error");
        assert!(why.contains("agent gone"), "{why}");
        assert_eq!(snapshot_outcome(Ok(taken()), Ok(())).unwrap(), taken());
        let err = snapshot_outcome(Err(Error::not_found("x")), Err(Error::backend("y")));
        assert!(err.unwrap_err().is_not_found());
    }

    /// A fork whose source fails to resume after its files were copied is returned with the
    /// resume error, as a snapshot is (before, the error was dropped); the field survives
    /// the wire; a failed create stays the error.
    #[test]
    fn a_fork_carries_its_sources_failed_resume() {
        let mut made: SandboxInfo = serde_json::from_value(serde_json::json!({
            "id": "fork-1", "state": "running", "template": "base", "labels": {}, "envs": {},
            "resources": {}, "network": "none",
            "user": {"name": "user", "uid": 1000, "gid": 1000, "home": "/workspace"},
            "created_at": 1, "ends_at": 2
        }))
        .expect("a sandbox description");
        made.source_resume_error = None;
        let info = fork_outcome(Ok(made.clone()), Some("agent gone".into())).unwrap();
        assert_eq!(info.id, "fork-1");
        assert_eq!(info.source_resume_error.as_deref(), Some("agent gone"));
        let wire: SandboxInfo =
            serde_json::from_str(&serde_json::to_string(&info).unwrap()).unwrap();
        assert_eq!(wire.source_resume_error.as_deref(), Some("agent gone"));
        assert_eq!(fork_outcome(Ok(made.clone()), None).unwrap(), made);
        let err = fork_outcome(Err(Error::not_found("x")), Some("y".into()));
        assert!(err.unwrap_err().is_not_found());
    }
}
