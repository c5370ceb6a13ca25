//! Every Blaxel feature this runtime cannot honour, with what to do instead. Each is refused
//! with [`SandboxAPIError::NotSupported`] before any effect. The table is checked against
//! MAPPING.md's Blaxel section by a test.

use serde_json::Value;

use crate::errors::{Result, SandboxAPIError};
use crate::sandbox::Ctx;

/// One refused feature (the type all three facades share).
pub use sandcove_compat_support::Gap;

/// Every refused Blaxel feature (its key is the feature's name in MAPPING.md).
pub const GAPS: &[Gap] = &[
    Gap {
        key: "sessions",
        feature: "sessions",
        alternative: "to let a client reach a server in the sandbox, make a private preview of its \
         port and hand out a token (previews.create, preview.tokens.create); the sandbox API \
         itself is not handed out per sandbox",
    },
    Gap {
        key: "drives",
        feature: "drives",
        alternative: "mount a named volume at creation (`volumes`) where the runtime supports volumes",
    },
    Gap {
        key: "codegen",
        feature: "codegen",
        alternative: "run your own edit or ranking tool inside the sandbox with process.exec",
    },
    Gap {
        key: "system.upgrade",
        feature: "system.upgrade",
        alternative: "nothing to upgrade: the sandbox API is part of the runtime",
    },
    Gap {
        key: "schedules",
        feature: "schedules",
        alternative: "schedule on the host (cron, a timer) and call process.exec",
    },
    Gap {
        key: "network",
        feature: "network",
        alternative: "omit `network`: sandboxes get isolated internet access (no host, private or link-local address) where the runtime has it, else loopback only",
    },
    Gap {
        key: "update_network",
        feature: "update_network",
        alternative: "the network is fixed at creation (isolated internet where the runtime has it, else loopback only)",
    },
    Gap {
        key: "extra_args",
        feature: "extra_args",
        alternative: "omit `extra_args`: the runtime has one kernel configuration",
    },
    Gap {
        key: "image other than blaxel/base-image",
        feature: "image other than blaxel/base-image",
        alternative: "on a runtime without images: omit `image` or name `blaxel/base-image` (the host base: the host's read-only system directories with sh, python3 and coreutils, a writable /blaxel); the embedded engine and `sandcove serve` run any image they have stored (`sandcove image pull NAME`)",
    },
    Gap {
        key: "ephemeral volumes",
        feature: "ephemeral volumes",
        alternative: "write scratch data under /tmp or the home directory",
    },
    Gap {
        key: "fork target_type=\"application\"",
        feature: "fork target_type=\"application\"",
        alternative: "fork into a sandbox (the default target_type)",
    },
    Gap {
        key: "fork port/traffic",
        feature: "fork port/traffic",
        alternative: "fork into a sandbox and expose ports with previews.create",
    },
    Gap {
        key: "fork custom_domain/prefix",
        feature: "fork custom_domain/prefix",
        alternative: "use the preview URL the runtime assigns",
    },
    Gap {
        key: "preview prefix_url/custom_domain",
        feature: "preview prefix_url/custom_domain",
        alternative: "use the URL in preview.spec.url",
    },
    Gap {
        key: "previews of the same port with other headers",
        feature: "two named previews of one port with different request_headers/response_headers",
        alternative: "give both previews the same headers (the runtime has one preview per port), or serve the other headers from another port",
    },
    Gap {
        key: "preview expires/ttl",
        feature: "preview expires/ttl",
        alternative: "delete the preview when done; give tokens an expiry with tokens.create(expires_at)",
    },
    Gap {
        key: "public and private previews of the same port",
        feature: "public and private previews of the same port",
        alternative: "give every preview of one port the same visibility, or serve the other one on \
         another port",
    },
    Gap {
        key: "code interpreter languages other than python",
        feature: "code interpreter languages other than python",
        alternative: "run other languages with process.exec",
    },
    Gap {
        key: "spec changes",
        feature: "spec changes",
        alternative: "image, memory, ports, envs, volumes and region are fixed at creation: create a new sandbox with the new spec; labels, display name, ttl, expires and lifecycle can be updated",
    },
    Gap {
        key: "fuzzy file search",
        feature: "fuzzy file search",
        alternative: "use fs.find with glob patterns, or fs.grep for contents",
    },
    Gap {
        key: "agents, models and MCP servers hosting",
        feature: "agents, models and MCP servers hosting",
        alternative: "run your agent, model client or MCP server as a process in the sandbox",
    },
];

/// The refusal of `feature` (one of [`GAPS`]).
pub fn refuse(feature: &str) -> SandboxAPIError {
    let alternative = GAPS
        .iter()
        .find(|g| g.key == feature)
        .map(|g| g.alternative)
        .unwrap_or("see MAPPING.md");
    debug_assert!(
        GAPS.iter().any(|g| g.key == feature),
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
    fn gaps_have_alternatives_and_mapping_md_lists_each_once() {
        assert!(GAPS.iter().all(|g| !g.alternative.is_empty()));
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../MAPPING.md");
        let text = std::fs::read_to_string(path).expect("MAPPING.md");
        if let Err(differences) = sandcove_compat_support::gap::check_mapping(&text, "Blaxel", GAPS)
        {
            panic!("{differences}");
        }
    }
}
