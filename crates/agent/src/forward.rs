//! Requests forwarded to a port inside a sandbox, and the bounds on the sandbox's answer: the
//! one implementation behind the preview listeners ([`crate::preview`]) and E2B's `get_host`
//! forwarding.
//!
//! The sandbox is the other end, and a port that never reads, never answers or stops halfway
//! would otherwise hold the client's connection (and its slot of a listener's cap) for as
//! long as it likes. [`forward`] sends one request over a fresh connection to the port (hyper's
//! HTTP/1 client) and holds the exchange to the listener's [`UpstreamBounds`]:
//!
//! - the request's body goes to the sandbox as it arrives, and the answer's head must come
//!   within [`UpstreamBounds::answer_timeout`] of the later of the request's end and the last
//!   piece of it the sandbox took (the clock restarts with each piece, so a long upload the
//!   sandbox keeps reading is not cut). The same bound ends a request whose bytes stop moving:
//!   [`Failure::RequestStalled`] when the client sends none (`408`), [`Failure::NotTaken`]
//!   when the sandbox takes none (`504`), [`Failure::NoAnswer`] once it is all sent (`504`).
//!   The connection to the sandbox is dropped then.
//! - the answer's body, an [`AnswerBody`], ends in an error once no byte has come for
//!   [`UpstreamBounds::body_idle`] while it was awaited, which closes the client's connection
//!   (a partial body cannot be completed). It notes in its [`Progress`] when bytes last moved,
//!   so a connection that watches its client too (the preview listener) cuts a client that
//!   stops taking them; a listener of `sandcove serve` has its write-stall bound for that.
//!
//! Why here: the preview proxy lives in this crate, and `sandcove-server` (whose listeners set
//! the bounds E2B's forwarding uses) may not depend on it, nor it on the server. The numbers
//! are [`sandcove_core::listen::UpstreamBounds`], which both see; E2B's forwarding sees both
//! crates through the umbrella and calls [`forward`] with its listener's bounds.

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Request, Response, StatusCode};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::{Instant, Sleep};

pub use sandcove_core::listen::UpstreamBounds;

/// The error type of the bodies here.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Where a forwarded request stands: the sandbox has the last piece, the client owes the next
/// one, or all of it is sent.
const SANDBOX_TAKING: u8 = 0;
const CLIENT_SENDING: u8 = 1;
const SENT: u8 = 2;

/// When bytes of one direction of a forwarded exchange last moved (in milliseconds after
/// `base`), and, for a request, which side it waits on.
#[derive(Debug)]
pub struct Progress {
    base: Instant,
    last_ms: AtomicU64,
    request: AtomicU8,
}

impl Progress {
    fn new(request: u8) -> Self {
        Progress {
            base: Instant::now(),
            last_ms: AtomicU64::new(0),
            request: AtomicU8::new(request),
        }
    }

    /// Bytes moved now.
    fn touch(&self) {
        let ms = u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// When bytes last moved.
    pub fn last(&self) -> Instant {
        self.base + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }

    /// Resolves once nothing has moved for `idle`.
    pub async fn idle_for(&self, idle: Duration) {
        loop {
            let deadline = self.last() + idle;
            if Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }

    /// Why a request whose bytes stopped moving ended.
    fn overdue(&self) -> Failure {
        match self.request.load(Ordering::Relaxed) {
            CLIENT_SENDING => Failure::RequestStalled,
            SENT => Failure::NoAnswer,
            _ => Failure::NotTaken,
        }
    }
}

/// Why a forwarded request got no answer from the sandbox.
#[derive(Debug)]
pub enum Failure {
    /// The client stopped sending the request's body (`408`).
    RequestStalled,
    /// The sandbox stopped taking the request (`504`).
    NotTaken,
    /// The request was sent whole and the sandbox sent no answer's head in time (`504`).
    NoAnswer,
    /// The connection to the port failed, or the sandbox's answer was not HTTP (`502`).
    Broken(hyper::Error),
}

impl Failure {
    /// The status the client gets.
    pub fn status(&self) -> StatusCode {
        match self {
            Failure::RequestStalled => StatusCode::REQUEST_TIMEOUT,
            Failure::NotTaken | Failure::NoAnswer => StatusCode::GATEWAY_TIMEOUT,
            Failure::Broken(_) => StatusCode::BAD_GATEWAY,
        }
    }

    /// What the client is told, `what` naming the port (`port 3000 of sandbox abc`).
    pub fn message(&self, what: &str, bounds: &UpstreamBounds) -> String {
        let ms = bounds.answer_timeout.as_millis();
        match self {
            Failure::RequestStalled => {
                format!("the request body brought no byte for {ms} ms; the request was abandoned")
            }
            Failure::NotTaken => {
                format!("{what} did not take the request within {ms} ms; the request was abandoned")
            }
            Failure::NoAnswer => {
                format!("{what} did not answer within {ms} ms; the request was abandoned")
            }
            Failure::Broken(e) => format!("{what}: {e}"),
        }
    }

    /// The answer the client gets: [`status`](Self::status) with
    /// [`message`](Self::message) as plain text.
    pub fn answer(&self, what: &str, bounds: &UpstreamBounds) -> Response<String> {
        let mut response = Response::new(format!("{}\n", self.message(what, bounds)));
        *response.status_mut() = self.status();
        response.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        response
    }
}

/// Send `request` (its target in origin form, its headers as the sandbox should see them)
/// over `io`, a fresh connection to a port inside the sandbox, and wait for the answer's head
/// within `bounds` (see the module docs). The connection serves this request only; it is
/// dropped with the answer's body, or handed over when the sandbox switches protocols (take it
/// with `hyper::upgrade::on` on the `101` answer).
pub async fn forward<I, B>(
    io: I,
    request: Request<B>,
    bounds: UpstreamBounds,
) -> Result<Response<AnswerBody>, Failure>
where
    I: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    let mut client = hyper::client::conn::http1::Builder::new();
    // Header names reach the sandbox spelled as the client spelled them.
    client.preserve_header_case(true);
    let (mut sender, connection) = client
        .handshake(hyper_util::rt::TokioIo::new(io))
        .await
        .map_err(Failure::Broken)?;
    let mut connection = Connection(Some(tokio::spawn(connection.with_upgrades())));
    let start = if request.body().is_end_stream() {
        SENT
    } else {
        SANDBOX_TAKING
    };
    let progress = Arc::new(Progress::new(start));
    let request = request.map(|body| Watched {
        body,
        progress: progress.clone(),
    });
    let answer = tokio::select! {
        answer = sender.send_request(request) => answer.map_err(Failure::Broken)?,
        // Dropping `connection` closes the sandbox's side: nothing more goes to it.
        () = progress.idle_for(bounds.answer_timeout) => return Err(progress.overdue()),
    };
    if answer.status() == StatusCode::SWITCHING_PROTOCOLS {
        // The connection's task hands the connection to whoever takes the upgrade.
        connection.detach();
    }
    Ok(answer.map(|body| AnswerBody::new(body, bounds.body_idle, connection)))
}

/// The task serving the connection to the sandbox, aborted when dropped.
#[derive(Debug)]
struct Connection(Option<tokio::task::JoinHandle<Result<(), hyper::Error>>>);

impl Connection {
    fn detach(&mut self) {
        self.0 = None;
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
        }
    }
}

/// A request body that notes each piece the sandbox takes, and whether it waits on the client.
struct Watched<B> {
    body: B,
    progress: Arc<Progress>,
}

impl<B> Body for Watched<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        let now = match &polled {
            Poll::Pending => CLIENT_SENDING,
            Poll::Ready(Some(Ok(_))) => SANDBOX_TAKING,
            Poll::Ready(None) => SENT,
            Poll::Ready(Some(Err(_))) => return polled.map(|f| f.map(|f| f.map_err(Into::into))),
        };
        this.progress.request.store(now, Ordering::Relaxed);
        if now != CLIENT_SENDING {
            this.progress.touch();
        }
        polled.map(|f| f.map(|f| f.map_err(Into::into)))
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The body of a sandbox's answer: fails once no byte has come for its idle bound while it was
/// awaited, notes its [`Progress`], and holds the connection to the sandbox (and whatever
/// [`holding`](Self::holding) adds) until dropped.
pub struct AnswerBody<B = Incoming> {
    /// `None` once the body timed out: the sandbox's side is let go.
    inner: Option<B>,
    idle: Duration,
    /// Made at the first wait.
    timer: Option<Pin<Box<Sleep>>>,
    /// Whether `timer` is running (the body waits for the sandbox).
    waiting: bool,
    progress: Arc<Progress>,
    _connection: Connection,
    _held: Option<Box<dyn Any + Send>>,
}

impl<B> std::fmt::Debug for AnswerBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnswerBody").finish_non_exhaustive()
    }
}

impl<B> AnswerBody<B> {
    fn new(inner: B, idle: Duration, connection: Connection) -> Self {
        let progress = Arc::new(Progress::new(SENT));
        progress.touch();
        AnswerBody {
            inner: Some(inner),
            idle,
            timer: None,
            waiting: false,
            progress,
            _connection: connection,
            _held: None,
        }
    }

    /// This body, keeping `held` until it is dropped: whatever the forwarded exchange holds
    /// for its whole length (a slot of a per-sandbox cap).
    pub fn holding(mut self, held: impl Send + 'static) -> Self {
        self._held = Some(Box::new(held));
        self
    }

    /// When bytes of this body last moved on.
    pub fn progress(&self) -> Arc<Progress> {
        self.progress.clone()
    }
}

impl<B> Body for AnswerBody<B>
where
    B: Body<Data = Bytes> + Unpin,
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
            if matches!(next, Some(Ok(_))) {
                this.progress.touch();
            }
            return Poll::Ready(next.map(|frame| frame.map_err(Into::into)));
        }
        if !this.waiting {
            let deadline = Instant::now() + this.idle;
            match this.timer.as_mut() {
                Some(timer) => timer.as_mut().reset(deadline),
                None => this.timer = Some(Box::pin(tokio::time::sleep_until(deadline))),
            }
            this.waiting = true;
        }
        let Some(timer) = this.timer.as_mut() else {
            return Poll::Pending;
        };
        match timer.as_mut().poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(()) => {
                this.inner = None;
                Poll::Ready(Some(Err(Box::new(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "no byte of the answer came for {} ms",
                        this.idle.as_millis()
                    ),
                )))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map(Body::size_hint)
            .unwrap_or_else(|| SizeHint::with_exact(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use http_body_util::{BodyExt, StreamBody};
    use std::sync::atomic::AtomicBool;

    type Fed = StreamBody<
        futures::stream::Map<
            futures::channel::mpsc::Receiver<Bytes>,
            fn(Bytes) -> Result<Frame<Bytes>, std::io::Error>,
        >,
    >;

    /// A body fed by the returned sender.
    fn fed(room: usize) -> (futures::channel::mpsc::Sender<Bytes>, Fed) {
        let (tx, rx) = futures::channel::mpsc::channel(room);
        let frames: fn(Bytes) -> Result<Frame<Bytes>, std::io::Error> = |b| Ok(Frame::data(b));
        (tx, StreamBody::new(rx.map(frames)))
    }

    struct Flag(Arc<AtomicBool>);
    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_answer_body_fails_and_releases_what_it_held() {
        let (mut tx, body) = fed(4);
        let released = Arc::new(AtomicBool::new(false));
        let body = AnswerBody::new(body, Duration::from_secs(5), Connection(None))
            .holding(Flag(released.clone()));
        let progress = body.progress();
        tx.try_send(Bytes::from_static(b"part")).unwrap();
        let mut body = body;
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "part");
        let started = Instant::now();
        assert!(progress.last() >= started, "the piece was noted");
        let err = body.frame().await.unwrap().unwrap_err();
        assert!(err.to_string().contains("no byte"), "{err}");
        assert!(started.elapsed() >= Duration::from_secs(5));
        assert!(tx.is_closed(), "the sandbox's body was let go");
        assert!(
            !released.load(Ordering::SeqCst),
            "held while the body lives"
        );
        drop(body);
        assert!(released.load(Ordering::SeqCst));
    }

    #[tokio::test(start_paused = true)]
    async fn the_head_deadline_restarts_with_each_piece_of_the_request_the_sandbox_takes() {
        let (mut tx, body) = fed(1);
        let progress = Arc::new(Progress::new(SANDBOX_TAKING));
        let mut body = Watched {
            body,
            progress: progress.clone(),
        };
        let overdue = progress.idle_for(Duration::from_secs(10));
        let mut overdue = Box::pin(overdue);
        let started = Instant::now();
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_secs(8)).await;
            tx.try_send(Bytes::from_static(b"piece")).unwrap();
            let frame = body.frame().await.unwrap().unwrap();
            assert_eq!(frame.into_data().unwrap(), "piece");
        }
        assert!(
            futures::poll!(overdue.as_mut()).is_pending(),
            "40 s of upload the sandbox kept taking is not overdue"
        );
        overdue.await;
        assert_eq!(started.elapsed(), Duration::from_secs(50));
    }

    /// The sandbox's end of a connection: reads what comes (up to its buffer), never answers.
    fn silent_sandbox(buffer: usize) -> (tokio::io::DuplexStream, tokio::io::DuplexStream) {
        tokio::io::duplex(buffer)
    }

    fn request(body: Fed) -> Request<Fed> {
        Request::post("/upload").body(body).unwrap()
    }

    fn bounds() -> UpstreamBounds {
        UpstreamBounds::new(Duration::from_secs(10), Duration::from_secs(10))
    }

    /// Each way a request can stop moving gets its own answer once the bound has passed.
    #[tokio::test(start_paused = true)]
    async fn a_request_that_stops_moving_says_which_side_stopped() {
        // Sent whole (no body), never answered.
        let (ours, _theirs) = silent_sandbox(64 * 1024);
        let get = Request::get("/silent")
            .body(http_body_util::Empty::<Bytes>::new())
            .unwrap();
        let started = Instant::now();
        let failure = forward(ours, get, bounds()).await.unwrap_err();
        assert!(matches!(failure, Failure::NoAnswer), "{failure:?}");
        assert_eq!(started.elapsed(), Duration::from_secs(10));
        let text = failure.message("port 3000 of sandbox abc", &bounds());
        assert!(
            text.contains("port 3000 of sandbox abc did not answer within 10000 ms"),
            "{text}"
        );
        assert_eq!(failure.answer("x", &bounds()).status(), 504);

        // The client announces a body and sends none of it.
        let (ours, _theirs) = silent_sandbox(64 * 1024);
        let (_tx, body) = fed(1);
        let failure = forward(ours, request(body), bounds()).await.unwrap_err();
        assert!(matches!(failure, Failure::RequestStalled), "{failure:?}");
        assert_eq!(failure.status(), 408);

        // The sandbox never reads the body the client keeps ready.
        let (ours, _theirs) = silent_sandbox(1024);
        let (mut tx, body) = fed(64);
        for _ in 0..64 {
            tx.try_send(Bytes::from(vec![b'x'; 4096])).unwrap();
        }
        let failure = forward(ours, request(body), bounds()).await.unwrap_err();
        assert!(matches!(failure, Failure::NotTaken), "{failure:?}");
        assert!(failure
            .message("port 1", &bounds())
            .contains("did not take the request"));
    }

    /// A sandbox that answers gets its answer through, and the connection to it ends with the
    /// answer's body.
    #[tokio::test]
    async fn an_answer_comes_through_and_its_connection_ends_with_it() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (ours, mut theirs) = tokio::io::duplex(64 * 1024);
        let sandbox = tokio::spawn(async move {
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = theirs.read(&mut buf).await.unwrap();
                head.extend_from_slice(&buf[..n]);
            }
            theirs
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
                .await
                .unwrap();
            // Ends once the proxy drops its side.
            while theirs.read(&mut buf).await.unwrap_or(0) > 0 {}
            String::from_utf8_lossy(&head).into_owned()
        });
        let get = Request::get("/a?b=1")
            .header("X-Kept", "yes")
            .body(http_body_util::Empty::<Bytes>::new())
            .unwrap();
        let answer = forward(ours, get, bounds()).await.expect("an answer");
        assert_eq!(answer.status(), 200);
        let body = answer.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "hello");
        let head = sandbox.await.unwrap();
        assert!(head.starts_with("GET /a?b=1 HTTP/1.1\r\n"), "{head}");
        assert!(head.to_ascii_lowercase().contains("x-kept: yes"), "{head}");
    }
}
