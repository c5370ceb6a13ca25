//! PTY sessions under `/toolbox/{id}/process/pty…`: a shell on a pseudo-terminal in the
//! sandbox, driven over a WebSocket as the pinned SDKs do (`create_pty_session` /
//! `createPty` open `create-connect`, `connect_pty_session` / `connectPty` open
//! `{session}/connect`), plus list, info, resize and kill over REST.
//!
//! A session is one engine process started with a pty and tagged [`TAG`]`{id}`: whether it
//! runs, its cwd, envs and start time are asked of the engine on every call. Only its
//! terminal size (set at create, changed by resize) is kept here, in the listener's memory;
//! a session this listener did not make reports 80×24 until resized.
//!
//! On the socket: the server sends `{"type":"control","status":"connected"}` first, then the
//! terminal's output as binary messages; every message from the client (binary or text) is
//! the terminal's input. When the shell ends, a client that offered
//! [`EXIT_CONTROL_PROTOCOL`] gets `{"type":"control","status":"exited","exitCode":N}`, and the
//! socket closes with 1000. `connect` sends only output written after it connected (no
//! replay). The connection is bounded as every upgraded one (`sandcove::server::upgrade`: the
//! listener's cap, shutdown, its idle limit; the SDKs ping every 20 s, which counts).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::Method;
use axum::response::Response;
use axum::Json;
use base64::Engine as _;
use futures::{SinkExt as _, StreamExt as _};
use sandcove::server::auth::{Routes, SERVER_KEY};
use sandcove::{ProcessEvent, ProcessSelector, ProcessSpec, PtySize};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

use super::{bad_request, parse_json, ws, ApiError, Wire};
use crate::errors::ErrorDetails;
use crate::DaytonaError;

/// Tag prefix of a PTY session's process.
pub const TAG: &str = "daytona-pty:";
/// The subprotocol a client offers to be told the shell's exit code.
pub const EXIT_CONTROL_PROTOCOL: &str = "X-Daytona-Pty-Exit-Control";
/// The subprotocol prefix carrying the session's envs (base64url of a JSON object).
const ENVS_PROTOCOL: &str = "X-Daytona-Pty-Envs~";
/// Largest terminal side, as the SDKs' models allow.
const MAX_SIDE: i64 = 1000;
/// The size a session this listener did not make reports.
const DEFAULT_SIZE: PtySize = PtySize { cols: 80, rows: 24 };

/// Terminal sizes of the sessions this listener made, by (sandbox id, session id).
#[derive(Default)]
pub(crate) struct Sizes(Mutex<HashMap<(String, String), PtySize>>);

impl Sizes {
    fn get(&self, sandbox: &str, session: &str) -> PtySize {
        self.0
            .lock()
            .expect("pty sizes")
            .get(&(sandbox.to_string(), session.to_string()))
            .copied()
            .unwrap_or(DEFAULT_SIZE)
    }

    fn set(&self, sandbox: &str, session: &str, size: PtySize) {
        self.0
            .lock()
            .expect("pty sizes")
            .insert((sandbox.to_string(), session.to_string()), size);
    }
}

/// The PTY routes (nested under `/toolbox/{id}`).
pub(crate) fn routes() -> Routes<Wire> {
    Routes::new(super::refuse)
        .route(Method::GET, "/process/pty", SERVER_KEY, list)
        .route(Method::POST, "/process/pty", SERVER_KEY, create_unconnected)
        .route(
            Method::GET,
            "/process/pty/create-connect",
            SERVER_KEY,
            create_connect,
        )
        .route(Method::GET, "/process/pty/{session}", SERVER_KEY, info)
        .route(Method::DELETE, "/process/pty/{session}", SERVER_KEY, kill)
        .route(
            Method::GET,
            "/process/pty/{session}/connect",
            SERVER_KEY,
            connect,
        )
        .route(
            Method::POST,
            "/process/pty/{session}/resize",
            SERVER_KEY,
            resize,
        )
}

/// `POST /process/pty` (a session created without a connection, then connected to): not
/// served; the pinned SDKs create and connect in one step.
async fn create_unconnected() -> Response {
    super::error_response(
        axum::http::StatusCode::NOT_IMPLEMENTED,
        "creating a PTY session without connecting to it is not served by Sandcove; instead \
         use create_pty_session / createPty (GET /process/pty/create-connect as a WebSocket)"
            .into(),
        Some("NOT_SUPPORTED"),
    )
}

fn check_id(id: &str) -> Result<(), ApiError> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(bad_request(format!(
            "invalid PTY session id {id:?}: 1 to 128 letters, digits, '-', '_' or '.'"
        )))
    }
}

fn size(cols: i64, rows: i64) -> Result<PtySize, ApiError> {
    let side = |n: i64, what: &str| {
        if (1..=MAX_SIDE).contains(&n) {
            Ok(n as u16)
        } else {
            Err(bad_request(format!(
                "{what} must be between 1 and {MAX_SIDE}"
            )))
        }
    };
    Ok(PtySize {
        cols: side(cols, "cols")?,
        rows: side(rows, "rows")?,
    })
}

/// The sandbox a call is for, checked through the facade (missing → the SDK's 404), as the
/// engine's handle.
async fn sandbox(wire: &Wire, id: &str) -> Result<sandcove::Sandbox, ApiError> {
    let sb = wire.daytona().get(id.to_string()).await?;
    Ok(wire.client.sandbox(sb.id))
}

fn not_found(session: &str) -> ApiError {
    ApiError(DaytonaError::NotFound(ErrorDetails::new(
        format!("PTY session {session} not found"),
        Some(404),
        None,
    )))
}

/// The engine's record of session `session`, if it has one.
async fn process(
    sb: &sandcove::Sandbox,
    session: &str,
) -> Result<Option<sandcove::ProcessInfo>, ApiError> {
    let tag = format!("{TAG}{session}");
    let mut matching: Vec<_> = sb
        .processes()
        .await?
        .into_iter()
        .filter(|p| p.tag.as_deref() == Some(tag.as_str()))
        .collect();
    // The running one if any, else the latest to have run.
    matching.sort_by_key(|p| (p.exit.is_none(), p.started_at));
    Ok(matching.pop())
}

fn info_body(wire: &Wire, sandbox: &str, p: &sandcove::ProcessInfo) -> Value {
    let id = p
        .tag
        .as_deref()
        .and_then(|t| t.strip_prefix(TAG))
        .unwrap_or("");
    let size = wire.ptys.get(sandbox, id);
    let envs: BTreeMap<&String, &String> = p.envs.iter().filter(|(k, _)| *k != "TERM").collect();
    json!({
        "id": id,
        "active": p.exit.is_none(),
        "cols": size.cols,
        "rows": size.rows,
        "cwd": p.cwd,
        "envs": envs,
        "createdAt": crate::translate::rfc3339(p.started_at),
        "lazyStart": false,
    })
}

/// `GET /process/pty`: `{"sessions": [PtySessionInfo]}`.
async fn list(State(wire): State<Wire>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let sb = sandbox(&wire, &id).await?;
    let mut latest: BTreeMap<String, sandcove::ProcessInfo> = BTreeMap::new();
    for p in sb.processes().await? {
        let Some(session) = p.tag.as_deref().and_then(|t| t.strip_prefix(TAG)) else {
            continue;
        };
        let newer = latest
            .get(session)
            .is_none_or(|q| (p.exit.is_none(), p.started_at) > (q.exit.is_none(), q.started_at));
        if newer {
            latest.insert(session.to_string(), p);
        }
    }
    let sessions: Vec<Value> = latest
        .values()
        .map(|p| info_body(&wire, sb.id(), p))
        .collect();
    Ok(Json(json!({ "sessions": sessions })))
}

/// `GET /process/pty/{session}`: `PtySessionInfo`.
async fn info(
    State(wire): State<Wire>,
    Path((id, session)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let sb = sandbox(&wire, &id).await?;
    let p = process(&sb, &session)
        .await?
        .ok_or_else(|| not_found(&session))?;
    Ok(Json(info_body(&wire, sb.id(), &p)))
}

/// `DELETE /process/pty/{session}`: kill the shell's process group; answers a JSON object
/// (the SDKs parse one).
async fn kill(
    State(wire): State<Wire>,
    Path((id, session)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let sb = sandbox(&wire, &id).await?;
    match process(&sb, &session).await? {
        Some(p) if p.exit.is_none() => {}
        _ => return Err(not_found(&session)),
    }
    sb.signal(
        ProcessSelector::Tag(format!("{TAG}{session}")),
        sandcove::Signal::Kill,
    )
    .await?;
    Ok(Json(
        json!({ "message": format!("PTY session {session} killed") }),
    ))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResizeRequest {
    cols: i64,
    rows: i64,
}

/// `POST /process/pty/{session}/resize`: `PtySessionInfo` with the new size.
async fn resize(
    State(wire): State<Wire>,
    Path((id, session)): Path<(String, String)>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let req: ResizeRequest = parse_json(&wire, &body)?;
    let new_size = size(req.cols, req.rows)?;
    let sb = sandbox(&wire, &id).await?;
    let p = match process(&sb, &session).await? {
        Some(p) if p.exit.is_none() => p,
        _ => return Err(not_found(&session)),
    };
    sb.resize_pty(ProcessSelector::Tag(format!("{TAG}{session}")), new_size)
        .await?;
    wire.ptys.set(sb.id(), &session, new_size);
    Ok(Json(info_body(&wire, sb.id(), &p)))
}

/// The envs a client sent in its [`ENVS_PROTOCOL`] subprotocol.
fn envs_of(protocols: &[String]) -> Result<BTreeMap<String, String>, ApiError> {
    let Some(encoded) = protocols.iter().find_map(|p| p.strip_prefix(ENVS_PROTOCOL)) else {
        return Ok(BTreeMap::new());
    };
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(encoded.trim_end_matches('='))
        .map_err(|_| bad_request("the PTY envs subprotocol is not base64url"))?;
    serde_json::from_slice(&raw)
        .map_err(|_| bad_request("the PTY envs subprotocol is not a JSON object of strings"))
}

/// The subprotocol to answer with: the exit-control one when offered (a client that offers
/// subprotocols fails a handshake that names none).
fn chosen(protocols: &[String]) -> Option<&'static str> {
    protocols
        .iter()
        .any(|p| p == EXIT_CONTROL_PROTOCOL)
        .then_some(EXIT_CONTROL_PROTOCOL)
}

/// `GET /process/pty/create-connect?id=&cols=&rows=&cwd=` (WebSocket): start the shell and
/// connect to it in one round trip.
async fn create_connect(
    State(wire): State<Wire>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
    mut request: Request,
) -> Result<Response, ApiError> {
    let q = super::toolbox::query(raw);
    let session = super::toolbox::required(&q, "id")?.to_string();
    check_id(&session)?;
    let number = |name: &str, default: i64| match q.get(name) {
        None => Ok(default),
        Some(v) => v
            .parse::<i64>()
            .map_err(|_| bad_request(format!("{name} must be an integer"))),
    };
    let pty_size = size(number("cols", 80)?, number("rows", 24)?)?;
    let protocols = ws::offered_protocols(&request);
    let envs = envs_of(&protocols)?;
    if !ws::is_websocket(&request) {
        return Err(bad_request(
            "create-connect is a WebSocket: open it with an upgrade, as the SDKs do",
        ));
    }
    let facade = wire.daytona().get(id.clone()).await?;
    let cwd = match q.get("cwd").filter(|c| !c.is_empty()) {
        Some(c) => c.clone(),
        None => facade.get_work_dir().await?,
    };
    let sb = wire.client.sandbox(facade.id.clone());
    if process(&sb, &session)
        .await?
        .is_some_and(|p| p.exit.is_none())
    {
        return Err(ApiError(DaytonaError::Conflict(ErrorDetails::new(
            format!("PTY session {session} already exists"),
            Some(409),
            None,
        ))));
    }
    let mut spec = ProcessSpec::new(sandcove::Command::argv(["/bin/bash", "-i"]));
    spec.envs = envs;
    spec.envs.insert("TERM".into(), "xterm-256color".into());
    spec.cwd = Some(cwd);
    spec.tag = Some(format!("{TAG}{session}"));
    spec.stdin = true;
    spec.pty = Some(pty_size);
    let (upgrade, response) = ws::accept(&mut request, chosen(&protocols)).map_err(bad_request)?;
    // Started only once the handshake is known to be good, so a refused one leaves nothing.
    let handle = sb.spawn(spec).await?;
    wire.ptys.set(sb.id(), &session, pty_size);
    let exit_control = chosen(&protocols).is_some();
    upgrade.run(move |socket| drive(socket, sb, session, handle, false, exit_control));
    Ok(response)
}

/// `GET /process/pty/{session}/connect` (WebSocket): attach to a running shell.
async fn connect(
    State(wire): State<Wire>,
    Path((id, session)): Path<(String, String)>,
    mut request: Request,
) -> Result<Response, ApiError> {
    if !ws::is_websocket(&request) {
        return Err(bad_request(
            "connect is a WebSocket: open it with an upgrade, as the SDKs do",
        ));
    }
    let sb = sandbox(&wire, &id).await?;
    match process(&sb, &session).await? {
        Some(p) if p.exit.is_none() => {}
        _ => return Err(not_found(&session)),
    }
    let handle = sb
        .attach(ProcessSelector::Tag(format!("{TAG}{session}")))
        .await?;
    let protocols = ws::offered_protocols(&request);
    let (upgrade, response) = ws::accept(&mut request, chosen(&protocols)).map_err(bad_request)?;
    let exit_control = chosen(&protocols).is_some();
    upgrade.run(move |socket| drive(socket, sb, session, handle, true, exit_control));
    Ok(response)
}

/// Carry one connection: output to the client, its messages to the terminal, until the
/// shell ends or the client leaves (the shell goes on running then).
async fn drive(
    mut socket: ws::Socket,
    sb: sandcove::Sandbox,
    session: String,
    mut handle: sandcove::ProcessHandle,
    attached: bool,
    exit_control: bool,
) {
    let selector = ProcessSelector::Tag(format!("{TAG}{session}"));
    let connected = Message::text(r#"{"type":"control","status":"connected"}"#);
    if socket.send(connected).await.is_err() {
        return;
    }
    // On attach, history (before `Live`) is not replayed.
    let mut live = !attached;
    loop {
        tokio::select! {
            event = handle.next_event() => match event {
                Some(Ok(ProcessEvent::Live)) => live = true,
                Some(Ok(ProcessEvent::Stdout(bytes) | ProcessEvent::Stderr(bytes))) if live => {
                    if ws::send_binary(&mut socket, b"", &bytes).await.is_err() {
                        return;
                    }
                }
                Some(Ok(ProcessEvent::Exit(status))) => {
                    if exit_control {
                        let mut control = json!({
                            "type": "control",
                            "status": "exited",
                            "exitCode": status.code_or_signal(),
                        });
                        if let Some(signal) = status.signal {
                            control["exitReason"] = json!(format!("killed by signal {signal}"));
                        }
                        let _ = socket.send(Message::text(control.to_string())).await;
                    }
                    ws::close(&mut socket, 1000, "").await;
                    return;
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    ws::close(&mut socket, 1011, &e.to_string()).await;
                    return;
                }
                None => {
                    ws::close(&mut socket, 1011, "the terminal's stream ended").await;
                    return;
                }
            },
            // Pings are answered by tungstenite as it reads.
            message = socket.next() => {
                let input = match message {
                    Some(Ok(Message::Binary(data))) => Vec::from(data),
                    Some(Ok(Message::Text(text))) => text.as_bytes().to_vec(),
                    Some(Ok(Message::Close(_))) => {
                        ws::answer_close(&mut socket).await;
                        return;
                    }
                    Some(Ok(_)) => continue,
                    Some(Err(_)) | None => return,
                };
                if let Err(e) = sb.write_stdin(selector.clone(), input).await {
                    ws::close(&mut socket, 1011, &e.to_string()).await;
                    return;
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envs_travel_as_base64url_json() {
        let token = format!(
            "{ENVS_PROTOCOL}{}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(br#"{"A":"1","B":"x y"}"#)
        );
        let envs = envs_of(&[EXIT_CONTROL_PROTOCOL.to_string(), token]).unwrap();
        assert_eq!(envs.get("A").map(String::as_str), Some("1"));
        assert_eq!(envs.get("B").map(String::as_str), Some("x y"));
        assert!(envs_of(&[format!("{ENVS_PROTOCOL}!!")]).is_err());
        assert!(envs_of(&[]).unwrap().is_empty());
    }

    #[test]
    fn sizes_and_ids_are_bounded() {
        assert!(size(80, 24).is_ok());
        for (c, r) in [(0, 24), (80, 0), (1001, 24), (80, -1)] {
            assert!(size(c, r).is_err(), "{c}x{r}");
        }
        assert!(check_id("my-pty_1.a").is_ok());
        for bad in ["", "a/b", "a b", &"x".repeat(129)] {
            assert!(check_id(bad).is_err(), "{bad:?}");
        }
    }
}
