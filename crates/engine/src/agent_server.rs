//! The in-pod agent: the sandbox agent serving its protocol over TCP, as the entrypoint of a
//! container (the Kubernetes backend's sandboxes).
//!
//! It is the embedded engine's agent with no namespaces of its own (the container runtime
//! isolates): every request is served by the same code, beneath the configured root, as the
//! agent's own uid. A connection starts with a hello carrying the per-sandbox token; the agent
//! holds only the token's SHA-256 and compares in constant time before reading anything else.
//! The hello is bounded in size and time, and so is the number of connections.
//!
//! Started by `sandcove agent --listen ADDR`, or by re-executing any program linking this
//! crate with `__SANDCOVE_ROLE=pod-agent` and the `SANDCOVE_AGENT_*` variables below
//! ([`PodAgentConfig::from_env`]); it prints `listening on ADDR` once bound.

pub use sandcove_agent::pod::*;

use std::net::SocketAddr;

use sandcove_core::{Error, Result};

/// A command starting an in-pod agent from the running program (any program linking this
/// crate, a test binary included) with `config` in its environment and nothing else; its
/// stdout is piped (the `listening on ADDR` line), its stderr inherited.
pub fn pod_agent_command(config: &PodAgentConfig) -> Result<std::process::Command> {
    crate::ensure_role_hook();
    let exe = std::env::current_exe().map_err(|e| Error::from_io(&e, "the running program"))?;
    let hash: String = config
        .token_sha256
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let envs =
        serde_json::to_string(&config.envs).map_err(|e| Error::invalid(format!("envs: {e}")))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.env_clear()
        .env("__SANDCOVE_ROLE", ROLE_POD_AGENT)
        .env(LISTEN_ENV, config.listen.to_string())
        .env(TOKEN_SHA256_ENV, hash)
        .env(HOME_ENV, &config.home)
        .env(SANDBOX_ENV, &config.sandbox)
        .env(ENVS_ENV, envs)
        .env(
            HELLO_TIMEOUT_ENV,
            config.hello_timeout.as_millis().to_string(),
        )
        .env(MAX_CONNECTIONS_ENV, config.max_connections.to_string())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit());
    if let Some(user) = &config.user {
        cmd.env(USER_ENV, user);
    }
    if let Some(root) = &config.root {
        cmd.env(ROOT_ENV, root);
    }
    if let Some(n) = config.max_open_files {
        cmd.env(MAX_OPEN_FILES_ENV, n.to_string());
    }
    Ok(cmd)
}

/// Start an in-pod agent as a local process ([`pod_agent_command`]) and wait (blocking) for
/// the address it listens on. A fake scheduler's "Pod start"; the caller owns the child.
pub fn spawn_local_pod_agent(config: &PodAgentConfig) -> Result<(std::process::Child, SocketAddr)> {
    use std::io::{BufRead as _, Read as _};
    let mut child = pod_agent_command(config)?
        .spawn()
        .map_err(|e| Error::from_io(&e, "start the pod agent"))?;
    let line = match child.stdout.take() {
        Some(out) => {
            let mut line = String::new();
            // One short line; the bound keeps a confused child from filling memory.
            let read = std::io::BufReader::new(out.take(256)).read_line(&mut line);
            read.map(|_| line)
        }
        None => Ok(String::new()),
    };
    let addr = line.ok().and_then(|line| {
        line.trim()
            .strip_prefix("listening on ")
            .and_then(|a| a.parse::<SocketAddr>().ok())
    });
    match addr {
        Some(addr) => Ok((child, addr)),
        None => {
            let _ = child.kill();
            let status = child.wait().ok();
            Err(Error::Unavailable {
                reason: format!("the pod agent did not start (exit: {status:?})"),
                remedy: "see its stderr".into(),
            })
        }
    }
}

/// Run the in-pod agent until it is killed: bind, print `listening on ADDR`, serve. Never
/// returns; a setup failure is printed to stderr and exits with status 1.
pub fn run_pod_agent(config: PodAgentConfig) -> ! {
    crate::agent::pod::run(config)
}
