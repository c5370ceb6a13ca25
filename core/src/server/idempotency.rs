//! Idempotency keys, which are the clients' operation ids (see [`crate::operation`]): the
//! first request with a key runs to completion on its own task, and every request with that
//! key gets the same answer while it is remembered. Records are bounded in time
//! ([`ServerConfig::idempotency_ttl`](super::ServerConfig)) and in count
//! ([`ServerConfig::max_operations`](super::ServerConfig)): at the count bound the oldest
//! finished record goes first; when every record is still running, a new keyed request is
//! refused as rate limited instead of forgetting one that may still act.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::future::{BoxFuture, FutureExt, Shared};

use super::ApiError;
use crate::backend::http::IDEMPOTENCY_HEADER;
use crate::{Error, ErrorBody, OperationStatus};

/// Longest accepted key.
const MAX_KEY_LEN: usize = 256;

/// A finished answer, kept to be replayed.
#[derive(Clone)]
pub(super) struct Stored {
    status: StatusCode,
    body: Bytes,
}

impl Stored {
    /// A JSON success or the error answer of `result`.
    pub(super) fn of<T: serde::Serialize>(result: crate::Result<T>) -> Stored {
        let response = match result {
            Ok(value) => match serde_json::to_vec(&value) {
                Ok(body) => Ok(body),
                Err(e) => Err(Error::backend(format!("cannot encode the answer: {e}"))),
            },
            Err(e) => Err(e),
        };
        match response {
            Ok(body) => Stored {
                status: StatusCode::OK,
                body: body.into(),
            },
            Err(e) => {
                let status = StatusCode::from_u16(crate::backend::http::status_for(e.code()))
                    .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                Stored {
                    status,
                    body: serde_json::to_vec(&e.to_body()).unwrap_or_default().into(),
                }
            }
        }
    }

    /// A call that answers nothing: `204 No Content`, or its error.
    pub(super) fn unit(result: crate::Result<()>) -> Stored {
        match result {
            Ok(()) => Stored {
                status: StatusCode::NO_CONTENT,
                body: Bytes::new(),
            },
            Err(e) => Stored::of::<()>(Err(e)),
        }
    }

    /// Worth replaying: transient failures are not, so a retry runs the call again.
    fn is_final(&self) -> bool {
        !(self.status.is_server_error() || self.status == StatusCode::TOO_MANY_REQUESTS)
    }

    /// Whether the call succeeded.
    pub(super) fn is_success(&self) -> bool {
        self.status.is_success()
    }

    /// The JSON answer of a successful call.
    pub(super) fn value(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }

    /// What [`Idempotency::status`] reports for this finished answer.
    fn outcome(&self) -> OperationStatus {
        if self.is_success() {
            return OperationStatus::Done {
                result: self.value(),
            };
        }
        let error = serde_json::from_slice::<ErrorBody>(&self.body).unwrap_or_else(|_| {
            Error::backend(format!("failed with status {}", self.status)).to_body()
        });
        OperationStatus::Failed { error }
    }

    /// The HTTP answer.
    pub(super) fn into_response(self) -> Response {
        (
            self.status,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            self.body,
        )
            .into_response()
    }
}

struct Entry {
    at: Instant,
    serial: u64,
    /// SHA-256 of the scope and request: a record costs the same whatever the request's
    /// size, so `max_entries` bounds memory (bodies are up to the JSON body limit each).
    fingerprint: [u8; 32],
    answer: Shared<BoxFuture<'static, Stored>>,
}

/// Remembered answers by key.
pub(super) struct Idempotency {
    ttl: Duration,
    max_entries: usize,
    entries: Mutex<(u64, HashMap<String, Entry>)>,
}

impl Idempotency {
    /// Records kept `ttl`, at most `max_entries` of them (at least one).
    pub(super) fn new(ttl: Duration, max_entries: usize) -> Self {
        Idempotency {
            ttl,
            max_entries: max_entries.max(1),
            entries: Mutex::new((0, HashMap::new())),
        }
    }

    /// What is recorded about operation `key` (see [`crate::operation`]).
    pub(super) fn status(&self, key: &str) -> OperationStatus {
        let mut guard = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let ttl = self.ttl;
        guard.1.retain(|_, e| e.at.elapsed() < ttl);
        match guard.1.get(key) {
            None => OperationStatus::Unknown {
                reason: format!(
                    "this server has no record of operation {key:?}: it never arrived, or its \
                     record ended (records are kept {} s, at most {})",
                    ttl.as_secs(),
                    self.max_entries
                ),
            },
            Some(entry) => match entry.answer.peek() {
                Some(stored) => stored.outcome(),
                None => OperationStatus::InProgress,
            },
        }
    }

    /// Run `op` once per idempotency key (from `headers`) within `scope`; without a key, run
    /// it. `fingerprint` identifies the request: the same key with a different request is
    /// refused. `op` always runs on its own task, so a client hanging up cannot cancel a
    /// create half-way.
    pub(super) async fn run<F>(
        &self,
        headers: &HeaderMap,
        scope: &str,
        fingerprint: &[u8],
        op: F,
    ) -> Response
    where
        F: Future<Output = Stored> + Send + 'static,
    {
        match self.run_stored(headers, scope, fingerprint, op).await {
            Ok((stored, _)) => stored.into_response(),
            Err(e) => e.into_response(),
        }
    }

    /// [`Idempotency::run`], answering the stored outcome and whether this request ran `op`
    /// (`false`: the outcome is an earlier request's).
    pub(super) async fn run_stored<F>(
        &self,
        headers: &HeaderMap,
        scope: &str,
        fingerprint: &[u8],
        op: F,
    ) -> Result<(Stored, bool), ApiError>
    where
        F: Future<Output = Stored> + Send + 'static,
    {
        let key = match headers.get(IDEMPOTENCY_HEADER) {
            None => None,
            Some(v) => match v.to_str() {
                Ok(k) if !k.is_empty() && k.len() <= MAX_KEY_LEN => Some(k.to_string()),
                _ => {
                    return Err(ApiError::from(Error::invalid(format!(
                        "{IDEMPOTENCY_HEADER} must be 1 to {MAX_KEY_LEN} visible characters"
                    ))))
                }
            },
        };
        let Some(key) = key else {
            return Ok((spawned(op).await, true));
        };
        // The same key on another route or with another body is another request.
        let print = digest(scope, fingerprint);
        let (answer, first) = {
            let mut guard = self.entries.lock().unwrap_or_else(|p| p.into_inner());
            let (next_serial, entries) = &mut *guard;
            let ttl = self.ttl;
            entries.retain(|_, e| e.at.elapsed() < ttl);
            match entries.get(&key) {
                Some(entry) if entry.fingerprint != print => {
                    return Err(ApiError::from(Error::invalid(format!(
                        "{IDEMPOTENCY_HEADER} (operation id) was already used for a different \
                         request"
                    ))))
                }
                // A transient failure is not replayed: the retry runs the call again.
                Some(entry) if entry.answer.peek().is_none_or(Stored::is_final) => {
                    (entry.answer.clone(), false)
                }
                _ => {
                    if !entries.contains_key(&key) && entries.len() >= self.max_entries {
                        let oldest = entries
                            .iter()
                            .filter(|(_, e)| e.answer.peek().is_some())
                            .min_by_key(|(_, e)| e.serial)
                            .map(|(k, _)| k.clone());
                        match oldest {
                            Some(k) => {
                                entries.remove(&k);
                            }
                            None => {
                                return Err(ApiError::from(Error::RateLimited {
                                    message: format!(
                                        "{} operations are running: try again shortly",
                                        entries.len()
                                    ),
                                    retry_after_ms: Some(1000),
                                }))
                            }
                        }
                    }
                    *next_serial += 1;
                    let answer = spawned(op).boxed().shared();
                    entries.insert(
                        key,
                        Entry {
                            at: Instant::now(),
                            serial: *next_serial,
                            fingerprint: print,
                            answer: answer.clone(),
                        },
                    );
                    (answer, true)
                }
            }
        };
        Ok((answer.await, first))
    }
}

/// The digest a record keeps of a request: its scope (no newline in it), a newline, its body.
fn digest(scope: &str, fingerprint: &[u8]) -> [u8; 32] {
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    context.update(scope.as_bytes());
    context.update(b"\n");
    context.update(fingerprint);
    let mut out = [0u8; 32];
    out.copy_from_slice(context.finish().as_ref());
    out
}

/// Run `op` on its own task (started now, whether or not anyone awaits the result).
fn spawned<F>(op: F) -> impl Future<Output = Stored> + Send + 'static
where
    F: Future<Output = Stored> + Send + 'static,
{
    let task = tokio::spawn(op);
    async move {
        task.await.unwrap_or_else(|e| {
            Stored::of::<()>(Err(Error::backend(format!("the operation failed: {e}"))))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keyed(key: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(IDEMPOTENCY_HEADER, HeaderValue::from_str(key).unwrap());
        headers
    }

    /// A flood of distinct keys, each with a large request, keeps no more than the record
    /// bound's worth of small records: the request bodies themselves are not retained.
    #[tokio::test]
    async fn records_do_not_keep_request_bodies() {
        let records = Idempotency::new(Duration::from_secs(600), 64);
        let body = vec![b'x'; 256 * 1024];
        for i in 0..200 {
            let response = records
                .run(&keyed(&format!("k{i}")), "create", &body, async {
                    Stored::unit(Ok(()))
                })
                .await;
            assert_eq!(response.status(), StatusCode::NO_CONTENT);
        }
        let (count, kept) = {
            let guard = records.entries.lock().unwrap();
            let kept: usize = guard.1.values().map(|e| e.fingerprint.len()).sum();
            (guard.1.len(), kept)
        };
        assert_eq!(count, 64, "the count bound holds");
        assert!(
            kept <= 64 * 64,
            "records keep {kept} bytes of request fingerprints for 64 records"
        );
        // The digest still tells requests apart: the same key with another body is refused,
        // with the same body it replays.
        let again = records
            .run_stored(&keyed("k199"), "create", &body, async {
                Stored::unit(Ok(()))
            })
            .await;
        assert!(matches!(again, Ok((_, false))));
        let mut other = body.clone();
        other[0] = b'y';
        let refused = records
            .run_stored(&keyed("k199"), "create", &other, async {
                Stored::unit(Ok(()))
            })
            .await;
        assert!(refused.is_err());
        let rescoped = records
            .run_stored(&keyed("k199"), "destroy a", &body, async {
                Stored::unit(Ok(()))
            })
            .await;
        assert!(rescoped.is_err());
    }
}
