//! The human commands (`ls`, `create`, `exec`, `shell`, `cp`, `doctor`, …) run as
//! subprocesses, each against the embedded engine and against a loopback `sandcove serve`,
//! checking their output, `--json` shape and exit status; and the server's `/metrics` and
//! request logs.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::{Output, Stdio};

use crate::common::{bin, ServeChild};
use sandcove_conformance::{eventually, holds, unique, PATIENCE};
use sandcove_tests::PrivateState;
use serde_json::Value;
use tokio::io::AsyncWriteExt;

/// Whether the built binary can be run from here (see `http_binary.rs`).
fn runnable() -> bool {
    match std::process::Command::new(bin()).arg("--version").output() {
        Ok(out) if out.status.success() => true,
        other => {
            eprintln!(
                "SKIPPED: cannot run {} from this process ({other:?})",
                bin().to_string_lossy()
            );
            false
        }
    }
}

/// Where the commands send their work: a private engine state directory, used directly or
/// through a `sandcove serve` started on it.
struct Target {
    env: Vec<(String, OsString)>,
    server: Option<std::process::Child>,
    /// The engine's state (ends its sandboxes when dropped); `None` when owned elsewhere.
    state: Option<PrivateState>,
}

impl Target {
    fn embedded() -> Target {
        let state = PrivateState::new();
        Target {
            env: vec![("SANDCOVE_STATE_DIR".into(), state.dir.clone().into())],
            server: None,
            state: Some(state),
        }
    }

    fn served() -> Target {
        let state = PrivateState::new();
        let key = unique("key");
        let serve = ServeChild::start(
            &[
                "--listen",
                "127.0.0.1:0",
                "--state-dir",
                state.dir.to_str().unwrap(),
            ],
            &[("SANDCOVE_API_KEY", OsStr::new(&key))],
            &[],
            "sandcove serve: listening on",
        )
        .expect("the server announces its listener");
        let (child, url) = serve.drain_stderr();
        Target {
            env: vec![
                ("SANDCOVE_URL".into(), url.into()),
                ("SANDCOVE_API_KEY".into(), key.into()),
                // Anything reaching the embedded engine by mistake lands in a directory
                // with no sandboxes, so the checks below would fail.
                (
                    "SANDCOVE_STATE_DIR".into(),
                    std::env::temp_dir().join(unique("none")).into(),
                ),
            ],
            server: Some(child),
            state: Some(state),
        }
    }

    fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(bin());
        command
            .args(args)
            .env_remove("SANDCOVE_URL")
            .env_remove("SANDCOVE_API_KEY");
        for (k, v) in &self.env {
            command.env(k, v);
        }
        command.kill_on_drop(true);
        command
    }

    /// Run `sandcove ARGS` with `stdin` as its input.
    async fn run_with(&self, args: &[&str], stdin: &[u8]) -> Output {
        let mut child = self
            .command(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start sandcove");
        let mut input = child.stdin.take().unwrap();
        input.write_all(stdin).await.unwrap();
        drop(input);
        child.wait_with_output().await.unwrap()
    }

    /// Run `sandcove ARGS` with no input.
    async fn run(&self, args: &[&str]) -> Output {
        self.run_with(args, b"").await
    }

    /// Run and expect success; its stdout.
    async fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args).await;
        assert!(out.status.success(), "sandcove {args:?}: {}", show(&out));
        String::from_utf8(out.stdout).unwrap()
    }

    /// Run with --json and expect success; the parsed document.
    async fn json(&self, args: &[&str]) -> Value {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        let text = self.ok(&all).await;
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{args:?}: {e}: {text}"))
    }

    /// A new sandbox's id.
    async fn create(&self, extra: &[&str]) -> String {
        let mut args = vec!["create", "--timeout", "10m"];
        args.extend_from_slice(extra);
        let id = self.ok(&args).await.trim().to_string();
        assert!(
            !id.is_empty() && !id.contains(char::is_whitespace),
            "{id:?}"
        );
        id
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        if let Some(mut server) = self.server.take() {
            let _ = server.kill();
            let _ = server.wait();
        }
        let _ = &self.state;
    }
}

fn show(out: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The one-line error a failed command prints, checked for its prefix.
fn one_line_error(out: &Output, command: &str) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {stderr}");
    assert!(
        lines[0].starts_with(&format!("sandcove {command}: ")),
        "{stderr}"
    );
    stderr
}

/// Run a test body on a runtime of its own.
fn block_on<F: std::future::Future>(body: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(body)
}

/// Each case, once against the embedded engine and once through a loopback server.
macro_rules! on_both {
    ($($case:ident),* $(,)?) => {
        mod embedded {
            $(
                #[test]
                fn $case() {
                    if !super::runnable() {
                        return;
                    }
                    // Built and dropped outside the async runtime (its drop runs one).
                    let target = super::Target::embedded();
                    super::block_on(super::$case(&target));
                }
            )*
        }
        mod served {
            $(
                #[test]
                fn $case() {
                    if !super::runnable() {
                        return;
                    }
                    // Built and dropped outside the async runtime (its drop runs one).
                    let target = super::Target::served();
                    super::block_on(super::$case(&target));
                }
            )*
        }
    };
}

on_both!(
    lifecycle,
    kill_all_by_label,
    exec_passes_status_stdin_and_streams,
    logs_and_ps,
    cp_both_ways,
    snapshots_and_volumes,
    doctor_reports,
    shell_through_a_pty,
    cp_shows_progress_only_on_a_terminal,
    sandbox_made_text_reaches_the_terminal_inert,
);

async fn lifecycle(t: &Target) {
    let name = unique("n");
    let id = t
        .create(&["--name", &name, "--label", "team=a", "--env", "FOO=bar"])
        .await;
    // The table: header, then our row with its name, state and labels.
    let table = t.ok(&["ls"]).await;
    let mut lines = table.lines();
    let header = lines.next().unwrap();
    for column in [
        "ID",
        "NAME",
        "VENDOR",
        "STATE",
        "AGE",
        "LEASE LEFT",
        "LABELS",
    ] {
        assert!(header.contains(column), "{table}");
    }
    let row = lines.find(|l| l.starts_with(&id)).expect(&table);
    for cell in [name.as_str(), "running", "team=a"] {
        assert!(row.split_whitespace().any(|c| c == cell), "{cell} in {row}");
    }
    // JSON: an array of sandbox descriptions; the label filter applies.
    let all = t.json(&["ls"]).await;
    let mine: Vec<&Value> = all
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["id"] == id)
        .collect();
    assert_eq!(mine.len(), 1, "{all}");
    assert_eq!(mine[0]["labels"]["team"], "a");
    assert_eq!(
        t.json(&["ls", "--label", "team=b"]).await,
        Value::Array(vec![])
    );
    assert_eq!(
        t.json(&["ls", "--label", "team=a"])
            .await
            .as_array()
            .unwrap()
            .len(),
        1
    );
    let info = t.json(&["info", &id]).await;
    assert_eq!(info["state"], "running");
    assert_eq!(info["envs"]["FOO"], "bar");
    assert_eq!(info["name"], name.as_str());
    let text = t.ok(&["info", &id]).await;
    assert!(text.contains(&format!("id:         {id}")), "{text}");
    // The lease moves.
    let info = t.json(&["set-timeout", &id, "20m"]).await;
    let left = info["ends_at"].as_u64().unwrap() - sandcove::now_millis();
    assert!((19 * 60_000..=20 * 60_000).contains(&left), "{left}");
    let out = t.run(&["set-timeout", &id, "ten"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", show(&out));
    // Pause and resume print the new state.
    assert!(t.ok(&["pause", &id]).await.contains(" paused "));
    assert_eq!(t.json(&["info", &id]).await["state"], "paused");
    assert!(t.ok(&["resume", &id]).await.contains(" running "));
    // Kill prints the id; afterwards the sandbox is not found: one line, with the remedy.
    assert_eq!(t.ok(&["kill", &id]).await.trim(), id);
    let out = t.run(&["info", &id]).await;
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    let error = one_line_error(&out, "info");
    assert!(
        error.contains("not found") && error.contains("sandcove ls"),
        "{error}"
    );
    // Bad arguments are usage errors (exit 2), before anything is created.
    let out = t.run(&["create", "--label", "novalue"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", show(&out));
    one_line_error(&out, "create");
    let out = t.run(&["kill"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", show(&out));
    assert_eq!(t.json(&["ls"]).await, Value::Array(vec![]));
}

async fn kill_all_by_label(t: &Target) {
    let a = t.create(&["--label", "grp=x"]).await;
    let b = t.create(&["--label", "grp=x"]).await;
    let c = t.create(&["--label", "grp=y"]).await;
    let done = t.json(&["kill", "--all", "--label", "grp=x"]).await;
    let mut killed: Vec<String> = done["killed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    killed.sort();
    let mut wanted = vec![a, b];
    wanted.sort();
    assert_eq!(killed, wanted);
    assert_eq!(done["failed"], Value::Array(vec![]));
    let left: Vec<Value> = t.json(&["ls"]).await.as_array().unwrap().clone();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0]["id"], c.as_str());
    // A missing sandbox among several: the others are destroyed, the exit says it failed.
    let out = t.run(&["kill", "nosuchsandbox", &c]).await;
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), c);
    assert_eq!(t.json(&["ls"]).await, Value::Array(vec![]));
}

async fn exec_passes_status_stdin_and_streams(t: &Target) {
    let id = t.create(&[]).await;
    let out = t.run(&["exec", &id, "--", "sh", "-c", "exit 7"]).await;
    assert_eq!(out.status.code(), Some(7), "{}", show(&out));
    let out = t
        .run_with(
            &["exec", &id, "--", "sh", "-c", "tr a-z A-Z; echo err >&2"],
            b"hello\n",
        )
        .await;
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    assert_eq!(out.stdout, b"HELLO\n");
    assert_eq!(out.stderr, b"err\n");
    // Killed by a signal: 128 + N, as shells report it.
    let out = t.run(&["exec", &id, "--", "sh", "-c", "kill -9 $$"]).await;
    assert_eq!(out.status.code(), Some(137), "{}", show(&out));
    let out = t
        .run(&["--json", "exec", &id, "--", "sh", "-c", "echo hi; exit 3"])
        .await;
    assert_eq!(out.status.code(), Some(3), "{}", show(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["stdout"], "hi\n");
    assert_eq!(doc["exit"]["code"], 3);
    // With -t the process has a terminal.
    let out = t.run(&["exec", "-t", &id, "--", "tty"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("/dev/pts/"),
        "{}",
        show(&out)
    );
    let out = t.run(&["exec", "nosuchsandbox", "--", "true"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    one_line_error(&out, "exec");
}

async fn logs_and_ps(t: &Target) {
    let id = t.create(&[]).await;
    t.ok(&[
        "exec",
        "--tag",
        "once",
        &id,
        "--",
        "sh",
        "-c",
        "echo one; echo two >&2",
    ])
    .await;
    let out = t.run(&["logs", &id, "once"]).await;
    assert!(out.status.success(), "{}", show(&out));
    assert_eq!(out.stdout, b"one\n");
    assert_eq!(out.stderr, b"two\n");
    // As JSON: one object per chunk, then the exit.
    let out = t.run(&["--json", "logs", &id, "once"]).await;
    assert!(out.status.success(), "{}", show(&out));
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let chunks: Vec<(&str, &str)> = lines
        .iter()
        .filter_map(|l| Some((l["stream"].as_str()?, l["data"].as_str()?)))
        .collect();
    assert!(chunks.contains(&("stdout", "one\n")), "{lines:?}");
    assert!(chunks.contains(&("stderr", "two\n")), "{lines:?}");
    assert_eq!(lines.last().unwrap()["exit"]["code"], 0, "{lines:?}");
    // A process still running: `logs` prints what is there and returns; `logs -f` follows
    // it to its end.
    let mut waiting = t
        .command(&[
            "exec",
            "--tag",
            "waits",
            &id,
            "--",
            "sh",
            "-c",
            "echo a; read x; echo b",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    eventually(PATIENCE, "the first line is retained", || async {
        let out = t.run(&["logs", &id, "waits"]).await;
        holds(out.stdout == b"a\n", show(&out))
    })
    .await;
    let follow = t
        .command(&["logs", "-f", &id, "waits"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = waiting.stdin.take().unwrap();
    stdin.write_all(b"go\n").await.unwrap();
    drop(stdin);
    assert!(waiting.wait().await.unwrap().success());
    let out = follow.wait_with_output().await.unwrap();
    assert!(out.status.success());
    assert_eq!(out.stdout, b"a\nb\n");
    // ps: both, ended with 0, in a table and as JSON.
    let table = t.ok(&["ps", &id]).await;
    let row = table.lines().find(|l| l.contains(" once ")).expect(&table);
    assert!(row.contains("exited 0"), "{row}");
    let list = t.json(&["ps", &id]).await;
    let tags: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["tag"].as_str())
        .collect();
    assert!(tags.contains(&"once") && tags.contains(&"waits"), "{list}");
    let out = t.run(&["logs", &id, "nosuchtag"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
}

async fn cp_both_ways(t: &Target) {
    let id = t.create(&[]).await;
    let host = std::env::temp_dir().join(unique("cp"));
    let src = host.join("tree");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::write(src.join("a.txt"), b"alpha\n").unwrap();
    let blob: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(src.join("sub/b.bin"), &blob).unwrap();
    // Into an existing directory: lands under its own name.
    let doc = t
        .json(&["cp", src.to_str().unwrap(), &format!("{id}:/workspace")])
        .await;
    assert_eq!(doc["files"], 2);
    assert_eq!(doc["bytes"], 6 + blob.len() as u64);
    let out = t
        .ok(&["exec", &id, "--", "cat", "/workspace/tree/a.txt"])
        .await;
    assert_eq!(out, "alpha\n");
    // A link planted in the sandbox is not followed on the way out.
    t.ok(&[
        "exec",
        &id,
        "--",
        "ln",
        "-s",
        "/etc/passwd",
        "/workspace/tree/link",
    ])
    .await;
    let back = host.join("back");
    let out = t
        .run(&[
            "cp",
            &format!("{id}:/workspace/tree"),
            back.to_str().unwrap(),
        ])
        .await;
    assert!(out.status.success(), "{}", show(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("skipped /workspace/tree/link"));
    assert_eq!(std::fs::read(back.join("a.txt")).unwrap(), b"alpha\n");
    assert_eq!(std::fs::read(back.join("sub/b.bin")).unwrap(), blob);
    assert!(std::fs::symlink_metadata(back.join("link")).is_err());
    // One file into an existing host directory.
    t.ok(&[
        "cp",
        &format!("{id}:/workspace/tree/a.txt"),
        host.to_str().unwrap(),
    ])
    .await;
    assert_eq!(std::fs::read(host.join("a.txt")).unwrap(), b"alpha\n");
    let out = t.run(&["cp", "/etc/hostname", "/tmp/x"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", show(&out));
    let out = t
        .run(&[
            "cp",
            &format!("{id}:/workspace/missing"),
            host.to_str().unwrap(),
        ])
        .await;
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    one_line_error(&out, "cp");
    let _ = std::fs::remove_dir_all(&host);
}

/// Whether `bytes` hold a control character that acts on a terminal (ESC, BEL, CR, C1 CSI)
/// other than the newlines that end lines.
fn drives_a_terminal(bytes: &[u8]) -> bool {
    String::from_utf8_lossy(bytes)
        .chars()
        .any(|c| c != '\n' && c.is_control())
}

/// Attack (fails): names, labels and commands that another client or sandboxed code made,
/// holding terminal escape sequences (retitle the window, clear the screen, recolour), are
/// printed by `ls`, `info`, `ps`, `cp` (skipped entries) and one-line errors. Every one reaches
/// the terminal escaped; `--json` keeps the exact text.
async fn sandbox_made_text_reaches_the_terminal_inert(t: &Target) {
    let evil = "\u{1b}]0;owned\u{7}\u{1b}[2J\r\u{9b}31m";
    let label = format!("k={evil}");
    let id = t.create(&["--label", &label]).await;
    for args in [vec!["ls"], vec!["info", &id]] {
        let out = t.run(&args).await;
        assert!(out.status.success(), "{args:?}: {}", show(&out));
        assert!(
            !drives_a_terminal(&out.stdout) && !drives_a_terminal(&out.stderr),
            "{args:?} printed control characters: {}",
            show(&out)
        );
    }
    let doc = t.json(&["info", &id]).await;
    assert_eq!(doc["labels"]["k"], evil, "JSON keeps the exact label");
    // A command line with escapes, then `ps`.
    t.ok(&["exec", &id, "--", "true", evil]).await;
    let out = t.run(&["ps", &id]).await;
    assert!(out.status.success(), "{}", show(&out));
    assert!(!drives_a_terminal(&out.stdout), "ps: {}", show(&out));
    // Entry names made in the sandbox: a link that `cp` skips and reports.
    t.ok(&["exec", &id, "--", "mkdir", "/workspace/d"]).await;
    let link = format!("/workspace/d/x{evil}");
    t.ok(&["exec", &id, "--", "ln", "-s", "/etc/passwd", &link])
        .await;
    let host = std::env::temp_dir().join(unique("cp-esc"));
    let out = t
        .run(&["cp", &format!("{id}:/workspace/d"), host.to_str().unwrap()])
        .await;
    assert!(out.status.success(), "{}", show(&out));
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(stderr.contains("skipped /workspace/d/x"), "{stderr}");
    assert!(!drives_a_terminal(&out.stderr), "cp: {}", show(&out));
    // An error quoting a sandbox path.
    let out = t
        .run(&[
            "cp",
            &format!("{id}:/workspace/missing{evil}"),
            host.to_str().unwrap(),
        ])
        .await;
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    assert!(!drives_a_terminal(&out.stderr), "error: {}", show(&out));
    let _ = std::fs::remove_dir_all(&host);
}

async fn snapshots_and_volumes(t: &Target) {
    let caps = sandcove_tests::capabilities();
    if !caps.snapshots || !caps.volumes {
        eprintln!("SKIPPED: this engine has no snapshots or volumes ({caps:?})");
        return;
    }
    let volume = unique("vol");
    assert_eq!(t.ok(&["volume", "create", &volume]).await.trim(), volume);
    let table = t.ok(&["volume", "ls"]).await;
    assert!(table.lines().any(|l| l.starts_with(&volume)), "{table}");
    let names: Vec<Value> = t.json(&["volume", "ls"]).await.as_array().unwrap().clone();
    assert!(names.iter().any(|v| v["name"] == volume.as_str()));
    t.ok(&["volume", "rm", &volume]).await;
    let names = t.json(&["volume", "ls"]).await;
    assert!(!names
        .as_array()
        .unwrap()
        .iter()
        .any(|v| v["name"] == volume.as_str()));

    let id = t.create(&[]).await;
    let snap = t
        .ok(&["snapshot", "create", &id, "--name", "first"])
        .await
        .trim()
        .to_string();
    let list = t.json(&["snapshot", "ls"]).await;
    let found: Vec<&Value> = list
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["id"] == snap.as_str())
        .collect();
    assert_eq!(found.len(), 1, "{list}");
    assert_eq!(found[0]["sandbox_id"], id.as_str());
    assert_eq!(t.json(&["info", &id]).await["state"], "running");
    t.ok(&["snapshot", "rm", &snap]).await;
    let list = t.json(&["snapshot", "ls"]).await;
    assert!(!list
        .as_array()
        .unwrap()
        .iter()
        .any(|s| s["id"] == snap.as_str()));
    let out = t.run(&["snapshot", "rm", &snap]).await;
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
}

async fn doctor_reports(t: &Target) {
    let out = t.run(&["doctor"]).await;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    // This host runs the rest of this suite, so it can create sandboxes.
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    assert!(text.contains("sandboxes can be created here"), "{text}");
    let doc = t.json(&["doctor"]).await;
    assert_eq!(doc["can_create"], true);
    let names: Vec<&str> = doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    for name in [
        "user namespaces",
        "seccomp",
        "cgroup limits",
        "user-mode networking",
        "python3",
        "localhost names",
        "create a sandbox",
    ] {
        assert!(names.contains(&name), "{name} in {doc}");
    }
    // The embedded engine of this host runs images (a server answers for its own host).
    if t.server.is_none() {
        let images = doc["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "images")
            .unwrap_or_else(|| panic!("an images check in {doc}"));
        assert_eq!(images["status"], "ok", "{images}");
    }
    for check in doc["checks"].as_array().unwrap() {
        if check["status"] != "ok" {
            assert!(check["remedy"].is_string(), "a remedy for {check}");
        }
    }
    // The doctor's sandbox is gone.
    assert_eq!(t.json(&["ls"]).await, Value::Array(vec![]));
}

/// The local-mode flags of the terminal behind a pty controller.
fn terminal_flags(controller: &OwnedFd) -> libc::tcflag_t {
    // SAFETY: an all-zero termios is a valid value for tcgetattr to overwrite.
    let mut attrs: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: tcgetattr writes one termios into the valid pointer given.
    let rc = unsafe { libc::tcgetattr(controller.as_raw_fd(), &mut attrs) };
    assert_eq!(rc, 0, "tcgetattr: {}", std::io::Error::last_os_error());
    attrs.c_lflag
}

/// A pseudo-terminal pair: (controller, terminal).
fn openpty(cols: u16, rows: u16) -> (OwnedFd, OwnedFd) {
    let mut controller = -1;
    let mut terminal = -1;
    let size = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: openpty writes two descriptors into the ints given; the name pointer may be
    // null, and the termios and winsize pointers point at valid values (or null).
    let rc = unsafe {
        libc::openpty(
            &mut controller,
            &mut terminal,
            std::ptr::null_mut(),
            std::ptr::null(),
            &size,
        )
    };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors were just opened and are owned by nobody else.
    unsafe {
        (
            OwnedFd::from_raw_fd(controller),
            OwnedFd::from_raw_fd(terminal),
        )
    }
}

/// A large copy shows progress on stderr when it is a terminal, and nothing when it is not.
async fn cp_shows_progress_only_on_a_terminal(t: &Target) {
    let id = t.create(&[]).await;
    let host = std::env::temp_dir().join(unique("big"));
    let size: usize = 20 * 1024 * 1024;
    std::fs::write(&host, vec![7u8; size]).unwrap();
    let dst = format!("{id}:/workspace/big");
    let (controller, terminal) = openpty(80, 24);
    let mut child = t
        .command(&["cp", host.to_str().unwrap(), &dst])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(terminal.try_clone().unwrap())
        .spawn()
        .unwrap();
    drop(terminal);
    let mut reader = std::fs::File::from(controller);
    let screen = std::thread::spawn(move || {
        // Until every copy of the terminal side is closed (EIO).
        let mut all = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 {
                break;
            }
            all.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&all).to_string()
    });
    assert!(child.wait().await.unwrap().success());
    let screen = screen.join().unwrap();
    assert!(screen.contains("20 / 20 MiB (100%)"), "{screen:?}");
    let size_inside = t
        .ok(&["exec", &id, "--", "stat", "-c", "%s", "/workspace/big"])
        .await;
    assert_eq!(size_inside.trim(), size.to_string());
    // Not a terminal: nothing on stderr.
    let out = t.run(&["cp", host.to_str().unwrap(), &dst]).await;
    assert!(out.status.success(), "{}", show(&out));
    assert!(out.stderr.is_empty(), "{}", show(&out));
    let _ = std::fs::remove_file(&host);
}

async fn shell_through_a_pty(t: &Target) {
    let id = t.create(&[]).await;
    let (controller, terminal) = openpty(100, 30);
    let mut command = t.command(&["shell", &id]);
    command
        .stdin(terminal.try_clone().unwrap())
        .stdout(terminal.try_clone().unwrap())
        .stderr(terminal.try_clone().unwrap());
    // SAFETY: between fork and exec only async-signal-safe calls: a new session whose
    // controlling terminal is the pty on stdin, so resizes reach it as SIGWINCH.
    unsafe {
        command.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command.spawn().expect("start sandcove shell");
    drop(terminal);
    // Everything the terminal shows, read on a thread (the controller blocks).
    let screen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
    let mut reader = std::fs::File::from(controller.try_clone().unwrap());
    let sink = screen.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    });
    let mut writer = std::fs::File::from(controller.try_clone().unwrap());
    let shown = |text: &str| {
        let screen = screen.lock().unwrap();
        holds(
            String::from_utf8_lossy(&screen).contains(text),
            String::from_utf8_lossy(&screen).to_string(),
        )
    };
    // A typed command's output (the marker is computed, so the echo of the line is not it).
    std::io::Write::write_all(&mut writer, b"echo M$((6*7))M\n").unwrap();
    eventually(PATIENCE, "the command's output", || async { shown("M42M") }).await;
    // This side's terminal is raw while the shell runs (no local echo, no line editing).
    let local = terminal_flags(&controller);
    assert_eq!(
        local & (libc::ICANON | libc::ECHO),
        0,
        "raw mode: {local:#o}"
    );
    std::io::Write::write_all(&mut writer, b"echo S$(stty size | tr ' ' x)S\n").unwrap();
    eventually(PATIENCE, "the starting size", || async {
        shown("S30x100S")
    })
    .await;
    // Resize this side: the sandbox's terminal follows.
    let size = libc::winsize {
        ws_row: 40,
        ws_col: 120,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one winsize from the valid pointer given.
    let rc = unsafe { libc::ioctl(controller.as_raw_fd(), libc::TIOCSWINSZ, &size) };
    assert_eq!(rc, 0);
    eventually(PATIENCE, "the new size inside", || async {
        std::io::Write::write_all(
            &mut writer.try_clone().unwrap(),
            b"echo S$(stty size | tr ' ' x)S\n",
        )
        .unwrap();
        shown("S40x120S")
    })
    .await;
    std::io::Write::write_all(&mut writer, b"exit 3\n").unwrap();
    let status = tokio::time::timeout(PATIENCE, child.wait())
        .await
        .expect("the shell ends")
        .unwrap();
    assert_eq!(
        status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&screen.lock().unwrap())
    );
    // And the terminal's mode is given back.
    let local = terminal_flags(&controller);
    assert_eq!(local & libc::ICANON, libc::ICANON, "restored: {local:#o}");
}

#[test]
fn completions_for_each_shell() {
    if !runnable() {
        return;
    }
    for shell in ["bash", "zsh", "fish"] {
        let out = std::process::Command::new(bin())
            .args(["completions", shell])
            .output()
            .unwrap();
        assert!(out.status.success(), "{shell}");
        let text = String::from_utf8_lossy(&out.stdout);
        for word in ["sandcove", "snapshot", "set-timeout", "doctor"] {
            assert!(text.contains(word), "{shell}: {word}");
        }
    }
    let out = std::process::Command::new(bin())
        .args(["completions", "cmd.exe"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// Parse a Prometheus text document into `name{labels}` → value.
fn parse_metrics(text: &str) -> BTreeMap<String, f64> {
    let mut map = BTreeMap::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let (key, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad line {line:?}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value in {line:?}"));
        assert!(
            map.insert(key.to_string(), value).is_none(),
            "repeated {key}"
        );
    }
    map
}

/// `/metrics`: behind the key, Prometheus text, counting what happened; request logs carry
/// method, route and status, and never the API key.
#[test]
fn metrics_and_request_logs() {
    if !runnable() {
        return;
    }
    let state = PrivateState::new();
    block_on(metrics_and_request_logs_in(&state));
}

async fn metrics_and_request_logs_in(state: &PrivateState) {
    let key = unique("secret-key");
    let serve = ServeChild::start(
        &[
            "--listen",
            "127.0.0.1:0",
            "--state-dir",
            state.dir.to_str().unwrap(),
            "--log-format",
            "json",
            "--e2b",
            "127.0.0.1:0",
        ],
        &[
            ("SANDCOVE_API_KEY", OsStr::new(&key)),
            ("RUST_LOG", OsStr::new("debug")),
        ],
        &[],
        "sandcove serve: listening on",
    )
    .expect("the server announces its listener");
    let ServeChild {
        mut child,
        mut stderr,
        url,
    } = serve;
    // The next announcement is the E2B listener's.
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stderr, &mut line).unwrap();
    let e2b = line
        .trim()
        .strip_prefix("sandcove serve: E2B wire protocol on ")
        .unwrap_or_else(|| panic!("the E2B listener's announcement: {line:?}"))
        .to_string();
    let logs = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let http = reqwest::Client::new();
    let scrape = |with_key: bool| {
        let mut request = http.get(format!("{url}/metrics"));
        if with_key {
            request = request.bearer_auth(&key);
        }
        request.send()
    };
    let refused = scrape(false).await.unwrap();
    assert_eq!(refused.status(), 401);
    // Work through the CLI against this server.
    let t = Target {
        env: vec![
            ("SANDCOVE_URL".into(), url.clone().into()),
            ("SANDCOVE_API_KEY".into(), key.clone().into()),
        ],
        server: None,
        state: None,
    };
    let id = t.create(&[]).await;
    t.ok(&["exec", &id, "--", "head", "-c", "5000", "/dev/zero"])
        .await;
    let keep = t.create(&[]).await;
    t.ok(&["kill", &id]).await;
    let out = t.run(&["info", "nosuchsandbox"]).await;
    assert_eq!(out.status.code(), Some(1));
    let wrong = http
        .get(format!("{url}/v1/sandboxes"))
        .bearer_auth("wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);

    // A vendor listener's request is logged too (its key is in X-API-KEY).
    let listed = http
        .get(format!("{e2b}/sandboxes?metadata=team%3Dsecret-query"))
        .header("X-API-KEY", &key)
        .send()
        .await
        .unwrap();
    assert_eq!(listed.status(), 200);
    let answer = scrape(true).await.unwrap();
    assert_eq!(answer.status(), 200);
    assert!(answer.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    let text = answer.text().await.unwrap();
    let m = parse_metrics(&text);
    let get = |k: &str| *m.get(k).unwrap_or_else(|| panic!("{k} in\n{text}"));
    assert_eq!(get("sandcove_sandboxes{state=\"running\"}"), 1.0);
    assert_eq!(get("sandcove_sandboxes_created_total"), 2.0);
    assert_eq!(get("sandcove_sandboxes_destroyed_total"), 1.0);
    assert_eq!(
        get("sandcove_request_duration_seconds_count{op=\"create\"}"),
        2.0
    );
    assert_eq!(
        get("sandcove_request_duration_seconds_bucket{op=\"create\",le=\"+Inf\"}"),
        2.0
    );
    assert!(get("sandcove_errors_total{code=\"not_found\"}") >= 1.0);
    assert!(get("sandcove_errors_total{code=\"unauthenticated\"}") >= 2.0);
    assert_eq!(
        get("sandcove_requests_total{op=\"destroy\",status=\"204\"}"),
        1.0
    );
    // The 5000 bytes of output went out through the process stream.
    assert!(get("sandcove_bytes_total{direction=\"out\"}") > 5000.0);
    assert!(get("sandcove_bytes_total{direction=\"in\"}") > 0.0);
    // The vendor listener's request is counted in the same document, under its listener.
    assert_eq!(
        get("sandcove_requests_total{op=\"e2b\",status=\"200\"}"),
        1.0
    );
    assert_eq!(
        get("sandcove_request_duration_seconds_count{op=\"e2b\"}"),
        1.0
    );
    t.ok(&["kill", &keep]).await;

    let status = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    assert!(child.wait().unwrap().success());
    let logs = logs.join().unwrap();
    assert!(!logs.contains(&key), "the API key appears in the logs");
    let requests: Vec<Value> = logs
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["op"] == "create" || v["span"]["op"] == "create")
        .collect();
    assert!(
        !requests.is_empty(),
        "a request log line for create in\n{logs}"
    );
    // Engine operations have spans of their own: the failed lookup behind `info
    // nosuchsandbox` is logged in the engine's `get` span naming the sandbox.
    assert!(
        logs.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .any(|v| v["span"]["name"] == "get" && v["span"]["sandbox"] == "nosuchsandbox"),
        "an engine span for get in\n{logs}"
    );
    // The line written once the answer is known carries its status and duration.
    let answered = requests
        .iter()
        .find(|v| v["span"]["status"].is_number())
        .unwrap_or_else(|| panic!("a create line with its status in\n{logs}"));
    let span = &answered["span"];
    assert_eq!(span["method"], "POST", "{answered}");
    assert_eq!(span["route"], "/v1/sandboxes", "{answered}");
    assert!(span["duration_ms"].is_number(), "{answered}");
    assert!(
        (200..300).contains(&span["status"].as_u64().unwrap()),
        "{answered}"
    );
    let vendor_line = logs
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["span"]["listener"] == "e2b")
        .unwrap_or_else(|| panic!("a request line of the E2B listener in\n{logs}"));
    assert_eq!(vendor_line["span"]["path"], "/sandboxes", "{vendor_line}");
    assert_eq!(vendor_line["span"]["status"], 200, "{vendor_line}");
    assert!(!logs.contains("secret-query"), "the query is never logged");
    let info_line = logs
        .lines()
        .find(|l| l.contains(&format!("\"sandbox\":\"{keep}\"")))
        .unwrap_or_else(|| panic!("a request line naming sandbox {keep} in\n{logs}"));
    assert!(
        info_line.contains("\"route\":\"/v1/sandboxes/{id}\""),
        "{info_line}"
    );
}

/// `doctor` exits 1, saying so, where sandboxes cannot be created: here an engine whose state
/// directory cannot be made, and a server that is not there.
#[test]
fn doctor_fails_where_sandboxes_cannot_be_created() {
    if !runnable() {
        return;
    }
    // A closed loopback port: bind one, note it, let it go.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    for env in [
        vec![(
            "SANDCOVE_STATE_DIR",
            "/proc/version/cannot-be-a-directory".to_string(),
        )],
        vec![
            ("SANDCOVE_URL", format!("http://127.0.0.1:{port}")),
            ("SANDCOVE_API_KEY", "k".to_string()),
        ],
    ] {
        let mut command = std::process::Command::new(bin());
        command
            .arg("doctor")
            .env_remove("SANDCOVE_URL")
            .env_remove("SANDCOVE_API_KEY");
        for (k, v) in &env {
            command.env(k, v);
        }
        let out = command.output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{env:?}: {}", show(&out));
        assert!(text.contains("sandboxes CANNOT be created here"), "{text}");
        assert!(text.lines().any(|l| l.starts_with("FAIL")), "{text}");
    }
}
