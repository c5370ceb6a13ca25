//! HTTP upgrades (WebSockets and other `Connection: upgrade` protocols) on the listeners of
//! [`serve`](super::serve) and [`serve_router`](super::serve_router).
//!
//! Every request those listeners serve carries its connection's [`Connection`] in its
//! extensions. A handler that answers `101 Switching Protocols` calls [`prepare`] on the
//! request, then [`Upgrade::run`] with what to do with the raw connection. The taken-over
//! connection keeps its slot in the listener's connection cap until it ends, and it is
//! closed when the server shuts down: an upgraded connection has no graceful end a server
//! could ask for, and the grace period is for in-flight calls. It is also closed once no byte
//! has moved either way for its idle limit ([`DEFAULT_IDLE_LIMIT`] unless
//! [`Upgrade::idle_limit`] sets another, never above [`MAX_IDLE_LIMIT`]), so a peer that goes
//! silent cannot hold a slot of the cap for ever. A protocol that authenticates after the
//! switch (a key sent in the first message) sets [`Upgrade::pre_auth_deadline`]: unless the
//! task calls [`Upgraded::authenticated`] by then, the connection is closed at that deadline
//! whatever the peer sends or leaves unread, its handshake and its refusal included.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::Request;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::{watch, OwnedSemaphorePermit};
use tokio::time::Instant;

use sandcove_core::Error;

/// How long an upgraded connection may carry no bytes either way before it is closed, unless
/// [`Upgrade::idle_limit`] says otherwise.
pub const DEFAULT_IDLE_LIMIT: Duration = Duration::from_secs(600);
/// The largest idle limit [`Upgrade::idle_limit`] accepts (larger ones are lowered to it).
pub const MAX_IDLE_LIMIT: Duration = Duration::from_secs(3600);

/// A raw connection after an upgrade. Every byte read or written counts as activity for the
/// connection's idle limit.
pub struct Upgraded {
    io: TokioIo<hyper::upgrade::Upgraded>,
    activity: Arc<Activity>,
    authenticated: Arc<AtomicBool>,
}

impl Upgraded {
    /// The peer has authenticated: the [`Upgrade::pre_auth_deadline`] no longer applies.
    pub fn authenticated(&self) {
        self.authenticated.store(true, Ordering::Release);
    }
}

impl std::fmt::Debug for Upgraded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upgraded").finish_non_exhaustive()
    }
}

/// When an upgraded connection last moved a byte, in milliseconds after `base`.
struct Activity {
    base: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Activity {
            base: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }

    fn touch(&self) {
        let ms = self.base.elapsed().as_millis().min(u128::from(u64::MAX)) as u64;
        self.last_ms.fetch_max(ms, Ordering::Relaxed);
    }

    fn last(&self) -> Instant {
        self.base + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }

    /// Resolves once nothing has moved for `idle`.
    async fn idle_for(&self, idle: Duration) {
        loop {
            let deadline = self.last() + idle;
            if Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }
}

impl AsyncRead for Upgraded {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}

impl AsyncWrite for Upgraded {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, data);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// The connection a request arrived on: its slot in the listener's cap and the server's stop
/// signal. Inserted into every request's extensions by the connection loop.
#[derive(Clone)]
pub struct Connection(Arc<Slot>);

struct Slot {
    // Held, never read: the slot in the cap frees once every holder is gone.
    _permit: OwnedSemaphorePermit,
    stop: watch::Receiver<bool>,
    /// Set once the connection is taken over: the connection loop's write-stall bound then
    /// stops applying, the idle limit here replaces it.
    upgraded: Arc<AtomicBool>,
}

impl Connection {
    pub(super) fn new(
        permit: OwnedSemaphorePermit,
        stop: watch::Receiver<bool>,
        upgraded: Arc<AtomicBool>,
    ) -> Self {
        Connection(Arc::new(Slot {
            _permit: permit,
            stop,
            upgraded,
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
    idle: Duration,
    pre_auth: Option<Duration>,
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
pub fn prepare(request: &mut Request) -> sandcove_core::Result<Upgrade> {
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
        idle: DEFAULT_IDLE_LIMIT,
        pre_auth: None,
    })
}

impl Upgrade {
    /// Close the connection once no byte has moved either way for `idle` (at most
    /// [`MAX_IDLE_LIMIT`]; [`DEFAULT_IDLE_LIMIT`] when not set).
    pub fn idle_limit(mut self, idle: Duration) -> Self {
        self.idle = idle.min(MAX_IDLE_LIMIT);
        self
    }

    /// Close the connection `limit` after the switch unless the task has called
    /// [`Upgraded::authenticated`] by then: the hard bound of a protocol whose peer
    /// authenticates after the switch, so an unauthenticated peer holds a slot of the
    /// listener's cap no longer than that, whatever it sends (pings count as activity for the
    /// idle limit) and whether or not it reads what the server writes.
    pub fn pre_auth_deadline(mut self, limit: Duration) -> Self {
        self.pre_auth = Some(limit);
        self
    }

    /// Once the `101` answer has gone out, run `task` on the raw connection, on its own
    /// tokio task. The connection counts toward the listener's cap until `task` ends, and
    /// `task` is dropped (closing the connection) when the server stops, when nothing has
    /// moved on the connection for its idle limit, or at its pre-auth deadline if it set one
    /// and has not authenticated. If the answer is not a `101`, or the client goes away
    /// first, `task` never runs.
    pub fn run<F, Fut>(self, task: F)
    where
        F: FnOnce(Upgraded) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let Upgrade {
            pending,
            connection,
            idle,
            pre_auth,
        } = self;
        tokio::spawn(async move {
            let mut stop = connection.0.stop.clone();
            let activity = Arc::new(Activity::new());
            let watched = activity.clone();
            let upgraded = connection.0.upgraded.clone();
            let authenticated = Arc::new(AtomicBool::new(false));
            let checked = authenticated.clone();
            // The deadline counts from the request, so a peer slow to finish the switch gains
            // nothing.
            let deadline = pre_auth.map(|limit| Instant::now() + limit);
            let work = async move {
                if let Ok(io) = pending.await {
                    upgraded.store(true, Ordering::Relaxed);
                    activity.touch();
                    task(Upgraded {
                        io: TokioIo::new(io),
                        activity,
                        authenticated,
                    })
                    .await;
                }
            };
            let unauthenticated = async move {
                match deadline {
                    Some(at) => {
                        tokio::time::sleep_until(at).await;
                        if checked.load(Ordering::Acquire) {
                            std::future::pending::<()>().await;
                        }
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                () = work => {}
                // A closed channel means the server is gone too.
                _ = stop.wait_for(|stopped| *stopped) => {}
                () = watched.idle_for(idle) => {}
                () = unauthenticated => {}
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
