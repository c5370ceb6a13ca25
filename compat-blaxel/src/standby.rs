//! Standby as Blaxel documents it: a sandbox with no activity for a quiet period (Blaxel:
//! about 15 seconds without an active connection) goes to standby, keeping its memory,
//! processes and files, and the next call wakes it; and the activity that renews a
//! `ttl-idle` lease.
//!
//! Here the facade's runtime client goes through a [`Backend`] wrapper that counts as
//! activity on a sandbox:
//!
//! - every data-plane call (processes, files, previews, snapshots and forks) for as long as
//!   it runs, and a returned stream (process output, a download, a watch) for as long as it
//!   is held;
//! - a process started through `process.exec` (any tagged process but the facade's own and
//!   the code interpreter's), for as long as it runs, whichever program started it;
//! - a wake-up the wrapper did not cause: a sandbox it put in standby that runs again without
//!   a call through it was woken by a preview request (or another program). Sandboxes with a
//!   `ttl-idle` policy are looked at for that every quiet period while in standby (at most
//!   every quarter of their idle period).
//!
//! Each activity renews a `ttl-idle` lease (at most once a second per sandbox; see
//! `sandbox::touch`). Once a sandbox has had none for the quiet period, the wrapper pauses
//! it: only a sandbox that is running and was created to resume on the next call
//! (`auto_resume`, which the facade sets wherever the runtime can pause), so the engine
//! itself wakes it when the next call or preview request reaches it. Reading the sandbox's
//! record (`get`, `list`, its annotations) is not activity and does not wake it, as Blaxel's
//! control plane does not. A pause never overlaps a call: the wrapper pauses only while it
//! holds the sandbox's gate exclusively, and every call holds it shared.
//!
//! The quiet period is [`DEFAULT_STANDBY_AFTER`], or [`STANDBY_AFTER_ENV`] in milliseconds
//! (`0` turns standby off; activity still renews `ttl-idle` leases, but a sandbox that never
//! goes to standby cannot be seen woken by a preview request). Only calls made through this
//! program's facade count as calls: a sandbox used through another program (or the native
//! API) alone is paused by this one after its own quiet period, and woken by that program's
//! next call. Preview traffic to a sandbox that is awake is not seen; only its first request
//! to one in standby is, and an open preview connection freezes with the sandbox.

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

use crate::state::{self, SandboxRecord, INTERNAL_TAG_PREFIX, SANDBOX_KEY};

/// Env var: the quiet period before standby, in milliseconds (`0`: never).
pub const STANDBY_AFTER_ENV: &str = "SANDCOVE_BLAXEL_STANDBY_MS";
/// Blaxel's quiet period before standby.
pub const DEFAULT_STANDBY_AFTER: Duration = Duration::from_secs(15);
/// The most often one sandbox's `ttl-idle` lease is renewed.
pub const RENEW_EVERY: Duration = Duration::from_secs(1);

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

/// `backend` with its activity watched: standby after `quiet` (none: never), `ttl-idle`
/// leases renewed either way.
pub(crate) fn wrap(backend: Arc<dyn Backend>, quiet: Option<Duration>) -> Arc<dyn Backend> {
    let wrapper = Arc::new(Standby {
        shared: Shared {
            inner: backend,
            quiet,
            sandboxes: Default::default(),
        },
    });
    let mut wrappers = WRAPPERS.lock().unwrap_or_else(|e| e.into_inner());
    wrappers.retain(|w| w.strong_count() > 0);
    wrappers.push(Arc::downgrade(&wrapper));
    wrapper
}

/// The wrappers of this program, so that work the facade does outside the runtime's calls
/// (a `fetch` through a preview) counts as activity as a call does ([`hold`]).
static WRAPPERS: Mutex<Vec<std::sync::Weak<Standby>>> = Mutex::new(Vec::new());

/// Activity on sandbox `id`, for as long as the value is held, when `backend` is one of this
/// module's wrappers (nothing otherwise): it waits out a pause under way, keeps the sandbox
/// from standby and renews its `ttl-idle` lease.
pub(crate) async fn hold(backend: &Arc<dyn Backend>, id: &str) -> Option<Hold> {
    // Addresses compared as numbers: the same allocation is the same wrapper.
    let target = Arc::as_ptr(backend) as *const () as usize;
    let wrapper = WRAPPERS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter_map(std::sync::Weak::upgrade)
        .find(|w| Arc::as_ptr(w) as *const () as usize == target)?;
    Some(Hold(wrapper.active(id).await))
}

/// Activity held by [`hold`].
pub(crate) struct Hold(#[allow(dead_code)] Activity);

impl std::fmt::Debug for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Hold").field(&self.0.id).finish()
    }
}

/// The wrapper (see the module docs).
#[derive(Debug)]
pub(crate) struct Standby {
    shared: Shared,
}

/// What the wrapper and its watches share.
#[derive(Debug, Clone)]
struct Shared {
    inner: Arc<dyn Backend>,
    /// The quiet period before standby; `None`: no standby.
    quiet: Option<Duration>,
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
    /// When its `ttl-idle` lease was last renewed.
    renewed: Mutex<Option<Instant>>,
}

impl Idle {
    fn touch(&self) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    fn last(&self) -> Instant {
        *self.last.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Shared {
    /// Renew the `ttl-idle` lease of sandbox `id` (nothing for a sandbox without one),
    /// unless that was done less than [`RENEW_EVERY`] ago; on a task of its own, never
    /// delaying the call it is for.
    fn renew(&self, idle: &Idle, id: &str) {
        {
            let mut renewed = idle.renewed.lock().unwrap_or_else(|e| e.into_inner());
            if renewed.is_some_and(|at| at.elapsed() < RENEW_EVERY) {
                return;
            }
            *renewed = Some(Instant::now());
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        // Straight to the runtime: the renewal is no call of the sandbox's own.
        let sandbox = sandcove::Client::new(self.inner.clone()).sandbox(id.to_string());
        runtime.spawn(async move { crate::sandbox::touch(&sandbox).await });
    }

    /// Arm the watch of `idle` unless one runs.
    fn arm(&self, idle: &Arc<Idle>, id: &str) {
        if idle.armed.swap(true, Ordering::SeqCst) {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(watch(self.clone(), idle.clone(), id.to_string()));
            }
            // No runtime to time the quiet period on: the next call's end tries again.
            Err(_) => idle.armed.store(false, Ordering::SeqCst),
        }
    }
}

/// A call (or a stream) in flight on one sandbox; its end starts the quiet period.
struct Activity {
    _shared: OwnedRwLockReadGuard<()>,
    idle: Arc<Idle>,
    shared: Shared,
    id: String,
}

impl Drop for Activity {
    fn drop(&mut self) {
        self.idle.touch();
        self.shared.renew(&self.idle, &self.id);
        self.shared.arm(&self.idle, &self.id);
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

/// Whether a process started through `process.exec` runs in sandbox `id`: one with a tag
/// that is neither the facade's own nor the code interpreter's.
async fn exec_process_runs(inner: &dyn Backend, id: &str) -> bool {
    let Ok(processes) = inner.list_processes(id).await else {
        return false;
    };
    processes.iter().any(|p| {
        p.ended_at.is_none()
            && p.tag.as_deref().is_some_and(|tag| {
                !tag.starts_with(INTERNAL_TAG_PREFIX) && !sandcove_interpreter::is_context_tag(tag)
            })
    })
}

/// The idle period of a sandbox with a `ttl-idle` policy.
fn idle_period(info: &SandboxInfo) -> Option<Duration> {
    let record: SandboxRecord = state::annotation(info, SANDBOX_KEY)?;
    record.idle_secs.map(Duration::from_secs)
}

/// How a look at a sandbox in standby ended.
enum Woken {
    /// It runs again (a call of ours, or something else): watch it again.
    Again,
    /// It is gone, or no longer in standby in a way worth watching.
    Done,
}

/// Look at sandbox `id`, which the watch put in standby, every `every` until it runs again:
/// woken by a call through this wrapper (already activity), or by something else — a
/// preview request, another program —, which is activity then.
async fn look_while_paused(shared: &Shared, idle: &Idle, id: &str, every: Duration) -> Woken {
    let seen = idle.last();
    loop {
        tokio::time::sleep(every).await;
        if idle.last() != seen {
            return Woken::Again;
        }
        match shared.inner.get(id).await {
            Ok(info) if info.state == SandboxState::Paused => {}
            Ok(info) if info.state == SandboxState::Running => {
                idle.touch();
                shared.renew(idle, id);
                return Woken::Again;
            }
            _ => return Woken::Done,
        }
    }
}

/// Watch sandbox `id` after a call: while calls, streams or exec'd processes keep it busy,
/// renew its `ttl-idle` lease; once it has been quiet for the quiet period, put it in
/// standby (see the module docs).
async fn watch(shared: Shared, idle: Arc<Idle>, id: String) {
    let mut disarm = Disarm(Some(idle.clone()));
    let period = shared.quiet.unwrap_or(DEFAULT_STANDBY_AFTER);
    loop {
        tokio::time::sleep_until((idle.last() + period).into()).await;
        if idle.last().elapsed() < period {
            continue;
        }
        let Ok(exclusive) = idle.gate.clone().try_write_owned() else {
            // A call or stream is in flight: activity; look again a period later.
            shared.renew(&idle, &id);
            tokio::time::sleep(period).await;
            continue;
        };
        if idle.last().elapsed() < period {
            continue;
        }
        // Only what the next call wakes: a sandbox that is gone, stopped, already paused or
        // not made to resume by itself is left as it is.
        let mut paused = None;
        if let Ok(info) = shared.inner.get(&id).await {
            if info.state == SandboxState::Running {
                if exec_process_runs(&*shared.inner, &id).await {
                    drop(exclusive);
                    shared.renew(&idle, &id);
                    tokio::time::sleep(period).await;
                    continue;
                }
                if shared.quiet.is_some()
                    && info.auto_resume
                    && shared.inner.pause(&id).await.is_ok()
                {
                    paused = Some(info);
                }
            }
        }
        // A `ttl-idle` sandbox in standby is looked at until it runs again: whatever wakes
        // it is activity that renews its lease.
        if let Some(every) = paused.as_ref().and_then(idle_period) {
            drop(exclusive);
            let every = period.min(every / 4).max(Duration::from_millis(100));
            match look_while_paused(&shared, &idle, &id, every).await {
                Woken::Again => continue,
                Woken::Done => {}
            }
        } else {
            // Disarmed while the gate is still held, so any later call's end arms a new
            // watch.
            idle.armed.store(false, Ordering::SeqCst);
            disarm.0 = None;
            drop(exclusive);
        }
        break;
    }
    drop(disarm);
    // Nothing else holds the record (the map and this watch only; a call takes its clone
    // under the map's lock): drop it, a later call makes a fresh one.
    let mut map = shared.sandboxes.lock().unwrap_or_else(|e| e.into_inner());
    if map.get(&id).is_some_and(|r| Arc::ptr_eq(r, &idle)) && Arc::strong_count(&idle) == 2 {
        map.remove(&id);
    }
}

impl Standby {
    fn backend(&self) -> &Arc<dyn Backend> {
        &self.shared.inner
    }

    fn idle(&self, id: &str) -> Arc<Idle> {
        self.shared
            .sandboxes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(id.to_string())
            .or_insert_with(|| {
                Arc::new(Idle {
                    gate: Arc::new(RwLock::new(())),
                    last: Mutex::new(Instant::now()),
                    armed: AtomicBool::new(false),
                    renewed: Mutex::new(None),
                })
            })
            .clone()
    }

    /// Activity on `id` until the returned value is dropped (waits out a pause under way).
    async fn active(&self, id: &str) -> Activity {
        let idle = self.idle(id);
        let shared = idle.gate.clone().read_owned().await;
        idle.touch();
        self.shared.renew(&idle, id);
        Activity {
            _shared: shared,
            idle,
            shared: self.shared.clone(),
            id: id.to_string(),
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
        &**self.backend()
    }

    async fn create(&self, options: CreateOptions) -> Result<SandboxInfo> {
        let info = self.backend().create(options).await?;
        // The quiet period starts at its creation.
        drop(self.active(&info.id).await);
        Ok(info)
    }

    async fn destroy(&self, id: &str) -> Result<()> {
        let result = self.backend().destroy(id).await;
        if result.is_ok() {
            self.shared
                .sandboxes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(id);
        }
        result
    }

    async fn spawn(&self, id: &str, spec: ProcessSpec) -> Result<ProcessStream> {
        let activity = self.active(id).await;
        Ok(held_process(
            self.backend().spawn(id, spec).await?,
            activity,
        ))
    }

    async fn attach(&self, id: &str, process: ProcessSelector) -> Result<ProcessStream> {
        let activity = self.active(id).await;
        Ok(held_process(
            self.backend().attach(id, process).await?,
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
        self.backend().write_stdin(id, process, options).await
    }

    async fn close_stdin(&self, id: &str, process: ProcessSelector) -> Result<()> {
        let _activity = self.active(id).await;
        self.backend().close_stdin(id, process).await
    }

    async fn signal(
        &self,
        id: &str,
        process: ProcessSelector,
        options: SignalOptions,
    ) -> Result<()> {
        let _activity = self.active(id).await;
        self.backend().signal(id, process, options).await
    }

    async fn list_processes(&self, id: &str) -> Result<Vec<ProcessInfo>> {
        let _activity = self.active(id).await;
        self.backend().list_processes(id).await
    }

    async fn read_file(&self, id: &str, path: &str, options: ReadOptions) -> Result<ByteStream> {
        let activity = self.active(id).await;
        let stream = self.backend().read_file(id, path, options).await?;
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
        self.backend().write_file(id, path, data, options).await
    }

    async fn list_dir(
        &self,
        id: &str,
        path: &str,
        options: ListDirOptions,
    ) -> Result<Vec<FileStat>> {
        let _activity = self.active(id).await;
        self.backend().list_dir(id, path, options).await
    }

    async fn stat(&self, id: &str, path: &str, options: StatOptions) -> Result<FileStat> {
        let _activity = self.active(id).await;
        self.backend().stat(id, path, options).await
    }

    async fn mkdir(&self, id: &str, path: &str, options: MkdirOptions) -> Result<FileStat> {
        let _activity = self.active(id).await;
        self.backend().mkdir(id, path, options).await
    }

    async fn remove(&self, id: &str, path: &str, options: RemoveOptions) -> Result<()> {
        let _activity = self.active(id).await;
        self.backend().remove(id, path, options).await
    }

    async fn rename(
        &self,
        id: &str,
        from: &str,
        to: &str,
        options: RenameOptions,
    ) -> Result<FileStat> {
        let _activity = self.active(id).await;
        self.backend().rename(id, from, to, options).await
    }

    async fn copy(&self, id: &str, from: &str, to: &str, options: CopyOptions) -> Result<FileStat> {
        let _activity = self.active(id).await;
        self.backend().copy(id, from, to, options).await
    }

    async fn chmod(&self, id: &str, path: &str, options: ChmodOptions) -> Result<FileStat> {
        let _activity = self.active(id).await;
        self.backend().chmod(id, path, options).await
    }

    async fn resume(&self, id: &str) -> Result<SandboxInfo> {
        let _activity = self.active(id).await;
        self.backend().resume(id).await
    }

    async fn start(&self, id: &str) -> Result<SandboxInfo> {
        let _activity = self.active(id).await;
        self.backend().start(id).await
    }

    async fn resize_pty(
        &self,
        id: &str,
        process: ProcessSelector,
        options: ResizePtyOptions,
    ) -> Result<()> {
        let _activity = self.active(id).await;
        self.backend().resize_pty(id, process, options).await
    }

    async fn watch(&self, id: &str, path: &str, options: WatchOptions) -> Result<WatchStream> {
        let activity = self.active(id).await;
        let stream = self.backend().watch(id, path, options).await?;
        Ok(Box::pin(Held {
            stream,
            _activity: activity,
        }))
    }

    async fn expose_port(&self, id: &str, options: PreviewOptions) -> Result<Preview> {
        let _activity = self.active(id).await;
        self.backend().expose_port(id, options).await
    }

    async fn close_preview(&self, id: &str, port: u16) -> Result<()> {
        let _activity = self.active(id).await;
        self.backend().close_preview(id, port).await
    }

    async fn snapshot(&self, id: &str, options: SnapshotOptions) -> Result<SnapshotInfo> {
        let _activity = self.active(id).await;
        self.backend().snapshot(id, options).await
    }

    async fn fork(&self, id: &str, options: CreateOptions) -> Result<SandboxInfo> {
        let _activity = self.active(id).await;
        let info = self.backend().fork(id, options).await?;
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
            shared: Shared {
                inner: Arc::new(engine),
                quiet: Some(Duration::from_millis(50)),
                sandboxes: Default::default(),
            },
        };
        for i in 0..300 {
            let gone = format!("gone{i}");
            assert!(Backend::list_processes(&standby, &gone).await.is_err());
        }
        let standby = &standby;
        eventually(PATIENCE, "no record of gone sandboxes", || async move {
            let left = standby
                .shared
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
