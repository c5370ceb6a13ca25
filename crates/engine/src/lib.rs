//! The embedded local engine: rootless Linux namespaces, nothing to configure.
//!
//! ```text
//!  client program ──unix socket──► monitor (host side, detached, one per sandbox)
//!        ▲                            │ SOCK_SEQPACKET control + SCM_RIGHTS handoff
//!        └──── same connection ────► agent (PID 1 in user/mount/pid/uts/ipc/net namespaces)
//! ```
//!
//! [`LocalBackend::create`](LocalBackend#method.create) writes the sandbox's record into a fresh
//! state directory and asks the program's monitor spawner (`spawner.rs`: the running binary
//! re-executed once, caught before `main` by a constructor hook in `entry.rs`, so any program
//! linking `sandcove` works with no setup) to fork the sandbox's monitor. The monitor clones the
//! agent into new namespaces, writes its uid/gid maps, and serves clients of the same user on a
//! socket in the state directory: lifecycle requests itself, everything else by handing the
//! client's connection to the agent. Sandboxes outlive the program that created them; each ends at
//! its lease, on destroy, or with its monitor.
//!
//! This crate (`sandcove-engine`) is re-exported as `sandcove::backend::local`; the agent
//! protocol and the preview proxy it shares with the Kubernetes backend are `sandcove-agent`.

pub(crate) mod agent;
pub mod agent_server;
mod backend_impl;
mod bounds;
mod cgroup;
pub(crate) mod config;
mod connect;
mod entry;
mod files;
pub mod images;
mod landlock;
mod lifecycle;
mod locale;
mod monitor;
mod names;
mod net;
mod pool;
mod quiet;
mod refs;
mod seccomp;
mod snapshots;
mod spawner;
mod statedir;
mod sys;
mod volume_holder;
mod volumes;

// The agent protocol and the preview proxy, shared with the Kubernetes backend, under the
// paths the engine's modules name them by.
pub(crate) use sandcove_agent::{preview, proto};
// Named at the crate root by the engine's modules.
use self::connect::lock_is_free;
pub(crate) use self::lifecycle::info_of;

use std::path::{Path, PathBuf};
use std::time::Duration;

use self::config::{SandboxDir, UidMapping};
use sandcove_agent::client::ConnPool;
use sandcove_core::{Error, Result};

pub use self::bounds::{
    SandboxBounds, DEFAULT_INODES_PER_MIB, DEFAULT_MAX_PROCESSES, DEFAULT_MEMORY_MIB, HOST_SHARE,
    MIN_INODES,
};
pub use self::config::default_state_dir;
pub use self::pool::{
    size_from_env_or as warm_pool_size_from_env_or, DEFAULT_WARM_POOL, MAX_WARM_POOL, MEMBER_LEASE,
    SERVER_WARM_POOL, WARM_POOL_ENV,
};
pub use self::preview::PreviewLimits;
/// The version of the client ↔ monitor ↔ agent protocol this build speaks; a sandbox created
/// by a build speaking another version can be listed, inspected and destroyed, nothing else.
pub use self::proto::PROTOCOL_VERSION;
pub use self::volumes::{DEFAULT_VOLUME_SIZE_MIB, MAX_VOLUME_SIZE_MIB, MIN_VOLUME_SIZE_MIB};
/// The image store the engine runs images from (see [`images`]).
pub use sandcove_image;

/// Keep the hook that turns a re-executed program into the monitor spawner or an in-pod
/// agent linked into the running program, whatever else it uses of this crate.
pub(crate) fn ensure_role_hook() {
    entry::ensure_linked();
}

/// Env var that opts in to running sandboxes without isolation where namespaces are missing.
pub const ALLOW_UNISOLATED_ENV: &str = "SANDCOVE_ALLOW_UNISOLATED";

pub use sandcove_agent::MAX_FILE_BYTES;

/// The embedded engine. Cheap to clone; all state lives in the state directory and in each
/// sandbox's monitor, so any number of programs share sandboxes.
#[derive(Debug, Clone)]
pub struct LocalBackend {
    state_dir: PathBuf,
    mapping: UidMapping,
    unisolated: bool,
    landlock_optional: bool,
    cgroups: Option<cgroup::Hierarchy>,
    /// The usable user-mode networking helper, or why there is none.
    pasta: std::result::Result<PathBuf, String>,
    preview_limits: PreviewLimits,
    /// The largest file one write takes ([`LocalBackend::with_max_file_bytes`]).
    max_file_bytes: u64,
    /// The size quota of new volumes ([`LocalBackend::with_volume_size_mib`]).
    volume_size_mib: u64,
    /// What every sandbox is bounded to ([`LocalBackend::with_sandbox_bounds`]).
    bounds: SandboxBounds,
    /// When the host was probed (namespaces, cgroups, the networking helper): the
    /// capabilities' `observed_at`.
    probed_at: sandcove_core::UnixMillis,
    /// Warm sandboxes `create` claims (shared by this engine's clones).
    pool: std::sync::Arc<pool::Pool>,
    /// This state directory's identity, the scope of its references (see `refs`).
    runtime_id: String,
    /// Idle agent connections for the next call to each sandbox (shared by clones): a
    /// call that finds one skips the dial and the monitor's handoff.
    conns: std::sync::Arc<ConnPool>,
    /// The directory each sandbox sees as `/usr/lib/locale`, where the host's needs an
    /// archive (see `locale`): made at the first create, off the caller's event loop, not
    /// by engines that only list or destroy (shared by clones).
    locale: std::sync::Arc<std::sync::OnceLock<Option<PathBuf>>>,
    /// Where images named at create are found: the state directory's image store, unless
    /// [`LocalBackend::with_images`] chose another source.
    images: Option<std::sync::Arc<dyn images::ImageSource>>,
    /// How image roots are composed ([`LocalBackend::with_image_root_mode`]).
    image_root_mode: images::ImageRootMode,
}

impl LocalBackend {
    /// An engine keeping state in the default directory (see [`default_state_dir`]).
    pub fn new() -> Result<Self> {
        Self::with_state_dir(config::default_state_dir())
    }

    /// An engine that runs sandboxes WITHOUT isolation: processes run as this user on this
    /// host, with sandbox paths mapped under the sandbox's state directory. Only for hosts
    /// without user namespaces, by explicit choice; `capabilities().isolated` is `false`.
    pub fn unisolated(dir: impl Into<PathBuf>) -> Result<Self> {
        let mut backend = Self::with_state_dir(dir)?;
        if !backend.unisolated {
            tracing::warn!("sandboxes run WITHOUT isolation from this host");
        }
        backend.unisolated = true;
        Ok(backend)
    }

    /// An engine keeping state under `dir` (created if missing, mode 0700).
    ///
    /// `dir` and the subdirectories the engine uses must belong to this user and be writable
    /// by no one else, and every directory above it must belong to this user or root and be
    /// writable by no one else unless sticky; otherwise this is [`Error::Unavailable`] naming
    /// the path, and nothing is written there (another user could otherwise redirect the
    /// engine's writes).
    ///
    /// It raises this process's soft descriptor limit (`RLIMIT_NOFILE`) to the hard limit,
    /// once: each live sandbox holds a few descriptors in the program that made it, and the
    /// usual soft limit of 1024 ends near 400 sandboxes. Sandboxed processes get their own limit.
    pub fn with_state_dir(dir: impl Into<PathBuf>) -> Result<Self> {
        entry::ensure_linked();
        sys::raise_nofile_soft_limit();
        // Absolute, so the engine's processes (started from elsewhere) find it too.
        let state_dir = std::path::absolute(dir.into())
            .map_err(|e| Error::from_io(&e, "state directory path"))?;
        // Before anything is written there: ours, private, no symlink on the way.
        statedir::prepare(&state_dir)?;
        let unisolated =
            std::env::var(ALLOW_UNISOLATED_ENV).is_ok_and(|v| v == "1") && !namespaces_available();
        if unisolated {
            tracing::warn!(
                "user namespaces are unavailable and {ALLOW_UNISOLATED_ENV}=1: sandboxes run \
                 WITHOUT isolation from this host"
            );
        }
        let runtime_id = refs::runtime_id(&state_dir)?;
        let backend = LocalBackend {
            state_dir,
            mapping: UidMapping::for_host(sys::geteuid(), sys::getegid()),
            unisolated,
            landlock_optional: std::env::var(landlock::ALLOW_NO_LANDLOCK_ENV)
                .is_ok_and(|v| v == "1"),
            cgroups: if unisolated { None } else { cgroup::detect() },
            pasta: net::probe(net::find_pasta().as_deref()),
            preview_limits: PreviewLimits::default(),
            max_file_bytes: MAX_FILE_BYTES,
            volume_size_mib: volumes::DEFAULT_VOLUME_SIZE_MIB,
            bounds: SandboxBounds::for_host(),
            probed_at: sandcove_core::now_millis(),
            pool: std::sync::Arc::new(pool::Pool::new(if unisolated {
                0
            } else {
                pool::size_from_env()
            })),
            runtime_id,
            conns: std::sync::Arc::new(ConnPool::new()),
            locale: Default::default(),
            images: None,
            image_root_mode: images::ImageRootMode::from_env()?,
        };
        // Images from this state directory's store (opened at first use).
        let mut backend = backend;
        backend.images = Some(std::sync::Arc::new(images::StoreSource::new(
            &backend.state_dir,
        )));
        backend.collect_stale();
        Ok(backend)
    }

    /// Run images named at create (a template other than the host base) from `source`
    /// instead of the state directory's image store (`<state dir>/images`, see
    /// [`images::open_store`]): their layers become the sandbox's read-only root under a
    /// writable layer of its own (see [`images`]).
    pub fn with_images(mut self, source: std::sync::Arc<dyn images::ImageSource>) -> Self {
        self.images = Some(source);
        self
    }

    /// Compose image roots as `mode` says instead of as [`images::IMAGE_ROOT_ENV`] does
    /// (unset: [`images::ImageRootMode::Auto`], overlayfs where it mounts, else a copy).
    pub fn with_image_root_mode(mut self, mode: images::ImageRootMode) -> Self {
        self.image_root_mode = mode;
        self
    }

    /// How this engine composes image roots (see [`LocalBackend::with_image_root_mode`]).
    pub fn image_root_mode(&self) -> images::ImageRootMode {
        self.image_root_mode
    }

    /// Use `helper` as the user-mode networking helper (`pasta`) for
    /// [`NetworkPolicy::Internet`](sandcove_core::NetworkPolicy::Internet), or none. By default it is
    /// `$SANDCOVE_PASTA` when set (empty: none), else `pasta` from the system directories;
    /// [`Capabilities::internet`](sandcove_core::Capabilities::internet) says whether it is
    /// usable.
    pub fn with_network_helper(mut self, helper: Option<PathBuf>) -> Self {
        self.pasta = net::probe(helper.as_deref());
        self.probed_at = sandcove_core::now_millis();
        self
    }

    /// The same engine, giving sandboxes it creates from now on these preview limits
    /// (head timeout and connection cap of each preview listener).
    pub fn with_preview_limits(mut self, limits: PreviewLimits) -> Self {
        self.preview_limits = limits;
        self
    }

    /// The same engine keeping `size` warm sandboxes (at most [`MAX_WARM_POOL`]; `0` turns
    /// the pool off) instead of what [`WARM_POOL_ENV`] or [`DEFAULT_WARM_POOL`] said. The
    /// pool fills in the background from the first `create` on, in the shapes of recent
    /// creates (loopback-only or Internet networking; any name, envs, labels, user and home,
    /// lease and annotations), which are then claimed from it; every other shape (resources,
    /// volumes, a snapshot, a hostname, the host's network) is created cold. Members are never
    /// listed and end at a short lease ([`MEMBER_LEASE`]) when the program exits. Without
    /// isolation there is no pool.
    pub fn with_warm_pool(mut self, size: usize) -> Self {
        let size = if self.unisolated { 0 } else { size };
        self.pool = std::sync::Arc::new(pool::Pool::new(size));
        self
    }

    /// Warm sandboxes ready to be claimed right now (none until the first `create` starts
    /// filling the pool).
    pub fn warm_ready(&self) -> usize {
        self.pool.ready()
    }

    /// Warm sandboxes ready right now that a create with `options` could claim (none for a
    /// shape the pool never serves).
    pub fn warm_ready_for(&self, options: &sandcove_core::CreateOptions) -> usize {
        match self.pool_shape(options) {
            Some(shape) => self.pool.ready_of(&shape),
            None => 0,
        }
    }

    /// The shape of warm member that could serve a create with `options` (`None`: it goes
    /// cold). An image is looked up in the engine's source for the digest its reference names
    /// now; one not found there goes cold, where the create says why.
    pub(crate) fn pool_shape(&self, options: &sandcove_core::CreateOptions) -> Option<pool::Shape> {
        if self.unisolated {
            return None;
        }
        let image = match options.template.as_deref() {
            template if sandcove_core::capability::is_host_base(template) => None,
            Some(reference) if options.snapshot.is_none() => {
                Some(self.images.as_ref()?.resolve(reference).ok()?)
            }
            _ => return None,
        };
        pool::shape_of(options, self.mapping, self.pasta.is_ok(), image.as_ref())
    }

    /// How many creates this engine served from its warm pool so far.
    pub fn warm_claims(&self) -> u64 {
        self.pool.claims()
    }

    /// The same engine, taking files of at most `bytes` in one write (default and most
    /// [`MAX_FILE_BYTES`], the agent's own bound); a larger write is refused with
    /// [`Error::FileTooLarge`] and leaves no file. Reported as
    /// [`Capabilities::max_file_bytes`](sandcove_core::Capabilities::max_file_bytes). Zero or
    /// more than [`MAX_FILE_BYTES`] is [`Error::InvalidArgument`].
    pub fn with_max_file_bytes(mut self, bytes: u64) -> Result<Self> {
        if bytes == 0 || bytes > MAX_FILE_BYTES {
            return Err(Error::invalid(format!(
                "max_file_bytes {bytes}: must be 1 to {MAX_FILE_BYTES}"
            )));
        }
        self.max_file_bytes = bytes;
        Ok(self)
    }

    /// The same engine, making new volumes with a size quota of `mib` MiB (default
    /// [`DEFAULT_VOLUME_SIZE_MIB`], 1 GiB): a sandbox's write past it fails with `ENOSPC`,
    /// and the volume never takes more host disk. Outside [`MIN_VOLUME_SIZE_MIB`] to
    /// [`MAX_VOLUME_SIZE_MIB`] it is [`Error::InvalidArgument`]. Existing volumes keep
    /// theirs.
    pub fn with_volume_size_mib(mut self, mib: u64) -> Result<Self> {
        if !(MIN_VOLUME_SIZE_MIB..=MAX_VOLUME_SIZE_MIB).contains(&mib) {
            return Err(Error::invalid(format!(
                "volume size {mib} MiB: must be {MIN_VOLUME_SIZE_MIB} to {MAX_VOLUME_SIZE_MIB}"
            )));
        }
        self.volume_size_mib = mib;
        Ok(self)
    }

    /// The same engine, bounding sandboxes it creates from now on as `bounds` says (tmpfs
    /// inodes, inotify and fanotify shares, default memory and processes) instead of
    /// [`SandboxBounds::for_host`]. Bounds that would lift a protection or that the kernel
    /// cannot take are [`Error::InvalidArgument`].
    pub fn with_sandbox_bounds(mut self, bounds: SandboxBounds) -> Result<Self> {
        bounds.validate()?;
        self.bounds = bounds;
        Ok(self)
    }

    /// What this engine bounds every sandbox it creates to.
    pub fn sandbox_bounds(&self) -> SandboxBounds {
        self.bounds
    }

    /// Volumes need a mount namespace to appear in a sandbox, so without isolation every
    /// volume call is refused before any effect, as `capabilities().volumes` says.
    fn volumes_supported(&self) -> Result<()> {
        if self.unisolated {
            return Err(Error::not_supported(
                "volumes without isolation",
                "run on a host with user namespaces, or keep shared files outside the sandbox \
                 and copy them in with the file API",
            ));
        }
        Ok(())
    }

    /// Where sandbox state lives.
    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    fn sandboxes_dir(&self) -> PathBuf {
        self.state_dir.join("sandboxes")
    }

    fn dir(&self, id: &str) -> Result<SandboxDir> {
        // An unclaimed warm-pool member is not anyone's sandbox: unknown, like a bad id.
        if !config::valid_id(id) || self.pool.hides(id) {
            return Err(Error::not_found(format!("sandbox {id:?}")));
        }
        Ok(SandboxDir::new(&self.state_dir, id))
    }

    /// Remove state directories whose monitor is gone (its lock is free), and the name
    /// entries of sandboxes that no longer exist.
    pub fn collect_stale(&self) -> usize {
        let Ok(entries) = std::fs::read_dir(self.sandboxes_dir()) else {
            return 0;
        };
        let mut collected = 0;
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                // A create in progress; abandoned ones are collected after a grace period.
                let old = entry
                    .metadata()
                    .and_then(|m| m.modified())
                    .map(|t| t.elapsed().unwrap_or_default() > Duration::from_secs(120))
                    .unwrap_or(false);
                if old && lock_is_free(&path.join("lock")) {
                    let _ = std::fs::remove_dir_all(&path);
                    collected += 1;
                }
                continue;
            }
            if lock_is_free(&path.join("lock")) {
                self.bury_sandbox(&name, "its monitor exited");
                let _ = std::fs::remove_dir_all(&path);
                collected += 1;
            }
        }
        collected += names::collect_stale(&self.state_dir);
        if let Some(h) = &self.cgroups {
            let sandboxes = self.sandboxes_dir();
            cgroup::collect_stale(h, &|id| sandboxes.join(id).exists());
        }
        collected
    }
}

/// Whether this host lets us create the namespaces a sandbox needs (a quick probe).
fn namespaces_available() -> bool {
    std::fs::read_to_string("/proc/sys/user/max_user_namespaces")
        .map(|s| s.trim() != "0")
        .unwrap_or(false)
}
