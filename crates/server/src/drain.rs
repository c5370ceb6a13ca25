//! Refused requests keep their connection: a route (or a layer before it: authentication,
//! a body limit, a fallback) that answers without reading the request's body would make the
//! HTTP/1.1 connection close as soon as the answer is written, unless the whole body
//! happened to be in the server's buffer already. A client that reuses connections (the
//! vendors' Python SDKs do) has often sent its next request on it by then, and sees that one
//! fail with "Server disconnected". So every router served by the connection loop reads, after
//! the answer is made and before it is sent, what is left of a body nothing else holds: at
//! most [`MAX_DRAIN`] bytes within the connection's head timeout, else the answer says
//! `Connection: close` and the connection ends after it, as it did before. A body whose
//! declared length is past that bound is not read at all (nor solicited with `100 Continue`).

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{header, HeaderValue};
use axum::middleware::Next;
use futures::StreamExt;
use hyper::body::{Frame, SizeHint};

/// Most of an unread request body read after its answer so the connection can be reused.
pub(super) const MAX_DRAIN: usize = 64 * 1024;

/// `app` with every answer given only once the request's unread body (if any, bounded by
/// [`MAX_DRAIN`] and `deadline`) has been read; see the module docs.
pub(super) fn refused_bodies_drained(app: axum::Router, deadline: Duration) -> axum::Router {
    app.layer(axum::middleware::from_fn(
        move |request: Request, next: Next| async move {
            let body = Arc::new(Mutex::new(None));
            let request = request.map(|inner| {
                *body.lock().unwrap_or_else(|e| e.into_inner()) = Some(inner);
                Body::new(Shared(body.clone()))
            });
            let mut response = next.run(request).await;
            // Still held (a streamed answer reading the request as it goes): not ours.
            let Ok(slot) = Arc::try_unwrap(body) else {
                return response;
            };
            let Some(rest) = slot.into_inner().unwrap_or_else(|e| e.into_inner()) else {
                return response;
            };
            // A body declared larger than the bound is not read at all: reading it would
            // solicit it (`100 Continue`) from a client that may hold no key, and wait on it.
            let unread = !hyper::body::Body::is_end_stream(&rest);
            let too_large = hyper::body::Body::size_hint(&rest).lower() > MAX_DRAIN as u64;
            if unread && (too_large || !drain(rest, deadline).await) {
                response
                    .headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            response
        },
    ))
}

/// Read what is left of `body`; `false` when it is larger than [`MAX_DRAIN`], broken, or
/// not all there within `deadline`.
async fn drain(body: Body, deadline: Duration) -> bool {
    let read = async {
        let mut chunks = body.into_data_stream();
        let mut read = 0usize;
        while let Some(chunk) = chunks.next().await {
            match chunk {
                Ok(bytes) => {
                    read += bytes.len();
                    if read > MAX_DRAIN {
                        return false;
                    }
                }
                Err(_) => return false,
            }
        }
        true
    };
    tokio::time::timeout(deadline, read).await.unwrap_or(false)
}

/// The request body as handlers see it; the body itself stays in the slot, so whatever the
/// handler leaves unread is still there once it has dropped this.
struct Shared(Arc<Mutex<Option<Body>>>);

impl hyper::body::Body for Shared {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let mut slot = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match slot.as_mut() {
            Some(body) => Pin::new(body).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        let slot = self.0.lock().unwrap_or_else(|e| e.into_inner());
        slot.as_ref().is_none_or(hyper::body::Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        let slot = self.0.lock().unwrap_or_else(|e| e.into_inner());
        slot.as_ref()
            .map(hyper::body::Body::size_hint)
            .unwrap_or_else(|| SizeHint::with_exact(0))
    }
}
