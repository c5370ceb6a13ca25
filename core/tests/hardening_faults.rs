//! Hardening, part 2: faults (the creating program, a monitor or an agent killed) and
//! resource abuse (fork bombs, full disks, floods of output, processes ignoring SIGTERM),
//! against the embedded engine.
//!
//! The promise under test: sandboxes outlive the program that made them; a dead monitor takes
//! everything in its sandbox with it and leaves nothing the next program cannot collect; a
//! dead agent leaves a `Failed` sandbox that answers clearly and can be destroyed; abuse
//! inside a sandbox stays inside it, the host stays responsive, and destroy always ends it.
//!
//! Runs as root and rootless (CI runs this binary again as an unprivileged user).

// The helpers of the main test binary; this one uses part of them.
#[allow(dead_code, unused_imports)]
#[path = "it/hardening_common.rs"]
mod common;

use std::io::BufRead;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use futures::StreamExt;
use sandcove::{
    Backend, ByteStream, Client, Command, ErrorCode, ListOptions, LocalBackend, ProcessEvent,
    ProcessSpec, Resources, SandboxState, SetTimeoutOptions, Signal, SignalOptions, WriteOptions,
};
use sandcove_conformance::unique;

use common::{bash, equals, eventually, holds, host_process_count, Env, PATIENCE};

/// Env var through which a test tells its child program what to do.
const CHILD_ENV: &str = "SANDCOVE_HARDENING_CHILD";

/// Start two sleepers in a sandbox, named exactly `<marker>` and (daemonized in a session of
/// its own) `<marker>-daemon`, and wait until the host sees both.
async fn start_sleeper(backend: &dyn Backend, id: &str, marker: &str) {
    let spec = ProcessSpec::new(Command::argv([
        "bash",
        "-c",
        "setsid bash -c 'exec -a \"$M-daemon\" sleep 600' </dev/null >/dev/null 2>&1 & \
         exec -a \"$M\" sleep 600",
    ]))
    .env("M", marker);
    let before = sleepers(marker);
    drop(backend.spawn(id, spec).await.expect("spawn a sleeper"));
    eventually(PATIENCE, "both sleepers start", || async {
        equals(sleepers(marker), before + 2)
    })
    .await;
}

/// Host processes started by [`start_sleeper`] with `marker` (both names, exactly).
fn sleepers(marker: &str) -> usize {
    host_process_count(marker) + host_process_count(&format!("{marker}-daemon"))
}

// ---------------------------------------------------------------------------------------------
// The creating program is SIGKILLed
// ---------------------------------------------------------------------------------------------

/// A program creating sandboxes is SIGKILLed mid-life: its sandboxes keep running, a new
/// program lists and uses them, and they end at their lease leaving no process, mount or
/// state behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandboxes_outlive_a_killed_creator_and_end_at_their_lease() {
    let env = Env::new("creator");
    let marker = unique("hc-creator");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "creator_child", "--ignored", "--nocapture"])
        .env(CHILD_ENV, format!("{}|{marker}", env.dir.display()))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start the creator");
    // Wait for the child to report its sandboxes, then SIGKILL it mid-life.
    let stdout = child.stdout.take().unwrap();
    let ids = tokio::task::spawn_blocking(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let line = line.ok()?;
            if let Some(rest) = line.strip_prefix("CREATED ") {
                return Some(
                    rest.split_whitespace()
                        .map(String::from)
                        .collect::<Vec<_>>(),
                );
            }
        }
        None
    });
    let ids = tokio::time::timeout(Duration::from_secs(60), ids)
        .await
        .expect("the creator reports within a minute")
        .unwrap()
        .expect("the creator reported its sandboxes");
    // The creator's monitor spawner (its child) ends with it; the sandboxes do not.
    let spawner = common::all_processes()
        .into_iter()
        .find(|p| p.ppid == child.id() && p.comm == "sandcove-spawn" && p.state != 'Z')
        .expect("the creator runs a monitor spawner")
        .pid;
    child.kill().expect("SIGKILL the creator");
    let status = child.wait().unwrap();
    assert!(!status.success(), "the creator was killed, not finished");
    eventually(
        PATIENCE,
        "the creator's monitor spawner ends with it",
        || async {
            holds(
                !common::alive(spawner),
                format!("spawner {spawner} still runs"),
            )
        },
    )
    .await;
    assert_eq!(ids.len(), 2);

    // A new program (a fresh engine over the same state directory) finds and uses them.
    let again = LocalBackend::with_state_dir(&env.dir)
        .expect("a new program's engine")
        .with_warm_pool(0);
    let mut filter = ListOptions::default();
    filter.labels.insert(common::LABEL.into(), marker.clone());
    let listed = again.list(filter.clone()).await.expect("list");
    let mut listed_ids: Vec<String> = listed.iter().map(|s| s.id.clone()).collect();
    listed_ids.sort();
    let mut expected = ids.clone();
    expected.sort();
    assert_eq!(
        listed_ids, expected,
        "both sandboxes listed by the new program"
    );
    for id in &ids {
        let out = bash(&again, id, "cat /workspace/made-by; echo ran-again").await;
        assert_eq!(out.stdout, b"the creator\nran-again\n");
    }
    assert_eq!(
        sleepers(&marker),
        4,
        "the creator's background processes (2 per sandbox) still run"
    );
    // Then they end at their lease, with everything in them. The lease is shortened only now
    // (by the new program), so a slow machine cannot end it before the checks above.
    for id in &ids {
        let info = again
            .set_timeout(id, SetTimeoutOptions::new(Duration::from_secs(1)))
            .await
            .expect("shorten the lease");
        assert!(
            info.ends_at <= sandcove::now_millis() + 1_000,
            "short lease"
        );
    }
    eventually(PATIENCE, "no process outlives the lease", || async {
        equals(sleepers(&marker), 0)
    })
    .await;
    env.assert_nothing_left("after the lease").await;
    for id in &ids {
        let err = again.get(id).await.expect_err("gone");
        assert!(err.is_not_found(), "{err}");
    }
    assert!(again.list(filter).await.unwrap().is_empty());
    println!("hardening: creator SIGKILLed; 2 sandboxes survived, were used by a new program, and ended at their lease leaving nothing");
}

/// The program [`sandboxes_outlive_a_killed_creator_and_end_at_their_lease`] starts and
/// kills: creates two sandboxes with a short lease and background processes, reports, then
/// waits to be killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "started by sandboxes_outlive_a_killed_creator_and_end_at_their_lease"]
async fn creator_child() {
    let Ok(arg) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (dir, marker) = arg.split_once('|').expect("dir|marker");
    let backend = LocalBackend::with_state_dir(PathBuf::from(dir))
        .expect("engine")
        .with_warm_pool(0);
    let mut ids = Vec::new();
    let mut held = Vec::new();
    for _ in 0..2 {
        // Long enough for any machine: the parent shortens it once it has checked everything.
        let options = sandcove::CreateOptions::default()
            .timeout(Duration::from_secs(600))
            .label(common::LABEL, marker);
        let id = backend.create(options).await.expect("create").id;
        bash(&backend, &id, "echo 'the creator' > /workspace/made-by").await;
        start_sleeper(&backend, &id, marker).await;
        // A live stream the kill cuts.
        held.push(
            backend
                .spawn(&id, ProcessSpec::new(Command::argv(["sleep", "600"])))
                .await
                .expect("spawn"),
        );
        ids.push(id);
    }
    println!("CREATED {}", ids.join(" "));
    tokio::time::sleep(Duration::from_secs(600)).await;
    drop(held);
}

// ---------------------------------------------------------------------------------------------
// The monitor is SIGKILLed
// ---------------------------------------------------------------------------------------------

/// SIGKILL of a sandbox's monitor ends everything in the sandbox (daemonized processes
/// included), leaves nothing on the host the next program does not collect, and that next
/// program starts cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_monitor_takes_its_sandbox_with_it() {
    let env = Env::new("monkill");
    let id = env.sandbox(&unique("monkill")).await;
    let marker = unique("hc-monkill");
    start_sleeper(&*env.backend, &id, &marker).await;
    let (monitor, agent) = common::monitor_and_agent(&id).await;
    let sandbox_procs = common::descendants(agent);
    assert!(
        sandbox_procs.len() >= 2,
        "sandbox processes: {sandbox_procs:?}"
    );
    common::signal(monitor, libc::SIGKILL);
    eventually(
        PATIENCE,
        "the sandbox's processes die with their monitor",
        || async {
            let left: Vec<u32> = sandbox_procs
                .iter()
                .copied()
                .filter(|p| common::alive(*p))
                .collect();
            let named = sleepers(&marker);
            let agent_alive = common::alive(agent);
            holds(
                named == 0 && !agent_alive && left.is_empty(),
                format!("{named} sleepers, agent alive: {agent_alive}, alive: {left:?}"),
            )
        },
    )
    .await;
    // The next program collects the stale state and works.
    let next = LocalBackend::with_state_dir(&env.dir)
        .expect("the next program's engine")
        .with_warm_pool(0);
    assert!(
        env.state_entries().is_empty(),
        "stale state not collected: {:?}",
        env.state_entries()
    );
    assert!(!common::host_mounts_mention(&id));
    let err = next.get(&id).await.expect_err("gone");
    assert_eq!(err.code(), ErrorCode::NotFound, "{err}");
    let fresh = next
        .create(env.options(&unique("monkill-next")))
        .await
        .expect("create after a crash")
        .id;
    assert_eq!(bash(&next, &fresh, "echo clean").await.stdout, b"clean\n");
    next.destroy(&fresh).await.unwrap();
    env.assert_nothing_left("after a monitor crash").await;
    println!("hardening: monitor SIGKILLed; {} sandbox processes died with it; state collected by the next program", sandbox_procs.len());
}

// ---------------------------------------------------------------------------------------------
// The agent is SIGKILLed
// ---------------------------------------------------------------------------------------------

/// SIGKILL of the agent (PID 1 of the sandbox, the monitor's child): a live process stream
/// ends with an error, calls fail with a clear error instead of hanging, the sandbox reports
/// `Failed`, and destroy still works and leaves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_agent_leaves_a_failed_sandbox_that_destroy_removes() {
    let env = Env::new("agentkill");
    let id = env.sandbox(&unique("agentkill")).await;
    let marker = unique("hc-agentkill");
    start_sleeper(&*env.backend, &id, &marker).await;
    let mut live = env
        .backend
        .spawn(&id, ProcessSpec::new(Command::argv(["sleep", "600"])))
        .await
        .unwrap();
    let (monitor, agent) = common::monitor_and_agent(&id).await;
    common::signal(agent, libc::SIGKILL);

    // The live stream ends with an error, never silently and never hanging.
    let last = tokio::time::timeout(Duration::from_secs(30), async {
        let mut last = None;
        while let Some(ev) = live.events.next().await {
            last = Some(ev);
        }
        last
    })
    .await
    .expect("the live stream ends");
    assert!(
        matches!(last, Some(Err(_))),
        "a cut stream ends with an error: {last:?}"
    );
    eventually(
        PATIENCE,
        "no sandbox process outlives the agent",
        || async { equals(sleepers(&marker), 0) },
    )
    .await;
    // The sandbox reports Failed, from get and from list.
    eventually(PATIENCE, "the sandbox reports Failed", || async {
        equals(
            env.backend.get(&id).await.ok().map(|i| i.state),
            Some(SandboxState::Failed),
        )
    })
    .await;
    let listed = env.backend.list(Default::default()).await.unwrap();
    assert_eq!(
        listed.iter().find(|s| s.id == id).map(|s| s.state),
        Some(SandboxState::Failed)
    );
    // Calls fail with a clear error, never hang.
    let b = &*env.backend;
    let mut answers = Vec::new();
    macro_rules! fails {
        ($call:expr, $name:literal) => {{
            let r = tokio::time::timeout(Duration::from_secs(30), $call)
                .await
                .unwrap_or_else(|_| panic!("{} hung on a failed sandbox", $name));
            let e = r
                .err()
                .unwrap_or_else(|| panic!("{} succeeded on a failed sandbox", $name));
            answers.push(format!("{}: {:?}: {e}", $name, e.code()));
            assert!(
                matches!(e.code(), ErrorCode::InvalidState | ErrorCode::Backend),
                "{}: {e}",
                $name
            );
        }};
    }
    fails!(
        b.spawn(&id, ProcessSpec::new(Command::argv(["true"]))),
        "spawn"
    );
    fails!(
        b.read_file(&id, "/etc/hostname", Default::default()),
        "read_file"
    );
    fails!(
        b.write_file(&id, "/workspace/x", bytes(b"x"), WriteOptions::default()),
        "write_file"
    );
    fails!(b.list_processes(&id), "list_processes");
    fails!(b.stat(&id, "/workspace", Default::default()), "stat");
    fails!(b.pause(&id), "pause");
    // A failed sandbox is not a stopped one: nothing can start it again.
    fails!(b.start(&id), "start");
    fails!(b.metrics(&id), "metrics");
    let spawn_err = answers[0].to_lowercase();
    assert!(
        spawn_err.contains("stopped") || spawn_err.contains("agent"),
        "the error says why: {spawn_err}"
    );
    assert!(common::alive(monitor), "the monitor keeps answering");
    tokio::time::timeout(Duration::from_secs(30), env.backend.destroy(&id))
        .await
        .expect("destroy does not hang")
        .expect("destroy a failed sandbox");
    env.assert_nothing_left("after destroying a failed sandbox")
        .await;
    println!(
        "hardening: agent SIGKILLed; sandbox Failed; {} calls failed clearly: {answers:?}",
        answers.len()
    );
}

fn bytes(data: &[u8]) -> ByteStream {
    let data = data.to_vec();
    Box::pin(futures::stream::once(async move { Ok(data) }))
}

// ---------------------------------------------------------------------------------------------
// Resource abuse
// ---------------------------------------------------------------------------------------------

/// A fork bomb under a low `max_processes` stays under its limit, the host and a neighbouring
/// sandbox stay responsive, and destroy ends it completely.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_bomb_is_contained_and_destroyable() {
    const LIMIT: u64 = 48;
    let env = Env::new("forkbomb");
    let neighbour = env.sandbox(&unique("forkbomb-n")).await;
    let mut opts = env.options(&unique("forkbomb"));
    opts.resources = Resources::default().max_processes(LIMIT);
    let id = env.create(opts).await;
    let (_, agent) = common::monitor_and_agent(&id).await;
    let marker = unique("hc-bomb");
    // The bomb's shell is named exactly `marker` (`exec -a`), and so is every fork of it.
    let bomb = "bomb() { bomb | bomb & }; bomb; sleep 600";
    drop(
        env.backend
            .spawn(
                &id,
                ProcessSpec::new(Command::argv([
                    "bash",
                    "-c",
                    "exec -a \"$M\" bash -c \"$0\"",
                    bomb,
                ]))
                .env("M", &marker),
            )
            .await
            .expect("start the bomb"),
    );
    eventually(PATIENCE, "the bomb runs", || async {
        let n = host_process_count(&marker);
        holds(n > 4, n)
    })
    .await;
    // Time is the subject here: let it saturate for a while, sampling the process count.
    let mut peak = 0;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(4) {
        peak = peak.max(common::descendants(agent).len());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        peak as u64 <= LIMIT + 2,
        "the sandbox held {peak} processes with max_processes {LIMIT}"
    );
    // The host still forks, and a neighbouring sandbox still runs commands.
    let host = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new("true").status(),
    )
    .await
    .expect("the host can still start processes")
    .expect("spawn true");
    assert!(host.success());
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        bash(&*env.backend, &neighbour, "echo neighbour-ok"),
    )
    .await
    .expect("the neighbour answers");
    assert_eq!(out.stdout, b"neighbour-ok\n");
    tokio::time::timeout(Duration::from_secs(60), env.backend.destroy(&id))
        .await
        .expect("destroy does not hang")
        .expect("destroy the bombed sandbox");
    eventually(PATIENCE, "no bomb process outlives destroy", || async {
        equals(host_process_count(&marker), 0)
    })
    .await;
    env.backend.destroy(&neighbour).await.unwrap();
    env.assert_nothing_left("after the fork bomb").await;
    println!("hardening: fork bomb under max_processes={LIMIT}: peak {peak} processes, host and neighbour responsive, destroyed cleanly");
}

/// Filling `/tmp`, `/workspace` and `/dev/shm` hits ENOSPC inside at the sandbox's size; the
/// file API reports it as a typed error; the host's state directory does not grow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filling_the_disk_hits_enospc_inside() {
    const DISK_MIB: u64 = 24;
    let env = Env::new("diskfill");
    let mut opts = env.options(&unique("diskfill"));
    opts.resources.disk_mib = Some(DISK_MIB);
    let id = env.create(opts).await;
    let out = bash(
        &*env.backend,
        &id,
        "for f in /tmp/fill /workspace/fill /dev/shm/fill; do \
           dd if=/dev/zero of=$f bs=1M count=256 2>&1 | grep -o 'No space left on device' | head -1; \
           echo \"$f rc=${PIPESTATUS[0]}\"; \
           [ $f = /dev/shm/fill ] || df -k / | tail -1 | awk '{print \"size_kib=\" $2}'; rm -f $f; \
         done",
    )
    .await;
    let text = out.stdout_lossy();
    assert_eq!(
        text.matches("No space left on device").count(),
        3,
        "ENOSPC in /tmp, /workspace and /dev/shm: {text}"
    );
    for f in ["/tmp/fill", "/workspace/fill", "/dev/shm/fill"] {
        assert!(
            text.contains(&format!("{f} rc=1")),
            "{f} write failed: {text}"
        );
    }
    for line in text.lines().filter_map(|l| l.strip_prefix("size_kib=")) {
        let kib: u64 = line.trim().parse().unwrap();
        assert!(kib <= DISK_MIB * 1024, "root filesystem of {kib} KiB");
    }
    // The file API: a typed error, nothing half-written left in place.
    // Streamed in 1 MiB chunks, so this process holds little of it.
    let chunks = (0..DISK_MIB + 8).map(|_| Ok(vec![7u8; 1 << 20]));
    let big: ByteStream = Box::pin(futures::stream::iter(chunks));
    let err = env
        .backend
        .write_file(&id, "/workspace/big", big, WriteOptions::default())
        .await
        .expect_err("a write beyond the disk size fails");
    assert!(
        matches!(
            err,
            sandcove::Error::Io {
                errno: Some(libc::ENOSPC),
                ..
            }
        ),
        "{err:?}"
    );
    let ls = bash(&*env.backend, &id, "ls -A /workspace; df -k / | tail -1").await;
    assert!(!ls.stdout_lossy().contains("big"), "{}", ls.stdout_lossy());
    // The sandbox recovers; the host's state directory stayed small.
    assert_eq!(bash(&*env.backend, &id, "echo ok").await.stdout, b"ok\n");
    let footprint = dir_size(&env.dir);
    assert!(
        footprint < 1 << 20,
        "state directory holds {footprint} bytes"
    );
    println!("hardening: /tmp, /workspace, /dev/shm and the file API hit ENOSPC at disk_mib={DISK_MIB}; state dir {footprint} bytes");
}

fn dir_size(path: &std::path::Path) -> u64 {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    if !meta.is_dir() {
        return meta.len();
    }
    std::fs::read_dir(path)
        .map(|d| d.flatten().map(|e| dir_size(&e.path())).sum())
        .unwrap_or(0)
}

/// 1 GiB written to stdout is streamed through with bounded memory in this (client) process,
/// and collecting it keeps the default limit and sets the truncation flag: never an OOM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gibibyte_of_stdout_never_exhausts_client_memory() {
    const GIB: u64 = 1 << 30;
    let env = Env::new("flood");
    let id = env.sandbox(&unique("flood")).await;
    let rss_before = common::rss_kib();
    let spec = ProcessSpec::new(Command::argv(["head", "-c", &GIB.to_string(), "/dev/zero"]));
    let mut stream = env.backend.spawn(&id, spec).await.unwrap();
    let mut total = 0u64;
    let mut peak_rss = rss_before;
    let mut events = 0u64;
    let exit = loop {
        match stream.events.next().await {
            Some(Ok(ProcessEvent::Stdout(b))) => {
                assert!(b.iter().all(|&x| x == 0));
                total += b.len() as u64;
                events += 1;
                if events % 256 == 0 {
                    peak_rss = peak_rss.max(common::rss_kib());
                }
            }
            Some(Ok(ProcessEvent::Exit(s))) => break s,
            Some(Ok(_)) => {}
            Some(Err(e)) => panic!("stream error after {total} bytes: {e}"),
            None => panic!("stream ended without exit after {total} bytes"),
        }
    };
    assert!(exit.success());
    assert_eq!(total, GIB, "every byte streamed");
    let streamed_growth = peak_rss.saturating_sub(rss_before);
    assert!(
        streamed_growth < 128 * 1024,
        "streaming 1 GiB grew this process by {streamed_growth} KiB"
    );
    // Collected: the default limit holds, the flag is set.
    let client = Client::new(env.backend.clone());
    let sandbox = client.connect(&id).await.unwrap();
    let before = common::rss_kib();
    let out = sandbox
        .run(ProcessSpec::new(Command::argv([
            "head",
            "-c",
            &GIB.to_string(),
            "/dev/zero",
        ])))
        .await
        .unwrap();
    let collected_growth = common::rss_kib().saturating_sub(before);
    assert!(out.truncated, "the truncation flag is set");
    assert_eq!(out.stdout.len(), sandcove::DEFAULT_OUTPUT_LIMIT);
    assert!(out.exit_status().success());
    assert!(
        collected_growth < 256 * 1024,
        "collecting 1 GiB grew this process by {collected_growth} KiB"
    );
    println!("hardening: 1 GiB stdout streamed (+{streamed_growth} KiB peak RSS) and collected with truncation (+{collected_growth} KiB)");
}

/// A process ignoring SIGTERM (and its daemonized child) survives signals but not destroy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_ignoring_sigterm_is_ended_by_destroy() {
    let env = Env::new("stubborn");
    let id = env.sandbox(&unique("stubborn")).await;
    let marker = unique("hc-stubborn");
    let spec = ProcessSpec::new(Command::argv([
        "bash",
        "-c",
        "trap '' TERM INT HUP; \
         setsid bash -c 'trap \"\" TERM INT HUP; exec -a \"$M-daemon\" sleep 600' </dev/null >/dev/null 2>&1 & \
         exec -a \"$M\" sleep 600",
    ]))
    .env("M", &marker)
    .tag("stubborn");
    drop(env.backend.spawn(&id, spec).await.unwrap());
    eventually(PATIENCE, "both stubborn sleepers run", || async {
        equals(sleepers(&marker), 2)
    })
    .await;
    for s in [Signal::Term, Signal::Int, Signal::Hup] {
        env.backend
            .signal(
                &id,
                sandcove::ProcessSelector::Tag("stubborn".into()),
                SignalOptions::new(s),
            )
            .await
            .unwrap();
    }
    // A negative check (nothing may die): the grace period gives a wrongly delivered signal
    // time to act; on a slow machine it can only hide a failure, never cause one.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(sleepers(&marker), 2, "SIGTERM was ignored");
    tokio::time::timeout(Duration::from_secs(30), env.backend.destroy(&id))
        .await
        .expect("destroy does not hang")
        .unwrap();
    eventually(
        PATIENCE,
        "no SIGTERM-ignoring process outlives destroy",
        || async { equals(sleepers(&marker), 0) },
    )
    .await;
    env.assert_nothing_left("after destroying stubborn processes")
        .await;
}
