//! Snapshots and fork: Python's workspace-level `Snapshot` (`blaxel.core.snapshot`), the
//! per-sandbox `sandbox.snapshots` (`SandboxSnapshots`) and the fork every form shares.
//!
//! A snapshot is a core snapshot (the sandbox's files, not its processes or memory). The
//! facade records what Blaxel reports of it, its source sandbox and its name, in the core
//! snapshot's own name, `blaxel:{sandbox}/{name}`: host-side metadata that sandbox code cannot
//! touch and that outlives the source sandbox, as a Blaxel snapshot does. Snapshots belong to
//! a sandbox *name*, Blaxel's identity: a sandbox restored from a snapshot (a new runtime
//! sandbox under the same name) keeps its snapshots. The wire router and the Rust API call
//! the same functions here, so one place decides what each call means.

use std::collections::BTreeMap;
use std::ops::Deref;
use std::time::Duration;

use serde_json::Value;

use crate::errors::{Result, SandboxAPIError};
use crate::models::{
    self, Env, SandboxForkResponse, SandboxLifecycle, SandboxRestoreResponse, SandboxSnapshot,
    SandboxSnapshotSource, SandboxSnapshotSpec,
};
use crate::sandbox::{
    already_exists, core_options, cp, invalid_name, not_found, record_from_info,
    standby_at_lease_end, AsyncPaginatedList, NAME_RACE_ATTEMPTS,
};
use crate::state::{self, SandboxRecord, NAME_LABEL, SANDBOX_KEY};
use crate::{gaps, translate};

/// Prefix of a core snapshot name that carries the facade's record of it.
const TAG: &str = "blaxel:";

/// Longest snapshot name accepted.
pub const MAX_SNAPSHOT_NAME: usize = 128;

/// The core snapshot name recording source sandbox `sandbox` and Blaxel name `name`
/// (sandbox names never hold `/`, so the first one separates them).
fn core_name(sandbox: &str, name: Option<&str>) -> String {
    format!("{TAG}{sandbox}/{}", name.unwrap_or(""))
}

/// `(source sandbox, Blaxel name)` recorded in a core snapshot name, if the facade made it.
fn parse_tag(core: Option<&str>) -> Option<(&str, Option<&str>)> {
    let (sandbox, name) = core?.strip_prefix(TAG)?.split_once('/')?;
    Some((sandbox, Some(name).filter(|n| !n.is_empty())))
}

/// A snapshot name must be 1–128 characters without `/` or control characters (it is a path
/// segment of the per-sandbox routes).
fn check_snapshot_name(name: &str) -> Result<()> {
    if name.is_empty()
        || name.chars().count() > MAX_SNAPSHOT_NAME
        || name.chars().any(|c| c == '/' || c.is_control())
    {
        return Err(SandboxAPIError::api(
            400,
            "INVALID_NAME",
            format!(
                "invalid snapshot name {name:?}: 1-{MAX_SNAPSHOT_NAME} characters, without '/' \
                 or control characters"
            ),
        ));
    }
    Ok(())
}

fn snapshot_not_found(what: &str) -> SandboxAPIError {
    SandboxAPIError::api(
        404,
        "Snapshot not found",
        format!("Snapshot {what} not found"),
    )
}

/// The record of a live sandbox (derived from what the runtime knows when it has none yet).
fn record_of(info: &sandcove::SandboxInfo) -> SandboxRecord {
    state::annotation::<SandboxRecord>(info, SANDBOX_KEY).unwrap_or_else(|| record_from_info(info))
}

/// The record a fork of a snapshot whose source is gone starts from: Blaxel's defaults.
fn default_sandbox() -> models::Sandbox {
    let mut sandbox = models::Sandbox::default();
    sandbox.spec.enabled = true;
    sandbox.spec.runtime.image = translate::DEFAULT_IMAGE.into();
    sandbox.spec.runtime.memory = translate::DEFAULT_MEMORY;
    sandbox
}

/// The core snapshots and the live sandboxes, read once per call.
struct Catalog {
    snapshots: Vec<sandcove::SnapshotInfo>,
    live: Vec<sandcove::SandboxInfo>,
}

impl Catalog {
    async fn load(client: &sandcove::Client) -> Result<Self> {
        let snapshots = client.snapshots().await.map_err(cp)?;
        let live = client
            .list(sandcove::ListOptions::default())
            .await
            .map_err(cp)?;
        Ok(Catalog { snapshots, live })
    }

    fn live_by_name(&self, name: &str) -> Option<&sandcove::SandboxInfo> {
        self.live
            .iter()
            .find(|i| i.labels.get(NAME_LABEL).map(String::as_str) == Some(name))
    }

    /// The source sandbox name of `s`: recorded, else that of its live source, else the
    /// runtime id of its source (a snapshot made outside this facade).
    fn source_name(&self, s: &sandcove::SnapshotInfo) -> String {
        if let Some((sandbox, _)) = parse_tag(s.name.as_deref()) {
            return sandbox.to_string();
        }
        self.live
            .iter()
            .find(|i| i.id == s.sandbox_id)
            .and_then(|i| i.labels.get(NAME_LABEL).cloned())
            .unwrap_or_else(|| s.sandbox_id.clone())
    }

    /// The live source sandbox of `s`, if any.
    fn source(&self, s: &sandcove::SnapshotInfo) -> Option<&sandcove::SandboxInfo> {
        match parse_tag(s.name.as_deref()) {
            Some((sandbox, _)) => self.live_by_name(sandbox),
            None => self.live.iter().find(|i| i.id == s.sandbox_id),
        }
    }

    /// The Blaxel name of `s`: the one given, else its id.
    fn name(s: &sandcove::SnapshotInfo) -> String {
        match parse_tag(s.name.as_deref()) {
            Some((_, name)) => name.map_or_else(|| s.id.clone(), str::to_string),
            None => s.name.clone().unwrap_or_else(|| s.id.clone()),
        }
    }

    /// The snapshots taken from sandbox `name`, oldest first.
    fn of_sandbox(&self, name: &str) -> Vec<&sandcove::SnapshotInfo> {
        self.snapshots
            .iter()
            .filter(|s| self.source_name(s) == name)
            .collect()
    }

    /// Snapshot `id`.
    fn find(&self, id: &str) -> Option<&sandcove::SnapshotInfo> {
        self.snapshots.iter().find(|s| s.id == id)
    }

    /// A snapshot of sandbox `sandbox` by id, or else by name (the SDKs pass either).
    fn find_in_sandbox(&self, sandbox: &str, id_or_name: &str) -> Option<&sandcove::SnapshotInfo> {
        let mine = self.of_sandbox(sandbox);
        mine.iter()
            .find(|s| s.id == id_or_name)
            .or_else(|| mine.iter().find(|s| Self::name(s) == id_or_name))
            .copied()
    }

    /// The `SandboxSnapshot` model of `s`.
    fn model(&self, s: &sandcove::SnapshotInfo) -> SandboxSnapshot {
        let source_name = self.source_name(s);
        let source = self.source(s);
        let spec = source.map(|info| {
            let record = record_of(info);
            let runtime = &record.sandbox.spec.runtime;
            SandboxSnapshotSpec {
                image: Some(runtime.image.clone()),
                memory: Some(runtime.memory),
                ports: Some(runtime.ports.clone()).filter(|p| !p.is_empty()),
                region: record.sandbox.spec.region.clone(),
            }
        });
        SandboxSnapshot {
            id: s.id.clone(),
            name: Self::name(s),
            sandbox_name: source_name.clone(),
            status: "ready".into(),
            created_at: translate::format_rfc3339(s.created_at),
            workspace: std::env::var("BL_WORKSPACE").ok(),
            created_by: None,
            source: Some(SandboxSnapshotSource {
                name: source_name,
                deleted: Some(source.is_none()),
                kind: Some("sandbox".into()),
            }),
            spec,
        }
    }
}

/// Take a snapshot of sandbox `sandbox_name` on `client`, named `name` (its id when `None`).
/// A name already used by another snapshot of that sandbox is a 409; a missing sandbox a 404.
pub(crate) async fn create_on(
    client: &sandcove::Client,
    sandbox_name: &str,
    name: Option<String>,
) -> Result<SandboxSnapshot> {
    if let Some(name) = &name {
        check_snapshot_name(name)?;
    }
    let catalog = Catalog::load(client).await?;
    let info = catalog
        .live_by_name(sandbox_name)
        .ok_or_else(|| not_found(sandbox_name))?;
    if let Some(name) = &name {
        if catalog
            .find_in_sandbox(sandbox_name, name)
            .is_some_and(|s| Catalog::name(s) == *name)
        {
            return Err(SandboxAPIError::api(
                409,
                "SNAPSHOT_ALREADY_EXISTS",
                format!("Snapshot {name} already exists on sandbox {sandbox_name}"),
            ));
        }
    }
    let core = client.sandbox(&info.id);
    let taken = core
        .snapshot(Some(core_name(sandbox_name, name.as_deref())))
        .await
        .map_err(|e| match e {
            e if e.is_not_found() => not_found(sandbox_name),
            e => cp(e),
        })?;
    if let Some(why) = &taken.source_resume_error {
        return Err(source_not_resumed(
            &format!("snapshot {}", taken.id),
            sandbox_name,
            why,
        ));
    }
    let catalog = Catalog {
        snapshots: vec![taken.clone()],
        live: vec![info.clone()],
    };
    Ok(catalog.model(&taken))
}

/// The snapshots of sandbox `sandbox_name`, oldest first; a missing sandbox is a 404.
pub(crate) async fn list_of_sandbox_on(
    client: &sandcove::Client,
    sandbox_name: &str,
) -> Result<Vec<SandboxSnapshot>> {
    let catalog = Catalog::load(client).await?;
    if catalog.live_by_name(sandbox_name).is_none() {
        return Err(not_found(sandbox_name));
    }
    Ok(catalog
        .of_sandbox(sandbox_name)
        .into_iter()
        .map(|s| catalog.model(s))
        .collect())
}

/// Delete snapshot `id_or_name` of sandbox `sandbox_name` (for the whole workspace); a
/// missing sandbox or snapshot is a 404.
pub(crate) async fn delete_of_sandbox_on(
    client: &sandcove::Client,
    sandbox_name: &str,
    id_or_name: &str,
) -> Result<()> {
    let catalog = Catalog::load(client).await?;
    if catalog.live_by_name(sandbox_name).is_none() {
        return Err(not_found(sandbox_name));
    }
    let snap = catalog
        .find_in_sandbox(sandbox_name, id_or_name)
        .ok_or_else(|| snapshot_not_found(&format!("{id_or_name} of sandbox {sandbox_name}")))?;
    delete_core(client, &snap.id).await
}

async fn delete_core(client: &sandcove::Client, id: &str) -> Result<()> {
    client.delete_snapshot(id).await.map_err(|e| match e {
        e if e.is_not_found() => snapshot_not_found(id),
        e => cp(e),
    })
}

/// Snapshot `id` of the workspace; a 404 when there is none.
pub(crate) async fn get_on(client: &sandcove::Client, id: &str) -> Result<SandboxSnapshot> {
    let catalog = Catalog::load(client).await?;
    let s = catalog.find(id).ok_or_else(|| snapshot_not_found(id))?;
    Ok(catalog.model(s))
}

/// Delete snapshot `id` of the workspace; a 404 when there is none.
pub(crate) async fn delete_on(client: &sandcove::Client, id: &str) -> Result<()> {
    let catalog = Catalog::load(client).await?;
    if catalog.find(id).is_none() {
        return Err(snapshot_not_found(id));
    }
    delete_core(client, id).await
}

/// Largest page of a snapshot listing.
pub const MAX_PAGE: i64 = 200;

/// One page of the workspace's snapshots, oldest first; `cursor` is the previous page's
/// `next_cursor`. A limit outside 1–200 or a cursor this listing did not hand out is a 400.
pub(crate) async fn list_on(
    client: &sandcove::Client,
    limit: i64,
    cursor: Option<&str>,
) -> Result<AsyncPaginatedList<SandboxSnapshot>> {
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(SandboxAPIError::api(
            400,
            "INVALID_LIMIT",
            format!("limit must be between 1 and {MAX_PAGE}, got {limit}"),
        ));
    }
    let start: usize = match cursor.filter(|c| !c.is_empty()) {
        None => 0,
        Some(c) => c.parse().map_err(|_| {
            SandboxAPIError::api(400, "INVALID_CURSOR", format!("invalid cursor {c:?}"))
        })?,
    };
    let mut catalog = Catalog::load(client).await?;
    catalog
        .snapshots
        .sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
    let total = catalog.snapshots.len();
    let end = start.saturating_add(limit as usize);
    let data = catalog
        .snapshots
        .iter()
        .skip(start)
        .take(limit as usize)
        .map(|s| catalog.model(s))
        .collect();
    Ok(AsyncPaginatedList {
        data,
        has_more: end < total,
        next_cursor: (end < total).then(|| end.to_string()),
        total: total as i64,
    })
}

/// What a fork starts from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ForkFrom<'a> {
    /// Sandbox `name`: its live files, or those of the request's `snapshot_id`.
    Sandbox(&'a str),
    /// Snapshot `id` of the workspace (its source may be gone).
    Snapshot(&'a str),
}

/// A fork's options (`SandboxForkRequest`).
#[derive(Debug, Clone, Default)]
pub(crate) struct ForkRequest {
    pub target_name: String,
    pub target_type: String,
    pub port: Option<i64>,
    pub traffic: Option<i64>,
    pub custom_domain: Option<String>,
    pub prefix: Option<String>,
    pub snapshot_id: Option<String>,
    pub envs: Vec<Env>,
    pub lifecycle: Option<SandboxLifecycle>,
}

/// Fork into a new sandbox `req.target_name` on `client`: the files of the source sandbox
/// (live) or of a snapshot, the source's record (image, memory, ports, labels, lifecycle)
/// and sandbox-wide envs with `req.envs` on top; never its processes. Every refusal (a gap,
/// a bad or taken name, a missing source or snapshot) comes before any effect.
pub(crate) async fn fork_on(
    client: &sandcove::Client,
    from: ForkFrom<'_>,
    req: ForkRequest,
) -> Result<SandboxForkResponse> {
    if req.target_type != "sandbox" {
        return Err(gaps::refuse("fork target_type=\"application\""));
    }
    if req.port.is_some() || req.traffic.is_some() {
        return Err(gaps::refuse("fork port/traffic"));
    }
    if req.custom_domain.is_some() || req.prefix.is_some() {
        return Err(gaps::refuse("fork custom_domain/prefix"));
    }
    if !translate::valid_name(&req.target_name) {
        return Err(invalid_name(&req.target_name));
    }
    let catalog = Catalog::load(client).await?;
    // A taken name is refused before anything is copied (the runtime refuses it again,
    // atomically, should a sandbox take it meanwhile).
    if catalog.live_by_name(&req.target_name).is_some() {
        return Err(already_exists(&req.target_name));
    }
    // (the sandbox whose live files are copied, the snapshot used instead, the source)
    let (live, snapshot, source) = match from {
        ForkFrom::Sandbox(name) => {
            let info = catalog.live_by_name(name).ok_or_else(|| not_found(name))?;
            // Only a snapshot of this sandbox: another's files under this sandbox's record
            // and envs would hand its envs to the other sandbox's code.
            let snapshot = match &req.snapshot_id {
                Some(id) => Some(
                    catalog
                        .of_sandbox(name)
                        .into_iter()
                        .find(|s| s.id == *id)
                        .ok_or_else(|| snapshot_not_found(&format!("{id} of sandbox {name}")))?,
                ),
                None => None,
            };
            (snapshot.is_none().then_some(info), snapshot, Some(info))
        }
        ForkFrom::Snapshot(id) => {
            let s = catalog.find(id).ok_or_else(|| snapshot_not_found(id))?;
            (None, Some(s), catalog.source(s))
        }
    };
    // A snapshot whose source is gone forks with the defaults (the runtime kept its files).
    let (record, mut envs) = match source {
        Some(info) => (record_of(info), info.envs.clone()),
        None => (
            SandboxRecord {
                sandbox: default_sandbox(),
                idle_secs: None,
            },
            BTreeMap::new(),
        ),
    };
    let mut sandbox = record.sandbox;
    sandbox.metadata.name = req.target_name.clone();
    sandbox.metadata.labels.remove(NAME_LABEL);
    for env in &req.envs {
        envs.insert(env.name.clone(), env.value.clone());
        let runtime_envs = &mut sandbox.spec.runtime.envs;
        match runtime_envs.iter_mut().find(|e| e.name == env.name) {
            Some(e) => *e = env.clone(),
            None => runtime_envs.push(env.clone()),
        }
    }
    if let Some(lifecycle) = req.lifecycle {
        // The fork's own lifecycle replaces the source's, with its ttl and expires.
        sandbox.spec.lifecycle = Some(lifecycle);
        sandbox.spec.runtime.ttl = None;
        sandbox.spec.runtime.expires = None;
    }
    let (mut options, idle) = core_options(&sandbox, &envs, sandcove::now_millis())?;
    let caps = client.ready().await.map_err(cp)?;
    options.network = caps.vendor_internet_default();
    standby_at_lease_end(&sandbox, &caps, &mut options);
    if caps.memory_limit {
        options.resources.memory_mib = Some(sandbox.spec.runtime.memory.max(1) as u64);
    }
    let made = match (live, snapshot) {
        (Some(info), _) => match client.sandbox(&info.id).fork_described(options).await {
            Ok((_, made)) if made.source_resume_error.is_some() => {
                let why = made.source_resume_error.clone().unwrap_or_default();
                let source = info.labels.get(NAME_LABEL).map_or("", String::as_str);
                return Err(source_not_resumed(
                    &format!("fork {}", made.id),
                    source,
                    &why,
                ));
            }
            made => made.map(|(sandbox, _)| sandbox),
        },
        (None, Some(s)) => {
            options.snapshot = Some(s.id.clone());
            client.create(options).await
        }
        (None, None) => return Err(SandboxAPIError::exception("a fork needs a source")),
    };
    let core = made.map_err(|e| match e {
        // The runtime keeps names unique (atomically, wherever it runs).
        sandcove::Error::AlreadyExists { .. } => already_exists(&req.target_name),
        e if e.is_not_found() => match (live, snapshot) {
            (Some(info), _) => not_found(info.labels.get(NAME_LABEL).map_or("", String::as_str)),
            (None, Some(s)) => snapshot_not_found(&s.id),
            (None, None) => cp(e),
        },
        e => cp(e),
    })?;
    let info = core.info().await.map_err(cp)?;
    sandbox.metadata.created_at = Some(translate::format_rfc3339(info.created_at));
    sandbox.metadata.updated_at = sandbox.metadata.created_at.clone();
    // A live fork got a copy of the source's annotations: its own record replaces the
    // source's, and the source's process, preview and preview-token records do not describe
    // the fork (its previews are its own; the source's token values stay out).
    let record = SandboxRecord {
        sandbox,
        idle_secs: idle,
    };
    // The source's volumes were opened to root when it was made; a source made before that
    // was done is opened now.
    if let Err(e) = crate::sandbox::open_volume_roots(&core, &record.sandbox.spec.volumes).await {
        let _ = core.destroy().await;
        return Err(e);
    }
    let mut update =
        sandcove::AnnotationUpdate::set(SANDBOX_KEY, state::encode(SANDBOX_KEY, &record)?);
    update.remove = foreign_records(&info);
    if let Err(e) = state::update_annotations(&core, update).await {
        let _ = core.destroy().await;
        return Err(cp(e));
    }
    Ok(SandboxForkResponse {
        name: req.target_name,
        snapshot_id: snapshot.map(|s| s.id.clone()),
        type_: "sandbox".into(),
    })
}

/// The annotation keys of a sandbox that describe its processes, previews and preview tokens:
/// another instance (a fork, a restored one) has none of these.
fn foreign_records(info: &sandcove::SandboxInfo) -> Vec<String> {
    info.annotations
        .keys()
        .filter(|k| {
            k.starts_with(state::PROC_KEY_PREFIX)
                || k.starts_with(state::PREVIEW_KEY_PREFIX)
                || k.starts_with(state::TOKEN_KEY_PREFIX)
        })
        .cloned()
        .collect()
}

/// Restore sandbox `sandbox_name` to its snapshot `id_or_name`: the running instance is
/// replaced by one made from the snapshot's files, under the same name, with the same record,
/// envs, network and lease; processes and previews are not carried over. A missing sandbox or
/// snapshot (or a snapshot of another sandbox) is a 404, before any effect.
pub(crate) async fn restore_on(
    client: &sandcove::Client,
    sandbox_name: &str,
    id_or_name: &str,
) -> Result<SandboxRestoreResponse> {
    let catalog = Catalog::load(client).await?;
    let info = catalog
        .live_by_name(sandbox_name)
        .ok_or_else(|| not_found(sandbox_name))?;
    let snap = catalog
        .find_in_sandbox(sandbox_name, id_or_name)
        .ok_or_else(|| snapshot_not_found(&format!("{id_or_name} of sandbox {sandbox_name}")))?;
    let record = record_of(info);
    let now = sandcove::now_millis();
    // The options the sandbox was made with (as `create` derives them), its current lease,
    // network and volumes, and the snapshot's files.
    let (mut options, _) = core_options(&record.sandbox, &info.envs, now)?;
    let caps = client.ready().await.map_err(cp)?;
    standby_at_lease_end(&record.sandbox, &caps, &mut options);
    if caps.memory_limit {
        options.resources.memory_mib = Some(record.sandbox.spec.runtime.memory.max(1) as u64);
    }
    options.timeout = Some(Duration::from_millis(
        info.ends_at.saturating_sub(now).max(1000),
    ));
    options.network = info.network.clone();
    options.volumes = info.volumes.clone();
    options.snapshot = Some(snap.id.clone());
    let mut annotations = info.annotations.clone();
    for key in foreign_records(info) {
        annotations.remove(&key);
    }
    annotations.insert(SANDBOX_KEY.into(), state::encode(SANDBOX_KEY, &record)?);
    options.annotations = annotations;
    // Everything is checked: only now is the old instance removed (the name is unique, so the
    // new one can only take it afterwards).
    match client.sandbox(&info.id).destroy().await {
        Ok(()) => {}
        Err(e) if e.is_not_found() => return Err(not_found(sandbox_name)),
        Err(e) => return Err(cp(e)),
    }
    let mut attempts = 0;
    loop {
        attempts += 1;
        match client.create(options.clone()).await {
            Ok(_) => break,
            // The name is free once the destroy returned; another creator may hold it a
            // moment (bounded).
            Err(sandcove::Error::AlreadyExists { .. }) if attempts < NAME_RACE_ATTEMPTS => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => {
                return Err(SandboxAPIError::api(
                    500,
                    "RESTORE_FAILED",
                    format!(
                        "sandbox {sandbox_name} was removed to be restored from snapshot {}, \
                         but the restored sandbox could not be created: {e}; the snapshot is \
                         kept: fork it to get the files back",
                        snap.id
                    ),
                ))
            }
        }
    }
    Ok(SandboxRestoreResponse {
        name: sandbox_name.to_string(),
        snapshot_id: snap.id.clone(),
    })
}

// ----- the Rust API (Python names) -----

/// A workspace snapshot (Python `Snapshot`): `Snapshot::create`, `Snapshot::get`,
/// `Snapshot::list`, `Snapshot::delete(id)` are the class methods; `snapshot.delete()` and
/// `snapshot.fork(target_name)` are on [`SnapshotHandle`], which this derefs to (and which
/// derefs to the [`SandboxSnapshot`] model, so `snapshot.name`, `snapshot.id` read as in
/// Python).
#[derive(Debug, Clone)]
pub struct Snapshot {
    handle: SnapshotHandle,
}

impl Deref for Snapshot {
    type Target = SnapshotHandle;
    fn deref(&self) -> &SnapshotHandle {
        &self.handle
    }
}

/// The instance side of a [`Snapshot`].
#[derive(Debug, Clone)]
pub struct SnapshotHandle {
    /// `snapshot.snapshot`: the model.
    pub snapshot: SandboxSnapshot,
    client: sandcove::Client,
}

impl Deref for SnapshotHandle {
    type Target = SandboxSnapshot;
    fn deref(&self) -> &SandboxSnapshot {
        &self.snapshot
    }
}

impl Snapshot {
    fn wrap(client: &sandcove::Client, snapshot: SandboxSnapshot) -> Self {
        Snapshot {
            handle: SnapshotHandle {
                snapshot,
                client: client.clone(),
            },
        }
    }

    /// `Snapshot.create(config)`: `config` is a dict `{"source": {"name": sandbox, "kind":
    /// "sandbox"}, "name": optional}`. A missing source name is a `ValueError`.
    pub async fn create(config: Value) -> Result<Self> {
        let (source, name) = snapshot_request(&config)?;
        let client = state::client()?;
        let taken = create_on(&client, &source, name).await?;
        Ok(Self::wrap(&client, taken))
    }

    /// `Snapshot.get(snapshot_id)`.
    pub async fn get(snapshot_id: &str) -> Result<Self> {
        let client = state::client()?;
        let s = get_on(&client, snapshot_id).await?;
        Ok(Self::wrap(&client, s))
    }

    /// `Snapshot.list(limit=50, cursor=None)`: one page, oldest first.
    pub fn list() -> ListSnapshotsBuilder {
        ListSnapshotsBuilder {
            limit: 50,
            cursor: None,
        }
    }

    /// `Snapshot.delete(snapshot_id)` (class form).
    pub async fn delete(snapshot_id: &str) -> Result<()> {
        delete_on(&state::client()?, snapshot_id).await
    }
}

impl SnapshotHandle {
    /// `snapshot.delete()` (instance form).
    pub async fn delete(&self) -> Result<()> {
        delete_on(&self.client, &self.snapshot.id).await
    }

    /// `snapshot.fork(target_name, target_type="sandbox", port=None, traffic=None,
    /// custom_domain=None, prefix=None, envs=None)`: a new sandbox with this snapshot's files,
    /// also once its source sandbox is deleted.
    pub fn fork(&self, target_name: &str) -> SnapshotForkBuilder {
        SnapshotForkBuilder {
            client: self.client.clone(),
            id: self.snapshot.id.clone(),
            req: ForkRequest {
                target_name: target_name.to_string(),
                target_type: "sandbox".into(),
                ..Default::default()
            },
        }
    }
}

/// Parse a `SandboxSnapshotRequest` dict: `(source sandbox name, snapshot name)`.
pub(crate) fn snapshot_request(config: &Value) -> Result<(String, Option<String>)> {
    let obj = config
        .as_object()
        .ok_or_else(|| SandboxAPIError::value_error("the snapshot request must be an object"))?;
    if let Some(k) = obj
        .iter()
        .find(|(k, v)| !v.is_null() && !matches!(k.as_str(), "name" | "source"))
        .map(|(k, _)| k)
    {
        return Err(SandboxAPIError::value_error(format!(
            "unknown field in the snapshot request: {k}"
        )));
    }
    let name = match obj.get("name") {
        None | Some(Value::Null) => None,
        Some(Value::String(n)) => Some(n.clone()),
        Some(_) => return Err(SandboxAPIError::value_error("name must be a string")),
    };
    let source = match obj.get("source") {
        Some(Value::Object(source)) => source,
        _ => {
            return Err(SandboxAPIError::value_error(
                "Snapshot source requires a name",
            ))
        }
    };
    if let Some(k) = source
        .iter()
        // `deleted` is read-only: an SDK may echo it.
        .find(|(k, v)| !v.is_null() && !matches!(k.as_str(), "name" | "kind" | "deleted"))
        .map(|(k, _)| k)
    {
        return Err(SandboxAPIError::value_error(format!(
            "unknown field in the snapshot source: {k}"
        )));
    }
    match source.get("kind") {
        None | Some(Value::Null) => {}
        Some(Value::String(k)) if k.eq_ignore_ascii_case("sandbox") => {}
        Some(other) => {
            return Err(SandboxAPIError::value_error(format!(
                "snapshot source kind must be \"sandbox\", got {other}"
            )))
        }
    }
    match source.get("name") {
        Some(Value::String(n)) if !n.is_empty() => Ok((n.clone(), name)),
        _ => Err(SandboxAPIError::value_error(
            "Snapshot source requires a name",
        )),
    }
}

/// Builder of `Snapshot.list(limit=50, cursor=None)`.
#[derive(Debug)]
pub struct ListSnapshotsBuilder {
    limit: i64,
    cursor: Option<String>,
}

impl ListSnapshotsBuilder {
    /// `limit=` (1–200).
    pub fn limit(mut self, limit: i64) -> Self {
        self.limit = limit;
        self
    }
    /// `cursor=`: the previous page's `next_cursor`.
    pub fn cursor(mut self, cursor: impl crate::OptionalString) -> Self {
        self.cursor = cursor.into_optional();
        self
    }
    async fn run(self) -> Result<AsyncPaginatedList<Snapshot>> {
        let client = state::client()?;
        let page = list_on(&client, self.limit, self.cursor.as_deref()).await?;
        Ok(AsyncPaginatedList {
            data: page
                .data
                .into_iter()
                .map(|s| Snapshot::wrap(&client, s))
                .collect(),
            has_more: page.has_more,
            next_cursor: page.next_cursor,
            total: page.total,
        })
    }
}
crate::sandbox::into_future!(ListSnapshotsBuilder => AsyncPaginatedList<Snapshot>);

/// Builder of `snapshot.fork(target_name, …)`.
#[derive(Debug)]
pub struct SnapshotForkBuilder {
    client: sandcove::Client,
    id: String,
    req: ForkRequest,
}

impl SnapshotForkBuilder {
    /// `target_type=`: `sandbox` (default); `application` is not supported.
    pub fn target_type(mut self, t: impl Into<String>) -> Self {
        self.req.target_type = t.into();
        self
    }
    /// `port=` (application forks only; not supported).
    pub fn port(mut self, port: impl Into<Option<i64>>) -> Self {
        self.req.port = port.into();
        self
    }
    /// `traffic=` (application forks only; not supported).
    pub fn traffic(mut self, traffic: impl Into<Option<i64>>) -> Self {
        self.req.traffic = traffic.into();
        self
    }
    /// `custom_domain=` (not supported).
    pub fn custom_domain(mut self, d: impl crate::OptionalString) -> Self {
        self.req.custom_domain = d.into_optional();
        self
    }
    /// `prefix=` (not supported).
    pub fn prefix(mut self, p: impl crate::OptionalString) -> Self {
        self.req.prefix = p.into_optional();
        self
    }
    /// `envs=`: variables on top of the source's.
    pub fn envs(mut self, envs: impl IntoIterator<Item = Env>) -> Self {
        self.req.envs = envs.into_iter().collect();
        self
    }
    async fn run(self) -> Result<SandboxForkResponse> {
        fork_on(&self.client, ForkFrom::Snapshot(&self.id), self.req).await
    }
}
crate::sandbox::into_future!(SnapshotForkBuilder => SandboxForkResponse);

/// `sandbox.snapshots` (Python `SandboxSnapshots`): the snapshots taken from one sandbox.
/// They are workspace snapshots: deleting one here deletes it everywhere, and they stay
/// after the sandbox is deleted.
#[derive(Debug, Clone)]
pub struct SandboxSnapshots {
    client: sandcove::Client,
    name: String,
}

impl SandboxSnapshots {
    pub(crate) fn new(client: sandcove::Client, name: String) -> Self {
        SandboxSnapshots { client, name }
    }

    /// `sandbox.snapshots.create(name=None)`.
    pub fn create(&self) -> CreateSnapshotBuilder {
        CreateSnapshotBuilder {
            snapshots: self.clone(),
            name: None,
        }
    }

    /// `sandbox.snapshots.list()`.
    pub async fn list(&self) -> Result<Vec<Snapshot>> {
        Ok(list_of_sandbox_on(&self.client, &self.name)
            .await?
            .into_iter()
            .map(|s| Snapshot::wrap(&self.client, s))
            .collect())
    }

    /// `sandbox.snapshots.get(snapshot_name)`: by name or id; a `ValueError` when this
    /// sandbox has no such snapshot (as in Python).
    pub async fn get(&self, snapshot_name: &str) -> Result<Snapshot> {
        self.list()
            .await?
            .into_iter()
            .find(|s| s.name == snapshot_name || s.id == snapshot_name)
            .ok_or_else(|| {
                SandboxAPIError::value_error(format!(
                    "Snapshot {snapshot_name} not found on sandbox {}",
                    self.name
                ))
            })
    }

    /// `sandbox.snapshots.delete(snapshot_name)`: by name or id.
    pub async fn delete(&self, snapshot_name: &str) -> Result<()> {
        delete_of_sandbox_on(&self.client, &self.name, snapshot_name).await
    }

    /// `sandbox.snapshots.restore(snapshot_name)`: by name or id. The sandbox keeps its name
    /// and record; its files become the snapshot's, its processes and previews end.
    pub async fn restore(&self, snapshot_name: &str) -> Result<SandboxRestoreResponse> {
        restore_on(&self.client, &self.name, snapshot_name).await
    }
}

/// Builder of `sandbox.snapshots.create(name=None)`.
#[derive(Debug)]
pub struct CreateSnapshotBuilder {
    snapshots: SandboxSnapshots,
    name: Option<String>,
}

impl CreateSnapshotBuilder {
    /// `name=`.
    pub fn name(mut self, name: impl crate::OptionalString) -> Self {
        self.name = name.into_optional();
        self
    }
    async fn run(self) -> Result<Snapshot> {
        let s = create_on(&self.snapshots.client, &self.snapshots.name, self.name).await?;
        Ok(Snapshot::wrap(&self.snapshots.client, s))
    }
}
crate::sandbox::into_future!(CreateSnapshotBuilder => Snapshot);

/// A snapshot or fork was made (and is kept), but its source, paused for it, could not be
/// resumed: raised rather than dropped, naming what was made and what to do with the source.
fn source_not_resumed(made: &str, source: &str, why: &str) -> SandboxAPIError {
    SandboxAPIError::exception(format!(
        "{made} was made and is kept, but sandbox {source}, paused for it, could not be \
         resumed ({why}): resume or delete it"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_core_name_records_source_and_name() {
        assert_eq!(
            parse_tag(Some(&core_name("box-1", Some("before")))),
            Some(("box-1", Some("before")))
        );
        assert_eq!(
            parse_tag(Some(&core_name("box-1", None))),
            Some(("box-1", None))
        );
        assert_eq!(parse_tag(Some("fork of abc")), None, "not the facade's");
        assert_eq!(parse_tag(None), None);
    }

    #[test]
    fn snapshot_names_are_bounded_path_segments() {
        assert!(check_snapshot_name("before-1.v2").is_ok());
        for bad in ["", "a/b", "a\nb", &"x".repeat(MAX_SNAPSHOT_NAME + 1)] {
            let e = check_snapshot_name(bad).unwrap_err();
            assert_eq!(e.status_code(), Some(400), "{bad:?}");
        }
    }

    #[test]
    fn a_snapshot_request_needs_a_source_name() {
        assert_eq!(
            snapshot_request(&json!({"source": {"name": "a", "kind": "sandbox"}, "name": "s"}))
                .unwrap(),
            ("a".into(), Some("s".into()))
        );
        assert_eq!(
            snapshot_request(&json!({"source": {"name": "a"}})).unwrap(),
            ("a".into(), None)
        );
        for bad in [
            json!({}),
            json!({"source": {}}),
            json!({"source": {"name": ""}}),
            json!({"source": {"name": "a", "kind": "agent"}}),
            json!({"source": {"name": "a"}, "extra": 1}),
            json!({"source": {"name": "a", "extra": 1}}),
            json!({"source": {"name": "a"}, "name": 3}),
        ] {
            let e = snapshot_request(&bad).unwrap_err();
            assert!(
                matches!(e, SandboxAPIError::ValueError { .. }),
                "{bad}: {e:?}"
            );
        }
    }
}
