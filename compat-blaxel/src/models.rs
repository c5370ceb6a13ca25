//! Blaxel's models: control-plane records (`Sandbox`, `Metadata`, `SandboxSpec`, …), request
//! dicts (`SandboxCreateConfiguration`, `ProcessRequest`, `Preview`) and sandbox-API results
//! (`ProcessResponse`, `Directory`, …).
//!
//! Request structs accept both camelCase and snake_case keys, as Blaxel's `from_dict` does,
//! and refuse unknown keys. Results serialize as camelCase, like Blaxel's `to_dict`.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::errors::{Result, SandboxAPIError};

/// Parse a request dict into a typed request, naming the type in the `ValueError`.
pub(crate) fn from_value<T: serde::de::DeserializeOwned>(value: Value, what: &str) -> Result<T> {
    serde_json::from_value(value)
        .map_err(|e| SandboxAPIError::value_error(format!("invalid {what}: {e}")))
}

/// A sandbox port (`Port`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Port {
    /// Port number inside the sandbox.
    pub target: i64,
    /// Optional name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `HTTP` (default), `TCP`, `TLS` or `UDP`.
    #[serde(default = "default_protocol")]
    pub protocol: String,
}

fn default_protocol() -> String {
    "HTTP".into()
}

/// A sandbox environment variable (`Env`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Env {
    /// Variable name.
    pub name: String,
    /// Its value.
    pub value: String,
    /// Whether Blaxel treats it as a secret (recorded only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<bool>,
}

/// One expiration rule of a [`SandboxLifecycle`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpirationPolicy {
    /// `ttl-idle`, `ttl-max-age` or `date`.
    #[serde(rename = "type", alias = "type_")]
    pub r#type: String,
    /// A duration (`30m`) or, for `date`, an ISO date.
    pub value: String,
    /// `delete` (the only value).
    #[serde(default = "default_action")]
    pub action: String,
}

fn default_action() -> String {
    "delete".into()
}

/// When a sandbox is deleted automatically (`SandboxLifecycle`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SandboxLifecycle {
    /// Rules; the first one met wins.
    #[serde(default, alias = "expiration_policies")]
    pub expiration_policies: Vec<ExpirationPolicy>,
    /// How long a terminated record is kept (recorded only).
    #[serde(
        default,
        alias = "terminated_retention",
        skip_serializing_if = "Option::is_none"
    )]
    pub terminated_retention: Option<String>,
}

/// A volume to attach at creation (`VolumeBinding`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct VolumeBinding {
    /// Volume name.
    pub name: String,
    /// Where it is mounted.
    #[serde(alias = "mount_path")]
    pub mount_path: String,
    /// Mount read-only.
    #[serde(default, alias = "read_only")]
    pub read_only: bool,
    /// `persistent` (default) or `ephemeral`.
    #[serde(
        default,
        rename = "type",
        alias = "type_",
        skip_serializing_if = "Option::is_none"
    )]
    pub r#type: Option<String>,
    /// Size of an ephemeral volume.
    #[serde(default, alias = "size_mb", skip_serializing_if = "Option::is_none")]
    pub size_mb: Option<i64>,
}

/// The simple create dict (`SandboxCreateConfiguration`). Every field is optional; Blaxel's
/// defaults apply (image `blaxel/base-image:latest`, memory 4096).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SandboxCreateConfiguration {
    /// Sandbox name; generated when absent.
    #[serde(default)]
    pub name: Option<String>,
    /// Image (recorded; every sandbox runs on the runtime's base filesystem).
    #[serde(default)]
    pub image: Option<String>,
    /// Memory in MB (recorded and reported, not enforced).
    #[serde(default)]
    pub memory: Option<i64>,
    /// Ports (recorded).
    #[serde(default)]
    pub ports: Option<Vec<Port>>,
    /// Sandbox-wide environment variables, inherited by every process.
    #[serde(default)]
    pub envs: Option<Vec<Env>>,
    /// Volumes to attach.
    #[serde(default)]
    pub volumes: Option<Vec<VolumeBinding>>,
    /// Maximum age: `30s`, `5m`, `24h`, `7d`, `2w`.
    #[serde(default)]
    pub ttl: Option<String>,
    /// Absolute deletion time (ISO 8601).
    #[serde(default)]
    pub expires: Option<String>,
    /// Region, one of Blaxel's.
    #[serde(default)]
    pub region: Option<String>,
    /// Expiration policies.
    #[serde(default)]
    pub lifecycle: Option<SandboxLifecycle>,
    /// Network configuration (not supported).
    #[serde(default)]
    pub network: Option<Value>,
    /// Snapshots enabled (recorded).
    #[serde(default, alias = "snapshot_enabled")]
    pub snapshot_enabled: Option<bool>,
    /// Labels.
    #[serde(default)]
    pub labels: Option<BTreeMap<String, String>>,
    /// Kernel-variant switches (not supported).
    #[serde(default, alias = "extra_args")]
    pub extra_args: Option<BTreeMap<String, String>>,
    /// The caller's own identifier of the sandbox (`metadata.external_id` of a full
    /// `Sandbox`, the TypeScript configuration's `externalId`): at most 64 letters, digits
    /// and `-`; found again with `SandboxInstance::get_by_external_id`.
    #[serde(default, alias = "external_id")]
    pub external_id: Option<String>,
}

/// Control-plane metadata of a sandbox (`Metadata`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Metadata {
    /// The sandbox name (unique among live sandboxes).
    #[serde(default)]
    pub name: String,
    /// Display name.
    #[serde(
        default,
        alias = "display_name",
        skip_serializing_if = "Option::is_none"
    )]
    pub display_name: Option<String>,
    /// Labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Creation time (RFC 3339).
    #[serde(default, alias = "created_at", skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
    /// Last update time (RFC 3339).
    #[serde(default, alias = "updated_at", skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<String>,
    /// The runtime's sandbox id (Blaxel's data-plane URL has no meaning here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Workspace (`BL_WORKSPACE`, if set; recorded only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
    /// The caller's own identifier, given at creation (see
    /// [`SandboxCreateConfiguration::external_id`]).
    #[serde(
        default,
        alias = "external_id",
        skip_serializing_if = "Option::is_none"
    )]
    pub external_id: Option<String>,
}

/// The runtime part of a sandbox spec (`SandboxRuntime`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SandboxRuntime {
    /// Image.
    #[serde(default)]
    pub image: String,
    /// Memory in MB (reported, not enforced).
    #[serde(default)]
    pub memory: i64,
    /// Ports.
    #[serde(default)]
    pub ports: Vec<Port>,
    /// Sandbox-wide environment variables.
    #[serde(default)]
    pub envs: Vec<Env>,
    /// Maximum age.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<String>,
    /// Absolute deletion time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<String>,
    /// Snapshots enabled.
    #[serde(
        default,
        alias = "snapshot_enabled",
        skip_serializing_if = "Option::is_none"
    )]
    pub snapshot_enabled: Option<bool>,
}

/// A sandbox spec (`SandboxSpec`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SandboxSpec {
    /// Always true.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Region.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// Expiration policies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<SandboxLifecycle>,
    /// Runtime settings.
    #[serde(default)]
    pub runtime: SandboxRuntime,
    /// Attached volumes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeBinding>,
}

fn yes() -> bool {
    true
}

/// The control-plane record of a sandbox (`Sandbox`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Sandbox {
    /// Name, labels, times.
    #[serde(default)]
    pub metadata: Metadata,
    /// Image, memory, ports, envs, lifecycle.
    #[serde(default)]
    pub spec: SandboxSpec,
    /// `DEPLOYED` while usable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// `RUNNING`, or `STANDBY` while paused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// Seconds until automatic deletion.
    #[serde(default, alias = "expires_in", skip_serializing_if = "Option::is_none")]
    pub expires_in: Option<i64>,
    /// Last use (RFC 3339).
    #[serde(
        default,
        alias = "last_used_at",
        skip_serializing_if = "Option::is_none"
    )]
    pub last_used_at: Option<String>,
}

/// Labels and display name for `update_metadata` (`SandboxUpdateMetadata`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SandboxUpdateMetadata {
    /// Labels merged into the existing ones.
    #[serde(default)]
    pub labels: Option<BTreeMap<String, String>>,
    /// Replaces the display name.
    #[serde(default, alias = "display_name")]
    pub display_name: Option<String>,
}

/// A filesystem snapshot of a sandbox (`SandboxSnapshot`): a workspace object that outlives
/// the sandbox it was taken from. It keeps the files, not the processes or memory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxSnapshot {
    /// Snapshot id, unique in the workspace (workspace-level calls take it).
    pub id: String,
    /// Name, unique among the snapshots of its source sandbox; the id when none was given.
    pub name: String,
    /// The sandbox it was taken from (kept for compatibility: read `source.name`).
    pub sandbox_name: String,
    /// `ready` once taken.
    pub status: String,
    /// When it was taken (RFC 3339).
    pub created_at: String,
    /// Workspace (`BL_WORKSPACE`, if set; the server's workspace over the wire).
    pub workspace: Option<String>,
    /// Who took it (not recorded here).
    pub created_by: Option<String>,
    /// The object it was taken from, and whether that still exists.
    pub source: Option<SandboxSnapshotSource>,
    /// The configuration a fork of it runs with (known while its source exists).
    pub spec: Option<SandboxSnapshotSpec>,
}

/// What a snapshot was taken from (`SandboxSnapshotSource`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxSnapshotSource {
    /// Name of the source sandbox.
    pub name: String,
    /// Whether the source has since been deleted.
    pub deleted: Option<bool>,
    /// `sandbox`, the only kind.
    pub kind: Option<String>,
}

/// The configuration a snapshot carries (`SandboxSnapshotSpec`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxSnapshotSpec {
    /// Image of the source.
    pub image: Option<String>,
    /// Memory (MB) of the source.
    pub memory: Option<i64>,
    /// Ports of the source.
    pub ports: Option<Vec<Port>>,
    /// Region of the source.
    pub region: Option<String>,
}

/// The result of `restore` (`SandboxRestoreResponse`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxRestoreResponse {
    /// Name of the restored sandbox.
    pub name: String,
    /// The snapshot it was restored from.
    pub snapshot_id: String,
}

/// The result of `fork` (`SandboxForkResponse`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxForkResponse {
    /// Name of the new sandbox.
    pub name: String,
    /// The snapshot it was made from, when one was named.
    pub snapshot_id: Option<String>,
    /// `sandbox`.
    pub type_: String,
}

// ----- processes -----

/// A process to start (`ProcessRequest`). Keys in snake_case or camelCase.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProcessRequest {
    /// The command line, run by `sh -c`.
    pub command: String,
    /// Name; `proc-` + 8 random characters when absent.
    #[serde(default)]
    pub name: Option<String>,
    /// Working directory (`~` expanded); default `/blaxel`.
    #[serde(default, alias = "working_dir")]
    pub working_dir: Option<String>,
    /// Variables overriding the sandbox's envs for this process.
    #[serde(default)]
    pub env: Option<BTreeMap<String, String>>,
    /// Return only after the process exits.
    #[serde(default, alias = "wait_for_completion")]
    pub wait_for_completion: Option<bool>,
    /// Seconds: bounds the waiting; with `keep_alive` kills the process (default 600, 0 never).
    #[serde(default)]
    pub timeout: Option<i64>,
    /// Return once these ports listen on a routable address.
    #[serde(default, alias = "wait_for_ports")]
    pub wait_for_ports: Option<Vec<i64>>,
    /// Restart after a failed exit.
    #[serde(default, alias = "restart_on_failure")]
    pub restart_on_failure: Option<bool>,
    /// Restart limit (negative: unlimited).
    #[serde(default, alias = "max_restarts")]
    pub max_restarts: Option<i64>,
    /// Keep the sandbox up while it runs; its `timeout` kills it.
    #[serde(default, alias = "keep_alive")]
    pub keep_alive: Option<bool>,
    /// Open a writable stdin pipe, fed with `process.write_stdin` and closed with
    /// `process.close_stdin` (without it the process reads an empty stdin).
    #[serde(default)]
    pub stdin: Option<bool>,
}

/// Status of a process (`ProcessResponseStatus`); compares equal to its lowercase name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProcessResponseStatus {
    /// Still running.
    Running,
    /// Exited with 0.
    Completed,
    /// Exited non-zero or by a signal.
    Failed,
    /// Killed by `kill`.
    Killed,
    /// Stopped by `stop`.
    Stopped,
}

impl ProcessResponseStatus {
    /// The wire name.
    pub fn as_str(&self) -> &'static str {
        match self {
            ProcessResponseStatus::Running => "running",
            ProcessResponseStatus::Completed => "completed",
            ProcessResponseStatus::Failed => "failed",
            ProcessResponseStatus::Killed => "killed",
            ProcessResponseStatus::Stopped => "stopped",
        }
    }

    pub(crate) fn from_name(name: &str) -> Self {
        match name {
            "running" => ProcessResponseStatus::Running,
            "completed" => ProcessResponseStatus::Completed,
            "killed" => ProcessResponseStatus::Killed,
            "stopped" => ProcessResponseStatus::Stopped,
            _ => ProcessResponseStatus::Failed,
        }
    }
}

impl fmt::Display for ProcessResponseStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<&str> for ProcessResponseStatus {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<str> for ProcessResponseStatus {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

/// A process as the sandbox API reports it (`ProcessResponse`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessResponse {
    /// Pid as a decimal string; stable across automatic restarts.
    pub pid: String,
    /// Name.
    pub name: String,
    /// The command as submitted.
    pub command: String,
    /// `running`, `completed`, `failed`, `killed` or `stopped`.
    pub status: ProcessResponseStatus,
    /// 0 while running; the exit status after; -1 when a signal ended it.
    pub exit_code: i64,
    /// Captured stdout.
    pub stdout: String,
    /// Captured stderr.
    pub stderr: String,
    /// stdout followed by stderr.
    pub logs: String,
    /// The requested working directory (`""` when none was given).
    pub working_dir: String,
    /// Start time, `Wed, 01 Jan 2023 12:00:00 GMT`.
    pub started_at: String,
    /// End time in the same format; `""` while running (`None` in `list`).
    pub completed_at: Option<String>,
    /// As requested.
    pub keep_alive: bool,
    /// As requested.
    pub max_restarts: i64,
    /// Restarts so far.
    pub restart_count: i64,
    /// As requested.
    pub restart_on_failure: bool,
}

/// `{message, path?}` (`SuccessResponse`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SuccessResponse {
    /// E.g. `File created/updated successfully`.
    pub message: String,
    /// The path concerned, for file calls.
    pub path: Option<String>,
}

// ----- files -----

/// A file in a listing (`File`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct File {
    /// Path (absolute, or relative like the listed path).
    pub path: String,
    /// Base name.
    pub name: String,
    /// Octal permissions without a leading 0, e.g. `644`.
    pub permissions: String,
    /// Bytes.
    pub size: i64,
    /// RFC 3339 modification time.
    pub last_modified: String,
    /// Owner name.
    pub owner: String,
    /// Group name.
    pub group: String,
}

/// A subdirectory in a listing (`Subdirectory`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Subdirectory {
    /// Path.
    pub path: String,
    /// Base name.
    pub name: String,
}

/// A directory listing (`Directory`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Directory {
    /// The listed path.
    pub path: String,
    /// Its base name.
    pub name: String,
    /// Files and symlinks, sorted by name.
    pub files: Vec<File>,
    /// Directories, sorted by name.
    pub subdirectories: Vec<Subdirectory>,
}

/// One `find` hit (`FindMatch`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FindMatch {
    /// Path relative to the search directory.
    pub path: String,
    /// `file` or `directory`.
    #[serde(rename = "type")]
    pub type_: String,
}

/// The result of `find` (`FindResponse`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FindResponse {
    /// Hits.
    pub matches: Vec<FindMatch>,
    /// Number of hits.
    pub total: i64,
}

/// One `grep` hit (`ContentSearchMatch`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContentSearchMatch {
    /// Path relative to the search directory.
    pub path: String,
    /// 1-based line.
    pub line: i64,
    /// 1-based column of the first match.
    pub column: i64,
    /// The line's text.
    pub text: String,
    /// Never filled (as on Blaxel).
    pub context: Option<String>,
}

/// The result of `grep` (`ContentSearchResponse`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContentSearchResponse {
    /// The query.
    pub query: String,
    /// Hits.
    pub matches: Vec<ContentSearchMatch>,
    /// Number of hits.
    pub total: i64,
}

/// One entry for `write_tree` (`SandboxFilesystemFile`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxFilesystemFile {
    /// Path under the destination.
    pub path: String,
    /// Text content.
    pub content: String,
}

/// The result of `cp` (`CopyResponse`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CopyResponse {
    /// `Files copied`.
    pub message: String,
    /// Source path.
    pub source: String,
    /// Destination path.
    pub destination: String,
}

/// A filesystem change (`WatchEvent`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WatchEvent {
    /// `CREATE`, `WRITE`, `REMOVE`, `RENAME` or `CHMOD`.
    pub op: String,
    /// Absolute path of the directory holding the entry.
    pub path: String,
    /// Base name of the entry.
    pub name: String,
    /// The file's text, with `with_content`, on CREATE and WRITE.
    pub content: Option<String>,
}

// ----- previews -----

/// Preview metadata (`PreviewMetadata`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PreviewMetadata {
    /// Preview name.
    pub name: String,
    /// Display name.
    #[serde(
        default,
        alias = "display_name",
        skip_serializing_if = "Option::is_none"
    )]
    pub display_name: Option<String>,
    /// The sandbox name (set by the facade).
    #[serde(
        default,
        alias = "resource_name",
        skip_serializing_if = "Option::is_none"
    )]
    pub resource_name: Option<String>,
    /// `sandbox` (set by the facade).
    #[serde(
        default,
        alias = "resource_type",
        skip_serializing_if = "Option::is_none"
    )]
    pub resource_type: Option<String>,
}

/// Preview spec (`PreviewSpec`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PreviewSpec {
    /// Port inside the sandbox.
    #[serde(default)]
    pub port: Option<i64>,
    /// Public previews need no token.
    #[serde(default)]
    pub public: Option<bool>,
    /// URL prefix (not supported).
    #[serde(default, alias = "prefix_url", skip_serializing_if = "Option::is_none")]
    pub prefix_url: Option<String>,
    /// Custom domain (not supported).
    #[serde(
        default,
        alias = "custom_domain",
        skip_serializing_if = "Option::is_none"
    )]
    pub custom_domain: Option<String>,
    /// Expiry (not supported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<String>,
    /// Lifetime (not supported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<String>,
    /// Headers injected into requests (not supported).
    #[serde(
        default,
        alias = "request_headers",
        skip_serializing_if = "Option::is_none"
    )]
    pub request_headers: Option<BTreeMap<String, String>>,
    /// Headers injected into responses (not supported).
    #[serde(
        default,
        alias = "response_headers",
        skip_serializing_if = "Option::is_none"
    )]
    pub response_headers: Option<BTreeMap<String, String>>,
    /// The URL (filled in by the facade).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
}

/// A preview (`Preview`): both `metadata` and `spec` are required in a create dict.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Preview {
    /// Name and owner.
    pub metadata: PreviewMetadata,
    /// Port, visibility, URL.
    pub spec: PreviewSpec,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn request_dicts_take_both_key_styles_and_refuse_unknown_keys() {
        let a: ProcessRequest =
            from_value(json!({"command": "ls", "working_dir": "/tmp"}), "p").unwrap();
        let b: ProcessRequest =
            from_value(json!({"command": "ls", "workingDir": "/tmp"}), "p").unwrap();
        assert_eq!(a, b);
        assert_eq!(a.working_dir.as_deref(), Some("/tmp"));
        let err =
            from_value::<ProcessRequest>(json!({"command": "ls", "cwd": "/"}), "p").unwrap_err();
        assert!(err.to_string().contains("cwd"), "{err}");
        assert!(from_value::<ProcessRequest>(json!({"name": "x"}), "p").is_err());
        let cfg: SandboxCreateConfiguration = from_value(
            json!({"name": "a", "ports": [{"target": 3000}], "snapshot_enabled": true}),
            "c",
        )
        .unwrap();
        assert_eq!(cfg.ports.unwrap()[0].protocol, "HTTP");
        assert_eq!(cfg.snapshot_enabled, Some(true));
    }

    #[test]
    fn statuses_compare_with_strings() {
        assert_eq!(ProcessResponseStatus::Failed, "failed");
        assert_eq!(ProcessResponseStatus::Killed.to_string(), "killed");
        assert_eq!(
            serde_json::to_value(ProcessResponseStatus::Completed).unwrap(),
            json!("completed")
        );
    }
}
