//! [`HttpBackend`]: the [`Backend`] trait over HTTP, talking to a `sandcove serve`
//! (crate `sandcove-server`). The wire contract both sides speak is
//! [`sandcove_core::wire`]; it is re-exported here.
//!
//! # Retries and timeouts
//!
//! Connection failures and `429` (honouring `Retry-After`) are retried for every call whose
//! body can be replayed; `5xx` answers and other transport failures only for idempotent calls
//! (`GET`, `PUT`, `DELETE`, and creates, which carry an [`IDEMPOTENCY_HEADER`] the server
//! remembers so a retried create never makes a second sandbox). Every call with a remote
//! effect (creates, forks, snapshots, volumes, preview tokens, destroys and deletes, process
//! starts, file writes and uploads, mkdir, remove, rename, copy, chmod) carries its
//! [`OperationId`](sandcove_core::OperationId) in that header; when such a request
//! was sent and its answer lost (a broken connection, a timeout waiting for the answer) the
//! call fails with [`Error::OutcomeUnknown`] naming it, and `GET /v1/operations/{op}` (what
//! [`Backend::observe`] asks) says what became of it. Control calls have a total
//! timeout; streaming calls time out only while waiting for the response head, never while
//! the stream runs.

#![forbid(unsafe_code)]

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use futures::{Stream, StreamExt};
use reqwest::{Method, StatusCode, Url};
use serde::de::DeserializeOwned;
use serde::Serialize;

use sandcove_core::{Backend, ByteStream, ProcessStream, WatchStream};
use sandcove_core::{
    Capabilities, CreateOptions, Error, ErrorBody, FileStat, FsEvent, ListDirOptions, ListOptions,
    Metrics, MkdirOptions, Preview, PreviewOptions, PreviewToken, ProcessEvent, ProcessInfo,
    ProcessSelector, ProcessSpec, PtySize, RemoveOptions, Result, SandboxInfo, Signal,
    SnapshotInfo, VolumeInfo, WatchOptions, WriteOptions,
};
use sandcove_core::{CopyOptions, ReadOptions, RenameOptions, StatOptions};

/// The wire contract, shared with the server.
pub use sandcove_core::wire::*;

/// Timeouts and retry policy of an [`HttpBackend`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct HttpOptions {
    /// Total time for a control call, and the time to wait for the response head of a
    /// streaming call (never applied to the stream itself).
    pub request_timeout: Duration,
    /// Time to establish a connection.
    pub connect_timeout: Duration,
    /// Retries after the first attempt (see the module docs for which failures qualify).
    pub max_retries: u32,
    /// First backoff; doubled per retry up to [`HttpOptions::max_backoff`].
    pub backoff: Duration,
    /// Longest wait between attempts, `Retry-After` included.
    pub max_backoff: Duration,
}

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions {
            request_timeout: Duration::from_secs(120),
            connect_timeout: Duration::from_secs(10),
            max_retries: 4,
            backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(30),
        }
    }
}

/// A [`Backend`] served by a remote `sandcove serve`. Cheap to clone.
#[derive(Clone)]
pub struct HttpBackend {
    base: Url,
    api_key: Arc<str>,
    http: reqwest::Client,
    options: HttpOptions,
    caps: Arc<OnceLock<Capabilities>>,
}

/// Env var naming a PEM file of the certificates that alone are trusted to sign the
/// server's certificate (a private CA, or the server's self-signed certificate).
pub const CA_FILE_ENV: &str = "SANDCOVE_CA_FILE";
/// Env var that, set to `1`, allows plain `http://` to a non-loopback server.
pub const ALLOW_INSECURE_HTTP_ENV: &str = "SANDCOVE_ALLOW_INSECURE_HTTP";
/// Largest CA file read.
const MAX_CA_FILE_BYTES: u64 = 1024 * 1024;

/// Whether `url` names this host's loopback.
fn is_loopback(url: &Url) -> bool {
    let Some(host) = url.host_str() else {
        return false;
    };
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    match bare.parse::<std::net::IpAddr>() {
        Ok(ip) => ip.is_loopback(),
        Err(_) => host.eq_ignore_ascii_case("localhost"),
    }
}

/// The PEM certificates in `path` (bounded read; at least one).
fn load_ca_file(path: &std::path::Path) -> Result<Vec<reqwest::Certificate>> {
    use std::io::Read;
    let what = format!("{CA_FILE_ENV} {}", path.display());
    let file = std::fs::File::open(path).map_err(|e| Error::from_io(&e, &what))?;
    let mut pem = Vec::new();
    file.take(MAX_CA_FILE_BYTES + 1)
        .read_to_end(&mut pem)
        .map_err(|e| Error::from_io(&e, &what))?;
    if pem.len() as u64 > MAX_CA_FILE_BYTES {
        return Err(Error::invalid(format!(
            "{what}: larger than {MAX_CA_FILE_BYTES} bytes"
        )));
    }
    let certs = reqwest::Certificate::from_pem_bundle(&pem)
        .map_err(|e| Error::invalid(format!("{what}: {e}")))?;
    if certs.is_empty() {
        return Err(Error::invalid(format!("{what}: no PEM certificate")));
    }
    Ok(certs)
}

/// The HTTP client: rustls, with only `roots` trusted when given.
fn client(
    options: &HttpOptions,
    roots: Option<&Vec<reqwest::Certificate>>,
) -> Result<reqwest::Client> {
    let mut builder = reqwest::Client::builder()
        .use_rustls_tls()
        .connect_timeout(options.connect_timeout);
    if let Some(roots) = roots {
        builder = builder.tls_built_in_root_certs(false);
        for cert in roots {
            builder = builder.add_root_certificate(cert.clone());
        }
    }
    builder
        .build()
        .map_err(|e| Error::backend(format!("HTTP client: {e}")))
}

impl std::fmt::Debug for HttpBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The API key is deliberately left out.
        f.debug_struct("HttpBackend")
            .field("url", &self.base.as_str())
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// How a call may be retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Retry {
    /// Replaying it is harmless: retry 5xx and transport failures too.
    Idempotent,
    /// Retry only what cannot have had an effect: refused connections and 429.
    Unsafe,
}

/// One logical request, sent (and maybe retried) by `HttpBackend::send`.
struct Req<'a> {
    method: Method,
    url: Url,
    query: &'a [(&'a str, String)],
    payload: Payload,
    idempotency_key: Option<&'a str>,
    retry: Retry,
    /// The answer is a stream: time out on its head only.
    stream: bool,
}

/// A request body that can be replayed on retry.
enum Payload {
    None,
    Json(Vec<u8>),
    Raw(Vec<u8>),
}

impl HttpBackend {
    /// A backend for the server at `url` (e.g. `http://127.0.0.1:8730`) with default
    /// [`HttpOptions`]. Nothing is sent yet; [`Backend::capabilities`] fetches the server's
    /// capabilities on first use (see [`HttpBackend::connect`] to fetch them up front).
    pub fn new(url: &str, api_key: &str) -> Result<Self> {
        Self::with_options(url, api_key, HttpOptions::default())
    }

    /// Like [`HttpBackend::new`] with explicit timeouts and retry policy.
    ///
    /// An `http://` URL must name a loopback host (`127.0.0.0/8`, `::1`, `localhost`): the
    /// API key would otherwise cross the network in clear text. Anything else needs
    /// `https://`, or [`ALLOW_INSECURE_HTTP_ENV`]`=1` to accept the risk. Over https the
    /// server is verified against the system's roots (`SSL_CERT_FILE` and `SSL_CERT_DIR`
    /// are honoured), or only against the PEM certificates in [`CA_FILE_ENV`] when set.
    pub fn with_options(url: &str, api_key: &str, options: HttpOptions) -> Result<Self> {
        let base =
            Url::parse(url).map_err(|e| Error::invalid(format!("server URL {url:?}: {e}")))?;
        if base.cannot_be_a_base() || base.host().is_none() {
            return Err(Error::invalid(format!("server URL {url:?} has no host")));
        }
        match base.scheme() {
            "https" => {}
            "http" if is_loopback(&base) => {}
            "http" if std::env::var(ALLOW_INSECURE_HTTP_ENV).is_ok_and(|v| v == "1") => {}
            "http" => {
                return Err(Error::invalid(format!(
                    "server URL {url:?}: plain http beyond loopback would send the API key in \
                     clear text; serve TLS (`sandcove serve --tls-cert FILE --tls-key FILE`) and \
                     use https://, or set {ALLOW_INSECURE_HTTP_ENV}=1 to accept the risk"
                )))
            }
            other => {
                return Err(Error::invalid(format!(
                    "server URL {url:?}: scheme {other:?} is not http or https"
                )))
            }
        }
        let roots = match std::env::var_os(CA_FILE_ENV) {
            Some(path) => Some(load_ca_file(std::path::Path::new(&path))?),
            None => None,
        };
        let http = client(&options, roots.as_ref())?;
        Ok(HttpBackend {
            base,
            api_key: api_key.into(),
            http,
            options,
            caps: Arc::new(OnceLock::new()),
        })
    }

    /// Connect to the server at `url`: checks the key and caches the server's capabilities.
    pub async fn connect(url: &str, api_key: &str) -> Result<Self> {
        let backend = Self::new(url, api_key)?;
        backend.refresh_capabilities().await?;
        Ok(backend)
    }

    /// The server's base URL.
    pub fn url(&self) -> &str {
        self.base.as_str()
    }

    /// Fetch the server's capabilities (and cache them if none are cached yet).
    pub async fn refresh_capabilities(&self) -> Result<Capabilities> {
        let caps = fetch_capabilities(self, &self.http).await?;
        let _ = self.caps.set(caps.clone());
        Ok(caps)
    }

    /// The URL of the API path `segments`. A segment the URL would not keep as one path
    /// segment (`""`, `.`, `..`: a URL drops or folds those, sending the call to another route
    /// or another sandbox) names nothing, so it is `NotFound` before any request.
    fn url_for(&self, segments: &[&str]) -> Result<Url> {
        if let Some(bad) = segments.iter().find(|s| matches!(**s, "" | "." | "..")) {
            let what = segments.first().copied().unwrap_or("path");
            return Err(Error::not_found(format!("{what} entry {bad:?}")));
        }
        let mut url = self.base.clone();
        {
            let mut path = url
                .path_segments_mut()
                .expect("checked at construction: a base URL");
            path.pop_if_empty();
            path.extend(API_PREFIX.trim_start_matches('/').split('/'));
            path.extend(segments);
        }
        Ok(url)
    }

    fn sandbox_url(&self, id: &str, rest: &[&str]) -> Result<Url> {
        let mut segments = vec!["sandboxes", id];
        segments.extend_from_slice(rest);
        self.url_for(&segments)
    }

    /// Send a request, retrying per `retry`, and return the successful response. `stream`
    /// responses get a timeout on their head only.
    async fn send(&self, req: Req<'_>) -> Result<reqwest::Response> {
        let Req {
            method,
            url,
            query,
            payload,
            idempotency_key,
            retry,
            stream,
        } = req;
        let mut attempt = 0u32;
        loop {
            let mut request = self
                .http
                .request(method.clone(), url.clone())
                .bearer_auth(&*self.api_key);
            if !query.is_empty() {
                request = request.query(query);
            }
            if let Some(key) = idempotency_key {
                request = request.header(IDEMPOTENCY_HEADER, key);
            }
            request = match &payload {
                Payload::None => request,
                Payload::Json(body) => request
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(body.clone()),
                Payload::Raw(body) => request
                    .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
                    .body(body.clone()),
            };
            if !stream {
                request = request.timeout(self.options.request_timeout);
            }
            let sent = if stream {
                match tokio::time::timeout(self.options.request_timeout, request.send()).await {
                    Ok(result) => result,
                    Err(_) => {
                        let err = Error::Timeout {
                            what: format!("{method} {}", url.path()),
                        };
                        if retry == Retry::Idempotent && attempt < self.options.max_retries {
                            self.backoff(attempt, None).await;
                            attempt += 1;
                            continue;
                        }
                        return Err(outcome_lost(err, idempotency_key));
                    }
                }
            } else {
                request.send().await
            };
            // `lost`: the request may have reached the server, and its answer did not arrive.
            let (err, retryable, retry_after, lost) = match sent {
                Ok(response) if response.status().is_success() => return Ok(response),
                Ok(response) => {
                    let status = response.status();
                    let err = read_error(response, self.options.request_timeout).await;
                    let retry_after = match &err {
                        Error::RateLimited { retry_after_ms, .. } => *retry_after_ms,
                        _ => None,
                    };
                    let retryable = status == StatusCode::TOO_MANY_REQUESTS
                        || (status.is_server_error()
                            && retry == Retry::Idempotent
                            && err.is_retryable());
                    (err, retryable, retry_after, false)
                }
                Err(e) => {
                    let retryable = e.is_connect() || retry == Retry::Idempotent;
                    let lost = !(e.is_connect() || e.is_builder());
                    (transport_error(&e, &method, &url), retryable, None, lost)
                }
            };
            if !retryable || attempt >= self.options.max_retries {
                return Err(if lost {
                    outcome_lost(err, idempotency_key)
                } else {
                    err
                });
            }
            self.backoff(attempt, retry_after).await;
            attempt += 1;
        }
    }

    async fn backoff(&self, attempt: u32, retry_after_ms: Option<u64>) {
        let exp = self
            .options
            .backoff
            .saturating_mul(1u32 << attempt.min(16))
            .min(self.options.max_backoff);
        let wait = match retry_after_ms {
            Some(ms) => Duration::from_millis(ms).min(self.options.max_backoff),
            None => exp,
        };
        tokio::time::sleep(wait).await;
    }

    /// A JSON call: send `body` (if any), decode the JSON answer.
    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        url: Url,
        query: &[(&str, String)],
        body: Option<&(impl Serialize + ?Sized)>,
        retry: Retry,
    ) -> Result<T> {
        let payload = match body {
            Some(b) => Payload::Json(to_json(b)?),
            None => Payload::None,
        };
        let response = self
            .send(Req {
                method,
                url,
                query,
                payload,
                idempotency_key: None,
                retry,
                stream: false,
            })
            .await?;
        decode_json(response).await
    }

    /// A JSON call whose answer carries nothing.
    async fn call_unit(
        &self,
        method: Method,
        url: Url,
        query: &[(&str, String)],
        payload: Payload,
        retry: Retry,
    ) -> Result<()> {
        let response = self
            .send(Req {
                method,
                url,
                query,
                payload,
                idempotency_key: None,
                retry,
                stream: false,
            })
            .await?;
        // Drain the (empty) body so the connection returns to the pool.
        let _ = response.bytes().await;
        Ok(())
    }

    /// A create: a `POST` carrying its operation id (the scope's, or a fresh one) as the
    /// idempotency key, retried like an idempotent call.
    async fn create_call<T: DeserializeOwned>(
        &self,
        url: Url,
        body: &(impl Serialize + ?Sized),
    ) -> Result<T> {
        self.op_call(Method::POST, url, &[], Payload::Json(to_json(body)?))
            .await
    }

    /// A call with a remote effect (a create, a file change): it carries its operation id
    /// (the scope's, or a fresh one) as the idempotency key, so it is retried like an
    /// idempotent call (the server answers a replay with the first outcome), and an answer
    /// lost after it was sent is [`Error::OutcomeUnknown`] naming the id.
    async fn op_call<T: DeserializeOwned>(
        &self,
        method: Method,
        url: Url,
        query: &[(&str, String)],
        payload: Payload,
    ) -> Result<T> {
        let key = sandcove_core::OperationId::current_or_new();
        let response = self
            .send(Req {
                method,
                url,
                query,
                payload,
                idempotency_key: Some(key.as_str()),
                retry: Retry::Idempotent,
                stream: false,
            })
            .await?;
        decode_json(response)
            .await
            .map_err(|e| outcome_lost(e, Some(key.as_str())))
    }

    /// A destroy or delete: a `DELETE` carrying its operation id, so a replay after a lost
    /// answer gets the first one's outcome instead of "not found".
    async fn delete_call(&self, url: Url, query: &[(&str, String)]) -> Result<()> {
        let key = sandcove_core::OperationId::current_or_new();
        let target = url.clone();
        let response = self
            .send(Req {
                method: Method::DELETE,
                url,
                query,
                payload: Payload::None,
                idempotency_key: Some(key.as_str()),
                retry: Retry::Idempotent,
                stream: false,
            })
            .await?;
        response.bytes().await.map(drop).map_err(|e| {
            outcome_lost(
                transport_error(&e, &Method::DELETE, &target),
                Some(key.as_str()),
            )
        })
    }

    async fn process_stream(&self, response: reqwest::Response) -> Result<ProcessStream> {
        let pid = response
            .headers()
            .get(PID_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u32>().ok())
            .ok_or_else(|| {
                Error::backend(format!("process stream without a {PID_HEADER} header"))
            })?;
        Ok(ProcessStream {
            pid,
            events: Box::pin(process_events(frames(response))),
        })
    }
}

/// A file call's query with the `user` parameter when one is named.
fn with_user(
    mut query: Vec<(&'static str, String)>,
    user: Option<String>,
) -> Vec<(&'static str, String)> {
    if let Some(user) = user {
        query.push(("user", user));
    }
    query
}

fn to_json(body: &(impl Serialize + ?Sized)) -> Result<Vec<u8>> {
    serde_json::to_vec(body).map_err(|e| Error::invalid(format!("cannot encode request: {e}")))
}

async fn decode_json<T: DeserializeOwned>(response: reqwest::Response) -> Result<T> {
    let url = response.url().path().to_string();
    let bytes = response.bytes().await.map_err(|e| Error::Backend {
        message: format!("reading the answer of {url}: {e}"),
        retryable: true,
    })?;
    serde_json::from_slice(&bytes)
        .map_err(|e| Error::backend(format!("undecodable answer from {url}: {e}")))
}

async fn read_error(response: reqwest::Response, limit: Duration) -> Error {
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = match tokio::time::timeout(limit, response.bytes()).await {
        Ok(Ok(bytes)) => bytes.to_vec(),
        _ => Vec::new(),
    };
    error_from_response(status, retry_after.as_deref(), &body)
}

fn transport_error(e: &reqwest::Error, method: &Method, url: &Url) -> Error {
    let what = format!("{method} {}", url.path());
    if e.is_timeout() {
        Error::Timeout { what }
    } else if e.is_connect() {
        Error::Unavailable {
            reason: format!(
                "cannot reach the sandcove server at {}: {}",
                url.origin().ascii_serialization(),
                error_chain(e)
            ),
            remedy: "start `sandcove serve` there, or fix SANDCOVE_URL".into(),
        }
    } else {
        Error::Backend {
            message: format!("{what}: {}", error_chain(e)),
            retryable: true,
        }
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// `err`, met after a request carrying operation `key` may have taken effect, as
/// [`Error::OutcomeUnknown`]; without a key (a call without a remote effect) unchanged.
fn outcome_lost(err: Error, key: Option<&str>) -> Error {
    match key {
        Some(operation) => Error::OutcomeUnknown {
            operation: operation.to_string(),
            message: format!(
                "the request was sent and its answer was lost ({err}); observe the operation, or \
                 run the call again under the same operation id"
            ),
        },
        None => err,
    }
}

async fn fetch_capabilities(backend: &HttpBackend, http: &reqwest::Client) -> Result<Capabilities> {
    let url = backend.url_for(&["capabilities"])?;
    let response = http
        .get(url.clone())
        .bearer_auth(&*backend.api_key)
        .timeout(backend.options.request_timeout)
        .send()
        .await
        .map_err(|e| transport_error(&e, &Method::GET, &url))?;
    if !response.status().is_success() {
        return Err(read_error(response, backend.options.request_timeout).await);
    }
    let mut caps: Capabilities = decode_json(response).await?;
    caps.backend = format!("http+{}", caps.backend);
    // Observed now, by this client: the server's own probe time says nothing about whether
    // it is still reachable.
    caps.observed_at = Some(sandcove_core::now_millis());
    Ok(caps)
}

/// The capabilities reported before the server was asked: nothing optional.
fn unknown_capabilities() -> Capabilities {
    Capabilities::none("http+unknown")
}

/// One decoded frame, or the reason the body broke off.
type Frame = Result<(u8, Vec<u8>)>;

/// The frames of a streamed response. A transport failure, or a body ending inside a frame,
/// yields an error item; a clean end of body just ends the stream (the caller knows whether
/// its terminal frame came).
fn frames(response: reqwest::Response) -> impl Stream<Item = Frame> + Send {
    struct State<S> {
        body: S,
        decoder: frame::Decoder,
        done: bool,
    }
    let state = State {
        body: Box::pin(response.bytes_stream()),
        decoder: frame::Decoder::default(),
        done: false,
    };
    futures::stream::unfold(state, |mut st| async move {
        if st.done {
            return None;
        }
        loop {
            match st.decoder.next_frame() {
                Ok(Some(f)) => return Some((Ok(f), st)),
                Ok(None) => {}
                Err(e) => {
                    st.done = true;
                    return Some((Err(Error::backend(format!("bad frame stream: {e}"))), st));
                }
            }
            match st.body.next().await {
                Some(Ok(chunk)) => st.decoder.push(&chunk),
                Some(Err(e)) => {
                    st.done = true;
                    return Some((Err(cut(&format!(": {}", error_chain(&e)))), st));
                }
                None => {
                    st.done = true;
                    if st.decoder.pending() > 0 {
                        return Some((Err(cut(" inside a frame")), st));
                    }
                    return None;
                }
            }
        }
    })
}

fn cut(how: &str) -> Error {
    Error::Backend {
        message: format!("stream from the server was cut{how}"),
        retryable: true,
    }
}

fn frame_error(payload: &[u8]) -> Error {
    match serde_json::from_slice::<ErrorBody>(payload) {
        Ok(body) => Error::from_body(&body),
        Err(e) => Error::backend(format!("undecodable error frame: {e}")),
    }
}

/// Frames → process events, ending after `Exit`; anything else ends with an error.
fn process_events(
    frames: impl Stream<Item = Frame> + Send + 'static,
) -> impl Stream<Item = Result<ProcessEvent>> + Send {
    let frames = Box::pin(frames);
    futures::stream::unfold(Some(frames), |state| async move {
        let mut frames = state?;
        let item = match frames.next().await {
            None => Err(cut(" before the process exited")),
            Some(Err(e)) => Err(e),
            Some(Ok((frame::STDOUT, bytes))) => Ok(ProcessEvent::Stdout(bytes)),
            Some(Ok((frame::STDERR, bytes))) => Ok(ProcessEvent::Stderr(bytes)),
            Some(Ok((frame::JSON, json))) => serde_json::from_slice::<ProcessEvent>(&json)
                .map_err(|e| Error::backend(format!("undecodable process event: {e}"))),
            Some(Ok((frame::ERROR, body))) => Err(frame_error(&body)),
            Some(Ok((kind, _))) => Err(Error::backend(format!(
                "unexpected frame {:?} in a process stream",
                kind as char
            ))),
        };
        let next = match &item {
            Ok(ProcessEvent::Exit(_)) | Err(_) => None,
            Ok(_) => Some(frames),
        };
        Some((item, next))
    })
}

/// Frames → file chunks, ending at the end frame; anything else ends with an error.
fn download(frames: impl Stream<Item = Frame> + Send + 'static) -> ByteStream {
    let frames = Box::pin(frames);
    Box::pin(futures::stream::unfold(Some(frames), |state| async move {
        let mut frames = state?;
        match frames.next().await {
            None => Some((Err(cut(" before the end of the file")), None)),
            Some(Err(e)) => Some((Err(e), None)),
            Some(Ok((frame::DATA, bytes))) => Some((Ok(bytes), Some(frames))),
            Some(Ok((frame::END, _))) => None,
            Some(Ok((frame::ERROR, body))) => Some((Err(frame_error(&body)), None)),
            Some(Ok((kind, _))) => Some((
                Err(Error::backend(format!(
                    "unexpected frame {:?} in a download",
                    kind as char
                ))),
                None,
            )),
        }
    }))
}

/// Frames → filesystem events; a stream ending without the end frame ends with an error.
fn watch_events(frames: impl Stream<Item = Frame> + Send + 'static) -> WatchStream {
    let frames = Box::pin(frames);
    Box::pin(futures::stream::unfold(Some(frames), |state| async move {
        let mut frames = state?;
        match frames.next().await {
            None => Some((Err(cut(" while watching")), None)),
            Some(Err(e)) => Some((Err(e), None)),
            Some(Ok((frame::JSON, json))) => match serde_json::from_slice::<FsEvent>(&json) {
                Ok(ev) => Some((Ok(ev), Some(frames))),
                Err(e) => Some((
                    Err(Error::backend(format!("undecodable watch event: {e}"))),
                    None,
                )),
            },
            Some(Ok((frame::END, _))) => None,
            Some(Ok((frame::ERROR, body))) => Some((Err(frame_error(&body)), None)),
            Some(Ok((kind, _))) => Some((
                Err(Error::backend(format!(
                    "unexpected frame {:?} in a watch",
                    kind as char
                ))),
                None,
            )),
        }
    }))
}

/// Query parameters naming a process.
fn selector_query(process: &ProcessSelector) -> Vec<(&'static str, String)> {
    match process {
        ProcessSelector::Pid(pid) => vec![("pid", pid.to_string())],
        ProcessSelector::Tag(tag) => vec![("tag", tag.clone())],
    }
}

#[async_trait]
impl Backend for HttpBackend {
    /// The server's backend's capabilities (named `http+<backend>`). Fetched by
    /// [`HttpBackend::connect`]; otherwise fetched here on first use, blocking the calling
    /// thread for one request. While the server cannot be reached, nothing optional is
    /// reported, with `observed_at: None` (no evidence, not "no feature": see
    /// `Client::check_create`), and the next call asks again.
    fn capabilities(&self) -> Capabilities {
        self.caps
            .get()
            .cloned()
            .unwrap_or_else(unknown_capabilities)
    }

    async fn ready(&self) -> Result<Capabilities> {
        match self.caps.get() {
            Some(caps) => Ok(caps.clone()),
            None => self.refresh_capabilities().await,
        }
    }

    async fn create(&self, options: CreateOptions) -> Result<SandboxInfo> {
        options.validate()?;
        self.create_call(self.url_for(&["sandboxes"])?, &options)
            .await
    }

    async fn get(&self, id: &str) -> Result<SandboxInfo> {
        let url = self.sandbox_url(id, &[])?;
        self.call(Method::GET, url, &[], None::<&()>, Retry::Idempotent)
            .await
    }

    async fn list(&self, options: ListOptions) -> Result<Vec<SandboxInfo>> {
        let filter = String::from_utf8(to_json(&options)?).expect("JSON is UTF-8");
        let url = self.url_for(&["sandboxes"])?;
        self.call(
            Method::GET,
            url,
            &[("filter", filter)],
            None::<&()>,
            Retry::Idempotent,
        )
        .await
    }

    async fn set_timeout(&self, id: &str, timeout: Duration) -> Result<SandboxInfo> {
        sandcove_core::validate::validate_sandbox_timeout(timeout)?;
        let url = self.sandbox_url(id, &["timeout"])?;
        let body = body::SetTimeout {
            timeout: timeout.as_secs_f64(),
        };
        self.call(Method::PUT, url, &[], Some(&body), Retry::Idempotent)
            .await
    }

    async fn set_labels(
        &self,
        id: &str,
        labels: std::collections::BTreeMap<String, String>,
    ) -> Result<SandboxInfo> {
        sandcove_core::validate::validate_labels(&labels)?;
        let url = self.sandbox_url(id, &["labels"])?;
        let body = body::SetLabels { labels };
        self.call(Method::PUT, url, &[], Some(&body), Retry::Idempotent)
            .await
    }

    async fn update_annotations(
        &self,
        id: &str,
        update: sandcove_core::AnnotationUpdate,
    ) -> Result<std::collections::BTreeMap<String, String>> {
        update.validate()?;
        let url = self.sandbox_url(id, &["annotations"])?;
        // Not replayed after it may have run: a repeated compare-and-set would fail.
        self.call(Method::POST, url, &[], Some(&update), Retry::Unsafe)
            .await
    }

    async fn destroy(&self, id: &str) -> Result<()> {
        self.delete_call(self.sandbox_url(id, &[])?, &[]).await
    }

    async fn spawn(&self, id: &str, spec: ProcessSpec) -> Result<ProcessStream> {
        spec.validate()?;
        let url = self.sandbox_url(id, &["processes"])?;
        // The operation id lets a server answer a replayed start by attaching to the process
        // the first one started; the call is still not retried blindly here.
        let key = sandcove_core::OperationId::current_or_new();
        let response = self
            .send(Req {
                method: Method::POST,
                url,
                query: &[],
                payload: Payload::Json(to_json(&spec)?),
                idempotency_key: Some(key.as_str()),
                retry: Retry::Unsafe,
                stream: true,
            })
            .await?;
        self.process_stream(response).await
    }

    async fn attach(&self, id: &str, process: ProcessSelector) -> Result<ProcessStream> {
        let url = self.sandbox_url(id, &["processes", "attach"])?;
        let response = self
            .send(Req {
                method: Method::GET,
                url,
                query: &selector_query(&process),
                payload: Payload::None,
                idempotency_key: None,
                retry: Retry::Idempotent,
                stream: true,
            })
            .await?;
        self.process_stream(response).await
    }

    async fn write_stdin(&self, id: &str, process: ProcessSelector, data: Vec<u8>) -> Result<()> {
        let url = self.sandbox_url(id, &["processes", "stdin"])?;
        self.call_unit(
            Method::POST,
            url,
            &selector_query(&process),
            Payload::Raw(data),
            Retry::Unsafe,
        )
        .await
    }

    async fn close_stdin(&self, id: &str, process: ProcessSelector) -> Result<()> {
        let url = self.sandbox_url(id, &["processes", "stdin", "close"])?;
        self.call_unit(
            Method::POST,
            url,
            &selector_query(&process),
            Payload::None,
            Retry::Unsafe,
        )
        .await
    }

    async fn signal(&self, id: &str, process: ProcessSelector, signal: Signal) -> Result<()> {
        let url = self.sandbox_url(id, &["processes", "signal"])?;
        let body = to_json(&body::SignalBody { signal })?;
        self.call_unit(
            Method::POST,
            url,
            &selector_query(&process),
            Payload::Json(body),
            Retry::Unsafe,
        )
        .await
    }

    async fn list_processes(&self, id: &str) -> Result<Vec<ProcessInfo>> {
        let url = self.sandbox_url(id, &["processes"])?;
        self.call(Method::GET, url, &[], None::<&()>, Retry::Idempotent)
            .await
    }

    async fn read_file(&self, id: &str, path: &str, options: ReadOptions) -> Result<ByteStream> {
        let url = self.sandbox_url(id, &["files"])?;
        let mut query = with_user(vec![("path", path.to_string())], options.user);
        if let Some(limit) = options.max_bytes {
            query.push(("max_bytes", limit.to_string()));
        }
        let response = self
            .send(Req {
                method: Method::GET,
                url,
                query: &query,
                payload: Payload::None,
                idempotency_key: None,
                retry: Retry::Idempotent,
                stream: true,
            })
            .await?;
        Ok(download(frames(response)))
    }

    async fn write_file(
        &self,
        id: &str,
        path: &str,
        data: ByteStream,
        options: WriteOptions,
    ) -> Result<FileStat> {
        let url = self.sandbox_url(id, &["files"])?;
        let options = String::from_utf8(to_json(&options)?).expect("JSON is UTF-8");
        // The operation id lets the server answer a repeat of this write (same path, options
        // and content) with the first outcome instead of writing again.
        let key = sandcove_core::OperationId::current_or_new();
        // A streamed body cannot be replayed, so uploads are never retried. When the source
        // fails, the body ends with an abandon frame rather than being cut, so the server's
        // answer tells us its backend has discarded the partial file.
        let abandon = Arc::new(Abandon::default());
        let body = reqwest::Body::wrap_stream(upload_frames(data, abandon.clone()));
        let send = self
            .http
            .put(url.clone())
            .bearer_auth(&*self.api_key)
            .query(&[("path", path.to_string()), ("options", options)])
            .header(reqwest::header::CONTENT_TYPE, FRAMES_CONTENT_TYPE)
            .header(IDEMPOTENCY_HEADER, key.as_str())
            .body(body)
            .send();
        let sent = tokio::select! {
            sent = send => Some(sent),
            () = abandon.deadline() => None,
        };
        // The caller's own error wins, whatever the server made of the abandoned body; it
        // is returned only now, after the server's answer (or the bounded wait for it).
        if let Some(error) = abandon.take() {
            return Err(error);
        }
        match sent {
            Some(Ok(response)) if response.status().is_success() => decode_json(response)
                .await
                .map_err(|e| outcome_lost(e, Some(key.as_str()))),
            Some(Ok(response)) => Err(read_error(response, self.options.request_timeout).await),
            // Nothing reached the server: nothing was written.
            Some(Err(e)) if e.is_connect() || e.is_builder() => {
                Err(transport_error(&e, &Method::PUT, &url))
            }
            Some(Err(e)) => Err(outcome_lost(
                transport_error(&e, &Method::PUT, &url),
                Some(key.as_str()),
            )),
            // The deadline runs only after the source failed, whose error was taken above.
            None => Err(Error::backend("the upload was abandoned")),
        }
    }

    async fn list_dir(
        &self,
        id: &str,
        path: &str,
        options: ListDirOptions,
    ) -> Result<Vec<FileStat>> {
        let url = self.sandbox_url(id, &["files", "list"])?;
        let query = with_user(
            vec![
                ("path", path.to_string()),
                ("depth", options.depth.to_string()),
            ],
            options.user,
        );
        self.call(Method::GET, url, &query, None::<&()>, Retry::Idempotent)
            .await
    }

    async fn stat(&self, id: &str, path: &str, options: StatOptions) -> Result<FileStat> {
        let url = self.sandbox_url(id, &["files", "stat"])?;
        self.call(
            Method::GET,
            url,
            &with_user(vec![("path", path.to_string())], options.user),
            None::<&()>,
            Retry::Idempotent,
        )
        .await
    }

    async fn mkdir(&self, id: &str, path: &str, options: MkdirOptions) -> Result<FileStat> {
        let url = self.sandbox_url(id, &["files", "mkdir"])?;
        let body = body::Mkdir {
            path: path.to_string(),
            options,
        };
        self.op_call(Method::POST, url, &[], Payload::Json(to_json(&body)?))
            .await
    }

    async fn remove(&self, id: &str, path: &str, options: RemoveOptions) -> Result<()> {
        let url = self.sandbox_url(id, &["files"])?;
        let query = with_user(
            vec![
                ("path", path.to_string()),
                ("recursive", options.recursive.to_string()),
            ],
            options.user,
        );
        self.delete_call(url, &query).await
    }

    async fn rename(
        &self,
        id: &str,
        from: &str,
        to: &str,
        options: RenameOptions,
    ) -> Result<FileStat> {
        let url = self.sandbox_url(id, &["files", "rename"])?;
        let body = body::Rename {
            from: from.to_string(),
            to: to.to_string(),
            options,
        };
        self.op_call(Method::POST, url, &[], Payload::Json(to_json(&body)?))
            .await
    }

    async fn copy(&self, id: &str, from: &str, to: &str, options: CopyOptions) -> Result<FileStat> {
        let url = self.sandbox_url(id, &["files", "copy"])?;
        let body = body::Copy {
            from: from.to_string(),
            to: to.to_string(),
            options,
        };
        self.op_call(Method::POST, url, &[], Payload::Json(to_json(&body)?))
            .await
    }

    async fn chmod(&self, id: &str, path: &str, mode: u32) -> Result<FileStat> {
        let url = self.sandbox_url(id, &["files", "chmod"])?;
        let body = body::Chmod {
            path: path.to_string(),
            mode,
        };
        self.op_call(Method::POST, url, &[], Payload::Json(to_json(&body)?))
            .await
    }

    async fn pause(&self, id: &str) -> Result<SandboxInfo> {
        let url = self.sandbox_url(id, &["pause"])?;
        self.call(Method::POST, url, &[], None::<&()>, Retry::Unsafe)
            .await
    }

    async fn resume(&self, id: &str) -> Result<SandboxInfo> {
        let url = self.sandbox_url(id, &["resume"])?;
        self.call(Method::POST, url, &[], None::<&()>, Retry::Unsafe)
            .await
    }

    async fn stop(&self, id: &str) -> Result<SandboxInfo> {
        let url = self.sandbox_url(id, &["stop"])?;
        // Stopping a stopped sandbox changes nothing: safe to replay.
        self.call(Method::POST, url, &[], None::<&()>, Retry::Idempotent)
            .await
    }

    async fn start(&self, id: &str) -> Result<SandboxInfo> {
        let url = self.sandbox_url(id, &["start"])?;
        self.call(Method::POST, url, &[], None::<&()>, Retry::Idempotent)
            .await
    }

    async fn metrics(&self, id: &str) -> Result<Metrics> {
        let url = self.sandbox_url(id, &["metrics"])?;
        self.call(Method::GET, url, &[], None::<&()>, Retry::Idempotent)
            .await
    }

    async fn resize_pty(&self, id: &str, process: ProcessSelector, size: PtySize) -> Result<()> {
        let url = self.sandbox_url(id, &["processes", "resize"])?;
        self.call_unit(
            Method::POST,
            url,
            &selector_query(&process),
            Payload::Json(to_json(&size)?),
            Retry::Idempotent,
        )
        .await
    }

    async fn watch(&self, id: &str, path: &str, options: WatchOptions) -> Result<WatchStream> {
        let url = self.sandbox_url(id, &["files", "watch"])?;
        let query = with_user(
            vec![
                ("path", path.to_string()),
                ("recursive", options.recursive.to_string()),
            ],
            options.user,
        );
        let response = self
            .send(Req {
                method: Method::GET,
                url,
                query: &query,
                payload: Payload::None,
                idempotency_key: None,
                retry: Retry::Idempotent,
                stream: true,
            })
            .await?;
        Ok(watch_events(frames(response)))
    }

    async fn expose_port(&self, id: &str, options: PreviewOptions) -> Result<Preview> {
        let url = self.sandbox_url(id, &["previews"])?;
        self.call(Method::POST, url, &[], Some(&options), Retry::Unsafe)
            .await
    }

    async fn list_previews(&self, id: &str) -> Result<Vec<Preview>> {
        let url = self.sandbox_url(id, &["previews"])?;
        self.call(Method::GET, url, &[], None::<&()>, Retry::Idempotent)
            .await
    }

    async fn close_preview(&self, id: &str, port: u16) -> Result<()> {
        let port = port.to_string();
        let url = self.sandbox_url(id, &["previews", &port])?;
        self.call_unit(Method::DELETE, url, &[], Payload::None, Retry::Idempotent)
            .await
    }

    async fn create_preview_token(
        &self,
        id: &str,
        port: u16,
        expires_at: Option<u64>,
    ) -> Result<PreviewToken> {
        let port = port.to_string();
        let url = self.sandbox_url(id, &["previews", &port, "tokens"])?;
        self.create_call(url, &body::NewToken { expires_at }).await
    }

    async fn revoke_preview_token(&self, id: &str, port: u16, token: &str) -> Result<()> {
        let port = port.to_string();
        let url = self.sandbox_url(id, &["previews", &port, "tokens", "revoke"])?;
        let body = body::RevokeToken {
            token: token.to_string(),
        };
        // Not replayed after a possible effect: a second revoke of the same token would
        // answer NotFound for a revoke that worked.
        self.call_unit(
            Method::POST,
            url,
            &[],
            Payload::Json(to_json(&body)?),
            Retry::Unsafe,
        )
        .await
    }

    async fn snapshot(&self, id: &str, name: Option<String>) -> Result<SnapshotInfo> {
        let url = self.sandbox_url(id, &["snapshots"])?;
        self.create_call(url, &body::NewSnapshot { name }).await
    }

    async fn list_snapshots(&self) -> Result<Vec<SnapshotInfo>> {
        let url = self.url_for(&["snapshots"])?;
        self.call(Method::GET, url, &[], None::<&()>, Retry::Idempotent)
            .await
    }

    async fn delete_snapshot(&self, snapshot_id: &str) -> Result<()> {
        self.delete_call(self.url_for(&["snapshots", snapshot_id])?, &[])
            .await
    }

    async fn fork(&self, id: &str, options: CreateOptions) -> Result<SandboxInfo> {
        options.validate()?;
        let url = self.sandbox_url(id, &["fork"])?;
        self.create_call(url, &options).await
    }

    async fn create_volume(&self, name: &str) -> Result<VolumeInfo> {
        let url = self.url_for(&["volumes"])?;
        self.create_call(
            url,
            &body::NewVolume {
                name: name.to_string(),
            },
        )
        .await
    }

    async fn get_volume(&self, name: &str) -> Result<VolumeInfo> {
        let url = self.url_for(&["volumes", name])?;
        self.call(Method::GET, url, &[], None::<&()>, Retry::Idempotent)
            .await
    }

    async fn list_volumes(&self) -> Result<Vec<VolumeInfo>> {
        let url = self.url_for(&["volumes"])?;
        self.call(Method::GET, url, &[], None::<&()>, Retry::Idempotent)
            .await
    }

    async fn delete_volume(&self, name: &str) -> Result<()> {
        self.delete_call(self.url_for(&["volumes", name])?, &[])
            .await
    }

    async fn observe(
        &self,
        operation: &sandcove_core::OperationId,
    ) -> Result<sandcove_core::OperationStatus> {
        let url = self.url_for(&["operations", operation.as_str()])?;
        self.call(Method::GET, url, &[], None::<&()>, Retry::Idempotent)
            .await
    }

    async fn tombstone(
        &self,
        kind: sandcove_core::ResourceKind,
        id: &str,
    ) -> Result<Option<sandcove_core::Tombstone>> {
        let url = self.url_for(&["tombstones", kind.as_str(), id])?;
        self.call(Method::GET, url, &[], None::<&()>, Retry::Idempotent)
            .await
    }
}

/// The error of an upload's source stream, kept for the caller while the body carries an
/// abandon frame to the server.
#[derive(Default)]
struct Abandon {
    error: std::sync::Mutex<Option<Error>>,
    failed: tokio::sync::Notify,
}

impl Abandon {
    fn set(&self, error: Error) {
        *self.error.lock().unwrap_or_else(|e| e.into_inner()) = Some(error);
        self.failed.notify_one();
    }

    fn take(&self) -> Option<Error> {
        self.error.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// Completes a bounded while after the source failed: the server answers an abandoned
    /// upload within [`UPLOAD_CLEANUP_WAIT`]; the margin covers the answer's transit.
    async fn deadline(&self) {
        self.failed.notified().await;
        tokio::time::sleep(UPLOAD_CLEANUP_WAIT + Duration::from_secs(5)).await;
    }
}

/// The upload body: the source's bytes as `d` frames, then `x`; or, when the source fails,
/// `!` with its error (kept in `abandon`) and the end of the body.
fn upload_frames(
    data: ByteStream,
    abandon: Arc<Abandon>,
) -> impl Stream<Item = std::result::Result<bytes::Bytes, std::convert::Infallible>> + Send + 'static
{
    futures::stream::unfold(Some(data), move |data| {
        let abandon = abandon.clone();
        async move {
            let mut data = data?;
            let pieces: Vec<bytes::Bytes> = match data.next().await {
                None => return Some((vec![frame::encode(frame::END, b"").into()], None)),
                Some(Err(e)) => {
                    let body = serde_json::to_vec(&e.to_body()).expect("an ErrorBody serialises");
                    abandon.set(e);
                    return Some((vec![frame::encode(frame::ERROR, &body).into()], None));
                }
                // A chunk crosses without a copy: each frame's head, then its share of the
                // bytes (a chunk larger than a frame, such as a whole file, is sliced).
                Some(Ok(bytes)) => {
                    let bytes = bytes::Bytes::from(bytes);
                    let mut pieces = Vec::new();
                    let mut at = 0;
                    while at < bytes.len() {
                        let end = bytes.len().min(at + frame::UPLOAD_MAX_PAYLOAD);
                        let head = frame::head(frame::DATA, end - at);
                        pieces.push(bytes::Bytes::copy_from_slice(&head));
                        pieces.push(bytes.slice(at..end));
                        at = end;
                    }
                    pieces
                }
            };
            Some((pieces, Some(data)))
        }
    })
    .flat_map(|pieces| futures::stream::iter(pieces.into_iter().map(Ok)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandcove_core::ErrorCode;

    /// A chunk larger than an upload frame (a whole file handed over at once) is sent as
    /// frames within the server's bound, slices of the caller's buffer, in order.
    #[tokio::test]
    async fn a_large_chunk_is_sent_as_bounded_frames_in_order() {
        let big: Vec<u8> = (0..(5 * frame::UPLOAD_MAX_PAYLOAD / 2))
            .map(|i| (i % 251) as u8)
            .collect();
        let chunks = vec![big.clone(), b"tail".to_vec(), Vec::new()];
        let data: ByteStream = Box::pin(futures::stream::iter(chunks.into_iter().map(Ok)));
        let pieces: Vec<bytes::Bytes> = upload_frames(data, Arc::new(Abandon::default()))
            .map(|p| p.unwrap())
            .collect()
            .await;
        let mut decoder = frame::Decoder::with_max_payload(frame::UPLOAD_MAX_PAYLOAD);
        for piece in &pieces {
            decoder.push(piece);
        }
        let mut sent = Vec::new();
        let mut kinds = Vec::new();
        while let Some((kind, payload)) = decoder.next_frame().unwrap() {
            assert!(payload.len() <= frame::UPLOAD_MAX_PAYLOAD);
            kinds.push(kind);
            sent.extend_from_slice(&payload);
        }
        assert_eq!(kinds.last(), Some(&frame::END));
        assert_eq!(kinds.iter().filter(|k| **k == frame::DATA).count(), 4);
        let mut expected = big;
        expected.extend_from_slice(b"tail");
        assert_eq!(sent, expected);
    }

    #[test]
    fn every_code_maps_back_from_its_status_and_body() {
        let errors = [
            Error::not_found("sandbox \"x\""),
            Error::AlreadyExists { what: "v".into() },
            Error::Conflict { what: "k".into() },
            Error::invalid("bad"),
            Error::Timeout { what: "t".into() },
            Error::PermissionDenied {
                what: "/usr".into(),
            },
            Error::Unauthenticated {
                message: "no key".into(),
            },
            Error::InvalidState {
                id: "x".into(),
                state: "paused".into(),
                message: "m".into(),
            },
            Error::not_supported("pty", "exec"),
            Error::Unavailable {
                reason: "r".into(),
                remedy: "m".into(),
            },
            Error::RateLimited {
                message: "slow".into(),
                retry_after_ms: Some(2000),
            },
            Error::Io {
                message: "disk".into(),
                errno: Some(28),
            },
            Error::file_too_large("/workspace/big", 1 << 20),
            Error::Backend {
                message: "b".into(),
                retryable: true,
            },
            Error::Destroyed {
                kind: "sandbox".into(),
                id: "x".into(),
                at: 1_767_225_600_000,
                reason: "destroyed".into(),
            },
            Error::Forbidden {
                what: "another runtime's reference".into(),
            },
        ];
        for err in errors {
            let status = status_for(err.code());
            let body = serde_json::to_vec(&err.to_body()).unwrap();
            let back = error_from_response(status, None, &body);
            assert_eq!(back.code(), err.code(), "{err}");
            assert_eq!(back.to_string(), err.to_string());
            assert_eq!(back.is_retryable(), err.is_retryable());
        }
    }

    #[test]
    fn bodies_without_a_code_map_by_status() {
        let table = [
            (400, ErrorCode::InvalidArgument),
            (401, ErrorCode::Unauthenticated),
            (403, ErrorCode::PermissionDenied),
            (404, ErrorCode::NotFound),
            (410, ErrorCode::NotFound),
            (409, ErrorCode::AlreadyExists),
            (412, ErrorCode::Conflict),
            (413, ErrorCode::InvalidArgument),
            (429, ErrorCode::RateLimited),
            (501, ErrorCode::NotSupported),
            (502, ErrorCode::Backend),
            (503, ErrorCode::Backend),
            (504, ErrorCode::Timeout),
            (302, ErrorCode::Backend),
        ];
        for (status, code) in table {
            let err = error_from_response(status, None, b"<html>proxy says no</html>");
            assert_eq!(err.code(), code, "status {status}");
            assert!(err.to_string().contains("proxy says no"), "{err}");
        }
        assert!(error_from_response(503, None, b"").is_retryable());
        match error_from_response(429, Some("7"), b"") {
            Error::RateLimited { retry_after_ms, .. } => assert_eq!(retry_after_ms, Some(7000)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn frames_survive_any_chunking() {
        let mut wire = frame::encode(frame::STDOUT, &[0, 0xff, 1]);
        wire.extend(frame::encode(frame::JSON, b"{}"));
        wire.extend(frame::encode(frame::END, b""));
        for split in 1..wire.len() {
            let mut d = frame::Decoder::default();
            let mut got = Vec::new();
            for chunk in wire.chunks(split) {
                d.push(chunk);
                while let Some(f) = d.next_frame().unwrap() {
                    got.push(f);
                }
            }
            assert_eq!(
                got,
                [
                    (frame::STDOUT, vec![0, 0xff, 1]),
                    (frame::JSON, b"{}".to_vec()),
                    (frame::END, vec![])
                ]
            );
            assert_eq!(d.pending(), 0);
        }
        let mut d = frame::Decoder::default();
        d.push(&[frame::DATA, 0xff, 0xff, 0xff, 0xff]);
        assert!(d.next_frame().is_err(), "oversized frames are refused");
    }

    #[test]
    fn public_types_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<HttpBackend>();
        check::<HttpOptions>();
    }

    #[test]
    fn urls_keep_ids_and_paths_in_one_segment() {
        let b = HttpBackend::new("http://127.0.0.1:1/base/", "k").unwrap();
        assert_eq!(
            b.sandbox_url("../etc", &["files"]).unwrap().path(),
            "/base/v1/sandboxes/..%2Fetc/files"
        );
        // A URL drops `.` and folds `..`: `sandbox_url("..", ["files"])` would otherwise be
        // `/v1/sandboxes/files`, a call on the sandbox named `files`.
        for dots in ["", ".", ".."] {
            let err = b.sandbox_url(dots, &["files"]).unwrap_err();
            assert!(err.is_not_found(), "{dots:?}: {err}");
            let err = b.url_for(&["volumes", dots]).unwrap_err();
            assert!(err.is_not_found(), "{dots:?}: {err}");
        }
        assert!(HttpBackend::new("ftp://x", "k").is_err());
        assert!(HttpBackend::new("https://x", "k").is_ok());
        assert!(
            !format!("{b:?}").contains("\"k\""),
            "the key is not printed"
        );
    }
}
