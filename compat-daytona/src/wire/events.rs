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

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use sandcove::server::upgrade::Upgraded;

use sandcove::server::auth::{keys_match, Credential};

use super::ws::{self, pong, read_message, send_text, Message};
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
        .run(move |io| async move {
            let _ = session(io, &api_key).await;
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
/// the handshake is accepted the upgrade's pre-auth deadline bounds all of it.
async fn session(mut upgraded: Upgraded, key: &str) -> io::Result<()> {
    let io = &mut upgraded;
    let sid = format!("sandcove-{}", SESSIONS.fetch_add(1, Ordering::Relaxed));
    let open = serde_json::json!({
        "sid": sid,
        "upgrades": [],
        "pingInterval": PING_INTERVAL.as_millis() as u64,
        "pingTimeout": PING_TIMEOUT.as_millis() as u64,
        "maxPayload": MAX_FRAME,
    });
    send_text(io, &format!("0{open}")).await?;
    let connected: io::Result<bool> = async {
        loop {
            match read_message(io).await? {
                Message::Close => return Ok(false),
                Message::Ping(data) => pong(io, &data).await?,
                Message::Binary(_) | Message::Pong => {}
                Message::Text(text) => {
                    if text == "2" {
                        send_text(io, "3").await?;
                    } else if let Some(packet) = text.strip_prefix("40") {
                        // The main namespace only (`40/other,…` is another one).
                        if packet.starts_with('/') {
                            send_text(io, "44/,{\"message\":\"Invalid namespace\"}").await?;
                            return Ok(false);
                        }
                        if !connect_authorized(packet, key) {
                            send_text(
                                io,
                                "44{\"message\":\"Unauthorized: the token must be the server's API key\"}",
                            )
                            .await?;
                            return Ok(false);
                        }
                        let ok = serde_json::json!({"sid": format!("{sid}-io")});
                        send_text(io, &format!("40{ok}")).await?;
                        return Ok(true);
                    }
                }
            }
        }
    }
    .await;
    match connected {
        Ok(true) => io.authenticated(),
        Ok(false) => {
            let _ = ws::close(io, 1000, "").await;
            return Ok(());
        }
        Err(e) => return Err(e),
    }
    // Reads go on in one future that lives as long as the session (a read cut short by a
    // timer would lose a partly read frame); the pings and answers are written here.
    let (mut reader, mut writer) = tokio::io::split(io);
    let (messages, mut received) = tokio::sync::mpsc::channel::<Message>(4);
    let reading = async move {
        loop {
            let message = read_message(&mut reader).await?;
            if messages.send(message).await.is_err() {
                return Ok::<(), io::Error>(());
            }
        }
    };
    let answering = async {
        // A client silent for a whole interval plus the timeout after a ping is gone.
        let mut pinged = false;
        loop {
            let wait = if pinged { PING_TIMEOUT } else { PING_INTERVAL };
            match tokio::time::timeout(wait, received.recv()).await {
                Err(_) if pinged => return Ok(()),
                Err(_) => {
                    pinged = true;
                    send_text(&mut writer, "2").await?;
                }
                Ok(None) | Ok(Some(Message::Close)) => return Ok(()),
                Ok(Some(Message::Ping(data))) => pong(&mut writer, &data).await?,
                Ok(Some(Message::Binary(_) | Message::Pong)) => {}
                Ok(Some(Message::Text(text))) => {
                    pinged = false;
                    match text.as_str() {
                        // Engine.IO close, Socket.IO disconnect.
                        "1" | "41" => return Ok(()),
                        "2" => send_text(&mut writer, "3").await?,
                        // Pongs, no-ops and client events: nothing to answer.
                        _ => {}
                    }
                }
            }
        }
    };
    let ended: io::Result<()> = tokio::select! {
        read = reading => read,
        answered = answering => answered,
    };
    let _ = ws::close(&mut writer, 1000, "").await;
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
