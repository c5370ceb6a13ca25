//! Sandbox ports on the E2B listener, for `get_host(port)`.
//!
//! The SDKs build a port's host as `{port}-{sandboxID}.{domain}` from the `domain` the
//! control plane returned. Sandcove returns the listener's own `host:port` there (with
//! `localhost` for a loopback listener), so the host is
//! `3000-<id>.localhost:<listener port>`: where that name resolves to the loopback (curl and
//! browsers resolve every `*.localhost`; so do systems whose resolver follows RFC 6761), or
//! with the `Host` header set by the client, the request reaches the listener, which
//! forwards it to that port inside the sandbox through the engine's preview (a private one,
//! its token added here, so the host-side preview port opens to nobody else). As on E2B,
//! such a request needs no credential: anyone who can reach the listener and knows the
//! sandbox id can reach a port the sandbox serves.
//!
//! A request asking to switch protocols (a WebSocket, say) is forwarded the same way; when
//! the sandbox answers `101`, the listener splices the two connections, bytes copied both
//! ways until either side ends, nothing moves for `UPGRADED_IDLE`, or the listener stops.
//! The spliced connection keeps its slot in the listener's connection cap.
//!
//! Since such a request needs no credential, the sandbox's answer is bounded
//! (`sandcove::server::upstream`): its head must arrive within the listener's
//! `upstream_answer_timeout` (60 s unless configured) of the last byte of the request the
//! sandbox took, else the client gets `504` and the
//! connection to the sandbox is dropped; once the head is in, a body that brings no byte for
//! the listener's body idle bound ends, and the client's connection with it. At most
//! [`WireConfig::max_host_requests_per_sandbox`](super::WireConfig) such requests (upgraded
//! connections included) run at once per sandbox; more get `503` with `Retry-After`, so whoever
//! knows one sandbox's id cannot take the listener's whole connection cap through it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::Wire;

/// The `(port, sandbox id)` a `Host` of the form `{port}-{id}.{anything}` names.
pub(crate) fn host_target(host: &str) -> Option<(u16, String)> {
    let (label, _) = host.split_once('.')?;
    let (port, id) = label.split_once('-')?;
    let port: u16 = port.parse().ok().filter(|p| *p > 0)?;
    let valid = !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    valid.then(|| (port, id.to_string()))
}

/// The `domain` to return for requests that reached the listener as `host` (the request's
/// `Host` header): a loopback address becomes `localhost`, so `*.localhost` names reach it.
pub(crate) fn domain_for(host: Option<&str>) -> Option<String> {
    let host = host?;
    let (name, port) = if let Some(rest) = host.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        (format!("[{inside}]"), after.strip_prefix(':'))
    } else {
        match host.rsplit_once(':') {
            Some((n, p)) => (n.to_string(), Some(p)),
            None => (host.to_string(), None),
        }
    };
    let loopback = name == "localhost" || name.starts_with("127.") || name == "[::1]";
    let name = if loopback { "localhost" } else { name.as_str() };
    Some(match port {
        Some(p) => format!("{name}:{p}"),
        None => name.to_string(),
    })
}

/// How long an upgraded `get_host` connection may carry no bytes either way before it is
/// closed.
pub(crate) const UPGRADED_IDLE: std::time::Duration = std::time::Duration::from_secs(600);

fn bad_gateway(message: String) -> Response {
    (StatusCode::BAD_GATEWAY, message).into_response()
}

/// The `get_host` requests running now, per sandbox id (ids with none are removed).
#[derive(Debug, Default)]
pub(crate) struct InFlight(Mutex<HashMap<String, usize>>);

/// One running `get_host` request's place in [`InFlight`], given back when dropped.
pub(crate) struct Slot {
    in_flight: Arc<InFlight>,
    id: String,
}

impl InFlight {
    /// A place for one more request to sandbox `id`, unless `max` already run.
    fn take(self: &Arc<Self>, id: &str, max: usize) -> Option<Slot> {
        let mut running = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let count = running.entry(id.to_string()).or_insert(0);
        if *count >= max {
            if *count == 0 {
                running.remove(id);
            }
            return None;
        }
        *count += 1;
        Some(Slot {
            in_flight: self.clone(),
            id: id.to_string(),
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut running = self.in_flight.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = running.get_mut(&self.id) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                running.remove(&self.id);
            }
        }
    }
}

fn too_many(id: &str, max: usize) -> Response {
    let mut response = (
        StatusCode::SERVICE_UNAVAILABLE,
        format!("sandbox {id} already has {max} requests to its ports running; retry later"),
    )
        .into_response();
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

/// Forward `request` to `port` in sandbox `id` through the engine's preview of that port
/// (made private on first use, reused after).
pub(crate) async fn forward(wire: &Wire, port: u16, id: &str, mut request: Request) -> Response {
    use sandcove::server::{upgrade, upstream};
    let max = wire.config.max_host_requests_per_sandbox;
    let Some(slot) = wire.host_requests.take(id, max) else {
        return too_many(id, max);
    };
    let bounds = upstream::UpstreamBounds::of(&request);
    // Taken before anything reaches the sandbox: a listener that cannot bound the upgraded
    // connection refuses it.
    let upgrade = if upgrade::is_upgrade(&request) {
        match upgrade::prepare(&mut request) {
            Ok(u) => Some(u),
            Err(e) => return bad_gateway(e.to_string()),
        }
    } else {
        None
    };
    let sandbox = wire.client.sandbox(id);
    let previews = match sandbox.previews().await {
        Ok(p) => p,
        Err(e) if e.is_not_found() => {
            return bad_gateway(format!("The sandbox {id} was not found"));
        }
        Err(e) => return bad_gateway(e.to_string()),
    };
    let preview = match previews.into_iter().find(|p| p.port == port) {
        Some(p) => p,
        None => {
            match sandbox
                .expose_port(sandcove::PreviewOptions::new(port))
                .await
            {
                Ok(p) => p,
                Err(e) => return bad_gateway(e.to_string()),
            }
        }
    };
    let tcp = match tokio::net::TcpStream::connect(&preview.host).await {
        Ok(t) => t,
        Err(e) => return bad_gateway(format!("port {port} of sandbox {id}: {e}")),
    };
    let (mut sender, connection) =
        match hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp)).await {
            Ok(pair) => pair,
            Err(e) => return bad_gateway(format!("port {port} of sandbox {id}: {e}")),
        };
    let connection = tokio::spawn(connection.with_upgrades());
    let (mut parts, body) = request.into_parts();
    if let Ok(host) = HeaderValue::from_str(&preview.host) {
        parts.headers.insert(header::HOST, host);
    }
    if let Some(token) = &preview.token {
        if let (Ok(name), Ok(value)) = (
            header::HeaderName::from_bytes(preview.token_header.as_bytes()),
            HeaderValue::from_str(&token.value),
        ) {
            parts.headers.insert(name, value);
        }
    }
    // Only the path and query go upstream (the request line is origin-form).
    if let Some(pq) = parts.uri.path_and_query().cloned() {
        if let Ok(uri) = pq.as_str().parse() {
            parts.uri = uri;
        }
    }
    let (body, overdue) = bounds.watch_request(body);
    let answer = tokio::select! {
        answer = sender.send_request(axum::http::Request::from_parts(parts, body)) => Some(answer),
        () = overdue => None,
    };
    let Some(answer) = answer else {
        // Dropped, not left to the sandbox: nothing more comes from or goes to it.
        connection.abort();
        return upstream::gateway_timeout(
            &format!("port {port} of sandbox {id}"),
            bounds.answer_timeout,
        );
    };
    match answer {
        Ok(mut response) => {
            if let Some(upgrade) = upgrade {
                if response.status() == StatusCode::SWITCHING_PROTOCOLS {
                    let upstream = hyper::upgrade::on(&mut response);
                    upgrade.run(move |mut client| async move {
                        let _slot = slot;
                        let Ok(upstream) = upstream.await else {
                            return;
                        };
                        let mut upstream = hyper_util::rt::TokioIo::new(upstream);
                        let _ = upgrade::splice(&mut client, &mut upstream, UPGRADED_IDLE).await;
                    });
                    return response.map(Body::new);
                }
            }
            response.map(|body| bounds.answer_body(body, slot))
        }
        Err(e) => bad_gateway(format!("port {port} of sandbox {id}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_name_a_port_and_a_sandbox() {
        assert_eq!(
            host_target("3000-abc123.localhost:8080"),
            Some((3000, "abc123".to_string()))
        );
        assert_eq!(
            host_target("8080-sbx_1-x.e2b.app"),
            Some((8080, "sbx_1-x".to_string()))
        );
        for not in [
            "127.0.0.1:3000",
            "localhost:3000",
            "0-abc.x",
            "70000-abc.x",
            "3000-.x",
            "abc-3000.x",
        ] {
            assert_eq!(host_target(not), None, "{not}");
        }
    }

    #[test]
    fn loopback_listeners_get_the_localhost_domain() {
        assert_eq!(
            domain_for(Some("127.0.0.1:41234")).as_deref(),
            Some("localhost:41234")
        );
        assert_eq!(
            domain_for(Some("[::1]:41234")).as_deref(),
            Some("localhost:41234")
        );
        assert_eq!(
            domain_for(Some("sandbox.example:443")).as_deref(),
            Some("sandbox.example:443")
        );
        assert_eq!(domain_for(None), None);
    }
}
