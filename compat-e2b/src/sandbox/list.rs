//! Listing sandboxes: `SandboxQuery` and `SandboxPaginator`, and the page size and `next_token`
//! rules the snapshot paginator shares.

use std::collections::BTreeMap;
use std::future::IntoFuture;

use sandcove::ListOptions;

use super::{SandboxInfo, SandboxState};
use crate::call::client;
use crate::errors::{Result, SandboxException};
use crate::translate;
use crate::translate::DateTime;

/// `SandboxQuery`: filters of `Sandbox.list`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SandboxQuery {
    /// `metadata`: every pair must match exactly.
    pub metadata: Option<BTreeMap<String, String>>,
    /// `state`: any of these (default running and paused).
    pub state: Option<Vec<SandboxState>>,
    /// `started_after` (inclusive).
    pub started_after: Option<DateTime>,
    /// `template`: template id or alias.
    pub template: Option<String>,
}

/// `SandboxPaginator`: pages of `SandboxInfo`, newest first by default.
#[derive(Debug, Clone)]
pub struct SandboxPaginator {
    /// `has_next`: starts `true`.
    pub has_next: bool,
    /// `next_token`.
    pub next_token: Option<String>,
    /// `limit`: page size (1..=100, default 100).
    pub limit: Option<i64>,
    /// `query`.
    pub query: Option<SandboxQuery>,
    /// `order`: `"asc"` or `"desc"` (default) by start time.
    pub order: Option<String>,
}

impl SandboxPaginator {
    /// `query=`: a [`SandboxQuery`] or `None`.
    pub fn query(mut self, query: impl Into<Option<SandboxQuery>>) -> Self {
        self.query = query.into();
        self
    }

    /// `limit=`.
    pub fn limit(mut self, limit: i64) -> Self {
        self.limit = Some(limit);
        self
    }

    /// `next_token=`: start from this page.
    pub fn next_token(mut self, token: impl crate::OptionalString) -> Self {
        self.next_token = token.into_optional();
        self
    }

    /// `order=`: `"asc"` or `"desc"`.
    pub fn order(mut self, order: impl crate::OptionalString) -> Self {
        self.order = order.into_optional();
        self
    }

    /// `paginator.next_items(**opts) -> list[SandboxInfo]`: the next page. Raises
    /// `SandboxException("No more items to fetch")` after the last page.
    pub async fn next_items(&mut self) -> Result<Vec<SandboxInfo>> {
        self.next_items_on(&client()?).await
    }

    /// [`next_items`](Self::next_items) on `client`.
    pub(crate) async fn next_items_on(
        &mut self,
        client: &sandcove::Client,
    ) -> Result<Vec<SandboxInfo>> {
        Ok(self
            .next_core_items_on(client)
            .await?
            .iter()
            .map(|i| SandboxInfo::from_core(i, false))
            .collect())
    }

    /// The next page as the core's infos (shared with the wire protocol, which answers with
    /// more fields than `SandboxInfo` holds).
    pub(crate) async fn next_core_items_on(
        &mut self,
        client: &sandcove::Client,
    ) -> Result<Vec<sandcove::SandboxInfo>> {
        if !self.has_next {
            return Err(SandboxException::sandbox("No more items to fetch"));
        }
        let limit = page_limit(self.limit)?;
        let descending = match self.order.as_deref() {
            None | Some("desc") => true,
            Some("asc") => false,
            Some(other) => {
                return Err(SandboxException::invalid_argument(format!(
                    "order must be 'asc' or 'desc', got '{other}'"
                )))
            }
        };
        let offset = page_offset(self.next_token.as_deref())?;
        let query = self.query.clone().unwrap_or_default();
        let mut options = ListOptions::default();
        options.labels = query.metadata.clone().unwrap_or_default();
        options.states = query
            .state
            .clone()
            .unwrap_or_else(|| vec![SandboxState::Running, SandboxState::Paused])
            .into_iter()
            .flat_map(|s| match s {
                // Paused covers both kinds of pause (a stopped sandbox kept only its files).
                SandboxState::Paused => {
                    vec![
                        sandcove::SandboxState::Paused,
                        sandcove::SandboxState::Stopped,
                    ]
                }
                other => vec![other.core()],
            })
            .collect();
        let mut all: Vec<sandcove::SandboxInfo> = client
            .list(options)
            .await?
            .into_iter()
            .filter(|i| {
                query
                    .started_after
                    .is_none_or(|t| i.created_at >= t.unix_millis)
            })
            .filter(|i| {
                query.template.as_deref().is_none_or(|t| {
                    let name = if i.template.is_empty() {
                        translate::DEFAULT_TEMPLATE
                    } else {
                        &i.template
                    };
                    name == t
                })
            })
            .collect();
        all.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        if descending {
            all.reverse();
        }
        let page: Vec<sandcove::SandboxInfo> =
            all.iter().skip(offset).take(limit).cloned().collect();
        self.next_token = next_page_token(offset, limit, all.len());
        self.has_next = self.next_token.is_some();
        Ok(page)
    }
}

pub(super) fn page_limit(limit: Option<i64>) -> Result<usize> {
    match limit {
        None => Ok(100),
        Some(n) if (1..=100).contains(&n) => Ok(n as usize),
        Some(n) => Err(SandboxException::invalid_argument(format!(
            "limit must be between 1 and 100, got {n}"
        ))),
    }
}

/// The offset a `next_token` stands for: the decimal position this facade hands out, at
/// most 18 digits (a forged longer or signed one is refused; the end of the next page is
/// computed without overflow).
pub(super) fn page_offset(token: Option<&str>) -> Result<usize> {
    let invalid = |t: &str| {
        let shown: String = t.chars().take(32).collect();
        SandboxException::invalid_argument(format!("invalid next_token '{shown}'"))
    };
    match token {
        None => Ok(0),
        Some(t) if t.is_empty() || t.len() > 18 || !t.bytes().all(|b| b.is_ascii_digit()) => {
            Err(invalid(t))
        }
        Some(t) => t.parse().map_err(|_| invalid(t)),
    }
}

/// The `next_token` after a page of `limit` from `offset` out of `total`, if any is left.
pub(super) fn next_page_token(offset: usize, limit: usize, total: usize) -> Option<String> {
    let end = offset.saturating_add(limit);
    (end < total).then(|| end.to_string())
}

// `AsyncSandbox.list()` hands back its paginator without a request; awaiting the builder
// (as every other call here is awaited) yields that paginator, still unfetched.
impl IntoFuture for SandboxPaginator {
    type Output = Result<SandboxPaginator>;
    type IntoFuture = std::future::Ready<Result<SandboxPaginator>>;
    fn into_future(self) -> Self::IntoFuture {
        std::future::ready(Ok(self))
    }
}
