//! The agent: PID 1 inside a sandbox's namespaces.
//!
//! It builds the sandbox filesystem, then serves requests the monitor hands over with the
//! client's connection attached, so process output and file bytes flow between the client and
//! the agent directly. When the monitor goes away the agent exits, and the kernel kills every
//! process in the sandbox's PID namespace with it.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot};

use super::config::Record;
use super::files;
use super::net::Plan;
use super::proto::{self, Control, Reply, Request, CHUNK};
use super::sys;
use crate::{
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
pub fn run(record: Record, ctrl: OwnedFd, sync_read: OwnedFd, net: Option<Plan>) -> ! {
    sys::set_process_name("sandcove-agent");
    let _ = sys::set_parent_death_signal(libc::SIGKILL);
    // Wait until the monitor has written our uid/gid maps.
    let mut byte = [0u8; 1];
    let mut sync = std::fs::File::from(sync_read);
    if sync.read_exact(&mut byte).is_err() {
        sys::exit_now(1);
    }
    drop(sync);
    let setup = if record.unisolated {
        // Orphans of sandbox processes come to us, so destroy can find and end them.
        sys::set_child_subreaper().map_err(|e| Error::from_io(&e, "become a subreaper"))
    } else {
        setup_sandbox(&record, net.as_ref())
    };
    let reply = match &setup {
        Ok(()) => Control::Ready,
        Err(e) => Control::SetupFailed { error: e.to_body() },
    };
    let msg = serde_json::to_vec(&reply).unwrap_or_default();
    let _ = sys::send_with_fds(ctrl.as_raw_fd(), &msg, &[]);
    if setup.is_err() {
        sys::exit_now(1);
    }
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
    runtime.block_on(serve(Arc::new(Agent::new(record)), ctrl));
    sys::exit_now(0)
}

fn unavailable(step: &str, err: std::io::Error) -> Error {
    Error::Unavailable {
        reason: format!("cannot set up the sandbox ({step}): {err}"),
        remedy: "the host must allow unprivileged user namespaces with mount and proc \
                 (sysctl kernel.unprivileged_userns_clone=1 / \
                 kernel.apparmor_restrict_unprivileged_userns=0; in a container, run it with \
                 a seccomp profile that allows unshare and mount); or set \
                 SANDCOVE_ALLOW_UNISOLATED=1 to run without isolation"
            .into(),
    }
}

/// Build the sandbox root: a tmpfs with the host's system directories read-only, a private
/// `/workspace`, `/tmp`, `/proc` and `/dev`, then pivot into it.
fn setup_sandbox(record: &Record, net: Option<&Plan>) -> Result<()> {
    // Become root of the new user namespace (a no-op in the single-uid mapping).
    become_ns_root().map_err(|e| unavailable("setuid in the user namespace", e))?;
    let private = libc::MS_REC | libc::MS_PRIVATE;
    sys::mount(None, Path::new("/"), None, private, None)
        .map_err(|e| unavailable("make mounts private", e))?;
    // The new root is a tmpfs mounted over /tmp of this (private) mount namespace: always
    // reachable, unlike the state directory, which an unmapped sandbox root may not traverse.
    let root = PathBuf::from("/tmp");
    // Open the volume sources now: a source under the host's /tmp is hidden once the root
    // tmpfs is mounted there, but a descriptor opened first still reaches it (and belongs to
    // this mount namespace, so it can be bound).
    let mut volume_sources = Vec::new();
    for m in &record.mounts {
        let dir =
            super::volumes::open_source(Path::new(&m.host_path), m.subpath.as_deref(), false, None)
                .map_err(|e| match &m.subpath {
                    Some(sub) => super::volumes::subpath_error(&m.path, sub, e),
                    None => unavailable(&format!("open volume directory {}", m.host_path), e),
                })?;
        volume_sources.push(dir);
    }
    let size = format!("size={}m,mode=0755", record.disk_mib());
    sys::mount(
        Some(Path::new("tmpfs")),
        &root,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some(&size),
    )
    .map_err(|e| unavailable("mount the sandbox root", e))?;
    let r = |p: &str| root.join(p.trim_start_matches('/'));
    let fs_err = |step: &str| {
        let step = step.to_string();
        move |e: std::io::Error| unavailable(&step, e)
    };

    // Host system directories, read-only (symlinks, as on merged-/usr hosts, recreated).
    for d in [
        "usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "opt",
    ] {
        let host = Path::new("/").join(d);
        let Ok(meta) = std::fs::symlink_metadata(&host) else {
            continue;
        };
        if meta.file_type().is_symlink() {
            let target = std::fs::read_link(&host).map_err(fs_err("read a host symlink"))?;
            std::os::unix::fs::symlink(target, r(d)).map_err(fs_err("link a system dir"))?;
        } else if meta.is_dir() {
            bind_readonly(&host, &r(d))?;
        }
    }
    for d in [
        "workspace",
        "tmp",
        "var/tmp",
        "root",
        "home",
        "run",
        "proc",
        "dev",
        "mnt",
        "srv",
        ".sandcove",
    ] {
        std::fs::create_dir_all(r(d)).map_err(fs_err("create sandbox directories"))?;
    }
    for d in ["tmp", "var/tmp"] {
        std::fs::set_permissions(r(d), std::fs::Permissions::from_mode(0o1777))
            .map_err(fs_err("chmod /tmp"))?;
    }
    std::fs::set_permissions(r("root"), std::fs::Permissions::from_mode(0o700))
        .map_err(fs_err("chmod /root"))?;
    for user in &record.users {
        let home = r(&user.home);
        std::fs::create_dir_all(&home).map_err(fs_err("create a home directory"))?;
        std::os::unix::fs::chown(&home, Some(user.uid), Some(user.gid))
            .map_err(fs_err("chown a home directory"))?;
    }

    // Our own user database, hostname and hosts file over the read-only /etc.
    let hostname = record
        .options
        .hostname
        .clone()
        .unwrap_or_else(|| record.id.chars().take(12).collect());
    let etc_files = [
        ("passwd", record.passwd()),
        ("group", record.group()),
        ("hostname", format!("{hostname}\n")),
        (
            "hosts",
            format!("127.0.0.1 localhost {hostname}\n::1 localhost ip6-localhost\n"),
        ),
    ];
    if r("etc").is_dir() {
        for (name, contents) in etc_files {
            let src = r(".sandcove").join(name);
            std::fs::write(&src, contents).map_err(fs_err("write /etc files"))?;
            let dst = r("etc").join(name);
            if dst.exists() {
                sys::mount(Some(&src), &dst, None, libc::MS_BIND, None)
                    .map_err(|e| unavailable("bind /etc files", e))?;
            }
        }
    }

    // Volumes (staged by the monitor where the host path is out of our reach).
    // A mount point may lie inside an earlier volume, whose contents a sandbox wrote: it is
    // made and reached beneath the new root with no symlinks, never by a host path.
    let root_fd = sys::open_dir_path(&root).map_err(fs_err("open the sandbox root"))?;
    for (m, dir) in record.mounts.iter().zip(&volume_sources) {
        let rel = Path::new(m.path.trim_start_matches('/'));
        let shown = |e: std::io::Error| {
            Error::invalid(format!(
                "volume mount path {:?} cannot be made inside the sandbox: {e}",
                m.path
            ))
        };
        let target = super::volumes::dirs_beneath(root_fd.as_raw_fd(), rel, true, None, false)
            .map_err(shown)?;
        sys::mount(
            Some(&sys::fd_path(dir.as_raw_fd())),
            &sys::fd_path(target.as_raw_fd()),
            None,
            libc::MS_BIND | libc::MS_REC,
            None,
        )
        .map_err(|e| unavailable("bind a volume", e))?;
        // Reopened: the descriptor above is the directory under the new mount. Never setuid
        // or device files from a volume (a sandbox writes them, and the volume outlives it);
        // flags the host's mount locks are kept, as the kernel requires.
        let target =
            sys::open_beneath(root_fd.as_raw_fd(), rel, libc::O_PATH, false).map_err(shown)?;
        let target = sys::fd_path(target.as_raw_fd());
        let keep = sys::locked_mount_flags(&target).map_err(|e| unavailable("statvfs", e))?;
        let read_only = if m.read_only { libc::MS_RDONLY } else { 0 };
        sys::mount(
            None,
            &target,
            None,
            libc::MS_REMOUNT | libc::MS_BIND | libc::MS_NOSUID | libc::MS_NODEV | read_only | keep,
            None,
        )
        .map_err(|e| unavailable("remount a volume nosuid and nodev", e))?;
    }

    // /proc of the new PID namespace.
    sys::mount(
        Some(Path::new("proc")),
        &r("proc"),
        Some("proc"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        None,
    )
    .map_err(|e| unavailable("mount /proc", e))?;

    // A minimal /dev: a few host devices bound in, a private devpts and shm.
    sys::mount(
        Some(Path::new("tmpfs")),
        &r("dev"),
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NOEXEC,
        Some("mode=0755,size=64k"),
    )
    .map_err(|e| unavailable("mount /dev", e))?;
    for dev in ["null", "zero", "full", "random", "urandom", "tty"] {
        let host = Path::new("/dev").join(dev);
        if host.exists() {
            let target = r("dev").join(dev);
            std::fs::write(&target, b"").map_err(fs_err("create /dev nodes"))?;
            sys::mount(Some(&host), &target, None, libc::MS_BIND, None)
                .map_err(|e| unavailable("bind /dev nodes", e))?;
        }
    }
    for d in ["pts", "shm"] {
        std::fs::create_dir_all(r("dev").join(d)).map_err(fs_err("create /dev dirs"))?;
    }
    if sys::mount(
        Some(Path::new("devpts")),
        &r("dev/pts"),
        Some("devpts"),
        libc::MS_NOSUID | libc::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=0620"),
    )
    .is_ok()
    {
        std::os::unix::fs::symlink("pts/ptmx", r("dev/ptmx")).map_err(fs_err("link ptmx"))?;
    }
    sys::mount(
        Some(Path::new("tmpfs")),
        &r("dev/shm"),
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some("mode=1777,size=64m"),
    )
    .map_err(|e| unavailable("mount /dev/shm", e))?;
    for (link, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        std::os::unix::fs::symlink(target, r("dev").join(link)).map_err(fs_err("link /dev"))?;
    }

    drop(volume_sources);
    std::env::set_current_dir(&root).map_err(fs_err("enter the sandbox root"))?;
    sys::pivot_root_here().map_err(|e| unavailable("pivot_root", e))?;
    std::env::set_current_dir("/").map_err(fs_err("chdir /"))?;
    let _ = sys::sethostname(&hostname);
    if record.options.network != crate::NetworkPolicy::Host {
        sys::loopback_up().map_err(|e| unavailable("bring up loopback", e))?;
    }
    match (&record.options.network, net) {
        (crate::NetworkPolicy::Internet, Some(plan)) => plan.apply().map_err(|e| {
            super::net::unavailable(&format!(
                "cannot block host, link-local and private ranges in the sandbox: {e}"
            ))
        })?,
        // Fail closed: never an Internet sandbox without its blocks.
        (crate::NetworkPolicy::Internet, None) => {
            return Err(super::net::unavailable(
                "no network plan reached the sandbox",
            ))
        }
        _ => {}
    }
    // Fail closed: no sandbox starts without its seccomp filter or its Landlock layer.
    super::seccomp::filters()?;
    super::landlock::confine_to_root(record.landlock_optional)?;
    Ok(())
}

fn become_ns_root() -> std::io::Result<()> {
    // In the range mapping our host uid (root) is unmapped; take uid 0 of the namespace so
    // files we create belong to sandbox root.
    let _ = sys::setrlimit(libc::RLIMIT_CORE, 0);
    if sys::geteuid() != 0 {
        sys::set_all_ids(0, 0)?;
    }
    Ok(())
}

fn bind_readonly(host: &Path, target: &Path) -> Result<()> {
    std::fs::create_dir_all(target).map_err(|e| unavailable("create a mount point", e))?;
    sys::mount(Some(host), target, None, libc::MS_BIND | libc::MS_REC, None)
        .map_err(|e| unavailable("bind a system directory", e))?;
    let keep = sys::locked_mount_flags(host).map_err(|e| unavailable("statvfs", e))?;
    sys::mount(
        None,
        target,
        None,
        libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | libc::MS_NOSUID | keep,
        None,
    )
    .map_err(|e| unavailable("remount a system directory read-only", e))
}

// ---------------------------------------------------------------------------------------------
// Serving
// ---------------------------------------------------------------------------------------------

/// Shared state of the agent.
struct Agent {
    record: Record,
    procs: Mutex<ProcTable>,
}

#[derive(Default)]
struct ProcTable {
    by_pid: HashMap<u32, Arc<Proc>>,
    finished: VecDeque<u32>,
    exit_waiters: HashMap<u32, oneshot::Sender<ExitStatus>>,
}

/// One process started through the API.
struct Proc {
    pid: u32,
    state: Mutex<ProcState>,
    stdin: tokio::sync::Mutex<Option<Stdin>>,
}

/// Where bytes for a process's input go.
enum Stdin {
    /// A pipe to its stdin.
    Pipe(tokio::net::unix::pipe::Sender),
    /// The master side of its terminal (shared with the output reader).
    Pty(Arc<tokio::io::unix::AsyncFd<OwnedFd>>),
}

impl Stdin {
    async fn write_all(&mut self, data: &[u8]) -> std::io::Result<()> {
        match self {
            Stdin::Pipe(p) => p.write_all(data).await,
            Stdin::Pty(fd) => {
                let mut off = 0;
                while off < data.len() {
                    let mut guard = fd.writable().await?;
                    match guard.try_io(|f| sys::write_fd(f.as_raw_fd(), &data[off..])) {
                        Ok(Ok(n)) => off += n,
                        Ok(Err(e)) => return Err(e),
                        Err(_would_block) => continue,
                    }
                }
                Ok(())
            }
        }
    }
}

/// An output source of a process: a pipe, or a terminal master.
enum Source {
    Pipe(tokio::net::unix::pipe::Receiver),
    Pty(Arc<tokio::io::unix::AsyncFd<OwnedFd>>),
}

impl Source {
    /// Read some bytes; 0 at end of stream (a terminal reports EIO once its last user exits).
    async fn read(&mut self, buf: &mut [u8]) -> usize {
        match self {
            Source::Pipe(p) => p.read(buf).await.unwrap_or(0),
            Source::Pty(fd) => loop {
                let Ok(mut guard) = fd.readable().await else {
                    return 0;
                };
                match guard.try_io(|f| sys::read_fd(f.as_raw_fd(), buf)) {
                    Ok(Ok(n)) => return n,
                    Ok(Err(_)) => return 0,
                    Err(_would_block) => continue,
                }
            },
        }
    }
}

struct ProcState {
    info: ProcessInfo,
    /// Output and restarts, oldest first (never the exit).
    history: VecDeque<Event>,
    history_bytes: usize,
    dropped: [u64; 2],
    subscribers: Vec<mpsc::Sender<Event>>,
    timed_out: bool,
    /// Signalled through the API: a restart policy does not bring it back.
    stop_requested: bool,
}

#[derive(Clone)]
enum Event {
    Output(StreamKind, Arc<Vec<u8>>),
    Restarted {
        pid: u32,
        restarts: u32,
        previous: ExitStatus,
    },
    Exit(ExitStatus),
}

impl Agent {
    fn new(record: Record) -> Self {
        Agent {
            record,
            procs: Mutex::new(ProcTable::default()),
        }
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

fn describe(sel: &ProcessSelector) -> String {
    match sel {
        ProcessSelector::Pid(pid) => format!("process {pid}"),
        ProcessSelector::Tag(tag) => format!("process tagged {tag:?}"),
    }
}

async fn serve(agent: Arc<Agent>, ctrl: OwnedFd) {
    if let Err(e) = sys::set_nonblocking(ctrl.as_raw_fd(), true) {
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
            Ok(Control::Handoff) => {
                if let Some(fd) = fds.pop() {
                    serve_connection(agent.clone(), fd);
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
                let error = freeze().await.err().map(|e| e.to_body());
                send_control(&ctrl, &Control::Reply { req, error }, None).await;
            }
            Ok(Control::Thaw { req }) => {
                thaw();
                send_control(&ctrl, &Control::Reply { req, error: None }, None).await;
            }
            Ok(Control::Stop { req }) => {
                let error = stop_all(&agent).await.err().map(|e| e.to_body());
                send_control(&ctrl, &Control::Reply { req, error }, None).await;
            }
            _ => {}
        }
    }
}

fn serve_connection(agent: Arc<Agent>, fd: OwnedFd) {
    let std_stream = std::os::unix::net::UnixStream::from(fd);
    if std_stream.set_nonblocking(true).is_err() {
        return;
    }
    let Ok(stream) = UnixStream::from_std(std_stream) else {
        return;
    };
    tokio::spawn(async move {
        let mut stream = stream;
        let request = match proto::read_frame::<_, Request>(&mut stream).await {
            Ok(Some((request, _))) => request,
            Ok(None) => return,
            Err(e) => {
                let _ = proto::write_frame(&mut stream, &Reply::error(&e), &[]).await;
                return;
            }
        };
        if let Err(e) = handle(&agent, &mut stream, request).await {
            let _ = proto::write_frame(&mut stream, &Reply::error(&e), &[]).await;
        }
        let _ = stream.shutdown().await;
    });
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

async fn handle(agent: &Arc<Agent>, stream: &mut UnixStream, request: Request) -> Result<()> {
    match request {
        Request::Spawn { spec } => {
            let (proc_, rx) = spawn_process(agent, spec)?;
            proto::write_frame(stream, &Reply::Started { pid: proc_.pid }, &[]).await?;
            forward_events(stream, rx).await
        }
        Request::Attach { process } => {
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
            proto::write_frame(stream, &Reply::Started { pid: proc_.pid }, &[]).await?;
            if gap != [0, 0] {
                let reply = Reply::Gap {
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
            proto::write_frame(stream, &Reply::Live, &[]).await?;
            if let Some(status) = exit {
                return proto::write_frame(stream, &Reply::Exit { status }, &[]).await;
            }
            forward_events(stream, rx).await
        }
        Request::WriteStdin { process } => {
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
        Request::CloseStdin { process } => {
            let proc_ = agent.find(&process)?;
            proc_.stdin.lock().await.take();
            done(stream).await
        }
        Request::Signal { process, signal } => {
            let proc_ = agent.find(&process)?;
            let current = {
                let mut st = proc_.state.lock().unwrap_or_else(|e| e.into_inner());
                if st.info.exit.is_some() {
                    return Err(Error::not_found(format!("running {}", describe(&process))));
                }
                // Any signal but stop/continue is a request to end it: no restart after.
                if !matches!(signal, crate::Signal::Stop | crate::Signal::Cont) {
                    st.stop_requested = true;
                }
                st.info.current_pid as i32
            };
            sys::kill(-current, signal.number())
                .or_else(|_| sys::kill(current, signal.number()))
                .map_err(|e| Error::from_io(&e, &describe(&process)))?;
            done(stream).await
        }
        Request::ListProcesses => {
            let processes = agent.process_list();
            proto::write_frame(stream, &Reply::Processes { processes }, &[]).await
        }
        Request::ReadFile { path, options } => read_file(agent, stream, &path, options.user).await,
        Request::WriteFile { path, options } => write_file(agent, stream, &path, options).await,
        Request::ListDir { path, options } => {
            let rec = agent.record.clone();
            let user = options.user.clone();
            let entries = as_user(&agent.record, user, move || {
                files::list_dir(&rec, &path, options)
            })
            .await?;
            proto::write_frame(stream, &Reply::Entries { entries }, &[]).await
        }
        Request::Stat { path, options } => {
            let rec = agent.record.clone();
            let stat = as_user(&agent.record, options.user, move || {
                files::stat(&rec, &path)
            })
            .await?;
            proto::write_frame(stream, &Reply::Stat { stat }, &[]).await
        }
        Request::Mkdir { path, options } => {
            let rec = agent.record.clone();
            let stat = blocking(move || files::mkdir(&rec, &path, options)).await?;
            proto::write_frame(stream, &Reply::Stat { stat }, &[]).await
        }
        Request::Remove { path, options } => {
            let rec = agent.record.clone();
            blocking(move || files::remove(&rec, &path, options.recursive)).await?;
            done(stream).await
        }
        Request::Rename { from, to } => {
            let rec = agent.record.clone();
            let stat = blocking(move || files::rename(&rec, &from, &to)).await?;
            proto::write_frame(stream, &Reply::Stat { stat }, &[]).await
        }
        Request::Chmod { path, mode } => {
            let rec = agent.record.clone();
            let stat = blocking(move || files::chmod(&rec, &path, mode)).await?;
            proto::write_frame(stream, &Reply::Stat { stat }, &[]).await
        }
        Request::Metrics => {
            let metrics = blocking(move || Ok(sample_metrics())).await?;
            proto::write_frame(stream, &Reply::Metrics { metrics }, &[]).await
        }
        Request::ResizePty { process, size } => {
            let proc_ = agent.find(&process)?;
            let stdin = proc_.stdin.lock().await;
            match stdin.as_ref() {
                Some(Stdin::Pty(master)) => {
                    sys::set_winsize(master.as_raw_fd(), size.cols, size.rows)
                        .map_err(|e| Error::from_io(&e, "resize the terminal"))?
                }
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
        Request::Watch { path, options } => watch(agent, stream, &path, options).await,
        Request::ExportFs => export_fs(agent, stream).await,
        Request::ImportFs => import_fs(agent, stream).await,
        Request::Info
        | Request::Destroy
        | Request::SetTimeout { .. }
        | Request::SetLabels { .. }
        | Request::UpdateAnnotations { .. }
        | Request::Stop
        | Request::Start
        | Request::Pause
        | Request::Resume
        | Request::Expose { .. }
        | Request::ListPreviews
        | Request::ClosePreview { .. }
        | Request::CreateToken { .. } => Err(Error::backend("monitor request sent to the agent")),
    }
}

/// The next chunk of an upload (`Data` frames ended by `End`); `None` at the end marker.
async fn read_data_frame(stream: &mut UnixStream) -> Result<Option<Vec<u8>>> {
    match proto::read_frame::<_, Reply>(stream).await? {
        Some((Reply::Data, body)) => Ok(Some(body)),
        Some((Reply::End, _)) => Ok(None),
        Some((other, _)) => Err(Error::backend(format!(
            "protocol error: unexpected {other:?} in an upload"
        ))),
        None => Err(Error::backend("upload ended before its end marker")),
    }
}

async fn done(stream: &mut UnixStream) -> Result<()> {
    proto::write_frame(stream, &Reply::Done, &[]).await
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
    if (u.uid, u.gid) == (0, 0) {
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

async fn write_output(stream: &mut UnixStream, kind: StreamKind, bytes: &[u8]) -> Result<()> {
    let header = match kind {
        StreamKind::Stdout => Reply::Stdout,
        StreamKind::Stderr => Reply::Stderr,
    };
    for chunk in bytes.chunks(CHUNK) {
        proto::write_frame(stream, &header, chunk).await?;
    }
    Ok(())
}

/// Write one history entry (output or a restart).
async fn write_event(stream: &mut UnixStream, ev: &Event) -> Result<()> {
    match ev {
        Event::Output(kind, bytes) => write_output(stream, *kind, bytes).await,
        Event::Restarted {
            pid,
            restarts,
            previous,
        } => {
            let reply = Reply::Restarted {
                pid: *pid,
                restarts: *restarts,
                previous: *previous,
            };
            proto::write_frame(stream, &reply, &[]).await
        }
        Event::Exit(status) => {
            proto::write_frame(stream, &Reply::Exit { status: *status }, &[]).await
        }
    }
}

async fn forward_events(stream: &mut UnixStream, mut rx: mpsc::Receiver<Event>) -> Result<()> {
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Output(kind, bytes) => write_output(stream, kind, &bytes).await?,
            ev @ Event::Restarted { .. } => write_event(stream, &ev).await?,
            Event::Exit(status) => {
                return proto::write_frame(stream, &Reply::Exit { status }, &[]).await;
            }
        }
    }
    Err(Error::backend(
        "process event stream ended without an exit status",
    ))
}

// ---------------------------------------------------------------------------------------------
// Processes
// ---------------------------------------------------------------------------------------------

fn spawn_process(
    agent: &Arc<Agent>,
    spec: ProcessSpec,
) -> Result<(Arc<Proc>, mpsc::Receiver<Event>)> {
    spec.validate()?;
    let record = &agent.record;
    record.user(spec.user.as_deref())?;
    if let Some(tag) = &spec.tag {
        let table = agent.procs.lock().unwrap_or_else(|e| e.into_inner());
        let taken = table.by_pid.values().any(|p| {
            let st = p.state.lock().unwrap_or_else(|e| e.into_inner());
            st.info.tag.as_deref() == Some(tag.as_str()) && st.info.exit.is_none()
        });
        if taken {
            return Err(Error::AlreadyExists {
                what: format!("running process tagged {tag:?}"),
            });
        }
    }
    let inc = launch(agent, &spec)?;
    let (tx, rx) = mpsc::channel(64);
    let pid = inc.pid;
    let proc_ = Arc::new(Proc {
        pid,
        state: Mutex::new(ProcState {
            info: ProcessInfo {
                pid,
                tag: spec.tag.clone(),
                argv: inc.argv.clone(),
                cwd: inc.cwd.clone(),
                envs: spec.envs.clone(),
                started_at: now_millis(),
                exit: None,
                ended_at: None,
                current_pid: pid,
                restarts: 0,
                restart: spec.restart,
            },
            history: VecDeque::new(),
            history_bytes: 0,
            dropped: [0, 0],
            subscribers: vec![tx],
            timed_out: false,
            stop_requested: false,
        }),
        stdin: tokio::sync::Mutex::new(inc.stdin),
    });
    agent
        .procs
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .by_pid
        .insert(pid, proc_.clone());
    if let Some(timeout) = spec.timeout {
        let p = proc_.clone();
        tokio::spawn(async move {
            tokio::time::sleep(timeout).await;
            let mut st = p.state.lock().unwrap_or_else(|e| e.into_inner());
            if st.info.exit.is_none() {
                st.timed_out = true;
                let current = st.info.current_pid as i32;
                drop(st);
                let _ = sys::kill(-current, libc::SIGKILL);
                let _ = sys::kill(current, libc::SIGKILL);
            }
        });
    }
    let first = Streams {
        stdout: inc.stdout,
        stderr: inc.stderr,
        exit_rx: inc.exit_rx,
    };
    tokio::spawn(supervise(agent.clone(), proc_.clone(), spec, first));
    Ok((proc_, rx))
}

/// One started incarnation of a process: its pid, the ends of its stdio and its exit.
struct Incarnation {
    pid: u32,
    argv: Vec<String>,
    cwd: String,
    stdout: Option<Source>,
    stderr: Option<Source>,
    stdin: Option<Stdin>,
    exit_rx: oneshot::Receiver<ExitStatus>,
}

/// What [`pump`] reads for one incarnation.
struct Streams {
    stdout: Option<Source>,
    stderr: Option<Source>,
    exit_rx: oneshot::Receiver<ExitStatus>,
}

/// Start one incarnation of `spec` (the first, or a restart) and register for its exit.
fn launch(agent: &Arc<Agent>, spec: &ProcessSpec) -> Result<Incarnation> {
    let record = &agent.record;
    let user = record.user(spec.user.as_deref())?.clone();
    let cwd = match &spec.cwd {
        Some(c) => resolve(record, c)?,
        None => host_path(record, Path::new(&user.home)),
    };
    // Resolved like every file call (beneath the sandbox root, no magic links, not /proc), and
    // entered through that descriptor: the child changes into exactly the directory checked
    // (before it drops privileges), whatever the path names by then.
    let cwd_fd = {
        let shown = spec.cwd.clone().unwrap_or_else(|| user.home.clone());
        let root = files::open_root(record)?;
        // Errors keep naming the working directory (facades map a missing one specially).
        let subject = format!("working directory {}", cwd.display());
        match files::open_dir(&root, record, &shown) {
            Ok((fd, _)) => fd,
            Err(e) if e.is_not_found() => return Err(Error::not_found(subject)),
            Err(Error::InvalidArgument { .. }) => {
                return Err(Error::invalid(format!("{subject} is not a directory")))
            }
            Err(e) => return Err(e),
        }
    };
    let argv = spec.command.to_argv();
    let mut envs: BTreeMap<String, String> = BTreeMap::new();
    envs.insert("PATH".into(), DEFAULT_PATH.into());
    envs.insert(
        "HOME".into(),
        host_path(record, Path::new(&user.home))
            .to_string_lossy()
            .into_owned(),
    );
    envs.insert("USER".into(), user.name.clone());
    envs.insert("LOGNAME".into(), user.name.clone());
    envs.insert("SHELL".into(), "/bin/bash".into());
    envs.insert("LANG".into(), "C.UTF-8".into());
    envs.insert("PWD".into(), cwd.to_string_lossy().into_owned());
    envs.extend(record.options.envs.clone());
    envs.extend(spec.envs.clone());

    if spec.pty.is_some() {
        envs.entry("TERM".into())
            .or_insert_with(|| "xterm-256color".into());
    }
    let mut cmd = std::process::Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .env_clear()
        .envs(&envs)
        .current_dir(format!("/proc/self/fd/{}", cwd_fd.as_raw_fd()));
    let mut pty_master = None;
    if let Some(size) = spec.pty {
        let (master, slave) = sys::openpty(size.cols, size.rows)
            .map_err(|e| Error::from_io(&e, "open a pseudo-terminal"))?;
        let clone = |fd: &OwnedFd| {
            fd.try_clone()
                .map_err(|e| Error::from_io(&e, "pseudo-terminal"))
        };
        cmd.stdin(std::process::Stdio::from(clone(&slave)?))
            .stdout(std::process::Stdio::from(clone(&slave)?))
            .stderr(std::process::Stdio::from(slave));
        pty_master = Some(master);
    } else {
        cmd.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .stdin(if spec.stdin {
                std::process::Stdio::piped()
            } else {
                std::process::Stdio::null()
            });
    }
    let with_tty = pty_master.is_some();
    let (uid, gid) = (user.uid, user.gid);
    // A default above the host's hard limit (which no process in a user namespace can
    // raise) is clamped to it; an explicit request above it is refused with the reason.
    let limit = |resource, wanted: u64, explicit: bool, what: &str| -> Result<u64> {
        let hard = sys::hard_rlimit(resource).unwrap_or(u64::MAX);
        match (wanted > hard, explicit) {
            (false, _) => Ok(wanted),
            (true, false) => Ok(hard),
            (true, true) => Err(Error::invalid(format!(
                "{what} of {wanted} exceeds this host's hard limit of {hard}"
            ))),
        }
    };
    let res = &record.options.resources;
    let nproc = limit(
        libc::RLIMIT_NPROC,
        record.max_processes(),
        res.max_processes.is_some(),
        "max_processes",
    )?;
    let nofile = limit(
        libc::RLIMIT_NOFILE,
        record.max_open_files(),
        res.max_open_files.is_some(),
        "max_open_files",
    )?;
    let isolated = !record.unisolated;
    let filters = super::seccomp::filters()?;
    // SAFETY: the closure runs between fork and exec and only makes async-signal-safe
    // syscalls (no allocation, no locks; the filters were compiled before the fork).
    unsafe {
        cmd.pre_exec(move || {
            // Only stdio reaches the program: every other descriptor closes at exec.
            sys::cloexec_from(3)?;
            if isolated {
                // Undo the agent's OOM protection (see the monitor): sandbox processes are
                // what a sandbox at its memory limit gives up.
                let _ = sys::set_oom_score_adj(0);
                sys::harden_child(uid, gid, nproc, nofile)?;
                super::seccomp::apply(filters)?;
            } else {
                sys::setsid()?;
                // The one limit that stays per process without a user namespace.
                sys::setrlimit(libc::RLIMIT_NOFILE, nofile)?;
            }
            if with_tty {
                sys::set_controlling_tty()?;
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            Error::not_found(format!("program {:?}", argv[0]))
        } else {
            Error::from_io(&e, &format!("start {:?}", argv[0]))
        }
    })?;
    let pid = child.id();
    let (stdout, stderr, stdin) = if let Some(master) = pty_master {
        sys::set_nonblocking(master.as_raw_fd(), true)
            .map_err(|e| Error::from_io(&e, "pseudo-terminal"))?;
        let master =
            Arc::new(sys::async_fd(master).map_err(|e| Error::from_io(&e, "pseudo-terminal"))?);
        (
            Some(Source::Pty(master.clone())),
            None,
            Some(Stdin::Pty(master)),
        )
    } else {
        let stdout = child.stdout.take().map(pipe_receiver).transpose()?;
        let stderr = child.stderr.take().map(pipe_receiver).transpose()?;
        let stdin = match child.stdin.take() {
            Some(s) => Some(Stdin::Pipe(
                tokio::net::unix::pipe::Sender::from_owned_fd(OwnedFd::from(s))
                    .map_err(|e| Error::from_io(&e, "stdin pipe"))?,
            )),
            None => None,
        };
        (stdout, stderr, stdin)
    };
    // `child` is dropped without waiting: the reaper owns waiting for every pid.
    drop(child);
    let (exit_tx, exit_rx) = oneshot::channel();
    agent
        .procs
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .exit_waiters
        .insert(pid, exit_tx);
    Ok(Incarnation {
        pid,
        argv,
        cwd: cwd.to_string_lossy().into_owned(),
        stdout,
        stderr,
        stdin,
        exit_rx,
    })
}

/// Run a process to its end: pump each incarnation's output, restart it per its policy, then
/// publish the final exit and retire it from the table.
async fn supervise(agent: Arc<Agent>, proc_: Arc<Proc>, spec: ProcessSpec, first: Streams) {
    let mut streams = first;
    let mut status = loop {
        let status = pump(&proc_, streams).await;
        let Some(policy) = spec.restart else {
            break status;
        };
        let restarts = {
            let st = proc_.state.lock().unwrap_or_else(|e| e.into_inner());
            let failed = !status.success() && !st.timed_out && !st.stop_requested;
            let room = policy.max_restarts.is_none_or(|m| st.info.restarts < m);
            if !(failed && room) {
                break status;
            }
            st.info.restarts + 1
        };
        tokio::time::sleep(crate::RESTART_DELAY).await;
        // A stop or a timeout that came during the delay ends it too.
        {
            let st = proc_.state.lock().unwrap_or_else(|e| e.into_inner());
            if st.timed_out || st.stop_requested {
                break status;
            }
        }
        match launch(&agent, &spec) {
            Ok(inc) => {
                {
                    let mut st = proc_.state.lock().unwrap_or_else(|e| e.into_inner());
                    st.info.current_pid = inc.pid;
                    st.info.restarts = restarts;
                }
                *proc_.stdin.lock().await = inc.stdin;
                let ev = Event::Restarted {
                    pid: inc.pid,
                    restarts,
                    previous: status,
                };
                publish(&proc_, ev).await;
                streams = Streams {
                    stdout: inc.stdout,
                    stderr: inc.stderr,
                    exit_rx: inc.exit_rx,
                };
            }
            // The restart itself failed (e.g. the working directory is gone): the process
            // ends with the last incarnation's status, and the reason is in its stderr.
            Err(e) => {
                let line = format!("sandcove: restart failed: {e}\n").into_bytes();
                publish(&proc_, Event::Output(StreamKind::Stderr, Arc::new(line))).await;
                break status;
            }
        }
    };
    {
        let mut st = proc_.state.lock().unwrap_or_else(|e| e.into_inner());
        status.timed_out = st.timed_out;
        st.info.exit = Some(status);
        st.info.ended_at = Some(now_millis());
    }
    proc_.stdin.lock().await.take();
    publish(&proc_, Event::Exit(status)).await;
    proc_
        .state
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .subscribers
        .clear();
    let mut table = agent.procs.lock().unwrap_or_else(|e| e.into_inner());
    table.finished.push_back(proc_.pid);
    while table.finished.len() > FINISHED_KEPT {
        if let Some(old) = table.finished.pop_front() {
            table.by_pid.remove(&old);
        }
    }
}

fn pipe_receiver(fd: impl Into<OwnedFd>) -> Result<Source> {
    tokio::net::unix::pipe::Receiver::from_owned_fd(fd.into())
        .map(Source::Pipe)
        .map_err(|e| Error::from_io(&e, "output pipe"))
}

/// Move one incarnation's output into the history and to the subscribers (with
/// backpressure: a slow subscriber slows the process, never loses bytes); return its exit.
async fn pump(proc_: &Proc, streams: Streams) -> ExitStatus {
    let mut out = streams.stdout;
    let mut err = streams.stderr;
    let mut exit_rx = Some(streams.exit_rx);
    let mut exit: Option<ExitStatus> = None;
    let mut buf_out = vec![0u8; 64 * 1024];
    let mut buf_err = vec![0u8; 64 * 1024];
    // Set once, when the process exits: a descendant that keeps writing to inherited pipes
    // cannot hold the exit back by restarting a per-read wait.
    let mut drain_until: Option<tokio::time::Instant> = None;
    loop {
        if out.is_none() && err.is_none() && exit.is_some() {
            break;
        }
        if exit.is_some() && drain_until.is_none() {
            drain_until = Some(tokio::time::Instant::now() + DRAIN_AFTER_EXIT);
        }
        let step = async {
            tokio::select! {
                n = read_some(&mut out, &mut buf_out) => Step::Read(StreamKind::Stdout, n),
                n = read_some(&mut err, &mut buf_err) => Step::Read(StreamKind::Stderr, n),
                status = wait_exit(&mut exit_rx) => Step::Exited(status),
            }
        };
        let result = if let Some(deadline) = drain_until {
            match tokio::time::timeout_at(deadline, step).await {
                Ok(r) => r,
                Err(_) => break, // a descendant holds the pipes; stop draining
            }
        } else {
            step.await
        };
        match result {
            Step::Exited(status) => exit = Some(status),
            Step::Read(kind, 0) => match kind {
                StreamKind::Stdout => out = None,
                StreamKind::Stderr => err = None,
            },
            Step::Read(kind, n) => {
                let bytes = match kind {
                    StreamKind::Stdout => &buf_out[..n],
                    StreamKind::Stderr => &buf_err[..n],
                };
                publish(proc_, Event::Output(kind, Arc::new(bytes.to_vec()))).await;
            }
        }
    }
    exit.unwrap_or(ExitStatus {
        code: None,
        signal: None,
        timed_out: false,
    })
}

enum Step {
    Read(StreamKind, usize),
    Exited(ExitStatus),
}

/// Read from a source; a read error counts as end of stream. Never ready once it is gone.
async fn read_some(source: &mut Option<Source>, buf: &mut [u8]) -> usize {
    match source {
        Some(s) => s.read(buf).await,
        None => std::future::pending().await,
    }
}

async fn wait_exit(rx: &mut Option<oneshot::Receiver<ExitStatus>>) -> ExitStatus {
    match rx {
        Some(r) => {
            let status = r.await.unwrap_or(ExitStatus {
                code: None,
                signal: None,
                timed_out: false,
            });
            *rx = None;
            status
        }
        None => std::future::pending().await,
    }
}

async fn publish(proc_: &Proc, ev: Event) {
    let subscribers = {
        let mut st = proc_.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Event::Output(_, bytes) = &ev {
            st.history_bytes += bytes.len();
        }
        if !matches!(ev, Event::Exit(_)) {
            st.history.push_back(ev.clone());
        }
        while st.history_bytes > HISTORY_BYTES {
            let Some(old) = st.history.pop_front() else {
                break;
            };
            if let Event::Output(k, old) = old {
                st.history_bytes -= old.len();
                st.dropped[k as usize] += old.len() as u64;
            }
        }
        st.subscribers.clone()
    };
    let mut gone = Vec::new();
    for (i, sub) in subscribers.iter().enumerate() {
        if sub.send(ev.clone()).await.is_err() {
            gone.push(i);
        }
    }
    if !gone.is_empty() {
        let mut st = proc_.state.lock().unwrap_or_else(|e| e.into_inner());
        st.subscribers.retain(|s| !s.is_closed());
    }
}

// ---------------------------------------------------------------------------------------------
// Files. The file API itself is in `files.rs` (every call resolved beneath a descriptor of
// the sandbox root); here are the process working directory and the streaming halves.
// ---------------------------------------------------------------------------------------------

/// The agent-side path for a sandbox path (relative paths start at the default home).
///
/// Isolated, that is the path itself: the agent's root is the sandbox root. Un-isolated (the
/// explicit opt-in), sandbox paths live under a host directory; `..` is clamped there, and the
/// directory actually entered is resolved beneath it by the file API (symlinks included).
fn resolve(record: &Record, path: &str) -> Result<PathBuf> {
    if path.is_empty() {
        return Err(Error::invalid("empty path"));
    }
    if path.contains('\0') {
        return Err(Error::invalid("path contains a NUL byte"));
    }
    let p = Path::new(path);
    let full = if p.is_absolute() {
        p.to_path_buf()
    } else {
        Path::new(&record.default_user().home).join(p)
    };
    Ok(host_path(record, &full))
}

/// Map an absolute sandbox path onto the agent's filesystem.
fn host_path(record: &Record, sandbox_path: &Path) -> PathBuf {
    let Some(prefix) = &record.root_prefix else {
        return sandbox_path.to_path_buf();
    };
    let mut parts: Vec<&std::ffi::OsStr> = Vec::new();
    for c in sandbox_path.components() {
        match c {
            std::path::Component::Normal(n) => parts.push(n),
            std::path::Component::ParentDir => {
                parts.pop();
            }
            _ => {}
        }
    }
    parts
        .iter()
        .fold(PathBuf::from(prefix), |acc, p| acc.join(p))
}

/// Read a regular file and stream it, ending at the size it had when opened (a file that
/// keeps growing, or lies about its end, is cut there).
async fn read_file(
    agent: &Arc<Agent>,
    stream: &mut UnixStream,
    path: &str,
    user: Option<String>,
) -> Result<()> {
    let (rec, p) = (agent.record.clone(), path.to_string());
    // Opening can block (a lease held by sandbox code), so it runs off the event loop; as a
    // user, the open is where the kernel checks that user's permissions.
    let (file, size) = as_user(&agent.record, user, move || files::open_for_read(&rec, &p)).await?;
    let mut file = tokio::fs::File::from_std(file).take(size);
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = file
            .read(&mut buf)
            .await
            .map_err(|e| Error::from_io(&e, path))?;
        if n == 0 {
            break;
        }
        proto::write_frame(stream, &Reply::Data, &buf[..n]).await?;
    }
    proto::write_frame(stream, &Reply::End, &[]).await
}

/// Write a file from an upload: into a fresh temporary file beside the target, renamed over
/// it at the end, so a cut-off upload never leaves a half-written file in place (an append
/// writes in place). On failure the temporary file is removed before the error is returned.
async fn write_file(
    agent: &Arc<Agent>,
    stream: &mut UnixStream,
    path: &str,
    options: WriteOptions,
) -> Result<()> {
    let (rec, p) = (agent.record.clone(), path.to_string());
    let user = options.user.clone();
    let pending = as_user(&agent.record, user.clone(), move || {
        files::begin_write(&rec, &p, &options)
    })
    .await?;
    let mut file = tokio::fs::File::from_std(pending.file.try_clone().map_err(|e| {
        pending.discard();
        Error::from_io(&e, path)
    })?);
    let result: Result<()> = async {
        while let Some(body) = read_data_frame(stream).await? {
            file.write_all(&body)
                .await
                .map_err(|e| Error::from_io(&e, path))?;
        }
        file.flush().await.map_err(|e| Error::from_io(&e, path))?;
        Ok(())
    }
    .await;
    drop(file);
    let (rec, p) = (agent.record.clone(), path.to_string());
    let stat = as_user(&agent.record, user, move || match result {
        Ok(()) => pending.finish(&rec, &p),
        Err(e) => {
            pending.discard();
            Err(e)
        }
    })
    .await?;
    proto::write_frame(stream, &Reply::Stat { stat }, &[]).await
}

// ---------------------------------------------------------------------------------------------
// Metrics, watches, filesystem export/import
// ---------------------------------------------------------------------------------------------

/// CPU time (ticks) per pid at the previous sample, to turn totals into a rate.
static LAST_CPU: Mutex<Option<(std::time::Instant, u64)>> = Mutex::new(None);

fn sample_metrics() -> Metrics {
    let page = sys::page_size();
    let mut ticks = 0u64;
    let mut rss = 0u64;
    for pid in sandbox_pids() {
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            if let Some((_, rest)) = stat.rsplit_once(')') {
                let fields: Vec<&str> = rest.split_whitespace().collect();
                // After the command: state is field 0; utime 11, stime 12, rss 21.
                let num = |i: usize| {
                    fields
                        .get(i)
                        .and_then(|v| v.parse::<u64>().ok())
                        .unwrap_or(0)
                };
                ticks += num(11) + num(12);
                rss += num(21) * page;
            }
        }
    }
    let now = std::time::Instant::now();
    let mut last = LAST_CPU.lock().unwrap_or_else(|e| e.into_inner());
    let cpu_used_pct = match *last {
        Some((then, before)) if now > then => {
            let secs = now.duration_since(then).as_secs_f64();
            let used = ticks.saturating_sub(before) as f64 / sys::clock_ticks() as f64;
            (used / secs * 100.0).max(0.0)
        }
        _ => 0.0,
    };
    *last = Some((now, ticks));
    let mem_total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .unwrap_or(0)
        * 1024;
    let (disk_total, disk_free) = sys::fs_usage(Path::new("/")).unwrap_or((0, 0));
    Metrics {
        timestamp: now_millis(),
        cpu_used_pct,
        cpu_count: std::thread::available_parallelism()
            .map(|n| n.get() as u32)
            .unwrap_or(1),
        mem_used: rss,
        mem_total,
        disk_used: disk_total.saturating_sub(disk_free),
        disk_total,
    }
}

const WATCH_MASK: u32 = libc::IN_CREATE
    | libc::IN_MODIFY
    | libc::IN_CLOSE_WRITE
    | libc::IN_DELETE
    | libc::IN_MOVED_FROM
    | libc::IN_MOVED_TO
    | libc::IN_ATTRIB
    | libc::IN_DELETE_SELF
    | libc::IN_ONLYDIR;

/// Directories under watch: watch descriptor → root-relative path.
type Watched = HashMap<i32, PathBuf>;

/// Add a watch on a held directory (through our own `/proc/self/fd`, so the watch lands on
/// that directory, never on what a path names now) and, when `recursive`, on every directory
/// below it (opened by descriptor, no links, not into /proc). Returns the entries found below
/// (for reporting what was created before the watch existed).
fn watch_tree(
    inotify: std::os::fd::RawFd,
    top: OwnedFd,
    rel: PathBuf,
    recursive: bool,
    dirs: &mut Watched,
) -> Vec<(PathBuf, bool)> {
    let mut found = Vec::new();
    let mut queue = VecDeque::from([(top, rel)]);
    while let Some((dir, rel)) = queue.pop_front() {
        let by_fd = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()));
        if let Ok(wd) = sys::inotify_add_watch(inotify, &by_fd, WATCH_MASK) {
            dirs.insert(wd, rel.clone());
        }
        if !recursive {
            continue;
        }
        let Ok(read) = std::fs::read_dir(&by_fd) else {
            continue;
        };
        let mut names: Vec<_> = read.flatten().map(|e| e.file_name()).collect();
        names.sort();
        for name in names {
            let child = rel.join(&name);
            // Not following a final symlink: `by_fd` is the held directory itself.
            let written = std::fs::symlink_metadata(by_fd.join(&name))
                .is_ok_and(|m| m.is_file() && m.len() > 0);
            if let Some(sub) = files::open_subdir(&dir, &name) {
                queue.push_back((sub, child.clone()));
            }
            found.push((child, written));
        }
    }
    found
}

/// Watch a directory with inotify, streaming events until the client goes away.
async fn watch(
    agent: &Arc<Agent>,
    stream: &mut UnixStream,
    path: &str,
    options: WatchOptions,
) -> Result<()> {
    let fd = sys::inotify_init().map_err(|e| Error::from_io(&e, "inotify"))?;
    let (rec, p, raw) = (agent.record.clone(), path.to_string(), fd.as_raw_fd());
    let recursive = options.recursive;
    // Resolving and scanning touch the filesystem: off the event loop. (`fd` outlives the
    // closure: it is awaited here.)
    let (root, mut dirs) = blocking(move || {
        let sandbox_root = files::open_root(&rec)?;
        let (top, rel) = files::open_dir(&sandbox_root, &rec, &p)?;
        let mut dirs = Watched::new();
        watch_tree(raw, top, rel.clone(), recursive, &mut dirs);
        Ok((rel, dirs))
    })
    .await?;
    let fd = sys::async_fd(fd).map_err(|e| Error::from_io(&e, "inotify"))?;
    done(stream).await?;
    let (mut rd, mut wr) = stream.split();
    let mut buf = vec![0u8; 64 * 1024];
    let mut probe = [0u8; 1];
    // API writes in flight: target path → whether the target existed when the write began.
    let mut api_writes: HashMap<PathBuf, bool> = HashMap::new();
    let event_of = |changed: &Path, kind: FsEventKind| FsEvent {
        path: files::encode_name(Path::new("/").join(changed).as_os_str()),
        name: changed
            .strip_prefix(&root)
            .map(|p| files::encode_name(p.as_os_str()))
            .unwrap_or_default(),
        kind,
    };
    loop {
        tokio::select! {
            // The client closing its side ends the watch.
            r = rd.read(&mut probe) => {
                if matches!(r, Ok(0) | Err(_)) {
                    return Ok(());
                }
            }
            ready = fd.readable() => {
                let Ok(mut guard) = ready else { return Ok(()) };
                let n = match guard.try_io(|f| sys::read_fd(f.as_raw_fd(), &mut buf)) {
                    Ok(Ok(n)) => n,
                    Ok(Err(_)) => return Ok(()),
                    Err(_would_block) => continue,
                };
                for ev in sys::parse_inotify(&buf[..n]) {
                    let Some(dir) = dirs.get(&ev.wd).cloned() else { continue };
                    let full = if ev.name.is_empty() { dir.clone() } else { dir.join(&ev.name) };
                    // An API write goes through a temporary file renamed over its target: hide
                    // the temporary file, and report the landing as what it is for the target
                    // (a create and a write, or a write).
                    if let Some((target, existed)) = files::temp_target(&ev.name) {
                        let target = dir.join(target);
                        if ev.mask & libc::IN_CREATE != 0 {
                            api_writes.insert(target, existed);
                        } else if ev.mask & libc::IN_DELETE != 0 {
                            api_writes.remove(&target);
                        }
                        continue;
                    }
                    let landed = if ev.mask & libc::IN_MOVED_TO != 0 {
                        api_writes.remove(&full)
                    } else {
                        None
                    };
                    if let Some(existed) = landed {
                        let mut kinds = vec![FsEventKind::Write];
                        if !existed {
                            kinds.insert(0, FsEventKind::Create);
                        }
                        for kind in kinds {
                            let event = event_of(&full, kind);
                            if proto::write_frame(&mut wr, &Reply::FsEvent { event }, &[]).await.is_err() {
                                return Ok(());
                            }
                        }
                        continue;
                    }
                    let kind = if ev.mask & libc::IN_CREATE != 0 {
                        FsEventKind::Create
                    } else if ev.mask & (libc::IN_MODIFY | libc::IN_CLOSE_WRITE) != 0 {
                        if ev.mask & libc::IN_CLOSE_WRITE != 0 {
                            // A write is already reported on modify; close adds nothing.
                            continue;
                        }
                        FsEventKind::Write
                    } else if ev.mask & (libc::IN_DELETE | libc::IN_DELETE_SELF) != 0 {
                        FsEventKind::Remove
                    } else if ev.mask & (libc::IN_MOVED_FROM | libc::IN_MOVED_TO) != 0 {
                        FsEventKind::Rename
                    } else if ev.mask & libc::IN_ATTRIB != 0 {
                        FsEventKind::Chmod
                    } else {
                        continue;
                    };
                    let mut changes = vec![(full.clone(), kind)];
                    if options.recursive
                        && ev.mask & libc::IN_ISDIR != 0
                        && ev.mask & (libc::IN_CREATE | libc::IN_MOVED_TO) != 0
                    {
                        // Watch the new directory, then report what was already created in it
                        // before the watch existed (a `mkdir -p a/b && touch a/b/f` race).
                        // Opened beneath its watched parent without following links, off the
                        // event loop.
                        let (rec, name, raw) = (agent.record.clone(), ev.name.clone(), fd.as_raw_fd());
                        let (parent, new_rel) = (dir.clone(), full.clone());
                        let scanned = blocking(move || {
                            let sandbox_root = files::open_root(&rec)?;
                            let parent = files::open_dir(
                                &sandbox_root,
                                &rec,
                                &files::encode_name(Path::new("/").join(&parent).as_os_str()),
                            )?;
                            let mut added = Watched::new();
                            let found = match files::open_subdir(&parent.0, &name) {
                                Some(sub) => watch_tree(raw, sub, new_rel, true, &mut added),
                                None => Vec::new(),
                            };
                            Ok((added, found))
                        })
                        .await;
                        if let Ok((added, found)) = scanned {
                            dirs.extend(added);
                            for (path, written) in found {
                                // An API write caught mid-way: remember it like one seen live,
                                // so its landing is reported as a create and a write.
                                let name = path.file_name().unwrap_or_default();
                                if let Some((target, existed)) = files::temp_target(name) {
                                    let parent = path.parent().unwrap_or(Path::new(""));
                                    api_writes.insert(parent.join(target), existed);
                                    continue;
                                }
                                changes.push((path.clone(), FsEventKind::Create));
                                if written {
                                    changes.push((path, FsEventKind::Write));
                                }
                            }
                        }
                    }
                    for (changed, kind) in changes {
                        let event = event_of(&changed, kind);
                        if proto::write_frame(&mut wr, &Reply::FsEvent { event }, &[]).await.is_err() {
                            return Ok(());
                        }
                    }
                }
            }
        }
    }
}

/// Paths excluded from filesystem export: mounts of host or kernel filesystems and the
/// agent's own files. (`--one-file-system` already keeps tar out of other mounts.)
const EXPORT_EXCLUDES: &[&str] = &[
    "./proc",
    "./dev",
    "./usr",
    "./bin",
    "./sbin",
    "./lib",
    "./lib32",
    "./lib64",
    "./libx32",
    "./etc",
    "./opt",
    "./.sandcove",
];

/// A helper program the agent runs for itself (with its own privileges inside the sandbox).
struct Tool {
    pid: u32,
    stdin: Option<tokio::net::unix::pipe::Sender>,
    stdout: tokio::net::unix::pipe::Receiver,
    stderr: tokio::net::unix::pipe::Receiver,
    exit: oneshot::Receiver<ExitStatus>,
}

/// Start a tool. It is registered with the sandbox reaper before this returns, and the reaper
/// runs on this same single-threaded runtime, so its exit status cannot be missed.
fn spawn_tool(agent: &Agent, argv: &[String], with_stdin: bool) -> Result<Tool> {
    let mut cmd = std::process::Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .env_clear()
        .env("PATH", DEFAULT_PATH)
        .current_dir("/")
        .stdin(if with_stdin {
            std::process::Stdio::piped()
        } else {
            std::process::Stdio::null()
        })
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    // SAFETY: one async-signal-safe syscall between fork and exec.
    unsafe {
        cmd.pre_exec(|| sys::cloexec_from(3));
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| Error::from_io(&e, &format!("start {}", argv[0])))?;
    let (tx, exit) = oneshot::channel();
    agent
        .procs
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .exit_waiters
        .insert(child.id(), tx);
    let pipe_err = |e: std::io::Error| Error::from_io(&e, "tool pipe");
    let stdin = match child.stdin.take() {
        Some(s) => Some(
            tokio::net::unix::pipe::Sender::from_owned_fd(OwnedFd::from(s)).map_err(pipe_err)?,
        ),
        None => None,
    };
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| Error::backend("tool stdout"))?;
    let stderr = child
        .stderr
        .take()
        .ok_or_else(|| Error::backend("tool stderr"))?;
    Ok(Tool {
        pid: child.id(),
        stdin,
        stdout: tokio::net::unix::pipe::Receiver::from_owned_fd(OwnedFd::from(stdout))
            .map_err(pipe_err)?,
        stderr: tokio::net::unix::pipe::Receiver::from_owned_fd(OwnedFd::from(stderr))
            .map_err(pipe_err)?,
        exit,
    })
}

/// Kill a tool and wait until it is reaped (bounded), so an error answered after this leaves
/// no tool running.
async fn end_tool(pid: u32, exit: oneshot::Receiver<ExitStatus>) {
    let _ = sys::kill(pid as i32, libc::SIGKILL);
    let _ = tokio::time::timeout(Duration::from_secs(10), exit).await;
}

/// Collect a tool's stderr in the background (so it never blocks on a full pipe).
fn drain(mut pipe: tokio::net::unix::pipe::Receiver) -> tokio::task::JoinHandle<Vec<u8>> {
    tokio::spawn(async move {
        let mut text = Vec::new();
        let _ = pipe.read_to_end(&mut text).await;
        text
    })
}

/// Stream a tar of the sandbox's own filesystem (the tmpfs root) to the client.
async fn export_fs(agent: &Agent, stream: &mut UnixStream) -> Result<()> {
    let mut argv: Vec<String> = [
        "tar",
        "-C",
        "/",
        "--one-file-system",
        "--numeric-owner",
        "-cf",
        "-",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    argv.extend(EXPORT_EXCLUDES.iter().map(|e| format!("--exclude={e}")));
    argv.push(".".into());
    let mut tool = spawn_tool(agent, &argv, false)?;
    let errors = drain(tool.stderr);
    let mut buf = vec![0u8; CHUNK];
    let copied: Result<()> = async {
        loop {
            let n = tool
                .stdout
                .read(&mut buf)
                .await
                .map_err(|e| Error::from_io(&e, "snapshot"))?;
            if n == 0 {
                return Ok(());
            }
            proto::write_frame(stream, &Reply::Data, &buf[..n]).await?;
        }
    }
    .await;
    if let Err(e) = copied {
        // The client went away (or the pipe broke): end tar before answering.
        end_tool(tool.pid, tool.exit).await;
        return Err(e);
    }
    let status = tool
        .exit
        .await
        .map_err(|_| Error::backend("tar vanished"))?;
    let text = errors.await.unwrap_or_default();
    // tar exits 1 when a file changed while it was read; the archive is still complete.
    if !matches!(status.code, Some(0 | 1)) {
        return Err(Error::backend(format!(
            "tar failed ({status:?}): {}",
            String::from_utf8_lossy(&text).trim()
        )));
    }
    proto::write_frame(stream, &Reply::End, &[]).await
}

/// Unpack a tar streamed by the client into the sandbox root.
async fn import_fs(agent: &Agent, stream: &mut UnixStream) -> Result<()> {
    let argv: Vec<String> = [
        "tar",
        "-C",
        "/",
        "--numeric-owner",
        "--same-permissions",
        "-xf",
        "-",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut tool = spawn_tool(agent, &argv, true)?;
    let errors = drain(tool.stderr);
    let mut input = tool
        .stdin
        .take()
        .ok_or_else(|| Error::backend("tar stdin"))?;
    let mut out = tool.stdout;
    let sink = tokio::spawn(async move {
        let mut ignored = Vec::new();
        let _ = out.read_to_end(&mut ignored).await;
    });
    let fed: Result<()> = async {
        while let Some(chunk) = read_data_frame(stream).await? {
            input
                .write_all(&chunk)
                .await
                .map_err(|e| Error::from_io(&e, "restore"))?;
        }
        Ok(())
    }
    .await;
    drop(input);
    if let Err(e) = fed {
        // The archive broke off: end tar before answering, so nothing keeps unpacking.
        end_tool(tool.pid, tool.exit).await;
        let _ = sink.await;
        return Err(e);
    }
    let status = tool
        .exit
        .await
        .map_err(|_| Error::backend("tar vanished"))?;
    let _ = sink.await;
    let text = errors.await.unwrap_or_default();
    if !status.success() {
        return Err(Error::backend(format!(
            "restoring the snapshot failed ({status:?}): {}",
            String::from_utf8_lossy(&text).trim()
        )));
    }
    done(stream).await
}
