//! `SandboxInstance` against the real embedded engine.

use crate::common::{self, sandbox, unique};
use blaxel::{SandboxAPIError, SandboxInstance, SandboxUpdateMetadata};
use sandcove_conformance::{eventually, next_millisecond};
use serde_json::json;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_get_list_delete_round_trip() {
    let name = unique("lifecycle");
    let sb = SandboxInstance::create(json!({
        "name": name,
        "region": "us-pdx-1",
        "ports": [{"target": 3000, "protocol": "HTTP"}],
        "labels": {"env": "dev"},
        "envs": [{"name": "NODE_ENV", "value": "test"}],
        "ttl": "5m",
    }))
    .await
    .expect("create");
    assert_eq!(sb.metadata.name, name);
    assert_eq!(sb.status.as_deref(), Some("DEPLOYED"));
    assert_eq!(sb.sandbox.state.as_deref(), Some("RUNNING"));
    assert_eq!(sb.spec.runtime.image, "blaxel/base-image:latest");
    assert_eq!(sb.spec.runtime.memory, 4096);
    assert_eq!(sb.spec.region.as_deref(), Some("us-pdx-1"));
    assert_eq!(sb.spec.runtime.ports[0].target, 3000);
    let expires_in = sb.expires_in.expect("expires_in");
    assert!((200..=300).contains(&expires_in), "{expires_in}");

    let got = SandboxInstance::get(&name).await.expect("get");
    assert_eq!(
        got.metadata.labels.get("env").map(String::as_str),
        Some("dev")
    );
    assert_eq!(got.spec.runtime.envs.len(), 1);
    assert_eq!(got.sandcove_id(), sb.sandcove_id());

    let listed = SandboxInstance::list().limit(1000).await.expect("list");
    assert!(listed.iter().any(|s| s.metadata.name == name));

    // A second create with a live name is a 409.
    let err = SandboxInstance::create(json!({"name": name}))
        .await
        .expect_err("duplicate name");
    assert_eq!(err.status_code(), Some(409));
    assert_eq!(err.code(), Some("SANDBOX_ALREADY_EXISTS"));

    let reference = got.sandcove_reference().expect("reference");
    assert_eq!(reference.id(), sb.sandcove_id());
    let deleted = SandboxInstance::delete(&name).await.expect("delete");
    assert_eq!(deleted.metadata.name, name);
    let err = SandboxInstance::get(&name).await.expect_err("gone");
    assert!(matches!(err, SandboxAPIError::Api { .. }));
    assert_eq!(err.status_code(), Some(404));
    assert!(err.is_not_found());
    // Deleted recently: still Blaxel's 404, saying when.
    assert!(err.to_string().contains("destroyed at 20"), "{err}");
    // The instance form on a deleted sandbox is a 404 too.
    assert!(sb.delete().await.expect_err("deleted twice").is_not_found());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_if_not_exists_gives_one_sandbox_to_concurrent_callers() {
    let name = unique("cine");
    let cfg = json!({"name": name, "ttl": "5m"});
    let (a, b) = tokio::join!(
        SandboxInstance::create_if_not_exists(cfg.clone()),
        SandboxInstance::create_if_not_exists(cfg.clone())
    );
    let (a, b) = (a.expect("first"), b.expect("second"));
    assert_eq!(a.sandcove_id(), b.sandcove_id());
    let again = SandboxInstance::create_if_not_exists(cfg)
        .await
        .expect("third");
    assert_eq!(again.sandcove_id(), a.sandcove_id());
    // No name is a ValueError.
    assert!(matches!(
        SandboxInstance::create_if_not_exists(json!({"ttl": "5m"})).await,
        Err(SandboxAPIError::ValueError { .. })
    ));
    SandboxInstance::delete(&name).await.expect("delete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_if_not_exists_across_programs() {
    // Two separate processes race for the same name: both end up with one sandbox.
    let exe = std::env::current_exe().expect("test binary");
    if std::env::var("BL_TEST_CHILD_NAME").is_ok() {
        return;
    }
    let name = unique("xproc");
    let spawn = || {
        std::process::Command::new(&exe)
            // The child's full name in this test binary: its module, then the test.
            .args([
                "--exact",
                "sandbox::child_creates_if_not_exists",
                "--nocapture",
            ])
            .env("BL_TEST_CHILD_NAME", &name)
            .output()
            .expect("run child")
    };
    let (o1, o2) = std::thread::scope(|s| {
        let h1 = s.spawn(spawn);
        let h2 = s.spawn(spawn);
        (h1.join().unwrap(), h2.join().unwrap())
    });
    let id = |o: &std::process::Output| {
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(o.status.success(), "child failed: {text}");
        text.lines()
            .find_map(|l| l.strip_prefix("SANDBOX-ID "))
            .map(str::to_string)
            .expect("child printed the id")
    };
    assert_eq!(id(&o1), id(&o2));
    SandboxInstance::delete(&name).await.expect("delete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_creates_if_not_exists() {
    let Ok(name) = std::env::var("BL_TEST_CHILD_NAME") else {
        return; // only meaningful as the child of create_if_not_exists_across_programs
    };
    let sb = SandboxInstance::create_if_not_exists(json!({"name": name, "ttl": "5m"}))
        .await
        .expect("create_if_not_exists");
    println!("SANDBOX-ID {}", sb.sandcove_id());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_ttl_and_lifecycle_updates() {
    let sb = sandbox("update").await;
    let name = sb.metadata.name.clone();
    let updated = SandboxInstance::update_metadata(
        &name,
        json!({"labels": {"team": "a"}, "display_name": "My box"}),
    )
    .await
    .expect("update_metadata");
    assert_eq!(updated.metadata.labels["team"], "a");
    assert_eq!(updated.metadata.display_name.as_deref(), Some("My box"));
    let updated = SandboxInstance::update_metadata(
        &name,
        SandboxUpdateMetadata {
            labels: Some([("env".to_string(), "prod".to_string())].into()),
            display_name: None,
        },
    )
    .await
    .expect("update_metadata");
    assert_eq!(updated.metadata.labels["team"], "a", "labels are merged");
    assert_eq!(updated.metadata.labels["env"], "prod");
    // Seen from a fresh lookup too.
    let got = SandboxInstance::get(&name).await.expect("get");
    assert_eq!(got.metadata.display_name.as_deref(), Some("My box"));

    let longer = SandboxInstance::update_ttl(&name, Some("1h".to_string()))
        .await
        .expect("update_ttl");
    assert_eq!(longer.spec.runtime.ttl.as_deref(), Some("1h"));
    assert!(longer.expires_in.unwrap() > 3000);
    let bad = SandboxInstance::update_ttl(&name, Some("soon".to_string())).await;
    assert_eq!(bad.expect_err("bad ttl").status_code(), Some(400));

    let lc = SandboxInstance::update_lifecycle(
        &name,
        json!({"expiration_policies": [{"type": "ttl-max-age", "value": "2m", "action": "delete"}]}),
    )
    .await
    .expect("update_lifecycle");
    assert!(lc.expires_in.unwrap() <= 120);
    assert_eq!(
        lc.spec
            .lifecycle
            .as_ref()
            .unwrap()
            .expiration_policies
            .len(),
        1
    );
    let cleared = SandboxInstance::update_lifecycle(&name, serde_json::Value::Null)
        .await
        .expect("clear lifecycle");
    assert!(cleared.spec.lifecycle.is_none());
    assert!(cleared.expires_in.unwrap() > 3000, "back to the 1h ttl");
    let same = sb.wait().max_wait(10).await.expect("wait is a no-op");
    assert_eq!(same.metadata.name, name);
    sb.delete().await.expect("delete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_happen_before_any_effect() {
    let name = unique("refused");
    for cfg in [
        json!({"name": name, "network": {"proxy": {"allowed_domains": ["x"]}}}),
        json!({"name": name, "extra_args": {"tun": "enabled"}}),
        json!({"name": name, "volumes": [{"name": "v", "mount_path": "/v", "type": "ephemeral", "size_mb": 10}]}),
    ] {
        let err = SandboxInstance::create(cfg).await.expect_err("refused");
        assert!(err.is_not_supported(), "{err}");
    }
    let err = SandboxInstance::create(json!({"name": name, "region": "mars-1"}))
        .await
        .expect_err("bad region");
    assert_eq!(err.status_code(), Some(400));
    let err = SandboxInstance::create(json!({"name": name, "colour": "red"}))
        .await
        .expect_err("unknown key");
    assert!(matches!(err, SandboxAPIError::ValueError { .. }));
    assert!(SandboxInstance::get(&name)
        .await
        .unwrap_err()
        .is_not_found());
    assert!(SandboxInstance::update_network(&name, json!({}))
        .await
        .unwrap_err()
        .is_not_supported());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_and_fork_follow_the_capability() {
    let sb = sandbox("snap").await;
    sb.fs
        .write("/blaxel/app/data.txt", "kept")
        .await
        .expect("write");
    let fork_name = unique("forked");
    if common::capabilities().await.snapshots {
        let snap = sb
            .snapshot()
            .name("before".to_string())
            .await
            .expect("snapshot");
        assert_eq!(snap.sandbox_name, sb.metadata.name);
        assert!(sb
            .list_snapshots()
            .await
            .expect("list")
            .iter()
            .any(|s| s.id == snap.id));
        // A private preview with a token on the source: the fork must not inherit the
        // token's record (name and value) with the copied annotations.
        let preview = sb
            .previews
            .create(serde_json::json!({"metadata": {"name": "p"}, "spec": {"port": 8000}}))
            .await
            .expect("preview");
        let in_an_hour = std::time::SystemTime::now() + std::time::Duration::from_secs(3600);
        preview.tokens.create(in_an_hour).await.expect("token");
        let fork = sb.fork(&fork_name).await.expect("fork");
        assert_eq!(fork.name, fork_name);
        assert_eq!(fork.type_, "sandbox");
        let forked = SandboxInstance::get(&fork_name).await.expect("get fork");
        assert_eq!(
            forked.fs.read("/blaxel/app/data.txt").await.unwrap(),
            "kept"
        );
        let forked_preview = forked
            .previews
            .create(serde_json::json!({"metadata": {"name": "p"}, "spec": {"port": 8000}}))
            .await
            .expect("the fork's own preview");
        assert_eq!(
            forked_preview.tokens.list().await.expect("tokens"),
            vec![],
            "the source's token records stay with the source"
        );
        forked.delete().await.expect("delete fork");
        sb.delete_snapshot(&snap.id).await.expect("delete snapshot");
    } else {
        eprintln!("LOUD SKIP: the runtime has no snapshots yet; checking the refusal");
        assert!(sb.snapshot().await.unwrap_err().is_not_supported());
        assert!(sb.list_snapshots().await.unwrap_err().is_not_supported());
        assert!(sb.fork(&fork_name).await.unwrap_err().is_not_supported());
        assert!(SandboxInstance::get(&fork_name)
            .await
            .unwrap_err()
            .is_not_found());
    }
    assert!(sb
        .fork(&fork_name)
        .target_type("application")
        .await
        .unwrap_err()
        .is_not_supported());
    sb.delete().await.expect("delete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gap_sub_apis_refuse() {
    let sb = sandbox("gaps").await;
    assert!(sb.sessions.list().await.unwrap_err().is_not_supported());
    assert!(sb.drives.list().await.unwrap_err().is_not_supported());
    assert!(sb
        .codegen
        .fastapply("a", "b")
        .await
        .unwrap_err()
        .is_not_supported());
    assert!(sb.schedules.list().await.unwrap_err().is_not_supported());
    assert!(sb.system.upgrade().await.unwrap_err().is_not_supported());
    assert_eq!(sb.system.health().await.expect("health").status, "ok");
    assert!(blaxel::bl_agent("x").await.unwrap_err().is_not_supported());
    sb.delete().await.expect("delete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_none_safe_and_paged_listing() {
    let a = SandboxInstance::create(None)
        .safe(true)
        .await
        .expect("create(None)");
    assert!(
        a.metadata.name.starts_with("sandbox-"),
        "{}",
        a.metadata.name
    );
    assert!(
        a.expires_in.unwrap() > 23 * 3600,
        "the default lease is 24 h"
    );
    // Each sandbox is created in a later millisecond than the last: the order asserted below
    // is the creation order, not a tie broken by id.
    next_millisecond().await;
    let b = sandbox("paged").await;
    next_millisecond().await;
    let c = sandbox("paged").await;
    let first = SandboxInstance::list().limit(1).await.expect("page 1");
    assert_eq!(first.len(), 1);
    assert!(first.total >= 3);
    assert!(first.has_more);
    // Page one at a time. Once `a` has been seen it is deleted and a sandbox created: the
    // cursor names the last sandbox seen, so neither shifts the pages after it (other tests
    // create and delete sandboxes meanwhile too).
    let mut seen = vec![first[0].metadata.name.clone()];
    let mut cursor = first.next_cursor.clone();
    let mut late = None;
    while let Some(next) = cursor {
        if late.is_none() && seen.contains(&a.metadata.name) {
            a.delete().await.expect("delete a while paging");
            late = Some(sandbox("paged-late").await);
        }
        let page = SandboxInstance::list()
            .limit(1)
            .cursor(next)
            .await
            .expect("next page");
        assert!(
            page.len() == 1 || !page.has_more,
            "a short page that is not the last"
        );
        seen.extend(page.iter().map(|s| s.metadata.name.clone()));
        cursor = page.next_cursor.clone();
    }
    let mut unique = seen.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(
        unique.len(),
        seen.len(),
        "a page repeated an item: {seen:?}"
    );
    let position = |name: &str| seen.iter().position(|s| s == name);
    let (pa, pb, pc) = (
        position(&a.metadata.name).expect("a listed"),
        position(&b.metadata.name).expect("b listed after a was deleted"),
        position(&c.metadata.name).expect("c listed after a was deleted"),
    );
    assert!(pa < pb && pb < pc, "oldest first: {seen:?}");
    let late = late.expect("paging went past a");
    let err = SandboxInstance::list()
        .cursor("not-a-cursor".to_string())
        .await
        .expect_err("bad cursor");
    assert_eq!(err.status_code(), Some(400));
    for sandbox in [b, c, late] {
        sandbox.delete().await.expect("delete");
    }
}

/// `memory` is the sandbox's limit where the runtime can enforce one (a cgroup it writes),
/// and only recorded elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_is_the_sandbox_limit_where_the_runtime_enforces_limits() {
    let name = unique("memory");
    let sb = SandboxInstance::create(json!({"name": name, "memory": 64}))
        .await
        .expect("create");
    assert_eq!(sb.spec.runtime.memory, 64);
    let id = sb.sandcove_id().to_string();
    let files = [
        format!("/sys/fs/cgroup/memory/sandcove/{id}/memory.limit_in_bytes"),
        format!("/sys/fs/cgroup/sandcove/{id}/memory.max"),
    ];
    let limit = files
        .iter()
        .find_map(|f| std::fs::read_to_string(f).ok())
        .map(|t| t.trim().parse::<u64>().expect("a number"));
    if common::capabilities().await.memory_limit {
        assert_eq!(limit, Some(64 << 20), "the sandbox's cgroup limit");
    } else {
        assert_eq!(limit, None, "no cgroup without memory limits");
    }
    SandboxInstance::delete(&name).await.expect("delete");
}

/// The facade's records live outside the sandbox (runtime annotations): code in the sandbox
/// that edits the files where they once lived, then deletes everything under `/tmp`,
/// changes neither the labels, the process names nor the previews the facade reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_code_cannot_rewrite_facade_records() {
    let sb = sandbox("records").await;
    let name = sb.metadata.name.clone();
    SandboxInstance::update_metadata(&name, json!({"labels": {"team": "a"}}))
        .await
        .expect("update_metadata");
    let keeper = sb
        .process
        .exec(json!({"name": "keeper", "command": "sleep 300"}))
        .await
        .expect("exec");
    let previews = common::capabilities().await.previews;
    if previews {
        sb.previews
            .create(json!({"metadata": {"name": "pv"}, "spec": {"port": 3000, "public": true}}))
            .await
            .expect("preview");
    }
    let check = |when: &'static str| {
        let name = name.clone();
        let pid = keeper.pid.clone();
        let sb = &sb;
        async move {
            let got = SandboxInstance::get(&name).await.expect("get");
            assert_eq!(
                got.metadata.labels.get("team").map(String::as_str),
                Some("a"),
                "{when}: labels"
            );
            let p = sb.process.get("keeper").await.expect("process by name");
            assert_eq!(
                (p.name.as_str(), p.pid.as_str()),
                ("keeper", pid.as_str()),
                "{when}"
            );
            let listed = sb.process.list().await.expect("list");
            assert!(
                listed.iter().any(|p| p.name == "keeper" && p.pid == pid),
                "{when}: {listed:?}"
            );
            assert!(
                listed.iter().all(|p| p.name != "evil"),
                "{when}: {listed:?}"
            );
            if previews {
                let names: Vec<_> = sb
                    .previews
                    .list()
                    .await
                    .expect("previews")
                    .into_iter()
                    .map(|p| p.name)
                    .collect();
                assert_eq!(names, ["pv"], "{when}");
            }
        }
    };
    // Edit the files the facade once kept its records in (serde's compact JSON).
    let forge = r#"sed -i 's/"team":"a"/"team":"evil"/' /tmp/.blaxel/sandbox.json; sed -i 's/"keeper"/"evil"/' /tmp/.blaxel/proc/*.json; printf '{}' > /tmp/.blaxel/previews.json; true"#;
    sb.process
        .exec(json!({"command": forge, "wait_for_completion": true}))
        .await
        .expect("forge");
    check("after editing the old record files").await;
    sb.process
        .exec(json!({"command": "rm -rf /tmp/.blaxel /tmp/* /tmp/.[!.]*; true", "wait_for_completion": true}))
        .await
        .expect("vandalize");
    check("after deleting everything under /tmp").await;
    sb.delete().await.expect("delete");
}

/// Blaxel keeps a sandbox without a deletion policy in standby until it is deleted: here its
/// lease end pauses it (`STANDBY`) instead of deleting it, and the next call wakes it with its
/// files. A sandbox with a policy (`ttl`) is deleted at its end, as on Blaxel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_deletion_policy_the_lease_end_is_standby_not_deletion() {
    use sandcove_conformance::PATIENCE;
    let client = sandcove::Client::from_env().expect("runtime");
    let caps = client.ready().await.expect("capabilities");
    let with_ttl = sandbox("standby-ttl").await;
    let info = client
        .sandbox(with_ttl.sandcove_id())
        .info()
        .await
        .expect("info");
    assert_eq!(info.on_timeout, sandcove::TimeoutAction::Destroy);
    with_ttl.delete().await.expect("delete");

    let name = unique("standby");
    let sb = SandboxInstance::create(json!({"name": name}))
        .await
        .expect("create");
    let core = client.sandbox(sb.sandcove_id());
    let info = core.info().await.expect("info");
    if !caps.pause {
        eprintln!("SKIPPED: standby: the runtime cannot pause; the lease end deletes");
        assert_eq!(info.on_timeout, sandcove::TimeoutAction::Destroy);
        sb.delete().await.expect("delete");
        return;
    }
    assert_eq!(info.on_timeout, sandcove::TimeoutAction::Pause);
    assert!(info.auto_resume);
    sb.fs
        .write("/blaxel/kept.txt", "kept")
        .await
        .expect("write");
    core.set_timeout(Duration::from_secs(1))
        .await
        .expect("a short lease");
    let core = &core;
    eventually(
        PATIENCE,
        "the lease end pauses the sandbox",
        || async move {
            match core.info().await {
                Ok(i) if i.state == sandcove::SandboxState::Paused => Ok(()),
                Ok(_) => Err("not paused yet"),
                Err(e) => panic!("the sandbox must stay: {e}"),
            }
        },
    )
    .await;
    let got = SandboxInstance::get(&name).await.expect("still there");
    assert_eq!(got.sandbox.state.as_deref(), Some("STANDBY"));
    let p = got
        .process
        .exec(json!({"command": "cat /blaxel/kept.txt", "wait_for_completion": true}))
        .await
        .expect("the next call wakes it");
    assert_eq!(p.logs, "kept");
    assert_eq!(
        core.info().await.expect("info").state,
        sandcove::SandboxState::Running
    );
    got.delete().await.expect("delete");
}

/// A deletion policy added after creation deletes the sandbox at its end, as on Blaxel,
/// although it was made to pause there; removing the last policy makes the end standby
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deletion_policy_added_later_deletes_at_its_end() {
    use sandcove_conformance::PATIENCE;
    let client = sandcove::Client::from_env().expect("runtime");
    let caps = client.ready().await.expect("capabilities");
    let name = unique("late-ttl");
    let sb = SandboxInstance::create(json!({"name": name}))
        .await
        .expect("create");
    let core = client.sandbox(sb.sandcove_id());
    if !caps.pause {
        eprintln!("SKIPPED: standby: the runtime cannot pause; every lease end deletes");
        sb.delete().await.expect("delete");
        return;
    }
    assert_eq!(
        core.info().await.expect("info").on_timeout,
        sandcove::TimeoutAction::Pause
    );
    // A ttl counts from creation: one second has (nearly) passed, so the end is at once.
    SandboxInstance::update_ttl(&name, "1s")
        .await
        .expect("update_ttl");
    assert_eq!(
        core.info().await.expect("info").on_timeout,
        sandcove::TimeoutAction::Destroy
    );
    let name = &name;
    eventually(PATIENCE, "deleted at the ttl's end", || async move {
        match SandboxInstance::get(name).await {
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => panic!("{e}"),
            Ok(sb) => Err(format!("still there: {:?}", sb.sandbox.state)),
        }
    })
    .await;

    // And back: a sandbox made with a policy that loses it pauses at its end.
    let sb = sandbox("late-none").await;
    let core = client.sandbox(sb.sandcove_id());
    assert_eq!(
        core.info().await.expect("info").on_timeout,
        sandcove::TimeoutAction::Destroy
    );
    SandboxInstance::update_ttl(&sb.metadata.name, None)
        .await
        .expect("update_ttl");
    assert_eq!(
        core.info().await.expect("info").on_timeout,
        sandcove::TimeoutAction::Pause
    );
    sb.delete().await.expect("delete");
}

/// A `ttl-idle` lease is renewed by file calls too, not only by `get` and `exec`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_calls_renew_an_idle_lease() {
    use sandcove_conformance::PATIENCE;
    let client = sandcove::Client::from_env().expect("runtime");
    let sb = SandboxInstance::create(json!({
        "name": unique("idle-files"),
        "lifecycle": {"expiration_policies": [{"type": "ttl-idle", "value": "1h", "action": "delete"}]}
    }))
    .await
    .expect("create");
    let core = client.sandbox(sb.sandcove_id());
    let first_end = core.info().await.expect("info").ends_at;
    let (sb, core) = (&sb, &core);
    eventually(
        PATIENCE,
        "a file call to move the idle lease's end",
        || async move {
            sb.fs.write("/blaxel/touch.txt", "x").await.expect("write");
            let end = core.info().await.expect("info").ends_at;
            if end > first_end {
                Ok(())
            } else {
                Err(format!("still ends at {end}"))
            }
        },
    )
    .await;
    sb.delete().await.expect("delete");
}

/// A new volume mounted read-write is writable by the sandbox's processes, which run as root
/// as on Blaxel, and what they write outlives the sandbox; a read-only mount stays read-only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_read_write_volume_is_writable_by_root() {
    let client = sandcove::Client::from_env().expect("runtime");
    let caps = client.ready().await.expect("capabilities");
    if !caps.volumes {
        eprintln!("SKIPPED: volumes: the runtime has none");
        return;
    }
    let volume = unique("vol");
    match client.create_volume(&volume).await {
        Ok(_) => {}
        Err(e @ sandcove::Error::Unavailable { .. }) => {
            eprintln!("SKIPPED: volumes: {e}");
            return;
        }
        Err(e) => panic!("create_volume: {e}"),
    }
    let sb = SandboxInstance::create(json!({
        "name": unique("vol-rw"),
        "ttl": "5m",
        "volumes": [
            {"name": volume, "mount_path": "/data", "read_only": false},
            {"name": volume, "mount_path": "/seen", "read_only": true}
        ]
    }))
    .await
    .expect("create");
    let p = sb
        .process
        .exec(json!({
            "command": "id -u; echo hello > /data/made-by-root.txt && mkdir /data/dir && cat /data/made-by-root.txt; touch /seen/x 2>/dev/null || echo read-only",
            "wait_for_completion": true
        }))
        .await
        .expect("exec");
    assert_eq!(
        (p.exit_code, p.stdout.as_str()),
        (0, "0\nhello\nread-only\n"),
        "{p:?}"
    );
    sb.fs
        .write("/data/by-the-api.txt", "api")
        .await
        .expect("the file API writes there too");
    sb.delete().await.expect("delete");

    // The files outlive the sandbox.
    let again = SandboxInstance::create(json!({
        "name": unique("vol-again"),
        "ttl": "5m",
        "volumes": [{"name": volume, "mount_path": "/data"}]
    }))
    .await
    .expect("create");
    assert_eq!(
        again.fs.read("/data/made-by-root.txt").await.expect("read"),
        "hello\n"
    );
    again.delete().await.expect("delete");
    let volume = &volume;
    let client = &client;
    sandcove_conformance::eventually(
        sandcove_conformance::PATIENCE,
        "the volume deleted once no sandbox mounts it",
        || async move {
            client
                .delete_volume(volume)
                .await
                .map_err(|e| e.to_string())
        },
    )
    .await;
}

/// `fetch` reaches a server on a port in the sandbox with no preview made by the caller:
/// method, path, query, headers and body passed on, any status returned, the preview it
/// used none of the sandbox's named previews; a private named preview of the port is used
/// with a token of the fetch's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_reaches_a_port_in_the_sandbox() {
    let caps = common::capabilities().await;
    let sb = sandbox("fetch").await;
    if !caps.previews {
        let err = sb.fetch(3000).await.unwrap_err();
        assert!(err.is_not_supported(), "{err}");
        eprintln!("SKIPPED: fetch: the runtime has no previews");
        sb.delete().await.expect("delete");
        return;
    }
    let server = r#"import http.server
class H(http.server.BaseHTTPRequestHandler):
    def reply(self):
        n = int(self.headers.get('content-length') or 0)
        body = self.rfile.read(n).decode()
        out = ('%s %s %s %s' % (self.command, self.path, self.headers.get('x-test'), body)).encode()
        self.send_response(418 if self.path == '/teapot' else 200)
        self.send_header('content-length', str(len(out)))
        self.end_headers()
        self.wfile.write(out)
    do_GET = do_POST = reply
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(('0.0.0.0', 8002), H).serve_forever()
"#;
    sb.fs.write("/blaxel/srv.py", server).await.expect("write");
    sb.process
        .exec(json!({"name": "srv", "command": "python3 /blaxel/srv.py", "wait_for_ports": [8002]}))
        .await
        .expect("start the server");
    let got = sb.fetch(8002).path("hello?q=1").await.expect("fetch");
    assert_eq!(
        (got.status_code, got.text()),
        (200, "GET /hello?q=1 None ".into())
    );
    let posted = sb
        .network
        .fetch(8002)
        .path("/echo")
        .method("post")
        .headers([("x-test", "yes")])
        .content("body")
        .await
        .expect("fetch");
    assert_eq!(posted.text(), "POST /echo yes body");
    let teapot = sb
        .fetch(8002)
        .path("/teapot")
        .await
        .expect("a status is an answer");
    assert_eq!(teapot.status_code, 418);
    assert!(teapot.header("Content-Length").is_some());
    assert!(sb.previews.list().await.expect("list").is_empty());
    // A named private preview of the port: fetch still gets through, with its own token.
    sb.previews
        .create(json!({"metadata": {"name": "srv"}, "spec": {"port": 8002, "public": false}}))
        .await
        .expect("preview");
    assert_eq!(sb.fetch(8002).await.expect("fetch").status_code, 200);
    let err = sb.fetch(70000).await.unwrap_err();
    assert_eq!(err.status_code(), Some(400), "{err}");
    sb.delete().await.expect("delete");
}

/// A process started with `stdin` reads what `write_stdin` sends until `close_stdin`; one
/// without an open stdin is a 409, an unknown one a 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdin_is_written_and_closed() {
    let sb = sandbox("stdin").await;
    sb.process
        .exec(json!({"name": "wc", "command": "wc -c", "stdin": true}))
        .await
        .expect("exec");
    sb.process.write_stdin("wc", "12345").await.expect("write");
    sb.process
        .write_stdin("wc", vec![b'6'; 5])
        .await
        .expect("write bytes");
    sb.process.close_stdin("wc").await.expect("close");
    sb.process
        .close_stdin("wc")
        .await
        .expect("close again (idempotent)");
    let done = sb
        .process
        .wait("wc")
        .max_wait(60_000)
        .interval(100)
        .await
        .expect("wait");
    assert_eq!(done.stdout.trim(), "10");
    let err = sb.process.write_stdin("wc", "late").await.unwrap_err();
    assert_eq!(err.status_code(), Some(409), "{err}");
    sb.process
        .exec(json!({"name": "plain", "command": "sleep 30"}))
        .await
        .expect("exec");
    let err = sb.process.write_stdin("plain", "x").await.unwrap_err();
    assert_eq!(err.status_code(), Some(409), "{err}");
    let err = sb.process.write_stdin("nobody", "x").await.unwrap_err();
    assert!(err.is_not_found(), "{err}");
    sb.delete().await.expect("delete");
}

/// An external id given at creation is reported and found (not shown among the labels);
/// one of the wrong form is a 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_ids_are_kept_and_found() {
    let name = unique("ext");
    let external_id = format!("id-{name}");
    let sb =
        SandboxInstance::create(json!({"name": name, "external_id": external_id, "ttl": "5m"}))
            .await
            .expect("create");
    assert_eq!(
        sb.metadata.external_id.as_deref(),
        Some(external_id.as_str())
    );
    assert!(sb.metadata.labels.is_empty(), "{:?}", sb.metadata.labels);
    let found = SandboxInstance::get_by_external_id(&external_id)
        .await
        .expect("found");
    assert_eq!(found.metadata.name, name);
    let again = SandboxInstance::get(&name).await.expect("get");
    assert_eq!(
        again.metadata.external_id.as_deref(),
        Some(external_id.as_str())
    );
    let err = SandboxInstance::get_by_external_id("id-nobody")
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err}");
    let err =
        SandboxInstance::create(json!({"name": unique("ext-bad"), "external_id": "no spaces"}))
            .await
            .unwrap_err();
    assert_eq!(err.status_code(), Some(400), "{err}");
    sb.delete().await.expect("delete");
}

/// `archive` ends the processes and keeps the files (status `ARCHIVED`, also for `get`);
/// `unarchive` runs the sandbox again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archive_keeps_files_and_unarchive_runs_again() {
    let sb = sandbox("archive").await;
    sb.fs
        .write("/blaxel/kept.txt", "kept")
        .await
        .expect("write");
    sb.process
        .exec(json!({"name": "long", "command": "sleep 600"}))
        .await
        .expect("exec");
    let archived = SandboxInstance::archive(&sb.metadata.name)
        .wait(true)
        .await
        .expect("archive");
    assert_eq!(archived.status.as_deref(), Some("ARCHIVED"));
    let got = SandboxInstance::get(&sb.metadata.name).await.expect("get");
    assert_eq!(got.status.as_deref(), Some("ARCHIVED"));
    let back = got.unarchive().await.expect("unarchive");
    assert_eq!(back.status.as_deref(), Some("DEPLOYED"));
    assert_eq!(sb.fs.read("/blaxel/kept.txt").await.expect("read"), "kept");
    let long = sb.process.get("long").await;
    assert!(
        long.as_ref()
            .map_or(true, |p| p.status.as_str() != "running"),
        "{long:?}"
    );
    sb.delete().await.expect("delete");
}
