//! Operation ids over HTTP (issue 21): a call repeated under its operation id acts once, a
//! lost answer is `OutcomeUnknown` naming the id, and `observe` says what became of it. Every
//! server here is a real loopback `sandcove serve` wrapping the embedded engine; the "lossy"
//! front is a small loopback relay that forwards a request and drops the answer.

use std::sync::Arc;
use std::time::Duration;

use sandcove::conformance::{eventually, sh, test_options, unique, PATIENCE};
use sandcove::server::{LocalServer, ServerConfig};
use sandcove::{
    Backend, Client, Command, Error, HttpBackend, HttpOptions, ListOptions, LocalBackend,
    OperationId, OperationStatus, ProcessEvent, ProcessSpec,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
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

/// A loopback relay that forwards each request to `upstream` (when given), waits for the
/// head of its answer, and then drops the client's connection without answering: the
/// request took effect (or not, without upstream) and its answer is lost.
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
                let request = read_request(&mut client).await;
                if let Some(upstream) = upstream {
                    let mut server = TcpStream::connect(&upstream).await.expect("upstream");
                    server.write_all(&request).await.expect("forward");
                    let mut answer = Vec::new();
                    let mut chunk = [0u8; 4096];
                    while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
                        let n = server.read(&mut chunk).await.expect("read the answer");
                        if n == 0 {
                            break;
                        }
                        answer.extend_from_slice(&chunk[..n]);
                    }
                }
                // Dropping `client` here loses the answer.
                drop(client);
            });
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
        matches!(refused, Err(Error::InvalidArgument { .. })),
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
    let backend = Arc::new(HttpBackend::connect(&url, &key).await.expect("connect"));
    let id = backend
        .create(test_options(&unique("op-spawn")))
        .await
        .expect("create")
        .id;
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
