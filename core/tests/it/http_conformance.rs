//! The conformance suite against `HttpBackend` talking to a loopback server that wraps the
//! embedded engine: every case crosses the HTTP boundary both ways.

use std::sync::Arc;

use sandcove::{Backend, LocalBackend};

/// A fresh loopback server wrapping a new engine, and a client connected to it.
async fn served() -> Arc<dyn Backend> {
    let engine = Arc::new(LocalBackend::new().expect("local engine"));
    Arc::new(sandcove_conformance::served(engine).await)
}

sandcove_conformance::conformance_tests!(served());

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
