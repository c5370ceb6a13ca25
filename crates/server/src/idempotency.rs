//! Idempotency keys, which are the clients' operation ids (see [`sandcove_core::operation`]): the
//! first request with a key runs to completion on its own task, and every request with that
//! key gets the same answer while it is remembered. Records are bounded in time
//! ([`ServerConfig::idempotency_ttl`](super::ServerConfig)) and in count
//! ([`ServerConfig::max_operations`](super::ServerConfig)): at the count bound the oldest
//! finished record goes first; when every record is still running, a new keyed request is
//! refused as rate limited instead of forgetting one that may still act. A record keeps the
//! answer and digests of the request (never its body), so the same key sent with another
//! request is refused as [`Error::Conflict`]. An upload is identified by the digest of its
//! content, hashed while it streams ([`Idempotency::claim_upload`]). Records are scoped by
//! the client's credential (a digest of the API key it authenticated with, never the key
//! itself): a client holding another key neither replays nor observes them, nor collides
//! with them by choosing the same operation id.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::future::{BoxFuture, FutureExt, Shared};
use futures::StreamExt;

use super::ApiError;
use sandcove_core::wire::IDEMPOTENCY_HEADER;
use sandcove_core::{ByteStream, Error, ErrorBody, OperationStatus};

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
    pub(super) fn of<T: serde::Serialize>(result: sandcove_core::Result<T>) -> Stored {
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
                let status = StatusCode::from_u16(sandcove_core::wire::status_for(e.code()))
                    .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                Stored {
                    status,
                    body: serde_json::to_vec(&e.to_body()).unwrap_or_default().into(),
                }
            }
        }
    }

    /// A call that answers nothing: `204 No Content`, or its error.
    pub(super) fn unit(result: sandcove_core::Result<()>) -> Stored {
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

/// A recorded answer, shared by every request under its key.
type Answer = Shared<BoxFuture<'static, Stored>>;

struct Entry {
    at: Instant,
    serial: u64,
    /// [`request_print`] of the request.
    fingerprint: [u8; 32],
    /// An upload's content digest (see [`Idempotency::claim_upload`]).
    content: Option<ContentDigest>,
    answer: Answer,
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

    /// What is recorded about operation `key` (see [`sandcove_core::operation`]) of the client
    /// whose request carries `headers`.
    pub(super) fn status(&self, headers: &HeaderMap, key: &str) -> OperationStatus {
        let mut guard = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let ttl = self.ttl;
        guard.1.retain(|_, e| e.at.elapsed() < ttl);
        match guard.1.get(&scoped(headers, key)) {
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
        let Some(key) = key_of(headers)? else {
            return Ok((spawned(op).await, true));
        };
        let key = scoped(headers, &key);
        let print = request_print(scope, fingerprint);
        let (answer, first) = {
            let mut guard = self.entries.lock().unwrap_or_else(|p| p.into_inner());
            let (next_serial, entries) = &mut *guard;
            let ttl = self.ttl;
            entries.retain(|_, e| e.at.elapsed() < ttl);
            match entries.get(&key) {
                Some(entry) if entry.fingerprint != print => return Err(used_for_another()),
                // A transient failure is not replayed: the retry runs the call again.
                Some(entry) if entry.answer.peek().is_none_or(Stored::is_final) => {
                    (entry.answer.clone(), false)
                }
                _ => {
                    self.make_room(entries, &key)?;
                    let answer = spawned(op).boxed().shared();
                    record(next_serial, entries, key, print, None, &answer);
                    (answer, true)
                }
            }
        };
        Ok((answer.await, first))
    }

    /// Claim the idempotency key of an upload within `scope` (the route, the path and the
    /// options, all but the content). The content's digest is known only once the whole body
    /// has streamed through, so the first request records into `content` as it streams (see
    /// [`UploadClaim::First`]) and a repeat is compared only after its own body has been
    /// hashed. Decided at once, without waiting: the same key on another request, or while
    /// its first upload still runs, is [`Error::Conflict`]. A first upload whose body never
    /// arrived in full wrote nothing, so its key runs again, as after a transient failure.
    pub(super) fn claim_upload(
        &self,
        headers: &HeaderMap,
        scope: &str,
        content: ContentDigest,
    ) -> Result<UploadClaim, ApiError> {
        let Some(op) = key_of(headers)? else {
            return Ok(UploadClaim::Unkeyed);
        };
        let key = scoped(headers, &op);
        let print = request_print(scope, b"");
        let mut guard = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let (next_serial, entries) = &mut *guard;
        let ttl = self.ttl;
        entries.retain(|_, e| e.at.elapsed() < ttl);
        if let Some(entry) = entries.get(&key) {
            if entry.fingerprint != print {
                return Err(used_for_another());
            }
            match entry.answer.peek() {
                None => {
                    return Err(ApiError::from(Error::Conflict {
                        what: format!(
                            "operation {op:?} (the {IDEMPOTENCY_HEADER}) is a write that is \
                             still running: observe it, or send it again once it has finished"
                        ),
                    }))
                }
                Some(stored) if stored.is_final() => {
                    if let Some(digest) = entry.content.as_ref().and_then(|c| c.get()) {
                        return Ok(UploadClaim::Repeat {
                            answer: stored.clone(),
                            digest: *digest,
                        });
                    }
                }
                Some(_) => {}
            }
        }
        self.make_room(entries, &key)?;
        let (tx, rx) = tokio::sync::oneshot::channel();
        let answer = async move {
            rx.await.unwrap_or_else(|_| {
                Stored::of::<()>(Err(Error::backend("the write ended without an answer")))
            })
        }
        .boxed()
        .shared();
        record(next_serial, entries, key, print, Some(content), &answer);
        Ok(UploadClaim::First(Recorder { tx, answer }))
    }

    /// Make room for a new record under `key`: at the count bound the oldest finished record
    /// goes; when every record is still running, the request is refused as rate limited.
    fn make_room(&self, entries: &mut HashMap<String, Entry>, key: &str) -> Result<(), ApiError> {
        if entries.contains_key(key) || entries.len() < self.max_entries {
            return Ok(());
        }
        let oldest = entries
            .iter()
            .filter(|(_, e)| e.answer.peek().is_some())
            .min_by_key(|(_, e)| e.serial)
            .map(|(k, _)| k.clone());
        match oldest {
            Some(k) => {
                entries.remove(&k);
                Ok(())
            }
            None => Err(ApiError::from(Error::RateLimited {
                message: format!(
                    "{} operations are running: try again shortly",
                    entries.len()
                ),
                retry_after_ms: Some(1000),
            })),
        }
    }
}

/// BLAKE3 of an upload's bytes, set once all of them have arrived (never for a body that
/// broke off, was abandoned or went over its bound). BLAKE3 rather than the SHA-256 of the
/// request prints: every byte of every keyed upload passes through it, and it costs
/// between a third and a quarter of SHA-256's CPU per byte (100 MiB: 16 ms against 58–61 ms
/// on the 2-CPU machine of `BENCHMARKS.md`), CPU the upload's own copies compete for.
pub(super) type ContentDigest = Arc<OnceLock<[u8; 32]>>;

/// What [`Idempotency::claim_upload`] decided.
pub(super) enum UploadClaim {
    /// No idempotency key: write as asked, nothing recorded.
    Unkeyed,
    /// The first upload under its key: write through [`Recorder::run`], hashing the body
    /// into the claim's [`ContentDigest`].
    First(Recorder),
    /// A repeat of a finished upload: once the repeat's body is hashed, answer `answer` when
    /// its digest is `digest`; other content is a conflict. Either way nothing is written.
    Repeat {
        /// The first upload's answer.
        answer: Stored,
        /// The first upload's content digest.
        digest: [u8; 32],
    },
}

/// Records the outcome of the first request under a key.
pub(super) struct Recorder {
    tx: tokio::sync::oneshot::Sender<Stored>,
    answer: Answer,
}

impl Recorder {
    /// Run `op` on its own task (a client hanging up cannot cancel it), record its outcome
    /// and answer it.
    pub(super) async fn run<F>(self, op: F) -> Stored
    where
        F: Future<Output = Stored> + Send + 'static,
    {
        let Recorder { tx, answer } = self;
        tokio::spawn(async move {
            let _ = tx.send(op.await);
        });
        answer.await
    }
}

/// An upload's content as [`ContentDigest`] computes it: the bytes of `data`, in order.
///
/// A large chunk is hashed on the blocking pool while the next one is received, and is
/// handed on once hashed, so the digest does not stall the upload (nor the event loop) for
/// the 0.2 ms a MiB takes: at most two chunks are held here. Every chunk is hashed
/// before it is handed on, in order, and the digest is set only once the source has ended
/// cleanly, so a digest is never of content that did not all reach the writer's stream.
pub(super) fn hashed(data: ByteStream, content: ContentDigest) -> ByteStream {
    let state = Hashing {
        data: data.fuse(),
        context: Some(Box::new(blake3::Hasher::new())),
        job: None,
        held: None,
        content,
    };
    Box::pin(futures::stream::unfold(Some(state), |state| async move {
        state?.advance().await
    }))
}

/// Chunks up to this size are hashed in place: a hop to the blocking pool costs more.
const HASH_IN_PLACE: usize = 64 * 1024;

/// [`hashed`]'s state between items.
struct Hashing {
    data: futures::stream::Fuse<ByteStream>,
    /// The running digest; `None` while `job` holds it.
    context: Option<Box<blake3::Hasher>>,
    /// A chunk being hashed on the blocking pool, given back with the digest.
    job: Option<tokio::task::JoinHandle<(Box<blake3::Hasher>, Vec<u8>)>>,
    /// A chunk hashed already, to hand on next.
    held: Option<Vec<u8>>,
    content: ContentDigest,
}

impl Hashing {
    /// The next item and the state after it; `None` at the end.
    async fn advance(mut self) -> Option<(sandcove_core::Result<Vec<u8>>, Option<Hashing>)> {
        if let Some(chunk) = self.held.take() {
            return Some((Ok(chunk), Some(self)));
        }
        if self.job.is_none() {
            match self.data.next().await {
                Some(Ok(chunk)) => match self.hash(chunk) {
                    Ok(Some(chunk)) => return Some((Ok(chunk), Some(self))),
                    Ok(None) => {}
                    Err(e) => return Some((Err(e), None)),
                },
                Some(Err(e)) => return Some((Err(e), None)),
                None => {
                    self.finish();
                    return None;
                }
            }
        }
        // A chunk is being hashed: receive the next one meanwhile.
        let job = self.job.take()?;
        let (joined, next) = futures::join!(job, self.data.next());
        let Ok((context, chunk)) = joined else {
            return Some((Err(Error::backend("hashing the upload failed")), None));
        };
        self.context = Some(context);
        match next {
            Some(Ok(next)) => match self.hash(next) {
                Ok(held) => self.held = held,
                Err(e) => return Some((Err(e), None)),
            },
            // The upload fails: what came before it is discarded, not handed on.
            Some(Err(e)) => return Some((Err(e), None)),
            None => self.finish(),
        }
        Some((Ok(chunk), Some(self)))
    }

    /// Hash `chunk` into the digest: in place and given back when small, else started on
    /// the blocking pool (`job`), with `None` returned. No job may be running: one that is
    /// (the digest is not here) fails the upload rather than lose the chunk.
    fn hash(&mut self, chunk: Vec<u8>) -> sandcove_core::Result<Option<Vec<u8>>> {
        let Some(mut context) = self.context.take() else {
            return Err(Error::backend("hashing the upload out of order"));
        };
        if chunk.len() <= HASH_IN_PLACE {
            context.update(&chunk);
            self.context = Some(context);
            return Ok(Some(chunk));
        }
        self.job = Some(tokio::task::spawn_blocking(move || {
            context.update(&chunk);
            (context, chunk)
        }));
        Ok(None)
    }

    /// The source ended cleanly and every chunk is hashed: record the digest.
    fn finish(&mut self) {
        if let Some(context) = self.context.take() {
            let _ = self.content.set(*context.finalize().as_bytes());
        }
    }
}

/// The idempotency key of a request, if it has one (refused when malformed).
fn key_of(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    match headers.get(IDEMPOTENCY_HEADER) {
        None => Ok(None),
        Some(v) => match v.to_str() {
            Ok(k) if !k.is_empty() && k.len() <= MAX_KEY_LEN => Ok(Some(k.to_string())),
            _ => Err(ApiError::from(Error::invalid(format!(
                "{IDEMPOTENCY_HEADER} must be 1 to {MAX_KEY_LEN} visible characters"
            )))),
        },
    }
}

/// The record key of operation `op` of the client whose request carries `headers`: a
/// digest of the API key it authenticated with (the `Authorization` bearer value, checked
/// before any route runs), then the operation id. The key itself is never stored.
fn scoped(headers: &HeaderMap, op: &str) -> String {
    let credential = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .unwrap_or("");
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    context.update(b"sandcove principal\n");
    context.update(credential.as_bytes());
    let digest = context.finish();
    let mut scoped = String::with_capacity(64 + 1 + op.len());
    for b in digest.as_ref() {
        scoped.push_str(&format!("{b:02x}"));
    }
    scoped.push(' ');
    scoped.push_str(op);
    scoped
}

/// What identifies a request under its key: a digest of its route (`scope`) and body, so a
/// record keeps 32 bytes whatever the body's size. The same key on another route or with
/// another body is another request.
fn request_print(scope: &str, fingerprint: &[u8]) -> [u8; 32] {
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    context.update(scope.as_bytes());
    context.update(b"\n");
    context.update(fingerprint);
    let mut print = [0u8; 32];
    print.copy_from_slice(context.finish().as_ref());
    print
}

/// The answer to a key used for another request.
fn used_for_another() -> ApiError {
    ApiError::from(Error::Conflict {
        what: format!(
            "the {IDEMPOTENCY_HEADER} (operation id) was already used for a different request; \
             mint a new operation id for a new request"
        ),
    })
}

/// Record `answer` under `key` (the caller made room), and drive it to its end on a task of
/// its own, so the record completes (and `observe` reports it) even when the client that
/// sent it has gone and nobody awaits the answer.
fn record(
    next_serial: &mut u64,
    entries: &mut HashMap<String, Entry>,
    key: String,
    print: [u8; 32],
    content: Option<ContentDigest>,
    answer: &Answer,
) {
    *next_serial += 1;
    tokio::spawn(answer.clone());
    entries.insert(
        key,
        Entry {
            at: Instant::now(),
            serial: *next_serial,
            fingerprint: print,
            content,
            answer: answer.clone(),
        },
    );
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

    /// The hashing stream hands on every chunk, in order and unchanged, whatever their sizes
    /// (hashed in place or on the blocking pool), and its digest is the content's; a source
    /// that fails leaves no digest.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_upload_is_hashed_in_order_and_handed_on_whole() {
        let sizes = [
            1usize,
            200_000,
            3,
            70_000,
            1 << 20,
            10,
            65_536,
            1 << 20,
            0,
            5,
        ];
        let chunks: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| (0..n).map(|j| (i * 31 + j) as u8).collect())
            .collect();
        let whole = chunks.concat();
        let content = ContentDigest::default();
        let source: ByteStream =
            Box::pin(futures::stream::iter(chunks.clone().into_iter().map(Ok)));
        let got: Vec<Vec<u8>> = hashed(source, content.clone())
            .map(|c| c.unwrap())
            .collect()
            .await;
        assert_eq!(got, chunks);
        let expected = blake3::hash(&whole);
        assert_eq!(content.get().unwrap(), expected.as_bytes());

        let content = ContentDigest::default();
        let failing: ByteStream = Box::pin(futures::stream::iter(vec![
            Ok(vec![1u8; 1 << 20]),
            Err(Error::backend("source failed")),
            Ok(vec![2u8; 10]),
        ]));
        let items: Vec<_> = hashed(failing, content.clone()).collect().await;
        assert!(
            items.last().unwrap().is_err(),
            "the failure reaches the writer"
        );
        assert!(content.get().is_none(), "a failed upload has a digest");
    }

    fn keyed_by(credential: &str, key: &str) -> HeaderMap {
        let mut headers = keyed(key);
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {credential}")).unwrap(),
        );
        headers
    }

    /// Attack (fails): a client holding another API key reuses an operation id it saw (or
    /// guessed). It must not get the first client's answer, observe its outcome, or be
    /// refused because of it: each key has its own records, which hold no key.
    #[tokio::test]
    async fn records_are_scoped_by_api_key() {
        let records = Idempotency::new(Duration::from_secs(600), 64);
        let alice = keyed_by("key-of-alice", "op-1");
        let mallory = keyed_by("key-of-mallory", "op-1");
        let (stored, first) = records
            .run_stored(&alice, "create", b"{}", async {
                Stored::of(Ok(serde_json::json!({"id": "alices-sandbox"})))
            })
            .await
            .unwrap_or_else(|_| panic!("alice's create"));
        assert!(first && stored.is_success());
        assert!(matches!(
            records.status(&alice, "op-1"),
            OperationStatus::Done { .. }
        ));
        assert!(
            matches!(
                records.status(&mallory, "op-1"),
                OperationStatus::Unknown { .. }
            ),
            "another key observes alice's operation"
        );
        let (stored, first) = records
            .run_stored(&mallory, "create", b"{}", async {
                Stored::of(Ok(serde_json::json!({"id": "mallorys-sandbox"})))
            })
            .await
            .unwrap_or_else(|_| panic!("mallory's create"));
        assert!(first, "another key replayed alice's answer");
        assert_eq!(stored.value()["id"], "mallorys-sandbox");
        let other_body = records
            .run_stored(&keyed_by("key-of-eve", "op-1"), "destroy x", b"", async {
                Stored::unit(Ok(()))
            })
            .await;
        assert!(
            matches!(other_body, Ok((_, true))),
            "another key's request was refused as a conflict with alice's"
        );
        let guard = records.entries.lock().unwrap();
        assert!(
            guard.1.keys().all(|k| !k.contains("key-of-")),
            "a record holds an API key"
        );
    }
}
