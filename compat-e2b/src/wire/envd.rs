//! envd, the in-sandbox API of E2B's SDKs: `process.Process/*` and `filesystem.Filesystem/*`
//! over Connect (JSON codec), `/files` upload and download, `/health`.
//!
//! Every call has already been authenticated for its sandbox (`X-Access-Token`, see the
//! module above); each resolves the sandbox, then goes through the Rust facade's own
//! functions (`commands`, `files`) so paths, envs, users and errors mean the same thing
//! however the call arrives.
//!
//! Streams (`Start`, `Connect`) send `start`, then `data` (stdout, stderr or pty bytes, base64)
//! and one `end` event, then the end-of-stream envelope. A quiet stream gets a `keepalive`
//! event every `Keepalive-Ping-Interval` seconds. With `Connect-Timeout-Ms`, `Start` gives
//! the process that long: the engine kills it at the deadline and the stream ends with
//! `deadline_exceeded` (the SDK's `TimeoutException`); `Connect` ends its stream the same way
//! but leaves the process running.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use base64::Engine as _;
use futures::StreamExt;
use sandcove::file_url::{self, FileAccess, Served};
use sandcove::server::auth::{Principal, Routes};
use sandcove::FileGrant;
use sandcove_compat_support::multipart::{self, Staged, Upload, UploadError, UploadErrorKind};
use serde::Deserialize;
use serde_json::{json, Value};

use super::connect::{self, Code, ConnectError};
use super::{read_body, SandboxId, Wire};
use crate::commands::{process_spec, Commands};
use crate::errors::SandboxException;
use crate::files::{self, EntryInfo, FileType, Filesystem};
use crate::sandbox::{Ctx, Inner};
use crate::translate;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// Longest keep-alive interval honoured (a client asking for more gets this).
const MAX_KEEPALIVE: Duration = Duration::from_secs(600);
/// How long after a `Start` deadline the stream waits for the engine's exit report.
const DEADLINE_GRACE: Duration = Duration::from_secs(5);

/// envd's routes.
pub(crate) fn routes() -> Routes<Wire> {
    use axum::http::Method;
    // envd is one sandbox's data plane: its token (bound to the `E2b-Sandbox-Id` it came
    // with) or the server key; `/files` also takes a URL signed for one path and operation.
    const DATA: &[Principal] = &[Principal::ServerKey, Principal::SandboxToken];
    const FILES: &[Principal] = &[
        Principal::ServerKey,
        Principal::SandboxToken,
        Principal::SignedUrl,
    ];
    let post = |r: Routes<Wire>, path, handler| r.method_route(Method::POST, path, DATA, handler);
    let mut r = Routes::new(super::refuse);
    r = post(r, "/process.Process/Start", axum::routing::post(start));
    r = post(r, "/process.Process/Connect", axum::routing::post(attach));
    r = post(r, "/process.Process/List", axum::routing::post(list));
    r = post(
        r,
        "/process.Process/SendInput",
        axum::routing::post(send_input),
    );
    r = post(
        r,
        "/process.Process/SendSignal",
        axum::routing::post(send_signal),
    );
    r = post(
        r,
        "/process.Process/CloseStdin",
        axum::routing::post(close_stdin),
    );
    r = post(r, "/process.Process/Update", axum::routing::post(update));
    r = post(
        r,
        "/process.Process/StreamInput",
        axum::routing::post(stream_input),
    );
    r = post(
        r,
        "/process.Process/{method}",
        axum::routing::post(unimplemented),
    );
    r = post(r, "/filesystem.Filesystem/Stat", axum::routing::post(stat));
    r = post(
        r,
        "/filesystem.Filesystem/ListDir",
        axum::routing::post(list_dir),
    );
    r = post(
        r,
        "/filesystem.Filesystem/MakeDir",
        axum::routing::post(make_dir),
    );
    r = post(
        r,
        "/filesystem.Filesystem/Move",
        axum::routing::post(move_entry),
    );
    r = post(
        r,
        "/filesystem.Filesystem/Remove",
        axum::routing::post(remove),
    );
    r = post(
        r,
        "/filesystem.Filesystem/WatchDir",
        axum::routing::post(watch_dir),
    );
    r = post(
        r,
        "/filesystem.Filesystem/CreateWatcher",
        axum::routing::post(create_watcher),
    );
    r = post(
        r,
        "/filesystem.Filesystem/GetWatcherEvents",
        axum::routing::post(get_watcher_events),
    );
    r = post(
        r,
        "/filesystem.Filesystem/RemoveWatcher",
        axum::routing::post(remove_watcher),
    );
    r = post(
        r,
        "/filesystem.Filesystem/{method}",
        axum::routing::post(unimplemented),
    );
    r.route(Method::GET, "/files", FILES, download)
        .route(Method::POST, "/files", FILES, upload)
        .route(Method::GET, "/health", DATA, health)
}

async fn unimplemented(request: Request) -> Response {
    ConnectError::new(
        Code::Unimplemented,
        format!(
            "{} is not served over E2B's wire protocol by this Sandcove yet",
            request.uri().path().trim_start_matches('/')
        ),
    )
    .into_response()
}

/// The sandbox of an envd call, as the facade's context. A sandbox that is gone is
/// `unavailable` with "was not found", as E2B's proxy answers, so the SDK raises its
/// `SandboxNotRunningException`.
pub(crate) async fn context(wire: &Wire, id: &str) -> Result<Ctx, ConnectError> {
    let info = match wire.client.sandbox(id).info().await {
        Ok(info) => info,
        Err(e) if e.is_not_found() => {
            return Err(ConnectError::new(
                Code::Unavailable,
                format!("The sandbox {id} was not found"),
            ))
        }
        Err(e) => return Err(e.into()),
    };
    if info.state == sandcove::SandboxState::Paused {
        return Err(SandboxException::Timeout {
            message: format!("Sandbox {id} is paused: connect to it to resume it"),
            source: None,
        }
        .into());
    }
    Ok(Inner::from_info(&wire.client, &info))
}

/// The user named by `Authorization: Basic base64("user:")`, as envd reads it.
fn basic_user(headers: &HeaderMap) -> Result<Option<String>, ConnectError> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Ok(None);
    };
    let bad = || ConnectError::new(Code::InvalidArgument, "invalid Authorization header");
    let text = value.to_str().map_err(|_| bad())?;
    let Some(encoded) = text.strip_prefix("Basic ") else {
        return Err(bad());
    };
    let decoded = B64.decode(encoded.trim()).map_err(|_| bad())?;
    let decoded = String::from_utf8(decoded).map_err(|_| bad())?;
    let user = decoded.split(':').next().unwrap_or_default();
    Ok((!user.is_empty()).then(|| user.to_string()))
}

/// Read a unary request body and parse it.
async fn unary<T: serde::de::DeserializeOwned>(wire: &Wire, body: Body) -> Result<T, ConnectError> {
    let bytes = read_body(body, wire.config.max_body_bytes).await?;
    if bytes.is_empty() {
        return connect::parse(b"{}");
    }
    connect::parse(&bytes)
}

/// One unary Connect call: decode the request (bounded JSON), run `call` on it, encode its
/// answer; an error from either step is the Connect error answer.
async fn unary_call<T, F, Fut>(wire: &Wire, body: Body, call: F) -> Result<Response, ConnectError>
where
    T: serde::de::DeserializeOwned,
    F: FnOnce(T) -> Fut,
    Fut: std::future::Future<Output = Result<Value, ConnectError>>,
{
    let request = unary(wire, body).await?;
    Ok(connect::unary_ok(call(request).await?))
}

/// One server-stream call: `call` builds the stream; an error before its first message is
/// a stream holding only that error.
async fn stream_call<Fut>(call: Fut) -> Response
where
    Fut: std::future::Future<Output = Result<Response, ConnectError>>,
{
    call.await.unwrap_or_else(connect::stream_error)
}

/// `ProcessSelector`: `{"pid": n}` or `{"tag": "…"}`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Selector {
    pid: Option<u32>,
    tag: Option<String>,
}

impl Selector {
    fn core(self) -> Result<sandcove::ProcessSelector, ConnectError> {
        match (self.pid, self.tag) {
            (Some(pid), None) => Ok(sandcove::ProcessSelector::Pid(pid)),
            (None, Some(tag)) => Ok(sandcove::ProcessSelector::Tag(tag)),
            _ => Err(ConnectError::new(
                Code::InvalidArgument,
                "process selector needs exactly one of pid and tag",
            )),
        }
    }
}

#[derive(Debug, Deserialize)]
struct PtyBody {
    size: Option<SizeBody>,
}

#[derive(Debug, Deserialize)]
struct SizeBody {
    cols: u32,
    rows: u32,
}

impl PtyBody {
    fn core(&self) -> Result<sandcove::PtySize, ConnectError> {
        let Some(size) = &self.size else {
            return Err(ConnectError::new(
                Code::InvalidArgument,
                "pty.size is required",
            ));
        };
        let cols = u16::try_from(size.cols).ok().filter(|c| *c > 0);
        let rows = u16::try_from(size.rows).ok().filter(|r| *r > 0);
        match (cols, rows) {
            (Some(cols), Some(rows)) => Ok(sandcove::PtySize { cols, rows }),
            _ => Err(ConnectError::new(
                Code::InvalidArgument,
                format!("invalid pty size {}x{}", size.cols, size.rows),
            )),
        }
    }
}

#[derive(Debug, Deserialize)]
struct ProcessConfig {
    cmd: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    envs: BTreeMap<String, String>,
    cwd: Option<String>,
}

#[derive(Debug, Deserialize)]
struct StartRequest {
    process: ProcessConfig,
    pty: Option<PtyBody>,
    tag: Option<String>,
    stdin: Option<bool>,
}

/// The core command for envd's `cmd` + `args`: the facade's `bash -l -c` form when that is
/// what the SDK sent (as `commands.run` always does), else the argv as given.
fn command_of(config: &ProcessConfig) -> sandcove::Command {
    if config.cmd == "/bin/bash"
        && config.args.len() == 3
        && config.args[0] == "-l"
        && config.args[1] == "-c"
    {
        return sandcove::Command::bash_login(config.args[2].clone());
    }
    let mut argv = vec![config.cmd.clone()];
    argv.extend(config.args.iter().cloned());
    sandcove::Command::Argv(argv)
}

/// `Keepalive-Ping-Interval` (seconds), capped.
fn keepalive(headers: &HeaderMap) -> Option<Duration> {
    let secs: u64 = headers
        .get("keepalive-ping-interval")?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    (secs > 0).then(|| Duration::from_secs(secs).min(MAX_KEEPALIVE))
}

/// Read the one message of a server-stream request.
async fn stream_request<T: serde::de::DeserializeOwned>(
    wire: &Wire,
    body: Body,
) -> Result<T, ConnectError> {
    let bytes = read_body(body, wire.config.max_body_bytes).await?;
    connect::parse(connect::single_message(&bytes)?)
}

/// `{"event": …}` as a stream envelope.
fn event(event: Value) -> Bytes {
    connect::message(&json!({ "event": event }))
}

/// The `end` event for an exit status, as envd reports it.
fn end_event(status: &sandcove::ExitStatus) -> Value {
    let (code, error) = translate::exit_fields(status);
    let text = match (status.code, status.signal) {
        (Some(c), _) => format!("exit status {c}"),
        (None, Some(s)) => format!("signal: {}", translate::signal_name(s)),
        (None, None) => "unknown".to_string(),
    };
    let mut end = json!({"exitCode": code, "exited": status.code.is_some(), "status": text});
    if let Some(e) = error {
        end["error"] = json!(e);
    }
    json!({ "end": end })
}

/// How a process stream that breaks after its start ends, as envd's does when the sandbox
/// goes away mid-command: the runtime losing the process's events (the sandbox destroyed,
/// its agent gone) is `unavailable` with a message that does not say why, so the SDK asks
/// `/health`, learns the sandbox "was not found" and raises its `TimeoutException`
/// (`SandboxNotRunningException`); any other error maps as usual.
fn broken_stream(e: sandcove::Error) -> ConnectError {
    // The sandbox found missing mid-stream is the same break, seen from the runtime's side.
    if crate::errors::broke_the_connection(&e) || e.code() == sandcove::ErrorCode::NotFound {
        ConnectError::new(
            Code::Unavailable,
            format!("the connection to the sandbox ended before the stream completed ({e})"),
        )
    } else {
        ConnectError::from(e)
    }
}

/// Pump a process's events into a Connect stream body.
fn process_body(
    pid: u32,
    mut events: std::pin::Pin<
        Box<dyn futures::Stream<Item = sandcove::Result<sandcove::ProcessEvent>> + Send>,
    >,
    pty: bool,
    keepalive: Option<Duration>,
    deadline: Option<Duration>,
) -> Body {
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    tokio::spawn(async move {
        if tx
            .send(event(json!({"start": {"pid": pid}})))
            .await
            .is_err()
        {
            return;
        }
        let deadline = deadline.map(|d| tokio::time::Instant::now() + d);
        let far = tokio::time::Instant::now() + Duration::from_secs(100 * 365 * 86_400);
        let deadline_at = deadline.unwrap_or(far);
        let quiet = keepalive.unwrap_or(Duration::from_secs(100 * 365 * 86_400));
        let end = loop {
            let next = tokio::select! {
                next = events.next() => next,
                () = tokio::time::sleep(quiet) => {
                    if tx.send(event(json!({"keepalive": {}}))).await.is_err() {
                        return;
                    }
                    continue;
                }
                () = tokio::time::sleep_until(deadline_at) => {
                    break Some(ConnectError::new(
                        Code::DeadlineExceeded,
                        "the command's timeout passed",
                    ));
                }
            };
            let message = match next {
                Some(Ok(sandcove::ProcessEvent::Stdout(bytes))) => {
                    let key = if pty { "pty" } else { "stdout" };
                    event(json!({"data": { key: B64.encode(bytes) }}))
                }
                Some(Ok(sandcove::ProcessEvent::Stderr(bytes))) => {
                    event(json!({"data": {"stderr": B64.encode(bytes)}}))
                }
                Some(Ok(sandcove::ProcessEvent::Exit(status))) => {
                    if status.timed_out {
                        break Some(ConnectError::new(
                            Code::DeadlineExceeded,
                            "the command's timeout passed and it was killed",
                        ));
                    }
                    let _ = tx.send(event(end_event(&status))).await;
                    break None;
                }
                Some(Ok(_)) => continue,
                Some(Err(e)) => break Some(broken_stream(e)),
                None => {
                    break Some(ConnectError::new(
                        Code::Unavailable,
                        "the process's event stream ended before it exited",
                    ))
                }
            };
            if tx.send(message).await.is_err() {
                return;
            }
        };
        let _ = tx.send(connect::end_stream(end.as_ref())).await;
    });
    Body::from_stream(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
    }))
}

async fn start(
    State(wire): State<Wire>,
    Extension(SandboxId(id)): Extension<SandboxId>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    stream_call(start_inner(&wire, &id, &headers, body)).await
}

async fn start_inner(
    wire: &Wire,
    id: &str,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ConnectError> {
    let deadline = connect::timeout_ms(headers)?.map(Duration::from_millis);
    let user = basic_user(headers)?;
    let req: StartRequest = stream_request(wire, body).await?;
    let ctx = context(wire, id).await?;
    let mut spec = process_spec(
        &ctx,
        command_of(&req.process),
        &req.process.envs,
        user.as_deref(),
        req.process.cwd.as_deref(),
        // envd keeps stdin open unless told otherwise (older SDKs never said).
        req.stdin.unwrap_or(true),
        deadline,
    );
    spec.tag = req.tag.filter(|t| !t.is_empty());
    if let Some(pty) = &req.pty {
        spec.pty = Some(pty.core()?);
    }
    let pty = spec.pty.is_some();
    let stream = ctx
        .core
        .spawn(spec)
        .await
        .map_err(SandboxException::from)?
        .into_stream();
    // The engine kills at the deadline; the stream waits a little longer for its report.
    let body = process_body(
        stream.pid,
        stream.events,
        pty,
        keepalive(headers),
        deadline.map(|d| d + DEADLINE_GRACE),
    );
    Ok(connect::stream_response(body))
}

#[derive(Debug, Deserialize)]
struct ProcessRequest {
    process: Selector,
}

async fn attach(
    State(wire): State<Wire>,
    Extension(SandboxId(id)): Extension<SandboxId>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let inner = async {
        let deadline = connect::timeout_ms(&headers)?.map(Duration::from_millis);
        let req: ProcessRequest = stream_request(&wire, body).await?;
        let ctx = context(&wire, &id).await?;
        let selector = req.process.core()?;
        let listed = ctx.core.processes().await?;
        let pty_of = |pid: u32| {
            listed.iter().any(|p| {
                p.pid == pid
                    && p.argv.first().is_some_and(|a| a == "/bin/bash")
                    && p.argv.get(1).is_some_and(|a| a == "-i")
            })
        };
        let stream = ctx
            .core
            .attach(selector)
            .await
            .map_err(SandboxException::from)?
            .into_stream();
        let body = process_body(
            stream.pid,
            stream.events,
            pty_of(stream.pid),
            keepalive(&headers),
            deadline,
        );
        Ok::<_, ConnectError>(connect::stream_response(body))
    };
    stream_call(inner).await
}

async fn list(
    State(wire): State<Wire>,
    Extension(SandboxId(id)): Extension<SandboxId>,
    body: Body,
) -> Result<Response, ConnectError> {
    let (wire, id) = (&wire, &id);
    unary_call(wire, body, |_: Value| async move {
        let ctx = context(wire, id).await?;
        let processes = Commands { ctx }.list().await?;
        let processes: Vec<Value> = processes
            .into_iter()
            .map(|p| {
                let mut config = json!({"cmd": p.cmd, "args": p.args, "envs": p.envs});
                if let Some(cwd) = p.cwd {
                    config["cwd"] = json!(cwd);
                }
                let mut info = json!({"config": config, "pid": p.pid});
                if let Some(tag) = p.tag {
                    info["tag"] = json!(tag);
                }
                info
            })
            .collect();
        Ok(json!({ "processes": processes }))
    })
    .await
}

#[derive(Debug, Deserialize)]
struct InputBody {
    stdin: Option<String>,
    pty: Option<String>,
}

#[derive(Debug, Deserialize)]
struct SendInputRequest {
    process: Selector,
    input: InputBody,
}

fn decode_b64(text: &str) -> Result<Vec<u8>, ConnectError> {
    B64.decode(text)
        .map_err(|_| ConnectError::new(Code::InvalidArgument, "input is not valid base64"))
}

async fn send_input(
    State(wire): State<Wire>,
    Extension(SandboxId(id)): Extension<SandboxId>,
    body: Body,
) -> Result<Response, ConnectError> {
    let (wire, id) = (&wire, &id);
    unary_call(wire, body, |req: SendInputRequest| async move {
        let data = match (&req.input.stdin, &req.input.pty) {
            (Some(s), None) | (None, Some(s)) => decode_b64(s)?,
            _ => {
                return Err(ConnectError::new(
                    Code::InvalidArgument,
                    "input needs exactly one of stdin and pty",
                ))
            }
        };
        let ctx = context(wire, id).await?;
        ctx.core
            .write_stdin(req.process.core()?, data)
            .await
            .map_err(SandboxException::from)?;
        Ok(json!({}))
    })
    .await
}

/// One message of `StreamInput`: `{"start":{"process":…}}` first, then
/// `{"data":{"input":{"stdin"|"pty":…}}}` or `{"keepalive":{}}`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
enum StreamInputEvent {
    Start { process: Selector },
    Data { input: InputBody },
    Keepalive {},
}

/// `process.Process/StreamInput` (client stream; the SDKs' `commands.stream_input` and pty
/// writers): each `data` message is written to the process's stdin or pty as it arrives,
/// each message bounded like any request body. The answer is one empty message.
async fn stream_input(
    State(wire): State<Wire>,
    Extension(SandboxId(id)): Extension<SandboxId>,
    body: Body,
) -> Response {
    stream_call(async {
        stream_input_inner(&wire, &id, body).await?;
        let mut out = connect::message(&json!({})).to_vec();
        out.extend_from_slice(&connect::end_stream(None));
        Ok(connect::stream_response(Body::from(out)))
    })
    .await
}

async fn stream_input_inner(wire: &Wire, id: &str, body: Body) -> Result<(), ConnectError> {
    let mut reader = connect::EnvelopeReader::new(wire.config.max_body_bytes);
    let mut target: Option<(sandcove::ProcessSelector, crate::sandbox::Ctx)> = None;
    let mut chunks = body.into_data_stream();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|e| {
            ConnectError::new(
                Code::InvalidArgument,
                format!("reading the request body: {e}"),
            )
        })?;
        for message in reader.push(&chunk)? {
            let event: StreamInputEvent = connect::parse(&message)?;
            match (event, &target) {
                (StreamInputEvent::Start { process }, None) => {
                    let ctx = context(wire, id).await?;
                    target = Some((process.core()?, ctx));
                }
                (StreamInputEvent::Data { input }, Some((process, ctx))) => {
                    let data = match (&input.stdin, &input.pty) {
                        (Some(s), None) | (None, Some(s)) => decode_b64(s)?,
                        _ => {
                            return Err(ConnectError::new(
                                Code::InvalidArgument,
                                "input needs exactly one of stdin and pty",
                            ))
                        }
                    };
                    ctx.core
                        .write_stdin(process.clone(), data)
                        .await
                        .map_err(SandboxException::from)?;
                }
                (StreamInputEvent::Keepalive {}, _) => {}
                (StreamInputEvent::Start { .. }, Some(_)) => {
                    return Err(ConnectError::new(
                        Code::InvalidArgument,
                        "StreamInput got a second start event",
                    ))
                }
                (StreamInputEvent::Data { .. }, None) => {
                    return Err(ConnectError::new(
                        Code::InvalidArgument,
                        "StreamInput must start with a start event naming the process",
                    ))
                }
            }
        }
    }
    reader.finish()
}

#[derive(Debug, Deserialize)]
struct SignalRequest {
    process: Selector,
    signal: Value,
}

async fn send_signal(
    State(wire): State<Wire>,
    Extension(SandboxId(id)): Extension<SandboxId>,
    body: Body,
) -> Result<Response, ConnectError> {
    let (wire, id) = (&wire, &id);
    unary_call(wire, body, |req: SignalRequest| async move {
        let signal = match &req.signal {
            Value::String(s) if s == "SIGNAL_SIGKILL" => sandcove::Signal::Kill,
            Value::String(s) if s == "SIGNAL_SIGTERM" => sandcove::Signal::Term,
            Value::Number(n) if n.as_u64() == Some(9) => sandcove::Signal::Kill,
            Value::Number(n) if n.as_u64() == Some(15) => sandcove::Signal::Term,
            other => {
                return Err(ConnectError::new(
                    Code::InvalidArgument,
                    format!("unsupported signal {other}: SIGNAL_SIGKILL or SIGNAL_SIGTERM"),
                ))
            }
        };
        let ctx = context(wire, id).await?;
        ctx.core
            .signal(req.process.core()?, signal)
            .await
            .map_err(SandboxException::from)?;
        Ok(json!({}))
    })
    .await
}

async fn close_stdin(
    State(wire): State<Wire>,
    Extension(SandboxId(id)): Extension<SandboxId>,
    body: Body,
) -> Result<Response, ConnectError> {
    let (wire, id) = (&wire, &id);
    unary_call(wire, body, |req: ProcessRequest| async move {
        let ctx = context(wire, id).await?;
        ctx.core
            .close_stdin(req.process.core()?)
            .await
            .map_err(SandboxException::from)?;
        Ok(json!({}))
    })
    .await
}

#[derive(Debug, Deserialize)]
struct UpdateRequest {
    process: Selector,
    pty: Option<PtyBody>,
}

async fn update(
    State(wire): State<Wire>,
    Extension(SandboxId(id)): Extension<SandboxId>,
    body: Body,
) -> Result<Response, ConnectError> {
    let (wire, id) = (&wire, &id);
    unary_call(wire, body, |req: UpdateRequest| async move {
        let ctx = context(wire, id).await?;
        if let Some(pty) = &req.pty {
            let size = pty.core()?;
            ctx.core
                .resize_pty(req.process.core()?, size)
                .await
                .map_err(SandboxException::from)?;
        }
        Ok(json!({}))
    })
    .await
}

/// `EntryInfo` as envd's JSON.
fn entry_json(e: &EntryInfo) -> Value {
    // envd reports a link's target's type here and marks the link with `isSymlink`.
    let kind = match e.wire_type() {
        Some(FileType::File) => "FILE_TYPE_FILE",
        Some(FileType::Dir) => "FILE_TYPE_DIRECTORY",
        Some(FileType::Symlink) => "FILE_TYPE_SYMLINK",
        None => "FILE_TYPE_UNSPECIFIED",
    };
    let mut v = json!({
        "name": e.name,
        "type": kind,
        "path": e.path,
        "size": e.size.to_string(),
        "mode": e.mode,
        "permissions": e.permissions,
        "owner": e.owner,
        "group": e.group,
        "modifiedTime": super::control::rfc3339(e.modified_time.unix_millis),
    });
    if let Some(target) = &e.symlink_target {
        v["symlinkTarget"] = json!(target);
        v["isSymlink"] = json!(true);
    }
    if let Some(metadata) = &e.metadata {
        v["metadata"] = json!(metadata);
    }
    v
}

#[derive(Debug, Deserialize)]
struct PathRequest {
    path: String,
}

#[derive(Debug, Deserialize)]
struct ListDirRequest {
    path: String,
    depth: Option<i64>,
}

#[derive(Debug, Deserialize)]
struct MoveRequest {
    source: String,
    destination: String,
}

async fn fs(wire: &Wire, id: &str) -> Result<Filesystem, ConnectError> {
    Ok(Filesystem {
        ctx: context(wire, id).await?,
    })
}

async fn stat(
    State(wire): State<Wire>,
    Extension(SandboxId(id)): Extension<SandboxId>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ConnectError> {
    let (wire, id) = (&wire, &id);
    let user = basic_user(&headers)?;
    unary_call(wire, body, |req: PathRequest| async move {
        let entry = fs(wire, id).await?.get_info(req.path).user(user).await?;
        Ok(json!({ "entry": entry_json(&entry) }))
    })
    .await
}

async fn list_dir(
    State(wire): State<Wire>,
    Extension(SandboxId(id)): Extension<SandboxId>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ConnectError> {
    let (wire, id) = (&wire, &id);
    let user = basic_user(&headers)?;
    unary_call(wire, body, |req: ListDirRequest| async move {
        // envd treats a missing or zero depth as 1.
        let depth = req.depth.filter(|d| *d != 0).unwrap_or(1);
        let entries = fs(wire, id)
            .await?
            .list(req.path)
            .depth(depth)
            .user(user)
            .await?;
        let entries: Vec<Value> = entries.iter().map(entry_json).collect();
        Ok(json!({ "entries": entries }))
    })
    .await
}

async fn make_dir(
    State(wire): State<Wire>,
    Extension(SandboxId(id)): Extension<SandboxId>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ConnectError> {
    let (wire, id) = (&wire, &id);
    let user = basic_user(&headers)?;
    unary_call(wire, body, |req: PathRequest| async move {
        let fs = fs(wire, id).await?;
        if !fs.make_dir(req.path.clone()).user(user.clone()).await? {
            return Err(ConnectError::new(
                Code::AlreadyExists,
                format!("directory '{}' already exists", req.path),
            ));
        }
        let entry = fs.get_info(req.path).user(user).await?;
        Ok(json!({ "entry": entry_json(&entry) }))
    })
    .await
}

async fn move_entry(
    State(wire): State<Wire>,
    Extension(SandboxId(id)): Extension<SandboxId>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ConnectError> {
    let (wire, id) = (&wire, &id);
    let user = basic_user(&headers)?;
    unary_call(wire, body, |req: MoveRequest| async move {
        let entry = fs(wire, id)
            .await?
            .rename(req.source, req.destination)
            .user(user)
            .await?;
        Ok(json!({ "entry": entry_json(&entry) }))
    })
    .await
}

async fn remove(
    State(wire): State<Wire>,
    Extension(SandboxId(id)): Extension<SandboxId>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ConnectError> {
    let (wire, id) = (&wire, &id);
    let user = basic_user(&headers)?;
    unary_call(wire, body, |req: PathRequest| async move {
        fs(wire, id).await?.remove(req.path).user(user).await?;
        Ok(json!({}))
    })
    .await
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WatchRequest {
    path: String,
    #[serde(default)]
    recursive: bool,
    #[serde(default)]
    include_entry: bool,
    #[serde(default)]
    allow_network_mounts: bool,
}

/// A `FilesystemEvent` as envd's JSON.
fn fs_event_json(e: &files::FilesystemEvent) -> Value {
    let kind = format!("EVENT_TYPE_{}", e.r#type.value().to_ascii_uppercase());
    let mut v = json!({"name": e.name, "type": kind});
    if let Some(entry) = &e.entry {
        v["entry"] = entry_json(entry);
    }
    v
}

/// `WatchDir`: unlike process streams, its messages are the oneof itself (`{"start":{}}`,
/// `{"filesystem":…}`, `{"keepalive":{}}`), not wrapped in `event`.
async fn watch_dir(
    State(wire): State<Wire>,
    Extension(SandboxId(id)): Extension<SandboxId>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let inner = async {
        let deadline = connect::timeout_ms(&headers)?.map(Duration::from_millis);
        let user = basic_user(&headers)?;
        let req: WatchRequest = stream_request(&wire, body).await?;
        let _ = req.allow_network_mounts;
        let ctx = context(&wire, &id).await?;
        let mut stream = files::open_watch(&ctx, &req.path, req.recursive, user.as_deref()).await?;
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
        let quiet = keepalive(&headers).unwrap_or(Duration::from_secs(100 * 365 * 86_400));
        let include = req.include_entry;
        tokio::spawn(async move {
            if tx
                .send(connect::message(&json!({"start": {}})))
                .await
                .is_err()
            {
                return;
            }
            let far = tokio::time::Instant::now() + Duration::from_secs(100 * 365 * 86_400);
            let deadline_at = deadline
                .map(|d| tokio::time::Instant::now() + d)
                .unwrap_or(far);
            let end = loop {
                let next = tokio::select! {
                    next = stream.next() => next,
                    () = tokio::time::sleep(quiet) => {
                        if tx.send(connect::message(&json!({"keepalive": {}}))).await.is_err() {
                            return;
                        }
                        continue;
                    }
                    () = tokio::time::sleep_until(deadline_at) => {
                        break Some(ConnectError::new(Code::DeadlineExceeded, "the watch's timeout passed"));
                    }
                };
                match next {
                    Some(Ok(ev)) => {
                        let e = files::watch_event(&ctx, ev, include).await;
                        if tx
                            .send(connect::message(&json!({"filesystem": fs_event_json(&e)})))
                            .await
                            .is_err()
                        {
                            return;
                        }
                    }
                    Some(Err(e)) => break Some(ConnectError::from(e)),
                    None => break None,
                }
            };
            let _ = tx.send(connect::end_stream(end.as_ref())).await;
        });
        Ok::<_, ConnectError>(connect::stream_response(Body::from_stream(
            futures::stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
            }),
        )))
    };
    stream_call(inner).await
}

async fn create_watcher(
    State(wire): State<Wire>,
    Extension(SandboxId(id)): Extension<SandboxId>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ConnectError> {
    let (wire, id) = (&wire, &id);
    let user = basic_user(&headers)?;
    unary_call(wire, body, |req: WatchRequest| async move {
        let ctx = context(wire, id).await?;
        let stream = files::open_watch(&ctx, &req.path, req.recursive, user.as_deref()).await?;
        let watcher_id = wire
            .watchers
            .add(id.clone(), ctx, stream, req.include_entry)
            .map_err(|why| ConnectError::new(Code::ResourceExhausted, why))?;
        Ok(json!({ "watcherId": watcher_id }))
    })
    .await
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WatcherRequest {
    watcher_id: String,
}

async fn get_watcher_events(
    State(wire): State<Wire>,
    Extension(SandboxId(id)): Extension<SandboxId>,
    body: Body,
) -> Result<Response, ConnectError> {
    let (wire, id) = (&wire, &id);
    unary_call(wire, body, |req: WatcherRequest| async move {
        let events = wire.watchers.take(id, &req.watcher_id)?;
        let events: Vec<Value> = events.iter().map(fs_event_json).collect();
        Ok(json!({ "events": events }))
    })
    .await
}

async fn remove_watcher(
    State(wire): State<Wire>,
    Extension(SandboxId(id)): Extension<SandboxId>,
    body: Body,
) -> Result<Response, ConnectError> {
    let (wire, id) = (&wire, &id);
    unary_call(wire, body, |req: WatcherRequest| async move {
        wire.watchers.remove(id, &req.watcher_id)?;
        Ok(json!({}))
    })
    .await
}

/// An error of the REST routes (`/files`, `/health`): `{"code": <status>, "message"}`.
fn rest_error(e: ConnectError) -> Response {
    let status = match e.code {
        // envd answers a full disk with 507, which the SDK raises as NotEnoughSpace.
        Code::ResourceExhausted if e.message.contains("space") => StatusCode::INSUFFICIENT_STORAGE,
        // envd's REST routes answer an unreachable sandbox with 502, as its proxy does.
        Code::Unavailable => StatusCode::BAD_GATEWAY,
        code => code.http_status(),
    };
    super::control::api_error(status, e.message)
}

#[derive(Debug, Deserialize)]
struct FilesQuery {
    path: Option<String>,
    username: Option<String>,
}

async fn download(
    State(wire): State<Wire>,
    Extension(SandboxId(id)): Extension<SandboxId>,
    grant: Option<Extension<FileGrant>>,
    Query(q): Query<FilesQuery>,
    request: Request,
) -> Response {
    if let Some(Extension(grant)) = grant {
        return match signed_transfer(&wire, &id, &grant, request, 0).await {
            Ok((_, Served::Read(stream))) => download_response(stream),
            Ok((_, Served::Written(_))) => rest_error(ConnectError::new(
                Code::Internal,
                "a signed download wrote instead of reading",
            )),
            Err(e) => rest_error(e),
        };
    }
    let inner = async {
        let ctx = context(&wire, &id).await?;
        let path = q.path.unwrap_or_default();
        let stream = files::open_read(&ctx, &path, q.username.as_deref()).await?;
        Ok::<_, ConnectError>(stream)
    };
    match inner.await {
        Ok(stream) => download_response(stream),
        Err(e) => rest_error(e),
    }
}

/// A download's answer: the file's bytes, streamed.
fn download_response(stream: sandcove::ByteStream) -> Response {
    let body = Body::from_stream(stream.map(|chunk| {
        chunk
            .map(Bytes::from)
            .map_err(|e| std::io::Error::other(e.to_string()))
    }));
    let mut response = Response::new(body);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    response
}

/// A request a signed URL does not cover: E2B's 403, before any effect.
fn signed_refusal(why: impl Into<String>) -> ConnectError {
    ConnectError::new(Code::PermissionDenied, why)
}

/// [`FileAccess`] for a grant built from an E2B signature: its path and user resolved as
/// envd resolves them (a relative path against the user's home, the default user when none
/// is named), and the `X-Metadata-*` attributes of the upload given to the file written.
struct EnvdFiles {
    ctx: Ctx,
    metadata: sandcove::FileAttributes,
}

#[async_trait::async_trait]
impl FileAccess for EnvdFiles {
    async fn read(&self, grant: &FileGrant) -> sandcove::Result<sandcove::ByteStream> {
        let (path, options) = files::read_target(&self.ctx, &grant.path, grant.user.as_deref());
        self.ctx.core.read_stream_with(&path, options).await
    }

    async fn write(
        &self,
        grant: &FileGrant,
        data: sandcove::ByteStream,
        max_bytes: u64,
    ) -> sandcove::Result<sandcove::FileStat> {
        let mut options = files::write_options(&self.ctx, grant.user.as_deref(), &self.metadata);
        options.max_bytes = Some(max_bytes);
        let path = self.ctx.path_as(&grant.path, options.user.as_deref());
        self.ctx.core.write_stream(&path, data, options).await
    }
}

/// A `/files` request let in by an E2B signature: envd's own checks on the request (its
/// content encoding, content type and metadata, as for any upload), then the core's signed
/// file transfer under `grant`, which checks the request against the grant (operation, path,
/// one `file` part whose filename names no other path) before any effect. Uploads take at
/// most `max_upload` bytes.
async fn signed_transfer(
    wire: &Wire,
    id: &str,
    grant: &FileGrant,
    request: Request,
    max_upload: u64,
) -> Result<(Ctx, Served), ConnectError> {
    let mut metadata = sandcove::FileAttributes::new();
    let mut request = request;
    if grant.operation == sandcove::FileUrlOperation::Write {
        if grant.path.is_empty() {
            return Err(signed_refusal("this signed URL names no path to write"));
        }
        let headers = request.headers();
        let gzipped = gzipped(headers)?;
        metadata = upload_metadata(headers)?;
        upload_content_type(headers)?;
        if gzipped {
            // The encoding is the transport's: the transfer sees the decoded body.
            let (mut parts, body) = request.into_parts();
            parts.headers.remove(header::CONTENT_ENCODING);
            let decoded = super::gzip::gunzip_stream(
                body.into_data_stream(),
                max_upload.saturating_add(MULTIPART_HEAD_SLACK),
                axum::Error::new,
            );
            request = Request::from_parts(parts, Body::from_stream(decoded));
        }
    }
    let ctx = context(wire, id).await?;
    let access = EnvdFiles {
        ctx: ctx.clone(),
        metadata,
    };
    // A multipart upload holds a working set of the server's upload memory for as long as
    // it runs, as the unsigned ones do: the bound on what uploads in progress hold is one.
    let multipart = grant.operation == sandcove::FileUrlOperation::Write
        && request
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| {
                t.trim_start()
                    .to_ascii_lowercase()
                    .starts_with("multipart/")
            });
    let _reservation = if multipart {
        Some(
            wire.config
                .upload_memory
                .reserve_working_set()
                .await
                .map_err(upload_error)?,
        )
    } else {
        None
    };
    let served = file_url::transfer(request, grant, &access, max_upload).await?;
    Ok((ctx, served))
}

/// What a gzip-decoded upload may grow past its file bound: the multipart framing around it.
const MULTIPART_HEAD_SLACK: u64 = 64 * 1024;

/// Whether an upload is gzip-encoded (`Content-Encoding`), as envd accepts it.
fn gzipped(headers: &HeaderMap) -> Result<bool, ConnectError> {
    match headers.get(header::CONTENT_ENCODING).map(|v| v.as_bytes()) {
        None | Some(b"identity") => Ok(false),
        Some(b"gzip") | Some(b"x-gzip") => Ok(true),
        Some(other) => Err(ConnectError::new(
            Code::InvalidArgument,
            format!(
                "unknown Content-Encoding '{}': send gzip or identity",
                String::from_utf8_lossy(other)
            ),
        )),
    }
}

/// The metadata an upload's `X-Metadata-<key>` headers give every file it writes: every value
/// of every such header, in order (the first of a key wins, as in envd), checked before
/// anything is written (see [`files::metadata_attributes`]).
fn upload_metadata(headers: &HeaderMap) -> Result<sandcove::FileAttributes, ConnectError> {
    let metadata: Vec<(String, String)> = headers
        .iter()
        .filter_map(|(name, value)| {
            let key = name.as_str().strip_prefix("x-metadata-")?;
            Some((
                key.to_string(),
                String::from_utf8_lossy(value.as_bytes()).into_owned(),
            ))
        })
        .collect();
    Ok(files::metadata_attributes(&metadata)?)
}

/// An upload's content type, `application/octet-stream` or `multipart/form-data` with a
/// boundary; anything else is refused.
fn upload_content_type(headers: &HeaderMap) -> Result<String, ConnectError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    if content_type.starts_with("application/octet-stream")
        || multipart::boundary(&content_type).is_some()
    {
        return Ok(content_type);
    }
    Err(ConnectError::new(
        Code::InvalidArgument,
        "uploads must be multipart/form-data or application/octet-stream",
    ))
}

async fn upload(
    State(wire): State<Wire>,
    Extension(SandboxId(id)): Extension<SandboxId>,
    grant: Option<Extension<FileGrant>>,
    Query(q): Query<FilesQuery>,
    request: Request,
) -> Response {
    let written = match grant {
        Some(Extension(grant)) => {
            let content_type = request
                .headers()
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            // envd's bounds: a multipart body is bounded as a whole, raw bytes as a file.
            let max_upload = if content_type.starts_with("application/octet-stream") {
                wire.config.max_upload_bytes
            } else {
                wire.config.max_multipart_bytes as u64
            };
            match signed_transfer(&wire, &id, &grant, request, max_upload).await {
                Ok((ctx, Served::Written(stat))) => Ok(vec![files::write_info(&ctx, &stat)]),
                Ok((_, Served::Read(_))) => Err(ConnectError::new(
                    Code::Internal,
                    "a signed upload read instead of writing",
                )),
                Err(e) => Err(e),
            }
        }
        None => {
            let (parts, body) = request.into_parts();
            upload_inner(&wire, &id, q, &parts.headers, body).await
        }
    };
    match written {
        Ok(written) => {
            let list: Vec<Value> = written
                .iter()
                .map(|w| {
                    let mut entry = json!({
                        "name": w.name,
                        "type": w.r#type.as_ref().map(|t| t.value()).unwrap_or("file"),
                        "path": w.path,
                    });
                    if let Some(metadata) = &w.metadata {
                        entry["metadata"] = json!(metadata);
                    }
                    entry
                })
                .collect();
            axum::Json(Value::Array(list)).into_response()
        }
        Err(e) => rest_error(e),
    }
}

/// The core error an upload's failure stands for (the write it ends keeps nothing).
fn upload_error(e: UploadError) -> sandcove::Error {
    match e.kind {
        UploadErrorKind::Busy => sandcove::Error::RateLimited {
            message: e.message,
            retry_after_ms: Some(1000),
        },
        UploadErrorKind::Forbidden => sandcove::Error::Forbidden { what: e.message },
        _ => sandcove::Error::invalid(e.message),
    }
}

/// A part's data as the backend's write takes it.
fn write_data(data: multipart::PartData) -> sandcove::ByteStream {
    Box::pin(data.map(|chunk| chunk.map(|b| b.to_vec()).map_err(upload_error)))
}

/// `POST /files` with its credential in headers: an `application/octet-stream` body is the
/// file at `path`; a `multipart/form-data` body carries `file` parts, streamed one by one into
/// the sandbox (never held whole: see `sandcove_compat_support::multipart`). With `path` the
/// body carries exactly one file, written there: a second `file` part fails the upload before
/// the first lands (envd would write the first and refuse the second). Without, each part is
/// written to its filename. `X-Metadata-<key>` headers are the metadata every file written
/// gets (see [`upload_metadata`]). A signed URL's upload goes through [`signed_transfer`].
async fn upload_inner(
    wire: &Wire,
    id: &str,
    q: FilesQuery,
    headers: &HeaderMap,
    body: Body,
) -> Result<Vec<files::WriteInfo>, ConnectError> {
    let gzipped = gzipped(headers)?;
    let metadata = upload_metadata(headers)?;
    let path = q.path.filter(|p| !p.is_empty());
    let user = q.username.as_deref();
    let content_type = upload_content_type(headers)?;
    let ctx = context(wire, id).await?;
    if content_type.starts_with("application/octet-stream") {
        let Some(path) = path else {
            return Err(ConnectError::new(Code::InvalidArgument, "path is required"));
        };
        let limit = wire.config.max_upload_bytes;
        let mut seen = 0u64;
        let raw = body.into_data_stream().map(move |chunk| {
            let chunk = chunk.map_err(|e| sandcove::Error::invalid(format!("upload: {e}")))?;
            seen += chunk.len() as u64;
            if seen > limit {
                return Err(sandcove::Error::invalid(format!(
                    "the upload is larger than {limit} bytes"
                )));
            }
            Ok(chunk)
        });
        let stream: sandcove::ByteStream = if gzipped {
            Box::pin(
                super::gzip::gunzip_stream(raw, limit, sandcove::Error::invalid)
                    .map(|chunk| chunk.map(|b| b.to_vec())),
            )
        } else {
            Box::pin(raw.map(|chunk| chunk.map(|b| b.to_vec())))
        };
        let written = files::write_stream(&ctx, &path, stream, user, &metadata).await?;
        return Ok(vec![written]);
    }
    let limit = wire.config.max_multipart_bytes as u64;
    let raw = multipart::body_stream(body.into_data_stream());
    let input: multipart::PartData = if gzipped {
        Box::pin(super::gzip::gunzip_stream(raw, limit, |why| {
            UploadError::new(UploadErrorKind::Malformed, why)
        }))
    } else {
        Box::pin(raw)
    };
    let mut upload = Upload::start(input, &content_type, limit, &wire.config.upload_memory)
        .await
        .map_err(upload_error)?;
    let Some(path) = path else {
        // No path: each `file` part goes to its filename, staged as it streams and moved
        // into place once the whole body is in.
        let mut staged = Staged::new(ctx.core.clone());
        let read = async {
            while let Some(part) = upload.next_part().await.map_err(upload_error)? {
                if part.name != "file" {
                    upload.skip(part).await.map_err(upload_error)?;
                    continue;
                }
                let Some(path) = part.filename.clone().filter(|f| !f.is_empty()) else {
                    return Err(ConnectError::new(
                        Code::InvalidArgument,
                        "each uploaded part needs a filename (its path)",
                    ));
                };
                let data = write_data(Upload::data(part));
                let options = files::write_options(&ctx, user, &metadata);
                let path = ctx.path_as(&path, options.user.as_deref());
                staged.write(&path, data, options).await?;
            }
            Ok(())
        };
        if let Err(e) = read.await {
            staged.abort().await;
            return Err(e);
        }
        let written = staged.commit().await?;
        if written.is_empty() {
            return Err(ConnectError::new(
                Code::InvalidArgument,
                "no file in the upload",
            ));
        }
        return Ok(written.iter().map(|s| files::write_info(&ctx, s)).collect());
    };
    // One file, to `path`: the first `file` part, standing only if no other follows.
    let first = loop {
        match upload.next_part().await.map_err(upload_error)? {
            None => {
                return Err(ConnectError::new(
                    Code::InvalidArgument,
                    "no file in the upload",
                ))
            }
            Some(part) if part.name == "file" => break part,
            Some(part) => upload.skip(part).await.map_err(upload_error)?,
        }
    };
    let data = upload.sole_file(
        first,
        |part| part.name == "file",
        |_| {
            UploadError::new(
                UploadErrorKind::Malformed,
                "with a path, an upload carries exactly one file (a second `file` part was \
                 sent): upload several files without `path`, each part's filename its path",
            )
        },
    );
    let written = files::write_stream(&ctx, &path, write_data(data), user, &metadata).await?;
    Ok(vec![written])
}

async fn health(
    State(wire): State<Wire>,
    Extension(SandboxId(id)): Extension<SandboxId>,
) -> Response {
    match context(&wire, &id).await {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => super::control::api_error(StatusCode::BAD_GATEWAY, e.message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_keeps_the_facade_shell_form() {
        let c = ProcessConfig {
            cmd: "/bin/bash".into(),
            args: vec!["-l".into(), "-c".into(), "echo hi".into()],
            envs: BTreeMap::new(),
            cwd: None,
        };
        assert_eq!(command_of(&c), sandcove::Command::bash_login("echo hi"));
        let c = ProcessConfig {
            cmd: "ls".into(),
            args: vec!["-la".into()],
            envs: BTreeMap::new(),
            cwd: None,
        };
        assert_eq!(command_of(&c), sandcove::Command::argv(["ls", "-la"]));
    }

    #[test]
    fn exit_statuses_become_end_events() {
        let ok = sandcove::ExitStatus {
            code: Some(0),
            signal: None,
            timed_out: false,
        };
        assert_eq!(
            end_event(&ok),
            json!({"end": {"exitCode": 0, "exited": true, "status": "exit status 0"}})
        );
        let three = sandcove::ExitStatus {
            code: Some(3),
            ..ok
        };
        assert_eq!(end_event(&three)["end"]["error"], json!("exit status 3"));
        let killed = sandcove::ExitStatus {
            code: None,
            signal: Some(9),
            timed_out: false,
        };
        assert_eq!(
            end_event(&killed),
            json!({"end": {"exitCode": -1, "exited": false, "status": "signal: killed", "error": "signal: killed"}})
        );
    }

    #[test]
    fn basic_auth_names_the_user() {
        let mut h = HeaderMap::new();
        assert_eq!(basic_user(&h).unwrap(), None);
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Basic cm9vdDo="),
        );
        assert_eq!(basic_user(&h).unwrap().as_deref(), Some("root"));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer x"));
        assert!(basic_user(&h).is_err());
    }
}
