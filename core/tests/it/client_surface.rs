//! The `Client` / `Sandbox` surface: calls configured with setters and awaited directly, a
//! process handle that is a `Stream` with an `AsyncWrite` stdin, explicit recursive removal,
//! and the rest of the `Backend` trait reachable from a handle. Run on the embedded engine and
//! over HTTP (a loopback server wrapping it).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use sandcove::{
    Backend, ByteStream, Capabilities, Client, Command, Error, ErrorCode, Feature, ListDirOptions,
    ListOptions, LocalBackend, MkdirOptions, NetworkPolicy, PreviewOptions, ProcessEvent,
    ProcessSelector, PtySize, ReadOptions, RemoveOptions, Resources, Result, SandboxState, Signal,
    StatOptions, TimeoutAction, VolumeMount, WatchOptions, WriteOptions,
};
use sandcove_conformance::{test_options, unique};
use tokio::io::AsyncWriteExt;

use crate::passthrough_common as passthrough;

use passthrough::{Adapt, Passthrough};

async fn clients() -> Vec<(&'static str, Client)> {
    let engine = Arc::new(LocalBackend::new().expect("local engine"));
    let remote = sandcove_conformance::served(engine.clone()).await;
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
        let update = sandcove::AnnotationUpdate::set("owner", "me");
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
                .expose_port(sandcove::PreviewOptions::new(8000))
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

/// The engine under a mask: it reports the features in `off` as missing and passes every call
/// on unchanged. To a client it is a runtime without those features; a call for one that slips
/// past the client's check still reaches the real engine and takes effect there, where the
/// test sees it.
#[derive(Debug)]
struct Without {
    off: Vec<Feature>,
}

impl Adapt for Without {
    fn capabilities(&self, mut caps: Capabilities) -> Capabilities {
        for feature in &self.off {
            match feature {
                Feature::Pause => caps.pause = false,
                Feature::Previews => caps.previews = false,
                Feature::Snapshots => caps.snapshots = false,
                Feature::Volumes => caps.volumes = false,
                Feature::Watch => caps.watch = false,
                Feature::Pty => caps.pty = false,
                Feature::Metrics => caps.metrics = false,
                Feature::HostNetwork => caps.host_network = false,
                Feature::ProcessLimit => caps.process_limit = false,
                Feature::MemoryLimit => caps.memory_limit = false,
                Feature::CpuLimit => caps.cpu_limit = false,
                other => panic!("unmasked feature {other:?}"),
            }
        }
        caps
    }
}

/// Every feature [`Without`] can take away.
const MASKABLE: [Feature; 11] = [
    Feature::Pause,
    Feature::Previews,
    Feature::Snapshots,
    Feature::Volumes,
    Feature::Watch,
    Feature::Pty,
    Feature::Metrics,
    Feature::HostNetwork,
    Feature::ProcessLimit,
    Feature::MemoryLimit,
    Feature::CpuLimit,
];

/// `backend` as a client used directly and as one over a loopback server wrapping it.
async fn embedded_and_http(backend: Arc<dyn Backend>) -> Vec<(&'static str, Client)> {
    let remote = sandcove_conformance::served(backend.clone()).await;
    vec![
        ("embedded", Client::new(backend)),
        ("http", Client::new(Arc::new(remote) as Arc<dyn Backend>)),
    ]
}

/// `result` is the one refusal the capability layer gives for `feature`.
#[track_caller]
fn assert_refused<T: std::fmt::Debug>(result: Result<T>, feature: Feature, how: &str) {
    match result {
        Err(Error::NotSupported {
            feature: named,
            alternative,
        }) => {
            assert_eq!(named, feature.name(), "{how}: {feature:?}");
            assert_eq!(alternative, feature.alternative(), "{how}: {feature:?}");
        }
        other => panic!("{how}: {feature:?} was not refused as unsupported: {other:?}"),
    }
}

/// On a backend that reports a feature missing, every call needing it is refused by the
/// client with the same error, embedded and over HTTP, and nothing reaches the backend: the
/// engine under the mask has every feature, so a call that got through would take effect.
#[tokio::test]
async fn a_missing_capability_is_refused_before_dispatch() {
    let engine: Arc<dyn Backend> = Arc::new(LocalBackend::new().expect("local engine"));
    let masked: Arc<dyn Backend> = Arc::new(Passthrough {
        inner: engine.clone(),
        adapt: Without {
            off: MASKABLE.to_vec(),
        },
    });
    for (how, client) in embedded_and_http(masked).await {
        let caps = client.ready().await.expect("ready");
        for feature in MASKABLE {
            assert!(!caps.supports(feature), "{how}: {feature:?} is masked");
        }
        let label = unique("surface-caps");
        let refused_creates = [
            (
                test_options(&label).volume(VolumeMount::new("surface-vol", "/data")),
                Feature::Volumes,
            ),
            (
                test_options(&label).snapshot("surface-snap"),
                Feature::Snapshots,
            ),
            (
                test_options(&label).on_timeout(TimeoutAction::Pause),
                Feature::Pause,
            ),
            (
                test_options(&label).network(NetworkPolicy::Host),
                Feature::HostNetwork,
            ),
            (
                test_options(&label).resources(Resources::default().max_processes(64)),
                Feature::ProcessLimit,
            ),
            (
                test_options(&label).resources(Resources::default().memory_mib(256)),
                Feature::MemoryLimit,
            ),
            (
                test_options(&label).resources(Resources::default().cpu(1.0)),
                Feature::CpuLimit,
            ),
        ];
        for (options, feature) in refused_creates {
            assert_refused(client.create(options).await, feature, how);
        }
        let mine = ListOptions::default().label("conformance", label.clone());
        assert!(
            engine.list(mine.clone()).await.expect("list").is_empty(),
            "{how}: a refused create made a sandbox"
        );
        assert_refused(
            client.create_volume("surface-vol").await,
            Feature::Volumes,
            how,
        );
        assert_refused(client.volumes().await, Feature::Volumes, how);
        assert_refused(client.snapshots().await, Feature::Snapshots, how);
        let before_volumes = engine.list_volumes().await.expect("volumes");
        assert!(
            !before_volumes.iter().any(|v| v.name == "surface-vol"),
            "{how}: a refused create_volume made a volume"
        );

        let sandbox = client.create(test_options(&label)).await.expect("create");
        let id = sandbox.id().to_string();
        assert_refused(
            sandbox
                .run("touch pty-ran")
                .pty(PtySize { cols: 80, rows: 24 })
                .await,
            Feature::Pty,
            how,
        );
        assert_refused(sandbox.pause().await, Feature::Pause, how);
        assert_refused(sandbox.metrics().await, Feature::Metrics, how);
        assert_refused(
            sandbox
                .watch("/workspace", WatchOptions::default())
                .await
                .map(drop),
            Feature::Watch,
            how,
        );
        assert_refused(
            sandbox.expose_port(PreviewOptions::new(8000)).await,
            Feature::Previews,
            how,
        );
        assert_refused(sandbox.previews().await, Feature::Previews, how);
        assert_refused(sandbox.snapshot(None).await, Feature::Snapshots, how);
        assert_refused(
            sandbox.fork(test_options(&label)).await,
            Feature::Snapshots,
            how,
        );
        // Nothing of it happened on the engine.
        assert_eq!(
            engine.get(&id).await.expect("info").state,
            SandboxState::Running,
            "{how}: a refused pause paused"
        );
        assert!(
            engine
                .list_previews(&id)
                .await
                .expect("previews")
                .is_empty(),
            "{how}: a refused preview was exposed"
        );
        assert_eq!(
            engine.list(mine.clone()).await.expect("list").len(),
            1,
            "{how}: a refused fork made a sandbox"
        );
        assert!(
            engine
                .list_processes(&id)
                .await
                .expect("processes")
                .is_empty(),
            "{how}: a refused pty process was started"
        );
        assert!(
            !engine
                .list_snapshots()
                .await
                .expect("snapshots")
                .iter()
                .any(|s| s.sandbox_id == id),
            "{how}: a refused snapshot was taken"
        );
        // What the backend has still works through the same client.
        assert_eq!(sandbox.run("echo ok").await.expect("run").stdout, b"ok\n");
        sandbox.destroy().await.expect("destroy");
    }
}

/// The un-isolated engine lacks volumes, snapshots and pausing (its capabilities say so): the
/// client refuses them with the capability layer's error, the same embedded and over HTTP,
/// instead of each path's own wording.
#[tokio::test]
async fn the_unisolated_engine_is_refused_as_its_capabilities_say() {
    let dir = sandcove::backend::local::default_state_dir().with_extension("unisolated");
    let engine: Arc<dyn Backend> =
        Arc::new(LocalBackend::unisolated(dir).expect("un-isolated engine"));
    for (how, client) in embedded_and_http(engine.clone()).await {
        let caps = client.ready().await.expect("ready");
        assert!(!caps.isolated && !caps.volumes && !caps.snapshots && !caps.pause);
        let label = unique("surface-unisolated");
        assert_refused(
            client
                .create(test_options(&label).volume(VolumeMount::new("v", "/data")))
                .await,
            Feature::Volumes,
            how,
        );
        assert_refused(
            client.create(test_options(&label).auto_resume(true)).await,
            Feature::Pause,
            how,
        );
        assert_refused(client.create_volume("v").await, Feature::Volumes, how);
        let sandbox = client.create(test_options(&label)).await.expect("create");
        assert_refused(sandbox.pause().await, Feature::Pause, how);
        assert_refused(sandbox.snapshot(None).await, Feature::Snapshots, how);
        assert_refused(
            sandbox.fork(test_options(&label)).await,
            Feature::Snapshots,
            how,
        );
        let mine = ListOptions::default().label("conformance", label.clone());
        assert_eq!(
            engine.list(mine).await.expect("list").len(),
            1,
            "{how}: only the plain create made a sandbox"
        );
        sandbox.destroy().await.expect("destroy");
    }
}

/// A handle made from an id alone reaches processes by tag and files with options: what the
/// facades use instead of the backend.
#[tokio::test]
async fn a_handle_by_id_reaches_processes_by_tag_and_files_with_options() {
    for (how, client) in clients().await {
        let made = client
            .create(test_options(&unique("surface")))
            .await
            .expect("create");
        let sandbox = client.sandbox(made.id());
        let tag = unique("echo");
        let mut handle = sandbox
            .spawn("read line; echo \"got $line\"")
            .tag(tag.clone())
            .stdin(true)
            .await
            .expect("spawn");
        sandbox
            .write_stdin(ProcessSelector::Tag(tag.clone()), b"one\n".to_vec())
            .await
            .expect("stdin by tag");
        sandbox
            .close_stdin(ProcessSelector::Tag(tag.clone()))
            .await
            .expect("close by tag");
        let mut stdout = Vec::new();
        while let Some(event) = handle.next().await {
            if let ProcessEvent::Stdout(bytes) = event.expect("event") {
                stdout.extend(bytes);
            }
        }
        assert_eq!(stdout, b"got one\n", "{how}");
        let err = sandbox
            .signal(ProcessSelector::Tag(unique("nobody")), Signal::Term)
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::NotFound, "{how}: {err}");

        sandbox
            .mkdir_with("a/b", MkdirOptions::default().mode(0o700))
            .await
            .expect("mkdir");
        assert_eq!(
            sandbox.stat("a/b").await.expect("stat").mode,
            0o700,
            "{how}"
        );
        sandbox.write("a/b/c", b"x".to_vec()).await.expect("write");
        let deep = sandbox
            .list_dir_with("a", ListDirOptions::default().depth(2))
            .await
            .expect("list");
        assert_eq!(deep.len(), 2, "{how}: {deep:?}");
        let shallow = sandbox.list_dir("a", 1).await.expect("list");
        assert_eq!(shallow.len(), 1, "{how}: {shallow:?}");
        assert_eq!(
            sandbox
                .read_with("a/b/c", ReadOptions::default())
                .await
                .expect("read"),
            b"x"
        );
        let err = sandbox
            .remove_with("a", RemoveOptions::default())
            .await
            .unwrap_err();
        assert_ne!(err.code(), ErrorCode::NotFound, "{how}: {err}");
        sandbox
            .remove_with("a", RemoveOptions::default().recursive(true))
            .await
            .expect("remove recursively");
        assert!(
            !sandbox
                .exists_with("a", StatOptions::default())
                .await
                .expect("exists"),
            "{how}"
        );
        sandbox.destroy().await.expect("destroy");
    }
}

/// The in-memory file calls are bounded: 1 MiB by default (a larger file is `FileTooLarge`,
/// refused before it is sent, naming the streaming call), raised per call and per client up to
/// 256 MiB (more is refused as an argument); the streaming calls are not bounded by it.
#[tokio::test]
async fn in_memory_file_calls_are_bounded_and_say_to_stream() {
    for (how, client) in clients().await {
        let sandbox = client
            .create(test_options(&unique("membound")))
            .await
            .expect("create");
        let big = vec![7u8; (sandcove::DEFAULT_MEMORY_FILE_BYTES + 1) as usize];
        let err = sandbox.write("big.bin", big.clone()).await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::FileTooLarge, "{how}: {err}");
        assert!(err.to_string().contains("write_stream"), "{how}: {err}");
        assert!(
            !sandbox.exists("big.bin").await.expect("exists"),
            "{how}: nothing sent"
        );
        let stream: ByteStream = Box::pin(futures::stream::iter([Ok(big.clone())]));
        sandbox
            .write_stream("big.bin", stream, WriteOptions::default())
            .await
            .expect("a streamed write is not bounded by the in-memory bound");
        let err = sandbox.read("big.bin").await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::FileTooLarge, "{how}: {err}");
        assert!(err.to_string().contains("read_stream"), "{how}: {err}");
        let per_call = ReadOptions::default().max_bytes(2 << 20);
        assert_eq!(
            sandbox.read_with("big.bin", per_call).await.expect("read"),
            big,
            "{how}"
        );
        let raised = client
            .clone()
            .with_memory_file_bytes(2 << 20)
            .expect("a bound within the maximum");
        let handle = raised.sandbox(sandbox.id());
        assert_eq!(handle.read("big.bin").await.expect("read").len(), big.len());
        handle
            .write("again.bin", big.clone())
            .await
            .expect("a write within the raised bound");
        let too_much = sandcove::MAX_MEMORY_FILE_BYTES + 1;
        let err = client.clone().with_memory_file_bytes(too_much).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument, "{how}: {err}");
        let err = sandbox
            .read_with("big.bin", ReadOptions::default().max_bytes(too_much))
            .await
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument, "{how}: {err}");
        sandbox.destroy().await.expect("destroy");
    }
}
