//! The wire protocol between a client program, a sandbox's monitor and its agent.
//!
//! Every connection carries frames: `u32 header length | u32 body length | JSON header | raw
//! body`, lengths little-endian. Bodies carry output and file bytes verbatim, so nothing is
//! re-encoded, and a body's length is known before its first byte: the agent splices file
//! bodies between the socket and the file without reading them into its memory. The first frame of a connection is a [`Hello`] naming the protocol version and
//! the request; a peer speaking another version gets a clear error, never garbage.

use std::io::Write;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use sandcove_core::{
    Error, ErrorBody, ExitStatus, FileStat, FsEvent, ListDirOptions, Metrics, MkdirOptions,
    Preview, PreviewOptions, PreviewToken, ProcessInfo, ProcessSelector, ProcessSpec, PtySize,
    RemoveOptions, Result, SandboxInfo, Signal, WatchOptions, WriteOptions,
};

/// Bumped on any incompatible change to the messages below.
///
/// - v1: the first release.
/// - v2: attaching to a process sends `Live` (where retained history ends) and `Restarted`
///   events, which v1 clients do not know.
/// - v3: reads and writes carry a byte bound, writes and renames an `overwrite` flag,
///   renames a user, and a `copy` request exists (issue 21's file calls).
/// - v4: the hello may carry a `token`, which an agent serving TCP (the in-pod agent of the
///   Kubernetes backend) requires and checks before reading anything else (the monitor's
///   unix socket is guarded by its directory and ignores it); the agent serves `ping` (a
///   reachability check) and `tunnel` (the connection becomes a byte pipe to a port on the
///   sandbox's loopback). Also counted here, added after v3 without a bump of their own: the
///   monitor's `revoke_token` and `claim` and the agent's `apply_claim` (the warm pool).
/// - v5: a connection to the agent carries requests in sequence. Once a request has ended
///   cleanly — its last frame read: the one reply of a single-reply request when it is not an
///   `error`, the `exit` of a process stream, the `end` of a file stream, the reply to an
///   upload — the client may send the next request frame on the same connection, with no
///   second hello (the hello and its token are checked once per connection). `watch` and
///   `tunnel` never end that way, and any `error` reply ends the connection. The agent retires
///   a connection that sat idle for `AGENT_IDLE` (30 s), and every connection it holds when the
///   sandbox is paused, resumed or stopped: an idle one gets a `retired` frame and is closed,
///   and a request read on a retired connection is answered by `retired` alone. A `retired`
///   reply means the request was never served: the client may send it again on a fresh
///   connection, through the monitor, which applies the sandbox's state again. The
///   monitor's `claim` may hand its connection to the agent after its reply (`handoff`), so
///   a warm-pool claim is one round trip. Added to v5 without a bump of its own, since it is
///   left out of every message that does not use it: file extended attributes
///   (`WriteOptions::attributes`, the `attributes` flag of stat and list options,
///   `FileStat::attributes`).
/// - v6: the monitor's `file_url` request (signed file URLs, served by the monitor's own
///   listener). A v5 monitor cannot decode it, so its sandboxes are refused everything but
///   describe and destroy, as any other version's.
///
/// Whatever the version, the frame layout and two requests are frozen so a sandbox made by
/// another build can still be described and destroyed: a hello frame carrying `info` or
/// `destroy` (`FROZEN_OPS`), answered by an `info`, `done` or `error` frame.
pub const PROTOCOL_VERSION: u32 = 6;

/// Monitor requests whose encoding never changes, served to a client of any version.
pub const FROZEN_OPS: [&str; 2] = ["info", "destroy"];

/// The protocol version a sandbox record without one was made with.
pub const FIRST_PROTOCOL_VERSION: u32 = 1;

/// Largest JSON header accepted.
pub const MAX_HEADER: usize = 4 << 20;
/// Largest body accepted in one frame.
pub const MAX_BODY: usize = 1 << 20;
/// Size of the chunks file and output bytes are cut into.
pub const CHUNK: usize = 256 * 1024;

/// How long the agent keeps a connection waiting for its next request (v5) before it
/// retires it. Clients drop idle connections sooner, so this rarely races a request.
pub const AGENT_IDLE: std::time::Duration = std::time::Duration::from_secs(30);

/// First frame of every client connection; small, so the monitor can read it and route.
#[derive(Debug, Serialize, Deserialize)]
pub struct Hello {
    /// [`PROTOCOL_VERSION`] of the client.
    pub version: u32,
    /// A request the monitor serves itself, or `None`: hand the connection to the agent,
    /// which reads the [`AgentRequest`] from the next frame.
    #[serde(default)]
    pub request: Option<MonitorRequest>,
    /// Serve the agent request even while the sandbox is paused (filesystem export for a
    /// snapshot, which pauses the sandbox on purpose).
    #[serde(default)]
    pub while_paused: bool,
    /// The per-sandbox token, for an agent that serves TCP (v4); it is never sent over the
    /// monitor's unix socket, and the monitor ignores it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

/// Largest hello header an agent serving TCP reads before the token is checked: a hello is
/// a version, a flag and a token, so anything near this is not a client of ours.
pub const MAX_HELLO: usize = 16 * 1024;

/// A request the monitor serves itself: the sandbox's lifecycle, lease, labels, annotations
/// and previews. Sent inside the [`Hello`].
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum MonitorRequest {
    /// Describe the sandbox.
    Info,
    /// Destroy it.
    Destroy,
    /// Move the lease end to `secs` from now.
    SetTimeout {
        /// Seconds from now.
        secs: f64,
    },
    /// Change what the lease's end does.
    SetOnTimeout {
        /// The new action.
        action: sandcove_core::TimeoutAction,
    },
    /// Replace the labels.
    SetLabels {
        /// The new labels.
        labels: std::collections::BTreeMap<String, String>,
    },
    /// Change the annotations; replies `Annotations`.
    UpdateAnnotations {
        /// The change.
        update: sandcove_core::AnnotationUpdate,
    },
    /// Stop the sandbox: processes killed, files kept, lease paused.
    Stop,
    /// Start a stopped sandbox.
    Start,
    /// Pause the sandbox.
    Pause,
    /// Resume the sandbox.
    Resume,
    /// Expose a port; replies `Preview`.
    Expose {
        /// What to expose.
        options: PreviewOptions,
    },
    /// List previews; replies `Previews`.
    ListPreviews,
    /// Close a preview.
    ClosePreview {
        /// Its port.
        port: u16,
    },
    /// Issue another token for a private preview; replies `Token`.
    CreateToken {
        /// The preview's port.
        port: u16,
        /// Expiry, ms since the epoch.
        expires_at: Option<u64>,
    },
    /// Revoke one token of a private preview; replies `Done`.
    RevokeToken {
        /// The preview's port.
        port: u16,
        /// The token's value.
        token: String,
    },
    /// Sign a file URL served by the monitor's file-URL listener (bound on first use);
    /// replies `FileUrl`.
    FileUrl {
        /// What the URL is for.
        options: sandcove_core::FileUrlOptions,
    },
    /// Hand a warm-pool sandbox to its claimer: its options (name, envs, labels, user,
    /// lease, annotations) and users replace the pool's, its lease and creation time start
    /// now, and it becomes visible to `list`. Refused unless the sandbox is an unclaimed pool
    /// member. Its agent takes the claim ([`AgentRequest::ApplyClaim`]) on the same
    /// connection right after (`handoff`), or took it before.
    Claim {
        /// The claimer's create options.
        options: Box<sandcove_core::CreateOptions>,
        /// The sandbox's users under those options.
        users: Vec<sandcove_core::UserInfo>,
        /// After the reply, hand the connection to the agent, whose first request (sent
        /// right after this hello) is the [`AgentRequest::ApplyClaim`] (v5): the whole claim
        /// in one round trip, and the connection stays the claimer's for its next call.
        #[serde(default)]
        handoff: bool,
    },
}

/// A request the monitor forwards to the agent (processes, files, watch, metrics, the
/// filesystem archive). Sent as the frame after a [`Hello`] without a request.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum AgentRequest {
    /// Start a process; replies `Started`, then output events, then `Exit`.
    Spawn {
        /// What to run.
        spec: ProcessSpec,
    },
    /// Attach to a process: `Started`, a possible `Gap`, retained output, `Live`, live events.
    Attach {
        /// Which process.
        process: ProcessSelector,
    },
    /// Write the `Data` frames that follow (up to `End`) to the process's stdin.
    WriteStdin {
        /// Which process.
        process: ProcessSelector,
    },
    /// Close the process's stdin.
    CloseStdin {
        /// Which process.
        process: ProcessSelector,
    },
    /// Signal the process group.
    Signal {
        /// Which process.
        process: ProcessSelector,
        /// Which signal.
        signal: Signal,
    },
    /// List processes.
    ListProcesses,
    /// Read a file: `Stat`, then `Data` frames, then `End`.
    ReadFile {
        /// Path.
        path: String,
        /// Options.
        #[serde(default)]
        options: sandcove_core::ReadOptions,
    },
    /// Write a file from the `Data` frames that follow, up to `End`; replies `Stat`.
    WriteFile {
        /// Path.
        path: String,
        /// Options.
        options: WriteOptions,
    },
    /// List a directory.
    ListDir {
        /// Path.
        path: String,
        /// Options.
        options: ListDirOptions,
    },
    /// Stat a path.
    Stat {
        /// Path.
        path: String,
        /// Options.
        #[serde(default)]
        options: sandcove_core::StatOptions,
    },
    /// Make a directory.
    Mkdir {
        /// Path.
        path: String,
        /// Options.
        options: MkdirOptions,
    },
    /// Remove a path.
    Remove {
        /// Path.
        path: String,
        /// Options.
        options: RemoveOptions,
    },
    /// Rename a path.
    Rename {
        /// Source.
        from: String,
        /// Destination.
        to: String,
        /// Options.
        #[serde(default)]
        options: sandcove_core::RenameOptions,
    },
    /// Copy a file or tree; replies `Stat`.
    Copy {
        /// Source.
        from: String,
        /// Destination.
        to: String,
        /// Options.
        #[serde(default)]
        options: sandcove_core::CopyOptions,
    },
    /// Change permission bits.
    Chmod {
        /// Path.
        path: String,
        /// Mode bits.
        mode: u32,
    },
    /// Resource usage; replies `Metrics`.
    Metrics,
    /// Resize a process's terminal.
    ResizePty {
        /// Which process.
        process: ProcessSelector,
        /// New size.
        size: PtySize,
    },
    /// Watch a directory: `Done` once watching, then `FsEvent` frames until the client
    /// closes the connection.
    Watch {
        /// Directory.
        path: String,
        /// Options.
        options: WatchOptions,
    },
    /// Stream a tar archive of the sandbox's writable filesystem: `Data` frames, then
    /// `End` (or `Error`).
    ExportFs,
    /// Unpack the tar archive in the `Data` frames that follow into the sandbox root.
    ImportFs,
    /// Check that the agent is reachable and accepts this connection; replies `Done`.
    Ping,
    /// Connect to `port` on the sandbox's loopback (IPv4, then IPv6); after a `Done` reply
    /// the connection carries raw bytes both ways between the client and that port (how a
    /// preview reaches a server inside a pod that listens on 127.0.0.1 only).
    Tunnel {
        /// Port inside the sandbox.
        port: u16,
    },
    /// Take a warm-pool sandbox for a claimer (once; only before anything ran in it): the
    /// claimer's envs and users replace the pool's, and `/etc/passwd` and `/etc/group` are
    /// rewritten for them. Replies `Done`.
    ApplyClaim {
        /// The claimer's create options.
        options: Box<sandcove_core::CreateOptions>,
        /// The sandbox's users under those options.
        users: Vec<sandcove_core::UserInfo>,
    },
}

/// A frame header from the monitor.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum MonitorReply {
    /// The request failed.
    Error {
        /// The error.
        error: ErrorBody,
    },
    /// Sandbox description.
    Info {
        /// It (boxed: far larger than the other replies).
        info: Box<SandboxInfo>,
    },
    /// Success with nothing to report.
    Done,
    /// The annotations now in force.
    Annotations {
        /// Them.
        annotations: std::collections::BTreeMap<String, String>,
    },
    /// A preview.
    Preview {
        /// It.
        preview: Preview,
    },
    /// Previews.
    Previews {
        /// Them.
        previews: Vec<Preview>,
    },
    /// A preview token.
    Token {
        /// It.
        token: PreviewToken,
    },
    /// A signed file URL.
    FileUrl {
        /// It.
        url: sandcove_core::FileUrl,
    },
}

/// A frame header from the agent (and `Data`/`End` from a client streaming a file to it). A
/// refusal by the monitor before the handoff is an `Error` frame, encoded the same way.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AgentReply {
    /// The request failed.
    Error {
        /// The error.
        error: ErrorBody,
    },
    /// Success with nothing to report.
    Done,
    /// One path's metadata.
    Stat {
        /// It.
        stat: FileStat,
    },
    /// Directory entries.
    Entries {
        /// Them.
        entries: Vec<FileStat>,
    },
    /// Process table.
    Processes {
        /// Them.
        processes: Vec<ProcessInfo>,
    },
    /// A process is running with this pid.
    Started {
        /// Pid inside the sandbox.
        pid: u32,
    },
    /// Body is stdout bytes.
    Stdout,
    /// Body is stderr bytes.
    Stderr,
    /// Retained history lost this much before the attach.
    Gap {
        /// Stdout bytes missing.
        stdout: u64,
        /// Stderr bytes missing.
        stderr: u64,
    },
    /// Attach only: the retained history ends here; what follows is live.
    Live,
    /// A process with a restart policy was started again.
    Restarted {
        /// Pid of the new incarnation.
        pid: u32,
        /// Restarts so far.
        restarts: u32,
        /// How the previous incarnation ended.
        previous: ExitStatus,
    },
    /// The process ended.
    Exit {
        /// How.
        status: ExitStatus,
    },
    /// Resource usage.
    Metrics {
        /// It.
        metrics: Metrics,
    },
    /// A filesystem change.
    FsEvent {
        /// It.
        event: FsEvent,
    },
    /// Body is file bytes.
    Data,
    /// End of a data stream.
    End,
    /// The connection is retired (v5): the request just sent on it, if any, was not served
    /// and may be sent again on a fresh connection.
    Retired,
}

impl MonitorReply {
    /// An error reply.
    pub fn error(err: &Error) -> MonitorReply {
        MonitorReply::Error {
            error: err.to_body(),
        }
    }
}

impl AgentReply {
    /// An error reply.
    pub fn error(err: &Error) -> AgentReply {
        AgentReply::Error {
            error: err.to_body(),
        }
    }
}

fn encode<H: Serialize>(header: &H, body: &[u8]) -> Result<Vec<u8>> {
    let head = serde_json::to_vec(header).map_err(|e| Error::backend(format!("encode: {e}")))?;
    if head.len() > MAX_HEADER || body.len() > MAX_BODY {
        return Err(Error::backend("frame too large"));
    }
    let mut out = Vec::with_capacity(8 + head.len() + body.len());
    out.extend_from_slice(&(head.len() as u32).to_le_bytes());
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&head);
    out.extend_from_slice(body);
    Ok(out)
}

/// A frame's prefix and header, for a body of `body_len` bytes the caller sends after it
/// (from a pipe or a file, without holding it in memory).
pub fn frame_head<H: Serialize>(header: &H, body_len: usize) -> Result<Vec<u8>> {
    if body_len > MAX_BODY {
        return Err(Error::backend("frame too large"));
    }
    let mut head = encode(header, &[])?;
    head[4..8].copy_from_slice(&(body_len as u32).to_le_bytes());
    Ok(head)
}

/// The header and body lengths of a frame's 8-byte prefix, checked against the protocol's
/// bounds (for a reader that takes the body itself, such as one that splices it).
pub fn parse_prefix(prefix: &[u8; 8]) -> Result<(usize, usize)> {
    check_lengths(prefix)
}

/// Decode a frame header read by [`parse_prefix`]'s caller.
pub fn parse_header<H: for<'de> Deserialize<'de>>(head: &[u8]) -> Result<H> {
    decode_header(head)
}

fn check_lengths(prefix: &[u8; 8]) -> Result<(usize, usize)> {
    let hlen = u32::from_le_bytes(prefix[..4].try_into().unwrap_or_default()) as usize;
    let blen = u32::from_le_bytes(prefix[4..].try_into().unwrap_or_default()) as usize;
    if hlen > MAX_HEADER || blen > MAX_BODY {
        return Err(Error::backend(format!(
            "protocol error: frame of {hlen}+{blen} bytes exceeds the limit (a peer of another Sandcove version?)"
        )));
    }
    Ok((hlen, blen))
}

fn decode_header<H: for<'de> Deserialize<'de>>(head: &[u8]) -> Result<H> {
    serde_json::from_slice(head).map_err(|e| {
        Error::backend(format!(
            "protocol error: undecodable frame ({e}); the peer may run another Sandcove version"
        ))
    })
}

fn io_err(e: std::io::Error) -> Error {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        Error::Backend {
            message: "connection to the sandbox closed unexpectedly".into(),
            retryable: false,
        }
    } else {
        Error::Backend {
            message: format!("sandbox connection: {e}"),
            retryable: false,
        }
    }
}

/// Write one frame.
pub async fn write_frame<W, H>(w: &mut W, header: &H, body: &[u8]) -> Result<()>
where
    W: AsyncWrite + Unpin,
    H: Serialize,
{
    // A large body is written from where it lies rather than copied behind its header: two
    // writes cost less than a copy of up to MAX_BODY bytes (file data).
    if body.len() > INLINE_BODY {
        let head = frame_head(header, body.len())?;
        w.write_all(&head).await.map_err(io_err)?;
        return w.write_all(body).await.map_err(io_err);
    }
    let bytes = encode(header, body)?;
    w.write_all(&bytes).await.map_err(io_err)
}

/// Largest body copied into one buffer with its header (one write).
const INLINE_BODY: usize = 64 * 1024;

/// Read a frame's 8-byte length prefix and check both lengths against the protocol's
/// bounds; `Ok(None)` on a clean end of stream before the prefix starts.
async fn read_prefix<R: AsyncRead + Unpin>(r: &mut R) -> Result<Option<(usize, usize)>> {
    let mut prefix = [0u8; 8];
    let mut got = 0;
    while got < 8 {
        let n = r.read(&mut prefix[got..]).await.map_err(io_err)?;
        if n == 0 {
            if got == 0 {
                return Ok(None);
            }
            return Err(io_err(std::io::ErrorKind::UnexpectedEof.into()));
        }
        got += n;
    }
    check_lengths(&prefix).map(Some)
}

/// Read one frame; `Ok(None)` on a clean end of stream before a frame starts.
pub async fn read_frame<R, H>(r: &mut R) -> Result<Option<(H, Vec<u8>)>>
where
    R: AsyncRead + Unpin,
    H: for<'de> Deserialize<'de>,
{
    let Some((hlen, blen)) = read_prefix(r).await? else {
        return Ok(None);
    };
    let mut head = vec![0u8; hlen];
    r.read_exact(&mut head).await.map_err(io_err)?;
    // Read into spare capacity: a body buffer is never zeroed first (up to MAX_BODY per
    // frame of file data).
    let mut body = Vec::with_capacity(blen);
    while body.len() < blen {
        let mut limited = (&mut *r).take((blen - body.len()) as u64);
        if limited.read_buf(&mut body).await.map_err(io_err)? == 0 {
            return Err(io_err(std::io::ErrorKind::UnexpectedEof.into()));
        }
    }
    Ok(Some((decode_header(&head)?, body)))
}

/// Read a connection's first frame on a socket open to anyone who can reach it: a header of
/// at most `max_header` bytes and no body, or an error (`Ok(None)` on a clean close). The
/// caller bounds the time it waits.
pub async fn read_hello_frame<R>(r: &mut R, max_header: usize) -> Result<Option<Vec<u8>>>
where
    R: AsyncRead + Unpin,
{
    let Some((hlen, blen)) = read_prefix(r).await? else {
        return Ok(None);
    };
    if hlen > max_header || blen != 0 {
        return Err(Error::invalid(format!(
            "protocol error: a hello of {hlen}+{blen} bytes (at most {max_header}+0)"
        )));
    }
    let mut head = vec![0u8; hlen];
    r.read_exact(&mut head).await.map_err(io_err)?;
    Ok(Some(head))
}

/// Blocking twin of [`write_frame`], for the monitor before its runtime starts.
pub fn write_frame_sync<W: Write, H: Serialize>(w: &mut W, header: &H, body: &[u8]) -> Result<()> {
    let bytes = encode(header, body)?;
    w.write_all(&bytes).map_err(io_err)
}

/// Parse a client's first frame, answering a version mismatch with a clear error and a request
/// meant for the agent with a typed refusal.
pub fn parse_hello(head: &[u8]) -> Result<Hello> {
    let mut value: serde_json::Value = decode_header(head)?;
    let version = value.get("version").and_then(|v| v.as_u64()).unwrap_or(0);
    if version != PROTOCOL_VERSION as u64 {
        let op = value
            .get("request")
            .and_then(|r| r.get("op"))
            .and_then(|op| op.as_str());
        if !op.is_some_and(|op| FROZEN_OPS.contains(&op)) {
            return Err(version_mismatch(version, PROTOCOL_VERSION as u64));
        }
    }
    let request = match value.get_mut("request").map(serde_json::Value::take) {
        None | Some(serde_json::Value::Null) => None,
        Some(request) => Some(routed::<MonitorRequest, AgentRequest>(
            request, "monitor", "agent",
        )?),
    };
    let while_paused = value
        .get("while_paused")
        .and_then(|v| v.as_bool())
        .unwrap_or(false);
    let token = value
        .get("token")
        .and_then(|v| v.as_str())
        .map(str::to_string);
    Ok(Hello {
        version: PROTOCOL_VERSION,
        request,
        while_paused,
        token,
    })
}

/// The typed refusal of a request between builds speaking different protocol versions.
pub fn version_mismatch(client: u64, sandbox: u64) -> Error {
    Error::Unavailable {
        reason: format!(
            "protocol version mismatch: the client speaks v{client}, the sandbox v{sandbox} \
             (it was created by another Sandcove version)"
        ),
        remedy: format!(
            "recreate the sandbox, or use a Sandcove version speaking protocol v{sandbox}; \
             listing, getting and destroying it work from any version"
        ),
    }
}

/// The error a monitor or agent answered with. A v1 monitor refuses another version with an
/// untyped backend error; it becomes the same typed refusal a newer monitor sends.
pub fn remote_error(body: &ErrorBody) -> Error {
    let err = Error::from_body(body);
    match &err {
        Error::Backend { message, .. } if message.starts_with("protocol version mismatch") => {
            version_mismatch(PROTOCOL_VERSION as u64, FIRST_PROTOCOL_VERSION as u64)
        }
        _ => err,
    }
}

/// Parse the request frame a handed-off connection starts with; a monitor request sent here is
/// refused with a typed error, never served.
pub fn parse_agent_request(header: serde_json::Value) -> Result<AgentRequest> {
    routed::<AgentRequest, MonitorRequest>(header, "agent", "monitor")
}

/// Decode a request for this side (`Mine`); one that decodes as the other side's (`Theirs`)
/// is refused as misrouted (`InvalidArgument`), anything else is a protocol error.
fn routed<Mine, Theirs>(value: serde_json::Value, mine: &str, theirs: &str) -> Result<Mine>
where
    Mine: for<'de> Deserialize<'de>,
    Theirs: for<'de> Deserialize<'de>,
{
    match serde_json::from_value::<Mine>(value.clone()) {
        Ok(request) => Ok(request),
        Err(e) => {
            if serde_json::from_value::<Theirs>(value.clone()).is_ok() {
                let op = value.get("op").and_then(|v| v.as_str()).unwrap_or("?");
                Err(Error::invalid(format!(
                    "request {op:?} is served by the sandbox {theirs}, not its {mine}; \
                     it was sent on the wrong route"
                )))
            } else {
                Err(Error::backend(format!(
                    "protocol error: bad {mine} request ({e})"
                )))
            }
        }
    }
}

/// Messages on the monitor ↔ agent control socket (one `SOCK_SEQPACKET` message each).
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "snake_case")]
pub enum Control {
    /// Agent → monitor: the sandbox is set up.
    Ready,
    /// Agent → monitor: setup failed.
    SetupFailed {
        /// Why.
        error: ErrorBody,
    },
    /// Monitor → agent: serve the client connection attached to this message; its next
    /// frame is the request.
    Handoff {
        /// Serve that one request only, then close (a connection handed over while the
        /// sandbox is paused or stopped, for a snapshot): it is never reused.
        #[serde(default)]
        once: bool,
    },
    /// Monitor → agent: connect to this TCP port on the sandbox's loopback and send back the
    /// connected socket (a preview connection).
    Connect {
        /// Correlates the [`Control::Reply`].
        req: u64,
        /// Port inside the sandbox.
        port: u16,
    },
    /// Monitor → agent: stop every sandbox process (pause).
    Freeze {
        /// Correlates the [`Control::Reply`].
        req: u64,
    },
    /// Monitor → agent: continue every sandbox process (resume).
    Thaw {
        /// Correlates the [`Control::Reply`].
        req: u64,
    },
    /// Monitor → agent: kill every sandbox process and wait until they are reaped (stop).
    Stop {
        /// Correlates the [`Control::Reply`].
        req: u64,
    },
    /// Agent → monitor: outcome of a request; a `Connect` success carries the socket.
    Reply {
        /// The request.
        req: u64,
        /// Why it failed, if it did.
        error: Option<ErrorBody>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_round_trip_binary_bodies() {
        let body: Vec<u8> = vec![0, 255, 10, 0, 0xc3, 0x28];
        let mut buf = Vec::new();
        write_frame(&mut buf, &AgentReply::Stdout, &body)
            .await
            .unwrap();
        let mut r = &buf[..];
        let (h, b): (AgentReply, Vec<u8>) = read_frame(&mut r).await.unwrap().unwrap();
        assert!(matches!(h, AgentReply::Stdout));
        assert_eq!(b, body);
        assert!(read_frame::<_, AgentReply>(&mut r).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_truncated_frame_is_an_error_not_a_short_read() {
        let mut buf = Vec::new();
        write_frame(&mut buf, &AgentReply::Data, &[1, 2, 3])
            .await
            .unwrap();
        buf.truncate(buf.len() - 1);
        let mut r = &buf[..];
        assert!(read_frame::<_, AgentReply>(&mut r).await.is_err());
    }

    fn hello(text: &str) -> Result<Hello> {
        parse_hello(text.replace("$V", &PROTOCOL_VERSION.to_string()).as_bytes())
    }

    #[test]
    fn a_version_mismatch_is_named_and_typed() {
        let err = parse_hello(br#"{"version":99,"request":{"op":"pause"}}"#).unwrap_err();
        assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
        assert!(err.to_string().contains("v99"), "{err}");
        let err = parse_hello(br#"{"version":99}"#).unwrap_err();
        assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
        // Info and destroy are served to any version, so nothing made by one build leaks.
        assert!(matches!(
            parse_hello(br#"{"version":1,"request":{"op":"info"}}"#),
            Ok(Hello {
                request: Some(MonitorRequest::Info),
                ..
            })
        ));
        assert!(matches!(
            parse_hello(br#"{"version":99,"request":{"op":"destroy"}}"#),
            Ok(Hello {
                request: Some(MonitorRequest::Destroy),
                ..
            })
        ));
        assert!(matches!(
            hello(r#"{"version":$V,"request":{"op":"info"}}"#),
            Ok(Hello {
                request: Some(MonitorRequest::Info),
                while_paused: false,
                ..
            })
        ));
    }

    #[test]
    fn each_side_refuses_the_others_requests_as_misrouted() {
        // An agent request in the monitor's hello.
        let err = hello(r#"{"version":$V,"request":{"op":"list_processes"}}"#).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
        assert!(
            err.to_string().contains("served by the sandbox agent"),
            "{err}"
        );
        // A monitor request handed to the agent.
        let err =
            parse_agent_request(serde_json::from_str(r#"{"op":"destroy"}"#).unwrap()).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
        assert!(
            err.to_string().contains("served by the sandbox monitor"),
            "{err}"
        );
        // Each side still serves its own, and garbage is a protocol error, not a misroute.
        assert!(matches!(
            parse_agent_request(serde_json::from_str(r#"{"op":"list_processes"}"#).unwrap()),
            Ok(AgentRequest::ListProcesses)
        ));
        let err = parse_agent_request(serde_json::from_str(r#"{"op":"no_such_op"}"#).unwrap())
            .unwrap_err();
        assert!(matches!(err, Error::Backend { .. }), "{err:?}");
    }

    #[test]
    fn a_v1_monitors_refusal_becomes_the_typed_one() {
        // Exactly what a v1 monitor answers a client of another version.
        let v1 = Error::backend(
            "protocol version mismatch: the client speaks v2, this sandbox v1; \
             use the same Sandcove version that created the sandbox",
        );
        match remote_error(&v1.to_body()) {
            Error::Unavailable { reason, remedy } => {
                assert!(reason.contains("v1"), "{reason}");
                assert!(remedy.contains("recreate the sandbox"), "{remedy}");
            }
            other => panic!("{other:?}"),
        }
        let other = Error::backend("the sandbox agent is not answering");
        assert!(matches!(
            remote_error(&other.to_body()),
            Error::Backend { .. }
        ));
    }

    #[test]
    fn a_hello_carries_its_token_only_when_it_has_one() {
        let h = hello(r#"{"version":$V,"token":"t"}"#).unwrap();
        assert_eq!(h.token.as_deref(), Some("t"));
        let h = hello(r#"{"version":$V}"#).unwrap();
        assert_eq!(h.token, None);
        let text = serde_json::to_string(&Hello {
            version: PROTOCOL_VERSION,
            request: None,
            while_paused: false,
            token: None,
        })
        .unwrap();
        assert!(!text.contains("token"), "{text}");
    }

    #[tokio::test]
    async fn a_hello_frame_is_bounded_by_its_length_prefix() {
        let mut ok = Vec::new();
        write_frame(&mut ok, &serde_json::json!({"version": 4}), &[])
            .await
            .unwrap();
        let mut r = &ok[..];
        assert!(read_hello_frame(&mut r, MAX_HELLO).await.unwrap().is_some());
        // Refused from the prefix alone: the announced bytes are never awaited.
        let mut prefix = Vec::new();
        prefix.extend_from_slice(&(MAX_HELLO as u32 + 1).to_le_bytes());
        prefix.extend_from_slice(&0u32.to_le_bytes());
        let mut r = &prefix[..];
        let err = read_hello_frame(&mut r, MAX_HELLO).await.unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
        // A hello has no body.
        let mut with_body = Vec::new();
        write_frame(&mut with_body, &serde_json::json!({"version": 4}), b"x")
            .await
            .unwrap();
        let mut r = &with_body[..];
        assert!(read_hello_frame(&mut r, MAX_HELLO).await.is_err());
    }

    #[test]
    fn oversized_lengths_are_refused() {
        let mut prefix = [0u8; 8];
        prefix[..4].copy_from_slice(&(MAX_HEADER as u32 + 1).to_le_bytes());
        assert!(check_lengths(&prefix).is_err());
    }
}
