//! A runtime that cannot be reached is unavailable, never "this runtime lacks the feature":
//! the facade's error for a create needing volumes says the server is down.

/// A loopback port nothing listens on (bound by the kernel's choice, then released).
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

// One test in this binary: it points the whole program at the unreachable server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_unavailable_not_unsupported() {
    let url = format!("http://127.0.0.1:{}", closed_port());
    // Set before the first call into the runtime, by the only test in this binary.
    std::env::set_var(sandcove::client::URL_ENV, &url);
    std::env::set_var(sandcove::client::API_KEY_ENV, "unused-key");
    let client = sandcove::Client::from_env().expect("a client (nothing sent yet)");
    assert_eq!(client.capabilities().observed_at, None, "never observed");
    let mut options = sandcove::CreateOptions::default();
    options
        .volumes
        .push(sandcove::VolumeMount::new("data", "/data"));
    match client
        .check_create(&options)
        .await
        .expect("a check answers")
    {
        sandcove::CheckStatus::Unavailable { reason, .. } => {
            assert!(reason.contains("cannot reach"), "{reason}")
        }
        other => panic!("unreachable server: {other:?}"),
    }
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
