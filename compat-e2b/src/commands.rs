//! `sandbox.commands`: run commands as E2B does (`/bin/bash -l -c <cmd>`), in the foreground
//! or the background, and manage running processes.

use std::collections::BTreeMap;
use std::fmt;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};

use futures::{Stream, StreamExt};
use sandcove::{Command, ProcessEvent, ProcessSelector, ProcessSpec, Signal};

use crate::call::{with_request_timeout, BoxFuture, Call, IntoSeconds};
use crate::errors::{CommandExitException, Result, SandboxException};
use crate::sandbox::Ctx;
use crate::translate::{self, py_opt_str, py_str, Utf8Decoder};

/// A chunk callback (`on_stdout`, `on_stderr`): called with each decoded chunk.
pub type OutputHandler = Box<dyn FnMut(String) + Send + 'static>;

/// A PTY output callback (`on_pty`): called with raw bytes.
pub type PtyHandler = Box<dyn FnMut(Vec<u8>) + Send + 'static>;

/// One item of a command's output when iterating a [`CommandHandle`]:
/// `(stdout, stderr, pty)`, exactly one of them `Some`.
pub type CommandOutput = (Option<String>, Option<String>, Option<Vec<u8>>);

/// `CommandResult`.
#[derive(Clone, PartialEq, Eq)]
pub struct CommandResult {
    /// `stderr`.
    pub stderr: String,
    /// `stdout`.
    pub stdout: String,
    /// `exit_code` (-1 when a signal ended the process).
    pub exit_code: i64,
    /// `error`: `None` on success, else e.g. `exit status 1` or `signal: killed`.
    pub error: Option<String>,
}

impl fmt::Debug for CommandResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CommandResult(stderr={}, stdout={}, exit_code={}, error={})",
            py_str(&self.stderr),
            py_str(&self.stdout),
            self.exit_code,
            py_opt_str(self.error.as_deref())
        )
    }
}

/// `ProcessInfo`: a running command or PTY.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessInfo {
    /// `pid`.
    pub pid: i64,
    /// `tag`.
    pub tag: Option<String>,
    /// `cmd`: the program (`/bin/bash` for commands).
    pub cmd: String,
    /// `args`: its arguments (`["-l", "-c", cmd]` for commands).
    pub args: Vec<String>,
    /// `envs`: the envs given at start.
    pub envs: BTreeMap<String, String>,
    /// `cwd`.
    pub cwd: Option<String>,
}

/// `sandbox.commands` (class `Commands`).
#[derive(Debug, Clone)]
pub struct Commands {
    pub(crate) ctx: Ctx,
}

pub(crate) fn pid_u32(pid: i64) -> Result<u32> {
    u32::try_from(pid).map_err(|_| SandboxException::invalid_argument(format!("invalid pid {pid}")))
}

impl Commands {
    /// `commands.run(cmd, background=None, envs=None, user=None, cwd=None, on_stdout=None,
    /// on_stderr=None, stdin=None, timeout=60, request_timeout=None)`. Awaited, it runs in
    /// the foreground and yields `CommandResult` (non-zero exit → `CommandExit`);
    /// `.background(true)` makes it yield a `CommandHandle`.
    pub fn run(&self, cmd: impl Into<String>) -> RunBuilder {
        RunBuilder {
            ctx: self.ctx.clone(),
            cmd: cmd.into(),
            envs: BTreeMap::new(),
            user: None,
            cwd: None,
            on_stdout: None,
            on_stderr: None,
            stdin: false,
            timeout: Some(translate::DEFAULT_COMMAND_TIMEOUT),
            request_timeout: None,
        }
    }

    /// `commands.connect(pid, timeout=60, request_timeout=None, on_stdout=None,
    /// on_stderr=None) -> CommandHandle`. Sandcove replays the output the process wrote
    /// before (E2B does not).
    pub fn connect(&self, pid: i64) -> ConnectBuilder {
        ConnectBuilder {
            ctx: self.ctx.clone(),
            pid,
            timeout: Some(translate::DEFAULT_COMMAND_TIMEOUT),
            pty: false,
            on_stdout: None,
            on_stderr: None,
            on_pty: None,
            request_timeout: None,
        }
    }

    /// `commands.list(request_timeout=None) -> list[ProcessInfo]`: running commands and PTYs.
    pub fn list(&self) -> Call<Vec<ProcessInfo>> {
        let ctx = self.ctx.clone();
        Call::new(async move {
            let listed = ctx.core.processes().await?;
            Ok(listed
                .into_iter()
                .filter(|p| p.exit.is_none())
                .map(|p| {
                    let mut argv = p.argv.into_iter();
                    let mut envs = p.envs;
                    envs.remove("E2B_SANDBOX_ID");
                    ProcessInfo {
                        pid: i64::from(p.pid),
                        tag: p.tag,
                        cmd: argv.next().unwrap_or_default(),
                        args: argv.collect(),
                        envs,
                        cwd: Some(ctx.e2b_path(&p.cwd)),
                    }
                })
                .collect())
        })
    }

    /// `commands.kill(pid, request_timeout=None) -> bool`: SIGKILL; `false` if no such
    /// process.
    pub fn kill(&self, pid: i64) -> Call<bool> {
        kill_pid(self.ctx.clone(), pid)
    }

    /// `commands.send_stdin(pid, data, request_timeout=None)`: `data` is text or bytes.
    pub fn send_stdin(&self, pid: i64, data: impl AsRef<[u8]>) -> Call<()> {
        send_stdin(self.ctx.clone(), pid, data.as_ref().to_vec())
    }

    /// `commands.close_stdin(pid, request_timeout=None)`.
    pub fn close_stdin(&self, pid: i64) -> Call<()> {
        let ctx = self.ctx.clone();
        Call::new(async move {
            let pid = pid_u32(pid)?;
            ctx.core.close_stdin(ProcessSelector::Pid(pid)).await?;
            Ok(())
        })
    }
}

/// The core spec of a process started the E2B way: cwd translated onto the sandbox's home,
/// E2B's per-process envs, the E2B user mapped onto the sandbox's default user. Shared by
/// `commands.run` and the wire protocol's `Process/Start`.
pub(crate) fn process_spec(
    ctx: &crate::sandbox::Inner,
    command: Command,
    envs: &BTreeMap<String, String>,
    user: Option<&str>,
    cwd: Option<&str>,
    stdin: bool,
    timeout: Option<std::time::Duration>,
) -> ProcessSpec {
    let mut spec = ProcessSpec::new(command);
    spec.user = ctx.runtime_user(user);
    spec.cwd = ctx.cwd_as(cwd, spec.user.as_deref());
    spec.envs = translate::process_envs(&ctx.envs, &ctx.id, envs);
    spec.stdin = stdin;
    spec.timeout = timeout;
    spec
}

pub(crate) fn kill_pid(ctx: Ctx, pid: i64) -> Call<bool> {
    Call::new(async move {
        let pid = pid_u32(pid)?;
        match ctx
            .core
            .signal(ProcessSelector::Pid(pid), Signal::Kill)
            .await
        {
            Ok(()) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(e.into()),
        }
    })
}

pub(crate) fn send_stdin(ctx: Ctx, pid: i64, data: Vec<u8>) -> Call<()> {
    Call::new(async move {
        let pid = pid_u32(pid)?;
        ctx.core
            .write_stdin(ProcessSelector::Pid(pid), data)
            .await?;
        Ok(())
    })
}

/// The builder of `commands.run(...)` in the foreground; await it for a `CommandResult`.
#[must_use = "a command does nothing until awaited"]
pub struct RunBuilder {
    ctx: Ctx,
    cmd: String,
    envs: BTreeMap<String, String>,
    user: Option<String>,
    cwd: Option<String>,
    on_stdout: Option<OutputHandler>,
    on_stderr: Option<OutputHandler>,
    stdin: bool,
    timeout: Option<f64>,
    request_timeout: Option<f64>,
}

impl fmt::Debug for RunBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunBuilder")
            .field("cmd", &self.cmd)
            .field("envs", &self.envs)
            .field("user", &self.user)
            .field("cwd", &self.cwd)
            .field("stdin", &self.stdin)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl RunBuilder {
    /// `background=`: `true` yields a `CommandHandle` right after the start; `false` runs to
    /// the end and yields a finished handle.
    pub fn background(self, background: bool) -> BackgroundRunBuilder {
        BackgroundRunBuilder {
            run: self,
            background,
        }
    }

    /// `envs=`: added on top of the sandbox's envs; they win.
    pub fn envs<K: Into<String>, V: Into<String>>(
        mut self,
        envs: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        self.envs = envs
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        self
    }

    /// `user=`: run as this user (default `user`).
    pub fn user(mut self, user: impl crate::OptionalString) -> Self {
        self.user = user.into_optional();
        self
    }

    /// `cwd=`: working directory (default `/home/user`; relative to the home; `~` expanded).
    pub fn cwd(mut self, cwd: impl crate::OptionalString) -> Self {
        self.cwd = cwd.into_optional();
        self
    }

    /// `on_stdout=`: called with each decoded stdout chunk.
    pub fn on_stdout(mut self, f: impl FnMut(String) + Send + 'static) -> Self {
        self.on_stdout = Some(Box::new(f));
        self
    }

    /// `on_stderr=`: called with each decoded stderr chunk.
    pub fn on_stderr(mut self, f: impl FnMut(String) + Send + 'static) -> Self {
        self.on_stderr = Some(Box::new(f));
        self
    }

    /// `stdin=`: keep stdin open for `send_stdin`/`close_stdin` (default: `/dev/null`).
    pub fn stdin(mut self, stdin: bool) -> Self {
        self.stdin = stdin;
        self
    }

    /// `timeout=`: seconds until the process is killed and `TimeoutException` raised (default
    /// 60; `0`/`None` = no limit).
    pub fn timeout(mut self, timeout: impl IntoSeconds) -> Self {
        self.timeout = timeout.into_seconds();
        self
    }

    /// `request_timeout=`: bounds the wait for the process to start, seconds.
    pub fn request_timeout(mut self, secs: impl IntoSeconds) -> Self {
        self.request_timeout = secs.into_seconds();
        self
    }

    fn spec(&self) -> ProcessSpec {
        process_spec(
            &self.ctx,
            Command::bash_login(self.cmd.clone()),
            &self.envs,
            self.user.as_deref(),
            self.cwd.as_deref(),
            self.stdin,
            translate::timeout_secs(self.timeout),
        )
    }

    async fn start(mut self) -> Result<CommandHandle> {
        let spec = self.spec();
        let start = self.ctx.core.spawn(spec);
        let stream = match translate::timeout_secs(self.request_timeout) {
            Some(limit) => tokio::time::timeout(limit, start).await.map_err(|_| {
                SandboxException::timeout("Request timed out waiting for the command to start")
            })??,
            None => start.await?,
        };
        let mut handle = CommandHandle::new(self.ctx.clone(), stream.into_stream(), false, None);
        handle.on_stdout = self.on_stdout.take();
        handle.on_stderr = self.on_stderr.take();
        Ok(handle)
    }
}

impl IntoFuture for RunBuilder {
    type Output = Result<CommandResult>;
    type IntoFuture = BoxFuture<'static, CommandResult>;
    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let mut handle = self.start().await?;
            handle.wait().await
        })
    }
}

/// The builder of `commands.run(..., background=...)`; await it for a `CommandHandle`.
#[must_use = "a command does nothing until awaited"]
#[derive(Debug)]
pub struct BackgroundRunBuilder {
    run: RunBuilder,
    background: bool,
}

impl BackgroundRunBuilder {
    /// `envs=`.
    pub fn envs<K: Into<String>, V: Into<String>>(
        mut self,
        envs: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        self.run = self.run.envs(envs);
        self
    }

    /// `user=`.
    pub fn user(mut self, user: impl crate::OptionalString) -> Self {
        self.run = self.run.user(user);
        self
    }

    /// `cwd=`.
    pub fn cwd(mut self, cwd: impl crate::OptionalString) -> Self {
        self.run = self.run.cwd(cwd);
        self
    }

    /// `on_stdout=`: called with each stdout chunk as the handle is iterated or waited on.
    pub fn on_stdout(mut self, f: impl FnMut(String) + Send + 'static) -> Self {
        self.run = self.run.on_stdout(f);
        self
    }

    /// `on_stderr=`.
    pub fn on_stderr(mut self, f: impl FnMut(String) + Send + 'static) -> Self {
        self.run = self.run.on_stderr(f);
        self
    }

    /// `stdin=`.
    pub fn stdin(mut self, stdin: bool) -> Self {
        self.run = self.run.stdin(stdin);
        self
    }

    /// `timeout=`: also bounds a background command: at expiry it is killed (default 60 s;
    /// pass `0` for a long-running server).
    pub fn timeout(mut self, timeout: impl IntoSeconds) -> Self {
        self.run = self.run.timeout(timeout);
        self
    }

    /// `request_timeout=`.
    pub fn request_timeout(mut self, secs: impl IntoSeconds) -> Self {
        self.run = self.run.request_timeout(secs);
        self
    }
}

impl IntoFuture for BackgroundRunBuilder {
    type Output = Result<CommandHandle>;
    type IntoFuture = BoxFuture<'static, CommandHandle>;
    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let mut handle = self.run.start().await?;
            if !self.background {
                handle.drain().await?;
                return Ok(handle);
            }
            Ok(handle.pump_in_background())
        })
    }
}

/// The builder of `commands.connect(pid, ...)` / `pty.connect(pid, on_data, ...)`.
#[must_use = "a call does nothing until awaited"]
pub struct ConnectBuilder {
    ctx: Ctx,
    pid: i64,
    timeout: Option<f64>,
    pty: bool,
    on_stdout: Option<OutputHandler>,
    on_stderr: Option<OutputHandler>,
    on_pty: Option<PtyHandler>,
    request_timeout: Option<f64>,
}

impl fmt::Debug for ConnectBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectBuilder")
            .field("pid", &self.pid)
            .field("timeout", &self.timeout)
            .field("pty", &self.pty)
            .finish_non_exhaustive()
    }
}

impl ConnectBuilder {
    pub(crate) fn pty(ctx: Ctx, pid: i64, on_data: PtyHandler) -> Self {
        ConnectBuilder {
            ctx,
            pid,
            timeout: Some(translate::DEFAULT_COMMAND_TIMEOUT),
            pty: true,
            on_stdout: None,
            on_stderr: None,
            on_pty: Some(on_data),
            request_timeout: None,
        }
    }

    /// `on_stdout=` (async `commands.connect`): called with each decoded stdout chunk as the
    /// handle is iterated or waited on.
    pub fn on_stdout(mut self, f: impl FnMut(String) + Send + 'static) -> Self {
        self.on_stdout = Some(Box::new(f));
        self
    }

    /// `on_stderr=` (async `commands.connect`).
    pub fn on_stderr(mut self, f: impl FnMut(String) + Send + 'static) -> Self {
        self.on_stderr = Some(Box::new(f));
        self
    }

    /// `request_timeout=`: bounds the attach call, seconds.
    pub fn request_timeout(mut self, secs: impl IntoSeconds) -> Self {
        self.request_timeout = secs.into_seconds();
        self
    }

    /// `timeout=`: how long the handle streams (default 60 s; `0` = no limit); at expiry
    /// iteration raises `TimeoutException` and the process keeps running.
    pub fn timeout(mut self, timeout: impl IntoSeconds) -> Self {
        self.timeout = timeout.into_seconds();
        self
    }
}

impl IntoFuture for ConnectBuilder {
    type Output = Result<CommandHandle>;
    type IntoFuture = BoxFuture<'static, CommandHandle>;
    fn into_future(self) -> Self::IntoFuture {
        let limit = self.request_timeout;
        let attach = Box::pin(async move {
            let pid = pid_u32(self.pid)?;
            let stream = self
                .ctx
                .core
                .attach(ProcessSelector::Pid(pid))
                .await?
                .into_stream();
            let deadline =
                translate::timeout_secs(self.timeout).map(|d| tokio::time::Instant::now() + d);
            let mut handle = CommandHandle::new(self.ctx, stream, self.pty, deadline);
            handle.on_stdout = self.on_stdout;
            handle.on_stderr = self.on_stderr;
            handle.on_pty = self.on_pty;
            Ok(handle.pump_in_background())
        });
        with_request_timeout(attach, limit)
    }
}

/// `CommandHandle`: a running command. Iterate it with [`CommandHandle::next`] (or as a
/// `Stream`) for `(stdout, stderr, pty)` items; [`CommandHandle::wait`] for the result.
pub struct CommandHandle {
    /// `pid`.
    pub pid: i64,
    ctx: Ctx,
    events: Option<Pin<Box<dyn Stream<Item = sandcove::Result<ProcessEvent>> + Send>>>,
    pty: bool,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    out: Utf8Decoder,
    err: Utf8Decoder,
    stdout: String,
    stderr: String,
    finished: Option<Result<CommandResult>>,
    pub(crate) on_stdout: Option<OutputHandler>,
    pub(crate) on_stderr: Option<OutputHandler>,
    pub(crate) on_pty: Option<PtyHandler>,
    /// The task reading the output when callbacks were given at the start (see
    /// [`CommandHandle::pump_in_background`]).
    pump: Option<tokio::task::JoinHandle<Result<CommandResult>>>,
}

impl fmt::Debug for CommandHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CommandHandle")
            .field("pid", &self.pid)
            .field("finished", &self.finished.is_some())
            .finish_non_exhaustive()
    }
}

impl CommandHandle {
    pub(crate) fn new(
        ctx: Ctx,
        stream: sandcove::ProcessStream,
        pty: bool,
        deadline: Option<tokio::time::Instant>,
    ) -> Self {
        CommandHandle {
            pid: i64::from(stream.pid),
            ctx,
            events: Some(stream.events),
            pty,
            deadline: deadline.map(|at| Box::pin(tokio::time::sleep_until(at))),
            out: Utf8Decoder::default(),
            err: Utf8Decoder::default(),
            stdout: String::new(),
            stderr: String::new(),
            finished: None,
            on_stdout: None,
            on_stderr: None,
            on_pty: None,
            pump: None,
        }
    }

    /// With callbacks given at the start (`commands.run(..., background=True, on_stdout=…)`,
    /// `commands.connect(pid, on_stdout=…)`, `pty.create(size, on_data)`), read the output
    /// on a task of its own, as the async SDK's handle does: the callbacks fire as output
    /// arrives, whether or not anyone waits, until the process ends or `disconnect()`.
    /// `wait()` then awaits that task (callbacks given to `wait` are not called), and
    /// iterating the handle yields nothing: its output went to the callbacks.
    pub(crate) fn pump_in_background(mut self) -> Self {
        if self.on_stdout.is_none() && self.on_stderr.is_none() && self.on_pty.is_none() {
            return self;
        }
        let mut reader = CommandHandle {
            pid: self.pid,
            ctx: self.ctx.clone(),
            events: self.events.take(),
            pty: self.pty,
            deadline: self.deadline.take(),
            out: std::mem::take(&mut self.out),
            err: std::mem::take(&mut self.err),
            stdout: std::mem::take(&mut self.stdout),
            stderr: std::mem::take(&mut self.stderr),
            finished: None,
            on_stdout: self.on_stdout.take(),
            on_stderr: self.on_stderr.take(),
            on_pty: self.on_pty.take(),
            pump: None,
        };
        self.pump = Some(tokio::spawn(async move { reader.wait().await }));
        self
    }

    /// What a stream that broke off with `e` raises, as the SDK decides after its health
    /// probe: the sandbox gone (killed, or at the end of its life) is a `Timeout`; anything
    /// else is `e`.
    async fn broken(ctx: &Ctx, e: sandcove::Error) -> SandboxException {
        if !crate::errors::broke_the_connection(&e) {
            return e.into();
        }
        let gone = match ctx.core.info().await {
            Ok(info) => info.state == sandcove::SandboxState::Destroyed,
            Err(probe) => probe.is_not_found() || probe.code() == sandcove::ErrorCode::Destroyed,
        };
        if !gone {
            return e.into();
        }
        SandboxException::Timeout {
            message: format!(
                "{e}: The sandbox was killed or reached its end of life while the request was in flight."
            ),
            source: Some(Box::new(e)),
        }
    }

    /// The next `(stdout, stderr, pty)` item; `None` once the process has ended (Python's
    /// `for stdout, stderr, pty in handle`).
    pub async fn next(&mut self) -> Option<Result<CommandOutput>> {
        loop {
            let events = self.events.as_mut()?;
            let event = match self.deadline.as_mut() {
                Some(sleep) => tokio::select! {
                    e = events.next() => e,
                    _ = sleep.as_mut() => {
                        self.events = None;
                        return Some(Err(SandboxException::timeout(
                            "context deadline exceeded: the command's stream timeout passed",
                        )));
                    }
                },
                None => events.next().await,
            };
            let event = match event {
                None => {
                    self.events = None;
                    return None;
                }
                Some(Err(e)) => {
                    self.events = None;
                    return Some(Err(Self::broken(&self.ctx, e).await));
                }
                Some(Ok(e)) => e,
            };
            match event {
                ProcessEvent::Stdout(bytes) if self.pty => {
                    if let Some(f) = self.on_pty.as_mut() {
                        f(bytes.clone());
                    }
                    return Some(Ok((None, None, Some(bytes))));
                }
                ProcessEvent::Stdout(bytes) => {
                    let text = self.out.decode(&bytes);
                    if let Some(item) = self.emit_stdout(text) {
                        return Some(Ok(item));
                    }
                }
                ProcessEvent::Stderr(bytes) => {
                    let text = self.err.decode(&bytes);
                    if let Some(item) = self.emit_stderr(text) {
                        return Some(Ok(item));
                    }
                }
                ProcessEvent::Start { .. }
                | ProcessEvent::Gap { .. }
                | ProcessEvent::Live
                | ProcessEvent::Restarted { .. } => {}
                ProcessEvent::Exit(status) => {
                    self.events = None;
                    let tail_out = self.out.finish();
                    let tail_err = self.err.finish();
                    self.stdout.push_str(&tail_out);
                    self.stderr.push_str(&tail_err);
                    let (exit_code, error) = translate::exit_fields(&status);
                    let result = CommandResult {
                        stderr: self.stderr.clone(),
                        stdout: self.stdout.clone(),
                        exit_code,
                        error,
                    };
                    self.finished = Some(if status.timed_out {
                        Err(SandboxException::timeout(
                            "context deadline exceeded: the command's timeout passed and it was killed",
                        ))
                    } else if exit_code == 0 {
                        Ok(result)
                    } else {
                        Err(CommandExitException::from(result).into())
                    });
                    return None;
                }
            }
        }
    }

    fn emit_stdout(&mut self, text: String) -> Option<CommandOutput> {
        if text.is_empty() {
            return None;
        }
        self.stdout.push_str(&text);
        if let Some(f) = self.on_stdout.as_mut() {
            f(text.clone());
        }
        Some((Some(text), None, None))
    }

    fn emit_stderr(&mut self, text: String) -> Option<CommandOutput> {
        if text.is_empty() {
            return None;
        }
        self.stderr.push_str(&text);
        if let Some(f) = self.on_stderr.as_mut() {
            f(text.clone());
        }
        Some((None, Some(text), None))
    }

    async fn drain(&mut self) -> Result<()> {
        while let Some(item) = self.next().await {
            item?;
        }
        Ok(())
    }

    /// `handle.wait(on_pty=None, on_stdout=None, on_stderr=None) -> CommandResult`: drain
    /// the output; a non-zero exit raises `CommandExit`.
    pub fn wait(&mut self) -> WaitBuilder<'_> {
        WaitBuilder {
            handle: self,
            on_stdout: None,
            on_stderr: None,
            on_pty: None,
        }
    }

    /// `handle.kill() -> bool`: SIGKILL; `false` when the process is already gone.
    pub fn kill(&self) -> Call<bool> {
        kill_pid(self.ctx.clone(), self.pid)
    }

    /// `handle.disconnect()`: stop receiving output; the process keeps running (reattach
    /// with `commands.connect(pid)`).
    pub async fn disconnect(&mut self) {
        self.events = None;
        if let Some(pump) = self.pump.take() {
            pump.abort();
        }
    }

    /// `handle.send_stdin(data, request_timeout=None)`.
    pub fn send_stdin(&self, data: impl AsRef<[u8]>) -> Call<()> {
        send_stdin(self.ctx.clone(), self.pid, data.as_ref().to_vec())
    }

    /// `handle.close_stdin(request_timeout=None)`.
    pub fn close_stdin(&self) -> Call<()> {
        Commands {
            ctx: self.ctx.clone(),
        }
        .close_stdin(self.pid)
    }

    /// Async handle property `stdout`: everything decoded so far.
    pub fn stdout(&self) -> &str {
        &self.stdout
    }

    /// Async handle property `stderr`: everything decoded so far.
    pub fn stderr(&self) -> &str {
        &self.stderr
    }

    /// Async handle property `exit_code`: `None` while running.
    pub fn exit_code(&self) -> Option<i64> {
        match &self.finished {
            Some(Ok(r)) => Some(r.exit_code),
            Some(Err(SandboxException::CommandExit(e))) => Some(e.exit_code),
            Some(Err(_)) => Some(-1),
            None => None,
        }
    }
}

impl Stream for CommandHandle {
    type Item = Result<CommandOutput>;
    fn poll_next(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let fut = this.next();
        futures::pin_mut!(fut);
        fut.poll(cx)
    }
}

/// The builder of `handle.wait(...)`.
#[must_use = "wait does nothing until awaited"]
pub struct WaitBuilder<'a> {
    handle: &'a mut CommandHandle,
    on_stdout: Option<OutputHandler>,
    on_stderr: Option<OutputHandler>,
    on_pty: Option<PtyHandler>,
}

impl fmt::Debug for WaitBuilder<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WaitBuilder")
            .field("pid", &self.handle.pid)
            .finish_non_exhaustive()
    }
}

impl WaitBuilder<'_> {
    /// `on_stdout=`.
    pub fn on_stdout(mut self, f: impl FnMut(String) + Send + 'static) -> Self {
        self.on_stdout = Some(Box::new(f));
        self
    }

    /// `on_stderr=`.
    pub fn on_stderr(mut self, f: impl FnMut(String) + Send + 'static) -> Self {
        self.on_stderr = Some(Box::new(f));
        self
    }

    /// `on_pty=`: called with raw terminal bytes.
    pub fn on_pty(mut self, f: impl FnMut(Vec<u8>) + Send + 'static) -> Self {
        self.on_pty = Some(Box::new(f));
        self
    }
}

impl<'a> IntoFuture for WaitBuilder<'a> {
    type Output = Result<CommandResult>;
    type IntoFuture = BoxFuture<'a, CommandResult>;
    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let h = self.handle;
            if let Some(pump) = h.pump.take() {
                h.finished = Some(pump.await.unwrap_or_else(|e| {
                    Err(SandboxException::sandbox(format!(
                        "the task reading the command's output ended: {e}"
                    )))
                }));
            }
            if self.on_stdout.is_some() {
                h.on_stdout = self.on_stdout;
            }
            if self.on_stderr.is_some() {
                h.on_stderr = self.on_stderr;
            }
            if self.on_pty.is_some() {
                h.on_pty = self.on_pty;
            }
            h.drain().await?;
            match h.finished.take() {
                Some(result) => {
                    h.finished = Some(match &result {
                        Ok(r) => Ok(r.clone()),
                        Err(SandboxException::CommandExit(e)) => {
                            Err(SandboxException::CommandExit(e.clone()))
                        }
                        Err(e) => Err(SandboxException::sandbox(e.to_string())),
                    });
                    result
                }
                None => Err(SandboxException::sandbox(
                    "Command ended without an end event",
                )),
            }
        })
    }
}
