//! What a sandbox reports: `SandboxState` and `SandboxInfo` (with its lifecycle), as `get_info`
//! and `list` answer them.

use std::collections::BTreeMap;
use std::fmt;

use sandcove::NetworkPolicy;

use super::SANDBOX_DOMAIN;
use crate::translate;
use crate::translate::{py_dict, py_opt_str, py_str, DateTime};

/// `SandboxState`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub enum SandboxState {
    /// `RUNNING = "running"`.
    Running,
    /// `PAUSED = "paused"`.
    Paused,
}

impl SandboxState {
    /// The string value (`"running"`, `"paused"`).
    pub fn value(&self) -> &'static str {
        match self {
            SandboxState::Running => "running",
            SandboxState::Paused => "paused",
        }
    }

    pub(super) fn core(self) -> sandcove::SandboxState {
        match self {
            SandboxState::Running => sandcove::SandboxState::Running,
            SandboxState::Paused => sandcove::SandboxState::Paused,
        }
    }
}

impl fmt::Debug for SandboxState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "<SandboxState.{}: '{}'>",
            self.value().to_uppercase(),
            self.value()
        )
    }
}

/// `SandboxInfoLifecycle`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxInfoLifecycle {
    /// `on_timeout`: `"kill"` or `"pause"`.
    pub on_timeout: String,
    /// `auto_resume`.
    pub auto_resume: bool,
}

/// `SandboxInfo`: what `get_info` and `list` report.
#[derive(Clone, PartialEq)]
pub struct SandboxInfo {
    /// `sandbox_id`.
    pub sandbox_id: String,
    /// `sandbox_domain` (only from `get_info`).
    pub sandbox_domain: Option<String>,
    /// `template_id`.
    pub template_id: String,
    /// `name`: the template alias.
    pub name: Option<String>,
    /// `metadata`.
    pub metadata: BTreeMap<String, String>,
    /// `started_at`.
    pub started_at: DateTime,
    /// `end_at`: when the sandbox's lifetime ends.
    pub end_at: DateTime,
    /// `state`.
    pub state: SandboxState,
    /// `cpu_count`.
    pub cpu_count: i64,
    /// `memory_mb`.
    pub memory_mb: i64,
    /// `envd_version`: reported as `99.99.99` so no feature gate trips.
    pub envd_version: String,
    /// `allow_internet_access` (only from `get_info`).
    pub allow_internet_access: Option<bool>,
    /// `lifecycle` (only from `get_info`, as on E2B).
    pub lifecycle: Option<SandboxInfoLifecycle>,
    /// `volume_mounts`: `{"name", "path"}` pairs.
    pub volume_mounts: Vec<BTreeMap<String, String>>,
}

impl SandboxInfo {
    pub(crate) fn from_core(info: &sandcove::SandboxInfo, detail: bool) -> SandboxInfo {
        let template = if info.template.is_empty() {
            translate::DEFAULT_TEMPLATE.to_string()
        } else {
            info.template.clone()
        };
        SandboxInfo {
            sandbox_id: info.id.clone(),
            sandbox_domain: detail.then(|| SANDBOX_DOMAIN.to_string()),
            template_id: template.clone(),
            name: Some(template),
            metadata: info.labels.clone(),
            started_at: DateTime::from_unix_millis(info.created_at),
            end_at: DateTime::from_unix_millis(info.ends_at),
            // A stopped sandbox is one paused with keep_memory=False.
            state: if matches!(
                info.state,
                sandcove::SandboxState::Paused | sandcove::SandboxState::Stopped
            ) {
                SandboxState::Paused
            } else {
                SandboxState::Running
            },
            cpu_count: info
                .resources
                .cpu
                .map(|c| c.ceil() as i64)
                .unwrap_or_else(|| {
                    std::thread::available_parallelism()
                        .map(|n| n.get() as i64)
                        .unwrap_or(1)
                }),
            memory_mb: info
                .resources
                .memory_mib
                .map(|m| m as i64)
                .unwrap_or_else(host_memory_mb),
            envd_version: translate::ENVD_VERSION.into(),
            allow_internet_access: detail.then_some(info.network != NetworkPolicy::None),
            lifecycle: detail.then(|| SandboxInfoLifecycle {
                on_timeout: match info.on_timeout {
                    sandcove::TimeoutAction::Pause | sandcove::TimeoutAction::Stop => {
                        "pause".into()
                    }
                    _ => "kill".into(),
                },
                auto_resume: info.auto_resume,
            }),
            volume_mounts: info
                .volumes
                .iter()
                .map(|v| {
                    BTreeMap::from([
                        ("name".to_string(), v.volume.clone()),
                        ("path".to_string(), v.path.clone()),
                    ])
                })
                .collect(),
        }
    }
}

/// The host's memory in MiB, read from `/proc/meminfo` once (it does not change while the
/// program runs, and an info call on the async runtime then reads no file).
fn host_memory_mb() -> i64 {
    static HOST_MEMORY_MB: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    *HOST_MEMORY_MB.get_or_init(read_host_memory_mb)
}

fn read_host_memory_mb() -> i64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<i64>().ok())
        })
        .map(|kb| kb / 1024)
        .unwrap_or(0)
}

impl fmt::Debug for SandboxInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SandboxInfo(sandbox_id={}, sandbox_domain={}, template_id={}, name={}, metadata={}, started_at={:?}, end_at={:?}, state={:?}, cpu_count={}, memory_mb={}, envd_version={}, allow_internet_access={}, lifecycle={:?}, volume_mounts={:?})",
            py_str(&self.sandbox_id),
            py_opt_str(self.sandbox_domain.as_deref()),
            py_str(&self.template_id),
            py_opt_str(self.name.as_deref()),
            py_dict(&self.metadata),
            self.started_at,
            self.end_at,
            self.state,
            self.cpu_count,
            self.memory_mb,
            py_str(&self.envd_version),
            match self.allow_internet_access {
                Some(true) => "True",
                Some(false) => "False",
                None => "None",
            },
            self.lifecycle,
            self.volume_mounts,
        )
    }
}
