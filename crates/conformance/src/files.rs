//! Files: reads and writes, metadata, bounds, renames and copies, directories, typed errors, and the file API's confinement.

use super::*;
use sandcove::ChmodOptions;

/// File calls as a user get that user's permissions and ownership; an unknown user is refused
/// before anything happens; where the sandbox has one uid, other users are `NotSupported`.
pub async fn file_calls_as_a_user(backend: &dyn Backend) {
    let id = create(backend, &unique("fileuser")).await;
    let info = backend.get(&id).await.expect("get");
    let me = info.user.name.clone();
    let read_as = |path: &'static str, user: &str| {
        let mut options = ReadOptions::default();
        options.user = Some(user.to_string());
        let id = id.clone();
        async move {
            let stream = backend.read_file(&id, path, options).await?;
            let chunks: Vec<_> = stream.collect().await;
            chunks
                .into_iter()
                .collect::<sandcove::Result<Vec<_>>>()
                .map(|c| c.concat())
        }
    };
    let write_as = |path: &'static str, data: &'static [u8], user: &str, mode: Option<u32>| {
        let mut options = WriteOptions::default();
        options.user = Some(user.to_string());
        options.mode = mode;
        let id = id.clone();
        async move {
            let body: ByteStream = Box::pin(futures::stream::iter([Ok(data.to_vec())]));
            backend.write_file(&id, path, body, options).await
        }
    };
    let list_as = |path: &'static str, user: &str| {
        let mut options = ListDirOptions::default();
        options.depth = 1;
        options.user = Some(user.to_string());
        let id = id.clone();
        async move { backend.list_dir(&id, path, options).await }
    };
    let stat_as = |path: &'static str, user: &str| {
        let mut options = StatOptions::default();
        options.user = Some(user.to_string());
        let id = id.clone();
        async move { backend.stat(&id, path, options).await }
    };
    // Unknown users: refused before any effect.
    let result = write_as("/workspace/ghost.txt", b"x", "nosuchuser", None).await;
    assert!(
        matches!(&result, Err(e) if matches!(e.code(), ErrorCode::InvalidArgument | ErrorCode::NotSupported)),
        "unknown user: {result:?}"
    );
    expect_code(
        backend
            .stat(&id, "/workspace/ghost.txt", StatOptions::default())
            .await,
        ErrorCode::NotFound,
        "nothing written for an unknown user",
    );
    // The default user by name works everywhere.
    let st = write_as("/workspace/mine.txt", b"mine", &me, None)
        .await
        .expect("write as the default user");
    assert_eq!((st.uid, st.owner.as_str()), (info.user.uid, me.as_str()));
    assert_eq!(
        read_as("/workspace/mine.txt", &me).await.expect("read"),
        b"mine"
    );
    assert_eq!(
        stat_as("/workspace/mine.txt", &me).await.expect("stat").uid,
        info.user.uid
    );
    list_as("/workspace", &me).await.expect("list");
    if !backend.capabilities().multiple_users {
        expect_code(
            read_as("/workspace/mine.txt", "root").await,
            ErrorCode::NotSupported,
            "a second user without multiple uids",
        );
        backend.destroy(&id).await.expect("destroy");
        return;
    }
    assert_ne!(info.user.uid, 0, "the default user is not root here");
    // A root-only file.
    let st = write_as("/workspace/secret", b"s3cret", "root", Some(0o600))
        .await
        .expect("write as root");
    assert_eq!((st.uid, st.mode), (0, 0o600), "owned by root: {st:?}");
    expect_code(
        read_as("/workspace/secret", &me).await,
        ErrorCode::PermissionDenied,
        "reading a root-only file as the user",
    );
    assert_eq!(
        read_as("/workspace/secret", "root")
            .await
            .expect("root reads"),
        b"s3cret"
    );
    // The user's identity never outlives its call: calls without a user, interleaved, keep
    // the file API's own identity.
    for round in 0..8 {
        expect_code(
            read_as("/workspace/secret", &me).await,
            ErrorCode::PermissionDenied,
            "as the user, again",
        );
        let stream = backend
            .read_file(&id, "/workspace/secret", ReadOptions::default())
            .await
            .unwrap_or_else(|e| panic!("round {round}: a call without a user failed: {e}"));
        let got: Vec<_> = stream.collect().await;
        assert!(
            matches!(got.as_slice(), [Ok(b)] if b == b"s3cret"),
            "round {round}: {got:?}"
        );
    }
    // Replacing it as the user is refused too, and leaves it as it was.
    expect_code(
        write_as("/workspace/secret", b"mine now", &me, None).await,
        ErrorCode::PermissionDenied,
        "overwriting a root-only file as the user",
    );
    assert_eq!(
        read_as("/workspace/secret", "root")
            .await
            .expect("root reads"),
        b"s3cret"
    );
    // A directory only root may enter.
    let mut dir = MkdirOptions::default();
    dir.parents = true;
    dir.mode = Some(0o700);
    dir.user = Some("root".into());
    backend
        .mkdir(&id, "/workspace/private", dir)
        .await
        .expect("mkdir as root");
    write_as("/workspace/private/inner.txt", b"in", "root", None)
        .await
        .expect("write inside as root");
    expect_code(
        list_as("/workspace/private", &me).await,
        ErrorCode::PermissionDenied,
        "listing a 0700 root directory as the user",
    );
    expect_code(
        stat_as("/workspace/private/inner.txt", &me).await,
        ErrorCode::PermissionDenied,
        "stat beneath a 0700 root directory as the user",
    );
    expect_code(
        write_as("/workspace/private/new.txt", b"n", &me, None).await,
        ErrorCode::PermissionDenied,
        "creating a file in a 0700 root directory as the user",
    );
    let names: Vec<_> = list_as("/workspace/private", "root")
        .await
        .expect("root lists")
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, ["inner.txt"], "nothing created by the refused write");
    // What the user creates is the user's, parents included.
    let st = write_as("/workspace/made/by/me.txt", b"x", &me, None)
        .await
        .expect("write with parents as the user");
    assert_eq!(st.uid, info.user.uid);
    let parent = backend
        .stat(&id, "/workspace/made/by", StatOptions::default())
        .await
        .expect("stat parent");
    assert_eq!(
        parent.uid, info.user.uid,
        "created parents belong to the user"
    );
    // Directories too: made as the user (the kernel checks the user's permissions), so none
    // appears where the user may not write, and the ones made are the user's.
    let mkdir_as = |path: &'static str, user: &str| {
        let mut options = MkdirOptions::default();
        options.user = Some(user.to_string());
        let id = id.clone();
        async move { backend.mkdir(&id, path, options).await }
    };
    expect_code(
        mkdir_as("/workspace/private/sub", &me).await,
        ErrorCode::PermissionDenied,
        "mkdir in a 0700 root directory as the user",
    );
    expect_code(
        mkdir_as("/workspace/private/a/b", &me).await,
        ErrorCode::PermissionDenied,
        "mkdir with parents in a 0700 root directory as the user",
    );
    let names: Vec<_> = list_as("/workspace/private", "root")
        .await
        .expect("root lists")
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(
        names,
        ["inner.txt"],
        "nothing created by the refused mkdirs"
    );
    let st = mkdir_as("/workspace/mydir/nested", &me)
        .await
        .expect("mkdir with parents as the user");
    assert_eq!((st.uid, st.owner.as_str()), (info.user.uid, me.as_str()));
    let parent = backend
        .stat(&id, "/workspace/mydir", StatOptions::default())
        .await
        .expect("stat the made parent");
    assert_eq!(parent.uid, info.user.uid, "made parents are the user's");
    // Removing as the user: refused where the user may not write, allowed in its own places.
    let remove_as = |path: &'static str, user: &str| {
        let mut options = RemoveOptions::default();
        options.recursive = true;
        options.user = Some(user.to_string());
        let id = id.clone();
        async move { backend.remove(&id, path, options).await }
    };
    expect_code(
        remove_as("/workspace/private/inner.txt", &me).await,
        ErrorCode::PermissionDenied,
        "removing from a 0700 root directory as the user",
    );
    backend
        .stat(&id, "/workspace/private/inner.txt", StatOptions::default())
        .await
        .expect("the refused remove left the file");
    remove_as("/workspace/mydir", &me)
        .await
        .expect("remove the user's own tree as the user");
    expect_code(
        backend
            .stat(&id, "/workspace/mydir", StatOptions::default())
            .await,
        ErrorCode::NotFound,
        "the user's tree is gone",
    );
    // Watching as the user: a directory the user may not read is refused, not watched blind.
    if backend.capabilities().watch {
        let watch_as = |path: &'static str, user: &str| {
            let mut options = WatchOptions::default();
            options.recursive = false;
            options.user = Some(user.to_string());
            let id = id.clone();
            async move { backend.watch(&id, path, options).await.map(drop) }
        };
        expect_code(
            watch_as("/workspace/private", &me).await,
            ErrorCode::PermissionDenied,
            "watching a 0700 root directory as the user",
        );
        watch_as("/workspace/made", &me)
            .await
            .expect("watch the user's own directory as the user");
        watch_as("/workspace/private", "root")
            .await
            .expect("root watches it");
    }
    // The processes agree: the same file is unreadable to the user's processes.
    let out = sh(backend, &id, "cat /workspace/secret").await;
    assert!(
        !out.exit_status().success(),
        "a user process cannot read it either"
    );
    backend.destroy(&id).await.expect("destroy");
}

// ---------------------------------------------------------------------------------------------
// Files
// ---------------------------------------------------------------------------------------------

/// Bytes written come back identical; stat reports kind, size, mode and owner.
pub async fn file_round_trip_and_metadata(backend: &dyn Backend) {
    let id = create(backend, &unique("files")).await;
    let data: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
    write(backend, &id, "data/blob.bin", &data).await;
    assert_eq!(
        read(backend, &id, "data/blob.bin").await.expect("read"),
        data
    );
    assert_eq!(
        read(backend, &id, "/workspace/data/blob.bin")
            .await
            .expect("read"),
        data,
        "relative paths resolve against the home"
    );
    let stat = backend
        .stat(&id, "data/blob.bin", Default::default())
        .await
        .expect("stat");
    assert_eq!(stat.kind, FileKind::File);
    assert_eq!(stat.size, 100_000);
    assert_eq!(stat.path, "/workspace/data/blob.bin");
    assert_eq!(stat.name, "blob.bin");
    let info = backend.get(&id).await.expect("get");
    assert_eq!(
        stat.owner, info.user.name,
        "files belong to the default user"
    );
    // The sandbox's processes see the same bytes.
    let out = sh(
        backend,
        &id,
        "wc -c < data/blob.bin; od -An -tu1 -j255 -N2 data/blob.bin",
    )
    .await;
    assert_eq!(
        out.stdout_lossy().split_whitespace().collect::<Vec<_>>(),
        ["100000", "255", "0"]
    );
    // Append, empty files, and chmod.
    backend
        .write_file(&id, "data/blob.bin", bytes_stream(b"tail".to_vec()), {
            let mut options = WriteOptions::default();
            options.append = true;
            options
        })
        .await
        .expect("append");
    assert_eq!(
        backend
            .stat(&id, "data/blob.bin", Default::default())
            .await
            .expect("stat")
            .size,
        100_004
    );
    write(backend, &id, "empty", b"").await;
    assert!(read(backend, &id, "empty").await.expect("read").is_empty());
    let stat = backend
        .chmod(&id, "empty", ChmodOptions::new(0o640))
        .await
        .expect("chmod");
    assert_eq!(stat.mode, 0o640);
    assert_eq!(sh(backend, &id, "stat -c %a empty").await.stdout, b"640\n");
    // Symlinks are reported, not followed.
    sh(backend, &id, "ln -s data/blob.bin link").await;
    let stat = backend
        .stat(&id, "link", Default::default())
        .await
        .expect("stat link");
    assert_eq!(stat.kind, FileKind::Symlink);
    assert_eq!(stat.symlink_target.as_deref(), Some("data/blob.bin"));
    backend.destroy(&id).await.expect("destroy");
}

/// Extended attributes in the `user.` namespace: a write sets them (and reports them, read
/// back), stat and list return them when asked and only then, a rename keeps them, a write over
/// the file leaves exactly its own, an append adds to them, ones a process sets are returned
/// too (bytes as they are), and a user who may not read a file is not shown its attributes.
/// Names outside `user.` or past the bounds are refused with nothing written.
pub async fn file_attributes(backend: &dyn Backend) {
    let id = create(backend, &unique("xattrs")).await;
    let attrs = |pairs: &[(&str, &[u8])]| -> sandcove::FileAttributes {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_vec()))
            .collect()
    };
    let stat_attrs = |path: &'static str, user: Option<String>| {
        let id = id.clone();
        async move {
            let mut options = StatOptions::default().attributes(true);
            options.user = user;
            backend.stat(&id, path, options).await
        }
    };
    let written = backend
        .write_file(
            &id,
            "attrs/a.txt",
            bytes_stream(b"one".to_vec()),
            WriteOptions::default()
                .attribute("user.origin", "upload")
                .attribute("user.e2b.k", "v"),
        )
        .await
        .expect("a write with attributes");
    let both = attrs(&[("user.e2b.k", b"v"), ("user.origin", b"upload")]);
    assert_eq!(
        written.attributes.as_ref(),
        Some(&both),
        "reported by the write"
    );
    assert_eq!(
        read(backend, &id, "attrs/a.txt").await.expect("read"),
        b"one"
    );
    let plain = backend
        .stat(&id, "attrs/a.txt", StatOptions::default())
        .await
        .expect("stat");
    assert_eq!(plain.attributes, None, "not read unless asked for");
    let st = stat_attrs("attrs/a.txt", None).await.expect("stat");
    assert_eq!(st.attributes.as_ref(), Some(&both));
    // Processes see them, and what they set is returned too, bytes as they are.
    let out = sh(
        backend,
        &id,
        "python3 -c \"import os; print(os.getxattr('attrs/a.txt', 'user.origin').decode()); \
         os.setxattr('attrs/a.txt', 'user.bin', bytes([0, 255]))\"",
    )
    .await;
    assert_eq!(out.stdout_lossy().trim(), "upload", "{out:?}");
    let st = stat_attrs("attrs/a.txt", None).await.expect("stat");
    let three = attrs(&[
        ("user.bin", &[0, 255]),
        ("user.e2b.k", b"v"),
        ("user.origin", b"upload"),
    ]);
    assert_eq!(st.attributes.as_ref(), Some(&three), "set by a process");
    // A rename keeps them.
    backend
        .rename(&id, "attrs/a.txt", "attrs/b.txt", RenameOptions::default())
        .await
        .expect("rename");
    let st = stat_attrs("attrs/b.txt", None).await.expect("stat");
    assert_eq!(st.attributes.as_ref(), Some(&three), "kept by a rename");
    // A listing reports each entry's: a directory's own, none for a symlink.
    sh(backend, &id, "ln -s b.txt attrs/link && mkdir attrs/sub").await;
    let listed = backend
        .list_dir(&id, "attrs", ListDirOptions::default().attributes(true))
        .await
        .expect("list");
    let by_name: BTreeMap<_, _> = listed
        .iter()
        .map(|e| (e.name.as_str(), e.attributes.clone()))
        .collect();
    assert_eq!(
        by_name,
        BTreeMap::from([
            ("b.txt", Some(three.clone())),
            ("link", Some(BTreeMap::new())),
            ("sub", Some(BTreeMap::new())),
        ])
    );
    let listed = backend
        .list_dir(&id, "attrs", ListDirOptions::default())
        .await
        .expect("list");
    assert!(listed.iter().all(|e| e.attributes.is_none()), "{listed:?}");
    // A write over the file: exactly its own attributes, none of the old ones.
    let written = backend
        .write_file(
            &id,
            "attrs/b.txt",
            bytes_stream(b"two".to_vec()),
            WriteOptions::default().attribute("user.e2b.k", "w"),
        )
        .await
        .expect("overwrite");
    let only = attrs(&[("user.e2b.k", b"w")]);
    assert_eq!(written.attributes.as_ref(), Some(&only));
    assert_eq!(
        stat_attrs("attrs/b.txt", None)
            .await
            .expect("stat")
            .attributes,
        Some(only.clone())
    );
    write(backend, &id, "attrs/b.txt", b"three").await;
    assert_eq!(
        stat_attrs("attrs/b.txt", None)
            .await
            .expect("stat")
            .attributes,
        Some(BTreeMap::new()),
        "a write without attributes leaves none"
    );
    // An append adds to the file's attributes.
    backend
        .write_file(
            &id,
            "attrs/b.txt",
            bytes_stream(b"+".to_vec()),
            WriteOptions::default()
                .append(true)
                .attribute("user.e2b.k", "w"),
        )
        .await
        .expect("append with an attribute");
    assert_eq!(
        read(backend, &id, "attrs/b.txt").await.expect("read"),
        b"three+"
    );
    assert_eq!(
        stat_attrs("attrs/b.txt", None)
            .await
            .expect("stat")
            .attributes,
        Some(only)
    );
    // Refused before anything is written: another namespace, a bare prefix, too much.
    for options in [
        WriteOptions::default().attribute("trusted.k", "v"),
        WriteOptions::default().attribute("user.", "v"),
        WriteOptions::default().attribute(
            "user.big",
            vec![b'x'; sandcove::validate::MAX_FILE_ATTRIBUTE_BYTES],
        ),
    ] {
        expect_code(
            backend
                .write_file(
                    &id,
                    "attrs/refused.txt",
                    bytes_stream(b"x".to_vec()),
                    options,
                )
                .await,
            ErrorCode::InvalidArgument,
            "bad attributes",
        );
        expect_code(
            backend
                .stat(&id, "attrs/refused.txt", StatOptions::default())
                .await,
            ErrorCode::NotFound,
            "nothing written for bad attributes",
        );
    }
    // A user who may not read a file is not shown its attributes.
    if backend.capabilities().multiple_users {
        let me = backend.get(&id).await.expect("get").user.name;
        let mut options = WriteOptions::default()
            .attribute("user.k", "secret")
            .mode(0o600);
        options.user = Some("root".into());
        backend
            .write_file(&id, "attrs/root-only", bytes_stream(b"r".to_vec()), options)
            .await
            .expect("write as root");
        let mine = stat_attrs("attrs/root-only", Some(me))
            .await
            .expect("stat as the user");
        assert_eq!(mine.attributes, None, "unreadable to the user");
        let roots = stat_attrs("attrs/root-only", Some("root".into()))
            .await
            .expect("stat as root");
        assert_eq!(roots.attributes, Some(attrs(&[("user.k", b"secret")])));
    }
    backend.destroy(&id).await.expect("destroy");
}

/// A 50 MB file written in chunks reads back identical.
pub async fn large_file_round_trip(backend: &dyn Backend) {
    let id = create(backend, &unique("bigfile")).await;
    let size = 50 * 1024 * 1024;
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let data: Vec<u8> = (0..size)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    let chunks: Vec<sandcove::Result<Vec<u8>>> =
        data.chunks(3_000_001).map(|c| Ok(c.to_vec())).collect();
    let stream: ByteStream = Box::pin(futures::stream::iter(chunks));
    let stat = backend
        .write_file(&id, "/tmp/big.bin", stream, WriteOptions::default())
        .await
        .expect("write 50 MB");
    assert_eq!(stat.size, size as u64);
    let back = read(backend, &id, "/tmp/big.bin").await.expect("read");
    assert_eq!(back.len(), data.len());
    assert!(back == data, "50 MB read back identical");
    backend.destroy(&id).await.expect("destroy");
}

/// Byte bounds: a read over its `max_bytes` is `FileTooLarge` before any byte is sent, a
/// write over its bound is `FileTooLarge` with nothing kept (an existing file unchanged), and
/// the backend reports a real largest file.
pub async fn file_byte_bounds(backend: &dyn Backend) {
    let caps = backend.capabilities();
    assert!(
        caps.max_file_bytes < u64::MAX && caps.max_file_bytes >= sandcove::MAX_MEMORY_FILE_BYTES,
        "a real largest file is reported: {}",
        caps.max_file_bytes
    );
    let id = create(backend, &unique("bounds")).await;
    let two_mib = vec![b'z'; 2 << 20];
    write(backend, &id, "big.bin", &two_mib).await;
    let started = Instant::now();
    let refused = backend
        .read_file(&id, "big.bin", ReadOptions::default().max_bytes(1 << 20))
        .await;
    match refused {
        Err(sandcove::Error::FileTooLarge { limit, .. }) => assert_eq!(limit, 1 << 20),
        Err(e) => panic!("a read over its bound: expected FileTooLarge, got {e:?}"),
        Ok(_) => panic!("a read over its bound was served"),
    }
    assert!(started.elapsed() < PATIENCE, "refused promptly");
    let back = backend
        .read_file(&id, "big.bin", ReadOptions::default().max_bytes(2 << 20))
        .await
        .expect("a read at its bound");
    let chunks: Vec<_> = back.collect().await;
    let back: Vec<u8> = chunks
        .into_iter()
        .collect::<sandcove::Result<Vec<_>>>()
        .expect("read")
        .concat();
    assert!(back == two_mib, "a read at its bound is whole");
    // A write over its bound, in several chunks: refused, nothing kept.
    write(backend, &id, "kept.bin", b"original").await;
    for target in ["kept.bin", "new.bin"] {
        let chunks: Vec<sandcove::Result<Vec<u8>>> =
            (0..4).map(|_| Ok(vec![1u8; 400_000])).collect();
        let result = backend
            .write_file(
                &id,
                target,
                Box::pin(futures::stream::iter(chunks)),
                WriteOptions::default().max_bytes(1 << 20),
            )
            .await;
        expect_code(result, ErrorCode::FileTooLarge, "a write over its bound");
    }
    assert_eq!(
        names_in(backend, &id, "/workspace").await,
        ["big.bin", "kept.bin"],
        "nothing kept from refused writes"
    );
    assert_eq!(
        read(backend, &id, "kept.bin").await.expect("read"),
        b"original"
    );
    // At the bound exactly, a write lands.
    let stat = backend
        .write_file(
            &id,
            "exact.bin",
            bytes_stream(vec![2u8; 1 << 20]),
            WriteOptions::default().max_bytes(1 << 20),
        )
        .await
        .expect("a write at its bound");
    assert_eq!(stat.size, 1 << 20);
    backend.destroy(&id).await.expect("destroy");
}

/// `overwrite: false` on write, rename and copy: anything at the destination (a file, a
/// symlink) is refused with `AlreadyExists` and left as it was; concurrent no-clobber writes of
/// one new name have exactly one winner (the check is atomic, not a look before the act).
pub async fn no_clobber_writes_renames_and_copies(backend: &dyn Backend) {
    let id = create(backend, &unique("noclobber")).await;
    let keep = WriteOptions::default().overwrite(false);
    write(backend, &id, "a.txt", b"original").await;
    let result = backend
        .write_file(&id, "a.txt", bytes_stream(b"new".to_vec()), keep.clone())
        .await;
    expect_code(
        result,
        ErrorCode::AlreadyExists,
        "no-clobber write over a file",
    );
    let result = backend
        .write_file(
            &id,
            "a.txt",
            bytes_stream(b"new".to_vec()),
            keep.clone().append(true),
        )
        .await;
    expect_code(result, ErrorCode::AlreadyExists, "no-clobber append");
    assert_eq!(
        read(backend, &id, "a.txt").await.expect("read"),
        b"original"
    );
    // A symlink at the name is something there: not followed, not replaced.
    let out = sh(backend, &id, "ln -s /tmp/elsewhere \"$HOME/link\"").await;
    assert_eq!(out.exit_code(), 0, "{out:?}");
    let result = backend
        .write_file(&id, "link", bytes_stream(b"new".to_vec()), keep.clone())
        .await;
    expect_code(
        result,
        ErrorCode::AlreadyExists,
        "no-clobber write over a symlink",
    );
    expect_code(
        backend
            .stat(&id, "/tmp/elsewhere", StatOptions::default())
            .await,
        ErrorCode::NotFound,
        "the link's target was not created",
    );
    let stat = backend
        .write_file(
            &id,
            "fresh.txt",
            bytes_stream(b"fresh".to_vec()),
            keep.clone(),
        )
        .await
        .expect("no-clobber write of a new name");
    assert_eq!(stat.size, 5);
    // Eight no-clobber writes of one new name at once: exactly one lands (a look before
    // the landing would let several through).
    let racers = (0..8u8).map(|n| {
        // Paced chunks keep every upload open at once (the pauses shape the window in which
        // all eight have begun and none has landed; nothing waits on them).
        let chunks = futures::stream::iter(0..4).then(move |_| async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok(vec![n; 25_000])
        });
        backend.write_file(
            &id,
            "race.txt",
            Box::pin(chunks),
            WriteOptions::default().overwrite(false),
        )
    });
    let results = futures::future::join_all(racers).await;
    let won = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(won, 1, "exactly one no-clobber write wins: {results:?}");
    for r in results.iter().filter_map(|r| r.as_ref().err()) {
        assert_eq!(r.code(), ErrorCode::AlreadyExists, "the losers: {r}");
    }
    let data = read(backend, &id, "race.txt").await.expect("read");
    assert!(
        data.len() == 100_000 && data.iter().all(|b| *b == data[0]),
        "the winner's bytes, whole"
    );
    // Rename.
    write(backend, &id, "b.txt", b"bee").await;
    let result = backend
        .rename(
            &id,
            "b.txt",
            "a.txt",
            RenameOptions::default().overwrite(false),
        )
        .await;
    expect_code(result, ErrorCode::AlreadyExists, "no-clobber rename");
    assert_eq!(
        read(backend, &id, "a.txt").await.expect("read"),
        b"original"
    );
    assert_eq!(read(backend, &id, "b.txt").await.expect("read"), b"bee");
    backend
        .rename(
            &id,
            "b.txt",
            "c.txt",
            RenameOptions::default().overwrite(false),
        )
        .await
        .expect("no-clobber rename to a new name");
    // Copy.
    let result = backend
        .copy(
            &id,
            "c.txt",
            "a.txt",
            CopyOptions::default().overwrite(false),
        )
        .await;
    expect_code(result, ErrorCode::AlreadyExists, "no-clobber copy");
    assert_eq!(
        read(backend, &id, "a.txt").await.expect("read"),
        b"original"
    );
    backend
        .copy(&id, "c.txt", "a.txt", CopyOptions::default())
        .await
        .expect("an overwriting copy");
    assert_eq!(read(backend, &id, "a.txt").await.expect("read"), b"bee");
    assert_eq!(
        names_in(backend, &id, "/workspace").await,
        ["a.txt", "c.txt", "fresh.txt", "link", "race.txt"],
        "no temporary files left"
    );
    // A rename (and a copy) as a user acts as that user: a 0700 root directory is closed to
    // the default user, open to root.
    if backend.capabilities().multiple_users {
        let me = backend.get(&id).await.expect("get").user.name;
        let mut spec = ProcessSpec::new(Command::sh(
            "mkdir -p /srv/vault && touch /srv/vault/in && chmod 700 /srv/vault",
        ));
        spec.user = Some("root".into());
        let out = run(backend, &id, spec).await;
        assert_eq!(out.exit_code(), 0, "{out:?}");
        let as_me = RenameOptions::default().user(me.clone());
        expect_code(
            backend
                .rename(&id, "/srv/vault/in", "/tmp/out", as_me.clone())
                .await,
            ErrorCode::PermissionDenied,
            "a rename out of a root-only directory as the default user",
        );
        expect_code(
            backend
                .copy(
                    &id,
                    "/srv/vault/in",
                    "/tmp/out",
                    CopyOptions::default().user(me.clone()),
                )
                .await,
            ErrorCode::PermissionDenied,
            "a copy out of a root-only directory as the default user",
        );
        let st = backend
            .rename(
                &id,
                "/srv/vault/in",
                "/srv/vault/in2",
                RenameOptions::default().user("root"),
            )
            .await
            .expect("a rename as root");
        assert_eq!(st.path, "/srv/vault/in2");
    }
    backend.destroy(&id).await.expect("destroy");
}

/// `copy`: a file (content and mode), a tree (nested files, symlinks copied as links,
/// modes), refusals (a directory without `recursive`, a directory into itself, a missing
/// source) leaving nothing behind, and a copy as another user owned by that user.
pub async fn copy_files_and_trees(backend: &dyn Backend) {
    let id = create(backend, &unique("copy")).await;
    let setup = sh(
        backend,
        &id,
        "set -e; cd \"$HOME\"; mkdir -p src/deep/er; printf one > src/one.txt; \
         chmod 751 src/one.txt; printf two > src/deep/er/two.txt; chmod 700 src/deep; \
         ln -s ../one.txt src/deep/link; ln -s /etc/hostname src/abs; \
         head -c 3000000 /dev/urandom > src/big.bin",
    )
    .await;
    assert_eq!(setup.exit_code(), 0, "{setup:?}");
    let st = backend
        .copy(&id, "src/one.txt", "one-copy.txt", CopyOptions::default())
        .await
        .expect("copy a file");
    assert_eq!((st.kind, st.mode, st.size), (FileKind::File, 0o751, 3));
    assert_eq!(
        read(backend, &id, "one-copy.txt").await.expect("read"),
        b"one"
    );
    expect_code(
        backend
            .copy(&id, "src", "dst", CopyOptions::default())
            .await,
        ErrorCode::InvalidArgument,
        "a directory without recursive",
    );
    expect_code(
        backend
            .copy(&id, "nope", "dst", CopyOptions::default().recursive(true))
            .await,
        ErrorCode::NotFound,
        "a missing source",
    );
    expect_code(
        backend
            .copy(
                &id,
                "src",
                "src/deep/inner",
                CopyOptions::default().recursive(true),
            )
            .await,
        ErrorCode::InvalidArgument,
        "a directory into itself",
    );
    let st = backend
        .copy(&id, "src", "dst", CopyOptions::default().recursive(true))
        .await
        .expect("copy a tree");
    assert_eq!(st.kind, FileKind::Dir);
    let check = sh(
        backend,
        &id,
        "cd \"$HOME\"; cmp src/big.bin dst/big.bin && cat dst/deep/er/two.txt && \
         readlink dst/deep/link && readlink dst/abs && stat -c %a dst/deep dst/one.txt && \
         ls -A dst && ls -A dst/deep",
    )
    .await;
    assert_eq!(
        check.stdout_lossy(),
        "two../one.txt\n/etc/hostname\n700\n751\nabs\nbig.bin\ndeep\none.txt\ner\nlink\n",
        "the tree copied: {check:?}"
    );
    assert_eq!(
        names_in(backend, &id, "/workspace").await,
        ["dst", "one-copy.txt", "src"],
        "no temporary entries left by the refused copies"
    );
    // Overwriting merges into an existing directory and replaces its files.
    write(backend, &id, "dst/one.txt", b"changed").await;
    write(backend, &id, "dst/extra.txt", b"extra").await;
    backend
        .copy(&id, "src", "dst", CopyOptions::default().recursive(true))
        .await
        .expect("merge a tree");
    assert_eq!(
        read(backend, &id, "dst/one.txt").await.expect("read"),
        b"one"
    );
    assert_eq!(
        read(backend, &id, "dst/extra.txt").await.expect("read"),
        b"extra"
    );
    if backend.capabilities().multiple_users {
        let st = backend
            .copy(
                &id,
                "src/one.txt",
                "/tmp/as-root.txt",
                CopyOptions::default().user("root"),
            )
            .await
            .expect("copy as root");
        assert_eq!((st.uid, st.owner.as_str()), (0, "root"));
        let info = backend.get(&id).await.expect("get");
        let st = backend
            .copy(&id, "src/one.txt", "/tmp/as-me.txt", CopyOptions::default())
            .await
            .expect("copy as the default");
        assert_eq!(st.uid, info.user.uid, "a copy belongs to the acting user");
    }
    backend.destroy(&id).await.expect("destroy");
}

/// `exists` says `false` only for a path that is not there (missing, or under a file); a
/// sandbox that is gone is an error, never `false`.
pub async fn exists_tells_missing_from_unknown(backend: &dyn Backend) {
    let id = create(backend, &unique("exists")).await;
    let exists =
        |path: &'static str| sandcove::client::exists(backend, &id, path, StatOptions::default());
    write(backend, &id, "file", b"x").await;
    assert!(exists("file").await.expect("exists"));
    assert!(!exists("nope").await.expect("a missing path"));
    assert!(
        !exists("file/under").await.expect("a path under a file"),
        "a path under a file is not there"
    );
    expect_code(
        backend
            .stat(&id, "file/under", StatOptions::default())
            .await,
        ErrorCode::NotFound,
        "stat under a file",
    );
    if backend.capabilities().multiple_users {
        let info = backend.get(&id).await.expect("get");
        let mut spec = ProcessSpec::new(Command::sh(
            "mkdir -p /srv/closed && touch /srv/closed/x && chmod 700 /srv/closed",
        ));
        spec.user = Some("root".into());
        let out = run(backend, &id, spec).await;
        assert_eq!(out.exit_code(), 0, "{out:?}");
        let as_me = StatOptions::default().user(info.user.name.clone());
        let result = sandcove::client::exists(backend, &id, "/srv/closed/x", as_me).await;
        expect_code(
            result,
            ErrorCode::PermissionDenied,
            "a path the user cannot search",
        );
    }
    backend.destroy(&id).await.expect("destroy");
    let gone = sandcove::client::exists(backend, &id, "file", StatOptions::default()).await;
    expect_code(
        gone,
        ErrorCode::NotFound,
        "a destroyed sandbox is not 'no such file'",
    );
    let gone = sandcove::client::exists(backend, &id, "nope", StatOptions::default()).await;
    assert!(gone.is_err(), "a destroyed sandbox: {gone:?}");
}

/// mkdir (with parents), list with depth, rename, remove (recursive), exists.
pub async fn directory_operations(backend: &dyn Backend) {
    let id = create(backend, &unique("dirs")).await;
    backend
        .mkdir(&id, "a/b/c", MkdirOptions::default())
        .await
        .expect("mkdir -p");
    write(backend, &id, "a/top.txt", b"1").await;
    write(backend, &id, "a/b/mid.txt", b"22").await;
    write(backend, &id, "a/b/c/deep.txt", b"333").await;
    let names = |entries: Vec<sandcove::FileStat>| -> Vec<String> {
        entries.into_iter().map(|e| e.path).collect()
    };
    let one = backend
        .list_dir(&id, "a", {
            let mut options = ListDirOptions::default();
            options.depth = 1;
            options.user = None;
            options
        })
        .await
        .expect("list");
    assert_eq!(names(one), ["/workspace/a/b", "/workspace/a/top.txt"]);
    let all = names(
        backend
            .list_dir(&id, "a", {
                let mut options = ListDirOptions::default();
                options.depth = 3;
                options.user = None;
                options
            })
            .await
            .expect("list"),
    );
    for p in [
        "/workspace/a/b/c",
        "/workspace/a/b/mid.txt",
        "/workspace/a/b/c/deep.txt",
    ] {
        assert!(all.contains(&p.to_string()), "{p} in {all:?}");
    }
    expect_code(
        backend
            .mkdir(&id, "a/b", {
                let mut options = MkdirOptions::default();
                options.parents = false;
                options
            })
            .await,
        ErrorCode::AlreadyExists,
        "mkdir of an existing dir without parents",
    );
    backend
        .rename(&id, "a/top.txt", "a/moved.txt", Default::default())
        .await
        .expect("rename");
    assert!(backend
        .stat(&id, "a/top.txt", Default::default())
        .await
        .is_err());
    assert_eq!(read(backend, &id, "a/moved.txt").await.expect("read"), b"1");
    expect_code(
        backend
            .remove(&id, "a", {
                let mut options = RemoveOptions::default();
                options.recursive = false;
                options
            })
            .await,
        ErrorCode::InvalidArgument,
        "non-recursive remove of a non-empty dir",
    );
    backend
        .remove(&id, "a", {
            let mut options = RemoveOptions::default();
            options.recursive = true;
            options
        })
        .await
        .expect("remove -r");
    expect_code(
        backend.stat(&id, "a", Default::default()).await,
        ErrorCode::NotFound,
        "removed",
    );
    assert_eq!(
        sh(backend, &id, "ls -A \"$HOME\" | wc -l").await.stdout,
        b"0\n"
    );
    backend.destroy(&id).await.expect("destroy");
}

/// Missing files, directories read as files and bad paths give typed errors.
pub async fn file_errors_are_typed(backend: &dyn Backend) {
    let id = create(backend, &unique("fileerr")).await;
    expect_code(
        read(backend, &id, "nope.txt").await,
        ErrorCode::NotFound,
        "read missing",
    );
    expect_code(
        read(backend, &id, "/tmp").await,
        ErrorCode::InvalidArgument,
        "read a dir",
    );
    expect_code(
        read(backend, &id, "a\0b").await,
        ErrorCode::InvalidArgument,
        "NUL path",
    );
    expect_code(
        read(backend, &id, "").await,
        ErrorCode::InvalidArgument,
        "empty path",
    );
    expect_code(
        backend
            .list_dir(&id, "nope", ListDirOptions::default())
            .await,
        ErrorCode::NotFound,
        "list missing",
    );
    write(backend, &id, "file", b"x").await;
    expect_code(
        backend
            .list_dir(&id, "file", ListDirOptions::default())
            .await,
        ErrorCode::InvalidArgument,
        "list a file",
    );
    expect_code(
        backend
            .write_file(
                &id,
                "/tmp",
                bytes_stream(b"x".to_vec()),
                WriteOptions::default(),
            )
            .await,
        ErrorCode::InvalidArgument,
        "write over a directory",
    );
    expect_code(
        backend.remove(&id, "nope", RemoveOptions::default()).await,
        ErrorCode::NotFound,
        "remove missing",
    );
    // A data stream that fails part-way: the write fails promptly, nothing is left behind,
    // and the sandbox keeps working.
    let failing: ByteStream = Box::pin(futures::stream::iter(vec![
        Ok(vec![7u8; 300_000]),
        Err(sandcove::Error::invalid("the source broke")),
    ]));
    let result = tokio::time::timeout(
        PATIENCE,
        backend.write_file(&id, "partial.bin", failing, WriteOptions::default()),
    )
    .await
    .expect("an aborted upload returns promptly");
    assert!(result.is_err(), "an aborted upload is an error: {result:?}");
    let leftover = sh(backend, &id, "ls -A \"$HOME\"").await.stdout_lossy();
    assert_eq!(leftover, "file\n", "no partial or temporary file is left");
    assert_eq!(sh(backend, &id, "echo alive").await.stdout, b"alive\n");
    backend.destroy(&id).await.expect("destroy");
}

/// An upload whose source fails part-way leaves nothing behind, and the cleanup is finished
/// by the time the error is returned: a listing made at once shows no temporary file, over
/// new and existing targets, many times over.
pub async fn failed_uploads_leave_nothing_behind(backend: &dyn Backend) {
    let id = create(backend, &unique("debris")).await;
    write(backend, &id, "kept.bin", b"original").await;
    for round in 0..30 {
        let target = if round % 2 == 0 {
            "kept.bin"
        } else {
            "new.bin"
        };
        let failing: ByteStream = Box::pin(futures::stream::iter(vec![
            Ok(vec![round as u8; 200_000]),
            Ok(vec![round as u8; 200_000]),
            Err(sandcove::Error::invalid("the source broke")),
        ]));
        let result = tokio::time::timeout(
            Duration::from_secs(20),
            backend.write_file(&id, target, failing, WriteOptions::default()),
        )
        .await
        .expect("an aborted upload returns promptly");
        assert!(
            result.is_err(),
            "round {round}: an aborted upload is an error"
        );
        let names = names_in(backend, &id, "/workspace").await;
        assert_eq!(
            names,
            ["kept.bin"],
            "round {round}: debris after a failed upload"
        );
    }
    assert_eq!(
        read(backend, &id, "kept.bin").await.expect("read"),
        b"original",
        "a failed overwrite leaves the old content"
    );
    backend.destroy(&id).await.expect("destroy");
}

/// `..` chains and symlinks pointing out never reach host files.
pub async fn file_api_cannot_escape(backend: &dyn Backend) {
    let id = create(backend, &unique("escape")).await;
    let marker = unique("escape-marker");
    let host_target = std::env::temp_dir().join(&marker);
    // A `..` chain resolves inside the sandbox.
    let path = format!("../../../../../../..{}", host_target.display());
    write(backend, &id, &path, b"inside").await;
    assert!(!host_target.exists(), "a `..` write created a host file");
    assert_eq!(
        read(backend, &id, &host_target.to_string_lossy())
            .await
            .expect("read"),
        b"inside",
        "it landed inside the sandbox"
    );
    // A symlink to a host-only file does not reach it.
    let host_only = std::env::current_dir().expect("cwd").join("Cargo.toml");
    if host_only.exists() {
        sh(
            backend,
            &id,
            &format!("ln -s {} hostlink", host_only.display()),
        )
        .await;
        expect_code(
            read(backend, &id, "hostlink").await,
            ErrorCode::NotFound,
            "host-only file",
        );
    }
    // An absolute symlink to /etc/passwd: reads the sandbox's own, writes fail, the host's
    // file is untouched.
    let host_passwd = std::fs::read("/etc/passwd").unwrap_or_default();
    sh(backend, &id, "ln -s /etc/passwd pw").await;
    let isolated = backend.capabilities().isolated;
    // An image sandbox's `/etc` is its own (in its writable layer), writable by its root as
    // on the vendors' images; the host base's is the host's, read-only.
    let template = backend.get(&id).await.expect("get").template;
    let own_etc = isolated
        && !(template.is_empty() || sandcove::HOST_BASE_TEMPLATES.contains(&template.as_str()));
    let result = read(backend, &id, "pw").await;
    if isolated {
        let inside = result.expect("read through symlink");
        assert_ne!(inside, host_passwd, "the sandbox has its own user database");
    } else {
        // The link resolves beneath the host directory standing for the sandbox root, which
        // holds no system directories: there is no /etc/passwd to read.
        skipped(
            "file_api_cannot_escape",
            "un-isolated, the sandbox root has no /etc: the link leads nowhere",
        );
        expect_code(
            result,
            ErrorCode::NotFound,
            "read through a symlink into /etc",
        );
    }
    let result = backend
        .write_file(
            &id,
            "pw",
            bytes_stream(b"owned\n".to_vec()),
            WriteOptions::default(),
        )
        .await;
    if own_etc {
        result.expect("write the image sandbox's own /etc/passwd through the link");
        assert_eq!(
            read(backend, &id, "/etc/passwd").await.expect("read"),
            b"owned\n",
            "it landed in the sandbox's own /etc"
        );
    } else {
        expect_code(
            result,
            if isolated {
                ErrorCode::PermissionDenied
            } else {
                ErrorCode::NotFound
            },
            "write through a symlink into /etc",
        );
    }
    assert_eq!(
        std::fs::read("/etc/passwd").unwrap_or_default(),
        host_passwd
    );
    let result = backend
        .write_file(
            &id,
            "/etc/passwd",
            bytes_stream(b"owned\n".to_vec()),
            WriteOptions::default(),
        )
        .await;
    if isolated && !own_etc {
        assert!(result.is_err(), "writing /etc/passwd in the sandbox fails");
    } else {
        // Un-isolated, /etc in the sandbox root is an ordinary directory of that root; an
        // image sandbox's is its own.
        result.expect("write /etc/passwd beneath the sandbox root");
        assert_eq!(
            read(backend, &id, "/etc/passwd").await.expect("read"),
            b"owned\n"
        );
    }
    assert_eq!(
        std::fs::read("/etc/passwd").unwrap_or_default(),
        host_passwd
    );
    backend.destroy(&id).await.expect("destroy");
}

/// Host system directories are read-only inside the sandbox.
pub async fn system_directories_are_read_only(backend: &dyn Backend) {
    let id = create(backend, &unique("ro")).await;
    let isolated = backend.capabilities().isolated;
    if isolated {
        let out = sh(
            backend,
            &id,
            "touch /usr/x 2>&1; echo $?; touch /etc/x 2>&1; echo $?",
        )
        .await;
        let text = out.stdout_lossy();
        assert!(
            !text.contains("\n0\n") && !text.starts_with("0\n"),
            "{text}"
        );
    } else {
        // Never tried: un-isolated processes write wherever the host user may.
        skipped(
            "system_directories_are_read_only",
            "un-isolated processes see the host's system directories as the host user does",
        );
    }
    let result = backend
        .write_file(
            &id,
            "/usr/x",
            bytes_stream(b"x".to_vec()),
            WriteOptions::default(),
        )
        .await;
    if isolated {
        expect_code(result, ErrorCode::PermissionDenied, "write under /usr");
    } else {
        // The file API works beneath the host directory standing for the sandbox root,
        // where /usr is an ordinary directory: the write lands there, never in the host's.
        result.expect("write /usr/x beneath the sandbox root");
        assert_eq!(read(backend, &id, "/usr/x").await.expect("read"), b"x");
    }
    assert!(!std::path::Path::new("/usr/x").exists());
    // /tmp and the home are writable (un-isolated: the sandbox's, beneath its host root).
    let root = process_root(
        backend,
        &id,
        "/workspace",
        "system_directories_are_read_only",
    )
    .await;
    assert!(sh(backend, &id, &format!("touch {root}/tmp/x ~/y"))
        .await
        .exit_status()
        .success());
    backend.destroy(&id).await.expect("destroy");
}
