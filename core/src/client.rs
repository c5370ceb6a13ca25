//! The ergonomic surface: a [`Client`] over any [`Backend`], and [`Sandbox`] handles.

use std::collections::BTreeMap;
use std::future::IntoFuture;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{FutureExt, Stream, StreamExt};

use crate::{
    capability::{CheckStatus, LeaseBounds},
    Backend, ByteStream, Capabilities, CreateOptions, Error, Feature, FileStat, FileUrl,
    FileUrlOptions, ListDirOptions, ListOptions, Metrics, MkdirOptions, Output, Preview,
    PreviewOptions, PreviewToken, ProcessEvent, ProcessInfo, ProcessSelector, ProcessSpec,
    ProcessStream, PtySize, ReadOptions, RemoveOptions, RenameOptions, Result, SandboxInfo, Signal,
    SnapshotInfo, StatOptions, VolumeInfo, WatchOptions, WatchStream, WriteOptions,
    DEFAULT_MEMORY_FILE_BYTES, DEFAULT_OUTPUT_LIMIT, MAX_MEMORY_FILE_BYTES,
};
use crate::{
    ChmodOptions, CopyOptions, PreviewTokenOptions, ResizePtyOptions, SetLabelsOptions,
    SetTimeoutOptions, SignalOptions, SnapshotOptions, WriteStdinOptions,
};

/// Env var naming a remote `sandcove serve` to use instead of the embedded engine.
pub const URL_ENV: &str = "SANDCOVE_URL";
/// Env var holding the API key for [`URL_ENV`].
pub const API_KEY_ENV: &str = "SANDCOVE_API_KEY";
/// The largest bound [`Sandbox::read`] accepts (an alias of [`MAX_MEMORY_FILE_BYTES`], kept
/// for callers of earlier versions; the default bound is [`DEFAULT_MEMORY_FILE_BYTES`]).
pub const MAX_READ_BYTES: u64 = MAX_MEMORY_FILE_BYTES;

/// Entry point: creates, finds and lists sandboxes on one backend.
#[derive(Debug, Clone)]
pub struct Client {
    backend: Arc<dyn Backend>,
    /// Bound of the in-memory file calls of this client's sandboxes.
    memory_file_bytes: u64,
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
        Client {
            backend,
            memory_file_bytes: DEFAULT_MEMORY_FILE_BYTES,
        }
    }

    /// This client with another bound for the in-memory file calls of its sandboxes
    /// ([`Sandbox::read`], [`Sandbox::write`]; default [`DEFAULT_MEMORY_FILE_BYTES`]). Above
    /// [`MAX_MEMORY_FILE_BYTES`] (or zero) is [`Error::InvalidArgument`]: stream larger files.
    pub fn with_memory_file_bytes(mut self, bytes: u64) -> Result<Self> {
        self.memory_file_bytes = check_memory_bound(bytes)?;
        Ok(self)
    }

    /// The bound of the in-memory file calls (see [`Client::with_memory_file_bytes`]).
    pub fn memory_file_bytes(&self) -> u64 {
        self.memory_file_bytes
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

    /// Evaluate a create with `options` without allocating anything (a remote server is
    /// asked for its capabilities, nothing else): [`CheckStatus::Supported`] with what will
    /// hold, [`CheckStatus::Unsupported`] with the alternative, [`CheckStatus::Unavailable`]
    /// when the runtime cannot do it now (a server that cannot be reached is this, never
    /// "unsupported"), or [`CheckStatus::Unknown`]. Bad options are
    /// [`Error::InvalidArgument`]; an error that says nothing about the runtime's
    /// availability (a wrong API key) is returned as it is. [`Client::create`] runs the same
    /// check before any effect.
    ///
    /// An image the runtime's capabilities do not list (on a runtime with images) is asked
    /// of its store, which never pulls: stored, it is checked as any create; pullable, the
    /// create is [`CheckStatus::Unavailable`] until it is pulled; neither, unknown.
    pub async fn check_create(&self, options: &CreateOptions) -> Result<CheckStatus> {
        options.validate()?;
        let caps = match self.runtime_status().await? {
            Ok(caps) => caps,
            Err(status) => return Ok(status),
        };
        let Some(image) = unlisted_image(&caps, options) else {
            return Ok(caps.evaluate_create(options));
        };
        let mut rest = options.clone();
        rest.template = None;
        Ok(match self.backend.image_availability(&image).await {
            Ok(crate::ImageAvailability::Available) => caps.evaluate_create(&rest),
            Ok(crate::ImageAvailability::Pullable) => CheckStatus::Unavailable {
                reason: format!("image {image:?} is not stored here; its registry has it"),
                remedy: format!(
                    "pull it first (`sandcove image pull {image}`, Client::pull_image)"
                ),
            },
            Ok(crate::ImageAvailability::Unknown) => CheckStatus::Unknown {
                what: format!(
                    "image {image:?}: not stored here, and no registry confirmed it (a \
                     reference to check, or a registry that cannot be reached)"
                ),
            },
            Err(_) => caps.evaluate_create(options),
        })
    }

    /// Evaluate a snapshot (or fork) without taking one: [`CheckStatus::Supported`] naming
    /// what a snapshot keeps (files, not processes), or why not, as [`Client::check_create`].
    pub async fn check_snapshot(&self) -> Result<CheckStatus> {
        Ok(match self.runtime_status().await? {
            Ok(caps) => caps.evaluate_snapshot(),
            Err(status) => status,
        })
    }

    /// The capabilities, or the check status for a runtime that cannot be reached now.
    async fn runtime_status(&self) -> Result<std::result::Result<Capabilities, CheckStatus>> {
        match self.ready().await {
            Ok(caps) => Ok(Ok(caps)),
            Err(Error::Unavailable { reason, remedy }) => {
                Ok(Err(CheckStatus::Unavailable { reason, remedy }))
            }
            Err(e @ (Error::Timeout { .. } | Error::Backend { .. })) if e.is_retryable() => {
                Ok(Err(CheckStatus::Unavailable {
                    reason: e.to_string(),
                    remedy: "retry once the runtime answers".into(),
                }))
            }
            Err(e) => Err(e),
        }
    }

    /// Create a sandbox. Bad options are [`Error::InvalidArgument`]; otherwise the
    /// [`Client::check_create`] evaluation runs first and anything but supported is its
    /// error ([`Error::NotSupported`], or [`Error::Unavailable`] for unavailable and
    /// unknown), all before anything is sent.
    pub async fn create(&self, options: CreateOptions) -> Result<Sandbox> {
        Ok(self.create_described(options).await?.0)
    }

    /// [`Client::create`], also returning the new sandbox's description as the backend made
    /// it (no second round trip for a caller that needs its user, home or envs).
    pub async fn create_described(&self, options: CreateOptions) -> Result<(Sandbox, SandboxInfo)> {
        options.validate()?;
        let status = match self.runtime_status().await? {
            Ok(caps) => {
                // Whether a runtime with images holds the one named is its store's answer, at
                // the create (`NotFound` when it does not); everything else is checked here.
                if unlisted_image(&caps, &options).is_some() {
                    let mut rest = options.clone();
                    rest.template = None;
                    caps.evaluate_create(&rest)
                } else {
                    caps.evaluate_create(&options)
                }
            }
            Err(status) => status,
        };
        status.into_result()?;
        let info = self.backend.create(options).await?;
        Ok((self.sandbox(info.id.clone()), info))
    }

    /// A handle to an existing sandbox, checked to exist.
    pub async fn connect(&self, id: &str) -> Result<Sandbox> {
        self.ready().await?;
        let info = self.backend.get(id).await?;
        Ok(self.sandbox(info.id))
    }

    /// A handle to the sandbox `id` without asking the backend (no I/O): for a program that
    /// already knows the id is live, e.g. from [`Client::list`]. A call on a sandbox that is
    /// gone fails with [`Error::NotFound`].
    pub fn sandbox(&self, id: impl Into<String>) -> Sandbox {
        Sandbox {
            backend: self.backend.clone(),
            id: id.into(),
            memory_file_bytes: self.memory_file_bytes,
        }
    }

    /// Live sandboxes passing the filter.
    pub async fn list(&self, options: ListOptions) -> Result<Vec<SandboxInfo>> {
        self.ready().await?;
        self.backend.list(options).await
    }

    /// All snapshots.
    pub async fn snapshots(&self) -> Result<Vec<SnapshotInfo>> {
        self.require(Feature::Snapshots).await?;
        self.backend.list_snapshots().await
    }

    /// Delete a snapshot.
    pub async fn delete_snapshot(&self, snapshot_id: &str) -> Result<()> {
        self.require(Feature::Snapshots).await?;
        self.backend.delete_snapshot(snapshot_id).await
    }

    /// Create a named volume.
    pub async fn create_volume(&self, name: &str) -> Result<VolumeInfo> {
        self.require(Feature::Volumes).await?;
        self.backend.create_volume(name).await
    }

    /// Describe a volume.
    pub async fn volume(&self, name: &str) -> Result<VolumeInfo> {
        self.require(Feature::Volumes).await?;
        self.backend.get_volume(name).await
    }

    /// All volumes.
    pub async fn volumes(&self) -> Result<Vec<VolumeInfo>> {
        self.require(Feature::Volumes).await?;
        self.backend.list_volumes().await
    }

    /// Delete a volume.
    pub async fn delete_volume(&self, name: &str) -> Result<()> {
        self.require(Feature::Volumes).await?;
        self.backend.delete_volume(name).await
    }

    /// The images the runtime has stored ([`Capabilities::images`](crate::Capabilities::images)):
    /// a sandbox created with a template naming one of their references runs it.
    pub async fn images(&self) -> Result<Vec<crate::ImageSummary>> {
        self.backend.list_images().await
    }

    /// Pull an image from its registry into the runtime's store; answers once it is stored.
    pub async fn pull_image(&self, reference: &str) -> Result<crate::ImageSummary> {
        self.backend.pull_image(reference).await
    }

    /// [`pull_image`](Self::pull_image), reporting each layer's progress to `progress` as
    /// the runtime reports it (the embedded engine and a server both do; `progress` runs on
    /// the pull's task: keep it short).
    pub async fn pull_image_with_progress(
        &self,
        reference: &str,
        progress: &(dyn Fn(crate::ImagePullProgress) + Send + Sync),
    ) -> Result<crate::ImageSummary> {
        self.backend
            .pull_image_with_progress(reference, progress)
            .await
    }

    /// Import the images of an archive (an `oci-archive`, or a `docker save` / `podman save`
    /// tarball, compressed or not), streamed from `archive`, into the runtime's store; `tag`
    /// names the image of a one-image archive. An error item in `archive` abandons the import
    /// with nothing stored. A server bounds the archive (its largest upload and its store's
    /// bound, `FileTooLarge` past either).
    pub async fn import_image(
        &self,
        archive: ByteStream,
        tag: Option<&str>,
    ) -> Result<Vec<crate::ImageSummary>> {
        self.backend.import_image(archive, tag).await
    }

    /// [`import_image`](Self::import_image) of the archive in the file `path` on this host,
    /// read as it is sent (never whole in memory).
    pub async fn import_image_file(
        &self,
        path: &std::path::Path,
        tag: Option<&str>,
    ) -> Result<Vec<crate::ImageSummary>> {
        let what = format!("open the image archive {}", path.display());
        let file = tokio::fs::File::open(path)
            .await
            .map_err(|e| Error::from_io(&e, &what))?;
        self.import_image(file_chunks(file, path), tag).await
    }

    /// Everything the runtime's store has of the image `reference` (a reference or a
    /// digest) names: its config's run settings (`Env`, `WorkingDir`, `User`, `Entrypoint`,
    /// `Cmd`), platform and layers. `NotFound` when it is not stored; never pulls.
    pub async fn inspect_image(&self, reference: &str) -> Result<crate::ImageDetails> {
        self.backend.inspect_image(reference).await
    }

    /// Remove an image reference from the runtime's store.
    pub async fn remove_image(&self, reference: &str) -> Result<()> {
        self.backend.remove_image(reference).await
    }

    /// Remove the images and layers nothing uses from the runtime's store.
    pub async fn prune_images(&self) -> Result<crate::ImagePruneReport> {
        self.backend.prune_images().await
    }

    /// What happened to an operation (see [`crate::operation`]): after a call failed with
    /// [`Error::OutcomeUnknown`], this says whether it took effect (and what it made)
    /// without doing it again. A remote server answers from its record; the embedded engine
    /// records nothing and answers [`OperationStatus::Unknown`](crate::OperationStatus).
    pub async fn observe(&self, operation: &crate::OperationId) -> Result<crate::OperationStatus> {
        self.backend.observe(operation).await
    }

    /// The one capability check before dispatch (see [`crate::capability`]).
    async fn require(&self, feature: Feature) -> Result<()> {
        self.ready().await?.require(feature)
    }
}

/// What [`Sandbox::renew`] did.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Renewal {
    /// The sandbox afterwards ([`SandboxInfo::ends_at`] is the new lease end).
    pub info: SandboxInfo,
    /// The lease asked for.
    pub requested: Duration,
    /// The lease in force: `requested` rounded up to the runtime's step.
    pub resolved: Duration,
    /// The runtime's bounds (the engine's when the runtime does not report them).
    pub bounds: LeaseBounds,
}

/// A handle to one sandbox. Dropping it does nothing: the sandbox lives until destroyed or
/// its lease ends.
#[derive(Debug, Clone)]
pub struct Sandbox {
    backend: Arc<dyn Backend>,
    id: String,
    /// Bound of the in-memory file calls (from the client that made this handle).
    memory_file_bytes: u64,
}

/// Check a bound for the in-memory file calls.
fn check_memory_bound(bytes: u64) -> Result<u64> {
    if bytes == 0 || bytes > MAX_MEMORY_FILE_BYTES {
        return Err(Error::invalid(format!(
            "in-memory file bound {bytes}: must be between 1 and {MAX_MEMORY_FILE_BYTES} \
             bytes; stream larger files (read_stream / write_stream)"
        )));
    }
    Ok(bytes)
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

    /// A client on the backend this sandbox lives on (for calls that name no sandbox:
    /// snapshots, volumes, creating another sandbox).
    pub fn client(&self) -> Client {
        Client {
            backend: self.backend.clone(),
            memory_file_bytes: self.memory_file_bytes,
        }
    }

    /// The one capability check before dispatch (see [`crate::capability`]): the backend's
    /// capabilities are known once the client that made this handle was ready, so this does
    /// no I/O after the first call.
    async fn require(&self, feature: Feature) -> Result<()> {
        self.backend.ready().await?.require(feature)
    }

    /// Current description.
    pub async fn info(&self) -> Result<SandboxInfo> {
        self.backend.get(&self.id).await
    }

    /// Move the lease end to `timeout` from now. A lease outside the runtime's
    /// [`LeaseBounds`] (zero included) is [`Error::InvalidArgument`] naming them, before any
    /// effect; [`Sandbox::renew`] also reports the lease as resolved.
    pub async fn set_timeout(&self, timeout: Duration) -> Result<SandboxInfo> {
        Ok(self.renew(timeout).await?.info)
    }

    /// [`Sandbox::set_timeout`], reporting the bounds the runtime applies and the lease
    /// resolved within them.
    pub async fn renew(&self, timeout: Duration) -> Result<Renewal> {
        let bounds = self
            .backend
            .ready()
            .await?
            .lease
            .unwrap_or_else(LeaseBounds::engine);
        let resolved = bounds.resolve(timeout)?;
        let info = self
            .backend
            .set_timeout(&self.id, SetTimeoutOptions::new(resolved))
            .await?;
        Ok(Renewal {
            info,
            requested: timeout,
            resolved,
            bounds,
        })
    }

    /// Change what the end of the lease does ([`CreateOptions::on_timeout`]): destroy the
    /// sandbox, pause it (where [`Capabilities::pause`] holds) or stop it (where
    /// [`Capabilities::lease_stop`] does).
    pub async fn set_on_timeout(&self, action: crate::TimeoutAction) -> Result<SandboxInfo> {
        self.backend
            .set_on_timeout(&self.id, crate::SetOnTimeoutOptions::new(action))
            .await
    }

    /// Destroy the sandbox.
    pub async fn destroy(&self) -> Result<()> {
        self.backend.destroy(&self.id).await
    }

    /// Run a process to completion and collect its output (up to
    /// [`DEFAULT_OUTPUT_LIMIT`] bytes per stream; see [`Output::truncated`]). A string is a
    /// shell command line; options are set on the returned call, which runs when awaited:
    /// `sandbox.run("ls").cwd("/tmp").await`.
    pub fn run(&self, command: impl Into<ProcessSpec>) -> Run {
        Run {
            sandbox: self.clone(),
            spec: command.into(),
        }
    }

    /// Start a process and return a handle streaming its events (awaited like [`run`]:
    /// `sandbox.spawn("server").tag("web").await`).
    ///
    /// [`run`]: Sandbox::run
    pub fn spawn(&self, command: impl Into<ProcessSpec>) -> Spawn {
        Spawn(self.run(command))
    }

    async fn start_process(&self, spec: ProcessSpec) -> Result<ProcessHandle> {
        // Validated once, by the backend that takes the call (every Backend validates its
        // input at its entry; see `Backend::spawn`).
        self.backend.ready().await?.check_spawn(&spec)?;
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

    /// Write to the stdin of a process found by pid or tag (see [`ProcessHandle::write_stdin`]
    /// for a process this program started).
    pub async fn write_stdin(
        &self,
        process: ProcessSelector,
        data: impl Into<Vec<u8>>,
    ) -> Result<()> {
        self.backend
            .write_stdin(&self.id, process, WriteStdinOptions::new(data))
            .await
    }

    /// Close the stdin of a process found by pid or tag.
    pub async fn close_stdin(&self, process: ProcessSelector) -> Result<()> {
        self.backend.close_stdin(&self.id, process).await
    }

    /// Signal the process group of a process found by pid or tag.
    pub async fn signal(&self, process: ProcessSelector, signal: Signal) -> Result<()> {
        self.backend
            .signal(&self.id, process, SignalOptions::new(signal))
            .await
    }

    /// Resize the pseudo-terminal of a process found by pid or tag.
    pub async fn resize_pty(&self, process: ProcessSelector, size: PtySize) -> Result<()> {
        self.require(Feature::Pty).await?;
        self.backend
            .resize_pty(&self.id, process, ResizePtyOptions::new(size))
            .await
    }

    /// Replace the sandbox's labels.
    pub async fn set_labels(&self, labels: BTreeMap<String, String>) -> Result<SandboxInfo> {
        self.backend
            .set_labels(&self.id, SetLabelsOptions::new(labels))
            .await
    }

    /// Update the sandbox's annotations atomically (see [`Backend::update_annotations`]);
    /// returns the new map.
    pub async fn update_annotations(
        &self,
        update: crate::AnnotationUpdate,
    ) -> Result<BTreeMap<String, String>> {
        self.backend.update_annotations(&self.id, update).await
    }

    /// End every process but keep the files; [`Sandbox::start`] runs it again.
    pub async fn stop(&self) -> Result<SandboxInfo> {
        self.backend.stop(&self.id).await
    }

    /// Start a stopped sandbox again.
    pub async fn start(&self) -> Result<SandboxInfo> {
        self.backend.start(&self.id).await
    }

    /// Freeze every process; memory and processes are kept.
    pub async fn pause(&self) -> Result<SandboxInfo> {
        self.require(Feature::Pause).await?;
        self.backend.pause(&self.id).await
    }

    /// Continue a paused sandbox.
    pub async fn resume(&self) -> Result<SandboxInfo> {
        self.require(Feature::Pause).await?;
        self.backend.resume(&self.id).await
    }

    /// Current resource usage.
    pub async fn metrics(&self) -> Result<Metrics> {
        self.require(Feature::Metrics).await?;
        self.backend.metrics(&self.id).await
    }

    /// Watch a directory for changes; dropping the stream stops the watch.
    pub async fn watch(&self, path: &str, options: WatchOptions) -> Result<WatchStream> {
        self.require(Feature::Watch).await?;
        self.backend.watch(&self.id, path, options).await
    }

    /// Make a port inside the sandbox reachable from the host. A private preview's token is
    /// checked by the preview listener and stripped from the request (header and query
    /// parameter) before it reaches the sandboxed server; its lifetime, when given, is
    /// within [`MIN_PREVIEW_TOKEN_TTL`](crate::validate::MIN_PREVIEW_TOKEN_TTL) and
    /// [`MAX_PREVIEW_TOKEN_TTL`](crate::validate::MAX_PREVIEW_TOKEN_TTL).
    pub async fn expose_port(&self, options: PreviewOptions) -> Result<Preview> {
        crate::validate::validate_token_ttl(options.token_ttl)?;
        self.require(Feature::Previews).await?;
        self.backend.expose_port(&self.id, options).await
    }

    /// The sandbox's previews.
    pub async fn previews(&self) -> Result<Vec<Preview>> {
        self.require(Feature::Previews).await?;
        self.backend.list_previews(&self.id).await
    }

    /// Close the preview of `port`.
    pub async fn close_preview(&self, port: u16) -> Result<()> {
        self.require(Feature::Previews).await?;
        self.backend.close_preview(&self.id, port).await
    }

    /// A signed URL for one operation on one path of this sandbox, as one user, until
    /// `options.expires_at` (at most
    /// [`MAX_FILE_URL_TTL`](crate::MAX_FILE_URL_TTL) ahead) or the sandbox's end: whoever
    /// holds it reads the file with a plain `GET` or writes it with `PUT`/`POST` (the raw
    /// body, or one `file` part of a `multipart/form-data` body), no other credential needed.
    /// It is served outside the sandbox (the embedded engine's monitor, or `sandcove serve`)
    /// through the file API, with its path confinement, user checks and bounds; nothing runs
    /// in the sandbox for it. A request for another operation or path is refused before any
    /// effect, as is a tampered, expired or destroyed sandbox's URL.
    ///
    /// ```no_run
    /// # async fn f(sandbox: sandcove::Sandbox) -> sandcove::Result<()> {
    /// use sandcove::FileUrlOptions;
    /// let upload = sandbox.file_url(FileUrlOptions::write("report.csv")).await?;
    /// println!("curl -T report.csv {}", upload.url);
    /// # Ok(()) }
    /// ```
    pub async fn file_url(&self, options: FileUrlOptions) -> Result<FileUrl> {
        options.validate(crate::now_millis())?;
        self.require(Feature::FileUrls).await?;
        self.backend.create_file_url(&self.id, options).await
    }

    /// Another token for the private preview of `port`, valid until `expires_at` (ms since
    /// the epoch; in the future and at most
    /// [`MAX_PREVIEW_TOKEN_TTL`](crate::validate::MAX_PREVIEW_TOKEN_TTL) ahead, else
    /// [`Error::InvalidArgument`]) or, with `None`, for the sandbox's life.
    pub async fn create_preview_token(
        &self,
        port: u16,
        expires_at: Option<u64>,
    ) -> Result<PreviewToken> {
        crate::validate::validate_token_expiry(expires_at, crate::now_millis())?;
        self.require(Feature::Previews).await?;
        let mut options = PreviewTokenOptions::default();
        options.expires_at = expires_at;
        self.backend
            .create_preview_token(&self.id, port, options)
            .await
    }

    /// Revoke the token `token` (its value) of the private preview of `port`: requests that
    /// carry it are refused from now on (a connection already upgraded, e.g. a websocket, is
    /// not cut). An unknown token is [`Error::NotFound`].
    pub async fn revoke_preview_token(&self, port: u16, token: &str) -> Result<()> {
        self.require(Feature::Previews).await?;
        self.backend
            .revoke_preview_token(&self.id, port, token)
            .await
    }

    /// Snapshot the sandbox's files (not its processes or memory; see
    /// [`capability::SNAPSHOT_PRESERVES`](crate::capability::SNAPSHOT_PRESERVES)). A running
    /// sandbox is paused for it and resumed after; when that resume fails the snapshot is
    /// still returned, with [`SnapshotInfo::source_resume_error`] set.
    pub async fn snapshot(&self, name: Option<String>) -> Result<SnapshotInfo> {
        let mut options = SnapshotOptions::default();
        options.name = name;
        self.snapshot_with(options).await
    }

    /// [`Sandbox::snapshot`] with every option: asking for
    /// [`memory`](SnapshotOptions::memory) where snapshots keep files only is
    /// [`Error::NotSupported`], before any effect.
    pub async fn snapshot_with(&self, options: SnapshotOptions) -> Result<SnapshotInfo> {
        self.require(Feature::Snapshots).await?;
        if options.memory {
            self.require(Feature::SnapshotMemory).await?;
        }
        self.backend.snapshot(&self.id, options).await
    }

    /// A new sandbox with a copy of this one's files (not its processes).
    pub async fn fork(&self, options: CreateOptions) -> Result<Sandbox> {
        Ok(self.fork_described(options).await?.0)
    }

    /// [`Sandbox::fork`], also returning the new sandbox's description.
    pub async fn fork_described(&self, options: CreateOptions) -> Result<(Sandbox, SandboxInfo)> {
        let client = self.client();
        client.check_snapshot().await?.into_result()?;
        client.check_create(&options).await?.into_result()?;
        let info = self.backend.fork(&self.id, options).await?;
        let forked = Sandbox {
            backend: self.backend.clone(),
            id: info.id.clone(),
            memory_file_bytes: self.memory_file_bytes,
        };
        Ok((forked, info))
    }

    /// Processes started through the API.
    pub async fn processes(&self) -> Result<Vec<ProcessInfo>> {
        self.backend.list_processes(&self.id).await
    }

    /// Read a whole file into memory: at most the in-memory bound
    /// ([`DEFAULT_MEMORY_FILE_BYTES`] unless the client raised it); a larger file is
    /// [`Error::FileTooLarge`], refused before it is sent: stream it with
    /// [`Sandbox::read_stream`].
    pub async fn read(&self, path: &str) -> Result<Vec<u8>> {
        self.read_with(path, ReadOptions::default()).await
    }

    /// [`Sandbox::read`] with options (e.g. as a user); [`ReadOptions::max_bytes`] sets this
    /// call's bound (at most [`MAX_MEMORY_FILE_BYTES`]).
    pub async fn read_with(&self, path: &str, mut options: ReadOptions) -> Result<Vec<u8>> {
        let limit = check_memory_bound(options.max_bytes.unwrap_or(self.memory_file_bytes))?;
        options.max_bytes = Some(limit);
        let mut stream = self.backend.read_file(&self.id, path, options).await?;
        let mut out = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk?;
            // The backend refuses a file over the bound when it opens it; this catches one
            // that grows meanwhile, or a backend that does not check.
            if (out.len() + chunk.len()) as u64 > limit {
                return Err(Error::file_too_large(path, limit));
            }
            out.extend_from_slice(&chunk);
        }
        Ok(out)
    }

    /// Read a file as a stream of chunks (no bound but the backend's).
    pub async fn read_stream(&self, path: &str) -> Result<ByteStream> {
        self.read_stream_with(path, ReadOptions::default()).await
    }

    /// [`Sandbox::read_stream`] with options (e.g. as a user).
    pub async fn read_stream_with(&self, path: &str, options: ReadOptions) -> Result<ByteStream> {
        self.backend.read_file(&self.id, path, options).await
    }

    /// Write a whole file from memory (parents created), replacing it atomically. More than
    /// the in-memory bound is [`Error::FileTooLarge`] before anything is sent: stream it
    /// with [`Sandbox::write_stream`].
    pub async fn write(&self, path: &str, data: impl Into<Vec<u8>>) -> Result<FileStat> {
        self.write_with(path, data, WriteOptions::default()).await
    }

    /// [`Sandbox::write`] with options: no-clobber ([`WriteOptions::overwrite`]), mode, user;
    /// [`WriteOptions::max_bytes`] sets this call's bound (at most [`MAX_MEMORY_FILE_BYTES`]).
    pub async fn write_with(
        &self,
        path: &str,
        data: impl Into<Vec<u8>>,
        mut options: WriteOptions,
    ) -> Result<FileStat> {
        let data = data.into();
        let limit = check_memory_bound(options.max_bytes.unwrap_or(self.memory_file_bytes))?;
        if data.len() as u64 > limit {
            return Err(Error::file_too_large(path, limit));
        }
        options.max_bytes = Some(limit);
        let stream: ByteStream = Box::pin(futures::stream::once(async move { Ok(data) }));
        self.backend
            .write_file(&self.id, path, stream, options)
            .await
    }

    /// Write a file from a stream with explicit options (no bound but
    /// [`WriteOptions::max_bytes`] and the backend's).
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
        self.list_dir_with(path, ListDirOptions::default().depth(depth))
            .await
    }

    /// [`Sandbox::list_dir`] with options (depth, user).
    pub async fn list_dir_with(
        &self,
        path: &str,
        options: ListDirOptions,
    ) -> Result<Vec<FileStat>> {
        self.backend.list_dir(&self.id, path, options).await
    }

    /// Metadata of a path (symlinks not followed).
    pub async fn stat(&self, path: &str) -> Result<FileStat> {
        self.stat_with(path, StatOptions::default()).await
    }

    /// [`Sandbox::stat`] with options (e.g. as a user).
    pub async fn stat_with(&self, path: &str, options: StatOptions) -> Result<FileStat> {
        self.backend.stat(&self.id, path, options).await
    }

    /// Whether a path exists (a symlink counts as itself). `Ok(false)` means the path is not
    /// there (`ENOENT`, or a component that is not a directory); anything that keeps the
    /// question from being answered (permission denied, a sandbox that is gone or stopped, a
    /// server that cannot be reached) is that error, never `false`.
    pub async fn exists(&self, path: &str) -> Result<bool> {
        self.exists_with(path, StatOptions::default()).await
    }

    /// [`Sandbox::exists`] with options (e.g. as a user).
    pub async fn exists_with(&self, path: &str, options: StatOptions) -> Result<bool> {
        exists(&*self.backend, &self.id, path, options).await
    }

    /// Create a directory with its parents.
    pub async fn mkdir(&self, path: &str) -> Result<FileStat> {
        self.mkdir_with(path, MkdirOptions::default()).await
    }

    /// [`Sandbox::mkdir`] with options (parents, mode, owner).
    pub async fn mkdir_with(&self, path: &str, options: MkdirOptions) -> Result<FileStat> {
        self.backend.mkdir(&self.id, path, options).await
    }

    /// Remove a file, a symlink or an empty directory.
    pub async fn remove(&self, path: &str) -> Result<()> {
        self.backend
            .remove(&self.id, path, {
                let mut options = RemoveOptions::default();
                options.recursive = false;
                options
            })
            .await
    }

    /// Remove a path and, for a directory, everything under it.
    pub async fn remove_all(&self, path: &str) -> Result<()> {
        self.backend
            .remove(&self.id, path, {
                let mut options = RemoveOptions::default();
                options.recursive = true;
                options
            })
            .await
    }

    /// Remove a path as `options` say ([`Sandbox::remove`] or [`Sandbox::remove_all`]).
    pub async fn remove_with(&self, path: &str, options: RemoveOptions) -> Result<()> {
        self.backend.remove(&self.id, path, options).await
    }

    /// Rename a path (a file at the destination is replaced).
    pub async fn rename(&self, from: &str, to: &str) -> Result<FileStat> {
        self.rename_with(from, to, RenameOptions::default()).await
    }

    /// [`Sandbox::rename`] with options: no-clobber ([`RenameOptions::overwrite`]), as a user.
    pub async fn rename_with(
        &self,
        from: &str,
        to: &str,
        options: RenameOptions,
    ) -> Result<FileStat> {
        self.backend.rename(&self.id, from, to, options).await
    }

    /// Copy a file, or a directory tree with [`CopyOptions::recursive`], inside the sandbox:
    /// streamed beneath the sandbox root, symlinks copied as links (see [`CopyOptions`]).
    pub async fn copy(&self, from: &str, to: &str, options: CopyOptions) -> Result<FileStat> {
        self.backend.copy(&self.id, from, to, options).await
    }

    /// Change permission bits.
    pub async fn chmod(&self, path: &str, mode: u32) -> Result<FileStat> {
        self.backend
            .chmod(&self.id, path, ChmodOptions::new(mode))
            .await
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

    /// A saved reference to this process (see [`crate::reference`]).
    pub fn reference(&self) -> Result<crate::Reference> {
        let runtime = crate::reference::runtime_of(&self.backend.capabilities())?;
        crate::Reference::process(&runtime, &self.sandbox_id, self.pid)
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
                WriteStdinOptions::new(data),
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
            .signal(
                &self.sandbox_id,
                ProcessSelector::Pid(self.pid),
                SignalOptions::new(signal),
            )
            .await
    }

    /// Kill the process group.
    pub async fn kill(&self) -> Result<()> {
        self.signal(Signal::Kill).await
    }

    /// Resize the process's pseudo-terminal (started with [`ProcessSpec::pty`]).
    pub async fn resize_pty(&self, size: PtySize) -> Result<()> {
        self.backend.ready().await?.require(Feature::Pty)?;
        self.backend
            .resize_pty(
                &self.sandbox_id,
                ProcessSelector::Pid(self.pid),
                ResizePtyOptions::new(size),
            )
            .await
    }

    /// The process's stdin as an [`AsyncWrite`](tokio::io::AsyncWrite) (the process must have
    /// been started with stdin open). Each write is sent before the next starts; `flush`
    /// waits for the last one and reports its error; `shutdown` closes stdin.
    pub fn stdin(&self) -> ProcessStdin {
        ProcessStdin {
            backend: self.backend.clone(),
            sandbox_id: self.sandbox_id.clone(),
            pid: self.pid,
            in_flight: None,
            closed: false,
        }
    }

    /// Collect everything until exit (see [`collect`]).
    pub async fn wait(self) -> Result<Output> {
        collect(self.stream, DEFAULT_OUTPUT_LIMIT).await
    }
}

/// The events of the process, ending with [`ProcessEvent::Exit`] (or an error).
impl Stream for ProcessHandle {
    type Item = Result<ProcessEvent>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.stream.events.poll_next_unpin(cx)
    }
}

/// A process call being configured; it runs when awaited, collecting the output. The exit
/// is data: a process that fails still gives `Ok(output)` with its
/// [`status`](Output::status). [`Run::expect_success`] opts in to an error instead.
#[must_use = "a process call does nothing until awaited"]
#[derive(Debug)]
pub struct Run {
    sandbox: Sandbox,
    spec: ProcessSpec,
}

impl Run {
    /// Working directory (default: the user's home).
    pub fn cwd(mut self, cwd: impl Into<String>) -> Self {
        self.spec.cwd = Some(cwd.into());
        self
    }

    /// Add an environment variable.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.spec.envs.insert(key.into(), value.into());
        self
    }

    /// Run as this user.
    pub fn user(mut self, user: impl Into<String>) -> Self {
        self.spec.user = Some(user.into());
        self
    }

    /// A name to find the process by.
    pub fn tag(mut self, tag: impl Into<String>) -> Self {
        self.spec.tag = Some(tag.into());
        self
    }

    /// Keep stdin open (for [`ProcessHandle::stdin`]).
    pub fn stdin(mut self, open: bool) -> Self {
        self.spec.stdin = open;
        self
    }

    /// Kill the process group after this long.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.spec.timeout = Some(timeout);
        self
    }

    /// Run on a pseudo-terminal of this size.
    pub fn pty(mut self, size: PtySize) -> Self {
        self.spec.pty = Some(size);
        self
    }

    /// The spec as configured.
    pub fn spec(&self) -> &ProcessSpec {
        &self.spec
    }

    /// Fail unless the process exits with code 0: awaited, a non-zero exit or a signal death
    /// is [`RunError::Failed`], which keeps the whole output (and names the signal).
    pub fn expect_success(self) -> CheckedRun {
        CheckedRun(self)
    }
}

/// A process call that fails unless the process succeeds ([`Run::expect_success`]).
#[must_use = "a process call does nothing until awaited"]
#[derive(Debug)]
pub struct CheckedRun(Run);

impl IntoFuture for CheckedRun {
    type Output = std::result::Result<Output, RunError>;
    type IntoFuture = BoxFuture<'static, std::result::Result<Output, RunError>>;

    fn into_future(self) -> Self::IntoFuture {
        async move {
            let output = self.0.await?;
            if output.exit_status().success() {
                Ok(output)
            } else {
                Err(RunError::Failed(Box::new(output)))
            }
        }
        .boxed()
    }
}

/// Why a [`CheckedRun`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The process ran and did not succeed; its output is kept whole.
    #[error("process {}: {}", .0.pid, .0.exit_status())]
    Failed(Box<Output>),
    /// The process could not be run or followed to its end.
    #[error(transparent)]
    Runtime(#[from] Error),
}

impl RunError {
    /// The output of a process that ran and failed.
    pub fn output(&self) -> Option<&Output> {
        match self {
            RunError::Failed(output) => Some(output),
            RunError::Runtime(_) => None,
        }
    }
}

impl IntoFuture for Run {
    type Output = Result<Output>;
    type IntoFuture = BoxFuture<'static, Result<Output>>;

    fn into_future(self) -> Self::IntoFuture {
        async move { self.sandbox.start_process(self.spec).await?.wait().await }.boxed()
    }
}

/// A process start being configured ([`Sandbox::spawn`]); awaited, it returns the handle.
#[must_use = "a process start does nothing until awaited"]
#[derive(Debug)]
pub struct Spawn(Run);

impl Spawn {
    /// Working directory (default: the user's home).
    pub fn cwd(self, cwd: impl Into<String>) -> Self {
        Spawn(self.0.cwd(cwd))
    }

    /// Add an environment variable.
    pub fn env(self, key: impl Into<String>, value: impl Into<String>) -> Self {
        Spawn(self.0.env(key, value))
    }

    /// Run as this user.
    pub fn user(self, user: impl Into<String>) -> Self {
        Spawn(self.0.user(user))
    }

    /// A name to find the process by.
    pub fn tag(self, tag: impl Into<String>) -> Self {
        Spawn(self.0.tag(tag))
    }

    /// Keep stdin open (for [`ProcessHandle::stdin`]).
    pub fn stdin(self, open: bool) -> Self {
        Spawn(self.0.stdin(open))
    }

    /// Kill the process group after this long.
    pub fn timeout(self, timeout: Duration) -> Self {
        Spawn(self.0.timeout(timeout))
    }

    /// Run on a pseudo-terminal of this size.
    pub fn pty(self, size: PtySize) -> Self {
        Spawn(self.0.pty(size))
    }
}

impl IntoFuture for Spawn {
    type Output = Result<ProcessHandle>;
    type IntoFuture = BoxFuture<'static, Result<ProcessHandle>>;

    fn into_future(self) -> Self::IntoFuture {
        async move { self.0.sandbox.start_process(self.0.spec).await }.boxed()
    }
}

/// A process's stdin as an [`AsyncWrite`](tokio::io::AsyncWrite) ([`ProcessHandle::stdin`]).
pub struct ProcessStdin {
    backend: Arc<dyn Backend>,
    sandbox_id: String,
    pid: u32,
    in_flight: Option<BoxFuture<'static, Result<()>>>,
    closed: bool,
}

impl std::fmt::Debug for ProcessStdin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessStdin")
            .field("sandbox_id", &self.sandbox_id)
            .field("pid", &self.pid)
            .field("closed", &self.closed)
            .finish_non_exhaustive()
    }
}

impl ProcessStdin {
    /// Drive the write (or close) in flight to its end.
    fn poll_in_flight(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let Some(fut) = self.in_flight.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        let done = std::task::ready!(fut.as_mut().poll(cx));
        self.in_flight = None;
        Poll::Ready(done.map_err(std::io::Error::other))
    }
}

impl tokio::io::AsyncWrite for ProcessStdin {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        std::task::ready!(this.poll_in_flight(cx))?;
        if this.closed {
            return Poll::Ready(Err(std::io::ErrorKind::BrokenPipe.into()));
        }
        let (backend, id, pid, data) = (
            this.backend.clone(),
            this.sandbox_id.clone(),
            this.pid,
            buf.to_vec(),
        );
        this.in_flight = Some(
            async move {
                backend
                    .write_stdin(&id, ProcessSelector::Pid(pid), WriteStdinOptions::new(data))
                    .await
            }
            .boxed(),
        );
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.get_mut().poll_in_flight(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        std::task::ready!(this.poll_in_flight(cx))?;
        if this.closed {
            return Poll::Ready(Ok(()));
        }
        this.closed = true;
        let (backend, id, pid) = (this.backend.clone(), this.sandbox_id.clone(), this.pid);
        this.in_flight =
            Some(async move { backend.close_stdin(&id, ProcessSelector::Pid(pid)).await }.boxed());
        this.poll_in_flight(cx)
    }
}

/// [`Sandbox::exists_with`] over any backend (for code that holds a [`Backend`] and an id):
/// `Ok(false)` only when the path is not there, an error when the question cannot be answered.
pub async fn exists(
    backend: &dyn Backend,
    id: &str,
    path: &str,
    options: StatOptions,
) -> Result<bool> {
    match backend.stat(id, path, options).await {
        Ok(_) => Ok(true),
        // The same code says "no such sandbox": a file is only known missing while the
        // sandbox is known to be there (asked after, so a sandbox that went meanwhile is that
        // error, never `false`).
        Err(e) if e.is_not_found() => {
            backend.get(id).await?;
            Ok(false)
        }
        Err(e) => Err(e),
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

/// A file's bytes as a stream of chunks of at most 1 MiB, an error item when a read fails.
fn file_chunks(file: tokio::fs::File, path: &std::path::Path) -> ByteStream {
    use tokio::io::AsyncReadExt;
    const CHUNK: usize = 1024 * 1024;
    let what = format!("read the image archive {}", path.display());
    Box::pin(futures::stream::unfold(Some(file), move |file| {
        let what = what.clone();
        async move {
            let mut file = file?;
            let mut chunk = vec![0; CHUNK];
            match file.read(&mut chunk).await {
                Ok(0) => None,
                Ok(n) => {
                    chunk.truncate(n);
                    Some((Ok(chunk), Some(file)))
                }
                Err(e) => Some((Err(Error::from_io(&e, &what)), None)),
            }
        }
    }))
}

/// The image `options` names that a runtime with images does not list among its templates
/// (its store may still hold it under another reference, or a registry have it).
fn unlisted_image(caps: &crate::Capabilities, options: &CreateOptions) -> Option<String> {
    options
        .template
        .clone()
        .filter(|t| caps.images && !caps.templates.contains(t))
        .filter(|t| !crate::capability::is_host_base(Some(t)))
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
