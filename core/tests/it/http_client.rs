//! `HttpBackend` against a scripted server (wiremock): status mapping, retries, idempotency
//! keys and cut streams. Loopback only.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use sandcove::backend::http::{frame, IDEMPOTENCY_HEADER, PID_HEADER};
use sandcove::client::collect;
use sandcove::{
    Backend, CreateOptions, ErrorCode, HttpBackend, HttpOptions, NetworkPolicy, ProcessEvent,
    ProcessSpec, Resources, SandboxInfo, SandboxState, SetLabelsOptions, SetTimeoutOptions,
    UserInfo,
};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, ResponseTemplate};

fn options() -> HttpOptions {
    let mut options = HttpOptions::default();
    // Generous: a mock on loopback answers at once, but a loaded machine may not run it.
    options.request_timeout = Duration::from_secs(30);
    options.connect_timeout = Duration::from_secs(10);
    options.max_retries = 3;
    options.backoff = Duration::from_millis(10);
    options.max_backoff = Duration::from_secs(2);
    options
}

fn client(server: &MockServer) -> HttpBackend {
    HttpBackend::with_options(&server.uri(), "test-key", options()).unwrap()
}

fn info(id: &str) -> SandboxInfo {
    SandboxInfo {
        id: id.into(),
        name: None,
        state: SandboxState::Running,
        template: "base".into(),
        labels: BTreeMap::new(),
        envs: BTreeMap::new(),
        resources: Resources::default(),
        network: NetworkPolicy::None,
        user: UserInfo {
            name: "user".into(),
            uid: 1000,
            gid: 1000,
            home: "/workspace".into(),
        },
        created_at: 1,
        ends_at: 2,
        on_timeout: Default::default(),
        auto_resume: false,
        volumes: Vec::new(),
        snapshot: None,
        annotations: BTreeMap::new(),
        note: None,
        source_resume_error: None,
        working_dir: None,
    }
}

fn error_json(code: &str, fields: serde_json::Value) -> serde_json::Value {
    serde_json::json!({"code": code, "message": "from the server", "fields": fields})
}

#[tokio::test]
async fn a_503_is_retried_then_succeeds() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/sandboxes/abc"))
        .respond_with(ResponseTemplate::new(503).set_body_string("overloaded"))
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/v1/sandboxes/abc"))
        .respond_with(ResponseTemplate::new(200).set_body_json(info("abc")))
        .mount(&server)
        .await;
    let got = client(&server).get("abc").await.expect("retried");
    assert_eq!(got.id, "abc");
    let requests = server.received_requests().await.unwrap();
    assert_eq!(requests.len(), 2);
    for r in &requests {
        assert_eq!(
            r.headers.get("authorization").unwrap(),
            "Bearer test-key",
            "every attempt carries the key"
        );
    }
}

#[tokio::test]
async fn a_429_honours_retry_after_then_succeeds() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/sandboxes"))
        .respond_with(ResponseTemplate::new(429).insert_header("retry-after", "1"))
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/v1/sandboxes"))
        .respond_with(ResponseTemplate::new(200).set_body_json(vec![info("a")]))
        .mount(&server)
        .await;
    let listed = client(&server).list(Default::default()).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(server.received_requests().await.unwrap().len(), 2);
}

#[tokio::test]
async fn a_429_that_persists_is_rate_limited_with_its_retry_after() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(429).insert_header("retry-after", "0"))
        .mount(&server)
        .await;
    let err = client(&server).get("abc").await.unwrap_err();
    match err {
        sandcove::Error::RateLimited { retry_after_ms, .. } => {
            assert_eq!(retry_after_ms, Some(0))
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(server.received_requests().await.unwrap().len(), 4);
}

#[tokio::test]
async fn a_404_is_not_found() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/sandboxes/gone"))
        .respond_with(ResponseTemplate::new(404).set_body_json(error_json(
            "not_found",
            serde_json::json!({"what": "sandbox \"gone\""}),
        )))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/v1/sandboxes/bare"))
        .respond_with(ResponseTemplate::new(404))
        .mount(&server)
        .await;
    let err = client(&server).get("gone").await.unwrap_err();
    assert!(err.is_not_found());
    assert_eq!(err.to_string(), "sandbox \"gone\" not found");
    let err = client(&server).get("bare").await.unwrap_err();
    assert!(
        err.is_not_found(),
        "a 404 without a body is still not found"
    );
    assert_eq!(
        server.received_requests().await.unwrap().len(),
        2,
        "never retried"
    );
}

#[tokio::test]
async fn a_401_is_unauthenticated() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(401).set_body_json(error_json(
            "unauthenticated",
            serde_json::json!({"message": "wrong API key"}),
        )))
        .mount(&server)
        .await;
    let err = client(&server).get("abc").await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unauthenticated);
    assert!(err.to_string().contains("wrong API key"));
    assert_eq!(server.received_requests().await.unwrap().len(), 1);
}

#[tokio::test]
async fn a_non_json_error_body_is_a_backend_error_naming_the_status() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/sandboxes/abc/pause"))
        .respond_with(
            ResponseTemplate::new(500)
                .insert_header("content-type", "text/html")
                .set_body_string("<html><h1>Internal proxy error</h1></html>"),
        )
        .mount(&server)
        .await;
    let err = client(&server).pause("abc").await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::Backend);
    let text = err.to_string();
    assert!(
        text.contains("500") && text.contains("Internal proxy error"),
        "{text}"
    );
    assert_eq!(
        server.received_requests().await.unwrap().len(),
        1,
        "a non-idempotent call is not retried on 5xx"
    );
}

#[tokio::test]
async fn a_not_supported_answer_is_not_retried() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(501).set_body_json(error_json(
            "not_supported",
            serde_json::json!({"feature": "metrics", "alternative": "run top"}),
        )))
        .mount(&server)
        .await;
    let err = client(&server).metrics("abc").await.unwrap_err();
    match err {
        sandcove::Error::NotSupported {
            feature,
            alternative,
        } => {
            assert_eq!(feature, "metrics");
            assert_eq!(alternative, "run top");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(server.received_requests().await.unwrap().len(), 1);
}

fn stream_body(frames: &[(u8, &[u8])]) -> Vec<u8> {
    frames
        .iter()
        .flat_map(|(k, p)| frame::encode(*k, p))
        .collect()
}

#[tokio::test]
async fn a_process_stream_cut_mid_way_ends_with_an_error() {
    let server = MockServer::start().await;
    // Output, then the body ends without the exit event.
    Mock::given(method("POST"))
        .and(path("/v1/sandboxes/abc/processes"))
        .respond_with(
            ResponseTemplate::new(200)
                .insert_header(PID_HEADER, "42")
                .set_body_bytes(stream_body(&[(frame::STDOUT, b"partial \xff")])),
        )
        .mount(&server)
        .await;
    let backend = client(&server);
    let spec = ProcessSpec::new(sandcove::Command::argv(["true"]));
    let mut stream = backend.spawn("abc", spec.clone()).await.unwrap();
    assert_eq!(stream.pid, 42);
    assert_eq!(
        stream.events.next().await.unwrap().unwrap(),
        ProcessEvent::Stdout(b"partial \xff".to_vec())
    );
    let last = stream
        .events
        .next()
        .await
        .expect("an error item, not a silent end");
    assert!(last.is_err(), "{last:?}");
    assert!(stream.events.next().await.is_none());
    let stream = backend.spawn("abc", spec).await.unwrap();
    assert!(
        collect(stream, usize::MAX).await.is_err(),
        "collecting a cut stream fails"
    );
}

#[tokio::test]
async fn a_stream_cut_inside_a_frame_ends_with_an_error() {
    let server = MockServer::start().await;
    let mut body = stream_body(&[(frame::DATA, b"first")]);
    body.extend_from_slice(&frame::encode(frame::DATA, b"second chunk")[..8]);
    Mock::given(method("GET"))
        .and(path("/v1/sandboxes/abc/files"))
        .respond_with(ResponseTemplate::new(200).set_body_bytes(body))
        .mount(&server)
        .await;
    let mut data = client(&server)
        .read_file("abc", "/x", Default::default())
        .await
        .unwrap();
    assert_eq!(data.next().await.unwrap().unwrap(), b"first");
    assert!(data.next().await.unwrap().is_err());
    assert!(data.next().await.is_none());
}

#[tokio::test]
async fn a_download_without_its_end_frame_is_an_error() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/sandboxes/abc/files"))
        .respond_with(
            ResponseTemplate::new(200).set_body_bytes(stream_body(&[(frame::DATA, b"abc")])),
        )
        .mount(&server)
        .await;
    let mut data = client(&server)
        .read_file("abc", "/x", Default::default())
        .await
        .unwrap();
    let mut got = Vec::new();
    let mut failed = false;
    while let Some(chunk) = data.next().await {
        match chunk {
            Ok(bytes) => got.extend(bytes),
            Err(_) => failed = true,
        }
    }
    assert_eq!(got, b"abc");
    assert!(failed, "a short download is never silent");
}

#[tokio::test]
async fn a_complete_download_has_no_error() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/sandboxes/abc/files"))
        .respond_with(ResponseTemplate::new(200).set_body_bytes(stream_body(&[
            (frame::DATA, b"ab"),
            (frame::DATA, b"\x00c"),
            (frame::END, b""),
        ])))
        .mount(&server)
        .await;
    let mut data = client(&server)
        .read_file("abc", "/x", Default::default())
        .await
        .unwrap();
    let mut got = Vec::new();
    while let Some(chunk) = data.next().await {
        got.extend(chunk.unwrap());
    }
    assert_eq!(got, b"ab\x00c");
    let query = &server.received_requests().await.unwrap()[0].url;
    assert_eq!(query.query(), Some("path=%2Fx"));
}

#[tokio::test]
async fn a_create_whose_response_is_lost_is_retried_with_the_same_key() {
    let server = MockServer::start().await;
    // The first answer never arrives in time (as if lost); the retry gets one.
    Mock::given(method("POST"))
        .and(path("/v1/sandboxes"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(info("first"))
                .set_delay(Duration::from_secs(300)),
        )
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/v1/sandboxes"))
        .respond_with(ResponseTemplate::new(200).set_body_json(info("first")))
        .mount(&server)
        .await;
    let backend = HttpBackend::with_options(&server.uri(), "test-key", {
        let mut options = options();
        // The lost answer times out after this; the retry's answer must arrive within it
        // too, so it is far above a loaded machine's scheduling delay.
        options.request_timeout = Duration::from_secs(10);
        options
    })
    .unwrap();
    let created = backend.create(CreateOptions::default()).await.unwrap();
    assert_eq!(created.id, "first");
    let requests = server.received_requests().await.unwrap();
    assert_eq!(requests.len(), 2);
    let keys: Vec<_> = requests
        .iter()
        .map(|r: &Request| {
            r.headers
                .get(IDEMPOTENCY_HEADER)
                .expect("an idempotency key")
                .to_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert!(!keys[0].is_empty());
    assert_eq!(keys[0], keys[1], "the retry carries the same key");
    // A second, separate create gets a different key.
    backend.create(CreateOptions::default()).await.unwrap();
    let requests = server.received_requests().await.unwrap();
    let third = requests[2].headers.get(IDEMPOTENCY_HEADER).unwrap();
    assert_ne!(third.to_str().unwrap(), keys[0]);
}

#[tokio::test]
async fn a_spawn_is_not_retried_on_5xx() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(502).set_body_string("bad gateway"))
        .mount(&server)
        .await;
    let spec = ProcessSpec::new(sandcove::Command::argv(["true"]));
    let err = client(&server).spawn("abc", spec).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::Backend);
    assert_eq!(server.received_requests().await.unwrap().len(), 1);
}

#[tokio::test]
async fn connection_failures_are_retried_then_unavailable() {
    // Bind and drop a listener: nothing listens on that port any more.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let backend =
        HttpBackend::with_options(&format!("http://127.0.0.1:{port}"), "k", options()).unwrap();
    let err = backend.get("abc").await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unavailable, "{err}");
    let caps = backend.capabilities();
    assert_eq!(caps.backend, "http+unknown");
    assert!(!caps.pause);
}

/// `capabilities()` never does I/O: before `ready` it reports nothing optional; `ready` asks
/// the server once and later calls answer from the cache.
#[tokio::test]
async fn capabilities_are_fetched_once_by_ready_and_never_by_capabilities() {
    let server = MockServer::start().await;
    let local = sandcove::LocalBackend::new().unwrap().capabilities();
    Mock::given(method("GET"))
        .and(path("/v1/capabilities"))
        .respond_with(ResponseTemplate::new(200).set_body_json(local))
        .expect(1)
        .mount(&server)
        .await;
    let backend = client(&server);
    let before = backend.capabilities();
    assert_eq!(before.backend, "http+unknown");
    assert!(!before.pause && !before.previews);
    assert!(server.received_requests().await.unwrap().is_empty());
    assert_eq!(backend.ready().await.unwrap().backend, "http+local");
    assert_eq!(backend.ready().await.unwrap().backend, "http+local");
    assert_eq!(backend.capabilities().backend, "http+local", "cached");
    server.verify().await;
}

/// Bad input is refused by the client with the engine's error, before anything is sent.
#[tokio::test]
async fn bad_input_is_refused_before_anything_is_sent() {
    let server = MockServer::start().await;
    let backend = client(&server);
    let mut bad_envs = CreateOptions::default();
    bad_envs.envs.insert("A=B".into(), "x".into());
    let bad_name = CreateOptions::default().name("../x");
    for options in [bad_envs, bad_name] {
        let e = backend.create(options.clone()).await.unwrap_err();
        assert_eq!(e.code(), ErrorCode::InvalidArgument, "{e}");
        let e = backend.fork("sb", options).await.unwrap_err();
        assert_eq!(e.code(), ErrorCode::InvalidArgument, "{e}");
    }
    let e = backend
        .spawn("sb", ProcessSpec::new(sandcove::Command::argv(["a\0b"])))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument, "{e}");
    let labels = BTreeMap::from([(String::new(), "v".to_string())]);
    let e = backend
        .set_labels("sb", SetLabelsOptions::new(labels))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument, "{e}");
    let e = backend
        .set_timeout(
            "sb",
            SetTimeoutOptions::new(sandcove::MAX_SANDBOX_TIMEOUT * 2),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument, "{e}");
    assert!(server.received_requests().await.unwrap().is_empty());
}

/// Reopening a saved reference through a server that cannot be reached is `Unavailable`
/// (never `NotFound`: the resource may well exist), and so is minting a reference before the
/// runtime was reached.
#[tokio::test]
async fn reopen_through_an_unreachable_server_is_unavailable() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let backend =
        HttpBackend::with_options(&format!("http://127.0.0.1:{port}"), "k", options()).unwrap();
    let client = sandcove::Client::new(std::sync::Arc::new(backend));
    let reference: sandcove::Reference = "sandcove:v1:rt-a:sandbox:abc".parse().unwrap();
    let err = client.reopen(&reference).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unavailable, "{err}");
    let err = client.sandbox("abc").reference().unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unavailable, "{err}");
}

/// Every file change sent through the client (the path every facade's file writes take)
/// carries an operation id: a fresh one per call, or the scope's when the caller names one.
#[tokio::test]
async fn every_file_change_carries_an_operation_id() {
    let server = MockServer::start().await;
    let stat = serde_json::json!({
        "path": "/workspace/f", "name": "f", "kind": "file", "size": 2, "mode": 420,
        "uid": 1000, "gid": 1000, "owner": "user", "group": "user", "modified": 1,
        "symlink_target": null
    });
    Mock::given(method("DELETE"))
        .respond_with(ResponseTemplate::new(204))
        .mount(&server)
        .await;
    Mock::given(wiremock::matchers::any())
        .respond_with(ResponseTemplate::new(200).set_body_json(&stat))
        .mount(&server)
        .await;
    let backend = std::sync::Arc::new(client(&server));
    let sandbox = sandcove::Client::new(backend).sandbox("abc");
    sandbox.write("/workspace/f", b"hi".to_vec()).await.unwrap();
    let stream: sandcove::ByteStream = Box::pin(futures::stream::iter(vec![Ok(b"hi".to_vec())]));
    sandbox
        .write_stream("/workspace/f", stream, Default::default())
        .await
        .unwrap();
    sandbox.mkdir("/workspace/d").await.unwrap();
    sandbox
        .rename("/workspace/f", "/workspace/g")
        .await
        .unwrap();
    sandbox
        .copy("/workspace/g", "/workspace/h", Default::default())
        .await
        .unwrap();
    sandbox.chmod("/workspace/h", 0o600).await.unwrap();
    sandbox.remove("/workspace/h").await.unwrap();
    let mine = sandcove::OperationId::new();
    mine.clone()
        .scope(sandbox.write("/workspace/f", b"again".to_vec()))
        .await
        .unwrap();
    let requests = server.received_requests().await.unwrap();
    let keys: Vec<String> = requests
        .iter()
        .map(|r: &Request| {
            r.headers
                .get(IDEMPOTENCY_HEADER)
                .unwrap_or_else(|| panic!("{} {} without an operation id", r.method, r.url))
                .to_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(keys.len(), 8, "{keys:?}");
    let distinct: std::collections::BTreeSet<_> = keys.iter().collect();
    assert_eq!(distinct.len(), 8, "a fresh id per call: {keys:?}");
    assert_eq!(keys[7], mine.as_str(), "the scope's id");
}
