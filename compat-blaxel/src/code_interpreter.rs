//! `CodeInterpreter` (Python `blaxel.core.sandbox.CodeInterpreter`): a sandbox with a stateful
//! Python interpreter.
//!
//! Blaxel runs a Jupyter server on port 8888. Here a small Python driver (written into the
//! sandbox, run with `python3` as a background process with stdin) plays that part: it reads
//! one JSON request per line, executes the code in a persistent namespace, evaluates a final
//! expression, and answers with JSON lines (`stdout`, `stderr`, `result`, `error`,
//! `end_of_execution`). Each code context is one driver process.

use std::collections::BTreeMap;
use std::future::IntoFuture;
use std::ops::Deref;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::StreamExt;
use serde_json::{json, Value};

use crate::errors::{Result as BlResult, SandboxAPIError};
use crate::models::{self, ExpirationPolicy, Port, SandboxCreateConfiguration, SandboxLifecycle};
use crate::sandbox::{into_future, IntoSandboxCreate, SandboxInstance};
use crate::state::{self, INTERNAL_TAG_PREFIX};
use crate::{gaps, translate};

/// Where the driver lives inside the sandbox.
const DRIVER_PATH: &str = "/tmp/.blaxel/interpreter.py";

const DRIVER: &str = r#"import ast, json, os, sys, traceback

_real = os.fdopen(os.dup(1), "w", buffering=1)
_ns = {"__name__": "__main__"}
_count = 0


def _emit(obj):
    _real.write(json.dumps(obj) + "\n")
    _real.flush()


class _Writer:
    def __init__(self, kind, rid):
        self.kind, self.rid, self.buf = kind, rid, ""

    def write(self, text):
        self.buf += text
        if "\n" in self.buf:
            head, _, self.buf = self.buf.rpartition("\n")
            _emit({"id": self.rid, "type": self.kind, "text": head + "\n"})
        return len(text)

    def flush(self):
        if self.buf:
            _emit({"id": self.rid, "type": self.kind, "text": self.buf})
            self.buf = ""

    def isatty(self):
        return False


def _text(value):
    t = repr(value)
    if len(t) >= 2 and t[0] == t[-1] and t[0] in "'\"":
        t = t[1:-1]
    return t


for _line in sys.stdin:
    try:
        _req = json.loads(_line)
    except ValueError:
        continue
    _rid = _req.get("id")
    _env = _req.get("env") or {}
    _saved = {k: os.environ.get(k) for k in _env}
    os.environ.update(_env)
    _count += 1
    _emit({"id": _rid, "type": "start"})
    _out, _err = _Writer("stdout", _rid), _Writer("stderr", _rid)
    sys.stdout, sys.stderr = _out, _err
    try:
        _tree = ast.parse(_req.get("code", ""), "<cell>", "exec")
        _last = None
        if _tree.body and isinstance(_tree.body[-1], ast.Expr):
            _last = ast.Expression(_tree.body.pop().value)
        exec(compile(_tree, "<cell>", "exec"), _ns)
        if _last is not None:
            _value = eval(compile(_last, "<cell>", "eval"), _ns)
            if _value is not None:
                _out.flush()
                _emit({"id": _rid, "type": "result", "text": _text(_value), "is_main_result": True})
    except BaseException as _e:
        _out.flush()
        _err.flush()
        _emit({"id": _rid, "type": "error", "name": type(_e).__name__, "value": str(_e),
               "traceback": traceback.format_exc()})
    finally:
        _out.flush()
        _err.flush()
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
        for _k, _v in _saved.items():
            if _v is None:
                os.environ.pop(_k, None)
            else:
                os.environ[_k] = _v
        _emit({"id": _rid, "type": "end_of_execution", "execution_count": _count})
"#;

/// Tag of the default context's driver.
fn default_tag() -> String {
    format!("{INTERNAL_TAG_PREFIX}interpreter-python")
}

/// A sandbox with a stateful code interpreter. Derefs to [`SandboxInstance`], so
/// `ci.process`, `ci.fs`, `ci.delete()` work as on any sandbox.
#[derive(Debug, Clone)]
pub struct CodeInterpreter {
    instance: SandboxInstance,
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
        let ci = CodeInterpreter { instance };
        ci.driver(&default_tag(), None).await?;
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
        if let Some(l) = &self.language {
            if l != "python" {
                return Err(gaps::refuse("code interpreter languages other than python"));
            }
        }
        let tag = match &self.context {
            Some(c) => context_tag(&c.id),
            None => default_tag(),
        };
        crate::sandbox::touch(&self.ci.ctx.core).await;
        let pid = self.ci.driver(&tag, None).await?;
        let core = &self.ci.ctx.core;
        let backend = core.backend();
        let sel = sandcove::ProcessSelector::Pid(pid);
        let mut stream = backend.attach(core.id(), sel.clone()).await?;
        let rid = state::random_suffix(12);
        let line = json!({"id": rid, "code": self.code, "env": self.envs}).to_string() + "\n";
        backend
            .write_stdin(core.id(), sel, line.into_bytes())
            .await?;
        let mut execution = Execution::default();
        let mut buf: Vec<u8> = Vec::new();
        let mut started = false;
        let limit = match self.timeout.unwrap_or(60.0) {
            t if t <= 0.0 => None,
            t => Some(Duration::from_secs_f64(t)),
        };
        let deadline = limit.map(|l| tokio::time::Instant::now() + l);
        loop {
            let next = match deadline {
                Some(d) => match tokio::time::timeout_at(d, stream.events.next()).await {
                    Ok(n) => n,
                    Err(_) => {
                        return Err(SandboxAPIError::exception(format!(
                            "Code execution timed out after {} seconds",
                            limit.map_or(0.0, |l| l.as_secs_f64())
                        )))
                    }
                },
                None => stream.events.next().await,
            };
            let bytes = match next {
                Some(Ok(sandcove::ProcessEvent::Stdout(b))) => b,
                Some(Ok(sandcove::ProcessEvent::Exit(_))) | None => {
                    return Err(SandboxAPIError::exception(
                        "the code interpreter exited during the execution",
                    ))
                }
                Some(Ok(_)) => continue,
                Some(Err(e)) => return Err(e.into()),
            };
            buf.extend_from_slice(&bytes);
            while let Some(i) = buf.iter().position(|b| *b == b'\n') {
                let raw: Vec<u8> = buf.drain(..=i).collect();
                let text = String::from_utf8_lossy(&raw[..i]).into_owned();
                let Ok(msg) = serde_json::from_str::<Value>(&text) else {
                    if started {
                        self.output(&mut execution, text + "\n", false);
                    }
                    continue;
                };
                if msg.get("id").and_then(Value::as_str) != Some(rid.as_str()) {
                    continue;
                }
                match msg.get("type").and_then(Value::as_str).unwrap_or_default() {
                    "start" => started = true,
                    "stdout" | "stderr" => {
                        let is_stderr = msg["type"] == "stderr";
                        let t = msg["text"].as_str().unwrap_or_default().to_string();
                        self.output(&mut execution, t, is_stderr);
                    }
                    "result" => {
                        let mut extra: BTreeMap<String, Value> = msg
                            .as_object()
                            .map(|m| m.clone().into_iter().collect())
                            .unwrap_or_default();
                        for k in ["id", "type", "text", "is_main_result"] {
                            extra.remove(k);
                        }
                        let r = Result {
                            text: msg["text"].as_str().map(str::to_string),
                            is_main_result: msg["is_main_result"].as_bool().unwrap_or(false),
                            extra,
                        };
                        if let Some(f) = &mut self.on_result {
                            f(r.clone());
                        }
                        execution.results.push(r);
                    }
                    "error" => {
                        let e = ExecutionError {
                            name: msg["name"].as_str().unwrap_or_default().into(),
                            value: msg["value"].as_str().unwrap_or_default().into(),
                            traceback: msg["traceback"].as_str().unwrap_or_default().into(),
                        };
                        if let Some(f) = &mut self.on_error {
                            f(e.clone());
                        }
                        execution.error = Some(e);
                    }
                    "end_of_execution" => {
                        execution.execution_count = msg["execution_count"].as_i64();
                        return Ok(execution);
                    }
                    _ => {}
                }
            }
        }
    }

    fn output(&mut self, execution: &mut Execution, text: String, is_stderr: bool) {
        let message = OutputMessage {
            text: text.clone(),
            timestamp: Some(sandcove::now_millis() as f64 / 1000.0),
            is_stderr,
        };
        if is_stderr {
            execution.logs.stderr.push(text);
            if let Some(f) = &mut self.on_stderr {
                f(message);
            }
        } else {
            execution.logs.stdout.push(text);
            if let Some(f) = &mut self.on_stdout {
                f(message);
            }
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
        if self.language.as_deref().is_some_and(|l| l != "python") {
            return Err(gaps::refuse("code interpreter languages other than python"));
        }
        let id = state::random_suffix(16);
        let cwd = self
            .cwd
            .map(|c| translate::expand_working_dir(&c, translate::HOME));
        self.ci.driver(&context_tag(&id), cwd).await?;
        Ok(Context { id })
    }
}
into_future!(CreateContextBuilder => Context);

fn context_tag(id: &str) -> String {
    format!("{INTERNAL_TAG_PREFIX}interpreter-{id}")
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
        let ci = CodeInterpreter { instance };
        ci.driver(&default_tag(), None).await?;
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

    /// The pid of the running driver tagged `tag`, started if needed.
    async fn driver(&self, tag: &str, cwd: Option<String>) -> BlResult<u32> {
        let core = &self.ctx.core;
        let running = core
            .processes()
            .await?
            .into_iter()
            .find(|p| p.tag.as_deref() == Some(tag) && p.exit.is_none());
        if let Some(p) = running {
            return Ok(p.pid);
        }
        core.write(DRIVER_PATH, DRIVER.as_bytes().to_vec()).await?;
        let mut spec =
            sandcove::ProcessSpec::new(sandcove::Command::argv(["python3", "-u", DRIVER_PATH]))
                .tag(tag)
                .stdin(true);
        spec.cwd = cwd;
        match core.backend().spawn(core.id(), spec).await {
            Ok(stream) => Ok(stream.pid),
            // Another program started it a moment ago.
            Err(sandcove::Error::AlreadyExists { .. }) => core
                .processes()
                .await?
                .into_iter()
                .find(|p| p.tag.as_deref() == Some(tag) && p.exit.is_none())
                .map(|p| p.pid)
                .ok_or_else(|| SandboxAPIError::exception("the code interpreter did not start")),
            Err(e) => Err(e.into()),
        }
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
