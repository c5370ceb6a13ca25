//! The `sandcove` command: `sandcove serve` exposes the embedded engine over HTTP (the native
//! API, plus one listener per vendor wire protocol asked for), `sandcove env VENDOR` prints
//! the variables that point that vendor's official SDKs at the running server, and the human
//! commands (`ls`, `exec`, `shell`, `cp`, `doctor`, …) work on sandboxes from a terminal,
//! through the embedded engine or the server `SANDCOVE_URL` names.
//!
//! Modules: `serve` (the server), `env` (`env`, `ca`), `sandboxes` (lifecycle), `procs`
//! (processes), `cp` (files), `store` (snapshots, volumes), `doctor`, `tls` (`tls init`: a
//! private CA and the server's certificate), `out` (what the human
//! commands share: errors, tables, JSON), `record` (the running server's listeners).
#![forbid(unsafe_code)]

mod bounds;
mod cp;
mod doctor;
mod env;
mod images;
mod localhost;
mod out;
mod procs;
mod record;
mod sandboxes;
mod serve;
mod store;
mod tls;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Sandcove: sandboxes you own, for code written for the E2B, Daytona and Blaxel SDKs.
#[derive(Debug, Parser)]
#[command(name = "sandcove", version)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
    /// Print JSON instead of tables and text (every command).
    #[arg(long, global = true)]
    json: bool,
    /// Log lines as text or as JSON objects (one per line, on stderr); RUST_LOG sets what is
    /// logged (default: warnings).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

#[derive(Debug, Subcommand)]
// One value, parsed once at start-up: boxing the big variant would buy nothing.
#[allow(clippy::large_enum_variant)]
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
    Serve(serve::ServeArgs),
    /// Print `export` lines that point a vendor's official SDKs at the running server.
    ///
    /// The server is found through the state directory, where `sandcove serve` records its
    /// listeners while it runs. Use as `eval "$(SANDCOVE_API_KEY=... sandcove env e2b)"`.
    ///
    /// For `e2b` it prints:
    ///   E2B_API_URL      the E2B listener's origin (control plane: create, list, kill, ...);
    ///   E2B_SANDBOX_URL  the same origin (envd: commands, files), which the SDK otherwise
    ///                    derives from E2B's public domain;
    ///   E2B_API_KEY      the value of SANDCOVE_API_KEY (the server's key).
    ///
    /// For `daytona` it prints:
    ///   DAYTONA_API_URL  the Daytona listener's origin followed by /api (the SDK finds the
    ///                    toolbox through the URL every sandbox answer carries);
    ///   DAYTONA_API_KEY  the value of SANDCOVE_API_KEY (the server's key).
    ///
    /// For `blaxel` it prints:
    ///   BL_WORKSPACE     the server's workspace name (`sandcove`);
    ///   BL_API_KEY       the value of SANDCOVE_API_KEY (the server's key);
    ///   BL_API_URL       the Blaxel listener's origin followed by /v0 (control plane);
    ///   BL_RUN_URL       the Blaxel listener's origin;
    ///   BL_DISABLE_H2=1  so the TypeScript SDK never opens HTTP/2 to Blaxel's own edge
    ///                    (it would send sandbox calls there).
    ///
    /// and, for the Python SDK (whose URL is fixed to https://api.blaxel.ai):
    ///   HTTPS_PROXY      the Blaxel listener, which intercepts only Blaxel's own host names
    ///                    (other hosts are refused: list them in NO_PROXY);
    ///   SSL_CERT_DIR     <state dir>/blaxel-ca/certs (the Sandcove CA, see `sandcove ca`),
    ///                    then the host's hashed roots (/etc/ssl/certs), with SSL_CERT_FILE
    ///                    unset; where the host has no hashed roots, SSL_CERT_FILE instead:
    ///                    the bundle in <state dir>/blaxel-ca (the host's roots plus the CA).
    ///
    /// Exits 1 with a message when no server with that vendor's listener is running or
    /// SANDCOVE_API_KEY is unset.
    #[command(verbatim_doc_comment)]
    Env {
        /// The vendor: e2b, daytona or blaxel.
        vendor: String,
        /// The engine's state directory the server uses (default: $SANDCOVE_STATE_DIR, else
        /// $XDG_STATE_HOME/sandcove).
        #[arg(long)]
        state_dir: Option<PathBuf>,
    },
    /// Show where the local CA of `sandcove serve --blaxel` lives, what it can sign, and how
    /// to remove it.
    ///
    /// The CA exists only in <state dir>/blaxel-ca (its key, its certificate, the bundle and
    /// the hashed directory `sandcove env blaxel` names); nothing is installed into the system
    /// trust store. Stop the server and delete that directory to remove it; the next
    /// `sandcove serve --blaxel` creates a new one.
    Ca {
        /// The engine's state directory the server uses (default: $SANDCOVE_STATE_DIR, else
        /// $XDG_STATE_HOME/sandcove).
        #[arg(long)]
        state_dir: Option<PathBuf>,
    },
    /// Certificates for `sandcove serve --tls-cert/--tls-key`.
    #[command(subcommand)]
    Tls(tls::TlsCmd),
    /// List sandboxes: id, name, vendor, state, age, lease left, labels.
    Ls(sandboxes::LsArgs),
    /// Describe one sandbox.
    Info {
        /// The sandbox.
        id: String,
    },
    /// Create a sandbox; prints its id.
    Create(sandboxes::CreateArgs),
    /// Destroy sandboxes (by id, or --all [--label KEY=VALUE]).
    Kill(sandboxes::KillArgs),
    /// Freeze a sandbox: its processes stop, its memory is kept.
    Pause {
        /// The sandbox.
        id: String,
    },
    /// Thaw a paused sandbox.
    Resume {
        /// The sandbox.
        id: String,
    },
    /// Set a sandbox's lease, counted from now (`90`, `30s`, `10m`, `1h`).
    SetTimeout {
        /// The sandbox.
        id: String,
        /// The new lease.
        #[arg(value_parser = out::parse_duration)]
        timeout: std::time::Duration,
    },
    /// Run a command in a sandbox: `sandcove exec ID -- CMD ARGS…`. Stdin is forwarded,
    /// output passed through, and the command's exit status is this command's (128 + N for a
    /// process killed by signal N).
    Exec(procs::ExecArgs),
    /// An interactive shell in a sandbox (bash if it has one, else sh), on a terminal;
    /// exits with the shell's status.
    Shell {
        /// The sandbox.
        id: String,
    },
    /// Print the output of a process (by pid or tag) retained so far; -f follows it.
    Logs(procs::LogsArgs),
    /// List the processes started in a sandbox through the API.
    Ps {
        /// The sandbox.
        id: String,
    },
    /// Copy files or directories between this host and a sandbox (ID:/path), either way.
    Cp(cp::CpArgs),
    /// Snapshots of sandboxes' files.
    #[command(subcommand)]
    Snapshot(store::SnapshotCmd),
    /// Named volumes.
    #[command(subcommand)]
    Volume(store::VolumeCmd),
    /// OCI images sandboxes run (`sandcove create --image REF`): pull, import, ls, inspect,
    /// rm, prune.
    #[command(subcommand)]
    Image(images::ImageCmd),
    /// Check what this host supports, with a remedy for each missing piece; exits 1 when
    /// sandboxes cannot be created.
    Doctor,
    /// Run the in-pod agent (a Kubernetes sandbox's entrypoint): serve the agent protocol on
    /// TCP to holders of the sandbox's token. Configured by SANDCOVE_AGENT_TOKEN_SHA256 (hex
    /// SHA-256 of the token; required) and the other SANDCOVE_AGENT_* variables; prints
    /// `listening on ADDR` once bound.
    Agent {
        /// Address to listen on (default: SANDCOVE_AGENT_LISTEN).
        #[arg(long)]
        listen: Option<std::net::SocketAddr>,
    },
    /// Print a shell completion script: `sandcove completions bash > …`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The library reports warnings (no isolation, no internet for sandboxes) as `tracing`
    // events; the command shows them on stderr (`RUST_LOG` adjusts the level).
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let logs = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter);
    match cli.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .init(),
    }
    let json = cli.json;
    match cli.command {
        Cmd::Env { vendor, state_dir } => env::env_command(&vendor, state_dir),
        Cmd::Ca { state_dir } => env::ca_command(state_dir),
        Cmd::Serve(args) => serve::run(args),
        Cmd::Tls(cmd) => tls::tls(cmd, json),
        Cmd::Ls(args) => out::finish("ls", sandboxes::ls(args, json)),
        Cmd::Info { id } => out::finish("info", sandboxes::info(&id, json)),
        Cmd::Create(args) => out::finish("create", sandboxes::create(args, json)),
        Cmd::Image(cmd) => out::finish("image", images::image(cmd, json)),
        Cmd::Kill(args) => out::finish("kill", sandboxes::kill(args, json)),
        Cmd::Pause { id } => out::finish(
            "pause",
            sandboxes::change(&id, sandboxes::Change::Pause, json),
        ),
        Cmd::Resume { id } => out::finish(
            "resume",
            sandboxes::change(&id, sandboxes::Change::Resume, json),
        ),
        Cmd::SetTimeout { id, timeout } => out::finish(
            "set-timeout",
            sandboxes::change(&id, sandboxes::Change::Timeout(timeout), json),
        ),
        Cmd::Exec(args) => out::finish("exec", procs::exec(args, json)),
        Cmd::Shell { id } => out::finish("shell", procs::shell(&id)),
        Cmd::Logs(args) => out::finish("logs", procs::logs(args, json)),
        Cmd::Ps { id } => out::finish("ps", procs::ps(&id, json)),
        Cmd::Cp(args) => out::finish("cp", cp::cp(args, json)),
        Cmd::Snapshot(cmd) => out::finish("snapshot", store::snapshot(cmd, json)),
        Cmd::Volume(cmd) => out::finish("volume", store::volume(cmd, json)),
        Cmd::Doctor => out::finish("doctor", doctor::doctor(json)),
        Cmd::Agent { listen } => {
            use sandcove::backend::agent_server::{run_pod_agent, PodAgentConfig};
            match PodAgentConfig::from_env_listening(listen) {
                Ok(config) => run_pod_agent(config),
                Err(e) => {
                    eprintln!("sandcove agent: {e}");
                    ExitCode::from(2)
                }
            }
        }
        Cmd::Completions { shell } => {
            let mut command = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut command, "sandcove", &mut std::io::stdout());
            ExitCode::SUCCESS
        }
    }
}
