//! What the client, the monitor and the agent agree on about one sandbox, and where its
//! state lives on the host.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use sandcove_core::{CreateOptions, Error, Result, UserInfo};

/// First host uid of the range sandbox users map to when the host runs as root, far from
/// real accounts and from the usual subordinate-id ranges.
pub const HOST_ID_BASE: u32 = 0x7000_0000;
/// Size of that range.
pub const HOST_ID_COUNT: u32 = 65_536;
/// Uid of the default sandbox user when several uids are mappable.
pub const DEFAULT_USER_UID: u32 = 1000;
/// Name of the default user when the create options name none.
pub const DEFAULT_USER_NAME: &str = "user";
/// Default `RLIMIT_NOFILE` per process.
pub const DEFAULT_MAX_OPEN_FILES: u64 = 4096;
/// Default size of a sandbox's writable filesystem (tmpfs), in MiB.
pub const DEFAULT_DISK_MIB: u64 = 2048;

/// How sandbox uids map onto host uids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UidMapping {
    /// Rootless: sandbox uid 0 is the calling user; no other uid exists.
    Single {
        /// The host uid.
        host_uid: u32,
        /// The host gid.
        host_gid: u32,
    },
    /// Root host: sandbox uids 0..65536 map onto an unprivileged host range.
    Range,
}

impl UidMapping {
    /// The mapping this host allows.
    pub fn for_host(euid: u32, egid: u32) -> Self {
        if euid == 0 {
            UidMapping::Range
        } else {
            UidMapping::Single {
                host_uid: euid,
                host_gid: egid,
            }
        }
    }

    /// Contents for `/proc/<pid>/uid_map` and `gid_map`.
    pub fn map_lines(&self) -> (String, String) {
        match *self {
            UidMapping::Single { host_uid, host_gid } => {
                (format!("0 {host_uid} 1\n"), format!("0 {host_gid} 1\n"))
            }
            UidMapping::Range => {
                let line = format!("0 {HOST_ID_BASE} {HOST_ID_COUNT}\n");
                (line.clone(), line)
            }
        }
    }

    /// The users a sandbox has under this mapping, default user first (with home `home`).
    pub fn users(&self, default_name: &str, home: &str) -> Vec<UserInfo> {
        let user = |name: &str, uid: u32, home: &str| UserInfo {
            name: name.to_string(),
            uid,
            gid: uid,
            home: home.to_string(),
        };
        match self {
            UidMapping::Single { .. } => vec![user(default_name, 0, home)],
            UidMapping::Range if default_name == "root" => vec![user("root", 0, home)],
            UidMapping::Range => vec![
                user(default_name, DEFAULT_USER_UID, home),
                user("root", 0, "/root"),
            ],
        }
    }
}

/// The persistent description of one sandbox: written by the client at create, owned by the
/// monitor afterwards (`record.json` in the sandbox's state directory).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    /// Sandbox id.
    pub id: String,
    /// The options it was created with.
    pub options: CreateOptions,
    /// Users, default first.
    pub users: Vec<UserInfo>,
    /// Uid mapping.
    pub mapping: UidMapping,
    /// Creation time, ms since the epoch.
    pub created_at: u64,
    /// Lease end, ms since the epoch.
    pub ends_at: u64,
    /// Whether the sandbox was created without isolation (explicit opt-in only).
    pub unisolated: bool,
    /// Whether the sandbox may run without Landlock on a kernel that lacks it (explicit
    /// opt-in only; otherwise setup fails).
    #[serde(default)]
    pub landlock_optional: bool,
    /// The cgroup the monitor puts the sandbox in, where the host allows one.
    #[serde(default)]
    pub cgroup: Option<super::cgroup::Plan>,
    /// Free-form annotations the monitor keeps (e.g. why the agent stopped).
    #[serde(default)]
    pub notes: BTreeMap<String, String>,
    /// Host directories (volumes) to bind into the sandbox.
    #[serde(default)]
    pub mounts: Vec<HostMount>,
    /// Un-isolated mode only: the host directory standing in for the sandbox's `/`.
    #[serde(default)]
    pub root_prefix: Option<String>,
    /// Internet policy only: the user-mode networking helper (`pasta`) the monitor starts.
    #[serde(default)]
    pub pasta: Option<String>,
    /// Limits of each preview listener.
    #[serde(default)]
    pub preview_limits: super::PreviewLimits,
    /// The client ↔ monitor protocol version of the build that created the sandbox (and runs
    /// its monitor); records from before versions were recorded are v1.
    #[serde(default = "first_protocol_version")]
    pub protocol: u32,
    /// A warm-pool member not yet claimed: hidden from `list` (no `info.json`) and served
    /// to no one but its pool's claim.
    #[serde(default)]
    pub pooled: bool,
    /// A directory of the engine's to bind read-only over the sandbox's `/usr/lib/locale`:
    /// the host's locales with an archive of them (see `locale`).
    #[serde(default)]
    pub locale: Option<String>,
    /// What the engine bounds this sandbox to beyond its options (tmpfs inodes, the
    /// per-user-namespace limits its agent writes, default processes).
    #[serde(default)]
    pub bounds: super::bounds::SandboxBounds,
    /// The image the sandbox's root is made of; `None` for the host base.
    #[serde(default)]
    pub image: Option<super::images::ImageRoot>,
    /// How the image's root is composed (overlayfs, a copy, or overlayfs where it mounts).
    #[serde(default)]
    pub image_root_mode: super::images::ImageRootMode,
    /// A snapshot archive of an image sandbox (its writable layer, as an OCI layer tar) that
    /// the agent unpacks into this sandbox's writable layer before mounting its root.
    #[serde(default)]
    pub restore_archive: Option<String>,
}

fn first_protocol_version() -> u32 {
    super::proto::FIRST_PROTOCOL_VERSION
}

/// A host directory bound into a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostMount {
    /// Directory on the host that only the host controls: a volume's data directory, or
    /// the monitor's staging mount of it.
    pub host_path: String,
    /// Directory beneath `host_path` to mount instead. Sandboxes write the volume's contents,
    /// so it is resolved from a descriptor of `host_path` with no symlinks, never by name.
    #[serde(default)]
    pub subpath: Option<String>,
    /// Absolute path inside the sandbox.
    pub path: String,
    /// Mount read-only.
    pub read_only: bool,
    /// A size-bounded volume (see `volumes`): `host_path` is the volume's directory, and the
    /// monitor obtains the mount from the volume's holder instead of binding a directory.
    #[serde(default)]
    pub bounded: bool,
}

impl Record {
    /// The default user.
    pub fn default_user(&self) -> &UserInfo {
        &self.users[0]
    }

    /// Find a user by name; `None` is the default.
    pub fn user(&self, name: Option<&str>) -> Result<&UserInfo> {
        let Some(name) = name else {
            return Ok(self.default_user());
        };
        if let Some(u) = self.users.iter().find(|u| u.name == name) {
            return Ok(u);
        }
        match self.mapping {
            UidMapping::Single { .. } => Err(Error::not_supported(
                format!("running as user {name:?}"),
                format!(
                    "run as the sandbox's default user {:?}; other users need more than one \
                     mappable uid (run the host side as root)",
                    self.default_user().name
                ),
            )),
            UidMapping::Range => Err(Error::invalid(format!(
                "unknown user {name:?}; this sandbox has {}",
                self.users
                    .iter()
                    .map(|u| u.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    }

    /// Size of the sandbox filesystem in MiB.
    pub fn disk_mib(&self) -> u64 {
        self.options.resources.disk_mib.unwrap_or(DEFAULT_DISK_MIB)
    }

    /// `RLIMIT_NPROC` for sandbox processes.
    pub fn max_processes(&self) -> u64 {
        self.options
            .resources
            .max_processes
            .unwrap_or(self.bounds.default_max_processes)
    }

    /// `RLIMIT_NOFILE` for sandbox processes.
    pub fn max_open_files(&self) -> u64 {
        self.options
            .resources
            .max_open_files
            .unwrap_or(DEFAULT_MAX_OPEN_FILES)
    }

    /// The sandbox's `/etc/passwd`.
    pub fn passwd(&self) -> String {
        let mut out = String::new();
        for u in &self.users {
            out.push_str(&format!(
                "{}:x:{}:{}::{}:/bin/bash\n",
                u.name, u.uid, u.gid, u.home
            ));
        }
        if !self.users.iter().any(|u| u.name == "nobody") {
            out.push_str("nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n");
        }
        out
    }

    /// The sandbox's `/etc/group`.
    pub fn group(&self) -> String {
        let mut out = String::new();
        for u in &self.users {
            out.push_str(&format!("{}:x:{}:\n", u.name, u.gid));
        }
        out.push_str("nogroup:x:65534:\n");
        out
    }
}

/// The host directory holding every sandbox's state: `SANDCOVE_STATE_DIR`, else
/// `$XDG_STATE_HOME/sandcove`, else `~/.local/state/sandcove`, else a per-uid directory under
/// `/tmp`.
pub fn default_state_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("SANDCOVE_STATE_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_STATE_HOME").filter(|d| !d.is_empty()) {
        return Path::new(&dir).join("sandcove");
    }
    if let Some(home) = std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        return Path::new(&home).join(".local/state/sandcove");
    }
    PathBuf::from(format!("/tmp/sandcove-{}", super::sys::geteuid()))
}

/// Paths of one sandbox's state directory.
#[derive(Debug, Clone)]
pub struct SandboxDir {
    /// The directory itself.
    pub dir: PathBuf,
}

impl SandboxDir {
    /// The directory of sandbox `id` under `state_dir`.
    pub fn new(state_dir: &Path, id: &str) -> Self {
        SandboxDir {
            dir: state_dir.join("sandboxes").join(id),
        }
    }
    /// The monitor's socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.join("sock")
    }
    /// The lock the monitor holds for its whole life.
    pub fn lock(&self) -> PathBuf {
        self.dir.join("lock")
    }
    /// The record.
    pub fn record(&self) -> PathBuf {
        self.dir.join("record.json")
    }
    /// Live state, rewritten by the monitor on every change (read by `list`).
    pub fn info(&self) -> PathBuf {
        self.dir.join("info.json")
    }
    /// The monitor's log.
    pub fn log(&self) -> PathBuf {
        self.dir.join("monitor.log")
    }
}

pub use sandcove_agent::{new_id, valid_id};

#[cfg(test)]
mod tests {
    use super::*;
    use sandcove_core::SANDBOX_HOME;

    #[test]
    fn rootless_maps_one_uid_and_root_maps_a_range() {
        let single = UidMapping::for_host(1001, 1002);
        assert_eq!(single.map_lines().0, "0 1001 1\n");
        assert_eq!(single.map_lines().1, "0 1002 1\n");
        assert_eq!(single.users("user", SANDBOX_HOME)[0].uid, 0);
        let range = UidMapping::for_host(0, 0);
        assert_eq!(range.map_lines().0, format!("0 {HOST_ID_BASE} 65536\n"));
        let users = range.users("user", SANDBOX_HOME);
        assert_eq!((users[0].name.as_str(), users[0].uid), ("user", 1000));
        assert_eq!((users[1].name.as_str(), users[1].uid), ("root", 0));
    }

    #[test]
    fn ids_are_safe_directory_names() {
        for _ in 0..100 {
            assert!(valid_id(&new_id()));
        }
        for bad in ["", "..", "a/b", "A", "-x", "x\0"] {
            assert!(!valid_id(bad), "{bad:?}");
        }
    }
}
