//! E2B's wire protocol byte by byte, from a Rust client: Connect envelopes and end-of-stream
//! messages, deadlines, keep-alives, and authentication before any effect. The router runs
//! in this process over the embedded engine with a private state directory.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use sandcove::{Backend, LocalBackend};
use sandcove_conformance::eventually;
use sandcove_tests::PrivateState;
use serde_json::{json, Value};

const KEY: &str = "wire-test-key";

struct Env {
    url: String,
    http: reqwest::Client,
    backend: Arc<LocalBackend>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    state: Option<PrivateState>,
}

impl Drop for Env {
    fn drop(&mut self) {
        drop(self.stop.take());
        // The state's cleanup runs its own runtime: not on this runtime's thread.
        let state = self.state.take();
        let _ = std::thread::spawn(move || drop(state)).join();
    }
}

async fn env() -> Env {
    env_with(e2b::wire::WireConfig::new(KEY)).await
}

async fn env_with(config: e2b::wire::WireConfig) -> Env {
    env_limited(config, common::test_limits()).await
}

async fn env_limited(
    config: e2b::wire::WireConfig,
    limits: sandcove::server::ConnectionLimits,
) -> Env {
    let state = PrivateState::new();
    let backend = Arc::new(LocalBackend::with_state_dir(&state.dir).expect("engine"));
    let app = e2b::wire::router(backend.clone(), config);
    let (url, stop) = common::serve_in_process_with(app, limits).await;
    Env {
        url,
        http: reqwest::Client::new(),
        backend,
        stop: Some(stop),
        state: Some(state),
    }
}

impl Env {
    /// Create a sandbox over the wire; its id and envd token.
    async fn create(&self) -> (String, String) {
        let r = self
            .http
            .post(format!("{}/v2/sandboxes", self.url))
            .header("X-API-KEY", KEY)
            .json(&json!({"templateID": "base", "metadata": {}, "envVars": {}}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 201);
        let body: Value = r.json().await.unwrap();
        (
            body["sandboxID"].as_str().unwrap().to_string(),
            body["envdAccessToken"].as_str().unwrap().to_string(),
        )
    }

    fn envd(&self, path: &str, id: &str, token: &str) -> reqwest::RequestBuilder {
        self.http
            .post(format!("{}{path}", self.url))
            .header("E2b-Sandbox-Id", id)
            .header("E2b-Sandbox-Port", "49983")
            .header("X-Access-Token", token)
            .header("Connect-Protocol-Version", "1")
    }

    /// A server-stream call: the raw answer body.
    async fn stream(
        &self,
        path: &str,
        id: &str,
        token: &str,
        message: &Value,
        headers: &[(&str, &str)],
    ) -> (u16, String, Vec<u8>) {
        let payload = serde_json::to_vec(message).unwrap();
        let mut body = vec![0u8];
        body.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        body.extend_from_slice(&payload);
        let mut req = self
            .envd(path, id, token)
            .header("Content-Type", "application/connect+json");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let r = req.body(body).send().await.unwrap();
        let status = r.status().as_u16();
        let ct = r
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        (status, ct, r.bytes().await.unwrap().to_vec())
    }
}

/// Split a Connect stream body into `(flags, json)` envelopes, strictly: every length must
/// match exactly, nothing may follow the end-of-stream envelope, and it must be there.
fn envelopes(body: &[u8]) -> Vec<(u8, Value)> {
    let mut out = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        assert!(rest.len() >= 5, "a truncated envelope header: {rest:?}");
        let flags = rest[0];
        let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        assert!(rest.len() >= 5 + len, "an envelope longer than the body");
        let value: Value = serde_json::from_slice(&rest[5..5 + len]).unwrap_or_else(|e| {
            panic!(
                "envelope payload is not JSON ({e}): {:?}",
                &rest[5..5 + len]
            )
        });
        out.push((flags, value));
        rest = &rest[5 + len..];
        if flags & 2 != 0 {
            assert!(rest.is_empty(), "bytes after the end-of-stream envelope");
        }
    }
    assert_eq!(
        out.last().map(|(f, _)| *f),
        Some(2),
        "the stream ends with an end-of-stream envelope"
    );
    assert!(
        out[..out.len() - 1].iter().all(|(f, _)| *f == 0),
        "only the last envelope is flagged"
    );
    out
}

fn start_message(script: &str, tag: Option<&str>) -> Value {
    let mut m =
        json!({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", script]}, "stdin": false});
    if let Some(tag) = tag {
        m["tag"] = json!(tag);
    }
    m
}

#[tokio::test]
async fn process_start_streams_exact_connect_envelopes() {
    let env = env().await;
    let (id, token) = env.create().await;
    let (status, ct, body) = env
        .stream(
            "/process.Process/Start",
            &id,
            &token,
            &start_message("printf 'hi\\n'; printf '\\377' >&2; exit 3", None),
            &[],
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(ct, "application/connect+json");
    // The end-of-stream envelope of a successful stream, byte for byte.
    assert!(body.ends_with(&[2, 0, 0, 0, 2, b'{', b'}']), "{body:?}");
    let all = envelopes(&body);
    let events: Vec<&Value> = all[..all.len() - 1]
        .iter()
        .map(|(_, v)| &v["event"])
        .collect();
    assert!(
        events[0]["start"]["pid"].as_u64().is_some_and(|p| p > 0),
        "{events:?}"
    );
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    for e in &events[1..events.len() - 1] {
        if let Some(s) = e["data"]["stdout"].as_str() {
            stdout.extend(b64.decode(s).unwrap());
        } else if let Some(s) = e["data"]["stderr"].as_str() {
            stderr.extend(b64.decode(s).unwrap());
        } else {
            panic!("unexpected event {e}");
        }
    }
    assert_eq!(stdout, b"hi\n");
    assert_eq!(stderr, [0xff], "binary output is carried as base64 bytes");
    assert_eq!(
        events[events.len() - 1],
        &json!({"end": {"exitCode": 3, "exited": true, "status": "exit status 3", "error": "exit status 3"}})
    );
}

#[tokio::test]
async fn a_malformed_envelope_is_refused_and_nothing_runs() {
    let env = env().await;
    let (id, token) = env.create().await;
    let payload = serde_json::to_vec(&start_message("touch /home/user/ran", None)).unwrap();
    // The length says one byte more than the body holds.
    let mut body = vec![0u8];
    body.extend_from_slice(&(payload.len() as u32 + 1).to_be_bytes());
    body.extend_from_slice(&payload);
    let r = env
        .envd("/process.Process/Start", &id, &token)
        .header("Content-Type", "application/connect+json")
        .body(body)
        .send()
        .await
        .unwrap();
    let bytes = r.bytes().await.unwrap();
    let all = envelopes(&bytes);
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].1["error"]["code"], "invalid_argument");
    let err = env
        .backend
        .stat(&id, "/home/user/ran", Default::default())
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err}");
}

#[tokio::test]
async fn a_deadline_kills_the_process_and_ends_with_deadline_exceeded() {
    let env = env().await;
    let (id, token) = env.create().await;
    let (_, _, body) = env
        .stream(
            "/process.Process/Start",
            &id,
            &token,
            &start_message("sleep 120", Some("deadline")),
            &[("Connect-Timeout-Ms", "500")],
        )
        .await;
    let all = envelopes(&body);
    let (flags, last) = all.last().unwrap();
    assert_eq!(*flags, 2);
    assert_eq!(last["error"]["code"], "deadline_exceeded", "{last}");
    let backend = env.backend.clone();
    eventually(
        Duration::from_secs(10),
        "the timed-out process is gone",
        || {
            let backend = backend.clone();
            let id = id.clone();
            async move {
                let listed = backend
                    .list_processes(&id)
                    .await
                    .map_err(|e| e.to_string())?;
                match listed
                    .iter()
                    .find(|p| p.tag.as_deref() == Some("deadline") && p.exit.is_none())
                {
                    Some(p) => Err(format!("still running: {p:?}")),
                    None => Ok(()),
                }
            }
        },
    )
    .await;
}

#[tokio::test]
async fn quiet_streams_carry_keepalives() {
    let env = env().await;
    let (id, token) = env.create().await;
    let (_, _, body) = env
        .stream(
            "/process.Process/Start",
            &id,
            &token,
            &start_message("sleep 2.5; echo done", None),
            &[("Keepalive-Ping-Interval", "1")],
        )
        .await;
    let all = envelopes(&body);
    let keepalives = all
        .iter()
        .filter(|(_, v)| v["event"].get("keepalive").is_some())
        .count();
    assert!(keepalives >= 1, "no keepalive in {all:?}");
    assert_eq!(all[all.len() - 2].1["event"]["end"]["exitCode"], 0);
}

#[tokio::test]
async fn wrong_credentials_are_refused_before_any_effect() {
    let env = env().await;
    let before = env.backend.list(Default::default()).await.unwrap().len();
    for key in [
        None,
        Some("wrong"),
        Some("wire-test-ke"),
        Some("wire-test-keyy"),
    ] {
        let mut req = env
            .http
            .post(format!("{}/v2/sandboxes", env.url))
            .json(&json!({"templateID": "base"}));
        if let Some(k) = key {
            req = req.header("X-API-KEY", k);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status().as_u16(), 401, "{key:?}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["code"], 401);
        assert!(body["message"].as_str().is_some());
    }
    assert_eq!(
        env.backend.list(Default::default()).await.unwrap().len(),
        before
    );

    let (id, token) = env.create().await;
    let (other, other_token) = env.create().await;
    assert_ne!(token, other_token);
    // Another sandbox's token, a damaged token, none at all.
    let mut damaged = token.clone();
    damaged.pop();
    damaged.push(if token.ends_with('0') { '1' } else { '0' });
    for bad in [other_token.as_str(), damaged.as_str(), ""] {
        let (status, _, body) = env
            .stream(
                "/process.Process/Start",
                &id,
                bad,
                &start_message("touch /home/user/pwned", None),
                &[],
            )
            .await;
        assert_eq!(status, 401);
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["code"], "unauthenticated");
        let r = env
            .http
            .get(format!("{}/files?path=/etc/hostname", env.url))
            .header("E2b-Sandbox-Id", &id)
            .header("X-Access-Token", bad)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 401);
    }
    let err = env
        .backend
        .stat(&id, "/home/user/pwned", Default::default())
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err}");
    // The control-plane key is not an envd token either.
    let (status, _, _) = env
        .stream(
            "/process.Process/Start",
            &other,
            KEY,
            &start_message("true", None),
            &[],
        )
        .await;
    assert_eq!(status, 401);
}

#[tokio::test]
async fn oversized_bodies_are_refused() {
    let env = env().await;
    let (id, token) = env.create().await;
    let big = "x".repeat(2 * 1024 * 1024);
    let (_, _, body) = env
        .stream(
            "/process.Process/Start",
            &id,
            &token,
            &start_message(&big, None),
            &[],
        )
        .await;
    let all = envelopes(&body);
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].1["error"]["code"], "resource_exhausted");
    let r = env
        .http
        .post(format!("{}/v2/sandboxes", env.url))
        .header("X-API-KEY", KEY)
        .header("Content-Type", "application/json")
        .body(format!(
            "{{\"templateID\":\"base\",\"metadata\":{{\"a\":\"{big}\"}}}}"
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 413);
}

#[tokio::test]
async fn a_body_that_is_not_an_object_is_400_and_nothing_is_made() {
    let env = env().await;
    let before = env.backend.list(Default::default()).await.unwrap().len();
    let r = env
        .http
        .post(format!("{}/v2/sandboxes", env.url))
        .header("X-API-KEY", KEY)
        .header("Content-Type", "application/json")
        .body(r#"["base"]"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let body: Value = r.json().await.unwrap();
    assert!(
        body["message"].as_str().unwrap().contains("JSON object"),
        "{body}"
    );
    assert_eq!(
        env.backend.list(Default::default()).await.unwrap().len(),
        before
    );
}

#[tokio::test]
async fn metrics_answer_the_sample_only_inside_the_range_whatever_its_ends() {
    let env = env().await;
    let (id, _) = env.create().await;
    let metrics = |query: &str| {
        env.http
            .get(format!("{}/sandboxes/{id}/metrics{query}", env.url))
            .header("X-API-KEY", KEY)
            .send()
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    for (query, samples) in [
        (String::new(), 1),
        (format!("?start={}&end={}", now - 60, now + 60), 1),
        // The end second holds every millisecond of it: a sample taken in the second `now`
        // or a later one is outside `end=now-1` and inside `start=now`.
        (format!("?start={}", now), 1),
        (format!("?end={}", now - 1), 0),
        (format!("?start={}", now + 3600), 0),
        (format!("?start=0&end={}", i64::MAX), 1),
        (format!("?start={}&end={}", i64::MIN, i64::MIN), 0),
    ] {
        let r = metrics(&query).await.unwrap();
        assert_eq!(r.status().as_u16(), 200, "{query}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body.as_array().unwrap().len(), samples, "{query}: {body}");
    }
}

/// An upload as `root` (`username=root`) lands in root's home when its path is relative, as
/// envd resolves it (where the runtime has one uid, the upload is refused instead).
#[tokio::test]
async fn an_upload_as_root_resolves_against_roots_home() {
    let env = env().await;
    let (id, token) = env.create().await;
    let r = env
        .http
        .post(format!("{}/files?path=hello.txt&username=root", env.url))
        .header("E2b-Sandbox-Id", &id)
        .header("X-Access-Token", &token)
        .header("Content-Type", "application/octet-stream")
        .body("as root")
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let body: Value = r.json().await.unwrap();
    if !env.backend.capabilities().multiple_users {
        assert_ne!(status, 200, "{body}");
        return;
    }
    assert_eq!(status, 200, "{body}");
    assert_eq!(body[0]["path"], "/root/hello.txt", "{body}");
    let read = env
        .http
        .get(format!("{}/files?path=~/hello.txt&username=root", env.url))
        .header("E2b-Sandbox-Id", &id)
        .header("X-Access-Token", &token)
        .send()
        .await
        .unwrap();
    assert_eq!(read.text().await.unwrap(), "as root");
}

/// `X-Metadata-<key>` headers on an upload become the file's `user.e2b.<key>` attributes
/// (keys lowercased), which the upload's answer and `Stat` report; an upload without them
/// leaves none; metadata past envd's bound is a `400` and writes nothing.
#[tokio::test]
async fn upload_metadata_is_kept_as_attributes_and_bad_metadata_writes_nothing() {
    let env = env().await;
    let (id, token) = env.create().await;
    let upload = |path: &str, metadata: &[(&str, String)]| {
        let mut r = env
            .http
            .post(format!("{}/files?path={path}", env.url))
            .header("E2b-Sandbox-Id", &id)
            .header("X-Access-Token", &token)
            .header("Content-Type", "application/octet-stream");
        for (key, value) in metadata {
            r = r.header(format!("X-Metadata-{key}"), value.as_str());
        }
        r.body("x").send()
    };
    let stat = |path: &'static str| {
        env.envd("/filesystem.Filesystem/Stat", &id, &token)
            .header("Content-Type", "application/json")
            .json(&json!({ "path": path }))
            .send()
    };
    let r = upload("/home/user/meta.txt", &[("Origin", "wire".into())])
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body[0]["metadata"], json!({"origin": "wire"}), "{body}");
    let entry: Value = stat("/home/user/meta.txt")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        entry["entry"]["metadata"],
        json!({"origin": "wire"}),
        "{entry}"
    );
    let attributes = env
        .backend
        .stat(
            &id,
            "/home/user/meta.txt",
            sandcove::StatOptions::default().attributes(true),
        )
        .await
        .unwrap()
        .attributes;
    assert_eq!(
        attributes,
        Some([("user.e2b.origin".to_string(), b"wire".to_vec())].into())
    );
    // An upload without metadata leaves the file none (envd clears what it does not name).
    let r = upload("/home/user/meta.txt", &[]).await.unwrap();
    let body: Value = r.json().await.unwrap();
    assert!(body[0].get("metadata").is_none(), "{body}");
    let entry: Value = stat("/home/user/meta.txt")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(entry["entry"].get("metadata").is_none(), "{entry}");
    // Past envd's 4096 bytes: refused, nothing written.
    let r = upload("/home/user/big.txt", &[("Big", "v".repeat(4096))])
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let body: Value = r.json().await.unwrap();
    assert!(
        body["message"].as_str().unwrap().contains("metadata"),
        "{body}"
    );
    let err = env
        .backend
        .stat(&id, "/home/user/big.txt", Default::default())
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err}");
}

/// The engine with one fault injected: every snapshot's source fails to resume after it
/// (the runtime reports that in `SnapshotInfo::source_resume_error`; making a real agent fail
/// at that moment is not possible from a test).
#[derive(Debug)]
struct ResumeFails(Arc<LocalBackend>);

#[async_trait::async_trait]
impl sandcove::Layer for ResumeFails {
    fn inner(&self) -> &dyn Backend {
        &*self.0
    }

    async fn snapshot(
        &self,
        id: &str,
        options: sandcove::SnapshotOptions,
    ) -> sandcove::Result<sandcove::SnapshotInfo> {
        let mut taken = Backend::snapshot(&*self.0, id, options).await?;
        taken.source_resume_error = Some("injected: the agent is gone".into());
        Ok(taken)
    }
}

/// A snapshot whose sandbox could not be resumed after it is not a plain success: the SDK
/// gets an error naming the snapshot, which is kept and listed.
#[tokio::test]
async fn a_snapshot_whose_source_was_not_resumed_says_so_and_is_kept() {
    let state = PrivateState::new();
    let engine = Arc::new(LocalBackend::with_state_dir(&state.dir).expect("engine"));
    if !engine.ready().await.expect("ready").snapshots {
        eprintln!("LOUD SKIP: this engine has no snapshots");
        drop(engine);
        let _ = std::thread::spawn(move || drop(state)).join();
        return;
    }
    let app = e2b::wire::router(
        Arc::new(ResumeFails(engine.clone())),
        e2b::wire::WireConfig::new(KEY),
    );
    let (url, stop) = common::serve_in_process_with(app, common::test_limits()).await;
    let env = Env {
        url,
        http: reqwest::Client::new(),
        backend: engine,
        stop: Some(stop),
        state: Some(state),
    };
    let (id, _) = env.create().await;
    let r = env
        .http
        .post(format!("{}/sandboxes/{id}/snapshots", env.url))
        .header("X-API-KEY", KEY)
        .json(&json!({"name": "kept-anyway"}))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let body: Value = r.json().await.unwrap();
    assert!(status >= 400, "{status} {body}");
    let message = body["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("was made and is kept") && message.contains("injected"),
        "{body}"
    );
    let kept = env.backend.list_snapshots().await.expect("list");
    assert!(
        kept.iter()
            .any(|s| s.name.as_deref() == Some("kept-anyway")),
        "{kept:?}"
    );
    for s in kept {
        let _ = env.backend.delete_snapshot(&s.id).await;
    }
}

#[tokio::test]
async fn a_watcher_answers_only_its_own_sandbox() {
    let env = env().await;
    let (a, a_token) = env.create().await;
    let (b, b_token) = env.create().await;
    let r = env
        .envd("/filesystem.Filesystem/CreateWatcher", &a, &a_token)
        .json(&json!({"path": "/home/user", "recursive": false}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let id = r.json::<Value>().await.unwrap()["watcherId"]
        .as_str()
        .unwrap()
        .to_string();
    for path in [
        "/filesystem.Filesystem/GetWatcherEvents",
        "/filesystem.Filesystem/RemoveWatcher",
    ] {
        let r = env
            .envd(path, &b, &b_token)
            .json(&json!({ "watcherId": id }))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 404, "{path} from another sandbox");
        assert_eq!(r.json::<Value>().await.unwrap()["code"], "not_found");
    }
    // Still there for its own sandbox.
    let r = env
        .envd("/filesystem.Filesystem/GetWatcherEvents", &a, &a_token)
        .json(&json!({ "watcherId": id }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
}

/// One sandbox's token cannot fill the server's watchers: a watcher that overflows ends and
/// frees its inotify instance, but its events wait for a poll, so before a per-sandbox bound
/// one token made watcher after watcher until the server refused every other sandbox's.
#[tokio::test]
async fn one_sandbox_cannot_take_the_servers_watchers() {
    let env = env().await;
    let (a, a_token) = env.create().await;
    let (b, b_token) = env.create().await;
    let watch = |dir: String| {
        let (env, a, a_token) = (&env, a.clone(), a_token.clone());
        async move {
            let r = env
                .envd("/filesystem.Filesystem/CreateWatcher", &a, &a_token)
                .json(&json!({"path": dir, "recursive": false}))
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    // Each watcher gets more events than it keeps (never polled): it ends, its events stay.
    for i in 0..e2b::wire::MAX_WATCHERS_PER_SANDBOX {
        let dir = format!("/tmp/w{i}");
        let script = format!("mkdir -p {dir}");
        let (status, _, _) = env
            .stream(
                "/process.Process/Start",
                &a,
                &a_token,
                &start_message(&script, None),
                &[],
            )
            .await;
        assert_eq!(status, 200);
        // The previous watchers' inotify instances are freed as their tasks end.
        eventually(Duration::from_secs(30), "a watcher", || {
            let watch = watch(dir.clone());
            async move {
                match watch.await {
                    (200, _) => Ok(()),
                    (status, body) => Err(format!("{status}: {body}")),
                }
            }
        })
        .await;
        // A create and a remove per file: 12,000 events.
        let flood = format!("cd {dir} && for i in $(seq 6000); do : > f$i; done && rm f*");
        let (status, _, _) = env
            .stream(
                "/process.Process/Start",
                &a,
                &a_token,
                &start_message(&flood, None),
                &[],
            )
            .await;
        assert_eq!(status, 200);
    }
    let refused = eventually(Duration::from_secs(30), "the per-sandbox refusal", || {
        let watch = watch("/tmp".to_string());
        async move {
            match watch.await {
                (429, body) if body.contains("on this sandbox") => Ok(body),
                (200, _) => panic!(
                    "a watcher past the sandbox's {} was admitted",
                    e2b::wire::MAX_WATCHERS_PER_SANDBOX
                ),
                // Its inotify instances, until the ended watchers' tasks have let them go.
                (status, body) => Err(format!("{status}: {body}")),
            }
        }
    })
    .await;
    assert!(refused.contains("resource_exhausted"), "{refused}");
    let r = env
        .envd("/filesystem.Filesystem/CreateWatcher", &b, &b_token)
        .json(&json!({"path": "/tmp", "recursive": false}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "another sandbox still watches");
}

/// A code-interpreter call (`E2b-Sandbox-Port: 49999`) with the given credential headers.
fn interpreter(
    env: &Env,
    method: reqwest::Method,
    path: &str,
    id: &str,
    headers: &[(&str, &str)],
) -> reqwest::RequestBuilder {
    let mut req = env
        .http
        .request(method, format!("{}{path}", env.url))
        .header("E2b-Sandbox-Id", id)
        .header("E2b-Sandbox-Port", "49999");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req
}

/// The NDJSON lines of an `/execute` answer, strictly: each line one JSON object, the body
/// ending with a newline and `end_of_execution` last.
fn ndjson(body: &[u8]) -> Vec<Value> {
    let text = std::str::from_utf8(body).expect("UTF-8");
    assert!(text.ends_with('\n'), "{text:?}");
    let lines: Vec<Value> = text
        .trim_end_matches('\n')
        .split('\n')
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect();
    assert_eq!(lines.last().unwrap(), &json!({"type": "end_of_execution"}));
    lines
}

/// The traffic token of a sandbox made over the wire.
async fn traffic_token(env: &Env, id: &str) -> String {
    let r = env
        .http
        .get(format!("{}/sandboxes/{id}", env.url))
        .header("X-API-KEY", KEY)
        .send()
        .await
        .unwrap();
    let body: Value = r.json().await.unwrap();
    body["trafficAccessToken"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn code_interpreter_streams_ndjson_and_checks_tokens_first() {
    let env = env().await;
    let (id, token) = env.create().await;
    let (other, other_token) = env.create().await;
    let traffic = traffic_token(&env, &id).await;
    let other_traffic = traffic_token(&env, &other).await;
    assert_ne!(traffic, token);
    let pwn = json!({"code": "open('/home/user/pwned', 'w').write('x')"});
    for headers in [
        vec![],
        vec![("X-Access-Token", other_token.as_str())],
        vec![("E2B-Traffic-Access-Token", other_traffic.as_str())],
        // Each token only in its own header.
        vec![("X-Access-Token", traffic.as_str())],
        vec![("E2B-Traffic-Access-Token", token.as_str())],
        vec![("X-Access-Token", KEY)],
    ] {
        let r = interpreter(&env, reqwest::Method::POST, "/execute", &id, &headers)
            .json(&pwn)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 401, "{headers:?}");
        let r = interpreter(&env, reqwest::Method::POST, "/contexts", &id, &headers)
            .json(&json!({}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 401, "{headers:?}");
    }
    // The traffic token opens no envd call.
    let (status, _, _) = env
        .stream(
            "/process.Process/Start",
            &id,
            &traffic,
            &start_message("touch /home/user/pwned", None),
            &[],
        )
        .await;
    assert_eq!(status, 401);
    let err = env
        .backend
        .stat(&id, "/home/user/pwned", Default::default())
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err}");
    assert!(
        env.backend
            .list_processes(&id)
            .await
            .unwrap()
            .iter()
            .all(|p| p.tag.is_none()),
        "no interpreter was started"
    );

    // A cell: its lines, exactly.
    let auth = [("X-Access-Token", token.as_str())];
    let r = interpreter(&env, reqwest::Method::POST, "/execute", &id, &auth)
        .json(&json!({"code": "x = 41", "context_id": null, "language": null, "env_vars": null}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let lines = ndjson(&r.bytes().await.unwrap());
    assert_eq!(
        lines,
        vec![
            json!({"type": "number_of_executions", "execution_count": 1}),
            json!({"type": "end_of_execution"}),
        ]
    );
    let r = interpreter(&env, reqwest::Method::POST, "/execute", &id, &auth)
        .json(&json!({"code": "import os\nprint('hi')\nos.environ['V'] + str(x + 1)", "env_vars": {"V": "v"}}))
        .send()
        .await
        .unwrap();
    let mut lines = ndjson(&r.bytes().await.unwrap());
    let stdout = lines.remove(0);
    assert_eq!(stdout["type"], "stdout");
    assert_eq!(stdout["text"], "hi\n");
    assert!(stdout["timestamp"].as_i64().unwrap() > 0);
    assert_eq!(
        lines,
        vec![
            json!({"type": "result", "text": "'v42'", "is_main_result": true}),
            json!({"type": "number_of_executions", "execution_count": 2}),
            json!({"type": "end_of_execution"}),
        ]
    );
    let r = interpreter(&env, reqwest::Method::POST, "/execute", &id, &auth)
        .json(&json!({"code": "1/0"}))
        .send()
        .await
        .unwrap();
    let lines = ndjson(&r.bytes().await.unwrap());
    assert_eq!(lines[0]["type"], "error");
    assert_eq!(lines[0]["name"], "ZeroDivisionError");
    assert_eq!(lines[0]["value"], "division by zero");
    let traceback = lines[0]["traceback"].as_str().unwrap();
    assert!(traceback.contains("ZeroDivisionError"), "{traceback}");

    // Contexts with the traffic token alone, as the SDKs send them.
    let auth = [("E2B-Traffic-Access-Token", traffic.as_str())];
    let r = interpreter(&env, reqwest::Method::POST, "/contexts", &id, &auth)
        .json(&json!({"cwd": "/tmp"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let context: Value = r.json().await.unwrap();
    assert_eq!(context["language"], "python");
    assert_eq!(context["cwd"], "/tmp");
    let cid = context["id"].as_str().unwrap().to_string();
    let r = interpreter(&env, reqwest::Method::GET, "/contexts", &id, &auth)
        .send()
        .await
        .unwrap();
    let listed: Value = r.json().await.unwrap();
    assert!(listed
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["id"] == cid.as_str()));
    let path = format!("/contexts/{cid}");
    let r = interpreter(&env, reqwest::Method::DELETE, &path, &id, &auth)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 204);
    for method in [reqwest::Method::DELETE, reqwest::Method::POST] {
        let path = if method == reqwest::Method::POST {
            format!("/contexts/{cid}/restart")
        } else {
            format!("/contexts/{cid}")
        };
        let r = interpreter(&env, method, &path, &id, &auth)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 404, "{path}");
    }
    let r = interpreter(&env, reqwest::Method::POST, "/execute", &id, &auth)
        .json(&json!({"code": "1", "context_id": cid}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    // Bad input: another language (a refusal: 501, the SDKs' `SandboxException`), both
    // context and language, unknown fields, too big.
    for (body, status) in [
        (json!({"code": "1", "language": "r"}), 501),
        (
            json!({"code": "1", "language": "python", "context_id": "default"}),
            400,
        ),
        (json!({"code": "1", "surprise": true}), 400),
        (json!({"code": "x".repeat(2 * 1024 * 1024)}), 413),
    ] {
        let r = interpreter(&env, reqwest::Method::POST, "/execute", &id, &auth)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), status);
    }
}

#[tokio::test]
async fn a_client_that_leaves_interrupts_its_cell_and_the_context_lives_on() {
    let env = env().await;
    let (id, token) = env.create().await;
    let auth = [("X-Access-Token", token.as_str())];
    let run = |code: &str| {
        interpreter(&env, reqwest::Method::POST, "/execute", &id, &auth)
            .json(&json!({ "code": code }))
            .send()
    };
    let r = run("state = 'kept'").await.unwrap();
    ndjson(&r.bytes().await.unwrap());
    // The SDK's timeout: it closes the connection while the cell still runs.
    let r = run("import time\nprint('sleeping', flush=True)\ntime.sleep(600)")
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let mut r = r;
    let first = r.chunk().await.unwrap().expect("the first line");
    assert!(String::from_utf8_lossy(&first).contains("sleeping"));
    drop(r);
    // Without the interrupt the next cell would queue behind the 600 s sleep.
    let next = tokio::time::timeout(Duration::from_secs(60), async {
        let r = run("state").await.unwrap();
        ndjson(&r.bytes().await.unwrap())
    })
    .await
    .expect("the context runs again soon after its client left");
    assert!(
        next.contains(&json!({"type": "result", "text": "'kept'", "is_main_result": true})),
        "{next:?}"
    );
}

#[tokio::test]
async fn a_queued_client_that_leaves_does_not_interrupt_the_running_cell() {
    let env = env().await;
    let (id, token) = env.create().await;
    let auth = [("X-Access-Token", token.as_str())];
    let run = |code: &str| {
        interpreter(&env, reqwest::Method::POST, "/execute", &id, &auth)
            .json(&json!({ "code": code }))
            .send()
    };
    // A's cell runs (it said so), then B's request queues behind it and B leaves.
    let mut a = run("import time\nprint('a-started', flush=True)\ntime.sleep(3)\n'a-done'")
        .await
        .unwrap();
    let first = a.chunk().await.unwrap().expect("A's first line");
    assert!(String::from_utf8_lossy(&first).contains("a-started"));
    let b = tokio::time::timeout(Duration::from_millis(500), async {
        let mut r = run("'b'").await.unwrap();
        r.chunk().await.unwrap()
    })
    .await;
    assert!(b.is_err(), "B ran while A's cell was still running: {b:?}");
    // A's cell finishes undisturbed.
    let mut rest = first.to_vec();
    while let Some(chunk) = a.chunk().await.unwrap() {
        rest.extend_from_slice(&chunk);
    }
    let lines = ndjson(&rest);
    assert!(
        lines.contains(&json!({"type": "result", "text": "'a-done'", "is_main_result": true})),
        "{lines:?}"
    );
    assert!(lines.iter().all(|l| l["type"] != "error"), "{lines:?}");
}

/// Every gap the pinned SDKs can reach over the wire is refused with the facade's refusal
/// text (the alternative included) and the status or Connect code the SDKs raise as their own
/// `SandboxException`, and nothing happens: no sandbox, snapshot or file appears, the sandbox
/// is not paused.
#[tokio::test]
async fn gaps_are_refused_with_the_alternative_before_any_effect() {
    let env = env().await;
    let (id, token) = env.create().await;
    let snapshots_before = env.backend.list_snapshots().await.map(|s| s.len()).ok();
    let refused = |status: u16, body: &Value, what: &str| {
        assert_eq!(status, 501, "{what}: {body}");
        let message = body["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with("not supported on Sandcove: ") && message.contains("(instead: "),
            "{what}: {message}"
        );
    };
    // Control plane: creates with refused options, and the routes not served.
    for create in [
        json!({"templateID": "base", "mcp": {"exa": {"apiKey": "k"}}}),
        json!({"templateID": "base", "network": {"allowOut": ["example.com"]}}),
    ] {
        let r = env
            .http
            .post(format!("{}/v2/sandboxes", env.url))
            .header("X-API-KEY", KEY)
            .json(&create)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        refused(status, &r.json().await.unwrap(), &create.to_string());
    }
    // Not a gap where the engine runs images: a template it has not stored is E2B's 404.
    let r = env
        .http
        .post(format!("{}/v2/sandboxes", env.url))
        .header("X-API-KEY", KEY)
        .json(&json!({"templateID": "my-custom-template"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    let body: Value = r.json().await.unwrap();
    assert!(
        body["message"]
            .as_str()
            .unwrap_or_default()
            .starts_with("template 'my-custom-template' not found: "),
        "{body}"
    );
    let routes = [
        ("PUT", format!("/sandboxes/{id}/network")),
        ("GET", format!("/sandboxes/{id}/logs")),
        ("GET", format!("/v2/sandboxes/{id}/logs")),
        ("POST", format!("/sandboxes/{id}/refreshes")),
        ("GET", "/sandboxes/metrics".to_string()),
        ("POST", "/volumes".to_string()),
        ("POST", "/secrets".to_string()),
        ("GET", "/templates/aliases/gaps".to_string()),
        ("POST", "/v3/templates".to_string()),
    ];
    for (method, path) in &routes {
        let r = env
            .http
            .request(method.parse().unwrap(), format!("{}{path}", env.url))
            .header("X-API-KEY", KEY)
            .json(&json!({"memory": true, "count": 1, "denyOut": ["0.0.0.0/0"]}))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        refused(
            status,
            &r.json().await.unwrap(),
            &format!("{method} {path}"),
        );
    }
    // envd: a rename as another user is served (the engine acts as that user).
    let r = env
        .envd("/filesystem.Filesystem/Move", &id, &token)
        .header("Content-Type", "application/json")
        .header("Authorization", "Basic cm9vdDo=")
        .json(&json!({"source": "/tmp/no-such-gap", "destination": "/tmp/moved"}))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let body: Value = r.json().await.unwrap();
    if env.backend.capabilities().multiple_users {
        assert_ne!(
            body["code"], "unimplemented",
            "a rename as root is served: {body}"
        );
        assert_ne!(status, 501, "{body}");
    } else {
        // One uid (rootless): root is refused as for every file call, not as a rename gap.
        assert_eq!(body["code"], "unimplemented", "{body}");
        let message = body["message"].as_str().unwrap();
        assert!(message.contains("running as user"), "{body}");
        assert!(!message.contains("files.rename"), "{body}");
    }

    // No effect: only the one sandbox, running; no snapshot; no file; the home remains.
    let listed = env.backend.list(Default::default()).await.unwrap();
    assert_eq!(
        listed.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
        vec![id.as_str()]
    );
    assert_eq!(listed[0].state, sandcove::SandboxState::Running);
    assert_eq!(
        env.backend.list_snapshots().await.map(|s| s.len()).ok(),
        snapshots_before
    );
    env.backend
        .stat(&id, "/home/user", Default::default())
        .await
        .expect("the home directory is still there");
}

/// Envelopes of JSON messages, as a client-stream body.
fn enveloped(messages: &[Value]) -> Vec<u8> {
    let mut body = Vec::new();
    for m in messages {
        let payload = serde_json::to_vec(m).unwrap();
        body.push(0);
        body.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        body.extend_from_slice(&payload);
    }
    body
}

/// `process.Process/StreamInput` (client streaming, the Python SDK's `commands.stream_input`):
/// each data message reaches the process's stdin in order; the answer is one empty message
/// and the end of the stream. Input before a `start`, or a malformed body, is refused.
#[tokio::test]
async fn stream_input_writes_each_message_to_stdin() {
    let env = env().await;
    let (id, token) = env.create().await;
    let b64 = base64::engine::general_purpose::STANDARD;
    let start = json!({
        "process": {"cmd": "/bin/bash", "args": ["-l", "-c", "head -c 11"]},
        "stdin": true,
        "tag": "reader",
    });
    let run = env.stream("/process.Process/Start", &id, &token, &start, &[]);
    let feed = async {
        let pid = eventually(Duration::from_secs(30), "the reader runs", || async {
            let listed = env
                .backend
                .list_processes(&id)
                .await
                .map_err(|e| e.to_string())?;
            listed
                .iter()
                .find(|p| p.tag.as_deref() == Some("reader"))
                .map(|p| p.pid)
                .ok_or_else(|| "not yet".to_string())
        })
        .await;
        let body = enveloped(&[
            json!({"start": {"process": {"pid": pid}}}),
            json!({"data": {"input": {"stdin": b64.encode("hello ")}}}),
            json!({"keepalive": {}}),
            json!({"data": {"input": {"stdin": b64.encode("world")}}}),
        ]);
        let r = env
            .envd("/process.Process/StreamInput", &id, &token)
            .header("Content-Type", "application/connect+json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
        let answer = r.bytes().await.unwrap();
        assert_eq!(
            envelopes(&answer),
            vec![(0, json!({})), (2, json!({}))],
            "one empty message, then the end"
        );
    };
    let ((status, _, body), ()) = tokio::join!(run, feed);
    assert_eq!(status, 200);
    let mut stdout = Vec::new();
    for (_, v) in envelopes(&body) {
        if let Some(s) = v["event"]["data"]["stdout"].as_str() {
            stdout.extend(b64.decode(s).unwrap());
        }
    }
    assert_eq!(stdout, b"hello world");

    // Data before any start, and a body cut inside an envelope: errors ending the stream.
    for body in [
        enveloped(&[json!({"data": {"input": {"stdin": b64.encode("x")}}})]),
        enveloped(&[json!({"start": {"process": {"pid": 1}}})])[..7].to_vec(),
    ] {
        let r = env
            .envd("/process.Process/StreamInput", &id, &token)
            .header("Content-Type", "application/connect+json")
            .body(body)
            .send()
            .await
            .unwrap();
        let answer = r.bytes().await.unwrap();
        let all = envelopes(&answer);
        assert_eq!(all.len(), 1, "{all:?}");
        assert_eq!(all[0].1["error"]["code"], "invalid_argument", "{all:?}");
    }
}

fn gzip(data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

/// Uploads sent with `Content-Encoding: gzip` (the SDKs' `files.write(..., gzip=True)`) are
/// decoded, as octet-stream and as multipart; a gzip bomb stops at the same bound as a plain
/// upload, and nothing of it is kept.
#[tokio::test]
async fn gzip_uploads_are_decoded_within_the_upload_bound() {
    let mut config = e2b::wire::WireConfig::new(KEY);
    config.max_upload_bytes = 1024 * 1024;
    config.max_multipart_bytes = 1024 * 1024;
    let env = env_with(config).await;
    let (id, token) = env.create().await;
    let upload = |path: &str, content_type: &str, body: Vec<u8>| {
        env.http
            .post(format!("{}/files?path={path}", env.url))
            .header("E2b-Sandbox-Id", &id)
            .header("X-Access-Token", &token)
            .header("Content-Type", content_type.to_string())
            .header("Content-Encoding", "gzip")
            .body(body)
            .send()
    };
    let text = b"compressed on the way in\n".repeat(100);
    let r = upload("/home/user/a.txt", "application/octet-stream", gzip(&text))
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap());
    let mut form = b"--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/home/user/b.txt\"\r\n\r\n".to_vec();
    form.extend_from_slice(&text);
    form.extend_from_slice(b"\r\n--B--\r\n");
    let r = upload(
        "/home/user/b.txt",
        "multipart/form-data; boundary=B",
        gzip(&form),
    )
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap());
    for path in ["/home/user/a.txt", "/home/user/b.txt"] {
        let read = env
            .http
            .get(format!("{}/files?path={path}", env.url))
            .header("E2b-Sandbox-Id", &id)
            .header("X-Access-Token", &token)
            .send()
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        assert_eq!(read.as_ref(), text.as_slice(), "{path}");
    }
    // 8 MiB of zeros packs into a few KiB: over the 1 MiB bound once decoded, both ways.
    let bomb = gzip(&vec![0u8; 8 * 1024 * 1024]);
    assert!(bomb.len() < 64 * 1024);
    let mut form_bomb =
        b"--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"bomb2\"\r\n\r\n"
            .to_vec();
    form_bomb.extend_from_slice(&vec![0u8; 8 * 1024 * 1024]);
    form_bomb.extend_from_slice(b"\r\n--B--\r\n");
    let form_bomb = gzip(&form_bomb);
    assert!(form_bomb.len() < 64 * 1024);
    for (path, content_type, bomb) in [
        ("/home/user/bomb1", "application/octet-stream", bomb),
        (
            "/home/user/bomb2",
            "multipart/form-data; boundary=B",
            form_bomb,
        ),
    ] {
        let r = upload(path, content_type, bomb).await.unwrap();
        let status = r.status().as_u16();
        let body = r.text().await.unwrap();
        assert_eq!(status, 400, "{path}: {body}");
        assert!(body.contains("larger than 1048576 bytes"), "{path}: {body}");
        let err = env
            .backend
            .stat(&id, path, Default::default())
            .await
            .unwrap_err();
        assert!(err.is_not_found(), "{path}: {err}");
    }
    // A truncated gzip body is refused, not written in part.
    let cut = gzip(&text);
    let r = upload(
        "/home/user/cut",
        "application/octet-stream",
        cut[..cut.len() - 8].to_vec(),
    )
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let err = env
        .backend
        .stat(&id, "/home/user/cut", Default::default())
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err}");
}

/// E2B's v1 file-URL signature, computed as the SDKs do (`e2b/sandbox/signature.py`).
fn sdk_signature(path: &str, operation: &str, token: &str, expiration: Option<u64>) -> String {
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

/// `download_url`/`upload_url`: with `E2B_SANDBOX_URL` set, the SDKs build
/// `<listener>/files?path=…&signature=…[&signature_expiration=…]`, fetched without any header.
/// The listener finds the sandbox whose token makes that signature; another operation, path
/// or sandbox, a damaged or expired signature, and no signature at all are refused before
/// anything is read or written.
#[tokio::test]
async fn signed_file_urls_reach_their_sandbox_only() {
    let env = env().await;
    let (id, token) = env.create().await;
    let (_, other_token) = env.create().await;
    let path = "/home/user/signed.txt";
    let url = |op: &str, token: &str, expiration: Option<u64>| {
        let mut u = format!(
            "{}/files?path={}&signature={}",
            env.url,
            path.replace('/', "%2F"),
            sdk_signature(path, op, token, expiration)
                .replace('+', "%2B")
                .replace('/', "%2F")
        );
        if let Some(e) = expiration {
            u.push_str(&format!("&signature_expiration={e}"));
        }
        u
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let form = |data: &str| {
        format!(
            "--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f\"\r\n\r\n{data}\r\n--B--\r\n"
        )
    };
    let post = |u: String, data: &str| {
        env.http
            .post(u)
            .header("Content-Type", "multipart/form-data; boundary=B")
            .body(form(data))
            .send()
    };
    // Refused: a read signature used to write, an expired one, a damaged one, none.
    let good = url("write", &token, None);
    let last = if good.ends_with('A') { 'B' } else { 'A' };
    let damaged = format!("{}{last}", &good[..good.len() - 1]);
    for u in [
        url("read", &token, None),
        url("write", &token, Some(now - 10)),
        damaged,
        format!("{}/files?path={}", env.url, path.replace('/', "%2F")),
    ] {
        let r = post(u.clone(), "pwned").await.unwrap();
        let status = r.status().as_u16();
        assert_eq!(status, 401, "{u}: {}", r.text().await.unwrap());
    }
    let err = env
        .backend
        .stat(&id, path, Default::default())
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "nothing written: {err}");
    // Accepted: the upload URL, then the download URL (one with a future expiration).
    let r = post(url("write", &token, None), "signed upload")
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap());
    for u in [
        url("read", &token, None),
        url("read", &token, Some(now + 600)),
    ] {
        let r = env.http.get(&u).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 200, "{u}");
        assert_eq!(r.text().await.unwrap(), "signed upload");
    }
    // Another sandbox's URLs for the same path reach that sandbox, never this one.
    let r = env
        .http
        .get(url("read", &other_token, None))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status().as_u16(),
        404,
        "the other sandbox has no such file"
    );
    let r = post(url("write", &other_token, None), "other")
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let r = env
        .http
        .get(url("read", &token, None))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.text().await.unwrap(),
        "signed upload",
        "this sandbox's file is unchanged"
    );
}

/// `get_host(port)`: the control plane's `domain` is the listener (`localhost:<port>` for a
/// loopback listener), so the SDKs' `{port}-{id}.{domain}` names it; a request carrying that
/// host reaches the port inside that sandbox through the engine's preview. Another sandbox's
/// id or a port nothing serves gets a 502, never another sandbox's server.
#[tokio::test]
async fn get_host_names_the_listener_and_reaches_the_sandbox_port() {
    let env = env().await;
    let r = env
        .http
        .post(format!("{}/v2/sandboxes", env.url))
        .header("X-API-KEY", KEY)
        .json(&json!({"templateID": "base"}))
        .send()
        .await
        .unwrap();
    let body: Value = r.json().await.unwrap();
    let id = body["sandboxID"].as_str().unwrap().to_string();
    let listener_port = env.url.rsplit(':').next().unwrap().to_string();
    assert_eq!(body["domain"], json!(format!("localhost:{listener_port}")));
    let (other, _) = env.create().await;
    let spec = sandcove::ProcessSpec::new(sandcove::Command::sh(
        "mkdir -p /tmp/site && echo served-from-the-sandbox > /tmp/site/index.html && \
         exec python3 -m http.server 8123 --bind 127.0.0.1 --directory /tmp/site",
    ));
    let _server = env
        .backend
        .spawn(&id, spec)
        .await
        .expect("start the server");
    let get = |host: String| {
        env.http
            .get(format!("{}/index.html", env.url))
            .header("Host", host)
            .send()
    };
    let text = eventually(
        Duration::from_secs(30),
        "the sandbox's server answers",
        || async {
            let r = get(format!("8123-{id}.localhost:{listener_port}"))
                .await
                .map_err(|e| e.to_string())?;
            if r.status().as_u16() != 200 {
                return Err(format!("status {}", r.status()));
            }
            r.text().await.map_err(|e| e.to_string())
        },
    )
    .await;
    assert_eq!(text, "served-from-the-sandbox\n");
    for host in [
        format!("8123-{other}.localhost:{listener_port}"),
        format!("8124-{id}.localhost:{listener_port}"),
        format!("8123-nosuchsandbox.localhost:{listener_port}"),
    ] {
        let r = get(host.clone()).await.unwrap();
        assert_eq!(r.status().as_u16(), 502, "{host}");
    }
}

/// Switch a raw connection to `addr` to the test's `echo` protocol with `Host: host`; the
/// `101` head, or why not.
async fn upgrade_echo(addr: &str, host: &str) -> Result<tokio::net::TcpStream, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let request =
        format!("GET /ws HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n");
    conn.write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        match conn.read(&mut byte).await {
            Ok(1) => head.push(byte[0]),
            other => return Err(format!("head cut ({other:?}): {head:?}")),
        }
        if head.len() > 16 * 1024 {
            return Err("head too long".into());
        }
    }
    if !head.starts_with(b"HTTP/1.1 101 ") {
        return Err(String::from_utf8_lossy(&head).into_owned());
    }
    Ok(conn)
}

/// `get_host(port)` carries protocol upgrades too (a WebSocket to a server in the sandbox):
/// the Upgrade request reaches the sandbox's port, its `101` comes back, and then bytes flow
/// both ways between the client and the sandbox's server.
#[tokio::test]
async fn get_host_forwards_an_upgraded_connection() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let env = env().await;
    let (id, _) = env.create().await;
    // Answers an `Upgrade: echo` request with `101`, then sends back every byte upper-cased.
    let script = r#"
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 8130))
s.listen(8)
while True:
    c, _ = s.accept()
    head = b""
    while b"\r\n\r\n" not in head:
        d = c.recv(1024)
        if not d:
            break
        head += d
    if b"upgrade: echo" not in head.lower():
        c.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        c.close()
        continue
    c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
    rest = head.split(b"\r\n\r\n", 1)[1]
    while True:
        if rest:
            c.sendall(rest.upper())
        rest = c.recv(4096)
        if not rest:
            break
    c.close()
"#;
    let spec = sandcove::ProcessSpec::new(sandcove::Command::sh(format!(
        "cat > /tmp/echo.py <<'PY'\n{script}\nPY\nexec python3 /tmp/echo.py"
    )));
    let _server = env
        .backend
        .spawn(&id, spec)
        .await
        .expect("start the server");
    let addr = env.url.trim_start_matches("http://").to_string();
    let listener_port = env.url.rsplit(':').next().unwrap().to_string();
    let host = format!("8130-{id}.localhost:{listener_port}");
    let mut conn = eventually(
        Duration::from_secs(30),
        "the sandbox's server switches protocols",
        || upgrade_echo(&addr, &host),
    )
    .await;
    for message in [&b"hello"[..], b"through the splice"] {
        conn.write_all(message).await.unwrap();
        let mut back = vec![0u8; message.len()];
        tokio::time::timeout(Duration::from_secs(30), conn.read_exact(&mut back))
            .await
            .expect("the sandbox answers")
            .unwrap();
        assert_eq!(back, message.to_ascii_uppercase());
    }
    // The sandbox's server ends the connection when the client ends its side.
    conn.shutdown().await.unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), conn.read_to_end(&mut rest))
        .await
        .expect("closed after the client's end")
        .unwrap();
    assert!(rest.is_empty(), "{rest:?}");
}

/// A server on port 8141 whose answers a path chooses: `/silent` reads the request and never
/// answers, `/stalled` sends a head announcing 1000 bytes and 4 of them, then nothing,
/// `/slow` answers after 0.5 s and sends 10 000 bytes in ten pieces 0.3 s apart, anything
/// else is `ok`.
const SLOW_SERVER: &str = r#"
import socket, threading, time
def serve(c):
    head = b""
    while b"\r\n\r\n" not in head:
        more = c.recv(4096)
        if not more:
            return
        head += more
    path = head.split(b" ")[1]
    try:
        if path.startswith(b"/silent"):
            while c.recv(4096):
                pass
        elif path.startswith(b"/stalled"):
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\npart")
            while c.recv(4096):
                pass
        elif path.startswith(b"/slow"):
            time.sleep(0.5)
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 10000\r\nConnection: close\r\n\r\n")
            for i in range(10):
                time.sleep(0.3)
                c.sendall((b"%d" % i) * 1000)
        else:
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
    except OSError:
        pass
    c.close()
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 8141))
s.listen(64)
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;

/// A sandbox created over the wire running [`SLOW_SERVER`], answering through `get_host`;
/// its id and the `Host` that reaches its port.
async fn slow_server(env: &Env) -> (String, String) {
    let (id, _) = env.create().await;
    let spec = sandcove::ProcessSpec::new(sandcove::Command::sh(format!(
        "cat > /tmp/slow.py <<'PY'\n{SLOW_SERVER}\nPY\nexec python3 /tmp/slow.py"
    )));
    drop(
        env.backend
            .spawn(&id, spec)
            .await
            .expect("start the server"),
    );
    let listener_port = env.url.rsplit(':').next().unwrap().to_string();
    let host = format!("8141-{id}.localhost:{listener_port}");
    eventually(
        Duration::from_secs(30),
        "the sandbox's server answers",
        || {
            let get = env.host_get(&host, "/ready");
            async move {
                let r = get.send().await.map_err(|e| e.to_string())?;
                let status = r.status().as_u16();
                // Read whole: a forwarded request holds its place in the sandbox's cap until
                // its answer's body is out, which may come after its head.
                r.text().await.map_err(|e| e.to_string())?;
                match status {
                    200 => Ok(()),
                    s => Err(format!("status {s}")),
                }
            }
        },
    )
    .await;
    (id, host)
}

impl Env {
    /// `GET path` through `get_host`'s `host`, given up after 30 s.
    fn host_get(&self, host: &str, path: &str) -> reqwest::RequestBuilder {
        self.http
            .get(format!("{}{path}", self.url))
            .header("Host", host)
            .timeout(Duration::from_secs(30))
    }
}

/// Limits with `answer` for the head of a forwarded answer and between its body's bytes.
fn forwarding_limits(
    answer: Duration,
    max_connections: usize,
) -> sandcove::server::ConnectionLimits {
    let mut limits = common::test_limits();
    limits.upstream_answer_timeout = answer;
    limits.body_idle_timeout = answer;
    limits.max_connections = max_connections;
    limits
}

/// Finding: a request through `get_host` (which needs no credential) waited for the
/// sandbox's answer without a bound, so a port that never answered held the listener's
/// connections for ever. Now each gets `504` after the listener's answer bound; with a cap
/// of 4 connections, 4 such requests at once are all answered and the listener serves the
/// next request.
#[tokio::test]
async fn get_host_answers_504_when_the_sandbox_port_stays_silent() {
    let env = env_limited(
        e2b::wire::WireConfig::new(KEY),
        forwarding_limits(Duration::from_secs(2), 4),
    )
    .await;
    let (_, host) = slow_server(&env).await;
    let silent: Vec<_> = (0..4)
        .map(|_| {
            let get = env.host_get(&host, "/silent");
            tokio::spawn(async move {
                let r = get.send().await.map_err(|e| e.to_string())?;
                Ok::<_, String>((r.status().as_u16(), r.text().await.unwrap_or_default()))
            })
        })
        .collect();
    for request in silent {
        let (status, text) = request.await.unwrap().expect("answered, not left waiting");
        assert_eq!(status, 504, "{text}");
        assert!(text.contains("did not answer within 2000 ms"), "{text}");
    }
    let r = env.host_get(&host, "/after").send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.text().await.unwrap(), "ok");
}

/// Finding: once a head was in, a forwarded answer whose body stopped coming held the
/// client's connection for ever. Now it is cut after the body idle bound; an answer that is
/// slow (its head after 0.5 s, its body over 3 s, more than the bound) but keeps coming is
/// delivered whole.
#[tokio::test]
async fn get_host_cuts_a_stalled_answer_and_delivers_a_slow_one() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let env = env_limited(
        e2b::wire::WireConfig::new(KEY),
        forwarding_limits(Duration::from_secs(2), 16),
    )
    .await;
    let (_, host) = slow_server(&env).await;
    let addr = env.url.trim_start_matches("http://").to_string();
    let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
    conn.write_all(format!("GET /stalled HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut got = Vec::new();
    let ended = tokio::time::timeout(Duration::from_secs(30), async {
        let mut buf = [0u8; 4096];
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    let text = String::from_utf8_lossy(&got).into_owned();
    assert!(ended.is_ok(), "the client's connection is closed: {text:?}");
    assert!(text.starts_with("HTTP/1.1 200"), "{text:?}");
    assert!(text.ends_with("\r\n\r\npart"), "only what came: {text:?}");

    let r = env.host_get(&host, "/slow").send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let body = r.bytes().await.expect("the whole body");
    let expected: Vec<u8> = (0..10u8).flat_map(|i| vec![b'0' + i; 1000]).collect();
    assert_eq!(body.len(), expected.len());
    assert!(body[..] == expected[..], "the body arrived unchanged");
}

/// Finding: every connection of the listener's cap could be spent on one sandbox through
/// `get_host` by anyone knowing its id. Requests to one sandbox's ports running at once are
/// capped (`max_host_requests_per_sandbox`): one more gets `503` with `Retry-After`, and the
/// slot is back once the request running ends.
#[tokio::test]
async fn get_host_requests_per_sandbox_are_capped() {
    let mut config = e2b::wire::WireConfig::new(KEY);
    config.max_host_requests_per_sandbox = 1;
    let env = env_with(config).await;
    let (_, host) = slow_server(&env).await;
    let (http, silent) = (env.http.clone(), format!("{}/silent", env.url));
    let silent_host = host.clone();
    let holding = tokio::spawn(async move {
        // Sent again while a probe below has the sandbox's one place: which of two requests
        // reaches the listener first is not up to the test.
        loop {
            let sent = http
                .get(&silent)
                .header("Host", &silent_host)
                .timeout(Duration::from_secs(30))
                .send()
                .await;
            if !matches!(&sent, Ok(r) if r.status().as_u16() == 503) {
                return sent;
            }
        }
    });
    let retry_after = eventually(
        Duration::from_secs(30),
        "a second request is refused while the first runs",
        || {
            let get = env
                .host_get(&host, "/second")
                .timeout(Duration::from_secs(5));
            async move {
                let r = get.send().await.map_err(|e| e.to_string())?;
                if r.status().as_u16() != 503 {
                    return Err(format!("status {}", r.status()));
                }
                Ok(r.headers()
                    .get("retry-after")
                    .map(|v| v.to_str().unwrap().to_string()))
            }
        },
    )
    .await;
    assert_eq!(retry_after.as_deref(), Some("1"));
    holding.abort();
    eventually(
        Duration::from_secs(30),
        "the slot is back once the first request ends",
        || {
            let get = env
                .host_get(&host, "/third")
                .timeout(Duration::from_secs(5));
            async move {
                let r = get.send().await.map_err(|e| e.to_string())?;
                match r.status().as_u16() {
                    200 => Ok(()),
                    s => Err(format!("status {s}")),
                }
            }
        },
    )
    .await;
}

/// Snapshots and fork answer as E2B's API does: `201 {"snapshotID", "names"}`, a paged
/// `GET /snapshots` (`x-next-token`), `DELETE /templates/{id}` `204` then `404`, a fork
/// `201 [{"sandbox": …}]` per fork whose sandboxes hold the source's files; a bad count is
/// `400` and a missing source `404`, before any effect; other `/templates` calls stay refused.
#[tokio::test]
async fn snapshots_and_fork_answer_as_e2b_does() {
    let env = env().await;
    let (id, _) = env.create().await;
    let bytes: sandcove::ByteStream = Box::pin(futures::stream::iter([Ok(b"kept".to_vec())]));
    env.backend
        .write_file(&id, "/home/user/state.txt", bytes, Default::default())
        .await
        .unwrap();
    let call = |method: &str, path: String, body: Value| {
        env.http
            .request(method.parse().unwrap(), format!("{}{path}", env.url))
            .header("X-API-KEY", KEY)
            .json(&body)
    };
    let mut taken = Vec::new();
    for name in ["first", "second"] {
        let r = call(
            "POST",
            format!("/sandboxes/{id}/snapshots"),
            json!({"name": name}),
        )
        .send()
        .await
        .unwrap();
        assert_eq!(r.status().as_u16(), 201);
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["names"], json!([name]), "{body}");
        taken.push(body["snapshotID"].as_str().unwrap().to_string());
    }
    let r = call(
        "POST",
        "/sandboxes/no-such-sandbox/snapshots".into(),
        json!({}),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    // Paged newest first, one per page.
    let r = call(
        "GET",
        format!("/snapshots?sandboxID={id}&limit=1"),
        Value::Null,
    )
    .send()
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let next = r.headers()["x-next-token"].to_str().unwrap().to_string();
    let page: Value = r.json().await.unwrap();
    assert_eq!(page.as_array().unwrap().len(), 1, "{page}");
    let r = call(
        "GET",
        format!("/snapshots?sandboxID={id}&limit=1&nextToken={next}"),
        Value::Null,
    )
    .send()
    .await
    .unwrap();
    assert!(r.headers().get("x-next-token").is_none());
    let second: Value = r.json().await.unwrap();
    let mut seen = vec![
        page[0]["snapshotID"].as_str().unwrap().to_string(),
        second[0]["snapshotID"].as_str().unwrap().to_string(),
    ];
    seen.sort();
    let mut expected = taken.clone();
    expected.sort();
    assert_eq!(seen, expected);

    // Fork: a bad count and a missing source change nothing.
    let before = env.backend.list(Default::default()).await.unwrap().len();
    let r = call("POST", format!("/sandboxes/{id}/fork"), json!({"count": 0}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let r = call(
        "POST",
        "/sandboxes/no-such-sandbox/fork".into(),
        json!({"count": 1}),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    assert_eq!(
        env.backend.list(Default::default()).await.unwrap().len(),
        before
    );
    let r = call(
        "POST",
        format!("/sandboxes/{id}/fork"),
        json!({"count": 2, "timeout": 60}),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let forks: Value = r.json().await.unwrap();
    let forks = forks.as_array().unwrap();
    assert_eq!(forks.len(), 2, "{forks:?}");
    for fork in forks {
        let sandbox = &fork["sandbox"];
        assert!(fork.get("error").is_none(), "{fork}");
        assert!(sandbox["envdAccessToken"].is_string(), "{fork}");
        let fork_id = sandbox["sandboxID"].as_str().unwrap();
        assert_ne!(fork_id, id);
        let read = sandcove_conformance::names_in(&*env.backend, fork_id, "/home/user").await;
        assert!(read.contains(&"state.txt".to_string()), "{read:?}");
        env.backend.destroy(fork_id).await.unwrap();
    }

    // Delete: 204, then 404; the template-build API stays refused.
    for (status, snapshot) in [(204, &taken[0]), (404, &taken[0]), (204, &taken[1])] {
        let r = call("DELETE", format!("/templates/{snapshot}"), Value::Null)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), status, "DELETE {snapshot}");
    }
    for method in ["GET", "PATCH"] {
        let r = call(method, "/templates/some-template".into(), Value::Null)
            .send()
            .await
            .unwrap();
        assert_eq!(
            r.status().as_u16(),
            501,
            "{method} /templates/some-template"
        );
    }
}

/// Finding (as on the Blaxel listener): a refused request answered before its body was read
/// closed a connection its client was reusing. Each refusal (no key, a wrong key, a gap, a
/// path outside the API, an envd call with a bad token) is sent head first, its body after;
/// every answer, and a next request's, arrives on the one connection.
#[tokio::test]
async fn refused_requests_keep_a_reused_connection() {
    let env = env().await;
    let auth = format!("X-API-KEY: {KEY}\r\n");
    common::refusals_keep_the_connection(
        &env.url,
        &[
            ("POST", "/sandboxes", "", 401),
            ("POST", "/sandboxes", "X-API-KEY: wrong\r\n", 401),
            ("POST", "/volumes", auth.as_str(), 501),
            ("POST", "/elsewhere", auth.as_str(), 404),
            (
                "POST",
                "/process.Process/Start",
                "E2b-Sandbox-Id: nobody\r\nX-Access-Token: wrong\r\nConnect-Protocol-Version: 1\r\n",
                401,
            ),
        ],
        ("GET", "/sandboxes", auth.as_str(), 200),
    )
    .await;
    common::an_oversized_refused_body_closes_cleanly(&env.url, "POST", "/sandboxes", "", 401).await;
}

/// The server's policy (`sandcove serve --max-sandboxes`, `--allow-host-network`) is applied
/// to the backend under this listener too: a create past the cap is E2B's 403 (the SDKs'
/// `SandboxException` with the message), so is each fork past it, and nothing is made. (E2B's
/// wire cannot ask for the host's network: no create body field maps to it.)
#[tokio::test]
async fn the_servers_policy_refuses_with_e2bs_403() {
    let state = PrivateState::new();
    let backend = Arc::new(LocalBackend::with_state_dir(&state.dir).expect("engine"));
    let mut policy = sandcove::server::ServerPolicy::default();
    policy.max_sandboxes = 1;
    let governed = Arc::new(sandcove::server::PolicyBackend::new(
        backend.clone(),
        policy,
    ));
    let app = e2b::wire::router(governed, e2b::wire::WireConfig::new(KEY));
    let (url, stop) = common::serve_in_process(app).await;
    let env = Env {
        url,
        http: reqwest::Client::new(),
        backend,
        stop: Some(stop),
        state: Some(state),
    };
    let (id, _) = env.create().await;
    let r = env
        .http
        .post(format!("{}/v2/sandboxes", env.url))
        .header("X-API-KEY", KEY)
        .json(&json!({"templateID": "base"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 403);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["code"], json!(403), "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("limit of 1 live sandboxes"),
        "{body}"
    );
    let r = env
        .http
        .post(format!("{}/sandboxes/{id}/fork", env.url))
        .header("X-API-KEY", KEY)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    let forks: Value = r.json().await.unwrap();
    assert_eq!(forks[0]["error"]["code"], json!(403), "{forks}");
    assert_eq!(env.backend.list(Default::default()).await.unwrap().len(), 1);
}

/// E2B's v1 file-URL signature for `user` (the SDKs sign `path:operation:user:token`).
fn user_signature(path: &str, operation: &str, user: &str, token: &str) -> String {
    let raw = format!("{path}:{operation}:{user}:{token}");
    let digest = ring::digest::digest(&ring::digest::SHA256, raw.as_bytes());
    format!(
        "v1_{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest.as_ref())
    )
}

/// Finding: a signed E2B upload URL for one path wrote any path: a multipart body with two
/// file parts wrote /home/user/.bashrc and /tmp/evil.sh. A signed upload now carries exactly
/// one file, written to the signed path as the signed user: a second file part, or a part
/// whose filename names another path, is E2B's 403 before anything is written.
#[tokio::test]
async fn a_signed_upload_url_writes_its_one_path_only() {
    let env = env().await;
    let (id, token) = env.create().await;
    let signed = "/home/user/up.txt";
    let url = |user: &str| {
        let mut u = format!(
            "{}/files?path={}&signature={}",
            env.url,
            signed.replace('/', "%2F"),
            user_signature(signed, "write", user, &token)
                .replace('+', "%2B")
                .replace('/', "%2F")
        );
        if !user.is_empty() {
            u.push_str(&format!("&username={user}"));
        }
        u
    };
    let part = |name: &str, filename: Option<&str>, data: &str| {
        match filename {
        Some(f) => format!(
            "--B\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{f}\"\r\n\r\n{data}\r\n"
        ),
        None => format!("--B\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{data}\r\n"),
    }
    };
    let post = |u: String, body: String| {
        env.http
            .post(u)
            .header("Content-Type", "multipart/form-data; boundary=B")
            .body(format!("{body}--B--\r\n"))
            .send()
    };
    let absent = |path: &'static str| {
        let backend = env.backend.clone();
        let id = id.clone();
        async move {
            let err = backend
                .stat(&id, path, Default::default())
                .await
                .unwrap_err();
            assert!(err.is_not_found(), "{path} was written: {err}");
        }
    };
    // The finding's body: two file parts naming two other paths.
    let two = part("file", Some("/home/user/.bashrc"), "echo pwned")
        + &part("file", Some("/tmp/evil.sh"), "echo pwned");
    let r = post(url(""), two).await.unwrap();
    assert_eq!(r.status().as_u16(), 403);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["code"], json!(403), "{body}");
    // Two file parts with harmless names: refused all the same, the first not kept.
    let r = post(
        url(""),
        part("file", Some("a.txt"), "first") + &part("file", Some("b.txt"), "second"),
    )
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 403);
    // One file part naming another path.
    let r = post(url(""), part("file", Some("/tmp/evil.sh"), "echo pwned"))
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 403);
    absent("/tmp/evil.sh").await;
    absent(signed).await;
    let bashrc = env
        .backend
        .stat(&id, "/home/user/.bashrc", Default::default())
        .await;
    assert!(
        bashrc.is_err() || bashrc.unwrap().size != 10,
        "/home/user/.bashrc was not replaced"
    );
    // What the URL is for: one file (other fields read past), at the signed path.
    let r = post(
        url(""),
        part("note", None, "ignored") + &part("file", Some("up.txt"), "signed upload"),
    )
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap());
    let stat = env
        .backend
        .stat(&id, signed, Default::default())
        .await
        .unwrap();
    assert_eq!(stat.size, "signed upload".len() as u64);
}

/// A signed upload URL writes as the user it was signed for: one signed for a user the
/// sandbox does not have writes nothing; the same URL signed without a user writes.
#[tokio::test]
async fn a_signed_upload_url_writes_as_its_signed_user() {
    let env = env().await;
    let (id, token) = env.create().await;
    let signed = "/tmp/signed-user.txt";
    let post = |user: &str| {
        let mut u = format!(
            "{}/files?path={}&signature={}",
            env.url,
            signed.replace('/', "%2F"),
            user_signature(signed, "write", user, &token)
                .replace('+', "%2B")
                .replace('/', "%2F")
        );
        if !user.is_empty() {
            u.push_str(&format!("&username={user}"));
        }
        env.http
            .post(u)
            .header("Content-Type", "multipart/form-data; boundary=B")
            .body("--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"up.txt\"\r\n\r\nhi\r\n--B--\r\n")
            .send()
    };
    let r = post("no-such-user").await.unwrap();
    assert_ne!(r.status().as_u16(), 200, "{}", r.text().await.unwrap());
    assert!(env
        .backend
        .stat(&id, signed, Default::default())
        .await
        .is_err());
    let r = post("").await.unwrap();
    assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap());
    assert!(env
        .backend
        .stat(&id, signed, Default::default())
        .await
        .is_ok());
}

/// A signed URL's upload and download move their bytes through the core's signed file
/// transfer (`sandcove::file_url::transfer`), the one every signed file URL goes through:
/// its bound on a raw upload (past the listener's largest upload, the core's refusal, which
/// names the URL's bound, and nothing written) holds over E2B's wire too, and what envd adds
/// around the transfer stays: a gzip-encoded body, `X-Metadata-*`, E2B's entry list.
#[tokio::test]
async fn signed_transfers_go_through_the_core_transfer() {
    use std::io::Write as _;
    let mut config = e2b::wire::WireConfig::new(KEY);
    config.max_upload_bytes = 1024;
    let env = env_with(config).await;
    let (id, token) = env.create().await;
    let path = "/home/user/through-core.txt";
    let url = |op: &str| {
        format!(
            "{}/files?path={}&signature={}",
            env.url,
            path.replace('/', "%2F"),
            sdk_signature(path, op, &token, None)
                .replace('+', "%2B")
                .replace('/', "%2F")
        )
    };
    let r = env
        .http
        .post(url("write"))
        .header("Content-Type", "application/octet-stream")
        .body(vec![b'x'; 2048])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["code"], json!(400), "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("the URL's bound"),
        "the core's bound: {body}"
    );
    let err = env
        .backend
        .stat(&id, path, Default::default())
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "nothing written: {err}");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(b"through the core").unwrap();
    let r = env
        .http
        .post(url("write"))
        .header("Content-Type", "application/octet-stream")
        .header("Content-Encoding", "gzip")
        .header("X-Metadata-Origin", "wire")
        .body(gz.finish().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let entries: Value = r.json().await.unwrap();
    assert_eq!(
        entries,
        json!([{"name": "through-core.txt", "type": "file", "path": path,
                "metadata": {"origin": "wire"}}])
    );
    let r = env.http.get(url("read")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(
        r.headers()["content-type"],
        "application/octet-stream",
        "envd's download"
    );
    assert_eq!(r.text().await.unwrap(), "through the core");
}

/// An upload without `path` (each part's filename its path) streams each file into the
/// sandbox as it arrives and moves them into place once the body is complete: broken off
/// during the second file, it leaves neither; with a path, a second file part fails the
/// upload before the first lands.
#[tokio::test]
async fn a_broken_off_upload_writes_nothing() {
    let budget = sandcove_compat_support::multipart::UploadBudget::default();
    let mut config = e2b::wire::WireConfig::new(KEY);
    config.upload_memory = budget.clone();
    let env = env_with(config).await;
    let (id, token) = env.create().await;
    let listing = || {
        let (backend, id) = (env.backend.clone(), id.clone());
        async move {
            backend
                .list_dir(&id, "/tmp/up", Default::default())
                .await
                .map(|entries| entries.into_iter().map(|e| e.name).collect::<Vec<_>>())
                .unwrap_or_default()
        }
    };
    let mut body = common::form_part("file", Some("/tmp/up/a.txt"), &[b'a'; 100 * 1024]);
    body.extend(
        b"--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/tmp/up/b.txt\"\r\n\r\n",
    );
    body.extend([b'b'; 50 * 1024]);
    let conn = common::partial_upload(
        &env.url,
        "POST /files",
        &format!("E2b-Sandbox-Id: {id}\r\nX-Access-Token: {token}\r\n"),
        body.len() + 1024 * 1024,
        &body,
    )
    .await;
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
    // With a path, one file: a second part fails it before anything lands.
    let mut body = common::form_part("file", Some("x"), b"first");
    body.extend(common::form_part("file", Some("y"), b"second"));
    body.extend(b"--B--\r\n");
    let r = env
        .envd("/files?path=/tmp/up/one.txt", &id, &token)
        .header("Content-Type", "multipart/form-data; boundary=B")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    assert!(listing().await.is_empty());
    // One path twice: refused, nothing lands.
    let mut body = common::form_part("file", Some("/tmp/up/twice.txt"), b"one");
    body.extend(common::form_part("file", Some("/tmp/up/twice.txt"), b"two"));
    body.extend(b"--B--\r\n");
    let r = env
        .envd("/files", &id, &token)
        .header("Content-Type", "multipart/form-data; boundary=B")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    assert!(listing().await.is_empty());
    // Complete, both land.
    let mut body = common::form_part("file", Some("/tmp/up/a.txt"), b"one");
    body.extend(common::form_part("file", Some("/tmp/up/b.txt"), b"two"));
    body.extend(b"--B--\r\n");
    let r = env
        .envd("/files", &id, &token)
        .header("Content-Type", "multipart/form-data; boundary=B")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let written: Value = r.json().await.unwrap();
    assert_eq!(written[0]["path"], "/tmp/up/a.txt", "{written}");
    assert_eq!(written[1]["path"], "/tmp/up/b.txt", "{written}");
    let mut names = listing().await;
    names.sort();
    assert_eq!(names, ["a.txt", "b.txt"]);
}
