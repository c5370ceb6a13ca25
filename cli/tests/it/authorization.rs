//! Who may do what, checked against what the listeners do. For the native API, Daytona's and
//! Blaxel's listeners: every route of the listener's authorization table (`route_table()`)
//! is sent with every kind of credential (none, a wrong key, the server's key: the kinds these
//! tables declare) to the real router over the embedded engine with a private state directory,
//! and the answer must be what the table says — worked out here, independently of
//! `RouteAuth::decide`. A refused request targets a real sandbox, which afterwards still
//! exists, runs, and holds its marker file unchanged; an accepted one targets a sandbox that
//! does not exist, so deleting routes delete nothing. Then: the tables cover what the routers
//! serve (every other method of a declared path and paths outside the table are not served,
//! and answer only the key), no table declares a route twice, and `SECURITY.md`'s tables are
//! the ones generated from the code. (E2B's matrix is `e2b_authorization.rs`.)

use crate::common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use axum::http::Method;
use sandcove::server::auth::{markdown, Principal, RouteAuth};
use sandcove::Backend;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const KEY: &str = "authorization-matrix-key";
/// A sandbox that does not exist: the target of accepted requests.
const ABSENT: &str = "authz-absent-0";
const MARKER_PATH: &str = "/workspace/authz-marker";
const MARKER: &[u8] = b"nothing happened here\n";
/// How long any one answer may take.
const PATIENCE: Duration = Duration::from_secs(60);

/// A credential as a client presents it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Presented {
    Nothing,
    WrongKey,
    ServerKey,
    /// A valid signed file URL for the request's operation: presented as the path of the
    /// routes that take one (`{signed}`), not presentable elsewhere.
    SignedUrl,
}

/// What a request's headers can carry.
const PRESENTED: [Presented; 3] = [
    Presented::Nothing,
    Presented::WrongKey,
    Presented::ServerKey,
];

/// Everything the matrix presents: the headers' kinds, and a signed URL where a route takes one.
const MATRIX: [Presented; 4] = [
    Presented::Nothing,
    Presented::WrongKey,
    Presented::ServerKey,
    Presented::SignedUrl,
];

/// Whether `presented` can be presented on `route` at all.
fn presentable(route: &RouteAuth, presented: Presented) -> bool {
    presented != Presented::SignedUrl || route.path.contains("{signed}")
}

/// `route`'s path for sandbox `sandbox`, presenting `presented`: a signed URL's route gets a
/// valid token signed with the server's key for `sandbox` and the route's operation.
fn path_for(route: &RouteAuth, listener: &Listener, sandbox: &str, presented: Presented) -> String {
    if presented != Presented::SignedUrl {
        return fill(&route.path, listener.sandbox_params, sandbox);
    }
    let options = match route.method {
        Some(Method::GET) => sandcove::FileUrlOptions::read(MARKER_PATH),
        _ => sandcove::FileUrlOptions::write(MARKER_PATH),
    };
    let key = sandcove::file_url::FileUrlKey::derived_from(KEY.as_bytes());
    let token = key.sign(&sandcove::FileGrant::new(sandbox, &options));
    route.path.replace("{signed}", &token)
}

/// What the table says a request presenting `presented` gets on `route`: through, or the
/// refusal's status. Worked out here from `accepts` alone: no credential passes only where
/// `none` is declared (else `401`); a wrong key is refused at once wherever it is sent (never
/// read as no credential); the key passes where it is declared (else `403`: valid, but not
/// what the route takes).
fn expected(route: &RouteAuth, presented: Presented) -> Result<(), u16> {
    match presented {
        Presented::Nothing if route.accepts.contains(&Principal::Anonymous) => Ok(()),
        Presented::Nothing | Presented::WrongKey => Err(401),
        Presented::ServerKey if route.accepts.contains(&Principal::ServerKey) => Ok(()),
        Presented::ServerKey => Err(403),
        Presented::SignedUrl if route.accepts.contains(&Principal::SignedUrl) => Ok(()),
        Presented::SignedUrl => Err(403),
    }
}

/// The kinds of credential this test can present: a table declaring another kind must
/// extend the matrix (and fails here until it does).
fn assert_presentable(listener: &str, table: &[RouteAuth]) {
    for route in table {
        for p in route.accepts {
            assert!(
                matches!(
                    p,
                    Principal::ServerKey | Principal::Anonymous | Principal::SignedUrl
                ),
                "{listener}: {} {} accepts {p:?}, which this matrix does not present yet",
                route.method_name(),
                route.path
            );
        }
    }
}

/// How a listener is spoken to.
struct Listener {
    name: &'static str,
    table: Vec<RouteAuth>,
    /// The path parameters that name a sandbox.
    sandbox_params: &'static [&'static str],
    /// The header carrying the key (as `Bearer KEY`).
    key_header: &'static str,
    /// Headers every request carries.
    extra_headers: &'static [(&'static str, &'static str)],
    /// The field of the listener's error body that carries the status, where it has one.
    status_field: Option<&'static str>,
}

fn native() -> Listener {
    Listener {
        name: "native",
        table: sandcove::server::route_table(),
        sandbox_params: &["id"],
        key_header: "authorization",
        extra_headers: &[],
        status_field: None,
    }
}

fn daytona() -> Listener {
    Listener {
        name: "daytona",
        table: daytona::wire::route_table(),
        sandbox_params: &["id"],
        key_header: "authorization",
        extra_headers: &[],
        status_field: Some("statusCode"),
    }
}

fn blaxel() -> Listener {
    Listener {
        name: "blaxel",
        table: blaxel::wire::route_table(),
        sandbox_params: &["name"],
        key_header: "x-blaxel-authorization",
        extra_headers: &[("x-blaxel-workspace", "sandcove")],
        status_field: Some("status"),
    }
}

/// `path` with its parameters filled: those naming a sandbox with `sandbox`, the others with
/// plausible values.
fn fill(path: &str, sandbox_params: &[&str], sandbox: &str) -> String {
    path.split('/')
        .map(|segment| {
            let Some(name) = segment.strip_prefix('{').and_then(|s| s.strip_suffix('}')) else {
                return segment.to_string();
            };
            if sandbox_params.contains(&name) {
                return sandbox.to_string();
            }
            match name {
                "*path" => "tmp/authz",
                "port" => "8080",
                "interval" => "10",
                "kind" => "sandbox",
                "session" => "authz-session",
                "command" => "authz-command",
                "preview" => "authz-preview",
                "token" => "authz-token",
                "upload" => "authz-upload",
                "snapshot" | "snapshot_id" => "authz-snapshot",
                "op" => "authz-op",
                _ => "authz-other",
            }
            .to_string()
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// A router served on a loopback port over the embedded engine with a private state
/// directory (optionally with the Blaxel listener's intercepting proxy); dropping it stops
/// the listener and cleans the state up.
struct Env {
    url: String,
    addr: std::net::SocketAddr,
    backend: Arc<sandcove::LocalBackend>,
    http: reqwest::Client,
    ca: Option<Arc<sandcove::server::intercept::SandcoveCa>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    state: Option<sandcove_tests::PrivateState>,
}

impl Env {
    async fn start(
        router: impl FnOnce(Arc<sandcove::LocalBackend>, String) -> axum::Router,
        intercept: &[&str],
    ) -> Env {
        let state = sandcove_tests::PrivateState::new();
        let backend = Arc::new(sandcove::LocalBackend::with_state_dir(&state.dir).expect("engine"));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let url = format!("http://{addr}");
        let app = router(backend.clone(), url.clone());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let stopped = async move {
            let _ = stopped.await;
        };
        let ca = if intercept.is_empty() {
            tokio::spawn(sandcove::server::serve_router(
                listener,
                app,
                common::test_limits(),
                stopped,
            ));
            None
        } else {
            let ca = sandcove::server::intercept::SandcoveCa::open(
                state.dir.join("blaxel-ca"),
                intercept,
            )
            .expect("the interception CA");
            tokio::spawn(sandcove::server::serve_router_intercepting(
                listener,
                app,
                common::test_limits(),
                ca.clone(),
                stopped,
            ));
            Some(ca)
        };
        Env {
            url,
            addr,
            backend,
            http: reqwest::Client::builder()
                .no_proxy()
                .timeout(PATIENCE)
                .build()
                .unwrap(),
            ca,
            stop: Some(stop),
            state: Some(state),
        }
    }

    /// A client that reaches `https://HOST` through this listener's proxy, trusting only its
    /// CA.
    fn through_proxy(&self) -> reqwest::Client {
        let ca = self.ca.as_ref().expect("served with the proxy");
        let pem = std::fs::read(ca.cert_path()).unwrap();
        reqwest::Client::builder()
            .tls_built_in_root_certs(false)
            .add_root_certificate(reqwest::Certificate::from_pem(&pem).unwrap())
            .proxy(reqwest::Proxy::https(format!("http://{}", self.addr)).unwrap())
            .timeout(PATIENCE)
            .build()
            .unwrap()
    }

    async fn ids(&self) -> BTreeSet<String> {
        self.backend
            .list(Default::default())
            .await
            .unwrap()
            .into_iter()
            .map(|info| info.id)
            .collect()
    }

    async fn snapshot_count(&self) -> usize {
        self.backend.list_snapshots().await.unwrap().len()
    }

    /// Make a sandbox by `make` (returning the name its listener's paths use), find the
    /// engine's id of it, and plant the marker in it.
    async fn victim<F, Fut>(&self, make: F) -> Victim
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = String>,
    {
        let before = self.ids().await;
        let name = make().await;
        let made: Vec<String> = self.ids().await.difference(&before).cloned().collect();
        assert_eq!(made.len(), 1, "one sandbox made: {made:?}");
        let id = made[0].clone();
        let client = sandcove::Client::new(self.backend.clone());
        client
            .sandbox(&id)
            .write(MARKER_PATH, MARKER)
            .await
            .expect("the marker");
        Victim { name, id }
    }

    /// The victim still exists, runs, and holds its marker unchanged.
    async fn assert_untouched(&self, victim: &Victim, after: &str) {
        let info = self
            .backend
            .get(&victim.id)
            .await
            .unwrap_or_else(|e| panic!("the victim is gone after {after}: {e}"));
        assert_eq!(
            info.state,
            sandcove::SandboxState::Running,
            "the victim's state after {after}"
        );
        let client = sandcove::Client::new(self.backend.clone());
        let marker = client.sandbox(&victim.id).read(MARKER_PATH).await;
        assert_eq!(
            marker.as_deref().ok(),
            Some(MARKER),
            "the victim's marker after {after}"
        );
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        drop(self.stop.take());
        // The state's cleanup runs its own runtime: not on this runtime's thread.
        let state = self.state.take();
        let _ = std::thread::spawn(move || drop(state)).join();
    }
}

/// The sandbox refused requests are aimed at.
struct Victim {
    /// As the listener's paths name it.
    name: String,
    /// The engine's id.
    id: String,
}

/// Send `method path` to `base` presenting `presented` the way `listener` reads keys, with a
/// `{}` body where the method takes one: its status, and its body when it is small JSON.
async fn send(
    http: &reqwest::Client,
    base: &str,
    listener: &Listener,
    method: &Method,
    path: &str,
    presented: Presented,
) -> (u16, Option<Value>) {
    let mut request = http.request(method.clone(), format!("{base}{path}"));
    for (name, value) in listener.extra_headers {
        request = request.header(*name, *value);
    }
    match presented {
        Presented::Nothing => {}
        Presented::WrongKey => {
            request = request.header(listener.key_header, format!("Bearer {KEY}-wrong"))
        }
        Presented::ServerKey => {
            request = request.header(listener.key_header, format!("Bearer {KEY}"))
        }
        // The URL is the credential: nothing more to send.
        Presented::SignedUrl => {}
    }
    if matches!(*method, Method::POST | Method::PUT | Method::PATCH) {
        request = request.json(&json!({}));
    }
    let response = request
        .send()
        .await
        .unwrap_or_else(|e| panic!("{}: {method} {path}: {e}", listener.name));
    let status = response.status().as_u16();
    if status == 401 || status == 403 {
        let body = response.bytes().await.unwrap_or_default();
        return (status, serde_json::from_slice(&body).ok());
    }
    // An accepted request's answer may be a stream: only its status is wanted.
    (status, None)
}

/// Every HTTP-routed route of `listener` × every credential, against `base` through `http`:
/// refusals (aimed at the victim) first, then what is accepted (aimed at [`ABSENT`]).
/// `special` routes (served before routing) are left to the caller.
async fn run_matrix(
    env: &Env,
    http: &reqwest::Client,
    base: &str,
    listener: &Listener,
    victim: &Victim,
    special: impl Fn(&RouteAuth) -> bool,
) {
    let routes: Vec<&RouteAuth> = listener.table.iter().filter(|r| !special(r)).collect();
    assert!(!routes.is_empty(), "{}: an empty table", listener.name);
    let sandboxes = env.ids().await;
    let snapshots = env.snapshot_count().await;
    let mut refused = 0;
    for route in &routes {
        let method = route.method.clone().expect("a routed route has a method");
        for presented in MATRIX {
            if !presentable(route, presented) {
                continue;
            }
            let Err(status) = expected(route, presented) else {
                continue;
            };
            let path = path_for(route, listener, &victim.name, presented);
            let (got, body) = send(http, base, listener, &method, &path, presented).await;
            assert_eq!(
                got, status,
                "{}: {method} {path} with {presented:?} must be refused with {status}: {body:?}",
                listener.name
            );
            if let Some(field) = listener.status_field {
                assert_eq!(
                    body.as_ref().map(|b| &b[field]),
                    Some(&json!(status)),
                    "{}: {method} {path}: the vendor's error shape",
                    listener.name
                );
            }
            refused += 1;
        }
    }
    assert!(refused > 0, "{}: nothing was refused", listener.name);
    env.assert_untouched(victim, "the refused requests").await;
    assert_eq!(
        env.ids().await,
        sandboxes,
        "{}: no sandbox made or removed",
        listener.name
    );
    assert_eq!(
        env.snapshot_count().await,
        snapshots,
        "{}: no snapshot made or removed",
        listener.name
    );
    let mut accepted = 0;
    for route in &routes {
        let method = route.method.clone().expect("a routed route has a method");
        for presented in MATRIX {
            if !presentable(route, presented) || expected(route, presented).is_err() {
                continue;
            }
            let path = path_for(route, listener, ABSENT, presented);
            let (got, body) = send(http, base, listener, &method, &path, presented).await;
            assert!(
                got != 401 && got != 403,
                "{}: {method} {path} with {presented:?} must get through its check, got {got}: \
                 {body:?}",
                listener.name
            );
            accepted += 1;
        }
    }
    assert!(accepted > 0, "{}: nothing was accepted", listener.name);
    env.assert_untouched(victim, "the accepted requests").await;
}

async fn native_env() -> Env {
    Env::start(
        |backend, _| sandcove::server::router(backend, sandcove::server::ServerConfig::new(KEY)),
        &[],
    )
    .await
}

async fn daytona_env() -> Env {
    Env::start(
        |backend, url| daytona::wire::router(backend, daytona::wire::WireConfig::new(KEY, url)),
        &[],
    )
    .await
}

const BLAXEL_HOST: &str = "api.blaxel.ai";

async fn blaxel_env() -> Env {
    Env::start(
        |backend, url| {
            let mut config = blaxel::wire::WireConfig::new(KEY, url);
            // The victim must stay running: no standby during the test.
            config.standby_after = None;
            blaxel::wire::router(backend, config)
        },
        &[BLAXEL_HOST],
    )
    .await
}

/// Every route of the native API × none, a wrong key, the server's key.
#[tokio::test]
async fn native_routes_admit_exactly_what_they_declare() {
    let listener = native();
    assert_presentable(listener.name, &listener.table);
    let env = native_env().await;
    let victim = env
        .victim(|| async {
            let info = env
                .backend
                .create(Default::default())
                .await
                .expect("the victim");
            info.id
        })
        .await;
    run_matrix(&env, &env.http, &env.url, &listener, &victim, |_| false).await;
}

/// A raw WebSocket text frame, masked as a client's must be.
async fn ws_send(conn: &mut tokio::net::TcpStream, text: &str) {
    let mask = [0x12u8, 0x34, 0x56, 0x78];
    let data = text.as_bytes();
    assert!(data.len() < 126, "short frames only");
    let mut frame = vec![0x81, 0x80 | data.len() as u8];
    frame.extend_from_slice(&mask);
    frame.extend(data.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    conn.write_all(&frame).await.unwrap();
}

/// The next short text frame from the server.
async fn ws_read_text(conn: &mut tokio::net::TcpStream) -> String {
    let read = async {
        let mut head = [0u8; 2];
        conn.read_exact(&mut head).await.unwrap();
        let len = match head[1] & 0x7f {
            126 => {
                let mut b = [0u8; 2];
                conn.read_exact(&mut b).await.unwrap();
                u16::from_be_bytes(b) as usize
            }
            n if n < 126 => n as usize,
            _ => panic!("unexpectedly long frame"),
        };
        let mut payload = vec![0u8; len];
        conn.read_exact(&mut payload).await.unwrap();
        String::from_utf8_lossy(&payload).into_owned()
    };
    tokio::time::timeout(PATIENCE, read)
        .await
        .expect("a frame from the server")
}

/// The head of the answer to `request` sent on a fresh connection to `addr` (read byte by
/// byte, so nothing after it is consumed), and the connection.
async fn raw_head(addr: std::net::SocketAddr, request: &str) -> (String, tokio::net::TcpStream) {
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match tokio::time::timeout(PATIENCE, conn.read(&mut byte)).await {
            Ok(Ok(1)) => head.push(byte[0]),
            _ => break,
        }
    }
    (String::from_utf8_lossy(&head).into_owned(), conn)
}

/// The event socket's row: the credential is presented in Socket.IO's `CONNECT` packet (the
/// SDKs' way), and the answer there must be the table's (`40` connects, `44` refuses). A
/// wrong key in a header is refused before the upgrade, as everywhere on the listener.
async fn check_event_socket(env: &Env, route: &RouteAuth) {
    assert_eq!(route.method, Some(Method::GET));
    let upgrade = |auth: &str| {
        format!(
            "GET /api/socket.io/?EIO=4&transport=websocket HTTP/1.1\r\nHost: {}\r\n{auth}\
             Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
            env.addr
        )
    };
    for presented in PRESENTED {
        let (head, mut conn) = raw_head(env.addr, &upgrade("")).await;
        assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
        let open = ws_read_text(&mut conn).await;
        assert!(open.starts_with('0'), "Engine.IO's open: {open}");
        let packet = match presented {
            Presented::Nothing => json!({}),
            Presented::WrongKey => json!({"token": format!("{KEY}-wrong")}),
            Presented::ServerKey => json!({"token": KEY}),
            Presented::SignedUrl => unreachable!("not a header credential"),
        };
        ws_send(&mut conn, &format!("40{packet}")).await;
        let answer = ws_read_text(&mut conn).await;
        match expected(route, presented) {
            Ok(()) => assert!(
                answer.starts_with("40{"),
                "the event socket with {presented:?} must connect: {answer}"
            ),
            Err(_) => assert!(
                answer.starts_with("44{"),
                "the event socket with {presented:?} must refuse: {answer}"
            ),
        }
    }
    let (head, _) = raw_head(
        env.addr,
        &upgrade(&format!("Authorization: Bearer {KEY}-wrong\r\n")),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 401 "), "{head}");
}

/// Every route of Daytona's listener × none, a wrong key, the server's key; the event
/// socket's through its handshake.
#[tokio::test]
async fn daytona_routes_admit_exactly_what_they_declare() {
    let listener = daytona();
    assert_presentable(listener.name, &listener.table);
    let env = daytona_env().await;
    let victim = env
        .victim(|| async {
            let answer = env
                .http
                .post(format!("{}/api/sandbox", env.url))
                .bearer_auth(KEY)
                .json(&json!({}))
                .send()
                .await
                .unwrap();
            assert_eq!(answer.status().as_u16(), 200);
            let sandbox: Value = answer.json().await.unwrap();
            sandbox["id"].as_str().expect("an id").to_string()
        })
        .await;
    let socket = |r: &RouteAuth| r.path == daytona::wire::EVENT_SOCKET_ROUTE;
    let rows: Vec<&RouteAuth> = listener.table.iter().filter(|r| socket(r)).collect();
    assert_eq!(rows.len(), 1, "the event socket is declared once");
    check_event_socket(&env, rows[0]).await;
    run_matrix(&env, &env.http, &env.url, &listener, &victim, socket).await;
    env.assert_untouched(&victim, "the event socket").await;
}

/// The proxy's row: a `CONNECT` carries no credential the proxy reads (the SDKs send their
/// key inside the tunnel), so it is tried with none, and the answer must be the table's:
/// the tunnel opens (`200`) only if `none` is declared.
async fn check_connect(env: &Env, route: &RouteAuth) {
    let target = format!("{BLAXEL_HOST}:443");
    let (head, _) = raw_head(
        env.addr,
        &format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n"),
    )
    .await;
    match expected(route, Presented::Nothing) {
        Ok(()) => assert!(head.starts_with("HTTP/1.1 200 "), "{head}"),
        Err(status) => assert!(head.starts_with(&format!("HTTP/1.1 {status} ")), "{head}"),
    }
}

/// Every route of Blaxel's listener × none, a wrong key, the server's key, on the plain
/// listener and again inside the intercepting proxy's tunnel (where the SDK that cannot be
/// pointed elsewhere sends them); the `CONNECT` itself as its row declares.
#[tokio::test]
async fn blaxel_routes_admit_exactly_what_they_declare() {
    let listener = blaxel();
    assert_presentable(listener.name, &listener.table);
    let env = blaxel_env().await;
    let name = "authz-victim";
    let victim = env
        .victim(|| async {
            let answer = env
                .http
                .post(format!("{}/v0/sandboxes", env.url))
                .header("x-blaxel-authorization", format!("Bearer {KEY}"))
                .json(&json!({"metadata": {"name": name}}))
                .send()
                .await
                .unwrap();
            assert_eq!(answer.status().as_u16(), 200);
            name.to_string()
        })
        .await;
    let connect = |r: &RouteAuth| r.method == Some(Method::CONNECT);
    let rows: Vec<&RouteAuth> = listener.table.iter().filter(|r| connect(r)).collect();
    assert_eq!(rows.len(), 1, "the proxy's CONNECT is declared once");
    check_connect(&env, rows[0]).await;
    run_matrix(&env, &env.http, &env.url, &listener, &victim, connect).await;
    let tunnel = env.through_proxy();
    run_matrix(
        &env,
        &tunnel,
        &format!("https://{BLAXEL_HOST}"),
        &listener,
        &victim,
        connect,
    )
    .await;
}

/// What a listener answers where it serves nothing: with no key or a wrong one `401`, with
/// the key its not-found answer (one of `found`), for paths outside the table and for every
/// method a declared path does not declare.
async fn assert_table_covers_router(
    env: &Env,
    listener: &Listener,
    outside: &[&str],
    found: &[u16],
) {
    let served =
        |r: &RouteAuth| r.method.is_some() && r.path.starts_with('/') && !r.path.contains(' ');
    let mut probes: Vec<(Method, String)> = Vec::new();
    let mut refused_paths = BTreeSet::new();
    for path in outside {
        assert!(
            !listener.table.iter().any(|r| r.path == *path),
            "{path} is in the table"
        );
        for method in [Method::GET, Method::POST, Method::DELETE] {
            probes.push((method, path.to_string()));
        }
    }
    let paths: BTreeSet<&str> = listener
        .table
        .iter()
        .filter(|r| served(r))
        .map(|r| r.path.as_str())
        .collect();
    // A path whose routes take no server key (a signed URL's) refuses it on any method.
    let key_refused = |path: &str| {
        listener
            .table
            .iter()
            .filter(|r| r.path == path)
            .all(|r| !r.accepts.contains(&Principal::ServerKey))
    };
    for path in paths {
        for method in [
            Method::GET,
            Method::POST,
            Method::PUT,
            Method::PATCH,
            Method::DELETE,
        ] {
            let declared = listener
                .table
                .iter()
                .any(|r| r.path == path && r.method.as_ref() == Some(&method));
            if !declared {
                probes.push((method, fill(path, listener.sandbox_params, ABSENT)));
                if key_refused(path) {
                    refused_paths.insert(fill(path, listener.sandbox_params, ABSENT));
                }
            }
        }
    }
    assert!(!probes.is_empty());
    for (method, path) in &probes {
        for presented in PRESENTED {
            let (got, _) = send(&env.http, &env.url, listener, method, path, presented).await;
            match presented {
                Presented::Nothing | Presented::WrongKey => assert_eq!(
                    got, 401,
                    "{}: {method} {path} (not in the table) with {presented:?}",
                    listener.name
                ),
                Presented::ServerKey => assert!(
                    found.contains(&got) || (got == 403 && refused_paths.contains(path)),
                    "{}: {method} {path} is not in the table but answered {got}",
                    listener.name
                ),
                Presented::SignedUrl => unreachable!("not a header credential"),
            }
        }
    }
}

#[tokio::test]
async fn the_native_table_covers_what_its_router_serves() {
    let env = native_env().await;
    assert_table_covers_router(
        &env,
        &native(),
        &[
            "/v1/not-a-route",
            "/v1/sandboxes/x/not-a-route",
            "/elsewhere",
        ],
        &[404, 405],
    )
    .await;
}

#[tokio::test]
async fn the_daytona_table_covers_what_its_router_serves() {
    let env = daytona_env().await;
    assert_table_covers_router(
        &env,
        &daytona(),
        &[
            "/api/not-a-route",
            "/api/sandbox/x/not-a-route",
            "/toolbox/x/not-a-route",
            "/elsewhere",
        ],
        // 501: an unserved Daytona call says so (a 404 would read as "no such sandbox").
        &[404, 405, 501],
    )
    .await;
}

#[tokio::test]
async fn the_blaxel_table_covers_what_its_router_serves() {
    let env = blaxel_env().await;
    assert_table_covers_router(
        &env,
        &blaxel(),
        &[
            "/v0/not-a-route",
            "/v0/sandboxes/x/not-a-route",
            "/blaxel-sbx/x/not-a-route",
            "/elsewhere",
        ],
        &[404, 405, 501],
    )
    .await;
}

/// No listener declares one (method, path) twice (axum would serve only one of them).
#[test]
fn no_table_declares_a_route_twice() {
    for (name, table) in tables() {
        let mut seen = BTreeSet::new();
        for route in &table {
            assert!(
                seen.insert((route.method_name().to_string(), route.path.clone())),
                "{name}: {} {} is declared twice",
                route.method_name(),
                route.path
            );
        }
    }
}

/// Every listener's table, in the order `SECURITY.md` lists them.
fn tables() -> Vec<(&'static str, Vec<RouteAuth>)> {
    vec![
        ("The native API", sandcove::server::route_table()),
        ("The E2B listener (`--e2b`)", e2b::wire::route_table()),
        (
            "The Daytona listener (`--daytona`)",
            daytona::wire::route_table(),
        ),
        (
            "The Blaxel listener (`--blaxel`)",
            blaxel::wire::route_table(),
        ),
        (
            "Previews (one listener per exposed port)",
            sandcove::server::auth::preview_table(),
        ),
    ]
}

const BEGIN: &str = "<!-- authorization tables: generated -->";
const END: &str = "<!-- end of generated tables -->";

/// `SECURITY.md`'s "Who may do what" holds the tables generated from the code (between its
/// two markers) and a line for every kind of credential. `SANDCOVE_BLESS=1` rewrites the
/// tables instead.
#[test]
fn security_md_states_the_tables_the_routers_are_built_from() {
    let mut generated = String::from("\n");
    for (name, table) in tables() {
        generated.push_str(&format!("\n### {name}\n\n{}", markdown(&table)));
    }
    generated.push('\n');
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../SECURITY.md");
    let text = std::fs::read_to_string(&file).unwrap();
    let start = text.find(BEGIN).expect("the opening marker") + BEGIN.len();
    let end = start + text[start..].find(END).expect("the closing marker");
    let section = &text[..start];
    let section = &section[section.rfind("\n## ").expect("a section")..];
    assert!(
        section.starts_with("\n## Who may do what"),
        "the tables are in \"Who may do what\""
    );
    for p in Principal::ALL {
        assert!(
            section.contains(&format!("\n- **{}**", p.name())),
            "\"Who may do what\" has a line for {p:?} (`- **{}**: …`)",
            p.name()
        );
    }
    if text[start..end] == generated {
        return;
    }
    if std::env::var_os("SANDCOVE_BLESS").is_some_and(|v| v == "1") {
        let updated = format!("{}{generated}{}", &text[..start], &text[end..]);
        std::fs::write(&file, updated).unwrap();
        return;
    }
    panic!(
        "SECURITY.md's authorization tables differ from the code's (rerun with \
         SANDCOVE_BLESS=1 to rewrite them); expected between the markers:\n{generated}"
    );
}
