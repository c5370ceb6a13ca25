//! `SandboxInstance`: create, find, list, update and delete sandboxes by name; snapshots and
//! fork.
//!
//! A Blaxel sandbox is a core sandbox whose label `blaxel.name` carries the name, created with
//! user `root` and home `/blaxel` (Blaxel's `HOME` and working directory). What Blaxel reports
//! but the core does not keep (image, memory, ports, region, lifecycle, display name, later
//! labels) lives in a small record inside the sandbox, so every client program sees it.

use std::collections::BTreeMap;
use std::ops::Deref;
use std::time::Duration;

use serde_json::Value;

use crate::errors::{Result, SandboxAPIError};
use crate::models::{
    self, Env, Metadata, Sandbox, SandboxCreateConfiguration, SandboxForkResponse,
    SandboxLifecycle, SandboxSnapshot, SandboxSpec, SandboxUpdateMetadata, VolumeBinding,
};
use crate::state::{self, SandboxRecord, EXTERNAL_ID_LABEL, NAME_LABEL, SANDBOX_KEY};
use crate::translate::{self, DEFAULT_IMAGE, DEFAULT_MEMORY, HOME};
use crate::{fs, gaps, previews, process, snapshots};

/// The lease of a sandbox created with no `ttl`, `expires` or lifecycle policy. Blaxel keeps
/// such sandboxes (in standby) until deleted; here every sandbox has a lease.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(24 * 3600);

/// What the sub-APIs of one sandbox share.
#[derive(Debug, Clone)]
pub(crate) struct Ctx {
    pub core: sandcove::Sandbox,
    pub name: String,
}

/// Anything `SandboxInstance::create` accepts: a `SandboxCreateConfiguration`, a full
/// `Sandbox` model, a JSON dict of either shape, or `None`.
pub trait IntoSandboxCreate {
    /// The configuration, or a `ValueError` for unknown keys and bad types.
    fn into_create(self) -> Result<SandboxCreateConfiguration>;
}

impl IntoSandboxCreate for SandboxCreateConfiguration {
    fn into_create(self) -> Result<SandboxCreateConfiguration> {
        Ok(self)
    }
}

impl IntoSandboxCreate for Option<SandboxCreateConfiguration> {
    fn into_create(self) -> Result<SandboxCreateConfiguration> {
        Ok(self.unwrap_or_default())
    }
}

impl IntoSandboxCreate for Sandbox {
    fn into_create(self) -> Result<SandboxCreateConfiguration> {
        let r = self.spec.runtime;
        Ok(SandboxCreateConfiguration {
            name: Some(self.metadata.name).filter(|n| !n.is_empty()),
            image: Some(r.image).filter(|i| !i.is_empty()),
            memory: Some(r.memory).filter(|m| *m > 0),
            ports: Some(r.ports).filter(|p| !p.is_empty()),
            envs: Some(r.envs).filter(|e| !e.is_empty()),
            volumes: Some(self.spec.volumes).filter(|v| !v.is_empty()),
            ttl: r.ttl,
            expires: r.expires,
            region: self.spec.region,
            lifecycle: self.spec.lifecycle,
            network: None,
            snapshot_enabled: r.snapshot_enabled,
            labels: Some(self.metadata.labels).filter(|l| !l.is_empty()),
            extra_args: None,
            external_id: self.metadata.external_id,
        })
    }
}

impl IntoSandboxCreate for Value {
    fn into_create(self) -> Result<SandboxCreateConfiguration> {
        match &self {
            Value::Null => Ok(SandboxCreateConfiguration::default()),
            Value::Object(map) if map.contains_key("metadata") || map.contains_key("spec") => {
                models::from_value::<Sandbox>(self, "Sandbox")?.into_create()
            }
            _ => models::from_value(self, "SandboxCreateConfiguration"),
        }
    }
}

/// A sandbox (Python `SandboxInstance`). The class methods are associated functions here;
/// the instance API (`sandbox.process`, `sandbox.fs`, `sandbox.delete()`, …) is on
/// [`SandboxHandle`], which this derefs to.
#[derive(Debug, Clone)]
pub struct SandboxInstance {
    handle: SandboxHandle,
}

impl Deref for SandboxInstance {
    type Target = SandboxHandle;
    fn deref(&self) -> &SandboxHandle {
        &self.handle
    }
}

/// The instance side of a [`SandboxInstance`]: its record and its sub-APIs.
#[derive(Debug, Clone)]
pub struct SandboxHandle {
    /// The control-plane record.
    pub sandbox: Sandbox,
    /// `sandbox.metadata`.
    pub metadata: Metadata,
    /// `sandbox.spec`.
    pub spec: SandboxSpec,
    /// `sandbox.status`: `DEPLOYED`.
    pub status: Option<String>,
    /// Seconds until the lease ends.
    pub expires_in: Option<i64>,
    /// Last use (RFC 3339).
    pub last_used_at: Option<String>,
    /// Infrastructure errors: always empty here.
    pub errors: Vec<String>,
    /// Processes.
    pub process: process::SandboxProcess,
    /// Files.
    pub fs: fs::SandboxFileSystem,
    /// Preview URLs.
    pub previews: previews::SandboxPreviews,
    /// Sessions (not supported).
    pub sessions: gaps::SandboxSessions,
    /// HTTP requests to ports in the sandbox.
    pub network: crate::network::SandboxNetwork,
    /// Sandbox-API system calls.
    pub system: gaps::SandboxSystem,
    /// Agent drives (not supported).
    pub drives: gaps::SandboxDrive,
    /// Codegen helpers (not supported).
    pub codegen: gaps::SandboxCodegen,
    /// Schedules (not supported).
    pub schedules: gaps::SandboxSchedules,
    /// Snapshots taken from this sandbox.
    pub snapshots: snapshots::SandboxSnapshots,
    pub(crate) ctx: Ctx,
}

/// One page of a listing (Python `AsyncPaginatedList`): derefs to the items.
#[derive(Debug, Clone)]
pub struct AsyncPaginatedList<T> {
    /// The items of this page.
    pub data: Vec<T>,
    /// Whether more pages follow.
    pub has_more: bool,
    /// Cursor of the next page.
    pub next_cursor: Option<String>,
    /// Total number of items across pages.
    pub total: i64,
}

impl<T> AsyncPaginatedList<T> {
    /// Whether this page is empty.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
}

impl<T> Deref for AsyncPaginatedList<T> {
    type Target = Vec<T>;
    fn deref(&self) -> &Vec<T> {
        &self.data
    }
}

impl<T> IntoIterator for AsyncPaginatedList<T> {
    type Item = T;
    type IntoIter = std::vec::IntoIter<T>;
    fn into_iter(self) -> Self::IntoIter {
        self.data.into_iter()
    }
}

macro_rules! into_future {
    ($builder:ty => $out:ty) => {
        sandcove_compat_support::awaitable!($builder => $crate::errors::Result<$out>);
    };
}
pub(crate) use into_future;

/// Builder of `SandboxInstance.create(sandbox, safe=False, create_if_not_exist=False)`.
#[derive(Debug)]
pub struct CreateBuilder {
    config: Result<SandboxCreateConfiguration>,
    safe: bool,
    create_if_not_exist: bool,
}

impl CreateBuilder {
    /// `safe=`: list `/` once after creation, ignoring errors.
    pub fn safe(mut self, safe: bool) -> Self {
        self.safe = safe;
        self
    }

    /// `create_if_not_exist=`: return the live sandbox of that name instead of a 409.
    pub fn create_if_not_exist(mut self, yes: bool) -> Self {
        self.create_if_not_exist = yes;
        self
    }

    async fn run(self) -> Result<SandboxInstance> {
        let config = self.config?;
        let client = state::client()?;
        let instance = create_sandbox(&client, config, self.create_if_not_exist).await?;
        if self.safe {
            let _ = instance.fs.ls("/").await;
        }
        Ok(instance)
    }
}
into_future!(CreateBuilder => SandboxInstance);

/// Builder of `SandboxInstance.list(limit=50, cursor=None)`.
#[derive(Debug)]
pub struct ListBuilder {
    limit: i64,
    cursor: Option<String>,
}

impl ListBuilder {
    /// `limit=` (default 50).
    pub fn limit(mut self, limit: i64) -> Self {
        self.limit = limit;
        self
    }

    /// `cursor=`: the `next_cursor` of a previous page.
    pub fn cursor(mut self, cursor: impl crate::OptionalString) -> Self {
        self.cursor = cursor.into_optional();
        self
    }

    async fn run(self) -> Result<AsyncPaginatedList<SandboxInstance>> {
        list_page(
            &state::client()?,
            self.limit,
            self.cursor.as_deref(),
            false,
            None,
        )
        .await
    }
}
into_future!(ListBuilder => AsyncPaginatedList<SandboxInstance>);

/// One page of Blaxel sandboxes on `client`, oldest first (newest first when `newest_first`):
/// `limit` (50 when not positive) after `cursor` (the `next_cursor` of a previous page).
///
/// The cursor names the last sandbox of the previous page (its creation time and id), not
/// an offset, so sandboxes created or deleted while a caller pages never make a page repeat
/// an item or skip one that existed throughout; a cursor this listing did not hand out is a
/// 400. With `external_id`, only the sandboxes created with it.
pub(crate) async fn list_page(
    client: &sandcove::Client,
    limit: i64,
    cursor: Option<&str>,
    newest_first: bool,
    external_id: Option<&str>,
) -> Result<AsyncPaginatedList<SandboxInstance>> {
    let after = cursor.map(parse_list_cursor).transpose()?;
    let mut filter = sandcove::ListOptions::default();
    if let Some(id) = external_id {
        filter = filter.label(EXTERNAL_ID_LABEL, id);
    }
    let mut all: Vec<sandcove::SandboxInfo> = client
        .list(filter)
        .await
        .map_err(|e| SandboxAPIError::from(e).into_control_plane())?
        .into_iter()
        .filter(|i| i.labels.contains_key(NAME_LABEL))
        .collect();
    all.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
    if newest_first {
        all.reverse();
    }
    let total = all.len();
    let keys: Vec<ListKey> = all.iter().map(|i| (i.created_at, i.id.clone())).collect();
    let start = match &after {
        None => 0,
        Some(after) if newest_first => keys.partition_point(|k| k >= after),
        Some(after) => keys.partition_point(|k| k <= after),
    };
    let limit = if limit <= 0 { 50 } else { limit as usize };
    let (data, end) = fill_page(all, start, limit, |info| instance_from_info(client, info)).await?;
    let has_more = end < total;
    Ok(AsyncPaginatedList {
        data,
        has_more,
        next_cursor: has_more.then(|| list_cursor(&keys[end - 1])),
        total: total as i64,
    })
}

/// A sandbox's place in the listing order: creation time, then id.
type ListKey = (sandcove::UnixMillis, String);

fn list_cursor((created_at, id): &ListKey) -> String {
    format!("{created_at}.{id}")
}

fn parse_list_cursor(cursor: &str) -> Result<ListKey> {
    cursor
        .split_once('.')
        .and_then(|(at, id)| Some((at.parse().ok()?, id)))
        .filter(|(_, id)| !id.is_empty())
        .map(|(at, id)| (at, id.to_string()))
        .ok_or_else(|| {
            SandboxAPIError::api(400, "INVALID_CURSOR", format!("invalid cursor {cursor:?}"))
        })
}

/// Reads up to `limit` items of `entries` from index `start`, returning them and the index
/// after the last entry consumed. An entry whose read is not found (deleted between the
/// listing and the read) is skipped and the page filled from the entries after it, so a
/// page is short only at the end of the list.
async fn fill_page<E, T, F, Fut>(
    entries: Vec<E>,
    start: usize,
    limit: usize,
    mut read: F,
) -> Result<(Vec<T>, usize)>
where
    F: FnMut(E) -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut data = Vec::new();
    let mut end = start.min(entries.len());
    for entry in entries.into_iter().skip(start) {
        if data.len() == limit {
            break;
        }
        end += 1;
        match read(entry).await {
            Ok(item) => data.push(item),
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    Ok((data, end))
}

/// Builder of `sandbox.snapshot(name=None)`.
#[derive(Debug)]
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

    async fn run(self) -> Result<SandboxSnapshot> {
        snapshots::create_on(&self.ctx.core.client(), &self.ctx.name, self.name).await
    }
}
into_future!(SnapshotBuilder => SandboxSnapshot);

/// Builder of `sandbox.fork(target_name, target_type="sandbox", port=None, traffic=None,
/// custom_domain=None, prefix=None, snapshot_id=None)`.
#[derive(Debug)]
pub struct ForkBuilder {
    ctx: Ctx,
    target_name: String,
    target_type: String,
    port: Option<i64>,
    traffic: Option<i64>,
    custom_domain: Option<String>,
    prefix: Option<String>,
    snapshot_id: Option<String>,
    envs: Vec<Env>,
    lifecycle: Result<Option<SandboxLifecycle>>,
}

impl ForkBuilder {
    /// `target_type=`: `sandbox` (default); `application` is not supported.
    pub fn target_type(mut self, t: impl Into<String>) -> Self {
        self.target_type = t.into();
        self
    }
    /// `port=` (application forks only; not supported).
    pub fn port(mut self, port: impl Into<Option<i64>>) -> Self {
        self.port = port.into();
        self
    }
    /// `traffic=` (application forks only; not supported).
    pub fn traffic(mut self, traffic: impl Into<Option<i64>>) -> Self {
        self.traffic = traffic.into();
        self
    }
    /// `custom_domain=` (not supported).
    pub fn custom_domain(mut self, d: impl crate::OptionalString) -> Self {
        self.custom_domain = d.into_optional();
        self
    }
    /// `prefix=` (not supported).
    pub fn prefix(mut self, p: impl crate::OptionalString) -> Self {
        self.prefix = p.into_optional();
        self
    }
    /// `snapshot_id=`: fork from this snapshot instead of the live state.
    pub fn snapshot_id(mut self, id: impl crate::OptionalString) -> Self {
        self.snapshot_id = id.into_optional();
        self
    }

    /// `envs=`: variables the fork runs with on top of the source's.
    pub fn envs(mut self, envs: impl IntoIterator<Item = Env>) -> Self {
        self.envs = envs.into_iter().collect();
        self
    }
    /// `lifecycle=`: the fork's lifecycle, replacing the source's (with its ttl and expires).
    pub fn lifecycle(mut self, lifecycle: impl IntoLifecycle) -> Self {
        self.lifecycle = lifecycle.into_lifecycle();
        self
    }

    async fn run(self) -> Result<SandboxForkResponse> {
        let req = snapshots::ForkRequest {
            target_name: self.target_name,
            target_type: self.target_type,
            port: self.port,
            traffic: self.traffic,
            custom_domain: self.custom_domain,
            prefix: self.prefix,
            snapshot_id: self.snapshot_id,
            envs: self.envs,
            lifecycle: self.lifecycle?,
        };
        snapshots::fork_on(
            &self.ctx.core.client(),
            snapshots::ForkFrom::Sandbox(&self.ctx.name),
            req,
        )
        .await
    }
}
into_future!(ForkBuilder => SandboxForkResponse);

/// Builder of the deprecated `sandbox.wait(max_wait=60000, interval=1000)` (both ms): returns
/// at once, as on Blaxel, since a created sandbox is usable immediately.
#[derive(Debug)]
pub struct WaitBuilder {
    instance: SandboxHandle,
    max_wait: i64,
    interval: i64,
}

impl WaitBuilder {
    /// `max_wait=` in ms (ignored, as on Blaxel).
    pub fn max_wait(mut self, ms: i64) -> Self {
        self.max_wait = ms;
        self
    }
    /// `interval=` in ms (ignored, as on Blaxel).
    pub fn interval(mut self, ms: i64) -> Self {
        self.interval = ms;
        self
    }
    async fn run(self) -> Result<SandboxHandle> {
        let _ = (self.max_wait, self.interval);
        Ok(self.instance)
    }
}
into_future!(WaitBuilder => SandboxHandle);

/// Builder of `archive(sandbox_name, wait=True, max_wait=1800000, interval=2000)` and of
/// `unarchive` (both ms; the class and the instance form): the sandbox is archived (or back)
/// when the call answers, so the waiting options change nothing.
#[derive(Debug)]
pub struct ArchiveBuilder {
    client: Result<sandcove::Client>,
    sandbox_name: String,
    archive: bool,
    wait: bool,
    max_wait: i64,
    interval: i64,
}

impl ArchiveBuilder {
    fn new(client: Result<sandcove::Client>, sandbox_name: &str, archive: bool) -> Self {
        ArchiveBuilder {
            client,
            sandbox_name: sandbox_name.to_string(),
            archive,
            wait: true,
            max_wait: 1_800_000,
            interval: 2000,
        }
    }
    /// `wait=` (the call answers once it is done either way).
    pub fn wait(mut self, wait: bool) -> Self {
        self.wait = wait;
        self
    }
    /// `max_wait=` in ms (nothing to wait for).
    pub fn max_wait(mut self, ms: i64) -> Self {
        self.max_wait = ms;
        self
    }
    /// `interval=` in ms (nothing to poll).
    pub fn interval(mut self, ms: i64) -> Self {
        self.interval = ms;
        self
    }
    async fn run(self) -> Result<SandboxInstance> {
        let _ = (self.wait, self.max_wait, self.interval);
        SandboxInstance::archive_on(&self.client?, &self.sandbox_name, self.archive).await
    }
}
into_future!(ArchiveBuilder => SandboxInstance);

impl SandboxInstance {
    /// `SandboxInstance.archive(sandbox_name, wait=True, max_wait=…, interval=…)`: the
    /// sandbox's processes end and its files are kept (the core's `stop`; status
    /// `ARCHIVED`), until `unarchive`. Its lease stops counting meanwhile; the runtime keeps
    /// an archived sandbox for its retention of stopped sandboxes (30 days on the embedded
    /// engine), then deletes it. Archiving an archived sandbox changes nothing.
    pub fn archive(sandbox_name: &str) -> ArchiveBuilder {
        ArchiveBuilder::new(state::client(), sandbox_name, true)
    }

    /// `SandboxInstance.unarchive(sandbox_name, wait=True, …)`: an archived sandbox runs
    /// again with its files and no processes (the core's `start`; status `DEPLOYED`), its
    /// lease counting on from where it stopped. A sandbox that is not archived is left as it
    /// is.
    pub fn unarchive(sandbox_name: &str) -> ArchiveBuilder {
        ArchiveBuilder::new(state::client(), sandbox_name, false)
    }

    /// `archive` (or, with `archive` false, `unarchive`) on a given runtime client (the wire
    /// router's).
    pub(crate) async fn archive_on(
        client: &sandcove::Client,
        sandbox_name: &str,
        archive: bool,
    ) -> Result<Self> {
        let info = state::find_by_name(client, sandbox_name)
            .await
            .map_err(SandboxAPIError::into_control_plane)?
            .ok_or_else(|| not_found(sandbox_name))?;
        let core = client.sandbox(&info.id);
        let done = if archive {
            core.stop().await
        } else {
            core.start().await
        };
        let info = done.map_err(|e| match e {
            e if e.is_not_found() => not_found(sandbox_name),
            e => cp(e),
        })?;
        instance_from_info(client, info).await
    }

    /// `SandboxInstance.create(sandbox=None, safe=False, create_if_not_exist=False)`.
    ///
    /// `sandbox` is a [`SandboxCreateConfiguration`], a full [`Sandbox`], a `json!` dict of
    /// either shape, or `None`. Defaults: image `blaxel/base-image:latest`, memory 4096
    /// (recorded, not enforced), a generated name. `ttl`/`expires`/lifecycle become the
    /// sandbox's lease; `envs` reach every process; `labels` round-trip.
    pub fn create(sandbox: impl IntoSandboxCreate) -> CreateBuilder {
        CreateBuilder {
            config: sandbox.into_create(),
            safe: false,
            create_if_not_exist: false,
        }
    }

    /// `SandboxInstance.create_if_not_exists(sandbox)`: the live sandbox of that name, or a
    /// new one. Safe under concurrent callers, in one program or several.
    pub async fn create_if_not_exists(sandbox: impl IntoSandboxCreate) -> Result<Self> {
        let config = sandbox.into_create()?;
        if config.name.is_none() {
            return Err(SandboxAPIError::value_error("Sandbox name is required"));
        }
        create_sandbox(&state::client()?, config, true).await
    }

    /// `SandboxInstance.get(sandbox_name)`; a missing name is `SandboxAPIError` with
    /// `status_code` 404.
    pub async fn get(sandbox_name: &str) -> Result<Self> {
        Self::get_on(&state::client()?, sandbox_name).await
    }

    /// `get` on a given runtime client (the wire router's).
    pub(crate) async fn get_on(client: &sandcove::Client, sandbox_name: &str) -> Result<Self> {
        let found = state::find_by_name(client, sandbox_name)
            .await
            .map_err(SandboxAPIError::into_control_plane)?;
        let Some(info) = found else {
            return Err(
                match client
                    .tombstone(sandcove::ResourceKind::Sandbox, sandbox_name)
                    .await
                {
                    // Ended recently: Blaxel's 404, saying when.
                    Ok(Some(t)) => SandboxAPIError::api(
                        404,
                        "Sandbox not found",
                        format!("Sandbox {sandbox_name} not found: {}", t.to_error()),
                    ),
                    _ => not_found(sandbox_name),
                },
            );
        };
        let instance = instance_from_info(client, info).await?;
        instance.touch().await;
        Ok(instance)
    }

    /// The sandbox created with `external_id` (the TypeScript SDK's
    /// `SandboxInstance.getByExternalId`, the Python API client's
    /// `get_sandbox_by_external_id`): the newest live one, should several share it; `404`
    /// when none does.
    pub async fn get_by_external_id(external_id: &str) -> Result<Self> {
        Self::get_by_external_id_on(&state::client()?, external_id).await
    }

    /// `get_by_external_id` on a given runtime client (the wire router's).
    pub(crate) async fn get_by_external_id_on(
        client: &sandcove::Client,
        external_id: &str,
    ) -> Result<Self> {
        let missing = || {
            SandboxAPIError::api(
                404,
                "Sandbox not found",
                format!("no sandbox has the externalId {external_id:?}"),
            )
        };
        if check_external_id(external_id).is_err() {
            return Err(missing());
        }
        let filter = sandcove::ListOptions::default().label(EXTERNAL_ID_LABEL, external_id);
        let newest = client
            .list(filter)
            .await
            .map_err(cp)?
            .into_iter()
            .filter(|i| i.labels.contains_key(NAME_LABEL))
            .max_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)))
            .ok_or_else(missing)?;
        let instance = instance_from_info(client, newest).await?;
        instance.touch().await;
        Ok(instance)
    }

    /// `SandboxInstance.list(limit=50, cursor=None)`: one page of sandboxes, oldest first.
    pub fn list() -> ListBuilder {
        ListBuilder {
            limit: 50,
            cursor: None,
        }
    }

    /// `SandboxInstance.delete(sandbox_name)` (class form): destroys the sandbox and returns
    /// its record with status `DELETING`. The instance form is [`SandboxHandle::delete`].
    pub async fn delete(sandbox_name: &str) -> Result<Sandbox> {
        Self::delete_on(&state::client()?, sandbox_name).await
    }

    /// `delete` on a given runtime client (the wire router's).
    pub(crate) async fn delete_on(
        client: &sandcove::Client,
        sandbox_name: &str,
    ) -> Result<Sandbox> {
        let info = state::find_by_name(client, sandbox_name)
            .await
            .map_err(SandboxAPIError::into_control_plane)?
            .ok_or_else(|| not_found(sandbox_name))?;
        delete_info(client, info).await
    }

    /// `SandboxInstance.update_metadata(sandbox_name, metadata)`: labels are merged into the
    /// existing ones, `display_name` is replaced. `metadata` is a [`SandboxUpdateMetadata`] or
    /// a `json!` dict.
    pub async fn update_metadata(
        sandbox_name: &str,
        metadata: impl IntoUpdateMetadata,
    ) -> Result<Self> {
        let update = metadata.into_update()?;
        Self::update_record(&state::client()?, sandbox_name, move |record| {
            if let Some(labels) = update.labels {
                record.sandbox.metadata.labels.extend(labels);
            }
            if let Some(d) = update.display_name {
                record.sandbox.metadata.display_name = Some(d);
            }
            Ok(false)
        })
        .await
    }

    /// `SandboxInstance.update_ttl(sandbox_name, ttl)`: a new maximum age counted from
    /// creation; `None` or `""` clears it. The lease moves accordingly.
    pub async fn update_ttl(sandbox_name: &str, ttl: impl crate::OptionalString) -> Result<Self> {
        let ttl = ttl.into_optional().filter(|t| !t.is_empty());
        if let Some(t) = &ttl {
            translate::parse_duration(t).ok_or_else(|| bad_duration(t))?;
        }
        Self::update_record(&state::client()?, sandbox_name, move |record| {
            record.sandbox.spec.runtime.ttl = ttl;
            Ok(true)
        })
        .await
    }

    /// `SandboxInstance.update_lifecycle(sandbox_name, lifecycle)`: replace the expiration
    /// policies (`None` clears them). The lease moves accordingly.
    pub async fn update_lifecycle(
        sandbox_name: &str,
        lifecycle: impl IntoLifecycle,
    ) -> Result<Self> {
        let lifecycle = lifecycle.into_lifecycle()?;
        Self::update_record(&state::client()?, sandbox_name, move |record| {
            record.sandbox.spec.lifecycle = lifecycle;
            Ok(true)
        })
        .await
    }

    /// `SandboxInstance.update_network(sandbox_name, network)`: not supported.
    pub async fn update_network(sandbox_name: &str, network: Value) -> Result<Self> {
        let _ = (sandbox_name, network);
        Err(gaps::refuse("update_network"))
    }

    /// `SandboxInstance.from_session(session)`: not supported (sessions are not).
    pub async fn from_session(session: Value) -> Result<Self> {
        let _ = session;
        Err(gaps::refuse("sessions"))
    }

    /// Change the record of `sandbox_name` on `client`; `change` returns whether the lease
    /// (ttl, expires, lifecycle) changed, which then moves the runtime's timeout.
    pub(crate) async fn update_record(
        client: &sandcove::Client,
        sandbox_name: &str,
        change: impl FnOnce(&mut SandboxRecord) -> Result<bool>,
    ) -> Result<Self> {
        let info = state::find_by_name(client, sandbox_name)
            .await
            .map_err(SandboxAPIError::into_control_plane)?
            .ok_or_else(|| not_found(sandbox_name))?;
        let core = client.connect(&info.id).await.map_err(cp)?;
        let mut record = read_record(&core).await?;
        let before = record.clone();
        let lease_changed = change(&mut record)?;
        if lease_changed {
            let created = translate::parse_iso8601(
                record
                    .sandbox
                    .metadata
                    .created_at
                    .as_deref()
                    .unwrap_or_default(),
            )
            .unwrap_or(info.created_at);
            let now = sandcove::now_millis();
            let (end, idle) = lease_end(&record.sandbox, created, now)?;
            record.idle_secs = idle;
            let remaining = end.saturating_sub(now).max(1000);
            // What the lease's end does follows the record as it is now: a deletion policy
            // added to a sandbox made without one deletes it, and removing the last one
            // keeps it in standby (see `standby_at_lease_end`).
            let action = lease_end_action(&record.sandbox, &client.ready().await.map_err(cp)?);
            let action_changed = action != info.on_timeout;
            if action_changed {
                core.set_on_timeout(action).await.map_err(cp)?;
            }
            if let Err(e) = core.set_timeout(Duration::from_millis(remaining)).await {
                if action_changed {
                    let _ = core.set_on_timeout(info.on_timeout).await;
                }
                let _ = state::write_annotation(&core, SANDBOX_KEY, &before).await;
                return Err(cp(e));
            }
        }
        record.sandbox.metadata.updated_at =
            Some(translate::format_rfc3339(sandcove::now_millis()));
        state::write_annotation(&core, SANDBOX_KEY, &record).await?;
        instance_from_info(client, core.info().await.map_err(cp)?).await
    }
}

/// Anything `update_metadata` accepts.
pub trait IntoUpdateMetadata {
    /// The update, or a `ValueError`.
    fn into_update(self) -> Result<SandboxUpdateMetadata>;
}
impl IntoUpdateMetadata for SandboxUpdateMetadata {
    fn into_update(self) -> Result<SandboxUpdateMetadata> {
        Ok(self)
    }
}
impl IntoUpdateMetadata for Value {
    fn into_update(self) -> Result<SandboxUpdateMetadata> {
        models::from_value(self, "SandboxUpdateMetadata")
    }
}

/// Anything `update_lifecycle` accepts: a [`SandboxLifecycle`], a dict, or `None`.
pub trait IntoLifecycle {
    /// The lifecycle, or a `ValueError`.
    fn into_lifecycle(self) -> Result<Option<SandboxLifecycle>>;
}
impl IntoLifecycle for SandboxLifecycle {
    fn into_lifecycle(self) -> Result<Option<SandboxLifecycle>> {
        Ok(Some(self))
    }
}
impl IntoLifecycle for Option<SandboxLifecycle> {
    fn into_lifecycle(self) -> Result<Option<SandboxLifecycle>> {
        Ok(self)
    }
}
impl IntoLifecycle for Value {
    fn into_lifecycle(self) -> Result<Option<SandboxLifecycle>> {
        if self.is_null() {
            return Ok(None);
        }
        models::from_value(self, "SandboxLifecycle").map(Some)
    }
}

impl SandboxHandle {
    /// `await instance.delete()` (instance form of `SandboxInstance.delete`).
    pub async fn delete(&self) -> Result<Sandbox> {
        let client = state::client()?;
        let info = match self.ctx.core.info().await {
            Ok(info) => info,
            Err(e) if e.is_not_found() => return Err(not_found(&self.ctx.name)),
            Err(e) => return Err(cp(e)),
        };
        delete_info(&client, info).await
    }

    /// `instance.archive(wait=True, …)`: see [`SandboxInstance::archive`].
    pub fn archive(&self) -> ArchiveBuilder {
        ArchiveBuilder::new(Ok(self.ctx.core.client()), &self.ctx.name, true)
    }

    /// `instance.unarchive(wait=True, …)`: see [`SandboxInstance::unarchive`].
    pub fn unarchive(&self) -> ArchiveBuilder {
        ArchiveBuilder::new(Ok(self.ctx.core.client()), &self.ctx.name, false)
    }

    /// `instance.snapshot(name=None)`: a filesystem snapshot of the sandbox.
    pub fn snapshot(&self) -> SnapshotBuilder {
        SnapshotBuilder {
            ctx: self.ctx.clone(),
            name: None,
        }
    }

    /// `instance.list_snapshots()`: the snapshots of this sandbox.
    pub async fn list_snapshots(&self) -> Result<Vec<SandboxSnapshot>> {
        snapshots::list_of_sandbox_on(&self.ctx.core.client(), &self.ctx.name).await
    }

    /// `instance.delete_snapshot(snapshot_id)`.
    pub async fn delete_snapshot(&self, snapshot_id: &str) -> Result<()> {
        snapshots::delete_of_sandbox_on(&self.ctx.core.client(), &self.ctx.name, snapshot_id).await
    }

    /// `instance.restore(snapshot_id)`: this sandbox's files become those of its snapshot; it
    /// keeps its name and record, its processes and previews end (see
    /// [`SandboxSnapshots::restore`](crate::snapshots::SandboxSnapshots::restore)). This
    /// handle then addresses the replaced instance: get the sandbox again by name.
    pub async fn restore(&self, snapshot_id: &str) -> Result<models::SandboxRestoreResponse> {
        snapshots::restore_on(&self.ctx.core.client(), &self.ctx.name, snapshot_id).await
    }

    /// `instance.fork(target_name, target_type="sandbox", port=None, traffic=None,
    /// custom_domain=None, prefix=None, snapshot_id=None)`: a new sandbox named
    /// `target_name` with a copy of this one's files (not its processes).
    pub fn fork(&self, target_name: &str) -> ForkBuilder {
        ForkBuilder {
            ctx: self.ctx.clone(),
            target_name: target_name.to_string(),
            target_type: "sandbox".into(),
            port: None,
            traffic: None,
            custom_domain: None,
            prefix: None,
            snapshot_id: None,
            envs: Vec::new(),
            lifecycle: Ok(None),
        }
    }

    /// Deprecated `instance.wait(max_wait=60000, interval=1000)`: returns at once.
    pub fn wait(&self) -> WaitBuilder {
        WaitBuilder {
            instance: self.clone(),
            max_wait: 60_000,
            interval: 1000,
        }
    }

    /// `instance.fetch(port, path="/", method="GET", …)`: the answer of the server on `port`
    /// in the sandbox, whatever its status (see [`crate::network`]).
    pub fn fetch(&self, port: i64) -> crate::network::FetchBuilder {
        self.network.fetch(port)
    }

    /// The runtime's id of this sandbox (not a Blaxel attribute).
    pub fn sandcove_id(&self) -> &str {
        self.ctx.core.id()
    }

    /// The runtime's saved reference to this sandbox (not a Blaxel attribute):
    /// `sandcove:v1:<runtime>:sandbox:<id>`, which `sandcove::Client::reopen` checks from a
    /// later program. `SandboxInstance.get(name)` keeps working with the name.
    pub fn sandcove_reference(&self) -> Result<sandcove::Reference> {
        Ok(self.ctx.core.reference()?)
    }

    /// Renew an idle-timeout lease (`ttl-idle`): any use of the sandbox counts.
    pub(crate) async fn touch(&self) {
        touch(&self.ctx.core).await;
    }
}

/// Renew the lease of a sandbox with a `ttl-idle` policy (best effort).
pub(crate) async fn touch(core: &sandcove::Sandbox) {
    if let Ok(Some(record)) = state::read_annotation::<SandboxRecord>(core, SANDBOX_KEY).await {
        if let Some(idle) = record.idle_secs {
            let now = sandcove::now_millis();
            let created = record
                .sandbox
                .metadata
                .created_at
                .as_deref()
                .and_then(translate::parse_iso8601)
                .unwrap_or(now);
            if let Ok((end, _)) = lease_end(&record.sandbox, created, now) {
                let remaining = end.saturating_sub(now).max(1000);
                let _ = core
                    .set_timeout(Duration::from_millis(remaining.min(idle * 1000)))
                    .await;
            }
        }
    }
}

pub(crate) fn cp(e: sandcove::Error) -> SandboxAPIError {
    SandboxAPIError::from(e).into_control_plane()
}

pub(crate) fn not_found(name: &str) -> SandboxAPIError {
    SandboxAPIError::api(
        404,
        "Sandbox not found",
        format!("Sandbox {name} not found"),
    )
}

pub(crate) fn already_exists(name: &str) -> SandboxAPIError {
    SandboxAPIError::api(
        409,
        "SANDBOX_ALREADY_EXISTS",
        format!("Sandbox {name} already exists"),
    )
}

pub(crate) fn invalid_name(name: &str) -> SandboxAPIError {
    SandboxAPIError::api(
        400,
        "INVALID_NAME",
        format!(
            "invalid sandbox name {name:?}: lowercase letters, digits and '-', at most 49 \
             characters"
        ),
    )
}

fn bad_duration(text: &str) -> SandboxAPIError {
    SandboxAPIError::api(
        400,
        "INVALID_TTL",
        format!("invalid duration {text:?}: use e.g. 30s, 5m, 24h, 7d, 2w"),
    )
}

async fn read_record(core: &sandcove::Sandbox) -> Result<SandboxRecord> {
    if let Some(r) = state::read_annotation::<SandboxRecord>(core, SANDBOX_KEY).await? {
        return Ok(r);
    }
    // Created a moment ago by another program that has not written the record yet: derive
    // what the core knows.
    let info = core.info().await.map_err(cp)?;
    Ok(record_from_info(&info))
}

pub(crate) fn record_from_info(info: &sandcove::SandboxInfo) -> SandboxRecord {
    let mut labels = info.labels.clone();
    let name = labels.remove(NAME_LABEL).unwrap_or_default();
    let external_id = labels.remove(EXTERNAL_ID_LABEL);
    SandboxRecord {
        sandbox: Sandbox {
            metadata: Metadata {
                name,
                labels,
                external_id,
                created_at: Some(translate::format_rfc3339(info.created_at)),
                ..Default::default()
            },
            spec: SandboxSpec {
                enabled: true,
                runtime: models::SandboxRuntime {
                    image: DEFAULT_IMAGE.into(),
                    memory: DEFAULT_MEMORY,
                    envs: info
                        .envs
                        .iter()
                        .map(|(k, v)| Env {
                            name: k.clone(),
                            value: v.clone(),
                            secret: None,
                        })
                        .collect(),
                    ..Default::default()
                },
                ..Default::default()
            },
            ..Default::default()
        },
        idle_secs: None,
    }
}

pub(crate) async fn instance_from_info(
    client: &sandcove::Client,
    info: sandcove::SandboxInfo,
) -> Result<SandboxInstance> {
    let core = client.connect(&info.id).await.map_err(|e| match e {
        e if e.is_not_found() => not_found(info.labels.get(NAME_LABEL).map_or("", |s| s)),
        e => cp(e),
    })?;
    let record = read_record(&core).await?;
    Ok(build_instance(core, &info, record.sandbox))
}

fn build_instance(
    core: sandcove::Sandbox,
    info: &sandcove::SandboxInfo,
    mut sandbox: Sandbox,
) -> SandboxInstance {
    let now = sandcove::now_millis();
    // An archived sandbox is the runtime's stopped one: nothing runs, as in standby.
    let archived = info.state == sandcove::SandboxState::Stopped;
    sandbox.status = Some(if archived { "ARCHIVED" } else { "DEPLOYED" }.into());
    sandbox.state = Some(
        if archived || info.state == sandcove::SandboxState::Paused {
            "STANDBY"
        } else {
            "RUNNING"
        }
        .into(),
    );
    sandbox.expires_in = Some((info.ends_at.saturating_sub(now) / 1000) as i64);
    sandbox.last_used_at = Some(translate::format_rfc3339(now));
    sandbox.metadata.url = Some(format!("sandcove://{}", info.id));
    sandbox.metadata.workspace = std::env::var("BL_WORKSPACE").ok();
    let ctx = Ctx {
        core,
        name: sandbox.metadata.name.clone(),
    };
    SandboxInstance {
        handle: SandboxHandle {
            metadata: sandbox.metadata.clone(),
            spec: sandbox.spec.clone(),
            status: sandbox.status.clone(),
            expires_in: sandbox.expires_in,
            last_used_at: sandbox.last_used_at.clone(),
            errors: Vec::new(),
            sandbox,
            process: process::SandboxProcess::new(ctx.clone()),
            fs: fs::SandboxFileSystem::new(ctx.clone()),
            previews: previews::SandboxPreviews::new(ctx.clone()),
            sessions: gaps::SandboxSessions::default(),
            network: crate::network::SandboxNetwork::new(ctx.clone()),
            system: gaps::SandboxSystem::new(ctx.clone()),
            drives: gaps::SandboxDrive::default(),
            codegen: gaps::SandboxCodegen::default(),
            schedules: gaps::SandboxSchedules::default(),
            snapshots: snapshots::SandboxSnapshots::new(ctx.core.client(), ctx.name.clone()),
            ctx,
        },
    }
}

async fn delete_info(client: &sandcove::Client, info: sandcove::SandboxInfo) -> Result<Sandbox> {
    let name = info.labels.get(NAME_LABEL).cloned().unwrap_or_default();
    let instance = instance_from_info(client, info.clone()).await?;
    match instance.ctx.core.destroy().await {
        Ok(()) => {}
        Err(e) if e.is_not_found() => return Err(not_found(&name)),
        Err(e) => return Err(cp(e)),
    }
    let mut sandbox = instance.sandbox.clone();
    sandbox.status = Some("DELETING".into());
    Ok(sandbox)
}

/// When the lease of `sandbox` (created at `created_ms`) ends, given its `ttl`, `expires` and
/// lifecycle policies, plus the idle timeout in seconds if a `ttl-idle` policy is set.
pub(crate) fn lease_end(
    sandbox: &Sandbox,
    created_ms: u64,
    now_ms: u64,
) -> Result<(u64, Option<u64>)> {
    let r = &sandbox.spec.runtime;
    let mut ends: Vec<u64> = Vec::new();
    let mut idle = None;
    if let Some(ttl) = &r.ttl {
        let d = translate::parse_duration(ttl).ok_or_else(|| bad_duration(ttl))?;
        ends.push(created_ms + d.as_millis() as u64);
    }
    if let Some(exp) = &r.expires {
        let at = translate::parse_iso8601(exp).ok_or_else(|| {
            SandboxAPIError::api(400, "INVALID_EXPIRES", format!("invalid date {exp:?}"))
        })?;
        ends.push(at);
    }
    if let Some(lc) = &sandbox.spec.lifecycle {
        for p in &lc.expiration_policies {
            if p.action != "delete" {
                return Err(SandboxAPIError::api(
                    400,
                    "INVALID_LIFECYCLE",
                    format!("unknown expiration action {:?}", p.action),
                ));
            }
            match p.r#type.as_str() {
                "ttl-max-age" => {
                    let d = translate::parse_duration(&p.value)
                        .ok_or_else(|| bad_duration(&p.value))?;
                    ends.push(created_ms + d.as_millis() as u64);
                }
                "ttl-idle" => {
                    let d = translate::parse_duration(&p.value)
                        .ok_or_else(|| bad_duration(&p.value))?;
                    idle = Some(d.as_secs().max(1));
                    ends.push(now_ms + d.as_millis() as u64);
                }
                "date" => {
                    let at = translate::parse_iso8601(&p.value).ok_or_else(|| {
                        SandboxAPIError::api(
                            400,
                            "INVALID_LIFECYCLE",
                            format!("invalid date {:?}", p.value),
                        )
                    })?;
                    ends.push(at);
                }
                other => {
                    return Err(SandboxAPIError::api(
                        400,
                        "INVALID_LIFECYCLE",
                        format!("unknown expiration policy type {other:?}"),
                    ))
                }
            }
        }
    }
    let end = ends
        .into_iter()
        .min()
        .unwrap_or(now_ms + DEFAULT_LEASE.as_millis() as u64);
    Ok((end, idle))
}

/// Whether `sandbox` names a deletion policy (`ttl`, `expires` or a lifecycle policy): Blaxel
/// deletes it then, and keeps a sandbox without one in standby until it is deleted.
pub(crate) fn has_deletion_policy(sandbox: &Sandbox) -> bool {
    let r = &sandbox.spec.runtime;
    r.ttl.is_some()
        || r.expires.is_some()
        || sandbox
            .spec
            .lifecycle
            .as_ref()
            .is_some_and(|l| !l.expiration_policies.is_empty())
}

/// Blaxel keeps a sandbox without a deletion policy in standby (paused, woken by the next
/// call) rather than deleting it: where the runtime can pause, the lease such a sandbox
/// gets ([`DEFAULT_LEASE`]) pauses it at its end and the next call resumes it with a fresh
/// lease. A sandbox with a policy is deleted at its end, as on Blaxel. Every sandbox wakes
/// on its next call where the runtime can pause, so the idle standby of
/// [`crate::standby`] applies to all of them.
pub(crate) fn standby_at_lease_end(
    sandbox: &Sandbox,
    caps: &sandcove::Capabilities,
    options: &mut sandcove::CreateOptions,
) {
    options.auto_resume = caps.pause;
    options.on_timeout = lease_end_action(sandbox, caps);
}

/// What the end of `sandbox`'s lease does: pause a sandbox without a deletion policy where
/// the runtime can pause (see [`standby_at_lease_end`]), destroy any other.
pub(crate) fn lease_end_action(
    sandbox: &Sandbox,
    caps: &sandcove::Capabilities,
) -> sandcove::TimeoutAction {
    if caps.pause && !has_deletion_policy(sandbox) {
        sandcove::TimeoutAction::Pause
    } else {
        sandcove::TimeoutAction::Destroy
    }
}

/// The core options for a Blaxel sandbox record; `envs` are the sandbox-wide variables.
pub(crate) fn core_options(
    sandbox: &Sandbox,
    envs: &BTreeMap<String, String>,
    now: u64,
) -> Result<(sandcove::CreateOptions, Option<u64>)> {
    let (end, idle) = lease_end(sandbox, now, now)?;
    if end <= now {
        return Err(SandboxAPIError::api(
            400,
            "INVALID_EXPIRES",
            "the sandbox would expire before it is created",
        ));
    }
    let mut labels = sandbox.metadata.labels.clone();
    labels.insert(NAME_LABEL.into(), sandbox.metadata.name.clone());
    // The external id is a label too, so the runtime's list finds it.
    if let Some(id) = &sandbox.metadata.external_id {
        labels.insert(EXTERNAL_ID_LABEL.into(), id.clone());
    }
    let mut volumes = Vec::new();
    for v in &sandbox.spec.volumes {
        volumes.push(
            sandcove::VolumeMount::new(v.name.clone(), v.mount_path.clone()).read_only(v.read_only),
        );
    }
    Ok((
        {
            let mut options = sandcove::CreateOptions::default()
                // The Blaxel name is the core's unique name: the runtime refuses a taken one.
                .name(sandbox.metadata.name.clone())
                .timeout(Duration::from_millis(end - now))
                .user("root")
                .home(HOME);
            options.envs = envs.clone();
            options.labels = labels;
            options.volumes = volumes;
            options
        },
        idle,
    ))
}

/// Make the top directory of each read-write volume in `volumes` writable by root, who runs
/// every process of a Blaxel sandbox (as on Blaxel, whose volumes root owns). A runtime
/// whose sandboxes have several users gives a new volume's top directory to its default
/// user (uid 1000, mode 0755), which root without capabilities cannot write; the runtime's
/// own file access (`chmod`) adds write and search for everyone (mode 0777, kept by the
/// volume: the default user still owns it). A directory root can write already is left as
/// it is.
pub(crate) async fn open_volume_roots(
    core: &sandcove::Sandbox,
    volumes: &[VolumeBinding],
) -> Result<()> {
    for v in volumes.iter().filter(|v| !v.read_only) {
        let stat = core.stat(&v.mount_path).await.map_err(cp)?;
        let mode = stat.mode & 0o7777;
        let root_can_write = if stat.uid == 0 {
            mode & 0o300 == 0o300
        } else if stat.gid == 0 {
            mode & 0o030 == 0o030
        } else {
            mode & 0o003 == 0o003
        };
        if !root_can_write {
            core.chmod(&v.mount_path, mode | 0o777)
                .await
                .map_err(|e| SandboxAPIError::Api {
                    message: format!(
                        "volume {:?} at {}: its top directory is not writable by root, who \
                         runs the sandbox's processes, and could not be made so: {e}",
                        v.name, v.mount_path
                    ),
                    status_code: Some(500),
                    code: Some("VOLUME_NOT_WRITABLE".into()),
                    source: Some(Box::new(e)),
                })?;
        }
    }
    Ok(())
}

/// Check a create configuration and turn it into the Blaxel record (defaults applied). Gaps
/// are refused here, before anything is created.
pub(crate) fn sandbox_from_config(config: SandboxCreateConfiguration) -> Result<Sandbox> {
    // An image other than the host base is the runtime's to run: checked at create
    // ([`image_template`]), where its capabilities are known.
    if config.network.as_ref().is_some_and(|n| !n.is_null()) {
        return Err(gaps::refuse("network"));
    }
    if config.extra_args.as_ref().is_some_and(|a| !a.is_empty()) {
        return Err(gaps::refuse("extra_args"));
    }
    for v in config.volumes.iter().flatten() {
        if v.r#type.as_deref().is_some_and(|t| t != "persistent") {
            if v.r#type.as_deref() == Some("ephemeral") {
                if v.size_mb.is_none_or(|s| s <= 0) {
                    return Err(SandboxAPIError::value_error(
                        "ephemeral volumes need a positive size_mb",
                    ));
                }
                return Err(gaps::refuse("ephemeral volumes"));
            }
            return Err(SandboxAPIError::value_error(format!(
                "volume type must be persistent or ephemeral, got {:?}",
                v.r#type
            )));
        }
    }
    if let Some(region) = &config.region {
        if !translate::REGIONS.contains(&region.as_str()) {
            return Err(SandboxAPIError::api(
                400,
                "INVALID_REGION",
                format!(
                    "unknown region {region:?}; Blaxel regions are {}",
                    translate::REGIONS.join(", ")
                ),
            ));
        }
    }
    let memory = config.memory.unwrap_or(DEFAULT_MEMORY);
    if memory <= 0 {
        return Err(SandboxAPIError::api(
            400,
            "INVALID_MEMORY",
            "memory must be positive",
        ));
    }
    for p in config.ports.iter().flatten() {
        if !(1..=65535).contains(&p.target) {
            return Err(SandboxAPIError::value_error(format!(
                "port {} is out of range",
                p.target
            )));
        }
        if !["HTTP", "TCP", "TLS", "UDP"].contains(&p.protocol.as_str()) {
            return Err(SandboxAPIError::value_error(format!(
                "port protocol must be HTTP, TCP, TLS or UDP, got {:?}",
                p.protocol
            )));
        }
    }
    let name = config
        .name
        .unwrap_or_else(|| format!("sandbox-{}", state::random_suffix(8)));
    if !translate::valid_name(&name) {
        return Err(invalid_name(&name));
    }
    if let Some(labels) = &config.labels {
        for reserved in [NAME_LABEL, EXTERNAL_ID_LABEL] {
            if labels.contains_key(reserved) {
                return Err(SandboxAPIError::value_error(format!(
                    "the label {reserved:?} is reserved"
                )));
            }
        }
    }
    let external_id = config.external_id.filter(|id| !id.is_empty());
    if let Some(id) = &external_id {
        check_external_id(id)?;
    }
    Ok(Sandbox {
        metadata: Metadata {
            name,
            labels: config.labels.unwrap_or_default(),
            external_id,
            ..Default::default()
        },
        spec: SandboxSpec {
            enabled: true,
            region: config.region.or_else(|| std::env::var("BL_REGION").ok()),
            lifecycle: config.lifecycle,
            runtime: models::SandboxRuntime {
                image: config.image.unwrap_or_else(|| DEFAULT_IMAGE.into()),
                memory,
                ports: config.ports.unwrap_or_default(),
                envs: config.envs.unwrap_or_default(),
                ttl: config.ttl,
                expires: config.expires,
                snapshot_enabled: config.snapshot_enabled,
            },
            volumes: config.volumes.unwrap_or_default(),
        },
        ..Default::default()
    })
}

/// Blaxel's form of an external id: 1 to 64 ASCII letters, digits and `-`.
pub(crate) fn check_external_id(id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(SandboxAPIError::api(
            400,
            "INVALID_EXTERNAL_ID",
            format!("invalid externalId {id:?}: at most 64 letters, digits and -"),
        ))
    }
}

/// The template a create with Blaxel `image` runs: `None` for the host base
/// (`blaxel/base-image`, the interpreter's `blaxel/jupyter-server`), the image itself where
/// the runtime runs images (it must have it stored), else refused before any effect, never
/// run as the host base.
pub(crate) fn image_template(image: &str, images: bool) -> Result<Option<String>> {
    if translate::is_host_base_image(image) {
        Ok(None)
    } else if images {
        Ok(Some(image.to_string()))
    } else {
        Err(gaps::refuse("image other than blaxel/base-image"))
    }
}

/// How often `create_if_not_exists` retries when its name is taken by a sandbox it cannot
/// list yet (about a second in all).
pub(crate) const NAME_RACE_ATTEMPTS: u32 = 50;

/// Create a Blaxel sandbox from `config` on `client` (or, with `create_if_not_exist`, return
/// the live one of that name).
pub(crate) async fn create_sandbox(
    client: &sandcove::Client,
    config: SandboxCreateConfiguration,
    create_if_not_exist: bool,
) -> Result<SandboxInstance> {
    let mut sandbox = sandbox_from_config(config)?;
    let envs: BTreeMap<String, String> = sandbox
        .spec
        .runtime
        .envs
        .iter()
        .map(|e| (e.name.clone(), e.value.clone()))
        .collect();
    let now = sandcove::now_millis();
    let (mut options, idle) = core_options(&sandbox, &envs, now)?;
    // Blaxel sandboxes reach the internet by default: isolated internet where the runtime
    // has it, else loopback only with a warning. Never the host's network.
    let caps = client.ready().await?;
    options.template = image_template(&sandbox.spec.runtime.image, caps.images)?;
    options.network = caps.vendor_internet_default();
    standby_at_lease_end(&sandbox, &caps, &mut options);
    // Blaxel's `memory` (MB) is the sandbox's limit where the runtime enforces one.
    if caps.memory_limit {
        options.resources.memory_mib = Some(sandbox.spec.runtime.memory as u64);
    }
    // The runtime keeps names unique atomically (wherever it runs): create first, and only
    // a taken name means "get the existing one" for create_if_not_exists.
    let mut attempts = 0;
    let core = loop {
        attempts += 1;
        match client.create(options.clone()).await {
            Ok(core) => break core,
            Err(sandcove::Error::AlreadyExists { .. }) if create_if_not_exist => {
                let existing = state::find_by_name(client, &sandbox.metadata.name)
                    .await
                    .map_err(SandboxAPIError::into_control_plane)?;
                if let Some(existing) = existing {
                    let instance = instance_from_info(client, existing).await?;
                    instance.touch().await;
                    return Ok(instance);
                }
                // Not listed: its holder is still being created (listed once ready) or was
                // just destroyed (the name is free again). Ask again, a bounded number of times.
                if attempts >= NAME_RACE_ATTEMPTS {
                    return Err(already_exists(&sandbox.metadata.name));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(sandcove::Error::AlreadyExists { .. }) => {
                return Err(already_exists(&sandbox.metadata.name))
            }
            Err(e @ sandcove::Error::NotSupported { .. }) => return Err(SandboxAPIError::from(e)),
            Err(e) => return Err(cp(e)),
        }
    };
    let info = core.info().await.map_err(cp)?;
    sandbox.metadata.created_at = Some(translate::format_rfc3339(info.created_at));
    sandbox.metadata.updated_at = sandbox.metadata.created_at.clone();
    let setup = async {
        open_volume_roots(&core, &sandbox.spec.volumes).await?;
        state::write_annotation(
            &core,
            SANDBOX_KEY,
            &SandboxRecord {
                sandbox: sandbox.clone(),
                idle_secs: idle,
            },
        )
        .await
    };
    if let Err(e) = setup.await {
        let _ = core.destroy().await;
        return Err(e);
    }
    Ok(build_instance(core, &info, sandbox))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn record(value: Value) -> Sandbox {
        sandbox_from_config(value.into_create().unwrap()).unwrap()
    }

    #[test]
    fn defaults_are_blaxels() {
        let s = record(json!({"name": "a"}));
        assert_eq!(s.spec.runtime.image, DEFAULT_IMAGE);
        assert_eq!(s.spec.runtime.memory, 4096);
        assert!(s.spec.runtime.ports.is_empty());
        let generated = record(json!({}));
        assert!(generated.metadata.name.starts_with("sandbox-"));
        let full = record(json!({"metadata": {"name": "b", "labels": {"k": "v"}},
            "spec": {"runtime": {"image": "blaxel/base-image:1", "memory": 2048}}}));
        assert_eq!(full.metadata.name, "b");
        assert_eq!(full.spec.runtime.memory, 2048);
        assert_eq!(full.metadata.labels["k"], "v");
    }

    #[test]
    fn bad_configurations_are_refused_before_anything_runs() {
        let refused = |v: Value| {
            v.into_create()
                .and_then(sandbox_from_config)
                .expect_err("refused")
        };
        assert!(matches!(
            refused(json!({"name": "a", "bogus": 1})),
            SandboxAPIError::ValueError { .. }
        ));
        assert_eq!(
            refused(json!({"name": "a", "region": "mars-1"})).status_code(),
            Some(400)
        );
        assert!(refused(json!({"name": "a", "network": {"proxy": {}}})).is_not_supported());
        assert!(refused(json!({"name": "a", "extra_args": {"tun": "enabled"}})).is_not_supported());
        assert!(refused(json!({"name": "Bad_Name"})).status_code() == Some(400));
        // An image the runtime cannot provide is refused, never run as the host base; one
        // it runs is its template.
        let image = image_template("myorg/custom-ml:1.2", false).expect_err("no images");
        assert!(image.is_not_supported(), "{image:?}");
        assert!(image.to_string().contains("blaxel/base-image"), "{image}");
        assert_eq!(
            image_template("myorg/custom-ml:1.2", true)
                .unwrap()
                .as_deref(),
            Some("myorg/custom-ml:1.2")
        );
        assert_eq!(
            image_template("blaxel/base-image:latest", true).unwrap(),
            None
        );
        for base in [
            "blaxel/base-image",
            "blaxel/base-image:latest",
            "blaxel/jupyter-server",
        ] {
            assert!(
                json!({"name": "a", "image": base})
                    .into_create()
                    .and_then(sandbox_from_config)
                    .is_ok(),
                "{base}"
            );
        }
        assert!(matches!(
            refused(json!({"name": "a", "envs": [{"name": "A"}]})),
            SandboxAPIError::ValueError { .. }
        ));
    }

    #[test]
    fn leases_follow_ttl_expires_and_lifecycle() {
        let now = 1_000_000_000_000u64;
        let lease = |v: Value| lease_end(&record(v), now, now).unwrap();
        assert_eq!(
            lease(json!({"name": "a", "ttl": "5m"})),
            (now + 300_000, None)
        );
        assert_eq!(
            lease(json!({"name": "a"})).0,
            now + DEFAULT_LEASE.as_millis() as u64
        );
        assert_eq!(
            lease(json!({"name": "a", "ttl": "1h", "expires": "2001-09-09T01:50:00Z"})).0,
            1_000_000_200_000
        );
        assert_eq!(
            lease(json!({"name": "a", "lifecycle": {"expiration_policies":
                [{"type": "ttl-idle", "value": "30m", "action": "delete"}]}})),
            (now + 1_800_000, Some(1800))
        );
        let bad = record(json!({"name": "a", "ttl": "soon"}));
        assert!(lease_end(&bad, now, now).is_err());
    }

    /// A sandbox deleted between the listing and its read does not shorten the page: the
    /// entries after it fill it, and the cursor moves past every entry consumed.
    #[tokio::test]
    async fn a_page_skips_entries_deleted_meanwhile_and_stays_full() {
        let deleted = |n: &u32| *n == 1 || *n == 2;
        let read = |n: u32| async move {
            if deleted(&n) {
                Err(not_found(&n.to_string()))
            } else {
                Ok(n)
            }
        };
        let entries: Vec<u32> = (0..6).collect();
        assert_eq!(
            fill_page(entries.clone(), 0, 1, read).await.unwrap(),
            (vec![0], 1)
        );
        assert_eq!(
            fill_page(entries.clone(), 1, 1, read).await.unwrap(),
            (vec![3], 4)
        );
        assert_eq!(
            fill_page(entries.clone(), 0, 3, read).await.unwrap(),
            (vec![0, 3, 4], 5)
        );
        assert_eq!(
            fill_page(entries.clone(), 4, 5, read).await.unwrap(),
            (vec![4, 5], 6)
        );
        assert_eq!(
            fill_page(entries.clone(), 9, 5, read).await.unwrap(),
            (vec![], 6)
        );
        let failing = |n: u32| async move {
            if n == 3 {
                Err(SandboxAPIError::api(500, "BOOM", "read failed"))
            } else {
                Ok(n)
            }
        };
        assert!(fill_page(entries, 0, 5, failing).await.is_err());
    }

    /// A cursor names a sandbox (creation time, id) and round-trips; anything else is a 400.
    #[test]
    fn list_cursors_round_trip_and_reject_what_they_did_not_hand_out() {
        let key: ListKey = (1_700_000_000_123, "ab12.cd".to_string());
        assert_eq!(parse_list_cursor(&list_cursor(&key)).unwrap(), key);
        for bad in ["", "1", "not-a-cursor", ".id", "12.", "-1.id", "x.id"] {
            let err = parse_list_cursor(bad).unwrap_err();
            assert_eq!(err.status_code(), Some(400), "{bad:?}");
        }
    }
}
