//! Preview URLs: a listener per exposed port (on `127.0.0.1` unless configured otherwise),
//! held by whatever serves the sandbox: the engine's monitor, or the Kubernetes backend's
//! serving process.
//!
//! Each accepted connection asks an [`Upstream`] for a byte stream connected to the port
//! inside the sandbox (the monitor asks its agent, which lives in the sandbox's network
//! namespace, for a connected socket; the Kubernetes backend opens an agent tunnel) and then
//! copies bytes both ways. A private preview first reads the HTTP request head (within
//! [`PreviewLimits::head_timeout_ms`], else `408`) and requires a live token in the
//! configured header or query parameter; a malformed head gets `400`, a missing or dead
//! token `401`, and the sandbox is never contacted.
//!
//! A private preview carries **one request per connection**: the forwarded head says
//! `Connection: close`, exactly the request's body is forwarded (by `Content-Length` or
//! chunked framing), and a client that sends anything more on that connection is cut off, so
//! every request is checked for a token. The sandbox's answer is bounded: its head must come
//! within [`PreviewLimits::answer_timeout_ms`] of the request's end (else `504`), and no step
//! of its body may take longer than [`PreviewLimits::answer_idle_ms`] (else both connections
//! close), so a port that keeps requests unanswered holds no connection for ever. The request
//! itself ends once none of it has moved into the sandbox for the head bound (`504` when the
//! port takes none, `408` when the client sends none). A WebSocket
//! upgrade becomes a raw tunnel only once the sandbox answers `101`. Each listener serves at most [`PreviewLimits::max_connections`]
//! connections at once; the rest wait in the kernel's backlog. Revoking a token, changing a
//! preview's settings or closing it cuts the connections it no longer allows.
//!
//! [`PreviewSet`] is that whole behaviour for one sandbox; its holder supplies only the
//! [`Upstream`]. Tokens live in the holder's memory.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::client::AgentIo;
use sandcove_core::{now_millis, Error, Preview, PreviewOptions, PreviewToken, Result};

/// Largest request head read while checking a token.
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
    /// How long a client may take to send a private preview's request head, in ms; a
    /// slower one gets `408` and is closed.
    pub head_timeout_ms: u64,
    /// Connections served at once per preview; further ones wait in the kernel's backlog.
    pub max_connections: usize,
    /// How long the sandbox may take for the head of its answer to a private preview's
    /// request, in ms; then the client gets `504` and both connections close. Also the
    /// longest the request's own bytes may stop moving into the sandbox (then `504`, or
    /// `408` when it is the client that sends nothing).
    #[serde(default = "default_answer_ms")]
    pub answer_timeout_ms: u64,
    /// How long the answer to a private preview's request may bring no byte (or the client
    /// take none of it) once its head is in, in ms; then both connections close.
    #[serde(default = "default_answer_ms")]
    pub answer_idle_ms: u64,
}

/// What records made before the answer bounds existed get.
fn default_answer_ms() -> u64 {
    60_000
}

impl PreviewLimits {
    /// These limits with `ms` milliseconds for a private preview's request head.
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
    /// private preview's request.
    pub fn answer_timeout_ms(mut self, ms: u64) -> Self {
        self.answer_timeout_ms = ms;
        self
    }

    /// These limits with `ms` milliseconds without a byte of a private preview's answer
    /// moving, once its head is in.
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

/// Why a request head is not forwarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Not a well-formed HTTP/1.x request head (`400`).
    Malformed(&'static str),
    /// No live token (`401`).
    Unauthorized,
}

/// How the body of an accepted request is framed, i.e. how many bytes of the client's
/// stream belong to this request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body, or exactly this many bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// A protocol upgrade (WebSocket): raw bytes follow once the sandbox answers `101`.
    Upgrade,
}

/// A private preview's request head that carries a live token: what to send upstream.
#[derive(Debug)]
pub struct Accepted {
    /// The head to forward, with `Connection: close` unless it asks for an upgrade.
    pub head: Vec<u8>,
    /// Body framing.
    pub framing: Framing,
    /// The token that let the request through.
    pub token: PreviewToken,
}

/// Check a complete request head (through its blank line): well-formed, carrying a live
/// token in the preview's header or query parameter. A request is forwarded alone: its head
/// is rewritten to `Connection: close`, so the next request needs a new connection and is
/// checked again.
pub fn check(
    head: &[u8],
    preview: &Preview,
    tokens: &[PreviewToken],
) -> std::result::Result<Accepted, Refusal> {
    let text = head
        .strip_suffix(b"\r\n\r\n")
        .ok_or(Refusal::Malformed("incomplete request head"))?;
    let mut lines = text
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let request_line = lines.next().unwrap_or_default();
    let request_line = std::str::from_utf8(request_line)
        .ok()
        .filter(|l| l.bytes().all(|b| b.is_ascii_graphic() || b == b' '))
        .ok_or(Refusal::Malformed("bad request line"))?;
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Refusal::Malformed("bad request line"));
    };
    if method.is_empty() || !method.bytes().all(is_token_byte) || target.is_empty() {
        return Err(Refusal::Malformed("bad request line"));
    }
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return Err(Refusal::Malformed("only HTTP/1.x is proxied"));
    }
    let mut offered: Vec<Vec<u8>> = Vec::new();
    // The token never reaches the sandboxed server (code in the sandbox could log it or use
    // it): the target is forwarded without its token parameters, the head without its token
    // header.
    let mut upstream_target = target.to_string();
    if let Some((path, rest)) = target.split_once('?') {
        let (query, fragment) = match rest.split_once('#') {
            Some((q, f)) => (q, Some(f)),
            None => (rest, None),
        };
        let mut kept: Vec<&str> = Vec::new();
        for pair in query.split('&') {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let k = percent_decode(k).ok_or(Refusal::Malformed("bad percent-encoding"))?;
            if k == preview.token_query.as_bytes() {
                offered.push(percent_decode(v).ok_or(Refusal::Malformed("bad percent-encoding"))?);
            } else {
                kept.push(pair);
            }
        }
        upstream_target = path.to_string();
        if !kept.is_empty() {
            upstream_target.push('?');
            upstream_target.push_str(&kept.join("&"));
        }
        if let Some(f) = fragment {
            upstream_target.push('#');
            upstream_target.push_str(f);
        }
    }
    let mut forwarded = Vec::with_capacity(head.len() + 20);
    forwarded.extend_from_slice(format!("{method} {upstream_target} {version}\r\n").as_bytes());
    let mut kept_lines: Vec<&[u8]> = Vec::new();
    let mut length: Option<u64> = None;
    let mut chunked = false;
    let mut upgrade = false;
    let mut connection_upgrade = false;
    for line in lines {
        let colon = line
            .iter()
            .position(|&b| b == b':')
            .ok_or(Refusal::Malformed("bad header line"))?;
        let (name, value) = (&line[..colon], trim(&line[colon + 1..]));
        if name.is_empty() || !name.iter().copied().all(is_token_byte) {
            return Err(Refusal::Malformed("bad header name"));
        }
        if value.iter().any(|&b| b == b'\r' || b == 0) {
            return Err(Refusal::Malformed("bad header value"));
        }
        let name = std::str::from_utf8(name).unwrap_or_default();
        let is_token = name.eq_ignore_ascii_case(&preview.token_header);
        if is_token {
            offered.push(value.to_vec());
        }
        if name.eq_ignore_ascii_case("content-length") {
            let n = std::str::from_utf8(value)
                .ok()
                .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or(Refusal::Malformed("bad Content-Length"))?;
            if length.is_some_and(|l| l != n) {
                return Err(Refusal::Malformed("conflicting Content-Length"));
            }
            length = Some(n);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            // Only a final `chunked` can be framed; anything else cannot be delimited.
            let last = value
                .rsplit(|&b| b == b',')
                .next()
                .map(trim)
                .unwrap_or_default();
            if !last.eq_ignore_ascii_case(b"chunked") {
                return Err(Refusal::Malformed("unsupported Transfer-Encoding"));
            }
            chunked = true;
        } else if name.eq_ignore_ascii_case("upgrade") {
            upgrade = true;
        } else if name.eq_ignore_ascii_case("connection") {
            connection_upgrade |= value
                .split(|&b| b == b',')
                .any(|t| trim(t).eq_ignore_ascii_case(b"upgrade"));
        }
        let hop = ["connection", "keep-alive", "proxy-connection"];
        if !is_token && !hop.iter().any(|h| name.eq_ignore_ascii_case(h)) {
            kept_lines.push(line);
        }
    }
    if chunked && length.is_some() {
        // Two framings at once is how requests are smuggled past a proxy.
        return Err(Refusal::Malformed(
            "both Content-Length and Transfer-Encoding",
        ));
    }
    let now = now_millis();
    let live = offered.iter().find_map(|o| {
        tokens.iter().find(|t| {
            sandcove_core::secret::secrets_match(o, t.value.as_bytes())
                && t.expires_at.is_none_or(|e| now < e)
        })
    });
    let Some(token) = live.cloned() else {
        return Err(Refusal::Unauthorized);
    };
    // Nor in any other header: a browser repeats the URL it came from (with its token
    // parameter) in `Referer`, and a client may carry it in a cookie.
    for line in kept_lines {
        if !contains(line, token.value.as_bytes()) {
            forwarded.extend_from_slice(line);
            forwarded.extend_from_slice(b"\r\n");
        }
    }
    let framing = if upgrade && connection_upgrade && !chunked && length.unwrap_or(0) == 0 {
        forwarded.extend_from_slice(b"Connection: upgrade\r\n");
        Framing::Upgrade
    } else {
        forwarded.extend_from_slice(b"Connection: close\r\n");
        if chunked {
            Framing::Chunked
        } else {
            Framing::Length(length.unwrap_or(0))
        }
    };
    forwarded.extend_from_slice(b"\r\n");
    Ok(Accepted {
        head: forwarded,
        framing,
        token,
    })
}

/// Whether `needle` (non-empty) occurs in `haystack`.
fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn trim(v: &[u8]) -> &[u8] {
    let start = v
        .iter()
        .position(|b| !b" \t".contains(b))
        .unwrap_or(v.len());
    let end = v
        .iter()
        .rposition(|b| !b" \t".contains(b))
        .map_or(start, |e| e + 1);
    &v[start..end]
}

/// Decode `%XX` escapes and `+`; `None` for a `%` not followed by two hex digits (the
/// decoder alone would pass such a `%` through, and a token must match exactly as sent).
fn percent_decode(s: &str) -> Option<Vec<u8>> {
    let bytes = s.as_bytes();
    let well_formed = bytes.iter().enumerate().all(|(i, b)| {
        *b != b'%'
            || (bytes.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                && bytes.get(i + 2).is_some_and(u8::is_ascii_hexdigit))
    });
    well_formed.then(|| percent_encoding::percent_decode_str(&s.replace('+', " ")).collect())
}

/// Bytes read from a client beyond what was consumed so far, and the stream they came from.
pub struct Incoming<'a, S: ?Sized = TcpStream> {
    stream: &'a mut S,
    buf: Vec<u8>,
}

impl<'a, S: AsyncRead + AsyncWrite + Unpin + ?Sized> Incoming<'a, S> {
    /// Start reading `stream`.
    pub fn new(stream: &'a mut S) -> Self {
        Incoming {
            stream,
            buf: Vec::new(),
        }
    }

    async fn fill(&mut self) -> std::io::Result<()> {
        let mut chunk = [0u8; 8192];
        let n = self.stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }

    /// The request head through its blank line, or `None` when the client sent more than
    /// [`MAX_HEAD`] bytes without one. Bytes after the head stay buffered.
    pub async fn head(&mut self) -> std::io::Result<Option<Vec<u8>>> {
        loop {
            if let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let rest = self.buf.split_off(end + 4);
                return Ok(Some(std::mem::replace(&mut self.buf, rest)));
            }
            if self.buf.len() >= MAX_HEAD {
                return Ok(None);
            }
            self.fill().await?;
        }
    }

    /// Copy exactly `n` bytes to `out`.
    async fn copy_exact<W: AsyncWrite + Unpin + ?Sized>(
        &mut self,
        mut n: u64,
        out: &mut W,
    ) -> std::io::Result<()> {
        while n > 0 {
            if self.buf.is_empty() {
                self.fill().await?;
            }
            let take = self.buf.len().min(usize::try_from(n).unwrap_or(usize::MAX));
            out.write_all(&self.buf[..take]).await?;
            self.buf.drain(..take);
            n -= take as u64;
        }
        Ok(())
    }

    /// Copy one line (through its LF, at most `max` bytes) to `out` and return it.
    async fn copy_line<W: AsyncWrite + Unpin + ?Sized>(
        &mut self,
        max: usize,
        out: &mut W,
    ) -> std::io::Result<Vec<u8>> {
        loop {
            if let Some(end) = self.buf.iter().position(|&b| b == b'\n') {
                let rest = self.buf.split_off(end + 1);
                let line = std::mem::replace(&mut self.buf, rest);
                out.write_all(&line).await?;
                return Ok(line);
            }
            if self.buf.len() >= max {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "chunk line too long",
                ));
            }
            self.fill().await?;
        }
    }

    /// Copy the body of the request just accepted to `out`, and no byte more.
    pub async fn copy_body<W: AsyncWrite + Unpin + ?Sized>(
        &mut self,
        framing: Framing,
        out: &mut W,
    ) -> std::io::Result<()> {
        match framing {
            Framing::Length(n) => self.copy_exact(n, out).await,
            Framing::Upgrade => Ok(()),
            Framing::Chunked => loop {
                let line = self.copy_line(4096, out).await?;
                let text = std::str::from_utf8(&line).unwrap_or_default();
                let size = text.split(';').next().unwrap_or_default().trim();
                let size = u64::from_str_radix(size, 16).map_err(|_| {
                    std::io::Error::new(std::io::ErrorKind::InvalidData, "bad chunk size")
                })?;
                if size == 0 {
                    // Trailer fields, then the blank line that ends the body.
                    loop {
                        let line = self.copy_line(MAX_HEAD, out).await?;
                        if line == b"\r\n" || line == b"\n" {
                            return Ok(());
                        }
                    }
                }
                self.copy_exact(size, out).await?;
                let end = self.copy_line(2, out).await?;
                if end != b"\r\n" && end != b"\n" {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        "chunk not followed by CRLF",
                    ));
                }
            },
        }
    }

    /// Hand over the bytes read ahead (for a raw tunnel after an upgrade).
    pub fn take_buffered(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.buf)
    }

    /// The client stream.
    pub fn stream(&mut self) -> &mut S {
        self.stream
    }

    /// The client stream, dropping what was read ahead.
    pub fn into_stream(self) -> &'a mut S {
        self.stream
    }
}

/// Read a response head from the sandbox (through its blank line, at most [`MAX_HEAD`]
/// bytes) and return it with its status code.
pub async fn read_response_head<S: AsyncRead + AsyncWrite + Unpin + ?Sized>(
    upstream: &mut S,
) -> std::io::Result<(Vec<u8>, u16)> {
    let mut incoming = Incoming::new(upstream);
    let head = incoming.head().await?.ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidData, "response head too large")
    })?;
    let mut all = head;
    all.extend(incoming.take_buffered());
    let status = all
        .split(|&b| b == b' ')
        .nth(1)
        .and_then(|s| std::str::from_utf8(s).ok())
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Ok((all, status))
}

/// Answer a refused request and close.
pub async fn refuse<S: AsyncWrite + Unpin + ?Sized>(stream: &mut S, status: &str, message: &str) {
    let body = format!("{message}\n");
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// Why a preview connection cannot reach the sandbox's port; the client is told and the
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

/// Opens the byte stream behind one preview connection: the engine's monitor asks its agent
/// for a socket connected inside the sandbox, the Kubernetes backend opens an agent tunnel.
/// Everything else (tokens, limits, revocation) is [`PreviewSet`]'s, shared by both.
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
                let served = served.clone();
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    proxy(&served, upstream.as_ref(), port, conn, limits).await;
                    drop(permit);
                });
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

/// Serve one preview connection (see the module docs for what is checked). A connection
/// lasts only as long as what let it through: revoking its token or closing the preview
/// cuts it, even mid-stream or as an upgraded tunnel.
async fn proxy(
    previews: &Previews,
    upstream: &dyn Upstream,
    port: u16,
    mut conn: TcpStream,
    limits: PreviewLimits,
) {
    let Some((entry, _, changes)) = preview_now(previews, port) else {
        return;
    };
    if entry.public {
        let tunnel = async {
            let Some(mut up) = connect_upstream(upstream, port, &mut conn).await else {
                return;
            };
            let _ = tokio::io::copy_bidirectional(&mut conn, &mut up).await;
        };
        tokio::select! {
            _ = tunnel => {}
            _ = access_lost(previews, port, None, changes) => {}
        }
        return;
    }
    drop(changes);
    let mut incoming = Incoming::new(&mut conn);
    let timeout = Duration::from_millis(limits.head_timeout_ms);
    let head = match tokio::time::timeout(timeout, incoming.head()).await {
        Ok(Ok(Some(head))) => head,
        Ok(Ok(None)) => {
            let message = "request head too large";
            refuse(
                incoming.stream(),
                "431 Request Header Fields Too Large",
                message,
            )
            .await;
            return;
        }
        Ok(Err(_)) => return,
        Err(_) => {
            let message = "the request head did not arrive in time";
            refuse(incoming.stream(), "408 Request Timeout", message).await;
            return;
        }
    };
    // The tokens as they are now that the head is here, not as they were when the
    // connection opened: one revoked (or a preview closed) meanwhile lets nothing through.
    let Some((entry, tokens, changes)) = preview_now(previews, port) else {
        refuse(incoming.stream(), "404 Not Found", "this preview is closed").await;
        return;
    };
    let accepted = match check(&head, &entry, &tokens) {
        Ok(a) => a,
        Err(Refusal::Malformed(why)) => {
            refuse(incoming.stream(), "400 Bad Request", why).await;
            return;
        }
        Err(Refusal::Unauthorized) => {
            let message = format!(
                "this preview is private: send its token in the {} header or the {} query parameter",
                entry.token_header, entry.token_query
            );
            refuse(incoming.stream(), "401 Unauthorized", &message).await;
            return;
        }
    };
    let token = accepted.token.clone();
    tokio::select! {
        _ = forward(upstream, port, incoming, accepted, limits) => {}
        _ = access_lost(previews, port, Some(token), changes) => {}
    }
}

/// Forward a private preview's accepted request and its answer (or the tunnel it upgrades
/// to). The answer is held to `limits`: its head must come within
/// [`PreviewLimits::answer_timeout_ms`] (else `504`), then no step of copying it (a read from
/// the sandbox and the write to the client it leads to) may take longer than
/// [`PreviewLimits::answer_idle_ms`]; either ends both connections.
async fn forward(
    upstream: &dyn Upstream,
    port: u16,
    mut incoming: Incoming<'_>,
    accepted: Accepted,
    limits: PreviewLimits,
) {
    let Some(mut up) = connect_upstream(upstream, port, incoming.stream()).await else {
        return;
    };
    // The request itself is held to the head bound too: bytes of it (from the client, into
    // the sandbox) that stop moving for that long end the connection, whichever side stalls.
    let timeout = Duration::from_millis(limits.answer_timeout_ms);
    let moved = Progress::new();
    let sent = {
        let mut to_sandbox = Noted {
            inner: &mut up,
            progress: &moved,
        };
        let send = async {
            to_sandbox.write_all(&accepted.head).await?;
            incoming.copy_body(accepted.framing, &mut to_sandbox).await
        };
        tokio::select! {
            sent = send => Some(sent.is_ok()),
            () = moved.stalled(timeout) => None,
        }
    };
    match sent {
        Some(true) => {}
        Some(false) => return,
        None => {
            let (status, message) = if moved.writing() {
                (
                    "504 Gateway Timeout",
                    format!(
                        "port {port} of the sandbox did not take the request within {} ms",
                        limits.answer_timeout_ms
                    ),
                )
            } else {
                (
                    "408 Request Timeout",
                    format!(
                        "the request body brought no byte for {} ms",
                        limits.answer_timeout_ms
                    ),
                )
            };
            refuse(incoming.stream(), status, &message).await;
            return;
        }
    }
    if accepted.framing == Framing::Upgrade {
        // Raw bytes only once the sandbox agrees to switch protocols.
        let Some((answer, status)) = answer_head(&mut up, incoming.stream(), port, limits).await
        else {
            return;
        };
        if incoming.stream().write_all(&answer).await.is_err() {
            return;
        }
        if status == 101 {
            let early = incoming.take_buffered();
            if !early.is_empty() && up.write_all(&early).await.is_err() {
                return;
            }
            let _ = tokio::io::copy_bidirectional(incoming.stream(), &mut up).await;
            return;
        }
    }
    // The request is complete: only the answer flows now. A client that sends more is
    // starting a second request on this connection, which is never forwarded.
    let pipelined = !incoming.take_buffered().is_empty();
    let upgraded_refusal = accepted.framing == Framing::Upgrade;
    let conn = incoming.into_stream();
    let (mut client_read, mut client_write) = conn.split();
    let answer = async {
        if !upgraded_refusal {
            let (head, _) = answer_head(&mut up, &mut client_write, port, limits).await?;
            client_write.write_all(&head).await.ok()?;
        }
        copy_progressing(&mut up, &mut client_write, limits.answer_idle_ms).await
    };
    tokio::pin!(answer);
    if pipelined {
        // Answer the first request only, then close.
        let _ = answer.await;
        return;
    }
    let mut probe = [0u8; 1];
    tokio::select! {
        _ = &mut answer => {}
        read = client_read.read(&mut probe) => {
            // The client closed its sending side: let the answer finish. Anything else
            // (more bytes, an error) ends the connection.
            if matches!(read, Ok(0)) {
                let _ = answer.await;
            }
        }
    }
}

/// When bytes of a request last moved into the sandbox, and whether a write to it is
/// waiting now (the sandbox not reading) rather than a read from the client.
struct Progress {
    base: tokio::time::Instant,
    last_ms: std::sync::atomic::AtomicU64,
    writing: std::sync::atomic::AtomicBool,
}

impl Progress {
    fn new() -> Self {
        Progress {
            base: tokio::time::Instant::now(),
            last_ms: std::sync::atomic::AtomicU64::new(0),
            writing: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn last(&self) -> tokio::time::Instant {
        let ms = self.last_ms.load(std::sync::atomic::Ordering::Relaxed);
        self.base + Duration::from_millis(ms)
    }

    fn writing(&self) -> bool {
        self.writing.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Resolves once nothing has moved for `timeout`.
    async fn stalled(&self, timeout: Duration) {
        loop {
            let deadline = self.last() + timeout;
            if tokio::time::Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }
}

/// A writer that notes its progress in a [`Progress`].
struct Noted<'a, W: ?Sized> {
    inner: &'a mut W,
    progress: &'a Progress,
}

impl<W: AsyncWrite + Unpin + ?Sized> AsyncWrite for Noted<'_, W> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        use std::sync::atomic::Ordering::Relaxed;
        let this = self.get_mut();
        let polled = std::pin::Pin::new(&mut *this.inner).poll_write(cx, buf);
        let waiting = polled.is_pending();
        this.progress.writing.store(waiting, Relaxed);
        if !waiting {
            let ms = this.progress.base.elapsed().as_millis();
            let ms = u64::try_from(ms).unwrap_or(u64::MAX);
            this.progress.last_ms.fetch_max(ms, Relaxed);
        }
        polled
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut *self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut *self.get_mut().inner).poll_shutdown(cx)
    }
}

/// The head of the sandbox's answer (with what came after it in the same reads) and its
/// status, or `None` after telling `client` why not: `504` when it did not come within
/// [`PreviewLimits::answer_timeout_ms`], nothing when the sandbox closed or sent garbage.
async fn answer_head<S, C>(
    up: &mut S,
    client: &mut C,
    port: u16,
    limits: PreviewLimits,
) -> Option<(Vec<u8>, u16)>
where
    S: AsyncRead + AsyncWrite + Unpin + ?Sized,
    C: AsyncWrite + Unpin + ?Sized,
{
    let timeout = Duration::from_millis(limits.answer_timeout_ms);
    match tokio::time::timeout(timeout, read_response_head(up)).await {
        Ok(Ok(head)) => Some(head),
        Ok(Err(_)) => None,
        Err(_) => {
            let message = format!(
                "port {port} of the sandbox did not answer within {} ms",
                limits.answer_timeout_ms
            );
            refuse(client, "504 Gateway Timeout", &message).await;
            None
        }
    }
}

/// Copy `from` to `to` until `from` ends; `None` once a read and the write it leads to took
/// longer than `idle_ms` together, or on an error.
async fn copy_progressing<R, W>(from: &mut R, to: &mut W, idle_ms: u64) -> Option<()>
where
    R: AsyncRead + Unpin + ?Sized,
    W: AsyncWrite + Unpin + ?Sized,
{
    let idle = Duration::from_millis(idle_ms);
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let step = async {
            let n = from.read(&mut buf).await?;
            to.write_all(&buf[..n]).await?;
            std::io::Result::Ok(n)
        };
        match tokio::time::timeout(idle, step).await {
            Ok(Ok(0)) => return to.flush().await.ok(),
            Ok(Ok(_)) => {}
            Ok(Err(_)) | Err(_) => return None,
        }
    }
}

/// A stream connected to `port` inside the sandbox, or `None` after answering the client
/// with why not.
async fn connect_upstream(
    upstream: &dyn Upstream,
    port: u16,
    conn: &mut TcpStream,
) -> Option<Box<dyn AgentIo>> {
    match upstream.connect(port).await {
        Ok(up) => Some(up),
        Err(UpstreamError::Unavailable(why)) => {
            refuse(conn, "503 Service Unavailable", &why).await;
            None
        }
        Err(UpstreamError::BadGateway(why)) => {
            refuse(conn, "502 Bad Gateway", &why).await;
            None
        }
        Err(UpstreamError::Closed) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_decoding_is_strict() {
        assert_eq!(percent_decode("a%2Bb+c").unwrap(), b"a+b c");
        assert_eq!(percent_decode("%C3%BC").unwrap(), "ü".as_bytes());
        for bad in ["%", "%4", "%zz", "a%g1"] {
            assert_eq!(percent_decode(bad), None, "{bad:?}");
        }
    }

    fn preview() -> (Preview, Vec<PreviewToken>) {
        let mut options = PreviewOptions::default();
        options.port = 3000;
        options.token_header = "X-Blaxel-Preview-Token".into();
        options.token_query = "bl_preview_token".into();
        describe(&options, "http://x".into(), "x".into())
    }

    fn ok(head: &[u8], p: &Preview, tokens: &[PreviewToken]) -> bool {
        check(head, p, tokens).is_ok()
    }

    #[test]
    fn tokens_are_accepted_in_the_header_or_the_query() {
        let (p, tokens) = preview();
        let t = &tokens[0].value;
        let by_header = format!("GET / HTTP/1.1\r\nHost: x\r\nx-blaxel-preview-token: {t}\r\n\r\n");
        let by_query = format!("GET /a?b=1&bl_preview_token={t} HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(ok(by_header.as_bytes(), &p, &tokens));
        assert!(ok(by_query.as_bytes(), &p, &tokens));
        assert!(!ok(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", &p, &tokens));
        let wrong = "GET / HTTP/1.1\r\nX-Blaxel-Preview-Token: nope\r\n\r\n";
        assert!(!ok(wrong.as_bytes(), &p, &tokens));
    }

    /// The token (header or query parameter, however it is encoded) is never forwarded to
    /// the sandboxed server; everything else in the head is.
    #[test]
    fn tokens_are_stripped_before_forwarding() {
        let (p, tokens) = preview();
        let t = &tokens[0].value;
        for head in [
            format!("GET /a?b=1&bl_preview_token={t}&c=2 HTTP/1.1\r\nHost: x\r\n\r\n"),
            format!("GET /a?bl%5Fpreview%5Ftoken={t}&b=1&c=2 HTTP/1.1\r\nHost: x\r\n\r\n"),
            format!("GET /a?b=1&c=2 HTTP/1.1\r\nHost: x\r\nX-Blaxel-Preview-Token: {t}\r\n\r\n"),
        ] {
            let accepted = check(head.as_bytes(), &p, &tokens).expect("a live token");
            let sent = String::from_utf8(accepted.head).unwrap();
            assert!(!sent.contains(t.as_str()), "{sent}");
            assert!(!sent.to_ascii_lowercase().contains("preview"), "{sent}");
            assert!(sent.starts_with("GET /a?b=1&c=2 HTTP/1.1\r\n"), "{sent}");
            assert!(sent.contains("\r\nHost: x\r\n"), "{sent}");
        }
        // Nor does it travel in another header: a browser's Referer (the URL it came from,
        // token included) or a cookie.
        let referred = format!(
            "GET /b HTTP/1.1\r\nHost: x\r\nX-Blaxel-Preview-Token: {t}\r\nReferer: http://x/a?bl_preview_token={t}\r\nCookie: s={t}\r\nAccept: */*\r\n\r\n"
        );
        let sent =
            String::from_utf8(check(referred.as_bytes(), &p, &tokens).unwrap().head).unwrap();
        assert!(!sent.contains(t.as_str()), "{sent}");
        assert!(sent.contains("\r\nAccept: */*\r\n"), "{sent}");
        let only = format!("GET /p?bl_preview_token={t} HTTP/1.0\r\n\r\n");
        let sent = check(only.as_bytes(), &p, &tokens)
            .expect("a live token")
            .head;
        assert!(sent.starts_with(b"GET /p HTTP/1.0\r\n"));
    }

    #[test]
    fn expired_tokens_are_refused() {
        let (p, mut tokens) = preview();
        tokens[0].expires_at = Some(now_millis() - 1);
        let t = &tokens[0].value;
        let req = format!("GET /?bl_preview_token={t} HTTP/1.1\r\n\r\n");
        assert!(!ok(req.as_bytes(), &p, &tokens));
    }

    #[test]
    fn public_previews_have_no_token() {
        let mut options = PreviewOptions::default();
        options.port = 1;
        options.public = true;
        let (p, tokens) = describe(&options, String::new(), String::new());
        assert!(p.token.is_none() && tokens.is_empty());
    }

    /// Hostile heads never panic: each gets the refusal it deserves, and a good token in a
    /// bad head is still refused.
    #[test]
    fn malformed_heads_are_refused_not_crashed_on() {
        let (p, tokens) = preview();
        let t = tokens[0].value.clone();
        let good = format!("x-blaxel-preview-token: {t}");
        let bad = Refusal::Malformed("");
        let cases: Vec<(String, Option<Refusal>)> = vec![
            (format!("GET /?tok=%aé HTTP/1.1\r\n{good}\r\n\r\n"), Some(bad)),
            (format!("GET /?tok=%a HTTP/1.1\r\n{good}\r\n\r\n"), None),
            (format!("GET /?bl_preview_token=%aé HTTP/1.1\r\n{good}\r\n\r\n"), Some(bad)),
            ("GET /?bl_preview_token=%zz HTTP/1.1\r\n\r\n".to_string(), Some(bad)),
            ("GET /?bl_preview_token=% HTTP/1.1\r\n\r\n".to_string(), Some(bad)),
            ("GET /?bl_preview_token=é%e HTTP/1.1\r\n\r\n".to_string(), Some(bad)),
            (format!("GET /?%=x&bl_preview_token={t} HTTP/1.1\r\n\r\n"), Some(bad)),
            ("GET /?bl_preview_token HTTP/1.1\r\n\r\n".to_string(), Some(Refusal::Unauthorized)),
            (format!("GET /?bl_preview_token={t}#frag HTTP/1.1\r\n\r\n"), None),
            (format!("GET /?bl%5Fpreview%5Ftoken={t} HTTP/1.1\r\n\r\n"), None),
            (format!("GET / HTTP/1.1\r\n{good}\r\n"), Some(bad)),
            (format!("GET / HTTP/1.1\r\n{good}\r\nbroken line\r\n\r\n"), Some(bad)),
            (format!("GET / HTTP/1.1\r\n{good}\r\n folded: x\r\n\r\n"), Some(bad)),
            (format!("GET / HTTP/2\r\n{good}\r\n\r\n"), Some(bad)),
            (format!("GET  / HTTP/1.1\r\n{good}\r\n\r\n"), Some(bad)),
            (format!("G\u{e9}T / HTTP/1.1\r\n{good}\r\n\r\n"), Some(bad)),
            ("\r\n\r\n".to_string(), Some(bad)),
            (format!("POST / HTTP/1.1\r\n{good}\r\nContent-Length: 1x\r\n\r\n"), Some(bad)),
            (format!("POST / HTTP/1.1\r\n{good}\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"), Some(bad)),
            (format!("POST / HTTP/1.1\r\n{good}\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"), Some(bad)),
            (format!("POST / HTTP/1.1\r\n{good}\r\nTransfer-Encoding: gzip\r\n\r\n"), Some(bad)),
            (format!("POST / HTTP/1.1\r\n{good}\r\nContent-Length: 99999999999999999999999\r\n\r\n"), Some(bad)),
            (format!("GET / HTTP/1.1\r\n{good}\r\n\r\n"), None),
        ];
        for (head, want) in cases {
            let got = check(head.as_bytes(), &p, &tokens);
            match (want, &got) {
                (None, Ok(_)) => {}
                (Some(Refusal::Malformed(_)), Err(Refusal::Malformed(_))) => {}
                (Some(Refusal::Unauthorized), Err(Refusal::Unauthorized)) => {}
                _ => panic!("{head:?}: expected {want:?}, got {got:?}"),
            }
        }
        // Arbitrary bytes after a valid prefix never panic either.
        let alphabet = b"%a\xc3\xa9:\r\n =&?#+0fZ";
        let mut seed = 0x2545_f491_u32;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            seed
        };
        for _ in 0..2000 {
            let mut head = b"GET /?bl_preview_token=".to_vec();
            for _ in 0..(next() % 40) {
                head.push(alphabet[next() as usize % alphabet.len()]);
            }
            head.extend_from_slice(b"\r\n\r\n");
            let _ = check(&head, &p, &tokens);
        }
    }

    #[test]
    fn forwarded_heads_close_after_one_request() {
        let (p, tokens) = preview();
        let t = &tokens[0].value;
        let head = format!(
            "POST /x HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\nx-blaxel-preview-token: {t}\r\nContent-Length: 4\r\n\r\n"
        );
        let accepted = check(head.as_bytes(), &p, &tokens).unwrap();
        let text = String::from_utf8(accepted.head).unwrap();
        assert!(text.ends_with("Connection: close\r\n\r\n"), "{text}");
        assert!(!text.to_ascii_lowercase().contains("keep-alive"), "{text}");
        assert_eq!(accepted.framing, Framing::Length(4));
        let ws = format!(
            "GET /ws HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nx-blaxel-preview-token: {t}\r\n\r\n"
        );
        let accepted = check(ws.as_bytes(), &p, &tokens).unwrap();
        assert_eq!(accepted.framing, Framing::Upgrade);
        assert!(String::from_utf8(accepted.head)
            .unwrap()
            .contains("Connection: upgrade\r\n"));
        let chunked = format!(
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nx-blaxel-preview-token: {t}\r\n\r\n"
        );
        assert_eq!(
            check(chunked.as_bytes(), &p, &tokens).unwrap().framing,
            Framing::Chunked
        );
    }
}
