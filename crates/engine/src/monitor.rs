//! The monitor: one detached host-side process per sandbox.
//!
//! It owns the agent (its child), enforces the lease, holds the preview listeners, and serves
//! clients on a unix socket in the sandbox's state directory. Lifecycle requests it answers
//! itself; everything else it hands to the agent together with the client's connection, so
//! bytes never pass through it. It holds the sandbox's lock file for its whole life: a state
//! directory whose lock is free belongs to a dead monitor and is collected by the next client.

use std::collections::HashMap;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::net::{TcpStream, UnixListener, UnixStream};
use tokio::sync::oneshot;

use super::config::{Record, SandboxDir};
use super::preview::{self, PreviewSet};
use super::proto::{self, Control, MonitorReply, MonitorRequest};
use super::{agent, net, sys, volumes};
use sandcove_agent::client::{AgentDialer, AgentIo, RemoteAgent};
use sandcove_agent::file_url::FileUrlListener;
use sandcove_core::file_url::{self, FileAccess, FileUrlKey};
use sandcove_core::{
    now_millis, Error, Preview, PreviewOptions, Result, SandboxInfo, SandboxState, TimeoutAction,
    DEFAULT_TIMEOUT,
};

/// How long a sandbox paused at the end of its lease, or stopped, is kept before it is
/// destroyed.
pub const PAUSED_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);

/// Largest first frame a client may send: a monitor request, at most an annotation update
/// of [`sandcove_core::MAX_ANNOTATIONS_BYTES`] with every byte JSON-escaped.
const MAX_FIRST_FRAME: usize = 8 * sandcove_core::MAX_ANNOTATIONS_BYTES;

/// Note naming why the agent died (the sandbox is `Failed`).
const FAILED_NOTE: &str = "failed";
/// Note holding the lease time (ms) a stopped sandbox gets back when started.
const LEASE_LEFT_NOTE: &str = "lease_left_ms";
/// Note marking a sandbox paused because its lease ended.
const PAUSED_BY_LEASE_NOTE: &str = "paused_by_lease";

type Pending =
    Mutex<HashMap<u64, oneshot::Sender<(Option<sandcove_core::ErrorBody>, Vec<OwnedFd>)>>>;

struct Monitor {
    dir: SandboxDir,
    record: Mutex<Record>,
    state: Mutex<SandboxState>,
    agent_pid: libc::pid_t,
    ctrl: Arc<AsyncFd<OwnedFd>>,
    pending: Pending,
    next_req: AtomicU64,
    deadline_changed: tokio::sync::Notify,
    previews: PreviewSet,
    /// The listener serving this sandbox's signed file URLs, bound on the first URL, with
    /// the key they are signed with (random, held in this process only).
    file_urls: tokio::sync::OnceCell<(Arc<FileUrlKey>, FileUrlListener)>,
    /// Serializes pause/resume so concurrent callers see consistent states.
    transition: tokio::sync::Mutex<()>,
    /// The networking helper of an Internet sandbox, kept for the monitor's life (it also
    /// dies with the monitor's main thread).
    _helper: Option<net::Helper>,
}

/// The monitor from its descriptors on: `ready_fd` (the readiness report) and `lock_fd` (the
/// sandbox's lock) are open under these numbers and now owned here. Never returns.
pub(super) fn run_detached(ready_fd: RawFd, lock_fd: RawFd, dir: PathBuf) -> ! {
    // Whatever else the program that created the sandbox had open without close-on-exec
    // reached us (through the spawner's fork): close it before anything can pass
    // it on.
    if sys::close_fds_except(&[ready_fd, lock_fd]).is_err() {
        sys::exit_now(2);
    }
    // SAFETY: the client passed these descriptors to us, open, under these numbers.
    let (ready, lock) = unsafe {
        (
            OwnedFd::from_raw_fd(ready_fd),
            OwnedFd::from_raw_fd(lock_fd),
        )
    };
    // Nothing we start may inherit them.
    let _ = sys::set_cloexec(ready.as_fd());
    let _ = sys::set_cloexec(lock.as_fd());
    sys::set_process_name("sandcove-mon");
    let dir = SandboxDir { dir };
    let mut ready = std::fs::File::from(ready);
    // One write, so the report is one message on the readiness socket.
    let report = |ready: &mut std::fs::File, e: &Error| {
        let line = serde_json::to_string(&e.to_body()).unwrap_or_default();
        let _ = ready.write_all(format!("{line}\n").as_bytes());
    };
    let started = match start(&dir) {
        Ok(s) => s,
        Err(e) => {
            report(&mut ready, &e);
            let _ = std::fs::remove_dir_all(&dir.dir);
            sys::exit_now(1);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(_) => sys::exit_now(1),
    };
    let cgroup = started
        .0
        .cgroup
        .clone()
        .map(|plan| (plan, started.0.id.clone()));
    let code = runtime.block_on(async move {
        let (record, pid, ctrl, helper) = started;
        let monitor = match Monitor::new(dir, record, pid, ctrl, helper) {
            Ok(m) => Arc::new(m),
            Err(e) => {
                report(&mut ready, &e);
                let _ = sys::kill(pid, libc::SIGKILL);
                return 1;
            }
        };
        let listener = match bind(&monitor.dir) {
            Ok(l) => l,
            Err(e) => {
                report(&mut ready, &e);
                monitor.kill_agent();
                let _ = std::fs::remove_dir_all(&monitor.dir.dir);
                return 1;
            }
        };
        monitor.write_info();
        // The creating program gets its first connection to the agent with the report, so
        // its first call does not dial this socket and wait for a hand-over (a warm-pool
        // member's claimer dials anyway: none is made for it).
        let pooled = monitor
            .record
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pooled;
        let first = if pooled {
            None
        } else {
            first_connection(&monitor).await
        };
        let fds: Vec<RawFd> = first.iter().map(|c| c.as_raw_fd()).collect();
        let _ = sys::send_with_fds(ready.as_raw_fd(), b"ok\n", &fds);
        drop(first);
        drop(ready);
        run(monitor, listener).await
    });
    drop(runtime);
    if let Some((plan, id)) = cgroup {
        super::cgroup::remove(&plan.hierarchy, &id);
    }
    drop(lock);
    sys::exit_now(code)
}

/// A started sandbox: its record, the agent's pid, the control socket, and the networking
/// helper of an Internet sandbox.
type Started = (Record, libc::pid_t, OwnedFd, Option<net::Helper>);

/// Clone the agent into fresh namespaces, map its users, wire out its network if asked, and
/// wait for its setup verdict.
fn start(dir: &SandboxDir) -> Result<Started> {
    let text = std::fs::read(dir.record()).map_err(|e| Error::from_io(&e, "sandbox record"))?;
    let record: Record = serde_json::from_slice(&text)
        .map_err(|e| Error::backend(format!("bad sandbox record: {e}")))?;
    let mut record = record;
    // Each bounded volume: a detached mount from its holder, for the agent to attach. The
    // connection keeps the holder serving; it is closed by the kernel when this monitor
    // exits, at the sandbox's end, which is what the holder waits for.
    let mut trees = Vec::new();
    for m in record.mounts.iter().filter(|m| m.bounded) {
        let owner = match record.mapping {
            super::config::UidMapping::Range => {
                let id = super::config::HOST_ID_BASE + super::config::DEFAULT_USER_UID;
                Some((id, id))
            }
            super::config::UidMapping::Single { .. } => None,
        };
        let (connection, tree) = super::volume_holder::attach(
            std::path::Path::new(&m.host_path),
            m.subpath.as_deref(),
            owner,
        )?;
        std::mem::forget(connection);
        trees.push(tree);
    }
    if record.mapping == super::config::UidMapping::Range
        && record.mounts.iter().any(|m| !m.bounded)
    {
        stage_volumes(&mut record)?;
    }
    let (ctrl, agent_ctrl) = sys::seqpacket_pair()?;
    let (sync_read, sync_write) = sys::pipe()?;
    let flags = if record.unisolated {
        0
    } else {
        let mut f = libc::CLONE_NEWUSER
            | libc::CLONE_NEWNS
            | libc::CLONE_NEWPID
            | libc::CLONE_NEWUTS
            | libc::CLONE_NEWIPC;
        // Every policy but an explicit Host gets a network namespace of its own.
        if record.options.network != sandcove_core::NetworkPolicy::Host {
            f |= libc::CLONE_NEWNET;
        }
        f
    };
    // A sandbox at its memory limit loses a sandbox process, never its agent, so it stays
    // controllable (files can be removed, processes killed): sandbox processes start with
    // the highest OOM score (`agent::OomScore`), which needs no privilege, and where the
    // host grants CAP_SYS_RESOURCE the agent also inherits a score that exempts it.
    let spare_agent = record.cgroup.is_some() && sys::set_oom_score_adj(-1000).is_ok();
    // Internet: what the agent blocks, read from the host's tables before the clone.
    let internet = record.options.network == sandcove_core::NetworkPolicy::Internet;
    let plan = match (internet, &record.pasta) {
        (false, _) => None,
        (true, Some(_)) if !record.unisolated => Some(net::Plan::for_host()),
        _ => {
            return Err(net::unavailable(
                "no user-mode networking helper was recorded",
            ))
        }
    };
    // On cgroup v1 the agent moves itself into its cgroup, first thing (see
    // `cgroup::prepare_v1`: a move made by the monitor would wait for a grace period).
    let joins = match &record.cgroup {
        Some(plan) if matches!(plan.hierarchy, super::cgroup::Hierarchy::V1 { .. }) => {
            super::cgroup::prepare_v1(&plan.hierarchy, &record.id, plan.limits)
                .map_err(cgroup_unavailable)?
        }
        _ => Vec::new(),
    };
    let cgroup = record.cgroup.clone().map(|plan| (plan, record.id.clone()));
    let remove_cgroup = || {
        if let Some((plan, id)) = &cgroup {
            super::cgroup::remove(&plan.hierarchy, id);
        }
    };
    let pid = sys::clone_into_namespaces(flags).map_err(|e| {
        remove_cgroup();
        Error::Unavailable {
            reason: format!("cannot create namespaces for the sandbox: {e}"),
            remedy:
                "enable unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, \
                 user.max_user_namespaces > 0, kernel.apparmor_restrict_unprivileged_userns=0), \
                 or set SANDCOVE_ALLOW_UNISOLATED=1 to run without isolation"
                    .into(),
        }
    })?;
    if pid == 0 {
        // The agent keeps its two ends, its cgroup files and stdio (the monitor's log, until
        // setup is done); the monitor's lock, readiness socket and every other descriptor
        // are closed so no sandbox process can ever reach them.
        let mut keep = vec![agent_ctrl.as_raw_fd(), sync_read.as_raw_fd()];
        keep.extend(joins.iter().map(|fd| fd.as_raw_fd()));
        keep.extend(trees.iter().map(|fd| fd.as_raw_fd()));
        if sys::close_fds_except(&keep).is_err() {
            sys::exit_now(1);
        }
        // Already closed: forget them rather than close numbers that may be reused.
        std::mem::forget(ctrl);
        std::mem::forget(sync_write);
        agent::run(record, agent_ctrl, sync_read, joins, trees, plan);
    }
    drop(joins);
    drop(trees);
    if spare_agent {
        let _ = sys::set_oom_score_adj(0);
    }
    drop(agent_ctrl);
    drop(sync_read);
    // Cleanup finishes before the error returns: the agent reaped, its cgroup removed.
    let fail = |e: Error| {
        let _ = sys::kill(pid, libc::SIGKILL);
        let _ = sys::waitpid_blocking(pid);
        remove_cgroup();
        e
    };
    if !record.unisolated {
        let (uid_map, gid_map) = record.mapping.map_lines();
        let write = |file: &str, text: &str| {
            sys::write_proc_file(&format!("/proc/{pid}/{file}"), text).map_err(|e| {
                Error::Unavailable {
                    reason: format!("cannot map the sandbox's users: {e}"),
                    remedy: "the host must allow writing uid/gid maps of a new user namespace"
                        .into(),
                }
            })
        };
        if matches!(record.mapping, super::config::UidMapping::Single { .. }) {
            write("setgroups", "deny").map_err(fail)?;
        }
        write("uid_map", &uid_map).map_err(fail)?;
        write("gid_map", &gid_map).map_err(fail)?;
    }
    // The helper configures the interface and routes before the agent installs its rules
    // (a default route is refused once its gateway is unreachable).
    let helper = match (&plan, &record.pasta) {
        (Some(_), Some(path)) => {
            Some(net::start_helper(std::path::Path::new(path), pid).map_err(fail)?)
        }
        _ => None,
    };
    let mut sync_write = std::fs::File::from(sync_write);
    sync_write.write_all(b"1").map_err(|e| fail(e.into()))?;
    drop(sync_write);
    // On v2, into its cgroup while the agent builds its root, and before it is ready: the
    // agent starts no process during setup, and none before the monitor has its verdict, so
    // all that sandbox code ever runs is held to the limits. (On v1 the agent has joined
    // its cgroup already, or reports that it could not as its setup's failure.)
    let entered = match &record.cgroup {
        Some(plan) if matches!(plan.hierarchy, super::cgroup::Hierarchy::V2(_)) => {
            super::cgroup::enter(&plan.hierarchy, &record.id, plan.limits, pid)
        }
        _ => Ok(()),
    };
    // Wait for the agent's verdict on its setup. A failed setup is reported as such even
    // when the agent's exit made the cgroup move fail too.
    let mut buf = vec![0u8; 64 * 1024];
    let (n, _) = sys::recv_with_fds(ctrl.as_raw_fd(), &mut buf).map_err(|e| fail(e.into()))?;
    let verdict = serde_json::from_slice::<Control>(&buf[..n]);
    if let (Err(e), false) = (entered, matches!(verdict, Ok(Control::SetupFailed { .. }))) {
        return Err(fail(cgroup_unavailable(e)));
    }
    match verdict {
        Ok(Control::Ready) => Ok((record, pid, ctrl, helper)),
        Ok(Control::SetupFailed { error }) => Err(fail(Error::from_body(&error))),
        _ => Err(fail(Error::backend(
            "the sandbox agent exited during setup (see the monitor log)",
        ))),
    }
}

/// A sandbox that cannot be put in its cgroup is not started.
pub(super) fn cgroup_unavailable(e: std::io::Error) -> Error {
    Error::Unavailable {
        reason: format!("cannot put the sandbox in its cgroup: {e}"),
        remedy: "check that the cgroup hierarchy Sandcove uses is writable".into(),
    }
}

/// Where staged volumes appear in the monitor's private mount namespace.
const VOLUME_STAGING: &str = "/mnt";

/// As root, the sandbox's root maps to an unprivileged host uid that may not traverse the
/// state directory (e.g. under `/root`). Bind each volume into a world-traversable staging
/// tmpfs in a private mount namespace of the monitor, which the agent's namespace inherits,
/// and point the mounts there.
fn stage_volumes(record: &mut Record) -> Result<()> {
    let fail = |e: std::io::Error| Error::Unavailable {
        reason: format!("cannot stage the sandbox's volumes: {e}"),
        remedy: "run the host side with mount privileges, or without volumes".into(),
    };
    sys::unshare(libc::CLONE_NEWNS).map_err(fail)?;
    sys::mount(
        None,
        std::path::Path::new("/"),
        None,
        libc::MS_REC | libc::MS_PRIVATE,
        None,
    )
    .map_err(fail)?;
    let staging = std::path::Path::new(VOLUME_STAGING);
    sys::mount(
        Some(std::path::Path::new("tmpfs")),
        staging,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
        // One directory per volume (only the monitor makes entries here).
        Some(&format!(
            "mode=0755,size=64k,nr_inodes={}",
            record.mounts.len() + 16
        )),
    )
    .map_err(fail)?;
    // Bounded volumes come from their holders as detached mounts instead.
    for (i, m) in record.mounts.iter_mut().enumerate() {
        if m.bounded {
            continue;
        }
        let target = staging.join(format!("v{i}"));
        std::fs::create_dir(&target).map_err(fail)?;
        // Resolved in this (new) mount namespace, so the descriptor can be bound here.
        let source = volumes::open_source(
            std::path::Path::new(&m.host_path),
            m.subpath.as_deref(),
            false,
            None,
        )
        .map_err(|e| match &m.subpath {
            Some(sub) => volumes::subpath_error(&m.path, sub, e),
            None => fail(e),
        })?;
        sys::mount(
            Some(&sys::fd_path(source.as_raw_fd())),
            &target,
            None,
            libc::MS_BIND | libc::MS_REC,
            None,
        )
        .map_err(fail)?;
        m.host_path = target.to_string_lossy().into_owned();
        m.subpath = None;
    }
    Ok(())
}

fn bind(dir: &SandboxDir) -> Result<UnixListener> {
    let path = dir.socket();
    let _ = std::fs::remove_file(&path);
    let listener = std::os::unix::net::UnixListener::bind(&path)
        .map_err(|e| Error::from_io(&e, &format!("bind the sandbox socket {}", path.display())))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    listener.set_nonblocking(true)?;
    Ok(UnixListener::from_std(listener)?)
}

impl Monitor {
    fn new(
        dir: SandboxDir,
        record: Record,
        agent_pid: libc::pid_t,
        ctrl: OwnedFd,
        helper: Option<net::Helper>,
    ) -> Result<Self> {
        sys::set_nonblocking(ctrl.as_fd(), true)?;
        Ok(Monitor {
            dir,
            record: Mutex::new(record),
            state: Mutex::new(SandboxState::Running),
            agent_pid,
            ctrl: Arc::new(sys::async_fd(ctrl)?),
            pending: Mutex::new(HashMap::new()),
            next_req: AtomicU64::new(1),
            deadline_changed: tokio::sync::Notify::new(),
            previews: PreviewSet::default(),
            file_urls: tokio::sync::OnceCell::new(),
            transition: tokio::sync::Mutex::new(()),
            _helper: helper,
        })
    }

    fn info(&self) -> SandboxInfo {
        let record = self.record.lock().unwrap_or_else(|e| e.into_inner());
        super::info_of(&record, self.state())
    }

    fn state(&self) -> SandboxState {
        *self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_state(&self, state: SandboxState) {
        *self.state.lock().unwrap_or_else(|e| e.into_inner()) = state;
    }

    fn id(&self) -> String {
        self.record
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .id
            .clone()
    }

    /// Publish the current info for `list` (atomically: write, then rename). An unclaimed
    /// warm-pool member publishes nothing: `list` never shows it.
    fn write_info(&self) {
        if self.record.lock().unwrap_or_else(|e| e.into_inner()).pooled {
            return;
        }
        let info = self.info();
        let tmp = self.dir.dir.join(".info.json.tmp");
        if let Ok(text) = serde_json::to_vec(&info) {
            if std::fs::write(&tmp, text).is_ok() {
                let _ = std::fs::rename(&tmp, self.dir.info());
            }
        }
    }

    fn kill_agent(&self) {
        let unisolated = self
            .record
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .unisolated;
        if unisolated {
            // No PID namespace ends the processes for us: stop the agent (so it adopts no
            // more orphans), then kill its whole tree until nothing is left.
            let _ = sys::kill(self.agent_pid, libc::SIGSTOP);
            for _ in 0..100 {
                let tree = sys::descendants(self.agent_pid, &sys::all_pids());
                if tree.is_empty() {
                    break;
                }
                for pid in tree {
                    let _ = sys::kill(pid, libc::SIGKILL);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        let _ = sys::kill(self.agent_pid, libc::SIGKILL);
        let _ = sys::waitpid_blocking(self.agent_pid);
    }

    fn unisolated(&self) -> bool {
        self.record
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .unisolated
    }

    fn ends_at(&self) -> u64 {
        self.record
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .ends_at
    }

    fn set_ends_at(&self, ends_at: u64) {
        self.record
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .ends_at = ends_at;
        self.deadline_changed.notify_one();
    }

    fn lease(&self) -> Duration {
        self.record
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .options
            .timeout
            .unwrap_or(DEFAULT_TIMEOUT)
    }

    /// Send a control request to the agent and wait for its reply (and descriptors).
    async fn agent_request(&self, make: impl FnOnce(u64) -> Control) -> Result<Vec<OwnedFd>> {
        let req = self.next_req.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(req, tx);
        let bytes = serde_json::to_vec(&make(req)).unwrap_or_default();
        loop {
            let mut guard = self.ctrl.writable().await?;
            match guard.try_io(|c| sys::send_with_fds(c.as_raw_fd(), &bytes, &[])) {
                Ok(Ok(_)) => break,
                Ok(Err(e)) => {
                    self.pending
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(&req);
                    return Err(Error::Backend {
                        message: format!("the sandbox agent is not answering: {e}"),
                        retryable: false,
                    });
                }
                Err(_would_block) => continue,
            }
        }
        let reply = tokio::time::timeout(Duration::from_secs(30), rx).await;
        match reply {
            Ok(Ok((None, fds))) => Ok(fds),
            Ok(Ok((Some(error), _))) => Err(Error::from_body(&error)),
            Ok(Err(_)) => Err(Error::backend("the sandbox agent exited")),
            Err(_) => Err(Error::Timeout {
                what: "waiting for the sandbox agent".into(),
            }),
        }
    }

    async fn pause(&self) -> Result<SandboxInfo> {
        if self.unisolated() {
            return Err(Error::not_supported(
                "pausing an un-isolated sandbox",
                "run on a host with user namespaces",
            ));
        }
        let _guard = self.transition.lock().await;
        match self.state() {
            SandboxState::Paused => return Ok(self.info()),
            SandboxState::Running => {}
            other => return Err(self.invalid_state(other, "pause")),
        }
        self.agent_request(|req| Control::Freeze { req }).await?;
        self.set_state(SandboxState::Paused);
        self.write_info();
        Ok(self.info())
    }

    async fn resume(&self) -> Result<SandboxInfo> {
        let _guard = self.transition.lock().await;
        match self.state() {
            SandboxState::Running => return Ok(self.info()),
            SandboxState::Paused => {}
            other => return Err(self.invalid_state(other, "resume")),
        }
        self.agent_request(|req| Control::Thaw { req }).await?;
        self.set_state(SandboxState::Running);
        let paused_by_lease = self
            .record
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .notes
            .remove(PAUSED_BY_LEASE_NOTE)
            .is_some();
        if paused_by_lease {
            // A fresh lease, as long as the original one.
            self.set_ends_at(now_millis() + self.lease().as_millis() as u64);
        }
        self.write_info();
        Ok(self.info())
    }

    /// Hand this warm-pool member to its claimer (the agent took the claim first): the
    /// claimer's options and users replace the pool's, creation time and lease start now, and
    /// the sandbox becomes visible. A sandbox claimed already (or never pooled), or a claim
    /// with another network than the member's, is refused.
    fn claim(
        &self,
        options: sandcove_core::CreateOptions,
        users: Vec<sandcove_core::UserInfo>,
    ) -> Result<SandboxInfo> {
        {
            let mut record = self.record.lock().unwrap_or_else(|e| e.into_inner());
            if !record.pooled {
                return Err(Error::invalid(
                    "this sandbox is not an unclaimed warm-pool member",
                ));
            }
            // The network was set up for the member's policy (namespace, helper, blocks).
            if options.network != record.options.network {
                return Err(Error::invalid(
                    "a claim cannot change a warm-pool member's network",
                ));
            }
            let now = now_millis();
            let lease = options.timeout.unwrap_or(DEFAULT_TIMEOUT);
            record.options = options;
            record.users = users;
            record.pooled = false;
            record.created_at = now;
            record.ends_at = now + lease.as_millis() as u64;
        }
        self.deadline_changed.notify_one();
        self.write_info();
        Ok(self.info())
    }

    /// Apply an annotation update under the record's lock (so concurrent updates serialize
    /// and a compare-and-set sees the latest value), then publish it.
    fn update_annotations(
        &self,
        update: &sandcove_core::AnnotationUpdate,
    ) -> Result<std::collections::BTreeMap<String, String>> {
        let next = {
            let mut record = self.record.lock().unwrap_or_else(|e| e.into_inner());
            let next = update.apply(&record.options.annotations)?;
            record.options.annotations = next.clone();
            next
        };
        self.write_info();
        Ok(next)
    }

    /// Move the lease end; a stopped sandbox keeps the new time for when it starts.
    async fn set_timeout(&self, ms: u64) {
        let _guard = self.transition.lock().await;
        if self.state() == SandboxState::Stopped {
            self.record
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .notes
                .insert(LEASE_LEFT_NOTE.into(), ms.to_string());
        } else {
            self.set_ends_at(now_millis() + ms);
        }
    }

    /// Kill every process (through the agent, which stays with the namespaces and files),
    /// keep the lease's time left, and hold the sandbox for the retention period.
    async fn stop(&self) -> Result<SandboxInfo> {
        let _guard = self.transition.lock().await;
        match self.state() {
            SandboxState::Stopped => return Ok(self.info()),
            // Frozen processes die of SIGKILL as well.
            SandboxState::Running | SandboxState::Paused => {}
            other => return Err(self.invalid_state(other, "stop")),
        }
        self.agent_request(|req| Control::Stop { req }).await?;
        let now = now_millis();
        {
            let mut record = self.record.lock().unwrap_or_else(|e| e.into_inner());
            // A sandbox paused by its lease gets a fresh lease when it runs again, as on resume.
            let left = if record.notes.remove(PAUSED_BY_LEASE_NOTE).is_some() {
                record
                    .options
                    .timeout
                    .unwrap_or(DEFAULT_TIMEOUT)
                    .as_millis() as u64
            } else {
                record.ends_at.saturating_sub(now)
            };
            record
                .notes
                .insert(LEASE_LEFT_NOTE.into(), left.to_string());
        }
        self.set_state(SandboxState::Stopped);
        self.set_ends_at(now + PAUSED_RETENTION.as_millis() as u64);
        self.write_info();
        Ok(self.info())
    }

    /// Run a stopped sandbox again, with the lease time it had left.
    async fn start(&self) -> Result<SandboxInfo> {
        let _guard = self.transition.lock().await;
        match self.state() {
            SandboxState::Running => return Ok(self.info()),
            SandboxState::Stopped => {}
            SandboxState::Paused => {
                return Err(Error::InvalidState {
                    id: self.id(),
                    state: "paused".into(),
                    message: "a paused sandbox is resumed, not started".into(),
                })
            }
            other => return Err(self.invalid_state(other, "start")),
        }
        let kept = self
            .record
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .notes
            .remove(LEASE_LEFT_NOTE);
        let left = kept
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or_else(|| self.lease().as_millis() as u64);
        self.set_ends_at(now_millis() + left);
        self.set_state(SandboxState::Running);
        self.write_info();
        Ok(self.info())
    }

    fn invalid_state(&self, state: SandboxState, what: &str) -> Error {
        let why = self
            .record
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .notes
            .get(FAILED_NOTE)
            .cloned()
            .unwrap_or_default();
        let why = if state == SandboxState::Stopped {
            "while it is stopped: start it first".to_string()
        } else {
            why
        };
        Error::InvalidState {
            id: self.id(),
            state: format!("{state:?}").to_lowercase(),
            message: format!("cannot {what} {why}").trim().to_string(),
        }
    }

    /// Make sure the sandbox can serve a request: resume it when it is paused and asked to
    /// resume automatically, refuse otherwise.
    async fn ready_for_work(&self) -> Result<()> {
        match self.state() {
            SandboxState::Running => Ok(()),
            SandboxState::Paused => {
                let auto = self
                    .record
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .options
                    .auto_resume;
                if auto {
                    self.resume().await.map(drop)
                } else {
                    Err(Error::InvalidState {
                        id: self.id(),
                        state: "paused".into(),
                        message: "resume it first (or create it with auto_resume)".into(),
                    })
                }
            }
            SandboxState::Stopped => Err(Error::InvalidState {
                id: self.id(),
                state: "stopped".into(),
                message: "its processes ended when it was stopped: start it first".into(),
            }),
            other => {
                Err(self.invalid_state(other, "serve requests: only info and destroy work now;"))
            }
        }
    }

    async fn expose(self: &Arc<Self>, options: PreviewOptions) -> Result<Preview> {
        let limits = self
            .record
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .preview_limits;
        let upstream = Arc::new(MonitorUpstream(self.clone()));
        self.previews.expose(options, limits, upstream).await
    }

    /// A socket connected to `port` inside the sandbox, asked of the agent.
    async fn connect_upstream(
        &self,
        port: u16,
    ) -> std::result::Result<Box<dyn AgentIo>, preview::UpstreamError> {
        use preview::UpstreamError;
        if let Err(e) = self.ready_for_work().await {
            return Err(UpstreamError::Unavailable(e.to_string()));
        }
        let inner = match self
            .agent_request(|req| Control::Connect { req, port })
            .await
        {
            Ok(mut fds) if !fds.is_empty() => fds.remove(0),
            Ok(_) => return Err(UpstreamError::Closed),
            Err(e) => return Err(UpstreamError::BadGateway(e.to_string())),
        };
        let std_stream = std::net::TcpStream::from(inner);
        std_stream
            .set_nonblocking(true)
            .map_err(|_| UpstreamError::Closed)?;
        let stream = TcpStream::from_std(std_stream).map_err(|_| UpstreamError::Closed)?;
        Ok(Box::new(stream))
    }
}

/// How the monitor's previews reach the sandbox: through its agent.
struct MonitorUpstream(Arc<Monitor>);

#[async_trait::async_trait]
impl preview::Upstream for MonitorUpstream {
    async fn connect(
        &self,
        port: u16,
    ) -> std::result::Result<Box<dyn AgentIo>, preview::UpstreamError> {
        self.0.connect_upstream(port).await
    }
}

impl Monitor {
    /// A signed URL for `options` on this sandbox, served by the monitor's file-URL
    /// listener (bound now if this is the first).
    async fn file_url(
        self: &Arc<Self>,
        options: sandcove_core::FileUrlOptions,
    ) -> Result<sandcove_core::FileUrl> {
        options.validate(now_millis())?;
        let (key, listener) = self
            .file_urls
            .get_or_try_init(|| async {
                let key = Arc::new(FileUrlKey::random()?);
                let limits = self
                    .record
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .preview_limits;
                let access = Arc::new(MonitorFiles(Arc::downgrade(self)));
                let listener = FileUrlListener::bind(
                    std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
                    key.clone(),
                    self.id(),
                    access,
                    limits,
                    sandcove_agent::MAX_FILE_BYTES,
                )
                .await?;
                Ok::<_, Error>((key, listener))
            })
            .await?;
        let grant = sandcove_core::FileGrant::new(self.id(), &options);
        Ok(sandcove_core::FileUrl::new(
            listener.url(&key.sign(&grant)),
            &grant,
        ))
    }
}

/// How the monitor's file URLs reach the sandbox's files: the agent's file API, over a
/// connection handed to it as a client's would be (admitted only while the sandbox runs).
struct MonitorFiles(std::sync::Weak<Monitor>);

impl MonitorFiles {
    fn agent(&self) -> Result<RemoteAgent> {
        let monitor = self
            .0
            .upgrade()
            .ok_or_else(|| Error::not_found("the sandbox"))?;
        let id = monitor.id();
        Ok(RemoteAgent::without_token(
            &id,
            Arc::new(HandoffDialer(self.0.clone())),
            Arc::new(sandcove_agent::client::ConnPool::new()),
        )
        .with_pool(None))
    }
}

#[async_trait::async_trait]
impl FileAccess for MonitorFiles {
    async fn read(&self, grant: &sandcove_core::FileGrant) -> Result<sandcove_core::ByteStream> {
        self.agent()?
            .read_file(&grant.path, file_url::read_options(grant))
            .await
    }

    async fn write(
        &self,
        grant: &sandcove_core::FileGrant,
        data: sandcove_core::ByteStream,
        max_bytes: u64,
    ) -> Result<sandcove_core::FileStat> {
        self.agent()?
            .write_file(&grant.path, data, file_url::write_options(grant, max_bytes))
            .await
    }
}

/// Opens a connection to the agent from inside the monitor: one end of a socket pair, whose
/// other end the monitor takes as it takes a client's connection (its hello read, then
/// admitted to the agent only while the sandbox can serve, as [`admit_to_agent`] does).
#[derive(Debug)]
struct HandoffDialer(std::sync::Weak<Monitor>);

#[async_trait::async_trait]
impl AgentDialer for HandoffDialer {
    async fn dial(&self) -> Result<Box<dyn AgentIo>> {
        let monitor = self
            .0
            .upgrade()
            .ok_or_else(|| Error::not_found("the sandbox"))?;
        let (ours, theirs) = UnixStream::pair()?;
        tokio::spawn(async move {
            let mut theirs = theirs;
            // The client's hello is the monitor's to read; the request after it, the agent's.
            if let Ok(Some(_)) = proto::read_frame::<_, serde_json::Value>(&mut theirs).await {
                admit_to_agent(&monitor, theirs).await;
            }
        });
        Ok(Box::new(ours))
    }
}

async fn run(monitor: Arc<Monitor>, listener: UnixListener) -> i32 {
    let (stop_tx, mut stop_rx) = tokio::sync::mpsc::channel::<()>(1);
    tokio::spawn(watch_agent(monitor.clone()));
    tokio::spawn(read_control(monitor.clone()));
    let lease = {
        let monitor = monitor.clone();
        async move {
            loop {
                let ends = monitor.ends_at();
                let wait = Duration::from_millis(ends.saturating_sub(now_millis()));
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {
                        if now_millis() < monitor.ends_at() {
                            continue;
                        }
                        if !lease_ended(&monitor).await {
                            return;
                        }
                    }
                    _ = monitor.deadline_changed.notified() => {}
                }
            }
        }
    };
    tokio::pin!(lease);
    let mut terminate =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    // Clients of the same user are not capped, but descriptor exhaustion must pause the
    // loop, not spin it.
    let mut acceptor = sandcove_core::listen::Acceptor::new(tokio::sync::Semaphore::MAX_PERMITS);
    loop {
        tokio::select! {
            ((stream, _), permit) = acceptor.next(|| listener.accept()) => {
                let monitor = monitor.clone();
                let stop_tx = stop_tx.clone();
                tokio::spawn(async move {
                    serve_client(monitor, stream, stop_tx).await;
                    drop(permit);
                });
            }
            _ = &mut lease => {
                let retained = monitor.state() == SandboxState::Stopped
                    || monitor
                        .record
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .notes
                        .contains_key(PAUSED_BY_LEASE_NOTE);
                let reason = if retained {
                    "its retention after the lease ended"
                } else {
                    "its lease ended"
                };
                bury(&monitor, reason).await;
                break;
            }
            // Destroyed: the request recorded it.
            _ = stop_rx.recv() => break,
            _ = async { match terminate.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {
                bury(&monitor, "its monitor was terminated").await;
                break;
            }
        }
    }
    // Lease over, destroyed, or asked to terminate: stop taking clients first (a client that
    // finds no socket in a live directory knows the sandbox is going), then end the sandbox
    // and remove its state.
    monitor.set_state(SandboxState::Destroyed);
    let _ = std::fs::remove_file(monitor.dir.socket());
    drop(listener);
    monitor.kill_agent();
    let _ = std::fs::remove_dir_all(&monitor.dir.dir);
    0
}

/// Record the sandbox's end in the engine's tombstones (best effort: without it a saved
/// reference answers not-found instead of destroyed).
async fn bury(monitor: &Monitor, reason: &'static str) {
    // `<state dir>/sandboxes/<id>`
    let Some(state_dir) = monitor.dir.dir.parent().and_then(|p| p.parent()) else {
        return;
    };
    let state_dir = state_dir.to_path_buf();
    let (name, pooled) = {
        let record = monitor.record.lock().unwrap_or_else(|e| e.into_inner());
        (record.options.name.clone(), record.pooled)
    };
    // An unclaimed warm-pool member was never anyone's sandbox: its end (every few seconds
    // in a busy pool) must not crowd real tombstones out.
    if pooled {
        return;
    }
    let tombstone =
        sandcove_core::Tombstone::now(sandcove_core::ResourceKind::Sandbox, monitor.id(), reason)
            .with_name(name);
    let _ = tokio::task::spawn_blocking(move || super::refs::record(&state_dir, &tombstone)).await;
}

/// The lease ran out: pause or stop when asked to (returns `true`: keep the sandbox), else
/// end.
async fn lease_ended(monitor: &Monitor) -> bool {
    let (action, already) = {
        let record = monitor.record.lock().unwrap_or_else(|e| e.into_inner());
        (
            record.options.on_timeout,
            record.notes.contains_key(PAUSED_BY_LEASE_NOTE),
        )
    };
    // A stopped or failed sandbox has nothing to pause: its retention ended, destroy it.
    let ended = matches!(
        monitor.state(),
        SandboxState::Stopped | SandboxState::Failed
    );
    if action == TimeoutAction::Stop && !already && !ended {
        // Noted as ended by its lease first, so the stop keeps a fresh lease for `start`
        // (the one that ran out has no time left), as a resume after a lease pause gets.
        monitor
            .record
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .notes
            .insert(PAUSED_BY_LEASE_NOTE.into(), now_millis().to_string());
        return monitor.stop().await.is_ok();
    }
    if action != TimeoutAction::Pause || already || ended {
        return false;
    }
    if monitor.pause().await.is_err() {
        return false;
    }
    monitor
        .record
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .notes
        .insert(PAUSED_BY_LEASE_NOTE.into(), now_millis().to_string());
    monitor.set_ends_at(now_millis() + PAUSED_RETENTION.as_millis() as u64);
    monitor.write_info();
    true
}

/// Route the agent's replies to the requests waiting for them.
async fn read_control(monitor: Arc<Monitor>) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let Ok(mut guard) = monitor.ctrl.readable().await else {
            return;
        };
        let (n, fds) = match guard.try_io(|c| sys::recv_with_fds(c.as_raw_fd(), &mut buf)) {
            Ok(Ok(x)) => x,
            Ok(Err(_)) => break,
            Err(_would_block) => continue,
        };
        if n == 0 {
            break;
        }
        if let Ok(Control::Reply { req, error }) = serde_json::from_slice(&buf[..n]) {
            let waiter = monitor
                .pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&req);
            if let Some(tx) = waiter {
                let _ = tx.send((error, fds));
            }
        }
    }
    // The agent is gone: fail everything still waiting.
    monitor
        .pending
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clear();
}

/// Notice the agent dying on its own: the sandbox becomes `Failed` and stays inspectable
/// and destroyable.
async fn watch_agent(monitor: Arc<Monitor>) {
    let Ok(mut sigchld) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())
    else {
        return;
    };
    loop {
        if let Ok(Some((_, status))) = sys::waitpid_nohang(monitor.agent_pid) {
            if monitor.state() != SandboxState::Destroyed {
                monitor.set_state(SandboxState::Failed);
            }
            monitor
                .record
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .notes
                .insert(
                    FAILED_NOTE.into(),
                    format!("because the sandbox agent exited ({status:?})"),
                );
            monitor.write_info();
            return;
        }
        if sigchld.recv().await.is_none() {
            return;
        }
    }
}

async fn serve_client(
    monitor: Arc<Monitor>,
    mut stream: UnixStream,
    stop: tokio::sync::mpsc::Sender<()>,
) {
    // Only the sandbox owner (or root) may talk to it; the directory is 0700 as well.
    let me = sys::geteuid();
    match sys::peer_uid(stream.as_fd()) {
        Ok(uid) if uid == me || uid == 0 => {}
        _ => return,
    }
    let first = tokio::time::timeout(Duration::from_secs(30), async {
        let mut prefix = [0u8; 8];
        use tokio::io::AsyncReadExt;
        stream.read_exact(&mut prefix).await.ok()?;
        let hlen = u32::from_le_bytes(prefix[..4].try_into().ok()?) as usize;
        let blen = u32::from_le_bytes(prefix[4..].try_into().ok()?) as usize;
        // Monitor requests carry at most an annotation update (bounded well below this).
        if hlen > MAX_FIRST_FRAME || blen > 0 {
            return Some(Err(Error::backend(
                "protocol error: malformed first frame (a client of another Sandcove version?)",
            )));
        }
        let mut head = vec![0u8; hlen];
        stream.read_exact(&mut head).await.ok()?;
        Some(proto::parse_hello(&head))
    })
    .await;
    let hello = match first {
        Ok(Some(Ok(h))) => h,
        Ok(Some(Err(e))) => {
            let _ = proto::write_frame(&mut stream, &MonitorReply::error(&e), &[]).await;
            return;
        }
        _ => return,
    };
    let result = match hello.request {
        None => {
            // Snapshots read files of a paused or stopped sandbox: nothing runs to change them.
            let paused_ok = hello.while_paused
                && matches!(
                    monitor.state(),
                    SandboxState::Paused | SandboxState::Stopped
                );
            if paused_ok {
                return hand_to_agent(&monitor, stream, true).await;
            }
            return admit_to_agent(&monitor, stream).await;
        }
        Some(MonitorRequest::Info) => Ok(MonitorReply::Info {
            info: Box::new(monitor.info()),
        }),
        Some(MonitorRequest::SetTimeout { secs }) => {
            if !(secs.is_finite() && (0.0..=1e9).contains(&secs)) {
                Err(Error::invalid(format!(
                    "timeout must be between 0 and 1e9 seconds, got {secs}"
                )))
            } else {
                monitor.set_timeout((secs * 1000.0) as u64).await;
                monitor.write_info();
                Ok(MonitorReply::Info {
                    info: Box::new(monitor.info()),
                })
            }
        }
        Some(MonitorRequest::Destroy) => {
            monitor.set_state(SandboxState::Destroyed);
            // Before the answer: a client that saw the destroy succeed finds the tombstone.
            bury(&monitor, "destroyed").await;
            let _ = std::fs::remove_file(monitor.dir.socket());
            monitor.kill_agent();
            let _ = std::fs::remove_dir_all(&monitor.dir.dir);
            let _ = proto::write_frame(&mut stream, &MonitorReply::Done, &[]).await;
            let _ = stop.send(()).await;
            return;
        }
        Some(MonitorRequest::SetOnTimeout { action }) => {
            let changed = {
                let mut record = monitor.record.lock().unwrap_or_else(|e| e.into_inner());
                // As at creation (`CreateOptions::validate`): a lease that stops cannot go
                // with `auto_resume`.
                if action == TimeoutAction::Stop && record.options.auto_resume {
                    Err(Error::invalid(
                        "auto_resume resumes a paused sandbox; one its lease stopped is run \
                         again with start",
                    ))
                } else {
                    record.options.on_timeout = action;
                    Ok(())
                }
            };
            changed.map(|()| {
                monitor.write_info();
                MonitorReply::Info {
                    info: Box::new(monitor.info()),
                }
            })
        }
        Some(MonitorRequest::SetLabels { labels }) => {
            match sandcove_core::validate::validate_labels(&labels) {
                Ok(()) => {
                    monitor
                        .record
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .options
                        .labels = labels;
                    monitor.write_info();
                    Ok(MonitorReply::Info {
                        info: Box::new(monitor.info()),
                    })
                }
                Err(e) => Err(e),
            }
        }
        Some(MonitorRequest::UpdateAnnotations { update }) => monitor
            .update_annotations(&update)
            .map(|annotations| MonitorReply::Annotations { annotations }),
        Some(MonitorRequest::Stop) => monitor.stop().await.map(|info| MonitorReply::Info {
            info: Box::new(info),
        }),
        Some(MonitorRequest::Start) => monitor.start().await.map(|info| MonitorReply::Info {
            info: Box::new(info),
        }),
        Some(MonitorRequest::Pause) => monitor.pause().await.map(|info| MonitorReply::Info {
            info: Box::new(info),
        }),
        Some(MonitorRequest::Resume) => monitor.resume().await.map(|info| MonitorReply::Info {
            info: Box::new(info),
        }),
        Some(MonitorRequest::Expose { options }) => monitor
            .expose(options)
            .await
            .map(|preview| MonitorReply::Preview { preview }),
        Some(MonitorRequest::ListPreviews) => Ok(MonitorReply::Previews {
            previews: monitor.previews.list(),
        }),
        Some(MonitorRequest::ClosePreview { port }) => {
            monitor.previews.close(port).map(|_| MonitorReply::Done)
        }
        Some(MonitorRequest::CreateToken { port, expires_at }) => monitor
            .previews
            .create_token(port, expires_at)
            .map(|token| MonitorReply::Token { token }),
        Some(MonitorRequest::RevokeToken { port, token }) => monitor
            .previews
            .revoke_token(port, &token)
            .map(|_| MonitorReply::Done),
        Some(MonitorRequest::FileUrl { options }) => monitor
            .file_url(options)
            .await
            .map(|url| MonitorReply::FileUrl { url }),
        Some(MonitorRequest::Claim {
            options,
            users,
            handoff,
        }) => {
            let claimed = monitor.claim(*options, users);
            if let (true, Ok(info)) = (handoff, &claimed) {
                // The agent's half of the claim is the next frame on this connection: answer,
                // then hand the connection over (admitted as any other).
                let reply = MonitorReply::Info {
                    info: Box::new(info.clone()),
                };
                if proto::write_frame(&mut stream, &reply, &[]).await.is_ok() {
                    admit_to_agent(&monitor, stream).await;
                }
                return;
            }
            claimed.map(|info| MonitorReply::Info {
                info: Box::new(info),
            })
        }
    };
    let reply = match result {
        Ok(r) => r,
        Err(e) => MonitorReply::error(&e),
    };
    let _ = proto::write_frame(&mut stream, &reply, &[]).await;
}

/// Hand a connection to the agent if the sandbox can serve requests (resumed first when it
/// is paused with `auto_resume`), else answer with the refusal.
async fn admit_to_agent(monitor: &Monitor, mut stream: UnixStream) {
    if let Err(e) = monitor.ready_for_work().await {
        let _ = proto::write_frame(&mut stream, &MonitorReply::error(&e), &[]).await;
        return;
    }
    // The state check and the handoff under the transition lock: no pause or stop can slip
    // between them, so the agent counts this connection as admitted while running, and
    // retires it (it may carry further requests) at the next change.
    let _transition = monitor.transition.lock().await;
    if monitor.state() != SandboxState::Running {
        let e = monitor.invalid_state(monitor.state(), "serve requests now");
        let _ = proto::write_frame(&mut stream, &MonitorReply::error(&e), &[]).await;
        return;
    }
    hand_to_agent(monitor, stream, false).await
}

/// A new connection the agent serves as one handed over from a client; the other end is
/// returned, for the creating program. `None` if the agent cannot take it (the program then
/// dials as for any call).
async fn first_connection(monitor: &Monitor) -> Option<std::os::unix::net::UnixStream> {
    let (ours, agents) = std::os::unix::net::UnixStream::pair().ok()?;
    send_handoff(monitor, agents.as_raw_fd(), false)
        .await
        .ok()
        .map(|_| ours)
}

/// Send `fd` to the agent as a client connection to serve; `once`: for one request only.
async fn send_handoff(monitor: &Monitor, fd: RawFd, once: bool) -> std::io::Result<usize> {
    let msg = serde_json::to_vec(&Control::Handoff { once }).unwrap_or_default();
    loop {
        let Ok(mut guard) = monitor.ctrl.writable().await else {
            return Err(std::io::Error::other("control socket closed"));
        };
        match guard.try_io(|c| sys::send_with_fds(c.as_raw_fd(), &msg, &[fd])) {
            Ok(r) => return r,
            Err(_would_block) => continue,
        }
    }
}

/// Pass the client's connection to the agent; `once`: for one request only.
async fn hand_to_agent(monitor: &Monitor, stream: UnixStream, once: bool) {
    let Ok(std_stream) = stream.into_std() else {
        return;
    };
    let sent = send_handoff(monitor, std_stream.as_raw_fd(), once).await;
    if sent.is_err() {
        let mut s = std_stream;
        let _ = s.set_nonblocking(false);
        let err = Error::Backend {
            message: "the sandbox agent is not answering".into(),
            retryable: false,
        };
        let _ = proto::write_frame_sync(&mut s, &MonitorReply::error(&err), &[]);
    }
}

/// Largest readiness report: `ok`, or one error body.
const MAX_READY_REPORT: usize = 64 * 1024;

/// Read the monitor's one-line readiness report from the readiness socket `ready` (`ok`,
/// or an error body). With `ok` may come a connection to the agent, returned.
pub(super) fn read_ready(ready: OwnedFd) -> Result<Option<OwnedFd>> {
    let mut text = String::new();
    let mut first = None;
    let mut buf = vec![0u8; MAX_READY_REPORT];
    loop {
        match sys::recv_with_fds(ready.as_raw_fd(), &mut buf) {
            Ok((0, fds)) if fds.is_empty() => break,
            Ok((n, fds)) => {
                if first.is_none() {
                    first = fds.into_iter().next();
                }
                text.push_str(&String::from_utf8_lossy(&buf[..n]));
                if text.ends_with('\n') {
                    break;
                }
                if text.len() > MAX_READY_REPORT {
                    return Err(Error::backend(
                        "the sandbox monitor's readiness report is too long",
                    ));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let line = text.trim();
    if line == "ok" {
        return Ok(first);
    }
    if line.is_empty() {
        return Err(Error::backend(
            "the sandbox monitor exited before reporting readiness",
        ));
    }
    match serde_json::from_str(line) {
        Ok(body) => Err(Error::from_body(&body)),
        Err(_) => Err(Error::backend(format!("sandbox monitor: {line}"))),
    }
}
