//! `e2b_code_interpreter`: a `Sandbox` with stateful code execution (`run_code`).
//!
//! Each code context is one interpreter of the shared driver (`sandcove-interpreter`),
//! started on first use; variables, imports and functions persist between calls in the same
//! context. This module only reshapes the driver's events into E2B's types (`Execution.text`
//! is the main result's `repr`). Contexts are tagged processes, so another program that
//! connects to the sandbox finds them with `list_code_contexts`.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::future::IntoFuture;
use std::ops::Deref;
use std::sync::Arc;

use sandcove_interpreter::{
    mime, CellError, CellResult, ContextOptions, Event, Interpreter, RunOptions, Utf8Decoder,
};
use tokio::sync::Mutex;

use crate::call::{BoxFuture, Call, IntoSeconds};
use crate::errors::SandboxException;
use crate::gaps::refuse;
use crate::sandbox::{ConnectBuilder, CreateBuilder};
use crate::translate::{self, py_list};

type Res<T> = crate::errors::Result<T>;

pub use crate::sandbox::{SandboxInfo, SandboxPaginator, SandboxQuery, SandboxState};

/// The code interpreter's default template, `"code-interpreter-v1"` (the base filesystem
/// here, which has python3).
pub const DEFAULT_TEMPLATE: &str = "code-interpreter-v1";

/// `run_code`'s default timeout, seconds.
pub const DEFAULT_RUN_CODE_TIMEOUT: f64 = 300.0;

/// The context `run_code` uses when given none.
pub(crate) const DEFAULT_CONTEXT_ID: &str = "default";

/// `e2b_code_interpreter.Sandbox`: an `e2b::Sandbox` (it derefs to one) plus `run_code` and
/// code contexts.
#[derive(Debug, Clone)]
pub struct Sandbox {
    base: crate::Sandbox,
    contexts: Arc<Mutex<HashMap<String, sandcove_interpreter::Context>>>,
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
            kept: Default::default(),
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
        let sandbox = self.clone();
        Call::new(async move {
            let ctx = &sandbox.base.ctx;
            let listed = sandbox.interpreter().list_contexts().await?;
            Ok(listed
                .into_iter()
                .map(|c| Context {
                    id: c.id,
                    language: c.language,
                    cwd: ctx.e2b_path(&c.cwd),
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
            let found = sandbox.existing(&id).await?;
            found.delete().await?;
            Ok(())
        })
    }

    /// `sandbox.restart_code_context(context)`: a fresh interpreter with the same id, cwd and
    /// language; all state is lost.
    pub fn restart_code_context(&self, context: impl Into<ContextId>) -> Call<()> {
        let id = context.into().0;
        let sandbox = self.clone();
        Call::new(async move {
            let found = sandbox.existing(&id).await?;
            found.restart().await?;
            sandbox.contexts.lock().await.insert(id, found);
            Ok(())
        })
    }

    fn interpreter(&self) -> Interpreter {
        let ctx = &self.base.ctx;
        Interpreter::new(ctx.backend.clone(), ctx.id.clone())
    }

    /// A live context by id (started by any program), as E2B's `NotFoundException` if none.
    async fn existing(&self, id: &str) -> Res<sandcove_interpreter::Context> {
        match self.interpreter().context(id).await {
            Ok(c) => Ok(c),
            Err(e) if e.is_not_found() => Err(SandboxException::not_found(format!(
                "context '{id}' not found"
            ))),
            Err(e) => Err(e.into()),
        }
    }

    /// The context a run goes to: cached, else found, else (only the default one) started.
    async fn context(&self, id: &str) -> Res<sandcove_interpreter::Context> {
        let mut map = self.contexts.lock().await;
        if let Some(c) = map.get(id) {
            if !c.ended() {
                return Ok(c.clone());
            }
            map.remove(id);
        }
        let context = if id == DEFAULT_CONTEXT_ID {
            let ctx = &self.base.ctx;
            let options = ContextOptions::new().id(id).envs(translate::process_envs(
                &ctx.envs,
                &ctx.id,
                &BTreeMap::new(),
            ));
            self.interpreter().get_or_create_context(options).await?
        } else {
            self.existing(id).await?
        };
        map.insert(id.to_string(), context.clone());
        Ok(context)
    }
}

/// The languages a context can run: Python (the sandbox's `python3`).
fn check_language(language: Option<&str>) -> Res<String> {
    sandcove_interpreter::check_language(language)
        .map(str::to_string)
        .map_err(|_| refuse("code_language"))
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
    /// Bytes of its representations (what an [`Execution`] counts against its budget).
    fn size(&self) -> usize {
        let strings = [
            &self.text,
            &self.html,
            &self.markdown,
            &self.svg,
            &self.png,
            &self.jpeg,
            &self.pdf,
            &self.latex,
            &self.javascript,
        ];
        let values = [&self.json, &self.data, &self.chart, &self.extra];
        strings
            .iter()
            .filter_map(|v| v.as_ref())
            .map(String::len)
            .sum::<usize>()
            + values
                .iter()
                .filter_map(|v| v.as_ref())
                .map(|v| v.to_string().len())
                .sum::<usize>()
    }

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
    /// What the returned `Execution` may still hold (a cell can print without end).
    kept: sandcove_interpreter::OutputBudget,
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
        let mut run = self
            .sandbox
            .start_run(
                std::mem::take(&mut self.code),
                self.context.take(),
                self.language.take(),
                std::mem::take(&mut self.envs),
                translate::timeout_secs(self.timeout),
            )
            .await?;
        let mut exec = Execution::default();
        while let Some(item) = run.next_item().await {
            match item? {
                ExecItem::Stdout(msg) => {
                    if self.admit(&mut exec, msg.line.len()) {
                        exec.logs.stdout.push(msg.line.clone());
                    }
                    if let Some(f) = self.on_stdout.as_mut() {
                        f(msg);
                    }
                }
                ExecItem::Stderr(msg) => {
                    if self.admit(&mut exec, msg.line.len()) {
                        exec.logs.stderr.push(msg.line.clone());
                    }
                    if let Some(f) = self.on_stderr.as_mut() {
                        f(msg);
                    }
                }
                ExecItem::Result(r) => {
                    let r = *r;
                    let keep = self.admit(&mut exec, r.size());
                    if r.is_main_result {
                        exec.text = r.text.clone();
                    }
                    if let Some(f) = self.on_result.as_mut() {
                        f(r.clone());
                    }
                    if keep {
                        exec.results.push(r);
                    }
                }
                ExecItem::Error(e) => {
                    if let Some(f) = self.on_error.as_mut() {
                        f(e.clone());
                    }
                    exec.error = Some(e);
                }
                ExecItem::ExecutionCount(n) => exec.execution_count = Some(n),
                ExecItem::End => return Ok(exec),
            }
        }
        Err(interpreter_ended())
    }

    /// Whether `bytes` more output may be kept in `exec`; the first time not, a note says so.
    fn admit(&mut self, exec: &mut Execution, bytes: usize) -> bool {
        use sandcove_interpreter::{Admit, OutputBudget};
        match self.kept.admit(bytes) {
            Admit::Keep => true,
            Admit::FirstDrop => {
                exec.logs.stderr.push(OutputBudget::note());
                false
            }
            Admit::Drop => false,
        }
    }
}

/// One item of an execution as E2B reports it: the Rust `run_code` folds these into an
/// [`Execution`] and the wire's `POST /execute` sends each as one NDJSON line, so both
/// read the driver the same way.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ExecItem {
    /// Decoded stdout text.
    Stdout(OutputMessage),
    /// Decoded stderr text.
    Stderr(OutputMessage),
    /// A result (the main one or a displayed one); boxed, it is much the largest item.
    Result(Box<Result>),
    /// The exception the code raised.
    Error(ExecutionError),
    /// The context's execution count.
    ExecutionCount(i64),
    /// The execution is over (always last).
    End,
}

/// A running execution, as [`ExecItem`]s.
pub(crate) struct RunItems {
    // Kept alive with the run; the wire also answers which context a run is in.
    #[cfg_attr(not(feature = "wire"), allow(dead_code))]
    context: sandcove_interpreter::Context,
    events: sandcove_interpreter::Execution,
    out: Utf8Decoder,
    err: Utf8Decoder,
    pending: std::collections::VecDeque<ExecItem>,
    done: bool,
}

impl RunItems {
    /// The context the code runs in.
    #[cfg(feature = "wire")]
    pub(crate) fn context(&self) -> &sandcove_interpreter::Context {
        &self.context
    }

    /// Whether the execution ended (its [`ExecItem::End`] or an error was returned).
    #[cfg(feature = "wire")]
    pub(crate) fn finished(&self) -> bool {
        self.done && self.pending.is_empty()
    }

    /// The next item; `None` after [`ExecItem::End`] or an error. A timeout of the run is
    /// E2B's `TimeoutException`.
    pub(crate) async fn next_item(&mut self) -> Option<Res<ExecItem>> {
        loop {
            if let Some(item) = self.pending.pop_front() {
                return Some(Ok(item));
            }
            if self.done {
                return None;
            }
            let Some(event) = self.events.next_event().await else {
                self.done = true;
                return Some(Err(interpreter_ended()));
            };
            let event = match event {
                Ok(event) => event,
                Err(e) => {
                    self.done = true;
                    if e.code() == sandcove::ErrorCode::Timeout {
                        return Some(Err(execution_timeout()));
                    }
                    return Some(Err(e.into()));
                }
            };
            match event {
                Event::Stdout(chunk) => {
                    let text = self.out.decode(&chunk.data);
                    self.push_output(text, chunk.timestamp_ns, false);
                }
                Event::Stderr(chunk) => {
                    let text = self.err.decode(&chunk.data);
                    self.push_output(text, chunk.timestamp_ns, true);
                }
                Event::Result(r) => self
                    .pending
                    .push_back(ExecItem::Result(Box::new(to_result(r)))),
                Event::Error(e) => self.pending.push_back(ExecItem::Error(to_error(e))),
                Event::ExecutionCount(n) => {
                    if let Ok(n) = i64::try_from(n) {
                        self.pending.push_back(ExecItem::ExecutionCount(n));
                    }
                }
                Event::End => {
                    let (o, e) = (self.out.finish(), self.err.finish());
                    self.push_output(o, None, false);
                    self.push_output(e, None, true);
                    self.pending.push_back(ExecItem::End);
                    self.done = true;
                }
                _ => {}
            }
        }
    }

    fn push_output(&mut self, line: String, ts: Option<i64>, error: bool) {
        if line.is_empty() {
            return;
        }
        let msg = OutputMessage {
            line,
            timestamp: ts.unwrap_or_else(|| (sandcove::now_millis() as i64) * 1_000_000),
            error,
        };
        self.pending.push_back(if error {
            ExecItem::Stderr(msg)
        } else {
            ExecItem::Stdout(msg)
        });
    }
}

impl Sandbox {
    /// The code interpreter of the sandbox behind `ctx` (the wire's handle: no context
    /// cache survives the request).
    #[cfg(feature = "wire")]
    pub(crate) fn from_ctx(ctx: crate::sandbox::Ctx) -> Sandbox {
        Sandbox::from(crate::Sandbox::from_ctx(ctx, Default::default()))
    }

    /// Start running `code`: in context `context` (an id), else in the default context of
    /// `language` (only Python). What `run_code` and `POST /execute` both do.
    pub(crate) async fn start_run(
        &self,
        code: String,
        context: Option<String>,
        language: Option<String>,
        envs: BTreeMap<String, String>,
        timeout: Option<std::time::Duration>,
    ) -> Res<RunItems> {
        if language.is_some() && context.is_some() {
            return Err(SandboxException::invalid_argument(
                "You can provide context or language, but not both at the same time.",
            ));
        }
        check_language(language.as_deref())?;
        let id = context.unwrap_or_else(|| DEFAULT_CONTEXT_ID.to_string());
        let context = self.context(&id).await?;
        let options = RunOptions::new().envs(envs).timeout(timeout);
        let events = context.run(code, options).await?;
        Ok(RunItems {
            context,
            events,
            out: Utf8Decoder::default(),
            err: Utf8Decoder::default(),
            pending: Default::default(),
            done: false,
        })
    }
}

fn interpreter_ended() -> SandboxException {
    SandboxException::sandbox("the code context's interpreter ended")
}

/// E2B's `Result` from the driver's MIME bundle; types E2B has no field for go to `extra`.
fn to_result(r: CellResult) -> Result {
    let mut out = Result {
        is_main_result: r.is_main_result,
        ..Default::default()
    };
    let mut extra = serde_json::Map::new();
    for (kind, value) in r.data {
        let text = || value.as_str().map(str::to_string);
        match kind.as_str() {
            mime::TEXT => out.text = text(),
            mime::HTML => out.html = text(),
            mime::MARKDOWN => out.markdown = text(),
            mime::SVG => out.svg = text(),
            mime::PNG => out.png = text(),
            mime::JPEG => out.jpeg = text(),
            mime::PDF => out.pdf = text(),
            mime::LATEX => out.latex = text(),
            mime::JAVASCRIPT => out.javascript = text(),
            mime::JSON => out.json = Some(value),
            _ => {
                extra.insert(kind, value);
            }
        }
    }
    if !extra.is_empty() {
        out.extra = Some(serde_json::Value::Object(extra));
    }
    out
}

fn to_error(e: CellError) -> ExecutionError {
    ExecutionError {
        name: e.name,
        value: e.value,
        traceback: e.traceback,
    }
}

fn execution_timeout() -> SandboxException {
    SandboxException::timeout(
        "Execution timed out — the 'timeout' option can be used to increase this timeout",
    )
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
            let ctx = self.sandbox.base.ctx.clone();
            let cwd = self
                .cwd
                .clone()
                .unwrap_or_else(|| translate::E2B_HOME.into());
            let options = ContextOptions::new()
                .language(language.clone())
                .cwd(ctx.path(&cwd))
                .envs(translate::process_envs(
                    &ctx.envs,
                    &ctx.id,
                    &BTreeMap::new(),
                ));
            let context = self.sandbox.interpreter().create_context(options).await?;
            let id = context.id().to_string();
            let cwd = ctx.e2b_path(&context.info().cwd);
            self.sandbox
                .contexts
                .lock()
                .await
                .insert(id.clone(), context);
            Ok(Context { id, language, cwd })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn driver_results_map_onto_e2b_fields() {
        let r = to_result(CellResult {
            data: BTreeMap::from([
                (mime::TEXT.to_string(), "'x'".into()),
                (mime::HTML.to_string(), "<b>x</b>".into()),
                (mime::JSON.to_string(), serde_json::json!({"a": 1})),
                ("text/csv".to_string(), "a,b".into()),
            ]),
            is_main_result: true,
        });
        assert_eq!(
            r.text.as_deref(),
            Some("'x'"),
            "E2B keeps the repr's quotes"
        );
        assert_eq!(r.html.as_deref(), Some("<b>x</b>"));
        assert_eq!(r.json, Some(serde_json::json!({"a": 1})));
        assert_eq!(r.extra, Some(serde_json::json!({"text/csv": "a,b"})));
        assert_eq!(r.formats(), ["text", "html", "json"]);
    }

    #[test]
    fn only_python_is_offered() {
        assert_eq!(check_language(None).unwrap(), "python");
        assert!(check_language(Some("r")).unwrap_err().is_not_supported());
    }
}
