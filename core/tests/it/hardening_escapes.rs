//! Hardening, part 4: the escapes an adversarial review found, one test per attack, each
//! reproducing the attack exactly and asserting it fails and leaves the host unchanged.
//!
//! - a volume `subpath` that sandbox code turned into a symlink to a host directory;
//! - descriptors the program that starts Sandcove leaked, reaching sandbox processes;
//! - the seccomp filter and landlock failing closed.
//!
//! Runs as root and rootless (CI runs this binary again as an unprivileged user).

use crate::hardening_common as common;

use std::path::PathBuf;

use sandcove::{Command, ErrorCode, ProcessSpec, SnapshotOptions, VolumeMount};
use sandcove_conformance::{run, unique};

use common::{bash, Canaries, Env};

fn mount(volume: &str, path: &str, subpath: Option<&str>) -> VolumeMount {
    let mut mount = VolumeMount::new(volume, path);
    mount.subpath = subpath.map(Into::into);
    mount
}

/// A host directory no sandbox may see, planted with canaries (and world-readable, so the
/// rootless run's sandboxes could reach it if the engine let them).
fn host_canaries(tag: &str) -> (PathBuf, Canaries) {
    let dir = std::env::temp_dir().join(unique(tag));
    let canaries = Canaries::plant(std::slice::from_ref(&dir));
    (dir, canaries)
}

/// Finding 1: sandbox A plants `escape -> <host dir>` (and friends) in a volume; a later
/// sandbox asking for those subpaths must be refused with nothing mounted, created or chowned
/// on the host, while a fresh subpath still works and is shared through the volume.
#[tokio::test(flavor = "multi_thread")]
async fn volume_subpaths_never_follow_links_a_sandbox_planted() {
    let env = Env::new("volsub");
    let (host, canaries) = host_canaries("volsub-host");
    env.backend.create_volume("shared").await.unwrap();
    let planter = env
        .create({
            let mut options = env.options("planter");
            options.volumes = vec![mount("shared", "/vol", None)];
            options
        })
        .await;
    let h = host.display();
    let out = bash(
        &*env.backend,
        &planter,
        &format!(
            "set -e; cd /vol; ln -s '{h}' escape; ln -s / root; ln -s ../../../.. up; \
             mkdir -p a; ln -s '{h}/dir' a/b; ln -s /proc/self/root proc; \
             mkdir -p real/inner; echo ok"
        ),
    )
    .await;
    assert_eq!(out.stdout_lossy().trim(), "ok", "{}", out.stderr_lossy());

    for sub in [
        "escape",
        "escape/dir",
        "escape/new",
        "root",
        "root/tmp",
        "up",
        "a/b",
        "a/b/sub",
        "proc",
        "proc/tmp",
    ] {
        let result = env
            .backend
            .create({
                let mut options = env.options("victim");
                options.volumes = vec![mount("shared", "/mnt/v", Some(sub))];
                options
            })
            .await;
        match result {
            Err(e) => assert_eq!(
                e.code(),
                ErrorCode::InvalidArgument,
                "subpath {sub:?}: refused, but with {e}"
            ),
            Ok(info) => {
                // Show what the escape would have reached, then fail.
                let seen = bash(&*env.backend, &info.id, "ls -la /mnt/v; touch /mnt/v/pwned").await;
                panic!(
                    "subpath {sub:?} through a planted link was mounted: {}",
                    seen.stdout_lossy()
                );
            }
        }
        canaries.assert_unchanged(&format!("subpath {sub:?}"));
    }

    // Plain and new subpaths still work, and both sandboxes see one directory.
    let user = env
        .create({
            let mut options = env.options("user");
            options.volumes = vec![
                mount("shared", "/mnt/real", Some("real/inner")),
                mount("shared", "/mnt/new", Some("fresh/deeper")),
            ];
            options
        })
        .await;
    let out = bash(
        &*env.backend,
        &user,
        "echo one > /mnt/real/f && echo two > /mnt/new/g && echo done",
    )
    .await;
    assert_eq!(out.stdout_lossy().trim(), "done", "{}", out.stderr_lossy());
    let out = bash(
        &*env.backend,
        &planter,
        "cat /vol/real/inner/f /vol/fresh/deeper/g",
    )
    .await;
    assert_eq!(out.stdout_lossy(), "one\ntwo\n", "{}", out.stderr_lossy());
    canaries.assert_unchanged("after the legitimate mounts");
    // A volume outlives its sandboxes: no setuid or device file made in one takes effect.
    let out = bash(
        &*env.backend,
        &user,
        "awk '$5 == \"/mnt/real\" || $5 == \"/mnt/new\" {print $6}' /proc/self/mountinfo",
    )
    .await;
    let flags: Vec<String> = out.stdout_lossy().lines().map(String::from).collect();
    assert_eq!(
        flags.len(),
        2,
        "volume mounts: {flags:?} {}",
        out.stderr_lossy()
    );
    for f in &flags {
        assert!(
            f.split(',').any(|o| o == "nosuid") && f.split(',').any(|o| o == "nodev"),
            "a volume is mounted {f}"
        );
    }

    for id in [planter, user] {
        env.backend.destroy(&id).await.unwrap();
    }
    env.assert_nothing_left("volume subpaths").await;
    let _ = std::fs::remove_dir_all(&host);
}

/// Finding 1, raced: while sandbox A keeps swapping a real directory for a link to a host
/// directory, sandboxes created with that subpath either get the real directory or are
/// refused; the host directory is never mounted or changed.
#[tokio::test(flavor = "multi_thread")]
async fn volume_subpath_swapped_during_create_never_reaches_the_host() {
    let env = Env::new("volrace");
    let (host, canaries) = host_canaries("volrace-host");
    env.backend.create_volume("raced").await.unwrap();
    let swapper = env
        .create({
            let mut options = env.options("swapper");
            options.volumes = vec![mount("raced", "/vol", None)];
            options
        })
        .await;
    let h = host.display();
    let script = format!(
        "cd /vol && mkdir -p keep && while :; do mv keep held; ln -sfn '{h}' keep; \
         rm -f keep; mv held keep; done"
    );
    let spec = ProcessSpec::new(Command::argv(["bash", "-c", &script]));
    let swapping = env.backend.spawn(&swapper, spec).await.unwrap();
    let (mut mounted, mut refused) = (0, 0);
    for _ in 0..12 {
        let result = env
            .backend
            .create({
                let mut options = env.options("racer");
                options.volumes = vec![mount("raced", "/mnt/v", Some("keep"))];
                options
            })
            .await;
        match result {
            Ok(info) => {
                mounted += 1;
                // Whatever it got is the volume's directory, never the host's.
                let out = bash(
                    &*env.backend,
                    &info.id,
                    "test -e /mnt/v/secret && echo HOST; touch /mnt/v/x 2>/dev/null; true",
                )
                .await;
                assert!(!out.stdout_lossy().contains("HOST"), "host dir mounted");
                env.backend.destroy(&info.id).await.unwrap();
            }
            Err(e) => {
                refused += 1;
                assert!(
                    matches!(e.code(), ErrorCode::InvalidArgument | ErrorCode::NotFound),
                    "refused with an unexpected error: {e}"
                );
            }
        }
        canaries.assert_unchanged("during the swap race");
    }
    drop(swapping);
    env.backend.destroy(&swapper).await.unwrap();
    assert_eq!(mounted + refused, 12);
    env.assert_nothing_left("volume race").await;
    let _ = std::fs::remove_dir_all(&host);
}

/// Bad subpaths are refused as text before anything is created.
#[tokio::test(flavor = "multi_thread")]
async fn volume_subpaths_that_leave_the_volume_are_invalid() {
    let env = Env::new("volbad");
    // A bounded volume's size is the host disk its image takes: compared, not zero.
    let made = env.backend.create_volume("v").await.unwrap();
    for sub in ["/abs", "../up", "a/../../b", "", ".", "./", "a\0b"] {
        let err = env
            .backend
            .create({
                let mut options = env.options("bad");
                options.volumes = vec![mount("v", "/mnt/v", Some(sub))];
                options
            })
            .await
            .expect_err(sub);
        assert_eq!(err.code(), ErrorCode::InvalidArgument, "{sub:?}: {err}");
    }
    let info = env.backend.get_volume("v").await.unwrap();
    assert_eq!(info.size, made.size, "nothing was written to the volume");
    env.assert_nothing_left("bad subpaths").await;
}

/// The host cgroup file of sandbox `id` for `controller` (v1) or the unified one (v2).
fn cgroup_file(id: &str, controller: &str, v1: &str, v2: &str) -> Option<PathBuf> {
    let unified = PathBuf::from("/sys/fs/cgroup/sandcove").join(id).join(v2);
    let split = PathBuf::from("/sys/fs/cgroup")
        .join(controller)
        .join("sandcove")
        .join(id)
        .join(v1);
    [split, unified].into_iter().find(|p| p.exists())
}

fn read_number(path: &std::path::Path) -> u64 {
    let text = std::fs::read_to_string(path).unwrap();
    text.split_whitespace().next().unwrap().parse().unwrap()
}

/// Finding 12: a sandbox asked for 64 MiB cannot take more of the host's memory, whether it
/// allocates in a process or fills its tmpfs root; CPU quotas are written; the cgroup goes
/// with the sandbox. Where the host gives no cgroup (rootless, nothing delegated) the same
/// request is refused before anything is created.
#[tokio::test(flavor = "multi_thread")]
async fn memory_and_cpu_limits_are_enforced_or_refused() {
    let env = Env::new("limits");
    let caps = env.backend.capabilities();
    let mut options = env.options("limits");
    options.resources = sandcove::Resources::default().memory_mib(64).cpu(0.5);
    if !caps.memory_limit {
        eprintln!("no writable cgroup here: checking that limits are refused");
        let err = env.backend.create(options).await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::NotSupported, "{err}");
        assert!(env.state_entries().is_empty());
        return;
    }
    let id = env.create(options).await;
    let (memory_cap, memory_peak) = match (
        cgroup_file(&id, "memory", "memory.limit_in_bytes", "memory.max"),
        cgroup_file(&id, "memory", "memory.max_usage_in_bytes", "memory.peak"),
    ) {
        (Some(cap), Some(peak)) => (cap, peak),
        other => panic!("the sandbox has no memory cgroup: {other:?}"),
    };
    assert_eq!(read_number(&memory_cap), 64 << 20);
    let quota = cgroup_file(&id, "cpu", "cpu.cfs_quota_us", "cpu.max").expect("cpu cgroup");
    assert_eq!(read_number(&quota), 50_000);
    // The agent, which starts every sandbox process, is in the sandbox's cgroup in every
    // hierarchy (on v1 it moves itself in as its first act): nothing runs outside it.
    let (_, agent) = common::monitor_and_agent(&id).await;
    let groups = std::fs::read_to_string(format!("/proc/{agent}/cgroup")).unwrap();
    let ours = format!("/sandcove/{id}");
    let in_ours = |controller: &str| {
        groups.lines().any(|line| {
            let mut parts = line.splitn(3, ':');
            let (_, controllers, path) = (parts.next(), parts.next(), parts.next());
            let named =
                controllers.is_some_and(|c| c.split(',').any(|n| n == controller) || c.is_empty());
            named && path.is_some_and(|p| p.ends_with(&ours))
        })
    };
    for controller in ["memory", "cpu", "pids"] {
        assert!(
            in_ours(controller),
            "the agent is not in the sandbox's {controller} cgroup: {groups}"
        );
    }

    // A process that wants 300 MiB loses, and only it: the sandbox answers after.
    let hog = bash(
        &*env.backend,
        &id,
        "x=$(head -c 300M /dev/zero | tr '\\0' a); echo ${#x}",
    )
    .await;
    assert_ne!(hog.exit_code(), 0, "300 MiB fit in a 64 MiB sandbox");
    let out = bash(&*env.backend, &id, "echo alive").await;
    assert_eq!(out.stdout_lossy().trim(), "alive");
    // A 300 MiB file in the tmpfs root is charged to the sandbox too. Which process the
    // kernel ends at the limit is its choice (the agent is spared only where the host lets
    // the monitor lower its OOM score), so only the bound is asserted.
    let spec = ProcessSpec::new(Command::argv([
        "dd",
        "if=/dev/zero",
        "of=/tmp/fill",
        "bs=1M",
        "count=300",
    ]));
    if let Ok(mut stream) = env.backend.spawn(&id, spec).await {
        use futures::StreamExt;
        while let Some(Ok(_)) = stream.events.next().await {}
    }
    let peak = read_number(&memory_peak);
    assert!(peak <= 64 << 20, "the sandbox used {peak} bytes");
    let _ = env.backend.destroy(&id).await;
    let dir = memory_cap.parent().unwrap().to_path_buf();
    common::eventually(
        std::time::Duration::from_secs(30),
        "the sandbox's cgroup goes with it",
        || {
            let gone = sandcove_conformance::holds(!dir.exists(), dir.clone());
            async move { gone }
        },
    )
    .await;
    env.assert_nothing_left("limits").await;
}

/// A process whose background child keeps writing to the inherited output pipe still ends:
/// its exit is reported after a bounded drain (before, every read restarted the drain wait,
/// so the exit, and a facade's `stop`, waited forever).
#[tokio::test(flavor = "multi_thread")]
async fn a_descendant_writing_forever_does_not_hold_back_the_exit() {
    let env = Env::new("drain");
    let id = env.sandbox("drain").await;
    let spec = ProcessSpec::new(Command::argv([
        "bash",
        "-c",
        "(while :; do echo x; sleep 0.01; done) & exit 3",
    ]));
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        run(&*env.backend, &id, spec),
    )
    .await
    .expect("the exit is reported while the descendant still writes");
    assert_eq!(out.exit_code(), 3);
    env.backend.destroy(&id).await.unwrap();
    env.assert_nothing_left("drain").await;
}

/// Issue 13's rule for snapshots and forks: when the agent dies while a snapshot (or the
/// snapshot a fork takes) is being written, the error comes back only after the partial
/// archive is gone, and a failed fork leaves no new sandbox. The archive is written from
/// tens of thousands of small files, so the export runs long enough to be cut.
#[tokio::test(flavor = "multi_thread")]
async fn snapshots_and_forks_cut_off_midway_leave_nothing_behind() {
    let env = Env::new("cutsnap");
    let snapshots = env.dir.join("snapshots");
    let partials = || -> Vec<String> {
        std::fs::read_dir(&snapshots)
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.ends_with(".partial"))
                    .collect()
            })
            .unwrap_or_default()
    };
    for fork in [false, true] {
        let id = env.sandbox("cutsnap").await;
        let out = bash(
            &*env.backend,
            &id,
            "mkdir -p /workspace/many && cd /workspace/many && \
             head -c 160M /dev/zero | split -b 4k -a 6 - f && ls | wc -l",
        )
        .await;
        assert!(out.exit_code() == 0, "{}", out.stderr_lossy());
        let (_, agent) = common::monitor_and_agent(&id).await;
        let backend = env.backend.clone();
        let source = id.clone();
        let cut = tokio::spawn(async move {
            if fork {
                backend
                    .fork(&source, Default::default())
                    .await
                    .map(|info| info.id)
            } else {
                backend
                    .snapshot(&source, SnapshotOptions::default())
                    .await
                    .map(|info| info.id)
            }
        });
        common::eventually(common::PATIENCE, "the archive is being written", || {
            let seen = partials();
            let started = common::holds(!seen.is_empty(), seen);
            async move { started }
        })
        .await;
        common::signal(agent, libc::SIGKILL);
        let result = cut.await.unwrap();
        // The error is back: by now nothing of the attempt may remain.
        let left = partials();
        assert!(
            result.is_err(),
            "the export finished before the cut: {result:?}"
        );
        assert_eq!(left, Vec::<String>::new(), "partial archive left behind");
        assert_eq!(env.backend.list_snapshots().await.unwrap().len(), 0);
        let sandboxes = env.backend.list(Default::default()).await.unwrap();
        assert!(
            sandboxes.iter().all(|s| s.id == id),
            "a failed fork left a sandbox: {sandboxes:?}"
        );
        let _ = env.backend.destroy(&id).await;
    }
    env.assert_nothing_left("cut snapshots").await;
}
