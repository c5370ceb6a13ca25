//! The [`Backend`] trait: the one interface every runtime implements.
//!
//! It is deliberately small and options-first: a call takes the sandbox id, what it acts on
//! (a path, a process, a port, a token), and everything else in one options value
//! (`#[non_exhaustive]`, so an option can be added without changing the call); nothing has a
//! default body, so a wrapper cannot silently lose an override (a wrapper that changes only
//! some calls is a [`Layer`](crate::Layer)).
//!
//! **Validation happens once, at the backend that takes a call**: every implementation
//! validates its input (`CreateOptions::validate`, `ProcessSpec::validate`, …) before any
//! effect, so callers above it (`sandcove::Client`, the facades, the server) do not repeat it
//! and the agent client below it does not either; the sandbox agent validates again what it
//! receives across its process boundary.
//!
//! Conveniences (collecting output, reading a file whole) live on `sandcove::Client` and
//! `sandcove::Sandbox`, above every backend.

use std::fmt;
use std::pin::Pin;

use async_trait::async_trait;
use futures::Stream;

use crate::{
    AnnotationUpdate, Capabilities, ChmodOptions, CopyOptions, CreateOptions, FileStat, FileUrl,
    FileUrlOptions, FsEvent, ImageAvailability, ImageDetails, ImagePruneReport, ImagePullProgress,
    ImageSummary, ListDirOptions, ListOptions, Metrics, MkdirOptions, OperationId, OperationStatus,
    Preview, PreviewOptions, PreviewToken, PreviewTokenOptions, ProcessEvent, ProcessInfo,
    ProcessSelector, ProcessSpec, ReadOptions, RemoveOptions, RenameOptions, ResizePtyOptions,
    ResourceKind, Result, SandboxInfo, SetLabelsOptions, SetOnTimeoutOptions, SetTimeoutOptions,
    SignalOptions, SnapshotInfo, SnapshotOptions, StatOptions, Tombstone, VolumeInfo, WatchOptions,
    WriteOptions, WriteStdinOptions,
};

/// A stream of byte chunks (file contents). Errors end the stream; a stream that ends without
/// an error delivered everything.
pub type ByteStream = Pin<Box<dyn Stream<Item = Result<Vec<u8>>> + Send>>;

/// The events of one process, ending with [`ProcessEvent::Exit`]. A stream that ends without
/// an `Exit` event yields an error as its last item instead: output is never silently short.
pub struct ProcessStream {
    /// Pid of the process inside the sandbox.
    pub pid: u32,
    /// The events, starting after [`ProcessEvent::Start`].
    pub events: Pin<Box<dyn Stream<Item = Result<ProcessEvent>> + Send>>,
}

impl fmt::Debug for ProcessStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProcessStream")
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

/// Filesystem changes under a watched directory. Dropping the stream stops the watch.
pub type WatchStream = Pin<Box<dyn Stream<Item = Result<FsEvent>> + Send>>;

/// The refusal of an image call by a runtime without images.
fn images_not_supported(call: &str) -> crate::Error {
    crate::Error::NotSupported {
        feature: format!("{call}: images on this runtime"),
        alternative: "use the embedded engine or `sandcove serve` on it, which keep an image \
                      store (`sandcove image`)"
            .into(),
    }
}

/// A sandbox runtime: the embedded local engine, or a remote server over HTTP.
#[async_trait]
pub trait Backend: Send + Sync + fmt::Debug {
    /// What this backend can do, as last learned: never does I/O. An HTTP backend knows its
    /// server's capabilities after [`ready`](Backend::ready) (which its `connect` and every
    /// `Client` entry point run); before that it reports nothing optional.
    fn capabilities(&self) -> Capabilities;

    /// Learn what this backend can do, once (an HTTP backend asks its server on the first
    /// call and keeps the answer), and return it.
    async fn ready(&self) -> Result<Capabilities>;

    /// Create a sandbox and wait until it accepts commands.
    async fn create(&self, options: CreateOptions) -> Result<SandboxInfo>;

    /// Describe one sandbox. A missing or expired sandbox is [`Error::NotFound`](crate::Error).
    async fn get(&self, id: &str) -> Result<SandboxInfo>;

    /// All live sandboxes that pass the filter, from every program of this user.
    async fn list(&self, options: ListOptions) -> Result<Vec<SandboxInfo>>;

    /// Move the end of the sandbox's lease to `options.timeout` from now.
    async fn set_timeout(&self, id: &str, options: SetTimeoutOptions) -> Result<SandboxInfo>;

    /// Change what happens when the sandbox's lease ends to `options.on_timeout`
    /// ([`CreateOptions::on_timeout`]), as a program does whose idea of the sandbox's end
    /// changed after it was created (a vendor's deletion policy added to a sandbox made to
    /// pause). A pause needs [`Capabilities::pause`], a stop
    /// [`Capabilities::lease_stop`] (and a sandbox made without `auto_resume`). The action
    /// applies at the lease's next end; a sandbox its lease has paused already is destroyed
    /// at the end of its retention, as before.
    async fn set_on_timeout(&self, id: &str, options: SetOnTimeoutOptions) -> Result<SandboxInfo>;

    /// Replace the sandbox's labels with `options.labels` (works while it is paused).
    async fn set_labels(&self, id: &str, options: SetLabelsOptions) -> Result<SandboxInfo>;

    /// Change the sandbox's annotations ([`SandboxInfo::annotations`]) atomically, as
    /// `update` says (compare-and-set included); returns the map now in force. Works in
    /// every state but destroyed. Out-of-bounds keys or values are
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument), a failed expectation
    /// [`Error::Conflict`](crate::Error::Conflict); either way nothing changes.
    async fn update_annotations(
        &self,
        id: &str,
        update: AnnotationUpdate,
    ) -> Result<std::collections::BTreeMap<String, String>>;

    /// Destroy the sandbox: every process in it ends and its state is removed.
    async fn destroy(&self, id: &str) -> Result<()>;

    /// Start a process and stream its events. `spec` is validated here, by the backend
    /// ([`ProcessSpec::validate`](crate::ProcessSpec::validate)), before any effect.
    async fn spawn(&self, id: &str, spec: ProcessSpec) -> Result<ProcessStream>;

    /// Attach to a running (or recently finished) process: its retained output, then live
    /// events until it exits.
    async fn attach(&self, id: &str, process: ProcessSelector) -> Result<ProcessStream>;

    /// Write `options.data` to a process's stdin (it must have been started with
    /// `stdin: true`).
    async fn write_stdin(
        &self,
        id: &str,
        process: ProcessSelector,
        options: WriteStdinOptions,
    ) -> Result<()>;

    /// Close a process's stdin so it reads end-of-file.
    async fn close_stdin(&self, id: &str, process: ProcessSelector) -> Result<()>;

    /// Send `options.signal` to a process's whole process group.
    async fn signal(
        &self,
        id: &str,
        process: ProcessSelector,
        options: SignalOptions,
    ) -> Result<()>;

    /// Processes started through the API that are running or finished recently.
    async fn list_processes(&self, id: &str) -> Result<Vec<ProcessInfo>>;

    /// Read a file as a stream of chunks.
    async fn read_file(&self, id: &str, path: &str, options: ReadOptions) -> Result<ByteStream>;

    /// Write a file from a stream of chunks; returns the written file's metadata.
    async fn write_file(
        &self,
        id: &str,
        path: &str,
        data: ByteStream,
        options: WriteOptions,
    ) -> Result<FileStat>;

    /// List a directory's entries (and deeper levels, per `options.depth`).
    async fn list_dir(
        &self,
        id: &str,
        path: &str,
        options: ListDirOptions,
    ) -> Result<Vec<FileStat>>;

    /// Metadata of one path, symlinks not followed.
    async fn stat(&self, id: &str, path: &str, options: StatOptions) -> Result<FileStat>;

    /// Create a directory.
    async fn mkdir(&self, id: &str, path: &str, options: MkdirOptions) -> Result<FileStat>;

    /// Remove a file, symlink or directory.
    async fn remove(&self, id: &str, path: &str, options: RemoveOptions) -> Result<()>;

    /// Rename (move) a path. By default a file (or empty directory) at the destination is
    /// replaced; with `options.overwrite == false` anything there is
    /// [`Error::AlreadyExists`](crate::Error::AlreadyExists), decided atomically by the rename.
    async fn rename(
        &self,
        id: &str,
        from: &str,
        to: &str,
        options: RenameOptions,
    ) -> Result<FileStat>;

    /// Copy a file, or with `options.recursive` a directory tree, inside the sandbox
    /// (see [`CopyOptions`]); returns the copy's metadata.
    async fn copy(&self, id: &str, from: &str, to: &str, options: CopyOptions) -> Result<FileStat>;

    /// Change a path's permission bits to `options.mode`.
    async fn chmod(&self, id: &str, path: &str, options: ChmodOptions) -> Result<FileStat>;

    // ----- lifecycle beyond create/destroy -----

    /// Freeze every process of the sandbox; memory and processes are kept.
    async fn pause(&self, id: &str) -> Result<SandboxInfo>;

    /// Continue a paused sandbox where it stopped.
    async fn resume(&self, id: &str) -> Result<SandboxInfo>;

    /// Stop the sandbox: every process in it ends (killed), its files stay, its lease is
    /// paused (the time left is kept). The state becomes
    /// `SandboxState::Stopped`; processes and file calls are
    /// refused with [`Error::InvalidState`](crate::Error::InvalidState) until
    /// [`Backend::start`]; info, annotations, labels, the lease and destroy keep working.
    /// Stopping a paused sandbox ends its frozen processes too; stopping a stopped one
    /// changes nothing.
    async fn stop(&self, id: &str) -> Result<SandboxInfo>;

    /// Start a stopped sandbox: it runs again with the files it had and no processes, and
    /// its lease counts down again from the time it had left. Starting a running sandbox
    /// changes nothing; a paused one must be resumed instead.
    async fn start(&self, id: &str) -> Result<SandboxInfo>;

    /// Current resource usage.
    async fn metrics(&self, id: &str) -> Result<Metrics>;

    // ----- terminals -----

    /// Resize the pseudo-terminal of a process started with [`ProcessSpec::pty`].
    async fn resize_pty(
        &self,
        id: &str,
        process: ProcessSelector,
        options: ResizePtyOptions,
    ) -> Result<()>;

    // ----- watching -----

    /// Watch a directory for changes.
    async fn watch(&self, id: &str, path: &str, options: WatchOptions) -> Result<WatchStream>;

    // ----- ports -----

    /// Make a port inside the sandbox reachable from the host (replacing an earlier preview of
    /// the same port).
    async fn expose_port(&self, id: &str, options: PreviewOptions) -> Result<Preview>;

    /// The sandbox's previews.
    async fn list_previews(&self, id: &str) -> Result<Vec<Preview>>;

    /// Close a preview; later requests to its URL are refused.
    async fn close_preview(&self, id: &str, port: u16) -> Result<()>;

    /// Issue an additional token for a private preview, valid until `options.expires_at`
    /// (ms since the epoch) or for the sandbox's life.
    async fn create_preview_token(
        &self,
        id: &str,
        port: u16,
        options: PreviewTokenOptions,
    ) -> Result<PreviewToken>;

    /// Revoke one token of a private preview (named by its value): later requests carrying it
    /// are refused. A token that is unknown (never issued, or already revoked) is
    /// [`Error::NotFound`](crate::Error::NotFound).
    async fn revoke_preview_token(&self, id: &str, port: u16, token: &str) -> Result<()>;

    /// A signed URL for one operation on one path of sandbox `id`
    /// ([`FileUrlOptions`]), served outside the sandbox by the runtime's own listener (the
    /// embedded engine's monitor, a server's listener) through the file API: the same path
    /// confinement, user checks and bounds as a [`read_file`](Backend::read_file) or
    /// [`write_file`](Backend::write_file) call. Nothing runs in the sandbox for it; the URL
    /// stops working when it expires or the sandbox is destroyed. A runtime without a
    /// listener for them answers [`Error::NotSupported`](crate::Error::NotSupported)
    /// ([`Capabilities::file_urls`](crate::Capabilities::file_urls)).
    async fn create_file_url(&self, id: &str, options: FileUrlOptions) -> Result<FileUrl>;

    // ----- snapshots and fork -----

    /// Snapshot the sandbox's writable filesystem (paused while it is captured).
    async fn snapshot(&self, id: &str, options: SnapshotOptions) -> Result<SnapshotInfo>;

    /// All snapshots.
    async fn list_snapshots(&self) -> Result<Vec<SnapshotInfo>>;

    /// Delete a snapshot.
    async fn delete_snapshot(&self, snapshot_id: &str) -> Result<()>;

    /// A new sandbox with a copy of this one's files (not its processes).
    async fn fork(&self, id: &str, options: CreateOptions) -> Result<SandboxInfo>;

    // ----- volumes -----

    /// Create a named volume.
    async fn create_volume(&self, name: &str) -> Result<VolumeInfo>;

    /// Describe a volume.
    async fn get_volume(&self, name: &str) -> Result<VolumeInfo>;

    /// All volumes.
    async fn list_volumes(&self) -> Result<Vec<VolumeInfo>>;

    /// Delete a volume.
    async fn delete_volume(&self, name: &str) -> Result<()>;

    // ----- images -----

    /// The images this runtime has stored ([`Capabilities::images`](crate::Capabilities::images));
    /// a runtime without images answers `NotSupported`.
    async fn list_images(&self) -> Result<Vec<ImageSummary>> {
        Err(images_not_supported("list_images"))
    }

    /// Pull an image from its registry into this runtime's store (a no-op for the layers it
    /// has already). The runtime's registry configuration (mirrors, credentials) applies.
    async fn pull_image(&self, reference: &str) -> Result<ImageSummary> {
        let _ = reference;
        Err(images_not_supported("pull_image"))
    }

    /// [`pull_image`](Backend::pull_image) reporting each layer's progress to `progress` as
    /// it goes (called from the pull's own task: keep it short; it must not block). A runtime
    /// that cannot report progress pulls without reports, which is the default.
    async fn pull_image_with_progress(
        &self,
        reference: &str,
        progress: &(dyn Fn(ImagePullProgress) + Send + Sync),
    ) -> Result<ImageSummary> {
        let _ = progress;
        self.pull_image(reference).await
    }

    /// Import the images of an archive streamed in `archive` (an `oci-archive` or a
    /// `docker save` tarball, compressed or not) into this runtime's store; `tag` names the
    /// image when the archive holds exactly one (and replaces the names it carries). An
    /// `archive` stream that ends in an error item abandons the import: nothing is stored.
    /// The default answers `NotSupported`.
    async fn import_image(
        &self,
        archive: ByteStream,
        tag: Option<&str>,
    ) -> Result<Vec<ImageSummary>> {
        let _ = (archive, tag);
        Err(images_not_supported("import_image"))
    }

    /// Whether the image `reference` names is stored, could be pulled, or neither: never
    /// pulls. A runtime without images answers `NotSupported`.
    async fn image_availability(&self, reference: &str) -> Result<ImageAvailability> {
        let _ = reference;
        Err(images_not_supported("image_availability"))
    }

    /// Everything the store has of the image `reference` (a reference or a digest) names:
    /// its config's run settings, platform and layers. `NotFound` when it is not stored
    /// (never pulls). A runtime without images answers `NotSupported`.
    async fn inspect_image(&self, reference: &str) -> Result<ImageDetails> {
        let _ = reference;
        Err(images_not_supported("inspect_image"))
    }

    /// Remove a reference from the store (the image goes with its last one, unless a live
    /// sandbox runs it).
    async fn remove_image(&self, reference: &str) -> Result<()> {
        let _ = reference;
        Err(images_not_supported("remove_image"))
    }

    /// Remove the images without a reference that no live sandbox runs, and every layer no
    /// image needs.
    async fn prune_images(&self) -> Result<ImagePruneReport> {
        Err(images_not_supported("prune_images"))
    }

    // ----- references -----

    /// The tombstone of a resource of `kind` that ended recently (see
    /// [`crate::reference`]), or `None` when this runtime keeps no record of it (never
    /// existed, or its tombstone expired). `id` is [`Reference::tombstone_id`]
    /// (`<sandbox>:<port>` for a preview); for a sandbox it may also be the sandbox's unique
    /// name (an id is matched first). Reads only.
    ///
    /// [`Reference::tombstone_id`]: crate::Reference::tombstone_id
    async fn tombstone(&self, kind: ResourceKind, id: &str) -> Result<Option<Tombstone>>;

    // ----- operations -----

    /// What happened to the operation `operation` (see [`crate::operation`]): done with its
    /// answer, failed with its error, in progress, or unknown. Never acts on it.
    async fn observe(&self, operation: &OperationId) -> Result<OperationStatus>;
}
