//! `sandbox.network` (Python `SandboxNetwork`) and `sandbox.fetch`: an HTTP request to a
//! server listening on a port inside the sandbox, with no preview to make first.
//!
//! Blaxel's sandbox API proxies such a request to the port (`/port/{port}/…`). Here it goes
//! through the runtime's preview of that port: an existing one (public: as it is; private:
//! with a token made for this request and revoked once its answer has been read, or dropped),
//! else a private preview made for it, which stays for the next fetch and whose own token is
//! revoked at once (it is none of the sandbox's named previews: `previews.list` does not show
//! it, and a named preview of the port made later replaces it). The request is sent from this
//! program to the preview's URL (the loopback for the embedded engine), without a proxy and
//! without following redirects; the answer is the server's, whatever its status, as Blaxel's
//! SDKs return it. While the request and its answer run, the sandbox counts as active (see
//! [`crate::standby`]).

use std::sync::OnceLock;

use futures::StreamExt;
use serde_json::Value;

use crate::errors::{Result, SandboxAPIError};
use crate::previews::{TOKEN_HEADER, TOKEN_QUERY};
use crate::sandbox::{into_future, Ctx};
use crate::standby::Hold;

/// The most of an answer's body [`FetchBuilder`] holds (the wire protocol streams answers
/// and holds none).
pub const MAX_FETCH_RESPONSE_BYTES: usize = 64 * 1024 * 1024;

/// `sandbox.network`.
#[derive(Debug, Clone)]
pub struct SandboxNetwork {
    ctx: Ctx,
}

impl SandboxNetwork {
    pub(crate) fn new(ctx: Ctx) -> Self {
        SandboxNetwork { ctx }
    }

    /// `network.fetch(port, path="/", method="GET", **kwargs)`: the answer of the server on
    /// `port` in the sandbox (see the module docs). Of httpx's keyword arguments, `headers`,
    /// `content` and `json` are setters.
    pub fn fetch(&self, port: i64) -> FetchBuilder {
        FetchBuilder {
            ctx: self.ctx.clone(),
            port,
            path: "/".into(),
            method: "GET".into(),
            headers: Vec::new(),
            content: Ok(None),
        }
    }
}

/// Builder of `fetch(port, path="/", method="GET", headers=…, content=…, json=…)`.
#[derive(Debug)]
pub struct FetchBuilder {
    ctx: Ctx,
    port: i64,
    path: String,
    method: String,
    headers: Vec<(String, String)>,
    content: Result<Option<Vec<u8>>>,
}

impl FetchBuilder {
    /// `path=` (default `/`; a leading `/` is added when missing; a query may follow).
    pub fn path(mut self, path: impl Into<String>) -> Self {
        self.path = path.into();
        self
    }
    /// `method=` (default `GET`).
    pub fn method(mut self, method: impl Into<String>) -> Self {
        self.method = method.into();
        self
    }
    /// `headers=`: added to the request.
    pub fn headers<K: Into<String>, V: Into<String>>(
        mut self,
        headers: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        self.headers
            .extend(headers.into_iter().map(|(k, v)| (k.into(), v.into())));
        self
    }
    /// `content=`: the request body.
    pub fn content(mut self, content: impl Into<Vec<u8>>) -> Self {
        self.content = Ok(Some(content.into()));
        self
    }
    /// `json=`: the request body as JSON (with `Content-Type: application/json`).
    pub fn json(mut self, value: Value) -> Self {
        self.content = serde_json::to_vec(&value)
            .map(Some)
            .map_err(|e| SandboxAPIError::value_error(format!("json: {e}")));
        self.headers
            .push(("content-type".into(), "application/json".into()));
        self
    }

    async fn run(self) -> Result<FetchResponse> {
        let port = port_of(self.port)?;
        let method = reqwest::Method::from_bytes(self.method.to_ascii_uppercase().as_bytes())
            .map_err(|_| {
                SandboxAPIError::value_error(format!("invalid HTTP method {:?}", self.method))
            })?;
        let mut headers = reqwest::header::HeaderMap::new();
        for (k, v) in &self.headers {
            let name = reqwest::header::HeaderName::from_bytes(k.as_bytes())
                .map_err(|_| SandboxAPIError::value_error(format!("invalid header {k:?}")))?;
            let value = reqwest::header::HeaderValue::from_str(v).map_err(|_| {
                SandboxAPIError::value_error(format!("invalid value of header {k:?}"))
            })?;
            headers.append(name, value);
        }
        let body = self.content?.map(reqwest::Body::from);
        let path = normalized(&self.path);
        let fetched = send(&self.ctx, port, method, &path, headers, body).await?;
        let status_code = i64::from(fetched.response.status().as_u16());
        let headers = fetched
            .response
            .headers()
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect();
        let mut content = Vec::new();
        let mut body = fetched.response.bytes_stream();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| {
                SandboxAPIError::exception(format!("reading the answer from port {port}: {e}"))
            })?;
            if content.len() + chunk.len() > MAX_FETCH_RESPONSE_BYTES {
                return Err(SandboxAPIError::exception(format!(
                    "the answer from port {port} is larger than {MAX_FETCH_RESPONSE_BYTES} bytes"
                )));
            }
            content.extend_from_slice(&chunk);
        }
        drop(fetched.guard);
        Ok(FetchResponse {
            status_code,
            headers,
            content,
        })
    }
}
into_future!(FetchBuilder => FetchResponse);

/// The answer of a fetch (what Python's `httpx.Response` offers of it).
#[derive(Debug, Clone, PartialEq)]
pub struct FetchResponse {
    /// `response.status_code`.
    pub status_code: i64,
    /// `response.headers`, in the order received (names in lowercase).
    pub headers: Vec<(String, String)>,
    /// `response.content`.
    pub content: Vec<u8>,
}

impl FetchResponse {
    /// `response.text` (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.content).into_owned()
    }

    /// `response.json()`.
    pub fn json(&self) -> Result<Value> {
        serde_json::from_slice(&self.content)
            .map_err(|e| SandboxAPIError::value_error(format!("the answer is not JSON: {e}")))
    }

    /// `response.headers[name]`: the first value of header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A port as Blaxel takes it: 1 to 65535.
pub(crate) fn port_of(port: i64) -> Result<u16> {
    u16::try_from(port)
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| SandboxAPIError::response(400, format!("invalid port {port}")))
}

/// `path` with the leading `/` the SDKs add.
fn normalized(path: &str) -> String {
    if path.starts_with('/') {
        path.to_string()
    } else {
        format!("/{path}")
    }
}

/// A fetch under way: the server's answer, whose body is read from `response`, and what must
/// live until it is read.
pub(crate) struct Fetched {
    /// The answer; its body not read yet.
    pub response: reqwest::Response,
    /// Keeps the sandbox active and the request's token valid; revokes the token when
    /// dropped.
    pub guard: FetchGuard,
}

/// See [`Fetched::guard`].
pub(crate) struct FetchGuard {
    _hold: Option<Hold>,
    /// (the sandbox, the port, the token made for this request).
    token: Option<(sandcove::Sandbox, u16, String)>,
}

impl std::fmt::Debug for FetchGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token's value is left out.
        f.debug_struct("FetchGuard")
            .field("token", &self.token.is_some())
            .finish_non_exhaustive()
    }
}

impl Drop for FetchGuard {
    fn drop(&mut self) {
        if let Some((core, port, token)) = self.token.take() {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    let _ = core.revoke_preview_token(port, &token).await;
                });
            }
        }
    }
}

/// Headers never passed on: the connection's own, and the credentials of Blaxel's API.
fn passed_on(name: &reqwest::header::HeaderName) -> bool {
    const HOP_BY_HOP: &[&str] = &[
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    ];
    let name = name.as_str();
    !HOP_BY_HOP.contains(&name) && !name.starts_with("x-blaxel-")
}

/// The headers of an answer that a relay passes on.
#[cfg(feature = "wire")]
pub(crate) fn answer_headers(headers: &reqwest::header::HeaderMap) -> Vec<(String, Vec<u8>)> {
    headers
        .iter()
        .filter(|(k, _)| passed_on(k) || k.as_str() == "content-length")
        .map(|(k, v)| (k.as_str().to_string(), v.as_bytes().to_vec()))
        .collect()
}

/// One client for every fetch: no proxy (the preview is on this machine or the runtime's
/// server), no redirects followed (httpx follows none by default).
fn http() -> Result<&'static reqwest::Client> {
    static CLIENT: OnceLock<std::result::Result<reqwest::Client, String>> = OnceLock::new();
    CLIENT
        .get_or_init(|| {
            reqwest::Client::builder()
                .no_proxy()
                .redirect(reqwest::redirect::Policy::none())
                .connect_timeout(std::time::Duration::from_secs(30))
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| SandboxAPIError::exception(format!("an HTTP client for fetch: {e}")))
}

/// Send `method path_and_query` with `headers` and `body` to the server on `port` in the
/// sandbox of `ctx` (see the module docs).
pub(crate) async fn send(
    ctx: &Ctx,
    port: u16,
    method: reqwest::Method,
    path_and_query: &str,
    headers: reqwest::header::HeaderMap,
    body: Option<reqwest::Body>,
) -> Result<Fetched> {
    let hold = crate::standby::hold(ctx.core.backend(), ctx.core.id()).await;
    let preview = preview_of(&ctx.core, port).await?;
    let mut guard = FetchGuard {
        _hold: hold,
        token: None,
    };
    let mut request = http()?.request(
        method,
        format!("{}{path_and_query}", preview.url.trim_end_matches('/')),
    );
    for (name, value) in headers.iter().filter(|(k, _)| passed_on(k)) {
        request = request.header(name, value);
    }
    if !preview.public {
        let token = ctx
            .core
            .create_preview_token(port, None)
            .await
            .map_err(SandboxAPIError::from)?;
        request = request.header(preview.token_header.as_str(), token.value.as_str());
        guard.token = Some((ctx.core.clone(), port, token.value));
    }
    if let Some(body) = body {
        // A streamed body keeps the length it was sent with: servers that read by it
        // (Python's `http.server`) take no chunked body.
        if let Some(length) = headers.get(reqwest::header::CONTENT_LENGTH) {
            request = request.header(reqwest::header::CONTENT_LENGTH, length);
        }
        request = request.body(body);
    }
    let response = request
        .send()
        .await
        .map_err(|e| SandboxAPIError::response(502, format!("port {port} of the sandbox: {e}")))?;
    Ok(Fetched { response, guard })
}

/// The runtime's preview of `port`, made (private) when there is none.
async fn preview_of(core: &sandcove::Sandbox, port: u16) -> Result<sandcove::Preview> {
    let live = |previews: Vec<sandcove::Preview>| previews.into_iter().find(|p| p.port == port);
    if let Some(p) = live(core.previews().await?) {
        return Ok(p);
    }
    // One program makes one preview of a port at a time (a second would replace the first,
    // and the tokens made for it).
    static MAKING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _making = MAKING.lock().await;
    if let Some(p) = live(core.previews().await?) {
        return Ok(p);
    }
    let made = core
        .expose_port(
            sandcove::PreviewOptions::new(port)
                .public(false)
                .token_header(TOKEN_HEADER)
                .token_query(TOKEN_QUERY),
        )
        .await?;
    // Nobody is handed its own token: each fetch makes one of its own.
    if let Some(token) = &made.token {
        let _ = core.revoke_preview_token(port, &token.value).await;
    }
    Ok(made)
}
