//! Run code written for the Daytona SDK on Sandcove: swap one dependency,
//! `daytona = { package = "compat-daytona", … }`, and keep the Python SDK's names.
//!
//! | module | mirrors |
//! |---|---|
//! | [`client`] | `Daytona`, `DaytonaConfig`, create params, `ListSandboxesQuery` |
//! | [`sandbox`] | `Sandbox`: fields, lifecycle, labels, intervals, previews |
//! | [`process`] | `sandbox.process`: `exec`, `code_run`, sessions |
//! | [`fs`] | `sandbox.fs`: files and folders, find/search/replace |
//! | [`git`] | `sandbox.git`, through the `git` binary in the sandbox |
//! | [`volume`], [`snapshot`] | `daytona.volume`, `daytona.snapshot`, `Image` |
//! | [`errors`] | `DaytonaError` and its subclasses |
//! | [`gaps`] | features this runtime cannot honour, with alternatives |
//! | [`translate`] | pure translation functions |
//! | `wire` (feature `wire`) | Daytona's REST wire protocol for the official SDKs |
//!
//! Every call is `async` (the Python `AsyncDaytona` surface). Keyword arguments with a default
//! are setters on a builder that is awaited directly. `DAYTONA_API_KEY` and `api_key` are
//! accepted and never sent anywhere: the runtime settings (`SANDCOVE_URL`, or the embedded
//! engine when unset) decide where sandboxes live.
//!
//! ```no_run
//! use daytona::{Daytona, DaytonaConfig};
//!
//! # async fn demo() -> Result<(), daytona::DaytonaError> {
//! let daytona = Daytona::new(DaytonaConfig {
//!     api_key: Some("YOUR_API_KEY".into()),
//!     ..Default::default()
//! })?;
//! let sandbox = daytona.create(None).await?;
//! let response = sandbox.process.code_run("print(\"Hello World!\")").await?;
//! print!("{}", response.result);
//! sandbox.delete().await?;
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]

pub mod client;
pub mod errors;
pub mod fs;
pub mod gaps;
pub mod git;
pub mod process;
pub mod sandbox;
pub mod snapshot;
pub mod translate;
pub mod volume;
#[cfg(feature = "wire")]
pub mod wire;

mod ctx;

pub use client::{
    CodeLanguage, CreateSandboxBaseParams, CreateSandboxFromImageParams,
    CreateSandboxFromSnapshotParams, CreateSandboxParams, Daytona, DaytonaConfig,
    ListSandboxesQuery, Resources, SandboxListSortDirection, SandboxListSortField, VolumeMount,
};
pub use errors::DaytonaError;
pub use fs::{
    FileDownloadRequest, FileDownloadResponse, FileInfo, FileSystem, FileUpload, Match,
    ReplaceResult, SearchFilesResponse,
};
pub use git::{FileStatus, Git, GitCommitResponse, GitStatus, ListBranchResponse};
pub use process::{
    CodeRunParams, Command, ExecuteResponse, ExecutionArtifacts, Process, Session,
    SessionCommandLogsResponse, SessionExecuteRequest, SessionExecuteResponse,
};
pub use sandbox::{
    CodeInterpreter, ComputerUse, FileUrlBuilder, PortPreviewUrl, Sandbox, SandboxArg,
    SandboxState, SignedPortPreviewUrl,
};
pub use snapshot::{
    CreateSnapshotParams, Image, PaginatedSnapshots, Snapshot, SnapshotService, DEFAULT_SNAPSHOT,
};
pub use volume::{Volume, VolumeService};

/// A string keyword Python also accepts as `None` (MIRRORING.md rule 3), shared by the facades.
pub use sandcove_compat_support::OptionalString;

/// A number of seconds as Python takes it (`int` or `float`), or `None`, shared by the
/// facades.
pub use sandcove_compat_support::Seconds;

/// Result type of this crate.
pub type Result<T, E = DaytonaError> = std::result::Result<T, E>;

/// Make a builder awaitable (the facades' shared `awaitable!`, with this crate's `Result`).
macro_rules! awaitable {
    ($builder:ty => $out:ty) => {
        sandcove_compat_support::awaitable!($builder => $crate::Result<$out>);
    };
}
pub(crate) use awaitable;

#[cfg(test)]
mod tests {
    #[test]
    fn public_types_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<crate::Daytona>();
        check::<crate::Sandbox>();
        check::<crate::DaytonaError>();
        check::<crate::ExecuteResponse>();
    }
}
