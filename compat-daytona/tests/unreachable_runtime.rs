//! A runtime that cannot be reached is unavailable, never "this runtime lacks the feature":
//! Daytona's volume calls and a create with volumes answer `DaytonaServiceUnavailableError`.

use std::sync::Arc;

use daytona::{CreateSandboxFromSnapshotParams, Daytona, DaytonaConfig, DaytonaError, VolumeMount};

/// A loopback port nothing listens on (bound by the kernel's choice, then released).
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_unavailable_not_unsupported() {
    let url = format!("http://127.0.0.1:{}", closed_port());
    let backend = sandcove::HttpBackend::new(&url, "unused-key").expect("a client, nothing sent");
    let client = sandcove::Client::new(Arc::new(backend));
    let daytona = Daytona::with_client(client, DaytonaConfig::default());
    let err = daytona.volume.list().await.expect_err("no server");
    assert!(
        !err.is_not_supported(),
        "down, not lacking volumes: {err:?}"
    );
    assert!(
        matches!(err, DaytonaError::ServiceUnavailable(_)),
        "{err:?}"
    );
    let params = CreateSandboxFromSnapshotParams {
        volumes: Some(vec![VolumeMount {
            volume_id: "data".into(),
            mount_path: "/data".into(),
            subpath: None,
        }]),
        ..Default::default()
    };
    let err = daytona
        .create(daytona::CreateSandboxParams::Snapshot(params))
        .await
        .expect_err("no server");
    assert!(
        !err.is_not_supported(),
        "down, not lacking volumes: {err:?}"
    );
    assert!(
        matches!(err, DaytonaError::ServiceUnavailable(_)),
        "{err:?}"
    );
}
