//! The conformance suite through `KubeBackend`, against a fake API server started by this
//! program (`kube_fake`): every layer but the kubelet is real — the Kubernetes client, the
//! requests, the watches, the in-pod agent serving its protocol over TCP at the Pod IP with
//! its derived token. The fake kubelet runs each Pod's agent as a local process, so the
//! backend is configured as not isolated (`isolated: false`) and without volumes (the fake
//! mounts none); the cases that need isolation or volumes skip or assert the refusal, as
//! their capability gates say. No real cluster is part of this suite.
//!
//! The suite runs twice: with the agent reached at the Pod IP (a server inside the
//! cluster), and through the API server's Pod port-forward (`port_forward::`, a server
//! outside it), which the fake serves as a WebSocket connected to the Pod's agent port.

mod kube_fake;

use std::sync::Arc;
use std::time::Duration;

use sandcove::backend::kube::AgentReach;
use sandcove::{Backend, KubeBackend, KubeConfig};

async fn kube() -> Arc<dyn Backend> {
    kube_reached(AgentReach::PodIp).await
}

async fn kube_reached(reach: AgentReach) -> Arc<dyn Backend> {
    let fake = kube_fake::FakeCluster::shared();
    let mut config = KubeConfig::new("sandcove-test", "sandcove:test", vec![7; 32]);
    config.agent_port = fake.agent_port;
    config.uid = kube_fake::pod_uid();
    config.isolated = false;
    config.volumes = false;
    config.grace = Duration::from_secs(1);
    config.ready_timeout = Duration::from_secs(60);
    config.reach = reach;
    Arc::new(
        KubeBackend::with_url(&fake.url, config)
            .await
            .expect("a backend over the fake API server"),
    )
}

sandcove::conformance_tests!(kube());

mod port_forward {
    use super::*;

    sandcove::conformance_tests!(kube_reached(AgentReach::PortForward));
}
