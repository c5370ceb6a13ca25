//! `Daytona`, `DaytonaConfig`, the create parameters and `ListSandboxesQuery`.

use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use futures::Stream;
use sandcove::{Client, CreateOptions, ListOptions, NetworkPolicy};

use crate::ctx::{encode_meta, meta_of, Meta};
use crate::errors::{Context, DaytonaError};
use crate::gaps::gap;
use crate::sandbox::{Sandbox, SandboxState};
use crate::snapshot::{Image, SnapshotService};
use crate::translate::{self, DAYTONA_HOME, DAYTONA_USER, LANGUAGE_LABEL, META_PREFIX};
use crate::volume::VolumeService;
use crate::{awaitable, Result};

/// Python `DaytonaConfig`: every field optional. Credentials are accepted so ported code
/// runs, and are never sent anywhere; `api_url` and `target` are recorded only.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DaytonaConfig {
    /// `api_key` (or `DAYTONA_API_KEY`): accepted, ignored.
    pub api_key: Option<String>,
    /// `jwt_token` (or `DAYTONA_JWT_TOKEN`): accepted, ignored.
    pub jwt_token: Option<String>,
    /// `organization_id` (or `DAYTONA_ORGANIZATION_ID`): reported as `Sandbox.organization_id`.
    pub organization_id: Option<String>,
    /// `api_url` (or `DAYTONA_API_URL`): accepted, ignored; `SANDCOVE_URL` selects the runtime.
    pub api_url: Option<String>,
    /// Deprecated alias of `api_url` (or `DAYTONA_SERVER_URL`).
    pub server_url: Option<String>,
    /// `target` region (or `DAYTONA_TARGET`): reported as `Sandbox.target`.
    pub target: Option<String>,
    /// `connection_pool_maxsize`: accepted, ignored.
    pub connection_pool_maxsize: Option<i64>,
    /// `otel_enabled`: accepted, ignored.
    pub otel_enabled: Option<bool>,
}

impl DaytonaConfig {
    /// Fill unset fields from `DAYTONA_*` environment variables (Python's resolution rule 1;
    /// `.env` files are not read).
    pub fn from_env() -> Self {
        DaytonaConfig::default().with_env()
    }

    fn with_env(mut self) -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        self.api_key = self.api_key.or_else(|| var("DAYTONA_API_KEY"));
        self.jwt_token = self.jwt_token.or_else(|| var("DAYTONA_JWT_TOKEN"));
        self.organization_id = self
            .organization_id
            .or_else(|| var("DAYTONA_ORGANIZATION_ID"));
        self.api_url = self
            .api_url
            .or_else(|| self.server_url.clone())
            .or_else(|| var("DAYTONA_API_URL"))
            .or_else(|| var("DAYTONA_SERVER_URL"));
        self.target = self.target.or_else(|| var("DAYTONA_TARGET"));
        self.otel_enabled = self
            .otel_enabled
            .or_else(|| var("DAYTONA_OTEL_ENABLED").map(|v| v == "true"));
        self
    }
}

/// Python `CodeLanguage`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodeLanguage {
    /// `"python"` (the default).
    Python,
    /// `"typescript"`.
    Typescript,
    /// `"javascript"`.
    Javascript,
}

impl CodeLanguage {
    /// The string value.
    pub fn as_str(self) -> &'static str {
        match self {
            CodeLanguage::Python => "python",
            CodeLanguage::Typescript => "typescript",
            CodeLanguage::Javascript => "javascript",
        }
    }
}

impl From<CodeLanguage> for String {
    fn from(l: CodeLanguage) -> String {
        l.as_str().to_string()
    }
}

impl PartialEq<&str> for CodeLanguage {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// Python `Resources`: honoured only with an image (a gap here).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Resources {
    /// vCPUs.
    pub cpu: Option<i64>,
    /// Memory in GiB.
    pub memory: Option<i64>,
    /// Disk in GiB.
    pub disk: Option<i64>,
    /// GPUs (a gap).
    pub gpu: Option<i64>,
    /// GPU types, e.g. `H100` (a gap).
    pub gpu_type: Option<Vec<String>>,
}

/// Python `VolumeMount`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct VolumeMount {
    /// Volume ID or name.
    pub volume_id: String,
    /// Absolute mount path in the sandbox.
    pub mount_path: String,
    /// Mount only this prefix of the volume.
    pub subpath: Option<String>,
}

/// Python `CreateSandboxBaseParams`: the fields both create forms share.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CreateSandboxBaseParams {
    /// `name`: defaults to the id; duplicate → `DaytonaConflictError`.
    pub name: Option<String>,
    /// `language`: `python` (default), `typescript` or `javascript`.
    pub language: Option<String>,
    /// `os_user`: the OS user (default `daytona`, home `/home/<user>`).
    pub os_user: Option<String>,
    /// `env_vars`: sandbox-wide environment.
    pub env_vars: Option<HashMap<String, String>>,
    /// `labels`.
    pub labels: Option<HashMap<String, String>>,
    /// `public`: preview links need no token.
    pub public: Option<bool>,
    /// `auto_stop_interval` in minutes (default 15, `0` = never).
    pub auto_stop_interval: Option<i64>,
    /// `auto_archive_interval` in minutes (recorded).
    pub auto_archive_interval: Option<i64>,
    /// `auto_delete_interval` in minutes (recorded; the lease end deletes).
    pub auto_delete_interval: Option<i64>,
    /// `volumes`.
    pub volumes: Option<Vec<VolumeMount>>,
    /// `network_block_all`: loopback only.
    pub network_block_all: Option<bool>,
    /// `network_allow_list` (a gap).
    pub network_allow_list: Option<String>,
    /// `domain_allow_list` (a gap).
    pub domain_allow_list: Option<String>,
    /// `ephemeral`: forces `auto_delete_interval=0`.
    pub ephemeral: Option<bool>,
    /// `linked_sandbox` (a gap).
    pub linked_sandbox: Option<String>,
}

/// Python `CreateSandboxFromSnapshotParams`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CreateSandboxFromSnapshotParams {
    /// `snapshot`: name or id; `None` or `"host"` = the default (the host's toolchain,
    /// read-only; see [`DEFAULT_SNAPSHOT`](crate::snapshot::DEFAULT_SNAPSHOT)).
    pub snapshot: Option<String>,
    /// See [`CreateSandboxBaseParams::name`].
    pub name: Option<String>,
    /// See [`CreateSandboxBaseParams::language`].
    pub language: Option<String>,
    /// See [`CreateSandboxBaseParams::os_user`].
    pub os_user: Option<String>,
    /// See [`CreateSandboxBaseParams::env_vars`].
    pub env_vars: Option<HashMap<String, String>>,
    /// See [`CreateSandboxBaseParams::labels`].
    pub labels: Option<HashMap<String, String>>,
    /// See [`CreateSandboxBaseParams::public`].
    pub public: Option<bool>,
    /// See [`CreateSandboxBaseParams::auto_stop_interval`].
    pub auto_stop_interval: Option<i64>,
    /// See [`CreateSandboxBaseParams::auto_archive_interval`].
    pub auto_archive_interval: Option<i64>,
    /// See [`CreateSandboxBaseParams::auto_delete_interval`].
    pub auto_delete_interval: Option<i64>,
    /// See [`CreateSandboxBaseParams::volumes`].
    pub volumes: Option<Vec<VolumeMount>>,
    /// See [`CreateSandboxBaseParams::network_block_all`].
    pub network_block_all: Option<bool>,
    /// See [`CreateSandboxBaseParams::network_allow_list`].
    pub network_allow_list: Option<String>,
    /// See [`CreateSandboxBaseParams::domain_allow_list`].
    pub domain_allow_list: Option<String>,
    /// See [`CreateSandboxBaseParams::ephemeral`].
    pub ephemeral: Option<bool>,
    /// See [`CreateSandboxBaseParams::linked_sandbox`].
    pub linked_sandbox: Option<String>,
}

/// What `image` may be: a registry reference or a declarative [`Image`].
#[derive(Debug, Clone, PartialEq)]
pub enum ImageSource {
    /// `image="python:3.12"`.
    Name(String),
    /// `image=Image.debian_slim(...)...`.
    Image(Image),
}

impl Default for ImageSource {
    fn default() -> Self {
        ImageSource::Name(String::new())
    }
}

impl From<&str> for ImageSource {
    fn from(s: &str) -> Self {
        ImageSource::Name(s.into())
    }
}
impl From<String> for ImageSource {
    fn from(s: String) -> Self {
        ImageSource::Name(s)
    }
}
impl From<Image> for ImageSource {
    fn from(i: Image) -> Self {
        ImageSource::Image(i)
    }
}

/// Python `CreateSandboxFromImageParams`: building from an image is a gap (see `MAPPING.md`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CreateSandboxFromImageParams {
    /// `image` (required in Python).
    pub image: ImageSource,
    /// `resources`.
    pub resources: Option<Resources>,
    /// See [`CreateSandboxBaseParams::name`].
    pub name: Option<String>,
    /// See [`CreateSandboxBaseParams::language`].
    pub language: Option<String>,
    /// See [`CreateSandboxBaseParams::os_user`].
    pub os_user: Option<String>,
    /// See [`CreateSandboxBaseParams::env_vars`].
    pub env_vars: Option<HashMap<String, String>>,
    /// See [`CreateSandboxBaseParams::labels`].
    pub labels: Option<HashMap<String, String>>,
    /// See [`CreateSandboxBaseParams::public`].
    pub public: Option<bool>,
    /// See [`CreateSandboxBaseParams::auto_stop_interval`].
    pub auto_stop_interval: Option<i64>,
    /// See [`CreateSandboxBaseParams::auto_archive_interval`].
    pub auto_archive_interval: Option<i64>,
    /// See [`CreateSandboxBaseParams::auto_delete_interval`].
    pub auto_delete_interval: Option<i64>,
    /// See [`CreateSandboxBaseParams::volumes`].
    pub volumes: Option<Vec<VolumeMount>>,
    /// See [`CreateSandboxBaseParams::network_block_all`].
    pub network_block_all: Option<bool>,
    /// See [`CreateSandboxBaseParams::network_allow_list`].
    pub network_allow_list: Option<String>,
    /// See [`CreateSandboxBaseParams::domain_allow_list`].
    pub domain_allow_list: Option<String>,
    /// See [`CreateSandboxBaseParams::ephemeral`].
    pub ephemeral: Option<bool>,
    /// See [`CreateSandboxBaseParams::linked_sandbox`].
    pub linked_sandbox: Option<String>,
}

/// The first argument of [`Daytona::create`]: either params struct, or `None`.
#[derive(Debug, Clone, PartialEq)]
pub enum CreateSandboxParams {
    /// From a snapshot (the default).
    Snapshot(CreateSandboxFromSnapshotParams),
    /// From an image.
    Image(CreateSandboxFromImageParams),
}

impl From<CreateSandboxFromSnapshotParams> for CreateSandboxParams {
    fn from(p: CreateSandboxFromSnapshotParams) -> Self {
        CreateSandboxParams::Snapshot(p)
    }
}
impl From<CreateSandboxFromImageParams> for CreateSandboxParams {
    fn from(p: CreateSandboxFromImageParams) -> Self {
        CreateSandboxParams::Image(p)
    }
}
impl From<CreateSandboxFromSnapshotParams> for Option<CreateSandboxParams> {
    fn from(p: CreateSandboxFromSnapshotParams) -> Self {
        Some(CreateSandboxParams::Snapshot(p))
    }
}
impl From<CreateSandboxFromImageParams> for Option<CreateSandboxParams> {
    fn from(p: CreateSandboxFromImageParams) -> Self {
        Some(CreateSandboxParams::Image(p))
    }
}

/// Python `SandboxListSortField`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxListSortField {
    /// `name`.
    Name,
    /// `cpu`.
    Cpu,
    /// `memoryGib`.
    MemoryGib,
    /// `diskGib`.
    DiskGib,
    /// `lastActivityAt`.
    LastActivityAt,
    /// `createdAt`.
    CreatedAt,
}

#[allow(non_upper_case_globals)]
impl SandboxListSortField {
    /// Python's `SandboxListSortField.CREATEDAT` spelling.
    pub const CREATEDAT: SandboxListSortField = SandboxListSortField::CreatedAt;
    /// Python's `SandboxListSortField.NAME` spelling.
    pub const NAME: SandboxListSortField = SandboxListSortField::Name;
}

/// Python `SandboxListSortDirection`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxListSortDirection {
    /// `asc`.
    Asc,
    /// `desc`.
    Desc,
}

impl SandboxListSortDirection {
    /// Python's `SandboxListSortDirection.ASC` spelling.
    pub const ASC: SandboxListSortDirection = SandboxListSortDirection::Asc;
    /// Python's `SandboxListSortDirection.DESC` spelling.
    pub const DESC: SandboxListSortDirection = SandboxListSortDirection::Desc;
}

/// Python `ListSandboxesQuery`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ListSandboxesQuery {
    /// Page size (default 100, at least 1). Not a total cap.
    pub limit: Option<i64>,
    /// ID prefix, case-insensitive.
    pub id: Option<String>,
    /// Name prefix, case-insensitive.
    pub name: Option<String>,
    /// Only sandboxes with all these labels.
    pub labels: Option<HashMap<String, String>>,
    /// Only sandboxes in these states.
    pub states: Option<Vec<SandboxState>>,
    /// Only public (or private) sandboxes.
    pub is_public: Option<bool>,
    /// Sort field (default: creation time).
    pub sort: Option<SandboxListSortField>,
    /// Sort direction (default: descending).
    pub order: Option<SandboxListSortDirection>,
}

/// Python `Daytona` (mirroring `AsyncDaytona`): creates, finds and lists sandboxes.
#[derive(Debug, Clone)]
pub struct Daytona {
    client: Client,
    config: DaytonaConfig,
    /// `daytona.volume`.
    pub volume: VolumeService,
    /// `daytona.snapshot`.
    pub snapshot: SnapshotService,
}

impl Daytona {
    /// `Daytona(config: DaytonaConfig | None = None)`. Credentials are optional and ignored;
    /// the runtime comes from `SANDCOVE_URL` (embedded engine when unset).
    pub fn new(config: impl Into<Option<DaytonaConfig>>) -> Result<Self> {
        let config = config.into().unwrap_or_default().with_env();
        let client = Client::from_env().ctx("Failed to initialize Daytona: ")?;
        Ok(Self::with_client(client, config))
    }

    /// A `Daytona` over an existing runtime client (for embedding and tests).
    pub fn with_client(client: Client, config: DaytonaConfig) -> Self {
        Daytona {
            volume: VolumeService::new(client.clone()),
            snapshot: SnapshotService::new(client.clone()),
            client,
            config,
        }
    }

    /// The configuration in force (after environment resolution).
    pub fn config(&self) -> &DaytonaConfig {
        &self.config
    }

    /// `create(params=None, *, timeout=60, on_snapshot_create_logs=None) -> Sandbox`.
    /// Returns when the sandbox is `started`.
    pub fn create(&self, params: impl Into<Option<CreateSandboxParams>>) -> CreateBuilder {
        CreateBuilder {
            daytona: self.clone(),
            params: params.into(),
            timeout: 60.0,
        }
    }

    /// `get(sandbox_id_or_name) -> Sandbox`. Does not start a stopped sandbox.
    pub fn get(&self, sandbox_id_or_name: impl Into<String>) -> GetBuilder {
        GetBuilder {
            daytona: self.clone(),
            id: sandbox_id_or_name.into(),
            request_timeout: None,
        }
    }

    /// `list(query=None) -> AsyncIterator[Sandbox]`: a lazy stream over all pages.
    pub fn list(&self, query: impl Into<Option<ListSandboxesQuery>>) -> SandboxIterator {
        let daytona = self.clone();
        let query = query.into().unwrap_or_default();
        SandboxIterator {
            inner: Box::pin(futures::stream::once(daytona.list_all(query)).flat_map(
                |r| -> Pin<Box<dyn Stream<Item = Result<Sandbox>> + Send>> {
                    match r {
                        Ok(v) => Box::pin(futures::stream::iter(v.into_iter().map(Ok))),
                        Err(e) => Box::pin(futures::stream::once(async move { Err(e) })),
                    }
                },
            )),
        }
    }

    /// `delete(sandbox, timeout=60)`: delegates to `sandbox.delete`.
    pub fn delete(&self, sandbox: &Sandbox) -> crate::sandbox::DeleteBuilder {
        sandbox.delete()
    }

    /// `start(sandbox, timeout=60)`: as `sandbox.start`. Pass `&mut sandbox` to have its
    /// fields refreshed, as Python's object is, or `&sandbox` (see [`SandboxArg`]).
    ///
    /// [`SandboxArg`]: crate::sandbox::SandboxArg
    pub fn start<'a>(
        &self,
        sandbox: impl Into<crate::sandbox::SandboxArg<'a>>,
    ) -> crate::sandbox::StartBuilder<'a> {
        crate::sandbox::StartBuilder::new(sandbox.into())
    }

    /// `stop(sandbox, timeout=60)`: as `sandbox.stop`. Pass `&mut sandbox` to have its
    /// fields refreshed, as Python's object is, or `&sandbox` (see [`SandboxArg`]).
    ///
    /// [`SandboxArg`]: crate::sandbox::SandboxArg
    pub fn stop<'a>(
        &self,
        sandbox: impl Into<crate::sandbox::SandboxArg<'a>>,
    ) -> crate::sandbox::StopBuilder<'a> {
        crate::sandbox::StopBuilder::new(sandbox.into())
    }

    pub(crate) async fn load(&self, info: sandcove::SandboxInfo) -> Result<Sandbox> {
        let meta = meta_of(&info);
        Ok(Sandbox::from_parts(
            self.client.clone(),
            &self.config,
            info,
            meta,
        ))
    }

    async fn find(&self, id_or_name: &str) -> Result<Sandbox> {
        if id_or_name.is_empty() {
            return Err(DaytonaError::validation("sandbox_id_or_name is required"));
        }
        match self.client.sandbox(id_or_name).info().await {
            Ok(info) => self.load(info).await,
            Err(e) if e.is_not_found() => {
                // The Daytona name is the core's unique sandbox name.
                let by_name = self
                    .client
                    .list(ListOptions::default().name(id_or_name))
                    .await?;
                match by_name.into_iter().next() {
                    Some(info) => self.load(info).await,
                    // Ended recently (by id or name): say when, still as a not-found.
                    None => match self
                        .client
                        .tombstone(sandcove::ResourceKind::Sandbox, id_or_name)
                        .await
                    {
                        Ok(Some(t)) => Err(t.to_error().into()),
                        _ => Err(e.into()),
                    },
                }
            }
            Err(e) => Err(e.into()),
        }
    }

    async fn list_all(self, query: ListSandboxesQuery) -> Result<Vec<Sandbox>> {
        if matches!(query.limit, Some(l) if l < 1) {
            return Err(DaytonaError::validation("limit must be a positive integer"));
        }
        let infos = self
            .client
            .list(ListOptions::default())
            .await
            .ctx("Failed to list sandboxes: ")?;
        let mut out = Vec::new();
        for info in infos {
            let sb = match self.load(info).await {
                Ok(sb) => sb,
                Err(_) => continue,
            };
            let lower = |s: &str| s.to_lowercase();
            if let Some(p) = &query.id {
                if !lower(&sb.id).starts_with(&lower(p)) {
                    continue;
                }
            }
            if let Some(p) = &query.name {
                if !lower(&sb.name).starts_with(&lower(p)) {
                    continue;
                }
            }
            if let Some(labels) = &query.labels {
                if !labels.iter().all(|(k, v)| sb.labels.get(k) == Some(v)) {
                    continue;
                }
            }
            if let Some(states) = &query.states {
                if !states.is_empty() && !sb.state.is_some_and(|s| states.contains(&s)) {
                    continue;
                }
            }
            if let Some(p) = query.is_public {
                if sb.public != p {
                    continue;
                }
            }
            out.push(sb);
        }
        let field = query.sort.unwrap_or(SandboxListSortField::CreatedAt);
        out.sort_by(|a, b| {
            let ord = match field {
                SandboxListSortField::Name => a.name.cmp(&b.name),
                SandboxListSortField::Cpu => a.cpu.total_cmp(&b.cpu),
                SandboxListSortField::MemoryGib => a.memory.total_cmp(&b.memory),
                SandboxListSortField::DiskGib => a.disk.total_cmp(&b.disk),
                SandboxListSortField::LastActivityAt | SandboxListSortField::CreatedAt => {
                    a.created_at.cmp(&b.created_at)
                }
            };
            ord.then_with(|| a.id.cmp(&b.id))
        });
        if query.order.unwrap_or(SandboxListSortDirection::Desc) == SandboxListSortDirection::Desc {
            out.reverse();
        }
        Ok(out)
    }
}

/// A lazy stream of sandboxes, as Python's `for sb in daytona.list(...)`.
pub struct SandboxIterator {
    inner: Pin<Box<dyn Stream<Item = Result<Sandbox>> + Send>>,
}

impl std::fmt::Debug for SandboxIterator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SandboxIterator")
    }
}

impl SandboxIterator {
    /// `request_timeout`: accepted (calls are local or bounded by the runtime).
    pub fn request_timeout(self, _seconds: impl crate::Seconds) -> Self {
        self
    }

    /// The next sandbox (Python's `async for`), without importing a stream trait:
    /// `while let Some(sb) = sandboxes.next().await { let sb = sb?; … }`.
    pub async fn next(&mut self) -> Option<Result<Sandbox>> {
        futures::StreamExt::next(&mut self.inner).await
    }
}

impl Stream for SandboxIterator {
    type Item = Result<Sandbox>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

use futures::StreamExt as _;

/// Builder of [`Daytona::create`]; await it.
#[must_use = "await the builder to run the call"]
pub struct CreateBuilder {
    daytona: Daytona,
    params: Option<CreateSandboxParams>,
    timeout: f64,
}

impl std::fmt::Debug for CreateBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CreateBuilder")
            .field("params", &self.params)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl CreateBuilder {
    /// `timeout=60` seconds for the whole call; `0` = none.
    pub fn timeout(mut self, seconds: impl Into<f64>) -> Self {
        self.timeout = seconds.into();
        self
    }

    /// `on_snapshot_create_logs=cb`: accepted; never called, since nothing is built here.
    pub fn on_snapshot_create_logs<F: FnMut(&str) + Send + 'static>(self, _callback: F) -> Self {
        self
    }

    async fn run(self) -> Result<Sandbox> {
        let timeout = self.timeout;
        with_timeout("create", timeout, self.run_inner())
            .await
            .ctx("Failed to create sandbox: ")
    }

    async fn run_inner(self) -> Result<Sandbox> {
        let mut resources = sandcove::Resources::default();
        // The image a create from an image runs (`None`: the host base).
        let mut image_template: Option<String> = None;
        let p = match self.params {
            None => CreateSandboxFromSnapshotParams::default(),
            Some(CreateSandboxParams::Snapshot(p)) => p,
            Some(CreateSandboxParams::Image(p)) => {
                if p.resources
                    .as_ref()
                    .is_some_and(|r| r.gpu.is_some_and(|g| g > 0) || r.gpu_type.is_some())
                {
                    return Err(gap("GPU resources"));
                }
                let caps = self.daytona.client.ready().await?;
                let host = host_base().await;
                if let Some(r) = &p.resources {
                    translate::check_resources(r.cpu, r.memory, r.disk, r.gpu, &host)?;
                }
                let name = match &p.image {
                    ImageSource::Name(n) => Some(n.as_str()),
                    ImageSource::Image(_) => None,
                };
                // Only the engine on this machine runs this machine's base; any other image
                // named by reference runs where the runtime runs images (it must have it
                // stored: pulled or imported).
                let host_image = caps.backend == "local"
                    && name.is_some_and(|n| translate::denotes_host_base(n, &host));
                if !host_image {
                    match name {
                        Some(n) if caps.images => image_template = Some(n.to_string()),
                        _ => return Err(image_refusal(name, &host, caps.images)),
                    }
                }
                if let Some(r) = &p.resources {
                    // The disk is the sandbox's tmpfs, sized by the engine when isolated;
                    // memory and CPU limits only where the host lets the engine set them
                    // (elsewhere accepted, not enforced: MAPPING.md).
                    if caps.isolated {
                        resources.disk_mib = r.disk.map(|gib| gib as u64 * 1024);
                    }
                    if caps.memory_limit {
                        resources.memory_mib = r.memory.map(|gib| gib as u64 * 1024);
                    }
                    if caps.cpu_limit {
                        resources.cpu = r.cpu.map(|c| c as f64);
                    }
                }
                CreateSandboxFromSnapshotParams {
                    snapshot: None,
                    name: p.name,
                    language: p.language,
                    os_user: p.os_user,
                    env_vars: p.env_vars,
                    labels: p.labels,
                    public: p.public,
                    auto_stop_interval: p.auto_stop_interval,
                    auto_archive_interval: p.auto_archive_interval,
                    auto_delete_interval: p.auto_delete_interval,
                    volumes: p.volumes,
                    network_block_all: p.network_block_all,
                    network_allow_list: p.network_allow_list,
                    domain_allow_list: p.domain_allow_list,
                    ephemeral: p.ephemeral,
                    linked_sandbox: p.linked_sandbox,
                }
            }
        };
        let language = p.language.clone().unwrap_or_else(|| "python".into());
        translate::check_language(&language)?;
        for (name, v) in [
            ("auto_stop_interval", p.auto_stop_interval),
            ("auto_archive_interval", p.auto_archive_interval),
        ] {
            if v.is_some_and(|v| v < 0) {
                return Err(DaytonaError::validation(format!(
                    "{name} must be a non-negative integer"
                )));
            }
        }
        if p.network_allow_list.is_some() || p.domain_allow_list.is_some() {
            return Err(gap("network_allow_list / domain_allow_list"));
        }
        if p.linked_sandbox.is_some() {
            return Err(gap("linked_sandbox"));
        }
        let client = &self.daytona.client;
        let caps = client.ready().await?;
        let mut labels: BTreeMap<String, String> =
            p.labels.clone().unwrap_or_default().into_iter().collect();
        if labels.keys().any(|k| k.starts_with(META_PREFIX)) {
            return Err(DaytonaError::validation(format!(
                "labels starting with {META_PREFIX:?} are reserved"
            )));
        }
        labels.insert(LANGUAGE_LABEL.into(), language);
        if let Some(name) = &p.name {
            if !sandcove::valid_sandbox_name(name) {
                return Err(DaytonaError::validation(format!(
                    "name {name:?} must be 1-{} ASCII letters, digits, '-', '_' or '.', \
                     starting with a letter or digit",
                    sandcove::MAX_SANDBOX_NAME
                )));
            }
        }
        let mut envs = BTreeMap::new();
        for (k, v) in p.env_vars.clone().unwrap_or_default() {
            translate::check_env_name(&k)?;
            envs.insert(k, v);
        }
        let user = p.os_user.clone().unwrap_or_else(|| DAYTONA_USER.into());
        let home = match user.as_str() {
            DAYTONA_USER => DAYTONA_HOME.to_string(),
            "root" => "/root".to_string(),
            other => format!("/home/{other}"),
        };
        let mut volumes = Vec::new();
        for v in p.volumes.clone().unwrap_or_default() {
            translate::check_mount_path(&v.mount_path)?;
            let mut mount = sandcove::VolumeMount::new(v.volume_id.clone(), v.mount_path.clone());
            mount.subpath = v.subpath.clone();
            volumes.push(mount);
        }
        let snapshot = match p.snapshot.as_deref() {
            None | Some(crate::snapshot::DEFAULT_SNAPSHOT) => None,
            Some(s) => Some(self.daytona.snapshot.get(s).await?.id),
        };
        let auto_stop = p.auto_stop_interval.unwrap_or(translate::DEFAULT_AUTO_STOP);
        let auto_delete = if p.ephemeral == Some(true) {
            Some(0)
        } else {
            p.auto_delete_interval
        };
        let block = p.network_block_all.unwrap_or(false);
        let meta = Meta {
            name: p.name.clone(),
            public: p.public.unwrap_or(false),
            auto_stop_interval: Some(auto_stop),
            auto_archive_interval: p.auto_archive_interval,
            auto_delete_interval: auto_delete,
            network_block_all: block,
            snapshot: p.snapshot.clone(),
            target: self.daytona.config.target.clone(),
            volumes: p
                .volumes
                .clone()
                .unwrap_or_default()
                .into_iter()
                .map(|v| (v.volume_id, v.mount_path, v.subpath))
                .collect(),
            ..Default::default()
        };
        // The facade state goes in with the create: there is no moment where the sandbox
        // exists without it.
        let annotations = BTreeMap::from([(crate::ctx::META_KEY.to_string(), encode_meta(&meta)?)]);
        let mut options = CreateOptions::default();
        options.envs = envs;
        options.labels = labels;
        options.timeout = Some(translate::lease_for_auto_stop(auto_stop));
        // Daytona's default is internet access: isolated internet where the runtime has
        // it, else loopback only with a warning. Never the host's network.
        options.network = if block {
            NetworkPolicy::None
        } else {
            caps.vendor_internet_default()
        };
        options.user = Some(user);
        options.home = Some(home);
        options.snapshot = snapshot;
        options.template = image_template;
        options.volumes = volumes;
        options.resources = resources;
        // The runtime keeps names unique, atomically and wherever it runs.
        options.name = p.name.clone();
        options.annotations = annotations;
        let info = match client.create(options).await {
            Ok(core) => core.info().await?,
            Err(sandcove::Error::AlreadyExists { .. }) => {
                return Err(DaytonaError::Conflict(crate::errors::ErrorDetails::new(
                    format!(
                        "Sandbox with name {} already exists",
                        p.name.as_deref().unwrap_or_default()
                    ),
                    Some(409),
                    Some("CONFLICT"),
                )))
            }
            Err(e) => return Err(e.into()),
        };
        Ok(Sandbox::from_parts(
            client.clone(),
            &self.daytona.config,
            info,
            meta,
        ))
    }
}

awaitable!(CreateBuilder => Sandbox);

/// Read at most 64 KiB of a host file (small system files only).
async fn read_small(path: &str) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let file = tokio::fs::File::open(path).await.ok()?;
    let mut text = String::new();
    file.take(64 * 1024).read_to_string(&mut text).await.ok()?;
    Some(text)
}

/// The base system of the machine this program runs on (where the local engine runs its
/// sandboxes): what an image is compared with. Unknown parts stay empty, so no image matches.
async fn host_base() -> translate::HostBase {
    let os = read_small("/etc/os-release").await.unwrap_or_default();
    let field = |name: &str| {
        os.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix('='))
            .map(|v| v.trim().trim_matches('"').to_string())
            .unwrap_or_default()
    };
    let debian = field("ID") == "debian";
    let python = tokio::fs::read_link("/usr/bin/python3")
        .await
        .ok()
        .and_then(|target| {
            let name = target.file_name()?.to_str()?.to_string();
            let version = name.strip_prefix("python")?.to_string();
            let ok = version.split('.').count() == 2
                && version
                    .split('.')
                    .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
            ok.then_some(version)
        });
    let meminfo = read_small("/proc/meminfo").await.unwrap_or_default();
    let memory_kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    let cpus = tokio::task::spawn_blocking(|| {
        std::thread::available_parallelism().map_or(1, |n| n.get() as u64)
    })
    .await
    .unwrap_or(1);
    translate::HostBase {
        debian_version: if debian {
            field("VERSION_ID")
        } else {
            String::new()
        },
        codename: if debian {
            field("VERSION_CODENAME")
        } else {
            String::new()
        },
        python,
        cpus,
        memory_gib: memory_kib.div_ceil(1024 * 1024),
    }
}

/// The refusal of an image the runtime cannot provide: what runs instead, and where to get
/// the real one.
fn image_refusal(name: Option<&str>, host: &translate::HostBase, images: bool) -> DaytonaError {
    if images {
        // The runtime runs images, but not one described in code.
        return DaytonaError::not_supported(
            "creating a sandbox from a declarative Image (it builds on top of a base)",
            "build the image elsewhere and import it (`sandcove image import`), or pull an \
             image that has what it adds, and create from it by name \
             (CreateSandboxFromImageParams(image=\"NAME\"))",
        );
    }
    let what = match name {
        Some(n) => format!("the image {n:?}"),
        None => "a declarative Image (it builds on top of a base)".to_string(),
    };
    let base = if host.codename.is_empty() {
        "the host's own system".to_string()
    } else {
        format!("the host's {}", host.describe())
    };
    let names = if host.codename.is_empty() {
        String::new()
    } else {
        format!(" (name it as {})", host.examples())
    };
    DaytonaError::not_supported(
        format!("creating a sandbox from {what}"),
        format!(
            "this runtime runs no images: every sandbox runs {base}. Create from \
             the default snapshot or an image naming that base{names}, install what the image \
             adds with process.exec and keep the result with sandbox.create_snapshot(name); \
             to run the real image, use a runtime with images (the embedded engine or \
             `sandcove serve` with an image store) or Daytona itself"
        ),
    )
}

/// Builder of [`Daytona::get`]; await it.
#[derive(Debug)]
#[must_use = "await the builder to run the call"]
pub struct GetBuilder {
    daytona: Daytona,
    id: String,
    request_timeout: Option<f64>,
}

impl GetBuilder {
    /// `request_timeout=None`: seconds the call may take (`None` = no bound).
    pub fn request_timeout(mut self, seconds: impl crate::Seconds) -> Self {
        self.request_timeout = seconds.into_seconds();
        self
    }

    async fn run(self) -> Result<Sandbox> {
        let seconds = self.request_timeout.unwrap_or(0.0);
        with_timeout("get", seconds, self.daytona.find(&self.id))
            .await
            .ctx("Failed to get sandbox: ")
    }
}

awaitable!(GetBuilder => Sandbox);

/// Run `fut` bounded by `seconds` (`0` = unbounded), as Python's `with_timeout` wrapper.
pub(crate) async fn with_timeout<T>(
    name: &str,
    seconds: f64,
    fut: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    if seconds.is_nan() || seconds < 0.0 {
        return Err(DaytonaError::validation(
            "Timeout must be a non-negative number",
        ));
    }
    if seconds == 0.0 {
        return fut.await;
    }
    let secs = seconds.max(1.0).ceil();
    match tokio::time::timeout(Duration::from_secs_f64(secs), fut).await {
        Ok(r) => r,
        Err(_) => Err(DaytonaError::Timeout(crate::errors::ErrorDetails::new(
            format!("Function '{name}' exceeded timeout of {seconds} seconds."),
            None,
            None,
        ))),
    }
}
