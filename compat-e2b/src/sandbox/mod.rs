//! `Sandbox`: create, connect, list, lifecycle, hosts, snapshots and fork.
//!
//! [`Sandbox`] carries the class methods (`Sandbox::create()`, `Sandbox::kill(id)`, …) and
//! derefs to [`SandboxInstance`], which holds the attributes (`sandbox_id`, `commands`,
//! `files`, `pty`, …) and the instance methods (`sandbox.kill()`, …): the static and the
//! instance forms share their Python names.

use std::collections::BTreeMap;
use std::future::IntoFuture;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use sandcove::PreviewOptions;

use crate::call::{client, with_request_timeout, BoxFuture, Call, IntoSeconds};
use crate::commands::Commands;
use crate::errors::{Result, SandboxException};
use crate::files::Filesystem;
use crate::gaps::refuse;
use crate::pty::Pty;
use crate::translate;

pub(crate) mod create;
mod info;
mod list;
mod metrics;
mod snapshots;

pub use self::create::*;
pub use self::info::*;
pub use self::list::*;
pub use self::metrics::*;
pub use self::snapshots::*;

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

    /// A process's working directory as envd picks it: `cwd` (relative to the user's home),
    /// else the home of `runtime_user` (`None`, the default user: the runtime's default).
    pub(crate) fn cwd_as(&self, cwd: Option<&str>, runtime_user: Option<&str>) -> Option<String> {
        match cwd.filter(|c| !c.is_empty()) {
            Some(c) => Some(self.path_as(c, runtime_user)),
            None => runtime_user.map(|u| self.path_as("~", Some(u))),
        }
    }

    /// `path` as the runtime names it when looked up as `runtime_user` (what
    /// [`Inner::runtime_user`] gives; `None` is the default user): a relative or `~` path
    /// resolves against that user's home, as envd resolves it — root's is `/root`.
    pub(crate) fn path_as(&self, path: &str, runtime_user: Option<&str>) -> String {
        let Some(user) = runtime_user else {
            return self.path(path);
        };
        let home = if user == "root" {
            "/root".to_string()
        } else {
            format!("/home/{user}")
        };
        if path.is_empty() || path == "~" {
            home
        } else if let Some(rest) = path.strip_prefix("~/") {
            format!("{home}/{rest}")
        } else if !path.starts_with('/') {
            format!("{home}/{path}")
        } else {
            self.path(path)
        }
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
    /// takes a `POST` (or `PUT`) multipart/form-data upload (field `file`) or raw body into
    /// `path`, with no other credential: the runtime's signed file URL
    /// ([`sandcove::Sandbox::file_url`]), served outside the sandbox. Unlike E2B's pure
    /// function it asks the runtime to sign (so it is `async`); a path is required.
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
            mode: None,
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

/// `pause(sandbox_id, keep_memory)` on `client`: `false` when already paused (shared with
/// the wire protocol).
pub(crate) async fn pause_on(
    client: &sandcove::Client,
    sandbox_id: &str,
    keep_memory: bool,
) -> Result<bool> {
    let sandbox = client.sandbox(sandbox_id);
    let info = sandbox.info().await?;
    if matches!(
        info.state,
        sandcove::SandboxState::Paused | sandcove::SandboxState::Stopped
    ) {
        return Ok(false);
    }
    if keep_memory {
        sandbox.pause().await?;
    } else {
        // A filesystem-only pause is the runtime's stop: processes end, files stay, the
        // lease waits; `connect` starts it again.
        sandbox.stop().await?;
    }
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
    /// `keep_memory=`: `True` (default) keeps processes and memory; `False` keeps the files
    /// only (the runtime's stop: processes end; `connect` starts the sandbox again).
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

/// Whether this client's runtime can do `what` (`pause`, `previews`, `watch`, `pty`,
/// `metrics`, `snapshots`, `volumes`). For tests and callers that branch on capabilities.
pub async fn runtime_capabilities() -> Result<sandcove::Capabilities> {
    Ok(client()?.ready().await?)
}

/// The annotation naming the template an E2B sandbox was made from; it also marks the
/// sandboxes made through E2B's API (the wire listener's port forwarding and signed URLs
/// serve only those).
pub(crate) const TEMPLATE_ANNOTATION: &str = "e2b/template";

/// The annotation of a sandbox created with `network={"allow_public_traffic": False}`: the
/// wire listener's port forwarding then requires its traffic access token.
pub(crate) const PRIVATE_TRAFFIC_ANNOTATION: &str = "e2b/private-traffic";
