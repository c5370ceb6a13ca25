//! Cases over a `Client`: checks before effects, leases, checked runs, forks.

use super::*;

/// `check_create` and `check_snapshot` answer from the capabilities alone: a request the
/// runtime can serve is supported with what will hold, an image it cannot provide or a
/// feature it lacks is unsupported with the alternative, and nothing is created by any
/// check. `create` runs the same check first: the refused image creates nothing either.
pub async fn check_create_evaluates_without_allocating(client: sandcove::Client) {
    use sandcove::CheckStatus;
    let label = unique("check");
    let caps = client.ready().await.expect("capabilities");
    assert!(
        caps.observed_at.is_some(),
        "capabilities say when they were observed"
    );
    let options = test_options(&label);
    let guarantees = match client.check_create(&options).await.expect("check") {
        CheckStatus::Supported(g) => g,
        other => panic!("a plain create is supported: {other:?}"),
    };
    assert_eq!(guarantees.isolated, caps.isolated);
    assert_eq!(guarantees.network_isolated, caps.isolated);
    assert_eq!(guarantees.lease, Some(Duration::from_secs(600)));
    assert!(guarantees.observed_at.is_some());
    for base in [None, Some(""), Some("base")] {
        let mut o = options.clone();
        o.template = base.map(str::to_string);
        assert!(
            client.check_create(&o).await.expect("check").is_supported(),
            "{base:?} is the host base"
        );
    }
    let mut image = options.clone();
    image.template = Some("myorg/custom-ml:1.2".into());
    match client.check_create(&image).await.expect("check") {
        // A runtime that runs images may hold this one under a reference it did not list:
        // the check cannot tell, the create asks the runtime, which does not hold it.
        CheckStatus::Unknown { what } if caps.images => {
            assert!(what.contains("myorg/custom-ml:1.2"), "{what}");
            assert!(what.contains("sandcove image pull"), "names a way: {what}");
        }
        CheckStatus::Unsupported {
            feature,
            alternative,
        } if !caps.images => {
            assert!(feature.contains("myorg/custom-ml:1.2"), "{feature}");
            assert!(
                alternative.contains("host"),
                "names what runs: {alternative}"
            );
            assert!(
                alternative.contains("snapshot"),
                "names a way: {alternative}"
            );
        }
        other => panic!("an image the runtime lacks: {other:?}"),
    }
    expect_code(
        client.create(image).await.map(|s| s.id().to_string()),
        if caps.images {
            ErrorCode::NotFound
        } else {
            ErrorCode::NotSupported
        },
        "create with an image the runtime lacks",
    );
    let mut limited = options.clone();
    limited.resources.memory_mib = Some(64);
    match client.check_create(&limited).await.expect("check") {
        CheckStatus::Supported(g) if caps.memory_limit => {
            assert_eq!(g.limits_enforced, [sandcove::Feature::MemoryLimit.name()]);
        }
        CheckStatus::Unsupported { feature, .. } if !caps.memory_limit => {
            assert_eq!(feature, sandcove::Feature::MemoryLimit.name());
        }
        other => panic!(
            "a memory limit (enforced: {}): {other:?}",
            caps.memory_limit
        ),
    }
    match client.check_snapshot().await.expect("check") {
        CheckStatus::Supported(g) if caps.snapshots => {
            let preserves = g.snapshot_preserves.expect("what a snapshot keeps");
            assert!(preserves.contains("files"), "{preserves}");
            assert!(preserves.contains("not its processes"), "{preserves}");
        }
        CheckStatus::Unsupported { .. } if !caps.snapshots => {}
        other => panic!("snapshots ({}): {other:?}", caps.snapshots),
    }
    let mut bad = options.clone();
    bad.timeout = Some(Duration::ZERO);
    expect_code(
        client.check_create(&bad).await,
        ErrorCode::InvalidArgument,
        "a zero lease",
    );
    let made = client
        .list(ListOptions::default().label("conformance", label.clone()))
        .await
        .expect("list");
    assert!(made.is_empty(), "no check created anything: {made:?}");
}

/// `renew` reports the bounds and the lease it resolved; a zero lease and one past the
/// maximum are refused before any effect, leaving the lease as it was.
pub async fn leases_report_their_bounds_and_refuse_zero(client: sandcove::Client) {
    let sandbox = client
        .create(test_options(&unique("lease-bounds")))
        .await
        .expect("create");
    let before = sandbox.info().await.expect("info").ends_at;
    for refused in [
        Duration::ZERO,
        Duration::from_millis(999),
        sandcove::MAX_SANDBOX_TIMEOUT * 2,
    ] {
        match sandbox.set_timeout(refused).await {
            Err(sandcove::Error::InvalidArgument { message }) => {
                assert!(message.contains("at least"), "{message}");
            }
            other => panic!("lease {refused:?}: {other:?}"),
        }
    }
    assert_eq!(sandbox.info().await.expect("info").ends_at, before);
    let renewal = sandbox
        .renew(Duration::from_millis(120_500))
        .await
        .expect("renew");
    let bounds = renewal.bounds;
    assert_eq!(
        bounds,
        client.capabilities().lease.expect("reported bounds")
    );
    assert!(
        bounds.min_ms >= 1 && bounds.min_ms <= bounds.max_ms,
        "{bounds:?}"
    );
    assert!(renewal.resolved >= renewal.requested);
    assert_eq!(renewal.resolved.as_millis() as u64 % bounds.step_ms, 0);
    let now = sandcove::now_millis();
    let ends = renewal.info.ends_at;
    assert!(
        ends <= now + renewal.resolved.as_millis() as u64 && ends + 60_000 > now + 120_500,
        "the lease ends about {} ms from now, not {} ms",
        renewal.resolved.as_millis(),
        ends.saturating_sub(now)
    );
    sandbox.destroy().await.expect("destroy");
}

/// A failing process is data (`Ok` with its status); `expect_success` turns it into an error
/// that keeps the output; a signal death names the signal.
pub async fn exits_are_data_and_checked_runs_keep_the_output(client: sandcove::Client) {
    let sandbox = client
        .create(test_options(&unique("exits")))
        .await
        .expect("create");
    let out = sandbox
        .run("echo out; echo err >&2; exit 3")
        .await
        .expect("a failing process is still Ok");
    assert_eq!(out.exit_code(), 3);
    match sandbox
        .run("echo out; echo err >&2; exit 3")
        .expect_success()
        .await
    {
        Err(sandcove::RunError::Failed(out)) => {
            assert_eq!(out.stdout, b"out\n");
            assert_eq!(out.stderr, b"err\n");
            assert_eq!(out.exit_code(), 3);
        }
        other => panic!("exit 3, checked: {other:?}"),
    }
    let err = sandbox
        .run("echo before; kill -KILL $$")
        .expect_success()
        .await
        .expect_err("a signal death fails the check");
    let out = err.output().expect("the output is kept");
    assert_eq!(out.stdout, b"before\n");
    assert_eq!(out.exit_status().signal_name(), Some("SIGKILL"));
    assert!(err.to_string().contains("SIGKILL"), "{err}");
    let ok = sandbox
        .run("echo fine")
        .expect_success()
        .await
        .expect("success passes the check");
    assert_eq!(ok.stdout, b"fine\n");
    sandbox.destroy().await.expect("destroy");
}

/// A fork's envs are added over its source's: the source's stay, the fork's win.
pub async fn fork_adds_envs_over_the_sources(client: sandcove::Client) {
    let options = test_options(&unique("fork-envs"))
        .env("FROM_SOURCE", "s")
        .env("SHARED", "source");
    let source = client.create(options).await.expect("create");
    let fork_options = test_options(&unique("fork-envs-child"))
        .env("SHARED", "fork")
        .env("FROM_FORK", "f");
    if !client.capabilities().snapshots {
        expect_code(
            source.fork(fork_options).await.map(|s| s.id().to_string()),
            ErrorCode::NotSupported,
            "fork",
        );
        source.destroy().await.expect("destroy");
        return;
    }
    let (fork, info) = source.fork_described(fork_options).await.expect("fork");
    let expected: BTreeMap<String, String> =
        [("FROM_FORK", "f"), ("FROM_SOURCE", "s"), ("SHARED", "fork")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
    for key in expected.keys() {
        assert_eq!(
            info.envs.get(key),
            expected.get(key),
            "{key} in {:?}",
            info.envs
        );
    }
    let out = fork
        .run("echo \"$FROM_SOURCE,$SHARED,$FROM_FORK\"")
        .await
        .expect("run");
    assert_eq!(out.stdout_lossy(), "s,fork,f\n");
    fork.destroy().await.expect("destroy");
    source.destroy().await.expect("destroy");
}
