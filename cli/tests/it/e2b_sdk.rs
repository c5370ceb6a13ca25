//! E2B's official Python and JavaScript SDKs, unmodified, against `sandcove serve --e2b`.
//!
//! Each test provisions the pinned SDK (`fixtures/python/pins-*.txt` in a virtualenv,
//! `fixtures/js/package-lock.json` with `npm ci`) on first use, once per user: under the
//! build directory when this user can write there, else in a private directory of the user's
//! in the temp dir (CI's rootless pass runs these tests as an unprivileged user, with the
//! system `python3`), starts the built `sandcove serve` on free loopback ports
//! with a private state directory, points the SDK at it with the lines `sandcove env e2b`
//! prints (exactly what a user evaluates), runs one program from `fixtures/python/` or
//! `fixtures/js/` and compares its output with the `.expected` file beside it. A machine
//! without `python3` or `node` and `npm` fails these tests, saying so.

use std::process::Command;
use std::time::Duration;

use crate::common::bin;
use crate::sdk_harness::{assert_expected, check_node, run_python, Server};
use sandcove_conformance::images::{shell_image, MARKER_PATH};

/// The plain SDK (`e2b`).
const E2B_PINS: &str = "pins-e2b-2.63.0.txt";
/// The code interpreter SDK (`e2b-code-interpreter`, on top of `e2b`).
const CI_PINS: &str = "pins-e2b-code-interpreter-2.11.5.txt";
/// The last SDK that creates with `POST /sandboxes` (newer ones use `/v2/sandboxes`).
const E2B_LEGACY_PINS: &str = "pins-e2b-2.50.0.txt";

/// How the server names its E2B listener on stderr.
const ANNOUNCE: &str = "E2B wire protocol";

/// A fresh `sandcove serve --e2b` with a private state directory.
fn server() -> Server {
    Server::start("e2b", ANNOUNCE, &format!("sdk-test-{}", std::process::id()))
}

/// Run `fixtures/js/<name>.mjs` with the pinned SDK against a fresh server.
fn check_js_program(name: &str) {
    check_node("", name, &server(), Duration::from_secs(300));
}

#[test]
fn js_sdk_readme_quickstart_verbatim() {
    check_js_program("e2b_quickstart");
}

#[test]
fn js_sdk_commands_files_watch_and_errors() {
    check_js_program("e2b_basics");
}

/// `@e2b/code-interpreter`'s README quickstart, verbatim.
#[test]
fn js_code_interpreter_readme_quickstart_verbatim() {
    check_js_program("e2b_ci_quickstart");
}

/// Every gap the JS SDK can reach: its own error class, Sandcove's refusal with the
/// alternative, and no effect (the program checks what it can see; `e2b_wire` checks the
/// engine).
#[test]
fn js_sdk_gaps_raise_the_sdk_error_with_the_alternative() {
    check_js_program("e2b_gaps");
}

/// `downloadUrl`/`uploadUrl` fetched with plain `fetch`, and gzip transfers.
/// `createSnapshot`, `listSnapshots`, a snapshot as template, `deleteSnapshot`, `fork`.
#[test]
fn js_sdk_snapshots_and_fork() {
    check_js_program("e2b_snapshots");
}

#[test]
fn js_sdk_file_urls_and_gzip() {
    check_js_program("e2b_urls");
}

#[test]
fn js_code_interpreter_contexts_errors_envs_timeout() {
    check_js_program("e2b_ci_contexts");
}

/// Run `fixtures/python/<name>.py` with the SDK of `pins` against a fresh server; compare
/// its stdout with `<name>.expected`.
fn check_program(pins: &str, name: &str) {
    let out = run_python(pins, name, &server(), &[]);
    assert_expected(name, &out);
}

#[test]
fn python_sdk_readme_quickstart_verbatim() {
    check_program(E2B_PINS, "e2b_quickstart");
}

#[test]
fn python_sdk_commands() {
    check_program(E2B_PINS, "e2b_commands");
}

#[test]
fn python_sdk_files() {
    check_program(E2B_PINS, "e2b_files");
}

#[test]
fn python_sdk_processes_and_lifecycle() {
    check_program(E2B_PINS, "e2b_processes");
}

#[test]
fn python_sdk_watch_by_polling() {
    check_program(E2B_PINS, "e2b_watch");
}

#[test]
fn python_sdk_async_and_streamed_watch() {
    check_program(E2B_PINS, "e2b_async");
}

/// Every gap the Python SDK can reach: its own exception class, Sandcove's refusal with the
/// alternative, and no effect (the program checks what it can see; `e2b_wire` checks the
/// engine).
#[test]
fn python_sdk_gaps_raise_the_sdk_exception_with_the_alternative() {
    check_program(E2B_PINS, "e2b_gaps");
}

/// `create_snapshot`, `list_snapshots`, a snapshot as `template`, `delete_snapshot`, `fork`.
#[test]
fn python_sdk_snapshots_and_fork() {
    check_program(E2B_PINS, "e2b_snapshots");
}

/// `download_url`/`upload_url` fetched with plain httpx, gzip transfers, `stream_input`.
#[test]
fn python_sdk_file_urls_gzip_and_stream_input() {
    check_program(E2B_PINS, "e2b_urls");
}

/// `lifecycle={"on_timeout": {"action": "pause", "mode": "filesystem"}}`: the runtime's stop
/// at the timeout, reported as paused, started again by `connect`.
#[test]
fn python_sdk_filesystem_only_auto_pause() {
    check_program(E2B_PINS, "e2b_lifecycle");
}

#[test]
fn python_sdk_sandboxes() {
    check_program(E2B_PINS, "e2b_sandboxes");
}

/// `Sandbox.create(template=…)` naming an image imported into the server's store, or a
/// name the server maps to it (`--e2b-template NAME=IMAGE`): the image's files, environment
/// and working directory; a template that is neither is the SDK's `SandboxException`, 404
/// "template '…' not found".
#[test]
fn python_sdk_templates_that_are_images() {
    let reference = "test.local/e2b-sdk:1";
    let mapping = format!("my-template={reference}");
    let server = Server::start_with(
        "e2b",
        ANNOUNCE,
        &format!("sdk-test-{}", std::process::id()),
        &["--e2b-template", &mapping],
    );
    crate::images::import(
        &server.state.dir,
        &shell_image("e2b-image-marker").build(),
        reference,
    );
    let out = run_python(
        E2B_PINS,
        "e2b_images",
        &server,
        &[
            ("IMAGE", reference),
            ("TEMPLATE", "my-template"),
            ("MARKER_PATH", MARKER_PATH),
        ],
    );
    assert_expected("e2b_images", &out);
}

/// `e2b-code-interpreter`'s README quickstart, verbatim.
#[test]
fn python_code_interpreter_readme_quickstart_verbatim() {
    check_program(CI_PINS, "e2b_ci_quickstart");
}

#[test]
fn python_code_interpreter_contexts_errors_envs_timeout() {
    check_program(CI_PINS, "e2b_ci_contexts");
}

/// The same programs with the older SDK: the legacy create path and older Connect clients.
#[test]
fn python_sdk_2_50_legacy_create_and_every_program() {
    for name in [
        "e2b_quickstart",
        "e2b_commands",
        "e2b_files",
        "e2b_processes",
        "e2b_sandboxes",
        "e2b_watch",
        "e2b_async",
    ] {
        check_program(E2B_LEGACY_PINS, name);
    }
}

#[test]
fn env_points_at_the_running_server_and_fails_without_one() {
    let mut server = server();
    let vars = server.env().expect("sandcove env e2b");
    assert_eq!(
        vars,
        vec![
            ("E2B_API_URL".to_string(), server.origin.clone()),
            ("E2B_SANDBOX_URL".to_string(), server.origin.clone()),
            ("E2B_API_KEY".to_string(), server.key.clone()),
        ]
    );
    // Without the key there is nothing to print.
    let out = Command::new(bin())
        .args(["env", "e2b"])
        .env_remove("SANDCOVE_API_KEY")
        .env("SANDCOVE_STATE_DIR", &server.state.dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    // A clean stop removes the record: no server, exit 1 with a message.
    server.stop();
    let err = server.env().expect_err("no server runs any more");
    assert!(err.contains("no running `sandcove serve --e2b"), "{err}");
    // A record left by a killed server is stale: detected and removed.
    let servers = server.state.dir.join("servers");
    std::fs::create_dir_all(&servers).unwrap();
    std::fs::write(
        servers.join("999999999.json"),
        br#"{"pid":999999999,"native":"http://127.0.0.1:9","e2b":"http://127.0.0.1:9"}"#,
    )
    .unwrap();
    assert!(server.env().is_err());
    assert!(
        !servers.join("999999999.json").exists(),
        "the stale record is removed"
    );
}

#[test]
fn vendors_without_a_wire_protocol_are_refused_clearly() {
    let out = Command::new(bin())
        .args(["env", "nosuchvendor"])
        .env("SANDCOVE_API_KEY", "k")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown vendor 'nosuchvendor'"));
    // The Blaxel listener is plain HTTP: TLS settings are refused, not half applied.
    let out = Command::new(bin())
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--blaxel",
            "127.0.0.1:0",
            "--tls-cert",
            "/nonexistent/cert.pem",
            "--tls-key",
            "/nonexistent/key.pem",
        ])
        .env("SANDCOVE_API_KEY", "k")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--blaxel serves plain HTTP only"));
    // No running Blaxel listener: `env blaxel` says so.
    let empty = std::env::temp_dir().join(format!("sandcove-no-server-{}", std::process::id()));
    let out = Command::new(bin())
        .args(["env", "blaxel"])
        .env("SANDCOVE_API_KEY", "k")
        .env("SANDCOVE_STATE_DIR", &empty)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("sandcove serve --blaxel"));
}
