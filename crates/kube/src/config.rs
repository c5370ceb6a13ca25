//! The deployment settings of a [`KubeBackend`](crate::KubeBackend): namespace, image and runtime
//! class, the agent's port and how it is reached, the limits of sandbox Pods, volumes and previews.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use sandcove_core::{Error, Result};

use crate::spec;

/// The agent's default TCP port inside a sandbox Pod.
pub const DEFAULT_AGENT_PORT: u16 = 7711;

/// Shortest backend key accepted, in bytes: the agent tokens are derived from it.
pub const MIN_KEY_BYTES: usize = 32;

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

/// The deployment settings of a [`KubeBackend`](crate::KubeBackend).
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

    pub(crate) fn check(&self) -> Result<()> {
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

    pub(crate) fn pod_params(&self) -> spec::PodParams {
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
