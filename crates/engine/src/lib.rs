//! The embedded local engine: rootless Linux namespaces, nothing to configure.
//!
//! ```text
//!  client program ──unix socket──► monitor (host side, detached, one per sandbox)
//!        ▲                            │ SOCK_SEQPACKET control + SCM_RIGHTS handoff
//!        └──── same connection ────► agent (PID 1 in user/mount/pid/uts/ipc/net namespaces)
//! ```
//!
//! [`LocalBackend::create`] writes the sandbox's record into a fresh state directory and asks
//! the program's monitor spawner (`spawner.rs`: the running binary re-executed once, caught
//! before `main` by a constructor hook in `entry.rs`, so any program linking `sandcove` works
//! with no setup) to fork the sandbox's monitor. The monitor clones the
//! agent into new namespaces, writes its uid/gid maps, and serves clients of the same user on a
//! socket in the state directory: lifecycle requests itself, everything else by handing the
//! client's connection to the agent. Sandboxes outlive the program that created them; each
//! ends at its lease, on destroy, or with its monitor.
//!
//! This crate (`sandcove-engine`) is re-exported as `sandcove::backend::local`; the agent
//! protocol and the preview proxy it shares with the Kubernetes backend are `sandcove-agent`.

pub(crate) mod agent;
pub mod agent_server;
mod bounds;
mod cgroup;
pub(crate) mod config;
mod entry;
mod files;
mod landlock;
mod locale;
mod monitor;
mod names;
mod net;
mod pool;
mod quiet;
mod refs;
mod seccomp;
mod spawner;
mod statedir;
mod sys;
mod volume_holder;
mod volumes;

// The agent protocol and the preview proxy, shared with the Kubernetes backend, under the
// paths the engine's modules name them by.
pub(crate) use sandcove_agent::{preview, proto};

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;

use self::config::{Record, SandboxDir, UidMapping};
use self::proto::{AgentRequest, Hello, MonitorReply, MonitorRequest};
use self::quiet::QuietStream;
use sandcove_agent::client::{AgentDialer, AgentIo, ConnPool, RemoteAgent};
use sandcove_core::{
    now_millis, AnnotationUpdate, Capabilities, CreateOptions, Error, FileStat, ListDirOptions,
    ListOptions, Metrics, MkdirOptions, Preview, PreviewOptions, PreviewToken, ProcessInfo,
    ProcessSelector, ProcessSpec, PtySize, RemoveOptions, Result, SandboxInfo, SandboxState,
    Signal, SnapshotInfo, VolumeInfo, WatchOptions, WriteOptions, DEFAULT_OUTPUT_LIMIT,
    DEFAULT_TIMEOUT,
};
use sandcove_core::{Backend, ByteStream, ProcessStream, WatchStream};
use sandcove_core::{CopyOptions, ReadOptions, RenameOptions, StatOptions};

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
        };
        backend.collect_stale();
        Ok(backend)
    }

    /// Use `helper` as the user-mode networking helper (`pasta`) for
    /// [`NetworkPolicy::Internet`](sandcove_core::NetworkPolicy::Internet), or none. By default it is
    /// `$SANDCOVE_PASTA` when set (empty: none), else `pasta` from the system directories;
    /// [`Capabilities::internet`] says whether it is usable.
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
    /// pool fills in the background from the first `create` on; sandboxes of the default
    /// shape (any name, envs, labels, user, lease and annotations) are then claimed from it,
    /// every other shape is created cold. Members are never listed and end at a short lease
    /// ([`MEMBER_LEASE`]) when the program exits. Without isolation there is no pool.
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

    /// How many creates this engine served from its warm pool so far.
    pub fn warm_claims(&self) -> u64 {
        self.pool.claims()
    }

    /// This engine without a pool: what the pool's own task makes members with (holding
    /// the pool itself would keep it alive forever).
    fn without_pool(&self) -> Self {
        let mut engine = self.clone();
        engine.pool = std::sync::Arc::new(pool::Pool::new(0));
        engine
    }

    /// Make a pool member: the default shape, lease `lease`, hidden from `list`. Returns its
    /// id and lease end.
    async fn create_member(&self, lease: Duration) -> Result<(String, u64)> {
        let info = self
            .create_cold(CreateOptions::default().timeout(lease), true)
            .await?;
        Ok((info.id, info.ends_at))
    }

    /// Destroy a pool member.
    async fn destroy_member(&self, id: &str) -> Result<()> {
        self.destroy(id).await
    }

    /// The sandbox's users under `options` (default user first).
    fn users_for(&self, options: &CreateOptions) -> Vec<sandcove_core::UserInfo> {
        let default_name = options
            .user
            .clone()
            .unwrap_or_else(|| config::DEFAULT_USER_NAME.into());
        self.mapping.users(
            &default_name,
            options
                .home
                .as_deref()
                .unwrap_or(sandcove_core::SANDBOX_HOME),
        )
    }

    /// Hand warm member `id` to a create with `options` (a shape the pool serves). `Ok(None)`:
    /// the member could not be used (it is destroyed) and the create goes cold.
    async fn claim(&self, id: &str, options: &CreateOptions) -> Result<Option<SandboxInfo>> {
        // The name first: a name held elsewhere fails this create as a cold one would, and
        // leaves the member untouched for the next claim.
        if let Some(name) = options.name.clone() {
            let (state_dir, member) = (self.state_dir.clone(), id.to_string());
            let taken =
                tokio::task::spawn_blocking(move || names::claim(&state_dir, &name, &member))
                    .await
                    .map_err(|e| Error::backend(format!("create task failed: {e}")))?;
            if let Err(e) = taken {
                self.pool.put_back(id.to_string());
                return Err(e);
            }
        }
        let users = self.users_for(options);
        // One round trip: the monitor takes its half, answers, and hands the connection to
        // the agent, which reads its half (sent in the same write) and answers on it.
        let applied = async {
            let mut stream = self.connect(id).await?;
            let hello = Hello {
                version: PROTOCOL_VERSION,
                request: Some(MonitorRequest::Claim {
                    options: Box::new(options.clone()),
                    users: users.clone(),
                    handoff: true,
                }),
                while_paused: false,
                token: None,
            };
            let apply = AgentRequest::ApplyClaim {
                options: Box::new(options.clone()),
                users,
            };
            let mut buf = Vec::new();
            proto::write_frame(&mut buf, &hello, &[]).await?;
            proto::write_frame(&mut buf, &apply, &[]).await?;
            stream
                .write_all(&buf)
                .await
                .map_err(|e| Error::from_io(&e, "claim"))?;
            let info = match proto::read_frame::<_, MonitorReply>(&mut stream).await? {
                Some((MonitorReply::Info { info }, _)) => *info,
                Some((MonitorReply::Error { error }, _)) => {
                    return Err(proto::remote_error(&error))
                }
                Some((other, _)) => return Err(unexpected(&other)),
                None => return Err(Error::backend("the claim ended without a reply")),
            };
            match proto::read_frame::<_, proto::AgentReply>(&mut stream).await? {
                Some((proto::AgentReply::Done, _)) => {}
                Some((proto::AgentReply::Error { error }, _)) => {
                    return Err(proto::remote_error(&error))
                }
                Some((other, _)) => return Err(unexpected(&other)),
                None => return Err(Error::backend("the agent ended the claim without a reply")),
            }
            // The connection is the agent's now, its request ended cleanly: the claimer's
            // first call goes on it.
            self.conns.put(id, Box::new(stream));
            Ok(info)
        }
        .await;
        match applied {
            Ok(info) => {
                self.pool.claimed();
                Ok(Some(info))
            }
            Err(e) => {
                tracing::debug!("warm sandbox {id} not claimed ({e}): creating cold");
                let _ = self.destroy(id).await;
                if let Some(name) = &options.name {
                    let (state_dir, name, member) =
                        (self.state_dir.clone(), name.clone(), id.to_string());
                    let _ = tokio::task::spawn_blocking(move || {
                        names::release(&state_dir, &name, &member)
                    })
                    .await;
                }
                Ok(None)
            }
        }
    }

    /// The same engine, taking files of at most `bytes` in one write (default and most
    /// [`MAX_FILE_BYTES`], the agent's own bound); a larger write is refused with
    /// [`Error::FileTooLarge`] and leaves no file. Reported as
    /// [`Capabilities::max_file_bytes`]. Zero or more than [`MAX_FILE_BYTES`] is
    /// [`Error::InvalidArgument`].
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

    /// Record the end of sandbox `id` (blocking; best effort: without it a reference answers
    /// not-found instead of destroyed).
    fn bury_sandbox(&self, id: &str, reason: &str) {
        if !config::valid_id(id) {
            return;
        }
        let tombstone =
            sandcove_core::Tombstone::now(sandcove_core::ResourceKind::Sandbox, id, reason);
        if let Err(e) = refs::record(&self.state_dir, &tombstone) {
            tracing::warn!("no tombstone for sandbox {id}: {e}");
        }
    }

    /// Record the end of a resource, off the event loop (best effort, as `bury_sandbox`).
    async fn bury(&self, kind: sandcove_core::ResourceKind, id: String, reason: &'static str) {
        let state_dir = self.state_dir.clone();
        let tombstone = sandcove_core::Tombstone::now(kind, id, reason);
        let done = tokio::task::spawn_blocking(move || refs::record(&state_dir, &tombstone)).await;
        if let Ok(Err(e)) | Err(e) = done.map_err(|e| Error::backend(e.to_string())) {
            tracing::warn!("no tombstone for a {kind}: {e}");
        }
    }

    fn snapshots_dir(&self) -> PathBuf {
        self.state_dir.join("snapshots")
    }

    /// `(metadata, archive)` paths of a snapshot id.
    fn snapshot_paths(&self, snapshot_id: &str) -> Result<(PathBuf, PathBuf)> {
        if !config::valid_id(snapshot_id) {
            return Err(Error::not_found(format!("snapshot {snapshot_id:?}")));
        }
        let dir = self.snapshots_dir();
        Ok((
            dir.join(format!("{snapshot_id}.json")),
            dir.join(format!("{snapshot_id}.tar")),
        ))
    }

    /// Stream the sandbox's filesystem into a new snapshot, at most [`snapshot_limit`] bytes
    /// for a sandbox of `disk_mib` MiB: a larger archive is refused with
    /// [`Error::FileTooLarge`] and nothing of it is kept. The agent's `tar` stores sparse
    /// files sparse, but the bound is counted here, on the host side, whatever the sandbox
    /// streams.
    async fn capture(&self, id: &str, name: Option<String>, disk_mib: u64) -> Result<SnapshotInfo> {
        use tokio::io::AsyncWriteExt as _;
        let snapshot_id = format!("snap-{}", config::new_id());
        let (meta, tar) = self.snapshot_paths(&snapshot_id)?;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(self.snapshots_dir())
            .map_err(|e| Error::from_io(&e, "snapshot directory"))?;
        let partial = tar.with_extension("partial");
        let mut file = tokio::fs::File::create(&partial)
            .await
            .map_err(|e| Error::from_io(&e, "snapshot file"))?;
        let mut size = 0u64;
        let limit = snapshot_limit(disk_mib);
        let result: Result<()> = async {
            let mut archive = self.agent(id)?.while_paused().export_fs().await?;
            while let Some(chunk) = archive.next().await {
                let chunk = chunk?;
                size += chunk.len() as u64;
                if size > limit {
                    // Dropping the stream ends the agent's `tar`.
                    return Err(Error::FileTooLarge {
                        what: format!("the snapshot of sandbox {id}"),
                        limit,
                        remedy: format!(
                            "its files take more than its disk size ({disk_mib} MiB) allows; \
                             remove files, or keep large data in a volume"
                        ),
                    });
                }
                file.write_all(&chunk)
                    .await
                    .map_err(|e| Error::from_io(&e, "snapshot file"))?;
            }
            file.flush()
                .await
                .map_err(|e| Error::from_io(&e, "snapshot file"))
        }
        .await;
        drop(file);
        if let Err(e) = result {
            let _ = std::fs::remove_file(&partial);
            return Err(e);
        }
        if let Err(e) = std::fs::rename(&partial, &tar) {
            let _ = std::fs::remove_file(&partial);
            return Err(Error::from_io(&e, "snapshot file"));
        }
        let info = SnapshotInfo {
            id: snapshot_id,
            name,
            sandbox_id: id.to_string(),
            created_at: now_millis(),
            size,
            source_resume_error: None,
        };
        let text = serde_json::to_vec_pretty(&info)
            .map_err(|e| Error::backend(format!("encode snapshot: {e}")))?;
        if let Err(e) = std::fs::write(&meta, text) {
            // No snapshot without its metadata: nothing half-made stays behind.
            let _ = std::fs::remove_file(&meta);
            let _ = std::fs::remove_file(&tar);
            return Err(Error::from_io(&e, "snapshot metadata"));
        }
        Ok(info)
    }

    /// Unpack a snapshot archive into a fresh sandbox.
    async fn restore(&self, id: &str, tar: &Path) -> Result<()> {
        let file = tokio::fs::File::open(tar)
            .await
            .map_err(|e| Error::from_io(&e, "snapshot file"))?;
        let chunks = futures::stream::unfold(Some(file), |state| async move {
            use tokio::io::AsyncReadExt as _;
            let mut file = state?;
            let mut buf = vec![0u8; proto::CHUNK];
            match file.read(&mut buf).await {
                Ok(0) => None,
                Ok(n) => {
                    buf.truncate(n);
                    Some((Ok(buf), Some(file)))
                }
                Err(e) => Some((Err(Error::from_io(&e, "snapshot file")), None)),
            }
        });
        self.agent(id)?.import_fs(Box::pin(chunks)).await
    }

    /// Connect to a sandbox's monitor, or report the sandbox missing.
    async fn connect(&self, id: &str) -> Result<UnixStream> {
        connect_monitor(&self.dir(id)?, id).await
    }

    /// Send a request the monitor answers and read its one reply.
    async fn monitor_call(&self, id: &str, request: MonitorRequest) -> Result<MonitorReply> {
        self.monitor_call_as(id, request, PROTOCOL_VERSION).await
    }

    /// [`Self::monitor_call`] speaking protocol `version` (only for the requests every version
    /// encodes alike, [`proto::FROZEN_OPS`]).
    async fn monitor_call_as(
        &self,
        id: &str,
        request: MonitorRequest,
        version: u32,
    ) -> Result<MonitorReply> {
        let mut stream = self.connect(id).await?;
        let hello = Hello {
            version,
            request: Some(request),
            while_paused: false,
            token: None,
        };
        let result = async {
            proto::write_frame(&mut stream, &hello, &[]).await?;
            match proto::read_frame::<_, MonitorReply>(&mut stream).await? {
                Some((MonitorReply::Error { error }, _)) => Err(proto::remote_error(&error)),
                Some((reply, _)) => Ok(reply),
                None => Err(Error::not_found(format!("sandbox {id:?}"))),
            }
        }
        .await;
        result.map_err(|e| match e {
            Error::Backend { .. } => self.or_gone(id, e),
            other => other,
        })
    }

    /// A monitor request answered with the sandbox's info.
    async fn monitor_info(&self, id: &str, request: MonitorRequest) -> Result<SandboxInfo> {
        match self.monitor_call(id, request).await? {
            MonitorReply::Info { info } => Ok(*info),
            other => Err(unexpected(&other)),
        }
    }

    /// A client of sandbox `id`'s agent, reached through its monitor's socket.
    fn agent(&self, id: &str) -> Result<RemoteAgent> {
        let dir = self.dir(id)?;
        let dialer = MonitorDialer {
            dir,
            id: id.to_string(),
        };
        Ok(RemoteAgent::without_token(
            id,
            std::sync::Arc::new(dialer),
            self.conns.clone(),
        ))
    }

    /// An agent call's result, with a broken connection to a sandbox that went away under it
    /// reported as `NotFound`.
    fn checked<T>(&self, id: &str, result: Result<T>) -> Result<T> {
        result.map_err(|e| match e {
            Error::Backend { .. } => self.or_gone(id, e),
            other => other,
        })
    }
}

/// Dials a sandbox's monitor, which hands the connection to the agent.
#[derive(Debug)]
struct MonitorDialer {
    dir: SandboxDir,
    id: String,
}

#[async_trait]
impl AgentDialer for MonitorDialer {
    async fn dial(&self) -> Result<Box<dyn AgentIo>> {
        let stream = connect_monitor(&self.dir, &self.id).await?;
        let quiet = stream
            .into_std()
            .and_then(QuietStream::new)
            .map_err(|e| Error::from_io(&e, "agent connection"))?;
        Ok(Box::new(quiet))
    }
}

impl LocalBackend {
    /// Whether sandbox `id` no longer exists (its directory is gone or its monitor is dead).
    fn is_gone(&self, id: &str) -> bool {
        match self.dir(id) {
            Ok(dir) => !dir.dir.exists() || !dir.socket().exists() || lock_is_free(&dir.lock()),
            Err(_) => true,
        }
    }

    /// Turn a connection failure on an existing connection into `NotFound` when the sandbox
    /// went away under it (destroyed, or its lease ended).
    fn or_gone(&self, id: &str, err: Error) -> Error {
        if !err.is_not_found() && self.is_gone(id) {
            Error::not_found(format!("sandbox {id:?}"))
        } else {
            err
        }
    }
}

/// Connect to a sandbox's monitor, or report the sandbox missing.
async fn connect_monitor(dir: &SandboxDir, id: &str) -> Result<UnixStream> {
    match UnixStream::connect(dir.socket()).await {
        Ok(s) => {
            // This connection is handed to the agent and carries file bodies both ways.
            sys::grow_socket_buffers(&s);
            Ok(s)
        }
        Err(e) => {
            if lock_is_free(&dir.lock()) {
                let _ = std::fs::remove_dir_all(&dir.dir);
                return Err(Error::not_found(format!("sandbox {id:?}")));
            }
            if dir.dir.exists() && !dir.socket().exists() {
                // Being destroyed right now.
                return Err(Error::not_found(format!("sandbox {id:?}")));
            }
            Err(Error::Backend {
                message: format!("cannot reach sandbox {id:?}: {e}"),
                retryable: true,
            })
        }
    }
}

fn lock_is_free(path: &Path) -> bool {
    match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => sys::try_lock_exclusive(f.as_fd()).unwrap_or(false),
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    }
}

fn unexpected(reply: &impl std::fmt::Debug) -> Error {
    Error::backend(format!("protocol error: unexpected reply {reply:?}"))
}

/// What a monitor reports for its record and state.
pub(crate) fn info_of(record: &Record, state: SandboxState) -> SandboxInfo {
    SandboxInfo {
        id: record.id.clone(),
        name: record.options.name.clone(),
        state,
        template: record
            .options
            .template
            .clone()
            .unwrap_or_else(|| "base".into()),
        labels: record.options.labels.clone(),
        envs: record.options.envs.clone(),
        resources: record.options.resources.clone(),
        network: record.options.network.clone(),
        user: record.default_user().clone(),
        created_at: record.created_at,
        ends_at: record.ends_at,
        on_timeout: record.options.on_timeout,
        auto_resume: record.options.auto_resume,
        volumes: record.options.volumes.clone(),
        snapshot: record.options.snapshot.clone(),
        annotations: record.options.annotations.clone(),
        note: None,
        source_resume_error: None,
    }
}

/// The protocol version of the build that created the sandbox in `dir`, from its record (v1
/// for records that predate the field); ours when the record cannot be read, so the monitor
/// answers for itself.
async fn peer_protocol(dir: &SandboxDir) -> u32 {
    let Ok(text) = tokio::fs::read(dir.record()).await else {
        return PROTOCOL_VERSION;
    };
    match serde_json::from_slice::<serde_json::Value>(&text) {
        Ok(record) => record
            .get("protocol")
            .and_then(|v| v.as_u64())
            .and_then(|v| u32::try_from(v).ok())
            .unwrap_or(proto::FIRST_PROTOCOL_VERSION),
        Err(_) => PROTOCOL_VERSION,
    }
}

/// What `list` and `get` say about a sandbox whose monitor speaks protocol `peer`.
fn protocol_note(peer: u32) -> Option<String> {
    (peer != PROTOCOL_VERSION).then(|| {
        format!(
            "created by a Sandcove version speaking engine protocol v{peer} (this one speaks \
             v{PROTOCOL_VERSION}): it can be listed, read and destroyed here, nothing else; \
             recreate it, or use a Sandcove version speaking v{peer}"
        )
    })
}

/// Whether this host lets us create the namespaces a sandbox needs (a quick probe).
fn namespaces_available() -> bool {
    std::fs::read_to_string("/proc/sys/user/max_user_namespaces")
        .map(|s| s.trim() != "0")
        .unwrap_or(false)
}

/// The engine's own checks after the shared ones ([`CreateOptions::validate`]): its one
/// template and the resources its cgroups can enforce.
fn check_create(options: &CreateOptions, cgroups: bool) -> Result<()> {
    options.validate()?;
    if !sandcove_core::capability::is_host_base(options.template.as_deref()) {
        return Err(Error::not_supported(
            format!(
                "template or image {:?}",
                options.template.as_deref().unwrap_or_default()
            ),
            sandcove_core::capability::HOST_BASE_ALTERNATIVE,
        ));
    }
    cgroup::check(&options.resources, cgroups)
}

/// The largest snapshot archive of a sandbox whose disk is `disk_mib` MiB: the data its disk
/// holds (sparse files are archived without their holes) and an allowance for `tar`'s
/// headers, an eighth of the disk and at least 1 MiB (each entry takes 512 bytes or more
/// whatever its size, so very many empty files can reach it first).
pub(crate) fn snapshot_limit(disk_mib: u64) -> u64 {
    let disk = disk_mib.saturating_mul(1 << 20);
    disk.saturating_add((disk / 8).max(1 << 20))
}

/// A snapshot's result once its source was resumed: a capture error wins; a snapshot taken
/// whose source then failed to resume is still returned (it exists and the caller needs its
/// id), carrying the resume error.
fn snapshot_outcome(captured: Result<SnapshotInfo>, resumed: Result<()>) -> Result<SnapshotInfo> {
    let mut info = captured?;
    if let Err(e) = resumed {
        info.source_resume_error = Some(e.to_string());
    }
    Ok(info)
}

/// A fork's result: a create error wins; a fork made whose source then failed to resume is
/// still returned (it exists and the caller needs its id), carrying the resume error, as a
/// snapshot's is.
fn fork_outcome(
    created: Result<SandboxInfo>,
    source_resume_error: Option<String>,
) -> Result<SandboxInfo> {
    let mut info = created?;
    info.source_resume_error = source_resume_error;
    Ok(info)
}

/// What a sandbox without isolation cannot honour, refused before any effect (see
/// `capabilities()`): volumes, snapshots, pausing (a lease that pauses, auto-resume), a
/// per-sandbox process limit (`RLIMIT_NPROC` counts every process of the host user) and a
/// disk size (there is no sandbox filesystem to size).
fn check_unisolated(options: &CreateOptions) -> Result<()> {
    let refused = if !options.volumes.is_empty() || options.snapshot.is_some() {
        "volumes and snapshots"
    } else if options.on_timeout == sandcove_core::TimeoutAction::Pause || options.auto_resume {
        "pausing (on_timeout: Pause, auto_resume)"
    } else if options.resources.max_processes.is_some() {
        "a per-sandbox process limit (max_processes)"
    } else if options.resources.disk_mib.is_some() {
        "a disk size (disk_mib)"
    } else {
        return Ok(());
    };
    Err(Error::not_supported(
        format!("{refused} without isolation"),
        "run on a host with user namespaces",
    ))
}

impl LocalBackend {
    /// Create a sandbox the slow way: a fresh monitor, namespaces and root. `pooled` marks
    /// a warm-pool member (hidden from `list` until claimed).
    async fn create_cold(&self, options: CreateOptions, pooled: bool) -> Result<SandboxInfo> {
        let id = config::new_id();
        let default_name = options
            .user
            .clone()
            .unwrap_or_else(|| config::DEFAULT_USER_NAME.into());
        if self.unisolated {
            check_unisolated(&options)?;
        }
        let pasta = match options.network {
            sandcove_core::NetworkPolicy::Internet if self.unisolated => {
                return Err(Error::not_supported(
                    "internet access without isolation",
                    "run on a host with user namespaces (the sandbox needs its own network \
                     namespace), or use NetworkPolicy::Host knowingly",
                ))
            }
            sandcove_core::NetworkPolicy::Internet => match &self.pasta {
                Ok(path) => Some(path.to_string_lossy().into_owned()),
                Err(reason) => return Err(net::unavailable(reason)),
            },
            _ => None,
        };
        let mounts = volumes::mounts_for(self, &options.volumes)?;
        let snapshot = match &options.snapshot {
            Some(snap) => Some(self.snapshot_paths(snap)?.1),
            None => None,
        };
        if let Some(tar) = &snapshot {
            if !tar.exists() {
                return Err(Error::not_found(format!(
                    "snapshot {:?}",
                    options.snapshot.clone().unwrap_or_default()
                )));
            }
        }
        let now = now_millis();
        let timeout = options.timeout.unwrap_or(DEFAULT_TIMEOUT);
        let mapping = if self.unisolated {
            UidMapping::Single {
                host_uid: sys::geteuid(),
                host_gid: sys::getegid(),
            }
        } else {
            self.mapping
        };
        let cgroup = self.cgroups.clone().map(|hierarchy| cgroup::Plan {
            hierarchy,
            limits: cgroup::Limits {
                memory_mib: options
                    .resources
                    .memory_mib
                    .unwrap_or(self.bounds.default_memory_mib),
                cpu: options.resources.cpu,
                pids: options
                    .resources
                    .max_processes
                    .unwrap_or(self.bounds.default_max_processes),
            },
        });
        let mut users = mapping.users(
            &default_name,
            options
                .home
                .as_deref()
                .unwrap_or(sandcove_core::SANDBOX_HOME),
        );
        if self.unisolated {
            // No user namespace: the sandbox user is the host user running the engine.
            for user in &mut users {
                (user.uid, user.gid) = (sys::geteuid(), sys::getegid());
            }
        }
        let record = Record {
            id: id.clone(),
            users,
            mapping,
            options,
            created_at: now,
            ends_at: now + timeout.as_millis() as u64,
            unisolated: self.unisolated,
            landlock_optional: self.landlock_optional,
            cgroup,
            notes: Default::default(),
            preview_limits: self.preview_limits,
            mounts,
            root_prefix: self.unisolated.then(|| {
                SandboxDir::new(&self.state_dir, &id)
                    .dir
                    .join("root")
                    .to_string_lossy()
                    .into_owned()
            }),
            pasta,
            protocol: PROTOCOL_VERSION,
            pooled,
            locale: None,
            bounds: self.bounds,
        };
        let (state_dir, locale_dir) = (self.state_dir.clone(), self.locale.clone());
        let info = info_of(&record, SandboxState::Running);
        let first = tokio::task::spawn_blocking(move || {
            let mut record = record;
            if !record.unisolated {
                record.locale = locale_dir
                    .get_or_init(|| locale::prepare(&state_dir))
                    .as_ref()
                    .map(|dir| dir.to_string_lossy().into_owned());
            }
            start_monitor(&state_dir, &record)
        })
        .await
        .map_err(|e| Error::backend(format!("create task failed: {e}")))??;
        // The creator's first call goes on the connection that came with the report.
        if let Some(conn) = first.and_then(|fd| agent_stream(fd).ok()) {
            self.conns.put(&id, Box::new(conn));
        }
        if let Some(tar) = snapshot {
            if let Err(e) = self.restore(&id, &tar).await {
                let _ = self.destroy(&id).await;
                return Err(e);
            }
        }
        Ok(info)
    }
}

#[async_trait]
impl Backend for LocalBackend {
    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::none("local");
        caps.isolated = !self.unisolated;
        caps.multiple_users = self.mapping == UidMapping::Range && !self.unisolated;
        caps.persistent_sandboxes = true;
        caps.host_network = true;
        caps.internet = !self.unisolated && self.pasta.is_ok();
        caps.process_limit = !self.unisolated;
        caps.max_file_bytes = self.max_file_bytes;
        caps.output_limit = DEFAULT_OUTPUT_LIMIT as u64;
        caps.pause = !self.unisolated;
        caps.previews = true;
        caps.snapshots = !self.unisolated;
        caps.volumes = !self.unisolated;
        caps.watch = true;
        caps.pty = true;
        caps.metrics = true;
        caps.memory_limit = self.cgroups.is_some();
        caps.cpu_limit = self.cgroups.is_some();
        caps.templates = sandcove_core::capability::HOST_BASE_TEMPLATES
            .iter()
            .map(|t| t.to_string())
            .collect();
        caps.lease = Some(sandcove_core::capability::LeaseBounds::engine());
        caps.observed_at = Some(self.probed_at);
        caps.runtime_id = Some(self.runtime_id.clone());
        caps
    }

    #[tracing::instrument(level = "debug", skip_all, err(level = "debug"))]
    async fn ready(&self) -> Result<Capabilities> {
        Ok(self.capabilities())
    }

    #[tracing::instrument(level = "debug", skip_all, err(level = "debug"))]
    async fn create(&self, options: CreateOptions) -> Result<SandboxInfo> {
        check_create(&options, self.cgroups.is_some())?;
        if !self.unisolated && pool::serves(&options, self.mapping) {
            if let Some(id) = self.pool.take(self) {
                let claimed = pool::as_pool_work(self.claim(&id, &options)).await;
                if claimed.is_ok() {
                    // Handed out, or destroyed; an error put it back, still hidden.
                    self.pool.release(&id);
                }
                if let Some(info) = claimed? {
                    return Ok(info);
                }
            }
        }
        self.create_cold(options, false).await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn get(&self, id: &str) -> Result<SandboxInfo> {
        // A monitor of another version is asked in its own version (`info` never changes).
        let peer = peer_protocol(&self.dir(id)?).await;
        match self.monitor_call_as(id, MonitorRequest::Info, peer).await? {
            MonitorReply::Info { mut info } => {
                info.note = protocol_note(peer);
                Ok(*info)
            }
            other => Err(unexpected(&other)),
        }
    }

    #[tracing::instrument(level = "debug", skip_all, err(level = "debug"))]
    async fn list(&self, options: ListOptions) -> Result<Vec<SandboxInfo>> {
        let dir = self.sandboxes_dir();
        let mut out = Vec::new();
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Ok(out);
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || !config::valid_id(&name) {
                continue;
            }
            let sdir = SandboxDir::new(&self.state_dir, &name);
            if lock_is_free(&sdir.lock()) {
                self.bury_sandbox(&name, "its monitor exited");
                let _ = std::fs::remove_dir_all(&sdir.dir);
                continue;
            }
            let Ok(text) = std::fs::read(sdir.info()) else {
                continue;
            };
            let Ok(mut info) = serde_json::from_slice::<SandboxInfo>(&text) else {
                continue;
            };
            info.note = protocol_note(peer_protocol(&sdir).await);
            if info.ends_at <= now_millis() || info.state == SandboxState::Destroyed {
                continue;
            }
            if options.matches(&info) {
                out.push(info);
            }
        }
        out.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        Ok(out)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn set_timeout(&self, id: &str, timeout: Duration) -> Result<SandboxInfo> {
        sandcove_core::validate::validate_sandbox_timeout(timeout)?;
        self.monitor_info(
            id,
            MonitorRequest::SetTimeout {
                secs: timeout.as_secs_f64(),
            },
        )
        .await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn set_labels(
        &self,
        id: &str,
        labels: std::collections::BTreeMap<String, String>,
    ) -> Result<SandboxInfo> {
        sandcove_core::validate::validate_labels(&labels)?;
        self.monitor_info(id, MonitorRequest::SetLabels { labels })
            .await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn update_annotations(
        &self,
        id: &str,
        update: AnnotationUpdate,
    ) -> Result<std::collections::BTreeMap<String, String>> {
        // Bad keys are refused here too, before the sandbox is contacted.
        update.validate()?;
        match self
            .monitor_call(id, MonitorRequest::UpdateAnnotations { update })
            .await?
        {
            MonitorReply::Annotations { annotations } => Ok(annotations),
            other => Err(unexpected(&other)),
        }
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn destroy(&self, id: &str) -> Result<()> {
        // The agent retires pooled connections itself (or dies with them); this only frees
        // the descriptors early.
        self.conns.forget(id);
        // Any version's monitor destroys on the same request, so nothing another build made
        // leaks.
        let peer = peer_protocol(&self.dir(id)?).await;
        match self
            .monitor_call_as(id, MonitorRequest::Destroy, peer)
            .await
        {
            Ok(MonitorReply::Done) => Ok(()),
            Ok(other) => Err(unexpected(&other)),
            Err(e) => Err(e),
        }
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn spawn(&self, id: &str, spec: ProcessSpec) -> Result<ProcessStream> {
        spec.validate()?;
        let agent = self.agent(id)?;
        self.checked(id, agent.spawn(spec).await)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn attach(&self, id: &str, process: ProcessSelector) -> Result<ProcessStream> {
        let agent = self.agent(id)?;
        self.checked(id, agent.attach(process).await)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn write_stdin(&self, id: &str, process: ProcessSelector, data: Vec<u8>) -> Result<()> {
        let agent = self.agent(id)?;
        self.checked(id, agent.write_stdin(process, data).await)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn close_stdin(&self, id: &str, process: ProcessSelector) -> Result<()> {
        let agent = self.agent(id)?;
        self.checked(id, agent.close_stdin(process).await)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn signal(&self, id: &str, process: ProcessSelector, signal: Signal) -> Result<()> {
        let agent = self.agent(id)?;
        self.checked(id, agent.signal(process, signal).await)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn list_processes(&self, id: &str) -> Result<Vec<ProcessInfo>> {
        let agent = self.agent(id)?;
        self.checked(id, agent.list_processes().await)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn read_file(&self, id: &str, path: &str, options: ReadOptions) -> Result<ByteStream> {
        let agent = self.agent(id)?;
        self.checked(id, agent.read_file(path, options).await)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn write_file(
        &self,
        id: &str,
        path: &str,
        data: ByteStream,
        options: WriteOptions,
    ) -> Result<FileStat> {
        // The engine's configured bound, where it is tighter than the caller's: the agent
        // enforces whichever bound the request carries.
        let mut options = options;
        let engine_bound = self.max_file_bytes < MAX_FILE_BYTES
            && options.max_bytes.is_none_or(|m| m > self.max_file_bytes);
        if engine_bound {
            options.max_bytes = Some(self.max_file_bytes);
        }
        let agent = self.agent(id)?;
        match self.checked(id, agent.write_file(path, data, options).await) {
            Err(Error::FileTooLarge { what, limit, .. }) if engine_bound => {
                Err(Error::FileTooLarge {
                    what,
                    limit,
                    remedy: "the engine's largest file (its configured max_file_bytes, \
                             Capabilities::max_file_bytes); split it or configure a larger bound"
                        .into(),
                })
            }
            other => other,
        }
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn list_dir(
        &self,
        id: &str,
        path: &str,
        options: ListDirOptions,
    ) -> Result<Vec<FileStat>> {
        let agent = self.agent(id)?;
        self.checked(id, agent.list_dir(path, options).await)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn stat(&self, id: &str, path: &str, options: StatOptions) -> Result<FileStat> {
        let agent = self.agent(id)?;
        self.checked(id, agent.stat(path, options).await)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn mkdir(&self, id: &str, path: &str, options: MkdirOptions) -> Result<FileStat> {
        let agent = self.agent(id)?;
        self.checked(id, agent.mkdir(path, options).await)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn remove(&self, id: &str, path: &str, options: RemoveOptions) -> Result<()> {
        let agent = self.agent(id)?;
        self.checked(id, agent.remove(path, options).await)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn rename(
        &self,
        id: &str,
        from: &str,
        to: &str,
        options: RenameOptions,
    ) -> Result<FileStat> {
        let agent = self.agent(id)?;
        self.checked(id, agent.rename(from, to, options).await)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn copy(&self, id: &str, from: &str, to: &str, options: CopyOptions) -> Result<FileStat> {
        let agent = self.agent(id)?;
        self.checked(id, agent.copy(from, to, options).await)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn chmod(&self, id: &str, path: &str, mode: u32) -> Result<FileStat> {
        let agent = self.agent(id)?;
        self.checked(id, agent.chmod(path, mode).await)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn pause(&self, id: &str) -> Result<SandboxInfo> {
        self.conns.forget(id);
        self.monitor_info(id, MonitorRequest::Pause).await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn resume(&self, id: &str) -> Result<SandboxInfo> {
        self.monitor_info(id, MonitorRequest::Resume).await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn stop(&self, id: &str) -> Result<SandboxInfo> {
        self.conns.forget(id);
        self.monitor_info(id, MonitorRequest::Stop).await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn start(&self, id: &str) -> Result<SandboxInfo> {
        self.monitor_info(id, MonitorRequest::Start).await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn metrics(&self, id: &str) -> Result<Metrics> {
        let agent = self.agent(id)?;
        self.checked(id, agent.metrics().await)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn resize_pty(&self, id: &str, process: ProcessSelector, size: PtySize) -> Result<()> {
        let agent = self.agent(id)?;
        self.checked(id, agent.resize_pty(process, size).await)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn watch(&self, id: &str, path: &str, options: WatchOptions) -> Result<WatchStream> {
        let agent = self.agent(id)?;
        self.checked(id, agent.watch(path, options).await)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn expose_port(&self, id: &str, options: PreviewOptions) -> Result<Preview> {
        sandcove_core::validate::validate_token_ttl(options.token_ttl)?;
        match self
            .monitor_call(id, MonitorRequest::Expose { options })
            .await?
        {
            MonitorReply::Preview { preview } => Ok(preview),
            other => Err(unexpected(&other)),
        }
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn list_previews(&self, id: &str) -> Result<Vec<Preview>> {
        match self.monitor_call(id, MonitorRequest::ListPreviews).await? {
            MonitorReply::Previews { previews } => Ok(previews),
            other => Err(unexpected(&other)),
        }
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn close_preview(&self, id: &str, port: u16) -> Result<()> {
        match self
            .monitor_call(id, MonitorRequest::ClosePreview { port })
            .await?
        {
            MonitorReply::Done => {
                self.bury(
                    sandcove_core::ResourceKind::Preview,
                    format!("{id}:{port}"),
                    "closed",
                )
                .await;
                Ok(())
            }
            other => Err(unexpected(&other)),
        }
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn create_preview_token(
        &self,
        id: &str,
        port: u16,
        expires_at: Option<u64>,
    ) -> Result<PreviewToken> {
        sandcove_core::validate::validate_token_expiry(expires_at, now_millis())?;
        match self
            .monitor_call(id, MonitorRequest::CreateToken { port, expires_at })
            .await?
        {
            MonitorReply::Token { token } => Ok(token),
            other => Err(unexpected(&other)),
        }
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn revoke_preview_token(&self, id: &str, port: u16, token: &str) -> Result<()> {
        let request = MonitorRequest::RevokeToken {
            port,
            token: token.to_string(),
        };
        match self.monitor_call(id, request).await? {
            MonitorReply::Done => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn snapshot(&self, id: &str, name: Option<String>) -> Result<SnapshotInfo> {
        if self.unisolated {
            return Err(Error::not_supported(
                "snapshots without isolation",
                "run on a host with user namespaces",
            ));
        }
        let info = self.get(id).await?;
        let was_running = info.state == SandboxState::Running;
        if was_running {
            self.pause(id).await?;
        }
        let disk_mib = info.resources.disk_mib.unwrap_or(config::DEFAULT_DISK_MIB);
        let result = self.capture(id, name, disk_mib).await;
        if was_running {
            return snapshot_outcome(result, self.resume(id).await.map(|_| ()));
        }
        result
    }

    #[tracing::instrument(level = "debug", skip_all, err(level = "debug"))]
    async fn list_snapshots(&self) -> Result<Vec<SnapshotInfo>> {
        let mut out = Vec::new();
        let Ok(entries) = std::fs::read_dir(self.snapshots_dir()) else {
            return Ok(out);
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "json") {
                if let Ok(info) = std::fs::read(&path).map_err(Error::from).and_then(|t| {
                    serde_json::from_slice(&t).map_err(|e| Error::backend(e.to_string()))
                }) {
                    out.push(info);
                }
            }
        }
        out.sort_by(|a: &SnapshotInfo, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        Ok(out)
    }

    #[tracing::instrument(level = "debug", skip_all, err(level = "debug"))]
    async fn delete_snapshot(&self, snapshot_id: &str) -> Result<()> {
        let (meta, tar) = self.snapshot_paths(snapshot_id)?;
        std::fs::remove_file(&meta)
            .map_err(|e| Error::from_io(&e, &format!("snapshot {snapshot_id:?}")))?;
        let _ = std::fs::remove_file(tar);
        self.bury(
            sandcove_core::ResourceKind::Snapshot,
            snapshot_id.to_string(),
            "deleted",
        )
        .await;
        Ok(())
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn fork(&self, id: &str, options: CreateOptions) -> Result<SandboxInfo> {
        if options.snapshot.is_some() {
            return Err(Error::invalid(
                "fork takes its files from the sandbox, not a snapshot",
            ));
        }
        check_create(&options, self.cgroups.is_some())?;
        // Annotations are copied on purpose, never inherited through the files: the source's,
        // then the fork's own on top, checked before anything is made.
        let source = self.get(id).await?;
        let mut options = options;
        // The fork's envs are added over the source's, as its annotations are.
        let mut envs = source.envs;
        envs.append(&mut options.envs);
        sandcove_core::validate::validate_envs(&envs)?;
        options.envs = envs;
        let mut annotations = source.annotations;
        annotations.append(&mut options.annotations);
        sandcove_core::check_annotations(&annotations)?;
        options.annotations = annotations;
        let snap = self.snapshot(id, Some(format!("fork of {id}"))).await?;
        options.snapshot = Some(snap.id.clone());
        let created = self.create(options).await;
        let _ = self.delete_snapshot(&snap.id).await;
        fork_outcome(created, snap.source_resume_error)
    }

    #[tracing::instrument(level = "debug", skip_all, err(level = "debug"))]
    async fn create_volume(&self, name: &str) -> Result<VolumeInfo> {
        self.volumes_supported()?;
        // Making the filesystem runs tools: off the event loop.
        let (engine, name, mib) = (self.clone(), name.to_string(), self.volume_size_mib);
        tokio::task::spawn_blocking(move || volumes::create(&engine, &name, mib))
            .await
            .map_err(|e| Error::backend(format!("create volume: {e}")))?
    }

    #[tracing::instrument(level = "debug", skip_all, err(level = "debug"))]
    async fn get_volume(&self, name: &str) -> Result<VolumeInfo> {
        self.volumes_supported()?;
        volumes::get(self, name)
    }

    #[tracing::instrument(level = "debug", skip_all, err(level = "debug"))]
    async fn list_volumes(&self) -> Result<Vec<VolumeInfo>> {
        self.volumes_supported()?;
        volumes::list(self)
    }

    #[tracing::instrument(level = "debug", skip_all, err(level = "debug"))]
    async fn delete_volume(&self, name: &str) -> Result<()> {
        self.volumes_supported()?;
        volumes::delete(self, name).await?;
        self.bury(
            sandcove_core::ResourceKind::Volume,
            name.to_string(),
            "deleted",
        )
        .await;
        Ok(())
    }

    #[tracing::instrument(level = "debug", skip_all, fields(kind = %kind, id = id), err(level = "debug"))]
    async fn tombstone(
        &self,
        kind: sandcove_core::ResourceKind,
        id: &str,
    ) -> Result<Option<sandcove_core::Tombstone>> {
        let state_dir = self.state_dir.clone();
        let id = id.to_string();
        tokio::task::spawn_blocking(move || refs::lookup(&state_dir, kind, &id))
            .await
            .map_err(|e| Error::backend(format!("tombstone task failed: {e}")))?
    }

    #[tracing::instrument(level = "debug", skip_all, err(level = "debug"))]
    async fn observe(
        &self,
        operation: &sandcove_core::OperationId,
    ) -> Result<sandcove_core::OperationStatus> {
        Ok(embedded_observe(operation))
    }
}

/// The embedded engine's answer about any operation: it records none, because each call runs
/// in the caller's own program and its answer cannot be lost without the program ending.
fn embedded_observe(operation: &sandcove_core::OperationId) -> sandcove_core::OperationStatus {
    sandcove_core::OperationStatus::Unknown {
        reason: format!(
            "the embedded engine does not record operations ({operation} included): a call's \
             answer reaches its caller unless the program ends first; to find a sandbox whose \
             create was interrupted, list sandboxes by a label set at create"
        ),
    }
}

/// A connection to an agent, received as a descriptor, registered with this runtime.
fn agent_stream(fd: OwnedFd) -> std::io::Result<QuietStream> {
    let stream = std::os::unix::net::UnixStream::from(fd);
    sys::grow_socket_buffers(&stream);
    QuietStream::new(stream)
}

/// Create the state directory and start the monitor; returns once the sandbox is ready,
/// with a connection to its agent when the monitor made one.
/// The environment variables a monitor (and so its agent) keeps from the program that
/// starts it; everything else, secrets included, is dropped (the spawner starts with an
/// empty environment and sets this one in each monitor).
const MONITOR_ENV: &[&str] = &["PATH", "LANG", "LC_ALL", "TZ", "RUST_BACKTRACE", "RUST_LOG"];

fn start_monitor(state_dir: &Path, record: &Record) -> Result<Option<OwnedFd>> {
    let sandboxes = state_dir.join("sandboxes");
    let staging = sandboxes.join(format!(".{}", record.id));
    let final_dir = SandboxDir::new(state_dir, &record.id);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&staging)
        .map_err(|e| Error::from_io(&e, "sandbox state directory"))?;
    let name = record.options.name.as_deref();
    let cleanup = |e: Error| {
        let _ = std::fs::remove_dir_all(&staging);
        let _ = std::fs::remove_dir_all(&final_dir.dir);
        if let Some(name) = name {
            names::release(state_dir, name, &record.id);
        }
        e
    };
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(staging.join("lock"))
        .map_err(|e| cleanup(e.into()))?;
    if !sys::try_lock_exclusive(lock.as_fd()).map_err(|e| cleanup(e.into()))? {
        return Err(cleanup(Error::backend(
            "sandbox lock is held by another process",
        )));
    }
    // The name is taken while this program holds the sandbox's lock, which the monitor then
    // inherits: the name stays taken exactly as long as the sandbox lives.
    if let Some(name) = name {
        if let Err(e) = names::claim(state_dir, name, &record.id) {
            let _ = std::fs::remove_dir_all(&staging);
            return Err(e);
        }
    }
    let text = serde_json::to_vec_pretty(record)
        .map_err(|e| cleanup(Error::backend(format!("encode record: {e}"))))?;
    std::fs::write(staging.join("record.json"), text).map_err(|e| cleanup(e.into()))?;
    if record.unisolated {
        // The host directory standing in for the sandbox root.
        let root = staging.join("root");
        for dir in [record.default_user().home.as_str(), "/tmp"] {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(root.join(dir.trim_start_matches('/')))
                .map_err(|e| cleanup(e.into()))?;
        }
    }
    std::fs::rename(&staging, &final_dir.dir).map_err(|e| cleanup(e.into()))?;
    let socket_len = final_dir.socket().as_os_str().len();
    if socket_len >= 108 {
        return Err(cleanup(Error::invalid(format!(
            "state directory path is too long for a unix socket ({socket_len} bytes); \
             set SANDCOVE_STATE_DIR to a shorter path"
        ))));
    }
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(final_dir.log())
        .map_err(|e| cleanup(e.into()))?;
    // A socket rather than a pipe: the report `ok` brings a first connection to the agent.
    let (ready_read, ready_write) = sys::seqpacket_pair().map_err(|e| cleanup(e.into()))?;
    // A clean environment: the launcher's secrets (an API key above all) must not sit in the
    // monitor's or the agent's environment; only the settings the engine reads pass.
    let env = std::env::vars_os()
        .filter(|(name, _)| name.to_str().is_some_and(|n| MONITOR_ENV.contains(&n)))
        .collect();
    spawner::start_monitor(&final_dir.dir, env, &ready_write, &lock, &log).map_err(cleanup)?;
    // The monitor holds the only write end now: its report, or its death, ends the read.
    drop(ready_write);
    let result = monitor::read_ready(ready_read);
    drop(lock);
    result.map_err(cleanup)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taken() -> SnapshotInfo {
        SnapshotInfo {
            id: "snap-1".into(),
            name: None,
            sandbox_id: "sb".into(),
            created_at: 1,
            size: 2,
            source_resume_error: None,
        }
    }

    /// A snapshot taken whose source then fails to resume is returned, carrying the resume
    /// error; a failed capture stays the error.
    #[test]
    fn a_snapshot_survives_its_sources_failed_resume() {
        let info = snapshot_outcome(Ok(taken()), Err(Error::backend("agent gone")))
            .expect("the snapshot exists: its reference is returned");
        assert_eq!(info.id, "snap-1");
        let why = info.source_resume_error.expect("the resume error");
        assert!(why.contains("agent gone"), "{why}");
        assert_eq!(snapshot_outcome(Ok(taken()), Ok(())).unwrap(), taken());
        let err = snapshot_outcome(Err(Error::not_found("x")), Err(Error::backend("y")));
        assert!(err.unwrap_err().is_not_found());
    }

    /// A fork whose source fails to resume after its files were copied is returned with the
    /// resume error, as a snapshot is (before, the error was dropped); the field survives
    /// the wire; a failed create stays the error.
    #[test]
    fn a_fork_carries_its_sources_failed_resume() {
        let mut made: SandboxInfo = serde_json::from_value(serde_json::json!({
            "id": "fork-1", "state": "running", "template": "base", "labels": {}, "envs": {},
            "resources": {}, "network": "none",
            "user": {"name": "user", "uid": 1000, "gid": 1000, "home": "/workspace"},
            "created_at": 1, "ends_at": 2
        }))
        .expect("a sandbox description");
        made.source_resume_error = None;
        let info = fork_outcome(Ok(made.clone()), Some("agent gone".into())).unwrap();
        assert_eq!(info.id, "fork-1");
        assert_eq!(info.source_resume_error.as_deref(), Some("agent gone"));
        let wire: SandboxInfo =
            serde_json::from_str(&serde_json::to_string(&info).unwrap()).unwrap();
        assert_eq!(wire.source_resume_error.as_deref(), Some("agent gone"));
        assert_eq!(fork_outcome(Ok(made.clone()), None).unwrap(), made);
        let err = fork_outcome(Err(Error::not_found("x")), Some("y".into()));
        assert!(err.unwrap_err().is_not_found());
    }
}
