//! The [`Backend`] trait (crate `sandcove-core`) and the runtimes that implement it, each a
//! crate of its own re-exported here under the umbrella's features.

pub use sandcove_core::backend::*;

/// The agent protocol's client (crate `sandcove-agent`).
#[cfg(any(feature = "local", feature = "kubernetes"))]
pub use sandcove_agent::client as agent_client;
/// The embedded engine (crate `sandcove-engine`).
#[cfg(feature = "local")]
pub use sandcove_engine as local;
/// The in-pod agent (crate `sandcove-engine`).
#[cfg(feature = "local")]
pub use sandcove_engine::agent_server;
/// The HTTP client backend (crate `sandcove-http`).
#[cfg(feature = "http")]
pub use sandcove_http as http;
/// The Kubernetes backend (crate `sandcove-kube`).
#[cfg(feature = "kubernetes")]
pub use sandcove_kube as kube;
