//! Idempotency keys: the first request with a key runs to completion on its own task, and
//! every request with that key gets the same answer while it is remembered.

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
use crate::Error;

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

    fn into_response(self) -> Response {
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

    /// Worth replaying: transient failures are not, so a retry runs the call again.
    fn is_final(&self) -> bool {
        !(self.status.is_server_error() || self.status == StatusCode::TOO_MANY_REQUESTS)
    }
}

struct Entry {
    at: Instant,
    serial: u64,
    fingerprint: Vec<u8>,
    answer: Shared<BoxFuture<'static, Stored>>,
}

/// Remembered answers by key.
pub(super) struct Idempotency {
    ttl: Duration,
    entries: Mutex<(u64, HashMap<String, Entry>)>,
}

impl Idempotency {
    pub(super) fn new(ttl: Duration) -> Self {
        Idempotency {
            ttl,
            entries: Mutex::new((0, HashMap::new())),
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
        let key = match headers.get(IDEMPOTENCY_HEADER) {
            None => None,
            Some(v) => match v.to_str() {
                Ok(k) if !k.is_empty() && k.len() <= MAX_KEY_LEN => Some(format!("{scope} {k}")),
                _ => {
                    return ApiError::from(Error::invalid(format!(
                        "{IDEMPOTENCY_HEADER} must be 1 to {MAX_KEY_LEN} visible characters"
                    )))
                    .into_response()
                }
            },
        };
        let Some(key) = key else {
            return spawned(op).await.into_response();
        };
        let (serial, answer) = {
            let mut guard = self.entries.lock().unwrap_or_else(|p| p.into_inner());
            let (next_serial, entries) = &mut *guard;
            let ttl = self.ttl;
            entries.retain(|_, e| e.at.elapsed() < ttl);
            match entries.get(&key) {
                Some(entry) if entry.fingerprint != fingerprint => {
                    return ApiError::from(Error::invalid(format!(
                        "{IDEMPOTENCY_HEADER} was already used for a different request"
                    )))
                    .into_response()
                }
                Some(entry) => (entry.serial, entry.answer.clone()),
                None => {
                    *next_serial += 1;
                    let answer = spawned(op).boxed().shared();
                    entries.insert(
                        key.clone(),
                        Entry {
                            at: Instant::now(),
                            serial: *next_serial,
                            fingerprint: fingerprint.to_vec(),
                            answer: answer.clone(),
                        },
                    );
                    (*next_serial, answer)
                }
            }
        };
        let stored = answer.await;
        if !stored.is_final() {
            let mut guard = self.entries.lock().unwrap_or_else(|p| p.into_inner());
            if guard.1.get(&key).is_some_and(|e| e.serial == serial) {
                guard.1.remove(&key);
            }
        }
        stored.into_response()
    }
}

/// Run `op` on its own task (started now, whether or not anyone awaits the result).
fn spawned<F>(op: F) -> impl Future<Output = Stored> + Send + 'static
where
    F: Future<Output = Stored> + Send + 'static,
{
    let task = tokio::spawn(op);
    async move {
        task.await.unwrap_or_else(|e| {
            Stored::of::<()>(Err(Error::backend(format!("create failed: {e}"))))
        })
    }
}
