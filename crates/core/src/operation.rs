//! Operation ids: one id per call with a remote effect, so a caller whose answer was lost can
//! learn what happened, or run the call again, without it acting twice.
//!
//! The client mints a random [`OperationId`] for every create, fork, snapshot, destroy,
//! volume create or delete, preview token, process start and file change (write or streamed
//! upload, mkdir, remove, rename, copy, chmod) it sends; a caller that wants to
//! know the id up front (to save it before sending) mints one itself and runs the call inside
//! [`OperationId::scope`]. When the answer is lost after the request was sent, the call fails
//! with [`Error::OutcomeUnknown`] naming the id;
//! `Client::observe` then reports an [`OperationStatus`], and
//! running the same call again in a scope of the same id returns the recorded outcome.
//!
//! Who records what:
//! - **A `sandcove serve`** (the `HttpBackend`) records every operation
//!   that carries an id, for a bounded time and count (its `ServerConfig`), and answers a
//!   repeated id with the recorded outcome. A repeated process start answers by attaching to
//!   the process the first one started. A repeated file write answers the first write's
//!   [`FileStat`](crate::FileStat) without writing again when its path, options and content
//!   (compared by a digest taken as the upload streams) are the same; while the first write
//!   still runs, a repeat is refused at once ([`Error::Conflict`]: observe it instead).
//! - **The embedded engine** runs each call in the caller's own program, where an answer
//!   cannot be lost without the program itself going away; it records nothing and
//!   `Client::observe` answers [`OperationStatus::Unknown`] saying
//!   so (list sandboxes by a label set at create to find one whose create was interrupted).
//!
//! Use one id for one call: two different calls under one id (another route, other
//! arguments, other file content) are refused ([`Error::Conflict`]) by a recording server,
//! before the second has any effect.

use std::fmt;
use std::future::Future;

use serde::{Deserialize, Serialize};

use crate::{Error, ErrorBody, Result};

/// Longest accepted operation id (the server's bound on its idempotency header).
pub const MAX_OPERATION_ID_LEN: usize = 256;

tokio::task_local! {
    static CURRENT: OperationId;
}

/// The id of one call with a remote effect (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct OperationId(String);

impl OperationId {
    /// A fresh random id (`op-` and 24 characters from the kernel's random source).
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        OperationId(format!("op-{}", crate::random_id(24)))
    }

    /// An id given as text (e.g. saved from an earlier run): 1 to [`MAX_OPERATION_ID_LEN`]
    /// visible ASCII characters, else [`Error::InvalidArgument`].
    pub fn parse(text: &str) -> Result<Self> {
        if text.is_empty()
            || text.len() > MAX_OPERATION_ID_LEN
            || !text.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err(Error::invalid(format!(
                "operation id {text:?}: must be 1 to {MAX_OPERATION_ID_LEN} visible ASCII characters"
            )));
        }
        Ok(OperationId(text.to_string()))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Run `call` (one client call with a remote effect) under this id instead of a freshly
    /// minted one: the request carries it, and a recording runtime that saw it before
    /// answers with the recorded outcome instead of acting again.
    pub async fn scope<F: Future>(self, call: F) -> F::Output {
        CURRENT.scope(self, call).await
    }

    /// The id of the enclosing [`OperationId::scope`], if any.
    pub fn current() -> Option<OperationId> {
        CURRENT.try_with(Clone::clone).ok()
    }

    /// The id of the enclosing scope, or a fresh one.
    pub fn current_or_new() -> OperationId {
        Self::current().unwrap_or_else(OperationId::new)
    }
}

impl fmt::Display for OperationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for OperationId {
    type Error = Error;
    fn try_from(text: String) -> Result<Self> {
        OperationId::parse(&text)
    }
}

impl From<OperationId> for String {
    fn from(id: OperationId) -> String {
        id.0
    }
}

/// What `Client::observe` learned about an operation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
#[non_exhaustive]
pub enum OperationStatus {
    /// It finished and took effect; `result` is its answer as JSON (a
    /// `SandboxInfo` for a create or fork, a
    /// [`SnapshotInfo`](crate::SnapshotInfo), a [`VolumeInfo`](crate::VolumeInfo), `{"pid": n}`
    /// for a process start, a [`FileStat`](crate::FileStat) for a file write, mkdir, rename,
    /// copy or chmod, `null` for a destroy, delete or file remove).
    Done {
        /// The answer.
        result: serde_json::Value,
    },
    /// It finished with this error (and, as every failed call, left nothing behind).
    Failed {
        /// The error, in its wire form ([`OperationStatus::error`] rebuilds it).
        error: ErrorBody,
    },
    /// It was received and has not finished yet: observe again later.
    InProgress,
    /// Nothing is recorded under this id: it never arrived, its record expired, or this
    /// runtime does not record operations (`reason` says which can apply).
    Unknown {
        /// Why nothing is known.
        reason: String,
    },
}

impl OperationStatus {
    /// The id of what a finished operation made or acted on: the `id` of its answer (a
    /// sandbox, snapshot or token), else its `name` (a volume), else its `pid`.
    pub fn resource_id(&self) -> Option<String> {
        let OperationStatus::Done { result } = self else {
            return None;
        };
        ["id", "name", "pid"]
            .iter()
            .find_map(|key| match result.get(key)? {
                serde_json::Value::String(s) => Some(s.clone()),
                serde_json::Value::Number(n) => Some(n.to_string()),
                _ => None,
            })
    }

    /// The error of a failed operation.
    pub fn error(&self) -> Option<Error> {
        match self {
            OperationStatus::Failed { error } => Some(Error::from_body(error)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minted_ids_are_distinct_and_parse_back() {
        let a = OperationId::new();
        let b = OperationId::new();
        assert_ne!(a, b);
        assert_eq!(OperationId::parse(a.as_str()).unwrap(), a);
        assert!(OperationId::parse("").is_err());
        assert!(OperationId::parse("has space").is_err());
        assert!(OperationId::parse(&"x".repeat(MAX_OPERATION_ID_LEN + 1)).is_err());
    }

    #[tokio::test]
    async fn a_scope_names_the_current_operation_only_inside_it() {
        assert_eq!(OperationId::current(), None);
        let op = OperationId::parse("op-mine").unwrap();
        let seen = op.clone().scope(async { OperationId::current() }).await;
        assert_eq!(seen, Some(op));
        assert_eq!(OperationId::current(), None);
    }

    #[test]
    fn statuses_round_trip_and_name_what_they_made() {
        let done = OperationStatus::Done {
            result: serde_json::json!({"id": "sb1", "state": "running"}),
        };
        let json = serde_json::to_string(&done).unwrap();
        assert!(json.contains("\"state\":\"done\""), "{json}");
        let back: OperationStatus = serde_json::from_str(&json).unwrap();
        assert_eq!(back, done);
        assert_eq!(done.resource_id().as_deref(), Some("sb1"));
        let failed = OperationStatus::Failed {
            error: Error::not_found("sandbox \"x\"").to_body(),
        };
        assert!(failed.error().unwrap().is_not_found());
        assert_eq!(failed.resource_id(), None);
    }
}
