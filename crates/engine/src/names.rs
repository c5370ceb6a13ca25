//! Unique sandbox names ([`CreateOptions::name`](sandcove_core::CreateOptions::name)) among the live
//! sandboxes of one state directory, shared by every program of the user.
//!
//! `names/<name>` is a symlink whose target is the id of the sandbox holding the name; it is
//! only ever read (`readlink`), never followed. Taking a name and collecting a stale one run
//! under an exclusive `flock` on `names/.lock`, so two programs creating with one name at
//! once cannot both win, and a stale entry is replaced by exactly one of them.
//!
//! A holder is live while its sandbox's lock is held: first by the creating program (the
//! staging directory's lock, taken before the name), then by the monitor (which inherits that
//! lock). The name is therefore free again as soon as the sandbox's state is removed (destroy,
//! end of lease) or its holder died (a creator or monitor crash) — nothing has to run for the
//! name to be released, so no crash window leaves a name taken forever. The state directory
//! belongs to the engine's user, not to any sandbox, so plain paths are safe here.

use std::io::ErrorKind;
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::{config, lock_is_free, sys};
use sandcove_core::{Error, Result};

fn names_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("names")
}

/// Hold the names lock until the returned file is dropped (blocks: call off the event loop).
fn guard(state_dir: &Path) -> Result<std::fs::File> {
    let dir = names_dir(state_dir);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(|e| Error::from_io(&e, "sandbox names directory"))?;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC)
        .open(dir.join(".lock"))
        .map_err(|e| Error::from_io(&e, "sandbox names lock"))?;
    sys::lock_exclusive(file.as_fd()).map_err(|e| Error::from_io(&e, "sandbox names lock"))?;
    Ok(file)
}

/// Whether sandbox `id` exists: its creator or its monitor holds its lock. The staging
/// directory is checked before the final one, so a create renaming one into the other
/// between the two checks is still seen.
fn holder_alive(state_dir: &Path, id: &str) -> bool {
    if !config::valid_id(id) {
        return false;
    }
    let sandboxes = state_dir.join("sandboxes");
    !lock_is_free(&sandboxes.join(format!(".{id}")).join("lock"))
        || !lock_is_free(&sandboxes.join(id).join("lock"))
}

/// The id a name entry points at; `None` when there is no entry.
fn holder_of(link: &Path) -> Result<Option<String>> {
    match std::fs::read_link(link) {
        Ok(target) => Ok(Some(target.to_string_lossy().into_owned())),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::from_io(&e, "sandbox name entry")),
    }
}

/// Take `name` for sandbox `id`, whose lock the caller already holds. A name held by a live
/// sandbox is [`Error::AlreadyExists`]; a stale entry is replaced.
pub(super) fn claim(state_dir: &Path, name: &str, id: &str) -> Result<()> {
    if !sandcove_core::valid_sandbox_name(name) {
        return Err(sandcove_core::validate::invalid_sandbox_name(name));
    }
    let _guard = guard(state_dir)?;
    let link = names_dir(state_dir).join(name);
    if let Some(holder) = holder_of(&link)? {
        if holder == id {
            return Ok(());
        }
        if holder_alive(state_dir, &holder) {
            return Err(taken(name));
        }
        match std::fs::remove_file(&link) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(Error::from_io(&e, "sandbox name entry")),
        }
    }
    match std::os::unix::fs::symlink(id, &link) {
        Ok(()) => Ok(()),
        // Only a writer ignoring the lock gets here; refusing is the safe answer.
        Err(e) if e.kind() == ErrorKind::AlreadyExists => Err(taken(name)),
        Err(e) => Err(Error::from_io(&e, "sandbox name entry")),
    }
}

/// Give `name` up if sandbox `id` holds it (a create that failed after taking it).
pub(super) fn release(state_dir: &Path, name: &str, id: &str) {
    if !sandcove_core::valid_sandbox_name(name) {
        return;
    }
    let Ok(_guard) = guard(state_dir) else {
        return;
    };
    let link = names_dir(state_dir).join(name);
    if holder_of(&link).ok().flatten().as_deref() == Some(id) {
        let _ = std::fs::remove_file(&link);
    }
}

/// Remove the entries whose holder is gone; returns how many.
pub(super) fn collect_stale(state_dir: &Path) -> usize {
    let dir = names_dir(state_dir);
    if !dir.exists() {
        return 0;
    }
    let Ok(_guard) = guard(state_dir) else {
        return 0;
    };
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return 0;
    };
    let mut collected = 0;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !sandcove_core::valid_sandbox_name(&name) {
            continue;
        }
        let link = entry.path();
        let stale = match holder_of(&link) {
            Ok(Some(holder)) => !holder_alive(state_dir, &holder),
            _ => false,
        };
        if stale && std::fs::remove_file(&link).is_ok() {
            collected += 1;
        }
    }
    collected
}

fn taken(name: &str) -> Error {
    Error::AlreadyExists {
        what: format!("a live sandbox named {name:?}"),
    }
}
