//! A runtime that cannot be reached is unavailable, never "this runtime lacks the feature":
//! Daytona's volume calls and a create with volumes answer `DaytonaServiceUnavailableError`.

use daytona::{CreateSandboxFromSnapshotParams, Daytona, DaytonaConfig, DaytonaError, VolumeMount};

// One test in this binary: it points the whole program at the unreachable server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_unavailable_not_unsupported() {
    let client = sandcove_conformance::unreachable_runtime().await;
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
