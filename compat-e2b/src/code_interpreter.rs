//! `e2b_code_interpreter`: a `Sandbox` with stateful code execution (`run_code`).
//!
//! Each code context is one Python driver process in the sandbox (started on first use),
//! fed requests over stdin and answering with line-delimited JSON; variables, imports and
//! functions persist between calls in the same context. Contexts are tagged processes, so
//! another program that connects to the sandbox finds them with `list_code_contexts`.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::future::IntoFuture;
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use sandcove::{Command, ProcessEvent, ProcessSelector, ProcessSpec, Signal};
use tokio::sync::{mpsc, Mutex};

use crate::call::{BoxFuture, Call, IntoSeconds};
use crate::errors::SandboxException;
use crate::gaps::refuse;
use crate::sandbox::{ConnectBuilder, CreateBuilder, Ctx};
use crate::translate::{self, py_list};

type Res<T> = crate::errors::Result<T>;

pub use crate::sandbox::{SandboxInfo, SandboxPaginator, SandboxQuery, SandboxState};

/// The code interpreter's default template, `"code-interpreter-v1"` (the base filesystem
/// here, which has python3).
pub const DEFAULT_TEMPLATE: &str = "code-interpreter-v1";

/// `run_code`'s default timeout, seconds.
pub const DEFAULT_RUN_CODE_TIMEOUT: f64 = 300.0;

const DRIVER_SOURCE: &str = include_str!("interpreter.py");
const DRIVER_PATH: &str = "/tmp/.e2b-code-interpreter.py";
const TAG_PREFIX: &str = "e2b-code-context:";
const DEFAULT_CONTEXT_ID: &str = "default";

/// `e2b_code_interpreter.Sandbox`: an `e2b::Sandbox` (it derefs to one) plus `run_code` and
/// code contexts.
#[derive(Debug, Clone)]
pub struct Sandbox {
    base: crate::Sandbox,
    contexts: Arc<Mutex<HashMap<String, Arc<Driver>>>>,
}

impl Deref for Sandbox {
    type Target = crate::Sandbox;
    fn deref(&self) -> &crate::Sandbox {
        &self.base
    }
}

impl From<crate::Sandbox> for Sandbox {
    fn from(base: crate::Sandbox) -> Self {
        Sandbox {
            base,
            contexts: Arc::new(Mutex::new(HashMap::new())),
        }
    }
}

impl Sandbox {
    /// `Sandbox.create(template=None, ...)` with the code interpreter's default template.
    pub fn create() -> CreateBuilder<Sandbox> {
        CreateBuilder::default().template(DEFAULT_TEMPLATE)
    }

    /// `Sandbox.connect(sandbox_id, timeout=None, **opts)`.
    pub fn connect(sandbox_id: impl Into<String>) -> ConnectBuilder<Sandbox> {
        ConnectBuilder::new(sandbox_id.into(), Default::default())
    }

    /// `Sandbox.kill(sandbox_id) -> bool`.
    pub fn kill(sandbox_id: impl Into<String>) -> Call<bool> {
        crate::Sandbox::kill(sandbox_id)
    }

    /// `Sandbox.set_timeout(sandbox_id, timeout)`.
    pub fn set_timeout(sandbox_id: impl Into<String>, timeout: impl IntoSeconds) -> Call<()> {
        crate::Sandbox::set_timeout(sandbox_id, timeout)
    }

    /// `Sandbox.get_info(sandbox_id) -> SandboxInfo`.
    pub fn get_info(sandbox_id: impl Into<String>) -> Call<SandboxInfo> {
        crate::Sandbox::get_info(sandbox_id)
    }

    /// `Sandbox.list(...) -> SandboxPaginator`.
    pub fn list() -> SandboxPaginator {
        crate::Sandbox::list()
    }

    /// `sandbox.run_code(code, language=None, context=None, on_stdout=None, on_stderr=None,
    /// on_result=None, on_error=None, envs=None, timeout=None, request_timeout=None) ->
    /// Execution`. Errors in the code are reported in `Execution.error`, not raised.
    pub fn run_code(&self, code: impl Into<String>) -> RunCodeBuilder {
        RunCodeBuilder {
            sandbox: self.clone(),
            code: code.into(),
            language: None,
            context: None,
            on_stdout: None,
            on_stderr: None,
            on_result: None,
            on_error: None,
            envs: BTreeMap::new(),
            timeout: Some(DEFAULT_RUN_CODE_TIMEOUT),
        }
    }

    /// `sandbox.create_code_context(cwd=None, language=None, request_timeout=None) -> Context`.
    pub fn create_code_context(&self) -> CreateContextBuilder {
        CreateContextBuilder {
            sandbox: self.clone(),
            cwd: None,
            language: None,
        }
    }

    /// `sandbox.list_code_contexts() -> list[Context]`.
    pub fn list_code_contexts(&self) -> Call<Vec<Context>> {
        let ctx = self.base.ctx.clone();
        Call::new(async move {
            let listed = ctx.backend.list_processes(&ctx.id).await?;
            Ok(listed
                .into_iter()
                .filter(|p| p.exit.is_none())
                .filter_map(|p| {
                    let tag = p.tag?;
                    let (language, id) = parse_tag(&tag)?;
                    Some(Context {
                        id,
                        language,
                        cwd: ctx.e2b_path(&p.cwd),
                    })
                })
                .collect())
        })
    }

    /// `sandbox.remove_code_context(context)`: ends the context's interpreter.
    pub fn remove_code_context(&self, context: impl Into<ContextId>) -> Call<()> {
        let id = context.into().0;
        let sandbox = self.clone();
        Call::new(async move {
            sandbox.contexts.lock().await.remove(&id);
            let ctx = &sandbox.base.ctx;
            let found = find_context_process(ctx, &id).await?;
            let Some(p) = found else {
                return Err(SandboxException::not_found(format!(
                    "context '{id}' not found"
                )));
            };
            kill_and_wait(ctx, p.pid).await
        })
    }

    /// `sandbox.restart_code_context(context)`: a fresh interpreter with the same id, cwd and
    /// language; all state is lost.
    pub fn restart_code_context(&self, context: impl Into<ContextId>) -> Call<()> {
        let id = context.into().0;
        let sandbox = self.clone();
        Call::new(async move {
            let ctx = sandbox.base.ctx.clone();
            let Some(p) = find_context_process(&ctx, &id).await? else {
                return Err(SandboxException::not_found(format!(
                    "context '{id}' not found"
                )));
            };
            let (language, _) = parse_tag(p.tag.as_deref().unwrap_or_default())
                .unwrap_or_else(|| ("python".into(), id.clone()));
            sandbox.contexts.lock().await.remove(&id);
            kill_and_wait(&ctx, p.pid).await?;
            let driver = Driver::start(ctx.clone(), &id, &language, Some(p.cwd)).await?;
            sandbox.contexts.lock().await.insert(id, driver);
            Ok(())
        })
    }

    async fn driver(&self, id: &str, language: &str, cwd: Option<String>) -> Res<Arc<Driver>> {
        let mut map = self.contexts.lock().await;
        if let Some(d) = map.get(id) {
            if !d.exited() {
                return Ok(d.clone());
            }
            map.remove(id);
        }
        let ctx = self.base.ctx.clone();
        let driver = match find_context_process(&ctx, id).await? {
            Some(p) => Driver::attach(ctx, p.pid).await?,
            None if id == DEFAULT_CONTEXT_ID => Driver::start(ctx, id, language, cwd).await?,
            None => {
                return Err(SandboxException::not_found(format!(
                    "context '{id}' not found"
                )))
            }
        };
        map.insert(id.to_string(), driver.clone());
        Ok(driver)
    }
}

/// Kill an interpreter and wait until it has ended, so its tag is free and it is no longer
/// listed.
async fn kill_and_wait(ctx: &Ctx, pid: u32) -> Res<()> {
    match ctx
        .backend
        .signal(&ctx.id, ProcessSelector::Pid(pid), Signal::Kill)
        .await
    {
        Ok(()) => {}
        Err(e) if e.is_not_found() => return Ok(()),
        Err(e) => return Err(e.into()),
    }
    if let Ok(mut stream) = ctx.backend.attach(&ctx.id, ProcessSelector::Pid(pid)).await {
        while let Some(Ok(ev)) = stream.events.next().await {
            if matches!(ev, ProcessEvent::Exit(_)) {
                break;
            }
        }
    }
    Ok(())
}

fn make_tag(language: &str, id: &str) -> String {
    format!("{TAG_PREFIX}{language}:{id}")
}

fn parse_tag(tag: &str) -> Option<(String, String)> {
    let rest = tag.strip_prefix(TAG_PREFIX)?;
    let (language, id) = rest.split_once(':')?;
    Some((language.to_string(), id.to_string()))
}

async fn find_context_process(ctx: &Ctx, id: &str) -> Res<Option<sandcove::ProcessInfo>> {
    let listed = ctx.backend.list_processes(&ctx.id).await?;
    Ok(listed.into_iter().find(|p| {
        p.exit.is_none()
            && p.tag
                .as_deref()
                .and_then(parse_tag)
                .is_some_and(|(_, i)| i == id)
    }))
}

/// The languages a context can run: Python (the sandbox's `python3`).
fn check_language(language: Option<&str>) -> Res<String> {
    match language {
        None | Some("python") | Some("python3") => Ok("python".into()),
        Some(_) => Err(refuse("code_language")),
    }
}

/// Something naming a code context: a [`Context`] or its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContextId(pub String);

impl From<&Context> for ContextId {
    fn from(c: &Context) -> Self {
        ContextId(c.id.clone())
    }
}
impl From<Context> for ContextId {
    fn from(c: Context) -> Self {
        ContextId(c.id)
    }
}
impl From<&str> for ContextId {
    fn from(s: &str) -> Self {
        ContextId(s.to_string())
    }
}
impl From<String> for ContextId {
    fn from(s: String) -> Self {
        ContextId(s)
    }
}

/// `Context`: a code context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Context {
    /// `id`.
    pub id: String,
    /// `language`.
    pub language: String,
    /// `cwd`.
    pub cwd: String,
}

/// A message from a driver process.
#[derive(Debug)]
enum Msg {
    Json(serde_json::Value),
    Stderr(String),
    Exited,
}

/// One running interpreter: its pid and the messages it sends.
#[derive(Debug)]
struct Driver {
    ctx: Ctx,
    pid: u32,
    rx: Mutex<mpsc::UnboundedReceiver<Msg>>,
    exited: Arc<std::sync::atomic::AtomicBool>,
}

impl Driver {
    async fn start(ctx: Ctx, id: &str, language: &str, cwd: Option<String>) -> Res<Arc<Driver>> {
        let data: sandcove::ByteStream = Box::pin(futures::stream::once(async {
            Ok(DRIVER_SOURCE.as_bytes().to_vec())
        }));
        ctx.backend
            .write_file(
                &ctx.id,
                DRIVER_PATH,
                data,
                sandcove::WriteOptions::default(),
            )
            .await?;
        let spec = ProcessSpec {
            command: Command::argv(["python3", "-u", DRIVER_PATH]),
            cwd: cwd.as_deref().map(|c| ctx.path(c)),
            envs: translate::process_envs(&ctx.envs, &ctx.id, &BTreeMap::new()),
            user: None,
            tag: Some(make_tag(language, id)),
            stdin: true,
            timeout: None,
            pty: None,
            restart: None,
        };
        let stream = ctx.backend.spawn(&ctx.id, spec).await?;
        Ok(Driver::from_stream(ctx, stream))
    }

    async fn attach(ctx: Ctx, pid: u32) -> Res<Arc<Driver>> {
        let stream = ctx
            .backend
            .attach(&ctx.id, ProcessSelector::Pid(pid))
            .await?;
        Ok(Driver::from_stream(ctx, stream))
    }

    fn from_stream(ctx: Ctx, stream: sandcove::ProcessStream) -> Arc<Driver> {
        let (tx, rx) = mpsc::unbounded_channel();
        let exited = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = exited.clone();
        let pid = stream.pid;
        let mut events = stream.events;
        tokio::spawn(async move {
            let mut line = Vec::new();
            let mut err = translate::Utf8Decoder::default();
            while let Some(ev) = events.next().await {
                match ev {
                    Ok(ProcessEvent::Stdout(bytes)) => {
                        for b in bytes {
                            if b == b'\n' {
                                if let Ok(v) = serde_json::from_slice(&line) {
                                    let _ = tx.send(Msg::Json(v));
                                }
                                line.clear();
                            } else {
                                line.push(b);
                            }
                        }
                    }
                    Ok(ProcessEvent::Stderr(bytes)) => {
                        let text = err.decode(&bytes);
                        if !text.is_empty() {
                            let _ = tx.send(Msg::Stderr(text));
                        }
                    }
                    Ok(ProcessEvent::Exit(_)) | Err(_) => break,
                    Ok(_) => {}
                }
            }
            flag.store(true, Ordering::SeqCst);
            let _ = tx.send(Msg::Exited);
        });
        Arc::new(Driver {
            ctx,
            pid,
            rx: Mutex::new(rx),
            exited,
        })
    }

    fn exited(&self) -> bool {
        self.exited.load(Ordering::SeqCst)
    }
}

/// `Logs`: output lines of one execution.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Logs {
    /// `stdout`: one item per line.
    pub stdout: Vec<String>,
    /// `stderr`: one item per line.
    pub stderr: Vec<String>,
}

impl fmt::Debug for Logs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Logs(stdout: {}, stderr: {})",
            py_list(&self.stdout),
            py_list(&self.stderr)
        )
    }
}

/// `ExecutionError`: an error raised by the executed code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutionError {
    /// `name`: the exception class, e.g. `NameError`.
    pub name: String,
    /// `value`: its message.
    pub value: String,
    /// `traceback`: the formatted traceback.
    pub traceback: String,
}

/// `OutputMessage`: one line of output, with its time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputMessage {
    /// `line`.
    pub line: String,
    /// `timestamp`: Unix time in nanoseconds.
    pub timestamp: i64,
    /// `error`: whether it came from stderr.
    pub error: bool,
}

impl fmt::Display for OutputMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.line)
    }
}

/// `Result`: one result of an execution (the value of the last expression is the main one).
#[derive(Clone, Default, PartialEq)]
pub struct Result {
    /// `text`: the value's `repr`.
    pub text: Option<String>,
    /// `html`.
    pub html: Option<String>,
    /// `markdown`.
    pub markdown: Option<String>,
    /// `svg`.
    pub svg: Option<String>,
    /// `png` (base64).
    pub png: Option<String>,
    /// `jpeg` (base64).
    pub jpeg: Option<String>,
    /// `pdf`.
    pub pdf: Option<String>,
    /// `latex`.
    pub latex: Option<String>,
    /// `json`.
    pub json: Option<serde_json::Value>,
    /// `javascript`.
    pub javascript: Option<String>,
    /// `data`.
    pub data: Option<serde_json::Value>,
    /// `chart`.
    pub chart: Option<serde_json::Value>,
    /// `extra`.
    pub extra: Option<serde_json::Value>,
    /// `is_main_result`.
    pub is_main_result: bool,
}

impl Result {
    /// `formats()`: the names of the fields present.
    pub fn formats(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        let strs = [
            ("text", &self.text),
            ("html", &self.html),
            ("markdown", &self.markdown),
            ("svg", &self.svg),
            ("png", &self.png),
            ("jpeg", &self.jpeg),
            ("pdf", &self.pdf),
            ("latex", &self.latex),
            ("javascript", &self.javascript),
        ];
        for (name, v) in strs {
            if v.is_some() {
                out.push(name);
            }
        }
        for (name, v) in [
            ("json", &self.json),
            ("data", &self.data),
            ("chart", &self.chart),
        ] {
            if v.is_some() {
                out.push(name);
            }
        }
        out
    }
}

impl fmt::Debug for Result {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Result({})", self.text.as_deref().unwrap_or(""))
    }
}

/// `Execution`: what `run_code` returns.
#[derive(Clone, Default, PartialEq)]
pub struct Execution {
    /// `results`.
    pub results: Vec<Result>,
    /// `logs`.
    pub logs: Logs,
    /// `error`: the error the code raised, if any.
    pub error: Option<ExecutionError>,
    /// `execution_count`.
    pub execution_count: Option<i64>,
    /// `text`: the main result's text (the value of the last expression), else `None`.
    pub text: Option<String>,
}

impl fmt::Debug for Execution {
    /// Python's `repr`: `Execution(Results: [...], Logs: Logs(...), Error: None)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Execution(Results: {:?}, Logs: {:?}, Error: {})",
            self.results,
            self.logs,
            self.error
                .as_ref()
                .map(|e| format!("{e:?}"))
                .unwrap_or_else(|| "None".into())
        )
    }
}

type Callback<T> = Box<dyn FnMut(T) + Send + 'static>;

/// The builder of `run_code(...)`.
#[must_use = "a call does nothing until awaited"]
pub struct RunCodeBuilder {
    sandbox: Sandbox,
    code: String,
    language: Option<String>,
    context: Option<String>,
    on_stdout: Option<Callback<OutputMessage>>,
    on_stderr: Option<Callback<OutputMessage>>,
    on_result: Option<Callback<Result>>,
    on_error: Option<Callback<ExecutionError>>,
    envs: BTreeMap<String, String>,
    timeout: Option<f64>,
}

impl fmt::Debug for RunCodeBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunCodeBuilder")
            .field("code", &self.code)
            .field("language", &self.language)
            .field("context", &self.context)
            .finish_non_exhaustive()
    }
}

impl RunCodeBuilder {
    /// `language=`: `"python"` (the default).
    pub fn language(mut self, language: impl crate::OptionalString) -> Self {
        self.language = language.into_optional();
        self
    }

    /// `context=`: run in this context (exclusive with `language`).
    pub fn context(mut self, context: impl Into<ContextId>) -> Self {
        self.context = Some(context.into().0);
        self
    }

    /// `on_stdout=`: called with each stdout line.
    pub fn on_stdout(mut self, f: impl FnMut(OutputMessage) + Send + 'static) -> Self {
        self.on_stdout = Some(Box::new(f));
        self
    }

    /// `on_stderr=`: called with each stderr line.
    pub fn on_stderr(mut self, f: impl FnMut(OutputMessage) + Send + 'static) -> Self {
        self.on_stderr = Some(Box::new(f));
        self
    }

    /// `on_result=`: called with each result.
    pub fn on_result(mut self, f: impl FnMut(Result) + Send + 'static) -> Self {
        self.on_result = Some(Box::new(f));
        self
    }

    /// `on_error=`: called with the execution error.
    pub fn on_error(mut self, f: impl FnMut(ExecutionError) + Send + 'static) -> Self {
        self.on_error = Some(Box::new(f));
        self
    }

    /// `envs=`: environment variables for this execution only.
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

    /// `timeout=`: seconds (default 300; `0` = none). At expiry the code is interrupted
    /// and `TimeoutException` raised.
    pub fn timeout(mut self, timeout: impl IntoSeconds) -> Self {
        self.timeout = timeout.into_seconds();
        self
    }

    /// `request_timeout=`: accepted; the execution is bounded by `timeout`.
    pub fn request_timeout(self, _secs: impl IntoSeconds) -> Self {
        self
    }

    async fn run(mut self) -> Res<Execution> {
        if self.language.is_some() && self.context.is_some() {
            return Err(SandboxException::invalid_argument(
                "You can provide context or language, but not both at the same time.",
            ));
        }
        let language = check_language(self.language.as_deref())?;
        let id = self
            .context
            .clone()
            .unwrap_or_else(|| DEFAULT_CONTEXT_ID.to_string());
        let driver = self.sandbox.driver(&id, &language, None).await?;
        let mut rx = driver.rx.lock().await;
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let rid = format!(
            "{}-{}-{}",
            std::process::id(),
            sandcove::now_millis(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let request = serde_json::json!({"id": rid, "code": self.code, "envs": self.envs});
        let mut line =
            serde_json::to_vec(&request).map_err(|e| SandboxException::sandbox(e.to_string()))?;
        line.push(b'\n');
        let ctx = &driver.ctx;
        ctx.backend
            .write_stdin(&ctx.id, ProcessSelector::Pid(driver.pid), line)
            .await?;
        let deadline =
            translate::timeout_secs(self.timeout).map(|d| tokio::time::Instant::now() + d);
        let mut exec = Execution::default();
        let mut interrupted = false;
        loop {
            let msg = match deadline {
                Some(at) if !interrupted => match tokio::time::timeout_at(at, rx.recv()).await {
                    Ok(m) => m,
                    Err(_) => {
                        interrupted = true;
                        let _ = ctx
                            .backend
                            .signal(&ctx.id, ProcessSelector::Pid(driver.pid), Signal::Int)
                            .await;
                        continue;
                    }
                },
                _ if interrupted => {
                    match tokio::time::timeout(Duration::from_secs(5), rx.recv()).await {
                        Ok(m) => m,
                        Err(_) => {
                            let _ = ctx
                                .backend
                                .signal(&ctx.id, ProcessSelector::Pid(driver.pid), Signal::Kill)
                                .await;
                            None
                        }
                    }
                }
                _ => rx.recv().await,
            };
            let Some(msg) = msg else {
                return Err(timeout_or_ended(interrupted));
            };
            let v = match msg {
                Msg::Exited => return Err(timeout_or_ended(interrupted)),
                Msg::Stderr(text) => {
                    if !interrupted {
                        self.stderr_line(&mut exec, text);
                    }
                    continue;
                }
                Msg::Json(v) => v,
            };
            if v.get("id").and_then(|i| i.as_str()) != Some(rid.as_str()) {
                continue; // a reply to an earlier request (replayed on attach, or interrupted)
            }
            let text = |k: &str| {
                v.get(k)
                    .and_then(|t| t.as_str())
                    .unwrap_or_default()
                    .to_string()
            };
            match v.get("type").and_then(|t| t.as_str()) {
                Some("stdout") => {
                    let msg = OutputMessage {
                        line: text("text"),
                        timestamp: v.get("timestamp").and_then(|t| t.as_i64()).unwrap_or(0),
                        error: false,
                    };
                    exec.logs.stdout.push(msg.line.clone());
                    if let Some(f) = self.on_stdout.as_mut() {
                        f(msg);
                    }
                }
                Some("stderr") => self.stderr_line(&mut exec, text("text")),
                Some("result") => {
                    let r = Result {
                        text: Some(text("text")),
                        is_main_result: v
                            .get("is_main_result")
                            .and_then(|b| b.as_bool())
                            .unwrap_or(false),
                        ..Default::default()
                    };
                    if r.is_main_result {
                        exec.text = r.text.clone();
                    }
                    if let Some(f) = self.on_result.as_mut() {
                        f(r.clone());
                    }
                    exec.results.push(r);
                }
                Some("error") => {
                    let e = ExecutionError {
                        name: text("name"),
                        value: text("value"),
                        traceback: text("traceback"),
                    };
                    if let Some(f) = self.on_error.as_mut() {
                        f(e.clone());
                    }
                    exec.error = Some(e);
                }
                Some("end") => {
                    exec.execution_count = v.get("execution_count").and_then(|c| c.as_i64());
                    if interrupted {
                        return Err(execution_timeout());
                    }
                    return Ok(exec);
                }
                _ => {}
            }
        }
    }

    fn stderr_line(&mut self, exec: &mut Execution, line: String) {
        let msg = OutputMessage {
            line,
            timestamp: (sandcove::now_millis() as i64) * 1_000_000,
            error: true,
        };
        exec.logs.stderr.push(msg.line.clone());
        if let Some(f) = self.on_stderr.as_mut() {
            f(msg);
        }
    }
}

fn execution_timeout() -> SandboxException {
    SandboxException::timeout(
        "Execution timed out — the 'timeout' option can be used to increase this timeout",
    )
}

fn timeout_or_ended(interrupted: bool) -> SandboxException {
    if interrupted {
        execution_timeout()
    } else {
        SandboxException::sandbox("the code context's interpreter ended")
    }
}

impl IntoFuture for RunCodeBuilder {
    type Output = Res<Execution>;
    type IntoFuture = BoxFuture<'static, Execution>;
    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.run())
    }
}

/// The builder of `create_code_context(...)`.
#[derive(Debug)]
#[must_use = "a call does nothing until awaited"]
pub struct CreateContextBuilder {
    sandbox: Sandbox,
    cwd: Option<String>,
    language: Option<String>,
}

impl CreateContextBuilder {
    /// `cwd=`: the interpreter's working directory (default `/home/user`).
    pub fn cwd(mut self, cwd: impl crate::OptionalString) -> Self {
        self.cwd = cwd.into_optional();
        self
    }

    /// `language=`: `"python"` (the default).
    pub fn language(mut self, language: impl crate::OptionalString) -> Self {
        self.language = language.into_optional();
        self
    }

    /// `request_timeout=`: accepted.
    pub fn request_timeout(self, _secs: impl IntoSeconds) -> Self {
        self
    }
}

impl IntoFuture for CreateContextBuilder {
    type Output = Res<Context>;
    type IntoFuture = BoxFuture<'static, Context>;
    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let language = check_language(self.language.as_deref())?;
            static NEXT: AtomicU64 = AtomicU64::new(1);
            let id = format!(
                "{:x}{:x}{}",
                std::process::id(),
                sandcove::now_millis(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            );
            let ctx = self.sandbox.base.ctx.clone();
            let cwd = self
                .cwd
                .clone()
                .unwrap_or_else(|| translate::E2B_HOME.into());
            let driver = Driver::start(ctx.clone(), &id, &language, Some(cwd.clone())).await?;
            self.sandbox
                .contexts
                .lock()
                .await
                .insert(id.clone(), driver);
            Ok(Context {
                id,
                language,
                cwd: ctx.e2b_path(&ctx.path(&cwd)),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_round_trip() {
        assert_eq!(
            parse_tag(&make_tag("python", "abc")),
            Some(("python".into(), "abc".into()))
        );
        assert_eq!(parse_tag("other"), None);
    }

    #[test]
    fn logs_and_results_print_like_python() {
        let logs = Logs {
            stdout: vec!["hello world\n".into()],
            stderr: vec![],
        };
        assert_eq!(
            format!("{logs:?}"),
            "Logs(stdout: ['hello world\\n'], stderr: [])"
        );
        let r = Result {
            text: Some("2".into()),
            is_main_result: true,
            ..Default::default()
        };
        assert_eq!(format!("{r:?}"), "Result(2)");
        assert_eq!(r.formats(), ["text"]);
        let e = Execution {
            results: vec![r],
            logs,
            ..Default::default()
        };
        assert_eq!(
            format!("{e:?}"),
            "Execution(Results: [Result(2)], Logs: Logs(stdout: ['hello world\\n'], stderr: []), Error: None)"
        );
    }

    #[test]
    fn only_python_is_offered() {
        assert_eq!(check_language(None).unwrap(), "python");
        assert!(check_language(Some("r")).unwrap_err().is_not_supported());
    }
}
