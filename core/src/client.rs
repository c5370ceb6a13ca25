//! The ergonomic surface: a [`Client`] over any [`Backend`], and [`Sandbox`] handles.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;

use crate::{
    Backend, ByteStream, Capabilities, CreateOptions, Error, FileStat, ListDirOptions, ListOptions,
    MkdirOptions, Output, ProcessEvent, ProcessInfo, ProcessSelector, ProcessSpec, ProcessStream,
    RemoveOptions, Result, SandboxInfo, Signal, WriteOptions, DEFAULT_OUTPUT_LIMIT,
};

/// Env var naming a remote `sandcove serve` to use instead of the embedded engine.
pub const URL_ENV: &str = "SANDCOVE_URL";
/// Env var holding the API key for [`URL_ENV`].
pub const API_KEY_ENV: &str = "SANDCOVE_API_KEY";
/// Most bytes [`Sandbox::read`] collects in memory (a sandbox file can be made as large as
/// its disk allows; larger reads go through [`Sandbox::read_stream`]).
pub const MAX_READ_BYTES: u64 = 512 << 20;

/// Entry point: creates, finds and lists sandboxes on one backend.
#[derive(Debug, Clone)]
pub struct Client {
    backend: Arc<dyn Backend>,
}

impl Client {
    /// The runtime the environment selects: the embedded local engine, unless
    /// `SANDCOVE_URL` names a remote `sandcove serve` (then `SANDCOVE_API_KEY` is its key and
    /// an [`HttpBackend`](crate::HttpBackend) is used). Nothing is sent until the first call.
    pub fn from_env() -> Result<Self> {
        match std::env::var(URL_ENV) {
            Ok(url) if !url.is_empty() => {
                let key = std::env::var(API_KEY_ENV).unwrap_or_default();
                if key.is_empty() {
                    return Err(Error::Unauthenticated {
                        message: format!("{URL_ENV} is set but {API_KEY_ENV} is not"),
                    });
                }
                Self::remote(&url, &key)
            }
            _ => Self::local(),
        }
    }

    #[cfg(feature = "http")]
    fn remote(url: &str, key: &str) -> Result<Self> {
        Ok(Self::new(Arc::new(crate::HttpBackend::new(url, key)?)))
    }

    #[cfg(not(feature = "http"))]
    fn remote(_url: &str, _key: &str) -> Result<Self> {
        Err(Error::NotSupported {
            feature: format!("{URL_ENV} (a remote server)"),
            alternative: "build sandcove with its `http` feature".into(),
        })
    }

    /// The embedded local engine with its default state directory.
    #[cfg(not(feature = "local"))]
    pub fn local() -> Result<Self> {
        Err(Error::NotSupported {
            feature: "the embedded engine".into(),
            alternative: format!(
                "build sandcove with its `local` feature, or set {URL_ENV} to a `sandcove serve`"
            ),
        })
    }

    /// The embedded local engine with its default state directory.
    #[cfg(feature = "local")]
    pub fn local() -> Result<Self> {
        Ok(Self::new(Arc::new(crate::LocalBackend::new()?)))
    }

    /// A client over any backend.
    pub fn new(backend: Arc<dyn Backend>) -> Self {
        Client { backend }
    }

    /// The backend under this client.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// What the backend can do, as last learned (no I/O; see [`Client::ready`]).
    pub fn capabilities(&self) -> Capabilities {
        self.backend.capabilities()
    }

    /// What the backend can do, learned once (a remote server is asked on the first call).
    /// Every entry point of the client runs it, so [`Client::capabilities`] is accurate after
    /// any of them.
    pub async fn ready(&self) -> Result<Capabilities> {
        self.backend.ready().await
    }

    /// Create a sandbox.
    pub async fn create(&self, options: CreateOptions) -> Result<Sandbox> {
        self.ready().await?;
        let info = self.backend.create(options).await?;
        Ok(Sandbox {
            backend: self.backend.clone(),
            id: info.id,
        })
    }

    /// A handle to an existing sandbox, checked to exist.
    pub async fn connect(&self, id: &str) -> Result<Sandbox> {
        self.ready().await?;
        let info = self.backend.get(id).await?;
        Ok(Sandbox {
            backend: self.backend.clone(),
            id: info.id,
        })
    }

    /// Live sandboxes passing the filter.
    pub async fn list(&self, options: ListOptions) -> Result<Vec<SandboxInfo>> {
        self.ready().await?;
        self.backend.list(options).await
    }
}

/// A handle to one sandbox. Dropping it does nothing: the sandbox lives until destroyed or
/// its lease ends.
#[derive(Debug, Clone)]
pub struct Sandbox {
    backend: Arc<dyn Backend>,
    id: String,
}

impl Sandbox {
    /// The sandbox id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The backend it lives on.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// Current description.
    pub async fn info(&self) -> Result<SandboxInfo> {
        self.backend.get(&self.id).await
    }

    /// Move the lease end to `timeout` from now.
    pub async fn set_timeout(&self, timeout: Duration) -> Result<SandboxInfo> {
        self.backend.set_timeout(&self.id, timeout).await
    }

    /// Destroy the sandbox.
    pub async fn destroy(&self) -> Result<()> {
        self.backend.destroy(&self.id).await
    }

    /// Run a process to completion and collect its output (up to
    /// [`DEFAULT_OUTPUT_LIMIT`] bytes per stream; see [`Output::truncated`]).
    pub async fn run(&self, spec: ProcessSpec) -> Result<Output> {
        self.spawn(spec).await?.wait().await
    }

    /// Start a process and return a handle streaming its events.
    pub async fn spawn(&self, spec: ProcessSpec) -> Result<ProcessHandle> {
        let stream = self.backend.spawn(&self.id, spec).await?;
        Ok(self.handle(stream))
    }

    /// Attach to a running or recently finished process.
    pub async fn attach(&self, process: ProcessSelector) -> Result<ProcessHandle> {
        let stream = self.backend.attach(&self.id, process).await?;
        Ok(self.handle(stream))
    }

    fn handle(&self, stream: ProcessStream) -> ProcessHandle {
        ProcessHandle {
            backend: self.backend.clone(),
            sandbox_id: self.id.clone(),
            pid: stream.pid,
            stream,
        }
    }

    /// Processes started through the API.
    pub async fn processes(&self) -> Result<Vec<ProcessInfo>> {
        self.backend.list_processes(&self.id).await
    }

    /// Read a whole file into memory (at most [`MAX_READ_BYTES`]; larger files are an
    /// `InvalidArgument` error: stream them with [`Sandbox::read_stream`]).
    pub async fn read(&self, path: &str) -> Result<Vec<u8>> {
        let mut stream = self
            .backend
            .read_file(&self.id, path, Default::default())
            .await?;
        let mut out = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk?;
            if (out.len() + chunk.len()) as u64 > MAX_READ_BYTES {
                return Err(Error::invalid(format!(
                    "{path}: larger than {MAX_READ_BYTES} bytes, too large to read into memory;                      use read_stream"
                )));
            }
            out.extend_from_slice(&chunk);
        }
        Ok(out)
    }

    /// Read a file as a stream of chunks.
    pub async fn read_stream(&self, path: &str) -> Result<ByteStream> {
        self.backend
            .read_file(&self.id, path, Default::default())
            .await
    }

    /// Write a whole file (parents created), replacing it atomically.
    pub async fn write(&self, path: &str, data: impl Into<Vec<u8>>) -> Result<FileStat> {
        let data = data.into();
        let stream: ByteStream = Box::pin(futures::stream::once(async move { Ok(data) }));
        self.backend
            .write_file(&self.id, path, stream, WriteOptions::default())
            .await
    }

    /// Write a file from a stream with explicit options.
    pub async fn write_stream(
        &self,
        path: &str,
        data: ByteStream,
        options: WriteOptions,
    ) -> Result<FileStat> {
        self.backend.write_file(&self.id, path, data, options).await
    }

    /// List a directory to `depth` levels.
    pub async fn list_dir(&self, path: &str, depth: u32) -> Result<Vec<FileStat>> {
        self.backend
            .list_dir(&self.id, path, ListDirOptions { depth, user: None })
            .await
    }

    /// Metadata of a path (symlinks not followed).
    pub async fn stat(&self, path: &str) -> Result<FileStat> {
        self.backend.stat(&self.id, path, Default::default()).await
    }

    /// Whether a path exists.
    pub async fn exists(&self, path: &str) -> Result<bool> {
        match self.backend.stat(&self.id, path, Default::default()).await {
            Ok(_) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Create a directory with its parents.
    pub async fn mkdir(&self, path: &str) -> Result<FileStat> {
        self.backend
            .mkdir(&self.id, path, MkdirOptions::default())
            .await
    }

    /// Remove a path (directories recursively).
    pub async fn remove(&self, path: &str) -> Result<()> {
        self.backend
            .remove(&self.id, path, RemoveOptions { recursive: true })
            .await
    }

    /// Rename a path.
    pub async fn rename(&self, from: &str, to: &str) -> Result<FileStat> {
        self.backend.rename(&self.id, from, to).await
    }

    /// Change permission bits.
    pub async fn chmod(&self, path: &str, mode: u32) -> Result<FileStat> {
        self.backend.chmod(&self.id, path, mode).await
    }
}

/// A started process: its events, stdin and signals.
#[derive(Debug)]
pub struct ProcessHandle {
    backend: Arc<dyn Backend>,
    sandbox_id: String,
    pid: u32,
    stream: ProcessStream,
}

impl ProcessHandle {
    /// Pid inside the sandbox.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The next event; `None` after the exit event has been returned.
    pub async fn next_event(&mut self) -> Option<Result<ProcessEvent>> {
        self.stream.events.next().await
    }

    /// Consume the handle into its raw event stream.
    pub fn into_stream(self) -> ProcessStream {
        self.stream
    }

    /// Write to stdin.
    pub async fn write_stdin(&self, data: impl Into<Vec<u8>>) -> Result<()> {
        self.backend
            .write_stdin(
                &self.sandbox_id,
                ProcessSelector::Pid(self.pid),
                data.into(),
            )
            .await
    }

    /// Close stdin.
    pub async fn close_stdin(&self) -> Result<()> {
        self.backend
            .close_stdin(&self.sandbox_id, ProcessSelector::Pid(self.pid))
            .await
    }

    /// Signal the process group.
    pub async fn signal(&self, signal: Signal) -> Result<()> {
        self.backend
            .signal(&self.sandbox_id, ProcessSelector::Pid(self.pid), signal)
            .await
    }

    /// Kill the process group.
    pub async fn kill(&self) -> Result<()> {
        self.signal(Signal::Kill).await
    }

    /// Collect everything until exit (see [`collect`]).
    pub async fn wait(self) -> Result<Output> {
        collect(self.stream, DEFAULT_OUTPUT_LIMIT).await
    }
}

/// Drain a process stream into an [`Output`], keeping at most `limit` bytes per stream. Past
/// the limit bytes are counted as dropped and [`Output::truncated`] is set; the stream is still
/// drained to the end so the exit status is always known.
pub async fn collect(mut stream: ProcessStream, limit: usize) -> Result<Output> {
    let mut out = Output {
        pid: stream.pid,
        ..Default::default()
    };
    while let Some(event) = stream.events.next().await {
        match event? {
            ProcessEvent::Start { pid } => out.pid = pid,
            ProcessEvent::Stdout(bytes) => {
                append_limited(&mut out.stdout, &bytes, limit, &mut out.truncated)
            }
            ProcessEvent::Stderr(bytes) => {
                append_limited(&mut out.stderr, &bytes, limit, &mut out.truncated)
            }
            ProcessEvent::Gap { .. } => out.truncated = true,
            ProcessEvent::Live | ProcessEvent::Restarted { .. } => {}
            ProcessEvent::Exit(status) => {
                out.status = Some(status);
                return Ok(out);
            }
        }
    }
    Err(Error::backend(
        "process stream ended without an exit status",
    ))
}

fn append_limited(buf: &mut Vec<u8>, bytes: &[u8], limit: usize, truncated: &mut bool) {
    let room = limit.saturating_sub(buf.len());
    if bytes.len() > room {
        *truncated = true;
    }
    buf.extend_from_slice(&bytes[..bytes.len().min(room)]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ExitStatus;

    fn stream_of(events: Vec<Result<ProcessEvent>>) -> ProcessStream {
        ProcessStream {
            pid: 7,
            events: Box::pin(futures::stream::iter(events)),
        }
    }

    #[tokio::test]
    async fn collect_keeps_bytes_and_flags_truncation() {
        let exit = ExitStatus {
            code: Some(3),
            signal: None,
            timed_out: false,
        };
        let out = collect(
            stream_of(vec![
                Ok(ProcessEvent::Stdout(vec![0, 0xff, b'a'])),
                Ok(ProcessEvent::Stderr(b"err".to_vec())),
                Ok(ProcessEvent::Stdout(b"bcdef".to_vec())),
                Ok(ProcessEvent::Exit(exit)),
            ]),
            5,
        )
        .await
        .unwrap();
        assert_eq!(out.stdout, [0, 0xff, b'a', b'b', b'c']);
        assert_eq!(out.stderr, b"err");
        assert!(out.truncated);
        assert_eq!(out.exit_code(), 3);
    }

    #[tokio::test]
    async fn a_stream_without_exit_is_an_error() {
        let err = collect(stream_of(vec![Ok(ProcessEvent::Stdout(b"x".to_vec()))]), 10)
            .await
            .unwrap_err();
        assert_eq!(err.code(), crate::ErrorCode::Backend);
    }

    #[test]
    fn public_types_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Client>();
        check::<Sandbox>();
        check::<crate::Error>();
        check::<crate::SandboxInfo>();
        #[cfg(feature = "local")]
        check::<crate::LocalBackend>();
        fn check_send<T: Send>() {}
        check_send::<ProcessHandle>();
    }
}
