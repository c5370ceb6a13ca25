//! Facade state: the runtime client, lookup by name, and the small JSON records the facade
//! keeps as runtime annotations of each sandbox (so every client program sees the same
//! names, labels and process statuses). Annotations are held by the runtime outside the
//! sandbox: sandbox code can neither read nor rewrite them, and a fork gets a copy only
//! because fork copies them explicitly.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use futures::StreamExt;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::errors::{Result, SandboxAPIError};
use crate::models::Sandbox;

/// Core label holding the Blaxel sandbox name.
pub(crate) const NAME_LABEL: &str = "blaxel.name";
/// Core label holding a sandbox's external id (`metadata.externalId`), for lookups.
pub(crate) const EXTERNAL_ID_LABEL: &str = "blaxel.external-id";
/// Annotation holding the sandbox record ([`SandboxRecord`]).
pub(crate) const SANDBOX_KEY: &str = "blaxel/sandbox";
/// Prefix of the annotation holding one named preview (`blaxel/preview/<name>`).
pub(crate) const PREVIEW_KEY_PREFIX: &str = "blaxel/preview/";
/// Prefix of the annotation holding one preview token (`blaxel/ptoken/<preview>/<token>`).
pub(crate) const TOKEN_KEY_PREFIX: &str = "blaxel/ptoken/";
/// Prefix of the annotation holding one process record (`blaxel/proc/<pid>`).
pub(crate) const PROC_KEY_PREFIX: &str = "blaxel/proc/";
/// Process records kept before those of processes the runtime no longer lists are dropped
/// (the runtime keeps a bounded history of finished processes; so do the records).
pub(crate) const PROC_RECORDS_KEPT: usize = 300;
/// Tag prefix of the facade's own background processes (hidden from `process.list`).
pub(crate) const INTERNAL_TAG_PREFIX: &str = ".blaxel-";

static CLIENT: OnceLock<sandcove::Client> = OnceLock::new();

/// The runtime client `sandcove::Client::from_env()` selects, made once per program, with
/// Blaxel's standby after a quiet period ([`crate::standby`]).
pub(crate) fn client() -> Result<sandcove::Client> {
    if let Some(c) = CLIENT.get() {
        return Ok(c.clone());
    }
    let quiet = crate::standby::standby_after()?;
    let c = sandcove::Client::from_env()?;
    let c = sandcove::Client::new(crate::standby::wrap(c.backend().clone(), quiet));
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
    let filter = sandcove::ListOptions::default().name(name);
    Ok(client.list(filter).await?.pop())
}

/// The annotation key of process `pid`'s record.
pub(crate) fn proc_key(pid: u32) -> String {
    format!("{PROC_KEY_PREFIX}{pid}")
}

/// The annotation key of the preview named `name`.
pub(crate) fn preview_key(name: &str) -> String {
    format!("{PREVIEW_KEY_PREFIX}{name}")
}

/// The annotation key of token `token` of the preview named `preview`.
pub(crate) fn token_key(preview: &str, token: &str) -> String {
    format!("{TOKEN_KEY_PREFIX}{preview}/{token}")
}

/// What the facade records about one preview token: the runtime checks tokens by value and
/// keeps no names, so the name (what Blaxel's `tokens.delete` takes) and the value it stands
/// for live here, outside the sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct TokenRecord {
    pub name: String,
    pub value: String,
    /// Expiry, ms since the epoch.
    pub expires_at: u64,
}

/// The JSON record under `key` in `info`'s annotations; `None` when absent or undecodable.
pub(crate) fn annotation<T: DeserializeOwned>(
    info: &sandcove::SandboxInfo,
    key: &str,
) -> Option<T> {
    info.annotations
        .get(key)
        .and_then(|text| serde_json::from_str(text).ok())
}

/// Every JSON record whose key starts with `prefix`, by the rest of the key.
pub(crate) fn annotations_under<T: DeserializeOwned>(
    info: &sandcove::SandboxInfo,
    prefix: &str,
) -> BTreeMap<String, T> {
    info.annotations
        .iter()
        .filter_map(|(k, v)| {
            let rest = k.strip_prefix(prefix)?;
            Some((rest.to_string(), serde_json::from_str(v).ok()?))
        })
        .collect()
}

/// Read the JSON record under `key`; `None` when there is none.
pub(crate) async fn read_annotation<T: DeserializeOwned>(
    sandbox: &sandcove::Sandbox,
    key: &str,
) -> Result<Option<T>> {
    Ok(annotation(&sandbox.info().await?, key))
}

/// The annotation text of a record.
pub(crate) fn encode<T: Serialize>(key: &str, value: &T) -> Result<String> {
    serde_json::to_string(value)
        .map_err(|e| SandboxAPIError::exception(format!("encode {key}: {e}")))
}

/// Apply an annotation update to the sandbox.
pub(crate) async fn update_annotations(
    sandbox: &sandcove::Sandbox,
    update: sandcove::AnnotationUpdate,
) -> sandcove::Result<BTreeMap<String, String>> {
    sandbox.update_annotations(update).await
}

/// Record `value` under `key` (replacing what was there).
pub(crate) async fn write_annotation<T: Serialize>(
    sandbox: &sandcove::Sandbox,
    key: &str,
    value: &T,
) -> Result<()> {
    let update = sandcove::AnnotationUpdate::set(key, encode(key, value)?);
    update_annotations(sandbox, update).await?;
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
