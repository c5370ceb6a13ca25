//! The monitor spawner (one process per program that forks every sandbox monitor) never
//! makes a monitor with a security state the program has given up. Its own test binary: it
//! sets `no_new_privs` on this process, which nothing else here should run under.

#![cfg(all(target_os = "linux", feature = "local"))]

use std::time::Duration;

use sandcove::{Backend, CreateOptions, LocalBackend};
use sandcove_conformance::{eventually, PATIENCE};

// The helpers of the main test binary; this one uses part of them.
#[allow(dead_code, unused_imports)]
#[path = "it/hardening_common.rs"]
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

/// This program's one live monitor spawner, once any it retired has ended.
fn the_one_spawner() -> u32 {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(eventually(PATIENCE, "one monitor spawner", || async {
        match children_named(std::process::id(), "sandcove-spawn")[..] {
            [one] => Ok(one),
            ref other => Err(other.to_vec()),
        }
    }))
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

/// The tests of this binary share the program's one spawner: one at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The namespace link `kind` of process `pid` (`"self"` for this thread's own).
fn namespace(pid: &str, kind: &str) -> std::path::PathBuf {
    let base = if pid == "self" {
        "/proc/thread-self".to_string()
    } else {
        format!("/proc/{pid}")
    };
    std::fs::read_link(format!("{base}/ns/{kind}")).expect("a namespace link")
}

#[test]
fn a_program_that_entered_another_namespace_gets_monitors_made_in_it() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir =
        StateDir(std::env::temp_dir().join(format!("sandcove-spawner-ns-{}", std::process::id())));
    let backend = LocalBackend::with_state_dir(&dir.0)
        .expect("an engine")
        .with_warm_pool(0);
    // A spawner started as the program is now.
    let first = create_in_a_fresh_runtime(&backend);
    let first_monitor = monitor_of(&first).expect("the first monitor");
    let host_net = namespace("self", "net");
    assert_eq!(namespace(&first_monitor.to_string(), "net"), host_net);

    // A thread of its own: it leaves the test's network namespace, and its runtime's
    // blocking threads (made from it) are in the new one too.
    let moved = std::thread::spawn({
        let backend = backend.clone();
        move || {
            // SAFETY: unshare on this thread only; it takes plain flags.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let netns = namespace("self", "net");
            Ok((create_in_a_fresh_runtime(&backend), netns))
        }
    })
    .join()
    .unwrap();
    match moved {
        Ok((second, netns)) => {
            assert_ne!(netns, host_net);
            let monitor = monitor_of(&second).expect("the second monitor");
            assert_eq!(
                namespace(&monitor.to_string(), "net"),
                netns,
                "a monitor made after the program left its network namespace runs in the old one"
            );
            destroy(&backend, &second);
        }
        Err(e) => eprintln!(
            "SKIPPED: a_program_that_entered_another_namespace_gets_monitors_made_in_it needs \
             CAP_SYS_ADMIN to unshare a network namespace from a threaded test ({e}); \
             rootless programs cannot either, so the case is root's"
        ),
    }
    destroy(&backend, &first);
}

/// The niceness of process `pid` (field 19 of its stat).
fn nice_of(pid: u32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(16)?.parse().ok()
}

#[test]
fn a_program_that_lowered_its_priority_gets_monitors_made_at_it() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = StateDir(
        std::env::temp_dir().join(format!("sandcove-spawner-nice-{}", std::process::id())),
    );
    let backend = LocalBackend::with_state_dir(&dir.0)
        .expect("an engine")
        .with_warm_pool(0);
    let first = create_in_a_fresh_runtime(&backend);
    let first_monitor = monitor_of(&first).expect("the first monitor");
    let ours = nice_of(std::process::id()).expect("our niceness");
    assert_eq!(nice_of(first_monitor), Some(ours));

    // A thread of its own gives up priority (any user may; only privilege takes it back),
    // and so do its runtime's blocking threads, made from it.
    let lowered = (ours + 5).min(19);
    let second = std::thread::spawn({
        let backend = backend.clone();
        move || {
            // SAFETY: setpriority on this thread (Linux: PRIO_PROCESS 0 is the caller).
            assert_eq!(
                unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, lowered) },
                0
            );
            create_in_a_fresh_runtime(&backend)
        }
    })
    .join()
    .unwrap();
    let monitor = monitor_of(&second).expect("the second monitor");
    assert_eq!(
        nice_of(monitor),
        Some(lowered),
        "a monitor made after the program lowered its priority runs at the old one"
    );
    destroy(&backend, &second);
    destroy(&backend, &first);
}

#[test]
fn a_forked_copy_of_the_program_does_not_hold_up_a_new_spawner() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = StateDir(
        std::env::temp_dir().join(format!("sandcove-spawner-fork-{}", std::process::id())),
    );
    let backend = LocalBackend::with_state_dir(&dir.0)
        .expect("an engine")
        .with_warm_pool(0);
    let first = create_in_a_fresh_runtime(&backend);
    // A copy made by fork without exec holds the spawner's socket as well.
    // SAFETY: the child only calls `pause` (async-signal-safe) until it is killed below.
    let copy = unsafe { libc::fork() };
    if copy == 0 {
        loop {
            // SAFETY: as above.
            unsafe { libc::pause() };
        }
    }
    assert!(copy > 0, "fork: {}", std::io::Error::last_os_error());
    // The program's state changes (a thread gives up priority): the next create retires
    // the spawner, which lives on while the copy holds its socket.
    let (done, created) = std::sync::mpsc::channel();
    std::thread::spawn({
        let backend = backend.clone();
        move || {
            let lowered = nice_of(std::process::id()).unwrap_or(0) + 1;
            // SAFETY: setpriority on this thread (Linux: PRIO_PROCESS 0 is the caller).
            unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, lowered.min(19)) };
            let _ = done.send(create_in_a_fresh_runtime(&backend));
        }
    });
    // Bounded only so that a create stuck behind the copy fails instead of hanging.
    let second = created.recv_timeout(Duration::from_secs(60));
    // SAFETY: the copy forked above, by its exact pid.
    unsafe {
        libc::kill(copy, libc::SIGKILL);
        libc::waitpid(copy, std::ptr::null_mut(), 0);
    }
    let second = second.expect("a create waited for a spawner a forked copy keeps alive");
    destroy(&backend, &second);
    destroy(&backend, &first);
}

#[test]
fn a_program_that_took_no_new_privs_gets_monitors_made_with_it() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir =
        StateDir(std::env::temp_dir().join(format!("sandcove-spawner-{}", std::process::id())));
    let backend = LocalBackend::with_state_dir(&dir.0)
        .expect("an engine")
        .with_warm_pool(0);

    let first = create_in_a_fresh_runtime(&backend);
    let old_spawner = the_one_spawner();
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
    // The old spawner was retired (it ends, and is reaped, on its own).
    assert_ne!(
        the_one_spawner(),
        old_spawner,
        "a new spawner serves the new state"
    );

    destroy(&backend, &first);
    destroy(&backend, &second);
}
