//! The `sandcove` command: `sandcove serve` exposes the embedded engine over HTTP.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
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
    /// Stopping the server (Ctrl-C, SIGTERM) leaves live sandboxes running: they end at
    /// their lease or when destroyed, and a restarted server finds them again.
    Serve {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8730")]
        listen: SocketAddr,
        /// The API key clients must send as `Authorization: Bearer <key>`.
        #[arg(long, env = "SANDCOVE_API_KEY", hide_env_values = true)]
        api_key: String,
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
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Cmd::Serve {
            listen,
            api_key,
            state_dir,
            max_body_bytes,
            max_upload_bytes,
        } => {
            if api_key.trim().is_empty() {
                eprintln!(
                    "sandcove serve: the API key is empty; set --api-key or SANDCOVE_API_KEY"
                );
                return ExitCode::from(2);
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
            let mut config = ServerConfig::new(api_key);
            config.max_body_bytes = max_body_bytes;
            config.max_upload_bytes = max_upload_bytes;
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
                    "sandcove serve: listening on http://{} (Ctrl-C to stop; sandboxes outlive the server)",
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
