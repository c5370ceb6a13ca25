//! Creating, finding, naming, leasing and destroying sandboxes.

use super::*;
use sandcove::{SetLabelsOptions, SetTimeoutOptions};

/// Create reports what was asked; get and list find it; destroy makes it gone everywhere.
pub async fn create_get_list_destroy(backend: &dyn Backend) {
    let label = unique("lifecycle");
    let mut options = test_options(&label);
    options.envs.insert("GREETING".into(), "hi".into());
    let info = backend.create(options).await.expect("create");
    assert_eq!(info.state, sandcove::SandboxState::Running);
    assert_eq!(info.labels.get("conformance"), Some(&label));
    assert!(
        info.ends_at > info.created_at,
        "the lease ends after creation"
    );
    let got = backend.get(&info.id).await.expect("get");
    assert_eq!(got.id, info.id);
    assert_eq!(got.envs.get("GREETING").map(String::as_str), Some("hi"));
    let mut filter = ListOptions::default();
    filter.labels = BTreeMap::from([("conformance".to_string(), label.clone())]);
    filter.states = vec![];
    filter.name = None;
    let listed = backend.list(filter.clone()).await.expect("list");
    assert_eq!(listed.iter().map(|i| &i.id).collect::<Vec<_>>(), [&info.id]);
    // Labels can be replaced, and list filters see the new ones.
    let mut relabeled = BTreeMap::from([("conformance".to_string(), label.clone())]);
    relabeled.insert("stage".into(), "two".into());
    let updated = backend
        .set_labels(&info.id, SetLabelsOptions::new(relabeled.clone()))
        .await
        .expect("set labels");
    assert_eq!(updated.labels, relabeled);
    let mut by_new = filter.clone();
    by_new.labels.insert("stage".into(), "two".into());
    assert_eq!(backend.list(by_new).await.expect("list").len(), 1);
    assert_eq!(backend.get(&info.id).await.expect("get").labels, relabeled);
    expect_code(
        backend
            .set_labels(
                &info.id,
                SetLabelsOptions::new(BTreeMap::from([(String::new(), "x".to_string())])),
            )
            .await,
        ErrorCode::InvalidArgument,
        "an empty label key",
    );
    let mut other = ListOptions::default();
    other.labels = BTreeMap::from([("conformance".to_string(), "no-such-label".to_string())]);
    other.states = vec![];
    other.name = None;
    assert!(backend
        .list(other)
        .await
        .expect("list")
        .iter()
        .all(|i| i.id != info.id));
    backend.destroy(&info.id).await.expect("destroy");
    expect_code(
        backend.get(&info.id).await,
        ErrorCode::NotFound,
        "get after destroy",
    );
    assert!(backend.list(filter).await.expect("list").is_empty());
    expect_code(
        backend.destroy(&info.id).await,
        ErrorCode::NotFound,
        "destroy twice",
    );
}

/// Options for a sandbox named `name`, labelled `label`.
fn named(label: &str, name: &str) -> CreateOptions {
    let mut options = test_options(label);
    options.name = Some(name.to_string());
    options
}

/// A name is unique among live sandboxes: a taken name is `AlreadyExists` and creates
/// nothing, a sandbox is found by name, a fork does not inherit its source's name, and the
/// name is free again once its sandbox is destroyed.
pub async fn unique_names(backend: &dyn Backend) {
    let label = unique("names");
    let name = unique("n");
    for bad in [
        "",
        "-lead",
        ".hidden",
        "a/b",
        "sp ace",
        "nul\0",
        &"x".repeat(64),
    ] {
        expect_code(
            backend.create(named(&label, bad)).await,
            ErrorCode::InvalidArgument,
            &format!("the name {bad:?}"),
        );
    }
    assert!(
        ids_labelled(backend, &label).await.is_empty(),
        "a refused name creates nothing"
    );
    let first = backend
        .create(named(&label, &name))
        .await
        .expect("create with a name");
    assert_eq!(first.name.as_deref(), Some(name.as_str()));
    assert_eq!(
        backend.get(&first.id).await.expect("get").name.as_deref(),
        Some(name.as_str())
    );
    expect_code(
        backend.create(named(&label, &name)).await,
        ErrorCode::AlreadyExists,
        "a second create with a live sandbox's name",
    );
    assert_eq!(
        ids_labelled(backend, &label).await,
        std::slice::from_ref(&first.id),
        "the refused create made no sandbox"
    );
    // Get by name: the list filter answers that one sandbox, whatever other filters say.
    let by_name = |n: &str| {
        let mut options = ListOptions::default();
        options.name = Some(n.to_string());
        options
    };
    let found = backend.list(by_name(&name)).await.expect("list by name");
    assert_eq!(found.iter().map(|i| &i.id).collect::<Vec<_>>(), [&first.id]);
    assert!(backend
        .list(by_name(&unique("n")))
        .await
        .expect("list by a free name")
        .is_empty());
    // Names are case-sensitive: another case is another name.
    let upper = name.to_uppercase();
    let other = backend
        .create(named(&label, &upper))
        .await
        .expect("create with the name in upper case");
    assert_eq!(other.name.as_deref(), Some(upper.as_str()));
    let mut forked = None;
    if backend.capabilities().snapshots {
        expect_code(
            backend.fork(&first.id, named(&label, &name)).await,
            ErrorCode::AlreadyExists,
            "a fork taking its source's name",
        );
        let fork = backend
            .fork(&first.id, test_options(&label))
            .await
            .expect("fork");
        assert_eq!(fork.name, None, "a fork does not inherit the name");
        forked = Some(fork.id);
    }
    backend.destroy(&first.id).await.expect("destroy");
    assert!(backend
        .list(by_name(&name))
        .await
        .expect("list by name")
        .is_empty());
    let again = backend
        .create(named(&label, &name))
        .await
        .expect("the name is free once its sandbox is destroyed");
    assert_eq!(again.name.as_deref(), Some(name.as_str()));
    assert_ne!(again.id, first.id);
    for id in [again.id, other.id].into_iter().chain(forked) {
        backend.destroy(&id).await.expect("destroy");
    }
}

/// Creates racing for one name: exactly one wins, the others are `AlreadyExists` and
/// create nothing.
pub async fn concurrent_creates_with_one_name(backend: &dyn Backend) {
    const RACERS: usize = 8;
    let label = unique("race");
    let name = unique("n");
    let results =
        futures::future::join_all((0..RACERS).map(|_| backend.create(named(&label, &name)))).await;
    let mut winners = Vec::new();
    for result in results {
        match result {
            Ok(info) => winners.push(info.id),
            Err(e) if e.code() == ErrorCode::AlreadyExists => {}
            Err(e) => panic!("a racing create failed otherwise: {e}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one create wins: {winners:?}");
    assert_eq!(
        ids_labelled(backend, &label).await,
        winners,
        "the losers created nothing"
    );
    backend.destroy(&winners[0]).await.expect("destroy");
}

/// Unknown and malformed ids are `NotFound` for every call.
pub async fn missing_sandbox_is_not_found(backend: &dyn Backend) {
    for id in ["nosuchsandbox0000000", "../etc", "", "UPPER"] {
        expect_code(backend.get(id).await, ErrorCode::NotFound, "get");
        expect_code(backend.destroy(id).await, ErrorCode::NotFound, "destroy");
        expect_code(
            backend
                .spawn(id, ProcessSpec::new(Command::argv(["true"])))
                .await
                .map(|_| ()),
            ErrorCode::NotFound,
            "spawn",
        );
        expect_code(
            backend.stat(id, "/", Default::default()).await,
            ErrorCode::NotFound,
            "stat",
        );
    }
}

/// `set_timeout` moves the end of the lease to "now + timeout".
pub async fn set_timeout_moves_the_lease(backend: &dyn Backend) {
    let id = create(backend, &unique("lease")).await;
    let before = sandcove::now_millis();
    let info = backend
        .set_timeout(&id, SetTimeoutOptions::new(Duration::from_secs(600)))
        .await
        .expect("set_timeout");
    assert!(
        info.ends_at >= before + 599_000 && info.ends_at <= sandcove::now_millis() + 601_000,
        "ends_at {} not ~600s from now",
        info.ends_at
    );
    assert_eq!(backend.get(&id).await.expect("get").ends_at, info.ends_at);
    expect_code(
        backend
            .set_timeout(
                &id,
                SetTimeoutOptions::new(Duration::from_secs(10 * 365 * 24 * 3600)),
            )
            .await,
        ErrorCode::InvalidArgument,
        "absurd timeout",
    );
    backend.destroy(&id).await.expect("destroy");
}

/// At the end of its lease a sandbox is gone: not found, its processes ended on the host.
pub async fn lease_end_destroys_the_sandbox(backend: &dyn Backend) {
    let id = create(backend, &unique("expire")).await;
    let marker = unique("expiring");
    let spec = ProcessSpec::new(Command::bash_login(format!("exec -a {marker} sleep 600")));
    let _stream = backend.spawn(&id, spec).await.expect("spawn");
    let marker = &marker;
    eventually(PATIENCE, "the sleeping process runs", || async move {
        equals(host_process_count(marker), 1)
    })
    .await;
    // Shorten the lease only now: however slow the machine, the process was seen first.
    backend
        .set_timeout(&id, SetTimeoutOptions::new(Duration::from_secs(1)))
        .await
        .expect("set_timeout");
    // The lease is what is tested here: wait for its end, then for the sandbox to be gone.
    let err = eventually(PATIENCE, "the sandbox ends with its lease", || async {
        match backend.get(&id).await {
            Ok(info) => Err(format!("still {:?}", info.state)),
            Err(e) => Ok(e),
        }
    })
    .await;
    assert!(err.is_not_found(), "not found after its lease: {err}");
    eventually(
        PATIENCE,
        "no process of the expired sandbox is left on the host",
        || async move { equals(host_process_count(marker), 0) },
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// Processes
// ---------------------------------------------------------------------------------------------
