//! File routes: downloads and watches stream frames, uploads stream the request body.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::body::{Body, BodyDataStream, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, Method};
use axum::response::Response;
use futures::stream::BoxStream;
use futures::StreamExt;
use serde::Deserialize;

use super::idempotency::{hashed, ContentDigest, Stored, UploadClaim};
use super::{
    content_length, error_frame, frames_response, json, json_frame, pieces_response, read_json,
    ApiError, AppState, In, Out, Route,
};
use sandcove_core::wire::body::{Chmod, Copy, Mkdir, Rename};
use sandcove_core::wire::{frame, FRAMES_CONTENT_TYPE, UPLOAD_CLEANUP_WAIT};
use sandcove_core::{
    ByteStream, Error, ErrorBody, ListDirOptions, RemoveOptions, WatchOptions, WatchStream,
    WriteOptions,
};
use sandcove_core::{ChmodOptions, ReadOptions, StatOptions};

/// Largest file chunk put in one frame.
const CHUNK: usize = 1024 * 1024;

pub(super) fn routes() -> Vec<Route> {
    vec![
        Route::new(
            Method::GET,
            "/v1/sandboxes/{id}/files",
            "read_file",
            "Download a file as frames",
            read_file,
        )
        .query(&["path", "user", "max_bytes"])
        .output(Out::Frames("file bytes")),
        Route::new(
            Method::PUT,
            "/v1/sandboxes/{id}/files",
            "write_file",
            "Upload a file: a frame stream (`d` data, then `x` to commit or `!` to abandon) or the raw bytes, streamed; `options` is a JSON WriteOptions (honours Idempotency-Key: a repeat with the same path, options and content answers the first outcome without writing; other content is a conflict)",
            write_file,
        )
        .query(&["path", "options"])
        .input(In::Upload)
        .output(Out::Json("FileStat")),
        Route::new(
            Method::DELETE,
            "/v1/sandboxes/{id}/files",
            "remove",
            "Remove a file, symlink or directory (honours Idempotency-Key)",
            remove,
        )
        .query(&["path", "recursive", "user"]),
        Route::new(
            Method::GET,
            "/v1/sandboxes/{id}/files/list",
            "list_dir",
            "List a directory to `depth` levels (`attributes=true`: with each entry's `user.` extended attributes)",
            list_dir,
        )
        .query(&["path", "depth", "user", "attributes"])
        .output(Out::Json("FileStat[]")),
        Route::new(
            Method::GET,
            "/v1/sandboxes/{id}/files/stat",
            "stat",
            "Metadata of one path, symlinks not followed (`attributes=true`: with its `user.` extended attributes)",
            stat,
        )
        .query(&["path", "user", "attributes"])
        .output(Out::Json("FileStat")),
        Route::new(
            Method::POST,
            "/v1/sandboxes/{id}/files/mkdir",
            "mkdir",
            "Create a directory (honours Idempotency-Key)",
            recorded("mkdir", |b, id, r: Mkdir| async move {
                b.mkdir(&id, &r.path, r.options).await
            }),
        )
        .input(In::Json("Mkdir"))
        .output(Out::Json("FileStat")),
        Route::new(
            Method::POST,
            "/v1/sandboxes/{id}/files/rename",
            "rename",
            "Rename (move) a path (honours Idempotency-Key)",
            recorded("rename", |b, id, r: Rename| async move {
                b.rename(&id, &r.from, &r.to, r.options).await
            }),
        )
        .input(In::Json("Rename"))
        .output(Out::Json("FileStat")),
        Route::new(
            Method::POST,
            "/v1/sandboxes/{id}/files/copy",
            "copy",
            "Copy a file or (recursive) a directory tree inside the sandbox (honours Idempotency-Key)",
            recorded("copy", |b, id, r: Copy| async move {
                b.copy(&id, &r.from, &r.to, r.options).await
            }),
        )
        .input(In::Json("Copy"))
        .output(Out::Json("FileStat")),
        Route::new(
            Method::POST,
            "/v1/sandboxes/{id}/files/chmod",
            "chmod",
            "Change permission bits (honours Idempotency-Key)",
            recorded("chmod", |b, id, r: Chmod| async move {
                b.chmod(&id, &r.path, ChmodOptions::new(r.mode)).await
            }),
        )
        .input(In::Json("Chmod"))
        .output(Out::Json("FileStat")),
        Route::new(
            Method::GET,
            "/v1/sandboxes/{id}/files/watch",
            "watch",
            "Filesystem events under a directory, as frames",
            watch,
        )
        .query(&["path", "recursive", "user", "report_ownership"])
        .output(Out::Frames("filesystem events")),
    ]
}

/// A download as frames, each item one or more whole frames in pieces: the file's chunks
/// cross without being copied behind their heads.
fn download_frames(data: ByteStream) -> BoxStream<'static, Vec<Vec<u8>>> {
    enum St {
        Data(ByteStream),
        Done,
    }
    futures::stream::unfold(St::Data(data), |st| async move {
        let St::Data(mut data) = st else {
            return None;
        };
        let pieces = match data.next().await {
            None => return Some((vec![frame::encode(frame::END, b"")], St::Done)),
            // The common chunk crosses without a copy: its head, then the bytes.
            Some(Ok(bytes)) if bytes.len() <= CHUNK => {
                vec![frame::head(frame::DATA, bytes.len()).to_vec(), bytes]
            }
            Some(Ok(bytes)) => bytes
                .chunks(CHUNK)
                .map(|chunk| frame::encode(frame::DATA, chunk))
                .collect(),
            Some(Err(e)) => return Some((vec![error_frame(&e)], St::Done)),
        };
        Some((pieces, St::Data(data)))
    })
    .boxed()
}

fn watch_frames(events: WatchStream) -> BoxStream<'static, Vec<u8>> {
    enum St {
        Events(WatchStream),
        Done,
    }
    futures::stream::unfold(St::Events(events), |st| async move {
        let St::Events(mut events) = st else {
            return None;
        };
        match events.next().await {
            None => Some((frame::encode(frame::END, b""), St::Done)),
            Some(Ok(event)) => Some((json_frame(&event), St::Events(events))),
            Some(Err(e)) => Some((error_frame(&e), St::Done)),
        }
    })
    .boxed()
}

async fn read_file(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<ReadQuery>,
) -> Result<Response, ApiError> {
    let mut options = ReadOptions::default();
    options.user = q.user;
    options.max_bytes = q.max_bytes;
    let data = state.backend.read_file(&id, &q.path, options).await?;
    Ok(pieces_response(&state, download_frames(data), &[]))
}

#[derive(Deserialize)]
struct WriteQuery {
    path: String,
    options: Option<String>,
}

/// An upload under an operation id is recorded with the digest of its content, hashed as
/// it streams (see [`Idempotency::claim_upload`](super::idempotency::Idempotency)): the same
/// id, path, options and content again answers the first outcome without writing; other
/// content under that id is a conflict, and the file is not touched.
async fn write_file(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<WriteQuery>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let options: WriteOptions = match q.options.as_deref() {
        None | Some("") => WriteOptions::default(),
        Some(text) => {
            serde_json::from_str(text).map_err(|e| Error::invalid(format!("options: {e}")))?
        }
    };
    options.validate()?;
    // The server's bound, and never past the backend's largest file or the caller's own
    // (0 is a remote backend's "not learned yet": no bound of its own known).
    let backend_max = match state.backend.capabilities().max_file_bytes {
        0 => u64::MAX,
        n => n,
    };
    let limit = state
        .config
        .max_upload_bytes
        .min(backend_max)
        .min(options.max_bytes.unwrap_or(u64::MAX));
    let framed = is_framed(&headers);
    // A raw body's length is the file's; a framed body's adds five bytes a frame, so there
    // only the decoder can count.
    if !framed && content_length(&headers).is_some_and(|len| len > limit) {
        return Err(upload_too_large(&q.path, limit));
    }
    let options_text = serde_json::to_string(&options)
        .map_err(|e| Error::backend(format!("cannot encode the options: {e}")))?;
    let scope = format!("write {id}\n{}\n{options_text}", q.path);
    let content = ContentDigest::default();
    let mut upload = Upload {
        backend: state.backend.clone(),
        id,
        path: q.path,
        options,
        limit,
        framed,
        body,
    };
    match state
        .idempotency
        .claim_upload(&headers, &scope, content.clone())?
    {
        UploadClaim::Unkeyed => Ok(json(&upload.write(None).await?)),
        UploadClaim::First(recorder) => Ok(recorder
            .run(async move { Stored::of(upload.write(Some(content)).await) })
            .await
            .into_response()),
        UploadClaim::Repeat { answer, digest } => {
            if upload.digest().await? == digest {
                Ok(answer.into_response())
            } else {
                Err(Error::Conflict {
                    what: format!(
                        "the operation id was already used to write other content to {:?}; \
                         the file was left as it is: mint a new operation id for a new write",
                        upload.path
                    ),
                }
                .into())
            }
        }
    }
}

/// One upload request, as received.
struct Upload {
    backend: Arc<dyn sandcove_core::Backend>,
    id: String,
    path: String,
    options: WriteOptions,
    limit: u64,
    framed: bool,
    body: Body,
}

impl Upload {
    /// The body as file bytes: an error item when it breaks off (a body that stalls breaks
    /// off at the connection's body idle bound), is abandoned or goes past the limit (which
    /// sets `over`).
    fn data(body: Body, framed: bool, limit: u64, over: Arc<Over>) -> ByteStream {
        let data = body.into_data_stream();
        if framed {
            framed_upload(data, limit, over)
        } else {
            upload_stream(data, limit, over)
        }
    }

    /// Write the body to the file, hashing it into `content` on the way when given.
    async fn write(
        self,
        content: Option<ContentDigest>,
    ) -> sandcove_core::Result<sandcove_core::FileStat> {
        let Upload {
            backend,
            id,
            path,
            options,
            limit,
            framed,
            body,
        } = self;
        let over = Arc::new(Over::default());
        let mut data = Self::data(body, framed, limit, over.clone());
        if let Some(content) = content {
            data = hashed(data, content);
        }
        let target = path.clone();
        let write = async move { backend.write_file(&id, &target, data, options).await };
        hand_over(write, over, &path, limit).await
    }

    /// The digest of the body's content, read through and discarded (a repeat of a recorded
    /// upload: nothing is written, and nothing is kept but the running digest).
    async fn digest(&mut self) -> sandcove_core::Result<[u8; 32]> {
        let over = Arc::new(Over::default());
        let body = std::mem::replace(&mut self.body, Body::empty());
        let content = ContentDigest::default();
        let mut data = hashed(
            Self::data(body, self.framed, self.limit, over.clone()),
            content.clone(),
        );
        while let Some(item) = data.next().await {
            if let Err(e) = item {
                if over.flag.load(Ordering::SeqCst) {
                    return Err(too_large(&self.path, self.limit));
                }
                return Err(e);
            }
        }
        content
            .get()
            .copied()
            .ok_or_else(|| Error::backend("the upload's digest is missing"))
    }
}

/// A request body as the bytes it carries: a frame stream (`framed`) or raw bytes, ending in
/// an error item when it breaks off, is abandoned or passes `limit` (which `over` records).
/// Give the stream to its consumer with [`hand_over`].
pub(super) fn received(body: Body, framed: bool, limit: u64) -> (ByteStream, Arc<Over>) {
    let over = Arc::new(Over::default());
    (Upload::data(body, framed, limit, over.clone()), over)
}

/// Run `work`, which consumes an upload's stream (see [`received`]), and answer its outcome;
/// an upload past its bound answers [`Error::FileTooLarge`] naming `what`.
pub(super) async fn hand_over<T: Send + 'static>(
    work: impl std::future::Future<Output = sandcove_core::Result<T>> + Send + 'static,
    over: Arc<Over>,
    what: &str,
    limit: u64,
) -> sandcove_core::Result<T> {
    // The work runs in a task of its own: when the client goes away, hyper drops this
    // handler, and the backend must still finish discarding what it received.
    let mut task = tokio::spawn(work);
    // An abandoned upload (over the limit, broken off, or abandoned by the client) hands
    // the backend an error item; the backend answers once it has cleaned up, and so do
    // we, so the client sees the error only after the cleanup. A backend that never
    // answers is waited for a bounded time only.
    let joined = tokio::select! {
        joined = &mut task => Some(joined),
        () = async {
            over.notify.notified().await;
            tokio::time::sleep(UPLOAD_CLEANUP_WAIT).await;
        } => None,
    };
    if over.flag.load(Ordering::SeqCst) {
        return Err(too_large(what, limit));
    }
    match joined {
        Some(Ok(result)) => result,
        Some(Err(e)) => Err(Error::backend(format!("the upload's task failed: {e}"))),
        None => Err(Error::Timeout {
            what: "discarding an abandoned upload".into(),
        }),
    }
}

/// Whether a request body is a frame stream (else raw bytes).
pub(super) fn is_framed(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes() == FRAMES_CONTENT_TYPE.as_bytes())
}

/// An upload over its bound: [`Error::FileTooLarge`] (413), saying what bounds it.
pub(super) fn upload_too_large(path: &str, limit: u64) -> ApiError {
    too_large(path, limit).into()
}

/// [`upload_too_large`] as the core error.
fn too_large(path: &str, limit: u64) -> Error {
    Error::FileTooLarge {
        what: path.to_string(),
        limit,
        remedy: "the largest upload this server, its backend or the call takes".into(),
    }
}

/// An upload's abandonment: `notify` fires when its stream yields an error item (the client
/// broke off or abandoned it, or it passed its limit, which also sets `flag`).
#[derive(Default)]
pub(super) struct Over {
    flag: AtomicBool,
    notify: tokio::sync::Notify,
}

/// The raw request body as a [`ByteStream`]: an error item (never a silent end) when the
/// client breaks off or sends more than `limit` bytes, so the backend keeps no partial file.
fn upload_stream(data: BodyDataStream, limit: u64, over: Arc<Over>) -> ByteStream {
    Box::pin(futures::stream::unfold(Some((data, 0u64)), move |st| {
        let over = over.clone();
        async move {
            let (mut data, total) = st?;
            match next_piece(&mut data).await {
                None => None,
                Some(Ok(chunk)) => {
                    let total = total + chunk.len() as u64;
                    if total > limit {
                        over.flag.store(true, Ordering::SeqCst);
                        over.notify.notify_one();
                        let e = Error::invalid(format!("upload exceeds {limit} bytes"));
                        return Some((Err(e), None));
                    }
                    Some((Ok(chunk.to_vec()), Some((data, total))))
                }
                Some(Err(e)) => {
                    over.notify.notify_one();
                    Some((Err(broke_off(e)), None))
                }
            }
        }
    }))
}

/// The body's next piece. A client that stalls mid-upload gets an error item here from the
/// connection loop's body idle bound (see `super::stall`), which frees the connection and
/// the operation id.
async fn next_piece(data: &mut BodyDataStream) -> Option<Result<Bytes, String>> {
    data.next()
        .await
        .map(|item| item.map_err(|e| e.to_string()))
}

fn broke_off(e: impl std::fmt::Display) -> Error {
    Error::Backend {
        message: format!("the upload broke off: {e}"),
        retryable: true,
    }
}

/// A framed request body (see `sandcove_core::wire`) as a [`ByteStream`]: the `d`
/// payloads, ending at `x`. An `!` frame (the client abandons the write, saying why), a body
/// that ends or breaks off before `x`, a malformed frame or more than `limit` bytes yield an
/// error item instead, so the backend keeps no partial file.
fn framed_upload(data: BodyDataStream, limit: u64, over: Arc<Over>) -> ByteStream {
    struct St {
        data: BodyDataStream,
        decoder: frame::Decoder,
        total: u64,
    }
    let st = St {
        data,
        decoder: frame::Decoder::with_max_payload(frame::UPLOAD_MAX_PAYLOAD),
        total: 0,
    };
    Box::pin(futures::stream::unfold(Some(st), move |st| {
        let over = over.clone();
        async move {
            let mut st = st?;
            let fail = |e: Error| {
                over.notify.notify_one();
                Some((Err(e), None))
            };
            loop {
                let next = match st.decoder.next_frame() {
                    Ok(next) => next,
                    Err(e) => return fail(Error::invalid(format!("upload: {e}"))),
                };
                match next {
                    Some((frame::DATA, payload)) => {
                        st.total += payload.len() as u64;
                        if st.total > limit {
                            over.flag.store(true, Ordering::SeqCst);
                            return fail(Error::invalid(format!("upload exceeds {limit} bytes")));
                        }
                        if !payload.is_empty() {
                            return Some((Ok(payload), Some(st)));
                        }
                    }
                    Some((frame::END, _)) => {
                        // The end frame closes the body: anything after it is refused.
                        if st.decoder.pending() > 0 {
                            return fail(Error::invalid("upload: bytes after the end frame"));
                        }
                        loop {
                            match next_piece(&mut st.data).await {
                                None => return None,
                                Some(Ok(chunk)) if chunk.is_empty() => {}
                                Some(Ok(_)) => {
                                    return fail(Error::invalid(
                                        "upload: bytes after the end frame",
                                    ))
                                }
                                Some(Err(e)) => return fail(broke_off(e)),
                            }
                        }
                    }
                    Some((frame::ERROR, payload)) => {
                        let error = serde_json::from_slice::<ErrorBody>(&payload)
                            .map(|body| Error::from_body(&body))
                            .unwrap_or_else(|_| Error::invalid("the client abandoned the upload"));
                        return fail(error);
                    }
                    Some((kind, _)) => {
                        return fail(Error::invalid(format!(
                            "upload: unexpected frame kind {:?}",
                            kind as char
                        )))
                    }
                    None => match next_piece(&mut st.data).await {
                        Some(Ok(chunk)) => st.decoder.push(&chunk),
                        Some(Err(e)) => return fail(broke_off(e)),
                        None => return fail(broke_off("the body ended before its end frame")),
                    },
                }
            }
        }
    }))
}

#[derive(Deserialize)]
struct RemoveQuery {
    path: String,
    #[serde(default)]
    recursive: bool,
    user: Option<String>,
}

async fn remove(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<RemoveQuery>,
    headers: HeaderMap,
) -> Response {
    let backend = state.backend.clone();
    let mut options = RemoveOptions::default();
    options.recursive = q.recursive;
    options.user = q.user;
    let scope = format!("remove {id}");
    let print = format!("{}\n{}\n{:?}", q.path, options.recursive, options.user);
    state
        .idempotency
        .run(&headers, &scope, print.as_bytes(), async move {
            Stored::unit(backend.remove(&id, &q.path, options).await)
        })
        .await
}

#[derive(Deserialize)]
struct ListQuery {
    path: String,
    depth: Option<u32>,
    user: Option<String>,
    attributes: Option<bool>,
}

/// A read: the path, the user to act as, the bound.
#[derive(Deserialize)]
struct ReadQuery {
    path: String,
    user: Option<String>,
    max_bytes: Option<u64>,
}

/// A path, the sandbox user to act as, whether to read attributes (stat).
#[derive(Deserialize)]
struct StatQuery {
    path: String,
    user: Option<String>,
    attributes: Option<bool>,
}

async fn list_dir(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<ListQuery>,
) -> Result<Response, ApiError> {
    let mut options = ListDirOptions::default();
    options.depth = q.depth.unwrap_or(ListDirOptions::default().depth);
    options.user = q.user;
    options.attributes = q.attributes.unwrap_or(false);
    Ok(json(&state.backend.list_dir(&id, &q.path, options).await?))
}

async fn stat(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<StatQuery>,
) -> Result<Response, ApiError> {
    let mut options = StatOptions::default();
    options.user = q.user;
    options.attributes = q.attributes.unwrap_or(false);
    Ok(json(&state.backend.stat(&id, &q.path, options).await?))
}

/// The answer of a [`recorded`] handler.
type RecordedAnswer = futures::future::BoxFuture<'static, Result<Response, ApiError>>;

/// The handler of a metadata-changing call (mkdir, rename, copy, chmod) named `route`, with
/// its JSON body `T`, recorded under its operation id like every call with a remote effect:
/// a repeat answers the first outcome. `call` runs the backend call on the request.
fn recorded<T, F, Fut>(
    route: &'static str,
    call: F,
) -> impl FnOnce(State<AppState>, Path<String>, HeaderMap, Body) -> RecordedAnswer
       + Clone
       + Send
       + Sync
       + 'static
where
    T: serde::de::DeserializeOwned + Send + 'static,
    F: FnOnce(Arc<dyn sandcove_core::Backend>, String, T) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = sandcove_core::Result<sandcove_core::FileStat>>
        + Send
        + 'static,
{
    move |State(state), Path(id), headers, body| {
        Box::pin(async move {
            let (req, raw) = read_json::<T>(&state, &headers, body).await?;
            let backend = state.backend.clone();
            let scope = format!("{route} {id}");
            Ok(state
                .idempotency
                .run(&headers, &scope, &raw, async move {
                    Stored::of(call(backend, id, req).await)
                })
                .await)
        })
    }
}

#[derive(Deserialize)]
struct WatchQuery {
    path: String,
    #[serde(default)]
    recursive: bool,
    user: Option<String>,
    #[serde(default)]
    report_ownership: bool,
}

async fn watch(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<WatchQuery>,
) -> Result<Response, ApiError> {
    let mut options = WatchOptions::default();
    options.recursive = q.recursive;
    options.user = q.user;
    options.report_ownership = q.report_ownership;
    let events = state.backend.watch(&id, &q.path, options).await?;
    Ok(frames_response(&state, watch_frames(events), &[]))
}
