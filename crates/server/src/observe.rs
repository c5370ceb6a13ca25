//! Observability of the native API, as one layer around the whole router: a `tracing` span
//! per request (method, route, operation, sandbox id, status, duration; never a header, so
//! never the API key) and the counters `GET /metrics` serves in Prometheus's text format.
//!
//! The layer sits outside authentication, so refused requests are counted and logged too;
//! `/metrics` itself is an ordinary authenticated route. Live sandboxes by state are read
//! from the backend at scrape time rather than tracked, so they can never drift.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper::body::{Frame, SizeHint};
use tracing::Instrument;

use sandcove_core::{Backend, ErrorCode, ListOptions};

/// The path of the metrics document.
pub const METRICS_PATH: &str = "/metrics";

/// Upper bounds (seconds) of the latency histogram's buckets.
const BUCKETS: [f64; 12] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// One operation's latency histogram.
#[derive(Default)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

/// What the layer counts.
#[derive(Default)]
struct Counters {
    /// Requests by (operation, status code).
    requests: BTreeMap<(String, u16), u64>,
    /// Latency by operation.
    latency: BTreeMap<String, Histogram>,
    /// Error answers by error code.
    errors: BTreeMap<String, u64>,
    creates: u64,
    destroys: u64,
}

/// What one server counts, shared by its native API and its vendor wire listeners, so one
/// `GET /metrics` covers every port the server serves. Cloning shares the counts.
#[derive(Clone, Default)]
pub struct ServerMetrics {
    tally: Arc<Tally>,
}

impl std::fmt::Debug for ServerMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServerMetrics")
    }
}

/// The counters behind [`ServerMetrics`].
#[derive(Default)]
struct Tally {
    counters: Mutex<Counters>,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
}

/// The observing layer's state: the route table (to name operations) and the counters.
pub(crate) struct Observer {
    /// `(method, route)` → operation name, from the route table.
    ops: HashMap<(Method, &'static str), &'static str>,
    tally: Arc<Tally>,
}

impl Observer {
    /// An observer naming operations after `routes` (`(method, path, op)`).
    pub(crate) fn new(
        routes: impl IntoIterator<Item = (Method, &'static str, &'static str)>,
        metrics: &ServerMetrics,
    ) -> Self {
        let mut ops: HashMap<_, _> = routes
            .into_iter()
            .map(|(method, path, op)| ((method, path), op))
            .collect();
        ops.insert((Method::GET, METRICS_PATH), "metrics");
        Observer {
            ops,
            tally: Arc::clone(&metrics.tally),
        }
    }

    /// The route template and operation a request matches (the layer runs before the
    /// router, so it matches on its own).
    fn op(&self, method: &Method, path: &str) -> (&'static str, &'static str) {
        self.ops
            .iter()
            .find(|((m, template), _)| m == method && matches_template(template, path))
            .map(|((_, template), op)| (*template, *op))
            .unwrap_or(("-", "unmatched"))
    }

    fn record(&self, op: &str, status: u16, error: Option<ErrorCode>, seconds: f64) {
        self.tally.record(op, status, error, seconds)
    }

    fn render(&self, live: Result<BTreeMap<String, u64>, String>) -> String {
        self.tally.render_document(live)
    }
}

impl Tally {
    fn record(&self, op: &str, status: u16, error: Option<ErrorCode>, seconds: f64) {
        let mut c = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        *c.requests.entry((op.to_string(), status)).or_default() += 1;
        let h = c.latency.entry(op.to_string()).or_default();
        h.count += 1;
        h.sum += seconds;
        for (i, bound) in BUCKETS.iter().enumerate() {
            if seconds <= *bound {
                h.counts[i] += 1;
            }
        }
        if let Some(code) = error {
            *c.errors.entry(code_name(code)).or_default() += 1;
        }
        if (200..300).contains(&status) {
            match op {
                "create" | "fork" => c.creates += 1,
                "destroy" => c.destroys += 1,
                _ => {}
            }
        }
    }

    /// The metrics document; `live` is the live sandboxes by state (or why they are unknown).
    fn render_document(&self, live: Result<BTreeMap<String, u64>, String>) -> String {
        let c = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = String::new();
        family(
            &mut out,
            "sandcove_sandboxes",
            "gauge",
            "Live sandboxes by state, read from the backend at scrape time.",
        );
        if let Ok(states) = &live {
            for (state, n) in states {
                let _ = writeln!(out, "sandcove_sandboxes{{state=\"{state}\"}} {n}");
            }
        }
        family(
            &mut out,
            "sandcove_sandboxes_up",
            "gauge",
            "1 when the backend answered the scrape's sandbox list, else 0.",
        );
        let _ = writeln!(out, "sandcove_sandboxes_up {}", u8::from(live.is_ok()));
        family(
            &mut out,
            "sandcove_sandboxes_created_total",
            "counter",
            "Sandboxes created (create and fork) through this server's native API; vendor listeners' creates are among their requests (op e2b, daytona, blaxel), and every live sandbox is in sandcove_sandboxes.",
        );
        let _ = writeln!(out, "sandcove_sandboxes_created_total {}", c.creates);
        family(
            &mut out,
            "sandcove_sandboxes_destroyed_total",
            "counter",
            "Sandboxes destroyed through this server's native API (vendor listeners' are among their requests).",
        );
        let _ = writeln!(out, "sandcove_sandboxes_destroyed_total {}", c.destroys);
        family(
            &mut out,
            "sandcove_requests_total",
            "counter",
            "Requests by operation and HTTP status.",
        );
        for ((op, status), n) in &c.requests {
            let _ = writeln!(
                out,
                "sandcove_requests_total{{op=\"{op}\",status=\"{status}\"}} {n}"
            );
        }
        family(
            &mut out,
            "sandcove_request_duration_seconds",
            "histogram",
            "Time to the response head, by operation.",
        );
        for (op, h) in &c.latency {
            for (i, bound) in BUCKETS.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "sandcove_request_duration_seconds_bucket{{op=\"{op}\",le=\"{bound}\"}} {}",
                    h.counts[i]
                );
            }
            let _ = writeln!(
                out,
                "sandcove_request_duration_seconds_bucket{{op=\"{op}\",le=\"+Inf\"}} {}",
                h.count
            );
            let _ = writeln!(
                out,
                "sandcove_request_duration_seconds_sum{{op=\"{op}\"}} {}",
                h.sum
            );
            let _ = writeln!(
                out,
                "sandcove_request_duration_seconds_count{{op=\"{op}\"}} {}",
                h.count
            );
        }
        family(
            &mut out,
            "sandcove_errors_total",
            "counter",
            "Error answers by error code.",
        );
        for (code, n) in &c.errors {
            let _ = writeln!(out, "sandcove_errors_total{{code=\"{code}\"}} {n}");
        }
        family(
            &mut out,
            "sandcove_bytes_total",
            "counter",
            "Body bytes transferred: in (request bodies) and out (response bodies).",
        );
        let _ = writeln!(
            out,
            "sandcove_bytes_total{{direction=\"in\"}} {}",
            self.bytes_in.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "sandcove_bytes_total{{direction=\"out\"}} {}",
            self.bytes_out.load(Ordering::Relaxed)
        );
        out
    }
}

/// The `# HELP` and `# TYPE` lines of one metric family.
fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// An error code's wire name (`not_found`, …).
fn code_name(code: ErrorCode) -> String {
    serde_json::to_value(code)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| format!("{code:?}"))
}

/// Whether `path` fits the route `template` (`{name}` matches one non-empty segment).
fn matches_template(template: &str, path: &str) -> bool {
    let mut t = template.split('/');
    let mut p = path.split('/');
    loop {
        match (t.next(), p.next()) {
            (None, None) => return true,
            (Some(ts), Some(ps)) if ts.starts_with('{') && ts.ends_with('}') => {
                if ps.is_empty() {
                    return false;
                }
            }
            (Some(ts), Some(ps)) if ts == ps => {}
            _ => return false,
        }
    }
}

/// The sandbox a request addresses, from its path (`/v1/sandboxes/{id}/…`): ids are
/// generated or validated names, but the value is cut to a sane length for logs anyway.
fn sandbox_id(path: &str) -> &str {
    let id = path
        .strip_prefix("/v1/sandboxes/")
        .map(|rest| rest.split('/').next().unwrap_or_default())
        .unwrap_or_default();
    match id.char_indices().nth(64) {
        Some((cut, _)) => &id[..cut],
        None => id,
    }
}

/// The layer: span, timing, counting (see the module docs).
pub(crate) async fn observe(
    State(observer): State<Arc<Observer>>,
    request: Request,
    next: Next,
) -> Response {
    let started = Instant::now();
    let method = request.method().clone();
    let (route, op) = observer.op(&method, request.uri().path());
    let span = tracing::info_span!(
        "request",
        method = %method,
        route,
        op,
        sandbox = sandbox_id(request.uri().path()),
        status = tracing::field::Empty,
        duration_ms = tracing::field::Empty,
    );
    let request = request.map(|body| {
        Body::new(Counting {
            inner: body,
            counter: Arc::clone(&observer.tally),
            incoming: true,
        })
    });
    let response = next.run(request).instrument(span.clone()).await;
    let elapsed = started.elapsed();
    let status = response.status().as_u16();
    let error = response.extensions().get::<ErrorCode>().copied();
    observer.record(op, status, error, elapsed.as_secs_f64());
    span.record("status", status);
    span.record("duration_ms", elapsed.as_millis() as u64);
    span.in_scope(|| match error {
        Some(code) => tracing::info!(error = %code_name(code), "request answered with an error"),
        None => tracing::info!("request answered"),
    });
    response.map(|body| {
        Body::new(Counting {
            inner: body,
            counter: Arc::clone(&observer.tally),
            incoming: false,
        })
    })
}

/// A vendor wire listener's router (`listener` names it: `e2b`, `daytona`, `blaxel`),
/// observed like the native API: a span per request naming the listener, method, path (never
/// the query, which may carry signatures, nor any header, which carry keys), status and
/// duration, and its requests, latency and bytes counted in `metrics` under the operation
/// `listener` (vendor paths carry ids, so they are not used as label values).
pub fn observe_listener(
    router: axum::Router,
    listener: &'static str,
    metrics: &ServerMetrics,
) -> axum::Router {
    let tally = Arc::clone(&metrics.tally);
    router.layer(axum::middleware::from_fn(
        move |request: Request, next: Next| {
            let tally = Arc::clone(&tally);
            async move {
                let started = Instant::now();
                let path: String = request.uri().path().chars().take(256).collect();
                let span = tracing::info_span!(
                    "request",
                    listener,
                    method = %request.method(),
                    path,
                    status = tracing::field::Empty,
                    duration_ms = tracing::field::Empty,
                );
                let request = request.map(|body| {
                    Body::new(Counting {
                        inner: body,
                        counter: Arc::clone(&tally),
                        incoming: true,
                    })
                });
                let response = next.run(request).instrument(span.clone()).await;
                let elapsed = started.elapsed();
                let status = response.status().as_u16();
                tally.record(listener, status, None, elapsed.as_secs_f64());
                span.record("status", status);
                span.record("duration_ms", elapsed.as_millis() as u64);
                span.in_scope(|| tracing::info!("request answered"));
                response.map(|body| {
                    Body::new(Counting {
                        inner: body,
                        counter: tally,
                        incoming: false,
                    })
                })
            }
        },
    ))
}

/// `GET /metrics`.
pub(crate) async fn metrics(
    State((observer, backend)): State<(Arc<Observer>, Arc<dyn Backend>)>,
) -> Response {
    let live = backend
        .list(ListOptions::default())
        .await
        .map(|list| {
            let mut states = BTreeMap::new();
            for info in list {
                let state = serde_json::to_value(info.state)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default();
                *states.entry(state).or_insert(0u64) += 1;
            }
            states
        })
        .map_err(|e| e.to_string());
    let mut response = (StatusCode::OK, observer.render(live)).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}

/// A body that adds the bytes it carries to the observer's in or out counter, leaving size
/// hints and end-of-stream as they were (a known length stays a `Content-Length`).
struct Counting {
    inner: Body,
    counter: Arc<Tally>,
    incoming: bool,
}

impl hyper::body::Body for Counting {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let Some(data) = frame.data_ref() {
                let counter = if self.incoming {
                    &self.counter.bytes_in
                } else {
                    &self.counter.bytes_out
                };
                counter.fetch_add(data.len() as u64, Ordering::Relaxed);
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_ids_come_from_the_path_only() {
        assert_eq!(sandbox_id("/v1/sandboxes/abc/processes"), "abc");
        assert_eq!(sandbox_id("/v1/sandboxes/abc"), "abc");
        assert_eq!(sandbox_id("/v1/sandboxes"), "");
        assert_eq!(sandbox_id("/v1/volumes/x"), "");
        assert_eq!(
            sandbox_id(&format!("/v1/sandboxes/{}", "x".repeat(100))).len(),
            64
        );
    }

    #[test]
    fn the_document_counts_what_was_recorded() {
        let observer = Observer::new(
            [(Method::POST, "/v1/sandboxes", "create")],
            &ServerMetrics::default(),
        );
        assert_eq!(
            observer.op(&Method::POST, "/v1/sandboxes"),
            ("/v1/sandboxes", "create")
        );
        assert_eq!(observer.op(&Method::GET, "/v1/sandboxes").1, "unmatched");
        assert!(matches_template(
            "/v1/sandboxes/{id}/files",
            "/v1/sandboxes/a1/files"
        ));
        assert!(!matches_template(
            "/v1/sandboxes/{id}/files",
            "/v1/sandboxes//files"
        ));
        assert!(!matches_template(
            "/v1/sandboxes/{id}",
            "/v1/sandboxes/a1/files"
        ));
        observer.record("create", 200, None, 0.003);
        observer.record("get", 404, Some(ErrorCode::NotFound), 0.2);
        let text = observer.render(Ok([("running".to_string(), 2)].into()));
        assert!(
            text.contains("sandcove_sandboxes{state=\"running\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("sandcove_sandboxes_created_total 1\n"),
            "{text}"
        );
        assert!(
            text.contains("sandcove_errors_total{code=\"not_found\"} 1\n"),
            "{text}"
        );
        assert!(text
            .contains("sandcove_request_duration_seconds_bucket{op=\"create\",le=\"0.005\"} 1\n"));
        assert!(text
            .contains("sandcove_request_duration_seconds_bucket{op=\"create\",le=\"0.001\"} 0\n"));
        assert!(text.contains("sandcove_requests_total{op=\"get\",status=\"404\"} 1\n"));
    }
}
