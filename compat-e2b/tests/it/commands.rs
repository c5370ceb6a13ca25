//! `sandbox.commands` and `CommandHandle`, against the embedded runtime.

use std::sync::{Arc, Mutex};

use crate::common::{assert_not_supported, caps, sandbox};
use sandcove_conformance::{equals, eventually, holds, PATIENCE};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreground_run_returns_the_result_and_streams_chunks() {
    let sbx = sandbox("run").await;
    let r = sbx
        .commands
        .run("echo \"Hello from E2B!\"")
        .await
        .expect("run");
    assert_eq!(r.stdout, "Hello from E2B!\n");
    assert_eq!(
        (r.stderr.as_str(), r.exit_code, r.error.as_deref()),
        ("", 0, None)
    );
    assert_eq!(
        format!("{r:?}"),
        "CommandResult(stderr='', stdout='Hello from E2B!\\n', exit_code=0, error=None)"
    );
    let out = Arc::new(Mutex::new(Vec::new()));
    let err = Arc::new(Mutex::new(Vec::new()));
    let (o, e) = (out.clone(), err.clone());
    let r = sbx
        .commands
        .run("echo hello; sleep 0.2; echo world; echo oops >&2")
        .on_stdout(move |chunk| o.lock().unwrap().push(chunk))
        .on_stderr(move |chunk| e.lock().unwrap().push(chunk))
        .await
        .expect("run");
    assert_eq!(r.stdout, "hello\nworld\n");
    assert_eq!(out.lock().unwrap().concat(), "hello\nworld\n");
    assert_eq!(err.lock().unwrap().concat(), "oops\n");
    // Multi-byte characters split across writes decode whole; invalid bytes become U+FFFD.
    let r = sbx
        .commands
        .run(r"printf '\xe2\x82'; sleep 0.1; printf '\xac \xff\n'")
        .await
        .expect("run");
    assert_eq!(r.stdout, "€ \u{FFFD}\n");
    // Shell semantics are bash's.
    let r = sbx
        .commands
        .run("X=a; for i in 1 2; do X=$X$i; done; echo $X | tr a A && echo ~")
        .await
        .expect("run");
    assert_eq!(r.stdout, "A12\n/home/user\n");
    sbx.kill().await.expect("kill");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_zero_exit_raises_with_the_result() {
    let sbx = sandbox("exit").await;
    let err = sbx
        .commands
        .run("echo out; echo bad >&2; exit 3")
        .await
        .unwrap_err();
    let exit = err.as_command_exit().expect("CommandExitException");
    assert_eq!(
        (exit.exit_code, exit.error.as_deref()),
        (3, Some("exit status 3"))
    );
    assert_eq!(
        (exit.stdout.as_str(), exit.stderr.as_str()),
        ("out\n", "bad\n")
    );
    assert_eq!(
        err.to_string(),
        "Command exited with code 3 and error:\nbad\n"
    );
    let err = sbx.commands.run("no-such-command-xyz").await.unwrap_err();
    assert_eq!(err.as_command_exit().expect("exit").exit_code, 127);
    let err = sbx.commands.run("kill -9 $$").await.unwrap_err();
    let exit = err.as_command_exit().expect("exit");
    assert_eq!(
        (exit.exit_code, exit.error.as_deref()),
        (-1, Some("signal: killed"))
    );
    sbx.kill().await.expect("kill");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envs_cwd_and_user() {
    let sbx = e2b::Sandbox::create()
        .timeout(60)
        .envs([("MY_VAR", "my_value"), ("OTHER", "kept")])
        .await
        .expect("create");
    let r = sbx
        .commands
        .run("echo $MY_VAR $OTHER")
        .envs([("MY_VAR", "123")])
        .await
        .expect("run");
    assert_eq!(r.stdout, "123 kept\n", "per-command envs win");
    let r = sbx.commands.run("echo $MY_VAR").await.expect("run");
    assert_eq!(r.stdout, "my_value\n", "only for that command");
    sbx.files.make_dir("sub/dir").await.expect("mkdir");
    for (cwd, want) in [
        ("/tmp", "/tmp\n"),
        ("sub/dir", "/home/user/sub/dir\n"),
        ("~/sub", "/home/user/sub\n"),
        ("", "/home/user\n"),
    ] {
        let r = sbx.commands.run("pwd").cwd(cwd).await.expect("run");
        assert_eq!(r.stdout, want, "cwd {cwd:?}");
    }
    let err = sbx
        .commands
        .run("pwd")
        .cwd("/no/such/dir")
        .await
        .unwrap_err();
    assert!(err.is_invalid_argument(), "{err:?}");
    let r = sbx.commands.run("whoami").user("user").await.expect("run");
    assert_eq!(r.stdout, "user\n");
    let root = sbx.commands.run("whoami").user("root").await;
    if caps().await.multiple_users {
        assert_eq!(root.expect("run as root").stdout, "root\n");
    } else {
        assert_not_supported(root, "user=root without multiple uids");
    }
    sbx.kill().await.expect("kill");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_kills_and_raises() {
    let sbx = sandbox("timeout").await;
    let err = sbx.commands.run("sleep 30").timeout(1).await.unwrap_err();
    assert!(err.is_timeout(), "{err:?}");
    let r = sbx
        .commands
        .run("sleep 0.2; echo done")
        .timeout(0)
        .await
        .expect("no limit");
    assert_eq!(r.stdout, "done\n");
    // A background command is bounded too.
    let mut h = sbx
        .commands
        .run("sleep 30")
        .background(true)
        .timeout(1)
        .await
        .expect("background");
    assert!(h.wait().await.unwrap_err().is_timeout());
    // Orphans are reaped by PID 1 on its own schedule: wait for them to be gone.
    let sbx = &sbx;
    eventually(
        PATIENCE,
        "the timed-out processes are gone",
        || async move {
            let left = sbx
                .commands
                .run("pgrep -x sleep || true")
                .await
                .expect("run");
            equals(left.stdout, String::new())
        },
    )
    .await;
    sbx.kill().await.expect("kill");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_handle_iterates_waits_and_kills() {
    let sbx = sandbox("background").await;
    let mut h = sbx
        .commands
        .run("echo hello; echo err >&2; sleep 0.2; echo world")
        .background(true)
        .await
        .expect("background");
    assert!(h.pid > 0);
    let (mut out, mut err) = (String::new(), String::new());
    while let Some(item) = h.next().await {
        let (stdout, stderr, pty) = item.expect("item");
        assert!(pty.is_none());
        assert_eq!(
            usize::from(stdout.is_some()) + usize::from(stderr.is_some()),
            1
        );
        out.push_str(&stdout.unwrap_or_default());
        err.push_str(&stderr.unwrap_or_default());
    }
    assert_eq!((out.as_str(), err.as_str()), ("hello\nworld\n", "err\n"));
    let r = h.wait().await.expect("wait after iteration");
    assert_eq!(r.stdout, "hello\nworld\n");
    assert_eq!(h.exit_code(), Some(0));
    assert!(!h.kill().await.expect("kill"), "the process already exited");
    // wait raises on a non-zero exit; callbacks fire while waiting.
    let mut h = sbx
        .commands
        .run("echo a; exit 4")
        .background(true)
        .await
        .expect("background");
    let seen = Arc::new(Mutex::new(String::new()));
    let s = seen.clone();
    let err = h
        .wait()
        .on_stdout(move |c| s.lock().unwrap().push_str(&c))
        .await
        .unwrap_err();
    assert_eq!(err.as_command_exit().expect("exit").exit_code, 4);
    assert_eq!(*seen.lock().unwrap(), "a\n");
    // kill of a running background command.
    let mut h = sbx
        .commands
        .run("sleep 30")
        .background(true)
        .await
        .expect("bg");
    assert!(h.kill().await.expect("kill"));
    let err = h.wait().await.unwrap_err();
    assert_eq!(
        err.as_command_exit().expect("exit").error.as_deref(),
        Some("signal: killed")
    );
    // background(false) runs to the end and hands back a finished handle.
    let mut h = sbx
        .commands
        .run("echo fg")
        .background(false)
        .await
        .expect("fg");
    assert_eq!(h.exit_code(), Some(0));
    assert_eq!(h.wait().await.expect("wait").stdout, "fg\n");
    sbx.kill().await.expect("kill");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdin_disconnect_connect_list_and_kill_by_pid() {
    let sbx = sandbox("stdin").await;
    let mut h = sbx
        .commands
        .run("read line; echo got $line; cat")
        .background(true)
        .stdin(true)
        .await
        .expect("background");
    let pid = h.pid;
    let listed = sbx.commands.list().await.expect("list");
    let p = listed.iter().find(|p| p.pid == pid).expect("listed");
    assert_eq!(p.cmd, "/bin/bash");
    assert_eq!(p.args, ["-l", "-c", "read line; echo got $line; cat"]);
    assert_eq!(p.cwd.as_deref(), Some("/home/user"));
    h.send_stdin("first\n").await.expect("send_stdin");
    h.disconnect().await;
    assert!(
        h.next().await.is_none(),
        "a disconnected handle yields nothing"
    );
    let mut again = sbx.commands.connect(pid).await.expect("connect");
    sbx.commands
        .send_stdin(pid, b"tail")
        .await
        .expect("send_stdin by pid");
    sbx.commands
        .close_stdin(pid)
        .await
        .expect("close_stdin by pid");
    let r = again.wait().await.expect("wait");
    assert!(r.stdout.ends_with("got first\ntail"), "{:?}", r.stdout);
    // Handle-level stdin on a second process; commands.kill by pid.
    let h = sbx
        .commands
        .run("cat")
        .background(true)
        .stdin(true)
        .await
        .expect("bg");
    h.close_stdin().await.expect("close");
    let h2 = sbx
        .commands
        .run("sleep 30")
        .background(true)
        .await
        .expect("bg");
    assert!(sbx.commands.kill(h2.pid).await.expect("kill"));
    assert!(!sbx.commands.kill(999_999).await.expect("kill unknown"));
    let err = sbx.commands.connect(999_999).await.unwrap_err();
    assert!(err.is_not_found(), "{err:?}");
    eventually(PATIENCE, "killed processes leave the list", || async {
        let running = sbx.commands.list().await.expect("list");
        holds(!running.iter().any(|p| p.pid == h2.pid), running)
    })
    .await;
    drop(h);
    sbx.kill().await.expect("kill");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_timeout_ends_the_stream_not_the_process() {
    use futures::StreamExt;
    let sbx = sandbox("connect-timeout").await;
    let h = sbx
        .commands
        .run("sleep 30")
        .background(true)
        .timeout(0)
        .await
        .expect("bg");
    let mut attached = sbx
        .commands
        .connect(h.pid)
        .timeout(1)
        .await
        .expect("connect");
    // Through the Stream impl: the deadline ends the stream with a TimeoutException.
    let item = StreamExt::next(&mut attached).await.expect("an item");
    assert!(item.unwrap_err().is_timeout());
    assert!(attached.next().await.is_none(), "the stream has ended");
    let running = sbx.commands.list().await.expect("list");
    assert!(
        running.iter().any(|p| p.pid == h.pid),
        "the process keeps running"
    );
    assert!(h.kill().await.expect("kill"));
    sbx.kill().await.expect("kill");
}

/// Killing a sandbox while a command's handle is waited on raises `Timeout` ("killed or
/// reached its end of life"), as the SDK does once its health probe finds the sandbox gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_killed_while_a_command_is_waited_on_raises_timeout() {
    let sbx = e2b::Sandbox::create().timeout(60).await.expect("create");
    let mut handle = sbx
        .commands
        .run("sleep 600")
        .background(true)
        .await
        .expect("run");
    e2b::Sandbox::kill(sbx.sandbox_id.clone())
        .await
        .expect("kill");
    let err = handle.wait().await.unwrap_err();
    assert!(err.is_timeout(), "{err:?}");
    assert!(
        err.to_string()
            .contains("killed or reached its end of life"),
        "{err}"
    );
}

/// Callbacks given at the start fire as output arrives, from a task of their own, as the
/// async SDK's do: a program that waits for a prompt before calling `wait()` sees it. The
/// output went to the callbacks, so iterating the handle yields nothing; `wait()` still
/// returns the whole result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_callbacks_fire_before_anyone_waits() {
    let sbx = e2b::Sandbox::create().timeout(60).await.expect("create");
    let seen = Arc::new(Mutex::new(String::new()));
    let sink = seen.clone();
    let mut handle = sbx
        .commands
        .run("echo ready; read line; echo got $line")
        .background(true)
        .stdin(true)
        .on_stdout(move |s| sink.lock().unwrap().push_str(&s))
        .await
        .expect("run");
    eventually(PATIENCE, "the prompt reached the callback", || async {
        let s = seen.lock().unwrap().clone();
        holds(s.contains("ready"), s)
    })
    .await;
    handle.send_stdin("x\n").await.expect("stdin");
    let result = handle.wait().await.expect("wait");
    assert_eq!(result.stdout, "ready\ngot x\n");
    assert_eq!(seen.lock().unwrap().as_str(), "ready\ngot x\n");
    assert!(handle.next().await.is_none());
    // A terminal's `on_data` likewise, with nobody waiting.
    let bytes = Arc::new(Mutex::new(Vec::new()));
    let sink = bytes.clone();
    let term = sbx
        .pty
        .create(e2b::PtySize { rows: 24, cols: 80 }, move |b| {
            sink.lock().unwrap().extend(b)
        })
        .await;
    if !caps().await.pty {
        assert_not_supported(term, "pty");
        return;
    }
    let mut term = term.expect("pty");
    term.send_stdin("echo pty-$((40+2))\n")
        .await
        .expect("stdin");
    eventually(
        PATIENCE,
        "the terminal's output reached on_data",
        || async {
            let b = String::from_utf8_lossy(&bytes.lock().unwrap()).to_string();
            holds(b.contains("pty-42"), b)
        },
    )
    .await;
    term.kill().await.expect("kill");
    let _ = term.wait().await;
}
