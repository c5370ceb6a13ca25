//! Python `sandbox.process`: `exec`, `code_run`, and sessions.
//!
//! A session is one long-lived `bash` reading commands on its stdin (tagged
//! `daytona-session-<id>`). Each command is written to a file and sourced into that shell, so
//! `cd`, `export`, variables and functions persist. The facade brackets each command with
//! markers on stdout and stderr that carry its id and exit code, so the output of every
//! command is kept per stream, byte for byte, and any program can rebuild a session's history
//! by attaching to the shell (the runtime replays its retained output).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::StreamExt;
use sandcove::{ProcessEvent, ProcessSelector, ProcessSpec, ProcessStream};

use crate::ctx::Ctx;
use crate::errors::{Context, DaytonaError, ErrorDetails};
use crate::gaps::gap;
use crate::translate::{self, LANGUAGE_LABEL};
use crate::{awaitable, Result};

/// Python `ExecutionArtifacts`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ExecutionArtifacts {
    /// `stdout`: always equal to `ExecuteResponse.result`.
    pub stdout: String,
    /// `charts`: matplotlib charts (always empty here).
    pub charts: Option<Vec<serde_json::Value>>,
}

/// Python `ExecuteResponse`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ExecuteResponse {
    /// `exit_code`: the shell's status (`-1` when the process could not start).
    pub exit_code: i64,
    /// `result`: stdout and stderr combined, in the order written, not trimmed.
    pub result: String,
    /// `artifacts`.
    pub artifacts: Option<ExecutionArtifacts>,
}

/// Python `CodeRunParams`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CodeRunParams {
    /// `argv`: joined with single spaces, unquoted, as Daytona does.
    pub argv: Option<Vec<String>>,
    /// `env`: extra environment for the run.
    pub env: Option<HashMap<String, String>>,
}

/// Python `SessionExecuteRequest`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SessionExecuteRequest {
    /// `command`.
    pub command: String,
    /// `run_async`: return at once with only `cmd_id`; stdin stays open for input.
    pub run_async: Option<bool>,
    /// `var_async`: deprecated alias of `run_async`.
    pub var_async: Option<bool>,
    /// `suppress_input_echo`: input is never echoed here.
    pub suppress_input_echo: Option<bool>,
}

/// Python `SessionExecuteResponse`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SessionExecuteResponse {
    /// `cmd_id`.
    pub cmd_id: String,
    /// `output`: stdout and stderr interleaved (`None` for async commands).
    pub output: Option<String>,
    /// `stdout` (`""` for async commands).
    pub stdout: Option<String>,
    /// `stderr` (`""` for async commands).
    pub stderr: Option<String>,
    /// `exit_code` (`None` for async commands).
    pub exit_code: Option<i64>,
}

/// Python `Command` (a command run in a session).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Command {
    /// `id`.
    pub id: String,
    /// `command`.
    pub command: String,
    /// `exit_code`: `None` while it runs.
    pub exit_code: Option<i64>,
}

/// Python `Session`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Session {
    /// `session_id`.
    pub session_id: String,
    /// `commands`, in the order they were run.
    pub commands: Vec<Command>,
}

/// Python `SessionCommandLogsResponse`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SessionCommandLogsResponse {
    /// `output`: interleaved.
    pub output: Option<String>,
    /// `stdout`.
    pub stdout: Option<String>,
    /// `stderr`.
    pub stderr: Option<String>,
}

/// Python `sandbox.process`.
#[derive(Debug, Clone)]
pub struct Process {
    ctx: Ctx,
}

impl Process {
    pub(crate) fn new(ctx: Ctx) -> Self {
        Process { ctx }
    }

    /// `exec(command, cwd=None, env=None, timeout=None) -> ExecuteResponse`: run `command`
    /// through bash in the work dir; stdout and stderr are combined in `result`; on timeout
    /// the process group is killed and `DaytonaTimeoutError` raised.
    pub fn exec(&self, command: impl Into<String>) -> ExecBuilder {
        ExecBuilder {
            ctx: self.ctx.clone(),
            command: command.into(),
            cwd: None,
            env: BTreeMap::new(),
            timeout: None,
            code: None,
            language: None,
        }
    }

    /// `code_run(code, params=None, timeout=None) -> ExecuteResponse`: run `code` with the
    /// sandbox language (label `code-toolbox-language`, python by default).
    pub fn code_run(&self, code: impl Into<String>) -> CodeRunBuilder {
        CodeRunBuilder {
            exec: ExecBuilder {
                ctx: self.ctx.clone(),
                command: String::new(),
                cwd: None,
                env: BTreeMap::new(),
                timeout: None,
                code: Some(code.into()),
                language: None,
            },
            params: None,
        }
    }

    /// `create_session(session_id)`: start a session shell. Duplicate → `DaytonaConflictError`.
    pub async fn create_session(&self, session_id: &str) -> Result<()> {
        const P: &str = "Failed to create session: ";
        check_session_id(session_id).ctx(P)?;
        let mut spec = ProcessSpec::new(sandcove::Command::argv(["/bin/bash"]));
        spec.stdin = true;
        spec.tag = Some(session_tag(session_id));
        spec.cwd = Some(self.ctx.work_dir.to_string());
        let stream = self.ctx.backend().spawn(&self.ctx.id, spec).await.ctx(P)?;
        let state = SessionState::start(stream);
        registry()
            .lock()
            .expect("session registry")
            .insert(key(&self.ctx, session_id), state);
        Ok(())
    }

    /// `get_session(session_id) -> Session`.
    pub async fn get_session(&self, session_id: &str) -> Result<Session> {
        let state = self
            .session(session_id)
            .await
            .ctx("Failed to get session: ")?;
        Ok(state.snapshot(session_id))
    }

    /// `list_sessions() -> list[Session]`.
    pub async fn list_sessions(&self) -> Result<Vec<Session>> {
        const P: &str = "Failed to list sessions: ";
        let procs = self
            .ctx
            .backend()
            .list_processes(&self.ctx.id)
            .await
            .ctx(P)?;
        let mut out = Vec::new();
        for p in &procs {
            let Some(id) = p.tag.as_deref().and_then(|t| t.strip_prefix(SESSION_TAG)) else {
                continue;
            };
            if p.exit.is_some() {
                continue;
            }
            match self.session_in(&procs, id).await {
                Ok(state) => out.push(state.snapshot(id)),
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e.prefixed(P)),
            }
        }
        Ok(out)
    }

    /// `delete_session(session_id)`: kill the session shell's whole process group.
    pub async fn delete_session(&self, session_id: &str) -> Result<()> {
        const P: &str = "Failed to delete session: ";
        let state = self.session(session_id).await.ctx(P)?;
        let mut changed = state.version.subscribe();
        self.ctx
            .backend()
            .signal(
                &self.ctx.id,
                ProcessSelector::Tag(session_tag(session_id)),
                sandcove::Signal::Kill,
            )
            .await
            .ctx(P)?;
        // Return once the shell is gone, so the session is not found from now on.
        let gone = async {
            while !state.inner.lock().expect("session state").ended {
                if changed.changed().await.is_err() {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(10), gone).await;
        registry()
            .lock()
            .expect("session registry")
            .remove(&key(&self.ctx, session_id));
        Ok(())
    }

    /// `execute_session_command(session_id, req, timeout=None) -> SessionExecuteResponse`.
    /// Commands of one session run one after another; `timeout` bounds only the wait.
    pub fn execute_session_command(
        &self,
        session_id: impl Into<String>,
        req: SessionExecuteRequest,
    ) -> SessionExecuteBuilder {
        SessionExecuteBuilder {
            process: self.clone(),
            session_id: session_id.into(),
            req,
            timeout: None,
        }
    }

    /// `get_session_command(session_id, command_id) -> Command`.
    pub async fn get_session_command(&self, session_id: &str, command_id: &str) -> Result<Command> {
        const P: &str = "Failed to get session command: ";
        let state = self.session(session_id).await.ctx(P)?;
        state.wait_for(command_id).await;
        let inner = state.inner.lock().expect("session state");
        inner
            .find(command_id)
            .map(CmdState::command)
            .ok_or_else(|| command_not_found(command_id).prefixed(P))
    }

    /// `get_session_command_logs(session_id, command_id) -> SessionCommandLogsResponse`:
    /// what was logged so far; does not wait.
    pub async fn get_session_command_logs(
        &self,
        session_id: &str,
        command_id: &str,
    ) -> Result<SessionCommandLogsResponse> {
        const P: &str = "Failed to get session command logs: ";
        let state = self.session(session_id).await.ctx(P)?;
        state.wait_for(command_id).await;
        let inner = state.inner.lock().expect("session state");
        let cmd = inner
            .find(command_id)
            .ok_or_else(|| command_not_found(command_id).prefixed(P))?;
        Ok(SessionCommandLogsResponse {
            output: Some(lossy(&cmd.output)),
            stdout: Some(lossy(&cmd.stdout)),
            stderr: Some(lossy(&cmd.stderr)),
        })
    }

    /// `get_session_command_logs_async(session_id, command_id, on_stdout, on_stderr)`: follow
    /// the command's output until it exits, calling the callbacks with decoded chunks (chunk
    /// boundaries are not lines).
    pub async fn get_session_command_logs_async<O, E>(
        &self,
        session_id: &str,
        command_id: &str,
        mut on_stdout: O,
        mut on_stderr: E,
    ) -> Result<()>
    where
        O: FnMut(&str) + Send + 'static,
        E: FnMut(&str) + Send + 'static,
    {
        const P: &str = "Failed to get session command logs: ";
        let state = self.session(session_id).await.ctx(P)?;
        state.wait_for(command_id).await;
        let mut changed = state.version.subscribe();
        let mut cursor = 0;
        let mut carry_out = Vec::new();
        let mut carry_err = Vec::new();
        loop {
            let (chunks, done) = {
                let inner = state.inner.lock().expect("session state");
                let cmd = inner
                    .find(command_id)
                    .ok_or_else(|| command_not_found(command_id).prefixed(P))?;
                let chunks: Vec<_> = cmd.chunks[cursor..].to_vec();
                (chunks, cmd.is_done() || inner.ended)
            };
            cursor += chunks.len();
            for (is_err, bytes) in chunks {
                type Sink<'a> = (&'a mut Vec<u8>, &'a mut dyn FnMut(&str));
                let (carry, cb): Sink<'_> = if is_err {
                    (&mut carry_err, &mut on_stderr)
                } else {
                    (&mut carry_out, &mut on_stdout)
                };
                carry.extend_from_slice(&bytes);
                let text = take_utf8(carry);
                if !text.is_empty() {
                    cb(&text);
                }
            }
            if done {
                if !carry_out.is_empty() {
                    on_stdout(&lossy(&carry_out));
                }
                if !carry_err.is_empty() {
                    on_stderr(&lossy(&carry_err));
                }
                return Ok(());
            }
            if changed.changed().await.is_err() {
                return Ok(());
            }
        }
    }

    /// `send_session_command_input(session_id, command_id, data)`: write `data` and a newline
    /// to a running async command's stdin.
    pub async fn send_session_command_input(
        &self,
        session_id: &str,
        command_id: &str,
        data: &str,
    ) -> Result<()> {
        const P: &str = "Failed to send session command input: ";
        let state = self.session(session_id).await.ctx(P)?;
        state.wait_for(command_id).await;
        {
            let inner = state.inner.lock().expect("session state");
            let cmd = inner
                .find(command_id)
                .ok_or_else(|| command_not_found(command_id).prefixed(P))?;
            if cmd.exit_code.is_some() {
                return Err(DaytonaError::BadRequest(ErrorDetails::new(
                    format!("{P}command {command_id} has already completed"),
                    Some(400),
                    Some("COMMAND_ALREADY_COMPLETED"),
                )));
            }
        }
        self.ctx
            .backend()
            .write_stdin(
                &self.ctx.id,
                ProcessSelector::Tag(session_tag(session_id)),
                format!("{data}\n").into_bytes(),
            )
            .await
            .ctx(P)
    }

    /// `create_pty_session(...)`: a gap (see `MAPPING.md`).
    pub async fn create_pty_session(&self, _id: &str) -> Result<()> {
        Err(gap("pty sessions"))
    }
    /// `connect_pty_session(session_id)`: a gap.
    pub async fn connect_pty_session(&self, _session_id: &str) -> Result<()> {
        Err(gap("pty sessions"))
    }
    /// `list_pty_sessions()`: a gap.
    pub async fn list_pty_sessions(&self) -> Result<()> {
        Err(gap("pty sessions"))
    }
    /// `get_pty_session_info(session_id)`: a gap.
    pub async fn get_pty_session_info(&self, _session_id: &str) -> Result<()> {
        Err(gap("pty sessions"))
    }
    /// `kill_pty_session(session_id)`: a gap.
    pub async fn kill_pty_session(&self, _session_id: &str) -> Result<()> {
        Err(gap("pty sessions"))
    }
    /// `resize_pty_session(session_id, pty_size)`: a gap.
    pub async fn resize_pty_session(&self, _session_id: &str) -> Result<()> {
        Err(gap("pty sessions"))
    }
    /// `get_entrypoint_session()`: a gap.
    pub async fn get_entrypoint_session(&self) -> Result<Session> {
        Err(gap("entrypoint session"))
    }
    /// `get_entrypoint_logs()`: a gap.
    pub async fn get_entrypoint_logs(&self) -> Result<SessionCommandLogsResponse> {
        Err(gap("entrypoint session"))
    }

    /// The live state of a session: this program's, or rebuilt by attaching to its shell.
    ///
    /// Whether the shell runs is asked of the runtime on every call, never of the cached
    /// state: the cache learns of the shell's end only when its stream task gets to the exit
    /// event, which may be after a `stop` or `delete_session` (of this program or another)
    /// has returned.
    async fn session(&self, session_id: &str) -> Result<Arc<SessionState>> {
        let procs = self.ctx.backend().list_processes(&self.ctx.id).await?;
        self.session_in(&procs, session_id).await
    }

    /// [`Process::session`] against a process listing the caller has just taken.
    async fn session_in(
        &self,
        procs: &[sandcove::ProcessInfo],
        session_id: &str,
    ) -> Result<Arc<SessionState>> {
        let k = key(&self.ctx, session_id);
        let tag = session_tag(session_id);
        let shell = procs
            .iter()
            .find(|p| p.tag.as_deref() == Some(tag.as_str()) && p.exit.is_none())
            .map(|p| p.pid);
        let Some(pid) = shell else {
            // Holders of the old state keep it; its stream task still delivers the tail.
            registry().lock().expect("session registry").remove(&k);
            return Err(DaytonaError::NotFound(ErrorDetails::new(
                format!("session {session_id} not found"),
                Some(404),
                Some("SESSION_NOT_FOUND"),
            )));
        };
        if let Some(s) = registry().lock().expect("session registry").get(&k) {
            // Another pid is another shell under the same id (deleted and created again).
            if s.pid == pid && !s.inner.lock().expect("session state").ended {
                return Ok(s.clone());
            }
        }
        let stream = self
            .ctx
            .backend()
            .attach(&self.ctx.id, ProcessSelector::Pid(pid))
            .await?;
        let state = SessionState::rebuild(stream).await;
        registry()
            .lock()
            .expect("session registry")
            .insert(k, state.clone());
        Ok(state)
    }

    async fn execute(
        &self,
        session_id: &str,
        req: SessionExecuteRequest,
        timeout: Option<i64>,
    ) -> Result<SessionExecuteResponse> {
        if session_id == "entrypoint" {
            return Err(DaytonaError::validation(
                "session id \"entrypoint\" is reserved",
            ));
        }
        if req.command.trim().is_empty() {
            return Err(DaytonaError::validation("command is required"));
        }
        let run_async = req.run_async.or(req.var_async).unwrap_or(false);
        let state = self.session(session_id).await?;
        let cmd_id = new_id();
        {
            // Commands of one session run one after another: wait for the previous one.
            let _turn = state.submit.lock().await;
            let mut changed = state.version.subscribe();
            loop {
                let busy = {
                    let inner = state.inner.lock().expect("session state");
                    if inner.ended {
                        return Err(DaytonaError::BadRequest(ErrorDetails::new(
                            format!("session {session_id} has ended"),
                            Some(400),
                            Some("SESSION_ENDED"),
                        )));
                    }
                    inner.commands.iter().any(|c| !c.is_done())
                };
                if !busy {
                    break;
                }
                if changed.changed().await.is_err() {
                    break;
                }
            }
            state
                .inner
                .lock()
                .expect("session state")
                .commands
                .push(CmdState {
                    id: cmd_id.clone(),
                    command: req.command.clone(),
                    ..Default::default()
                });
            let line = driver_line(&cmd_id, &req.command, run_async);
            self.ctx
                .backend()
                .write_stdin(
                    &self.ctx.id,
                    ProcessSelector::Tag(session_tag(session_id)),
                    line.into_bytes(),
                )
                .await?;
        }
        if run_async {
            return Ok(SessionExecuteResponse {
                cmd_id,
                output: None,
                stdout: Some(String::new()),
                stderr: Some(String::new()),
                exit_code: None,
            });
        }
        let wait = async {
            let mut changed = state.version.subscribe();
            loop {
                {
                    let inner = state.inner.lock().expect("session state");
                    let cmd = inner.find(&cmd_id).expect("registered above");
                    if cmd.is_done() || inner.ended {
                        return SessionExecuteResponse {
                            cmd_id: cmd_id.clone(),
                            output: Some(lossy(&cmd.output)),
                            stdout: Some(lossy(&cmd.stdout)),
                            stderr: Some(lossy(&cmd.stderr)),
                            exit_code: cmd.exit_code,
                        };
                    }
                }
                if changed.changed().await.is_err() {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        };
        match timeout.filter(|t| *t > 0) {
            None => Ok(wait.await),
            Some(t) => tokio::time::timeout(Duration::from_secs(t as u64), wait)
                .await
                .map_err(|_| {
                    DaytonaError::Timeout(ErrorDetails::new(
                        format!("command did not finish within {t} seconds"),
                        Some(408),
                        Some("TIMEOUT"),
                    ))
                }),
        }
    }
}

/// Builder of [`Process::exec`]; await it.
#[derive(Debug)]
#[must_use = "await the builder to run the call"]
pub struct ExecBuilder {
    ctx: Ctx,
    command: String,
    cwd: Option<String>,
    env: BTreeMap<String, String>,
    timeout: Option<i64>,
    code: Option<String>,
    /// The language of `code` when the caller names it (the wire's `CodeRunRequest`);
    /// otherwise the sandbox's `code-toolbox-language` label decides.
    language: Option<String>,
}

impl ExecBuilder {
    /// `cwd=None`: working directory (relative → the work dir).
    pub fn cwd(mut self, cwd: impl crate::OptionalString) -> Self {
        self.cwd = cwd.into_optional();
        self
    }

    /// `env=None`: extra environment for this command only; values are literal.
    pub fn env<K: Into<String>, V: Into<String>>(
        mut self,
        env: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        self.env = env.into_iter().map(|(k, v)| (k.into(), v.into())).collect();
        self
    }

    /// `timeout=None`: seconds; on expiry the process group is killed and the call raises.
    pub fn timeout(mut self, seconds: impl Into<Option<i64>>) -> Self {
        self.timeout = seconds.into();
        self
    }

    async fn run(self) -> Result<ExecuteResponse> {
        self.run_inner().await.ctx("Failed to execute command: ")
    }

    async fn run_inner(mut self) -> Result<ExecuteResponse> {
        if let Some(code) = self.code.take() {
            let language = match self.language.take() {
                Some(language) => {
                    translate::check_language(&language)?;
                    language
                }
                None => {
                    let info = self.ctx.backend().get(&self.ctx.id).await?;
                    let meta = self.ctx.meta().await?;
                    let labels = meta.labels.unwrap_or(info.labels);
                    labels
                        .get(LANGUAGE_LABEL)
                        .cloned()
                        .unwrap_or_else(|| "python".into())
                }
            };
            let argv: Vec<String> = self.command.split_whitespace().map(str::to_owned).collect();
            self.command = translate::code_run_command(&language, &code, &argv);
        }
        if self.command.trim().is_empty() {
            return Err(DaytonaError::validation("command is required"));
        }
        for k in self.env.keys() {
            translate::check_env_name(k)?;
        }
        if self.timeout.is_some_and(|t| t < 0) {
            return Err(DaytonaError::validation(
                "timeout must be a non-negative integer",
            ));
        }
        let cwd = self.ctx.resolve(self.cwd.as_deref().unwrap_or(""));
        let mut spec = ProcessSpec::new(sandcove::Command::Shell {
            script: translate::exec_script(&self.command),
            shell: "/bin/bash".into(),
            login: false,
        });
        spec.cwd = Some(cwd.clone());
        spec.envs = self.env;
        spec.timeout = self
            .timeout
            .filter(|t| *t > 0)
            .map(|t| Duration::from_secs(t as u64));
        let stream = match self.ctx.backend().spawn(&self.ctx.id, spec).await {
            Ok(s) => s,
            Err(e) if e.is_not_found() && self.cwd.is_some() => {
                // Daytona's daemon cannot start the process: exit -1 and the Go error text.
                let result = format!("chdir {cwd}: no such file or directory");
                return Ok(ExecuteResponse {
                    exit_code: -1,
                    artifacts: Some(ExecutionArtifacts {
                        stdout: result.clone(),
                        charts: Some(vec![]),
                    }),
                    result,
                });
            }
            Err(e) => return Err(e.into()),
        };
        let (combined, status) = combined_output(stream).await?;
        if status.timed_out {
            return Err(DaytonaError::Timeout(ErrorDetails::new(
                "command execution timeout",
                Some(408),
                Some("PROCESS_EXECUTION_TIMEOUT"),
            )));
        }
        let result = String::from_utf8_lossy(&combined).into_owned();
        Ok(ExecuteResponse {
            exit_code: i64::from(status.code_or_signal()),
            artifacts: Some(ExecutionArtifacts {
                stdout: result.clone(),
                charts: Some(vec![]),
            }),
            result,
        })
    }
}
awaitable!(ExecBuilder => ExecuteResponse);

/// Builder of [`Process::code_run`]; await it.
#[derive(Debug)]
#[must_use = "await the builder to run the call"]
pub struct CodeRunBuilder {
    exec: ExecBuilder,
    params: Option<CodeRunParams>,
}

impl CodeRunBuilder {
    /// `params=None`: argv and env for the run.
    pub fn params(mut self, params: impl Into<Option<CodeRunParams>>) -> Self {
        self.params = params.into();
        self
    }

    /// `timeout=None`: seconds, as in `exec`.
    pub fn timeout(mut self, seconds: impl Into<Option<i64>>) -> Self {
        self.exec.timeout = seconds.into();
        self
    }

    /// Run `code` as `language` instead of the sandbox's language label (the wire's
    /// `CodeRunRequest.language`).
    #[cfg(feature = "wire")]
    pub(crate) fn language(mut self, language: Option<String>) -> Self {
        self.exec.language = language;
        self
    }

    async fn run(mut self) -> Result<ExecuteResponse> {
        if let Some(p) = self.params.take() {
            // The argv words ride in `command` until the language is known (see run_inner).
            self.exec.command = p.argv.unwrap_or_default().join(" ");
            self.exec.env = p.env.unwrap_or_default().into_iter().collect();
        }
        self.exec.run().await
    }
}
awaitable!(CodeRunBuilder => ExecuteResponse);

/// Builder of [`Process::execute_session_command`]; await it.
#[derive(Debug)]
#[must_use = "await the builder to run the call"]
pub struct SessionExecuteBuilder {
    process: Process,
    session_id: String,
    req: SessionExecuteRequest,
    timeout: Option<i64>,
}

impl SessionExecuteBuilder {
    /// `timeout=None`: seconds to wait for a synchronous command (it keeps running after).
    pub fn timeout(mut self, seconds: impl Into<Option<i64>>) -> Self {
        self.timeout = seconds.into();
        self
    }

    async fn run(self) -> Result<SessionExecuteResponse> {
        self.process
            .execute(&self.session_id, self.req, self.timeout)
            .await
            .ctx("Failed to execute session command: ")
    }
}
awaitable!(SessionExecuteBuilder => SessionExecuteResponse);

/// Collect a process's stdout and stderr into one buffer in arrival order.
async fn combined_output(mut stream: ProcessStream) -> Result<(Vec<u8>, sandcove::ExitStatus)> {
    let mut out = Vec::new();
    while let Some(ev) = stream.events.next().await {
        match ev? {
            ProcessEvent::Stdout(b) | ProcessEvent::Stderr(b) => out.extend_from_slice(&b),
            ProcessEvent::Exit(status) => return Ok((out, status)),
            _ => {}
        }
    }
    Err(DaytonaError::from(sandcove::Error::backend(
        "process stream ended without an exit status",
    )))
}

// ----- sessions -----

const SESSION_TAG: &str = "daytona-session-";
const MARK_OPEN: &[u8] = b"\x1e\x1fdtn:";
const MARK_CLOSE: &[u8] = b"\x1f\x1e";
/// A start marker longer than this is treated as output (it cannot be ours).
const MARK_MAX: usize = 16 * 1024 * 1024;

fn session_tag(session_id: &str) -> String {
    format!("{SESSION_TAG}{session_id}")
}

fn check_session_id(id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id != "entrypoint"
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && !id.starts_with('.');
    if ok {
        Ok(())
    } else {
        Err(DaytonaError::validation(format!(
            "invalid session id {id:?}: use letters, digits, '-', '_' and '.'"
        )))
    }
}

fn command_not_found(id: &str) -> DaytonaError {
    DaytonaError::NotFound(ErrorDetails::new(
        format!("command {id} not found"),
        Some(404),
        Some("COMMAND_NOT_FOUND"),
    ))
}

/// A command id: 20 random characters, as unguessable as the runtime's own ids.
fn new_id() -> String {
    sandcove::random_id(20)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    (0..s.len())
        .step_by(2)
        .map(|i| s.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
        .collect()
}

/// The line written to the session shell for one command: start markers, the command
/// itself (stdin closed for synchronous commands), then end markers with the exit code.
///
/// The command travels in this line, quoted for the shell and run with `eval`: nothing of it
/// is kept in a file inside the sandbox, where sandbox code could rewrite it before it runs.
fn driver_line(cmd_id: &str, command: &str, run_async: bool) -> String {
    let stdin = if run_async { "" } else { " </dev/null" };
    format!(
        "printf '\\036\\037dtn:s:{cmd_id}:{hex}\\037\\036'; printf '\\036\\037dtn:s:{cmd_id}\\037\\036' >&2; \
         eval {quoted}{stdin}; __dtn_ec=$?; \
         printf '\\036\\037dtn:e:{cmd_id}:%d\\037\\036' \"$__dtn_ec\"; \
         printf '\\036\\037dtn:e:{cmd_id}:%d\\037\\036' \"$__dtn_ec\" >&2\n",
        hex = hex(command.as_bytes()),
        quoted = translate::quote(command),
    )
}

/// One piece of a session stream: output bytes, or a marker body.
#[derive(Debug, PartialEq)]
enum Piece {
    Data(Vec<u8>),
    Marker(String),
}

/// Splits a byte stream into output and markers; a marker may arrive split across chunks.
#[derive(Debug, Default)]
struct MarkerParser {
    pending: Vec<u8>,
}

impl MarkerParser {
    fn feed(&mut self, bytes: &[u8]) -> Vec<Piece> {
        self.pending.extend_from_slice(bytes);
        let mut out = Vec::new();
        loop {
            match find(&self.pending, MARK_OPEN) {
                Some(i) => {
                    if i > 0 {
                        out.push(Piece::Data(self.pending[..i].to_vec()));
                        self.pending.drain(..i);
                    }
                    match find(&self.pending[MARK_OPEN.len()..], MARK_CLOSE) {
                        Some(j) => {
                            let body = &self.pending[MARK_OPEN.len()..MARK_OPEN.len() + j];
                            out.push(Piece::Marker(String::from_utf8_lossy(body).into_owned()));
                            self.pending.drain(..MARK_OPEN.len() + j + MARK_CLOSE.len());
                        }
                        None if self.pending.len() > MARK_MAX => {
                            out.push(Piece::Data(self.pending[..MARK_OPEN.len()].to_vec()));
                            self.pending.drain(..MARK_OPEN.len());
                        }
                        None => return out,
                    }
                }
                None => {
                    // Keep a tail that may be the start of a marker.
                    let keep = (1..MARK_OPEN.len())
                        .rev()
                        .find(|&k| self.pending.ends_with(&MARK_OPEN[..k]))
                        .unwrap_or(0);
                    let cut = self.pending.len() - keep;
                    if cut > 0 {
                        out.push(Piece::Data(self.pending[..cut].to_vec()));
                        self.pending.drain(..cut);
                    }
                    return out;
                }
            }
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Output of one session command.
#[derive(Debug, Clone, Default)]
struct CmdState {
    id: String,
    command: String,
    exit_code: Option<i64>,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    output: Vec<u8>,
    /// (is stderr, bytes) in arrival order, for followers.
    chunks: Vec<(bool, Vec<u8>)>,
    out_done: bool,
    err_done: bool,
}

impl CmdState {
    fn command(&self) -> Command {
        Command {
            id: self.id.clone(),
            command: self.command.clone(),
            exit_code: self.exit_code,
        }
    }

    fn is_done(&self) -> bool {
        self.exit_code.is_some() && self.out_done && self.err_done
    }
}

#[derive(Debug, Default)]
struct SessionInner {
    commands: Vec<CmdState>,
    parsers: [MarkerParser; 2],
    current: [Option<usize>; 2],
    ended: bool,
}

impl SessionInner {
    fn find(&self, id: &str) -> Option<&CmdState> {
        self.commands.iter().find(|c| c.id == id)
    }

    fn feed(&mut self, is_err: bool, bytes: &[u8]) {
        let s = usize::from(is_err);
        let pieces = self.parsers[s].feed(bytes);
        for piece in pieces {
            match piece {
                Piece::Data(d) => {
                    if let Some(i) = self.current[s] {
                        let cmd = &mut self.commands[i];
                        if is_err {
                            cmd.stderr.extend_from_slice(&d);
                        } else {
                            cmd.stdout.extend_from_slice(&d);
                        }
                        cmd.output.extend_from_slice(&d);
                        cmd.chunks.push((is_err, d));
                    }
                }
                Piece::Marker(body) => {
                    let mut parts = body.splitn(3, ':');
                    let (kind, id, rest) = (parts.next(), parts.next(), parts.next());
                    let Some(id) = id else { continue };
                    match kind {
                        Some("s") => {
                            let command = rest
                                .and_then(unhex)
                                .map(|b| String::from_utf8_lossy(&b).into_owned());
                            let idx = match self.commands.iter().position(|c| c.id == id) {
                                Some(i) => i,
                                None => {
                                    self.commands.push(CmdState {
                                        id: id.to_string(),
                                        ..Default::default()
                                    });
                                    self.commands.len() - 1
                                }
                            };
                            // The stderr marker (no text) may arrive before the stdout one.
                            if let Some(command) = command {
                                if self.commands[idx].command.is_empty() {
                                    self.commands[idx].command = command;
                                }
                            }
                            self.current[s] = Some(idx);
                        }
                        Some("e") => {
                            if let Some(i) = self.commands.iter().position(|c| c.id == id) {
                                let cmd = &mut self.commands[i];
                                if let Some(code) = rest.and_then(|r| r.parse().ok()) {
                                    cmd.exit_code = Some(code);
                                }
                                if is_err {
                                    cmd.err_done = true;
                                } else {
                                    cmd.out_done = true;
                                }
                            }
                            self.current[s] = None;
                        }
                        _ => {}
                    }
                }
            }
        }
    }
}

#[derive(Debug)]
struct SessionState {
    /// The shell's pid in the sandbox.
    pid: u32,
    inner: Mutex<SessionInner>,
    version: tokio::sync::watch::Sender<u64>,
    submit: tokio::sync::Mutex<()>,
}

impl SessionState {
    fn new(pid: u32) -> Arc<Self> {
        let (version, _) = tokio::sync::watch::channel(0);
        Arc::new(SessionState {
            pid,
            inner: Mutex::new(SessionInner::default()),
            version,
            submit: tokio::sync::Mutex::new(()),
        })
    }

    /// Apply one event of the session shell; returns whether the shell has ended.
    fn apply(&self, ev: sandcove::Result<ProcessEvent>) -> bool {
        let ended = {
            let mut inner = self.inner.lock().expect("session state");
            match ev {
                Ok(ProcessEvent::Stdout(b)) => inner.feed(false, &b),
                Ok(ProcessEvent::Stderr(b)) => inner.feed(true, &b),
                Ok(ProcessEvent::Exit(_)) | Err(_) => inner.ended = true,
                Ok(_) => {}
            }
            inner.ended
        };
        self.version.send_modify(|v| *v += 1);
        ended
    }

    /// Follow the shell's events in the background for as long as the state is in use.
    fn follow(self: &Arc<Self>, stream: ProcessStream) {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut events = stream.events;
            while let Some(ev) = events.next().await {
                let Some(state) = weak.upgrade() else { return };
                if state.apply(ev) {
                    return;
                }
            }
            if let Some(state) = weak.upgrade() {
                state.apply(Err(sandcove::Error::backend("session stream ended")));
            }
        });
    }

    /// State for a shell this program just started.
    fn start(stream: ProcessStream) -> Arc<Self> {
        let state = Self::new(stream.pid);
        state.follow(stream);
        state
    }

    /// State rebuilt from an attached shell: the retained output (everything before the
    /// attach's live marker) is applied before this returns, then live events follow.
    async fn rebuild(mut stream: ProcessStream) -> Arc<Self> {
        let state = Self::new(stream.pid);
        loop {
            match stream.events.next().await {
                Some(Ok(ProcessEvent::Live)) => break,
                Some(ev) => {
                    if state.apply(ev) {
                        return state;
                    }
                }
                None => {
                    state.apply(Err(sandcove::Error::backend("session stream ended")));
                    return state;
                }
            }
        }
        state.follow(stream);
        state
    }

    /// The Python `Session` as seen so far.
    fn snapshot(&self, session_id: &str) -> Session {
        let inner = self.inner.lock().expect("session state");
        Session {
            session_id: session_id.to_string(),
            commands: inner.commands.iter().map(CmdState::command).collect(),
        }
    }

    /// Wait (briefly) for a command id this program has not seen yet to show up.
    async fn wait_for(&self, cmd_id: &str) {
        let mut changed = self.version.subscribe();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
        loop {
            if self
                .inner
                .lock()
                .expect("session state")
                .find(cmd_id)
                .is_some()
            {
                return;
            }
            if tokio::time::timeout_at(deadline, changed.changed())
                .await
                .map_or(true, |r| r.is_err())
            {
                return;
            }
        }
    }
}

type Registry = Mutex<HashMap<(String, String), Arc<SessionState>>>;

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

/// Forget this program's session state, as if another program made the next call (the
/// state is then rebuilt by attaching to the session shells). For tests.
#[doc(hidden)]
pub fn forget_sessions() {
    registry().lock().expect("session registry").clear();
}

/// Drop this program's session state of a deleted (or stopped) sandbox.
pub(crate) fn forget_sandbox(sandbox_id: &str) {
    registry()
        .lock()
        .expect("session registry")
        .retain(|(sb, _), _| sb != sandbox_id);
}

fn key(ctx: &Ctx, session_id: &str) -> (String, String) {
    (ctx.id.to_string(), session_id.to_string())
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Decode the complete UTF-8 prefix of `buf` (invalid bytes replaced), leaving an incomplete
/// trailing sequence in `buf` for the next chunk.
fn take_utf8(buf: &mut Vec<u8>) -> String {
    let keep = match std::str::from_utf8(buf) {
        Ok(_) => 0,
        Err(e) if e.error_len().is_none() => buf.len() - e.valid_up_to(),
        Err(_) => {
            // Invalid in the middle: find an incomplete tail, if any, after lossy decoding.
            let tail_start = buf.len().saturating_sub(3);
            (tail_start..buf.len())
                .find(|&i| {
                    matches!(std::str::from_utf8(&buf[i..]), Err(e) if e.error_len().is_none() && e.valid_up_to() == 0)
                })
                .map(|i| buf.len() - i)
                .unwrap_or(0)
        }
    };
    let cut = buf.len() - keep;
    let text = String::from_utf8_lossy(&buf[..cut]).into_owned();
    buf.drain(..cut);
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_split_across_chunks_are_found() {
        let mut p = MarkerParser::default();
        let mut all = Vec::new();
        let stream =
            b"ab\x1e\x1fdtn:s:1:6869\x1f\x1ehello\x00\xff\x1e\x1fdtn:e:1:3\x1f\x1etail\x1e";
        for b in stream.chunks(3) {
            all.extend(p.feed(b));
        }
        let mut data = Vec::new();
        let mut markers = Vec::new();
        for piece in all {
            match piece {
                Piece::Data(d) => data.extend(d),
                Piece::Marker(m) => markers.push(m),
            }
        }
        assert_eq!(markers, ["s:1:6869", "e:1:3"]);
        assert_eq!(data, b"abhello\x00\xfftail");
        assert_eq!(p.pending, b"\x1e");
    }

    #[test]
    fn session_state_routes_output_per_command_and_stream() {
        let mut s = SessionInner::default();
        s.feed(false, b"\x1e\x1fdtn:s:c1:6563686f\x1f\x1eout\n");
        s.feed(
            true,
            b"\x1e\x1fdtn:s:c1\x1f\x1eerr\n\x1e\x1fdtn:e:c1:2\x1f\x1e",
        );
        assert!(!s.find("c1").unwrap().is_done());
        s.feed(false, b"\x1e\x1fdtn:e:c1:2\x1f\x1elate");
        let c = s.find("c1").unwrap();
        assert!(c.is_done());
        assert_eq!(c.command, "echo");
        assert_eq!(c.exit_code, Some(2));
        assert_eq!(c.stdout, b"out\n");
        assert_eq!(c.stderr, b"err\n");
        assert_eq!(c.output, b"out\nerr\n");
    }

    #[test]
    fn utf8_is_decoded_across_chunk_boundaries() {
        let mut buf = "é".as_bytes()[..1].to_vec();
        assert_eq!(take_utf8(&mut buf), "");
        buf.extend_from_slice(&"é".as_bytes()[1..]);
        assert_eq!(take_utf8(&mut buf), "é");
        let mut bad = vec![b'a', 0xff, b'b'];
        assert_eq!(take_utf8(&mut bad), "a\u{fffd}b");
    }

    #[test]
    fn session_ids_and_driver_lines() {
        assert!(check_session_id("exec-session-1").is_ok());
        for bad in ["", "entrypoint", "a/b", "a b", ".x"] {
            assert!(check_session_id(bad).is_err(), "{bad}");
        }
        let line = driver_line("c1", "echo hi", false);
        assert!(line.contains("dtn:s:c1:6563686f206869"));
        // The command is in the line itself, quoted: no file in the sandbox holds it.
        assert!(line.contains("eval 'echo hi' </dev/null;"), "{line}");
        assert!(line.ends_with('\n'));
        assert!(!driver_line("c1", "x", true).contains("/dev/null"));
        assert!(driver_line("c1", "a'b", true).contains(r#"eval 'a'\''b';"#));
        assert_eq!(unhex("6869").unwrap(), b"hi");
    }
}
