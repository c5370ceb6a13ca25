//! The [`Backend`] trait (from `sandcove-core`) and the runtimes that implement it.

pub use sandcove_core::backend::*;

#[cfg(feature = "local")]
pub mod agent_client;
#[cfg(feature = "local")]
pub mod agent_server;
/// The HTTP client backend (crate `sandcove-http`).
#[cfg(feature = "http")]
pub use sandcove_http as http;
#[cfg(feature = "kubernetes")]
pub mod kube;
#[cfg(feature = "local")]
pub mod local;
