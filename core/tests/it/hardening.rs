//! Hardening, part 1: isolation and bad input, against the embedded engine.
//!
//! Every test here plays the untrusted side: code inside a sandbox (or a path or option a
//! model made up) tries to reach the host or another sandbox, and the test asserts the
//! attempt fails *and* that nothing on the host changed (canary files fingerprinted before and
//! after, host processes checked by pid and marker). Each test runs a private engine
//! ([`common::Env`]) so it can also assert that nothing is left behind.
//!
//! Runs as root and rootless (CI runs this binary again as an unprivileged user).

use crate::hardening_common as common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use sandcove::{
    Backend, ChmodOptions, Command, CreateOptions, ErrorCode, ListDirOptions, MkdirOptions,
    NetworkPolicy, Output, PreviewOptions, PreviewTokenOptions, ProcessSelector, ProcessSpec,
    PtySize, RemoveOptions, ResizePtyOptions, Resources, SetTimeoutOptions, Signal, SignalOptions,
    SnapshotOptions, VolumeMount, WatchOptions, WriteOptions, WriteStdinOptions,
};
use sandcove_conformance::{run, unique};

use common::{bash, bytes, has_python, python, read_all, Canaries, Env, Gen, HostSleeper};

/// The monitor serves lifecycle requests and the agent processes and files; a request sent to
/// the wrong one (a buggy or foreign client) is refused with a typed error and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misrouted_requests_are_refused_by_monitor_and_agent() {
    use sandcove::backend::local::PROTOCOL_VERSION;
    let env = Env::new("misroute");
    let id = env.sandbox("misroute").await;
    let version = serde_json::json!(PROTOCOL_VERSION);

    // An agent request (spawning a process) put in the monitor's hello.
    let spec = ProcessSpec::new(Command::argv(["/bin/true"]));
    let spawn = serde_json::json!({"op": "spawn", "spec": spec});
    let reply = common::raw_exchange(
        &env.dir,
        &id,
        &[serde_json::json!({"version": version, "request": spawn})],
    )
    .await
    .expect("the monitor answers");
    assert_eq!(reply["kind"], "error", "{reply}");
    assert_eq!(reply["error"]["code"], "invalid_argument", "{reply}");
    assert!(
        reply["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("served by the sandbox agent")),
        "{reply}"
    );
    let processes = env
        .backend
        .list_processes(&id)
        .await
        .expect("list processes");
    assert!(processes.is_empty(), "nothing was started: {processes:?}");

    // A monitor request (destroy) handed to the agent.
    let reply = common::raw_exchange(
        &env.dir,
        &id,
        &[
            serde_json::json!({"version": version}),
            serde_json::json!({"op": "destroy"}),
        ],
    )
    .await
    .expect("the agent answers");
    assert_eq!(reply["kind"], "error", "{reply}");
    assert_eq!(reply["error"]["code"], "invalid_argument", "{reply}");
    assert!(
        reply["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("served by the sandbox monitor")),
        "{reply}"
    );
    let info = env
        .backend
        .get(&id)
        .await
        .expect("the sandbox is still there");
    assert_eq!(info.state, sandcove::SandboxState::Running);
    env.backend.destroy(&id).await.expect("destroy");
}

/// A stand-in for a sandbox made by a Sandcove release speaking protocol v1: its state directory
/// (a record without a protocol version, the info `list` reads, the lock its monitor holds) and a
/// monitor answering exactly as v1's did: `info` and `destroy` in v1, any other version refused
/// with v1's untyped error.
struct V1Monitor {
    _lock: std::fs::File,
    served: tokio::task::JoinHandle<Vec<u64>>,
}

impl V1Monitor {
    async fn start(state_dir: &Path, id: &str, info: serde_json::Value) -> V1Monitor {
        use std::os::fd::AsRawFd;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let dir = state_dir.join("sandboxes").join(id);
        std::fs::create_dir_all(&dir).expect("the v1 state directory");
        std::fs::write(
            dir.join("record.json"),
            serde_json::json!({ "id": id }).to_string(),
        )
        .expect("the v1 record");
        std::fs::write(dir.join("info.json"), info.to_string()).expect("the v1 info");
        let lock = std::fs::File::create(dir.join("lock")).expect("the lock file");
        // SAFETY: flock on a descriptor this function owns; no memory is involved.
        let locked = unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        assert_eq!(locked, 0, "hold the monitor lock");
        let listener = tokio::net::UnixListener::bind(dir.join("sock")).expect("the socket");
        let served = tokio::spawn(async move {
            let mut versions = Vec::new();
            loop {
                let (mut stream, _) = listener.accept().await.expect("accept");
                let mut prefix = [0u8; 8];
                if stream.read_exact(&mut prefix).await.is_err() {
                    continue;
                }
                let hlen = u32::from_le_bytes(prefix[..4].try_into().unwrap()) as usize;
                let mut head = vec![0u8; hlen];
                stream.read_exact(&mut head).await.expect("the hello");
                let hello: serde_json::Value = serde_json::from_slice(&head).expect("JSON");
                let version = hello["version"].as_u64().unwrap_or(0);
                versions.push(version);
                let (reply, destroyed) = if version != 1 {
                    let message = format!(
                        "protocol version mismatch: the client speaks v{version}, this sandbox \
                         v1; use the same Sandcove version that created the sandbox"
                    );
                    let error = sandcove::Error::Backend {
                        message,
                        retryable: false,
                    };
                    (
                        serde_json::json!({"kind": "error", "error": error.to_body()}),
                        false,
                    )
                } else if hello["request"]["op"] == "info" {
                    (serde_json::json!({"kind": "info", "info": info}), false)
                } else if hello["request"]["op"] == "destroy" {
                    std::fs::remove_dir_all(&dir).expect("remove the v1 state");
                    (serde_json::json!({"kind": "done"}), true)
                } else {
                    panic!("a v1 request this test does not expect: {hello}");
                };
                let head = reply.to_string().into_bytes();
                let mut frame = (head.len() as u32).to_le_bytes().to_vec();
                frame.extend_from_slice(&0u32.to_le_bytes());
                frame.extend_from_slice(&head);
                let _ = stream.write_all(&frame).await;
                if destroyed {
                    return versions;
                }
            }
        });
        V1Monitor {
            _lock: lock,
            served,
        }
    }
}

/// A sandbox whose monitor speaks another protocol version (here v1, made by an older
/// release) is listed and described with a note saying so, refuses every other operation with a
/// typed error naming the remedy, and is destroyed like any other, leaving nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_of_another_protocol_version_is_listed_refused_and_destroyed() {
    use sandcove::backend::local::PROTOCOL_VERSION;
    assert_ne!(
        PROTOCOL_VERSION, 1,
        "this build speaks a newer protocol than v1"
    );
    let env = Env::new("v1mon");
    let current = env.sandbox("v1mon").await;
    let mut info = serde_json::to_value(env.backend.get(&current).await.expect("get")).unwrap();
    let old = "v1sandbox0000000000a";
    info["id"] = serde_json::json!(old);
    let v1 = V1Monitor::start(&env.dir, old, info).await;

    let listed = env.backend.list(Default::default()).await.expect("list");
    let find = |id: &str| listed.iter().find(|i| i.id == id).cloned();
    let listed_old = find(old).expect("the v1 sandbox is listed");
    let note = listed_old.note.clone().expect("a note on the v1 sandbox");
    assert!(note.contains("v1") && note.contains("recreate"), "{note}");
    assert_eq!(listed_old.state, sandcove::SandboxState::Running);
    assert_eq!(
        find(&current).expect("the current one is listed").note,
        None
    );

    let got = env
        .backend
        .get(old)
        .await
        .expect("get works across versions");
    assert_eq!(got.id, old);
    assert_eq!(got.note.as_deref(), Some(note.as_str()));

    let refusals = [
        env.backend
            .spawn(old, ProcessSpec::new(Command::argv(["/bin/true"])))
            .await
            .map(|_| ())
            .unwrap_err(),
        env.backend
            .set_timeout(old, SetTimeoutOptions::new(Duration::from_secs(60)))
            .await
            .map(|_| ())
            .unwrap_err(),
        env.backend
            .stat(old, "/", Default::default())
            .await
            .map(|_| ())
            .unwrap_err(),
        env.backend.pause(old).await.map(|_| ()).unwrap_err(),
    ];
    for err in refusals {
        match &err {
            sandcove::Error::Unavailable { reason, remedy } => {
                assert!(reason.contains("v1"), "{reason}");
                assert!(remedy.contains("recreate the sandbox"), "{remedy}");
            }
            other => panic!("expected a typed version refusal, got {other:?}"),
        }
    }

    env.backend
        .destroy(old)
        .await
        .expect("destroy works across versions");
    let versions = tokio::time::timeout(common::PATIENCE, v1.served)
        .await
        .expect("the v1 monitor saw its destroy")
        .expect("the v1 monitor");
    assert_eq!(
        versions.iter().filter(|v| **v == 1).count(),
        2,
        "get and destroy spoke v1, the rest this build's version: {versions:?}"
    );
    assert!(!env.dir.join("sandboxes").join(old).exists());
    assert!(env.backend.get(old).await.unwrap_err().is_not_found());
    let listed = env.backend.list(Default::default()).await.expect("list");
    assert!(listed.iter().all(|i| i.id != old), "{listed:?}");
    env.backend.destroy(&current).await.expect("destroy");
}

/// Run a bash script that searches for `marker`, passed as `$M` so the script's own command
/// line does not contain it.
async fn bash_seeking(backend: &dyn Backend, id: &str, marker: &str, script: &str) -> Output {
    run(
        backend,
        id,
        ProcessSpec::new(Command::argv(["bash", "-c", script])).env("M", marker),
    )
    .await
}

/// Whether `path` is under a host directory the sandbox sees read-only (then it is visible
/// inside by design, and "host-only" checks do not apply to it).
fn shared_with_sandboxes(path: &Path) -> bool {
    [
        "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt",
    ]
    .iter()
    .any(|d| path.starts_with(d))
}

fn host_names(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|e| {
            e.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------------
// Host files
// ---------------------------------------------------------------------------------------------

/// The repository checkout, the state directory (with another sandbox's directory in it),
/// `/root`, `$HOME` and a host temp dir cannot be read or listed from inside, by a process or
/// through the file API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_only_paths_cannot_be_read_or_listed() {
    let env = Env::new("paths");
    let marker = unique("paths");
    let a = env.sandbox(&marker).await;
    let b = env.sandbox(&marker).await;
    let b_secret = format!("b-secret-{marker}");
    env.backend
        .write_file(
            &b,
            &format!("/workspace/{b_secret}"),
            bytes(b"b's data"),
            WriteOptions::default(),
        )
        .await
        .expect("write b's file");
    let canary_dir = std::env::temp_dir().join(unique("hc-host-canary"));
    let canaries = Canaries::plant(&[canary_dir.clone(), env.dir.join("canary")]);

    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let b_state = env.dir.join("sandboxes").join(&b);
    let targets: Vec<PathBuf> = vec![
        canary_dir.join("secret"),
        canary_dir.join("dir"),
        env.dir.join("canary/secret"),
        b_state.clone(),
        b_state.join("record.json"),
        b_state.join("sock"),
        manifest.join("Cargo.toml"),
        manifest.join("src"),
        manifest.join("tests/it/hardening.rs"),
    ];
    let mut tried = 0;
    for target in &targets {
        if shared_with_sandboxes(target) {
            eprintln!(
                "SKIP {}: under a system directory sandboxes see read-only",
                target.display()
            );
            continue;
        }
        let t = target.display();
        let out = bash(
            &*env.backend,
            &a,
            &format!("cat '{t}' 2>&1; echo \"cat=$?\"; ls -A '{t}' 2>&1; echo \"ls=$?\""),
        )
        .await;
        let text = out.stdout_lossy();
        assert!(
            !text.contains("cat=0") && !text.contains("ls=0"),
            "{t} is reachable inside: {text}"
        );
        assert!(!text.contains("must stay unread"), "{t} leaked: {text}");
        let read = read_all(&*env.backend, &a, &target.to_string_lossy()).await;
        assert!(read.is_err(), "file API read {t}: {read:?}");
        let listed = env
            .backend
            .list_dir(
                &a,
                &target.to_string_lossy(),
                ListDirOptions::default().depth(2),
            )
            .await;
        assert!(listed.is_err(), "file API list {t}: {listed:?}");
        let stat = env
            .backend
            .stat(&a, &target.to_string_lossy(), Default::default())
            .await;
        assert_eq!(
            stat.map(|s| s.path).map_err(|e| e.code()),
            Err(ErrorCode::NotFound),
            "file API stat {t}"
        );
        tried += 1;
    }
    // `/root` and `$HOME` exist inside (the sandbox's own, empty), never with the host's
    // entries in them.
    let home = std::env::var("HOME").unwrap_or_default();
    for dir in ["/root", home.as_str()] {
        if dir.is_empty() || shared_with_sandboxes(Path::new(dir)) {
            continue;
        }
        let host = host_names(Path::new(dir));
        let out = bash(&*env.backend, &a, &format!("ls -A '{dir}' 2>/dev/null")).await;
        let inside: Vec<String> = out.stdout_lossy().lines().map(str::to_string).collect();
        let leaked: Vec<&String> = inside.iter().filter(|n| host.contains(n)).collect();
        assert!(
            leaked.is_empty(),
            "host entries of {dir} visible: {leaked:?}"
        );
        if let Ok(entries) = env
            .backend
            .list_dir(&a, dir, ListDirOptions::default().depth(1))
            .await
        {
            let leaked: Vec<String> = entries
                .into_iter()
                .map(|e| e.name)
                .filter(|n| host.contains(n))
                .collect();
            assert!(leaked.is_empty(), "file API lists host {dir}: {leaked:?}");
        }
        tried += 1;
    }
    // The other sandbox's file is nowhere in this one, not even through /proc.
    let out = bash(
        &*env.backend,
        &a,
        &format!(
            "find / -xdev -name '{b_secret}' 2>/dev/null; \
             cat /proc/*/root/workspace/{b_secret} 2>/dev/null; \
             ls /workspace"
        ),
    )
    .await;
    assert!(
        !out.stdout_lossy().contains(&b_secret),
        "b's file seen from a: {}",
        out.stdout_lossy()
    );
    assert_eq!(
        read_all(&*env.backend, &b, &format!("/workspace/{b_secret}"))
            .await
            .expect("b still has it"),
        b"b's data"
    );
    canaries.assert_unchanged("reading host paths");
    println!("hardening: {tried} host-only paths refused inside and through the file API");
    let _ = std::fs::remove_dir_all(&canary_dir);
}

/// Writes to `/usr` and `/etc` fail, from a process and through the file API (which runs
/// with the sandbox root's capabilities), and the host's files are unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn system_directories_cannot_be_changed() {
    let env = Env::new("sysdirs");
    let id = env.sandbox(&unique("sysdirs")).await;
    let m = unique("hc");
    let watched = [
        "/etc/passwd",
        "/etc/group",
        "/etc/hostname",
        "/etc/hosts",
        "/usr/bin/env",
    ];
    let fingerprint = || -> Vec<(String, Vec<u8>, u32)> {
        use std::os::unix::fs::MetadataExt;
        watched
            .iter()
            .map(|p| {
                (
                    p.to_string(),
                    std::fs::read(p).unwrap_or_default(),
                    std::fs::metadata(p).map(|m| m.mode()).unwrap_or(0),
                )
            })
            .collect()
    };
    let before = fingerprint();
    // Only under directories the host has (and so the sandbox binds read-only).
    let created: Vec<String> = ["/usr", "/usr/bin", "/etc", "/opt", "/usr/lib"]
        .iter()
        .filter(|d| Path::new(d).is_dir())
        .map(|d| format!("{d}/{m}"))
        .collect();
    let script = format!(
        "for p in {list}; do touch $p; mkdir $p.d; echo x > $p.w; ln -s / $p.l; done; \
         chmod 777 /usr/bin/env; rm -f /etc/hostname /etc/hosts; mv /etc/group /etc/g2; \
         echo owned >> /etc/passwd; mount -o remount,rw /usr; mount -o remount,bind,rw /etc; \
         touch /usr/{m}.after-remount; \
         unshare -Urm sh -c 'mount -o remount,bind,rw /usr; touch /usr/{m}.nested' 2>/dev/null; \
         true",
        list = created.join(" ")
    );
    let out = bash(&*env.backend, &id, &script).await;
    assert!(out.exit_status().success());
    // Through the file API.
    let mut refused = 0;
    for p in &created {
        let w = env
            .backend
            .write_file(&id, p, bytes(b"x"), WriteOptions::default())
            .await;
        let d = env
            .backend
            .mkdir(&id, &format!("{p}.dir"), MkdirOptions::default())
            .await;
        assert!(w.is_err() && d.is_err(), "{p}: write {w:?} mkdir {d:?}");
        refused += 2;
    }
    let attempts = [
        env.backend
            .chmod(&id, "/usr/bin/env", ChmodOptions::new(0o777))
            .await
            .err(),
        env.backend
            .remove(&id, "/usr/bin/env", RemoveOptions::default())
            .await
            .err(),
        env.backend
            .remove(&id, "/etc", RemoveOptions::default().recursive(true))
            .await
            .err(),
        env.backend
            .rename(&id, "/etc/hosts", "/workspace/hosts", Default::default())
            .await
            .err(),
        env.backend
            .rename(&id, "/workspace", "/usr/workspace", Default::default())
            .await
            .err(),
        env.backend
            .write_file(
                &id,
                "/usr/bin/env",
                bytes(b"#!/bin/sh\necho owned\n"),
                WriteOptions::default(),
            )
            .await
            .err(),
    ];
    for (i, a) in attempts.iter().enumerate() {
        assert!(a.is_some(), "file API attempt {i} succeeded");
        refused += 1;
    }
    // Appending to the sandbox's own /etc/passwd may work: it is a private copy.
    let _ = env
        .backend
        .write_file(
            &id,
            "/etc/passwd",
            bytes(b"owned::0:0::/:/bin/sh\n"),
            WriteOptions::default().append(true),
        )
        .await;
    assert_eq!(fingerprint(), before, "host system files changed");
    for p in &created {
        for suffix in ["", ".d", ".w", ".l", ".dir", ".after-remount", ".nested"] {
            let host = format!("{p}{suffix}");
            assert!(
                std::fs::symlink_metadata(&host).is_err(),
                "{host} appeared on the host"
            );
        }
    }
    println!("hardening: {refused} file API writes to system directories refused");
}

/// Sandbox processes hold no capability, cannot gain one (no_new_privs, nosuid), cannot look
/// into PID 1 (the agent, which carries the host program's environment), and do not inherit
/// the host program's environment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_processes_hold_no_privileges_and_no_host_environment() {
    let env = Env::new("privs");
    let id = env.sandbox(&unique("privs")).await;
    let out = bash(
        &*env.backend,
        &id,
        "grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status; \
         for f in environ maps mem; do cat /proc/1/$f >/dev/null 2>&1 && echo \"read /proc/1/$f\"; done; \
         ls /proc/1/fd >/dev/null 2>&1 && echo 'listed /proc/1/fd'; \
         ls /proc/1/root/ >/dev/null 2>&1 && echo 'entered /proc/1/root'; \
         for c in 'sudo -n true' 'su root -c true'; do $c </dev/null >/dev/null 2>&1 && echo \"ran $c\"; done; \
         echo ENV; env",
    )
    .await;
    let text = out.stdout_lossy();
    let (status, environment) = text.split_once("ENV\n").expect("both parts");
    for cap in ["CapInh", "CapPrm", "CapEff", "CapAmb"] {
        let line = status
            .lines()
            .find(|l| l.starts_with(cap))
            .unwrap_or_else(|| panic!("{cap} missing: {status}"));
        let value = line.split_whitespace().nth(1).unwrap_or("?");
        assert!(
            value.chars().all(|c| c == '0'),
            "sandbox process holds {line}"
        );
    }
    assert!(status.contains("NoNewPrivs:\t1"), "{status}");
    for escape in [
        "read /proc/1/",
        "listed /proc/1/fd",
        "entered /proc/1/root",
        "ran ",
    ] {
        assert!(!status.contains(escape), "{status}");
    }
    // Nothing of this program's environment crosses, bar the names every process gets.
    let own = [
        "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "PWD", "SHLVL", "_", "OLDPWD",
    ];
    let inside: Vec<&str> = environment
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, _)| k))
        .collect();
    let leaked: Vec<String> = std::env::vars()
        .map(|(k, _)| k)
        .filter(|k| !own.contains(&k.as_str()) && inside.contains(&k.as_str()))
        .collect();
    assert!(leaked.is_empty(), "host environment leaked: {leaked:?}");
    assert!(
        !environment.contains(&*env.dir.to_string_lossy()),
        "the host state path leaked"
    );
}

/// Every sandbox process runs under the engine's seccomp filter, inherited from the agent
/// (which installs it on itself once): one filter more than this test program runs under,
/// the agent the same, and the calls the filter refuses stay refused while threads work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_processes_run_under_the_agents_seccomp_filter() {
    let filters = |status: &str| -> Option<u32> {
        status
            .lines()
            .find_map(|l| l.strip_prefix("Seccomp_filters:"))
            .and_then(|v| v.trim().parse().ok())
    };
    let own = filters(&std::fs::read_to_string("/proc/self/status").unwrap())
        .expect("this kernel reports Seccomp_filters");
    let env = Env::new("seccomp");
    let id = env.sandbox(&unique("seccomp")).await;
    for pid in ["self", "1"] {
        let out = bash(&*env.backend, &id, &format!("cat /proc/{pid}/status")).await;
        let status = out.stdout_lossy();
        assert!(status.contains("Seccomp:\t2"), "{pid}: {status}");
        assert_eq!(filters(&status), Some(own + 1), "{pid}: {status}");
    }
    if !has_python(&*env.backend, &id).await {
        return;
    }
    let probe = format!(
        "import ctypes, threading\n\
         libc = ctypes.CDLL(None, use_errno=True)\n\
         def errno(nr, *args):\n\
         \x20   ctypes.set_errno(0)\n\
         \x20   r = libc.syscall(nr, *[ctypes.c_long(a) for a in args])\n\
         \x20   return 0 if r != -1 else ctypes.get_errno()\n\
         limit = (ctypes.c_ulong * 2)(64, 64)\n\
         print(errno({unshare}, {newuser}), errno({unshare}, {newns}), errno({keyctl}, 0, 0),\n\
         \x20     errno({uring}, 1, 0), errno({bpf}, 0, 0, 0), errno({mount}, 0, 0, 0, 0, 0),\n\
         \x20     errno({prlimit}, 1, 7, ctypes.addressof(limit), 0),\n\
         \x20     errno({clone3}, 0, 0), errno({prlimit}, 0, 7, 0, ctypes.addressof(limit)),\n\
         \x20     errno({quotactl_fd}, -1, 0x80000400, 0, 0), errno({mount_setattr}, -1, 0, 0, 0, 0))\n\
         t = threading.Thread(target=print, args=('thread ok',)); t.start(); t.join()\n",
        unshare = libc::SYS_unshare,
        newuser = libc::CLONE_NEWUSER,
        newns = libc::CLONE_NEWNS,
        keyctl = libc::SYS_keyctl,
        uring = libc::SYS_io_uring_setup,
        bpf = libc::SYS_bpf,
        mount = libc::SYS_mount,
        prlimit = libc::SYS_prlimit64,
        clone3 = libc::SYS_clone3,
        quotactl_fd = libc::SYS_quotactl_fd,
        mount_setattr = libc::SYS_mount_setattr,
    );
    let out = python(&*env.backend, &id, &probe).await;
    let (eperm, enosys) = (libc::EPERM, libc::ENOSYS);
    assert_eq!(
        out,
        format!(
            "{eperm} {eperm} {eperm} {eperm} {eperm} {eperm} {eperm} {enosys} 0 {eperm} {eperm}\n\
             thread ok\n"
        ),
        "errno of unshare(user), unshare(mount), keyctl, io_uring_setup, bpf, mount, \
         prlimit64(PID 1, set), clone3, prlimit64(self, get), quotactl_fd, mount_setattr"
    );
}

/// The capability sets, `NoNewPrivs` and `Seccomp` lines of a `/proc/<pid>/status` text,
/// checked: no capability in any set, `no_new_privs` on, a seccomp filter in force.
fn assert_unprivileged(status: &str, who: &str) {
    for field in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        let line = status
            .lines()
            .find(|l| l.starts_with(&format!("{field}:")))
            .unwrap_or_else(|| panic!("{who}: {field} missing: {status}"));
        let value = line.split_whitespace().nth(1).unwrap_or("?");
        assert!(
            !value.is_empty() && value.chars().all(|c| c == '0'),
            "{who} holds {line}"
        );
    }
    assert!(status.contains("NoNewPrivs:\t1"), "{who}: {status}");
    assert!(status.contains("Seccomp:\t2"), "{who}: {status}");
}

/// Every capability set of a sandbox process is empty, the bounding and inheritable sets
/// included (the agent empties the bounding set once and keeps its own capabilities in the
/// inheritable set, which each sandbox process clears), for the default user and for the
/// sandbox's root: an `execve` as uid 0 (every program root runs) regains nothing. A
/// setuid-root program run by a user other than root (`su`, stopped at its password prompt)
/// holds nothing either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_processes_have_an_empty_bounding_set() {
    let env = Env::new("capbnd");
    let id = env.sandbox(&unique("capbnd")).await;
    let b = &*env.backend;
    let fields = "grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):'";
    let mut users = vec![None];
    if b.capabilities().multiple_users {
        users.push(Some("root"));
    }
    for user in users {
        let mut spec = ProcessSpec::new(Command::argv([
            "bash",
            "-c",
            &format!("id -u; {fields} /proc/self/status"),
        ]));
        if let Some(u) = user {
            spec = spec.user(u);
        }
        let out = run(b, &id, spec).await;
        let text = out.stdout_lossy();
        let (uid, status) = text.split_once('\n').expect("uid, then status");
        if user == Some("root") {
            assert_eq!(uid, "0", "{text}");
        }
        assert_unprivileged(status, &format!("a process of uid {uid}"));
    }
    // su waits for a password on its stdin (a pipe nobody writes); its status is read then.
    let probe = format!(
        "[ \"$(id -u)\" = 0 ] && {{ echo 'SKIP the default user is root'; exit; }}; \
         [ -u /usr/bin/su ] || {{ echo 'SKIP no setuid su'; exit; }}; \
         sleep 600 | /usr/bin/su -c true root >/tmp/su.out 2>&1 & pid=$!; \
         i=0; until grep -q Password /tmp/su.out || [ $i -ge 2000 ]; do \
           kill -0 $pid 2>/dev/null || break; sleep 0.01; i=$((i+1)); done; \
         grep -q Password /tmp/su.out || {{ echo 'SKIP su did not prompt'; cat /tmp/su.out; exit; }}; \
         echo \"exe $(readlink /proc/$pid/exe)\"; {fields} /proc/$pid/status; kill $pid"
    );
    let out = bash(b, &id, &probe).await;
    let text = out.stdout_lossy();
    if let Some(why) = text.strip_prefix("SKIP ") {
        // Loud, not silent: the check needs a setuid-root su and a user other than root.
        eprintln!("SKIPPED the setuid part: {}", why.trim());
        return;
    }
    assert!(text.starts_with("exe /usr/bin/su\n"), "{text}");
    assert_unprivileged(&text, "setuid-root su run by a user");
}

/// The agent's own helpers keep the capabilities they need after the bounding set is emptied:
/// a snapshot's `tar` reads files no user can read (mode 000 in a directory of mode 000, owned
/// by a user other than root where there is one) and the fork's `tar` restores them with their
/// owners and modes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forks_keep_unreadable_files_with_their_owners_and_modes() {
    let env = Env::new("capfork");
    let id = env.sandbox(&unique("capfork")).await;
    let b = &*env.backend;
    let user = bash(
        b,
        &id,
        "set -e; id -un; mkdir /workspace/locked; echo user-secret > /workspace/locked/f; \
         chmod 000 /workspace/locked/f /workspace/locked",
    )
    .await;
    assert_eq!(user.exit_code(), 0, "{user:?}");
    let user = user.stdout_lossy().trim().to_string();
    let as_root = |script: &str| {
        let spec = ProcessSpec::new(Command::argv(["bash", "-c", script]));
        if b.capabilities().multiple_users {
            spec.user("root")
        } else {
            spec
        }
    };
    let made = run(
        b,
        &id,
        as_root("set -e; id -un; echo root-secret > /root/r; chmod 000 /root/r"),
    )
    .await;
    assert_eq!(made.exit_code(), 0, "{made:?}");
    let root = made.stdout_lossy().trim().to_string();
    let forked = b
        .fork(&id, env.options(&unique("capfork-copy")))
        .await
        .expect("fork")
        .id;
    let seen = bash(
        b,
        &forked,
        "stat -c '%U %a' /workspace/locked; chmod 700 /workspace/locked; \
         stat -c '%U %a' /workspace/locked/f; chmod 600 /workspace/locked/f; \
         cat /workspace/locked/f",
    )
    .await;
    assert_eq!(
        seen.stdout_lossy(),
        format!("{user} 0\n{user} 0\nuser-secret\n"),
        "{seen:?}"
    );
    let seen = run(
        b,
        &forked,
        as_root("stat -c '%U %a' /root/r; chmod 600 /root/r; cat /root/r"),
    )
    .await;
    assert_eq!(
        seen.stdout_lossy(),
        format!("{root} 0\nroot-secret\n"),
        "{seen:?}"
    );
}

/// A loader for the agent's `tar`, with no C library: it copies `/proc/self/status` (its
/// capability sets) to `/tmp/proof` and exits 1. And a program that swaps the directory
/// `FROM` for `FROM.new` with two renames (no dynamic loading between them).
const LOADER_SWAP_C: &str = r#"
static long sys(long n, long a, long b, long c) {
    long r;
    __asm__ volatile("syscall" : "=a"(r) : "a"(n), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
    return r;
}
#ifdef FROM
void _start(void) {
    long r = sys(82, (long)FROM, (long)(FROM ".orig"), 0);
    if (r == 0)
        r = sys(82, (long)(FROM ".new"), (long)FROM, 0);
    sys(60, r == 0 ? 0 : 1, 0, 0);
}
#else
void _start(void) {
    char buf[4096];
    long i = sys(2, (long)"/proc/self/status", 0, 0);
    long o = sys(2, (long)"/tmp/proof", 01 | 0100 | 01000, 0644);
    long n = sys(0, i, (long)buf, sizeof buf);
    sys(1, o, (long)buf, n);
    sys(60, 1, 0, 0);
}
#endif
"#;

/// Red-team pass 6, finding 2: the agent's `tar` (snapshots and forks), which holds every
/// capability of the sandbox's namespaces, was loaded through the sandbox's root directory:
/// on a merged-`/usr` host `/lib64` (where its ELF interpreter is) and `/lib` were symlinks
/// in the sandbox's writable root, which the sandbox's root could swap for a directory of its
/// own, so its code ran with those capabilities at the next snapshot (`CAP_NET_ADMIN` over the
/// routing rules that keep an Internet sandbox off private ranges, among others). Now every
/// system directory is a read-only bind, a mount point no sandbox process can rename.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_snapshot_helper_loads_nothing_the_sandbox_wrote() {
    let env = Env::new("capldso");
    let id = env.sandbox(&unique("capldso")).await;
    let b = &*env.backend;
    let mut spec = ProcessSpec::new(Command::argv([
        "bash",
        "-c",
        r#"[ "$(uname -m)" = x86_64 ] && command -v cc >/dev/null && command -v readelf >/dev/null \
             || { echo skip; exit 0; }
           set -e
           interp=$(readelf -l "$(command -v tar)" | sed -n 's/.*interpreter: \(.*\)]$/\1/p')
           top=/$(echo "$interp" | cut -d/ -f2)
           cd /tmp
           printf '%s' "$SOURCE" > evil.c
           flags="-nostdlib -static-pie -fPIE -fno-stack-protector -O1"
           cc $flags -o loader evil.c
           cc $flags -DFROM="\"$top\"" -o swap evil.c
           mkdir -p "$top.new/$(dirname "${interp#$top/}")"
           cp loader "$top.new/${interp#$top/}"
           if ./swap; then echo swapped; else echo refused; fi"#,
    ]))
    .env("SOURCE", LOADER_SWAP_C);
    if b.capabilities().multiple_users {
        spec = spec.user("root");
    }
    let planted = run(b, &id, spec).await;
    assert_eq!(planted.exit_code(), 0, "{planted:?}");
    let said = planted.stdout_lossy().trim().to_string();
    if said == "skip" {
        eprintln!("SKIP: needs x86_64, cc and readelf in the sandbox");
        return;
    }
    // Whatever the snapshot's outcome, its helper must not have run the sandbox's code.
    let _ = b.snapshot(&id, SnapshotOptions::default()).await;
    match read_all(b, &id, "/tmp/proof").await {
        Err(_) => {}
        Ok(proof) => panic!(
            "the snapshot's tar ran a loader the sandbox planted ({said}):\n{}",
            String::from_utf8_lossy(&proof)
        ),
    }
    assert_eq!(said, "refused", "{planted:?}");
}

// ---------------------------------------------------------------------------------------------
// Host processes and network
// ---------------------------------------------------------------------------------------------

/// A host process is invisible in the sandbox's `/proc` and survives `kill -9` of its pid,
/// `kill -9 -1`, and attempts on PID 1, the monitor's and this test's pids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_processes_are_invisible_and_unkillable() {
    let env = Env::new("hostproc");
    let id = env.sandbox(&unique("hostproc")).await;
    let marker = unique("hc-host-sleep");
    let mut sleeper = HostSleeper::start(&marker);
    let host_pid = sleeper.pid();
    common::eventually(common::PATIENCE, "the host sleeper runs", || async {
        common::equals(common::host_processes_named(&marker), vec![host_pid])
    })
    .await;
    let (monitor, agent) = common::monitor_and_agent(&id).await;
    let me = std::process::id();
    let out = bash_seeking(
        &*env.backend,
        &id,
        &marker,
        "grep -l \"$M\" /proc/[0-9]*/cmdline 2>/dev/null; \
         ls /proc | grep -E '^[0-9]+$' | tr '\\n' ' '",
    )
    .await;
    let text = out.stdout_lossy();
    assert!(!text.contains("/proc/"), "host process visible: {text}");
    let inside: Vec<u32> = text
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect();
    assert!(inside.len() <= 10, "sandbox sees {} pids", inside.len());
    let mut targets = vec![host_pid, monitor, agent, me];
    targets.retain(|p| !inside.contains(p));
    let list: Vec<String> = targets.iter().map(u32::to_string).collect();
    let out = bash(
        &*env.backend,
        &id,
        &format!(
            "for p in {}; do kill -9 $p 2>/dev/null && echo killed $p; done; \
             kill -9 1 2>/dev/null; kill -TERM 1 2>/dev/null; kill -9 -1 2>/dev/null; true",
            list.join(" ")
        ),
    )
    .await;
    // `kill -9 -1` ends the script itself; it must not have reported any kill.
    assert!(
        !out.stdout_lossy().contains("killed"),
        "{}",
        out.stdout_lossy()
    );
    // A negative check (nothing may die): the grace period gives a wrongly delivered kill time
    // to act; on a slow machine it can only hide a failure, never cause one.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(sleeper.running(), "the host sleep was killed from inside");
    assert!(common::alive(monitor) && common::alive(agent));
    let ok = bash(&*env.backend, &id, "echo still-here").await;
    assert_eq!(
        ok.stdout, b"still-here\n",
        "the sandbox survives its own kills"
    );
    println!(
        "hardening: {} host pids survived kill -9 from inside; kill -9 -1 and PID 1 survived",
        targets.len()
    );
}

/// A python3 probe run inside: TCP connects and abstract unix socket connects, one line each.
fn probe_script(tcp: &[u16], abstract_names: &[String]) -> String {
    let tcp: Vec<String> = tcp.iter().map(u16::to_string).collect();
    let names: Vec<String> = abstract_names.iter().map(|n| format!("{n:?}")).collect();
    format!(
        r#"
import socket
for port in [{tcp}]:
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect(("127.0.0.1", port)); print("tcp", port, "connected")
    except Exception as e:
        print("tcp", port, "refused", type(e).__name__)
for name in [{names}]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect("\0" + name); print("abstract", name, "connected")
    except Exception as e:
        print("abstract", name, "refused", type(e).__name__)
print("interfaces", " ".join(sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").readlines()[2:])))
"#,
        tcp = tcp.join(", "),
        names = names.join(", ")
    )
}

/// With the default policy, a TCP listener on the host's 127.0.0.1 and a host abstract unix
/// socket are unreachable, and the sandbox has no interface but `lo`. With
/// `NetworkPolicy::Host` (documented as sharing the host network) the same listener is
/// reachable: the probe can tell the difference.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_loopback_and_abstract_sockets_are_unreachable() {
    use std::os::linux::net::SocketAddrExt;
    let env = Env::new("net");
    let id = env.sandbox(&unique("net")).await;
    if !has_python(&*env.backend, &id).await {
        let out = bash(&*env.backend, &id, "cat /proc/net/dev").await;
        assert!(!out.stdout_lossy().contains("eth"));
        return;
    }
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").expect("host listener");
    tcp.set_nonblocking(true).unwrap();
    let port = tcp.local_addr().unwrap().port();
    let name = unique("hc-abstract");
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let unix = std::os::unix::net::UnixListener::bind_addr(&addr).expect("abstract listener");
    unix.set_nonblocking(true).unwrap();

    let text = python(
        &*env.backend,
        &id,
        &probe_script(&[port], std::slice::from_ref(&name)),
    )
    .await;
    assert!(text.contains(&format!("tcp {port} refused")), "{text}");
    assert!(text.contains(&format!("abstract {name} refused")), "{text}");
    assert!(
        text.lines().any(|l| l.trim() == "interfaces lo"),
        "only lo: {text}"
    );
    assert!(tcp.accept().is_err(), "the host listener got a connection");
    assert!(
        unix.accept().is_err(),
        "the abstract socket got a connection"
    );

    // The same probe with the host network reaches both: the isolation above is the netns.
    let mut opts = env.options(&unique("hostnet"));
    opts.network = NetworkPolicy::Host;
    let shared = env.create(opts).await;
    let text = python(
        &*env.backend,
        &shared,
        &probe_script(&[port], std::slice::from_ref(&name)),
    )
    .await;
    assert!(text.contains(&format!("tcp {port} connected")), "{text}");
    assert!(
        text.contains(&format!("abstract {name} connected")),
        "{text}"
    );
    println!("hardening: host TCP 127.0.0.1:{port} and an abstract socket refused under NetworkPolicy::None");
}

// ---------------------------------------------------------------------------------------------
// Sandbox to sandbox
// ---------------------------------------------------------------------------------------------

/// One sandbox cannot see, signal or connect to another's processes, nor read its files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandboxes_cannot_reach_each_other() {
    let env = Env::new("peers");
    let marker = unique("peers");
    let a = env.sandbox(&marker).await;
    let b = env.sandbox(&marker).await;
    let b_marker = unique("hc-peer-b");
    let b_abstract = unique("hc-peer-abstract");
    let python_ok = has_python(&*env.backend, &b).await;
    let b_script = if python_ok {
        format!(
            "import socket,time\n\
             t=socket.socket(); t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
             t.bind(('127.0.0.1', 47001)); t.listen()\n\
             u=socket.socket(socket.AF_UNIX); u.bind('\\0{b_abstract}'); u.listen()\n\
             print('ready', flush=True)\n\
             time.sleep(600)\n"
        )
    } else {
        String::new()
    };
    let spec = if python_ok {
        ProcessSpec::new(Command::argv([
            "bash",
            "-c",
            &format!("exec -a {b_marker} python3 -c \"$0\"", b_marker = b_marker),
            &b_script,
        ]))
    } else {
        ProcessSpec::new(Command::argv([
            "bash",
            "-c",
            &format!("exec -a {b_marker} sleep 600"),
        ]))
    };
    let mut b_proc = env.backend.spawn(&b, spec).await.expect("b's server");
    if python_ok {
        let mut seen = Vec::new();
        while !String::from_utf8_lossy(&seen).contains("ready") {
            match tokio::time::timeout(Duration::from_secs(20), b_proc.events.next()).await {
                Ok(Some(Ok(sandcove::ProcessEvent::Stdout(x)))) => seen.extend(x),
                Ok(Some(Ok(_))) => {}
                other => panic!("b's server did not start: {other:?}"),
            }
        }
    }
    common::eventually(common::PATIENCE, "b's named process runs", || async {
        common::equals(common::host_process_count(&b_marker), 1)
    })
    .await;
    env.backend
        .write_file(
            &b,
            "/workspace/b-only",
            bytes(b"b"),
            WriteOptions::default(),
        )
        .await
        .unwrap();
    let b_pid_inside = b_proc.pid;
    let b_host_pids: Vec<String> = common::host_processes_named(&b_marker)
        .iter()
        .map(u32::to_string)
        .collect();
    let (b_monitor, b_agent) = common::monitor_and_agent(&b).await;

    // From a: nothing of b is visible, and signals at b's pids (host or in-sandbox numbers)
    // hit nothing of b.
    let out = bash_seeking(
        &*env.backend,
        &a,
        &b_marker,
        &format!(
            "grep -l \"$M\" /proc/[0-9]*/cmdline 2>/dev/null; cat /workspace/b-only 2>&1; \
             find / -xdev -name b-only 2>/dev/null; \
             for p in {} {b_monitor} {b_agent} {b_pid_inside}; do kill -9 $p 2>/dev/null; done; \
             kill -9 -1 2>/dev/null; true",
            b_host_pids.join(" ")
        ),
    )
    .await;
    let text = out.stdout_lossy();
    assert!(
        !text.contains("/proc/") && !text.contains("b-only\n"),
        "{text}"
    );
    if python_ok {
        let text = python(
            &*env.backend,
            &a,
            &probe_script(&[47001], std::slice::from_ref(&b_abstract)),
        )
        .await;
        assert!(
            text.contains("tcp 47001 refused"),
            "a reached b's port: {text}"
        );
        assert!(
            text.contains(&format!("abstract {b_abstract} refused")),
            "a reached b's abstract socket: {text}"
        );
        // The same probe inside b connects: the services are really there.
        let text = python(
            &*env.backend,
            &b,
            &probe_script(&[47001], std::slice::from_ref(&b_abstract)),
        )
        .await;
        assert!(text.contains("tcp 47001 connected"), "{text}");
        assert!(
            text.contains(&format!("abstract {b_abstract} connected")),
            "{text}"
        );
    }
    // A negative check (nothing may die): see host_processes_are_invisible_and_unkillable.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        common::host_process_count(&b_marker),
        1,
        "b's process survived a's attempts"
    );
    assert!(common::alive(b_monitor) && common::alive(b_agent));
    assert_eq!(
        read_all(&*env.backend, &b, "/workspace/b-only")
            .await
            .unwrap(),
        b"b"
    );
    println!(
        "hardening: sandbox-to-sandbox: files, /proc, signals, TCP and abstract sockets refused"
    );
}

// ---------------------------------------------------------------------------------------------
// The file API
// ---------------------------------------------------------------------------------------------

/// Find a bash that stays reachable however the sandbox root's own entries are shuffled
/// (`/usr` is a read-only bind: it cannot be removed or renamed).
fn sturdy_bash() -> String {
    std::fs::canonicalize("/bin/bash")
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "/bin/bash".into())
}

/// Plant symlinks pointing out of the sandbox in every way we know.
async fn plant_links(env: &Env, id: &str, host_dir: &Path) {
    let h = host_dir.display();
    let s = env.dir.display();
    let script = format!(
        "mkdir -p /workspace/d/sub && cd /workspace && \
         ln -sfn ../../../../../../../.. up; ln -sfn / abs; ln -sfn '{h}' host; \
         ln -sfn '{h}/secret' hostsecret; ln -sfn '{s}' state; ln -sfn ../workspace/up rel; \
         ln -sfn loop loop; ln -sfn /proc/self/root self; ln -sfn /proc/1/cwd cwd; \
         ln -sfn d/sub/../../up/.. chain; true"
    );
    let out = run(
        &*env.backend,
        id,
        ProcessSpec::new(Command::argv([sturdy_bash(), "-c".into(), script])),
    )
    .await;
    assert!(out.exit_status().success(), "{}", out.stderr_lossy());
}

/// Generated paths (`..` chains, absolute and relative symlinks pointing out, loops, host
/// paths verbatim) through every file call never touch a host file, and never read one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_paths_never_touch_host_files() {
    let env = Env::new("fsprop");
    let id = env.sandbox(&unique("fsprop")).await;
    let host_dir = std::env::temp_dir().join(unique("hc-prop-canary"));
    let canaries = Canaries::plant(&[host_dir.clone(), env.dir.join("canary")]);
    let host_workspace = Path::new("/workspace").exists();
    plant_links(&env, &id, &host_dir).await;
    let host_dir_s = host_dir.to_string_lossy().into_owned();
    let state_s = env.dir.to_string_lossy().into_owned();
    let mut alphabet: Vec<&str> = vec![
        "..",
        ".",
        "",
        "up",
        "abs",
        "host",
        "hostsecret",
        "state",
        "rel",
        "loop",
        "self",
        "cwd",
        "chain",
        "d",
        "sub",
        "secret",
        "dir",
        "canary",
        "workspace",
        "tmp",
        "x",
    ];
    alphabet.extend(host_dir_s.split('/').filter(|c| !c.is_empty()));
    alphabet.extend(state_s.split('/').filter(|c| !c.is_empty()));
    let host_secret = std::fs::read(host_dir.join("secret")).unwrap();
    const SEED: u64 = 0x5A4D_C0E5_2026_0009;
    const CASES: usize = 400;
    let mut gen = Gen::new(SEED);
    let mut outcomes: BTreeMap<&str, (u32, u32)> = BTreeMap::new();
    for i in 0..CASES {
        if i % 40 == 0 {
            plant_links(&env, &id, &host_dir).await;
        }
        let path = match gen.below(10) {
            0 => format!(
                "{host_dir_s}/{}",
                gen.pick(&["secret", "dir/inner", "new", "dir"])
            ),
            1 => format!("{state_s}/canary/{}", gen.pick(&["secret", "dir", "new"])),
            _ => gen.path(&alphabet),
        };
        let op = *gen.pick(&[
            "write", "append", "mkdir", "remove", "rename", "chmod", "read", "list", "stat",
        ]);
        let b = &*env.backend;
        let data = format!("sandbox bytes {i}").into_bytes();
        let result: Result<(), sandcove::Error> = match op {
            "write" => b
                .write_file(&id, &path, bytes(&data), WriteOptions::default())
                .await
                .map(drop),
            "append" => b
                .write_file(
                    &id,
                    &path,
                    bytes(&data),
                    WriteOptions::default().append(true),
                )
                .await
                .map(drop),
            "mkdir" => b.mkdir(&id, &path, MkdirOptions::default()).await.map(drop),
            "remove" => {
                b.remove(&id, &path, RemoveOptions::default().recursive(true))
                    .await
            }
            "rename" => {
                let to = gen.path(&alphabet);
                b.rename(&id, &path, &to, Default::default())
                    .await
                    .map(drop)
            }
            "chmod" => b
                .chmod(&id, &path, ChmodOptions::new(0o777))
                .await
                .map(drop),
            "read" => match read_all(b, &id, &path).await {
                Ok(content) => {
                    assert_ne!(
                        content, host_secret,
                        "case {i} (seed {SEED:#x}): read {path:?} returned the host secret"
                    );
                    Ok(())
                }
                Err(e) => Err(e),
            },
            "list" => b
                .list_dir(&id, &path, ListDirOptions::default().depth(3))
                .await
                .map(drop),
            _ => b.stat(&id, &path, Default::default()).await.map(drop),
        };
        let entry = outcomes.entry(op).or_default();
        if result.is_ok() {
            entry.0 += 1;
        } else {
            entry.1 += 1;
        }
        if i % 50 == 49 {
            canaries.assert_unchanged(&format!("after case {i} (seed {SEED:#x})"));
        }
    }
    canaries.assert_unchanged("after every generated case");
    assert_eq!(
        Path::new("/workspace").exists(),
        host_workspace,
        "a host /workspace appeared"
    );
    // The sandbox still works: the calls were contained, not fatal.
    let ok = run(
        &*env.backend,
        &id,
        ProcessSpec::new(Command::argv([
            sturdy_bash(),
            "-c".into(),
            "echo ok".into(),
        ])),
    )
    .await;
    assert_eq!(ok.stdout, b"ok\n");
    println!(
        "hardening: {CASES} generated file calls (seed {SEED:#x}), {} canaries untouched; \
         ok/refused per call: {outcomes:?}",
        canaries.count()
    );
    let _ = std::fs::remove_dir_all(&host_dir);
}

/// A symlink swapped between "a directory" and "pointing out" by a process inside, while the
/// file API uses paths through it, never lets a call reach the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn symlink_swapped_during_file_calls_never_reaches_the_host() {
    let env = Env::new("race");
    let id = env.sandbox(&unique("race")).await;
    let host_dir = std::env::temp_dir().join(unique("hc-race-canary"));
    let canaries = Canaries::plant(&[host_dir.clone(), env.dir.join("canary")]);
    let host_secret = std::fs::read(host_dir.join("secret")).unwrap();
    let h = host_dir.display();
    let s = env.dir.display();
    let racer = format!(
        "mkdir -p /workspace/race/real/dir; cd /workspace/race; \
         while :; do ln -sfn real x; ln -sfn '{h}' x; ln -sfn ../../../../../.. x; \
         ln -sfn '{s}/canary' x; ln -sfn /proc/self/root/../.. x; ln -sfn / x; done"
    );
    let racer_proc = env
        .backend
        .spawn(&id, ProcessSpec::new(Command::argv(["bash", "-c", &racer])))
        .await
        .expect("racer");
    // Race only once the racer is swapping (its link exists).
    common::eventually(common::PATIENCE, "the racer runs", || async {
        env.backend
            .stat(&id, "/workspace/race/x", Default::default())
            .await
            .map(drop)
    })
    .await;
    const ROUNDS: usize = 300;
    let mut ok = 0;
    for i in 0..ROUNDS {
        let b = &*env.backend;
        let data = format!("race {i}").into_bytes();
        let r = match i % 7 {
            0 => b
                .write_file(
                    &id,
                    "/workspace/race/x/secret",
                    bytes(&data),
                    WriteOptions::default(),
                )
                .await
                .map(drop),
            1 => b
                .write_file(
                    &id,
                    "/workspace/race/x/dir/inner",
                    bytes(&data),
                    WriteOptions::default().append(true),
                )
                .await
                .map(drop),
            2 => match read_all(b, &id, "/workspace/race/x/secret").await {
                Ok(c) => {
                    assert_ne!(c, host_secret, "round {i}: read the host secret");
                    Ok(())
                }
                Err(e) => Err(e),
            },
            3 => b
                .mkdir(&id, "/workspace/race/x/dir/new", MkdirOptions::default())
                .await
                .map(drop),
            4 => {
                b.remove(
                    &id,
                    "/workspace/race/x/dir",
                    RemoveOptions::default().recursive(true),
                )
                .await
            }
            5 => b
                .rename(
                    &id,
                    "/workspace/race/x/secret",
                    "/workspace/race/x/moved",
                    Default::default(),
                )
                .await
                .map(drop),
            _ => b
                .chmod(&id, "/workspace/race/x/secret", ChmodOptions::new(0o777))
                .await
                .map(drop),
        };
        if r.is_ok() {
            ok += 1;
        }
    }
    drop(racer_proc);
    canaries.assert_unchanged("after the symlink race");
    println!("hardening: {ROUNDS} file calls raced a symlink swapper ({ok} succeeded inside), host untouched");
    let _ = std::fs::remove_dir_all(&host_dir);
}

/// `/proc` magic links of the agent (the process serving the file API) lead to host objects:
/// `/proc/self/exe` is the host program's binary, `/proc/self/fd/2` the monitor's log in the
/// host state directory. The file API must neither read nor write host files through them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]

async fn file_api_does_not_follow_proc_magic_links_to_host_files() {
    use std::io::Write;
    let env = Env::new("magic");
    let id = env.sandbox(&unique("magic")).await;
    let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
    let log = env.dir.join("sandboxes").join(&id).join("monitor.log");
    let log_marker = unique("hc-log-marker");
    std::fs::OpenOptions::new()
        .append(true)
        .open(&log)
        .and_then(|mut f| writeln!(f, "{log_marker}"))
        .expect("mark the host log");
    let log_before = std::fs::read(&log).unwrap();
    let mut leaks = Vec::new();
    for path in ["/proc/self/exe", "/proc/1/exe", "/proc/thread-self/exe"] {
        if let Ok(content) = read_all(&*env.backend, &id, path).await {
            if content.len() == exe.len() && content[..4096] == exe[..4096] {
                leaks.push(format!("read {path}: the host binary"));
            }
        }
    }
    // The agent's environment is the creating program's, with the host state path in it
    // (today unreadable: the agent is not dumpable; kept so it stays that way).
    let host_dir = env.dir.to_string_lossy().into_owned();
    for path in ["/proc/self/environ", "/proc/1/environ"] {
        if let Ok(content) = read_all(&*env.backend, &id, path).await {
            if String::from_utf8_lossy(&content).contains(&host_dir) {
                leaks.push(format!("read {path}: the host program's environment"));
            }
        }
    }
    for path in ["/proc/self/fd/2", "/proc/1/fd/2", "/proc/thread-self/fd/2"] {
        if let Ok(content) = read_all(&*env.backend, &id, path).await {
            if String::from_utf8_lossy(&content).contains(&log_marker) {
                leaks.push(format!("read {path}: the host monitor log"));
            }
        }
        let _ = env
            .backend
            .write_file(
                &id,
                path,
                bytes(b"written through a magic link\n"),
                WriteOptions::default().append(true),
            )
            .await;
        if std::fs::read(&log).unwrap_or_default() != log_before {
            leaks.push(format!("append to {path}: changed the host monitor log"));
        }
    }
    assert!(
        leaks.is_empty(),
        "host files reached through /proc: {leaks:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Bad input at the Backend boundary
// ---------------------------------------------------------------------------------------------

fn code_of<T>(r: sandcove::Result<T>) -> Option<ErrorCode> {
    r.err().map(|e| e.code())
}

/// Invalid create options are refused with a typed error before anything exists: no state
/// entry, no monitor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_create_options_are_refused_and_create_nothing() {
    let env = Env::new("badcreate");
    let base = env.options(&unique("badcreate"));
    let with = |f: &dyn Fn(&mut CreateOptions)| {
        let mut o = base.clone();
        f(&mut o);
        o
    };
    let cases: Vec<(&str, CreateOptions, ErrorCode)> = vec![
        (
            "empty env name",
            with(&|o| {
                o.envs.insert(String::new(), "v".into());
            }),
            ErrorCode::InvalidArgument,
        ),
        (
            "env name with =",
            with(&|o| {
                o.envs.insert("A=B".into(), "v".into());
            }),
            ErrorCode::InvalidArgument,
        ),
        (
            "env name with NUL",
            with(&|o| {
                o.envs.insert("A\0B".into(), "v".into());
            }),
            ErrorCode::InvalidArgument,
        ),
        (
            "env value with NUL",
            with(&|o| {
                o.envs.insert("A".into(), "v\0w".into());
            }),
            ErrorCode::InvalidArgument,
        ),
        (
            "label with NUL",
            with(&|o| {
                o.labels.insert("k".into(), "v\0".into());
            }),
            ErrorCode::InvalidArgument,
        ),
        (
            "timeout of u64::MAX seconds",
            with(&|o| o.timeout = Some(Duration::from_secs(u64::MAX))),
            ErrorCode::InvalidArgument,
        ),
        (
            "timeout Duration::MAX",
            with(&|o| o.timeout = Some(Duration::MAX)),
            ErrorCode::InvalidArgument,
        ),
        (
            "timeout over a year",
            with(&|o| o.timeout = Some(Duration::from_secs(366 * 24 * 3600))),
            ErrorCode::InvalidArgument,
        ),
        (
            "hostname with a slash",
            with(&|o| o.hostname = Some("a/b".into())),
            ErrorCode::InvalidArgument,
        ),
        (
            "empty hostname",
            with(&|o| o.hostname = Some(String::new())),
            ErrorCode::InvalidArgument,
        ),
        (
            "hostname of 33 chars",
            with(&|o| o.hostname = Some("h".repeat(33))),
            ErrorCode::InvalidArgument,
        ),
        (
            "user with NUL",
            with(&|o| o.user = Some("a\0".into())),
            ErrorCode::InvalidArgument,
        ),
        (
            "user ../root",
            with(&|o| o.user = Some("../root".into())),
            ErrorCode::InvalidArgument,
        ),
        (
            "relative home",
            with(&|o| o.home = Some("home".into())),
            ErrorCode::InvalidArgument,
        ),
        (
            "home /",
            with(&|o| o.home = Some("/".into())),
            ErrorCode::InvalidArgument,
        ),
        (
            "home under /usr",
            with(&|o| o.home = Some("/usr/local/x".into())),
            ErrorCode::InvalidArgument,
        ),
        (
            "home with ..",
            with(&|o| o.home = Some("/home/../etc".into())),
            ErrorCode::InvalidArgument,
        ),
        (
            "home with NUL",
            with(&|o| o.home = Some("/home/\0".into())),
            ErrorCode::InvalidArgument,
        ),
        (
            "home /proc",
            with(&|o| o.home = Some("/proc".into())),
            ErrorCode::InvalidArgument,
        ),
        (
            "zero disk",
            with(&|o| o.resources.disk_mib = Some(0)),
            ErrorCode::InvalidArgument,
        ),
        (
            "zero processes",
            with(&|o| o.resources.max_processes = Some(0)),
            ErrorCode::InvalidArgument,
        ),
        (
            "zero open files",
            with(&|o| o.resources.max_open_files = Some(0)),
            ErrorCode::InvalidArgument,
        ),
        // The engine runs images: a template is an image reference, and this is none.
        (
            "template that is no image reference",
            with(&|o| o.template = Some("../../etc".into())),
            ErrorCode::InvalidArgument,
        ),
        (
            "cpu limit",
            with(&|o| o.resources = Resources::default().cpu(-1.0)),
            ErrorCode::InvalidArgument,
        ),
        (
            "memory limit",
            with(&|o| o.resources.memory_mib = Some(u64::MAX)),
            ErrorCode::InvalidArgument,
        ),
        (
            "unknown snapshot",
            with(&|o| o.snapshot = Some("snap-nope".into())),
            ErrorCode::NotFound,
        ),
        (
            "snapshot id ../x",
            with(&|o| o.snapshot = Some("../x".into())),
            ErrorCode::NotFound,
        ),
        (
            "unknown volume",
            with(&|o| o.volumes = vec![VolumeMount::new("nope-vol", "/data")]),
            ErrorCode::NotFound,
        ),
        (
            "volume name ../..",
            with(&|o| o.volumes = vec![VolumeMount::new("../..", "/data")]),
            ErrorCode::InvalidArgument,
        ),
    ];
    let caps = env.backend.capabilities();
    let mut tried = 0;
    for (what, options, expected) in cases {
        if (what.contains("volume") && !caps.volumes)
            || (what.contains("snapshot") && !caps.snapshots)
        {
            continue;
        }
        let got = tokio::time::timeout(Duration::from_secs(30), env.backend.create(options))
            .await
            .unwrap_or_else(|_| panic!("{what}: create hung"));
        let code = code_of(got);
        assert!(
            code == Some(expected)
                || (expected == ErrorCode::NotFound && code == Some(ErrorCode::InvalidArgument)),
            "{what}: expected {expected:?}, got {code:?}"
        );
        assert!(
            env.state_entries().is_empty(),
            "{what}: left {:?}",
            env.state_entries()
        );
        assert!(
            env.engine_processes().is_empty(),
            "{what}: a monitor started"
        );
        tried += 1;
    }
    assert!(env
        .backend
        .list(Default::default())
        .await
        .unwrap()
        .is_empty());
    println!("hardening: {tried} invalid create options refused, nothing created");
}

/// A zero lease is not an error, but such a sandbox ends at once and leaves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_lease_ends_at_once_and_leaves_nothing() {
    let env = Env::new("zerolease");
    let mut opts = env.options(&unique("zero"));
    opts.timeout = Some(Duration::ZERO);
    match env.backend.create(opts).await {
        Ok(info) => {
            common::eventually(common::PATIENCE, "the zero lease ends", || async {
                common::equals(env.state_entries(), vec![])
            })
            .await;
            let err = env.backend.get(&info.id).await.expect_err("ended");
            assert!(err.is_not_found(), "{err}");
        }
        Err(e) => assert_eq!(e.code(), ErrorCode::InvalidArgument, "{e}"),
    }
    env.assert_nothing_left("zero lease").await;
}

/// Invalid process specs are refused with `InvalidArgument` (or `NotFound`/`NotSupported`
/// where that is what is wrong) and start nothing; the sandbox is unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_process_specs_are_refused_and_start_nothing() {
    let env = Env::new("badspec");
    let id = env.sandbox(&unique("badspec")).await;
    let before = env.backend.list_processes(&id).await.unwrap().len();
    let spec = |argv: &[&str]| ProcessSpec::new(Command::argv(argv.iter().copied()));
    let base = spec(&["true"]);
    let with = |f: &dyn Fn(&mut ProcessSpec)| {
        let mut s = base.clone();
        f(&mut s);
        s
    };
    let mut cases: Vec<(&str, ProcessSpec, &[ErrorCode])> = vec![
        ("empty argv", spec(&[]), &[ErrorCode::InvalidArgument]),
        ("empty program", spec(&[""]), &[ErrorCode::InvalidArgument]),
        (
            "NUL in program",
            spec(&["tr\0ue"]),
            &[ErrorCode::InvalidArgument],
        ),
        (
            "NUL in argument",
            spec(&["echo", "a\0b"]),
            &[ErrorCode::InvalidArgument],
        ),
        (
            "NUL in script",
            ProcessSpec::new(Command::sh("echo a\0b")),
            &[ErrorCode::InvalidArgument],
        ),
        (
            "NUL in shell",
            ProcessSpec::new(Command::Shell {
                script: "true".into(),
                shell: "/bin/sh\0".into(),
                login: false,
            }),
            &[ErrorCode::InvalidArgument],
        ),
        (
            "empty env name",
            with(&|s| {
                s.envs.insert(String::new(), "x".into());
            }),
            &[ErrorCode::InvalidArgument],
        ),
        (
            "env name with =",
            with(&|s| {
                s.envs.insert("A=B".into(), "x".into());
            }),
            &[ErrorCode::InvalidArgument],
        ),
        (
            "env name with NUL",
            with(&|s| {
                s.envs.insert("A\0".into(), "x".into());
            }),
            &[ErrorCode::InvalidArgument],
        ),
        (
            "env value with NUL",
            with(&|s| {
                s.envs.insert("A".into(), "\0".into());
            }),
            &[ErrorCode::InvalidArgument],
        ),
        (
            "NUL in cwd",
            with(&|s| s.cwd = Some("/tmp\0".into())),
            &[ErrorCode::InvalidArgument],
        ),
        (
            "empty cwd",
            with(&|s| s.cwd = Some(String::new())),
            &[ErrorCode::InvalidArgument],
        ),
        (
            "missing cwd",
            with(&|s| s.cwd = Some("/nope/nope".into())),
            &[ErrorCode::NotFound],
        ),
        (
            "file as cwd",
            with(&|s| s.cwd = Some("/etc/hostname".into())),
            &[ErrorCode::InvalidArgument],
        ),
        (
            "NUL in user",
            with(&|s| s.user = Some("ro\0ot".into())),
            &[ErrorCode::InvalidArgument],
        ),
        (
            "unknown user",
            with(&|s| s.user = Some("nobody-here".into())),
            &[ErrorCode::InvalidArgument, ErrorCode::NotSupported],
        ),
        (
            "NUL in tag",
            with(&|s| s.tag = Some("t\0".into())),
            &[ErrorCode::InvalidArgument],
        ),
        (
            "missing program",
            spec(&["/nope/bin/x"]),
            &[ErrorCode::NotFound],
        ),
    ];
    if !env.backend.capabilities().pty {
        cases.retain(|c| !c.0.contains("pty"));
    }
    let mut tried = 0;
    let mut failures = Vec::new();
    for (what, spec, expected) in cases {
        let got = tokio::time::timeout(Duration::from_secs(30), env.backend.spawn(&id, spec))
            .await
            .unwrap_or_else(|_| panic!("{what}: spawn hung"));
        let code = got.as_ref().err().map(|e| e.code());
        if !code.is_some_and(|c| expected.contains(&c)) {
            failures.push(format!(
                "{what}: expected {expected:?}, got {:?}",
                got.map(|s| s.pid).map_err(|e| e.to_string())
            ));
        }
        tried += 1;
    }
    assert!(failures.is_empty(), "{failures:#?}");
    assert_eq!(
        env.backend.list_processes(&id).await.unwrap().len(),
        before,
        "a refused spec started a process"
    );
    let ok = bash(&*env.backend, &id, "echo fine").await;
    assert_eq!(ok.stdout, b"fine\n");
    println!("hardening: {tried} invalid process specs refused");
}

/// An absurd process timeout (beyond what the wire format carries) is a clear
/// `InvalidArgument` at the boundary, like every other bad spec field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]

async fn absurd_process_timeouts_are_invalid_argument() {
    let env = Env::new("abstimeout");
    let id = env.sandbox(&unique("abst")).await;
    for t in [
        Duration::MAX,
        Duration::from_secs(u64::MAX),
        Duration::from_secs(10_000_000_000_000),
    ] {
        let spec = ProcessSpec::new(Command::argv(["true"])).timeout(t);
        let got = tokio::time::timeout(Duration::from_secs(30), env.backend.spawn(&id, spec))
            .await
            .expect("spawn does not hang");
        let err = got.map(|s| s.pid).expect_err("refused");
        assert_eq!(err.code(), ErrorCode::InvalidArgument, "{t:?}: {err}");
    }
    assert!(env.backend.list_processes(&id).await.unwrap().is_empty());
}

/// A zero process timeout is either refused or honoured, never a hang: the
/// zero one ends the process at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_process_timeout_kills_at_once() {
    let env = Env::new("zerotimeout");
    let id = env.sandbox(&unique("zerot")).await;
    let spec = ProcessSpec::new(Command::argv(["sleep", "600"])).timeout(Duration::ZERO);
    match env.backend.spawn(&id, spec).await {
        Ok(stream) => {
            let out = tokio::time::timeout(
                Duration::from_secs(30),
                sandcove::client::collect(stream, 1024),
            )
            .await
            .expect("a zero timeout does not hang")
            .expect("collect");
            assert!(out.exit_status().timed_out, "{out:?}");
        }
        Err(e) => assert_eq!(e.code(), ErrorCode::InvalidArgument),
    }
}

/// Every per-sandbox call with an unknown or malformed id is `NotFound`, creates nothing and
/// never hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_and_malformed_ids_are_not_found_everywhere() {
    let env = Env::new("ids");
    let destroyed = env.sandbox(&unique("ids")).await;
    env.backend.destroy(&destroyed).await.unwrap();
    let long = "a".repeat(300);
    let ids: Vec<&str> = vec![
        "",
        "nope",
        "aaaaaaaaaaaaaaaaaaaa",
        destroyed.as_str(),
        "..",
        "../..",
        "../../../etc",
        "a/b",
        "/",
        "x\0y",
        "-rf",
        "UPPER",
        ".hidden",
        "sandboxes",
        long.as_str(),
        "with space",
        "ünïcode",
    ];
    let b = &*env.backend;
    let sel = || ProcessSelector::Pid(1);
    let mut tried = 0;
    for id in &ids {
        macro_rules! check {
            ($call:expr, $name:literal) => {{
                let r = tokio::time::timeout(Duration::from_secs(30), $call)
                    .await
                    .unwrap_or_else(|_| panic!("{} on {:?} hung", $name, id));
                let code = r.as_ref().err().map(|e| e.code());
                assert_eq!(code, Some(ErrorCode::NotFound), "{} on {:?}", $name, id);
                tried += 1;
            }};
        }
        check!(b.get(id), "get");
        check!(
            b.set_timeout(id, SetTimeoutOptions::new(Duration::from_secs(5))),
            "set_timeout"
        );
        check!(b.destroy(id), "destroy");
        check!(
            b.spawn(id, ProcessSpec::new(Command::argv(["true"]))),
            "spawn"
        );
        check!(b.attach(id, sel()), "attach");
        check!(
            b.write_stdin(id, sel(), WriteStdinOptions::new(b"x")),
            "write_stdin"
        );
        check!(b.close_stdin(id, sel()), "close_stdin");
        check!(
            b.signal(id, sel(), SignalOptions::new(Signal::Kill)),
            "signal"
        );
        check!(b.list_processes(id), "list_processes");
        check!(
            b.read_file(id, "/etc/hostname", Default::default()),
            "read_file"
        );
        check!(
            b.write_file(id, "/workspace/x", bytes(b"x"), WriteOptions::default()),
            "write_file"
        );
        check!(b.list_dir(id, "/", ListDirOptions::default()), "list_dir");
        check!(b.stat(id, "/", Default::default()), "stat");
        check!(
            b.mkdir(id, "/workspace/d", MkdirOptions::default()),
            "mkdir"
        );
        check!(
            b.remove(id, "/workspace", RemoveOptions::default()),
            "remove"
        );
        check!(b.rename(id, "/a", "/b", Default::default()), "rename");
        check!(b.chmod(id, "/", ChmodOptions::new(0o777)), "chmod");
        check!(b.pause(id), "pause");
        check!(b.resume(id), "resume");
        check!(b.metrics(id), "metrics");
        check!(
            b.resize_pty(
                id,
                sel(),
                ResizePtyOptions::new(PtySize { cols: 80, rows: 24 })
            ),
            "resize_pty"
        );
        check!(b.watch(id, "/workspace", WatchOptions::default()), "watch");
        check!(b.expose_port(id, PreviewOptions::new(80)), "expose_port");
        check!(b.list_previews(id), "list_previews");
        check!(b.close_preview(id, 80), "close_preview");
        check!(
            b.create_preview_token(id, 80, PreviewTokenOptions::default()),
            "create_preview_token"
        );
        check!(b.snapshot(id, SnapshotOptions::default()), "snapshot");
        check!(b.fork(id, CreateOptions::default()), "fork");
        check!(b.delete_snapshot(id), "delete_snapshot");
        assert!(
            env.state_entries().is_empty(),
            "{id:?} left {:?}",
            env.state_entries()
        );
    }
    // Nothing appeared next to the state directory either (a `..` id resolved on the host
    // would have).
    let parent_before: Vec<String> = host_names(&env.dir);
    assert!(
        parent_before.iter().all(|n| [
            "sandboxes",
            "snapshots",
            "volumes",
            "runtime-id",
            "tombstones",
            // Sandbox names, made (private) at start with the other subdirectories.
            "names",
            // The engine's locale directory (see `locale`), made at start where the host needs it.
            "locale"
        ]
        .contains(&n.as_str())),
        "unexpected state entries: {parent_before:?}"
    );
    println!(
        "hardening: {} malformed or unknown ids x 29 calls = {tried} NotFound answers",
        ids.len()
    );
}

/// Bad file paths (empty, NUL), bad set_timeout values and bad volume names are refused with
/// a typed error and change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_paths_timeouts_and_names_are_refused_and_change_nothing() {
    let env = Env::new("badpaths");
    let id = env.sandbox(&unique("badpaths")).await;
    let b = &*env.backend;
    let before = b
        .list_dir(&id, "/workspace", ListDirOptions::default().depth(5))
        .await
        .unwrap();
    let mut tried = 0;
    for path in ["", "\0", "a\0b", "/workspace/\0", "/workspace/x\0/../y"] {
        let results = [
            code_of(
                b.write_file(&id, path, bytes(b"x"), WriteOptions::default())
                    .await,
            ),
            code_of(read_all(b, &id, path).await),
            code_of(b.list_dir(&id, path, ListDirOptions::default()).await),
            code_of(b.stat(&id, path, Default::default()).await),
            code_of(b.mkdir(&id, path, MkdirOptions::default()).await),
            code_of(
                b.remove(&id, path, RemoveOptions::default().recursive(true))
                    .await,
            ),
            code_of(
                b.rename(&id, path, "/workspace/y", Default::default())
                    .await,
            ),
            code_of(b.rename(&id, "/workspace", path, Default::default()).await),
            code_of(b.chmod(&id, path, ChmodOptions::new(0o777)).await),
            code_of(b.watch(&id, path, WatchOptions::default()).await),
        ];
        for (i, code) in results.iter().enumerate() {
            assert_eq!(
                *code,
                Some(ErrorCode::InvalidArgument),
                "path {path:?}, call {i}"
            );
            tried += 1;
        }
    }
    let info = b.get(&id).await.unwrap();
    for t in [
        Duration::MAX,
        Duration::from_secs(u64::MAX),
        Duration::from_secs(400 * 24 * 3600),
    ] {
        assert_eq!(
            code_of(b.set_timeout(&id, SetTimeoutOptions::new(t)).await),
            Some(ErrorCode::InvalidArgument),
            "{t:?}"
        );
        tried += 1;
    }
    assert_eq!(
        b.get(&id).await.unwrap().ends_at,
        info.ends_at,
        "the lease moved"
    );
    if b.capabilities().volumes {
        for name in ["", "..", "../x", "a/b", "a\0b", ".hidden", &"v".repeat(300)] {
            let code = code_of(b.create_volume(name).await);
            assert!(
                matches!(code, Some(ErrorCode::InvalidArgument)),
                "volume {name:?}: {code:?}"
            );
            let code = code_of(b.delete_volume(name).await);
            assert!(
                matches!(code, Some(ErrorCode::InvalidArgument | ErrorCode::NotFound)),
                "delete volume {name:?}: {code:?}"
            );
            tried += 2;
        }
        assert!(b.list_volumes().await.unwrap().is_empty());
    }
    for snap in ["", "..", "../../x", "snap-\0"] {
        assert_eq!(
            code_of(b.delete_snapshot(snap).await),
            Some(ErrorCode::NotFound),
            "{snap:?}"
        );
        tried += 1;
    }
    let after = b
        .list_dir(&id, "/workspace", ListDirOptions::default().depth(5))
        .await
        .unwrap();
    assert_eq!(before, after, "a refused call changed the workspace");
    println!("hardening: {tried} bad paths, timeouts and names refused");
}

/// The helpers themselves: a helper that cannot fail would make the suites vacuous.
mod helpers {
    use super::common::*;
    use super::*;
    use std::os::unix::process::CommandExt;

    #[test]
    fn the_path_generator_is_deterministic_and_covers_its_alphabet() {
        let alphabet = ["..", ".", "a", "link"];
        let mut a = Gen::new(7);
        let mut b = Gen::new(7);
        let first: Vec<String> = (0..200).map(|_| a.path(&alphabet)).collect();
        let second: Vec<String> = (0..200).map(|_| b.path(&alphabet)).collect();
        assert_eq!(first, second, "same seed, same paths");
        for part in alphabet {
            assert!(
                first.iter().any(|p| p.split('/').any(|c| c == part)),
                "{part} generated"
            );
        }
        assert!(first.iter().any(|p| p.starts_with('/')));
        assert!(first.iter().any(|p| !p.starts_with('/')));
        assert_ne!(
            first,
            (0..200)
                .map(|_| Gen::new(8).path(&alphabet))
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn canaries_notice_a_change() {
        let root = std::env::temp_dir().join(unique("hc-canary-self"));
        let c = Canaries::plant(std::slice::from_ref(&root));
        assert!(c.count() >= 6);
        c.assert_unchanged("untouched");
        std::fs::write(root.join("dir/inner"), b"changed").unwrap();
        assert_eq!(
            c.changes(),
            [format!("changed {}", root.join("dir/inner").display())],
            "a changed canary is reported"
        );
        let _ = std::fs::remove_dir_all(&root);
    }

    #[tokio::test]
    async fn descendants_and_process_lookups_work_on_this_host() {
        let marker = unique("hc-self-sleep");
        let mut sleeper = HostSleeper::start(&marker);
        let me = std::process::id();
        let pid = sleeper.pid();
        eventually(PATIENCE, "the sleeper is a descendant", || async {
            holds(descendants(me).contains(&pid), descendants(me))
        })
        .await;
        assert!(sleeper.running());
        assert!(alive(sleeper.pid()));
        assert!(rss_kib() > 0);
    }

    /// The flake this replaces: a script that merely *mentions* a marker (and every shell it
    /// forks) was counted as a process carrying it. Only an exact `argv[0]` counts.
    #[tokio::test]
    async fn processes_are_identified_by_exact_name_never_by_a_script_mentioning_it() {
        let marker = unique("hc-exact");
        let named = HostSleeper::start(&marker);
        // Two shells whose command lines contain the marker (and a longer name sharing its
        // prefix): none of them is named `marker`.
        let mut mentions = std::process::Command::new("bash")
            .process_group(0)
            .args([
                "-c",
                &format!("(sleep 600; : {marker}) & exec -a {marker}-other sleep 600 # {marker}"),
            ])
            .stdin(std::process::Stdio::null())
            .spawn()
            .expect("start the mentioning shells");
        let other = format!("{marker}-other");
        eventually(PATIENCE, "the decoys run", || async {
            equals(host_process_count(&other), 1)
        })
        .await;
        let mentioning = all_processes()
            .into_iter()
            .filter(|p| {
                std::fs::read(format!("/proc/{}/cmdline", p.pid))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&marker))
            })
            .count();
        assert!(
            mentioning >= 3,
            "the decoys mention the marker ({mentioning})"
        );
        assert_eq!(host_processes_named(&marker), vec![named.pid()]);
        assert_eq!(host_process_count(&marker), 1);
        // The decoys are a process group of their own: end all of it.
        let group = format!("-{}", mentions.id());
        let killed = std::process::Command::new("kill")
            .args(["-KILL", "--", &group])
            .status()
            .expect("kill the decoys");
        assert!(killed.success());
        let _ = mentions.wait();
    }

    /// `eventually` returns the value of the evaluation that succeeded (no recount), and its
    /// deadline is an assertion that fails naming what was last seen.
    #[tokio::test]
    async fn eventually_returns_the_successful_observation_and_fails_on_its_deadline() {
        let mut calls = 0;
        let seen = eventually(PATIENCE, "a counter reaches 3", || {
            calls += 1;
            let now = calls;
            async move { holds(now >= 3, now).map(|()| now) }
        })
        .await;
        assert_eq!(seen, 3, "the observation that passed is the one returned");
        let failed = tokio::spawn(async {
            eventually(Duration::from_millis(200), "never true", || async {
                holds(false, "still false")
            })
            .await
        })
        .await
        .expect_err("an unmet condition panics at its deadline");
        let message = failed
            .into_panic()
            .downcast::<String>()
            .map(|m| *m)
            .unwrap_or_default();
        assert!(
            message.contains("never true") && message.contains("still false"),
            "{message}"
        );
    }
}
