//! Memory, CPU and process-count limits through the host's cgroups.
//!
//! A sandbox's processes, and the pages of its tmpfs root and `/dev/shm` (charged to the
//! cgroup of the process that writes them), are held to its limits when the host lets
//! Sandcove create cgroups:
//!
//! - **cgroup v2, delegated**: `SANDCOVE_CGROUP` names a directory of the unified hierarchy
//!   this user may write, with `memory`, `cpu` and `pids` enabled in its
//!   `cgroup.subtree_control` (e.g. made with `systemd-run --user -p Delegate=yes …`, or by
//!   root for the service). As root on a pure v2 host, `/sys/fs/cgroup/sandcove` is made and
//!   used without configuration.
//! - **cgroup v1, as root** (hybrid hosts): `sandcove/<id>` under the `memory`, `cpu` and
//!   `pids` hierarchies.
//!
//! Rootless without a delegated v2 subtree there is no cgroup to write: memory and CPU
//! limits are then refused with `NotSupported` naming the remedy, never silently ignored.
//! The agent is in the sandbox's cgroup before it starts anything, so everything in the
//! sandbox is inside it: on v1 the agent moves itself in as its first act (through files the
//! monitor opened, see [`prepare_v1`]), on v2 the monitor moves it while it builds its root
//! and takes its verdict only after. The cgroup is removed when the sandbox ends.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use sandcove_core::{Error, Result};

/// Names a delegated cgroup v2 directory to make sandbox cgroups in.
pub const CGROUP_ENV: &str = "SANDCOVE_CGROUP";
/// Smallest memory limit accepted (MiB): below it the sandbox's own agent cannot start.
pub const MIN_MEMORY_MIB: u64 = 16;
const CPU_PERIOD_US: u64 = 100_000;
/// cgroup v1 `cpu.shares` of one core's worth (the kernel's default for a new group).
const V1_SHARES_PER_CORE: f64 = 1024.0;
/// cgroup v2 `cpu.weight` of one core's worth (the kernel's default for a new group).
const V2_WEIGHT_PER_CORE: f64 = 100.0;

/// Where sandbox cgroups are made on this host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Hierarchy {
    /// A unified (v2) directory whose children get `memory.max`, `cpu.max`, `pids.max`.
    V2(PathBuf),
    /// Per-controller v1 parent directories.
    V1 {
        /// Parent under the memory hierarchy.
        memory: PathBuf,
        /// Parent under the cpu hierarchy.
        cpu: PathBuf,
        /// Parent under the pids hierarchy.
        pids: PathBuf,
    },
}

/// The limits written for one sandbox.
///
/// Every sandbox also gets a CPU weight (`cpu.weight` on v2, `cpu.shares` on v1) in
/// proportion to the cores it asked for, one core's worth when it named none: under
/// contention each sandbox gets its share whether or not it has a quota, and all sandboxes
/// together weigh as one group beside the host's own (the engine's `sandcove` parent).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    /// Memory, MiB (swap is not granted on top).
    pub memory_mib: u64,
    /// CPU cores (a quota per period); `None` leaves CPU unlimited.
    pub cpu: Option<f64>,
    /// Processes and threads, all users together.
    pub pids: u64,
}

/// The hierarchy this host lets us use, if any. Cheap: reads a few `/sys` and `/proc` files.
pub fn detect() -> Option<Hierarchy> {
    if let Some(dir) = std::env::var_os(CGROUP_ENV).filter(|d| !d.is_empty()) {
        let dir = PathBuf::from(dir);
        return v2_usable(&dir).then_some(Hierarchy::V2(dir));
    }
    if super::sys::geteuid() != 0 {
        return None;
    }
    let root = Path::new("/sys/fs/cgroup");
    if root.join("cgroup.controllers").exists() {
        let dir = root.join("sandcove");
        if !dir.exists() {
            let _ = std::fs::create_dir(&dir);
            let _ = std::fs::write(root.join("cgroup.subtree_control"), "+memory +cpu +pids");
            let _ = std::fs::write(dir.join("cgroup.subtree_control"), "+memory +cpu +pids");
        }
        return v2_usable(&dir).then_some(Hierarchy::V2(dir));
    }
    let v1 = |c: &str| root.join(c).join("sandcove");
    let (memory, cpu, pids) = (v1("memory"), v1("cpu"), v1("pids"));
    for (dir, parent) in [(&memory, "memory"), (&cpu, "cpu"), (&pids, "pids")] {
        if !root.join(parent).join("cgroup.procs").exists() {
            return None;
        }
        if std::fs::create_dir(dir).is_err() && !dir.is_dir() {
            return None;
        }
    }
    Some(Hierarchy::V1 { memory, cpu, pids })
}

/// A v2 directory is usable when we may make children in it and it hands them the three
/// controllers.
fn v2_usable(dir: &Path) -> bool {
    let Ok(control) = std::fs::read_to_string(dir.join("cgroup.subtree_control")) else {
        return false;
    };
    let has = |c: &str| control.split_whitespace().any(|w| w == c);
    has("memory") && has("cpu") && has("pids") && super::sys::access_writable(dir).unwrap_or(false)
}

/// Check requested limits before any effect.
pub fn check(resources: &sandcove_core::Resources, available: bool) -> Result<()> {
    if let Some(cpu) = resources.cpu {
        if !(cpu.is_finite() && cpu > 0.0 && cpu <= 1024.0) {
            return Err(Error::invalid(format!(
                "cpu {cpu} must be a number of cores above 0 (at most 1024)"
            )));
        }
    }
    if let Some(mib) = resources.memory_mib {
        if !(MIN_MEMORY_MIB..=(1 << 30)).contains(&mib) {
            return Err(Error::invalid(format!(
                "memory of {mib} MiB must be between {MIN_MEMORY_MIB} MiB and 1 PiB"
            )));
        }
    }
    if (resources.cpu.is_some() || resources.memory_mib.is_some()) && !available {
        return Err(Error::not_supported(
            "CPU and memory limits on this host",
            format!(
                "omit cpu/memory, or let Sandcove write cgroups: run it as root, or delegate a \
                 cgroup v2 subtree with the memory, cpu and pids controllers to this user and \
                 name it in {CGROUP_ENV} (e.g. inside `systemd-run --user -p Delegate=yes \
                 --scope …`, enable them in its cgroup.subtree_control)"
            ),
        ));
    }
    Ok(())
}

/// A sandbox's cgroup: where, and with which limits (kept in its record for the monitor).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// The hierarchy.
    pub hierarchy: Hierarchy,
    /// The limits.
    pub limits: Limits,
}

/// The directories of sandbox `id`'s cgroup under `h`.
fn dirs(h: &Hierarchy, id: &str) -> Vec<PathBuf> {
    match h {
        Hierarchy::V2(dir) => vec![dir.join(id)],
        Hierarchy::V1 { memory, cpu, pids } => vec![memory.join(id), cpu.join(id), pids.join(id)],
    }
}

/// Make sandbox `id`'s cgroup, write its limits, and move `pid` (the agent, before it starts
/// anything) into it: on cgroup v2, where a move costs no grace period. On error, what was
/// made is removed.
pub fn enter(h: &Hierarchy, id: &str, limits: Limits, pid: i32) -> std::io::Result<()> {
    let made = make(h, id, limits)?;
    let result = made
        .iter()
        .try_for_each(|dir| write(dir, "cgroup.procs", pid.to_string()));
    if result.is_err() {
        remove(h, id);
    }
    result
}

/// On cgroup v1: make sandbox `id`'s cgroup, write its limits, and open the `tasks` file of
/// each of its directories, for the agent to move itself in with [`join`] before it does
/// anything else. On error, what was made is removed.
///
/// Why the agent moves itself: a v1 move of a *process* (`cgroup.procs`, or another task's
/// id) takes the kernel's global thread-group lock for writing, which waits for an RCU grace
/// period (10–45 ms measured here: most of a cold create as root). A single-threaded process
/// writing `0` (itself) to `tasks` moves exactly as far, all three hierarchies, and skips that
/// lock. The files are opened here, by the monitor: the kernel checks a move against the
/// credentials the file was opened with, and those are the host's.
pub fn prepare_v1(h: &Hierarchy, id: &str, limits: Limits) -> std::io::Result<Vec<OwnedFd>> {
    let made = make(h, id, limits)?;
    let opened: std::io::Result<Vec<OwnedFd>> = made
        .iter()
        .map(|dir| {
            std::fs::OpenOptions::new()
                .write(true)
                .open(dir.join("tasks"))
                .map(OwnedFd::from)
                .map_err(|e| named(e, &dir.join("tasks")))
        })
        .collect();
    if opened.is_err() {
        remove(h, id);
    }
    opened
}

/// Move the calling process into the cgroups whose `tasks` files `tasks` holds open (from
/// [`prepare_v1`]). The caller must be single-threaded: only the calling thread moves.
pub fn join(tasks: &[OwnedFd]) -> std::io::Result<()> {
    for fd in tasks {
        // One write of the whole value: cgroup files take a value per write.
        let n = rustix::io::write(fd, b"0")?;
        if n != 1 {
            return Err(std::io::Error::other("short write to a cgroup tasks file"));
        }
    }
    Ok(())
}

/// `e`, naming the cgroup file it came from.
fn named(e: std::io::Error, path: &Path) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

fn write(dir: &Path, file: &str, value: String) -> std::io::Result<()> {
    std::fs::write(dir.join(file), value).map_err(|e| named(e, &dir.join(file)))
}

/// Make sandbox `id`'s cgroup directories and write its limits; on error, what was made is
/// removed. Returns the directories.
fn make(h: &Hierarchy, id: &str, limits: Limits) -> std::io::Result<Vec<PathBuf>> {
    let made = dirs(h, id);
    let result = (|| {
        for dir in &made {
            std::fs::create_dir(dir)?;
        }
        let bytes = limits.memory_mib << 20;
        let quota = limits
            .cpu
            .map(|c| ((c * CPU_PERIOD_US as f64) as u64).max(1000));
        match h {
            Hierarchy::V2(_) => {
                let dir = &made[0];
                write(dir, "memory.max", bytes.to_string())?;
                if dir.join("memory.swap.max").exists() {
                    write(dir, "memory.swap.max", "0".into())?;
                }
                if let Some(q) = quota {
                    write(dir, "cpu.max", format!("{q} {CPU_PERIOD_US}"))?;
                }
                write(dir, "cpu.weight", v2_weight(limits.cpu).to_string())?;
                write(dir, "pids.max", limits.pids.to_string())?;
            }
            Hierarchy::V1 { .. } => {
                let (memory, cpu, pids) = (&made[0], &made[1], &made[2]);
                write(memory, "memory.limit_in_bytes", bytes.to_string())?;
                // v1 charges TCP socket buffers only once this is set: without it a sandbox
                // holds unread data in loopback connections far past its limit.
                write(memory, "memory.kmem.tcp.limit_in_bytes", bytes.to_string())?;
                if memory.join("memory.memsw.limit_in_bytes").exists() {
                    write(memory, "memory.memsw.limit_in_bytes", bytes.to_string())?;
                }
                if let Some(q) = quota {
                    write(cpu, "cpu.cfs_period_us", CPU_PERIOD_US.to_string())?;
                    write(cpu, "cpu.cfs_quota_us", q.to_string())?;
                }
                write(cpu, "cpu.shares", v1_shares(limits.cpu).to_string())?;
                write(pids, "pids.max", limits.pids.to_string())?;
            }
        }
        Ok(())
    })();
    match result {
        Ok(()) => Ok(made),
        Err(e) => {
            remove(h, id);
            Err(e)
        }
    }
}

/// `cpu.shares` (v1) for a sandbox of `cpu` cores (one when it names none), within the
/// kernel's range.
fn v1_shares(cpu: Option<f64>) -> u64 {
    (cpu.unwrap_or(1.0) * V1_SHARES_PER_CORE)
        .round()
        .clamp(2.0, 262_144.0) as u64
}

/// `cpu.weight` (v2) for a sandbox of `cpu` cores (one when it names none), within the
/// kernel's range.
fn v2_weight(cpu: Option<f64>) -> u64 {
    (cpu.unwrap_or(1.0) * V2_WEIGHT_PER_CORE)
        .round()
        .clamp(1.0, 10_000.0) as u64
}

/// Remove sandbox `id`'s cgroup once its processes are gone (bounded wait: the kernel ends
/// a PID namespace's processes asynchronously after its init dies).
pub fn remove(h: &Hierarchy, id: &str) {
    for dir in dirs(h, id) {
        for _ in 0..200 {
            match std::fs::remove_dir(&dir) {
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                _ => break,
            }
        }
    }
}

/// Remove cgroups of sandboxes that are no longer running (their monitor died without
/// cleaning up): every child of the hierarchy's sandcove directories not in `live`, and
/// holding no process.
pub fn collect_stale(h: &Hierarchy, live: &dyn Fn(&str) -> bool) {
    let parents = match h {
        Hierarchy::V2(dir) => vec![dir.clone()],
        Hierarchy::V1 { memory, cpu, pids } => vec![memory.clone(), cpu.clone(), pids.clone()],
    };
    for parent in parents {
        let Ok(entries) = std::fs::read_dir(&parent) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            // Young ones may be a create in progress (made, its agent not yet inside).
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .map(|t| t.elapsed().unwrap_or_default() > Duration::from_secs(120))
                .unwrap_or(false);
            if super::config::valid_id(&name) && !live(&name) && old && e.path().is_dir() {
                // rmdir fails (EBUSY) while any process is still inside: nothing is lost.
                let _ = std::fs::remove_dir(e.path());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandcove_core::{ErrorCode, Resources};

    /// A move the kernel refuses is an error (the agent then fails its setup, and with it
    /// the create), never skipped.
    #[test]
    fn a_refused_move_is_an_error() {
        assert!(join(&[]).is_ok());
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .map(OwnedFd::from)
            .unwrap();
        assert!(join(&[full]).is_err(), "a write that fails");
        let read_only = OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        assert!(join(&[read_only]).is_err(), "a file not open for writing");
    }

    /// Every sandbox gets a weight: one core's worth by default, in proportion to its cores,
    /// within what the kernel takes.
    #[test]
    fn cpu_weights_follow_the_cores_asked_for() {
        assert_eq!((v1_shares(None), v2_weight(None)), (1024, 100));
        assert_eq!((v1_shares(Some(0.5)), v2_weight(Some(0.5))), (512, 50));
        assert_eq!((v1_shares(Some(4.0)), v2_weight(Some(4.0))), (4096, 400));
        assert_eq!((v1_shares(Some(0.001)), v2_weight(Some(0.001))), (2, 1));
        assert_eq!(
            (v1_shares(Some(1024.0)), v2_weight(Some(1024.0))),
            (262_144, 10_000)
        );
    }

    #[test]
    fn limits_are_checked_before_any_effect() {
        let with = |cpu: Option<f64>, memory_mib: Option<u64>| {
            let mut options = Resources::default();
            options.cpu = cpu;
            options.memory_mib = memory_mib;
            options
        };
        let code = |r: Resources, available| check(&r, available).err().map(|e| e.code());
        assert_eq!(code(with(None, None), false), None);
        assert_eq!(code(with(Some(1.0), None), true), None);
        assert_eq!(code(with(None, Some(512)), true), None);
        assert_eq!(
            code(with(Some(1.0), None), false),
            Some(ErrorCode::NotSupported)
        );
        assert_eq!(
            code(with(None, Some(512)), false),
            Some(ErrorCode::NotSupported)
        );
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, 5000.0] {
            assert_eq!(
                code(with(Some(bad), None), true),
                Some(ErrorCode::InvalidArgument)
            );
        }
        for bad in [0, 1, MIN_MEMORY_MIB - 1, u64::MAX] {
            assert_eq!(
                code(with(None, Some(bad)), true),
                Some(ErrorCode::InvalidArgument)
            );
        }
    }
}
