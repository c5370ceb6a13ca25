//! Hardening, part 9: what one sandbox, or another local user, can make the engine's host
//! hold or write (issue 35): inodes of the sandbox's tmpfs mounts, the engine user's inotify
//! and fanotify instances, the default memory, process and CPU share of a sandbox, and a
//! state directory prepared by someone else.
//!
//! Runs as root and rootless (CI runs this binary again as an unprivileged user).

use crate::hardening_common as common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use sandcove::{Backend, ErrorCode, LocalBackend};
use sandcove_conformance::unique;

use common::Env;

// ---------------------------------------------------------------------------------------------
// The state directory (finding 14)
// ---------------------------------------------------------------------------------------------

/// Names in `dir`, sorted (empty when it does not exist).
fn names(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// The engine started over `dir` is refused with `Unavailable` naming `named` and the remedy,
/// and `dir` (and `untouched`) hold what they held before.
fn assert_refused(dir: &Path, named: &Path, untouched: &Path) {
    let (before, target_before) = (names(dir), names(untouched));
    let err = LocalBackend::with_state_dir(dir)
        .map(|_| ())
        .expect_err("an engine over a state directory others control");
    assert_eq!(err.code(), ErrorCode::Unavailable, "{err}");
    let text = err.to_string();
    assert!(
        text.contains(&named.display().to_string()),
        "the error names {}: {text}",
        named.display()
    );
    assert!(text.contains("SANDCOVE_STATE_DIR"), "the remedy: {text}");
    assert_eq!(
        names(dir),
        before,
        "nothing is written in {}",
        dir.display()
    );
    assert_eq!(
        names(untouched),
        target_before,
        "nothing reaches the link's target"
    );
}

/// Finding 14: a local user pre-creates the state directory (or plants a `snapshots` link in
/// it, or leaves it writable by everyone): the engine refuses to start, names the path and
/// the remedy, and writes nothing there or where a link leads. Its own fresh directory is
/// made mode 0700 with every subdirectory.
#[tokio::test(flavor = "multi_thread")]
async fn a_state_directory_others_control_is_refused() {
    let top = std::env::temp_dir().join(unique("hb-state"));
    std::fs::create_dir(&top).unwrap();
    std::fs::set_permissions(&top, std::fs::Permissions::from_mode(0o700)).unwrap();
    // Where a planted link points: the archives would have landed here.
    let elsewhere = top.join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();

    // Another user's directory with a `snapshots` link, as the finding planted it.
    let euid = unsafe_free_euid();
    if euid == 0 {
        let theirs = top.join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::os::unix::fs::symlink(&elsewhere, theirs.join("snapshots")).unwrap();
        std::os::unix::fs::chown(&theirs, Some(54_321), Some(54_321)).unwrap();
        std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_refused(&theirs, &theirs, &elsewhere);
        // Under a directory that user owns, a fresh state directory of root's would be
        // theirs to swap: refused too, nothing made.
        assert_refused(&theirs.join("state"), &theirs, &elsewhere);
    } else {
        // Rootless, no other user's directory can be made: a root-owned one stands for it.
        let root_owned = Path::new("/usr/share");
        assert_eq!(std::fs::metadata(root_owned).unwrap().uid(), 0);
        assert_refused(root_owned, root_owned, &elsewhere);
    }

    // Writable by everyone (the engine's own user made it, carelessly).
    let open = top.join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    assert_refused(&open, &open, &elsewhere);

    // Its own private directory, but with a `snapshots` link planted in it.
    let planted = top.join("planted");
    std::fs::create_dir(&planted).unwrap();
    std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::symlink(&elsewhere, planted.join("snapshots")).unwrap();
    assert_refused(&planted, &planted.join("snapshots"), &elsewhere);

    // The state directory itself a link.
    let link = top.join("link");
    std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
    assert_refused(&link, &link, &elsewhere);

    // A fresh one is made private, and works.
    let fresh = top.join("fresh");
    let env = Env::at(fresh.clone());
    for dir in [
        fresh.clone(),
        fresh.join("sandboxes"),
        fresh.join("snapshots"),
    ] {
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700, "{}", dir.display());
    }
    let id = env.sandbox("state").await;
    env.backend.destroy(&id).await.unwrap();
    env.assert_nothing_left("state").await;
    drop(env);
    std::fs::remove_dir_all(&top).unwrap();
}

/// This process's effective uid (read from procfs: the test needs no `unsafe`).
fn unsafe_free_euid() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    line.split_whitespace().nth(2).unwrap().parse().unwrap()
}

// ---------------------------------------------------------------------------------------------
// Inodes of the sandbox's tmpfs mounts (finding 8)
// ---------------------------------------------------------------------------------------------

/// Finding 8: empty files cost the host kernel memory that no size limit counts (rootless, no
/// memory cgroup charges it either). Every tmpfs of the sandbox has an inode bound derived
/// from its size (root and `/tmp` from `disk_mib`, `/dev/shm` from its 64 MiB, `/dev` a few
/// dozen), and creating files past it fails inside with `ENOSPC` while the sandbox goes on.
#[tokio::test(flavor = "multi_thread")]
async fn tmpfs_inodes_are_bounded_by_the_disk_size() {
    let env = Env::new("inodes");
    let bounds = env.local.sandbox_bounds();
    let disk_mib = 32;
    let mut options = env.options("inodes");
    options.resources = sandcove::Resources::default().disk_mib(disk_mib);
    let id = env.create(options).await;
    // /dev is the sandbox root's (and rootless every process is that root).
    let root = env.backend.capabilities().multiple_users.then_some("root");
    let expected = [
        ("/tmp", bounds.inodes_for(disk_mib), None),
        ("/workspace", bounds.inodes_for(disk_mib), None),
        ("/dev/shm", bounds.inodes_for(64), None),
        ("/dev", 64, root),
    ];
    for (mount, inodes, user) in expected {
        // Fill the mount with empty files (no fork per file), then report the total, the
        // files made and the error of the first one refused.
        let script = format!(
            "m={mount}; d=$m/fill; mkdir -p $d; i=0; \
             while [ $i -lt 200000 ] && : 2>/dev/null > $d/f$i; do i=$((i+1)); done; \
             err=$( {{ : > $d/f$i; }} 2>&1 ); \
             echo \"$(stat -f -c %c $m) $i $err\"; \
             rm -rf $d"
        );
        let mut spec = sandcove::ProcessSpec::new(sandcove::Command::argv(["bash", "-c", &script]));
        if let Some(user) = user {
            spec = spec.user(user);
        }
        let out = sandcove_conformance::run(&*env.backend, &id, spec).await;
        let text = out.stdout_lossy();
        let mut words = text.split_whitespace();
        let total: u64 = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
        let made: u64 = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
        assert_eq!(total, inodes, "{mount} has {inodes} inodes: {text}");
        assert!(
            made > 0 && made < inodes,
            "{mount}: {made} files made of {inodes} inodes: {text}"
        );
        assert!(
            text.contains("No space left on device"),
            "{mount}: the file past the bound is refused with ENOSPC: {text}"
        );
    }
    // The sandbox goes on: a file can be made again once the others are gone.
    let out = common::bash(&*env.backend, &id, "touch /tmp/after && echo ok").await;
    assert_eq!(out.stdout_lossy().trim(), "ok", "{}", out.stderr_lossy());
    env.backend.destroy(&id).await.unwrap();
    env.assert_nothing_left("inodes").await;
}

// ---------------------------------------------------------------------------------------------
// Default memory, processes and CPU weight (finding 13)
// ---------------------------------------------------------------------------------------------

/// The host cgroup file of sandbox `id` for `controller` (v1) or the unified one (v2).
fn cgroup_file(id: &str, controller: &str, v1: &str, v2: &str) -> Option<std::path::PathBuf> {
    let unified = Path::new("/sys/fs/cgroup/sandcove").join(id).join(v2);
    let split = Path::new("/sys/fs/cgroup")
        .join(controller)
        .join("sandcove")
        .join(id)
        .join(v1);
    [split, unified].into_iter().find(|p| p.exists())
}

fn read_number(path: &Path) -> u64 {
    let text = std::fs::read_to_string(path).unwrap();
    text.split_whitespace().next().unwrap().parse().unwrap()
}

/// The soft `RLIMIT_NPROC` of a process of sandbox `id`, and the hard one of this program
/// (the engine clamps a default above the host's hard limit to it).
async fn nproc_limits(backend: &dyn sandcove::Backend, id: &str) -> (u64, u64) {
    let out = common::bash(backend, id, "ulimit -Su").await;
    let inside = out.stdout_lossy().trim().parse().unwrap_or(u64::MAX);
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max processes"))
        .unwrap();
    let hard = line
        .split_whitespace()
        .nth(3)
        .and_then(|w| w.parse().ok())
        .unwrap_or(u64::MAX);
    (inside, hard)
}

/// Finding 13: a sandbox that names no resources gets the engine's defaults for a shared host
/// (1 GiB of memory, 1024 processes), not 4 GiB and 2048; and every sandbox has a CPU weight
/// in its cgroup, one core's worth unless it asked for more or less, with or without a quota.
/// Rootless without a writable cgroup the process bound is its `RLIMIT_NPROC` (the user
/// namespace counts it per sandbox) and memory and CPU limits are reported unsupported.
#[tokio::test(flavor = "multi_thread")]
async fn sandboxes_get_shared_host_defaults_and_a_cpu_weight() {
    let env = Env::new("defaults");
    let bounds = env.local.sandbox_bounds();
    assert_eq!(
        (bounds.default_memory_mib, bounds.default_max_processes),
        (1024, 1024)
    );
    let id = env.sandbox("defaults").await;
    let (nproc, hard) = nproc_limits(&*env.backend, &id).await;
    assert_eq!(nproc, 1024u64.min(hard), "the default RLIMIT_NPROC");
    let caps = env.backend.capabilities();
    if !caps.memory_limit {
        eprintln!("no writable cgroup here: only the process limit applies (reported so)");
        assert!(!caps.cpu_limit);
        env.backend.destroy(&id).await.unwrap();
        env.assert_nothing_left("defaults").await;
        return;
    }
    let memory = cgroup_file(&id, "memory", "memory.limit_in_bytes", "memory.max").unwrap();
    assert_eq!(read_number(&memory), 1024 << 20, "the default memory limit");
    let pids = cgroup_file(&id, "pids", "pids.max", "pids.max").unwrap();
    assert_eq!(read_number(&pids), 1024, "the default pids limit");
    let (weight_v1, weight_v2) = ("cpu.shares", "cpu.weight");
    let weight = cgroup_file(&id, "cpu", weight_v1, weight_v2).unwrap();
    let one_core = if weight.ends_with(weight_v1) {
        1024
    } else {
        100
    };
    assert_eq!(
        read_number(&weight),
        one_core,
        "one core's weight by default"
    );

    // Half a core asked for: half the weight, beside its quota; two cores, twice, no matter
    // that no other sandbox asked for anything.
    let mut half = env.options("defaults");
    half.resources = sandcove::Resources::default().cpu(0.5);
    let half = env.create(half).await;
    let weight = cgroup_file(&half, "cpu", weight_v1, weight_v2).unwrap();
    assert_eq!(read_number(&weight), one_core / 2);
    let mut two = env.options("defaults");
    two.resources = sandcove::Resources::default().cpu(2.0);
    let two = env.create(two).await;
    let weight = cgroup_file(&two, "cpu", weight_v1, weight_v2).unwrap();
    assert_eq!(read_number(&weight), one_core * 2);
    for id in [id, half, two] {
        env.backend.destroy(&id).await.unwrap();
    }
    env.assert_nothing_left("defaults").await;
}

/// An engine's own defaults can be set (an operator's choice), and bounds that would lift a
/// protection are refused.
#[tokio::test(flavor = "multi_thread")]
async fn sandbox_bounds_are_the_operators_to_set() {
    let env = Env::new("setbounds");
    let mut bounds = env.local.sandbox_bounds();
    bounds.default_max_processes = 300;
    let local = env.local.clone().with_sandbox_bounds(bounds).unwrap();
    let id = local.create(env.options("setbounds")).await.unwrap().id;
    let (nproc, hard) = nproc_limits(&local, &id).await;
    assert_eq!(nproc, 300u64.min(hard));
    local.destroy(&id).await.unwrap();
    let zero_inodes = |b: &mut sandcove::backend::local::SandboxBounds| b.inodes_per_mib = 0;
    let zero_processes =
        |b: &mut sandcove::backend::local::SandboxBounds| b.default_max_processes = 0;
    let huge_inotify =
        |b: &mut sandcove::backend::local::SandboxBounds| b.inotify_instances = u64::MAX;
    for change in [zero_inodes, zero_processes, huge_inotify] {
        let mut bad = bounds;
        change(&mut bad);
        let err = env.local.clone().with_sandbox_bounds(bad).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
    }
    env.assert_nothing_left("setbounds").await;
}

// ---------------------------------------------------------------------------------------------
// inotify instances and watches (finding 9)
// ---------------------------------------------------------------------------------------------

/// Python holding inotify instances: opens them until the kernel refuses, prints how many it
/// got and the errno of the refusal, then holds them until it is killed.
const HOLD_INOTIFY: &str = "import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
fds = []
while len(fds) < 100000:
    fd = libc.inotify_init1(0)
    if fd < 0:
        break
    fds.append(fd)
print(len(fds), ctypes.get_errno(), flush=True)
time.sleep(600)
";

/// Start [`HOLD_INOTIFY`] in sandbox `id` as `user`; returns (instances held, errno) once it
/// holds them, and the stream that keeps it alive.
async fn hold_inotify(
    backend: &dyn sandcove::Backend,
    id: &str,
    user: Option<&str>,
) -> ((u64, i32), sandcove::ProcessStream) {
    use futures::StreamExt;
    let mut spec =
        sandcove::ProcessSpec::new(sandcove::Command::argv(["python3", "-c", HOLD_INOTIFY]));
    if let Some(user) = user {
        spec = spec.user(user);
    }
    let mut stream = backend.spawn(id, spec).await.unwrap();
    let mut out = Vec::new();
    while !out.ends_with(b"\n") {
        match stream.events.next().await {
            Some(Ok(sandcove::ProcessEvent::Stdout(bytes))) => out.extend_from_slice(&bytes),
            Some(Ok(sandcove::ProcessEvent::Exit(status))) => {
                panic!("the holder exited: {status:?}")
            }
            Some(Ok(_)) => {}
            other => panic!("the holder's stream ended: {other:?}"),
        }
    }
    let text = String::from_utf8_lossy(&out);
    let mut words = text.split_whitespace();
    let held = words.next().and_then(|w| w.parse().ok()).unwrap();
    let errno = words.next().and_then(|w| w.parse().ok()).unwrap();
    ((held, errno), stream)
}

/// Whether this (host) program can make an inotify instance right now.
fn host_inotify_works() -> bool {
    // SAFETY: inotify_init1 takes flags only and returns a new descriptor or -1.
    let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
    if fd < 0 {
        return false;
    }
    // SAFETY: `fd` is the descriptor just made, owned here and closed once.
    unsafe { libc::close(fd) };
    true
}

/// Finding 9: sandbox code opening inotify instances in a loop stops at its share of the
/// engine user's limit (EMFILE), while another sandbox's watch API and the host's own
/// `inotify_init1` still work; the exhausted sandbox's own watch API answers a typed
/// `RateLimited` at once, never a hang or an internal error.
#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_exhausting_inotify_leaves_the_engine_user_headroom() {
    use futures::StreamExt;
    let env = Env::new("inotify");
    let bounds = env.local.sandbox_bounds();
    let greedy = env.sandbox("inotify").await;
    if !common::has_python(&*env.backend, &greedy).await {
        return;
    }
    let other = env.sandbox("inotify").await;
    // The uid the agent's watch API is charged to (root of the sandbox): rootless the only
    // one, as root the `root` user.
    let root = env.backend.capabilities().multiple_users.then_some("root");
    let ((held, errno), holder) = hold_inotify(&*env.backend, &greedy, root).await;
    assert_eq!(
        (held, errno),
        (bounds.inotify_instances, libc::EMFILE),
        "the sandbox stops at its share ({} of the engine user's {}, one in {})",
        bounds.inotify_instances,
        std::fs::read_to_string("/proc/sys/user/max_inotify_instances")
            .unwrap_or_default()
            .trim(),
        sandcove::backend::local::HOST_SHARE
    );
    assert!(
        host_inotify_works(),
        "the host's own inotify_init1 still works"
    );
    // Another sandbox's watch API works and reports.
    let mut watch = env
        .backend
        .watch(&other, "/workspace", Default::default())
        .await
        .expect("another sandbox's watch");
    common::bash(&*env.backend, &other, "echo x > /workspace/seen").await;
    let event = tokio::time::timeout(std::time::Duration::from_secs(30), watch.next())
        .await
        .expect("an event in time")
        .expect("an event")
        .expect("no error");
    assert!(event.path.ends_with("seen"), "{event:?}");
    // The exhausted sandbox's own watch API: a typed error, at once.
    let refused = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        env.backend.watch(&greedy, "/workspace", Default::default()),
    )
    .await
    .expect("the refusal comes at once");
    match refused {
        Err(e @ sandcove::Error::RateLimited { .. }) => {
            assert!(e.to_string().contains("inotify"), "{e}")
        }
        Err(e) => panic!("not the typed refusal: {e:?}"),
        Ok(_) => panic!("a watch past the sandbox's inotify share"),
    }
    drop(watch);
    drop(holder);
    for id in [greedy, other] {
        env.backend.destroy(&id).await.unwrap();
    }
    env.assert_nothing_left("inotify").await;
}

/// The watch API past the sandbox's inotify watches: a recursive watch of a tree with more
/// directories than the share is refused with the typed error (never a watch blind to part of
/// its tree), and a live watch whose tree grows past it ends with that error.
#[tokio::test(flavor = "multi_thread")]
async fn a_watch_past_the_sandboxs_watches_is_refused_typed() {
    use futures::StreamExt;
    let env = Env::new("watches");
    let mut bounds = env.local.sandbox_bounds();
    bounds.inotify_watches = 16;
    let local = env.local.clone().with_sandbox_bounds(bounds).unwrap();
    let id = local.create(env.options("watches")).await.unwrap().id;
    let recursive = sandcove::WatchOptions::default().recursive(true);
    common::bash(&local, &id, "mkdir -p /workspace/small/d{1..4}").await;
    // 5 watches of 16: a live recursive watch, then its tree grows past the share.
    let mut live = local
        .watch(&id, "/workspace/small", recursive.clone())
        .await
        .expect("a watch within the share");
    common::bash(&local, &id, "mkdir -p /workspace/big/d{1..40}").await;
    let refused = local.watch(&id, "/workspace/big", recursive.clone()).await;
    match refused {
        Err(sandcove::Error::RateLimited { message, .. }) => {
            assert!(message.contains("watches"), "{message}")
        }
        Err(e) => panic!("not the typed refusal: {e:?}"),
        Ok(_) => panic!("a watch blind to part of its tree"),
    }
    common::bash(&local, &id, "mkdir -p /workspace/small/new{1..20}").await;
    let ended = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        loop {
            match live.next().await {
                Some(Ok(_)) => continue,
                other => return other,
            }
        }
    })
    .await
    .expect("the live watch ends in time");
    match ended {
        Some(Err(sandcove::Error::RateLimited { .. })) => {}
        other => panic!("the live watch ends with the typed error, not {other:?}"),
    }
    local.destroy(&id).await.unwrap();
    env.assert_nothing_left("watches").await;
}
