//! One stateful code-context driver for Sandcove sandboxes: the E2B and Blaxel code
//! interpreters (and, later, E2B's `POST /execute` wire route) all run cells through it and only
//! reshape its [`Event`]s.
//!
//! | item | what |
//! |---|---|
//! | [`Interpreter`] | the code contexts of one sandbox: create, find, list |
//! | [`Context`] | one Python interpreter process: [`run`](Context::run), [`interrupt`](Context::interrupt), [`restart`](Context::restart), [`delete`](Context::delete) |
//! | [`Execution`] | the [`Event`]s of one run, a `Stream` ending with [`Event::End`] or an error |
//! | [`Event`] | stdout / stderr bytes, results (MIME data), the error, the execution count, the end |
//! | [`Utf8Decoder`] | bytes to text across chunk boundaries, for facades that show text |
//!
//! **Jupyter kernels where the sandbox has them.** When the sandbox's `python3` imports
//! `jupyter_client` and a kernelspec for the asked language is in the standard Jupyter paths
//! ([`Interpreter::capabilities`]), a context is that kernel (`python3` is ipykernel, so
//! `!cmd`, `%magics` and rich display work), started *inside* the sandbox by a second small
//! driver ([`KERNEL_DRIVER_SOURCE`]) that speaks to it with `jupyter_client`'s
//! `KernelManager` and blocking client and relays its messages as the same frames the
//! built-in driver writes: `stream` as stdout/stderr, `execute_result` and `display_data` as
//! results with their whole MIME bundle, `error` with its name, value and traceback, the
//! execution count, then the end. Why a driver in the sandbox rather than a ZeroMQ client on
//! the host (such as `runtimelib`): the kernel's ports and connection file stay on the
//! sandbox's own loopback and never reach the host or the agent, the agent needs no ZeroMQ,
//! and `jupyter_client` is the protocol's reference implementation. A cell in the kernel
//! never holds the frame channel nor a run's token, so it cannot fake frames at all.
//! Interrupts go to the driver as before, which interrupts the kernel's process group; a
//! restart replaces the driver, and the kernel dies with it (`PR_SET_PDEATHSIG`), so a fresh
//! kernel starts. Where there is no Jupyter (the host base without ipykernel), Python
//! contexts run the built-in driver described below; any other language without a kernel is
//! a typed `NotSupported` naming the kernel to install. Per-run environment variables apply
//! in Python kernels (set before the cell, put back after); other kernels see only the
//! context's.
//!
//! Why a crate and not a core module: the driver is Python and serves vendor-shaped facades; it
//! needs nothing from the engine's internals and talks to a sandbox only through the public
//! [`sandcove::Backend`] trait, so it works on the embedded engine and over HTTP alike, and the
//! core stays free of a language runtime's conventions.
//!
//! How it works: a context is a `python3` process started through the backend with a tag
//! (`sandcove-interpreter:<language>:<id>`), so any program connected to the sandbox finds it.
//! Requests go in on its stdin. Each run carries a fresh random token; the driver frames
//! everything it reports as lines `<token> <json>` on its stdout, and redirects the cell's own
//! fds 1 and 2 into pipes whose bytes it reports as framed, base64 output. The host reads only
//! lines bearing the current run's token, each bounded by [`MAX_FRAME_BYTES`], so text a cell
//! prints (even copies of real frames) is never taken for a result. A cell runs inside the
//! interpreter it is executing in, so code that digs the current token out of the driver's own
//! memory can fake its *own* run's events; it cannot reach another context, another run's
//! events once they ended, or the host.
//!
//! ```no_run
//! # async fn demo() -> sandcove::Result<()> {
//! use futures::StreamExt;
//! use sandcove_interpreter::{ContextOptions, Event, Interpreter, RunOptions};
//!
//! let client = sandcove::Client::from_env()?;
//! let sandbox = client.create(Default::default()).await?;
//! let interpreter = Interpreter::for_sandbox(&sandbox);
//! let context = interpreter.create_context(ContextOptions::new()).await?;
//! context.run("x = 41", RunOptions::new()).await?.finish().await?;
//! let mut run = context.run("print('hi'); x + 1", RunOptions::new()).await?;
//! while let Some(event) = run.next().await {
//!     match event? {
//!         Event::Stdout(chunk) => print!("{}", String::from_utf8_lossy(&chunk.data)),
//!         Event::Result(r) => println!("= {}", r.text().unwrap_or_default()),
//!         _ => {}
//!     }
//! }
//! sandbox.destroy().await?;
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use futures::{Stream, StreamExt};
use sandcove::{
    Backend, Command, Error, ProcessEvent, ProcessSelector, ProcessSpec, ProcessStream, Result,
    Signal, SignalOptions, WriteStdinOptions,
};
use tokio::time::Instant;

mod frames;

pub use frames::MAX_FRAME_BYTES;

/// Most bytes of one execution's output (logs and results) a facade keeps in memory; a cell
/// can print without end, and what a program holds must not grow with it. Past it, output
/// still reaches the streaming callbacks but is no longer collected.
pub const MAX_KEPT_OUTPUT_BYTES: usize = 64 << 20;

/// What a collector does with the next piece of output ([`OutputBudget::admit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Keep it.
    Keep,
    /// Drop it, and this is the first piece dropped: note once that output was cut.
    FirstDrop,
    /// Drop it (already noted).
    Drop,
}

/// Counts the bytes one execution's collector keeps, up to [`MAX_KEPT_OUTPUT_BYTES`].
#[derive(Debug, Clone)]
pub struct OutputBudget {
    left: usize,
    dropped: bool,
}

impl Default for OutputBudget {
    fn default() -> Self {
        OutputBudget::new(MAX_KEPT_OUTPUT_BYTES)
    }
}

impl OutputBudget {
    /// A budget of `bytes`.
    pub fn new(bytes: usize) -> Self {
        OutputBudget {
            left: bytes,
            dropped: false,
        }
    }

    /// Whether a piece of `bytes` may be kept; once one piece is refused, every later piece
    /// is too, so what is kept is a prefix of the output.
    pub fn admit(&mut self, bytes: usize) -> Admit {
        if !self.dropped && bytes <= self.left {
            self.left -= bytes;
            return Admit::Keep;
        }
        if std::mem::replace(&mut self.dropped, true) {
            Admit::Drop
        } else {
            Admit::FirstDrop
        }
    }

    /// The note a collector adds once when it starts dropping output.
    pub fn note() -> String {
        format!(
            "[output beyond {} MiB was not kept; stream it with the on_stdout/on_stderr/on_result callbacks]\n",
            MAX_KEPT_OUTPUT_BYTES >> 20
        )
    }
}

impl CellResult {
    /// About how many bytes this result holds (its representations' text).
    pub fn size(&self) -> usize {
        self.data
            .iter()
            .map(|(k, v)| k.len() + v.as_str().map_or_else(|| v.to_string().len(), str::len))
            .sum()
    }
}

/// The driver's source, run with `python3 -c` (no file in the sandbox to swap or edit).
pub const DRIVER_SOURCE: &str = include_str!("driver.py");

/// The kernel driver's source, run with `python3 -c` and a kernelspec name: it starts that
/// Jupyter kernel inside the sandbox with `jupyter_client` and relays its messages as the
/// built-in driver's frames.
pub const KERNEL_DRIVER_SOURCE: &str = include_str!("kernel_driver.py");

/// What tells whether the sandbox has Jupyter: prints one JSON line of its kernelspecs.
const PROBE_SOURCE: &str = r#"
import json
try:
    from jupyter_client.kernelspec import KernelSpecManager
    specs = KernelSpecManager().get_all_specs()
    out = {"jupyter": True, "kernels": [
        {"name": n, "language": str(s["spec"].get("language", "")),
         "display_name": str(s["spec"].get("display_name", ""))}
        for n, s in sorted(specs.items())]}
except Exception as e:
    out = {"jupyter": False, "kernels": []}
print(json.dumps(out))
"#;

/// How long the capability probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(60);

/// Compiles the driver under its own file name, so the driver can tell its frames from a
/// cell's when a SIGINT arrives.
const BOOTSTRAP: &str = "import sys; exec(compile(sys.argv[1], '<sandcove-driver>', 'exec'))";

/// Prefix of the tag of every context's process: `sandcove-interpreter:<language>:<id>`.
pub const TAG_PREFIX: &str = "sandcove-interpreter:";

/// How long an interrupted (or cancelled) run may take to end before its interpreter is
/// killed, unless [`RunOptions::interrupt_grace`] says otherwise.
pub const DEFAULT_INTERRUPT_GRACE: Duration = Duration::from_secs(5);

/// How long [`Context::restart`] and [`Context::delete`] wait for the killed interpreter.
const EXIT_WAIT: Duration = Duration::from_secs(30);

/// The driver's stderr (its own failures) kept for the error when it ends unexpectedly.
const STDERR_TAIL: usize = 4096;

/// Longest context id.
const MAX_ID_LEN: usize = 128;

/// The only language offered: the sandbox's `python3`.
pub const PYTHON: &str = "python";

/// Whether a process tag belongs to a code context (facades hide these from process lists).
pub fn is_context_tag(tag: &str) -> bool {
    tag.starts_with(TAG_PREFIX)
}

fn make_tag(language: &str, id: &str) -> String {
    format!("{TAG_PREFIX}{language}:{id}")
}

/// `(language, id)` of a context's tag.
fn parse_tag(tag: &str) -> Option<(&str, &str)> {
    tag.strip_prefix(TAG_PREFIX)?.split_once(':')
}

/// The language the built-in driver runs (Python), or `NotSupported` for anything else.
/// Where the sandbox has Jupyter kernels, [`Interpreter::capabilities`] says which languages
/// contexts can run.
pub fn check_language(language: Option<&str>) -> Result<&'static str> {
    match language {
        None | Some("python") | Some("python3") => Ok(PYTHON),
        Some(other) => Err(Error::NotSupported {
            feature: format!("code contexts in language {other:?}"),
            alternative: "python (the sandbox's python3); run other languages as processes".into(),
        }),
    }
}

fn check_id(id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= MAX_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "context id {id:?}: use 1 to {MAX_ID_LEN} characters from A-Z a-z 0-9 - _ ."
        )))
    }
}

fn check_envs(envs: &BTreeMap<String, String>) -> Result<()> {
    for (k, v) in envs {
        if k.is_empty() || k.contains(['=', '\0']) || v.contains('\0') {
            return Err(Error::invalid(format!(
                "environment variable {k:?}: names must be non-empty without '=' or NUL, values without NUL"
            )));
        }
    }
    Ok(())
}

/// Characters of a run's token: 26 base-36 characters are over 128 bits.
const TOKEN_LEN: usize = 26;

// ----- events -----

/// Bytes a run wrote to stdout or stderr, unchanged (decoding is the caller's choice).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputChunk {
    /// The bytes.
    pub data: Vec<u8>,
    /// When the driver read them, in nanoseconds since the Unix epoch (sandbox clock).
    pub timestamp_ns: Option<i64>,
}

/// A value a run produced: the value of its last expression (the main result) or one passed
/// to `display(...)`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CellResult {
    /// Representations by MIME type: always `text/plain` (the value's `repr`), plus whatever
    /// the object offers through `_repr_html_`, `_repr_png_` (base64), `_repr_json_` (a JSON
    /// value), `_repr_mimebundle_` and the like.
    pub data: BTreeMap<String, serde_json::Value>,
    /// True for the value of the cell's last expression.
    pub is_main_result: bool,
}

impl CellResult {
    /// The `text/plain` representation (the value's `repr`).
    pub fn text(&self) -> Option<&str> {
        self.get_str(mime::TEXT)
    }

    /// A representation that is a string (every MIME type but `application/json`).
    pub fn get_str(&self, mime: &str) -> Option<&str> {
        self.data.get(mime).and_then(|v| v.as_str())
    }
}

/// MIME types the driver reports, with E2B's field name for each (`Result.html`, …).
pub mod mime {
    /// `text/plain`: the `repr`.
    pub const TEXT: &str = "text/plain";
    /// `text/html`.
    pub const HTML: &str = "text/html";
    /// `text/markdown`.
    pub const MARKDOWN: &str = "text/markdown";
    /// `image/svg+xml`.
    pub const SVG: &str = "image/svg+xml";
    /// `image/png`, base64.
    pub const PNG: &str = "image/png";
    /// `image/jpeg`, base64.
    pub const JPEG: &str = "image/jpeg";
    /// `application/pdf`, base64.
    pub const PDF: &str = "application/pdf";
    /// `text/latex`.
    pub const LATEX: &str = "text/latex";
    /// `application/json`: a JSON value, not a string.
    pub const JSON: &str = "application/json";
    /// `application/javascript`.
    pub const JAVASCRIPT: &str = "application/javascript";

    /// `(MIME type, E2B result field)` for every type E2B names.
    pub const E2B_FIELDS: [(&str, &str); 10] = [
        (TEXT, "text"),
        (HTML, "html"),
        (MARKDOWN, "markdown"),
        (SVG, "svg"),
        (PNG, "png"),
        (JPEG, "jpeg"),
        (PDF, "pdf"),
        (LATEX, "latex"),
        (JSON, "json"),
        (JAVASCRIPT, "javascript"),
    ];
}

/// The exception a run raised.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CellError {
    /// The exception class, e.g. `ZeroDivisionError`.
    pub name: String,
    /// Its message (`str(exc)`).
    pub value: String,
    /// The formatted traceback, starting in the cell (`File "<cell>"`).
    pub traceback: String,
}

/// One event of a run, in the order the driver reported it. Each maps to one E2B
/// `POST /execute` line: `stdout`, `stderr`, `result`, `error`, `number_of_executions`,
/// `end_of_execution`.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Event {
    /// Bytes on stdout (from `print`, `sys.stdout.buffer`, fd 1, subprocesses).
    Stdout(OutputChunk),
    /// Bytes on stderr.
    Stderr(OutputChunk),
    /// A value: the main result or a `display(...)`ed one.
    Result(CellResult),
    /// The run raised this (also `KeyboardInterrupt` after [`Context::interrupt`]).
    Error(CellError),
    /// How many runs this context has executed, this one included.
    ExecutionCount(u64),
    /// The run is over; always the last event of a run that did not fail.
    End,
}

// ----- options -----

/// Options of [`Interpreter::create_context`].
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct ContextOptions {
    /// The context id (default: a random one); unique among the sandbox's live contexts.
    pub id: Option<String>,
    /// `python` (the default; `python3` is the same). Anything else is `NotSupported`.
    pub language: Option<String>,
    /// The interpreter's working directory (default: the sandbox user's home).
    pub cwd: Option<String>,
    /// Environment variables of the interpreter process (kept across restarts).
    pub envs: BTreeMap<String, String>,
}

impl ContextOptions {
    /// Defaults for everything.
    pub fn new() -> Self {
        Self::default()
    }

    /// Set the id.
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// Set the language.
    pub fn language(mut self, language: impl Into<String>) -> Self {
        self.language = Some(language.into());
        self
    }

    /// Set the working directory.
    pub fn cwd(mut self, cwd: impl Into<String>) -> Self {
        self.cwd = Some(cwd.into());
        self
    }

    /// Set the interpreter's environment variables.
    pub fn envs(mut self, envs: BTreeMap<String, String>) -> Self {
        self.envs = envs;
        self
    }
}

/// Options of [`Context::run`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RunOptions {
    /// Environment variables set for this run only.
    pub envs: BTreeMap<String, String>,
    /// Longest the run may take, waiting behind other runs of the context included. At expiry
    /// a queued run is cancelled and a running one interrupted (SIGINT: state survives); the
    /// run then ends with [`Error::Timeout`]. `None` waits forever.
    pub timeout: Option<Duration>,
    /// How long an interrupted or cancelled run may take to end before the interpreter is
    /// killed (its state is then lost).
    pub interrupt_grace: Duration,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            envs: BTreeMap::new(),
            timeout: None,
            interrupt_grace: DEFAULT_INTERRUPT_GRACE,
        }
    }
}

impl RunOptions {
    /// No envs, no timeout, the default grace.
    pub fn new() -> Self {
        Self::default()
    }

    /// Set this run's environment variables.
    pub fn envs(mut self, envs: BTreeMap<String, String>) -> Self {
        self.envs = envs;
        self
    }

    /// Set the timeout (`None`: none).
    pub fn timeout(mut self, timeout: impl Into<Option<Duration>>) -> Self {
        self.timeout = timeout.into();
        self
    }

    /// Set the grace after an interrupt.
    pub fn interrupt_grace(mut self, grace: Duration) -> Self {
        self.interrupt_grace = grace;
        self
    }
}

// ----- the interpreter of a sandbox -----

/// The code contexts of one sandbox, on any backend.
#[derive(Debug, Clone)]
pub struct Interpreter {
    backend: Arc<dyn Backend>,
    sandbox_id: String,
    /// Probed once per interpreter handle (and its clones).
    capabilities: Arc<tokio::sync::OnceCell<Capabilities>>,
}

/// One Jupyter kernelspec found in the sandbox's standard Jupyter paths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelSpec {
    /// Its name (`python3`, `ir`, `deno`, …): what [`ContextOptions::language`] may also name.
    pub name: String,
    /// The language it runs, as the kernelspec says (`python`, `R`, `typescript`).
    pub language: String,
    /// Its display name.
    pub display_name: String,
}

/// What runs code contexts in a sandbox ([`Interpreter::capabilities`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Capabilities {
    /// The sandbox's `python3` imports `jupyter_client`: contexts whose language has a
    /// kernelspec run that kernel. Otherwise Python contexts run the built-in driver.
    pub jupyter: bool,
    /// The kernelspecs found (empty without Jupyter).
    pub kernels: Vec<KernelSpec>,
}

impl Capabilities {
    /// The languages contexts can run, lower case: `python` always (a kernel, or the built-in
    /// driver), then every kernel's language.
    pub fn languages(&self) -> Vec<String> {
        let mut out = vec![PYTHON.to_string()];
        for k in &self.kernels {
            let language = language_label(&k.language);
            if !language.is_empty() && !out.contains(&language) {
                out.push(language);
            }
        }
        out
    }

    /// The kernelspec serving `language` (a language or a kernelspec name; `python3`, `js`,
    /// `ts` and `sh` are aliases), if any. Python prefers the kernelspec named `python3`.
    pub fn kernel_for(&self, language: &str) -> Option<&KernelSpec> {
        if !self.jupyter {
            return None;
        }
        let wanted = normalize_language(language);
        self.kernels
            .iter()
            .find(|k| k.name == language || (wanted == PYTHON && k.name == "python3"))
            .or_else(|| {
                self.kernels
                    .iter()
                    .find(|k| language_label(&k.language) == wanted)
            })
    }

    /// `(language, kernel)` of a context asked for `language` (`None`: Python): the kernel
    /// when one serves it, the built-in driver for Python without one, else `NotSupported`
    /// naming the kernel to install.
    pub fn resolve(&self, language: Option<&str>) -> Result<(String, Option<String>)> {
        let asked = language.unwrap_or(PYTHON);
        if let Some(k) = self.kernel_for(asked) {
            let label = language_label(&k.language);
            let label = if label.is_empty() {
                normalize_language(asked)
            } else {
                label
            };
            return Ok((label, Some(k.name.clone())));
        }
        let wanted = normalize_language(asked);
        if wanted == PYTHON {
            return Ok((PYTHON.into(), None));
        }
        let kernel = match wanted.as_str() {
            "r" => "IRkernel (Debian: r-cran-irkernel)",
            "javascript" => "a JavaScript kernel (ijavascript, or Deno's `deno jupyter --install`)",
            "typescript" => "a TypeScript kernel (Deno's `deno jupyter --install`)",
            "java" => "IJava",
            "bash" => "bash_kernel (`pip install bash_kernel && python3 -m bash_kernel.install`)",
            _ => "a Jupyter kernel for it",
        };
        let jupyter = if self.jupyter {
            ""
        } else {
            " and jupyter_client for the sandbox's python3 (Debian: python3-jupyter-client)"
        };
        Err(Error::NotSupported {
            feature: format!(
                "code contexts in language {asked:?} (no kernel for it in this sandbox)"
            ),
            alternative: format!("install {kernel}{jupyter} in the sandbox's image"),
        })
    }
}

/// A language as contexts name it: lower case, aliases resolved, only `[a-z0-9_+-]` (it goes
/// in a process tag).
fn language_label(language: &str) -> String {
    language
        .to_ascii_lowercase()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '+' | '-'))
        .collect()
}

fn normalize_language(language: &str) -> String {
    let label = language_label(language);
    match label.as_str() {
        "python3" => PYTHON.into(),
        "js" | "node" => "javascript".into(),
        "ts" => "typescript".into(),
        "sh" => "bash".into(),
        _ => label,
    }
}

/// The kernelspec a context's process runs, from its argv (`None`: the built-in driver).
fn kernel_of(argv: &[String]) -> Option<String> {
    (argv.get(4).map(String::as_str) == Some(KERNEL_DRIVER_SOURCE))
        .then(|| argv.get(5).cloned())
        .flatten()
}

/// A live context as listed: enough to show it or to reach it with [`Interpreter::context`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContextInfo {
    /// The context id.
    pub id: String,
    /// Its language, lower case (`python`, or a kernel's language such as `r`).
    pub language: String,
    /// The Jupyter kernelspec it runs (`python3`), or `None` for the built-in Python driver.
    pub kernel: Option<String>,
    /// The interpreter's working directory (a sandbox path).
    pub cwd: String,
    /// The interpreter's pid in the sandbox.
    pub pid: u32,
}

impl Interpreter {
    /// The contexts of sandbox `sandbox_id` on `backend`.
    pub fn new(backend: Arc<dyn Backend>, sandbox_id: impl Into<String>) -> Self {
        Interpreter {
            backend,
            sandbox_id: sandbox_id.into(),
            capabilities: Default::default(),
        }
    }

    /// Whether the sandbox has Jupyter and which kernels: asked of the sandbox's `python3`
    /// once per handle. A sandbox without `python3` has neither.
    pub async fn capabilities(&self) -> Result<Capabilities> {
        self.capabilities
            .get_or_try_init(|| self.probe())
            .await
            .cloned()
    }

    /// The languages contexts can run ([`Capabilities::languages`]).
    pub async fn languages(&self) -> Result<Vec<String>> {
        Ok(self.capabilities().await?.languages())
    }

    async fn probe(&self) -> Result<Capabilities> {
        #[derive(serde::Deserialize)]
        struct Probed {
            jupyter: bool,
            kernels: Vec<ProbedKernel>,
        }
        #[derive(serde::Deserialize)]
        struct ProbedKernel {
            name: String,
            language: String,
            display_name: String,
        }
        let spec = ProcessSpec::new(Command::argv(["python3", "-c", PROBE_SOURCE]))
            .tag(format!("{TAG_PREFIX}probe-{}", sandcove::random_id(12)));
        let mut stream = match self.backend.spawn(&self.sandbox_id, spec).await {
            Ok(s) => s,
            Err(e) if e.is_not_found() => return Ok(Capabilities::default()),
            Err(e) => return Err(e),
        };
        let mut out = Vec::new();
        let read = async {
            while let Some(event) = stream.events.next().await {
                match event? {
                    ProcessEvent::Stdout(bytes) if out.len() < (1 << 20) => {
                        out.extend_from_slice(&bytes)
                    }
                    ProcessEvent::Exit(_) => break,
                    _ => {}
                }
            }
            Ok::<(), Error>(())
        };
        match tokio::time::timeout(PROBE_TIMEOUT, read).await {
            Ok(r) => r?,
            Err(_) => {
                let _ = self.signal_pid(stream.pid, Signal::Kill).await;
                return Err(Error::Timeout {
                    what: "probing the sandbox for Jupyter kernels".into(),
                });
            }
        }
        let Ok(probed) = serde_json::from_slice::<Probed>(out.trim_ascii()) else {
            return Ok(Capabilities::default());
        };
        Ok(Capabilities {
            jupyter: probed.jupyter,
            kernels: probed
                .kernels
                .into_iter()
                .map(|k| KernelSpec {
                    name: k.name,
                    language: k.language,
                    display_name: k.display_name,
                })
                .collect(),
        })
    }

    /// The contexts of `sandbox`.
    pub fn for_sandbox(sandbox: &sandcove::Sandbox) -> Self {
        Self::new(sandbox.backend().clone(), sandbox.id())
    }

    /// Start a new context: a Jupyter kernel where the sandbox has one for the language
    /// ([`Interpreter::capabilities`]), else the built-in Python driver. `AlreadyExists` when
    /// a live context has that id; `NotSupported` for a language without a kernel (naming
    /// the kernel to install), before anything is started.
    pub async fn create_context(&self, options: ContextOptions) -> Result<Context> {
        let id = match options.id {
            Some(id) => id,
            None => sandcove::random_id(12),
        };
        check_id(&id)?;
        check_envs(&options.envs)?;
        let (language, kernel) = self
            .capabilities()
            .await?
            .resolve(options.language.as_deref())?;
        let language = language.as_str();
        let spawn = SpawnSpec {
            tag: make_tag(language, &id),
            cwd: options.cwd,
            envs: options.envs,
            kernel: kernel.clone(),
        };
        let stream = self.spawn_driver(&spawn).await?;
        let pid = stream.pid;
        let cwd = self
            .backend
            .list_processes(&self.sandbox_id)
            .await?
            .into_iter()
            .find(|p| p.pid == pid)
            .map(|p| p.cwd)
            .unwrap_or_else(|| spawn.cwd.clone().unwrap_or_default());
        let info = ContextInfo {
            id,
            language: language.into(),
            kernel,
            cwd,
            pid,
        };
        Ok(Context::new(
            self.clone(),
            info,
            spawn,
            Some(FrameReader::new(stream)),
        ))
    }

    /// The live context `id` (started by any program): `NotFound` if there is none.
    pub async fn context(&self, id: &str) -> Result<Context> {
        let Some((info, envs)) = self.find(id).await? else {
            return Err(Error::NotFound {
                what: format!("code context {id:?}"),
            });
        };
        let spawn = SpawnSpec {
            tag: make_tag(&info.language, &info.id),
            cwd: Some(info.cwd.clone()),
            envs,
            kernel: info.kernel.clone(),
        };
        Ok(Context::new(self.clone(), info, spawn, None))
    }

    /// The live context `options.id` (which must be set), started with `options` if there is
    /// none. Two programs doing this at once end up with the same context.
    pub async fn get_or_create_context(&self, options: ContextOptions) -> Result<Context> {
        let Some(id) = options.id.clone() else {
            return Err(Error::invalid("get_or_create_context needs an id"));
        };
        // A language other than Python is checked up front (a probe); Python, the common
        // case, needs none when the context already runs.
        if let Some(language) = options.language.as_deref() {
            if normalize_language(language) != PYTHON {
                self.capabilities().await?.resolve(Some(language))?;
            }
        }
        match self.context(&id).await {
            Err(e) if e.is_not_found() => {}
            other => return other,
        }
        match self.create_context(options).await {
            Err(Error::AlreadyExists { .. }) => self.context(&id).await,
            other => other,
        }
    }

    /// Every live context of the sandbox.
    pub async fn list_contexts(&self) -> Result<Vec<ContextInfo>> {
        let listed = self.backend.list_processes(&self.sandbox_id).await?;
        Ok(listed
            .into_iter()
            .filter(|p| p.exit.is_none())
            .filter_map(|p| {
                let (language, id) = parse_tag(p.tag.as_deref()?)?;
                Some(ContextInfo {
                    id: id.into(),
                    language: language.into(),
                    kernel: kernel_of(&p.argv),
                    cwd: p.cwd,
                    pid: p.pid,
                })
            })
            .collect())
    }

    async fn find(&self, id: &str) -> Result<Option<(ContextInfo, BTreeMap<String, String>)>> {
        let listed = self.backend.list_processes(&self.sandbox_id).await?;
        Ok(listed.into_iter().find_map(|p| {
            if p.exit.is_some() {
                return None;
            }
            let (language, found) = parse_tag(p.tag.as_deref()?)?;
            (found == id).then(|| {
                (
                    ContextInfo {
                        id: id.into(),
                        language: language.into(),
                        kernel: kernel_of(&p.argv),
                        cwd: p.cwd.clone(),
                        pid: p.pid,
                    },
                    p.envs.clone(),
                )
            })
        }))
    }

    async fn spawn_driver(&self, spawn: &SpawnSpec) -> Result<ProcessStream> {
        let argv = match &spawn.kernel {
            Some(kernel) => vec![
                "python3",
                "-u",
                "-c",
                BOOTSTRAP,
                KERNEL_DRIVER_SOURCE,
                kernel.as_str(),
            ],
            None => vec!["python3", "-u", "-c", BOOTSTRAP, DRIVER_SOURCE],
        };
        let mut spec = ProcessSpec::new(Command::argv(argv))
            .tag(spawn.tag.clone())
            .stdin(true);
        spec.cwd = spawn.cwd.clone();
        spec.envs = spawn.envs.clone();
        self.backend.spawn(&self.sandbox_id, spec).await
    }

    /// Signal the interpreter process `pid`; one that is already gone is not an error.
    async fn signal_pid(&self, pid: u32, signal: Signal) -> Result<()> {
        match self
            .backend
            .signal(
                &self.sandbox_id,
                ProcessSelector::Pid(pid),
                SignalOptions::new(signal),
            )
            .await
        {
            Err(e) if e.is_not_found() => Ok(()),
            other => other,
        }
    }
}

/// How a context's interpreter is (re)started.
#[derive(Debug, Clone)]
struct SpawnSpec {
    tag: String,
    cwd: Option<String>,
    envs: BTreeMap<String, String>,
    /// The kernelspec the kernel driver starts; `None`: the built-in driver.
    kernel: Option<String>,
}

// ----- a context -----

/// One code context: a Python interpreter whose variables, imports and functions persist
/// between runs. Cloning gives another handle to the same context; runs through any handles
/// (or programs) execute one at a time, in the order they reached the interpreter.
#[derive(Debug, Clone)]
pub struct Context {
    inner: Arc<ContextInner>,
}

#[derive(Debug)]
struct ContextInner {
    interpreter: Interpreter,
    id: String,
    language: String,
    spawn: SpawnSpec,
    deleted: AtomicBool,
    slot: Mutex<Slot>,
}

/// The interpreter process the handle talks to, and its frame reader when no run holds it.
#[derive(Debug)]
struct Slot {
    /// Bumped at each restart, so a run that ends late does not hand back a stale reader.
    generation: u64,
    info: ContextInfo,
    reader: Option<FrameReader>,
    /// This handle saw the interpreter end (or killed it).
    ended: bool,
}

impl Context {
    fn new(
        interpreter: Interpreter,
        info: ContextInfo,
        spawn: SpawnSpec,
        reader: Option<FrameReader>,
    ) -> Self {
        Context {
            inner: Arc::new(ContextInner {
                interpreter,
                id: info.id.clone(),
                language: info.language.clone(),
                spawn,
                deleted: AtomicBool::new(false),
                slot: Mutex::new(Slot {
                    generation: 0,
                    info,
                    reader,
                    ended: false,
                }),
            }),
        }
    }

    /// The context id.
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// Its language (`python`).
    pub fn language(&self) -> &str {
        &self.inner.language
    }

    /// What this handle knows of the context (pid and cwd of its current interpreter).
    pub fn info(&self) -> ContextInfo {
        self.slot().info.clone()
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Slot> {
        // A panic while holding this short lock cannot leave the slot inconsistent.
        self.inner.slot.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn interp(&self) -> &Interpreter {
        &self.inner.interpreter
    }

    /// Whether this handle saw the context's interpreter end (crashed, exited or killed after
    /// ignoring an interrupt): runs fail until [`restart`](Context::restart).
    pub fn ended(&self) -> bool {
        self.slot().ended
    }

    fn ended_error(&self) -> Error {
        Error::backend(format!(
            "code context {:?}: its interpreter has ended; restart the context",
            self.inner.id
        ))
    }

    /// Mark the interpreter of `generation` as ended.
    fn mark_ended(&self, generation: u64) {
        let mut slot = self.slot();
        if slot.generation == generation {
            slot.ended = true;
            slot.reader = None;
        }
    }

    fn check_live(&self) -> Result<()> {
        if self.inner.deleted.load(Ordering::SeqCst) {
            return Err(Error::NotFound {
                what: format!("code context {:?} (deleted)", self.inner.id),
            });
        }
        Ok(())
    }

    /// Run `code` as one cell. The returned [`Execution`] streams the run's events; errors in
    /// the code are [`Event::Error`], not `Err`. `Err` items are the driver's failures
    /// (the interpreter ended) and [`Error::Timeout`] at [`RunOptions::timeout`].
    pub async fn run(&self, code: impl Into<String>, options: RunOptions) -> Result<Execution> {
        self.check_live()?;
        check_envs(&options.envs)?;
        let deadline = options.timeout.map(|t| Instant::now() + t);
        let token = sandcove::random_id(TOKEN_LEN);
        let request = serde_json::json!({
            "op": "run",
            "token": token,
            "code": code.into(),
            "envs": options.envs,
        });
        let mut line = serde_json::to_vec(&request)
            .map_err(|e| Error::invalid(format!("code-context request: {e}")))?;
        line.push(b'\n');
        let interp = self.interp();
        let mut adopted = false;
        let (generation, pid, reader) = loop {
            let (generation, pid, reader) = {
                let mut slot = self.slot();
                let ended = slot.ended;
                (
                    slot.generation,
                    (!ended).then_some(slot.info.pid),
                    slot.reader.take(),
                )
            };
            let Some(pid) = pid else {
                // Another program may have restarted the context: follow it, once.
                if !adopted && self.adopt(generation).await? {
                    adopted = true;
                    continue;
                }
                return Err(self.ended_error());
            };
            let reader = match reader {
                Some(r) => r,
                None => FrameReader::new(
                    interp
                        .backend
                        .attach(&interp.sandbox_id, ProcessSelector::Pid(pid))
                        .await?,
                ),
            };
            match interp
                .backend
                .write_stdin(
                    &interp.sandbox_id,
                    ProcessSelector::Pid(pid),
                    WriteStdinOptions::new(line.clone()),
                )
                .await
            {
                Ok(()) => break (generation, pid, reader),
                Err(e) => {
                    // Most likely the interpreter is gone: say so rather than "stdin closed".
                    let running = interp
                        .backend
                        .list_processes(&interp.sandbox_id)
                        .await?
                        .iter()
                        .any(|p| p.pid == pid && p.exit.is_none());
                    if running {
                        return Err(e);
                    }
                    self.mark_ended(generation);
                }
            }
        };
        let run = Run {
            context: self.clone(),
            generation,
            pid,
            reader: Some(reader),
            token,
            deadline,
            timeout: options.timeout,
            grace: options.interrupt_grace,
            phase: Phase::Queued,
        };
        let events = futures::stream::unfold(run, |mut run| async move {
            let item = run.step().await?;
            Some((item, run))
        });
        Ok(Execution {
            events: Box::pin(events),
        })
    }

    /// Switch to a live interpreter of this context other than the one of `generation` (one
    /// another program restarted); false when there is none.
    async fn adopt(&self, generation: u64) -> Result<bool> {
        let Some((info, _)) = self.interp().find(&self.inner.id).await? else {
            return Ok(false);
        };
        let mut slot = self.slot();
        if slot.generation != generation || (slot.info.pid == info.pid && slot.ended) {
            return Ok(slot.generation != generation);
        }
        slot.generation += 1;
        slot.info = info;
        slot.reader = None;
        slot.ended = false;
        Ok(true)
    }

    /// Interrupt the running cell (SIGINT to the interpreter): it raises `KeyboardInterrupt`,
    /// reported as its [`Event::Error`], and the context's state survives. Harmless when no
    /// cell runs.
    pub async fn interrupt(&self) -> Result<()> {
        self.check_live()?;
        let tag = self.inner.spawn.tag.clone();
        let interp = self.interp();
        interp
            .backend
            .signal(
                &interp.sandbox_id,
                ProcessSelector::Tag(tag),
                SignalOptions::new(Signal::Int),
            )
            .await
    }

    /// Replace the interpreter with a fresh one (same id, cwd and envs): every variable is
    /// gone. A run in progress ends with an error.
    pub async fn restart(&self) -> Result<()> {
        self.check_live()?;
        self.stop().await?;
        let stream = self.interp().spawn_driver(&self.inner.spawn).await?;
        let mut slot = self.slot();
        slot.generation += 1;
        slot.info.pid = stream.pid;
        slot.reader = Some(FrameReader::new(stream));
        slot.ended = false;
        Ok(())
    }

    /// End the context: its interpreter is killed and waited for. Later calls on any handle
    /// of it are `NotFound`.
    pub async fn delete(&self) -> Result<()> {
        self.check_live()?;
        self.stop().await?;
        self.inner.deleted.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Kill the live interpreter of this context (whichever program started it) and wait
    /// until it has ended, so its tag is free.
    async fn stop(&self) -> Result<()> {
        let interp = self.interp();
        let pid = match interp.find(&self.inner.id).await? {
            Some((info, _)) => info.pid,
            None => return Ok(()),
        };
        let (reader, same) = {
            let mut slot = self.slot();
            let same = slot.info.pid == pid;
            (if same { slot.reader.take() } else { None }, same)
        };
        let mut reader = match reader {
            Some(r) => r,
            None => match interp
                .backend
                .attach(&interp.sandbox_id, ProcessSelector::Pid(pid))
                .await
            {
                Ok(s) => FrameReader::new(s),
                Err(e) if e.is_not_found() => return Ok(()),
                Err(e) => return Err(e),
            },
        };
        interp.signal_pid(pid, Signal::Kill).await?;
        let waited = tokio::time::timeout(EXIT_WAIT, reader.wait_exit()).await;
        if same {
            self.slot().generation += 1;
        }
        match waited {
            Ok(()) => Ok(()),
            Err(_) => Err(Error::Timeout {
                what: format!(
                    "code context {:?}: the killed interpreter did not end",
                    self.inner.id
                ),
            }),
        }
    }

    /// Hand the reader back after a run, unless the interpreter changed or ended meanwhile.
    fn give_back(&self, generation: u64, reader: FrameReader) {
        if reader.exited {
            self.mark_ended(generation);
            return;
        }
        let mut slot = self.slot();
        if slot.generation == generation && slot.reader.is_none() {
            slot.reader = Some(reader);
        }
    }
}

// ----- one run -----

/// The events of one run. A `Stream` of `Result<Event>` that ends after [`Event::End`] or
/// after an `Err` (the run's own errors are [`Event::Error`]). Dropping it stops reading; the
/// cell itself runs on.
pub struct Execution {
    events: Pin<Box<dyn Stream<Item = Result<Event>> + Send>>,
}

impl std::fmt::Debug for Execution {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Execution").finish_non_exhaustive()
    }
}

impl Stream for Execution {
    type Item = Result<Event>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<Self::Item>> {
        self.events.as_mut().poll_next(cx)
    }
}

impl Execution {
    /// The next event, `None` once the run is over.
    pub async fn next_event(&mut self) -> Option<Result<Event>> {
        self.events.next().await
    }

    /// Read the run to its end, keeping every event (for callers that want them all at once).
    pub async fn finish(mut self) -> Result<Vec<Event>> {
        let mut out = Vec::new();
        while let Some(event) = self.events.next().await {
            out.push(event?);
        }
        Ok(out)
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    /// The request waits in the driver's queue.
    Queued,
    /// The driver executes it.
    Running,
    /// Timed out while queued: a cancel was sent; waiting for `cancelled` (or `start`).
    Cancelling(Instant),
    /// Timed out while running: SIGINT was sent; waiting for the end.
    Interrupting(Instant),
    Done,
}

struct Run {
    context: Context,
    generation: u64,
    pid: u32,
    reader: Option<FrameReader>,
    token: String,
    deadline: Option<Instant>,
    timeout: Option<Duration>,
    grace: Duration,
    phase: Phase,
}

impl Drop for Run {
    fn drop(&mut self) {
        if let Some(reader) = self.reader.take() {
            self.context.give_back(self.generation, reader);
        }
    }
}

impl Run {
    fn timeout_error(&self, detail: &str) -> Error {
        let after = self
            .timeout
            .map(|t| format!(" after {:.3}s", t.as_secs_f64()))
            .unwrap_or_default();
        Error::Timeout {
            what: format!(
                "code execution in context {:?}{after}{detail}",
                self.context.inner.id
            ),
        }
    }

    fn finish(&mut self) {
        self.phase = Phase::Done;
        if let Some(reader) = self.reader.take() {
            self.context.give_back(self.generation, reader);
        }
    }

    async fn step(&mut self) -> Option<Result<Event>> {
        loop {
            let limit = match self.phase {
                Phase::Queued | Phase::Running => self.deadline,
                Phase::Cancelling(t) | Phase::Interrupting(t) => Some(t),
                Phase::Done => return None,
            };
            let reader = self.reader.as_mut()?;
            let next = match limit {
                Some(at) => match tokio::time::timeout_at(at, reader.next(&self.token)).await {
                    Ok(next) => next,
                    Err(_) => match self.expire().await {
                        Some(item) => return Some(item),
                        None => continue,
                    },
                },
                None => reader.next(&self.token).await,
            };
            let frame = match next {
                Ok(frame) => frame,
                Err(e) => {
                    self.phase = Phase::Done;
                    self.reader = None;
                    self.context.mark_ended(self.generation);
                    return Some(Err(e));
                }
            };
            match (frame, self.phase) {
                (frames::Frame::Start, Phase::Queued) => self.phase = Phase::Running,
                (frames::Frame::Start, Phase::Cancelling(_)) => {
                    // The cancel came too late: the run started; interrupt it instead.
                    let grace = self.grace;
                    if let Err(e) = self.interrupt().await {
                        self.finish();
                        return Some(Err(e));
                    }
                    self.phase = Phase::Interrupting(Instant::now() + grace);
                }
                (frames::Frame::Start, _) => {}
                (frames::Frame::Cancelled, _) => {
                    self.finish();
                    return Some(Err(self.timeout_error(" (it never started)")));
                }
                (frames::Frame::Event(Event::End), Phase::Interrupting(_)) => {
                    self.finish();
                    return Some(Err(self.timeout_error("")));
                }
                (frames::Frame::Event(_), Phase::Interrupting(_)) => {}
                (frames::Frame::Event(Event::End), _) => {
                    self.finish();
                    return Some(Ok(Event::End));
                }
                (frames::Frame::Event(event), _) => return Some(Ok(event)),
            }
        }
    }

    /// SIGINT to the interpreter running this run (`&mut`: the run is not `Sync`).
    async fn interrupt(&mut self) -> Result<()> {
        let interp = self.context.interp().clone();
        interp.signal_pid(self.pid, Signal::Int).await
    }

    /// The current limit passed: move on to the next phase, or give up.
    async fn expire(&mut self) -> Option<Result<Event>> {
        let now = Instant::now();
        match self.phase {
            Phase::Queued => {
                let line = format!("{{\"op\":\"cancel\",\"token\":\"{}\"}}\n", self.token);
                let interp = self.context.interp().clone();
                if let Err(e) = interp
                    .backend
                    .write_stdin(
                        &interp.sandbox_id,
                        ProcessSelector::Pid(self.pid),
                        WriteStdinOptions::new(line),
                    )
                    .await
                {
                    self.finish();
                    return Some(Err(e));
                }
                self.phase = Phase::Cancelling(now + self.grace);
                None
            }
            Phase::Running => {
                if let Err(e) = self.interrupt().await {
                    self.finish();
                    return Some(Err(e));
                }
                self.phase = Phase::Interrupting(now + self.grace);
                None
            }
            Phase::Cancelling(_) | Phase::Interrupting(_) => {
                // The cell ignored the interrupt: kill the interpreter (its state is lost).
                let interp = self.context.interp().clone();
                let mut killed = interp.signal_pid(self.pid, Signal::Kill).await;
                if let (Ok(()), Some(reader)) = (&killed, self.reader.as_mut()) {
                    // Report only once it is gone, so no caller sees it still listed.
                    if tokio::time::timeout(EXIT_WAIT, reader.wait_exit())
                        .await
                        .is_err()
                    {
                        killed = Err(Error::Timeout {
                            what: "the killed code-context interpreter did not end".into(),
                        });
                    }
                }
                self.phase = Phase::Done;
                self.reader = None;
                self.context.mark_ended(self.generation);
                Some(match killed {
                    Ok(()) => Err(self.timeout_error(
                        "; the cell did not stop when interrupted, so the interpreter was killed and its state lost",
                    )),
                    Err(e) => Err(e),
                })
            }
            Phase::Done => None,
        }
    }
}

// ----- reading the driver -----

/// The driver's output, cut into bounded lines and parsed against a run's token.
struct FrameReader {
    stream: ProcessStream,
    lines: frames::LineBuffer,
    pending: std::collections::VecDeque<Vec<u8>>,
    stderr_tail: Vec<u8>,
    exited: bool,
}

impl std::fmt::Debug for FrameReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameReader")
            .field("pid", &self.stream.pid)
            .finish_non_exhaustive()
    }
}

impl FrameReader {
    fn new(stream: ProcessStream) -> Self {
        FrameReader {
            stream,
            lines: frames::LineBuffer::default(),
            pending: Default::default(),
            stderr_tail: Vec::new(),
            exited: false,
        }
    }

    /// The next frame of the run with `token`; `Err` when the interpreter is gone.
    async fn next(&mut self, token: &str) -> Result<frames::Frame> {
        loop {
            while let Some(line) = self.pending.pop_front() {
                if let Some(frame) = frames::parse(&line, token) {
                    return Ok(frame);
                }
            }
            if self.exited {
                return Err(self.ended(None));
            }
            match self.stream.events.next().await {
                Some(Ok(ProcessEvent::Stdout(bytes))) => {
                    let mut out = Vec::new();
                    self.lines.push(&bytes, &mut out);
                    self.pending.extend(out);
                }
                Some(Ok(ProcessEvent::Stderr(bytes))) => {
                    self.stderr_tail.extend_from_slice(&bytes);
                    let excess = self.stderr_tail.len().saturating_sub(STDERR_TAIL);
                    self.stderr_tail.drain(..excess);
                }
                Some(Ok(ProcessEvent::Exit(status))) => {
                    self.exited = true;
                    return Err(self.ended(Some(status)));
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    self.exited = true;
                    return Err(e);
                }
                None => {
                    self.exited = true;
                    return Err(self.ended(None));
                }
            }
        }
    }

    fn ended(&self, status: Option<sandcove::ExitStatus>) -> Error {
        let how = match status {
            Some(s) => format!(" ({s:?})"),
            None => String::new(),
        };
        let tail = String::from_utf8_lossy(&self.stderr_tail);
        let tail = tail.trim();
        Error::backend(format!(
            "the code context's interpreter ended{how}{}{tail}",
            if tail.is_empty() { "" } else { ": " }
        ))
    }

    /// Read until the process has exited (output is dropped).
    async fn wait_exit(&mut self) {
        if self.exited {
            return;
        }
        while let Some(event) = self.stream.events.next().await {
            if matches!(event, Ok(ProcessEvent::Exit(_)) | Err(_)) {
                break;
            }
        }
        self.exited = true;
    }
}

// ----- text for facades -----

/// Decodes UTF-8 split across chunks: a sequence cut at a chunk's end is completed by the
/// next chunk; invalid bytes become U+FFFD.
#[derive(Debug, Default, Clone)]
pub struct Utf8Decoder {
    held: Vec<u8>,
}

impl Utf8Decoder {
    /// Text of `bytes` after what was held back; an incomplete trailing sequence is held.
    pub fn decode(&mut self, bytes: &[u8]) -> String {
        self.held.extend_from_slice(bytes);
        let keep = incomplete_suffix(&self.held);
        let rest = self.held.split_off(self.held.len() - keep);
        let text = String::from_utf8_lossy(&self.held).into_owned();
        self.held = rest;
        text
    }

    /// Whatever is held, as text (at the end of a stream).
    pub fn finish(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.held).into_owned();
        self.held.clear();
        text
    }
}

/// Length of a trailing, possibly valid but incomplete UTF-8 sequence (0 to 3 bytes).
fn incomplete_suffix(bytes: &[u8]) -> usize {
    for back in 1..=bytes.len().min(3) {
        let b = bytes[bytes.len() - back];
        if b & 0xC0 == 0x80 {
            continue; // a continuation byte: look further back for the lead
        }
        let need = match b {
            0xC2..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF4 => 4,
            _ => return 0,
        };
        return if need > back { back } else { 0 };
    }
    0
}

#[cfg(test)]
mod budget_tests {
    use super::{Admit, OutputBudget};

    #[test]
    fn a_budget_keeps_a_prefix_and_notes_the_first_drop_once() {
        let mut b = OutputBudget::new(10);
        assert_eq!(b.admit(6), Admit::Keep);
        assert_eq!(b.admit(5), Admit::FirstDrop);
        assert_eq!(
            b.admit(1),
            Admit::Drop,
            "a prefix: nothing after a drop is kept"
        );
        assert_eq!(b.admit(0), Admit::Drop);
        assert!(OutputBudget::note().contains("64 MiB"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_python_is_offered() {
        assert_eq!(check_language(None).unwrap(), "python");
        assert_eq!(check_language(Some("python3")).unwrap(), "python");
        assert_eq!(
            check_language(Some("r")).unwrap_err().code(),
            sandcove::ErrorCode::NotSupported
        );
    }

    fn caps(jupyter: bool, kernels: &[(&str, &str)]) -> Capabilities {
        Capabilities {
            jupyter,
            kernels: kernels
                .iter()
                .map(|(name, language)| KernelSpec {
                    name: name.to_string(),
                    language: language.to_string(),
                    display_name: name.to_string(),
                })
                .collect(),
        }
    }

    #[test]
    fn languages_resolve_to_kernels_or_the_builtin_driver() {
        let none = caps(false, &[]);
        assert_eq!(none.resolve(None).unwrap(), ("python".into(), None));
        assert_eq!(
            none.resolve(Some("python3")).unwrap(),
            ("python".into(), None)
        );
        let err = none.resolve(Some("r")).unwrap_err();
        assert_eq!(err.code(), sandcove::ErrorCode::NotSupported);
        assert!(err.to_string().contains("IRkernel"), "{err}");
        assert_eq!(none.languages(), ["python"]);

        let some = caps(
            true,
            &[("ir", "R"), ("other-py", "python"), ("python3", "python")],
        );
        assert_eq!(
            some.resolve(None).unwrap(),
            ("python".into(), Some("python3".into())),
            "python prefers the kernelspec named python3"
        );
        assert_eq!(
            some.resolve(Some("r")).unwrap(),
            ("r".into(), Some("ir".into()))
        );
        assert_eq!(
            some.resolve(Some("ir")).unwrap(),
            ("r".into(), Some("ir".into()))
        );
        assert_eq!(
            some.resolve(Some("other-py")).unwrap(),
            ("python".into(), Some("other-py".into()))
        );
        let err = some.resolve(Some("ts")).unwrap_err();
        assert!(err.to_string().contains("deno"), "{err}");
        assert_eq!(some.languages(), ["python", "r"]);
    }

    #[test]
    fn a_kernel_context_is_told_by_its_argv() {
        let argv = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            kernel_of(&argv(&[
                "python3",
                "-u",
                "-c",
                BOOTSTRAP,
                KERNEL_DRIVER_SOURCE,
                "ir"
            ])),
            Some("ir".into())
        );
        assert_eq!(
            kernel_of(&argv(&["python3", "-u", "-c", BOOTSTRAP, DRIVER_SOURCE])),
            None
        );
    }

    #[test]
    fn tags_round_trip_and_ids_are_checked() {
        assert_eq!(
            parse_tag(&make_tag("python", "ab-1")),
            Some(("python", "ab-1"))
        );
        assert_eq!(parse_tag("other"), None);
        assert!(is_context_tag(&make_tag("python", "x")));
        check_id("default").unwrap();
        for bad in ["", "a:b", "a b", "é", &"x".repeat(129)] {
            assert_eq!(
                check_id(bad).unwrap_err().code(),
                sandcove::ErrorCode::InvalidArgument,
                "{bad:?}"
            );
        }
    }

    #[test]
    fn envs_are_checked() {
        let bad = |k: &str, v: &str| {
            check_envs(&BTreeMap::from([(k.to_string(), v.to_string())])).is_err()
        };
        assert!(bad("", "v") && bad("A=B", "v") && bad("A", "a\0b"));
        assert!(!bad("A", "any value = fine"));
    }

    #[test]
    fn utf8_split_across_chunks_decodes_whole() {
        let text = "é€😀";
        let bytes = text.as_bytes();
        for cut in 0..=bytes.len() {
            let mut d = Utf8Decoder::default();
            let mut out = d.decode(&bytes[..cut]);
            out += &d.decode(&bytes[cut..]);
            out += &d.finish();
            assert_eq!(out, text, "cut at {cut}");
        }
        let mut d = Utf8Decoder::default();
        assert_eq!(d.decode(b"a\xffb"), "a\u{fffd}b");
        assert_eq!(d.decode(b"\xe2\x82"), "");
        assert_eq!(d.finish(), "\u{fffd}");
    }

    #[test]
    fn public_types_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Interpreter>();
        check::<Context>();
        check::<Event>();
        fn check_send<T: Send>() {}
        check_send::<Execution>();
    }
}
