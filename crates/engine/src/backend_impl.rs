//! The engine as a [`Backend`]: each call checked, then answered from the state directory or
//! passed to the sandbox's monitor or agent (the calls its agent answers, as every runtime
//! that drives agents passes them: [`AgentBackend`]).

use async_trait::async_trait;
use sandcove_agent::agent_backend::AgentBackend;
use sandcove_core::{
    now_millis, AnnotationUpdate, Backend, ByteStream, Capabilities, ChmodOptions, CopyOptions,
    CreateOptions, Error, FileStat, FileUrl, FileUrlOptions, ListDirOptions, ListOptions, Metrics,
    MkdirOptions, Preview, PreviewOptions, PreviewToken, PreviewTokenOptions, ProcessInfo,
    ProcessSelector, ProcessSpec, ProcessStream, ReadOptions, RemoveOptions, RenameOptions,
    ResizePtyOptions, Result, SandboxInfo, SandboxState, SetLabelsOptions, SetOnTimeoutOptions,
    SetTimeoutOptions, SignalOptions, SnapshotInfo, SnapshotOptions, StatOptions, TimeoutAction,
    VolumeInfo, WatchOptions, WatchStream, WriteOptions, WriteStdinOptions, DEFAULT_OUTPUT_LIMIT,
};

use crate::config::{SandboxDir, UidMapping};
use crate::connect::{lock_is_free, peer_protocol, protocol_note, unexpected};
use crate::proto::{MonitorReply, MonitorRequest};
use crate::snapshots::{fork_outcome, snapshot_outcome};
use crate::{cgroup, config, pool, refs, volumes, LocalBackend, MAX_FILE_BYTES};

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
        caps.lease_stop = !self.unisolated;
        caps.previews = true;
        caps.file_urls = true;
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
        // The images stored here, by every reference they are known by (an isolated engine
        // only: an image's root needs the sandbox's own mount namespace).
        if let Some(images) = self.images.as_ref().filter(|_| !self.unisolated) {
            caps.images = true;
            // What this host is expected to use (a create under `auto` still copies where
            // its overlay mount is refused: see `images::ImageRootMode`).
            caps.image_root = Some(self.image_root_mode.host_default().as_str().to_string());
            caps.templates.extend(images.references());
        }
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
        check_create(&options, self.cgroups.is_some(), self.images.is_some())?;
        if let Some(shape) = self.pool_shape(&options) {
            if let Some(id) = self.pool.take(self, &shape) {
                let claimed = pool::as_pool_work(self.claim(&id, &shape, &options)).await;
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
    async fn set_timeout(&self, id: &str, options: SetTimeoutOptions) -> Result<SandboxInfo> {
        sandcove_core::validate::validate_sandbox_timeout(options.timeout)?;
        self.monitor_info(
            id,
            MonitorRequest::SetTimeout {
                secs: options.timeout.as_secs_f64(),
            },
        )
        .await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn set_on_timeout(&self, id: &str, options: SetOnTimeoutOptions) -> Result<SandboxInfo> {
        match options.on_timeout {
            TimeoutAction::Pause => self.capabilities().require(sandcove_core::Feature::Pause)?,
            TimeoutAction::Stop => self
                .capabilities()
                .require(sandcove_core::Feature::LeaseStop)?,
            TimeoutAction::Destroy => {}
        }
        self.monitor_info(
            id,
            MonitorRequest::SetOnTimeout {
                action: options.on_timeout,
            },
        )
        .await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn set_labels(&self, id: &str, options: SetLabelsOptions) -> Result<SandboxInfo> {
        sandcove_core::validate::validate_labels(&options.labels)?;
        let labels = options.labels;
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
            Ok(MonitorReply::Done) => {
                // Its image (if it ran one) is no longer kept for it.
                // (Off the event loop: the store's lock may be held by a prune.)
                if let Some(images) = &self.images {
                    let (images, holder) = (images.clone(), id.to_string());
                    let _ = tokio::task::spawn_blocking(move || images.release(&holder)).await;
                }
                Ok(())
            }
            Ok(other) => Err(unexpected(&other)),
            Err(e) => Err(e),
        }
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn spawn(&self, id: &str, spec: ProcessSpec) -> Result<ProcessStream> {
        AgentBackend::spawn(self, id, spec).await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn attach(&self, id: &str, process: ProcessSelector) -> Result<ProcessStream> {
        AgentBackend::attach(self, id, process).await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn write_stdin(
        &self,
        id: &str,
        process: ProcessSelector,
        options: WriteStdinOptions,
    ) -> Result<()> {
        AgentBackend::write_stdin(self, id, process, options).await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn close_stdin(&self, id: &str, process: ProcessSelector) -> Result<()> {
        AgentBackend::close_stdin(self, id, process).await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn signal(
        &self,
        id: &str,
        process: ProcessSelector,
        options: SignalOptions,
    ) -> Result<()> {
        AgentBackend::signal(self, id, process, options).await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn list_processes(&self, id: &str) -> Result<Vec<ProcessInfo>> {
        AgentBackend::list_processes(self, id).await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn read_file(&self, id: &str, path: &str, options: ReadOptions) -> Result<ByteStream> {
        AgentBackend::read_file(self, id, path, options).await
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
        match AgentBackend::write_file(self, id, path, data, options).await {
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
        AgentBackend::list_dir(self, id, path, options).await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn stat(&self, id: &str, path: &str, options: StatOptions) -> Result<FileStat> {
        AgentBackend::stat(self, id, path, options).await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn mkdir(&self, id: &str, path: &str, options: MkdirOptions) -> Result<FileStat> {
        AgentBackend::mkdir(self, id, path, options).await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn remove(&self, id: &str, path: &str, options: RemoveOptions) -> Result<()> {
        AgentBackend::remove(self, id, path, options).await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn rename(
        &self,
        id: &str,
        from: &str,
        to: &str,
        options: RenameOptions,
    ) -> Result<FileStat> {
        AgentBackend::rename(self, id, from, to, options).await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn copy(&self, id: &str, from: &str, to: &str, options: CopyOptions) -> Result<FileStat> {
        AgentBackend::copy(self, id, from, to, options).await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn chmod(&self, id: &str, path: &str, options: ChmodOptions) -> Result<FileStat> {
        AgentBackend::chmod(self, id, path, options).await
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
        AgentBackend::metrics(self, id).await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn resize_pty(
        &self,
        id: &str,
        process: ProcessSelector,
        options: ResizePtyOptions,
    ) -> Result<()> {
        AgentBackend::resize_pty(self, id, process, options).await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(sandbox = id), err(level = "debug"))]
    async fn watch(&self, id: &str, path: &str, options: WatchOptions) -> Result<WatchStream> {
        AgentBackend::watch(self, id, path, options).await
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
        options: PreviewTokenOptions,
    ) -> Result<PreviewToken> {
        let expires_at = options.expires_at;
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
    async fn create_file_url(&self, id: &str, options: FileUrlOptions) -> Result<FileUrl> {
        options.validate(now_millis())?;
        // The engine's configured bound, where it is tighter than the URL's: the monitor's
        // listener applies the bound the URL carries.
        let mut options = options;
        if self.max_file_bytes < MAX_FILE_BYTES
            && options.max_bytes.is_none_or(|m| m > self.max_file_bytes)
        {
            options.max_bytes = Some(self.max_file_bytes);
        }
        match self
            .monitor_call(id, MonitorRequest::FileUrl { options })
            .await?
        {
            MonitorReply::FileUrl { url } => Ok(url),
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
    async fn snapshot(&self, id: &str, options: SnapshotOptions) -> Result<SnapshotInfo> {
        // The engine's snapshots keep files only: asked for memory, nothing is taken.
        if options.memory {
            let feature = sandcove_core::Feature::SnapshotMemory;
            return Err(Error::not_supported(feature.name(), feature.alternative()));
        }
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
        let image = self.image_of(id);
        let result = self.capture(id, options.name, disk_mib, image).await;
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
        // An image sandbox's snapshot no longer keeps its image.
        self.release_image(snapshot_id).await;
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
        check_create(&options, self.cgroups.is_some(), self.images.is_some())?;
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
        let snap = self
            .snapshot(id, SnapshotOptions::default().name(format!("fork of {id}")))
            .await?;
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
    async fn list_images(&self) -> Result<Vec<sandcove_core::ImageSummary>> {
        let store = self.image_store()?;
        let list = blocking(move || store.list().map_err(crate::images::image_error)).await?;
        Ok(list.into_iter().map(summary).collect())
    }

    async fn pull_image(&self, reference: &str) -> Result<sandcove_core::ImageSummary> {
        self.pull_image_with_progress(reference, &|_| {}).await
    }

    async fn pull_image_with_progress(
        &self,
        reference: &str,
        progress: &(dyn Fn(sandcove_core::ImagePullProgress) + Send + Sync),
    ) -> Result<sandcove_core::ImageSummary> {
        let store = self.image_store()?;
        let report = |p: sandcove_image::PullProgress| progress(crate::images::pull_progress(p));
        let info = store
            .pull(reference, &report)
            .await
            .map_err(crate::images::image_error)?;
        Ok(summary(info))
    }

    async fn import_image(
        &self,
        archive: sandcove_core::ByteStream,
        tag: Option<&str>,
    ) -> Result<Vec<sandcove_core::ImageSummary>> {
        let store = self.image_store()?;
        let staged = crate::images::stage_archive(&store, archive).await?;
        let imported = store.import(staged.path(), tag).await;
        // The store's paths are this host's business: errors name the archive and the store
        // instead.
        let staged_path = staged.path().to_path_buf();
        drop(staged);
        let store_dir = crate::images::store_dir(&self.state_dir);
        let imported =
            imported.map_err(|e| crate::images::import_error(e, &staged_path, &store_dir))?;
        Ok(imported.into_iter().map(summary).collect())
    }

    async fn image_availability(
        &self,
        reference: &str,
    ) -> Result<sandcove_core::ImageAvailability> {
        let store = self.image_store()?;
        Ok(match store.check(reference).await {
            sandcove_image::Availability::Available => sandcove_core::ImageAvailability::Available,
            sandcove_image::Availability::Pullable => sandcove_core::ImageAvailability::Pullable,
            sandcove_image::Availability::Unknown => sandcove_core::ImageAvailability::Unknown,
        })
    }

    async fn inspect_image(&self, reference: &str) -> Result<sandcove_core::ImageDetails> {
        let store = self.image_store()?;
        let reference = reference.to_string();
        let details = blocking(move || {
            store
                .inspect(&reference)
                .map_err(crate::images::image_error)
        })
        .await?;
        Ok(details_of(details))
    }

    async fn remove_image(&self, reference: &str) -> Result<()> {
        let store = self.image_store()?;
        let reference = reference.to_string();
        blocking(move || store.remove(&reference).map_err(crate::images::image_error)).await
    }

    async fn prune_images(&self) -> Result<sandcove_core::ImagePruneReport> {
        let engine = self.clone();
        let report = blocking(move || LocalBackend::prune_images(&engine)).await?;
        Ok(sandcove_core::ImagePruneReport::new(
            report.images,
            report.layers,
            report.bytes,
        ))
    }

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

/// The engine's own checks after the shared ones ([`CreateOptions::validate`]): a template
/// other than the host base only with an image source, and the resources its cgroups can
/// enforce. (Whether the image is stored is the source's answer, at create.)
fn check_create(options: &CreateOptions, cgroups: bool, images: bool) -> Result<()> {
    options.validate()?;
    if !images && !sandcove_core::capability::is_host_base(options.template.as_deref()) {
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

/// Run blocking store work (file locks, unpacking, removing layers) off the event loop.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| Error::backend(format!("image store task failed: {e}")))?
}

/// A store listing as the core's.
fn summary(info: sandcove_image::ImageInfo) -> sandcove_core::ImageSummary {
    sandcove_core::ImageSummary::new(info.references, info.digest, info.size, info.created)
}

/// The store's details of an image as the core's.
fn details_of(details: sandcove_image::ImageDetails) -> sandcove_core::ImageDetails {
    let config = details.config;
    let layers = details
        .layers
        .into_iter()
        .map(|layer| {
            sandcove_core::ImageLayer::new(
                layer.digest,
                layer.diff_id,
                layer.compressed_size,
                layer.unpacked_size,
                layer.entries,
                layer.skipped,
            )
        })
        .collect();
    sandcove_core::ImageDetails::new(
        summary(details.info),
        details.index_digest,
        details.config_digest,
        details.platform,
        sandcove_core::ImageConfig::new(
            config.env,
            config.working_dir,
            config.user,
            config.entrypoint,
            config.cmd,
        ),
        layers,
    )
}

impl LocalBackend {
    /// The image sandbox `id` runs, as its snapshot records it (`None`: the host base).
    fn image_of(&self, id: &str) -> Option<crate::snapshots::SnapshotImage> {
        let dir = crate::config::SandboxDir::new(&self.state_dir, id);
        let text = std::fs::read(dir.record()).ok()?;
        let record: crate::config::Record = serde_json::from_slice(&text).ok()?;
        record.image.map(|image| crate::snapshots::SnapshotImage {
            reference: image.reference,
            digest: image.digest,
        })
    }

    /// The state directory's image store, for the image calls (refused without isolation,
    /// where images cannot run).
    fn image_store(&self) -> Result<sandcove_image::Store> {
        if self.unisolated {
            return Err(Error::not_supported(
                "images without isolation",
                "run on a host with user namespaces (an image's root is mounted in the \
                 sandbox's own mount namespace)",
            ));
        }
        crate::images::open_store(&self.state_dir)
    }
}
