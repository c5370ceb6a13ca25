//! References: reopening what a saved reference names, or saying what became of it.

use super::*;

/// Expect `result` to be the tombstone of `kind` `id`, with its time and reason in words.
fn assert_destroyed<T: std::fmt::Debug>(
    result: sandcove::Result<T>,
    kind: &str,
    id: &str,
    reason: &str,
) {
    match result {
        Err(e @ sandcove::Error::Destroyed { .. }) => {
            let text = e.to_string();
            let sandcove::Error::Destroyed {
                kind: k,
                id: i,
                at,
                reason: r,
            } = e
            else {
                unreachable!()
            };
            assert_eq!((k.as_str(), i.as_str()), (kind, id), "{text}");
            assert!(r.contains(reason), "{text}");
            let now = sandcove::now_millis();
            assert!(at <= now && now - at < 600_000, "ended just now: {text}");
            assert!(text.contains("destroyed at 20"), "{text}");
        }
        other => panic!("expected the tombstone of {kind} {id:?}, got {other:?}"),
    }
}

/// Saved references name each kind of resource, reopen it while it lives, and answer the
/// typed outcome otherwise: another runtime's reference is `Forbidden`, an unknown id
/// `NotFound`, an id of another kind `Conflict`, and a resource that ended a `Destroyed`
/// tombstone (distinct from `NotFound`) naming when and why.
pub async fn references_reopen_or_say_what_became_of_them(client: sandcove::Client) {
    use sandcove::{Error, Reference, Reopened};
    let caps = client.ready().await.expect("capabilities");
    let runtime = client
        .runtime_id()
        .await
        .expect("the runtime has an identity");
    assert_eq!(caps.runtime_id.as_deref(), Some(runtime.as_str()));
    let (sandbox, _) = client
        .create_described(test_options(&unique("refs")))
        .await
        .expect("create");
    let id = sandbox.id().to_string();
    let r = sandbox.reference().expect("reference");
    assert_eq!(r.to_string(), format!("sandcove:v1:{runtime}:sandbox:{id}"));
    let saved: Reference = r.to_string().parse().expect("parses back");
    match client.reopen(&saved).await.expect("reopen") {
        Reopened::Sandbox(info) => assert_eq!(info.id, id),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        client.reopen_sandbox(&saved).await.expect("reopen").id(),
        id
    );
    assert_eq!(
        client
            .sandbox_reference(&sandbox.info().await.unwrap())
            .await
            .unwrap(),
        r
    );

    // A process, also after it ended (the sandbox still lists it).
    let handle = sandbox.spawn("exit 3").await.expect("spawn");
    let pr = handle.reference().expect("process reference");
    assert_eq!(pr, sandbox.process_reference(handle.pid()).unwrap());
    let pid = handle.pid();
    handle.wait().await.expect("wait");
    match client
        .reopen(&pr.to_string().parse().unwrap())
        .await
        .expect("reopen")
    {
        Reopened::Process(p) => {
            assert_eq!(p.pid, pid);
            assert!(p.exit.is_some(), "{p:?}");
        }
        other => panic!("{other:?}"),
    }
    let missing_pid = Reference::process(&runtime, &id, 999_999).unwrap();
    let e = client.reopen(&missing_pid).await.unwrap_err();
    assert!(e.is_not_found(), "{e:?}");

    // Another runtime's reference is refused without being looked up; an unknown id is
    // plainly not found.
    let foreign = Reference::sandbox("rt-another-runtime", &id).unwrap();
    match client.reopen(&foreign).await {
        Err(Error::Forbidden { what }) => assert!(what.contains("rt-another-runtime"), "{what}"),
        other => panic!("expected Forbidden, got {other:?}"),
    }
    let never = Reference::sandbox(&runtime, &unique("never")).unwrap();
    let e = client.reopen(&never).await.unwrap_err();
    assert!(e.is_not_found(), "{e:?}");

    // A preview, closed: its tombstone.
    if caps.previews {
        let mut options = PreviewOptions::default();
        options.port = 8080;
        sandbox.expose_port(options).await.expect("expose");
        let vr = sandbox.preview_reference(8080).unwrap();
        match client.reopen(&vr).await.expect("reopen") {
            Reopened::Preview(p) => assert_eq!(p.port, 8080),
            other => panic!("{other:?}"),
        }
        sandbox.close_preview(8080).await.expect("close");
        assert_destroyed(
            client.reopen(&vr).await,
            "preview",
            &format!("{id}:8080"),
            "closed",
        );
    }

    // A snapshot, deleted: its tombstone. An id of another kind is a conflict.
    let as_snapshot = Reference::snapshot(&runtime, &id).unwrap();
    if caps.snapshots {
        let snap = sandbox.snapshot(None).await.expect("snapshot");
        let sr = client.snapshot_reference(&snap).await.unwrap();
        match client.reopen(&sr).await.expect("reopen") {
            Reopened::Snapshot(s) => assert_eq!(s.id, snap.id),
            other => panic!("{other:?}"),
        }
        match client.reopen(&as_snapshot).await {
            Err(Error::Conflict { what }) => assert!(what.contains("is a sandbox"), "{what}"),
            other => panic!("expected Conflict, got {other:?}"),
        }
        client.delete_snapshot(&snap.id).await.expect("delete");
        assert_destroyed(client.reopen(&sr).await, "snapshot", &snap.id, "deleted");
    } else {
        let e = client.reopen(&as_snapshot).await.unwrap_err();
        assert_eq!(e.code(), ErrorCode::NotSupported, "{e:?}");
    }

    // A volume, deleted: its tombstone.
    if caps.volumes {
        let name = format!("refs-{}", sandcove::random_id(12));
        let vol = client.create_volume(&name).await.expect("volume");
        let vr = client.volume_reference(&vol).await.unwrap();
        match client.reopen(&vr).await.expect("reopen") {
            Reopened::Volume(v) => assert_eq!(v.name, name),
            other => panic!("{other:?}"),
        }
        client.delete_volume(&name).await.expect("delete");
        assert_destroyed(client.reopen(&vr).await, "volume", &name, "deleted");
    }

    // The sandbox, destroyed: its tombstone, also for what lived in it; and never NotFound.
    sandbox.destroy().await.expect("destroy");
    assert_destroyed(client.reopen(&saved).await, "sandbox", &id, "destroyed");
    assert_destroyed(client.reopen(&pr).await, "sandbox", &id, "destroyed");
    assert!(client
        .reopen_sandbox(&saved)
        .await
        .unwrap_err()
        .is_destroyed());
    match client.reopen_sandbox(&pr).await {
        Err(Error::Conflict { .. }) => {}
        other => panic!("a process reference is not a sandbox: {other:?}"),
    }
}

/// A sandbox whose lease ended leaves a tombstone saying so.
pub async fn references_to_a_sandbox_whose_lease_ended_are_destroyed(client: sandcove::Client) {
    let mut options = test_options(&unique("refs-lease"));
    options.timeout = Some(Duration::from_secs(1));
    let sandbox = client.create(options).await.expect("create");
    let r = sandbox.reference().expect("reference");
    let id = sandbox.id().to_string();
    eventually(Duration::from_secs(30), "the lease ends", || {
        let client = client.clone();
        let id = id.clone();
        async move {
            match client.backend().get(&id).await {
                Err(e) if e.is_not_found() => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
    assert_destroyed(client.reopen(&r).await, "sandbox", &id, "its lease ended");
}

/// Reopen only reads: a paused sandbox (even one that resumes on any request) stays paused
/// with the same lease, and a process in it is not looked up by waking it.
pub async fn reopen_never_resumes_or_extends(client: sandcove::Client) {
    use sandcove::Reopened;
    let caps = client.ready().await.expect("capabilities");
    let mut options = test_options(&unique("refs-paused"));
    options.auto_resume = caps.pause;
    let sandbox = client.create(options).await.expect("create");
    let handle = sandbox.spawn("sleep 300").await.expect("spawn");
    let pr = handle.reference().expect("process reference");
    let r = sandbox.reference().expect("reference");
    if caps.pause {
        sandbox.pause().await.expect("pause");
    }
    let before = sandbox.info().await.expect("info");
    let expected = if caps.pause {
        SandboxState::Paused
    } else {
        SandboxState::Running
    };
    assert_eq!(before.state, expected);
    match client.reopen(&r).await.expect("reopen") {
        Reopened::Sandbox(info) => {
            assert_eq!(info.state, expected);
            assert_eq!(info.ends_at, before.ends_at, "the lease is unchanged");
        }
        other => panic!("{other:?}"),
    }
    let process = client.reopen(&pr).await;
    if caps.pause {
        match process {
            Err(sandcove::Error::InvalidState { state, .. }) => assert_eq!(state, "paused"),
            other => panic!("a paused sandbox's process: {other:?}"),
        }
    } else {
        assert!(matches!(process, Ok(Reopened::Process(_))), "{process:?}");
    }
    let after = sandbox.info().await.expect("info");
    assert_eq!(after.state, expected, "reopen woke the sandbox");
    assert_eq!(after.ends_at, before.ends_at, "reopen moved the lease");
    sandbox.destroy().await.expect("destroy");
}
