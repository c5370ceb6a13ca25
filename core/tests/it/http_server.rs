//! The server: authentication on every route, body limits, route ↔ backend-method mapping,
//! the OpenAPI document, idempotent creates, shutdown, and many clients at once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use sandcove::backend::http::{IDEMPOTENCY_HEADER, OPENAPI_PATH};
use sandcove::server::{LocalServer, ServerConfig};
use sandcove::{
    Backend, ByteStream, Capabilities, ChmodOptions, Command, CreateOptions, Error, ErrorCode,
    FileStat, HttpBackend, ListDirOptions, ListOptions, LocalBackend, Metrics, MkdirOptions,
    Preview, PreviewOptions, PreviewToken, PreviewTokenOptions, ProcessInfo, ProcessSelector,
    ProcessSpec, ProcessStream, PtySize, RemoveOptions, ResizePtyOptions, ResourceKind, Result,
    SandboxInfo, SetLabelsOptions, SetTimeoutOptions, Signal, SignalOptions, SnapshotInfo,
    SnapshotOptions, Tombstone, VolumeInfo, WatchOptions, WatchStream, WriteOptions,
    WriteStdinOptions,
};
use sandcove_conformance::{test_options, unique};
use serde_json::Value;

/// A backend that answers every call `NotSupported { feature: <method name> }` and counts
/// the calls that reached it.
#[derive(Debug, Default)]
struct Refuser {
    calls: AtomicUsize,
}

impl Refuser {
    fn no<T>(&self, method: &str) -> Result<T> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Err(Error::not_supported(method, "nothing: a test stub"))
    }
}

#[async_trait]
impl Backend for Refuser {
    fn capabilities(&self) -> Capabilities {
        LocalBackend::new().unwrap().capabilities()
    }
    async fn ready(&self) -> Result<Capabilities> {
        Ok(self.capabilities())
    }
    async fn create(&self, _: CreateOptions) -> Result<SandboxInfo> {
        self.no("create")
    }
    async fn get(&self, _: &str) -> Result<SandboxInfo> {
        self.no("get")
    }
    async fn list(&self, _: ListOptions) -> Result<Vec<SandboxInfo>> {
        self.no("list")
    }
    async fn set_timeout(&self, _: &str, _: SetTimeoutOptions) -> Result<SandboxInfo> {
        self.no("set_timeout")
    }
    async fn set_on_timeout(
        &self,
        _: &str,
        _: sandcove::SetOnTimeoutOptions,
    ) -> Result<SandboxInfo> {
        self.no("set_on_timeout")
    }
    async fn set_labels(&self, _: &str, _: SetLabelsOptions) -> Result<SandboxInfo> {
        self.no("set_labels")
    }
    async fn destroy(&self, _: &str) -> Result<()> {
        self.no("destroy")
    }
    async fn spawn(&self, _: &str, _: ProcessSpec) -> Result<ProcessStream> {
        self.no("spawn")
    }
    async fn attach(&self, _: &str, _: ProcessSelector) -> Result<ProcessStream> {
        self.no("attach")
    }
    async fn write_stdin(&self, _: &str, _: ProcessSelector, _: WriteStdinOptions) -> Result<()> {
        self.no("write_stdin")
    }
    async fn close_stdin(&self, _: &str, _: ProcessSelector) -> Result<()> {
        self.no("close_stdin")
    }
    async fn signal(&self, _: &str, _: ProcessSelector, _: SignalOptions) -> Result<()> {
        self.no("signal")
    }
    async fn list_processes(&self, _: &str) -> Result<Vec<ProcessInfo>> {
        self.no("list_processes")
    }
    async fn read_file(&self, _: &str, _: &str, _: sandcove::ReadOptions) -> Result<ByteStream> {
        self.no("read_file")
    }
    async fn write_file(
        &self,
        _: &str,
        _: &str,
        _: ByteStream,
        _: WriteOptions,
    ) -> Result<FileStat> {
        self.no("write_file")
    }
    async fn list_dir(&self, _: &str, _: &str, _: ListDirOptions) -> Result<Vec<FileStat>> {
        self.no("list_dir")
    }
    async fn stat(&self, _: &str, _: &str, _: sandcove::StatOptions) -> Result<FileStat> {
        self.no("stat")
    }
    async fn mkdir(&self, _: &str, _: &str, _: MkdirOptions) -> Result<FileStat> {
        self.no("mkdir")
    }
    async fn remove(&self, _: &str, _: &str, _: RemoveOptions) -> Result<()> {
        self.no("remove")
    }
    async fn rename(
        &self,
        _: &str,
        _: &str,
        _: &str,
        _: sandcove::RenameOptions,
    ) -> Result<FileStat> {
        self.no("rename")
    }
    async fn copy(&self, _: &str, _: &str, _: &str, _: sandcove::CopyOptions) -> Result<FileStat> {
        self.no("copy")
    }
    async fn chmod(&self, _: &str, _: &str, _: ChmodOptions) -> Result<FileStat> {
        self.no("chmod")
    }
    async fn pause(&self, _: &str) -> Result<SandboxInfo> {
        self.no("pause")
    }
    async fn resume(&self, _: &str) -> Result<SandboxInfo> {
        self.no("resume")
    }
    async fn stop(&self, _: &str) -> Result<SandboxInfo> {
        self.no("stop")
    }
    async fn start(&self, _: &str) -> Result<SandboxInfo> {
        self.no("start")
    }
    async fn update_annotations(
        &self,
        _: &str,
        _: sandcove::AnnotationUpdate,
    ) -> Result<std::collections::BTreeMap<String, String>> {
        self.no("update_annotations")
    }
    async fn metrics(&self, _: &str) -> Result<Metrics> {
        self.no("metrics")
    }
    async fn resize_pty(&self, _: &str, _: ProcessSelector, _: ResizePtyOptions) -> Result<()> {
        self.no("resize_pty")
    }
    async fn watch(&self, _: &str, _: &str, _: WatchOptions) -> Result<WatchStream> {
        self.no("watch")
    }
    async fn expose_port(&self, _: &str, _: PreviewOptions) -> Result<Preview> {
        self.no("expose_port")
    }
    async fn list_previews(&self, _: &str) -> Result<Vec<Preview>> {
        self.no("list_previews")
    }
    async fn close_preview(&self, _: &str, _: u16) -> Result<()> {
        self.no("close_preview")
    }
    async fn create_preview_token(
        &self,
        _: &str,
        _: u16,
        _: PreviewTokenOptions,
    ) -> Result<PreviewToken> {
        self.no("create_preview_token")
    }
    async fn create_file_url(
        &self,
        _: &str,
        _: sandcove::FileUrlOptions,
    ) -> Result<sandcove::FileUrl> {
        self.no("create_file_url")
    }
    async fn revoke_preview_token(&self, _: &str, _: u16, _: &str) -> Result<()> {
        self.no("revoke_preview_token")
    }
    async fn snapshot(&self, _: &str, _: SnapshotOptions) -> Result<SnapshotInfo> {
        self.no("snapshot")
    }
    async fn list_snapshots(&self) -> Result<Vec<SnapshotInfo>> {
        self.no("list_snapshots")
    }
    async fn delete_snapshot(&self, _: &str) -> Result<()> {
        self.no("delete_snapshot")
    }
    async fn fork(&self, _: &str, _: CreateOptions) -> Result<SandboxInfo> {
        self.no("fork")
    }
    async fn create_volume(&self, _: &str) -> Result<VolumeInfo> {
        self.no("create_volume")
    }
    async fn get_volume(&self, _: &str) -> Result<VolumeInfo> {
        self.no("get_volume")
    }
    async fn list_volumes(&self) -> Result<Vec<VolumeInfo>> {
        self.no("list_volumes")
    }
    async fn delete_volume(&self, _: &str) -> Result<()> {
        self.no("delete_volume")
    }
    async fn list_images(&self) -> Result<Vec<sandcove::ImageSummary>> {
        self.no("list_images")
    }
    async fn pull_image(&self, _: &str) -> Result<sandcove::ImageSummary> {
        self.no("pull_image")
    }
    async fn import_image(
        &self,
        _: ByteStream,
        _: Option<&str>,
    ) -> Result<Vec<sandcove::ImageSummary>> {
        self.no("import_image")
    }
    async fn image_availability(&self, _: &str) -> Result<sandcove::ImageAvailability> {
        self.no("image_availability")
    }
    async fn inspect_image(&self, _: &str) -> Result<sandcove::ImageDetails> {
        self.no("inspect_image")
    }
    async fn remove_image(&self, _: &str) -> Result<()> {
        self.no("remove_image")
    }
    async fn prune_images(&self) -> Result<sandcove::ImagePruneReport> {
        self.no("prune_images")
    }
    async fn observe(&self, _: &sandcove::OperationId) -> Result<sandcove::OperationStatus> {
        self.no("observe")
    }

    async fn tombstone(&self, _: ResourceKind, _: &str) -> Result<Option<Tombstone>> {
        self.no("tombstone")
    }
}

const KEY: &str = "the-right-key";

/// Every async method of the `Backend` trait.
/// The native API's signed file URL operations (see `every_documented_route_reaches_its_backend_method`).
const SIGNED_URL_OPS: [&str; 4] = [
    "create_file_url",
    "read_file_url",
    "write_file_url",
    "post_file_url",
];

const METHODS: [&str; 51] = [
    "create",
    "get",
    "list",
    "set_timeout",
    "set_on_timeout",
    "set_labels",
    "update_annotations",
    "destroy",
    "spawn",
    "attach",
    "write_stdin",
    "close_stdin",
    "signal",
    "list_processes",
    "read_file",
    "write_file",
    "list_dir",
    "stat",
    "mkdir",
    "remove",
    "rename",
    "copy",
    "chmod",
    "pause",
    "resume",
    "stop",
    "start",
    "metrics",
    "resize_pty",
    "watch",
    "expose_port",
    "list_previews",
    "close_preview",
    "create_preview_token",
    "revoke_preview_token",
    "snapshot",
    "list_snapshots",
    "delete_snapshot",
    "fork",
    "create_volume",
    "get_volume",
    "list_volumes",
    "delete_volume",
    "list_images",
    "pull_image",
    "import_image",
    "image_availability",
    "inspect_image",
    "remove_image",
    "prune_images",
    "tombstone",
];

async fn start(backend: Arc<dyn Backend>, config: ServerConfig) -> LocalServer {
    LocalServer::start(backend, config).await.expect("server")
}

/// Every documented operation as (method, concrete path, query, body).
fn operations(doc: &Value) -> Vec<(String, String, String, &'static str, Vec<u8>)> {
    let mut ops = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let concrete = path
                .replace("{id}", "sb1")
                .replace("{port}", "8080")
                .replace("{snapshot_id}", "snap1")
                .replace("{name}", "vol1")
                .replace("{op}", "op1")
                .replace("{kind}", "sandbox");
            let mut query = Vec::new();
            for p in op["parameters"].as_array().unwrap() {
                if p["in"] == "query" {
                    let value = match p["name"].as_str().unwrap() {
                        "pid" => "7",
                        "path" => "/workspace/x",
                        "depth" => "1",
                        "recursive" => "false",
                        "filter" => "{}",
                        "options" => "{}",
                        _ => continue,
                    };
                    query.push(format!("{}={}", p["name"].as_str().unwrap(), value));
                }
            }
            let op_name = op["operationId"].as_str().unwrap().to_string();
            let body: Vec<u8> = match op_name.as_str() {
                "spawn" => br#"{"command":{"argv":["true"]},"cwd":null,"envs":{},"user":null,"tag":null,"stdin":false,"timeout":null}"#.to_vec(),
                "set_timeout" => br#"{"timeout":60}"#.to_vec(),
                "set_on_timeout" => br#"{"on_timeout":"destroy"}"#.to_vec(),
                "set_labels" => br#"{"labels":{"a":"b"}}"#.to_vec(),
                "signal" => br#"{"signal":"TERM"}"#.to_vec(),
                "resize_pty" => br#"{"cols":80,"rows":24}"#.to_vec(),
                "mkdir" | "chmod" => br#"{"path":"/workspace/d","mode":448}"#.to_vec(),
                "rename" | "copy" => br#"{"from":"/a","to":"/b"}"#.to_vec(),
                "expose_port" => br#"{"port":8080}"#.to_vec(),
                "pull_image" | "image_availability" | "inspect_image" | "remove_image" => {
                    br#"{"reference":"python:3.12-slim"}"#.to_vec()
                }
                "revoke_preview_token" => br#"{"token":"t"}"#.to_vec(),
                "create_volume" => br#"{"name":"vol1"}"#.to_vec(),
                "write_stdin" | "write_file" => b"bytes".to_vec(),
                _ => b"{}".to_vec(),
            };
            // The server answers these itself (observe: from its record of operations).
            let kind = if ["openapi", "capabilities", "observe"].contains(&op_name.as_str()) {
                "local"
            } else {
                "backend"
            };
            ops.push((
                method.to_uppercase(),
                format!("{concrete}?{}", query.join("&")),
                op_name,
                kind,
                body,
            ));
        }
    }
    ops
}

async fn fetch_document(server: &LocalServer) -> Value {
    reqwest::Client::new()
        .get(format!("{}{OPENAPI_PATH}", server.url()))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Each documented route reaches the backend method its operationId names, and the
/// backend's answer (here `NotSupported`) comes back unchanged; undocumented routes are
/// answered by the fallback. Together with the unit test comparing the route list with the
/// document, this shows the document and the router agree.
#[tokio::test]
async fn every_documented_route_reaches_its_backend_method() {
    let refuser = Arc::new(Refuser::default());
    let server = start(refuser.clone(), ServerConfig::new(KEY)).await;
    let doc = fetch_document(&server).await;
    // Signed file URLs are the server's own: it signs them with its key (asking the backend
    // only whether the sandbox exists) and serves them with the backend's file calls, the
    // URL alone as credential (the conformance suite and the authorization matrix cover them).
    let ops: Vec<_> = operations(&doc)
        .into_iter()
        .filter(|o| !SIGNED_URL_OPS.contains(&o.2.as_str()))
        .collect();
    let mut documented: Vec<&str> = ops.iter().map(|o| o.2.as_str()).collect();
    documented.sort_unstable();
    let mut expected: Vec<&str> = METHODS.to_vec();
    expected.extend(["openapi", "capabilities", "observe"]);
    expected.sort_unstable();
    assert_eq!(documented, expected, "one route per backend method");
    let http = reqwest::Client::new();
    for (method, path, op, kind, body) in &ops {
        let response = http
            .request(method.parse().unwrap(), format!("{}{path}", server.url()))
            .bearer_auth(KEY)
            .body(body.clone())
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let answer: Value = response.json().await.unwrap();
        if *kind == "local" {
            assert_eq!(status, 200, "{method} {path}");
            continue;
        }
        assert_eq!(status, 501, "{method} {path}: {answer}");
        assert_eq!(answer["code"], "not_supported", "{method} {path}");
        assert_eq!(answer["fields"]["feature"], op.as_str(), "{method} {path}");
    }
    assert_eq!(
        refuser.calls.load(Ordering::SeqCst),
        ops.len() - 3,
        "each backend route called the backend once"
    );
    for (method, path) in [
        ("GET", "/v1/nothing"),
        ("PATCH", "/v1/sandboxes/x"),
        ("GET", "/"),
    ] {
        let response = http
            .request(method.parse().unwrap(), format!("{}{path}", server.url()))
            .bearer_auth(KEY)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let answer: Value = response.json().await.expect("a JSON error body");
        assert!(matches!(status, 404 | 405), "{method} {path}: {status}");
        assert!(answer["code"].is_string(), "{answer}");
    }
}

/// A missing or wrong key is 401 on every route (the document and unknown paths included),
/// and the backend is never called.
#[tokio::test]
async fn a_missing_or_wrong_key_is_401_everywhere_and_nothing_happens() {
    let refuser = Arc::new(Refuser::default());
    let server = start(refuser.clone(), ServerConfig::new(KEY)).await;
    let doc = fetch_document(&server).await;
    let mut ops = operations(&doc);
    ops.push((
        "GET".into(),
        "/v1/unknown".into(),
        "unknown".into(),
        "",
        vec![],
    ));
    let http = reqwest::Client::new();
    let wrong: [Option<&str>; 5] = [
        None,
        Some("Bearer wrong-key"),
        Some("Bearer the-right-ke"),
        Some("Basic the-right-key"),
        Some("Bearer "),
    ];
    for (method, path, _, _, body) in &ops {
        for auth in wrong {
            let mut request = http
                .request(method.parse().unwrap(), format!("{}{path}", server.url()))
                .body(body.clone());
            if let Some(a) = auth {
                request = request.header("authorization", a);
            }
            let response = request.send().await.unwrap();
            assert_eq!(response.status().as_u16(), 401, "{method} {path} {auth:?}");
            assert_eq!(response.headers()["www-authenticate"], "Bearer");
            let answer: Value = response.json().await.unwrap();
            assert_eq!(answer["code"], "unauthenticated");
        }
    }
    assert_eq!(refuser.calls.load(Ordering::SeqCst), 0, "nothing happened");
    let err = HttpBackend::connect(&server.url(), "wrong")
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unauthenticated);
}

/// A refused request whose declared body is larger than the server would ever read to keep
/// the connection is answered at once, and the connection closed: its body is neither
/// solicited (no `100 Continue` to a client without the key) nor waited for.
#[tokio::test]
async fn a_refused_request_with_a_large_body_is_answered_without_soliciting_it() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let refuser = Arc::new(Refuser::default());
    let server = start(refuser.clone(), ServerConfig::new(KEY)).await;
    let mut conn = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
    conn.write_all(
        b"POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
          Content-Length: 1048576\r\nExpect: 100-continue\r\n\r\n",
    )
    .await
    .unwrap();
    // Bounded only so a server that keeps the connection open fails instead of hanging.
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(60), conn.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 401"),
        "the refusal comes first, nothing solicits the body: {answer:?}"
    );
    assert!(read.is_ok(), "the connection is closed after the answer");
    assert_eq!(refuser.calls.load(Ordering::SeqCst), 0, "nothing happened");
}

/// The client maps every trait method onto its route and the answer back onto the error.
#[tokio::test]
async fn every_client_method_round_trips_the_backends_answer() {
    let refuser = Arc::new(Refuser::default());
    let server = start(refuser.clone(), ServerConfig::new(KEY)).await;
    let c = HttpBackend::connect(&server.url(), KEY).await.unwrap();
    let sel = || ProcessSelector::Tag("t/1 ?&".into());
    let data = || -> ByteStream { Box::pin(futures::stream::iter(vec![Ok(b"x".to_vec())])) };
    let spec = ProcessSpec::new(Command::argv(["true"]));
    let results: Vec<(&str, Result<()>)> = vec![
        ("create", c.create(Default::default()).await.map(drop)),
        ("get", c.get("a").await.map(drop)),
        ("list", c.list(Default::default()).await.map(drop)),
        (
            "set_timeout",
            c.set_timeout("a", SetTimeoutOptions::new(Duration::from_secs(5)))
                .await
                .map(drop),
        ),
        (
            "set_on_timeout",
            c.set_on_timeout(
                "a",
                sandcove::SetOnTimeoutOptions::new(sandcove::TimeoutAction::Destroy),
            )
            .await
            .map(drop),
        ),
        (
            "set_labels",
            c.set_labels("a", Default::default()).await.map(drop),
        ),
        (
            "update_annotations",
            c.update_annotations("a", sandcove::AnnotationUpdate::set("k", "v"))
                .await
                .map(drop),
        ),
        ("destroy", c.destroy("a").await),
        ("spawn", c.spawn("a", spec).await.map(drop)),
        ("attach", c.attach("a", sel()).await.map(drop)),
        (
            "write_stdin",
            c.write_stdin("a", sel(), WriteStdinOptions::new(b"x"))
                .await,
        ),
        (
            "close_stdin",
            c.close_stdin("a", ProcessSelector::Pid(3)).await,
        ),
        (
            "signal",
            c.signal("a", sel(), SignalOptions::new(Signal::Int)).await,
        ),
        ("list_processes", c.list_processes("a").await.map(drop)),
        (
            "read_file",
            c.read_file("a", "/x y", Default::default()).await.map(drop),
        ),
        (
            "write_file",
            c.write_file("a", "/x", data(), Default::default())
                .await
                .map(drop),
        ),
        (
            "list_dir",
            c.list_dir("a", "/", Default::default()).await.map(drop),
        ),
        ("stat", c.stat("a", "/", Default::default()).await.map(drop)),
        (
            "mkdir",
            c.mkdir("a", "/d", Default::default()).await.map(drop),
        ),
        ("remove", c.remove("a", "/d", Default::default()).await),
        (
            "rename",
            c.rename("a", "/d", "/e", Default::default())
                .await
                .map(drop),
        ),
        (
            "copy",
            c.copy("a", "/d", "/e", Default::default()).await.map(drop),
        ),
        (
            "chmod",
            c.chmod("a", "/d", ChmodOptions::new(0o700)).await.map(drop),
        ),
        ("pause", c.pause("a").await.map(drop)),
        ("resume", c.resume("a").await.map(drop)),
        ("stop", c.stop("a").await.map(drop)),
        ("start", c.start("a").await.map(drop)),
        ("metrics", c.metrics("a").await.map(drop)),
        (
            "resize_pty",
            c.resize_pty(
                "a",
                sel(),
                ResizePtyOptions::new(PtySize { cols: 1, rows: 1 }),
            )
            .await,
        ),
        (
            "watch",
            c.watch("a", "/", Default::default()).await.map(drop),
        ),
        (
            "expose_port",
            c.expose_port("a", Default::default()).await.map(drop),
        ),
        ("list_previews", c.list_previews("a").await.map(drop)),
        ("close_preview", c.close_preview("a", 80).await),
        (
            "create_preview_token",
            c.create_preview_token("a", 80, PreviewTokenOptions::default().expires_at(5))
                .await
                .map(drop),
        ),
        (
            "revoke_preview_token",
            c.revoke_preview_token("a", 80, "t").await,
        ),
        (
            "snapshot",
            c.snapshot("a", SnapshotOptions::default().name("n"))
                .await
                .map(drop),
        ),
        ("list_snapshots", c.list_snapshots().await.map(drop)),
        ("delete_snapshot", c.delete_snapshot("s").await),
        ("fork", c.fork("a", Default::default()).await.map(drop)),
        ("create_volume", c.create_volume("v").await.map(drop)),
        ("get_volume", c.get_volume("v").await.map(drop)),
        ("list_volumes", c.list_volumes().await.map(drop)),
        ("delete_volume", c.delete_volume("v").await),
        ("list_images", c.list_images().await.map(drop)),
        (
            "pull_image",
            c.pull_image("python:3.12-slim").await.map(drop),
        ),
        (
            "import_image",
            c.import_image(data(), Some("test.local/x:1"))
                .await
                .map(drop),
        ),
        (
            "image_availability",
            c.image_availability("python:3.12-slim").await.map(drop),
        ),
        (
            "inspect_image",
            c.inspect_image("python:3.12-slim").await.map(drop),
        ),
        ("remove_image", c.remove_image("python:3.12-slim").await),
        ("prune_images", c.prune_images().await.map(drop)),
        (
            "tombstone",
            c.tombstone(ResourceKind::Sandbox, "a").await.map(drop),
        ),
    ];
    let called: Vec<&str> = results.iter().map(|r| r.0).collect();
    assert_eq!(called, METHODS, "every method is exercised");
    for (method, result) in &results {
        match result {
            Err(Error::NotSupported { feature, .. }) => assert_eq!(feature, method),
            other => panic!("{method}: {other:?}"),
        }
    }
    assert_eq!(
        refuser.calls.load(Ordering::SeqCst),
        results.len(),
        "one backend call per client call: NotSupported is not retried"
    );
    // A pull with progress is the pull route streaming: the backend's refusal arrives as
    // the stream's error frame, typed as it was.
    let streamed = c
        .pull_image_with_progress("python:3.12-slim", &|_| {})
        .await;
    match streamed {
        Err(Error::NotSupported { feature, .. }) => assert_eq!(feature, "pull_image"),
        other => panic!("pull_image_with_progress: {other:?}"),
    }
}

/// Bodies over the limits are 413 before the backend sees them.
#[tokio::test]
async fn oversized_bodies_are_413() {
    let refuser = Arc::new(Refuser::default());
    let mut config = ServerConfig::new(KEY);
    config.max_body_bytes = 1024;
    config.max_upload_bytes = 2048;
    let server = start(refuser.clone(), config).await;
    let http = reqwest::Client::new();
    let big_json = format!(r#"{{"labels":{{"k":"{}"}}}}"#, "x".repeat(4096));
    let cases = [
        ("POST", "/v1/sandboxes", big_json.into_bytes()),
        (
            "POST",
            "/v1/sandboxes/sb1/processes/stdin?pid=1",
            vec![0u8; 4096],
        ),
        ("PUT", "/v1/sandboxes/sb1/files?path=/x", vec![1u8; 4096]),
        ("POST", "/v1/images/import", vec![1u8; 4096]),
    ];
    for (method, path, body) in cases {
        let response = http
            .request(method.parse().unwrap(), format!("{}{path}", server.url()))
            .bearer_auth(KEY)
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 413, "{method} {path}");
        let answer: Value = response.json().await.unwrap();
        // A file upload or image archive says what and its bound; other bodies are bad
        // arguments.
        let code = if path.contains("/files") || path.contains("/images/import") {
            "file_too_large"
        } else {
            "invalid_argument"
        };
        assert_eq!(answer["code"], code, "{method} {path}");
    }
    assert_eq!(refuser.calls.load(Ordering::SeqCst), 0);
    // A streamed upload without a length is cut at the limit too.
    let engine: Arc<dyn Backend> = Arc::new(LocalBackend::new().unwrap());
    let mut config = ServerConfig::new(KEY);
    config.max_upload_bytes = 2048;
    let server = start(engine.clone(), config).await;
    let client = HttpBackend::connect(&server.url(), KEY).await.unwrap();
    let id = client
        .create(test_options(&unique("limit")))
        .await
        .unwrap()
        .id;
    let chunks: Vec<Result<Vec<u8>>> = (0..8).map(|_| Ok(vec![2u8; 1024])).collect();
    let err = client
        .write_file(
            &id,
            "big",
            Box::pin(futures::stream::iter(chunks)),
            Default::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::FileTooLarge, "{err}");
    // Whether the sandbox survives an aborted upload is the engine's business (checked by
    // its own tests); here only the refusal matters.
    let _ = client.destroy(&id).await;
}

/// The same idempotency key makes one sandbox, however often it is sent; reusing it for a
/// different request is refused.
#[tokio::test]
async fn a_repeated_create_key_makes_one_sandbox() {
    let engine: Arc<dyn Backend> = Arc::new(LocalBackend::new().unwrap());
    let server = start(engine.clone(), ServerConfig::new(KEY)).await;
    let label = unique("idem");
    let body = serde_json::to_vec(&test_options(&label)).unwrap();
    let http = reqwest::Client::new();
    let key = unique("key");
    let send = |body: Vec<u8>| {
        http.post(format!("{}/v1/sandboxes", server.url()))
            .bearer_auth(KEY)
            .header(IDEMPOTENCY_HEADER, &key)
            .body(body)
            .send()
    };
    let (a, b) = tokio::join!(send(body.clone()), send(body.clone()));
    let c = send(body.clone()).await.unwrap();
    let ids: Vec<String> = vec![
        a.unwrap().json::<SandboxInfo>().await.unwrap().id,
        b.unwrap().json::<SandboxInfo>().await.unwrap().id,
        c.json::<SandboxInfo>().await.unwrap().id,
    ];
    assert_eq!(ids[0], ids[1]);
    assert_eq!(ids[0], ids[2]);
    let mut filter = ListOptions::default();
    filter.labels.insert("conformance".into(), label.clone());
    assert_eq!(engine.list(filter).await.unwrap().len(), 1, "one sandbox");
    let other = serde_json::to_vec(&test_options("other")).unwrap();
    let refused = send(other).await.unwrap();
    assert_eq!(refused.status().as_u16(), 412);
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(body["code"], "conflict", "{body}");
    engine.destroy(&ids[0]).await.unwrap();
}

/// Retries of a named create (one idempotency key) all get the one sandbox, never a
/// spurious `AlreadyExists` from the name the first attempt took; a create under another key
/// with that name is `AlreadyExists` (409) through the client.
#[tokio::test]
async fn a_retried_named_create_is_not_already_exists() {
    let engine: Arc<dyn Backend> = Arc::new(LocalBackend::new().unwrap());
    let server = start(engine.clone(), ServerConfig::new(KEY)).await;
    let label = unique("idemname");
    let name = unique("n");
    let options = test_options(&label).name(name.clone());
    let body = serde_json::to_vec(&options).unwrap();
    let http = reqwest::Client::new();
    let key = unique("key");
    let send = || {
        http.post(format!("{}/v1/sandboxes", server.url()))
            .bearer_auth(KEY)
            .header(IDEMPOTENCY_HEADER, &key)
            .body(body.clone())
            .send()
    };
    let (a, b) = tokio::join!(send(), send());
    let c = send().await.unwrap();
    let mut ids = Vec::new();
    for response in [a.unwrap(), b.unwrap(), c] {
        assert_eq!(
            response.status().as_u16(),
            200,
            "a retry answers the sandbox"
        );
        let info = response.json::<SandboxInfo>().await.unwrap();
        assert_eq!(info.name.as_deref(), Some(name.as_str()));
        ids.push(info.id);
    }
    assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
    let client = HttpBackend::connect(&server.url(), KEY).await.unwrap();
    let err = client.create(options).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::AlreadyExists, "{err}");
    let mut filter = ListOptions::default();
    filter.labels.insert("conformance".into(), label);
    assert_eq!(engine.list(filter).await.unwrap().len(), 1, "one sandbox");
    engine.destroy(&ids[0]).await.unwrap();
}

/// Stopping the server ends open streams with an error, never a silent short stream, and
/// leaves the sandbox running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_cuts_streams_with_an_error_and_keeps_sandboxes() {
    let engine: Arc<dyn Backend> = Arc::new(LocalBackend::new().unwrap());
    let mut config = ServerConfig::new(KEY);
    config.shutdown_grace = Duration::from_secs(5);
    let server = start(engine.clone(), config).await;
    let client = HttpBackend::connect(&server.url(), KEY).await.unwrap();
    let id = client
        .create(test_options(&unique("stop")))
        .await
        .unwrap()
        .id;
    let spec = ProcessSpec::new(Command::sh("echo started; sleep 60"));
    let mut stream = client.spawn(&id, spec).await.unwrap();
    let first = stream.events.next().await.unwrap().unwrap();
    assert_eq!(first, sandcove::ProcessEvent::Stdout(b"started\n".to_vec()));
    server.stop().await.expect("stops");
    let last = stream.events.next().await.expect("an error item");
    let err = last.expect_err("the cut is an error");
    assert_eq!(err.code(), ErrorCode::Unavailable, "{err}");
    engine
        .get(&id)
        .await
        .expect("the sandbox outlives the server");
    engine.destroy(&id).await.unwrap();
}

/// 50 clients at once each create a sandbox, run a command and destroy it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_clients() {
    let engine: Arc<dyn Backend> = Arc::new(LocalBackend::new().unwrap());
    let server = start(engine, ServerConfig::new(KEY)).await;
    let label = unique("fifty");
    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let url = server.url();
            let label = label.clone();
            tokio::spawn(async move {
                let client = HttpBackend::connect(&url, KEY).await?;
                let sandbox = sandcove::Client::new(Arc::new(client));
                let sb = sandbox.create(test_options(&label)).await?;
                let out = sb
                    .run(ProcessSpec::new(Command::sh(format!("echo client-{i}"))))
                    .await?;
                sb.destroy().await?;
                Ok::<_, Error>(out.stdout)
            })
        })
        .collect();
    for (i, task) in tasks.into_iter().enumerate() {
        let stdout = task
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("client {i}: {e}"));
        assert_eq!(stdout, format!("client-{i}\n").into_bytes());
    }
}

/// Idle limit of the `/echo-brief` route of [`upgrade_router`].
const BRIEF_IDLE: Duration = Duration::from_millis(400);

/// A router whose `/echo` route switches to a raw echo of every byte (`/echo-brief` too, with
/// an idle limit of [`BRIEF_IDLE`]); `/plain` answers `ok`.
fn upgrade_router() -> axum::Router {
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    async fn echo(mut request: axum::extract::Request) -> axum::response::Response {
        let brief = request.uri().path() == "/echo-brief";
        let mut upgrade = match sandcove::server::upgrade::prepare(&mut request) {
            Ok(u) => u,
            Err(e) => return (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
        };
        if brief {
            upgrade = upgrade.idle_limit(BRIEF_IDLE);
        }
        upgrade.run(|mut io| async move {
            let (mut read, mut write) = tokio::io::split(&mut io);
            let _ = tokio::io::copy(&mut read, &mut write).await;
        });
        axum::response::Response::builder()
            .status(StatusCode::SWITCHING_PROTOCOLS)
            .header("connection", "upgrade")
            .header("upgrade", "echo")
            .body(axum::body::Body::empty())
            .unwrap()
    }
    axum::Router::new()
        .route("/echo", axum::routing::get(echo))
        .route("/echo-brief", axum::routing::get(echo))
        .route("/plain", axum::routing::get(|| async { "ok" }))
}

/// Open a connection to `addr` and switch it to the echo protocol.
async fn upgraded(addr: std::net::SocketAddr) -> tokio::net::TcpStream {
    upgraded_at(addr, "/echo").await
}

/// [`upgraded`] on the route at `path`.
async fn upgraded_at(addr: std::net::SocketAddr, path: &str) -> tokio::net::TcpStream {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\nUpgrade: echo\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        assert_eq!(conn.read(&mut byte).await.unwrap(), 1, "head cut: {head:?}");
        head.push(byte[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 101 "),
        "{}",
        String::from_utf8_lossy(&head)
    );
    conn.write_all(b"hello").await.unwrap();
    let mut back = [0u8; 5];
    conn.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"hello", "the connection echoes after the upgrade");
    conn
}

fn upgrade_limits(
    max_connections: usize,
    shutdown_grace: Duration,
) -> sandcove::server::ConnectionLimits {
    sandcove::server::ConnectionLimits {
        max_connections,
        head_timeout: Duration::from_secs(30),
        body_idle_timeout: Duration::from_secs(60),
        write_stall_timeout: Duration::from_secs(60),
        upstream_answer_timeout: Duration::from_secs(60),
        shutdown_grace,
        tls: None,
    }
}

/// An upgraded connection keeps its slot in the connection cap: with a cap of one, a second
/// client waits until the upgraded one ends.
#[tokio::test]
async fn an_upgraded_connection_counts_toward_the_cap() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(sandcove::server::serve_router(
        listener,
        upgrade_router(),
        upgrade_limits(1, Duration::from_secs(5)),
        async move {
            let _ = stopped.await;
        },
    ));
    let first = upgraded(addr).await;
    let mut second = tokio::net::TcpStream::connect(addr).await.unwrap();
    second
        .write_all(b"GET /plain HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut byte = [0u8; 1];
    // Served at once if the upgraded connection had left the cap.
    assert!(
        tokio::time::timeout(Duration::from_millis(500), second.read(&mut byte))
            .await
            .is_err(),
        "a second connection was served while the upgraded one held the only slot"
    );
    drop(first);
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), second.read_to_end(&mut answer))
        .await
        .expect("served once the upgraded connection ended")
        .unwrap();
    assert!(answer.starts_with(b"HTTP/1.1 200 "), "{answer:?}");
    assert!(answer.ends_with(b"ok"), "{answer:?}");
    let _ = stop.send(());
    server.await.unwrap().unwrap();
}

/// Shutdown closes upgraded connections instead of waiting for them, and the server returns
/// long before its grace period.
#[tokio::test]
async fn shutdown_closes_upgraded_connections() {
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(sandcove::server::serve_router(
        listener,
        upgrade_router(),
        upgrade_limits(4, Duration::from_secs(600)),
        async move {
            let _ = stopped.await;
        },
    ));
    let mut conn = upgraded(addr).await;
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(60), server)
        .await
        .expect("the server returns without waiting out its grace period")
        .unwrap()
        .unwrap();
    let mut rest = Vec::new();
    let end = tokio::time::timeout(Duration::from_secs(60), conn.read_to_end(&mut rest))
        .await
        .expect("the upgraded connection is closed");
    assert!(
        matches!(end, Ok(0)) || end.is_err(),
        "closed, not more bytes: {end:?} {rest:?}"
    );
}

/// An upgraded connection on which nothing moves is closed after its idle limit (and frees
/// its slot), while one that keeps moving bytes stays open past it.
#[tokio::test]
async fn an_idle_upgraded_connection_is_closed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(sandcove::server::serve_router(
        listener,
        upgrade_router(),
        upgrade_limits(1, Duration::from_secs(5)),
        async move {
            let _ = stopped.await;
        },
    ));
    let mut conn = upgraded_at(addr, "/echo-brief").await;
    // Traffic for several idle limits keeps it open.
    let busy_until = tokio::time::Instant::now() + BRIEF_IDLE * 3;
    while tokio::time::Instant::now() < busy_until {
        conn.write_all(b"x").await.unwrap();
        let mut back = [0u8; 1];
        conn.read_exact(&mut back)
            .await
            .expect("a busy connection stays open");
        tokio::time::sleep(BRIEF_IDLE / 4).await;
    }
    // Silence: the server closes it.
    let mut rest = Vec::new();
    let end = tokio::time::timeout(Duration::from_secs(60), conn.read_to_end(&mut rest))
        .await
        .expect("the idle upgraded connection is closed");
    assert!(
        matches!(end, Ok(0)) || end.is_err(),
        "closed, not more bytes: {end:?} {rest:?}"
    );
    // Its slot (the only one) is free again.
    let mut next = tokio::net::TcpStream::connect(addr).await.unwrap();
    next.write_all(b"GET /plain HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), next.read_to_end(&mut answer))
        .await
        .expect("served once the idle connection was closed")
        .unwrap();
    assert!(answer.starts_with(b"HTTP/1.1 200 "), "{answer:?}");
    let _ = stop.send(());
    server.await.unwrap().unwrap();
}

/// A router served outside `serve`/`serve_router` cannot take a connection over: nothing
/// would bound it.
#[tokio::test]
async fn upgrades_need_the_bounded_connection_loop() {
    let mut request = axum::http::Request::builder()
        .uri("/echo")
        .header("connection", "upgrade")
        .header("upgrade", "echo")
        .body(axum::body::Body::empty())
        .unwrap();
    let err = sandcove::server::upgrade::prepare(&mut request).unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotSupported, "{err}");
}
