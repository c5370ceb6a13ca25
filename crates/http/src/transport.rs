//! Sending requests: the URL of an API path, one logical request sent and retried with backoff,
//! JSON calls, calls carrying an operation id, the server's capabilities, and transport failures
//! and error answers turned into [`Error`]s.

use std::time::Duration;

use reqwest::{Method, StatusCode, Url};
use sandcove_core::wire::{
    error_from_response, API_PREFIX, FRAMES_CONTENT_TYPE, IDEMPOTENCY_HEADER,
};
use sandcove_core::{Capabilities, Error, Result};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::HttpBackend;

/// How a call may be retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retry {
    /// Replaying it is harmless: retry 5xx and transport failures too.
    Idempotent,
    /// Retry only what cannot have had an effect: refused connections and 429.
    Unsafe,
}

/// One logical request, sent (and maybe retried) by `HttpBackend::send`.
pub(crate) struct Req<'a> {
    pub(crate) method: Method,
    pub(crate) url: Url,
    pub(crate) query: &'a [(&'a str, String)],
    pub(crate) payload: Payload,
    pub(crate) idempotency_key: Option<&'a str>,
    pub(crate) retry: Retry,
    /// The answer is a stream: time out on its head only.
    pub(crate) stream: bool,
}

/// A request body that can be replayed on retry.
pub(crate) enum Payload {
    None,
    Json(Vec<u8>),
    Raw(Vec<u8>),
}

impl HttpBackend {
    /// The URL of the API path `segments`. A segment the URL would not keep as one path
    /// segment (`""`, `.`, `..`: a URL drops or folds those, sending the call to another route
    /// or another sandbox) names nothing, so it is `NotFound` before any request.
    pub(crate) fn url_for(&self, segments: &[&str]) -> Result<Url> {
        if let Some(bad) = segments.iter().find(|s| matches!(**s, "" | "." | "..")) {
            let what = segments.first().copied().unwrap_or("path");
            return Err(Error::not_found(format!("{what} entry {bad:?}")));
        }
        let mut url = self.base.clone();
        {
            let mut path = url
                .path_segments_mut()
                .expect("checked at construction: a base URL");
            path.pop_if_empty();
            path.extend(API_PREFIX.trim_start_matches('/').split('/'));
            path.extend(segments);
        }
        Ok(url)
    }

    pub(crate) fn sandbox_url(&self, id: &str, rest: &[&str]) -> Result<Url> {
        let mut segments = vec!["sandboxes", id];
        segments.extend_from_slice(rest);
        self.url_for(&segments)
    }

    /// Send a request, retrying per `retry`, and return the successful response. `stream`
    /// responses get a timeout on their head only.
    pub(crate) async fn send(&self, req: Req<'_>) -> Result<reqwest::Response> {
        let Req {
            method,
            url,
            query,
            payload,
            idempotency_key,
            retry,
            stream,
        } = req;
        let mut attempt = 0u32;
        loop {
            let mut request = self
                .http
                .request(method.clone(), url.clone())
                .bearer_auth(&*self.api_key);
            if !query.is_empty() {
                request = request.query(query);
            }
            if let Some(key) = idempotency_key {
                request = request.header(IDEMPOTENCY_HEADER, key);
            }
            request = match &payload {
                Payload::None => request,
                Payload::Json(body) => request
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(body.clone()),
                Payload::Raw(body) => request
                    .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
                    .body(body.clone()),
            };
            if stream {
                // Every streamed answer is a frame stream; a route that can answer either
                // way (an image pull) streams when asked.
                request = request.header(reqwest::header::ACCEPT, FRAMES_CONTENT_TYPE);
            } else {
                request = request.timeout(self.options.request_timeout);
            }
            let sent = if stream {
                match tokio::time::timeout(self.options.request_timeout, request.send()).await {
                    Ok(result) => result,
                    Err(_) => {
                        let err = Error::Timeout {
                            what: format!("{method} {}", url.path()),
                        };
                        if retry == Retry::Idempotent && attempt < self.options.max_retries {
                            self.backoff(attempt, None).await;
                            attempt += 1;
                            continue;
                        }
                        return Err(outcome_lost(err, idempotency_key));
                    }
                }
            } else {
                request.send().await
            };
            // `lost`: the request may have reached the server, and its answer did not arrive.
            let (err, retryable, retry_after, lost) = match sent {
                Ok(response) if response.status().is_success() => return Ok(response),
                Ok(response) => {
                    let status = response.status();
                    let err = read_error(response, self.options.request_timeout).await;
                    let retry_after = match &err {
                        Error::RateLimited { retry_after_ms, .. } => *retry_after_ms,
                        _ => None,
                    };
                    let retryable = status == StatusCode::TOO_MANY_REQUESTS
                        || (status.is_server_error()
                            && retry == Retry::Idempotent
                            && err.is_retryable());
                    (err, retryable, retry_after, false)
                }
                Err(e) => {
                    // A certificate the client refuses is refused again on every attempt.
                    let refused = crate::CertificateProblem::find(&e).is_some();
                    let retryable = !refused && (e.is_connect() || retry == Retry::Idempotent);
                    let lost = !(e.is_connect() || e.is_builder());
                    (transport_error(&e, &method, &url), retryable, None, lost)
                }
            };
            if !retryable || attempt >= self.options.max_retries {
                return Err(if lost {
                    outcome_lost(err, idempotency_key)
                } else {
                    err
                });
            }
            self.backoff(attempt, retry_after).await;
            attempt += 1;
        }
    }

    async fn backoff(&self, attempt: u32, retry_after_ms: Option<u64>) {
        let exp = self
            .options
            .backoff
            .saturating_mul(1u32 << attempt.min(16))
            .min(self.options.max_backoff);
        let wait = match retry_after_ms {
            Some(ms) => Duration::from_millis(ms).min(self.options.max_backoff),
            None => exp,
        };
        tokio::time::sleep(wait).await;
    }

    /// A JSON call: send `body` (if any), decode the JSON answer.
    pub(crate) async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        url: Url,
        query: &[(&str, String)],
        body: Option<&(impl Serialize + ?Sized)>,
        retry: Retry,
    ) -> Result<T> {
        let payload = match body {
            Some(b) => Payload::Json(to_json(b)?),
            None => Payload::None,
        };
        let response = self
            .send(Req {
                method,
                url,
                query,
                payload,
                idempotency_key: None,
                retry,
                stream: false,
            })
            .await?;
        decode_json(response).await
    }

    /// A JSON call whose answer carries nothing.
    pub(crate) async fn call_unit(
        &self,
        method: Method,
        url: Url,
        query: &[(&str, String)],
        payload: Payload,
        retry: Retry,
    ) -> Result<()> {
        let response = self
            .send(Req {
                method,
                url,
                query,
                payload,
                idempotency_key: None,
                retry,
                stream: false,
            })
            .await?;
        // Drain the (empty) body so the connection returns to the pool.
        let _ = response.bytes().await;
        Ok(())
    }

    /// A create: a `POST` carrying its operation id (the scope's, or a fresh one) as the
    /// idempotency key, retried like an idempotent call.
    pub(crate) async fn create_call<T: DeserializeOwned>(
        &self,
        url: Url,
        body: &(impl Serialize + ?Sized),
    ) -> Result<T> {
        self.op_call(Method::POST, url, &[], Payload::Json(to_json(body)?))
            .await
    }

    /// A call with a remote effect (a create, a file change): it carries its operation id
    /// (the scope's, or a fresh one) as the idempotency key, so it is retried like an
    /// idempotent call (the server answers a replay with the first outcome), and an answer
    /// lost after it was sent is [`Error::OutcomeUnknown`] naming the id.
    pub(crate) async fn op_call<T: DeserializeOwned>(
        &self,
        method: Method,
        url: Url,
        query: &[(&str, String)],
        payload: Payload,
    ) -> Result<T> {
        let key = sandcove_core::OperationId::current_or_new();
        let response = self
            .send(Req {
                method,
                url,
                query,
                payload,
                idempotency_key: Some(key.as_str()),
                retry: Retry::Idempotent,
                stream: false,
            })
            .await?;
        decode_json(response)
            .await
            .map_err(|e| outcome_lost(e, Some(key.as_str())))
    }

    /// A destroy or delete: a `DELETE` carrying its operation id, so a replay after a lost
    /// answer gets the first one's outcome instead of "not found".
    pub(crate) async fn delete_call(&self, url: Url, query: &[(&str, String)]) -> Result<()> {
        let key = sandcove_core::OperationId::current_or_new();
        let target = url.clone();
        let response = self
            .send(Req {
                method: Method::DELETE,
                url,
                query,
                payload: Payload::None,
                idempotency_key: Some(key.as_str()),
                retry: Retry::Idempotent,
                stream: false,
            })
            .await?;
        response.bytes().await.map(drop).map_err(|e| {
            outcome_lost(
                transport_error(&e, &Method::DELETE, &target),
                Some(key.as_str()),
            )
        })
    }
}

pub(crate) fn to_json(body: &(impl Serialize + ?Sized)) -> Result<Vec<u8>> {
    serde_json::to_vec(body).map_err(|e| Error::invalid(format!("cannot encode request: {e}")))
}

pub(crate) async fn decode_json<T: DeserializeOwned>(response: reqwest::Response) -> Result<T> {
    let url = response.url().path().to_string();
    let bytes = response.bytes().await.map_err(|e| Error::Backend {
        message: format!("reading the answer of {url}: {e}"),
        retryable: true,
    })?;
    serde_json::from_slice(&bytes)
        .map_err(|e| Error::backend(format!("undecodable answer from {url}: {e}")))
}

pub(crate) async fn read_error(response: reqwest::Response, limit: Duration) -> Error {
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = match tokio::time::timeout(limit, response.bytes()).await {
        Ok(Ok(bytes)) => bytes.to_vec(),
        _ => Vec::new(),
    };
    error_from_response(status, retry_after.as_deref(), &body)
}

pub(crate) fn transport_error(e: &reqwest::Error, method: &Method, url: &Url) -> Error {
    let what = format!("{method} {}", url.path());
    if let Some(problem) = crate::CertificateProblem::find(e) {
        problem.into_error(&url.origin().ascii_serialization())
    } else if e.is_timeout() {
        Error::Timeout { what }
    } else if e.is_connect() {
        Error::Unavailable {
            reason: format!(
                "cannot reach the sandcove server at {}: {}",
                url.origin().ascii_serialization(),
                error_chain(e)
            ),
            remedy: "start `sandcove serve` there, or fix SANDCOVE_URL".into(),
        }
    } else {
        Error::Backend {
            message: format!("{what}: {}", error_chain(e)),
            retryable: true,
        }
    }
}

pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// `err`, met after a request carrying operation `key` may have taken effect, as
/// [`Error::OutcomeUnknown`]; without a key (a call without a remote effect) unchanged.
pub(crate) fn outcome_lost(err: Error, key: Option<&str>) -> Error {
    match key {
        Some(operation) => Error::OutcomeUnknown {
            operation: operation.to_string(),
            message: format!(
                "the request was sent and its answer was lost ({err}); observe the operation, or \
                 run the call again under the same operation id"
            ),
        },
        None => err,
    }
}

pub(crate) async fn fetch_capabilities(
    backend: &HttpBackend,
    http: &reqwest::Client,
) -> Result<Capabilities> {
    let url = backend.url_for(&["capabilities"])?;
    let response = http
        .get(url.clone())
        .bearer_auth(&*backend.api_key)
        .timeout(backend.options.request_timeout)
        .send()
        .await
        .map_err(|e| transport_error(&e, &Method::GET, &url))?;
    if !response.status().is_success() {
        return Err(read_error(response, backend.options.request_timeout).await);
    }
    let mut caps: Capabilities = decode_json(response).await?;
    caps.backend = format!("http+{}", caps.backend);
    // Observed now, by this client: the server's own probe time says nothing about whether
    // it is still reachable.
    caps.observed_at = Some(sandcove_core::now_millis());
    Ok(caps)
}

/// The capabilities reported before the server was asked: nothing optional.
pub(crate) fn unknown_capabilities() -> Capabilities {
    Capabilities::none("http+unknown")
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandcove_core::wire::status_for;
    use sandcove_core::ErrorCode;

    #[test]
    fn every_code_maps_back_from_its_status_and_body() {
        let errors = [
            Error::not_found("sandbox \"x\""),
            Error::AlreadyExists { what: "v".into() },
            Error::Conflict { what: "k".into() },
            Error::invalid("bad"),
            Error::Timeout { what: "t".into() },
            Error::PermissionDenied {
                what: "/usr".into(),
            },
            Error::Unauthenticated {
                message: "no key".into(),
            },
            Error::InvalidState {
                id: "x".into(),
                state: "paused".into(),
                message: "m".into(),
            },
            Error::not_supported("pty", "exec"),
            Error::Unavailable {
                reason: "r".into(),
                remedy: "m".into(),
            },
            Error::RateLimited {
                message: "slow".into(),
                retry_after_ms: Some(2000),
            },
            Error::Io {
                message: "disk".into(),
                errno: Some(28),
            },
            Error::file_too_large("/workspace/big", 1 << 20),
            Error::Backend {
                message: "b".into(),
                retryable: true,
            },
            Error::Destroyed {
                kind: "sandbox".into(),
                id: "x".into(),
                at: 1_767_225_600_000,
                reason: "destroyed".into(),
            },
            Error::Forbidden {
                what: "another runtime's reference".into(),
            },
        ];
        for err in errors {
            let status = status_for(err.code());
            let body = serde_json::to_vec(&err.to_body()).unwrap();
            let back = error_from_response(status, None, &body);
            assert_eq!(back.code(), err.code(), "{err}");
            assert_eq!(back.to_string(), err.to_string());
            assert_eq!(back.is_retryable(), err.is_retryable());
        }
    }

    #[test]
    fn bodies_without_a_code_map_by_status() {
        let table = [
            (400, ErrorCode::InvalidArgument),
            (401, ErrorCode::Unauthenticated),
            (403, ErrorCode::PermissionDenied),
            (404, ErrorCode::NotFound),
            (410, ErrorCode::NotFound),
            (409, ErrorCode::AlreadyExists),
            (412, ErrorCode::Conflict),
            (413, ErrorCode::InvalidArgument),
            (429, ErrorCode::RateLimited),
            (501, ErrorCode::NotSupported),
            (502, ErrorCode::Backend),
            (503, ErrorCode::Backend),
            (504, ErrorCode::Timeout),
            (302, ErrorCode::Backend),
        ];
        for (status, code) in table {
            let err = error_from_response(status, None, b"<html>proxy says no</html>");
            assert_eq!(err.code(), code, "status {status}");
            assert!(err.to_string().contains("proxy says no"), "{err}");
        }
        assert!(error_from_response(503, None, b"").is_retryable());
        match error_from_response(429, Some("7"), b"") {
            Error::RateLimited { retry_after_ms, .. } => assert_eq!(retry_after_ms, Some(7000)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn urls_keep_ids_and_paths_in_one_segment() {
        let b = HttpBackend::new("http://127.0.0.1:1/base/", "k").unwrap();
        assert_eq!(
            b.sandbox_url("../etc", &["files"]).unwrap().path(),
            "/base/v1/sandboxes/..%2Fetc/files"
        );
        // A URL drops `.` and folds `..`: `sandbox_url("..", ["files"])` would otherwise be
        // `/v1/sandboxes/files`, a call on the sandbox named `files`.
        for dots in ["", ".", ".."] {
            let err = b.sandbox_url(dots, &["files"]).unwrap_err();
            assert!(err.is_not_found(), "{dots:?}: {err}");
            let err = b.url_for(&["volumes", dots]).unwrap_err();
            assert!(err.is_not_found(), "{dots:?}: {err}");
        }
        assert!(HttpBackend::new("ftp://x", "k").is_err());
        assert!(HttpBackend::new("https://x", "k").is_ok());
        assert!(
            !format!("{b:?}").contains("\"k\""),
            "the key is not printed"
        );
    }
}
