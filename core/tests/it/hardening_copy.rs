//! Hardening, file copy: sandbox code planting links in a tree being copied, or swapping its
//! directories and files (source and destination) for links while the copy runs.
//!
//! The copy runs in the agent, beside sandbox code and with more privilege than it; its own
//! `/proc/1/exe` is the host program's binary. Each test asserts the typed outcome, that
//! nothing outside the copied tree was read into the copy or written through a link, and that
//! host files are unchanged. Runs as root and rootless.

use crate::hardening_common as common;

use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

use sandcove::{
    Command, CopyOptions, ErrorCode, FileKind, ListDirOptions, ProcessSpec, SignalOptions,
};
use sandcove_conformance::{eventually, names_in, unique};

use common::{bash, Canaries, Env};

fn code_of<T>(r: sandcove::Result<T>) -> Option<ErrorCode> {
    r.err().map(|e| e.code())
}

/// The host binary (the agent's `/proc/1/exe`): size, mode, change time.
fn host_binary() -> (u64, u32, i64) {
    let m = std::fs::metadata(std::env::current_exe().expect("exe")).expect("stat");
    (m.len(), m.mode(), m.ctime())
}

/// A tree full of links to host objects (magic links), to absolute and climbing paths and to
/// host paths is copied link for link: every copied entry is a symlink with the same target,
/// nothing it points at is read, and copies whose source or destination pass through `/proc`
/// are refused. A FIFO in a tree is refused promptly, leaving nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_copies_links_as_links_never_what_they_reach() {
    let env = Env::new("copylinks");
    let id = env.sandbox(&unique("copylinks")).await;
    let b = &*env.backend;
    let host_dir = std::env::temp_dir().join(unique("hc-copylinks-canary"));
    let canaries = Canaries::plant(std::slice::from_ref(&host_dir));
    let binary = host_binary();
    let h = host_dir.display();
    let links = [
        ("exe", "/proc/1/exe".to_string()),
        ("agentroot", "/proc/1/root".to_string()),
        ("fds", "/proc/self/fd".to_string()),
        ("abs", "/etc/passwd".to_string()),
        ("up", "../../../../../..".to_string()),
        ("hostpath", format!("{h}/secret")),
        ("hostdir", format!("{h}/dir")),
    ];
    let mut script = String::from("set -e; mkdir -p /workspace/tree/sub; cd /workspace/tree; ");
    for (name, target) in &links {
        script.push_str(&format!("ln -s '{target}' {name}; "));
    }
    script.push_str("echo plain > sub/file");
    let out = bash(b, &id, &script).await;
    assert_eq!(out.exit_code(), 0, "{out:?}");

    let st = b
        .copy(
            &id,
            "/workspace/tree",
            "/workspace/dst",
            CopyOptions::default().recursive(true),
        )
        .await
        .expect("copy the tree");
    assert_eq!(st.kind, FileKind::Dir);
    for (name, target) in &links {
        let st = b
            .stat(&id, &format!("/workspace/dst/{name}"), Default::default())
            .await
            .expect("stat the copied link");
        assert_eq!(
            (st.kind, st.symlink_target.as_deref()),
            (FileKind::Symlink, Some(target.as_str())),
            "{name} is copied as the link itself"
        );
    }
    let all = b
        .list_dir(&id, "/workspace/dst", ListDirOptions::default().depth(8))
        .await
        .expect("list the copy");
    let mut names: Vec<_> = all.iter().map(|s| s.path.clone()).collect();
    names.sort();
    assert_eq!(
        names.len(),
        links.len() + 2,
        "no link was descended: {names:?}"
    );
    // A link as the source of a copy is copied as a link too.
    let st = b
        .copy(
            &id,
            "/workspace/tree/exe",
            "/workspace/exe-copy",
            Default::default(),
        )
        .await
        .expect("copy a link");
    assert_eq!(
        (st.kind, st.symlink_target.as_deref()),
        (FileKind::Symlink, Some("/proc/1/exe"))
    );
    // Through /proc, either way: refused.
    for (from, to) in [
        ("/proc/1/exe", "/workspace/x"),
        ("/proc/1/root/workspace/tree", "/workspace/y"),
        ("/proc/self/root/etc/passwd", "/workspace/z"),
        ("/workspace/tree/sub/file", "/proc/1/cwd/w"),
        ("/workspace/tree/agentroot/etc/passwd", "/workspace/v"),
    ] {
        let r = b
            .copy(&id, from, to, CopyOptions::default().recursive(true))
            .await;
        assert_eq!(
            code_of(r),
            Some(ErrorCode::PermissionDenied),
            "copy {from} -> {to}"
        );
    }
    // A FIFO in a tree: refused at once (never opened), and the partial copy is gone.
    let out = bash(b, &id, "mkdir /workspace/fifo && mkfifo /workspace/fifo/p").await;
    assert_eq!(out.exit_code(), 0, "{out:?}");
    let started = Instant::now();
    let r = b
        .copy(
            &id,
            "/workspace/fifo",
            "/workspace/fifo-copy",
            CopyOptions::default().recursive(true),
        )
        .await;
    assert_eq!(code_of(r), Some(ErrorCode::InvalidArgument), "a FIFO");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "refused promptly"
    );
    assert_eq!(
        names_in(b, &id, "/workspace").await,
        ["dst", "exe-copy", "fifo", "tree"],
        "nothing left of refused copies"
    );
    assert_eq!(host_binary(), binary, "the host binary is unchanged");
    canaries.assert_unchanged("after copying links");
    b.destroy(&id).await.expect("destroy");
    let _ = std::fs::remove_dir_all(&host_dir);
}

/// While a tree is being copied (thousands of small files copied first keep it busy), sandbox
/// code swaps a directory of the source that is still to be copied for a link out of the tree,
/// and the copy's own new directory for a link to a trap directory, every round. The copy never
/// holds what lies outside the source tree, nothing is ever written into the trap (the copy
/// keeps building in the directory it made, wherever that was moved), and host files stay
/// unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_racing_swapped_directories_stays_in_the_tree() {
    let env = Env::new("copyswap");
    let id = env.sandbox(&unique("copyswap")).await;
    let b = &*env.backend;
    let host_dir = std::env::temp_dir().join(unique("hc-copyswap-canary"));
    let canaries = Canaries::plant(std::slice::from_ref(&host_dir));
    let binary = host_binary();
    // Sandbox code as the sandbox's root where it has one (the copy's new directories are
    // root's until they land, and root owns what it moves in the sticky /tmp): the strongest
    // attacker inside. (Sandbox root has no capabilities: it cannot write a user's directory.)
    let as_root = |script: &str| {
        let spec = ProcessSpec::new(Command::argv(["bash", "-c", script]));
        if b.capabilities().multiple_users {
            spec.user("root")
        } else {
            spec
        }
    };
    let setup = sandcove_conformance::run(
        b,
        &id,
        as_root(
            "set -e; mkdir -p /tmp/src/z /tmp/outside /tmp/trap /tmp/stolen /tmp/src/many; \
             for i in $(seq 3000); do echo x > /tmp/src/many/f$i; done; \
             echo inside > /tmp/src/z/f; echo outside-marker > /tmp/outside/marker",
        ),
    )
    .await;
    assert_eq!(setup.exit_code(), 0, "{setup:?}");
    // Once the copy's new tree appears, swap the source's `z` (copied after `many`) for a
    // link out of the tree, and the new tree itself for a link to the trap; then count it.
    let racer = "cd /tmp; touch racing; shopt -s nullglob dotglob; while :; do \
         for t in .dst-*.sandcove-*; do \
           [ -d \"$t\" ] && [ ! -L \"$t\" ] && [ -d src/z ] && [ ! -L src/z ] || continue; \
           mv src/z src/z.real && ln -s /tmp/outside src/z; \
           mv \"$t\" /tmp/stolen/ && ln -s /tmp/trap \"$t\" && echo >> /tmp/swaps; \
         done; done";
    let racer_proc = b.spawn(&id, as_root(racer)).await.expect("racer");
    eventually(Duration::from_secs(20), "the racer runs", || async {
        b.stat(&id, "/tmp/racing", Default::default())
            .await
            .map(drop)
    })
    .await;
    const ROUNDS: usize = 12;
    let mut ok = 0;
    for i in 0..ROUNDS {
        let r = b
            .copy(
                &id,
                "/tmp/src",
                &format!("/tmp/dst-{i}"),
                CopyOptions::default().recursive(true),
            )
            .await;
        match r {
            Ok(_) => ok += 1,
            Err(e) => assert!(
                matches!(
                    e.code(),
                    ErrorCode::PermissionDenied
                        | ErrorCode::NotFound
                        | ErrorCode::InvalidArgument
                        | ErrorCode::Backend
                ),
                "round {i}: {e:?}"
            ),
        }
        // Nothing from outside the tree in the copy (wherever its directory was moved),
        // nothing in the trap; then put the source back and clear up for the next round.
        let check = sandcove_conformance::run(
            b,
            &id,
            as_root(&format!(
                "cd /tmp; grep -rl outside-marker dst-{i} stolen trap; \
                 ls -A trap; [ -L src/z ] && rm src/z && mv src/z.real src/z; \
                 rm -rf dst-{i} stolen/* .dst-*; true"
            )),
        )
        .await;
        assert_eq!(
            check.stdout_lossy(),
            "",
            "round {i}: the copy left the tree"
        );
        assert_eq!(host_binary(), binary, "round {i}: the host binary changed");
    }
    b.signal(
        &id,
        sandcove::ProcessSelector::Pid(racer_proc.pid),
        SignalOptions::new(sandcove::Signal::Kill),
    )
    .await
    .expect("stop the racer");
    let swaps = bash(b, &id, "wc -l < /tmp/swaps 2>/dev/null || echo 0").await;
    let swaps: usize = swaps.stdout_lossy().trim().parse().unwrap_or(0);
    assert!(
        swaps >= 1,
        "the racer never caught a copy in the act: the test proved nothing"
    );
    canaries.assert_unchanged("after the copy race");
    println!(
        "hardening: {ROUNDS} tree copies, {swaps} swapped mid-copy ({ok} succeeded), all in \
         the tree"
    );
    b.destroy(&id).await.expect("destroy");
    let _ = std::fs::remove_dir_all(&host_dir);
}
