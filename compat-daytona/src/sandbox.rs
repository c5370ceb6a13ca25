//! Python `Sandbox`: public fields, lifecycle, labels, intervals and previews.

use std::collections::HashMap;
use std::time::Duration;

use sandcove::{Client, PreviewOptions, SandboxInfo};

use crate::client::{with_timeout, DaytonaConfig};
use crate::ctx::{meta_of, Ctx, Meta};
use crate::errors::{Context, DaytonaError};
use crate::fs::FileSystem;
use crate::gaps::gap;
use crate::git::Git;
use crate::process::Process;
use crate::translate::{self, META_PREFIX};
use crate::{awaitable, Result};

/// Header carrying a preview token, as on Daytona.
pub const PREVIEW_TOKEN_HEADER: &str = "x-daytona-preview-token";
/// Query parameter carrying a signed preview token.
pub const PREVIEW_TOKEN_QUERY: &str = "daytona_preview_token";

/// Python `SandboxState` (wire strings in [`SandboxState::as_str`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum SandboxState {
    Creating,
    Restoring,
    Destroyed,
    Destroying,
    Started,
    Stopped,
    Starting,
    Stopping,
    Error,
    BuildFailed,
    PendingBuild,
    BuildingSnapshot,
    Unknown,
    PullingSnapshot,
    Archived,
    Archiving,
    Resizing,
    Snapshotting,
    Forking,
    Pausing,
    Paused,
    Resuming,
}

#[allow(non_upper_case_globals)]
impl SandboxState {
    /// Python's `SandboxState.STARTED` spelling.
    pub const STARTED: SandboxState = SandboxState::Started;
    /// Python's `SandboxState.STOPPED` spelling.
    pub const STOPPED: SandboxState = SandboxState::Stopped;
    /// Python's `SandboxState.ARCHIVED` spelling.
    pub const ARCHIVED: SandboxState = SandboxState::Archived;

    /// The wire string, e.g. `started`.
    pub fn as_str(self) -> &'static str {
        use SandboxState::*;
        match self {
            Creating => "creating",
            Restoring => "restoring",
            Destroyed => "destroyed",
            Destroying => "destroying",
            Started => "started",
            Stopped => "stopped",
            Starting => "starting",
            Stopping => "stopping",
            Error => "error",
            BuildFailed => "build_failed",
            PendingBuild => "pending_build",
            BuildingSnapshot => "building_snapshot",
            Unknown => "unknown",
            PullingSnapshot => "pulling_snapshot",
            Archived => "archived",
            Archiving => "archiving",
            Resizing => "resizing",
            Snapshotting => "snapshotting",
            Forking => "forking",
            Pausing => "pausing",
            Paused => "paused",
            Resuming => "resuming",
        }
    }
}

impl SandboxState {
    /// Every state, in declaration order (a test checks it against the enum).
    pub const ALL: [SandboxState; 22] = {
        use SandboxState::*;
        [
            Creating,
            Restoring,
            Destroyed,
            Destroying,
            Started,
            Stopped,
            Starting,
            Stopping,
            Error,
            BuildFailed,
            PendingBuild,
            BuildingSnapshot,
            Unknown,
            PullingSnapshot,
            Archived,
            Archiving,
            Resizing,
            Snapshotting,
            Forking,
            Pausing,
            Paused,
            Resuming,
        ]
    };
}

impl std::str::FromStr for SandboxState {
    type Err = DaytonaError;

    /// The state a wire string (`started`, `build_failed`, …) names.
    fn from_str(text: &str) -> std::result::Result<Self, DaytonaError> {
        SandboxState::ALL
            .into_iter()
            .find(|s| s.as_str() == text)
            .ok_or_else(|| DaytonaError::validation(format!("unknown sandbox state {text:?}")))
    }
}

impl std::fmt::Display for SandboxState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The Daytona state of a runtime sandbox: the runtime's state, with the facade's archived
/// flag telling a stopped sandbox from an archived one.
pub(crate) fn state_of(state: sandcove::SandboxState, meta: &Meta) -> SandboxState {
    match state {
        sandcove::SandboxState::Running => SandboxState::Started,
        sandcove::SandboxState::Starting => SandboxState::Starting,
        sandcove::SandboxState::Paused => SandboxState::Paused,
        sandcove::SandboxState::Stopped if meta.archived => SandboxState::Archived,
        sandcove::SandboxState::Stopped => SandboxState::Stopped,
        sandcove::SandboxState::Failed => SandboxState::Error,
        sandcove::SandboxState::Destroyed => SandboxState::Destroyed,
    }
}

/// Python `PortPreviewUrl`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortPreviewUrl {
    /// `sandbox_id`.
    pub sandbox_id: String,
    /// `url`: where the port answers.
    pub url: String,
    /// `token`: send it in the `x-daytona-preview-token` header (empty for public sandboxes).
    pub token: String,
}

/// Python `SignedPortPreviewUrl`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedPortPreviewUrl {
    /// `sandbox_id`.
    pub sandbox_id: String,
    /// `port`.
    pub port: i64,
    /// `token`.
    pub token: String,
    /// `url`: works with no headers (the token is in the query).
    pub url: String,
}

/// Python `sandbox.code_interpreter`: a gap here (see `MAPPING.md`).
#[derive(Debug, Clone, Default)]
pub struct CodeInterpreter {}

impl CodeInterpreter {
    /// `run_code(code, ...)`: not supported; use `process.code_run` or a session.
    pub async fn run_code(&self, _code: &str) -> Result<()> {
        Err(gap("code_interpreter"))
    }
}

/// Python `sandbox.computer_use`: a gap here (see `MAPPING.md`).
#[derive(Debug, Clone, Default)]
pub struct ComputerUse {}

impl ComputerUse {
    /// `start()`: not supported (no desktop).
    pub async fn start(&self) -> Result<()> {
        Err(gap("computer_use"))
    }
}

/// Python `Sandbox`: the public fields of the API's sandbox DTO, and its sub-APIs.
#[derive(Debug, Clone)]
pub struct Sandbox {
    /// `id`.
    pub id: String,
    /// `name` (the id unless one was given).
    pub name: String,
    /// `organization_id`: from the config; when unset, the runtime's identity (one stable id
    /// per server).
    pub organization_id: String,
    /// `snapshot` the sandbox was created from.
    pub snapshot: Option<String>,
    /// `user`: the OS user (`daytona`).
    pub user: String,
    /// `env`: sandbox-wide environment.
    pub env: Option<HashMap<String, String>>,
    /// `labels` (including `code-toolbox-language`).
    pub labels: HashMap<String, String>,
    /// `public`: preview links need no token.
    pub public: bool,
    /// `target` region (from the config; `local` when unset).
    pub target: String,
    /// `cpu` (vCPUs).
    pub cpu: f64,
    /// `gpu`.
    pub gpu: f64,
    /// `memory` in GiB.
    pub memory: f64,
    /// `disk` in GiB.
    pub disk: f64,
    /// `state`.
    pub state: Option<SandboxState>,
    /// `error_reason`.
    pub error_reason: Option<String>,
    /// `recoverable`.
    pub recoverable: Option<bool>,
    /// `backup_state` (always `None`).
    pub backup_state: Option<String>,
    /// `backup_created_at` (always `None`).
    pub backup_created_at: Option<String>,
    /// `auto_stop_interval` in minutes.
    pub auto_stop_interval: Option<f64>,
    /// `auto_archive_interval` in minutes.
    pub auto_archive_interval: Option<f64>,
    /// `auto_delete_interval` in minutes (negative = disabled).
    pub auto_delete_interval: Option<f64>,
    /// `network_block_all`.
    pub network_block_all: Option<bool>,
    /// `network_allow_list` (always `None`).
    pub network_allow_list: Option<String>,
    /// `domain_allow_list` (always `None`).
    pub domain_allow_list: Option<String>,
    /// `created_at` (RFC 3339).
    pub created_at: Option<String>,
    /// `updated_at` (RFC 3339).
    pub updated_at: Option<String>,
    /// `last_activity_at` (RFC 3339).
    pub last_activity_at: Option<String>,
    /// `toolbox_proxy_url` (empty: there is no proxy).
    pub toolbox_proxy_url: String,
    /// `sandbox.fs`.
    pub fs: FileSystem,
    /// `sandbox.git`.
    pub git: Git,
    /// `sandbox.process`.
    pub process: Process,
    /// `sandbox.code_interpreter` (a gap).
    pub code_interpreter: CodeInterpreter,
    /// `sandbox.computer_use` (a gap).
    pub computer_use: ComputerUse,
    pub(crate) ctx: Ctx,
    pub(crate) meta: Meta,
    organization: Option<String>,
    target_config: Option<String>,
}

impl Sandbox {
    pub(crate) fn from_parts(
        client: Client,
        config: &DaytonaConfig,
        info: SandboxInfo,
        meta: Meta,
    ) -> Self {
        let ctx = Ctx {
            core: client.sandbox(info.id.clone()),
            // The image's WORKDIR where it has one, else the home (as Daytona).
            work_dir: info
                .working_dir
                .clone()
                .unwrap_or_else(|| info.user.home.clone())
                .into(),
        };
        let mut sb = Sandbox {
            id: info.id.clone(),
            name: String::new(),
            organization_id: String::new(),
            snapshot: None,
            user: String::new(),
            env: None,
            labels: HashMap::new(),
            public: false,
            target: String::new(),
            cpu: 1.0,
            gpu: 0.0,
            memory: 1.0,
            disk: 3.0,
            state: None,
            error_reason: None,
            recoverable: None,
            backup_state: None,
            backup_created_at: None,
            auto_stop_interval: None,
            auto_archive_interval: None,
            auto_delete_interval: None,
            network_block_all: None,
            network_allow_list: None,
            domain_allow_list: None,
            created_at: None,
            updated_at: None,
            last_activity_at: None,
            toolbox_proxy_url: String::new(),
            fs: FileSystem::new(ctx.clone()),
            git: Git::new(ctx.clone()),
            process: Process::new(ctx.clone()),
            code_interpreter: CodeInterpreter::default(),
            computer_use: ComputerUse::default(),
            ctx,
            meta: Meta::default(),
            organization: config.organization_id.clone(),
            target_config: config.target.clone(),
        };
        sb.apply(info, meta);
        sb
    }

    fn apply(&mut self, info: SandboxInfo, meta: Meta) {
        // The runtime's name only: it is unique and atomic there.
        self.name = info.name.clone().unwrap_or_else(|| info.id.clone());
        // Unset in the config: the runtime's identity, one stable id per server (a Daytona
        // organization is never empty).
        self.organization_id = self.organization.clone().unwrap_or_else(|| {
            let caps = self.ctx.core.client().capabilities();
            caps.runtime_id.unwrap_or_else(|| caps.backend.clone())
        });
        // Daytona names the snapshot of every sandbox, the default one included.
        self.snapshot = Some(
            meta.snapshot
                .clone()
                .unwrap_or_else(|| crate::snapshot::DEFAULT_SNAPSHOT.to_string()),
        );
        self.user = info.user.name.clone();
        self.env = Some(info.envs.clone().into_iter().collect());
        let labels = meta.labels.clone().unwrap_or_else(|| {
            info.labels
                .iter()
                .filter(|(k, _)| !k.starts_with(META_PREFIX))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        });
        self.labels = labels.into_iter().collect();
        self.public = meta.public;
        self.target = meta
            .target
            .clone()
            .or(self.target_config.clone())
            .unwrap_or_else(|| "local".into());
        if let Some(c) = info.resources.cpu {
            self.cpu = c;
        }
        if let Some(m) = info.resources.memory_mib {
            self.memory = m as f64 / 1024.0;
        }
        if let Some(d) = info.resources.disk_mib {
            self.disk = d as f64 / 1024.0;
        }
        let state = state_of(info.state, &meta);
        self.error_reason = (state == SandboxState::Error)
            .then(|| "the sandbox's processes are gone; it can only be deleted".to_string());
        self.recoverable = Some(false);
        self.state = Some(state);
        self.auto_stop_interval = Some(
            meta.auto_stop_interval
                .unwrap_or(translate::DEFAULT_AUTO_STOP) as f64,
        );
        self.auto_archive_interval = Some(
            meta.auto_archive_interval
                .unwrap_or(translate::DEFAULT_AUTO_ARCHIVE) as f64,
        );
        self.auto_delete_interval = Some(meta.auto_delete_interval.unwrap_or(-1) as f64);
        self.network_block_all = Some(meta.network_block_all);
        self.meta = meta;
        self.created_at = Some(translate::rfc3339(info.created_at));
        self.updated_at = Some(translate::rfc3339(info.created_at));
        self.last_activity_at = Some(translate::rfc3339(sandcove::now_millis()));
    }

    /// The volume mounts asked for at creation: (volume, mount path, subpath).
    #[cfg(feature = "wire")]
    pub(crate) fn volume_mounts(&self) -> &[(String, String, Option<String>)] {
        &self.meta.volumes
    }

    /// `refresh_data(request_timeout=None)`: reload every field.
    pub async fn refresh_data(&mut self) -> Result<()> {
        let info = self
            .ctx
            .core
            .info()
            .await
            .ctx("Failed to refresh sandbox data: ")?;
        // The facade state is an annotation: readable in every state.
        let meta = meta_of(&info);
        self.apply(info, meta);
        Ok(())
    }

    /// `get_user_home_dir() -> str`.
    pub async fn get_user_home_dir(&self) -> Result<String> {
        let info = self
            .ctx
            .core
            .info()
            .await
            .ctx("Failed to get user home directory: ")?;
        Ok(info.user.home)
    }

    /// `get_work_dir() -> str`: the image's `WORKDIR` where the sandbox runs an image that
    /// names one, else the home directory.
    pub async fn get_work_dir(&self) -> Result<String> {
        let info = self
            .ctx
            .core
            .info()
            .await
            .ctx("Failed to get working directory path: ")?;
        Ok(info.working_dir.unwrap_or(info.user.home))
    }

    /// The runtime's saved reference to this sandbox (not a Daytona attribute):
    /// `sandcove:v1:<runtime>:sandbox:<id>`, which `sandcove::Client::reopen` checks from a
    /// later program. `daytona.get(id)` keeps working with the bare id.
    pub fn sandcove_reference(&self) -> Result<sandcove::Reference> {
        Ok(self.ctx.core.reference()?)
    }

    /// `set_labels(labels) -> dict`: replaces the whole set (the language label is kept only
    /// if given, as on Daytona).
    pub async fn set_labels<K, V>(
        &mut self,
        labels: impl IntoIterator<Item = (K, V)>,
    ) -> Result<HashMap<String, String>>
    where
        K: Into<String>,
        V: Into<String>,
    {
        let labels: std::collections::BTreeMap<String, String> = labels
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        if labels.keys().any(|k| k.starts_with(META_PREFIX)) {
            return Err(DaytonaError::validation(format!(
                "labels starting with {META_PREFIX:?} are reserved"
            )))
            .ctx("Failed to set labels: ");
        }
        self.ctx
            .update_meta(|m| m.labels = Some(labels.clone()))
            .await
            .ctx("Failed to set labels: ")?;
        self.labels = labels.into_iter().collect();
        Ok(self.labels.clone())
    }

    /// `start(timeout=60)`: start a stopped (or archived, or paused) sandbox and wait until
    /// it is `started`; this object's fields are then refreshed (`state` reads `started`).
    pub fn start(&mut self) -> StartBuilder<'_> {
        StartBuilder::new(SandboxArg::Mut(self))
    }

    /// `stop(timeout=60, force=False)`: every process ends (the filesystem stays), as a
    /// Daytona stop; this object's fields are then refreshed (`state` reads `stopped`).
    pub fn stop(&mut self) -> StopBuilder<'_> {
        StopBuilder::new(SandboxArg::Mut(self))
    }

    /// `delete(timeout=60, wait=False)`: destroy the sandbox.
    pub fn delete(&self) -> DeleteBuilder {
        DeleteBuilder {
            sandbox: self.clone(),
            timeout: 60.0,
        }
    }

    /// `wait_for_sandbox_start(timeout=60)`: polls, refreshing this object's fields.
    pub fn wait_for_sandbox_start(&mut self) -> WaitBuilder<'_> {
        WaitBuilder {
            sandbox: self,
            timeout: 60.0,
            start: true,
        }
    }

    /// `wait_for_sandbox_stop(timeout=60)`: polls, refreshing this object's fields.
    pub fn wait_for_sandbox_stop(&mut self) -> WaitBuilder<'_> {
        WaitBuilder {
            sandbox: self,
            timeout: 60.0,
            start: false,
        }
    }

    async fn update_meta(&mut self, prefix: &str, change: impl Fn(&mut Meta)) -> Result<()> {
        let meta = self.ctx.update_meta(change).await.ctx(prefix)?;
        self.meta = meta;
        Ok(())
    }

    /// `set_autostop_interval(interval)`: minutes; `0` disables. Moves the lease end to
    /// `interval` minutes from now.
    pub async fn set_autostop_interval(&mut self, interval: i64) -> Result<()> {
        const P: &str = "Failed to set auto-stop interval: ";
        if interval < 0 {
            return Err(DaytonaError::validation(
                "Auto-stop interval must be a non-negative integer",
            ))
            .ctx(P);
        }
        self.ctx
            .core
            .set_timeout(translate::lease_for_auto_stop(interval))
            .await
            .ctx(P)?;
        self.update_meta(P, |m| m.auto_stop_interval = Some(interval))
            .await?;
        self.auto_stop_interval = Some(interval as f64);
        Ok(())
    }

    /// `set_auto_archive_interval(interval)`: minutes; `0` = the maximum (recorded only).
    pub async fn set_auto_archive_interval(&mut self, interval: i64) -> Result<()> {
        const P: &str = "Failed to set auto-archive interval: ";
        if interval < 0 {
            return Err(DaytonaError::validation(
                "Auto-archive interval must be a non-negative integer",
            ))
            .ctx(P);
        }
        self.update_meta(P, |m| m.auto_archive_interval = Some(interval))
            .await?;
        self.auto_archive_interval = Some(interval as f64);
        Ok(())
    }

    /// `set_auto_delete_interval(interval)`: minutes; negative disables (recorded only: the
    /// lease end always deletes).
    pub async fn set_auto_delete_interval(&mut self, interval: i64) -> Result<()> {
        const P: &str = "Failed to set auto-delete interval: ";
        self.update_meta(P, |m| m.auto_delete_interval = Some(interval))
            .await?;
        self.auto_delete_interval = Some(interval as f64);
        Ok(())
    }

    /// `refresh_activity()`: resets the auto-stop timer (moves the lease end).
    pub async fn refresh_activity(&self) -> Result<()> {
        let meta = self.ctx.meta().await.ctx("Failed to refresh activity: ")?;
        let minutes = meta
            .auto_stop_interval
            .unwrap_or(translate::DEFAULT_AUTO_STOP);
        self.ctx
            .core
            .set_timeout(translate::lease_for_auto_stop(minutes))
            .await
            .ctx("Failed to refresh activity: ")?;
        Ok(())
    }

    async fn preview(&self, port: i64) -> sandcove::Result<sandcove::Preview> {
        let port = u16::try_from(port)
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| sandcove::Error::invalid(format!("invalid port {port}")))?;
        let existing = self.ctx.core.previews().await?;
        if let Some(p) = existing.into_iter().find(|p| p.port == port) {
            return Ok(p);
        }
        let meta = self.ctx.meta().await?;
        self.ctx
            .core
            .expose_port(
                PreviewOptions::new(port)
                    .public(meta.public)
                    .token_header(PREVIEW_TOKEN_HEADER)
                    .token_query(PREVIEW_TOKEN_QUERY),
            )
            .await
    }

    /// `get_preview_link(port) -> PortPreviewUrl`: a URL on the host that reaches `port` in
    /// the sandbox; private sandboxes need `token` in the `x-daytona-preview-token` header.
    pub async fn get_preview_link(&self, port: i64) -> Result<PortPreviewUrl> {
        let p = self
            .preview(port)
            .await
            .ctx("Failed to get preview link: ")?;
        Ok(PortPreviewUrl {
            sandbox_id: self.id.clone(),
            url: p.url,
            token: p.token.map(|t| t.value).unwrap_or_default(),
        })
    }

    /// `create_signed_preview_url(port, expires_in_seconds=None)`: a URL carrying its own
    /// token (default lifetime 60 s, 1..=86400).
    pub fn create_signed_preview_url(&self, port: i64) -> SignedPreviewBuilder {
        SignedPreviewBuilder {
            sandbox: self.clone(),
            port,
            expires_in_seconds: None,
        }
    }

    /// `expire_signed_preview_url(port, token)`: a gap (tokens cannot be revoked one by one).
    pub async fn expire_signed_preview_url(&self, _port: i64, _token: &str) -> Result<()> {
        Err(gap("expire_signed_preview_url"))
    }

    /// `archive()`: the sandbox must be stopped; it stays stopped, marked `archived`.
    pub async fn archive(&mut self) -> Result<()> {
        const P: &str = "Failed to archive sandbox: ";
        let info = self.ctx.core.info().await.ctx(P)?;
        if info.state != sandcove::SandboxState::Stopped {
            return Err(DaytonaError::validation(
                "Sandbox must be stopped to be archived",
            ))
            .ctx(P);
        }
        self.update_meta(P, |m| m.archived = true).await?;
        self.state = Some(SandboxState::Archived);
        Ok(())
    }

    /// `fork(name=None, timeout=60)`: a new sandbox with a copy of this one's files.
    pub async fn fork(&self) -> Result<Sandbox> {
        const P: &str = "Failed to fork sandbox: ";
        let info = self.ctx.core.info().await.ctx(P)?;
        let mut options = sandcove::CreateOptions::default();
        options.envs = info.envs.clone();
        // No name: a fork never inherits its source's (Daytona names it by its id).
        options.labels = info.labels.clone();
        options.user = Some(info.user.name.clone());
        options.home = Some(info.user.home.clone());
        options.network = info.network.clone();
        // The runtime copies the facade state (an annotation) into the fork.
        let (_, forked) = self.ctx.core.fork_described(options).await.ctx(P)?;
        if let Some(why) = &forked.source_resume_error {
            return Err(source_not_resumed(
                &format!("fork {}", forked.id),
                &self.id,
                why,
            ));
        }
        let meta = meta_of(&forked);
        let config = DaytonaConfig {
            organization_id: self.organization.clone(),
            target: self.target_config.clone(),
            ..Default::default()
        };
        Ok(Sandbox::from_parts(
            self.ctx.core.client(),
            &config,
            forked,
            Meta { name: None, ..meta },
        ))
    }

    /// `create_snapshot(name, timeout=60)`: snapshot the sandbox's files under `name`.
    pub async fn create_snapshot(&self, name: &str) -> Result<()> {
        if name == crate::snapshot::DEFAULT_SNAPSHOT {
            return Err(DaytonaError::Conflict(crate::errors::ErrorDetails::new(
                format!("Failed to create snapshot: snapshot {name:?} already exists (the default snapshot)"),
                Some(409),
                Some("CONFLICT"),
            )));
        }
        let taken = self
            .ctx
            .core
            .snapshot(Some(name.to_string()))
            .await
            .ctx("Failed to create snapshot: ")?;
        if let Some(why) = &taken.source_resume_error {
            return Err(source_not_resumed(
                &format!("snapshot {name:?}"),
                &self.id,
                why,
            ));
        }
        Ok(())
    }

    /// `pause(timeout=60)`: freeze every process (memory kept).
    pub async fn pause(&mut self) -> Result<()> {
        self.ctx
            .core
            .pause()
            .await
            .ctx("Failed to pause sandbox: ")?;
        self.state = Some(SandboxState::Paused);
        Ok(())
    }

    /// `resize(resources, timeout=60)`: a gap.
    pub async fn resize(&self, _resources: crate::Resources) -> Result<()> {
        Err(gap("resize"))
    }

    /// `recover(timeout=60)`: a gap.
    pub async fn recover(&self) -> Result<()> {
        Err(gap("recover"))
    }

    /// `update_network_settings(...)`: a gap.
    pub async fn update_network_settings(&self) -> Result<()> {
        Err(gap("update_network_settings"))
    }

    /// `create_lsp_server(language_id, path_to_project)`: a gap.
    pub fn create_lsp_server(&self, _language_id: &str, _path_to_project: &str) -> Result<()> {
        Err(gap("create_lsp_server"))
    }

    /// `create_ssh_access(expires_in_minutes=None)`: a gap.
    pub async fn create_ssh_access(&self) -> Result<()> {
        Err(gap("ssh access"))
    }

    /// `revoke_ssh_access(token)`: a gap.
    pub async fn revoke_ssh_access(&self, _token: &str) -> Result<()> {
        Err(gap("ssh access"))
    }

    /// `validate_ssh_access(token)`: a gap.
    pub async fn validate_ssh_access(&self, _token: &str) -> Result<()> {
        Err(gap("ssh access"))
    }

    /// `download_url(path, ttl_seconds=None)`: a URL that downloads the file with a plain
    /// `GET`, no credential (see [`FileUrlBuilder`]).
    pub fn download_url(&self, path: &str) -> FileUrlBuilder {
        FileUrlBuilder::new(self, path, sandcove::FileUrlOperation::Read)
    }

    /// `upload_url(path, ttl_seconds=None)`: a URL that uploads the file with a plain `POST`
    /// of `multipart/form-data` (one `file` part), no credential (see [`FileUrlBuilder`]).
    pub fn upload_url(&self, path: &str) -> FileUrlBuilder {
        FileUrlBuilder::new(self, path, sandcove::FileUrlOperation::Write)
    }

    /// `rotate_signing_key()`: a gap. The URLs of `download_url`/`upload_url` are the
    /// runtime's signed file URLs, which end at their expiry or with the sandbox and cannot
    /// be revoked before.
    pub async fn rotate_signing_key(&self) -> Result<()> {
        Err(gap("rotate_signing_key"))
    }

    async fn do_stop(&self) -> Result<()> {
        // The runtime's stop kills every process (frozen ones of a paused sandbox too) and
        // returns once their ends are recorded, so whatever is asked next (a session, a
        // command, the process list) sees a stopped sandbox.
        self.ctx.core.stop().await?;
        crate::process::forget_sandbox(&self.id);
        Ok(())
    }

    async fn do_start(&self) -> Result<()> {
        let core = &self.ctx.core;
        let info = core.info().await?;
        match info.state {
            sandcove::SandboxState::Paused => {
                core.resume().await?;
            }
            sandcove::SandboxState::Stopped => {
                core.start().await?;
            }
            _ => {}
        }
        let meta = if meta_of(&info).archived {
            self.ctx.update_meta(|m| m.archived = false).await?
        } else {
            meta_of(&info)
        };
        // A state change restarts the auto-stop count.
        let minutes = meta
            .auto_stop_interval
            .unwrap_or(translate::DEFAULT_AUTO_STOP);
        core.set_timeout(translate::lease_for_auto_stop(minutes))
            .await?;
        Ok(())
    }
}

macro_rules! timeout_setter {
    () => {
        /// `timeout` in seconds for the whole call (default 60; `0` = none).
        pub fn timeout(mut self, seconds: impl Into<f64>) -> Self {
            self.timeout = seconds.into();
            self
        }
    };
}

/// Make a builder that borrows its sandbox mutably awaitable (the call updates its fields,
/// as the Python object's are updated in place).
macro_rules! awaitable_mut {
    ($builder:ident => $out:ty) => {
        sandcove_compat_support::awaitable!($builder<'a> => Result<$out>);
    };
}

/// The sandbox `daytona.start(…)` / `daytona.stop(…)` act on, as Python passes the object:
/// `&mut sandbox` (its fields are refreshed when the call returns, as Python updates the
/// object in place) or `&sandbox` (the sandbox's state changes all the same, for every
/// handle of it; this handle's fields are read as they were until its `refresh_data()`).
#[derive(Debug)]
pub enum SandboxArg<'a> {
    /// Refreshed after the call.
    Mut(&'a mut Sandbox),
    /// Left as it was: refresh it to read the new state.
    Shared(&'a Sandbox),
}

impl<'a> From<&'a mut Sandbox> for SandboxArg<'a> {
    fn from(sandbox: &'a mut Sandbox) -> Self {
        SandboxArg::Mut(sandbox)
    }
}

impl<'a> From<&'a Sandbox> for SandboxArg<'a> {
    fn from(sandbox: &'a Sandbox) -> Self {
        SandboxArg::Shared(sandbox)
    }
}

impl SandboxArg<'_> {
    fn get(&self) -> &Sandbox {
        match self {
            SandboxArg::Mut(s) => s,
            SandboxArg::Shared(s) => s,
        }
    }

    /// Start (`true`) or stop the sandbox, then refresh the fields of a `&mut` one.
    async fn start_or_stop(self, start: bool) -> Result<()> {
        let sandbox = self.get();
        if start {
            sandbox.do_start().await?;
        } else {
            sandbox.do_stop().await?;
        }
        match self {
            SandboxArg::Mut(s) => s.refresh_data().await,
            SandboxArg::Shared(_) => Ok(()),
        }
    }
}

/// Builder of [`Sandbox::start`]; await it.
#[derive(Debug)]
#[must_use = "await the builder to run the call"]
pub struct StartBuilder<'a> {
    sandbox: SandboxArg<'a>,
    timeout: f64,
}

impl<'a> StartBuilder<'a> {
    pub(crate) fn new(sandbox: SandboxArg<'a>) -> Self {
        StartBuilder {
            sandbox,
            timeout: 60.0,
        }
    }

    timeout_setter!();

    async fn run(self) -> Result<()> {
        let sb = self.sandbox;
        with_timeout("start", self.timeout, sb.start_or_stop(true))
            .await
            .ctx("Failed to start sandbox: ")
    }
}
awaitable_mut!(StartBuilder => ());

/// Builder of [`Sandbox::stop`]; await it.
#[derive(Debug)]
#[must_use = "await the builder to run the call"]
pub struct StopBuilder<'a> {
    sandbox: SandboxArg<'a>,
    timeout: f64,
}

impl<'a> StopBuilder<'a> {
    pub(crate) fn new(sandbox: SandboxArg<'a>) -> Self {
        StopBuilder {
            sandbox,
            timeout: 60.0,
        }
    }

    timeout_setter!();

    /// `force=False`: processes are always killed at once here.
    pub fn force(self, _force: bool) -> Self {
        self
    }

    async fn run(self) -> Result<()> {
        let sb = self.sandbox;
        with_timeout("stop", self.timeout, sb.start_or_stop(false))
            .await
            .ctx("Failed to stop sandbox: ")
    }
}
awaitable_mut!(StopBuilder => ());

/// Builder of [`Sandbox::delete`]; await it.
#[derive(Debug)]
#[must_use = "await the builder to run the call"]
pub struct DeleteBuilder {
    sandbox: Sandbox,
    timeout: f64,
}

impl DeleteBuilder {
    timeout_setter!();

    /// `wait=False`: deletion here is always complete when the call returns.
    pub fn wait(self, _wait: bool) -> Self {
        self
    }

    async fn run(self) -> Result<()> {
        let sb = self.sandbox;
        let id = sb.id.clone();
        with_timeout("delete", self.timeout, async move {
            sb.ctx.core.destroy().await?;
            crate::process::forget_sandbox(&id);
            Ok(())
        })
        .await
        .ctx("Failed to remove sandbox: ")
    }
}
awaitable!(DeleteBuilder => ());

/// Builder of [`Sandbox::wait_for_sandbox_start`] / [`Sandbox::wait_for_sandbox_stop`].
#[derive(Debug)]
#[must_use = "await the builder to run the call"]
pub struct WaitBuilder<'a> {
    sandbox: &'a mut Sandbox,
    timeout: f64,
    start: bool,
}

impl WaitBuilder<'_> {
    timeout_setter!();

    async fn run(self) -> Result<()> {
        let name = if self.start {
            "wait_for_sandbox_start"
        } else {
            "wait_for_sandbox_stop"
        };
        let start = self.start;
        let sb = self.sandbox;
        with_timeout(name, self.timeout, async move {
            loop {
                match sb.refresh_data().await {
                    Ok(()) => {}
                    Err(e) if !start && e.is_not_found() => return Ok(()),
                    Err(e) => return Err(e),
                }
                match (start, sb.state) {
                    (true, Some(SandboxState::Started)) => return Ok(()),
                    (true, Some(SandboxState::Error | SandboxState::BuildFailed)) => {
                        return Err(DaytonaError::new(format!(
                            "Sandbox {} failed to start with state: {}, error reason: {}",
                            sb.id,
                            sb.state.map(|s| s.as_str()).unwrap_or("unknown"),
                            sb.error_reason.clone().unwrap_or_default()
                        )))
                    }
                    (false, Some(SandboxState::Stopped | SandboxState::Destroyed)) => return Ok(()),
                    _ => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        })
        .await
    }
}
awaitable_mut!(WaitBuilder => ());

/// Builder of [`Sandbox::create_signed_preview_url`]; await it.
#[derive(Debug)]
#[must_use = "await the builder to run the call"]
pub struct SignedPreviewBuilder {
    sandbox: Sandbox,
    port: i64,
    expires_in_seconds: Option<i64>,
}

impl SignedPreviewBuilder {
    /// `expires_in_seconds=None` (60 s; 1..=86400).
    pub fn expires_in_seconds(mut self, seconds: impl Into<Option<i64>>) -> Self {
        self.expires_in_seconds = seconds.into();
        self
    }

    async fn run(self) -> Result<SignedPortPreviewUrl> {
        const P: &str = "Failed to create signed preview url: ";
        let secs = self.expires_in_seconds.unwrap_or(60);
        if !(1..=86_400).contains(&secs) {
            return Err(DaytonaError::validation(
                "expires_in_seconds must be between 1 and 86400",
            ))
            .ctx(P);
        }
        let p = self.sandbox.preview(self.port).await.ctx(P)?;
        let token = self
            .sandbox
            .ctx
            .core
            .create_preview_token(p.port, Some(sandcove::now_millis() + secs as u64 * 1000))
            .await
            .ctx(P)?;
        let sep = if p.url.contains('?') { '&' } else { '?' };
        Ok(SignedPortPreviewUrl {
            sandbox_id: self.sandbox.id.clone(),
            port: self.port,
            url: format!("{}{sep}{}={}", p.url, p.token_query, token.value),
            token: token.value,
        })
    }
}
awaitable!(SignedPreviewBuilder => SignedPortPreviewUrl);

/// Daytona's default lifetime of a file URL, in seconds.
const DEFAULT_FILE_URL_TTL: i64 = 3600;

/// Builder of [`Sandbox::download_url`] / [`Sandbox::upload_url`]; await it for the URL.
///
/// The URL is the runtime's signed file URL ([`sandcove::Sandbox::file_url`]): one path, one
/// operation, until its expiry, verified and served outside the sandbox (the embedded
/// engine's monitor, or `sandcove serve`) through the file API; nothing runs in the sandbox
/// for it. A relative path is under the work dir, as the `fs` calls take it.
#[derive(Debug)]
#[must_use = "await the builder to run the call"]
pub struct FileUrlBuilder {
    ctx: crate::ctx::Ctx,
    path: String,
    operation: sandcove::FileUrlOperation,
    ttl_seconds: Option<i64>,
}

impl FileUrlBuilder {
    fn new(sandbox: &Sandbox, path: &str, operation: sandcove::FileUrlOperation) -> Self {
        FileUrlBuilder {
            ctx: sandbox.ctx.clone(),
            path: path.to_string(),
            operation,
            ttl_seconds: None,
        }
    }

    /// `ttl_seconds=None`: how long the URL works (3600 s by default; zero or negative: as
    /// long as the sandbox; at most 7 days).
    pub fn ttl_seconds(mut self, seconds: impl Into<Option<i64>>) -> Self {
        self.ttl_seconds = seconds.into();
        self
    }

    async fn run(self) -> Result<String> {
        let prefix = match self.operation {
            sandcove::FileUrlOperation::Read => "Failed to create download URL: ",
            _ => "Failed to create upload URL: ",
        };
        if self.path.is_empty() {
            return Err(DaytonaError::validation("path is required")).ctx(prefix);
        }
        let path = self.ctx.resolve(&self.path);
        let mut options = match self.operation {
            sandcove::FileUrlOperation::Read => sandcove::FileUrlOptions::read(path),
            _ => sandcove::FileUrlOptions::write(path),
        };
        let ttl = self.ttl_seconds.unwrap_or(DEFAULT_FILE_URL_TTL);
        if ttl > 0 {
            let ms = (ttl as u64).saturating_mul(1000);
            options = options.expires_at(sandcove::now_millis().saturating_add(ms));
        }
        let url = self.ctx.core.file_url(options).await.ctx(prefix)?;
        Ok(url.url)
    }
}
awaitable!(FileUrlBuilder => String);

/// A snapshot or fork was made (and is kept), but the sandbox, paused for it, could not be
/// resumed: raised rather than dropped, naming what was made and what to do with the sandbox.
pub(crate) fn source_not_resumed(made: &str, sandbox: &str, why: &str) -> DaytonaError {
    DaytonaError::Error(crate::errors::ErrorDetails::new(
        format!(
            "{made} was made and is kept, but sandbox {sandbox}, paused for it, could not be \
             resumed ({why}): start it again, or delete it"
        ),
        None,
        None,
    ))
}

#[cfg(test)]
mod tests {
    use super::SandboxState;

    /// A match without a wildcard: a new variant stops this from compiling until `ALL` and
    /// this list have it.
    fn position(s: SandboxState) -> usize {
        use SandboxState::*;
        match s {
            Creating => 0,
            Restoring => 1,
            Destroyed => 2,
            Destroying => 3,
            Started => 4,
            Stopped => 5,
            Starting => 6,
            Stopping => 7,
            Error => 8,
            BuildFailed => 9,
            PendingBuild => 10,
            BuildingSnapshot => 11,
            Unknown => 12,
            PullingSnapshot => 13,
            Archived => 14,
            Archiving => 15,
            Resizing => 16,
            Snapshotting => 17,
            Forking => 18,
            Pausing => 19,
            Paused => 20,
            Resuming => 21,
        }
    }

    #[test]
    fn every_state_is_listed_once_and_parses_from_its_wire_string() {
        for (i, s) in SandboxState::ALL.into_iter().enumerate() {
            assert_eq!(position(s), i, "{s}");
            assert_eq!(s.as_str().parse::<SandboxState>().unwrap(), s);
        }
        assert!("nonsense".parse::<SandboxState>().is_err());
    }
}
