//! Sandcove's runtime client: run sandboxes on an embedded local engine or a remote server.
//!
//! | module | what |
//! |---|---|
//! | [`types`] | options and results: sandboxes, processes, files |
//! | [`error`] | [`Error`], the one error type, and its wire form |
//! | [`capability`] | [`Capabilities`] of a backend |
//! | [`backend`] | the [`Backend`] trait and the embedded [`LocalBackend`] |
//! | [`client`] | [`Client`] and the [`Sandbox`] handle: the ergonomic surface |
//! | [`operation`] | [`OperationId`]s of calls with a remote effect, and what [`Client::observe`] learns |
//! | [`reference`](mod@reference) | saved [`Reference`]s that a later program reopens, and tombstones |
//! | `server` (feature `server`) | `sandcove serve`: any backend over HTTP, for [`HttpBackend`] |
//!
//! Features (all on by default): `local` (the embedded engine), `http` (the client for a remote
//! server), `server` (the server; implies `http`). A program that only talks to a remote server
//! builds with `default-features = false, features = ["http"]` and compiles no engine.
//!
//! ```no_run
//! # async fn demo() -> sandcove::Result<()> {
//! use sandcove::{Client, Command, CreateOptions, ProcessSpec};
//!
//! let client = Client::from_env()?; // embedded engine unless SANDCOVE_URL is set
//! let sandbox = client.create(CreateOptions::default()).await?;
//! let out = sandbox.run(ProcessSpec::new(Command::sh("echo hello"))).await?;
//! assert_eq!(out.stdout, b"hello\n");
//! sandbox.write("notes.txt", b"kept").await?;
//! assert_eq!(sandbox.read("notes.txt").await?, b"kept");
//! sandbox.destroy().await?;
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]

pub mod backend;
pub mod client;
mod reopen;

// The shared model, under the paths it always had here.
pub use sandcove_core::{
    capability, error, layer, listen, operation, reference, secret, types, validate, wire,
};

/// `sandcove serve` (crate `sandcove-server`).
#[cfg(feature = "server")]
pub use sandcove_server as server;

/// Requests forwarded to a port inside a sandbox under bounds on the sandbox's answer: the
/// preview listeners' forwarding, which a `sandcove serve` handler forwarding to a sandbox port
/// (E2B's `get_host`) uses too (crate `sandcove-agent`).
#[cfg(any(feature = "local", feature = "server", feature = "kubernetes"))]
pub use sandcove_agent::forward;

#[cfg(feature = "http")]
pub use backend::http::{HttpBackend, HttpOptions};
#[cfg(feature = "kubernetes")]
pub use backend::kube::{KubeBackend, KubeConfig};
#[cfg(feature = "local")]
pub use backend::local::LocalBackend;
pub use client::{CheckedRun, Client, ProcessHandle, Renewal, RunError, Sandbox, MAX_READ_BYTES};
pub use sandcove_core::capability::{
    Capabilities, CheckStatus, Feature, Guarantees, LeaseBounds, HOST_BASE_TEMPLATES,
};
pub use sandcove_core::error::{Error, ErrorBody, ErrorCode, Result};
pub use sandcove_core::file_url;
pub use sandcove_core::operation::{OperationId, OperationStatus};
pub use sandcove_core::reference::{Reference, Reopened, ResourceKind, Tombstone};
pub use sandcove_core::types::*;
pub use sandcove_core::validate::{MAX_PROCESS_TIMEOUT, MAX_SANDBOX_TIMEOUT};
pub use sandcove_core::Layer;
pub use sandcove_core::{Backend, ByteStream, ProcessStream, WatchStream};
