//! `sandbox.process` (Python `SandboxProcess`): exec, get, list, logs, wait, stop, kill,
//! stream_logs.
//!
//! A Blaxel process is a core process whose tag is its name (the core keeps tags unique among
//! running processes, as Blaxel keeps names). The command runs under `sh -c`; its end time
//! and exit come from the core (`ProcessInfo.ended_at`, `exit`), and `restart_on_failure` is
//! the core's restart policy, so the pid stays the first incarnation's and the restart count
//! is `ProcessInfo.restarts`. Each restart shows in the output as Blaxel's restart line.
//! "Logs so far" are the history an attach returns before its live marker. What the core does
//! not keep (the command as submitted, the requested working dir, `stopped`/`killed`) is a
//! JSON record per pid inside the sandbox, so any client program finds the process by name
//! with the same status.

use std::ops::Deref;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::Value;
use tokio::task::JoinHandle;

use crate::errors::{Result, SandboxAPIError};
use crate::models::{
    self, ProcessRequest, ProcessResponse, ProcessResponseStatus, SuccessResponse,
};
use crate::sandbox::{into_future, Ctx};
use crate::state::{self, ProcessRecord, INTERNAL_TAG_PREFIX, PROC_KEY_PREFIX};
use crate::translate::{self, HOME};

/// A log callback: receives one line, without its newline.
pub type LogCallback = Box<dyn FnMut(String) + Send + 'static>;

/// Output kept inline by `get` and `list`, per stream (as on Blaxel).
const INLINE_LIMIT: usize = 64 * 1024;

/// Anything `exec` accepts: a [`ProcessRequest`] or a `json!` dict of one.
pub trait IntoProcessRequest {
    /// The request, or a `ValueError` for unknown keys and bad types.
    fn into_request(self) -> Result<ProcessRequest>;
}
impl IntoProcessRequest for ProcessRequest {
    fn into_request(self) -> Result<ProcessRequest> {
        Ok(self)
    }
}
impl IntoProcessRequest for Value {
    fn into_request(self) -> Result<ProcessRequest> {
        models::from_value(self, "ProcessRequest")
    }
}

/// The `on_log` / `on_stdout` / `on_stderr` callbacks of an exec or a log stream.
#[derive(Default)]
pub(crate) struct Callbacks {
    on_log: Option<LogCallback>,
    on_stdout: Option<LogCallback>,
    on_stderr: Option<LogCallback>,
}

impl std::fmt::Debug for Callbacks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Callbacks")
            .field("on_log", &self.on_log.is_some())
            .field("on_stdout", &self.on_stdout.is_some())
            .field("on_stderr", &self.on_stderr.is_some())
            .finish()
    }
}

impl Callbacks {
    fn any(&self) -> bool {
        self.on_log.is_some() || self.on_stdout.is_some() || self.on_stderr.is_some()
    }

    fn line(&mut self, stderr: bool, line: String) {
        let own = if stderr {
            &mut self.on_stderr
        } else {
            &mut self.on_stdout
        };
        if let Some(f) = own {
            f(line.clone());
        }
        if let Some(f) = &mut self.on_log {
            f(line);
        }
    }
}

/// Splits output chunks into lines for the callbacks.
#[derive(Debug, Default)]
struct Lines {
    buf: Vec<u8>,
}

impl Lines {
    fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        while let Some(i) = self.buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.buf.drain(..=i).collect();
            out.push(String::from_utf8_lossy(&line[..i]).into_owned());
        }
        out
    }

    fn finish(&mut self) -> Option<String> {
        if self.buf.is_empty() {
            return None;
        }
        let rest = std::mem::take(&mut self.buf);
        Some(String::from_utf8_lossy(&rest).into_owned())
    }
}

/// Feed a process stream to callbacks (skipping empty lines, as Blaxel does) while collecting
/// its output; returns stdout, stderr and the exit status.
async fn pump(
    mut stream: sandcove::ProcessStream,
    mut callbacks: Callbacks,
    max_restarts: Option<u32>,
) -> (Vec<u8>, Vec<u8>, Option<sandcove::ExitStatus>) {
    let (mut out, mut err, mut exit) = (Vec::new(), Vec::new(), None);
    let (mut lo, mut le) = (Lines::default(), Lines::default());
    while let Some(event) = stream.events.next().await {
        match event {
            Ok(sandcove::ProcessEvent::Stdout(b)) => {
                out.extend_from_slice(&b);
                for l in lo.push(&b) {
                    if !l.is_empty() {
                        callbacks.line(false, l);
                    }
                }
            }
            Ok(sandcove::ProcessEvent::Stderr(b)) => {
                err.extend_from_slice(&b);
                for l in le.push(&b) {
                    if !l.is_empty() {
                        callbacks.line(true, l);
                    }
                }
            }
            Ok(sandcove::ProcessEvent::Restarted {
                restarts, previous, ..
            }) => {
                let line = translate::restart_line(&previous, restarts, max_restarts);
                out.extend_from_slice(line.as_bytes());
                for l in lo.push(line.as_bytes()) {
                    callbacks.line(false, l);
                }
            }
            Ok(sandcove::ProcessEvent::Exit(s)) => {
                exit = Some(s);
                break;
            }
            Ok(_) => {}
            Err(_) => break,
        }
    }
    if let Some(l) = lo.finish() {
        callbacks.line(false, l);
    }
    if let Some(l) = le.finish() {
        callbacks.line(true, l);
    }
    (out, err, exit)
}

/// `sandbox.process`.
#[derive(Debug, Clone)]
pub struct SandboxProcess {
    ctx: Ctx,
}

/// Builder of `process.exec(process)` without callbacks; yields a [`ProcessResponse`].
/// Setting `on_log`, `on_stdout` or `on_stderr` turns it into an [`ExecWithLogBuilder`].
#[derive(Debug)]
pub struct ExecBuilder {
    ctx: Ctx,
    request: Result<ProcessRequest>,
}

impl ExecBuilder {
    fn with_log(self) -> ExecWithLogBuilder {
        ExecWithLogBuilder {
            ctx: self.ctx,
            request: self.request,
            callbacks: Callbacks::default(),
        }
    }

    /// `on_log=`: every output line (stdout and stderr).
    pub fn on_log(self, f: impl FnMut(String) + Send + 'static) -> ExecWithLogBuilder {
        self.with_log().on_log(f)
    }

    /// `on_stdout=`: every stdout line.
    pub fn on_stdout(self, f: impl FnMut(String) + Send + 'static) -> ExecWithLogBuilder {
        self.with_log().on_stdout(f)
    }

    /// `on_stderr=`: every stderr line.
    pub fn on_stderr(self, f: impl FnMut(String) + Send + 'static) -> ExecWithLogBuilder {
        self.with_log().on_stderr(f)
    }

    async fn run(self) -> Result<ProcessResponse> {
        let (response, _) = exec(&self.ctx, self.request?, Callbacks::default()).await?;
        Ok(response)
    }
}
into_future!(ExecBuilder => ProcessResponse);

/// Builder of `process.exec(process)` with callbacks; yields a [`ProcessResponseWithLog`].
#[derive(Debug)]
pub struct ExecWithLogBuilder {
    ctx: Ctx,
    request: Result<ProcessRequest>,
    callbacks: Callbacks,
}

impl ExecWithLogBuilder {
    /// `on_log=`: every output line (stdout and stderr).
    pub fn on_log(mut self, f: impl FnMut(String) + Send + 'static) -> Self {
        self.callbacks.on_log = Some(Box::new(f));
        self
    }

    /// `on_stdout=`: every stdout line.
    pub fn on_stdout(mut self, f: impl FnMut(String) + Send + 'static) -> Self {
        self.callbacks.on_stdout = Some(Box::new(f));
        self
    }

    /// `on_stderr=`: every stderr line.
    pub fn on_stderr(mut self, f: impl FnMut(String) + Send + 'static) -> Self {
        self.callbacks.on_stderr = Some(Box::new(f));
        self
    }

    async fn run(self) -> Result<ProcessResponseWithLog> {
        let (process, task) = exec(&self.ctx, self.request?, self.callbacks).await?;
        Ok(ProcessResponseWithLog { process, task })
    }
}
into_future!(ExecWithLogBuilder => ProcessResponseWithLog);

/// `ProcessResponseWithLog`: a [`ProcessResponse`] (it derefs to one) whose callbacks keep
/// receiving output in the background until the process ends or `close()` is called.
#[derive(Debug, Clone)]
pub struct ProcessResponseWithLog {
    /// The response.
    pub process: ProcessResponse,
    task: Option<tokio::task::AbortHandle>,
}

impl ProcessResponseWithLog {
    /// `close()`: stop delivering output (the process keeps running).
    pub fn close(&self) {
        if let Some(t) = &self.task {
            t.abort();
        }
    }
}

impl Deref for ProcessResponseWithLog {
    type Target = ProcessResponse;
    fn deref(&self) -> &ProcessResponse {
        &self.process
    }
}

/// Builder of `process.logs(identifier, log_type="all")`.
#[derive(Debug)]
pub struct LogsBuilder {
    ctx: Ctx,
    identifier: String,
    log_type: String,
}

impl LogsBuilder {
    /// `log_type=`: `stdout`, `stderr` or `all` (default; stdout followed by stderr).
    pub fn log_type(mut self, t: impl Into<String>) -> Self {
        self.log_type = t.into();
        self
    }

    async fn run(self) -> Result<String> {
        let p = get(&self.ctx, &self.identifier, false, usize::MAX).await?;
        match self.log_type.as_str() {
            "stdout" => Ok(p.stdout),
            "stderr" => Ok(p.stderr),
            "all" => Ok(p.logs),
            other => Err(SandboxAPIError::value_error(format!(
                "log_type must be stdout, stderr or all, got {other:?}"
            ))),
        }
    }
}
into_future!(LogsBuilder => String);

/// Builder of `process.wait(identifier, max_wait=60000, interval=1000)` (both ms).
#[derive(Debug)]
pub struct WaitBuilder {
    ctx: Ctx,
    identifier: String,
    max_wait: i64,
    interval: i64,
}

impl WaitBuilder {
    /// `max_wait=` in ms (default 60000).
    pub fn max_wait(mut self, ms: i64) -> Self {
        self.max_wait = ms;
        self
    }

    /// `interval=` in ms between polls (default 1000).
    pub fn interval(mut self, ms: i64) -> Self {
        self.interval = ms;
        self
    }

    async fn run(self) -> Result<ProcessResponse> {
        let start = Instant::now();
        let max = Duration::from_millis(self.max_wait.max(0) as u64);
        let interval = Duration::from_millis(self.interval.max(1) as u64);
        let mut last = get(&self.ctx, &self.identifier, false, INLINE_LIMIT).await?;
        while last.status == ProcessResponseStatus::Running {
            if start.elapsed() > max {
                return Err(SandboxAPIError::exception("Process did not finish in time"));
            }
            tokio::time::sleep(interval).await;
            match get(&self.ctx, &self.identifier, false, INLINE_LIMIT).await {
                Ok(p) => last = p,
                Err(_) => break,
            }
        }
        Ok(last)
    }
}
into_future!(WaitBuilder => ProcessResponse);

/// Builder of `process.stream_logs(process_name, options=None)`: the options' callbacks are
/// setters. Yields an [`AsyncStreamHandle`].
#[derive(Debug)]
pub struct StreamLogsBuilder {
    ctx: Ctx,
    name: String,
    callbacks: Callbacks,
}

impl StreamLogsBuilder {
    /// `options["on_log"]`: every line.
    pub fn on_log(mut self, f: impl FnMut(String) + Send + 'static) -> Self {
        self.callbacks.on_log = Some(Box::new(f));
        self
    }

    /// `options["on_stdout"]`: every stdout line.
    pub fn on_stdout(mut self, f: impl FnMut(String) + Send + 'static) -> Self {
        self.callbacks.on_stdout = Some(Box::new(f));
        self
    }

    /// `options["on_stderr"]`: every stderr line.
    pub fn on_stderr(mut self, f: impl FnMut(String) + Send + 'static) -> Self {
        self.callbacks.on_stderr = Some(Box::new(f));
        self
    }

    async fn run(self) -> Result<AsyncStreamHandle> {
        let info = find(&self.ctx, &self.name).await?;
        let stream = self
            .ctx
            .core
            .attach(sandcove::ProcessSelector::Pid(info.pid))
            .await?
            .into_stream();
        let callbacks = self.callbacks;
        let max = info.restart.and_then(|r| r.max_restarts);
        let task = tokio::spawn(async move {
            pump(stream, callbacks, max).await;
        });
        Ok(AsyncStreamHandle {
            task: Arc::new(Mutex::new(Some(task))),
            closed: Arc::new(Mutex::new(false)),
        })
    }
}
into_future!(StreamLogsBuilder => AsyncStreamHandle);

/// A running log stream (Python `AsyncStreamHandle`): the backlog first, then live lines,
/// until the process ends or `close()`.
#[derive(Debug, Clone)]
pub struct AsyncStreamHandle {
    task: Arc<Mutex<Option<JoinHandle<()>>>>,
    closed: Arc<Mutex<bool>>,
}

impl AsyncStreamHandle {
    /// `close()`: no callback fires afterwards.
    pub fn close(&self) {
        *self.closed.lock().unwrap_or_else(|e| e.into_inner()) = true;
        if let Some(t) = self.task.lock().unwrap_or_else(|e| e.into_inner()).take() {
            t.abort();
        }
    }

    /// `closed`: whether `close()` was called or the stream ended.
    pub fn closed(&self) -> bool {
        *self.closed.lock().unwrap_or_else(|e| e.into_inner())
            || self
                .task
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
                .is_none_or(|t| t.is_finished())
    }

    /// `await wait(timeout=None)`: until the stream ends (the process exited), or `timeout`
    /// seconds pass.
    pub async fn wait(&self, timeout: impl crate::Seconds) -> Result<()> {
        let timeout = timeout.into_seconds();
        let task = self.task.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some(mut task) = task else { return Ok(()) };
        let done = match timeout {
            None => {
                let _ = (&mut task).await;
                true
            }
            Some(t) => tokio::time::timeout(Duration::from_secs_f64(t.max(0.0)), &mut task)
                .await
                .is_ok(),
        };
        if !done {
            *self.task.lock().unwrap_or_else(|e| e.into_inner()) = Some(task);
        }
        Ok(())
    }
}

impl SandboxProcess {
    pub(crate) fn new(ctx: Ctx) -> Self {
        SandboxProcess { ctx }
    }

    /// `process.exec(process)`: start `process["command"]` under `sh -c`.
    ///
    /// `process` is a [`ProcessRequest`] or a `json!` dict with `command`, `name`,
    /// `working_dir`, `env`, `wait_for_completion`, `timeout` (s), `wait_for_ports`,
    /// `restart_on_failure`, `max_restarts`, `keep_alive`, `stdin`. Callbacks are the setters
    /// `on_log`/`on_stdout`/`on_stderr`.
    pub fn exec(&self, process: impl IntoProcessRequest) -> ExecBuilder {
        ExecBuilder {
            ctx: self.ctx.clone(),
            request: process.into_request(),
        }
    }

    /// `process.get(identifier)`: by name or pid.
    pub async fn get(&self, identifier: &str) -> Result<ProcessResponse> {
        get(&self.ctx, identifier, false, INLINE_LIMIT).await
    }

    /// `process.list()`: every process started through the API, running or finished.
    pub async fn list(&self) -> Result<Vec<ProcessResponse>> {
        let infos = self.ctx.core.processes().await?;
        let mut out = Vec::new();
        for info in infos {
            let Some(tag) = &info.tag else { continue };
            if tag.starts_with(INTERNAL_TAG_PREFIX) || sandcove_interpreter::is_context_tag(tag) {
                continue;
            }
            out.push(describe(&self.ctx, &info, true, INLINE_LIMIT).await?);
        }
        Ok(out)
    }

    /// `process.logs(identifier, log_type="all")`.
    pub fn logs(&self, identifier: &str) -> LogsBuilder {
        LogsBuilder {
            ctx: self.ctx.clone(),
            identifier: identifier.to_string(),
            log_type: "all".into(),
        }
    }

    /// `process.wait(identifier, max_wait=60000, interval=1000)` (ms); raises `Exception("Process
    /// did not finish in time")` past `max_wait`.
    pub fn wait(&self, identifier: &str) -> WaitBuilder {
        WaitBuilder {
            ctx: self.ctx.clone(),
            identifier: identifier.to_string(),
            max_wait: 60_000,
            interval: 1000,
        }
    }

    /// `process.stop(identifier)`: SIGTERM to the process group; status `stopped`.
    pub async fn stop(&self, identifier: &str) -> Result<SuccessResponse> {
        self.signal(identifier, sandcove::Signal::Term, "stopped")
            .await?;
        Ok(SuccessResponse {
            message: "Process stopped successfully".into(),
            path: None,
        })
    }

    /// `process.kill(identifier)`: SIGKILL to the process group; status `killed`.
    pub async fn kill(&self, identifier: &str) -> Result<SuccessResponse> {
        self.signal(identifier, sandcove::Signal::Kill, "killed")
            .await?;
        Ok(SuccessResponse {
            message: "Process killed successfully".into(),
            path: None,
        })
    }

    /// `process.write_stdin(identifier, data)`: `data` (text or bytes) to the stdin of a
    /// process started with `stdin: true`, verbatim (add the newline your program reads by).
    /// A process without an open stdin pipe (started without one, closed, or ended) is a
    /// `ResponseError` 409; an unknown one 404.
    pub async fn write_stdin(
        &self,
        identifier: &str,
        data: impl Into<Vec<u8>>,
    ) -> Result<SuccessResponse> {
        crate::sandbox::touch(&self.ctx.core).await;
        let info = find(&self.ctx, identifier).await?;
        let sent = self
            .ctx
            .core
            .write_stdin(sandcove::ProcessSelector::Pid(info.pid), data.into())
            .await;
        match sent {
            Ok(()) => Ok(SuccessResponse {
                message: "Data written to stdin".into(),
                path: None,
            }),
            Err(e @ sandcove::Error::InvalidArgument { .. }) => {
                Err(SandboxAPIError::response_from(
                    409,
                    format!(
                        "process {identifier} has no open stdin (start it with stdin: true, and \
                         write before close_stdin and before it ends)"
                    ),
                    e,
                ))
            }
            Err(e) if e.is_not_found() => Err(SandboxAPIError::response_from(
                404,
                format!("process with identifier '{identifier}' not found"),
                e,
            )),
            Err(e) => Err(e.into()),
        }
    }

    /// `process.close_stdin(identifier)`: the process reads end-of-file. Idempotent; a process
    /// without a stdin pipe is left as it is.
    pub async fn close_stdin(&self, identifier: &str) -> Result<SuccessResponse> {
        let info = find(&self.ctx, identifier).await?;
        match self
            .ctx
            .core
            .close_stdin(sandcove::ProcessSelector::Pid(info.pid))
            .await
        {
            Ok(()) => {}
            // Ended meanwhile: its stdin is closed.
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
        Ok(SuccessResponse {
            message: "Stdin closed".into(),
            path: None,
        })
    }

    /// `process.stream_logs(process_name, options=None)`.
    pub fn stream_logs(&self, process_name: &str) -> StreamLogsBuilder {
        StreamLogsBuilder {
            ctx: self.ctx.clone(),
            name: process_name.to_string(),
            callbacks: Callbacks::default(),
        }
    }

    async fn signal(&self, identifier: &str, signal: sandcove::Signal, mark: &str) -> Result<()> {
        let info = find(&self.ctx, identifier).await?;
        if info.exit.is_some() {
            return Err(SandboxAPIError::response(
                404,
                format!("process {identifier} is not running"),
            ));
        }
        let key = state::proc_key(info.pid);
        let mut record = state::read_annotation::<ProcessRecord>(&self.ctx.core, &key)
            .await?
            .unwrap_or_else(|| record_from_info(&info));
        let before = record.clone();
        record.mark = Some(mark.to_string());
        record.marked_at = Some(sandcove::now_millis());
        state::write_annotation(&self.ctx.core, &key, &record).await?;
        let sent = self
            .ctx
            .core
            .signal(sandcove::ProcessSelector::Pid(info.pid), signal)
            .await;
        if let Err(e) = sent {
            let _ = state::write_annotation(&self.ctx.core, &key, &before).await;
            if e.is_not_found() {
                return Err(SandboxAPIError::response_from(
                    404,
                    format!("process {identifier} is not running"),
                    e,
                ));
            }
            return Err(e.into());
        }
        Ok(())
    }
}

/// Find a process by pid (numeric identifiers) or name: the running one, else the newest.
async fn find(ctx: &Ctx, identifier: &str) -> Result<sandcove::ProcessInfo> {
    let infos = ctx.core.processes().await?;
    let by_pid = identifier.parse::<u32>().ok();
    let mut best: Option<sandcove::ProcessInfo> = None;
    for info in infos {
        let hit = match by_pid {
            Some(pid) => info.pid == pid && info.tag.is_some(),
            None => info.tag.as_deref() == Some(identifier),
        };
        if !hit {
            continue;
        }
        let better = match &best {
            None => true,
            Some(b) => {
                (info.exit.is_none() && b.exit.is_some())
                    || (info.exit.is_none() == b.exit.is_none() && info.started_at >= b.started_at)
            }
        };
        if better {
            best = Some(info);
        }
    }
    best.ok_or_else(|| {
        SandboxAPIError::response(
            404,
            format!("process with identifier '{identifier}' not found"),
        )
    })
}

async fn get(ctx: &Ctx, identifier: &str, list: bool, limit: usize) -> Result<ProcessResponse> {
    let info = find(ctx, identifier).await?;
    describe(ctx, &info, list, limit).await
}

fn record_from_info(info: &sandcove::ProcessInfo) -> ProcessRecord {
    ProcessRecord {
        name: info.tag.clone().unwrap_or_default(),
        command: info.argv.last().cloned().unwrap_or_default(),
        ..Default::default()
    }
}

fn tail(bytes: &[u8], limit: usize) -> String {
    let start = bytes.len().saturating_sub(limit);
    String::from_utf8_lossy(&bytes[start..]).into_owned()
}

/// Record a new process (a runtime annotation), dropping the records of processes the
/// runtime no longer lists once there are many, so the records stay bounded as the
/// runtime's own history does.
async fn record_process(ctx: &Ctx, pid: u32, record: &ProcessRecord) -> Result<()> {
    let key = state::proc_key(pid);
    let mut update = sandcove::AnnotationUpdate::set(&key, state::encode(&key, record)?);
    let info = ctx.core.info().await?;
    let recorded = info
        .annotations
        .keys()
        .filter(|k| k.starts_with(PROC_KEY_PREFIX))
        .count();
    if recorded >= state::PROC_RECORDS_KEPT {
        let listed: std::collections::HashSet<String> = ctx
            .core
            .processes()
            .await?
            .iter()
            .map(|p| state::proc_key(p.pid))
            .collect();
        update.remove = info
            .annotations
            .keys()
            .filter(|k| k.starts_with(PROC_KEY_PREFIX) && **k != key && !listed.contains(*k))
            .cloned()
            .collect();
    }
    state::update_annotations(&ctx.core, update).await?;
    Ok(())
}

/// The Blaxel view of one core process.
async fn describe(
    ctx: &Ctx,
    info: &sandcove::ProcessInfo,
    list: bool,
    limit: usize,
) -> Result<ProcessResponse> {
    let record = state::read_annotation::<ProcessRecord>(&ctx.core, &state::proc_key(info.pid))
        .await?
        .unwrap_or_else(|| record_from_info(info));
    // The logs so far: the history an attach returns before its live marker, exact under
    // any load (no waiting for output to go quiet).
    let max = info.restart.and_then(|r| r.max_restarts);
    let (out, err) = match ctx
        .core
        .attach(sandcove::ProcessSelector::Pid(info.pid))
        .await
    {
        Ok(handle) => state::history(handle.into_stream(), max).await?,
        Err(e) if e.is_not_found() => (Vec::new(), Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let record = ProcessRecord {
        started_at: Some(info.started_at),
        ..record
    };
    response_of(ctx, info.pid, &record, Some(info), &out, &err, list, limit).await
}

/// The core's description of process `pid` (its first pid), if it still has one.
async fn info_of(ctx: &Ctx, pid: u32) -> Result<Option<sandcove::ProcessInfo>> {
    Ok(ctx
        .core
        .processes()
        .await?
        .into_iter()
        .find(|p| p.pid == pid))
}

#[allow(clippy::too_many_arguments)]
async fn response_of(
    ctx: &Ctx,
    pid: u32,
    record: &ProcessRecord,
    info: Option<&sandcove::ProcessInfo>,
    out: &[u8],
    err: &[u8],
    list: bool,
    limit: usize,
) -> Result<ProcessResponse> {
    // End, exit and restarts as the core reports them.
    let exit = info.and_then(|i| i.exit);
    let (status, exit_code) = translate::process_status(exit.as_ref(), record.mark.as_deref());
    let restart_count = info.map_or(0, |i| i64::from(i.restarts));
    let completed_at = if exit.is_some() {
        let done = info.and_then(|i| i.ended_at).or(record.marked_at);
        Some(done.map(translate::format_rfc1123).unwrap_or_default())
    } else if list {
        None
    } else {
        Some(String::new())
    };
    let started = match record.started_at {
        Some(t) => t,
        None => ctx
            .core
            .processes()
            .await?
            .into_iter()
            .find(|p| p.pid == pid)
            .map(|p| p.started_at)
            .unwrap_or_else(sandcove::now_millis),
    };
    let stdout = tail(out, limit);
    let stderr = tail(err, limit);
    Ok(ProcessResponse {
        pid: pid.to_string(),
        name: record.name.clone(),
        command: record.command.clone(),
        status: ProcessResponseStatus::from_name(status),
        exit_code,
        logs: format!("{stdout}{stderr}"),
        stdout,
        stderr,
        working_dir: record.working_dir.clone(),
        started_at: translate::format_rfc1123(started),
        completed_at,
        keep_alive: record.keep_alive,
        max_restarts: record.max_restarts,
        restart_count,
        restart_on_failure: record.restart_on_failure,
    })
}

/// Start a process per Blaxel's rules; with callbacks and no waiting, the returned task keeps
/// delivering output.
async fn exec(
    ctx: &Ctx,
    req: ProcessRequest,
    callbacks: Callbacks,
) -> Result<(ProcessResponse, Option<tokio::task::AbortHandle>)> {
    crate::sandbox::touch(&ctx.core).await;
    let name = req
        .name
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| format!("proc-{}", state::random_suffix(8)));
    if name.starts_with(INTERNAL_TAG_PREFIX)
        || sandcove_interpreter::is_context_tag(&name)
        || name.parse::<u32>().is_ok()
    {
        return Err(SandboxAPIError::response(
            400,
            format!("invalid process name '{name}'"),
        ));
    }
    let wait = req.wait_for_completion.unwrap_or(false);
    let keep_alive = req.keep_alive.unwrap_or(false);
    let restart = req.restart_on_failure.unwrap_or(false);
    let max_restarts = req.max_restarts.unwrap_or(0);
    let working_dir = req
        .working_dir
        .as_deref()
        .filter(|d| !d.is_empty())
        .map(|d| translate::expand_working_dir(d, HOME))
        .unwrap_or_default();
    let mut ports = Vec::new();
    for p in req.wait_for_ports.iter().flatten() {
        ports.push(u16::try_from(*p).map_err(|_| {
            SandboxAPIError::value_error(format!("wait_for_ports: {p} is not a port"))
        })?);
    }
    let mut spec = sandcove::ProcessSpec::new(sandcove::Command::sh(req.command.clone()));
    let policy = restart.then(|| translate::restart_policy(max_restarts));
    spec.restart = policy;
    if !working_dir.is_empty() {
        spec.cwd = Some(working_dir.clone());
    }
    spec.envs = req.env.clone().unwrap_or_default();
    spec.tag = Some(name.clone());
    spec.stdin = req.stdin.unwrap_or(false);
    if keep_alive {
        let t = match req.timeout {
            None => 600,
            Some(t) if t < 0 => 600,
            Some(t) => t,
        };
        if t > 0 {
            spec.timeout = Some(Duration::from_secs(t as u64));
        }
    }
    let stream = match ctx.core.spawn(spec).await {
        Ok(handle) => handle.into_stream(),
        Err(e @ sandcove::Error::AlreadyExists { .. }) => {
            return Err(SandboxAPIError::response_from(
                400,
                format!("process with name '{name}' already exists and is running"),
                e,
            ))
        }
        Err(e) if e.is_not_found() && !working_dir.is_empty() => {
            return Err(SandboxAPIError::response_from(
                422,
                format!(
                    "failed to start process: could not execute command '{}' because folder \
                     '{working_dir}' does not exist",
                    req.command
                ),
                e,
            ))
        }
        Err(e) => return Err(e.into()),
    };
    let pid = stream.pid;
    let record = ProcessRecord {
        name: name.clone(),
        command: req.command.clone(),
        working_dir: working_dir.clone(),
        keep_alive,
        max_restarts,
        restart_on_failure: restart,
        mark: None,
        marked_at: None,
        started_at: None,
    };
    record_process(ctx, pid, &record).await?;
    let has_callbacks = callbacks.any();
    let max = policy.and_then(|p| p.max_restarts);
    let mut task = tokio::spawn(pump(stream, callbacks, max));
    let started = Instant::now();
    // Bounds the waiting (not the process) unless keep_alive, where the core kills it.
    let wait_limit = match req.timeout {
        Some(t) if t > 0 && !keep_alive => Some(Duration::from_secs(t as u64)),
        _ => None,
    };
    if !ports.is_empty() {
        loop {
            if task.is_finished() {
                break;
            }
            if listening(ctx, &ports).await? {
                break;
            }
            if wait_limit.is_some_and(|l| started.elapsed() > l) {
                task.abort();
                return Err(SandboxAPIError::response(
                    422,
                    format!(
                        "process timed out waiting for ports after {} seconds",
                        wait_limit.map_or(0, |l| l.as_secs())
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    if wait {
        let joined = match wait_limit {
            None => (&mut task).await,
            Some(limit) => {
                match tokio::time::timeout(limit.saturating_sub(started.elapsed()), &mut task).await
                {
                    Ok(j) => j,
                    Err(_) => {
                        task.abort();
                        return Err(SandboxAPIError::response(
                            422,
                            format!("process timed out after {} seconds", limit.as_secs()),
                        ));
                    }
                }
            }
        };
        let (out, err, _) =
            joined.map_err(|e| SandboxAPIError::exception(format!("output task failed: {e}")))?;
        let record = state::read_annotation::<ProcessRecord>(&ctx.core, &state::proc_key(pid))
            .await?
            .unwrap_or(record);
        let info = info_of(ctx, pid).await?;
        let response = response_of(
            ctx,
            pid,
            &record,
            info.as_ref(),
            &out,
            &err,
            false,
            usize::MAX,
        )
        .await?;
        return Ok((response, None));
    }
    if !ports.is_empty() && task.is_finished() {
        // It ended while we waited for its ports: report how.
        if let Ok((out, err, _)) = (&mut task).await {
            let info = info_of(ctx, pid).await?;
            let response = response_of(
                ctx,
                pid,
                &record,
                info.as_ref(),
                &out,
                &err,
                false,
                usize::MAX,
            )
            .await?;
            return Ok((response, None));
        }
    }
    let response = response_of(ctx, pid, &record, None, &[], &[], false, 0).await?;
    if has_callbacks {
        return Ok((response, Some(task.abort_handle())));
    }
    task.abort();
    Ok((response, None))
}

/// Whether every port in `ports` has a listening socket on a routable address in the sandbox.
async fn listening(ctx: &Ctx, ports: &[u16]) -> Result<bool> {
    let spec = sandcove::ProcessSpec::new(sandcove::Command::sh(
        "cat /proc/net/tcp /proc/net/tcp6 2>/dev/null",
    ));
    let out = ctx.core.run(spec).await?;
    let open = translate::routable_listening_ports(&out.stdout_lossy());
    Ok(ports.iter().all(|p| open.contains(p)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_split_on_newlines_and_flush_the_rest() {
        let mut l = Lines::default();
        assert_eq!(l.push(b"a\nb"), ["a"]);
        assert_eq!(l.push(b"c\n\nd"), ["bc", ""]);
        assert_eq!(l.finish().as_deref(), Some("d"));
        assert_eq!(l.finish(), None);
    }
}
