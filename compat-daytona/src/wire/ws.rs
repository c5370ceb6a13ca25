//! The WebSocket (RFC 6455) server side the Daytona listener's sockets share: the opening
//! handshake on top of `sandcove::server::upgrade` (which bounds the taken-over connection:
//! the listener's cap, shutdown, an idle limit) and bounded frame reading and writing.
//!
//! Client frames must be masked; no extension is agreed, so reserved bits are refused; a
//! frame, or a message across fragments, is capped at [`MAX_MESSAGE`].

use std::io;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use sandcove::server::upgrade::Upgrade;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Largest frame (or message across fragments) a client may send.
pub const MAX_MESSAGE: usize = 64 * 1024;
/// RFC 6455's key suffix for `Sec-WebSocket-Accept`.
const WEBSOCKET_GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// Opcodes used here.
pub(crate) const TEXT: u8 = 0x1;
pub(crate) const BINARY: u8 = 0x2;
pub(crate) const CLOSE: u8 = 0x8;
const PING: u8 = 0x9;
const PONG: u8 = 0xA;

/// Whether `request` is a WebSocket opening handshake this module can accept.
pub(crate) fn is_websocket(request: &Request) -> bool {
    request
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
}

/// The subprotocols the client offers (`Sec-WebSocket-Protocol`, comma separated, possibly
/// over several headers).
pub(crate) fn offered_protocols(request: &Request) -> Vec<String> {
    request
        .headers()
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect()
}

/// Check the opening handshake of `request` and take its upgrade. On success: the pending
/// upgrade and the `101` answer to return (naming `protocol` when given: it must be one the
/// client offered). On failure: the error message (the caller answers it in its own shape).
pub(crate) fn accept(
    request: &mut Request,
    protocol: Option<&str>,
) -> Result<(Upgrade, Response), String> {
    let headers = request.headers();
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
    let (true, Some("13"), Some(key)) = (is_websocket(request), version, key) else {
        return Err("Bad handshake method: a WebSocket upgrade (version 13) is needed".into());
    };
    let upgrade = sandcove::server::upgrade::prepare(request).map_err(|e| e.to_string())?;
    let digest = ring::digest::digest(
        &ring::digest::SHA1_FOR_LEGACY_USE_ONLY,
        format!("{key}{WEBSOCKET_GUID}").as_bytes(),
    );
    let accept = base64::engine::general_purpose::STANDARD.encode(digest.as_ref());
    let mut response = Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::UPGRADE, "websocket")
        .header(header::CONNECTION, "Upgrade")
        .header(header::SEC_WEBSOCKET_ACCEPT, accept);
    if let Some(protocol) = protocol {
        let value = HeaderValue::from_str(protocol).map_err(|e| e.to_string())?;
        response = response.header(header::SEC_WEBSOCKET_PROTOCOL, value);
    }
    let response = response
        .body(Body::empty())
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response());
    Ok((upgrade, response))
}

/// One WebSocket message from the client.
pub(crate) enum Message {
    Text(String),
    Binary(Vec<u8>),
    /// A WebSocket ping: answered with a pong carrying the same bytes.
    Ping(Vec<u8>),
    /// Pongs: nothing to do.
    Pong,
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
    if len > MAX_MESSAGE as u64 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "frame too large",
        ));
    }
    Ok((fin, opcode, len as usize))
}

/// The next message. Not cancel-safe: a partly read frame is lost, so one task reads for
/// the whole life of a connection.
pub(crate) async fn read_message<R: AsyncRead + Unpin>(io: &mut R) -> io::Result<Message> {
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
            CLOSE => return Ok(Message::Close),
            PING => return Ok(Message::Ping(payload)),
            PONG => return Ok(Message::Pong),
            0x0..=0x2 => {
                if opcode != 0 {
                    kind = Some(opcode);
                }
                if message.len() + payload.len() > MAX_MESSAGE {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "message too large",
                    ));
                }
                message.extend_from_slice(&payload);
                if fin {
                    return match kind {
                        Some(TEXT) => String::from_utf8(message).map(Message::Text).map_err(|_| {
                            io::Error::new(io::ErrorKind::InvalidData, "text is not UTF-8")
                        }),
                        Some(BINARY) => Ok(Message::Binary(message)),
                        _ => Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            "continuation without a first frame",
                        )),
                    };
                }
            }
            _ => return Err(io::Error::new(io::ErrorKind::InvalidData, "bad opcode")),
        }
    }
}

/// Write one unfragmented, unmasked (server) frame.
pub(crate) async fn write_frame<W: AsyncWrite + Unpin>(
    io: &mut W,
    opcode: u8,
    data: &[u8],
) -> io::Result<()> {
    let mut frame = Vec::with_capacity(data.len() + 10);
    frame.push(0x80 | opcode);
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

/// A text frame.
pub(crate) async fn send_text<W: AsyncWrite + Unpin>(io: &mut W, text: &str) -> io::Result<()> {
    write_frame(io, TEXT, text.as_bytes()).await
}

/// A pong answering a ping's `data`.
pub(crate) async fn pong<W: AsyncWrite + Unpin>(io: &mut W, data: &[u8]) -> io::Result<()> {
    write_frame(io, PONG, data).await
}

/// A close frame with `code` (1000: normal; 1011: the server failed) and a reason, cut to
/// fit a control frame.
pub(crate) async fn close<W: AsyncWrite + Unpin>(
    io: &mut W,
    code: u16,
    reason: &str,
) -> io::Result<()> {
    let mut payload = code.to_be_bytes().to_vec();
    let mut end = reason.len().min(120);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    payload.extend_from_slice(&reason.as_bytes()[..end]);
    write_frame(io, CLOSE, &payload).await
}

/// The messages of a connection, read by a task of their own (the one task reading a
/// connection, see [`read_message`]). Dropping it stops that task, so the read half (and with
/// it the connection) never outlives the handler that holds it.
pub(crate) struct Incoming {
    received: tokio::sync::mpsc::Receiver<io::Result<Message>>,
    task: tokio::task::JoinHandle<()>,
}

impl Incoming {
    /// The next message; `None` once the reading task has stopped (after an error or a close).
    pub(crate) async fn recv(&mut self) -> Option<io::Result<Message>> {
        self.received.recv().await
    }
}

impl Drop for Incoming {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Read messages from `reader` until the client closes or errs; the channel's capacity bounds
/// what is held.
pub(crate) fn reader<R>(mut reader: R) -> Incoming
where
    R: AsyncRead + Unpin + Send + 'static,
{
    let (sender, received) = tokio::sync::mpsc::channel(4);
    let task = tokio::spawn(async move {
        loop {
            let message = read_message(&mut reader).await;
            let end = matches!(message, Err(_) | Ok(Message::Close));
            if sender.send(message).await.is_err() || end {
                return;
            }
        }
    });
    Incoming { received, task }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A masked client frame.
    fn client_frame(opcode: u8, fin: bool, data: &[u8]) -> Vec<u8> {
        let mask = [1u8, 2, 3, 4];
        let mut f = vec![if fin { 0x80 } else { 0 } | opcode];
        assert!(data.len() < 126);
        f.push(0x80 | data.len() as u8);
        f.extend_from_slice(&mask);
        f.extend(data.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        f
    }

    #[tokio::test]
    async fn messages_are_unmasked_and_reassembled() {
        let mut bytes = client_frame(BINARY, false, b"ab");
        bytes.extend(client_frame(0, true, b"cd"));
        bytes.extend(client_frame(TEXT, true, b"hi"));
        let mut io = &bytes[..];
        assert!(matches!(read_message(&mut io).await.unwrap(), Message::Binary(b) if b == b"abcd"));
        assert!(matches!(read_message(&mut io).await.unwrap(), Message::Text(t) if t == "hi"));
    }

    #[tokio::test]
    async fn unmasked_and_oversized_frames_are_refused() {
        let unmasked = [0x82u8, 0x01, b'x'];
        assert!(read_message(&mut &unmasked[..]).await.is_err());
        let mut huge = vec![0x82u8, 0x80 | 127];
        huge.extend_from_slice(&(MAX_MESSAGE as u64 + 1).to_be_bytes());
        huge.extend_from_slice(&[0, 0, 0, 0]);
        assert!(read_message(&mut &huge[..]).await.is_err());
    }

    /// A handler that stops (an ended PTY, a finished log) takes its connection with it: the
    /// reading task does not keep the connection open behind the listener's back.
    #[tokio::test]
    async fn dropping_the_incoming_side_closes_the_connection() {
        let (mut client, server) = tokio::io::duplex(64);
        let incoming = reader(server);
        drop(incoming);
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(std::time::Duration::from_secs(30), client.read(&mut byte))
            .await
            .expect("the connection is closed, not left open");
        assert_eq!(read.unwrap(), 0);
    }
}
