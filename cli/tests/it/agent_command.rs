//! `sandcove agent`: the in-pod agent as the built binary runs it in a container (here a local
//! process on 127.0.0.1, with a scratch root).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;

use crate::common::bin;
use sandcove::backend::agent_client::{RemoteAgent, TcpDialer};
use sandcove::backend::agent_server::{token_sha256_hex, ROOT_ENV, TOKEN_SHA256_ENV};
use sandcove::{Error, ProcessSpec};
use sandcove_conformance::unique;

/// Whether the built binary can be run from here (a test binary copied elsewhere and run as
/// another user may not reach the build directory; the test then skips, saying so).
fn runnable() -> bool {
    let ok = Command::new(bin())
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        println!("SKIPPED: the sandcove binary cannot be run from here");
    }
    ok
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_command_serves_holders_of_the_token_only() {
    if !runnable() {
        return;
    }
    let root = std::env::temp_dir().join(unique("agent-cmd"));
    std::fs::create_dir_all(root.join("tmp")).unwrap();
    let token = sandcove::random_id(32);
    let mut child = Command::new(bin())
        .args(["agent", "--listen", "127.0.0.1:0"])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env(TOKEN_SHA256_ENV, token_sha256_hex(&token))
        .env(ROOT_ENV, &root)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start sandcove agent");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .parse()
        .unwrap();
    let result = async {
        let agent = RemoteAgent::new("cmd", Arc::new(TcpDialer::new(addr)), token);
        let stream = agent
            .spawn(ProcessSpec::new(sandcove::Command::sh("echo hi; pwd")))
            .await
            .expect("spawn");
        let out = sandcove::client::collect(stream, 1 << 20)
            .await
            .expect("output");
        let home = root.join("workspace");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!("hi\n{}\n", home.display())
        );
        let stranger = RemoteAgent::new("cmd", Arc::new(TcpDialer::new(addr)), "x".into());
        let err = stranger.ready().await.unwrap_err();
        assert!(matches!(err, Error::Unauthenticated { .. }), "{err:?}");
    };
    let outcome = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(result)).await;
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&root);
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

#[test]
fn the_agent_command_refuses_to_start_without_a_token_hash() {
    if !runnable() {
        return;
    }
    let out = Command::new(bin())
        .args(["agent", "--listen", "127.0.0.1:0"])
        .env_remove(TOKEN_SHA256_ENV)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(TOKEN_SHA256_ENV), "{stderr}");
}

/// An empty `__SANDCOVE_ROLE` is no role: the program runs as itself (a Kubernetes Pod sets it
/// empty after its image's `Env`, so an image cannot turn the agent into another role);
/// another value is a role, and an unknown one is refused before `main`.
#[test]
fn an_empty_role_is_the_program_itself() {
    let out = std::process::Command::new(crate::common::bin())
        .env("__SANDCOVE_ROLE", "")
        .arg("--version")
        .output()
        .expect("run sandcove");
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("sandcove "),
        "{out:?}"
    );
    let out = std::process::Command::new(crate::common::bin())
        .env("__SANDCOVE_ROLE", "no-such-role")
        .arg("--version")
        .output()
        .expect("run sandcove");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unknown role"),
        "{out:?}"
    );
}
