//! The SDKs' event socket, `/api/socket.io/`: Socket.IO 5 over Engine.IO 4 over a WebSocket,
//! the one transport the SDKs ask for.
//!
//! Served so that the SDKs connect quietly (without it they log, and a Node program that
//! never closes its client stays alive while `socket.io-client` retries). It carries no
//! events: every call on this listener returns once the engine is done, so the state the SDK
//! reads right after a call is final and the first poll of any wait (which the SDKs make at
//! once, connected or not) resolves it.
//!
//! The WebSocket is opened before the key is known (the SDKs send it in the Socket.IO
//! `CONNECT` packet, not a header); the connection is bounded like any upgraded one
//! (`sandcove::server::upgrade`: it counts toward the listener's cap and ends at shutdown),
//! and has [`WireConfig::pre_auth_timeout`](super::WireConfig::pre_auth_timeout) (default
//! [`HANDSHAKE_TIMEOUT`]) from its request to connect with the right key (compared in
//! constant time): a hard deadline of the upgrade itself, so a client that sends pings and
//! never reads the answers, or never sends `CONNECT`, is cut at it all the same. After that it
//! is closed when the client stops answering pings. Frames are capped at [`MAX_FRAME`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::{SinkExt as _, StreamExt as _};
use sandcove::server::auth::{keys_match, Credential};
use tokio_tungstenite::tungstenite::Message;

use super::ws;
use super::Wire;

/// Largest frame (or message across fragments) a client may send.
pub const MAX_FRAME: usize = ws::MAX_MESSAGE;
/// Default time from the WebSocket request to an accepted Socket.IO `CONNECT`.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Engine.IO's ping interval, announced to the client.
const PING_INTERVAL: Duration = Duration::from_secs(25);
/// How long after a ping the client may take to answer, announced to the client.
const PING_TIMEOUT: Duration = Duration::from_secs(20);

/// Session ids: they name a connection and grant nothing.
static SESSIONS: AtomicU64 = AtomicU64::new(1);

fn refuse(status: StatusCode, message: &str) -> Response {
    // Engine.IO's own error shape.
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::json!({"code": 3, "message": message}).to_string(),
    )
        .into_response()
}

/// `GET /api/socket.io/?EIO=4&transport=websocket` with a WebSocket upgrade.
pub(crate) async fn socket(State(wire): State<Wire>, mut request: Request) -> Response {
    let query = request.uri().query().unwrap_or("");
    let param = |name: &str| {
        query
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v)
    };
    if param("EIO") != Some("4") {
        return refuse(StatusCode::BAD_REQUEST, "Unsupported protocol version");
    }
    if param("transport") != Some("websocket") {
        return refuse(StatusCode::BAD_REQUEST, "Transport unknown");
    }
    let (upgrade, response) = match ws::accept(&mut request, None) {
        Ok(pair) => pair,
        Err(message) => return refuse(StatusCode::BAD_REQUEST, &message),
    };
    let api_key = wire.config.api_key.clone();
    upgrade
        .pre_auth_deadline(wire.config.pre_auth_timeout)
        .run(move |socket| async move {
            let _ = session(socket, &api_key).await;
        });
    response
}

/// Whether a Socket.IO `CONNECT` payload (after `40`) proves a credential the socket's
/// declaration accepts: its `token`, when there is one, must be `key` (the server's key); the
/// decision is the declared route's ([`super::event_socket_route`]).
fn connect_authorized(payload: &str, key: &str) -> bool {
    let token = serde_json::from_str::<serde_json::Value>(payload)
        .ok()
        .and_then(|v| v.get("token").and_then(|t| t.as_str()).map(str::to_string))
        .unwrap_or_default();
    let credential = if token.is_empty() {
        Credential::anonymous()
    } else if keys_match(token.as_bytes(), key.as_bytes()) {
        Credential::server_key()
    } else {
        return false;
    };
    super::event_socket_route()
        .decide(&credential, None)
        .is_ok()
}

/// Engine.IO's open, the Socket.IO handshake, then pings until either side leaves. Until
/// the handshake is accepted the upgrade's pre-auth deadline bounds all of it. WebSocket
/// pings are answered by tungstenite as it reads.
async fn session(mut socket: ws::Socket, key: &str) -> Result<(), ws::Error> {
    let sid = format!("sandcove-{}", SESSIONS.fetch_add(1, Ordering::Relaxed));
    let open = serde_json::json!({
        "sid": sid,
        "upgrades": [],
        "pingInterval": PING_INTERVAL.as_millis() as u64,
        "pingTimeout": PING_TIMEOUT.as_millis() as u64,
        "maxPayload": MAX_FRAME,
    });
    socket.send(Message::text(format!("0{open}"))).await?;
    loop {
        let text = match socket.next().await {
            None => return Ok(()),
            Some(Err(e)) => return Err(e),
            Some(Ok(Message::Close(_))) => {
                ws::answer_close(&mut socket).await;
                return Ok(());
            }
            Some(Ok(Message::Text(text))) => text,
            Some(Ok(_)) => continue,
        };
        if text == "2" {
            socket.send(Message::text("3")).await?;
        } else if let Some(packet) = text.strip_prefix("40") {
            // The main namespace only (`40/other,…` is another one).
            let refusal = if packet.starts_with('/') {
                "44/,{\"message\":\"Invalid namespace\"}"
            } else if !connect_authorized(packet, key) {
                "44{\"message\":\"Unauthorized: the token must be the server's API key\"}"
            } else {
                let ok = serde_json::json!({"sid": format!("{sid}-io")});
                socket.send(Message::text(format!("40{ok}"))).await?;
                break;
            };
            socket.send(Message::text(refusal)).await?;
            ws::close(&mut socket, 1000, "").await;
            return Ok(());
        }
    }
    socket.get_ref().authenticated();
    // A client silent for a whole interval plus the timeout after a ping is gone. Reading
    // is cut short by the timer without loss: tungstenite keeps a partly read frame.
    let mut pinged = false;
    let ended = loop {
        let wait = if pinged { PING_TIMEOUT } else { PING_INTERVAL };
        match tokio::time::timeout(wait, socket.next()).await {
            Err(_) if pinged => break Ok(()),
            Err(_) => {
                pinged = true;
                if let Err(e) = socket.send(Message::text("2")).await {
                    break Err(e);
                }
            }
            Ok(None) => break Ok(()),
            Ok(Some(Err(e))) => break Err(e),
            Ok(Some(Ok(Message::Close(_)))) => {
                ws::answer_close(&mut socket).await;
                return Ok(());
            }
            Ok(Some(Ok(Message::Text(text)))) => {
                pinged = false;
                match text.as_str() {
                    // Engine.IO close, Socket.IO disconnect.
                    "1" | "41" => break Ok(()),
                    "2" => {
                        if let Err(e) = socket.send(Message::text("3")).await {
                            break Err(e);
                        }
                    }
                    // Pongs, no-ops and client events: nothing to answer.
                    _ => {}
                }
            }
            Ok(Some(Ok(_))) => {}
        }
    };
    ws::close(&mut socket, 1000, "").await;
    ended
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_servers_key_connects() {
        assert!(connect_authorized(r#"{"token":"k-1"}"#, "k-1"));
        for payload in [r#"{"token":"k-2"}"#, r#"{"token":""}"#, "", "{}", "[1]"] {
            assert!(!connect_authorized(payload, "k-1"), "{payload}");
        }
    }
}
