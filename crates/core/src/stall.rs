//! Stalled peers lose their connection: every connection served by the server's connection
//! loop (the native API, the vendor listeners and what comes through a `CONNECT` tunnel) and
//! by the embedded engine's file-URL listener is held to two no-progress bounds, so an authenticated client cannot keep a slot of the
//! connection cap, and whatever a handler holds for it (an upload's temporary file, a
//! backend call), for ever.
//!
//! - [`IdleBody`]: a request body that brings no byte for its idle bound while the handler
//!   waits for one ends in an error item. The handler fails as it would on a broken-off
//!   body (an upload discards what it received), and the body is let go, which makes the
//!   connection close once the answer is out.
//! - [`StallIo`]: a write to the client that makes no progress for its bound fails, which
//!   ends the connection. Only a pending write counts: a connection with nothing to send (a
//!   silent command, an idle followed log) is never cut by it.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;

use crate::file_url::BoxError;
use http_body::{Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// A request body that fails once no byte has arrived for `idle` while it was awaited.
///
/// The clock runs only while the reader waits: a handler that does not read for a while
/// (its backend is slow to take the bytes) does not count against the client.
pub struct IdleBody<B> {
    /// `None` once the body timed out: the client's body is let go.
    inner: Option<B>,
    idle: Duration,
    /// Made at the first wait (most bodies never wait: none, or all in the first read).
    timer: Option<Pin<Box<Sleep>>>,
    /// Whether `timer` is running (the reader is waiting for the client).
    waiting: bool,
}

impl<B> IdleBody<B> {
    /// `inner`, failing once a wait for its next frame has lasted `idle`.
    pub fn new(inner: B, idle: Duration) -> Self {
        IdleBody {
            inner: Some(inner),
            idle,
            timer: None,
            waiting: false,
        }
    }
}

impl<B> http_body::Body for IdleBody<B>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        if let Poll::Ready(next) = Pin::new(inner).poll_frame(cx) {
            this.waiting = false;
            return Poll::Ready(next.map(|frame| frame.map_err(Into::into)));
        }
        let timer = started(&mut this.timer, &mut this.waiting, this.idle);
        match timer.as_mut().poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(()) => {
                // Dropping the body tells the connection nobody reads the rest: it closes
                // once the answer is written instead of waiting for the next request.
                this.inner = None;
                Poll::Ready(Some(Err(Box::new(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "no byte of the body arrived for {} ms",
                        this.idle.as_millis()
                    ),
                )))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner
            .as_ref()
            .is_none_or(http_body::Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map(http_body::Body::size_hint)
            .unwrap_or_else(|| SizeHint::with_exact(0))
    }
}

/// A client connection whose writes fail once one has made no progress for `limit`.
///
/// The clock starts when a write (or flush) finds the client's side full and stops at the
/// next write that moves a byte. Once `exempt` is set (the connection was taken over by an
/// upgrade, which has its own idle limit) the bound no longer applies.
pub struct StallIo<T> {
    io: T,
    limit: Duration,
    /// Made at the first write that waits.
    timer: Option<Pin<Box<Sleep>>>,
    /// Whether `timer` is running (a write is pending).
    waiting: bool,
    exempt: Arc<AtomicBool>,
}

impl<T> StallIo<T> {
    /// `io`, whose writes fail once one has waited `limit` for the peer, until `exempt` is
    /// set.
    pub fn new(io: T, limit: Duration, exempt: Arc<AtomicBool>) -> Self {
        StallIo {
            io,
            limit,
            timer: None,
            waiting: false,
            exempt,
        }
    }

    /// `polled` as the caller sees it: progress stops the clock, a pending write starts it
    /// (or fails once it has run out).
    fn watch<R>(&mut self, cx: &mut Context<'_>, polled: Poll<io::Result<R>>) -> Poll<io::Result<R>>
    where
        R: Progress,
    {
        match polled {
            Poll::Ready(Ok(r)) => {
                if r.moved() {
                    self.waiting = false;
                }
                Poll::Ready(Ok(r))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending if self.exempt.load(Ordering::Relaxed) => Poll::Pending,
            Poll::Pending => {
                let timer = started(&mut self.timer, &mut self.waiting, self.limit);
                match timer.as_mut().poll(cx) {
                    Poll::Pending => Poll::Pending,
                    Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "the client took no byte of the answer for {} ms",
                            self.limit.as_millis()
                        ),
                    ))),
                }
            }
        }
    }
}

/// `timer`, set to end `limit` from now unless it is already running (`waiting`).
fn started<'a>(
    timer: &'a mut Option<Pin<Box<Sleep>>>,
    waiting: &mut bool,
    limit: Duration,
) -> &'a mut Pin<Box<Sleep>> {
    if !*waiting {
        let deadline = Instant::now() + limit;
        match timer.as_mut() {
            Some(running) => running.as_mut().reset(deadline),
            None => *timer = Some(Box::pin(tokio::time::sleep_until(deadline))),
        }
        *waiting = true;
    }
    // Always set by now; the fallback only keeps this total.
    timer.get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)))
}

/// Whether a completed write call moved bytes.
trait Progress {
    fn moved(&self) -> bool;
}

impl Progress for usize {
    fn moved(&self) -> bool {
        *self > 0
    }
}

impl Progress for () {
    /// A completed flush or shutdown: no bytes of its own (a write under it counts).
    fn moved(&self) -> bool {
        false
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for StallIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for StallIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_write(cx, buf);
        this.watch(cx, polled)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.watch(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_flush(cx);
        this.watch(cx, polled)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_shutdown(cx);
        this.watch(cx, polled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const LIMIT: Duration = Duration::from_secs(60);

    #[tokio::test(start_paused = true)]
    async fn a_write_the_client_never_takes_fails_after_the_limit() {
        let (ours, _client) = tokio::io::duplex(1024);
        let mut io = StallIo::new(ours, LIMIT, Arc::default());
        let started = Instant::now();
        let err = io.write_all(&[0u8; 4096]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
        assert!(started.elapsed() >= LIMIT, "{:?}", started.elapsed());
        // A client that reads slowly, but reads, is never cut.
        let (ours, mut client2) = tokio::io::duplex(1024);
        let mut io = StallIo::new(ours, LIMIT, Arc::default());
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 512];
            let mut total = 0;
            while total < 64 * 1024 {
                tokio::time::sleep(LIMIT / 2).await;
                total += client2.read(&mut buf).await.unwrap();
            }
        });
        io.write_all(&vec![1u8; 64 * 1024]).await.expect("progress");
        reader.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_with_nothing_to_send_is_never_cut_nor_an_upgraded_one() {
        let (ours, mut client) = tokio::io::duplex(1024);
        let mut io = StallIo::new(ours, LIMIT, Arc::default());
        io.write_all(b"first").await.unwrap();
        tokio::time::sleep(LIMIT * 10).await;
        io.write_all(b"later")
            .await
            .expect("silence is not a stall");
        let mut buf = [0u8; 10];
        client.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"firstlater");
        let exempt = Arc::new(AtomicBool::new(true));
        let (ours, _client) = tokio::io::duplex(16);
        let mut io = StallIo::new(ours, LIMIT, exempt);
        let write = io.write_all(&[0u8; 64]);
        assert!(
            tokio::time::timeout(LIMIT * 10, write).await.is_err(),
            "an exempt connection's write still waits"
        );
    }

    type Sender = futures::channel::mpsc::Sender<Result<Bytes, io::Error>>;

    /// A request body fed by the returned sender, under an idle bound of [`LIMIT`].
    fn fed_body() -> (Sender, IdleBody<Fed>) {
        use futures::StreamExt;
        let (tx, rx) = futures::channel::mpsc::channel(4);
        let body = http_body_util::StreamBody::new(
            rx.map(|r: Result<Bytes, io::Error>| r.map(Frame::data)),
        );
        (tx, IdleBody::new(Fed::new(body), LIMIT))
    }

    type Fed = http_body_util::combinators::UnsyncBoxBody<Bytes, io::Error>;

    async fn next(body: &mut IdleBody<Fed>) -> Option<Result<Bytes, String>> {
        let frame =
            std::future::poll_fn(|cx| http_body::Body::poll_frame(Pin::new(&mut *body), cx))
                .await?;
        Some(
            frame
                .map(|f| f.into_data().unwrap_or_default())
                .map_err(|e| e.to_string()),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_stops_coming_fails_and_lets_the_client_go() {
        let (mut tx, mut body) = fed_body();
        tx.try_send(Ok(Bytes::from_static(b"ten bytes."))).unwrap();
        assert_eq!(next(&mut body).await, Some(Ok(Bytes::from("ten bytes."))));
        let started = Instant::now();
        let err = next(&mut body).await.unwrap().unwrap_err();
        assert!(err.contains("no byte"), "{err}");
        assert!(started.elapsed() >= LIMIT);
        assert!(tx.is_closed(), "the client's body was let go");
        assert!(http_body::Body::is_end_stream(&body));
        assert_eq!(next(&mut body).await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_reader_slow_to_ask_is_not_counted_against_the_client() {
        let (mut tx, mut body) = fed_body();
        tx.try_send(Ok(Bytes::from_static(b"a"))).unwrap();
        assert_eq!(next(&mut body).await, Some(Ok(Bytes::from("a"))));
        tokio::time::sleep(LIMIT * 2).await;
        tx.try_send(Ok(Bytes::from_static(b"b"))).unwrap();
        drop(tx);
        assert_eq!(next(&mut body).await, Some(Ok(Bytes::from("b"))));
        assert_eq!(next(&mut body).await, None);
    }
}
