//! The `sandcove` command: `sandcove serve` exposes the embedded engine over HTTP.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use sandcove::client::API_KEY_ENV;
use sandcove::server::{self, ServerConfig};
use sandcove::{Backend, LocalBackend};

/// Sandcove: sandboxes you own, for code written for the E2B, Daytona and Blaxel SDKs.
#[derive(Debug, Parser)]
#[command(name = "sandcove", version)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Serve the embedded engine over HTTP. Clients use SANDCOVE_URL and SANDCOVE_API_KEY.
    ///
    /// The API key comes from the SANDCOVE_API_KEY environment variable or from
    /// --api-key-file, never from the command line (which every local user can read). The
    /// server removes SANDCOVE_API_KEY from its own environment once read, so nothing it
    /// starts inherits it.
    ///
    /// Stopping the server (Ctrl-C, SIGTERM) leaves live sandboxes running: they end at
    /// their lease or when destroyed, and a restarted server finds them again.
    Serve {
        /// Address to listen on. Beyond loopback, serve TLS (--tls-cert, --tls-key).
        #[arg(long, default_value = "127.0.0.1:8730")]
        listen: SocketAddr,
        /// A file holding the API key (first line; the file must not be readable by group
        /// or others). Alternative to SANDCOVE_API_KEY.
        #[arg(long, value_name = "PATH")]
        api_key_file: Option<PathBuf>,
        /// Refused: a key on the command line is visible to every local user.
        #[arg(long, hide = true, value_name = "KEY")]
        api_key: Option<String>,
        /// PEM certificate chain (leaf first): serve HTTPS. Needs --tls-key.
        #[arg(long, value_name = "FILE", requires = "tls_key")]
        tls_cert: Option<PathBuf>,
        /// PEM private key of --tls-cert (mode 0600 or stricter).
        #[arg(long, value_name = "FILE", requires = "tls_cert")]
        tls_key: Option<PathBuf>,
        /// The engine's state directory (default: $SANDCOVE_STATE_DIR, else
        /// $XDG_STATE_HOME/sandcove).
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// Largest JSON or stdin request body, in bytes.
        #[arg(long, default_value_t = 1024 * 1024)]
        max_body_bytes: usize,
        /// Largest file upload, in bytes.
        #[arg(long, default_value_t = 4 * 1024 * 1024 * 1024)]
        max_upload_bytes: u64,
        /// Connections served at once; more wait until one closes.
        #[arg(long, default_value_t = 512)]
        max_connections: usize,
        /// Milliseconds a client gets for its TLS handshake and each request head.
        #[arg(long, default_value_t = 10_000)]
        head_timeout_ms: u64,
    },
}

/// The API key from `--api-key-file` or the environment, which is then scrubbed.
fn api_key(file: Option<PathBuf>, on_command_line: bool) -> Result<String, String> {
    // Read (and remove) the variable first, so it never outlives this point whatever else
    // fails. The process is still single-threaded here.
    let from_env = std::env::var(API_KEY_ENV).ok();
    std::env::remove_var(API_KEY_ENV);
    if on_command_line {
        return Err(format!(
            "--api-key is not accepted: the command line is visible to every local user. \
             Set {API_KEY_ENV} or use --api-key-file PATH"
        ));
    }
    let key = match (file, from_env) {
        (Some(_), Some(_)) => {
            return Err(format!(
                "both {API_KEY_ENV} and --api-key-file are set: choose one"
            ))
        }
        (Some(path), None) => {
            let bytes = server::read_secret_file(&path, true).map_err(|e| e.to_string())?;
            let text = String::from_utf8(bytes)
                .map_err(|_| format!("{}: the key is not UTF-8", path.display()))?;
            text.lines().next().unwrap_or_default().trim().to_string()
        }
        (None, Some(key)) => key.trim().to_string(),
        (None, None) => String::new(),
    };
    if key.is_empty() {
        return Err(format!(
            "the API key is empty; set {API_KEY_ENV} or use --api-key-file PATH"
        ));
    }
    Ok(key)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Cmd::Serve {
            listen,
            api_key_file,
            api_key: on_command_line,
            tls_cert,
            tls_key,
            state_dir,
            max_body_bytes,
            max_upload_bytes,
            max_connections,
            head_timeout_ms,
        } => {
            let api_key = match api_key(api_key_file, on_command_line.is_some()) {
                Ok(key) => key,
                Err(message) => {
                    eprintln!("sandcove serve: {message}");
                    return ExitCode::from(2);
                }
            };
            let tls = match (tls_cert, tls_key) {
                (Some(cert), Some(key)) => match server::load_tls(&cert, &key) {
                    Ok(tls) => Some(tls),
                    Err(e) => {
                        eprintln!("sandcove serve: {e}");
                        return ExitCode::from(2);
                    }
                },
                _ => None,
            };
            if tls.is_none() && !listen.ip().is_loopback() {
                eprintln!(
                    "sandcove serve: WARNING: plain HTTP on {listen}: the API key crosses the \
                     network in clear text; serve TLS with --tls-cert and --tls-key"
                );
            }
            let engine = match state_dir {
                Some(dir) => LocalBackend::with_state_dir(dir),
                None => LocalBackend::new(),
            };
            let backend: Arc<dyn Backend> = match engine {
                Ok(engine) => Arc::new(engine),
                Err(e) => {
                    eprintln!("sandcove serve: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let scheme = if tls.is_some() { "https" } else { "http" };
            let mut config = ServerConfig::new(api_key);
            config.max_body_bytes = max_body_bytes;
            config.max_upload_bytes = max_upload_bytes;
            config.max_connections = max_connections;
            config.head_timeout = Duration::from_millis(head_timeout_ms);
            config.tls = tls;
            let runtime = match tokio::runtime::Runtime::new() {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("sandcove serve: cannot start the async runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let result = runtime.block_on(async move {
                let listener = tokio::net::TcpListener::bind(listen).await?;
                eprintln!(
                    "sandcove serve: listening on {scheme}://{} (Ctrl-C to stop; sandboxes outlive the server)",
                    listener.local_addr()?
                );
                server::serve(listener, backend, config, server::shutdown_signal()).await
            });
            match result {
                Ok(()) => {
                    eprintln!("sandcove serve: stopped; live sandboxes keep running until their lease ends or they are destroyed");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("sandcove serve: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
