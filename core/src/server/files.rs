//! File routes: downloads and watches stream frames, uploads stream the request body.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Method};
use axum::response::Response;
use futures::stream::BoxStream;
use futures::StreamExt;
use serde::Deserialize;

use super::{
    content_length, done, error_frame, frames_response, json, json_frame, read_json, too_large,
    ApiError, AppState, In, Out, Route,
};
use crate::backend::http::body::{Chmod, Mkdir, Rename};
use crate::backend::http::frame;
use crate::{
    ByteStream, Error, ListDirOptions, RemoveOptions, WatchOptions, WatchStream, WriteOptions,
};

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
        .query(&["path"])
        .output(Out::Frames("file bytes")),
        Route::new(
            Method::PUT,
            "/v1/sandboxes/{id}/files",
            "write_file",
            "Upload a file: the raw request body, streamed; `options` is a JSON WriteOptions",
            write_file,
        )
        .query(&["path", "options"])
        .input(In::Raw)
        .output(Out::Json("FileStat")),
        Route::new(
            Method::DELETE,
            "/v1/sandboxes/{id}/files",
            "remove",
            "Remove a file, symlink or directory",
            remove,
        )
        .query(&["path", "recursive"]),
        Route::new(
            Method::GET,
            "/v1/sandboxes/{id}/files/list",
            "list_dir",
            "List a directory to `depth` levels",
            list_dir,
        )
        .query(&["path", "depth"])
        .output(Out::Json("FileStat[]")),
        Route::new(
            Method::GET,
            "/v1/sandboxes/{id}/files/stat",
            "stat",
            "Metadata of one path, symlinks not followed",
            stat,
        )
        .query(&["path"])
        .output(Out::Json("FileStat")),
        Route::new(
            Method::POST,
            "/v1/sandboxes/{id}/files/mkdir",
            "mkdir",
            "Create a directory",
            mkdir,
        )
        .input(In::Json("Mkdir"))
        .output(Out::Json("FileStat")),
        Route::new(
            Method::POST,
            "/v1/sandboxes/{id}/files/rename",
            "rename",
            "Rename (move) a path",
            rename,
        )
        .input(In::Json("Rename"))
        .output(Out::Json("FileStat")),
        Route::new(
            Method::POST,
            "/v1/sandboxes/{id}/files/chmod",
            "chmod",
            "Change permission bits",
            chmod,
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
        .query(&["path", "recursive"])
        .output(Out::Frames("filesystem events")),
    ]
}

#[derive(Deserialize)]
struct PathQuery {
    path: String,
}

fn download_frames(data: ByteStream) -> BoxStream<'static, Vec<u8>> {
    enum St {
        Data(ByteStream),
        Done,
    }
    futures::stream::unfold(St::Data(data), |st| async move {
        let St::Data(mut data) = st else {
            return None;
        };
        match data.next().await {
            None => Some((frame::encode(frame::END, b""), St::Done)),
            Some(Ok(bytes)) => {
                let mut out = Vec::with_capacity(bytes.len() + 5);
                for chunk in bytes.chunks(CHUNK) {
                    out.extend(frame::encode(frame::DATA, chunk));
                }
                Some((out, St::Data(data)))
            }
            Some(Err(e)) => Some((error_frame(&e), St::Done)),
        }
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
    Query(q): Query<PathQuery>,
) -> Result<Response, ApiError> {
    let data = state.backend.read_file(&id, &q.path).await?;
    Ok(frames_response(&state, download_frames(data), &[]))
}

#[derive(Deserialize)]
struct WriteQuery {
    path: String,
    options: Option<String>,
}

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
    let limit = state.config.max_upload_bytes;
    if content_length(&headers).is_some_and(|len| len > limit) {
        return Err(too_large(limit));
    }
    let over = Arc::new(Over::default());
    let data = upload_stream(body, limit, over.clone());
    // Past the limit the answer is 413 at once, whatever the backend does with the error
    // item it is handed (the write is abandoned). The same when the client breaks off.
    let result = tokio::select! {
        result = state.backend.write_file(&id, &q.path, data, options) => Some(result),
        () = over.notify.notified() => None,
    };
    if over.flag.load(Ordering::SeqCst) {
        return Err(too_large(limit));
    }
    match result {
        Some(result) => Ok(json(&result?)),
        None => Err(Error::invalid("the upload broke off").into()),
    }
}

/// An upload to abandon: `notify` fires when it passes its limit (`flag` set) or the
/// client's body breaks off.
#[derive(Default)]
struct Over {
    flag: AtomicBool,
    notify: tokio::sync::Notify,
}

/// The request body as a [`ByteStream`]: an error item (never a silent end) when the client
/// breaks off or sends more than `limit` bytes, so the backend keeps no partial file.
fn upload_stream(body: Body, limit: u64, over: Arc<Over>) -> ByteStream {
    let data = body.into_data_stream();
    Box::pin(futures::stream::unfold(Some((data, 0u64)), move |st| {
        let over = over.clone();
        async move {
            let (mut data, total) = st?;
            match data.next().await {
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
                    let e = Error::Backend {
                        message: format!("the upload broke off: {e}"),
                        retryable: true,
                    };
                    Some((Err(e), None))
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
}

async fn remove(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<RemoveQuery>,
) -> Result<Response, ApiError> {
    let options = RemoveOptions {
        recursive: q.recursive,
    };
    state.backend.remove(&id, &q.path, options).await?;
    Ok(done())
}

#[derive(Deserialize)]
struct ListQuery {
    path: String,
    depth: Option<u32>,
}

async fn list_dir(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<ListQuery>,
) -> Result<Response, ApiError> {
    let options = ListDirOptions {
        depth: q.depth.unwrap_or(ListDirOptions::default().depth),
    };
    Ok(json(&state.backend.list_dir(&id, &q.path, options).await?))
}

async fn stat(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<PathQuery>,
) -> Result<Response, ApiError> {
    Ok(json(&state.backend.stat(&id, &q.path).await?))
}

async fn mkdir(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (req, _) = read_json::<Mkdir>(&state, &headers, body).await?;
    Ok(json(
        &state.backend.mkdir(&id, &req.path, req.options).await?,
    ))
}

async fn rename(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (req, _) = read_json::<Rename>(&state, &headers, body).await?;
    Ok(json(&state.backend.rename(&id, &req.from, &req.to).await?))
}

async fn chmod(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (req, _) = read_json::<Chmod>(&state, &headers, body).await?;
    Ok(json(&state.backend.chmod(&id, &req.path, req.mode).await?))
}

#[derive(Deserialize)]
struct WatchQuery {
    path: String,
    #[serde(default)]
    recursive: bool,
}

async fn watch(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<WatchQuery>,
) -> Result<Response, ApiError> {
    let options = WatchOptions {
        recursive: q.recursive,
    };
    let events = state.backend.watch(&id, &q.path, options).await?;
    Ok(frames_response(&state, watch_frames(events), &[]))
}
