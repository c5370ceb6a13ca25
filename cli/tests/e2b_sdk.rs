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

mod common;
mod sdk_harness;

use std::ffi::OsStr;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use common::{bin, ServeChild};
use sandcove_tests::PrivateState;
use sdk_harness::{js_fixtures, node_project, py_fixtures as fixtures, venv};

/// The plain SDK (`e2b`).
const E2B_PINS: &str = "pins-e2b-2.63.0.txt";
/// The code interpreter SDK (`e2b-code-interpreter`, on top of `e2b`).
const CI_PINS: &str = "pins-e2b-code-interpreter-2.11.5.txt";
/// The last SDK that creates with `POST /sandboxes` (newer ones use `/v2/sandboxes`).
const E2B_LEGACY_PINS: &str = "pins-e2b-2.50.0.txt";

/// Run `fixtures/js/<name>.mjs` with the pinned SDK against a fresh server.
fn check_js_program(name: &str) {
    let project = node_project("");
    // ES modules resolve packages from their own directory upwards: run a copy placed in
    // the provisioned project.
    let program = project.join(format!("{name}.mjs"));
    std::fs::copy(js_fixtures("").join(format!("{name}.mjs")), &program).expect("copy the program");
    let server = Server::start();
    let vars = server.env().expect("sandcove env e2b");
    let mut cmd = Command::new("node");
    cmd.arg(&program)
        .current_dir(&project)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", std::env::var_os("HOME").unwrap_or_default())
        .env("SDK_TEST_TAG", format!("js-{name}-{}", std::process::id()));
    for (k, v) in &vars {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run node");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{name}.mjs failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let expected = std::fs::read_to_string(js_fixtures("").join(format!("{name}.expected")))
        .expect("the expected output");
    assert_eq!(stdout, expected, "{name}.mjs printed something else");
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
#[test]
fn js_sdk_file_urls_and_gzip() {
    check_js_program("e2b_urls");
}

#[test]
fn js_code_interpreter_contexts_errors_envs_timeout() {
    check_js_program("e2b_ci_contexts");
}

/// A `sandcove serve --e2b` child process with a private state directory.
struct Server {
    child: Child,
    e2b: String,
    key: String,
    state: PrivateState,
}

impl Server {
    fn start() -> Server {
        let state = PrivateState::new();
        let key = format!("sdk-test-{}", std::process::id());
        let (child, e2b) = ServeChild::start(
            &["--listen", "127.0.0.1:0", "--e2b", "127.0.0.1:0"],
            &[
                ("SANDCOVE_API_KEY", OsStr::new(&key)),
                ("SANDCOVE_STATE_DIR", state.dir.as_os_str()),
            ],
            &[],
            "sandcove serve: E2B wire protocol on",
        )
        .expect("the server announces its E2B listener")
        .drain_stderr();
        Server {
            child,
            e2b,
            key,
            state,
        }
    }

    /// `sandcove env e2b` for this server: the variables, parsed from its `export` lines.
    fn env(&self) -> Result<Vec<(String, String)>, String> {
        let out = Command::new(bin())
            .args(["env", "e2b"])
            .env("SANDCOVE_API_KEY", &self.key)
            .env("SANDCOVE_STATE_DIR", &self.state.dir)
            .output()
            .expect("sandcove env");
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.strip_prefix("export "))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.trim_matches('\'').to_string()))
            .collect())
    }

    /// Stop with SIGTERM, as Ctrl-C would, and wait for the exit.
    fn stop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(30) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Run `fixtures/python/<name>.py` with the SDK of `pins` against a fresh server; compare
/// its stdout with `<name>.expected`.
fn check_program(pins: &str, name: &str) {
    let venv = venv(pins);
    let server = Server::start();
    let vars = server.env().expect("sandcove env e2b");
    let mut cmd = Command::new(venv.join("bin/python"));
    cmd.arg(fixtures().join(format!("{name}.py")))
        .current_dir(fixtures())
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", std::env::var_os("HOME").unwrap_or_default())
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("SDK_TEST_TAG", format!("{name}-{}", std::process::id()));
    for (k, v) in &vars {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run the program");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{name}.py failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let expected = std::fs::read_to_string(fixtures().join(format!("{name}.expected")))
        .expect("the expected output");
    assert_eq!(stdout, expected, "{name}.py printed something else");
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

/// `download_url`/`upload_url` fetched with plain httpx, gzip transfers, `stream_input`.
#[test]
fn python_sdk_file_urls_gzip_and_stream_input() {
    check_program(E2B_PINS, "e2b_urls");
}

#[test]
fn python_sdk_sandboxes() {
    check_program(E2B_PINS, "e2b_sandboxes");
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
    let mut server = Server::start();
    let vars = server.env().expect("sandcove env e2b");
    assert_eq!(
        vars,
        vec![
            ("E2B_API_URL".to_string(), server.e2b.clone()),
            ("E2B_SANDBOX_URL".to_string(), server.e2b.clone()),
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
