//! `DaytonaError` and its subclasses, mapped from the runtime's errors in exactly one place.

use std::fmt;

/// What every [`DaytonaError`] carries: Python's `message`, `status_code` and `code`
/// attributes, plus the runtime error it came from (exposed as [`std::error::Error::source`]).
#[derive(Debug, Default)]
pub struct ErrorDetails {
    /// The message, with the calling method's prefix (`"Failed to create sandbox: ..."`).
    pub message: String,
    /// The HTTP status Daytona would have answered with, where there is one.
    pub status_code: Option<u16>,
    /// Daytona's machine-readable error code (e.g. `FILE_NOT_FOUND`), where there is one.
    pub code: Option<String>,
    cause: Option<Box<sandcove::Error>>,
}

impl ErrorDetails {
    /// Details with a message, a status code and an error code.
    pub fn new(message: impl Into<String>, status_code: Option<u16>, code: Option<&str>) -> Self {
        ErrorDetails {
            message: message.into(),
            status_code,
            code: code.map(str::to_owned),
            cause: None,
        }
    }
}

/// Python's `DaytonaError` hierarchy: one variant per subclass.
///
/// Predicates answer the parent-class question (`is_not_found()` is true for a missing
/// sandbox and a missing file alike); [`DaytonaError::status_code`] and
/// [`DaytonaError::code`] mirror the Python attributes.
#[derive(Debug)]
#[non_exhaustive]
pub enum DaytonaError {
    /// `DaytonaError` itself (no more specific subclass applies).
    Error(ErrorDetails),
    /// `DaytonaNotFoundError` (HTTP 404).
    NotFound(ErrorDetails),
    /// `DaytonaAuthenticationError` (HTTP 401).
    Authentication(ErrorDetails),
    /// `DaytonaForbiddenError`, alias `DaytonaAuthorizationError` (HTTP 403).
    Forbidden(ErrorDetails),
    /// `DaytonaRateLimitError` (HTTP 429).
    RateLimit(ErrorDetails),
    /// `DaytonaConflictError` (HTTP 409).
    Conflict(ErrorDetails),
    /// `DaytonaBadRequestError`, alias `DaytonaValidationError` (HTTP 400 and client-side
    /// validation).
    BadRequest(ErrorDetails),
    /// `DaytonaTimeoutError` (HTTP 408 and client-side timeouts).
    Timeout(ErrorDetails),
    /// `DaytonaConnectionError` (the runtime could not be reached).
    Connection(ErrorDetails),
    /// `DaytonaInternalServerError` (HTTP 500).
    InternalServer(ErrorDetails),
    /// `DaytonaServiceUnavailableError` (HTTP 503): the runtime cannot run here.
    ServiceUnavailable(ErrorDetails),
    /// A Daytona feature this runtime cannot honour; raised before any effect.
    NotSupported {
        /// What was asked for.
        feature: String,
        /// What to do instead.
        alternative: String,
    },
}

impl DaytonaError {
    /// A `DaytonaValidationError` raised by the facade itself (HTTP 400 semantics).
    pub fn validation(message: impl Into<String>) -> Self {
        DaytonaError::BadRequest(ErrorDetails::new(message, Some(400), None))
    }

    /// A base `DaytonaError` with a message.
    pub fn new(message: impl Into<String>) -> Self {
        DaytonaError::Error(ErrorDetails::new(message, None, None))
    }

    /// A gap: `feature` cannot be honoured here; `alternative` says what to do instead.
    pub fn not_supported(feature: impl Into<String>, alternative: impl Into<String>) -> Self {
        DaytonaError::NotSupported {
            feature: feature.into(),
            alternative: alternative.into(),
        }
    }

    fn details(&self) -> Option<&ErrorDetails> {
        match self {
            DaytonaError::Error(d)
            | DaytonaError::NotFound(d)
            | DaytonaError::Authentication(d)
            | DaytonaError::Forbidden(d)
            | DaytonaError::RateLimit(d)
            | DaytonaError::Conflict(d)
            | DaytonaError::BadRequest(d)
            | DaytonaError::Timeout(d)
            | DaytonaError::Connection(d)
            | DaytonaError::InternalServer(d)
            | DaytonaError::ServiceUnavailable(d) => Some(d),
            DaytonaError::NotSupported { .. } => None,
        }
    }

    fn details_mut(&mut self) -> Option<&mut ErrorDetails> {
        match self {
            DaytonaError::Error(d)
            | DaytonaError::NotFound(d)
            | DaytonaError::Authentication(d)
            | DaytonaError::Forbidden(d)
            | DaytonaError::RateLimit(d)
            | DaytonaError::Conflict(d)
            | DaytonaError::BadRequest(d)
            | DaytonaError::Timeout(d)
            | DaytonaError::Connection(d)
            | DaytonaError::InternalServer(d)
            | DaytonaError::ServiceUnavailable(d) => Some(d),
            DaytonaError::NotSupported { .. } => None,
        }
    }

    /// Python's `message` attribute.
    pub fn message(&self) -> String {
        match self.details() {
            Some(d) => d.message.clone(),
            None => self.to_string(),
        }
    }

    /// Python's `status_code` attribute.
    pub fn status_code(&self) -> Option<u16> {
        self.details().and_then(|d| d.status_code)
    }

    /// Python's `code` attribute (`error_code` in older SDKs).
    pub fn code(&self) -> Option<&str> {
        self.details().and_then(|d| d.code.as_deref())
    }

    /// `isinstance(e, DaytonaNotFoundError)`.
    pub fn is_not_found(&self) -> bool {
        matches!(self, DaytonaError::NotFound(_))
    }
    /// `isinstance(e, DaytonaAuthenticationError)`.
    pub fn is_authentication(&self) -> bool {
        matches!(self, DaytonaError::Authentication(_))
    }
    /// `isinstance(e, DaytonaForbiddenError)`.
    pub fn is_forbidden(&self) -> bool {
        matches!(self, DaytonaError::Forbidden(_))
    }
    /// `isinstance(e, DaytonaRateLimitError)`.
    pub fn is_rate_limit(&self) -> bool {
        matches!(self, DaytonaError::RateLimit(_))
    }
    /// `isinstance(e, DaytonaConflictError)`.
    pub fn is_conflict(&self) -> bool {
        matches!(self, DaytonaError::Conflict(_))
    }
    /// `isinstance(e, DaytonaValidationError)` (alias `DaytonaBadRequestError`).
    pub fn is_validation(&self) -> bool {
        matches!(self, DaytonaError::BadRequest(_))
    }
    /// `isinstance(e, DaytonaTimeoutError)`.
    pub fn is_timeout(&self) -> bool {
        matches!(self, DaytonaError::Timeout(_))
    }
    /// `isinstance(e, DaytonaConnectionError)`.
    pub fn is_connection(&self) -> bool {
        matches!(self, DaytonaError::Connection(_))
    }
    /// The feature is a gap of this runtime.
    pub fn is_not_supported(&self) -> bool {
        matches!(self, DaytonaError::NotSupported { .. })
    }

    /// Prefix the message the way the Python SDK does per method (`"Failed to ...: "`).
    pub(crate) fn prefixed(mut self, prefix: &str) -> Self {
        if let Some(d) = self.details_mut() {
            if !d.message.starts_with(prefix) {
                d.message = format!("{prefix}{}", d.message);
            }
        }
        self
    }
}

impl fmt::Display for DaytonaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DaytonaError::NotSupported {
                feature,
                alternative,
            } => write!(
                f,
                "{feature} is not supported by this runtime (instead: {alternative})"
            ),
            _ => f.write_str(self.details().map(|d| d.message.as_str()).unwrap_or("")),
        }
    }
}

impl std::error::Error for DaytonaError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.details()
            .and_then(|d| d.cause.as_ref())
            .map(|e| e.as_ref() as &(dyn std::error::Error + 'static))
    }
}

impl From<sandcove::Error> for DaytonaError {
    fn from(err: sandcove::Error) -> Self {
        use sandcove::Error as E;
        let message = err.to_string();
        let (variant, status, code): (fn(ErrorDetails) -> DaytonaError, Option<u16>, &str) =
            match &err {
                // A tombstone is Daytona's not-found, its message saying when it ended.
                E::NotFound { .. } | E::Destroyed { .. } => {
                    (DaytonaError::NotFound, Some(404), "NOT_FOUND")
                }
                E::AlreadyExists { .. } | E::Conflict { .. } => {
                    (DaytonaError::Conflict, Some(409), "CONFLICT")
                }
                E::InvalidArgument { .. } => (DaytonaError::BadRequest, Some(400), "BAD_REQUEST"),
                // HTTP's own status for a body over the bound; Daytona's SDKs raise it as a
                // plain DaytonaError carrying the status.
                E::FileTooLarge { .. } => {
                    (DaytonaError::BadRequest, Some(413), "PAYLOAD_TOO_LARGE")
                }
                E::InvalidState { .. } => (DaytonaError::BadRequest, Some(400), "INVALID_STATE"),
                E::Timeout { .. } => (DaytonaError::Timeout, Some(408), "TIMEOUT"),
                // The sandbox refused (file permissions), or the server's policy did (an
                // operator-only option, the sandbox cap): Daytona's 403 either way.
                E::PermissionDenied { .. } | E::Forbidden { .. } => {
                    (DaytonaError::Forbidden, Some(403), "FORBIDDEN")
                }
                E::Unauthenticated { .. } => {
                    (DaytonaError::Authentication, Some(401), "UNAUTHORIZED")
                }
                E::RateLimited { .. } => (DaytonaError::RateLimit, Some(429), "RATE_LIMITED"),
                E::Unavailable { .. } => (
                    DaytonaError::ServiceUnavailable,
                    Some(503),
                    "SERVICE_UNAVAILABLE",
                ),
                E::Backend {
                    retryable: true, ..
                } => (DaytonaError::Connection, None, "CONNECTION_ERROR"),
                E::Backend { .. } | E::Io { .. } => {
                    (DaytonaError::InternalServer, Some(500), "INTERNAL_ERROR")
                }
                E::NotSupported {
                    feature,
                    alternative,
                } => {
                    return DaytonaError::NotSupported {
                        feature: feature.clone(),
                        alternative: alternative.clone(),
                    }
                }
                _ => (DaytonaError::Error, None, "UNKNOWN"),
            };
        variant(ErrorDetails {
            message,
            status_code: status,
            code: Some(code.to_owned()),
            cause: Some(Box::new(err)),
        })
    }
}

/// Attach the per-method message prefix to any error on the way out.
pub(crate) trait Context<T> {
    /// Map the error into a [`DaytonaError`] whose message starts with `prefix`.
    fn ctx(self, prefix: &str) -> Result<T, DaytonaError>;
}

impl<T, E: Into<DaytonaError>> Context<T> for Result<T, E> {
    fn ctx(self, prefix: &str) -> Result<T, DaytonaError> {
        self.map_err(|e| e.into().prefixed(prefix))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn every_core_error_maps_to_one_subclass() {
        use sandcove::Error as E;
        let table: Vec<(E, &str, Option<u16>)> = vec![
            (E::not_found("file \"/x\""), "NotFound", Some(404)),
            (E::AlreadyExists { what: "s".into() }, "Conflict", Some(409)),
            (E::invalid("bad"), "BadRequest", Some(400)),
            (E::file_too_large("/x", 1 << 20), "BadRequest", Some(413)),
            (
                E::InvalidState {
                    id: "a".into(),
                    state: "paused".into(),
                    message: "m".into(),
                },
                "BadRequest",
                Some(400),
            ),
            (E::Timeout { what: "t".into() }, "Timeout", Some(408)),
            (
                E::PermissionDenied {
                    what: "/usr".into(),
                },
                "Forbidden",
                Some(403),
            ),
            (
                E::Forbidden {
                    what: "the host's network".into(),
                },
                "Forbidden",
                Some(403),
            ),
            (
                E::Unauthenticated {
                    message: "k".into(),
                },
                "Authentication",
                Some(401),
            ),
            (
                E::RateLimited {
                    message: "m".into(),
                    retry_after_ms: None,
                },
                "RateLimit",
                Some(429),
            ),
            (
                E::Unavailable {
                    reason: "r".into(),
                    remedy: "x".into(),
                },
                "ServiceUnavailable",
                Some(503),
            ),
            (
                E::Backend {
                    message: "m".into(),
                    retryable: true,
                },
                "Connection",
                None,
            ),
            (E::backend("m"), "InternalServer", Some(500)),
            (
                E::Io {
                    message: "disk".into(),
                    errno: Some(28),
                },
                "InternalServer",
                Some(500),
            ),
            (E::not_supported("pty", "exec"), "NotSupported", None),
        ];
        for (core, variant, status) in table {
            let text = core.to_string();
            let mapped = DaytonaError::from(core);
            let name = format!("{mapped:?}");
            assert!(name.starts_with(variant), "{text} -> {name}");
            assert_eq!(mapped.status_code(), status, "{text}");
            if variant != "NotSupported" {
                assert_eq!(mapped.message(), text);
                assert_eq!(mapped.source().unwrap().to_string(), text);
            }
        }
    }

    #[test]
    fn predicates_answer_the_parent_question() {
        let e = DaytonaError::from(sandcove::Error::not_found("file \"/x\""));
        assert!(e.is_not_found() && !e.is_timeout() && !e.is_validation());
        assert!(DaytonaError::validation("x").is_validation());
        assert!(DaytonaError::not_supported("lsp", "run it").is_not_supported());
    }

    #[test]
    fn prefixes_are_added_once() {
        let e = Err::<(), _>(sandcove::Error::invalid("bad"))
            .ctx("Failed to create folder: ")
            .unwrap_err()
            .prefixed("Failed to create folder: ");
        assert_eq!(
            e.to_string(),
            "Failed to create folder: invalid argument: bad"
        );
        assert_eq!(e.code(), Some("BAD_REQUEST"));
    }
}
