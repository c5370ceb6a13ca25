//! Standby as Blaxel documents it: a sandbox with no call in flight for a quiet period
//! (Blaxel: about 15 seconds without an active connection) goes to standby, keeping its
//! memory, processes and files, and the next call wakes it.
//!
//! Here the facade's runtime client goes through a [`Backend`] wrapper that
//! counts every data-plane call on a sandbox (processes, files, previews, snapshots and
//! forks) as activity for as long as it runs, a returned stream (process output, a download,
//! a watch) for as long as it is held. Once a sandbox has had none for the quiet period, the
//! wrapper pauses it: only a sandbox that is running and was created to resume on the next
//! call (`auto_resume`, which the facade sets wherever the runtime can pause), so the engine
//! itself wakes it when the next call reaches it. Reading the sandbox's record (`get`,
//! `list`, its annotations) is not activity and does not wake it, as Blaxel's control plane
//! does not. A pause never overlaps a call: the wrapper pauses only while it holds the
//! sandbox's gate exclusively, and every call holds it shared.
//!
//! The quiet period is [`DEFAULT_STANDBY_AFTER`], or [`STANDBY_AFTER_ENV`] in milliseconds
//! (`0` turns standby off). Only calls made through this program's facade count: a sandbox
//! used through another program (or the native API) alone is paused by this one after its
//! own quiet period, and woken by that program's next call.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::Stream;
use sandcove::{
    Backend, ByteStream, ChmodOptions, CopyOptions, CreateOptions, FileStat, Layer, ListDirOptions,
    MkdirOptions, Preview, PreviewOptions, ProcessInfo, ProcessSelector, ProcessSpec,
    ProcessStream, ReadOptions, RemoveOptions, RenameOptions, ResizePtyOptions, Result,
    SandboxInfo, SandboxState, SignalOptions, SnapshotInfo, SnapshotOptions, StatOptions,
    WatchOptions, WatchStream, WriteOptions, WriteStdinOptions,
};
use tokio::sync::{OwnedRwLockReadGuard, RwLock};

/// Env var: the quiet period before standby, in milliseconds (`0`: never).
pub const STANDBY_AFTER_ENV: &str = "SANDCOVE_BLAXEL_STANDBY_MS";
/// Blaxel's quiet period before standby.
pub const DEFAULT_STANDBY_AFTER: Duration = Duration::from_secs(15);

/// The quiet period before standby: [`STANDBY_AFTER_ENV`] when set to a number of
/// milliseconds (`None` for `0`), else [`DEFAULT_STANDBY_AFTER`]. Anything else in the
/// variable is [`sandcove::Error::InvalidArgument`].
pub fn standby_after() -> Result<Option<Duration>> {
    match std::env::var(STANDBY_AFTER_ENV) {
        Err(_) => Ok(Some(DEFAULT_STANDBY_AFTER)),
        Ok(text) => match text.trim().parse::<u64>() {
            Ok(0) => Ok(None),
            Ok(ms) => Ok(Some(Duration::from_millis(ms))),
            Err(_) => Err(sandcove::Error::invalid(format!(
                "{STANDBY_AFTER_ENV}={text:?}: a number of milliseconds (0 turns standby off)"
            ))),
        },
    }
}

/// `backend` with standby after `quiet` (none: `backend` itself).
pub(crate) fn wrap(backend: Arc<dyn Backend>, quiet: Option<Duration>) -> Arc<dyn Backend> {
    match quiet {
        Some(quiet) => Arc::new(Standby {
            inner: backend,
            quiet,
            sandboxes: Default::default(),
        }),
        None => backend,
    }
}

/// The wrapper (see the module docs).
#[derive(Debug)]
pub(crate) struct Standby {
    inner: Arc<dyn Backend>,
    quiet: Duration,
    sandboxes: Sandboxes,
}

/// Activity records by sandbox id. A record lives while a call, a stream or a watch holds
/// it: the watch that ends a quiet period drops a record nothing else holds, so ids of
/// sandboxes that ended elsewhere (or never existed) do not pile up.
type Sandboxes = Arc<Mutex<HashMap<String, Arc<Idle>>>>;

/// One sandbox's activity.
#[derive(Debug)]
struct Idle {
    /// Held shared by every call and stream, exclusively while pausing.
    gate: Arc<RwLock<()>>,
    /// When a call last started or ended.
    last: Mutex<Instant>,
    /// Whether a watch task runs for this sandbox.
    armed: AtomicBool,
}

impl Idle {
    fn touch(&self) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    fn last(&self) -> Instant {
        *self.last.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A call (or a stream) in flight on one sandbox; its end starts the quiet period.
struct Activity {
    _shared: OwnedRwLockReadGuard<()>,
    idle: Arc<Idle>,
    sandboxes: Sandboxes,
    id: String,
    inner: Arc<dyn Backend>,
    quiet: Duration,
}

impl Drop for Activity {
    fn drop(&mut self) {
        self.idle.touch();
        if self.idle.armed.swap(true, Ordering::SeqCst) {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(watch(
                    self.inner.clone(),
                    self.sandboxes.clone(),
                    self.idle.clone(),
                    self.id.clone(),
                    self.quiet,
                ));
            }
            // No runtime to time the quiet period on: the next call's end tries again.
            Err(_) => self.idle.armed.store(false, Ordering::SeqCst),
        }
    }
}

/// Disarms a watch that ends without finishing (its runtime shut down), so the next call's
/// end arms a new one.
struct Disarm(Option<Arc<Idle>>);

impl Drop for Disarm {
    fn drop(&mut self) {
        if let Some(idle) = self.0.take() {
            idle.armed.store(false, Ordering::SeqCst);
        }
    }
}

/// Wait out the quiet period of sandbox `id`, then put it in standby (see the module docs).
async fn watch(
    inner: Arc<dyn Backend>,
    sandboxes: Sandboxes,
    idle: Arc<Idle>,
    id: String,
    quiet: Duration,
) {
    let mut disarm = Disarm(Some(idle.clone()));
    loop {
        tokio::time::sleep_until((idle.last() + quiet).into()).await;
        if idle.last().elapsed() < quiet {
            continue;
        }
        let Ok(_exclusive) = idle.gate.clone().try_write_owned() else {
            // A call or stream is in flight: look again a quiet period later.
            tokio::time::sleep(quiet).await;
            continue;
        };
        if idle.last().elapsed() < quiet {
            continue;
        }
        // Only what the next call wakes: a sandbox that is gone, stopped, already paused or
        // not made to resume by itself is left as it is.
        if let Ok(info) = inner.get(&id).await {
            if info.state == SandboxState::Running && info.auto_resume {
                let _ = inner.pause(&id).await;
            }
        }
        // Disarmed while the gate is still held, so any later call's end arms a new watch.
        idle.armed.store(false, Ordering::SeqCst);
        disarm.0 = None;
        // Nothing else holds the record (the map and this watch only; a call takes its
        // clone under the map's lock): drop it, a later call makes a fresh one.
        let mut map = sandboxes.lock().unwrap_or_else(|e| e.into_inner());
        if map.get(&id).is_some_and(|r| Arc::ptr_eq(r, &idle)) && Arc::strong_count(&idle) == 2 {
            map.remove(&id);
        }
        return;
    }
}

impl Standby {
    fn idle(&self, id: &str) -> Arc<Idle> {
        self.sandboxes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(id.to_string())
            .or_insert_with(|| {
                Arc::new(Idle {
                    gate: Arc::new(RwLock::new(())),
                    last: Mutex::new(Instant::now()),
                    armed: AtomicBool::new(false),
                })
            })
            .clone()
    }

    /// Activity on `id` until the returned value is dropped (waits out a pause under way).
    async fn active(&self, id: &str) -> Activity {
        let idle = self.idle(id);
        let shared = idle.gate.clone().read_owned().await;
        idle.touch();
        Activity {
            _shared: shared,
            idle,
            sandboxes: self.sandboxes.clone(),
            id: id.to_string(),
            inner: self.inner.clone(),
            quiet: self.quiet,
        }
    }
}

/// A stream that keeps its sandbox awake while it is held.
struct Held<S> {
    stream: S,
    _activity: Activity,
}

impl<S: Stream + Unpin> Stream for Held<S> {
    type Item = S::Item;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        Pin::new(&mut self.stream).poll_next(cx)
    }
}

fn held_process(stream: ProcessStream, activity: Activity) -> ProcessStream {
    ProcessStream {
        pid: stream.pid,
        events: Box::pin(Held {
            stream: stream.events,
            _activity: activity,
        }),
    }
}

#[async_trait]
impl Layer for Standby {
    fn inner(&self) -> &dyn Backend {
        &*self.inner
    }

    async fn create(&self, options: CreateOptions) -> Result<SandboxInfo> {
        let info = self.inner.create(options).await?;
        // The quiet period starts at its creation.
        drop(self.active(&info.id).await);
        Ok(info)
    }

    async fn destroy(&self, id: &str) -> Result<()> {
        let result = self.inner.destroy(id).await;
        if result.is_ok() {
            self.sandboxes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(id);
        }
        result
    }

    async fn spawn(&self, id: &str, spec: ProcessSpec) -> Result<ProcessStream> {
        let activity = self.active(id).await;
        Ok(held_process(self.inner.spawn(id, spec).await?, activity))
    }

    async fn attach(&self, id: &str, process: ProcessSelector) -> Result<ProcessStream> {
        let activity = self.active(id).await;
        Ok(held_process(
            self.inner.attach(id, process).await?,
            activity,
        ))
    }

    async fn write_stdin(
        &self,
        id: &str,
        process: ProcessSelector,
        options: WriteStdinOptions,
    ) -> Result<()> {
        let _activity = self.active(id).await;
        self.inner.write_stdin(id, process, options).await
    }

    async fn close_stdin(&self, id: &str, process: ProcessSelector) -> Result<()> {
        let _activity = self.active(id).await;
        self.inner.close_stdin(id, process).await
    }

    async fn signal(
        &self,
        id: &str,
        process: ProcessSelector,
        options: SignalOptions,
    ) -> Result<()> {
        let _activity = self.active(id).await;
        self.inner.signal(id, process, options).await
    }

    async fn list_processes(&self, id: &str) -> Result<Vec<ProcessInfo>> {
        let _activity = self.active(id).await;
        self.inner.list_processes(id).await
    }

    async fn read_file(&self, id: &str, path: &str, options: ReadOptions) -> Result<ByteStream> {
        let activity = self.active(id).await;
        let stream = self.inner.read_file(id, path, options).await?;
        Ok(Box::pin(Held {
            stream,
            _activity: activity,
        }))
    }

    async fn write_file(
        &self,
        id: &str,
        path: &str,
        data: ByteStream,
        options: WriteOptions,
    ) -> Result<FileStat> {
        let _activity = self.active(id).await;
        self.inner.write_file(id, path, data, options).await
    }

    async fn list_dir(
        &self,
        id: &str,
        path: &str,
        options: ListDirOptions,
    ) -> Result<Vec<FileStat>> {
        let _activity = self.active(id).await;
        self.inner.list_dir(id, path, options).await
    }

    async fn stat(&self, id: &str, path: &str, options: StatOptions) -> Result<FileStat> {
        let _activity = self.active(id).await;
        self.inner.stat(id, path, options).await
    }

    async fn mkdir(&self, id: &str, path: &str, options: MkdirOptions) -> Result<FileStat> {
        let _activity = self.active(id).await;
        self.inner.mkdir(id, path, options).await
    }

    async fn remove(&self, id: &str, path: &str, options: RemoveOptions) -> Result<()> {
        let _activity = self.active(id).await;
        self.inner.remove(id, path, options).await
    }

    async fn rename(
        &self,
        id: &str,
        from: &str,
        to: &str,
        options: RenameOptions,
    ) -> Result<FileStat> {
        let _activity = self.active(id).await;
        self.inner.rename(id, from, to, options).await
    }

    async fn copy(&self, id: &str, from: &str, to: &str, options: CopyOptions) -> Result<FileStat> {
        let _activity = self.active(id).await;
        self.inner.copy(id, from, to, options).await
    }

    async fn chmod(&self, id: &str, path: &str, options: ChmodOptions) -> Result<FileStat> {
        let _activity = self.active(id).await;
        self.inner.chmod(id, path, options).await
    }

    async fn resume(&self, id: &str) -> Result<SandboxInfo> {
        let _activity = self.active(id).await;
        self.inner.resume(id).await
    }

    async fn start(&self, id: &str) -> Result<SandboxInfo> {
        let _activity = self.active(id).await;
        self.inner.start(id).await
    }

    async fn resize_pty(
        &self,
        id: &str,
        process: ProcessSelector,
        options: ResizePtyOptions,
    ) -> Result<()> {
        let _activity = self.active(id).await;
        self.inner.resize_pty(id, process, options).await
    }

    async fn watch(&self, id: &str, path: &str, options: WatchOptions) -> Result<WatchStream> {
        let activity = self.active(id).await;
        let stream = self.inner.watch(id, path, options).await?;
        Ok(Box::pin(Held {
            stream,
            _activity: activity,
        }))
    }

    async fn expose_port(&self, id: &str, options: PreviewOptions) -> Result<Preview> {
        let _activity = self.active(id).await;
        self.inner.expose_port(id, options).await
    }

    async fn close_preview(&self, id: &str, port: u16) -> Result<()> {
        let _activity = self.active(id).await;
        self.inner.close_preview(id, port).await
    }

    async fn snapshot(&self, id: &str, options: SnapshotOptions) -> Result<SnapshotInfo> {
        let _activity = self.active(id).await;
        self.inner.snapshot(id, options).await
    }

    async fn fork(&self, id: &str, options: CreateOptions) -> Result<SandboxInfo> {
        let _activity = self.active(id).await;
        let info = self.inner.fork(id, options).await?;
        drop(self.active(&info.id).await);
        Ok(info)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandcove_conformance::{eventually, PATIENCE};

    /// Attack (fails): calls naming sandboxes that do not exist (or ended elsewhere) must not
    /// leave a record each behind for the life of the server.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn records_of_gone_sandboxes_are_dropped() {
        let dir = std::env::temp_dir().join(sandcove_conformance::unique("standby-records"));
        let engine = sandcove::LocalBackend::with_state_dir(&dir)
            .expect("engine")
            .with_warm_pool(0);
        let standby = Standby {
            inner: Arc::new(engine),
            quiet: Duration::from_millis(50),
            sandboxes: Default::default(),
        };
        for i in 0..300 {
            let gone = format!("gone{i}");
            assert!(Backend::list_processes(&standby, &gone).await.is_err());
        }
        let standby = &standby;
        eventually(PATIENCE, "no record of gone sandboxes", || async move {
            let left = standby
                .sandboxes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .len();
            if left == 0 {
                Ok(())
            } else {
                Err(format!("{left} records"))
            }
        })
        .await;
        let _ = std::fs::remove_dir_all(&dir);
    }
}
