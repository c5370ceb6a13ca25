//! Plain data exchanged with a [`Backend`](crate::Backend): sandboxes, processes, files.
//!
//! Everything here is serializable so the same values cross the HTTP boundary unchanged.
//! Output is bytes end to end; decoding text is the facades' job.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

mod builders;

/// The home directory and default working directory inside every sandbox.
pub const SANDBOX_HOME: &str = "/workspace";

/// The lease a sandbox gets when its create options name none.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// Default cap on the bytes one captured stream keeps (see [`Output::truncated`]).
pub const DEFAULT_OUTPUT_LIMIT: usize = 64 * 1024 * 1024;

/// Milliseconds since the Unix epoch; the one time representation on the wire.
pub type UnixMillis = u64;

/// The current time as [`UnixMillis`].
pub fn now_millis() -> UnixMillis {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// `len` random lowercase letters and digits from the kernel's random source (ids, tokens).
///
/// # Panics
/// If the kernel's random source fails, which Linux does not do once booted: a guessable id or
/// token would be worse than stopping.
pub fn random_id(len: usize) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    // Rejection sampling keeps every character equally likely (256 is not a multiple of 36).
    const LIMIT: u8 = (256 / ALPHABET.len() * ALPHABET.len()) as u8;
    let mut out = String::with_capacity(len);
    let mut buf = [0u8; 64];
    while out.len() < len {
        getrandom::fill(&mut buf).expect("the kernel's random source");
        for b in buf.iter().filter(|b| **b < LIMIT) {
            if out.len() == len {
                break;
            }
            out.push(ALPHABET[usize::from(*b) % ALPHABET.len()] as char);
        }
    }
    out
}

/// Options for creating a sandbox.
///
/// Like every option struct here it is `#[non_exhaustive]`: fields may be added without
/// breaking callers, so outside this crate it is built from `Default` and then configured,
/// by assignment or with the chainable setters:
///
/// ```
/// use std::time::Duration;
/// use sandcove_core::{CreateOptions, VolumeMount};
///
/// let options = CreateOptions::default()
///     .name("build-7")
///     .timeout(Duration::from_secs(600))
///     .env("CI", "1")
///     .volume(VolumeMount::new("cache", "/cache"));
/// let mut same = CreateOptions::default();
/// same.name = Some("build-7".into());
/// same.timeout = Some(Duration::from_secs(600));
/// same.envs.insert("CI".into(), "1".into());
/// same.volumes.push(VolumeMount::new("cache", "/cache"));
/// assert_eq!(options, same);
/// ```
///
/// A struct literal does not compile outside this crate, not even with `..Default::default()`:
///
/// ```compile_fail,E0639
/// let options = sandcove_core::CreateOptions {
///     name: Some("build-7".into()),
///     ..Default::default()
/// };
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct CreateOptions {
    /// A name unique among the live sandboxes of one runtime (see [`valid_sandbox_name`] for
    /// the accepted form). A create naming a taken name fails with
    /// [`Error::AlreadyExists`](crate::Error::AlreadyExists) and creates nothing; the name is
    /// free again once its sandbox is destroyed or its lease has ended. Find a sandbox by name
    /// with [`ListOptions::name`]. A fork never inherits its source's name.
    pub name: Option<String>,
    /// Base filesystem. `None` (or `"base"`, `"host"`) is the host's system directories,
    /// read-only. Any other value names an image (an OCI reference such as `python:3.12-slim`,
    /// or a name the runtime maps to one): its layers, read-only, become the sandbox's root
    /// under a writable layer of its own, on runtimes whose
    /// [`Capabilities::templates`](crate::Capabilities::templates) list it.
    pub template: Option<String>,
    /// Environment variables every process in the sandbox inherits.
    pub envs: BTreeMap<String, String>,
    /// Free-form labels, used to filter [`ListOptions`].
    pub labels: BTreeMap<String, String>,
    /// The lease: the sandbox is destroyed this long after creation (or after the last
    /// `set_timeout`). `None` means [`DEFAULT_TIMEOUT`].
    #[serde(with = "opt_duration_secs")]
    pub timeout: Option<Duration>,
    /// CPU, memory and disk limits.
    pub resources: Resources,
    /// What the sandbox may reach on the network.
    pub network: NetworkPolicy,
    /// Name of the default user processes run as (default `user`).
    pub user: Option<String>,
    /// The default user's home and the default working directory (default
    /// [`SANDBOX_HOME`]); relative paths in file calls resolve against it.
    pub home: Option<String>,
    /// Hostname inside the sandbox; defaults to a prefix of the id.
    pub hostname: Option<String>,
    /// What happens when the lease ends.
    pub on_timeout: TimeoutAction,
    /// Resume a paused sandbox automatically when a request arrives for it.
    pub auto_resume: bool,
    /// Start from this filesystem snapshot (see [`SnapshotInfo`]) instead of an empty
    /// workspace.
    pub snapshot: Option<String>,
    /// Named volumes to mount.
    pub volumes: Vec<VolumeMount>,
    /// Key/values kept for the sandbox outside it (see [`SandboxInfo::annotations`] and
    /// [`check_annotations`] for the bounds). A fork starts from a copy of its source's
    /// annotations, with these applied on top.
    pub annotations: BTreeMap<String, String>,
}

/// What a sandbox does when its lease ends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimeoutAction {
    /// Destroy it (the default).
    #[default]
    Destroy,
    /// Pause it: processes and memory kept until resumed or destroyed.
    Pause,
    /// Stop it: its processes end, its files are kept until it is started again (with a
    /// fresh lease) or destroyed — E2B's filesystem-only auto-pause. Needs
    /// [`Capabilities::lease_stop`](crate::Capabilities::lease_stop); `auto_resume` resumes
    /// only a paused sandbox, so it is refused with this action.
    Stop,
}

/// A named volume mounted into a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct VolumeMount {
    /// Volume name.
    pub volume: String,
    /// Absolute mount path inside the sandbox.
    pub path: String,
    /// Mount only this directory of the volume (created if missing).
    #[serde(default)]
    pub subpath: Option<String>,
    /// Mount read-only.
    #[serde(default)]
    pub read_only: bool,
}

/// An image a runtime has stored: what a sandbox created with [`CreateOptions::template`]
/// naming one of its references runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ImageSummary {
    /// The references naming it (`docker.io/library/python:3.12-slim`), possibly none.
    pub references: Vec<String>,
    /// Its manifest digest (`sha256:…`).
    pub digest: String,
    /// The unpacked size of its layers, in bytes.
    pub size: u64,
    /// The config's creation time (RFC 3339), when it has one.
    #[serde(default)]
    pub created: Option<String>,
}

impl ImageSummary {
    /// A summary of an image (for runtimes outside this crate).
    pub fn new(
        references: Vec<String>,
        digest: String,
        size: u64,
        created: Option<String>,
    ) -> Self {
        ImageSummary {
            references,
            digest,
            size,
            created,
        }
    }
}

/// Everything a runtime has stored of one image
/// ([`Backend::inspect_image`](crate::Backend::inspect_image)): its listing, where it came
/// from, its run settings and its layers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ImageDetails {
    /// Its listing: references, digest, size, creation time. Serialized as `info`, the
    /// name `sandcove image inspect --json` has always printed.
    #[serde(rename = "info")]
    pub summary: ImageSummary,
    /// The digest of the index (a multi-platform list) it was chosen from, when pulled
    /// through one.
    #[serde(default)]
    pub index_digest: Option<String>,
    /// The digest of its config blob.
    pub config_digest: String,
    /// Its platform: `linux/amd64`, `linux/arm64/v8`, …
    pub platform: String,
    /// What it asks of the process that runs in it.
    pub config: ImageConfig,
    /// Its layers, lowest first.
    pub layers: Vec<ImageLayer>,
    /// How many entries across its layers were not created (device nodes, fifos): the sum
    /// of the layers' [`skipped`](ImageLayer::skipped).
    pub skipped_entries: u64,
}

impl ImageDetails {
    /// An image's details (for runtimes outside this crate);
    /// [`skipped_entries`](Self::skipped_entries) is counted from `layers`.
    pub fn new(
        summary: ImageSummary,
        index_digest: Option<String>,
        config_digest: String,
        platform: String,
        config: ImageConfig,
        layers: Vec<ImageLayer>,
    ) -> Self {
        let skipped_entries = layers.iter().map(|l| l.skipped.len() as u64).sum();
        ImageDetails {
            summary,
            index_digest,
            config_digest,
            platform,
            config,
            layers,
            skipped_entries,
        }
    }
}

/// The run settings of an image's config ([`ImageDetails::config`]), as the OCI image
/// config names them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ImageConfig {
    /// `Env`: `NAME=value` lines.
    #[serde(default)]
    pub env: Vec<String>,
    /// `WorkingDir`.
    #[serde(default)]
    pub working_dir: Option<String>,
    /// `User` (`name`, `uid`, `uid:gid`, …).
    #[serde(default)]
    pub user: Option<String>,
    /// `Entrypoint`.
    #[serde(default)]
    pub entrypoint: Vec<String>,
    /// `Cmd`.
    #[serde(default)]
    pub cmd: Vec<String>,
}

impl ImageConfig {
    /// An image's run settings (for runtimes outside this crate).
    pub fn new(
        env: Vec<String>,
        working_dir: Option<String>,
        user: Option<String>,
        entrypoint: Vec<String>,
        cmd: Vec<String>,
    ) -> Self {
        ImageConfig {
            env,
            working_dir,
            user,
            entrypoint,
            cmd,
        }
    }
}

/// One layer of a stored image ([`ImageDetails::layers`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ImageLayer {
    /// The blob's digest, as the manifest names it.
    pub digest: String,
    /// The digest of its uncompressed tar (the OCI `diff_id`).
    pub diff_id: String,
    /// The blob's size in bytes.
    pub compressed_size: u64,
    /// The uncompressed tar's size in bytes.
    pub unpacked_size: u64,
    /// How many entries the tar holds.
    pub entries: u64,
    /// The entries not created (device nodes, fifos, entries of unknown types).
    #[serde(default)]
    pub skipped: Vec<String>,
}

impl ImageLayer {
    /// A layer's details (for runtimes outside this crate).
    pub fn new(
        digest: String,
        diff_id: String,
        compressed_size: u64,
        unpacked_size: u64,
        entries: u64,
        skipped: Vec<String>,
    ) -> Self {
        ImageLayer {
            digest,
            diff_id,
            compressed_size,
            unpacked_size,
            entries,
            skipped,
        }
    }
}

/// Where one layer of an image pull is ([`ImagePullProgress::state`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ImageLayerState {
    /// Queued behind other layers.
    Waiting,
    /// Its bytes are arriving.
    Downloading,
    /// Being unpacked into the store.
    Unpacking,
    /// Stored by this pull.
    Done,
    /// Already in the store: nothing fetched.
    Cached,
}

/// One layer's progress during an image pull
/// ([`Backend::pull_image_with_progress`](crate::Backend::pull_image_with_progress)): each
/// report replaces the last one for the same [`index`](Self::index).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ImagePullProgress {
    /// The layer's blob digest, as the manifest names it.
    pub layer: String,
    /// Its position in the image, lowest first.
    pub index: usize,
    /// How many layers the image has.
    pub layers: usize,
    /// Where it is.
    pub state: ImageLayerState,
    /// Bytes received.
    pub done: u64,
    /// The blob's size in bytes.
    pub total: u64,
}

impl ImagePullProgress {
    /// A progress report (for runtimes outside this crate).
    pub fn new(
        layer: String,
        index: usize,
        layers: usize,
        state: ImageLayerState,
        done: u64,
        total: u64,
    ) -> Self {
        ImagePullProgress {
            layer,
            index,
            layers,
            state,
            done,
            total,
        }
    }
}

/// Whether a runtime could run an image, as it finds without pulling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ImageAvailability {
    /// Stored: a create naming it runs it.
    Available,
    /// Not stored; its registry has it (`pull_image` stores it).
    Pullable,
    /// Neither stored nor confirmed by a registry (a bad reference, a registry that cannot be
    /// reached or refuses).
    Unknown,
}

/// What an image prune removed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ImagePruneReport {
    /// Digests of the images removed (without a reference, and run by no live sandbox).
    pub images: Vec<String>,
    /// Layers removed (needed by no image left).
    pub layers: Vec<String>,
    /// Bytes freed, approximately.
    pub bytes: u64,
}

impl ImagePruneReport {
    /// A report (for runtimes outside this crate).
    pub fn new(images: Vec<String>, layers: Vec<String>, bytes: u64) -> Self {
        ImagePruneReport {
            images,
            layers,
            bytes,
        }
    }
}

/// A named persistent volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeInfo {
    /// Unique name.
    pub name: String,
    /// Creation time.
    pub created_at: UnixMillis,
    /// Bytes used: of host disk, for a volume with a quota; of its files, for one without.
    pub size: u64,
    /// The volume's quota in bytes: writes past it fail with `ENOSPC` inside the sandbox.
    /// `None` where the runtime enforces none (a volume of the embedded engine made before
    /// quotas existed).
    #[serde(default)]
    pub size_limit: Option<u64>,
}

/// A filesystem snapshot of a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotInfo {
    /// Snapshot id, usable as [`CreateOptions::snapshot`].
    pub id: String,
    /// Optional name given at creation.
    pub name: Option<String>,
    /// The sandbox it was taken from.
    pub sandbox_id: String,
    /// When it was taken.
    pub created_at: UnixMillis,
    /// Bytes stored.
    pub size: u64,
    /// Set when the snapshot was taken but its source, paused for it, could not be resumed:
    /// the error, so the caller keeps the snapshot and learns that the source is left paused
    /// (resume or destroy it). `None` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_resume_error: Option<String>,
}

/// Options for snapshotting a sandbox ([`Backend::snapshot`](crate::Backend::snapshot)).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SnapshotOptions {
    /// A name for the snapshot ([`SnapshotInfo::name`]).
    pub name: Option<String>,
    /// Keep the processes and memory too, not only the files. A backend whose snapshots keep
    /// files only ([`Capabilities::snapshot_memory`](crate::Capabilities::snapshot_memory)
    /// `false`, every backend here) refuses it with
    /// [`Error::NotSupported`](crate::Error::NotSupported) before any effect, instead of
    /// taking a files-only snapshot the caller did not ask for.
    pub memory: bool,
}

/// Options for exposing a sandbox port on the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct PreviewOptions {
    /// Port inside the sandbox (on its loopback).
    pub port: u16,
    /// Public previews need no token.
    pub public: bool,
    /// Lifetime of the token of a private preview; `None` lasts as long as the sandbox.
    #[serde(with = "opt_duration_secs")]
    pub token_ttl: Option<Duration>,
    /// Header carrying the token (e.g. `x-daytona-preview-token`).
    pub token_header: String,
    /// Query parameter carrying the token (e.g. `bl_preview_token`).
    pub token_query: String,
    /// Headers set on every request forwarded to the port (replacing the client's of the same
    /// name), e.g. an `Authorization` the sandboxed server expects. At most
    /// [`MAX_PREVIEW_HEADERS`](crate::validate::MAX_PREVIEW_HEADERS); names and values as
    /// [`PreviewOptions::validate`] checks them.
    pub request_headers: BTreeMap<String, String>,
    /// Headers set on every answer the port gives (replacing its own of the same name), e.g.
    /// CORS's `Access-Control-Allow-Origin`.
    pub response_headers: BTreeMap<String, String>,
}

impl Default for PreviewOptions {
    fn default() -> Self {
        PreviewOptions {
            port: 0,
            public: false,
            token_ttl: None,
            token_header: "x-sandcove-preview-token".into(),
            token_query: "sandcove_preview_token".into(),
            request_headers: BTreeMap::new(),
            response_headers: BTreeMap::new(),
        }
    }
}

/// An access token for a private preview.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreviewToken {
    /// The secret.
    pub value: String,
    /// When it stops working; `None` lasts as long as the sandbox.
    pub expires_at: Option<UnixMillis>,
}

/// Options for issuing an additional token of a private preview
/// ([`Backend::create_preview_token`](crate::Backend::create_preview_token)).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PreviewTokenOptions {
    /// When the token stops working, in ms since the epoch; `None` lasts as long as the
    /// sandbox.
    pub expires_at: Option<UnixMillis>,
}

/// The one operation a signed file URL allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileUrlOperation {
    /// `GET` the file's bytes.
    Read,
    /// `PUT` or `POST` the file's new bytes (a raw body, or one `file` part of a
    /// `multipart/form-data` body).
    Write,
}

impl FileUrlOperation {
    /// `read` or `write`.
    pub fn name(self) -> &'static str {
        match self {
            FileUrlOperation::Read => "read",
            FileUrlOperation::Write => "write",
        }
    }
}

/// Longest path a signed file URL names, in bytes (the URL carries it).
pub const MAX_FILE_URL_PATH_BYTES: usize = 4096;

/// Longest a signed file URL may stay valid: 7 days, as E2B's and S3's pre-signed URLs.
pub const MAX_FILE_URL_TTL: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);

/// What a signed file URL is for ([`Backend::create_file_url`](crate::Backend::create_file_url)):
/// one path, one operation, one user, until an optional expiry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct FileUrlOptions {
    /// The path, as the file API takes it (relative paths are under the sandbox's home).
    pub path: String,
    /// What the URL does.
    pub operation: FileUrlOperation,
    /// The sandbox user the transfer runs as (see [`ReadOptions::user`]); `None`: the file
    /// API's own identity, as a call without a user.
    #[serde(default)]
    pub user: Option<String>,
    /// When the URL stops working, in ms since the epoch; `None` lasts as long as the
    /// sandbox. At most [`MAX_FILE_URL_TTL`] from now.
    #[serde(default)]
    pub expires_at: Option<UnixMillis>,
    /// Largest upload a write URL takes, in bytes (the backend's own bound applies too).
    #[serde(default)]
    pub max_bytes: Option<u64>,
}

impl FileUrlOptions {
    /// A URL that reads `path`.
    pub fn read(path: impl Into<String>) -> Self {
        FileUrlOptions {
            path: path.into(),
            operation: FileUrlOperation::Read,
            user: None,
            expires_at: None,
            max_bytes: None,
        }
    }

    /// A URL that writes `path` (parents created, an existing file replaced).
    pub fn write(path: impl Into<String>) -> Self {
        FileUrlOptions {
            operation: FileUrlOperation::Write,
            ..FileUrlOptions::read(path)
        }
    }

    /// Transfer as sandbox user `user`.
    pub fn user(mut self, user: impl Into<String>) -> Self {
        self.user = Some(user.into());
        self
    }

    /// Stop working at `at` (ms since the epoch).
    pub fn expires_at(mut self, at: UnixMillis) -> Self {
        self.expires_at = Some(at);
        self
    }

    /// Take at most `bytes` bytes (a write URL).
    pub fn max_bytes(mut self, bytes: u64) -> Self {
        self.max_bytes = Some(bytes);
        self
    }

    /// Refuse options no URL can be made of, before any effect: an empty, too long or
    /// NUL-carrying path or user, an expiry not in the future or beyond [`MAX_FILE_URL_TTL`].
    pub fn validate(&self, now: UnixMillis) -> crate::Result<()> {
        if self.path.is_empty() || self.path.len() > MAX_FILE_URL_PATH_BYTES {
            return Err(crate::Error::invalid(format!(
                "a signed file URL needs a path of 1 to {MAX_FILE_URL_PATH_BYTES} bytes"
            )));
        }
        if self.path.contains('\0') {
            return Err(crate::Error::invalid("a path cannot contain NUL"));
        }
        if let Some(user) = &self.user {
            if user.is_empty() || user.len() > 256 || user.contains('\0') {
                return Err(crate::Error::invalid(format!("bad user name {user:?}")));
            }
        }
        if let Some(at) = self.expires_at {
            let max = now.saturating_add(MAX_FILE_URL_TTL.as_millis() as u64);
            if at <= now || at > max {
                return Err(crate::Error::invalid(format!(
                    "a signed file URL must expire in the future and at most {}s from now \
                     (expires_at {at} is {})",
                    MAX_FILE_URL_TTL.as_secs(),
                    if at <= now { "past" } else { "too far" }
                )));
            }
        }
        Ok(())
    }
}

/// A signed file URL ([`Backend::create_file_url`](crate::Backend::create_file_url)). The URL
/// is the credential: whoever holds it may do its one operation on its one path, until it
/// expires or the sandbox is destroyed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct FileUrl {
    /// The URL: `GET` it (read) or `PUT`/`POST` to it (write).
    pub url: String,
    /// The path it is for.
    pub path: String,
    /// What it does.
    pub operation: FileUrlOperation,
    /// When it stops working; `None` lasts as long as the sandbox.
    pub expires_at: Option<UnixMillis>,
}

impl FileUrl {
    /// A URL record.
    pub fn new(url: String, grant: &FileGrant) -> Self {
        FileUrl {
            url,
            path: grant.path.clone(),
            operation: grant.operation,
            expires_at: grant.expires_at,
        }
    }
}

/// What a verified signed file URL allows: the content its signature covers. Whoever serves
/// signed URLs verifies one into this and checks each request against it
/// ([`FileGrant::check`]) before any effect.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileGrant {
    /// The sandbox.
    #[serde(rename = "s")]
    pub sandbox: String,
    /// The path.
    #[serde(rename = "p")]
    pub path: String,
    /// The operation.
    #[serde(rename = "o")]
    pub operation: FileUrlOperation,
    /// The user.
    #[serde(rename = "u", default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The expiry (ms since the epoch).
    #[serde(rename = "e", default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<UnixMillis>,
    /// The largest upload.
    #[serde(rename = "m", default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
    /// A random nonce, so two URLs for the same grant differ.
    #[serde(rename = "n", default)]
    pub nonce: String,
}

impl FileGrant {
    /// The grant of `options` for sandbox `sandbox`, with a fresh nonce.
    pub fn new(sandbox: impl Into<String>, options: &FileUrlOptions) -> Self {
        FileGrant {
            sandbox: sandbox.into(),
            path: options.path.clone(),
            operation: options.operation,
            user: options.user.clone(),
            expires_at: options.expires_at,
            max_bytes: options.max_bytes,
            nonce: random_id(16),
        }
    }

    /// Whether a request doing `operation` on `path` (`None`: the request names none and
    /// takes the grant's) at `now` is covered: an expired grant is
    /// [`Error::Unauthenticated`](crate::Error::Unauthenticated), another operation or path
    /// [`Error::Forbidden`](crate::Error::Forbidden).
    pub fn check(
        &self,
        operation: FileUrlOperation,
        path: Option<&str>,
        now: UnixMillis,
    ) -> crate::Result<()> {
        if self.expires_at.is_some_and(|at| at <= now) {
            return Err(crate::Error::Unauthenticated {
                message: "this signed file URL has expired".into(),
            });
        }
        if operation != self.operation {
            return Err(crate::Error::Forbidden {
                what: format!(
                    "this signed URL is for {}ing {}, not {}ing",
                    self.operation.name().trim_end_matches('e'),
                    self.path,
                    operation.name().trim_end_matches('e')
                ),
            });
        }
        if let Some(other) = path.filter(|p| *p != self.path) {
            return Err(crate::Error::Forbidden {
                what: format!("this signed URL is for {} only, not {other}", self.path),
            });
        }
        Ok(())
    }
}

/// A sandbox port reachable from the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Preview {
    /// Port inside the sandbox.
    pub port: u16,
    /// Base URL on the host, e.g. `http://127.0.0.1:41234`.
    pub url: String,
    /// Host and port of that URL, e.g. `127.0.0.1:41234`.
    pub host: String,
    /// Whether it needs no token.
    pub public: bool,
    /// The token of a private preview.
    pub token: Option<PreviewToken>,
    /// Header that carries the token.
    pub token_header: String,
    /// Query parameter that carries the token.
    pub token_query: String,
    /// Headers set on every request forwarded to the port ([`PreviewOptions::request_headers`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub request_headers: BTreeMap<String, String>,
    /// Headers set on every answer of the port ([`PreviewOptions::response_headers`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub response_headers: BTreeMap<String, String>,
}

/// Kind of a filesystem change seen by a watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FsEventKind {
    /// Created.
    Create,
    /// Written.
    Write,
    /// Removed.
    Remove,
    /// Renamed (reported for the old and the new name).
    Rename,
    /// Permissions changed.
    Chmod,
}

/// One filesystem change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsEvent {
    /// Absolute path of the entry that changed.
    pub path: String,
    /// Path relative to the watched directory.
    pub name: String,
    /// What happened.
    pub kind: FsEventKind,
}

/// Options for watching a directory.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct WatchOptions {
    /// Include subdirectories (also ones created later).
    pub recursive: bool,
    /// Watch as this sandbox user (see [`ReadOptions::user`]): the directories are looked up
    /// and watched with that user's permissions, so one the user may not read is refused.
    pub user: Option<String>,
    /// Report a file an API write creates as create, chmod, write — its ownership set
    /// between its creation and its content, the events E2B's daemon raises — instead of
    /// create, write. Writes of existing files and changes made by processes are reported
    /// as they happen either way.
    pub report_ownership: bool,
}

/// Size of a pseudo-terminal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PtySize {
    /// Columns.
    pub cols: u16,
    /// Rows.
    pub rows: u16,
}

/// Options for resizing a process's pseudo-terminal
/// ([`Backend::resize_pty`](crate::Backend::resize_pty)); made by [`ResizePtyOptions::new`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ResizePtyOptions {
    /// The terminal's new size.
    pub size: PtySize,
}

/// Resource usage of a sandbox at one moment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    /// When measured.
    pub timestamp: UnixMillis,
    /// CPU use in percent of one core, averaged since the previous sample.
    pub cpu_used_pct: f64,
    /// Cores available.
    pub cpu_count: u32,
    /// Resident memory of all sandbox processes, bytes.
    pub mem_used: u64,
    /// Memory available to the sandbox, bytes.
    pub mem_total: u64,
    /// Bytes used in the sandbox filesystem.
    pub disk_used: u64,
    /// Size of the sandbox filesystem, bytes.
    pub disk_total: u64,
}

/// Resource limits of a sandbox. `None` means the backend's default.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct Resources {
    /// CPU cores.
    pub cpu: Option<f64>,
    /// Memory in MiB.
    pub memory_mib: Option<u64>,
    /// Size of the sandbox's writable filesystem in MiB.
    pub disk_mib: Option<u64>,
    /// Maximum number of processes (the `RLIMIT_NPROC` of sandbox processes).
    pub max_processes: Option<u64>,
    /// Maximum open files per process (`RLIMIT_NOFILE`).
    pub max_open_files: Option<u64>,
}

/// Network access of a sandbox.
///
/// Vendor "internet on" defaults map to [`NetworkPolicy::Internet`] where the backend reports
/// [`Capabilities::internet`](crate::Capabilities::internet), else to [`NetworkPolicy::None`]
/// (see [`Capabilities::vendor_internet_default`](crate::Capabilities::vendor_internet_default)).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NetworkPolicy {
    /// Loopback only: a fresh network namespace with just `lo`. The default.
    #[default]
    None,
    /// Outbound internet from a fresh network namespace of its own, wired out through
    /// user-mode networking (`pasta`, Debian package `passt`). Nothing on the host is
    /// reachable through it: not the host's loopback (no gateway mapping, no port forwarding),
    /// not link-local addresses (cloud instance metadata), not private or special-purpose
    /// ranges (10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7, fe80::/10, …), not the
    /// subnets the host is attached to. DNS goes to the host's resolvers (port 53 only).
    /// No port of the sandbox is published; use previews for inbound traffic. Refused with
    /// [`Error::Unavailable`](crate::Error::Unavailable) where the helper is missing.
    Internet,
    /// The host's own network namespace: everything the host can reach, including its
    /// loopback services and the cloud metadata endpoint. An explicit opt-in for trusted
    /// code only; no facade ever picks it.
    Host,
}

/// Lifecycle state of a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SandboxState {
    /// Being set up.
    Starting,
    /// Accepting commands.
    Running,
    /// Frozen: processes and memory kept, nothing runs.
    Paused,
    /// Stopped on request ([`Backend::stop`](crate::Backend::stop)): every process ended,
    /// files kept, the lease paused; [`Backend::start`](crate::Backend::start) makes it
    /// `Running` again.
    Stopped,
    /// Broken: its agent died on its own, so its processes are gone and nothing can restart
    /// it; it can only be inspected and destroyed.
    Failed,
    /// Destroyed; reported only by calls racing with the destroy.
    Destroyed,
}

/// What a backend reports about a sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxInfo {
    /// Unique id, stable for the sandbox's life.
    pub id: String,
    /// The unique name given at creation ([`CreateOptions::name`]), if any.
    #[serde(default)]
    pub name: Option<String>,
    /// Current state.
    pub state: SandboxState,
    /// Template it was created from.
    pub template: String,
    /// Labels given at creation (or updated since).
    pub labels: BTreeMap<String, String>,
    /// Sandbox-wide environment variables.
    pub envs: BTreeMap<String, String>,
    /// Resource limits in force.
    pub resources: Resources,
    /// Network policy in force.
    pub network: NetworkPolicy,
    /// The default user.
    pub user: UserInfo,
    /// Creation time.
    pub created_at: UnixMillis,
    /// When the lease ends.
    pub ends_at: UnixMillis,
    /// What happens when the lease ends.
    #[serde(default)]
    pub on_timeout: TimeoutAction,
    /// Whether a paused sandbox resumes when work arrives for it.
    #[serde(default)]
    pub auto_resume: bool,
    /// Volumes mounted at creation.
    #[serde(default)]
    pub volumes: Vec<VolumeMount>,
    /// The snapshot it was created from, if any.
    #[serde(default)]
    pub snapshot: Option<String>,
    /// Key/values for programs that manage the sandbox (a facade's vendor attributes,
    /// session records, process names). They are held by the runtime outside the sandbox:
    /// nothing running inside can read or change them, they stay readable while the sandbox
    /// is paused, stopped or failed, and a fork gets a copy only because fork copies them
    /// explicitly. Change them with [`Backend::update_annotations`](crate::Backend::update_annotations).
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// Why the runtime can serve this sandbox only in part, if it cannot fully (e.g. it was
    /// created by a Sandcove version speaking another engine protocol): what still works and
    /// what to do. `None` for a sandbox served normally.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Set only on the answer of a fork: the fork was made, but its source, paused to copy
    /// its files, failed to resume (the error, in words). The source is left paused; resume
    /// or destroy it. As [`SnapshotInfo::source_resume_error`] for a snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_resume_error: Option<String>,
    /// Where a process starts when its call names no directory, if not the default user's
    /// home: the `WorkingDir` of the image the sandbox runs (vendors' "work dir").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
}

/// Options for moving the end of a sandbox's lease
/// ([`Backend::set_timeout`](crate::Backend::set_timeout)); made by
/// [`SetTimeoutOptions::new`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SetTimeoutOptions {
    /// The lease ends this long from now (within the runtime's
    /// [`LeaseBounds`](crate::LeaseBounds)).
    pub timeout: Duration,
}

/// Options for changing what the end of a sandbox's lease does
/// ([`Backend::set_on_timeout`](crate::Backend::set_on_timeout)); made by
/// [`SetOnTimeoutOptions::new`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SetOnTimeoutOptions {
    /// What the lease's end does from now on ([`CreateOptions::on_timeout`]).
    pub on_timeout: TimeoutAction,
}

/// Options for replacing a sandbox's labels
/// ([`Backend::set_labels`](crate::Backend::set_labels)); the default clears them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SetLabelsOptions {
    /// The new labels, replacing every old one.
    pub labels: BTreeMap<String, String>,
}

/// One atomic change to a sandbox's annotations ([`Backend::update_annotations`](crate::Backend::update_annotations)):
/// every expectation is checked, then `remove` and `set` are applied, all under one lock, or
/// nothing changes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct AnnotationUpdate {
    /// Compare-and-set: the current value each of these keys must have (`None`: the key must
    /// be absent). Any mismatch fails the whole update with
    /// [`Error::Conflict`](crate::Error::Conflict), so two programs updating the same record
    /// cannot lose each other's writes: re-read, merge, retry.
    pub expect: BTreeMap<String, Option<String>>,
    /// Keys to remove (absent keys are fine).
    pub remove: Vec<String>,
    /// Keys to set (applied after `remove`).
    pub set: BTreeMap<String, String>,
}

impl AnnotationUpdate {
    /// An update setting one key.
    pub fn set(key: impl Into<String>, value: impl Into<String>) -> Self {
        let mut update = AnnotationUpdate::default();
        update.set.insert(key.into(), value.into());
        update
    }

    /// An update removing one key.
    pub fn remove(key: impl Into<String>) -> Self {
        AnnotationUpdate {
            remove: vec![key.into()],
            ..Default::default()
        }
    }

    /// Also require `key` to hold `value` now (`None`: to be absent).
    pub fn expecting(mut self, key: impl Into<String>, value: Option<String>) -> Self {
        self.expect.insert(key.into(), value);
        self
    }

    /// Check what can be checked without the current map: every key named, and the keys and
    /// values to set on their own ([`check_annotations`]).
    pub fn validate(&self) -> crate::Result<()> {
        for key in self.expect.keys().chain(self.remove.iter()) {
            check_annotation_key(key)?;
        }
        check_annotations(&self.set)
    }

    /// Check every key named (expectations included) and apply the update to `current`,
    /// returning the new map; `current` is unchanged on any error. Backends call this under
    /// the lock that serializes updates.
    pub fn apply(
        &self,
        current: &BTreeMap<String, String>,
    ) -> crate::Result<BTreeMap<String, String>> {
        self.validate()?;
        for (key, want) in &self.expect {
            if current.get(key) != want.as_ref() {
                return Err(crate::Error::Conflict {
                    what: format!(
                        "annotation {key:?}: expected {}, found {}",
                        describe_value(want.as_deref()),
                        describe_value(current.get(key).map(String::as_str))
                    ),
                });
            }
        }
        let mut next = current.clone();
        for key in &self.remove {
            next.remove(key);
        }
        for (k, v) in &self.set {
            next.insert(k.clone(), v.clone());
        }
        check_annotations(&next)?;
        Ok(next)
    }
}

fn describe_value(v: Option<&str>) -> String {
    match v {
        None => "no value".into(),
        Some(v) if v.len() > 40 => format!("a value of {} bytes", v.len()),
        Some(v) => format!("{v:?}"),
    }
}

/// Longest annotation key, in bytes.
pub const MAX_ANNOTATION_KEY: usize = 128;
/// Largest annotation value, in bytes.
pub const MAX_ANNOTATION_VALUE: usize = 16 * 1024;
/// Most annotations one sandbox holds.
pub const MAX_ANNOTATIONS: usize = 1024;
/// Largest total of every annotation key and value of one sandbox, in bytes.
pub const MAX_ANNOTATIONS_BYTES: usize = 256 * 1024;

fn check_annotation_key(key: &str) -> crate::Result<()> {
    let ok = !key.is_empty()
        && key.len() <= MAX_ANNOTATION_KEY
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/' | b':'));
    if ok {
        Ok(())
    } else {
        Err(crate::Error::invalid(format!(
            "annotation key {:?} must be 1-{MAX_ANNOTATION_KEY} ASCII letters, digits, \
             '-', '_', '.', '/' or ':'",
            key.chars().take(MAX_ANNOTATION_KEY + 1).collect::<String>()
        )))
    }
}

/// Whether a whole annotation map is within the bounds: keys of 1 to
/// [`MAX_ANNOTATION_KEY`] bytes of ASCII letters, digits, `-`, `_`, `.`, `/` or `:`; values of
/// at most [`MAX_ANNOTATION_VALUE`] bytes without NUL; at most [`MAX_ANNOTATIONS`] entries
/// and [`MAX_ANNOTATIONS_BYTES`] in all. Beyond them: [`Error::InvalidArgument`](crate::Error::InvalidArgument).
pub fn check_annotations(map: &BTreeMap<String, String>) -> crate::Result<()> {
    if map.len() > MAX_ANNOTATIONS {
        return Err(crate::Error::invalid(format!(
            "a sandbox holds at most {MAX_ANNOTATIONS} annotations, this would be {}",
            map.len()
        )));
    }
    let mut total = 0usize;
    for (k, v) in map {
        check_annotation_key(k)?;
        if v.len() > MAX_ANNOTATION_VALUE || v.contains('\0') {
            return Err(crate::Error::invalid(format!(
                "annotation {k:?}: values hold at most {MAX_ANNOTATION_VALUE} bytes and no NUL \
                 (this one has {} bytes)",
                v.len()
            )));
        }
        total += k.len() + v.len();
    }
    if total > MAX_ANNOTATIONS_BYTES {
        return Err(crate::Error::invalid(format!(
            "annotations hold at most {MAX_ANNOTATIONS_BYTES} bytes in all, this would be {total}"
        )));
    }
    Ok(())
}

/// A user inside a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserInfo {
    /// Login name (`whoami`).
    pub name: String,
    /// Numeric uid inside the sandbox.
    pub uid: u32,
    /// Numeric gid inside the sandbox.
    pub gid: u32,
    /// Home directory.
    pub home: String,
}

/// Filter for listing sandboxes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct ListOptions {
    /// Only sandboxes carrying all of these labels with these values.
    pub labels: BTreeMap<String, String>,
    /// Only sandboxes in one of these states (empty: any).
    pub states: Vec<SandboxState>,
    /// Only the sandbox with this unique name ([`CreateOptions::name`]): a get by name,
    /// answering at most one sandbox.
    pub name: Option<String>,
}

impl ListOptions {
    /// Whether `info` passes this filter.
    pub fn matches(&self, info: &SandboxInfo) -> bool {
        let labels_ok = self
            .labels
            .iter()
            .all(|(k, v)| info.labels.get(k) == Some(v));
        let name_ok = self.name.is_none() || info.name == self.name;
        labels_ok && name_ok && (self.states.is_empty() || self.states.contains(&info.state))
    }
}

/// Longest sandbox name accepted ([`CreateOptions::name`]), in bytes.
pub const MAX_SANDBOX_NAME: usize = 63;

/// Whether `name` is an acceptable sandbox name: 1 to [`MAX_SANDBOX_NAME`] ASCII letters,
/// digits, `-`, `_` or `.`, starting with a letter or digit. Case matters (`A` and `a` are
/// different names). The form fits a file name, a DNS label (without `_`/`.`) and every
/// vendor's naming rules this project translates.
pub fn valid_sandbox_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= MAX_SANDBOX_NAME
        && bytes[0].is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// What to run: an argv (never through an implicit shell) or an explicit shell script.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Command {
    /// Program and arguments, executed directly. The program is looked up on `PATH`.
    Argv(Vec<String>),
    /// A script run as `<shell> -c <script>`; `login` adds `-l`.
    Shell {
        /// The script text.
        script: String,
        /// The shell binary, e.g. `/bin/sh` or `/bin/bash`.
        shell: String,
        /// Run as a login shell (`-l`).
        login: bool,
    },
}

impl Command {
    /// An argv command.
    pub fn argv<I, S>(argv: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Command::Argv(argv.into_iter().map(Into::into).collect())
    }

    /// A script for `/bin/sh -c`.
    pub fn sh(script: impl Into<String>) -> Self {
        Command::Shell {
            script: script.into(),
            shell: "/bin/sh".into(),
            login: false,
        }
    }

    /// A script for `/bin/bash -l -c`, as several vendors run command strings.
    pub fn bash_login(script: impl Into<String>) -> Self {
        Command::Shell {
            script: script.into(),
            shell: "/bin/bash".into(),
            login: true,
        }
    }

    /// The argv this command executes.
    pub fn to_argv(&self) -> Vec<String> {
        match self {
            Command::Argv(v) => v.clone(),
            Command::Shell {
                script,
                shell,
                login,
            } => {
                let mut v = vec![shell.clone()];
                if *login {
                    v.push("-l".into());
                }
                v.push("-c".into());
                v.push(script.clone());
                v
            }
        }
    }
}

/// A process to start in a sandbox: `ProcessSpec::new(command)` then setters
/// (`ProcessSpec::new(Command::sh("make")).cwd("/src").env("CC", "clang")`), or a command line
/// (`"make".into()`). `#[non_exhaustive]`, like every option struct (see [`CreateOptions`]):
///
/// ```compile_fail,E0639
/// let spec = sandcove_core::ProcessSpec {
///     command: sandcove_core::Command::sh("true"),
///     cwd: None,
///     envs: Default::default(),
///     user: None,
///     tag: None,
///     stdin: false,
///     timeout: None,
///     pty: None,
///     restart: None,
/// };
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ProcessSpec {
    /// What to run.
    pub command: Command,
    /// Working directory; `None` is the user's home.
    pub cwd: Option<String>,
    /// Per-process environment; wins over the sandbox's envs.
    pub envs: BTreeMap<String, String>,
    /// User to run as; `None` is the sandbox's default user.
    pub user: Option<String>,
    /// A name to find the process by later (unique among running processes).
    pub tag: Option<String>,
    /// Keep stdin open for [`Backend::write_stdin`](crate::Backend::write_stdin); otherwise
    /// the process reads end-of-file at once.
    pub stdin: bool,
    /// Kill the process group after this long and report [`ExitStatus::timed_out`].
    #[serde(with = "opt_duration_secs")]
    pub timeout: Option<Duration>,
    /// Run on a pseudo-terminal of this size: stdout carries the terminal's output, stdin
    /// is its input, there is no separate stderr.
    #[serde(default)]
    pub pty: Option<PtySize>,
    /// Restart the process when it fails (see [`RestartPolicy`]); `None` never restarts.
    #[serde(default)]
    pub restart: Option<RestartPolicy>,
}

/// Restart-on-failure, run by the engine: when an incarnation of the process fails, a new
/// one is started from the same spec [`RESTART_DELAY`] later, up to `max_restarts` times.
///
/// What a caller sees: one logical process. Its streams (spawn and attach) carry every
/// incarnation's output in order, a [`ProcessEvent::Restarted`] between two incarnations, and
/// one [`ProcessEvent::Exit`] at the very end (the last incarnation's status).
/// [`ProcessInfo::pid`] stays the first incarnation's pid (selectors by that pid and by tag
/// keep working); [`ProcessInfo::current_pid`] and [`ProcessInfo::restarts`] show the
/// incarnation running now. Signals and stdin go to the current incarnation.
///
/// "Failure" is an exit with a non-zero code or by a signal, except when the process was
/// signalled through the API ([`Backend::signal`](crate::Backend::signal), other than
/// `STOP`/`CONT`) or killed by its [`ProcessSpec::timeout`] (which covers all incarnations
/// together): those end it for good. A process with a restart policy cannot use a `pty`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct RestartPolicy {
    /// Most restarts; `None` is unlimited.
    pub max_restarts: Option<u32>,
}

/// How long the engine waits after a failed incarnation before starting the next one (so a
/// program that fails at once cannot spin).
pub const RESTART_DELAY: Duration = Duration::from_secs(1);

impl ProcessSpec {
    /// A spec with defaults for everything but the command.
    pub fn new(command: Command) -> Self {
        ProcessSpec {
            command,
            cwd: None,
            envs: BTreeMap::new(),
            user: None,
            tag: None,
            stdin: false,
            timeout: None,
            pty: None,
            restart: None,
        }
    }

    /// Set the working directory.
    pub fn cwd(mut self, cwd: impl Into<String>) -> Self {
        self.cwd = Some(cwd.into());
        self
    }

    /// Add an environment variable.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.envs.insert(key.into(), value.into());
        self
    }

    /// Set the user.
    pub fn user(mut self, user: impl Into<String>) -> Self {
        self.user = Some(user.into());
        self
    }

    /// Set the tag.
    pub fn tag(mut self, tag: impl Into<String>) -> Self {
        self.tag = Some(tag.into());
        self
    }

    /// Keep stdin open.
    pub fn stdin(mut self, open: bool) -> Self {
        self.stdin = open;
        self
    }

    /// Set the timeout.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitStatus {
    /// Exit code, when it exited normally.
    pub code: Option<i32>,
    /// Signal number, when a signal ended it.
    pub signal: Option<i32>,
    /// It was killed because its [`ProcessSpec::timeout`] ran out.
    pub timed_out: bool,
}

impl ExitStatus {
    /// Exited with code 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }

    /// The name of the signal that ended the process (`"SIGKILL"`), when a signal did.
    pub fn signal_name(&self) -> Option<&'static str> {
        self.signal.map(signal_name)
    }

    /// The shell convention: the code, or 128 + the signal number.
    pub fn code_or_signal(&self) -> i32 {
        match (self.code, self.signal) {
            (Some(c), _) => c,
            (None, Some(s)) => 128 + s,
            (None, None) => -1,
        }
    }
}

/// How it ended, in words: `exited with code 3`, `killed by signal 9 (SIGKILL)`, with
/// `after its timeout` when [`ExitStatus::timed_out`].
impl std::fmt::Display for ExitStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.code, self.signal) {
            (Some(code), _) => write!(f, "exited with code {code}")?,
            (None, Some(sig)) => write!(f, "killed by signal {sig} ({})", signal_name(sig))?,
            (None, None) => write!(f, "ended without a status")?,
        }
        if self.timed_out {
            write!(f, " after its timeout")?;
        }
        Ok(())
    }
}

/// The conventional name of Linux signal `number` (`"SIGKILL"`); `"SIG?"` for one without a
/// name here (a real-time signal).
pub fn signal_name(number: i32) -> &'static str {
    match number {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGSTKFLT => "SIGSTKFLT",
        libc::SIGCHLD => "SIGCHLD",
        libc::SIGCONT => "SIGCONT",
        libc::SIGSTOP => "SIGSTOP",
        libc::SIGTSTP => "SIGTSTP",
        libc::SIGTTIN => "SIGTTIN",
        libc::SIGTTOU => "SIGTTOU",
        libc::SIGURG => "SIGURG",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGVTALRM => "SIGVTALRM",
        libc::SIGPROF => "SIGPROF",
        libc::SIGWINCH => "SIGWINCH",
        libc::SIGIO => "SIGIO",
        libc::SIGPWR => "SIGPWR",
        libc::SIGSYS => "SIGSYS",
        _ => "SIG?",
    }
}

/// One event in the life of a process. Offsets count bytes per stream since the start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessEvent {
    /// The process started (or, on attach, is running) with this pid.
    Start {
        /// Pid inside the sandbox.
        pid: u32,
    },
    /// Bytes the process wrote to stdout.
    Stdout(Vec<u8>),
    /// Bytes the process wrote to stderr.
    Stderr(Vec<u8>),
    /// Only on [`Backend::attach`](crate::Backend::attach), exactly once: the retained history
    /// (any [`ProcessEvent::Gap`], output and restarts) ends here, and every later event happens
    /// live. It comes before [`ProcessEvent::Exit`], also when the process had already ended
    /// (then `Exit` follows at once). [`Backend::spawn`](crate::Backend::spawn) never emits it.
    /// "Logs so far" is the output before this marker: no timing guess is needed.
    Live,
    /// A process with a [`RestartPolicy`] failed and was started again: `previous` is how the
    /// last incarnation ended, `pid` the new incarnation's pid, `restarts` how many restarts
    /// there have been so far (1 for the first). Kept in the history, so attach replays it in
    /// place.
    Restarted {
        /// Pid of the new incarnation.
        pid: u32,
        /// Restarts so far.
        restarts: u32,
        /// How the previous incarnation ended.
        previous: ExitStatus,
    },
    /// Earlier output was dropped from the backend's retained history before this attach:
    /// `bytes` is how much, per stream, is missing.
    Gap {
        /// Missing stdout bytes.
        stdout: u64,
        /// Missing stderr bytes.
        stderr: u64,
    },
    /// The process ended. Always the last event.
    Exit(ExitStatus),
}

/// Which stream of a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StreamKind {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// Collected output of a finished process.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Output {
    /// Pid the process had.
    pub pid: u32,
    /// Standard output bytes, exactly as written (up to the limit).
    pub stdout: Vec<u8>,
    /// Standard error bytes, exactly as written (up to the limit).
    pub stderr: Vec<u8>,
    /// How it ended.
    pub status: Option<ExitStatus>,
    /// Output past the collection limit was dropped; the process still ran to the end.
    pub truncated: bool,
}

impl Output {
    /// The exit status; `Output` values built by this crate always carry one.
    pub fn exit_status(&self) -> ExitStatus {
        self.status.unwrap_or(ExitStatus {
            code: None,
            signal: None,
            timed_out: false,
        })
    }

    /// The exit code (128 + signal when a signal ended it).
    pub fn exit_code(&self) -> i32 {
        self.exit_status().code_or_signal()
    }

    /// Stdout decoded as UTF-8, invalid sequences replaced. Use [`Output::stdout`] for bytes.
    pub fn stdout_lossy(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// Stderr decoded as UTF-8, invalid sequences replaced.
    pub fn stderr_lossy(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}

/// A process the sandbox knows about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessInfo {
    /// Pid inside the sandbox.
    pub pid: u32,
    /// Tag given at start.
    pub tag: Option<String>,
    /// The argv it runs.
    pub argv: Vec<String>,
    /// Its working directory.
    pub cwd: String,
    /// Its per-process envs.
    pub envs: BTreeMap<String, String>,
    /// When it started.
    pub started_at: UnixMillis,
    /// How it ended, if it has.
    pub exit: Option<ExitStatus>,
    /// When it ended, if it has (for good: a process being restarted has not ended).
    #[serde(default)]
    pub ended_at: Option<UnixMillis>,
    /// Pid of the incarnation running now (differs from `pid` after a restart; the last
    /// incarnation's pid once it has ended).
    #[serde(default)]
    pub current_pid: u32,
    /// Restarts so far under its [`RestartPolicy`].
    #[serde(default)]
    pub restarts: u32,
    /// Its restart policy, if any.
    #[serde(default)]
    pub restart: Option<RestartPolicy>,
}

/// Where to attach: a pid or a tag.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessSelector {
    /// By pid.
    Pid(u32),
    /// By the tag given at start.
    Tag(String),
}

/// A POSIX signal to send to a process (its whole process group).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Signal {
    /// Hang up.
    Hup,
    /// Interrupt (Ctrl-C).
    Int,
    /// Quit.
    Quit,
    /// Kill, cannot be caught.
    Kill,
    /// Polite termination.
    Term,
    /// User 1.
    Usr1,
    /// User 2.
    Usr2,
    /// Stop.
    Stop,
    /// Continue.
    Cont,
}

impl Signal {
    /// The Linux signal number.
    pub fn number(self) -> i32 {
        match self {
            Signal::Hup => libc::SIGHUP,
            Signal::Int => libc::SIGINT,
            Signal::Quit => libc::SIGQUIT,
            Signal::Kill => libc::SIGKILL,
            Signal::Term => libc::SIGTERM,
            Signal::Usr1 => libc::SIGUSR1,
            Signal::Usr2 => libc::SIGUSR2,
            Signal::Stop => libc::SIGSTOP,
            Signal::Cont => libc::SIGCONT,
        }
    }
}

/// Options for signalling a process ([`Backend::signal`](crate::Backend::signal)); made by
/// [`SignalOptions::new`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SignalOptions {
    /// The signal, sent to the process's whole process group.
    pub signal: Signal,
}

/// Options for writing to a process's stdin
/// ([`Backend::write_stdin`](crate::Backend::write_stdin)); made by
/// [`WriteStdinOptions::new`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WriteStdinOptions {
    /// The bytes to write.
    pub data: Vec<u8>,
}

/// Kind of a filesystem entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    /// Regular file.
    File,
    /// Directory.
    Dir,
    /// Symbolic link (not followed).
    Symlink,
    /// Anything else (socket, fifo, device).
    Other,
}

/// Metadata of one filesystem entry. Symlinks are reported, not followed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStat {
    /// Absolute path inside the sandbox.
    pub path: String,
    /// Last path component.
    pub name: String,
    /// Entry kind.
    pub kind: FileKind,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits (`0o7777` mask).
    pub mode: u32,
    /// Owner uid inside the sandbox.
    pub uid: u32,
    /// Owner gid inside the sandbox.
    pub gid: u32,
    /// Owner name, when the sandbox's user database knows it.
    pub owner: String,
    /// Group name, when known.
    pub group: String,
    /// Modification time.
    pub modified: UnixMillis,
    /// Where a symlink points, verbatim.
    pub symlink_target: Option<String>,
    /// The entry's extended attributes in the `user.` namespace (`user.origin` → its value),
    /// read when the call asks for them ([`StatOptions::attributes`],
    /// [`ListDirOptions::attributes`]) and reported by a write that set some
    /// ([`WriteOptions::attributes`], read back from the file). `None` when not asked for,
    /// and for an entry whose attributes the acting user may not read (reading them opens the
    /// entry, so the kernel checks read permission on it). An empty map: none set, a
    /// symbolic link or special file (never opened: they have none here), or a filesystem
    /// without user attributes. Attributes whose name is not UTF-8, and those past the bounds
    /// of [`validate`](crate::validate) ([`MAX_FILE_ATTRIBUTES`](crate::validate::MAX_FILE_ATTRIBUTES),
    /// [`MAX_FILE_ATTRIBUTE_BYTES`](crate::validate::MAX_FILE_ATTRIBUTE_BYTES)) in name order,
    /// are left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attributes: Option<FileAttributes>,
}

/// Extended attributes of a file: full names in the `user.` namespace (`user.origin`) to
/// their values (bytes, as the kernel keeps them).
pub type FileAttributes = BTreeMap<String, Vec<u8>>;

fn is_false(b: &bool) -> bool {
    !*b
}

/// Options for listing a directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ListDirOptions {
    /// 1 lists the directory's own entries; n descends n-1 levels below it.
    pub depth: u32,
    /// List as this sandbox user (see [`ReadOptions::user`]); `None` as the file API's own
    /// identity.
    #[serde(default)]
    pub user: Option<String>,
    /// Also read each entry's extended attributes in the `user.` namespace into
    /// [`FileStat::attributes`] (as the listing user: see there). Off by default: it opens
    /// every regular file and directory listed.
    #[serde(default, skip_serializing_if = "is_false")]
    pub attributes: bool,
}

impl Default for ListDirOptions {
    fn default() -> Self {
        ListDirOptions {
            depth: 1,
            user: None,
            attributes: false,
        }
    }
}

/// Options for reading a file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct ReadOptions {
    /// Read as this sandbox user: the kernel checks that user's permissions (a file only root
    /// may read is [`Error::PermissionDenied`](crate::Error::PermissionDenied)). `None` reads
    /// with the file API's own identity, the sandbox's root, as before. An unknown user is an
    /// error before anything is touched (and a user other than the default is
    /// [`Error::NotSupported`](crate::Error::NotSupported) where the sandbox has one uid).
    pub user: Option<String>,
    /// Refuse a file larger than this many bytes with
    /// [`Error::FileTooLarge`](crate::Error::FileTooLarge) before any byte is sent. `None`
    /// streams any size; `Sandbox::read` sets it to the in-memory
    /// bound ([`DEFAULT_MEMORY_FILE_BYTES`] unless configured).
    pub max_bytes: Option<u64>,
}

/// Options for describing one path.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct StatOptions {
    /// Look the path up as this sandbox user (see [`ReadOptions::user`]): a path under a
    /// directory the user may not search is refused.
    pub user: Option<String>,
    /// Also read the entry's extended attributes in the `user.` namespace into
    /// [`FileStat::attributes`] (as the acting user: see there).
    #[serde(skip_serializing_if = "is_false")]
    pub attributes: bool,
}

/// Options for writing a file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct WriteOptions {
    /// Create missing parent directories.
    pub create_parents: bool,
    /// Permission bits for a new file.
    pub mode: Option<u32>,
    /// Append instead of replacing.
    pub append: bool,
    /// Write as this sandbox user (see [`ReadOptions::user`]): the kernel checks its
    /// permissions on the directories and on an existing target, and new files and
    /// directories are that user's. `None` writes with the file API's own identity and gives
    /// new entries to the sandbox's default user. Replacing an existing file as a user who does
    /// not own it leaves the new file owned by that user.
    pub user: Option<String>,
    /// Replace an existing file (the default). `false` refuses to clobber anything at the
    /// path with [`Error::AlreadyExists`](crate::Error::AlreadyExists): the check is the
    /// landing itself (`O_EXCL` for an append, `renameat2(RENAME_NOREPLACE)` for a write),
    /// never a look followed by an act, and a refused write leaves no trace.
    pub overwrite: bool,
    /// Refuse more than this many bytes with
    /// [`Error::FileTooLarge`](crate::Error::FileTooLarge) (nothing is kept). `None` takes
    /// the backend's own bound ([`Capabilities::max_file_bytes`](crate::Capabilities)).
    pub max_bytes: Option<u64>,
    /// Extended attributes to give the file: names in the `user.` namespace only
    /// (`user.origin`), within the bounds of [`validate`](crate::validate)
    /// ([`WriteOptions::validate`]). A write lands a new file, so afterwards the file has
    /// exactly these (none of the file it replaced); an append sets them on the existing file,
    /// replacing same-named ones and keeping the others. They are set before the file lands
    /// (before an append's first byte), so where the filesystem refuses user attributes the
    /// write is [`Error::NotSupported`](crate::Error::NotSupported) and nothing changes. A write
    /// that sets some reports them in [`FileStat::attributes`]; a rename keeps them.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub attributes: FileAttributes,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions {
            create_parents: true,
            mode: None,
            append: false,
            user: None,
            overwrite: true,
            max_bytes: None,
            attributes: BTreeMap::new(),
        }
    }
}

/// Options for renaming (moving) a path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct RenameOptions {
    /// Replace an existing file (or empty directory) at the destination (the default).
    /// `false` refuses with [`Error::AlreadyExists`](crate::Error::AlreadyExists) when
    /// anything has that name, atomically (`renameat2(RENAME_NOREPLACE)`).
    pub overwrite: bool,
    /// Rename as this sandbox user (see [`ReadOptions::user`]): the kernel checks that
    /// user's permissions on both directories (and the sticky bit).
    pub user: Option<String>,
}

impl Default for RenameOptions {
    fn default() -> Self {
        RenameOptions {
            overwrite: true,
            user: None,
        }
    }
}

/// Options for copying a file or a directory tree inside a sandbox.
///
/// A copy streams beneath the sandbox root (no file is ever held in memory): symlinks are
/// copied as symlinks at every level, never followed; permission bits are kept (set-id bits
/// dropped); new entries belong to the acting user. A file or a whole new tree lands at the
/// destination by one rename, so a failed copy leaves nothing behind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct CopyOptions {
    /// Copy a directory with its contents; without it a directory source is
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument).
    pub recursive: bool,
    /// Replace what is at the destination (the default): a file is replaced atomically, a
    /// directory source is merged into an existing directory. `false` refuses with
    /// [`Error::AlreadyExists`](crate::Error::AlreadyExists) when anything has the
    /// destination's name (checked by the landing rename, `RENAME_NOREPLACE`).
    pub overwrite: bool,
    /// Copy as this sandbox user (see [`ReadOptions::user`]).
    pub user: Option<String>,
}

impl Default for CopyOptions {
    fn default() -> Self {
        CopyOptions {
            recursive: false,
            overwrite: true,
            user: None,
        }
    }
}

/// Default bound of the in-memory file calls (`Sandbox::read`,
/// `Sandbox::write`): 1 MiB. Raise it per call
/// ([`ReadOptions::max_bytes`], [`WriteOptions::max_bytes`]) or per client
/// (`Client::with_memory_file_bytes`), up to
/// [`MAX_MEMORY_FILE_BYTES`]; stream anything larger.
pub const DEFAULT_MEMORY_FILE_BYTES: u64 = 1 << 20;

/// Largest bound the in-memory file calls accept: 256 MiB. Larger files go through
/// `Sandbox::read_stream` and
/// `Sandbox::write_stream`.
pub const MAX_MEMORY_FILE_BYTES: u64 = 256 << 20;

/// Options for creating a directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct MkdirOptions {
    /// Create missing parents, and succeed when the directory exists.
    pub parents: bool,
    /// Permission bits.
    pub mode: Option<u32>,
    /// Make the directories as this sandbox user (see [`ReadOptions::user`]): the kernel
    /// checks its permissions, and what is made is that user's. `None` makes them with the file
    /// API's own identity, owned by the sandbox's default user.
    pub user: Option<String>,
}

impl Default for MkdirOptions {
    fn default() -> Self {
        MkdirOptions {
            parents: true,
            mode: None,
            user: None,
        }
    }
}

/// Options for removing a path.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct RemoveOptions {
    /// Remove directories with their contents.
    pub recursive: bool,
    /// Remove as this sandbox user (see [`ReadOptions::user`]): the kernel checks that user's
    /// permissions on the directories it removes from.
    pub user: Option<String>,
}

/// Options for changing a path's permission bits
/// ([`Backend::chmod`](crate::Backend::chmod)); made by [`ChmodOptions::new`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ChmodOptions {
    /// The new permission bits (at most `0o7777`).
    pub mode: u32,
}

/// Serde helper: `Option<Duration>` as fractional seconds.
pub(crate) mod opt_duration_secs {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(v: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(d) => s.serialize_some(&d.as_secs_f64()),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let v: Option<f64> = Option::deserialize(d)?;
        match v {
            None => Ok(None),
            Some(x) if x.is_finite() && (0.0..1e12).contains(&x) => {
                Ok(Some(Duration::from_secs_f64(x)))
            }
            Some(x) => Err(serde::de::Error::custom(format!(
                "duration must be between 0 and 1e12 seconds, got {x}"
            ))),
        }
    }
}

impl From<&str> for ProcessSpec {
    /// A shell command line (`sh -c`).
    fn from(script: &str) -> Self {
        ProcessSpec::new(Command::sh(script))
    }
}

impl From<String> for ProcessSpec {
    /// A shell command line (`sh -c`).
    fn from(script: String) -> Self {
        ProcessSpec::new(Command::sh(script))
    }
}

impl From<Command> for ProcessSpec {
    fn from(command: Command) -> Self {
        ProcessSpec::new(command)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_ids_have_the_length_and_alphabet_asked_for_and_differ() {
        let ids: Vec<String> = (0..50).map(|_| random_id(20)).collect();
        for id in &ids {
            assert_eq!(id.len(), 20);
            assert!(id
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()));
        }
        let mut unique = ids.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), ids.len());
        assert_eq!(random_id(0), "");
        assert_eq!(random_id(200).len(), 200);
    }

    #[test]
    fn shell_commands_render_their_argv() {
        assert_eq!(
            Command::bash_login("echo hi").to_argv(),
            ["/bin/bash", "-l", "-c", "echo hi"]
        );
        assert_eq!(Command::sh("x").to_argv(), ["/bin/sh", "-c", "x"]);
        assert_eq!(Command::argv(["ls", "-l"]).to_argv(), ["ls", "-l"]);
    }

    #[test]
    fn exit_status_uses_the_shell_convention_for_signals() {
        let s = ExitStatus {
            code: None,
            signal: Some(9),
            timed_out: false,
        };
        assert_eq!(s.code_or_signal(), 137);
        assert!(!s.success());
    }

    #[test]
    fn unknown_option_fields_are_refused_not_ignored() {
        assert!(serde_json::from_str::<CreateOptions>(r#"{"tmeout": 5}"#).is_err());
        assert!(serde_json::from_str::<WriteOptions>(r#"{"mode": 420, "owner": "x"}"#).is_err());
        assert!(serde_json::from_str::<CreateOptions>(r#"{"timeout": 5}"#).is_ok());
    }

    #[test]
    fn durations_reject_negative_and_absurd_values() {
        let ok: ProcessSpec = serde_json::from_str(
            r#"{"command":{"argv":["true"]},"cwd":null,"envs":{},"user":null,"tag":null,"stdin":false,"timeout":1.5}"#,
        )
        .unwrap();
        assert_eq!(ok.timeout, Some(Duration::from_millis(1500)));
        for bad in ["-1", "1e300"] {
            let text = format!(
                r#"{{"command":{{"argv":["true"]}},"cwd":null,"envs":{{}},"user":null,"tag":null,"stdin":false,"timeout":{bad}}}"#
            );
            assert!(serde_json::from_str::<ProcessSpec>(&text).is_err(), "{bad}");
        }
    }
}
