//! The `sandcove serve` binary: key required, serves the engine, stops cleanly on SIGTERM and
//! leaves live sandboxes running.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;

use sandcove::conformance::{test_options, unique};
use sandcove::{Backend, HttpBackend, LocalBackend, ProcessSpec};

const BIN: &str = env!("CARGO_BIN_EXE_sandcove");

/// Whether the built binary can be run from here. A test binary copied elsewhere and run as
/// another user (as CI's rootless pass does) may not reach the build directory: those tests
/// then skip, saying so.
fn runnable() -> bool {
    match Command::new(BIN).arg("--version").output() {
        Ok(out) if out.status.success() => true,
        other => {
            eprintln!("SKIPPED: cannot run {BIN} from this process ({other:?})");
            false
        }
    }
}

#[test]
fn serve_refuses_to_start_without_a_key() {
    if !runnable() {
        return;
    }
    let out = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env_remove("SANDCOVE_API_KEY")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let out = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("SANDCOVE_API_KEY", " ")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("API key"));
}

#[tokio::test]
async fn serve_runs_until_sigterm_and_sandboxes_outlive_it() {
    if !runnable() {
        return;
    }
    let key = unique("key");
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("SANDCOVE_API_KEY", &key)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no URL in {line:?}"))
        .to_string();
    let client = HttpBackend::connect(&url, &key).await.expect("connect");
    let sandbox = sandcove::Client::new(Arc::new(client));
    let sb = sandbox
        .create(test_options(&unique("bin")))
        .await
        .expect("create");
    let out = sb
        .run(ProcessSpec::new(sandcove::Command::sh("echo via-binary")))
        .await
        .unwrap();
    assert_eq!(out.stdout, b"via-binary\n");
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = child.wait().unwrap();
    assert!(exit.success(), "a clean exit on SIGTERM: {exit}");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut rest).unwrap();
    assert!(rest.contains("stopped"), "{rest}");
    let engine = LocalBackend::new().unwrap();
    let info = engine
        .get(sb.id())
        .await
        .expect("the sandbox outlives the server");
    assert_eq!(info.id, sb.id());
    engine.destroy(sb.id()).await.unwrap();
}
