//! Daytona's wire protocol from a Rust client: the strict DTOs' JSON types, Daytona's error
//! shapes, refusals before any effect, bounded uploads and downloads. The router runs in
//! this process over the embedded engine with a private state directory.

use std::time::Duration;

use sandcove::Backend;
use sandcove_conformance::eventually;
use serde_json::{json, Value};

use crate::common::{self, WireEnv};

/// The served router with this module's calls: a type of its own, because the other
/// listeners' modules in this test binary name their calls the same.
struct Env(WireEnv);

impl std::ops::Deref for Env {
    type Target = WireEnv;

    fn deref(&self) -> &WireEnv {
        &self.0
    }
}

const KEY: &str = "daytona-wire-key";

async fn env_with(max_upload_bytes: usize) -> Env {
    Env::start(|backend, url| {
        let mut config = daytona::wire::WireConfig::new(KEY, url);
        config.max_upload_bytes = max_upload_bytes;
        daytona::wire::router(backend, config)
    })
    .await
}

async fn env() -> Env {
    env_with(64 * 1024 * 1024).await
}

impl Env {
    async fn start(
        router: impl FnOnce(std::sync::Arc<sandcove::LocalBackend>, String) -> axum::Router,
    ) -> Env {
        Env(WireEnv::start(router).await)
    }

    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut req = self
            .http
            .request(method.parse().unwrap(), format!("{}{path}", self.url))
            .bearer_auth(KEY);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    async fn create(&self) -> Value {
        let (status, sb) = self
            .call(
                "POST",
                "/api/sandbox",
                Some(json!({"env": {"A": "1"}, "labels": {"code-toolbox-language": "python", "k": "v"}, "volumes": []})),
            )
            .await;
        assert_eq!(status, 200, "{sb}");
        sb
    }

    async fn sandbox_count(&self) -> usize {
        self.backend.list(Default::default()).await.unwrap().len()
    }
}

/// Issue 36 (item 24): the create the SDK's `create()` sends is served by the warm pool (the
/// first one goes cold and has the pool keep its shape), in Daytona's shape: internet where
/// the engine has it, the `daytona` user and its home.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_default_create_is_served_from_the_warm_pool() {
    let env = Env(WireEnv::start_with_warm_pool(1, |backend, url| {
        daytona::wire::router(backend, daytona::wire::WireConfig::new(KEY, url))
    })
    .await);
    let first = env.create().await;
    let path = format!("/api/sandbox/{}", first["id"].as_str().unwrap());
    assert_eq!(env.call("DELETE", &path, None).await.0, 200);
    eventually(
        Duration::from_secs(60),
        "the pool holds a member",
        || async { sandcove_conformance::equals(env.backend.warm_ready(), 1) },
    )
    .await;
    let claims = env.backend.warm_claims();
    let sb = env.create().await;
    assert_eq!(env.backend.warm_claims(), claims + 1, "served by the pool");
    let id = sb["id"].as_str().unwrap();
    let info = env.backend.get(id).await.unwrap();
    assert_eq!(
        info.network,
        env.backend.capabilities().vendor_internet_default()
    );
    let out = sandcove_conformance::sh(&*env.backend, id, "id -un; echo $HOME; stat -c %U ~").await;
    assert_eq!(out.stdout_lossy(), "daytona\n/home/daytona\ndaytona\n");
    let path = format!("/api/sandbox/{id}");
    assert_eq!(env.call("DELETE", &path, None).await.0, 200);
}

/// Daytona's 23 state values: anything else fails the SDK's enum validation.
const STATES: &[&str] = &[
    "creating",
    "restoring",
    "destroyed",
    "destroying",
    "started",
    "stopped",
    "starting",
    "stopping",
    "error",
    "build_failed",
    "pending_build",
    "building_snapshot",
    "unknown",
    "pulling_snapshot",
    "archived",
    "archiving",
    "resizing",
    "snapshotting",
    "forking",
    "pausing",
    "paused",
    "resuming",
];

/// The fields the SDK's strict `Sandbox` model requires, with their JSON types.
fn assert_strict_sandbox(sb: &Value, toolbox: &str) {
    for key in [
        "id",
        "organizationId",
        "name",
        "user",
        "target",
        "toolboxProxyUrl",
    ] {
        assert!(sb[key].is_string(), "{key} must be a string: {sb}");
    }
    for key in ["env", "labels"] {
        let map = sb[key].as_object().unwrap_or_else(|| panic!("{key}: {sb}"));
        assert!(map.values().all(Value::is_string), "{key} of strings: {sb}");
    }
    for key in ["public", "networkBlockAll", "kvm"] {
        assert!(sb[key].is_boolean(), "{key} must be a boolean: {sb}");
    }
    for key in ["cpu", "gpu", "memory", "disk"] {
        assert!(
            sb[key].is_i64(),
            "{key} must be a JSON integer (StrictInt): {sb}"
        );
    }
    let state = sb["state"].as_str().expect("state");
    assert!(STATES.contains(&state), "state {state} is not Daytona's");
    assert_eq!(sb["toolboxProxyUrl"], toolbox, "absolute, on this listener");
}

#[tokio::test]
async fn sandbox_answers_are_strict_dtos_with_exact_json_types() {
    let env = env().await;
    let toolbox = format!("{}/toolbox", env.url);
    let sb = env.create().await;
    assert_strict_sandbox(&sb, &toolbox);
    assert_eq!(
        sb["state"], "started",
        "create answers once the sandbox runs"
    );
    assert_eq!(sb["env"]["A"], "1");
    assert_eq!(sb["labels"]["k"], "v");
    let id = sb["id"].as_str().unwrap();
    let (status, got) = env.call("GET", &format!("/api/sandbox/{id}"), None).await;
    assert_eq!(status, 200);
    assert_strict_sandbox(&got, &toolbox);
    let (status, page) = env
        .call("GET", "/api/sandbox?labels=%7B%22k%22%3A%22v%22%7D", None)
        .await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["items"].as_array().unwrap().len(), 1);
    assert_strict_sandbox(&page["items"][0], &toolbox);
    assert!(page["nextCursor"].is_null());
    // Pages: a cursor walks every sandbox once, the last page has no next cursor.
    let others = [env.create().await, env.create().await];
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            None => "/api/sandbox?limit=2".to_string(),
            Some(c) => format!("/api/sandbox?limit=2&cursor={c}"),
        };
        let (status, page) = env.call("GET", &path, None).await;
        assert_eq!(status, 200, "{page}");
        let items = page["items"].as_array().unwrap();
        assert!(items.len() <= 2);
        seen.extend(items.iter().map(|s| s["id"].as_str().unwrap().to_string()));
        match page["nextCursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => break,
        }
    }
    seen.sort();
    let mut all: Vec<String> = [&sb, &others[0], &others[1]]
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_string())
        .collect();
    all.sort();
    assert_eq!(seen, all);
    let (status, stopped) = env
        .call("POST", &format!("/api/sandbox/{id}/stop"), None)
        .await;
    assert_eq!(status, 200);
    assert_eq!(stopped["state"], "stopped");
    let (status, gone) = env
        .call("DELETE", &format!("/api/sandbox/{id}"), None)
        .await;
    assert_eq!(status, 200, "delete answers 200 with the sandbox");
    assert_strict_sandbox(&gone, &toolbox);
    assert_eq!(gone["state"], "destroyed");
}

#[tokio::test]
async fn errors_have_daytonas_shape_and_status() {
    let env = env().await;
    for (method, path) in [
        ("GET", "/api/sandbox/no-such-sandbox"),
        ("DELETE", "/api/sandbox/no-such-sandbox"),
        ("POST", "/toolbox/no-such-sandbox/process/execute"),
    ] {
        let (status, body) = env
            .call(method, path, Some(json!({"command": "true"})))
            .await;
        assert_eq!(status, 404, "{method} {path}: {body}");
        assert_eq!(body["statusCode"], 404);
        assert_eq!(body["error"], "Not Found");
        assert!(body["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
    let sb = env.create().await;
    let id = sb["id"].as_str().unwrap();
    let (status, body) = env
        .call(
            "POST",
            &format!("/toolbox/{id}/process/execute"),
            Some(json!({"command": "sleep 5", "timeout": 1})),
        )
        .await;
    assert_eq!(status, 408, "a timeout is 408: {body}");
    assert_eq!(body["statusCode"], 408);
    let (status, body) = env
        .call(
            "POST",
            &format!("/toolbox/{id}/process/execute"),
            Some(json!({"command": "exit 7"})),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(body["exitCode"], 7);
    // What this listener does not serve is said so, not reported as a missing sandbox: a
    // documented gap as the facade's refusal (400, its alternative), anything else as 501.
    for (method, path, wanted) in [
        ("POST", format!("/api/sandbox/{id}/resize"), 400),
        ("POST", format!("/toolbox/{id}/lsp/start"), 400),
        ("POST", format!("/toolbox/{id}/process/pty"), 501),
        ("GET", format!("/toolbox/{id}/git/history"), 501),
    ] {
        let (status, body) = env.call(method, &path, Some(json!({}))).await;
        assert_eq!(status, wanted, "{method} {path}: {body}");
        assert!(
            body["message"].as_str().unwrap().contains("instead"),
            "{body}"
        );
    }
    // A JSON body past the limit is refused before it is parsed.
    let big = "x".repeat(2 * 1024 * 1024);
    let (status, body) = env
        .call(
            "POST",
            &format!("/toolbox/{id}/process/execute"),
            Some(json!({"command": big})),
        )
        .await;
    assert_eq!(status, 413, "{body}");
}

/// Options this runtime cannot honour, and options it does not know, are refused before any
/// sandbox exists; so is an image (a Dockerfile that only names one) this runtime has not
/// stored, as Daytona's not-found saying how to store it.
#[tokio::test]
async fn unknown_and_unsupported_create_options_are_refused_before_any_effect() {
    let env = env().await;
    for body in [
        json!({"kvm": true}),
        json!({"someFutureOption": 1}),
        json!({"buildInfo": {"dockerfileContent": "FROM python:3.12\nRUN pip install numpy"}}),
        json!({"gpu": 1}),
        json!({"networkAllowList": "10.0.0.0/8"}),
        json!({"cpu": 64}),
    ] {
        let (status, answer) = env.call("POST", "/api/sandbox", Some(body.clone())).await;
        assert_eq!(status, 400, "{body} -> {answer}");
        assert_eq!(answer["statusCode"], 400);
    }
    // An image named by the SDK (a Dockerfile of one `FROM`) that the store lacks: 404,
    // saying how to pull it.
    let (status, answer) = env
        .call(
            "POST",
            "/api/sandbox",
            Some(json!({"buildInfo": {"dockerfileContent": "FROM python:3.12"}})),
        )
        .await;
    assert_eq!(status, 404, "{answer}");
    assert!(
        answer["message"]
            .as_str()
            .is_some_and(|m| m.contains("sandcove image pull")),
        "{answer}"
    );
    let (_, answer) = env
        .call("POST", "/api/sandbox", Some(json!({"kvm": true})))
        .await;
    assert!(
        answer["message"].as_str().unwrap().contains("instead"),
        "a gap names its alternative: {answer}"
    );
    let body = json!({"buildInfo": {"dockerfileContent": "FROM python:3.12"}});
    let (status, answer) = env.call("POST", "/api/sandbox", Some(body)).await;
    assert_eq!(status, 404, "{answer}");
    assert!(
        answer["message"]
            .as_str()
            .unwrap()
            .contains("sandcove image pull python:3.12"),
        "says how to store it: {answer}"
    );
    assert_eq!(env.sandbox_count().await, 0, "nothing was created");
}

fn multipart(boundary: &str, parts: &[(&str, Option<&str>, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, filename, data) in parts {
        let filename = filename
            .map(|f| format!("; filename=\"{f}\""))
            .unwrap_or_default();
        out.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"{filename}\r\n\r\n"
            )
            .as_bytes(),
        );
        out.extend_from_slice(data);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    out
}

/// An upload larger than the listener's limit is refused before anything is written, and a
/// download never holds more than that limit in memory: a bigger file (here one sandbox
/// code wrote) comes back as an error part, not as its bytes.
#[tokio::test]
async fn uploads_and_downloads_are_bounded_by_the_listener_limit() {
    let env = env_with(1000).await;
    let sb = env.create().await;
    let id = sb["id"].as_str().unwrap();
    let upload = |body: Vec<u8>| {
        env.http
            .post(format!("{}/toolbox/{id}/files/bulk-upload", env.url))
            .bearer_auth(KEY)
            .header("content-type", "multipart/form-data; boundary=BB")
            .body(body)
            .send()
    };
    let big = vec![b'x'; 2000];
    let r = upload(multipart(
        "BB",
        &[
            ("files[0].path", None, b"big.txt"),
            ("files[0].file", Some("big.txt"), &big),
        ],
    ))
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let r = upload(multipart(
        "BB",
        &[
            ("files[0].path", None, b"small.txt"),
            ("files[0].file", Some("small.txt"), b"tiny"),
        ],
    ))
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let (status, listing) = env
        .call("GET", &format!("/toolbox/{id}/files?path=."), None)
        .await;
    assert_eq!(status, 200);
    let names: Vec<&str> = listing
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["small.txt"], "the refused upload wrote nothing");
    // Sandbox code makes a file past the limit.
    let (status, _) = env
        .call(
            "POST",
            &format!("/toolbox/{id}/process/execute"),
            Some(json!({"command": "head -c 5000 /dev/zero > grown.bin"})),
        )
        .await;
    assert_eq!(status, 200);
    let r = env
        .http
        .post(format!("{}/toolbox/{id}/files/bulk-download", env.url))
        .bearer_auth(KEY)
        .json(&json!({"paths": ["small.txt", "grown.bin"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let body = r.bytes().await.unwrap();
    assert!(body.len() < 1000, "{} bytes came back", body.len());
    let text = String::from_utf8_lossy(&body);
    assert!(
        text.contains("name=\"file\"; filename=\"small.txt\""),
        "{text}"
    );
    assert!(
        text.contains("name=\"error\"; filename=\"grown.bin\""),
        "{text}"
    );
}

/// A raw WebSocket client for the event socket: one masked text frame out.
async fn ws_send(conn: &mut tokio::net::TcpStream, text: &str) {
    use tokio::io::AsyncWriteExt;
    let mask = [0x12u8, 0x34, 0x56, 0x78];
    let data = text.as_bytes();
    assert!(data.len() < 126, "short frames only");
    let mut frame = vec![0x81, 0x80 | data.len() as u8];
    frame.extend_from_slice(&mask);
    frame.extend(data.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    conn.write_all(&frame).await.unwrap();
}

/// The next server frame: (opcode, payload).
async fn ws_read(conn: &mut tokio::net::TcpStream) -> (u8, Vec<u8>) {
    use tokio::io::AsyncReadExt;
    let read = async {
        let mut head = [0u8; 2];
        conn.read_exact(&mut head).await.unwrap();
        assert_eq!(head[1] & 0x80, 0, "server frames are not masked");
        let len = match head[1] & 0x7f {
            126 => {
                let mut b = [0u8; 2];
                conn.read_exact(&mut b).await.unwrap();
                u16::from_be_bytes(b) as usize
            }
            127 => panic!("unexpectedly long frame"),
            n => n as usize,
        };
        let mut payload = vec![0u8; len];
        conn.read_exact(&mut payload).await.unwrap();
        (head[0] & 0x0f, payload)
    };
    tokio::time::timeout(Duration::from_secs(30), read)
        .await
        .expect("a frame from the server")
}

/// Open the event socket the way the SDKs do; the `101` head is checked.
async fn open_event_socket(url: &str) -> tokio::net::TcpStream {
    let addr = url.trim_start_matches("http://");
    let conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    event_socket_on(conn, addr).await
}

/// [`open_event_socket`] on a connection made already.
async fn event_socket_on(mut conn: tokio::net::TcpStream, addr: &str) -> tokio::net::TcpStream {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let request = format!(
        "GET /api/socket.io/?source=sdk-python&EIO=4&transport=websocket HTTP/1.1\r\n\
         Host: {addr}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    );
    conn.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        assert_eq!(conn.read(&mut byte).await.unwrap(), 1, "{head:?}");
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
    // RFC 6455's own example key and answer.
    assert!(
        head.to_ascii_lowercase()
            .contains("sec-websocket-accept: s3pplmbitxaq9kygzzhzrbk+xoo="),
        "{head}"
    );
    let (opcode, open) = ws_read(&mut conn).await;
    assert_eq!(opcode, 1);
    let open = String::from_utf8(open).unwrap();
    let open: Value =
        serde_json::from_str(open.strip_prefix('0').expect("Engine.IO open")).unwrap();
    assert!(open["sid"].is_string(), "{open}");
    assert_eq!(open["upgrades"], json!([]));
    assert!(open["pingInterval"].as_u64().unwrap() > 0);
    conn
}

/// The SDKs' event socket (`/api/socket.io/`, Socket.IO over a WebSocket): the server's key
/// in the `CONNECT` packet connects, pings are answered; any other token is refused with a
/// `CONNECT_ERROR` and the socket is closed; a request that is not a WebSocket is `400`.
#[tokio::test]
async fn the_event_socket_connects_with_the_servers_key_only() {
    use tokio::io::AsyncReadExt;
    let env = env().await;
    let mut conn = open_event_socket(&env.url).await;
    ws_send(&mut conn, &format!("40{}", json!({"token": KEY}))).await;
    let (_, connected) = ws_read(&mut conn).await;
    let connected = String::from_utf8(connected).unwrap();
    assert!(connected.starts_with("40{\"sid\":"), "{connected}");
    ws_send(&mut conn, "2").await;
    assert_eq!(
        ws_read(&mut conn).await,
        (1, b"3".to_vec()),
        "a ping is answered"
    );
    for token in [
        json!("wrong-key"),
        json!(""),
        json!(format!("{KEY}x")),
        json!(null),
    ] {
        let mut conn = open_event_socket(&env.url).await;
        ws_send(&mut conn, &format!("40{}", json!({ "token": token }))).await;
        let (_, refused) = ws_read(&mut conn).await;
        let refused = String::from_utf8(refused).unwrap();
        assert!(refused.starts_with("44{"), "{token}: {refused}");
        assert_eq!(ws_read(&mut conn).await.0, 0x8, "then closed");
        let mut rest = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(30), conn.read_to_end(&mut rest))
            .await
            .expect("the connection ends");
    }
    let r = env
        .http
        .get(format!(
            "{}/api/socket.io/?EIO=4&transport=polling",
            env.url
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
}

/// Finding (as on the Blaxel listener): a refused request answered before its body was read
/// closed a connection its client was reusing. Each refusal (no key, a wrong key, a gap, an
/// unserved path, a path outside the API) is sent head first, its body after; every answer,
/// and a next request's, arrives on the one connection.
#[tokio::test]
async fn refused_requests_keep_a_reused_connection() {
    let env = env().await;
    let auth = format!("Authorization: Bearer {KEY}\r\n");
    common::refusals_keep_the_connection(
        &env.url,
        &[
            ("POST", "/api/sandbox", "", 401),
            (
                "POST",
                "/api/sandbox",
                "Authorization: Bearer wrong\r\n",
                401,
            ),
            ("POST", "/api/object-storage/push", auth.as_str(), 400),
            ("POST", "/api/unserved", auth.as_str(), 501),
            ("POST", "/elsewhere", auth.as_str(), 404),
        ],
        ("GET", "/api/sandbox", auth.as_str(), 200),
    )
    .await;
    common::an_oversized_refused_body_closes_cleanly(&env.url, "POST", "/api/sandbox", "", 401)
        .await;
}

/// The server's policy (`sandcove serve --max-sandboxes`, `--allow-host-network`) is applied
/// to the backend under this listener too: a create past the cap is Daytona's 403
/// (`DaytonaForbiddenError` in the SDKs) and makes nothing. (Daytona's wire cannot ask for the
/// host's network: no create field maps to it.)
#[tokio::test]
async fn the_servers_policy_refuses_with_daytonas_403() {
    let env = Env::start(|backend, url| {
        let mut policy = sandcove::server::ServerPolicy::default();
        policy.max_sandboxes = 1;
        let governed = std::sync::Arc::new(sandcove::server::PolicyBackend::new(backend, policy));
        daytona::wire::router(governed, daytona::wire::WireConfig::new(KEY, url))
    })
    .await;
    env.create().await;
    let (status, body) = env.call("POST", "/api/sandbox", Some(json!({}))).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["statusCode"], json!(403), "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("limit of 1 live sandboxes"),
        "{body}"
    );
    assert_eq!(env.sandbox_count().await, 1);
}

/// Finding: a pre-auth client of the event socket that sends pings and never reads the
/// answers held its connection slot ~600 s, not the documented 10 s (the handshake's timer
/// ended, then the closing frame waited on the full send buffer until the idle limit). The
/// pre-auth deadline is now the upgrade's own: such a client is cut at it (1 s here) and its
/// slot of the listener's cap (2 here) is free again, while an authenticated socket goes on.
#[tokio::test]
async fn a_pre_auth_client_that_pings_and_never_reads_is_cut_at_the_deadline() {
    use tokio::io::AsyncWriteExt;
    let state = sandcove_tests::PrivateState::new();
    let backend =
        std::sync::Arc::new(sandcove::LocalBackend::with_state_dir(&state.dir).expect("engine"));
    let mut limits = common::test_limits();
    limits.max_connections = 2;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let url = format!("http://{addr}");
    let mut config = daytona::wire::WireConfig::new(KEY, url.clone());
    config.pre_auth_timeout = Duration::from_secs(1);
    let app = daytona::wire::router(backend, config);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(sandcove::server::serve_router(
        listener,
        app,
        limits,
        async move {
            let _ = stopped.await;
        },
    ));

    // An authenticated socket: the deadline is not for it.
    let mut connected = open_event_socket(&url).await;
    ws_send(&mut connected, &format!("40{}", json!({"token": KEY}))).await;
    assert!(String::from_utf8(ws_read(&mut connected).await.1)
        .unwrap()
        .starts_with("40{"));

    // The attacker: a small receive buffer, pings until the server can no longer send the
    // pongs (its writes wait on this client, which reads nothing).
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let conn = socket.connect(addr.parse().unwrap()).await.unwrap();
    let mut attacker = event_socket_on(conn, &addr).await;
    let mask = [1u8, 2, 3, 4];
    let mut ping = vec![0x89u8, 0x80 | 125];
    ping.extend_from_slice(&mask);
    ping.extend((0..125).map(|i| b'p' ^ mask[i % 4]));
    let blocked = async {
        loop {
            match tokio::time::timeout(Duration::from_millis(200), attacker.write_all(&ping)).await
            {
                Ok(Ok(())) => continue,
                // The server stopped taking pings (it waits on its pongs) or is gone.
                Ok(Err(_)) | Err(_) => return,
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(60), blocked)
        .await
        .expect("the server's pongs back up");

    // Both slots are taken; a plain request gets an answer once the attacker is cut.
    let http = reqwest::Client::builder()
        .timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    sandcove_conformance::eventually(
        Duration::from_secs(20),
        "the attacker's slot is freed",
        || async {
            http.get(format!("{url}/api/sandbox"))
                .bearer_auth(KEY)
                .send()
                .await
                .map(|r| r.status().as_u16())
                .map_err(|e| e.to_string())
        },
    )
    .await;
    // The attacker's connection is gone (its next write, or the one after, fails).
    let attacker = std::sync::Arc::new(tokio::sync::Mutex::new(attacker));
    sandcove_conformance::eventually(
        Duration::from_secs(20),
        "the attacker is disconnected",
        || {
            let (attacker, ping) = (attacker.clone(), ping.clone());
            async move {
                let mut attacker = attacker.lock().await;
                match tokio::time::timeout(Duration::from_millis(200), attacker.write_all(&ping))
                    .await
                {
                    Ok(Err(_)) => Ok(()),
                    other => Err(format!("still open: {other:?}")),
                }
            }
        },
    )
    .await;
    // The authenticated socket, older than the deadline, still answers.
    ws_send(&mut connected, "2").await;
    assert_eq!(ws_read(&mut connected).await, (1, b"3".to_vec()));
    drop(stop);
    let _ = std::thread::spawn(move || drop(state)).join();
}

/// A bulk upload streams each file into the sandbox as it arrives (nothing is held whole)
/// and moves them into place only once the whole body is in: broken off during its second
/// file, it leaves neither file (nor a staged part) and gives its upload memory back; a file
/// sent before its path is refused the same way.
#[tokio::test]
async fn a_broken_off_bulk_upload_writes_nothing() {
    let budget = sandcove_compat_support::multipart::UploadBudget::default();
    let shared = budget.clone();
    let env = Env::start(move |backend, url| {
        let mut config = daytona::wire::WireConfig::new(KEY, url);
        config.upload_memory = shared;
        daytona::wire::router(backend, config)
    })
    .await;
    let sb = env.create().await;
    let id = sb["id"].as_str().unwrap().to_string();
    let listing = || {
        let (backend, id) = (env.backend.clone(), id.clone());
        async move {
            backend
                .list_dir(&id, "/tmp/bulk", Default::default())
                .await
                .map(|entries| entries.into_iter().map(|e| e.name).collect::<Vec<_>>())
                .unwrap_or_default()
        }
    };
    let mut body = common::form_part("files[0].path", None, b"/tmp/bulk/a.txt");
    body.extend(common::form_part("files[1].path", None, b"/tmp/bulk/b.txt"));
    body.extend(common::form_part(
        "files[0].file",
        Some("a.txt"),
        &[b'a'; 100 * 1024],
    ));
    body.extend(b"--B\r\nContent-Disposition: form-data; name=\"files[1].file\"; filename=\"b.txt\"\r\n\r\n");
    body.extend([b'b'; 50 * 1024]);
    let conn = common::partial_upload(
        &env.url,
        &format!("POST /toolbox/{id}/files/bulk-upload"),
        &format!("Authorization: Bearer {KEY}\r\n"),
        body.len() + 1024 * 1024,
        &body,
    )
    .await;
    // The first file is staged beside its destination while the second streams.
    eventually(
        Duration::from_secs(30),
        "the first file is staged",
        || async {
            let names = listing().await;
            names
                .iter()
                .any(|n| n.starts_with(".sandcove-upload-"))
                .then_some(())
                .ok_or(names)
        },
    )
    .await;
    drop(conn);
    eventually(Duration::from_secs(30), "the upload ends", || async {
        (budget.in_use() == 0).then_some(()).ok_or(budget.in_use())
    })
    .await;
    eventually(Duration::from_secs(30), "nothing is left", || async {
        let names = listing().await;
        names.is_empty().then_some(()).ok_or(names)
    })
    .await;
    // A file before its path: refused, nothing written.
    let mut body = common::form_part("files[0].file", Some("c.txt"), b"early");
    body.extend(common::form_part("files[0].path", None, b"/tmp/bulk/c.txt"));
    body.extend(b"--B--\r\n");
    let r = env
        .http
        .post(format!("{}/toolbox/{id}/files/bulk-upload", env.url))
        .bearer_auth(KEY)
        .header("content-type", "multipart/form-data; boundary=B")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    assert!(r
        .text()
        .await
        .unwrap()
        .contains("must follow its files[0].path"));
    assert!(listing().await.is_empty());
}
