//! What a backend can do, checked before dispatch.

use serde::{Deserialize, Serialize};

use crate::NetworkPolicy;

/// A flat description of a backend's abilities. Anything `false` here is answered with
/// [`Error::NotSupported`](crate::Error::NotSupported) before any effect.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Capabilities {
    /// Name of the backend, e.g. `local` or `http`.
    pub backend: String,
    /// Sandboxes are isolated from the host (namespaces). `false` only in the explicit
    /// un-isolated opt-in mode: processes then run as the host user, see host paths (the
    /// sandbox's own files live in a host directory standing for its root, which the file
    /// API resolves beneath), the host's processes, network and ports, and can write
    /// wherever that user can.
    pub isolated: bool,
    /// Processes may run as a user other than the sandbox's default (needs more than one
    /// mappable uid: a root host or subordinate ids).
    pub multiple_users: bool,
    /// Sandboxes outlive the program that created them and can be found from another one.
    pub persistent_sandboxes: bool,
    /// Sandboxes can share the host's network namespace
    /// ([`NetworkPolicy::Host`], explicit opt-in only).
    pub host_network: bool,
    /// Sandboxes can get isolated outbound internet access
    /// ([`NetworkPolicy::Internet`]): the user-mode
    /// networking helper is installed and usable here.
    #[serde(default)]
    pub internet: bool,
    /// Per-sandbox process limit (`RLIMIT_NPROC` within the sandbox's user namespace).
    pub process_limit: bool,
    /// Largest single file write or read, in bytes.
    pub max_file_bytes: u64,
    /// Default cap on captured output per stream, in bytes.
    pub output_limit: u64,
    /// Pause and resume keep processes and memory.
    pub pause: bool,
    /// Ports can be exposed as preview URLs.
    pub previews: bool,
    /// Filesystem snapshots and fork.
    pub snapshots: bool,
    /// Named persistent volumes.
    pub volumes: bool,
    /// Directory watches.
    pub watch: bool,
    /// Processes on pseudo-terminals.
    pub pty: bool,
    /// CPU and memory metrics.
    pub metrics: bool,
    /// Memory and process-count limits are enforced (cgroups); without it, asking for a
    /// memory limit is `NotSupported`.
    #[serde(default)]
    pub memory_limit: bool,
    /// CPU limits are enforced (cgroups); without it, asking for CPU cores is `NotSupported`.
    #[serde(default)]
    pub cpu_limit: bool,
}

/// The remedy named when isolated internet access is unavailable on a local host.
pub const INTERNET_REMEDY: &str =
    "install the user-mode networking helper `pasta` (Debian/Ubuntu: \
     apt-get install passt) and make /dev/net/tun usable by this user (chmod 0666 /dev/net/tun)";

impl Capabilities {
    /// The policy for a vendor whose default is "internet on": [`NetworkPolicy::Internet`]
    /// where this backend has it, else [`NetworkPolicy::None`] (loopback only), announced by
    /// one `tracing` warning per process naming the remedy. Never
    /// [`NetworkPolicy::Host`]: sharing the host's network is an explicit choice.
    pub fn vendor_internet_default(&self) -> NetworkPolicy {
        if self.internet {
            return NetworkPolicy::Internet;
        }
        static WARNED: std::sync::Once = std::sync::Once::new();
        WARNED.call_once(|| {
            tracing::warn!(
                "sandboxes get loopback-only networking instead of the \
                 vendor's default internet access ({} has no isolated internet): {INTERNET_REMEDY}",
                self.backend
            );
        });
        NetworkPolicy::None
    }
}
