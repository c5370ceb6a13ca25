//! Blaxel standby: a sandbox left quiet for the quiet period goes to standby (paused, files
//! and processes kept) and the next call wakes it; a call in flight keeps it awake. The quiet
//! period is shortened for the test through its env var, set before the facade's client is
//! made (this binary holds this one test, so nothing else reads the variable).

// The helpers of the main test binary; this one uses two of them.
#[allow(dead_code)]
#[path = "it/common.rs"]
mod common;

use blaxel::SandboxInstance;
use common::unique;
use sandcove_conformance::{eventually, PATIENCE};
use serde_json::json;

/// The test's quiet period: short, yet long against one call's round trip.
const QUIET_MS: u64 = 1500;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_sandbox_goes_to_standby_and_the_next_call_wakes_it() {
    std::env::set_var(blaxel::standby::STANDBY_AFTER_ENV, QUIET_MS.to_string());
    let caps = common::capabilities().await;
    // A client that is not the facade's: reading the state is not activity anyway.
    let client = sandcove::Client::from_env().expect("runtime");
    let name = unique("idle");
    let sb = SandboxInstance::create(json!({"name": name, "ttl": "10m"}))
        .await
        .expect("create");
    let core = client.sandbox(sb.sandcove_id());
    if !caps.pause {
        eprintln!("SKIPPED: standby: the runtime cannot pause, so nothing goes to standby");
        sb.delete().await.expect("delete");
        return;
    }
    assert!(core.info().await.expect("info").auto_resume);

    // A call in flight longer than the quiet period keeps the sandbox awake: the command
    // finishes (a sandbox paused under it would never answer).
    let p = tokio::time::timeout(
        PATIENCE,
        sb.process.exec(json!({
            "command": "sleep 4; echo done > /blaxel/kept.txt; echo awake",
            "wait_for_completion": true
        })),
    )
    .await
    .expect("a running call is not put to standby")
    .expect("exec");
    assert_eq!(p.stdout, "awake\n");

    // Quiet: standby (paused), as Blaxel's STANDBY state.
    let core = &core;
    eventually(
        PATIENCE,
        "the quiet sandbox to go to standby",
        || async move {
            match core.info().await {
                Ok(i) if i.state == sandcove::SandboxState::Paused => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    let got = SandboxInstance::get(&name).await.expect("get");
    assert_eq!(got.sandbox.state.as_deref(), Some("STANDBY"));

    // The next call wakes it, with its files.
    let text = tokio::time::timeout(PATIENCE, sb.fs.read("/blaxel/kept.txt"))
        .await
        .expect("the read wakes the sandbox")
        .expect("read");
    assert_eq!(text, "done\n");
    // And it goes back to standby once quiet again.
    eventually(
        PATIENCE,
        "standby again after the next quiet period",
        || async move {
            match core.info().await {
                Ok(i) if i.state == sandcove::SandboxState::Paused => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    sb.delete().await.expect("delete");
}

/// A process started through `process.exec` keeps its sandbox awake until it exits, with
/// `keep_alive` or without, though no call is in flight: the sandbox goes to standby only
/// a quiet period after the process ended, and the process ran to its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_process_keeps_its_sandbox_awake_until_it_exits() {
    std::env::set_var(blaxel::standby::STANDBY_AFTER_ENV, QUIET_MS.to_string());
    let caps = common::capabilities().await;
    let client = sandcove::Client::from_env().expect("runtime");
    if !caps.pause {
        eprintln!("SKIPPED: standby: the runtime cannot pause, so nothing goes to standby");
        return;
    }
    const RUNS_MS: u64 = 4 * QUIET_MS;
    let mut sandboxes = Vec::new();
    for keep_alive in [true, false] {
        let sb = SandboxInstance::create(json!({"name": unique("busy"), "ttl": "10m"}))
            .await
            .expect("create");
        let started = std::time::Instant::now();
        sb.process
            .exec(json!({
                "name": "job",
                "command": format!("sleep {}; echo done", RUNS_MS as f64 / 1000.0),
                "keep_alive": keep_alive
            }))
            .await
            .expect("exec");
        sandboxes.push((sb, started, keep_alive));
    }
    for (sb, started, keep_alive) in &sandboxes {
        let core = client.sandbox(sb.sandcove_id());
        let core = &core;
        // Reading the record neither wakes the sandbox nor keeps it awake.
        eventually(
            PATIENCE,
            "standby once the process has ended",
            || async move {
                match core.info().await {
                    Ok(i) if i.state == sandcove::SandboxState::Paused => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            },
        )
        .await;
        assert!(
            started.elapsed() >= std::time::Duration::from_millis(RUNS_MS),
            "keep_alive {keep_alive}: put in standby after {:?}, while the process ran",
            started.elapsed()
        );
        let job = sb.process.get("job").await.expect("get wakes it");
        assert_eq!(
            (job.status.as_str(), job.stdout.as_str()),
            ("completed", "done\n"),
            "keep_alive {keep_alive}"
        );
    }
    for (sb, _, _) in sandboxes {
        sb.delete().await.expect("delete");
    }
}

/// A `ttl-idle` lease counts a preview request as activity: one that wakes the sandbox from
/// standby (a server left running by an exec that ended, so nothing else keeps it awake)
/// moves the lease's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preview_request_renews_an_idle_lease() {
    std::env::set_var(blaxel::standby::STANDBY_AFTER_ENV, QUIET_MS.to_string());
    let caps = common::capabilities().await;
    let client = sandcove::Client::from_env().expect("runtime");
    if !caps.pause || !caps.previews {
        eprintln!("SKIPPED: standby and previews are needed");
        return;
    }
    let sb = SandboxInstance::create(json!({
        "name": unique("idle-preview"),
        "lifecycle": {"expiration_policies": [{"type": "ttl-idle", "value": "1h", "action": "delete"}]}
    }))
    .await
    .expect("create");
    // The shell that starts the server ends at once; the server stays, as a stray child.
    let port = 8123;
    sb.process
        .exec(json!({
            "command": format!(
                "mkdir -p /blaxel/site && echo hello > /blaxel/site/index.html && \
                 (cd /blaxel/site && nohup python3 -m http.server {port} >/dev/null 2>&1 &)"
            ),
            "wait_for_completion": true,
            "wait_for_ports": [port]
        }))
        .await
        .expect("start the server");
    let preview = sb
        .previews
        .create(json!({"metadata": {"name": "site"}, "spec": {"port": port, "public": true}}))
        .await
        .expect("preview");
    let url = preview.spec.url.clone().expect("url");
    let core = client.sandbox(sb.sandcove_id());
    let core = &core;
    eventually(PATIENCE, "standby", || async move {
        match core.info().await {
            Ok(i) if i.state == sandcove::SandboxState::Paused => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let asleep_end = core.info().await.expect("info").ends_at;
    let (status, body) = common::http_get(&format!("{url}/index.html"), &[]).await;
    assert_eq!(
        (status, body.as_str()),
        (200, "hello\n"),
        "the request wakes it"
    );
    eventually(
        PATIENCE,
        "the wake-up to renew the idle lease",
        || async move {
            let end = core.info().await.expect("info").ends_at;
            if end > asleep_end {
                Ok(())
            } else {
                Err(format!("still ends at {end}"))
            }
        },
    )
    .await;
    sb.delete().await.expect("delete");
}
