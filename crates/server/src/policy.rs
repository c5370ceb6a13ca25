//! The server's own policy: what any client of `sandcove serve` may ask of its backend,
//! decided in one place for every listener (the native API and each vendor wire listener
//! are built over the same [`PolicyBackend`]).
//!
//! - **Admin-only create options** are refused with [`Error::Forbidden`] before anything is
//!   made unless the operator allowed them: today that is [`NetworkPolicy::Host`] (the
//!   sandbox would share the host's network, loopback services and cloud metadata endpoint
//!   included), allowed by [`ServerPolicy::allow_host_network`]. Capabilities still say what
//!   the runtime *can* do; the policy says what this server's clients *may*.
//! - **Live sandboxes** are capped at [`ServerPolicy::max_sandboxes`]: a create or fork that
//!   would pass the cap is [`Error::Forbidden`] before anything is made. Creates and forks
//!   are admitted one at a time against the live sandboxes (as the backend lists them) plus
//!   the admitted ones still under way, so concurrent creates cannot overshoot; a create that
//!   finds the cap reached only by creates still under way waits for them to end, then
//!   decides on the exact count. A sandbox made by another program on the same engine counts
//!   once it is listed.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;

use sandcove_core::backend::{ByteStream, ProcessStream, WatchStream};
use sandcove_core::{
    AnnotationUpdate, Backend, Capabilities, CopyOptions, CreateOptions, Error, FileStat,
    ListDirOptions, ListOptions, Metrics, MkdirOptions, NetworkPolicy, OperationId,
    OperationStatus, Preview, PreviewOptions, PreviewToken, ProcessInfo, ProcessSelector,
    ProcessSpec, PtySize, ReadOptions, RemoveOptions, RenameOptions, ResourceKind, Result,
    SandboxInfo, Signal, SnapshotInfo, StatOptions, Tombstone, VolumeInfo, WatchOptions,
    WriteOptions,
};

/// Live sandboxes a server allows unless told otherwise (`sandcove serve --max-sandboxes`).
pub const DEFAULT_MAX_SANDBOXES: usize = 1000;

/// What a server's clients may ask for, beyond what the backend can do.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerPolicy {
    /// Whether a create or fork may ask for [`NetworkPolicy::Host`]. Off by default: with it,
    /// anyone holding the API key runs code with the host's network.
    pub allow_host_network: bool,
    /// Most live sandboxes (running, paused, stopped or failed, until destroyed or their
    /// lease ends) at once; creates and forks past it are refused. At least 1.
    pub max_sandboxes: usize,
}

impl Default for ServerPolicy {
    /// Host network refused, at most [`DEFAULT_MAX_SANDBOXES`] live sandboxes.
    fn default() -> Self {
        ServerPolicy {
            allow_host_network: false,
            max_sandboxes: DEFAULT_MAX_SANDBOXES,
        }
    }
}

impl ServerPolicy {
    /// The refusal of a create (or fork) asking for an option this server keeps to its
    /// operator, or `Ok`.
    pub fn check_create(&self, options: &CreateOptions) -> Result<()> {
        if options.network == NetworkPolicy::Host && !self.allow_host_network {
            return Err(Error::Forbidden {
                what: "the host's network (NetworkPolicy::Host) is not allowed on this server: \
                       its operator starts it with --allow-host-network to allow it; use the \
                       isolated internet policy instead"
                    .into(),
            });
        }
        Ok(())
    }
}

/// Creates and forks admitted and not finished yet.
#[derive(Debug, Default)]
struct Admissions {
    /// Held while one create is being admitted (list, count, reserve), so admissions are
    /// decided one at a time.
    deciding: tokio::sync::Mutex<()>,
    /// Admitted creates under way.
    pending: Mutex<usize>,
    /// Woken whenever a create under way ends.
    ended: Notify,
}

/// One admitted create under way; dropping it (the create ended, whichever way) frees its
/// place.
struct Admitted(Arc<Admissions>);

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut pending = self.0.pending.lock().unwrap_or_else(|e| e.into_inner());
        *pending = pending.saturating_sub(1);
        drop(pending);
        self.0.ended.notify_waiters();
    }
}

/// A [`Backend`] under a [`ServerPolicy`]: every call goes to the inner backend, creates and
/// forks once the policy admits them.
pub struct PolicyBackend {
    inner: Arc<dyn Backend>,
    policy: ServerPolicy,
    admissions: Arc<Admissions>,
}

impl std::fmt::Debug for PolicyBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyBackend")
            .field("inner", &self.inner)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl PolicyBackend {
    /// `inner` under `policy` (a `max_sandboxes` of 0 is taken as 1).
    pub fn new(inner: Arc<dyn Backend>, policy: ServerPolicy) -> Self {
        let mut policy = policy;
        policy.max_sandboxes = policy.max_sandboxes.max(1);
        PolicyBackend {
            inner,
            policy,
            admissions: Arc::default(),
        }
    }

    /// The policy in force.
    pub fn policy(&self) -> &ServerPolicy {
        &self.policy
    }

    /// Check `options`, then take a place under the cap (see the module doc).
    async fn admit(&self, options: &CreateOptions) -> Result<Admitted> {
        self.policy.check_create(options)?;
        let max = self.policy.max_sandboxes;
        loop {
            let ended = self.admissions.ended.notified();
            tokio::pin!(ended);
            // Registered before the count is read, so an end in between still wakes us.
            ended.as_mut().enable();
            {
                let _deciding = self.admissions.deciding.lock().await;
                // Under way first, then listed: a create that ends in between is counted
                // twice (refusing early, never late), never missed.
                let pending = *self
                    .admissions
                    .pending
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                let live = self.inner.list(ListOptions::default()).await?.len();
                if live + pending < max {
                    *self
                        .admissions
                        .pending
                        .lock()
                        .unwrap_or_else(|e| e.into_inner()) += 1;
                    return Ok(Admitted(self.admissions.clone()));
                }
                if pending == 0 {
                    return Err(Error::Forbidden {
                        what: format!(
                            "this server's limit of {max} live sandboxes is reached \
                             (--max-sandboxes): destroy a sandbox first"
                        ),
                    });
                }
            }
            // The cap is reached counting creates still under way, some of which may be
            // listed already: decide again once one has ended.
            ended.await;
        }
    }
}

#[async_trait]
impl Backend for PolicyBackend {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn ready(&self) -> Result<Capabilities> {
        self.inner.ready().await
    }

    async fn create(&self, options: CreateOptions) -> Result<SandboxInfo> {
        let _admitted = self.admit(&options).await?;
        self.inner.create(options).await
    }

    async fn get(&self, id: &str) -> Result<SandboxInfo> {
        self.inner.get(id).await
    }

    async fn list(&self, options: ListOptions) -> Result<Vec<SandboxInfo>> {
        self.inner.list(options).await
    }

    async fn set_timeout(&self, id: &str, timeout: Duration) -> Result<SandboxInfo> {
        self.inner.set_timeout(id, timeout).await
    }

    async fn set_labels(&self, id: &str, labels: BTreeMap<String, String>) -> Result<SandboxInfo> {
        self.inner.set_labels(id, labels).await
    }

    async fn update_annotations(
        &self,
        id: &str,
        update: AnnotationUpdate,
    ) -> Result<BTreeMap<String, String>> {
        self.inner.update_annotations(id, update).await
    }

    async fn destroy(&self, id: &str) -> Result<()> {
        self.inner.destroy(id).await
    }

    async fn spawn(&self, id: &str, spec: ProcessSpec) -> Result<ProcessStream> {
        self.inner.spawn(id, spec).await
    }

    async fn attach(&self, id: &str, process: ProcessSelector) -> Result<ProcessStream> {
        self.inner.attach(id, process).await
    }

    async fn write_stdin(&self, id: &str, process: ProcessSelector, data: Vec<u8>) -> Result<()> {
        self.inner.write_stdin(id, process, data).await
    }

    async fn close_stdin(&self, id: &str, process: ProcessSelector) -> Result<()> {
        self.inner.close_stdin(id, process).await
    }

    async fn signal(&self, id: &str, process: ProcessSelector, signal: Signal) -> Result<()> {
        self.inner.signal(id, process, signal).await
    }

    async fn list_processes(&self, id: &str) -> Result<Vec<ProcessInfo>> {
        self.inner.list_processes(id).await
    }

    async fn read_file(&self, id: &str, path: &str, options: ReadOptions) -> Result<ByteStream> {
        self.inner.read_file(id, path, options).await
    }

    async fn write_file(
        &self,
        id: &str,
        path: &str,
        data: ByteStream,
        options: WriteOptions,
    ) -> Result<FileStat> {
        self.inner.write_file(id, path, data, options).await
    }

    async fn list_dir(
        &self,
        id: &str,
        path: &str,
        options: ListDirOptions,
    ) -> Result<Vec<FileStat>> {
        self.inner.list_dir(id, path, options).await
    }

    async fn stat(&self, id: &str, path: &str, options: StatOptions) -> Result<FileStat> {
        self.inner.stat(id, path, options).await
    }

    async fn mkdir(&self, id: &str, path: &str, options: MkdirOptions) -> Result<FileStat> {
        self.inner.mkdir(id, path, options).await
    }

    async fn remove(&self, id: &str, path: &str, options: RemoveOptions) -> Result<()> {
        self.inner.remove(id, path, options).await
    }

    async fn rename(
        &self,
        id: &str,
        from: &str,
        to: &str,
        options: RenameOptions,
    ) -> Result<FileStat> {
        self.inner.rename(id, from, to, options).await
    }

    async fn copy(&self, id: &str, from: &str, to: &str, options: CopyOptions) -> Result<FileStat> {
        self.inner.copy(id, from, to, options).await
    }

    async fn chmod(&self, id: &str, path: &str, mode: u32) -> Result<FileStat> {
        self.inner.chmod(id, path, mode).await
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

    async fn resize_pty(&self, id: &str, process: ProcessSelector, size: PtySize) -> Result<()> {
        self.inner.resize_pty(id, process, size).await
    }

    async fn watch(&self, id: &str, path: &str, options: WatchOptions) -> Result<WatchStream> {
        self.inner.watch(id, path, options).await
    }

    async fn expose_port(&self, id: &str, options: PreviewOptions) -> Result<Preview> {
        self.inner.expose_port(id, options).await
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

    async fn delete_snapshot(&self, snapshot_id: &str) -> Result<()> {
        self.inner.delete_snapshot(snapshot_id).await
    }

    async fn fork(&self, id: &str, options: CreateOptions) -> Result<SandboxInfo> {
        let _admitted = self.admit(&options).await?;
        self.inner.fork(id, options).await
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

    async fn tombstone(&self, kind: ResourceKind, id: &str) -> Result<Option<Tombstone>> {
        self.inner.tombstone(kind, id).await
    }

    async fn observe(&self, operation: &OperationId) -> Result<OperationStatus> {
        self.inner.observe(operation).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_network_is_the_operators() {
        let host = CreateOptions::default().network(NetworkPolicy::Host);
        let refused = ServerPolicy::default().check_create(&host).unwrap_err();
        assert!(matches!(refused, Error::Forbidden { .. }), "{refused}");
        assert!(refused.to_string().contains("--allow-host-network"));
        let allowed = ServerPolicy {
            allow_host_network: true,
            ..ServerPolicy::default()
        };
        allowed.check_create(&host).unwrap();
        for network in [NetworkPolicy::None, NetworkPolicy::Internet] {
            ServerPolicy::default()
                .check_create(&CreateOptions::default().network(network))
                .unwrap();
        }
    }
}
