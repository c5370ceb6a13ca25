//! The `Client` / `Sandbox` surface: calls configured with setters and awaited directly, a
//! process handle that is a `Stream` with an `AsyncWrite` stdin, explicit recursive removal,
//! and the rest of the `Backend` trait reachable from a handle. Run on the embedded engine and
//! over HTTP (a loopback server wrapping it).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use sandcove::conformance::{test_options, unique};
use sandcove::{Backend, Client, Command, ErrorCode, LocalBackend, ProcessEvent};
use tokio::io::AsyncWriteExt;

async fn clients() -> Vec<(&'static str, Client)> {
    let engine = Arc::new(LocalBackend::new().expect("local engine"));
    let remote = sandcove::conformance::served(engine.clone()).await;
    vec![
        ("embedded", Client::new(engine)),
        ("http", Client::new(Arc::new(remote) as Arc<dyn Backend>)),
    ]
}

#[tokio::test]
async fn calls_are_configured_then_awaited() {
    for (how, client) in clients().await {
        let sandbox = client
            .create(test_options(&unique("surface")))
            .await
            .expect("create");
        let out = sandbox
            .run("pwd; echo \"$GREETING\"")
            .cwd("/tmp")
            .env("GREETING", "hello")
            .await
            .expect("run");
        assert_eq!(out.stdout_lossy(), "/tmp\nhello\n", "{how}");
        let out = sandbox
            .run(Command::argv(["sh", "-c", "exit 3"]))
            .await
            .expect("argv");
        assert_eq!(out.exit_code(), 3, "{how}");
        let err = sandbox.run("true").cwd("").await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument, "{how}: {err}");
        sandbox.destroy().await.expect("destroy");
    }
}

#[tokio::test]
async fn a_process_handle_streams_events_and_takes_stdin_as_async_write() {
    for (how, client) in clients().await {
        let sandbox = client
            .create(test_options(&unique("surface")))
            .await
            .expect("create");
        let mut handle = sandbox
            .spawn("while read line; do echo \"got $line\"; done; echo done")
            .stdin(true)
            .await
            .expect("spawn");
        let mut stdin = handle.stdin();
        stdin.write_all(b"one\ntwo\n").await.expect("write");
        stdin.flush().await.expect("flush");
        stdin.shutdown().await.expect("close stdin");
        assert!(
            stdin.write_all(b"late").await.is_err(),
            "{how}: writing after shutdown fails"
        );
        let mut stdout = Vec::new();
        let mut exit = None;
        while let Some(event) = handle.next().await {
            match event.expect("event") {
                ProcessEvent::Stdout(bytes) => stdout.extend(bytes),
                ProcessEvent::Exit(status) => exit = Some(status),
                _ => {}
            }
        }
        assert_eq!(
            String::from_utf8_lossy(&stdout),
            "got one\ngot two\ndone\n",
            "{how}"
        );
        assert!(exit.expect("an exit event").success(), "{how}");
        sandbox.destroy().await.expect("destroy");
    }
}

#[tokio::test]
async fn removal_is_recursive_only_when_asked() {
    for (how, client) in clients().await {
        let sandbox = client
            .create(test_options(&unique("surface")))
            .await
            .expect("create");
        sandbox
            .write("d/inner/f", b"x".to_vec())
            .await
            .expect("write");
        let err = sandbox.remove("d").await.unwrap_err();
        assert_ne!(err.code(), ErrorCode::NotFound, "{how}: {err}");
        assert!(sandbox.exists("d/inner/f").await.unwrap(), "{how}: kept");
        sandbox.remove("d/inner/f").await.expect("remove a file");
        sandbox.remove_all("d").await.expect("remove_all");
        assert!(!sandbox.exists("d").await.unwrap(), "{how}");
        sandbox.destroy().await.expect("destroy");
    }
}

#[tokio::test]
async fn the_rest_of_the_backend_is_reachable_from_a_handle() {
    for (how, client) in clients().await {
        let caps = client.ready().await.expect("ready");
        let sandbox = client
            .create(test_options(&unique("surface")))
            .await
            .expect("create");
        let labels = [("k".to_string(), "v".to_string())].into();
        let info = sandbox.set_labels(labels).await.expect("labels");
        assert_eq!(info.labels.get("k").map(String::as_str), Some("v"), "{how}");
        let update = sandcove::AnnotationUpdate {
            set: [("owner".to_string(), "me".to_string())].into(),
            ..Default::default()
        };
        let annotations = sandbox.update_annotations(update).await.expect("annotate");
        assert_eq!(
            annotations.get("owner").map(String::as_str),
            Some("me"),
            "{how}"
        );
        assert_eq!(
            sandbox.stop().await.expect("stop").state,
            sandcove::SandboxState::Stopped,
            "{how}"
        );
        sandbox.start().await.expect("start");
        assert_eq!(sandbox.run("echo up").await.expect("run").stdout, b"up\n");
        if caps.metrics {
            sandbox.metrics().await.expect("metrics");
        }
        if caps.pause {
            sandbox.pause().await.expect("pause");
            sandbox.resume().await.expect("resume");
        }
        if caps.snapshots {
            sandbox
                .write("kept", b"copied".to_vec())
                .await
                .expect("write");
            let copy = sandbox
                .fork(test_options(&unique("surface-fork")))
                .await
                .expect("fork");
            assert_eq!(copy.read("kept").await.expect("read"), b"copied", "{how}");
            copy.destroy().await.expect("destroy the fork");
        }
        if caps.previews {
            let preview = sandbox
                .expose_port(sandcove::PreviewOptions {
                    port: 8000,
                    ..Default::default()
                })
                .await
                .expect("expose");
            assert_eq!(sandbox.previews().await.expect("list").len(), 1, "{how}");
            sandbox.close_preview(preview.port).await.expect("close");
        }
        let _ = tokio::time::timeout(Duration::from_secs(60), sandbox.destroy())
            .await
            .expect("destroy in time");
    }
}
