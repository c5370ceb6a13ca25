//! Preview URLs: a host listener on `127.0.0.1` per exposed port, held by the monitor.
//!
//! Each accepted connection asks the agent for a socket connected to the port on the
//! sandbox's own loopback (the agent lives in the sandbox's network namespace, so no host port
//! is shared and no privilege is needed) and then copies bytes both ways. A private preview
//! first reads the HTTP request head and requires a live token in the configured header or
//! query parameter; anything else gets `401` and the sandbox is never contacted.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::{now_millis, Error, Preview, PreviewOptions, PreviewToken, Result};

/// Largest request head read while checking a token.
const MAX_HEAD: usize = 64 * 1024;

/// One exposed port.
pub struct Exposed {
    /// What callers see.
    pub preview: Preview,
    /// Every token issued for it (the first one is `preview.token`).
    pub tokens: Vec<PreviewToken>,
    /// The accept loop; aborted when the preview closes.
    pub task: tokio::task::JoinHandle<()>,
}

/// The previews of one sandbox, by sandbox port.
pub type Previews = Arc<Mutex<BTreeMap<u16, Exposed>>>;

/// A fresh random token (128 bits, hex).
pub fn new_token(ttl_ms: Option<u64>) -> PreviewToken {
    let a = super::config::new_id();
    let b = super::config::new_id();
    PreviewToken {
        value: format!("{a}{b}"),
        expires_at: ttl_ms.map(|t| now_millis() + t),
    }
}

/// Bind a listener for a new preview. Returns it with its URL and host.
pub async fn bind() -> Result<(TcpListener, String, String)> {
    let listener = TcpListener::bind(("127.0.0.1", 0))
        .await
        .map_err(|e| Error::from_io(&e, "bind a preview port"))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::from_io(&e, "preview port"))?;
    let host = format!("127.0.0.1:{}", addr.port());
    Ok((listener, format!("http://{host}"), host))
}

/// Build the preview record for `options` served at `url`.
pub fn describe(
    options: &PreviewOptions,
    url: String,
    host: String,
) -> (Preview, Vec<PreviewToken>) {
    let tokens = if options.public {
        Vec::new()
    } else {
        vec![new_token(options.token_ttl.map(|d| d.as_millis() as u64))]
    };
    (
        Preview {
            port: options.port,
            url,
            host,
            public: options.public,
            token: tokens.first().cloned(),
            token_header: options.token_header.clone(),
            token_query: options.token_query.clone(),
        },
        tokens,
    )
}

/// Whether a request head carries a live token for this preview.
pub fn authorized(head: &[u8], preview: &Preview, tokens: &[PreviewToken]) -> bool {
    let text = String::from_utf8_lossy(head);
    let mut lines = text.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let target = request_line.split(' ').nth(1).unwrap_or_default();
    let mut offered: Vec<String> = Vec::new();
    if let Some((_, query)) = target.split_once('?') {
        for pair in query.split('&') {
            if let Some((k, v)) = pair.split_once('=') {
                if k == preview.token_query {
                    offered.push(percent_decode(v));
                }
            }
        }
    }
    for line in lines {
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.trim().eq_ignore_ascii_case(&preview.token_header) {
                offered.push(value.trim().to_string());
            }
        }
    }
    let now = now_millis();
    offered.iter().any(|o| {
        tokens.iter().any(|t| {
            constant_eq(o.as_bytes(), t.value.as_bytes()) && t.expires_at.is_none_or(|e| now < e)
        })
    })
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(if bytes[i] == b'+' { b' ' } else { bytes[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Compare secrets without an early exit on the first differing byte.
pub fn constant_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Read the request head (through the blank line) or up to [`MAX_HEAD`] bytes.
pub async fn read_head(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_HEAD {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    Ok(head)
}

/// Answer a refused request and close.
pub async fn refuse(stream: &mut TcpStream, status: &str, message: &str) {
    let body = format!("{message}\n");
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn preview() -> (Preview, Vec<PreviewToken>) {
        let options = PreviewOptions {
            port: 3000,
            token_header: "X-Blaxel-Preview-Token".into(),
            token_query: "bl_preview_token".into(),
            ..Default::default()
        };
        describe(&options, "http://x".into(), "x".into())
    }

    #[test]
    fn tokens_are_accepted_in_the_header_or_the_query() {
        let (p, tokens) = preview();
        let t = &tokens[0].value;
        let by_header = format!("GET / HTTP/1.1\r\nHost: x\r\nx-blaxel-preview-token: {t}\r\n\r\n");
        let by_query = format!("GET /a?b=1&bl_preview_token={t} HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(authorized(by_header.as_bytes(), &p, &tokens));
        assert!(authorized(by_query.as_bytes(), &p, &tokens));
        assert!(!authorized(
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
            &p,
            &tokens
        ));
        let wrong = "GET / HTTP/1.1\r\nX-Blaxel-Preview-Token: nope\r\n\r\n";
        assert!(!authorized(wrong.as_bytes(), &p, &tokens));
    }

    #[test]
    fn expired_tokens_are_refused() {
        let (p, mut tokens) = preview();
        tokens[0].expires_at = Some(now_millis() - 1);
        let t = &tokens[0].value;
        let req = format!("GET /?bl_preview_token={t} HTTP/1.1\r\n\r\n");
        assert!(!authorized(req.as_bytes(), &p, &tokens));
    }

    #[test]
    fn public_previews_have_no_token() {
        let options = PreviewOptions {
            port: 1,
            public: true,
            ..Default::default()
        };
        let (p, tokens) = describe(&options, String::new(), String::new());
        assert!(p.token.is_none() && tokens.is_empty());
    }
}
