//! Annotations: setting, reading, bounds and concurrent updates.

use super::*;

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Annotations given at create are reported by get and list; an update sets and removes
/// keys at once and answers the new map.
pub async fn annotations_set_get_remove(backend: &dyn Backend) {
    let label = unique("annot");
    let mut options = test_options(&label);
    options.annotations = map(&[("vendor/a", "1"), ("vendor/b", "two")]);
    let info = backend.create(options).await.expect("create");
    assert_eq!(
        info.annotations,
        map(&[("vendor/a", "1"), ("vendor/b", "two")])
    );
    let id = info.id;
    let mut update = AnnotationUpdate::set("vendor/c", "{\"json\": [1, 2]}");
    update.remove.push("vendor/a".into());
    update.remove.push("vendor/absent".into());
    let now = backend
        .update_annotations(&id, update)
        .await
        .expect("update");
    let want = map(&[("vendor/b", "two"), ("vendor/c", "{\"json\": [1, 2]}")]);
    assert_eq!(now, want);
    assert_eq!(backend.get(&id).await.expect("get").annotations, want);
    let listed = backend
        .list({
            let mut options = ListOptions::default();
            options.labels = BTreeMap::from([("conformance".to_string(), label)]);
            options
        })
        .await
        .expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].annotations, want);
    // An expectation that holds applies; one that does not changes nothing.
    let cas = AnnotationUpdate::set("vendor/b", "three").expecting("vendor/b", Some("two".into()));
    assert_eq!(
        backend
            .update_annotations(&id, cas)
            .await
            .expect("cas")
            .get("vendor/b")
            .map(String::as_str),
        Some("three")
    );
    let stale = AnnotationUpdate::set("vendor/b", "four").expecting("vendor/b", Some("two".into()));
    expect_code(
        backend.update_annotations(&id, stale).await,
        ErrorCode::Conflict,
        "a compare-and-set on a stale value",
    );
    let absent = AnnotationUpdate::set("vendor/b", "five").expecting("vendor/b", None);
    expect_code(
        backend.update_annotations(&id, absent).await,
        ErrorCode::Conflict,
        "an expected-absent key that exists",
    );
    assert_eq!(
        backend
            .get(&id)
            .await
            .expect("get")
            .annotations
            .get("vendor/b")
            .map(String::as_str),
        Some("three")
    );
    backend.destroy(&id).await.expect("destroy");
    expect_code(
        backend
            .update_annotations(&id, AnnotationUpdate::set("k", "v"))
            .await,
        ErrorCode::NotFound,
        "annotations of a destroyed sandbox",
    );
}

/// Annotations are read and changed while the sandbox is paused (where pausing is
/// supported) and while it is stopped, without resuming or starting it.
pub async fn annotations_readable_while_paused_or_stopped(backend: &dyn Backend) {
    let mut options = test_options(&unique("annotpause"));
    options.annotations = map(&[("k", "v")]);
    let id = backend.create(options).await.expect("create").id;
    if backend.capabilities().pause {
        backend.pause(&id).await.expect("pause");
        let info = backend.get(&id).await.expect("get");
        assert_eq!(info.annotations, map(&[("k", "v")]));
        let now = backend
            .update_annotations(&id, AnnotationUpdate::set("paused", "yes"))
            .await
            .expect("update while paused");
        assert_eq!(now, map(&[("k", "v"), ("paused", "yes")]));
        assert_eq!(
            backend.get(&id).await.expect("get").state,
            SandboxState::Paused,
            "an annotation update does not resume"
        );
        backend.resume(&id).await.expect("resume");
    }
    backend.stop(&id).await.expect("stop");
    backend
        .update_annotations(&id, AnnotationUpdate::set("stopped", "yes"))
        .await
        .expect("update while stopped");
    let info = backend.get(&id).await.expect("get");
    assert_eq!(
        info.state,
        SandboxState::Stopped,
        "an update does not start"
    );
    assert_eq!(
        info.annotations.get("stopped").map(String::as_str),
        Some("yes")
    );
    assert_eq!(info.annotations.get("k").map(String::as_str), Some("v"));
    backend.destroy(&id).await.expect("destroy");
}

/// Nothing inside the sandbox holds or reaches the annotations: their values appear in no
/// file sandboxed code can read, and code that rewrites and deletes files everywhere it can
/// write leaves them as they were.
pub async fn annotations_are_out_of_reach_of_sandboxed_code(backend: &dyn Backend) {
    let secret = unique("annotvalue");
    let mut options = test_options(&unique("annotreach"));
    options.annotations = map(&[("record", &secret)]);
    let id = backend.create(options).await.expect("create").id;
    backend
        .update_annotations(&id, AnnotationUpdate::set("later", &secret))
        .await
        .expect("update");
    if backend.capabilities().isolated {
        // Every writable place: clobber, then delete, everything there.
        let vandal = "for d in / /tmp /var/tmp /dev/shm /run \"$HOME\" /workspace; do \
                        find \"$d\" -xdev -type f -writable 2>/dev/null | \
                          while read -r f; do printf garbage > \"$f\"; done; \
                        printf garbage > \"$d/.sandcove-annotations.json\" 2>/dev/null; \
                      done; \
                      rm -rf /tmp/* /tmp/.[!.]* /workspace/* /workspace/.[!.]* 2>/dev/null; true";
        sh(backend, &id, vandal).await;
        // The sandbox's own filesystems (not the read-only host directories bound in).
        let found = sh(
            backend,
            &id,
            &format!(
                "for d in / /tmp /var/tmp /dev/shm /run \"$HOME\" /workspace; do \
                   find \"$d\" -xdev -type f -readable -exec grep -lsF -- '{secret}' {{}} + ; \
                 done 2>/dev/null | head -5; true"
            ),
        )
        .await;
        assert_eq!(
            found.stdout_lossy().trim(),
            "",
            "an annotation value is readable inside the sandbox"
        );
    } else {
        // Un-isolated sandbox processes share the host's files: no vandalism here.
        println!("annotations_are_out_of_reach_of_sandboxed_code: un-isolated backend, in-sandbox part skipped");
    }
    assert_eq!(
        backend.get(&id).await.expect("get").annotations,
        map(&[("later", &secret), ("record", &secret)])
    );
    backend.destroy(&id).await.expect("destroy");
}

/// A fork starts with a copy of its source's annotations, the fork's own on top; later
/// changes to either do not reach the other.
pub async fn fork_copies_annotations(backend: &dyn Backend) {
    let mut options = test_options(&unique("annotfork"));
    options.annotations = map(&[("a", "1"), ("b", "2")]);
    let id = backend.create(options).await.expect("create").id;
    let mut fork_options = test_options(&unique("annotforked"));
    fork_options.annotations = map(&[("b", "3"), ("c", "4")]);
    if !backend.capabilities().snapshots {
        expect_code(
            backend.fork(&id, fork_options).await,
            ErrorCode::NotSupported,
            "fork",
        );
        backend.destroy(&id).await.expect("destroy");
        return;
    }
    let forked = backend.fork(&id, fork_options).await.expect("fork");
    let want = map(&[("a", "1"), ("b", "3"), ("c", "4")]);
    assert_eq!(forked.annotations, want, "what fork answers");
    assert_eq!(
        backend.get(&forked.id).await.expect("get").annotations,
        want
    );
    backend
        .update_annotations(&id, AnnotationUpdate::set("a", "changed"))
        .await
        .expect("update source");
    assert_eq!(
        backend.get(&forked.id).await.expect("get").annotations,
        want,
        "a copy, not a link"
    );
    // A fork whose own annotations would overflow the bounds is refused before it is made.
    let mut too_many = test_options(&unique("annotforkbad"));
    too_many.annotations = (0..sandcove::MAX_ANNOTATIONS - 1)
        .map(|i| (format!("k{i}"), String::new()))
        .collect();
    expect_code(
        backend.fork(&id, too_many).await,
        ErrorCode::InvalidArgument,
        "a fork over the annotation count",
    );
    for sandbox in [&id, &forked.id] {
        backend.destroy(sandbox).await.expect("destroy");
    }
}

/// Out-of-bounds annotations are `InvalidArgument`: at create nothing is made, on update
/// nothing changes.
pub async fn annotation_bounds_are_refused_with_nothing_changed(backend: &dyn Backend) {
    let big = "x".repeat(sandcove::MAX_ANNOTATION_VALUE + 1);
    let long_key = "k".repeat(sandcove::MAX_ANNOTATION_KEY + 1);
    let many: BTreeMap<String, String> = (0..=sandcove::MAX_ANNOTATIONS)
        .map(|i| (format!("k{i}"), String::new()))
        .collect();
    let bulky: BTreeMap<String, String> =
        (0..sandcove::MAX_ANNOTATIONS_BYTES / sandcove::MAX_ANNOTATION_VALUE + 1)
            .map(|i| (format!("k{i}"), "y".repeat(sandcove::MAX_ANNOTATION_VALUE)))
            .collect();
    let bad_maps: Vec<(&str, BTreeMap<String, String>)> = vec![
        ("an empty key", map(&[("", "v")])),
        ("a key with a space", map(&[("a b", "v")])),
        ("a key with a NUL", map(&[("a\0b", "v")])),
        ("a non-ASCII key", map(&[("clé", "v")])),
        (
            "a key too long",
            BTreeMap::from([(long_key.clone(), "v".to_string())]),
        ),
        (
            "a value too large",
            BTreeMap::from([("k".to_string(), big.clone())]),
        ),
        ("a value with a NUL", map(&[("k", "a\0b")])),
        ("too many keys", many.clone()),
        ("too many bytes", bulky.clone()),
    ];
    let label = unique("annotbounds");
    for (what, annotations) in &bad_maps {
        let mut options = test_options(&label);
        options.annotations = annotations.clone();
        expect_code(
            backend.create(options).await,
            ErrorCode::InvalidArgument,
            &format!("create with {what}"),
        );
    }
    assert!(
        ids_labelled(backend, &label).await.is_empty(),
        "a refused create makes nothing"
    );
    let mut options = test_options(&label);
    options.annotations = map(&[("keep", "me")]);
    let id = backend.create(options).await.expect("create").id;
    for (what, annotations) in &bad_maps {
        let mut update = AnnotationUpdate::default();
        update.set = annotations.clone();
        expect_code(
            backend.update_annotations(&id, update).await,
            ErrorCode::InvalidArgument,
            &format!("update with {what}"),
        );
    }
    expect_code(
        backend
            .update_annotations(&id, AnnotationUpdate::remove("bad key"))
            .await,
        ErrorCode::InvalidArgument,
        "removing a malformed key",
    );
    // Bounds hold on the result too: keys that are fine one by one, too many together.
    let half: BTreeMap<String, String> = (0..sandcove::MAX_ANNOTATIONS / 2 + 1)
        .map(|i| (format!("k{i}"), String::new()))
        .collect();
    backend
        .update_annotations(&id, {
            let mut options = AnnotationUpdate::default();
            options.set = half;
            options
        })
        .await
        .expect("half the allowed keys");
    let other_half: BTreeMap<String, String> = (0..sandcove::MAX_ANNOTATIONS / 2 + 1)
        .map(|i| (format!("j{i}"), String::new()))
        .collect();
    expect_code(
        backend
            .update_annotations(&id, {
                let mut options = AnnotationUpdate::default();
                options.set = other_half;
                options
            })
            .await,
        ErrorCode::InvalidArgument,
        "an update overflowing the count",
    );
    let after = backend.get(&id).await.expect("get").annotations;
    assert_eq!(after.get("keep").map(String::as_str), Some("me"));
    assert_eq!(
        after.len(),
        sandcove::MAX_ANNOTATIONS / 2 + 2,
        "the refused update changed nothing"
    );
    backend.destroy(&id).await.expect("destroy");
}

/// Programs updating one record with compare-and-set never lose each other's writes: each
/// increments a shared counter several times (re-reading and retrying on `Conflict`) and the
/// counter ends at the total.
pub async fn concurrent_annotation_updates_lose_nothing(backend: &dyn Backend) {
    const WRITERS: usize = 6;
    const EACH: usize = 5;
    let id = create(backend, &unique("annotcas")).await;
    let mut conflicts = 0usize;
    let writers = (0..WRITERS).map(|w| {
        let id = id.clone();
        async move {
            let mut conflicts = 0usize;
            for _ in 0..EACH {
                loop {
                    let current = backend.get(&id).await.expect("get").annotations;
                    let old = current.get("counter").cloned();
                    let n: usize = old.as_deref().map_or(0, |v| v.parse().expect("a number"));
                    let mut update = AnnotationUpdate::set("counter", (n + 1).to_string())
                        .expecting("counter", old);
                    update
                        .set
                        .insert(format!("writer/{w}"), (n + 1).to_string());
                    match backend.update_annotations(&id, update).await {
                        Ok(_) => break,
                        Err(e) if e.code() == ErrorCode::Conflict => conflicts += 1,
                        Err(e) => panic!("update: {e}"),
                    }
                }
            }
            conflicts
        }
    });
    for c in futures::future::join_all(writers).await {
        conflicts += c;
    }
    let annotations = backend.get(&id).await.expect("get").annotations;
    assert_eq!(
        annotations.get("counter").map(String::as_str),
        Some((WRITERS * EACH).to_string().as_str()),
        "no increment lost ({conflicts} conflicts retried)"
    );
    for w in 0..WRITERS {
        assert!(
            annotations.contains_key(&format!("writer/{w}")),
            "writer {w}"
        );
    }
    backend.destroy(&id).await.expect("destroy");
}
