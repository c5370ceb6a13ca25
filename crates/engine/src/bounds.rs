//! Bounds the engine puts on every sandbox for what it would otherwise make the host hold:
//! inodes of its tmpfs mounts, the kernel objects charged to the engine's user (inotify and
//! fanotify instances, watches and marks, namespaces), and the memory and processes of a
//! sandbox that names none.
//!
//! **Inodes.** A tmpfs bounds its pages by `size=` but, unless told, allows half the host's
//! RAM pages in inodes, each of which costs the kernel about 1.1 KiB (inode and dentry,
//! measured) that no memory cgroup may be there to charge (rootless). Every tmpfs the engine
//! mounts for a sandbox therefore gets `nr_inodes`: one per 16 KiB of its size (ext4's default
//! ratio, [`DEFAULT_INODES_PER_MIB`]), at least [`MIN_INODES`]; a sandbox past it gets
//! `ENOSPC`. The kernel memory this adds is about 7% of the size.
//!
//! **Per-user kernel objects.** The kernel counts inotify instances and watches, fanotify
//! groups and marks, and namespaces per user *and per user namespace*, charging every level
//! up the chain: a process of sandbox uid `u` is charged to `(sandbox namespace, u)` against
//! the limit set in the sandbox's namespace, and to `(engine's namespace, engine user)`
//! against the engine's own limit (`/proc/sys/user/max_*`, the same numbers as
//! `fs.inotify.max_user_instances` and friends in the initial namespace). A new namespace
//! starts with no limit of its own, so before this every sandbox could take the engine user's
//! whole budget: host root's own `inotify_init1` failed while one sandbox held them. The agent
//! now writes the limits of its sandbox's namespace before anything runs there (it holds
//! `CAP_SYS_RESOURCE` there; sandbox processes do not and can only read them):
//!
//! - inotify instances and watches, fanotify groups and marks: the engine user's own limit
//!   divided by [`HOST_SHARE`] (16), per uid of the sandbox. A sandbox has one uid rootless and
//!   two as root (its default user and root), so one sandbox takes at most 1/16 (rootless) or
//!   1/8 (root) of the engine user's budget, and the engine user keeps headroom while fewer
//!   than 16 (rootless) or 8 (root) sandboxes sit at their limit at once. More sandboxes than
//!   that can still exhaust it together: what bounds them then is the number of sandboxes (the
//!   server's cap) times this share, so a host running `N` sandboxes protects its engine user
//!   fully with a per-user limit above `N ×` the per-sandbox share (e.g. raise
//!   `fs.inotify.max_user_instances`), or with smaller shares ([`SandboxBounds`]).
//! - namespaces: none of a sandbox's processes may make one (no capabilities, and the seccomp
//!   filter refuses new user namespaces); the limit is 0 new user namespaces and
//!   [`NAMESPACES`] of each other kind (the networking helper makes a few of its own inside
//!   the sandbox's user namespace).

use serde::{Deserialize, Serialize};

use sandcove_core::{Error, Result};

/// Inodes per MiB of a sandbox tmpfs: one per 16 KiB, as ext4 makes by default.
pub const DEFAULT_INODES_PER_MIB: u64 = 64;
/// Fewest inodes a sandbox tmpfs gets, whatever its size (its own skeleton takes about 30).
pub const MIN_INODES: u64 = 1024;
/// Inodes of the sandbox's `/dev` (a dozen nodes and links, made by the agent).
pub const DEV_INODES: u64 = 64;
/// Size of the sandbox's `/dev/shm`, MiB.
pub const SHM_MIB: u64 = 64;
/// The share of the engine user's inotify and fanotify limits each uid of a sandbox gets:
/// one in this many.
pub const HOST_SHARE: u64 = 16;
/// Namespaces of each kind but user a uid of a sandbox may hold.
pub const NAMESPACES: u64 = 16;
/// Memory of a sandbox that names none, where a cgroup enforces it (MiB): Daytona's default,
/// twice E2B's smallest.
pub const DEFAULT_MEMORY_MIB: u64 = 1024;
/// Processes and threads of a sandbox that names none (its `RLIMIT_NPROC`, and its cgroup's
/// `pids.max` where a cgroup enforces it).
pub const DEFAULT_MAX_PROCESSES: u64 = 1024;

/// The largest value the kernel takes for a `/proc/sys/user` limit.
const MAX_USER_LIMIT: u64 = i32::MAX as u64;

/// What the engine bounds in every sandbox it creates (see the module documentation for the
/// reasons and the arithmetic). [`SandboxBounds::for_host`] is the default;
/// [`LocalBackend::with_sandbox_bounds`](super::LocalBackend::with_sandbox_bounds) sets
/// others.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct SandboxBounds {
    /// Inodes per MiB of each sandbox tmpfs (root, `/dev/shm`), at least [`MIN_INODES`].
    pub inodes_per_mib: u64,
    /// inotify instances each uid of a sandbox may hold (its own watch API included).
    pub inotify_instances: u64,
    /// inotify watches each uid of a sandbox may hold.
    pub inotify_watches: u64,
    /// fanotify groups each uid of a sandbox may hold.
    pub fanotify_groups: u64,
    /// fanotify marks each uid of a sandbox may hold.
    pub fanotify_marks: u64,
    /// Memory of a sandbox that names none (MiB), where a cgroup enforces it.
    pub default_memory_mib: u64,
    /// Processes of a sandbox that names none.
    pub default_max_processes: u64,
}

impl Default for SandboxBounds {
    fn default() -> Self {
        Self::for_host()
    }
}

/// The per-user-namespace limits written for a sandbox, as `(file under /proc/sys/user,
/// value, required)`: a kernel without the file has no such count to bound when not required.
pub(super) type UserLimit = (&'static str, u64, bool);

impl SandboxBounds {
    /// The defaults on this host: [`HOST_SHARE`] of the engine user's inotify and fanotify
    /// limits (the smaller of its own namespace's and the initial namespace's), the rest
    /// fixed.
    pub fn for_host() -> Self {
        let share = |user: &str, fs: &str, fallback: u64| {
            let read = |path: &str| {
                std::fs::read_to_string(path)
                    .ok()
                    .and_then(|s| s.trim().parse::<u64>().ok())
            };
            let limit = [read(user), read(fs)]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(fallback);
            (limit / HOST_SHARE).max(1)
        };
        SandboxBounds {
            inodes_per_mib: DEFAULT_INODES_PER_MIB,
            inotify_instances: share(
                "/proc/sys/user/max_inotify_instances",
                "/proc/sys/fs/inotify/max_user_instances",
                128,
            ),
            inotify_watches: share(
                "/proc/sys/user/max_inotify_watches",
                "/proc/sys/fs/inotify/max_user_watches",
                8192,
            ),
            fanotify_groups: share(
                "/proc/sys/user/max_fanotify_groups",
                "/proc/sys/fs/fanotify/max_user_groups",
                128,
            ),
            fanotify_marks: share(
                "/proc/sys/user/max_fanotify_marks",
                "/proc/sys/fs/fanotify/max_user_marks",
                8192,
            ),
            default_memory_mib: DEFAULT_MEMORY_MIB,
            default_max_processes: DEFAULT_MAX_PROCESSES,
        }
    }

    /// Refuse bounds that would lift a protection or that the kernel cannot take.
    pub(super) fn validate(&self) -> Result<()> {
        let limits = [
            ("inotify_instances", self.inotify_instances),
            ("inotify_watches", self.inotify_watches),
            ("fanotify_groups", self.fanotify_groups),
            ("fanotify_marks", self.fanotify_marks),
        ];
        for (name, value) in limits {
            if value > MAX_USER_LIMIT {
                return Err(Error::invalid(format!(
                    "{name} of {value}: at most {MAX_USER_LIMIT}"
                )));
            }
        }
        if self.inodes_per_mib == 0 || self.inodes_per_mib > 1 << 20 {
            return Err(Error::invalid(format!(
                "inodes_per_mib of {}: 1 to {}",
                self.inodes_per_mib,
                1u64 << 20
            )));
        }
        if self.default_memory_mib < super::cgroup::MIN_MEMORY_MIB {
            return Err(Error::invalid(format!(
                "default_memory_mib of {}: at least {}",
                self.default_memory_mib,
                super::cgroup::MIN_MEMORY_MIB
            )));
        }
        if self.default_max_processes == 0 {
            return Err(Error::invalid("default_max_processes of 0: at least 1"));
        }
        Ok(())
    }

    /// `nr_inodes` of a sandbox tmpfs of `mib` MiB (never 0, which the kernel takes as no
    /// bound).
    pub fn inodes_for(&self, mib: u64) -> u64 {
        mib.saturating_mul(self.inodes_per_mib).max(MIN_INODES)
    }

    /// The limits the agent writes in its sandbox's user namespace.
    pub(super) fn user_limits(&self) -> Vec<UserLimit> {
        let mut out = vec![
            ("max_inotify_instances", self.inotify_instances, true),
            ("max_inotify_watches", self.inotify_watches, true),
            // fanotify is counted per user from Linux 5.13, the first to let an unprivileged
            // process make a group: without the files there is nothing to bound.
            ("max_fanotify_groups", self.fanotify_groups, false),
            ("max_fanotify_marks", self.fanotify_marks, false),
            ("max_user_namespaces", 0, true),
        ];
        // Time namespaces arrived in Linux 5.6, after the others.
        for (file, required) in [
            ("max_mnt_namespaces", true),
            ("max_pid_namespaces", true),
            ("max_net_namespaces", true),
            ("max_ipc_namespaces", true),
            ("max_uts_namespaces", true),
            ("max_cgroup_namespaces", true),
            ("max_time_namespaces", false),
        ] {
            out.push((file, NAMESPACES, required));
        }
        out
    }
}

/// Write `limits` for the calling process's user namespace (the agent, root of its sandbox's
/// namespace, before any sandbox process exists). A required file that cannot be written
/// fails the setup: no sandbox runs with the engine user's budget open to it.
pub(super) fn apply_user_limits(limits: &[UserLimit]) -> std::io::Result<()> {
    for &(file, value, required) in limits {
        let path = format!("/proc/sys/user/{file}");
        match super::sys::write_proc_file(&path, &value.to_string()) {
            Ok(()) => {}
            Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inodes_follow_the_size_and_never_vanish() {
        let b = SandboxBounds::for_host();
        assert_eq!(b.inodes_for(2048), 2048 * 64);
        assert_eq!(b.inodes_for(1), MIN_INODES);
        assert_eq!(b.inodes_for(0), MIN_INODES);
        assert_eq!(b.inodes_for(u64::MAX), u64::MAX);
        assert!(b.inodes_for(SHM_MIB) >= MIN_INODES);
    }

    #[test]
    fn host_shares_are_a_sixteenth_and_bounds_are_checked() {
        let b = SandboxBounds::for_host();
        let host: u64 = std::fs::read_to_string("/proc/sys/user/max_inotify_instances")
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(b.inotify_instances <= (host / HOST_SHARE).max(1));
        assert!(b.inotify_instances >= 1);
        assert!(b.validate().is_ok());
        for bad in [
            SandboxBounds {
                inodes_per_mib: 0,
                ..b
            },
            SandboxBounds {
                inotify_instances: MAX_USER_LIMIT + 1,
                ..b
            },
            SandboxBounds {
                default_memory_mib: 1,
                ..b
            },
            SandboxBounds {
                default_max_processes: 0,
                ..b
            },
        ] {
            assert_eq!(
                bad.validate().unwrap_err().code(),
                sandcove_core::ErrorCode::InvalidArgument
            );
        }
        let limits = b.user_limits();
        assert!(limits.contains(&("max_user_namespaces", 0, true)));
        assert!(limits.contains(&("max_inotify_instances", b.inotify_instances, true)));
    }
}
