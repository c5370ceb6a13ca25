//! What a host needs to drive a sandbox agent it did not start: the agent protocol
//! ([`proto`]), its client [`client::RemoteAgent`], the sandbox-scoped backend calls passed
//! to it ([`agent_backend::AgentBackend`]), the preview proxy that serves a sandbox port over
//! a token-checked listener ([`preview`]) and the bounded forwarding to a sandbox port it
//! shares with E2B's `get_host` ([`forward`]), the engine's listener for signed file URLs
//! ([`file_url`]), and the in-pod agent's contract ([`pod`]).
//!
//! The embedded engine (`sandcove-engine`) and the Kubernetes backend (`sandcove-kube`) both
//! build on this crate, and neither on the other: the Kubernetes backend never compiles the
//! engine. The agent that serves the protocol lives in the engine (it is the same code that
//! confines processes, whether it runs in the engine's namespaces or in a Pod).

#![forbid(unsafe_code)]

pub mod agent_backend;
pub mod client;
pub mod file_url;
pub mod forward;
pub mod pod;
pub mod preview;
pub mod proto;

/// The largest file one write takes, in bytes (4 GiB; reported as
/// [`Capabilities::max_file_bytes`](sandcove_core::Capabilities::max_file_bytes)). The agent
/// counts what it receives and refuses more with
/// [`Error::FileTooLarge`](sandcove_core::Error::FileTooLarge), discarding the partial file;
/// reads are never larger than the file, whose size the sandbox's disk bounds.
pub const MAX_FILE_BYTES: u64 = 4 << 30;

/// Whether `id` is a well-formed sandbox id (it becomes a directory or Pod name).
pub fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        && !id.starts_with('-')
}

/// A fresh random sandbox id: 20 lowercase letters and digits.
pub fn new_id() -> String {
    sandcove_core::random_id(20)
}
