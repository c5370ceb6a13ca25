//! The state directory's ownership and modes, checked before the engine writes anything there.
//!
//! A root engine writes archives, records and sockets under its state directory; if another
//! user could rename or replace anything on the way there (a directory they own, a
//! world-writable one without the sticky bit, a symlink they planted), the engine's own
//! writes would land where that user chose. So [`prepare`] walks the path from `/` one
//! component at a time through directory descriptors (never by name: a component swapped for
//! a symlink mid-walk is refused by the kernel) and requires:
//!
//! - every directory above the state directory: owned by root or by the engine's user, and
//!   not writable by group or others unless sticky (as `/tmp` is, where others cannot rename
//!   what is not theirs);
//! - the state directory and every subdirectory the engine uses: a real directory (not a
//!   symlink), owned by the engine's user, not writable by group or others.
//!
//! What is missing is made mode `0700`. Every existing entry is checked before anything is
//! made, so a refused directory is left exactly as it was.

use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use super::sys;
use sandcove_core::{Error, Result};

/// Subdirectories the engine makes (mode `0700`) and uses.
const MADE: &[&str] = &["sandboxes", "snapshots", "volumes", "names", "tombstones"];

/// Subdirectories made later, with modes of their own (the shared locale directory is
/// readable by sandboxes; the server's records and the Blaxel proxy's CA belong to
/// `sandcove serve`): checked when present.
const CHECKED: &[&str] = &["locale", "servers", "blaxel-ca"];

/// What to tell the operator whose state directory is refused.
const REMEDY: &str = "remove it, or point SANDCOVE_STATE_DIR at a path whose every directory \
                      belongs to this user or root and is writable by no one else (the engine \
                      makes a missing one, mode 0700)";

/// Check (and make what is missing of) the state directory `dir`, an absolute path, as the
/// module documentation says. Blocking.
pub(super) fn prepare(dir: &Path) -> Result<()> {
    let euid = sys::geteuid();
    let (parent, name) = match (dir.parent(), dir.file_name()) {
        (Some(parent), Some(name)) => (parent, name),
        _ => return Err(refused(dir, "is not a directory the engine can own")),
    };
    // Symlinks above the state directory are the host's layout (`/var/run -> /run`): they
    // are resolved once here, then every directory on the resolved path is checked through
    // descriptors, so one swapped for a link later is refused rather than followed.
    let parent = resolve_existing(parent)?;
    let mut at = sys::open_dir_path(Path::new("/")).map_err(|e| io_refused(Path::new("/"), &e))?;
    check_above(&at, Path::new("/"), euid)?;
    let mut walked = PathBuf::from("/");
    for component in parent.components() {
        let Component::Normal(part) = component else {
            continue;
        };
        walked.push(part);
        at = open_or_make(&at, part, &walked)?;
        check_above(&at, &walked, euid)?;
    }
    let state = open_or_make(&at, name, dir)?;
    check_owned(&state, dir, euid)?;
    // Every entry that exists is checked before any is made: a refusal changes nothing.
    let mut missing = Vec::new();
    for sub in MADE.iter().chain(CHECKED) {
        let path = dir.join(sub);
        match open_entry(&state, OsStr::new(sub), &path)? {
            Some(fd) => check_owned(&fd, &path, euid)?,
            None if MADE.contains(sub) => missing.push(*sub),
            None => {}
        }
    }
    for sub in missing {
        let path = dir.join(sub);
        let made = open_or_make(&state, OsStr::new(sub), &path)?;
        check_owned(&made, &path, euid)?;
    }
    Ok(())
}

/// `path` with its symlinks resolved, for the part of it that exists (the rest appended as
/// written; it is made by the walk).
fn resolve_existing(path: &Path) -> Result<PathBuf> {
    let mut existing = path.to_path_buf();
    let mut rest = Vec::new();
    loop {
        match std::fs::canonicalize(&existing) {
            Ok(resolved) => {
                let mut out = resolved;
                out.extend(rest.iter().rev());
                return Ok(out);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                match (existing.parent(), existing.file_name()) {
                    (Some(parent), Some(name)) => {
                        rest.push(name.to_os_string());
                        existing = parent.to_path_buf();
                    }
                    _ => return Err(io_refused(path, &e)),
                }
            }
            Err(e) => return Err(io_refused(&existing, &e)),
        }
    }
}

/// The directory `name` beneath `dir` (no symlink followed), or `None` where there is none.
fn open_entry(dir: &OwnedFd, name: &OsStr, path: &Path) -> Result<Option<OwnedFd>> {
    match sys::lstat_at(dir.as_fd(), name) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_refused(path, &e)),
        Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFLNK => {
            return Err(refused(path, "is a symbolic link"))
        }
        Ok(st) if st.st_mode & libc::S_IFMT != libc::S_IFDIR => {
            return Err(refused(path, "is not a directory"))
        }
        Ok(_) => {}
    }
    // Opened with no symlink followed: an entry swapped for a link since is refused here.
    sys::open_beneath(
        dir.as_fd(),
        Path::new(name),
        libc::O_PATH | libc::O_DIRECTORY,
        false,
    )
    .map(Some)
    .map_err(|e| match e.raw_os_error() {
        Some(libc::ELOOP) => refused(path, "is a symbolic link"),
        _ => io_refused(path, &e),
    })
}

/// The directory `name` beneath `dir`, made (mode `0700`) when missing.
fn open_or_make(dir: &OwnedFd, name: &OsStr, path: &Path) -> Result<OwnedFd> {
    if let Some(fd) = open_entry(dir, name, path)? {
        return Ok(fd);
    }
    match sys::mkdir_at(dir.as_fd(), name, 0o700) {
        Ok(()) => {}
        // Made by another engine starting at the same time: checked like any other.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io_refused(path, &e)),
    }
    open_entry(dir, name, path)?.ok_or_else(|| refused(path, "vanished while it was made"))
}

/// A directory above the state directory: root's or ours, and writable by no one else unless
/// sticky.
fn check_above(fd: &OwnedFd, path: &Path, euid: u32) -> Result<()> {
    let st = sys::fstat(fd).map_err(|e| io_refused(path, &e))?;
    if st.st_uid != 0 && st.st_uid != euid {
        return Err(refused(
            path,
            &format!(
                "belongs to uid {}, who could replace what lies beneath it (this engine runs \
                 as uid {euid})",
                st.st_uid
            ),
        ));
    }
    if st.st_mode & 0o022 != 0 && st.st_mode & libc::S_ISVTX == 0 {
        return Err(refused(
            path,
            &format!(
                "is writable by group or others without the sticky bit (mode {:o})",
                st.st_mode & 0o7777
            ),
        ));
    }
    Ok(())
}

/// The state directory or one of its subdirectories: ours, and writable by no one else.
fn check_owned(fd: &OwnedFd, path: &Path, euid: u32) -> Result<()> {
    let st = sys::fstat(fd).map_err(|e| io_refused(path, &e))?;
    if st.st_uid != euid {
        return Err(refused(
            path,
            &format!(
                "belongs to uid {}, not to this engine's user (uid {euid})",
                st.st_uid
            ),
        ));
    }
    if st.st_mode & 0o022 != 0 {
        return Err(refused(
            path,
            &format!(
                "is writable by group or others (mode {:o})",
                st.st_mode & 0o7777
            ),
        ));
    }
    Ok(())
}

fn refused(path: &Path, why: &str) -> Error {
    Error::Unavailable {
        reason: format!("the state directory is unsafe: {} {why}", path.display()),
        remedy: REMEDY.into(),
    }
}

fn io_refused(path: &Path, e: &std::io::Error) -> Error {
    Error::Unavailable {
        reason: format!(
            "the state directory cannot be checked: {}: {e}",
            path.display()
        ),
        remedy: REMEDY.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn scratch(tag: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("sc-statedir-{tag}-{}", sandcove_core::random_id(8)));
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        dir
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut out: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        out.sort();
        out
    }

    /// A missing directory (and its missing parents) is made 0700 with every subdirectory;
    /// a second start accepts what the first made.
    #[test]
    fn a_missing_state_directory_is_made_private() {
        let top = scratch("made");
        let dir = top.join("a/b/state");
        prepare(&dir).unwrap();
        for path in [top.join("a"), top.join("a/b"), dir.clone()]
            .into_iter()
            .chain(MADE.iter().map(|s| dir.join(s)))
        {
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o700, "{}", path.display());
        }
        prepare(&dir).unwrap();
        std::fs::remove_dir_all(&top).unwrap();
    }

    /// Writable by others, a symlink, a symlinked or group-writable subdirectory, a parent
    /// writable by others without the sticky bit: each refused naming the path, nothing made.
    #[test]
    fn unsafe_state_directories_are_refused_untouched() {
        let check = |dir: &Path, names: &Path| {
            let before = entries(dir);
            let err = prepare(dir).expect_err("an unsafe state directory");
            assert_eq!(err.code(), sandcove_core::ErrorCode::Unavailable, "{err}");
            let text = err.to_string();
            assert!(text.contains(&names.display().to_string()), "{text}");
            assert!(text.contains("SANDCOVE_STATE_DIR"), "{text}");
            assert_eq!(
                entries(dir),
                before,
                "nothing is made in a refused directory"
            );
        };
        let top = scratch("refused");
        let open = top.join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        check(&open, &open);

        let target = top.join("target");
        std::fs::create_dir(&target).unwrap();
        let link = top.join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let err = prepare(&link).unwrap_err().to_string();
        assert!(err.contains("symbolic link"), "{err}");
        assert!(entries(&target).is_empty());

        let planted = top.join("planted");
        std::fs::create_dir(&planted).unwrap();
        std::os::unix::fs::symlink(&target, planted.join("snapshots")).unwrap();
        check(&planted, &planted.join("snapshots"));
        assert!(entries(&target).is_empty());

        let shared = top.join("shared");
        std::fs::create_dir_all(shared.join("sandboxes")).unwrap();
        std::fs::set_permissions(
            shared.join("sandboxes"),
            std::fs::Permissions::from_mode(0o770),
        )
        .unwrap();
        check(&shared, &shared.join("sandboxes"));

        let loose = top.join("loose");
        std::fs::create_dir(&loose).unwrap();
        std::fs::set_permissions(&loose, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = prepare(&loose.join("state")).unwrap_err().to_string();
        assert!(err.contains("sticky"), "{err}");
        assert!(entries(&loose).is_empty());
        std::fs::remove_dir_all(&top).unwrap();
    }
}
