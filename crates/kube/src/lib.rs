//! `KubeBackend`: sandboxes as Pods of a Kubernetes cluster, behind the same [`Backend`].
//!
//! A sandbox is one Pod (`sandcove-<id>`) in a configured namespace whose container runs the
//! in-pod agent (`sandcove agent --listen`, the same agent code as the embedded engine's,
//! serving its protocol over TCP). Kubernetes schedules, isolates (the container runtime; a
//! `runtimeClassName` selects gVisor or Kata) and cleans up; this module only translates:
//!
//! - **State** lives in the Pod: labels for what `list` filters on (selectors, see
//!   [`spec::list_selector`]), annotations for the rest (the record: name, lease end, envs,
//!   user; the sandbox's own annotations). A restarted server rebuilds everything from them.
//! - **Create** sends the Pod and waits for it to become Ready through a watch (never by
//!   polling); past the ready timeout the Pod is deleted and the call is
//!   [`Error::Timeout`]. **Destroy** deletes with a grace period and watches until the Pod
//!   is gone.
//! - **Leases** are enforced by the serving process (one reaper task over every Pod, rebuilt
//!   from the annotations at start) and backed by `activeDeadlineSeconds` (the configured
//!   [`KubeConfig::max_lifetime`]), so a crashed server still leaves nothing running forever.
//! - **The agent** is reached at the Pod IP and the agent port (the server runs in the
//!   cluster). Each sandbox has its own token, HMAC-SHA256(backend key, sandbox id): a
//!   restarted server recomputes it, and only its SHA-256 is in the Pod spec, so reading the
//!   Pod does not give it away.
//!   From outside the cluster, [`AgentReach::PortForward`] carries the same connections
//!   through the API server's `portforward` subresource instead; the token authenticates
//!   to the agent either way.
//! - **Previews** are served by this process, as the engine's monitor serves them (the same
//!   proxy: token checks, limits, revocation): a listener per exposed port on
//!   [`KubeConfig::preview_bind`], each connection an agent tunnel to the port inside the
//!   Pod. Their tokens live in this process's memory; they end with the sandbox.
//! - **Stop** keeps the Pod (files included), kills every process its agent started and
//!   pauses the lease; **start** gives the lease back. What Kubernetes has no equivalent for
//!   (pause, snapshots, fork) is [`Error::NotSupported`] with the alternative, declared in
//!   [`Capabilities`].

mod forward;
pub mod spec;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use futures::TryStreamExt;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy as KubeNetworkPolicy;
use kube::api::{Api, PostParams, WatchEvent, WatchParams};
use kube::Client;

use sandcove_agent::preview::PreviewSet;
use sandcove_agent::valid_id;
use sandcove_core::{
    AnnotationUpdate, Backend, ByteStream, Capabilities, CopyOptions, CreateOptions, Error,
    FileStat, ListDirOptions, ListOptions, Metrics, MkdirOptions, NetworkPolicy, OperationId,
    OperationStatus, Preview, PreviewOptions, PreviewToken, ProcessInfo, ProcessSelector,
    ProcessSpec, ProcessStream, PtySize, ReadOptions, RemoveOptions, RenameOptions, ResourceKind,
    Result, SandboxInfo, SandboxState, Signal, SnapshotInfo, StatOptions, Tombstone, UnixMillis,
    UserInfo, VolumeInfo, WatchOptions, WatchStream, WriteOptions,
};
use spec::PodRecord;

/// The agent's default TCP port inside a sandbox Pod.
pub const DEFAULT_AGENT_PORT: u16 = 7711;

/// Shortest backend key accepted, in bytes: the agent tokens are derived from it.
pub const MIN_KEY_BYTES: usize = 32;

/// How many ended resources the serving process remembers for [`Backend::tombstone`].
const MAX_TOMBSTONES: usize = 4096;

/// How the serving process reaches a sandbox's agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum AgentReach {
    /// The Pod IP and the agent port: the server runs inside the cluster (the normal
    /// deployment, `deploy/`).
    #[default]
    PodIp,
    /// Through the API server's port-forward (the Pod's `portforward` subresource, one
    /// WebSocket per agent connection), for a server outside the cluster: its credentials
    /// need `pods/portforward` (create) besides Pods.
    PortForward,
}

/// The deployment settings of a [`KubeBackend`].
#[derive(Clone)]
#[non_exhaustive]
pub struct KubeConfig {
    /// The namespace sandboxes (Pods, claims, policies) live in.
    pub namespace: String,
    /// The sandbox image: Sandcove's, whose entrypoint is `sandcove agent --listen`.
    pub image: String,
    /// `runtimeClassName` of sandbox Pods (e.g. `gvisor`, `kata`), if any.
    pub runtime_class: Option<String>,
    /// The agent's TCP port in every Pod.
    pub agent_port: u16,
    /// The uid (and gid) sandbox containers run as; never 0.
    pub uid: i64,
    /// Grace period of a destroy (SIGTERM to SIGKILL).
    pub grace: Duration,
    /// How long a create waits for the Pod to become Ready.
    pub ready_timeout: Duration,
    /// The longest a sandbox may live, leases included: its Pod's `activeDeadlineSeconds`.
    pub max_lifetime: Duration,
    /// The backend key the agent tokens derive from (at least [`MIN_KEY_BYTES`]).
    pub key: Vec<u8>,
    /// How the agent is reached.
    pub reach: AgentReach,
    /// Whether the Pods are isolated from the machine running them (true on a cluster; a
    /// test's fake kubelet that runs agents as local processes says `false`).
    pub isolated: bool,
    /// Whether named volumes (claims) are offered.
    pub volumes: bool,
    /// Size of a new volume's claim, in MiB.
    pub volume_size_mib: u64,
    /// Storage class of volume claims (`None`: the cluster's default).
    pub storage_class: Option<String>,
    /// Largest single file read or write, in bytes.
    pub max_file_bytes: u64,
    /// The address preview listeners bind: `127.0.0.1` by default (reachable only on this
    /// machine, as the engine's); an in-cluster server that publishes previews through its
    /// own Service binds `0.0.0.0` (private previews still need their token).
    pub preview_bind: IpAddr,
    /// The host name preview URLs carry (with each listener's port), when clients reach the
    /// server by another name than [`KubeConfig::preview_bind`]; `None`: the bound address.
    pub preview_host: Option<String>,
    /// Head timeout and connection cap of each preview listener.
    pub preview_limits: sandcove_agent::preview::PreviewLimits,
}

impl std::fmt::Debug for KubeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeConfig")
            .field("namespace", &self.namespace)
            .field("image", &self.image)
            .field("runtime_class", &self.runtime_class)
            .field("agent_port", &self.agent_port)
            .field("reach", &self.reach)
            .field("key", &"<redacted>")
            .finish_non_exhaustive()
    }
}

impl KubeConfig {
    /// Settings with the defaults: agent port [`DEFAULT_AGENT_PORT`], uid 1000, a 5 s grace
    /// period, 120 s to become ready, a 24 h maximum life, isolated, 1 GiB volumes.
    pub fn new(namespace: impl Into<String>, image: impl Into<String>, key: Vec<u8>) -> Self {
        KubeConfig {
            namespace: namespace.into(),
            image: image.into(),
            runtime_class: None,
            agent_port: DEFAULT_AGENT_PORT,
            uid: 1000,
            grace: Duration::from_secs(5),
            ready_timeout: Duration::from_secs(120),
            max_lifetime: Duration::from_secs(24 * 3600),
            key,
            reach: AgentReach::PodIp,
            isolated: true,
            volumes: true,
            volume_size_mib: 1024,
            storage_class: None,
            max_file_bytes: sandcove_agent::MAX_FILE_BYTES,
            preview_bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
            preview_host: None,
            preview_limits: sandcove_agent::preview::PreviewLimits::default(),
        }
    }

    fn check(&self) -> Result<()> {
        if self.key.len() < MIN_KEY_BYTES {
            return Err(Error::invalid(format!(
                "the Kubernetes backend key must hold at least {MIN_KEY_BYTES} bytes (it has {})",
                self.key.len()
            )));
        }
        if self.uid <= 0 {
            return Err(Error::invalid("sandbox Pods never run as root (uid 0)"));
        }
        if self.namespace.is_empty() || self.image.is_empty() {
            return Err(Error::invalid("a namespace and an image are required"));
        }
        Ok(())
    }

    fn pod_params(&self) -> spec::PodParams {
        spec::PodParams {
            namespace: self.namespace.clone(),
            image: self.image.clone(),
            runtime_class: self.runtime_class.clone(),
            agent_port: self.agent_port,
            uid: self.uid,
            grace_seconds: self.grace.as_secs() as u32,
            deadline_seconds: self.max_lifetime.as_secs().max(1) as i64,
        }
    }
}

/// The agent token of sandbox `id`: HMAC-SHA256(`key`, a context string and the id), hex.
/// A restarted server recomputes it from its key; the Pod only holds [`token_sha256`] of it.
pub fn agent_token(key: &[u8], id: &str) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key);
    let tag = ring::hmac::sign(&key, format!("sandcove agent token v1\0{id}").as_bytes());
    spec::hex(tag.as_ref())
}

/// Hex SHA-256 of a token: what the agent is configured with.
pub fn token_sha256(token: &str) -> String {
    sandcove_agent::pod::token_sha256_hex(token)
}

/// The runtime identity of a deployment: stable across restarts (derived from the key and
/// the namespace), distinct between deployments with other keys or namespaces.
fn runtime_id(key: &[u8], namespace: &str) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key);
    let tag = ring::hmac::sign(
        &key,
        format!("sandcove runtime id v1\0{namespace}").as_bytes(),
    );
    format!("rt-k8s-{}", &spec::hex(tag.as_ref())[..20])
}

/// Map a Kubernetes API status to the core error, `what` naming the subject.
pub fn from_status(what: &str, code: u16, reason: &str, message: &str) -> Error {
    match code {
        400 | 422 => Error::invalid(format!("Kubernetes refused {what}: {message}")),
        401 => Error::Unauthenticated {
            message: format!("the Kubernetes API server refused our credentials: {message}"),
        },
        403 => Error::Unavailable {
            reason: format!("the Kubernetes API server forbids {what}: {message}"),
            remedy: "grant the server's service account the Role in deploy/ (Pods, \
                     PersistentVolumeClaims and NetworkPolicies in the sandbox namespace), or \
                     raise the namespace's quota"
                .into(),
        },
        404 => Error::not_found(what.to_string()),
        409 if reason == "AlreadyExists" => Error::AlreadyExists {
            what: what.to_string(),
        },
        409 => Error::Conflict {
            what: format!("{what}: {message}"),
        },
        429 => Error::RateLimited {
            message: format!("the Kubernetes API server: {message}"),
            retry_after_ms: None,
        },
        _ => Error::Backend {
            message: format!("the Kubernetes API server answered {code} to {what}: {message}"),
            retryable: code >= 500 && code != 501,
        },
    }
}

/// Map a client error (an API status, or the connection) to the core error.
pub fn map_error(what: &str, e: kube::Error) -> Error {
    match e {
        kube::Error::Api(r) => from_status(what, r.code, &r.reason, &r.message),
        other => Error::Backend {
            message: format!("the Kubernetes API server, on {what}: {other}"),
            retryable: true,
        },
    }
}

fn sandbox_what(id: &str) -> String {
    format!("sandbox {id:?}")
}

/// The sandboxes of one Kubernetes namespace. See the module docs.
#[derive(Clone)]
pub struct KubeBackend {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for KubeBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeBackend")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

struct Inner {
    config: KubeConfig,
    pods: Api<Pod>,
    claims: Api<PersistentVolumeClaim>,
    policies: Api<KubeNetworkPolicy>,
    /// Lease ends of the sandboxes this process enforces, by id.
    leases: Mutex<HashMap<String, UnixMillis>>,
    /// Wakes the reaper when a lease was added or moved (shared with the reaper, which
    /// must not keep the backend alive).
    wake: Arc<tokio::sync::Notify>,
    /// Agent clients of the sandboxes seen ready, by id.
    agents: Mutex<HashMap<String, sandcove_agent::client::RemoteAgent>>,
    /// The previews this process serves, by sandbox id.
    previews: Mutex<HashMap<String, Arc<PreviewSet>>>,
    /// Serializes named creates of this process (the check and the Pod's creation).
    names: tokio::sync::Mutex<()>,
    /// Whether the namespace's egress policies are known to exist.
    policies_ready: tokio::sync::OnceCell<()>,
    tombstones: Mutex<VecDeque<Tombstone>>,
    runtime_id: String,
    probed_at: UnixMillis,
}

impl KubeBackend {
    /// A backend for the cluster of the usual configuration: `KUBECONFIG` or
    /// `~/.kube/config`, else the in-cluster service account.
    pub async fn connect(config: KubeConfig) -> Result<Self> {
        let client = Client::try_default()
            .await
            .map_err(|e| Error::Unavailable {
                reason: format!("no Kubernetes configuration: {e}"),
                remedy: "run inside the cluster with a service account (deploy/), or set \
                     KUBECONFIG"
                    .into(),
            })?;
        Self::with_client(client, config).await
    }

    /// A backend for the API server at `url` (plain `http://` included, as a local fake or
    /// `kubectl proxy` serves), without credentials.
    pub async fn with_url(url: &str, config: KubeConfig) -> Result<Self> {
        let uri = url
            .parse()
            .map_err(|e| Error::invalid(format!("Kubernetes API URL {url:?}: {e}")))?;
        let mut kube_config = kube::Config::new(uri);
        kube_config.default_namespace = config.namespace.clone();
        let client = Client::try_from(kube_config).map_err(|e| Error::Unavailable {
            reason: format!("Kubernetes client for {url}: {e}"),
            remedy: "check the API server URL".into(),
        })?;
        Self::with_client(client, config).await
    }

    /// A backend over a built client. Lists the namespace's sandbox Pods once to rebuild the
    /// leases (deleting those already over) and starts the reaper.
    pub async fn with_client(client: Client, config: KubeConfig) -> Result<Self> {
        config.check()?;
        let inner = Arc::new(Inner {
            pods: Api::namespaced(client.clone(), &config.namespace),
            claims: Api::namespaced(client.clone(), &config.namespace),
            policies: Api::namespaced(client, &config.namespace),
            runtime_id: runtime_id(&config.key, &config.namespace),
            config,
            leases: Mutex::new(HashMap::new()),
            wake: Arc::new(tokio::sync::Notify::new()),
            agents: Mutex::new(HashMap::new()),
            previews: Mutex::new(HashMap::new()),
            names: tokio::sync::Mutex::new(()),
            policies_ready: tokio::sync::OnceCell::new(),
            tombstones: Mutex::new(VecDeque::new()),
            probed_at: sandcove_core::now_millis(),
        });
        let pods = inner
            .pods
            .list(&spec::list_params(&ListOptions::default()))
            .await
            .map_err(|e| map_error("listing sandbox Pods", e))?;
        {
            let mut leases = inner.leases.lock().unwrap_or_else(|e| e.into_inner());
            for pod in &pods.items {
                if let Some((record, _)) = spec::record_of(pod) {
                    leases.insert(record.id, record.ends_at);
                }
            }
        }
        tokio::spawn(reaper(Arc::downgrade(&inner), inner.wake.clone()));
        Ok(KubeBackend { inner })
    }

    /// The settings in force.
    pub fn config(&self) -> &KubeConfig {
        &self.inner.config
    }

    fn check_id(&self, id: &str) -> Result<String> {
        if valid_id(id) {
            Ok(spec::pod_name(id))
        } else {
            Err(Error::not_found(sandbox_what(id)))
        }
    }

    /// The Pod of sandbox `id` and its record, whatever its lease or deletion say: a Pod
    /// that is missing or not a sandbox's is [`Error::NotFound`].
    async fn fetch_pod(&self, id: &str) -> Result<(Pod, PodRecord, BTreeMap<String, String>)> {
        let name = self.check_id(id)?;
        let pod = self
            .inner
            .pods
            .get_opt(&name)
            .await
            .map_err(|e| map_error(&sandbox_what(id), e))?
            .ok_or_else(|| Error::not_found(sandbox_what(id)))?;
        let (record, annotations) =
            spec::record_of(&pod).ok_or_else(|| Error::not_found(sandbox_what(id)))?;
        Ok((pod, record, annotations))
    }

    /// The live Pod of sandbox `id` (a lease that ended or a Pod being deleted is gone).
    async fn live_pod(&self, id: &str) -> Result<(Pod, PodRecord, BTreeMap<String, String>)> {
        let (pod, record, annotations) = self.fetch_pod(id).await?;
        if pod.metadata.deletion_timestamp.is_some() {
            return Err(Error::not_found(sandbox_what(id)));
        }
        if record.ends_at <= sandcove_core::now_millis() {
            // Ended now rather than at the reaper's next round, so the tombstone is there
            // as soon as the sandbox is gone.
            self.end_lease(id, record.name).await;
            return Err(Error::not_found(sandbox_what(id)));
        }
        Ok((pod, record, annotations))
    }

    /// Delete a sandbox whose lease ended and leave its tombstone. The tombstone comes
    /// first: from the moment the lease is over the sandbox is gone for every caller, also
    /// while its Pod is still being deleted.
    async fn end_lease(&self, id: &str, name: Option<String>) {
        let buried = self
            .inner
            .tombstones
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|t| t.kind == ResourceKind::Sandbox && t.id == id);
        if !buried {
            self.bury(ResourceKind::Sandbox, id, name, "its lease ended");
        }
        match self.delete_pod(id, self.inner.config.grace).await {
            Ok(_) => self.forget(id),
            Err(e) => {
                tracing::warn!(sandbox = %id, "ending a lease: {e}");
                // Try again shortly, not in a tight loop.
                self.inner
                    .leases
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(id.to_string(), sandcove_core::now_millis() + 5_000);
            }
        }
    }

    /// Replace the Pod after `change` edits it, retrying when another writer got there first
    /// (the resourceVersion precondition of a replace).
    async fn update_pod<T>(
        &self,
        id: &str,
        mut change: impl FnMut(&mut Pod, &mut PodRecord, &mut BTreeMap<String, String>) -> Result<T>,
    ) -> Result<(Pod, T)> {
        for _ in 0..16 {
            let (mut pod, mut record, mut annotations) = self.live_pod(id).await?;
            let out = change(&mut pod, &mut record, &mut annotations)?;
            let meta_annotations = pod.metadata.annotations.get_or_insert_default();
            meta_annotations.insert(
                spec::RECORD_ANNOTATION.into(),
                serde_json::to_string(&record).map_err(|e| Error::backend(e.to_string()))?,
            );
            meta_annotations.insert(
                spec::ANNOTATIONS_ANNOTATION.into(),
                serde_json::to_string(&annotations).map_err(|e| Error::backend(e.to_string()))?,
            );
            let name = spec::pod_name(id);
            match self
                .inner
                .pods
                .replace(&name, &PostParams::default(), &pod)
                .await
            {
                Ok(pod) => return Ok((pod, out)),
                Err(kube::Error::Api(r)) if r.code == 409 => continue,
                Err(e) => return Err(map_error(&sandbox_what(id), e)),
            }
        }
        Err(Error::Backend {
            message: format!(
                "{} kept changing under concurrent updates",
                sandbox_what(id)
            ),
            retryable: true,
        })
    }

    /// Make sure the namespace's egress policies exist (once per process): a sandbox with
    /// `NetworkPolicy::None` is never created without the policy that confines it.
    async fn ensure_policies(&self) -> Result<()> {
        self.inner
            .policies_ready
            .get_or_try_init(|| async {
                for policy in spec::egress_policies(&self.inner.config.namespace) {
                    let name = policy.metadata.name.clone().unwrap_or_default();
                    match self
                        .inner
                        .policies
                        .create(&PostParams::default(), &policy)
                        .await
                    {
                        Ok(_) => {}
                        Err(kube::Error::Api(r)) if r.code == 409 => {}
                        Err(e) => {
                            return Err(map_error(&format!("network policy {name:?}"), e));
                        }
                    }
                }
                Ok(())
            })
            .await
            .map(|_| ())
    }

    /// Watch Pod `name` from `version` until `done` says what became of it, or `limit`.
    async fn watch_pod<T>(
        &self,
        name: &str,
        mut version: String,
        limit: Duration,
        what: &str,
        mut done: impl FnMut(&WatchEvent<Pod>) -> Option<Result<T>>,
    ) -> Result<T> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let params = WatchParams::default()
                .fields(&format!("metadata.name={name}"))
                .timeout((left.as_secs() as u32).clamp(1, 290));
            let stream = self
                .inner
                .pods
                .watch(&params, &version)
                .await
                .map_err(|e| map_error(what, e))?;
            let mut stream = std::pin::pin!(stream);
            loop {
                let event = match tokio::time::timeout_at(deadline, stream.try_next()).await {
                    Err(_) => {
                        return Err(Error::Timeout {
                            what: format!("{what} ({}s)", limit.as_secs()),
                        })
                    }
                    Ok(Err(e)) => return Err(map_error(what, e)),
                    Ok(Ok(None)) => break,
                    Ok(Ok(Some(event))) => event,
                };
                if let Some(out) = done(&event) {
                    return out;
                }
                match &event {
                    WatchEvent::Added(p) | WatchEvent::Modified(p) | WatchEvent::Deleted(p) => {
                        if let Some(v) = &p.metadata.resource_version {
                            version = v.clone();
                        }
                    }
                    WatchEvent::Bookmark(b) => version = b.metadata.resource_version.clone(),
                    WatchEvent::Error(e) if e.code == 410 => {
                        // Our version is too old: start again from the Pod as it is now.
                        match self.inner.pods.get_opt(name).await {
                            Ok(Some(pod)) => {
                                let event = WatchEvent::Modified(pod);
                                if let Some(out) = done(&event) {
                                    return out;
                                }
                                if let WatchEvent::Modified(pod) = event {
                                    version = pod.metadata.resource_version.unwrap_or_default();
                                }
                            }
                            Ok(None) => {
                                let event = WatchEvent::Deleted(Pod::default());
                                if let Some(out) = done(&event) {
                                    return out;
                                }
                                return Err(Error::not_found(what.to_string()));
                            }
                            Err(e) => return Err(map_error(what, e)),
                        }
                        break;
                    }
                    WatchEvent::Error(e) => {
                        return Err(from_status(what, e.code, &e.reason, &e.message))
                    }
                }
            }
        }
    }

    /// Wait until Pod `name` is Ready (the agent listens).
    async fn wait_ready(&self, id: &str, created: &Pod) -> Result<Pod> {
        let name = spec::pod_name(id);
        let version = created
            .metadata
            .resource_version
            .clone()
            .unwrap_or_default();
        let what = format!("{} becoming ready", sandbox_what(id));
        self.watch_pod(
            &name,
            version,
            self.inner.config.ready_timeout,
            &what,
            |event| match event {
                WatchEvent::Added(pod) | WatchEvent::Modified(pod) => {
                    if spec::is_ready(pod) {
                        Some(Ok(pod.clone()))
                    } else if matches!(spec::phase(pod), Some("Failed") | Some("Succeeded")) {
                        let why = pod
                            .status
                            .as_ref()
                            .and_then(|s| s.message.clone().or(s.reason.clone()))
                            .unwrap_or_default();
                        Some(Err(Error::Backend {
                            message: format!("{} ended while starting: {why}", sandbox_what(id)),
                            retryable: true,
                        }))
                    } else if pod.metadata.deletion_timestamp.is_some() {
                        Some(Err(Error::not_found(format!(
                            "{} (deleted while starting)",
                            sandbox_what(id)
                        ))))
                    } else {
                        None
                    }
                }
                WatchEvent::Deleted(_) => Some(Err(Error::not_found(format!(
                    "{} (deleted while starting)",
                    sandbox_what(id)
                )))),
                _ => None,
            },
        )
        .await
    }

    /// Delete the Pod of `id` and wait until it is gone. `Ok(false)` when there was none.
    async fn delete_pod(&self, id: &str, grace: Duration) -> Result<bool> {
        let name = spec::pod_name(id);
        let what = sandbox_what(id);
        let deleted = match self
            .inner
            .pods
            .delete(&name, &spec::delete_params(grace.as_secs() as u32))
            .await
        {
            Ok(deleted) => deleted,
            Err(kube::Error::Api(r)) if r.code == 404 => return Ok(false),
            Err(e) => return Err(map_error(&what, e)),
        };
        let Some(pod) = deleted.left() else {
            return Ok(true); // Gone at once.
        };
        let version = pod.metadata.resource_version.clone().unwrap_or_default();
        let limit = grace + Duration::from_secs(60);
        let gone = self
            .watch_pod(
                &name,
                version,
                limit,
                &format!("{what} being deleted"),
                |e| matches!(e, WatchEvent::Deleted(_)).then_some(Ok(())),
            )
            .await;
        match gone {
            Ok(()) => Ok(true),
            // Deleted between the delete and the watch.
            Err(e) if e.is_not_found() => Ok(true),
            Err(e) => Err(e),
        }
    }

    fn bury(&self, kind: ResourceKind, id: &str, name: Option<String>, reason: &str) {
        let mut tombstones = self
            .inner
            .tombstones
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if tombstones.len() >= MAX_TOMBSTONES {
            tombstones.pop_front();
        }
        let mut tombstone = Tombstone::now(kind, id, reason);
        tombstone.name = name;
        tombstones.push_back(tombstone);
    }

    /// Drop what this process holds for a sandbox that is gone: its lease, its agent
    /// client, its previews (their listeners close and their connections end).
    fn forget(&self, id: &str) {
        self.inner
            .leases
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
        agent::forget(self, id);
        let previews = self
            .inner
            .previews
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
        if let Some(previews) = previews {
            previews.close_all();
        }
    }

    /// The previews of sandbox `id` this process serves, if any.
    fn previews_of(&self, id: &str) -> Option<Arc<PreviewSet>> {
        self.inner
            .previews
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned()
    }

    /// The previews of `id` when there are none: a [`Error::NotFound`] naming the port.
    fn previews_or_not_found(&self, id: &str, port: u16) -> Result<Arc<PreviewSet>> {
        self.previews_of(id)
            .ok_or_else(|| Error::not_found(format!("preview of port {port}")))
    }

    /// Enforce the lease the Pod's record now says.
    fn track_lease(&self, pod: &Pod) {
        if let Some((record, _)) = spec::record_of(pod) {
            self.inner
                .leases
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(record.id, record.ends_at);
            self.inner.wake.notify_one();
        }
    }

    /// Refuse what Kubernetes cannot honour, before any effect.
    fn check_create(&self, options: &CreateOptions) -> Result<()> {
        options.validate()?;
        if !sandcove_core::capability::is_host_base(options.template.as_deref()) {
            return Err(Error::not_supported(
                format!(
                    "template or image {:?}",
                    options.template.as_deref().unwrap_or_default()
                ),
                "this deployment runs one image, its configured sandbox image (template None or \
                 \"base\"); run another deployment for another image",
            ));
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

    /// The sandbox Pods `options`' selectors match (labels that do not fit a selector are
    /// left for the caller to filter).
    async fn pods_matching(&self, options: &ListOptions) -> Result<Vec<Pod>> {
        let pods = self
            .inner
            .pods
            .list(&spec::list_params(options))
            .await
            .map_err(|e| map_error("listing sandbox Pods", e))?;
        Ok(pods.items)
    }

    /// Whether another live sandbox holds `name`.
    async fn name_taken(&self, name: &str, except: Option<&str>) -> Result<Option<PodRecord>> {
        let mut options = ListOptions::default();
        options.name = Some(name.to_string());
        let pods = self.pods_matching(&options).await?;
        let now = sandcove_core::now_millis();
        let mut holders: Vec<PodRecord> = pods
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter_map(spec::record_of)
            .map(|(r, _)| r)
            .filter(|r| r.name.as_deref() == Some(name) && r.ends_at > now)
            .collect();
        holders.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        Ok(holders.into_iter().find(|r| Some(r.id.as_str()) != except))
    }
}

mod agent;

/// The lease enforcer of one backend: sleeps until the earliest lease end (or a change), then
/// deletes every Pod whose lease is over. Holds the backend only while it works, so it ends
/// with the backend.
async fn reaper(inner: Weak<Inner>, wake: Arc<tokio::sync::Notify>) {
    loop {
        let notified = wake.notified();
        let mut notified = std::pin::pin!(notified);
        // Registered before the leases are read, so a change made meanwhile still wakes us.
        notified.as_mut().enable();
        let next = {
            let Some(inner) = inner.upgrade() else {
                return;
            };
            KubeBackend { inner }.end_due_leases().await
        };
        let sleep = match next {
            Some(end) => Duration::from_millis(end.saturating_sub(sandcove_core::now_millis())),
            None => Duration::from_secs(60),
        };
        let _ = tokio::time::timeout(sleep.min(Duration::from_secs(60)), notified).await;
    }
}

impl KubeBackend {
    /// Delete every sandbox whose lease is over; returns the next lease end.
    async fn end_due_leases(&self) -> Option<UnixMillis> {
        let now = sandcove_core::now_millis();
        let due: Vec<String> = self
            .inner
            .leases
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(_, end)| **end <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for id in due {
            let name = match self.live_pod_any_lease(&id).await {
                Ok(record) if record.ends_at > sandcove_core::now_millis() => {
                    // Moved (set_timeout, stop) by another serving process: follow it.
                    self.inner
                        .leases
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(id.clone(), record.ends_at);
                    continue;
                }
                Ok(record) => record.name,
                Err(_) => None,
            };
            self.end_lease(&id, name).await;
        }
        self.inner
            .leases
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .min()
            .copied()
    }

    /// The record of sandbox `id`'s Pod, whatever its lease says.
    async fn live_pod_any_lease(&self, id: &str) -> Result<PodRecord> {
        self.fetch_pod(id).await.map(|(_, record, _)| record)
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
            template: "base".into(),
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

    async fn set_timeout(&self, id: &str, timeout: Duration) -> Result<SandboxInfo> {
        let lease = self.lease_bounds().resolve(timeout)?;
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

    async fn set_labels(&self, id: &str, labels: BTreeMap<String, String>) -> Result<SandboxInfo> {
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
        agent::spawn(self, id, spec).await
    }

    async fn attach(&self, id: &str, process: ProcessSelector) -> Result<ProcessStream> {
        agent::attach(self, id, process).await
    }

    async fn write_stdin(&self, id: &str, process: ProcessSelector, data: Vec<u8>) -> Result<()> {
        agent::write_stdin(self, id, process, data).await
    }

    async fn close_stdin(&self, id: &str, process: ProcessSelector) -> Result<()> {
        agent::close_stdin(self, id, process).await
    }

    async fn signal(&self, id: &str, process: ProcessSelector, signal: Signal) -> Result<()> {
        agent::signal(self, id, process, signal).await
    }

    async fn list_processes(&self, id: &str) -> Result<Vec<ProcessInfo>> {
        agent::list_processes(self, id).await
    }

    async fn read_file(&self, id: &str, path: &str, options: ReadOptions) -> Result<ByteStream> {
        agent::read_file(self, id, path, options).await
    }

    async fn write_file(
        &self,
        id: &str,
        path: &str,
        data: ByteStream,
        options: WriteOptions,
    ) -> Result<FileStat> {
        agent::write_file(self, id, path, data, options).await
    }

    async fn list_dir(
        &self,
        id: &str,
        path: &str,
        options: ListDirOptions,
    ) -> Result<Vec<FileStat>> {
        agent::list_dir(self, id, path, options).await
    }

    async fn stat(&self, id: &str, path: &str, options: StatOptions) -> Result<FileStat> {
        agent::stat(self, id, path, options).await
    }

    async fn mkdir(&self, id: &str, path: &str, options: MkdirOptions) -> Result<FileStat> {
        agent::mkdir(self, id, path, options).await
    }

    async fn remove(&self, id: &str, path: &str, options: RemoveOptions) -> Result<()> {
        agent::remove(self, id, path, options).await
    }

    async fn rename(
        &self,
        id: &str,
        from: &str,
        to: &str,
        options: RenameOptions,
    ) -> Result<FileStat> {
        agent::rename(self, id, from, to, options).await
    }

    async fn copy(&self, id: &str, from: &str, to: &str, options: CopyOptions) -> Result<FileStat> {
        agent::copy(self, id, from, to, options).await
    }

    async fn chmod(&self, id: &str, path: &str, mode: u32) -> Result<FileStat> {
        agent::chmod(self, id, path, mode).await
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
        agent::metrics(self, id).await
    }

    async fn resize_pty(&self, id: &str, process: ProcessSelector, size: PtySize) -> Result<()> {
        agent::resize_pty(self, id, process, size).await
    }

    async fn watch(&self, id: &str, path: &str, options: WatchOptions) -> Result<WatchStream> {
        agent::watch(self, id, path, options).await
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

    async fn create_preview_token(
        &self,
        id: &str,
        port: u16,
        expires_at: Option<u64>,
    ) -> Result<PreviewToken> {
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

    async fn snapshot(&self, id: &str, _name: Option<String>) -> Result<SnapshotInfo> {
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
fn refuse_if_stopped(id: &str, record: &PodRecord, what: &str) -> Result<()> {
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

#[cfg(test)]
mod tests;
