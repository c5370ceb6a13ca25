//! The one public error type of the runtime client.

use serde::{Deserialize, Serialize};

/// Everything that can go wrong talking to a sandbox runtime.
///
/// Each variant names its subject so a message stands on its own. [`ErrorCode`] is the
/// machine-readable twin used on the wire: every variant has exactly one code.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The sandbox, process, file or other subject does not exist.
    #[error("{what} not found")]
    NotFound {
        /// What was looked for, e.g. `sandbox "abc"` or `file "/workspace/x"`.
        what: String,
    },
    /// Something with that identity exists already.
    #[error("{what} already exists")]
    AlreadyExists {
        /// What collided.
        what: String,
    },
    /// A compare-and-set precondition did not hold (someone else changed the value first):
    /// re-read, merge and retry.
    #[error("conflict: {what}")]
    Conflict {
        /// What did not match.
        what: String,
    },
    /// The request itself is wrong; retrying it unchanged cannot help.
    #[error("invalid argument: {message}")]
    InvalidArgument {
        /// What is wrong.
        message: String,
    },
    /// An operation ran out of time.
    #[error("timed out: {what}")]
    Timeout {
        /// What timed out.
        what: String,
    },
    /// The sandbox refused the operation (file permissions, read-only paths).
    #[error("permission denied: {what}")]
    PermissionDenied {
        /// What was refused.
        what: String,
    },
    /// The API key is missing or wrong.
    #[error("unauthenticated: {message}")]
    Unauthenticated {
        /// Why.
        message: String,
    },
    /// The sandbox is not in a state that allows this (e.g. paused, stopped).
    #[error("sandbox {id} is {state}: {message}")]
    InvalidState {
        /// The sandbox.
        id: String,
        /// Its state, in words.
        state: String,
        /// What could not be done.
        message: String,
    },
    /// This backend cannot do this at all. Raised before any effect.
    #[error("not supported: {feature} (instead: {alternative})")]
    NotSupported {
        /// What was asked for.
        feature: String,
        /// What to do instead.
        alternative: String,
    },
    /// The runtime cannot run on this host as configured.
    #[error("sandbox runtime unavailable: {reason} (remedy: {remedy})")]
    Unavailable {
        /// The cause.
        reason: String,
        /// How to fix it.
        remedy: String,
    },
    /// The server is overloaded or asked us to slow down.
    #[error("rate limited: {message}")]
    RateLimited {
        /// The server's words.
        message: String,
        /// How long the server asked us to wait, in milliseconds.
        retry_after_ms: Option<u64>,
    },
    /// A file is larger than the bound of the call: an in-memory read or write
    /// ([`DEFAULT_MEMORY_FILE_BYTES`](crate::DEFAULT_MEMORY_FILE_BYTES) unless raised), or the
    /// backend's largest file, a snapshot archive over its sandbox's disk bound, or an
    /// image archive past a server's largest upload or its image store's bound. Nothing
    /// was kept; `remedy` says what to call instead.
    #[error("{what} is larger than {limit} bytes ({remedy})")]
    FileTooLarge {
        /// The file.
        what: String,
        /// The bound that was passed, in bytes.
        limit: u64,
        /// What to do instead (stream it, or raise the bound).
        remedy: String,
    },
    /// A local or sandbox-side I/O failure.
    #[error("i/o error: {message}")]
    Io {
        /// What failed.
        message: String,
        /// The OS error number, where there is one.
        errno: Option<i32>,
    },
    /// The backend (engine, monitor, agent or server) failed or broke its protocol.
    #[error("backend error: {message}")]
    Backend {
        /// What happened.
        message: String,
        /// Whether retrying the same call may succeed.
        retryable: bool,
    },
    /// The request of an operation with a remote effect was sent, but its answer was lost
    /// (the connection broke, or no answer came in time): it may or may not have taken effect.
    /// Ask `Client::observe` about `operation`, or run the call again
    /// under the same id ([`OperationId::scope`](crate::OperationId::scope)), which never acts
    /// twice where the runtime records operations. A blind retry under a new id might.
    #[error("outcome unknown of operation {operation}: {message}")]
    OutcomeUnknown {
        /// The operation id the request carried.
        operation: String,
        /// What was sent and how its answer was lost.
        message: String,
    },
    /// The resource existed on this runtime and ended recently: its tombstone (see
    /// [`crate::reference`]). Distinct from [`Error::NotFound`], which means no record of it.
    #[error("{kind} {id:?} was destroyed at {} ({reason})", crate::reference::format_utc(*at))]
    Destroyed {
        /// Its kind (`sandbox`, `snapshot`, `volume`, `preview`).
        kind: String,
        /// Its id (`<sandbox>:<port>` for a preview).
        id: String,
        /// When it ended (ms since the epoch).
        at: crate::UnixMillis,
        /// Why: `destroyed`, `its lease ended`, `deleted`, ….
        reason: String,
    },
    /// The runtime refuses access: the subject belongs to another runtime (a reference it did
    /// not issue), or the server's policy refuses the request (an option its operator keeps to
    /// themselves, such as the host's network, or its cap on live sandboxes reached). Retrying
    /// the same request here cannot help.
    #[error("forbidden: {what}")]
    Forbidden {
        /// What was refused, and why.
        what: String,
    },
}

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Machine-readable error codes, one per [`Error`] variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorCode {
    /// [`Error::NotFound`]
    NotFound,
    /// [`Error::AlreadyExists`]
    AlreadyExists,
    /// [`Error::Conflict`]
    Conflict,
    /// [`Error::InvalidArgument`]
    InvalidArgument,
    /// [`Error::Timeout`]
    Timeout,
    /// [`Error::PermissionDenied`]
    PermissionDenied,
    /// [`Error::Unauthenticated`]
    Unauthenticated,
    /// [`Error::InvalidState`]
    InvalidState,
    /// [`Error::NotSupported`]
    NotSupported,
    /// [`Error::Unavailable`]
    Unavailable,
    /// [`Error::RateLimited`]
    RateLimited,
    /// [`Error::FileTooLarge`]
    FileTooLarge,
    /// [`Error::Io`]
    Io,
    /// [`Error::Backend`]
    Backend,
    /// [`Error::OutcomeUnknown`]
    OutcomeUnknown,
    /// [`Error::Destroyed`]
    Destroyed,
    /// [`Error::Forbidden`]
    Forbidden,
}

/// The serializable form of an [`Error`]: a code plus the variant's fields.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// Which variant.
    pub code: ErrorCode,
    /// The human-readable message ([`Error`]'s `Display`).
    pub message: String,
    /// The variant's fields by name.
    #[serde(default)]
    pub fields: std::collections::BTreeMap<String, serde_json::Value>,
}

impl Error {
    /// Shorthand for [`Error::NotFound`].
    pub fn not_found(what: impl Into<String>) -> Self {
        Error::NotFound { what: what.into() }
    }

    /// Shorthand for [`Error::InvalidArgument`].
    pub fn invalid(message: impl Into<String>) -> Self {
        Error::InvalidArgument {
            message: message.into(),
        }
    }

    /// Shorthand for [`Error::NotSupported`].
    pub fn not_supported(feature: impl Into<String>, alternative: impl Into<String>) -> Self {
        Error::NotSupported {
            feature: feature.into(),
            alternative: alternative.into(),
        }
    }

    /// Shorthand for a non-retryable [`Error::Backend`].
    pub fn backend(message: impl Into<String>) -> Self {
        Error::Backend {
            message: message.into(),
            retryable: false,
        }
    }

    /// Whether the same call may succeed if retried later.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::RateLimited { .. } | Error::Timeout { .. } => true,
            Error::Backend { retryable, .. } => *retryable,
            Error::Io { errno, .. } => matches!(
                *errno,
                Some(libc::EAGAIN | libc::EINTR | libc::ECONNRESET | libc::ECONNREFUSED)
            ),
            _ => false,
        }
    }

    /// An in-memory file call refused: `what` is over `limit` bytes, to be streamed instead.
    pub fn file_too_large(what: impl Into<String>, limit: u64) -> Self {
        Error::FileTooLarge {
            what: what.into(),
            limit,
            remedy: format!(
                "the in-memory bound; stream it (read_stream / write_stream) or raise the bound \
                 per call or per client, up to {} bytes",
                crate::MAX_MEMORY_FILE_BYTES
            ),
        }
    }

    /// The operation id of an [`Error::OutcomeUnknown`]: what to pass to
    /// `Client::observe` or to run again under.
    pub fn unknown_outcome(&self) -> Option<crate::OperationId> {
        match self {
            Error::OutcomeUnknown { operation, .. } => crate::OperationId::parse(operation).ok(),
            _ => None,
        }
    }

    /// Whether the subject does not exist (a missing sandbox, process or file alike).
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::NotFound { .. })
    }

    /// Whether the subject ended recently ([`Error::Destroyed`]: a tombstone answered).
    pub fn is_destroyed(&self) -> bool {
        matches!(self, Error::Destroyed { .. })
    }

    /// The machine-readable code of this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::NotFound { .. } => ErrorCode::NotFound,
            Error::AlreadyExists { .. } => ErrorCode::AlreadyExists,
            Error::Conflict { .. } => ErrorCode::Conflict,
            Error::InvalidArgument { .. } => ErrorCode::InvalidArgument,
            Error::Timeout { .. } => ErrorCode::Timeout,
            Error::PermissionDenied { .. } => ErrorCode::PermissionDenied,
            Error::Unauthenticated { .. } => ErrorCode::Unauthenticated,
            Error::InvalidState { .. } => ErrorCode::InvalidState,
            Error::NotSupported { .. } => ErrorCode::NotSupported,
            Error::Unavailable { .. } => ErrorCode::Unavailable,
            Error::RateLimited { .. } => ErrorCode::RateLimited,
            Error::FileTooLarge { .. } => ErrorCode::FileTooLarge,
            Error::Io { .. } => ErrorCode::Io,
            Error::Backend { .. } => ErrorCode::Backend,
            Error::OutcomeUnknown { .. } => ErrorCode::OutcomeUnknown,
            Error::Destroyed { .. } => ErrorCode::Destroyed,
            Error::Forbidden { .. } => ErrorCode::Forbidden,
        }
    }

    /// The serializable form; [`Error::from_body`] inverts it exactly.
    pub fn to_body(&self) -> ErrorBody {
        use serde_json::json;
        let fields: Vec<(&str, serde_json::Value)> = match self {
            Error::NotFound { what }
            | Error::AlreadyExists { what }
            | Error::Conflict { what }
            | Error::Timeout { what }
            | Error::PermissionDenied { what }
            | Error::Forbidden { what } => vec![("what", json!(what))],
            Error::InvalidArgument { message } | Error::Unauthenticated { message } => {
                vec![("message", json!(message))]
            }
            Error::InvalidState { id, state, message } => vec![
                ("id", json!(id)),
                ("state", json!(state)),
                ("message", json!(message)),
            ],
            Error::NotSupported {
                feature,
                alternative,
            } => vec![
                ("feature", json!(feature)),
                ("alternative", json!(alternative)),
            ],
            Error::Unavailable { reason, remedy } => {
                vec![("reason", json!(reason)), ("remedy", json!(remedy))]
            }
            Error::RateLimited {
                message,
                retry_after_ms,
            } => vec![
                ("message", json!(message)),
                ("retry_after_ms", json!(retry_after_ms)),
            ],
            Error::FileTooLarge {
                what,
                limit,
                remedy,
            } => vec![
                ("what", json!(what)),
                ("limit", json!(limit)),
                ("remedy", json!(remedy)),
            ],
            Error::Io { message, errno } => {
                vec![("message", json!(message)), ("errno", json!(errno))]
            }
            Error::Backend { message, retryable } => {
                vec![("message", json!(message)), ("retryable", json!(retryable))]
            }
            Error::OutcomeUnknown { operation, message } => {
                vec![("operation", json!(operation)), ("message", json!(message))]
            }
            Error::Destroyed {
                kind,
                id,
                at,
                reason,
            } => vec![
                ("kind", json!(kind)),
                ("id", json!(id)),
                ("at", json!(at)),
                ("reason", json!(reason)),
            ],
        };
        ErrorBody {
            code: self.code(),
            message: self.to_string(),
            fields: fields
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
        }
    }

    /// Rebuild an error from its serializable form. Missing fields become empty strings, so a
    /// body from a newer peer still maps onto the right variant.
    pub fn from_body(body: &ErrorBody) -> Self {
        let s = |k: &str| {
            body.fields
                .get(k)
                .and_then(|v| v.as_str())
                .map(str::to_owned)
                .unwrap_or_else(|| {
                    if k == "message" {
                        body.message.clone()
                    } else {
                        String::new()
                    }
                })
        };
        match body.code {
            ErrorCode::NotFound => Error::NotFound { what: s("what") },
            ErrorCode::AlreadyExists => Error::AlreadyExists { what: s("what") },
            ErrorCode::Conflict => Error::Conflict { what: s("what") },
            ErrorCode::InvalidArgument => Error::InvalidArgument {
                message: s("message"),
            },
            ErrorCode::Timeout => Error::Timeout { what: s("what") },
            ErrorCode::PermissionDenied => Error::PermissionDenied { what: s("what") },
            ErrorCode::Unauthenticated => Error::Unauthenticated {
                message: s("message"),
            },
            ErrorCode::InvalidState => Error::InvalidState {
                id: s("id"),
                state: s("state"),
                message: s("message"),
            },
            ErrorCode::NotSupported => Error::NotSupported {
                feature: s("feature"),
                alternative: s("alternative"),
            },
            ErrorCode::Unavailable => Error::Unavailable {
                reason: s("reason"),
                remedy: s("remedy"),
            },
            ErrorCode::RateLimited => Error::RateLimited {
                message: s("message"),
                retry_after_ms: body.fields.get("retry_after_ms").and_then(|v| v.as_u64()),
            },
            ErrorCode::FileTooLarge => Error::FileTooLarge {
                what: s("what"),
                limit: body
                    .fields
                    .get("limit")
                    .and_then(|v| v.as_u64())
                    .unwrap_or(0),
                remedy: s("remedy"),
            },
            ErrorCode::Io => Error::Io {
                message: s("message"),
                errno: body
                    .fields
                    .get("errno")
                    .and_then(|v| v.as_i64())
                    .map(|v| v as i32),
            },
            ErrorCode::Backend => Error::Backend {
                message: s("message"),
                retryable: body
                    .fields
                    .get("retryable")
                    .and_then(|v| v.as_bool())
                    .unwrap_or(false),
            },
            ErrorCode::OutcomeUnknown => Error::OutcomeUnknown {
                operation: s("operation"),
                message: s("message"),
            },
            ErrorCode::Destroyed => Error::Destroyed {
                kind: s("kind"),
                id: s("id"),
                at: body.fields.get("at").and_then(|v| v.as_u64()).unwrap_or(0),
                reason: s("reason"),
            },
            ErrorCode::Forbidden => Error::Forbidden { what: s("what") },
        }
    }

    /// Map an OS error met while working on `subject` (a path, a process) to the variant a
    /// caller can act on.
    pub fn from_io(err: &std::io::Error, subject: &str) -> Self {
        use std::io::ErrorKind;
        match err.kind() {
            ErrorKind::NotFound => Error::not_found(subject.to_string()),
            ErrorKind::PermissionDenied => Error::PermissionDenied {
                what: format!("{subject}: {err}"),
            },
            ErrorKind::AlreadyExists => Error::AlreadyExists {
                what: subject.to_string(),
            },
            ErrorKind::InvalidInput => Error::invalid(format!("{subject}: {err}")),
            _ => match err.raw_os_error() {
                Some(libc::EROFS) => Error::PermissionDenied {
                    what: format!("{subject}: read-only file system"),
                },
                Some(libc::ENOTDIR) => Error::invalid(format!("{subject}: not a directory")),
                Some(libc::EISDIR) => Error::invalid(format!("{subject}: is a directory")),
                Some(libc::ENOTEMPTY) => Error::invalid(format!("{subject}: directory not empty")),
                Some(libc::ELOOP) => {
                    Error::invalid(format!("{subject}: too many levels of symbolic links"))
                }
                errno => Error::Io {
                    message: format!("{subject}: {err}"),
                    errno,
                },
            },
        }
    }
}

impl From<std::io::Error> for Error {
    fn from(err: std::io::Error) -> Self {
        Error::Io {
            message: err.to_string(),
            errno: err.raw_os_error(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_variant() -> Vec<Error> {
        vec![
            Error::not_found("sandbox \"x\""),
            Error::AlreadyExists {
                what: "tag t".into(),
            },
            Error::invalid("bad env name"),
            Error::Timeout {
                what: "exec".into(),
            },
            Error::PermissionDenied {
                what: "/usr".into(),
            },
            Error::Unauthenticated {
                message: "no key".into(),
            },
            Error::InvalidState {
                id: "x".into(),
                state: "paused".into(),
                message: "exec".into(),
            },
            Error::not_supported("pty", "use exec"),
            Error::Unavailable {
                reason: "userns".into(),
                remedy: "sysctl".into(),
            },
            Error::RateLimited {
                message: "slow".into(),
                retry_after_ms: Some(1500),
            },
            Error::file_too_large("/workspace/big", 1 << 20),
            Error::Io {
                message: "disk".into(),
                errno: Some(28),
            },
            Error::Backend {
                message: "agent died".into(),
                retryable: true,
            },
            Error::OutcomeUnknown {
                operation: "op-1".into(),
                message: "POST /v1/sandboxes: connection reset".into(),
            },
            Error::Destroyed {
                kind: "sandbox".into(),
                id: "abc".into(),
                at: 1_767_225_600_000,
                reason: "destroyed".into(),
            },
            Error::Forbidden {
                what: "reference of runtime rt-b".into(),
            },
        ]
    }

    #[test]
    fn every_variant_round_trips_through_its_body() {
        for err in every_variant() {
            let body = err.to_body();
            let json = serde_json::to_string(&body).unwrap();
            let back = Error::from_body(&serde_json::from_str(&json).unwrap());
            assert_eq!(back.code(), err.code());
            assert_eq!(back.to_string(), err.to_string());
            assert_eq!(back.is_retryable(), err.is_retryable());
        }
    }

    #[test]
    fn retryable_errors_are_the_transient_ones() {
        let retryable: Vec<_> = every_variant()
            .into_iter()
            .filter(Error::is_retryable)
            .map(|e| e.code())
            .collect();
        assert_eq!(
            retryable,
            [
                ErrorCode::Timeout,
                ErrorCode::RateLimited,
                ErrorCode::Backend
            ]
        );
    }

    #[test]
    fn io_errors_map_to_actionable_variants() {
        let e = std::io::Error::from_raw_os_error(libc::ENOENT);
        assert!(Error::from_io(&e, "file").is_not_found());
        let e = std::io::Error::from_raw_os_error(libc::EROFS);
        assert_eq!(
            Error::from_io(&e, "/usr/x").code(),
            ErrorCode::PermissionDenied
        );
        let e = std::io::Error::from_raw_os_error(libc::EISDIR);
        assert_eq!(
            Error::from_io(&e, "/tmp").code(),
            ErrorCode::InvalidArgument
        );
    }
}
