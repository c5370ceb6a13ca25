//! `sandbox.fs` against the real embedded engine.

use std::sync::{Arc, Mutex};

use crate::common::{self, sandbox};
use blaxel::{SandboxAPIError, SandboxFilesystemFile, WatchEvent};
use sandcove_conformance::{eventually, holds, PATIENCE};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_write_ls_rm_and_paths() {
    let sb = sandbox("files").await;
    let r = sb
        .fs
        .write("/blaxel/app/config.json", r#"{"key": "value"}"#)
        .await
        .expect("write");
    assert_eq!(r.message, "File created/updated successfully");
    assert_eq!(r.path.as_deref(), Some("/blaxel/app/config.json"));
    assert_eq!(
        sb.fs.read("/blaxel/app/config.json").await.unwrap(),
        r#"{"key": "value"}"#
    );
    assert_eq!(
        sb.fs.read("app/config.json").await.unwrap(),
        r#"{"key": "value"}"#,
        "relative paths resolve against /blaxel"
    );
    let bytes: Vec<u8> = (0..=255u8).collect();
    let r = sb
        .fs
        .write_binary("/blaxel/app/image.png", bytes.clone())
        .await
        .unwrap();
    assert_eq!(r.message, "Binary file uploaded successfully");
    assert_eq!(
        sb.fs.read_binary("/blaxel/app/image.png").await.unwrap(),
        bytes
    );
    let r = sb.fs.mkdir("/blaxel/app/uploads").await.unwrap();
    assert_eq!(r.message, "Directory created successfully");
    sb.fs
        .mkdir("/blaxel/app/uploads")
        .await
        .expect("mkdir twice is fine");

    let listing = sb.fs.ls("/blaxel/app").await.expect("ls");
    assert_eq!(listing.path, "/blaxel/app");
    assert_eq!(listing.name, "app");
    let files: Vec<&str> = listing.files.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(files, ["config.json", "image.png"]);
    assert_eq!(listing.subdirectories[0].name, "uploads");
    assert_eq!(listing.subdirectories[0].path, "/blaxel/app/uploads");
    let cfg = &listing.files[0];
    assert_eq!(cfg.permissions, "644");
    assert_eq!(cfg.size, 16);
    assert_eq!(cfg.owner, "root");
    assert!(cfg.last_modified.ends_with('Z'));
    let rel = sb.fs.ls("app").await.unwrap();
    assert_eq!(
        rel.files[0].path, "app/config.json",
        "relative listings stay relative"
    );

    // Errors as Blaxel raises them.
    let err = sb.fs.read("/blaxel/nope.txt").await.unwrap_err();
    assert_eq!(err.status_code(), Some(404));
    assert!(matches!(err, SandboxAPIError::Response(_)));
    let err = sb.fs.read("/blaxel/app").await.unwrap_err();
    assert_eq!(err.to_string(), "Unsupported file type");
    let err = sb.fs.ls("/blaxel/app/config.json").await.unwrap_err();
    assert_eq!(err.to_string(), r#"{"error": "Directory not found"}"#);
    let err = sb.fs.rm("/blaxel/app").await.unwrap_err();
    assert_eq!(err.status_code(), Some(422));
    assert!(sb.fs.rm("/blaxel/none").await.unwrap_err().is_not_found());
    let r = sb.fs.rm("/blaxel/app/config.json").await.unwrap();
    assert_eq!(r.message, "File deleted successfully");
    let r = sb.fs.rm("/blaxel/app").recursive(true).await.unwrap();
    assert_eq!(r.message, "Directory deleted successfully");
    assert!(sb.fs.ls("/blaxel/app").await.unwrap_err().is_not_found());

    // The same files are what processes see.
    sb.fs.write("notes.txt", "hi").await.unwrap();
    let p = sb
        .process
        .exec(json!({"command": "cat /blaxel/notes.txt", "wait_for_completion": true}))
        .await
        .unwrap();
    assert_eq!(p.logs, "hi");
    sb.delete().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_tree_cp_download() {
    let sb = sandbox("tree").await;
    let dir = sb
        .fs
        .write_tree(json!([
            {"path": "src/app.js", "content": "console.log(1)"},
            {"path": "package.json", "content": "{}"},
        ]))
        .destination_path("/blaxel/app".to_string())
        .await
        .expect("write_tree");
    assert_eq!(dir.path, "/blaxel/app");
    assert_eq!(dir.files[0].name, "package.json");
    assert_eq!(dir.subdirectories[0].name, "src");
    assert_eq!(
        sb.fs.read("/blaxel/app/src/app.js").await.unwrap(),
        "console.log(1)"
    );
    sb.fs
        .write_tree(vec![SandboxFilesystemFile {
            path: "/tmp/abs.txt".into(),
            content: "abs".into(),
        }])
        .await
        .expect("write_tree to /");
    assert_eq!(sb.fs.read("/tmp/abs.txt").await.unwrap(), "abs");

    let r = sb
        .fs
        .cp("/blaxel/app", "/blaxel/copy dir")
        .await
        .expect("cp");
    assert_eq!(r.message, "Files copied");
    assert_eq!(
        sb.fs.read("/blaxel/copy dir/src/app.js").await.unwrap(),
        "console.log(1)"
    );
    let err = sb.fs.cp("/blaxel/missing", "/blaxel/x").await.unwrap_err();
    assert!(err
        .to_string()
        .starts_with("Could not copy /blaxel/missing to /blaxel/x cause:"));

    let local = std::env::temp_dir().join(common::unique("download"));
    sb.fs
        .download("/blaxel/app/package.json", local.to_str().unwrap())
        .mode(0o600)
        .await
        .expect("download");
    assert_eq!(std::fs::read_to_string(&local).unwrap(), "{}");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&local).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // write_binary with a str uploads a local file, as in Python.
    sb.fs
        .write_binary("/blaxel/uploaded.json", local.to_str().unwrap())
        .await
        .unwrap();
    assert_eq!(sb.fs.read("/blaxel/uploaded.json").await.unwrap(), "{}");
    std::fs::remove_file(&local).unwrap();
    sb.delete().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn find_and_grep_follow_blaxels_rules() {
    let sb = sandbox("search").await;
    sb.fs
        .write_tree(json!([
            {"path": "README.md", "content": "# Title\nsome pattern here\n"},
            {"path": "docs/guide.md", "content": "Pattern again\nno match\n"},
            {"path": "index.html", "content": "<p>pattern</p>"},
            {"path": "main.py", "content": "x = 'pattern'\nPATTERN = 1\n"},
            {"path": "node_modules/dep/x.md", "content": "pattern"},
            {"path": ".hidden/y.md", "content": "pattern"},
        ]))
        .destination_path("/blaxel/app".to_string())
        .await
        .unwrap();
    let found = sb
        .fs
        .find("/blaxel/app")
        .r#type("file".to_string())
        .patterns(["*.md", "*.html"])
        .max_results(1000)
        .await
        .expect("find");
    let paths: Vec<&str> = found.matches.iter().map(|m| m.path.as_str()).collect();
    assert_eq!(paths, ["README.md", "docs/guide.md", "index.html"]);
    assert_eq!(found.total, 3);
    assert!(found.matches.iter().all(|m| m.type_ == "file"));
    let dirs = sb
        .fs
        .find("/blaxel/app")
        .r#type("directory".to_string())
        .await
        .unwrap();
    assert_eq!(
        dirs.matches
            .iter()
            .map(|m| m.path.as_str())
            .collect::<Vec<_>>(),
        ["docs"]
    );
    let limited = sb.fs.find("/blaxel/app").max_results(2).await.unwrap();
    assert_eq!(limited.total, 2);

    let hits = sb
        .fs
        .grep("pattern")
        .path("/blaxel/app")
        .await
        .expect("grep");
    let got: Vec<(String, i64, i64)> = hits
        .matches
        .iter()
        .map(|m| (m.path.clone(), m.line, m.column))
        .collect();
    assert_eq!(
        got,
        [
            ("README.md".to_string(), 2, 6),
            ("docs/guide.md".to_string(), 1, 1),
            ("index.html".to_string(), 1, 4),
            ("main.py".to_string(), 1, 6),
            ("main.py".to_string(), 2, 1),
        ]
    );
    let exact = sb
        .fs
        .grep("pattern")
        .path("/blaxel/app")
        .case_sensitive(true)
        .context_lines(2)
        .max_results(5)
        .file_pattern("*.py".to_string())
        .exclude_dirs(["__pycache__"])
        .await
        .unwrap();
    assert_eq!(exact.total, 1);
    assert_eq!(exact.matches[0].text, "x = 'pattern'");
    assert!(exact.matches[0].context.is_none());
    // The SDK default path "/" searches the working directory /blaxel.
    let from_home = sb.fs.grep("Title").await.unwrap();
    assert_eq!(from_home.matches[0].path, "app/README.md");
    sb.delete().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_follows_the_capability() {
    let sb = sandbox("watch").await;
    sb.fs.mkdir("/blaxel/app").await.unwrap();
    let events = Arc::new(Mutex::new(Vec::<WatchEvent>::new()));
    let e2 = events.clone();
    let result = sb
        .fs
        .watch("/blaxel/app", move |e| e2.lock().unwrap().push(e))
        .options(json!({"with_content": true, "ignore": ["node_modules"]}))
        .await;
    if common::capabilities().await.watch {
        let handle = result.expect("watch");
        sb.fs.write("/blaxel/app/a.txt", "hello").await.unwrap();
        sb.fs
            .write("/blaxel/app/node_modules/x", "x")
            .await
            .unwrap();
        eventually(PATIENCE, "the event for a.txt with its content", || async {
            let seen = events.lock().unwrap().clone();
            let found = seen
                .iter()
                .any(|e| e.name == "a.txt" && e.content.as_deref() == Some("hello"));
            holds(found, seen)
        })
        .await;
        handle.close();
        let seen = events.lock().unwrap().clone();
        let a = seen
            .iter()
            .find(|e| e.name == "a.txt")
            .unwrap_or_else(|| panic!("an event for a.txt in {seen:?}"));
        assert_eq!(a.path, "/blaxel/app");
        assert!(seen.iter().all(|e| !e.path.contains("node_modules")));
        assert!(
            seen.iter()
                .any(|e| e.name == "a.txt" && e.content.as_deref() == Some("hello")),
            "{seen:?}"
        );
        assert!(handle.closed());
    } else {
        eprintln!("LOUD SKIP: the runtime has no watch yet; checking the refusal");
        assert!(result.unwrap_err().is_not_supported());
    }
    // Watching a file is refused either way.
    sb.fs.write("/blaxel/f.txt", "x").await.unwrap();
    let err = sb.fs.watch("/blaxel/f.txt", |_| {}).await.unwrap_err();
    assert_eq!(err.status_code(), Some(400));
    sb.delete().await.unwrap();
}

/// Finding 9: Blaxel's default network never shares the host's network. A listener on the
/// host's 127.0.0.1, bound before the sandbox exists, is not reachable from a sandbox created
/// with the defaults (isolated internet or loopback only).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_network_does_not_reach_host_loopback() {
    let host = std::net::TcpListener::bind("127.0.0.1:0").expect("host listener");
    host.set_nonblocking(true).unwrap();
    let port = host.local_addr().unwrap().port();
    let sb = sandbox("net-default").await;
    let script = format!(
        "if command -v python3 >/dev/null; then python3 -c \"import socket; s=socket.socket(); \
         s.settimeout(3); print(s.connect_ex(('127.0.0.1', {port})))\"; else echo no-python; fi"
    );
    let p = sb
        .process
        .exec(json!({"command": script, "wait_for_completion": true}))
        .await
        .unwrap();
    if p.logs.trim() == "no-python" {
        eprintln!("SKIP: python3 is not installed on this host; socket probe not run");
    } else {
        // 111 is ECONNREFUSED: nothing listens on the sandbox's own loopback.
        assert_eq!(p.logs.trim(), "111", "host 127.0.0.1:{port} reached");
        assert!(host.accept().is_err(), "the host listener got a connection");
    }
    sb.delete().await.unwrap();
}
