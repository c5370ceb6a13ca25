//! What a backend can do, checked before dispatch.
//!
//! [`Capabilities`] is learned once per backend ([`Backend::ready`](crate::Backend::ready));
//! the [`Client`](crate::Client) and its [`Sandbox`](crate::Sandbox) handles check every call
//! against it with [`Capabilities::require`], [`Capabilities::check_create`] and
//! [`Capabilities::check_spawn`] before anything reaches the backend, so a missing feature is
//! the same [`Error::NotSupported`] on every backend and over
//! HTTP, named by [`Feature`] with what to do instead. A backend still refuses on its own
//! where that is a security boundary (a server takes requests from any client).

use serde::{Deserialize, Serialize};

use crate::{CreateOptions, Error, NetworkPolicy, ProcessSpec, Result, TimeoutAction};

/// A flat description of a backend's abilities. Anything `false` here is answered with
/// [`Error::NotSupported`] before any effect.
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

/// An optional feature a backend may lack, one per `bool` of [`Capabilities`] that a call can
/// ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Feature {
    /// Pause and resume ([`Capabilities::pause`]), also a lease that pauses and auto-resume.
    Pause,
    /// Preview URLs ([`Capabilities::previews`]).
    Previews,
    /// Snapshots and fork ([`Capabilities::snapshots`]).
    Snapshots,
    /// Named volumes ([`Capabilities::volumes`]).
    Volumes,
    /// Directory watches ([`Capabilities::watch`]).
    Watch,
    /// Processes on a pseudo-terminal ([`Capabilities::pty`]).
    Pty,
    /// Resource metrics ([`Capabilities::metrics`]).
    Metrics,
    /// The host's network namespace ([`Capabilities::host_network`]).
    HostNetwork,
    /// A per-sandbox process limit ([`Capabilities::process_limit`]).
    ProcessLimit,
    /// A memory limit ([`Capabilities::memory_limit`]).
    MemoryLimit,
    /// A CPU limit ([`Capabilities::cpu_limit`]).
    CpuLimit,
}

impl Feature {
    /// What the feature is: the `feature` of its [`Error::NotSupported`].
    pub fn name(self) -> &'static str {
        match self {
            Feature::Pause => "pausing sandboxes",
            Feature::Previews => "preview URLs",
            Feature::Snapshots => "snapshots and fork",
            Feature::Volumes => "named volumes",
            Feature::Watch => "directory watches",
            Feature::Pty => "processes on a pseudo-terminal",
            Feature::Metrics => "resource metrics",
            Feature::HostNetwork => "the host's network (NetworkPolicy::Host)",
            Feature::ProcessLimit => "a per-sandbox process limit (max_processes)",
            Feature::MemoryLimit => "a memory limit (memory_mib)",
            Feature::CpuLimit => "a CPU limit (cpu)",
        }
    }

    /// What to do instead on a backend without it.
    pub fn alternative(self) -> &'static str {
        match self {
            Feature::Pause => {
                "destroy the sandbox when done and keep its files elsewhere, or use stop/start                  (files kept, processes end)"
            }
            Feature::Previews => {
                "reach the port from a process inside the sandbox, or use a backend with previews"
            }
            Feature::Snapshots => "create a new sandbox and copy the files in with the file API",
            Feature::Volumes => {
                "keep shared files outside the sandbox and copy them in with the file API"
            }
            Feature::Watch => "poll with stat or list_dir",
            Feature::Pty => "run the process without a terminal (plain stdin/stdout/stderr)",
            Feature::Metrics => "read /proc inside the sandbox with a process",
            Feature::HostNetwork => {
                "use NetworkPolicy::Internet or NetworkPolicy::None, or a backend that allows it"
            }
            Feature::ProcessLimit | Feature::MemoryLimit | Feature::CpuLimit => {
                "omit the limit, or use a backend that enforces it (on the local engine: a host \
                 with user namespaces and writable cgroups)"
            }
        }
    }
}

impl Capabilities {
    /// Whether this backend has `feature`.
    pub fn supports(&self, feature: Feature) -> bool {
        match feature {
            Feature::Pause => self.pause,
            Feature::Previews => self.previews,
            Feature::Snapshots => self.snapshots,
            Feature::Volumes => self.volumes,
            Feature::Watch => self.watch,
            Feature::Pty => self.pty,
            Feature::Metrics => self.metrics,
            Feature::HostNetwork => self.host_network,
            Feature::ProcessLimit => self.process_limit,
            Feature::MemoryLimit => self.memory_limit,
            Feature::CpuLimit => self.cpu_limit,
        }
    }

    /// `Ok` when this backend has `feature`, else the one
    /// [`Error::NotSupported`] naming it and its alternative.
    pub fn require(&self, feature: Feature) -> Result<()> {
        if self.supports(feature) {
            Ok(())
        } else {
            Err(Error::not_supported(feature.name(), feature.alternative()))
        }
    }

    /// Every feature a create (or fork) with `options` needs, each checked with
    /// [`Capabilities::require`]. (Templates, isolated internet and disk sizes are the
    /// backend's own checks: whether they work depends on more than a flag.)
    pub fn check_create(&self, options: &CreateOptions) -> Result<()> {
        if options.network == NetworkPolicy::Host {
            self.require(Feature::HostNetwork)?;
        }
        if !options.volumes.is_empty() {
            self.require(Feature::Volumes)?;
        }
        if options.snapshot.is_some() {
            self.require(Feature::Snapshots)?;
        }
        if options.on_timeout == TimeoutAction::Pause || options.auto_resume {
            self.require(Feature::Pause)?;
        }
        let r = &options.resources;
        if r.max_processes.is_some() {
            self.require(Feature::ProcessLimit)?;
        }
        if r.memory_mib.is_some() {
            self.require(Feature::MemoryLimit)?;
        }
        if r.cpu.is_some() {
            self.require(Feature::CpuLimit)?;
        }
        Ok(())
    }

    /// Every feature a process started with `spec` needs.
    pub fn check_spawn(&self, spec: &ProcessSpec) -> Result<()> {
        if spec.pty.is_some() {
            self.require(Feature::Pty)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Command, PtySize, Resources, VolumeMount};

    fn all() -> Capabilities {
        Capabilities {
            backend: "t".into(),
            isolated: true,
            multiple_users: true,
            persistent_sandboxes: true,
            host_network: true,
            internet: true,
            process_limit: true,
            max_file_bytes: 1,
            output_limit: 1,
            pause: true,
            previews: true,
            snapshots: true,
            volumes: true,
            watch: true,
            pty: true,
            metrics: true,
            memory_limit: true,
            cpu_limit: true,
        }
    }

    fn without(feature: Feature) -> Capabilities {
        let mut caps = all();
        let flag = match feature {
            Feature::Pause => &mut caps.pause,
            Feature::Previews => &mut caps.previews,
            Feature::Snapshots => &mut caps.snapshots,
            Feature::Volumes => &mut caps.volumes,
            Feature::Watch => &mut caps.watch,
            Feature::Pty => &mut caps.pty,
            Feature::Metrics => &mut caps.metrics,
            Feature::HostNetwork => &mut caps.host_network,
            Feature::ProcessLimit => &mut caps.process_limit,
            Feature::MemoryLimit => &mut caps.memory_limit,
            Feature::CpuLimit => &mut caps.cpu_limit,
        };
        *flag = false;
        caps
    }

    #[test]
    fn each_option_needing_a_feature_is_refused_without_it() {
        let table: Vec<(CreateOptions, Feature)> = vec![
            (
                CreateOptions::default().network(NetworkPolicy::Host),
                Feature::HostNetwork,
            ),
            (
                CreateOptions::default().volume(VolumeMount::new("v", "/v")),
                Feature::Volumes,
            ),
            (CreateOptions::default().snapshot("s"), Feature::Snapshots),
            (
                CreateOptions::default().on_timeout(TimeoutAction::Pause),
                Feature::Pause,
            ),
            (CreateOptions::default().auto_resume(true), Feature::Pause),
            (
                CreateOptions::default().resources(Resources::default().max_processes(5)),
                Feature::ProcessLimit,
            ),
            (
                CreateOptions::default().resources(Resources::default().memory_mib(64)),
                Feature::MemoryLimit,
            ),
            (
                CreateOptions::default().resources(Resources::default().cpu(1.0)),
                Feature::CpuLimit,
            ),
        ];
        for (options, feature) in table {
            assert!(all().check_create(&options).is_ok(), "{feature:?}");
            let caps = without(feature);
            assert!(!caps.supports(feature));
            match caps.check_create(&options) {
                Err(Error::NotSupported {
                    feature: f,
                    alternative,
                }) => {
                    assert_eq!(f, feature.name());
                    assert_eq!(alternative, feature.alternative());
                }
                other => panic!("{feature:?}: {other:?}"),
            }
            assert!(caps.check_create(&CreateOptions::default()).is_ok());
        }
        let pty = ProcessSpec::new(Command::sh("true")).pty(PtySize { cols: 80, rows: 24 });
        assert!(all().check_spawn(&pty).is_ok());
        let caps = without(Feature::Pty);
        assert_eq!(
            caps.check_spawn(&pty).unwrap_err().code(),
            crate::ErrorCode::NotSupported
        );
        assert!(caps
            .check_spawn(&ProcessSpec::new(Command::sh("true")))
            .is_ok());
    }
}
