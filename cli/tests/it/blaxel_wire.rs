//! Blaxel's wire protocol from a Rust client: authentication before any effect, the
//! `Sandbox` and `SandboxError` shapes the SDKs read, path-only routing (the proxied
//! `Host: api.blaxel.ai` requests), `//` paths, NDJSON exec streams, bad input and gaps. The
//! router runs in this process over the embedded engine with a private state directory.

use sandcove::Backend;
use sandcove_conformance::{eventually, next_millisecond};
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

const KEY: &str = "blaxel-wire-key";

/// Blaxel's sandbox statuses: anything else fails the Python SDK's enum.
const STATUSES: &[&str] = &[
    "ARCHIVED",
    "ARCHIVING",
    "BUILDING",
    "BUILT",
    "DEACTIVATED",
    "DEACTIVATING",
    "DELETING",
    "DEPLOYED",
    "DEPLOYING",
    "FAILED",
    "TERMINATED",
    "UNARCHIVING",
    "UPLOADING",
];

async fn env() -> Env {
    Env::start(|backend, url| {
        let mut config = blaxel::wire::WireConfig::new(KEY, url);
        config.max_body_bytes = 64 * 1024;
        config.max_upload_bytes = 1024 * 1024;
        config.max_inline_file_bytes = 1024 * 1024;
        blaxel::wire::router(backend, config)
    })
    .await
}

impl Env {
    async fn start(
        router: impl FnOnce(std::sync::Arc<sandcove::LocalBackend>, String) -> axum::Router,
    ) -> Env {
        Env(WireEnv::start(router).await)
    }

    fn request(&self, method: &str, path: &str, key: Option<&str>) -> reqwest::RequestBuilder {
        let mut req = self
            .http
            .request(method.parse().unwrap(), format!("{}{path}", self.url))
            .header("X-Blaxel-Workspace", "sandcove");
        if let Some(key) = key {
            req = req.header("X-Blaxel-Authorization", format!("Bearer {key}"));
        }
        req
    }

    async fn send(req: reqwest::RequestBuilder) -> (u16, Value) {
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut req = self.request(method, path, Some(KEY));
        if let Some(body) = body {
            req = req.json(&body);
        }
        Self::send(req).await
    }

    async fn create(&self, name: &str) -> Value {
        let (status, sb) = self
            .call(
                "POST",
                "/v0/sandboxes",
                Some(json!({"metadata": {"name": name, "labels": {"k": "v"}},
                    "spec": {"region": "us-pdx-1", "runtime": {"image": "blaxel/base-image:latest",
                    "memory": 4096, "generation": "mk3", "ttl": "1h"}}})),
            )
            .await;
        assert_eq!(status, 200, "{sb}");
        sb
    }

    async fn sandbox_count(&self) -> usize {
        self.backend.list(Default::default()).await.unwrap().len()
    }
}

/// `SandboxError` as both SDKs read it: `code` and `message` (Python's required fields) and
/// the numeric `status` the TypeScript SDK tests.
fn assert_sandbox_error(body: &Value, status: u16) {
    assert!(body["message"].is_string(), "{body}");
    assert!(!body["code"].is_null(), "{body}");
    assert_eq!(body["status"], json!(status), "{body}");
}

#[tokio::test]
async fn a_missing_or_wrong_key_is_refused_before_any_effect() {
    let env = env().await;
    let body = json!({"metadata": {"name": "nokey"}});
    for key in [None, Some("wrong"), Some("")] {
        let req = env.request("POST", "/v0/sandboxes", key).json(&body);
        let (status, answer) = Env::send(req).await;
        assert_eq!(status, 401, "{key:?}: {answer}");
        assert_sandbox_error(&answer, 401);
        assert_eq!(answer["code"], "UNAUTHORIZED");
    }
    // `Authorization: Bearer` with a wrong key is refused too, and a right one accepted.
    let req = env
        .http
        .get(format!("{}/v0/sandboxes", env.url))
        .bearer_auth("wrong");
    assert_eq!(Env::send(req).await.0, 401);
    let req = env
        .http
        .get(format!("{}/v0/sandboxes", env.url))
        .bearer_auth(KEY);
    assert_eq!(Env::send(req).await.0, 200);
    assert_eq!(env.sandbox_count().await, 0, "nothing was created");
    // The data plane: a wrong key starts no process.
    env.create("keyed").await;
    let req = env
        .request("POST", "/blaxel-sbx/keyed/process", Some("wrong"))
        .json(&json!({"command": "touch /tmp/ran", "waitForCompletion": true}));
    assert_eq!(Env::send(req).await.0, 401);
    let (status, procs) = env.call("GET", "/blaxel-sbx/keyed/process", None).await;
    assert_eq!(status, 200, "{procs}");
    assert_eq!(procs, json!([]), "no process ran");
}

/// `X-Blaxel-Workspace` naming another workspace is `403 UNAUTHORIZED_WORKSPACE` before any
/// effect, on the control plane and on a sandbox's API; no header, or an empty one (what
/// `@blaxel/core` sends without `BL_WORKSPACE`), is accepted.
#[tokio::test]
async fn a_wrong_workspace_is_refused_before_any_effect() {
    let env = env().await;
    let with = |method: &str, path: &str, workspace: Option<&str>| {
        let mut req = env
            .http
            .request(method.parse().unwrap(), format!("{}{path}", env.url))
            .header("X-Blaxel-Authorization", format!("Bearer {KEY}"));
        if let Some(w) = workspace {
            req = req.header("X-Blaxel-Workspace", w);
        }
        req
    };
    let body = json!({"metadata": {"name": "elsewhere"}});
    let (status, answer) =
        Env::send(with("POST", "/v0/sandboxes", Some("another")).json(&body)).await;
    assert_eq!(status, 403, "{answer}");
    assert_sandbox_error(&answer, 403);
    assert_eq!(answer["code"], "UNAUTHORIZED_WORKSPACE");
    assert_eq!(env.sandbox_count().await, 0, "nothing was created");
    env.create("ws").await;
    let run = json!({"command": "touch /tmp/ran", "waitForCompletion": true});
    let req = with("POST", "/blaxel-sbx/ws/process", Some("another")).json(&run);
    assert_eq!(Env::send(req).await.0, 403);
    let (status, procs) = env.call("GET", "/blaxel-sbx/ws/process", None).await;
    assert_eq!((status, procs), (200, json!([])), "no process ran");
    for workspace in [None, Some("")] {
        let (status, answer) = Env::send(with("GET", "/v0/sandboxes/ws", workspace)).await;
        assert_eq!(status, 200, "{workspace:?}: {answer}");
    }
}

#[tokio::test]
async fn sandboxes_are_named_deployed_and_point_at_this_listener() {
    let env = env().await;
    let sb = env.create("shapes").await;
    assert_eq!(sb["metadata"]["name"], "shapes");
    assert_eq!(
        sb["metadata"]["url"],
        json!(format!("{}/blaxel-sbx/shapes", env.url))
    );
    assert_eq!(sb["metadata"]["workspace"], "sandcove");
    assert_eq!(sb["spec"]["region"], "us-pdx-1");
    assert!(STATUSES.contains(&sb["status"].as_str().unwrap()), "{sb}");
    assert_eq!(sb["status"], "DEPLOYED");
    // createIfNotExist returns the live one; without it, a taken name is a 409.
    let again = env
        .call(
            "POST",
            "/v0/sandboxes?createIfNotExist=true",
            Some(json!({"metadata": {"name": "shapes"}})),
        )
        .await;
    assert_eq!(again.0, 200, "{}", again.1);
    assert_eq!(again.1["metadata"]["labels"]["k"], "v", "the existing one");
    let (status, conflict) = env
        .call(
            "POST",
            "/v0/sandboxes",
            Some(json!({"metadata": {"name": "shapes"}})),
        )
        .await;
    assert_eq!(status, 409, "{conflict}");
    assert_eq!(conflict["code"], "SANDBOX_ALREADY_EXISTS");
    // Routing looks at the path only: a proxied request names Blaxel's host.
    let req = env
        .request("GET", "/v0/sandboxes/shapes", Some(KEY))
        .header("Host", "api.blaxel.ai");
    let (status, got) = Env::send(req).await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["metadata"]["url"], sb["metadata"]["url"]);
    let (status, page) = env.call("GET", "/v0/sandboxes?limit=10", None).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["data"].as_array().unwrap().len(), 1, "{page}");
    assert_eq!(page["meta"]["hasMore"], false);
    // Delete, then delete again (as the TypeScript README does): both answer DELETING.
    for _ in 0..2 {
        let (status, gone) = env.call("DELETE", "/v0/sandboxes/shapes", None).await;
        assert_eq!(status, 200, "{gone}");
        assert_eq!(gone["status"], "DELETING");
    }
    assert_eq!(env.sandbox_count().await, 0);
    let (status, missing) = env.call("GET", "/v0/sandboxes/shapes", None).await;
    assert_eq!(status, 404, "{missing}");
    assert_sandbox_error(&missing, 404);
    assert_eq!(
        missing["code"],
        json!(404),
        "the TypeScript SDK tests code === 404"
    );
    let (status, _) = env.call("DELETE", "/v0/sandboxes/never-made", None).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn bad_input_is_a_400_and_creates_nothing() {
    let env = env().await;
    for (path, body, needle) in [
        (
            "/v0/sandboxes",
            json!({"metadata": {"name": "bad"}, "spec": {"runtime": {"gpu": 1}}}),
            "gpu",
        ),
        (
            "/v0/sandboxes",
            json!({"metadata": {"name": "Bad Name"}}),
            "invalid sandbox name",
        ),
        (
            "/v0/sandboxes",
            json!({"metadata": {"name": "bad"}, "spec": {"region": "mars-1"}}),
            "region",
        ),
        (
            "/v0/sandboxes?createIfNotExist=maybe",
            json!({"metadata": {"name": "bad"}}),
            "createIfNotExist",
        ),
    ] {
        let (status, answer) = env.call("POST", path, Some(body)).await;
        assert_eq!(status, 400, "{path}: {answer}");
        assert_sandbox_error(&answer, 400);
        assert!(
            answer["message"].as_str().unwrap().contains(needle),
            "{needle}: {answer}"
        );
    }
    // A body over the JSON limit.
    let big = json!({"metadata": {"name": "big", "labels": {"x": "y".repeat(100 * 1024)}}});
    let (status, answer) = env.call("POST", "/v0/sandboxes", Some(big)).await;
    assert_eq!(status, 413, "{answer}");
    assert_eq!(env.sandbox_count().await, 0);
}

#[tokio::test]
async fn file_paths_with_double_slashes_collapse() {
    let env = env().await;
    env.create("paths").await;
    let (status, put) = env
        .call(
            "PUT",
            "/blaxel-sbx/paths/filesystem//tmp/dir/a.txt",
            Some(json!({"content": "hi"})),
        )
        .await;
    assert_eq!(status, 200, "{put}");
    // Read back with the slashes percent-encoded, as the TypeScript SDK sends them.
    let (status, got) = env
        .call(
            "GET",
            "/blaxel-sbx/paths/filesystem/%2Ftmp%2Fdir%2Fa.txt",
            None,
        )
        .await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["content"], "hi");
    let (status, dir) = env
        .call("GET", "/blaxel-sbx/paths/filesystem//tmp/dir", None)
        .await;
    assert_eq!(status, 200, "{dir}");
    assert_eq!(dir["files"][0]["name"], "a.txt");
    let (status, missing) = env
        .call("GET", "/blaxel-sbx/paths/filesystem//tmp/none", None)
        .await;
    assert_eq!(status, 404, "{missing}");
    assert!(missing["error"].is_string(), "the sandbox API's error body");
    // Doubled slashes anywhere (a base URL given with a trailing slash) route the same.
    let (status, sb) = env.call("GET", "/v0//sandboxes//paths", None).await;
    assert_eq!(status, 200, "{sb}");
    let (status, procs) = env.call("GET", "/blaxel-sbx/paths//process", None).await;
    assert_eq!(status, 200, "{procs}");
    let (status, nosb) = env
        .call("GET", "/blaxel-sbx/no-such/filesystem//tmp", None)
        .await;
    assert_eq!(status, 404, "{nosb}");
}

#[tokio::test]
async fn exec_streams_ndjson_when_asked() {
    let env = env().await;
    env.create("stream").await;
    let resp = env
        .request("POST", "/blaxel-sbx/stream/process", Some(KEY))
        .header("Accept", "text/event-stream")
        .json(&json!({"command": "echo one; echo two >&2; exit 4", "waitForCompletion": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(
        resp.headers()["content-type"].to_str().unwrap(),
        "application/x-ndjson"
    );
    let text = resp.text().await.unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        lines.contains(&json!({"type": "stdout", "data": "one"})),
        "{text}"
    );
    assert!(
        lines.contains(&json!({"type": "stderr", "data": "two"})),
        "{text}"
    );
    let last = lines.last().unwrap();
    assert_eq!(last["type"], "result", "{text}");
    let result: Value = serde_json::from_str(last["data"].as_str().unwrap()).unwrap();
    assert_eq!(result["exitCode"], 4);
    assert_eq!(result["status"], "failed");
    // Without the Accept header the same call answers JSON.
    let (status, plain) = env
        .call(
            "POST",
            "/blaxel-sbx/stream/process",
            Some(json!({"command": "echo plain", "waitForCompletion": true})),
        )
        .await;
    assert_eq!(status, 200, "{plain}");
    assert_eq!(plain["stdout"], "plain\n");
    assert_eq!(plain["status"], "completed");
}

#[tokio::test]
async fn gaps_name_their_alternative_before_any_effect() {
    let env = env().await;
    env.create("gaps").await;
    for (method, path, body) in [
        (
            "POST",
            "/v0/sandboxes/gaps/fork",
            json!({"targetName": "x", "targetType": "application"}),
        ),
        (
            "POST",
            "/v0/sandboxes/gaps/fork",
            json!({"targetName": "x", "port": 8000}),
        ),
        ("GET", "/v0/sandboxes/gaps/schedules", json!(null)),
        (
            "PUT",
            "/v0/sandboxes/gaps",
            json!({"metadata": {"name": "gaps"}, "spec": {"runtime": {"memory": 8192}}}),
        ),
    ] {
        let body = (!body.is_null()).then_some(body);
        let (status, answer) = env.call(method, path, body).await;
        assert_eq!(status, 501, "{path}: {answer}");
        let message = answer["message"]
            .as_str()
            .or(answer["error"].as_str())
            .unwrap();
        assert!(
            message.contains("not supported on Sandcove") && message.contains("instead"),
            "{path}: {answer}"
        );
    }
    assert_eq!(env.sandbox_count().await, 1, "no fork or snapshot sandbox");
    let (_, procs) = env.call("GET", "/blaxel-sbx/gaps/process", None).await;
    assert_eq!(procs, json!([]), "no process started");
}

/// A `multipart/form-data` body with one `file` field.
fn form(bytes: &[u8]) -> (String, Vec<u8>) {
    let boundary = "sandcove-test-boundary";
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"blob\"\r\n\
         Content-Type: application/octet-stream\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(bytes);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

#[tokio::test]
async fn multipart_uploads_are_bounded_and_assembled_in_order() {
    let env = env().await;
    env.create("up").await;
    let (status, init) = env
        .call(
            "POST",
            "/blaxel-sbx/up/filesystem-multipart/initiate//tmp/big.bin",
            Some(json!({"permissions": "0644"})),
        )
        .await;
    assert_eq!(status, 200, "{init}");
    let id = init["uploadId"].as_str().unwrap().to_string();
    let put = |n: u32, bytes: Vec<u8>| {
        let (ct, body) = form(&bytes);
        env.request(
            "PUT",
            &format!("/blaxel-sbx/up/filesystem-multipart/{id}/part?partNumber={n}"),
            Some(KEY),
        )
        .header("Content-Type", ct)
        .body(body)
    };
    // Parts arrive out of order; the file is assembled by part number.
    for (n, byte) in [(2, b'b'), (1, b'a')] {
        let (status, answer) = Env::send(put(n, vec![byte; 300 * 1024])).await;
        assert_eq!(status, 200, "part {n}: {answer}");
    }
    // Over the listener's upload limit (1 MiB in flight): refused, nothing kept.
    let (status, over) = Env::send(put(3, vec![b'c'; 600 * 1024])).await;
    assert_eq!(status, 413, "{over}");
    let (status, done) = env
        .call(
            "POST",
            &format!("/blaxel-sbx/up/filesystem-multipart/{id}/complete"),
            Some(json!({"parts": [{"partNumber": 2}, {"partNumber": 1}]})),
        )
        .await;
    assert_eq!(status, 200, "{done}");
    let resp = env
        .request("GET", "/blaxel-sbx/up/filesystem//tmp/big.bin", Some(KEY))
        .header("Accept", "application/octet-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let bytes = resp.bytes().await.unwrap();
    assert_eq!(bytes.len(), 600 * 1024);
    assert!(bytes[..300 * 1024].iter().all(|b| *b == b'a'));
    assert!(bytes[300 * 1024..].iter().all(|b| *b == b'b'));
    // The parts waited in files in the sandbox, removed now.
    let core_id = env.backend.list(Default::default()).await.unwrap()[0]
        .id
        .clone();
    let parts = format!("{}/{id}", blaxel::wire::uploads::PARTS_DIR);
    let gone = env
        .backend
        .stat(&core_id, &parts, Default::default())
        .await
        .unwrap_err();
    assert!(gone.is_not_found(), "{gone}");
    // A completed (or unknown) upload takes no more parts.
    let (status, _) = Env::send(put(1, vec![b'x'; 10])).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn file_reads_are_bounded_as_json_and_streamed_as_bytes() {
    let env = env().await;
    env.create("reads").await;
    // A text write is one JSON body, which the SDKs send up to their multipart threshold
    // (5 MiB): past the JSON limit (64 KiB here), up to the limit of a file in a JSON
    // answer (1 MiB here).
    let text = "t".repeat(200 * 1024);
    let (status, put) = env
        .call(
            "PUT",
            "/blaxel-sbx/reads/filesystem//tmp/text",
            Some(json!({ "content": text })),
        )
        .await;
    assert_eq!(status, 200, "{put}");
    let (status, got) = env
        .call("GET", "/blaxel-sbx/reads/filesystem//tmp/text", None)
        .await;
    assert_eq!(status, 200);
    assert_eq!(got["content"].as_str().map(str::len), Some(200 * 1024));
    let (status, over) = env
        .call(
            "PUT",
            "/blaxel-sbx/reads/filesystem//tmp/text",
            Some(json!({ "content": "t".repeat(1100 * 1024) })),
        )
        .await;
    assert_eq!(status, 413, "{over}");
    // Sandbox code grows a file past the listener's limit of a file in a JSON answer.
    let (status, made) = env
        .call(
            "POST",
            "/blaxel-sbx/reads/process",
            Some(json!({"command": "head -c 1200000 /dev/zero > /tmp/huge", "waitForCompletion": true})),
        )
        .await;
    assert_eq!(status, 200, "{made}");
    let (status, json_read) = env
        .call("GET", "/blaxel-sbx/reads/filesystem//tmp/huge", None)
        .await;
    assert_eq!(
        status, 413,
        "the JSON form holds the file in memory: bounded"
    );
    assert!(json_read["error"].as_str().unwrap().contains("readBinary"));
    let resp = env
        .request("GET", "/blaxel-sbx/reads/filesystem//tmp/huge", Some(KEY))
        .header("Accept", "application/octet-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(
        resp.bytes().await.unwrap().len(),
        1_200_000,
        "streamed whole"
    );
}

#[tokio::test]
async fn previews_take_the_python_sdks_body() {
    let env = env().await;
    env.create("pv").await;
    // blaxel 0.4.24 (Python) sends the read-only `events` with every preview it creates.
    let (status, preview) = env
        .call(
            "POST",
            "/v0/sandboxes/pv/previews",
            Some(json!({"metadata": {"name": "web"}, "spec": {"port": 3000, "public": true}, "events": []})),
        )
        .await;
    assert_eq!(status, 200, "{preview}");
    assert_eq!(preview["metadata"]["resourceName"], "pv");
    assert!(preview["spec"]["url"].as_str().unwrap().starts_with("http"));
    let (status, missing) = env
        .call("GET", "/v0/sandboxes/pv/previews/none", None)
        .await;
    assert_eq!(status, 404, "{missing}");
    assert_eq!(
        missing["code"],
        json!(404),
        "the TypeScript SDK tests code === 404"
    );
}

#[tokio::test]
async fn the_python_sdks_long_poll_wait_answers_when_the_process_ends_or_the_hold_does() {
    let env = env().await;
    env.create("waits").await;
    for (name, command) in [("quick", "sleep 0.3; echo done"), ("slow", "sleep 30")] {
        let (status, started) = env
            .call(
                "POST",
                "/blaxel-sbx/waits/process",
                Some(json!({"name": name, "command": command})),
            )
            .await;
        assert_eq!(status, 200, "{started}");
    }
    let (status, quick) = env
        .call(
            "GET",
            "/blaxel-sbx/waits/process/quick/wait?timeout=30",
            None,
        )
        .await;
    assert_eq!(status, 200, "{quick}");
    assert_eq!(quick["status"], "completed");
    assert_eq!(quick["stdout"], "done\n");
    let (status, slow) = env
        .call("GET", "/blaxel-sbx/waits/process/slow/wait?timeout=1", None)
        .await;
    assert_eq!(status, 200, "{slow}");
    assert_eq!(slow["status"], "running", "the hold ended first");
    let (status, missing) = env
        .call("GET", "/blaxel-sbx/waits/process/none/wait?timeout=1", None)
        .await;
    assert_eq!(status, 404, "a JSON 404: the process does not exist");
    assert!(missing["error"].is_string());
}

/// Finding: a refused request answered before its body was read closed the connection the
/// Python SDK was already reusing, so its next call failed with "Server disconnected".
/// Each refusal (no key, an unserved path, a gap, a path outside the API) is sent head first,
/// its body after; every answer, and a next request's, arrives on the one connection. A
/// refused body too large to read is answered with `Connection: close`, then closed.
#[tokio::test]
async fn refused_requests_keep_a_reused_connection() {
    let env = env().await;
    let auth = format!("X-Blaxel-Authorization: Bearer {KEY}\r\n");
    common::refusals_keep_the_connection(
        &env.url,
        &[
            ("POST", "/v0/sandboxes", "", 401),
            (
                "POST",
                "/v0/sandboxes",
                "X-Blaxel-Authorization: Bearer wrong\r\n",
                401,
            ),
            ("POST", "/v0/sandboxes/s/schedules", auth.as_str(), 501),
            ("POST", "/v0/unserved", auth.as_str(), 501),
            ("POST", "/elsewhere", auth.as_str(), 404),
        ],
        ("GET", "/v0/sandboxes", auth.as_str(), 200),
    )
    .await;
    common::an_oversized_refused_body_closes_cleanly(
        &env.url,
        "POST",
        "/v0/drives",
        auth.as_str(),
        501,
    )
    .await;
}

/// A file's text through the sandbox API.
async fn read_text(env: &Env, sandbox: &str, path: &str) -> String {
    let (status, answer) = env
        .call(
            "GET",
            &format!("/blaxel-sbx/{sandbox}/filesystem/{path}"),
            None,
        )
        .await;
    assert_eq!(status, 200, "{sandbox}:{path}: {answer}");
    answer["content"].as_str().unwrap().to_string()
}

/// Snapshots and fork as the SDKs' generated clients read them: every refusal (unknown
/// sandbox or snapshot `404` with a numeric `code`, bad bodies `400`, a taken name `409`, an
/// application fork `501`) before any effect; then the shapes, per-sandbox and workspace
/// listings with paging, restore by name, forks live, from a snapshot and from a snapshot
/// whose source is gone, and deletes (`204`).
#[tokio::test]
async fn snapshots_and_fork_answer_as_blaxel_does() {
    let env = env().await;
    env.create("snap").await;
    let (status, _) = env
        .call(
            "PUT",
            "/blaxel-sbx/snap/filesystem//blaxel/m.txt",
            Some(json!({"content": "one"})),
        )
        .await;
    assert_eq!(status, 200);
    for (method, path, body, want) in [
        ("POST", "/v0/sandboxes/nope/snapshots", json!({}), 404),
        (
            "POST",
            "/v0/sandboxes/snap/snapshots",
            json!({"name": "a/b"}),
            400,
        ),
        (
            "POST",
            "/v0/sandboxes/snap/snapshots",
            json!({"bogus": 1}),
            400,
        ),
        (
            "POST",
            "/v0/sandboxes/snap/snapshots",
            json!({"source": {"name": "other"}}),
            400,
        ),
        ("POST", "/v0/snapshots", json!({"name": "x"}), 400),
        (
            "POST",
            "/v0/snapshots",
            json!({"source": {"name": "nope"}}),
            404,
        ),
        (
            "POST",
            "/v0/snapshots",
            json!({"source": {"name": "snap", "kind": "agent"}}),
            400,
        ),
        ("GET", "/v0/sandboxes/nope/snapshots", json!(null), 404),
        ("GET", "/v0/snapshots/snap-none", json!(null), 404),
        ("DELETE", "/v0/snapshots/snap-none", json!(null), 404),
        (
            "DELETE",
            "/v0/sandboxes/snap/snapshots/none",
            json!(null),
            404,
        ),
        (
            "POST",
            "/v0/sandboxes/snap/snapshots/none/restore",
            json!(null),
            404,
        ),
        (
            "POST",
            "/v0/sandboxes/nope/snapshots/none/restore",
            json!(null),
            404,
        ),
        (
            "POST",
            "/v0/snapshots/snap-none/fork",
            json!({"targetName": "f0"}),
            404,
        ),
        (
            "POST",
            "/v0/sandboxes/nope/fork",
            json!({"targetName": "f0"}),
            404,
        ),
        (
            "POST",
            "/v0/sandboxes/snap/fork",
            json!({"targetName": "f0", "snapshotId": "snap-none"}),
            404,
        ),
        ("POST", "/v0/sandboxes/snap/fork", json!({}), 400),
        (
            "POST",
            "/v0/sandboxes/snap/fork",
            json!({"targetName": "Bad Name"}),
            400,
        ),
        (
            "POST",
            "/v0/sandboxes/snap/fork",
            json!({"targetName": "f0", "bogus": 1}),
            400,
        ),
        (
            "POST",
            "/v0/sandboxes/snap/fork",
            json!({"targetName": "f0", "targetType": "application"}),
            501,
        ),
        (
            "POST",
            "/v0/sandboxes/snap/fork",
            json!({"targetName": "snap"}),
            409,
        ),
        ("GET", "/v0/snapshots?limit=0", json!(null), 400),
        ("GET", "/v0/snapshots?limit=201", json!(null), 400),
        ("GET", "/v0/snapshots?cursor=x", json!(null), 400),
        ("GET", "/v0/snapshots?sort=name:asc", json!(null), 400),
        ("GET", "/v0/snapshots?q=first", json!(null), 400),
    ] {
        let body = (!body.is_null()).then_some(body);
        let (status, answer) = env.call(method, path, body).await;
        assert_eq!(status, want, "{method} {path}: {answer}");
        assert_sandbox_error(&answer, want);
        if want == 404 {
            assert_eq!(
                answer["code"],
                json!(404),
                "Python reads int(code): {answer}"
            );
            assert!(answer["error"].is_string(), "{answer}");
        }
    }
    assert_eq!(env.sandbox_count().await, 1, "no fork made");
    assert!(
        env.backend.list_snapshots().await.unwrap().is_empty(),
        "no snapshot left behind"
    );

    // Per sandbox: named, unnamed (named by its id), a taken name refused.
    let (status, first) = env
        .call(
            "POST",
            "/v0/sandboxes/snap/snapshots",
            Some(json!({"name": "first"})),
        )
        .await;
    assert_eq!(status, 200, "{first}");
    let id = first["id"].as_str().unwrap().to_string();
    assert_eq!(first["name"], "first");
    assert_eq!(first["status"], "ready");
    assert_eq!(first["workspace"], "sandcove");
    assert_eq!(first["sandboxName"], "snap");
    assert!(
        first["createdAt"].as_str().unwrap().ends_with('Z'),
        "{first}"
    );
    assert_eq!(
        first["source"],
        json!({"name": "snap", "kind": "sandbox", "deleted": false})
    );
    assert_eq!(first["spec"]["image"], "blaxel/base-image:latest");
    assert_eq!(first["spec"]["memory"], 4096);
    assert_eq!(first["spec"]["region"], "us-pdx-1");
    let (status, taken) = env
        .call(
            "POST",
            "/v0/sandboxes/snap/snapshots",
            Some(json!({"name": "first"})),
        )
        .await;
    assert_eq!(status, 409, "{taken}");
    let (status, unnamed) = env.call("POST", "/v0/sandboxes/snap/snapshots", None).await;
    assert_eq!(status, 200, "{unnamed}");
    assert_eq!(unnamed["name"], unnamed["id"]);
    let (status, third) = env
        .call(
            "POST",
            "/v0/snapshots",
            Some(json!({"name": "third", "source": {"name": "snap", "kind": "sandbox"}})),
        )
        .await;
    assert_eq!(status, 200, "{third}");
    assert_eq!(third["source"]["name"], "snap");
    let (status, listed) = env.call("GET", "/v0/sandboxes/snap/snapshots", None).await;
    assert_eq!(status, 200, "{listed}");
    let ids: Vec<&Value> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|s| &s["id"])
        .collect();
    assert_eq!(
        ids,
        [&first["id"], &unnamed["id"], &third["id"]],
        "oldest first"
    );

    // Workspace listing, paged.
    let (status, page) = env.call("GET", "/v0/snapshots?limit=2", None).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["data"].as_array().unwrap().len(), 2);
    assert_eq!(page["meta"]["hasMore"], true);
    assert_eq!(page["meta"]["total"], 3);
    let cursor = page["meta"]["nextCursor"].as_str().unwrap().to_string();
    let (status, rest) = env
        .call(
            "GET",
            &format!("/v0/snapshots?limit=2&cursor={cursor}"),
            None,
        )
        .await;
    assert_eq!(status, 200, "{rest}");
    assert_eq!(rest["data"].as_array().unwrap().len(), 1);
    assert_eq!(rest["data"][0]["id"], third["id"]);
    assert_eq!(rest["meta"]["hasMore"], false);
    assert!(rest["meta"].get("nextCursor").is_none(), "{rest}");
    let (status, got) = env.call("GET", &format!("/v0/snapshots/{id}"), None).await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["name"], "first");

    // Restore by name: the files written since are gone; the sandbox keeps its record.
    env.call(
        "PUT",
        "/blaxel-sbx/snap/filesystem//blaxel/m.txt",
        Some(json!({"content": "two"})),
    )
    .await;
    let (status, restored) = env
        .call("POST", "/v0/sandboxes/snap/snapshots/first/restore", None)
        .await;
    assert_eq!(status, 200, "{restored}");
    assert_eq!(restored, json!({"name": "snap", "snapshotId": id}));
    assert_eq!(read_text(&env, "snap", "/blaxel/m.txt").await, "one");
    let (status, sb) = env.call("GET", "/v0/sandboxes/snap", None).await;
    assert_eq!(status, 200, "{sb}");
    assert_eq!(sb["metadata"]["labels"]["k"], "v");
    assert_eq!(sb["spec"]["runtime"]["ttl"], "1h");
    let (_, listed) = env.call("GET", "/v0/sandboxes/snap/snapshots", None).await;
    assert_eq!(
        listed.as_array().unwrap().len(),
        3,
        "snapshots kept: {listed}"
    );

    // Forks: from a snapshot (its id in the answer), live (none).
    env.call(
        "PUT",
        "/blaxel-sbx/snap/filesystem//blaxel/m.txt",
        Some(json!({"content": "live"})),
    )
    .await;
    let (status, fork) = env
        .call(
            "POST",
            "/v0/sandboxes/snap/fork",
            Some(json!({"targetName": "snap-f", "targetType": "sandbox", "snapshotId": id})),
        )
        .await;
    assert_eq!(status, 200, "{fork}");
    assert_eq!(
        fork,
        json!({"name": "snap-f", "type": "sandbox", "snapshotId": id})
    );
    assert_eq!(read_text(&env, "snap-f", "/blaxel/m.txt").await, "one");
    let (status, live) = env
        .call(
            "POST",
            "/v0/sandboxes/snap/fork",
            Some(json!({"targetName": "snap-g", "envs": [{"name": "X", "value": "1"}]})),
        )
        .await;
    assert_eq!(status, 200, "{live}");
    assert_eq!(live, json!({"name": "snap-g", "type": "sandbox"}));
    assert_eq!(read_text(&env, "snap-g", "/blaxel/m.txt").await, "live");
    let (_, g) = env.call("GET", "/v0/sandboxes/snap-g", None).await;
    assert!(
        g["spec"]["runtime"]["envs"]
            .as_array()
            .unwrap()
            .contains(&json!({"name": "X", "value": "1"})),
        "{g}"
    );
    // Another sandbox's snapshot is not this one's to fork from or restore to (its files
    // would run under this sandbox's record and envs): 404, nothing made or destroyed.
    let before = env.sandbox_count().await;
    for (path, body) in [
        (
            "/v0/sandboxes/snap-g/fork",
            json!({"targetName": "snap-x", "snapshotId": id}),
        ),
        (
            &*format!("/v0/sandboxes/snap-g/snapshots/{id}/restore"),
            json!(null),
        ),
    ] {
        let body = (!body.is_null()).then_some(body);
        let (status, answer) = env.call("POST", path, body).await;
        assert_eq!(status, 404, "POST {path}: {answer}");
        assert_sandbox_error(&answer, 404);
    }
    assert_eq!(
        env.sandbox_count().await,
        before,
        "nothing made or destroyed"
    );
    assert_eq!(read_text(&env, "snap-g", "/blaxel/m.txt").await, "live");

    // The source deleted: its snapshots stay, marked so, and still fork.
    let (status, _) = env.call("DELETE", "/v0/sandboxes/snap", None).await;
    assert_eq!(status, 200);
    let (_, gone) = env.call("GET", &format!("/v0/snapshots/{id}"), None).await;
    assert_eq!(gone["source"]["deleted"], true, "{gone}");
    assert!(gone.get("spec").is_none(), "{gone}");
    let (status, again) = env
        .call(
            "POST",
            &format!("/v0/snapshots/{id}/fork"),
            Some(json!({"targetName": "snap-h"})),
        )
        .await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(read_text(&env, "snap-h", "/blaxel/m.txt").await, "one");
    let (status, _) = env
        .call("DELETE", "/v0/sandboxes/snap/snapshots/first", None)
        .await;
    assert_eq!(status, 404, "the sandbox is gone");

    // Deletes: 204 with no body, then 404.
    let resp = env
        .request("DELETE", &format!("/v0/snapshots/{id}"), Some(KEY))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 204);
    assert!(resp.bytes().await.unwrap().is_empty());
    let (status, _) = env
        .call("DELETE", &format!("/v0/snapshots/{id}"), None)
        .await;
    assert_eq!(status, 404);
    let (status, _) = env
        .call(
            "DELETE",
            &format!(
                "/v0/sandboxes/snap-f/snapshots/{}",
                third["id"].as_str().unwrap()
            ),
            None,
        )
        .await;
    assert_eq!(status, 404, "a snapshot of another sandbox");
    assert_eq!(env.backend.list_snapshots().await.unwrap().len(), 2);
}

/// `GET /v0/sandboxes` pages by the last sandbox seen, in either order: a sandbox deleted
/// behind the cursor does not shift the next page, and a bad cursor is a 400.
#[tokio::test]
async fn sandbox_listing_pages_by_cursor_in_both_orders() {
    let env = env().await;
    for name in ["page-1", "page-2", "page-3"] {
        let (status, sb) = env
            .call(
                "POST",
                "/v0/sandboxes",
                Some(json!({"metadata": {"name": name}})),
            )
            .await;
        assert_eq!(status, 200, "{sb}");
        // The next sandbox is created in a later millisecond: the order asserted below is
        // the creation order, not a tie broken by id.
        next_millisecond().await;
    }
    let walk = |sort: &'static str, delete_first: bool| {
        let env = &env;
        async move {
            let mut names = Vec::new();
            let mut cursor: Option<String> = None;
            loop {
                let path = match &cursor {
                    None => format!("/v0/sandboxes?limit=1&sort={sort}"),
                    Some(c) => format!("/v0/sandboxes?limit=1&sort={sort}&cursor={c}"),
                };
                let (status, page) = env.call("GET", &path, None).await;
                assert_eq!(status, 200, "{page}");
                let data = page["data"].as_array().unwrap();
                assert_eq!(data.len(), 1, "{page}");
                let name = data[0]["metadata"]["name"].as_str().unwrap().to_string();
                if delete_first && names.is_empty() {
                    let (status, gone) = env
                        .call("DELETE", &format!("/v0/sandboxes/{name}"), None)
                        .await;
                    assert_eq!(status, 200, "{gone}");
                }
                names.push(name);
                if page["meta"]["hasMore"] == false {
                    assert!(page["meta"].get("nextCursor").is_none(), "{page}");
                    return names;
                }
                cursor = Some(page["meta"]["nextCursor"].as_str().unwrap().to_string());
            }
        }
    };
    assert_eq!(
        walk("createdAt:desc", false).await,
        ["page-3", "page-2", "page-1"]
    );
    assert_eq!(
        walk("createdAt:asc", true).await,
        ["page-1", "page-2", "page-3"],
        "deleting the page's sandbox does not skip the next one"
    );
    let (status, bad) = env
        .call("GET", "/v0/sandboxes?cursor=not-a-cursor", None)
        .await;
    assert_eq!(status, 400, "{bad}");
}

/// The server's policy (`sandcove serve --max-sandboxes`, `--allow-host-network`) is applied
/// to the backend under this listener too: a create past the cap is Blaxel's 403
/// `SandboxError` and makes nothing. (Blaxel's wire cannot ask for the host's network:
/// `spec.network` is refused as a gap.)
#[tokio::test]
async fn the_servers_policy_refuses_with_blaxels_403() {
    let env = Env::start(|backend, url| {
        let mut policy = sandcove::server::ServerPolicy::default();
        policy.max_sandboxes = 1;
        let governed = std::sync::Arc::new(sandcove::server::PolicyBackend::new(backend, policy));
        blaxel::wire::router(governed, blaxel::wire::WireConfig::new(KEY, url))
    })
    .await;
    env.create("first").await;
    let (status, body) = env
        .call(
            "POST",
            "/v0/sandboxes",
            Some(json!({"metadata": {"name": "second"}})),
        )
        .await;
    assert_eq!(status, 403, "{body}");
    assert_sandbox_error(&body, 403);
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("limit of 1 live sandboxes"),
        "{body}"
    );
    assert_eq!(env.sandbox_count().await, 1);
}

/// Uploads stream into the sandbox (nothing is held whole): a file upload broken off leaves
/// no file and gives its upload memory back; a multipart upload's parts wait in part files in
/// the sandbox, removed once it completes or is aborted, and a part broken off is not kept.
#[tokio::test]
async fn broken_off_uploads_write_nothing_and_parts_are_cleaned_up() {
    let budget = sandcove_compat_support::multipart::UploadBudget::default();
    let shared = budget.clone();
    let env = Env::start(move |backend, url| {
        let mut config = blaxel::wire::WireConfig::new(KEY, url);
        config.max_upload_bytes = 1024 * 1024;
        config.upload_memory = shared;
        blaxel::wire::router(backend, config)
    })
    .await;
    let sb = env.create("streams").await;
    let id = sb["metadata"]["name"].as_str().unwrap().to_string();
    let core_id = env.backend.list(Default::default()).await.unwrap()[0]
        .id
        .clone();
    let auth = format!("X-Blaxel-Authorization: Bearer {KEY}\r\nX-Blaxel-Workspace: sandcove\r\n");
    let mut body =
        b"--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"blob\"\r\n\r\n".to_vec();
    body.extend([b'x'; 100 * 1024]);
    let conn = common::partial_upload(
        &env.url,
        &format!("PUT /blaxel-sbx/{id}/filesystem//tmp/cut.bin"),
        &auth,
        body.len() + 512 * 1024,
        &body,
    )
    .await;
    eventually(
        std::time::Duration::from_secs(30),
        "the upload runs",
        || async { (budget.in_use() > 0).then_some(()).ok_or(0) },
    )
    .await;
    drop(conn);
    eventually(
        std::time::Duration::from_secs(30),
        "the upload ends",
        || async { (budget.in_use() == 0).then_some(()).ok_or(budget.in_use()) },
    )
    .await;
    let err = env
        .backend
        .stat(&core_id, "/tmp/cut.bin", Default::default())
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err}");

    // A multipart upload: a part broken off is not kept, complete takes the parts sent
    // whole, and the part files go.
    let (status, init) = env
        .call(
            "POST",
            &format!("/blaxel-sbx/{id}/filesystem-multipart/initiate//tmp/joined.bin"),
            Some(json!({})),
        )
        .await;
    assert_eq!(status, 200, "{init}");
    let upload = init["uploadId"].as_str().unwrap().to_string();
    let parts_dir = format!("{}/{upload}", blaxel::wire::uploads::PARTS_DIR);
    let conn = common::partial_upload(
        &env.url,
        &format!("PUT /blaxel-sbx/{id}/filesystem-multipart/{upload}/part?partNumber=2"),
        &auth,
        body.len() + 512 * 1024,
        &body,
    )
    .await;
    eventually(
        std::time::Duration::from_secs(30),
        "the part runs",
        || async { (budget.in_use() > 0).then_some(()).ok_or(0) },
    )
    .await;
    drop(conn);
    eventually(
        std::time::Duration::from_secs(30),
        "the part ends",
        || async { (budget.in_use() == 0).then_some(()).ok_or(budget.in_use()) },
    )
    .await;
    let (ct, part) = form(b"first part ");
    let (status, answer) = Env::send(
        env.request(
            "PUT",
            &format!("/blaxel-sbx/{id}/filesystem-multipart/{upload}/part?partNumber=1"),
            Some(KEY),
        )
        .header("Content-Type", ct)
        .body(part),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let parts = env
        .backend
        .list_dir(&core_id, &parts_dir, Default::default())
        .await
        .unwrap();
    let names: Vec<_> = parts.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["1"], "only the part sent whole is kept");
    let (status, answer) = env
        .call(
            "POST",
            &format!("/blaxel-sbx/{id}/filesystem-multipart/{upload}/complete"),
            Some(json!({"parts": [{"partNumber": 1}, {"partNumber": 2}]})),
        )
        .await;
    assert_eq!(status, 400, "part 2 never arrived whole: {answer}");
    let err = env
        .backend
        .stat(&core_id, "/tmp/joined.bin", Default::default())
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err}");
    let gone = env
        .backend
        .stat(&core_id, &parts_dir, Default::default())
        .await
        .unwrap_err();
    assert!(gone.is_not_found(), "the part files are removed: {gone}");
}

/// `fetch` over the wire: the request reaches the port's server with the listener's
/// credentials left out (the key sent as `Authorization` too), its body bounded by the
/// upload limit before anything is sent, a bad port refused; `stdin` data past the JSON
/// limit is a 413; the external id lists, finds, and cannot be changed by an update.
#[tokio::test]
async fn fetch_stdin_and_external_ids_are_bounded_and_keep_credentials_out() {
    let env = env().await;
    let (status, sb) = env
        .call(
            "POST",
            "/v0/sandboxes",
            Some(json!({"metadata": {"name": "fx", "externalId": "ext-fx"}})),
        )
        .await;
    assert_eq!(status, 200, "{sb}");
    assert_eq!(sb["metadata"]["externalId"], "ext-fx");
    assert_eq!(
        sb["metadata"]["labels"],
        json!({}),
        "the label stays internal"
    );
    // A server echoing the headers it got.
    let echo = "import http.server\n\
        class H(http.server.BaseHTTPRequestHandler):\n\
        \x20   def do_GET(self):\n\
        \x20       out = str(sorted(k.lower() for k in self.headers.keys())).encode()\n\
        \x20       self.send_response(200); self.send_header('content-length', str(len(out)))\n\
        \x20       self.end_headers(); self.wfile.write(out)\n\
        \x20   def log_message(self, *a): pass\n\
        http.server.HTTPServer(('0.0.0.0', 8001), H).serve_forever()\n";
    let (status, _) = env
        .call(
            "PUT",
            "/blaxel-sbx/fx/filesystem//tmp/echo.py",
            Some(json!({ "content": echo })),
        )
        .await;
    assert_eq!(status, 200);
    let (status, started) = env
        .call(
            "POST",
            "/blaxel-sbx/fx/process",
            Some(json!({"command": "python3 /tmp/echo.py", "waitForPorts": [8001]})),
        )
        .await;
    assert_eq!(status, 200, "{started}");
    let resp = env
        .http
        .get(format!("{}/blaxel-sbx/fx/port/8001/", env.url))
        .header("Authorization", format!("Bearer {KEY}"))
        .header("X-Blaxel-Workspace", "sandcove")
        .header("X-Kept", "1")
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let seen = resp.text().await.unwrap();
    assert_eq!(status, 200, "{seen}");
    assert!(seen.contains("x-kept"), "{seen}");
    assert!(
        !seen.contains("authorization") && !seen.contains("x-blaxel"),
        "credentials reached the sandbox: {seen}"
    );
    let (status, over) = Env::send(
        env.request("POST", "/blaxel-sbx/fx/port/8001/", Some(KEY))
            .body(vec![b'x'; 1024 * 1024 + 1]),
    )
    .await;
    assert_eq!(status, 413, "{over}");
    for port in ["0", "70000", "http"] {
        let (status, _) = env
            .call("GET", &format!("/blaxel-sbx/fx/port/{port}/"), None)
            .await;
        assert_eq!(status, 400, "port {port}");
    }
    // Stdin: one write is at most the JSON limit (64 KiB here).
    let (status, _) = env
        .call(
            "POST",
            "/blaxel-sbx/fx/process",
            Some(json!({"name": "cat", "command": "cat", "stdin": true})),
        )
        .await;
    assert_eq!(status, 200);
    let (status, over) = Env::send(
        env.request("POST", "/blaxel-sbx/fx/process/cat/stdin", Some(KEY))
            .body(vec![b'x'; 64 * 1024 + 1]),
    )
    .await;
    assert_eq!(status, 413, "{over}");
    let (status, done) = Env::send(
        env.request("POST", "/blaxel-sbx/fx/process/cat/stdin", Some(KEY))
            .body("in\n"),
    )
    .await;
    assert_eq!(status, 200, "{done}");
    // The external id: listed, found, fixed.
    let (status, page) = env
        .call("GET", "/v0/sandboxes?externalId=ext-fx", None)
        .await;
    assert_eq!(status, 200);
    assert_eq!(page["data"].as_array().map(Vec::len), Some(1), "{page}");
    let (_, none) = env
        .call("GET", "/v0/sandboxes?externalId=other", None)
        .await;
    assert_eq!(none["data"], json!([]));
    let (status, found) = env
        .call("GET", "/v0/sandboxes/by-external-id/ext-fx", None)
        .await;
    assert_eq!(
        (status, found["metadata"]["name"].as_str()),
        (200, Some("fx"))
    );
    let (status, changed) = env
        .call(
            "PUT",
            "/v0/sandboxes/fx",
            Some(json!({"metadata": {"name": "fx", "externalId": "ext-other"}})),
        )
        .await;
    assert_eq!(status, 400, "{changed}");
    let (status, same) = env
        .call(
            "PUT",
            "/v0/sandboxes/fx",
            Some(json!({"metadata": {"name": "fx", "externalId": "ext-fx", "labels": {"a": "b"}}})),
        )
        .await;
    assert_eq!(status, 200, "{same}");
}
