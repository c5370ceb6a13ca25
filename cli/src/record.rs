//! Where a running `sandcove serve` listens, recorded in the state directory so that
//! `sandcove env VENDOR` can find it.
//!
//! One small JSON file per server process, `<state>/servers/<pid>.json`, written atomically
//! (temporary file, then rename) with mode 0600 and removed on a clean exit. A server killed
//! without cleanup leaves its file behind: a record counts only while its process is alive
//! and its listener accepts a connection, and `env` removes records that fail both checks.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Largest record read back (they are a few hundred bytes).
const MAX_RECORD_BYTES: u64 = 16 * 1024;

/// The listeners of one server process.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Listeners {
    /// The server's process id.
    pub pid: u32,
    /// The native API's base URL.
    pub native: String,
    /// The E2B wire listener's origin, when serving it.
    #[serde(default)]
    pub e2b: Option<String>,
    /// The Daytona wire listener's origin, when serving it.
    #[serde(default)]
    pub daytona: Option<String>,
    /// The Blaxel wire listener's (plain HTTP) origin, when serving it.
    #[serde(default)]
    pub blaxel: Option<String>,
}

fn servers_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("servers")
}

/// Record `listeners`; returns the path to remove at exit.
pub fn write(state_dir: &Path, listeners: &Listeners) -> std::io::Result<PathBuf> {
    let dir = servers_dir(state_dir);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)?;
    let path = dir.join(format!("{}.json", listeners.pid));
    let tmp = dir.join(format!(".{}.json.tmp", listeners.pid));
    let body = serde_json::to_vec(listeners).map_err(std::io::Error::other)?;
    let _ = std::fs::remove_file(&tmp);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    file.write_all(&body)?;
    file.sync_all()?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

/// Remove a record written by [`write`] (best effort: a leftover is detected as stale).
pub fn remove(path: &Path) {
    let _ = std::fs::remove_file(path);
}

/// Read one record, bounded; `None` for anything that is not a small regular JSON record.
fn read(path: &Path) -> Option<Listeners> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut bytes = Vec::new();
    file.take(MAX_RECORD_BYTES + 1)
        .read_to_end(&mut bytes)
        .ok()?;
    if bytes.len() as u64 > MAX_RECORD_BYTES {
        return None;
    }
    serde_json::from_slice(&bytes).ok()
}

/// Whether a recorded server still runs: its process exists and `url`'s listener accepts.
fn alive(pid: u32, url: &str) -> bool {
    if !Path::new(&format!("/proc/{pid}")).exists() {
        return false;
    }
    let Some(hostport) = url.split("://").nth(1) else {
        return false;
    };
    let addrs: Vec<SocketAddr> = match hostport.to_socket_addrs() {
        Ok(addrs) => addrs.collect(),
        Err(_) => return false,
    };
    addrs
        .iter()
        .any(|a| TcpStream::connect_timeout(a, Duration::from_secs(2)).is_ok())
}

/// The E2B origin of a running server recorded under `state_dir`, if any. Records of servers
/// that are gone are removed.
pub fn find_e2b(state_dir: &Path) -> std::io::Result<Option<String>> {
    find(state_dir, |l| l.e2b.clone())
}

/// The Daytona origin of a running server recorded under `state_dir`, if any.
pub fn find_daytona(state_dir: &Path) -> std::io::Result<Option<String>> {
    find(state_dir, |l| l.daytona.clone())
}

/// The Blaxel origin of a running server recorded under `state_dir`, if any.
pub fn find_blaxel(state_dir: &Path) -> std::io::Result<Option<String>> {
    find(state_dir, |l| l.blaxel.clone())
}

/// The listener `pick` selects of the newest running server that has one.
fn find(
    state_dir: &Path,
    pick: impl Fn(&Listeners) -> Option<String>,
) -> std::io::Result<Option<String>> {
    let dir = servers_dir(state_dir);
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut records: Vec<(PathBuf, Listeners)> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .filter_map(|p| read(&p).map(|l| (p, l)))
        .collect();
    // Newest server first (pids are not ordered, modification times are).
    records.sort_by_key(|(p, _)| {
        std::cmp::Reverse(std::fs::metadata(p).and_then(|m| m.modified()).ok())
    });
    for (path, listeners) in records {
        if !alive(listeners.pid, &listeners.native) {
            remove(&path);
            continue;
        }
        if let Some(url) = pick(&listeners).filter(|url| alive(listeners.pid, url)) {
            return Ok(Some(url));
        }
    }
    Ok(None)
}
