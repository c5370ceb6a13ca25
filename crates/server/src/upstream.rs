//! Requests a listener forwards to a port inside a sandbox (E2B's `get_host`): bounds on the
//! sandbox's answer.
//!
//! The sandbox is the other end here, and a port that never answers, or stops halfway, would
//! otherwise hold the client's connection, and its slot of the listener's cap, for as long as
//! it likes. The connection loop of [`serve_router`](super::serve_router) puts the listener's
//! [`UpstreamBounds`] in every request's extensions; a handler that forwards reads them with
//! [`UpstreamBounds::of`] and:
//!
//! - sends the request's body through [`UpstreamBounds::watch_request`] and waits for the
//!   answer's head until the sandbox has gone [`UpstreamBounds::answer_timeout`] without
//!   taking a byte of the request or answering (the clock restarts with each piece of the
//!   request body the sandbox takes, so a long upload the sandbox keeps reading is not cut),
//!   then answers [`gateway_timeout`] and drops its connection to the sandbox;
//! - sends the answer's body through [`UpstreamBounds::answer_body`]: a body that brings no
//!   byte for [`UpstreamBounds::body_idle`] while the client's connection waits for one ends
//!   in an error, which closes the client's connection (a partial body cannot be completed)
//!   and lets the sandbox's connection go. The clock runs only while the client's side waits
//!   for the sandbox: a client slow to read is the write-stall bound's business.
//!
//! Upgraded connections (WebSockets) are not answers: they keep [`upgrade`](super::upgrade)'s
//! idle limit.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use hyper::body::{Frame, SizeHint};

use super::stall::IdleBody;
use super::upgrade::Activity;

/// How long a sandbox may take for the head of its answer to a forwarded request, unless the
/// listener sets another.
pub const DEFAULT_ANSWER_TIMEOUT: Duration = Duration::from_secs(60);

/// The bounds on a sandbox's answer to a request forwarded to one of its ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct UpstreamBounds {
    /// Longest wait for the answer's head.
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

    /// The bounds of the listener `request` came through; the defaults for a request that
    /// did not come through [`serve_router`](super::serve_router) or [`serve`](super::serve).
    pub fn of<B>(request: &axum::http::Request<B>) -> Self {
        request
            .extensions()
            .get::<UpstreamBounds>()
            .copied()
            .unwrap_or_default()
    }

    /// `body` (the request's, on its way to the sandbox) as the body to send, and a future
    /// that resolves once [`answer_timeout`](Self::answer_timeout) has passed since the
    /// later of now and the last piece of that body the sandbox took: race it against the
    /// answer's head.
    pub fn watch_request<B>(&self, body: B) -> (Body, impl Future<Output = ()> + Send + 'static)
    where
        B: hyper::body::Body<Data = Bytes> + Send + Unpin + 'static,
        B::Error: Into<axum::BoxError>,
    {
        let moved = Arc::new(Activity::new());
        let timeout = self.answer_timeout;
        let watched = moved.clone();
        let overdue = async move { watched.idle_for(timeout).await };
        (Body::new(Watched { body, moved }), overdue)
    }

    /// `body` (a forwarded answer's) as an answer body that ends in an error once no byte has
    /// come for [`body_idle`](Self::body_idle) while it was awaited. `held` is dropped with
    /// the body: whatever the forwarded exchange keeps for its whole length (a slot of a
    /// per-sandbox cap).
    pub fn answer_body<B, H>(&self, body: B, held: H) -> Body
    where
        B: hyper::body::Body<Data = Bytes> + Send + Unpin + 'static,
        B::Error: Into<axum::BoxError>,
        H: Send + Unpin + 'static,
    {
        Body::new(Held {
            body: IdleBody::new(body, self.body_idle),
            _held: held,
        })
    }
}

/// The `504` answered when the sandbox's port did not send its answer's head within `waited`.
pub fn gateway_timeout(what: &str, waited: Duration) -> Response {
    let mut response = (
        StatusCode::GATEWAY_TIMEOUT,
        format!(
            "{what} did not answer within {} ms; the request was abandoned\n",
            waited.as_millis()
        ),
    )
        .into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// A request body that notes each piece it hands on.
struct Watched<B> {
    body: B,
    moved: Arc<Activity>,
}

impl<B> hyper::body::Body for Watched<B>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: Into<axum::BoxError>,
{
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::BoxError>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        if let Poll::Ready(Some(Ok(_))) = &polled {
            this.moved.touch();
        }
        polled.map(|frame| frame.map(|f| f.map_err(Into::into)))
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A body and what stays held until it is dropped.
struct Held<B, H> {
    body: B,
    _held: H,
}

impl<B, H> hyper::body::Body for Held<B, H>
where
    B: hyper::body::Body + Unpin,
    H: Unpin,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use tokio::time::Instant;

    #[test]
    fn requests_from_elsewhere_get_the_defaults() {
        let mut request = axum::http::Request::new(());
        assert_eq!(UpstreamBounds::of(&request), UpstreamBounds::default());
        let short = UpstreamBounds::new(Duration::from_millis(5), Duration::from_millis(7));
        request.extensions_mut().insert(short);
        assert_eq!(UpstreamBounds::of(&request), short);
    }

    struct Flag(Arc<AtomicBool>);
    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_answer_body_fails_and_releases_what_it_held() {
        let (mut tx, rx) = futures::channel::mpsc::channel::<Result<Bytes, std::io::Error>>(4);
        let released = Arc::new(AtomicBool::new(false));
        let bounds = UpstreamBounds::new(Duration::from_secs(60), Duration::from_secs(5));
        let body = bounds.answer_body(Body::from_stream(rx), Flag(released.clone()));
        tx.try_send(Ok(Bytes::from_static(b"part"))).unwrap();
        let mut stream = body.into_data_stream();
        use futures::StreamExt;
        assert_eq!(stream.next().await.unwrap().unwrap(), "part");
        let started = tokio::time::Instant::now();
        let err = stream.next().await.unwrap().unwrap_err();
        assert!(err.to_string().contains("no byte"), "{err}");
        assert!(started.elapsed() >= Duration::from_secs(5));
        assert!(tx.is_closed(), "the sandbox's body was let go");
        assert!(
            !released.load(Ordering::SeqCst),
            "held while the body lives"
        );
        drop(stream);
        assert!(released.load(Ordering::SeqCst));
    }

    #[tokio::test(start_paused = true)]
    async fn the_head_deadline_restarts_with_each_piece_of_the_request_the_sandbox_takes() {
        let (mut tx, rx) = futures::channel::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
        let bounds = UpstreamBounds::new(Duration::from_secs(10), Duration::from_secs(60));
        let (body, overdue) = bounds.watch_request(Body::from_stream(rx));
        let mut overdue = Box::pin(overdue);
        let mut stream = body.into_data_stream();
        use futures::StreamExt;
        let started = Instant::now();
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_secs(8)).await;
            tx.try_send(Ok(Bytes::from_static(b"piece"))).unwrap();
            assert_eq!(stream.next().await.unwrap().unwrap(), "piece");
        }
        assert!(
            futures::poll!(overdue.as_mut()).is_pending(),
            "40 s of upload the sandbox kept taking is not overdue"
        );
        overdue.await;
        assert_eq!(started.elapsed(), Duration::from_secs(50));
    }

    #[test]
    fn the_timeout_answer_says_what_did_not_answer() {
        let response = gateway_timeout("port 3000 of sandbox abc", Duration::from_millis(1500));
        assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    }
}
