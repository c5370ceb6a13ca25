//! Daytona's toolbox under `/toolbox/{sandboxId}/…`: what the SDK's `sandbox.process`
//! and `sandbox.fs` send, each decided by the Rust facade's `Process` / `FileSystem`
//! functions.
//!
//! `/process/execute` runs `command` through the sandbox's shell, as the pinned SDK
//! documents ("run by the first available of zsh, bash or sh"): a literal `sh -c '…'`
//! (older SDKs' `code_run`) works unchanged. stdout and stderr are merged into `result` in
//! the order written; `timeout` (seconds) kills the process group and answers 408.
//! `/process/code-run` keeps no state between calls.
//!
//! Files arrive as multipart bodies streamed into the sandbox part by part (never held
//! whole), and leave as multipart answers held in memory, each bounded by the listener's
//! upload limit; an upload only ever carries **content** (the facade's "local path" upload
//! form is never built from a request: that path would be on the server).
//! Sessions are the facade's: one shell per session, commands with ids, logs per stream.
//! Git is the facade's too: the `git` binary in the sandbox, credentials passed to that one
//! process through a credential helper, never on a command line.

use std::collections::{BTreeMap, HashMap};

use axum::body::{Body, Bytes};
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::api::query_pairs;
use super::{bad_request, parse_json, ApiError, Wire};
use crate::errors::Context as _;
use crate::fs::FileInfo;
use crate::process::{CodeRunParams, ExecuteResponse, SessionExecuteRequest};
use crate::sandbox::Sandbox;
use futures::StreamExt;
use sandcove::server::auth::{Principal, Routes, SERVER_KEY};
use sandcove::FileGrant;
use sandcove_compat_support::multipart::{self, Upload, UploadError, UploadErrorKind};

/// The toolbox's routes (nested under `/toolbox/{id}`): the server key only (Daytona's
/// per-sandbox tokens are not served here).
pub(crate) fn routes() -> Routes<Wire> {
    Routes::new(super::refuse)
        .route(Method::POST, "/process/execute", SERVER_KEY, execute)
        .route(Method::POST, "/process/code-run", SERVER_KEY, code_run)
        .route(Method::POST, "/process/session", SERVER_KEY, create_session)
        .route(Method::GET, "/process/session", SERVER_KEY, list_sessions)
        .route(
            Method::GET,
            "/process/session/{session}",
            SERVER_KEY,
            get_session,
        )
        .route(
            Method::DELETE,
            "/process/session/{session}",
            SERVER_KEY,
            delete_session,
        )
        .route(
            Method::POST,
            "/process/session/{session}/exec",
            SERVER_KEY,
            session_exec,
        )
        .route(
            Method::GET,
            "/process/session/{session}/command/{command}",
            SERVER_KEY,
            get_command,
        )
        .route(
            Method::GET,
            "/process/session/{session}/command/{command}/logs",
            SERVER_KEY,
            command_logs,
        )
        .route(
            Method::POST,
            "/process/session/{session}/command/{command}/input",
            SERVER_KEY,
            command_input,
        )
        .route(Method::GET, "/files", SERVER_KEY, list_files)
        .route(Method::DELETE, "/files", SERVER_KEY, delete_file)
        .route(Method::GET, "/files/info", SERVER_KEY, file_info)
        .route(Method::POST, "/files/folder", SERVER_KEY, create_folder)
        .route(Method::POST, "/files/move", SERVER_KEY, move_file)
        .route(
            Method::POST,
            "/files/permissions",
            SERVER_KEY,
            set_permissions,
        )
        .route(Method::GET, "/files/find", SERVER_KEY, find_in_files)
        .route(Method::GET, "/files/search", SERVER_KEY, search_files)
        .route(Method::POST, "/files/replace", SERVER_KEY, replace_in_files)
        .route(Method::POST, "/files/bulk-upload", SERVER_KEY, bulk_upload)
        .route(
            Method::POST,
            "/files/bulk-download",
            SERVER_KEY,
            bulk_download,
        )
        .route(Method::GET, "/files/download", KEY_OR_SIGNED_URL, download)
        .route(Method::POST, "/files/upload-v2", SIGNED_URL, upload_signed)
        .route(Method::GET, "/git/status", SERVER_KEY, git_status)
        .route(Method::POST, "/git/add", SERVER_KEY, git_add)
        .route(Method::POST, "/git/commit", SERVER_KEY, git_commit)
        .route(Method::GET, "/git/branches", SERVER_KEY, git_branches)
        .route(Method::POST, "/git/branches", SERVER_KEY, git_create_branch)
        .route(
            Method::DELETE,
            "/git/branches",
            SERVER_KEY,
            git_delete_branch,
        )
        .route(Method::POST, "/git/checkout", SERVER_KEY, git_checkout)
        .route(Method::POST, "/git/init", SERVER_KEY, git_init)
        .route(Method::GET, "/git/remotes", SERVER_KEY, git_remotes)
        .route(Method::POST, "/git/remotes", SERVER_KEY, git_remote_add)
        .route(Method::POST, "/git/clone", SERVER_KEY, git_clone)
        .route(Method::POST, "/git/pull", SERVER_KEY, git_pull)
        .route(Method::POST, "/git/push", SERVER_KEY, git_push)
        .route(Method::GET, "/user-home-dir", SERVER_KEY, user_home_dir)
        .route(Method::GET, "/work-dir", SERVER_KEY, work_dir)
}

/// The sandbox a toolbox call is for.
async fn sandbox(wire: &Wire, id: &str) -> Result<Sandbox, ApiError> {
    Ok(wire.daytona().get(id.to_string()).await?)
}

/// The shape most JSON toolbox calls share: the body parsed as `T` (checked first, so a bad
/// request never looks the sandbox up), then the sandbox it is for.
async fn json_request<T: serde::de::DeserializeOwned>(
    wire: &Wire,
    id: &str,
    body: &[u8],
) -> Result<(T, Sandbox), ApiError> {
    let req = parse_json(wire, body)?;
    Ok((req, sandbox(wire, id).await?))
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
    let req: ExecuteRequest = parse_json(&wire, &body)?;
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
    let req: CodeRunRequest = parse_json(&wire, &body)?;
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

/// `FileInfo`.
fn file_info_body(f: &FileInfo) -> Value {
    json!({
        "name": f.name,
        "isDir": f.is_dir,
        "size": f.size,
        "mode": f.mode,
        "permissions": f.permissions,
        "owner": f.owner,
        "group": f.group,
        "modTime": f.mod_time,
        "modifiedAt": f.modified_at,
        "path": f.path,
    })
}

/// The query parameters of a toolbox call, by name (the last of a repeated name wins).
pub(crate) fn query(raw: Option<String>) -> HashMap<String, String> {
    query_pairs(raw.as_deref().unwrap_or(""))
        .into_iter()
        .collect()
}

/// A required query parameter.
pub(crate) fn required<'a>(
    q: &'a HashMap<String, String>,
    name: &str,
) -> Result<&'a str, ApiError> {
    q.get(name)
        .map(String::as_str)
        .ok_or_else(|| bad_request(format!("the {name} query parameter is required")))
}

fn flag(q: &HashMap<String, String>, name: &str) -> Result<bool, ApiError> {
    match q.get(name).map(String::as_str) {
        None | Some("false") | Some("") => Ok(false),
        Some("true") => Ok(true),
        Some(other) => Err(bad_request(format!("{name}={other:?} is not a boolean"))),
    }
}

async fn list_files(
    State(wire): State<Wire>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Json<Value>, ApiError> {
    let q = query(raw);
    let depth = match q.get("depth") {
        None => None,
        Some(d) => Some(
            d.parse::<i64>()
                .map_err(|_| bad_request(format!("depth {d:?} is not an integer")))?,
        ),
    };
    let sb = sandbox(&wire, &id).await?;
    let path = q.get("path").cloned().unwrap_or_default();
    let files = sb.fs.list_files(path).depth(depth).await?;
    Ok(Json(Value::Array(
        files.iter().map(file_info_body).collect(),
    )))
}

async fn file_info(
    State(wire): State<Wire>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Json<Value>, ApiError> {
    let q = query(raw);
    let path = required(&q, "path")?;
    let sb = sandbox(&wire, &id).await?;
    Ok(Json(file_info_body(&sb.fs.get_file_info(path).await?)))
}

async fn create_folder(
    State(wire): State<Wire>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<StatusCode, ApiError> {
    let q = query(raw);
    let path = required(&q, "path")?;
    let mode = q.get("mode").map(String::as_str).unwrap_or("0755");
    let sb = sandbox(&wire, &id).await?;
    sb.fs.create_folder(path, mode).await?;
    Ok(StatusCode::CREATED)
}

async fn delete_file(
    State(wire): State<Wire>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<StatusCode, ApiError> {
    let q = query(raw);
    let path = required(&q, "path")?.to_string();
    let recursive = flag(&q, "recursive")?;
    let sb = sandbox(&wire, &id).await?;
    sb.fs.delete_file(path).recursive(recursive).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn move_file(
    State(wire): State<Wire>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<StatusCode, ApiError> {
    let q = query(raw);
    let source = required(&q, "source")?;
    let destination = required(&q, "destination")?;
    let sb = sandbox(&wire, &id).await?;
    sb.fs.move_files(source, destination).await?;
    Ok(StatusCode::OK)
}

async fn set_permissions(
    State(wire): State<Wire>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<StatusCode, ApiError> {
    let q = query(raw);
    let path = required(&q, "path")?.to_string();
    let sb = sandbox(&wire, &id).await?;
    sb.fs
        .set_file_permissions(path)
        .mode(q.get("mode").cloned())
        .owner(q.get("owner").cloned())
        .group(q.get("group").cloned())
        .await?;
    Ok(StatusCode::OK)
}

async fn find_in_files(
    State(wire): State<Wire>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Json<Value>, ApiError> {
    let q = query(raw);
    let path = required(&q, "path")?;
    let pattern = required(&q, "pattern")?;
    let sb = sandbox(&wire, &id).await?;
    let found = sb.fs.find_files(path, pattern).await?;
    Ok(Json(Value::Array(
        found
            .iter()
            .map(|m| json!({"file": m.file, "line": m.line, "content": m.content}))
            .collect(),
    )))
}

async fn search_files(
    State(wire): State<Wire>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Json<Value>, ApiError> {
    let q = query(raw);
    let path = required(&q, "path")?;
    let pattern = required(&q, "pattern")?;
    let sb = sandbox(&wire, &id).await?;
    let found = sb.fs.search_files(path, pattern).await?;
    Ok(Json(json!({"files": found.files})))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ReplaceRequest {
    files: Vec<String>,
    pattern: String,
    new_value: String,
}

async fn replace_in_files(
    State(wire): State<Wire>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let (req, sb): (ReplaceRequest, _) = json_request(&wire, &id, &body).await?;
    let results = sb
        .fs
        .replace_in_files(req.files, &req.pattern, &req.new_value)
        .await?;
    Ok(Json(Value::Array(
        results
            .iter()
            .map(|r| {
                let mut v = json!({"file": r.file, "success": r.success});
                if let Some(e) = &r.error {
                    v["error"] = json!(e);
                }
                v
            })
            .collect(),
    )))
}

/// The core error an upload's failure stands for, inside a write (which it ends, keeping
/// nothing).
fn upload_core_error(e: UploadError) -> sandcove::Error {
    match e.kind {
        UploadErrorKind::Busy => sandcove::Error::RateLimited {
            message: e.message,
            retry_after_ms: Some(1000),
        },
        UploadErrorKind::Forbidden => sandcove::Error::Forbidden { what: e.message },
        _ => sandcove::Error::invalid(e.message),
    }
}

/// The Daytona error an upload's failure stands for: the server busy (429), a refusal
/// (403), else a bad request.
fn upload_error(e: UploadError) -> ApiError {
    match e.kind {
        UploadErrorKind::Busy | UploadErrorKind::Forbidden => ApiError(upload_core_error(e).into()),
        _ => bad_request(e.message),
    }
}

/// `POST /files/bulk-upload`: parts `files[i].path` (the destination) and `files[i].file`
/// (the content), paired by index, each path before its file (as the SDKs send them). Each
/// file streams into the sandbox under a temporary name beside its destination, and all are
/// moved into place, in the order they came, once the whole body is in: a bad, oversized or
/// broken-off upload writes nothing (see `sandcove_compat_support::multipart`).
async fn bulk_upload(
    State(wire): State<Wire>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let mut upload = Upload::start(
        multipart::body_stream(body.into_data_stream()),
        content_type,
        wire.config.max_upload_bytes as u64,
        &wire.config.upload_memory,
    )
    .await
    .map_err(upload_error)?;
    let sb = sandbox(&wire, &id).await?;
    let mut staged = sb.fs.staging();
    let mut files: BTreeMap<usize, String> = BTreeMap::new();
    let mut paths: BTreeMap<usize, String> = BTreeMap::new();
    let read = async {
        while let Some(part) = upload.next_part().await.map_err(upload_error)? {
            let field = part
                .name
                .strip_prefix("files[")
                .and_then(|rest| rest.split_once("]."));
            let Some((index, which)) = field else {
                return Err(bad_request(format!(
                    "unexpected upload part {:?}",
                    part.name
                )));
            };
            let index: usize = index
                .parse()
                .map_err(|_| bad_request(format!("bad upload part index in {:?}", part.name)))?;
            match which {
                "path" => {
                    let path = upload.text(part).await.map_err(upload_error)?;
                    if paths.insert(index, path).is_some() {
                        return Err(bad_request(format!("files[{index}].path is repeated")));
                    }
                }
                "file" => {
                    let Some(destination) = paths.get(&index) else {
                        return Err(bad_request(format!(
                            "files[{index}].file must follow its files[{index}].path"
                        )));
                    };
                    if files.contains_key(&index) {
                        return Err(bad_request(format!("files[{index}].file is repeated")));
                    }
                    let target = sb.fs.upload_target(destination);
                    let data: sandcove::ByteStream = Box::pin(
                        Upload::data(part)
                            .map(|chunk| chunk.map(|b| b.to_vec()).map_err(upload_core_error)),
                    );
                    staged
                        .write(&target, data, sandcove::WriteOptions::default())
                        .await
                        .ctx("Failed to upload files: ")?;
                    files.insert(index, target);
                }
                other => return Err(bad_request(format!("unexpected upload field {other:?}"))),
            }
        }
        if paths.len() != files.len() {
            return Err(bad_request(
                "every files[i].file needs its files[i].path (and the other way round)",
            ));
        }
        Ok(())
    };
    if let Err(e) = read.await {
        staged.abort().await;
        return Err(e);
    }
    staged.commit().await.ctx("Failed to upload files: ")?;
    Ok(Json(json!({
        "files": paths.values().map(|p| json!({"path": p})).collect::<Vec<_>>(),
        "errors": [],
    })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DownloadRequest {
    paths: Vec<String>,
}

/// `POST /files/bulk-download`: a multipart answer with one `file` part per path found and
/// one `error` part (Daytona's JSON error) per path that could not be read.
async fn bulk_download(
    State(wire): State<Wire>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let (req, sb): (DownloadRequest, _) = json_request(&wire, &id, &body).await?;
    let boundary = format!("sandcove-{}", sandcove::random_id(24));
    let mut out = Vec::new();
    let mut budget = wire.config.max_upload_bytes;
    for path in &req.paths {
        match sb.fs.download_limited(path, budget).await {
            Ok(data) => {
                budget = budget.saturating_sub(data.len());
                multipart::push_part(
                    &mut out,
                    &boundary,
                    "file",
                    path,
                    "application/octet-stream",
                    &data,
                );
            }
            Err(e) => {
                let status = super::status_for(&e);
                let error = json!({
                    "message": super::unprefixed(&e.message()),
                    "statusCode": status.as_u16(),
                    "code": e.code(),
                });
                multipart::push_part(
                    &mut out,
                    &boundary,
                    "error",
                    path,
                    "application/json",
                    error.to_string().as_bytes(),
                );
            }
        }
    }
    multipart::finish(&mut out, &boundary);
    let content_type = HeaderValue::from_str(&format!("multipart/form-data; boundary={boundary}"))
        .map_err(|e| ApiError(crate::DaytonaError::new(e.to_string())))?;
    Ok(([(header::CONTENT_TYPE, content_type)], out).into_response())
}

/// `GET /files/download?path=`: the bytes (older SDKs).
/// What `GET /files/download` accepts: the server's key, or a URL of `download_url`.
const KEY_OR_SIGNED_URL: &[Principal] = &[Principal::ServerKey, Principal::SignedUrl];

/// What `POST /files/upload-v2` accepts: a URL of `upload_url` (the SDKs upload with the key
/// through `/files/bulk-upload`).
const SIGNED_URL: &[Principal] = &[Principal::SignedUrl];

/// `POST /files/upload-v2?path&expires&signature`: an upload through a URL of `upload_url`,
/// verified before routing (see `file_urls`).
async fn upload_signed(
    State(wire): State<Wire>,
    grant: Option<Extension<FileGrant>>,
    request: Request,
) -> Response {
    match grant {
        Some(Extension(grant)) => super::file_urls::serve(&wire, &grant, request).await,
        None => super::unauthorized(),
    }
}

/// `GET /files/download?path`: the file's bytes, to the server's key or through a URL of
/// `download_url` (then streamed by the runtime's file-URL code).
async fn download(
    State(wire): State<Wire>,
    Path(id): Path<String>,
    grant: Option<Extension<FileGrant>>,
    request: Request,
) -> Result<Response, ApiError> {
    if let Some(Extension(grant)) = grant {
        return Ok(super::file_urls::serve(&wire, &grant, request).await);
    }
    let q = query(request.uri().query().map(str::to_string));
    let path = required(&q, "path")?;
    let sb = sandbox(&wire, &id).await?;
    let data = sb
        .fs
        .download_limited(path, wire.config.max_upload_bytes)
        .await?;
    Ok((
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        )],
        data,
    )
        .into_response())
}

async fn user_home_dir(
    State(wire): State<Wire>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let sb = sandbox(&wire, &id).await?;
    Ok(Json(json!({"dir": sb.get_user_home_dir().await?})))
}

async fn work_dir(
    State(wire): State<Wire>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let sb = sandbox(&wire, &id).await?;
    Ok(Json(json!({"dir": sb.get_work_dir().await?})))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct CreateSessionRequest {
    session_id: String,
}

async fn create_session(
    State(wire): State<Wire>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    let (req, sb): (CreateSessionRequest, _) = json_request(&wire, &id, &body).await?;
    sb.process.create_session(&req.session_id).await?;
    Ok(StatusCode::CREATED)
}

fn session_body(s: &crate::process::Session) -> Value {
    json!({
        "sessionId": s.session_id,
        "commands": s.commands.iter().map(command_body).collect::<Vec<_>>(),
    })
}

fn command_body(c: &crate::process::Command) -> Value {
    let mut v = json!({"id": c.id, "command": c.command});
    if let Some(code) = c.exit_code {
        v["exitCode"] = json!(code);
    }
    v
}

async fn list_sessions(
    State(wire): State<Wire>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let sb = sandbox(&wire, &id).await?;
    let sessions = sb.process.list_sessions().await?;
    Ok(Json(Value::Array(
        sessions.iter().map(session_body).collect(),
    )))
}

async fn get_session(
    State(wire): State<Wire>,
    Path((id, session)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let sb = sandbox(&wire, &id).await?;
    Ok(Json(session_body(&sb.process.get_session(&session).await?)))
}

async fn delete_session(
    State(wire): State<Wire>,
    Path((id, session)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let sb = sandbox(&wire, &id).await?;
    sb.process.delete_session(&session).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SessionExecBody {
    command: String,
    run_async: Option<bool>,
    #[serde(rename = "async")]
    var_async: Option<bool>,
    suppress_input_echo: Option<bool>,
}

async fn session_exec(
    State(wire): State<Wire>,
    Path((id, session)): Path<(String, String)>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: SessionExecBody = parse_json(&wire, &body)?;
    let run_async = req.run_async.or(req.var_async).unwrap_or(false);
    let sb = sandbox(&wire, &id).await?;
    let response = sb
        .process
        .execute_session_command(
            session,
            SessionExecuteRequest {
                command: req.command,
                run_async: Some(run_async),
                var_async: None,
                suppress_input_echo: req.suppress_input_echo,
            },
        )
        .await?;
    let mut v = json!({"cmdId": response.cmd_id});
    for (key, value) in [
        ("output", &response.output),
        ("stdout", &response.stdout),
        ("stderr", &response.stderr),
    ] {
        if let Some(text) = value {
            v[key] = json!(text);
        }
    }
    if let Some(code) = response.exit_code {
        v["exitCode"] = json!(code);
    }
    let status = if run_async {
        StatusCode::ACCEPTED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(v)).into_response())
}

async fn get_command(
    State(wire): State<Wire>,
    Path((id, session, command)): Path<(String, String, String)>,
) -> Result<Json<Value>, ApiError> {
    let sb = sandbox(&wire, &id).await?;
    Ok(Json(command_body(
        &sb.process.get_session_command(&session, &command).await?,
    )))
}

/// `GET /process/session/{session}/command/{command}/logs`: the logs so far, or with
/// `follow=true` a WebSocket that carries them as they come (see [`follow_logs`]).
async fn command_logs(
    State(wire): State<Wire>,
    Path((id, session, command)): Path<(String, String, String)>,
    RawQuery(raw): RawQuery,
    mut request: axum::extract::Request,
) -> Result<Response, ApiError> {
    let q = query(raw);
    let follow = flag(&q, "follow")?;
    let sb = sandbox(&wire, &id).await?;
    if follow {
        if !super::ws::is_websocket(&request) {
            return Err(ApiError(crate::DaytonaError::not_supported(
                "followed session command logs over a plain HTTP stream",
                "open the logs URL with follow=true as a WebSocket (what the pinned SDKs' \
                 get_session_command_logs_async / getSessionCommandLogs with callbacks do), or \
                 poll get_session_command_logs",
            )));
        }
        // A missing session or command is the SDK's error before the protocol switches.
        sb.process.get_session_command(&session, &command).await?;
        let (upgrade, response) = super::ws::accept(&mut request, None).map_err(bad_request)?;
        upgrade.run(move |socket| follow_logs(socket, sb, session, command));
        return Ok(response);
    }
    let logs = sb
        .process
        .get_session_command_logs(&session, &command)
        .await?;
    Ok(Json(json!({
        "output": logs.output.unwrap_or_default(),
        "stdout": logs.stdout.unwrap_or_default(),
        "stderr": logs.stderr.unwrap_or_default(),
    }))
    .into_response())
}

/// Marks the chunks of each stream on a followed-logs socket (the SDKs split on them).
const STDOUT_MARK: &[u8] = b"\x01\x01\x01";
const STDERR_MARK: &[u8] = b"\x02\x02\x02";

/// Most output a followed-logs socket queues for a client that reads slower than the command
/// writes; past it the socket closes with 1011 saying so (the logs stay readable by polling).
pub const FOLLOW_QUEUE_BYTES: usize = 8 * 1024 * 1024;

/// Send a session command's output as it comes, each chunk a binary message led by its
/// stream's mark, then close with 1000 once the command has ended (1011 with the reason if
/// following failed). Chunks wait in a queue between the facade's callbacks and the socket,
/// of at most [`FOLLOW_QUEUE_BYTES`]; a chunk longer than a WebSocket message goes out in
/// several, each led by the mark.
async fn follow_logs(mut socket: super::ws::Socket, sb: Sandbox, session: String, command: String) {
    use super::ws;
    use futures::StreamExt as _;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    use tokio_tungstenite::tungstenite::Message;
    let (chunks, mut queued) = tokio::sync::mpsc::unbounded_channel::<(bool, String)>();
    // Bytes queued and not yet written; a chunk that would pass the bound is dropped and the
    // socket ends saying so.
    let held = Arc::new(AtomicUsize::new(0));
    let overflow = Arc::new(AtomicBool::new(false));
    let queue = {
        let (held, overflow) = (held.clone(), overflow.clone());
        move |is_err: bool, text: &str| {
            if overflow.load(Ordering::Relaxed) {
                return;
            }
            if held.fetch_add(text.len(), Ordering::Relaxed) + text.len() > FOLLOW_QUEUE_BYTES {
                overflow.store(true, Ordering::Relaxed);
                return;
            }
            let _ = chunks.send((is_err, text.to_string()));
        }
    };
    let stderr_queue = queue.clone();
    let stdout_queue = queue;
    let logs = sb.process.get_session_command_logs_async(
        &session,
        &command,
        move |text| stdout_queue(false, text),
        move |text| stderr_queue(true, text),
    );
    let too_slow = || {
        format!(
            "the client fell more than {FOLLOW_QUEUE_BYTES} bytes behind the command's output; \
             read the rest with get_session_command_logs"
        )
    };
    tokio::pin!(logs);
    let mark = |is_err: bool| if is_err { STDERR_MARK } else { STDOUT_MARK };
    loop {
        tokio::select! {
            biased;
            chunk = queued.recv() => {
                let Some((is_err, text)) = chunk else { return };
                let len = text.len();
                if ws::send_binary(&mut socket, mark(is_err), text.as_bytes()).await.is_err() {
                    return;
                }
                held.fetch_sub(len, Ordering::Relaxed);
                if overflow.load(Ordering::Relaxed) && held.load(Ordering::Relaxed) == 0 {
                    ws::close(&mut socket, 1011, &too_slow()).await;
                    return;
                }
            }
            ended = &mut logs => {
                // Every callback has run by now: send what is queued, then close.
                while let Ok((is_err, text)) = queued.try_recv() {
                    if ws::send_binary(&mut socket, mark(is_err), text.as_bytes()).await.is_err() {
                        return;
                    }
                }
                match ended {
                    Ok(()) if overflow.load(Ordering::Relaxed) => {
                        ws::close(&mut socket, 1011, &too_slow()).await
                    }
                    Ok(()) => ws::close(&mut socket, 1000, "").await,
                    Err(e) => ws::close(&mut socket, 1011, &e.message()).await,
                };
                return;
            }
            // Pings are answered by tungstenite as it reads; what the client sends is ignored.
            message = socket.next() => match message {
                Some(Ok(Message::Close(_))) => {
                    ws::answer_close(&mut socket).await;
                    return;
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => return,
            },
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct InputRequest {
    data: String,
}

async fn command_input(
    State(wire): State<Wire>,
    Path((id, session, command)): Path<(String, String, String)>,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    let (req, sb): (InputRequest, _) = json_request(&wire, &id, &body).await?;
    sb.process
        .send_session_command_input(&session, &command, &req.data)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn git_status(
    State(wire): State<Wire>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Json<Value>, ApiError> {
    let q = query(raw);
    let path = required(&q, "path")?;
    let sb = sandbox(&wire, &id).await?;
    let st = sb.git.status(path).await?;
    let mut v = json!({
        "currentBranch": st.current_branch,
        "detached": st.current_branch == "HEAD",
        "fileStatus": st.file_status.iter().map(|f| json!({
            "name": f.name,
            "staging": f.staging,
            "worktree": f.worktree,
            "extra": f.extra,
        })).collect::<Vec<_>>(),
    });
    if let Some(ahead) = st.ahead {
        v["ahead"] = json!(ahead);
    }
    if let Some(behind) = st.behind {
        v["behind"] = json!(behind);
    }
    if let Some(published) = st.branch_published {
        v["branchPublished"] = json!(published);
    }
    Ok(Json(v))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GitAddRequest {
    path: String,
    files: Vec<String>,
}

async fn git_add(
    State(wire): State<Wire>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    let (req, sb): (GitAddRequest, _) = json_request(&wire, &id, &body).await?;
    sb.git.add(&req.path, req.files).await?;
    Ok(StatusCode::OK)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GitCommitRequest {
    path: String,
    message: String,
    author: String,
    email: String,
    allow_empty: Option<bool>,
}

async fn git_commit(
    State(wire): State<Wire>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let (req, sb): (GitCommitRequest, _) = json_request(&wire, &id, &body).await?;
    let commit = sb
        .git
        .commit(req.path, req.message, req.author, req.email)
        .allow_empty(req.allow_empty.unwrap_or(false))
        .await?;
    Ok(Json(json!({"hash": commit.sha})))
}

async fn git_branches(
    State(wire): State<Wire>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Json<Value>, ApiError> {
    let q = query(raw);
    let path = required(&q, "path")?;
    let sb = sandbox(&wire, &id).await?;
    let branches = sb.git.branches(path).await?;
    Ok(Json(json!({"branches": branches.branches})))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GitBranchRequest {
    path: String,
    name: String,
}

async fn git_create_branch(
    State(wire): State<Wire>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    let (req, sb): (GitBranchRequest, _) = json_request(&wire, &id, &body).await?;
    sb.git.create_branch(&req.path, &req.name).await?;
    Ok(StatusCode::CREATED)
}

async fn git_delete_branch(
    State(wire): State<Wire>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    let (req, sb): (GitBranchRequest, _) = json_request(&wire, &id, &body).await?;
    sb.git.delete_branch(&req.path, &req.name).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GitCheckoutRequest {
    path: String,
    branch: String,
}

async fn git_checkout(
    State(wire): State<Wire>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    let (req, sb): (GitCheckoutRequest, _) = json_request(&wire, &id, &body).await?;
    sb.git.checkout_branch(&req.path, &req.branch).await?;
    Ok(StatusCode::OK)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GitCloneRequest {
    url: String,
    path: String,
    branch: Option<String>,
    commit_id: Option<String>,
    username: Option<String>,
    password: Option<String>,
    depth: Option<i64>,
    insecure_skip_tls: Option<bool>,
}

async fn git_clone(
    State(wire): State<Wire>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    let (req, sb): (GitCloneRequest, _) = json_request(&wire, &id, &body).await?;
    sb.git
        .clone(req.url, req.path)
        .branch(req.branch)
        .commit_id(req.commit_id)
        .username(req.username)
        .password(req.password)
        .depth(req.depth)
        .insecure_skip_tls(req.insecure_skip_tls)
        .await?;
    Ok(StatusCode::OK)
}

/// `GitPullRequest` / `GitPushRequest`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GitSyncRequest {
    path: String,
    username: Option<String>,
    password: Option<String>,
    remote: Option<String>,
    branch: Option<String>,
    set_upstream: Option<bool>,
}

/// The remote, branch and upstream options the facade's pull and push do not take: refused
/// unless they say what the facade does anyway (the tracked upstream).
fn plain_sync(req: &GitSyncRequest) -> Result<(), ApiError> {
    if req.remote.as_deref().is_some_and(|r| r != "origin")
        || req.branch.is_some()
        || req.set_upstream == Some(true)
    {
        return Err(ApiError(crate::DaytonaError::not_supported(
            "git pull/push with remote, branch or set_upstream",
            "configure the upstream with process.exec('git -C PATH branch --set-upstream-to …') \
             and pull or push without them",
        )));
    }
    Ok(())
}

async fn git_pull(
    State(wire): State<Wire>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    let req: GitSyncRequest = parse_json(&wire, &body)?;
    plain_sync(&req)?;
    let sb = sandbox(&wire, &id).await?;
    sb.git
        .pull(req.path)
        .username(req.username)
        .password(req.password)
        .await?;
    Ok(StatusCode::OK)
}

async fn git_push(
    State(wire): State<Wire>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    let req: GitSyncRequest = parse_json(&wire, &body)?;
    plain_sync(&req)?;
    let sb = sandbox(&wire, &id).await?;
    sb.git
        .push(req.path)
        .username(req.username)
        .password(req.password)
        .await?;
    Ok(StatusCode::OK)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GitInitRequest {
    path: String,
    bare: Option<bool>,
    initial_branch: Option<String>,
}

async fn git_init(
    State(wire): State<Wire>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    let (req, sb): (GitInitRequest, _) = json_request(&wire, &id, &body).await?;
    sb.git
        .init(
            &req.path,
            req.bare.unwrap_or(false),
            req.initial_branch.as_deref().filter(|b| !b.is_empty()),
        )
        .await?;
    Ok(StatusCode::OK)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GitAddRemoteRequest {
    path: String,
    name: String,
    url: String,
    fetch: Option<bool>,
    overwrite: Option<bool>,
}

async fn git_remote_add(
    State(wire): State<Wire>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    let (req, sb): (GitAddRemoteRequest, _) = json_request(&wire, &id, &body).await?;
    sb.git
        .remote_add(
            &req.path,
            &req.name,
            &req.url,
            req.fetch.unwrap_or(false),
            req.overwrite.unwrap_or(false),
        )
        .await?;
    Ok(StatusCode::OK)
}

async fn git_remotes(
    State(wire): State<Wire>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Json<Value>, ApiError> {
    let q = query(raw);
    let path = required(&q, "path")?;
    let sb = sandbox(&wire, &id).await?;
    let remotes = sb.git.remotes(path).await?;
    Ok(Json(json!({
        "remotes": remotes
            .iter()
            .map(|(name, url)| json!({"name": name, "url": url}))
            .collect::<Vec<_>>(),
    })))
}
