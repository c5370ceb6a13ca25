//! Failed uploads over HTTP: the error reaches the caller only after the served backend has
//! discarded what it received, even when that backend is slow to clean up; the server still
//! cleans up after clients that just go away, and plain raw uploads keep working.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use sandcove::backend::http::{frame, FRAMES_CONTENT_TYPE};
use sandcove::server::{LocalServer, ServerConfig};
use sandcove::{
    Backend, ByteStream, Capabilities, Error, ErrorCode, FileStat, HttpBackend, LocalBackend,
    Result, WriteOptions,
};
use sandcove_conformance::{equals, eventually, test_options, unique, PATIENCE};

use crate::passthrough_common as passthrough;

use passthrough::{Adapt, Passthrough};

/// How long [`SlowCleanup`] holds back a failed upload's error before its engine sees it.
const CLEANUP_DELAY: Duration = Duration::from_millis(300);

/// The embedded engine behind a write path whose cleanup is slow and runs to completion
/// even when the caller stops waiting (as a remote backend's would): the failing item of an
/// upload reaches the engine only after [`CLEANUP_DELAY`], from a task of its own. A client
/// or server that answers before the backend has finished therefore leaves the engine's
/// temporary file visible to the next call, every time.
#[derive(Debug)]
struct SlowCleanup {
    /// The largest file it reports (`Capabilities::max_file_bytes`), when not the engine's.
    max_file_bytes: Option<u64>,
}

#[async_trait]
impl Adapt for SlowCleanup {
    fn capabilities(&self, mut caps: Capabilities) -> Capabilities {
        caps.max_file_bytes = self.max_file_bytes.unwrap_or(caps.max_file_bytes);
        caps
    }
    async fn write_file(
        &self,
        inner: &Arc<dyn Backend>,
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
        let inner = inner.clone();
        let (id, path) = (id.to_string(), path.to_string());
        tokio::spawn(async move { inner.write_file(&id, &path, delayed, options).await })
            .await
            .map_err(|e| Error::backend(format!("write task: {e}")))?
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
    let backend = Passthrough {
        inner: engine.clone() as Arc<dyn Backend>,
        adapt: SlowCleanup { max_file_bytes },
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
    sandcove_conformance::names_in(backend, id, "/workspace").await
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
