//! Stop and start: processes end, files stay, the lease pauses.

use super::*;

/// Stop ends every process (a tagged marker by its exact pid, and a background child),
/// keeps files, refuses work until started; start runs again with the same files, and new
/// processes work. Stop and start are idempotent; pause, resume and start refuse the states
/// they do not apply to.
pub async fn stop_ends_processes_keeps_files_and_start_runs_again(backend: &dyn Backend) {
    let id = create(backend, &unique("stop")).await;
    write(backend, &id, "kept/file.txt", b"still here").await;
    let marker = unique("stopmark");
    let child = unique("stopchild");
    let spec = ProcessSpec::new(Command::bash_login(format!(
        "(exec -a {child} sleep 600) & exec -a {marker} sleep 600"
    )))
    .tag("stop-marker");
    let stream = backend.spawn(&id, spec).await.expect("spawn");
    let pid = stream.pid;
    drop(stream);
    let local = backend.capabilities().isolated;
    if local {
        eventually(PATIENCE, "marker and child run", || async {
            equals(
                (host_process_count(&marker), host_process_count(&child)),
                (1, 1),
            )
        })
        .await;
    }
    let info = backend.stop(&id).await.expect("stop");
    assert_eq!(info.state, SandboxState::Stopped);
    assert_eq!(
        backend.get(&id).await.expect("get").state,
        SandboxState::Stopped
    );
    if local {
        // Already gone when stop returns: no waiting.
        assert_eq!(
            (host_process_count(&marker), host_process_count(&child)),
            (0, 0),
            "every process ended by the time stop returned"
        );
    }
    assert_eq!(
        backend.stop(&id).await.expect("stop again").state,
        SandboxState::Stopped
    );
    expect_code(
        backend
            .spawn(&id, ProcessSpec::new(Command::argv(["true"])))
            .await
            .map(|s| s.pid),
        ErrorCode::InvalidState,
        "spawn while stopped",
    );
    expect_code(
        read(backend, &id, "kept/file.txt").await,
        ErrorCode::InvalidState,
        "a file read while stopped",
    );
    expect_code(
        backend.resume(&id).await,
        ErrorCode::InvalidState,
        "resume while stopped",
    );
    if backend.capabilities().snapshots {
        // Files of a stopped sandbox are consistent (nothing runs): a fork copies them.
        let forked = backend
            .fork(&id, test_options(&unique("stopfork")))
            .await
            .expect("fork a stopped sandbox");
        assert_eq!(
            read(backend, &forked.id, "kept/file.txt")
                .await
                .expect("read the fork"),
            b"still here"
        );
        assert_eq!(
            backend.get(&id).await.expect("get").state,
            SandboxState::Stopped,
            "forking does not start the source"
        );
        backend.destroy(&forked.id).await.expect("destroy the fork");
    }
    if backend.capabilities().pause {
        expect_code(
            backend.pause(&id).await,
            ErrorCode::InvalidState,
            "pause while stopped",
        );
    }
    let info = backend.start(&id).await.expect("start");
    assert_eq!(info.state, SandboxState::Running);
    assert_eq!(
        backend.start(&id).await.expect("start again").state,
        SandboxState::Running
    );
    assert_eq!(
        read(backend, &id, "kept/file.txt").await.expect("read"),
        b"still here"
    );
    let processes = backend.list_processes(&id).await.expect("list processes");
    let marker_info = processes
        .iter()
        .find(|p| p.pid == pid)
        .unwrap_or_else(|| panic!("pid {pid} listed: {processes:?}"));
    assert_eq!(marker_info.tag.as_deref(), Some("stop-marker"));
    let exit = marker_info.exit.expect("the marker ended");
    assert_eq!(exit.signal, Some(9), "killed by the stop: {exit:?}");
    assert!(marker_info.ended_at.is_some());
    assert!(
        processes.iter().all(|p| p.exit.is_some()),
        "no process runs after a stop: {processes:?}"
    );
    assert_eq!(sh(backend, &id, "echo again").await.stdout, b"again\n");
    if backend.capabilities().pause {
        backend.pause(&id).await.expect("pause");
        expect_code(
            backend.start(&id).await,
            ErrorCode::InvalidState,
            "start while paused",
        );
        // Stopping a paused sandbox ends its frozen processes too.
        let frozen = unique("frozen");
        let spec = ProcessSpec::new(Command::bash_login(format!("exec -a {frozen} sleep 600")));
        backend.resume(&id).await.expect("resume");
        drop(backend.spawn(&id, spec).await.expect("spawn"));
        if local {
            eventually(PATIENCE, "the frozen marker runs", || async {
                equals(host_process_count(&frozen), 1)
            })
            .await;
        }
        backend.pause(&id).await.expect("pause");
        assert_eq!(
            backend.stop(&id).await.expect("stop paused").state,
            SandboxState::Stopped
        );
        if local {
            assert_eq!(host_process_count(&frozen), 0, "frozen processes ended");
        }
        backend.start(&id).await.expect("start");
    }
    backend.destroy(&id).await.expect("destroy");
}

/// The lease does not run while a sandbox is stopped: a sandbox stopped with a few seconds
/// left outlives that time, and start gives it back what it had left.
pub async fn stop_pauses_the_lease(backend: &dyn Backend) {
    const LEASE: Duration = Duration::from_secs(10);
    let mut options = test_options(&unique("stoplease"));
    options.timeout = Some(LEASE);
    let info = backend.create(options).await.expect("create");
    let id = info.id;
    let left_before = info.ends_at.saturating_sub(sandcove::now_millis());
    backend.stop(&id).await.expect("stop");
    // Time passing is the subject: wait until the original lease has ended.
    let original_end = info.ends_at + 1000;
    eventually(PATIENCE, "the original lease has passed", || async {
        holds(
            sandcove::now_millis() > original_end,
            sandcove::now_millis(),
        )
    })
    .await;
    let stopped = backend
        .get(&id)
        .await
        .expect("a stopped sandbox outlives its lease");
    assert_eq!(stopped.state, SandboxState::Stopped);
    let started = backend.start(&id).await.expect("start");
    let left_after = started.ends_at.saturating_sub(sandcove::now_millis());
    assert!(
        left_after + 3000 >= left_before && left_after <= left_before + 500,
        "start gives back the time left at stop: {left_before} ms before, {left_after} ms after"
    );
    backend.destroy(&id).await.expect("destroy");
}
