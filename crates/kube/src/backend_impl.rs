//! The cluster as a [`Backend`]: each call checked against what Kubernetes can honour, then
//! answered from the sandbox's Pod or passed to its agent.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::PostParams;
use sandcove_agent::agent_backend::AgentBackend;
use sandcove_agent::preview::PreviewSet;
use sandcove_core::{
    AnnotationUpdate, Backend, ByteStream, Capabilities, ChmodOptions, CopyOptions, CreateOptions,
    Error, FileStat, FileUrl, FileUrlOptions, ListDirOptions, ListOptions, Metrics, MkdirOptions,
    NetworkPolicy, OperationId, OperationStatus, Preview, PreviewOptions, PreviewToken,
    PreviewTokenOptions, ProcessInfo, ProcessSelector, ProcessSpec, ProcessStream, ReadOptions,
    RemoveOptions, RenameOptions, ResizePtyOptions, ResourceKind, Result, SandboxInfo,
    SandboxState, SetLabelsOptions, SetTimeoutOptions, SignalOptions, SnapshotInfo,
    SnapshotOptions, StatOptions, Tombstone, UserInfo, VolumeInfo, WatchOptions, WatchStream,
    WriteOptions, WriteStdinOptions,
};

use crate::spec::PodRecord;
use crate::{agent, agent_token, map_error, sandbox_what, spec, token_sha256, KubeBackend};

impl KubeBackend {
    /// Refuse what Kubernetes cannot honour, before any effect.
    fn check_create(&self, options: &CreateOptions) -> Result<()> {
        options.validate()?;
        // Another image is the Pod's container image: the kubelet pulls it (a reference it
        // cannot pull is NotFound at the create); it must hold no NUL or whitespace.
        if let Some(image) = options
            .template
            .as_deref()
            .filter(|t| !sandcove_core::capability::is_host_base(Some(t)))
        {
            if image.len() > 1024 || image.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(Error::invalid(format!("image reference {image:?}")));
            }
        }
        let refuse = |feature: sandcove_core::Feature| {
            Err(Error::not_supported(feature.name(), feature.alternative()))
        };
        if options.snapshot.is_some() {
            return refuse(sandcove_core::Feature::Snapshots);
        }
        if options.on_timeout == sandcove_core::TimeoutAction::Pause || options.auto_resume {
            return refuse(sandcove_core::Feature::Pause);
        }
        // The lease reaper deletes Pods; it does not stop them.
        if options.on_timeout == sandcove_core::TimeoutAction::Stop {
            return refuse(sandcove_core::Feature::LeaseStop);
        }
        if options.network == NetworkPolicy::Host {
            return refuse(sandcove_core::Feature::HostNetwork);
        }
        if options.resources.max_processes.is_some() {
            return refuse(sandcove_core::Feature::ProcessLimit);
        }
        if !options.volumes.is_empty() && !self.inner.config.volumes {
            return refuse(sandcove_core::Feature::Volumes);
        }
        if let Some(host) = &options.hostname {
            if !spec::is_label_part(host, false)
                || host
                    .bytes()
                    .any(|b| b.is_ascii_uppercase() || b == b'_' || b == b'.')
            {
                return Err(Error::invalid(format!(
                    "hostname {host:?}: on Kubernetes a hostname is lowercase letters, digits \
                     and '-'"
                )));
            }
        }
        Ok(())
    }

    fn lease_bounds(&self) -> sandcove_core::LeaseBounds {
        sandcove_core::LeaseBounds {
            min_ms: 1000,
            max_ms: self.inner.config.max_lifetime.as_millis() as u64,
            step_ms: 1,
        }
    }
}

#[async_trait]
impl Backend for KubeBackend {
    fn capabilities(&self) -> Capabilities {
        let config = &self.inner.config;
        let mut caps = Capabilities::none("kubernetes");
        caps.isolated = config.isolated;
        caps.multiple_users = false;
        caps.persistent_sandboxes = true;
        caps.host_network = false;
        caps.internet = true;
        caps.process_limit = false;
        caps.max_file_bytes = config.max_file_bytes;
        caps.output_limit = sandcove_core::DEFAULT_OUTPUT_LIMIT as u64;
        caps.pause = false;
        caps.previews = true;
        caps.snapshots = false;
        caps.volumes = config.volumes;
        caps.watch = true;
        caps.pty = true;
        caps.metrics = true;
        caps.memory_limit = true;
        caps.cpu_limit = true;
        caps.templates = sandcove_core::capability::HOST_BASE_TEMPLATES
            .iter()
            .map(|t| t.to_string())
            .collect();
        // Any image the cluster can pull runs, as the Pod's container image.
        caps.images = true;
        caps.lease = Some(self.lease_bounds());
        caps.observed_at = Some(self.inner.probed_at);
        caps.runtime_id = Some(self.inner.runtime_id.clone());
        caps
    }

    async fn ready(&self) -> Result<Capabilities> {
        Ok(self.capabilities())
    }

    async fn create(&self, options: CreateOptions) -> Result<SandboxInfo> {
        self.check_create(&options)?;
        let lease = self
            .lease_bounds()
            .resolve(options.timeout.unwrap_or(sandcove_core::DEFAULT_TIMEOUT))?;
        if options.network == NetworkPolicy::None || options.network == NetworkPolicy::Internet {
            self.ensure_policies().await?;
        }
        let id = sandcove_agent::new_id();
        let now = sandcove_core::now_millis();
        let home = options
            .home
            .clone()
            .unwrap_or_else(|| sandcove_core::SANDBOX_HOME.into());
        let record = PodRecord {
            id: id.clone(),
            name: options.name.clone(),
            template: options
                .template
                .clone()
                .filter(|t| !sandcove_core::capability::is_host_base(Some(t)))
                .unwrap_or_else(|| "base".into()),
            labels: options.labels.clone(),
            envs: options.envs.clone(),
            resources: options.resources.clone(),
            network: options.network.clone(),
            user: UserInfo {
                name: options.user.clone().unwrap_or_else(|| "user".into()),
                uid: self.inner.config.uid as u32,
                gid: self.inner.config.uid as u32,
                home,
            },
            created_at: now,
            ends_at: now + lease.as_millis() as u64,
            volumes: options.volumes.clone(),
            hostname: options.hostname.clone(),
            stopped_left_ms: None,
        };
        let token = agent_token(&self.inner.config.key, &id);
        let pod = spec::pod(
            &self.inner.config.pod_params(),
            &record,
            &token_sha256(&token),
            &options.annotations,
        )?;
        let created = {
            let _named = match &options.name {
                Some(_) => Some(self.inner.names.lock().await),
                None => None,
            };
            if let Some(name) = &options.name {
                if self.name_taken(name, None).await?.is_some() {
                    return Err(Error::AlreadyExists {
                        what: format!("a sandbox named {name:?}"),
                    });
                }
            }
            self.inner
                .pods
                .create(&PostParams::default(), &pod)
                .await
                .map_err(|e| map_error(&sandbox_what(&id), e))?
        };
        self.inner
            .leases
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.clone(), record.ends_at);
        self.inner.wake.notify_one();
        // Another serving process may have created the same name at the same moment: the
        // earlier sandbox keeps it.
        if let Some(name) = &options.name {
            let first = self.name_taken(name, None).await;
            if matches!(&first, Ok(Some(r)) if r.id != id) {
                let _ = self.delete_pod(&id, Duration::ZERO).await;
                self.forget(&id);
                return Err(Error::AlreadyExists {
                    what: format!("a sandbox named {name:?}"),
                });
            }
        }
        let ready = match self.wait_ready(&id, &created).await {
            Ok(pod) => pod,
            Err(e) => {
                // Nothing half-made is left behind.
                let _ = self.delete_pod(&id, Duration::ZERO).await;
                self.forget(&id);
                return Err(e);
            }
        };
        if let Err(e) = agent::first_contact(self, &id, &ready).await {
            let _ = self.delete_pod(&id, Duration::ZERO).await;
            self.forget(&id);
            return Err(e);
        }
        let mut info = spec::info_of(&ready)
            .ok_or_else(|| Error::backend(format!("{} lost its record", sandbox_what(&id))))?;
        info.state = SandboxState::Running;
        Ok(info)
    }

    async fn get(&self, id: &str) -> Result<SandboxInfo> {
        let (pod, _, _) = self.live_pod(id).await?;
        spec::info_of(&pod).ok_or_else(|| Error::not_found(sandbox_what(id)))
    }

    async fn list(&self, options: ListOptions) -> Result<Vec<SandboxInfo>> {
        let pods = self.pods_matching(&options).await?;
        let now = sandcove_core::now_millis();
        let mut out: Vec<SandboxInfo> = pods
            .iter()
            .filter_map(spec::info_of)
            .filter(|info| info.state != SandboxState::Destroyed && info.ends_at > now)
            // Labels that do not fit a selector are filtered here.
            .filter(|info| options.matches(info))
            .collect();
        out.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        Ok(out)
    }

    async fn set_on_timeout(
        &self,
        id: &str,
        options: sandcove_core::SetOnTimeoutOptions,
    ) -> Result<SandboxInfo> {
        // Pods neither pause nor stop at their lease's end: every lease here ends in a
        // destroy.
        match options.on_timeout {
            sandcove_core::TimeoutAction::Destroy => {}
            sandcove_core::TimeoutAction::Pause => {
                self.capabilities().require(sandcove_core::Feature::Pause)?
            }
            sandcove_core::TimeoutAction::Stop => self
                .capabilities()
                .require(sandcove_core::Feature::LeaseStop)?,
        }
        self.get(id).await
    }

    async fn set_timeout(&self, id: &str, options: SetTimeoutOptions) -> Result<SandboxInfo> {
        let lease = self.lease_bounds().resolve(options.timeout)?;
        let max = self.inner.config.max_lifetime.as_millis() as u64;
        let (pod, ends_at) = self
            .update_pod(id, |_, record, _| {
                let ends_at = sandcove_core::now_millis() + lease.as_millis() as u64;
                if ends_at > record.created_at + max {
                    return Err(Error::invalid(format!(
                        "a sandbox here lives at most {}s from its creation (the Pod's \
                         activeDeadlineSeconds); this lease would end {}s after it",
                        max / 1000,
                        (ends_at - record.created_at) / 1000
                    )));
                }
                if record.stopped_left_ms.is_some() {
                    // Stopped: the lease counts from the next start.
                    record.stopped_left_ms = Some(lease.as_millis() as u64);
                    return Ok(record.ends_at);
                }
                record.ends_at = ends_at;
                Ok(ends_at)
            })
            .await?;
        self.inner
            .leases
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.to_string(), ends_at);
        self.inner.wake.notify_one();
        spec::info_of(&pod).ok_or_else(|| Error::not_found(sandbox_what(id)))
    }

    async fn set_labels(&self, id: &str, options: SetLabelsOptions) -> Result<SandboxInfo> {
        let labels = options.labels;
        sandcove_core::validate::validate_labels(&labels)?;
        let (pod, ()) = self
            .update_pod(id, |pod, record, _| {
                record.labels = labels.clone();
                let mut kube_labels = pod.metadata.labels.take().unwrap_or_default();
                kube_labels.retain(|k, _| !k.starts_with(spec::USER_LABEL_PREFIX));
                kube_labels.extend(spec::pod_labels(record));
                pod.metadata.labels = Some(kube_labels);
                Ok(())
            })
            .await?;
        spec::info_of(&pod).ok_or_else(|| Error::not_found(sandbox_what(id)))
    }

    async fn update_annotations(
        &self,
        id: &str,
        update: AnnotationUpdate,
    ) -> Result<BTreeMap<String, String>> {
        update.validate()?;
        let (_, next) = self
            .update_pod(id, |_, _, annotations| {
                let next = update.apply(annotations)?;
                sandcove_core::check_annotations(&next)?;
                *annotations = next.clone();
                Ok(next)
            })
            .await?;
        Ok(next)
    }

    async fn destroy(&self, id: &str) -> Result<()> {
        self.check_id(id)?;
        // A sandbox that is already gone for `get` (its Pod deleted or being deleted by
        // someone else, its lease over) is gone for destroy too.
        let name = match self.live_pod(id).await {
            Ok((_, record, _)) => record.name,
            Err(e) => {
                if e.is_not_found() {
                    self.forget(id);
                }
                return Err(e);
            }
        };
        let existed = self.delete_pod(id, self.inner.config.grace).await?;
        self.forget(id);
        if !existed {
            return Err(Error::not_found(sandbox_what(id)));
        }
        self.bury(ResourceKind::Sandbox, id, name, "destroyed");
        Ok(())
    }

    async fn spawn(&self, id: &str, spec: ProcessSpec) -> Result<ProcessStream> {
        AgentBackend::spawn(self, id, spec).await
    }

    async fn attach(&self, id: &str, process: ProcessSelector) -> Result<ProcessStream> {
        AgentBackend::attach(self, id, process).await
    }

    async fn write_stdin(
        &self,
        id: &str,
        process: ProcessSelector,
        options: WriteStdinOptions,
    ) -> Result<()> {
        AgentBackend::write_stdin(self, id, process, options).await
    }

    async fn close_stdin(&self, id: &str, process: ProcessSelector) -> Result<()> {
        AgentBackend::close_stdin(self, id, process).await
    }

    async fn signal(
        &self,
        id: &str,
        process: ProcessSelector,
        options: SignalOptions,
    ) -> Result<()> {
        AgentBackend::signal(self, id, process, options).await
    }

    async fn list_processes(&self, id: &str) -> Result<Vec<ProcessInfo>> {
        AgentBackend::list_processes(self, id).await
    }

    async fn read_file(&self, id: &str, path: &str, options: ReadOptions) -> Result<ByteStream> {
        AgentBackend::read_file(self, id, path, options).await
    }

    async fn write_file(
        &self,
        id: &str,
        path: &str,
        data: ByteStream,
        options: WriteOptions,
    ) -> Result<FileStat> {
        AgentBackend::write_file(self, id, path, data, options).await
    }

    async fn list_dir(
        &self,
        id: &str,
        path: &str,
        options: ListDirOptions,
    ) -> Result<Vec<FileStat>> {
        AgentBackend::list_dir(self, id, path, options).await
    }

    async fn stat(&self, id: &str, path: &str, options: StatOptions) -> Result<FileStat> {
        AgentBackend::stat(self, id, path, options).await
    }

    async fn mkdir(&self, id: &str, path: &str, options: MkdirOptions) -> Result<FileStat> {
        AgentBackend::mkdir(self, id, path, options).await
    }

    async fn remove(&self, id: &str, path: &str, options: RemoveOptions) -> Result<()> {
        AgentBackend::remove(self, id, path, options).await
    }

    async fn rename(
        &self,
        id: &str,
        from: &str,
        to: &str,
        options: RenameOptions,
    ) -> Result<FileStat> {
        AgentBackend::rename(self, id, from, to, options).await
    }

    async fn copy(&self, id: &str, from: &str, to: &str, options: CopyOptions) -> Result<FileStat> {
        AgentBackend::copy(self, id, from, to, options).await
    }

    async fn chmod(&self, id: &str, path: &str, options: ChmodOptions) -> Result<FileStat> {
        AgentBackend::chmod(self, id, path, options).await
    }

    async fn pause(&self, id: &str) -> Result<SandboxInfo> {
        let (_, record, _) = self.live_pod(id).await?;
        refuse_if_stopped(id, &record, "pause")?;
        Err(Error::not_supported(
            sandcove_core::Feature::Pause.name(),
            "Kubernetes cannot freeze a Pod: stop the sandbox (processes end, files stay) or \
             destroy it and keep its files in a volume",
        ))
    }

    async fn resume(&self, id: &str) -> Result<SandboxInfo> {
        let (_, record, _) = self.live_pod(id).await?;
        refuse_if_stopped(id, &record, "resume")?;
        Err(Error::not_supported(
            sandcove_core::Feature::Pause.name(),
            "Kubernetes cannot freeze a Pod, so nothing is ever paused here",
        ))
    }

    async fn stop(&self, id: &str) -> Result<SandboxInfo> {
        let max = self.inner.config.max_lifetime.as_millis() as u64;
        // Marked stopped first, so no new call starts work in it; then every process ends.
        let (pod, ()) = self
            .update_pod(id, |_, record, _| {
                if record.stopped_left_ms.is_none() {
                    let now = sandcove_core::now_millis();
                    record.stopped_left_ms = Some(record.ends_at.saturating_sub(now));
                    // Kept while stopped, up to the Pod's deadline.
                    record.ends_at =
                        (now + STOPPED_RETENTION.as_millis() as u64).min(record.created_at + max);
                }
                Ok(())
            })
            .await?;
        agent::forget(self, id);
        agent::end_every_process(self, id, &pod).await?;
        self.track_lease(&pod);
        spec::info_of(&pod).ok_or_else(|| Error::not_found(sandbox_what(id)))
    }

    async fn start(&self, id: &str) -> Result<SandboxInfo> {
        let max = self.inner.config.max_lifetime.as_millis() as u64;
        let (pod, ()) = self
            .update_pod(id, |_, record, _| {
                if let Some(left) = record.stopped_left_ms.take() {
                    record.ends_at =
                        (sandcove_core::now_millis() + left).min(record.created_at + max);
                }
                Ok(())
            })
            .await?;
        self.track_lease(&pod);
        spec::info_of(&pod).ok_or_else(|| Error::not_found(sandbox_what(id)))
    }

    async fn metrics(&self, id: &str) -> Result<Metrics> {
        AgentBackend::metrics(self, id).await
    }

    async fn resize_pty(
        &self,
        id: &str,
        process: ProcessSelector,
        options: ResizePtyOptions,
    ) -> Result<()> {
        AgentBackend::resize_pty(self, id, process, options).await
    }

    async fn watch(&self, id: &str, path: &str, options: WatchOptions) -> Result<WatchStream> {
        AgentBackend::watch(self, id, path, options).await
    }

    async fn expose_port(&self, id: &str, options: PreviewOptions) -> Result<Preview> {
        sandcove_core::validate::validate_token_ttl(options.token_ttl)?;
        self.live_pod(id).await?;
        let previews = self
            .inner
            .previews
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(id.to_string())
            .or_insert_with(|| {
                let config = &self.inner.config;
                Arc::new(PreviewSet::new(
                    config.preview_bind,
                    config.preview_host.clone(),
                ))
            })
            .clone();
        // The proxy's tasks hold the backend weakly: a dropped backend ends its previews.
        let upstream = Arc::new(agent::PreviewUpstream::new(Arc::downgrade(&self.inner), id));
        let preview = previews
            .expose(options, self.inner.config.preview_limits, upstream)
            .await?;
        // Destroyed while the listener was being set up: nothing stays open.
        if self.previews_of(id).is_none() {
            previews.close_all();
            return Err(Error::not_found(sandbox_what(id)));
        }
        Ok(preview)
    }

    async fn list_previews(&self, id: &str) -> Result<Vec<Preview>> {
        self.live_pod(id).await?;
        Ok(self.previews_of(id).map(|p| p.list()).unwrap_or_default())
    }

    async fn close_preview(&self, id: &str, port: u16) -> Result<()> {
        self.live_pod(id).await?;
        self.previews_or_not_found(id, port)?.close(port)?;
        self.bury(
            ResourceKind::Preview,
            &format!("{id}:{port}"),
            None,
            "closed",
        );
        Ok(())
    }

    async fn create_file_url(&self, _id: &str, _options: FileUrlOptions) -> Result<FileUrl> {
        // This process holds no listener of its own for them (previews are per port); a
        // server serving this backend mints and serves its own.
        let feature = sandcove_core::Feature::FileUrls;
        Err(Error::not_supported(feature.name(), feature.alternative()))
    }

    async fn create_preview_token(
        &self,
        id: &str,
        port: u16,
        options: PreviewTokenOptions,
    ) -> Result<PreviewToken> {
        let expires_at = options.expires_at;
        sandcove_core::validate::validate_token_expiry(expires_at, sandcove_core::now_millis())?;
        self.live_pod(id).await?;
        self.previews_or_not_found(id, port)?
            .create_token(port, expires_at)
    }

    async fn revoke_preview_token(&self, id: &str, port: u16, token: &str) -> Result<()> {
        self.live_pod(id).await?;
        self.previews_or_not_found(id, port)?
            .revoke_token(port, token)
    }

    async fn snapshot(&self, id: &str, _options: SnapshotOptions) -> Result<SnapshotInfo> {
        self.live_pod(id).await?;
        Err(snapshots_refused())
    }

    async fn list_snapshots(&self) -> Result<Vec<SnapshotInfo>> {
        Err(snapshots_refused())
    }

    async fn delete_snapshot(&self, _snapshot_id: &str) -> Result<()> {
        Err(snapshots_refused())
    }

    async fn fork(&self, id: &str, _options: CreateOptions) -> Result<SandboxInfo> {
        self.live_pod(id).await?;
        Err(snapshots_refused())
    }

    async fn create_volume(&self, name: &str) -> Result<VolumeInfo> {
        self.volumes_on()?;
        check_volume_name(name)?;
        let claim = spec::volume_claim(
            &self.inner.config.namespace,
            name,
            self.inner.config.volume_size_mib,
            self.inner.config.storage_class.as_deref(),
        );
        let made = self
            .inner
            .claims
            .create(&PostParams::default(), &claim)
            .await
            .map_err(|e| map_error(&format!("volume {name:?}"), e))?;
        Ok(volume_info(name, &made))
    }

    async fn get_volume(&self, name: &str) -> Result<VolumeInfo> {
        self.volumes_on()?;
        check_volume_name(name)?;
        let claim = self
            .inner
            .claims
            .get_opt(&spec::claim_name(name))
            .await
            .map_err(|e| map_error(&format!("volume {name:?}"), e))?
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .ok_or_else(|| Error::not_found(format!("volume {name:?}")))?;
        Ok(volume_info(name, &claim))
    }

    async fn list_volumes(&self) -> Result<Vec<VolumeInfo>> {
        self.volumes_on()?;
        let claims = self
            .inner
            .claims
            .list(&kube::api::ListParams::default().labels(&spec::volume_selector()))
            .await
            .map_err(|e| map_error("listing volumes", e))?;
        let mut out: Vec<VolumeInfo> = claims
            .items
            .iter()
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .filter_map(|c| {
                let name = c
                    .metadata
                    .annotations
                    .as_ref()?
                    .get(spec::VOLUME_ANNOTATION)?;
                (c.metadata.name.as_deref() == Some(spec::claim_name(name).as_str()))
                    .then(|| volume_info(name, c))
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    async fn delete_volume(&self, name: &str) -> Result<()> {
        self.volumes_on()?;
        check_volume_name(name)?;
        self.inner
            .claims
            .delete(&spec::claim_name(name), &kube::api::DeleteParams::default())
            .await
            .map_err(|e| map_error(&format!("volume {name:?}"), e))?;
        self.bury(ResourceKind::Volume, name, None, "deleted");
        Ok(())
    }

    async fn tombstone(&self, kind: ResourceKind, id: &str) -> Result<Option<Tombstone>> {
        let tombstones = self
            .inner
            .tombstones
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let by_id = tombstones
            .iter()
            .rev()
            .find(|t| t.kind == kind && t.id == id);
        let by_name = || {
            tombstones
                .iter()
                .rev()
                .find(|t| t.kind == kind && t.name.as_deref() == Some(id))
        };
        Ok(by_id
            .or_else(|| (kind == ResourceKind::Sandbox).then(by_name).flatten())
            .cloned())
    }

    async fn observe(&self, operation: &OperationId) -> Result<OperationStatus> {
        Ok(OperationStatus::Unknown {
            reason: format!(
                "the Kubernetes backend does not record operations ({operation} included); to \
                 find a sandbox whose create was interrupted, list sandboxes by a label set at \
                 create"
            ),
        })
    }
}

impl KubeBackend {
    fn volumes_on(&self) -> Result<()> {
        if self.inner.config.volumes {
            Ok(())
        } else {
            Err(Error::not_supported(
                sandcove_core::Feature::Volumes.name(),
                sandcove_core::Feature::Volumes.alternative(),
            ))
        }
    }
}

fn check_volume_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "volume name {name:?} must be 1-63 letters, digits, '-', '_' or '.', not starting \
             with '.'"
        )))
    }
}

fn volume_info(name: &str, claim: &PersistentVolumeClaim) -> VolumeInfo {
    // The claim's storage request bounds it.
    let size_limit = claim
        .spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .and_then(|q| q.0.strip_suffix("Mi"))
        .and_then(|mib| mib.parse::<u64>().ok())
        .map(|mib| mib << 20);
    VolumeInfo {
        name: name.to_string(),
        created_at: claim
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.timestamp_millis().max(0) as u64)
            .unwrap_or(0),
        // A claim says what it may hold, not what it holds.
        size: 0,
        size_limit,
    }
}

/// How long a stopped sandbox is kept (bounded by its Pod's deadline), as on the embedded
/// engine.
const STOPPED_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);

/// A call that needs a running sandbox, on a stopped one.
pub(crate) fn refuse_if_stopped(id: &str, record: &PodRecord, what: &str) -> Result<()> {
    if record.stopped_left_ms.is_some() {
        return Err(Error::InvalidState {
            id: id.to_string(),
            state: "stopped".into(),
            message: format!("cannot {what} a stopped sandbox: start it first"),
        });
    }
    Ok(())
}

fn snapshots_refused() -> Error {
    Error::not_supported(
        sandcove_core::Feature::Snapshots.name(),
        "Kubernetes has no Pod filesystem snapshots: keep the files in a volume and mount it \
         in a new sandbox, or copy them in with the file API",
    )
}
