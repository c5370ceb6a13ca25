//! The conformance suite against `HttpBackend` talking to a loopback server that wraps the
//! embedded engine: every case crosses the HTTP boundary both ways.

use std::sync::Arc;

use sandcove::server::{LocalServer, ServerConfig};
use sandcove::{Backend, HttpBackend, LocalBackend};

/// A fresh server on `127.0.0.1:0` with a random key, and a client connected to it.
async fn served() -> Arc<dyn Backend> {
    let key = sandcove::conformance::unique("key");
    let engine = Arc::new(LocalBackend::new().expect("local engine"));
    let server = LocalServer::start(engine, ServerConfig::new(key.clone()))
        .await
        .expect("start the server");
    let client = HttpBackend::connect(&server.url(), &key)
        .await
        .expect("connect");
    // The server task belongs to this test's runtime and ends with it.
    std::mem::forget(server);
    Arc::new(client)
}

sandcove::conformance_tests!(served());

/// The client reports the served backend's capabilities.
#[tokio::test]
async fn capabilities_are_the_served_backends() {
    let client = served().await;
    let local = LocalBackend::new().unwrap().capabilities();
    let remote = client.capabilities();
    assert_eq!(remote.backend, "http+local");
    assert_eq!(remote.isolated, local.isolated);
    assert_eq!(remote.process_limit, local.process_limit);
    assert_eq!(remote.max_file_bytes, local.max_file_bytes);
    assert_eq!(remote.pause, local.pause);
}
