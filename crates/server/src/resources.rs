//! Previews, snapshots, volumes and images.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, Method};
use axum::response::{IntoResponse, Response};
use futures::stream::BoxStream;
use futures::StreamExt;

use super::idempotency::Stored;
use super::{
    content_length, done, error_frame, files, frames_response, json, json_frame, read_json,
    ApiError, AppState, In, Out, Route,
};
use sandcove_core::wire::body::{
    ImageReference, ImportQuery, NewSnapshot, NewToken, NewVolume, PullEvent, RevokeToken,
};
use sandcove_core::wire::FRAMES_CONTENT_TYPE;
use sandcove_core::{
    Backend, Error, ImagePullProgress, ImageSummary, PreviewOptions, PreviewTokenOptions,
    SnapshotOptions,
};

pub(super) fn routes() -> Vec<Route> {
    vec![
        Route::new(
            Method::POST,
            "/v1/sandboxes/{id}/previews",
            "expose_port",
            "Make a sandbox port reachable as a preview URL",
            expose_port,
        )
        .input(In::Json("PreviewOptions"))
        .output(Out::Json("Preview")),
        Route::new(
            Method::GET,
            "/v1/sandboxes/{id}/previews",
            "list_previews",
            "The sandbox's previews",
            list_previews,
        )
        .output(Out::Json("Preview[]")),
        Route::new(
            Method::DELETE,
            "/v1/sandboxes/{id}/previews/{port}",
            "close_preview",
            "Close a preview",
            close_preview,
        ),
        Route::new(
            Method::POST,
            "/v1/sandboxes/{id}/previews/{port}/tokens",
            "create_preview_token",
            "Issue another token for a private preview (honours Idempotency-Key)",
            create_preview_token,
        )
        .input(In::Json("NewToken"))
        .output(Out::Json("PreviewToken")),
        Route::new(
            Method::POST,
            "/v1/sandboxes/{id}/previews/{port}/tokens/revoke",
            "revoke_preview_token",
            "Revoke one token of a private preview (named by its value, in the body)",
            revoke_preview_token,
        )
        .input(In::Json("RevokeToken")),
        Route::new(
            Method::POST,
            "/v1/sandboxes/{id}/snapshots",
            "snapshot",
            "Snapshot the sandbox's filesystem (honours Idempotency-Key)",
            snapshot,
        )
        .input(In::Json("NewSnapshot"))
        .output(Out::Json("SnapshotInfo")),
        Route::new(
            Method::GET,
            "/v1/snapshots",
            "list_snapshots",
            "All snapshots",
            list_snapshots,
        )
        .output(Out::Json("SnapshotInfo[]")),
        Route::new(
            Method::DELETE,
            "/v1/snapshots/{snapshot_id}",
            "delete_snapshot",
            "Delete a snapshot (honours Idempotency-Key)",
            delete_snapshot,
        ),
        Route::new(
            Method::POST,
            "/v1/volumes",
            "create_volume",
            "Create a named volume (honours Idempotency-Key)",
            create_volume,
        )
        .input(In::Json("NewVolume"))
        .output(Out::Json("VolumeInfo")),
        Route::new(
            Method::GET,
            "/v1/volumes",
            "list_volumes",
            "All volumes",
            list_volumes,
        )
        .output(Out::Json("VolumeInfo[]")),
        Route::new(
            Method::GET,
            "/v1/volumes/{name}",
            "get_volume",
            "Describe a volume",
            get_volume,
        )
        .output(Out::Json("VolumeInfo")),
        Route::new(
            Method::DELETE,
            "/v1/volumes/{name}",
            "delete_volume",
            "Delete a volume (honours Idempotency-Key)",
            delete_volume,
        ),
        Route::new(
            Method::GET,
            "/v1/images",
            "list_images",
            "The images the runtime has stored",
            list_images,
        )
        .output(Out::Json("ImageSummary[]")),
        Route::new(
            Method::POST,
            "/v1/images/pull",
            "pull_image",
            "Pull an image from its registry into the runtime's store (answers once it is stored; asked with `Accept: application/vnd.sandcove.frames`, streams each layer's progress first)",
            pull_image,
        )
        .input(In::Json("ImageReference"))
        .output(Out::Json("ImageSummary")),
        Route::new(
            Method::POST,
            "/v1/images/import",
            "import_image",
            "Import the images of an archive (`oci-archive` or `docker save` tarball, compressed or not): the body is the archive, a frame stream (`d` data, then `x` to commit or `!` to abandon) or the raw bytes, streamed to the store and bounded by the largest upload and the store's own bound; `tag` names the image of a one-image archive",
            import_image,
        )
        .query(&["tag"])
        .input(In::Upload)
        .output(Out::Json("ImageSummary[]")),
        Route::new(
            Method::POST,
            "/v1/images/check",
            "image_availability",
            "Whether an image is stored, could be pulled, or neither (never pulls)",
            image_availability,
        )
        .input(In::Json("ImageReference"))
        .output(Out::Json("ImageAvailability")),
        Route::new(
            Method::POST,
            "/v1/images/inspect",
            "inspect_image",
            "Everything the store has of one image (a reference or a digest): its config's run settings, platform and layers (never pulls)",
            inspect_image,
        )
        .input(In::Json("ImageReference"))
        .output(Out::Json("ImageDetails")),
        Route::new(
            Method::POST,
            "/v1/images/remove",
            "remove_image",
            "Remove an image reference from the store",
            remove_image,
        )
        .input(In::Json("ImageReference")),
        Route::new(
            Method::POST,
            "/v1/images/prune",
            "prune_images",
            "Remove the images and layers nothing uses",
            prune_images,
        )
        .output(Out::Json("ImagePruneReport")),
        Route::new(
            Method::GET,
            "/v1/tombstones/{kind}/{id}",
            "tombstone",
            "The record of a resource that ended recently (null when there is none)",
            tombstone,
        )
        .output(Out::Json("Tombstone?")),
    ]
}

async fn expose_port(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (options, _) = read_json::<PreviewOptions>(&state, &headers, body).await?;
    Ok(json(&state.backend.expose_port(&id, options).await?))
}

async fn list_previews(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    Ok(json(&state.backend.list_previews(&id).await?))
}

async fn close_preview(
    State(state): State<AppState>,
    Path((id, port)): Path<(String, u16)>,
) -> Result<Response, ApiError> {
    state.backend.close_preview(&id, port).await?;
    Ok(done())
}

async fn create_preview_token(
    State(state): State<AppState>,
    Path((id, port)): Path<(String, u16)>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let (req, raw) = match read_json::<NewToken>(&state, &headers, body).await {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    let mut options = PreviewTokenOptions::default();
    options.expires_at = req.expires_at;
    let backend = state.backend.clone();
    let scope = format!("preview-token {id} {port}");
    state
        .idempotency
        .run(&headers, &scope, &raw, async move {
            Stored::of(backend.create_preview_token(&id, port, options).await)
        })
        .await
}

async fn revoke_preview_token(
    State(state): State<AppState>,
    Path((id, port)): Path<(String, u16)>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (req, _) = read_json::<RevokeToken>(&state, &headers, body).await?;
    state
        .backend
        .revoke_preview_token(&id, port, &req.token)
        .await?;
    Ok(done())
}

async fn snapshot(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let (req, raw) = match read_json::<NewSnapshot>(&state, &headers, body).await {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    let mut options = SnapshotOptions::default();
    options.name = req.name;
    options.memory = req.memory;
    let backend = state.backend.clone();
    let scope = format!("snapshot {id}");
    state
        .idempotency
        .run(&headers, &scope, &raw, async move {
            Stored::of(backend.snapshot(&id, options).await)
        })
        .await
}

async fn list_snapshots(State(state): State<AppState>) -> Result<Response, ApiError> {
    Ok(json(&state.backend.list_snapshots().await?))
}

async fn delete_snapshot(
    State(state): State<AppState>,
    Path(snapshot_id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let backend = state.backend.clone();
    let scope = format!("delete snapshot {snapshot_id}");
    state
        .idempotency
        .run(&headers, &scope, b"", async move {
            Stored::unit(backend.delete_snapshot(&snapshot_id).await)
        })
        .await
}

async fn create_volume(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let (req, raw) = match read_json::<NewVolume>(&state, &headers, body).await {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    let backend = state.backend.clone();
    state
        .idempotency
        .run(&headers, "volume", &raw, async move {
            Stored::of(backend.create_volume(&req.name).await)
        })
        .await
}

async fn list_images(State(state): State<AppState>) -> Result<Response, ApiError> {
    Ok(json(&state.backend.list_images().await?))
}

async fn pull_image(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (req, _) = read_json::<ImageReference>(&state, &headers, body).await?;
    let streamed = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains(FRAMES_CONTENT_TYPE));
    if !streamed {
        return Ok(json(&state.backend.pull_image(&req.reference).await?));
    }
    let frames = pull_frames(state.backend.clone(), req.reference);
    Ok(frames_response(&state, frames, &[]))
}

/// Progress reported and not yet sent: each layer's latest report per state, so a client
/// that reads slowly costs a few entries per layer, never one per chunk downloaded, and
/// still sees every state a layer went through.
#[derive(Default)]
struct PendingProgress {
    reports: std::sync::Mutex<std::collections::VecDeque<ImagePullProgress>>,
    arrived: tokio::sync::Notify,
}

impl PendingProgress {
    fn push(&self, report: ImagePullProgress) {
        let mut reports = self.reports.lock().unwrap_or_else(|e| e.into_inner());
        match reports
            .iter_mut()
            .find(|r| r.index == report.index && r.state == report.state)
        {
            Some(older) => *older = report,
            None => reports.push_back(report),
        }
        drop(reports);
        self.arrived.notify_one();
    }

    fn pop(&self) -> Option<ImagePullProgress> {
        self.reports
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front()
    }
}

/// A pull as frames: `progress` events as the backend reports them, then `pulled` (or an
/// error frame). The pull runs in a task of its own, aborted when the client goes away (as a
/// JSON pull is cancelled with its request).
fn pull_frames(backend: Arc<dyn Backend>, reference: String) -> BoxStream<'static, Vec<u8>> {
    let pending = Arc::new(PendingProgress::default());
    let reporter = pending.clone();
    let task = tokio::spawn(async move {
        let report = move |p: ImagePullProgress| reporter.push(p);
        backend.pull_image_with_progress(&reference, &report).await
    });
    struct St {
        task: Option<AbortOnDrop>,
        pending: Arc<PendingProgress>,
        last: Option<Vec<u8>>,
    }
    let st = St {
        task: Some(AbortOnDrop(task)),
        pending,
        last: None,
    };
    futures::stream::unfold(Some(st), |st| async move {
        let mut st = st?;
        loop {
            // Every report made before the pull ended goes out before its outcome.
            if let Some(report) = st.pending.pop() {
                return Some((json_frame(&PullEvent::Progress(report)), Some(st)));
            }
            if let Some(last) = st.last.take() {
                return Some((last, None));
            }
            let task = st.task.as_mut()?;
            tokio::select! {
                () = st.pending.arrived.notified() => {}
                joined = &mut task.0 => {
                    st.task = None;
                    st.last = Some(match joined {
                        Ok(Ok(image)) => json_frame(&PullEvent::Pulled(image)),
                        Ok(Err(e)) => error_frame(&e),
                        Err(e) => error_frame(&Error::backend(format!("the pull task failed: {e}"))),
                    });
                }
            }
        }
    })
    .boxed()
}

/// A task aborted when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<sandcove_core::Result<ImageSummary>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The archive streams to the backend as it arrives (see `files::received`): never whole in
/// memory here, and past the largest upload it is refused with nothing imported.
async fn import_image(
    State(state): State<AppState>,
    Query(q): Query<ImportQuery>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let limit = state.config.max_upload_bytes;
    let framed = files::is_framed(&headers);
    // A raw body's length is the archive's; a framed body's only the decoder can count.
    if !framed && content_length(&headers).is_some_and(|len| len > limit) {
        return Err(files::upload_too_large(IMPORT_WHAT, limit));
    }
    let (archive, over) = files::received(body, framed, limit);
    let backend = state.backend.clone();
    let import = async move { backend.import_image(archive, q.tag.as_deref()).await };
    Ok(json(
        &files::hand_over(import, over, IMPORT_WHAT, limit).await?,
    ))
}

/// What an import's `413` names.
const IMPORT_WHAT: &str = "the image archive";

async fn image_availability(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (req, _) = read_json::<ImageReference>(&state, &headers, body).await?;
    Ok(json(
        &state.backend.image_availability(&req.reference).await?,
    ))
}

async fn inspect_image(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (req, _) = read_json::<ImageReference>(&state, &headers, body).await?;
    Ok(json(&state.backend.inspect_image(&req.reference).await?))
}

async fn remove_image(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (req, _) = read_json::<ImageReference>(&state, &headers, body).await?;
    state.backend.remove_image(&req.reference).await?;
    Ok(done())
}

async fn prune_images(State(state): State<AppState>) -> Result<Response, ApiError> {
    Ok(json(&state.backend.prune_images().await?))
}

async fn list_volumes(State(state): State<AppState>) -> Result<Response, ApiError> {
    Ok(json(&state.backend.list_volumes().await?))
}

async fn get_volume(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    Ok(json(&state.backend.get_volume(&name).await?))
}

async fn delete_volume(
    State(state): State<AppState>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Response {
    let backend = state.backend.clone();
    let scope = format!("delete volume {name}");
    state
        .idempotency
        .run(&headers, &scope, b"", async move {
            Stored::unit(backend.delete_volume(&name).await)
        })
        .await
}

async fn tombstone(
    State(state): State<AppState>,
    Path((kind, id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let kind: sandcove_core::ResourceKind = kind.parse()?;
    Ok(json(&state.backend.tombstone(kind, &id).await?))
}
