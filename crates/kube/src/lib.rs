//! `KubeBackend`: sandboxes as Pods of a Kubernetes cluster, behind the same
//! [`Backend`](sandcove_core::Backend).
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
//!   [`Capabilities`](sandcove_core::Capabilities).
#![forbid(unsafe_code)]

mod agent;
mod backend_impl;
mod config;
mod forward;
mod leases;
mod pods;
pub mod spec;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy as KubeNetworkPolicy;
use kube::api::Api;
use kube::Client;

use sandcove_agent::preview::PreviewSet;
use sandcove_core::{Error, ListOptions, Result, Tombstone, UnixMillis};
// What the unit tests (`tests.rs`) take from here through `use super::*`.
#[cfg(test)]
use sandcove_core::{NetworkPolicy, SandboxState, UserInfo};

pub use self::config::{AgentReach, KubeConfig, DEFAULT_AGENT_PORT, MIN_KEY_BYTES};
// Named at the crate root by the backend's modules.
use self::backend_impl::refuse_if_stopped;
use self::leases::reaper;

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
}

#[cfg(test)]
mod tests;
