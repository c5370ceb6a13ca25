//! The client half of the agent protocol, shared by every backend that talks to a sandbox
//! agent: the embedded engine (over its monitor's unix socket) and the Kubernetes backend (to
//! the in-pod agent over TCP).
//!
//! A [`RemoteAgent`] opens one connection per call through an [`AgentDialer`], sends the
//! hello (with the per-sandbox token where the transport needs one) and the request in one
//! write, and decodes the replies: single answers, process event streams, file streams,
//! uploads and watch events. This is the only place those replies are decoded.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use super::local::proto::{self, AgentReply, AgentRequest, Hello, PROTOCOL_VERSION};
use super::{ByteStream, ProcessStream, WatchStream};
use crate::{
    CopyOptions, Error, FileStat, ListDirOptions, Metrics, MkdirOptions, ProcessEvent, ProcessInfo,
    ProcessSelector, ProcessSpec, PtySize, ReadOptions, RemoveOptions, RenameOptions, Result,
    Signal, StatOptions, WatchOptions, WriteOptions,
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

/// A client of one sandbox's agent. Cheap to clone; every call opens its own connection.
#[derive(Clone)]
pub struct RemoteAgent {
    sandbox: String,
    dialer: Arc<dyn AgentDialer>,
    token: Option<String>,
    while_paused: bool,
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
    /// `dialer`, presenting `token` in every hello.
    pub fn new(sandbox: &str, dialer: Arc<dyn AgentDialer>, token: String) -> Self {
        RemoteAgent {
            sandbox: sandbox.to_string(),
            dialer,
            token: Some(token),
            while_paused: false,
        }
    }

    /// A client for a transport that needs no token (the monitor's unix socket).
    pub(crate) fn without_token(sandbox: &str, dialer: Arc<dyn AgentDialer>) -> Self {
        RemoteAgent {
            sandbox: sandbox.to_string(),
            dialer,
            token: None,
            while_paused: false,
        }
    }

    /// Ask for requests to be served while the sandbox is paused (the embedded engine's
    /// snapshot export).
    pub(crate) fn while_paused(mut self) -> Self {
        self.while_paused = true;
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

    /// Start a process (see [`Backend::spawn`](super::Backend::spawn)).
    pub async fn spawn(&self, spec: ProcessSpec) -> Result<ProcessStream> {
        spec.validate()?;
        self.process_stream(AgentRequest::Spawn { spec }).await
    }

    /// Attach to a process: retained output, then live events.
    pub async fn attach(&self, process: ProcessSelector) -> Result<ProcessStream> {
        self.process_stream(AgentRequest::Attach { process }).await
    }

    /// Write bytes to a process's stdin.
    pub async fn write_stdin(&self, process: ProcessSelector, data: Vec<u8>) -> Result<()> {
        let body: ByteStream = Box::pin(futures::stream::once(async move { Ok(data) }));
        let mut stream = self
            .upload(AgentRequest::WriteStdin { process }, body)
            .await?;
        match self.read_reply(&mut stream).await? {
            AgentReply::Done => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    /// Close a process's stdin.
    pub async fn close_stdin(&self, process: ProcessSelector) -> Result<()> {
        self.done_call(AgentRequest::CloseStdin { process }).await
    }

    /// Signal a process's group.
    pub async fn signal(&self, process: ProcessSelector, signal: Signal) -> Result<()> {
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
        let stream = self.open(&request).await?;
        self.data_stream(stream).await
    }

    /// Write a file from a stream of chunks.
    pub async fn write_file(
        &self,
        path: &str,
        data: ByteStream,
        options: WriteOptions,
    ) -> Result<FileStat> {
        let request = AgentRequest::WriteFile {
            path: path.to_string(),
            options,
        };
        let mut stream = self.upload(request, data).await?;
        match self.read_reply(&mut stream).await? {
            AgentReply::Stat { stat } => Ok(stat),
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
    pub async fn chmod(&self, path: &str, mode: u32) -> Result<FileStat> {
        self.stat_call(AgentRequest::Chmod {
            path: path.to_string(),
            mode,
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
    pub async fn resize_pty(&self, process: ProcessSelector, size: PtySize) -> Result<()> {
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
    pub(crate) async fn export_fs(&self) -> Result<ByteStream> {
        let stream = self.open(&AgentRequest::ExportFs).await?;
        self.data_stream(stream).await
    }

    /// Unpack a tar archive into the sandbox root.
    pub(crate) async fn import_fs(&self, data: ByteStream) -> Result<()> {
        let mut stream = self.upload(AgentRequest::ImportFs, data).await?;
        match self.read_reply(&mut stream).await? {
            AgentReply::Done => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    /// Send a request answered by `Done`.
    pub(crate) async fn done_call(&self, request: AgentRequest) -> Result<()> {
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

    /// A request with a single reply.
    async fn call(&self, request: AgentRequest) -> Result<AgentReply> {
        let mut stream = self.open(&request).await?;
        self.read_reply(&mut stream).await
    }

    /// Open a connection served by the agent, with the hello and `request` sent.
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
            None => Err(Error::Backend {
                message: format!(
                    "sandbox {:?} closed the connection without a reply",
                    self.sandbox
                ),
                retryable: false,
            }),
        }
    }

    /// `Data` frames up to `End`; the first frame decides (a missing file, a directory)
    /// before the stream is returned.
    async fn data_stream(&self, mut stream: Box<dyn AgentIo>) -> Result<ByteStream> {
        let first = match proto::read_frame::<_, AgentReply>(&mut stream).await? {
            Some((AgentReply::Data, body)) => body,
            Some((AgentReply::End, _)) => return Ok(Box::pin(futures::stream::empty())),
            Some((AgentReply::Error { error }, _)) => return Err(proto::remote_error(&error)),
            Some((other, _)) => return Err(unexpected(&other)),
            None => {
                return Err(Error::backend(format!(
                    "sandbox {:?} closed the connection without a reply",
                    self.sandbox
                )))
            }
        };
        let rest = futures::stream::unfold(Some(stream), |state| async move {
            let mut stream = state?;
            match proto::read_frame::<_, AgentReply>(&mut stream).await {
                Ok(Some((AgentReply::Data, body))) => Some((Ok(body), Some(stream))),
                Ok(Some((AgentReply::End, _))) => None,
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
        });
        Ok(Box::pin(
            futures::stream::once(async move { Ok(first) }).chain(rest),
        ))
    }

    async fn process_stream(&self, request: AgentRequest) -> Result<ProcessStream> {
        let mut stream = self.open(&request).await?;
        let pid = match self.read_reply(&mut stream).await? {
            AgentReply::Started { pid } => pid,
            other => return Err(unexpected(&other)),
        };
        let id = self.sandbox.clone();
        let events = futures::stream::unfold(Some(stream), move |state| {
            let id = id.clone();
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
    /// caller's to read.
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
