//! Run code written for Blaxel's sandbox SDK on Sandcove: swap one dependency,
//! `blaxel = { package = "compat-blaxel", … }`, and keep the Blaxel-shaped code.
//!
//! The surface mirrors the Python SDK (`blaxel.core.sandbox`, async flavour): Python names,
//! dict arguments as `serde_json::Value` or typed structs (unknown keys are errors), keyword
//! arguments as builder setters, awaited directly.
//!
//! | module | Blaxel | what |
//! |---|---|---|
//! | [`sandbox`] | `SandboxInstance` | create, get, list, delete, update, snapshots, fork |
//! | [`snapshots`] | `Snapshot`, `sandbox.snapshots` | workspace snapshots, restore, fork |
//! | [`process`] | `sandbox.process` | exec, get, list, logs, wait, stop, kill, stream_logs |
//! | [`fs`] | `sandbox.fs` | read, write, ls, find, grep, cp, rm, watch, … |
//! | [`previews`] | `sandbox.previews` | preview URLs and tokens |
//! | [`network`] | `sandbox.network`, `sandbox.fetch` | HTTP requests to ports in the sandbox |
//! | [`code_interpreter`] | `CodeInterpreter` | stateful Python `run_code` |
//! | [`models`] | `blaxel.core.client.models`, sandbox-API models | records and requests |
//! | [`errors`] | `SandboxAPIError`, `ResponseError` | the one error type |
//! | [`gaps`] | | what is refused, and what to do instead |
//! | [`translate`] | | pure translation functions |
//! | `wire` | | Blaxel's wire protocol as an HTTP router (feature `wire`) |
//!
//! Vendor credentials (`BL_API_KEY`, `BL_WORKSPACE`) are accepted and ignored: sandboxes live
//! on the runtime `sandcove::Client::from_env()` selects (the embedded engine unless
//! `SANDCOVE_URL` is set).
//!
//! ```no_run
//! use blaxel::SandboxInstance;
//! use serde_json::json;
//!
//! # async fn demo() -> Result<(), blaxel::SandboxAPIError> {
//! let sandbox = SandboxInstance::create_if_not_exists(json!({
//!     "name": "my-sandbox",
//!     "image": "blaxel/base-image:latest",
//!     "memory": 4096,
//!     "ttl": "1h",
//! }))
//! .await?;
//! let process = sandbox
//!     .process
//!     .exec(json!({"command": "echo 'Hello, World!'", "wait_for_completion": true}))
//!     .await?;
//! print!("{}", process.logs);
//! sandbox.fs.write("/blaxel/app/config.json", r#"{"key": "value"}"#).await?;
//! SandboxInstance::delete("my-sandbox").await?;
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]

pub mod code_interpreter;
pub mod errors;
pub mod fs;
pub mod gaps;
pub mod models;
pub mod network;
pub mod previews;
pub mod process;
pub mod sandbox;
pub mod snapshots;
pub mod standby;
mod state;
pub mod translate;
#[cfg(feature = "wire")]
pub mod wire;

pub use code_interpreter::CodeInterpreter;
pub use errors::{ResponseError, Result, SandboxAPIError};
pub use fs::{AsyncWatchHandle, SandboxFileSystem};
pub use gaps::hosting::{bl_agent, bl_model, bl_tools};
pub use models::*;
pub use network::{FetchResponse, SandboxNetwork};
pub use previews::{SandboxPreview, SandboxPreviewToken, SandboxPreviews};
pub use process::{AsyncStreamHandle, ProcessResponseWithLog, SandboxProcess};
pub use sandbox::{AsyncPaginatedList, SandboxHandle, SandboxInstance};
pub use snapshots::{SandboxSnapshots, Snapshot};

/// A string keyword Python also accepts as `None` (MIRRORING.md rule 3), shared by the facades.
pub use sandcove_compat_support::OptionalString;

/// A number of seconds as Python takes it (`int` or `float`), or `None`, shared by the
/// facades.
pub use sandcove_compat_support::Seconds;

#[cfg(test)]
mod tests {
    #[test]
    fn public_types_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<crate::SandboxInstance>();
        check::<crate::CodeInterpreter>();
        check::<crate::SandboxAPIError>();
        check::<crate::ProcessResponse>();
        check::<crate::AsyncStreamHandle>();
        check::<crate::AsyncWatchHandle>();
        fn check_send<T: Send>() {}
        check_send::<crate::process::ExecWithLogBuilder>();
        check_send::<crate::code_interpreter::RunCodeBuilder>();
    }
}
