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
//! **Authentication** happens before any handler runs. Control-plane calls must carry the
//! server's API key as `X-API-KEY` (compared in constant time); a missing or wrong key is
//! `401 {"code":401,"message":…}`, which the SDK raises as `AuthenticationException`. envd
//! calls must carry, as `X-Access-Token`, the `envdAccessToken` the control plane returned
//! for that sandbox: an HMAC-SHA256 of the sandbox id under the server's API key, so it is
//! kept nowhere (nothing in the sandbox can read or rewrite it), survives a server restart,
//! and one sandbox's token opens no other sandbox. A wrong or missing token is
//! `401 {"code":"unauthenticated",…}`. The code interpreter takes the same `X-Access-Token`,
//! or the sandbox's `trafficAccessToken` (another HMAC, under a different label) as
//! `E2B-Traffic-Access-Token`: the SDKs send the envd token only with `/execute` and the
//! traffic token with every code-interpreter call.
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
mod watchers;

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use sandcove::Backend;
use tower::ServiceExt;

use crate::errors::SandboxException;

/// The envd port E2B's SDKs name in `E2b-Sandbox-Port`.
pub const ENVD_PORT: &str = "49983";
/// The code interpreter's port.
pub const CODE_INTERPRETER_PORT: &str = "49999";
/// The envd version advertised: the highest whose SDK-gated features are served (stdin,
/// default user, `close_stdin`, octet-stream uploads, the watch's `entry` and network-mounts
/// flag). File metadata (0.6.2) then reaches the server, which refuses it (`file_metadata`)
/// before writing anything, instead of the SDK raising a version error.
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
}

impl Wire {
    /// The `envdAccessToken` of sandbox `id`.
    pub fn envd_token(&self, id: &str) -> String {
        envd_token(&self.tokens, id)
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
        watchers: Arc::default(),
        cells: Arc::default(),
        host_requests: Arc::default(),
    };
    let interpreter = interpreter::routes()
        .with_state(wire.clone())
        .layer(axum::extract::DefaultBodyLimit::max(body_limit));
    control::routes()
        .merge(envd::routes())
        .fallback(not_found)
        .with_state(wire.clone())
        .layer(axum::extract::DefaultBodyLimit::max(body_limit))
        .layer(middleware::from_fn_with_state(
            (wire, interpreter),
            authenticate,
        ))
}

pub(crate) async fn not_found(request: Request) -> Response {
    let path = request.uri().path();
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

/// Constant-time equality of two byte strings (length is not secret).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn authenticate(
    State((wire, interpreter)): State<(Wire, Router)>,
    mut request: Request,
    next: Next,
) -> Response {
    let headers = request.headers();
    let mut sandbox = header_str(headers, "e2b-sandbox-id").map(str::to_string);
    // `get_host(port)`: `Host: {port}-{id}.{domain}` goes to that port in the sandbox.
    if sandbox.is_none() {
        if let Some((port, id)) = header_str(headers, "host").and_then(ports::host_target) {
            return ports::forward(&wire, port, &id, request).await;
        }
    }
    if sandbox.is_none() && request.uri().path() == "/files" {
        // A URL from `download_url`/`upload_url`: no headers, a signature in the query.
        let (method, uri) = (request.method().clone(), request.uri().clone());
        match signed_file_url(&wire, &method, &uri).await {
            Ok(Some((id, signed))) => {
                request.extensions_mut().insert(SandboxId(id));
                // What the signature covers: the handlers act on exactly that.
                request.extensions_mut().insert(signed);
                return next.run(request).await;
            }
            Ok(None) => {}
            Err(e) => return e.into_response(),
        }
    }
    let headers = request.headers();
    if sandbox.is_some() || is_envd_path(request.uri().path()) {
        let Some(id) = sandbox.take() else {
            return connect::ConnectError::new(
                connect::Code::Unauthenticated,
                "missing E2b-Sandbox-Id header",
            )
            .into_response();
        };
        let port = header_str(headers, "e2b-sandbox-port");
        let token = header_str(headers, "x-access-token").unwrap_or("");
        let mut valid = token_matches(&wire.tokens, &id, token);
        if port == Some(CODE_INTERPRETER_PORT) && !valid {
            let traffic = header_str(headers, "e2b-traffic-access-token").unwrap_or("");
            valid = token_matches(&wire.tokens, &format!("traffic\0{id}"), traffic);
        }
        if !valid {
            return connect::ConnectError::new(
                connect::Code::Unauthenticated,
                "invalid or missing X-Access-Token for this sandbox",
            )
            .into_response();
        }
        match port {
            None | Some(ENVD_PORT) => {}
            Some(CODE_INTERPRETER_PORT) => {
                request.extensions_mut().insert(SandboxId(id));
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
        request.extensions_mut().insert(SandboxId(id));
        return next.run(request).await;
    }
    let key = header_str(headers, "x-api-key").unwrap_or("");
    if key.is_empty() || !constant_time_eq(key.as_bytes(), wire.config.api_key.as_bytes()) {
        let mut response = control::api_error(
            StatusCode::UNAUTHORIZED,
            "Invalid API key: X-API-KEY must be the server's SANDCOVE_API_KEY".to_string(),
        );
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("X-API-KEY"),
        );
        return response;
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

/// What a signed `/files` URL authorises, inserted into the request's extensions when its
/// signature let the request in: one operation on one path as one user. The `/files`
/// handlers then read or write exactly that path as that user, and an upload carries exactly
/// one file.
#[derive(Debug, Clone)]
pub(crate) struct SignedFileUrl {
    /// The signed path.
    pub path: String,
    /// `read` or `write`.
    pub operation: &'static str,
    /// The signed user (empty: the sandbox's default).
    pub user: String,
}

/// The sandbox a signed `/files` URL (`download_url`, `upload_url`) was made for: the one
/// whose envd token gives the URL's signature for this path, operation (`GET` reads, `POST`
/// writes) and user, not expired, with what it authorises. `None` when the URL carries no
/// signature (the request is then judged by its headers); an error when it carries one that
/// matches no sandbox.
async fn signed_file_url(
    wire: &Wire,
    method: &axum::http::Method,
    uri: &axum::http::Uri,
) -> Result<Option<(String, SignedFileUrl)>, connect::ConnectError> {
    let Ok(axum::extract::Query(q)) = axum::extract::Query::<SignedQuery>::try_from_uri(uri) else {
        return Ok(None);
    };
    let Some(signature) = q.signature else {
        return Ok(None);
    };
    let refused = || {
        connect::ConnectError::new(
            connect::Code::Unauthenticated,
            "invalid or expired file URL signature",
        )
    };
    let operation = match *method {
        axum::http::Method::GET => "read",
        axum::http::Method::POST => "write",
        _ => return Err(refused()),
    };
    if let Some(expiration) = &q.signature_expiration {
        let at: u64 = expiration.parse().map_err(|_| refused())?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(u64::MAX);
        if now > at {
            return Err(refused());
        }
    }
    let path = q.path.unwrap_or_default();
    let user = q.username.unwrap_or_default();
    let sandboxes = wire.client.list(Default::default()).await?;
    for info in sandboxes {
        let expected = file_signature(
            &path,
            operation,
            &user,
            &wire.envd_token(&info.id),
            q.signature_expiration.as_deref(),
        );
        if constant_time_eq(expected.as_bytes(), signature.as_bytes()) {
            let signed = SignedFileUrl {
                path,
                operation,
                user,
            };
            return Ok(Some((info.id, signed)));
        }
    }
    Err(refused())
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
