//! Making and ending sandboxes: the cold create that writes a record and starts a monitor, the
//! warm-pool members and their claim by a create, the checks a sandbox without isolation needs,
//! and the end records (tombstones) of resources.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;
use std::time::Duration;

use sandcove_core::{
    now_millis, Backend, CreateOptions, Error, Result, SandboxInfo, SandboxState, DEFAULT_TIMEOUT,
};
use tokio::io::AsyncWriteExt;

use crate::config::{Record, SandboxDir, UidMapping};
use crate::connect::unexpected;
use crate::proto::{AgentRequest, Hello, MonitorReply, MonitorRequest};
use crate::quiet::QuietStream;
use crate::{
    cgroup, config, locale, monitor, names, net, pool, proto, refs, spawner, sys, volumes,
    LocalBackend, PROTOCOL_VERSION,
};

impl LocalBackend {
    /// Create a sandbox the slow way: a fresh monitor, namespaces and root. `pooled` marks
    /// a warm-pool member (hidden from `list` until claimed).
    pub(crate) async fn create_cold(
        &self,
        options: CreateOptions,
        pooled: bool,
    ) -> Result<SandboxInfo> {
        self.create_cold_pinned(options, pooled, None).await
    }

    /// [`LocalBackend::create_cold`], refused before any effect when `digest` is given and
    /// the image the template names is another (the name was pulled again meanwhile): a warm
    /// member is made of exactly the image its shape names.
    pub(crate) async fn create_cold_pinned(
        &self,
        mut options: CreateOptions,
        pooled: bool,
        digest: Option<&str>,
    ) -> Result<SandboxInfo> {
        let id = config::new_id();
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
        let image = self.image_for(&options)?;
        if let Some(pinned) = digest {
            match &image {
                Some(image) if image.digest == pinned => {}
                other => {
                    return Err(Error::invalid(format!(
                        "{:?} names {} now, not {pinned}",
                        options.template.clone().unwrap_or_default(),
                        other
                            .as_ref()
                            .map_or("the host base", |i| i.digest.as_str())
                    )))
                }
            }
        }
        // The create's user, else the one the image's `User` names, else the engine's.
        let default_name = match (&options.user, &image) {
            (Some(user), _) => Some(user.clone()),
            (None, Some(image)) => image.default_user()?,
            (None, None) => None,
        }
        .unwrap_or_else(|| config::DEFAULT_USER_NAME.into());
        // A sandbox made from an image sandbox's snapshot runs that image (and says so).
        if let (Some(image), None) = (&image, &options.template) {
            options.template = Some(image.reference.clone());
        }
        let mounts = volumes::mounts_for(self, &options.volumes)?;
        // An image sandbox's snapshot is unpacked into the new writable layer by the agent at
        // setup; a host-base one is restored into the running sandbox below.
        let (snapshot, restore_archive) = match (snapshot, &image) {
            (Some(tar), Some(_)) => (None, Some(tar.to_string_lossy().into_owned())),
            (snapshot, _) => (snapshot, None),
        };
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
            image,
            image_root_mode: self.image_root_mode,
            restore_archive,
        };
        // The image is kept for this sandbox before it starts (a prune meanwhile leaves it),
        // held by `start_monitor` once the sandbox's staging directory exists (see there).
        // (Off the event loop: the store's lock may be held by a prune removing layers.)
        let hold: Option<ImageHold> = match (&record.image, &self.images) {
            (Some(image), Some(source)) => {
                let (source, digest, holder) = (source.clone(), image.digest.clone(), id.clone());
                Some(Box::new(move || source.hold_for_sandbox(&digest, &holder)))
            }
            _ => None,
        };
        let held = hold.is_some();
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
            start_monitor(&state_dir, &record, hold)
        })
        .await
        .map_err(|e| Error::backend(format!("create task failed: {e}")))
        .and_then(|started| started);
        let first = match first {
            Ok(first) => first,
            Err(e) => {
                // Nothing started: the image is not kept for it.
                if let (true, Some(source)) = (held, &self.images) {
                    let (source, holder) = (source.clone(), id.clone());
                    let _ = tokio::task::spawn_blocking(move || source.release(&holder)).await;
                }
                return Err(e);
            }
        };
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

    /// The image `options` names, resolved through the engine's image source; `None` for the
    /// host base. Refused before any effect: an image without a source, or without isolation
    /// (the image's root needs the sandbox's own mount namespace), or one with more layers
    /// than a root stacks. A create from a snapshot runs the snapshot's image (see
    /// [`LocalBackend::snapshot_image_for`]).
    pub(crate) fn image_for(
        &self,
        options: &CreateOptions,
    ) -> Result<Option<crate::images::ImageRoot>> {
        if let Some(snapshot) = &options.snapshot {
            return self.snapshot_image_for(snapshot, options.template.as_deref());
        }
        let reference = match options.template.as_deref() {
            t if sandcove_core::capability::is_host_base(t) => return Ok(None),
            Some(reference) => reference,
            None => return Ok(None),
        };
        let Some(source) = &self.images else {
            return Err(Error::not_supported(
                format!("template or image {reference:?}"),
                sandcove_core::capability::HOST_BASE_ALTERNATIVE,
            ));
        };
        if self.unisolated {
            return Err(Error::not_supported(
                format!("image {reference:?} without isolation"),
                "run on a host with user namespaces (an image's root is mounted in the \
                 sandbox's own mount namespace), or use the host base",
            ));
        }
        let image = source.resolve(reference)?;
        self.check_layers(image)
    }

    /// An image with more layers than a root stacks is refused.
    fn check_layers(
        &self,
        image: crate::images::ImageRoot,
    ) -> Result<Option<crate::images::ImageRoot>> {
        let reference = image.reference.clone();
        if image.layers.len() > crate::images::MAX_LAYERS {
            return Err(Error::not_supported(
                format!("image {reference:?} with {} layers", image.layers.len()),
                format!(
                    "squash it to at most {} layers (e.g. a multi-stage build)",
                    crate::images::MAX_LAYERS
                ),
            ));
        }
        Ok(Some(image))
    }

    /// The image a create from `snapshot_id` runs: the one the snapshot was taken from
    /// (`None`: a host-base sandbox's snapshot). A template the create names must agree (the
    /// same reference, or one naming the same digest), else `InvalidArgument`; an image no
    /// longer stored is `NotFound`, naming it.
    fn snapshot_image_for(
        &self,
        snapshot_id: &str,
        template: Option<&str>,
    ) -> Result<Option<crate::images::ImageRoot>> {
        let named = template.filter(|t| !t.is_empty());
        let Some(recorded) = self.snapshot_image(snapshot_id)? else {
            if !sandcove_core::capability::is_host_base(named) {
                return Err(Error::invalid(format!(
                    "snapshot {snapshot_id:?} holds a host-base sandbox's files, not those of \
                     image {:?}: create from the snapshot without a template",
                    named.unwrap_or_default()
                )));
            }
            return Ok(None);
        };
        let Some(source) = self.images.as_ref().filter(|_| !self.unisolated) else {
            return Err(Error::not_supported(
                format!("image {:?} of snapshot {snapshot_id:?}", recorded.reference),
                "create from it on an isolated engine with images",
            ));
        };
        let disagree = || {
            Error::invalid(format!(
                "snapshot {snapshot_id:?} was taken from image {} ({}), not {:?}: create from \
                 it without a template, or with that image",
                recorded.reference,
                recorded.digest,
                named.unwrap_or_default()
            ))
        };
        match named {
            None => {}
            Some(t) if t == recorded.reference || t == recorded.digest => {}
            Some(t) if sandcove_core::capability::is_host_base(Some(t)) => return Err(disagree()),
            Some(t) => match source.resolve(t) {
                Ok(image) if image.digest == recorded.digest => {}
                _ => return Err(disagree()),
            },
        }
        // By its reference while that still names the same image, else by its digest.
        let image = match source.resolve(&recorded.reference) {
            Ok(image) if image.digest == recorded.digest => image,
            _ => source
                .resolve(&recorded.digest)
                .ok()
                .filter(|image| image.digest == recorded.digest)
                .map(|image| crate::images::ImageRoot {
                    reference: recorded.reference.clone(),
                    ..image
                })
                .ok_or_else(|| {
                    Error::not_found(format!(
                        "image {} ({}), which snapshot {snapshot_id:?} was taken from, is no \
                         longer stored here: pull or import it again",
                        recorded.reference, recorded.digest
                    ))
                })?,
        };
        self.check_layers(image)
    }

    /// The digests of the images the live sandboxes of this state directory run, and those
    /// its snapshots were taken from: what an image store's prune must keep. Read from the sandboxes' records, so a sandbox that
    /// ended without its client is never counted.
    pub fn images_in_use(&self) -> Vec<String> {
        let mut digests = Vec::new();
        let Ok(entries) = std::fs::read_dir(self.sandboxes_dir()) else {
            return digests;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !config::valid_id(&name) {
                continue;
            }
            let sdir = SandboxDir::new(&self.state_dir, &name);
            if crate::lock_is_free(&sdir.lock()) {
                continue;
            }
            let Ok(text) = std::fs::read(sdir.record()) else {
                continue;
            };
            if let Ok(record) = serde_json::from_slice::<Record>(&text) {
                if let Some(image) = record.image {
                    if !digests.contains(&image.digest) {
                        digests.push(image.digest);
                    }
                }
            }
        }
        for digest in self.snapshot_images() {
            if !digests.contains(&digest) {
                digests.push(digest);
            }
        }
        digests
    }

    /// Remove what the image store holds that nothing uses (see
    /// [`Store::prune`](sandcove_image::Store::prune)): images without a tag that no live
    /// sandbox runs, and the layers and blobs no image needs. Holds of sandboxes that are gone
    /// (ended at their lease, or destroyed by a program that did not release them) are
    /// released first; a sandbox being created (its state directory or its staging one
    /// exists) keeps its image.
    pub fn prune_images(&self) -> Result<sandcove_image::PruneReport> {
        let store = crate::images::open_store(&self.state_dir)?;
        let holds = store
            .holds_by_holder()
            .map_err(crate::images::image_error)?;
        for holder in holds.keys() {
            // A snapshot holds its image until it is deleted.
            if self
                .snapshot_image(holder)
                .is_ok_and(|image| image.is_some())
            {
                continue;
            }
            if !self.holder_is_live(holder) {
                store.release(holder).map_err(crate::images::image_error)?;
            }
        }
        store.prune().map_err(crate::images::image_error)
    }

    /// Whether the sandbox `holder`, whose image hold a prune has read, may still use it:
    /// its staging directory exists, or its directory does with its lock held.
    ///
    /// Why a create's hold is never released this way: a create holds its image only once
    /// its staging directory `.ID` exists (`start_monitor`), and renames it to `ID` while
    /// holding the sandbox's lock, which its monitor then keeps for the sandbox's life; the
    /// directories go only when the sandbox ends or its create fails. So a hold the prune has
    /// read had `.ID` or `ID` behind it when it was read. The staging name is looked at first:
    /// if it is gone by then, the rename (or the end) came before, and `ID` is seen next, with
    /// its lock held while the sandbox lives. (Looking at `ID` first, a rename between the two
    /// looks would hide both.) A create that failed leaves neither, and releases its hold
    /// itself.
    fn holder_is_live(&self, holder: &str) -> bool {
        if !config::valid_id(holder) {
            return false;
        }
        let sdir = SandboxDir::new(&self.state_dir, holder);
        let staged = self.sandboxes_dir().join(format!(".{holder}")).exists();
        let present = staged || sdir.dir.exists();
        present && (!sdir.dir.exists() || !crate::lock_is_free(&sdir.lock()))
    }

    /// This engine without a pool: what the pool's own task makes members with (holding
    /// the pool itself would keep it alive forever).
    pub(crate) fn without_pool(&self) -> Self {
        let mut engine = self.clone();
        engine.pool = std::sync::Arc::new(pool::Pool::new(0));
        engine
    }

    /// Make a pool member of `shape` (otherwise the default options), lease `lease`, hidden
    /// from `list`. Returns its id and lease end.
    pub(crate) async fn create_member(
        &self,
        shape: &pool::Shape,
        lease: Duration,
    ) -> Result<(String, u64)> {
        let options = shape.member_options(lease);
        let pinned = shape.image.as_ref().map(|image| image.digest.as_str());
        let info = self.create_cold_pinned(options, true, pinned).await?;
        Ok((info.id, info.ends_at))
    }

    /// Destroy a pool member.
    pub(crate) async fn destroy_member(&self, id: &str) -> Result<()> {
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

    /// Hand warm member `id`, of `shape`, to a create with `options` (of that shape).
    /// `Ok(None)`: the member could not be used (it is destroyed) and the create goes cold.
    pub(crate) async fn claim(
        &self,
        id: &str,
        shape: &pool::Shape,
        options: &CreateOptions,
    ) -> Result<Option<SandboxInfo>> {
        // The name first: a name held elsewhere fails this create as a cold one would, and
        // leaves the member untouched for the next claim.
        if let Some(name) = options.name.clone() {
            let (state_dir, member) = (self.state_dir.clone(), id.to_string());
            let taken =
                tokio::task::spawn_blocking(move || names::claim(&state_dir, &name, &member))
                    .await
                    .map_err(|e| Error::backend(format!("create task failed: {e}")))?;
            if let Err(e) = taken {
                self.pool.put_back(id.to_string(), shape.clone());
                return Err(e);
            }
        }
        // An image member's default user is its shape's (the image's `User` may have named it).
        let users = match &shape.image {
            Some(image) => self.users_for(&options.clone().user(image.user.clone())),
            None => self.users_for(options),
        };
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

    /// Record the end of sandbox `id` (blocking; best effort: without it a reference answers
    /// not-found instead of destroyed).
    pub(crate) fn bury_sandbox(&self, id: &str, reason: &str) {
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
    pub(crate) async fn bury(
        &self,
        kind: sandcove_core::ResourceKind,
        id: String,
        reason: &'static str,
    ) {
        let state_dir = self.state_dir.clone();
        let tombstone = sandcove_core::Tombstone::now(kind, id, reason);
        let done = tokio::task::spawn_blocking(move || refs::record(&state_dir, &tombstone)).await;
        if let Ok(Err(e)) | Err(e) = done.map_err(|e| Error::backend(e.to_string())) {
            tracing::warn!("no tombstone for a {kind}: {e}");
        }
    }
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
    } else if options.on_timeout == sandcove_core::TimeoutAction::Stop {
        "a lease that stops the sandbox (on_timeout: Stop)"
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
        working_dir: record.image.as_ref().and_then(|i| i.working_dir.clone()),
    }
}

/// A connection to an agent, received as a descriptor, registered with this runtime.
fn agent_stream(fd: OwnedFd) -> std::io::Result<QuietStream> {
    let stream = std::os::unix::net::UnixStream::from(fd);
    sys::grow_socket_buffers(&stream);
    QuietStream::new(stream)
}

/// The environment variables a monitor (and so its agent) keeps from the program that
/// starts it; everything else, secrets included, is dropped (the spawner starts with an
/// empty environment and sets this one in each monitor).
const MONITOR_ENV: &[&str] = &["PATH", "LANG", "LC_ALL", "TZ", "RUST_BACKTRACE", "RUST_LOG"];

/// Create the state directory and start the monitor; returns once the sandbox is ready,
/// with a connection to its agent when the monitor made one.
/// Keeps a create's image in the store for its sandbox ([`ImageSource::hold`]).
///
/// [`ImageSource::hold`]: crate::images::ImageSource::hold
type ImageHold = Box<dyn FnOnce() -> Result<()> + Send>;

/// Writes the sandbox's directory (staged as `.ID`, renamed to `ID` once complete) and starts
/// its monitor. `hold` keeps its image, called once the staging directory exists and the
/// sandbox's lock is held, never before: a prune of the image store treats a holder with
/// neither directory as gone and releases its hold (see `LocalBackend::holder_is_live`), so a
/// hold made earlier could be released before the sandbox had a directory to show.
fn start_monitor(
    state_dir: &Path,
    record: &Record,
    hold: Option<ImageHold>,
) -> Result<Option<OwnedFd>> {
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
    if let Some(hold) = hold {
        hold().map_err(cleanup)?;
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
    use std::path::PathBuf;
    use std::sync::{Arc, Mutex};

    use sandcove_core::{CreateOptions, Error, Result};

    use crate::images::{ImageRoot, ImageSource};
    use crate::LocalBackend;

    /// An image source whose hold records whether its holder's sandbox directory (staged or
    /// not) existed at that moment, then refuses, so the create ends there.
    #[derive(Debug)]
    struct WatchingHolds {
        sandboxes: PathBuf,
        seen: Mutex<Vec<(String, bool)>>,
    }

    impl ImageSource for WatchingHolds {
        fn resolve(&self, reference: &str) -> Result<ImageRoot> {
            Ok(ImageRoot {
                reference: reference.to_string(),
                digest: format!("sha256:{}", "0".repeat(64)),
                layers: Vec::new(),
                env: Vec::new(),
                working_dir: None,
                user: None,
                entrypoint: Vec::new(),
                cmd: Vec::new(),
            })
        }

        fn references(&self) -> Vec<String> {
            Vec::new()
        }

        fn hold(&self, _digest: &str, holder: &str) -> Result<()> {
            let staged = self.sandboxes.join(format!(".{holder}")).is_dir()
                || self.sandboxes.join(holder).is_dir();
            self.seen.lock().unwrap().push((holder.to_string(), staged));
            Err(Error::invalid("refused by the test's image source"))
        }
    }

    /// A create holds its image only once its sandbox's staging directory exists, so a prune
    /// (which releases the holds of holders with no directory) can never release it in
    /// between; a refused hold leaves no directory behind.
    #[tokio::test]
    async fn a_create_holds_its_image_only_once_its_staging_directory_exists() {
        let state = std::env::temp_dir().join(format!(
            "sandcove-hold-order-{}-{}",
            std::process::id(),
            crate::config::new_id()
        ));
        let engine = LocalBackend::with_state_dir(&state).unwrap();
        if engine.unisolated {
            eprintln!("SKIP: images need isolation, which this host cannot give");
            let _ = std::fs::remove_dir_all(&state);
            return;
        }
        let source = Arc::new(WatchingHolds {
            sandboxes: engine.sandboxes_dir(),
            seen: Mutex::new(Vec::new()),
        });
        let engine = engine.with_images(source.clone());
        let mut options = CreateOptions::default();
        options.template = Some("hold-order.test/image:1".into());
        let err = engine.create_cold(options, false).await.unwrap_err();
        assert!(err.to_string().contains("refused by the test"), "{err}");
        let seen = source.seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert!(
            seen[0].1,
            "the hold came before the staging directory: {seen:?}"
        );
        let left: Vec<_> = std::fs::read_dir(engine.sandboxes_dir())
            .map(|entries| entries.flatten().map(|e| e.file_name()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "left behind: {left:?}");
        let _ = std::fs::remove_dir_all(&state);
    }

    /// A warm member is made of exactly the digest its shape names: where the template names
    /// another image now (pulled again meanwhile), it is not made at all, before any effect.
    #[tokio::test]
    async fn a_member_is_never_made_of_another_digest_than_its_shape() {
        let state = std::env::temp_dir().join(format!(
            "sandcove-pin-{}-{}",
            std::process::id(),
            crate::config::new_id()
        ));
        let engine = LocalBackend::with_state_dir(&state).unwrap();
        if engine.unisolated {
            eprintln!("SKIP: images need isolation, which this host cannot give");
            let _ = std::fs::remove_dir_all(&state);
            return;
        }
        let source = Arc::new(WatchingHolds {
            sandboxes: engine.sandboxes_dir(),
            seen: Mutex::new(Vec::new()),
        });
        let engine = engine.with_images(source.clone());
        let mut options = CreateOptions::default();
        options.template = Some("pin.test/image:1".into());
        let stale = format!("sha256:{}", "1".repeat(64));
        let err = engine
            .create_cold_pinned(options.clone(), true, Some(&stale))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("names sha256:000"), "{err}");
        assert!(source.seen.lock().unwrap().is_empty(), "nothing was held");
        // The digest it names now passes the pin (and ends at the test source's hold).
        let now = format!("sha256:{}", "0".repeat(64));
        let err = engine
            .create_cold_pinned(options, true, Some(&now))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("refused by the test"), "{err}");
        let _ = std::fs::remove_dir_all(&state);
    }
}
