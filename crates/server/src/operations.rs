//! What became of an operation (see [`sandcove_core::operation`]), from the idempotency record.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method};
use axum::response::Response;

use super::{json, ApiError, AppState, Out, Route};

pub(super) fn routes() -> Vec<Route> {
    vec![Route::new(
        Method::GET,
        "/v1/operations/{op}",
        "observe",
        "What became of the operation with this id (the idempotency key it was sent with): done, failed, in progress or unknown",
        observe,
    )
    .output(Out::Json("OperationStatus"))]
}

async fn observe(
    State(state): State<AppState>,
    Path(op): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let op = sandcove_core::OperationId::parse(&op)?;
    Ok(json(&state.idempotency.status(&headers, op.as_str())))
}
