//! The engine's side of [references](sandcove_core::reference): its runtime identity and its
//! tombstones, both kept in the state directory so every program of the user sees the same.
//!
//! - `runtime-id`: minted by the first engine to open the state directory (written to a
//!   temporary file, then hard-linked into place so two engines starting at once agree on the
//!   winner's) and never changed. A file that is there but unreadable or malformed is an
//!   error, never silently replaced: replacing it would orphan every saved reference.
//! - `tombstones/<kind>.<id>`: one small JSON [`Tombstone`] per ended resource, written by the
//!   monitor when its sandbox ends and by the engine when a snapshot or volume is deleted or a
//!   preview closed. A write drops the expired ones ([`TOMBSTONE_TTL`]) and the oldest
//!   beyond [`MAX_TOMBSTONES`], at most once a minute (`tombstones/.pruned` says when it last
//!   did); a read ignores an expired one.
//!
//! The state directory belongs to the engine's user, not to any sandbox, so plain paths are
//! safe here. These functions block: call them off the event loop.

use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use sandcove_core::reference::{valid_runtime_id, MAX_TOMBSTONES, TOMBSTONE_TTL};
use sandcove_core::{Error, ResourceKind, Result, Tombstone};

/// Largest tombstone file read back, in bytes (they are a few hundred).
const MAX_TOMBSTONE_BYTES: u64 = 4096;

fn id_file(state_dir: &Path) -> PathBuf {
    state_dir.join("runtime-id")
}

fn tombstones_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("tombstones")
}

fn read_bounded(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(path)?;
    let mut out = Vec::new();
    file.take(limit + 1).read_to_end(&mut out)?;
    if out.len() as u64 > limit {
        return Err(std::io::Error::new(
            ErrorKind::InvalidData,
            "larger than any valid one",
        ));
    }
    Ok(out)
}

/// The runtime id of the engine at `state_dir`, minted on first use.
pub(super) fn runtime_id(state_dir: &Path) -> Result<String> {
    let path = id_file(state_dir);
    let read = |path: &Path| -> Result<String> {
        let bytes = read_bounded(path, 256)
            .map_err(|e| Error::from_io(&e, &format!("runtime id {}", path.display())))?;
        let id = String::from_utf8_lossy(&bytes).trim().to_string();
        if !valid_runtime_id(&id) {
            return Err(Error::backend(format!(
                "the runtime id in {} is malformed; restore it from a backup (references \
                 saved on this runtime name it), or remove it to mint a new one",
                path.display()
            )));
        }
        Ok(id)
    };
    match read(&path) {
        Err(Error::NotFound { .. }) => {}
        other => return other,
    }
    let minted = format!("rt-{}", sandcove_core::random_id(20));
    let tmp = state_dir.join(format!(".runtime-id-{}", sandcove_core::random_id(12)));
    let written = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC)
            .open(&tmp)?;
        file.write_all(format!("{minted}\n").as_bytes())?;
        file.sync_all()?;
        match std::fs::hard_link(&tmp, &path) {
            Ok(()) => Ok(()),
            // Another engine won the race: its id is the one.
            Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(()),
            Err(e) => Err(e),
        }
    })();
    let _ = std::fs::remove_file(&tmp);
    written.map_err(|e| Error::from_io(&e, "runtime id"))?;
    read(&path)
}

/// Whether `id` can name a tombstone of `kind`: reference components, `<sandbox>:<n>` for
/// the kinds that live in a sandbox. Keeps every file name a single plain component.
fn valid_key(kind: ResourceKind, id: &str) -> bool {
    let parts: Vec<&str> = id.split(':').collect();
    let expected = if kind.has_parent() { 2 } else { 1 };
    parts.len() == expected && parts.iter().all(|p| valid_runtime_id(p))
}

fn file_of(state_dir: &Path, kind: ResourceKind, id: &str) -> Option<PathBuf> {
    valid_key(kind, id).then(|| tombstones_dir(state_dir).join(format!("{kind}.{id}")))
}

/// The file a sandbox's tombstone is also found by, under its unique name.
fn name_file(state_dir: &Path, name: &str) -> Option<PathBuf> {
    sandcove_core::valid_sandbox_name(name)
        .then(|| tombstones_dir(state_dir).join(format!("name.{name}")))
}

/// Record `tombstone` (and, for a named sandbox, the same under its name), then drop expired
/// and surplus ones. A tombstone already there for the same key is kept (the first end is the
/// one that counts).
pub(super) fn record(state_dir: &Path, tombstone: &Tombstone) -> Result<()> {
    let Some(path) = file_of(state_dir, tombstone.kind, &tombstone.id) else {
        return Err(Error::invalid(format!(
            "{} id {:?} cannot have a tombstone",
            tombstone.kind, tombstone.id
        )));
    };
    let by_name = match (&tombstone.kind, &tombstone.name) {
        (ResourceKind::Sandbox, Some(name)) => name_file(state_dir, name),
        _ => None,
    };
    let dir = tombstones_dir(state_dir);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(|e| Error::from_io(&e, "tombstones directory"))?;
    let text = serde_json::to_vec(tombstone)
        .map_err(|e| Error::backend(format!("encode tombstone: {e}")))?;
    let tmp = dir.join(format!(".tmp-{}", sandcove_core::random_id(12)));
    let written = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC)
            .open(&tmp)?;
        file.write_all(&text)?;
        match std::fs::hard_link(&tmp, &path) {
            Err(e) if e.kind() != ErrorKind::AlreadyExists => return Err(e),
            _ => {}
        }
        if let Some(by_name) = &by_name {
            // A name passes to later sandboxes: the latest end under it is the one to tell.
            std::fs::rename(&tmp, by_name)?;
        }
        Ok(())
    })();
    let _ = std::fs::remove_file(&tmp);
    written.map_err(|e| Error::from_io(&e, "tombstone"))?;
    if prune_due(&dir) {
        prune(&dir, MAX_TOMBSTONES);
    }
    Ok(())
}

/// How often the tombstones are pruned at most. A prune reads the metadata of every
/// tombstone (thousands of `statx` calls once a runtime has ended thousands of resources,
/// 10–15 ms of CPU on the benchmark machine), which every sandbox's end paid when each write
/// pruned. Between prunes a burst of ends can pass [`MAX_TOMBSTONES`] by what ended meanwhile.
const PRUNE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);

/// The file whose modification time says when the tombstones were last pruned.
const PRUNE_MARKER: &str = ".pruned";

/// Whether a prune is due (the last one is over [`PRUNE_INTERVAL`] old, or its time is
/// unknown or in the future); if so, the marker is stamped now, before the prune, so writers
/// ending meanwhile do not prune too. Two writers racing here may both prune: harmless.
fn prune_due(dir: &Path) -> bool {
    let marker = dir.join(PRUNE_MARKER);
    let now = std::time::SystemTime::now();
    let last = std::fs::symlink_metadata(&marker).and_then(|m| m.modified());
    if let Ok(last) = last {
        if now
            .duration_since(last)
            .is_ok_and(|age| age < PRUNE_INTERVAL)
        {
            return false;
        }
    }
    // Unstamped (a read-only directory, a full disk), every write prunes: the safe side.
    let _ = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(&marker)
        .and_then(|file| file.set_modified(now));
    true
}

/// Remove the expired tombstones, then the oldest until at most `keep` remain.
fn prune(dir: &Path, keep: usize) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let now = std::time::SystemTime::now();
    let mut live = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        if name == PRUNE_MARKER {
            continue;
        }
        let Ok(modified) = entry.metadata().and_then(|m| m.modified()) else {
            continue;
        };
        let age = now.duration_since(modified).unwrap_or_default();
        if name.to_string_lossy().starts_with('.') {
            // A writer's temporary file, abandoned if it is this old.
            if age > std::time::Duration::from_secs(60) {
                let _ = std::fs::remove_file(entry.path());
            }
            continue;
        }
        if age > TOMBSTONE_TTL {
            let _ = std::fs::remove_file(entry.path());
        } else {
            live.push((modified, entry.path()));
        }
    }
    if live.len() > keep {
        live.sort();
        let surplus = live.len() - keep;
        for (_, path) in live.into_iter().take(surplus) {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// The live tombstone of `kind` `id`, if any; for a sandbox `id` may also be its unique name
/// (an id is matched first). An id that cannot name one has none.
pub(super) fn lookup(state_dir: &Path, kind: ResourceKind, id: &str) -> Result<Option<Tombstone>> {
    if let Some(path) = file_of(state_dir, kind, id) {
        if let Some(t) = read_tombstone(&path)? {
            if t.kind == kind && t.id == id && t.is_live(sandcove_core::now_millis()) {
                return Ok(Some(t));
            }
        }
    }
    if kind != ResourceKind::Sandbox {
        return Ok(None);
    }
    let Some(path) = name_file(state_dir, id) else {
        return Ok(None);
    };
    Ok(read_tombstone(&path)?.filter(|t| {
        t.kind == kind && t.name.as_deref() == Some(id) && t.is_live(sandcove_core::now_millis())
    }))
}

fn read_tombstone(path: &Path) -> Result<Option<Tombstone>> {
    let bytes = match read_bounded(path, MAX_TOMBSTONE_BYTES) {
        Ok(b) => b,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::from_io(&e, "tombstone")),
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| Error::backend(format!("undecodable tombstone {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "sandcove-refs-{name}-{}-{}",
            std::process::id(),
            sandcove_core::random_id(8)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn the_runtime_id_is_minted_once_and_kept() {
        let dir = scratch("id");
        let first = runtime_id(&dir).unwrap();
        assert!(
            first.starts_with("rt-") && valid_runtime_id(&first),
            "{first}"
        );
        assert_eq!(runtime_id(&dir).unwrap(), first);
        let other = scratch("id2");
        assert_ne!(runtime_id(&other).unwrap(), first);
        // A damaged identity is an error, not silently a new runtime.
        std::fs::write(id_file(&dir), "not an id\n").unwrap();
        assert!(runtime_id(&dir).is_err());
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::remove_dir_all(&other);
    }

    #[test]
    fn tombstones_are_found_by_kind_and_id_and_bounded_in_number() {
        let dir = scratch("tomb");
        let t = Tombstone::now(ResourceKind::Sandbox, "abc", "destroyed");
        record(&dir, &t).unwrap();
        assert_eq!(
            lookup(&dir, ResourceKind::Sandbox, "abc").unwrap(),
            Some(t.clone())
        );
        assert_eq!(lookup(&dir, ResourceKind::Snapshot, "abc").unwrap(), None);
        assert_eq!(lookup(&dir, ResourceKind::Sandbox, "abd").unwrap(), None);
        // The first end counts.
        record(&dir, &Tombstone::now(ResourceKind::Sandbox, "abc", "later")).unwrap();
        assert_eq!(
            lookup(&dir, ResourceKind::Sandbox, "abc")
                .unwrap()
                .unwrap()
                .reason,
            "destroyed"
        );
        // Keys that are not plain components are refused or absent, never a path.
        assert!(record(
            &dir,
            &Tombstone::now(ResourceKind::Volume, "../x", "deleted")
        )
        .is_err());
        assert_eq!(
            lookup(&dir, ResourceKind::Volume, "a/../../x").unwrap(),
            None
        );
        assert_eq!(lookup(&dir, ResourceKind::Preview, "abc").unwrap(), None);
        // A named sandbox is found by its name too; the latest end under a name counts.
        let named = Tombstone::now(ResourceKind::Sandbox, "def", "destroyed")
            .with_name(Some("My.Box".into()));
        record(&dir, &named).unwrap();
        assert_eq!(
            lookup(&dir, ResourceKind::Sandbox, "My.Box").unwrap(),
            Some(named)
        );
        let again = Tombstone::now(ResourceKind::Sandbox, "ghi", "its lease ended")
            .with_name(Some("My.Box".into()));
        record(&dir, &again).unwrap();
        assert_eq!(
            lookup(&dir, ResourceKind::Sandbox, "My.Box")
                .unwrap()
                .unwrap()
                .id,
            "ghi"
        );
        assert_eq!(lookup(&dir, ResourceKind::Volume, "My.Box").unwrap(), None);
        for name in ["name.My.Box", "sandbox.def", "sandbox.ghi"] {
            std::fs::remove_file(tombstones_dir(&dir).join(name)).unwrap();
        }
        let p = Tombstone::now(ResourceKind::Preview, "abc:8080", "closed");
        record(&dir, &p).unwrap();
        assert_eq!(
            lookup(&dir, ResourceKind::Preview, "abc:8080").unwrap(),
            Some(p)
        );
        // An expired one reads as absent.
        let mut old = Tombstone::now(ResourceKind::Volume, "old", "deleted");
        old.ended_at -= TOMBSTONE_TTL.as_millis() as u64 + 1;
        record(&dir, &old).unwrap();
        assert_eq!(lookup(&dir, ResourceKind::Volume, "old").unwrap(), None);
        // The count bound drops the oldest first (ages set explicitly: no clock races).
        let set_age = |name: &str, secs: u64| {
            let file = std::fs::File::options()
                .write(true)
                .open(tombstones_dir(&dir).join(name))
                .unwrap();
            let when = std::time::SystemTime::now() - std::time::Duration::from_secs(secs);
            file.set_modified(when).unwrap();
        };
        for i in 0..5u64 {
            record(
                &dir,
                &Tombstone::now(ResourceKind::Snapshot, format!("s{i}"), "deleted"),
            )
            .unwrap();
            set_age(&format!("snapshot.s{i}"), 10 - i);
        }
        for name in ["sandbox.abc", "preview.abc:8080", "volume.old"] {
            set_age(name, 100);
        }
        prune(&tombstones_dir(&dir), 3);
        let left: Vec<_> = (0..5)
            .filter(|i| {
                lookup(&dir, ResourceKind::Snapshot, &format!("s{i}"))
                    .unwrap()
                    .is_some()
            })
            .collect();
        assert_eq!(left, [2, 3, 4]);
        assert_eq!(lookup(&dir, ResourceKind::Sandbox, "abc").unwrap(), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn writes_prune_at_most_once_per_interval() {
        let dir = scratch("prune-interval");
        let tombs = tombstones_dir(&dir);
        let expire = |name: &str| {
            let file = std::fs::File::options()
                .write(true)
                .open(tombs.join(name))
                .unwrap();
            let when =
                std::time::SystemTime::now() - TOMBSTONE_TTL - std::time::Duration::from_secs(60);
            file.set_modified(when).unwrap();
        };
        // The first write prunes and stamps the marker.
        record(&dir, &Tombstone::now(ResourceKind::Volume, "a", "deleted")).unwrap();
        assert!(tombs.join(PRUNE_MARKER).exists());
        // Within the interval a write leaves an expired file in place (a read ignores it).
        expire("volume.a");
        record(&dir, &Tombstone::now(ResourceKind::Volume, "b", "deleted")).unwrap();
        assert!(
            tombs.join("volume.a").exists(),
            "pruned within the interval"
        );
        // Once the last prune is older than the interval, the next write prunes, and the
        // marker itself is never taken for an abandoned temporary file.
        let marker = std::fs::File::options()
            .write(true)
            .open(tombs.join(PRUNE_MARKER))
            .unwrap();
        marker
            .set_modified(std::time::SystemTime::now() - PRUNE_INTERVAL * 2)
            .unwrap();
        record(&dir, &Tombstone::now(ResourceKind::Volume, "c", "deleted")).unwrap();
        assert!(
            !tombs.join("volume.a").exists(),
            "not pruned after the interval"
        );
        assert!(tombs.join("volume.b").exists() && tombs.join("volume.c").exists());
        assert!(tombs.join(PRUNE_MARKER).exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
