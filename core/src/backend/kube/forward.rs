//! Reaching an in-pod agent from outside the cluster: each agent connection is one
//! port-forward of the Pod's agent port through the API server (the `portforward`
//! subresource, a WebSocket). The API server and the kubelet carry the agent's traffic; the
//! per-sandbox token in the agent's hello still decides who is served.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Portforwarder};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::backend::agent_client::{AgentDialer, AgentIo, DEFAULT_CONNECT_TIMEOUT};
use crate::{Error, Result};

/// Dials a Pod's agent through the API server's port-forward.
pub(super) struct PortForwardDialer {
    pods: Api<Pod>,
    pod: String,
    port: u16,
    connect_timeout: Duration,
}

impl PortForwardDialer {
    /// A dialer of `port` of Pod `pod`.
    pub(super) fn new(pods: Api<Pod>, pod: String, port: u16) -> Self {
        PortForwardDialer {
            pods,
            pod,
            port,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
        }
    }
}

impl std::fmt::Debug for PortForwardDialer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PortForwardDialer")
            .field("pod", &self.pod)
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl AgentDialer for PortForwardDialer {
    async fn dial(&self) -> Result<Box<dyn AgentIo>> {
        let what = format!("a port-forward to Pod {:?}", self.pod);
        let mut forwarder = tokio::time::timeout(
            self.connect_timeout,
            self.pods.portforward(&self.pod, &[self.port]),
        )
        .await
        .map_err(|_| Error::Timeout { what: what.clone() })?
        .map_err(|e| super::map_error(&what, e))?;
        let stream = forwarder
            .take_stream(self.port)
            .ok_or_else(|| Error::backend(format!("{what} carried no stream")))?;
        Ok(Box::new(Forwarded {
            stream: Box::new(stream),
            _forwarder: forwarder,
        }))
    }
}

/// One forwarded connection. The forwarder is kept with it: it holds the receiver of the
/// port's error channel, without which its background task ends the connection at the first
/// error message instead of closing it cleanly.
struct Forwarded {
    stream: Box<dyn AgentIo>,
    _forwarder: Portforwarder,
}

impl AsyncRead for Forwarded {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Forwarded {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}
