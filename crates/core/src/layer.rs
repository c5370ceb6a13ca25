//! [`Layer`]: a backend that wraps another and changes only some calls. The one pass-through
//! every wrapper is written with (the server's policy, a facade's standby, tests' masks), so a
//! call added to [`Backend`] reaches every wrapper's inner backend without touching any of them.
//!
//! A type implements [`Layer`] (its [`inner`](Layer::inner) backend and the calls it changes)
//! and is then a [`Backend`] through the blanket implementation below. A call it does not
//! override goes to the inner backend unchanged, arguments and answer alike. Call a layer
//! through [`Backend`] (as `dyn Backend`, or `Backend::create(&layer, …)`): with both traits
//! in scope, a method call on the concrete type names two methods.
//!
//! ```
//! use sandcove_core::{Backend, Capabilities, Layer};
//!
//! /// Reports no previews, whatever the inner backend offers.
//! #[derive(Debug)]
//! struct NoPreviews(std::sync::Arc<dyn Backend>);
//!
//! #[async_trait::async_trait]
//! impl Layer for NoPreviews {
//!     fn inner(&self) -> &dyn Backend {
//!         &*self.0
//!     }
//!     fn capabilities(&self) -> Capabilities {
//!         let mut caps = self.0.capabilities();
//!         caps.previews = false;
//!         caps
//!     }
//! }
//! ```

use std::collections::BTreeMap;

use async_trait::async_trait;

use crate::{
    AnnotationUpdate, Backend, ByteStream, Capabilities, ChmodOptions, CopyOptions, CreateOptions,
    FileStat, FileUrl, FileUrlOptions, ImageAvailability, ImageDetails, ImagePruneReport,
    ImagePullProgress, ImageSummary, ListDirOptions, ListOptions, Metrics, MkdirOptions,
    OperationId, OperationStatus, Preview, PreviewOptions, PreviewToken, PreviewTokenOptions,
    ProcessInfo, ProcessSelector, ProcessSpec, ProcessStream, ReadOptions, RemoveOptions,
    RenameOptions, ResizePtyOptions, ResourceKind, Result, SandboxInfo, SetLabelsOptions,
    SetOnTimeoutOptions, SetTimeoutOptions, SignalOptions, SnapshotInfo, SnapshotOptions,
    StatOptions, Tombstone, VolumeInfo, WatchOptions, WatchStream, WriteOptions, WriteStdinOptions,
};

/// A backend wrapping [`Layer::inner`]: every [`Backend`] call, passed on unchanged unless the
/// implementation overrides it. Implementing it makes the type a [`Backend`].
#[async_trait]
pub trait Layer: Send + Sync + std::fmt::Debug {
    /// The wrapped backend, which every call not overridden goes to.
    fn inner(&self) -> &dyn Backend;

    /// [`Backend::capabilities`], passed to [`Layer::inner`] unless overridden.
    fn capabilities(&self) -> Capabilities {
        self.inner().capabilities()
    }

    /// [`Backend::ready`], passed to [`Layer::inner`] unless overridden.
    async fn ready(&self) -> Result<Capabilities> {
        self.inner().ready().await
    }

    /// [`Backend::create`], passed to [`Layer::inner`] unless overridden.
    async fn create(&self, options: CreateOptions) -> Result<SandboxInfo> {
        self.inner().create(options).await
    }

    /// [`Backend::get`], passed to [`Layer::inner`] unless overridden.
    async fn get(&self, id: &str) -> Result<SandboxInfo> {
        self.inner().get(id).await
    }

    /// [`Backend::list`], passed to [`Layer::inner`] unless overridden.
    async fn list(&self, options: ListOptions) -> Result<Vec<SandboxInfo>> {
        self.inner().list(options).await
    }

    /// [`Backend::set_timeout`], passed to [`Layer::inner`] unless overridden.
    async fn set_timeout(&self, id: &str, options: SetTimeoutOptions) -> Result<SandboxInfo> {
        self.inner().set_timeout(id, options).await
    }

    /// [`Backend::set_on_timeout`], passed to [`Layer::inner`] unless overridden.
    async fn set_on_timeout(&self, id: &str, options: SetOnTimeoutOptions) -> Result<SandboxInfo> {
        self.inner().set_on_timeout(id, options).await
    }

    /// [`Backend::set_labels`], passed to [`Layer::inner`] unless overridden.
    async fn set_labels(&self, id: &str, options: SetLabelsOptions) -> Result<SandboxInfo> {
        self.inner().set_labels(id, options).await
    }

    /// [`Backend::update_annotations`], passed to [`Layer::inner`] unless overridden.
    async fn update_annotations(
        &self,
        id: &str,
        update: AnnotationUpdate,
    ) -> Result<BTreeMap<String, String>> {
        self.inner().update_annotations(id, update).await
    }

    /// [`Backend::destroy`], passed to [`Layer::inner`] unless overridden.
    async fn destroy(&self, id: &str) -> Result<()> {
        self.inner().destroy(id).await
    }

    /// [`Backend::spawn`], passed to [`Layer::inner`] unless overridden.
    async fn spawn(&self, id: &str, spec: ProcessSpec) -> Result<ProcessStream> {
        self.inner().spawn(id, spec).await
    }

    /// [`Backend::attach`], passed to [`Layer::inner`] unless overridden.
    async fn attach(&self, id: &str, process: ProcessSelector) -> Result<ProcessStream> {
        self.inner().attach(id, process).await
    }

    /// [`Backend::write_stdin`], passed to [`Layer::inner`] unless overridden.
    async fn write_stdin(
        &self,
        id: &str,
        process: ProcessSelector,
        options: WriteStdinOptions,
    ) -> Result<()> {
        self.inner().write_stdin(id, process, options).await
    }

    /// [`Backend::close_stdin`], passed to [`Layer::inner`] unless overridden.
    async fn close_stdin(&self, id: &str, process: ProcessSelector) -> Result<()> {
        self.inner().close_stdin(id, process).await
    }

    /// [`Backend::signal`], passed to [`Layer::inner`] unless overridden.
    async fn signal(
        &self,
        id: &str,
        process: ProcessSelector,
        options: SignalOptions,
    ) -> Result<()> {
        self.inner().signal(id, process, options).await
    }

    /// [`Backend::list_processes`], passed to [`Layer::inner`] unless overridden.
    async fn list_processes(&self, id: &str) -> Result<Vec<ProcessInfo>> {
        self.inner().list_processes(id).await
    }

    /// [`Backend::read_file`], passed to [`Layer::inner`] unless overridden.
    async fn read_file(&self, id: &str, path: &str, options: ReadOptions) -> Result<ByteStream> {
        self.inner().read_file(id, path, options).await
    }

    /// [`Backend::write_file`], passed to [`Layer::inner`] unless overridden.
    async fn write_file(
        &self,
        id: &str,
        path: &str,
        data: ByteStream,
        options: WriteOptions,
    ) -> Result<FileStat> {
        self.inner().write_file(id, path, data, options).await
    }

    /// [`Backend::list_dir`], passed to [`Layer::inner`] unless overridden.
    async fn list_dir(
        &self,
        id: &str,
        path: &str,
        options: ListDirOptions,
    ) -> Result<Vec<FileStat>> {
        self.inner().list_dir(id, path, options).await
    }

    /// [`Backend::stat`], passed to [`Layer::inner`] unless overridden.
    async fn stat(&self, id: &str, path: &str, options: StatOptions) -> Result<FileStat> {
        self.inner().stat(id, path, options).await
    }

    /// [`Backend::mkdir`], passed to [`Layer::inner`] unless overridden.
    async fn mkdir(&self, id: &str, path: &str, options: MkdirOptions) -> Result<FileStat> {
        self.inner().mkdir(id, path, options).await
    }

    /// [`Backend::remove`], passed to [`Layer::inner`] unless overridden.
    async fn remove(&self, id: &str, path: &str, options: RemoveOptions) -> Result<()> {
        self.inner().remove(id, path, options).await
    }

    /// [`Backend::rename`], passed to [`Layer::inner`] unless overridden.
    async fn rename(
        &self,
        id: &str,
        from: &str,
        to: &str,
        options: RenameOptions,
    ) -> Result<FileStat> {
        self.inner().rename(id, from, to, options).await
    }

    /// [`Backend::copy`], passed to [`Layer::inner`] unless overridden.
    async fn copy(&self, id: &str, from: &str, to: &str, options: CopyOptions) -> Result<FileStat> {
        self.inner().copy(id, from, to, options).await
    }

    /// [`Backend::chmod`], passed to [`Layer::inner`] unless overridden.
    async fn chmod(&self, id: &str, path: &str, options: ChmodOptions) -> Result<FileStat> {
        self.inner().chmod(id, path, options).await
    }

    /// [`Backend::pause`], passed to [`Layer::inner`] unless overridden.
    async fn pause(&self, id: &str) -> Result<SandboxInfo> {
        self.inner().pause(id).await
    }

    /// [`Backend::resume`], passed to [`Layer::inner`] unless overridden.
    async fn resume(&self, id: &str) -> Result<SandboxInfo> {
        self.inner().resume(id).await
    }

    /// [`Backend::stop`], passed to [`Layer::inner`] unless overridden.
    async fn stop(&self, id: &str) -> Result<SandboxInfo> {
        self.inner().stop(id).await
    }

    /// [`Backend::start`], passed to [`Layer::inner`] unless overridden.
    async fn start(&self, id: &str) -> Result<SandboxInfo> {
        self.inner().start(id).await
    }

    /// [`Backend::metrics`], passed to [`Layer::inner`] unless overridden.
    async fn metrics(&self, id: &str) -> Result<Metrics> {
        self.inner().metrics(id).await
    }

    /// [`Backend::resize_pty`], passed to [`Layer::inner`] unless overridden.
    async fn resize_pty(
        &self,
        id: &str,
        process: ProcessSelector,
        options: ResizePtyOptions,
    ) -> Result<()> {
        self.inner().resize_pty(id, process, options).await
    }

    /// [`Backend::watch`], passed to [`Layer::inner`] unless overridden.
    async fn watch(&self, id: &str, path: &str, options: WatchOptions) -> Result<WatchStream> {
        self.inner().watch(id, path, options).await
    }

    /// [`Backend::expose_port`], passed to [`Layer::inner`] unless overridden.
    async fn expose_port(&self, id: &str, options: PreviewOptions) -> Result<Preview> {
        self.inner().expose_port(id, options).await
    }

    /// [`Backend::list_previews`], passed to [`Layer::inner`] unless overridden.
    async fn list_previews(&self, id: &str) -> Result<Vec<Preview>> {
        self.inner().list_previews(id).await
    }

    /// [`Backend::close_preview`], passed to [`Layer::inner`] unless overridden.
    async fn close_preview(&self, id: &str, port: u16) -> Result<()> {
        self.inner().close_preview(id, port).await
    }

    /// [`Backend::create_preview_token`], passed to [`Layer::inner`] unless overridden.
    async fn create_preview_token(
        &self,
        id: &str,
        port: u16,
        options: PreviewTokenOptions,
    ) -> Result<PreviewToken> {
        self.inner().create_preview_token(id, port, options).await
    }

    /// [`Backend::revoke_preview_token`], passed to [`Layer::inner`] unless overridden.
    async fn revoke_preview_token(&self, id: &str, port: u16, token: &str) -> Result<()> {
        self.inner().revoke_preview_token(id, port, token).await
    }

    /// [`Backend::snapshot`], passed to [`Layer::inner`] unless overridden.
    async fn snapshot(&self, id: &str, options: SnapshotOptions) -> Result<SnapshotInfo> {
        self.inner().snapshot(id, options).await
    }

    /// [`Backend::list_snapshots`], passed to [`Layer::inner`] unless overridden.
    async fn list_snapshots(&self) -> Result<Vec<SnapshotInfo>> {
        self.inner().list_snapshots().await
    }

    /// [`Backend::delete_snapshot`], passed to [`Layer::inner`] unless overridden.
    async fn delete_snapshot(&self, snapshot_id: &str) -> Result<()> {
        self.inner().delete_snapshot(snapshot_id).await
    }

    /// [`Backend::fork`], passed to [`Layer::inner`] unless overridden.
    async fn fork(&self, id: &str, options: CreateOptions) -> Result<SandboxInfo> {
        self.inner().fork(id, options).await
    }

    /// [`Backend::create_file_url`], passed to [`Layer::inner`] unless overridden.
    async fn create_file_url(&self, id: &str, options: FileUrlOptions) -> Result<FileUrl> {
        self.inner().create_file_url(id, options).await
    }

    /// [`Backend::create_volume`], passed to [`Layer::inner`] unless overridden.
    async fn create_volume(&self, name: &str) -> Result<VolumeInfo> {
        self.inner().create_volume(name).await
    }

    /// [`Backend::get_volume`], passed to [`Layer::inner`] unless overridden.
    async fn get_volume(&self, name: &str) -> Result<VolumeInfo> {
        self.inner().get_volume(name).await
    }

    /// [`Backend::list_volumes`], passed to [`Layer::inner`] unless overridden.
    async fn list_volumes(&self) -> Result<Vec<VolumeInfo>> {
        self.inner().list_volumes().await
    }

    /// [`Backend::delete_volume`], passed to [`Layer::inner`] unless overridden.
    async fn delete_volume(&self, name: &str) -> Result<()> {
        self.inner().delete_volume(name).await
    }

    /// [`Backend::list_images`], passed to [`Layer::inner`] unless overridden.
    async fn list_images(&self) -> Result<Vec<ImageSummary>> {
        self.inner().list_images().await
    }

    /// [`Backend::pull_image`], passed to [`Layer::inner`] unless overridden.
    async fn pull_image(&self, reference: &str) -> Result<ImageSummary> {
        self.inner().pull_image(reference).await
    }

    /// [`Backend::pull_image_with_progress`], passed to [`Layer::inner`] unless overridden.
    async fn pull_image_with_progress(
        &self,
        reference: &str,
        progress: &(dyn Fn(ImagePullProgress) + Send + Sync),
    ) -> Result<ImageSummary> {
        self.inner()
            .pull_image_with_progress(reference, progress)
            .await
    }

    /// [`Backend::import_image`], passed to [`Layer::inner`] unless overridden.
    async fn import_image(
        &self,
        archive: ByteStream,
        tag: Option<&str>,
    ) -> Result<Vec<ImageSummary>> {
        self.inner().import_image(archive, tag).await
    }

    /// [`Backend::image_availability`], passed to [`Layer::inner`] unless overridden.
    async fn image_availability(&self, reference: &str) -> Result<ImageAvailability> {
        self.inner().image_availability(reference).await
    }

    /// [`Backend::inspect_image`], passed to [`Layer::inner`] unless overridden.
    async fn inspect_image(&self, reference: &str) -> Result<ImageDetails> {
        self.inner().inspect_image(reference).await
    }

    /// [`Backend::remove_image`], passed to [`Layer::inner`] unless overridden.
    async fn remove_image(&self, reference: &str) -> Result<()> {
        self.inner().remove_image(reference).await
    }

    /// [`Backend::prune_images`], passed to [`Layer::inner`] unless overridden.
    async fn prune_images(&self) -> Result<ImagePruneReport> {
        self.inner().prune_images().await
    }

    /// [`Backend::tombstone`], passed to [`Layer::inner`] unless overridden.
    async fn tombstone(&self, kind: ResourceKind, id: &str) -> Result<Option<Tombstone>> {
        self.inner().tombstone(kind, id).await
    }

    /// [`Backend::observe`], passed to [`Layer::inner`] unless overridden.
    async fn observe(&self, operation: &OperationId) -> Result<OperationStatus> {
        self.inner().observe(operation).await
    }
}

#[async_trait]
impl<L: Layer> Backend for L {
    fn capabilities(&self) -> Capabilities {
        Layer::capabilities(self)
    }

    async fn ready(&self) -> Result<Capabilities> {
        Layer::ready(self).await
    }

    async fn create(&self, options: CreateOptions) -> Result<SandboxInfo> {
        Layer::create(self, options).await
    }

    async fn get(&self, id: &str) -> Result<SandboxInfo> {
        Layer::get(self, id).await
    }

    async fn list(&self, options: ListOptions) -> Result<Vec<SandboxInfo>> {
        Layer::list(self, options).await
    }

    async fn set_timeout(&self, id: &str, options: SetTimeoutOptions) -> Result<SandboxInfo> {
        Layer::set_timeout(self, id, options).await
    }

    async fn set_on_timeout(&self, id: &str, options: SetOnTimeoutOptions) -> Result<SandboxInfo> {
        Layer::set_on_timeout(self, id, options).await
    }

    async fn set_labels(&self, id: &str, options: SetLabelsOptions) -> Result<SandboxInfo> {
        Layer::set_labels(self, id, options).await
    }

    async fn update_annotations(
        &self,
        id: &str,
        update: AnnotationUpdate,
    ) -> Result<BTreeMap<String, String>> {
        Layer::update_annotations(self, id, update).await
    }

    async fn destroy(&self, id: &str) -> Result<()> {
        Layer::destroy(self, id).await
    }

    async fn spawn(&self, id: &str, spec: ProcessSpec) -> Result<ProcessStream> {
        Layer::spawn(self, id, spec).await
    }

    async fn attach(&self, id: &str, process: ProcessSelector) -> Result<ProcessStream> {
        Layer::attach(self, id, process).await
    }

    async fn write_stdin(
        &self,
        id: &str,
        process: ProcessSelector,
        options: WriteStdinOptions,
    ) -> Result<()> {
        Layer::write_stdin(self, id, process, options).await
    }

    async fn close_stdin(&self, id: &str, process: ProcessSelector) -> Result<()> {
        Layer::close_stdin(self, id, process).await
    }

    async fn signal(
        &self,
        id: &str,
        process: ProcessSelector,
        options: SignalOptions,
    ) -> Result<()> {
        Layer::signal(self, id, process, options).await
    }

    async fn list_processes(&self, id: &str) -> Result<Vec<ProcessInfo>> {
        Layer::list_processes(self, id).await
    }

    async fn read_file(&self, id: &str, path: &str, options: ReadOptions) -> Result<ByteStream> {
        Layer::read_file(self, id, path, options).await
    }

    async fn write_file(
        &self,
        id: &str,
        path: &str,
        data: ByteStream,
        options: WriteOptions,
    ) -> Result<FileStat> {
        Layer::write_file(self, id, path, data, options).await
    }

    async fn list_dir(
        &self,
        id: &str,
        path: &str,
        options: ListDirOptions,
    ) -> Result<Vec<FileStat>> {
        Layer::list_dir(self, id, path, options).await
    }

    async fn stat(&self, id: &str, path: &str, options: StatOptions) -> Result<FileStat> {
        Layer::stat(self, id, path, options).await
    }

    async fn mkdir(&self, id: &str, path: &str, options: MkdirOptions) -> Result<FileStat> {
        Layer::mkdir(self, id, path, options).await
    }

    async fn remove(&self, id: &str, path: &str, options: RemoveOptions) -> Result<()> {
        Layer::remove(self, id, path, options).await
    }

    async fn rename(
        &self,
        id: &str,
        from: &str,
        to: &str,
        options: RenameOptions,
    ) -> Result<FileStat> {
        Layer::rename(self, id, from, to, options).await
    }

    async fn copy(&self, id: &str, from: &str, to: &str, options: CopyOptions) -> Result<FileStat> {
        Layer::copy(self, id, from, to, options).await
    }

    async fn chmod(&self, id: &str, path: &str, options: ChmodOptions) -> Result<FileStat> {
        Layer::chmod(self, id, path, options).await
    }

    async fn pause(&self, id: &str) -> Result<SandboxInfo> {
        Layer::pause(self, id).await
    }

    async fn resume(&self, id: &str) -> Result<SandboxInfo> {
        Layer::resume(self, id).await
    }

    async fn stop(&self, id: &str) -> Result<SandboxInfo> {
        Layer::stop(self, id).await
    }

    async fn start(&self, id: &str) -> Result<SandboxInfo> {
        Layer::start(self, id).await
    }

    async fn metrics(&self, id: &str) -> Result<Metrics> {
        Layer::metrics(self, id).await
    }

    async fn resize_pty(
        &self,
        id: &str,
        process: ProcessSelector,
        options: ResizePtyOptions,
    ) -> Result<()> {
        Layer::resize_pty(self, id, process, options).await
    }

    async fn watch(&self, id: &str, path: &str, options: WatchOptions) -> Result<WatchStream> {
        Layer::watch(self, id, path, options).await
    }

    async fn expose_port(&self, id: &str, options: PreviewOptions) -> Result<Preview> {
        Layer::expose_port(self, id, options).await
    }

    async fn list_previews(&self, id: &str) -> Result<Vec<Preview>> {
        Layer::list_previews(self, id).await
    }

    async fn close_preview(&self, id: &str, port: u16) -> Result<()> {
        Layer::close_preview(self, id, port).await
    }

    async fn create_preview_token(
        &self,
        id: &str,
        port: u16,
        options: PreviewTokenOptions,
    ) -> Result<PreviewToken> {
        Layer::create_preview_token(self, id, port, options).await
    }

    async fn revoke_preview_token(&self, id: &str, port: u16, token: &str) -> Result<()> {
        Layer::revoke_preview_token(self, id, port, token).await
    }

    async fn snapshot(&self, id: &str, options: SnapshotOptions) -> Result<SnapshotInfo> {
        Layer::snapshot(self, id, options).await
    }

    async fn list_snapshots(&self) -> Result<Vec<SnapshotInfo>> {
        Layer::list_snapshots(self).await
    }

    async fn delete_snapshot(&self, snapshot_id: &str) -> Result<()> {
        Layer::delete_snapshot(self, snapshot_id).await
    }

    async fn fork(&self, id: &str, options: CreateOptions) -> Result<SandboxInfo> {
        Layer::fork(self, id, options).await
    }

    async fn create_file_url(&self, id: &str, options: FileUrlOptions) -> Result<FileUrl> {
        Layer::create_file_url(self, id, options).await
    }

    async fn create_volume(&self, name: &str) -> Result<VolumeInfo> {
        Layer::create_volume(self, name).await
    }

    async fn get_volume(&self, name: &str) -> Result<VolumeInfo> {
        Layer::get_volume(self, name).await
    }

    async fn list_volumes(&self) -> Result<Vec<VolumeInfo>> {
        Layer::list_volumes(self).await
    }

    async fn delete_volume(&self, name: &str) -> Result<()> {
        Layer::delete_volume(self, name).await
    }

    async fn list_images(&self) -> Result<Vec<ImageSummary>> {
        Layer::list_images(self).await
    }

    async fn pull_image(&self, reference: &str) -> Result<ImageSummary> {
        Layer::pull_image(self, reference).await
    }

    async fn pull_image_with_progress(
        &self,
        reference: &str,
        progress: &(dyn Fn(ImagePullProgress) + Send + Sync),
    ) -> Result<ImageSummary> {
        Layer::pull_image_with_progress(self, reference, progress).await
    }

    async fn import_image(
        &self,
        archive: ByteStream,
        tag: Option<&str>,
    ) -> Result<Vec<ImageSummary>> {
        Layer::import_image(self, archive, tag).await
    }

    async fn remove_image(&self, reference: &str) -> Result<()> {
        Layer::remove_image(self, reference).await
    }

    async fn inspect_image(&self, reference: &str) -> Result<ImageDetails> {
        Layer::inspect_image(self, reference).await
    }

    async fn image_availability(&self, reference: &str) -> Result<ImageAvailability> {
        Layer::image_availability(self, reference).await
    }

    async fn prune_images(&self) -> Result<ImagePruneReport> {
        Layer::prune_images(self).await
    }

    async fn tombstone(&self, kind: ResourceKind, id: &str) -> Result<Option<Tombstone>> {
        Layer::tombstone(self, kind, id).await
    }

    async fn observe(&self, operation: &OperationId) -> Result<OperationStatus> {
        Layer::observe(self, operation).await
    }
}
