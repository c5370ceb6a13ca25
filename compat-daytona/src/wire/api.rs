//! Daytona's control plane under `/api`: sandboxes (create, get, list, delete, start, stop,
//! archive, labels, intervals, preview links), each decided by the Rust facade's
//! `Daytona` / `Sandbox` functions.
//!
//! Answers are the strict DTOs the SDKs validate: every required field present with the
//! exact JSON type (integers for `cpu`/`gpu`/`memory`/`disk`, booleans for `public`,
//! `networkBlockAll`, `kvm`), `state` one of Daytona's enum values, and `toolboxProxyUrl`
//! absolute on this listener.

use std::collections::{BTreeMap, HashMap};

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::Method;
use axum::Json;
use sandcove::server::auth::{Routes, SERVER_KEY};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{bad_request, parse_json, ApiError, Wire};
use crate::client::{
    CreateSandboxFromImageParams, CreateSandboxFromSnapshotParams, CreateSandboxParams,
    ImageSource, ListSandboxesQuery, Resources, SandboxListSortDirection, SandboxListSortField,
    VolumeMount,
};
use crate::gaps::gap;
use crate::sandbox::{Sandbox, SandboxState};
use crate::DaytonaError;

/// The version string reported as `daemonVersion`.
const DAEMON_VERSION: &str = "0.0.0-sandcove";
/// Largest page `GET /api/sandbox` returns.
const MAX_PAGE: usize = 200;

/// The control plane's routes (nested under `/api`): the operator's, the server key only.
pub(crate) fn routes() -> Routes<Wire> {
    Routes::new(super::refuse)
        .route(Method::POST, "/sandbox", SERVER_KEY, create)
        .route(Method::GET, "/sandbox", SERVER_KEY, list)
        .route(Method::GET, "/sandbox/{id}", SERVER_KEY, get_sandbox)
        .route(Method::DELETE, "/sandbox/{id}", SERVER_KEY, delete)
        .route(Method::POST, "/sandbox/{id}/start", SERVER_KEY, start)
        .route(Method::POST, "/sandbox/{id}/stop", SERVER_KEY, stop)
        .route(Method::POST, "/sandbox/{id}/archive", SERVER_KEY, archive)
        .route(
            Method::PUT,
            "/sandbox/{id}/labels",
            SERVER_KEY,
            replace_labels,
        )
        .route(
            Method::POST,
            "/sandbox/{id}/autostop/{interval}",
            SERVER_KEY,
            set_autostop,
        )
        .route(
            Method::POST,
            "/sandbox/{id}/autoarchive/{interval}",
            SERVER_KEY,
            set_autoarchive,
        )
        .route(
            Method::POST,
            "/sandbox/{id}/autodelete/{interval}",
            SERVER_KEY,
            set_autodelete,
        )
        .route(
            Method::GET,
            "/sandbox/{id}/toolbox-proxy-url",
            SERVER_KEY,
            toolbox_proxy_url,
        )
        .route(
            Method::GET,
            "/sandbox/{id}/ports/{port}/preview-url",
            SERVER_KEY,
            preview_url,
        )
        .route(
            Method::POST,
            "/sandbox/{id}/snapshot",
            SERVER_KEY,
            snapshot_sandbox,
        )
        .route(Method::POST, "/sandbox/{id}/pause", SERVER_KEY, pause)
        .route(
            Method::POST,
            "/sandbox/{id}/last-activity",
            SERVER_KEY,
            last_activity,
        )
        .route(Method::POST, "/sandbox/{id}/fork", SERVER_KEY, fork)
        .route(
            Method::GET,
            "/sandbox/{id}/signing-key",
            SERVER_KEY,
            signing_key,
        )
        .route(
            Method::POST,
            "/sandbox/{id}/signing-key/rotate",
            SERVER_KEY,
            rotate_signing_key,
        )
        .route(
            Method::GET,
            "/sandbox/{id}/ports/{port}/signed-preview-url",
            SERVER_KEY,
            signed_preview_url,
        )
        .route(Method::GET, "/snapshots", SERVER_KEY, list_snapshots)
        .route(Method::POST, "/snapshots", SERVER_KEY, create_snapshot)
        .route(Method::GET, "/snapshots/{id}", SERVER_KEY, get_snapshot)
        .route(
            Method::DELETE,
            "/snapshots/{id}",
            SERVER_KEY,
            delete_snapshot,
        )
        .route(Method::POST, "/volumes", SERVER_KEY, create_volume)
        .route(Method::GET, "/volumes", SERVER_KEY, list_volumes)
        .route(Method::GET, "/volumes/{id}", SERVER_KEY, get_volume)
        .route(Method::DELETE, "/volumes/{id}", SERVER_KEY, delete_volume)
        .route(
            Method::GET,
            "/volumes/by-name/{name}",
            SERVER_KEY,
            get_volume,
        )
}

/// A whole number of a facade float (`cpu`, GiB, minutes) as a JSON integer, never below
/// `min`.
fn int(value: f64, min: i64) -> i64 {
    if value.is_finite() {
        (value.ceil() as i64).max(min)
    } else {
        min
    }
}

/// The `Sandbox` DTO of a facade sandbox.
pub(crate) fn sandbox_dto(wire: &Wire, sb: &Sandbox) -> Value {
    let state = sb.state.unwrap_or(SandboxState::Unknown);
    let desired = match state {
        SandboxState::Stopped => "stopped",
        SandboxState::Archived => "archived",
        SandboxState::Destroyed => "destroyed",
        _ => "started",
    };
    let mut dto = json!({
        "id": sb.id,
        "organizationId": sb.organization_id,
        "name": sb.name,
        "user": sb.user,
        "env": sb.env.clone().unwrap_or_default(),
        "labels": sb.labels,
        "public": sb.public,
        "networkBlockAll": sb.network_block_all.unwrap_or(false),
        "kvm": false,
        "target": sb.target,
        "cpu": int(sb.cpu, 1),
        "gpu": int(sb.gpu, 0),
        "memory": int(sb.memory, 1),
        "disk": int(sb.disk, 1),
        "state": state.as_str(),
        "desiredState": desired,
        "recoverable": sb.recoverable.unwrap_or(false),
        "autoStopInterval": int(sb.auto_stop_interval.unwrap_or(0.0), 0),
        "autoArchiveInterval": int(sb.auto_archive_interval.unwrap_or(0.0), 0),
        "autoDeleteInterval": sb.auto_delete_interval.map(|v| v as i64).unwrap_or(-1),
        "volumes": sb.volume_mounts().iter().map(|(volume, path, subpath)| {
            let mut v = json!({"volumeId": volume, "mountPath": path});
            if let Some(sub) = subpath {
                v["subpath"] = json!(sub);
            }
            v
        }).collect::<Vec<_>>(),
        "createdAt": sb.created_at,
        "updatedAt": sb.updated_at,
        "lastActivityAt": sb.last_activity_at,
        "daemonVersion": DAEMON_VERSION,
        "toolboxProxyUrl": wire.toolbox_url(),
    });
    if let Some(snapshot) = &sb.snapshot {
        dto["snapshot"] = json!(snapshot);
    }
    if let Some(reason) = &sb.error_reason {
        dto["errorReason"] = json!(reason);
    }
    dto
}

/// The body of `POST /api/sandbox` (`CreateSandbox`).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CreateSandbox {
    name: Option<String>,
    snapshot: Option<String>,
    user: Option<String>,
    env: Option<HashMap<String, String>>,
    labels: Option<HashMap<String, String>>,
    public: Option<bool>,
    target: Option<String>,
    cpu: Option<i64>,
    gpu: Option<i64>,
    memory: Option<i64>,
    disk: Option<i64>,
    gpu_type: Option<Value>,
    auto_stop_interval: Option<i64>,
    auto_pause_interval: Option<i64>,
    auto_archive_interval: Option<i64>,
    auto_delete_interval: Option<i64>,
    ttl_minutes: Option<i64>,
    /// Minutes to wait for capacity: accepted, since a create here never queues.
    #[allow(dead_code)]
    queue_timeout: Option<i64>,
    volumes: Option<Vec<VolumeBody>>,
    secrets: Option<Value>,
    network_block_all: Option<bool>,
    kvm: Option<bool>,
    network_allow_list: Option<String>,
    domain_allow_list: Option<String>,
    outbound_proxy_url: Option<String>,
    otel_endpoint_override: Option<String>,
    linked_sandbox: Option<String>,
    spot: Option<bool>,
    build_info: Option<Value>,
    class: Option<String>,
    /// Anything else: refused unless null (never silently ignored).
    #[serde(flatten)]
    other: BTreeMap<String, Value>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct VolumeBody {
    volume_id: String,
    mount_path: String,
    subpath: Option<String>,
}

/// A create option this runtime has no equivalent for, refused before any effect.
fn unsupported(option: &str, alternative: &str) -> ApiError {
    ApiError(DaytonaError::not_supported(option, alternative))
}

async fn create(State(wire): State<Wire>, body: Bytes) -> Result<Json<Value>, ApiError> {
    let req: CreateSandbox = parse_json(&wire, &body)?;
    if let Some((key, _)) = req.other.iter().find(|(_, v)| !v.is_null()) {
        return Err(bad_request(format!(
            "unknown create option {key:?}: not understood by this server"
        )));
    }
    // Options with no counterpart in this runtime (see MAPPING.md).
    if req.kvm == Some(true) {
        return Err(unsupported(
            "kvm",
            "sandboxes here have no /dev/kvm; run without kvm",
        ));
    }
    if req.spot == Some(true) || req.gpu.is_some_and(|g| g > 0) || req.gpu_type.is_some() {
        return Err(ApiError(gap("GPU resources")));
    }
    if req.secrets.as_ref().is_some_and(|s| !s.is_null()) {
        return Err(ApiError(gap("secrets and warm pools")));
    }
    if req.auto_pause_interval.is_some_and(|v| v > 0) {
        return Err(unsupported(
            "auto_pause_interval",
            "auto_stop_interval (a stopped sandbox keeps its files and starts again)",
        ));
    }
    if req.ttl_minutes.is_some_and(|v| v > 0) {
        return Err(unsupported(
            "ttl_minutes",
            "auto_stop_interval, then delete the sandbox yourself",
        ));
    }
    for (name, set) in [
        ("outbound_proxy_url", req.outbound_proxy_url.is_some()),
        (
            "otel_endpoint_override",
            req.otel_endpoint_override.is_some(),
        ),
        ("class", req.class.is_some()),
    ] {
        if set {
            return Err(unsupported(name, "leave it unset: this runtime has one sandbox class and no proxy or collector settings"));
        }
    }
    let volumes = req.volumes.map(|vs| {
        vs.into_iter()
            .map(|v| VolumeMount {
                volume_id: v.volume_id,
                mount_path: v.mount_path,
                subpath: v.subpath,
            })
            .collect::<Vec<_>>()
    });
    let language = req
        .labels
        .as_ref()
        .and_then(|l| l.get(crate::translate::LANGUAGE_LABEL).cloned());
    let params: CreateSandboxParams = if let Some(build) = &req.build_info {
        // An image: a Dockerfile that only names one (`FROM x`, what the SDKs send for an
        // image given by name) is that image; anything that builds, or needs uploaded
        // context, is a declarative image. The facade decides (the host's own base runs;
        // any other image is refused naming what would run instead).
        let dockerfile = build
            .get("dockerfileContent")
            .and_then(Value::as_str)
            .unwrap_or("");
        let has_context = build
            .get("contextHashes")
            .and_then(Value::as_array)
            .is_some_and(|c| !c.is_empty());
        let image = match crate::translate::dockerfile_image(dockerfile) {
            Some(name) if !has_context => ImageSource::Name(name.to_string()),
            _ => ImageSource::Image(crate::snapshot::Image::default()),
        };
        let resources =
            (req.cpu.is_some() || req.memory.is_some() || req.disk.is_some()).then(|| Resources {
                cpu: req.cpu,
                memory: req.memory,
                disk: req.disk,
                ..Default::default()
            });
        CreateSandboxParams::Image(CreateSandboxFromImageParams {
            image,
            resources,
            name: req.name,
            language,
            os_user: req.user,
            env_vars: req.env,
            labels: req.labels,
            public: req.public,
            auto_stop_interval: req.auto_stop_interval,
            auto_archive_interval: req.auto_archive_interval,
            auto_delete_interval: req.auto_delete_interval,
            volumes,
            network_block_all: req.network_block_all,
            network_allow_list: req.network_allow_list,
            domain_allow_list: req.domain_allow_list,
            ephemeral: None,
            linked_sandbox: req.linked_sandbox,
        })
    } else {
        if req.cpu.is_some() || req.memory.is_some() || req.disk.is_some() {
            // As on Daytona, a snapshot fixes its own resources.
            return Err(unsupported(
                "resources with a snapshot",
                "a snapshot fixes its resources; give resources with an image (the host's \
                 base, e.g. CreateSandboxFromImageParams(image=\"debian:bookworm-slim\", \
                 resources=...))",
            ));
        }
        CreateSandboxParams::Snapshot(CreateSandboxFromSnapshotParams {
            snapshot: req.snapshot,
            name: req.name,
            language,
            os_user: req.user,
            env_vars: req.env,
            labels: req.labels,
            public: req.public,
            auto_stop_interval: req.auto_stop_interval,
            auto_archive_interval: req.auto_archive_interval,
            auto_delete_interval: req.auto_delete_interval,
            volumes,
            network_block_all: req.network_block_all,
            network_allow_list: req.network_allow_list,
            domain_allow_list: req.domain_allow_list,
            ephemeral: None,
            linked_sandbox: req.linked_sandbox,
        })
    };
    // The SDK bounds the whole call itself; the facade's own 60 s default would cut a slow
    // create short with a different error, so no server-side bound.
    let sb = wire
        .daytona_with_target(req.target)
        .create(params)
        .timeout(0)
        .await?;
    Ok(Json(sandbox_dto(&wire, &sb)))
}

async fn get_sandbox(
    State(wire): State<Wire>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let sb = wire.daytona().get(id).await?;
    Ok(Json(sandbox_dto(&wire, &sb)))
}

async fn delete(State(wire): State<Wire>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let mut sb = wire.daytona().get(id).await?;
    sb.delete().timeout(0).await?;
    sb.state = Some(SandboxState::Destroyed);
    Ok(Json(sandbox_dto(&wire, &sb)))
}

async fn start(State(wire): State<Wire>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let mut sb = wire.daytona().get(id).await?;
    sb.start().timeout(0).await?;
    Ok(Json(sandbox_dto(&wire, &sb)))
}

async fn stop(State(wire): State<Wire>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let mut sb = wire.daytona().get(id).await?;
    sb.stop().timeout(0).await?;
    Ok(Json(sandbox_dto(&wire, &sb)))
}

async fn archive(
    State(wire): State<Wire>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let mut sb = wire.daytona().get(id).await?;
    sb.archive().await?;
    sb.refresh_data().await?;
    Ok(Json(sandbox_dto(&wire, &sb)))
}

/// `sandbox.refresh_activity()`: the auto-stop count starts again.
async fn last_activity(
    State(wire): State<Wire>,
    Path(id): Path<String>,
) -> Result<axum::http::StatusCode, ApiError> {
    let sb = wire.daytona().get(id).await?;
    sb.refresh_activity().await?;
    Ok(axum::http::StatusCode::CREATED)
}

async fn pause(State(wire): State<Wire>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let mut sb = wire.daytona().get(id).await?;
    sb.pause().await?;
    sb.refresh_data().await?;
    Ok(Json(sandbox_dto(&wire, &sb)))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ForkBody {
    name: Option<String>,
}

/// `sandbox.fork()`: a new sandbox with a copy of this one's files, named by its id.
async fn fork(
    State(wire): State<Wire>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let req: ForkBody = parse_json(&wire, &body)?;
    if req.name.is_some() {
        return Err(unsupported(
            "fork with a name",
            "fork without a name (the fork is named by its id)",
        ));
    }
    let sb = wire.daytona().get(id).await?;
    let forked = sb.fork().await?;
    Ok(Json(sandbox_dto(&wire, &forked)))
}

/// `GET /sandbox/{id}/signing-key`: the key the SDK signs `download_url`/`upload_url`
/// with (see `file_urls`), as a JSON string.
async fn signing_key(
    State(wire): State<Wire>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let sb = wire.daytona().get(id).await?;
    let salt = sb.meta.signing_salt.as_deref().unwrap_or_default();
    Ok(Json(json!(super::file_urls::signing_key(
        &wire.config.api_key,
        &sb.id,
        salt
    ))))
}

/// `POST /sandbox/{id}/signing-key/rotate`: a new key (a fresh salt in the facade's state),
/// which ends every URL signed with the old one; answers the new key.
async fn rotate_signing_key(
    State(wire): State<Wire>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let sb = wire.daytona().get(id).await?;
    let salt = super::file_urls::new_salt().map_err(|e| ApiError(e.into()))?;
    let meta = sb
        .ctx
        .update_meta(|m| m.signing_salt = Some(salt.clone()))
        .await
        .map_err(|e| ApiError(e.into()))?;
    Ok(Json(json!(super::file_urls::signing_key(
        &wire.config.api_key,
        &sb.id,
        meta.signing_salt.as_deref().unwrap_or_default()
    ))))
}

async fn signed_preview_url(
    State(wire): State<Wire>,
    Path((id, port)): Path<(String, String)>,
    RawQuery(raw): RawQuery,
) -> Result<Json<Value>, ApiError> {
    let port: i64 = port
        .parse()
        .map_err(|_| bad_request(format!("port {port:?} is not a number")))?;
    let mut expires = None;
    for (k, v) in query_pairs(raw.as_deref().unwrap_or("")) {
        match k.as_str() {
            "expiresInSeconds" => {
                expires = Some(v.parse::<i64>().map_err(|_| {
                    bad_request(format!("expiresInSeconds {v:?} is not an integer"))
                })?)
            }
            other => return Err(bad_request(format!("unknown parameter {other:?}"))),
        }
    }
    let sb = wire.daytona().get(id).await?;
    let link = sb
        .create_signed_preview_url(port)
        .expires_in_seconds(expires)
        .await?;
    Ok(Json(json!({
        "sandboxId": link.sandbox_id,
        "port": link.port,
        "token": link.token,
        "url": link.url,
    })))
}

#[derive(Debug, Deserialize)]
struct LabelsBody {
    labels: HashMap<String, String>,
}

async fn replace_labels(
    State(wire): State<Wire>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let req: LabelsBody = parse_json(&wire, &body)?;
    let mut sb = wire.daytona().get(id).await?;
    let labels = sb.set_labels(req.labels).await?;
    Ok(Json(json!({ "labels": labels })))
}

fn interval(text: &str) -> Result<i64, ApiError> {
    text.parse::<i64>()
        .map_err(|_| bad_request(format!("interval {text:?} is not an integer")))
}

async fn set_autostop(
    State(wire): State<Wire>,
    Path((id, minutes)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let mut sb = wire.daytona().get(id).await?;
    sb.set_autostop_interval(interval(&minutes)?).await?;
    sb.refresh_data().await?;
    Ok(Json(sandbox_dto(&wire, &sb)))
}

async fn set_autoarchive(
    State(wire): State<Wire>,
    Path((id, minutes)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let mut sb = wire.daytona().get(id).await?;
    sb.set_auto_archive_interval(interval(&minutes)?).await?;
    sb.refresh_data().await?;
    Ok(Json(sandbox_dto(&wire, &sb)))
}

async fn set_autodelete(
    State(wire): State<Wire>,
    Path((id, minutes)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let mut sb = wire.daytona().get(id).await?;
    sb.set_auto_delete_interval(interval(&minutes)?).await?;
    sb.refresh_data().await?;
    Ok(Json(sandbox_dto(&wire, &sb)))
}

async fn toolbox_proxy_url(
    State(wire): State<Wire>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    // Answered for existing sandboxes only, like every other sandbox path.
    wire.daytona().get(id).await?;
    Ok(Json(json!({ "url": wire.toolbox_url() })))
}

async fn preview_url(
    State(wire): State<Wire>,
    Path((id, port)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let port: i64 = port
        .parse()
        .map_err(|_| bad_request(format!("port {port:?} is not a number")))?;
    let sb = wire.daytona().get(id).await?;
    let link = sb.get_preview_link(port).await?;
    Ok(Json(json!({
        "sandboxId": link.sandbox_id,
        "url": link.url,
        "token": link.token,
    })))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct CreateSandboxSnapshot {
    name: String,
    include_memory: Option<bool>,
}

/// `POST /api/sandbox/{id}/snapshot`: `sandbox.create_snapshot(name)`; answers the sandbox,
/// which is already back in its previous state (the copy is taken while it waits).
async fn snapshot_sandbox(
    State(wire): State<Wire>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let req: CreateSandboxSnapshot = parse_json(&wire, &body)?;
    if req.include_memory == Some(true) {
        return Err(unsupported(
            "include_memory",
            "snapshots here hold the files only; start programs again after creating from one",
        ));
    }
    let mut sb = wire.daytona().get(id).await?;
    sb.create_snapshot(&req.name).await?;
    sb.refresh_data().await?;
    Ok(Json(sandbox_dto(&wire, &sb)))
}

/// `SnapshotDto`.
fn snapshot_dto(s: &crate::Snapshot) -> Value {
    json!({
        "id": s.id,
        "organizationId": s.organization_id,
        "general": s.general,
        "name": s.name,
        "state": s.state,
        "size": s.size,
        "entrypoint": s.entrypoint,
        "cpu": s.cpu,
        "gpu": s.gpu,
        "mem": s.mem,
        "disk": s.disk,
        "errorReason": s.error_reason,
        "createdAt": s.created_at,
        "updatedAt": s.updated_at,
        "lastUsedAt": s.last_used_at,
        "sourceSandboxId": null,
    })
}

async fn list_snapshots(
    State(wire): State<Wire>,
    RawQuery(raw): RawQuery,
) -> Result<Json<Value>, ApiError> {
    let mut page = None;
    let mut limit = None;
    for (k, v) in query_pairs(raw.as_deref().unwrap_or("")) {
        let number = || {
            v.parse::<i64>()
                .map_err(|_| bad_request(format!("{k} {v:?} is not an integer")))
        };
        match k.as_str() {
            "page" => page = Some(number()?),
            "limit" => limit = Some(number()?),
            other => {
                return Err(unsupported(
                    &format!("snapshot list filter {other}"),
                    "list every snapshot (page, limit) and filter the results",
                ))
            }
        }
    }
    let list = wire
        .daytona()
        .snapshot
        .list()
        .page(page)
        .limit(limit)
        .await?;
    Ok(Json(json!({
        "items": list.items.iter().map(snapshot_dto).collect::<Vec<_>>(),
        "total": list.total,
        "page": list.page,
        "totalPages": list.total_pages,
    })))
}

async fn get_snapshot(
    State(wire): State<Wire>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let snapshot = wire.daytona().snapshot.get(name).await?;
    Ok(Json(snapshot_dto(&snapshot)))
}

async fn delete_snapshot(
    State(wire): State<Wire>,
    Path(name): Path<String>,
) -> Result<axum::http::StatusCode, ApiError> {
    let daytona = wire.daytona();
    let snapshot = daytona.snapshot.get(name).await?;
    daytona.snapshot.delete(&snapshot).await?;
    Ok(axum::http::StatusCode::OK)
}

/// `POST /api/snapshots` builds from an image: the facade's gap.
async fn create_snapshot(State(wire): State<Wire>) -> Result<Json<Value>, ApiError> {
    let snapshot = wire
        .daytona()
        .snapshot
        .create(crate::CreateSnapshotParams::default())
        .await?;
    Ok(Json(snapshot_dto(&snapshot)))
}

/// `VolumeDto`.
fn volume_dto(v: &crate::Volume) -> Value {
    json!({
        "id": v.id,
        "name": v.name,
        "organizationId": v.organization_id,
        "state": v.state,
        "createdAt": v.created_at,
        "updatedAt": v.updated_at,
        "lastUsedAt": v.last_used_at,
        "errorReason": v.error_reason,
    })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateVolume {
    name: String,
}

async fn create_volume(State(wire): State<Wire>, body: Bytes) -> Result<Json<Value>, ApiError> {
    let req: CreateVolume = parse_json(&wire, &body)?;
    let volume = wire.daytona().volume.create(&req.name).await?;
    Ok(Json(volume_dto(&volume)))
}

async fn list_volumes(State(wire): State<Wire>) -> Result<Json<Value>, ApiError> {
    let volumes = wire.daytona().volume.list().await?;
    Ok(Json(Value::Array(volumes.iter().map(volume_dto).collect())))
}

/// By id or by name: a volume's id is its name here.
async fn get_volume(
    State(wire): State<Wire>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let volume = wire.daytona().volume.get(name).await?;
    Ok(Json(volume_dto(&volume)))
}

async fn delete_volume(
    State(wire): State<Wire>,
    Path(name): Path<String>,
) -> Result<axum::http::StatusCode, ApiError> {
    let daytona = wire.daytona();
    let volume = daytona.volume.get(name).await?;
    daytona.volume.delete(&volume).await?;
    Ok(axum::http::StatusCode::OK)
}

/// Query pairs, percent-decoded (`+` is a space), repeated keys kept.
pub(crate) fn query_pairs(raw: &str) -> Vec<(String, String)> {
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(&s.replace('+', " "))
            .decode_utf8_lossy()
            .into_owned()
    };
    raw.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (decode(k), decode(v)),
            None => (decode(p), String::new()),
        })
        .collect()
}

/// `ListSandboxesQuery` of `GET /api/sandbox`, and the page wanted (`cursor`, `limit`).
fn list_query(raw: &str) -> Result<(ListSandboxesQuery, usize, usize), ApiError> {
    let mut q = ListSandboxesQuery::default();
    let mut offset = 0usize;
    let mut limit = 100usize;
    for (k, v) in query_pairs(raw) {
        match k.as_str() {
            "cursor" => {
                offset = v
                    .parse()
                    .map_err(|_| bad_request(format!("invalid cursor {v:?}")))?
            }
            "limit" => {
                let l: i64 = v
                    .parse()
                    .map_err(|_| bad_request(format!("invalid limit {v:?}")))?;
                if l < 1 {
                    return Err(bad_request("limit must be a positive integer"));
                }
                limit = (l as usize).min(MAX_PAGE);
            }
            "id" => q.id = Some(v),
            "name" => q.name = Some(v),
            "labels" => {
                let labels: HashMap<String, String> = serde_json::from_str(&v).map_err(|e| {
                    bad_request(format!("labels must be a JSON object of strings: {e}"))
                })?;
                q.labels = Some(labels);
            }
            "states" => {
                let state =
                    parse_state(&v).ok_or_else(|| bad_request(format!("unknown state {v:?}")))?;
                q.states.get_or_insert_with(Vec::new).push(state);
            }
            "isPublic" => {
                q.is_public = Some(
                    v.parse()
                        .map_err(|_| bad_request(format!("isPublic {v:?} is not a boolean")))?,
                )
            }
            "sort" => {
                q.sort = Some(match v.as_str() {
                    "name" => SandboxListSortField::Name,
                    "cpu" => SandboxListSortField::Cpu,
                    "memoryGiB" | "memoryGib" => SandboxListSortField::MemoryGib,
                    "diskGiB" | "diskGib" => SandboxListSortField::DiskGib,
                    "lastActivityAt" => SandboxListSortField::LastActivityAt,
                    "createdAt" => SandboxListSortField::CreatedAt,
                    other => return Err(bad_request(format!("unknown sort field {other:?}"))),
                })
            }
            "order" => {
                q.order = Some(match v.as_str() {
                    "asc" => SandboxListSortDirection::Asc,
                    "desc" => SandboxListSortDirection::Desc,
                    other => return Err(bad_request(format!("unknown order {other:?}"))),
                })
            }
            // Filters on what every sandbox here has the same value for: accepted only
            // when they would keep nothing out.
            "includeErroredDeleted" | "includeWarm" => {}
            other => {
                return Err(unsupported(
                    &format!("list filter {other}"),
                    "filter by labels, id, name, states or is_public, or filter the results",
                ))
            }
        }
    }
    Ok((q, offset, limit))
}

fn parse_state(text: &str) -> Option<SandboxState> {
    text.parse().ok()
}

async fn list(State(wire): State<Wire>, RawQuery(raw): RawQuery) -> Result<Json<Value>, ApiError> {
    let (query, offset, limit) = list_query(raw.as_deref().unwrap_or(""))?;
    let mut sandboxes = wire.daytona().list(query);
    let mut all = Vec::new();
    while let Some(sb) = sandboxes.next().await {
        all.push(sb?);
    }
    let items: Vec<Value> = all
        .iter()
        .skip(offset)
        .take(limit)
        .map(|sb| sandbox_dto(&wire, sb))
        .collect();
    let next = offset + items.len();
    let next_cursor = (next < all.len()).then(|| next.to_string());
    Ok(Json(json!({ "items": items, "nextCursor": next_cursor })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_queries_parse_repeated_states_labels_and_pages() {
        let (q, offset, limit) = list_query(
            "labels=%7B%22env%22%3A%22dev%22%7D&states=started&states=stopped&limit=2&cursor=4",
        )
        .unwrap();
        assert_eq!(
            q.labels,
            Some(HashMap::from([("env".to_string(), "dev".to_string())]))
        );
        assert_eq!(
            q.states,
            Some(vec![SandboxState::Started, SandboxState::Stopped])
        );
        assert_eq!((offset, limit), (4, 2));
        assert!(list_query("limit=0").is_err());
        assert!(list_query("states=running").is_err());
        assert!(
            list_query("regionIds=eu").is_err(),
            "unknown filters are refused"
        );
        assert!(list_query("labels=notjson").is_err());
    }

    #[test]
    fn whole_numbers_are_json_integers() {
        assert_eq!(int(1.0, 1), 1);
        assert_eq!(int(0.5, 1), 1);
        assert_eq!(int(2.2, 1), 3);
        assert_eq!(int(f64::NAN, 0), 0);
    }
}
