//! The [`Backend`] trait (from `sandcove-core`) and the runtimes that implement it.

pub use sandcove_core::backend::*;

#[cfg(feature = "local")]
pub mod agent_client;
#[cfg(feature = "local")]
pub mod agent_server;
#[cfg(feature = "http")]
pub mod http;
#[cfg(feature = "kubernetes")]
pub mod kube;
#[cfg(feature = "local")]
pub mod local;
