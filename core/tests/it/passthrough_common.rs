//! A test backend that passes every call on to another one, changing only what a test's
//! [`Adapt`] says (the capabilities it reports, the file writes): the wrapper shared by the
//! test programs that put the engine behind a mask or a slow path.
//!
//! The test modules using it name it `passthrough`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sandcove::{
    AnnotationUpdate, Backend, ByteStream, Capabilities, CopyOptions, CreateOptions, FileStat,
    ListDirOptions, ListOptions, Metrics, MkdirOptions, OperationId, OperationStatus, Preview,
    PreviewOptions, PreviewToken, ProcessInfo, ProcessSelector, ProcessSpec, ProcessStream,
    PtySize, ReadOptions, RemoveOptions, RenameOptions, ResourceKind, Result, SandboxInfo, Signal,
    SnapshotInfo, StatOptions, Tombstone, VolumeInfo, WatchOptions, WatchStream, WriteOptions,
};

/// What a [`Passthrough`] changes; each default passes the call on unchanged.
#[async_trait]
pub trait Adapt: std::fmt::Debug + Send + Sync + 'static {
    /// The capabilities reported (by `capabilities` and `ready`), from the inner backend's.
    fn capabilities(&self, inner: Capabilities) -> Capabilities {
        inner
    }

    /// A file write, given the inner backend.
    async fn write_file(
        &self,
        inner: &Arc<dyn Backend>,
        id: &str,
        path: &str,
        data: ByteStream,
        options: WriteOptions,
    ) -> Result<FileStat> {
        inner.write_file(id, path, data, options).await
    }
}

/// `inner` with the changes of `adapt`; every other call reaches `inner` as made.
#[derive(Debug)]
pub struct Passthrough<A> {
    /// The backend every call reaches.
    pub inner: Arc<dyn Backend>,
    /// What this wrapper changes.
    pub adapt: A,
}

#[async_trait]
impl<A: Adapt> Backend for Passthrough<A> {
    fn capabilities(&self) -> Capabilities {
        self.adapt.capabilities(self.inner.capabilities())
    }
    async fn ready(&self) -> Result<Capabilities> {
        Ok(self.adapt.capabilities(self.inner.ready().await?))
    }
    async fn create(&self, o: CreateOptions) -> Result<SandboxInfo> {
        self.inner.create(o).await
    }
    async fn get(&self, id: &str) -> Result<SandboxInfo> {
        self.inner.get(id).await
    }
    async fn list(&self, o: ListOptions) -> Result<Vec<SandboxInfo>> {
        self.inner.list(o).await
    }
    async fn set_timeout(&self, id: &str, t: Duration) -> Result<SandboxInfo> {
        self.inner.set_timeout(id, t).await
    }
    async fn set_labels(&self, id: &str, l: BTreeMap<String, String>) -> Result<SandboxInfo> {
        self.inner.set_labels(id, l).await
    }
    async fn update_annotations(
        &self,
        id: &str,
        u: AnnotationUpdate,
    ) -> Result<BTreeMap<String, String>> {
        self.inner.update_annotations(id, u).await
    }
    async fn destroy(&self, id: &str) -> Result<()> {
        self.inner.destroy(id).await
    }
    async fn spawn(&self, id: &str, s: ProcessSpec) -> Result<ProcessStream> {
        self.inner.spawn(id, s).await
    }
    async fn attach(&self, id: &str, p: ProcessSelector) -> Result<ProcessStream> {
        self.inner.attach(id, p).await
    }
    async fn write_stdin(&self, id: &str, p: ProcessSelector, d: Vec<u8>) -> Result<()> {
        self.inner.write_stdin(id, p, d).await
    }
    async fn close_stdin(&self, id: &str, p: ProcessSelector) -> Result<()> {
        self.inner.close_stdin(id, p).await
    }
    async fn signal(&self, id: &str, p: ProcessSelector, s: Signal) -> Result<()> {
        self.inner.signal(id, p, s).await
    }
    async fn list_processes(&self, id: &str) -> Result<Vec<ProcessInfo>> {
        self.inner.list_processes(id).await
    }
    async fn read_file(&self, id: &str, p: &str, o: ReadOptions) -> Result<ByteStream> {
        self.inner.read_file(id, p, o).await
    }
    async fn write_file(
        &self,
        id: &str,
        p: &str,
        d: ByteStream,
        o: WriteOptions,
    ) -> Result<FileStat> {
        self.adapt.write_file(&self.inner, id, p, d, o).await
    }
    async fn list_dir(&self, id: &str, p: &str, o: ListDirOptions) -> Result<Vec<FileStat>> {
        self.inner.list_dir(id, p, o).await
    }
    async fn stat(&self, id: &str, p: &str, o: StatOptions) -> Result<FileStat> {
        self.inner.stat(id, p, o).await
    }
    async fn mkdir(&self, id: &str, p: &str, o: MkdirOptions) -> Result<FileStat> {
        self.inner.mkdir(id, p, o).await
    }
    async fn remove(&self, id: &str, p: &str, o: RemoveOptions) -> Result<()> {
        self.inner.remove(id, p, o).await
    }
    async fn rename(&self, id: &str, from: &str, to: &str, o: RenameOptions) -> Result<FileStat> {
        self.inner.rename(id, from, to, o).await
    }
    async fn copy(&self, id: &str, from: &str, to: &str, o: CopyOptions) -> Result<FileStat> {
        self.inner.copy(id, from, to, o).await
    }
    async fn chmod(&self, id: &str, p: &str, mode: u32) -> Result<FileStat> {
        self.inner.chmod(id, p, mode).await
    }
    async fn pause(&self, id: &str) -> Result<SandboxInfo> {
        self.inner.pause(id).await
    }
    async fn resume(&self, id: &str) -> Result<SandboxInfo> {
        self.inner.resume(id).await
    }
    async fn stop(&self, id: &str) -> Result<SandboxInfo> {
        self.inner.stop(id).await
    }
    async fn start(&self, id: &str) -> Result<SandboxInfo> {
        self.inner.start(id).await
    }
    async fn metrics(&self, id: &str) -> Result<Metrics> {
        self.inner.metrics(id).await
    }
    async fn resize_pty(&self, id: &str, p: ProcessSelector, s: PtySize) -> Result<()> {
        self.inner.resize_pty(id, p, s).await
    }
    async fn watch(&self, id: &str, p: &str, o: WatchOptions) -> Result<WatchStream> {
        self.inner.watch(id, p, o).await
    }
    async fn expose_port(&self, id: &str, o: PreviewOptions) -> Result<Preview> {
        self.inner.expose_port(id, o).await
    }
    async fn list_previews(&self, id: &str) -> Result<Vec<Preview>> {
        self.inner.list_previews(id).await
    }
    async fn close_preview(&self, id: &str, port: u16) -> Result<()> {
        self.inner.close_preview(id, port).await
    }
    async fn create_preview_token(
        &self,
        id: &str,
        port: u16,
        expires_at: Option<u64>,
    ) -> Result<PreviewToken> {
        self.inner.create_preview_token(id, port, expires_at).await
    }
    async fn revoke_preview_token(&self, id: &str, port: u16, token: &str) -> Result<()> {
        self.inner.revoke_preview_token(id, port, token).await
    }
    async fn snapshot(&self, id: &str, name: Option<String>) -> Result<SnapshotInfo> {
        self.inner.snapshot(id, name).await
    }
    async fn list_snapshots(&self) -> Result<Vec<SnapshotInfo>> {
        self.inner.list_snapshots().await
    }
    async fn delete_snapshot(&self, id: &str) -> Result<()> {
        self.inner.delete_snapshot(id).await
    }
    async fn fork(&self, id: &str, o: CreateOptions) -> Result<SandboxInfo> {
        self.inner.fork(id, o).await
    }
    async fn create_volume(&self, name: &str) -> Result<VolumeInfo> {
        self.inner.create_volume(name).await
    }
    async fn get_volume(&self, name: &str) -> Result<VolumeInfo> {
        self.inner.get_volume(name).await
    }
    async fn list_volumes(&self) -> Result<Vec<VolumeInfo>> {
        self.inner.list_volumes().await
    }
    async fn delete_volume(&self, name: &str) -> Result<()> {
        self.inner.delete_volume(name).await
    }
    async fn observe(&self, operation: &OperationId) -> Result<OperationStatus> {
        self.inner.observe(operation).await
    }
    async fn tombstone(&self, kind: ResourceKind, id: &str) -> Result<Option<Tombstone>> {
        self.inner.tombstone(kind, id).await
    }
}
