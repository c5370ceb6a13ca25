//! What a backend can do, checked before dispatch.
//!
//! [`Capabilities`] is learned once per backend ([`Backend::ready`](crate::Backend::ready));
//! the `Client` and its `Sandbox` handles check every call
//! against it with [`Capabilities::require`], [`Capabilities::check_create`] and
//! [`Capabilities::check_spawn`] before anything reaches the backend, so a missing feature is
//! the same [`Error::NotSupported`] on every backend and over
//! HTTP, named by [`Feature`] with what to do instead. A backend still refuses on its own
//! where that is a security boundary (a server takes requests from any client).

use serde::{Deserialize, Serialize};

use std::time::Duration;

use crate::{CreateOptions, Error, NetworkPolicy, ProcessSpec, Result, TimeoutAction, UnixMillis};

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
    /// A lease can end in a stop ([`TimeoutAction::Stop`]): processes end, files are kept.
    #[serde(default)]
    pub lease_stop: bool,
    /// Snapshots can keep processes and memory
    /// ([`SnapshotOptions::memory`](crate::SnapshotOptions::memory)); without it a snapshot
    /// keeps the files ([`SNAPSHOT_PRESERVES`]).
    #[serde(default)]
    pub snapshot_memory: bool,
    /// Ports can be exposed as preview URLs.
    pub previews: bool,
    /// Signed file URLs ([`Backend::create_file_url`](crate::Backend::create_file_url)):
    /// one path of one sandbox, read or written with a plain HTTP request, served outside
    /// the sandbox.
    #[serde(default)]
    pub file_urls: bool,
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
    /// Template names this runtime provides ([`CreateOptions::template`]): the host base's
    /// (see [`HOST_BASE_TEMPLATES`]), then, where [`Capabilities::images`] holds, the
    /// references of the images it has stored. Empty when the runtime did not say (an older
    /// server): a template request is then [`CheckStatus::Unknown`].
    #[serde(default)]
    pub templates: Vec<String>,
    /// OCI images run as sandbox roots: a template naming an image the runtime has stored
    /// (pulled or imported) runs that image's filesystem.
    #[serde(default)]
    pub images: bool,
    /// How this runtime composes an image's root, where it says: `overlay` (the image's
    /// layers, read-only, under a writable layer of the sandbox's: creates are quick and a
    /// snapshot holds what the sandbox changed) or `copy` (the layers copied into the
    /// sandbox's own disk, where overlayfs is unavailable or the operator chose it: creates
    /// take longer, the image counts against the sandbox's disk, and a snapshot holds the
    /// whole root). `None`: no images, or the runtime did not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_root: Option<String>,
    /// The leases `set_timeout` and
    /// [`CreateOptions::timeout`] accept; `None` when the runtime did not say.
    #[serde(default)]
    pub lease: Option<LeaseBounds>,
    /// When these capabilities were observed (ms since the epoch): probed by the local
    /// engine, or fetched from the server by the HTTP client. `None` means never observed
    /// (a remote server not asked yet, or unreachable): every optional flag is then `false`
    /// for lack of evidence, not because the runtime lacks the feature.
    #[serde(default)]
    pub observed_at: Option<UnixMillis>,
    /// The runtime's stable identity, the scope of its [`Reference`](crate::Reference)s: the
    /// embedded engine's is minted once per state directory and kept there; a server reports
    /// its backend's. `None` when the runtime did not say (an older server, or not reached).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_id: Option<String>,
}

impl Capabilities {
    /// What a runtime named `backend` reports when it has nothing optional: no isolation, no
    /// feature, no bound. A backend in another crate starts here and turns on what it has
    /// (the struct is non-exhaustive, so it cannot be written out field by field there).
    pub fn none(backend: impl Into<String>) -> Self {
        Capabilities {
            backend: backend.into(),
            isolated: false,
            multiple_users: false,
            persistent_sandboxes: false,
            host_network: false,
            internet: false,
            process_limit: false,
            max_file_bytes: 0,
            output_limit: 0,
            pause: false,
            lease_stop: false,
            snapshot_memory: false,
            previews: false,
            file_urls: false,
            snapshots: false,
            volumes: false,
            watch: false,
            pty: false,
            metrics: false,
            memory_limit: false,
            cpu_limit: false,
            templates: Vec::new(),
            images: false,
            image_root: None,
            lease: None,
            observed_at: None,
            runtime_id: None,
        }
    }
}

/// Template names that denote the host base: the host's system directories, read-only, with
/// an empty writable `/workspace`. `None` and `""` mean the same. Any other name is refused
/// with [`Error::NotSupported`] before any effect: a sandbox never silently runs the host base
/// in place of an image it was asked for.
pub const HOST_BASE_TEMPLATES: &[&str] = &["base", "host"];

/// Whether `template` names the host base (see [`HOST_BASE_TEMPLATES`]).
pub fn is_host_base(template: Option<&str>) -> bool {
    template.is_none_or(|t| t.is_empty() || HOST_BASE_TEMPLATES.contains(&t))
}

/// What the host base is, for the `alternative` of a refused image or template.
pub const HOST_BASE_ALTERNATIVE: &str =
    "this runtime runs one base: the host's system directories, read-only, with a writable \
     /workspace (template None or \"base\"); to get the real image, run it on its vendor or \
     install what it contains into the sandbox (a setup command, then snapshot the result and \
     create from that snapshot)";

/// The leases a runtime accepts, and how finely it keeps them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseBounds {
    /// Shortest lease, in milliseconds. A lease of zero is refused: end a sandbox with
    /// `destroy` (or `pause`), not with a zero timeout.
    pub min_ms: u64,
    /// Longest lease, in milliseconds.
    pub max_ms: u64,
    /// Resolution, in milliseconds: a requested lease is rounded up to a multiple of it.
    pub step_ms: u64,
}

impl LeaseBounds {
    /// The bounds of the engines in this crate: one second to
    /// [`MAX_SANDBOX_TIMEOUT`](crate::MAX_SANDBOX_TIMEOUT), kept to the millisecond.
    pub fn engine() -> Self {
        LeaseBounds {
            min_ms: 1000,
            max_ms: crate::MAX_SANDBOX_TIMEOUT.as_millis() as u64,
            step_ms: 1,
        }
    }

    /// The lease that will be in force for a request of `timeout` (rounded up to the step),
    /// or [`Error::InvalidArgument`] naming the bounds when it is outside them.
    pub fn resolve(&self, timeout: Duration) -> Result<Duration> {
        let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        let step = self.step_ms.max(1);
        let resolved = ms.div_ceil(step).saturating_mul(step);
        if ms == 0 || ms < self.min_ms || resolved > self.max_ms {
            return Err(Error::invalid(format!(
                "a lease of {:.3}s is outside this runtime's bounds: at least {:.3}s, at most \
                 {}s, in steps of {:.3}s (a zero lease is refused: destroy or pause the \
                 sandbox instead)",
                timeout.as_secs_f64(),
                self.min_ms as f64 / 1000.0,
                self.max_ms / 1000,
                step as f64 / 1000.0,
            )));
        }
        Ok(Duration::from_millis(resolved))
    }
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
    /// A lease that ends in a stop ([`Capabilities::lease_stop`]).
    LeaseStop,
    /// Snapshots that keep processes and memory ([`Capabilities::snapshot_memory`]).
    SnapshotMemory,
    /// Preview URLs ([`Capabilities::previews`]).
    Previews,
    /// Signed file URLs ([`Capabilities::file_urls`]).
    FileUrls,
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
            Feature::LeaseStop => "a lease that stops the sandbox (on_timeout: Stop)",
            Feature::SnapshotMemory => "snapshots that keep processes and memory",
            Feature::Previews => "preview URLs",
            Feature::FileUrls => "signed file URLs",
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
            Feature::LeaseStop => {
                "let the lease destroy the sandbox and keep its files in a snapshot or a volume, \
                 or stop it yourself before the lease ends"
            }
            Feature::SnapshotMemory => {
                "take a files-only snapshot (the files are kept; start the programs again after \
                 creating from it), or pause the sandbox to keep its processes as they are"
            }
            Feature::Previews => {
                "reach the port from a process inside the sandbox, or use a backend with previews"
            }
            Feature::FileUrls => {
                "move the file with the file API (read_file / write_file), or serve the runtime \
                 with `sandcove serve`, whose listener serves signed file URLs"
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
            Feature::LeaseStop => self.lease_stop,
            Feature::SnapshotMemory => self.snapshot_memory,
            Feature::Previews => self.previews,
            Feature::FileUrls => self.file_urls,
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

    /// The read-only evaluation of a create (or fork) with `options` against these
    /// capabilities: the one place `Client::check_create` and
    /// every create consult. Nothing is allocated. Bad input is not judged here
    /// ([`CreateOptions::validate`] does that).
    pub fn evaluate_create(&self, options: &CreateOptions) -> CheckStatus {
        if self.observed_at.is_none() {
            return CheckStatus::Unknown {
                what: format!(
                    "the capabilities of {} were never observed (the runtime was not reached)",
                    self.backend
                ),
            };
        }
        if !is_host_base(options.template.as_deref()) {
            let template = options.template.as_deref().unwrap_or_default();
            if self.templates.is_empty() {
                return CheckStatus::Unknown {
                    what: format!("whether {} provides template {template:?}", self.backend),
                };
            }
            if !self.templates.iter().any(|t| t == template) && self.images {
                return CheckStatus::Unknown {
                    what: format!(
                        "whether {} holds image {template:?} under another reference (pull or \
                         import it first: `sandcove image pull {template}`)",
                        self.backend
                    ),
                };
            }
            if !self.templates.iter().any(|t| t == template) {
                return CheckStatus::Unsupported {
                    feature: format!("template or image {template:?}"),
                    alternative: HOST_BASE_ALTERNATIVE.into(),
                };
            }
        }
        // A runtime that does not report its lease bounds checks the lease itself.
        if let (Some(timeout), Some(bounds)) = (options.timeout, self.lease) {
            if let Err(Error::InvalidArgument { message }) = bounds.resolve(timeout) {
                return CheckStatus::Unsupported {
                    feature: message,
                    alternative: "ask for a lease within the bounds, and renew it with \
                                  set_timeout while the sandbox is in use"
                        .into(),
                };
            }
        }
        if options.network == NetworkPolicy::Internet && !self.internet {
            return if self.isolated {
                CheckStatus::Unavailable {
                    reason: format!(
                        "isolated internet access is unavailable on {}: its user-mode \
                         networking helper is missing or unusable",
                        self.backend
                    ),
                    remedy: format!(
                        "{INTERNET_REMEDY}; or create the sandbox with NetworkPolicy::None \
                         (loopback only)"
                    ),
                }
            } else {
                CheckStatus::Unsupported {
                    feature: "internet access without isolation".into(),
                    alternative: "run on a host with user namespaces, or use \
                                  NetworkPolicy::None"
                        .into(),
                }
            };
        }
        let mut needs = Vec::new();
        if options.network == NetworkPolicy::Host {
            needs.push(Feature::HostNetwork);
        }
        if !options.volumes.is_empty() {
            needs.push(Feature::Volumes);
        }
        if options.snapshot.is_some() {
            needs.push(Feature::Snapshots);
        }
        if options.on_timeout == TimeoutAction::Pause || options.auto_resume {
            needs.push(Feature::Pause);
        }
        if options.on_timeout == TimeoutAction::Stop {
            needs.push(Feature::LeaseStop);
        }
        let r = &options.resources;
        let mut limits = Vec::new();
        for (asked, feature) in [
            (r.max_processes.is_some(), Feature::ProcessLimit),
            (r.memory_mib.is_some(), Feature::MemoryLimit),
            (r.cpu.is_some(), Feature::CpuLimit),
        ] {
            if asked {
                needs.push(feature);
                limits.push(feature.name().to_string());
            }
        }
        if let Some(missing) = needs.into_iter().find(|f| !self.supports(*f)) {
            return CheckStatus::Unsupported {
                feature: missing.name().into(),
                alternative: missing.alternative().into(),
            };
        }
        CheckStatus::Supported(Guarantees {
            isolated: self.isolated,
            network: options.network.clone(),
            network_isolated: self.isolated && options.network != NetworkPolicy::Host,
            limits_enforced: limits,
            lease: options
                .timeout
                .and_then(|t| self.lease.and_then(|b| b.resolve(t).ok())),
            snapshot_preserves: self.snapshots.then(|| SNAPSHOT_PRESERVES.to_string()),
            observed_at: self.observed_at,
        })
    }

    /// The read-only evaluation of a snapshot or fork: [`CheckStatus::Supported`] naming what
    /// a snapshot keeps ([`Guarantees::snapshot_preserves`]), else why not.
    pub fn evaluate_snapshot(&self) -> CheckStatus {
        if self.observed_at.is_none() {
            return CheckStatus::Unknown {
                what: format!(
                    "the capabilities of {} were never observed (the runtime was not reached)",
                    self.backend
                ),
            };
        }
        if !self.snapshots {
            return CheckStatus::Unsupported {
                feature: Feature::Snapshots.name().into(),
                alternative: Feature::Snapshots.alternative().into(),
            };
        }
        CheckStatus::Supported(Guarantees {
            isolated: self.isolated,
            network: NetworkPolicy::default(),
            network_isolated: self.isolated,
            limits_enforced: Vec::new(),
            lease: None,
            snapshot_preserves: Some(SNAPSHOT_PRESERVES.into()),
            observed_at: self.observed_at,
        })
    }

    /// Whether `options` name an image this runtime may hold under a reference it did not
    /// list: it runs images, listed its templates, and the template is neither the host
    /// base nor one of them. [`Capabilities::evaluate_create`] then answers
    /// [`CheckStatus::Unknown`] (an image is known by many references: a short Docker Hub
    /// name, a digest), and a create leaves the question to the runtime, which resolves the
    /// reference and answers [`Error::NotFound`] when it holds no such image.
    pub fn image_left_to_runtime(&self, options: &CreateOptions) -> bool {
        let template = options.template.as_deref();
        self.observed_at.is_some()
            && self.images
            && !self.templates.is_empty()
            && !is_host_base(template)
            && !self.templates.iter().any(|t| Some(t.as_str()) == template)
    }

    /// Every feature a create (or fork) with `options` needs, as an error: `Ok` only when
    /// [`Capabilities::evaluate_create`] answers [`CheckStatus::Supported`].
    pub fn check_create(&self, options: &CreateOptions) -> Result<()> {
        self.evaluate_create(options).into_result().map(|_| ())
    }

    /// Every feature a process started with `spec` needs.
    pub fn check_spawn(&self, spec: &ProcessSpec) -> Result<()> {
        if spec.pty.is_some() {
            self.require(Feature::Pty)?;
        }
        Ok(())
    }
}

/// What a snapshot (and so a fork) keeps of its source.
pub const SNAPSHOT_PRESERVES: &str = "the sandbox's files (its writable layers: /workspace, /tmp \
     and every other writable path), not its processes, memory or open connections; a fork \
     starts fresh processes on a copy of the files";

/// The answer of a read-only check (`Client::check_create`,
/// `Client::check_snapshot`): nothing was allocated to
/// reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CheckStatus {
    /// The runtime can do it; this is what will hold.
    Supported(Guarantees),
    /// The runtime cannot do this at all; `alternative` says what to do instead.
    Unsupported {
        /// What was asked for.
        feature: String,
        /// What to do instead.
        alternative: String,
    },
    /// The runtime or its host cannot do it now (server unreachable, helper missing).
    Unavailable {
        /// The cause.
        reason: String,
        /// How to fix it.
        remedy: String,
    },
    /// No evidence either way (e.g. an older server that does not report it). Never
    /// satisfies a requirement: a create refuses it.
    Unknown {
        /// What could not be established.
        what: String,
    },
}

impl CheckStatus {
    /// Whether the request would be carried out.
    pub fn is_supported(&self) -> bool {
        matches!(self, CheckStatus::Supported(_))
    }

    /// The guarantees, or the error a create answers with: [`Error::NotSupported`] for
    /// unsupported, [`Error::Unavailable`] for unavailable and for unknown (no evidence is
    /// not permission).
    pub fn into_result(self) -> Result<Guarantees> {
        match self {
            CheckStatus::Supported(g) => Ok(g),
            CheckStatus::Unsupported {
                feature,
                alternative,
            } => Err(Error::NotSupported {
                feature,
                alternative,
            }),
            CheckStatus::Unavailable { reason, remedy } => {
                Err(Error::Unavailable { reason, remedy })
            }
            CheckStatus::Unknown { what } => Err(Error::Unavailable {
                reason: format!("unknown: {what}"),
                remedy: "reach the runtime (or upgrade it) so it reports this, then retry".into(),
            }),
        }
    }
}

/// What holds for a supported request ([`CheckStatus::Supported`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Guarantees {
    /// The sandbox is isolated from the host (namespaces); see [`Capabilities::isolated`].
    pub isolated: bool,
    /// The network policy that will be in force.
    pub network: NetworkPolicy,
    /// The sandbox gets its own network namespace (not the host's).
    pub network_isolated: bool,
    /// The limits asked for, each enforced (by [`Feature::name`]).
    pub limits_enforced: Vec<String>,
    /// The lease that will be in force (the request resolved to the runtime's step), when one
    /// was asked for.
    pub lease: Option<Duration>,
    /// What a snapshot of the sandbox keeps ([`SNAPSHOT_PRESERVES`]); `None` without
    /// snapshots.
    pub snapshot_preserves: Option<String>,
    /// When the capabilities this rests on were observed.
    pub observed_at: Option<UnixMillis>,
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
            lease_stop: true,
            snapshot_memory: true,
            previews: true,
            file_urls: true,
            snapshots: true,
            volumes: true,
            watch: true,
            pty: true,
            metrics: true,
            memory_limit: true,
            cpu_limit: true,
            templates: vec!["base".into()],
            images: false,
            image_root: None,
            lease: Some(LeaseBounds::engine()),
            observed_at: Some(1),
            runtime_id: Some("rt-test".into()),
        }
    }

    fn without(feature: Feature) -> Capabilities {
        let mut caps = all();
        let flag = match feature {
            Feature::Pause => &mut caps.pause,
            Feature::LeaseStop => &mut caps.lease_stop,
            Feature::SnapshotMemory => &mut caps.snapshot_memory,
            Feature::Previews => &mut caps.previews,
            Feature::FileUrls => &mut caps.file_urls,
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
                CreateOptions::default().on_timeout(TimeoutAction::Stop),
                Feature::LeaseStop,
            ),
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

    /// Unknown never passes for supported; unavailable and unsupported stay apart; an image
    /// the runtime lacks is refused naming the host base.
    #[test]
    fn check_statuses_keep_their_meaning() {
        let mut never = all();
        never.observed_at = None;
        let plain = CreateOptions::default();
        assert!(matches!(
            never.evaluate_create(&plain),
            CheckStatus::Unknown { .. }
        ));
        assert_eq!(
            never.check_create(&plain).unwrap_err().code(),
            crate::ErrorCode::Unavailable
        );
        assert!(matches!(
            never.evaluate_snapshot(),
            CheckStatus::Unknown { .. }
        ));

        let mut no_helper = all();
        no_helper.internet = false;
        let inet = CreateOptions::default().network(NetworkPolicy::Internet);
        match no_helper.evaluate_create(&inet) {
            CheckStatus::Unavailable { remedy, .. } => assert!(remedy.contains("passt")),
            other => panic!("{other:?}"),
        }
        no_helper.isolated = false;
        assert!(matches!(
            no_helper.evaluate_create(&inet),
            CheckStatus::Unsupported { .. }
        ));

        let image = CreateOptions::default().template("myorg/custom-ml:1.2");
        match all().evaluate_create(&image) {
            CheckStatus::Unsupported {
                feature,
                alternative,
            } => {
                assert!(feature.contains("myorg/custom-ml:1.2"));
                assert_eq!(alternative, HOST_BASE_ALTERNATIVE);
            }
            other => panic!("{other:?}"),
        }
        let mut images = all();
        images.images = true;
        assert!(images.image_left_to_runtime(&image));
        assert!(matches!(
            images.evaluate_create(&image),
            CheckStatus::Unknown { .. }
        ));
        assert!(
            !all().image_left_to_runtime(&image),
            "a runtime without images"
        );
        assert!(!images.image_left_to_runtime(&plain), "the host base");
        let mut silent = all();
        silent.templates.clear();
        assert!(
            !silent.image_left_to_runtime(&image),
            "templates not reported"
        );
        assert!(matches!(
            silent.evaluate_create(&image),
            CheckStatus::Unknown { .. }
        ));
        for base in ["", "base"] {
            let o = CreateOptions::default().template(base);
            assert!(silent.evaluate_create(&o).is_supported(), "{base:?}");
        }
        match all().evaluate_create(&plain) {
            CheckStatus::Supported(g) => {
                assert!(g.isolated && g.network_isolated);
                assert_eq!(g.snapshot_preserves.as_deref(), Some(SNAPSHOT_PRESERVES));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn lease_bounds_resolve_or_refuse() {
        let b = LeaseBounds {
            min_ms: 1000,
            max_ms: 10_000,
            step_ms: 1000,
        };
        assert!(b.resolve(Duration::ZERO).is_err());
        assert!(b.resolve(Duration::from_millis(999)).is_err());
        assert!(b.resolve(Duration::from_millis(10_001)).is_err());
        assert_eq!(
            b.resolve(Duration::from_millis(1500)).unwrap(),
            Duration::from_secs(2)
        );
        assert_eq!(
            b.resolve(Duration::from_secs(10)).unwrap(),
            Duration::from_secs(10)
        );
        let e = LeaseBounds::engine();
        assert!(e.resolve(Duration::ZERO).is_err());
        assert!(e.resolve(crate::MAX_SANDBOX_TIMEOUT).is_ok());
        assert!(e
            .resolve(crate::MAX_SANDBOX_TIMEOUT + Duration::from_millis(1))
            .is_err());
    }
}
