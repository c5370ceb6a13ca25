//! Hardening: what the program that starts Sandcove has open or set must not reach sandboxes.
//!
//! A program of its own (this test binary holds one test), because it plants leaked
//! descriptors and a secret in its own process, as a careless launcher would: a directory
//! open without close-on-exec (as when started as `prog 9</`), the write end of a pipe, and
//! `SANDCOVE_API_KEY` in the environment, and it ignores a few signals. None of it may show
//! in a sandbox process, the sandbox's agent or its monitor. Then it lowers its own hard `RLIMIT_NOFILE`.
//!
//! Runs as root and rootless (CI runs this binary again as an unprivileged user).

// The helpers of the main test binary; this one uses part of them.
#[allow(dead_code, unused_imports)]
#[path = "it/hardening_common.rs"]
mod common;

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use sandcove::{Command, ProcessSpec};
use sandcove_conformance::{run, unique};

use common::{Canaries, Env};

/// Duplicate `fd` to the lowest free descriptor from `at` up, without close-on-exec (what a
/// shell's `9<dir` does; a high number so nothing of the test's own is clobbered).
fn plant(fd: i32, at: i32) -> i32 {
    // SAFETY: F_DUPFD on a descriptor this test owns; the result is checked.
    let got = unsafe { libc::fcntl(fd, libc::F_DUPFD, at) };
    assert!(got >= at, "F_DUPFD: {}", std::io::Error::last_os_error());
    got
}

/// Signals this test ignores before the engine starts, as a launcher might.
/// Signal 32 is one the C library reserves for itself (its `sigaction` refuses it), yet a
/// launcher can leave it ignored all the same (seen from a CI runner).
const LAUNCHER_IGNORES: [i32; 5] = [libc::SIGHUP, libc::SIGINT, libc::SIGQUIT, libc::SIGUSR1, 32];

/// The `SigIgn` mask of a `/proc/<pid>/status` text.
fn ignored_signals(status: &str) -> Option<u64> {
    let line = status.lines().find_map(|l| l.strip_prefix("SigIgn:"))?;
    u64::from_str_radix(line.trim(), 16).ok()
}

/// What each descriptor of process `pid` points at, where this user may look.
fn fd_targets(pid: u32) -> Option<Vec<(String, PathBuf)>> {
    let entries = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
    Some(
        entries
            .flatten()
            .filter_map(|e| {
                let target = std::fs::read_link(e.path()).ok()?;
                Some((e.file_name().to_string_lossy().into_owned(), target))
            })
            .collect(),
    )
}

/// One test, two steps in order: both change process-wide state (descriptors, environment,
/// limits) that concurrent tests of one binary would trip over.
#[tokio::test(flavor = "multi_thread")]
async fn the_launchers_descriptors_secrets_and_limits() {
    descriptors_and_secrets_of_the_launcher_never_reach_a_sandbox().await;
    a_low_hard_open_files_limit_is_clamped_not_fatal().await;
}

async fn descriptors_and_secrets_of_the_launcher_never_reach_a_sandbox() {
    let secret = unique("leaked-api-key");
    let host = std::env::temp_dir().join(unique("fd-canary"));
    let canaries = Canaries::plant(std::slice::from_ref(&host));
    let dir = std::fs::File::open(&host).unwrap();
    let dir_fd = plant(dir.as_raw_fd(), 900);
    let mut pipe = [0; 2];
    // SAFETY: pipe writes two fresh descriptors into the array.
    assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0);
    let pipe_fd = plant(pipe[1], 910);
    let pipe_target = std::fs::read_link(format!("/proc/self/fd/{pipe_fd}")).unwrap();
    // SAFETY: this binary runs this one test; nothing reads the environment concurrently
    // before the engine starts below.
    unsafe { std::env::set_var("SANDCOVE_API_KEY", &secret) };
    // Signals a launcher ignores (`nohup`'s SIGHUP; a shell's SIGINT and SIGQUIT for a
    // background job): ignored dispositions survive fork and exec.
    for signal in LAUNCHER_IGNORES {
        // The kernel's sigaction (handler, flags, restorer, mask), set by a raw syscall: the
        // C library's wrapper refuses its reserved signals.
        let ignore: [u64; 4] = [libc::SIG_IGN as u64, 0, 0, 0];
        // SAFETY: setting a disposition of this test process to SIG_IGN; no handler
        // involved; `ignore` has the kernel's layout and the mask size is passed.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_rt_sigaction,
                signal,
                ignore.as_ptr(),
                std::ptr::null_mut::<u64>(),
                8,
            )
        };
        assert_eq!(
            rc,
            0,
            "ignore signal {signal}: {}",
            std::io::Error::last_os_error()
        );
    }

    let env = Env::new("fds");
    let id = env.sandbox("fds").await;
    let out = run(
        &*env.backend,
        &id,
        ProcessSpec::new(Command::argv([
            "bash",
            "-c",
            "ls /proc/self/fd | sort -n | tr '\\n' ' '; echo; \
             for n in $D $P; do test -e /proc/self/fd/$n && echo LEAK$n; done; \
             echo x > /proc/self/fd/$D/pwned 2>/dev/null && echo WROTE; \
             cat /proc/1/environ /proc/self/environ 2>/dev/null | tr '\\0' '\\n'; true",
        ]))
        .env("D", dir_fd.to_string())
        .env("P", pipe_fd.to_string()),
    )
    .await;
    let stdout = out.stdout_lossy();
    let mut lines = stdout.lines();
    let fds: Vec<u32> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    // stdio and the directory `ls` itself reads.
    assert!(
        fds.iter().all(|&fd| fd <= 3),
        "a sandbox process holds descriptors it was not given: {fds:?}"
    );
    assert!(!stdout.contains("LEAK"), "leaked descriptor: {stdout}");
    assert!(!stdout.contains("WROTE"), "wrote on the host: {stdout}");
    assert!(!stdout.contains(&secret), "API key visible in the sandbox");
    let planted: u64 = LAUNCHER_IGNORES.iter().map(|&s| 1u64 << (s - 1)).sum();
    let status = run(
        &*env.backend,
        &id,
        ProcessSpec::new(Command::argv(["cat", "/proc/self/status"])),
    )
    .await
    .stdout_lossy();
    assert_eq!(
        ignored_signals(&status).map(|mask| mask & planted),
        Some(0),
        "a sandbox process ignores the signals its launcher ignored: {:?}",
        ignored_signals(&status)
    );

    // The engine's own processes on the host hold neither, nor the secret.
    let (monitor, agent) = common::monitor_and_agent(&id).await;
    let leaked = |pid: u32| -> Vec<String> {
        fd_targets(pid)
            .unwrap_or_default()
            .into_iter()
            .filter(|(_, t)| t == &host || t == &pipe_target)
            .map(|(fd, t)| format!("fd {fd} -> {}", t.display()))
            .collect()
    };
    assert_eq!(
        leaked(monitor),
        Vec::<String>::new(),
        "monitor holds leaked fds"
    );
    assert!(
        fd_targets(monitor).is_some(),
        "the monitor's fds are readable by its owner"
    );
    // The monitor spawner (one per program, a child of this one, which forks every monitor)
    // holds its socket and stdio on /dev/null, nothing else.
    let spawner = common::all_processes()
        .into_iter()
        .find(|p| p.ppid == std::process::id() && p.comm == "sandcove-spawn" && p.state != 'Z')
        .expect("the engine runs its monitor spawner")
        .pid;
    let held = fd_targets(spawner).expect("the spawner's fds are readable by its owner");
    let sockets = held
        .iter()
        .filter(|(_, t)| t.to_string_lossy().starts_with("socket:"))
        .count();
    let other: Vec<_> = held
        .iter()
        .filter(|(fd, t)| {
            let stdio = matches!(fd.as_str(), "0" | "1" | "2") && t == Path::new("/dev/null");
            !(stdio || t.to_string_lossy().starts_with("socket:"))
        })
        .collect();
    assert!(other.is_empty(), "the spawner holds more: {other:?}");
    assert_eq!(sockets, 1, "the spawner holds one socket: {held:?}");
    // The agent is non-dumpable: only root may look.
    if let Some(targets) = fd_targets(agent) {
        assert_eq!(
            leaked(agent),
            Vec::<String>::new(),
            "agent holds leaked fds: {targets:?}"
        );
    } else {
        eprintln!("note: the agent's descriptors are not readable as this user (non-dumpable)");
    }
    for pid in [monitor, agent, spawner] {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        assert_eq!(
            ignored_signals(&status).map(|mask| mask & planted),
            Some(0),
            "process {pid} ignores the signals its launcher ignored"
        );
        if let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) {
            assert!(
                !String::from_utf8_lossy(&environ).contains(&secret),
                "process {pid} carries SANDCOVE_API_KEY"
            );
        }
    }
    assert!(
        !Path::new(&host).join("pwned").exists(),
        "a sandbox wrote on the host"
    );
    canaries.assert_unchanged("leaked descriptors");
    env.backend.destroy(&id).await.unwrap();
    env.assert_nothing_left("fds").await;
    let _ = std::fs::remove_dir_all(&host);
}

/// A launcher with a hard `RLIMIT_NOFILE` below the engine's default (4096) still runs
/// sandbox processes: the default is clamped to the hard limit (before, every spawn failed
/// with a misleading permission error); an explicit request above it is refused by name.
async fn a_low_hard_open_files_limit_is_clamped_not_fatal() {
    let hard = 1024;
    let rl = libc::rlimit {
        rlim_cur: hard,
        rlim_max: hard,
    };
    // SAFETY: lowering this test process's own limit; `rl` is valid.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &rl) }, 0);
    let env = Env::new("nofile");
    let id = env.sandbox("nofile").await;
    let out = run(
        &*env.backend,
        &id,
        ProcessSpec::new(Command::argv(["bash", "-c", "ulimit -Hn"])),
    )
    .await;
    assert_eq!(
        out.stdout_lossy().trim(),
        hard.to_string(),
        "{}",
        out.stderr_lossy()
    );
    env.backend.destroy(&id).await.unwrap();

    let mut options = env.options("nofile-explicit");
    options.resources.max_open_files = Some(hard + 1);
    let id = env.create(options).await;
    let err = env
        .backend
        .spawn(&id, ProcessSpec::new(Command::argv(["true"])))
        .await
        .unwrap_err();
    assert_eq!(err.code(), sandcove::ErrorCode::InvalidArgument, "{err}");
    assert!(err.to_string().contains("hard limit"), "{err}");
    env.backend.destroy(&id).await.unwrap();
    env.assert_nothing_left("nofile").await;
}
