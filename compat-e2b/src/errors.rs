//! E2B's exception classes as one Rust enum, and the one mapping from the core error.
//!
//! Python's hierarchy (`SandboxException` → `TimeoutException`, `NotFoundException` →
//! `FileNotFoundException`, …) becomes the variants of [`SandboxException`]; the `is_*`
//! predicates answer the parent-class questions (`is_not_found()` is true for a missing file,
//! a missing sandbox and a missing process alike). The core error, when there is one, is the
//! [`std::error::Error::source`].

use std::fmt;

use crate::commands::CommandResult;

/// Boxed core error carried as the source of a facade error.
pub type Source = Option<Box<sandcove::Error>>;

/// E2B's base exception, with one variant per Python subclass.
///
/// `Authentication` is not a `SandboxException` in Python; [`SandboxException::is_sandbox_exception`]
/// answers `false` for it, as `except SandboxException` would not catch it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SandboxException {
    /// Plain `SandboxException`: anything without a more specific class.
    #[error("{message}")]
    Sandbox {
        /// The message.
        message: String,
        /// The core error.
        #[source]
        source: Option<Box<sandcove::Error>>,
    },
    /// `TimeoutException`: a command, watch or request deadline passed, or the sandbox is gone
    /// or not running.
    #[error("{message}")]
    Timeout {
        /// The message.
        message: String,
        /// The core error.
        #[source]
        source: Option<Box<sandcove::Error>>,
    },
    /// `InvalidArgumentException`.
    #[error("{message}")]
    InvalidArgument {
        /// The message.
        message: String,
        /// The core error.
        #[source]
        source: Option<Box<sandcove::Error>>,
    },
    /// `NotEnoughSpaceException`: the sandbox's disk is full.
    #[error("{message}")]
    NotEnoughSpace {
        /// The message.
        message: String,
        /// The core error.
        #[source]
        source: Option<Box<sandcove::Error>>,
    },
    /// `NotFoundException` (a process or other subject that is neither a file nor a sandbox).
    #[error("{message}")]
    NotFound {
        /// The message.
        message: String,
        /// The core error.
        #[source]
        source: Option<Box<sandcove::Error>>,
    },
    /// `FileNotFoundException`: a path inside the sandbox does not exist.
    #[error("{message}")]
    FileNotFound {
        /// The message.
        message: String,
        /// The core error.
        #[source]
        source: Option<Box<sandcove::Error>>,
    },
    /// `SandboxNotFoundException`: the sandbox id is unknown or the sandbox has ended.
    #[error("{message}")]
    SandboxNotFound {
        /// The message.
        message: String,
        /// The core error.
        #[source]
        source: Option<Box<sandcove::Error>>,
    },
    /// `AuthenticationException` (not a `SandboxException` in Python).
    #[error("{message}")]
    Authentication {
        /// The message.
        message: String,
        /// The core error.
        #[source]
        source: Option<Box<sandcove::Error>>,
    },
    /// `TemplateException`: the template cannot provide the feature.
    #[error("{message}")]
    Template {
        /// The message.
        message: String,
        /// The core error.
        #[source]
        source: Option<Box<sandcove::Error>>,
    },
    /// `RateLimitException`.
    #[error("{message}")]
    RateLimit {
        /// The message.
        message: String,
        /// The core error.
        #[source]
        source: Option<Box<sandcove::Error>>,
    },
    /// `CommandExitException`: a foreground command (or `wait()`) saw a non-zero exit.
    #[error(transparent)]
    CommandExit(#[from] CommandExitException),
    /// A feature Sandcove cannot honour here; raised before any effect.
    #[error("not supported on Sandcove: {feature} (instead: {alternative})")]
    NotSupported {
        /// What was asked for.
        feature: String,
        /// What to do instead.
        alternative: String,
        /// The core error, when the runtime refused.
        #[source]
        source: Option<Box<sandcove::Error>>,
    },
}

/// `CommandExitException`: a command exited with a non-zero code. Carries the whole result.
#[derive(Clone, PartialEq, Eq)]
pub struct CommandExitException {
    /// What was written to stderr.
    pub stderr: String,
    /// What was written to stdout.
    pub stdout: String,
    /// The exit code (-1 when a signal ended the process).
    pub exit_code: i64,
    /// The runtime's error text, e.g. `exit status 1` or `signal: killed`.
    pub error: Option<String>,
}

impl CommandExitException {
    /// The result it carries, as `CommandResult`.
    pub fn result(&self) -> CommandResult {
        CommandResult {
            stderr: self.stderr.clone(),
            stdout: self.stdout.clone(),
            exit_code: self.exit_code,
            error: self.error.clone(),
        }
    }
}

impl From<CommandResult> for CommandExitException {
    fn from(r: CommandResult) -> Self {
        CommandExitException {
            stderr: r.stderr,
            stdout: r.stdout,
            exit_code: r.exit_code,
            error: r.error,
        }
    }
}

impl fmt::Display for CommandExitException {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Command exited with code {} and error:\n{}",
            self.exit_code, self.stderr
        )
    }
}

impl fmt::Debug for CommandExitException {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CommandExitException(stderr={}, stdout={}, exit_code={}, error={})",
            crate::translate::py_str(&self.stderr),
            crate::translate::py_str(&self.stdout),
            self.exit_code,
            crate::translate::py_opt_str(self.error.as_deref()),
        )
    }
}

impl std::error::Error for CommandExitException {}

/// The message E2B gives when a sandbox is gone or not running.
pub(crate) const SANDBOX_TIMEOUT_MESSAGE: &str = "The sandbox was not found: This error is likely due to sandbox timeout. You can modify the sandbox timeout by passing 'timeout' when starting the sandbox or calling '.set_timeout' on the sandbox with the desired timeout.";

impl From<sandcove::Error> for SandboxException {
    /// The one mapping from the core error to E2B's classes.
    fn from(err: sandcove::Error) -> Self {
        use sandcove::Error as E;
        let message = err.to_string();
        let boxed = |e: sandcove::Error| Some(Box::new(e));
        match &err {
            E::NotFound { what } => {
                if what.starts_with("sandbox ") {
                    let id = what.trim_start_matches("sandbox ").trim_matches('"');
                    SandboxException::SandboxNotFound {
                        message: format!("Sandbox {id} not found"),
                        source: boxed(err),
                    }
                } else if what.starts_with("working directory") {
                    // E2B: a cwd that does not exist is an invalid argument.
                    let cwd = what.trim_start_matches("working directory").trim();
                    SandboxException::InvalidArgument {
                        message: format!("cwd '{cwd}' does not exist"),
                        source: boxed(err),
                    }
                } else if what.starts_with("process")
                    || what.starts_with("running process")
                    || what.starts_with("program")
                    || what.starts_with("tag")
                {
                    SandboxException::NotFound {
                        message,
                        source: boxed(err),
                    }
                } else {
                    SandboxException::FileNotFound {
                        message: format!("Path '{what}' not found"),
                        source: boxed(err),
                    }
                }
            }
            // A tombstone: still E2B's not-found, saying when it ended.
            E::Destroyed { kind, id, .. } if kind == "sandbox" => {
                SandboxException::SandboxNotFound {
                    message: format!("Sandbox {id} not found: {message}"),
                    source: boxed(err),
                }
            }
            E::Destroyed { .. } => SandboxException::NotFound {
                message,
                source: boxed(err),
            },
            E::InvalidArgument { .. } => SandboxException::InvalidArgument {
                message,
                source: boxed(err),
            },
            E::Timeout { .. } => SandboxException::Timeout {
                message,
                source: boxed(err),
            },
            E::InvalidState { state, .. } if state == "paused" || state == "stopped" => {
                SandboxException::Timeout {
                    message: format!("{SANDBOX_TIMEOUT_MESSAGE} ({message})"),
                    source: boxed(err),
                }
            }
            E::Unauthenticated { .. } => SandboxException::Authentication {
                message,
                source: boxed(err),
            },
            E::NotSupported {
                feature,
                alternative,
            } => SandboxException::NotSupported {
                feature: feature.clone(),
                alternative: alternative.clone(),
                source: boxed(err),
            },
            E::RateLimited { .. } => SandboxException::RateLimit {
                message,
                source: boxed(err),
            },
            // E2B has no class of its own for it: its SDKs raise InvalidArgumentException
            // for a request the sandbox refuses as given.
            E::FileTooLarge { .. } => SandboxException::InvalidArgument {
                message,
                source: boxed(err),
            },
            E::Io {
                errno: Some(28), ..
            } => SandboxException::NotEnoughSpace {
                message,
                source: boxed(err),
            },
            _ => SandboxException::Sandbox {
                message,
                source: boxed(err),
            },
        }
    }
}

/// Whether `e`, met by a process stream after its start, means the connection to the sandbox
/// broke (its agent or the sandbox went away) rather than an answer about the request: what
/// the SDK tells apart with its health probe.
pub(crate) fn broke_the_connection(e: &sandcove::Error) -> bool {
    use sandcove::ErrorCode;
    matches!(
        e.code(),
        ErrorCode::Backend | ErrorCode::Io | ErrorCode::Unavailable | ErrorCode::Destroyed
    )
}

impl SandboxException {
    /// A plain `SandboxException` with a message.
    pub fn sandbox(message: impl Into<String>) -> Self {
        SandboxException::Sandbox {
            message: message.into(),
            source: None,
        }
    }

    /// An `InvalidArgumentException` with a message.
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        SandboxException::InvalidArgument {
            message: message.into(),
            source: None,
        }
    }

    /// A `TimeoutException` with a message.
    pub fn timeout(message: impl Into<String>) -> Self {
        SandboxException::Timeout {
            message: message.into(),
            source: None,
        }
    }

    /// A `NotFoundException` with a message.
    pub fn not_found(message: impl Into<String>) -> Self {
        SandboxException::NotFound {
            message: message.into(),
            source: None,
        }
    }

    /// The Python class name of this error, e.g. `"TimeoutException"`.
    pub fn class_name(&self) -> &'static str {
        match self {
            SandboxException::Sandbox { .. } => "SandboxException",
            SandboxException::Timeout { .. } => "TimeoutException",
            SandboxException::InvalidArgument { .. } => "InvalidArgumentException",
            SandboxException::NotEnoughSpace { .. } => "NotEnoughSpaceException",
            SandboxException::NotFound { .. } => "NotFoundException",
            SandboxException::FileNotFound { .. } => "FileNotFoundException",
            SandboxException::SandboxNotFound { .. } => "SandboxNotFoundException",
            SandboxException::Authentication { .. } => "AuthenticationException",
            SandboxException::Template { .. } => "TemplateException",
            SandboxException::RateLimit { .. } => "RateLimitException",
            SandboxException::CommandExit(_) => "CommandExitException",
            SandboxException::NotSupported { .. } => "NotSupportedException",
        }
    }

    /// `isinstance(e, SandboxException)`: every variant except `Authentication` and the
    /// Sandcove-only `NotSupported`.
    pub fn is_sandbox_exception(&self) -> bool {
        !matches!(
            self,
            SandboxException::Authentication { .. } | SandboxException::NotSupported { .. }
        )
    }

    /// `isinstance(e, NotFoundException)`: a missing file, sandbox or process.
    pub fn is_not_found(&self) -> bool {
        matches!(
            self,
            SandboxException::NotFound { .. }
                | SandboxException::FileNotFound { .. }
                | SandboxException::SandboxNotFound { .. }
        )
    }

    /// `isinstance(e, FileNotFoundException)`.
    pub fn is_file_not_found(&self) -> bool {
        matches!(self, SandboxException::FileNotFound { .. })
    }

    /// `isinstance(e, SandboxNotFoundException)`.
    pub fn is_sandbox_not_found(&self) -> bool {
        matches!(self, SandboxException::SandboxNotFound { .. })
    }

    /// `isinstance(e, TimeoutException)`.
    pub fn is_timeout(&self) -> bool {
        matches!(self, SandboxException::Timeout { .. })
    }

    /// `isinstance(e, InvalidArgumentException)`.
    pub fn is_invalid_argument(&self) -> bool {
        matches!(self, SandboxException::InvalidArgument { .. })
    }

    /// `isinstance(e, NotEnoughSpaceException)`.
    pub fn is_not_enough_space(&self) -> bool {
        matches!(self, SandboxException::NotEnoughSpace { .. })
    }

    /// `isinstance(e, AuthenticationException)`.
    pub fn is_authentication(&self) -> bool {
        matches!(self, SandboxException::Authentication { .. })
    }

    /// `isinstance(e, TemplateException)`.
    pub fn is_template(&self) -> bool {
        matches!(self, SandboxException::Template { .. })
    }

    /// `isinstance(e, RateLimitException)`.
    pub fn is_rate_limit(&self) -> bool {
        matches!(self, SandboxException::RateLimit { .. })
    }

    /// `isinstance(e, CommandExitException)`.
    pub fn is_command_exit(&self) -> bool {
        matches!(self, SandboxException::CommandExit(_))
    }

    /// Whether Sandcove refused the feature ([`SandboxException::NotSupported`]).
    pub fn is_not_supported(&self) -> bool {
        matches!(self, SandboxException::NotSupported { .. })
    }

    /// The `CommandExitException` inside, if this is one.
    pub fn as_command_exit(&self) -> Option<&CommandExitException> {
        match self {
            SandboxException::CommandExit(e) => Some(e),
            _ => None,
        }
    }

    /// The core error this one was mapped from, if any.
    pub fn core_error(&self) -> Option<&sandcove::Error> {
        match self {
            SandboxException::Sandbox { source, .. }
            | SandboxException::Timeout { source, .. }
            | SandboxException::InvalidArgument { source, .. }
            | SandboxException::NotEnoughSpace { source, .. }
            | SandboxException::NotFound { source, .. }
            | SandboxException::FileNotFound { source, .. }
            | SandboxException::SandboxNotFound { source, .. }
            | SandboxException::Authentication { source, .. }
            | SandboxException::Template { source, .. }
            | SandboxException::RateLimit { source, .. }
            | SandboxException::NotSupported { source, .. } => source.as_deref(),
            SandboxException::CommandExit(_) => None,
        }
    }
}

/// Shorthand for facade results.
pub type Result<T, E = SandboxException> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use sandcove::Error as E;

    #[test]
    fn every_core_error_maps_to_one_e2b_class() {
        let table: Vec<(sandcove::Error, &str)> = vec![
            (E::not_found("sandbox \"abc\""), "SandboxNotFoundException"),
            (E::not_found("/home/user/x.txt"), "FileNotFoundException"),
            (E::not_found("process 12"), "NotFoundException"),
            (
                E::Destroyed {
                    kind: "sandbox".into(),
                    id: "abc".into(),
                    at: 0,
                    reason: "destroyed".into(),
                },
                "SandboxNotFoundException",
            ),
            (
                E::Destroyed {
                    kind: "snapshot".into(),
                    id: "s".into(),
                    at: 0,
                    reason: "deleted".into(),
                },
                "NotFoundException",
            ),
            (
                E::file_too_large("/home/user/big", 1 << 20),
                "InvalidArgumentException",
            ),
            (E::not_found("running process 12"), "NotFoundException"),
            (E::not_found("program \"nope\""), "NotFoundException"),
            (
                E::not_found("working directory /nope"),
                "InvalidArgumentException",
            ),
            (
                E::AlreadyExists {
                    what: "tag t".into(),
                },
                "SandboxException",
            ),
            (E::invalid("bad"), "InvalidArgumentException"),
            (
                E::Timeout {
                    what: "exec".into(),
                },
                "TimeoutException",
            ),
            (
                E::PermissionDenied {
                    what: "/usr".into(),
                },
                "SandboxException",
            ),
            (
                E::Unauthenticated {
                    message: "key".into(),
                },
                "AuthenticationException",
            ),
            (
                E::InvalidState {
                    id: "x".into(),
                    state: "paused".into(),
                    message: "exec".into(),
                },
                "TimeoutException",
            ),
            (
                E::InvalidState {
                    id: "x".into(),
                    state: "starting".into(),
                    message: "exec".into(),
                },
                "SandboxException",
            ),
            (E::not_supported("pty", "exec"), "NotSupportedException"),
            (
                E::Unavailable {
                    reason: "userns".into(),
                    remedy: "sysctl".into(),
                },
                "SandboxException",
            ),
            (
                E::RateLimited {
                    message: "slow".into(),
                    retry_after_ms: None,
                },
                "RateLimitException",
            ),
            (
                E::Io {
                    message: "disk full".into(),
                    errno: Some(28),
                },
                "NotEnoughSpaceException",
            ),
            (
                E::Io {
                    message: "eio".into(),
                    errno: Some(5),
                },
                "SandboxException",
            ),
            (E::backend("agent died"), "SandboxException"),
        ];
        for (core, class) in table {
            let shown = core.to_string();
            let mapped = SandboxException::from(core);
            assert_eq!(mapped.class_name(), class, "{shown}");
            let source = std::error::Error::source(&mapped).expect("core error is the source");
            assert_eq!(source.to_string(), shown);
        }
    }

    #[test]
    fn predicates_answer_the_parent_class_question() {
        let file = SandboxException::from(E::not_found("/x"));
        let sandbox = SandboxException::from(E::not_found("sandbox \"x\""));
        let process = SandboxException::from(E::not_found("process 1"));
        for e in [&file, &sandbox, &process] {
            assert!(e.is_not_found() && e.is_sandbox_exception());
        }
        assert!(file.is_file_not_found() && !file.is_sandbox_not_found());
        assert!(sandbox.is_sandbox_not_found() && !sandbox.is_file_not_found());
        let auth = SandboxException::from(E::Unauthenticated {
            message: "x".into(),
        });
        assert!(auth.is_authentication() && !auth.is_sandbox_exception());
        let exit = SandboxException::from(CommandExitException {
            stderr: "boom\n".into(),
            stdout: String::new(),
            exit_code: 2,
            error: Some("exit status 2".into()),
        });
        assert!(exit.is_command_exit() && exit.is_sandbox_exception());
        assert_eq!(
            exit.to_string(),
            "Command exited with code 2 and error:\nboom\n"
        );
        assert_eq!(exit.as_command_exit().unwrap().result().exit_code, 2);
    }

    #[test]
    fn errors_are_send_and_sync() {
        fn check<T: Send + Sync + 'static>() {}
        check::<SandboxException>();
    }
}
