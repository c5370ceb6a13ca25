//! Facade state: the runtime client, lookup by name, and the small JSON records
//! the facade keeps inside each sandbox (so every client program sees the same names,
//! labels and process statuses).

use std::collections::BTreeMap;
use std::sync::OnceLock;

use futures::StreamExt;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::errors::{Result, SandboxAPIError};
use crate::models::Sandbox;

/// Core label holding the Blaxel sandbox name.
pub(crate) const NAME_LABEL: &str = "blaxel.name";
/// Per-process records: `<pid>.json`.
pub(crate) const PROC_DIR: &str = "/tmp/.blaxel/proc";
/// The sandbox record.
pub(crate) const SANDBOX_RECORD: &str = "/tmp/.blaxel/sandbox.json";
/// Preview name → port.
pub(crate) const PREVIEWS_RECORD: &str = "/tmp/.blaxel/previews.json";
/// Tag prefix of the facade's own background processes (hidden from `process.list`).
pub(crate) const INTERNAL_TAG_PREFIX: &str = ".blaxel-";

static CLIENT: OnceLock<sandcove::Client> = OnceLock::new();

/// The runtime client `sandcove::Client::from_env()` selects, made once per program.
pub(crate) fn client() -> Result<sandcove::Client> {
    if let Some(c) = CLIENT.get() {
        return Ok(c.clone());
    }
    let c = sandcove::Client::from_env()?;
    Ok(CLIENT.get_or_init(|| c).clone())
}

/// What the facade records about a sandbox, inside it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct SandboxRecord {
    /// The Blaxel view: metadata and spec as created or updated.
    pub sandbox: Sandbox,
    /// Idle timeout (`ttl-idle`) in seconds: each use moves the lease end this far out.
    pub idle_secs: Option<u64>,
}

/// What the facade records about a process, inside the sandbox.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct ProcessRecord {
    pub name: String,
    pub command: String,
    pub working_dir: String,
    pub keep_alive: bool,
    pub max_restarts: i64,
    pub restart_on_failure: bool,
    /// `stopped` or `killed` once the facade did that.
    pub mark: Option<String>,
    /// When it was marked (ms).
    pub marked_at: Option<u64>,
    /// Start time (ms), when known without asking the runtime.
    #[serde(default, skip_serializing)]
    pub started_at: Option<u64>,
}

/// Preview records: name → what was asked.
pub(crate) type PreviewRecords = BTreeMap<String, crate::models::Preview>;

/// The live core sandbox named `name`, if any. The Blaxel name is the core's unique sandbox
/// name, so the runtime (local or remote) answers at most one.
pub(crate) async fn find_by_name(
    client: &sandcove::Client,
    name: &str,
) -> Result<Option<sandcove::SandboxInfo>> {
    let filter = sandcove::ListOptions {
        name: Some(name.to_string()),
        ..Default::default()
    };
    Ok(client.list(filter).await?.pop())
}

/// Read a JSON record inside the sandbox; `None` when it does not exist (or is unreadable).
pub(crate) async fn read_json<T: DeserializeOwned>(
    sandbox: &sandcove::Sandbox,
    path: &str,
) -> Result<Option<T>> {
    match sandbox.read(path).await {
        Ok(bytes) => Ok(serde_json::from_slice(&bytes).ok()),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Write a JSON record inside the sandbox.
pub(crate) async fn write_json<T: Serialize>(
    sandbox: &sandcove::Sandbox,
    path: &str,
    value: &T,
) -> Result<()> {
    let bytes = serde_json::to_vec(value)
        .map_err(|e| SandboxAPIError::exception(format!("encode {path}: {e}")))?;
    sandbox.write(path, bytes).await?;
    Ok(())
}

/// A random lowercase alphanumeric string of `n` characters.
pub(crate) fn random_suffix(n: usize) -> String {
    sandcove::random_id(n)
}

/// The output an attach returns before its live marker: the process's logs so far (each
/// restart shown as Blaxel's restart line in stdout). Never waits for the process.
pub(crate) async fn history(
    mut stream: sandcove::ProcessStream,
    max_restarts: Option<u32>,
) -> Result<(Vec<u8>, Vec<u8>)> {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    while let Some(event) = stream.events.next().await {
        match event? {
            sandcove::ProcessEvent::Stdout(b) => out.extend(b),
            sandcove::ProcessEvent::Stderr(b) => err.extend(b),
            sandcove::ProcessEvent::Restarted {
                restarts, previous, ..
            } => out.extend(
                crate::translate::restart_line(&previous, restarts, max_restarts).into_bytes(),
            ),
            sandcove::ProcessEvent::Live | sandcove::ProcessEvent::Exit(_) => break,
            _ => {}
        }
    }
    Ok((out, err))
}
