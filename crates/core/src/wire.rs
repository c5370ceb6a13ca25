//! The native HTTP API's wire contract: what `sandcove serve` (crate `sandcove-server`) and
//! its client, `HttpBackend` (crate `sandcove-http`), both speak. One definition, so the two
//! cannot drift apart.
//!
//! Every route lives under [`API_PREFIX`] and needs `Authorization: Bearer <key>`; the server
//! publishes the full list as an OpenAPI document at [`OPENAPI_PATH`].
//!
//! - **Control calls** send and receive JSON: the serde forms of the [`crate::types`] values.
//! - **Errors** are a JSON [`ErrorBody`] (`{"code": "not_found", "message": …, "fields": …}`)
//!   with the status [`status_for`] gives its code; [`error_from_response`] is the one place
//!   a status and body become an [`Error`], so every code maps back onto its own variant.
//! - **Streams** (process events, file downloads, watches) are a binary frame stream
//!   (`Content-Type:` [`FRAMES_CONTENT_TYPE`]), so output bytes cross unchanged: each frame is
//!   one kind byte, a big-endian `u32` payload length, then the payload.
//!
//!   | kind | payload |
//!   |---|---|
//!   | `o` | stdout bytes, raw |
//!   | `e` | stderr bytes, raw |
//!   | `d` | file bytes, raw |
//!   | `j` | one JSON value: a [`ProcessEvent`](crate::ProcessEvent) other than output (start, gap, exit), an [`FsEvent`](crate::FsEvent), or an image pull's [`PullEvent`](body::PullEvent) |
//!   | `x` | end of a download or watch (empty) |
//!   | `!` | an [`ErrorBody`]; the stream ends after it |
//!
//!   A process stream ends with its exit event, a download or watch with `x`, an image pull
//!   with its `pulled` event. A body that ends
//!   any other way (connection cut, server stopped, a truncated frame) yields an error as the
//!   stream's last item: output is never silently short.
//! - **Spawn** answers with the pid in the [`PID_HEADER`] header, then streams the events.
//! - **Uploads** are a frame stream in the request body (`Content-Type:`
//!   [`FRAMES_CONTENT_TYPE`]): `d` frames of at most [`frame::UPLOAD_MAX_PAYLOAD`] bytes, then
//!   `x` to commit, or `!` (an [`ErrorBody`]) to abandon the write. When the caller's source
//!   stream fails, the client sends `!` instead of cutting the connection and waits (at most
//!   [`UPLOAD_CLEANUP_WAIT`] plus a margin) for the answer, which the server sends only once
//!   its backend has discarded what it received: a failed upload leaves nothing behind by the
//!   time its error is returned. A framed body that ends without `x` or `!` is abandoned too,
//!   as is a raw body (`application/octet-stream`, for plain HTTP tools) that breaks off.
//!   An image import (`POST /v1/images/import`) sends its archive the same way.
//! - **Image pulls** answer one JSON [`ImageSummary`](crate::ImageSummary) once stored, or,
//!   asked with `Accept:` [`FRAMES_CONTENT_TYPE`], a frame stream of each layer's progress
//!   ([`PullEvent`](body::PullEvent)) ending with the image.
//! - **Stdin** is a `POST` whose raw body is written to the process.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{Error, ErrorBody, ErrorCode};

/// Path prefix of every API route.
pub const API_PREFIX: &str = "/v1";
/// The path segment under [`API_PREFIX`] of the server's signed file URLs:
/// `/v1/file-urls/{token}` (`GET` reads, `PUT` or `POST` writes). A sandbox's are minted by
/// `POST /v1/sandboxes/{id}/file-urls`, which answers a [`FileUrl`](crate::FileUrl) whose
/// `url` is that path; the client puts its own origin in front.
pub const FILE_URLS_SEGMENT: &str = "file-urls";
/// Path of the server's OpenAPI document.
pub const OPENAPI_PATH: &str = "/openapi.json";
/// Request header naming one logical operation (the [`OperationId`](crate::OperationId));
/// retries carry the same value.
pub const IDEMPOTENCY_HEADER: &str = "idempotency-key";
/// Response header of a spawn: the pid of the new process.
pub const PID_HEADER: &str = "x-sandcove-pid";
/// Content type of a frame stream (see the module docs).
pub const FRAMES_CONTENT_TYPE: &str = "application/vnd.sandcove.frames";
/// How long the server waits for its backend to discard an abandoned upload before it
/// answers anyway; the client waits a little longer for that answer.
pub const UPLOAD_CLEANUP_WAIT: Duration = Duration::from_secs(30);

/// The frame stream codec shared by the client and the server.
pub mod frame {
    /// Stdout bytes.
    pub const STDOUT: u8 = b'o';
    /// Stderr bytes.
    pub const STDERR: u8 = b'e';
    /// File bytes.
    pub const DATA: u8 = b'd';
    /// A JSON event.
    pub const JSON: u8 = b'j';
    /// End of a download or watch.
    pub const END: u8 = b'x';
    /// An error body; the last frame.
    pub const ERROR: u8 = b'!';
    /// Largest payload a decoder accepts; anything bigger is a protocol error.
    pub const MAX_PAYLOAD: usize = 64 * 1024 * 1024;
    /// Largest payload of one upload frame: bounds what the server buffers per upload.
    pub const UPLOAD_MAX_PAYLOAD: usize = 1024 * 1024;

    /// The 5-byte head of a frame with `len` payload bytes.
    pub fn head(kind: u8, len: usize) -> [u8; 5] {
        let [a, b, c, d] = (len as u32).to_be_bytes();
        [kind, a, b, c, d]
    }

    /// One frame: kind byte, big-endian `u32` length, payload.
    pub fn encode(kind: u8, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(5 + payload.len());
        out.extend_from_slice(&head(kind, payload.len()));
        out.extend_from_slice(payload);
        out
    }

    /// Splits a byte stream back into frames, whatever the chunk boundaries. Each byte is
    /// copied once, straight into the payload of the frame it belongs to (file chunks of a
    /// megabyte are never gathered in one buffer and then copied out again).
    #[derive(Debug)]
    pub struct Decoder {
        head: [u8; 5],
        head_len: usize,
        /// The frame being received: its kind, what arrived of its payload, and its length.
        partial: Option<(u8, Vec<u8>, usize)>,
        ready: std::collections::VecDeque<(u8, Vec<u8>)>,
        ready_bytes: usize,
        /// An oversized length was read: reported after the frames before it, then for ever.
        error: Option<String>,
        max: usize,
    }

    impl Default for Decoder {
        fn default() -> Self {
            Self::with_max_payload(MAX_PAYLOAD)
        }
    }

    impl Decoder {
        /// A decoder that refuses payloads over `max` bytes (never more than [`MAX_PAYLOAD`]).
        pub fn with_max_payload(max: usize) -> Self {
            Decoder {
                head: [0; 5],
                head_len: 0,
                partial: None,
                ready: Default::default(),
                ready_bytes: 0,
                error: None,
                max: max.min(MAX_PAYLOAD),
            }
        }

        /// Append received bytes.
        pub fn push(&mut self, mut bytes: &[u8]) {
            while !bytes.is_empty() && self.error.is_none() {
                if let Some((_, payload, len)) = &mut self.partial {
                    let take = (*len - payload.len()).min(bytes.len());
                    payload.extend_from_slice(&bytes[..take]);
                    bytes = &bytes[take..];
                    if payload.len() == *len {
                        if let Some((kind, payload, _)) = self.partial.take() {
                            self.complete(kind, payload);
                        }
                    }
                    continue;
                }
                let take = (5 - self.head_len).min(bytes.len());
                self.head[self.head_len..self.head_len + take].copy_from_slice(&bytes[..take]);
                self.head_len += take;
                bytes = &bytes[take..];
                if self.head_len < 5 {
                    continue;
                }
                self.head_len = 0;
                let [kind, a, b, c, d] = self.head;
                let len = u32::from_be_bytes([a, b, c, d]) as usize;
                if len > self.max {
                    self.error = Some(format!(
                        "frame of {len} bytes exceeds the {} limit",
                        self.max
                    ));
                } else if len == 0 {
                    self.complete(kind, Vec::new());
                } else {
                    // At most `max` bytes, announced by the peer: the room a payload needs
                    // once, rather than growth by doubling.
                    self.partial = Some((kind, Vec::with_capacity(len), len));
                }
            }
        }

        fn complete(&mut self, kind: u8, payload: Vec<u8>) {
            self.ready_bytes += 5 + payload.len();
            self.ready.push_back((kind, payload));
        }

        /// The next complete frame, if one has arrived; `Err` on an oversized length.
        pub fn next_frame(&mut self) -> Result<Option<(u8, Vec<u8>)>, String> {
            if let Some((kind, payload)) = self.ready.pop_front() {
                self.ready_bytes -= 5 + payload.len();
                return Ok(Some((kind, payload)));
            }
            match &self.error {
                Some(e) => Err(e.clone()),
                None => Ok(None),
            }
        }

        /// Bytes received that do not yet form a whole frame.
        pub fn pending(&self) -> usize {
            let partial = self
                .partial
                .as_ref()
                .map_or(0, |(_, payload, _)| 5 + payload.len());
            self.ready_bytes + self.head_len + partial
        }
    }
}

/// The HTTP status the server answers an error code with. [`error_from_response`] is its
/// inverse for bodies that carry a code.
pub fn status_for(code: ErrorCode) -> u16 {
    match code {
        ErrorCode::NotFound => 404,
        ErrorCode::AlreadyExists => 409,
        ErrorCode::Conflict => 412,
        ErrorCode::InvalidArgument => 400,
        ErrorCode::Timeout => 504,
        ErrorCode::PermissionDenied => 403,
        ErrorCode::Unauthenticated => 401,
        ErrorCode::InvalidState => 409,
        ErrorCode::NotSupported => 501,
        ErrorCode::Unavailable => 503,
        ErrorCode::RateLimited => 429,
        ErrorCode::FileTooLarge => 413,
        ErrorCode::Io => 500,
        ErrorCode::OutcomeUnknown => 502,
        ErrorCode::Destroyed => 410,
        ErrorCode::Forbidden => 403,
        _ => 500,
    }
}

/// The one mapping from an HTTP error answer to an [`Error`]: a JSON [`ErrorBody`] becomes
/// its own variant; any other body (a proxy's HTML page, plain text) is mapped by status.
/// `retry_after` is the `Retry-After` header, used when the body does not say.
pub fn error_from_response(status: u16, retry_after: Option<&str>, body: &[u8]) -> Error {
    let retry_after_ms = retry_after
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|s| s.saturating_mul(1000));
    if let Ok(parsed) = serde_json::from_slice::<ErrorBody>(body) {
        let err = Error::from_body(&parsed);
        return match err {
            Error::RateLimited {
                message,
                retry_after_ms: None,
            } => Error::RateLimited {
                message,
                retry_after_ms,
            },
            other => other,
        };
    }
    let text = String::from_utf8_lossy(&body[..body.len().min(200)]);
    let text = text.trim();
    let detail = if text.is_empty() {
        format!("HTTP {status}")
    } else {
        format!("HTTP {status}: {text}")
    };
    match status {
        400 | 413 | 414 | 422 => Error::invalid(detail),
        401 => Error::Unauthenticated { message: detail },
        403 => Error::PermissionDenied { what: detail },
        // Without a body there is no tombstone to rebuild: gone is not found.
        404 | 410 => Error::not_found(detail),
        408 | 504 => Error::Timeout { what: detail },
        409 => Error::AlreadyExists { what: detail },
        412 => Error::Conflict { what: detail },
        429 => Error::RateLimited {
            message: detail,
            retry_after_ms,
        },
        501 => Error::not_supported(detail, "a server whose backend supports it"),
        500..=599 => Error::Backend {
            message: detail,
            retryable: true,
        },
        _ => Error::backend(format!("unexpected answer: {detail}")),
    }
}

/// Request bodies of the routes that take more than one value.
pub mod body {
    use super::*;
    use crate::{MkdirOptions, Signal};

    /// `PUT …/timeout`.
    #[derive(Debug, Clone, Serialize, Deserialize)]
    pub struct SetTimeout {
        /// Seconds from now.
        pub timeout: f64,
    }

    /// `PUT …/on-timeout`.
    #[derive(Debug, Clone, Serialize, Deserialize)]
    pub struct SetOnTimeout {
        /// What the lease's end does (`destroy` or `pause`).
        pub on_timeout: crate::TimeoutAction,
    }

    /// `PUT …/labels`.
    #[derive(Debug, Clone, Serialize, Deserialize)]
    pub struct SetLabels {
        /// The new labels (replacing the old ones).
        pub labels: std::collections::BTreeMap<String, String>,
    }

    /// `POST …/processes/signal`.
    #[derive(Debug, Clone, Serialize, Deserialize)]
    pub struct SignalBody {
        /// The signal.
        pub signal: Signal,
    }

    /// `POST …/files/mkdir`.
    #[derive(Debug, Clone, Serialize, Deserialize)]
    pub struct Mkdir {
        /// The directory.
        pub path: String,
        /// How.
        #[serde(default)]
        pub options: MkdirOptions,
    }

    /// `POST …/files/rename`.
    #[derive(Debug, Clone, Serialize, Deserialize)]
    pub struct Rename {
        /// Old path.
        pub from: String,
        /// New path.
        pub to: String,
        /// How (no-clobber, as a user); absent from older clients: the defaults.
        #[serde(default)]
        pub options: crate::RenameOptions,
    }

    /// `POST …/files/copy`.
    #[derive(Debug, Clone, Serialize, Deserialize)]
    pub struct Copy {
        /// Source path.
        pub from: String,
        /// Destination path.
        pub to: String,
        /// How.
        #[serde(default)]
        pub options: crate::CopyOptions,
    }

    /// `POST …/files/chmod`.
    #[derive(Debug, Clone, Serialize, Deserialize)]
    pub struct Chmod {
        /// The path.
        pub path: String,
        /// New permission bits.
        pub mode: u32,
    }

    /// `POST …/previews/{port}/tokens`.
    #[derive(Debug, Clone, Default, Serialize, Deserialize)]
    pub struct NewToken {
        /// Expiry in ms since the epoch; `None` lasts as long as the sandbox.
        #[serde(default)]
        pub expires_at: Option<u64>,
    }

    /// `POST …/previews/{port}/tokens/revoke`: the token travels in the body, never in a URL
    /// (URLs end up in logs).
    #[derive(Debug, Clone, Default, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct RevokeToken {
        /// The token's value.
        pub token: String,
    }

    /// `POST …/snapshots`.
    #[derive(Debug, Clone, Default, Serialize, Deserialize)]
    pub struct NewSnapshot {
        /// Optional name.
        #[serde(default)]
        pub name: Option<String>,
        /// Keep processes and memory too ([`SnapshotOptions::memory`](crate::SnapshotOptions::memory)).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        pub memory: bool,
    }

    /// `POST /v1/volumes`.
    #[derive(Debug, Clone, Serialize, Deserialize)]
    pub struct NewVolume {
        /// Volume name.
        pub name: String,
    }

    /// `POST /v1/images/pull`, `/check`, `/inspect` and `/remove`: an image reference (in
    /// the body, since references hold `/` and `:`).
    #[derive(Debug, Clone, Serialize, Deserialize)]
    pub struct ImageReference {
        /// The reference (`python:3.12-slim`, `registry.example/team/app@sha256:…`).
        pub reference: String,
    }

    /// One `j` frame of `POST /v1/images/pull` answered as a frame stream (asked for with
    /// `Accept:` [`FRAMES_CONTENT_TYPE`]): layers' progress, then
    /// the pulled image, which ends the stream; a failure is an `!` frame instead.
    #[derive(Debug, Clone, Serialize, Deserialize)]
    #[serde(rename_all = "snake_case")]
    pub enum PullEvent {
        /// One layer's progress.
        Progress(crate::ImagePullProgress),
        /// The image is stored: the last frame.
        Pulled(crate::ImageSummary),
    }

    /// The query of `POST /v1/images/import`, whose body is the archive.
    #[derive(Debug, Clone, Default, Serialize, Deserialize)]
    pub struct ImportQuery {
        /// The reference to name the image with (an archive of one image only).
        #[serde(default)]
        pub tag: Option<String>,
    }
}
