//! Previews: serving a sandbox port, and guarding private ones.

use super::*;
use sandcove::PreviewTokenOptions;

/// A raw HTTP/1.1 GET: `(status, body)`; `None` when the connection is refused.
pub async fn http_get(host: &str, target: &str, headers: &[(&str, &str)]) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(host).await.ok()?;
    let mut request = format!("GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    for (k, v) in headers {
        request.push_str(&format!("{k}: {v}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = Vec::new();
    tokio::time::timeout(PATIENCE, stream.read_to_end(&mut response))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text.split(' ').nth(1)?.parse().ok()?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((status, body))
}

async fn start_http_server(backend: &dyn Backend, id: &str, port: u16, text: &str) {
    write(
        backend,
        id,
        &format!("/tmp/www{port}/index.html"),
        text.as_bytes(),
    )
    .await;
    let spec = ProcessSpec::new(Command::argv([
        "python3",
        "-m",
        "http.server",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
    ]))
    .cwd(format!("/tmp/www{port}"));
    drop(backend.spawn(id, spec).await.expect("start a server"));
    let probe = format!(
        "for i in $(seq 600); do python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}))' 2>/dev/null && exit 0; sleep 0.1; done; exit 1"
    );
    assert!(
        sh(backend, id, &probe).await.exit_status().success(),
        "server on {port} is up"
    );
}

/// A server in the sandbox answers through its preview URL; private previews need a live
/// token; sandboxes using the same port do not clash.
pub async fn previews_serve_and_guard_private_ports(backend: &dyn Backend) {
    let id = create(backend, &unique("preview")).await;
    // Un-isolated sandboxes share the host's network: each server needs a port free on the
    // host, and two cannot both serve the same one.
    let isolated = backend.capabilities().isolated;
    let port = if isolated { 8000 } else { free_host_port() };
    let mut options = PreviewOptions::default();
    options.port = port;
    options.token_header = "X-Test-Token".into();
    options.token_query = "test_token".into();
    if !backend.capabilities().previews {
        expect_code(
            backend.expose_port(&id, options).await,
            ErrorCode::NotSupported,
            "expose",
        );
        backend.destroy(&id).await.expect("destroy");
        return;
    }
    start_http_server(backend, &id, port, "hello from the sandbox").await;
    let private = backend.expose_port(&id, options).await.expect("expose");
    assert!(
        private.url.starts_with("http://127.0.0.1:"),
        "{}",
        private.url
    );
    let token = private
        .token
        .clone()
        .expect("a private preview has a token")
        .value;
    let (status, _) = http_get(&private.host, "/", &[]).await.expect("answered");
    assert_eq!(status, 401, "no token: refused");
    let (status, _) = http_get(&private.host, "/", &[("X-Test-Token", "wrong")])
        .await
        .expect("answered");
    assert_eq!(status, 401, "wrong token: refused");
    let (status, body) = http_get(&private.host, "/", &[("x-test-token", &token)])
        .await
        .expect("answered");
    assert_eq!((status, body.as_str()), (200, "hello from the sandbox"));
    let (status, body) = http_get(&private.host, &format!("/?test_token={token}"), &[])
        .await
        .expect("answered");
    assert_eq!((status, body.as_str()), (200, "hello from the sandbox"));
    // Extra tokens with an expiry: one far enough ahead that no request outlives it, and one
    // whose expiry is the subject (refused once it has passed, never before).
    let long = backend
        .create_preview_token(
            &id,
            port,
            PreviewTokenOptions::default().expires_at(sandcove::now_millis() + 600_000),
        )
        .await
        .expect("token");
    let (status, _) = http_get(&private.host, "/", &[("X-Test-Token", &long.value)])
        .await
        .expect("answered");
    assert_eq!(status, 200, "an unexpired extra token is accepted");
    // A revoked token stops working at once; the others keep working.
    backend
        .revoke_preview_token(&id, port, &long.value)
        .await
        .expect("revoke");
    let (status, _) = http_get(&private.host, "/", &[("X-Test-Token", &long.value)])
        .await
        .expect("answered");
    assert_eq!(status, 401, "a revoked token is refused");
    let (status, _) = http_get(&private.host, "/", &[("X-Test-Token", &token)])
        .await
        .expect("answered");
    assert_eq!(status, 200, "revoking one token leaves the others");
    expect_code(
        backend.revoke_preview_token(&id, port, &long.value).await,
        ErrorCode::NotFound,
        "revoking a token twice",
    );
    let expires_at = sandcove::now_millis() + 1_000;
    let short = backend
        .create_preview_token(
            &id,
            port,
            PreviewTokenOptions::default().expires_at(expires_at),
        )
        .await
        .expect("token");
    let host = &private.host;
    let short = &short.value;
    eventually(PATIENCE, "an expired token is refused", || async move {
        let (status, _) = http_get(host, "/", &[("X-Test-Token", short)])
            .await
            .ok_or("no answer")?;
        // The server checked the token at some moment before the answer came back: a refusal
        // answered before the expiry is certainly early; one answered later may be on time.
        let answered_at = sandcove::now_millis();
        match status {
            401 if answered_at < expires_at => {
                panic!(
                    "token refused {} ms before its expiry",
                    expires_at - answered_at
                )
            }
            401 if answered_at == expires_at => Err("refused at the expiry millisecond: ask again"),
            401 => Ok(()),
            200 => Err("still accepted"),
            _ => panic!("unexpected status {status}"),
        }
    })
    .await;
    // A second sandbox serving the same port, exposed publicly.
    let other = create(backend, &unique("preview2")).await;
    let other_port = if isolated {
        port
    } else {
        skipped(
            "previews_serve_and_guard_private_ports",
            "un-isolated sandboxes share the host's ports: the second one serves another port",
        );
        free_host_port()
    };
    start_http_server(backend, &other, other_port, "the other one").await;
    let public = backend
        .expose_port(&other, {
            let mut options = PreviewOptions::default();
            options.port = other_port;
            options.public = true;
            options
        })
        .await
        .expect("expose public");
    assert!(public.token.is_none());
    let (status, body) = http_get(&public.host, "/", &[]).await.expect("answered");
    assert_eq!((status, body.as_str()), (200, "the other one"));
    assert_eq!(backend.list_previews(&id).await.expect("list").len(), 1);
    backend.close_preview(&id, port).await.expect("close");
    assert!(
        http_get(&private.host, "/", &[("X-Test-Token", &token)])
            .await
            .is_none(),
        "closed"
    );
    expect_code(
        backend.close_preview(&id, port).await,
        ErrorCode::NotFound,
        "close twice",
    );
    backend.destroy(&id).await.expect("destroy");
    backend.destroy(&other).await.expect("destroy");
    assert!(
        http_get(&public.host, "/", &[]).await.is_none(),
        "gone with its sandbox"
    );
}
