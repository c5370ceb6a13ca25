//! A runtime that cannot be reached is unavailable, never "this runtime lacks the feature":
//! the facade's error for a create needing volumes says the server is down.

// One test in this binary: it points the whole program at the unreachable server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_unavailable_not_unsupported() {
    sandcove_conformance::unreachable_runtime().await;
    let err = blaxel::SandboxInstance::create(
        serde_json::json!({"name": "unreach", "volumes": [{"name": "data", "mountPath": "/data"}]}),
    )
    .await
    .expect_err("nothing to create it on");
    assert!(
        !err.is_not_supported(),
        "the server is down, not lacking volumes: {err:?}"
    );
    assert_eq!(err.status_code(), Some(503), "{err:?}");
}
