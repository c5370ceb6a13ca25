//! `sandcove serve`'s flags for the bounds the embedded engine puts on every sandbox (see
//! `SandboxBounds` in the engine): each left out keeps the engine's default for this host.

use clap::Args;
use sandcove::backend::local::SandboxBounds;

/// Bounds of every sandbox the embedded engine creates.
#[derive(Debug, Clone, Default, Args)]
pub struct SandboxBoundArgs {
    /// Memory of a sandbox that names none, MiB, where a cgroup enforces it (default 1024).
    #[arg(long, value_name = "MIB")]
    pub sandbox_memory_mib: Option<u64>,
    /// Processes of a sandbox that names none (default 1024).
    #[arg(long, value_name = "N")]
    pub sandbox_max_processes: Option<u64>,
    /// Inodes per MiB of a sandbox's tmpfs mounts (default 64: one per 16 KiB).
    #[arg(long, value_name = "N")]
    pub sandbox_inodes_per_mib: Option<u64>,
    /// inotify instances each user of a sandbox may hold (default: 1/16 of this user's limit).
    #[arg(long, value_name = "N")]
    pub sandbox_inotify_instances: Option<u64>,
    /// inotify watches each user of a sandbox may hold (default: 1/16 of this user's limit).
    #[arg(long, value_name = "N")]
    pub sandbox_inotify_watches: Option<u64>,
}

impl SandboxBoundArgs {
    /// `bounds` with every flag given set over it.
    pub fn apply(&self, mut bounds: SandboxBounds) -> SandboxBounds {
        let set = |field: &mut u64, flag: Option<u64>| {
            if let Some(value) = flag {
                *field = value;
            }
        };
        set(&mut bounds.default_memory_mib, self.sandbox_memory_mib);
        set(
            &mut bounds.default_max_processes,
            self.sandbox_max_processes,
        );
        set(&mut bounds.inodes_per_mib, self.sandbox_inodes_per_mib);
        set(
            &mut bounds.inotify_instances,
            self.sandbox_inotify_instances,
        );
        set(&mut bounds.inotify_watches, self.sandbox_inotify_watches);
        bounds
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        bounds: SandboxBoundArgs,
    }

    #[test]
    fn flags_given_replace_the_defaults_and_the_rest_stay() {
        let host = SandboxBounds::for_host();
        let cli = Cli::try_parse_from([
            "serve",
            "--sandbox-memory-mib",
            "512",
            "--sandbox-inotify-instances",
            "4",
        ])
        .unwrap();
        let bounds = cli.bounds.apply(host);
        assert_eq!(bounds.default_memory_mib, 512);
        assert_eq!(bounds.inotify_instances, 4);
        assert_eq!(bounds.default_max_processes, host.default_max_processes);
        assert_eq!(bounds.inodes_per_mib, host.inodes_per_mib);
        let none = Cli::try_parse_from(["serve"]).unwrap();
        assert_eq!(none.bounds.apply(host), host);
    }
}
