//! Pause and resume, by call, at the lease's end and on a request.

use super::*;
use sandcove::{SetOnTimeoutOptions, SetTimeoutOptions};

/// A counter loop stops printing while paused and continues from where it stopped.
pub async fn pause_stops_and_resume_continues(backend: &dyn Backend) {
    let id = create(backend, &unique("pause")).await;
    let spec = ProcessSpec::new(Command::sh(
        "i=0; while true; do echo $i; i=$((i+1)); sleep 0.02; done",
    ));
    if !backend.capabilities().pause {
        expect_code(backend.pause(&id).await, ErrorCode::NotSupported, "pause");
        backend.destroy(&id).await.expect("destroy");
        return;
    }
    let mut stream = backend.spawn(&id, spec).await.expect("spawn");
    let mut seen = Vec::new();
    read_until(&mut stream, &mut seen, |s| s.lines().count() >= 5).await;
    let info = backend.pause(&id).await.expect("pause");
    assert_eq!(info.state, SandboxState::Paused);
    assert_eq!(
        backend.get(&id).await.expect("get").state,
        SandboxState::Paused
    );
    // Whatever was in flight arrives; then silence. Time is the subject here: output written
    // before the pause may still be relayed, so drain until a full second passes without any
    // (bounded), then a further second must stay silent.
    let drain_until = Instant::now() + PATIENCE;
    while let Ok(next) = tokio::time::timeout(Duration::from_secs(1), stream.events.next()).await {
        match next {
            Some(Ok(ProcessEvent::Stdout(b))) => seen.extend(b),
            other => panic!("expected output or silence while paused, got {other:?}"),
        }
        assert!(
            Instant::now() < drain_until,
            "output never stops while paused"
        );
    }
    let quiet = tokio::time::timeout(Duration::from_secs(1), stream.events.next()).await;
    assert!(quiet.is_err(), "no output while paused, got {quiet:?}");
    expect_code(
        backend
            .spawn(&id, ProcessSpec::new(Command::argv(["true"])))
            .await
            .map(|s| s.pid),
        ErrorCode::InvalidState,
        "exec in a paused sandbox",
    );
    let last: u64 = String::from_utf8_lossy(&seen)
        .lines()
        .last()
        .and_then(|l| l.parse().ok())
        .expect("a number");
    let info = backend.resume(&id).await.expect("resume");
    assert_eq!(info.state, SandboxState::Running);
    read_until(&mut stream, &mut seen, |s| {
        s.lines().count() as u64 > last + 5
    })
    .await;
    let numbers: Vec<u64> = String::from_utf8_lossy(&seen)
        .lines()
        .filter_map(|l| l.parse().ok())
        .collect();
    assert!(
        numbers.windows(2).all(|w| w[1] == w[0] + 1),
        "the counter continues where it stopped: {numbers:?}"
    );
    backend.destroy(&id).await.expect("destroy");
}

/// `on_timeout: Pause` pauses instead of destroying; resuming starts a new lease.
pub async fn lease_end_can_pause(backend: &dyn Backend) {
    let mut options = test_options(&unique("leasepause"));
    options.on_timeout = TimeoutAction::Pause;
    if !backend.capabilities().pause {
        expect_code(
            backend.create(options).await,
            ErrorCode::NotSupported,
            "a lease that pauses without pause",
        );
        return;
    }
    let id = backend.create(options).await.expect("create").id;
    sh(backend, &id, "echo kept > /workspace/f").await;
    // A short lease only once the file is written, so a slow machine cannot pause it first.
    backend
        .set_timeout(&id, SetTimeoutOptions::new(Duration::from_secs(1)))
        .await
        .expect("set_timeout");
    eventually(PATIENCE, "paused at the end of the lease", || async {
        let state = backend.get(&id).await.map(|i| i.state);
        holds(matches!(state, Ok(SandboxState::Paused)), state)
    })
    .await;
    let info = backend.resume(&id).await.expect("resume");
    assert!(info.ends_at > sandcove::now_millis(), "a new lease");
    assert_eq!(sh(backend, &id, "cat /workspace/f").await.stdout, b"kept\n");
    backend.destroy(&id).await.expect("destroy");
}

/// `on_timeout: Stop` stops instead of destroying: the processes end, the files stay, and
/// `start` runs it again with a new lease. `auto_resume` cannot be asked with it.
pub async fn lease_end_can_stop(backend: &dyn Backend) {
    let mut both = test_options(&unique("leasestopresume"));
    both.on_timeout = TimeoutAction::Stop;
    both.auto_resume = true;
    expect_code(
        backend.create(both).await,
        ErrorCode::InvalidArgument,
        "auto_resume with a lease that stops",
    );
    let mut options = test_options(&unique("leasestop"));
    options.on_timeout = TimeoutAction::Stop;
    if !backend.capabilities().lease_stop {
        expect_code(
            backend.create(options).await,
            ErrorCode::NotSupported,
            "a lease that stops without lease_stop",
        );
        return;
    }
    let id = backend.create(options).await.expect("create").id;
    sh(backend, &id, "echo kept > /workspace/f").await;
    let sleeper = backend
        .spawn(&id, ProcessSpec::new(Command::argv(["sleep", "600"])))
        .await
        .expect("a process to end");
    // A short lease only once the file is written, so a slow machine cannot stop it first.
    backend
        .set_timeout(&id, SetTimeoutOptions::new(Duration::from_secs(1)))
        .await
        .expect("set_timeout");
    eventually(PATIENCE, "stopped at the end of the lease", || async {
        let state = backend.get(&id).await.map(|i| i.state);
        holds(matches!(state, Ok(SandboxState::Stopped)), state)
    })
    .await;
    let info = backend.start(&id).await.expect("start");
    assert!(
        info.ends_at > sandcove::now_millis() + 10_000,
        "a new lease, not the one that ran out"
    );
    assert_eq!(sh(backend, &id, "cat /workspace/f").await.stdout, b"kept\n");
    let listed = backend.list_processes(&id).await.expect("list");
    assert!(
        listed
            .iter()
            .filter(|p| p.pid == sleeper.pid)
            .all(|p| p.exit.is_some()),
        "the stop ended the process: {listed:?}"
    );
    backend.destroy(&id).await.expect("destroy");
}

/// `set_on_timeout` changes what the lease's end does after creation: a sandbox made to
/// pause is destroyed once told so, one made to be destroyed pauses.
pub async fn lease_end_action_can_change(backend: &dyn Backend) {
    if !backend.capabilities().pause {
        let id = backend
            .create(test_options(&unique("leaseaction")))
            .await
            .expect("create")
            .id;
        expect_code(
            backend
                .set_on_timeout(&id, SetOnTimeoutOptions::new(TimeoutAction::Pause))
                .await,
            ErrorCode::NotSupported,
            "a lease that pauses without pause",
        );
        let info = backend
            .set_on_timeout(&id, SetOnTimeoutOptions::new(TimeoutAction::Destroy))
            .await
            .expect("set_on_timeout");
        assert_eq!(info.on_timeout, TimeoutAction::Destroy);
        backend.destroy(&id).await.expect("destroy");
        return;
    }
    let mut options = test_options(&unique("leaseaction"));
    options.on_timeout = TimeoutAction::Pause;
    let paused_one = backend.create(options).await.expect("create").id;
    let info = backend
        .set_on_timeout(
            &paused_one,
            SetOnTimeoutOptions::new(TimeoutAction::Destroy),
        )
        .await
        .expect("set_on_timeout");
    assert_eq!(info.on_timeout, TimeoutAction::Destroy);
    assert_eq!(
        backend.get(&paused_one).await.expect("get").on_timeout,
        TimeoutAction::Destroy
    );
    let destroyed_one = backend
        .create(test_options(&unique("leaseaction")))
        .await
        .expect("create")
        .id;
    let info = backend
        .set_on_timeout(
            &destroyed_one,
            SetOnTimeoutOptions::new(TimeoutAction::Pause),
        )
        .await
        .expect("set_on_timeout");
    assert_eq!(info.on_timeout, TimeoutAction::Pause);
    for id in [&paused_one, &destroyed_one] {
        backend
            .set_timeout(id, SetTimeoutOptions::new(Duration::from_secs(1)))
            .await
            .expect("set_timeout");
    }
    eventually(
        PATIENCE,
        "the first destroyed, the second paused",
        || async {
            let first = backend.get(&paused_one).await.map(|i| i.state);
            let second = backend.get(&destroyed_one).await.map(|i| i.state);
            let done = matches!(&first, Err(e) if e.is_not_found())
                && matches!(second, Ok(SandboxState::Paused));
            holds(done, (first, second))
        },
    )
    .await;
    backend.destroy(&destroyed_one).await.expect("destroy");
}

/// A sandbox created with `auto_resume` resumes when work arrives.
pub async fn auto_resume_on_request(backend: &dyn Backend) {
    let mut options = test_options(&unique("autoresume"));
    options.auto_resume = true;
    if !backend.capabilities().pause {
        expect_code(
            backend.create(options).await,
            ErrorCode::NotSupported,
            "auto_resume without pause",
        );
        return;
    }
    let id = backend.create(options).await.expect("create").id;
    backend.pause(&id).await.expect("pause");
    assert_eq!(sh(backend, &id, "echo awake").await.stdout, b"awake\n");
    assert_eq!(
        backend.get(&id).await.expect("get").state,
        SandboxState::Running
    );
    backend.destroy(&id).await.expect("destroy");
}
