//! Helpers shared by the facade's end-to-end tests (real embedded engine, no mocks).

use blaxel::SandboxInstance;
use serde_json::json;

/// A sandbox name unique to this test run.
pub fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "{prefix}-{}-{}-{}",
        std::process::id() % 100_000,
        nanos % 10_000,
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A fresh sandbox with a short ttl.
pub async fn sandbox(prefix: &str) -> SandboxInstance {
    SandboxInstance::create(json!({"name": unique(prefix), "ttl": "5m"}))
        .await
        .expect("create a sandbox")
}

/// Whether the runtime has a capability.
pub async fn capabilities() -> sandcove::Capabilities {
    let client = sandcove::Client::from_env().expect("runtime");
    client.ready().await.expect("capabilities")
}

/// Send a plain HTTP/1.0 GET to `url` (http://host:port/path?query) with optional headers;
/// returns the status code and body (status 0 when the connection is refused).
pub async fn http_get(url: &str, headers: &[(&str, &str)]) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://").expect("http URL");
    let (host, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => match rest.find('?') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        },
    };
    let path = if path.starts_with('?') {
        format!("/{path}")
    } else {
        path.to_string()
    };
    let Ok(mut stream) = tokio::net::TcpStream::connect(host).await else {
        return (0, String::new()); // nothing listens: no HTTP status at all
    };
    let mut req = format!("GET {path} HTTP/1.0\r\nHost: {host}\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    stream.write_all(req.as_bytes()).await.expect("send");
    let mut buf = Vec::new();
    let _ = stream.read_to_end(&mut buf).await;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or_default()
        .to_string();
    (status, body)
}
