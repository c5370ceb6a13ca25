//! Blaxel's exceptions as one Rust error type, mapped from the core error in exactly one place.
//!
//! Python raises `SandboxAPIError` from control-plane calls (sandboxes, snapshots, fork),
//! `ResponseError` from sandbox-API calls (processes, files), `UnexpectedStatus` from the
//! generated preview client, and plain `Exception`s with fixed messages ("Process did not finish
//! in time", "Unsupported file type", …). [`SandboxAPIError`] has one variant per class; its
//! predicates answer the questions callers ask (`is_not_found`, `is_gateway_error`).

use std::fmt;

use serde_json::{json, Value};

/// Shorthand for results of this crate.
pub type Result<T, E = SandboxAPIError> = std::result::Result<T, E>;

/// The data-plane error (`blaxel.core.sandbox.types.ResponseError`): a non-2xx answer of the
/// sandbox API.
#[derive(Debug)]
pub struct ResponseError {
    /// HTTP status, e.g. 404.
    pub status: i64,
    /// HTTP reason phrase, e.g. `Not Found`.
    pub status_text: String,
    /// The body: `{"error": "<message>"}`.
    pub data: Value,
    /// Always `None`, as in Python.
    pub error: Option<String>,
    source: Option<Box<sandcove::Error>>,
}

impl ResponseError {
    /// A response error with the body `{"error": message}`.
    pub fn new(status: i64, message: impl Into<String>) -> Self {
        ResponseError {
            status,
            status_text: status_text(status).to_string(),
            data: json!({ "error": message.into() }),
            error: None,
            source: None,
        }
    }

    /// The `error` string of the body.
    pub fn message(&self) -> &str {
        self.data
            .get("error")
            .and_then(Value::as_str)
            .unwrap_or_default()
    }
}

impl fmt::Display for ResponseError {
    /// Python's `str(e)`: the body's keys plus `status` and `statusText`, as a dict repr.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{{'error': '{}', 'status': {}, 'statusText': '{}'}}",
            self.message(),
            self.status,
            self.status_text
        )
    }
}

/// Every error a facade call can return.
#[derive(Debug)]
#[non_exhaustive]
pub enum SandboxAPIError {
    /// Control-plane failure (Python `SandboxAPIError(message, status_code, code)`): sandbox
    /// create/get/list/delete/update, snapshots, fork.
    Api {
        /// Human-readable message.
        message: String,
        /// HTTP status, e.g. 404 or 409.
        status_code: Option<i64>,
        /// Blaxel's error code, e.g. `SANDBOX_ALREADY_EXISTS`, or the `error` string of a 404.
        code: Option<String>,
        /// The core error, when one caused this.
        source: Option<Box<sandcove::Error>>,
    },
    /// Sandbox-API failure (Python `ResponseError`): processes and files.
    Response(ResponseError),
    /// A status the generated control-plane client does not model (Python
    /// `errors.UnexpectedStatus`): previews and tokens.
    UnexpectedStatus {
        /// HTTP status.
        status_code: i64,
        /// The body.
        content: String,
        /// The core error, when one caused this.
        source: Option<Box<sandcove::Error>>,
    },
    /// A plain Python `Exception` / `RuntimeError` with a fixed message, e.g.
    /// `Process did not finish in time`.
    Exception {
        /// The message, exactly as Python words it.
        message: String,
        /// The core error, when one caused this.
        source: Option<Box<sandcove::Error>>,
    },
    /// Python `ValueError`: the arguments are wrong (unknown dict keys, bad types, missing
    /// required keys).
    ValueError {
        /// What is wrong.
        message: String,
    },
    /// A Blaxel feature this runtime cannot honour; raised before any effect.
    NotSupported {
        /// What was asked for.
        feature: String,
        /// What to do instead.
        alternative: String,
    },
}

impl fmt::Display for SandboxAPIError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SandboxAPIError::Api { message, .. } => f.write_str(message),
            SandboxAPIError::Response(r) => r.fmt(f),
            SandboxAPIError::UnexpectedStatus {
                status_code,
                content,
                ..
            } => write!(
                f,
                "Unexpected status code: {status_code}\n\nResponse content:\n{content}"
            ),
            SandboxAPIError::Exception { message, .. } => f.write_str(message),
            SandboxAPIError::ValueError { message } => f.write_str(message),
            SandboxAPIError::NotSupported {
                feature,
                alternative,
            } => write!(
                f,
                "not supported on Sandcove: {feature} (instead: {alternative})"
            ),
        }
    }
}

impl std::error::Error for SandboxAPIError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        let source = match self {
            SandboxAPIError::Api { source, .. }
            | SandboxAPIError::UnexpectedStatus { source, .. }
            | SandboxAPIError::Exception { source, .. } => source.as_deref(),
            SandboxAPIError::Response(r) => r.source.as_deref(),
            _ => None,
        };
        source.map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// The HTTP status and body every core error stands for. Used by the one
/// `From<sandcove::Error>` below; table-tested.
pub fn status_of(err: &sandcove::Error) -> i64 {
    use sandcove::Error as E;
    match err {
        E::NotFound { .. } | E::Destroyed { .. } => 404,
        E::Forbidden { .. } => 403,
        E::AlreadyExists { .. } | E::Conflict { .. } => 409,
        E::InvalidArgument { .. } => 400,
        E::FileTooLarge { .. } => 413,
        E::Timeout { .. } => 504,
        E::PermissionDenied { .. } => 403,
        E::Unauthenticated { .. } => 401,
        E::InvalidState { .. } => 409,
        E::Unavailable { .. } => 503,
        E::RateLimited { .. } => 429,
        E::Io { .. } => 500,
        E::Backend {
            retryable: true, ..
        } => 503,
        E::Backend { .. } => 502,
        _ => 500,
    }
}

fn status_text(status: i64) -> &'static str {
    match status {
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        409 => "Conflict",
        413 => "Payload Too Large",
        422 => "Unprocessable Entity",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "",
    }
}

impl From<sandcove::Error> for SandboxAPIError {
    /// Core errors surface as the data-plane `ResponseError` with the status of
    /// [`status_of`]; `NotSupported` stays `NotSupported`. Control-plane calls re-label the
    /// result with [`SandboxAPIError::into_control_plane`].
    fn from(err: sandcove::Error) -> Self {
        if let sandcove::Error::NotSupported {
            feature,
            alternative,
        } = &err
        {
            return SandboxAPIError::NotSupported {
                feature: feature.clone(),
                alternative: alternative.clone(),
            };
        }
        let mut r = ResponseError::new(status_of(&err), err.to_string());
        r.source = Some(Box::new(err));
        SandboxAPIError::Response(r)
    }
}

impl SandboxAPIError {
    /// A data-plane error with body `{"error": message}`.
    pub(crate) fn response(status: i64, message: impl Into<String>) -> Self {
        SandboxAPIError::Response(ResponseError::new(status, message))
    }

    /// A data-plane error keeping `source` as its cause.
    pub(crate) fn response_from(
        status: i64,
        message: impl Into<String>,
        source: sandcove::Error,
    ) -> Self {
        let mut r = ResponseError::new(status, message);
        r.source = Some(Box::new(source));
        SandboxAPIError::Response(r)
    }

    /// A control-plane error.
    pub(crate) fn api(status: i64, code: impl Into<String>, message: impl Into<String>) -> Self {
        SandboxAPIError::Api {
            message: message.into(),
            status_code: Some(status),
            code: Some(code.into()),
            source: None,
        }
    }

    /// A plain `Exception` with Python's message.
    pub(crate) fn exception(message: impl Into<String>) -> Self {
        SandboxAPIError::Exception {
            message: message.into(),
            source: None,
        }
    }

    /// A `ValueError`.
    pub(crate) fn value_error(message: impl Into<String>) -> Self {
        SandboxAPIError::ValueError {
            message: message.into(),
        }
    }

    /// Re-label a data-plane error as the control-plane `SandboxAPIError` Python raises from
    /// `SandboxInstance` calls (same status; `code` is the body's `error` string).
    pub fn into_control_plane(self) -> Self {
        match self {
            SandboxAPIError::Response(r) => SandboxAPIError::Api {
                message: r.message().to_string(),
                status_code: Some(r.status),
                code: Some(r.message().to_string()),
                source: r.source,
            },
            other => other,
        }
    }

    /// Re-label a data-plane error as the `UnexpectedStatus` the preview client raises.
    pub fn into_unexpected_status(self) -> Self {
        match self {
            SandboxAPIError::Response(r) => SandboxAPIError::UnexpectedStatus {
                status_code: r.status,
                content: r.data.to_string(),
                source: r.source,
            },
            other => other,
        }
    }

    /// The HTTP status, where the error has one.
    pub fn status_code(&self) -> Option<i64> {
        match self {
            SandboxAPIError::Api { status_code, .. } => *status_code,
            SandboxAPIError::Response(r) => Some(r.status),
            SandboxAPIError::UnexpectedStatus { status_code, .. } => Some(*status_code),
            _ => None,
        }
    }

    /// Blaxel's error code (control-plane errors only).
    pub fn code(&self) -> Option<&str> {
        match self {
            SandboxAPIError::Api { code, .. } => code.as_deref(),
            _ => None,
        }
    }

    /// The subject does not exist: a missing sandbox, process, file or preview alike.
    pub fn is_not_found(&self) -> bool {
        self.status_code() == Some(404)
    }

    /// TS `isGatewayError`: a 502, 503 or 504 (the runtime behind the API failed).
    pub fn is_gateway_error(&self) -> bool {
        matches!(self.status_code(), Some(502..=504))
    }

    /// TS `isGatewayTimeout`: a 504.
    pub fn is_gateway_timeout(&self) -> bool {
        self.status_code() == Some(504)
    }

    /// Whether this is the refusal of a feature this runtime does not have.
    pub fn is_not_supported(&self) -> bool {
        matches!(self, SandboxAPIError::NotSupported { .. })
    }

    /// The `ResponseError`, when this is one.
    pub fn as_response_error(&self) -> Option<&ResponseError> {
        match self {
            SandboxAPIError::Response(r) => Some(r),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn every_core_error_maps_to_one_status() {
        use sandcove::Error as E;
        let table: Vec<(sandcove::Error, i64)> = vec![
            (E::not_found("file \"/x\""), 404),
            (E::AlreadyExists { what: "t".into() }, 409),
            (E::invalid("bad"), 400),
            (E::file_too_large("/x", 1 << 20), 413),
            (E::Timeout { what: "x".into() }, 504),
            (
                E::PermissionDenied {
                    what: "/usr".into(),
                },
                403,
            ),
            (
                E::Unauthenticated {
                    message: "k".into(),
                },
                401,
            ),
            (
                E::InvalidState {
                    id: "a".into(),
                    state: "paused".into(),
                    message: "m".into(),
                },
                409,
            ),
            (
                E::Unavailable {
                    reason: "r".into(),
                    remedy: "m".into(),
                },
                503,
            ),
            (
                E::RateLimited {
                    message: "m".into(),
                    retry_after_ms: None,
                },
                429,
            ),
            (
                E::Io {
                    message: "m".into(),
                    errno: None,
                },
                500,
            ),
            (
                E::Backend {
                    message: "m".into(),
                    retryable: true,
                },
                503,
            ),
            (E::backend("m"), 502),
        ];
        for (core, status) in table {
            let shown = core.to_string();
            let err = SandboxAPIError::from(core);
            assert_eq!(err.status_code(), Some(status), "{shown}");
            let r = err.as_response_error().expect("a ResponseError");
            assert_eq!(r.message(), shown);
            assert_eq!(r.data, json!({ "error": shown }));
            assert!(err.source().is_some(), "the core error is the source");
            assert_eq!(err.is_gateway_error(), (502..=504).contains(&status));
        }
    }

    #[test]
    fn not_supported_keeps_feature_and_alternative() {
        let err = SandboxAPIError::from(sandcove::Error::not_supported("pty", "use exec"));
        match &err {
            SandboxAPIError::NotSupported {
                feature,
                alternative,
            } => {
                assert_eq!(feature, "pty");
                assert_eq!(alternative, "use exec");
            }
            other => panic!("{other:?}"),
        }
        assert!(err.is_not_supported());
        assert_eq!(err.status_code(), None);
    }

    #[test]
    fn control_plane_relabelling_keeps_status_and_source() {
        let err =
            SandboxAPIError::from(sandcove::Error::not_found("sandbox \"x\"")).into_control_plane();
        assert!(matches!(err, SandboxAPIError::Api { .. }));
        assert_eq!(err.status_code(), Some(404));
        assert!(err.is_not_found());
        assert!(err.source().is_some());
        let err =
            SandboxAPIError::from(sandcove::Error::not_found("preview")).into_unexpected_status();
        assert!(matches!(err, SandboxAPIError::UnexpectedStatus { .. }));
        assert!(err.is_not_found());
    }

    #[test]
    fn response_error_displays_like_python() {
        let r = ResponseError::new(404, "process not found");
        assert_eq!(
            r.to_string(),
            "{'error': 'process not found', 'status': 404, 'statusText': 'Not Found'}"
        );
        assert!(SandboxAPIError::response(504, "t").is_gateway_timeout());
    }
}
