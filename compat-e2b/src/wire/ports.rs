//! Sandbox ports on the E2B listener, for `get_host(port)`.
//!
//! The SDKs build a port's host as `{port}-{sandboxID}.{domain}` from the `domain` the
//! control plane returned. Sandcove returns the listener's own `host:port` there (with
//! `localhost` for a loopback listener), so the host is
//! `3000-<id>.localhost:<listener port>`: where that name resolves to the loopback (curl and
//! browsers resolve every `*.localhost`; so do systems whose resolver follows RFC 6761), or
//! with the `Host` header set by the client, the request reaches the listener, which
//! forwards it to that port inside the sandbox through the engine's preview (a private one,
//! its token added here, so the host-side preview port opens to nobody else).
//!
//! **Who may**: as on E2B, a sandbox's ports are public, so such a request needs no
//! credential — but only for sandboxes made through E2B's API (this listener or the Rust
//! facade: the `e2b/template` annotation); a sandbox made through the native API, Daytona's
//! or Blaxel's is never reachable this way, whatever its previews. E2B's traffic token
//! (`e2b-traffic-access-token`) is accepted too. A sandbox that is not reachable answers
//! exactly as one that does not exist.
//!
//! **What it holds**: the previews this forwarding makes are its own, at most
//! [`MAX_FORWARDED_PORTS`] per sandbox; past that the least recently used one no request is
//! using is closed first (or, with every one in use, the request gets `503`). So callers
//! without a credential cannot fill the sandbox's preview quota: its owner keeps the rest.
//!
//! A request asking to switch protocols (a WebSocket, say) is forwarded the same way; when
//! the sandbox answers `101`, the listener splices the two connections, bytes copied both
//! ways until either side ends, nothing moves for `UPGRADED_IDLE`, or the listener stops.
//! The spliced connection keeps its slot in the listener's connection cap.
//!
//! Since such a request needs no credential, the sandbox's answer is bounded by the forwarding
//! the previews use too (`sandcove::forward`, with the listener's bounds from
//! `sandcove::server::upstream`): its head must arrive within the listener's
//! `upstream_answer_timeout` (60 s unless configured) of the last byte of the request the
//! sandbox took, else the client gets `504` (`408` when it is the client that stopped sending
//! the request's body) and the connection to the sandbox is dropped; once the head is in, a
//! body that brings no byte for the listener's body idle bound ends, and the client's
//! connection with it. At most
//! [`WireConfig::max_host_requests_per_sandbox`](super::WireConfig) such requests (upgraded
//! connections included) run at once per sandbox; more get `503` with `Retry-After`, so whoever
//! knows one sandbox's id cannot take the listener's whole connection cap through it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use sandcove::server::auth::{Credential, Principal};

use super::Wire;

/// What port forwarding accepts: no credential (for E2B's public ports) or the sandbox's
/// traffic token.
pub(crate) const ACCEPTS: &[Principal] = &[Principal::TrafficToken, Principal::Anonymous];

/// The most previews port forwarding keeps open for one sandbox.
pub const MAX_FORWARDED_PORTS: usize = 16;

/// Sandboxes whose forwarding records are kept before those idle for [`FORGET_IDLE`] are
/// dropped (a sandbox destroyed without a later request to it would otherwise stay).
const MAX_TRACKED_SANDBOXES: usize = 4096;

/// How long a sandbox none of whose forwarded ports was used is remembered once
/// [`MAX_TRACKED_SANDBOXES`] are.
const FORGET_IDLE: std::time::Duration = std::time::Duration::from_secs(600);

/// One sandbox's forwarded ports: port → (requests using it, last use).
type PortsInUse = HashMap<u16, (usize, std::time::Instant)>;

/// The previews port forwarding made, per sandbox.
#[derive(Debug, Default)]
pub(crate) struct Forwarded(Mutex<HashMap<String, PortsInUse>>);

/// One request's use of a forwarded port, given back when dropped.
pub(crate) struct PortUse {
    forwarded: Arc<Forwarded>,
    id: String,
    port: u16,
}

impl Drop for PortUse {
    fn drop(&mut self) {
        let mut all = self.forwarded.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = all
            .get_mut(&self.id)
            .and_then(|ports| ports.get_mut(&self.port))
        {
            entry.0 = entry.0.saturating_sub(1);
            entry.1 = std::time::Instant::now();
        }
    }
}

/// What [`Forwarded::claim`] decided.
enum Claim {
    /// Use the port; `evict` is a port whose preview must be closed first.
    Use(PortUse, Option<u16>),
    /// Every forwarded port of the sandbox is in use.
    Full,
}

impl Forwarded {
    /// Count a request to `port` of sandbox `id` (a new port evicts the least recently used
    /// idle one when the sandbox has [`MAX_FORWARDED_PORTS`] already).
    fn claim(self: &Arc<Self>, id: &str, port: u16) -> Claim {
        let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if all.len() >= MAX_TRACKED_SANDBOXES && !all.contains_key(id) {
            let now = std::time::Instant::now();
            all.retain(|_, ports| {
                ports
                    .values()
                    .any(|(using, last)| *using > 0 || now.duration_since(*last) < FORGET_IDLE)
            });
        }
        let ports = all.entry(id.to_string()).or_default();
        let mut evict = None;
        if !ports.contains_key(&port) && ports.len() >= MAX_FORWARDED_PORTS {
            let idle = ports
                .iter()
                .filter(|(_, (using, _))| *using == 0)
                .min_by_key(|(_, (_, last))| *last)
                .map(|(p, _)| *p);
            let Some(idle) = idle else {
                return Claim::Full;
            };
            ports.remove(&idle);
            evict = Some(idle);
        }
        let entry = ports.entry(port).or_insert((0, std::time::Instant::now()));
        entry.0 += 1;
        Claim::Use(
            PortUse {
                forwarded: self.clone(),
                id: id.to_string(),
                port,
            },
            evict,
        )
    }

    /// Forget sandbox `id` (it is gone).
    fn forget(&self, id: &str) {
        let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        all.remove(id);
    }

    /// Whether port forwarding made the preview of `port` of sandbox `id`.
    fn holds(&self, id: &str, port: u16) -> bool {
        let all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        all.get(id).is_some_and(|ports| ports.contains_key(&port))
    }

    /// Forget a port whose preview could not be made (so it takes no place).
    fn release_unmade(&self, id: &str, port: u16) {
        let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(ports) = all.get_mut(id) {
            if ports.get(&port).is_some_and(|(using, _)| *using <= 1) {
                ports.remove(&port);
            }
            if ports.is_empty() {
                all.remove(id);
            }
        }
    }
}

/// Whether sandbox `info` was created with `allow_public_traffic=False`.
fn is_private(info: &sandcove::SandboxInfo) -> bool {
    info.annotations
        .get(crate::sandbox::PRIVATE_TRAFFIC_ANNOTATION)
        .is_some_and(|v| v == "true")
}

/// E2B's proxy's answer to a request without the traffic token for a sandbox that needs it:
/// `403` with its JSON body.
fn missing_traffic_token(id: &str) -> Response {
    let body = serde_json::json!({
        "sandboxId": id,
        "message": "Sandbox is secured with traffic access token. Token header \
                    'e2b-traffic-access-token' is missing",
        "code": 403,
    });
    (StatusCode::FORBIDDEN, axum::Json(body)).into_response()
}

/// The answer for a sandbox port that is not reachable this way: the same as for a sandbox
/// that does not exist, so nothing about other sandboxes leaks.
fn unreachable(id: &str) -> Response {
    bad_gateway(format!("The sandbox {id} was not found"))
}

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
    use sandcove::forward;
    use sandcove::server::{upgrade, upstream};
    let max = wire.config.max_host_requests_per_sandbox;
    let Some(slot) = wire.host_requests.take(id, max) else {
        return too_many(id, max);
    };
    let bounds = upstream::of(&request);
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
    // Who is asking: the traffic token, or nobody; a wrong token is refused outright.
    let credential = match request
        .headers()
        .get("e2b-traffic-access-token")
        .map(|v| v.to_str().unwrap_or(""))
    {
        Some(token) if wire.traffic_token_matches(id, token) => {
            Credential::for_sandbox(Principal::TrafficToken, id)
        }
        Some(_) => {
            return (
                StatusCode::UNAUTHORIZED,
                "invalid e2b-traffic-access-token for this sandbox",
            )
                .into_response()
        }
        None => Credential::anonymous(),
    };
    let declared = sandcove::server::auth::RouteAuth {
        method: None,
        path: super::PORT_FORWARD_ROUTE.into(),
        accepts: ACCEPTS,
    };
    if declared.decide(&credential, Some(id)).is_err() {
        return unreachable(id);
    }
    let sandbox = wire.client.sandbox(id);
    match sandbox.info().await {
        Ok(info) if super::is_e2b_sandbox(&info) => {
            // Created with `allow_public_traffic=False`: the traffic token is required, as
            // E2B's proxy requires it (a wrong one was refused above).
            if is_private(&info) && credential.principal != Principal::TrafficToken {
                return missing_traffic_token(id);
            }
        }
        Ok(_) => return unreachable(id),
        Err(e) if e.is_not_found() => {
            wire.forwarded.forget(id);
            return unreachable(id);
        }
        Err(e) => return bad_gateway(e.to_string()),
    }
    let previews = match sandbox.previews().await {
        Ok(p) => p,
        Err(e) if e.is_not_found() => return unreachable(id),
        Err(e) => return bad_gateway(e.to_string()),
    };
    // A preview that exists is used as it is; one made here is this forwarding's own, and
    // counts against its cap (not the owner's quota).
    let existing = previews.iter().find(|p| p.port == port).cloned();
    let ours = wire.forwarded.holds(id, port);
    let (port_use, preview) = match existing {
        Some(p) if !ours => (None, p),
        existing => {
            let (port_use, evict) = match wire.forwarded.claim(id, port) {
                Claim::Use(port_use, evict) => (port_use, evict),
                Claim::Full => return too_many(id, MAX_FORWARDED_PORTS),
            };
            if let Some(old) = evict {
                let _ = sandbox.close_preview(old).await;
            }
            let preview = match existing {
                Some(p) => p,
                None => match sandbox
                    .expose_port(sandcove::PreviewOptions::new(port))
                    .await
                {
                    Ok(p) => p,
                    Err(e) => {
                        drop(port_use);
                        wire.forwarded.release_unmade(id, port);
                        return bad_gateway(e.to_string());
                    }
                },
            };
            (Some(port_use), preview)
        }
    };
    let tcp = match tokio::net::TcpStream::connect(&preview.host).await {
        Ok(t) => t,
        Err(e) => return bad_gateway(format!("port {port} of sandbox {id}: {e}")),
    };
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
    let what = format!("port {port} of sandbox {id}");
    let request = axum::http::Request::from_parts(parts, body);
    let mut response = match forward::forward(tcp, request, bounds).await {
        Ok(response) => response,
        Err(forward::Failure::Broken(e)) => return bad_gateway(format!("{what}: {e}")),
        // Dropped, not left to the sandbox: nothing more comes from or goes to it.
        Err(failure) => return failure.answer(&what, &bounds).map(Body::from),
    };
    if let Some(upgrade) = upgrade {
        if response.status() == StatusCode::SWITCHING_PROTOCOLS {
            let upstream = hyper::upgrade::on(&mut response);
            upgrade.run(move |mut client| async move {
                let _slot = (slot, port_use);
                let Ok(upstream) = upstream.await else {
                    return;
                };
                let mut upstream = hyper_util::rt::TokioIo::new(upstream);
                let _ = upgrade::splice(&mut client, &mut upstream, UPGRADED_IDLE).await;
            });
            return response.map(Body::new);
        }
    }
    response.map(|body| Body::new(body.holding((slot, port_use))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwarding_records_stay_bounded() {
        let forwarded = Arc::new(Forwarded::default());
        let long_ago = std::time::Instant::now()
            .checked_sub(FORGET_IDLE * 2)
            .expect("an instant in the past");
        {
            let mut all = forwarded.0.lock().unwrap();
            for i in 0..MAX_TRACKED_SANDBOXES {
                let mut ports = PortsInUse::new();
                ports.insert(8000, (0, long_ago));
                all.insert(format!("gone-{i}"), ports);
            }
            let mut busy = PortsInUse::new();
            busy.insert(8000, (1, long_ago));
            all.insert("busy".into(), busy);
        }
        let Claim::Use(used, None) = forwarded.claim("new", 3000) else {
            panic!("a claim");
        };
        {
            let all = forwarded.0.lock().unwrap();
            assert_eq!(all.len(), 2, "only the busy sandbox and the new one remain");
            assert!(all.contains_key("busy") && all.contains_key("new"));
        }
        drop(used);
        forwarded.forget("new");
        assert!(!forwarded.holds("new", 3000));
    }

    #[test]
    fn a_sandbox_keeps_at_most_its_forwarded_ports() {
        let forwarded = Arc::new(Forwarded::default());
        let mut held = Vec::new();
        for p in 0..MAX_FORWARDED_PORTS as u16 {
            let Claim::Use(used, None) = forwarded.claim("a", 1000 + p) else {
                panic!("room for port {p}");
            };
            held.push(used);
        }
        assert!(
            matches!(forwarded.claim("a", 5000), Claim::Full),
            "all in use"
        );
        drop(held.remove(3));
        match forwarded.claim("a", 5000) {
            Claim::Use(_, Some(evicted)) => assert_eq!(evicted, 1003, "the idle one goes"),
            _ => panic!("an idle port is evicted"),
        }
    }

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
