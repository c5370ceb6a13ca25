//! envd's polling watchers (`CreateWatcher`, `GetWatcherEvents`, `RemoveWatcher`), which the
//! synchronous Python SDK's `files.watch_dir` uses: a watch runs on a task and its events wait
//! here, bounded, until the client polls.
//!
//! A watcher that has ended (its directory or sandbox gone, or more events than it keeps)
//! holds no inotify instance in the sandbox any more, only its undelivered events: it is kept
//! for [`KEEP_ENDED`] so a poll still gets them, then dropped. Every watcher of a sandbox,
//! ended ones included, counts toward [`MAX_WATCHERS_PER_SANDBOX`], so one sandbox's token
//! cannot take the server's [`MAX_WATCHERS`] from the others.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use futures::StreamExt;

use super::connect::{Code, ConnectError};
use crate::files::{self, FilesystemEvent};
use crate::sandbox::Ctx;

/// Watchers alive at once per server.
pub const MAX_WATCHERS: usize = 256;
/// Watchers one sandbox may hold at once, ended ones still waiting for a poll included.
pub const MAX_WATCHERS_PER_SANDBOX: usize = 16;
/// Events kept per watcher between two polls; beyond that the watcher fails.
pub const MAX_PENDING_EVENTS: usize = 10_000;
/// How long an ended watcher's undelivered events wait for a poll before it is dropped.
pub const KEEP_ENDED: std::time::Duration = std::time::Duration::from_secs(60);

struct Watcher {
    sandbox: String,
    state: Arc<Mutex<Pending>>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct Pending {
    events: VecDeque<FilesystemEvent>,
    /// Why the watch ended, reported on the next poll.
    ended: Option<ConnectError>,
    /// When the watch ended.
    ended_at: Option<std::time::Instant>,
}

impl Pending {
    fn end(&mut self, why: ConnectError) {
        self.ended = Some(why);
        self.ended_at = Some(std::time::Instant::now());
    }
}

/// Whether a watcher stays registered at `now`: while its watch runs, and after it ended
/// while undelivered events wait, for at most [`KEEP_ENDED`].
fn kept(running: bool, pending: &Pending, now: std::time::Instant) -> bool {
    running
        || (!pending.events.is_empty()
            && pending
                .ended_at
                .is_some_and(|at| now.saturating_duration_since(at) < KEEP_ENDED))
}

/// The registry of polling watchers.
#[derive(Default)]
pub(crate) struct Watchers {
    all: Mutex<HashMap<String, Watcher>>,
}

impl Drop for Watchers {
    fn drop(&mut self) {
        if let Ok(all) = self.all.lock() {
            for w in all.values() {
                w.task.abort();
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Watchers {
    /// Register a watch of sandbox `sandbox`; its id.
    pub fn add(
        &self,
        sandbox: String,
        ctx: Ctx,
        mut stream: sandcove::WatchStream,
        include_entry: bool,
    ) -> Result<String, String> {
        let mut all = lock(&self.all);
        let now = std::time::Instant::now();
        all.retain(|_, w| kept(!w.task.is_finished(), &lock(&w.state), now));
        if all.values().filter(|w| w.sandbox == sandbox).count() >= MAX_WATCHERS_PER_SANDBOX {
            return Err(format!(
                "{MAX_WATCHERS_PER_SANDBOX} watchers are already open on this sandbox (those \
                 that ended keep their events for a poll for {}s): remove some first",
                KEEP_ENDED.as_secs()
            ));
        }
        if all.len() >= MAX_WATCHERS {
            return Err(format!(
                "{MAX_WATCHERS} watchers are already open on this server: remove some first"
            ));
        }
        let state = Arc::new(Mutex::new(Pending::default()));
        let pending = state.clone();
        let task = tokio::spawn(async move {
            while let Some(item) = stream.next().await {
                let ended = match item {
                    Ok(ev) => {
                        let e = files::watch_event(&ctx, ev, include_entry).await;
                        let mut p = lock(&pending);
                        if p.events.len() >= MAX_PENDING_EVENTS {
                            Some(ConnectError::new(
                                Code::ResourceExhausted,
                                format!(
                                    "more than {MAX_PENDING_EVENTS} events waited for a poll: \
                                     the watcher stopped"
                                ),
                            ))
                        } else {
                            p.events.push_back(e);
                            None
                        }
                    }
                    Err(e) => Some(ConnectError::from(e)),
                };
                if let Some(e) = ended {
                    lock(&pending).end(e);
                    return;
                }
            }
            lock(&pending).end(ConnectError::new(
                Code::Unavailable,
                "the watch ended (the directory or the sandbox is gone)",
            ));
        });
        let id = format!("w-{}", sandcove::random_id(20));
        all.insert(
            id.clone(),
            Watcher {
                sandbox,
                state,
                task,
            },
        );
        Ok(id)
    }

    /// The events since the last poll; the watch's error once it has ended.
    pub fn take(&self, sandbox: &str, id: &str) -> Result<Vec<FilesystemEvent>, ConnectError> {
        let mut all = lock(&self.all);
        let Some(w) = all.get(id).filter(|w| w.sandbox == sandbox) else {
            return Err(ConnectError::new(
                Code::NotFound,
                format!("watcher {id} not found"),
            ));
        };
        let mut p = lock(&w.state);
        if p.events.is_empty() {
            if let Some(e) = p.ended.take() {
                drop(p);
                all.remove(id);
                return Err(e);
            }
        }
        Ok(p.events.drain(..).collect())
    }

    /// Stop and forget a watcher.
    pub fn remove(&self, sandbox: &str, id: &str) -> Result<(), ConnectError> {
        let mut all = lock(&self.all);
        match all.get(id) {
            Some(w) if w.sandbox == sandbox => {
                w.task.abort();
                all.remove(id);
                Ok(())
            }
            _ => Err(ConnectError::new(
                Code::NotFound,
                format!("watcher {id} not found"),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ended_watcher_keeps_its_events_for_a_while_only() {
        let t0 = std::time::Instant::now();
        let mut p = Pending::default();
        assert!(kept(true, &p, t0), "a running watch stays");
        assert!(
            !kept(false, &p, t0),
            "an ended one with nothing to deliver goes"
        );
        p.events.push_back(FilesystemEvent {
            name: "x".into(),
            r#type: files::FilesystemEventType::Create,
            entry: None,
        });
        assert!(
            !kept(false, &p, t0),
            "a watch that ended unrecorded (aborted) goes"
        );
        p.end(ConnectError::new(Code::Unavailable, "gone"));
        let at = p.ended_at.unwrap();
        assert!(kept(
            false,
            &p,
            at + KEEP_ENDED - std::time::Duration::from_millis(1)
        ));
        assert!(
            !kept(false, &p, at + KEEP_ENDED),
            "undelivered events expire"
        );
    }
}
