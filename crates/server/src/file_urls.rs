//! Signed file URLs on the native API: `POST /v1/sandboxes/{id}/file-urls` mints one (the
//! server key), `GET`/`PUT`/`POST /v1/file-urls/{signed}` use one (the URL alone: its token
//! is the credential, verified by the listener's credential check before routing, which
//! binds the request to the token's sandbox). The transfer is
//! [`sandcove_core::file_url::serve`], the same code the embedded engine's listener runs,
//! through this server's backend's `read_file`/`write_file`: the same confinement, user
//! checks and bounds as those routes, and nothing in the sandbox.

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, Method};
use axum::response::{IntoResponse, Response};
use axum::Extension;

use super::auth::Principal;
use super::{json, read_json, ApiError, AppState, In, Out, Route};

/// Only a signed URL.
const SIGNED_URL: &[Principal] = &[Principal::SignedUrl];
use sandcove_core::file_url::{self, BackendFiles};
use sandcove_core::wire::{API_PREFIX, FILE_URLS_SEGMENT};
use sandcove_core::{now_millis, FileGrant, FileUrl, FileUrlOptions};

pub(super) fn routes() -> Vec<Route> {
    vec![
        Route::new(
            Method::POST,
            "/v1/sandboxes/{id}/file-urls",
            "create_file_url",
            "Sign a URL for one operation on one path of the sandbox (FileUrlOptions); the answer's `url` is this server's path of it",
            create,
        )
        .input(In::Json("FileUrlOptions"))
        .output(Out::Json("FileUrl")),
        Route::new(
            Method::GET,
            "/v1/file-urls/{signed}",
            "read_file_url",
            "Read the file a signed URL names (its token is the credential)",
            use_url,
        )
        .accepts(SIGNED_URL),
        Route::new(
            Method::PUT,
            "/v1/file-urls/{signed}",
            "write_file_url",
            "Write the file a signed URL names: the raw body, or one `file` part of a multipart/form-data body",
            use_url,
        )
        .accepts(SIGNED_URL)
        .input(In::Raw)
        .output(Out::Json("FileStat")),
        Route::new(
            Method::POST,
            "/v1/file-urls/{signed}",
            "post_file_url",
            "As PUT, for HTML forms and clients that POST uploads",
            use_url,
        )
        .accepts(SIGNED_URL)
        .input(In::Raw)
        .output(Out::Json("FileStat")),
    ]
}

/// The path prefix of the signed URLs' route.
pub(super) fn prefix() -> String {
    format!("{API_PREFIX}/{FILE_URLS_SEGMENT}")
}

async fn create(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (options, _) = read_json::<FileUrlOptions>(&state, &headers, body).await?;
    options.validate(now_millis())?;
    // A URL is signed only for a sandbox that exists now (it stops working when it is gone).
    state.backend.get(&id).await?;
    let grant = FileGrant::new(id, &options);
    let token = state.file_urls.sign(&grant);
    Ok(json(&FileUrl::new(format!("{}/{token}", prefix()), &grant)))
}

async fn use_url(
    State(state): State<AppState>,
    Extension(grant): Extension<FileGrant>,
    request: Request,
) -> Response {
    let access = BackendFiles(state.backend.clone());
    file_url::serve(request, &grant, &access, state.config.max_upload_bytes)
        .await
        .map(Body::new)
        .into_response()
}
