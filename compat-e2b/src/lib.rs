//! Run code written for the E2B SDK on Sandcove: swap the dependency
//! (`e2b = { package = "compat-e2b", … }`) and keep the code.
//!
//! The Python SDK's names, in Rust (see the workspace's MIRRORING rules): keyword arguments are
//! setters on builders awaited directly, attributes are public fields, class and instance
//! methods share names, exceptions are the variants of [`SandboxException`].
//!
//! | module | what |
//! |---|---|
//! | [`sandbox`] | [`Sandbox`]: create, connect, kill, timeouts, info, list, pause, hosts, snapshots, fork |
//! | [`commands`] | `sandbox.commands`: run (foreground / background), connect, list, kill, stdin |
//! | [`files`] | `sandbox.files`: read, write, list, info, remove, rename, make_dir, watch_dir |
//! | [`pty`] | `sandbox.pty`: terminals |
//! | [`products`] | `Volume`, `Template`, `Secret`, `sandbox.git`: refused |
//! | [`code_interpreter`] | `e2b_code_interpreter`: stateful `run_code` and code contexts |
//! | [`errors`] | [`SandboxException`] and [`CommandExitException`] |
//! | [`transfer`] | `upload_url` / `download_url`: the runtime's signed file URLs |
//! | [`translate`] | pure translation of paths, envs, exit statuses and Python-style printing |
//! | [`gaps`] | the E2B features Sandcove refuses, with what to do instead |
//! | `wire` | (feature `wire`) E2B's wire protocol for the official SDKs, as an axum router |
//!
//! Sandboxes run on the runtime `sandcove::Client::from_env()` selects (the embedded local
//! engine unless `SANDCOVE_URL` is set). `E2B_API_KEY` and `api_key=` are accepted and ignored:
//! vendor credentials are never sent anywhere.
//!
//! ```no_run
//! use e2b::Sandbox;
//!
//! # async fn demo() -> Result<(), e2b::SandboxException> {
//! let sandbox = Sandbox::create().await?;
//! let result = sandbox.commands.run("echo \"Hello from E2B!\"").await?;
//! print!("{}", result.stdout); // Hello from E2B!
//! sandbox.files.write("notes.txt", "kept").await?; // /home/user/notes.txt
//! assert_eq!(sandbox.files.read("notes.txt").await?, "kept");
//! sandbox.kill().await?;
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]

pub mod call;
pub mod code_interpreter;
pub mod commands;
pub mod errors;
pub mod files;
pub mod gaps;
pub mod products;
pub mod pty;
pub mod sandbox;
pub mod templates;
pub mod transfer;
pub mod translate;
#[cfg(feature = "wire")]
pub mod wire;

pub use call::{Call, IntoSeconds, OptionalString};
pub use commands::{CommandHandle, CommandResult, Commands, ProcessInfo};
pub use errors::{CommandExitException, SandboxException};
pub use files::{
    read_format, AsyncWatchHandle, EntryInfo, FileStreamReader, FileType, Filesystem,
    FilesystemEvent, FilesystemEventType, WatchHandle, WriteData, WriteEntry, WriteInfo,
};
pub use products::{Git, Secret, Template, Volume};
pub use pty::{Pty, PtySize};
pub use sandbox::{
    runtime_capabilities, ConnectionConfig, Sandbox, SandboxInfo, SandboxInfoLifecycle,
    SandboxInstance, SandboxLifecycle, SandboxMetrics, SandboxNetworkOpts, SandboxPaginator,
    SandboxQuery, SandboxState, SnapshotInfo, SnapshotPaginator, ALL_TRAFFIC,
};
pub use translate::DateTime;

/// `Stdout`: a decoded stdout chunk.
pub type Stdout = String;
/// `Stderr`: a decoded stderr chunk.
pub type Stderr = String;
/// `PtyOutput`: raw terminal bytes.
pub type PtyOutput = Vec<u8>;
/// `Username`.
pub type Username = String;
