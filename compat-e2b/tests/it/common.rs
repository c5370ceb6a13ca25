//! Shared helpers for the facade tests: every test runs against the real embedded runtime.

use e2b::{Sandbox, SandboxException};

/// A unique marker for metadata and file names.
pub fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{prefix}-{}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A sandbox with a short lifetime, labelled for this test.
pub async fn sandbox(test: &str) -> Sandbox {
    Sandbox::create()
        .timeout(120)
        .metadata([("e2b-test", test)])
        .await
        .unwrap_or_else(|e| panic!("create a sandbox for {test}: {e}"))
}

/// What the runtime can do.
pub async fn caps() -> sandcove::Capabilities {
    e2b::runtime_capabilities().await.expect("runtime")
}

/// Assert that `result` is the facade's NotSupported error.
pub fn assert_not_supported<T: std::fmt::Debug>(result: Result<T, SandboxException>, what: &str) {
    match result {
        Err(e) if e.is_not_supported() => {}
        other => panic!("{what}: expected NotSupported, got {other:?}"),
    }
}

/// Print a loud reason for skipping the positive half of a capability test.
pub fn skip(what: &str, capability: &str) {
    eprintln!(
        "SKIPPED (positive check): {what} needs the runtime capability `{capability}`, which is false; checked that it raises NotSupported instead"
    );
}
