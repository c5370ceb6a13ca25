//! Isolation and limits: what a sandbox cannot see or outlive.

use super::*;

/// Destroy ends every process of the sandbox, background ones included.
pub async fn destroy_ends_background_processes(backend: &dyn Backend) {
    let id = create(backend, &unique("bgkill")).await;
    let marker = unique("bg");
    for _ in 0..3 {
        let spec = ProcessSpec::new(Command::bash_login(format!(
            "(exec -a {marker} sleep 600) & exec -a {marker} sleep 600"
        )));
        drop(backend.spawn(&id, spec).await.expect("spawn"));
    }
    let marker = &marker;
    eventually(PATIENCE, "six sleepers run", || async move {
        equals(host_process_count(marker), 6)
    })
    .await;
    backend.destroy(&id).await.expect("destroy");
    eventually(
        PATIENCE,
        "no process of the destroyed sandbox is left on the host",
        || async move { equals(host_process_count(marker), 0) },
    )
    .await;
}

/// The process and open-file limits apply inside.
pub async fn limits_are_applied(backend: &dyn Backend) {
    let mut options = test_options(&unique("limits"));
    options.resources.max_processes = Some(300);
    options.resources.max_open_files = Some(512);
    let process_limit = backend.capabilities().process_limit;
    if !process_limit {
        expect_code(
            backend.create(options.clone()).await,
            ErrorCode::NotSupported,
            "a process limit the backend cannot enforce",
        );
        options.resources.max_processes = None;
    }
    let id = backend.create(options).await.expect("create").id;
    let out = run(
        backend,
        &id,
        ProcessSpec::new(Command::bash_login("ulimit -u; ulimit -n")),
    )
    .await;
    let out = out.stdout_lossy();
    if process_limit {
        assert_eq!(out, "300\n512\n");
    } else {
        assert_eq!(out.lines().nth(1), Some("512"), "open files: {out:?}");
    }
    backend.destroy(&id).await.expect("destroy");
}

/// Inside, `ps` shows only the sandbox's own processes.
pub async fn sandbox_sees_only_its_own_processes(backend: &dyn Backend) {
    let id = create(backend, &unique("pidns")).await;
    if backend.capabilities().isolated {
        let out = sh(backend, &id, "ls /proc | grep -c '^[0-9]*$'").await;
        let count: u32 = out.stdout_lossy().trim().parse().unwrap_or(999);
        assert!(count <= 4, "sandbox sees {count} processes");
        let out = sh(backend, &id, "cat /proc/1/comm").await;
        assert_eq!(out.stdout_lossy().trim(), "sandcove-agent");
    } else {
        skipped(
            "sandbox_sees_only_its_own_processes",
            "un-isolated processes share the host's process table",
        );
    }
    backend.destroy(&id).await.expect("destroy");
}

// ---------------------------------------------------------------------------------------------
// Lifecycle beyond create/destroy (pause, leases, previews, snapshots, volumes, watch, pty)
// ---------------------------------------------------------------------------------------------
