//! Hardening, file API: sandbox code racing, tricking or stalling the agent's file calls.
//!
//! The agent serves the file API from inside the sandbox with more privilege than sandbox
//! code, and its own `/proc/1/exe` is the host program's binary. Each test plays the sandbox
//! (swapping names for links mid-call, planting devices, FIFOs and magic links, odd names)
//! and asserts both the typed outcome and that the host binary and host canaries are
//! unchanged.
//!
//! Runs as root and rootless (CI runs this binary again as an unprivileged user). Rootless,
//! the host binary belongs to the user the agent maps to, so a path-based chmod that follows
//! a swapped link really lands on it; as root it belongs to an unmapped uid and the attempt
//! fails with EPERM either way.

use crate::hardening_common as common;

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use futures::StreamExt;
use sandcove::{
    Backend, ChmodOptions, Command, ErrorCode, FileKind, ListDirOptions, MkdirOptions, ProcessSpec,
    RemoveOptions, WatchOptions, WriteOptions,
};
use sandcove_conformance::{run, unique};

use common::{bash, bytes, read_all, Canaries, Env};

fn code_of<T>(r: sandcove::Result<T>) -> Option<ErrorCode> {
    r.err().map(|e| e.code())
}

/// The host binary the agent runs (its `/proc/1/exe`): mode, owner and change time.
struct HostBinary {
    path: PathBuf,
    before: (u32, u32, u32, i64, i64),
}

impl HostBinary {
    fn new() -> HostBinary {
        let path = std::env::current_exe().expect("current exe");
        let before = Self::look(&path);
        HostBinary { path, before }
    }

    fn look(path: &PathBuf) -> (u32, u32, u32, i64, i64) {
        let m = std::fs::metadata(path).expect("stat the host binary");
        (m.mode(), m.uid(), m.gid(), m.ctime(), m.ctime_nsec())
    }

    /// Panic if anything changed, after putting the mode back (a failing run must not leave a
    /// set-uid, world-writable binary behind).
    fn assert_unchanged(&self, what: &str) {
        let now = Self::look(&self.path);
        if now != self.before {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(
                &self.path,
                std::fs::Permissions::from_mode(self.before.0 & 0o7777),
            );
            panic!(
                "{what}: the host binary changed: mode {:o} -> {:o}, owner {}:{} -> {}:{}",
                self.before.0, now.0, self.before.1, self.before.2, now.1, now.2
            );
        }
    }
}

/// Wait (bounded) until `path` exists in the sandbox.
async fn wait_for(backend: &dyn Backend, id: &str, path: &str) {
    let start = Instant::now();
    while backend.stat(id, path, Default::default()).await.is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{path} never appeared"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Finding: while `write_file` wrote its temporary file, sandbox code swapped it for a
/// symlink to `/proc/1/exe`, and the agent's path-based chmod made the host binary
/// `-rwsrwxrwx`. A racer now swaps every temporary file it sees for links to the host binary
/// and to a host canary, over many writes; the host binary and the canaries never change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_temp_file_swapped_for_a_link_never_changes_host_files() {
    let env = Env::new("tempswap");
    let id = env.sandbox(&unique("tempswap")).await;
    let binary = HostBinary::new();
    let host_dir = std::env::temp_dir().join(unique("hc-tempswap-canary"));
    let canaries = Canaries::plant(std::slice::from_ref(&host_dir));
    let h = host_dir.display();
    let racer = format!(
        "cd /workspace; touch racing; shopt -s nullglob dotglob; \
         while :; do for f in .result-*.sandcove-*; do \
         ln -sfn /proc/1/exe \"$f\"; ln -sfn '{h}/secret' \"$f\"; ln -sfn /proc/1/exe \"$f\"; \
         done; done"
    );
    let racer_proc = env
        .backend
        .spawn(&id, ProcessSpec::new(Command::argv(["bash", "-c", &racer])))
        .await
        .expect("racer");
    wait_for(&*env.backend, &id, "/workspace/racing").await;
    const ROUNDS: usize = 150;
    let payload = vec![b'x'; 64 * 1024];
    let mut landed_links = 0;
    for i in 0..ROUNDS {
        // A paced, chunked upload keeps the temporary file around long enough to be swapped
        // (the pauses shape the attack window; nothing waits on them).
        let payload = payload.clone();
        let chunks = futures::stream::iter(0..8).then(move |_| {
            let chunk = payload.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(3)).await;
                Ok(chunk)
            }
        });
        let path = format!("/workspace/result-{i}.txt");
        let r = env
            .backend
            .write_file(
                &id,
                &path,
                Box::pin(chunks),
                WriteOptions::default().mode(0o4777),
            )
            .await;
        if let Ok(stat) = &r {
            assert_eq!(stat.path, path);
        }
        if let Ok(st) = env.backend.stat(&id, &path, Default::default()).await {
            if st.kind == FileKind::Symlink {
                landed_links += 1;
            }
        }
        binary.assert_unchanged(&format!("write {i}"));
    }
    drop(racer_proc);
    binary.assert_unchanged("after the temp-file race");
    canaries.assert_unchanged("after the temp-file race");
    println!(
        "hardening: {ROUNDS} writes raced a temp-file swapper ({landed_links} swapped names \
         landed as links inside the sandbox), host binary and canaries untouched"
    );
    let _ = std::fs::remove_dir_all(&host_dir);
}

/// Finding: a write to a symlink pointing at `/proc/1/exe` copied the host binary's mode and
/// owner onto the new file. It is refused, and nothing is created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_through_magic_links_are_refused_and_copy_nothing() {
    let env = Env::new("magicwrite");
    let id = env.sandbox(&unique("magicwrite")).await;
    let binary = HostBinary::new();
    bash(
        &*env.backend,
        &id,
        "cd /workspace && ln -s /proc/1/exe exe && ln -s /proc/self/root/workspace/x viaroot",
    )
    .await;
    for path in ["exe", "viaroot", "/proc/1/exe", "/proc/self/cwd/x"] {
        let r = env
            .backend
            .write_file(&id, path, bytes(b"data"), WriteOptions::default())
            .await;
        assert_eq!(
            code_of(r),
            Some(ErrorCode::PermissionDenied),
            "write {path}"
        );
    }
    let names = sandcove_conformance::names_in(&*env.backend, &id, "/workspace").await;
    assert_eq!(
        names,
        ["exe", "viaroot"],
        "nothing created beside the links"
    );
    binary.assert_unchanged("after writes through magic links");
}

/// Finding: `list_dir` and the other calls went through `/proc/1/root` and listed
/// `/proc/1/map_files` (naming host files) while `read` refused magic links. Every call now
/// refuses them, and a deep listing of `/` does not descend into `/proc`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_file_call_refuses_proc_and_its_magic_links() {
    let env = Env::new("magicall");
    let id = env.sandbox(&unique("magicall")).await;
    let binary = HostBinary::new();
    let b = &*env.backend;
    bash(b, &id, "echo keep > /workspace/keep").await;
    let denied = Some(ErrorCode::PermissionDenied);
    let d1 = ListDirOptions::default().depth(1);
    for path in [
        "/proc/1/root",
        "/proc/1/root/workspace",
        "/proc/1/map_files",
        "/proc/self/fd",
        "/proc/1",
    ] {
        assert_eq!(
            code_of(b.list_dir(&id, path, d1.clone()).await),
            denied,
            "list {path}"
        );
    }
    for path in [
        "/proc/1/exe",
        "/proc/1/root",
        "/proc/1/map_files",
        "/proc/1/environ",
    ] {
        assert_eq!(
            code_of(b.stat(&id, path, Default::default()).await),
            denied,
            "stat {path}"
        );
        assert_eq!(code_of(read_all(b, &id, path).await), denied, "read {path}");
    }
    assert_eq!(
        code_of(b.chmod(&id, "/proc/1/exe", ChmodOptions::new(0o4777)).await),
        denied,
        "chmod the agent's exe"
    );
    assert_eq!(
        code_of(
            b.chmod(&id, "/proc/1/root/workspace/keep", ChmodOptions::new(0o777))
                .await
        ),
        denied,
        "chmod through /proc/1/root"
    );
    assert_eq!(
        code_of(
            b.mkdir(&id, "/proc/1/root/workspace/made", MkdirOptions::default())
                .await
        ),
        denied,
        "mkdir through /proc/1/root"
    );
    assert_eq!(
        code_of(
            b.remove(&id, "/proc/1/root/workspace/keep", RemoveOptions::default())
                .await
        ),
        denied,
        "remove through /proc/1/root"
    );
    assert_eq!(
        code_of(
            b.rename(
                &id,
                "/proc/1/root/workspace/keep",
                "/workspace/moved",
                Default::default()
            )
            .await
        ),
        denied,
        "rename through /proc/1/root"
    );
    assert_eq!(
        code_of(
            b.watch(&id, "/proc/1/root/workspace", WatchOptions::default())
                .await
        ),
        denied,
        "watch through /proc/1/root"
    );
    let deep = b
        .list_dir(&id, "/", ListDirOptions::default().depth(3))
        .await
        .expect("list / deep");
    let inside_proc: Vec<&str> = deep
        .iter()
        .map(|e| e.path.as_str())
        .filter(|p| p.starts_with("/proc/"))
        .collect();
    assert!(
        inside_proc.is_empty(),
        "listed inside /proc: {inside_proc:?}"
    );
    assert!(deep.iter().any(|e| e.path == "/workspace/keep"));
    assert_eq!(
        bash(b, &id, "cat /workspace/keep; ls /workspace")
            .await
            .stdout,
        b"keep\nkeep\n",
        "nothing changed inside"
    );
    binary.assert_unchanged("after /proc calls");
}

/// Findings: a read of a symlink to `/dev/zero` grew the client without end, `/dev/full`
/// streamed forever over HTTP, and a read of a FIFO hung the agent (every later call timed
/// out). Reads take regular files only, promptly, and the sandbox keeps answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_refuse_devices_fifos_and_sockets_promptly() {
    let env = Env::new("devread");
    let id = env.sandbox(&unique("devread")).await;
    let b = &*env.backend;
    let out = bash(
        b,
        &id,
        "cd /workspace && ln -s /dev/zero result.txt && ln -s /dev/full full && mkfifo fifo \
         && ln -s fifo fifolink && python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind(\"sock\")' \
         2>/dev/null; echo ready",
    )
    .await;
    assert_eq!(out.stdout, b"ready\n");
    let mut paths = vec![
        "result.txt",
        "full",
        "fifo",
        "fifolink",
        "/dev/zero",
        "/dev/null",
    ];
    if b.stat(&id, "sock", Default::default()).await.is_ok() {
        paths.push("sock");
    }
    for path in paths {
        let r = tokio::time::timeout(Duration::from_secs(10), read_all(b, &id, path))
            .await
            .unwrap_or_else(|_| panic!("read {path} hung"));
        assert_eq!(code_of(r), Some(ErrorCode::InvalidArgument), "read {path}");
    }
    // The agent is not stuck: other calls answer at once.
    let alive = tokio::time::timeout(Duration::from_secs(10), bash(b, &id, "echo alive"))
        .await
        .expect("the sandbox still answers");
    assert_eq!(alive.stdout, b"alive\n");
    tokio::time::timeout(
        Duration::from_secs(10),
        b.stat(&id, "fifo", Default::default()),
    )
    .await
    .expect("stat answers")
    .expect("stat of a FIFO is fine");
}

/// A file that grows while it is read is cut at the size it had when the read began (a
/// sandbox file is never trusted to stop).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_stop_at_the_size_the_file_had_when_opened() {
    let env = Env::new("growread");
    let id = env.sandbox(&unique("growread")).await;
    let b = &*env.backend;
    const SIZE: usize = 8 << 20;
    let out = bash(
        b,
        &id,
        &format!("head -c {SIZE} /dev/zero > /workspace/grow; echo ok"),
    )
    .await;
    assert_eq!(out.stdout, b"ok\n");
    let mut stream = b
        .read_file(&id, "/workspace/grow", Default::default())
        .await
        .expect("open");
    let first = stream.next().await.expect("a chunk").expect("data");
    // The agent is at most a socket buffer ahead of us: grow the file well past that.
    let grown = bash(
        b,
        &id,
        &format!("head -c {SIZE} /dev/zero >> /workspace/grow; echo ok"),
    )
    .await;
    assert_eq!(grown.stdout, b"ok\n");
    let mut total = first.len();
    while let Some(chunk) = stream.next().await {
        total += chunk.expect("data").len();
    }
    assert_eq!(total, SIZE, "the read ends at the size at open");
}

/// Names that are not UTF-8 are listed in a form the other calls accept, and address the
/// same file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_that_are_not_utf8_can_be_listed_and_addressed() {
    let env = Env::new("rawnames");
    let id = env.sandbox(&unique("rawnames")).await;
    let b = &*env.backend;
    let out = bash(
        b,
        &id,
        "cd /workspace && printf one > \"$(printf 'bad\\377.txt')\" && \
         printf two > \"$(printf 'bad\\376.txt')\" && echo ok",
    )
    .await;
    assert_eq!(out.stdout, b"ok\n");
    let entries = b
        .list_dir(&id, "/workspace", ListDirOptions::default().depth(1))
        .await
        .expect("list");
    assert_eq!(entries.len(), 2, "{entries:?}");
    assert_ne!(
        entries[0].name, entries[1].name,
        "distinct names stay distinct"
    );
    let mut contents = Vec::new();
    for e in &entries {
        let stat = b
            .stat(&id, &e.path, Default::default())
            .await
            .expect("stat by listed path");
        assert_eq!(stat.name, e.name);
        contents.push(
            read_all(b, &id, &e.path)
                .await
                .expect("read by listed path"),
        );
    }
    contents.sort();
    assert_eq!(contents, [b"one".to_vec(), b"two".to_vec()]);
    // Written, renamed and removed by the same names.
    b.write_file(
        &id,
        &entries[0].path,
        bytes(b"new"),
        WriteOptions::default(),
    )
    .await
    .expect("write by listed path");
    let renamed = format!("{}-moved", entries[1].path);
    b.rename(&id, &entries[1].path, &renamed, Default::default())
        .await
        .expect("rename");
    b.remove(&id, &renamed, RemoveOptions::default())
        .await
        .expect("remove");
    let out = bash(
        b,
        &id,
        "cd /workspace && ls | od -An -c | tr -s ' '; cat bad*",
    )
    .await;
    let text = out.stdout_lossy();
    // Listed in byte order: 0xFE (rewritten) stays, 0xFF (renamed, then removed) is gone.
    assert!(text.contains("b a d 376 . t x t"), "{text}");
    assert!(text.trim_end().ends_with("new"), "{text}");
    assert!(!text.contains("377"), "{text}");
}

/// A process's working directory resolves like every file call (magic links and `/proc`
/// refused) and the process starts in exactly the directory that was checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_working_directories_resolve_like_the_file_api() {
    let env = Env::new("cwd");
    let id = env.sandbox(&unique("cwd")).await;
    let b = &*env.backend;
    bash(
        b,
        &id,
        "mkdir -p /workspace/sub && ln -s /workspace/sub /workspace/link",
    )
    .await;
    for cwd in [
        "/proc/1/root/workspace",
        "/proc/self/cwd",
        "/proc/1/map_files",
    ] {
        let spec = ProcessSpec::new(Command::argv(["pwd"])).cwd(cwd);
        assert_eq!(
            code_of(b.spawn(&id, spec).await.map(|s| s.pid)),
            Some(ErrorCode::PermissionDenied),
            "cwd {cwd}"
        );
    }
    let spec = ProcessSpec::new(Command::argv(["pwd", "-P"])).cwd("/workspace/link");
    assert_eq!(run(b, &id, spec).await.stdout, b"/workspace/sub\n");
}
