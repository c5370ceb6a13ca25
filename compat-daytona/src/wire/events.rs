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
//! gets [`HANDSHAKE_TIMEOUT`] to connect with the right key (compared in constant time), and
//! is closed when the client stops answering pings. Frames are capped at [`MAX_FRAME`].

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::Wire;

/// Largest frame (or message across fragments) a client may send.
pub const MAX_FRAME: usize = 64 * 1024;
/// Time from the WebSocket opening to an accepted Socket.IO `CONNECT`.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Engine.IO's ping interval, announced to the client.
const PING_INTERVAL: Duration = Duration::from_secs(25);
/// How long after a ping the client may take to answer, announced to the client.
const PING_TIMEOUT: Duration = Duration::from_secs(20);
/// RFC 6455's key suffix for `Sec-WebSocket-Accept`.
const WEBSOCKET_GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

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
    let headers = request.headers();
    let websocket = headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    let version = headers
        .get(header::SEC_WEBSOCKET_VERSION)
        .and_then(|v| v.to_str().ok());
    let key = headers
        .get(header::SEC_WEBSOCKET_KEY)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|k| {
            base64::engine::general_purpose::STANDARD
                .decode(k)
                .is_ok_and(|raw| raw.len() == 16)
        })
        .map(str::to_string);
    let (true, Some("13"), Some(key)) = (websocket, version, key) else {
        return refuse(StatusCode::BAD_REQUEST, "Bad handshake method");
    };
    let upgrade = match sandcove::server::upgrade::prepare(&mut request) {
        Ok(u) => u,
        Err(e) => return refuse(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    let digest = ring::digest::digest(
        &ring::digest::SHA1_FOR_LEGACY_USE_ONLY,
        format!("{key}{WEBSOCKET_GUID}").as_bytes(),
    );
    let accept = base64::engine::general_purpose::STANDARD.encode(digest.as_ref());
    let api_key = wire.config.api_key.clone();
    upgrade.run(move |mut io| async move {
        let _ = session(&mut io, &api_key).await;
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::UPGRADE, "websocket")
        .header(header::CONNECTION, "Upgrade")
        .header(header::SEC_WEBSOCKET_ACCEPT, accept)
        .body(Body::empty())
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// One WebSocket message from the client.
enum Message {
    Text(String),
    /// A WebSocket ping: answered with a pong carrying the same bytes.
    Ping(Vec<u8>),
    /// Binary data, pongs: nothing the protocol here uses.
    Other,
    Close,
}

async fn read_frame_head<R: AsyncRead + Unpin>(io: &mut R) -> io::Result<(bool, u8, usize)> {
    let mut head = [0u8; 2];
    io.read_exact(&mut head).await?;
    let (fin, opcode) = (head[0] & 0x80 != 0, head[0] & 0x0f);
    if head[0] & 0x70 != 0 || head[1] & 0x80 == 0 {
        // Reserved bits (no extension was agreed), or an unmasked client frame.
        return Err(io::Error::new(io::ErrorKind::InvalidData, "bad frame"));
    }
    let len = match head[1] & 0x7f {
        126 => {
            let mut b = [0u8; 2];
            io.read_exact(&mut b).await?;
            u64::from(u16::from_be_bytes(b))
        }
        127 => {
            let mut b = [0u8; 8];
            io.read_exact(&mut b).await?;
            u64::from_be_bytes(b)
        }
        n => u64::from(n),
    };
    if len > MAX_FRAME as u64 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "frame too large",
        ));
    }
    Ok((fin, opcode, len as usize))
}

/// The next message. Not cancel-safe: a partly read frame is lost.
async fn read_message<R: AsyncRead + Unpin>(io: &mut R) -> io::Result<Message> {
    let mut message: Vec<u8> = Vec::new();
    let mut kind = None;
    loop {
        let (fin, opcode, len) = read_frame_head(io).await?;
        let mut mask = [0u8; 4];
        io.read_exact(&mut mask).await?;
        let mut payload = vec![0u8; len];
        io.read_exact(&mut payload).await?;
        for (i, b) in payload.iter_mut().enumerate() {
            *b ^= mask[i % 4];
        }
        match opcode {
            0x8 => return Ok(Message::Close),
            0x9 => return Ok(Message::Ping(payload)),
            0xA => return Ok(Message::Other),
            0x0..=0x2 => {
                if opcode != 0 {
                    kind = Some(opcode);
                }
                if message.len() + payload.len() > MAX_FRAME {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "message too large",
                    ));
                }
                message.extend_from_slice(&payload);
                if fin {
                    return Ok(match kind {
                        Some(0x1) => Message::Text(String::from_utf8(message).map_err(|_| {
                            io::Error::new(io::ErrorKind::InvalidData, "text is not UTF-8")
                        })?),
                        _ => Message::Other,
                    });
                }
            }
            _ => return Err(io::Error::new(io::ErrorKind::InvalidData, "bad opcode")),
        }
    }
}

async fn write_frame<W: AsyncWrite + Unpin>(io: &mut W, opcode: u8, data: &[u8]) -> io::Result<()> {
    let mut frame = vec![0x80 | opcode];
    match data.len() {
        n if n < 126 => frame.push(n as u8),
        n if n <= usize::from(u16::MAX) => {
            frame.push(126);
            frame.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            frame.push(127);
            frame.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    frame.extend_from_slice(data);
    io.write_all(&frame).await?;
    io.flush().await
}

async fn send_text<W: AsyncWrite + Unpin>(io: &mut W, text: &str) -> io::Result<()> {
    write_frame(io, 0x1, text.as_bytes()).await
}

/// Whether a Socket.IO `CONNECT` payload (after `40`) carries `key` as its `token`.
fn connect_authorized(payload: &str, key: &str) -> bool {
    let token = serde_json::from_str::<serde_json::Value>(payload)
        .ok()
        .and_then(|v| v.get("token").and_then(|t| t.as_str()).map(str::to_string))
        .unwrap_or_default();
    !token.is_empty() && super::constant_time_eq(token.as_bytes(), key.as_bytes())
}

/// Engine.IO's open, the Socket.IO handshake, then pings until either side leaves.
async fn session<S: AsyncRead + AsyncWrite + Unpin>(io: &mut S, key: &str) -> io::Result<()> {
    let sid = format!("sandcove-{}", SESSIONS.fetch_add(1, Ordering::Relaxed));
    let open = serde_json::json!({
        "sid": sid,
        "upgrades": [],
        "pingInterval": PING_INTERVAL.as_millis() as u64,
        "pingTimeout": PING_TIMEOUT.as_millis() as u64,
        "maxPayload": MAX_FRAME,
    });
    send_text(io, &format!("0{open}")).await?;
    let connected = tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
        loop {
            match read_message(io).await? {
                Message::Close => return Ok(false),
                Message::Ping(data) => write_frame(io, 0xA, &data).await?,
                Message::Other => {}
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
    })
    .await;
    match connected {
        Ok(Ok(true)) => {}
        Ok(Ok(false)) | Err(_) => {
            let _ = write_frame(io, 0x8, &1000u16.to_be_bytes()).await;
            return Ok(());
        }
        Ok(Err(e)) => return Err(e),
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
                Ok(Some(Message::Ping(data))) => write_frame(&mut writer, 0xA, &data).await?,
                Ok(Some(Message::Other)) => {}
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
    let _ = write_frame(&mut writer, 0x8, &1000u16.to_be_bytes()).await;
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
