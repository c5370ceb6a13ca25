//! `sandbox.previews` and `CodeInterpreter` against the real embedded engine.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crate::common::{self, http_get, sandbox, unique};
use blaxel::CodeInterpreter;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn previews_serve_and_private_ones_need_the_token() {
    let sb = sandbox("preview").await;
    sb.fs
        .write("/blaxel/site/index.html", "hello preview")
        .await
        .unwrap();
    sb.process
        .exec(json!({"name": "web", "command": "python3 -m http.server 3000 --bind 0.0.0.0", "working_dir": "/blaxel/site", "wait_for_ports": [3000], "timeout": 30}))
        .await
        .expect("server");
    let result = sb
        .previews
        .create(
            json!({"metadata": {"name": "token-test"}, "spec": {"port": 3000, "public": false}}),
        )
        .await;
    if !common::capabilities().await.previews {
        eprintln!("LOUD SKIP: the runtime has no previews yet; checking the refusal");
        assert!(result.unwrap_err().is_not_supported());
        assert!(sb
            .previews
            .get("token-test")
            .await
            .unwrap_err()
            .is_not_found());
        sb.delete().await.unwrap();
        return;
    }
    let preview = result.expect("create");
    assert_eq!(preview.name, "token-test");
    assert_eq!(
        preview.metadata.resource_name.as_deref(),
        Some(sb.metadata.name.as_str())
    );
    let url = preview.spec.url.clone().expect("url");
    let (status, _) = http_get(&format!("{url}/index.html"), &[]).await;
    assert_eq!(
        status, 401,
        "a private preview refuses requests without a token"
    );
    let token = preview
        .tokens
        .create(SystemTime::now() + Duration::from_secs(600))
        .await
        .expect("token");
    assert!(!token.value.is_empty());
    let (status, body) = http_get(
        &format!("{url}/index.html?bl_preview_token={}", token.value),
        &[],
    )
    .await;
    assert_eq!((status, body.as_str()), (200, "hello preview"));
    let (status, _) = http_get(
        &format!("{url}/index.html"),
        &[("X-Blaxel-Preview-Token", &token.value)],
    )
    .await;
    assert_eq!(status, 200);

    // A second private preview of the port shares its URL; a public one cannot coexist.
    let twin = sb
        .previews
        .create(json!({"metadata": {"name": "twin"}, "spec": {"port": 3000, "public": false}}))
        .await
        .expect("second private preview");
    assert_eq!(twin.spec.url, preview.spec.url);
    let err = sb
        .previews
        .create(
            json!({"metadata": {"name": "app-preview"}, "spec": {"port": 3000, "public": true}}),
        )
        .await
        .unwrap_err();
    assert!(err.is_not_supported(), "{err}");
    sb.previews.delete("token-test").await.expect("delete");
    assert!(sb
        .previews
        .get("token-test")
        .await
        .unwrap_err()
        .is_not_found());
    let (status, _) = http_get(
        &format!("{url}/index.html?bl_preview_token={}", token.value),
        &[],
    )
    .await;
    assert_eq!(status, 401, "deleting a preview revokes its tokens");
    let twin_token = twin
        .tokens
        .create(SystemTime::now() + Duration::from_secs(600))
        .await
        .expect("twin token");
    let (status, _) = http_get(
        &format!("{url}/index.html?bl_preview_token={}", twin_token.value),
        &[],
    )
    .await;
    assert_eq!(status, 200, "the twin keeps the port's URL open");
    sb.previews.delete("twin").await.expect("delete twin");

    let public = sb
        .previews
        .create_if_not_exists(
            json!({"metadata": {"name": "app-preview"}, "spec": {"port": 3000, "public": true}}),
        )
        .await
        .expect("public");
    let again = sb
        .previews
        .create_if_not_exists(
            json!({"metadata": {"name": "app-preview"}, "spec": {"port": 3000, "public": true}}),
        )
        .await
        .expect("exists");
    assert_eq!(again.spec.url, public.spec.url);
    let (status, _) = http_get(
        &format!("{}/index.html", public.spec.url.clone().unwrap()),
        &[],
    )
    .await;
    assert_eq!(status, 200);
    let names: Vec<String> = sb
        .previews
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|p| p.name)
        .collect();
    assert!(names.contains(&"app-preview".to_string()));
    let public_url = public.spec.url.clone().unwrap();
    sb.previews.delete("app-preview").await.expect("delete");
    assert!(sb
        .previews
        .get("app-preview")
        .await
        .unwrap_err()
        .is_not_found());
    let (status, _) = http_get(&format!("{public_url}/index.html"), &[]).await;
    assert_ne!(status, 200, "a deleted preview no longer serves");
    sb.delete().await.unwrap();
}

/// Attack (fails): many token creates at once on a preview near its bound of 100 live
/// tokens; each reads the count before any records its token. However they interleave, the
/// preview ends with at most 100 live tokens, and every token handed out is among them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_token_creates_keep_the_bound() {
    if !common::capabilities().await.previews {
        eprintln!("LOUD SKIP: the runtime has no previews; no tokens to bound");
        return;
    }
    let sb = sandbox("ptoken-race").await;
    let preview = sb
        .previews
        .create(json!({"metadata": {"name": "bounded"}, "spec": {"port": 3000, "public": false}}))
        .await
        .expect("create");
    let expiry = || SystemTime::now() + Duration::from_secs(600);
    for _ in 0..90 {
        preview.tokens.create(expiry()).await.expect("token");
    }
    let racers = (0..30).map(|_| preview.tokens.create(expiry()));
    let results = futures::future::join_all(racers).await;
    let handed: Vec<String> = results
        .into_iter()
        .filter_map(|r| r.ok().map(|t| t.value))
        .collect();
    let listed = preview.tokens.list().await.expect("list");
    let live: Vec<&str> = listed
        .iter()
        .filter(|t| !t.expired)
        .map(|t| t.value.as_str())
        .collect();
    assert!(
        live.len() <= blaxel::previews::MAX_TOKENS_PER_PREVIEW,
        "{} live tokens on one preview ({} handed out by concurrent creates)",
        live.len(),
        handed.len()
    );
    for value in &handed {
        assert!(
            live.contains(&value.as_str()),
            "a token handed out is not live"
        );
    }
    sb.delete().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preview_gaps_are_refused_first() {
    let sb = sandbox("pgaps").await;
    for spec in [
        json!({"port": 3000, "public": true, "prefix_url": "my-app"}),
        json!({"port": 3000, "public": true, "custom_domain": "x.example"}),
        json!({"port": 3000, "public": true, "ttl": "1h"}),
    ] {
        let err = sb
            .previews
            .create(json!({"metadata": {"name": "p"}, "spec": spec}))
            .await
            .unwrap_err();
        assert!(err.is_not_supported(), "{err}");
    }
    let err = sb
        .previews
        .create(json!({"metadata": {"name": "p"}, "spec": {"port": 80, "public": true}}))
        .await
        .unwrap_err();
    assert_eq!(err.status_code(), Some(400), "port 80 is reserved");
    let err = sb
        .previews
        .create(json!({"spec": {"port": 3000}}))
        .await
        .unwrap_err();
    assert!(matches!(err, blaxel::SandboxAPIError::ValueError { .. }));
    sb.delete().await.unwrap();
}

/// `spec.request_headers` reach the sandboxed server on every request and
/// `spec.response_headers` (CORS, say) every answer, set by the preview proxy; a header the
/// proxy decides itself is a 400; a second preview of the port must agree on them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preview_headers_are_set_on_requests_and_answers() {
    let sb = sandbox("pheaders").await;
    if !common::capabilities().await.previews {
        eprintln!("LOUD SKIP: the runtime has no previews");
        sb.delete().await.unwrap();
        return;
    }
    let server = r#"import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = (self.headers.get('X-Inside') or 'none').encode()
        self.send_response(200)
        self.send_header('Content-Length', str(len(body)))
        self.send_header('Access-Control-Allow-Origin', 'https://sandbox.example')
        self.end_headers()
        self.wfile.write(body)
http.server.HTTPServer(('0.0.0.0', 3100), H).serve_forever()
"#;
    sb.fs.write("/blaxel/echo.py", server).await.unwrap();
    sb.process
        .exec(json!({"name": "echo", "command": "python3 /blaxel/echo.py", "wait_for_ports": [3100], "timeout": 30}))
        .await
        .expect("server");
    let preview = sb
        .previews
        .create(json!({"metadata": {"name": "cors"}, "spec": {
            "port": 3100, "public": true,
            "request_headers": {"X-Inside": "from the preview"},
            "response_headers": {"Access-Control-Allow-Origin": "*", "X-Served-By": "preview"},
        }}))
        .await
        .expect("create");
    let url = preview.spec.url.clone().expect("url");
    let host = url.strip_prefix("http://").expect("http URL");
    let host = host.split('/').next().unwrap();
    let raw = {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(host).await.expect("connect");
        let req = format!("GET / HTTP/1.0\r\nHost: {host}\r\nX-Inside: from the client\r\n\r\n");
        stream.write_all(req.as_bytes()).await.expect("send");
        let mut buf = Vec::new();
        let _ = stream.read_to_end(&mut buf).await;
        String::from_utf8_lossy(&buf).to_ascii_lowercase()
    };
    assert!(
        raw.starts_with("http/1.1 200") || raw.starts_with("http/1.0 200"),
        "{raw}"
    );
    assert!(raw.contains("access-control-allow-origin: *\r\n"), "{raw}");
    assert!(!raw.contains("https://sandbox.example"), "replaced: {raw}");
    assert!(raw.contains("x-served-by: preview\r\n"), "{raw}");
    assert!(raw.ends_with("from the preview"), "{raw}");
    let err = sb
        .previews
        .create(json!({"metadata": {"name": "other"}, "spec": {
            "port": 3100, "public": true, "response_headers": {"X-Other": "1"},
        }}))
        .await
        .unwrap_err();
    assert!(err.is_not_supported(), "{err}");
    let err = sb
        .previews
        .create(json!({"metadata": {"name": "hop"}, "spec": {
            "port": 3200, "public": true, "request_headers": {"Transfer-Encoding": "chunked"},
        }}))
        .await
        .unwrap_err();
    assert_eq!(err.status_code(), Some(400), "{err}");
    sb.delete().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn code_interpreter_is_stateful() {
    let name = unique("interp");
    let ci = CodeInterpreter::create(json!({"name": name}))
        .await
        .expect("create");
    assert_eq!(ci.spec.runtime.image, "blaxel/jupyter-server");
    assert_eq!(ci.spec.runtime.ports[0].target, 8888);

    let out = Arc::new(Mutex::new(String::new()));
    let o = out.clone();
    let exec = ci
        .run_code("print('Hello from interpreter')")
        .language("python".to_string())
        .on_stdout(move |m| o.lock().unwrap().push_str(&m.text))
        .timeout(30.0)
        .await
        .expect("run_code");
    assert!(out.lock().unwrap().contains("Hello from interpreter"));
    assert_eq!(exec.logs.stdout.concat(), "Hello from interpreter\n");

    let results = Arc::new(Mutex::new(Vec::new()));
    let r = results.clone();
    let exec = ci
        .run_code("2 + 2")
        .on_result(move |res| r.lock().unwrap().push(res))
        .await
        .unwrap();
    assert_eq!(exec.results[0].text.as_deref(), Some("4"));
    assert!(exec.results[0].is_main_result);
    assert_eq!(results.lock().unwrap().len(), 1);
    let exec = ci.run_code("'abc'").await.unwrap();
    assert_eq!(exec.results[0].text.as_deref(), Some("abc"));

    let errors = Arc::new(Mutex::new(Vec::new()));
    let e = errors.clone();
    let exec = ci
        .run_code("raise ValueError('test error')")
        .on_error(move |err| e.lock().unwrap().push(err))
        .await
        .unwrap();
    assert_eq!(errors.lock().unwrap()[0].name, "ValueError");
    let err = exec.error.expect("error");
    assert_eq!(err.value, "test error");
    assert!(err.traceback.contains("ValueError"));

    ci.run_code("def add(a, b): return a + b").await.unwrap();
    let exec = ci.run_code("print(add(2, 3))").await.unwrap();
    assert_eq!(exec.logs.stdout.concat(), "5\n");
    let exec = ci
        .run_code("import os; print(os.environ.get('RUN_VAR'))")
        .envs([("RUN_VAR", "yes")])
        .await
        .unwrap();
    assert_eq!(exec.logs.stdout.concat(), "yes\n");

    // Another client sees the same state.
    let again = CodeInterpreter::get(&name).await.expect("get");
    let exec = again.run_code("add(10, 5)").await.unwrap();
    assert_eq!(exec.results[0].text.as_deref(), Some("15"));

    let ctx = ci
        .create_code_context()
        .language("python".to_string())
        .await
        .expect("context");
    assert!(!ctx.id.is_empty());
    let exec = ci
        .run_code("'add' in globals()")
        .context(ctx.clone())
        .await
        .unwrap();
    assert_eq!(
        exec.results[0].text.as_deref(),
        Some("False"),
        "a context has its own state"
    );
    let err = ci
        .run_code("1")
        .language("python".to_string())
        .context(ctx)
        .await
        .unwrap_err();
    assert!(matches!(err, blaxel::SandboxAPIError::ValueError { .. }));
    assert!(ci
        .run_code("1")
        .language("javascript".to_string())
        .await
        .unwrap_err()
        .is_not_supported());
    let err = ci
        .run_code("import time; time.sleep(5)")
        .timeout(0.5)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("timed out"), "{err}");
    // Internal driver processes are not listed as Blaxel processes.
    assert!(ci.process.list().await.unwrap().is_empty());
    ci.delete().await.expect("delete");
}
