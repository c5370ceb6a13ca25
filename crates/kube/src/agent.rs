//! Sandbox-scoped calls of [`KubeBackend`]: each goes to the sandbox's in-pod agent
//! ([`AgentBackend`]) through the one agent client ([`RemoteAgent`]), at the Pod IP and the
//! agent port (or through the API server's port-forward, [`AgentReach::PortForward`]), with
//! the sandbox's derived token. A call that cannot reach the agent asks the API server whether
//! the Pod still exists, so a sandbox deleted behind our back is [`Error::NotFound`], not a
//! connection error.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Weak};

use k8s_openapi::api::core::v1::Pod;

use super::{agent_token, sandbox_what, AgentReach, Inner, KubeBackend};
use sandcove_agent::agent_backend::AgentBackend;
use sandcove_agent::client::{AgentDialer, AgentIo, RemoteAgent, TcpDialer};
use sandcove_agent::preview::{Upstream, UpstreamError};
use sandcove_core::{Error, ProcessSelector, Result, Signal, SignalOptions};

/// The agent address of a ready Pod.
fn agent_addr(backend: &KubeBackend, id: &str, pod: &Pod) -> Result<SocketAddr> {
    let ip: IpAddr = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.as_deref())
        .ok_or_else(|| Error::InvalidState {
            id: id.to_string(),
            state: "starting".into(),
            message: "its Pod has no IP yet".into(),
        })?
        .parse()
        .map_err(|e| Error::backend(format!("{}: bad Pod IP: {e}", sandbox_what(id))))?;
    Ok(SocketAddr::new(ip, backend.inner.config.agent_port))
}

/// The agent client of sandbox `id`, whose ready Pod is `pod`, reached as configured.
fn client_for(backend: &KubeBackend, id: &str, pod: &Pod) -> Result<RemoteAgent> {
    let config = &backend.inner.config;
    let dialer: Arc<dyn AgentDialer> = match config.reach {
        AgentReach::PodIp => Arc::new(TcpDialer::new(agent_addr(backend, id, pod)?)),
        AgentReach::PortForward => Arc::new(super::forward::PortForwardDialer::new(
            backend.inner.pods.clone(),
            config.namespace.clone(),
            super::spec::pod_name(id),
            config.agent_port,
        )),
    };
    Ok(RemoteAgent::new(id, dialer, agent_token(&config.key, id)))
}

/// The agent client of sandbox `id`, from the cache or from its Pod.
async fn agent(backend: &KubeBackend, id: &str) -> Result<RemoteAgent> {
    if let Some(agent) = backend
        .inner
        .agents
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(id)
    {
        return Ok(agent.clone());
    }
    let (pod, record, _) = backend.live_pod(id).await?;
    super::refuse_if_stopped(id, &record, "reach the processes or files of")?;
    if !super::spec::is_ready(&pod) {
        return Err(Error::InvalidState {
            id: id.to_string(),
            state: format!("{:?}", super::spec::state_of(&pod)).to_lowercase(),
            message: "its Pod is not ready".into(),
        });
    }
    let agent = client_for(backend, id, &pod)?;
    backend
        .inner
        .agents
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(id.to_string(), agent.clone());
    Ok(agent)
}

/// Forget the cached client of `id` (destroyed, or its Pod is gone).
pub(super) fn forget(backend: &KubeBackend, id: &str) {
    backend
        .inner
        .agents
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(id);
}

/// Check a freshly ready Pod's agent: reachable, same protocol, token accepted.
pub(super) async fn first_contact(backend: &KubeBackend, id: &str, pod: &Pod) -> Result<()> {
    let agent = client_for(backend, id, pod)?;
    agent.ready().await?;
    backend
        .inner
        .agents
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(id.to_string(), agent);
    Ok(())
}

/// End every process the agent started (a stop): SIGKILL to each running one's process
/// group, again until none runs (a restart policy may bring one back once). The agent has
/// no single "end everything" request, so a process that left its group on its own
/// (`setsid`) is not reached; see docs/kubernetes.md.
pub(super) async fn end_every_process(backend: &KubeBackend, id: &str, pod: &Pod) -> Result<()> {
    let agent = client_for(backend, id, pod)?;
    for _ in 0..100 {
        let running: Vec<u32> = agent
            .list_processes()
            .await?
            .into_iter()
            .filter(|p| p.exit.is_none())
            .map(|p| p.pid)
            .collect();
        if running.is_empty() {
            return Ok(());
        }
        for pid in running {
            match agent
                .signal(ProcessSelector::Pid(pid), SignalOptions::new(Signal::Kill))
                .await
            {
                Ok(()) => {}
                // Ended meanwhile.
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        // Give the agent a moment to reap what was killed before looking again.
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    Err(Error::Backend {
        message: format!(
            "{}: processes kept running after being killed (a restart policy?)",
            sandbox_what(id)
        ),
        retryable: true,
    })
}

/// The sandbox-scoped calls [`KubeBackend`]'s [`Backend`](sandcove_core::Backend)
/// implementation passes to the sandbox's agent.
#[async_trait::async_trait]
impl AgentBackend for KubeBackend {
    async fn agent_for(&self, id: &str) -> Result<RemoteAgent> {
        agent(self, id).await
    }

    /// A failure to reach the agent is `NotFound` when the Pod is gone.
    async fn agent_failed(&self, id: &str, error: Error) -> Error {
        match error {
            // A refused token means the cached address reached another sandbox's agent (the
            // Pod is gone and its IP went to another Pod), or this server's key is not the
            // one the sandbox was made with: the address is looked up again next time either
            // way.
            Error::Unauthenticated { .. } => {
                forget(self, id);
                match self.live_pod(id).await {
                    Err(gone) if gone.is_not_found() => gone,
                    _ => error,
                }
            }
            Error::Backend { .. } | Error::Timeout { .. } | Error::Io { .. } => {
                match self.live_pod(id).await {
                    Err(gone) if gone.is_not_found() => {
                        forget(self, id);
                        gone
                    }
                    _ => error,
                }
            }
            other => other,
        }
    }
}

/// A byte stream to `port` on the sandbox's loopback, through its agent.
async fn tunnel(b: &KubeBackend, id: &str, port: u16) -> Result<Box<dyn AgentIo>> {
    let agent = b.agent_for(id).await?;
    b.agent_result(id, agent.tunnel(port).await).await
}

/// How the previews this process serves reach a sandbox's port: an agent tunnel per
/// forwarded request. Holds the backend weakly, so previews never keep a dropped backend alive.
pub(super) struct PreviewUpstream {
    backend: Weak<Inner>,
    id: String,
}

impl PreviewUpstream {
    pub(super) fn new(backend: Weak<Inner>, id: &str) -> Self {
        PreviewUpstream {
            backend,
            id: id.to_string(),
        }
    }
}

#[async_trait::async_trait]
impl Upstream for PreviewUpstream {
    async fn connect(&self, port: u16) -> std::result::Result<Box<dyn AgentIo>, UpstreamError> {
        let Some(inner) = self.backend.upgrade() else {
            return Err(UpstreamError::Unavailable(
                "the server is shutting down".into(),
            ));
        };
        let backend = KubeBackend { inner };
        match tunnel(&backend, &self.id, port).await {
            Ok(stream) => Ok(stream),
            // Stopped, not ready, or gone: the sandbox cannot serve now.
            Err(e @ (Error::InvalidState { .. } | Error::NotFound { .. })) => {
                Err(UpstreamError::Unavailable(e.to_string()))
            }
            Err(e) => Err(UpstreamError::BadGateway(e.to_string())),
        }
    }
}
