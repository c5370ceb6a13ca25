//! The model every Sandcove crate shares: the values of sandboxes, processes and files, the one
//! [`Error`], [`Capabilities`], the [`Backend`] trait every runtime implements, and the native
//! HTTP API's [`wire`] contract its client and server both speak.
//!
//! Most programs use the `sandcove` crate, which re-exports all of this and adds the `Client`
//! that picks a runtime. The layering (each arrow a dependency, enforced by the crate graph):
//!
//! ```text
//! sandcove-core  <-  sandcove-agent  <-  sandcove-engine
//!       ^                  ^
//!       |                  +------------  sandcove-kube
//!       +---  sandcove-http, sandcove-server
//! sandcove (the umbrella) re-exports them; the facades depend on the umbrella.
//! ```
//!
//! | module | what |
//! |---|---|
//! | [`types`] | options and results: sandboxes, processes, files |
//! | [`error`] | [`Error`], the one error type, and its wire form |
//! | [`capability`] | [`Capabilities`] of a backend |
//! | [`backend`] | the [`Backend`] trait |
//! | [`layer`] | [`Layer`]: a backend wrapping another, changing only some calls |
//! | [`operation`] | [`OperationId`]s of calls with a remote effect |
//! | [`reference`](mod@reference) | saved [`Reference`]s that a later program reopens, and tombstones |
//! | [`wire`] | the native HTTP API's routes, frames and request bodies |
//! | [`file_url`] | signed file URLs: the token, its key, and the one code serving them |
//! | [`listen`] | accept loops with a connection cap, shared by every listener |

#![forbid(unsafe_code)]

pub mod backend;
pub mod capability;
pub mod error;
pub mod file_url;
pub mod layer;
pub mod listen;
pub mod operation;
pub mod reference;
pub mod secret;
pub mod stall;
pub mod types;
pub mod validate;
pub mod wire;

pub use backend::{Backend, ByteStream, ProcessStream, WatchStream};
pub use capability::{
    Capabilities, CheckStatus, Feature, Guarantees, LeaseBounds, HOST_BASE_TEMPLATES,
};
pub use error::{Error, ErrorBody, ErrorCode, Result};
pub use layer::Layer;
pub use operation::{OperationId, OperationStatus};
pub use reference::{Reference, Reopened, ResourceKind, Tombstone};
pub use types::*;
pub use validate::{MAX_PROCESS_TIMEOUT, MAX_SANDBOX_TIMEOUT};
