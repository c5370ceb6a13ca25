//! The WebSocket server side the Daytona listener's sockets share, on `tokio-tungstenite`:
//! the opening handshake checked by tungstenite and taken over through
//! `sandcove::server::upgrade` (which bounds the taken-over connection: the listener's cap,
//! shutdown, an idle limit, a pre-auth deadline), then every frame read and written by
//! tungstenite within [`config`]'s bounds.
//!
//! tungstenite refuses unmasked client frames, reserved bits (no extension is agreed) and a
//! frame, or a message across fragments, past [`MAX_MESSAGE`]; it answers pings and a
//! client's close itself. What the server sends goes out in messages of at most
//! [`MAX_MESSAGE`] ([`send_binary`]), so its write buffer holds one message and a control
//! frame at most: a client that pings and never reads cannot grow it.

use std::future::Future;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue};
use axum::response::Response;
use base64::Engine as _;
use futures::SinkExt as _;
use sandcove::server::upgrade::{Upgrade, Upgraded};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::tungstenite::handshake::server::create_response_with_body;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};
pub(crate) use tokio_tungstenite::tungstenite::Error;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

/// Largest frame (or message across fragments) a client may send, and largest message the
/// server sends.
pub const MAX_MESSAGE: usize = 64 * 1024;
/// The most the server's write buffer holds: one message of at most [`MAX_MESSAGE`] and its
/// header, plus a pong or a close (tungstenite's automatic answers, at most 127 bytes).
const MAX_WRITE_BUFFER: usize = MAX_MESSAGE + 1024;
/// Bytes read from the connection at once (the buffer grows to a whole frame when one needs
/// it, never past [`MAX_MESSAGE`]).
const READ_BUFFER: usize = 16 * 1024;
/// Longest close reason sent (a control frame's payload is at most 125 bytes, 2 of them the
/// code).
const MAX_CLOSE_REASON: usize = 120;

/// A WebSocket on an upgraded connection of the listener.
pub(crate) type Socket = WebSocketStream<Upgraded>;

/// tungstenite's bounds for every socket here.
fn config() -> WebSocketConfig {
    WebSocketConfig::default()
        .read_buffer_size(READ_BUFFER)
        // Each send flushes: nothing waits in the buffer for more to come.
        .write_buffer_size(0)
        .max_write_buffer_size(MAX_WRITE_BUFFER)
        .max_message_size(Some(MAX_MESSAGE))
        .max_frame_size(Some(MAX_MESSAGE))
}

/// The server side of a WebSocket on `io`, the handshake done.
async fn server<S>(io: S) -> WebSocketStream<S>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    WebSocketStream::from_raw_socket(io, Role::Server, Some(config())).await
}

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

/// A checked handshake's pending upgrade, from [`accept`].
#[must_use = "an upgrade does nothing until `run`"]
pub(crate) struct Accepted(Upgrade);

impl Accepted {
    /// See [`Upgrade::pre_auth_deadline`]: the socket's task calls
    /// `socket.get_ref().authenticated()` once its peer has proved the key.
    pub(crate) fn pre_auth_deadline(self, limit: Duration) -> Self {
        Accepted(self.0.pre_auth_deadline(limit))
    }

    /// Once the `101` has gone out, run `task` on the socket (see [`Upgrade::run`]: the
    /// connection keeps its slot in the listener's cap and ends with `task`, at shutdown, at
    /// its idle limit or its pre-auth deadline).
    pub(crate) fn run<F, Fut>(self, task: F)
    where
        F: FnOnce(Socket) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.0
            .run(move |io| async move { task(server(io).await).await });
    }
}

/// Check the opening handshake of `request` and take its upgrade. On success: the pending
/// upgrade and the `101` answer to return (naming `protocol` when given: it must be one the
/// client offered). On failure: the error message (the caller answers it in its own shape).
pub(crate) fn accept(
    request: &mut Request,
    protocol: Option<&str>,
) -> Result<(Accepted, Response), String> {
    // tungstenite checks the method, version and headers and derives the accept key; the
    // key must also be 16 bytes in base64 (RFC 6455 §4.2.1), which it leaves to the server.
    let key_ok = request
        .headers()
        .get(header::SEC_WEBSOCKET_KEY)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|k| {
            base64::engine::general_purpose::STANDARD
                .decode(k.trim())
                .is_ok_and(|raw| raw.len() == 16)
        });
    let mut response = create_response_with_body(request, Body::empty)
        .ok()
        .filter(|_| key_ok)
        .ok_or("Bad handshake method: a WebSocket upgrade (version 13) is needed")?;
    let upgrade = sandcove::server::upgrade::prepare(request).map_err(|e| e.to_string())?;
    if let Some(protocol) = protocol {
        let value = HeaderValue::from_str(protocol).map_err(|e| e.to_string())?;
        response
            .headers_mut()
            .insert(header::SEC_WEBSOCKET_PROTOCOL, value);
    }
    Ok((Accepted(upgrade), response))
}

/// Send `data` as binary messages of at most [`MAX_MESSAGE`] bytes, each led by `lead` (a
/// stream's mark, or nothing). A cut never splits a UTF-8 character, so a client decoding
/// each message as text sees whole characters.
pub(crate) async fn send_binary<S>(
    socket: &mut WebSocketStream<S>,
    lead: &[u8],
    mut data: &[u8],
) -> Result<(), Error>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let room = MAX_MESSAGE - lead.len();
    loop {
        let mut end = data.len().min(room);
        // Back off over continuation bytes (at most 3) to a character's start.
        while end < data.len() && end > room - 4 && data[end] & 0xC0 == 0x80 {
            end -= 1;
        }
        let mut message = Vec::with_capacity(lead.len() + end);
        message.extend_from_slice(lead);
        message.extend_from_slice(&data[..end]);
        socket.send(Message::binary(message)).await?;
        data = &data[end..];
        if data.is_empty() {
            return Ok(());
        }
    }
}

/// Close with `code` (1000: normal; 1011: the server failed) and `reason`, cut to fit a
/// control frame. Nothing is awaited from the client: the caller drops the socket next.
pub(crate) async fn close<S>(socket: &mut WebSocketStream<S>, code: u16, reason: &str)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut end = reason.len().min(MAX_CLOSE_REASON);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    let frame = CloseFrame {
        code: code.into(),
        reason: reason[..end].to_string().into(),
    };
    let _ = socket.close(Some(frame)).await;
}

/// After the client's close: send tungstenite's answer to it (queued when the close was
/// read), then the caller drops the socket.
pub(crate) async fn answer_close<S>(socket: &mut WebSocketStream<S>)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let _ = socket.close(None).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt as _;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
    use tokio_tungstenite::tungstenite::error::{CapacityError, ProtocolError};

    /// A masked client frame.
    fn client_frame(opcode: u8, fin: bool, data: &[u8]) -> Vec<u8> {
        let mask = [1u8, 2, 3, 4];
        let mut f = vec![if fin { 0x80 } else { 0 } | opcode];
        match data.len() {
            n if n < 126 => f.push(0x80 | n as u8),
            n if n <= usize::from(u16::MAX) => {
                f.push(0x80 | 126);
                f.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                f.push(0x80 | 127);
                f.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        f.extend_from_slice(&mask);
        f.extend(data.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        f
    }

    /// A server socket and the client's raw end of its connection.
    async fn pair(capacity: usize) -> (WebSocketStream<DuplexStream>, DuplexStream) {
        let (client, io) = tokio::io::duplex(capacity);
        (server(io).await, client)
    }

    /// The server's next message, from what the client wrote.
    async fn next(
        socket: &mut WebSocketStream<DuplexStream>,
    ) -> Option<Result<Message, tokio_tungstenite::tungstenite::Error>> {
        tokio::time::timeout(Duration::from_secs(30), socket.next())
            .await
            .expect("the server reads a message or fails")
    }

    #[tokio::test]
    async fn messages_are_unmasked_and_reassembled() {
        let (mut socket, mut client) = pair(1 << 20).await;
        let mut bytes = client_frame(0x2, false, b"ab");
        bytes.extend(client_frame(0x0, true, b"cd"));
        bytes.extend(client_frame(0x1, true, b"hi"));
        client.write_all(&bytes).await.unwrap();
        assert!(
            matches!(next(&mut socket).await, Some(Ok(Message::Binary(b))) if b == b"abcd"[..])
        );
        assert!(matches!(next(&mut socket).await, Some(Ok(Message::Text(t))) if t == "hi"));
    }

    #[tokio::test]
    async fn unmasked_frames_are_refused() {
        let (mut socket, mut client) = pair(1 << 20).await;
        client.write_all(&[0x82u8, 0x01, b'x']).await.unwrap();
        assert!(matches!(
            next(&mut socket).await,
            Some(Err(Error::Protocol(ProtocolError::UnmaskedFrameFromClient)))
        ));
    }

    /// A frame of [`MAX_MESSAGE`] bytes is read; one byte more is refused from its header,
    /// before its payload is read or held.
    #[tokio::test]
    async fn a_frame_past_the_bound_is_refused() {
        let (mut socket, mut client) = pair(1 << 20).await;
        let at_limit = vec![b'a'; MAX_MESSAGE];
        client
            .write_all(&client_frame(0x2, true, &at_limit))
            .await
            .unwrap();
        assert!(
            matches!(next(&mut socket).await, Some(Ok(Message::Binary(b))) if b.len() == MAX_MESSAGE)
        );
        let over = vec![b'a'; MAX_MESSAGE + 1];
        client
            .write_all(&client_frame(0x2, true, &over))
            .await
            .unwrap();
        assert!(matches!(
            next(&mut socket).await,
            Some(Err(Error::Capacity(CapacityError::MessageTooLong { .. })))
        ));
    }

    /// Fragments of [`MAX_MESSAGE`] bytes in all make a message; one byte more is refused.
    #[tokio::test]
    async fn a_message_past_the_bound_across_fragments_is_refused() {
        let (mut socket, mut client) = pair(1 << 20).await;
        let half = vec![b'a'; MAX_MESSAGE / 2];
        let mut bytes = client_frame(0x2, false, &half);
        bytes.extend(client_frame(0x0, true, &half));
        client.write_all(&bytes).await.unwrap();
        assert!(
            matches!(next(&mut socket).await, Some(Ok(Message::Binary(b))) if b.len() == MAX_MESSAGE)
        );
        let mut bytes = client_frame(0x2, false, &half);
        bytes.extend(client_frame(0x0, false, &half));
        bytes.extend(client_frame(0x0, true, b"x"));
        client.write_all(&bytes).await.unwrap();
        assert!(matches!(
            next(&mut socket).await,
            Some(Err(Error::Capacity(CapacityError::MessageTooLong { .. })))
        ));
    }

    /// What the server sends comes in messages of at most [`MAX_MESSAGE`] bytes, each led by
    /// its mark, cut between characters; together they carry every byte in order.
    #[tokio::test]
    async fn what_the_server_sends_is_cut_into_bounded_messages() {
        let (mut socket, mut client) = pair(4 << 20).await;
        // 'é' is two bytes: with a 3-byte lead the first cut falls inside one.
        let text = "é".repeat(MAX_MESSAGE);
        send_binary(&mut socket, b"\x01\x01\x01", text.as_bytes())
            .await
            .unwrap();
        drop(socket);
        let mut raw = Vec::new();
        client.read_to_end(&mut raw).await.unwrap();
        let mut joined = Vec::new();
        let mut messages = 0;
        let mut rest = &raw[..];
        while !rest.is_empty() {
            assert_eq!(rest[0], 0x82, "an unfragmented binary frame");
            let (len, head) = match rest[1] {
                126 => (usize::from(u16::from_be_bytes([rest[2], rest[3]])), 4),
                127 => (
                    u64::from_be_bytes(rest[2..10].try_into().unwrap()) as usize,
                    10,
                ),
                n => (usize::from(n), 2),
            };
            assert!(len <= MAX_MESSAGE, "{len}");
            let payload = &rest[head..head + len];
            assert_eq!(&payload[..3], b"\x01\x01\x01");
            assert!(
                std::str::from_utf8(&payload[3..]).is_ok(),
                "whole characters"
            );
            joined.extend_from_slice(&payload[3..]);
            messages += 1;
            rest = &rest[head + len..];
        }
        assert_eq!(joined, text.as_bytes());
        assert_eq!(messages, 3);
    }

    /// A client that pings and never reads: the pongs that cannot go out do not pile up in
    /// the server's write buffer past its bound. Once it is full the server's next message
    /// fails at once (the socket then ends) instead of queueing behind them.
    #[tokio::test]
    async fn pongs_a_client_never_reads_stay_within_the_write_buffer() {
        let (mut socket, mut client) = pair(1024).await;
        let pings = 4 * MAX_WRITE_BUFFER / 125;
        let writer = tokio::spawn(async move {
            let ping = client_frame(0x9, true, &[b'p'; 125]);
            for _ in 0..pings {
                client.write_all(&ping).await.unwrap();
            }
            client
        });
        for _ in 0..pings {
            assert!(matches!(
                next(&mut socket).await,
                Some(Ok(Message::Ping(_)))
            ));
        }
        let _client = writer.await.unwrap();
        let sent = tokio::time::timeout(
            Duration::from_secs(30),
            socket.send(Message::binary(vec![0u8; MAX_MESSAGE])),
        )
        .await
        .expect("the send fails rather than waiting behind unread pongs");
        assert!(matches!(sent, Err(Error::WriteBufferFull(_))), "{sent:?}");
    }

    #[tokio::test]
    async fn a_close_reason_is_cut_to_fit_a_control_frame() {
        let (mut socket, mut client) = pair(4096).await;
        close(&mut socket, 1011, &"é".repeat(200)).await;
        drop(socket);
        let mut raw = Vec::new();
        client.read_to_end(&mut raw).await.unwrap();
        assert_eq!(raw[0], 0x88);
        let len = usize::from(raw[1]);
        assert!(len <= 125, "{len}");
        assert_eq!(&raw[2..4], &1011u16.to_be_bytes());
        assert!(std::str::from_utf8(&raw[4..2 + len]).is_ok());
    }
}
