//! `Sandbox`: create, connect, list, lifecycle, hosts, snapshots and fork.
//!
//! [`Sandbox`] carries the class methods (`Sandbox::create()`, `Sandbox::kill(id)`, …) and
//! derefs to [`SandboxInstance`], which holds the attributes (`sandbox_id`, `commands`,
//! `files`, `pty`, …) and the instance methods (`sandbox.kill()`, …): the static and the
//! instance forms share their Python names.

use std::collections::BTreeMap;
use std::fmt;
use std::future::IntoFuture;
use std::marker::PhantomData;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use sandcove::{CreateOptions, ListOptions, NetworkPolicy, PreviewOptions, TimeoutAction};

use crate::call::{client, with_request_timeout, BoxFuture, Call, IntoSeconds};
use crate::commands::Commands;
use crate::errors::{Result, SandboxException};
use crate::files::Filesystem;
use crate::gaps::refuse;
use crate::pty::Pty;
use crate::translate::{self, py_dict, py_opt_str, py_str, DateTime};

/// `ALL_TRAFFIC`: the CIDR that matches every address.
pub const ALL_TRAFFIC: &str = "0.0.0.0/0";

/// What a sandbox handle knows about its sandbox, shared by its sub-APIs.
#[derive(Debug)]
pub(crate) struct Inner {
    /// The runtime's handle: every call from the facade goes through it (and so through the
    /// runtime client's validation and capability checks).
    pub core: sandcove::Sandbox,
    pub id: String,
    /// The runtime home of the default user (`/home/user` for sandboxes made here).
    pub home: String,
    /// The default user's name.
    pub user: String,
    /// Sandbox-wide envs.
    pub envs: BTreeMap<String, String>,
}

pub(crate) type Ctx = Arc<Inner>;

impl Inner {
    pub(crate) fn from_info(client: &sandcove::Client, info: &sandcove::SandboxInfo) -> Ctx {
        Arc::new(Inner {
            core: client.sandbox(info.id.clone()),
            id: info.id.clone(),
            home: info.user.home.clone(),
            user: info.user.name.clone(),
            envs: info.envs.clone(),
        })
    }

    /// A user for the runtime: `None` for the default user.
    pub(crate) fn runtime_user(&self, user: Option<&str>) -> Option<String> {
        match user {
            None => None,
            Some(u) if u == self.user || u == translate::E2B_USER => None,
            Some(u) => Some(u.to_string()),
        }
    }

    pub(crate) fn path(&self, path: &str) -> String {
        translate::to_runtime_path(path, &self.home)
    }

    pub(crate) fn e2b_path(&self, path: &str) -> String {
        translate::to_e2b_path(path, &self.home)
    }
}

/// `ConnectionConfig`: the connection settings a sandbox was made with. Vendor credentials
/// are kept only so code that reads them works; they are never sent anywhere.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ConnectionConfig {
    /// `domain`: the runtime's host name (`localhost` for the embedded engine).
    pub domain: String,
    /// `debug`: always `false`.
    pub debug: bool,
    /// `api_key`: as given (ignored).
    pub api_key: Option<String>,
    /// `request_timeout` in seconds, as given.
    pub request_timeout: Option<f64>,
}

/// The domain Sandcove reports as `sandbox_domain`.
pub const SANDBOX_DOMAIN: &str = "localhost";

/// The attributes and instance methods of a sandbox (the target `Sandbox` derefs to).
#[derive(Debug, Clone)]
pub struct SandboxInstance {
    /// `sandbox_id`.
    pub sandbox_id: String,
    /// `sandbox_domain`: `localhost` (the runtime's previews live on the host).
    pub sandbox_domain: String,
    /// `commands`: run and manage processes.
    pub commands: Commands,
    /// `files`: the sandbox filesystem.
    pub files: Filesystem,
    /// `pty`: pseudo-terminals.
    pub pty: Pty,
    /// `connection_config`.
    pub connection_config: ConnectionConfig,
    /// `traffic_access_token`: always `None` (ports are reached through [`SandboxInstance::get_host`]).
    pub traffic_access_token: Option<String>,
    /// `git`: not supported (run `git` with `commands.run`).
    pub git: crate::products::Git,
    pub(crate) ctx: Ctx,
}

/// `e2b.Sandbox` (mirrors `AsyncSandbox`: every network call is `async`).
#[derive(Debug, Clone)]
pub struct Sandbox {
    instance: SandboxInstance,
}

impl Deref for Sandbox {
    type Target = SandboxInstance;
    fn deref(&self) -> &SandboxInstance {
        &self.instance
    }
}

impl Sandbox {
    /// `Sandbox.default_sandbox_timeout`: 300 s.
    pub const DEFAULT_SANDBOX_TIMEOUT: u64 = translate::DEFAULT_SANDBOX_TIMEOUT;
    /// `Sandbox.default_template`: `"base"`.
    pub const DEFAULT_TEMPLATE: &'static str = translate::DEFAULT_TEMPLATE;

    pub(crate) fn from_ctx(ctx: Ctx, connection_config: ConnectionConfig) -> Sandbox {
        Sandbox {
            instance: SandboxInstance {
                sandbox_id: ctx.id.clone(),
                sandbox_domain: SANDBOX_DOMAIN.into(),
                commands: Commands { ctx: ctx.clone() },
                files: Filesystem { ctx: ctx.clone() },
                pty: Pty { ctx: ctx.clone() },
                connection_config,
                traffic_access_token: None,
                git: crate::products::Git,
                ctx,
            },
        }
    }

    /// `Sandbox.create(template=None, timeout=None, metadata=None, envs=None, secure=True,
    /// allow_internet_access=True, mcp=None, network=None, iam=None, lifecycle=None,
    /// volume_mounts=None, **opts)`. Await the builder.
    pub fn create() -> CreateBuilder {
        CreateBuilder::default()
    }

    /// `Sandbox.connect(sandbox_id, timeout=None, **opts)`: attach to a running sandbox or
    /// resume a paused one; the lifetime is only ever extended (to `timeout`, default 300 s).
    pub fn connect(sandbox_id: impl Into<String>) -> ConnectBuilder {
        ConnectBuilder::new(sandbox_id.into(), ConnectionConfig::default())
    }

    /// `Sandbox.kill(sandbox_id, **opts) -> bool`: `false` when there is no such sandbox.
    pub fn kill(sandbox_id: impl Into<String>) -> Call<bool> {
        let id = sandbox_id.into();
        Call::new(async move { kill(&client()?, &id).await })
    }

    /// `Sandbox.set_timeout(sandbox_id, timeout, **opts)`: the sandbox ends `timeout` seconds
    /// from now.
    pub fn set_timeout(sandbox_id: impl Into<String>, timeout: impl IntoSeconds) -> Call<()> {
        let id = sandbox_id.into();
        let secs = timeout.into_seconds();
        Call::new(async move { set_timeout(&client()?, &id, secs).await })
    }

    /// `Sandbox.get_info(sandbox_id, **opts) -> SandboxInfo`.
    pub fn get_info(sandbox_id: impl Into<String>) -> Call<SandboxInfo> {
        let id = sandbox_id.into();
        Call::new(async move {
            let info = client()?.sandbox(id).info().await?;
            Ok(SandboxInfo::from_core(&info, true))
        })
    }

    /// `Sandbox.get_metrics(sandbox_id, start=None, end=None, **opts) -> list[SandboxMetrics]`.
    pub fn get_metrics(sandbox_id: impl Into<String>) -> MetricsBuilder {
        MetricsBuilder {
            sandbox_id: sandbox_id.into(),
            start: None,
            end: None,
            request_timeout: None,
        }
    }

    /// `Sandbox.pause(sandbox_id, keep_memory=True, **opts) -> bool`: `false` when already
    /// paused.
    pub fn pause(sandbox_id: impl Into<String>) -> PauseBuilder {
        PauseBuilder {
            sandbox_id: sandbox_id.into(),
            keep_memory: true,
            request_timeout: None,
        }
    }

    /// `Sandbox.beta_pause(...)`: deprecated alias of [`Sandbox::pause`].
    pub fn beta_pause(sandbox_id: impl Into<String>) -> PauseBuilder {
        Sandbox::pause(sandbox_id)
    }

    /// `Sandbox.list(query=None, limit=None, next_token=None, order=None, **opts) ->
    /// SandboxPaginator`. No call is made until `next_items()`; the builder is the paginator,
    /// and awaiting it (`Sandbox::list().query(q).await?`) yields it as well.
    pub fn list() -> SandboxPaginator {
        SandboxPaginator {
            has_next: true,
            next_token: None,
            limit: None,
            query: None,
            order: None,
        }
    }

    /// `Sandbox.list_snapshots(sandbox_id=None, limit=None, next_token=None, name=None,
    /// **opts) -> SnapshotPaginator`.
    pub fn list_snapshots() -> SnapshotPaginator {
        SnapshotPaginator {
            has_next: true,
            next_token: None,
            limit: None,
            sandbox_id: None,
            name: None,
        }
    }

    /// `Sandbox.delete_snapshot(snapshot_id, **opts) -> bool`: `false` when not found.
    pub fn delete_snapshot(snapshot_id: impl Into<String>) -> Call<bool> {
        let id = snapshot_id.into();
        Call::new(async move { delete_snapshot_on(&client()?, &id).await })
    }

    /// `Sandbox.fork(sandbox_id, timeout=None, count=None, **opts) -> list[Sandbox |
    /// Exception]`.
    pub fn fork(sandbox_id: impl Into<String>) -> ForkBuilder {
        ForkBuilder {
            sandbox_id: sandbox_id.into(),
            timeout: None,
            count: None,
        }
    }

    /// `Sandbox.update_network(sandbox_id, network, **opts)`: not supported (see MAPPING.md).
    pub fn update_network(sandbox_id: impl Into<String>, network: SandboxNetworkOpts) -> Call<()> {
        let _ = (sandbox_id.into(), network);
        Call::new(async { Err(refuse("update_network")) })
    }
}

impl SandboxInstance {
    /// `sbx.connect(timeout=None, **opts) -> Sandbox`: resume if paused; extend the lifetime.
    pub fn connect(&self) -> ConnectBuilder {
        ConnectBuilder::new(self.sandbox_id.clone(), self.connection_config.clone())
    }

    /// The runtime's saved reference to this sandbox (not an E2B attribute):
    /// `sandcove:v1:<runtime>:sandbox:<sandbox_id>`, which `sandcove::Client::reopen` checks
    /// from a later program. `Sandbox.connect(sandbox_id)` keeps working with the bare id.
    pub fn sandcove_reference(&self) -> Result<sandcove::Reference> {
        Ok(self.ctx.core.reference()?)
    }

    /// `sbx.kill(**opts) -> bool`.
    pub fn kill(&self) -> Call<bool> {
        Sandbox::kill(self.sandbox_id.clone())
    }

    /// `sbx.set_timeout(timeout, **opts)`.
    pub fn set_timeout(&self, timeout: impl IntoSeconds) -> Call<()> {
        Sandbox::set_timeout(self.sandbox_id.clone(), timeout)
    }

    /// `sbx.get_info(**opts) -> SandboxInfo`.
    pub fn get_info(&self) -> Call<SandboxInfo> {
        Sandbox::get_info(self.sandbox_id.clone())
    }

    /// `sbx.get_metrics(start=None, end=None, **opts) -> list[SandboxMetrics]`.
    pub fn get_metrics(&self) -> MetricsBuilder {
        Sandbox::get_metrics(self.sandbox_id.clone())
    }

    /// `sbx.pause(keep_memory=True, **opts) -> bool`.
    pub fn pause(&self) -> PauseBuilder {
        Sandbox::pause(self.sandbox_id.clone())
    }

    /// `sbx.beta_pause(...)`: deprecated alias of `pause`.
    pub fn beta_pause(&self) -> PauseBuilder {
        self.pause()
    }

    /// `sbx.is_running(request_timeout=None) -> bool`: `true` while the sandbox runs.
    pub fn is_running(&self) -> Call<bool> {
        let ctx = self.ctx.clone();
        Call::new(async move {
            match ctx.core.info().await {
                Ok(info) => Ok(info.state == sandcove::SandboxState::Running),
                Err(e) if e.is_not_found() => Ok(false),
                Err(e) => Err(e.into()),
            }
        })
    }

    /// `sbx.get_host(port) -> str`: `host:port` on which the sandbox's `port` is reachable
    /// (no scheme; prepend `http://`). Unlike E2B's pure string function this exposes the port
    /// (so it is `async`); it needs the runtime's previews.
    pub fn get_host(&self, port: u16) -> Call<String> {
        let ctx = self.ctx.clone();
        Call::new(async move {
            let preview = ctx
                .core
                .expose_port(
                    PreviewOptions::new(port)
                        .public(true)
                        .token_header("e2b-traffic-access-token"),
                )
                .await?;
            Ok(preview.host)
        })
    }

    /// `sbx.upload_url(path=None, user=None, use_signature_expiration=None)`: a URL that
    /// takes a `POST` multipart/form-data upload (field `file`) into `path` (`""`: the
    /// part's filename), with no other credential. Unlike E2B's pure function it starts the
    /// sandbox's file server and exposes it (so it is `async`); it needs the runtime's
    /// previews.
    pub fn upload_url(&self, path: impl Into<String>) -> crate::transfer::FileUrlBuilder {
        crate::transfer::FileUrlBuilder::upload(self.ctx.clone(), path.into())
    }

    /// `sbx.download_url(path, user=None, use_signature_expiration=None)`: a URL whose plain
    /// `GET` returns the file's bytes (see [`SandboxInstance::upload_url`]).
    pub fn download_url(&self, path: impl Into<String>) -> crate::transfer::FileUrlBuilder {
        crate::transfer::FileUrlBuilder::download(self.ctx.clone(), path.into())
    }

    /// `sbx.get_mcp_url()`: not supported.
    pub fn get_mcp_url(&self) -> Result<String> {
        Err(refuse("mcp_url"))
    }

    /// `sbx.get_mcp_token()`: not supported.
    pub fn get_mcp_token(&self) -> Result<Option<String>> {
        Err(refuse("mcp_url"))
    }

    /// `sbx.create_snapshot(name=None, **opts) -> SnapshotInfo`.
    pub fn create_snapshot(&self) -> SnapshotBuilder {
        SnapshotBuilder {
            ctx: self.ctx.clone(),
            name: None,
        }
    }

    /// `sbx.list_snapshots(limit=None, next_token=None, name=None)`: this sandbox's snapshots.
    pub fn list_snapshots(&self) -> SnapshotPaginator {
        Sandbox::list_snapshots().sandbox_id(self.sandbox_id.clone())
    }

    /// `sbx.fork(timeout=None, count=None, **opts) -> list[Sandbox | Exception]`.
    pub fn fork(&self) -> ForkBuilder {
        Sandbox::fork(self.sandbox_id.clone())
    }

    /// `sbx.update_network(network, **opts)`: not supported (see MAPPING.md).
    pub fn update_network(&self, network: SandboxNetworkOpts) -> Call<()> {
        Sandbox::update_network(self.sandbox_id.clone(), network)
    }
}

pub(crate) async fn kill(client: &sandcove::Client, id: &str) -> Result<bool> {
    match client.sandbox(id).destroy().await {
        Ok(()) => Ok(true),
        Err(e) if e.is_not_found() => Ok(false),
        Err(e) => Err(e.into()),
    }
}

fn whole_seconds(secs: Option<f64>) -> Result<Duration> {
    match secs {
        Some(s) if s.is_finite() && s >= 0.0 => Ok(Duration::from_secs(s.ceil() as u64)),
        Some(s) => Err(SandboxException::invalid_argument(format!(
            "timeout must be a non-negative number of seconds, got {s}"
        ))),
        None => Ok(Duration::from_secs(translate::DEFAULT_SANDBOX_TIMEOUT)),
    }
}

pub(crate) async fn set_timeout(
    client: &sandcove::Client,
    id: &str,
    secs: Option<f64>,
) -> Result<()> {
    let timeout = whole_seconds(secs)?;
    client.sandbox(id).set_timeout(timeout).await?;
    Ok(())
}

/// `network=` of `Sandbox.create`: `SandboxNetworkOpts`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SandboxNetworkOpts {
    /// `allow_out`: CIDRs or hosts allowed out.
    pub allow_out: Option<Vec<String>>,
    /// `deny_out`: CIDRs denied out; `[ALL_TRAFFIC]` alone is supported.
    pub deny_out: Option<Vec<String>>,
    /// `rules`.
    pub rules: Option<Vec<serde_json::Value>>,
    /// `egress_proxy`.
    pub egress_proxy: Option<serde_json::Value>,
    /// `allow_public_traffic`: `True` (the default) is supported.
    pub allow_public_traffic: Option<bool>,
    /// `mask_request_host`.
    pub mask_request_host: Option<String>,
}

/// `lifecycle=` of `Sandbox.create`: `SandboxLifecycle`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxLifecycle {
    /// `on_timeout`: `"kill"` (default) or `"pause"`.
    pub on_timeout: Option<String>,
    /// `keep_memory` of the pause action.
    pub keep_memory: Option<bool>,
    /// `auto_resume`.
    pub auto_resume: Option<bool>,
}

/// The builder of `Sandbox.create(...)`; await it. `S` is the sandbox class it yields.
#[derive(Debug)]
#[must_use = "a call does nothing until awaited"]
pub struct CreateBuilder<S = Sandbox> {
    pub(crate) template: Option<String>,
    timeout: Option<f64>,
    metadata: BTreeMap<String, String>,
    envs: BTreeMap<String, String>,
    secure: Option<bool>,
    allow_internet_access: Option<bool>,
    network: Option<SandboxNetworkOpts>,
    lifecycle: Option<SandboxLifecycle>,
    mcp: bool,
    iam: bool,
    volume_mounts: BTreeMap<String, String>,
    config: ConnectionConfig,
    _target: PhantomData<fn() -> S>,
}

impl<S> Default for CreateBuilder<S> {
    fn default() -> Self {
        CreateBuilder {
            template: None,
            timeout: None,
            metadata: BTreeMap::new(),
            envs: BTreeMap::new(),
            secure: None,
            allow_internet_access: None,
            network: None,
            lifecycle: None,
            mcp: false,
            iam: false,
            volume_mounts: BTreeMap::new(),
            config: ConnectionConfig::default(),
            _target: PhantomData,
        }
    }
}

impl<S> CreateBuilder<S> {
    /// `template=`: `None`/`"base"` is the host's system directories; a snapshot id works too.
    pub fn template(mut self, template: impl crate::OptionalString) -> Self {
        self.template = template.into_optional();
        self
    }

    /// `timeout=`: sandbox lifetime in seconds (default 300; `0` means 300, as in E2B).
    pub fn timeout(mut self, timeout: impl IntoSeconds) -> Self {
        self.timeout = timeout.into_seconds();
        self
    }

    /// `metadata=`: string pairs returned by `list`/`get_info` and filterable.
    pub fn metadata<K: Into<String>, V: Into<String>>(
        mut self,
        metadata: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        self.metadata = metadata
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        self
    }

    /// `envs=`: environment for every command, PTY and code run.
    pub fn envs<K: Into<String>, V: Into<String>>(
        mut self,
        envs: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        self.envs = envs
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        self
    }

    /// `secure=`: accepted; there is no envd access token to protect here (signed URLs are
    /// not supported either way).
    pub fn secure(mut self, secure: bool) -> Self {
        self.secure = Some(secure);
        self
    }

    /// `allow_internet_access=`: `True` is isolated internet access (`NetworkPolicy::Internet`;
    /// `Unavailable` where the runtime lacks it), `False` loopback only; unset, internet where
    /// the runtime has it, else loopback only with one warning.
    pub fn allow_internet_access(mut self, allow: bool) -> Self {
        self.allow_internet_access = Some(allow);
        self
    }

    /// `network=`: only "deny all egress" (`deny_out=[ALL_TRAFFIC]`) and
    /// `allow_public_traffic=True` are supported.
    pub fn network(mut self, network: SandboxNetworkOpts) -> Self {
        self.network = Some(network);
        self
    }

    /// `lifecycle=`: `on_timeout` `"kill"` or `"pause"` (needs the runtime's pause), and
    /// `auto_resume`.
    pub fn lifecycle(mut self, lifecycle: SandboxLifecycle) -> Self {
        self.lifecycle = Some(lifecycle);
        self
    }

    /// `mcp=`: not supported (see MAPPING.md).
    pub fn mcp(mut self, _mcp: serde_json::Value) -> Self {
        self.mcp = true;
        self
    }

    /// `iam=`: not supported (see MAPPING.md).
    pub fn iam(mut self, _iam: serde_json::Value) -> Self {
        self.iam = true;
        self
    }

    /// `volume_mounts=`: mount path → volume name (needs the runtime's volumes).
    pub fn volume_mounts<K: Into<String>, V: Into<String>>(
        mut self,
        mounts: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        self.volume_mounts = mounts
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        self
    }

    /// `api_key=`: accepted and ignored (never sent anywhere).
    pub fn api_key(mut self, api_key: impl crate::OptionalString) -> Self {
        self.config.api_key = api_key.into_optional();
        self
    }

    /// `request_timeout=`: bounds the create call, seconds.
    pub fn request_timeout(mut self, secs: impl IntoSeconds) -> Self {
        self.config.request_timeout = secs.into_seconds();
        self
    }

    /// Validate and translate into core options. Pure apart from the capability and snapshot
    /// look-ups; nothing is created.
    pub(crate) async fn options(&self, client: &sandcove::Client) -> Result<CreateOptions> {
        if self.mcp {
            return Err(refuse("mcp"));
        }
        if self.iam {
            return Err(refuse("iam"));
        }
        let caps = client.ready().await?;
        let mut options = CreateOptions::default()
            .user(translate::E2B_USER)
            .home(translate::E2B_HOME);
        options.labels = self.metadata.clone();
        // Template: the base filesystem, or a snapshot id.
        let template = self
            .template
            .clone()
            .unwrap_or_else(|| translate::DEFAULT_TEMPLATE.into());
        if template != translate::DEFAULT_TEMPLATE
            && template != crate::code_interpreter::DEFAULT_TEMPLATE
        {
            let snapshot = if caps.snapshots {
                client
                    .snapshots()
                    .await?
                    .into_iter()
                    .find(|s| s.id == template || s.name.as_deref() == Some(&template))
            } else {
                None
            };
            match snapshot {
                Some(s) => options.snapshot = Some(s.id),
                None => {
                    // A snapshot this runtime deleted is not found (and says when), not a
                    // custom template.
                    let deleted = if caps.snapshots {
                        client
                            .backend()
                            .tombstone(sandcove::ResourceKind::Snapshot, &template)
                            .await
                            .ok()
                            .flatten()
                    } else {
                        None
                    };
                    return Err(match deleted {
                        Some(t) => t.to_error().into(),
                        None => refuse("custom_template"),
                    });
                }
            }
        }
        // Which vendor made it (and from what), kept outside the sandbox: `sandcove ls`
        // shows the vendor column from it.
        options
            .annotations
            .insert(TEMPLATE_ANNOTATION.into(), template.clone());
        // Lifetime: `timeout or 300`.
        let secs = match self.timeout {
            Some(0.0) => None,
            other => other,
        };
        options.timeout = Some(whole_seconds(secs)?);
        // Envs: E2B's defaults, then the caller's.
        options.envs = translate::default_sandbox_envs(&template);
        options
            .envs
            .extend(self.envs.iter().map(|(k, v)| (k.clone(), v.clone())));
        // Network.
        let mut internet = self.allow_internet_access;
        if let Some(net) = &self.network {
            let deny_all = net.deny_out.as_deref() == Some(&[ALL_TRAFFIC.to_string()][..]);
            let unsupported = net.allow_out.is_some()
                || (net.deny_out.is_some() && !deny_all)
                || net.rules.is_some()
                || net.egress_proxy.is_some()
                || net.mask_request_host.is_some()
                || net.allow_public_traffic == Some(false);
            if unsupported {
                return Err(refuse("network_rules"));
            }
            if deny_all {
                internet = Some(false);
            }
        }
        options.network = match internet {
            Some(false) => NetworkPolicy::None,
            // Asked for explicitly: the runtime refuses it (Unavailable) where it cannot.
            Some(true) => NetworkPolicy::Internet,
            // E2B's default is internet access: isolated internet where the runtime has it,
            // else loopback only with a warning. Never the host's network.
            None => caps.vendor_internet_default(),
        };
        // Lifecycle.
        if let Some(lc) = &self.lifecycle {
            let pause = match lc.on_timeout.as_deref() {
                None | Some("kill") => false,
                Some("pause") => true,
                Some(other) => {
                    return Err(SandboxException::invalid_argument(format!(
                        "lifecycle.on_timeout must be 'kill' or 'pause', got '{other}'"
                    )))
                }
            };
            if lc.auto_resume == Some(true) && !pause {
                return Err(SandboxException::invalid_argument(
                    "auto_resume requires on_timeout='pause'",
                ));
            }
            if lc.keep_memory.is_some() && !pause {
                return Err(SandboxException::invalid_argument(
                    "keep_memory can only be given with the pause action",
                ));
            }
            if lc.keep_memory == Some(false) {
                return Err(refuse("keep_memory_false"));
            }
            if pause {
                if !caps.pause {
                    return Err(sandcove::Error::not_supported(
                        "lifecycle on_timeout='pause'",
                        "this runtime cannot pause yet; use on_timeout='kill' with a longer timeout",
                    )
                    .into());
                }
                options.on_timeout = TimeoutAction::Pause;
                options.auto_resume = lc.auto_resume.unwrap_or(false);
            }
        }
        // Volumes.
        if !self.volume_mounts.is_empty() {
            if !caps.volumes {
                return Err(sandcove::Error::not_supported(
                    "Sandbox.create(volume_mounts=...)",
                    "this runtime has no volumes yet; copy files in with files.write",
                )
                .into());
            }
            options.volumes = self
                .volume_mounts
                .iter()
                .map(|(path, volume)| sandcove::VolumeMount::new(volume.clone(), path.clone()))
                .collect();
        }
        let _ = self.secure;
        Ok(options)
    }

    pub(crate) async fn run(self) -> Result<Sandbox> {
        let client = client()?;
        let options = self.options(&client).await?;
        let (_, info) = client.create_described(options).await?;
        let mut config = self.config;
        config.domain = SANDBOX_DOMAIN.into();
        Ok(Sandbox::from_ctx(Inner::from_info(&client, &info), config))
    }
}

impl<S: From<Sandbox> + Send + 'static> IntoFuture for CreateBuilder<S> {
    type Output = Result<S>;
    type IntoFuture = BoxFuture<'static, S>;
    fn into_future(self) -> Self::IntoFuture {
        let limit = self.config.request_timeout;
        with_request_timeout(
            Box::pin(async move { self.run().await.map(S::from) }),
            limit,
        )
    }
}

/// The builder of `Sandbox.connect(...)`; await it. `S` is the sandbox class it yields.
#[derive(Debug)]
#[must_use = "a call does nothing until awaited"]
pub struct ConnectBuilder<S = Sandbox> {
    sandbox_id: String,
    timeout: Option<f64>,
    config: ConnectionConfig,
    _target: PhantomData<fn() -> S>,
}

impl<S> ConnectBuilder<S> {
    pub(crate) fn new(sandbox_id: String, config: ConnectionConfig) -> Self {
        ConnectBuilder {
            sandbox_id,
            timeout: None,
            config,
            _target: PhantomData,
        }
    }

    /// `timeout=`: the sandbox lives at least this many seconds from now (default 300).
    pub fn timeout(mut self, timeout: impl IntoSeconds) -> Self {
        self.timeout = timeout.into_seconds();
        self
    }

    /// `api_key=`: accepted and ignored.
    pub fn api_key(mut self, api_key: impl crate::OptionalString) -> Self {
        self.config.api_key = api_key.into_optional();
        self
    }

    /// `request_timeout=`: bounds the call, seconds.
    pub fn request_timeout(mut self, secs: impl IntoSeconds) -> Self {
        self.config.request_timeout = secs.into_seconds();
        self
    }

    pub(crate) async fn run(self) -> Result<Sandbox> {
        let client = client()?;
        let info = connect_on(&client, &self.sandbox_id, self.timeout).await?;
        let mut config = self.config;
        config.domain = SANDBOX_DOMAIN.into();
        Ok(Sandbox::from_ctx(Inner::from_info(&client, &info), config))
    }
}

/// `Sandbox.connect(id, timeout)` on `client`: resume a paused sandbox and extend (never
/// shorten) its lifetime to `timeout` seconds from now (default 300). Shared by the Rust
/// facade and the wire protocol.
pub(crate) async fn connect_on(
    client: &sandcove::Client,
    sandbox_id: &str,
    timeout: Option<f64>,
) -> Result<sandcove::SandboxInfo> {
    let timeout = whole_seconds(timeout)?;
    let sandbox = client.sandbox(sandbox_id);
    let mut info = match sandbox.info().await {
        Ok(info) => info,
        Err(e) if e.is_not_found() => {
            // A saved id of a sandbox that ended recently says when and why.
            let (e, why) = match client
                .tombstone(sandcove::ResourceKind::Sandbox, sandbox_id)
                .await
            {
                Ok(Some(t)) => {
                    let gone = t.to_error();
                    let why = format!(": {gone}");
                    (gone, why)
                }
                _ => (e, String::new()),
            };
            return Err(SandboxException::SandboxNotFound {
                message: format!("Paused sandbox {sandbox_id} not found{why}"),
                source: Some(Box::new(e)),
            });
        }
        Err(e) => return Err(e.into()),
    };
    if info.state == sandcove::SandboxState::Paused {
        info = sandbox.resume().await?;
    }
    let wanted = sandcove::now_millis() + timeout.as_millis() as u64;
    if info.ends_at < wanted {
        info = sandbox.set_timeout(timeout).await?;
    }
    Ok(info)
}

impl<S: From<Sandbox> + Send + 'static> IntoFuture for ConnectBuilder<S> {
    type Output = Result<S>;
    type IntoFuture = BoxFuture<'static, S>;
    fn into_future(self) -> Self::IntoFuture {
        let limit = self.config.request_timeout;
        with_request_timeout(
            Box::pin(async move { self.run().await.map(S::from) }),
            limit,
        )
    }
}

/// `SandboxState`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub enum SandboxState {
    /// `RUNNING = "running"`.
    Running,
    /// `PAUSED = "paused"`.
    Paused,
}

impl SandboxState {
    /// The string value (`"running"`, `"paused"`).
    pub fn value(&self) -> &'static str {
        match self {
            SandboxState::Running => "running",
            SandboxState::Paused => "paused",
        }
    }

    fn core(self) -> sandcove::SandboxState {
        match self {
            SandboxState::Running => sandcove::SandboxState::Running,
            SandboxState::Paused => sandcove::SandboxState::Paused,
        }
    }
}

impl fmt::Debug for SandboxState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "<SandboxState.{}: '{}'>",
            self.value().to_uppercase(),
            self.value()
        )
    }
}

/// `SandboxInfoLifecycle`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxInfoLifecycle {
    /// `on_timeout`: `"kill"` or `"pause"`.
    pub on_timeout: String,
    /// `auto_resume`.
    pub auto_resume: bool,
}

/// `SandboxInfo`: what `get_info` and `list` report.
#[derive(Clone, PartialEq)]
pub struct SandboxInfo {
    /// `sandbox_id`.
    pub sandbox_id: String,
    /// `sandbox_domain` (only from `get_info`).
    pub sandbox_domain: Option<String>,
    /// `template_id`.
    pub template_id: String,
    /// `name`: the template alias.
    pub name: Option<String>,
    /// `metadata`.
    pub metadata: BTreeMap<String, String>,
    /// `started_at`.
    pub started_at: DateTime,
    /// `end_at`: when the sandbox's lifetime ends.
    pub end_at: DateTime,
    /// `state`.
    pub state: SandboxState,
    /// `cpu_count`.
    pub cpu_count: i64,
    /// `memory_mb`.
    pub memory_mb: i64,
    /// `envd_version`: reported as `99.99.99` so no feature gate trips.
    pub envd_version: String,
    /// `allow_internet_access` (only from `get_info`).
    pub allow_internet_access: Option<bool>,
    /// `lifecycle` (only from `get_info`, as on E2B).
    pub lifecycle: Option<SandboxInfoLifecycle>,
    /// `volume_mounts`: `{"name", "path"}` pairs.
    pub volume_mounts: Vec<BTreeMap<String, String>>,
}

impl SandboxInfo {
    pub(crate) fn from_core(info: &sandcove::SandboxInfo, detail: bool) -> SandboxInfo {
        let template = if info.template.is_empty() {
            translate::DEFAULT_TEMPLATE.to_string()
        } else {
            info.template.clone()
        };
        SandboxInfo {
            sandbox_id: info.id.clone(),
            sandbox_domain: detail.then(|| SANDBOX_DOMAIN.to_string()),
            template_id: template.clone(),
            name: Some(template),
            metadata: info.labels.clone(),
            started_at: DateTime::from_unix_millis(info.created_at),
            end_at: DateTime::from_unix_millis(info.ends_at),
            state: if info.state == sandcove::SandboxState::Paused {
                SandboxState::Paused
            } else {
                SandboxState::Running
            },
            cpu_count: info
                .resources
                .cpu
                .map(|c| c.ceil() as i64)
                .unwrap_or_else(|| {
                    std::thread::available_parallelism()
                        .map(|n| n.get() as i64)
                        .unwrap_or(1)
                }),
            memory_mb: info
                .resources
                .memory_mib
                .map(|m| m as i64)
                .unwrap_or_else(host_memory_mb),
            envd_version: translate::ENVD_VERSION.into(),
            allow_internet_access: detail.then_some(info.network != NetworkPolicy::None),
            lifecycle: detail.then(|| SandboxInfoLifecycle {
                on_timeout: match info.on_timeout {
                    sandcove::TimeoutAction::Pause => "pause".into(),
                    _ => "kill".into(),
                },
                auto_resume: info.auto_resume,
            }),
            volume_mounts: info
                .volumes
                .iter()
                .map(|v| {
                    BTreeMap::from([
                        ("name".to_string(), v.volume.clone()),
                        ("path".to_string(), v.path.clone()),
                    ])
                })
                .collect(),
        }
    }
}

fn host_memory_mb() -> i64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<i64>().ok())
        })
        .map(|kb| kb / 1024)
        .unwrap_or(0)
}

impl fmt::Debug for SandboxInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SandboxInfo(sandbox_id={}, sandbox_domain={}, template_id={}, name={}, metadata={}, started_at={:?}, end_at={:?}, state={:?}, cpu_count={}, memory_mb={}, envd_version={}, allow_internet_access={}, lifecycle={:?}, volume_mounts={:?})",
            py_str(&self.sandbox_id),
            py_opt_str(self.sandbox_domain.as_deref()),
            py_str(&self.template_id),
            py_opt_str(self.name.as_deref()),
            py_dict(&self.metadata),
            self.started_at,
            self.end_at,
            self.state,
            self.cpu_count,
            self.memory_mb,
            py_str(&self.envd_version),
            match self.allow_internet_access {
                Some(true) => "True",
                Some(false) => "False",
                None => "None",
            },
            self.lifecycle,
            self.volume_mounts,
        )
    }
}

/// `SandboxQuery`: filters of `Sandbox.list`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SandboxQuery {
    /// `metadata`: every pair must match exactly.
    pub metadata: Option<BTreeMap<String, String>>,
    /// `state`: any of these (default running and paused).
    pub state: Option<Vec<SandboxState>>,
    /// `started_after` (inclusive).
    pub started_after: Option<DateTime>,
    /// `template`: template id or alias.
    pub template: Option<String>,
}

/// `SandboxPaginator`: pages of `SandboxInfo`, newest first by default.
#[derive(Debug, Clone)]
pub struct SandboxPaginator {
    /// `has_next`: starts `true`.
    pub has_next: bool,
    /// `next_token`.
    pub next_token: Option<String>,
    /// `limit`: page size (1..=100, default 100).
    pub limit: Option<i64>,
    /// `query`.
    pub query: Option<SandboxQuery>,
    /// `order`: `"asc"` or `"desc"` (default) by start time.
    pub order: Option<String>,
}

impl SandboxPaginator {
    /// `query=`: a [`SandboxQuery`] or `None`.
    pub fn query(mut self, query: impl Into<Option<SandboxQuery>>) -> Self {
        self.query = query.into();
        self
    }

    /// `limit=`.
    pub fn limit(mut self, limit: i64) -> Self {
        self.limit = Some(limit);
        self
    }

    /// `next_token=`: start from this page.
    pub fn next_token(mut self, token: impl crate::OptionalString) -> Self {
        self.next_token = token.into_optional();
        self
    }

    /// `order=`: `"asc"` or `"desc"`.
    pub fn order(mut self, order: impl crate::OptionalString) -> Self {
        self.order = order.into_optional();
        self
    }

    /// `paginator.next_items(**opts) -> list[SandboxInfo]`: the next page. Raises
    /// `SandboxException("No more items to fetch")` after the last page.
    pub async fn next_items(&mut self) -> Result<Vec<SandboxInfo>> {
        self.next_items_on(&client()?).await
    }

    /// [`next_items`](Self::next_items) on `client`.
    pub(crate) async fn next_items_on(
        &mut self,
        client: &sandcove::Client,
    ) -> Result<Vec<SandboxInfo>> {
        Ok(self
            .next_core_items_on(client)
            .await?
            .iter()
            .map(|i| SandboxInfo::from_core(i, false))
            .collect())
    }

    /// The next page as the core's infos (shared with the wire protocol, which answers with
    /// more fields than `SandboxInfo` holds).
    pub(crate) async fn next_core_items_on(
        &mut self,
        client: &sandcove::Client,
    ) -> Result<Vec<sandcove::SandboxInfo>> {
        if !self.has_next {
            return Err(SandboxException::sandbox("No more items to fetch"));
        }
        let limit = page_limit(self.limit)?;
        let descending = match self.order.as_deref() {
            None | Some("desc") => true,
            Some("asc") => false,
            Some(other) => {
                return Err(SandboxException::invalid_argument(format!(
                    "order must be 'asc' or 'desc', got '{other}'"
                )))
            }
        };
        let offset = page_offset(self.next_token.as_deref())?;
        let query = self.query.clone().unwrap_or_default();
        let mut options = ListOptions::default();
        options.labels = query.metadata.clone().unwrap_or_default();
        options.states = query
            .state
            .clone()
            .unwrap_or_else(|| vec![SandboxState::Running, SandboxState::Paused])
            .into_iter()
            .map(SandboxState::core)
            .collect();
        let mut all: Vec<sandcove::SandboxInfo> = client
            .list(options)
            .await?
            .into_iter()
            .filter(|i| {
                query
                    .started_after
                    .is_none_or(|t| i.created_at >= t.unix_millis)
            })
            .filter(|i| {
                query.template.as_deref().is_none_or(|t| {
                    let name = if i.template.is_empty() {
                        translate::DEFAULT_TEMPLATE
                    } else {
                        &i.template
                    };
                    name == t
                })
            })
            .collect();
        all.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        if descending {
            all.reverse();
        }
        let page: Vec<sandcove::SandboxInfo> =
            all.iter().skip(offset).take(limit).cloned().collect();
        self.next_token = next_page_token(offset, limit, all.len());
        self.has_next = self.next_token.is_some();
        Ok(page)
    }
}

fn page_limit(limit: Option<i64>) -> Result<usize> {
    match limit {
        None => Ok(100),
        Some(n) if (1..=100).contains(&n) => Ok(n as usize),
        Some(n) => Err(SandboxException::invalid_argument(format!(
            "limit must be between 1 and 100, got {n}"
        ))),
    }
}

/// The offset a `next_token` stands for: the decimal position this facade hands out, at
/// most 18 digits (a forged longer or signed one is refused; the end of the next page is
/// computed without overflow).
fn page_offset(token: Option<&str>) -> Result<usize> {
    let invalid = |t: &str| {
        let shown: String = t.chars().take(32).collect();
        SandboxException::invalid_argument(format!("invalid next_token '{shown}'"))
    };
    match token {
        None => Ok(0),
        Some(t) if t.is_empty() || t.len() > 18 || !t.bytes().all(|b| b.is_ascii_digit()) => {
            Err(invalid(t))
        }
        Some(t) => t.parse().map_err(|_| invalid(t)),
    }
}

/// The `next_token` after a page of `limit` from `offset` out of `total`, if any is left.
fn next_page_token(offset: usize, limit: usize, total: usize) -> Option<String> {
    let end = offset.saturating_add(limit);
    (end < total).then(|| end.to_string())
}

/// `SnapshotInfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// `snapshot_id`: usable as `template` in `Sandbox.create`.
    pub snapshot_id: String,
    /// `names`.
    pub names: Vec<String>,
}

impl SnapshotInfo {
    fn from_core(s: &sandcove::SnapshotInfo) -> Self {
        SnapshotInfo {
            snapshot_id: s.id.clone(),
            names: s.name.iter().cloned().collect(),
        }
    }
}

// `AsyncSandbox.list()` hands back its paginator without a request; awaiting the builder
// (as every other call here is awaited) yields that paginator, still unfetched.
impl IntoFuture for SandboxPaginator {
    type Output = Result<SandboxPaginator>;
    type IntoFuture = std::future::Ready<Result<SandboxPaginator>>;
    fn into_future(self) -> Self::IntoFuture {
        std::future::ready(Ok(self))
    }
}

/// `SnapshotPaginator`.
#[derive(Debug, Clone)]
pub struct SnapshotPaginator {
    /// `has_next`.
    pub has_next: bool,
    /// `next_token`.
    pub next_token: Option<String>,
    /// `limit`.
    pub limit: Option<i64>,
    /// `sandbox_id` filter.
    pub sandbox_id: Option<String>,
    /// `name` filter.
    pub name: Option<String>,
}

impl SnapshotPaginator {
    /// `sandbox_id=`.
    pub fn sandbox_id(mut self, id: impl crate::OptionalString) -> Self {
        self.sandbox_id = id.into_optional();
        self
    }

    /// `name=`.
    pub fn name(mut self, name: impl crate::OptionalString) -> Self {
        self.name = name.into_optional();
        self
    }

    /// `limit=`.
    pub fn limit(mut self, limit: i64) -> Self {
        self.limit = Some(limit);
        self
    }

    /// `next_token=`.
    pub fn next_token(mut self, token: impl crate::OptionalString) -> Self {
        self.next_token = token.into_optional();
        self
    }

    /// `next_items() -> list[SnapshotInfo]`.
    pub async fn next_items(&mut self) -> Result<Vec<SnapshotInfo>> {
        self.next_items_on(&client()?).await
    }

    /// One page from `client`'s runtime (the wire listener's client, or the facade's).
    pub(crate) async fn next_items_on(
        &mut self,
        client: &sandcove::Client,
    ) -> Result<Vec<SnapshotInfo>> {
        if !self.has_next {
            return Err(SandboxException::sandbox("No more items to fetch"));
        }
        let limit = page_limit(self.limit)?;
        let offset = page_offset(self.next_token.as_deref())?;
        let mut all: Vec<sandcove::SnapshotInfo> = client
            .snapshots()
            .await?
            .into_iter()
            .filter(|s| {
                self.sandbox_id
                    .as_deref()
                    .is_none_or(|id| s.sandbox_id == id)
            })
            // E2B filters by name or id.
            .filter(|s| {
                self.name
                    .as_deref()
                    .is_none_or(|n| s.name.as_deref() == Some(n) || s.id == n)
            })
            .collect();
        all.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(a.id.cmp(&b.id)));
        let page = all
            .iter()
            .skip(offset)
            .take(limit)
            .map(SnapshotInfo::from_core)
            .collect();
        self.next_token = next_page_token(offset, limit, all.len());
        self.has_next = self.next_token.is_some();
        Ok(page)
    }
}

// Awaiting `Sandbox::list_snapshots()` yields the unfetched paginator, as for `list()`.
impl IntoFuture for SnapshotPaginator {
    type Output = Result<SnapshotPaginator>;
    type IntoFuture = std::future::Ready<Result<SnapshotPaginator>>;
    fn into_future(self) -> Self::IntoFuture {
        std::future::ready(Ok(self))
    }
}

/// `SandboxMetrics`.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxMetrics {
    /// `cpu_count`.
    pub cpu_count: i64,
    /// `cpu_used_pct`.
    pub cpu_used_pct: f64,
    /// `disk_total`, bytes.
    pub disk_total: i64,
    /// `disk_used`, bytes.
    pub disk_used: i64,
    /// `mem_total`, bytes.
    pub mem_total: i64,
    /// `mem_used`, bytes.
    pub mem_used: i64,
    /// `mem_cache`, bytes (not measured: 0).
    pub mem_cache: i64,
    /// `timestamp`.
    pub timestamp: DateTime,
}

/// The builder of `get_metrics(...)`.
#[derive(Debug)]
#[must_use = "a call does nothing until awaited"]
pub struct MetricsBuilder {
    sandbox_id: String,
    start: Option<DateTime>,
    end: Option<DateTime>,
    request_timeout: Option<f64>,
}

impl MetricsBuilder {
    /// `start=`: only samples at or after this time.
    pub fn start(mut self, start: DateTime) -> Self {
        self.start = Some(start);
        self
    }

    /// `end=`: only samples at or before this time.
    pub fn end(mut self, end: DateTime) -> Self {
        self.end = Some(end);
        self
    }

    /// `request_timeout=`.
    pub fn request_timeout(mut self, secs: impl IntoSeconds) -> Self {
        self.request_timeout = secs.into_seconds();
        self
    }
}

impl IntoFuture for MetricsBuilder {
    type Output = Result<Vec<SandboxMetrics>>;
    type IntoFuture = BoxFuture<'static, Vec<SandboxMetrics>>;
    fn into_future(self) -> Self::IntoFuture {
        let limit = self.request_timeout;
        with_request_timeout(
            Box::pin(async move {
                let sample = metrics_on(&client()?, &self.sandbox_id).await?;
                let in_range = self.start.is_none_or(|s| sample.timestamp >= s)
                    && self.end.is_none_or(|e| sample.timestamp <= e);
                Ok(if in_range { vec![sample] } else { Vec::new() })
            }),
            limit,
        )
    }
}

/// One metrics sample of a sandbox, as E2B reports it (shared with the wire protocol).
pub(crate) async fn metrics_on(
    client: &sandcove::Client,
    sandbox_id: &str,
) -> Result<SandboxMetrics> {
    let m = client.sandbox(sandbox_id).metrics().await?;
    Ok(SandboxMetrics {
        cpu_count: i64::from(m.cpu_count),
        cpu_used_pct: m.cpu_used_pct,
        disk_total: m.disk_total as i64,
        disk_used: m.disk_used as i64,
        mem_total: m.mem_total as i64,
        mem_used: m.mem_used as i64,
        mem_cache: 0,
        timestamp: DateTime::from_unix_millis(m.timestamp),
    })
}

/// `pause(sandbox_id, keep_memory)` on `client`: `false` when already paused (shared with
/// the wire protocol).
pub(crate) async fn pause_on(
    client: &sandcove::Client,
    sandbox_id: &str,
    keep_memory: bool,
) -> Result<bool> {
    if !keep_memory {
        return Err(refuse("keep_memory_false"));
    }
    let sandbox = client.sandbox(sandbox_id);
    let info = sandbox.info().await?;
    if info.state == sandcove::SandboxState::Paused {
        return Ok(false);
    }
    sandbox.pause().await?;
    Ok(true)
}

/// The builder of `pause(...)`.
#[derive(Debug)]
#[must_use = "a call does nothing until awaited"]
pub struct PauseBuilder {
    sandbox_id: String,
    keep_memory: bool,
    request_timeout: Option<f64>,
}

impl PauseBuilder {
    /// `keep_memory=`: `True` (default) keeps processes and memory; `False` is not supported.
    pub fn keep_memory(mut self, keep: bool) -> Self {
        self.keep_memory = keep;
        self
    }

    /// `request_timeout=`.
    pub fn request_timeout(mut self, secs: impl IntoSeconds) -> Self {
        self.request_timeout = secs.into_seconds();
        self
    }
}

impl IntoFuture for PauseBuilder {
    type Output = Result<bool>;
    type IntoFuture = BoxFuture<'static, bool>;
    fn into_future(self) -> Self::IntoFuture {
        let limit = self.request_timeout;
        with_request_timeout(
            Box::pin(async move { pause_on(&client()?, &self.sandbox_id, self.keep_memory).await }),
            limit,
        )
    }
}

/// The builder of `create_snapshot(...)`.
#[derive(Debug)]
#[must_use = "a call does nothing until awaited"]
pub struct SnapshotBuilder {
    ctx: Ctx,
    name: Option<String>,
}

impl SnapshotBuilder {
    /// `name=`.
    pub fn name(mut self, name: impl crate::OptionalString) -> Self {
        self.name = name.into_optional();
        self
    }
}

impl IntoFuture for SnapshotBuilder {
    type Output = Result<SnapshotInfo>;
    type IntoFuture = BoxFuture<'static, SnapshotInfo>;
    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move { create_snapshot_of(&self.ctx.core, self.name).await })
    }
}

/// The builder of `fork(...)`.
#[derive(Debug)]
#[must_use = "a call does nothing until awaited"]
pub struct ForkBuilder {
    sandbox_id: String,
    timeout: Option<f64>,
    count: Option<i64>,
}

impl ForkBuilder {
    /// `timeout=`: lifetime of each fork, seconds (default 300).
    pub fn timeout(mut self, timeout: impl IntoSeconds) -> Self {
        self.timeout = timeout.into_seconds();
        self
    }

    /// `count=`: how many forks (1..=100, default 1).
    pub fn count(mut self, count: i64) -> Self {
        self.count = Some(count);
        self
    }
}

impl IntoFuture for ForkBuilder {
    type Output = Result<Vec<Result<Sandbox>>>;
    type IntoFuture = BoxFuture<'static, Vec<Result<Sandbox>>>;
    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let client = client()?;
            let forks = fork_on(&client, &self.sandbox_id, self.timeout, self.count).await?;
            Ok(forks
                .into_iter()
                .map(|made| {
                    made.map(|info| {
                        let config = ConnectionConfig {
                            domain: SANDBOX_DOMAIN.into(),
                            ..Default::default()
                        };
                        Sandbox::from_ctx(Inner::from_info(&client, &info), config)
                    })
                })
                .collect())
        })
    }
}

/// `fork(timeout, count)` on `client`'s runtime: each fork is a sandbox from a snapshot of
/// the source's files, with the source's envs, labels, network and user, or the exception
/// that fork met (one failed fork does not undo the others, as in E2B's answer).
pub(crate) async fn fork_on(
    client: &sandcove::Client,
    sandbox_id: &str,
    timeout: Option<f64>,
    count: Option<i64>,
) -> Result<Vec<Result<sandcove::SandboxInfo>>> {
    let count = count.unwrap_or(1);
    if !(1..=100).contains(&count) {
        return Err(SandboxException::invalid_argument(format!(
            "count must be between 1 and 100, got {count}"
        )));
    }
    let timeout = whole_seconds(timeout)?;
    let parent = client.sandbox(sandbox_id);
    let source = parent.info().await?;
    if !client.ready().await?.snapshots {
        return Err(sandcove::Error::not_supported(
            "Sandbox.fork",
            "this runtime has no snapshots yet; create a new sandbox and copy files",
        )
        .into());
    }
    let mut options = CreateOptions::default();
    options.timeout = Some(timeout);
    options.envs = source.envs.clone();
    options.labels = source.labels.clone();
    options.network = source.network.clone();
    options.user = Some(source.user.name.clone());
    options.home = Some(source.user.home.clone());
    let mut out = Vec::new();
    for _ in 0..count {
        let made = parent
            .fork_described(options.clone())
            .await
            .map(|(_, info)| info)
            .map_err(SandboxException::from);
        out.push(made);
    }
    Ok(out)
}

/// `create_snapshot(name)` of `sandbox` (the facade's instance or the wire's).
pub(crate) async fn create_snapshot_of(
    sandbox: &sandcove::Sandbox,
    name: Option<String>,
) -> Result<SnapshotInfo> {
    let s = sandbox.snapshot(name).await?;
    Ok(SnapshotInfo::from_core(&s))
}

/// `delete_snapshot(snapshot_id)` on `client`'s runtime: `false` when there is none.
pub(crate) async fn delete_snapshot_on(
    client: &sandcove::Client,
    snapshot_id: &str,
) -> Result<bool> {
    match client.delete_snapshot(snapshot_id).await {
        Ok(()) => Ok(true),
        Err(e) if e.is_not_found() => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Whether this client's runtime can do `what` (`pause`, `previews`, `watch`, `pty`,
/// `metrics`, `snapshots`, `volumes`). For tests and callers that branch on capabilities.
pub async fn runtime_capabilities() -> Result<sandcove::Capabilities> {
    Ok(client()?.ready().await?)
}

/// The annotation naming the template an E2B sandbox was made from; it also marks the
/// sandboxes made through E2B's API (the wire listener's port forwarding and signed URLs
/// serve only those).
pub(crate) const TEMPLATE_ANNOTATION: &str = "e2b/template";
