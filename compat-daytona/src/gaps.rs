//! Every Daytona feature this runtime cannot honour, with what to do instead.
//!
//! The facade raises [`DaytonaError::NotSupported`] from this table before any effect; the
//! table is checked against the Daytona section of `MAPPING.md` by a test.

use crate::errors::DaytonaError;

/// One gap: the feature (its key is the feature's name in `MAPPING.md`) and what to do
/// instead; the type all three facades share.
pub use sandcove_compat_support::Gap;

/// All gaps of the Daytona facade.
pub const GAPS: &[Gap] = &[
    Gap {
        key: "CreateSandboxFromImageParams on a runtime without images, or with a declarative Image",
        feature: "CreateSandboxFromImageParams on a runtime without images, or with a declarative Image",
        alternative: "name a stored image (`sandcove image pull NAME`) on the embedded engine or `sandcove serve`; elsewhere create from the default snapshot (CreateSandboxFromSnapshotParams): it has the host's toolchain read-only; install packages into the home directory, then sandbox.create_snapshot(name) to reuse the result",
    },
    Gap {
        key: "snapshot.create from an image",
        feature: "snapshot.create from an image",
        alternative: "prepare a sandbox with process.exec, then sandbox.create_snapshot(name); create later sandboxes with CreateSandboxFromSnapshotParams(snapshot=name)",
    },
    Gap {
        key: "network_allow_list / domain_allow_list",
        feature: "network_allow_list / domain_allow_list",
        alternative: "network_block_all=True for loopback only, or leave it unset for isolated internet access (no host, private or link-local address)",
    },
    Gap {
        key: "update_network_settings",
        feature: "update_network_settings",
        alternative: "choose network_block_all when the sandbox is created",
    },
    Gap {
        key: "resize",
        feature: "resize",
        alternative: "create a new sandbox (resources are fixed at creation)",
    },
    Gap {
        key: "recover",
        feature: "recover",
        alternative: "sandboxes here never enter a recoverable error state; delete the sandbox and create a new one",
    },
    Gap {
        key: "create_lsp_server",
        feature: "create_lsp_server",
        alternative: "run a language server yourself in a session (process.execute_session_command with run_async=True)",
    },
    Gap {
        key: "computer_use",
        feature: "computer_use",
        alternative: "no desktop is available; drive headless tools with process.exec",
    },
    Gap {
        key: "code_interpreter",
        feature: "code_interpreter",
        alternative: "process.code_run for one-shot code, or a session running python for state between calls",
    },
    Gap {
        key: "ssh access",
        feature: "ssh access",
        alternative: "use process.exec or sessions; there is no SSH gateway",
    },
    Gap {
        key: "pty sessions",
        feature: "pty sessions",
        alternative: "sessions: process.execute_session_command with run_async=True and send_session_command_input",
    },
    Gap {
        key: "entrypoint session",
        feature: "entrypoint session",
        alternative: "sandboxes have no image entrypoint; start long-running programs in a session",
    },
    Gap {
        key: "expire_signed_preview_url",
        feature: "expire_signed_preview_url",
        alternative: "give create_signed_preview_url a short expires_in_seconds; tokens then expire by themselves",
    },
    Gap {
        key: "rotate_signing_key",
        feature: "rotate_signing_key",
        alternative: "give download_url/upload_url a short ttl_seconds; URLs then expire by themselves, and all end with the sandbox",
    },
    Gap {
        key: "object storage",
        feature: "object storage",
        alternative: "upload files with fs.upload_file(s) after the sandbox is created",
    },
    Gap {
        key: "secrets and warm pools",
        feature: "secrets and warm pools",
        alternative: "pass values with env_vars at creation or env on exec",
    },
    Gap {
        key: "git binary",
        feature: "git binary",
        alternative: "the sandbox has no git on its PATH: install git on the host (its /usr is visible read-only), or upload the files with fs.upload_files",
    },
    Gap {
        key: "GPU resources",
        feature: "GPU resources",
        alternative: "none: the runtime has no GPUs",
    },
    Gap {
        key: "linked_sandbox",
        feature: "linked_sandbox",
        alternative: "create the sandboxes independently; all sandboxes of this runtime share the host",
    },
];

/// The `NotSupported` error for `feature` (which must be in [`GAPS`]).
pub(crate) fn gap(feature: &str) -> DaytonaError {
    let found = GAPS.iter().find(|g| g.feature == feature);
    debug_assert!(found.is_some(), "gap {feature:?} is not in the table");
    DaytonaError::not_supported(
        feature,
        found.map(|g| g.alternative).unwrap_or("see MAPPING.md"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn features_are_unique_and_alternatives_present() {
        let mut seen = std::collections::BTreeSet::new();
        for g in GAPS {
            assert!(seen.insert(g.feature), "duplicate {}", g.feature);
            assert!(!g.alternative.is_empty());
            let e = gap(g.feature);
            assert!(e.is_not_supported());
            assert!(e.to_string().contains(g.alternative));
        }
    }
}
