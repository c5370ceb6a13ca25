//! Process routes: spawn and attach stream frames; stdin, signals and resizes are calls.

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Method};
use axum::response::Response;
use futures::stream::BoxStream;
use futures::StreamExt;
use serde::Deserialize;

use super::idempotency::Stored;
use super::{
    done, error_frame, frames_response, json, json_frame, read_body, read_json, ApiError, AppState,
    In, Out, Route,
};
use sandcove_core::wire::body::SignalBody;
use sandcove_core::wire::{frame, PID_HEADER};
use sandcove_core::{
    Error, ProcessEvent, ProcessSelector, ProcessSpec, ProcessStream, PtySize, ResizePtyOptions,
    SignalOptions, WriteStdinOptions,
};

const SELECTOR: &[&str] = &["pid", "tag"];

pub(super) fn routes() -> Vec<Route> {
    vec![
        Route::new(
            Method::POST,
            "/v1/sandboxes/{id}/processes",
            "spawn",
            "Start a process (honours Idempotency-Key: a repeat attaches to it); the pid is in the x-sandcove-pid header, the events follow as frames",
            spawn,
        )
        .input(In::Json("ProcessSpec"))
        .output(Out::Frames("process events")),
        Route::new(
            Method::GET,
            "/v1/sandboxes/{id}/processes",
            "list_processes",
            "Processes started through the API, running or recently finished",
            list_processes,
        )
        .output(Out::Json("ProcessInfo[]")),
        Route::new(
            Method::GET,
            "/v1/sandboxes/{id}/processes/attach",
            "attach",
            "Retained output then live events of a process (by pid or tag)",
            attach,
        )
        .query(SELECTOR)
        .output(Out::Frames("process events")),
        Route::new(
            Method::POST,
            "/v1/sandboxes/{id}/processes/stdin",
            "write_stdin",
            "Write the raw request body to a process's stdin",
            write_stdin,
        )
        .query(SELECTOR)
        .input(In::Raw),
        Route::new(
            Method::POST,
            "/v1/sandboxes/{id}/processes/stdin/close",
            "close_stdin",
            "Close a process's stdin",
            close_stdin,
        )
        .query(SELECTOR),
        Route::new(
            Method::POST,
            "/v1/sandboxes/{id}/processes/signal",
            "signal",
            "Signal a process's group",
            signal,
        )
        .query(SELECTOR)
        .input(In::Json("SignalBody")),
        Route::new(
            Method::POST,
            "/v1/sandboxes/{id}/processes/resize",
            "resize_pty",
            "Resize a process's pseudo-terminal",
            resize_pty,
        )
        .query(SELECTOR)
        .input(In::Json("PtySize")),
    ]
}

/// `?pid=` or `?tag=`, exactly one.
#[derive(Deserialize)]
struct Selector {
    pid: Option<u32>,
    tag: Option<String>,
}

impl Selector {
    fn get(self) -> Result<ProcessSelector, ApiError> {
        match (self.pid, self.tag) {
            (Some(pid), None) => Ok(ProcessSelector::Pid(pid)),
            (None, Some(tag)) => Ok(ProcessSelector::Tag(tag)),
            _ => Err(Error::invalid("name the process by exactly one of ?pid= and ?tag=").into()),
        }
    }
}

/// Process events as frames: output raw, everything else JSON, ending after the exit event
/// or an error.
fn process_frames(stream: ProcessStream) -> BoxStream<'static, Vec<u8>> {
    futures::stream::unfold(Some(stream.events), |events| async move {
        let mut events = events?;
        match events.next().await {
            None => None,
            Some(Ok(ProcessEvent::Stdout(bytes))) => {
                Some((frame::encode(frame::STDOUT, &bytes), Some(events)))
            }
            Some(Ok(ProcessEvent::Stderr(bytes))) => {
                Some((frame::encode(frame::STDERR, &bytes), Some(events)))
            }
            Some(Ok(exit @ ProcessEvent::Exit(_))) => Some((json_frame(&exit), None)),
            Some(Ok(other)) => Some((json_frame(&other), Some(events))),
            Some(Err(e)) => Some((error_frame(&e), None)),
        }
    })
    .boxed()
}

fn stream_response(state: &AppState, stream: ProcessStream) -> Response {
    let pid = stream.pid.to_string();
    frames_response(state, process_frames(stream), &[(PID_HEADER, pid)])
}

/// A start under an operation id is recorded as `{"pid": n}`; the same id again attaches to
/// that process (its retained output, then live events) instead of starting another.
async fn spawn(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (spec, raw) = read_json::<ProcessSpec>(&state, &headers, body).await?;
    let (tx, rx) = tokio::sync::oneshot::channel();
    let backend = state.backend.clone();
    let target = id.clone();
    let scope = format!("spawn {id}");
    let (stored, first) = state
        .idempotency
        .run_stored(&headers, &scope, &raw, async move {
            match backend.spawn(&target, spec).await {
                Ok(stream) => {
                    let pid = stream.pid;
                    // Nobody waiting (the client hung up): the process runs on, attachable.
                    let _ = tx.send(stream);
                    Stored::of(Ok(serde_json::json!({ "pid": pid })))
                }
                Err(e) => Stored::of::<()>(Err(e)),
            }
        })
        .await?;
    if !stored.is_success() {
        return Ok(stored.into_response());
    }
    let stream = match (first, rx.await) {
        (true, Ok(stream)) => stream,
        _ => {
            let pid = stored
                .value()
                .get("pid")
                .and_then(|p| p.as_u64())
                .and_then(|p| u32::try_from(p).ok())
                .ok_or_else(|| Error::backend("the recorded start has no pid"))?;
            state.backend.attach(&id, ProcessSelector::Pid(pid)).await?
        }
    };
    Ok(stream_response(&state, stream))
}

async fn list_processes(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    Ok(json(&state.backend.list_processes(&id).await?))
}

async fn attach(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(selector): Query<Selector>,
) -> Result<Response, ApiError> {
    let stream = state.backend.attach(&id, selector.get()?).await?;
    Ok(stream_response(&state, stream))
}

async fn write_stdin(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(selector): Query<Selector>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let selector = selector.get()?;
    let data = read_body(&headers, body, state.config.max_body_bytes).await?;
    state
        .backend
        .write_stdin(&id, selector, WriteStdinOptions::new(data.to_vec()))
        .await?;
    Ok(done())
}

async fn close_stdin(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(selector): Query<Selector>,
) -> Result<Response, ApiError> {
    state.backend.close_stdin(&id, selector.get()?).await?;
    Ok(done())
}

async fn signal(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(selector): Query<Selector>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let selector = selector.get()?;
    let (req, _) = read_json::<SignalBody>(&state, &headers, body).await?;
    let options = SignalOptions::new(req.signal);
    state.backend.signal(&id, selector, options).await?;
    Ok(done())
}

async fn resize_pty(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(selector): Query<Selector>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let selector = selector.get()?;
    let (size, _) = read_json::<PtySize>(&state, &headers, body).await?;
    let options = ResizePtyOptions::new(size);
    state.backend.resize_pty(&id, selector, options).await?;
    Ok(done())
}
