//! E2B's wire protocol, so E2B's official SDKs (Python `e2b`, TypeScript `e2b`) run unchanged
//! against Sandcove: `sandcove serve --e2b ADDR` serves [`router`] there, and the SDK is
//! pointed at it with `E2B_API_URL` and `E2B_SANDBOX_URL` (both the listener's origin).
//!
//! | module | what |
//! |---|---|
//! | [`control`] | the control plane (`/v2/sandboxes`, `/sandboxes/{id}/…`): REST + JSON |
//! | [`envd`] | the in-sandbox API: `process.Process/*`, `filesystem.Filesystem/*` over Connect, `/files`, `/health` |
//! | [`connect`] | Connect framing with the JSON codec: envelopes, end-of-stream errors, deadlines |
//! | `interpreter` | the code interpreter on port 49999: `POST /execute` (NDJSON), `/contexts` |
//!
//! One origin serves both planes, as the SDK allows: a request carrying `E2b-Sandbox-Id`
//! (every envd call does) or aimed at an envd path is an envd call, anything else is a
//! control-plane call. A sandbox request whose `E2b-Sandbox-Port` is 49999 goes to the code
//! interpreter's own routes (its `/health` is not envd's).
//!
//! **Authorization** follows `sandcove::server::auth`: every route is declared with the
//! credentials it accepts ([`route_table`]), and the listener's check records the one a
//! request proves. The control plane takes only the server's API key (`X-API-KEY`, compared
//! in constant time; a missing or wrong key is `401 {"code":401,"message":…}`, which the SDK
//! raises as `AuthenticationException`; a sandbox's token there is `403`). envd calls take,
//! as `X-Access-Token`, the `envdAccessToken` the control plane returned for the sandbox named
//! by `E2b-Sandbox-Id`: an HMAC-SHA256 of the sandbox id under the server's API key, so it is
//! kept nowhere (nothing in the sandbox can read or rewrite it), survives a server restart,
//! and opens that sandbox's data plane only — never the control plane, never another
//! sandbox. A wrong token is `401 {"code":"unauthenticated",…}` at once. The code interpreter
//! takes the same token, or the sandbox's `trafficAccessToken` (another HMAC, under a
//! different label) as `E2B-Traffic-Access-Token`. A signed `/files` URL opens one path for
//! one operation, until its expiry. Port forwarding (`get_host`) is for sandboxes made
//! through E2B's API only (see `ports`).
//!
//! **Translation** is the Rust facade's: creating a sandbox goes through the same
//! `Sandbox.create` option checks, commands get the same paths, envs and users, errors the
//! same exception classes (mapped to statuses and Connect codes in one place each).

pub mod connect;
pub mod control;
pub mod envd;
mod gzip;
mod interpreter;
mod ports;
pub use ports::MAX_FORWARDED_PORTS;
mod watchers;
pub use watchers::{KEEP_ENDED as KEEP_ENDED_WATCHERS, MAX_WATCHERS_PER_SANDBOX};

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use sandcove::server::auth::{keys_match, Credential, Principal, Refusal, RouteAuth, Routes};
use sandcove::Backend;
use tower::ServiceExt;

use crate::errors::SandboxException;

/// The envd port E2B's SDKs name in `E2b-Sandbox-Port`.
pub const ENVD_PORT: &str = "49983";
/// The code interpreter's port.
pub const CODE_INTERPRETER_PORT: &str = "49999";
/// The envd version advertised: the highest whose SDK-gated features are served (stdin,
/// default user, `close_stdin`, octet-stream uploads, file metadata, the watch's `entry` and
/// network-mounts flag).
pub const WIRE_ENVD_VERSION: &str = "0.6.4";

/// Settings of the E2B listener.
#[derive(Clone)]
pub struct WireConfig {
    /// The server's API key: `X-API-KEY` must equal it, and envd tokens derive from it.
    pub api_key: String,
    /// Largest JSON or Connect request body, in bytes.
    pub max_body_bytes: usize,
    /// Largest file upload, in bytes.
    pub max_upload_bytes: u64,
    /// Largest multipart upload body, in bytes (decoded, when gzip-encoded). Multipart
    /// uploads stream part by part like octet-stream ones (which obey `max_upload_bytes`).
    pub max_multipart_bytes: usize,
    /// The memory uploads may hold, shared with the server's other listeners when they are
    /// given clones of one budget (see `sandcove_compat_support::multipart`).
    pub upload_memory: sandcove_compat_support::multipart::UploadBudget,
    /// Most requests through `get_host` (which need no credential) running at once for one
    /// sandbox, upgraded connections included; more are answered `503` with `Retry-After`.
    pub max_host_requests_per_sandbox: usize,
}

impl WireConfig {
    /// Defaults: 1 MiB bodies, 4 GiB streamed uploads, 64 MiB multipart uploads, a budget
    /// of its own for upload memory, 64 `get_host` requests at once per sandbox.
    pub fn new(api_key: impl Into<String>) -> Self {
        WireConfig {
            api_key: api_key.into(),
            max_body_bytes: 1024 * 1024,
            max_upload_bytes: 4 * 1024 * 1024 * 1024,
            max_multipart_bytes: 64 * 1024 * 1024,
            upload_memory: Default::default(),
            max_host_requests_per_sandbox: 64,
        }
    }
}

impl std::fmt::Debug for WireConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The API key is deliberately left out.
        f.debug_struct("WireConfig")
            .field("max_body_bytes", &self.max_body_bytes)
            .field("max_upload_bytes", &self.max_upload_bytes)
            .field("max_multipart_bytes", &self.max_multipart_bytes)
            .field("upload_memory", &self.upload_memory)
            .field(
                "max_host_requests_per_sandbox",
                &self.max_host_requests_per_sandbox,
            )
            .finish_non_exhaustive()
    }
}

/// What every handler gets.
#[derive(Clone)]
pub(crate) struct Wire {
    /// Every call goes through the client surface (its validation and capability check).
    pub client: sandcove::Client,
    pub config: Arc<WireConfig>,
    tokens: Arc<ring::hmac::Key>,
    pub watchers: Arc<watchers::Watchers>,
    /// One `/execute` at a time per code context (see `interpreter`).
    pub(crate) cells: Arc<interpreter::CellLocks>,
    /// `get_host` requests running, per sandbox (see `ports`).
    pub(crate) host_requests: Arc<ports::InFlight>,
    /// The previews port forwarding made, per sandbox (see `ports`).
    pub(crate) forwarded: Arc<ports::Forwarded>,
    /// The E2B sandboxes known, for signed URLs.
    pub(crate) known: Arc<KnownSandboxes>,
}

impl Wire {
    /// The `envdAccessToken` of sandbox `id`.
    pub fn envd_token(&self, id: &str) -> String {
        envd_token(&self.tokens, id)
    }

    /// Whether `token` is sandbox `id`'s `trafficAccessToken`.
    pub(crate) fn traffic_token_matches(&self, id: &str, token: &str) -> bool {
        token_matches(&self.tokens, &format!("traffic\0{id}"), token)
    }

    /// The `trafficAccessToken` of sandbox `id`.
    pub fn traffic_token(&self, id: &str) -> String {
        traffic_token(&self.tokens, id)
    }
}

/// The `trafficAccessToken` of sandbox `id` under `key`: not the envd token, so handing it
/// out (the SDKs expose it to user code) grants no envd call.
fn traffic_token(key: &ring::hmac::Key, id: &str) -> String {
    envd_token(key, &format!("traffic\0{id}"))
}

/// The `envdAccessToken` of sandbox `id` under `key`.
fn envd_token(key: &ring::hmac::Key, id: &str) -> String {
    let tag = ring::hmac::sign(key, &token_message(id));
    let mut out = String::from("sct_");
    for b in tag.as_ref() {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// Whether `token` is sandbox `id`'s token (verified in constant time).
fn token_matches(key: &ring::hmac::Key, id: &str, token: &str) -> bool {
    let Some(hex) = token.strip_prefix("sct_") else {
        return false;
    };
    let Some(tag) = decode_hex(hex) else {
        return false;
    };
    ring::hmac::verify(key, &token_message(id), &tag).is_ok()
}

fn token_message(id: &str) -> Vec<u8> {
    let mut m = b"sandcove e2b envd access token\0".to_vec();
    m.extend_from_slice(id.as_bytes());
    m
}

fn decode_hex(hex: &str) -> Option<Vec<u8>> {
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).ok())
        .collect()
}

/// The sandbox an authenticated envd request is for.
#[derive(Debug, Clone)]
pub(crate) struct SandboxId(pub String);

/// The declared routes of the listener, its table with them.
fn routes() -> Routes<Wire> {
    control::routes()
        .merge(envd::routes())
        .declare(None, PORT_FORWARD_ROUTE, ports::ACCEPTS)
}

/// How port forwarding appears in the authorization table.
pub const PORT_FORWARD_ROUTE: &str = "Host: {port}-{id}.<domain> (any path)";

/// The E2B listener's authorization table: every route it serves, the code interpreter's
/// (under `E2b-Sandbox-Port: 49999`) and port forwarding included, with the credentials each
/// accepts.
pub fn route_table() -> Vec<RouteAuth> {
    let mut table = routes().into_parts().1;
    table.extend(
        interpreter::routes()
            .into_parts()
            .1
            .into_iter()
            .map(|mut r| {
                r.path = format!("{} (E2b-Sandbox-Port: {CODE_INTERPRETER_PORT})", r.path);
                r
            }),
    );
    table
}

/// E2B's wire API over `backend`, ready to serve (the caller provides the listener, the
/// connection cap and head timeouts: `sandcove::server::serve_router`).
pub fn router(backend: Arc<dyn Backend>, config: WireConfig) -> Router {
    let tokens = Arc::new(ring::hmac::Key::new(
        ring::hmac::HMAC_SHA256,
        config.api_key.as_bytes(),
    ));
    let body_limit = config.max_body_bytes;
    let wire = Wire {
        client: sandcove::Client::new(backend),
        config: Arc::new(config),
        tokens,
        known: Arc::default(),
        watchers: Arc::default(),
        cells: Arc::default(),
        host_requests: Arc::default(),
        forwarded: Arc::default(),
    };
    let interpreter = interpreter::routes()
        .into_parts()
        .0
        .fallback(interpreter::not_found)
        .with_state(wire.clone())
        .layer(axum::extract::DefaultBodyLimit::max(body_limit));
    routes()
        .into_parts()
        .0
        .fallback(not_found)
        .with_state(wire.clone())
        .layer(axum::extract::DefaultBodyLimit::max(body_limit))
        .layer(middleware::from_fn_with_state(
            (wire, interpreter),
            authenticate,
        ))
}

/// A refusal on this listener, in the shape of the plane the route belongs to: envd's
/// Connect error, or the control plane's `{"code","message"}`.
fn refuse(route: &RouteAuth, refusal: Refusal) -> Response {
    let envd = is_envd_path(&route.path);
    match (refusal, envd) {
        (Refusal::Unauthenticated, true) => connect::ConnectError::new(
            connect::Code::Unauthenticated,
            "invalid or missing X-Access-Token for this sandbox",
        )
        .into_response(),
        (Refusal::Forbidden, true) => connect::ConnectError::new(
            connect::Code::PermissionDenied,
            "this credential does not open this call",
        )
        .into_response(),
        (Refusal::Unauthenticated, false) => unauthorized_key(),
        (Refusal::Forbidden, false) => control::api_error(
            StatusCode::FORBIDDEN,
            "the control plane needs the server's API key (X-API-KEY); a sandbox's token \
             opens only that sandbox"
                .to_string(),
        ),
    }
}

fn unauthorized_key() -> Response {
    let mut response = control::api_error(
        StatusCode::UNAUTHORIZED,
        "Invalid API key: X-API-KEY must be the server's SANDCOVE_API_KEY".to_string(),
    );
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("X-API-KEY"),
    );
    response
}

pub(crate) async fn not_found(request: Request) -> Response {
    let path = request.uri().path();
    // Unknown paths answer only the server's key (nothing about what exists leaks to others).
    if request
        .extensions()
        .get::<Credential>()
        .map(|c| c.principal)
        != Some(Principal::ServerKey)
    {
        return unauthorized_key();
    }
    if let Some(gap) = unserved_gap(path) {
        return control::exception_response(gap);
    }
    control::api_error(
        StatusCode::NOT_FOUND,
        format!(
            "{} {path} is not an endpoint of E2B's API",
            request.method()
        ),
    )
}

/// The refusal for a control-plane call the pinned SDKs can make and Sandcove does not serve
/// over the wire, so the SDK raises its own `SandboxException` naming the alternative (a bare
/// 404 under a sandbox's path would read as "sandbox not found"). The texts are the facade's
/// gaps: one table decides.
fn unserved_gap(path: &str) -> Option<SandboxException> {
    use crate::gaps::refuse;
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let refusal = match segments.as_slice() {
        ["sandboxes", _, "logs"] | ["v2", "sandboxes", _, "logs"] => refuse("sandbox_logs"),
        ["sandboxes", _, "refreshes"] => refuse("refreshes"),
        ["sandboxes", _, "network"] => refuse("update_network"),
        ["volumes", ..] => refuse("volume_api"),
        ["secrets", ..] => refuse("secrets"),
        ["templates", ..]
        | ["v2", "templates", ..]
        | ["v3", "templates", ..]
        | ["default-templates", ..] => refuse("template_build"),
        _ => return None,
    };
    Some(refusal)
}

/// Whether a path belongs to envd rather than the control plane.
pub(crate) fn is_envd_path(path: &str) -> bool {
    path.starts_with("/process.Process/")
        || path.starts_with("/filesystem.Filesystem/")
        || path == "/files"
        || path == "/health"
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// An invalid credential: refused at once, never read as a narrower one.
fn invalid(envd: bool, what: &str) -> Response {
    if envd {
        connect::ConnectError::new(connect::Code::Unauthenticated, what.to_string()).into_response()
    } else {
        control::api_error(StatusCode::UNAUTHORIZED, what.to_string())
    }
}

/// The listener's credential check: finds the one credential a request proves and records
/// it ([`Credential`]) for the routes' own checks; a credential that is presented and wrong
/// is refused here. Port forwarding (by `Host`) and the code interpreter's port (by
/// `E2b-Sandbox-Port`) are dispatched here too.
async fn authenticate(
    State((wire, interpreter)): State<(Wire, Router)>,
    mut request: Request,
    next: Next,
) -> Response {
    let headers = request.headers();
    let sandbox = header_str(headers, "e2b-sandbox-id").map(str::to_string);
    // `get_host(port)`: `Host: {port}-{id}.{domain}` goes to that port in the sandbox.
    if sandbox.is_none() {
        if let Some((port, id)) = header_str(headers, "host").and_then(ports::host_target) {
            return ports::forward(&wire, port, &id, request).await;
        }
    }
    let envd = is_envd_path(request.uri().path());
    let mut credential = Credential::anonymous();
    if let Some(key) = header_str(headers, "x-api-key") {
        if !keys_match(key.as_bytes(), wire.config.api_key.as_bytes()) {
            return unauthorized_key();
        }
        credential = Credential::server_key();
    }
    if let Some(id) = &sandbox {
        if let Some(token) = header_str(headers, "x-access-token") {
            if !token_matches(&wire.tokens, id, token) {
                return invalid(envd, "invalid X-Access-Token for this sandbox");
            }
            if credential.principal != Principal::ServerKey {
                credential = Credential::for_sandbox(Principal::SandboxToken, id.clone());
            }
        }
        if let Some(traffic) = header_str(headers, "e2b-traffic-access-token") {
            if !token_matches(&wire.tokens, &format!("traffic\0{id}"), traffic) {
                return invalid(envd, "invalid E2B-Traffic-Access-Token for this sandbox");
            }
            if credential.principal == Principal::Anonymous {
                credential = Credential::for_sandbox(Principal::TrafficToken, id.clone());
            }
        }
    }
    let mut bound = sandbox.clone();
    if sandbox.is_none() && request.uri().path() == "/files" {
        // A URL from `download_url`/`upload_url`: no headers, a signature in the query.
        let (method, uri) = (request.method().clone(), request.uri().clone());
        match signed_file_url(&wire, &method, &uri).await {
            Ok(Some(grant)) => {
                let id = grant.sandbox.clone();
                if credential.principal == Principal::Anonymous {
                    credential = Credential::for_sandbox(Principal::SignedUrl, id.clone());
                }
                request.extensions_mut().insert(grant);
                bound = Some(id);
            }
            Ok(None) => {}
            // envd's REST shape: `{"code": 401, "message": …}`.
            Err(e) => return control::api_error(StatusCode::UNAUTHORIZED, e.message),
        }
    }
    if envd && bound.is_none() && credential.principal != Principal::Anonymous {
        return connect::ConnectError::new(
            connect::Code::Unauthenticated,
            "missing E2b-Sandbox-Id header",
        )
        .into_response();
    }
    request.extensions_mut().insert(credential);
    if let Some(id) = bound {
        request.extensions_mut().insert(SandboxId(id));
    }
    if sandbox.is_some() {
        match header_str(request.headers(), "e2b-sandbox-port") {
            None | Some(ENVD_PORT) => {}
            Some(CODE_INTERPRETER_PORT) => {
                return match interpreter.oneshot(request).await {
                    Ok(response) => response,
                    Err(never) => match never {},
                };
            }
            Some(other) => {
                return connect::ConnectError::new(
                    connect::Code::Unavailable,
                    format!(
                        "port is not open: port {other} is not served over E2B's wire \
                         protocol; expose it with sandcove's preview API instead"
                    ),
                )
                .into_response();
            }
        }
    }
    next.run(request).await
}

/// The query of a signed `/files` URL, as E2B's SDKs build it.
#[derive(Debug, serde::Deserialize)]
struct SignedQuery {
    path: Option<String>,
    username: Option<String>,
    signature: Option<String>,
    signature_expiration: Option<String>,
}

/// E2B's v1 file-URL signature: `v1_` + unpadded base64 of
/// SHA-256(`path:operation:user:envdAccessToken[:expiration]`).
fn file_signature(
    path: &str,
    operation: &str,
    user: &str,
    token: &str,
    expiration: Option<&str>,
) -> String {
    use base64::Engine as _;
    let mut raw = format!("{path}:{operation}:{user}:{token}");
    if let Some(e) = expiration {
        raw.push(':');
        raw.push_str(e);
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, raw.as_bytes());
    format!(
        "v1_{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest.as_ref())
    )
}

/// The core grant an E2B signature stands for, inserted into the request's extensions when
/// the signature let the request in: one operation on one path as one user, until the
/// signature's expiration. The `/files` handlers then move the bytes through
/// [`sandcove::file_url::transfer`], the one transfer every signed file URL goes through,
/// which checks the request against the grant before any effect.
///
/// The path and user are E2B's, as signed (a relative path, an empty user for the default):
/// the wire's [`FileAccess`](sandcove::file_url::FileAccess) resolves them as envd does.
/// E2B's expiration is in whole seconds and still valid during its last second, so the grant
/// expires at the end of that second. No nonce: the grant is never signed again.
pub(crate) fn e2b_grant(
    sandbox: &str,
    path: &str,
    operation: sandcove::FileUrlOperation,
    user: &str,
    expiration_secs: Option<u64>,
) -> sandcove::FileGrant {
    sandcove::FileGrant {
        sandbox: sandbox.to_string(),
        path: path.to_string(),
        operation,
        user: Some(user.to_string()).filter(|u| !u.is_empty()),
        expires_at: expiration_secs.map(|s| s.saturating_add(1).saturating_mul(1000)),
        max_bytes: None,
        nonce: String::new(),
    }
}

/// The sandbox a signed `/files` URL (`download_url`, `upload_url`) was made for: the one
/// whose envd token gives the URL's signature for this path, operation (`GET` reads, `POST`
/// writes) and user, not expired. `None` when the URL carries no signature (the request is
/// then judged by its headers); an error when it carries one that matches no sandbox.
///
/// The SDKs' URL does not name its sandbox, so the signature is tried against the envd
/// token of each E2B sandbox this listener knows ([`KnownSandboxes`]): one SHA-256 of a
/// short string each, from memory, with no call to the engine (which the listener makes at
/// most once per [`KnownSandboxes::REFRESH`] however many bad signatures arrive).
async fn signed_file_url(
    wire: &Wire,
    method: &axum::http::Method,
    uri: &axum::http::Uri,
) -> Result<Option<sandcove::FileGrant>, connect::ConnectError> {
    let Ok(axum::extract::Query(q)) = axum::extract::Query::<SignedQuery>::try_from_uri(uri) else {
        return Ok(None);
    };
    let Some(signature) = q.signature else {
        return Ok(None);
    };
    // Refused as envd refuses a signed URL: 401 with its JSON body and its words. The
    // signature is checked first, then its expiration (part of what was signed).
    let refused = |message: &str| {
        connect::ConnectError::new(connect::Code::Unauthenticated, message.to_string())
    };
    let invalid = || refused("invalid signature");
    let (operation, signed_operation) = match *method {
        axum::http::Method::GET => (sandcove::FileUrlOperation::Read, "read"),
        axum::http::Method::POST => (sandcove::FileUrlOperation::Write, "write"),
        _ => return Err(invalid()),
    };
    let expires_at = match &q.signature_expiration {
        Some(expiration) => Some(expiration.parse::<u64>().map_err(|_| invalid())?),
        None => None,
    };
    let path = q.path.unwrap_or_default();
    let user = q.username.unwrap_or_default();
    let matches = |token: &str| {
        let expected = file_signature(
            &path,
            signed_operation,
            &user,
            token,
            q.signature_expiration.as_deref(),
        );
        keys_match(signature.as_bytes(), expected.as_bytes())
    };
    let mut found = wire.known.find(&matches);
    if found.is_none() && wire.known.refresh_due() {
        wire.known.refresh(wire).await;
        found = wire.known.find(&matches);
    }
    let Some(id) = found else {
        return Err(invalid());
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(u64::MAX);
    if expires_at.is_some_and(|at| at < now) {
        return Err(refused("signature is already expired"));
    }
    // The sandbox may have ended since it was indexed.
    if wire.client.backend().get(&id).await.is_err() {
        wire.known.forget(&id);
        return Err(invalid());
    }
    Ok(Some(e2b_grant(&id, &path, operation, &user, expires_at)))
}

/// The E2B sandboxes this listener knows, with their envd tokens, so a signed URL is checked
/// from memory. Filled as the control plane hands out sandboxes (create, connect, get, list)
/// and, when a signature matches none of them, from the engine, at most once per
/// [`REFRESH`](Self::REFRESH).
#[derive(Default)]
pub(crate) struct KnownSandboxes {
    tokens: std::sync::Mutex<std::collections::HashMap<String, String>>,
    refreshed: std::sync::Mutex<Option<std::time::Instant>>,
}

impl KnownSandboxes {
    /// The least time between two reads of the engine's sandbox list.
    pub const REFRESH: std::time::Duration = std::time::Duration::from_secs(5);

    /// Remember sandbox `id`'s envd token.
    pub(crate) fn insert(&self, id: &str, token: String) {
        let mut tokens = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
        tokens.insert(id.to_string(), token);
    }

    /// Forget sandbox `id`.
    pub(crate) fn forget(&self, id: &str) {
        let mut tokens = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
        tokens.remove(id);
    }

    fn find(&self, matches: &dyn Fn(&str) -> bool) -> Option<String> {
        let tokens = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
        tokens
            .iter()
            .find(|(_, token)| matches(token))
            .map(|(id, _)| id.clone())
    }

    /// Whether the engine may be asked again (and, if so, the time of asking is taken).
    fn refresh_due(&self) -> bool {
        let mut at = self.refreshed.lock().unwrap_or_else(|e| e.into_inner());
        let now = std::time::Instant::now();
        if at.is_some_and(|t| now.duration_since(t) < Self::REFRESH) {
            return false;
        }
        *at = Some(now);
        true
    }

    async fn refresh(&self, wire: &Wire) {
        let Ok(all) = wire.client.list(Default::default()).await else {
            return;
        };
        let e2b: Vec<String> = all
            .into_iter()
            .filter(is_e2b_sandbox)
            .map(|info| info.id)
            .collect();
        let mut tokens = self.tokens.lock().unwrap_or_else(|e| e.into_inner());
        tokens.clear();
        for id in e2b {
            let token = wire.envd_token(&id);
            tokens.insert(id, token);
        }
    }
}

/// Whether a sandbox was made through E2B's API (this listener or the Rust facade): only
/// such sandboxes have E2B's public ports and signed file URLs.
pub(crate) fn is_e2b_sandbox(info: &sandcove::SandboxInfo) -> bool {
    info.annotations
        .contains_key(crate::sandbox::TEMPLATE_ANNOTATION)
}

/// Read a request body whole, at most `limit` bytes; beyond that the request is refused
/// before the rest is read.
pub(crate) async fn read_body(body: Body, limit: usize) -> Result<Vec<u8>, BodyError> {
    use futures::StreamExt;
    let mut stream = body.into_data_stream();
    let mut out = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| BodyError::Read(e.to_string()))?;
        if out.len() + chunk.len() > limit {
            return Err(BodyError::TooLarge(limit));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// Why a body could not be read.
#[derive(Debug)]
pub(crate) enum BodyError {
    /// Bigger than the limit (bytes).
    TooLarge(usize),
    /// The connection failed mid-body.
    Read(String),
}

impl From<BodyError> for connect::ConnectError {
    fn from(e: BodyError) -> Self {
        match e {
            BodyError::TooLarge(limit) => connect::ConnectError::new(
                connect::Code::ResourceExhausted,
                format!("the request body is larger than {limit} bytes"),
            ),
            BodyError::Read(why) => connect::ConnectError::new(
                connect::Code::InvalidArgument,
                format!("reading the request body: {why}"),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(k: &str) -> ring::hmac::Key {
        ring::hmac::Key::new(ring::hmac::HMAC_SHA256, k.as_bytes())
    }

    #[test]
    fn file_signatures_are_e2bs_v1() {
        // From the Python SDK 2.63.0's `get_signature("/home/user/a.txt", "read", None,
        // "tok")`: sha256 of "/home/user/a.txt:read::tok", base64 without padding.
        assert_eq!(
            file_signature("/home/user/a.txt", "read", "", "tok", None),
            "v1_Zkbb3914oLJLvMBzCAHQhm2ydBLxbSx2eQUR/kLdvIY"
        );
        assert_ne!(
            file_signature("/home/user/a.txt", "write", "", "tok", None),
            file_signature("/home/user/a.txt", "read", "", "tok", None)
        );
        assert_ne!(
            file_signature("/a", "read", "", "tok", Some("1")),
            file_signature("/a", "read", "", "tok", Some("2"))
        );
    }

    #[test]
    fn an_e2b_signature_stands_for_a_core_grant_with_all_it_signed() {
        use sandcove::FileUrlOperation::{Read, Write};
        let grant = e2b_grant("sbx-a", "dir/a.txt", Write, "root", Some(1_000));
        assert_eq!(grant.sandbox, "sbx-a");
        assert_eq!(grant.path, "dir/a.txt", "E2B's path, as signed");
        assert_eq!(grant.operation, Write);
        assert_eq!(grant.user.as_deref(), Some("root"));
        assert_eq!(grant.max_bytes, None, "the listener bounds the upload");
        // E2B's expiration (seconds) still holds during its last second, not after.
        let check = |op, path, now| grant.check(op, path, now);
        assert!(check(Write, Some("dir/a.txt"), 1_000_999).is_ok());
        assert!(matches!(
            check(Write, None, 1_001_000),
            Err(sandcove::Error::Unauthenticated { .. })
        ));
        // The core's check then holds the request to what E2B signed.
        assert!(matches!(
            check(Read, None, 0),
            Err(sandcove::Error::Forbidden { .. })
        ));
        assert!(matches!(
            check(Write, Some("dir/b.txt"), 0),
            Err(sandcove::Error::Forbidden { .. })
        ));
        // Signed without a user: the sandbox's default; without an expiration: none.
        let grant = e2b_grant("sbx-a", "/a", Read, "", None);
        assert_eq!((grant.user, grant.expires_at), (None, None));
    }

    #[test]
    fn the_engine_is_asked_for_sandboxes_at_most_once_per_refresh_interval() {
        let known = KnownSandboxes::default();
        assert!(known.refresh_due(), "the first miss asks");
        for _ in 0..1000 {
            assert!(
                !known.refresh_due(),
                "a flood of bad signatures asks no more"
            );
        }
        known.insert("a", "tok".into());
        assert_eq!(known.find(&|t| t == "tok").as_deref(), Some("a"));
        known.forget("a");
        assert_eq!(known.find(&|t| t == "tok"), None);
    }

    #[test]
    fn envd_tokens_are_per_sandbox_and_per_key() {
        let w = key("k1");
        let t = envd_token(&w, "sbx-a");
        assert!(token_matches(&w, "sbx-a", &t));
        assert!(!token_matches(&w, "sbx-b", &t), "another sandbox's token");
        assert!(!token_matches(&key("k2"), "sbx-a", &t), "another key");
        let mut flipped = t.clone().into_bytes();
        let last = flipped.len() - 1;
        flipped[last] = if flipped[last] == b'0' { b'1' } else { b'0' };
        assert!(!token_matches(
            &w,
            "sbx-a",
            std::str::from_utf8(&flipped).unwrap()
        ));
        assert!(!token_matches(&w, "sbx-a", ""));
        assert!(!token_matches(&w, "sbx-a", &t[..t.len() - 2]));
        let traffic = traffic_token(&w, "sbx-a");
        assert_ne!(traffic, t, "the traffic token is not the envd token");
        assert!(!token_matches(&w, "sbx-a", &traffic));
    }
}
