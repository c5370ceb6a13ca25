//! The monitor spawner (one process per program that forks every sandbox monitor) never
//! makes a monitor with a security state the program has given up. Its own test binary: it
//! sets `no_new_privs` on this process, which nothing else here should run under.

#![cfg(all(target_os = "linux", feature = "local"))]

use std::time::Duration;

use sandcove::{Backend, CreateOptions, LocalBackend};

#[path = "hardening_common.rs"]
mod common;

/// An engine's state directory: dropped (after the engine, declared before it), it ends the
/// monitors of sandboxes a failed test left and removes the directory, however the test ends.
struct StateDir(std::path::PathBuf);

impl Drop for StateDir {
    fn drop(&mut self) {
        common::terminate_monitors(&self.0);
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `NoNewPrivs` of process `pid`, from its status.
fn no_new_privs(pid: u32) -> Option<bool> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("NoNewPrivs:"))?;
    Some(line.split_whitespace().nth(1)? == "1")
}

/// Live processes named `comm` whose parent is `parent`.
fn children_named(parent: u32, comm: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let mut rest = stat[close + 1..].split_whitespace();
        let state = rest.next().unwrap_or("Z");
        let ppid: u32 = rest.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        if &stat[open + 1..close] == comm && ppid == parent && state != "Z" {
            found.push(pid);
        }
    }
    found
}

/// The pid of the monitor of sandbox `id`: it holds `<state>/sandboxes/<id>/lock` open.
fn monitor_of(id: &str) -> Option<u32> {
    let suffix = format!("/sandboxes/{id}/lock");
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid = entry.file_name().to_string_lossy().parse::<u32>().ok()?;
            let holds = std::fs::read_dir(entry.path().join("fd"))
                .ok()?
                .flatten()
                .filter_map(|fd| std::fs::read_link(fd.path()).ok())
                .any(|file| file.to_string_lossy().ends_with(&suffix));
            holds.then_some(pid)
        })
}

fn create_in_a_fresh_runtime(backend: &LocalBackend) -> String {
    // A runtime of its own each time: its blocking threads (where monitors are started) are
    // made now, from this thread, and so carry its current `no_new_privs`.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        backend
            .create(CreateOptions::default().timeout(Duration::from_secs(120)))
            .await
            .expect("create")
            .id
    })
}

fn destroy(backend: &LocalBackend, id: &str) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(backend.destroy(id)).expect("destroy");
}

#[test]
fn a_program_that_took_no_new_privs_gets_monitors_made_with_it() {
    let dir =
        StateDir(std::env::temp_dir().join(format!("sandcove-spawner-{}", std::process::id())));
    let backend = LocalBackend::with_state_dir(&dir.0)
        .expect("an engine")
        .with_warm_pool(0);
    let me = std::process::id();

    let first = create_in_a_fresh_runtime(&backend);
    let spawners = children_named(me, "sandcove-spawn");
    assert_eq!(spawners.len(), 1, "one monitor spawner: {spawners:?}");
    let old_spawner = spawners[0];
    assert_eq!(no_new_privs(old_spawner), Some(false));
    let monitor = monitor_of(&first).expect("the first monitor");
    assert_eq!(no_new_privs(monitor), Some(false));

    // SAFETY: a plain prctl on this (the main) thread; it only ever restricts.
    assert_eq!(
        unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) },
        0,
        "PR_SET_NO_NEW_PRIVS: {}",
        std::io::Error::last_os_error()
    );
    let second = create_in_a_fresh_runtime(&backend);
    let monitor = monitor_of(&second).expect("the second monitor");
    assert_eq!(
        no_new_privs(monitor),
        Some(true),
        "a monitor made after the program set no_new_privs runs without it"
    );
    let spawners = children_named(me, "sandcove-spawn");
    assert_eq!(
        spawners.len(),
        1,
        "the old spawner was retired: {spawners:?}"
    );
    assert_ne!(
        spawners[0], old_spawner,
        "a new spawner serves the new state"
    );

    destroy(&backend, &first);
    destroy(&backend, &second);
}
