//! Daytona's official Python and TypeScript SDKs, unmodified, against
//! `sandcove serve --daytona`.
//!
//! Each test provisions the pinned SDK (`fixtures/python/pins-daytona-*.txt` in a
//! virtualenv, `fixtures/js/daytona/package-lock.json` with `npm ci`, both under the build
//! directory) on first use, starts the built `sandcove serve` on
//! free loopback ports with a private state directory, points the SDK at it with the lines
//! `sandcove env daytona` prints (exactly what a user evaluates), runs one program from
//! `fixtures/python/` or `fixtures/js/daytona/` and compares its output with the `.expected`
//! file beside it. A machine without `python3`, `node` or `npm` fails these tests, saying so.

use std::process::Command;
use std::time::Duration;

use crate::common::bin;
use crate::sdk_harness::{assert_expected, check_node, check_node_with, run_python, Server};
use sandcove_conformance::images::{shell_image, MARKER_PATH};
use serde_json::Value;

const PINS: &str = "pins-daytona-0.226.1.txt";
const ANNOUNCE: &str = "Daytona wire protocol";

/// One call to the Daytona listener with `key`: (status, JSON body).
fn call(server: &Server, key: &str, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = reqwest::Client::new();
        let url = format!("{}{path}", server.origin);
        let mut req = client
            .request(method.parse().unwrap(), url)
            .bearer_auth(key);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let resp = req.send().await.expect("the listener answers");
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    })
}

/// The Python README's quickstart, verbatim (`api_key="YOUR_API_KEY"` is in the code, so
/// the server is started with that key). It prints nothing and leaves its sandbox running:
/// the test then finds that sandbox through the same listener and checks what the
/// quickstart did to it.
#[test]
fn python_sdk_readme_quickstart_verbatim() {
    let server = Server::start("daytona", ANNOUNCE, "YOUR_API_KEY");
    let out = run_python(PINS, "daytona_quickstart", &server, &[]);
    assert_expected("daytona_quickstart", &out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("Warning") && !stderr.to_lowercase().contains("socket"),
        "the SDK runs quietly (no polling-only mode, no socket error):\n{stderr}"
    );
    let (status, page) = call(&server, &server.key, "GET", "/api/sandbox", None);
    assert_eq!(status, 200, "{page}");
    let items = page["items"].as_array().expect("items");
    assert_eq!(items.len(), 1, "the quickstart's one sandbox: {page}");
    let sb = &items[0];
    assert_eq!(sb["state"], "started");
    assert_eq!(sb["labels"]["code-toolbox-language"], "python");
    assert_eq!(
        sb["toolboxProxyUrl"],
        Value::String(format!("{}/toolbox", server.origin))
    );
    // The sandbox the SDK made runs code through the same toolbox the SDK used.
    let id = sb["id"].as_str().unwrap();
    let (status, run) = call(
        &server,
        &server.key,
        "POST",
        &format!("/toolbox/{id}/process/code-run"),
        Some(serde_json::json!({"code": "print(6 * 7)", "language": "python"})),
    );
    assert_eq!(status, 200, "{run}");
    assert_eq!(run["result"], "42\n");
    assert_eq!(run["exitCode"], 0);
}

/// The SDK's event socket connects (`sandcove env` sets no polling-only mode), nothing is
/// printed on stderr, and with the socket connected `create()`, `stop()` and `start()`
/// end in the states the server answered (the server sends no events; the SDK's first poll
/// of each wait sees the final state — `cargo bench` times `create()` against the
/// listener's own answer, so no timing is asserted here).
#[test]
fn python_sdk_connects_its_event_socket_and_its_waits_end_in_the_answered_states() {
    let server = Server::start("daytona", ANNOUNCE, "events-key");
    let out = run_python(PINS, "daytona_events", &server, &[]);
    assert_expected("daytona_events", &out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.trim().is_empty(), "nothing on stderr:\n{stderr}");
}

/// Sandboxes (env, labels, get by id and name, list by label), commands (env, cwd, exit
/// codes, `sh -c`, timeout), `code_run`, sessions (sync, async with input, logs, list,
/// delete), files (upload, bulk upload, download, list, info, find, replace, move, delete),
/// labels update, a preview link that reaches a server in the sandbox, stop/start keeping
/// files, archive, and errors (missing sandbox, wrong key, missing file, timeout, a gap) as
/// the SDK's own exception classes.
#[test]
fn python_sdk_sandboxes_commands_sessions_files_previews_and_errors() {
    let server = Server::start("daytona", ANNOUNCE, "basics-key");
    let out = run_python(PINS, "daytona_basics", &server, &[]);
    assert_expected("daytona_basics", &out);
}

/// Git on a repository in the sandbox through the SDK: status, add, commit, branches,
/// checkout, a clone of a local repository, and a remote that cannot be reached (a loopback
/// address inside the sandbox) surfacing as the SDK's error.
#[test]
fn python_sdk_git_on_a_local_repository() {
    let server = Server::start("daytona", ANNOUNCE, "git-key");
    let out = run_python(PINS, "daytona_git", &server, &[]);
    assert_expected("daytona_git", &out);
}

/// Volumes through the SDK: `volume.get(create=True)`, a mount at creation, files kept
/// across sandboxes, list and delete.
#[test]
fn python_sdk_volumes_keep_files_across_sandboxes() {
    let server = Server::start("daytona", ANNOUNCE, "volumes-key");
    let out = run_python(PINS, "daytona_volumes", &server, &[]);
    assert_expected("daytona_volumes", &out);
}

/// Snapshots through the SDK: `create_snapshot`, get, list, a sandbox created from the
/// snapshot by name with its files, delete; building one from an image is the SDK's error
/// naming the alternative.
#[test]
fn python_sdk_snapshots_and_create_from_a_named_snapshot() {
    let server = Server::start("daytona", ANNOUNCE, "snapshots-key");
    let out = run_python(PINS, "daytona_snapshots", &server, &[]);
    assert_expected("daytona_snapshots", &out);
}

/// Fork (a copy of the files, independent afterwards), pause then start, and a signed
/// preview URL that reaches a server in the sandbox with no header.
#[test]
fn python_sdk_fork_pause_and_signed_previews() {
    let server = Server::start("daytona", ANNOUNCE, "fork-key");
    let out = run_python(PINS, "daytona_fork_pause_previews", &server, &[]);
    assert_expected("daytona_fork_pause_previews", &out);
}

/// Pre-signed file URLs: `upload_url` and `download_url` used with a plain HTTP client and
/// no credential (one that never expires too); another path, another method, the other
/// operation, another sandbox, another sandbox's key, an expired signature and a rotated key
/// are refused before any effect.
#[test]
fn python_sdk_pre_signed_file_urls() {
    let server = Server::start("daytona", ANNOUNCE, "file-urls-key");
    let out = run_python(PINS, "daytona_file_urls", &server, &[]);
    assert_expected("daytona_file_urls", &out);
}

/// Auto-stop/archive/delete intervals, `refresh_activity`, home and work directories, list
/// filtered by state, the client's `start`/`stop`, and `delete(wait=True)`.
#[test]
fn python_sdk_intervals_states_and_waiting_delete() {
    let server = Server::start("daytona", ANNOUNCE, "lifecycle-key");
    let out = run_python(PINS, "daytona_lifecycle", &server, &[]);
    assert_expected("daytona_lifecycle", &out);
}

/// Followed session command logs (the SDK's WebSocket, callbacks per stream, returning once
/// the command ends) and PTY sessions over WebSockets: create with size, cwd and envs, input
/// and output, resize seen by the shell, info, list, a second connection, the exit code, kill,
/// and missing or duplicate sessions as the SDK's own errors.
#[test]
fn python_sdk_follows_logs_and_drives_pty_sessions() {
    let server = Server::start("daytona", ANNOUNCE, "streams-key");
    let out = run_python(PINS, "daytona_streams", &server, &[]);
    assert_expected("daytona_streams", &out);
}

/// The host's own base image as a Docker reference (`debian:bookworm-slim`), from the
/// host's `/etc/os-release`: the one image the engine truly runs.
fn host_base_image() -> String {
    let os = std::fs::read_to_string("/etc/os-release").expect("/etc/os-release");
    let field = |name: &str| {
        os.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix('='))
            .map(|v| v.trim_matches('"').to_string())
    };
    assert_eq!(
        field("ID").as_deref(),
        Some("debian"),
        "the image tests expect a Debian host (the engine runs the host's base)"
    );
    format!(
        "debian:{}-slim",
        field("VERSION_CODENAME").expect("VERSION_CODENAME")
    )
}

/// Create from an image and with resources: an image imported into the server's store
/// (`sandcove image import`) is the sandbox's file system, environment and work dir (its
/// `WORKDIR`); the host's base image is accepted (with resources within the host's, the disk
/// size applied); an image that is not stored is the SDK's `DaytonaNotFoundError` (404)
/// saying how to store it, a declarative one its `DaytonaBadRequestError` (400), and
/// resources above the host's are Daytona's 400; refusals create nothing.
#[test]
fn python_sdk_images_and_resources() {
    let server = Server::start("daytona", ANNOUNCE, "images-key");
    let reference = "test.local/daytona-sdk:1";
    crate::images::import(
        &server.state.dir,
        &shell_image("daytona-image-marker").build(),
        reference,
    );
    let host_image = host_base_image();
    let out = run_python(
        PINS,
        "daytona_images",
        &server,
        &[
            ("IMAGE", reference),
            ("MARKER_PATH", MARKER_PATH),
            ("HOST_BASE_IMAGE", host_image.as_str()),
        ],
    );
    assert_expected("daytona_images", &out);
}

/// The TypeScript SDK's getting-started program (from its documentation: the
/// `@daytonaio/sdk` README itself only announces the rename to `@daytona/sdk`), verbatim.
/// It never deletes its sandbox; it must still end by itself, with the SDK's event socket
/// connected (the SDK lets an idle socket keep no Node program alive).
#[test]
fn js_sdk_getting_started_verbatim() {
    let server = Server::start("daytona", ANNOUNCE, "js-quickstart-key");
    check_node(
        "daytona",
        "daytona_quickstart",
        &server,
        Duration::from_secs(60),
    );
}

/// The Python program's ground in TypeScript: sandboxes, commands, sessions, files,
/// previews, stop/start and the SDK's error classes.
#[test]
fn js_sdk_sandboxes_commands_sessions_files_previews_and_errors() {
    let server = Server::start("daytona", ANNOUNCE, "js-basics-key");
    check_node(
        "daytona",
        "daytona_basics",
        &server,
        Duration::from_secs(120),
    );
}

/// The rest in TypeScript: git, volumes, snapshots (and a sandbox from one), fork, a signed
/// preview URL, intervals, pause/start and a documented gap (resize).
#[test]
fn js_sdk_git_volumes_snapshots_fork_and_gaps() {
    let server = Server::start("daytona", ANNOUNCE, "js-more-key");
    check_node("daytona", "daytona_more", &server, Duration::from_secs(120));
}

/// Followed logs, PTY sessions, images (one imported into the server's store) and
/// resources in TypeScript.
#[test]
fn js_sdk_follows_logs_drives_pty_sessions_and_checks_images() {
    let server = Server::start("daytona", ANNOUNCE, "js-streams-key");
    let reference = "test.local/daytona-js:1";
    crate::images::import(
        &server.state.dir,
        &shell_image("daytona-js-image-marker").build(),
        reference,
    );
    let host_image = host_base_image();
    check_node_with(
        "daytona",
        "daytona_streams",
        &server,
        Duration::from_secs(120),
        &[
            ("HOST_BASE_IMAGE", host_image.as_str()),
            ("IMAGE", reference),
            ("MARKER_PATH", MARKER_PATH),
        ],
    );
}

#[test]
fn env_points_at_the_running_server_and_fails_without_one() {
    let mut server = Server::start("daytona", ANNOUNCE, "k-env");
    let vars = server.env().expect("sandcove env daytona");
    assert_eq!(
        vars,
        vec![
            (
                "DAYTONA_API_URL".to_string(),
                format!("{}/api", server.origin)
            ),
            ("DAYTONA_API_KEY".to_string(), "k-env".to_string()),
        ]
    );
    let out = Command::new(bin())
        .args(["env", "daytona"])
        .env_remove("SANDCOVE_API_KEY")
        .env("SANDCOVE_STATE_DIR", &server.state.dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "no key, nothing to print");
    server.stop();
    let err = server.env().expect_err("no server runs any more");
    assert!(
        err.contains("no running `sandcove serve --daytona"),
        "{err}"
    );
}

/// Every route checks the key before anything happens: a wrong or missing key is Daytona's
/// 401 shape and creates nothing.
#[test]
fn a_wrong_key_is_refused_before_any_effect() {
    let server = Server::start("daytona", ANNOUNCE, "right-key");
    for key in ["wrong-key", ""] {
        for (method, path) in [
            ("POST", "/api/sandbox"),
            ("GET", "/api/sandbox"),
            ("POST", "/toolbox/any/process/execute"),
            // The WebSocket routes too (the upgrade is never reached without the key).
            ("GET", "/toolbox/any/process/pty/create-connect?id=a"),
            ("GET", "/toolbox/any/process/pty/a/connect"),
            (
                "GET",
                "/toolbox/any/process/session/s/command/c/logs?follow=true",
            ),
        ] {
            let (status, body) = call(&server, key, method, path, Some(serde_json::json!({})));
            assert_eq!(status, 401, "{method} {path}: {body}");
            assert_eq!(body["statusCode"], 401);
            assert_eq!(body["error"], "Unauthorized");
            assert!(body["message"].is_string());
        }
    }
    let (status, page) = call(&server, "right-key", "GET", "/api/sandbox", None);
    assert_eq!(status, 200);
    assert_eq!(page["items"], serde_json::json!([]), "nothing was created");
}
