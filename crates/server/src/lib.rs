//! `sandcove serve`: any [`Backend`] over HTTP (crate `sandcove-server`, re-exported as
//! `sandcove::server` with the umbrella's feature `server`).
//!
//! The wire format (JSON control calls, binary frame streams, error bodies) is described in
//! `sandcove_core::wire`; `HttpBackend` is the client. The routes are
//! listed once, in the route modules, and both the router and the OpenAPI document served at
//! `GET /openapi.json` are built from that one list.
//!
//! - **Authentication**: every route, the OpenAPI document and unknown paths included, needs
//!   `Authorization: Bearer <key>`; the key is compared in constant time and a missing or
//!   wrong one is answered `401` before anything else happens.
//! - **Limits**: JSON and stdin bodies are capped at [`ServerConfig::max_body_bytes`],
//!   uploads at [`ServerConfig::max_upload_bytes`] (and the backend's `max_file_bytes`);
//!   a bigger body is `413` before the backend sees it.
//! - **Errors**: always a JSON [`ErrorBody`](sandcove_core::ErrorBody) whose code maps one-to-one
//!   onto [`Error`], with the status [`status_for`] gives it. Whatever the wrapped backend
//!   answers (including `NotSupported`) is forwarded unchanged.
//! - **Operations** with a remote effect (create, fork, snapshot, volume, preview token,
//!   destroy, snapshot and volume deletes, process start, file write, mkdir, remove, rename,
//!   copy, chmod) honour an `Idempotency-Key` header, the client's
//!   [`OperationId`](sandcove_core::OperationId): the first request with a key runs to completion
//!   even if its client disconnects, and every request with the same key within
//!   [`ServerConfig::idempotency_ttl`] gets that same answer (a process start attaches to the
//!   process the first one started); the same key with another request is `409 conflict`.
//!   A file upload is recorded with the BLAKE3 digest of its content, computed as it streams (the
//!   body is never buffered): a repeat with the same path, options and content answers the
//!   first outcome without writing, other content is a conflict and the file is not touched,
//!   and a repeat while the first upload still runs is a conflict at once (observe it, or
//!   send it again once it has finished). `GET /v1/operations/{op}` reports what became of
//!   one ([`OperationStatus`](sandcove_core::OperationStatus)). At most
//!   [`ServerConfig::max_operations`] outcomes are kept, each without its request's body.
//! - **Connections**: HTTP/1.1, over TLS when [`ServerConfig::tls`] is set (see
//!   [`load_tls`]). At most [`ServerConfig::max_connections`] connections are served at once
//!   (further ones wait in the kernel's backlog, costing the server nothing); a client gets
//!   [`ServerConfig::head_timeout`] to finish its TLS handshake and each request head,
//!   idle keep-alive connections included, and is then disconnected; running out of
//!   descriptors pauses accepting instead of spinning. Once a head is in, a request body
//!   that brings no byte for [`ServerConfig::body_idle_timeout`] while it is read ends in an
//!   error (its handler fails as on a broken-off body: an upload writes nothing) and the
//!   connection closes after the answer; a write the client takes no byte of for
//!   [`ServerConfig::write_stall_timeout`] cuts the connection. Only a pending write counts:
//!   a stream silent because there is nothing to send is never cut. So no client holds a
//!   slot of the cap, or a handler's state, by trickling or by not reading. Nor does a
//!   sandbox's port a request is forwarded to (E2B's `get_host`): its answer's head must come
//!   within [`ServerConfig::upstream_answer_timeout`] of the last request byte it took (else
//!   `504`), its body with no gap
//!   longer than the body idle bound (see [`upstream`]). A route may switch a connection to
//!   another protocol (a WebSocket) only through [`upgrade`]: the connection keeps its slot
//!   in the cap and is closed at shutdown; its own idle limit replaces the write-stall bound. [`serve_router_intercepting`] also terminates
//!   `CONNECT` tunnels to a fixed list of hosts with a name-constrained local CA (see
//!   [`intercept`]), serving what comes through them with the same router and limits.
//!   An answer given without reading the request's body (a `401`, a `404`, a `413`, …)
//!   waits for that body (at most 64 KiB within the head timeout, else it says
//!   `Connection: close`), so a client reusing the connection gets its next answer instead
//!   of a closed connection; this holds for every router served here, vendor listeners too.
//! - **Shutdown**: when the shutdown future given to [`serve`] completes (the binary uses
//!   Ctrl-C or SIGTERM), the server stops accepting connections, ends every open stream with
//!   an error frame (so no client mistakes it for a complete stream), lets in-flight control
//!   calls finish for up to [`ServerConfig::shutdown_grace`] (upgraded connections are closed
//!   at once), and returns. **Live sandboxes are left running**: sandboxes of the embedded
//!   engine are independent processes that outlive the server, exactly as they outlive any
//!   program that creates them; each ends at its lease or when destroyed, and a restarted
//!   server (or any program of the same user) finds them again.

#![forbid(unsafe_code)]

pub mod auth;
pub mod certificate;
mod drain;
mod file_urls;
mod files;
mod idempotency;
pub mod intercept;
pub mod json_body;
mod observe;
pub use observe::{observe_listener, ServerMetrics};
mod openapi;
mod operations;
pub mod policy;
pub use policy::{PolicyBackend, ServerPolicy};
mod processes;
mod resources;
mod sandboxes;
use sandcove_core::stall;
pub mod upgrade;
pub mod upstream;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::handler::Handler;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{on, MethodFilter, MethodRouter};
use axum::Router;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use serde::de::DeserializeOwned;
use tokio::sync::watch;

use sandcove_core::wire::{frame, status_for, FRAMES_CONTENT_TYPE, OPENAPI_PATH};
use sandcove_core::{Backend, Error};

use self::idempotency::Idempotency;

/// Settings of a server.
#[derive(Clone)]
#[non_exhaustive]
pub struct ServerConfig {
    /// The API key clients must present as `Authorization: Bearer <key>`. Must not be empty.
    pub api_key: String,
    /// Largest JSON or stdin request body, in bytes.
    pub max_body_bytes: usize,
    /// Largest file upload, in bytes (the backend's `max_file_bytes` applies too).
    pub max_upload_bytes: u64,
    /// How long the outcome of an operation (a create, destroy, delete, process start or
    /// file change) is remembered under its idempotency key (the client's operation id).
    pub idempotency_ttl: Duration,
    /// How many operation outcomes are remembered at most (the oldest finished one goes
    /// first; with every one still running, new keyed requests are rate limited).
    pub max_operations: usize,
    /// How long in-flight calls may run on after shutdown begins.
    pub shutdown_grace: Duration,
    /// Connections served at once; further ones wait until one closes.
    pub max_connections: usize,
    /// How long a client may take for its TLS handshake and for each request head
    /// (including the wait for the next request on a kept-alive connection).
    pub head_timeout: Duration,
    /// How long a request body may bring no byte while it is being read (an upload, a JSON
    /// body, stdin); then it ends in an error, its handler fails as on a broken-off body (an
    /// upload writes nothing and frees its operation id), and the connection is closed.
    pub body_idle_timeout: Duration,
    /// How long a write of an answer to a client may make no progress (a client that stops
    /// reading a download or a followed log); then the connection is cut. A stream that is
    /// silent because there is nothing to send is not affected.
    pub write_stall_timeout: Duration,
    /// How long a sandbox's port may take for the head of its answer to a request a
    /// listener forwards to it (E2B's `get_host`), counted from the last byte of the request
    /// it took; then the client gets `504` and the sandbox's connection is dropped. Once the head is in, the answer's body is held to
    /// [`body_idle_timeout`](Self::body_idle_timeout) between bytes (see [`upstream`]).
    pub upstream_answer_timeout: Duration,
    /// Serve HTTPS with this configuration (see [`load_tls`]); `None` serves plain HTTP,
    /// which is only fit for loopback.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Where the native API counts what `GET /metrics` serves; share it with vendor
    /// listeners ([`observe_listener`]) so one scrape covers them too.
    pub metrics: ServerMetrics,
}

impl ServerConfig {
    /// Defaults: 1 MiB JSON bodies, 4 GiB uploads, operation outcomes (idempotency keys) kept
    /// 10 minutes and at most 10 000 of them, 10 s
    /// of grace at shutdown, 512 connections, 10 s per request head, 60 s without a byte
    /// of a body being read, 60 s without progress of a write, 60 s for the head of a
    /// forwarded request's answer, plain HTTP.
    pub fn new(api_key: impl Into<String>) -> Self {
        ServerConfig {
            api_key: api_key.into(),
            max_body_bytes: 1024 * 1024,
            max_upload_bytes: 4 * 1024 * 1024 * 1024,
            idempotency_ttl: Duration::from_secs(600),
            max_operations: 10_000,
            shutdown_grace: Duration::from_secs(10),
            max_connections: 512,
            head_timeout: Duration::from_secs(10),
            body_idle_timeout: Duration::from_secs(60),
            write_stall_timeout: Duration::from_secs(60),
            upstream_answer_timeout: upstream::DEFAULT_ANSWER_TIMEOUT,
            tls: None,
            metrics: ServerMetrics::default(),
        }
    }
}

impl std::fmt::Debug for ServerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The API key is deliberately left out.
        f.debug_struct("ServerConfig")
            .field("max_body_bytes", &self.max_body_bytes)
            .field("max_upload_bytes", &self.max_upload_bytes)
            .field("idempotency_ttl", &self.idempotency_ttl)
            .field("max_operations", &self.max_operations)
            .field("shutdown_grace", &self.shutdown_grace)
            .field("max_connections", &self.max_connections)
            .field("head_timeout", &self.head_timeout)
            .field("body_idle_timeout", &self.body_idle_timeout)
            .field("write_stall_timeout", &self.write_stall_timeout)
            .field("upstream_answer_timeout", &self.upstream_answer_timeout)
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

/// What every handler gets.
#[derive(Clone)]
struct AppState {
    backend: Arc<dyn Backend>,
    config: Arc<ServerConfig>,
    idempotency: Arc<Idempotency>,
    shutdown: Arc<watch::Sender<bool>>,
    /// The key signed file URLs are signed with, derived from the API key (see
    /// `file_urls`).
    file_urls: Arc<sandcove_core::file_url::FileUrlKey>,
}

/// The kind of a request body, for the OpenAPI document.
#[derive(Debug, Clone, Copy)]
enum In {
    None,
    /// JSON of the named type.
    Json(&'static str),
    /// Raw bytes.
    Raw,
    /// A file upload: a frame stream, or raw bytes.
    Upload,
}

/// The kind of a success answer, for the OpenAPI document.
#[derive(Debug, Clone, Copy)]
enum Out {
    /// JSON of the named type.
    Json(&'static str),
    /// A frame stream.
    Frames(&'static str),
    /// An empty body.
    Empty,
}

/// One served route: the single source of both the router and the OpenAPI document.
struct Route {
    method: Method,
    path: &'static str,
    op: &'static str,
    summary: &'static str,
    query: &'static [&'static str],
    input: In,
    output: Out,
    /// The credentials it accepts: the server key unless [`Route::accepts`] says otherwise.
    accepts: &'static [auth::Principal],
    handler: MethodRouter<AppState>,
}

impl Route {
    fn new<H, T>(
        method: Method,
        path: &'static str,
        op: &'static str,
        summary: &'static str,
        handler: H,
    ) -> Route
    where
        H: Handler<T, AppState>,
        T: 'static,
    {
        let filter = MethodFilter::try_from(method.clone()).expect("a standard method");
        Route {
            method,
            path,
            op,
            summary,
            query: &[],
            input: In::None,
            output: Out::Empty,
            accepts: auth::SERVER_KEY,
            handler: on(filter, handler),
        }
    }

    fn query(mut self, names: &'static [&'static str]) -> Self {
        self.query = names;
        self
    }

    fn input(mut self, input: In) -> Self {
        self.input = input;
        self
    }

    fn output(mut self, output: Out) -> Self {
        self.output = output;
        self
    }

    fn accepts(mut self, accepts: &'static [auth::Principal]) -> Self {
        self.accepts = accepts;
        self
    }
}

/// Every route, in documentation order.
fn routes() -> Vec<Route> {
    let mut all = vec![Route::new(
        Method::GET,
        OPENAPI_PATH,
        "openapi",
        "This API's OpenAPI document",
        openapi::serve_document,
    )
    .output(Out::Json("OpenAPI"))];
    all.extend(sandboxes::routes());
    all.extend(processes::routes());
    all.extend(files::routes());
    all.extend(file_urls::routes());
    all.extend(resources::routes());
    all.extend(operations::routes());
    all
}

/// The API for `backend` as an axum router, ready to serve. [`serve`] adds graceful
/// shutdown; this router's streams end only when their source does.
pub fn router(backend: Arc<dyn Backend>, config: ServerConfig) -> Router {
    build(state(backend, config))
}

fn state(backend: Arc<dyn Backend>, config: ServerConfig) -> AppState {
    AppState {
        idempotency: Arc::new(Idempotency::new(
            config.idempotency_ttl,
            config.max_operations,
        )),
        backend,
        file_urls: Arc::new(sandcove_core::file_url::FileUrlKey::derived_from(
            config.api_key.as_bytes(),
        )),
        config: Arc::new(config),
        shutdown: Arc::new(watch::channel(false).0),
    }
}

fn build(state: AppState) -> Router {
    let key: Arc<str> = state.config.api_key.as_str().into();
    let mut declared = auth::Routes::new(refuse);
    let mut table = Vec::new();
    for route in routes() {
        table.push((route.method.clone(), route.path, route.op));
        declared = declared.method_route(route.method, route.path, route.accepts, route.handler);
    }
    let (router, _) = declared.into_parts();
    let credentials = (key, state.file_urls.clone());
    // Spans and metrics: one layer around everything (see `observe`).
    let observer = Arc::new(observe::Observer::new(table, &state.config.metrics));
    let metrics = Router::new()
        .route(observe::METRICS_PATH, axum::routing::get(observe::metrics))
        .with_state((observer.clone(), state.backend.clone()));
    router
        .fallback(fallback)
        .with_state(state)
        .merge(metrics)
        .layer(middleware::map_response(json_errors))
        .layer(middleware::from_fn_with_state(credentials, authenticate))
        .layer(middleware::from_fn_with_state(observer, observe::observe))
}

/// The native API's authorization table: every route and the credentials it accepts (the
/// server key for every one of them, `GET /metrics` too, except the signed file URLs'
/// route, which takes the URL alone).
pub fn route_table() -> Vec<auth::RouteAuth> {
    let mut declared = auth::Routes::<AppState>::new(refuse);
    for route in routes() {
        declared = declared.method_route(route.method, route.path, route.accepts, route.handler);
    }
    declared
        .declare(Some(Method::GET), observe::METRICS_PATH, auth::SERVER_KEY)
        .into_parts()
        .1
}

/// A route's refusal as the native API answers it.
fn refuse(route: &auth::RouteAuth, refusal: auth::Refusal) -> Response {
    let signed = route.accepts.contains(&auth::Principal::SignedUrl);
    let error = match (refusal, signed) {
        (auth::Refusal::Unauthenticated, false) => Error::Unauthenticated {
            message: "missing API key (Authorization: Bearer <key>)".into(),
        },
        (auth::Refusal::Unauthenticated, true) => Error::Unauthenticated {
            message: "invalid signed file URL".into(),
        },
        (auth::Refusal::Forbidden, false) => Error::Forbidden {
            what: "this route needs the server's API key".into(),
        },
        (auth::Refusal::Forbidden, true) => Error::Forbidden {
            what: "this route takes a signed file URL alone, not the server's API key".into(),
        },
    };
    ApiError::from(error).into_response()
}

/// Serve `backend` on `listener` until `shutdown` completes (see the module docs for what
/// shutdown does). Refuses an empty API key.
pub async fn serve(
    listener: tokio::net::TcpListener,
    backend: Arc<dyn Backend>,
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    if config.api_key.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "an API key is required",
        ));
    }
    let limits = ConnectionLimits::from(&config);
    let state = state(backend, config);
    let signal = state.shutdown.clone();
    let app = build(state);
    serve_connections(listener, app, limits, None, shutdown, move || {
        // Cut open streams with an error frame.
        let _ = signal.send(true);
    })
    .await
}

/// How a listener treats its connections: the cap, the head timeout, TLS and the grace
/// period at shutdown. [`serve`] takes them from its [`ServerConfig`]; [`serve_router`]
/// applies them to any other router (the vendor wire listeners of `sandcove serve`).
#[derive(Clone)]
pub struct ConnectionLimits {
    /// Connections served at once; further ones wait in the kernel's backlog.
    pub max_connections: usize,
    /// Time for the TLS handshake and for each request head (idle keep-alive included).
    pub head_timeout: Duration,
    /// Longest wait for the next byte of a request body being read.
    pub body_idle_timeout: Duration,
    /// Longest time a write to the client may make no progress.
    pub write_stall_timeout: Duration,
    /// Longest wait for the head of a sandbox's answer to a request forwarded to one of its
    /// ports (see [`upstream`]).
    pub upstream_answer_timeout: Duration,
    /// How long in-flight calls may run on after shutdown begins.
    pub shutdown_grace: Duration,
    /// Serve HTTPS with this configuration; `None` is plain HTTP.
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

impl From<&ServerConfig> for ConnectionLimits {
    fn from(config: &ServerConfig) -> Self {
        ConnectionLimits {
            max_connections: config.max_connections,
            head_timeout: config.head_timeout,
            body_idle_timeout: config.body_idle_timeout,
            write_stall_timeout: config.write_stall_timeout,
            upstream_answer_timeout: config.upstream_answer_timeout,
            shutdown_grace: config.shutdown_grace,
            tls: config.tls.clone(),
        }
    }
}

impl std::fmt::Debug for ConnectionLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionLimits")
            .field("max_connections", &self.max_connections)
            .field("head_timeout", &self.head_timeout)
            .field("body_idle_timeout", &self.body_idle_timeout)
            .field("write_stall_timeout", &self.write_stall_timeout)
            .field("upstream_answer_timeout", &self.upstream_answer_timeout)
            .field("shutdown_grace", &self.shutdown_grace)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

/// Serve any `app` on `listener` with the same connection handling as [`serve`]: capped
/// accepts that pause on descriptor exhaustion, a deadline on every request head, bounds on
/// stalled request bodies and stalled writes, optional TLS, and a graceful stop when `shutdown` completes. Authentication and body limits are
/// the router's own business.
pub async fn serve_router(
    listener: tokio::net::TcpListener,
    app: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_connections(listener, app, limits, None, shutdown, || {}).await
}

/// [`serve_router`] that also acts as a TLS-intercepting `CONNECT` proxy for the hosts of
/// `ca` (see [`intercept`]): `CONNECT host:443` for one of them is answered `200`, the
/// tunnel is terminated with a leaf `ca` mints for that host, and the decrypted HTTP/1.1
/// requests are served by `app` with the same limits (the tunnel keeps its connection's slot
/// in the cap, and each request head inside it has the same deadline). A `CONNECT` to any
/// other host or port is answered `403`; other requests go to `app` as usual.
pub async fn serve_router_intercepting(
    listener: tokio::net::TcpListener,
    app: Router,
    limits: ConnectionLimits,
    ca: Arc<intercept::SandcoveCa>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_connections(listener, app, limits, Some(ca), shutdown, || {}).await
}

/// What a connection does with `CONNECT` requests.
#[derive(Clone)]
enum Proxying {
    /// Nothing special: the router answers them like any request.
    Off,
    /// Intercept tunnels to the CA's hosts, refuse the rest.
    Intercept(Arc<intercept::Tunnel>),
    /// Already inside a tunnel: refused.
    InsideTunnel,
}

/// The per-connection service: every request carries its [`upgrade::Connection`], `CONNECT`
/// is handled as `proxying` says, everything else goes to `app`.
fn dispatch(
    app: Router,
    connection: upgrade::Connection,
    proxying: Proxying,
    body_idle: Duration,
    upstream: upstream::UpstreamBounds,
) -> impl hyper::service::Service<
    axum::http::Request<hyper::body::Incoming>,
    Response = Response,
    Error = Infallible,
    Future = impl Future<Output = Result<Response, Infallible>> + Send + 'static,
> + Send
       + 'static {
    hyper::service::service_fn(
        move |mut request: axum::http::Request<hyper::body::Incoming>| {
            request.extensions_mut().insert(connection.clone());
            request.extensions_mut().insert(upstream);
            let (app, proxying) = (app.clone(), proxying.clone());
            async move {
                if request.method() == Method::CONNECT {
                    match proxying {
                        Proxying::Off => {}
                        Proxying::Intercept(tunnel) => {
                            return Ok(intercept::connect(tunnel, request, app).await)
                        }
                        Proxying::InsideTunnel => {
                            return Ok(intercept::refuse(
                                "sandcove: CONNECT inside a tunnel is refused".into(),
                            ))
                        }
                    }
                }
                let request = request.map(|body| stall::IdleBody::new(body, body_idle));
                tower::ServiceExt::oneshot(app, request).await
            }
        },
    )
}

async fn serve_connections(
    listener: tokio::net::TcpListener,
    app: Router,
    limits: ConnectionLimits,
    ca: Option<Arc<intercept::SandcoveCa>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    on_stop: impl FnOnce(),
) -> std::io::Result<()> {
    let grace = limits.shutdown_grace;
    let head_timeout = limits.head_timeout;
    let (body_idle, write_stall) = (limits.body_idle_timeout, limits.write_stall_timeout);
    let upstream = upstream::UpstreamBounds::new(limits.upstream_answer_timeout, body_idle);
    // Answers wait for a body left unread (bounded), so refusals keep the connection.
    let app = drain::refused_bodies_drained(app, head_timeout);
    let tls = limits.tls.clone().map(tokio_rustls::TlsAcceptor::from);
    let mut acceptor = sandcove_core::listen::Acceptor::new(limits.max_connections);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(head_timeout);
    let proxying = match ca {
        None => Proxying::Off,
        Some(ca) => Proxying::Intercept(Arc::new(intercept::Tunnel {
            ca,
            http: http.clone(),
            head_timeout,
            body_idle,
            upstream,
        })),
    };
    // Every connection, and every connection taken over by an upgrade, holds a receiver:
    // `true` tells them to stop, and the channel closing tells the server they all have.
    let (stop, stopped) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let ((tcp, _), permit) = tokio::select! {
            accepted = acceptor.next(|| listener.accept()) => accepted,
            () = &mut shutdown => break,
        };
        // No Nagle: small frames (a command's output, its exit) must leave at once, not wait
        // for the peer's delayed ACK (~40 ms per round trip otherwise).
        let _ = tcp.set_nodelay(true);
        // Beneath TLS, so what counts is bytes the client takes off the socket.
        let upgraded = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let tcp = stall::StallIo::new(tcp, write_stall, upgraded.clone());
        let connection = upgrade::Connection::new(permit, stopped.clone(), upgraded);
        let service = dispatch(
            app.clone(),
            connection,
            proxying.clone(),
            body_idle,
            upstream,
        );
        let (http, tls, mut stop) = (http.clone(), tls.clone(), stopped.clone());
        tokio::spawn(async move {
            let io: Box<dyn ConnectionIo> = match tls {
                None => Box::new(tcp),
                Some(tls) => match tokio::time::timeout(head_timeout, tls.accept(tcp)).await {
                    Ok(Ok(stream)) => Box::new(stream),
                    _ => return,
                },
            };
            let served = http
                .serve_connection(hyper_util::rt::TokioIo::new(io), service)
                .with_upgrades();
            tokio::pin!(served);
            tokio::select! {
                _ = served.as_mut() => return,
                // A closed channel means the server is gone too.
                _ = stop.wait_for(|stopped| *stopped) => {}
            }
            // Finish the request in flight, if any, then close.
            served.as_mut().graceful_shutdown();
            let _ = served.await;
        });
    }
    // Stop taking connections, cut open streams and upgraded connections, let in-flight
    // calls finish within the grace period.
    drop(listener);
    drop(stopped);
    on_stop();
    let _ = stop.send(true);
    tokio::select! {
        () = stop.closed() => {}
        () = tokio::time::sleep(grace) => {}
    }
    Ok(())
}

/// A client connection, plain or TLS, as the connection loop serves it.
trait ConnectionIo: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> ConnectionIo for T {}

/// Largest certificate or key file read by [`load_tls`].
const MAX_PEM_BYTES: u64 = 1024 * 1024;

/// A TLS configuration from PEM files: `cert` holds the server's certificate chain (leaf
/// first), `key` its private key (PKCS#8, PKCS#1 or SEC1). Files are read bounded; a key
/// readable by group or others is refused, since it would let other local users impersonate
/// the server; so is a leaf every client would refuse (a CA certificate, no subjectAltName,
/// not for servers, expired or not yet valid: see [`certificate`]). Serves HTTP/1.1 only.
pub fn load_tls(
    cert: &std::path::Path,
    key: &std::path::Path,
) -> sandcove_core::Result<Arc<rustls::ServerConfig>> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let certs_pem = read_secret_file(cert, false)?;
    let key_pem = read_secret_file(key, true)?;
    let certs = CertificateDer::pem_slice_iter(&certs_pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Error::invalid(format!("certificate file {}: {e}", cert.display())))?;
    if certs.is_empty() {
        return Err(Error::invalid(format!(
            "certificate file {} holds no PEM certificate",
            cert.display()
        )));
    }
    // Refused here, with the fix, rather than by every client later with a cryptic error.
    if let Err(refusal) =
        certificate::check_server_certificate(&certs[0], std::time::SystemTime::now())
    {
        return Err(Error::invalid(format!(
            "certificate file {}: the server's certificate will not be accepted by TLS \
             clients: {refusal}; {}",
            cert.display(),
            refusal.remedy()
        )));
    }
    let key_der = PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|e| Error::invalid(format!("key file {}: {e}", key.display())))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::backend(format!("TLS setup: {e}")))?
        .with_no_client_auth()
        .with_single_cert(certs, key_der)
        .map_err(|e| Error::invalid(format!("TLS certificate and key: {e}")))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Read a small file whole (at most 1 MiB); with `private`, refuse a regular
/// file that group or others may read.
pub fn read_secret_file(path: &std::path::Path, private: bool) -> sandcove_core::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    let file = std::fs::File::open(path)
        .map_err(|e| Error::from_io(&e, &format!("open {}", path.display())))?;
    let meta = file
        .metadata()
        .map_err(|e| Error::from_io(&e, &format!("stat {}", path.display())))?;
    if !meta.is_file() {
        return Err(Error::invalid(format!(
            "{} is not a regular file",
            path.display()
        )));
    }
    if private && meta.mode() & 0o077 != 0 {
        return Err(Error::PermissionDenied {
            what: format!(
                "{} is readable by other users (mode {:o}): run `chmod 600` on it",
                path.display(),
                meta.mode() & 0o777
            ),
        });
    }
    let mut bytes = Vec::new();
    file.take(MAX_PEM_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::from_io(&e, &format!("read {}", path.display())))?;
    if bytes.len() as u64 > MAX_PEM_BYTES {
        return Err(Error::invalid(format!(
            "{} is larger than {MAX_PEM_BYTES} bytes",
            path.display()
        )));
    }
    Ok(bytes)
}

/// Completes on Ctrl-C (SIGINT) or SIGTERM.
pub async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => futures::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
}

/// A server running on a task of the current runtime, on a loopback port. Dropping it (or
/// [`LocalServer::stop`]) shuts it down.
#[derive(Debug)]
pub struct LocalServer {
    addr: SocketAddr,
    tls: bool,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl LocalServer {
    /// Bind `127.0.0.1:0` and serve `backend` there (over TLS when `config.tls` is set).
    pub async fn start(backend: Arc<dyn Backend>, config: ServerConfig) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let tls = config.tls.is_some();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, backend, config, async move {
            let _ = stopped.await;
        }));
        Ok(LocalServer {
            addr,
            tls,
            stop: Some(stop),
            task: Some(task),
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The base URL, e.g. `http://127.0.0.1:41234` (`https://` when serving TLS).
    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// Shut down gracefully and wait until the server has stopped.
    pub async fn stop(mut self) -> std::io::Result<()> {
        drop(self.stop.take());
        match self.task.take() {
            Some(task) => task
                .await
                .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string()))),
            None => Ok(()),
        }
    }
}

impl Drop for LocalServer {
    fn drop(&mut self) {
        drop(self.stop.take());
    }
}

/// An [`Error`] on its way out as a JSON error answer.
struct ApiError {
    status: Option<StatusCode>,
    error: Error,
}

impl From<Error> for ApiError {
    fn from(error: Error) -> Self {
        ApiError {
            status: None,
            error,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status.unwrap_or_else(|| {
            StatusCode::from_u16(status_for(self.error.code()))
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
        });
        error_response(status, &self.error)
    }
}

fn error_response(status: StatusCode, error: &Error) -> Response {
    let body = serde_json::to_vec(&error.to_body()).unwrap_or_default();
    let mut response = (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response();
    // For the metrics' errors by code.
    response.extensions_mut().insert(error.code());
    match error {
        Error::Unauthenticated { .. } => {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        Error::RateLimited {
            retry_after_ms: Some(ms),
            ..
        } => {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(ms.div_ceil(1000)));
        }
        _ => {}
    }
    response
}

fn too_large(limit: u64) -> ApiError {
    ApiError {
        status: Some(StatusCode::PAYLOAD_TOO_LARGE),
        error: Error::invalid(format!("request body exceeds the {limit}-byte limit")),
    }
}

/// The native API's credential check: the server key (compared in constant time) or a
/// refusal; what it proves is recorded for the routes' own checks.
async fn authenticate(
    State((key, file_urls)): State<(Arc<str>, Arc<sandcove_core::file_url::FileUrlKey>)>,
    request: Request,
    next: Next,
) -> Response {
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    match presented {
        Some(p) if auth::keys_match(p.as_bytes(), key.as_bytes()) => {
            let mut request = request;
            request
                .extensions_mut()
                .insert(auth::Credential::server_key());
            next.run(request).await
        }
        Some(_) => ApiError::from(Error::Unauthenticated {
            message: "wrong API key".into(),
        })
        .into_response(),
        None => {
            // A signed file URL: its token is the credential, bound to its sandbox; one that
            // does not verify (unknown, tampered, expired) is refused here, before routing.
            let prefix = file_urls::prefix();
            let Some(token) = sandcove_core::file_url::token_in_path(request.uri().path(), &prefix)
            else {
                return ApiError::from(Error::Unauthenticated {
                    message: "missing API key (Authorization: Bearer <key>)".into(),
                })
                .into_response();
            };
            match file_urls.verify(token, sandcove_core::now_millis()) {
                Ok(grant) => {
                    let mut request = request;
                    let credential =
                        auth::Credential::for_sandbox(auth::Principal::SignedUrl, &grant.sandbox);
                    request.extensions_mut().insert(credential);
                    request.extensions_mut().insert(grant);
                    next.run(request).await
                }
                Err(e) => ApiError::from(e).into_response(),
            }
        }
    }
}

/// Turn every non-JSON error answer (axum's own rejections: bad query, bad path, wrong
/// method) into a JSON error body, keeping its status.
async fn json_errors(response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if status.as_u16() < 400 || is_json {
        return response;
    }
    let body = axum::body::to_bytes(response.into_body(), 4096)
        .await
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&body).trim().to_string();
    let text = if text.is_empty() {
        status.to_string()
    } else {
        text
    };
    let error = match status {
        StatusCode::NOT_FOUND => Error::not_found(text),
        StatusCode::UNAUTHORIZED => Error::Unauthenticated { message: text },
        StatusCode::FORBIDDEN => Error::PermissionDenied { what: text },
        StatusCode::TOO_MANY_REQUESTS => Error::RateLimited {
            message: text,
            retry_after_ms: None,
        },
        s if s.is_client_error() => Error::invalid(text),
        _ => Error::backend(text),
    };
    error_response(status, &error)
}

async fn fallback(method: Method, uri: Uri) -> ApiError {
    Error::not_found(format!("route {method} {}", uri.path())).into()
}

/// Read a whole body, refusing more than `limit` bytes with `413`.
async fn read_body(headers: &HeaderMap, body: Body, limit: usize) -> Result<Bytes, ApiError> {
    if let Some(len) = content_length(headers) {
        if len > limit as u64 {
            return Err(too_large(limit as u64));
        }
    }
    let mut stream = body.into_data_stream();
    let mut buf = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| Error::invalid(format!("reading the request body: {e}")))?;
        if buf.len() + chunk.len() > limit {
            return Err(too_large(limit as u64));
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf.into())
}

/// Read and decode a JSON body; an empty body is `{}`.
async fn read_json<T: DeserializeOwned>(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<(T, Bytes), ApiError> {
    let limit = state.config.max_body_bytes;
    let bytes = read_body(headers, body, limit).await?;
    let value = json_body::decode(&bytes, limit).map_err(|e| match e {
        json_body::JsonBodyError::TooLarge { limit } => too_large(limit as u64),
        json_body::JsonBodyError::Malformed(reason) => {
            ApiError::from(Error::invalid(format!("request body: {reason}")))
        }
    })?;
    Ok((value, bytes))
}

fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

/// A JSON success answer.
fn json<T: serde::Serialize>(value: &T) -> Response {
    match serde_json::to_vec(value) {
        Ok(body) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            body,
        )
            .into_response(),
        Err(e) => {
            ApiError::from(Error::backend(format!("cannot encode the answer: {e}"))).into_response()
        }
    }
}

/// A success answer without a body.
fn done() -> Response {
    StatusCode::NO_CONTENT.into_response()
}

/// An error as a frame.
fn error_frame(error: &Error) -> Vec<u8> {
    frame::encode(
        frame::ERROR,
        &serde_json::to_vec(&error.to_body()).unwrap_or_default(),
    )
}

/// A JSON value as a frame.
fn json_frame<T: serde::Serialize>(value: &T) -> Vec<u8> {
    match serde_json::to_vec(value) {
        Ok(json) => frame::encode(frame::JSON, &json),
        Err(e) => error_frame(&Error::backend(format!("cannot encode an event: {e}"))),
    }
}

/// A streamed answer of frames, cut with an error frame when the server shuts down.
fn frames_response(
    state: &AppState,
    frames: BoxStream<'static, Vec<u8>>,
    headers: &[(&'static str, String)],
) -> Response {
    pieces_response(state, frames.map(|frame| vec![frame]).boxed(), headers)
}

/// [`frames_response`] for items that are whole frames in pieces (a head, then a payload
/// that crosses without being copied behind it); the shutdown cuts only between items.
fn pieces_response(
    state: &AppState,
    frames: BoxStream<'static, Vec<Vec<u8>>>,
    headers: &[(&'static str, String)],
) -> Response {
    let body = Body::from_stream(until_shutdown(frames, state.shutdown.subscribe()));
    let mut response = (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static(FRAMES_CONTENT_TYPE),
        )],
        body,
    )
        .into_response();
    for (name, value) in headers {
        if let Ok(v) = HeaderValue::from_str(value) {
            response.headers_mut().insert(*name, v);
        }
    }
    response
}

fn until_shutdown(
    frames: BoxStream<'static, Vec<Vec<u8>>>,
    shutdown: watch::Receiver<bool>,
) -> impl Stream<Item = Result<Bytes, Infallible>> + Send {
    let pieces = std::collections::VecDeque::<Vec<u8>>::new();
    futures::stream::unfold(Some((frames, shutdown, pieces)), |state| async move {
        let (mut frames, mut shutdown, mut pieces) = state?;
        // The rest of an item goes out whole: an error frame never lands inside a frame.
        if let Some(piece) = pieces.pop_front() {
            return Some((Ok(Bytes::from(piece)), Some((frames, shutdown, pieces))));
        }
        let stopping = async {
            if shutdown.wait_for(|v| *v).await.is_err() {
                futures::future::pending::<()>().await;
            }
        };
        tokio::select! {
            biased;
            () = stopping => {
                let error = Error::Unavailable {
                    reason: "the server is shutting down".into(),
                    remedy: "retry against a running server".into(),
                };
                Some((Ok(Bytes::from(error_frame(&error))), None))
            }
            next = frames.next() => {
                pieces.extend(next?);
                let first = pieces.pop_front().unwrap_or_default();
                Some((Ok(Bytes::from(first)), Some((frames, shutdown, pieces))))
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_types_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<ServerConfig>();
        check::<LocalServer>();
    }
}
