//! Reaching an in-pod agent from outside the cluster: each agent connection is one
//! port-forward of the Pod's agent port through the API server (the `portforward`
//! subresource, a WebSocket). The API server and the kubelet carry the agent's traffic; the
//! per-sandbox token in the agent's hello still decides who is served.

use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use futures::{Sink, Stream};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::Resource;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::WebSocketStream;

use sandcove_agent::client::{AgentDialer, AgentIo, DEFAULT_CONNECT_TIMEOUT};
use sandcove_core::{Error, Result};

/// Dials a Pod's agent through the API server's port-forward.
pub(super) struct PortForwardDialer {
    pods: Api<Pod>,
    namespace: String,
    pod: String,
    port: u16,
    connect_timeout: Duration,
}

impl PortForwardDialer {
    /// A dialer of `port` of Pod `pod` in `namespace`.
    pub(super) fn new(pods: Api<Pod>, namespace: String, pod: String, port: u16) -> Self {
        PortForwardDialer {
            pods,
            namespace,
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
        let request = kube::core::Request::new(Pod::url_path(&(), Some(&self.namespace)))
            .portforward(&self.pod, &[self.port])
            .map_err(|e| Error::backend(format!("{what}: {e}")))?;
        let client = self.pods.clone().into_client();
        let connection = tokio::time::timeout(self.connect_timeout, client.connect(request))
            .await
            .map_err(|_| Error::Timeout { what: what.clone() })?
            .map_err(|e| super::map_error(&what, e))?;
        Ok(Box::new(Forwarded {
            ws: connection.into_stream(),
            pending: Vec::new(),
            offset: 0,
            announced: [false; 2],
            eof: false,
        }))
    }
}

/// One forwarded port as a byte stream, over the `v4.channel.k8s.io` framing: every
/// WebSocket message starts with its channel (0: data, 1: errors of the one port), and
/// each channel's first message is the port number.
///
/// Written here rather than with the client library's forwarder because that one drops
/// what the Pod sent last when the Pod closes while we are still writing (an agent refusing
/// an upload over its bound answers, then closes); here the answer stays readable.
struct Forwarded<S> {
    ws: WebSocketStream<S>,
    /// Data received and not read yet (`pending[offset..]`).
    pending: Vec<u8>,
    offset: usize,
    /// Whether each channel's port-number message has come.
    announced: [bool; 2],
    eof: bool,
}

fn io_error(e: WsError) -> std::io::Error {
    match e {
        WsError::Io(e) => e,
        other => std::io::Error::other(other),
    }
}

/// Largest data message sent at once.
const MAX_MESSAGE: usize = 64 * 1024;

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for Forwarded<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        // Writes left unflushed by `poll_write` go out while we wait for the answer.
        let _ = Pin::new(&mut this.ws).poll_flush(cx);
        loop {
            if this.offset < this.pending.len() {
                let n = buf.remaining().min(this.pending.len() - this.offset);
                buf.put_slice(&this.pending[this.offset..this.offset + n]);
                this.offset += n;
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            match ready!(Pin::new(&mut this.ws).poll_next(cx)) {
                None | Some(Ok(Message::Close(_))) => this.eof = true,
                Some(Err(e)) => return Poll::Ready(Err(io_error(e))),
                Some(Ok(Message::Binary(data))) => {
                    let Some((&channel, body)) = data.split_first() else {
                        continue;
                    };
                    let channel = usize::from(channel);
                    if channel > 1 {
                        return Poll::Ready(Err(std::io::Error::other(format!(
                            "port-forward: unexpected channel {channel}"
                        ))));
                    }
                    if !this.announced[channel] {
                        // The port number, nothing to deliver.
                        this.announced[channel] = true;
                        continue;
                    }
                    if channel == 1 {
                        if body.is_empty() {
                            continue;
                        }
                        return Poll::Ready(Err(std::io::Error::other(format!(
                            "port-forward: {}",
                            String::from_utf8_lossy(body)
                        ))));
                    }
                    this.pending.clear();
                    this.pending.extend_from_slice(body);
                    this.offset = 0;
                }
                Some(Ok(_)) => {}
            }
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Forwarded<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let mut ws = Pin::new(&mut this.ws);
        ready!(ws.as_mut().poll_ready(cx)).map_err(io_error)?;
        let n = buf.len().min(MAX_MESSAGE);
        let mut message = Vec::with_capacity(n + 1);
        message.push(0);
        message.extend_from_slice(&buf[..n]);
        ws.as_mut()
            .start_send(Message::binary(message))
            .map_err(io_error)?;
        // Sent now if the socket takes it; else by the next write, flush or read.
        if let Poll::Ready(Err(e)) = ws.poll_flush(cx) {
            return Poll::Ready(Err(io_error(e)));
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().ws)
            .poll_flush(cx)
            .map_err(io_error)
    }

    /// Only flushes: the port-forward protocol has no half-close, so closing our side
    /// would end the connection before the agent's answer. It closes when dropped.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.poll_flush(cx)
    }
}
