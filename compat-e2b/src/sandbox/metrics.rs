//! Metrics: `SandboxMetrics`, the builder of `get_metrics(...)`, and the sample shared with the
//! wire protocol.

use std::future::IntoFuture;

use crate::call::{client, with_request_timeout, BoxFuture, IntoSeconds};
use crate::errors::Result;
use crate::translate::DateTime;

/// `SandboxMetrics`.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxMetrics {
    /// `cpu_count`.
    pub cpu_count: i64,
    /// `cpu_used_pct`.
    pub cpu_used_pct: f64,
    /// `disk_total`, bytes.
    pub disk_total: i64,
    /// `disk_used`, bytes.
    pub disk_used: i64,
    /// `mem_total`, bytes.
    pub mem_total: i64,
    /// `mem_used`, bytes.
    pub mem_used: i64,
    /// `mem_cache`, bytes (not measured: 0).
    pub mem_cache: i64,
    /// `timestamp`.
    pub timestamp: DateTime,
}

/// The builder of `get_metrics(...)`.
#[derive(Debug)]
#[must_use = "a call does nothing until awaited"]
pub struct MetricsBuilder {
    pub(super) sandbox_id: String,
    pub(super) start: Option<DateTime>,
    pub(super) end: Option<DateTime>,
    pub(super) request_timeout: Option<f64>,
}

impl MetricsBuilder {
    /// `start=`: only samples at or after this time.
    pub fn start(mut self, start: DateTime) -> Self {
        self.start = Some(start);
        self
    }

    /// `end=`: only samples at or before this time.
    pub fn end(mut self, end: DateTime) -> Self {
        self.end = Some(end);
        self
    }

    /// `request_timeout=`.
    pub fn request_timeout(mut self, secs: impl IntoSeconds) -> Self {
        self.request_timeout = secs.into_seconds();
        self
    }
}

impl IntoFuture for MetricsBuilder {
    type Output = Result<Vec<SandboxMetrics>>;
    type IntoFuture = BoxFuture<'static, Vec<SandboxMetrics>>;
    fn into_future(self) -> Self::IntoFuture {
        let limit = self.request_timeout;
        with_request_timeout(
            Box::pin(async move {
                let range = (
                    self.start.map(|s| s.unix_millis),
                    self.end.map(|e| e.unix_millis),
                );
                metrics_in_range(&client()?, &self.sandbox_id, range).await
            }),
            limit,
        )
    }
}

/// The metrics samples of a sandbox inside `range` (Unix milliseconds, both ends included
/// when given), as E2B reports them; shared with the wire protocol, which gives its range in
/// seconds. The runtime keeps no history: the one sample is taken now, and listed only when
/// the range holds it.
pub(crate) async fn metrics_in_range(
    client: &sandcove::Client,
    sandbox_id: &str,
    (start, end): (Option<u64>, Option<u64>),
) -> Result<Vec<SandboxMetrics>> {
    let sample = metrics_on(client, sandbox_id).await?;
    let at = sample.timestamp.unix_millis;
    let in_range = start.is_none_or(|s| at >= s) && end.is_none_or(|e| at <= e);
    Ok(if in_range { vec![sample] } else { Vec::new() })
}

/// One metrics sample of a sandbox, as E2B reports it.
async fn metrics_on(client: &sandcove::Client, sandbox_id: &str) -> Result<SandboxMetrics> {
    let m = client.sandbox(sandbox_id).metrics().await?;
    Ok(SandboxMetrics {
        cpu_count: i64::from(m.cpu_count),
        cpu_used_pct: m.cpu_used_pct,
        disk_total: m.disk_total as i64,
        disk_used: m.disk_used as i64,
        mem_total: m.mem_total as i64,
        mem_used: m.mem_used as i64,
        mem_cache: 0,
        timestamp: DateTime::from_unix_millis(m.timestamp),
    })
}
