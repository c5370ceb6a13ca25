//! Preview URLs: a listener per exposed port (on `127.0.0.1` unless configured otherwise),
//! held by whatever serves the sandbox: the engine's monitor, or the Kubernetes backend's
//! serving process.
//!
//! Each listener is an HTTP/1.1 reverse proxy built on hyper, server and client: nothing here
//! reads an HTTP head by hand. A connection is served with keep-alive, and **every request on
//! it is checked** as its head arrives, against the preview and its tokens as they are then:
//! a private preview needs a live token in the configured header or query parameter (a
//! missing or dead one gets `401`, a closed preview `404`) before the sandbox is contacted; a
//! public one needs none, and is otherwise served the same way (it is no longer a raw byte
//! tunnel: a port that does not speak HTTP/1 cannot be previewed). A head hyper cannot parse gets `400` (`431` past [`MAX_HEAD`]
//! bytes); a head that has not come whole within [`PreviewLimits::head_timeout_ms`] gets
//! `408` (an idle kept-alive connection is closed then, without one). A refusal closes the
//! connection, so a client that sends a request without a token never gets another one read.
//!
//! A request let through is forwarded with [`forward::forward`] over its own connection to
//! the port, opened by the listener's [`Upstream`] (the monitor asks its agent, which lives in
//! the sandbox's network namespace, for a connected socket; the Kubernetes backend opens an
//! agent tunnel): one upstream connection per request, as before keep-alive (so an answer can
//! only ever belong to the request it follows, and cutting one request drops exactly its
//! connection). Before it leaves, the token is removed (its header, its query
//! parameter, and any other header or query pair carrying it, such as a `Referer` or a
//! cookie), as are the hop-by-hop headers (RFC 9110 §7.6.1: `Connection` and the headers it
//! names, `Keep-Alive`, `Proxy-Connection`, `TE`, `Trailer`, `Transfer-Encoding`, `Upgrade`,
//! `Proxy-Authorization`); the request says `Connection: close`. Header names keep the
//! client's spelling. The body is framed anew by hyper, so no framing the client chose reaches
//! the sandbox (a request with both `Content-Length` and chunked framing is read as chunked,
//! per RFC 9112, and its connection closes after it). `CONNECT` is refused (`405`).
//!
//! The sandbox's answer is bounded (the forwarding module's bounds, the same as E2B's
//! `get_host`): its head must come within [`PreviewLimits::answer_timeout_ms`] of the
//! request's end (else `504`), and the request itself ends once none of it has moved into the
//! sandbox for that long (`504` when the port takes none, `408` when the client sends none).
//! Once the head is in, no byte of the body may take longer than
//! [`PreviewLimits::answer_idle_ms`] to move, whether the sandbox stops sending or the client
//! stops taking (else both connections close). A WebSocket (any `Connection: upgrade`)
//! becomes a raw tunnel only once the sandbox answers `101`. Each listener serves at most
//! [`PreviewLimits::max_connections`] connections at once (a tunnel keeps its slot); the rest
//! wait in the kernel's backlog. Revoking a token, its expiry, changing a preview's settings
//! or closing it cuts the requests, answers and tunnels it no longer allows; a kept-alive
//! connection between requests holds no access, its next request is checked afresh.
//!
//! [`PreviewSet`] is that whole behaviour for one sandbox; its holder supplies only the
//! [`Upstream`]. Tokens live in the holder's memory.
//!
//! The bounded forwarding lives in [`crate::forward`] rather than here or in
//! `sandcove-server` because both the preview listeners and E2B's `get_host` forwarding (a
//! handler of a `sandcove serve` listener, which sees this crate through the umbrella) use it,
//! and the server and this crate may not depend on each other.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::header::{HeaderMap, HeaderName, HeaderValue, CONNECTION, CONTENT_TYPE, UPGRADE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify, OwnedSemaphorePermit};
use tokio::time::Instant;

use crate::client::AgentIo;
use crate::forward::{self, AnswerBody, BoxError, UpstreamBounds};
use sandcove_core::{now_millis, Error, Preview, PreviewOptions, PreviewToken, Result};

/// Largest request head a preview reads; a larger one (or one of more than hyper's 100
/// header fields) gets `431`.
pub const MAX_HEAD: usize = 64 * 1024;

/// Most live tokens one preview holds at once (expired ones are dropped when another is
/// made), so a caller minting tokens in a loop cannot grow the monitor without bound.
pub const MAX_TOKENS: usize = 1000;

/// Most ports one sandbox exposes at once. Each is a listener (a descriptor and a loopback
/// port) held by the monitor, or by the serving process for every Kubernetes sandbox, so a
/// caller exposing ports in a loop could otherwise exhaust the descriptors the holder serves
/// everyone with, and the host's loopback ports.
pub const MAX_PREVIEWS: usize = 64;

/// One exposed port.
pub struct Exposed {
    /// What callers see.
    pub preview: Preview,
    /// Every token issued for it (the first one is `preview.token`).
    pub tokens: Vec<PreviewToken>,
    /// The accept loop; aborted when the preview closes.
    pub task: tokio::task::JoinHandle<()>,
    /// Signalled when a token is revoked or the preview's settings change, and dropped when
    /// it closes: connections already let through re-check that they are still allowed.
    pub changed: tokio::sync::watch::Sender<()>,
}

impl Exposed {
    /// Drop expired tokens and make room for one more, or say why there is none.
    pub fn room_for_token(&mut self) -> Result<()> {
        let now = now_millis();
        self.tokens.retain(|t| t.expires_at.is_none_or(|e| now < e));
        if self.tokens.len() >= MAX_TOKENS {
            return Err(Error::invalid(format!(
                "the preview of port {} already has {MAX_TOKENS} live tokens: revoke some first",
                self.preview.port
            )));
        }
        Ok(())
    }

    /// Whether a connection let through by `token` (`None`: a public preview's) may go on:
    /// its token still held and not expired.
    pub fn still_allows(&self, token: Option<&PreviewToken>) -> bool {
        let now = now_millis();
        match token {
            None => self.preview.public,
            Some(token) => {
                !self.preview.public
                    && self.tokens.iter().any(|t| {
                        sandcove_core::secret::secrets_match(
                            t.value.as_bytes(),
                            token.value.as_bytes(),
                        ) && t.expires_at.is_none_or(|e| now < e)
                    })
            }
        }
    }
}

/// The timer of `port`'s preview: signals its connections (through [`Exposed::changed`]) at
/// each of its tokens' expiries, so a connection a token let through is cut when that token
/// expires, as when it is revoked. One per preview, however many tokens and connections it
/// has; `changes` (a receiver of the preview's signal) tells it to look at the tokens again,
/// and ends it when the preview closes.
pub async fn expire_tokens(
    previews: Previews,
    port: u16,
    mut changes: tokio::sync::watch::Receiver<()>,
) {
    loop {
        let next = {
            let map = previews.lock().unwrap_or_else(|e| e.into_inner());
            let Some(exposed) = map.get(&port) else {
                return;
            };
            let now = now_millis();
            exposed
                .tokens
                .iter()
                .filter_map(|t| t.expires_at)
                .filter(|&at| at > now)
                .min()
        };
        let expiry = async {
            match next {
                Some(at) => {
                    let wait = at.saturating_sub(now_millis());
                    tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            changed = changes.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            () = expiry => {
                let map = previews.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(exposed) = map.get(&port) {
                    exposed.changed.send_replace(());
                }
            }
        }
    }
}

/// The previews of one sandbox, by sandbox port.
pub type Previews = Arc<Mutex<BTreeMap<u16, Exposed>>>;

/// A fresh random token (128 bits, hex).
pub fn new_token(ttl_ms: Option<u64>) -> PreviewToken {
    let a = crate::new_id();
    let b = crate::new_id();
    PreviewToken {
        value: format!("{a}{b}"),
        expires_at: ttl_ms.map(|t| now_millis() + t),
    }
}

/// Bind a listener for a new preview on `ip` (a port the kernel picks). Returns it with its
/// URL and host: `url_host` with that port when given (the name clients reach it by), else
/// the bound address.
pub async fn bind(ip: IpAddr, url_host: Option<&str>) -> Result<(TcpListener, String, String)> {
    let listener = TcpListener::bind((ip, 0))
        .await
        .map_err(|e| Error::from_io(&e, "bind a preview port"))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::from_io(&e, "preview port"))?;
    let host = match url_host {
        Some(name) => format!("{name}:{}", addr.port()),
        None => SocketAddr::new(ip, addr.port()).to_string(),
    };
    Ok((listener, format!("http://{host}"), host))
}

/// Build the preview record for `options` served at `url`.
pub fn describe(
    options: &PreviewOptions,
    url: String,
    host: String,
) -> (Preview, Vec<PreviewToken>) {
    let tokens = if options.public {
        Vec::new()
    } else {
        vec![new_token(options.token_ttl.map(|d| d.as_millis() as u64))]
    };
    (
        Preview {
            port: options.port,
            url,
            host,
            public: options.public,
            token: tokens.first().cloned(),
            token_header: options.token_header.clone(),
            token_query: options.token_query.clone(),
            request_headers: options.request_headers.clone(),
            response_headers: options.response_headers.clone(),
        },
        tokens,
    )
}

/// Limits on each preview listener. Stored in the sandbox's record at create, so the
/// monitor applies the values the creating program chose. Built from
/// [`PreviewLimits::default`] and its setters (more limits may come).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PreviewLimits {
    /// How long a client may take to send a request head, in ms, on a new connection or
    /// after the previous answer; a slower one gets `408` and is closed (an idle kept-alive
    /// connection is closed without it).
    pub head_timeout_ms: u64,
    /// Connections served at once per preview; further ones wait in the kernel's backlog.
    pub max_connections: usize,
    /// How long the sandbox may take for the head of its answer to a request, in ms, from
    /// the request's end; then the client gets `504` and both connections close. Also the
    /// longest the request's own bytes may stop moving into the sandbox (then `504`, or
    /// `408` when it is the client that sends nothing).
    #[serde(default = "default_answer_ms")]
    pub answer_timeout_ms: u64,
    /// How long the answer to a request may bring no byte (or the client take none of it)
    /// once its head is in, in ms; then both connections close.
    #[serde(default = "default_answer_ms")]
    pub answer_idle_ms: u64,
}

/// What records made before the answer bounds existed get.
fn default_answer_ms() -> u64 {
    60_000
}

impl PreviewLimits {
    /// These limits with `ms` milliseconds for a request head.
    pub fn head_timeout_ms(mut self, ms: u64) -> Self {
        self.head_timeout_ms = ms;
        self
    }

    /// These limits with at most `n` connections served at once per preview.
    pub fn max_connections(mut self, n: usize) -> Self {
        self.max_connections = n;
        self
    }

    /// These limits with `ms` milliseconds for the head of the sandbox's answer to a
    /// request.
    pub fn answer_timeout_ms(mut self, ms: u64) -> Self {
        self.answer_timeout_ms = ms;
        self
    }

    /// These limits with `ms` milliseconds without a byte of an answer moving, once its head
    /// is in.
    pub fn answer_idle_ms(mut self, ms: u64) -> Self {
        self.answer_idle_ms = ms;
        self
    }
}

impl Default for PreviewLimits {
    /// 10 s per request head, 256 connections per preview, 60 s for the head of the
    /// sandbox's answer and 60 s without a byte of it moving.
    fn default() -> Self {
        PreviewLimits {
            head_timeout_ms: 10_000,
            max_connections: 256,
            answer_timeout_ms: default_answer_ms(),
            answer_idle_ms: default_answer_ms(),
        }
    }
}

/// Why a forwarded request cannot reach the sandbox's port; the client is told and its
/// connection closed.
#[derive(Debug)]
pub enum UpstreamError {
    /// The sandbox cannot serve now (stopped, paused, gone): `503` with why.
    Unavailable(String),
    /// The port could not be reached: `502` with why.
    BadGateway(String),
    /// Close without an answer.
    Closed,
}

/// Opens the byte stream a forwarded request travels on (one per request): the engine's
/// monitor asks its agent for a socket connected inside the sandbox, the Kubernetes backend
/// opens an agent tunnel. Everything else (HTTP, tokens, limits, revocation) is
/// [`PreviewSet`]'s, shared by both.
#[async_trait]
pub trait Upstream: Send + Sync {
    /// A stream connected to `port` inside the sandbox.
    async fn connect(&self, port: u16) -> std::result::Result<Box<dyn AgentIo>, UpstreamError>;
}

/// The previews of one sandbox: a listener per exposed port, its tokens, and the
/// connections each let through. Dropping the set closes every preview.
pub struct PreviewSet {
    previews: Previews,
    bind: IpAddr,
    url_host: Option<String>,
}

impl Default for PreviewSet {
    /// Listeners on `127.0.0.1`, URLs naming that address.
    fn default() -> Self {
        PreviewSet::new(IpAddr::V4(Ipv4Addr::LOCALHOST), None)
    }
}

impl Drop for PreviewSet {
    fn drop(&mut self) {
        self.close_all();
    }
}

impl PreviewSet {
    /// Previews listening on `bind`, their URLs naming `url_host` (else the bound address).
    pub fn new(bind: IpAddr, url_host: Option<String>) -> Self {
        PreviewSet {
            previews: Arc::new(Mutex::new(BTreeMap::new())),
            bind,
            url_host,
        }
    }

    /// Serve `options.port` of the sandbox, reached through `upstream`, with `limits`. The
    /// same port again keeps its URL and takes the new settings (connections open under
    /// the old ones re-check them). A new port while [`MAX_PREVIEWS`] are exposed is
    /// [`Error::InvalidArgument`].
    pub async fn expose(
        &self,
        options: PreviewOptions,
        limits: PreviewLimits,
        upstream: Arc<dyn Upstream>,
    ) -> Result<Preview> {
        if options.port == 0 {
            return Err(Error::invalid("port must be between 1 and 65535"));
        }
        for name in [&options.token_header, &options.token_query] {
            if name.is_empty()
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            {
                return Err(Error::invalid(format!("bad token parameter name {name:?}")));
            }
        }
        options.validate()?;
        let full = || {
            Error::invalid(format!(
                "the sandbox already exposes {MAX_PREVIEWS} ports: close a preview first"
            ))
        };
        {
            let mut previews = self.lock();
            if let Some(existing) = previews.get_mut(&options.port) {
                return update(existing, &options);
            }
            if previews.len() >= MAX_PREVIEWS {
                return Err(full());
            }
        }
        let (listener, url, host) = bind(self.bind, self.url_host.as_deref()).await?;
        let mut previews = self.lock();
        if let Some(existing) = previews.get_mut(&options.port) {
            // Exposed by a concurrent call meanwhile: ours is a settings change.
            return update(existing, &options);
        }
        if previews.len() >= MAX_PREVIEWS {
            // Filled by concurrent calls meanwhile.
            return Err(full());
        }
        let (preview, tokens) = describe(&options, url, host);
        let port = options.port;
        let served = self.previews.clone();
        let task = tokio::spawn(async move {
            let mut acceptor = sandcove_core::listen::Acceptor::new(limits.max_connections);
            loop {
                let ((conn, _), permit) = acceptor.next(|| listener.accept()).await;
                tokio::spawn(serve_connection(
                    served.clone(),
                    upstream.clone(),
                    port,
                    limits,
                    conn,
                    permit,
                ));
            }
        });
        let (changed, changes) = tokio::sync::watch::channel(());
        previews.insert(
            port,
            Exposed {
                preview: preview.clone(),
                tokens,
                task,
                changed,
            },
        );
        // Cuts what each token let through when it expires.
        tokio::spawn(expire_tokens(self.previews.clone(), port, changes));
        Ok(preview)
    }

    /// Every preview, by port.
    pub fn list(&self) -> Vec<Preview> {
        self.lock().values().map(|e| e.preview.clone()).collect()
    }

    /// Close the preview of `port`: its listener stops and its connections end.
    pub fn close(&self, port: u16) -> Result<()> {
        let entry = self
            .lock()
            .remove(&port)
            .ok_or_else(|| Error::not_found(format!("preview of port {port}")))?;
        entry.task.abort();
        Ok(())
    }

    /// Close every preview (the sandbox is gone).
    pub fn close_all(&self) {
        let all = std::mem::take(&mut *self.lock());
        for entry in all.into_values() {
            entry.task.abort();
        }
    }

    /// Another token for the private preview of `port`, expiring at `expires_at`.
    pub fn create_token(&self, port: u16, expires_at: Option<u64>) -> Result<PreviewToken> {
        let mut previews = self.lock();
        let entry = previews
            .get_mut(&port)
            .ok_or_else(|| Error::not_found(format!("preview of port {port}")))?;
        if entry.preview.public {
            return Err(Error::invalid(format!(
                "the preview of port {port} is public: it takes no tokens"
            )));
        }
        entry.room_for_token()?;
        let mut token = new_token(None);
        token.expires_at = expires_at;
        entry.tokens.push(token.clone());
        // The preview's expiry timer looks at the new token's expiry.
        entry.changed.send_replace(());
        Ok(token)
    }

    /// Revoke `token` of the preview of `port`; the connections it let through end now.
    pub fn revoke_token(&self, port: u16, token: &str) -> Result<()> {
        let mut previews = self.lock();
        let entry = previews
            .get_mut(&port)
            .ok_or_else(|| Error::not_found(format!("preview of port {port}")))?;
        let before = entry.tokens.len();
        // Compared in constant time, as the proxy compares them.
        entry.tokens.retain(|t| {
            !sandcove_core::secret::secrets_match(t.value.as_bytes(), token.as_bytes())
        });
        if entry.tokens.len() == before {
            return Err(Error::not_found(format!(
                "that token of the preview of port {port}"
            )));
        }
        entry.changed.send_replace(());
        // The token a later `expose` of this port reports must still be a live one.
        if entry.preview.token.as_ref().is_some_and(|t| {
            sandcove_core::secret::secrets_match(t.value.as_bytes(), token.as_bytes())
        }) {
            entry.preview.token = entry.tokens.last().cloned();
        }
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u16, Exposed>> {
        self.previews.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Apply new settings to an exposed port, keeping its URL.
fn update(existing: &mut Exposed, options: &PreviewOptions) -> Result<Preview> {
    let (mut preview, tokens) = describe(
        options,
        existing.preview.url.clone(),
        existing.preview.host.clone(),
    );
    if !options.public {
        let live = existing
            .tokens
            .iter()
            .find(|t| t.expires_at.is_none_or(|e| e > now_millis()))
            .cloned();
        match live {
            Some(t) if options.token_ttl.is_none() => preview.token = Some(t),
            _ => {
                existing.room_for_token()?;
                existing.tokens.extend(tokens);
            }
        }
        if preview.token.is_none() {
            preview.token = existing.tokens.last().cloned();
        }
    } else {
        existing.tokens.clear();
    }
    existing.preview = preview.clone();
    // Open connections re-check against the new settings (public or not).
    existing.changed.send_replace(());
    Ok(preview)
}

/// The preview of `port` as it is now, its tokens, and a receiver of its changes.
fn preview_now(
    previews: &Previews,
    port: u16,
) -> Option<(Preview, Vec<PreviewToken>, tokio::sync::watch::Receiver<()>)> {
    previews
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&port)
        .map(|e| (e.preview.clone(), e.tokens.clone(), e.changed.subscribe()))
}

/// Resolves once a connection let through by `token` (`None`: a public preview's) is no
/// longer allowed: its token revoked, the preview made private or public, or closed.
async fn access_lost(
    previews: &Previews,
    port: u16,
    token: Option<PreviewToken>,
    mut changes: tokio::sync::watch::Receiver<()>,
) {
    loop {
        if changes.changed().await.is_err() {
            return;
        }
        let allowed = previews
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&port)
            .is_some_and(|e| e.still_allows(token.as_ref()));
        if !allowed {
            return;
        }
    }
}

/// The bounds [`forward`] holds a preview's requests to.
fn upstream_bounds(limits: &PreviewLimits) -> UpstreamBounds {
    UpstreamBounds::new(
        Duration::from_millis(limits.answer_timeout_ms),
        Duration::from_millis(limits.answer_idle_ms),
    )
}

/// What a preview connection is doing, for the watch its driver keeps on it.
enum Phase {
    /// Waiting for a request head since `since`. `first`: none has come on this connection
    /// yet; `read_at`: the bytes read from the client by `since`.
    Head {
        since: Instant,
        first: bool,
        read_at: u64,
    },
    /// Answering without the sandbox (a refusal) since `since`; the connection closes after.
    Refusing { since: Instant },
    /// Forwarding request `number`, let through by `access`, which must stay allowed while
    /// it lasts; once its answer flows, `answer` notes when bytes of it last moved.
    Forwarding {
        number: u64,
        access: Access,
        answer: Option<Arc<forward::Progress>>,
    },
}

/// What let a request through: its token (`None`: a public preview's) and the preview's
/// change signal as it stood when the token was checked, so a change made since is seen.
#[derive(Clone)]
struct Access {
    token: Option<PreviewToken>,
    changes: watch::Receiver<()>,
}

/// What the driver of a connection watches for, from its [`Phase`].
enum Watch {
    /// A head due by then (`true`), or a refusal to be written by then (`false`).
    Deadline(Instant, bool),
    /// A forwarded request: what let it through, and its answer's progress once it flows.
    Forwarding(Access, Option<Arc<forward::Progress>>),
}

/// Why the driver stops serving a connection before hyper is done with it.
enum Stop {
    /// No request head came in time.
    HeadLate,
    /// What let the request through is gone, its answer stalled, or a refusal is stuck.
    Cut,
}

/// The service's error: end the connection without an answer.
#[derive(Debug)]
struct Cut;

impl std::fmt::Display for Cut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("preview connection cut")
    }
}

impl std::error::Error for Cut {}

/// A preview's answer body: a refusal's text or the sandbox's answer.
type Reply = UnsyncBoxBody<Bytes, BoxError>;

/// One client connection of a preview listener: what its requests share.
struct Connection {
    previews: Previews,
    upstream: Arc<dyn Upstream>,
    port: u16,
    limits: PreviewLimits,
    /// The connection's slot in the listener's cap, held as long as the connection or the
    /// tunnel an upgrade makes of it.
    _permit: OwnedSemaphorePermit,
    phase: Mutex<Phase>,
    /// Told when `phase` changes.
    phase_changed: Notify,
    /// Requests seen so far.
    requests: AtomicU64,
    /// Bytes read from the client so far.
    read: AtomicU64,
    /// Whether the last write to the client waits for it to take bytes.
    write_waiting: AtomicBool,
}

impl Connection {
    fn phase(&self) -> std::sync::MutexGuard<'_, Phase> {
        self.phase.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_phase(&self, phase: Phase) {
        *self.phase() = phase;
        self.phase_changed.notify_one();
    }

    /// Request `number`'s answer is out (or dropped): the next head is awaited from now.
    fn answered(&self, number: u64) {
        let mut phase = self.phase();
        if matches!(*phase, Phase::Forwarding { number: n, .. } if n == number) {
            *phase = Phase::Head {
                since: Instant::now(),
                first: false,
                read_at: self.read.load(Ordering::Relaxed),
            };
            drop(phase);
            self.phase_changed.notify_one();
        }
    }

    fn watch(&self) -> Watch {
        let head = Duration::from_millis(self.limits.head_timeout_ms);
        match &*self.phase() {
            Phase::Head { since, .. } => Watch::Deadline(*since + head, true),
            Phase::Refusing { since } => Watch::Deadline(*since + head, false),
            Phase::Forwarding { access, answer, .. } => {
                Watch::Forwarding(access.clone(), answer.clone())
            }
        }
    }

    /// Resolves when what `watch` watches for happens.
    async fn until(&self, watch: Watch) -> Stop {
        match watch {
            Watch::Deadline(at, head) => {
                tokio::time::sleep_until(at).await;
                if head {
                    Stop::HeadLate
                } else {
                    Stop::Cut
                }
            }
            Watch::Forwarding(access, answer) => {
                let idle = Duration::from_millis(self.limits.answer_idle_ms);
                let stalled = async {
                    match answer {
                        Some(progress) => progress.idle_for(idle).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    () = access_lost(&self.previews, self.port, access.token, access.changes) => {}
                    () = stalled => {}
                }
                Stop::Cut
            }
        }
    }

    /// Whether a head that did not come in time gets `408`: part of one came (or none at all
    /// on a new connection; an idle kept-alive one is just closed), and no write to the
    /// client is stuck (hyper's unwritten bytes would be lost before it).
    fn late_head_is_answered(&self) -> bool {
        match *self.phase() {
            Phase::Head { first, read_at, .. } => {
                !self.write_waiting.load(Ordering::Relaxed)
                    && (first || self.read.load(Ordering::Relaxed) > read_at)
            }
            _ => false,
        }
    }

    /// A refusal, the connection then closed.
    fn refuse(&self, status: StatusCode, message: impl Into<String>) -> Response<Reply> {
        self.set_phase(Phase::Refusing {
            since: Instant::now(),
        });
        let mut response = Response::new(message.into() + "\n");
        *response.status_mut() = status;
        response.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        closing(response)
    }

    /// Answer one request (see the module docs).
    async fn serve(
        self: Arc<Self>,
        mut request: Request<Incoming>,
    ) -> Result<Response<Reply>, Cut> {
        let number = self.requests.fetch_add(1, Ordering::Relaxed) + 1;
        self.set_phase(Phase::Refusing {
            since: Instant::now(),
        });
        // The preview and its tokens as they are now that the head is here, not as they were
        // when the connection opened: a token revoked (or a preview closed) meanwhile lets
        // nothing through.
        let Some((preview, tokens, changes)) = preview_now(&self.previews, self.port) else {
            return Ok(self.refuse(StatusCode::NOT_FOUND, "this preview is closed"));
        };
        let token = if preview.public {
            None
        } else {
            let Some(token) = live_token(&request, &preview, &tokens) else {
                let message = format!(
                    "this preview is private: send its token in the {} header or the {} query parameter",
                    preview.token_header, preview.token_query
                );
                return Ok(self.refuse(StatusCode::UNAUTHORIZED, message));
            };
            Some(token)
        };
        if request.method() == Method::CONNECT {
            let message = "a preview forwards requests to the sandbox's server; it opens no tunnel";
            return Ok(self.refuse(StatusCode::METHOD_NOT_ALLOWED, message));
        }
        let upgrade = wants_upgrade(request.headers());
        let client_side = upgrade.then(|| hyper::upgrade::on(&mut request));
        let Some(outgoing) = outgoing(request, &preview, token.as_ref(), upgrade) else {
            return Ok(self.refuse(StatusCode::BAD_REQUEST, "bad request target"));
        };
        let access = Access { token, changes };
        self.set_phase(Phase::Forwarding {
            number,
            access: access.clone(),
            answer: None,
        });
        let io = match self.upstream.connect(self.port).await {
            Ok(io) => io,
            Err(UpstreamError::Unavailable(why)) => {
                return Ok(self.refuse(StatusCode::SERVICE_UNAVAILABLE, why))
            }
            Err(UpstreamError::BadGateway(why)) => {
                return Ok(self.refuse(StatusCode::BAD_GATEWAY, why))
            }
            Err(UpstreamError::Closed) => return Err(Cut),
        };
        let bounds = upstream_bounds(&self.limits);
        let what = format!("port {} of the sandbox", self.port);
        let mut answer = match forward::forward(io, outgoing, bounds).await {
            Ok(answer) => answer,
            Err(failure) => {
                return Ok(self.refuse(failure.status(), failure.message(&what, &bounds)));
            }
        };
        let switched = answer.status() == StatusCode::SWITCHING_PROTOCOLS;
        if switched {
            // Raw bytes only once the sandbox agrees to switch protocols, and only when asked.
            let Some(client_side) = client_side else {
                let message = format!("{what} switched protocols unasked");
                return Ok(self.refuse(StatusCode::BAD_GATEWAY, message));
            };
            let sandbox_side = hyper::upgrade::on(&mut answer);
            tokio::spawn(tunnel(
                self.clone(),
                access.clone(),
                client_side,
                sandbox_side,
            ));
        }
        strip_hop_by_hop(answer.headers_mut(), switched);
        set_headers(answer.headers_mut(), &preview.response_headers);
        self.set_phase(Phase::Forwarding {
            number,
            access,
            answer: Some(answer.body().progress()),
        });
        let connection = self.clone();
        Ok(answer.map(|body| {
            Tracked {
                body,
                connection,
                number,
            }
            .boxed_unsync()
        }))
    }
}

/// `response` (a refusal's) with `Connection: close` and its text as the body.
fn closing(mut response: Response<String>) -> Response<Reply> {
    response
        .headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    response.map(|text| {
        Full::new(Bytes::from(text))
            .map_err(|never| match never {})
            .boxed_unsync()
    })
}

/// A forwarded answer's body, which tells its connection when it is out.
struct Tracked {
    body: AnswerBody,
    connection: Arc<Connection>,
    number: u64,
}

impl Body for Tracked {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<std::result::Result<Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.connection.answered(self.number);
    }
}

/// The client's connection as hyper serves it, noting what the driver needs: bytes read, and
/// whether a write waits for the client.
struct ClientIo {
    tcp: TcpStream,
    connection: Arc<Connection>,
}

impl AsyncRead for ClientIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.tcp).poll_read(cx, buf);
        let read = (buf.filled().len() - before) as u64;
        this.connection.read.fetch_add(read, Ordering::Relaxed);
        polled
    }
}

impl AsyncWrite for ClientIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.tcp).poll_write(cx, buf);
        let waiting = polled.is_pending();
        this.connection
            .write_waiting
            .store(waiting, Ordering::Relaxed);
        polled
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.tcp).poll_write_vectored(cx, bufs);
        let waiting = polled.is_pending();
        this.connection
            .write_waiting
            .store(waiting, Ordering::Relaxed);
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_shutdown(cx)
    }
}

/// Serve one accepted connection of the preview of `port` until it ends, or until the
/// driver's watch (head deadline, lost access, stalled answer) ends it.
async fn serve_connection(
    previews: Previews,
    upstream: Arc<dyn Upstream>,
    port: u16,
    limits: PreviewLimits,
    tcp: TcpStream,
    permit: OwnedSemaphorePermit,
) {
    // No Nagle: an answer's small pieces (a stream of events) leave at once.
    let _ = tcp.set_nodelay(true);
    let connection = Arc::new(Connection {
        previews,
        upstream,
        port,
        limits,
        _permit: permit,
        phase: Mutex::new(Phase::Head {
            since: Instant::now(),
            first: true,
            read_at: 0,
        }),
        phase_changed: Notify::new(),
        requests: AtomicU64::new(0),
        read: AtomicU64::new(0),
        write_waiting: AtomicBool::new(false),
    });
    let io = ClientIo {
        tcp,
        connection: connection.clone(),
    };
    let service = {
        let connection = connection.clone();
        hyper::service::service_fn(move |request| {
            let connection = connection.clone();
            Box::pin(connection.serve(request))
        })
    };
    let mut http = hyper::server::conn::http1::Builder::new();
    // The head deadline is the driver's (hyper's own closes without a `408`); a client may
    // close its sending side and still get its answer.
    http.header_read_timeout(None)
        .half_close(true)
        .max_buf_size(MAX_HEAD)
        .max_header_size(MAX_HEAD)
        .preserve_header_case(true);
    let mut served = http
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades();
    let stop = loop {
        let watch = connection.watch();
        tokio::select! {
            biased;
            _ = &mut served => return,
            () = connection.phase_changed.notified() => {}
            stop = connection.until(watch) => break stop,
        }
    };
    if matches!(stop, Stop::HeadLate) && connection.late_head_is_answered() {
        if let Some(parts) = served.into_parts() {
            // hyper has written nothing it still holds (no write waits) and parsed no head:
            // the fixed answer goes straight to the client, bounded like a head.
            let mut client = parts.io.into_inner();
            let body = "the request head did not arrive in time\n";
            let answer = format!(
                "HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let head = Duration::from_millis(limits.head_timeout_ms);
            let _ = tokio::time::timeout(head, async {
                client.write_all(answer.as_bytes()).await?;
                client.shutdown().await
            })
            .await;
        }
    }
}

/// Once both sides have switched protocols, copy bytes both ways until either ends or what
/// let the upgrade through is no longer allowed.
async fn tunnel(
    connection: Arc<Connection>,
    access: Access,
    client_side: hyper::upgrade::OnUpgrade,
    sandbox_side: hyper::upgrade::OnUpgrade,
) {
    let copy = async {
        let (client, sandbox) = tokio::join!(client_side, sandbox_side);
        let (Ok(client), Ok(sandbox)) = (client, sandbox) else {
            return;
        };
        let mut client = TokioIo::new(client);
        let mut sandbox = TokioIo::new(sandbox);
        let _ = tokio::io::copy_bidirectional(&mut client, &mut sandbox).await;
    };
    tokio::select! {
        () = copy => {}
        () = access_lost(&connection.previews, connection.port, access.token, access.changes) => {}
    }
}

/// Whether a request asks to switch protocols: an `Upgrade` header and `upgrade` among the
/// `Connection` options.
fn wants_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(UPGRADE) && connection_options(headers).any(|o| o == "upgrade")
}

/// The options of the `Connection` headers, lowercased.
fn connection_options(headers: &HeaderMap) -> impl Iterator<Item = String> + '_ {
    headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|o| o.trim().to_ascii_lowercase())
        .filter(|o| !o.is_empty())
}

/// Headers that concern one hop only (RFC 9110 §7.6.1), besides those `Connection` names.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Remove the hop-by-hop headers; with `upgrade`, keep the protocol asked for (or agreed to)
/// and say `Connection: upgrade`.
fn strip_hop_by_hop(headers: &mut HeaderMap, upgrade: bool) {
    let protocol = headers.get(UPGRADE).cloned();
    let named: Vec<HeaderName> = connection_options(headers)
        .filter_map(|o| HeaderName::from_bytes(o.as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    if let (true, Some(protocol)) = (upgrade, protocol) {
        headers.insert(UPGRADE, protocol);
        headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
    }
}

/// The live token `request` carries in the preview's header or query parameter, if any.
fn live_token(
    request: &Request<Incoming>,
    preview: &Preview,
    tokens: &[PreviewToken],
) -> Option<PreviewToken> {
    let mut offered: Vec<Vec<u8>> = Vec::new();
    if let Ok(name) = HeaderName::from_bytes(preview.token_header.as_bytes()) {
        offered.extend(
            request
                .headers()
                .get_all(name)
                .iter()
                .map(|v| v.as_bytes().to_vec()),
        );
    }
    if let Some(query) = request.uri().query() {
        offered.extend(
            form_urlencoded::parse(query.as_bytes())
                .filter(|(k, _)| *k == preview.token_query)
                .map(|(_, v)| v.into_owned().into_bytes()),
        );
    }
    let now = now_millis();
    offered.iter().find_map(|o| {
        tokens
            .iter()
            .find(|t| {
                sandcove_core::secret::secrets_match(o, t.value.as_bytes())
                    && t.expires_at.is_none_or(|e| now < e)
            })
            .cloned()
    })
}

/// `request` as the sandbox gets it: the target in origin form, without the token (see the
/// module docs) and the hop-by-hop headers, saying `Connection: close` unless it asks for an
/// `upgrade`. `None` when the target left is not a valid one.
fn outgoing(
    request: Request<Incoming>,
    preview: &Preview,
    token: Option<&PreviewToken>,
    upgrade: bool,
) -> Option<Request<Incoming>> {
    let (mut parts, body) = request.into_parts();
    let path = match parts.uri.path() {
        "" => "/",
        path => path,
    };
    let query = match (parts.uri.query(), token) {
        (Some(query), Some(token)) => without_token(query, &preview.token_query, &token.value),
        (Some(query), None) => query.to_string(),
        (None, _) => String::new(),
    };
    let target = if query.is_empty() {
        path.to_string()
    } else {
        format!("{path}?{query}")
    };
    parts.uri = target.parse().ok()?;
    strip_hop_by_hop(&mut parts.headers, upgrade);
    if let Some(token) = token {
        // The token never reaches the sandboxed server (code in the sandbox could log it or
        // use it): not in its header, nor in any other (a browser repeats the URL it came
        // from, token parameter included, in `Referer`; a client may keep it in a cookie).
        let named = HeaderName::from_bytes(preview.token_header.as_bytes()).ok();
        let all = std::mem::take(&mut parts.headers);
        for (name, value) in &all {
            if Some(name) != named.as_ref() && !carries(value.as_bytes(), &token.value) {
                parts.headers.append(name.clone(), value.clone());
            }
        }
    }
    set_headers(&mut parts.headers, &preview.request_headers);
    if !upgrade {
        parts
            .headers
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    Some(Request::from_parts(parts, body))
}

/// Set each of a preview's `headers` on a forwarded message, replacing what it had under
/// that name ([`PreviewOptions::validate`] admitted only valid names and values).
fn set_headers(headers: &mut HeaderMap, set: &BTreeMap<String, String>) {
    for (name, value) in set {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            headers.insert(name, value);
        }
    }
}

/// `query` without the pairs named `name` and those carrying `token`, however encoded; the
/// others unchanged, in order.
fn without_token(query: &str, name: &str, token: &str) -> String {
    query
        .split('&')
        .filter(|pair| {
            let decoded = form_urlencoded::parse(pair.as_bytes()).next();
            let carrying = carries(pair.as_bytes(), token)
                || decoded
                    .is_some_and(|(k, v)| k == name || k.contains(token) || v.contains(token));
            !carrying
        })
        .collect::<Vec<_>>()
        .join("&")
}

/// Whether `value` holds `token`, as it is or percent-decoded.
fn carries(value: &[u8], token: &str) -> bool {
    let token = token.as_bytes();
    let holds = |haystack: &[u8]| haystack.windows(token.len()).any(|w| w == token);
    !token.is_empty()
        && (holds(value) || holds(&percent_encoding::percent_decode(value).collect::<Vec<u8>>()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::Empty;
    use tokio::io::AsyncReadExt;

    /// Longest wait for anything in these tests (loopback and in-process only).
    const PATIENCE: Duration = Duration::from_secs(20);

    /// What the fake sandbox saw of one request: its target and headers.
    #[derive(Debug, Clone)]
    struct Seen {
        target: String,
        headers: Vec<(String, String)>,
    }

    /// A sandbox port served in-process by hyper: answers `200` with the request's target
    /// (and a `Keep-Alive` header of its own), or `101` and an echo to a request asking to
    /// upgrade; notes every request and every connection opened to it.
    #[derive(Default)]
    struct FakeSandbox {
        seen: Arc<Mutex<Vec<Seen>>>,
        connections: AtomicU64,
    }

    impl FakeSandbox {
        fn seen(&self) -> Vec<Seen> {
            self.seen.lock().unwrap().clone()
        }
    }

    async fn sandbox_answer(
        seen: Arc<Mutex<Vec<Seen>>>,
        mut request: Request<Incoming>,
    ) -> std::result::Result<Response<Full<Bytes>>, std::convert::Infallible> {
        seen.lock().unwrap().push(Seen {
            target: request.uri().to_string(),
            headers: request
                .headers()
                .iter()
                .map(|(n, v)| (n.to_string(), String::from_utf8_lossy(v.as_bytes()).into()))
                .collect(),
        });
        if request.headers().contains_key(UPGRADE) {
            let upgraded = hyper::upgrade::on(&mut request);
            tokio::spawn(async move {
                if let Ok(io) = upgraded.await {
                    let (mut from, mut to) = tokio::io::split(TokioIo::new(io));
                    let _ = tokio::io::copy(&mut from, &mut to).await;
                }
            });
            let mut answer = Response::new(Full::new(Bytes::new()));
            *answer.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
            let headers = answer.headers_mut();
            headers.insert(UPGRADE, HeaderValue::from_static("echo"));
            headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
            return Ok(answer);
        }
        let mut answer = Response::new(Full::new(Bytes::from(request.uri().to_string())));
        answer
            .headers_mut()
            .insert("keep-alive", HeaderValue::from_static("timeout=5"));
        Ok(answer)
    }

    #[async_trait]
    impl Upstream for FakeSandbox {
        async fn connect(
            &self,
            _port: u16,
        ) -> std::result::Result<Box<dyn AgentIo>, UpstreamError> {
            self.connections.fetch_add(1, Ordering::SeqCst);
            let (ours, theirs) = tokio::io::duplex(64 * 1024);
            let seen = self.seen.clone();
            let service =
                hyper::service::service_fn(move |request| sandbox_answer(seen.clone(), request));
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(theirs), service)
                    .with_upgrades(),
            );
            Ok(Box::new(ours))
        }
    }

    const HEADER: &str = "X-Blaxel-Preview-Token";
    const QUERY: &str = "bl_preview_token";

    /// A preview of port 3000 of `sandbox` with `limits`, private unless `public`.
    async fn preview_of(
        sandbox: &Arc<FakeSandbox>,
        public: bool,
        limits: PreviewLimits,
    ) -> (PreviewSet, Preview) {
        let set = PreviewSet::default();
        let mut options = PreviewOptions::default();
        options.port = 3000;
        options.public = public;
        options.token_header = HEADER.into();
        options.token_query = QUERY.into();
        let preview = set
            .expose(options, limits, sandbox.clone())
            .await
            .expect("expose");
        (set, preview)
    }

    type Sender = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;

    /// A kept-alive client connection to `host`.
    async fn client(host: &str) -> Sender {
        let tcp = TcpStream::connect(host).await.expect("connect the preview");
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .expect("handshake");
        tokio::spawn(connection.with_upgrades());
        sender
    }

    /// `GET target` with `headers` on `sender`: the answer's status, headers and text.
    async fn get(
        sender: &mut Sender,
        target: &str,
        headers: &[(&str, &str)],
    ) -> std::result::Result<(StatusCode, HeaderMap, String), hyper::Error> {
        let mut request = Request::get(target).header("Host", "preview");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let exchange = async {
            sender.ready().await?;
            let answer = sender
                .send_request(request.body(Empty::new()).unwrap())
                .await?;
            let (parts, body) = answer.into_parts();
            let text = body.collect().await?.to_bytes();
            Ok((
                parts.status,
                parts.headers,
                String::from_utf8_lossy(&text).into_owned(),
            ))
        };
        tokio::time::timeout(PATIENCE, exchange)
            .await
            .expect("an answer in time")
    }

    /// Send `bytes` on a new connection to `host` and read until the proxy closes it.
    async fn raw(host: &str, bytes: &[u8]) -> String {
        let mut tcp = TcpStream::connect(host).await.expect("connect the preview");
        tcp.write_all(bytes).await.expect("send");
        let mut got = Vec::new();
        let _ = tokio::time::timeout(PATIENCE, tcp.read_to_end(&mut got))
            .await
            .expect("closed in time");
        String::from_utf8_lossy(&got).into_owned()
    }

    /// With keep-alive, every request on a connection is checked: two with a live token (in
    /// the header, then in the query) are forwarded on one client connection, the next one
    /// without a token gets `401`, the connection closes, and the sandbox never sees it.
    #[tokio::test]
    async fn every_request_on_a_kept_alive_connection_is_checked() {
        let sandbox = Arc::new(FakeSandbox::default());
        let (_set, preview) = preview_of(&sandbox, false, PreviewLimits::default()).await;
        let token = preview.token.clone().expect("a token").value;
        let mut sender = client(&preview.host).await;
        let (status, _, text) = get(&mut sender, "/first", &[(HEADER, &token)])
            .await
            .unwrap();
        assert_eq!((status.as_u16(), text.as_str()), (200, "/first"));
        let (status, _, text) = get(&mut sender, &format!("/second?{QUERY}={token}"), &[])
            .await
            .unwrap();
        assert_eq!((status.as_u16(), text.as_str()), (200, "/second"));
        let (status, headers, text) = get(&mut sender, "/third", &[]).await.unwrap();
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{text}");
        assert_eq!(headers.get(CONNECTION).unwrap(), "close");
        assert!(
            get(&mut sender, "/fourth", &[(HEADER, &token)])
                .await
                .is_err(),
            "the connection closed after the refusal"
        );
        let targets: Vec<String> = sandbox.seen().into_iter().map(|s| s.target).collect();
        assert_eq!(targets, ["/first", "/second"]);
        assert_eq!(
            sandbox.connections.load(Ordering::SeqCst),
            2,
            "one upstream connection per forwarded request"
        );
    }

    /// A preview's request headers replace the client's of the same name on the way in; its
    /// answer headers replace the sandbox's on the way out; settings a proxy cannot honour
    /// are refused when the preview is made.
    #[tokio::test]
    async fn a_previews_headers_are_set_both_ways() {
        let sandbox = Arc::new(FakeSandbox::default());
        let set = PreviewSet::default();
        let options = PreviewOptions::new(3000)
            .public(true)
            .request_header("Authorization", "Bearer inside")
            .request_header("X-Added", "in")
            .response_header("Access-Control-Allow-Origin", "*")
            .response_header("Keep-Alive-Not", "x");
        let preview = set
            .expose(options, PreviewLimits::default(), sandbox.clone())
            .await
            .expect("expose");
        assert_eq!(preview.response_headers["Access-Control-Allow-Origin"], "*");
        let mut sender = client(&preview.host).await;
        let (status, headers, _) = get(&mut sender, "/x", &[("Authorization", "Bearer client")])
            .await
            .unwrap();
        assert_eq!(status, 200);
        assert_eq!(headers["access-control-allow-origin"], "*");
        assert_eq!(headers["keep-alive-not"], "x");
        let seen = sandbox.seen();
        let header = |name: &str| -> Vec<&str> {
            seen[0]
                .headers
                .iter()
                .filter(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_str())
                .collect()
        };
        assert_eq!(header("authorization"), ["Bearer inside"]);
        assert_eq!(header("x-added"), ["in"]);
        for refused in [
            PreviewOptions::new(3001).request_header("Host", "elsewhere"),
            PreviewOptions::new(3001).response_header("Transfer-Encoding", "chunked"),
            PreviewOptions::new(3001).request_header("X-Bad", "a\r\nInjected: 1"),
            PreviewOptions::new(3001).request_header("Bad Name", "x"),
            PreviewOptions::new(3001).request_header("x-sandcove-preview-token", "x"),
        ] {
            let e = set
                .expose(refused.clone(), PreviewLimits::default(), sandbox.clone())
                .await
                .expect_err("refused");
            assert_eq!(
                e.code(),
                sandcove_core::ErrorCode::InvalidArgument,
                "{refused:?}"
            );
        }
        assert_eq!(set.list().len(), 1, "nothing refused was exposed");
    }

    /// The token (header, query parameter however its name is encoded, or inside another
    /// header or pair) and the hop-by-hop headers never reach the sandbox; everything else
    /// does, and the sandbox's own hop-by-hop headers never reach the client.
    #[tokio::test]
    async fn tokens_and_hop_by_hop_headers_never_reach_the_sandbox() {
        let sandbox = Arc::new(FakeSandbox::default());
        let (_set, preview) = preview_of(&sandbox, false, PreviewLimits::default()).await;
        let t = preview.token.clone().expect("a token").value;
        let referer = format!("http://preview/a?{QUERY}={t}");
        let cookie = format!("s={t}");
        let cases: Vec<(String, Vec<(&str, &str)>)> = vec![
            (format!("/a?b=1&{QUERY}={t}&c=2"), vec![]),
            (format!("/a?bl%5Fpreview%5Ftoken={t}&b=1&c=2"), vec![]),
            (format!("/a?b=1&c=2&other=x{t}"), vec![(HEADER, &t)]),
            (
                "/a?b=1&c=2".to_string(),
                vec![
                    (HEADER, &t),
                    ("Referer", &referer),
                    ("Cookie", &cookie),
                    ("Accept", "*/*"),
                    ("Keep-Alive", "timeout=5"),
                    ("Proxy-Connection", "keep-alive"),
                    ("Connection", "x-hop"),
                    ("X-Hop", "1"),
                ],
            ),
        ];
        for (target, headers) in &cases {
            let mut sender = client(&preview.host).await;
            let (status, answer_headers, text) = get(&mut sender, target, headers).await.unwrap();
            assert_eq!(status, 200, "{target}: {text}");
            assert_eq!(text, "/a?b=1&c=2", "{target}");
            assert!(
                answer_headers.get("keep-alive").is_none(),
                "{answer_headers:?}"
            );
        }
        let seen = sandbox.seen();
        assert_eq!(seen.len(), cases.len());
        for request in &seen {
            for (name, value) in &request.headers {
                assert!(!value.contains(&t), "{name}: {value}");
                let name = name.to_ascii_lowercase();
                assert!(
                    ![
                        HEADER.to_ascii_lowercase().as_str(),
                        "keep-alive",
                        "proxy-connection",
                        "x-hop"
                    ]
                    .contains(&name.as_str()),
                    "{name} reached the sandbox"
                );
            }
            assert!(request
                .headers
                .contains(&("connection".to_string(), "close".to_string())));
        }
        let last = &seen[3].headers;
        assert!(
            last.contains(&("accept".to_string(), "*/*".to_string())),
            "{last:?}"
        );
    }

    /// Requests hyper cannot read, or without a live token, are refused and the sandbox is
    /// never contacted.
    #[tokio::test]
    async fn malformed_and_unauthorized_requests_never_reach_the_sandbox() {
        let sandbox = Arc::new(FakeSandbox::default());
        let (_set, preview) = preview_of(&sandbox, false, PreviewLimits::default()).await;
        let t = preview.token.clone().expect("a token").value;
        let good = format!("{HEADER}: {t}");
        let cases = [
            (format!("GET  / HTTP/1.1\r\n{good}\r\n\r\n"), "400"),
            (
                format!("GET / HTTP/1.1\r\n{good}\r\nbroken line\r\n\r\n"),
                "400",
            ),
            (format!("G\u{e9}T / HTTP/1.1\r\n{good}\r\n\r\n"), "400"),
            (
                format!(
                    "POST / HTTP/1.1\r\n{good}\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"
                ),
                "400",
            ),
            (
                format!("POST / HTTP/1.1\r\n{good}\r\nContent-Length: 1x\r\n\r\n"),
                "400",
            ),
            (
                format!(
                    "GET / HTTP/1.1\r\nX-Big: {}\r\n{good}\r\n\r\n",
                    "a".repeat(MAX_HEAD)
                ),
                "431",
            ),
            (
                format!(
                    "GET / HTTP/1.1\r\nX-Big: {}\r\n{good}\r\n\r\n",
                    "a".repeat(4 * MAX_HEAD)
                ),
                "431",
            ),
            ("GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_string(), "401"),
            (format!("GET /?{QUERY}=nope HTTP/1.1\r\n\r\n"), "401"),
            (format!("GET /?{QUERY}=%zz{t} HTTP/1.1\r\n\r\n"), "401"),
            (
                format!("POST / HTTP/1.1\r\n{good}\r\nTransfer-Encoding: gzip\r\n\r\n"),
                "400",
            ),
            (format!("CONNECT x:1 HTTP/1.1\r\n{good}\r\n\r\n"), "405"),
        ];
        for (request, status) in cases {
            let got = raw(&preview.host, request.as_bytes()).await;
            let shown = &request[..request.len().min(80)];
            assert!(
                got.starts_with(&format!("HTTP/1.1 {status} ")),
                "{shown:?}: {got:?}"
            );
        }
        assert_eq!(sandbox.connections.load(Ordering::SeqCst), 0);
    }

    /// A head that does not come whole in time gets `408`; a kept-alive connection with no
    /// next request is closed at the same bound, without one.
    #[tokio::test]
    async fn late_heads_get_408_and_idle_connections_are_closed() {
        let sandbox = Arc::new(FakeSandbox::default());
        let limits = PreviewLimits::default().head_timeout_ms(1000);
        let (_set, preview) = preview_of(&sandbox, true, limits).await;
        let got = raw(&preview.host, b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ").await;
        assert!(got.starts_with("HTTP/1.1 408 "), "{got:?}");
        assert!(
            got.ends_with("the request head did not arrive in time\n"),
            "{got:?}"
        );
        let got = raw(&preview.host, b"").await;
        assert!(
            got.starts_with("HTTP/1.1 408 "),
            "a connection that sends nothing: {got:?}"
        );
        let got = raw(&preview.host, b"GET /once HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(got.starts_with("HTTP/1.1 200 "), "{got:?}");
        assert!(
            got.ends_with("/once"),
            "only the answer, no 408 after it: {got:?}"
        );
        assert_eq!(sandbox.seen().len(), 1);
    }

    /// A public preview forwards without a token; an upgrade becomes a tunnel once the
    /// sandbox answers `101`, and closing the preview cuts the tunnel.
    #[tokio::test]
    async fn upgrades_tunnel_after_101_until_the_preview_closes() {
        let sandbox = Arc::new(FakeSandbox::default());
        let (set, preview) = preview_of(&sandbox, true, PreviewLimits::default()).await;
        let mut sender = client(&preview.host).await;
        let request = Request::get("/ws")
            .header("Host", "preview")
            .header(UPGRADE, "echo")
            .header(CONNECTION, "Upgrade")
            .body(Empty::new())
            .unwrap();
        let answer = tokio::time::timeout(PATIENCE, sender.send_request(request))
            .await
            .expect("in time")
            .expect("an answer");
        assert_eq!(answer.status(), StatusCode::SWITCHING_PROTOCOLS);
        assert_eq!(answer.headers().get(UPGRADE).unwrap(), "echo");
        let upgraded = tokio::time::timeout(PATIENCE, hyper::upgrade::on(answer))
            .await
            .expect("in time")
            .expect("upgraded");
        let mut tunnel = TokioIo::new(upgraded);
        tunnel.write_all(b"ping").await.unwrap();
        let mut echo = [0u8; 4];
        tokio::time::timeout(PATIENCE, tunnel.read_exact(&mut echo))
            .await
            .expect("in time")
            .expect("echo");
        assert_eq!(&echo, b"ping");
        let seen = sandbox.seen();
        assert_eq!(seen[0].target, "/ws");
        set.close(3000).expect("close");
        let mut rest = Vec::new();
        let ended = tokio::time::timeout(PATIENCE, tunnel.read_to_end(&mut rest)).await;
        assert!(ended.is_ok(), "the tunnel ended with its preview");
    }

    #[tokio::test]
    async fn public_previews_have_no_token() {
        let mut options = PreviewOptions::default();
        options.port = 1;
        options.public = true;
        let (p, tokens) = describe(&options, String::new(), String::new());
        assert!(p.token.is_none() && tokens.is_empty());
    }

    #[test]
    fn tokens_are_stripped_from_queries_however_encoded() {
        let t = "0123456789abcdef0123456789abcdef";
        for (query, kept) in [
            (format!("b=1&{QUERY}={t}&c=2"), "b=1&c=2"),
            (format!("{QUERY}={t}"), ""),
            (format!("bl%5Fpreview%5Ftoken={t}&b=1"), "b=1"),
            (format!("{QUERY}=other&b=1"), "b=1"),
            (
                "b=%30123456789abcdef0123456789abcdef&c=2".to_string(),
                "c=2",
            ),
            ("b=1&&c=%zz".to_string(), "b=1&&c=%zz"),
        ] {
            assert_eq!(without_token(&query, QUERY, t), kept, "{query}");
        }
        assert!(carries(format!("http://x/?{QUERY}={t}").as_bytes(), t));
        assert!(carries(b"s=%30123456789abcdef0123456789abcdef", t));
        assert!(!carries(b"s=0123456789abcdef", t));
    }
}
