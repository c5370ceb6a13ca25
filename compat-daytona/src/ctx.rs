//! What every sub-API shares: the runtime client, the sandbox id, its work dir, and the
//! facade's own per-sandbox state (labels set later, stopped flag, intervals).

use std::collections::BTreeMap;
use std::sync::Arc;

use sandcove::{Backend, Client, Output, ProcessSpec};
use serde::{Deserialize, Serialize};

use crate::translate;

/// Where the facade keeps what Daytona can change after creation and the runtime cannot
/// store (label replacement, stopped/archived, intervals). It lives in the sandbox, so every
/// program (and a remote runtime) sees the same values.
pub(crate) const META_PATH: &str = "/tmp/.sandcove-daytona.json";

/// The facade's per-sandbox state.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct Meta {
    pub name: Option<String>,
    pub labels: Option<BTreeMap<String, String>>,
    pub stopped: bool,
    pub archived: bool,
    pub public: bool,
    pub auto_stop_interval: Option<i64>,
    pub auto_archive_interval: Option<i64>,
    pub auto_delete_interval: Option<i64>,
    pub network_block_all: bool,
    pub snapshot: Option<String>,
    pub target: Option<String>,
    pub volumes: Vec<(String, String, Option<String>)>,
}

/// A handle to one sandbox for the sub-APIs.
#[derive(Debug, Clone)]
pub(crate) struct Ctx {
    pub client: Client,
    pub id: Arc<str>,
    pub work_dir: Arc<str>,
}

impl Ctx {
    pub fn backend(&self) -> &Arc<dyn Backend> {
        self.client.backend()
    }

    pub fn resolve(&self, path: &str) -> String {
        translate::resolve_path(&self.work_dir, path)
    }

    pub async fn run(&self, spec: ProcessSpec) -> sandcove::Result<Output> {
        let stream = self.backend().spawn(&self.id, spec).await?;
        sandcove::client::collect(stream, sandcove::DEFAULT_OUTPUT_LIMIT).await
    }

    pub async fn read(&self, path: &str) -> sandcove::Result<Vec<u8>> {
        use futures::StreamExt;
        let mut stream = self
            .backend()
            .read_file(&self.id, path, Default::default())
            .await?;
        let mut out = Vec::new();
        while let Some(chunk) = stream.next().await {
            out.extend_from_slice(&chunk?);
        }
        Ok(out)
    }

    pub async fn write(&self, path: &str, data: Vec<u8>) -> sandcove::Result<sandcove::FileStat> {
        let stream: sandcove::ByteStream = Box::pin(futures::stream::once(async move { Ok(data) }));
        self.backend()
            .write_file(&self.id, path, stream, sandcove::WriteOptions::default())
            .await
    }

    pub async fn meta(&self) -> sandcove::Result<Meta> {
        read_meta(self.backend().as_ref(), &self.id).await
    }

    pub async fn set_meta(&self, meta: &Meta) -> sandcove::Result<()> {
        let json = serde_json::to_vec(meta).map_err(|e| sandcove::Error::backend(e.to_string()))?;
        self.write(META_PATH, json).await.map(|_| ())
    }
}

/// Read the facade state of sandbox `id`; a sandbox created by other means has none.
pub(crate) async fn read_meta(backend: &dyn Backend, id: &str) -> sandcove::Result<Meta> {
    use futures::StreamExt;
    let mut stream = match backend.read_file(id, META_PATH, Default::default()).await {
        Ok(s) => s,
        Err(e) if e.is_not_found() => return Ok(Meta::default()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(c) => out.extend_from_slice(&c),
            Err(e) if e.is_not_found() => return Ok(Meta::default()),
            Err(e) => return Err(e),
        }
    }
    Ok(serde_json::from_slice(&out).unwrap_or_default())
}
