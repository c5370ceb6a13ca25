//! The in-pod agent's contract: the variables that configure it, its configuration, and the
//! token digest it holds. The Kubernetes backend writes these into a Pod; the agent itself
//! (crate `sandcove-engine`, `agent_server`) reads them.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use sandcove_core::{Error, Result, SANDBOX_HOME};

/// Env var: the address to listen on (`0.0.0.0:7711` in a Pod).
pub const LISTEN_ENV: &str = "SANDCOVE_AGENT_LISTEN";
/// Env var: hex SHA-256 of the per-sandbox token.
pub const TOKEN_SHA256_ENV: &str = "SANDCOVE_AGENT_TOKEN_SHA256";
/// Env var: the user name reported for the agent's uid (default `user`, the engine's default
/// user name, whatever the uid).
pub const USER_ENV: &str = "SANDCOVE_AGENT_USER";
/// Env var: the sandbox home (default [`SANDBOX_HOME`]); created if missing.
pub const HOME_ENV: &str = "SANDCOVE_AGENT_HOME";
/// Env var: a directory standing in for the sandbox's `/` for file calls (default `/`, the
/// container's own root; a local test points it at a scratch directory).
pub const ROOT_ENV: &str = "SANDCOVE_AGENT_ROOT";
/// Env var: the sandbox id (named in errors and reported by the agent).
pub const SANDBOX_ENV: &str = "SANDCOVE_AGENT_SANDBOX";
/// Env var: sandbox-wide environment variables for every process, as a JSON object.
pub const ENVS_ENV: &str = "SANDCOVE_AGENT_ENVS";
/// Env var: how long, in milliseconds, a connection may take to send its hello.
pub const HELLO_TIMEOUT_ENV: &str = "SANDCOVE_AGENT_HELLO_TIMEOUT_MS";
/// Env var: the most connections served at once.
pub const MAX_CONNECTIONS_ENV: &str = "SANDCOVE_AGENT_MAX_CONNECTIONS";

/// Env var: `RLIMIT_NOFILE` of every process (the sandbox's `max_open_files`; default as on
/// the embedded engine).
pub const MAX_OPEN_FILES_ENV: &str = "SANDCOVE_AGENT_MAX_OPEN_FILES";

/// Every variable [`PodAgentConfig::from_env`] reads. A Pod sets each one explicitly (an
/// empty value is the default), since a container's `env` comes after its image's `Env`:
/// an image run as a sandbox can then configure none of them.
pub const CONFIG_ENVS: &[&str] = &[
    LISTEN_ENV,
    TOKEN_SHA256_ENV,
    USER_ENV,
    HOME_ENV,
    ROOT_ENV,
    SANDBOX_ENV,
    ENVS_ENV,
    HELLO_TIMEOUT_ENV,
    MAX_CONNECTIONS_ENV,
    MAX_OPEN_FILES_ENV,
];

/// The variable naming the role of a re-executed program (read before `main`); empty is the
/// same as unset, so a Pod sets it empty after its image's `Env`, which then names no role.
pub const ROLE_ENV: &str = "__SANDCOVE_ROLE";

/// The role value that makes a re-executed program a pod agent (in [`ROLE_ENV`]).
pub const ROLE_POD_AGENT: &str = "pod-agent";

/// Default time a connection has to send its hello.
pub const DEFAULT_HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Default bound on concurrent connections (each attached process or watch holds one).
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;

/// How an in-pod agent listens and whom it serves.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PodAgentConfig {
    /// Address to listen on (port 0 picks one; the bound address is printed).
    pub listen: SocketAddr,
    /// SHA-256 of the per-sandbox token.
    pub token_sha256: [u8; 32],
    /// Sandbox id.
    pub sandbox: String,
    /// User name reported for the agent's uid; `None`: `user`.
    pub user: Option<String>,
    /// The sandbox home (a sandbox path).
    pub home: String,
    /// Host directory standing in for the sandbox's `/`; `None` is the real `/`.
    pub root: Option<PathBuf>,
    /// Sandbox-wide environment variables for every process.
    pub envs: BTreeMap<String, String>,
    /// Time a connection has to send its hello.
    pub hello_timeout: Duration,
    /// Most connections served at once (an idle connection a client keeps for its next
    /// request counts until the agent retires it, after `proto::AGENT_IDLE`).
    pub max_connections: usize,
    /// `RLIMIT_NOFILE` of every process; `None`: the engine's default.
    pub max_open_files: Option<u64>,
}

impl PodAgentConfig {
    /// A configuration listening on `listen` for holders of the token hashing to
    /// `token_sha256`, with every other setting at its default.
    pub fn new(listen: SocketAddr, token_sha256: [u8; 32]) -> Self {
        PodAgentConfig {
            listen,
            token_sha256,
            sandbox: "pod".into(),
            user: None,
            home: SANDBOX_HOME.into(),
            root: None,
            envs: BTreeMap::new(),
            hello_timeout: DEFAULT_HELLO_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_open_files: None,
        }
    }

    /// Read the configuration from the `SANDCOVE_AGENT_*` variables; a missing address or
    /// token hash, or a malformed value, is an error (never a default that serves anyone).
    pub fn from_env() -> Result<Self> {
        Self::from_env_listening(None)
    }

    /// [`Self::from_env`], listening on `listen` where given (a command-line flag) instead
    /// of [`LISTEN_ENV`].
    pub fn from_env_listening(listen: Option<SocketAddr>) -> Result<Self> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let listen = match listen {
            Some(addr) => addr,
            None => {
                let text = var(LISTEN_ENV)
                    .ok_or_else(|| Error::invalid(format!("{LISTEN_ENV} is not set")))?;
                text.parse()
                    .map_err(|e| Error::invalid(format!("{LISTEN_ENV}={text:?}: {e}")))?
            }
        };
        let hash = var(TOKEN_SHA256_ENV).ok_or_else(|| {
            Error::invalid(format!(
                "{TOKEN_SHA256_ENV} is not set (the agent serves no one without a token)"
            ))
        })?;
        let mut config = PodAgentConfig::new(listen, parse_sha256(&hash)?);
        if let Some(user) = var(USER_ENV) {
            config.user = Some(user);
        }
        if let Some(home) = var(HOME_ENV) {
            if !home.starts_with('/') {
                return Err(Error::invalid(format!("{HOME_ENV} must be absolute")));
            }
            config.home = home;
        }
        config.root = var(ROOT_ENV).map(PathBuf::from);
        if let Some(id) = var(SANDBOX_ENV) {
            config.sandbox = id;
        }
        if let Some(envs) = var(ENVS_ENV) {
            config.envs = serde_json::from_str(&envs)
                .map_err(|e| Error::invalid(format!("{ENVS_ENV}: {e}")))?;
        }
        if let Some(ms) = var(HELLO_TIMEOUT_ENV) {
            let ms: u64 = ms
                .parse()
                .map_err(|e| Error::invalid(format!("{HELLO_TIMEOUT_ENV}: {e}")))?;
            config.hello_timeout = Duration::from_millis(ms.max(1));
        }
        if let Some(n) = var(MAX_CONNECTIONS_ENV) {
            let n: usize = n
                .parse()
                .map_err(|e| Error::invalid(format!("{MAX_CONNECTIONS_ENV}: {e}")))?;
            config.max_connections = n.max(1);
        }
        if let Some(n) = var(MAX_OPEN_FILES_ENV) {
            let n: u64 = n
                .parse()
                .map_err(|e| Error::invalid(format!("{MAX_OPEN_FILES_ENV}: {e}")))?;
            config.max_open_files = Some(n.max(1));
        }
        Ok(config)
    }
}

/// SHA-256 of a token, as the agent expects it in [`TOKEN_SHA256_ENV`] (lowercase hex).
pub fn token_sha256_hex(token: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

fn parse_sha256(hex: &str) -> Result<[u8; 32]> {
    let bad = || Error::invalid(format!("{TOKEN_SHA256_ENV} must be 64 hex digits"));
    let hex = hex.trim();
    if hex.len() != 64 || !hex.is_ascii() {
        return Err(bad());
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_hashes_round_trip_through_hex() {
        let hex = token_sha256_hex("abc");
        assert_eq!(
            hex,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let bytes = parse_sha256(&hex).unwrap();
        assert_eq!(bytes[0], 0xba);
        assert!(parse_sha256("xyz").is_err());
        assert!(parse_sha256(&"g".repeat(64)).is_err());
    }

    /// A variable added to this contract is listed in [`CONFIG_ENVS`], so a Pod sets it.
    #[test]
    fn every_agent_variable_is_listed() {
        let defined: Vec<&str> = include_str!("pod.rs")
            .lines()
            .filter(|line| line.starts_with("pub const "))
            .filter_map(|line| line.split_once("= \"SANDCOVE_AGENT_"))
            .filter_map(|(_, rest)| rest.split_once('"'))
            .map(|(name, _)| name)
            .collect();
        assert_eq!(defined.len(), CONFIG_ENVS.len(), "{defined:?}");
        for name in defined {
            assert!(
                CONFIG_ENVS.contains(&format!("SANDCOVE_AGENT_{name}").as_str()),
                "{name} is not in CONFIG_ENVS"
            );
        }
    }
}
