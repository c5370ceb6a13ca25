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

/// Finding: `--api-key KEY` put the key in every local user's `ps`. The flag is refused with
/// the remedy; a key file readable by others is refused too.
#[test]
fn serve_refuses_a_key_on_the_command_line_or_in_an_open_file() {
    if !runnable() {
        return;
    }
    let out = Command::new(BIN)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--api-key",
            "visible-to-ps",
        ])
        .env_remove("SANDCOVE_API_KEY")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--api-key is not accepted"), "{stderr}");
    assert!(
        stderr.contains("SANDCOVE_API_KEY") && stderr.contains("--api-key-file"),
        "{stderr}"
    );

    use std::os::unix::fs::PermissionsExt;
    let file = std::env::temp_dir().join(unique("keyfile"));
    std::fs::write(&file, "from-a-file\n").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--api-key-file"])
        .arg(&file)
        .env_remove("SANDCOVE_API_KEY")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("chmod 600"));
    let _ = std::fs::remove_file(&file);
}

/// Pids of processes whose environment holds `needle` (exact bytes of a unique key).
fn environments_holding(needle: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) {
            if env
                .split(|&b| b == 0)
                .any(|var| var.ends_with(needle.as_bytes()))
            {
                pids.push(pid);
            }
        }
    }
    pids
}

/// The key file works, and the key read from SANDCOVE_API_KEY is removed from the server's
/// environment before anything is started: no monitor or sandbox process inherits it.
#[tokio::test]
async fn serve_keeps_its_key_from_the_sandboxes_it_starts() {
    if !runnable() {
        return;
    }
    let key = unique("envkey");
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
    let client = sandcove::Client::new(Arc::new(HttpBackend::connect(&url, &key).await.unwrap()));
    let sb = client
        .create(test_options(&unique("envkey")))
        .await
        .expect("create");
    let out = sb
        .run(ProcessSpec::new(sandcove::Command::sh("sleep 0; echo up")))
        .await
        .unwrap();
    assert_eq!(out.stdout, b"up\n");
    // The server's own /proc/<pid>/environ still shows the block it was started with; every
    // other process (the sandbox's monitor, its agent, sandboxed commands) must be clean.
    let holders: Vec<u32> = environments_holding(&key)
        .into_iter()
        .filter(|&pid| pid != child.id())
        .collect();
    sb.destroy().await.unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(holders.is_empty(), "processes holding the key: {holders:?}");
}

#[test]
fn serve_takes_its_key_from_a_private_file() {
    if !runnable() {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let file = std::env::temp_dir().join(unique("keyfile"));
    std::fs::write(&file, "from-a-file\n").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--api-key-file"])
        .arg(&file)
        .env_remove("SANDCOVE_API_KEY")
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
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let ok = runtime.block_on(HttpBackend::connect(&url, "from-a-file"));
    let wrong = runtime.block_on(HttpBackend::connect(&url, "not-the-key"));
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_file(&file);
    ok.expect("the key from the file is accepted");
    assert!(wrong.is_err());
}
