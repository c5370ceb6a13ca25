//! The conformance suite and engine-specific behaviour, against the embedded local engine.

use std::sync::Arc;

use sandcove::{
    Backend, Command, ErrorCode, LocalBackend, NetworkPolicy, ProcessSelector, ProcessSpec,
    WriteStdinOptions,
};
use sandcove_conformance::{
    equals, eventually, host_process_count, run, sh, test_options, unique, PATIENCE,
};

fn local() -> Arc<dyn Backend> {
    Arc::new(LocalBackend::new().expect("local engine"))
}

sandcove_conformance::conformance_tests!(async { local() });

/// Env var through which the cross-process test tells its child what to do.
const CHILD_ENV: &str = "SANDCOVE_TEST_CHILD_SANDBOX";

/// A sandbox created by one program is found, used and destroyed by another.
#[tokio::test]
async fn a_second_program_uses_and_destroys_a_sandbox() {
    let backend = local();
    let id = backend
        .create(test_options(&unique("xproc")))
        .await
        .expect("create")
        .id;
    sh(&*backend, &id, "echo from-parent > /workspace/note").await;
    // A background process the second program attaches to by tag.
    let spec = ProcessSpec::new(Command::sh(
        "for i in 1 2 3; do echo line$i; done; read x; echo got $x",
    ))
    .tag("bg")
    .stdin(true);
    drop(backend.spawn(&id, spec).await.expect("spawn"));
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            // Test names in this binary start with their module's.
            "local_engine::second_program_child",
            "--ignored",
            "--nocapture",
        ])
        .env(CHILD_ENV, &id)
        .status()
        .expect("run the second program");
    assert!(status.success(), "the second program succeeded");
    let err = backend.get(&id).await.expect_err("destroyed by the child");
    assert!(err.is_not_found());
}

/// The second program of [`a_second_program_uses_and_destroys_a_sandbox`]; runs only when
/// that test starts it.
#[tokio::test]
#[ignore = "started by a_second_program_uses_and_destroys_a_sandbox"]
async fn second_program_child() {
    let Ok(id) = std::env::var(CHILD_ENV) else {
        return;
    };
    let backend = local();
    let listed = backend.list(Default::default()).await.expect("list");
    assert!(
        listed.iter().any(|s| s.id == id),
        "listed from another program"
    );
    let out = sh(&*backend, &id, "cat /workspace/note").await;
    assert_eq!(out.stdout, b"from-parent\n");
    // Reconnect to the first program's background process: its output so far, then live.
    let attached = backend
        .attach(&id, ProcessSelector::Tag("bg".into()))
        .await
        .expect("attach from another program");
    backend
        .write_stdin(
            &id,
            ProcessSelector::Tag("bg".into()),
            WriteStdinOptions::new(b"hello\n"),
        )
        .await
        .expect("stdin from another program");
    let out = sandcove::client::collect(attached, usize::MAX)
        .await
        .expect("collect");
    assert_eq!(out.stdout, b"line1\nline2\nline3\ngot hello\n");
    backend.destroy(&id).await.expect("destroy");
}

/// A sandbox outlives the program that created it.
#[tokio::test]
async fn sandboxes_outlive_their_creator() {
    let backend = local();
    let marker = unique("outlive");
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "local_engine::creator_child",
            "--ignored",
            "--nocapture",
        ])
        .env(CHILD_ENV, &marker)
        .status()
        .expect("run the creator");
    assert!(status.success());
    let mut filter = sandcove::ListOptions::default();
    filter.labels.insert("conformance".into(), marker.clone());
    let found = backend.list(filter).await.expect("list");
    assert_eq!(found.len(), 1, "the creator's sandbox is still alive");
    let out = sh(&*backend, &found[0].id, "cat /workspace/alive").await;
    assert_eq!(out.stdout, b"yes\n");
    backend.destroy(&found[0].id).await.expect("destroy");
}

#[tokio::test]
#[ignore = "started by sandboxes_outlive_their_creator"]
async fn creator_child() {
    let Ok(marker) = std::env::var(CHILD_ENV) else {
        return;
    };
    let backend = local();
    let id = backend
        .create(test_options(&marker))
        .await
        .expect("create")
        .id;
    sh(&*backend, &id, "echo yes > /workspace/alive").await;
    // Exit without destroying.
}

/// A state directory whose monitor is gone is collected by the next program.
#[tokio::test]
async fn stale_state_is_collected() {
    let dir = std::env::temp_dir().join(unique("state"));
    let backend = LocalBackend::with_state_dir(&dir).expect("engine");
    let stale = dir.join("sandboxes").join("stalesandbox00000000");
    std::fs::create_dir_all(&stale).unwrap();
    std::fs::write(stale.join("lock"), b"").unwrap();
    let err = backend
        .get("stalesandbox00000000")
        .await
        .expect_err("stale");
    assert!(err.is_not_found());
    assert!(!stale.exists(), "collected on access");
    std::fs::create_dir_all(&stale).unwrap();
    assert_eq!(backend.collect_stale(), 1);
    assert!(!stale.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A name entry whose holder is gone (its creator or monitor died: the sandbox's lock is
/// free) is taken over by the next create; one whose holder is still creating (its staging
/// lock held, as by another program mid-create) is not.
///
/// A lock file this test opens can stay held for a moment by a child another test forks
/// before that child's exec closes it; so "free again" is waited for, never assumed.
#[tokio::test]
async fn names_of_dead_holders_are_reclaimed_and_of_creating_ones_are_not() {
    let dir = std::env::temp_dir().join(unique("state"));
    let backend = LocalBackend::with_state_dir(&dir).expect("engine");
    let names = dir.join("names");
    std::fs::create_dir_all(&names).unwrap();
    let plant = |sandbox_dir: &str, name: &str, holder: &str| {
        let holder_dir = dir.join("sandboxes").join(sandbox_dir);
        std::fs::create_dir_all(&holder_dir).unwrap();
        let lock = std::fs::File::create(holder_dir.join("lock")).unwrap();
        std::os::unix::fs::symlink(holder, names.join(name)).unwrap();
        lock
    };
    let named = |name: &str| test_options(&unique("reclaim")).name(name.to_string());
    let create_when_free = |name: &'static str| {
        let backend = backend.clone();
        let options = named(name);
        async move {
            eventually(PATIENCE, &format!("the name {name:?} is free"), || {
                let (backend, options) = (backend.clone(), options.clone());
                async move { backend.create(options).await }
            })
            .await
        }
    };

    // A dead monitor: its sandbox directory remains, its lock is free.
    drop(plant(
        "deadsandbox000000000",
        "taken-by-the-dead",
        "deadsandbox000000000",
    ));
    let reclaimed = create_when_free("taken-by-the-dead").await;
    assert_eq!(
        std::fs::read_link(names.join("taken-by-the-dead")).unwrap(),
        std::path::Path::new(&reclaimed.id),
        "the entry now names the new sandbox"
    );

    // Another program mid-create: staging directory, lock held.
    let held = plant(
        ".busysandbox000000000",
        "being-created",
        "busysandbox000000000",
    );
    held.try_lock().expect("hold the staging lock");
    let err = backend
        .create(named("being-created"))
        .await
        .expect_err("a name being taken by a live creator");
    assert_eq!(err.code(), ErrorCode::AlreadyExists, "{err}");
    // That creator dies before finishing: the name becomes free.
    drop(held);
    let after = create_when_free("being-created").await;

    // Stale entries are collected with stale state; live ones are kept.
    drop(plant(
        "gonesandbox000000000",
        "left-behind",
        "gonesandbox000000000",
    ));
    eventually(PATIENCE, "a dead holder's entry is collected", || async {
        backend.collect_stale();
        sandcove_conformance::holds(
            std::fs::symlink_metadata(names.join("left-behind")).is_err(),
            "still there",
        )
    })
    .await;
    assert_eq!(
        std::fs::read_link(names.join("being-created")).unwrap(),
        std::path::Path::new(&after.id),
        "a live holder's entry is kept"
    );
    for id in [reclaimed.id, after.id] {
        backend.destroy(&id).await.expect("destroy");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Creates racing to take over a dead holder's name: exactly one wins (replacing a stale
/// entry must not let two creators each think they hold the name).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_creates_over_a_stale_name_leave_one_winner() {
    const RACERS: usize = 8;
    let dir = std::env::temp_dir().join(unique("state"));
    let backend = LocalBackend::with_state_dir(&dir).expect("engine");
    let names = dir.join("names");
    std::fs::create_dir_all(&names).unwrap();
    for round in 0..40 {
        let name = format!("stale-{round}");
        let holder = format!("deadsandbox{round:09}");
        // A holder whose lock file is gone is dead; no file is opened here, so no child
        // another test forks can hold it for a moment.
        std::fs::create_dir_all(dir.join("sandboxes").join(&holder)).unwrap();
        std::os::unix::fs::symlink(&holder, names.join(&name)).unwrap();
        let label = unique("stalerace");
        let results = futures::future::join_all((0..RACERS).map(|_| {
            let backend = backend.clone();
            let options = test_options(&label).name(name.clone());
            tokio::spawn(async move { backend.create(options).await })
        }))
        .await;
        let mut winners = Vec::new();
        for result in results {
            match result.expect("task") {
                Ok(info) => winners.push(info.id),
                Err(e) if e.code() == ErrorCode::AlreadyExists => {}
                Err(e) => panic!("a racing create failed otherwise: {e}"),
            }
        }
        for id in &winners {
            backend.destroy(id).await.expect("destroy");
        }
        assert_eq!(
            winners.len(),
            1,
            "round {round}: one winner, got {winners:?}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A client speaking another protocol version gets a clear, typed error, not garbage (only the
/// frozen `info` and `destroy` requests are served to every version).
#[tokio::test]
async fn a_protocol_version_mismatch_is_a_clear_error() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = std::env::temp_dir().join(unique("ver"));
    let backend = LocalBackend::with_state_dir(&dir).expect("engine");
    let id = backend
        .create(test_options("version"))
        .await
        .expect("create")
        .id;
    let sock = dir.join("sandboxes").join(&id).join("sock");
    let mut stream = tokio::net::UnixStream::connect(&sock)
        .await
        .expect("connect");
    let head = br#"{"version":999,"request":{"op":"pause"}}"#;
    let mut frame = Vec::new();
    frame.extend_from_slice(&(head.len() as u32).to_le_bytes());
    frame.extend_from_slice(&0u32.to_le_bytes());
    frame.extend_from_slice(head);
    stream.write_all(&frame).await.unwrap();
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply).await.unwrap();
    let text = String::from_utf8_lossy(&reply);
    assert!(text.contains("protocol version mismatch"), "{text}");
    assert!(text.contains(r#""code":"unavailable""#), "{text}");
    let info = backend.get(&id).await.expect("get");
    assert_eq!(info.state, sandcove::SandboxState::Running, "not paused");
    backend.destroy(&id).await.expect("destroy");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The state directory of a destroyed sandbox is removed.
#[tokio::test]
async fn destroy_removes_state() {
    let dir = std::env::temp_dir().join(unique("rmstate"));
    let backend = LocalBackend::with_state_dir(&dir).expect("engine");
    let id = backend.create(test_options("rm")).await.expect("create").id;
    let sdir = dir.join("sandboxes").join(&id);
    assert!(sdir.join("sock").exists());
    backend.destroy(&id).await.expect("destroy");
    assert!(!sdir.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A cold create hands its program a connection to the agent with the readiness report:
/// the first call needs no dial of the monitor's socket (here moved out of the way, so a
/// dial would fail), and the sandbox serves later calls as ever.
#[tokio::test]
async fn the_first_call_after_a_cold_create_needs_no_dial() {
    let dir = std::env::temp_dir().join(unique("firstconn"));
    let backend = LocalBackend::with_state_dir(&dir)
        .expect("engine")
        .with_warm_pool(0);
    let id = backend
        .create(test_options("first"))
        .await
        .expect("create")
        .id;
    let sock = dir.join("sandboxes").join(&id).join("sock");
    let away = sock.with_file_name("sock.away");
    std::fs::rename(&sock, &away).unwrap();
    let first = backend
        .spawn(&id, ProcessSpec::new(Command::sh("echo first")))
        .await;
    // Back before any assertion, so a failure still destroys the sandbox below.
    std::fs::rename(&away, &sock).unwrap();
    let outcome = match first {
        Ok(mut stream) => {
            use futures::StreamExt;
            let mut out = Vec::new();
            while let Some(Ok(event)) = stream.events.next().await {
                if let sandcove::ProcessEvent::Stdout(bytes) = event {
                    out.extend_from_slice(&bytes);
                }
            }
            Ok(out)
        }
        Err(e) => Err(e),
    };
    let later = sh(&backend, &id, "echo later").await;
    backend.destroy(&id).await.expect("destroy");
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(
        outcome.expect("the first call went on the connection from create"),
        b"first\n"
    );
    assert_eq!(later.stdout_lossy(), "later\n");
}

/// Killing the monitor ends every process of the sandbox, and the next call collects it.
#[tokio::test]
async fn a_dead_monitor_takes_its_sandbox_with_it() {
    let backend = local();
    let id = backend
        .create(test_options(&unique("monkill")))
        .await
        .expect("create")
        .id;
    let marker = unique("orphan");
    let spec = ProcessSpec::new(Command::bash_login(format!("exec -a {marker} sleep 600")));
    drop(backend.spawn(&id, spec).await.expect("spawn"));
    let marker = &marker;
    eventually(PATIENCE, "the sleeper runs", || async move {
        equals(host_process_count(marker), 1)
    })
    .await;
    let pid = eventually(PATIENCE, "the monitor is found", || async {
        find_monitor(&id).ok_or("no monitor")
    })
    .await;
    // SAFETY-free: kill(1) through the shell keeps this test free of unsafe.
    let killed = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success(), "kill -9 {pid}");
    eventually(
        PATIENCE,
        "the sandbox's processes died with the monitor",
        || async move { equals(host_process_count(marker), 0) },
    )
    .await;
    let err = backend.get(&id).await.expect_err("gone");
    assert_eq!(err.code(), ErrorCode::NotFound);
}

/// The pid of the monitor serving sandbox `id`: the process named `sandcove-mon` that holds
/// the sandbox's `<state dir>/sandboxes/<id>/lock` open (every monitor does, for its life).
fn find_monitor(id: &str) -> Option<u32> {
    let lock_suffix = format!("/sandboxes/{id}/lock");
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Ok(pid) = name.parse::<u32>() else {
            continue;
        };
        let Ok(comm) = std::fs::read_to_string(entry.path().join("comm")) else {
            continue;
        };
        if comm.trim_end() != "sandcove-mon" {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        if fds
            .flatten()
            .filter_map(|fd| std::fs::read_link(fd.path()).ok())
            .any(|file| file.to_string_lossy().ends_with(&lock_suffix))
        {
            return Some(pid);
        }
    }
    None
}

/// The explicit un-isolated mode says so, and still keeps sandbox paths apart from each other
/// and destroys every process it started.
#[tokio::test]
async fn unisolated_mode_is_explicit_and_cleans_up() {
    let dir = std::env::temp_dir().join(unique("uniso"));
    let backend = LocalBackend::unisolated(&dir).expect("engine");
    let caps = backend.capabilities();
    assert!(!caps.isolated && !caps.pause && !caps.snapshots && !caps.volumes);
    let id = backend
        .create(test_options("uniso"))
        .await
        .expect("create")
        .id;
    backend
        .write_file(
            &id,
            "notes/a.txt",
            Box::pin(futures::stream::once(async { Ok(b"hi".to_vec()) })),
            Default::default(),
        )
        .await
        .expect("write");
    let stat = backend
        .stat(&id, "notes/a.txt", Default::default())
        .await
        .expect("stat");
    assert_eq!(
        stat.path, "/workspace/notes/a.txt",
        "sandbox paths, not host paths"
    );
    let out = sh(&backend, &id, "cat notes/a.txt; pwd").await;
    assert!(
        out.stdout_lossy().starts_with("hi"),
        "{}",
        out.stdout_lossy()
    );
    // `..` is clamped inside the sandbox's own root: a file that exists only on the host is
    // neither seen nor written through a `..` chain.
    let host_dir = std::env::temp_dir().join(unique("uniso-host"));
    std::fs::create_dir_all(&host_dir).unwrap();
    let host_only = host_dir.join("host-only");
    std::fs::write(&host_only, b"host").unwrap();
    let climb = "../../../../../../../../../../..";
    let seen = backend
        .stat(
            &id,
            &format!("{climb}{}", host_only.display()),
            Default::default(),
        )
        .await;
    assert!(
        matches!(&seen, Err(e) if e.is_not_found()),
        "a host-only file is reachable through `..`: {seen:?}"
    );
    let written = host_dir.join("written");
    backend
        .write_file(
            &id,
            &format!("{climb}{}", written.display()),
            Box::pin(futures::stream::once(async { Ok(b"x".to_vec()) })),
            Default::default(),
        )
        .await
        .expect("a `..` write lands inside the sandbox");
    assert!(!written.exists(), "a `..` write created a host file");
    assert_eq!(std::fs::read(&host_only).unwrap(), b"host");
    let _ = std::fs::remove_dir_all(&host_dir);
    let marker = unique("unisobg");
    let spec = ProcessSpec::new(Command::bash_login(format!(
        "(exec -a {marker} sleep 600) & exec -a {marker} sleep 600"
    )));
    drop(backend.spawn(&id, spec).await.expect("spawn"));
    let marker = &marker;
    eventually(PATIENCE, "both sleepers run", || async move {
        equals(host_process_count(marker), 2)
    })
    .await;
    expect_not_supported(backend.pause(&id).await.map(drop));
    backend.destroy(&id).await.expect("destroy");
    eventually(PATIENCE, "destroy ended every process", || async move {
        equals(host_process_count(marker), 0)
    })
    .await;
    let _ = std::fs::remove_dir_all(&dir);
}

fn expect_not_supported(result: sandcove::Result<()>) {
    match result {
        Err(e) => assert_eq!(e.code(), ErrorCode::NotSupported, "{e}"),
        Ok(()) => panic!("expected NotSupported"),
    }
}

/// Sandbox processes cannot make namespaces or mount, yet threads and forks work.
#[tokio::test]
async fn namespaces_and_mounts_are_refused_inside() {
    let backend = local();
    let id = backend
        .create(test_options(&unique("seccomp")))
        .await
        .expect("create")
        .id;
    let out = sh(
        &*backend,
        &id,
        "unshare -Ur true 2>/dev/null; echo userns=$?; unshare -m true 2>/dev/null; echo mountns=$?; \
         mkdir -p /tmp/m; mount -t tmpfs none /tmp/m 2>/dev/null; echo mount=$?",
    )
    .await;
    let text = out.stdout_lossy();
    for line in text.lines() {
        assert!(!line.ends_with("=0"), "{text}");
    }
    let out = sh(
        &*backend,
        &id,
        "python3 -c 'import threading; t=threading.Thread(target=print, args=(\"thread ok\",)); t.start(); t.join()'; echo a | cat",
    )
    .await;
    assert_eq!(out.stdout_lossy(), "thread ok\na\n");
    backend.destroy(&id).await.expect("destroy");
}

/// An engine configured with a smaller largest file refuses a larger write with
/// `FileTooLarge` naming its bound, leaves no file, reports the bound in its capabilities, and
/// takes a file at the bound; a bound of zero or past the agent's is refused.
#[tokio::test]
async fn a_configured_max_file_bytes_refuses_larger_writes() {
    let engine = LocalBackend::new()
        .expect("local engine")
        .with_max_file_bytes(1024)
        .expect("a 1 KiB bound");
    assert_eq!(engine.capabilities().max_file_bytes, 1024);
    assert!(LocalBackend::new().unwrap().with_max_file_bytes(0).is_err());
    assert!(LocalBackend::new()
        .unwrap()
        .with_max_file_bytes(sandcove::backend::local::MAX_FILE_BYTES + 1)
        .is_err());
    let id = engine
        .create(test_options(&unique("maxfile")))
        .await
        .expect("create")
        .id;
    let write = |len: usize, max: Option<u64>| {
        let mut options = sandcove::WriteOptions::default();
        options.max_bytes = max;
        engine.write_file(
            &id,
            "big.bin",
            Box::pin(futures::stream::once(async move { Ok(vec![7u8; len]) })),
            options,
        )
    };
    let err = write(2048, None)
        .await
        .expect_err("over the engine's bound");
    match &err {
        sandcove::Error::FileTooLarge { limit, remedy, .. } => {
            assert_eq!(*limit, 1024, "{err}");
            assert!(remedy.contains("max_file_bytes"), "{err}");
        }
        other => panic!("expected FileTooLarge, got {other:?}"),
    }
    let err = write(2048, Some(1 << 20))
        .await
        .expect_err("a larger call bound");
    assert_eq!(err.code(), ErrorCode::FileTooLarge, "{err}");
    let gone = engine.stat(&id, "big.bin", Default::default()).await;
    assert!(gone.unwrap_err().is_not_found(), "no partial file is left");
    let stat = write(1024, None).await.expect("a file at the bound");
    assert_eq!(stat.size, 1024);
    engine.destroy(&id).await.expect("destroy");
}

/// The embedded engine records no operations and says so instead of guessing.
#[tokio::test]
async fn the_engine_answers_unknown_about_operations() {
    let backend = local();
    let status = backend
        .observe(&sandcove::OperationId::new())
        .await
        .expect("observe");
    match status {
        sandcove::OperationStatus::Unknown { reason } => {
            assert!(reason.contains("does not record operations"), "{reason}")
        }
        other => panic!("expected Unknown, got {other:?}"),
    }
}

/// A create the warm pool serves matches a cold one in everything a caller can observe (the
/// conformance case, with another default user and with the member's own), and it really
/// was served by the pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claimed_warm_sandbox_matches_a_cold_one() {
    let warm = LocalBackend::new().expect("engine").with_warm_pool(1);
    let cold = LocalBackend::new().expect("engine").with_warm_pool(0);
    // The first create starts the pool filling.
    let first = warm
        .create(test_options(&unique("warm-start")))
        .await
        .expect("create");
    warm.destroy(&first.id).await.expect("destroy");
    eventually(PATIENCE, "the pool holds a member", || async {
        equals(warm.warm_ready(), 1)
    })
    .await;
    let claims = warm.warm_claims();
    sandcove_conformance::claimed_sandbox_matches_a_cold_one(&warm, &cold).await;
    assert_eq!(
        warm.warm_claims(),
        claims + 1,
        "the first sandbox was claimed"
    );
    // Again with the member's own users, which the claim keeps (no file rewritten).
    eventually(PATIENCE, "the pool holds a member again", || async {
        equals(warm.warm_ready(), 1)
    })
    .await;
    sandcove_conformance::claimed_sandbox_with_the_default_user_matches_a_cold_one(&warm, &cold)
        .await;
    assert_eq!(
        warm.warm_claims(),
        claims + 2,
        "the second sandbox was claimed"
    );
    assert_eq!(cold.warm_claims(), 0);
}

/// The shape the Daytona and E2B listeners create by default (internet where the engine has
/// it, the vendor's user and home) is served by the pool once a create asked for it, and the
/// claimed sandbox matches a cold one: its home made and owned as a cold create's, its
/// network the policy's (the claim keeps the member's namespace and helper).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vendor_shaped_create_is_served_warm_and_matches_a_cold_one() {
    let warm = LocalBackend::new().expect("engine").with_warm_pool(1);
    let cold = LocalBackend::new().expect("engine").with_warm_pool(0);
    let network = warm.capabilities().vendor_internet_default();
    let vendor = |marker: &str| {
        let mut o = test_options(marker).user("daytona").home("/home/daytona");
        o.network = network.clone();
        o
    };
    // The first create of the shape goes cold and has the pool keep that shape warm.
    let first = warm
        .create(vendor(&unique("vendor-start")))
        .await
        .expect("create");
    warm.destroy(&first.id).await.expect("destroy");
    eventually(PATIENCE, "the pool holds a member", || async {
        equals(warm.warm_ready(), 1)
    })
    .await;
    let claims = warm.warm_claims();
    sandcove_conformance::claimed_sandbox_in_a_vendor_shape_matches_a_cold_one(
        &warm, &cold, network,
    )
    .await;
    assert_eq!(warm.warm_claims(), claims + 1, "served by the pool");
}

/// Two creates at once with a pool of two members of their shape get two different members,
/// both warm; a create of another shape then has the pool follow it, never holding more
/// than its size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creates_get_different_members_and_the_pool_follows_the_shapes_asked_for() {
    let dir = std::env::temp_dir().join(unique("pool-shapes"));
    let warm = LocalBackend::with_state_dir(&dir)
        .expect("engine")
        .with_warm_pool(2);
    let network = warm.capabilities().vendor_internet_default();
    let vendor = |marker: &str| {
        let mut o = test_options(marker).user("user").home("/home/user");
        o.network = network.clone();
        o
    };
    let entries = || {
        std::fs::read_dir(dir.join("sandboxes"))
            .map(|d| {
                d.flatten()
                    .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
                    .count()
            })
            .unwrap_or(0)
    };
    let first = warm
        .create(vendor(&unique("pool-shapes")))
        .await
        .expect("create");
    warm.destroy(&first.id).await.expect("destroy");
    eventually(PATIENCE, "two members ready", || async {
        equals((warm.warm_ready(), entries()), (2, 2))
    })
    .await;
    let claims = warm.warm_claims();
    let (a, b) = tokio::join!(
        warm.create(vendor(&unique("pool-shapes"))),
        warm.create(vendor(&unique("pool-shapes")))
    );
    let (a, b) = (a.expect("create"), b.expect("create"));
    assert_ne!(a.id, b.id, "one member each");
    assert_eq!(warm.warm_claims(), claims + 2, "both served by the pool");
    for info in [&a, &b] {
        assert_eq!(info.network, network);
        let out = sh(&warm, &info.id, "id -un; echo $HOME").await;
        assert_eq!(out.stdout_lossy(), "user\n/home/user\n");
    }
    // A native create of the default shape: the pool now keeps one of each. It never holds
    // more members than its size (the claimed two are the caller's).
    let native = warm
        .create(test_options(&unique("pool-shapes")))
        .await
        .expect("create");
    let native_shape = test_options("shape");
    let vendor_shape = vendor("shape");
    eventually(PATIENCE, "one member of each shape", || async {
        let ready = (
            warm.warm_ready_for(&native_shape),
            warm.warm_ready_for(&vendor_shape),
        );
        // Without internet here, both creates are of the default shape.
        let expected = if network == NetworkPolicy::Internet {
            (1, 1)
        } else {
            (2, 2)
        };
        equals((ready, entries()), (expected, 5))
    })
    .await;
    let claims = warm.warm_claims();
    let again = warm
        .create(test_options(&unique("pool-shapes")))
        .await
        .expect("create");
    assert_eq!(
        warm.warm_claims(),
        claims + 1,
        "the default shape is warm again"
    );
    for id in [a.id, b.id, native.id, again.id] {
        warm.destroy(&id).await.expect("destroy");
    }
    drop(warm);
    eventually(PATIENCE, "the members end with their engine", || async {
        equals(entries(), 0)
    })
    .await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Pool members never show in `list`, of this program or another one, though they exist;
/// dropping the engine ends them, leaving no tombstone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_pool_members_are_never_listed_and_end_with_their_engine() {
    let dir = std::env::temp_dir().join(unique("pool-hidden"));
    let warm = LocalBackend::with_state_dir(&dir)
        .expect("engine")
        .with_warm_pool(2);
    let first = warm
        .create(test_options(&unique("pool-hidden")))
        .await
        .expect("create");
    warm.destroy(&first.id).await.expect("destroy");
    let entries = || {
        std::fs::read_dir(dir.join("sandboxes"))
            .map(|d| d.flatten().count())
            .unwrap_or(0)
    };
    eventually(PATIENCE, "two members ready", || async {
        equals((warm.warm_ready(), entries()), (2, 2))
    })
    .await;
    assert_eq!(warm.list(Default::default()).await.expect("list"), vec![]);
    let other = LocalBackend::with_state_dir(&dir)
        .expect("engine")
        .with_warm_pool(0);
    assert_eq!(other.list(Default::default()).await.expect("list"), vec![]);
    let tombstones = || {
        std::fs::read_dir(dir.join("tombstones"))
            .map(|d| d.flatten().count())
            .unwrap_or(0)
    };
    let buried = tombstones();
    drop(warm);
    eventually(PATIENCE, "the members end with their engine", || async {
        equals(entries(), 0)
    })
    .await;
    // Members were never anyone's sandbox: their ends leave no tombstone.
    assert_eq!(tombstones(), buried, "tombstones of pool members");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The pool refills after claims: one that leaves a member ready (its replacement waits a
/// quiet period) and a run that empties it (refilled at once). A create the empty pool
/// cannot serve goes cold and still succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_warm_pool_refills_after_claims() {
    let dir = std::env::temp_dir().join(unique("pool-refill"));
    let warm = LocalBackend::with_state_dir(&dir)
        .expect("engine")
        .with_warm_pool(2);
    let first = warm
        .create(test_options(&unique("pool-refill")))
        .await
        .expect("create");
    warm.destroy(&first.id).await.expect("destroy");
    let full = || async { equals(warm.warm_ready(), 2) };
    eventually(PATIENCE, "two members ready", full).await;

    // One claim: a member is left, the replacement comes after the quiet period.
    let claims = warm.warm_claims();
    let one = warm
        .create(test_options(&unique("pool-refill")))
        .await
        .expect("create");
    assert_eq!(warm.warm_claims(), claims + 1, "served by the pool");
    eventually(PATIENCE, "the pool is back to two", full).await;
    warm.destroy(&one.id).await.expect("destroy");

    // Three creates back to back: the first two empty the pool, the third may go cold.
    let mut made = Vec::new();
    for _ in 0..3 {
        let info = warm
            .create(test_options(&unique("pool-refill")))
            .await
            .expect("create");
        made.push(info.id);
    }
    // (At least one of them claimed: a member may have been retired meanwhile on a slow
    // machine.)
    assert!(warm.warm_claims() >= claims + 2, "served by the pool");
    eventually(PATIENCE, "the emptied pool is back to two", full).await;
    for id in made {
        warm.destroy(&id).await.expect("destroy");
    }
    drop(warm);
    let entries = || {
        std::fs::read_dir(dir.join("sandboxes"))
            .map(|d| d.flatten().count())
            .unwrap_or(0)
    };
    eventually(PATIENCE, "the members end with their engine", || async {
        equals(entries(), 0)
    })
    .await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Env var naming the state directory the pool child fills.
const POOL_CHILD_ENV: &str = "SANDCOVE_TEST_POOL_CHILD_DIR";

/// A program that exits without cleaning up leaves its warm members behind only until their
/// short lease ends: nothing leaks.
#[tokio::test]
async fn warm_pool_members_end_at_their_lease_after_their_program_exits() {
    let dir = std::env::temp_dir().join(unique("pool-exit"));
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "local_engine::pool_child",
            "--ignored",
            "--nocapture",
        ])
        .env(POOL_CHILD_ENV, &dir)
        .status()
        .expect("run the pool child");
    assert!(status.success(), "the pool child succeeded");
    let entries = || {
        std::fs::read_dir(dir.join("sandboxes"))
            .map(|d| d.flatten().count())
            .unwrap_or(0)
    };
    assert_eq!(entries(), 2, "the child's two members outlive it");
    let engine = LocalBackend::with_state_dir(&dir)
        .expect("engine")
        .with_warm_pool(0);
    assert_eq!(engine.list(Default::default()).await.expect("list"), vec![]);
    eventually(
        sandcove::backend::local::MEMBER_LEASE + PATIENCE,
        "the members end at their lease",
        || async { equals(entries(), 0) },
    )
    .await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// The program of [`warm_pool_members_end_at_their_lease_after_their_program_exits`]: fills a
/// pool of two, then exits at once, running no destructor.
#[tokio::test]
#[ignore = "started by warm_pool_members_end_at_their_lease_after_their_program_exits"]
async fn pool_child() {
    let Some(dir) = std::env::var_os(POOL_CHILD_ENV) else {
        return;
    };
    let warm = LocalBackend::with_state_dir(dir)
        .expect("engine")
        .with_warm_pool(2);
    let first = warm
        .create(test_options(&unique("pool-exit")))
        .await
        .expect("create");
    warm.destroy(&first.id).await.expect("destroy");
    eventually(PATIENCE, "two members ready", || async {
        equals(warm.warm_ready(), 2)
    })
    .await;
    std::process::exit(0);
}

/// Two engines with their own state directories are two runtimes: a reference from one is
/// refused by the other without being looked up there, while another engine on the same state
/// directory (a later program) shares the runtime id and reopens it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reference_from_another_state_directory_is_forbidden() {
    let a = sandcove::Client::new(local());
    let other_dir = std::env::temp_dir().join(unique("sandcove-other-runtime"));
    let b = sandcove::Client::new(Arc::new(
        LocalBackend::with_state_dir(&other_dir).expect("second engine"),
    ));
    let same = sandcove::Client::new(local());
    let rt_a = a.runtime_id().await.expect("runtime id");
    assert_ne!(rt_a, b.runtime_id().await.expect("runtime id"));
    assert_eq!(rt_a, same.runtime_id().await.expect("runtime id"));
    let sandbox = a
        .create(test_options(&unique("refs-two")))
        .await
        .expect("create");
    let saved = sandbox.reference().expect("reference").to_string();
    let reference: sandcove::Reference = saved.parse().expect("parse");
    match b.reopen(&reference).await {
        Err(sandcove::Error::Forbidden { what }) => assert!(what.contains(&rt_a), "{what}"),
        other => panic!("another runtime's reference: {other:?}"),
    }
    let again = same.reopen_sandbox(&reference).await.expect("same runtime");
    assert_eq!(again.id(), sandbox.id());
    sandbox.destroy().await.expect("destroy");
    let _ = std::fs::remove_dir_all(&other_dir);
}

/// Connections one client keeps for reuse never carry a request past a pause, a stop or a
/// destroy made by another client (another program, with a pool of its own): each such call
/// fails as it would on a fresh connection, and works again once the sandbox runs.
#[tokio::test]
async fn pooled_connections_never_reach_a_paused_stopped_or_destroyed_sandbox() {
    let (a, b) = (local(), local());
    let id = a
        .create(test_options(&unique("pooled")))
        .await
        .expect("create")
        .id;
    let echo = || ProcessSpec::new(Command::argv(["echo", "hi"]));
    let ran = |out: sandcove::Output| out.stdout == b"hi\n";
    // Fill a's pool: several calls, each ending cleanly.
    for _ in 0..3 {
        assert!(ran(sh(&*a, &id, "echo hi").await));
    }

    b.pause(&id).await.expect("pause");
    let Err(err) = a.spawn(&id, echo()).await else {
        panic!("refused while paused");
    };
    assert!(
        matches!(err, sandcove::Error::InvalidState { ref state, .. } if state == "paused"),
        "{err:?}"
    );
    b.resume(&id).await.expect("resume");
    for _ in 0..3 {
        assert!(ran(sh(&*a, &id, "echo hi").await));
    }

    b.stop(&id).await.expect("stop");
    let Err(err) = a.spawn(&id, echo()).await else {
        panic!("refused while stopped");
    };
    assert!(
        matches!(err, sandcove::Error::InvalidState { ref state, .. } if state == "stopped"),
        "{err:?}"
    );
    let err = a
        .list_processes(&id)
        .await
        .expect_err("no agent call while stopped");
    assert!(
        matches!(err, sandcove::Error::InvalidState { .. }),
        "{err:?}"
    );
    b.start(&id).await.expect("start");
    for _ in 0..3 {
        assert!(ran(sh(&*a, &id, "echo hi").await));
    }

    b.destroy(&id).await.expect("destroy");
    let Err(err) = a.spawn(&id, echo()).await else {
        panic!("gone");
    };
    assert!(err.is_not_found(), "{err:?}");
    let err = a.list_processes(&id).await.expect_err("gone");
    assert!(err.is_not_found(), "{err:?}");
}

/// A sandbox process starts with no signal blocked or ignored: what the agent that starts it
/// blocks or ignores (the Rust runtime ignores SIGPIPE) stays with the agent. (Caught signals
/// are the program's own: grep catches SIGSEGV.) A pipe's reader going away kills a writer,
/// as a shell user expects.
#[tokio::test]
async fn sandbox_processes_start_with_default_signal_state() {
    let backend = local();
    let id = backend
        .create(test_options(&unique("signals")))
        .await
        .expect("create")
        .id;
    let out = run(
        &*backend,
        &id,
        ProcessSpec::new(Command::argv([
            "grep",
            "-E",
            "^Sig(Blk|Ign)",
            "/proc/self/status",
        ])),
    )
    .await;
    assert_eq!(out.exit_code(), 0, "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    for line in lines {
        let (name, mask) = line.split_once(':').unwrap();
        assert!(
            mask.trim().chars().all(|c| c == '0'),
            "{name} is not empty in a sandbox process: {text}"
        );
    }
    // `yes` dies of SIGPIPE (141) when `head` stops reading.
    let piped = sh(
        &*backend,
        &id,
        "{ yes; echo $? > /tmp/status; } | head -n1 >/dev/null; cat /tmp/status",
    )
    .await;
    assert_eq!(
        String::from_utf8_lossy(&piped.stdout).trim(),
        "141",
        "{piped:?}"
    );
    backend.destroy(&id).await.expect("destroy");
}

/// Programs are found as `execvp` finds them: along the process's own `PATH` (an override
/// included), skipping entries where the name is missing or not executable; a name with a
/// slash as is (relative to the working directory); a file without `#!` run by `/bin/sh`.
/// A program found nowhere is not-found; one that cannot be run is an error, not a start.
#[tokio::test]
async fn programs_are_found_as_execvp_finds_them() {
    let backend = local();
    let id = backend
        .create(test_options(&unique("execvp")))
        .await
        .expect("create")
        .id;
    let setup = sh(
        &*backend,
        &id,
        "set -e; mkdir -p /tmp/a /tmp/b /tmp/c; \
         printf 'not a program' > /tmp/a/tool; chmod 644 /tmp/a/tool; \
         printf '#!/bin/sh\\necho b \"$@\"\\n' > /tmp/b/tool; chmod 755 /tmp/b/tool; \
         printf 'echo script \"$0\" \"$1\"\\n' > /tmp/c/plain; chmod 755 /tmp/c/plain",
    )
    .await;
    assert_eq!(setup.exit_code(), 0, "{setup:?}");
    let path = |p: &str| ProcessSpec::new(Command::argv(["tool", "x"])).env("PATH", p);
    // /tmp/a/tool is not executable: skipped for /tmp/b/tool.
    let out = run(&*backend, &id, path("/tmp/missing:/tmp/a:/tmp/b")).await;
    assert_eq!(out.stdout, b"b x\n", "{out:?}");
    // A file without `#!` runs with /bin/sh, `$0` being its path.
    let out = run(
        &*backend,
        &id,
        ProcessSpec::new(Command::argv(["plain", "y"])).env("PATH", "/tmp/c"),
    )
    .await;
    assert_eq!(out.stdout, b"script /tmp/c/plain y\n", "{out:?}");
    // A name with a slash is relative to the working directory, PATH unused.
    let out = run(
        &*backend,
        &id,
        ProcessSpec::new(Command::argv(["./tool", "z"]))
            .cwd("/tmp/b")
            .env("PATH", "/nowhere"),
    )
    .await;
    assert_eq!(out.stdout, b"b z\n", "{out:?}");
    // Found nowhere: not found, naming the program.
    let Err(err) = backend.spawn(&id, path("/tmp/missing")).await else {
        panic!("a missing program started");
    };
    assert!(err.is_not_found(), "{err}");
    assert!(err.to_string().contains("tool"), "{err}");
    // Found only where it cannot run: an error, and nothing started.
    let Err(err) = backend.spawn(&id, path("/tmp/a")).await else {
        panic!("a non-executable file started");
    };
    assert!(!err.is_not_found(), "{err}");
    backend.destroy(&id).await.expect("destroy");
}

/// Sandbox processes find their `C.UTF-8` locale in an archive (one lookup), made by the
/// engine where the host has only locale directories, and cannot change it.
#[tokio::test]
async fn the_default_locale_comes_from_a_read_only_archive() {
    let host = std::path::Path::new("/usr/lib/locale");
    if !host.join("locale-archive").exists() && !host.join("C.utf8/LC_CTYPE").exists() {
        // No compiled C.UTF-8 on this host: nothing for the engine to archive.
        return;
    }
    let backend = local();
    let id = backend
        .create(test_options(&unique("locale")))
        .await
        .expect("create")
        .id;
    let out = sh(
        &*backend,
        &id,
        "echo $LANG; locale charmap; grep -c ' /usr/lib/locale/locale-archive$' /proc/self/maps; \
         ls /usr/lib/locale; touch /usr/lib/locale/x 2>/dev/null; echo touch=$?",
    )
    .await;
    let text = out.stdout_lossy();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[..2], ["C.UTF-8", "UTF-8"], "{text}");
    assert_ne!(lines[2], "0", "the archive is mapped: {text}");
    assert!(lines.contains(&"locale-archive"), "{text}");
    if host.join("C.utf8").exists() {
        assert!(lines.contains(&"C.utf8"), "the host's locales stay: {text}");
    }
    assert_eq!(lines.last(), Some(&"touch=1"), "{text}");
    backend.destroy(&id).await.expect("destroy");
}

/// The sandbox's root tmpfs keeps large files in large folios (`huge=within_size`, where the
/// host kernel has transparent huge pages) and small files in small pages: a file's bytes and
/// disk use are what they would be without the option.
#[tokio::test]
async fn the_root_keeps_large_files_in_large_folios_and_small_ones_small() {
    let backend = local();
    let id = backend
        .create(test_options(&unique("folios")))
        .await
        .expect("create")
        .id;
    let out = sh(
        &*backend,
        &id,
        "awk '$5 == \"/\" {print $NF}' /proc/self/mountinfo",
    )
    .await;
    let options = out.stdout_lossy();
    let host_has_thp =
        std::path::Path::new("/sys/kernel/mm/transparent_hugepage/shmem_enabled").exists();
    assert_eq!(
        options.contains("huge=within_size"),
        host_has_thp,
        "root options {options}"
    );
    // A large file of an odd length round-trips byte for byte through the file API.
    let len = (5 << 20) + 123;
    let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    let chunks: Vec<sandcove::Result<Vec<u8>>> =
        data.chunks(1 << 20).map(|c| Ok(c.to_vec())).collect();
    backend
        .write_file(
            &id,
            "/workspace/large.bin",
            Box::pin(futures::stream::iter(chunks)),
            Default::default(),
        )
        .await
        .expect("write");
    let back = sandcove_conformance::read(&*backend, &id, "/workspace/large.bin")
        .await
        .expect("read");
    assert!(back == data, "the large file came back changed");
    // A small file takes one 4 KiB page of the tmpfs, not a large folio.
    let out = sh(
        &*backend,
        &id,
        "echo small > /workspace/small && stat -c %b:%B /workspace/small",
    )
    .await;
    assert_eq!(out.stdout_lossy().trim(), "8:512", "blocks of a small file");
    backend.destroy(&id).await.expect("destroy");
}
