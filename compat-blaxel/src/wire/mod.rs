//! Blaxel's wire protocol, so Blaxel's official SDKs (TypeScript `@blaxel/core`, Python
//! `blaxel`) run unchanged against Sandcove: `sandcove serve --blaxel ADDR` serves [`router`]
//! there. The TypeScript SDK is pointed at it with `BL_API_URL=http://ADDR/v0`; the Python SDK,
//! whose control-plane URL is fixed, reaches the same router through the listener's
//! intercepting proxy (requests then arrive with `Host: api.blaxel.ai`).
//!
//! | module | what |
//! |---|---|
//! | [`api`] | the control plane under `/v0` (`/v0/sandboxes…`, previews): REST + JSON |
//! | [`snapshots`] | snapshots (per sandbox and workspace-wide), restore and fork under `/v0` |
//! | [`sandbox_api`] | every sandbox's API under `/blaxel-sbx/{name}` (processes, stdin, files, `fetch` to a port) |
//! | [`uploads`] | the sandbox API's multipart uploads (files over 5 MiB) |
//!
//! Routing looks at the request path only, never at `Host`, so one router serves the plain
//! listener and the decrypted proxied requests alike. Every sandbox answer carries
//! `metadata.url` = `{base_url}/blaxel-sbx/{name}`, absolute on the plain listener: both SDKs
//! send their sandbox-API (data-plane) calls there.
//!
//! **Authorization** follows `sandcove::server::auth`: every route is declared with the
//! credentials it accepts ([`route_table`]; today the server's API key for every one), and the
//! router is built from those declarations. The listener's check reads the key sent as
//! `X-Blaxel-Authorization: Bearer KEY` (the header both SDKs build from `BL_API_KEY`) or
//! `Authorization: Bearer KEY`, compared in constant time: a wrong key is `401` with Blaxel's
//! `SandboxError` body at once; a request without one is refused by its route with the same
//! `401`, and a path no route serves answers only the key's holder — all before any effect.
//! One server is one workspace, named in [`WireConfig::workspace`]: a request whose
//! `X-Blaxel-Workspace` names another is `403` `UNAUTHORIZED_WORKSPACE`, before any effect (a
//! request without the header is accepted). The intercepting proxy's `CONNECT` reads no
//! credential and opens a tunnel only; each request inside it goes through this router and
//! its checks ([`PROXY_ROUTE`]).
//!
//! **Translation** is the Rust facade's: each handler calls the same `SandboxInstance` /
//! `process` / `fs` functions a Rust program calls, and errors leave through one mapping
//! ([`ApiError`]) from [`SandboxAPIError`] to Blaxel's error bodies.

pub mod api;
pub mod sandbox_api;
pub mod snapshots;
pub mod uploads;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use sandcove::server::auth::{keys_match, Credential, Principal, Refusal, RouteAuth, Routes};
use sandcove::{Backend, Client};
use serde_json::{json, Value};

use crate::errors::SandboxAPIError;

/// The path prefix of every sandbox's data plane on this listener (`metadata.url`).
pub const DATA_PLANE_PREFIX: &str = "/blaxel-sbx";

/// [`WireConfig::max_upload_bytes`] unless configured otherwise: 4 GiB, what
/// `sandcove serve --max-upload-bytes` defaults to.
pub const DEFAULT_MAX_UPLOAD_BYTES: u64 = 4 * 1024 * 1024 * 1024;

/// [`WireConfig::max_inline_file_bytes`] unless configured otherwise: 64 MiB.
pub const DEFAULT_MAX_INLINE_FILE_BYTES: usize = 64 * 1024 * 1024;

/// Settings of the Blaxel listener.
#[derive(Clone)]
pub struct WireConfig {
    /// The server's API key: `X-Blaxel-Authorization: Bearer` (or `Authorization: Bearer`)
    /// must carry it.
    pub api_key: String,
    /// This listener's plain-HTTP origin as clients reach it (`http://127.0.0.1:3002`): the
    /// base of the absolute `metadata.url` every sandbox answer carries.
    pub base_url: String,
    /// The workspace name reported in answers (`metadata.workspace`).
    pub workspace: String,
    /// Largest JSON request body, in bytes.
    pub max_body_bytes: usize,
    /// Largest file upload, in bytes: one request, or one multipart upload's parts together
    /// (each part as large as the SDK makes it, 5 MiB). Uploads stream into the sandbox, so
    /// this bounds the sandbox's disk, not memory (`sandcove serve --max-upload-bytes`).
    pub max_upload_bytes: u64,
    /// Largest file read into a JSON answer (`GET …/filesystem/{path}` without
    /// `Accept: application/octet-stream`, whose `content` carries the whole file), in bytes:
    /// the one file body this listener holds in memory. Raw reads stream and are not bounded.
    pub max_inline_file_bytes: usize,
    /// The memory uploads may hold, shared with the server's other listeners when they are
    /// given clones of one budget (see `sandcove_compat_support::multipart`).
    pub upload_memory: sandcove_compat_support::multipart::UploadBudget,
    /// The quiet period after which a sandbox goes to standby ([`crate::standby`]); `None`
    /// keeps sandboxes running until their lease ends (activity still renews `ttl-idle`
    /// leases).
    pub standby_after: Option<std::time::Duration>,
}

impl WireConfig {
    /// Defaults: workspace `sandcove`, 1 MiB JSON bodies, 4 GiB uploads, 64 MiB files in a
    /// JSON answer, a budget of its own for upload memory, standby after Blaxel's quiet period ([`crate::standby::DEFAULT_STANDBY_AFTER`]).
    pub fn new(api_key: impl Into<String>, base_url: impl Into<String>) -> Self {
        WireConfig {
            api_key: api_key.into(),
            base_url: base_url.into().trim_end_matches('/').to_string(),
            workspace: "sandcove".into(),
            max_body_bytes: 1024 * 1024,
            max_upload_bytes: DEFAULT_MAX_UPLOAD_BYTES,
            max_inline_file_bytes: DEFAULT_MAX_INLINE_FILE_BYTES,
            upload_memory: Default::default(),
            standby_after: Some(crate::standby::DEFAULT_STANDBY_AFTER),
        }
    }
}

impl std::fmt::Debug for WireConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The API key is deliberately left out.
        f.debug_struct("WireConfig")
            .field("base_url", &self.base_url)
            .field("workspace", &self.workspace)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("max_upload_bytes", &self.max_upload_bytes)
            .field("max_inline_file_bytes", &self.max_inline_file_bytes)
            .field("upload_memory", &self.upload_memory)
            .finish_non_exhaustive()
    }
}

/// How many deleted sandboxes are remembered, and for how long: Blaxel answers a second
/// delete of a sandbox it is still deleting with its record, and the TypeScript README
/// deletes the same sandbox twice (by name, then through the instance).
const DELETED_KEPT: usize = 256;
const DELETED_FOR: std::time::Duration = std::time::Duration::from_secs(60);

/// What every handler gets.
#[derive(Clone)]
pub(crate) struct Wire {
    pub client: Client,
    pub config: Arc<WireConfig>,
    /// Records of recently deleted sandboxes (name, answer, when), newest last; bounded.
    pub deleted:
        Arc<std::sync::Mutex<std::collections::VecDeque<(String, Value, std::time::Instant)>>>,
    /// Multipart uploads in flight.
    pub uploads: Arc<std::sync::Mutex<uploads::Uploads>>,
}

impl Wire {
    /// Remember the delete answer of sandbox `name`.
    pub fn remember_deleted(&self, name: &str, answer: Value) {
        let mut deleted = self.deleted.lock().unwrap_or_else(|e| e.into_inner());
        deleted.retain(|(n, _, _)| n != name);
        if deleted.len() >= DELETED_KEPT {
            deleted.pop_front();
        }
        deleted.push_back((name.to_string(), answer, std::time::Instant::now()));
    }

    /// The delete answer of sandbox `name` if it was deleted within the last minute.
    pub fn recently_deleted(&self, name: &str) -> Option<Value> {
        let mut deleted = self.deleted.lock().unwrap_or_else(|e| e.into_inner());
        deleted.retain(|(_, _, at)| at.elapsed() < DELETED_FOR);
        deleted
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, v, _)| v.clone())
    }

    /// Forget `name` (a sandbox of that name exists again).
    pub fn forget_deleted(&self, name: &str) {
        self.deleted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(n, _, _)| n != name);
    }

    /// `metadata.url` of sandbox `name`: absolute, on this listener.
    pub fn sandbox_url(&self, name: &str) -> String {
        format!("{}{DATA_PLANE_PREFIX}/{name}", self.config.base_url)
    }
}

/// Blaxel's wire API over `backend`, ready to serve (the caller provides the listener, the
/// connection cap and head timeouts: `sandcove::server::serve_router`, or the intercepting
/// proxy in front of it). Routes on the request path only.
pub fn router(backend: Arc<dyn Backend>, config: WireConfig) -> Router {
    // Upload bodies are read as streams, bounded by their handlers; this bounds what an
    // extractor buffers (JSON bodies, the largest of which is a text file's `content`).
    let body_limit = config.max_body_bytes.max(config.max_inline_file_bytes);
    let wire = Wire {
        client: Client::new(crate::standby::wrap(backend, config.standby_after)),
        config: Arc::new(config),
        deleted: Default::default(),
        uploads: Default::default(),
    };
    let inner = routes()
        .into_parts()
        .0
        .fallback(not_found)
        .with_state(wire.clone())
        .layer(axum::extract::DefaultBodyLimit::max(body_limit))
        .layer(middleware::from_fn_with_state(wire, authenticate));
    // The SDKs join `metadata.url` and absolute sandbox paths into `…/filesystem//etc`:
    // repeated slashes collapse before routing (the inner router is the outer one's
    // fallback, so the outer layer runs first).
    Router::new()
        .fallback_service(inner)
        .layer(middleware::from_fn(collapse_slashes))
}

/// The declared routes of the listener, its table with them.
fn routes() -> Routes<Wire> {
    Routes::new(refuse)
        .nest("/v0", api::routes().merge(snapshots::routes()))
        .nest(
            &format!("{DATA_PLANE_PREFIX}/{{name}}"),
            sandbox_api::routes(),
        )
        .declare(Some(Method::CONNECT), PROXY_ROUTE, PROXY_ACCEPTS)
}

/// How the intercepting proxy's `CONNECT` (served before routing, by
/// `sandcove::server::serve_router_intercepting`) appears in the authorization table.
pub const PROXY_ROUTE: &str = "<a Blaxel API host>:443 (a TLS tunnel only: each request \
                               inside it is one of the routes above, with its check)";

/// What a `CONNECT` accepts: no credential (the proxy reads none; a tunnel opens only to the
/// hosts the SDKs hard-code, and what goes through it is checked as on the plain listener).
const PROXY_ACCEPTS: &[Principal] = &[Principal::Anonymous];

/// The Blaxel listener's authorization table: every route it serves, the intercepting
/// proxy's `CONNECT` included, with the credentials each accepts.
pub fn route_table() -> Vec<RouteAuth> {
    routes().into_parts().1
}

/// A route's refusal, in Blaxel's `SandboxError` shape.
fn refuse(_: &RouteAuth, refusal: Refusal) -> Response {
    match refusal {
        Refusal::Unauthenticated => unauthorized(),
        Refusal::Forbidden => sandbox_error(
            StatusCode::FORBIDDEN,
            "FORBIDDEN",
            "Forbidden: this call needs the server's API key (BL_API_KEY, sent as \
             X-Blaxel-Authorization: Bearer)",
        ),
    }
}

/// `401` for a missing or wrong key.
fn unauthorized() -> Response {
    let mut response = sandbox_error(
        StatusCode::UNAUTHORIZED,
        "UNAUTHORIZED",
        "Unauthorized: the API key (BL_API_KEY, sent as X-Blaxel-Authorization: Bearer) \
         must be the server's SANDCOVE_API_KEY",
    );
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

/// The data plane's routes whose last part is a sandbox path the SDKs put into the URL as
/// the caller gave it: `…/filesystem//abs` names `/abs`, `…/filesystem/rel` a relative path.
const PATH_ROUTES: &[&str] = &[
    "/filesystem/tree/",
    "/filesystem-multipart/initiate/",
    "/filesystem-content-search/",
    "/filesystem-search/",
    "/filesystem-find/",
    "/watch/filesystem/",
    "/filesystem/",
];

/// `a//b///c` → `a/b/c`, except that the leading slash of a data-plane sandbox path (see
/// [`PATH_ROUTES`]) is kept as `%2F`, so an absolute path stays told apart from a relative
/// one.
fn collapse(path: &str) -> String {
    if let Some(rest) = path.strip_prefix(DATA_PLANE_PREFIX) {
        // `/{name}` then the route.
        let name_end = rest[1.min(rest.len())..]
            .find('/')
            .map_or(rest.len(), |i| i + 1);
        let (name, route) = rest.split_at(name_end);
        for prefix in PATH_ROUTES {
            if let Some(wildcard) = route.strip_prefix(prefix) {
                if wildcard.starts_with('/') {
                    return format!(
                        "{}{}{}%2F{}",
                        DATA_PLANE_PREFIX,
                        collapse_runs(name),
                        prefix,
                        collapse_runs(wildcard.trim_start_matches('/'))
                    );
                }
                break;
            }
        }
    }
    collapse_runs(path)
}

/// `a//b///c` → `a/b/c`.
fn collapse_runs(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    let mut last_slash = false;
    for c in path.chars() {
        if c == '/' {
            if last_slash {
                continue;
            }
            last_slash = true;
        } else {
            last_slash = false;
        }
        out.push(c);
    }
    out
}

async fn collapse_slashes(mut request: Request, next: Next) -> Response {
    let uri = request.uri();
    if uri.path().contains("//") {
        let mut target = collapse(uri.path());
        if let Some(q) = uri.query() {
            target.push('?');
            target.push_str(q);
        }
        match target.parse::<Uri>() {
            Ok(uri) => *request.uri_mut() = uri,
            Err(_) => return sandbox_error(StatusCode::BAD_REQUEST, "BAD_REQUEST", "invalid path"),
        }
    }
    next.run(request).await
}

async fn not_found(request: Request) -> Response {
    // Unknown paths answer only the server's key (nothing about what exists leaks to others).
    if request
        .extensions()
        .get::<Credential>()
        .map(|c| c.principal)
        != Some(Principal::ServerKey)
    {
        return unauthorized();
    }
    // Its body is left unread: the server's connection loop reads it (bounded) before the
    // answer leaves, so a client reusing the connection is not cut off.
    refusal_of(request.method(), request.uri().path())
}

/// The answer to a path this listener does not serve.
fn refusal_of(method: &axum::http::Method, path: &str) -> Response {
    let path = path.to_string();
    if let Some(feature) = gap_of_path(&path) {
        return ApiError::control(crate::gaps::refuse(feature)).into_response();
    }
    if path.starts_with("/v0/") || path.starts_with(DATA_PLANE_PREFIX) {
        return sandbox_error(
            StatusCode::NOT_IMPLEMENTED,
            "NOT_SUPPORTED",
            &format!(
                "{} {path} is not served over Blaxel's wire protocol by Sandcove (see \
                 MAPPING.md); instead use the sandbox calls (create, get, list, update, delete, \
                 previews, snapshots, fork), processes and files",
                method
            ),
        );
    }
    sandbox_error(
        StatusCode::NOT_FOUND,
        "NOT_FOUND",
        &format!("{} {path} does not exist here", method),
    )
}

/// The facade's gap (see `gaps`) a Blaxel path belongs to, for paths this listener does not
/// serve: the SDK then raises its own error with the facade's alternative.
fn gap_of_path(path: &str) -> Option<&'static str> {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let gap = match segments.as_slice() {
        ["v0", "sandboxes", _, "schedules", ..]
        | ["v0", "sandboxes", _, "schedule-executions", ..] => "schedules",
        ["v0", "drives", ..] => "drives",
        ["blaxel-sbx", _, "codegen", ..] => "codegen",
        ["blaxel-sbx", _, "drives", ..] => "drives",
        ["blaxel-sbx", _, "upgrade", ..] => "system.upgrade",
        _ => return None,
    };
    Some(gap)
}

/// The bearer token of a request: `X-Blaxel-Authorization` first (what the SDKs send), else
/// `Authorization`.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers
        .get("x-blaxel-authorization")
        .or_else(|| headers.get(header::AUTHORIZATION))?
        .to_str()
        .ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// The listener's credential check: a key that is presented is verified (a wrong one is
/// refused here, `401`) and recorded as the request's [`Credential`], and the workspace it
/// names checked; each route's own check then decides.
async fn authenticate(State(wire): State<Wire>, mut request: Request, next: Next) -> Response {
    let headers = request.headers();
    if !(headers.contains_key("x-blaxel-authorization")
        || headers.contains_key(header::AUTHORIZATION))
    {
        request.extensions_mut().insert(Credential::anonymous());
        return next.run(request).await;
    }
    let key = bearer(headers).unwrap_or("");
    if !keys_match(key.as_bytes(), wire.config.api_key.as_bytes()) {
        return unauthorized();
    }
    if let Err(sent) = check_workspace(request.headers(), &wire.config.workspace) {
        return sandbox_error(
            StatusCode::FORBIDDEN,
            "UNAUTHORIZED_WORKSPACE",
            &format!(
                "Forbidden: this key is for workspace {:?}, not {sent:?} (BL_WORKSPACE, sent as \
                 X-Blaxel-Workspace; `sandcove env blaxel` prints the right one)",
                wire.config.workspace
            ),
        );
    }
    request.extensions_mut().insert(Credential::server_key());
    next.run(request).await
}

/// `X-Blaxel-Workspace`, when a request names one, must be the server's workspace: a program
/// configured for another workspace is refused instead of acting on this one. An absent or
/// empty header (the TypeScript SDK sends `""` without `BL_WORKSPACE`) is accepted. The
/// error carries what was sent, lossily decoded.
fn check_workspace(headers: &HeaderMap, workspace: &str) -> Result<(), String> {
    let Some(value) = headers.get("x-blaxel-workspace") else {
        return Ok(());
    };
    let sent = value.as_bytes();
    if sent.is_empty() || sent == workspace.as_bytes() {
        return Ok(());
    }
    Err(String::from_utf8_lossy(sent).chars().take(100).collect())
}

/// A JSON answer.
pub(crate) fn json_response(status: StatusCode, body: &Value) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body.to_string(),
    )
        .into_response()
}

/// Blaxel's control-plane `SandboxError` body: `{"code", "message"}` (required by the Python
/// SDK's model), plus the numeric `status` the TypeScript SDK tests (`e.status === 404`),
/// `status_code`, and `error` (the message, as the sandbox API words its errors).
pub(crate) fn sandbox_error(status: StatusCode, code: impl Into<Value>, message: &str) -> Response {
    json_response(
        status,
        &json!({
            "code": code.into(),
            "message": message,
            "error": message,
            "status": status.as_u16(),
            "status_code": status.as_u16(),
        }),
    )
}

/// A facade error on its way out. Control-plane calls answer `SandboxError` bodies;
/// sandbox-API (data-plane) calls answer `{"error": message}`, as Blaxel's sandbox API does.
#[derive(Debug)]
pub struct ApiError {
    /// The facade's error.
    pub error: SandboxAPIError,
    /// Whether it leaves a data-plane call.
    pub data_plane: bool,
}

impl ApiError {
    /// An error of a control-plane call.
    pub fn control(error: SandboxAPIError) -> Self {
        ApiError {
            error,
            data_plane: false,
        }
    }

    /// An error of a sandbox-API call.
    pub fn data(error: SandboxAPIError) -> Self {
        ApiError {
            error,
            data_plane: true,
        }
    }
}

impl From<SandboxAPIError> for ApiError {
    fn from(e: SandboxAPIError) -> Self {
        ApiError::control(e)
    }
}

/// The one mapping from the facade's errors to HTTP statuses: the status the SDKs map back
/// to the same outcome (404 → not found, 409 → already exists, …).
pub fn status_for(e: &SandboxAPIError) -> StatusCode {
    if let Some(status) = e
        .status_code()
        .and_then(|s| u16::try_from(s).ok())
        .and_then(|s| StatusCode::from_u16(s).ok())
    {
        return status;
    }
    match e {
        SandboxAPIError::ValueError { .. } => StatusCode::BAD_REQUEST,
        SandboxAPIError::NotSupported { .. } => StatusCode::NOT_IMPLEMENTED,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// Blaxel's error code for `e` (`SANDBOX_ALREADY_EXISTS`, `NOT_SUPPORTED`, …); the status
/// as a number where there is no better one, and always for a 404: the TypeScript SDK
/// recognises a missing sandbox or preview by `code === 404`.
fn code_for(e: &SandboxAPIError, status: StatusCode) -> Value {
    match e {
        SandboxAPIError::NotSupported { .. } => json!("NOT_SUPPORTED"),
        SandboxAPIError::ValueError { .. } => json!("VALIDATION_ERROR"),
        _ => match e.code() {
            Some(code) if status != StatusCode::NOT_FOUND => json!(code),
            _ => json!(status.as_u16()),
        },
    }
}

/// The message of `e` as a body carries it.
fn message_of(e: &SandboxAPIError) -> String {
    match e {
        SandboxAPIError::Response(r) => r.message().to_string(),
        other => other.to_string(),
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = status_for(&self.error);
        let message = message_of(&self.error);
        if self.data_plane {
            return json_response(status, &json!({ "error": message }));
        }
        sandbox_error(status, code_for(&self.error, status), &message)
    }
}

/// A 400 for a malformed request.
pub(crate) fn bad_request(message: impl Into<String>) -> SandboxAPIError {
    SandboxAPIError::api(400, "BAD_REQUEST", message)
}

/// Parse a JSON body (`{}` when empty; an object) of at most `wire`'s JSON limit (the
/// router's own limit is the larger one of a text file's write), refused in Blaxel's error
/// shape.
pub(crate) fn parse_json<T: serde::de::DeserializeOwned>(
    wire: &Wire,
    body: &[u8],
) -> Result<T, SandboxAPIError> {
    parse_json_within(body, wire.config.max_body_bytes)
}

/// [`parse_json`] with a limit of its own.
pub(crate) fn parse_json_within<T: serde::de::DeserializeOwned>(
    body: &[u8],
    limit: usize,
) -> Result<T, SandboxAPIError> {
    use sandcove::server::json_body::{decode, JsonBodyError};
    decode(body, limit).map_err(|e| match e {
        JsonBodyError::TooLarge { .. } => {
            SandboxAPIError::api(413, "PAYLOAD_TOO_LARGE", e.to_string())
        }
        JsonBodyError::Malformed(_) => bad_request(e.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_maps_to_the_status_the_sdk_maps_back() {
        let table: Vec<(SandboxAPIError, u16, Value)> = vec![
            (
                SandboxAPIError::api(404, "Sandbox not found", "Sandbox x not found"),
                404,
                json!(404),
            ),
            (
                SandboxAPIError::api(409, "SANDBOX_ALREADY_EXISTS", "exists"),
                409,
                json!("SANDBOX_ALREADY_EXISTS"),
            ),
            (
                SandboxAPIError::value_error("bad"),
                400,
                json!("VALIDATION_ERROR"),
            ),
            (crate::gaps::refuse("sessions"), 501, json!("NOT_SUPPORTED")),
            (SandboxAPIError::response(504, "slow"), 504, json!(504)),
            (
                SandboxAPIError::from(sandcove::Error::not_found("file \"/x\"")),
                404,
                json!(404),
            ),
            (SandboxAPIError::exception("boom"), 500, json!(500)),
        ];
        for (e, status, code) in table {
            let s = status_for(&e);
            assert_eq!(s.as_u16(), status, "{e:?}");
            assert_eq!(code_for(&e, s), code, "{e:?}");
        }
    }

    #[test]
    fn repeated_slashes_collapse() {
        // An absolute sandbox path keeps its leading slash, encoded; a relative one has none.
        assert_eq!(
            collapse("/blaxel-sbx/a/filesystem//app//x.json"),
            "/blaxel-sbx/a/filesystem/%2Fapp/x.json"
        );
        assert_eq!(
            collapse("/blaxel-sbx/a/watch/filesystem///tmp"),
            "/blaxel-sbx/a/watch/filesystem/%2Ftmp"
        );
        assert_eq!(
            collapse("/blaxel-sbx/a/filesystem/rel//x"),
            "/blaxel-sbx/a/filesystem/rel/x"
        );
        assert_eq!(collapse("//v0///sandboxes"), "/v0/sandboxes");
        assert_eq!(collapse("/v0/sandboxes"), "/v0/sandboxes");
    }

    #[test]
    fn bearer_tokens_are_parsed_strictly() {
        let mut h = HeaderMap::new();
        assert_eq!(bearer(&h), None);
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer k1"));
        assert_eq!(bearer(&h), Some("k1"));
        h.insert(
            "x-blaxel-authorization",
            HeaderValue::from_static("Bearer k2"),
        );
        assert_eq!(bearer(&h), Some("k2"), "the Blaxel header wins");
        h.insert("x-blaxel-authorization", HeaderValue::from_static("k2"));
        assert_eq!(bearer(&h), None);
    }

    #[test]
    fn only_the_servers_workspace_or_none_is_accepted() {
        let mut h = HeaderMap::new();
        assert_eq!(check_workspace(&h, "sandcove"), Ok(()), "no header");
        h.insert("x-blaxel-workspace", HeaderValue::from_static(""));
        assert_eq!(check_workspace(&h, "sandcove"), Ok(()), "empty header");
        h.insert("x-blaxel-workspace", HeaderValue::from_static("sandcove"));
        assert_eq!(check_workspace(&h, "sandcove"), Ok(()));
        h.insert("x-blaxel-workspace", HeaderValue::from_static("other"));
        assert_eq!(check_workspace(&h, "sandcove"), Err("other".into()));
        h.insert("x-blaxel-workspace", HeaderValue::from_static("Sandcove"));
        assert!(check_workspace(&h, "sandcove").is_err(), "names are exact");
    }

    #[test]
    fn paths_not_served_name_their_gap() {
        for (path, gap) in [
            ("/v0/sandboxes/a/schedules", Some("schedules")),
            ("/v0/sandboxes/a/fork", None),
            ("/v0/sandboxes/a/archive", None),
            ("/blaxel-sbx/a/codegen/fastapply/x", Some("codegen")),
            ("/v0/sandboxes/a", None),
        ] {
            assert_eq!(gap_of_path(path), gap, "{path}");
            if let Some(g) = gap {
                assert!(crate::gaps::GAPS.iter().any(|x| x.key == g), "{g}");
            }
        }
    }
}
