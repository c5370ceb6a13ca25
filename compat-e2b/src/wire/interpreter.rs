//! The code interpreter E2B's `e2b-code-interpreter` SDKs reach on port 49999 (the
//! `E2b-Sandbox-Port` header): `POST /execute` streaming NDJSON, `/contexts` to create, list,
//! delete and restart code contexts, `/health`.
//!
//! Nothing here decides what an execution means: every call goes through the Rust facade's
//! code interpreter ([`crate::code_interpreter`]), which drives the one interpreter driver
//! (`sandcove-interpreter`) and shapes its events into E2B's items; this module only writes
//! each item as the JSON line E2B's server sends.
//!
//! The SDKs bound an execution themselves (`timeout=`, default 300 s) by dropping the
//! connection; a run whose client went away before it ended is interrupted (`SIGINT`, as
//! Jupyter's interrupt), so the context stays usable and keeps its state. So that the
//! interrupt can only reach the cell of the client that left, this server lets one
//! `/execute` per context into the interpreter at a time; the others wait here, where leaving
//! costs nothing, and the turn is handed on only once the interrupt has been sent.
//!
//! Errors use the statuses the SDKs map: 404 (`NotFoundException`: context not found), 502
//! (`TimeoutException`: the sandbox is gone, as E2B's proxy answers), anything else
//! `SandboxException("<status> <reason>: <body>")`; bodies are plain text, so the message
//! reads as is.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use sandcove::server::auth::{Principal, Refusal, RouteAuth, Routes};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::connect::{Code, ConnectError};
use super::{read_body, SandboxId, Wire};
use crate::code_interpreter::{self as ci, ExecItem, RunItems};
use crate::errors::SandboxException;

/// The code interpreter's routes (reached only with `E2b-Sandbox-Port: 49999`).
pub(crate) fn routes() -> Routes<Wire> {
    use axum::http::Method;
    // The SDKs send the envd token with `/execute` and the traffic token with every call;
    // either is bound to the `E2b-Sandbox-Id` it came with.
    const INTERPRETER: &[Principal] = &[
        Principal::ServerKey,
        Principal::SandboxToken,
        Principal::TrafficToken,
    ];
    Routes::new(refuse)
        .route(Method::POST, "/execute", INTERPRETER, execute)
        .route(Method::POST, "/contexts", INTERPRETER, create_context)
        .route(Method::GET, "/contexts", INTERPRETER, list_contexts)
        .route(
            Method::DELETE,
            "/contexts/{context}",
            INTERPRETER,
            remove_context,
        )
        .route(
            Method::POST,
            "/contexts/{context}/restart",
            INTERPRETER,
            restart_context,
        )
        .route(Method::GET, "/health", INTERPRETER, health)
}

/// A refusal on the code interpreter's port.
fn refuse(_: &RouteAuth, refusal: Refusal) -> Response {
    match refusal {
        Refusal::Unauthenticated => text_error(StatusCode::UNAUTHORIZED, "unauthenticated"),
        Refusal::Forbidden => text_error(
            StatusCode::FORBIDDEN,
            "this credential does not open this sandbox's code interpreter",
        ),
    }
}

pub(crate) async fn not_found(request: Request) -> Response {
    text_error(
        StatusCode::NOT_FOUND,
        format!(
            "{} {} is not an endpoint of the code interpreter",
            request.method(),
            request.uri().path()
        ),
    )
}

/// A plain-text error answer.
fn text_error(status: StatusCode, message: impl Into<String>) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        )],
        message.into(),
    )
        .into_response()
}

/// The one mapping from E2B's exception classes to the code interpreter's statuses, chosen
/// so the SDK raises the same class (`e2b_code_interpreter/models.py`, `format_exception`).
fn status_of(e: &SandboxException) -> StatusCode {
    match e {
        SandboxException::NotFound { .. } | SandboxException::FileNotFound { .. } => {
            StatusCode::NOT_FOUND
        }
        SandboxException::SandboxNotFound { .. } | SandboxException::Timeout { .. } => {
            StatusCode::BAD_GATEWAY
        }
        SandboxException::InvalidArgument { .. } | SandboxException::Template { .. } => {
            StatusCode::BAD_REQUEST
        }
        SandboxException::NotSupported { .. } => StatusCode::NOT_IMPLEMENTED,
        SandboxException::Authentication { .. } => StatusCode::UNAUTHORIZED,
        SandboxException::RateLimit { .. } | SandboxException::NotEnoughSpace { .. } => {
            StatusCode::TOO_MANY_REQUESTS
        }
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

fn exception(e: SandboxException) -> Response {
    if e.is_not_supported() {
        return refusal(&e.to_string());
    }
    text_error(status_of(&e), e.to_string())
}

/// A refusal: `501` with the message (naming the alternative) as the body and as the reason
/// phrase. The JS SDK's error shows only `"<status> <reason>"`; the Python SDK's shows
/// `"<status> <reason>: <body>"` with the standard reason (httpx does not read the wire's).
fn refusal(message: &str) -> Response {
    // A reason phrase is visible ASCII and spaces (RFC 9112), kept short.
    let phrase: String = message
        .chars()
        .map(|c| {
            if c == ' ' || c.is_ascii_graphic() {
                c
            } else {
                '?'
            }
        })
        .take(400)
        .collect();
    let mut response = text_error(StatusCode::NOT_IMPLEMENTED, message);
    if let Ok(reason) = hyper::ext::ReasonPhrase::try_from(phrase.into_bytes()) {
        response.extensions_mut().insert(reason);
    }
    response
}

/// envd's resolution of the sandbox, with its errors as this server's statuses.
fn connect_error(e: ConnectError) -> Response {
    let status = match e.code {
        Code::Unavailable | Code::DeadlineExceeded => StatusCode::BAD_GATEWAY,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::InvalidArgument | Code::FailedPrecondition => StatusCode::BAD_REQUEST,
        Code::ResourceExhausted => StatusCode::PAYLOAD_TOO_LARGE,
        other => other.http_status(),
    };
    text_error(status, e.message)
}

/// The sandbox's code interpreter, as the Rust facade has it.
async fn sandbox(wire: &Wire, id: &str) -> Result<ci::Sandbox, Response> {
    let ctx = super::envd::context(wire, id)
        .await
        .map_err(connect_error)?;
    Ok(ci::Sandbox::from_ctx(ctx))
}

/// A JSON body, bounded like every other request body.
async fn json_body<T: serde::de::DeserializeOwned + Default>(
    wire: &Wire,
    body: Body,
) -> Result<T, Response> {
    let bytes = read_body(body, wire.config.max_body_bytes)
        .await
        .map_err(|e| connect_error(e.into()))?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(&bytes).map_err(|e| {
        text_error(
            StatusCode::BAD_REQUEST,
            format!("invalid JSON request body: {e}"),
        )
    })
}

/// The turn of each code context `(sandbox, context)` whose cell this server runs or queues.
/// Entries live only while a request holds or awaits them, so the map stays as small as the
/// number of requests in flight.
#[derive(Debug, Default)]
pub(crate) struct CellLocks {
    map: Mutex<HashMap<(String, String), CellLock>>,
}

/// One context's turn.
type CellLock = Arc<tokio::sync::Mutex<()>>;

/// A context's turn, held for one run; the map entry goes when nobody else wants it.
struct Turn {
    locks: Arc<CellLocks>,
    key: (String, String),
    lock: CellLock,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl CellLocks {
    async fn turn(self: &Arc<Self>, sandbox: &str, context: &str) -> Turn {
        let key = (sandbox.to_string(), context.to_string());
        let lock = {
            let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
            // Entries nobody holds or awaits any more (however their owner went away).
            map.retain(|_, lock| Arc::strong_count(lock) > 1);
            map.entry(key.clone()).or_default().clone()
        };
        let mut turn = Turn {
            locks: self.clone(),
            key,
            lock: lock.clone(),
            guard: None,
        };
        // If this wait is dropped (the client left while queued), `Turn`'s drop tidies up.
        turn.guard = Some(lock.lock_owned().await);
        turn
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut map = self.locks.map.lock().unwrap_or_else(|p| p.into_inner());
        // Two owners left: the map and this turn; nobody else holds or awaits it.
        if Arc::strong_count(&self.lock) == 2 {
            map.remove(&self.key);
        }
    }
}

/// `POST /execute`'s body.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExecuteRequest {
    code: String,
    context_id: Option<String>,
    language: Option<String>,
    env_vars: Option<BTreeMap<String, String>>,
}

async fn execute(
    State(wire): State<Wire>,
    Extension(SandboxId(id)): Extension<SandboxId>,
    body: Body,
) -> Response {
    let req: ExecuteRequest = match json_body(&wire, body).await {
        Ok(r) => r,
        Err(response) => return response,
    };
    let sandbox = match sandbox(&wire, &id).await {
        Ok(s) => s,
        Err(response) => return response,
    };
    let context = req
        .context_id
        .clone()
        .unwrap_or_else(|| ci::DEFAULT_CONTEXT_ID.to_string());
    let turn = wire.cells.turn(&id, &context).await;
    let run = sandbox
        .start_run(
            req.code,
            req.context_id,
            req.language,
            req.env_vars.unwrap_or_default(),
            // The SDK bounds the run by closing the connection (see the module docs).
            None,
        )
        .await;
    let run = match run {
        Ok(run) => run,
        Err(e) => return exception(e),
    };
    let running = Interrupting {
        run,
        turn: Some(turn),
    };
    let lines = futures::stream::unfold(Some(running), |state| async move {
        let mut run = state?;
        match run.run.next_item().await {
            Some(Ok(item)) => {
                let last = matches!(item, ExecItem::End);
                Some((
                    Ok::<_, Infallible>(line(&item_json(&item))),
                    (!last).then_some(run),
                ))
            }
            // The driver failed after the answer began: say so as the execution's error.
            Some(Err(e)) => {
                let error = json!({
                    "type": "error",
                    "name": e.class_name(),
                    "value": e.to_string(),
                    "traceback": "",
                });
                let mut bytes = line(&error).to_vec();
                bytes.extend_from_slice(&line(&json!({"type": "end_of_execution"})));
                Some((Ok(Bytes::from(bytes)), None))
            }
            None => None,
        }
    });
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/x-ndjson"),
        )],
        Body::from_stream(lines),
    )
        .into_response()
}

/// A run that is interrupted if dropped before it ended (the client went away), holding its
/// context's turn until then.
struct Interrupting {
    run: RunItems,
    turn: Option<Turn>,
}

impl Drop for Interrupting {
    fn drop(&mut self) {
        let turn = self.turn.take();
        if self.run.finished() {
            return;
        }
        let context = self.run.context().clone();
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                // A failed interrupt leaves the cell running until it ends by itself (the
                // context's next run waits for it); the client is gone, nobody to tell.
                let _ = context.interrupt().await;
                // Only now may the next run of this context be sent to the interpreter.
                drop(turn);
            });
        }
    }
}

fn line(value: &Value) -> Bytes {
    let mut bytes = serde_json::to_vec(value).unwrap_or_default();
    bytes.push(b'\n');
    Bytes::from(bytes)
}

/// The NDJSON line of one item, as E2B's server writes it (absent fields left out).
fn item_json(item: &ExecItem) -> Value {
    match item {
        ExecItem::Stdout(m) | ExecItem::Stderr(m) => json!({
            "type": if m.error { "stderr" } else { "stdout" },
            "text": m.line,
            "timestamp": m.timestamp,
        }),
        ExecItem::Result(r) => result_json(r),
        ExecItem::Error(e) => json!({
            "type": "error",
            "name": e.name,
            "value": e.value,
            "traceback": e.traceback,
        }),
        ExecItem::ExecutionCount(n) => json!({
            "type": "number_of_executions",
            "execution_count": n,
        }),
        ExecItem::End => json!({"type": "end_of_execution"}),
    }
}

fn result_json(r: &ci::Result) -> Value {
    let mut out = Map::new();
    out.insert("type".into(), "result".into());
    let strings = [
        ("text", &r.text),
        ("html", &r.html),
        ("markdown", &r.markdown),
        ("svg", &r.svg),
        ("png", &r.png),
        ("jpeg", &r.jpeg),
        ("pdf", &r.pdf),
        ("latex", &r.latex),
        ("javascript", &r.javascript),
    ];
    for (name, value) in strings {
        if let Some(v) = value {
            out.insert(name.into(), Value::String(v.clone()));
        }
    }
    for (name, value) in [
        ("json", &r.json),
        ("data", &r.data),
        ("chart", &r.chart),
        ("extra", &r.extra),
    ] {
        if let Some(v) = value {
            out.insert(name.into(), v.clone());
        }
    }
    out.insert("is_main_result".into(), r.is_main_result.into());
    Value::Object(out)
}

/// `POST /contexts`' body.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateContextRequest {
    language: Option<String>,
    cwd: Option<String>,
}

fn context_json(c: &ci::Context) -> Value {
    json!({"id": c.id, "language": c.language, "cwd": c.cwd})
}

async fn create_context(
    State(wire): State<Wire>,
    Extension(SandboxId(id)): Extension<SandboxId>,
    body: Body,
) -> Response {
    let req: CreateContextRequest = match json_body(&wire, body).await {
        Ok(r) => r,
        Err(response) => return response,
    };
    let sandbox = match sandbox(&wire, &id).await {
        Ok(s) => s,
        Err(response) => return response,
    };
    match sandbox
        .create_code_context()
        .cwd(req.cwd)
        .language(req.language)
        .await
    {
        Ok(c) => axum::Json(context_json(&c)).into_response(),
        Err(e) => exception(e),
    }
}

/// Run `call` on the sandbox's code interpreter: its answer, or its error as this server's
/// status (the sandbox being gone included).
async fn on_sandbox<F, Fut>(wire: &Wire, id: &str, call: F) -> Response
where
    F: FnOnce(ci::Sandbox) -> Fut,
    Fut: std::future::Future<Output = Result<Response, SandboxException>>,
{
    match sandbox(wire, id).await {
        Ok(sandbox) => call(sandbox).await.unwrap_or_else(exception),
        Err(response) => response,
    }
}

async fn list_contexts(
    State(wire): State<Wire>,
    Extension(SandboxId(id)): Extension<SandboxId>,
) -> Response {
    on_sandbox(&wire, &id, |sandbox| async move {
        let list = sandbox.list_code_contexts().await?;
        Ok(axum::Json(Value::Array(list.iter().map(context_json).collect())).into_response())
    })
    .await
}

async fn remove_context(
    State(wire): State<Wire>,
    Extension(SandboxId(id)): Extension<SandboxId>,
    Path(context): Path<String>,
) -> Response {
    on_sandbox(&wire, &id, |sandbox| async move {
        sandbox.remove_code_context(context).await?;
        Ok(StatusCode::NO_CONTENT.into_response())
    })
    .await
}

async fn restart_context(
    State(wire): State<Wire>,
    Extension(SandboxId(id)): Extension<SandboxId>,
    Path(context): Path<String>,
) -> Response {
    on_sandbox(&wire, &id, |sandbox| async move {
        sandbox.restart_code_context(context).await?;
        Ok(StatusCode::NO_CONTENT.into_response())
    })
    .await
}

async fn health(
    State(wire): State<Wire>,
    Extension(SandboxId(id)): Extension<SandboxId>,
) -> Response {
    on_sandbox(&wire, &id, |_| async {
        Ok(axum::Json(json!({"status": "ok"})).into_response())
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::code_interpreter::{ExecutionError, OutputMessage};

    #[test]
    fn items_become_e2b_lines() {
        let out = OutputMessage {
            line: "hi\n".into(),
            timestamp: 7,
            error: false,
        };
        assert_eq!(
            item_json(&ExecItem::Stdout(out.clone())),
            json!({"type": "stdout", "text": "hi\n", "timestamp": 7})
        );
        let err = OutputMessage { error: true, ..out };
        assert_eq!(item_json(&ExecItem::Stderr(err))["type"], "stderr");
        let r = ci::Result {
            text: Some("2".into()),
            json: Some(json!({"a": 1})),
            is_main_result: true,
            ..Default::default()
        };
        assert_eq!(
            item_json(&ExecItem::Result(Box::new(r))),
            json!({"type": "result", "text": "2", "json": {"a": 1}, "is_main_result": true}),
            "absent fields are left out (the JS SDK counts unknown keys as extra formats)"
        );
        assert_eq!(
            item_json(&ExecItem::Error(ExecutionError {
                name: "NameError".into(),
                value: "name 'y' is not defined".into(),
                traceback: "tb".into(),
            })),
            json!({"type": "error", "name": "NameError", "value": "name 'y' is not defined", "traceback": "tb"})
        );
        assert_eq!(
            item_json(&ExecItem::ExecutionCount(3)),
            json!({"type": "number_of_executions", "execution_count": 3})
        );
        assert_eq!(
            item_json(&ExecItem::End),
            json!({"type": "end_of_execution"})
        );
    }

    #[test]
    fn exceptions_map_to_the_statuses_the_sdk_reads() {
        let cases = [
            (SandboxException::not_found("x"), StatusCode::NOT_FOUND),
            (SandboxException::timeout("x"), StatusCode::BAD_GATEWAY),
            (
                SandboxException::invalid_argument("x"),
                StatusCode::BAD_REQUEST,
            ),
            (
                SandboxException::sandbox("x"),
                StatusCode::INTERNAL_SERVER_ERROR,
            ),
        ];
        for (e, status) in cases {
            assert_eq!(status_of(&e), status, "{e:?}");
        }
    }
}
