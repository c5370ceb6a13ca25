//! Blaxel's snapshot and fork routes under `/v0`, each decided by the Rust facade's
//! [`crate::snapshots`] functions:
//!
//! | route | SDK call | answer |
//! |---|---|---|
//! | `POST /sandboxes/{name}/snapshots` | Python `sandbox.snapshots.create`, `sandbox.snapshot` | `200 SandboxSnapshot` |
//! | `GET /sandboxes/{name}/snapshots` | `sandbox.snapshots.list/get`, `list_snapshots` | `200 [SandboxSnapshot]` |
//! | `DELETE /sandboxes/{name}/snapshots/{id or name}` | `sandbox.snapshots.delete`, `delete_snapshot` | `204` |
//! | `POST /sandboxes/{name}/snapshots/{id or name}/restore` | `sandbox.snapshots.restore`, `restore` | `200 {name, snapshotId}` |
//! | `POST /sandboxes/{name}/fork` | `sandbox.fork` | `200 {name, snapshotId?, type}` |
//! | `POST /snapshots` | `Snapshot.create`, TS `sandbox.snapshots.create` | `200 SandboxSnapshot` |
//! | `GET /snapshots?limit=&cursor=` | `Snapshot.list` (paged) | `200 {data, meta}` |
//! | `GET /snapshots/{id}` | `Snapshot.get` | `200 SandboxSnapshot` |
//! | `DELETE /snapshots/{id}` | `Snapshot.delete` | `204` |
//! | `POST /snapshots/{id}/fork` | `snapshot.fork` | `200 {name, snapshotId, type}` |
//!
//! Unknown sandboxes and snapshots are `404` with the `Error` body the SDKs parse (`code` the
//! number, as Python's snapshot client converts it to `int`); bad bodies are `400`; gaps
//! (application forks) `501`; all before any effect.

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use sandcove::server::auth::{Routes, SERVER_KEY};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::{bad_request, json_response, parse_json, ApiError, Wire};
use crate::errors::SandboxAPIError;
use crate::models::{SandboxForkResponse, SandboxLifecycle, SandboxSnapshot};
use crate::snapshots::{self, ForkFrom, ForkRequest};

/// The snapshot and fork routes (nested under `/v0`).
pub(crate) fn routes() -> Routes<Wire> {
    Routes::new(super::refuse)
        .route(
            Method::POST,
            "/sandboxes/{name}/snapshots",
            SERVER_KEY,
            create_of_sandbox,
        )
        .route(
            Method::GET,
            "/sandboxes/{name}/snapshots",
            SERVER_KEY,
            list_of_sandbox,
        )
        .route(
            Method::DELETE,
            "/sandboxes/{name}/snapshots/{snapshot}",
            SERVER_KEY,
            delete_of_sandbox,
        )
        .route(
            Method::POST,
            "/sandboxes/{name}/snapshots/{snapshot}/restore",
            SERVER_KEY,
            restore,
        )
        .route(
            Method::POST,
            "/sandboxes/{name}/fork",
            SERVER_KEY,
            fork_sandbox,
        )
        .route(Method::POST, "/snapshots", SERVER_KEY, create)
        .route(Method::GET, "/snapshots", SERVER_KEY, list)
        .route(Method::GET, "/snapshots/{id}", SERVER_KEY, get_snapshot)
        .route(
            Method::DELETE,
            "/snapshots/{id}",
            SERVER_KEY,
            delete_snapshot,
        )
        .route(
            Method::POST,
            "/snapshots/{id}/fork",
            SERVER_KEY,
            fork_snapshot,
        )
}

/// The `SandboxSnapshot` answer (camelCase, `workspace` the server's).
fn snapshot_json(wire: &Wire, s: &SandboxSnapshot) -> Value {
    let mut out = json!({
        "id": s.id,
        "name": s.name,
        "status": s.status,
        "createdAt": s.created_at,
        "workspace": wire.config.workspace,
        "sandboxName": s.sandbox_name,
    });
    if let Some(source) = &s.source {
        out["source"] = json!({
            "name": source.name,
            "kind": source.kind.as_deref().unwrap_or("sandbox"),
            "deleted": source.deleted.unwrap_or(false),
        });
    }
    if let Some(spec) = &s.spec {
        let mut v = Map::new();
        if let Some(image) = &spec.image {
            v.insert("image".into(), json!(image));
        }
        if let Some(memory) = spec.memory {
            v.insert("memory".into(), json!(memory));
        }
        if let Some(ports) = &spec.ports {
            v.insert("ports".into(), json!(ports));
        }
        if let Some(region) = &spec.region {
            v.insert("region".into(), json!(region));
        }
        out["spec"] = Value::Object(v);
    }
    out
}

fn fork_json(f: &SandboxForkResponse) -> Value {
    let mut out = json!({"name": f.name, "type": f.type_});
    if let Some(id) = &f.snapshot_id {
        out["snapshotId"] = json!(id);
    }
    out
}

/// A snapshot route's error: a `SandboxError` body whose `code` is the status number for
/// every status the SDKs parse (Python's snapshot client reads `int(code)`).
fn numeric(e: SandboxAPIError) -> ApiError {
    let e = match e {
        SandboxAPIError::Api {
            message,
            status_code: Some(status),
            source,
            ..
        } if status == 404 || status == 500 => SandboxAPIError::Api {
            message,
            status_code: Some(status),
            code: None,
            source,
        },
        // A `ValueError` of the request is the server's 400.
        SandboxAPIError::ValueError { message } => bad_request(message),
        other => other,
    };
    ApiError::control(e)
}

/// `POST /v0/sandboxes/{name}/snapshots` with `{name?, source?}` (the path names the source;
/// a body `source` must name the same sandbox).
async fn create_of_sandbox(
    State(wire): State<Wire>,
    Path(sandbox): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let mut body: Value = parse_json(&wire, &body).map_err(numeric)?;
    // The nested route implies the source: fill it in so one parser checks both forms.
    if let Some(obj) = body.as_object_mut() {
        match obj.get("source") {
            None | Some(Value::Null) => {
                obj.insert("source".into(), json!({ "name": sandbox }));
            }
            Some(source) if source.get("name") != Some(&json!(sandbox)) => {
                return Err(numeric(bad_request(format!(
                    "the body's source must be sandbox {sandbox:?}, the path's"
                ))))
            }
            Some(_) => {}
        }
    }
    let (source, name) = snapshots::snapshot_request(&body).map_err(numeric)?;
    let taken = snapshots::create_on(&wire.client, &source, name)
        .await
        .map_err(numeric)?;
    Ok(json_response(StatusCode::OK, &snapshot_json(&wire, &taken)))
}

/// `GET /v0/sandboxes/{name}/snapshots`: a bare array, oldest first.
async fn list_of_sandbox(
    State(wire): State<Wire>,
    Path(sandbox): Path<String>,
) -> Result<Response, ApiError> {
    let list = snapshots::list_of_sandbox_on(&wire.client, &sandbox)
        .await
        .map_err(numeric)?;
    let out: Vec<Value> = list.iter().map(|s| snapshot_json(&wire, s)).collect();
    Ok(json_response(StatusCode::OK, &json!(out)))
}

/// `DELETE /v0/sandboxes/{name}/snapshots/{id or name}`: `204`.
async fn delete_of_sandbox(
    State(wire): State<Wire>,
    Path((sandbox, snapshot)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    snapshots::delete_of_sandbox_on(&wire.client, &sandbox, &snapshot)
        .await
        .map_err(numeric)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `POST /v0/sandboxes/{name}/snapshots/{id or name}/restore`: `{name, snapshotId}`.
async fn restore(
    State(wire): State<Wire>,
    Path((sandbox, snapshot)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let restored = snapshots::restore_on(&wire.client, &sandbox, &snapshot)
        .await
        .map_err(numeric)?;
    Ok(json_response(
        StatusCode::OK,
        &json!({"name": restored.name, "snapshotId": restored.snapshot_id}),
    ))
}

/// A `SandboxForkRequest` body. Unknown keys are a 400.
fn fork_request(body: &Value) -> Result<ForkRequest, SandboxAPIError> {
    let obj = body
        .as_object()
        .ok_or_else(|| bad_request("the body must be a SandboxForkRequest object"))?;
    const KNOWN: &[&str] = &[
        "targetName",
        "targetType",
        "port",
        "traffic",
        "customDomain",
        "prefix",
        "snapshotId",
        "envs",
        "lifecycle",
    ];
    let unknown: Vec<&str> = obj
        .iter()
        .filter(|(k, v)| !v.is_null() && !KNOWN.contains(&k.as_str()))
        .map(|(k, _)| k.as_str())
        .collect();
    if !unknown.is_empty() {
        return Err(bad_request(format!(
            "unknown field(s) in SandboxForkRequest: {}",
            unknown.join(", ")
        )));
    }
    let string = |key: &str| -> Result<Option<String>, SandboxAPIError> {
        match obj.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(bad_request(format!("{key} must be a string"))),
        }
    };
    let int = |key: &str| -> Result<Option<i64>, SandboxAPIError> {
        match obj.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_i64()
                .map(Some)
                .ok_or_else(|| bad_request(format!("{key} must be an integer"))),
        }
    };
    let target_name = string("targetName")?.ok_or_else(|| bad_request("targetName is required"))?;
    let envs = match obj.get("envs") {
        None | Some(Value::Null) => Vec::new(),
        Some(v) => crate::models::from_value::<Vec<crate::models::Env>>(v.clone(), "envs")
            .map_err(|e| bad_request(e.to_string()))?,
    };
    let lifecycle = match obj.get("lifecycle") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            crate::models::from_value::<SandboxLifecycle>(v.clone(), "lifecycle")
                .map_err(|e| bad_request(e.to_string()))?,
        ),
    };
    Ok(ForkRequest {
        target_name,
        target_type: string("targetType")?.unwrap_or_else(|| "sandbox".into()),
        port: int("port")?,
        traffic: int("traffic")?,
        custom_domain: string("customDomain")?,
        prefix: string("prefix")?,
        snapshot_id: string("snapshotId")?,
        envs,
        lifecycle,
    })
}

/// `POST /v0/sandboxes/{name}/fork`: from the live sandbox, or its `snapshotId`.
async fn fork_sandbox(
    State(wire): State<Wire>,
    Path(sandbox): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let body: Value = parse_json(&wire, &body).map_err(numeric)?;
    let req = fork_request(&body).map_err(numeric)?;
    let target = req.target_name.clone();
    let made = snapshots::fork_on(&wire.client, ForkFrom::Sandbox(&sandbox), req)
        .await
        .map_err(numeric)?;
    wire.forget_deleted(&target);
    Ok(json_response(StatusCode::OK, &fork_json(&made)))
}

/// `POST /v0/snapshots` with `{name?, source: {name, kind?}}`.
async fn create(State(wire): State<Wire>, body: Bytes) -> Result<Response, ApiError> {
    let body: Value = parse_json(&wire, &body).map_err(numeric)?;
    let (source, name) = snapshots::snapshot_request(&body).map_err(numeric)?;
    let taken = snapshots::create_on(&wire.client, &source, name)
        .await
        .map_err(numeric)?;
    Ok(json_response(StatusCode::OK, &snapshot_json(&wire, &taken)))
}

#[derive(Debug, Deserialize)]
struct ListQuery {
    #[serde(default)]
    limit: Option<i64>,
    #[serde(default)]
    cursor: Option<String>,
    #[serde(default)]
    sort: Option<String>,
    #[serde(default)]
    q: Option<String>,
    #[serde(default)]
    anchor: Option<String>,
}

/// `GET /v0/snapshots?limit=&cursor=`: `{data, meta: {hasMore, nextCursor?, total}}`, oldest
/// first. Another sort, a search (`q`) or an `anchor` is a 400 (never silently ignored).
async fn list(
    State(wire): State<Wire>,
    Query(query): Query<ListQuery>,
) -> Result<Response, ApiError> {
    if !matches!(
        query.sort.as_deref(),
        None | Some("") | Some("createdAt") | Some("createdAt:asc")
    ) {
        return Err(numeric(bad_request(
            "only sort=createdAt:asc (the default) is supported",
        )));
    }
    if query.q.as_deref().is_some_and(|q| !q.is_empty())
        || query.anchor.as_deref().is_some_and(|a| !a.is_empty())
    {
        return Err(numeric(bad_request(
            "q and anchor are not supported: page with limit and cursor",
        )));
    }
    let page = snapshots::list_on(
        &wire.client,
        query.limit.unwrap_or(50),
        query.cursor.as_deref(),
    )
    .await
    .map_err(numeric)?;
    let data: Vec<Value> = page.data.iter().map(|s| snapshot_json(&wire, s)).collect();
    let mut meta = json!({"hasMore": page.has_more, "total": page.total});
    if let Some(next) = &page.next_cursor {
        meta["nextCursor"] = json!(next);
    }
    Ok(json_response(
        StatusCode::OK,
        &json!({"data": data, "meta": meta}),
    ))
}

/// `GET /v0/snapshots/{id}`.
async fn get_snapshot(
    State(wire): State<Wire>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let s = snapshots::get_on(&wire.client, &id)
        .await
        .map_err(numeric)?;
    Ok(json_response(StatusCode::OK, &snapshot_json(&wire, &s)))
}

/// `DELETE /v0/snapshots/{id}`: `204`.
async fn delete_snapshot(
    State(wire): State<Wire>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    snapshots::delete_on(&wire.client, &id)
        .await
        .map_err(numeric)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `POST /v0/snapshots/{id}/fork`: a sandbox from the snapshot, also once its source is gone.
async fn fork_snapshot(
    State(wire): State<Wire>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let body: Value = parse_json(&wire, &body).map_err(numeric)?;
    let req = fork_request(&body).map_err(numeric)?;
    let target = req.target_name.clone();
    let made = snapshots::fork_on(&wire.client, ForkFrom::Snapshot(&id), req)
        .await
        .map_err(numeric)?;
    wire.forget_deleted(&target);
    Ok(json_response(StatusCode::OK, &fork_json(&made)))
}
