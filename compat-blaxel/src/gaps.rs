//! Every Blaxel feature this runtime cannot honour, with what to do instead. Each is refused
//! with [`SandboxAPIError::NotSupported`] before any effect. The table is checked against
//! MAPPING.md's Blaxel section by a test.

use serde_json::Value;

use crate::errors::{Result, SandboxAPIError};
use crate::sandbox::Ctx;

/// `(feature, alternative)` for every refused Blaxel feature.
pub const GAPS: &[(&str, &str)] = &[
    (
        "sessions",
        "call the sandbox through this facade from any program of the same user; there is no \
         per-sandbox HTTP API to hand out",
    ),
    (
        "drives",
        "mount a named volume at creation (`volumes`) where the runtime supports volumes",
    ),
    (
        "codegen",
        "run your own edit or ranking tool inside the sandbox with process.exec",
    ),
    (
        "system.upgrade",
        "nothing to upgrade: the sandbox API is part of the runtime",
    ),
    (
        "schedules",
        "schedule on the host (cron, a timer) and call process.exec",
    ),
    (
        "fetch",
        "expose the port with previews.create and request the preview URL",
    ),
    (
        "network",
        "omit `network`: sandboxes get isolated internet access (no host, private or link-local address) where the runtime has it, else loopback only",
    ),
    (
        "update_network",
        "the network is fixed at creation (isolated internet where the runtime has it, else loopback only)",
    ),
    (
        "extra_args",
        "omit `extra_args`: the runtime has one kernel configuration",
    ),
    (
        "ephemeral volumes",
        "write scratch data under /tmp or the home directory",
    ),
    (
        "fork target_type=\"application\"",
        "fork into a sandbox (the default target_type)",
    ),
    (
        "fork port/traffic",
        "fork into a sandbox and expose ports with previews.create",
    ),
    (
        "fork custom_domain/prefix",
        "use the preview URL the runtime assigns",
    ),
    (
        "preview prefix_url/custom_domain",
        "use the URL in preview.spec.url",
    ),
    (
        "preview request_headers/response_headers",
        "set headers in the server running in the sandbox",
    ),
    (
        "preview expires/ttl",
        "delete the preview when done; give tokens an expiry with tokens.create(expires_at)",
    ),
    (
        "public and private previews of the same port",
        "give every preview of one port the same visibility, or serve the other one on \
         another port",
    ),
    (
        "preview tokens list/delete",
        "create tokens with a short expiry, or delete the preview to revoke them",
    ),
    (
        "code interpreter languages other than python",
        "run other languages with process.exec",
    ),
    (
        "agents, models and MCP servers hosting",
        "run your agent, model client or MCP server as a process in the sandbox",
    ),
];

/// The refusal of `feature` (one of [`GAPS`]).
pub fn refuse(feature: &str) -> SandboxAPIError {
    let alternative = GAPS
        .iter()
        .find(|(f, _)| *f == feature)
        .map(|(_, a)| *a)
        .unwrap_or("see MAPPING.md");
    debug_assert!(
        GAPS.iter().any(|(f, _)| *f == feature),
        "gap {feature:?} is missing from the GAPS table"
    );
    SandboxAPIError::NotSupported {
        feature: feature.to_string(),
        alternative: alternative.to_string(),
    }
}

/// `sandbox.sessions` (not supported).
#[derive(Debug, Clone, Default)]
pub struct SandboxSessions {}

impl SandboxSessions {
    /// `sessions.create(options=None)`: not supported.
    pub async fn create(&self, options: Value) -> Result<Value> {
        let _ = options;
        Err(refuse("sessions"))
    }
    /// `sessions.create_if_expired(options=None, delta_seconds=3600)`: not supported.
    pub async fn create_if_expired(&self, options: Value) -> Result<Value> {
        let _ = options;
        Err(refuse("sessions"))
    }
    /// `sessions.list()`: not supported.
    pub async fn list(&self) -> Result<Vec<Value>> {
        Err(refuse("sessions"))
    }
    /// `sessions.get(name)`: not supported.
    pub async fn get(&self, name: &str) -> Result<Value> {
        let _ = name;
        Err(refuse("sessions"))
    }
    /// `sessions.delete(name)`: not supported.
    pub async fn delete(&self, name: &str) -> Result<Value> {
        let _ = name;
        Err(refuse("sessions"))
    }
    /// `sessions.get_token(preview_name)`: not supported.
    pub async fn get_token(&self, preview_name: &str) -> Result<Value> {
        let _ = preview_name;
        Err(refuse("sessions"))
    }
}

/// `sandbox.drives` (not supported).
#[derive(Debug, Clone, Default)]
pub struct SandboxDrive {}

impl SandboxDrive {
    /// `drives.mount(drive_name, mount_path, drive_path="/", read_only=False)`: not supported.
    pub async fn mount(&self, drive_name: &str, mount_path: &str) -> Result<Value> {
        let _ = (drive_name, mount_path);
        Err(refuse("drives"))
    }
    /// `drives.unmount(mount_path)`: not supported.
    pub async fn unmount(&self, mount_path: &str) -> Result<Value> {
        let _ = mount_path;
        Err(refuse("drives"))
    }
    /// `drives.list()`: not supported.
    pub async fn list(&self) -> Result<Vec<Value>> {
        Err(refuse("drives"))
    }
}

/// `sandbox.codegen` (not supported).
#[derive(Debug, Clone, Default)]
pub struct SandboxCodegen {}

impl SandboxCodegen {
    /// `codegen.fastapply(path, code_edit, model=None)`: not supported.
    pub async fn fastapply(&self, path: &str, code_edit: &str) -> Result<Value> {
        let _ = (path, code_edit);
        Err(refuse("codegen"))
    }
    /// `codegen.reranking(path, query, …)`: not supported.
    pub async fn reranking(&self, path: &str, query: &str) -> Result<Value> {
        let _ = (path, query);
        Err(refuse("codegen"))
    }
}

/// `sandbox.schedules` (not supported).
#[derive(Debug, Clone, Default)]
pub struct SandboxSchedules {}

impl SandboxSchedules {
    /// `schedules.list()`: not supported.
    pub async fn list(&self) -> Result<Vec<Value>> {
        Err(refuse("schedules"))
    }
    /// `schedules.create(schedule)`: not supported.
    pub async fn create(&self, schedule: Value) -> Result<Value> {
        let _ = schedule;
        Err(refuse("schedules"))
    }
    /// `schedules.get(schedule_id)`: not supported.
    pub async fn get(&self, schedule_id: &str) -> Result<Value> {
        let _ = schedule_id;
        Err(refuse("schedules"))
    }
    /// `schedules.update(schedule_id, schedule)`: not supported.
    pub async fn update(&self, schedule_id: &str, schedule: Value) -> Result<Value> {
        let _ = (schedule_id, schedule);
        Err(refuse("schedules"))
    }
    /// `schedules.delete(schedule_id)`: not supported.
    pub async fn delete(&self, schedule_id: &str) -> Result<Value> {
        let _ = schedule_id;
        Err(refuse("schedules"))
    }
    /// `schedules.executions()`: not supported.
    pub async fn executions(&self) -> Result<Vec<Value>> {
        Err(refuse("schedules"))
    }
}

/// `sandbox.network` (not supported).
#[derive(Debug, Clone, Default)]
pub struct SandboxNetwork {}

impl SandboxNetwork {
    /// `network.fetch(port, path="/", …)`: not supported.
    pub async fn fetch(&self, port: i64, path: &str) -> Result<Value> {
        let _ = (port, path);
        Err(refuse("fetch"))
    }
}

/// `HealthResponse` of `system.health()`.
#[derive(Debug, Clone, PartialEq)]
pub struct HealthResponse {
    /// `ok`.
    pub status: String,
    /// The facade's version.
    pub version: String,
}

/// `sandbox.system`.
#[derive(Debug, Clone)]
pub struct SandboxSystem {
    ctx: Ctx,
}

impl SandboxSystem {
    pub(crate) fn new(ctx: Ctx) -> Self {
        SandboxSystem { ctx }
    }

    /// `system.health()`: `ok` while the sandbox answers.
    pub async fn health(&self) -> Result<HealthResponse> {
        self.ctx.core.info().await?;
        Ok(HealthResponse {
            status: "ok".into(),
            version: env!("CARGO_PKG_VERSION").into(),
        })
    }

    /// `system.upgrade(version=None, base_url=None)`: not supported.
    pub async fn upgrade(&self) -> Result<Value> {
        Err(refuse("system.upgrade"))
    }
}

/// Blaxel's hosting helpers (`bl_agent`, `bl_model`, `bl_tools`): not supported.
pub mod hosting {
    use super::*;

    /// `bl_agent(name)`: not supported.
    pub async fn bl_agent(name: &str) -> Result<Value> {
        let _ = name;
        Err(refuse("agents, models and MCP servers hosting"))
    }

    /// `bl_model(name)`: not supported.
    pub async fn bl_model(name: &str) -> Result<Value> {
        let _ = name;
        Err(refuse("agents, models and MCP servers hosting"))
    }

    /// `bl_tools(names)`: not supported.
    pub async fn bl_tools(names: &[&str]) -> Result<Value> {
        let _ = names;
        Err(refuse("agents, models and MCP servers hosting"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_are_unique_and_have_alternatives() {
        for (i, (f, a)) in GAPS.iter().enumerate() {
            assert!(!a.is_empty(), "{f}");
            assert!(GAPS[i + 1..].iter().all(|(g, _)| g != f), "{f} twice");
        }
    }

    #[test]
    fn mapping_md_lists_every_gap_and_no_other() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../MAPPING.md");
        let text = std::fs::read_to_string(path).expect("MAPPING.md");
        let section = text
            .split("\n## ")
            .find(|s| s.starts_with("Blaxel"))
            .expect("a Blaxel section");
        let gaps_part = section
            .split("### Gaps")
            .nth(1)
            .expect("a Gaps subsection")
            .split("\n### ")
            .next()
            .unwrap_or_default();
        let listed: Vec<String> = gaps_part
            .lines()
            .filter_map(|l| l.strip_prefix("| `"))
            .filter_map(|l| l.split("` |").next())
            .map(str::to_string)
            .collect();
        for (f, _) in GAPS {
            assert!(listed.iter().any(|l| l == f), "MAPPING.md lacks gap {f:?}");
        }
        for l in &listed {
            assert!(
                GAPS.iter().any(|(f, _)| f == l),
                "MAPPING.md lists unknown gap {l:?}"
            );
        }
    }
}
