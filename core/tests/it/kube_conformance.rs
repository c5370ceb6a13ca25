//! The conformance suite through `KubeBackend`, against a fake API server started by this
//! program (`kube_fake`): every layer but the kubelet is real — the Kubernetes client, the
//! requests, the watches, the in-pod agent serving its protocol over TCP at the Pod IP with
//! its derived token. The fake kubelet runs each Pod's agent as a local process, so the
//! backend is configured as not isolated (`isolated: false`) and without volumes (the fake
//! mounts none); the cases that need isolation or volumes skip or assert the refusal, as
//! their capability gates say. No real cluster is part of this suite.
//!
//! The whole suite runs with the agent reached at the Pod IP (a server inside the cluster).
//! The API server's Pod port-forward (`port_forward::`, a server outside it), which the fake
//! serves as a WebSocket connected to the Pod's agent port, changes only how each agent
//! connection is carried: it runs the cases that between them make every kind of agent call
//! through it (see the list there), not the rest, whose calls go to the API server alone or
//! repeat a kind already carried.

use crate::kube_fake;

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

sandcove_conformance::conformance_tests!(kube());

/// The same cases, each agent connection carried by the API server's port-forward.
mod port_forward {
    use super::*;

    /// One `#[tokio::test]` per named conformance case, over the port-forward.
    macro_rules! through_port_forward {
        ($($case:ident),* $(,)?) => {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let backend = kube_reached(AgentReach::PortForward).await;
                    sandcove_conformance::$case(&*backend).await;
                }
            )*
        };
    }

    // Every agent call the backend makes, at least once: the first contact when a Pod turns
    // ready, spawn (argv and shell, binary and 10 MB output), stdin and its close, signals,
    // process list and attach, file writes and reads (with chmod and stat, a 50 MB file, an
    // upload failing part-way), directory calls (mkdir, list, rename, remove), copy, the
    // agent's typed errors, watch, a PTY and its resize, metrics, the preview tunnel, and
    // ending every process on stop.
    through_port_forward!(
        create_get_list_destroy,
        argv_and_shell_commands,
        output_is_binary_safe,
        large_output_streams_without_loss,
        stdin_write_and_close,
        signals_and_kill_mid_stream,
        list_and_attach_processes,
        file_round_trip_and_metadata,
        large_file_round_trip,
        failed_uploads_leave_nothing_behind,
        directory_operations,
        copy_files_and_trees,
        file_errors_are_typed,
        watch_reports_changes,
        pty_processes,
        metrics_report_usage,
        previews_serve_and_guard_private_ports,
        stop_ends_processes_keeps_files_and_start_runs_again,
    );
}
