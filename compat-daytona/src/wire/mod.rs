//! Daytona's wire protocol, so Daytona's official SDKs (Python `daytona`, TypeScript
//! `@daytonaio/sdk`) run unchanged against Sandcove: `sandcove serve --daytona ADDR` serves
//! [`router`] there, and the SDK is pointed at it with `DAYTONA_API_URL=http://ADDR/api`.
//!
//! | module | what |
//! |---|---|
//! | [`api`] | the control plane under `/api` (`/api/sandbox…`): REST + JSON |
//! | [`toolbox`] | the in-sandbox API under `/toolbox/{id}/…` (process, files, git) |
//! | [`pty`] | PTY sessions under `/toolbox/{id}/process/pty…` (WebSocket + REST) |
//! | `ws` | the WebSocket server side the sockets share (`tokio-tungstenite`, its bounds) |
//!
//! One listener serves both planes: every sandbox answer carries `toolboxProxyUrl` =
//! `{base_url}/toolbox`, absolute on this same listener, and the SDK sends every toolbox
//! call to `{toolboxProxyUrl}/{sandboxId}/…`. The SDK's Socket.IO endpoint
//! (`/api/socket.io/`, see `events`) accepts the SDK's connection and sends no events: every
//! call here returns only once the engine has finished (a create answers `started`), so the
//! SDK's first poll of `GET /api/sandbox/{id}` in any wait already sees the final state.
//!
//! **Authorization** follows `sandcove::server::auth`: every route is declared with the
//! credentials it accepts ([`route_table`]; the server's API key for every one but the
//! pre-signed file URLs of `file_urls`, which take their signature), and the router is built
//! from those declarations. The listener's check reads the key the SDKs send
//! as `Authorization: Bearer KEY` (built from `DAYTONA_API_KEY`, compared in constant time):
//! a wrong key is `401 {"statusCode":401,…}` at once, which the SDK raises as
//! `DaytonaAuthenticationError`; a request without one reaches only routes that accept no
//! credential (none do) and is refused by the route with the same `401`. A path no route
//! serves answers only the key's holder. The event socket takes the key in its Socket.IO
//! handshake instead, checked there against its own declaration.
//!
//! **Translation** is the Rust facade's: each handler calls the same `Daytona` / `Sandbox`
//! / `process` / `fs` functions a Rust program calls, and errors leave through one mapping
//! ([`ApiError`]) from [`DaytonaError`] to Daytona's `{"statusCode","message","error"}`
//! with the status the SDK maps to the same exception class.

pub mod api;
mod events;
mod file_urls;
pub mod pty;
pub mod toolbox;
mod ws;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use sandcove::server::auth::{
    keys_match, Credential, Principal, Refusal, RouteAuth, Routes, SERVER_KEY,
};
use sandcove::{Backend, Client};
use serde_json::json;

use crate::{Daytona, DaytonaConfig, DaytonaError};

/// Settings of the Daytona listener.
#[derive(Clone)]
pub struct WireConfig {
    /// The server's API key: `Authorization: Bearer` must carry it.
    pub api_key: String,
    /// This listener's origin as clients reach it (`http://127.0.0.1:3001`): the base of
    /// the absolute `toolboxProxyUrl` every sandbox answer carries.
    pub base_url: String,
    /// Largest JSON request body, in bytes.
    pub max_body_bytes: usize,
    /// Largest file upload (one multipart request, streamed into the sandbox), and
    /// largest download (held in memory to be framed), in bytes.
    pub max_upload_bytes: usize,
    /// The memory uploads may hold, shared with the server's other listeners when they are
    /// given clones of one budget (see `sandcove_compat_support::multipart`).
    pub upload_memory: sandcove_compat_support::multipart::UploadBudget,
    /// How long the SDKs' event socket (`/api/socket.io/`, opened before the key is known)
    /// may take from its request to an authenticated Socket.IO `CONNECT`; then it is
    /// closed, whatever the client sends.
    pub pre_auth_timeout: std::time::Duration,
}

impl WireConfig {
    /// Defaults: 1 MiB JSON bodies, 64 MiB uploads, a budget of its own for upload memory,
    /// 10 s to authenticate the event socket.
    pub fn new(api_key: impl Into<String>, base_url: impl Into<String>) -> Self {
        WireConfig {
            api_key: api_key.into(),
            base_url: base_url.into().trim_end_matches('/').to_string(),
            max_body_bytes: 1024 * 1024,
            max_upload_bytes: 64 * 1024 * 1024,
            upload_memory: Default::default(),
            pre_auth_timeout: events::HANDSHAKE_TIMEOUT,
        }
    }
}

impl std::fmt::Debug for WireConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The API key is deliberately left out.
        f.debug_struct("WireConfig")
            .field("base_url", &self.base_url)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("max_upload_bytes", &self.max_upload_bytes)
            .field("upload_memory", &self.upload_memory)
            .field("pre_auth_timeout", &self.pre_auth_timeout)
            .finish_non_exhaustive()
    }
}

/// What every handler gets.
#[derive(Clone)]
pub(crate) struct Wire {
    pub client: Client,
    pub config: Arc<WireConfig>,
    /// Terminal sizes of the PTY sessions this listener made.
    pub ptys: Arc<pty::Sizes>,
}

impl Wire {
    /// The facade, as a Rust program would hold it (no `DAYTONA_*` variables are read: the
    /// server's own environment is not the caller's configuration).
    pub fn daytona(&self) -> Daytona {
        Daytona::with_client(self.client.clone(), DaytonaConfig::default())
    }

    /// The facade with the create call's `target`, which the facade reports back.
    pub fn daytona_with_target(&self, target: Option<String>) -> Daytona {
        let config = DaytonaConfig {
            target,
            ..Default::default()
        };
        Daytona::with_client(self.client.clone(), config)
    }

    /// `toolboxProxyUrl`: absolute, on this listener.
    pub fn toolbox_url(&self) -> String {
        format!("{}/toolbox", self.config.base_url)
    }
}

/// Daytona's wire API over `backend`, ready to serve (the caller provides the listener, the
/// connection cap and head timeouts: `sandcove::server::serve_router`).
pub fn router(backend: Arc<dyn Backend>, config: WireConfig) -> Router {
    let body_limit = config.max_body_bytes.max(config.max_upload_bytes);
    let wire = Wire {
        client: Client::new(backend),
        config: Arc::new(config),
        ptys: Arc::default(),
    };
    routes()
        .into_parts()
        .0
        .fallback(not_found)
        .with_state(wire.clone())
        .layer(axum::extract::DefaultBodyLimit::max(body_limit))
        .layer(middleware::from_fn_with_state(wire, authenticate))
}

/// The declared routes of the listener, its table with them.
fn routes() -> Routes<Wire> {
    let socket = event_socket_route();
    Routes::new(refuse)
        .nest("/api", api::routes())
        .declare(socket.method, &socket.path, socket.accepts)
        .nest("/toolbox/{id}", toolbox::routes().merge(pty::routes()))
}

/// How the SDKs' event socket appears in the authorization table: it is served before
/// routing (see `authenticate`), and the credential it accepts arrives in the Socket.IO
/// `CONNECT` packet, where the socket checks it against its declaration (`event_socket_route`).
pub const EVENT_SOCKET_ROUTE: &str =
    "/api/socket.io/ (WebSocket; the key in Socket.IO's CONNECT packet)";

/// What the event socket's handshake accepts: the server's key.
const EVENT_SOCKET_ACCEPTS: &[Principal] = SERVER_KEY;

/// The event socket's declaration, as its handshake applies it.
fn event_socket_route() -> RouteAuth {
    RouteAuth {
        method: Some(Method::GET),
        path: EVENT_SOCKET_ROUTE.into(),
        accepts: EVENT_SOCKET_ACCEPTS,
    }
}

/// The Daytona listener's authorization table: every route it serves, the event socket
/// included, with the credentials each accepts.
pub fn route_table() -> Vec<RouteAuth> {
    routes().into_parts().1
}

/// A route's refusal, in Daytona's error shape.
fn refuse(_: &RouteAuth, refusal: Refusal) -> Response {
    match refusal {
        Refusal::Unauthenticated => unauthorized(),
        Refusal::Forbidden => error_response(
            StatusCode::FORBIDDEN,
            "Forbidden: this call needs the server's API key (DAYTONA_API_KEY, sent as \
             Authorization: Bearer)"
                .into(),
            None,
        ),
    }
}

/// `401` for a missing or wrong key.
fn unauthorized() -> Response {
    let mut response = error_response(
        StatusCode::UNAUTHORIZED,
        "Unauthorized: the API key (DAYTONA_API_KEY, sent as Authorization: Bearer) \
         must be the server's SANDCOVE_API_KEY"
            .into(),
        None,
    );
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

/// The facade's gap (see `gaps`) a Daytona path belongs to, for paths this listener does not
/// serve: the SDK then raises its own error with the facade's alternative.
fn gap_of_path(path: &str) -> Option<&'static str> {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let gap = match segments.as_slice() {
        ["api", "sandbox", _, "resize", ..] => "resize",
        ["api", "sandbox", _, "recover", ..] => "recover",
        ["api", "sandbox", _, "network-settings", ..] => "update_network_settings",
        ["api", "sandbox", _, "ssh-access", ..] | ["api", "sandbox", "ssh-access", ..] => {
            "ssh access"
        }
        ["api", "sandbox", _, "ports", _, "signed-preview-url", _, "expire"] => {
            "expire_signed_preview_url"
        }
        ["api", "sandbox", _, "secrets", ..] | ["api", "secrets", ..] => "secrets and warm pools",
        ["api", "warm-pools", ..] | ["api", "warm-pool", ..] => "secrets and warm pools",
        ["api", "object-storage", ..] => "object storage",
        ["toolbox", _, "process", "interpreter", ..] => "code_interpreter",
        ["toolbox", _, "lsp", ..] => "create_lsp_server",
        ["toolbox", _, "computeruse", ..] => "computer_use",
        _ => return None,
    };
    Some(gap)
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
    let path = request.uri().path();
    if let Some(feature) = gap_of_path(path) {
        return ApiError(crate::gaps::gap(feature)).into_response();
    }
    // A 404 under a Daytona path would read as "sandbox not found" to the SDK: calls this
    // listener does not serve say so instead (501, the SDK's base `DaytonaError`).
    if path.starts_with("/api/") || path.starts_with("/toolbox/") {
        return error_response(
            StatusCode::NOT_IMPLEMENTED,
            format!(
                "{} {path} is not served over Daytona's wire protocol by Sandcove (see \
                 MAPPING.md); instead use process.exec (for git commands other than status, \
                 add, commit, branches, checkout, clone, pull, push, init and remotes too), or sessions for \
                 long-running and interactive programs",
                request.method()
            ),
            Some("NOT_SUPPORTED"),
        );
    }
    error_response(
        StatusCode::NOT_FOUND,
        format!("{} {path} does not exist here", request.method()),
        None,
    )
}

/// The bearer token of a request, if it has one.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// The listener's credential check: a key that is presented is verified (a wrong one is
/// refused here, `401`) and recorded as the request's [`Credential`]; each route's own check
/// then decides. The event socket is served from here, before routing.
async fn authenticate(State(wire): State<Wire>, mut request: Request, next: Next) -> Response {
    let mut credential = Credential::anonymous();
    if request.headers().contains_key(header::AUTHORIZATION) {
        let key = bearer(request.headers()).unwrap_or("");
        if !keys_match(key.as_bytes(), wire.config.api_key.as_bytes()) {
            return unauthorized();
        }
        credential = Credential::server_key();
    }
    // The SDK's event socket: the SDK sends its key in the Socket.IO handshake, not in a
    // header, so the socket checks it there (against `event_socket_route`).
    if request.uri().path().starts_with("/api/socket.io") {
        return events::socket(State(wire), request).await;
    }
    // A pre-signed file URL carries no header: its signature is checked here, before
    // routing and any effect, and what it allows goes on as the request's grant.
    if credential.principal == Principal::Anonymous {
        let (method, uri) = (request.method().clone(), request.uri().clone());
        match file_urls::verify(&wire, &method, &uri).await {
            Ok(Some(grant)) => {
                credential = Credential::for_sandbox(Principal::SignedUrl, grant.sandbox.clone());
                request.extensions_mut().insert(grant);
            }
            Ok(None) => {}
            Err(file_urls::Invalid(why)) => {
                return error_response(StatusCode::UNAUTHORIZED, why.into(), None)
            }
        }
    }
    request.extensions_mut().insert(credential);
    next.run(request).await
}

/// Daytona's error body: `{"statusCode", "message", "error"}` (plus `code` when known).
pub(crate) fn error_response(status: StatusCode, message: String, code: Option<&str>) -> Response {
    let mut body = json!({
        "statusCode": status.as_u16(),
        "message": message,
        "error": status.canonical_reason().unwrap_or("Error"),
    });
    if let Some(code) = code {
        body["code"] = json!(code);
    }
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

/// A facade error on its way out as a Daytona error answer.
#[derive(Debug)]
pub struct ApiError(pub DaytonaError);

impl<E: Into<DaytonaError>> From<E> for ApiError {
    fn from(e: E) -> Self {
        ApiError(e.into())
    }
}

/// The one mapping from the facade's error classes to statuses: the status the SDK maps
/// back to the same class (`DaytonaNotFoundError` ← 404, `DaytonaTimeoutError` ← 408, …).
pub fn status_for(e: &DaytonaError) -> StatusCode {
    if let Some(status) = e.status_code().and_then(|s| StatusCode::from_u16(s).ok()) {
        return status;
    }
    match e {
        DaytonaError::NotFound(_) => StatusCode::NOT_FOUND,
        DaytonaError::Authentication(_) => StatusCode::UNAUTHORIZED,
        DaytonaError::Forbidden(_) => StatusCode::FORBIDDEN,
        DaytonaError::RateLimit(_) => StatusCode::TOO_MANY_REQUESTS,
        DaytonaError::Conflict(_) => StatusCode::CONFLICT,
        DaytonaError::BadRequest(_) | DaytonaError::NotSupported { .. } => StatusCode::BAD_REQUEST,
        DaytonaError::Timeout(_) => StatusCode::REQUEST_TIMEOUT,
        DaytonaError::Connection(_) | DaytonaError::ServiceUnavailable(_) => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The message without the facade's per-method prefix (`"Failed to get sandbox: "`): the
/// SDK adds its own, and two would read badly.
pub(crate) fn unprefixed(message: &str) -> &str {
    if let Some(rest) = message.strip_prefix("Failed to ") {
        if let Some((_, tail)) = rest.split_once(": ") {
            return tail;
        }
    }
    message
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = status_for(&self.0);
        let code = match &self.0 {
            DaytonaError::NotSupported { .. } => Some("NOT_SUPPORTED"),
            other => other.code(),
        };
        error_response(
            status,
            unprefixed(&self.0.message()).to_string(),
            code.map(|c| c.to_string()).as_deref(),
        )
    }
}

/// A 400 for a malformed request.
pub(crate) fn bad_request(message: impl Into<String>) -> ApiError {
    ApiError(DaytonaError::validation(message))
}

/// Parse a JSON body (`{}` when empty; an object) of at most `wire`'s JSON limit (the
/// router's own limit is the larger upload one), refused in Daytona's error shape.
pub(crate) fn parse_json<T: serde::de::DeserializeOwned>(
    wire: &Wire,
    body: &[u8],
) -> Result<T, ApiError> {
    use sandcove::server::json_body::{decode, JsonBodyError};
    decode(body, wire.config.max_body_bytes).map_err(|e| match e {
        JsonBodyError::TooLarge { .. } => ApiError(DaytonaError::BadRequest(
            crate::errors::ErrorDetails::new(e.to_string(), Some(413), Some("PAYLOAD_TOO_LARGE")),
        )),
        JsonBodyError::Malformed(_) => bad_request(e.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_class_maps_to_the_status_the_sdk_maps_back() {
        use crate::errors::ErrorDetails;
        let d = || ErrorDetails::new("m", None, None);
        let table: Vec<(DaytonaError, u16)> = vec![
            (DaytonaError::NotFound(d()), 404),
            (DaytonaError::Authentication(d()), 401),
            (DaytonaError::Forbidden(d()), 403),
            (DaytonaError::RateLimit(d()), 429),
            (DaytonaError::Conflict(d()), 409),
            (DaytonaError::BadRequest(d()), 400),
            (DaytonaError::Timeout(d()), 408),
            (DaytonaError::Connection(d()), 503),
            (DaytonaError::ServiceUnavailable(d()), 503),
            (DaytonaError::InternalServer(d()), 500),
            (DaytonaError::Error(d()), 500),
            (DaytonaError::not_supported("x", "y"), 400),
            (
                DaytonaError::Timeout(ErrorDetails::new("t", Some(408), None)),
                408,
            ),
            (
                DaytonaError::from(sandcove::Error::not_found("sandbox \"x\"")),
                404,
            ),
        ];
        for (e, status) in table {
            assert_eq!(status_for(&e).as_u16(), status, "{e:?}");
        }
    }

    #[test]
    fn paths_not_served_name_their_gap() {
        for (path, gap) in [
            ("/api/sandbox/abc/resize", Some("resize")),
            ("/api/sandbox/abc/ssh-access", Some("ssh access")),
            ("/api/sandbox/ssh-access/validate", Some("ssh access")),
            (
                "/api/sandbox/abc/ports/80/signed-preview-url/tok/expire",
                Some("expire_signed_preview_url"),
            ),
            (
                "/toolbox/abc/process/interpreter/execute",
                Some("code_interpreter"),
            ),
            ("/toolbox/abc/lsp/start", Some("create_lsp_server")),
            ("/toolbox/abc/computeruse/start", Some("computer_use")),
            ("/toolbox/abc/git/history", None),
            ("/api/sandbox/abc", None),
        ] {
            assert_eq!(gap_of_path(path), gap, "{path}");
            if let Some(g) = gap {
                // Every name is in the facade's table (its message names the alternative).
                assert!(crate::gaps::GAPS.iter().any(|x| x.feature == g), "{g}");
            }
        }
    }

    #[test]
    fn the_facade_prefix_is_dropped_once() {
        assert_eq!(unprefixed("Failed to get sandbox: not found"), "not found");
        assert_eq!(unprefixed("not found: x"), "not found: x");
        assert_eq!(
            unprefixed("Failed to execute command: a: b"),
            "a: b",
            "only the first prefix goes"
        );
    }

    #[test]
    fn bearer_tokens_are_parsed_strictly() {
        let mut h = HeaderMap::new();
        assert_eq!(bearer(&h), None);
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer k1"));
        assert_eq!(bearer(&h), Some("k1"));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic k1"));
        assert_eq!(bearer(&h), None);
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("k1"));
        assert_eq!(bearer(&h), None);
    }
}
