//! Blaxel's control plane under `/v0`: sandboxes (create, get, list, update, delete), each
//! decided by the Rust facade's `SandboxInstance` functions.
//!
//! Sandboxes are keyed by name, as on Blaxel. Answers are the `Sandbox` model the SDKs read:
//! `status` one of Blaxel's enum values (`DEPLOYED`; `DELETING` in a delete's answer),
//! `metadata.url` absolute on this listener, `metadata.workspace` the server's workspace.

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{Method, StatusCode};
use axum::response::Response;
use sandcove::server::auth::{Routes, SERVER_KEY};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::{bad_request, json_response, parse_json, ApiError, Wire};
use crate::errors::SandboxAPIError;
use crate::models::{self, Sandbox, SandboxCreateConfiguration, SandboxLifecycle};
use crate::sandbox::{create_sandbox, list_page, SandboxInstance};
use crate::translate;

/// Largest page `GET /v0/sandboxes` returns.
const MAX_PAGE: i64 = 200;

/// The control plane's routes (nested under `/v0`).
pub(crate) fn routes() -> Routes<Wire> {
    Routes::new(super::refuse)
        .route(Method::POST, "/sandboxes", SERVER_KEY, create)
        .route(Method::GET, "/sandboxes", SERVER_KEY, list)
        .route(Method::GET, "/sandboxes/{name}", SERVER_KEY, get_sandbox)
        .route(
            Method::GET,
            "/sandboxes/by-external-id/{external_id}",
            SERVER_KEY,
            get_by_external_id,
        )
        .route(
            Method::POST,
            "/sandboxes/{name}/archive",
            SERVER_KEY,
            archive,
        )
        .route(
            Method::POST,
            "/sandboxes/{name}/unarchive",
            SERVER_KEY,
            unarchive,
        )
        .route(Method::PUT, "/sandboxes/{name}", SERVER_KEY, update)
        .route(Method::DELETE, "/sandboxes/{name}", SERVER_KEY, delete)
        .route(
            Method::GET,
            "/sandboxes/{name}/previews",
            SERVER_KEY,
            list_previews,
        )
        .route(
            Method::POST,
            "/sandboxes/{name}/previews",
            SERVER_KEY,
            create_preview,
        )
        .route(
            Method::GET,
            "/sandboxes/{name}/previews/{preview}",
            SERVER_KEY,
            get_preview,
        )
        .route(
            Method::DELETE,
            "/sandboxes/{name}/previews/{preview}",
            SERVER_KEY,
            delete_preview,
        )
        .route(
            Method::GET,
            "/sandboxes/{name}/previews/{preview}/tokens",
            SERVER_KEY,
            list_tokens,
        )
        .route(
            Method::POST,
            "/sandboxes/{name}/previews/{preview}/tokens",
            SERVER_KEY,
            create_token,
        )
        .route(
            Method::DELETE,
            "/sandboxes/{name}/previews/{preview}/tokens/{token}",
            SERVER_KEY,
            delete_token,
        )
}

/// The `Sandbox` answer for a facade sandbox record.
pub(crate) fn sandbox_json(wire: &Wire, sandbox: &Sandbox) -> Value {
    let mut sandbox = sandbox.clone();
    sandbox.metadata.url = Some(wire.sandbox_url(&sandbox.metadata.name));
    sandbox.metadata.workspace = Some(wire.config.workspace.clone());
    let mut value = serde_json::to_value(&sandbox).unwrap_or_else(|_| json!({}));
    if let Some(obj) = value.as_object_mut() {
        obj.entry("events").or_insert_with(|| json!([]));
        if sandbox.status.is_none() {
            obj.insert("status".into(), json!("DEPLOYED"));
        }
    }
    value
}

/// A JSON value with `null` read as absent.
fn present(value: Option<&Value>) -> Option<&Value> {
    value.filter(|v| !v.is_null())
}

/// Keys of `obj` outside `known` (with `null` values ignored).
fn unknown_keys<'a>(obj: &'a Map<String, Value>, known: &[&str]) -> Vec<&'a str> {
    obj.iter()
        .filter(|(k, v)| !v.is_null() && !known.contains(&k.as_str()))
        .map(|(k, _)| k.as_str())
        .collect()
}

/// Read-only `Sandbox` keys an SDK may echo back (in an update's body): ignored.
const ECHOED_TOP: &[&str] = &[
    "status",
    "state",
    "events",
    "expiresIn",
    "lastUsedAt",
    "errors",
    "h2Domain",
    "h2Session",
];
const ECHOED_METADATA: &[&str] = &[
    "createdAt",
    "updatedAt",
    "createdBy",
    "updatedBy",
    "url",
    "workspace",
    "plan",
];

/// The facade's create configuration of a wire `Sandbox` body (`{metadata, spec}`), keyed as
/// the SDKs send it. `spec.enabled` and `spec.runtime.generation` (Blaxel's VM generation) have
/// no meaning here and are accepted; any other unknown key is a 400.
pub(crate) fn create_config(body: &Value) -> Result<SandboxCreateConfiguration, SandboxAPIError> {
    let obj = body
        .as_object()
        .ok_or_else(|| bad_request("the body must be a Sandbox object"))?;
    let mut known_top = vec!["metadata", "spec"];
    known_top.extend_from_slice(ECHOED_TOP);
    reject_unknown("Sandbox", obj, &known_top)?;
    let empty = Map::new();
    let metadata = object_at(obj, "metadata")?.unwrap_or(&empty);
    let mut known_meta = vec!["name", "labels", "displayName", "externalId"];
    known_meta.extend_from_slice(ECHOED_METADATA);
    reject_unknown("metadata", metadata, &known_meta)?;
    let spec = object_at(obj, "spec")?.unwrap_or(&empty);
    reject_unknown(
        "spec",
        spec,
        &[
            "enabled",
            "region",
            "runtime",
            "volumes",
            "lifecycle",
            "network",
        ],
    )?;
    let runtime = object_at(spec, "runtime")?.unwrap_or(&empty);
    reject_unknown(
        "spec.runtime",
        runtime,
        &[
            "image",
            "memory",
            "ports",
            "envs",
            "ttl",
            "expires",
            "snapshotEnabled",
            "extraArgs",
            "generation",
        ],
    )?;
    let mut config = Map::new();
    let mut copy = |from: &Map<String, Value>, key: &str, to: &str| {
        if let Some(v) = present(from.get(key)) {
            config.insert(to.to_string(), v.clone());
        }
    };
    copy(metadata, "name", "name");
    copy(metadata, "labels", "labels");
    copy(metadata, "externalId", "externalId");
    copy(spec, "region", "region");
    copy(spec, "volumes", "volumes");
    copy(spec, "lifecycle", "lifecycle");
    copy(spec, "network", "network");
    for key in [
        "image",
        "memory",
        "ports",
        "envs",
        "ttl",
        "expires",
        "snapshotEnabled",
        "extraArgs",
    ] {
        copy(runtime, key, key);
    }
    // An empty volume list or lifecycle object is what some SDK versions send for "none".
    if config.get("volumes").is_some_and(|v| v == &json!([])) {
        config.remove("volumes");
    }
    models::from_value(Value::Object(config), "Sandbox").map_err(|e| bad_request(e.to_string()))
}

fn object_at<'a>(
    obj: &'a Map<String, Value>,
    key: &str,
) -> Result<Option<&'a Map<String, Value>>, SandboxAPIError> {
    match present(obj.get(key)) {
        None => Ok(None),
        Some(Value::Object(m)) => Ok(Some(m)),
        Some(_) => Err(bad_request(format!("{key} must be an object"))),
    }
}

fn reject_unknown(
    what: &str,
    obj: &Map<String, Value>,
    known: &[&str],
) -> Result<(), SandboxAPIError> {
    let unknown = unknown_keys(obj, known);
    if unknown.is_empty() {
        Ok(())
    } else {
        Err(bad_request(format!(
            "unknown field(s) in {what}: {}",
            unknown.join(", ")
        )))
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CreateQuery {
    #[serde(default)]
    create_if_not_exist: Option<String>,
}

/// `POST /v0/sandboxes[?createIfNotExist=true]`.
async fn create(
    State(wire): State<Wire>,
    Query(query): Query<CreateQuery>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let if_not_exist = match query.create_if_not_exist.as_deref() {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            return Err(bad_request(format!(
                "createIfNotExist must be true or false, got {other:?}"
            ))
            .into())
        }
    };
    let body: Value = parse_json(&wire, &body)?;
    let config = create_config(&body)?;
    let instance = create_sandbox(&wire.client, config, if_not_exist).await?;
    wire.forget_deleted(&instance.metadata.name);
    Ok(json_response(
        StatusCode::OK,
        &sandbox_json(&wire, &instance.sandbox),
    ))
}

/// `GET /v0/sandboxes/{name}`.
async fn get_sandbox(
    State(wire): State<Wire>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let instance = SandboxInstance::get_on(&wire.client, &name).await?;
    Ok(json_response(
        StatusCode::OK,
        &sandbox_json(&wire, &instance.sandbox),
    ))
}

/// `GET /v0/sandboxes/by-external-id/{externalId}`.
async fn get_by_external_id(
    State(wire): State<Wire>,
    Path(external_id): Path<String>,
) -> Result<Response, ApiError> {
    let instance = SandboxInstance::get_by_external_id_on(&wire.client, &external_id).await?;
    Ok(json_response(
        StatusCode::OK,
        &sandbox_json(&wire, &instance.sandbox),
    ))
}

/// `POST /v0/sandboxes/{name}/archive`: answers once archived (status `ARCHIVED`), so the
/// SDKs' wait ends at once.
async fn archive(State(wire): State<Wire>, Path(name): Path<String>) -> Result<Response, ApiError> {
    let instance = SandboxInstance::archive_on(&wire.client, &name, true).await?;
    Ok(json_response(
        StatusCode::OK,
        &sandbox_json(&wire, &instance.sandbox),
    ))
}

/// `POST /v0/sandboxes/{name}/unarchive`: answers once running again (status `DEPLOYED`).
async fn unarchive(
    State(wire): State<Wire>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let instance = SandboxInstance::archive_on(&wire.client, &name, false).await?;
    Ok(json_response(
        StatusCode::OK,
        &sandbox_json(&wire, &instance.sandbox),
    ))
}

#[derive(Debug, Deserialize)]
struct ListQuery {
    #[serde(default)]
    limit: Option<i64>,
    #[serde(default)]
    cursor: Option<String>,
    #[serde(default)]
    sort: Option<String>,
    /// Only the sandboxes created with this external id (the Python API client's
    /// `list_sandboxes(external_id=…)`).
    #[serde(default, rename = "externalId")]
    external_id: Option<String>,
}

/// `GET /v0/sandboxes?limit=&cursor=&sort=`: one page, `{data, meta: {hasMore, nextCursor}}`.
/// Oldest first by default; `sort=createdAt:desc` reverses (any other sort is a 400).
async fn list(
    State(wire): State<Wire>,
    Query(query): Query<ListQuery>,
) -> Result<Response, ApiError> {
    let descending = match query.sort.as_deref() {
        None | Some("") | Some("createdAt") | Some("createdAt:asc") => false,
        Some("createdAt:desc") => true,
        Some(other) => {
            return Err(bad_request(format!(
                "unsupported sort {other:?}: use createdAt:asc or createdAt:desc"
            ))
            .into())
        }
    };
    let limit = query.limit.unwrap_or(50);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(bad_request(format!("limit must be between 1 and {MAX_PAGE}")).into());
    }
    let page = list_page(
        &wire.client,
        limit,
        query.cursor.as_deref(),
        descending,
        query.external_id.as_deref().filter(|id| !id.is_empty()),
    )
    .await?;
    let data: Vec<Value> = page
        .data
        .iter()
        .map(|i| sandbox_json(&wire, &i.sandbox))
        .collect();
    let next = page.next_cursor;
    let mut meta = json!({ "hasMore": next.is_some() });
    if let Some(next) = next {
        meta["nextCursor"] = json!(next);
    }
    Ok(json_response(
        StatusCode::OK,
        &json!({ "data": data, "meta": meta }),
    ))
}

/// `DELETE /v0/sandboxes/{name}`: destroys the sandbox and answers its record with status
/// `DELETING`. The name is free at once; as on Blaxel, a second delete within a minute
/// answers the same record (later, or for a name never used, it is a 404).
async fn delete(State(wire): State<Wire>, Path(name): Path<String>) -> Result<Response, ApiError> {
    match SandboxInstance::delete_on(&wire.client, &name).await {
        Ok(sandbox) => {
            let answer = sandbox_json(&wire, &sandbox);
            wire.remember_deleted(&name, answer.clone());
            Ok(json_response(StatusCode::OK, &answer))
        }
        Err(e) if e.is_not_found() => match wire.recently_deleted(&name) {
            Some(answer) => Ok(json_response(StatusCode::OK, &answer)),
            None => Err(e.into()),
        },
        Err(e) => Err(e.into()),
    }
}

/// `PUT /v0/sandboxes/{name}`: the SDKs send the whole record with their change applied
/// (`updateMetadata`, `updateTtl`, `updateLifecycle`). Labels, display name, `ttl`, `expires`
/// and lifecycle change; a changed image, memory, ports, envs, volumes or region is refused
/// (fixed at creation), as is a network setting.
async fn update(
    State(wire): State<Wire>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let body: Value = parse_json(&wire, &body)?;
    if present(body.pointer("/spec/network")).is_some() {
        return Err(crate::gaps::refuse("update_network").into());
    }
    if let Some(n) = present(body.pointer("/metadata/name")).and_then(Value::as_str) {
        if n != name {
            return Err(bad_request(format!(
                "metadata.name {n:?} differs from the sandbox name {name:?} (renaming is not possible)"
            ))
            .into());
        }
    }
    let wanted = create_config(&body)?;
    let display_name = match present(body.pointer("/metadata/displayName")) {
        None => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(bad_request("metadata.displayName must be a string").into()),
    };
    let lifecycle: Option<SandboxLifecycle> = wanted.lifecycle.clone();
    if let Some(ttl) = &wanted.ttl {
        if translate::parse_duration(ttl).is_none() {
            return Err(SandboxAPIError::api(
                400,
                "INVALID_TTL",
                format!("invalid duration {ttl:?}: use e.g. 30s, 5m, 24h, 7d, 2w"),
            )
            .into());
        }
    }
    let instance = SandboxInstance::update_record(&wire.client, &name, move |record| {
        let current = &record.sandbox;
        let r = &current.spec.runtime;
        let fixed_changed = wanted.image.as_ref().is_some_and(|i| i != &r.image)
            || wanted.memory.is_some_and(|m| m != r.memory)
            || wanted.ports.as_ref().is_some_and(|p| p != &r.ports)
            || wanted.envs.as_ref().is_some_and(|e| e != &r.envs)
            || wanted
                .volumes
                .as_ref()
                .is_some_and(|v| v != &current.spec.volumes)
            || wanted
                .region
                .as_ref()
                .is_some_and(|g| Some(g) != current.spec.region.as_ref());
        if fixed_changed {
            return Err(crate::gaps::refuse("spec changes"));
        }
        if wanted
            .external_id
            .as_ref()
            .is_some_and(|id| Some(id) != current.metadata.external_id.as_ref())
        {
            return Err(bad_request(
                "metadata.externalId is fixed at creation: create a sandbox with the new one",
            ));
        }
        let lease_changed = wanted.ttl != r.ttl
            || wanted.expires != r.expires
            || lifecycle != current.spec.lifecycle;
        let sandbox = &mut record.sandbox;
        sandbox.metadata.labels = wanted.labels.unwrap_or_default();
        if display_name.is_some() {
            sandbox.metadata.display_name = display_name;
        }
        sandbox.spec.runtime.ttl = wanted.ttl;
        sandbox.spec.runtime.expires = wanted.expires;
        sandbox.spec.lifecycle = lifecycle;
        Ok(lease_changed)
    })
    .await?;
    Ok(json_response(
        StatusCode::OK,
        &sandbox_json(&wire, &instance.sandbox),
    ))
}

/// The `Preview` answer: the facade's model, with `resourceName`/`resourceType` naming the
/// sandbox (the TypeScript SDK's tokens use them) and status `DEPLOYED`.
fn preview_json(sandbox: &str, preview: &crate::previews::SandboxPreview) -> Value {
    let mut model = preview.preview.clone();
    model.metadata.resource_name = Some(sandbox.to_string());
    model.metadata.resource_type = Some("sandbox".into());
    let mut value = serde_json::to_value(&model).unwrap_or_else(|_| json!({}));
    value["status"] = json!("DEPLOYED");
    value
}

/// `GET /v0/sandboxes/{name}/previews`.
async fn list_previews(
    State(wire): State<Wire>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let instance = SandboxInstance::get_on(&wire.client, &name).await?;
    let previews = instance.previews.list().await?;
    let out: Vec<Value> = previews.iter().map(|p| preview_json(&name, p)).collect();
    Ok(json_response(StatusCode::OK, &json!(out)))
}

#[derive(Debug, Deserialize)]
struct ForceQuery {
    #[serde(default)]
    force: Option<String>,
}

/// `POST /v0/sandboxes/{name}/previews[?force=true]`: a preview that reaches the port in the
/// sandbox (`force` replaces one of the same name).
async fn create_preview(
    State(wire): State<Wire>,
    Path(name): Path<String>,
    Query(query): Query<ForceQuery>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let force = match query.force.as_deref() {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            return Err(bad_request(format!("force must be true or false, got {other:?}")).into())
        }
    };
    let mut body: Value = parse_json(&wire, &body)?;
    // The Python SDK sends the read-only `events` (`[]`) with every preview; the SDKs send
    // absent optional fields as null.
    if let Some(obj) = body.as_object_mut() {
        obj.remove("events");
        obj.remove("status");
    }
    for part in ["metadata", "spec"] {
        if let Some(obj) = body.get_mut(part).and_then(Value::as_object_mut) {
            obj.retain(|_, v| !v.is_null());
        }
    }
    let preview: crate::models::Preview =
        models::from_value(body, "Preview").map_err(|e| bad_request(e.to_string()))?;
    // Port 443 is Blaxel's own sandbox API: a preview of it is what both SDKs' sessions
    // create (`session-<ms>`, with an expiry), and that API is this listener, not a port in
    // the sandbox.
    if preview.spec.port == Some(443) {
        return Err(crate::gaps::refuse("sessions").into());
    }
    let instance = SandboxInstance::get_on(&wire.client, &name).await?;
    if force {
        match instance.previews.delete(&preview.metadata.name).await {
            Ok(_) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
    }
    let created = instance.previews.create(preview).await?;
    Ok(json_response(
        StatusCode::OK,
        &preview_json(&name, &created),
    ))
}

/// `GET /v0/sandboxes/{name}/previews/{preview}`.
async fn get_preview(
    State(wire): State<Wire>,
    Path((name, preview)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let instance = SandboxInstance::get_on(&wire.client, &name).await?;
    let p = instance.previews.get(&preview).await?;
    Ok(json_response(StatusCode::OK, &preview_json(&name, &p)))
}

/// `DELETE /v0/sandboxes/{name}/previews/{preview}`: closed at once (its URL stops
/// answering), so the answer carries no `DELETING` status to wait on.
async fn delete_preview(
    State(wire): State<Wire>,
    Path((name, preview)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let instance = SandboxInstance::get_on(&wire.client, &name).await?;
    let mut model = instance.previews.delete(&preview).await?;
    model.metadata.resource_name = Some(name);
    model.metadata.resource_type = Some("sandbox".into());
    Ok(json_response(
        StatusCode::OK,
        &serde_json::to_value(&model).unwrap_or_else(|_| json!({})),
    ))
}

#[derive(Debug, Deserialize)]
struct TokenBody {
    #[serde(default)]
    metadata: Option<Value>,
    spec: TokenSpec,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct TokenSpec {
    expires_at: String,
}

/// The `PreviewToken` answer.
fn token_json(
    wire: &Wire,
    sandbox: &str,
    preview: &str,
    token: &crate::previews::SandboxPreviewToken,
) -> Value {
    json!({
        "metadata": {
            "name": token.name,
            "previewName": preview,
            "resourceName": sandbox,
            "resourceType": "sandbox",
            "workspace": wire.config.workspace,
        },
        "spec": {"token": token.value, "expiresAt": token.expires_at, "expired": token.expired},
    })
}

/// `POST /v0/sandboxes/{name}/previews/{preview}/tokens`: `{metadata: {name}, spec:
/// {expiresAt}}` → the token in `spec.token`; an empty name (the Python SDK's) gets a
/// generated one, which `tokens.delete` takes.
async fn create_token(
    State(wire): State<Wire>,
    Path((name, preview)): Path<(String, String)>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let body: TokenBody = parse_json(&wire, &body)?;
    let token_name = match body.metadata.as_ref().and_then(|m| present(m.get("name"))) {
        None => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(bad_request("metadata.name must be a string").into()),
    };
    let instance = SandboxInstance::get_on(&wire.client, &name).await?;
    let p = instance.previews.get(&preview).await?;
    let token = p
        .tokens
        .create_named(&token_name, body.spec.expires_at.as_str())
        .await?;
    Ok(json_response(
        StatusCode::OK,
        &token_json(&wire, &name, &preview, &token),
    ))
}

/// `GET /v0/sandboxes/{name}/previews/{preview}/tokens`: every token of the preview, with
/// its value (the Python SDK's `create_if_expired` reuses one).
async fn list_tokens(
    State(wire): State<Wire>,
    Path((name, preview)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let instance = SandboxInstance::get_on(&wire.client, &name).await?;
    let p = instance.previews.get(&preview).await?;
    let tokens: Vec<Value> = p
        .tokens
        .list()
        .await?
        .iter()
        .map(|t| token_json(&wire, &name, &preview, t))
        .collect();
    Ok(json_response(StatusCode::OK, &json!(tokens)))
}

/// `DELETE /v0/sandboxes/{name}/previews/{preview}/tokens/{token}` (the token's name): the
/// token stops opening the preview before the answer leaves.
async fn delete_token(
    State(wire): State<Wire>,
    Path((name, preview, token)): Path<(String, String, String)>,
) -> Result<Response, ApiError> {
    let instance = SandboxInstance::get_on(&wire.client, &name).await?;
    let p = instance.previews.get(&preview).await?;
    let deleted = p.tokens.delete(&token).await?;
    let mut answer = token_json(&wire, &name, &preview, &deleted);
    answer["message"] = json!("Preview token deleted successfully");
    Ok(json_response(StatusCode::OK, &answer))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sdks_create_bodies_become_the_facades_configuration() {
        // What @blaxel/core 0.3.21 sends for the README's createIfNotExists.
        let ts = json!({
            "metadata": {"name": "my-sandbox", "labels": {"env": "dev"}},
            "spec": {"region": "us-pdx-1", "runtime": {
                "image": "blaxel/base-image:latest", "memory": 4096,
                "ports": [{"target": 3000, "protocol": "HTTP"}], "envs": [],
                "generation": "mk3", "ttl": "24h"}}
        });
        let c = create_config(&ts).unwrap();
        assert_eq!(c.name.as_deref(), Some("my-sandbox"));
        assert_eq!(c.region.as_deref(), Some("us-pdx-1"));
        assert_eq!(c.memory, Some(4096));
        assert_eq!(c.ttl.as_deref(), Some("24h"));
        assert_eq!(c.ports.unwrap()[0].target, 3000);
        // What blaxel 0.4.24 (Python) sends.
        let py = json!({"metadata": {"name": "n"}, "spec": {"enabled": true,
            "runtime": {"image": "blaxel/base-image:latest", "memory": 4096}}});
        assert_eq!(create_config(&py).unwrap().name.as_deref(), Some("n"));
        // Unknown keys are refused, not ignored.
        let bad = json!({"metadata": {"name": "n"}, "spec": {"runtime": {"gpu": 1}}});
        let e = create_config(&bad).unwrap_err();
        assert_eq!(e.status_code(), Some(400));
        assert!(e.to_string().contains("gpu"), "{e}");
        // The external id is kept (and looked up by).
        let c = create_config(&json!({"metadata": {"externalId": "x-1"}})).unwrap();
        assert_eq!(c.external_id.as_deref(), Some("x-1"));
    }
}
