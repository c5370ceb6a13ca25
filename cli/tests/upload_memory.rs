//! The memory multipart uploads hold, under the attack that found it unbounded: eight
//! uploads through signed E2B URLs (no API key) that send part of a large file and then
//! trickle. This binary has one test, so the process's resident memory is its alone.

// The helpers of the main test binary; this one uses one of them.
#[allow(dead_code)]
#[path = "it/common.rs"]
mod common;

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use sandcove::{Backend, LocalBackend};
use sandcove_compat_support::multipart::{UploadBudget, WORKING_SET};
use sandcove_conformance::eventually;
use sandcove_tests::PrivateState;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const KEY: &str = "upload-memory-key";

/// This process's resident memory, in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    kib * 1024
}

/// E2B's v1 signature of a write of `path` (no user, no expiration).
fn signature(path: &str, token: &str) -> String {
    let raw = format!("{path}:write::{token}");
    let digest = ring::digest::digest(&ring::digest::SHA256, raw.as_bytes());
    let b64 = base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest.as_ref());
    format!("v1_{b64}").replace('+', "%2B").replace('/', "%2F")
}

/// Finding: multipart uploads were buffered whole (64 MiB each) with no aggregate bound:
/// eight trickling uploads by a signed-URL holder raised the server's memory by 485 MiB.
/// Now each upload streams into the sandbox and reserves a fixed working set of one
/// server-wide budget (4 working sets here): four uploads run, the other four are refused
/// (429) once the budget's wait is over, and the memory held stays within the budget while
/// 8 MiB of each running upload has gone in. Broken off, the uploads leave no file and give
/// their reservations back.
#[tokio::test]
async fn trickling_uploads_hold_no_more_than_the_budget() {
    let state = PrivateState::new();
    let backend = Arc::new(LocalBackend::with_state_dir(&state.dir).expect("engine"));
    let budget = UploadBudget::new(4 * WORKING_SET).with_wait(Duration::from_millis(300));
    let mut config = e2b::wire::WireConfig::new(KEY);
    config.max_multipart_bytes = 256 * 1024 * 1024;
    config.upload_memory = budget.clone();
    let app = e2b::wire::router(backend.clone(), config);
    let (url, stop) = common::serve_in_process(app).await;
    let http = reqwest::Client::new();
    let created: Value = http
        .post(format!("{url}/v2/sandboxes"))
        .header("X-API-KEY", KEY)
        .json(&json!({"templateID": "base"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["sandboxID"].as_str().unwrap().to_string();
    let token = created["envdAccessToken"].as_str().unwrap().to_string();
    let addr = url.trim_start_matches("http://").to_string();

    let before = rss();
    const SENT: usize = 8 * 1024 * 1024;
    let mut connections = Vec::new();
    for i in 0..8 {
        let path = format!("/home/user/trickle-{i}");
        let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let head = "--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"t\"\r\n\r\n";
        // A 64 MiB file is announced; 8 MiB of it is sent, then nothing more.
        let length = head.len() + 64 * 1024 * 1024;
        let request = format!(
            "POST /files?path={}&signature={} HTTP/1.1\r\nHost: {addr}\r\n\
             Content-Type: multipart/form-data; boundary=B\r\nContent-Length: {length}\r\n\r\n{head}",
            path.replace('/', "%2F"),
            signature(&path, &token),
        );
        conn.write_all(request.as_bytes()).await.unwrap();
        connections.push((path, conn));
    }
    let chunk = vec![b'x'; 64 * 1024];
    let mut running = 0;
    for (_, conn) in &mut connections {
        // A refused upload's body is not read: its writes stall, which is all right.
        let send = async {
            for _ in 0..SENT / chunk.len() {
                conn.write_all(&chunk).await?;
            }
            Ok::<_, std::io::Error>(())
        };
        if let Ok(Ok(())) = tokio::time::timeout(Duration::from_secs(20), send).await {
            running += 1;
        }
    }
    assert!(
        running >= 4,
        "four uploads within the budget take their data"
    );
    // Every upload is decided: four hold the whole budget, the others are refused.
    eventually(Duration::from_secs(20), "the budget is taken", || async {
        (budget.in_use() == budget.total())
            .then_some(())
            .ok_or(budget.in_use())
    })
    .await;
    let mut refused = 0;
    for (_, conn) in &mut connections {
        let mut answer = [0u8; 12];
        if let Ok(Ok(n)) =
            tokio::time::timeout(Duration::from_millis(500), conn.read(&mut answer)).await
        {
            if answer[..n].starts_with(b"HTTP/1.1 429") {
                refused += 1;
            }
        }
    }
    assert_eq!(
        refused, 4,
        "the uploads past the budget are refused as busy"
    );
    assert!(budget.in_use() <= budget.total());
    // 4 × 8 MiB went into running uploads and 8 × 8 MiB were sent in all: held whole, as
    // before, that was at least 32 MiB more resident memory.
    let grown = rss().saturating_sub(before);
    assert!(
        grown < 24 * 1024 * 1024,
        "resident memory grew by {grown} bytes"
    );

    // Broken off: the reservations come back and nothing is written.
    let paths: Vec<String> = connections.iter().map(|(p, _)| p.clone()).collect();
    drop(connections);
    eventually(
        Duration::from_secs(30),
        "the budget is free again",
        || async { (budget.in_use() == 0).then_some(()).ok_or(budget.in_use()) },
    )
    .await;
    for path in &paths {
        let err = backend
            .stat(&id, path, Default::default())
            .await
            .unwrap_err();
        assert!(err.is_not_found(), "{path}: {err}");
    }
    let listed = backend
        .list_dir(&id, "/home/user", Default::default())
        .await
        .unwrap();
    assert!(
        listed.iter().all(|f| !f.name.starts_with("trickle")),
        "{listed:?}"
    );
    drop(stop);
    let _ = std::thread::spawn(move || drop(state)).join();
}
