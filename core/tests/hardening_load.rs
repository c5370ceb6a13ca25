//! Hardening, part 3: load. Two hundred sandboxes alive at once, each running commands; all
//! succeed and none leaks a process, a mount or a state directory.
//!
//! A binary of its own so nothing else competes with it. Runs as root and rootless (CI runs
//! this binary again as an unprivileged user).

// The helpers of the main test binary; this one uses part of them.
#[allow(dead_code, unused_imports)]
#[path = "it/hardening_common.rs"]
mod common;

use std::time::{Duration, Instant};

use futures::StreamExt;
use sandcove::{Command, ListOptions, ProcessSpec, WriteOptions};
use sandcove_conformance::unique;

use common::{equals, eventually, host_process_count, Env};

/// How many sandboxes are held at once.
const SANDBOXES: usize = 200;
/// How many calls are in flight at once.
const PARALLEL: usize = 24;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_sandboxes_alive_at_once_all_work_and_none_leaks() {
    let env = Env::new("load");
    let marker = unique("hc-load");
    let started = Instant::now();
    let mut options = env.options(&marker);
    // Long enough to outlast a slow run, short enough to clean up after a crashed one.
    options.timeout = Some(Duration::from_secs(600));

    // Create them all (PARALLEL at a time), each with a background process of its own.
    let created: Vec<Result<String, String>> = futures::stream::iter(0..SANDBOXES)
        .map(|i| {
            let backend = env.backend.clone();
            let options = options.clone();
            let marker = marker.clone();
            async move {
                let id = backend
                    .create(options)
                    .await
                    .map_err(|e| format!("create {i}: {e}"))?
                    .id;
                let spec =
                    ProcessSpec::new(Command::argv(["bash", "-c", "exec -a \"$M\" sleep 600"]))
                        .env("M", &marker);
                drop(
                    backend
                        .spawn(&id, spec)
                        .await
                        .map_err(|e| format!("spawn in {i}: {e}"))?,
                );
                Ok(id)
            }
        })
        .buffer_unordered(PARALLEL)
        .collect()
        .await;
    let failures: Vec<&String> = created.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(
        failures.is_empty(),
        "{} creates failed: {failures:?}",
        failures.len()
    );
    let ids: Vec<String> = created.into_iter().map(Result::unwrap).collect();
    let created_in = started.elapsed();

    // All alive at once: every background process runs, every sandbox is listed.
    eventually(
        Duration::from_secs(300),
        "every background process runs",
        || async { equals(host_process_count(&marker), SANDBOXES) },
    )
    .await;
    let mut filter = ListOptions::default();
    filter.labels.insert(common::LABEL.into(), marker.clone());
    let listed = env.backend.list(filter.clone()).await.expect("list");
    assert_eq!(listed.len(), SANDBOXES, "every sandbox listed");
    assert_eq!(env.monitors().len(), SANDBOXES, "one monitor each");

    // Each runs commands and file calls, all of them at once.
    let results: Vec<Result<(), String>> = futures::stream::iter(ids.iter().enumerate())
        .map(|(i, id)| {
            let backend = env.backend.clone();
            async move {
                let data = format!("sandbox {i}\n").into_bytes();
                let body: sandcove::ByteStream =
                    Box::pin(futures::stream::once(async move { Ok(data) }));
                backend
                    .write_file(id, "/workspace/n", body, WriteOptions::default())
                    .await
                    .map_err(|e| format!("write in {i}: {e}"))?;
                let stream = backend
                    .spawn(
                        id,
                        ProcessSpec::new(Command::sh("cat /workspace/n; hostname; echo $((6*7))")),
                    )
                    .await
                    .map_err(|e| format!("spawn in {i}: {e}"))?;
                let out = sandcove::client::collect(stream, 1 << 20)
                    .await
                    .map_err(|e| format!("run in {i}: {e}"))?;
                let text = out.stdout_lossy();
                let expected_head = format!("sandbox {i}\n");
                if !out.exit_status().success()
                    || !text.starts_with(&expected_head)
                    || !text.ends_with("42\n")
                {
                    return Err(format!("sandbox {i} answered {text:?}"));
                }
                Ok(())
            }
        })
        .buffer_unordered(PARALLEL)
        .collect()
        .await;
    let failures: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(
        failures.is_empty(),
        "{} runs failed: {failures:?}",
        failures.len()
    );
    assert_eq!(
        host_process_count(&marker),
        SANDBOXES,
        "still all alive after the runs"
    );

    // Destroy them all; nothing may be left.
    let destroyed: Vec<Result<(), String>> = futures::stream::iter(ids.iter())
        .map(|id| {
            let backend = env.backend.clone();
            async move {
                backend
                    .destroy(id)
                    .await
                    .map_err(|e| format!("destroy {id}: {e}"))
            }
        })
        .buffer_unordered(PARALLEL)
        .collect()
        .await;
    let failures: Vec<&String> = destroyed.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(failures.is_empty(), "{failures:?}");
    eventually(
        Duration::from_secs(300),
        "no sandbox process outlives destroy",
        || async { equals(host_process_count(&marker), 0) },
    )
    .await;
    env.assert_nothing_left("after 200 sandboxes").await;
    assert!(env.backend.list(filter).await.unwrap().is_empty());
    println!(
        "hardening: {SANDBOXES} sandboxes alive at once ({} host processes of theirs), created in \
         {:.1?}, each ran a command and a file write; all destroyed, nothing left ({:.1?} in all)",
        SANDBOXES,
        created_in,
        started.elapsed()
    );
}
