//! Failed uploads over HTTP: the error reaches the caller only after the served backend has
//! discarded what it received, even when that backend is slow to clean up; the server still
//! cleans up after clients that just go away, and plain raw uploads keep working.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use sandcove::backend::http::{frame, FRAMES_CONTENT_TYPE};
use sandcove::conformance::{equals, eventually, test_options, unique, PATIENCE};
use sandcove::server::{LocalServer, ServerConfig};
use sandcove::{
    Backend, ByteStream, Capabilities, CreateOptions, Error, ErrorCode, FileStat, HttpBackend,
    ListDirOptions, ListOptions, LocalBackend, Metrics, MkdirOptions, Preview, PreviewOptions,
    PreviewToken, ProcessInfo, ProcessSelector, ProcessSpec, ProcessStream, PtySize, RemoveOptions,
    Result, SandboxInfo, Signal, SnapshotInfo, VolumeInfo, WatchOptions, WatchStream, WriteOptions,
};

/// How long [`SlowCleanup`] holds back a failed upload's error before its engine sees it.
const CLEANUP_DELAY: Duration = Duration::from_millis(300);

/// The embedded engine behind a write path whose cleanup is slow and runs to completion
/// even when the caller stops waiting (as a remote backend's would): the failing item of an
/// upload reaches the engine only after [`CLEANUP_DELAY`], from a task of its own. A client
/// or server that answers before the backend has finished therefore leaves the engine's
/// temporary file visible to the next call, every time.
#[derive(Debug)]
struct SlowCleanup {
    inner: Arc<LocalBackend>,
    /// The largest file it reports (`Capabilities::max_file_bytes`), when not the engine's.
    max_file_bytes: Option<u64>,
}

#[async_trait]
impl Backend for SlowCleanup {
    fn capabilities(&self) -> Capabilities {
        let mut caps = self.inner.capabilities();
        caps.max_file_bytes = self.max_file_bytes.unwrap_or(caps.max_file_bytes);
        caps
    }
    async fn ready(&self) -> Result<Capabilities> {
        self.inner.ready().await?;
        Ok(self.capabilities())
    }
    async fn write_file(
        &self,
        id: &str,
        path: &str,
        data: ByteStream,
        options: WriteOptions,
    ) -> Result<FileStat> {
        let delayed: ByteStream = Box::pin(data.then(|item| async move {
            if item.is_err() {
                tokio::time::sleep(CLEANUP_DELAY).await;
            }
            item
        }));
        let inner = self.inner.clone();
        let (id, path) = (id.to_string(), path.to_string());
        tokio::spawn(async move { inner.write_file(&id, &path, delayed, options).await })
            .await
            .map_err(|e| Error::backend(format!("write task: {e}")))?
    }
    async fn create(&self, o: CreateOptions) -> Result<SandboxInfo> {
        self.inner.create(o).await
    }
    async fn get(&self, id: &str) -> Result<SandboxInfo> {
        self.inner.get(id).await
    }
    async fn list(&self, o: ListOptions) -> Result<Vec<SandboxInfo>> {
        self.inner.list(o).await
    }
    async fn set_timeout(&self, id: &str, t: Duration) -> Result<SandboxInfo> {
        self.inner.set_timeout(id, t).await
    }
    async fn set_labels(&self, id: &str, l: BTreeMap<String, String>) -> Result<SandboxInfo> {
        self.inner.set_labels(id, l).await
    }
    async fn destroy(&self, id: &str) -> Result<()> {
        self.inner.destroy(id).await
    }
    async fn spawn(&self, id: &str, s: ProcessSpec) -> Result<ProcessStream> {
        self.inner.spawn(id, s).await
    }
    async fn attach(&self, id: &str, p: ProcessSelector) -> Result<ProcessStream> {
        self.inner.attach(id, p).await
    }
    async fn write_stdin(&self, id: &str, p: ProcessSelector, d: Vec<u8>) -> Result<()> {
        self.inner.write_stdin(id, p, d).await
    }
    async fn close_stdin(&self, id: &str, p: ProcessSelector) -> Result<()> {
        self.inner.close_stdin(id, p).await
    }
    async fn signal(&self, id: &str, p: ProcessSelector, s: Signal) -> Result<()> {
        self.inner.signal(id, p, s).await
    }
    async fn list_processes(&self, id: &str) -> Result<Vec<ProcessInfo>> {
        self.inner.list_processes(id).await
    }
    async fn read_file(
        &self,
        id: &str,
        path: &str,
        o: sandcove::ReadOptions,
    ) -> Result<ByteStream> {
        self.inner.read_file(id, path, o).await
    }
    async fn list_dir(&self, id: &str, path: &str, o: ListDirOptions) -> Result<Vec<FileStat>> {
        self.inner.list_dir(id, path, o).await
    }
    async fn stat(&self, id: &str, path: &str, o: sandcove::StatOptions) -> Result<FileStat> {
        self.inner.stat(id, path, o).await
    }
    async fn mkdir(&self, id: &str, path: &str, o: MkdirOptions) -> Result<FileStat> {
        self.inner.mkdir(id, path, o).await
    }
    async fn remove(&self, id: &str, path: &str, o: RemoveOptions) -> Result<()> {
        self.inner.remove(id, path, o).await
    }
    async fn rename(
        &self,
        id: &str,
        from: &str,
        to: &str,
        o: sandcove::RenameOptions,
    ) -> Result<FileStat> {
        self.inner.rename(id, from, to, o).await
    }
    async fn copy(
        &self,
        id: &str,
        from: &str,
        to: &str,
        o: sandcove::CopyOptions,
    ) -> Result<FileStat> {
        self.inner.copy(id, from, to, o).await
    }
    async fn chmod(&self, id: &str, path: &str, mode: u32) -> Result<FileStat> {
        self.inner.chmod(id, path, mode).await
    }
    async fn pause(&self, id: &str) -> Result<SandboxInfo> {
        self.inner.pause(id).await
    }
    async fn resume(&self, id: &str) -> Result<SandboxInfo> {
        self.inner.resume(id).await
    }
    async fn stop(&self, id: &str) -> Result<SandboxInfo> {
        self.inner.stop(id).await
    }
    async fn start(&self, id: &str) -> Result<SandboxInfo> {
        self.inner.start(id).await
    }
    async fn update_annotations(
        &self,
        id: &str,
        u: sandcove::AnnotationUpdate,
    ) -> Result<BTreeMap<String, String>> {
        self.inner.update_annotations(id, u).await
    }
    async fn metrics(&self, id: &str) -> Result<Metrics> {
        self.inner.metrics(id).await
    }
    async fn resize_pty(&self, id: &str, p: ProcessSelector, s: PtySize) -> Result<()> {
        self.inner.resize_pty(id, p, s).await
    }
    async fn watch(&self, id: &str, path: &str, o: WatchOptions) -> Result<WatchStream> {
        self.inner.watch(id, path, o).await
    }
    async fn expose_port(&self, id: &str, o: PreviewOptions) -> Result<Preview> {
        self.inner.expose_port(id, o).await
    }
    async fn list_previews(&self, id: &str) -> Result<Vec<Preview>> {
        self.inner.list_previews(id).await
    }
    async fn close_preview(&self, id: &str, port: u16) -> Result<()> {
        self.inner.close_preview(id, port).await
    }
    async fn create_preview_token(
        &self,
        id: &str,
        port: u16,
        ttl: Option<u64>,
    ) -> Result<PreviewToken> {
        self.inner.create_preview_token(id, port, ttl).await
    }
    async fn revoke_preview_token(&self, id: &str, port: u16, token: &str) -> Result<()> {
        self.inner.revoke_preview_token(id, port, token).await
    }
    async fn snapshot(&self, id: &str, name: Option<String>) -> Result<SnapshotInfo> {
        self.inner.snapshot(id, name).await
    }
    async fn list_snapshots(&self) -> Result<Vec<SnapshotInfo>> {
        self.inner.list_snapshots().await
    }
    async fn delete_snapshot(&self, id: &str) -> Result<()> {
        self.inner.delete_snapshot(id).await
    }
    async fn fork(&self, id: &str, o: CreateOptions) -> Result<SandboxInfo> {
        self.inner.fork(id, o).await
    }
    async fn create_volume(&self, name: &str) -> Result<VolumeInfo> {
        self.inner.create_volume(name).await
    }
    async fn get_volume(&self, name: &str) -> Result<VolumeInfo> {
        self.inner.get_volume(name).await
    }
    async fn list_volumes(&self) -> Result<Vec<VolumeInfo>> {
        self.inner.list_volumes().await
    }
    async fn delete_volume(&self, name: &str) -> Result<()> {
        self.inner.delete_volume(name).await
    }
    async fn tombstone(
        &self,
        kind: sandcove::ResourceKind,
        id: &str,
    ) -> Result<Option<sandcove::Tombstone>> {
        self.inner.tombstone(kind, id).await
    }
}

/// A loopback server over [`SlowCleanup`], a client for it, the server's URL and key, and
/// the engine itself; the server lives as long as the test's runtime.
async fn served(
    config: impl FnOnce(&mut ServerConfig),
) -> (HttpBackend, String, String, Arc<LocalBackend>) {
    served_capped(config, None).await
}

/// [`served`], its backend reporting `max_file_bytes` as its largest file.
async fn served_capped(
    config: impl FnOnce(&mut ServerConfig),
    max_file_bytes: Option<u64>,
) -> (HttpBackend, String, String, Arc<LocalBackend>) {
    let key = unique("key");
    let engine = Arc::new(LocalBackend::new().expect("local engine"));
    let backend = SlowCleanup {
        inner: engine.clone(),
        max_file_bytes,
    };
    let mut server_config = ServerConfig::new(key.clone());
    config(&mut server_config);
    let server = LocalServer::start(Arc::new(backend), server_config)
        .await
        .expect("start the server");
    let url = server.url();
    let client = HttpBackend::connect(&url, &key).await.expect("connect");
    std::mem::forget(server);
    (client, url, key, engine)
}

async fn names(backend: &dyn Backend, id: &str) -> Vec<String> {
    sandcove::conformance::names_in(backend, id, "/workspace").await
}

fn chunks(items: Vec<Result<Vec<u8>>>) -> ByteStream {
    Box::pin(futures::stream::iter(items))
}

/// A source that yields `data`, waits until the engine holds the upload's temporary file,
/// then fails: the failure always comes when there is something to clean up.
fn fails_once_staged(engine: Arc<LocalBackend>, id: &str, data: Vec<u8>) -> ByteStream {
    let id = id.to_string();
    let fail = futures::stream::once(async move {
        eventually(PATIENCE, "the upload's temporary file exists", || async {
            let seen = names(&*engine, &id).await;
            if seen
                .iter()
                .any(|n| n.starts_with(".") && n.contains(".sandcove-"))
            {
                Ok(())
            } else {
                Err(seen)
            }
        })
        .await;
        Err(Error::invalid("the source broke"))
    });
    Box::pin(futures::stream::iter([Ok(data)]).chain(fail))
}

/// Over a server whose backend cleans up slowly, a listing made as soon as a failed upload
/// returns shows no temporary file, over new and existing targets; the caller gets its own
/// source's error, and an overwritten file keeps its old content.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_uploads_over_http_wait_for_a_slow_cleanup() {
    let (client, _, _, engine) = served(|_| {}).await;
    let id = client
        .create(test_options(&unique("slow")))
        .await
        .unwrap()
        .id;
    let kept = chunks(vec![Ok(b"original".to_vec())]);
    client
        .write_file(&id, "kept.bin", kept, WriteOptions::default())
        .await
        .unwrap();
    for round in 0..6 {
        let target = if round % 2 == 0 {
            "kept.bin"
        } else {
            "new.bin"
        };
        let source = fails_once_staged(engine.clone(), &id, vec![round as u8; 200_000]);
        let err = client
            .write_file(&id, target, source, WriteOptions::default())
            .await
            .expect_err("a failed source fails the upload");
        assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
        assert!(err.to_string().contains("the source broke"), "{err}");
        assert_eq!(
            names(&client, &id).await,
            ["kept.bin"],
            "round {round}: debris after a failed upload"
        );
    }
    let mut content = Vec::new();
    let mut download = client
        .read_file(&id, "kept.bin", Default::default())
        .await
        .unwrap();
    while let Some(chunk) = download.next().await {
        content.extend(chunk.unwrap());
    }
    assert_eq!(
        content, b"original",
        "a failed overwrite keeps the old content"
    );
    client.destroy(&id).await.unwrap();
}

/// An upload past the server's limit is refused (413 → `FileTooLarge`) only once the
/// backend has discarded what it received.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_over_the_limit_is_refused_after_its_cleanup() {
    let (client, _, _, _) = served(|c| c.max_upload_bytes = 64 * 1024).await;
    let id = client
        .create(test_options(&unique("limit")))
        .await
        .unwrap()
        .id;
    for round in 0..5 {
        let data = chunks((0..4).map(|_| Ok(vec![round as u8; 32 * 1024])).collect());
        let err = client
            .write_file(&id, "big.bin", data, WriteOptions::default())
            .await
            .expect_err("over the limit");
        assert_eq!(err.code(), ErrorCode::FileTooLarge, "{err}");
        assert_eq!(
            names(&client, &id).await,
            Vec::<String>::new(),
            "round {round}: debris after a refused upload"
        );
    }
    client.destroy(&id).await.unwrap();
}

/// The server bounds an upload by its backend's largest file too (as its docs say), and by
/// the call's own `max_bytes`: refused as `FileTooLarge`, nothing kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_over_the_backends_largest_file_is_refused() {
    let (client, _, _, _) = served_capped(|_| {}, Some(64 * 1024)).await;
    let id = client
        .create(test_options(&unique("cap")))
        .await
        .unwrap()
        .id;
    let data = chunks((0..4).map(|_| Ok(vec![1u8; 32 * 1024])).collect());
    let err = client
        .write_file(&id, "big.bin", data, WriteOptions::default())
        .await
        .expect_err("over the backend's largest file");
    match &err {
        Error::FileTooLarge { limit, .. } => assert_eq!(*limit, 64 * 1024, "{err}"),
        other => panic!("expected FileTooLarge, got {other:?}"),
    }
    let data = chunks((0..4).map(|_| Ok(vec![1u8; 8 * 1024])).collect());
    let err = client
        .write_file(
            &id,
            "big.bin",
            data,
            WriteOptions::default().max_bytes(16 * 1024),
        )
        .await
        .expect_err("over the call's bound");
    assert_eq!(err.code(), ErrorCode::FileTooLarge, "{err}");
    assert_eq!(
        names(&client, &id).await,
        Vec::<String>::new(),
        "nothing kept"
    );
    let small = chunks(vec![Ok(vec![1u8; 1024])]);
    client
        .write_file(&id, "small.bin", small, WriteOptions::default())
        .await
        .expect("within every bound");
    client.destroy(&id).await.unwrap();
}

/// A client that cuts its connection mid-upload (raw or framed) or ends a framed body
/// without its end frame commits nothing: the server abandons the write and the backend
/// cleans up, while a complete raw upload (plain HTTP tools) still writes the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_abandons_uploads_that_break_off() {
    let (client, url, key, _) = served(|_| {}).await;
    let id = client
        .create(test_options(&unique("cut")))
        .await
        .unwrap()
        .id;
    let http = reqwest::Client::new();
    let put = |name: &str, content_type: &str, body: reqwest::Body| {
        http.put(format!("{url}/v1/sandboxes/{id}/files"))
            .bearer_auth(&key)
            .query(&[("path", name)])
            .header(reqwest::header::CONTENT_TYPE, content_type)
            .body(body)
            .send()
    };
    let data = frame::encode(frame::DATA, &[5u8; 100_000]);
    let cut = |first: Vec<u8>| {
        reqwest::Body::wrap_stream(futures::stream::iter(vec![
            Ok(first),
            Err(std::io::Error::other("the client goes away")),
        ]))
    };
    // Cut connections: the client cannot hear the answer, so wait for the cleanup.
    let raw = put(
        "raw.bin",
        "application/octet-stream",
        cut(vec![5u8; 100_000]),
    )
    .await;
    assert!(raw.is_err(), "the raw upload was cut: {raw:?}");
    let framed = put("framed.bin", FRAMES_CONTENT_TYPE, cut(data.clone())).await;
    assert!(framed.is_err(), "the framed upload was cut: {framed:?}");
    eventually(PATIENCE, "cut uploads are cleaned up", || async {
        equals(names(&client, &id).await, Vec::<String>::new())
    })
    .await;
    // A framed body that ends without `x` is answered after its cleanup, and is an error.
    let short = put("short.bin", FRAMES_CONTENT_TYPE, data.clone().into())
        .await
        .expect("an answer");
    assert_eq!(short.status().as_u16(), 500, "a short framed body fails");
    assert_eq!(names(&client, &id).await, Vec::<String>::new());
    // A complete raw body, and a complete framed one, write their files.
    let raw_ok = put(
        "raw.bin",
        "application/octet-stream",
        vec![6u8; 1000].into(),
    )
    .await
    .expect("an answer");
    assert_eq!(raw_ok.status().as_u16(), 200);
    let mut whole = data;
    whole.extend(frame::encode(frame::END, b""));
    let framed_ok = put("framed.bin", FRAMES_CONTENT_TYPE, whole.into())
        .await
        .expect("an answer");
    assert_eq!(framed_ok.status().as_u16(), 200);
    assert_eq!(names(&client, &id).await, ["framed.bin", "raw.bin"]);
    let stat = client
        .stat(&id, "framed.bin", Default::default())
        .await
        .unwrap();
    assert_eq!(stat.size, 100_000);
    client.destroy(&id).await.unwrap();
}
