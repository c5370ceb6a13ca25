//! `CodeInterpreter` (Python `blaxel.core.sandbox.CodeInterpreter`): a sandbox with a stateful
//! Python interpreter.
//!
//! Blaxel runs a Jupyter server on port 8888. Here the shared code-context driver
//! (`sandcove-interpreter`) plays that part: each code context is one of its Python
//! interpreters, started in the sandbox and found again by any client. This module only
//! reshapes the driver's events into Blaxel's types (a string result loses its quotes, as
//! Jupyter's `text/plain` shows it).

use std::collections::{BTreeMap, HashMap};
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use sandcove_interpreter::{mime, ContextOptions, Event, Interpreter, RunOptions, Utf8Decoder};
use serde_json::Value;

use crate::errors::{Result as BlResult, SandboxAPIError};
use crate::models::{self, ExpirationPolicy, Port, SandboxCreateConfiguration, SandboxLifecycle};
use crate::sandbox::{into_future, IntoSandboxCreate, SandboxInstance};
use crate::{gaps, state, translate};

/// Id of the default context (the one `run_code` uses without `context=`).
const DEFAULT_CONTEXT_ID: &str = "default";

/// `run_code`'s default timeout, seconds.
const DEFAULT_TIMEOUT_SECS: f64 = 60.0;

/// A sandbox with a stateful code interpreter. Derefs to [`SandboxInstance`], so
/// `ci.process`, `ci.fs`, `ci.delete()` work as on any sandbox.
#[derive(Debug, Clone)]
pub struct CodeInterpreter {
    instance: SandboxInstance,
    /// Context handles already reached, by id (each keeps its interpreter's output stream).
    contexts: Arc<tokio::sync::Mutex<HashMap<String, sandcove_interpreter::Context>>>,
}

impl Deref for CodeInterpreter {
    type Target = SandboxInstance;
    fn deref(&self) -> &SandboxInstance {
        &self.instance
    }
}

/// A code context (`CodeInterpreter.Context`): its own interpreter state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Context {
    /// The context id.
    pub id: String,
}

/// A chunk of output (`CodeInterpreter.OutputMessage`).
#[derive(Debug, Clone, PartialEq)]
pub struct OutputMessage {
    /// The text.
    pub text: String,
    /// Seconds since the epoch.
    pub timestamp: Option<f64>,
    /// Whether it was written to stderr.
    pub is_stderr: bool,
}

/// A value produced by the code (`CodeInterpreter.Result`).
#[derive(Debug, Clone, PartialEq)]
pub struct Result {
    /// The `text/plain` repr, surrounding quotes stripped.
    pub text: Option<String>,
    /// True for the cell's own value.
    pub is_main_result: bool,
    /// Any other keys the interpreter sent.
    pub extra: BTreeMap<String, Value>,
}

/// The error raised by the code (`CodeInterpreter.ExecutionError`).
#[derive(Debug, Clone, PartialEq)]
pub struct ExecutionError {
    /// Exception class name, e.g. `ValueError`.
    pub name: String,
    /// Its message.
    pub value: String,
    /// The formatted traceback.
    pub traceback: String,
}

/// Output of a run (`CodeInterpreter.Logs`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Logs {
    /// Stdout chunks.
    pub stdout: Vec<String>,
    /// Stderr chunks.
    pub stderr: Vec<String>,
}

/// The outcome of `run_code` (`CodeInterpreter.Execution`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Execution {
    /// Values produced.
    pub results: Vec<Result>,
    /// Output.
    pub logs: Logs,
    /// The error raised, if any.
    pub error: Option<ExecutionError>,
    /// How many runs this context has executed.
    pub execution_count: Option<i64>,
}

/// Builder of `CodeInterpreter.create(sandbox=None, safe=True, create_if_not_exist=False)`.
#[derive(Debug)]
pub struct CreateBuilder {
    config: BlResult<SandboxCreateConfiguration>,
    safe: bool,
    create_if_not_exist: bool,
}

impl CreateBuilder {
    /// `safe=` (default true).
    pub fn safe(mut self, safe: bool) -> Self {
        self.safe = safe;
        self
    }

    /// `create_if_not_exist=`.
    pub fn create_if_not_exist(mut self, yes: bool) -> Self {
        self.create_if_not_exist = yes;
        self
    }

    async fn run(self) -> BlResult<CodeInterpreter> {
        let input = self.config?;
        // As in Python: image, ports and lifecycle are forced; only these fields are copied.
        let config = SandboxCreateConfiguration {
            name: input.name,
            envs: input.envs,
            memory: input.memory,
            region: input.region,
            labels: input.labels,
            image: Some(CodeInterpreter::DEFAULT_IMAGE.into()),
            ports: Some(vec![Port {
                target: 8888,
                name: Some("jupyter".into()),
                protocol: "HTTP".into(),
            }]),
            lifecycle: Some(SandboxLifecycle {
                expiration_policies: vec![ExpirationPolicy {
                    r#type: "ttl-idle".into(),
                    value: "30m".into(),
                    action: "delete".into(),
                }],
                terminated_retention: None,
            }),
            ..Default::default()
        };
        let instance = SandboxInstance::create(config)
            .safe(self.safe)
            .create_if_not_exist(self.create_if_not_exist)
            .await?;
        let ci = CodeInterpreter::from_instance(instance);
        ci.context(DEFAULT_CONTEXT_ID).await?;
        Ok(ci)
    }
}
into_future!(CreateBuilder => CodeInterpreter);

type Cb<T> = Box<dyn FnMut(T) + Send + 'static>;

/// Builder of `run_code(code, language=None, context=None, on_stdout=None, on_stderr=None,
/// on_result=None, on_error=None, envs=None, timeout=None, request_timeout=None)`.
pub struct RunCodeBuilder {
    ci: CodeInterpreter,
    code: String,
    language: Option<String>,
    context: Option<Context>,
    on_stdout: Option<Cb<OutputMessage>>,
    on_stderr: Option<Cb<OutputMessage>>,
    on_result: Option<Cb<Result>>,
    on_error: Option<Cb<ExecutionError>>,
    envs: BTreeMap<String, String>,
    timeout: Option<f64>,
    request_timeout: Option<f64>,
    /// What the returned `Execution` may still hold (a cell can print without end).
    kept: sandcove_interpreter::OutputBudget,
}

impl std::fmt::Debug for RunCodeBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunCodeBuilder")
            .field("code", &self.code)
            .field("language", &self.language)
            .field("context", &self.context)
            .finish_non_exhaustive()
    }
}

impl RunCodeBuilder {
    /// `language=`: `python` (the default context); other languages are not supported.
    pub fn language(mut self, language: impl crate::OptionalString) -> Self {
        self.language = language.into_optional();
        self
    }
    /// `context=`: run in this context's state.
    pub fn context(mut self, context: impl Into<Option<Context>>) -> Self {
        self.context = context.into();
        self
    }
    /// `on_stdout=`.
    pub fn on_stdout(mut self, f: impl FnMut(OutputMessage) + Send + 'static) -> Self {
        self.on_stdout = Some(Box::new(f));
        self
    }
    /// `on_stderr=`.
    pub fn on_stderr(mut self, f: impl FnMut(OutputMessage) + Send + 'static) -> Self {
        self.on_stderr = Some(Box::new(f));
        self
    }
    /// `on_result=`.
    pub fn on_result(mut self, f: impl FnMut(Result) + Send + 'static) -> Self {
        self.on_result = Some(Box::new(f));
        self
    }
    /// `on_error=`.
    pub fn on_error(mut self, f: impl FnMut(ExecutionError) + Send + 'static) -> Self {
        self.on_error = Some(Box::new(f));
        self
    }
    /// `envs=`: variables set for this run only.
    pub fn envs<I, K, V>(mut self, envs: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        self.envs = envs
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        self
    }
    /// `timeout=` in seconds (default 60; 0 waits forever).
    pub fn timeout(mut self, seconds: impl crate::Seconds) -> Self {
        self.timeout = seconds.into_seconds();
        self
    }
    /// `request_timeout=` in seconds (accepted; requests here are local).
    pub fn request_timeout(mut self, seconds: impl crate::Seconds) -> Self {
        self.request_timeout = seconds.into_seconds();
        self
    }

    async fn run(mut self) -> BlResult<Execution> {
        let _ = self.request_timeout;
        if self.language.is_some() && self.context.is_some() {
            return Err(SandboxAPIError::value_error(
                "You can provide context or language, but not both at the same time.",
            ));
        }
        check_language(self.language.as_deref())?;
        let id = match &self.context {
            Some(c) => c.id.clone(),
            None => DEFAULT_CONTEXT_ID.to_string(),
        };
        crate::sandbox::touch(&self.ci.ctx.core).await;
        let context = self.ci.context(&id).await?;
        let limit = match self.timeout.unwrap_or(DEFAULT_TIMEOUT_SECS) {
            t if t <= 0.0 || !t.is_finite() => None,
            t => Some(Duration::from_secs_f64(t)),
        };
        let options = RunOptions::new()
            .envs(std::mem::take(&mut self.envs))
            .timeout(limit);
        let mut events = context.run(std::mem::take(&mut self.code), options).await?;
        let mut execution = Execution::default();
        let (mut out, mut err) = (Utf8Decoder::default(), Utf8Decoder::default());
        while let Some(event) = events.next_event().await {
            match event {
                Ok(Event::Stdout(chunk)) => {
                    let text = out.decode(&chunk.data);
                    self.output(&mut execution, text, chunk.timestamp_ns, false);
                }
                Ok(Event::Stderr(chunk)) => {
                    let text = err.decode(&chunk.data);
                    self.output(&mut execution, text, chunk.timestamp_ns, true);
                }
                Ok(Event::Result(r)) => {
                    let keep = self.admit(&mut execution, r.size());
                    let mut extra: BTreeMap<String, Value> = r.data;
                    let text = extra
                        .remove(mime::TEXT)
                        .and_then(|v| v.as_str().map(strip_quotes));
                    let r = Result {
                        text,
                        is_main_result: r.is_main_result,
                        extra,
                    };
                    if let Some(f) = &mut self.on_result {
                        f(r.clone());
                    }
                    if keep {
                        execution.results.push(r);
                    }
                }
                Ok(Event::Error(e)) => {
                    let e = ExecutionError {
                        name: e.name,
                        value: e.value,
                        traceback: e.traceback,
                    };
                    if let Some(f) = &mut self.on_error {
                        f(e.clone());
                    }
                    execution.error = Some(e);
                }
                Ok(Event::ExecutionCount(n)) => execution.execution_count = i64::try_from(n).ok(),
                Ok(Event::End) => {
                    let (o, e) = (out.finish(), err.finish());
                    self.output(&mut execution, o, None, false);
                    self.output(&mut execution, e, None, true);
                    return Ok(execution);
                }
                Ok(_) => {}
                Err(e) if e.code() == sandcove::ErrorCode::Timeout => {
                    return Err(SandboxAPIError::exception(format!(
                        "Code execution timed out after {} seconds",
                        limit.map_or(0.0, |l| l.as_secs_f64())
                    )))
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(SandboxAPIError::exception(
            "the code interpreter exited during the execution",
        ))
    }

    fn output(
        &mut self,
        execution: &mut Execution,
        text: String,
        timestamp_ns: Option<i64>,
        is_stderr: bool,
    ) {
        if text.is_empty() {
            return;
        }
        let timestamp = match timestamp_ns {
            Some(ns) => ns as f64 / 1e9,
            None => sandcove::now_millis() as f64 / 1000.0,
        };
        let message = OutputMessage {
            text: text.clone(),
            timestamp: Some(timestamp),
            is_stderr,
        };
        let keep = self.admit(execution, text.len());
        if is_stderr {
            if keep {
                execution.logs.stderr.push(text);
            }
            if let Some(f) = &mut self.on_stderr {
                f(message);
            }
        } else {
            if keep {
                execution.logs.stdout.push(text);
            }
            if let Some(f) = &mut self.on_stdout {
                f(message);
            }
        }
    }

    /// Whether `bytes` more output may be kept in `execution`; the first time not, a note
    /// says so.
    fn admit(&mut self, execution: &mut Execution, bytes: usize) -> bool {
        use sandcove_interpreter::{Admit, OutputBudget};
        match self.kept.admit(bytes) {
            Admit::Keep => true,
            Admit::FirstDrop => {
                execution.logs.stderr.push(OutputBudget::note());
                false
            }
            Admit::Drop => false,
        }
    }
}
into_future!(RunCodeBuilder => Execution);

/// Builder of `create_code_context(cwd=None, language=None, request_timeout=None)`.
#[derive(Debug)]
pub struct CreateContextBuilder {
    ci: CodeInterpreter,
    cwd: Option<String>,
    language: Option<String>,
    request_timeout: Option<f64>,
}

impl CreateContextBuilder {
    /// `cwd=`: the context's working directory.
    pub fn cwd(mut self, cwd: impl crate::OptionalString) -> Self {
        self.cwd = cwd.into_optional();
        self
    }
    /// `language=`: `python`.
    pub fn language(mut self, language: impl crate::OptionalString) -> Self {
        self.language = language.into_optional();
        self
    }
    /// `request_timeout=` (accepted; requests here are local).
    pub fn request_timeout(mut self, seconds: impl crate::Seconds) -> Self {
        self.request_timeout = seconds.into_seconds();
        self
    }
    async fn run(self) -> BlResult<Context> {
        let _ = self.request_timeout;
        check_language(self.language.as_deref())?;
        let mut options = ContextOptions::new().id(state::random_suffix(16));
        if let Some(cwd) = self.cwd {
            options = options.cwd(translate::expand_working_dir(&cwd, translate::HOME));
        }
        let context = self.ci.interpreter().create_context(options).await?;
        let id = context.id().to_string();
        self.ci.contexts.lock().await.insert(id.clone(), context);
        Ok(Context { id })
    }
}
into_future!(CreateContextBuilder => Context);

/// Python only (the sandbox's `python3`); other languages are Blaxel's gap.
fn check_language(language: Option<&str>) -> BlResult<()> {
    match language {
        None | Some("python") => Ok(()),
        Some(_) => Err(gaps::refuse("code interpreter languages other than python")),
    }
}

/// Jupyter's `text/plain` of a string, as Blaxel shows it: the `repr` without its quotes.
fn strip_quotes(repr: &str) -> String {
    let quoted = repr.len() >= 2
        && (repr.starts_with('\'') && repr.ends_with('\'')
            || repr.starts_with('"') && repr.ends_with('"'));
    if quoted {
        repr[1..repr.len() - 1].to_string()
    } else {
        repr.to_string()
    }
}

impl CodeInterpreter {
    /// `CodeInterpreter.DEFAULT_IMAGE`.
    pub const DEFAULT_IMAGE: &'static str = "blaxel/jupyter-server";

    /// `CodeInterpreter.create(sandbox=None, safe=True, create_if_not_exist=False)`: image,
    /// ports and lifecycle (30-minute idle TTL) are forced; only `name`, `envs`, `memory`,
    /// `region` and `labels` are taken from `sandbox`.
    pub fn create(sandbox: impl IntoSandboxCreate) -> CreateBuilder {
        CreateBuilder {
            config: sandbox.into_create(),
            safe: true,
            create_if_not_exist: false,
        }
    }

    /// `CodeInterpreter.get(sandbox_name)`.
    pub async fn get(sandbox_name: &str) -> BlResult<Self> {
        let instance = SandboxInstance::get(sandbox_name).await?;
        let ci = CodeInterpreter::from_instance(instance);
        ci.context(DEFAULT_CONTEXT_ID).await?;
        Ok(ci)
    }

    /// `ci.run_code(code, …)`: run Python code in the default context (or `context`);
    /// variables persist between runs of a context.
    pub fn run_code(&self, code: &str) -> RunCodeBuilder {
        RunCodeBuilder {
            ci: self.clone(),
            code: code.to_string(),
            language: None,
            context: None,
            on_stdout: None,
            on_stderr: None,
            on_result: None,
            on_error: None,
            envs: BTreeMap::new(),
            timeout: None,
            request_timeout: None,
            kept: Default::default(),
        }
    }

    /// `ci.create_code_context(cwd=None, language=None, request_timeout=None)`.
    pub fn create_code_context(&self) -> CreateContextBuilder {
        CreateContextBuilder {
            ci: self.clone(),
            cwd: None,
            language: None,
            request_timeout: None,
        }
    }

    fn from_instance(instance: SandboxInstance) -> Self {
        CodeInterpreter {
            instance,
            contexts: Default::default(),
        }
    }

    fn interpreter(&self) -> Interpreter {
        Interpreter::for_sandbox(&self.ctx.core)
    }

    /// The context a run goes to: cached, else found (started by any client), else — only
    /// the default one — started.
    async fn context(&self, id: &str) -> BlResult<sandcove_interpreter::Context> {
        let mut map = self.contexts.lock().await;
        if let Some(c) = map.get(id) {
            if !c.ended() {
                return Ok(c.clone());
            }
            map.remove(id);
        }
        let interpreter = self.interpreter();
        let context = if id == DEFAULT_CONTEXT_ID {
            interpreter
                .get_or_create_context(ContextOptions::new().id(id))
                .await?
        } else {
            interpreter.context(id).await?
        };
        map.insert(id.to_string(), context.clone());
        Ok(context)
    }
}

/// Parse a `json!` code context (`{"id": …}` or `{"context_id": …}`).
pub fn context_from_value(value: Value) -> BlResult<Context> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Raw {
        id: Option<String>,
        context_id: Option<String>,
    }
    let raw: Raw = models::from_value(value, "Context")?;
    raw.id
        .or(raw.context_id)
        .map(|id| Context { id })
        .ok_or_else(|| SandboxAPIError::value_error("a context needs an id"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_results_lose_their_quotes_only() {
        assert_eq!(strip_quotes("'abc'"), "abc");
        assert_eq!(strip_quotes("\"it's\""), "it's");
        assert_eq!(strip_quotes("4"), "4");
        assert_eq!(strip_quotes("'"), "'");
        assert_eq!(strip_quotes("['a']"), "['a']");
    }

    #[test]
    fn only_python_is_offered() {
        check_language(None).unwrap();
        check_language(Some("python")).unwrap();
        assert!(check_language(Some("r")).unwrap_err().is_not_supported());
    }
}
