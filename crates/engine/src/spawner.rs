//! The monitor spawner: one small process per program that forks the sandbox monitors.
//!
//! A monitor must outlive the program that created its sandbox, so it cannot be a thread of
//! that program. Starting one used to fork the creating program (often large and
//! multi-threaded) and re-execute the whole binary, for every sandbox; the cold-create profile
//! put those two steps at about a quarter of a create. The spawner is that re-execution done
//! once per program: a single-threaded copy of the program with nothing open but its socket
//! and a clean environment, which forks each monitor from itself on request. It ends when the
//! program that started it closes its end of the socket (at the latest when it exits), so it
//! never outlives its program; the monitors it started do, exactly as before.
//!
//! What a monitor used to inherit from the creating program at the moment of the create, it
//! still gets from that moment: the request carries the environment the engine passes and
//! every resource limit, and the working directory is `/` (the state directory is absolute).
//! What cannot travel in a message — credentials, capabilities, `no_new_privs`, seccomp,
//! namespaces, root directory, LSM label, cgroups, CPU affinity, niceness, umask — is
//! compared with the spawner's at each create, and a program whose state changed (it dropped
//! privileges, say) gets a new spawner started as it is now. Signal dispositions the program
//! left ignored are reset to their defaults when the spawner starts (SIGPIPE excepted, which
//! the engine's processes ignore).
//!
//! A request is one `SOCK_SEQPACKET` message: the sandbox's state directory and the
//! environment the monitor gets, with three descriptors attached (the readiness socket, the
//! held lock file, the sandbox's log for stderr). The spawner answers nothing: the monitor
//! reports on the readiness socket, and a spawner that fails (or dies) drops it, which
//! the creating program reads as a monitor that did not start.

use std::ffi::OsString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::{entry, monitor, sys};
use sandcove_core::{Error, Result};

/// Env var naming the spawner's end of its socket.
pub(super) const SOCKET_FD_ENV: &str = "__SANDCOVE_SPAWNER_FD";

/// Largest request: a state directory path and a handful of settings.
const MAX_REQUEST: usize = 64 * 1024;

/// What the spawner needs to start one monitor (the descriptors travel beside it).
#[derive(Serialize, Deserialize)]
struct Launch {
    /// The sandbox's state directory.
    dir: Vec<u8>,
    /// The monitor's whole environment.
    env: Vec<(Vec<u8>, Vec<u8>)>,
    /// The creating program's resource limits now: (resource, soft, hard).
    rlimits: Vec<(u32, u64, u64)>,
}

/// The creating program's handle on its spawner.
struct Handle {
    socket: OwnedFd,
    child: std::process::Child,
    /// The program's security state when the spawner started (see [`security_state`]).
    started_as: String,
}

/// This program's spawner, started on first use and again if it has died.
static SPAWNER: Mutex<Option<Handle>> = Mutex::new(None);

/// Start the monitor of the sandbox whose state directory is `dir`: it reports on `ready`,
/// holds `lock` for its life and writes its stderr to `log`. Blocking (a few syscalls); the
/// caller drops its own copy of `ready` (the monitor's end) afterwards and reads the report.
pub(super) fn start_monitor(
    dir: &Path,
    env: Vec<(OsString, OsString)>,
    ready: &OwnedFd,
    lock: &std::fs::File,
    log: &std::fs::File,
) -> Result<()> {
    let request = serde_json::to_vec(&Launch {
        dir: dir.as_os_str().as_bytes().to_vec(),
        env: env
            .into_iter()
            .map(|(k, v)| (k.into_vec(), v.into_vec()))
            .collect(),
        rlimits: rlimits(),
    })
    .map_err(|e| Error::backend(format!("encode a monitor launch: {e}")))?;
    if request.len() > MAX_REQUEST {
        return Err(Error::invalid(
            "the state directory path and environment are too long to start a monitor",
        ));
    }
    let fds = [ready.as_raw_fd(), lock.as_raw_fd(), log.as_raw_fd()];
    let now = security_state();
    let mut spawner = SPAWNER.lock().unwrap_or_else(|e| e.into_inner());
    // A program that dropped privileges, took on a seccomp filter or `no_new_privs`, or moved
    // to another cgroup since its spawner started must not get monitors made as it was.
    if spawner.as_ref().is_some_and(|h| h.started_as != now) {
        if let Some(old) = spawner.take() {
            retire(old);
        }
    }
    // A spawner that died (killed, or its program forked and the copy closed it) refuses
    // the send at once: start another and send once more.
    for attempt in 0..2 {
        let handle = match spawner.as_mut() {
            Some(h) => h,
            None => spawner.insert(spawn(now.clone())?),
        };
        match sys::send_with_fds(handle.socket.as_raw_fd(), &request, &fds) {
            Ok(_) => return Ok(()),
            Err(e) => {
                if let Some(dead) = spawner.take() {
                    retire(dead);
                }
                if attempt == 1 {
                    return Err(Error::backend(format!(
                        "cannot start the sandbox monitor: {e}"
                    )));
                }
            }
        }
    }
    unreachable!("the loop returns on its second attempt")
}

/// End a spawner this program no longer uses: closing its socket ends it (once it has
/// served what was sent before); it is reaped off this thread so no zombie is left. Not
/// waited for here: a copy of the program made by `fork` without `exec` holds the socket
/// too, and the spawner then lives until that copy exits; a create must not wait on it.
fn retire(handle: Handle) {
    let Handle {
        socket, mut child, ..
    } = handle;
    drop(socket);
    let _ = std::thread::Builder::new()
        .name("sandcove-reap".into())
        .spawn(move || {
            let _ = child.wait();
        });
}

/// What a spawner's monitors inherit from the moment it started and must still match the
/// program: its credentials, capabilities, `no_new_privs`, seccomp state (from
/// `/proc/thread-self/status`, the creating thread's, as a fork of it would inherit), its
/// namespaces (a thread that entered others, with `unshare` or `setns`, forks into those),
/// its root directory (`chroot`), its LSM label, its cgroups, and what bounds its share of
/// the host: CPU and memory-node affinity, niceness and scheduling policy (an unprivileged
/// program cannot take back a priority it gave up; its sandboxes must not have it either),
/// and its umask. A Landlock domain sets `no_new_privs` (unless privileged), so it shows
/// too. A state that cannot be read matches nothing, so the next create starts a spawner as
/// the program is then.
fn security_state() -> String {
    const FIELDS: &[&str] = &[
        "Uid:",
        "Gid:",
        "Groups:",
        "CapInh:",
        "CapPrm:",
        "CapEff:",
        "CapBnd:",
        "CapAmb:",
        "NoNewPrivs:",
        "Seccomp:",
        "Seccomp_filters:",
        "Umask:",
        "Cpus_allowed:",
        "Mems_allowed:",
    ];
    const NAMESPACES: &[&str] = &[
        "cgroup",
        "ipc",
        "mnt",
        "net",
        "pid_for_children",
        "time_for_children",
        "user",
        "uts",
    ];
    static UNREADABLE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let unreadable = || {
        let n = UNREADABLE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!("unreadable {n}")
    };
    let (Ok(status), Ok(stat), Ok(cgroups), Ok(root)) = (
        std::fs::read_to_string("/proc/thread-self/status"),
        std::fs::read_to_string("/proc/thread-self/stat"),
        std::fs::read_to_string("/proc/self/cgroup"),
        std::fs::metadata("/"),
    ) else {
        return unreadable();
    };
    // Fields 19 (nice) and 41 (scheduling policy), counted after the command name.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let (Some(nice), Some(policy)) = (fields.get(16), fields.get(38)) else {
        return unreadable();
    };
    let mut state: String = status
        .lines()
        .filter(|l| FIELDS.iter().any(|f| l.starts_with(f)))
        .collect::<Vec<_>>()
        .join("\n");
    if !state.contains("Seccomp:") {
        return unreadable();
    }
    state.push_str(&format!("\nnice {nice} policy {policy}"));
    for ns in NAMESPACES {
        // A kernel without that namespace type has no link: the same each time.
        let link = std::fs::read_link(format!("/proc/thread-self/ns/{ns}")).unwrap_or_default();
        state.push_str(&format!("\n{ns} {}", link.display()));
    }
    {
        use std::os::unix::fs::MetadataExt;
        state.push_str(&format!("\nroot {}:{}", root.dev(), root.ino()));
    }
    // No LSM with a label: the read fails the same way each time.
    let label = std::fs::read("/proc/thread-self/attr/current").unwrap_or_default();
    state.push_str(&format!("\nlabel {}\n", String::from_utf8_lossy(&label)));
    state.push_str(&cgroups);
    state
}

/// Every resource limit of this process (what a forked monitor used to inherit).
fn rlimits() -> Vec<(u32, u64, u64)> {
    [
        libc::RLIMIT_CPU,
        libc::RLIMIT_FSIZE,
        libc::RLIMIT_DATA,
        libc::RLIMIT_STACK,
        libc::RLIMIT_CORE,
        libc::RLIMIT_RSS,
        libc::RLIMIT_NPROC,
        libc::RLIMIT_NOFILE,
        libc::RLIMIT_MEMLOCK,
        libc::RLIMIT_AS,
        libc::RLIMIT_LOCKS,
        libc::RLIMIT_SIGPENDING,
        libc::RLIMIT_MSGQUEUE,
        libc::RLIMIT_NICE,
        libc::RLIMIT_RTPRIO,
        libc::RLIMIT_RTTIME,
    ]
    .into_iter()
    .filter_map(|resource| {
        let (soft, hard) = sys::getrlimit(resource).ok()?;
        Some((resource, soft, hard))
    })
    .collect()
}

/// Re-execute this program as a spawner, with a clean environment and only its socket.
fn spawn(started_as: String) -> Result<Handle> {
    let (ours, theirs) = sys::seqpacket_pair()
        .map_err(|e| Error::backend(format!("cannot start the monitor spawner: {e}")))?;
    let theirs_fd = theirs.as_raw_fd();
    let mut cmd = std::process::Command::new("/proc/self/exe");
    // Named as the monitors are (they share its command line): `ps` shows what they are.
    cmd.arg0("sandcove-monitor")
        .env_clear()
        .env(entry::ROLE_ENV, entry::ROLE_SPAWNER)
        .env(SOCKET_FD_ENV, theirs_fd.to_string())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // SAFETY: only async-signal-safe syscalls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            // Its own session: a terminal's ^C to the program's process group does not reach
            // it (it ends when the program closes the socket).
            sys::setsid()?;
            sys::cloexec_from(3)?;
            sys::clear_cloexec(theirs_fd)
        });
    }
    let child = cmd
        .spawn()
        .map_err(|e| Error::backend(format!("cannot start the monitor spawner: {e}")))?;
    drop(theirs);
    Ok(Handle {
        socket: ours,
        child,
        started_as,
    })
}

/// Entry point of the re-executed binary in the spawner role. Never returns.
pub fn main() -> ! {
    let Some(fd) = std::env::var(SOCKET_FD_ENV)
        .ok()
        .and_then(|v| v.parse::<RawFd>().ok())
    else {
        sys::exit_now(2);
    };
    // Anything the program had open without close-on-exec reached us through exec.
    if fd <= 2 || sys::close_fds_except(&[fd]).is_err() {
        sys::exit_now(2);
    }
    // SAFETY: the program passed this descriptor to us, open, under this number.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    let _ = sys::set_cloexec(&socket);
    // Signals the program ignored (and exec kept ignored) are not the sandboxes' business.
    sys::default_signal_dispositions();
    sys::set_process_name("sandcove-spawn");
    // Monitors are this process's children: the kernel reaps each as it exits, so none is
    // left a zombie and the spawner never waits for one.
    if sys::set_child_autoreap(true).is_err() {
        sys::exit_now(2);
    }
    let mut buf = vec![0u8; MAX_REQUEST];
    loop {
        let (n, fds) = match sys::recv_with_fds(socket.as_raw_fd(), &mut buf) {
            Ok(got) => got,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            // A request too large for the buffer: its descriptors were closed, and the
            // program reads that as a monitor that did not start.
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => continue,
            Err(_) => sys::exit_now(1),
        };
        if n == 0 && fds.is_empty() {
            // The program closed its end: it is done creating sandboxes, or gone.
            sys::exit_now(0);
        }
        let Ok(launch) = serde_json::from_slice::<Launch>(&buf[..n]) else {
            continue;
        };
        let Ok([ready, lock, log]) = <[OwnedFd; 3]>::try_from(fds) else {
            continue;
        };
        // The child is the monitor itself: no intermediate process to detach it (the
        // kernel reaps it, above), and the spawner is back at `recv` at once.
        if let Ok(0) = sys::fork() {
            drop(socket);
            become_monitor(launch, ready, lock, log)
        }
        // The descriptors are the monitor's now (or, had the fork failed, dropping them
        // tells the program that no monitor started).
        drop((ready, lock, log));
    }
}

/// In the spawner's child: take on the monitor's session, environment and stderr, then run
/// the monitor (which closes every descriptor but `ready` and `lock`). It is already
/// detached: its own session, and when the spawner ends it is an orphan that lives on.
fn become_monitor(launch: Launch, ready: OwnedFd, lock: OwnedFd, log: OwnedFd) -> ! {
    // The monitor waits for its agent: its children are not reaped behind its back (and the
    // agent, cloned from it, must not inherit the spawner's disposition either).
    if sys::set_child_autoreap(false).is_err()
        || sys::setsid().is_err()
        || sys::dup2(&log, 2).is_err()
        || sys::chdir_root().is_err()
    {
        sys::exit_now(1);
    }
    drop(log);
    // The program's limits as they are now, not as they were when the spawner started; a
    // limit that cannot be applied fails the create rather than run the sandbox without it.
    for &(resource, soft, hard) in &launch.rlimits {
        if let Err(e) = sys::setrlimit_pair(resource, soft, hard) {
            let report = Error::backend(format!(
                "cannot give the sandbox monitor the program's resource limit {resource}: {e}"
            ));
            let line = serde_json::to_string(&report.to_body()).unwrap_or_default();
            let _ = sys::write_fd(&ready, format!("{line}\n").as_bytes());
            sys::exit_now(1);
        }
    }
    // Single-threaded (a fork of the single-threaded spawner): nothing else reads the
    // environment while it is replaced.
    let old: Vec<OsString> = std::env::vars_os().map(|(k, _)| k).collect();
    for name in old {
        // SAFETY: this process has one thread (above); nothing reads the environment now.
        unsafe { std::env::remove_var(name) };
    }
    for (name, value) in launch.env {
        if !name.is_empty() && !name.contains(&b'=') && !name.contains(&0) && !value.contains(&0) {
            // SAFETY: as above, one thread.
            unsafe { std::env::set_var(OsString::from_vec(name), OsString::from_vec(value)) };
        }
    }
    let dir = PathBuf::from(OsString::from_vec(launch.dir));
    let (ready_fd, lock_fd) = (ready.as_raw_fd(), lock.as_raw_fd());
    // The monitor owns them from here, under these numbers.
    std::mem::forget(ready);
    std::mem::forget(lock);
    monitor::run_detached(ready_fd, lock_fd, dir)
}
