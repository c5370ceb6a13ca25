//! The agent: PID 1 inside a sandbox's namespaces.
//!
//! It builds the sandbox filesystem, then serves requests the monitor hands over with the
//! client's connection attached, so process output and file bytes flow between the client and
//! the agent directly. When the monitor goes away the agent exits, and the kernel kills every
//! process in the sandbox's PID namespace with it.
//!
//! This module serves requests and controls the sandbox (freeze, stop); by concern the rest is
//! in [`setup`] (building the sandbox), [`process`] (starting, supervising and streaming
//! processes), [`file_calls`], [`metrics`], [`watch`](mod@watch) and [`snapshot`] (filesystem export and
//! import). Children share this module's imports (`use super::*`).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

mod file_calls;
mod image_copy;
mod image_root;
mod layer_tar;
mod metrics;
pub(crate) mod pod;
mod process;
mod setup;
mod snapshot;
mod watch;

use self::file_calls::*;
use self::metrics::*;
use self::process::*;
use self::setup::*;
use self::snapshot::*;
use self::watch::*;

use super::config::Record;
use super::files;
use super::net::Plan;
use super::proto::{self, AgentReply, AgentRequest, Control, CHUNK};
use super::quiet::QuietStream;
use super::sys;
use super::{landlock, net, seccomp, volumes};
use sandcove_core::{
    now_millis, Error, ExitStatus, FsEvent, FsEventKind, Metrics, ProcessInfo, ProcessSelector,
    ProcessSpec, Result, StreamKind, WatchOptions, WriteOptions,
};

/// Output retained per process for late attachers and log queries.
const HISTORY_BYTES: usize = 16 << 20;
/// Finished processes remembered for `list_processes` and late attach.
const FINISHED_KEPT: usize = 256;
/// How long, in all, to keep draining a process's pipes after it exited, when a descendant
/// still holds them open.
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(100);
/// Longest process timeout accepted (a year); longer is a unit mistake, and "none" is `None`.
/// The search path every sandbox process starts with.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Entry point in the freshly cloned child. Never returns.
///
/// `net` is the plan of an Internet sandbox: rules installed before any sandbox process runs.
pub fn run(
    record: Record,
    ctrl: OwnedFd,
    sync_read: OwnedFd,
    cgroup_tasks: Vec<OwnedFd>,
    volume_trees: Vec<OwnedFd>,
    net: Option<Plan>,
) -> ! {
    // While our credentials are still the monitor's: later /proc/self belongs to the host's
    // root, and sandbox processes get their OOM score through this descriptor.
    let oom_score = OomScore::open();
    // Into the sandbox's v1 cgroup before anything else, so all the agent does is charged
    // (single-threaded here, as `cgroup::join` needs). A failed move fails the setup below.
    let joined = super::cgroup::join(&cgroup_tasks);
    drop(cgroup_tasks);
    sys::set_process_name("sandcove-agent");
    let _ = sys::set_parent_death_signal(libc::SIGKILL);
    // Wait until the monitor has written our uid/gid maps.
    let mut byte = [0u8; 1];
    let mut sync = std::fs::File::from(sync_read);
    if sync.read_exact(&mut byte).is_err() {
        sys::exit_now(1);
    }
    drop(sync);
    let setup = if let Err(e) = joined {
        Err(super::monitor::cgroup_unavailable(e))
    } else if record.unisolated {
        // Orphans of sandbox processes come to us, so destroy can find and end them.
        sys::set_child_subreaper()
            .map(|()| None)
            .map_err(|e| Error::from_io(&e, "become a subreaper"))
    } else {
        setup_sandbox(&record, volume_trees, net.as_ref())
    };
    let reply = match &setup {
        Ok(_) => Control::Ready,
        Err(e) => Control::SetupFailed { error: e.to_body() },
    };
    let msg = serde_json::to_vec(&reply).unwrap_or_default();
    let _ = sys::send_with_fds(ctrl.as_raw_fd(), &msg, &[]);
    let Ok(upper) = setup else {
        sys::exit_now(1);
    };
    let _ = sys::set_non_dumpable();
    if !record.unisolated {
        // Our inherited stdio is the monitor's log in the host state directory; reachable
        // through /proc/1/fd it would be a way out of the sandbox.
        let _ = sys::stdio_to_dev_null();
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(16)
        .build()
    {
        Ok(rt) => rt,
        Err(_) => sys::exit_now(1),
    };
    let mut agent = Agent::new(record);
    agent.oom_score = oom_score.ok();
    if let Some((writable, whole_root)) = upper {
        agent.upper = Some(writable);
        agent.upper_is_root = whole_root;
    }
    runtime.block_on(serve(Arc::new(agent), ctrl));
    sys::exit_now(0)
}

// ---------------------------------------------------------------------------------------------
// Serving
// ---------------------------------------------------------------------------------------------

/// A client connection the agent serves: a unix stream handed over by the monitor, or a
/// TCP connection to the in-pod agent.
pub(super) trait Conn: AsyncRead + AsyncWrite + AsFd + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + AsFd + Unpin + Send> Conn for T {}

/// Shared state of the agent.
struct Agent {
    /// The sandbox's record; replaced once, when a warm-pool member is claimed.
    record: Mutex<Arc<Record>>,
    procs: Mutex<ProcTable>,
    /// The in-pod agent (no namespaces of its own; the container runtime isolates).
    pod: bool,
    /// Bumped whenever the sandbox is paused, resumed or stopped: every connection that
    /// started under an older value is retired before it serves another request, so no
    /// request reaches a paused or stopped sandbox on a connection the monitor admitted
    /// earlier.
    epoch: tokio::sync::watch::Sender<u64>,
    /// Set while the sandbox is paused: no reused connection is served meanwhile.
    frozen: std::sync::atomic::AtomicBool,
    /// The agent's own OOM score, which sandbox processes inherit raised (none in a pod, or
    /// where it could not be opened: isolated sandboxes then start no process).
    oom_score: Option<OomScore>,
    /// An image sandbox's writable layer (overlayfs's upper directory, `O_PATH`), kept from
    /// setup: once the agent has pivoted, no path reaches it. Snapshots read it.
    upper: Option<OwnedFd>,
    /// `upper` is the whole root (the layers were copied, see `image_copy`): a snapshot
    /// holds all of it.
    upper_is_root: bool,
}

/// The agent's OOM score adjustment, written through a descriptor opened at start.
///
/// At a sandbox's memory limit the kernel must end a sandbox process, never the agent, yet
/// the agent may not lower its own score (that needs `CAP_SYS_RESOURCE` of the host) and a
/// child may not raise its own before exec (until exec it shares the agent's memory, so its
/// /proc files belong to the host's root). So the agent raises its own score around each
/// spawn, the child inherits it, and the agent returns to its resting score: lowering back
/// to a score it held before needs no privilege.
struct OomScore {
    file: Mutex<std::fs::File>,
    /// The score the agent keeps between spawns (inherited from the monitor).
    resting: i16,
}

impl OomScore {
    fn open() -> std::io::Result<Self> {
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/proc/self/oom_score_adj")?;
        let mut text = String::new();
        file.read_to_string(&mut text)?;
        let resting = text
            .trim()
            .parse()
            .map_err(|_| std::io::Error::other(format!("oom_score_adj reads {text:?}")))?;
        Ok(OomScore {
            file: Mutex::new(file),
            resting,
        })
    }

    /// Hold the agent's score at `score` while `spawn` runs (one spawn at a time), then
    /// return to the resting score.
    fn raised_for<T>(
        &self,
        score: i16,
        spawn: impl FnOnce() -> std::io::Result<T>,
    ) -> std::io::Result<T> {
        use std::io::Write;
        let mut file = self.file.lock().unwrap_or_else(|e| e.into_inner());
        file.write_all(score.to_string().as_bytes())?;
        let spawned = spawn();
        // Returning to a score held before needs no privilege; were it refused all the same,
        // the agent would only be as likely a victim as its processes, and the process just
        // started must be tracked, not orphaned by an error.
        let _ = file.write_all(self.resting.to_string().as_bytes());
        spawned
    }
}

impl Agent {
    fn new(record: Record) -> Self {
        Agent {
            record: Mutex::new(Arc::new(record)),
            procs: Mutex::new(ProcTable::default()),
            pod: false,
            epoch: tokio::sync::watch::channel(0).0,
            frozen: std::sync::atomic::AtomicBool::new(false),
            oom_score: None,
            upper: None,
            upper_is_root: false,
        }
    }

    /// Retire every connection served so far (the sandbox is changing state).
    fn retire_connections(&self) {
        self.epoch.send_modify(|epoch| *epoch += 1);
    }

    /// The record as it stands (envs and users change when a pool member is claimed).
    fn record(&self) -> Arc<Record> {
        self.record
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Whether a claim with `users` rewrites `/etc/passwd` and `/etc/group` (both are made
    /// from the users alone).
    fn claim_rewrites(&self, users: &[sandcove_core::UserInfo]) -> bool {
        self.record.lock().unwrap_or_else(|e| e.into_inner()).users != users
    }

    /// Take this warm-pool member for a claimer: once, only while nothing ever ran in it (so
    /// no sandbox code can have touched the files rewritten here), and only with the network
    /// it was made with (its namespace, helper and blocks are fixed). The claimer's envs and
    /// users replace the pool's; when the users differ, `/etc/passwd` and `/etc/group` are
    /// rewritten (the bind mounts over `/etc` share these files' inodes) and the home
    /// directories made as setup makes them ([`claim_homes`]), only if `may_write` (else the
    /// claim is refused).
    fn apply_claim(
        &self,
        options: sandcove_core::CreateOptions,
        users: Vec<sandcove_core::UserInfo>,
        may_write: bool,
    ) -> Result<()> {
        let mut current = self.record.lock().unwrap_or_else(|e| e.into_inner());
        let untouched = {
            let table = self.procs.lock().unwrap_or_else(|e| e.into_inner());
            table.by_pid.is_empty()
        };
        if !current.pooled || !untouched || current.unisolated {
            return Err(Error::invalid(
                "this sandbox is not an unclaimed warm-pool member",
            ));
        }
        if options.network != current.options.network {
            return Err(Error::invalid(
                "a claim cannot change a warm-pool member's network",
            ));
        }
        let rewrite = current.users != users;
        if rewrite && !may_write {
            return Err(Error::invalid("this claim rewrites the user database"));
        }
        // An image member's users were merged into the image's own `/etc/passwd` at setup:
        // the pool hands one out only to a create of the same users (its shape), and anything
        // else is refused here rather than rewritten over the image's table.
        if rewrite && current.image.is_some() {
            return Err(Error::invalid(
                "a claim cannot change an image member's users",
            ));
        }
        let mut next = (**current).clone();
        next.options = options;
        next.users = users;
        next.pooled = false;
        if rewrite {
            for (name, contents) in [("passwd", next.passwd()), ("group", next.group())] {
                write_sandcove_file(name, contents.as_bytes())?;
            }
            claim_homes(&current.users, &next.users)?;
        }
        *current = Arc::new(next);
        Ok(())
    }

    fn process_list(&self) -> Vec<ProcessInfo> {
        let table = self.procs.lock().unwrap_or_else(|e| e.into_inner());
        let mut processes: Vec<ProcessInfo> = table
            .by_pid
            .values()
            .map(|p| {
                p.state
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .info
                    .clone()
            })
            .collect();
        processes.sort_by_key(|p| (p.started_at, p.pid));
        processes
    }

    fn find(&self, sel: &ProcessSelector) -> Result<Arc<Proc>> {
        let table = self.procs.lock().unwrap_or_else(|e| e.into_inner());
        let found = match sel {
            // The pid a process started with, or the pid of its current incarnation.
            ProcessSelector::Pid(pid) => table.by_pid.get(pid).cloned().or_else(|| {
                table
                    .by_pid
                    .values()
                    .find(|p| {
                        let st = p.state.lock().unwrap_or_else(|e| e.into_inner());
                        st.info.current_pid == *pid && st.info.exit.is_none()
                    })
                    .cloned()
            }),
            ProcessSelector::Tag(tag) => {
                // Prefer a running process with the tag, else the newest finished one.
                let mut best: Option<&Arc<Proc>> = None;
                for p in table.by_pid.values() {
                    let st = p.state.lock().unwrap_or_else(|e| e.into_inner());
                    if st.info.tag.as_deref() != Some(tag.as_str()) {
                        continue;
                    }
                    let running = st.info.exit.is_none();
                    let better = match best {
                        None => true,
                        Some(b) => {
                            let bs = b.state.lock().unwrap_or_else(|e| e.into_inner());
                            (running && bs.info.exit.is_some())
                                || (running == bs.info.exit.is_none()
                                    && st.info.started_at > bs.info.started_at)
                        }
                    };
                    if better {
                        best = Some(p);
                    }
                }
                best.cloned()
            }
        };
        found.ok_or_else(|| Error::not_found(describe(sel)))
    }
}

/// Replace the contents of `/.sandcove/<name>` (the source of a bind mount over `/etc`),
/// in place and without following a symlink.
fn write_sandcove_file(name: &str, contents: &[u8]) -> Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let path = Path::new("/.sandcove").join(name);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .map_err(|e| Error::from_io(&e, &format!("claim: {}", path.display())))?;
    file.write_all(contents)
        .map_err(|e| Error::from_io(&e, &format!("claim: {}", path.display())))
}

/// A claim's home directories, left as a cold create's setup leaves them: each of the
/// claimer's users has its home, made if missing and owned by the user; a home of the
/// member's users that none of the claimer's has goes back to root (a member's are
/// directories setup makes for every sandbox, `/workspace` and `/root`, which a cold create
/// leaves root's unless they are a home). Nothing ran in the member, so every path is as
/// setup made it.
fn claim_homes(
    member: &[sandcove_core::UserInfo],
    claimer: &[sandcove_core::UserInfo],
) -> Result<()> {
    let path = |home: &str| Path::new("/").join(home.trim_start_matches('/'));
    let fail = |home: &str| {
        let home = home.to_string();
        move |e: std::io::Error| Error::from_io(&e, &format!("claim: home {home}"))
    };
    for user in member
        .iter()
        .filter(|m| !claimer.iter().any(|c| c.home == m.home))
    {
        match std::os::unix::fs::lchown(path(&user.home), Some(0), Some(0)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(fail(&user.home)(e)),
            _ => {}
        }
    }
    for user in claimer {
        let home = path(&user.home);
        std::fs::create_dir_all(&home).map_err(fail(&user.home))?;
        std::os::unix::fs::chown(&home, Some(user.uid), Some(user.gid))
            .map_err(fail(&user.home))?;
    }
    Ok(())
}

fn describe(sel: &ProcessSelector) -> String {
    match sel {
        ProcessSelector::Pid(pid) => format!("process {pid}"),
        ProcessSelector::Tag(tag) => format!("process tagged {tag:?}"),
    }
}

async fn serve(agent: Arc<Agent>, ctrl: OwnedFd) {
    if let Err(e) = sys::set_nonblocking(ctrl.as_fd(), true) {
        // The agent has no log subscriber: its stderr is the monitor's log file.
        eprintln!("agent: {e}");
        return;
    }
    let ctrl = match sys::async_fd(ctrl) {
        Ok(fd) => Arc::new(fd),
        Err(_) => return,
    };
    tokio::spawn(reap_children(agent.clone()));
    let mut buf = vec![0u8; 4096];
    loop {
        let Ok(mut guard) = ctrl.readable().await else {
            return;
        };
        let res = guard.try_io(|fd| sys::recv_with_fds(fd.as_raw_fd(), &mut buf));
        let (n, mut fds) = match res {
            Err(_would_block) => continue,
            Ok(Ok(x)) => x,
            Ok(Err(_)) => return,
        };
        if n == 0 {
            // The monitor is gone: end the sandbox.
            return;
        }
        match serde_json::from_slice(&buf[..n]) {
            Ok(Control::Handoff { once }) => {
                if let Some(fd) = fds.pop() {
                    serve_connection(agent.clone(), fd, once);
                }
            }
            Ok(Control::Connect { req, port }) => {
                let ctrl = ctrl.clone();
                tokio::spawn(async move {
                    match connect_loopback(port).await {
                        Ok(sock) => {
                            let reply = Control::Reply { req, error: None };
                            send_control(&ctrl, &reply, Some(sock.as_raw_fd())).await;
                        }
                        Err(e) => {
                            let reply = Control::Reply {
                                req,
                                error: Some(e.to_body()),
                            };
                            send_control(&ctrl, &reply, None).await;
                        }
                    }
                });
            }
            Ok(Control::Freeze { req }) => {
                // Before anything stops: from here no reused connection is served.
                agent
                    .frozen
                    .store(true, std::sync::atomic::Ordering::SeqCst);
                agent.retire_connections();
                let error = freeze().await.err().map(|e| e.to_body());
                send_control(&ctrl, &Control::Reply { req, error }, None).await;
            }
            Ok(Control::Thaw { req }) => {
                agent
                    .frozen
                    .store(false, std::sync::atomic::Ordering::SeqCst);
                agent.retire_connections();
                thaw();
                send_control(&ctrl, &Control::Reply { req, error: None }, None).await;
            }
            Ok(Control::Stop { req }) => {
                agent.retire_connections();
                let error = stop_all(&agent).await.err().map(|e| e.to_body());
                send_control(&ctrl, &Control::Reply { req, error }, None).await;
            }
            _ => {}
        }
    }
}

fn serve_connection(agent: Arc<Agent>, fd: OwnedFd, once: bool) {
    let std_stream = std::os::unix::net::UnixStream::from(fd);
    // The client's end asks the same: file bodies flow both ways.
    sys::grow_socket_buffers(&std_stream);
    let Ok(stream) = QuietStream::new(std_stream) else {
        return;
    };
    // Taken here, in order with the control messages: a pause or stop the monitor sent
    // before this handoff is already counted, any later one retires the connection.
    let epoch = agent.epoch.subscribe();
    tokio::spawn(async move {
        let mut stream = stream;
        serve_requests(&agent, &mut stream, epoch, None, !once).await;
    });
}

/// Serve the requests a connection carries, in sequence (protocol v5), then close it.
///
/// The first request is read within `first_wait` (no bound: the monitor admitted the
/// connection). After a request that ended cleanly the connection waits for the next one,
/// unless `reusable` is false or the request was a `watch` or `tunnel`; an error reply ends
/// it. A connection idle for [`proto::AGENT_IDLE`], or whose sandbox was paused, resumed or
/// stopped since it started (`epoch` changed), is retired: told so and closed, and a request
/// read on it is answered `Retired` without being served. Nothing of one request outlives
/// it on the connection: each is read, dispatched and answered on its own.
async fn serve_requests<S: Conn>(
    agent: &Arc<Agent>,
    stream: &mut S,
    mut epoch: tokio::sync::watch::Receiver<u64>,
    first_wait: Option<Duration>,
    reusable: bool,
) {
    let mut first = true;
    loop {
        let frame = if first {
            let read = proto::read_frame::<_, serde_json::Value>(stream);
            match first_wait {
                Some(wait) => match tokio::time::timeout(wait, read).await {
                    Ok(frame) => frame,
                    Err(_elapsed) => return,
                },
                None => read.await,
            }
        } else {
            tokio::select! {
                frame = proto::read_frame::<_, serde_json::Value>(stream) => frame,
                _ = tokio::time::sleep(proto::AGENT_IDLE) => break retire(stream).await,
                _ = epoch.changed() => break retire(stream).await,
            }
        };
        // Only the agent's own requests are served; a monitor request is refused as misrouted.
        let request = match frame.and_then(|frame| {
            frame
                .map(|(head, _)| proto::parse_agent_request(head))
                .transpose()
        }) {
            Ok(Some(request)) => request,
            Ok(None) => return,
            Err(e) => {
                let _ = proto::write_frame(stream, &AgentReply::error(&e), &[]).await;
                break;
            }
        };
        let stale = epoch.has_changed().unwrap_or(true)
            || agent.frozen.load(std::sync::atomic::Ordering::SeqCst);
        if !first && stale {
            break retire(stream).await;
        }
        first = false;
        let again = reusable
            && !matches!(
                request,
                AgentRequest::Watch { .. } | AgentRequest::Tunnel { .. }
            );
        match handle(agent, stream, request).await {
            Ok(()) if again => continue,
            Ok(()) => break,
            Err(e) => {
                let _ = proto::write_frame(stream, &AgentReply::error(&e), &[]).await;
                break;
            }
        }
    }
    let _ = stream.shutdown().await;
}

/// Tell the client this connection serves nothing more (anything it sent was not served).
async fn retire(stream: &mut impl Conn) {
    let _ = proto::write_frame(stream, &AgentReply::Retired, &[]).await;
}

/// Send a control message (with an optional descriptor) to the monitor.
async fn send_control(
    ctrl: &tokio::io::unix::AsyncFd<OwnedFd>,
    msg: &Control,
    fd: Option<std::os::fd::RawFd>,
) {
    let bytes = serde_json::to_vec(msg).unwrap_or_default();
    let fds: Vec<_> = fd.into_iter().collect();
    loop {
        let Ok(mut guard) = ctrl.writable().await else {
            return;
        };
        match guard.try_io(|c| sys::send_with_fds(c.as_raw_fd(), &bytes, &fds)) {
            Ok(_) => return,
            Err(_would_block) => continue,
        }
    }
}

/// Connect to a port on the sandbox's own loopback (IPv4, then IPv6).
async fn connect_loopback(port: u16) -> Result<std::net::TcpStream> {
    let attempt = async {
        match tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
            Ok(s) => Ok(s),
            Err(e4) => tokio::net::TcpStream::connect(("::1", port))
                .await
                .map_err(|_| e4),
        }
    };
    let stream = tokio::time::timeout(Duration::from_secs(5), attempt)
        .await
        .map_err(|_| Error::Timeout {
            what: format!("connecting to port {port} in the sandbox"),
        })?
        .map_err(|e| Error::Unavailable {
            reason: format!("nothing is listening on port {port} in the sandbox ({e})"),
            remedy: format!("start a server on port {port} (bound to 127.0.0.1 or 0.0.0.0)"),
        })?;
    stream
        .into_std()
        .map_err(|e| Error::from_io(&e, "preview socket"))
}

/// Pids of every process in the sandbox but the agent: everything in our PID namespace, or,
/// un-isolated, our descendants.
fn sandbox_pids() -> Vec<i32> {
    let all = sys::all_pids();
    if std::process::id() == 1 {
        return all.into_iter().filter(|&pid| pid != 1).collect();
    }
    sys::descendants(std::process::id() as i32, &all)
}

/// Stop every process; repeat until a scan finds nothing new, so a process forked during the
/// freeze is stopped too.
async fn freeze() -> Result<()> {
    let mut stopped = std::collections::HashSet::new();
    for _ in 0..100 {
        let mut new = false;
        for pid in sandbox_pids() {
            if stopped.insert(pid) {
                new = true;
                let _ = sys::kill(pid, libc::SIGSTOP);
            }
        }
        if !new {
            // Wait for the stops to take effect.
            for _ in 0..50 {
                let running = sandbox_pids().into_iter().any(|pid| {
                    let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                        .ok()
                        .and_then(|s| {
                            s.rsplit_once(')')
                                .and_then(|(_, rest)| rest.trim_start().chars().next())
                        });
                    matches!(state, Some('R' | 'S' | 'D'))
                });
                if !running {
                    return Ok(());
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            return Ok(());
        }
    }
    Err(Error::backend("processes kept forking while pausing"))
}

/// Kill every sandbox process (a stop): SIGKILL each one found, frozen ones included, until
/// a scan finds none left (a process forked meanwhile is found by the next scan), then wait
/// until each API process's end is recorded, so a process list read after the stop shows
/// them ended. The agent, its namespaces and the sandbox's files stay.
async fn stop_all(agent: &Agent) -> Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let pids = sandbox_pids();
        if pids.is_empty() {
            break;
        }
        for pid in pids {
            let _ = sys::kill(pid, libc::SIGKILL);
        }
        if tokio::time::Instant::now() > deadline {
            return Err(Error::backend("processes kept appearing while stopping"));
        }
        // The reaper (on this runtime) collects them meanwhile.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    loop {
        let running = agent
            .procs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .by_pid
            .values()
            .any(|p| {
                p.state
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .info
                    .exit
                    .is_none()
            });
        if !running {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(Error::backend(
                "stopped processes did not report their end in time",
            ));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn thaw() {
    for pid in sandbox_pids() {
        let _ = sys::kill(pid, libc::SIGCONT);
    }
}

/// Reap every child (PID 1 inherits orphans too) and report the ones we wait for.
async fn reap_children(agent: Arc<Agent>) {
    let Ok(mut sigchld) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())
    else {
        return;
    };
    loop {
        while let Ok(Some((pid, status))) = sys::waitpid_nohang(-1) {
            let status = match status {
                sys::WaitStatus::Exited(code) => ExitStatus {
                    code: Some(code),
                    signal: None,
                    timed_out: false,
                },
                sys::WaitStatus::Signaled(sig) => ExitStatus {
                    code: None,
                    signal: Some(sig),
                    timed_out: false,
                },
            };
            let waiter = agent
                .procs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .exit_waiters
                .remove(&(pid as u32));
            if let Some(tx) = waiter {
                let _ = tx.send(status);
            }
        }
        if sigchld.recv().await.is_none() {
            return;
        }
    }
}

async fn handle(agent: &Arc<Agent>, stream: &mut impl Conn, request: AgentRequest) -> Result<()> {
    match request {
        AgentRequest::Ping => done(stream).await,
        AgentRequest::Tunnel { port } => {
            let sock = connect_loopback(port).await?;
            sock.set_nonblocking(true)
                .map_err(|e| Error::from_io(&e, "tunnel socket"))?;
            let mut sock = tokio::net::TcpStream::from_std(sock)
                .map_err(|e| Error::from_io(&e, "tunnel socket"))?;
            done(stream).await?;
            // From here on the connection is the caller's bytes; an error ends it, and no
            // error frame may follow (it would be read as the server's bytes).
            let _ = tokio::io::copy_bidirectional(stream, &mut sock).await;
            Ok(())
        }
        AgentRequest::Spawn { spec } => {
            let (proc_, rx) = spawn_process(agent, spec)?;
            proto::write_frame(stream, &AgentReply::Started { pid: proc_.pid }, &[]).await?;
            forward_events(stream, rx).await
        }
        AgentRequest::Attach { process } => {
            let proc_ = agent.find(&process)?;
            let (tx, rx) = mpsc::channel(64);
            let (gap, replay, exit) = {
                let mut st = proc_.state.lock().unwrap_or_else(|e| e.into_inner());
                let replay: Vec<_> = st.history.iter().cloned().collect();
                let exit = st.info.exit;
                if exit.is_none() {
                    st.subscribers.push(tx);
                }
                (st.dropped, replay, exit)
            };
            proto::write_frame(stream, &AgentReply::Started { pid: proc_.pid }, &[]).await?;
            if gap != [0, 0] {
                let reply = AgentReply::Gap {
                    stdout: gap[0],
                    stderr: gap[1],
                };
                proto::write_frame(stream, &reply, &[]).await?;
            }
            for ev in replay {
                write_event(stream, &ev).await?;
            }
            // Everything before this marker was history; callers that want "the logs so far"
            // stop reading here instead of guessing with a timer.
            proto::write_frame(stream, &AgentReply::Live, &[]).await?;
            if let Some(status) = exit {
                return proto::write_frame(stream, &AgentReply::Exit { status }, &[]).await;
            }
            forward_events(stream, rx).await
        }
        AgentRequest::WriteStdin { process } => {
            let proc_ = agent.find(&process)?;
            let mut stdin = proc_.stdin.lock().await;
            let pipe = stdin.as_mut().ok_or_else(|| {
                Error::invalid(format!(
                    "{} has no open stdin (start it with stdin enabled, and do not close it)",
                    describe(&process)
                ))
            })?;
            while let Some(data) = read_data_frame(stream).await? {
                if let Err(e) = pipe.write_all(&data).await {
                    return Err(if e.kind() == std::io::ErrorKind::BrokenPipe {
                        Error::invalid(format!(
                            "{}: stdin is closed by the process",
                            describe(&process)
                        ))
                    } else {
                        Error::from_io(&e, "stdin")
                    });
                }
            }
            done(stream).await
        }
        AgentRequest::CloseStdin { process } => {
            let proc_ = agent.find(&process)?;
            proc_.stdin.lock().await.take();
            done(stream).await
        }
        AgentRequest::Signal { process, signal } => {
            let proc_ = agent.find(&process)?;
            let current = {
                let mut st = proc_.state.lock().unwrap_or_else(|e| e.into_inner());
                if st.info.exit.is_some() {
                    return Err(Error::not_found(format!("running {}", describe(&process))));
                }
                // Any signal but stop/continue is a request to end it: no restart after.
                if !matches!(
                    signal,
                    sandcove_core::Signal::Stop | sandcove_core::Signal::Cont
                ) {
                    st.stop_requested = true;
                }
                st.info.current_pid as i32
            };
            sys::kill(-current, signal.number())
                .or_else(|_| sys::kill(current, signal.number()))
                .map_err(|e| Error::from_io(&e, &describe(&process)))?;
            done(stream).await
        }
        AgentRequest::ListProcesses => {
            let processes = agent.process_list();
            proto::write_frame(stream, &AgentReply::Processes { processes }, &[]).await
        }
        AgentRequest::ReadFile { path, options } => read_file(agent, stream, &path, options).await,
        AgentRequest::WriteFile { path, options } => {
            write_file(agent, stream, &path, options).await
        }
        AgentRequest::ListDir { path, options } => {
            let rec = agent.record();
            let user = options.user.clone();
            let entries = as_user(&agent.record(), user, move || {
                files::list_dir(&rec, &path, options)
            })
            .await?;
            proto::write_frame(stream, &AgentReply::Entries { entries }, &[]).await
        }
        AgentRequest::Stat { path, options } => {
            let rec = agent.record();
            let attributes = options.attributes;
            let stat = as_user(&agent.record(), options.user, move || {
                files::stat(&rec, &path, attributes)
            })
            .await?;
            proto::write_frame(stream, &AgentReply::Stat { stat }, &[]).await
        }
        AgentRequest::Mkdir { path, options } => {
            // As the user: the kernel checks that user's permissions on every directory it
            // creates in, and what it creates is that user's.
            let rec = agent.record();
            let user = options.user.clone();
            let stat = as_user(&agent.record(), user, move || {
                files::mkdir(&rec, &path, options)
            })
            .await?;
            proto::write_frame(stream, &AgentReply::Stat { stat }, &[]).await
        }
        AgentRequest::Remove { path, options } => {
            // As the user: the kernel checks its permissions on the directories removed from.
            let rec = agent.record();
            let recursive = options.recursive;
            as_user(&agent.record(), options.user, move || {
                files::remove(&rec, &path, recursive)
            })
            .await?;
            done(stream).await
        }
        AgentRequest::Rename { from, to, options } => {
            // As the user: the kernel checks its permissions on both directories.
            let rec = agent.record();
            let overwrite = options.overwrite;
            let stat = as_user(&agent.record(), options.user, move || {
                files::rename(&rec, &from, &to, overwrite)
            })
            .await?;
            proto::write_frame(stream, &AgentReply::Stat { stat }, &[]).await
        }
        AgentRequest::Copy { from, to, options } => {
            // As the user: it reads and creates with that user's permissions.
            let rec = agent.record();
            let user = options.user.clone();
            let stat = as_user(&agent.record(), user, move || {
                files::copy(&rec, &from, &to, &options)
            })
            .await?;
            proto::write_frame(stream, &AgentReply::Stat { stat }, &[]).await
        }
        AgentRequest::Chmod { path, mode } => {
            let rec = agent.record();
            let stat = blocking(move || files::chmod(&rec, &path, mode)).await?;
            proto::write_frame(stream, &AgentReply::Stat { stat }, &[]).await
        }
        AgentRequest::Metrics => {
            let metrics = blocking(move || Ok(sample_metrics())).await?;
            proto::write_frame(stream, &AgentReply::Metrics { metrics }, &[]).await
        }
        AgentRequest::ResizePty { process, size } => {
            let proc_ = agent.find(&process)?;
            let stdin = proc_.stdin.lock().await;
            match stdin.as_ref() {
                Some(Stdin::Pty(master)) => sys::set_winsize(master.as_fd(), size.cols, size.rows)
                    .map_err(|e| Error::from_io(&e, "resize the terminal"))?,
                _ => {
                    return Err(Error::invalid(format!(
                        "{} has no terminal (start it with a pty)",
                        describe(&process)
                    )))
                }
            }
            drop(stdin);
            done(stream).await
        }
        AgentRequest::Watch { path, options } => watch(agent, stream, &path, options).await,
        AgentRequest::ExportFs | AgentRequest::ImportFs if agent.pod => Err(Error::not_supported(
            "filesystem snapshots of a pod",
            "copy files out with read_file, or snapshot the volume behind the pod",
        )),
        // The agent's `tar` keeps capabilities no sandbox process has: it is the host's in a
        // host-base sandbox, but an image's root holds the image's own `tar`, which must never
        // run with them. An image sandbox's writable layer is written by the agent itself, and
        // a snapshot of one is unpacked into a new sandbox's layer at its setup.
        AgentRequest::ExportFs if agent.record().image.is_some() => {
            export_layer(agent, stream).await
        }
        AgentRequest::ImportFs if agent.record().image.is_some() => Err(Error::not_supported(
            "restoring files into a running image sandbox",
            "create a sandbox from the snapshot: its writable layer is applied at setup",
        )),
        AgentRequest::ExportFs => export_fs(agent, stream).await,
        AgentRequest::ImportFs => import_fs(agent, stream).await,
        AgentRequest::ApplyClaim { options, users } => {
            // Most claims keep the member's users (any name but root as the default user),
            // so its `/etc/passwd` and `/etc/group` are already right and the claim touches
            // no file: it is applied here, without starting the blocking pool's first thread
            // (about a quarter of such a claim's time). A claim that rewrites them does so
            // off the event loop.
            if agent.claim_rewrites(&users) {
                let agent = agent.clone();
                blocking(move || agent.apply_claim(*options, users, true)).await?;
            } else {
                agent.apply_claim(*options, users, false)?;
            }
            done(stream).await
        }
    }
}

/// The next chunk of an upload (`Data` frames ended by `End`); `None` at the end marker.
async fn read_data_frame(stream: &mut impl Conn) -> Result<Option<Vec<u8>>> {
    match proto::read_frame::<_, AgentReply>(stream).await? {
        Some((AgentReply::Data, body)) => Ok(Some(body)),
        Some((AgentReply::End, _)) => Ok(None),
        Some((other, _)) => Err(Error::backend(format!(
            "protocol error: unexpected {other:?} in an upload"
        ))),
        None => Err(Error::backend("upload ended before its end marker")),
    }
}

async fn done(stream: &mut impl Conn) -> Result<()> {
    proto::write_frame(stream, &AgentReply::Done, &[]).await
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::backend(format!("agent task failed: {e}")))?
}

/// Run blocking file work as sandbox user `user` (`None`: as the agent itself, on the
/// blocking pool).
///
/// The user is looked up in the sandbox's record (the same table processes run from; it is
/// host-written, never read from files sandbox code can edit), so an unknown user is an error
/// before anything is touched. A user with the agent's own ids needs no switch. Any other runs
/// on a fresh thread that takes the user's filesystem identity for itself alone and ends with
/// the work, so no thread ever goes back to a pool with a changed identity.
async fn as_user<T: Send + 'static>(
    record: &Record,
    user: Option<String>,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    let Some(name) = user else {
        return blocking(f).await;
    };
    let u = record.user(Some(&name))?;
    // The agent's own ids (root of the user namespace; un-isolated, the host user) need no
    // switch: its identity already is that user's.
    if (u.uid, u.gid) == (0, 0) || (u.uid, u.gid) == (sys::geteuid(), sys::getegid()) {
        return blocking(f).await;
    }
    if record.unisolated {
        // Un-isolated, the agent is the host user: there is no other identity to take.
        return Err(Error::not_supported(
            format!("file calls as user {name:?} without isolation"),
            "omit the user (files are accessed as the host user)",
        ));
    }
    let (uid, gid) = (u.uid, u.gid);
    let (tx, rx) = oneshot::channel();
    std::thread::Builder::new()
        .name("sandcove-files-as-user".into())
        .spawn(move || {
            let result = sys::set_thread_fs_identity(uid, gid)
                .map_err(|e| Error::Unavailable {
                    reason: format!("cannot act as user {name:?} for a file call: {e}"),
                    remedy: "omit the user, or run the host side as root so the sandbox has                              more than one uid"
                        .into(),
                })
                .and_then(|()| f());
            let _ = tx.send(result);
        })
        .map_err(|e| Error::from_io(&e, "start a file thread"))?;
    rx.await
        .map_err(|_| Error::backend("a file call as a user ended without a result"))?
}

async fn write_output(
    stream: &mut (impl AsyncWrite + Unpin + Send),
    kind: StreamKind,
    bytes: &[u8],
) -> Result<()> {
    let header = match kind {
        StreamKind::Stdout => AgentReply::Stdout,
        StreamKind::Stderr => AgentReply::Stderr,
    };
    for chunk in bytes.chunks(CHUNK) {
        proto::write_frame(stream, &header, chunk).await?;
    }
    Ok(())
}

/// Write one history entry (output or a restart).
async fn write_event(stream: &mut (impl AsyncWrite + Unpin + Send), ev: &Event) -> Result<()> {
    match ev {
        Event::Output(kind, bytes) => write_output(stream, *kind, bytes).await,
        Event::Restarted {
            pid,
            restarts,
            previous,
        } => {
            let reply = AgentReply::Restarted {
                pid: *pid,
                restarts: *restarts,
                previous: *previous,
            };
            proto::write_frame(stream, &reply, &[]).await
        }
        Event::Exit(status) => {
            proto::write_frame(stream, &AgentReply::Exit { status: *status }, &[]).await
        }
    }
}

/// Send a process's events until its exit. Events already queued when one arrives (a short
/// command's last output and its exit, often) go out in one write: one wake-up of the client
/// rather than one per frame.
async fn forward_events(stream: &mut impl Conn, mut rx: mpsc::Receiver<Event>) -> Result<()> {
    /// Bytes gathered before a write, at most (plus one event's frames).
    const BATCH: usize = 256 * 1024;
    let mut batch = Vec::new();
    while let Some(ev) = rx.recv().await {
        let mut next = Some(ev);
        let mut ended = false;
        while let Some(ev) = next.take() {
            write_event(&mut batch, &ev).await?;
            ended = matches!(ev, Event::Exit(_));
            if !ended && batch.len() < BATCH {
                next = rx.try_recv().ok();
            }
        }
        stream
            .write_all(&batch)
            .await
            .map_err(|e| Error::from_io(&e, "process events"))?;
        batch.clear();
        // A long-lived stream keeps no large buffer between bursts.
        if batch.capacity() > 64 * 1024 {
            batch = Vec::new();
        }
        if ended {
            return Ok(());
        }
    }
    Err(Error::backend(
        "process event stream ended without an exit status",
    ))
}
