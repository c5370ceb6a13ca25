//! Landlock: the second filesystem layer under the mount namespace.
//!
//! Once the agent has pivoted into the sandbox root it confines itself, and so every process
//! it starts, to the mount tree beneath that root. Anything on the host that a namespace or
//! path-handling bug could still hand over — a leaked descriptor, a `/proc` magic link, an
//! fd of the old root — lies outside that tree, and opening, creating, executing or
//! truncating through it is refused by the kernel. Scopes (signals, abstract sockets) are
//! not used: separately started sandbox processes must keep signalling each other.
//!
//! A kernel without Landlock is refused at create time unless the operator opts out with
//! [`ALLOW_NO_LANDLOCK_ENV`]: a missing protection is never a silent downgrade.

use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;

use landlock::{
    Access, AccessFs, PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreatedAttr, ABI,
};

use super::sys;
use sandcove_core::{Error, Result};

/// Set to `1` to run sandboxes on a kernel without Landlock (namespaces and seccomp only).
pub const ALLOW_NO_LANDLOCK_ENV: &str = "SANDCOVE_ALLOW_NO_LANDLOCK";

/// The filesystem rights handled: everything up to ABI 5 that the kernel knows.
const HANDLED: ABI = ABI::V5;

/// A ruleset granting every filesystem right beneath `root`, reading (files and directory
/// listings) beneath `readable`, and nothing elsewhere, or `None` when this kernel has no
/// Landlock.
pub fn ruleset_beneath(
    root: &Path,
    readable: Option<BorrowedFd<'_>>,
) -> std::result::Result<Option<OwnedFd>, String> {
    let all = AccessFs::from_all(HANDLED);
    let root = PathFd::new(root).map_err(|e| e.to_string())?;
    let mut created = Ruleset::default()
        .handle_access(all)
        .and_then(|r| r.create())
        .and_then(|r| r.add_rule(PathBeneath::new(root, all)))
        .map_err(|e| e.to_string())?;
    if let Some(dir) = readable {
        let read = AccessFs::ReadFile | AccessFs::ReadDir;
        created = created
            .add_rule(PathBeneath::new(dir, read))
            .map_err(|e| e.to_string())?;
    }
    Ok(created.into())
}

/// Confine the calling process (and all it starts) to the tree beneath `/`, as the agent
/// does after `pivot_root`, and reading beneath `also_readable` (an image sandbox's writable
/// layer, which its snapshots read and no path inside reaches). Errors when Landlock is
/// missing unless `optional`.
pub fn confine_to_root(optional: bool, also_readable: Option<BorrowedFd<'_>>) -> Result<()> {
    let unavailable = |reason: String| Error::Unavailable {
        reason,
        remedy: format!(
            "use Linux 5.13 or later with Landlock enabled (\"landlock\" in the lsm= boot \
             parameter or CONFIG_LSM), or set {ALLOW_NO_LANDLOCK_ENV}=1 to run sandboxes with \
             namespaces and seccomp only"
        ),
    };
    let ruleset = ruleset_beneath(Path::new("/"), also_readable)
        .map_err(|e| unavailable(format!("cannot build the Landlock ruleset: {e}")))?;
    match ruleset {
        Some(fd) => sys::set_no_new_privs()
            .and_then(|()| sys::landlock_restrict_self(fd.as_raw_fd()))
            .map_err(|e| unavailable(format!("cannot enforce Landlock: {e}"))),
        None if optional => Ok(()),
        None => Err(unavailable("this kernel does not enforce Landlock".into())),
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;

    /// The ruleset really confines: a process restricted to one directory reads inside it,
    /// and is refused a file outside it that it could read before.
    #[test]
    fn a_confined_process_cannot_open_files_outside_its_tree() {
        let base = std::env::temp_dir().join(format!("sandcove-landlock-{}", std::process::id()));
        let inside = base.join("inside");
        std::fs::create_dir_all(&inside).unwrap();
        std::fs::write(inside.join("ok"), "in").unwrap();
        std::fs::write(base.join("outside"), "out").unwrap();
        let Some(ruleset) = super::ruleset_beneath(&inside, None).unwrap() else {
            // Loud, not silent: the engine refuses sandboxes on such a kernel.
            eprintln!("SKIPPED: this kernel has no Landlock");
            return;
        };
        let c = |p: std::path::PathBuf| {
            std::ffi::CString::new(p.into_os_string().into_encoded_bytes()).unwrap()
        };
        let (outside, inside_file) = (c(base.join("outside")), c(inside.join("ok")));
        let fd = ruleset.as_raw_fd();
        let mut cmd = std::process::Command::new("/bin/true");
        // SAFETY: only async-signal-safe syscalls between fork and exec (the C strings were
        // made before the fork).
        unsafe {
            cmd.pre_exec(move || {
                super::sys::set_no_new_privs()?;
                super::sys::landlock_restrict_self(fd)?;
                let err = std::io::Error::from_raw_os_error;
                let o = libc::open(outside.as_ptr(), libc::O_RDONLY);
                if o >= 0 {
                    return Err(err(libc::EEXIST)); // reached a file outside the tree
                }
                if libc::open(inside_file.as_ptr(), libc::O_RDONLY) < 0 {
                    return Err(err(libc::ENOTRECOVERABLE)); // refused a file inside
                }
                Ok(())
            });
        }
        // Both checks passed in the child; exec of /bin/true (outside the tree) is then
        // refused as well.
        let err = cmd.spawn().expect_err("exec outside the tree was allowed");
        assert_eq!(err.raw_os_error(), Some(libc::EACCES), "{err}");
        assert_eq!(
            std::fs::read_to_string(base.join("outside")).unwrap(),
            "out"
        );
        std::fs::remove_dir_all(&base).unwrap();
    }
}
