//! Processes: the table of API processes, starting them (with their restart policy),
//! pumping their output into history and to attached clients, and their end.

use super::*;
use std::os::fd::AsFd;

/// The OOM score adjustment of every sandbox process: the maximum, so the kernel ends a
/// sandbox process before the agent at the sandbox's memory limit (the agent's resident
/// size can exceed a small process's), and sandbox processes before the host's own in a
/// host-wide shortage. Sandbox code may lower its own back to 0 (never below without
/// privilege); that exposes only its own sandbox's agent.
const SANDBOX_PROCESS_OOM_SCORE_ADJ: i16 = 1000;

#[derive(Default)]
pub(super) struct ProcTable {
    pub(super) by_pid: HashMap<u32, Arc<Proc>>,
    pub(super) finished: VecDeque<u32>,
    pub(super) exit_waiters: HashMap<u32, oneshot::Sender<ExitStatus>>,
}

/// One process started through the API.
pub(super) struct Proc {
    pub(super) pid: u32,
    pub(super) state: Mutex<ProcState>,
    pub(super) stdin: tokio::sync::Mutex<Option<Stdin>>,
}

/// Where bytes for a process's input go.
pub(super) enum Stdin {
    /// A pipe to its stdin.
    Pipe(tokio::net::unix::pipe::Sender),
    /// The master side of its terminal (shared with the output reader).
    Pty(Arc<tokio::io::unix::AsyncFd<OwnedFd>>),
}

impl Stdin {
    pub(super) async fn write_all(&mut self, data: &[u8]) -> std::io::Result<()> {
        match self {
            Stdin::Pipe(p) => p.write_all(data).await,
            Stdin::Pty(fd) => {
                let mut off = 0;
                while off < data.len() {
                    let mut guard = fd.writable().await?;
                    match guard.try_io(|f| sys::write_fd(f.as_fd(), &data[off..])) {
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
pub(super) enum Source {
    Pipe(tokio::net::unix::pipe::Receiver),
    Pty(Arc<tokio::io::unix::AsyncFd<OwnedFd>>),
}

impl Source {
    /// Read some bytes; 0 at end of stream (a terminal reports EIO once its last user exits).
    pub(super) async fn read(&mut self, buf: &mut [u8]) -> usize {
        match self {
            Source::Pipe(p) => p.read(buf).await.unwrap_or(0),
            Source::Pty(fd) => loop {
                let Ok(mut guard) = fd.readable().await else {
                    return 0;
                };
                match guard.try_io(|f| sys::read_fd(f.as_fd(), buf)) {
                    Ok(Ok(n)) => return n,
                    Ok(Err(_)) => return 0,
                    Err(_would_block) => continue,
                }
            },
        }
    }
}

pub(super) struct ProcState {
    pub(super) info: ProcessInfo,
    /// Output and restarts, oldest first (never the exit).
    pub(super) history: VecDeque<Event>,
    pub(super) history_bytes: usize,
    pub(super) dropped: [u64; 2],
    pub(super) subscribers: Vec<mpsc::Sender<Event>>,
    pub(super) timed_out: bool,
    /// Signalled through the API: a restart policy does not bring it back.
    pub(super) stop_requested: bool,
}

#[derive(Clone)]
pub(super) enum Event {
    Output(StreamKind, Arc<Vec<u8>>),
    Restarted {
        pid: u32,
        restarts: u32,
        previous: ExitStatus,
    },
    Exit(ExitStatus),
}

pub(super) fn spawn_process(
    agent: &Arc<Agent>,
    spec: ProcessSpec,
) -> Result<(Arc<Proc>, mpsc::Receiver<Event>)> {
    spec.validate()?;
    let record = agent.record();
    let record = &*record;
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
pub(super) struct Incarnation {
    pub(super) pid: u32,
    pub(super) argv: Vec<String>,
    pub(super) cwd: String,
    pub(super) stdout: Option<Source>,
    pub(super) stderr: Option<Source>,
    pub(super) stdin: Option<Stdin>,
    pub(super) exit_rx: oneshot::Receiver<ExitStatus>,
}

/// What [`pump`] reads for one incarnation.
pub(super) struct Streams {
    pub(super) stdout: Option<Source>,
    pub(super) stderr: Option<Source>,
    pub(super) exit_rx: oneshot::Receiver<ExitStatus>,
}

/// Start one incarnation of `spec` (the first, or a restart) and register for its exit.
pub(super) fn launch(agent: &Arc<Agent>, spec: &ProcessSpec) -> Result<Incarnation> {
    let record = agent.record();
    let record = &*record;
    let user = record.user(spec.user.as_deref())?.clone();
    // Where the call names no directory: the image's working directory, if it has one (as a
    // container runtime starts there), else the user's home.
    let image_dir = record
        .image
        .as_ref()
        .and_then(|image| image.working_dir.clone())
        .filter(|dir| dir.starts_with('/'));
    let default_dir = image_dir.unwrap_or_else(|| user.home.clone());
    let cwd = match &spec.cwd {
        Some(c) => resolve(record, c)?,
        None => host_path(record, Path::new(&default_dir)),
    };
    // Resolved like every file call (beneath the sandbox root, no magic links, not /proc), and
    // entered through that descriptor: the child changes into exactly the directory checked
    // (before it drops privileges), whatever the path names by then.
    let cwd_fd = {
        let shown = spec.cwd.clone().unwrap_or_else(|| default_dir.clone());
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
    // The image's environment (its PATH first of all) under the sandbox's and the call's.
    if let Some(image) = &record.image {
        envs.extend(
            image
                .env_pairs()
                .map(|(name, value)| (name.to_string(), value.to_string())),
        );
    }
    envs.extend(record.options.envs.clone());
    envs.extend(spec.envs.clone());

    if spec.pty.is_some() {
        envs.entry("TERM".into())
            .or_insert_with(|| "xterm-256color".into());
    }
    // The child's stdio: our ends stay here, theirs are closed once it has started. A
    // process without stdin reads the agent's `/dev/null`, which stays open.
    let mut pty_master = None;
    let (child_stdio, ours): ([Option<OwnedFd>; 3], [Option<OwnedFd>; 3]) =
        if let Some(size) = spec.pty {
            let (master, slave) = sys::openpty(size.cols, size.rows)
                .map_err(|e| Error::from_io(&e, "open a pseudo-terminal"))?;
            let clone = |fd: &OwnedFd| {
                fd.try_clone()
                    .map_err(|e| Error::from_io(&e, "pseudo-terminal"))
            };
            pty_master = Some(master);
            (
                [Some(clone(&slave)?), Some(clone(&slave)?), Some(slave)],
                [None, None, None],
            )
        } else {
            let pipe = || sys::output_pipe().map_err(|e| Error::from_io(&e, "output pipe"));
            let (out_r, out_w) = pipe()?;
            let (err_r, err_w) = pipe()?;
            let (stdin_child, stdin_ours) = if spec.stdin {
                let (r, w) = sys::pipe().map_err(|e| Error::from_io(&e, "stdin pipe"))?;
                (Some(r), Some(w))
            } else {
                (None, None)
            };
            (
                [stdin_child, Some(out_w), Some(err_w)],
                [stdin_ours, Some(out_r), Some(err_r)],
            )
        };
    let null = dev_null()?.as_raw_fd();
    let mut plan = sys::SpawnPlan::new(
        &argv,
        &envs,
        child_stdio
            .each_ref()
            .map(|fd| fd.as_ref().map_or(null, |fd| fd.as_raw_fd())),
        cwd_fd.as_raw_fd(),
    )
    .map_err(|e| Error::from_io(&e, &format!("start {:?}", argv[0])))?;
    let with_tty = pty_master.is_some();
    let (uid, gid) = (user.uid, user.gid);
    // A default above the host's hard limit (which no process in a user namespace can
    // raise) is clamped to it; an explicit request above it is refused with the reason.
    let limit = |resource, wanted: u64, explicit: bool, what: &str| -> Result<u64> {
        let hard = hard_rlimit(resource);
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
    let pod = agent.pod;
    if isolated || pod {
        // The seccomp filter and `no_new_privs` are the agent's own, inherited through the
        // clone (see `seccomp::install`): an agent without them starts nothing. In a pod the
        // container runtime isolates; these need no privilege and still apply.
        super::seccomp::installed()?;
    }
    // The child shares the agent's memory until exec (see `sys::spawn`): this hook only
    // makes raw, async-signal-safe syscalls (no allocation, no locks). Every hardening step
    // of a sandbox process is here, in order.
    let hook = || -> std::io::Result<()> {
        // Only stdio reaches the program: every other descriptor closes at exec.
        sys::cloexec_from(3)?;
        if isolated {
            sys::harden_child(uid, gid, nproc, nofile)?;
        } else {
            sys::setsid()?;
            // The one limit that stays per process without a user namespace.
            sys::setrlimit(libc::RLIMIT_NOFILE, nofile)?;
        }
        if with_tty {
            sys::set_controlling_tty()?;
        }
        Ok(())
    };
    // Sandbox processes are what a sandbox at its memory limit gives up, never its agent:
    // each inherits the highest OOM score from the agent (see `OomScore`), on every host,
    // whatever the agent's size. Without the agent's score file nothing starts.
    let spawned = match (&agent.oom_score, isolated) {
        (_, false) => sys::spawn(&mut plan, hook),
        (Some(score), true) => score.raised_for(SANDBOX_PROCESS_OOM_SCORE_ADJ, || {
            sys::spawn(&mut plan, hook)
        }),
        (None, true) => Err(std::io::Error::other(
            "the agent cannot set the OOM score of sandbox processes",
        )),
    };
    let pid = spawned.map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            Error::not_found(format!("program {:?}", argv[0]))
        } else {
            Error::from_io(&e, &format!("start {:?}", argv[0]))
        }
    })?;
    drop(plan);
    drop(child_stdio);
    let [stdin_ours, stdout_ours, stderr_ours] = ours;
    let (stdout, stderr, stdin) = if let Some(master) = pty_master {
        sys::set_nonblocking(master.as_fd(), true)
            .map_err(|e| Error::from_io(&e, "pseudo-terminal"))?;
        let master =
            Arc::new(sys::async_fd(master).map_err(|e| Error::from_io(&e, "pseudo-terminal"))?);
        (
            Some(Source::Pty(master.clone())),
            None,
            Some(Stdin::Pty(master)),
        )
    } else {
        let stdout = stdout_ours.map(pipe_receiver).transpose()?;
        let stderr = stderr_ours.map(pipe_receiver).transpose()?;
        let stdin = match stdin_ours {
            Some(s) => Some(Stdin::Pipe(
                tokio::net::unix::pipe::Sender::from_owned_fd(s)
                    .map_err(|e| Error::from_io(&e, "stdin pipe"))?,
            )),
            None => None,
        };
        (stdout, stderr, stdin)
    };
    // The reaper owns waiting for every pid.
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
pub(super) async fn supervise(
    agent: Arc<Agent>,
    proc_: Arc<Proc>,
    spec: ProcessSpec,
    first: Streams,
) {
    let mut streams = first;
    // The last incarnation's ended streams: closed after its exit has gone out.
    let mut spent;
    let mut status = loop {
        let (status, ended) = pump(&proc_, streams).await;
        spent = ended;
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
        tokio::time::sleep(sandcove_core::RESTART_DELAY).await;
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
    // The subscribers' writers run first, so the exit reaches the client before the agent
    // spends time closing pipes.
    tokio::task::yield_now().await;
    drop(spent);
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

/// The read end of an output pipe from [`sys::output_pipe`] (already non-blocking).
pub(super) fn pipe_receiver(fd: OwnedFd) -> Result<Source> {
    tokio::net::unix::pipe::Receiver::from_owned_fd_unchecked(fd)
        .map(Source::Pipe)
        .map_err(|e| Error::from_io(&e, "output pipe"))
}

/// The agent's `/dev/null`, opened once: the stdin of processes started without one.
fn dev_null() -> Result<&'static OwnedFd> {
    static NULL: std::sync::OnceLock<OwnedFd> = std::sync::OnceLock::new();
    if let Some(fd) = NULL.get() {
        return Ok(fd);
    }
    let file =
        std::fs::File::open("/dev/null").map_err(|e| Error::from_io(&e, "open /dev/null"))?;
    Ok(NULL.get_or_init(|| OwnedFd::from(file)))
}

/// The agent's hard limit on `resource` (unlimited if unreadable), read once: nothing in
/// the agent changes its own limits, and every process start consults them.
fn hard_rlimit(resource: libc::__rlimit_resource_t) -> u64 {
    static NPROC: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    static NOFILE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let read = || sys::hard_rlimit(resource).unwrap_or(u64::MAX);
    match resource {
        libc::RLIMIT_NPROC => *NPROC.get_or_init(read),
        libc::RLIMIT_NOFILE => *NOFILE.get_or_init(read),
        _ => read(),
    }
}

/// Move one incarnation's output into the history and to the subscribers (with
/// backpressure: a slow subscriber slows the process, never loses bytes); return its exit
/// and the streams it read to their end, for the caller to close.
pub(super) async fn pump(proc_: &Proc, streams: Streams) -> (ExitStatus, Vec<Source>) {
    let mut out = streams.stdout;
    let mut err = streams.stderr;
    let mut exit_rx = Some(streams.exit_rx);
    let mut exit: Option<ExitStatus> = None;
    let (mut buf_out, mut buf_err) = (Vec::new(), Vec::new());
    // Ended streams are closed once the exit is out (see `supervise`), not on its way.
    let mut ended = Vec::new();
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
            Step::Read(kind, 0) => ended.extend(match kind {
                StreamKind::Stdout => out.take(),
                StreamKind::Stderr => err.take(),
            }),
            Step::Read(kind, n) => {
                let bytes = match kind {
                    StreamKind::Stdout => &buf_out[..n],
                    StreamKind::Stderr => &buf_err[..n],
                };
                publish(proc_, Event::Output(kind, Arc::new(bytes.to_vec()))).await;
            }
        }
    }
    let status = exit.unwrap_or(ExitStatus {
        code: None,
        signal: None,
        timed_out: false,
    });
    (status, ended)
}

pub(super) enum Step {
    Read(StreamKind, usize),
    Exited(ExitStatus),
}

/// Read from a source into `buf`, which starts small and grows to [`READ_MAX`] while reads
/// fill it (most commands print little; a busy one gets large reads); a read error counts
/// as end of stream. Never ready once the source is gone.
pub(super) async fn read_some(source: &mut Option<Source>, buf: &mut Vec<u8>) -> usize {
    match source {
        Some(s) => {
            if buf.is_empty() {
                buf.resize(READ_FIRST, 0);
            }
            let n = s.read(buf).await;
            if n == buf.len() && n < READ_MAX {
                buf.resize(n * 4, 0);
            }
            n
        }
        None => std::future::pending().await,
    }
}

/// The first read buffer of an output stream, and the size it grows to.
const READ_FIRST: usize = 4 * 1024;
const READ_MAX: usize = 64 * 1024;

pub(super) async fn wait_exit(rx: &mut Option<oneshot::Receiver<ExitStatus>>) -> ExitStatus {
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

pub(super) async fn publish(proc_: &Proc, ev: Event) {
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
