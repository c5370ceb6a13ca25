//! What every sub-API shares: the runtime's handle to the sandbox, its work dir, and the
//! facade's own per-sandbox state (labels set later, archived flag, intervals).

use std::collections::BTreeMap;
use std::sync::Arc;

use sandcove::{AnnotationUpdate, Output, ProcessSpec, SandboxInfo};
use serde::{Deserialize, Serialize};

use crate::translate;

/// The annotation holding what Daytona can change after creation and the runtime has no
/// field for (label replacement, archived, intervals). Annotations are kept by the runtime
/// outside the sandbox: every program (and a remote runtime) sees the same values, sandbox
/// code cannot change them, and they are readable while the sandbox is paused or stopped.
pub(crate) const META_KEY: &str = "daytona/meta";

/// Compare-and-set attempts of one facade-state change before its conflict is reported.
const MAX_META_ATTEMPTS: u32 = 64;

/// The facade's per-sandbox state.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct Meta {
    pub name: Option<String>,
    pub labels: Option<BTreeMap<String, String>>,
    /// Archived (Daytona's `archive()`); only ever set on a stopped sandbox, cleared by start.
    pub archived: bool,
    pub public: bool,
    pub auto_stop_interval: Option<i64>,
    pub auto_archive_interval: Option<i64>,
    pub auto_delete_interval: Option<i64>,
    pub network_block_all: bool,
    pub snapshot: Option<String>,
    pub target: Option<String>,
    pub volumes: Vec<(String, String, Option<String>)>,
    /// The salt of the wire's file-URL signing key; a rotation replaces it.
    pub signing_salt: Option<String>,
}

/// A handle to one sandbox for the sub-APIs: the runtime's own handle (every call goes
/// through its capability and validation checks) and the directory relative paths resolve
/// against.
#[derive(Debug, Clone)]
pub(crate) struct Ctx {
    pub core: sandcove::Sandbox,
    pub work_dir: Arc<str>,
}

impl Ctx {
    /// The sandbox id.
    pub fn id(&self) -> &str {
        self.core.id()
    }

    pub fn resolve(&self, path: &str) -> String {
        translate::resolve_path(&self.work_dir, path)
    }

    pub async fn run(&self, spec: ProcessSpec) -> sandcove::Result<Output> {
        self.core.run(spec).await
    }

    /// A whole file in memory: Daytona's calls hold files whole, so up to the core's largest
    /// in-memory bound (larger is `FileTooLarge`, 413).
    pub async fn read(&self, path: &str) -> sandcove::Result<Vec<u8>> {
        let options = sandcove::ReadOptions::default().max_bytes(sandcove::MAX_MEMORY_FILE_BYTES);
        self.core.read_with(path, options).await
    }

    /// Read a whole file held in memory, refusing it once it passes `limit` bytes (the
    /// file may grow while it is read, so the bound is on what arrives).
    pub async fn read_limited(&self, path: &str, limit: usize) -> sandcove::Result<Vec<u8>> {
        use futures::StreamExt;
        let mut stream = self.core.read_stream(path).await?;
        let mut out = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk?;
            if out.len().saturating_add(chunk.len()) > limit {
                return Err(sandcove::Error::FileTooLarge {
                    what: path.to_string(),
                    limit: limit as u64,
                    remedy: "the most one download holds here".into(),
                });
            }
            out.extend_from_slice(&chunk);
        }
        Ok(out)
    }

    pub async fn write(&self, path: &str, data: Vec<u8>) -> sandcove::Result<sandcove::FileStat> {
        let options = sandcove::WriteOptions::default().max_bytes(sandcove::MAX_MEMORY_FILE_BYTES);
        self.core.write_with(path, data, options).await
    }

    pub async fn meta(&self) -> sandcove::Result<Meta> {
        Ok(meta_of(&self.core.info().await?))
    }

    /// Change the facade state with a compare-and-set on its annotation, retried on a
    /// conflict, so two programs changing different fields both keep their change.
    pub async fn update_meta(&self, change: impl Fn(&mut Meta)) -> sandcove::Result<Meta> {
        let mut attempts = 0;
        loop {
            attempts += 1;
            let info = self.core.info().await?;
            let old = info.annotations.get(META_KEY).cloned();
            let mut meta = meta_of(&info);
            change(&mut meta);
            let update =
                AnnotationUpdate::set(META_KEY, encode_meta(&meta)?).expecting(META_KEY, old);
            match self.core.update_annotations(update).await {
                Ok(_) => return Ok(meta),
                // Someone else changed it first: re-read and apply the change again (bounded,
                // so endless contention surfaces as the conflict rather than a hang).
                Err(sandcove::Error::Conflict { .. }) if attempts < MAX_META_ATTEMPTS => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

/// The annotation text of a facade state.
pub(crate) fn encode_meta(meta: &Meta) -> sandcove::Result<String> {
    serde_json::to_string(meta).map_err(|e| sandcove::Error::backend(e.to_string()))
}

/// The facade state recorded for a sandbox; a sandbox created by other means has none.
pub(crate) fn meta_of(info: &SandboxInfo) -> Meta {
    info.annotations
        .get(META_KEY)
        .and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or_default()
}
