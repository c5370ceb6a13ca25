//! E2B's control plane over REST: create, get, list, kill, timeout, connect/resume, pause,
//! metrics, snapshots and fork, each decided by the same functions as the Rust facade's
//! `Sandbox` methods.
//!
//! Errors are `{"code": <status>, "message": …}` with the status E2B's SDK maps to its
//! exception class: 400 → `SandboxException` (invalid arguments), 501 → `SandboxException`
//! (Sandcove's refusals, the message naming the alternative), 401 → `AuthenticationException`, 404 →
//! `SandboxNotFoundException` (or `kill() == False`), 429 → `RateLimitException`.

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use sandcove::server::auth::{Routes, SERVER_KEY};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{Wire, WIRE_ENVD_VERSION};
use crate::errors::SandboxException;
use crate::sandbox::{self, Sandbox, SandboxInfo, SandboxLifecycle, SandboxNetworkOpts};
use crate::translate::DateTime;

/// The control plane's routes.
pub(crate) fn routes() -> Routes<Wire> {
    use axum::http::Method;
    // The control plane is the operator's: the server key only, never a sandbox's token.
    Routes::new(super::refuse)
        .route(Method::POST, "/v2/sandboxes", SERVER_KEY, create)
        .route(Method::GET, "/v2/sandboxes", SERVER_KEY, list)
        .route(Method::POST, "/sandboxes", SERVER_KEY, create)
        .route(Method::GET, "/sandboxes", SERVER_KEY, list)
        // Before `/sandboxes/{id}`, which would take "metrics" for a sandbox id.
        .route(Method::GET, "/sandboxes/metrics", SERVER_KEY, list_metrics)
        .route(Method::GET, "/sandboxes/{id}", SERVER_KEY, get_info)
        .route(Method::DELETE, "/sandboxes/{id}", SERVER_KEY, kill)
        .route(
            Method::POST,
            "/sandboxes/{id}/timeout",
            SERVER_KEY,
            set_timeout,
        )
        .route(
            Method::POST,
            "/v2/sandboxes/{id}/connect",
            SERVER_KEY,
            connect,
        )
        .route(Method::POST, "/sandboxes/{id}/connect", SERVER_KEY, connect)
        .route(Method::POST, "/sandboxes/{id}/resume", SERVER_KEY, connect)
        .route(Method::POST, "/sandboxes/{id}/pause", SERVER_KEY, pause)
        .route(Method::GET, "/sandboxes/{id}/metrics", SERVER_KEY, metrics)
        .route(
            Method::POST,
            "/sandboxes/{id}/snapshots",
            SERVER_KEY,
            create_snapshot,
        )
        .route(Method::GET, "/snapshots", SERVER_KEY, list_snapshots)
        // `Sandbox.delete_snapshot(id)` deletes the template a snapshot is; every other
        // template call is the template-build API, refused by the wire's fallback.
        .method_route(
            Method::DELETE,
            "/templates/{id}",
            SERVER_KEY,
            axum::routing::delete(delete_snapshot).fallback(super::not_found),
        )
        .route(Method::POST, "/sandboxes/{id}/fork", SERVER_KEY, fork)
}

/// An E2B API error answer.
pub(crate) fn api_error(status: StatusCode, message: String) -> Response {
    let body = json!({"code": status.as_u16(), "message": message});
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        serde_json::to_vec(&body).unwrap_or_default(),
    )
        .into_response()
}

/// The one mapping from E2B's exception classes to control-plane statuses.
pub(crate) fn status_for(e: &SandboxException) -> StatusCode {
    match e {
        SandboxException::SandboxNotFound { .. }
        | SandboxException::NotFound { .. }
        | SandboxException::FileNotFound { .. } => StatusCode::NOT_FOUND,
        SandboxException::Authentication { .. } => StatusCode::UNAUTHORIZED,
        SandboxException::RateLimit { .. } => StatusCode::TOO_MANY_REQUESTS,
        SandboxException::InvalidArgument { .. } | SandboxException::Template { .. } => {
            StatusCode::BAD_REQUEST
        }
        // Neither SDK has a class of its own for a refusal: 501 is its `SandboxException`
        // ("501: not supported on Sandcove: … (instead: …)").
        SandboxException::NotSupported { .. } => StatusCode::NOT_IMPLEMENTED,
        SandboxException::Timeout { .. } => StatusCode::GATEWAY_TIMEOUT,
        SandboxException::NotEnoughSpace { .. } => StatusCode::INSUFFICIENT_STORAGE,
        // The server's policy refused (an operator-only option, the sandbox cap): E2B's
        // 403, which the SDKs raise as their `SandboxException` with the message.
        _ if matches!(e.core_error(), Some(sandcove::Error::Forbidden { .. })) => {
            StatusCode::FORBIDDEN
        }
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// A facade error as an API error answer (the status of [`status_for`]).
pub(crate) fn exception_response(e: SandboxException) -> Response {
    api_error(status_for(&e), e.to_string())
}

/// A facade error as an API error answer.
#[derive(Debug)]
struct ApiError(SandboxException);

impl<E: Into<SandboxException>> From<E> for ApiError {
    fn from(e: E) -> Self {
        ApiError(e.into())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        exception_response(self.0)
    }
}

fn bad_request(message: impl Into<String>) -> ApiError {
    ApiError(SandboxException::invalid_argument(message.into()))
}

/// Parse a JSON body (`{}` when empty; an object) in E2B's error shape. The router's body
/// limit (the listener's JSON limit) has already answered `413` to a longer body.
fn parse_json<T: serde::de::DeserializeOwned>(wire: &Wire, body: &[u8]) -> Result<T, ApiError> {
    sandcove::server::json_body::decode(body, wire.config.max_body_bytes)
        .map_err(|e| bad_request(e.to_string()))
}

/// RFC 3339 in UTC with microseconds, as E2B's API writes times.
pub(crate) fn rfc3339(unix_millis: u64) -> String {
    let (y, mo, d, h, mi, s, us) = DateTime::from_unix_millis(unix_millis).parts();
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{us:06}Z")
}

/// `NewSandbox` / `NewSandboxV2`: the body of a create.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NewSandbox {
    #[serde(rename = "templateID")]
    template_id: Option<String>,
    timeout: Option<f64>,
    auto_pause: Option<bool>,
    auto_pause_memory: Option<bool>,
    /// `{"enabled": bool}` (older SDKs: a bare bool).
    auto_resume: Option<Value>,
    #[serde(rename = "allow_internet_access", alias = "allowInternetAccess")]
    allow_internet_access: Option<bool>,
    network: Option<NetworkBody>,
    metadata: Option<BTreeMap<String, String>>,
    env_vars: Option<BTreeMap<String, String>>,
    mcp: Option<Value>,
    iam: Option<Value>,
    volume_mounts: Option<Vec<VolumeMountBody>>,
    secure: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NetworkBody {
    allow_out: Option<Vec<String>>,
    deny_out: Option<Vec<String>>,
    rules: Option<Vec<Value>>,
    egress_proxy: Option<Value>,
    allow_public_traffic: Option<bool>,
    mask_request_host: Option<String>,
    dns_servers: Option<Value>,
    https_ports: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct VolumeMountBody {
    name: String,
    path: String,
}

/// The `Sandbox` answer of create and connect; `domain` is the listener as the client
/// reached it (see `ports`), so `get_host(port)` names the listener.
fn sandbox_body(wire: &Wire, info: &sandcove::SandboxInfo, headers: &HeaderMap) -> Value {
    let template = if info.template.is_empty() {
        crate::translate::DEFAULT_TEMPLATE.to_string()
    } else {
        info.template.clone()
    };
    let token = wire.envd_token(&info.id);
    if super::is_e2b_sandbox(info) {
        wire.known.insert(&info.id, token.clone());
    }
    json!({
        "templateID": template,
        "sandboxID": info.id,
        "clientID": "sandcove",
        "envdVersion": WIRE_ENVD_VERSION,
        "envdAccessToken": token,
        "trafficAccessToken": wire.traffic_token(&info.id),
        "domain": super::ports::domain_for(headers.get(header::HOST).and_then(|h| h.to_str().ok())),
        "alias": template,
    })
}

async fn create(
    State(wire): State<Wire>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: NewSandbox = parse_json(&wire, &body)?;
    let mut builder = Sandbox::create();
    if let Some(t) = req.template_id.filter(|t| !t.is_empty()) {
        builder = builder.template(t);
    }
    if let Some(t) = req.timeout {
        builder = builder.timeout(t);
    }
    builder = builder
        .metadata(req.metadata.unwrap_or_default())
        .envs(req.env_vars.unwrap_or_default());
    if let Some(secure) = req.secure {
        builder = builder.secure(secure);
    }
    if let Some(allow) = req.allow_internet_access {
        builder = builder.allow_internet_access(allow);
    }
    if let Some(net) = req.network {
        if net.dns_servers.is_some() || net.https_ports.is_some() {
            return Err(ApiError(crate::gaps::refuse("network_rules")));
        }
        builder.traffic_checked_by_listener = true;
        builder = builder.network(SandboxNetworkOpts {
            allow_out: net.allow_out,
            deny_out: net.deny_out,
            rules: net.rules,
            egress_proxy: net.egress_proxy,
            allow_public_traffic: net.allow_public_traffic,
            mask_request_host: net.mask_request_host,
        });
    }
    let auto_resume = match req.auto_resume {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(b),
        Some(Value::Object(o)) => o.get("enabled").and_then(Value::as_bool),
        Some(other) => return Err(bad_request(format!("invalid autoResume {other}"))),
    };
    if req.auto_pause.is_some() || auto_resume.is_some() || req.auto_pause_memory.is_some() {
        builder = builder.lifecycle(SandboxLifecycle {
            on_timeout: Some(if req.auto_pause == Some(true) {
                "pause".into()
            } else {
                "kill".into()
            }),
            keep_memory: req.auto_pause_memory,
            auto_resume,
        });
    }
    if let Some(mcp) = req.mcp.filter(|v| !v.is_null()) {
        builder = builder.mcp(mcp);
    }
    if let Some(iam) = req.iam.filter(|v| !v.is_null()) {
        builder = builder.iam(iam);
    }
    if let Some(mounts) = req.volume_mounts {
        builder = builder.volume_mounts(mounts.into_iter().map(|m| (m.path, m.name)));
    }
    // The facade's own checks and translation, then the create itself.
    let options = builder.options(&wire.client).await?;
    let info = builder.create(&wire.client, options).await?;
    Ok((
        StatusCode::CREATED,
        axum::Json(sandbox_body(&wire, &info, &headers)),
    )
        .into_response())
}

/// `SandboxDetail` (get) or `ListedSandbox` (list).
fn info_body(info: &sandcove::SandboxInfo, detail: bool, wire: &Wire) -> Value {
    let e2b = SandboxInfo::from_core(info, detail);
    let mut body = json!({
        "templateID": e2b.template_id,
        "alias": e2b.name,
        "sandboxID": e2b.sandbox_id,
        "clientID": "sandcove",
        "startedAt": rfc3339(info.created_at),
        "endAt": rfc3339(info.ends_at),
        "envdVersion": WIRE_ENVD_VERSION,
        "cpuCount": e2b.cpu_count,
        "memoryMB": e2b.memory_mb,
        "diskSizeMB": 0,
        "state": e2b.state.value(),
        "metadata": e2b.metadata,
        "volumeMounts": info.volumes.iter().map(|v| json!({"name": v.volume, "path": v.path})).collect::<Vec<_>>(),
    });
    if detail {
        body["envdAccessToken"] = json!(wire.envd_token(&info.id));
        body["trafficAccessToken"] = json!(wire.traffic_token(&info.id));
        body["domain"] = Value::Null;
        body["allowInternetAccess"] = json!(e2b.allow_internet_access);
        if let Some(lc) = e2b.lifecycle {
            body["lifecycle"] = json!({"onTimeout": lc.on_timeout, "autoResume": lc.auto_resume});
        }
    }
    body
}

async fn list_metrics() -> Response {
    exception_response(crate::gaps::refuse("list_metrics"))
}

async fn get_info(
    State(wire): State<Wire>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let info = wire.client.sandbox(&id).info().await?;
    let mut body = info_body(&info, true, &wire);
    body["domain"] = json!(super::ports::domain_for(
        headers.get(header::HOST).and_then(|h| h.to_str().ok())
    ));
    Ok(axum::Json(body).into_response())
}

async fn kill(State(wire): State<Wire>, Path(id): Path<String>) -> Result<Response, ApiError> {
    if sandbox::kill(&wire.client, &id).await? {
        wire.known.forget(&id);
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(ApiError(SandboxException::SandboxNotFound {
            message: format!("Sandbox {id} not found"),
            source: None,
        }))
    }
}

#[derive(Debug, Default, Deserialize)]
struct TimeoutBody {
    timeout: Option<f64>,
}

async fn set_timeout(
    State(wire): State<Wire>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: TimeoutBody = parse_json(&wire, &body)?;
    let Some(secs) = req.timeout else {
        return Err(bad_request("timeout is required"));
    };
    sandbox::set_timeout(&wire.client, &id, Some(secs)).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Debug, Default, Deserialize)]
struct ConnectBody {
    timeout: Option<f64>,
    memory: Option<bool>,
}

async fn connect(
    State(wire): State<Wire>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: ConnectBody = parse_json(&wire, &body)?;
    // Either kind of pause resumes here (`memory` only says what the pause kept).
    let _ = req.memory;
    let info = sandbox::connect_on(&wire.client, &id, req.timeout).await?;
    Ok(axum::Json(sandbox_body(&wire, &info, &headers)).into_response())
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PauseBody {
    memory: Option<bool>,
    require_healthy_guest: Option<bool>,
}

async fn pause(
    State(wire): State<Wire>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: PauseBody = parse_json(&wire, &body)?;
    let _ = req.require_healthy_guest;
    if sandbox::pause_on(&wire.client, &id, req.memory.unwrap_or(true)).await? {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Ok(api_error(
            StatusCode::CONFLICT,
            format!("Sandbox {id} is already paused"),
        ))
    }
}

/// The query of `GET /sandboxes/{id}/metrics`: the range, in Unix seconds, inclusive.
#[derive(Debug, Default, Deserialize)]
struct MetricsQuery {
    start: Option<i64>,
    end: Option<i64>,
}

async fn metrics(
    State(wire): State<Wire>,
    Path(id): Path<String>,
    Query(range): Query<MetricsQuery>,
) -> Result<Response, ApiError> {
    // Whole seconds on E2B's wire: `end` holds every millisecond of its second.
    let range = (
        range.start.map(|s| (s.max(0) as u64).saturating_mul(1000)),
        range
            .end
            .map(|e| (e.max(0) as u64).saturating_mul(1000).saturating_add(999)),
    );
    let samples = sandbox::metrics_in_range(&wire.client, &id, range).await?;
    let body: Vec<Value> = samples
        .iter()
        .map(|m| {
            json!({
                "timestamp": rfc3339(m.timestamp.unix_millis),
                "timestampUnix": m.timestamp.unix_millis / 1000,
                "cpuCount": m.cpu_count,
                "cpuUsedPct": m.cpu_used_pct,
                "memUsed": m.mem_used,
                "memTotal": m.mem_total,
                "memCache": m.mem_cache,
                "diskUsed": m.disk_used,
                "diskTotal": m.disk_total,
            })
        })
        .collect();
    Ok(axum::Json(body).into_response())
}

/// `SandboxSnapshotRequest`.
#[derive(Debug, Default, Deserialize)]
struct SnapshotBody {
    name: Option<String>,
    /// `mode="full"` (true, the default) or `"filesystem"` (false). Sandcove's snapshots keep
    /// files, not memory, whichever is asked (MAPPING.md): both are served.
    memory: Option<bool>,
}

/// `SnapshotInfo` as E2B's API writes it.
fn snapshot_body(s: &sandbox::SnapshotInfo) -> Value {
    json!({"snapshotID": s.snapshot_id, "names": s.names})
}

async fn create_snapshot(
    State(wire): State<Wire>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: SnapshotBody = parse_json(&wire, &body)?;
    let name = req.name.filter(|n| !n.is_empty());
    let taken = sandbox::create_snapshot_of(&wire.client.sandbox(&id), name, req.memory).await?;
    Ok((StatusCode::CREATED, axum::Json(snapshot_body(&taken))).into_response())
}

/// The query of `GET /snapshots`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SnapshotQuery {
    #[serde(rename = "sandboxID")]
    sandbox_id: Option<String>,
    name: Option<String>,
    limit: Option<i64>,
    next_token: Option<String>,
}

async fn list_snapshots(
    State(wire): State<Wire>,
    Query(q): Query<SnapshotQuery>,
) -> Result<Response, ApiError> {
    let mut paginator = Sandbox::list_snapshots()
        .sandbox_id(q.sandbox_id.filter(|s| !s.is_empty()))
        .name(q.name.filter(|n| !n.is_empty()))
        .next_token(q.next_token.filter(|t| !t.is_empty()));
    if let Some(limit) = q.limit {
        paginator = paginator.limit(limit);
    }
    let page = paginator.next_items_on(&wire.client).await?;
    let items = page.iter().map(snapshot_body).collect();
    Ok(page_response(items, paginator.next_token))
}

/// A page of a list answer, the next page's token in `x-next-token` (none on the last).
fn page_response(items: Vec<Value>, next_token: Option<String>) -> Response {
    let mut response = axum::Json(Value::Array(items)).into_response();
    if let Some(v) = next_token.and_then(|t| HeaderValue::from_str(&t).ok()) {
        response.headers_mut().insert("x-next-token", v);
    }
    response
}

async fn delete_snapshot(
    State(wire): State<Wire>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    if sandbox::delete_snapshot_on(&wire.client, &id).await? {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Ok(api_error(
            StatusCode::NOT_FOUND,
            format!("Snapshot {id} not found"),
        ))
    }
}

/// `SandboxForkRequest`.
#[derive(Debug, Default, Deserialize)]
struct ForkBody {
    timeout: Option<f64>,
    count: Option<i64>,
}

/// `201 [{sandbox} | {error}]`: one entry per fork, each a `Sandbox` answer or the error that
/// fork met, as E2B answers; a source that is missing fails the whole request (404).
async fn fork(
    State(wire): State<Wire>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: ForkBody = parse_json(&wire, &body)?;
    let forks = sandbox::fork_on(&wire.client, &id, req.timeout, req.count).await?;
    let entries = forks
        .into_iter()
        .map(|made| match made {
            Ok(info) => json!({"sandbox": sandbox_body(&wire, &info, &headers)}),
            Err(e) => json!({"error": {"code": status_for(&e).as_u16(), "message": e.to_string()}}),
        })
        .collect();
    Ok((StatusCode::CREATED, axum::Json(Value::Array(entries))).into_response())
}

/// The query of `GET /v2/sandboxes`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListQuery {
    /// `k=v&k2=v2`, each key and value percent-encoded once more.
    metadata: Option<String>,
    /// Comma-separated `running`, `paused`.
    state: Option<String>,
    order: Option<String>,
    started_after: Option<String>,
    template: Option<String>,
    next_token: Option<String>,
    limit: Option<i64>,
}

fn percent_decode(s: &str) -> Result<String, ApiError> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 3 <= bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                let b = u8::from_str_radix(hex, 16)
                    .map_err(|_| bad_request(format!("invalid percent-encoding in '{s}'")))?;
                out.push(b);
                i += 3;
            }
            b'%' => return Err(bad_request(format!("invalid percent-encoding in '{s}'"))),
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| bad_request(format!("metadata '{s}' is not UTF-8")))
}

/// `metadata=` of a list: `k=v` pairs joined by `&`, each part percent-encoded.
fn parse_metadata(text: &str) -> Result<BTreeMap<String, String>, ApiError> {
    let mut out = BTreeMap::new();
    for pair in text.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        // Twice: the SDK quotes each key and value, then form-encodes the pairs.
        let k = percent_decode(&percent_decode(k)?)?;
        let v = percent_decode(&percent_decode(v)?)?;
        out.insert(k, v);
    }
    Ok(out)
}

async fn list(State(wire): State<Wire>, Query(q): Query<ListQuery>) -> Result<Response, ApiError> {
    let mut query = sandbox::SandboxQuery::default();
    if let Some(m) = q.metadata.as_deref().filter(|m| !m.is_empty()) {
        query.metadata = Some(parse_metadata(m)?);
    }
    if let Some(states) = q.state.as_deref().filter(|s| !s.is_empty()) {
        let mut parsed = Vec::new();
        for s in states.split(',') {
            parsed.push(match s.trim() {
                "running" => sandbox::SandboxState::Running,
                "paused" => sandbox::SandboxState::Paused,
                other => return Err(bad_request(format!("invalid state '{other}'"))),
            });
        }
        query.state = Some(parsed);
    }
    if let Some(text) = q.started_after.as_deref().filter(|t| !t.is_empty()) {
        // The SDK sends `datetime.isoformat()` of a tz-aware time.
        let millis = sandcove_compat_support::dates::parse_iso8601(text)
            .ok_or_else(|| bad_request(format!("invalid startedAfter '{text}'")))?;
        query.started_after = Some(crate::translate::DateTime::from_unix_millis(millis));
    }
    query.template = q.template;
    let mut paginator = Sandbox::list().query(query);
    if let Some(limit) = q.limit {
        paginator = paginator.limit(limit);
    }
    if let Some(token) = q.next_token.filter(|t| !t.is_empty()) {
        paginator = paginator.next_token(token);
    }
    if let Some(order) = q.order {
        paginator = paginator.order(order);
    }
    let page = paginator.next_core_items_on(&wire.client).await?;
    let items = page
        .iter()
        .map(|info| info_body(info, false, &wire))
        .collect();
    Ok(page_response(items, paginator.next_token))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_metadata_is_decoded_twice() {
        // urlencode({quote("a b"): quote("x&y")}) == "a%2520b=x%2526y"
        let m = parse_metadata("a%2520b=x%2526y&k=v").unwrap();
        assert_eq!(m.get("a b").map(String::as_str), Some("x&y"));
        assert_eq!(m.get("k").map(String::as_str), Some("v"));
        assert!(parse_metadata("a=%zz").is_err());
        assert!(parse_metadata("a=%2").is_err());
    }

    #[test]
    fn a_policy_refusal_is_e2bs_403() {
        let refused = SandboxException::from(sandcove::Error::Forbidden {
            what: "the host's network".into(),
        });
        assert_eq!(status_for(&refused), StatusCode::FORBIDDEN);
        let connect = super::super::connect::ConnectError::from(refused);
        assert_eq!(connect.code.http_status(), StatusCode::FORBIDDEN);
        assert_eq!(
            status_for(&SandboxException::sandbox("other")),
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }

    #[test]
    fn times_are_rfc3339_utc() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(rfc3339(1_700_000_000_123), "2023-11-14T22:13:20.123000Z");
    }
}
