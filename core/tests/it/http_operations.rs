//! Operation ids over HTTP (issue 21): a call repeated under its operation id acts once, a
//! lost answer is `OutcomeUnknown` naming the id, and `observe` says what became of it. Every
//! server here is a real loopback `sandcove serve` wrapping the embedded engine; the "lossy"
//! front is a small loopback relay that forwards a request and drops the answer.

use std::sync::Arc;
use std::time::Duration;

use sandcove::server::{LocalServer, ServerConfig};
use sandcove::{
    Backend, ByteStream, ChmodOptions, Client, Command, CopyOptions, Error, FileKind, FileStat,
    HttpBackend, HttpOptions, ListOptions, LocalBackend, MkdirOptions, OperationId,
    OperationStatus, ProcessEvent, ProcessSpec, ReadOptions, RemoveOptions, RenameOptions,
    StatOptions, WriteOptions,
};
use sandcove_conformance::{eventually, sh, test_options, unique, PATIENCE};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};

/// A loopback server over a fresh engine, its URL and key (the server lives as long as the
/// test's runtime).
async fn server() -> (String, String) {
    let key = unique("key");
    let engine: Arc<dyn Backend> = Arc::new(LocalBackend::new().expect("local engine"));
    let server = LocalServer::start(engine, ServerConfig::new(key.clone()))
        .await
        .expect("start the server");
    let url = server.url();
    std::mem::forget(server);
    (url, key)
}

fn options(retries: u32) -> HttpOptions {
    let mut options = HttpOptions::default();
    options.max_retries = retries;
    options.backoff = Duration::from_millis(10);
    options.request_timeout = Duration::from_secs(60);
    options
}

/// The sandboxes carrying `label`.
async fn labelled(backend: &dyn Backend, label: &str) -> Vec<String> {
    let mut filter = ListOptions::default();
    filter
        .labels
        .insert("conformance".to_string(), label.to_string());
    let list = backend.list(filter).await.expect("list");
    list.into_iter().map(|info| info.id).collect()
}

/// Read one HTTP request (head, then a `content-length` body) from `stream`, bounded.
async fn read_request(stream: &mut TcpStream) -> Vec<u8> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let body = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            if buf.len() >= end + 4 + body {
                return buf;
            }
        }
        assert!(buf.len() < 1 << 20, "request too large for the test relay");
        let n = stream.read(&mut chunk).await.expect("read the request");
        if n == 0 {
            return buf;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// A loopback relay that forwards each request to `upstream` (when given), body streamed
/// through whatever its length or encoding, waits for the head of its answer, and then drops
/// the client's connection without answering: the request took effect (or not, without
/// upstream) and its answer is lost.
async fn lossy_relay(upstream: Option<String>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().unwrap();
    let upstream = upstream.map(|url| {
        url.trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string()
    });
    tokio::spawn(async move {
        loop {
            let Ok((mut client, _)) = listener.accept().await else {
                return;
            };
            let upstream = upstream.clone();
            tokio::spawn(async move {
                let Some(upstream) = upstream else {
                    read_request(&mut client).await;
                    // Dropping `client` here loses the request and its answer.
                    return;
                };
                let server = TcpStream::connect(&upstream).await.expect("upstream");
                let (mut from_client, to_client) = client.into_split();
                let (mut from_server, mut to_server) = server.into_split();
                let forward = tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut from_client, &mut to_server).await;
                });
                let mut answer = Vec::new();
                let mut chunk = [0u8; 4096];
                while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
                    let n = from_server.read(&mut chunk).await.expect("read the answer");
                    if n == 0 {
                        break;
                    }
                    answer.extend_from_slice(&chunk[..n]);
                }
                // Dropping the client's connection here loses the answer.
                forward.abort();
                drop(to_client);
            });
        }
    });
    format!("http://{addr}")
}

/// A loopback relay that forwards each request to `upstream` and hangs up on both sides at
/// once, without waiting for any answer: the server sees its client go while the call runs.
async fn hanging_up_relay(upstream: String) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().unwrap();
    let upstream = upstream
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let request = read_request(&mut client).await;
            let mut server = TcpStream::connect(&upstream).await.expect("upstream");
            tokio::io::AsyncWriteExt::write_all(&mut server, &request)
                .await
                .expect("forward");
            drop((client, server));
        }
    });
    format!("http://{addr}")
}

/// A loopback listener that reads each request and never answers (holding the connection).
async fn silent_listener() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut client, _)) = listener.accept().await {
            read_request(&mut client).await;
            held.push(client);
        }
    });
    format!("http://{addr}")
}

/// A create repeated under one operation id makes one sandbox and answers the same one;
/// `observe` reports it done with its id; a destroy repeated under its id is not "not
/// found" the second time; an id never sent is unknown.
#[tokio::test]
async fn a_create_repeated_under_its_operation_id_makes_one_sandbox() {
    let (url, key) = server().await;
    let backend = Arc::new(HttpBackend::connect(&url, &key).await.expect("connect"));
    let client = Client::new(backend.clone());
    let label = unique("op-create");
    let op = OperationId::new();
    let first = op
        .clone()
        .scope(client.create(test_options(&label)))
        .await
        .expect("create");
    let again = op
        .clone()
        .scope(client.create(test_options(&label)))
        .await
        .expect("the same create again");
    assert_eq!(
        again.id(),
        first.id(),
        "the repeat answers the first sandbox"
    );
    assert_eq!(
        labelled(&*backend, &label).await,
        vec![first.id().to_string()],
        "exactly one sandbox was made"
    );
    let status = client.observe(&op).await.expect("observe");
    assert!(matches!(status, OperationStatus::Done { .. }), "{status:?}");
    assert_eq!(status.resource_id().as_deref(), Some(first.id()));

    // One id for one call: another request under it is refused, nothing made.
    let mut other = test_options(&label);
    other.envs.insert("OTHER".into(), "1".into());
    let refused = op.clone().scope(client.create(other)).await;
    assert!(
        matches!(refused, Err(Error::Conflict { .. })),
        "{refused:?}"
    );
    assert_eq!(labelled(&*backend, &label).await.len(), 1);

    let gone = OperationId::new();
    gone.clone().scope(first.destroy()).await.expect("destroy");
    gone.clone()
        .scope(first.destroy())
        .await
        .expect("the same destroy again answers as the first did");
    assert!(backend.get(first.id()).await.unwrap_err().is_not_found());
    let other_destroy = first.destroy().await;
    assert!(
        other_destroy.as_ref().is_err_and(Error::is_not_found),
        "a new destroy is a new operation: {other_destroy:?}"
    );

    let never = client.observe(&OperationId::new()).await.expect("observe");
    assert!(
        matches!(never, OperationStatus::Unknown { .. }),
        "{never:?}"
    );
}

/// A process start repeated under its operation id attaches to the process the first one
/// started instead of starting another.
#[tokio::test]
async fn a_process_start_repeated_under_its_operation_id_runs_once() {
    let (url, key) = server().await;
    let (backend, id) = sandbox_on(&url, &key, "op-spawn").await;
    let spec = || ProcessSpec::new(Command::sh("echo started >> /workspace/runs; echo hi"));
    let op = OperationId::new();
    let first = op
        .clone()
        .scope(backend.spawn(&id, spec()))
        .await
        .expect("spawn");
    let again = op
        .clone()
        .scope(backend.spawn(&id, spec()))
        .await
        .expect("the same spawn again");
    assert_eq!(again.pid, first.pid, "the repeat names the first process");
    let mut events = again.events;
    let mut out = Vec::new();
    use futures::StreamExt;
    while let Some(event) = events.next().await {
        match event.expect("event") {
            ProcessEvent::Stdout(bytes) => out.extend(bytes),
            ProcessEvent::Exit(_) => break,
            _ => {}
        }
    }
    assert_eq!(
        out, b"hi\n",
        "the attached stream carries the first run's output"
    );
    drop(first);
    let runs = sh(&*backend, &id, "cat /workspace/runs").await;
    assert_eq!(runs.stdout, b"started\n", "the script ran once");
    let status = backend.observe(&op).await.expect("observe");
    assert_eq!(status.resource_id(), Some(again.pid.to_string()));
    backend.destroy(&id).await.expect("destroy");
}

/// A request sent whose answer is lost is `OutcomeUnknown` naming the operation id; the
/// operation did happen, which `observe` on the server reports, and running the call again
/// under that id answers the sandbox it made instead of making a second.
#[tokio::test]
async fn a_lost_answer_is_outcome_unknown_and_observe_tells_what_happened() {
    let (url, key) = server().await;
    let direct = HttpBackend::connect(&url, &key).await.expect("connect");
    let relay = lossy_relay(Some(url.clone())).await;
    let lossy = HttpBackend::with_options(&relay, &key, options(1)).expect("client");
    let label = unique("op-lost");
    let err = lossy
        .create(test_options(&label))
        .await
        .expect_err("the answer is lost");
    let op = err
        .unknown_outcome()
        .unwrap_or_else(|| panic!("OutcomeUnknown with the operation id, got {err:?}"));
    let status = eventually(PATIENCE, "the create to finish", || async {
        match direct.observe(&op).await {
            Ok(status @ OperationStatus::Done { .. }) => Ok(status),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let made = status.resource_id().expect("the sandbox's id");
    assert_eq!(labelled(&direct, &label).await, vec![made.clone()]);
    let again = op
        .clone()
        .scope(direct.create(test_options(&label)))
        .await
        .expect("the create again under its id");
    assert_eq!(again.id, made);
    assert_eq!(labelled(&direct, &label).await, vec![made.clone()]);

    // A destroy whose answer is lost is OutcomeUnknown too, and observe says it happened.
    let err = lossy.destroy(&made).await.expect_err("the answer is lost");
    let op = err.unknown_outcome().expect("the destroy's operation id");
    eventually(PATIENCE, "the destroy to finish", || async {
        match direct.observe(&op).await {
            Ok(OperationStatus::Done { .. }) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(direct.get(&made).await.unwrap_err().is_not_found());
}

/// A relay that drops every request without forwarding it: still `OutcomeUnknown` (the
/// client cannot tell), carrying a fresh id; a scope's id is the one reported. A request that
/// never left (nothing listens) stays what it is: `Unavailable`.
#[tokio::test]
async fn outcome_unknown_only_after_the_request_may_have_arrived() {
    let relay = lossy_relay(None).await;
    let lossy = HttpBackend::with_options(&relay, "key", options(0)).expect("client");
    let err = lossy
        .create(test_options(&unique("op-drop")))
        .await
        .expect_err("dropped");
    assert!(err.unknown_outcome().is_some(), "{err:?}");
    let mine = OperationId::new();
    let err = mine
        .clone()
        .scope(lossy.create_volume("v"))
        .await
        .expect_err("dropped");
    assert_eq!(err.unknown_outcome(), Some(mine));

    // No answer in time: the same.
    let silent = silent_listener().await;
    let mut short = options(0);
    short.request_timeout = Duration::from_millis(300);
    let waiting = HttpBackend::with_options(&silent, "key", short).expect("client");
    let mine = OperationId::new();
    let err = mine
        .clone()
        .scope(waiting.delete_volume("v"))
        .await
        .expect_err("no answer");
    assert_eq!(err.unknown_outcome(), Some(mine), "{err:?}");

    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let nowhere =
        HttpBackend::with_options(&format!("http://{addr}"), "key", options(0)).expect("client");
    let err = nowhere
        .create(test_options(&unique("op-nowhere")))
        .await
        .expect_err("nothing listens");
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
}

/// A server over a fresh engine with `config`'s limits (its key is replaced), its URL and key.
async fn server_with(mut config: ServerConfig) -> (String, String) {
    let key = unique("key");
    config.api_key = key.clone();
    let engine: Arc<dyn Backend> = Arc::new(LocalBackend::new().expect("local engine"));
    let server = LocalServer::start(engine, config)
        .await
        .expect("start the server");
    let url = server.url();
    std::mem::forget(server);
    (url, key)
}

/// A client of the server at `url` and a fresh sandbox on it labelled `prefix`.
async fn sandbox_on(url: &str, key: &str, prefix: &str) -> (Arc<HttpBackend>, String) {
    let backend = Arc::new(HttpBackend::connect(url, key).await.expect("connect"));
    let id = backend
        .create(test_options(&unique(prefix)))
        .await
        .expect("create")
        .id;
    (backend, id)
}

/// `data` as an upload stream of `chunk`-byte pieces.
fn upload(data: &[u8], chunk: usize) -> ByteStream {
    let pieces: Vec<sandcove::Result<Vec<u8>>> =
        data.chunks(chunk).map(|c| Ok(c.to_vec())).collect();
    Box::pin(futures::stream::iter(pieces))
}

/// The file's bytes, read back through the API.
async fn contents(backend: &HttpBackend, id: &str, path: &str) -> Vec<u8> {
    use futures::StreamExt;
    let mut data = backend
        .read_file(id, path, ReadOptions::default())
        .await
        .expect("read the file");
    let mut out = Vec::new();
    while let Some(chunk) = data.next().await {
        out.extend(chunk.expect("file bytes"));
    }
    out
}

/// A write whose answer is lost is `OutcomeUnknown` naming its operation id; `observe` says
/// it is done with the file's metadata; the same write again under that id answers the first
/// outcome without writing (the content written in between stays); the same id with other
/// content, or for another path, is a conflict and leaves the file as it is.
#[tokio::test]
async fn a_lost_write_answer_is_observed_and_a_retry_writes_once() {
    let (url, key) = server().await;
    let (direct, id) = sandbox_on(&url, &key, "op-write").await;
    let relay = lossy_relay(Some(url.clone())).await;
    let lossy = HttpBackend::with_options(&relay, &key, options(0)).expect("client");
    let path = "/workspace/note";
    let err = lossy
        .write_file(&id, path, upload(b"first", 2), WriteOptions::default())
        .await
        .expect_err("the answer is lost");
    let op = err
        .unknown_outcome()
        .unwrap_or_else(|| panic!("OutcomeUnknown with the operation id, got {err:?}"));
    let OperationStatus::Done { result } = observed_done(&direct, &op).await else {
        unreachable!()
    };
    let recorded: FileStat = serde_json::from_value(result).expect("a FileStat");
    assert_eq!((recorded.path.as_str(), recorded.size), (path, 5));
    assert_eq!(contents(&direct, &id, path).await, b"first");

    // Someone else writes in between; the retry must not write "first" again.
    direct
        .write_file(&id, path, upload(b"second", 3), WriteOptions::default())
        .await
        .expect("another write");
    let again = op
        .clone()
        .scope(direct.write_file(&id, path, upload(b"first", 4), WriteOptions::default()))
        .await
        .expect("the same write again answers the first outcome");
    assert_eq!(
        again, recorded,
        "the repeat answers the first write's metadata"
    );
    assert_eq!(
        contents(&direct, &id, path).await,
        b"second",
        "the repeat wrote nothing"
    );

    // The id names that write only: other content, or another path, is a conflict.
    let other = op
        .clone()
        .scope(direct.write_file(&id, path, upload(b"firsT", 5), WriteOptions::default()))
        .await;
    assert!(matches!(other, Err(Error::Conflict { .. })), "{other:?}");
    let elsewhere = op
        .clone()
        .scope(direct.write_file(
            &id,
            "/workspace/elsewhere",
            upload(b"first", 5),
            WriteOptions::default(),
        ))
        .await;
    assert!(
        matches!(elsewhere, Err(Error::Conflict { .. })),
        "{elsewhere:?}"
    );
    // The attributes are part of the write: the same content with others is another write.
    let relabelled = op
        .clone()
        .scope(direct.write_file(
            &id,
            path,
            upload(b"first", 5),
            WriteOptions::default().attribute("user.origin", "retry"),
        ))
        .await;
    assert!(
        matches!(relabelled, Err(Error::Conflict { .. })),
        "{relabelled:?}"
    );
    assert_eq!(contents(&direct, &id, path).await, b"second");
    let stat = direct
        .stat(&id, "/workspace/elsewhere", StatOptions::default())
        .await;
    assert!(stat.as_ref().is_err_and(Error::is_not_found), "{stat:?}");
    direct.destroy(&id).await.expect("destroy");
}

/// A streamed upload far larger than any body the server buffers (its JSON bodies are
/// capped at 64 KiB here, an upload frame at 1 MiB) is recognised by the digest of its
/// content, computed as it streams: the same upload again under its id answers the first
/// outcome without writing, and one changed byte at its very end is a conflict.
#[tokio::test]
async fn a_large_streamed_write_is_recognised_by_its_content_digest() {
    let mut config = ServerConfig::new("replaced");
    config.max_body_bytes = 64 * 1024;
    let (url, key) = server_with(config).await;
    let (backend, id) = sandbox_on(&url, &key, "op-upload").await;
    let path = "/workspace/big";
    let big: Vec<u8> = (0..6 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    let op = OperationId::new();
    let first = op
        .clone()
        .scope(backend.write_file(&id, path, upload(&big, 256 * 1024), WriteOptions::default()))
        .await
        .expect("the upload");
    assert_eq!(first.size, big.len() as u64);
    backend
        .write_file(&id, path, upload(b"small", 5), WriteOptions::default())
        .await
        .expect("a small write over it");
    // Other chunking, same content: the same write.
    let again = op
        .clone()
        .scope(backend.write_file(&id, path, upload(&big, 100_000), WriteOptions::default()))
        .await
        .expect("the same upload again");
    assert_eq!(again, first);
    assert_eq!(
        contents(&backend, &id, path).await,
        b"small",
        "not written twice"
    );
    let mut changed = big.clone();
    *changed.last_mut().unwrap() ^= 1;
    let other = op
        .clone()
        .scope(backend.write_file(
            &id,
            path,
            upload(&changed, 256 * 1024),
            WriteOptions::default(),
        ))
        .await;
    assert!(matches!(other, Err(Error::Conflict { .. })), "{other:?}");
    assert_eq!(
        contents(&backend, &id, path).await,
        b"small",
        "left untouched"
    );
    let status = backend.observe(&op).await.expect("observe");
    assert!(matches!(status, OperationStatus::Done { .. }), "{status:?}");
    backend.destroy(&id).await.expect("destroy");
}

/// A repeat of a write that is still streaming is a conflict at once (nothing waits, nothing
/// is written twice); `observe` says it is in progress until its body ends, then done.
#[tokio::test]
async fn a_repeat_of_a_running_write_is_refused_while_it_runs() {
    let (url, key) = server().await;
    let (backend, id) = sandbox_on(&url, &key, "op-running").await;
    let path = "/workspace/slow";
    let (tx, rx) = tokio::sync::mpsc::channel::<sandcove::Result<Vec<u8>>>(4);
    let data: ByteStream = Box::pin(tokio_stream_of(rx));
    let op = OperationId::new();
    let first = tokio::spawn({
        let backend = backend.clone();
        let id = id.clone();
        op.clone().scope(async move {
            backend
                .write_file(&id, path, data, WriteOptions::default())
                .await
        })
    });
    tx.send(Ok(b"part one, ".to_vec())).await.expect("send");
    eventually(PATIENCE, "the write to be in progress", || async {
        match backend.observe(&op).await {
            Ok(OperationStatus::InProgress) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let repeat = op
        .clone()
        .scope(backend.write_file(
            &id,
            path,
            upload(b"part one, part two", 4),
            WriteOptions::default(),
        ))
        .await;
    assert!(matches!(repeat, Err(Error::Conflict { .. })), "{repeat:?}");
    tx.send(Ok(b"part two".to_vec())).await.expect("send");
    drop(tx);
    let stat = first.await.expect("join").expect("the first write");
    assert_eq!(stat.size, 18);
    assert_eq!(contents(&backend, &id, path).await, b"part one, part two");
    let status = backend.observe(&op).await.expect("observe");
    assert!(matches!(status, OperationStatus::Done { .. }), "{status:?}");
    backend.destroy(&id).await.expect("destroy");
}

/// An upload that stalls mid-body (a client that sends part of it and then nothing, without
/// closing) fails once no byte has come for the server's body idle bound: its connection
/// is answered and released, nothing is written, and its operation id is free again, so the
/// same write under that id then runs. Before, it held the connection and the id for ever
/// (a repeat was a conflict, "still running").
#[tokio::test]
async fn a_stalled_upload_releases_its_connection_and_operation_id() {
    use tokio::io::AsyncWriteExt;
    let mut config = ServerConfig::new("replaced");
    config.body_idle_timeout = Duration::from_millis(500);
    let (url, key) = server_with(config).await;
    let (backend, id) = sandbox_on(&url, &key, "op-stall").await;
    let op = OperationId::new();
    let host = url.trim_start_matches("http://").trim_end_matches('/');
    let mut stalled = TcpStream::connect(host).await.expect("connect");
    let head = format!(
        "PUT /v1/sandboxes/{id}/files?path=%2Fworkspace%2Fstalled HTTP/1.1\r\nHost: {host}\r\n\
         Authorization: Bearer {key}\r\nIdempotency-Key: {}\r\n\
         Content-Type: application/octet-stream\r\nContent-Length: 100\r\n\r\nthe first ten",
        op.as_str()
    );
    stalled.write_all(head.as_bytes()).await.expect("send");
    // The server answers the stalled request (an error) without the rest of its body.
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    let got = tokio::time::timeout(PATIENCE, async {
        while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
            match stalled.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(got.is_ok(), "the stalled upload was never answered");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 5"), "{answer}");
    // Nothing was written, and the id runs the write now.
    let err = backend
        .stat(&id, "/workspace/stalled", StatOptions::default())
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err:?}");
    let stat = op
        .clone()
        .scope(backend.write_file(
            &id,
            "/workspace/stalled",
            upload(b"all of it", 4),
            WriteOptions::default(),
        ))
        .await
        .expect("the write under the freed id");
    assert_eq!(stat.size, 9);
    assert_eq!(
        contents(&backend, &id, "/workspace/stalled").await,
        b"all of it"
    );
    drop(stalled);
    backend.destroy(&id).await.expect("destroy");
}

/// `rx` as a stream.
fn tokio_stream_of<T: Send + 'static>(
    rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures::Stream<Item = T> + Send {
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|v| (v, rx)) })
}

/// mkdir, rename, copy, chmod and remove carry operation ids: repeated under their id they
/// answer the first outcome instead of failing on the change the first made (the directory
/// exists, the source is gone, the file is removed); a lost mkdir answer is
/// `OutcomeUnknown`, and `observe` reports it done.
#[tokio::test]
async fn file_changes_repeated_under_their_operation_id_act_once() {
    let (url, key) = server().await;
    let (backend, id) = sandbox_on(&url, &key, "op-files").await;
    async fn twice<
        T: std::fmt::Debug + PartialEq,
        F: std::future::Future<Output = sandcove::Result<T>>,
    >(
        op: &OperationId,
        call: impl Fn() -> F,
    ) -> T {
        let first = op.clone().scope(call()).await.expect("the first call");
        let again = op.clone().scope(call()).await.expect("the same call again");
        assert_eq!(again, first, "the repeat answers the first outcome");
        first
    }
    let dir = twice(&OperationId::new(), || {
        backend.mkdir(&id, "/workspace/d", MkdirOptions::default())
    })
    .await;
    assert_eq!(dir.kind, FileKind::Dir);
    backend
        .write_file(
            &id,
            "/workspace/d/a",
            upload(b"a", 1),
            WriteOptions::default(),
        )
        .await
        .expect("write");
    twice(&OperationId::new(), || {
        backend.rename(
            &id,
            "/workspace/d/a",
            "/workspace/d/b",
            RenameOptions::default(),
        )
    })
    .await;
    twice(&OperationId::new(), || {
        backend.copy(
            &id,
            "/workspace/d/b",
            "/workspace/d/c",
            CopyOptions::default(),
        )
    })
    .await;
    let moded = twice(&OperationId::new(), || {
        backend.chmod(&id, "/workspace/d/c", ChmodOptions::new(0o600))
    })
    .await;
    assert_eq!(moded.mode, 0o600);
    twice(&OperationId::new(), || {
        backend.remove(&id, "/workspace/d/b", RemoveOptions::default())
    })
    .await;
    let gone = backend
        .stat(&id, "/workspace/d/b", StatOptions::default())
        .await;
    assert!(gone.as_ref().is_err_and(Error::is_not_found), "{gone:?}");
    let plain = backend
        .remove(&id, "/workspace/d/b", RemoveOptions::default())
        .await;
    assert!(
        plain.as_ref().is_err_and(Error::is_not_found),
        "a new remove is a new operation: {plain:?}"
    );

    let relay = lossy_relay(Some(url.clone())).await;
    unanswered_mkdir_is_recorded(&backend, &relay, &key, &id, "/workspace/e").await;
    backend.destroy(&id).await.expect("destroy");
}

/// A mkdir sent through `front` (a relay that loses its answer) is `OutcomeUnknown` naming
/// its operation id, which `backend` observes done, and the directory is there.
async fn unanswered_mkdir_is_recorded(
    backend: &HttpBackend,
    front: &str,
    key: &str,
    id: &str,
    path: &str,
) {
    let lossy = HttpBackend::with_options(front, key, options(0)).expect("client");
    let err = lossy
        .mkdir(id, path, MkdirOptions::default())
        .await
        .expect_err("the answer is lost");
    let op = err.unknown_outcome().expect("the mkdir's operation id");
    observed_done(backend, &op).await;
    let made = backend.stat(id, path, StatOptions::default()).await;
    assert_eq!(made.expect("the directory").kind, FileKind::Dir);
}

/// What `backend` observes of `op` once it is done (waiting while it is in progress or not
/// yet known).
async fn observed_done(backend: &HttpBackend, op: &OperationId) -> OperationStatus {
    eventually(PATIENCE, "the operation to be recorded done", || async {
        match backend.observe(op).await {
            Ok(status @ OperationStatus::Done { .. }) => Ok(status),
            other => Err(format!("{other:?}")),
        }
    })
    .await
}

/// An operation whose client hung up before its answer is still recorded to the end:
/// `observe` reports it done, never "in progress" for ever.
#[tokio::test]
async fn an_operation_whose_client_hung_up_is_recorded_to_its_end() {
    let (url, key) = server().await;
    let (backend, id) = sandbox_on(&url, &key, "op-hangup").await;
    let relay = hanging_up_relay(url.clone()).await;
    unanswered_mkdir_is_recorded(&backend, &relay, &key, &id, "/workspace/h").await;
    backend.destroy(&id).await.expect("destroy");
}
