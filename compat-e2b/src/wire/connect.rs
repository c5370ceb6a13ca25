//! The slice of the Connect protocol envd speaks with E2B's SDKs: the JSON codec only, unary
//! calls as plain JSON bodies, server streams as enveloped JSON messages.
//!
//! An envelope is one flag byte, a big-endian `u32` length and that many bytes of JSON. Flag
//! `0x02` marks the last envelope of a stream, whose payload is `{}` or
//! `{"error":{"code","message"}}`; flag `0x01` (compression) is never used here and refused
//! on input.

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::errors::SandboxException;

/// Content type of a server stream with the JSON codec.
pub const STREAM_CONTENT_TYPE: &str = "application/connect+json";
/// Flag of the end-of-stream envelope.
pub const END_STREAM: u8 = 0x02;
/// Flag of a compressed envelope (refused).
pub const COMPRESSED: u8 = 0x01;
/// Length of an envelope's header.
pub const HEADER_LEN: usize = 5;

/// A Connect error code (the subset envd uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// `invalid_argument` (400).
    InvalidArgument,
    /// `unauthenticated` (401).
    Unauthenticated,
    /// `permission_denied` (403).
    PermissionDenied,
    /// `not_found` (404).
    NotFound,
    /// `already_exists` (409).
    AlreadyExists,
    /// `failed_precondition` (400).
    FailedPrecondition,
    /// `resource_exhausted` (429).
    ResourceExhausted,
    /// `internal` (500).
    Internal,
    /// `unimplemented` (501).
    Unimplemented,
    /// `unavailable` (503).
    Unavailable,
    /// `deadline_exceeded` (504).
    DeadlineExceeded,
}

impl Code {
    /// The code's wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Code::InvalidArgument => "invalid_argument",
            Code::Unauthenticated => "unauthenticated",
            Code::PermissionDenied => "permission_denied",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::FailedPrecondition => "failed_precondition",
            Code::ResourceExhausted => "resource_exhausted",
            Code::Internal => "internal",
            Code::Unimplemented => "unimplemented",
            Code::Unavailable => "unavailable",
            Code::DeadlineExceeded => "deadline_exceeded",
        }
    }

    /// The HTTP status of a unary error with this code (Connect's table).
    pub fn http_status(self) -> StatusCode {
        match self {
            Code::InvalidArgument | Code::FailedPrecondition => StatusCode::BAD_REQUEST,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::AlreadyExists => StatusCode::CONFLICT,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        }
    }
}

/// An error on its way to a Connect client: as a unary answer, or as the end of a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectError {
    /// The code.
    pub code: Code,
    /// The message the SDK puts in its exception.
    pub message: String,
}

impl ConnectError {
    /// An error with `code` and `message`.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        ConnectError {
            code,
            message: message.into(),
        }
    }

    /// `{"code":…,"message":…}`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({"code": self.code.as_str(), "message": self.message})
    }
}

impl From<SandboxException> for ConnectError {
    /// The one mapping from E2B's exception classes to Connect codes, chosen so that the
    /// SDK raises the same class again (see `e2b/envd/rpc.py`).
    fn from(e: SandboxException) -> Self {
        let code = match &e {
            SandboxException::InvalidArgument { .. } => Code::InvalidArgument,
            SandboxException::NotFound { .. }
            | SandboxException::FileNotFound { .. }
            | SandboxException::SandboxNotFound { .. } => Code::NotFound,
            SandboxException::Timeout { .. } => Code::DeadlineExceeded,
            SandboxException::Authentication { .. } => Code::Unauthenticated,
            SandboxException::RateLimit { .. } | SandboxException::NotEnoughSpace { .. } => {
                Code::ResourceExhausted
            }
            // Neither SDK has a class of its own for a refusal: `unimplemented` is its
            // `SandboxException`, with the alternative in the message.
            SandboxException::NotSupported { .. } => Code::Unimplemented,
            SandboxException::Template { .. } => Code::FailedPrecondition,
            _ if matches!(e.core_error(), Some(sandcove::Error::Forbidden { .. })) => {
                Code::PermissionDenied
            }
            _ => Code::Internal,
        };
        ConnectError::new(code, e.to_string())
    }
}

impl From<sandcove::Error> for ConnectError {
    fn from(e: sandcove::Error) -> Self {
        SandboxException::from(e).into()
    }
}

impl IntoResponse for ConnectError {
    /// A unary error answer: the code's status and a JSON body.
    fn into_response(self) -> Response {
        let body = serde_json::to_vec(&self.to_json()).unwrap_or_default();
        (
            self.code.http_status(),
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            body,
        )
            .into_response()
    }
}

/// One envelope: `flags`, the payload's length (big-endian `u32`), the payload.
pub fn envelope(flags: u8, payload: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.push(flags);
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    Bytes::from(out)
}

/// A stream message envelope holding `message` as JSON.
pub fn message(message: &serde_json::Value) -> Bytes {
    envelope(0, &serde_json::to_vec(message).unwrap_or_default())
}

/// The end-of-stream envelope: `{}` on success, else `{"error":…}`.
pub fn end_stream(error: Option<&ConnectError>) -> Bytes {
    let payload = match error {
        None => serde_json::json!({}),
        Some(e) => serde_json::json!({"error": e.to_json()}),
    };
    envelope(
        END_STREAM,
        &serde_json::to_vec(&payload).unwrap_or_default(),
    )
}

/// The single message of a server-stream request body: exactly one uncompressed envelope,
/// not an end-of-stream one, whose length matches the body.
pub fn single_message(body: &[u8]) -> Result<&[u8], ConnectError> {
    let bad = |why: &str| ConnectError::new(Code::InvalidArgument, why.to_string());
    if body.len() < HEADER_LEN {
        return Err(bad("the request is not a Connect envelope"));
    }
    let flags = body[0];
    if flags & COMPRESSED != 0 {
        return Err(ConnectError::new(
            Code::Unimplemented,
            "compressed messages are not supported (send connect-content-encoding: identity)",
        ));
    }
    if flags != 0 {
        return Err(bad("unexpected envelope flags in a request"));
    }
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    if body.len() - HEADER_LEN != len {
        return Err(bad(
            "the envelope's length does not match the request body (one message expected)",
        ));
    }
    Ok(&body[HEADER_LEN..])
}

/// Splits the body of a client-stream request into its messages as the bytes arrive: each
/// envelope at most `limit` bytes, uncompressed, not end-of-stream (clients end the body
/// instead).
#[derive(Debug)]
pub struct EnvelopeReader {
    buffer: Vec<u8>,
    limit: usize,
}

impl EnvelopeReader {
    /// A reader refusing messages larger than `limit` bytes.
    pub fn new(limit: usize) -> Self {
        EnvelopeReader {
            buffer: Vec::new(),
            limit,
        }
    }

    /// Add received bytes; the complete messages they finish, in order. A bad header is an
    /// error as soon as its five bytes are in, before its payload is buffered.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<Vec<u8>>, ConnectError> {
        self.buffer.extend_from_slice(bytes);
        let mut out = Vec::new();
        loop {
            if self.buffer.len() < HEADER_LEN {
                return Ok(out);
            }
            let flags = self.buffer[0];
            if flags & COMPRESSED != 0 {
                return Err(ConnectError::new(
                    Code::Unimplemented,
                    "compressed messages are not supported (send connect-content-encoding: identity)",
                ));
            }
            if flags != 0 {
                return Err(ConnectError::new(
                    Code::InvalidArgument,
                    "unexpected envelope flags in a request",
                ));
            }
            let len = u32::from_be_bytes([
                self.buffer[1],
                self.buffer[2],
                self.buffer[3],
                self.buffer[4],
            ]) as usize;
            if len > self.limit {
                return Err(ConnectError::new(
                    Code::ResourceExhausted,
                    format!("a request message is larger than {} bytes", self.limit),
                ));
            }
            if self.buffer.len() < HEADER_LEN + len {
                return Ok(out);
            }
            out.push(self.buffer[HEADER_LEN..HEADER_LEN + len].to_vec());
            self.buffer.drain(..HEADER_LEN + len);
        }
    }

    /// The body ended: an error if it stopped inside an envelope.
    pub fn finish(&self) -> Result<(), ConnectError> {
        if self.buffer.is_empty() {
            Ok(())
        } else {
            Err(ConnectError::new(
                Code::InvalidArgument,
                "the request body ended inside an envelope",
            ))
        }
    }
}

/// Parse a request message (JSON) into `T`.
pub fn parse<T: serde::de::DeserializeOwned>(json: &[u8]) -> Result<T, ConnectError> {
    serde_json::from_slice(json)
        .map_err(|e| ConnectError::new(Code::InvalidArgument, format!("invalid request: {e}")))
}

/// A stream answer: status 200, `application/connect+json`, the given body.
pub fn stream_response(body: Body) -> Response {
    let mut response = Response::new(body);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(STREAM_CONTENT_TYPE),
    );
    response
}

/// A stream that fails before its first message: a complete stream holding only the error.
pub fn stream_error(error: ConnectError) -> Response {
    stream_response(Body::from(end_stream(Some(&error))))
}

/// A unary success answer.
pub fn unary_ok(value: serde_json::Value) -> Response {
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        serde_json::to_vec(&value).unwrap_or_default(),
    )
        .into_response()
}

/// `Connect-Timeout-Ms`, when present and valid (at most 10 digits, as the spec says).
pub fn timeout_ms(headers: &HeaderMap) -> Result<Option<u64>, ConnectError> {
    match headers.get("connect-timeout-ms") {
        None => Ok(None),
        Some(v) => {
            let text = v.to_str().unwrap_or("");
            if text.is_empty() || text.len() > 10 || !text.bytes().all(|b| b.is_ascii_digit()) {
                return Err(ConnectError::new(
                    Code::InvalidArgument,
                    format!("invalid connect-timeout-ms '{text}'"),
                ));
            }
            Ok(text.parse().ok())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_are_flag_length_payload() {
        assert_eq!(&envelope(0, b"{}")[..], &[0, 0, 0, 0, 2, b'{', b'}']);
        let end = end_stream(None);
        assert_eq!(&end[..], &[2, 0, 0, 0, 2, b'{', b'}']);
        let err = end_stream(Some(&ConnectError::new(Code::DeadlineExceeded, "late")));
        assert_eq!(err[0], END_STREAM);
        let len = u32::from_be_bytes([err[1], err[2], err[3], err[4]]) as usize;
        assert_eq!(len, err.len() - HEADER_LEN);
        let body: serde_json::Value = serde_json::from_slice(&err[HEADER_LEN..]).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"error": {"code": "deadline_exceeded", "message": "late"}})
        );
    }

    #[test]
    fn a_request_is_exactly_one_plain_envelope() {
        let ok = envelope(0, br#"{"a":1}"#);
        assert_eq!(single_message(&ok).unwrap(), br#"{"a":1}"#);
        // One byte short, one byte long, compressed, end-of-stream, truncated header.
        assert!(single_message(&ok[..ok.len() - 1]).is_err());
        let mut long = ok.to_vec();
        long.push(b' ');
        assert!(single_message(&long).is_err());
        let mut compressed = ok.to_vec();
        compressed[0] = COMPRESSED;
        assert_eq!(
            single_message(&compressed).unwrap_err().code,
            Code::Unimplemented
        );
        let mut end = ok.to_vec();
        end[0] = END_STREAM;
        assert!(single_message(&end).is_err());
        assert!(single_message(&ok[..4]).is_err());
    }

    #[test]
    fn client_streams_split_into_messages_across_chunks() {
        let mut body = envelope(0, br#"{"a":1}"#).to_vec();
        body.extend_from_slice(&envelope(0, b"{}"));
        // Fed one byte at a time, the two messages come out whole, in order.
        let mut reader = EnvelopeReader::new(64);
        let mut messages = Vec::new();
        for b in &body {
            messages.extend(reader.push(std::slice::from_ref(b)).unwrap());
        }
        assert_eq!(messages, vec![br#"{"a":1}"#.to_vec(), b"{}".to_vec()]);
        reader.finish().unwrap();
        // Cut one byte short: the end is an error.
        let mut reader = EnvelopeReader::new(64);
        assert_eq!(reader.push(&body[..body.len() - 1]).unwrap().len(), 1);
        assert!(reader.finish().is_err());
        // A header announcing more than the limit is refused before its payload arrives.
        let mut reader = EnvelopeReader::new(4);
        assert_eq!(
            reader.push(&[0, 0, 0, 0, 5]).unwrap_err().code,
            Code::ResourceExhausted
        );
        let mut reader = EnvelopeReader::new(64);
        assert_eq!(
            reader.push(&[COMPRESSED, 0, 0, 0, 0]).unwrap_err().code,
            Code::Unimplemented
        );
        let mut reader = EnvelopeReader::new(64);
        assert!(reader.push(&[END_STREAM, 0, 0, 0, 0]).is_err());
    }

    #[test]
    fn codes_have_connect_statuses() {
        for (code, name, status) in [
            (Code::InvalidArgument, "invalid_argument", 400),
            (Code::Unauthenticated, "unauthenticated", 401),
            (Code::NotFound, "not_found", 404),
            (Code::ResourceExhausted, "resource_exhausted", 429),
            (Code::Unimplemented, "unimplemented", 501),
            (Code::DeadlineExceeded, "deadline_exceeded", 504),
        ] {
            assert_eq!(code.as_str(), name);
            assert_eq!(code.http_status().as_u16(), status);
        }
    }

    #[test]
    fn timeouts_parse_strictly() {
        let mut h = HeaderMap::new();
        assert_eq!(timeout_ms(&h).unwrap(), None);
        h.insert("connect-timeout-ms", HeaderValue::from_static("60000"));
        assert_eq!(timeout_ms(&h).unwrap(), Some(60000));
        for bad in ["-1", "1.5", "12345678901", ""] {
            h.insert("connect-timeout-ms", HeaderValue::from_static(bad));
            assert!(timeout_ms(&h).is_err(), "{bad}");
        }
    }
}
