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
