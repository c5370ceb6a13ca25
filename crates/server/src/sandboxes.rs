//! Sandbox lifecycle routes.

use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Method};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::idempotency::Stored;
use super::{json, read_json, ApiError, AppState, In, Out, Route};
use sandcove_core::wire::body::{SetLabels, SetOnTimeout, SetTimeout};
use sandcove_core::{
    AnnotationUpdate, CreateOptions, Error, ListOptions, SetLabelsOptions, SetTimeoutOptions,
};

pub(super) fn routes() -> Vec<Route> {
    vec![
        Route::new(
            Method::GET,
            "/v1/capabilities",
            "capabilities",
            "What the served backend can do",
            capabilities,
        )
        .output(Out::Json("Capabilities")),
        Route::new(
            Method::POST,
            "/v1/sandboxes",
            "create",
            "Create a sandbox (honours Idempotency-Key)",
            create,
        )
        .input(In::Json("CreateOptions"))
        .output(Out::Json("SandboxInfo")),
        Route::new(
            Method::GET,
            "/v1/sandboxes",
            "list",
            "Live sandboxes passing the filter (a JSON ListOptions)",
            list,
        )
        .query(&["filter"])
        .output(Out::Json("SandboxInfo[]")),
        Route::new(
            Method::GET,
            "/v1/sandboxes/{id}",
            "get",
            "Describe one sandbox",
            get,
        )
        .output(Out::Json("SandboxInfo")),
        Route::new(
            Method::DELETE,
            "/v1/sandboxes/{id}",
            "destroy",
            "Destroy a sandbox (honours Idempotency-Key)",
            destroy,
        ),
        Route::new(
            Method::PUT,
            "/v1/sandboxes/{id}/timeout",
            "set_timeout",
            "Move the end of the lease to `timeout` seconds from now",
            set_timeout,
        )
        .input(In::Json("SetTimeout"))
        .output(Out::Json("SandboxInfo")),
        Route::new(
            Method::PUT,
            "/v1/sandboxes/{id}/on-timeout",
            "set_on_timeout",
            "Change what the end of the lease does (`destroy`, `pause` or `stop`)",
            set_on_timeout,
        )
        .input(In::Json("SetOnTimeout"))
        .output(Out::Json("SandboxInfo")),
        Route::new(
            Method::PUT,
            "/v1/sandboxes/{id}/labels",
            "set_labels",
            "Replace the sandbox's labels",
            set_labels,
        )
        .input(In::Json("SetLabels"))
        .output(Out::Json("SandboxInfo")),
        Route::new(
            Method::POST,
            "/v1/sandboxes/{id}/annotations",
            "update_annotations",
            "Change the sandbox's annotations atomically (compare-and-set included); answers the map now in force",
            update_annotations,
        )
        .input(In::Json("AnnotationUpdate"))
        .output(Out::Json("Annotations")),
        Route::new(
            Method::POST,
            "/v1/sandboxes/{id}/stop",
            "stop",
            "End every process of the sandbox, keeping its files; its lease pauses",
            stop,
        )
        .output(Out::Json("SandboxInfo")),
        Route::new(
            Method::POST,
            "/v1/sandboxes/{id}/start",
            "start",
            "Run a stopped sandbox again",
            start,
        )
        .output(Out::Json("SandboxInfo")),
        Route::new(
            Method::POST,
            "/v1/sandboxes/{id}/pause",
            "pause",
            "Freeze every process of the sandbox",
            pause,
        )
        .output(Out::Json("SandboxInfo")),
        Route::new(
            Method::POST,
            "/v1/sandboxes/{id}/resume",
            "resume",
            "Continue a paused sandbox",
            resume,
        )
        .output(Out::Json("SandboxInfo")),
        Route::new(
            Method::GET,
            "/v1/sandboxes/{id}/metrics",
            "metrics",
            "Current resource usage",
            metrics,
        )
        .output(Out::Json("Metrics")),
        Route::new(
            Method::POST,
            "/v1/sandboxes/{id}/fork",
            "fork",
            "A new sandbox with a copy of this one's files (honours Idempotency-Key)",
            fork,
        )
        .input(In::Json("CreateOptions"))
        .output(Out::Json("SandboxInfo")),
    ]
}

async fn capabilities(State(state): State<AppState>) -> Response {
    match state.backend.ready().await {
        // This server signs and serves file URLs itself, whatever its backend does.
        Ok(mut caps) => {
            caps.file_urls = true;
            json(&caps)
        }
        Err(e) => ApiError::from(e).into_response(),
    }
}

async fn create(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let (options, raw) = match read_json::<CreateOptions>(&state, &headers, body).await {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    let backend = state.backend.clone();
    state
        .idempotency
        .run(&headers, "create", &raw, async move {
            Stored::of(backend.create(options).await)
        })
        .await
}

#[derive(Deserialize)]
struct ListQuery {
    filter: Option<String>,
}

async fn list(
    State(state): State<AppState>,
    Query(query): Query<ListQuery>,
) -> Result<Response, ApiError> {
    let options: ListOptions = match query.filter.as_deref() {
        None | Some("") => ListOptions::default(),
        Some(text) => {
            serde_json::from_str(text).map_err(|e| Error::invalid(format!("filter: {e}")))?
        }
    };
    Ok(json(&state.backend.list(options).await?))
}

async fn get(State(state): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    Ok(json(&state.backend.get(&id).await?))
}

async fn destroy(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let backend = state.backend.clone();
    let scope = format!("destroy {id}");
    state
        .idempotency
        .run(&headers, &scope, b"", async move {
            Stored::unit(backend.destroy(&id).await)
        })
        .await
}

async fn set_timeout(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (req, _) = read_json::<SetTimeout>(&state, &headers, body).await?;
    if !(req.timeout.is_finite() && (0.0..1e12).contains(&req.timeout)) {
        return Err(Error::invalid(format!("timeout {} is out of range", req.timeout)).into());
    }
    let options = SetTimeoutOptions::new(Duration::from_secs_f64(req.timeout));
    Ok(json(&state.backend.set_timeout(&id, options).await?))
}

async fn set_on_timeout(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (req, _) = read_json::<SetOnTimeout>(&state, &headers, body).await?;
    let options = sandcove_core::SetOnTimeoutOptions::new(req.on_timeout);
    Ok(json(&state.backend.set_on_timeout(&id, options).await?))
}

async fn set_labels(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (req, _) = read_json::<SetLabels>(&state, &headers, body).await?;
    let options = SetLabelsOptions::new(req.labels);
    Ok(json(&state.backend.set_labels(&id, options).await?))
}

async fn update_annotations(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (update, _) = read_json::<AnnotationUpdate>(&state, &headers, body).await?;
    Ok(json(&state.backend.update_annotations(&id, update).await?))
}

async fn stop(State(state): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    Ok(json(&state.backend.stop(&id).await?))
}

async fn start(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    Ok(json(&state.backend.start(&id).await?))
}

async fn pause(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    Ok(json(&state.backend.pause(&id).await?))
}

async fn resume(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    Ok(json(&state.backend.resume(&id).await?))
}

async fn metrics(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    Ok(json(&state.backend.metrics(&id).await?))
}

async fn fork(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let (options, raw) = match read_json::<CreateOptions>(&state, &headers, body).await {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    let backend = state.backend.clone();
    let scope = format!("fork {id}");
    state
        .idempotency
        .run(&headers, &scope, &raw, async move {
            Stored::of(backend.fork(&id, options).await)
        })
        .await
}
