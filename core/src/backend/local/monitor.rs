//! The monitor: one detached host-side process per sandbox.
//!
//! It owns the agent (its child), enforces the lease, and serves clients on a unix socket in
//! the sandbox's state directory. Lifecycle requests it answers itself; everything else it
//! hands to the agent together with the client's connection, so bytes never pass through it.
//! It holds the sandbox's lock file for its whole life: a state directory whose lock is free
//! belongs to a dead monitor and is collected by the next client.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{UnixListener, UnixStream};

use super::config::{Record, SandboxDir};
use super::proto::{self, Control, Reply, Request};
use super::{agent, sys};
use crate::{now_millis, Error, Result, SandboxInfo, SandboxState};

/// Env var naming the descriptor the monitor reports readiness on.
pub(super) const READY_FD_ENV: &str = "__SANDCOVE_READY_FD";
/// Env var naming the descriptor of the held lock file.
pub(super) const LOCK_FD_ENV: &str = "__SANDCOVE_LOCK_FD";
/// Env var naming the sandbox's state directory.
pub(super) const DIR_ENV: &str = "__SANDCOVE_DIR";

struct Monitor {
    dir: SandboxDir,
    record: Mutex<Record>,
    state: Mutex<SandboxState>,
    agent_pid: libc::pid_t,
    ctrl: OwnedFd,
    deadline_changed: tokio::sync::Notify,
}

/// Entry point of the re-executed binary in the monitor role. Never returns.
pub fn main() -> ! {
    let env_fd = |name: &str| -> Option<RawFd> { std::env::var(name).ok()?.parse().ok() };
    let (Some(ready_fd), Some(lock_fd), Some(dir)) = (
        env_fd(READY_FD_ENV),
        env_fd(LOCK_FD_ENV),
        std::env::var_os(DIR_ENV),
    ) else {
        sys::exit_now(2);
    };
    // SAFETY: the client passed these descriptors to us, open, under these numbers.
    let (ready, lock) = unsafe {
        (
            OwnedFd::from_raw_fd(ready_fd),
            OwnedFd::from_raw_fd(lock_fd),
        )
    };
    // Detach: the client waits for this intermediate process, the monitor lives on as an
    // orphan so the sandbox outlives the program that created it.
    match sys::fork() {
        Ok(0) => {}
        Ok(_) => sys::exit_now(0),
        Err(_) => sys::exit_now(1),
    }
    sys::set_process_name("sandcove-mon");
    let dir = SandboxDir {
        dir: PathBuf::from(dir),
    };
    let mut ready = std::fs::File::from(ready);
    let monitor = match start(&dir) {
        Ok(m) => m,
        Err(e) => {
            let line = serde_json::to_string(&e.to_body()).unwrap_or_default();
            let _ = writeln!(ready, "{line}");
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
    let code = runtime.block_on(async move {
        let listener = match bind(&monitor.dir) {
            Ok(l) => l,
            Err(e) => {
                let line = serde_json::to_string(&e.to_body()).unwrap_or_default();
                let _ = writeln!(ready, "{line}");
                monitor.kill_agent();
                let _ = std::fs::remove_dir_all(&monitor.dir.dir);
                return 1;
            }
        };
        monitor.write_info();
        let _ = writeln!(ready, "ok");
        drop(ready);
        let monitor = Arc::new(monitor);
        run(monitor, listener).await
    });
    drop(lock);
    sys::exit_now(code)
}

fn start(dir: &SandboxDir) -> Result<Monitor> {
    let text = std::fs::read(dir.record()).map_err(|e| Error::from_io(&e, "sandbox record"))?;
    let record: Record = serde_json::from_slice(&text)
        .map_err(|e| Error::backend(format!("bad sandbox record: {e}")))?;
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
        if record.options.network == crate::NetworkPolicy::None {
            f |= libc::CLONE_NEWNET;
        }
        f
    };
    let pid = sys::clone_into_namespaces(flags).map_err(|e| Error::Unavailable {
        reason: format!("cannot create namespaces for the sandbox: {e}"),
        remedy: "enable unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, \
                 user.max_user_namespaces > 0, kernel.apparmor_restrict_unprivileged_userns=0), \
                 or set SANDCOVE_ALLOW_UNISOLATED=1 to run without isolation"
            .into(),
    })?;
    if pid == 0 {
        drop(ctrl);
        drop(sync_write);
        agent::run(record, agent_ctrl, sync_read);
    }
    drop(agent_ctrl);
    drop(sync_read);
    let fail = |e: Error| {
        let _ = sys::kill(pid, libc::SIGKILL);
        let _ = sys::waitpid_blocking(pid);
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
    let mut sync_write = std::fs::File::from(sync_write);
    sync_write.write_all(b"1").map_err(|e| fail(e.into()))?;
    drop(sync_write);
    // Wait for the agent's verdict on its setup.
    let mut buf = vec![0u8; 64 * 1024];
    let (n, _) = sys::recv_with_fds(ctrl.as_raw_fd(), &mut buf).map_err(|e| fail(e.into()))?;
    match serde_json::from_slice::<Control>(&buf[..n]) {
        Ok(Control::Ready) => {}
        Ok(Control::SetupFailed { error }) => return Err(fail(Error::from_body(&error))),
        _ => {
            return Err(fail(Error::backend(
                "the sandbox agent exited during setup (see the monitor log)",
            )))
        }
    }
    Ok(Monitor {
        dir: dir.clone(),
        record: Mutex::new(record),
        state: Mutex::new(SandboxState::Running),
        agent_pid: pid,
        ctrl,
        deadline_changed: tokio::sync::Notify::new(),
    })
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
    fn info(&self) -> SandboxInfo {
        let record = self.record.lock().unwrap_or_else(|e| e.into_inner());
        let state = *self.state.lock().unwrap_or_else(|e| e.into_inner());
        super::info_of(&record, state)
    }

    /// Publish the current info for `list` (atomically: write, then rename).
    fn write_info(&self) {
        let info = self.info();
        let tmp = self.dir.dir.join(".info.json.tmp");
        if let Ok(text) = serde_json::to_vec(&info) {
            if std::fs::write(&tmp, text).is_ok() {
                let _ = std::fs::rename(&tmp, self.dir.info());
            }
        }
    }

    fn kill_agent(&self) {
        let _ = sys::kill(self.agent_pid, libc::SIGKILL);
        let _ = sys::waitpid_blocking(self.agent_pid);
    }

    fn ends_at(&self) -> u64 {
        self.record
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .ends_at
    }
}

async fn run(monitor: Arc<Monitor>, listener: UnixListener) -> i32 {
    let (stop_tx, mut stop_rx) = tokio::sync::mpsc::channel::<()>(1);
    tokio::spawn(watch_agent(monitor.clone()));
    let lease = {
        let monitor = monitor.clone();
        async move {
            loop {
                let ends = monitor.ends_at();
                let wait = Duration::from_millis(ends.saturating_sub(now_millis()));
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {
                        if now_millis() >= monitor.ends_at() {
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
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let monitor = monitor.clone();
                let stop_tx = stop_tx.clone();
                tokio::spawn(async move { serve_client(monitor, stream, stop_tx).await });
            }
            _ = &mut lease => break,
            _ = stop_rx.recv() => break,
            _ = async { match terminate.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => break,
        }
    }
    // Lease over, destroyed, or asked to terminate: end the sandbox and remove its state.
    monitor.kill_agent();
    let _ = std::fs::remove_dir_all(&monitor.dir.dir);
    0
}

/// Notice the agent dying on its own: the sandbox becomes `Stopped` and stays inspectable
/// and destroyable.
async fn watch_agent(monitor: Arc<Monitor>) {
    let Ok(mut sigchld) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())
    else {
        return;
    };
    loop {
        if let Ok(Some((_, status))) = sys::waitpid_nohang(monitor.agent_pid) {
            *monitor.state.lock().unwrap_or_else(|e| e.into_inner()) = SandboxState::Stopped;
            monitor
                .record
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .notes
                .insert(
                    "stopped".into(),
                    format!("the sandbox agent exited ({status:?})"),
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
    match sys::peer_uid(stream.as_raw_fd()) {
        Ok(uid) if uid == me || uid == 0 => {}
        _ => return,
    }
    let first = tokio::time::timeout(Duration::from_secs(30), async {
        let mut prefix = [0u8; 8];
        use tokio::io::AsyncReadExt;
        stream.read_exact(&mut prefix).await.ok()?;
        let hlen = u32::from_le_bytes(prefix[..4].try_into().ok()?) as usize;
        if hlen > 64 * 1024 {
            return Some(Err(Error::backend(
                "protocol error: oversized first frame (a client of another Sandcove version?)",
            )));
        }
        let blen = u32::from_le_bytes(prefix[4..].try_into().ok()?) as usize;
        let mut head = vec![0u8; hlen];
        stream.read_exact(&mut head).await.ok()?;
        let mut body = vec![0u8; blen.min(64 * 1024)];
        stream.read_exact(&mut body).await.ok()?;
        Some(proto::parse_hello(&head))
    })
    .await;
    let request = match first {
        Ok(Some(Ok(r))) => r,
        Ok(Some(Err(e))) => {
            let _ = proto::write_frame(&mut stream, &Reply::error(&e), &[]).await;
            return;
        }
        _ => return,
    };
    let result = match request {
        None => return hand_to_agent(&monitor, stream).await,
        Some(Request::Info) => Ok(Reply::Info {
            info: monitor.info(),
        }),
        Some(Request::SetTimeout { secs }) => {
            if !(secs.is_finite() && (0.0..=1e9).contains(&secs)) {
                Err(Error::invalid(format!(
                    "timeout must be between 0 and 1e9 seconds, got {secs}"
                )))
            } else {
                monitor
                    .record
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .ends_at = now_millis() + (secs * 1000.0) as u64;
                monitor.deadline_changed.notify_one();
                monitor.write_info();
                Ok(Reply::Info {
                    info: monitor.info(),
                })
            }
        }
        Some(Request::Destroy) => {
            *monitor.state.lock().unwrap_or_else(|e| e.into_inner()) = SandboxState::Destroyed;
            monitor.kill_agent();
            let _ = std::fs::remove_dir_all(&monitor.dir.dir);
            let _ = proto::write_frame(&mut stream, &Reply::Done, &[]).await;
            let _ = stop.send(()).await;
            return;
        }
        Some(other) => Err(Error::backend(format!(
            "protocol error: {other:?} must be routed to the agent"
        ))),
    };
    let reply = match result {
        Ok(r) => r,
        Err(e) => Reply::error(&e),
    };
    let _ = proto::write_frame(&mut stream, &reply, &[]).await;
}

async fn hand_to_agent(monitor: &Monitor, mut stream: UnixStream) {
    let state = *monitor.state.lock().unwrap_or_else(|e| e.into_inner());
    if state != SandboxState::Running {
        let record = monitor
            .record
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let why = record
            .notes
            .get("stopped")
            .cloned()
            .unwrap_or_else(|| "it is not running".into());
        let err = Error::InvalidState {
            id: record.id.clone(),
            state: format!("{state:?}").to_lowercase(),
            message: format!("{why}; only info and destroy work now"),
        };
        let _ = proto::write_frame(&mut stream, &Reply::error(&err), &[]).await;
        return;
    }
    let Ok(std_stream) = stream.into_std() else {
        return;
    };
    let msg = serde_json::to_vec(&Control::Handoff).unwrap_or_default();
    // A tiny message on a local socketpair: sendmsg does not block in practice.
    let sent = sys::send_with_fds(monitor.ctrl.as_raw_fd(), &msg, &[std_stream.as_raw_fd()]);
    if sent.is_err() {
        let mut s = std_stream;
        let _ = s.set_nonblocking(false);
        let err = Error::Backend {
            message: "the sandbox agent is not answering".into(),
            retryable: false,
        };
        let _ = proto::write_frame_sync(&mut s, &Reply::error(&err), &[]);
    }
}

/// Read the monitor's one-line readiness report from `ready` (`ok`, or an error body).
pub(super) fn read_ready(mut ready: std::fs::File) -> Result<()> {
    let mut text = String::new();
    let mut buf = [0u8; 4096];
    loop {
        match ready.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                text.push_str(&String::from_utf8_lossy(&buf[..n]));
                if text.ends_with('\n') {
                    break;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let line = text.trim();
    if line == "ok" {
        return Ok(());
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
