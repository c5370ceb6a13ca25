//! The server's policy on the native API: the host's network only with
//! `--allow-host-network`, and at most `--max-sandboxes` live sandboxes however many creates
//! race for the last places. (Each vendor listener's view of the same policy is tested in its
//! `*_wire.rs`.)

use std::ffi::OsStr;
use std::process::Command;
use std::sync::Arc;

use crate::common::{bin, ServeChild};
use sandcove::server::{LocalServer, PolicyBackend, ServerConfig, ServerPolicy};
use sandcove::{Backend, Error, HttpBackend, LocalBackend, NetworkPolicy};
use sandcove_conformance::{test_options, unique};
use sandcove_tests::PrivateState;

/// The native listener's announcement.
const LISTENING: &str = "sandcove serve: listening on";

/// Whether the built binary can be run from here (see `http_binary.rs`).
fn runnable() -> bool {
    match Command::new(bin()).arg("--version").output() {
        Ok(out) if out.status.success() => true,
        other => {
            eprintln!(
                "SKIPPED: cannot run {} from this process ({other:?})",
                bin().to_string_lossy()
            );
            false
        }
    }
}

/// `sandcove serve` with `extra` arguments on a private state directory.
fn serve(key: &str, state: &PrivateState, extra: &[&str]) -> (std::process::Child, String) {
    let mut args = vec!["--listen", "127.0.0.1:0", "--warm-pool", "0"];
    args.extend_from_slice(extra);
    ServeChild::start(
        &args,
        &[
            ("SANDCOVE_API_KEY", OsStr::new(key)),
            ("SANDCOVE_STATE_DIR", state.dir.as_os_str()),
        ],
        &[],
        LISTENING,
    )
    .expect("the server announces its listener")
    .drain_stderr()
}

/// Finding: `"network": "host"` was accepted from any API-key holder and the server had no
/// way to refuse it. It is now refused (403 `forbidden`) before anything is made, unless the
/// operator started the server with `--allow-host-network`.
#[tokio::test]
async fn host_network_needs_the_operators_flag() {
    if !runnable() {
        return;
    }
    let state = PrivateState::new();
    let engine = LocalBackend::with_state_dir(&state.dir).expect("engine");
    let key = unique("key");
    let host = test_options(&unique("host")).network(NetworkPolicy::Host);

    let (mut child, url) = serve(&key, &state, &[]);
    let client = HttpBackend::connect(&url, &key).await.expect("connect");
    let refused = client.create(host.clone()).await.unwrap_err();
    assert!(matches!(refused, Error::Forbidden { .. }), "{refused}");
    assert!(
        refused.to_string().contains("--allow-host-network"),
        "{refused}"
    );
    // The same over raw HTTP: 403 with the `forbidden` code.
    let raw = reqwest::Client::new()
        .post(format!("{url}/v1/sandboxes"))
        .bearer_auth(&key)
        .json(&serde_json::json!({"network": "host"}))
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status().as_u16(), 403);
    let body: serde_json::Value = raw.json().await.unwrap();
    assert_eq!(body["code"], "forbidden", "{body}");
    assert!(engine.list(Default::default()).await.unwrap().is_empty());
    // Other network policies are the clients' own.
    let loopback = client
        .create(test_options(&unique("none")))
        .await
        .expect("a loopback-only sandbox");
    client.destroy(&loopback.id).await.unwrap();
    let _ = child.kill();
    let _ = child.wait();

    let (mut child, url) = serve(&key, &state, &["--allow-host-network"]);
    let client = HttpBackend::connect(&url, &key).await.expect("connect");
    if !client.capabilities().host_network {
        eprintln!("SKIPPED (allowed half): this engine cannot share the host's network");
    } else {
        let made = client.create(host).await.expect("allowed by the operator");
        assert_eq!(made.network, NetworkPolicy::Host);
        client.destroy(&made.id).await.unwrap();
    }
    let _ = child.kill();
    let _ = child.wait();
    clean(state);
}

/// Finding: nothing bounded the sandboxes of a server (100 creates in 0.2 s). With a cap of
/// 3, eight creates racing over HTTP make exactly 3 sandboxes; the other five are refused
/// (403) before any effect, and a destroy frees a place again.
#[tokio::test]
async fn concurrent_creates_at_the_cap_never_exceed_it() {
    let state = PrivateState::new();
    let engine: Arc<LocalBackend> =
        Arc::new(LocalBackend::with_state_dir(&state.dir).expect("engine"));
    let mut policy = ServerPolicy::default();
    policy.max_sandboxes = 3;
    let backend = Arc::new(PolicyBackend::new(engine.clone(), policy));
    let server = LocalServer::start(backend, ServerConfig::new("cap-key"))
        .await
        .expect("server");
    let client = Arc::new(
        HttpBackend::connect(&server.url(), "cap-key")
            .await
            .expect("connect"),
    );
    let label = unique("cap");
    let creates: Vec<_> = (0..8)
        .map(|_| {
            let client = client.clone();
            let options = test_options(&label);
            tokio::spawn(async move { client.create(options).await })
        })
        .collect();
    let mut made = Vec::new();
    let mut refused = 0;
    for create in creates {
        match create.await.unwrap() {
            Ok(info) => made.push(info.id),
            Err(Error::Forbidden { what }) => {
                assert!(what.contains("limit of 3 live sandboxes"), "{what}");
                refused += 1;
            }
            Err(e) => panic!("neither made nor refused by the cap: {e}"),
        }
    }
    assert_eq!(made.len(), 3, "exactly the cap");
    assert_eq!(refused, 5);
    assert_eq!(engine.list(Default::default()).await.unwrap().len(), 3);
    // A fork counts as a create.
    let fork = client
        .fork(&made[0], test_options(&label))
        .await
        .unwrap_err();
    assert!(matches!(fork, Error::Forbidden { .. }), "{fork}");
    assert_eq!(engine.list(Default::default()).await.unwrap().len(), 3);
    // A destroyed sandbox frees its place.
    client.destroy(&made[0]).await.unwrap();
    let again = client
        .create(test_options(&label))
        .await
        .expect("a free place");
    made[0] = again.id;
    for id in &made {
        client.destroy(id).await.unwrap();
    }
    server.stop().await.unwrap();
    clean(state);
}

/// Remove a private state directory (its cleanup runs a runtime of its own: not on this
/// runtime's thread).
fn clean(state: PrivateState) {
    let _ = std::thread::spawn(move || drop(state)).join();
}
