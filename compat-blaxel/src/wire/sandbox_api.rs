//! Blaxel's sandbox API (the data plane) under `/blaxel-sbx/{name}` — the `metadata.url` of
//! every sandbox: processes (`/process…`), files (`/filesystem/…`, `/filesystem/tree/…`) and
//! filesystem watches (`/watch/filesystem/…`), each decided by the Rust facade's
//! `sandbox.process` / `sandbox.fs` functions of the sandbox named in the path.
//!
//! Errors are the sandbox API's `{"error": message}` with the facade's status. Streams
//! (`POST /process` asked with `Accept: text/event-stream`, `GET /process/{id}/logs/stream`,
//! the watch) end when the process or the watch ends, or when the client goes away.

use std::collections::BTreeMap;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use sandcove::server::auth::{Routes, SERVER_KEY};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{json_response, ApiError, Wire};
use crate::errors::SandboxAPIError;
use crate::models::{self, ProcessRequest, SandboxFilesystemFile};
use crate::sandbox::SandboxInstance;

/// Watch events buffered for a slow client before its watch is ended (the client then
/// sees the stream end, never a silent gap).
const WATCH_BUFFER: usize = 1024;

/// Bytes of live output queued for one slow client (a streamed exec or a followed log).
/// Past it the live stream says so and drops the rest: a sandboxed process can write far
/// faster than a client reads, and the server must not hold the difference.
const LIVE_QUEUE_BYTES: usize = 8 * 1024 * 1024;

/// The sending half of a live-output queue bounded by [`LIVE_QUEUE_BYTES`]; cloned into the
/// facade's stdout and stderr callbacks.
#[derive(Clone)]
struct LiveSender {
    tx: tokio::sync::mpsc::UnboundedSender<(bool, String)>,
    queued: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    overflowed: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// The receiving half: yields each line once, then [`Live::Overflowed`] once if lines were
/// dropped.
struct LiveReceiver {
    rx: tokio::sync::mpsc::UnboundedReceiver<(bool, String)>,
    queued: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    overflowed: std::sync::Arc<std::sync::atomic::AtomicBool>,
    reported: bool,
}

/// One item of a live-output queue.
enum Live {
    /// A line: `(is_stderr, text)`.
    Line((bool, String)),
    /// Output arrived faster than the client read it; the rest of the live stream is gone.
    Overflowed,
}

fn live_queue() -> (LiveSender, LiveReceiver) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let queued = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let overflowed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    (
        LiveSender {
            tx,
            queued: queued.clone(),
            overflowed: overflowed.clone(),
        },
        LiveReceiver {
            rx,
            queued,
            overflowed,
            reported: false,
        },
    )
}

impl LiveSender {
    /// Queue a line unless that would pass the bound; once a line is dropped every later one
    /// is too, so the client never sees a silent gap followed by more output.
    fn send(&self, stderr: bool, line: String) {
        use std::sync::atomic::Ordering;
        if self.overflowed.load(Ordering::Acquire) {
            return;
        }
        let len = line.len().max(1);
        if self.queued.fetch_add(len, Ordering::AcqRel) + len > LIVE_QUEUE_BYTES {
            self.queued.fetch_sub(len, Ordering::AcqRel);
            self.overflowed.store(true, Ordering::Release);
            return;
        }
        if self.tx.send((stderr, line)).is_err() {
            self.queued.fetch_sub(len, Ordering::AcqRel);
        }
    }
}

impl LiveReceiver {
    /// The next item; `None` when every sender is gone and everything was delivered.
    async fn recv(&mut self) -> Option<Live> {
        if self.rx.is_empty() {
            if let Some(notice) = self.drop_notice() {
                return Some(notice);
            }
        }
        let next = self.rx.recv().await;
        self.deliver(next)
    }

    /// A line already queued, without waiting.
    fn try_recv(&mut self) -> Option<Live> {
        let next = self.rx.try_recv().ok();
        self.deliver(next)
    }

    /// What the channel's `next` becomes: a line (its bytes no longer queued), else the drop
    /// notice if it is owed.
    fn deliver(&mut self, next: Option<(bool, String)>) -> Option<Live> {
        match next {
            Some(line) => {
                self.queued
                    .fetch_sub(line.1.len().max(1), std::sync::atomic::Ordering::AcqRel);
                Some(Live::Line(line))
            }
            None => self.drop_notice(),
        }
    }

    /// The drop notice, once, after lines were dropped.
    fn drop_notice(&mut self) -> Option<Live> {
        if self.reported || !self.overflowed.load(std::sync::atomic::Ordering::Acquire) {
            return None;
        }
        self.reported = true;
        Some(Live::Overflowed)
    }
}

/// What a live stream says where it dropped output.
const OVERFLOW_NOTE: &str = "[sandcove: live output dropped here: the process wrote faster \
                             than the client read (more than 8 MiB queued); the full output is \
                             in the process's logs]";

/// The data plane's routes (nested under `/blaxel-sbx/{name}`).
pub(crate) fn routes() -> Routes<Wire> {
    use super::uploads;
    let mut routes = Routes::new(super::refuse);
    // `sandbox.fetch(port, path, method)`: any method a server may serve.
    for method in [
        Method::GET,
        Method::POST,
        Method::PUT,
        Method::PATCH,
        Method::DELETE,
        Method::OPTIONS,
    ] {
        routes = routes
            .route(method.clone(), "/port/{port}", SERVER_KEY, fetch_port)
            .route(method.clone(), "/port/{port}/", SERVER_KEY, fetch_port)
            .route(method, "/port/{port}/{*path}", SERVER_KEY, fetch_port);
    }
    routes
        .route(Method::POST, "/process", SERVER_KEY, exec)
        .route(Method::GET, "/process", SERVER_KEY, list_processes)
        .route(Method::GET, "/process/{id}", SERVER_KEY, get_process)
        .route(Method::DELETE, "/process/{id}", SERVER_KEY, stop_process)
        .route(
            Method::DELETE,
            "/process/{id}/kill",
            SERVER_KEY,
            kill_process,
        )
        .route(Method::GET, "/process/{id}/logs", SERVER_KEY, process_logs)
        .route(Method::GET, "/process/{id}/wait", SERVER_KEY, wait_process)
        .route(
            Method::GET,
            "/process/{id}/logs/stream",
            SERVER_KEY,
            stream_logs,
        )
        .route(Method::POST, "/process/{id}/stdin", SERVER_KEY, write_stdin)
        .route(
            Method::DELETE,
            "/process/{id}/stdin",
            SERVER_KEY,
            close_stdin,
        )
        .route(Method::GET, "/filesystem", SERVER_KEY, fs_root)
        .route(Method::PUT, "/filesystem", SERVER_KEY, fs_put_root)
        .route(Method::GET, "/filesystem/", SERVER_KEY, fs_root)
        .route(Method::PUT, "/filesystem/", SERVER_KEY, fs_put_root)
        .route(Method::PUT, "/filesystem/tree", SERVER_KEY, tree_root)
        .route(Method::PUT, "/filesystem/tree/", SERVER_KEY, tree_root)
        .route(Method::PUT, "/filesystem/tree/{*path}", SERVER_KEY, tree)
        .route(Method::GET, "/filesystem/{*path}", SERVER_KEY, fs_get)
        .route(Method::PUT, "/filesystem/{*path}", SERVER_KEY, fs_put)
        .route(Method::DELETE, "/filesystem/{*path}", SERVER_KEY, fs_delete)
        .route(Method::GET, "/watch/filesystem", SERVER_KEY, watch_root)
        .route(Method::GET, "/watch/filesystem/{*path}", SERVER_KEY, watch)
        .route(Method::POST, "/filesystem-copy", SERVER_KEY, copy)
        .route(Method::GET, "/filesystem-find/{*path}", SERVER_KEY, find)
        .route(
            Method::GET,
            "/filesystem-content-search/{*path}",
            SERVER_KEY,
            grep,
        )
        .route(
            Method::GET,
            "/filesystem-search/{*path}",
            SERVER_KEY,
            fuzzy_gap,
        )
        .route(Method::GET, "/filesystem-search", SERVER_KEY, fuzzy_gap)
        .route(
            Method::POST,
            "/filesystem-multipart/initiate/{*path}",
            SERVER_KEY,
            uploads::initiate,
        )
        .route(
            Method::PUT,
            "/filesystem-multipart/{upload}/part",
            SERVER_KEY,
            uploads::part,
        )
        .route(
            Method::POST,
            "/filesystem-multipart/{upload}/complete",
            SERVER_KEY,
            uploads::complete,
        )
        .route(
            Method::DELETE,
            "/filesystem-multipart/{upload}/abort",
            SERVER_KEY,
            uploads::abort,
        )
}

/// A comma-separated query list (`a,b`), empty items dropped.
fn list_param(value: Option<&str>) -> Option<Vec<String>> {
    value.map(|v| {
        v.split(',')
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect()
    })
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FindQuery {
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    patterns: Option<String>,
    #[serde(default)]
    max_results: Option<i64>,
    #[serde(default)]
    exclude_dirs: Option<String>,
    #[serde(default)]
    exclude_hidden: Option<bool>,
}

/// `GET /filesystem-find/{path}?type=&patterns=&maxResults=&excludeDirs=&excludeHidden=`.
async fn find(
    State(wire): State<Wire>,
    Path((name, path)): Path<(String, String)>,
    Query(q): Query<FindQuery>,
) -> Result<Response, ApiError> {
    let instance = sandbox(&wire, &name).await?;
    let mut find = instance
        .fs
        .find(&user_path(&path))
        .r#type(q.kind)
        .max_results(q.max_results)
        .exclude_hidden(q.exclude_hidden);
    if let Some(p) = list_param(q.patterns.as_deref()) {
        find = find.patterns(p);
    }
    if let Some(d) = list_param(q.exclude_dirs.as_deref()) {
        find = find.exclude_dirs(d);
    }
    Ok(ok_json(&find.await.map_err(data)?))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct GrepQuery {
    query: String,
    #[serde(default)]
    case_sensitive: Option<bool>,
    #[serde(default)]
    context_lines: Option<i64>,
    #[serde(default)]
    max_results: Option<i64>,
    #[serde(default)]
    file_pattern: Option<String>,
    #[serde(default)]
    exclude_dirs: Option<String>,
}

/// `GET /filesystem-content-search/{path}?query=&caseSensitive=&contextLines=&…`.
async fn grep(
    State(wire): State<Wire>,
    Path((name, path)): Path<(String, String)>,
    Query(q): Query<GrepQuery>,
) -> Result<Response, ApiError> {
    let instance = sandbox(&wire, &name).await?;
    let mut grep = instance
        .fs
        .grep(&q.query)
        .path(user_path(&path))
        .case_sensitive(q.case_sensitive)
        .context_lines(q.context_lines)
        .max_results(q.max_results)
        .file_pattern(q.file_pattern);
    if let Some(d) = list_param(q.exclude_dirs.as_deref()) {
        grep = grep.exclude_dirs(d);
    }
    Ok(ok_json(&grep.await.map_err(data)?))
}

async fn fuzzy_gap() -> ApiError {
    data(crate::gaps::refuse("fuzzy file search"))
}

/// The sandbox path a caller named, resolved as Blaxel's sandbox API does (and as the Rust
/// facade does): absolute as it is, `~` and `~/…` in the home, anything else relative to the
/// working directory (the home, `/blaxel`). The SDKs put a path into the URL as given
/// (`/filesystem/rel.txt`, `/filesystem//abs`); the listener keeps that leading slash through
/// its slash collapsing (see `wire::collapse`). Empty is the root, as before.
pub(crate) fn user_path(path: &str) -> String {
    if path.is_empty() || path.starts_with('/') {
        return format!("/{}", path.trim_start_matches('/'));
    }
    let expanded = crate::translate::expand_working_dir(path, crate::translate::HOME);
    if expanded.starts_with('/') {
        expanded
    } else {
        format!("{}/{expanded}", crate::translate::HOME)
    }
}

/// The sandbox `name` as a facade instance; a missing one is the data plane's 404.
pub(crate) async fn sandbox(wire: &Wire, name: &str) -> Result<SandboxInstance, ApiError> {
    SandboxInstance::get_on(&wire.client, name)
        .await
        .map_err(ApiError::data)
}

pub(crate) fn data<E: Into<SandboxAPIError>>(e: E) -> ApiError {
    ApiError::data(e.into())
}

pub(crate) fn ok_json<T: serde::Serialize>(value: &T) -> Response {
    json_response(
        StatusCode::OK,
        &serde_json::to_value(value).unwrap_or_else(|_| json!({})),
    )
}

/// A JSON body of at most the JSON limit, as the data plane's 400 when malformed.
pub(crate) fn parse(wire: &Wire, body: &[u8]) -> Result<Value, ApiError> {
    parse_within(body, wire.config.max_body_bytes)
}

/// [`parse`] with a limit of its own.
fn parse_within(body: &[u8], limit: usize) -> Result<Value, ApiError> {
    super::parse_json_within::<Value>(body, limit).map_err(|e| {
        ApiError::data(SandboxAPIError::response(
            e.status_code().unwrap_or(400),
            message(&e),
        ))
    })
}

/// The largest JSON body of a file write (`{"content"}`): the SDKs send text below their
/// multipart threshold (5 MiB) this way, which JSON escaping may make several times larger,
/// so the bound is the one of a file in a JSON answer ([`super::WireConfig::max_inline_file_bytes`]),
/// never less than the JSON limit.
fn file_write_limit(wire: &Wire) -> usize {
    wire.config
        .max_body_bytes
        .max(wire.config.max_inline_file_bytes)
}

fn message(e: &SandboxAPIError) -> String {
    match e {
        SandboxAPIError::Response(r) => r.message().to_string(),
        other => other.to_string(),
    }
}

/// The facade's process request of a wire body (absent optional keys are sent as null).
fn process_request(mut body: Value) -> Result<ProcessRequest, ApiError> {
    if let Some(obj) = body.as_object_mut() {
        obj.retain(|_, v| !v.is_null());
    }
    models::from_value(body, "ProcessRequest")
        .map_err(|e| ApiError::data(SandboxAPIError::response(400, e.to_string())))
}

/// `POST /process`: start a process; with `waitForCompletion`, answer when it ends. Asked
/// with `Accept: text/event-stream`, the answer is NDJSON (`application/x-ndjson`): one
/// `{"type":"stdout"|"stderr","data":line}` per output line (without its newline) as it
/// comes, then
/// `{"type":"result","data":"<ProcessResponse JSON>"}`.
async fn exec(
    State(wire): State<Wire>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let body = parse(&wire, &body)?;
    let request = process_request(body)?;
    let instance = sandbox(&wire, &name).await?;
    let streaming = request.wait_for_completion == Some(true)
        && headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|a| a.contains("text/event-stream"));
    if !streaming {
        let process = instance.process.exec(request).await.map_err(data)?;
        return Ok(ok_json(&process));
    }
    // The facade delivers lines to callbacks; the queue carries them to the body, bounded
    // in bytes (a slow client loses live lines, never the final result).
    let (tx, mut rx) = live_queue();
    let tx_err = tx.clone();
    let run = instance
        .process
        .exec(request)
        .on_stdout(move |line| tx.send(false, line))
        .on_stderr(move |line| tx_err.send(true, line));
    let mut task = tokio::spawn(async move { run.await.map(|p| p.process.clone()) });
    // Errors before any output (a bad name, a missing directory) are plain error answers.
    let first = tokio::select! {
        line = rx.recv() => line,
        done = &mut task => {
            let result = done.map_err(|e| data(SandboxAPIError::exception(e.to_string())))?;
            let process = result.map_err(data)?;
            let mut lines = Vec::new();
            while let Some(item) = rx.try_recv() {
                lines.push(live_ndjson_line(&item));
            }
            lines.push(result_line(&process));
            return Ok(ndjson_response(Body::from(lines.concat())));
        }
    };
    let head = first.map(|l| live_ndjson_line(&l)).unwrap_or_default();
    let stream = async_stream(head, rx, task);
    Ok(ndjson_response(Body::from_stream(stream)))
}

/// The body of a streamed exec: `head`, every further line, then the result (or an
/// `{"type":"error"}` line when the process could not be waited for).
fn async_stream(
    head: String,
    rx: LiveReceiver,
    task: tokio::task::JoinHandle<crate::Result<models::ProcessResponse>>,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send {
    enum St {
        Lines(
            LiveReceiver,
            tokio::task::JoinHandle<crate::Result<models::ProcessResponse>>,
        ),
        Done,
    }
    let first = futures::stream::once(async move { Ok(Bytes::from(head)) });
    let rest = futures::stream::unfold(St::Lines(rx, task), |st| async move {
        match st {
            St::Lines(mut rx, task) => match rx.recv().await {
                Some(item) => Some((
                    Ok(Bytes::from(live_ndjson_line(&item))),
                    St::Lines(rx, task),
                )),
                None => {
                    let last = match task.await {
                        Ok(Ok(p)) => result_line(&p),
                        Ok(Err(e)) => {
                            format!("{}\n", json!({"type": "error", "data": message(&e)}))
                        }
                        Err(e) => format!("{}\n", json!({"type": "error", "data": e.to_string()})),
                    };
                    Some((Ok(Bytes::from(last)), St::Done))
                }
            },
            St::Done => None,
        }
    });
    first.chain(rest)
}

/// One NDJSON line for a live item; a drop is reported on stderr, where the SDK shows it.
fn live_ndjson_line(item: &Live) -> String {
    match item {
        Live::Line(line) => ndjson_line(line),
        Live::Overflowed => ndjson_line(&(true, OVERFLOW_NOTE.to_string())),
    }
}

fn ndjson_line((stderr, line): &(bool, String)) -> String {
    let kind = if *stderr { "stderr" } else { "stdout" };
    // One line without its newline, as the facade's callbacks take it.
    format!("{}\n", json!({"type": kind, "data": line}))
}

fn result_line(process: &models::ProcessResponse) -> String {
    let data = serde_json::to_string(process).unwrap_or_default();
    format!("{}\n", json!({"type": "result", "data": data}))
}

fn ndjson_response(body: Body) -> Response {
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/x-ndjson"),
        )],
        body,
    )
        .into_response()
}

/// `GET /process`.
async fn list_processes(
    State(wire): State<Wire>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let instance = sandbox(&wire, &name).await?;
    Ok(ok_json(&instance.process.list().await.map_err(data)?))
}

/// `GET /process/{id}` (name or pid).
async fn get_process(
    State(wire): State<Wire>,
    Path((name, id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let instance = sandbox(&wire, &name).await?;
    Ok(ok_json(&instance.process.get(&id).await.map_err(data)?))
}

/// `DELETE /process/{id}`: stop (SIGTERM).
async fn stop_process(
    State(wire): State<Wire>,
    Path((name, id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let instance = sandbox(&wire, &name).await?;
    Ok(ok_json(&instance.process.stop(&id).await.map_err(data)?))
}

/// `DELETE /process/{id}/kill` (SIGKILL).
async fn kill_process(
    State(wire): State<Wire>,
    Path((name, id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let instance = sandbox(&wire, &name).await?;
    Ok(ok_json(&instance.process.kill(&id).await.map_err(data)?))
}

/// Longest hold of one `GET /process/{id}/wait`.
const MAX_WAIT_SECONDS: u64 = 300;

#[derive(Debug, Deserialize)]
struct WaitQuery {
    #[serde(default)]
    timeout: Option<u64>,
}

/// `GET /process/{id}/wait?timeout=S` (the Python SDK's long poll): the process once it has
/// ended, or as it is after `timeout` seconds (at most 300; default 60).
async fn wait_process(
    State(wire): State<Wire>,
    Path((name, id)): Path<(String, String)>,
    Query(q): Query<WaitQuery>,
) -> Result<Response, ApiError> {
    let instance = sandbox(&wire, &name).await?;
    let seconds = q.timeout.unwrap_or(60).clamp(1, MAX_WAIT_SECONDS);
    let waited = instance
        .process
        .wait(&id)
        .max_wait((seconds * 1000) as i64)
        .interval(100)
        .await;
    match waited {
        Ok(p) => Ok(ok_json(&p)),
        // Still running at the end of the hold: its current state, as the SDK expects.
        Err(SandboxAPIError::Exception { .. }) => {
            Ok(ok_json(&instance.process.get(&id).await.map_err(data)?))
        }
        Err(e) => Err(data(e)),
    }
}

/// `GET /process/{id}/logs`: `{logs, stdout, stderr}`, whole.
async fn process_logs(
    State(wire): State<Wire>,
    Path((name, id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let instance = sandbox(&wire, &name).await?;
    let mut out = serde_json::Map::new();
    for kind in ["logs", "stdout", "stderr"] {
        let log_type = if kind == "logs" { "all" } else { kind };
        let text = instance
            .process
            .logs(&id)
            .log_type(log_type)
            .await
            .map_err(data)?;
        out.insert(kind.into(), json!(text));
    }
    Ok(json_response(StatusCode::OK, &Value::Object(out)))
}

/// Closes a facade stream when the HTTP body that carries it is dropped (the client left).
struct CloseOnDrop<F: FnMut()>(F);
impl<F: FnMut()> Drop for CloseOnDrop<F> {
    fn drop(&mut self) {
        (self.0)();
    }
}

/// `GET /process/{id}/logs/stream`: the output so far, then live, one `stdout:LINE` or
/// `stderr:LINE` per line, until the process ends.
async fn stream_logs(
    State(wire): State<Wire>,
    Path((name, id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let instance = sandbox(&wire, &name).await?;
    let (tx, rx) = live_queue();
    let tx_err = tx.clone();
    let handle = instance
        .process
        .stream_logs(&id)
        .on_stdout(move |l| tx.send(false, l))
        .on_stderr(move |l| tx_err.send(true, l))
        .await
        .map_err(data)?;
    let guard = CloseOnDrop(move || handle.close());
    // After a drop the stream says so and ends: the logs call has the rest.
    let stream = futures::stream::unfold(Some((rx, guard)), |state| async move {
        let (mut rx, guard) = state?;
        match rx.recv().await? {
            Live::Line((stderr, l)) => {
                let kind = if stderr { "stderr" } else { "stdout" };
                let text = Bytes::from(format!("{kind}:{l}\n"));
                Some((Ok::<_, std::io::Error>(text), Some((rx, guard))))
            }
            Live::Overflowed => {
                let text = Bytes::from(format!("stderr:{OVERFLOW_NOTE}\n"));
                Some((Ok(text), None))
            }
        }
    });
    Ok((
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        )],
        Body::from_stream(stream),
    )
        .into_response())
}

/// `/port/{port}/{path}` (any method): the request, its body streamed (at most the upload
/// limit), to the server on `port` in the sandbox, and its answer streamed back whatever its
/// status (see [`crate::network`]). The listener's credentials are not passed on.
async fn fetch_port(
    State(wire): State<Wire>,
    Path(params): Path<BTreeMap<String, String>>,
    request: Request,
) -> Result<Response, ApiError> {
    let name = params.get("name").cloned().unwrap_or_default();
    let port_text = params.get("port").cloned().unwrap_or_default();
    let port = port_text
        .parse::<i64>()
        .map_err(|_| {
            data(SandboxAPIError::response(
                400,
                format!("invalid port {port_text:?}"),
            ))
        })
        .and_then(|p| crate::network::port_of(p).map_err(data))?;
    // The path after `/port/{port}` as sent (still percent-encoded), then the query.
    let uri = request.uri();
    let marker = format!("/port/{port_text}");
    let rest = uri
        .path()
        .find(&marker)
        .map(|at| &uri.path()[at + marker.len()..])
        .unwrap_or("");
    let mut target = if rest.is_empty() {
        "/".to_string()
    } else {
        rest.to_string()
    };
    if let Some(query) = uri.query() {
        target.push('?');
        target.push_str(query);
    }
    let method = request.method().clone();
    let mut headers = request.headers().clone();
    if super::bearer(&headers) == Some(wire.config.api_key.as_str()) {
        headers.remove(header::AUTHORIZATION);
    }
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|n| n.trim().parse::<u64>().ok());
    let has_body =
        headers.contains_key(header::TRANSFER_ENCODING) || declared.is_some_and(|n| n > 0);
    let limit = wire.config.max_upload_bytes;
    if declared.is_some_and(|n| n > limit) {
        return Err(data(SandboxAPIError::response(
            413,
            format!("the request body is larger than {limit} bytes"),
        )));
    }
    let body = has_body.then(|| {
        let mut seen = 0u64;
        reqwest::Body::wrap_stream(request.into_body().into_data_stream().map(move |chunk| {
            let chunk = chunk.map_err(std::io::Error::other)?;
            seen += chunk.len() as u64;
            if seen > limit {
                return Err(std::io::Error::other(format!(
                    "the request body is larger than {limit} bytes"
                )));
            }
            Ok(chunk)
        }))
    });
    let instance = sandbox(&wire, &name).await?;
    let fetched = crate::network::send(&instance.ctx, port, method, &target, headers, body)
        .await
        .map_err(data)?;
    let mut answer = Response::builder().status(fetched.response.status());
    for (k, v) in crate::network::answer_headers(fetched.response.headers()) {
        answer = answer.header(k, v);
    }
    // The guard lives as long as the answer's body: the sandbox stays active, the token
    // valid, until it has been read (or the client went away).
    let guard = fetched.guard;
    let body = fetched.response.bytes_stream().map(move |chunk| {
        let _ = &guard;
        chunk.map_err(std::io::Error::other)
    });
    answer
        .body(Body::from_stream(body))
        .map_err(|e| data(SandboxAPIError::exception(format!("the answer: {e}"))))
}

/// `POST /process/{id}/stdin`: the raw body (at most the JSON limit) to the process's stdin.
async fn write_stdin(
    State(wire): State<Wire>,
    Path((name, id)): Path<(String, String)>,
    request: Request,
) -> Result<Response, ApiError> {
    let limit = wire.config.max_body_bytes;
    let body = axum::body::to_bytes(request.into_body(), limit)
        .await
        .map_err(|_| {
            data(SandboxAPIError::response(
                413,
                format!("stdin data is larger than {limit} bytes in one request: send it in parts"),
            ))
        })?;
    let instance = sandbox(&wire, &name).await?;
    let done = instance
        .process
        .write_stdin(&id, body.to_vec())
        .await
        .map_err(data)?;
    Ok(ok_json(&done))
}

/// `DELETE /process/{id}/stdin`: end-of-file on the process's stdin.
async fn close_stdin(
    State(wire): State<Wire>,
    Path((name, id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let instance = sandbox(&wire, &name).await?;
    let done = instance.process.close_stdin(&id).await.map_err(data)?;
    Ok(ok_json(&done))
}

async fn fs_root(
    State(wire): State<Wire>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    read_path(&wire, &name, "/", &headers).await
}

/// `GET /filesystem/{path}`: a directory's listing, or a file: its bytes when asked with
/// `Accept: application/octet-stream`, else `{path, name, size, …, content}` (text).
async fn fs_get(
    State(wire): State<Wire>,
    Path((name, path)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    read_path(&wire, &name, &user_path(&path), &headers).await
}

async fn read_path(
    wire: &Wire,
    name: &str,
    path: &str,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    let instance = sandbox(wire, name).await?;
    let stat = instance.ctx.core.stat(path).await.map_err(|e| {
        if e.is_not_found() {
            data(SandboxAPIError::response(
                404,
                format!("file not found: {path}"),
            ))
        } else {
            data(e)
        }
    })?;
    if stat.kind == sandcove::FileKind::Dir {
        return Ok(ok_json(&instance.fs.ls(path).await.map_err(data)?));
    }
    let raw = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("application/octet-stream"));
    let not_found = |e: sandcove::Error| {
        if e.is_not_found() {
            data(SandboxAPIError::response(
                404,
                format!("file not found: {path}"),
            ))
        } else {
            data(e)
        }
    };
    let mut stream = instance
        .ctx
        .core
        .read_stream(path)
        .await
        .map_err(not_found)?;
    if raw {
        // Streamed as read: nothing of the file is held here. A read error ends the body
        // abnormally, never as a short file.
        let body = Body::from_stream(
            stream.map(|chunk| chunk.map(Bytes::from).map_err(std::io::Error::other)),
        );
        return Ok((
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            )],
            body,
        )
            .into_response());
    }
    // The JSON form carries the whole file: held here, so bounded by its own limit.
    let limit = wire.config.max_inline_file_bytes;
    let mut bytes = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(not_found)?;
        if bytes.len() + chunk.len() > limit {
            return Err(data(SandboxAPIError::response(
                413,
                format!("{path} is larger than {limit} bytes: read it with readBinary (streamed)"),
            )));
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "path": path,
            "name": crate::translate::basename(path),
            "size": bytes.len(),
            "permissions": format!("{:o}", stat.mode & 0o7777),
            "owner": if stat.owner.is_empty() { stat.uid.to_string() } else { stat.owner.clone() },
            "group": if stat.group.is_empty() { stat.gid.to_string() } else { stat.group.clone() },
            "lastModified": crate::translate::format_rfc3339(stat.modified),
            "content": String::from_utf8_lossy(&bytes),
        }),
    ))
}

async fn fs_put_root(
    State(wire): State<Wire>,
    Path(name): Path<String>,
    request: Request,
) -> Result<Response, ApiError> {
    write_path(&wire, &name, "/".into(), request).await
}

/// `PUT /filesystem/{path}`: `{"content"}` writes text, `{"isDirectory": true,
/// "permissions"}` makes a directory, and a `multipart/form-data` body with a `file` part
/// writes bytes.
async fn fs_put(
    State(wire): State<Wire>,
    Path((name, path)): Path<(String, String)>,
    request: Request,
) -> Result<Response, ApiError> {
    write_path(&wire, &name, user_path(&path), request).await
}

async fn write_path(
    wire: &Wire,
    name: &str,
    path: String,
    request: Request,
) -> Result<Response, ApiError> {
    let multipart = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| c.starts_with("multipart/form-data"));
    if multipart {
        // The `file` field streams into the sandbox (the SDK also repeats the path, the
        // URL's, and sends 0644, the facade's mode: read past); the file is replaced only
        // once the whole form is in and carried no second file.
        let instance = sandbox(wire, name).await?;
        let limit = wire.config.max_upload_bytes;
        let file = super::uploads::sole_file(wire, request, limit).await?;
        let done = instance
            .fs
            .write_binary_stream(&path, file, Some(limit))
            .await
            .map_err(data)?;
        return Ok(ok_json(&done));
    }
    let limit = file_write_limit(wire);
    let body = axum::body::to_bytes(request.into_body(), limit)
        .await
        .map_err(|_| {
            data(SandboxAPIError::response(
                413,
                format!("the request body is larger than {limit} bytes"),
            ))
        })?;
    let body = parse_within(&body, limit)?;
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct Put {
        #[serde(default)]
        content: Option<String>,
        #[serde(default)]
        is_directory: Option<bool>,
        #[serde(default)]
        permissions: Option<String>,
    }
    let put: Put = serde_json::from_value(body)
        .map_err(|e| data(SandboxAPIError::response(400, format!("invalid body: {e}"))))?;
    let instance = sandbox(wire, name).await?;
    if put.is_directory == Some(true) {
        let mut mkdir = instance.fs.mkdir(&path);
        if let Some(p) = put.permissions {
            mkdir = mkdir.permissions(p);
        }
        return Ok(ok_json(&mkdir.await.map_err(data)?));
    }
    if put.permissions.as_deref().is_some_and(|p| p != "0644") {
        return Err(data(SandboxAPIError::response(
            400,
            "files are written with mode 0644; change it with process.exec (chmod)",
        )));
    }
    let content = put.content.unwrap_or_default();
    Ok(ok_json(
        &instance.fs.write(&path, &content).await.map_err(data)?,
    ))
}

#[derive(Debug, Deserialize)]
struct RmQuery {
    #[serde(default)]
    recursive: Option<bool>,
}

/// `DELETE /filesystem/{path}?recursive=`.
async fn fs_delete(
    State(wire): State<Wire>,
    Path((name, path)): Path<(String, String)>,
    Query(q): Query<RmQuery>,
) -> Result<Response, ApiError> {
    let instance = sandbox(&wire, &name).await?;
    let done = instance
        .fs
        .rm(&user_path(&path))
        .recursive(q.recursive.unwrap_or(false))
        .await
        .map_err(data)?;
    Ok(ok_json(&done))
}

async fn tree_root(
    State(wire): State<Wire>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    write_tree(&wire, &name, "/".into(), &body).await
}

/// `PUT /filesystem/tree/{path}`: `{"files": {relative path: text}}` under `path`.
async fn tree(
    State(wire): State<Wire>,
    Path((name, path)): Path<(String, String)>,
    body: Bytes,
) -> Result<Response, ApiError> {
    write_tree(&wire, &name, user_path(&path), &body).await
}

async fn write_tree(
    wire: &Wire,
    name: &str,
    path: String,
    body: &[u8],
) -> Result<Response, ApiError> {
    let body = parse(wire, body)?;
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Tree {
        files: BTreeMap<String, String>,
    }
    let tree: Tree = serde_json::from_value(body)
        .map_err(|e| data(SandboxAPIError::response(400, format!("invalid body: {e}"))))?;
    let files: Vec<SandboxFilesystemFile> = tree
        .files
        .into_iter()
        .map(|(path, content)| SandboxFilesystemFile { path, content })
        .collect();
    let instance = sandbox(wire, name).await?;
    let dir = instance
        .fs
        .write_tree(files)
        .destination_path(path)
        .await
        .map_err(data)?;
    Ok(ok_json(&dir))
}

/// `POST /filesystem-copy` (`{source, destination, noOverwrite}`, the Python SDK's
/// `cp(..., no_overwrite=True)`): one runtime copy, `cp -r` style (an existing destination
/// directory holds the copy under the source's name); with `noOverwrite` an existing final
/// target is `409` with code `FILE_ALREADY_EXISTS` (the SDK's `FileExistsError`) and is left
/// unchanged.
async fn copy(
    State(wire): State<Wire>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct Copy {
        source: String,
        destination: String,
        #[serde(default)]
        no_overwrite: bool,
    }
    let body = parse(&wire, &body)?;
    let request: Copy = serde_json::from_value(body)
        .map_err(|e| data(SandboxAPIError::response(400, format!("invalid body: {e}"))))?;
    let instance = sandbox(&wire, &name).await?;
    let source = user_path(&request.source);
    let destination = user_path(&request.destination);
    match crate::fs::copy_in_runtime(&instance.ctx, &source, &destination, !request.no_overwrite)
        .await
    {
        Ok(done) => Ok(ok_json(&done)),
        // The SDK tells a conflict by this code in the body.
        Err(e) if e.status_code() == Some(409) => Ok(json_response(
            StatusCode::CONFLICT,
            &json!({"code": "FILE_ALREADY_EXISTS", "error": message(&e)}),
        )),
        Err(e) => Err(data(e)),
    }
}

#[derive(Debug, Deserialize)]
struct WatchQuery {
    #[serde(default)]
    ignore: Option<String>,
}

async fn watch_root(
    State(wire): State<Wire>,
    Path(name): Path<String>,
    Query(q): Query<WatchQuery>,
) -> Result<Response, ApiError> {
    watch_path(&wire, &name, "/".into(), q).await
}

/// `GET /watch/filesystem/{path}[?ignore=a,b]`: one JSON `{op, path, name}` per line as the
/// directory changes (recursive when the path ends with `/**`).
async fn watch(
    State(wire): State<Wire>,
    Path((name, path)): Path<(String, String)>,
    Query(q): Query<WatchQuery>,
) -> Result<Response, ApiError> {
    watch_path(&wire, &name, user_path(&path), q).await
}

async fn watch_path(
    wire: &Wire,
    name: &str,
    path: String,
    q: WatchQuery,
) -> Result<Response, ApiError> {
    let instance = sandbox(wire, name).await?;
    let ignore: Vec<String> = q
        .ignore
        .map(|i| {
            i.split(',')
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    let (tx, rx) = tokio::sync::mpsc::channel::<String>(WATCH_BUFFER);
    let overflow = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = overflow.clone();
    let handle = instance
        .fs
        .watch(&path, move |event| {
            let line = format!(
                "{}\n",
                json!({"op": event.op, "path": event.path, "name": event.name})
            );
            // A client that does not keep up loses its watch, never single events.
            if tx.try_send(line).is_err() {
                flag.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        })
        .options(crate::fs::WatchOptions {
            with_content: false,
            ignore,
        })
        .await
        .map_err(data)?;
    let guard = CloseOnDrop(move || handle.close());
    let stream = futures::stream::unfold(
        (rx, guard, overflow),
        |(mut rx, guard, overflow)| async move {
            if overflow.load(std::sync::atomic::Ordering::SeqCst) {
                return None;
            }
            rx.recv().await.map(|l| {
                (
                    Ok::<_, std::io::Error>(Bytes::from(l)),
                    (rx, guard, overflow),
                )
            })
        },
    );
    Ok((
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/x-ndjson"),
        )],
        Body::from_stream(stream),
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client that never reads holds at most the bound; it then sees every queued line, one
    /// drop notice and the end — never a gap followed by more output.
    #[tokio::test]
    async fn live_output_for_a_slow_client_is_bounded_and_says_where_it_dropped() {
        let (tx, mut rx) = live_queue();
        let line = "x".repeat(64 * 1024);
        let sent = 2 * LIVE_QUEUE_BYTES / line.len();
        for _ in 0..sent {
            tx.send(false, line.clone());
        }
        let queued = rx.queued.load(std::sync::atomic::Ordering::Acquire);
        assert!(queued <= LIVE_QUEUE_BYTES, "{queued} bytes queued");
        // Room freed by reading does not resume a stream that already dropped lines.
        assert!(matches!(rx.recv().await, Some(Live::Line(_))));
        tx.send(false, "after the drop".into());
        drop(tx);
        let mut lines = 1;
        let mut notices = 0;
        while let Some(item) = rx.recv().await {
            match item {
                Live::Line((_, l)) => {
                    assert_eq!(notices, 0, "a line after the drop notice");
                    assert_ne!(l, "after the drop");
                    lines += 1;
                }
                Live::Overflowed => notices += 1,
            }
        }
        assert_eq!(notices, 1);
        assert_eq!(lines, LIVE_QUEUE_BYTES / line.len());
        assert!(lines < sent);
    }

    #[test]
    fn paths_resolve_as_blaxel_resolves_them() {
        assert_eq!(user_path("app/x.json"), "/blaxel/app/x.json");
        assert_eq!(user_path("/app/x.json"), "/app/x.json");
        assert_eq!(user_path("~"), "/blaxel");
        assert_eq!(user_path("~/x"), "/blaxel/x");
        assert_eq!(user_path(""), "/");
    }

    #[test]
    fn process_requests_take_stdin_and_refuse_unknown_keys() {
        let ok = process_request(json!({"command": "ls", "workingDir": "/tmp",
            "waitForCompletion": true, "stdin": false, "env": null}))
        .unwrap();
        assert_eq!(ok.working_dir.as_deref(), Some("/tmp"));
        let piped = process_request(json!({"command": "cat", "stdin": true})).unwrap();
        assert_eq!(piped.stdin, Some(true));
        let e = process_request(json!({"command": "cat", "stdin": "yes"})).unwrap_err();
        assert_eq!(e.error.status_code(), Some(400));
        let e = process_request(json!({"command": "ls", "cwd": "/"})).unwrap_err();
        assert_eq!(e.error.status_code(), Some(400));
    }
}
