//! Daytona's toolbox under `/toolbox/{sandboxId}/…`: what the SDK's `sandbox.process`
//! and `sandbox.fs` send, each decided by the Rust facade's `Process` / `FileSystem`
//! functions.
//!
//! `/process/execute` runs `command` through the sandbox's shell, as the pinned SDK
//! documents ("run by the first available of zsh, bash or sh"): a literal `sh -c '…'`
//! (older SDKs' `code_run`) works unchanged. stdout and stderr are merged into `result` in
//! the order written; `timeout` (seconds) kills the process group and answers 408.
//! `/process/code-run` keeps no state between calls.

use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::routing::post;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{bad_request, parse_json, ApiError, Wire};
use crate::process::{CodeRunParams, ExecuteResponse};
use crate::sandbox::Sandbox;

/// The toolbox's routes (nested under `/toolbox/{id}`).
pub(crate) fn routes() -> Router<Wire> {
    Router::new()
        .route("/process/execute", post(execute))
        .route("/process/code-run", post(code_run))
}

/// The sandbox a toolbox call is for.
async fn sandbox(wire: &Wire, id: &str) -> Result<Sandbox, ApiError> {
    Ok(wire.daytona().get(id.to_string()).await?)
}

/// `ExecuteRequest`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExecuteRequest {
    command: String,
    cwd: Option<String>,
    envs: Option<HashMap<String, String>>,
    timeout: Option<i64>,
}

fn check_timeout(timeout: Option<i64>) -> Result<Option<i64>, ApiError> {
    match timeout {
        Some(t) if t < 0 => Err(bad_request("timeout must be a non-negative integer")),
        other => Ok(other),
    }
}

async fn execute(
    State(wire): State<Wire>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let req: ExecuteRequest = parse_json(&body)?;
    let timeout = check_timeout(req.timeout)?;
    let sb = sandbox(&wire, &id).await?;
    let response = sb
        .process
        .exec(req.command)
        .cwd(req.cwd)
        .env(req.envs.unwrap_or_default())
        .timeout(timeout)
        .await?;
    Ok(Json(json!({
        "exitCode": response.exit_code,
        "result": response.result,
    })))
}

/// `CodeRunRequest`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CodeRunRequest {
    code: String,
    language: Option<String>,
    argv: Option<Vec<String>>,
    envs: Option<HashMap<String, String>>,
    timeout: Option<i64>,
}

fn code_run_body(response: &ExecuteResponse) -> Value {
    let charts = response
        .artifacts
        .as_ref()
        .and_then(|a| a.charts.clone())
        .unwrap_or_default();
    json!({
        "exitCode": response.exit_code,
        "result": response.result,
        "artifacts": {"stdout": response.result, "charts": charts},
    })
}

async fn code_run(
    State(wire): State<Wire>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let req: CodeRunRequest = parse_json(&body)?;
    let timeout = check_timeout(req.timeout)?;
    let sb = sandbox(&wire, &id).await?;
    let response = sb
        .process
        .code_run(req.code)
        .params(CodeRunParams {
            argv: req.argv,
            env: req.envs,
        })
        .timeout(timeout)
        .language(req.language)
        .await?;
    Ok(Json(code_run_body(&response)))
}
