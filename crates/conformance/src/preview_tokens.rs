//! Preview tokens: bounded, and never visible inside the sandbox.

use super::*;
use sandcove::PreviewTokenOptions;

/// Preview token lifetimes are bounded, and the token (header or query parameter) is
/// checked and removed before the request reaches the sandboxed server, which echoes what it
/// received.
pub async fn preview_tokens_are_bounded_and_never_reach_the_sandbox(backend: &dyn Backend) {
    let id = create(backend, &unique("preview-strip")).await;
    let port = if backend.capabilities().isolated {
        8001
    } else {
        free_host_port()
    };
    let mut options = PreviewOptions::default();
    options.port = port;
    options.token_header = "X-Echo-Token".into();
    options.token_query = "echo_token".into();
    if !backend.capabilities().previews {
        expect_code(
            backend.expose_port(&id, options).await,
            ErrorCode::NotSupported,
            "expose",
        );
        backend.destroy(&id).await.expect("destroy");
        return;
    }
    let mut zero = options.clone();
    zero.token_ttl = Some(Duration::ZERO);
    expect_code(
        backend.expose_port(&id, zero).await,
        ErrorCode::InvalidArgument,
        "ttl 0",
    );
    let mut long = options.clone();
    long.token_ttl = Some(sandcove::validate::MAX_PREVIEW_TOKEN_TTL * 2);
    expect_code(
        backend.expose_port(&id, long).await,
        ErrorCode::InvalidArgument,
        "ttl 2 weeks",
    );
    let script = format!(
        "import http.server\n\
         class H(http.server.BaseHTTPRequestHandler):\n\
         \x20   def do_GET(self):\n\
         \x20       body = (self.requestline + '\\n' + str(self.headers)).encode()\n\
         \x20       self.send_response(200)\n\
         \x20       self.send_header('Content-Length', str(len(body)))\n\
         \x20       self.end_headers()\n\
         \x20       self.wfile.write(body)\n\
         http.server.HTTPServer(('127.0.0.1', {port}), H).serve_forever()\n"
    );
    // Relative to its cwd: an un-isolated sandbox maps its cwd, not paths in an argv.
    write(
        backend,
        &id,
        &format!("/tmp/echo{port}/echo.py"),
        script.as_bytes(),
    )
    .await;
    let spec =
        ProcessSpec::new(Command::argv(["python3", "echo.py"])).cwd(format!("/tmp/echo{port}"));
    drop(
        backend
            .spawn(&id, spec)
            .await
            .expect("start the echo server"),
    );
    let probe = format!(
        "for i in $(seq 600); do python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}))' 2>/dev/null && exit 0; sleep 0.1; done; exit 1"
    );
    assert!(
        sh(backend, &id, &probe).await.exit_status().success(),
        "echo server is up"
    );
    let preview = backend.expose_port(&id, options).await.expect("expose");
    let token = preview
        .token
        .clone()
        .expect("a private preview has a token")
        .value;
    let now = sandcove::now_millis();
    expect_code(
        backend
            .create_preview_token(
                &id,
                port,
                PreviewTokenOptions::default().expires_at(now.saturating_sub(1)),
            )
            .await,
        ErrorCode::InvalidArgument,
        "an expiry already past",
    );
    expect_code(
        backend
            .create_preview_token(
                &id,
                port,
                PreviewTokenOptions::default().expires_at(now + 8 * 24 * 3600 * 1000),
            )
            .await,
        ErrorCode::InvalidArgument,
        "an expiry past a week",
    );
    let (status, body) = http_get(
        &preview.host,
        &format!("/echo?keep=1&echo_token={token}&also=2"),
        &[("X-Kept", "yes")],
    )
    .await
    .expect("answered");
    assert_eq!(status, 200, "{body}");
    assert!(
        body.starts_with("GET /echo?keep=1&also=2 HTTP/1.1"),
        "{body}"
    );
    assert!(body.contains("X-Kept: yes"), "{body}");
    assert!(
        !body.contains(&token),
        "the query token reached the sandbox: {body}"
    );
    let (status, body) = http_get(&preview.host, "/echo", &[("X-Echo-Token", &token)])
        .await
        .expect("answered");
    assert_eq!(status, 200, "{body}");
    assert!(body.starts_with("GET /echo HTTP/1.1"), "{body}");
    assert!(
        !body.contains(&token),
        "the header token reached the sandbox: {body}"
    );
    assert!(
        !body.to_ascii_lowercase().contains("x-echo-token"),
        "{body}"
    );
    backend.destroy(&id).await.expect("destroy");
}

// ---------------------------------------------------------------------------------------------
// Warm and cold creates
// ---------------------------------------------------------------------------------------------
