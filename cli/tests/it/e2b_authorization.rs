//! The E2B listener's authorization matrix: every route of its table (control plane, envd,
//! the code interpreter's port, port forwarding) against every kind of credential a client
//! can hold — none, a wrong key, the server key, the sandbox's own token, another sandbox's
//! token, the traffic token, signed URLs valid, expired and foreign — with the expectation
//! derived from the table. Refused requests are aimed at a victim sandbox that must come out
//! untouched; accepted ones at a throwaway sandbox. Then the findings this model closes, as
//! they were found.

use std::collections::HashSet;

use crate::common::WireEnv;
use axum::http::Method;
use base64::Engine as _;
use sandcove::server::auth::{Principal, RouteAuth};
use sandcove::Backend;
use serde_json::{json, Value};

const KEY: &str = "authorization-key";

async fn env() -> WireEnv {
    WireEnv::start(|backend, _| e2b::wire::router(backend, e2b::wire::WireConfig::new(KEY))).await
}

/// A sandbox made over the wire: its id, envd token and traffic token.
#[derive(Clone)]
struct Made {
    id: String,
    token: String,
    traffic: String,
}

async fn create(env: &WireEnv) -> Made {
    let r = env
        .http
        .post(format!("{}/v2/sandboxes", env.url))
        .header("X-API-KEY", KEY)
        .json(&json!({"templateID": "base", "metadata": {}, "envVars": {}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let body: Value = r.json().await.unwrap();
    Made {
        id: body["sandboxID"].as_str().unwrap().into(),
        token: body["envdAccessToken"].as_str().unwrap().into(),
        traffic: body["trafficAccessToken"].as_str().unwrap().into(),
    }
}

/// E2B's v1 file-URL signature, as the SDKs compute it.
fn signature(path: &str, operation: &str, token: &str, expiration: Option<u64>) -> String {
    let mut raw = format!("{path}:{operation}::{token}");
    if let Some(e) = expiration {
        raw.push_str(&format!(":{e}"));
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, raw.as_bytes());
    format!(
        "v1_{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest.as_ref())
    )
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// What a client can hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    Nothing,
    WrongKey,
    ServerKey,
    /// The target sandbox's own envd token.
    OwnToken,
    /// Another sandbox's envd token, presented for the target.
    ForeignToken,
    /// Another sandbox's own id and token, on a route naming the target in its path.
    OtherSandbox,
    /// The target's traffic token.
    Traffic,
    /// A URL signed for this path and operation with the target's token.
    SignedUrl,
    /// The same, expired.
    ExpiredUrl,
    /// A URL signed with a token no sandbox has.
    ForeignUrl,
}

const HELD: [Held; 10] = [
    Held::Nothing,
    Held::WrongKey,
    Held::ServerKey,
    Held::OwnToken,
    Held::ForeignToken,
    Held::OtherSandbox,
    Held::Traffic,
    Held::SignedUrl,
    Held::ExpiredUrl,
    Held::ForeignUrl,
];

/// Whether `route` should let `held` through: the table's declaration, read independently
/// of the server's own check.
fn expected(route: &RouteAuth, held: Held) -> bool {
    let accepts = |p: Principal| route.accepts.contains(&p);
    let names_sandbox = route.path.contains("{id}");
    let is_files = route.path == "/files";
    match held {
        Held::Nothing => accepts(Principal::Anonymous),
        Held::WrongKey | Held::ForeignToken | Held::ExpiredUrl | Held::ForeignUrl => false,
        Held::ServerKey => accepts(Principal::ServerKey),
        Held::OwnToken => accepts(Principal::SandboxToken),
        Held::OtherSandbox => accepts(Principal::SandboxToken) && !names_sandbox,
        Held::Traffic => accepts(Principal::TrafficToken),
        // A signature means something on `/files` only; elsewhere the request is anonymous.
        Held::SignedUrl if is_files => accepts(Principal::SignedUrl),
        Held::SignedUrl => accepts(Principal::Anonymous),
    }
}

/// Whether a route is served on the code interpreter's port.
fn interpreter_path(route: &RouteAuth) -> Option<&str> {
    route.path.strip_suffix(" (E2b-Sandbox-Port: 49999)")
}

/// The request `held` makes on `route`, aimed at `target` (`other` is another sandbox).
fn request(
    env: &WireEnv,
    route: &RouteAuth,
    held: Held,
    target: &Made,
    other: &Made,
) -> reqwest::RequestBuilder {
    let interpreter = interpreter_path(route);
    let template = interpreter.unwrap_or(&route.path);
    let path = template
        .replace("{id}", &target.id)
        .replace("{method}", "NotAMethod")
        .replace("{context}", "no-such-context");
    let method = route.method.clone().unwrap_or(Method::GET);
    let is_files = route.path == "/files";
    let operation = if method == Method::GET {
        "read"
    } else {
        "write"
    };
    let file = "/home/user/authz.txt";
    let mut url = format!("{}{path}", env.url);
    match held {
        Held::SignedUrl | Held::ExpiredUrl | Held::ForeignUrl
            if is_files || !path.contains('?') =>
        {
            let (token, expiry) = match held {
                Held::SignedUrl => (target.token.as_str(), now() + 600),
                Held::ExpiredUrl => (target.token.as_str(), now() - 60),
                _ => ("sct_0000", now() + 600),
            };
            let sig = signature(file, operation, token, Some(expiry));
            url.push_str(&format!(
                "?path={}&signature={}&signature_expiration={expiry}",
                file.replace('/', "%2F"),
                sig.replace('/', "%2F").replace('+', "%2B")
            ));
        }
        _ => {}
    }
    let mut req = env
        .http
        .request(
            reqwest::Method::from_bytes(method.as_str().as_bytes()).unwrap(),
            url,
        )
        .timeout(std::time::Duration::from_secs(30));
    if interpreter.is_some() {
        req = req.header("E2b-Sandbox-Port", "49999");
    }
    req = match held {
        Held::Nothing | Held::SignedUrl | Held::ExpiredUrl | Held::ForeignUrl => req,
        Held::WrongKey => req.header("X-API-KEY", "not-the-key"),
        Held::ServerKey => req
            .header("X-API-KEY", KEY)
            .header("E2b-Sandbox-Id", &target.id),
        Held::OwnToken => req
            .header("E2b-Sandbox-Id", &target.id)
            .header("X-Access-Token", &target.token),
        Held::ForeignToken => req
            .header("E2b-Sandbox-Id", &target.id)
            .header("X-Access-Token", &other.token),
        Held::OtherSandbox => req
            .header("E2b-Sandbox-Id", &other.id)
            .header("X-Access-Token", &other.token),
        Held::Traffic => req
            .header("E2b-Sandbox-Id", &target.id)
            .header("E2B-Traffic-Access-Token", &target.traffic),
    };
    if method == Method::POST {
        req = req
            .header("Content-Type", "application/json")
            .header("Connect-Protocol-Version", "1")
            .body("{}");
    }
    req
}

/// The matrix: every route of the table × every credential, the status each gets matching
/// the table, and the victim sandbox untouched by everything refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_route_admits_exactly_the_credentials_its_table_declares() {
    let env = env().await;
    let victim = create(&env).await;
    let mut throwaway = create(&env).await;
    let attacker = create(&env).await;
    let marker = "/home/user/marker.txt";
    let client = sandcove::Client::new(env.backend.clone());
    client
        .sandbox(&victim.id)
        .write(marker, b"untouched".to_vec())
        .await
        .expect("marker");
    let table = e2b::wire::route_table();
    let mut seen = HashSet::new();
    for route in &table {
        assert!(
            seen.insert((route.method_name().to_string(), route.path.clone())),
            "declared twice: {route:?}"
        );
    }
    let mut failures = Vec::new();
    let mut probes = 0;
    for route in table.iter().filter(|r| !r.path.starts_with("Host:")) {
        for held in HELD {
            let allow = expected(route, held);
            // Refused requests are aimed at the victim; accepted ones at the throwaway.
            let target = if allow { &throwaway } else { &victim };
            let answer = request(&env, route, held, target, &attacker).send().await;
            probes += 1;
            let status = match answer {
                Ok(r) => r.status().as_u16(),
                // A stream that keeps its answer open past the timeout was let through.
                Err(e) if e.is_timeout() => 200,
                Err(e) => panic!("{route:?} with {held:?}: {e}"),
            };
            let refused = status == 401 || status == 403;
            if allow && route.method == Some(Method::DELETE) && route.path.contains("{id}") {
                // That may have ended it: the next accepted probes get a live one.
                throwaway = create(&env).await;
            }
            if refused == allow {
                failures.push(format!(
                    "{} {} with {held:?}: {status}, expected {}",
                    route.method_name(),
                    route.path,
                    if allow { "let through" } else { "401/403" }
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(probes > 200, "only {probes} probes");
    // Nothing refused had any effect on the victim.
    let info = env.backend.get(&victim.id).await.expect("the victim lives");
    assert_eq!(info.state, sandcove::SandboxState::Running);
    let content = client
        .sandbox(&victim.id)
        .read(marker)
        .await
        .expect("marker");
    assert_eq!(content, b"untouched");
    let written = env
        .backend
        .stat(&victim.id, "/home/user/authz.txt", Default::default())
        .await;
    assert!(written.is_err(), "a refused upload wrote into the victim");
}

/// Finding: with only sandbox A's envd token, a client listed every sandbox, took sandbox B's
/// token through `connect`, ran commands in B and killed it. Each of those is refused now,
/// and B is untouched.
#[tokio::test]
async fn one_sandboxs_token_opens_no_control_plane_call() {
    let env = env().await;
    let a = create(&env).await;
    let b = create(&env).await;
    let with_a = |req: reqwest::RequestBuilder| {
        req.header("E2b-Sandbox-Id", &a.id)
            .header("X-Access-Token", &a.token)
    };
    let calls = [
        (reqwest::Method::GET, "/v2/sandboxes".to_string()),
        (
            reqwest::Method::POST,
            format!("/sandboxes/{}/connect", b.id),
        ),
        (
            reqwest::Method::POST,
            format!("/sandboxes/{}/connect", a.id),
        ),
        (reqwest::Method::DELETE, format!("/sandboxes/{}", b.id)),
        (reqwest::Method::POST, "/v2/sandboxes".to_string()),
    ];
    for (method, path) in calls {
        let r = with_a(
            env.http
                .request(method.clone(), format!("{}{path}", env.url)),
        )
        .header("Content-Type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
        assert_eq!(r.status().as_u16(), 403, "{method} {path}");
        let body = r.text().await.unwrap();
        assert!(!body.contains(&b.token), "{method} {path} leaked B's token");
    }
    // B's data plane with A's token: refused.
    {
        let r = env
            .http
            .post(format!("{}/process.Process/List", env.url))
            .header("E2b-Sandbox-Id", &b.id)
            .header("X-Access-Token", &a.token)
            .header("Content-Type", "application/json")
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 401, "A's token for B");
    }
    let listed = env.backend.list(Default::default()).await.unwrap();
    assert_eq!(listed.len(), 2, "nothing was created");
    env.backend.get(&b.id).await.expect("B lives");
}

/// Finding: port forwarding (`Host: PORT-ID.localhost`) with no credential reached any port
/// of any sandbox of the engine, native-API ones included. Now only sandboxes made through
/// E2B's API are reachable that way, and any other answers as a sandbox that does not exist.
#[tokio::test]
async fn port_forwarding_reaches_only_e2b_sandboxes() {
    let env = env().await;
    let native = env
        .backend
        .create(sandcove::CreateOptions::default())
        .await
        .expect("a native sandbox")
        .id;
    let e2b = create(&env).await;
    let serve = "mkdir -p /tmp/site && echo from-the-sandbox > /tmp/site/index.html && \
                 exec python3 -m http.server 8123 --bind 127.0.0.1 --directory /tmp/site";
    for id in [&native, &e2b.id] {
        env.backend
            .spawn(id, sandcove::ProcessSpec::new(sandcove::Command::sh(serve)))
            .await
            .expect("start the server");
    }
    let port = env.url.rsplit(':').next().unwrap().to_string();
    let get = |id: String, traffic: Option<String>| {
        let mut req = env
            .http
            .get(format!("{}/index.html", env.url))
            .header("Host", format!("8123-{id}.localhost:{port}"));
        if let Some(t) = traffic {
            req = req.header("e2b-traffic-access-token", t);
        }
        req.send()
    };
    let text = sandcove_conformance::eventually(
        std::time::Duration::from_secs(30),
        "the E2B sandbox's server answers without a credential",
        || async {
            let r = get(e2b.id.clone(), None).await.map_err(|e| e.to_string())?;
            if r.status().as_u16() != 200 {
                return Err(format!("status {}", r.status()));
            }
            r.text().await.map_err(|e| e.to_string())
        },
    )
    .await;
    assert_eq!(text, "from-the-sandbox\n");
    // Its traffic token works too; a wrong one is refused.
    let r = get(e2b.id.clone(), Some(e2b.traffic.clone()))
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let r = get(e2b.id.clone(), Some(e2b.token.clone())).await.unwrap();
    assert_eq!(
        r.status().as_u16(),
        401,
        "the envd token is not the traffic token"
    );
    // The native sandbox serves the same port, and stays out of reach.
    let native_sandbox = sandcove::Client::new(env.backend.clone()).sandbox(&native);
    sandcove_conformance::eventually(
        std::time::Duration::from_secs(30),
        "the native sandbox's server answers inside it",
        || async {
            let out = native_sandbox
                .run(sandcove::Command::argv([
                    "python3",
                    "-c",
                    "import urllib.request as u; \
                     print(u.urlopen('http://127.0.0.1:8123/index.html').read().decode())",
                ]))
                .await
                .map_err(|e| e.to_string())?;
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            text.contains("from-the-sandbox")
                .then_some(())
                .ok_or(format!("answered {text:?}"))
        },
    )
    .await;
    let r = get(native.clone(), None).await.unwrap();
    assert_eq!(r.status().as_u16(), 502);
    assert!(r.text().await.unwrap().contains("not found"));
    let previews = env.backend.list_previews(&native).await.unwrap();
    assert!(
        previews.is_empty(),
        "forwarding made a preview: {previews:?}"
    );
}

/// Finding: forwarded requests without a credential made a preview per port and filled the
/// sandbox's preview quota, so its owner could no longer expose a port. Forwarding keeps at
/// most `MAX_FORWARDED_PORTS` previews of its own per sandbox, the least recently used idle
/// one closed first.
#[tokio::test]
async fn port_forwarding_cannot_fill_the_preview_quota() {
    let env = env().await;
    let e2b = create(&env).await;
    let port = env.url.rsplit(':').next().unwrap().to_string();
    let max = e2b::wire::MAX_FORWARDED_PORTS;
    for p in 0..(max as u16 + 24) {
        let r = env
            .http
            .get(format!("{}/", env.url))
            .header("Host", format!("{}-{}.localhost:{port}", 20000 + p, e2b.id))
            .send()
            .await
            .unwrap();
        // Nothing listens there: the sandbox refuses, the listener answers 502.
        assert_eq!(r.status().as_u16(), 502);
    }
    let previews = env.backend.list_previews(&e2b.id).await.unwrap();
    assert!(
        previews.len() <= max,
        "{} previews for {max} allowed",
        previews.len()
    );
    // The owner can still expose ports.
    let sandbox = sandcove::Client::new(env.backend.clone()).sandbox(&e2b.id);
    for p in 0..8u16 {
        sandbox
            .expose_port(sandcove::PreviewOptions::new(30000 + p))
            .await
            .expect("the owner's preview");
    }
}
