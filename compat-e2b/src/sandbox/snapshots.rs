//! Snapshots and forks: `SnapshotInfo`, the snapshot paginator, the builders of
//! `create_snapshot(...)` and `fork(...)`, and the calls they share with the wire protocol.

use std::future::IntoFuture;

use sandcove::CreateOptions;

use super::{
    next_page_token, page_limit, page_offset, whole_seconds, ConnectionConfig, Ctx, Inner, Sandbox,
    SANDBOX_DOMAIN,
};
use crate::call::{client, BoxFuture, IntoSeconds};
use crate::errors::{Result, SandboxException};

/// `SnapshotInfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// `snapshot_id`: usable as `template` in `Sandbox.create`.
    pub snapshot_id: String,
    /// `names`.
    pub names: Vec<String>,
}

impl SnapshotInfo {
    fn from_core(s: &sandcove::SnapshotInfo) -> Self {
        SnapshotInfo {
            snapshot_id: s.id.clone(),
            names: s.name.iter().cloned().collect(),
        }
    }
}

/// `SnapshotPaginator`.
#[derive(Debug, Clone)]
pub struct SnapshotPaginator {
    /// `has_next`.
    pub has_next: bool,
    /// `next_token`.
    pub next_token: Option<String>,
    /// `limit`.
    pub limit: Option<i64>,
    /// `sandbox_id` filter.
    pub sandbox_id: Option<String>,
    /// `name` filter.
    pub name: Option<String>,
}

impl SnapshotPaginator {
    /// `sandbox_id=`.
    pub fn sandbox_id(mut self, id: impl crate::OptionalString) -> Self {
        self.sandbox_id = id.into_optional();
        self
    }

    /// `name=`.
    pub fn name(mut self, name: impl crate::OptionalString) -> Self {
        self.name = name.into_optional();
        self
    }

    /// `limit=`.
    pub fn limit(mut self, limit: i64) -> Self {
        self.limit = Some(limit);
        self
    }

    /// `next_token=`.
    pub fn next_token(mut self, token: impl crate::OptionalString) -> Self {
        self.next_token = token.into_optional();
        self
    }

    /// `next_items() -> list[SnapshotInfo]`.
    pub async fn next_items(&mut self) -> Result<Vec<SnapshotInfo>> {
        self.next_items_on(&client()?).await
    }

    /// One page from `client`'s runtime (the wire listener's client, or the facade's).
    pub(crate) async fn next_items_on(
        &mut self,
        client: &sandcove::Client,
    ) -> Result<Vec<SnapshotInfo>> {
        if !self.has_next {
            return Err(SandboxException::sandbox("No more items to fetch"));
        }
        let limit = page_limit(self.limit)?;
        let offset = page_offset(self.next_token.as_deref())?;
        let mut all: Vec<sandcove::SnapshotInfo> = client
            .snapshots()
            .await?
            .into_iter()
            .filter(|s| {
                self.sandbox_id
                    .as_deref()
                    .is_none_or(|id| s.sandbox_id == id)
            })
            // E2B filters by name or id.
            .filter(|s| {
                self.name
                    .as_deref()
                    .is_none_or(|n| s.name.as_deref() == Some(n) || s.id == n)
            })
            .collect();
        all.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(a.id.cmp(&b.id)));
        let page = all
            .iter()
            .skip(offset)
            .take(limit)
            .map(SnapshotInfo::from_core)
            .collect();
        self.next_token = next_page_token(offset, limit, all.len());
        self.has_next = self.next_token.is_some();
        Ok(page)
    }
}

// Awaiting `Sandbox::list_snapshots()` yields the unfetched paginator, as for `list()`.
impl IntoFuture for SnapshotPaginator {
    type Output = Result<SnapshotPaginator>;
    type IntoFuture = std::future::Ready<Result<SnapshotPaginator>>;
    fn into_future(self) -> Self::IntoFuture {
        std::future::ready(Ok(self))
    }
}

/// The builder of `create_snapshot(...)`.
#[derive(Debug)]
#[must_use = "a call does nothing until awaited"]
pub struct SnapshotBuilder {
    pub(super) ctx: Ctx,
    pub(super) name: Option<String>,
    pub(super) mode: Option<String>,
}

impl SnapshotBuilder {
    /// `name=`.
    pub fn name(mut self, name: impl crate::OptionalString) -> Self {
        self.name = name.into_optional();
        self
    }

    /// `mode=`: `"filesystem"` (what the runtime's snapshots keep) or `"full"` (memory and
    /// processes too: refused with `NotSupported` before any effect where snapshots keep
    /// files only). Unset, the snapshot keeps the files (MAPPING.md).
    pub fn mode(mut self, mode: impl crate::OptionalString) -> Self {
        self.mode = mode.into_optional();
        self
    }
}

impl IntoFuture for SnapshotBuilder {
    type Output = Result<SnapshotInfo>;
    type IntoFuture = BoxFuture<'static, SnapshotInfo>;
    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let memory = match self.mode.as_deref() {
                None => None,
                Some("full") => Some(true),
                Some("filesystem") => Some(false),
                Some(other) => {
                    return Err(SandboxException::invalid_argument(format!(
                        "mode must be 'full' or 'filesystem', got '{other}'"
                    )))
                }
            };
            create_snapshot_of(&self.ctx.core, self.name, memory).await
        })
    }
}

/// The builder of `fork(...)`.
#[derive(Debug)]
#[must_use = "a call does nothing until awaited"]
pub struct ForkBuilder {
    pub(super) sandbox_id: String,
    pub(super) timeout: Option<f64>,
    pub(super) count: Option<i64>,
}

impl ForkBuilder {
    /// `timeout=`: lifetime of each fork, seconds (default 300).
    pub fn timeout(mut self, timeout: impl IntoSeconds) -> Self {
        self.timeout = timeout.into_seconds();
        self
    }

    /// `count=`: how many forks (1..=100, default 1).
    pub fn count(mut self, count: i64) -> Self {
        self.count = Some(count);
        self
    }
}

impl IntoFuture for ForkBuilder {
    type Output = Result<Vec<Result<Sandbox>>>;
    type IntoFuture = BoxFuture<'static, Vec<Result<Sandbox>>>;
    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let client = client()?;
            let forks = fork_on(&client, &self.sandbox_id, self.timeout, self.count).await?;
            Ok(forks
                .into_iter()
                .map(|made| {
                    made.map(|info| {
                        let config = ConnectionConfig {
                            domain: SANDBOX_DOMAIN.into(),
                            ..Default::default()
                        };
                        Sandbox::from_ctx(Inner::from_info(&client, &info), config)
                    })
                })
                .collect())
        })
    }
}

/// `fork(timeout, count)` on `client`'s runtime: each fork is a sandbox from a snapshot of
/// the source's files, with the source's envs, labels, network and user, or the exception
/// that fork met (one failed fork does not undo the others, as in E2B's answer).
pub(crate) async fn fork_on(
    client: &sandcove::Client,
    sandbox_id: &str,
    timeout: Option<f64>,
    count: Option<i64>,
) -> Result<Vec<Result<sandcove::SandboxInfo>>> {
    let count = count.unwrap_or(1);
    if !(1..=100).contains(&count) {
        return Err(SandboxException::invalid_argument(format!(
            "count must be between 1 and 100, got {count}"
        )));
    }
    let timeout = whole_seconds(timeout)?;
    let parent = client.sandbox(sandbox_id);
    let source = parent.info().await?;
    if !client.ready().await?.snapshots {
        return Err(sandcove::Error::not_supported(
            "Sandbox.fork",
            "this runtime has no snapshots yet; create a new sandbox and copy files",
        )
        .into());
    }
    let mut options = CreateOptions::default();
    options.timeout = Some(timeout);
    options.envs = source.envs.clone();
    options.labels = source.labels.clone();
    options.network = source.network.clone();
    options.user = Some(source.user.name.clone());
    options.home = Some(source.user.home.clone());
    let mut out = Vec::new();
    for _ in 0..count {
        let made = parent
            .fork_described(options.clone())
            .await
            .map(|(_, info)| info)
            .map_err(SandboxException::from);
        match made {
            // The fork exists; its entry says so, and the source is left paused: stop here.
            Ok(info) if info.source_resume_error.is_some() => {
                let why = info.source_resume_error.clone().unwrap_or_default();
                out.push(Err(source_not_resumed(
                    &format!("fork {}", info.id),
                    sandbox_id,
                    &why,
                )));
                break;
            }
            made => out.push(made),
        }
    }
    Ok(out)
}

/// `create_snapshot(name)` of `sandbox` (the facade's instance or the wire's).
/// `memory`: `Some(true)` when the caller asked for a full snapshot (memory and processes),
/// which the runtime refuses before any effect where snapshots keep files only. A snapshot
/// whose source could not be resumed after it is an error naming the snapshot (it is kept).
pub(crate) async fn create_snapshot_of(
    sandbox: &sandcove::Sandbox,
    name: Option<String>,
    memory: Option<bool>,
) -> Result<SnapshotInfo> {
    let mut options = sandcove::SnapshotOptions::default();
    options.name = name;
    options.memory = memory == Some(true);
    let s = sandbox.snapshot_with(options).await?;
    if let Some(why) = &s.source_resume_error {
        return Err(source_not_resumed(
            &format!("snapshot {}", s.id),
            sandbox.id(),
            why,
        ));
    }
    Ok(SnapshotInfo::from_core(&s))
}

/// A snapshot or fork was made (and is kept), but its source, paused for it, could not be
/// resumed: raised rather than dropped, naming what was made and what to do with the source.
pub(crate) fn source_not_resumed(made: &str, source: &str, why: &str) -> SandboxException {
    SandboxException::sandbox(format!(
        "{made} was made and is kept, but sandbox {source}, paused for it, could not be \
         resumed ({why}): connect to it to resume it, or kill it"
    ))
}

/// `delete_snapshot(snapshot_id)` on `client`'s runtime: `false` when there is none.
pub(crate) async fn delete_snapshot_on(
    client: &sandcove::Client,
    snapshot_id: &str,
) -> Result<bool> {
    match client.delete_snapshot(snapshot_id).await {
        Ok(()) => Ok(true),
        Err(e) if e.is_not_found() => Ok(false),
        Err(e) => Err(e.into()),
    }
}
