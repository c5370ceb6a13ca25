//! Shared helpers: a `Daytona` on the embedded engine and short-lived sandboxes.

use daytona::{CreateSandboxFromSnapshotParams, Daytona, DaytonaConfig, Sandbox};

/// A client on the embedded engine (no `SANDCOVE_URL` in tests).
pub fn daytona() -> Daytona {
    Daytona::new(DaytonaConfig {
        api_key: Some("test-key-never-sent".into()),
        ..Default::default()
    })
    .expect("embedded runtime")
}

/// Params for a sandbox that ends by itself after two minutes.
pub fn short_lived() -> CreateSandboxFromSnapshotParams {
    CreateSandboxFromSnapshotParams {
        auto_stop_interval: Some(2),
        ..Default::default()
    }
}

/// A fresh short-lived sandbox.
pub async fn sandbox() -> (Daytona, Sandbox) {
    let d = daytona();
    let sb = d.create(short_lived()).await.expect("create sandbox");
    (d, sb)
}
