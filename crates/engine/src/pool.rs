//! The warm pool: sandboxes of the default shape made in the background, so that `create`
//! mostly claims one instead of building namespaces and a root while the caller waits.
//!
//! A member is an ordinary sandbox made by the cold path with a short lease
//! ([`MEMBER_LEASE`]) and marked `pooled` in its record: its monitor publishes no info (so
//! `list` never shows it) and nothing but a claim is ever sent to it. The pool's task, on
//! the runtime of the first `create`, keeps [`LocalBackend::with_warm_pool`] members ready,
//! retires each one before its lease ends (destroys it, makes a fresh one), and destroys them
//! all when the last clone of the engine is dropped. A claimed member's replacement is made
//! a short quiet period after the claim ([`REFILL_QUIET`]), so that it does not compete with
//! the claimer's first command, or at once if the claim emptied the pool. Nothing renews a
//! member's lease, so members of a program that exits or crashes end within
//! [`MEMBER_LEASE`] on their own.
//!
//! A claim happens in three steps, each of which falls back to a cold create on failure:
//! the claimer's name is taken for the member, the agent takes the claim (the claimer's envs
//! and users, `/etc/passwd` and `/etc/group` rewritten; refused if anything ever ran in the
//! member), then the monitor takes it (options, users, creation time and lease start now,
//! and the sandbox appears in `list`). Only shapes a member was made with are served: a
//! sandbox with resources, a network policy, volumes, a snapshot, a home, a hostname or a
//! template other than the host base is always created cold.
//!
//! Until a claim has handed it out, a member does not exist for the engine's callers: every
//! call naming its id is `NotFound`, exactly as for an unknown id (the id is random and never
//! shown, but one learnt some other way opens nothing). Only the pool's own work (making,
//! claiming, retiring members) reaches it.

use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::config::UidMapping;
use super::LocalBackend;
use sandcove_core::{now_millis, CreateOptions};

/// Env var setting the number of warm sandboxes an engine keeps (`0` turns the pool off).
pub const WARM_POOL_ENV: &str = "SANDCOVE_WARM_POOL";
/// Warm sandboxes an embedded engine keeps when neither its config nor [`WARM_POOL_ENV`] says
/// otherwise: none. A program embedding the engine usually creates a sandbox or two and exits,
/// and members it pre-created would cost it more than they save; a long-lived server enables
/// the pool (`sandcove serve --warm-pool`, default [`SERVER_WARM_POOL`]).
pub const DEFAULT_WARM_POOL: usize = 0;
/// The pool `sandcove serve` keeps unless told otherwise: a server lives long enough for its
/// members to be claimed.
pub const SERVER_WARM_POOL: usize = 2;
/// Largest pool accepted (more is a configuration mistake, and each member holds memory).
pub const MAX_WARM_POOL: usize = 64;
/// A member's lease: how long one outlives a program that exits without cleaning up.
pub const MEMBER_LEASE: Duration = Duration::from_secs(30);
/// A member this close to its lease end is retired, not handed out.
const RETIRE_MARGIN: Duration = Duration::from_secs(10);
/// How long after a claim the pool waits before making the replacement (unless the claim
/// emptied it): long enough for the claimer's first command, short enough that the pool is
/// rarely short when the next create comes.
const REFILL_QUIET: Duration = Duration::from_millis(20);

/// Longest wait between failed attempts to fill the pool.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// The pool size from [`WARM_POOL_ENV`], else [`DEFAULT_WARM_POOL`]; capped at
/// [`MAX_WARM_POOL`]. An unparsable value turns the pool off (with a warning) rather than
/// guessing.
pub fn size_from_env() -> usize {
    size_from_env_or(DEFAULT_WARM_POOL)
}

/// The pool size from [`WARM_POOL_ENV`], else `default`; capped at [`MAX_WARM_POOL`].
pub fn size_from_env_or(default: usize) -> usize {
    match std::env::var(WARM_POOL_ENV) {
        Err(_) => default,
        Ok(v) => match v.trim().parse::<usize>() {
            Ok(n) => n.min(MAX_WARM_POOL),
            Err(_) => {
                tracing::warn!("{WARM_POOL_ENV}={v:?} is not a number: warm pool off");
                0
            }
        },
    }
}

/// Whether a sandbox with `options` can be a claimed member: only what a claim replaces
/// (name, envs, labels, user, lease, what happens at its end, annotations) may differ from
/// the default shape the members were made with.
pub fn serves(options: &CreateOptions, mapping: UidMapping) -> bool {
    let default_shape = sandcove_core::capability::is_host_base(options.template.as_deref())
        && options.resources == sandcove_core::Resources::default()
        && options.network == sandcove_core::NetworkPolicy::default()
        && options.home.is_none()
        && options.hostname.is_none()
        && options.snapshot.is_none()
        && options.volumes.is_empty();
    // Under a uid range, a sandbox whose default user is root has no uid-1000 user: another
    // user table and home owner than a member's.
    let same_users = match mapping {
        UidMapping::Range => options.user.as_deref() != Some("root"),
        UidMapping::Single { .. } => true,
    };
    default_shape && same_users
}

/// A ready member.
#[derive(Debug, Clone)]
struct Member {
    id: String,
    /// Its lease end, ms since the epoch.
    ends_at: u64,
}

#[derive(Debug, Default)]
struct State {
    ready: VecDeque<Member>,
    /// Every member made and not yet handed out or destroyed (ready, or in a claim).
    members: HashSet<String>,
    task: Option<tokio::task::JoinHandle<()>>,
    closed: bool,
    claims: u64,
    /// When the first claim not yet replaced took its member (see [`refill_wait`]). A
    /// monotonic clock: a wall clock set back would hold the refill off until it caught up.
    short_since: Option<Instant>,
}

/// What the engine's clones and the pool's task share.
#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    wake: tokio::sync::Notify,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One engine's pool. Dropping it (with the engine's last clone) has its task destroy the
/// ready members and stop.
#[derive(Debug)]
pub struct Pool {
    size: usize,
    shared: Arc<Shared>,
}

impl Pool {
    /// A pool keeping `size` members (none: off).
    pub fn new(size: usize) -> Self {
        Pool {
            size: size.min(MAX_WARM_POOL),
            shared: Arc::default(),
        }
    }

    /// Members ready to be claimed now.
    pub fn ready(&self) -> usize {
        self.shared.lock().ready.len()
    }

    /// Sandboxes handed out by this pool so far.
    pub fn claims(&self) -> u64 {
        self.shared.lock().claims
    }

    /// Take a ready member with enough lease left, and have the task make its replacement.
    /// Starts the task (on the current runtime) when it is not running.
    pub(super) fn take(&self, engine: &LocalBackend) -> Option<String> {
        if self.size == 0 {
            return None;
        }
        let member = {
            let mut state = self.shared.lock();
            let running = state.task.as_ref().is_some_and(|t| !t.is_finished());
            if !running && !state.closed {
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    let worker = engine.without_pool();
                    let shared = self.shared.clone();
                    state.task = Some(runtime.spawn(fill(shared, worker, self.size)));
                }
            }
            let fresh_until = now_millis() + RETIRE_MARGIN.as_millis() as u64 / 2;
            let at = state.ready.iter().position(|m| m.ends_at > fresh_until);
            let member = at.and_then(|i| state.ready.remove(i));
            if member.is_some() {
                state.short_since.get_or_insert_with(Instant::now);
            }
            member
        };
        self.shared.wake.notify_one();
        member.map(|m| m.id)
    }

    /// Put back a member taken but not changed (the claimer's name was taken elsewhere).
    pub(super) fn put_back(&self, id: String) {
        // Its lease end is unknown here; the task retires it first (as if it were expiring)
        // unless a claim takes it sooner.
        let ends_at = now_millis() + RETIRE_MARGIN.as_millis() as u64;
        self.shared.lock().ready.push_front(Member { id, ends_at });
        self.shared.wake.notify_one();
    }

    /// Count a member handed out.
    pub(super) fn claimed(&self) {
        self.shared.lock().claims += 1;
    }

    /// Whether `id` is a member not handed out yet, named outside the pool's own work: such
    /// an id is answered as unknown.
    pub(super) fn hides(&self, id: &str) -> bool {
        POOL_WORK.try_with(|_| ()).is_err() && self.shared.lock().members.contains(id)
    }

    /// Member `id` is no longer hidden: handed out by a claim, or destroyed.
    pub(super) fn release(&self, id: &str) {
        self.shared.lock().members.remove(id);
    }
}

tokio::task_local! {
    /// Set while the pool itself works on a member (a claim), which may name it.
    static POOL_WORK: ();
}

/// Run `work` as the pool's own work on a member (see [`Pool::hides`]).
pub(super) async fn as_pool_work<F: Future>(work: F) -> F::Output {
    POOL_WORK.scope((), work).await
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.wake.notify_one();
    }
}

/// Keep `size` members ready until the pool is closed, then destroy them.
async fn fill(shared: Arc<Shared>, engine: LocalBackend, size: usize) {
    let mut backoff = Duration::from_millis(250);
    loop {
        let (closed, expiring) = {
            let mut state = shared.lock();
            if state.closed {
                (true, state.ready.drain(..).collect::<Vec<_>>())
            } else {
                let retire_at = now_millis() + RETIRE_MARGIN.as_millis() as u64;
                let (old, keep): (Vec<Member>, Vec<Member>) =
                    state.ready.drain(..).partition(|m| m.ends_at <= retire_at);
                state.ready = keep.into();
                (false, old)
            }
        };
        for member in expiring {
            let _ = engine.destroy_member(&member.id).await;
            shared.lock().members.remove(&member.id);
        }
        if closed {
            return;
        }
        let (missing, defer) = {
            let mut state = shared.lock();
            let missing = size.saturating_sub(state.ready.len());
            let defer = refill_wait(
                state.short_since,
                Instant::now(),
                state.ready.len(),
                missing,
            );
            if defer.is_none() {
                state.short_since = None;
            }
            (missing, defer)
        };
        if let Some(wait) = defer {
            tokio::select! {
                _ = shared.wake.notified() => {}
                _ = tokio::time::sleep(wait) => {}
            }
            continue;
        }
        let mut failed = false;
        for _ in 0..missing {
            match engine.create_member(MEMBER_LEASE).await {
                Ok((id, ends_at)) => {
                    let kept = {
                        let mut state = shared.lock();
                        if !state.closed {
                            state.members.insert(id.clone());
                            state.ready.push_back(Member {
                                id: id.clone(),
                                ends_at,
                            });
                        }
                        !state.closed
                    };
                    if !kept {
                        let _ = engine.destroy_member(&id).await;
                        return;
                    }
                    backoff = Duration::from_millis(250);
                }
                Err(e) => {
                    tracing::warn!("warm pool: cannot make a sandbox ({e}); creates go cold");
                    failed = true;
                    break;
                }
            }
        }
        let wait = if failed {
            let wait = backoff;
            backoff = (backoff * 2).min(MAX_BACKOFF);
            wait
        } else {
            // Until the first member is due for retirement, or a claim wakes us.
            let due = shared
                .lock()
                .ready
                .iter()
                .map(|m| m.ends_at)
                .min()
                .map(|ends| ends.saturating_sub(RETIRE_MARGIN.as_millis() as u64));
            match due {
                Some(due) => Duration::from_millis(due.saturating_sub(now_millis())),
                None => MEMBER_LEASE,
            }
        };
        tokio::select! {
            _ = shared.wake.notified() => {}
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// How long the task waits before making `missing` members, the first claim not yet
/// replaced having been at `short_since`, `ready` members left. `None`: make them now.
///
/// A claimed sandbox's first calls go first: a replacement is a cold create (namespaces,
/// mounts, a monitor fork) and on a small host it competes with them for the CPU. The wait
/// runs from the first unreplaced claim, so later claims never push it back, and a claim
/// that empties the pool ends it: the next create would otherwise go cold.
fn refill_wait(
    short_since: Option<Instant>,
    now: Instant,
    ready: usize,
    missing: usize,
) -> Option<Duration> {
    let left = (short_since? + REFILL_QUIET).checked_duration_since(now)?;
    (missing > 0 && ready > 0 && !left.is_zero()).then_some(left)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refill_waits_out_the_quiet_period_unless_the_pool_is_empty() {
        let claim = Instant::now();
        let ms = Duration::from_millis;
        // Filling (no claim yet): at once.
        assert_eq!(refill_wait(None, claim, 0, 2), None);
        // One claimed of two: after the quiet period from the claim.
        assert_eq!(
            refill_wait(Some(claim), claim + ms(5), 1, 1),
            Some(REFILL_QUIET - ms(5))
        );
        // The quiet period over: now.
        assert_eq!(refill_wait(Some(claim), claim + REFILL_QUIET, 1, 1), None);
        assert_eq!(refill_wait(Some(claim), claim + ms(1_000), 1, 1), None);
        // Emptied: at once, whatever the time.
        assert_eq!(refill_wait(Some(claim), claim, 0, 2), None);
        // Nothing missing: nothing to wait for.
        assert_eq!(refill_wait(Some(claim), claim, 2, 0), None);
    }

    #[test]
    fn only_the_default_shape_is_served() {
        let range = UidMapping::Range;
        let single = UidMapping::Single {
            host_uid: 1000,
            host_gid: 1000,
        };
        let plain = CreateOptions::default()
            .timeout(Duration::from_secs(5))
            .env("A", "1")
            .label("k", "v")
            .name("n");
        assert!(serves(&plain, range));
        let mut user = plain.clone();
        user.user = Some("alice".into());
        assert!(serves(&user, range) && serves(&user, single));
        user.user = Some("root".into());
        assert!(
            !serves(&user, range),
            "root as default user is another table"
        );
        assert!(serves(&user, single));
        let mut o = plain.clone();
        o.network = sandcove_core::NetworkPolicy::Host;
        assert!(!serves(&o, range));
        let mut o = plain.clone();
        o.hostname = Some("h".into());
        assert!(!serves(&o, range));
        let mut o = plain.clone();
        o.home = Some("/home/x".into());
        assert!(!serves(&o, range));
        let mut o = plain.clone();
        o.snapshot = Some("snap-x".into());
        assert!(!serves(&o, range));
        let mut o = plain.clone();
        o.resources.memory_mib = Some(512);
        assert!(!serves(&o, range));
        let mut o = plain;
        o.template = Some("python".into());
        assert!(!serves(&o, range));
    }
}
