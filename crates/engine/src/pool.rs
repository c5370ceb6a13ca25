//! The warm pool: sandboxes made in the background in the shapes recent creates asked for,
//! so that `create` mostly claims one instead of building namespaces and a root while the
//! caller waits.
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
//! and users; when the users differ, `/etc/passwd` and `/etc/group` rewritten and the home
//! directories made and owned as a cold create's setup makes them; refused if anything ever
//! ran in the member), then the monitor takes it (options, users, creation time and lease
//! start now, and the sandbox appears in `list`).
//!
//! **Shapes.** What a claim cannot change is fixed when a member is made, its [`Shape`]: its
//! network, a loopback-only namespace (the default policy) or the Internet policy's, where
//! the monitor started `pasta` and the agent installed the blocks (host, link-local, private
//! and special-purpose ranges, the host's subnets) before the member reported ready, so
//! before any claim can hand it out. The host's subnets and resolvers are those of when the
//! member was made; a claim reads them again and hands out only a member made with the same
//! (others are retired), so a warm sandbox blocks exactly what a cold one made then would.
//! Both the monitor and the agent refuse a claim whose network is not the member's.
//! Everything else the served creates carry is applied at claim: name, envs, labels, default
//! user and home, lease, what happens at its end, annotations; with the network, that is
//! what the Daytona and E2B listeners' default creates carry (internet, their user and
//! home), so those are served warm. A sandbox with resources, a network policy
//! other than those two (the host's), volumes, a snapshot or a hostname, or, on the host base
//! under a uid range, root as its default user (another user table: the member's uid-1000
//! user would go), is always created cold.
//!
//! **Images.** A create naming an image is served by a member of that image: its shape also
//! holds the image's reference, the digest the reference named when the create came (a
//! member of an image since pulled again under that name is never handed out: it is
//! retired as no longer wanted), and the create's user and home. Those two are part of an
//! image member's shape because its user table lives in the image's own `/etc/passwd`, which
//! the agent merged at setup and a claim does not rewrite (the agent refuses a claim that
//! would, and the create goes cold). An image member holds its image as any sandbox does, so
//! a prune leaves it; its env, working directory and user are the image's, as a cold
//! create's are.
//!
//! **Which shapes are kept warm.** The pool remembers the shapes of the last `size` creates
//! it could serve (whether a member served them or not) and keeps one member per remembered
//! create; until `size` creates were seen, the newest one's shape stands for the rest. So a
//! pool of two holds two Internet members after two E2B or Daytona creates, and one of each
//! shape after one native create and one vendor create. A member of a shape no longer
//! wanted is destroyed before its replacement is made: the pool never holds more than
//! `size` members whatever their shapes (an Internet member holds a member's memory plus its
//! `pasta` process's, about 30 MB resident, as any Internet sandbox does: an operator sizing
//! the pool counts with it), members of a shape nobody asks for do not pile up, and the pool
//! follows a change of workload within `size` creates. The first create of a shape the pool
//! does not hold goes cold.
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
use super::net::Plan;
use super::LocalBackend;
use sandcove_core::{now_millis, CreateOptions, NetworkPolicy};

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

/// What a member is made with and a claim cannot change (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Shape {
    /// Its network.
    pub(crate) net: Net,
    /// Its image, for an image member; `None`: the host base.
    pub(crate) image: Option<Arc<ImageShape>>,
}

/// A member's network: what a claim can never change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Net {
    /// A network namespace of its own with loopback only ([`NetworkPolicy::None`]).
    Loopback,
    /// [`NetworkPolicy::Internet`]: `pasta` running, the agent's blocks in force.
    Internet,
}

/// What an image member is made with beyond its network (see the module docs, "Images").
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct ImageShape {
    /// The reference the create named (its template), which members are made with.
    pub(crate) reference: String,
    /// The image's digest that reference named when the create came.
    pub(crate) digest: String,
    /// The sandbox's default user: the create's, else the one the image's `User` names,
    /// else the engine's (as a cold create decides it).
    pub(crate) user: String,
    /// The create's home.
    pub(crate) home: Option<String>,
}

impl Shape {
    /// A host-base member with loopback only.
    #[cfg(test)]
    pub(crate) const LOOPBACK: Shape = Shape {
        net: Net::Loopback,
        image: None,
    };
    /// A host-base member with the Internet policy.
    #[cfg(test)]
    pub(crate) const INTERNET: Shape = Shape {
        net: Net::Internet,
        image: None,
    };

    /// Whether members of this shape run `pasta` and the agent's blocks.
    pub(crate) fn internet(&self) -> bool {
        self.net == Net::Internet
    }

    /// The options a member of this shape is made with (lease `lease`).
    pub(crate) fn member_options(&self, lease: Duration) -> CreateOptions {
        let mut options = CreateOptions::default().timeout(lease);
        options.network = match self.net {
            Net::Loopback => NetworkPolicy::None,
            Net::Internet => NetworkPolicy::Internet,
        };
        if let Some(image) = &self.image {
            options.template = Some(image.reference.clone());
            options.user = Some(image.user.clone());
            options.home = image.home.clone();
        }
        options
    }
}

/// The shape of member that can serve a create with `options`, if any: only what a claim
/// replaces (name, envs, labels, user and home, lease, what happens at its end,
/// annotations) may differ from what members are made with. `internet`: whether this engine
/// gives Internet sandboxes (without it, such a create fails cold). `image`: for a create
/// naming an image, the image its reference names in the engine's store now (`None` there:
/// the create goes cold, and says why).
pub(crate) fn shape_of(
    options: &CreateOptions,
    mapping: UidMapping,
    internet: bool,
    image: Option<&crate::images::ImageRoot>,
) -> Option<Shape> {
    let fixed = options.resources == sandcove_core::Resources::default()
        && options.hostname.is_none()
        && options.snapshot.is_none()
        && options.volumes.is_empty();
    if !fixed {
        return None;
    }
    let image = if sandcove_core::capability::is_host_base(options.template.as_deref()) {
        // Under a uid range, a sandbox whose default user is root has no uid-1000 user:
        // another user table than a member's.
        if mapping == UidMapping::Range && options.user.as_deref() == Some("root") {
            return None;
        }
        None
    } else {
        let image = image?;
        // An image `User` a create cannot use is the cold create's error to give.
        let user = match &options.user {
            Some(user) => user.clone(),
            None => image
                .default_user()
                .ok()?
                .unwrap_or_else(|| crate::config::DEFAULT_USER_NAME.into()),
        };
        Some(Arc::new(ImageShape {
            reference: options.template.clone()?,
            digest: image.digest.clone(),
            user,
            home: options.home.clone(),
        }))
    };
    let net = match options.network {
        NetworkPolicy::None => Net::Loopback,
        NetworkPolicy::Internet if internet => Net::Internet,
        NetworkPolicy::Internet | NetworkPolicy::Host => return None,
    };
    Some(Shape { net, image })
}

/// A ready member.
#[derive(Debug, Clone)]
struct Member {
    id: String,
    /// Its lease end, ms since the epoch.
    ends_at: u64,
    shape: Shape,
    /// Internet: the blocks the host's tables gave when it was made (see [`pick`]).
    plan: Option<Plan>,
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
    /// The shapes of the last creates the pool could serve, newest last (as many as the
    /// pool's size): what it keeps warm (see [`wanted`]).
    recent: VecDeque<Shape>,
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

    /// Members of `shape` ready to be claimed now.
    pub(super) fn ready_of(&self, shape: &Shape) -> usize {
        let state = self.shared.lock();
        state.ready.iter().filter(|m| m.shape == *shape).count()
    }

    /// Sandboxes handed out by this pool so far.
    pub fn claims(&self) -> u64 {
        self.shared.lock().claims
    }

    /// Take a ready member of `shape` with enough lease left, and have the task make its
    /// replacement; the create asking for it counts among the recent ones either way. Starts
    /// the task (on the current runtime) when it is not running.
    pub(super) fn take(&self, engine: &LocalBackend, shape: &Shape) -> Option<String> {
        if self.size == 0 {
            return None;
        }
        // What a cold create's monitor would block now (a few small reads of /proc and
        // /etc): an Internet member is handed out only with exactly these blocks.
        let host_plan = shape.internet().then(Plan::for_host);
        let member = {
            let mut state = self.shared.lock();
            state.recent.push_back(shape.clone());
            while state.recent.len() > self.size {
                state.recent.pop_front();
            }
            let running = state.task.as_ref().is_some_and(|t| !t.is_finished());
            if !running && !state.closed {
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    let worker = engine.without_pool();
                    let shared = self.shared.clone();
                    state.task = Some(runtime.spawn(fill(shared, worker, self.size)));
                }
            }
            let fresh_until = now_millis() + RETIRE_MARGIN.as_millis() as u64 / 2;
            let at = pick(&mut state.ready, shape, host_plan.as_ref(), fresh_until);
            let member = at.and_then(|i| state.ready.remove(i));
            if member.is_some() {
                state.short_since.get_or_insert_with(Instant::now);
            }
            member
        };
        self.shared.wake.notify_one();
        member.map(|m| m.id)
    }

    /// Put back a member of `shape` taken but not changed (the claimer's name was taken
    /// elsewhere).
    pub(super) fn put_back(&self, id: String, shape: Shape) {
        // Its blocks were those of the host's tables a moment ago (see [`Pool::take`]).
        let plan = shape.internet().then(Plan::for_host);
        // Its lease end is unknown here; the task retires it first (as if it were expiring)
        // unless a claim takes it sooner.
        let ends_at = now_millis() + RETIRE_MARGIN.as_millis() as u64;
        self.shared.lock().ready.push_front(Member {
            id,
            ends_at,
            shape,
            plan,
        });
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

/// Keep `size` members of the [`wanted`] shapes ready until the pool is closed, then destroy
/// them.
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
        let (make, surplus, defer) = {
            let mut state = shared.lock();
            let wanted = wanted(&state.recent, size);
            let (make, surplus) = plan(&state.ready, &wanted);
            let defer = refill_wait(
                state.short_since,
                Instant::now(),
                state.ready.len() - surplus.len(),
                make.len(),
            );
            let mut retired = Vec::new();
            if defer.is_none() {
                state.short_since = None;
                // Highest index first, so the lower ones still point at their members.
                for i in surplus.into_iter().rev() {
                    retired.extend(state.ready.remove(i));
                }
            }
            (make, retired, defer)
        };
        if let Some(wait) = defer {
            tokio::select! {
                _ = shared.wake.notified() => {}
                _ = tokio::time::sleep(wait) => {}
            }
            continue;
        }
        // Members of a shape no longer wanted go first: the pool never holds more than
        // `size`.
        for member in surplus {
            let _ = engine.destroy_member(&member.id).await;
            shared.lock().members.remove(&member.id);
        }
        let mut failed = false;
        for shape in make {
            // The host's tables before and after: the member's monitor read them in between,
            // so when both agree they are what its blocks were made from.
            let plan_before = shape.internet().then(Plan::for_host);
            let made = engine.create_member(&shape, MEMBER_LEASE).await;
            let plan = shape.internet().then(Plan::for_host);
            match made {
                Ok((id, _)) if plan != plan_before => {
                    // The host's routes or resolvers changed meanwhile: not knowing which
                    // its blocks follow, it is not kept (the next pass makes another).
                    let _ = engine.destroy_member(&id).await;
                }
                Ok((id, ends_at)) => {
                    let kept = {
                        let mut state = shared.lock();
                        if !state.closed {
                            state.members.insert(id.clone());
                            state.ready.push_back(Member {
                                id: id.clone(),
                                ends_at,
                                shape,
                                plan,
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

/// The position in `ready` of a member of `shape` that can serve a create now: at least
/// `fresh_until` (ms) as its lease end and, for an Internet member, made with `host_plan`,
/// the blocks the host's tables give now (a cold create reads them as it starts; a member
/// made before the host's routes or resolvers changed would block other subnets). A member
/// of the shape made with other blocks is marked for retirement (its lease end set past),
/// which the task carries out on its next pass.
fn pick(
    ready: &mut VecDeque<Member>,
    shape: &Shape,
    host_plan: Option<&Plan>,
    fresh_until: u64,
) -> Option<usize> {
    for member in ready.iter_mut() {
        if member.shape == *shape && member.plan.as_ref() != host_plan {
            member.ends_at = 0;
        }
    }
    ready
        .iter()
        .position(|m| m.shape == *shape && m.ends_at > fresh_until)
}

/// The shapes of the members the pool keeps, one per remembered create (`recent`, newest
/// last), the newest shape standing for creates not seen yet; none before any create.
fn wanted(recent: &VecDeque<Shape>, size: usize) -> Vec<Shape> {
    let Some(newest) = recent.back() else {
        return Vec::new();
    };
    recent
        .iter()
        .chain(std::iter::repeat(newest))
        .take(size)
        .cloned()
        .collect()
}

/// What brings the `ready` members to the `wanted` shapes: the shapes to make, and the
/// positions in `ready` of the members to retire (in increasing order; of each shape in
/// surplus, those nearest their lease end).
fn plan(ready: &VecDeque<Member>, wanted: &[Shape]) -> (Vec<Shape>, Vec<usize>) {
    let mut make = Vec::new();
    let mut retire = Vec::new();
    // Every shape wanted or held, once each, in the order first seen.
    let mut shapes: Vec<&Shape> = Vec::new();
    for shape in wanted.iter().chain(ready.iter().map(|m| &m.shape)) {
        if !shapes.contains(&shape) {
            shapes.push(shape);
        }
    }
    for shape in shapes {
        let want = wanted.iter().filter(|s| *s == shape).count();
        let mut have: Vec<usize> = (0..ready.len())
            .filter(|&i| ready[i].shape == *shape)
            .collect();
        have.sort_by_key(|&i| ready[i].ends_at);
        retire.extend(have.iter().take(have.len().saturating_sub(want)));
        make.extend(std::iter::repeat_n(
            shape.clone(),
            want.saturating_sub(have.len()),
        ));
    }
    retire.sort_unstable();
    (make, retire)
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
    fn only_shapes_a_claim_can_finish_are_served() {
        let range = UidMapping::Range;
        let single = UidMapping::Single {
            host_uid: 1000,
            host_gid: 1000,
        };
        let serves = |o: &CreateOptions, mapping| shape_of(o, mapping, true, None);
        let plain = CreateOptions::default()
            .timeout(Duration::from_secs(5))
            .env("A", "1")
            .label("k", "v")
            .name("n");
        assert_eq!(serves(&plain, range), Some(Shape::LOOPBACK));
        let mut user = plain.clone();
        user.user = Some("alice".into());
        assert!(serves(&user, range).is_some() && serves(&user, single).is_some());
        user.user = Some("root".into());
        assert_eq!(
            serves(&user, range),
            None,
            "root as default user is another table"
        );
        assert!(serves(&user, single).is_some());
        // What the Daytona and E2B listeners' default creates carry: internet, a user and
        // a home of their own.
        let mut vendor = plain.clone().user("daytona").home("/home/daytona");
        vendor.network = NetworkPolicy::Internet;
        assert_eq!(serves(&vendor, range), Some(Shape::INTERNET));
        assert_eq!(serves(&vendor, single), Some(Shape::INTERNET));
        assert_eq!(
            shape_of(&vendor, range, false, None),
            None,
            "no internet here: the create fails cold"
        );
        let mut o = plain.clone();
        o.home = Some("/home/x".into());
        assert_eq!(serves(&o, range), Some(Shape::LOOPBACK));
        let mut o = plain.clone();
        o.network = NetworkPolicy::Host;
        assert_eq!(serves(&o, range), None);
        let mut o = plain.clone();
        o.hostname = Some("h".into());
        assert_eq!(serves(&o, range), None);
        let mut o = plain.clone();
        o.snapshot = Some("snap-x".into());
        assert_eq!(serves(&o, range), None);
        let mut o = plain.clone();
        o.resources.memory_mib = Some(512);
        assert_eq!(serves(&o, range), None);
        let mut o = plain;
        o.template = Some("python".into());
        assert_eq!(
            serves(&o, range),
            None,
            "an image not in the store goes cold"
        );
    }

    #[test]
    fn an_image_create_is_served_by_a_member_of_that_image_digest_and_users() {
        let range = UidMapping::Range;
        let image = |digest: &str, user: Option<&str>| crate::images::ImageRoot {
            reference: "python:3.12".into(),
            digest: digest.into(),
            layers: Vec::new(),
            env: Vec::new(),
            working_dir: None,
            user: user.map(str::to_string),
            entrypoint: Vec::new(),
            cmd: Vec::new(),
        };
        let (aa, bb, old) = (
            image("sha256:aa", None),
            image("sha256:bb", None),
            image("sha256:old", None),
        );
        let mut options = CreateOptions::default().name("n").env("A", "1");
        options.template = Some("python:3.12".into());
        let shape = shape_of(&options, range, true, Some(&aa)).expect("served");
        assert_eq!(shape.net, Net::Loopback);
        let held = shape.image.as_deref().expect("an image member");
        assert_eq!(
            (held.reference.as_str(), held.digest.as_str()),
            ("python:3.12", "sha256:aa")
        );
        // The members it makes run that image with the create's user and home.
        let made = shape.member_options(MEMBER_LEASE);
        assert_eq!(made.template.as_deref(), Some("python:3.12"));
        assert_eq!((made.user.as_deref(), made.home), (Some("user"), None));
        // The image's `User` decides a default user the create leaves unnamed, as cold.
        let rooted_image = image("sha256:aa", Some("0:0"));
        let by_image = shape_of(&options, range, true, Some(&rooted_image)).expect("served");
        assert_eq!(
            by_image.image.as_deref().map(|i| i.user.as_str()),
            Some("root")
        );
        let bad = image("sha256:aa", Some("no such user!"));
        assert_eq!(
            shape_of(&options, range, true, Some(&bad)),
            None,
            "the cold create refuses it"
        );
        // Another digest under the same name, another user or home: another shape.
        assert_ne!(
            shape_of(&options, range, true, Some(&bb)),
            Some(shape.clone())
        );
        let mut rooted = options.clone();
        rooted.user = Some("root".into());
        let rooted = shape_of(&rooted, range, true, Some(&aa)).expect("served");
        assert_ne!(
            rooted, shape,
            "root in the image's own table: its own members"
        );
        assert_eq!(
            rooted.member_options(MEMBER_LEASE).user.as_deref(),
            Some("root")
        );
        let mut homed = options.clone();
        homed.home = Some("/home/x".into());
        assert_ne!(
            shape_of(&homed, range, true, Some(&aa)),
            Some(shape.clone())
        );
        // What a claim takes over (envs, name, labels, lease) does not matter.
        let mut other = options.clone().name("m").env("B", "2");
        other.timeout = Some(Duration::from_secs(9));
        assert_eq!(
            shape_of(&other, range, true, Some(&aa)),
            Some(shape.clone())
        );
        // The pool keeps image members next to host-base ones and retires those of a digest
        // no longer named.
        let member = |id: &str, ends_at, shape: &Shape| Member {
            id: id.into(),
            ends_at,
            shape: shape.clone(),
            plan: None,
        };
        let stale = shape_of(&options, range, true, Some(&old)).expect("served");
        let ready: VecDeque<Member> =
            [member("a", 5, &Shape::LOOPBACK), member("b", 6, &stale)].into();
        assert_eq!(
            plan(&ready, &[shape.clone(), Shape::LOOPBACK]),
            (vec![shape], vec![1])
        );
    }

    #[test]
    fn the_pool_keeps_the_shapes_of_recent_creates() {
        const INTERNET: Shape = Shape::INTERNET;
        const LOOPBACK: Shape = Shape::LOOPBACK;
        let recent = |shapes: &[Shape]| shapes.iter().cloned().collect::<VecDeque<_>>();
        assert_eq!(wanted(&recent(&[]), 2), vec![]);
        assert_eq!(wanted(&recent(&[INTERNET]), 2), vec![INTERNET, INTERNET]);
        assert_eq!(
            wanted(&recent(&[LOOPBACK, INTERNET]), 2),
            vec![LOOPBACK, INTERNET]
        );
        assert_eq!(wanted(&recent(&[INTERNET, INTERNET]), 3), vec![INTERNET; 3]);

        let member = |id: &str, ends_at, shape| Member {
            id: id.into(),
            ends_at,
            shape,
            plan: None,
        };
        // Full and as wanted: nothing to do.
        let ready: VecDeque<Member> = [member("a", 5, LOOPBACK), member("b", 6, INTERNET)].into();
        assert_eq!(plan(&ready, &[INTERNET, LOOPBACK]), (vec![], vec![]));
        // One claimed: its shape is made again.
        let ready: VecDeque<Member> = [member("b", 6, INTERNET)].into();
        assert_eq!(
            plan(&ready, &[INTERNET, LOOPBACK]),
            (vec![LOOPBACK], vec![])
        );
        // The workload moved to internet: the loopback members nearest their end go first,
        // and as many internet ones are made, never more than the pool's size in all.
        let ready: VecDeque<Member> = [
            member("a", 9, LOOPBACK),
            member("b", 6, INTERNET),
            member("c", 5, LOOPBACK),
        ]
        .into();
        assert_eq!(
            plan(&ready, &[INTERNET, INTERNET, LOOPBACK]),
            (vec![INTERNET], vec![2])
        );
        assert_eq!(
            plan(&ready, &[INTERNET; 3]),
            (vec![INTERNET, INTERNET], vec![0, 2])
        );
    }

    #[test]
    fn an_internet_member_is_handed_out_only_with_the_blocks_of_the_host_now() {
        use std::net::{IpAddr, Ipv4Addr};
        let subnet = |third| (IpAddr::V4(Ipv4Addr::new(203, 0, third, 0)), 24);
        let (then, now) = (Plan::new(&[subnet(1)], &[]), Plan::new(&[subnet(2)], &[]));
        let member = |id: &str, shape, plan: Option<&Plan>| Member {
            id: id.into(),
            ends_at: 100,
            shape,
            plan: plan.cloned(),
        };
        let mut ready: VecDeque<Member> = [
            member("old", Shape::INTERNET, Some(&then)),
            member("loop", Shape::LOOPBACK, None),
            member("new", Shape::INTERNET, Some(&now)),
        ]
        .into();
        assert_eq!(pick(&mut ready, &Shape::INTERNET, Some(&now), 50), Some(2));
        assert_eq!(ready[0].ends_at, 0, "the stale one is retired");
        assert_eq!(ready[2].ends_at, 100);
        assert_eq!(pick(&mut ready, &Shape::LOOPBACK, None, 50), Some(1));
        assert_eq!(pick(&mut ready, &Shape::INTERNET, Some(&then), 50), None);
        assert_eq!(ready[2].ends_at, 0);
    }
}
