//! Hardening, part 9: what one sandbox, or another local user, can make the engine's host
//! hold or write (issue 35): inodes of the sandbox's tmpfs mounts, the engine user's inotify
//! and fanotify instances, the default memory, process and CPU share of a sandbox, and a
//! state directory prepared by someone else.
//!
//! Runs as root and rootless (CI runs this binary again as an unprivileged user).

#[path = "hardening_common.rs"]
mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use sandcove::conformance::unique;
use sandcove::{ErrorCode, LocalBackend};

use common::Env;

// ---------------------------------------------------------------------------------------------
// The state directory (finding 14)
// ---------------------------------------------------------------------------------------------

/// Names in `dir`, sorted (empty when it does not exist).
fn names(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// The engine started over `dir` is refused with `Unavailable` naming `named` and the remedy,
/// and `dir` (and `untouched`) hold what they held before.
fn assert_refused(dir: &Path, named: &Path, untouched: &Path) {
    let (before, target_before) = (names(dir), names(untouched));
    let err = LocalBackend::with_state_dir(dir)
        .map(|_| ())
        .expect_err("an engine over a state directory others control");
    assert_eq!(err.code(), ErrorCode::Unavailable, "{err}");
    let text = err.to_string();
    assert!(
        text.contains(&named.display().to_string()),
        "the error names {}: {text}",
        named.display()
    );
    assert!(text.contains("SANDCOVE_STATE_DIR"), "the remedy: {text}");
    assert_eq!(
        names(dir),
        before,
        "nothing is written in {}",
        dir.display()
    );
    assert_eq!(
        names(untouched),
        target_before,
        "nothing reaches the link's target"
    );
}

/// Finding 14: a local user pre-creates the state directory (or plants a `snapshots` link in
/// it, or leaves it writable by everyone): the engine refuses to start, names the path and
/// the remedy, and writes nothing there or where a link leads. Its own fresh directory is
/// made mode 0700 with every subdirectory.
#[tokio::test(flavor = "multi_thread")]
async fn a_state_directory_others_control_is_refused() {
    let top = std::env::temp_dir().join(unique("hb-state"));
    std::fs::create_dir(&top).unwrap();
    std::fs::set_permissions(&top, std::fs::Permissions::from_mode(0o700)).unwrap();
    // Where a planted link points: the archives would have landed here.
    let elsewhere = top.join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();

    // Another user's directory with a `snapshots` link, as the finding planted it.
    let euid = unsafe_free_euid();
    if euid == 0 {
        let theirs = top.join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::os::unix::fs::symlink(&elsewhere, theirs.join("snapshots")).unwrap();
        std::os::unix::fs::chown(&theirs, Some(54_321), Some(54_321)).unwrap();
        std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_refused(&theirs, &theirs, &elsewhere);
        // Under a directory that user owns, a fresh state directory of root's would be
        // theirs to swap: refused too, nothing made.
        assert_refused(&theirs.join("state"), &theirs, &elsewhere);
    } else {
        // Rootless, no other user's directory can be made: a root-owned one stands for it.
        let root_owned = Path::new("/usr/share");
        assert_eq!(std::fs::metadata(root_owned).unwrap().uid(), 0);
        assert_refused(root_owned, root_owned, &elsewhere);
    }

    // Writable by everyone (the engine's own user made it, carelessly).
    let open = top.join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    assert_refused(&open, &open, &elsewhere);

    // Its own private directory, but with a `snapshots` link planted in it.
    let planted = top.join("planted");
    std::fs::create_dir(&planted).unwrap();
    std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::symlink(&elsewhere, planted.join("snapshots")).unwrap();
    assert_refused(&planted, &planted.join("snapshots"), &elsewhere);

    // The state directory itself a link.
    let link = top.join("link");
    std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
    assert_refused(&link, &link, &elsewhere);

    // A fresh one is made private, and works.
    let fresh = top.join("fresh");
    let env = Env::at(fresh.clone());
    for dir in [
        fresh.clone(),
        fresh.join("sandboxes"),
        fresh.join("snapshots"),
    ] {
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700, "{}", dir.display());
    }
    let id = env.sandbox("state").await;
    env.backend.destroy(&id).await.unwrap();
    env.assert_nothing_left("state").await;
    drop(env);
    std::fs::remove_dir_all(&top).unwrap();
}

/// This process's effective uid (read from procfs: the test needs no `unsafe`).
fn unsafe_free_euid() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    line.split_whitespace().nth(2).unwrap().parse().unwrap()
}
