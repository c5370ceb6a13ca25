//! The E2B features Sandcove refuses, each with what to do instead.
//!
//! Every refusal in this crate goes through [`refuse`] with a key from [`GAPS`], before any
//! effect. MAPPING.md's E2B section lists the same table; a test compares the two.
//! Features that depend on what the runtime can do (pause, previews, watch, pty, metrics,
//! snapshots, volumes) are not here: the runtime's own `NotSupported` carries them, and they
//! turn on when the runtime gains them.

use crate::errors::SandboxException;

/// One refused feature (the type all three facades share).
pub use sandcove_compat_support::Gap;

/// Every refused feature.
pub const GAPS: &[Gap] = &[
    Gap {
        key: "mcp",
        feature: "Sandbox.create(mcp=...) (MCP gateway)",
        alternative: "start the MCP server yourself with commands.run(..., background=True)",
    },
    Gap {
        key: "iam",
        feature: "Sandbox.create(iam=...)",
        alternative: "pass credentials to the sandbox through envs",
    },
    Gap {
        key: "network_rules",
        feature: "Sandbox.create(network={allow_out|deny_out|rules|egress_proxy|mask_request_host}) other than denying all egress",
        alternative: "allow_internet_access=False (loopback only) or True (isolated internet: no host, private or link-local address)",
    },
    Gap {
        key: "private_traffic",
        feature: "Sandbox.create(network={\"allow_public_traffic\": False}) from Rust",
        alternative: "create it through `sandcove serve --e2b`, whose port forwarding asks for the sandbox's traffic access token, or keep traffic public and expose ports with the runtime's private previews (sandcove::PreviewOptions)",
    },
    Gap {
        key: "update_network",
        feature: "Sandbox.update_network",
        alternative: "choose the network at create (allow_internet_access)",
    },
    Gap {
        key: "custom_template",
        feature: "Sandbox.create(template=<custom template>) on a runtime without images",
        alternative: "template=None/'base' (the host's system directories) or a snapshot id; the embedded engine and `sandcove serve` run a template that names a stored image (`sandcove image pull NAME`) or one mapped to an image (SANDCOVE_E2B_TEMPLATES=NAME=IMAGE,...)",
    },
    Gap {
        key: "file_user",
        feature: "files.upload_url/download_url(..., user=<another user>)",
        alternative: "run the operation as that user with commands.run(..., user=...)",
    },
    Gap {
        key: "volume_api",
        feature: "Volume / AsyncVolume (volume management API)",
        alternative: "sandcove::Client volumes through the core runtime",
    },
    Gap {
        key: "template_build",
        feature: "Template / AsyncTemplate (template build DSL)",
        alternative: "start from 'base' and set up with commands.run, then create_snapshot",
    },
    Gap {
        key: "secrets",
        feature: "Secret / AsyncSecret",
        alternative: "pass secrets through envs",
    },
    Gap {
        key: "git",
        feature: "sandbox.git",
        alternative: "run git through commands.run",
    },
    Gap {
        key: "mcp_url",
        feature: "Sandbox.get_mcp_url / get_mcp_token",
        alternative: "expose your own server with get_host(port)",
    },
    Gap {
        key: "code_language",
        feature: "run_code(language=...) / create_code_context(language=...) for a language whose interpreter the sandbox lacks",
        alternative: "language='python', or run the interpreter with commands.run",
    },
    Gap {
        key: "sandbox_logs",
        feature: "sandbox logs (GET /sandboxes/{id}/logs)",
        alternative: "read your program's output with commands.run(..., on_stdout=...) or write it to a file and read it with files.read",
    },
    Gap {
        key: "refreshes",
        feature: "POST /sandboxes/{id}/refreshes (keep-alive refresh)",
        alternative: "extend the sandbox with set_timeout(seconds)",
    },
    Gap {
        key: "list_metrics",
        feature: "metrics of several sandboxes at once (GET /sandboxes/metrics)",
        alternative: "get_metrics() of each sandbox",
    },
];

/// The gap with this key. Panics on an unknown key: that is a bug in this crate, caught by
/// the tests.
pub fn gap(key: &str) -> &'static Gap {
    sandcove_compat_support::gap::find(GAPS, key)
        .unwrap_or_else(|| panic!("unknown gap key {key:?}"))
}

/// The `NotSupported` error for the gap with this key.
pub fn refuse(key: &str) -> SandboxException {
    let g = gap(key);
    SandboxException::NotSupported {
        feature: g.feature.to_string(),
        alternative: g.alternative.to_string(),
        source: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_unique_and_refusals_carry_the_alternative() {
        let mut keys: Vec<_> = GAPS.iter().map(|g| g.key).collect();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), GAPS.len());
        let e = refuse("mcp");
        assert!(e.is_not_supported());
        assert!(e.to_string().contains("start the MCP server yourself"));
    }
}
