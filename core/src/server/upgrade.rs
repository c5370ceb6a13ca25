//! HTTP upgrades (WebSockets and other `Connection: upgrade` protocols) on the listeners of
//! [`serve`](super::serve) and [`serve_router`](super::serve_router).
//!
//! Every request those listeners serve carries its connection's [`Connection`] in its
//! extensions. A handler that answers `101 Switching Protocols` calls [`prepare`] on the
//! request, then [`Upgrade::run`] with what to do with the raw connection. The taken-over
//! connection keeps its slot in the listener's connection cap until it ends, and it is
//! closed when the server shuts down: an upgraded connection has no graceful end a server
//! could ask for, and the grace period is for in-flight calls.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{watch, OwnedSemaphorePermit};

use crate::Error;

/// A raw connection after an upgrade.
pub type Upgraded = TokioIo<hyper::upgrade::Upgraded>;

/// The connection a request arrived on: its slot in the listener's cap and the server's stop
/// signal. Inserted into every request's extensions by the connection loop.
#[derive(Clone)]
pub struct Connection(Arc<Slot>);

struct Slot {
    // Held, never read: the slot in the cap frees once every holder is gone.
    _permit: OwnedSemaphorePermit,
    stop: watch::Receiver<bool>,
}

impl Connection {
    pub(super) fn new(permit: OwnedSemaphorePermit, stop: watch::Receiver<bool>) -> Self {
        Connection(Arc::new(Slot {
            _permit: permit,
            stop,
        }))
    }
}

impl Connection {
    /// The server's stop signal, for a task serving this connection itself.
    pub(super) fn stop_signal(&self) -> watch::Receiver<bool> {
        self.0.stop.clone()
    }
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection").finish_non_exhaustive()
    }
}

/// A request's pending upgrade, from [`prepare`].
#[must_use = "an upgrade does nothing until `run`"]
pub struct Upgrade {
    pending: hyper::upgrade::OnUpgrade,
    connection: Connection,
}

impl std::fmt::Debug for Upgrade {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upgrade").finish_non_exhaustive()
    }
}

/// Whether `request` asks to switch protocols (`Connection: upgrade` plus an `Upgrade`
/// header).
pub fn is_upgrade(request: &Request) -> bool {
    let headers = request.headers();
    headers.contains_key(axum::http::header::UPGRADE)
        && headers
            .get_all(axum::http::header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

/// Take `request`'s upgrade out of it, before answering. Fails when the request does not ask
/// for one, or when it did not come through [`serve`](super::serve) or
/// [`serve_router`](super::serve_router) (whose connection loop bounds upgraded connections;
/// no other path may take one over).
pub fn prepare(request: &mut Request) -> crate::Result<Upgrade> {
    if !is_upgrade(request) {
        return Err(Error::invalid(
            "the request does not ask for a protocol upgrade",
        ));
    }
    let connection = request
        .extensions()
        .get::<Connection>()
        .cloned()
        .ok_or_else(|| {
            Error::not_supported(
                "protocol upgrades outside sandcove::server::serve_router",
                "serve the router with sandcove::server::serve_router",
            )
        })?;
    let pending = request
        .extensions_mut()
        .remove::<hyper::upgrade::OnUpgrade>()
        .ok_or_else(|| Error::invalid("this connection cannot switch protocols"))?;
    Ok(Upgrade {
        pending,
        connection,
    })
}

impl Upgrade {
    /// Once the `101` answer has gone out, run `task` on the raw connection, on its own
    /// tokio task. The connection counts toward the listener's cap until `task` ends, and
    /// `task` is dropped (closing the connection) when the server stops. If the answer is
    /// not a `101`, or the client goes away first, `task` never runs.
    pub fn run<F, Fut>(self, task: F)
    where
        F: FnOnce(Upgraded) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let Upgrade {
            pending,
            connection,
        } = self;
        tokio::spawn(async move {
            let mut stop = connection.0.stop.clone();
            let work = async move {
                if let Ok(io) = pending.await {
                    task(TokioIo::new(io)).await;
                }
            };
            tokio::select! {
                () = work => {}
                // A closed channel means the server is gone too.
                _ = stop.wait_for(|stopped| *stopped) => {}
            }
            drop(connection);
        });
    }
}

/// Size of each direction's copy buffer in [`splice`].
const SPLICE_BUFFER: usize = 16 * 1024;

/// Copy bytes both ways between `a` and `b` until both have ended their sending side, an
/// error occurs, or nothing moves for `idle` (a `TimedOut` error). A direction that ends
/// shuts down the other side's writing half.
pub async fn splice<A, B>(a: &mut A, b: &mut B, idle: Duration) -> io::Result<()>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    enum Step {
        FromA(io::Result<usize>),
        FromB(io::Result<usize>),
    }
    let mut from_a = vec![0u8; SPLICE_BUFFER];
    let mut from_b = vec![0u8; SPLICE_BUFFER];
    let (mut a_open, mut b_open) = (true, true);
    while a_open || b_open {
        // The read and the write it leads to share one deadline, so a peer that stops
        // reading stalls the splice no longer than one that stops sending.
        let step = async {
            let step = tokio::select! {
                n = a.read(&mut from_a), if a_open => Step::FromA(n),
                n = b.read(&mut from_b), if b_open => Step::FromB(n),
            };
            match step {
                Step::FromA(n) => match n? {
                    0 => {
                        a_open = false;
                        b.shutdown().await
                    }
                    n => b.write_all(&from_a[..n]).await,
                },
                Step::FromB(n) => match n? {
                    0 => {
                        b_open = false;
                        a.shutdown().await
                    }
                    n => a.write_all(&from_b[..n]).await,
                },
            }
        };
        match tokio::time::timeout(idle, step).await {
            Ok(result) => result?,
            Err(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no traffic for {idle:?}"),
                ))
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn splice_copies_both_ways_and_ends_with_both_sides() {
        let (mut a, mut a_peer) = tokio::io::duplex(64);
        let (mut b, mut b_peer) = tokio::io::duplex(64);
        let spliced =
            tokio::spawn(async move { splice(&mut a, &mut b, Duration::from_secs(30)).await });
        a_peer.write_all(b"ping").await.unwrap();
        let mut got = [0u8; 4];
        b_peer.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"ping");
        b_peer.write_all(b"pong").await.unwrap();
        a_peer.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"pong");
        a_peer.shutdown().await.unwrap();
        b_peer.shutdown().await.unwrap();
        spliced.await.unwrap().unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn splice_ends_an_idle_connection() {
        let (mut a, _a_peer) = tokio::io::duplex(64);
        let (mut b, _b_peer) = tokio::io::duplex(64);
        let err = splice(&mut a, &mut b, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    }
}
