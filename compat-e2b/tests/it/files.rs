//! `sandbox.files`, against the embedded runtime.

use crate::common::{assert_not_supported, caps, sandbox, skip, unique};
use std::sync::{Arc, Mutex};

use e2b::{read_format, FileType, FilesystemEvent, FilesystemEventType, WriteEntry};
use sandcove_conformance::{eventually, holds, PATIENCE};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_read_and_info() {
    let sbx = sandbox("files").await;
    let w = sbx
        .files
        .write("test_file.txt", "Hello, world!")
        .await
        .expect("write");
    assert_eq!(w.path, "/home/user/test_file.txt");
    assert_eq!(
        (w.name.as_str(), w.r#type),
        ("test_file.txt", Some(FileType::File))
    );
    assert_eq!(
        format!("{w:?}"),
        "WriteInfo(name='test_file.txt', type=<FileType.FILE: 'file'>, path='/home/user/test_file.txt', metadata=None)"
    );
    assert_eq!(
        sbx.files
            .read("/home/user/test_file.txt")
            .await
            .expect("read"),
        "Hello, world!"
    );
    let bytes: Vec<u8> = sbx
        .files
        .read("test_file.txt")
        .format(read_format::Bytes)
        .await
        .expect("read bytes");
    assert_eq!(bytes, b"Hello, world!");
    let mut stream = sbx
        .files
        .read("test_file.txt")
        .format(read_format::Stream)
        .await
        .expect("read stream");
    let mut streamed = Vec::new();
    while let Some(chunk) = stream.next().await {
        streamed.extend(chunk.expect("chunk"));
    }
    assert_eq!(streamed, b"Hello, world!");
    let info = sbx.files.get_info("test_file.txt").await.expect("get_info");
    assert_eq!(
        (info.size, info.mode, info.permissions.as_str()),
        (13, 0o644, "-rw-r--r--")
    );
    assert_eq!((info.owner.as_str(), info.group.as_str()), ("user", "user"));
    let shown = format!("{info:?}");
    assert!(
        shown.starts_with("EntryInfo(name='test_file.txt', type=<FileType.FILE: 'file'>, path='/home/user/test_file.txt', metadata=None, size=13, mode=0o644, permissions='-rw-r--r--', owner='user', group='user', modified_time=datetime.datetime("),
        "{shown}"
    );
    assert!(shown.ends_with(", symlink_target=None)"), "{shown}");
    assert!(sbx.files.make_dir("test_dir").await.expect("make_dir"));
    assert!(
        !sbx.files
            .make_dir("test_dir")
            .await
            .expect("make_dir again"),
        "exists"
    );
    let dir = sbx.files.get_info("test_dir").await.expect("info");
    assert_eq!(
        (dir.r#type, dir.mode, dir.permissions.as_str()),
        (Some(FileType::Dir), 0o755, "drwxr-xr-x")
    );
    assert_eq!(dir.path, "/home/user/test_dir");
    assert!(sbx
        .files
        .make_dir("test_file.txt")
        .await
        .unwrap_err()
        .is_invalid_argument());
    // Binary round trip, overwrite, and the sandbox's processes see the same bytes.
    let data: Vec<u8> = (0..=255u8).collect();
    sbx.files
        .write("bin/data", data.clone())
        .await
        .expect("write bytes");
    assert_eq!(
        sbx.files
            .read("bin/data")
            .format(read_format::Bytes)
            .await
            .expect("read"),
        data
    );
    sbx.files
        .write("test_file.txt", "short")
        .await
        .expect("overwrite");
    let r = sbx
        .commands
        .run("cat test_file.txt; wc -c < bin/data")
        .await
        .expect("run");
    assert_eq!(r.stdout, "short256\n");
    // A local file is streamed.
    let local = std::env::temp_dir().join(unique("upload"));
    std::fs::write(&local, vec![7u8; 3_000_000]).expect("local file");
    let w = sbx
        .files
        .write(
            "/home/user/uploaded.bin",
            std::fs::File::open(&local).expect("open"),
        )
        .await
        .expect("upload");
    std::fs::remove_file(&local).ok();
    assert_eq!(
        sbx.files.get_info(w.path).await.expect("info").size,
        3_000_000
    );
    sbx.kill().await.expect("kill");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_files_list_exists_remove_rename() {
    let sbx = sandbox("dirs").await;
    let infos = sbx
        .files
        .write_files(vec![
            WriteEntry::new("/tmp/path/to/a", "file content"),
            WriteEntry::new("another/path/to/b", b"file content"),
        ])
        .await
        .expect("write_files");
    let paths: Vec<_> = infos.iter().map(|i| i.path.as_str()).collect();
    assert_eq!(paths, ["/tmp/path/to/a", "/home/user/another/path/to/b"]);
    assert!(sbx
        .files
        .write_files(vec![])
        .await
        .expect("empty")
        .is_empty());
    for (p, data) in [
        ("d/B.txt", "1"),
        ("d/a.txt", "2"),
        ("d/Zdir/x", "3"),
        ("d/adir/y", "4"),
    ] {
        sbx.files.write(p, data).await.expect("write");
    }
    let names = |v: &[e2b::EntryInfo]| v.iter().map(|e| e.name.clone()).collect::<Vec<_>>();
    let one = sbx.files.list("d").await.expect("list");
    assert_eq!(
        names(&one),
        ["B.txt", "Zdir", "a.txt", "adir"],
        "byte order of names, as E2B's daemon reads a directory"
    );
    let two = sbx.files.list("d").depth(2).await.expect("list depth 2");
    let paths: Vec<_> = two.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "/home/user/d/B.txt",
            "/home/user/d/Zdir",
            "/home/user/d/Zdir/x",
            "/home/user/d/a.txt",
            "/home/user/d/adir",
            "/home/user/d/adir/y",
        ],
        "a depth-first walk, each directory in byte order"
    );
    assert!(sbx
        .files
        .list("d")
        .depth(0)
        .await
        .unwrap_err()
        .is_invalid_argument());
    assert!(sbx
        .files
        .list("nope")
        .await
        .unwrap_err()
        .is_file_not_found());
    assert!(sbx
        .files
        .list("d/a.txt")
        .await
        .unwrap_err()
        .is_invalid_argument());
    assert!(sbx.files.exists("d/a.txt").await.expect("exists"));
    assert!(sbx.files.exists("d").await.expect("exists dir"));
    assert!(!sbx.files.exists("d/none").await.expect("exists missing"));
    let moved = sbx
        .files
        .rename("d/a.txt", "e/f/moved.txt")
        .await
        .expect("rename");
    assert_eq!(moved.path, "/home/user/e/f/moved.txt");
    assert_eq!(sbx.files.read("e/f/moved.txt").await.expect("read"), "2");
    assert!(!sbx.files.exists("d/a.txt").await.expect("exists"));
    sbx.files.remove("d").await.expect("remove recursive");
    assert!(!sbx.files.exists("d").await.expect("exists"));
    sbx.files
        .remove("d")
        .await
        .expect("removing a missing path is not an error");
    let err = sbx.files.read("missing.txt").await.unwrap_err();
    assert!(err.is_file_not_found() && err.is_not_found(), "{err:?}");
    assert!(sbx
        .files
        .read("/tmp")
        .await
        .unwrap_err()
        .is_invalid_argument());
    assert!(sbx
        .files
        .get_info("missing")
        .await
        .unwrap_err()
        .is_file_not_found());
    sbx.kill().await.expect("kill");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gaps_in_files_are_refused_before_any_effect() {
    let sbx = sandbox("filegaps").await;
    // A rename as another user is no gap any more: the engine acts as that user (where the
    // runtime has one uid, another user is refused as for every file call).
    sbx.files.write("/tmp/a", "x").await.expect("write");
    let renamed = sbx.files.rename("/tmp/a", "/tmp/b").user("root").await;
    if caps().await.multiple_users {
        assert_eq!(renamed.expect("rename as root").path, "/tmp/b");
    } else {
        assert_not_supported(renamed, "rename as root with one uid");
    }
    // The default user by name is fine.
    sbx.files
        .write("u.txt", "x")
        .user("user")
        .await
        .expect("write as user");
    assert_eq!(
        sbx.files.read("u.txt").user("user").await.expect("read"),
        "x"
    );
    sbx.kill().await.expect("kill");
}

/// `metadata=` is kept on the file (E2B's `user.e2b.*` attributes, keys lowercased): the
/// write, `get_info`, `list` and `rename` report it, with what a process set; a write without
/// it leaves none; bad or oversized metadata is refused before anything is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_metadata_is_kept_reported_and_replaced() {
    let sbx = sandbox("filemeta").await;
    let meta = |pairs: &[(&str, &str)]| {
        Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<std::collections::BTreeMap<_, _>>(),
        )
    };
    let w = sbx
        .files
        .write("m.txt", "x")
        .metadata([("Origin", "sdk"), ("k", "v")])
        .await
        .expect("write with metadata");
    assert_eq!(w.metadata, meta(&[("k", "v"), ("origin", "sdk")]));
    assert!(
        format!("{w:?}").ends_with("metadata={'k': 'v', 'origin': 'sdk'})"),
        "{w:?}"
    );
    let info = sbx.files.get_info("m.txt").await.expect("get_info");
    assert_eq!(info.metadata, meta(&[("k", "v"), ("origin", "sdk")]));
    assert!(
        format!("{info:?}").contains("metadata={'k': 'v', 'origin': 'sdk'}, size=1,"),
        "{info:?}"
    );
    // Set by a process: its `user.e2b.*` attributes are metadata, other ones are not.
    let set =
        "python3 -c \"import os; os.setxattr('/home/user/m.txt', 'user.e2b.by', b'process'); \
               os.setxattr('/home/user/m.txt', 'user.other', b'x')\"";
    sbx.commands.run(set).await.expect("setxattr");
    let three = meta(&[("by", "process"), ("k", "v"), ("origin", "sdk")]);
    let listed = sbx.files.list("/home/user").await.expect("list");
    let entry = listed.iter().find(|e| e.name == "m.txt").expect("listed");
    assert_eq!(entry.metadata, three);
    let moved = sbx
        .files
        .rename("m.txt", "moved/m.txt")
        .await
        .expect("rename");
    assert_eq!(moved.metadata, three, "kept by the rename");
    // A write without metadata leaves none; write_files gives every file the same.
    let w = sbx
        .files
        .write("moved/m.txt", "y")
        .await
        .expect("overwrite");
    assert_eq!(w.metadata, None);
    let info = sbx.files.get_info("moved/m.txt").await.expect("get_info");
    assert_eq!(info.metadata, None);
    let many = sbx
        .files
        .write_files(vec![
            WriteEntry::new("a.txt", "a"),
            WriteEntry::new("b.txt", "b"),
        ])
        .metadata([("batch", "1")])
        .await
        .expect("write_files");
    assert!(
        many.iter().all(|w| w.metadata == meta(&[("batch", "1")])),
        "{many:?}"
    );
    // Refused before anything is written: a key that is no header token, a value that is not
    // printable ASCII, more than E2B's daemon keeps.
    for bad in [
        sbx.files.write("bad.txt", "x").metadata([("a key", "v")]),
        sbx.files
            .write("bad.txt", "x")
            .metadata([("k", "caf\u{e9}")]),
        sbx.files
            .write("bad.txt", "x")
            .metadata([("big", "v".repeat(4096))]),
    ] {
        let err = bad.await.expect_err("bad metadata");
        assert!(err.is_invalid_argument(), "{err:?}");
    }
    assert!(
        !sbx.files.exists("bad.txt").await.expect("exists"),
        "nothing written"
    );
    sbx.kill().await.expect("kill");
}

/// `user=` on read, list, exists, get_info and write acts as that user: its permissions,
/// its ownership. Where the runtime has one uid, another user is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_calls_act_as_the_given_user() {
    let sbx = sandbox("fileuser").await;
    if !caps().await.multiple_users {
        skip("file calls as root", "multiple_users");
        assert_not_supported(sbx.files.read("m.txt").user("root").await, "read as root");
        assert_not_supported(sbx.files.list("/").user("root").await, "list as root");
        assert_not_supported(
            sbx.files.remove("m.txt").user("root").await,
            "remove as root",
        );
        sbx.kill().await.expect("kill");
        return;
    }
    // Relative paths and the working directory are the user's home, as envd resolves them:
    // root's is /root.
    let written = sbx
        .files
        .write("hello.txt", "as root")
        .user("root")
        .await
        .expect("write as root");
    assert_eq!(written.path, "/root/hello.txt");
    assert_eq!(
        sbx.files
            .read("~/hello.txt")
            .user("root")
            .await
            .expect("read as root"),
        "as root"
    );
    let pwd = sbx.commands.run("pwd").user("root").await.expect("pwd");
    assert_eq!(pwd.stdout, "/root\n");
    let pwd = sbx.commands.run("pwd").user("root").cwd("sub").await;
    assert!(pwd.is_err(), "a relative cwd is under root's home: {pwd:?}");
    let setup = "echo s3cret > /tmp/secret && chmod 600 /tmp/secret && \
                 mkdir -m 700 /tmp/vault && touch /tmp/vault/in";
    let r = sbx.commands.run(setup).user("root").await.expect("setup");
    assert_eq!(r.exit_code, 0, "{r:?}");
    assert!(
        sbx.files.read("/tmp/secret").user("user").await.is_err(),
        "a root-only file is unreadable as user"
    );
    assert_eq!(
        sbx.files
            .read("/tmp/secret")
            .user("root")
            .await
            .expect("root reads"),
        "s3cret\n"
    );
    assert!(
        sbx.files.list("/tmp/vault").user("user").await.is_err(),
        "a 0700 root directory is unlistable as user"
    );
    assert!(
        sbx.files
            .get_info("/tmp/vault/in")
            .user("user")
            .await
            .is_err(),
        "nothing beneath it can be looked up as user"
    );
    let listed = sbx
        .files
        .list("/tmp/vault")
        .user("root")
        .await
        .expect("root lists");
    assert_eq!(listed.len(), 1);
    // Remove and watch follow the user too: a 0700 root directory is closed to `user`.
    assert!(
        sbx.files
            .remove("/tmp/vault/in")
            .user("user")
            .await
            .is_err(),
        "nothing in a 0700 root directory can be removed as user"
    );
    assert!(
        sbx.files
            .make_dir("/tmp/vault/sub")
            .user("user")
            .await
            .is_err(),
        "nothing can be made in a 0700 root directory as user"
    );
    assert!(
        sbx.files
            .watch_dir("/tmp/vault", |_| {})
            .user("user")
            .await
            .is_err(),
        "a 0700 root directory cannot be watched as user"
    );
    assert!(
        sbx.files
            .rename("/tmp/vault/in", "/tmp/out")
            .user("user")
            .await
            .is_err(),
        "nothing in a 0700 root directory can be renamed as user"
    );
    let moved = sbx
        .files
        .rename("/tmp/vault/in", "/tmp/vault/in2")
        .user("root")
        .await
        .expect("root renames");
    assert_eq!(moved.path, "/tmp/vault/in2");
    sbx.files
        .rename("/tmp/vault/in2", "/tmp/vault/in")
        .user("root")
        .await
        .expect("root renames back");
    sbx.files
        .remove("/tmp/vault/in")
        .user("root")
        .await
        .expect("root removes");
    assert!(
        !sbx.files
            .exists("/tmp/vault/in")
            .user("root")
            .await
            .expect("exists"),
        "removed as root"
    );
    let w = sbx
        .files
        .write("/home/user/by-root.txt", "x")
        .user("root")
        .await
        .expect("write as root");
    assert_eq!(w.path, "/home/user/by-root.txt");
    let info = sbx.files.get_info("by-root.txt").await.expect("info");
    assert_eq!(info.owner, "root", "written as root: root's file");
    sbx.files
        .write("by-user.txt", "x")
        .user("user")
        .await
        .expect("write as user");
    let info = sbx.files.get_info("by-user.txt").await.expect("info");
    assert_eq!(info.owner, "user");
    assert!(
        sbx.files.read("x").user("nosuchuser").await.is_err(),
        "an unknown user is refused"
    );
    sbx.kill().await.expect("kill");
}

/// The events an [`event_log`] callback was given.
type Events = Arc<Mutex<Vec<FilesystemEvent>>>;

/// An `on_event` callback that keeps the events it is given.
fn event_log() -> (Events, impl FnMut(FilesystemEvent) + Send + 'static) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    (seen, move |e: FilesystemEvent| sink.lock().unwrap().push(e))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_dir_follows_the_capability() {
    let sbx = sandbox("watch").await;
    if caps().await.watch {
        // The async class's shape: `files.watch_dir(path, on_event)`.
        let (events, on_event) = event_log();
        let handle = sbx
            .files
            .watch_dir("/home/user", on_event)
            .await
            .expect("watch");
        sbx.files
            .write("/home/user/my-file", "hello")
            .await
            .expect("write");
        eventually(PATIENCE, "a write event for my-file", || async {
            let events = events.lock().unwrap();
            let write = events
                .iter()
                .any(|e| e.r#type == FilesystemEventType::Write);
            holds(write, format!("{events:?}"))
        })
        .await;
        handle.stop().await.expect("stop");
        let seen = events.lock().unwrap().clone();
        assert!(seen.iter().all(|e| e.name == "my-file"), "{seen:?}");
        // After `stop()` returns no callback runs, whatever happens in the directory.
        sbx.files
            .write("/home/user/after-stop", "x")
            .await
            .expect("write");
        let (names, on_event) = event_log();
        let rec = sbx
            .files
            .watch_dir("/home/user", on_event)
            .recursive(true)
            .await
            .expect("watch");
        sbx.files
            .make_dir("/home/user/my-folder")
            .await
            .expect("mkdir");
        // No pause needed: files made in a new directory before its watch is added are
        // reported too.
        sbx.files
            .write("/home/user/my-folder/my-file", "x")
            .await
            .expect("write");
        eventually(PATIENCE, "an event for my-folder/my-file", || async {
            let names = names.lock().unwrap();
            holds(
                names.iter().any(|e| e.name == "my-folder/my-file"),
                format!("{names:?}"),
            )
        })
        .await;
        rec.stop().await.expect("stop");
        // Both later watches' events were seen by now: the first watch stayed stopped.
        assert_eq!(*events.lock().unwrap(), seen);

        // `timeout=` ends the watch and `on_exit` hears why, once.
        let (exits_tx, mut exits) = tokio::sync::mpsc::unbounded_channel();
        let _short = sbx
            .files
            .watch_dir("/home/user", |_| {})
            .timeout(1)
            .on_exit(move |e| {
                let _ = exits_tx.send(e);
            })
            .await
            .expect("watch");
        let ended = exits.recv().await.expect("on_exit ran");
        assert!(ended.expect("an error").is_timeout());
        assert!(exits.recv().await.is_none(), "on_exit runs once");

        assert!(sbx
            .files
            .watch_dir("/nope", |_| {})
            .await
            .unwrap_err()
            .is_file_not_found());
    } else {
        skip("watch_dir", "watch");
        assert_not_supported(sbx.files.watch_dir("/home/user", |_| {}).await, "watch_dir");
    }
    sbx.kill().await.expect("kill");
}

/// A link reports what envd reports, read as the SDK reads it: `SYMLINK`, its final
/// target's mode, the target's absolute path with every link on the way resolved, the link's
/// own permission string; a dangling link (or a loop) has mode 0 and its own path as target,
/// and `list` leaves it out (envd's type for it is unknown).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn symlinks_report_their_resolved_target() {
    let sbx = sandbox("symlinks").await;
    sbx.files.write("t/file.txt", "x").await.expect("write");
    let made = sbx
        .commands
        .run(
            "cd /home/user && mkdir -p t/d/e && chmod 700 t/d/e && ln -s file.txt t/rel && \
             ln -s d t/dl && ln -s dl/e t/chain && ln -s ../rel t/d/up && \
             ln -s nowhere t/dangling && ln -s loop2 t/loop1 && ln -s loop1 t/loop2",
        )
        .await
        .expect("links");
    assert_eq!(made.exit_code, 0);
    let info = |path: &'static str| {
        let sbx = &sbx;
        async move { sbx.files.get_info(path).await.expect(path) }
    };
    let rel = info("t/rel").await;
    assert_eq!(
        (rel.r#type, rel.mode, rel.permissions.as_str()),
        (Some(FileType::Symlink), 0o644, "Lrwxrwxrwx")
    );
    assert_eq!(rel.symlink_target.as_deref(), Some("/home/user/t/file.txt"));
    assert_eq!(rel.path, "/home/user/t/rel");
    let chain = info("t/chain").await;
    assert_eq!((chain.r#type, chain.mode), (Some(FileType::Symlink), 0o700));
    assert_eq!(chain.symlink_target.as_deref(), Some("/home/user/t/d/e"));
    let up = info("t/d/up").await;
    assert_eq!(up.symlink_target.as_deref(), Some("/home/user/t/file.txt"));
    for broken in ["t/dangling", "t/loop1"] {
        let b = info(broken).await;
        assert_eq!((b.r#type, b.mode), (Some(FileType::Symlink), 0), "{broken}");
        assert_eq!(b.symlink_target, Some(format!("/home/user/{broken}")));
    }
    let listed = sbx.files.list("t").await.expect("list");
    let names: Vec<&str> = listed.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["chain", "d", "dl", "file.txt", "rel"], "{listed:?}");
    let chain = listed.iter().find(|e| e.name == "chain").expect("chain");
    assert_eq!(chain.symlink_target.as_deref(), Some("/home/user/t/d/e"));
    let file = listed.iter().find(|e| e.name == "file.txt").expect("file");
    assert_eq!(
        (file.r#type, file.symlink_target.as_deref()),
        (Some(FileType::File), None)
    );
}
