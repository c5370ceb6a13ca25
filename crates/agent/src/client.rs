//! The client half of the agent protocol, shared by every backend that talks to a sandbox
//! agent: the embedded engine (over its monitor's unix socket) and the Kubernetes backend (to
//! the in-pod agent over TCP).
//!
//! A [`RemoteAgent`] opens connections through an [`AgentDialer`], sends the hello (with the
//! per-sandbox token where the transport needs one) and the request in one write, and
//! decodes the replies: single answers, process event streams, file streams, uploads and
//! watch events. This is the only place those replies are decoded.
//!
//! A connection whose request ended cleanly goes back to a small [`ConnPool`] and carries the
//! next call (protocol v5): no dial, no hello and, on the embedded engine, no hop through the
//! monitor. Only a request that ended cleanly returns its connection (an error reply, a
//! dropped stream or a failed upload drops it). A pooled connection the agent retired (the
//! sandbox was paused, resumed or stopped, or the connection idled out) or lost (the agent
//! restarted, the sandbox was destroyed) is replaced by one fresh dial, but only for a request
//! that cannot have been served: the agent said so (`Retired`), the request could not be
//! written, or it has no effect anyway.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::{FutureExt, StreamExt};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::proto::{self, AgentReply, AgentRequest, Hello, PROTOCOL_VERSION};
use sandcove_core::{ByteStream, ProcessStream, WatchStream};
use sandcove_core::{
    ChmodOptions, CopyOptions, Error, FileStat, ListDirOptions, Metrics, MkdirOptions,
    ProcessEvent, ProcessInfo, ProcessSelector, ProcessSpec, ReadOptions, RemoveOptions,
    RenameOptions, ResizePtyOptions, Result, SignalOptions, StatOptions, WatchOptions,
    WriteOptions, WriteStdinOptions,
};

/// A byte connection to an agent (a TCP or unix stream, or a test double).
pub trait AgentIo: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + ?Sized> AgentIo for T {}

/// Opens a fresh connection to one sandbox's agent.
#[async_trait]
pub trait AgentDialer: Send + Sync + std::fmt::Debug {
    /// Connect; a sandbox that is gone is [`Error::NotFound`], one not reachable right now a
    /// retryable error.
    async fn dial(&self) -> Result<Box<dyn AgentIo>>;
}

/// How long [`TcpDialer::new`] waits for a connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Dials an agent serving TCP (the in-pod agent at its Pod IP, or a forwarded port).
#[derive(Debug, Clone)]
pub struct TcpDialer {
    /// The agent's address.
    pub addr: SocketAddr,
    /// How long to wait for the connection.
    pub connect_timeout: Duration,
}

impl TcpDialer {
    /// A dialer for `addr` with [`DEFAULT_CONNECT_TIMEOUT`].
    pub fn new(addr: SocketAddr) -> Self {
        TcpDialer {
            addr,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
        }
    }
}

#[async_trait]
impl AgentDialer for TcpDialer {
    async fn dial(&self) -> Result<Box<dyn AgentIo>> {
        let addr = self.addr;
        let stream =
            tokio::time::timeout(self.connect_timeout, tokio::net::TcpStream::connect(addr))
                .await
                .map_err(|_| Error::Timeout {
                    what: format!("connecting to the sandbox agent at {addr}"),
                })?
                .map_err(|e| Error::Backend {
                    message: format!("cannot reach the sandbox agent at {addr}: {e}"),
                    retryable: true,
                })?;
        // Requests and replies are small frames: no batching delay.
        let _ = stream.set_nodelay(true);
        Ok(Box::new(stream))
    }
}

/// Idle connections kept per sandbox for its next call.
pub const POOL_PER_SANDBOX: usize = 4;
/// Idle connections kept in all, whatever the number of sandboxes (each is a descriptor).
pub const POOL_TOTAL: usize = 64;
/// How long an idle connection is kept: well under the agent's own idle limit
/// (`AGENT_IDLE`), so a kept connection is rarely one the agent is retiring.
pub const POOL_IDLE: Duration = Duration::from_secs(10);

/// Idle agent connections, kept for reuse by the [`RemoteAgent`]s that share it (protocol
/// v5). Bounded per sandbox ([`POOL_PER_SANDBOX`]) and in all ([`POOL_TOTAL`]); a connection
/// idle longer than [`POOL_IDLE`] is dropped rather than reused. Connections are kept per
/// async runtime, since one is registered with the runtime that opened it.
#[derive(Default)]
pub struct ConnPool {
    idle: Mutex<PoolState>,
}

#[derive(Default)]
struct PoolState {
    by_key: HashMap<PoolKey, Vec<Idle>>,
    count: usize,
}

type PoolKey = (String, tokio::runtime::Id);

/// An idle connection and when it became idle.
type Idle = (Box<dyn AgentIo>, Instant);

impl std::fmt::Debug for ConnPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnPool")
            .field("idle", &self.idle_count())
            .finish()
    }
}

impl ConnPool {
    /// An empty pool.
    pub fn new() -> Self {
        Self::default()
    }

    /// Idle connections held right now.
    pub fn idle_count(&self) -> usize {
        self.state().count
    }

    /// Drop every idle connection to `sandbox` (it is being stopped, paused or destroyed).
    pub fn forget(&self, sandbox: &str) {
        let mut guard = self.state();
        let state = &mut *guard;
        let mut dropped = 0;
        state.by_key.retain(|(id, _), conns| {
            if id == sandbox {
                dropped += conns.len();
                false
            } else {
                true
            }
        });
        state.count -= dropped;
    }

    fn state(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The most recently used idle connection to `sandbox` that still looks open.
    fn take(&self, sandbox: &str) -> Option<Box<dyn AgentIo>> {
        let key = (sandbox.to_string(), runtime_id()?);
        let mut guard = self.state();
        // Through the guard once, so the map and the count borrow apart.
        let state = &mut *guard;
        loop {
            let conns = state.by_key.get_mut(&key)?;
            let Some((mut io, since)) = conns.pop() else {
                state.by_key.remove(&key);
                return None;
            };
            state.count -= 1;
            if since.elapsed() > POOL_IDLE {
                // The rest are older still.
                let older = conns.len();
                state.by_key.remove(&key);
                state.count -= older;
                return None;
            }
            if looks_open(&mut io) {
                return Some(io);
            }
        }
    }

    /// Keep `io`, whose last request ended cleanly, for the next call to `sandbox`.
    pub fn put(&self, sandbox: &str, io: Box<dyn AgentIo>) {
        let Some(runtime) = runtime_id() else {
            return;
        };
        let mut guard = self.state();
        let state = &mut *guard;
        if state.count >= POOL_TOTAL {
            // Make room from what has idled out, else keep nothing more.
            let mut dropped = 0;
            state.by_key.retain(|_, conns| {
                let before = conns.len();
                conns.retain(|(_, since)| since.elapsed() <= POOL_IDLE);
                dropped += before - conns.len();
                !conns.is_empty()
            });
            state.count -= dropped;
            if state.count >= POOL_TOTAL {
                return;
            }
        }
        let conns = state
            .by_key
            .entry((sandbox.to_string(), runtime))
            .or_default();
        let full = conns.len() >= POOL_PER_SANDBOX;
        if full {
            conns.remove(0);
        }
        conns.push((io, Instant::now()));
        if !full {
            state.count += 1;
        }
    }
}

fn runtime_id() -> Option<tokio::runtime::Id> {
    tokio::runtime::Handle::try_current().ok().map(|h| h.id())
}

/// Whether an idle connection is still open: the agent sends nothing on an idle connection
/// but a `Retired` frame before closing it, so anything readable (bytes, end of stream, an
/// error) means it is not.
fn looks_open(io: &mut Box<dyn AgentIo>) -> bool {
    let mut byte = [0u8; 1];
    io.read(&mut byte).now_or_never().is_none()
}

/// Requests that change nothing in the sandbox: sent again on a fresh connection when a
/// reused one broke before any reply, since serving one twice does no harm.
fn effect_free(request: &AgentRequest) -> bool {
    matches!(
        request,
        AgentRequest::Ping
            | AgentRequest::ListProcesses
            | AgentRequest::ReadFile { .. }
            | AgentRequest::ListDir { .. }
            | AgentRequest::Stat { .. }
            | AgentRequest::Metrics
            | AgentRequest::Attach { .. }
    )
}

/// A client of one sandbox's agent. Cheap to clone; clones share its pool of idle
/// connections.
#[derive(Clone)]
pub struct RemoteAgent {
    sandbox: String,
    dialer: Arc<dyn AgentDialer>,
    token: Option<String>,
    while_paused: bool,
    /// Where connections whose request ended cleanly wait for the next call (`None`: every
    /// call dials).
    pool: Option<Arc<ConnPool>>,
}

impl std::fmt::Debug for RemoteAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token.
        f.debug_struct("RemoteAgent")
            .field("sandbox", &self.sandbox)
            .field("dialer", &self.dialer)
            .finish_non_exhaustive()
    }
}

impl RemoteAgent {
    /// A client of the agent of sandbox `sandbox` (named in errors), reached through
    /// `dialer`, presenting `token` in every hello, with a pool of its own (shared by its
    /// clones) for connections to reuse.
    pub fn new(sandbox: &str, dialer: Arc<dyn AgentDialer>, token: String) -> Self {
        RemoteAgent {
            sandbox: sandbox.to_string(),
            dialer,
            token: Some(token),
            while_paused: false,
            pool: Some(Arc::new(ConnPool::new())),
        }
    }

    /// A client for a transport that needs no token (the monitor's unix socket), keeping
    /// idle connections in `pool`.
    pub fn without_token(sandbox: &str, dialer: Arc<dyn AgentDialer>, pool: Arc<ConnPool>) -> Self {
        RemoteAgent {
            sandbox: sandbox.to_string(),
            dialer,
            token: None,
            while_paused: false,
            pool: Some(pool),
        }
    }

    /// The same client keeping its idle connections in `pool` (`None`: none kept, every
    /// call dials).
    pub fn with_pool(mut self, pool: Option<Arc<ConnPool>>) -> Self {
        self.pool = pool;
        self
    }

    /// Ask for requests to be served while the sandbox is paused (the embedded engine's
    /// snapshot export). Such a connection serves one request: none is pooled.
    pub fn while_paused(mut self) -> Self {
        self.while_paused = true;
        self.pool = None;
        self
    }

    /// The sandbox this client serves.
    pub fn sandbox(&self) -> &str {
        &self.sandbox
    }

    /// Check that the agent is reachable, speaks this protocol version and accepts the token.
    pub async fn ready(&self) -> Result<()> {
        self.done_call(AgentRequest::Ping).await
    }

    /// Start a process (see [`Backend::spawn`](sandcove_core::Backend::spawn)). The backend
    /// calling this has validated `spec`; the agent validates what it receives again, at its
    /// own process boundary.
    pub async fn spawn(&self, spec: ProcessSpec) -> Result<ProcessStream> {
        self.process_stream(AgentRequest::Spawn { spec }).await
    }

    /// Attach to a process: retained output, then live events.
    pub async fn attach(&self, process: ProcessSelector) -> Result<ProcessStream> {
        self.process_stream(AgentRequest::Attach { process }).await
    }

    /// Write bytes to a process's stdin.
    pub async fn write_stdin(
        &self,
        process: ProcessSelector,
        options: WriteStdinOptions,
    ) -> Result<()> {
        let data = options.data;
        let body: ByteStream = Box::pin(futures::stream::once(async move { Ok(data) }));
        let mut stream = self
            .upload(AgentRequest::WriteStdin { process }, body)
            .await?;
        match self.read_reply(&mut stream).await? {
            AgentReply::Done => {
                self.keep(stream);
                Ok(())
            }
            other => Err(unexpected(&other)),
        }
    }

    /// Close a process's stdin.
    pub async fn close_stdin(&self, process: ProcessSelector) -> Result<()> {
        self.done_call(AgentRequest::CloseStdin { process }).await
    }

    /// Signal a process's group.
    pub async fn signal(&self, process: ProcessSelector, options: SignalOptions) -> Result<()> {
        let signal = options.signal;
        self.done_call(AgentRequest::Signal { process, signal })
            .await
    }

    /// The processes started through the API.
    pub async fn list_processes(&self) -> Result<Vec<ProcessInfo>> {
        match self.call(AgentRequest::ListProcesses).await? {
            AgentReply::Processes { processes } => Ok(processes),
            other => Err(unexpected(&other)),
        }
    }

    /// Read a file as a stream of chunks; a missing file or a directory fails here, before
    /// the stream is returned.
    pub async fn read_file(&self, path: &str, options: ReadOptions) -> Result<ByteStream> {
        let request = AgentRequest::ReadFile {
            path: path.to_string(),
            options,
        };
        let (stream, first) = self.start(&request).await?;
        self.data_stream(stream, first)
    }

    /// Write a file from a stream of chunks.
    pub async fn write_file(
        &self,
        path: &str,
        data: ByteStream,
        options: WriteOptions,
    ) -> Result<FileStat> {
        // Refused before any byte is sent (the agent checks again).
        options.validate()?;
        let request = AgentRequest::WriteFile {
            path: path.to_string(),
            options,
        };
        let mut stream = self.upload(request, data).await?;
        match self.read_reply(&mut stream).await? {
            AgentReply::Stat { stat } => {
                self.keep(stream);
                Ok(stat)
            }
            other => Err(unexpected(&other)),
        }
    }

    /// List a directory.
    pub async fn list_dir(&self, path: &str, options: ListDirOptions) -> Result<Vec<FileStat>> {
        let request = AgentRequest::ListDir {
            path: path.to_string(),
            options,
        };
        match self.call(request).await? {
            AgentReply::Entries { entries } => Ok(entries),
            other => Err(unexpected(&other)),
        }
    }

    /// Stat a path.
    pub async fn stat(&self, path: &str, options: StatOptions) -> Result<FileStat> {
        self.stat_call(AgentRequest::Stat {
            path: path.to_string(),
            options,
        })
        .await
    }

    /// Make a directory.
    pub async fn mkdir(&self, path: &str, options: MkdirOptions) -> Result<FileStat> {
        self.stat_call(AgentRequest::Mkdir {
            path: path.to_string(),
            options,
        })
        .await
    }

    /// Remove a path.
    pub async fn remove(&self, path: &str, options: RemoveOptions) -> Result<()> {
        self.done_call(AgentRequest::Remove {
            path: path.to_string(),
            options,
        })
        .await
    }

    /// Rename a path.
    pub async fn rename(&self, from: &str, to: &str, options: RenameOptions) -> Result<FileStat> {
        self.stat_call(AgentRequest::Rename {
            from: from.to_string(),
            to: to.to_string(),
            options,
        })
        .await
    }

    /// Copy a file or tree.
    pub async fn copy(&self, from: &str, to: &str, options: CopyOptions) -> Result<FileStat> {
        self.stat_call(AgentRequest::Copy {
            from: from.to_string(),
            to: to.to_string(),
            options,
        })
        .await
    }

    /// Change permission bits.
    pub async fn chmod(&self, path: &str, options: ChmodOptions) -> Result<FileStat> {
        self.stat_call(AgentRequest::Chmod {
            path: path.to_string(),
            mode: options.mode,
        })
        .await
    }

    /// Resource usage.
    pub async fn metrics(&self) -> Result<Metrics> {
        match self.call(AgentRequest::Metrics).await? {
            AgentReply::Metrics { metrics } => Ok(metrics),
            other => Err(unexpected(&other)),
        }
    }

    /// Resize a process's terminal.
    pub async fn resize_pty(
        &self,
        process: ProcessSelector,
        options: ResizePtyOptions,
    ) -> Result<()> {
        let size = options.size;
        self.done_call(AgentRequest::ResizePty { process, size })
            .await
    }

    /// Watch a directory; dropping the stream ends the watch.
    pub async fn watch(&self, path: &str, options: WatchOptions) -> Result<WatchStream> {
        let request = AgentRequest::Watch {
            path: path.to_string(),
            options,
        };
        let mut stream = self.open(&request).await?;
        match self.read_reply(&mut stream).await? {
            AgentReply::Done => {}
            other => return Err(unexpected(&other)),
        }
        let events = futures::stream::unfold(Some(stream), |state| async move {
            let mut stream = state?;
            match proto::read_frame::<_, AgentReply>(&mut stream).await {
                Ok(Some((AgentReply::FsEvent { event }, _))) => Some((Ok(event), Some(stream))),
                Ok(Some((AgentReply::Error { error }, _))) => {
                    Some((Err(proto::remote_error(&error)), None))
                }
                Ok(Some((other, _))) => Some((Err(unexpected(&other)), None)),
                Ok(None) => Some((
                    Err(Error::backend(
                        "the watch ended: the sandbox was destroyed or its agent died",
                    )),
                    None,
                )),
                Err(e) => Some((Err(e), None)),
            }
        });
        Ok(Box::pin(events))
    }

    /// A connection carrying raw bytes to `port` on the sandbox's loopback (a preview of a
    /// server that listens on 127.0.0.1 inside the sandbox).
    pub async fn tunnel(&self, port: u16) -> Result<Box<dyn AgentIo>> {
        let mut stream = self.open(&AgentRequest::Tunnel { port }).await?;
        match self.read_reply(&mut stream).await? {
            AgentReply::Done => Ok(stream),
            other => Err(unexpected(&other)),
        }
    }

    /// Stream the sandbox's writable filesystem as a tar archive.
    pub async fn export_fs(&self) -> Result<ByteStream> {
        let (stream, first) = self.start(&AgentRequest::ExportFs).await?;
        self.data_stream(stream, first)
    }

    /// Unpack a tar archive into the sandbox root.
    pub async fn import_fs(&self, data: ByteStream) -> Result<()> {
        let mut stream = self.upload(AgentRequest::ImportFs, data).await?;
        match self.read_reply(&mut stream).await? {
            AgentReply::Done => {
                self.keep(stream);
                Ok(())
            }
            other => Err(unexpected(&other)),
        }
    }

    /// Send a request answered by `Done`.
    pub async fn done_call(&self, request: AgentRequest) -> Result<()> {
        match self.call(request).await? {
            AgentReply::Done => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    async fn stat_call(&self, request: AgentRequest) -> Result<FileStat> {
        match self.call(request).await? {
            AgentReply::Stat { stat } => Ok(stat),
            other => Err(unexpected(&other)),
        }
    }

    /// A request with a single reply; its connection is kept for the next call unless the
    /// reply is an error.
    async fn call(&self, request: AgentRequest) -> Result<AgentReply> {
        let (stream, (reply, _)) = self.start(&request).await?;
        match reply {
            AgentReply::Error { error } => Err(proto::remote_error(&error)),
            reply => {
                self.keep(stream);
                Ok(reply)
            }
        }
    }

    /// Send `request` and read its first reply frame: on an idle pooled connection when
    /// there is one, else (or when that one turns out retired or broken before it can have
    /// served the request) on a fresh one.
    async fn start(
        &self,
        request: &AgentRequest,
    ) -> Result<(Box<dyn AgentIo>, (AgentReply, Vec<u8>))> {
        if let Some(mut stream) = self.pool.as_ref().and_then(|p| p.take(&self.sandbox)) {
            let mut buf = Vec::new();
            proto::write_frame(&mut buf, request, &[]).await?;
            // A write that fails delivered nothing: the agent never read the request.
            if stream.write_all(&buf).await.is_ok() {
                match proto::read_frame::<_, AgentReply>(&mut stream).await {
                    // Retired: not served, by the agent's word.
                    Ok(Some((AgentReply::Retired, _))) => {}
                    Ok(Some(first)) => return Ok((stream, first)),
                    // Gone before any reply: it may have been served, so only a request
                    // without effect goes again.
                    Ok(None) | Err(_) if effect_free(request) => {}
                    Ok(None) => return Err(self.no_reply()),
                    Err(e) => return Err(e),
                }
            }
        }
        let mut stream = self.open(request).await?;
        match proto::read_frame::<_, AgentReply>(&mut stream).await? {
            Some(first) => Ok((stream, first)),
            None => Err(self.no_reply()),
        }
    }

    fn no_reply(&self) -> Error {
        Error::Backend {
            message: format!(
                "sandbox {:?} closed the connection without a reply",
                self.sandbox
            ),
            retryable: false,
        }
    }

    /// Keep a connection whose request ended cleanly for the next call.
    fn keep(&self, stream: Box<dyn AgentIo>) {
        if let Some(pool) = &self.pool {
            pool.put(&self.sandbox, stream);
        }
    }

    /// Open a fresh connection served by the agent, with the hello and `request` sent.
    async fn open(&self, request: &AgentRequest) -> Result<Box<dyn AgentIo>> {
        let mut stream = self.dialer.dial().await?;
        let hello = Hello {
            version: PROTOCOL_VERSION,
            request: None,
            while_paused: self.while_paused,
            token: self.token.clone(),
        };
        // Both frames in one write: no extra round trip for the hello.
        let mut buf = Vec::new();
        proto::write_frame(&mut buf, &hello, &[]).await?;
        proto::write_frame(&mut buf, request, &[]).await?;
        if let Err(e) = stream.write_all(&buf).await {
            // Refused before the request was read (a wrong token): report the refusal.
            let send_error = Error::backend(format!("sandbox {:?}: {e}", self.sandbox));
            return Err(refusal_or(&mut stream, send_error).await);
        }
        Ok(stream)
    }

    async fn read_reply(&self, stream: &mut Box<dyn AgentIo>) -> Result<AgentReply> {
        match proto::read_frame::<_, AgentReply>(stream).await? {
            Some((AgentReply::Error { error }, _)) => Err(proto::remote_error(&error)),
            Some((reply, _)) => Ok(reply),
            None => Err(self.no_reply()),
        }
    }

    /// `Data` frames up to `End`; the first frame (`first`, read already) decides (a missing
    /// file, a directory) before the stream is returned. The connection is kept once `End`
    /// is read.
    fn data_stream(
        &self,
        stream: Box<dyn AgentIo>,
        first: (AgentReply, Vec<u8>),
    ) -> Result<ByteStream> {
        let first = match first {
            (AgentReply::Data, body) => body,
            (AgentReply::End, _) => {
                self.keep(stream);
                return Ok(Box::pin(futures::stream::empty()));
            }
            (AgentReply::Error { error }, _) => return Err(proto::remote_error(&error)),
            (other, _) => return Err(unexpected(&other)),
        };
        let owner = self.clone();
        let rest = futures::stream::unfold(Some(stream), move |state| {
            let owner = owner.clone();
            async move {
                let mut stream = state?;
                match proto::read_frame::<_, AgentReply>(&mut stream).await {
                    Ok(Some((AgentReply::Data, body))) => Some((Ok(body), Some(stream))),
                    Ok(Some((AgentReply::End, _))) => {
                        owner.keep(stream);
                        None
                    }
                    Ok(Some((AgentReply::Error { error }, _))) => {
                        Some((Err(proto::remote_error(&error)), None))
                    }
                    Ok(Some((other, _))) => Some((Err(unexpected(&other)), None)),
                    Ok(None) => Some((
                        Err(Error::backend("file stream ended before its end marker")),
                        None,
                    )),
                    Err(e) => Some((Err(e), None)),
                }
            }
        });
        Ok(Box::pin(
            futures::stream::once(async move { Ok(first) }).chain(rest),
        ))
    }

    async fn process_stream(&self, request: AgentRequest) -> Result<ProcessStream> {
        let (stream, first) = self.start(&request).await?;
        let pid = match first {
            (AgentReply::Started { pid }, _) => pid,
            (AgentReply::Error { error }, _) => return Err(proto::remote_error(&error)),
            (other, _) => return Err(unexpected(&other)),
        };
        let id = self.sandbox.clone();
        let owner = self.clone();
        // The connection is kept once the exit status is read (a stream dropped before that
        // drops its connection too).
        let events = futures::stream::unfold(Some(stream), move |state| {
            let id = id.clone();
            let owner = owner.clone();
            async move {
                let mut stream = state?;
                let item = match proto::read_frame::<_, AgentReply>(&mut stream).await {
                    Ok(Some((AgentReply::Stdout, body))) => Ok(ProcessEvent::Stdout(body)),
                    Ok(Some((AgentReply::Stderr, body))) => Ok(ProcessEvent::Stderr(body)),
                    Ok(Some((AgentReply::Gap { stdout, stderr }, _))) => {
                        Ok(ProcessEvent::Gap { stdout, stderr })
                    }
                    Ok(Some((AgentReply::Live, _))) => Ok(ProcessEvent::Live),
                    Ok(Some((
                        AgentReply::Restarted {
                            pid,
                            restarts,
                            previous,
                        },
                        _,
                    ))) => Ok(ProcessEvent::Restarted {
                        pid,
                        restarts,
                        previous,
                    }),
                    Ok(Some((AgentReply::Exit { status }, _))) => {
                        owner.keep(stream);
                        return Some((Ok(ProcessEvent::Exit(status)), None));
                    }
                    Ok(Some((AgentReply::Error { error }, _))) => {
                        return Some((Err(proto::remote_error(&error)), None));
                    }
                    Ok(Some((other, _))) => return Some((Err(unexpected(&other)), None)),
                    Ok(None) => {
                        return Some((
                            Err(Error::Backend {
                                message: format!(
                                    "sandbox {id:?} closed the process stream before the exit \
                                     status (the sandbox was destroyed or its agent died)"
                                ),
                                retryable: false,
                            }),
                            None,
                        ))
                    }
                    Err(e) => return Some((Err(e), None)),
                };
                Some((item, Some(stream)))
            }
        });
        Ok(ProcessStream {
            pid,
            events: Box::pin(events),
        })
    }

    /// Send `request`, then `data` as `Data` frames and the `End` marker; the reply is the
    /// caller's to read. Always on a fresh connection: data half sent on a connection that
    /// turns out retired could not be sent again.
    async fn upload(
        &self,
        request: AgentRequest,
        mut data: ByteStream,
    ) -> Result<Box<dyn AgentIo>> {
        let mut stream = self.open(&request).await?;
        while let Some(chunk) = data.next().await {
            let chunk = match chunk {
                Ok(c) => c,
                Err(e) => {
                    // The caller's data failed: end the upload without its end marker, so the
                    // agent discards what it received. Its answer comes once that cleanup is
                    // done (the temporary file removed); only then report the caller's error.
                    // An error frame says so on transports that cannot half-close (a Pod
                    // port-forward); the shutdown says it on the others.
                    let abort = AgentReply::Error { error: e.to_body() };
                    let _ = proto::write_frame(&mut stream, &abort, &[]).await;
                    let _ = stream.shutdown().await;
                    let _ = tokio::time::timeout(
                        UPLOAD_CLEANUP_WAIT,
                        proto::read_frame::<_, AgentReply>(&mut stream),
                    )
                    .await;
                    return Err(e);
                }
            };
            // Frames as large as the protocol allows: fewer headers and wake-ups per byte.
            for piece in chunk.chunks(proto::MAX_BODY) {
                if let Err(send_error) =
                    proto::write_frame(&mut stream, &AgentReply::Data, piece).await
                {
                    return Err(refusal_or(&mut stream, send_error).await);
                }
            }
        }
        if let Err(send_error) = proto::write_frame(&mut stream, &AgentReply::End, &[]).await {
            return Err(refusal_or(&mut stream, send_error).await);
        }
        Ok(stream)
    }
}

/// How long a failed upload waits for the agent to finish discarding what it received.
const UPLOAD_CLEANUP_WAIT: Duration = Duration::from_secs(30);

/// The agent refuses a bad request or upload (a bad path, a closed stdin, a wrong token) by
/// replying and closing; report that refusal rather than the broken pipe it causes here.
async fn refusal_or(stream: &mut Box<dyn AgentIo>, send_error: Error) -> Error {
    match proto::read_frame::<_, AgentReply>(stream).await {
        Ok(Some((AgentReply::Error { error }, _))) => proto::remote_error(&error),
        _ => send_error,
    }
}

fn unexpected(reply: &impl std::fmt::Debug) -> Error {
    Error::backend(format!("protocol error: unexpected reply {reply:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// What the fake agent does with one request.
    #[derive(Debug, Clone, Copy)]
    enum Act {
        /// Answer `Done` and wait for the next request.
        Done,
        /// Answer an error, and keep the connection open (a client must not reuse it).
        Fail,
        /// Answer `Retired` and close: the request was not served.
        Retire,
        /// Close without a reply.
        Close,
    }

    /// An agent double on in-memory pipes: the `n`-th request of the `c`-th connection
    /// gets `plan(c, n)`. Counts dials and requests served.
    #[derive(Debug)]
    struct Fake {
        dials: AtomicUsize,
        served: Arc<AtomicUsize>,
        plan: fn(usize, usize) -> Act,
    }

    impl Fake {
        fn new(plan: fn(usize, usize) -> Act) -> Arc<Self> {
            Arc::new(Fake {
                dials: AtomicUsize::new(0),
                served: Arc::new(AtomicUsize::new(0)),
                plan,
            })
        }
        fn dials(&self) -> usize {
            self.dials.load(Ordering::SeqCst)
        }
    }

    #[async_trait]
    impl AgentDialer for Fake {
        async fn dial(&self) -> Result<Box<dyn AgentIo>> {
            let c = self.dials.fetch_add(1, Ordering::SeqCst);
            let (client, mut server) = tokio::io::duplex(1 << 16);
            let (plan, served) = (self.plan, self.served.clone());
            tokio::spawn(async move {
                let hello = proto::read_frame::<_, serde_json::Value>(&mut server).await;
                if !matches!(hello, Ok(Some(_))) {
                    return;
                }
                let mut n = 0;
                while let Ok(Some(_request)) =
                    proto::read_frame::<_, serde_json::Value>(&mut server).await
                {
                    let reply = match plan(c, n) {
                        Act::Done => {
                            served.fetch_add(1, Ordering::SeqCst);
                            AgentReply::Done
                        }
                        Act::Fail => AgentReply::error(&Error::invalid("refused")),
                        Act::Retire => {
                            let _ =
                                proto::write_frame(&mut server, &AgentReply::Retired, &[]).await;
                            return;
                        }
                        Act::Close => return,
                    };
                    if proto::write_frame(&mut server, &reply, &[]).await.is_err() {
                        return;
                    }
                    n += 1;
                }
            });
            Ok(Box::new(client))
        }
    }

    fn client(fake: &Arc<Fake>) -> RemoteAgent {
        RemoteAgent::new("sb", fake.clone(), "token".into())
    }

    #[tokio::test]
    async fn a_connection_is_reused_after_a_clean_reply() {
        let fake = Fake::new(|_, _| Act::Done);
        let agent = client(&fake);
        for _ in 0..3 {
            agent.ready().await.expect("ping");
        }
        // Clones share the pool.
        agent.clone().ready().await.expect("ping from a clone");
        assert_eq!(fake.dials(), 1);
        // Without a pool every call dials.
        let unpooled = client(&fake).with_pool(None);
        unpooled.ready().await.unwrap();
        unpooled.ready().await.unwrap();
        assert_eq!(fake.dials(), 3);
    }

    #[tokio::test]
    async fn an_error_reply_drops_the_connection() {
        let fake = Fake::new(|c, n| {
            if (c, n) == (0, 1) {
                Act::Fail
            } else {
                Act::Done
            }
        });
        let agent = client(&fake);
        agent.ready().await.unwrap();
        let err = agent.ready().await.expect_err("the fake refuses");
        assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
        agent.ready().await.unwrap();
        assert_eq!(fake.dials(), 2, "a fresh connection after the error");
    }

    #[tokio::test]
    async fn a_retired_connection_is_replaced_once() {
        let fake = Fake::new(|c, n| {
            if (c, n) == (0, 1) {
                Act::Retire
            } else {
                Act::Done
            }
        });
        let agent = client(&fake);
        agent.ready().await.unwrap();
        // Sent on the pooled connection, refused unserved, sent again on a fresh one.
        agent.close_stdin(ProcessSelector::Pid(7)).await.unwrap();
        assert_eq!(fake.dials(), 2);
        assert_eq!(fake.served.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_broken_reused_connection_is_retried_only_for_a_request_without_effect() {
        let fake = Fake::new(|c, n| {
            if (c, n) == (0, 1) {
                Act::Close
            } else {
                Act::Done
            }
        });
        let agent = client(&fake);
        agent.ready().await.unwrap();
        // A ping may go again.
        agent.ready().await.expect("retried on a fresh connection");
        assert_eq!(fake.dials(), 2);

        let fake = Fake::new(|c, n| {
            if (c, n) == (0, 1) {
                Act::Close
            } else {
                Act::Done
            }
        });
        let agent = client(&fake);
        agent.ready().await.unwrap();
        // Closing stdin might have been served before the connection broke: not sent again.
        let err = agent
            .close_stdin(ProcessSelector::Pid(7))
            .await
            .expect_err("not retried");
        assert!(err.to_string().contains("without a reply"), "{err}");
        assert_eq!(fake.dials(), 1);
    }

    #[tokio::test]
    async fn the_pool_is_bounded_and_forgets_a_sandbox() {
        let pool = ConnPool::new();
        for _ in 0..POOL_PER_SANDBOX + 2 {
            let (a, _b) = tokio::io::duplex(64);
            pool.put("one", Box::new(a));
        }
        assert_eq!(pool.idle_count(), POOL_PER_SANDBOX);
        let (a, b) = tokio::io::duplex(64);
        pool.put("two", Box::new(a));
        assert_eq!(pool.idle_count(), POOL_PER_SANDBOX + 1);
        pool.forget("one");
        assert_eq!(pool.idle_count(), 1);
        let (c, d) = tokio::io::duplex(64);
        pool.put("two", Box::new(c));
        assert!(pool.take("two").is_some(), "an open one is handed out");
        // A connection whose other end closed is never handed out.
        drop((b, d));
        assert!(pool.take("two").is_none(), "its peer is gone");
        assert_eq!(pool.idle_count(), 0);
    }
}
