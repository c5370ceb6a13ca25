//! Accept loops that survive floods: a connection cap per listener and a pause on
//! descriptor exhaustion, shared by the preview listeners and `sandcove serve`; and the
//! bounds those listeners hold a sandbox's answer to ([`UpstreamBounds`]).
//!
//! A permit is taken *before* `accept`, so connections beyond the cap wait in the kernel's
//! backlog instead of costing a descriptor and a task each. When `accept` fails for lack of
//! descriptors or memory (`EMFILE`, `ENFILE`, `ENOBUFS`, `ENOMEM`) the pending connection
//! stays queued and the listener stays readable, so retrying at once would spin at 100 % CPU
//! and starve everything else on the event loop: the loop sleeps instead, doubling the pause
//! up to [`MAX_PAUSE`] while the errors last.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// First pause after a resource error.
pub const MIN_PAUSE: Duration = Duration::from_millis(10);
/// Longest pause after repeated resource errors.
pub const MAX_PAUSE: Duration = Duration::from_secs(1);

/// Whether an accept error concerns only the one connection being accepted (the peer gave
/// up, a protocol error): the next accept can follow at once.
pub fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::ECONNABORTED
                | libc::ECONNRESET
                | libc::ECONNREFUSED
                | libc::EPROTO
                | libc::EPERM
                | libc::EINTR
                | libc::EAGAIN
        )
    )
}

/// Accepts under a connection cap, pausing on resource errors.
pub struct Acceptor {
    permits: Arc<Semaphore>,
    pause: Duration,
}

impl Acceptor {
    /// At most `max_connections` accepted connections alive at once (at least one).
    pub fn new(max_connections: usize) -> Self {
        Acceptor {
            permits: Arc::new(Semaphore::new(max_connections.max(1))),
            pause: MIN_PAUSE,
        }
    }

    /// The next connection from `accept`, with the permit that must live as long as it.
    /// Never returns an error: per-connection errors are skipped, resource errors wait.
    pub async fn next<T, F, Fut>(&mut self, mut accept: F) -> (T, OwnedSemaphorePermit)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = io::Result<T>>,
    {
        let permit = match self.permits.clone().acquire_owned().await {
            Ok(p) => p,
            // The semaphore is never closed; wait forever rather than accept uncapped.
            Err(_) => std::future::pending().await,
        };
        loop {
            match accept().await {
                Ok(conn) => {
                    self.pause = MIN_PAUSE;
                    return (conn, permit);
                }
                Err(e) if is_connection_error(&e) => tokio::task::yield_now().await,
                Err(_) => {
                    tokio::time::sleep(self.pause).await;
                    self.pause = (self.pause * 2).min(MAX_PAUSE);
                }
            }
        }
    }
}

/// How long a sandbox may take for the head of its answer to a forwarded request, unless the
/// listener sets another.
pub const DEFAULT_ANSWER_TIMEOUT: Duration = Duration::from_secs(60);

/// The bounds on a sandbox's answer to a request forwarded to one of its ports: the numbers a
/// listener sets (a preview listener from its `PreviewLimits`, `sandcove serve`'s listeners
/// from their connection limits). The forwarding that applies them is
/// `sandcove_agent::forward`; this plain value lives here because the server and the agent
/// crate both name it and neither may depend on the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct UpstreamBounds {
    /// Longest wait for the answer's head after the last byte of the request the sandbox
    /// took; also how long the request's own bytes may stop moving.
    pub answer_timeout: Duration,
    /// Longest wait for the next byte of the answer's body.
    pub body_idle: Duration,
}

impl Default for UpstreamBounds {
    /// 60 s for the head, 60 s without a byte of the body.
    fn default() -> Self {
        UpstreamBounds {
            answer_timeout: DEFAULT_ANSWER_TIMEOUT,
            body_idle: Duration::from_secs(60),
        }
    }
}

impl UpstreamBounds {
    /// Bounds of `answer_timeout` for the head and `body_idle` between body bytes.
    pub fn new(answer_timeout: Duration, body_idle: Duration) -> Self {
        UpstreamBounds {
            answer_timeout,
            body_idle,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test(start_paused = true)]
    async fn descriptor_exhaustion_pauses_instead_of_spinning() {
        let calls = Arc::new(AtomicUsize::new(0));
        let mut acceptor = Acceptor::new(4);
        let counted = calls.clone();
        let started = tokio::time::Instant::now();
        let accepting = acceptor.next(move || {
            let n = counted.fetch_add(1, Ordering::SeqCst);
            async move {
                if n < 20 {
                    Err(io::Error::from_raw_os_error(libc::EMFILE))
                } else {
                    Ok(n)
                }
            }
        });
        let (n, _permit) = accepting.await;
        assert_eq!(n, 20);
        // 10+20+40+…+1000 ms, then 1 s per error: far from a busy loop.
        assert!(
            started.elapsed() >= Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(calls.load(Ordering::SeqCst), 21);
    }

    #[tokio::test(start_paused = true)]
    async fn the_cap_holds_connections_back_until_a_permit_frees() {
        let mut acceptor = Acceptor::new(2);
        let (_, a) = acceptor.next(|| async { Ok(()) }).await;
        let (_, _b) = acceptor.next(|| async { Ok(()) }).await;
        let third =
            tokio::time::timeout(Duration::from_secs(60), acceptor.next(|| async { Ok(()) })).await;
        assert!(
            third.is_err(),
            "a third connection is not accepted while two are alive"
        );
        drop(a);
        let third =
            tokio::time::timeout(Duration::from_secs(1), acceptor.next(|| async { Ok(()) })).await;
        assert!(third.is_ok(), "a freed permit lets the next one in");
    }

    #[test]
    fn errors_are_classified() {
        for e in [libc::ECONNABORTED, libc::EPROTO, libc::EINTR] {
            assert!(is_connection_error(&io::Error::from_raw_os_error(e)));
        }
        for e in [libc::EMFILE, libc::ENFILE, libc::ENOBUFS, libc::ENOMEM] {
            assert!(!is_connection_error(&io::Error::from_raw_os_error(e)));
        }
    }
}
