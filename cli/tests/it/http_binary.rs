//! The `sandcove serve` binary: key required, serves the engine, stops cleanly on SIGTERM and
//! leaves live sandboxes running.

use std::ffi::OsStr;
use std::process::Command;
use std::sync::Arc;

use crate::common::{bin, ServeChild};
use sandcove::{Backend, HttpBackend, LocalBackend, ProcessSpec};
use sandcove_conformance::{test_options, unique};

/// The native listener's announcement.
const LISTENING: &str = "sandcove serve: listening on";

/// Whether the built binary can be run from here. A test binary copied elsewhere and run as
/// another user (as CI's rootless pass does) may not reach the build directory: those tests
/// then skip, saying so.
pub fn runnable() -> bool {
    match Command::new(bin()).arg("--version").output() {
        Ok(out) if out.status.success() => true,
        other => {
            eprintln!(
                "SKIPPED: cannot run {} from this process ({other:?})",
                bin().to_string_lossy()
            );
            false
        }
    }
}

#[test]
fn serve_refuses_to_start_without_a_key() {
    if !runnable() {
        return;
    }
    let out = Command::new(bin())
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env_remove("SANDCOVE_API_KEY")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let out = Command::new(bin())
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
    let ServeChild {
        mut child,
        mut stderr,
        url,
    } = ServeChild::start(
        &["--listen", "127.0.0.1:0"],
        &[("SANDCOVE_API_KEY", OsStr::new(&key))],
        &[],
        LISTENING,
    )
    .expect("the server announces its listener");
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
    let out = Command::new(bin())
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
    let out = Command::new(bin())
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
    let (mut child, url) = ServeChild::start(
        &["--listen", "127.0.0.1:0"],
        &[("SANDCOVE_API_KEY", OsStr::new(&key))],
        &[],
        LISTENING,
    )
    .expect("the server announces its listener")
    .drain_stderr();
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
    let file_arg = file.to_str().expect("a UTF-8 temp path");
    let (mut child, url) = ServeChild::start(
        &["--listen", "127.0.0.1:0", "--api-key-file", file_arg],
        &[],
        &["SANDCOVE_API_KEY"],
        LISTENING,
    )
    .expect("the server announces its listener")
    .drain_stderr();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let ok = runtime.block_on(HttpBackend::connect(&url, "from-a-file"));
    let wrong = runtime.block_on(HttpBackend::connect(&url, "not-the-key"));
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_file(&file);
    ok.expect("the key from the file is accepted");
    assert!(wrong.is_err());
}

#[test]
fn serve_kubernetes_needs_a_backend_key_an_image_and_its_api_server() {
    if !runnable() {
        return;
    }
    let serve = |envs: &[(&str, &str)], args: &[&str]| {
        let mut command = Command::new(bin());
        command
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--backend",
                "kubernetes",
            ])
            .args(args)
            .env("SANDCOVE_API_KEY", unique("key"))
            .env_remove("SANDCOVE_KUBE_KEY")
            .env_remove("SANDCOVE_KUBE_IMAGE");
        for (k, v) in envs {
            command.env(k, v);
        }
        let out = command.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = serve(&[], &["--kube-image", "sandcove:dev"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("SANDCOVE_KUBE_KEY"), "{err}");
    let (code, err) = serve(&[("SANDCOVE_KUBE_KEY", "short")], &["--kube-image", "x"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("at least 32 bytes"), "{err}");
    let key = "k".repeat(40);
    let (code, err) = serve(&[("SANDCOVE_KUBE_KEY", &key)], &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--kube-image"), "{err}");
    // Everything given, but no API server there: a clear failure, not a server without a
    // backend. (Port 1 on loopback: nothing listens there.)
    let (code, err) = serve(
        &[("SANDCOVE_KUBE_KEY", &key)],
        &[
            "--kube-image",
            "sandcove:dev",
            "--kube-api-url",
            "http://127.0.0.1:1",
        ],
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("Kubernetes API server"), "{err}");
}
