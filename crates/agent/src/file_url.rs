//! The embedded engine's listener for signed file URLs: one per sandbox, held by its monitor,
//! serving [`sandcove_core::file_url`] (the token format and the one serving code, shared with
//! `sandcove serve`'s route) with the preview listeners' limits.

use std::sync::Arc;

use hyper::{Request, Response};

use sandcove_core::file_url::{
    error_response, serve, token_in_path, FileAccess, FileUrlKey, Reply,
};
use sandcove_core::stall::{IdleBody, StallIo};
use sandcove_core::{now_millis, Error, Result};

/// The path prefix of URLs a [`FileUrlListener`] serves: `/files/{token}`.
pub const LISTENER_PREFIX: &str = "/files";

/// A listener serving one sandbox's signed file URLs (the embedded engine's monitor holds
/// one, bound on the first URL), with the same limits as its preview listeners: a capped
/// number of connections, a deadline and a size bound for each request head. It verifies
/// each request's token with its key, refuses one for another sandbox, and [`serve`]s the
/// rest through `access`. Dropping it stops the listener.
pub struct FileUrlListener {
    origin: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FileUrlListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FileUrlListener {
    /// Listen on `ip` (a port the kernel picks) for sandbox `sandbox`'s URLs signed with
    /// `key`, moving bytes through `access`, uploads bounded by `max_upload`.
    pub async fn bind(
        ip: std::net::IpAddr,
        key: Arc<FileUrlKey>,
        sandbox: String,
        access: Arc<dyn FileAccess>,
        limits: crate::preview::PreviewLimits,
        max_upload: u64,
    ) -> Result<Self> {
        let (listener, origin, _) = crate::preview::bind(ip, None).await?;
        let task = tokio::spawn(async move {
            let mut acceptor = sandcove_core::listen::Acceptor::new(limits.max_connections);
            loop {
                let ((conn, _), permit) = acceptor.next(|| listener.accept()).await;
                let (key, sandbox, access) = (key.clone(), sandbox.clone(), access.clone());
                tokio::spawn(async move {
                    let _permit = permit;
                    // No-progress bounds, as the server's listener has: a body that stops
                    // coming fails the upload, an answer the client stops taking ends the
                    // connection; either frees its slot.
                    let idle = std::time::Duration::from_millis(limits.answer_idle_ms);
                    let service = hyper::service::service_fn(move |request: Request<_>| {
                        let (key, sandbox, access) = (key.clone(), sandbox.clone(), access.clone());
                        let request = request.map(|body| IdleBody::new(body, idle));
                        async move {
                            let answer =
                                answer(request, &key, &sandbox, &*access, max_upload).await;
                            Ok::<_, std::convert::Infallible>(answer)
                        }
                    });
                    let mut http = hyper::server::conn::http1::Builder::new();
                    http.timer(hyper_util::rt::TokioTimer::new())
                        .header_read_timeout(std::time::Duration::from_millis(
                            limits.head_timeout_ms,
                        ))
                        .max_buf_size(crate::preview::MAX_HEAD);
                    let _ = http
                        .serve_connection(
                            hyper_util::rt::TokioIo::new(StallIo::new(conn, idle, Arc::default())),
                            service,
                        )
                        .await;
                });
            }
        });
        Ok(FileUrlListener { origin, task })
    }

    /// The URL of `token` on this listener.
    pub fn url(&self, token: &str) -> String {
        format!("{}{LISTENER_PREFIX}/{token}", self.origin)
    }
}

/// One request to a [`FileUrlListener`]: its token verified and bound to the listener's
/// sandbox, then served.
async fn answer(
    request: Request<IdleBody<hyper::body::Incoming>>,
    key: &FileUrlKey,
    sandbox: &str,
    access: &dyn FileAccess,
    max_upload: u64,
) -> Response<Reply> {
    let unknown = || Error::Unauthenticated {
        message: "invalid signed file URL".into(),
    };
    let grant = token_in_path(request.uri().path(), LISTENER_PREFIX)
        .ok_or_else(unknown)
        .and_then(|token| key.verify(token, now_millis()))
        .and_then(|grant| {
            if grant.sandbox == sandbox {
                Ok(grant)
            } else {
                Err(unknown())
            }
        });
    match grant {
        Ok(grant) => serve(request, &grant, access, max_upload).await,
        Err(e) => error_response(&e),
    }
}
