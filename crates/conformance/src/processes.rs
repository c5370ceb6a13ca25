//! Processes: commands, output, environment, users, stdin, signals, timeouts, attach and restarts.

use super::*;
use sandcove::{SignalOptions, WriteStdinOptions};

/// Argv runs without a shell; shell scripts run through the named shell.
pub async fn argv_and_shell_commands(backend: &dyn Backend) {
    let id = create(backend, &unique("exec")).await;
    let out = run(
        backend,
        &id,
        ProcessSpec::new(Command::argv(["echo", "a b", "$HOME"])),
    )
    .await;
    assert_eq!(out.stdout, b"a b $HOME\n", "argv is not shell-interpreted");
    assert!(out.exit_status().success());
    let out = sh(backend, &id, "echo one | tr a-z A-Z; echo two").await;
    assert_eq!(out.stdout, b"ONE\ntwo\n");
    let out = run(
        backend,
        &id,
        ProcessSpec::new(Command::bash_login(
            "echo $0; shopt -q login_shell && echo login",
        )),
    )
    .await;
    assert_eq!(out.stdout_lossy(), "/bin/bash\nlogin\n");
    backend.destroy(&id).await.expect("destroy");
}

/// Exit codes come back; stderr is separate from stdout.
pub async fn exit_codes_and_stderr(backend: &dyn Backend) {
    let id = create(backend, &unique("exit")).await;
    let out = sh(backend, &id, "echo out; echo err >&2; exit 3").await;
    assert_eq!(out.stdout, b"out\n");
    assert_eq!(out.stderr, b"err\n");
    assert_eq!(out.exit_status().code, Some(3));
    assert!(!out.truncated);
    let out = sh(backend, &id, "kill -TERM $$").await;
    assert_eq!(out.exit_status().signal, Some(libc::SIGTERM));
    assert_eq!(out.exit_code(), 128 + libc::SIGTERM);
    backend.destroy(&id).await.expect("destroy");
}

/// NUL bytes and invalid UTF-8 arrive exactly as written.
pub async fn output_is_binary_safe(backend: &dyn Backend) {
    let id = create(backend, &unique("binary")).await;
    let out = sh(
        backend,
        &id,
        r"printf 'a\000b\377\303\050c'; printf '\000' >&2",
    )
    .await;
    assert_eq!(out.stdout, [b'a', 0, b'b', 0xff, 0xc3, 0x28, b'c']);
    assert_eq!(out.stderr, [0]);
    backend.destroy(&id).await.expect("destroy");
}

/// 10 MB of output arrive complete and in order.
pub async fn large_output_streams_without_loss(backend: &dyn Backend) {
    let id = create(backend, &unique("bigout")).await;
    let n = 10 * 1024 * 1024;
    let out = sh(
        backend,
        &id,
        &format!("seq 1 2000000 | head -c {n}; echo done >&2"),
    )
    .await;
    assert_eq!(out.stdout.len(), n, "every byte arrives");
    let expected: Vec<u8> = (1..=2_000_000u32)
        .flat_map(|i| format!("{i}\n").into_bytes())
        .take(n)
        .collect();
    assert!(out.stdout == expected, "bytes arrive in order, unchanged");
    assert_eq!(out.stderr, b"done\n");
    backend.destroy(&id).await.expect("destroy");
}

/// Sandbox envs reach every process; a process's own value wins.
pub async fn sandbox_and_process_envs(backend: &dyn Backend) {
    let mut options = test_options(&unique("envs"));
    options.envs.insert("SHARED".into(), "sandbox".into());
    options.envs.insert("OVERRIDE".into(), "sandbox".into());
    let id = backend.create(options).await.expect("create").id;
    let spec = ProcessSpec::new(Command::sh("echo $SHARED $OVERRIDE $ONLY"))
        .env("OVERRIDE", "process")
        .env("ONLY", "x y");
    assert_eq!(
        run(backend, &id, spec).await.stdout,
        b"sandbox process x y\n"
    );
    backend.destroy(&id).await.expect("destroy");
    let mut bad = test_options("bad-env");
    bad.envs.insert("A=B".into(), "x".into());
    expect_code(
        backend.create(bad).await,
        ErrorCode::InvalidArgument,
        "create with an invalid env name",
    );
}

/// Empty argv, NUL bytes and bad env names are refused before anything runs.
pub async fn bad_process_input_is_refused(backend: &dyn Backend) {
    let id = create(backend, &unique("badinput")).await;
    let cases = [
        ProcessSpec::new(Command::Argv(vec![])),
        ProcessSpec::new(Command::argv([""])),
        ProcessSpec::new(Command::argv(["echo", "a\0b"])),
        ProcessSpec::new(Command::argv(["true"])).env("", "x"),
        ProcessSpec::new(Command::argv(["true"])).env("A=B", "x"),
        ProcessSpec::new(Command::argv(["true"])).env("NUL\0", "x"),
        ProcessSpec::new(Command::argv(["true"])).env("V", "a\0b"),
        ProcessSpec::new(Command::argv(["true"])).cwd("/tmp\0x"),
    ];
    for spec in cases {
        let shown = format!("{spec:?}");
        expect_code(
            backend.spawn(&id, spec).await.map(|_| ()),
            ErrorCode::InvalidArgument,
            &shown,
        );
    }
    assert!(
        backend.list_processes(&id).await.expect("list").is_empty(),
        "nothing was started"
    );
    backend.destroy(&id).await.expect("destroy");
}

/// A missing program is a `NotFound` error at once, not a hang or a 127.
pub async fn missing_binary_is_not_found(backend: &dyn Backend) {
    let id = create(backend, &unique("nobin")).await;
    let start = Instant::now();
    let result = backend
        .spawn(
            &id,
            ProcessSpec::new(Command::argv(["no-such-program-xyz"])),
        )
        .await;
    expect_code(
        result.map(|s| s.pid),
        ErrorCode::NotFound,
        "missing program",
    );
    // Generous for a loaded machine, yet far below a hang.
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "refused promptly"
    );
    backend.destroy(&id).await.expect("destroy");
}

/// The default cwd is the home; a cwd can be chosen; a missing one is `NotFound`.
pub async fn working_directory(backend: &dyn Backend) {
    let id = create(backend, &unique("cwd")).await;
    let root = process_root(backend, &id, "/workspace", "working_directory").await;
    assert_eq!(
        sh(backend, &id, "pwd").await.stdout_lossy(),
        format!("{root}/workspace\n")
    );
    let spec = ProcessSpec::new(Command::argv(["pwd"])).cwd("/tmp");
    assert_eq!(
        run(backend, &id, spec).await.stdout_lossy(),
        format!("{root}/tmp\n")
    );
    backend
        .mkdir(&id, "sub/dir", MkdirOptions::default())
        .await
        .expect("mkdir");
    let spec = ProcessSpec::new(Command::argv(["pwd"])).cwd("sub/dir");
    assert_eq!(
        run(backend, &id, spec).await.stdout_lossy(),
        format!("{root}/workspace/sub/dir\n"),
        "relative cwd resolves against the home"
    );
    let spec = ProcessSpec::new(Command::argv(["pwd"])).cwd("/no/such/dir");
    expect_code(
        backend.spawn(&id, spec).await.map(|s| s.pid),
        ErrorCode::NotFound,
        "missing cwd",
    );
    backend.destroy(&id).await.expect("destroy");
}

/// `whoami` prints the configured default user; HOME is the workspace.
pub async fn default_user_and_home(backend: &dyn Backend) {
    let id = create(backend, &unique("home")).await;
    let root = process_root(backend, &id, "/workspace", "default_user_and_home").await;
    if backend.capabilities().isolated {
        let out = sh(backend, &id, "whoami; echo $HOME; pwd").await;
        assert_eq!(out.stdout_lossy(), "user\n/workspace\n/workspace\n");
    } else {
        // Without a user namespace processes run as the host user that runs the sandbox's
        // agent (the engine's, or a Pod's): the uid the backend reports.
        skipped(
            "default_user_and_home",
            "un-isolated processes run as the host user: checking the uid, not the name",
        );
        let uid = backend.get(&id).await.expect("get").user.uid;
        let out = sh(backend, &id, "id -u; echo $HOME; pwd").await;
        assert_eq!(
            out.stdout_lossy(),
            format!("{uid}\n{root}/workspace\n{root}/workspace\n")
        );
    }
    backend.destroy(&id).await.expect("destroy");
    // A vendor-style user and home: both are what processes and file calls see.
    let mut options = test_options(&unique("user"));
    options.user = Some("alice".into());
    options.home = Some("/home/alice".into());
    let info = backend.create(options).await.expect("create");
    assert_eq!(info.user.name, "alice");
    assert_eq!(info.user.home, "/home/alice");
    let root = process_root(backend, &info.id, "/home/alice", "default_user_and_home").await;
    if backend.capabilities().isolated {
        let out = sh(backend, &info.id, "whoami; echo $HOME $USER; id -un; pwd").await;
        assert_eq!(
            out.stdout_lossy(),
            "alice\n/home/alice alice\nalice\n/home/alice\n"
        );
    } else {
        let out = sh(backend, &info.id, "echo $HOME $USER; pwd").await;
        assert_eq!(
            out.stdout_lossy(),
            format!("{root}/home/alice alice\n{root}/home/alice\n")
        );
    }
    write(backend, &info.id, "notes.txt", b"x").await;
    let stat = backend
        .stat(&info.id, "notes.txt", Default::default())
        .await
        .expect("stat");
    assert_eq!(stat.path, "/home/alice/notes.txt");
    assert_eq!(stat.owner, "alice");
    backend.destroy(&info.id).await.expect("destroy");
    for bad in ["relative", "/usr/x", "/", "/home/../etc"] {
        let mut options = test_options("bad-home");
        options.home = Some(bad.into());
        expect_code(
            backend.create(options).await,
            ErrorCode::InvalidArgument,
            bad,
        );
    }
}

/// Another user works where several uids are mappable, and is refused where not.
pub async fn running_as_another_user(backend: &dyn Backend) {
    let id = create(backend, &unique("root")).await;
    let spec = ProcessSpec::new(Command::sh("whoami; id -u")).user("root");
    if backend.capabilities().multiple_users {
        let out = run(backend, &id, spec).await;
        assert_eq!(out.stdout_lossy(), "root\n0\n");
        let out = sh(backend, &id, "id -u").await;
        assert_ne!(out.stdout_lossy(), "0\n", "the default user is not root");
    } else {
        expect_code(
            backend.spawn(&id, spec).await.map(|s| s.pid),
            ErrorCode::NotSupported,
            "run as root without multiple uids",
        );
    }
    let spec = ProcessSpec::new(Command::argv(["true"])).user("nosuchuser");
    let result = backend.spawn(&id, spec).await.map(|s| s.pid);
    assert!(
        matches!(&result, Err(e) if matches!(e.code(), ErrorCode::InvalidArgument | ErrorCode::NotSupported)),
        "unknown user: {result:?}"
    );
    backend.destroy(&id).await.expect("destroy");
}

/// Bytes written to stdin reach the process; closing stdin ends `cat`.
pub async fn stdin_write_and_close(backend: &dyn Backend) {
    let id = create(backend, &unique("stdin")).await;
    let spec = ProcessSpec::new(Command::argv(["cat"])).stdin(true);
    let stream = backend.spawn(&id, spec).await.expect("spawn");
    let sel = ProcessSelector::Pid(stream.pid);
    backend
        .write_stdin(&id, sel.clone(), WriteStdinOptions::new(b"hello \x00\xff"))
        .await
        .expect("write stdin");
    backend
        .write_stdin(&id, sel.clone(), WriteStdinOptions::new(b"world"))
        .await
        .expect("write stdin");
    backend.close_stdin(&id, sel.clone()).await.expect("close");
    let out = tokio::time::timeout(PATIENCE, collect(stream, usize::MAX))
        .await
        .expect("cat ends after stdin closes")
        .expect("collect");
    assert_eq!(out.stdout, b"hello \x00\xffworld");
    assert!(out.exit_status().success());
    // Without stdin enabled, the process reads EOF and writing is refused.
    let out = run(backend, &id, ProcessSpec::new(Command::argv(["cat"]))).await;
    assert!(out.stdout.is_empty() && out.exit_status().success());
    let stream = backend
        .spawn(&id, ProcessSpec::new(Command::argv(["sleep", "30"])))
        .await
        .expect("spawn");
    expect_code(
        backend
            .write_stdin(
                &id,
                ProcessSelector::Pid(stream.pid),
                WriteStdinOptions::new(b"x"),
            )
            .await,
        ErrorCode::InvalidArgument,
        "stdin not enabled",
    );
    backend.destroy(&id).await.expect("destroy");
}

/// Signals reach the process group; a process killed mid-stream reports the signal and the
/// output it wrote before.
pub async fn signals_and_kill_mid_stream(backend: &dyn Backend) {
    let id = create(backend, &unique("signal")).await;
    let mut stream = backend
        .spawn(
            &id,
            ProcessSpec::new(Command::sh(
                "echo started; while true; do echo tick; sleep 0.05; done",
            )),
        )
        .await
        .expect("spawn");
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("tick") {
        match stream.events.next().await {
            Some(Ok(ProcessEvent::Stdout(b))) => seen.extend(b),
            other => panic!("expected output, got {other:?}"),
        }
    }
    backend
        .signal(
            &id,
            ProcessSelector::Pid(stream.pid),
            SignalOptions::new(Signal::Kill),
        )
        .await
        .expect("kill");
    let rest = collect(stream, usize::MAX).await.expect("collect");
    seen.extend(rest.stdout);
    assert!(seen.starts_with(b"started\ntick\n"));
    assert_eq!(rest.status.and_then(|s| s.signal), Some(libc::SIGKILL));
    // Signalling a finished process is NotFound.
    let out = sh(backend, &id, "true").await;
    expect_code(
        backend
            .signal(
                &id,
                ProcessSelector::Pid(out.pid),
                SignalOptions::new(Signal::Term),
            )
            .await,
        ErrorCode::NotFound,
        "signal a finished process",
    );
    backend.destroy(&id).await.expect("destroy");
}

/// A process timeout kills the whole group and says so.
pub async fn process_timeout_kills_the_group(backend: &dyn Backend) {
    let id = create(backend, &unique("ptimeout")).await;
    let start = Instant::now();
    // The background sleep names itself on stderr by pid and start time (field 22 of its
    // stat), so the check below finds exactly it: without isolation `ps` would show every
    // `sleep` on the host.
    let spec = ProcessSpec::new(Command::sh(
        "sleep 600 & echo \"$! $(cut -d' ' -f22 /proc/$!/stat)\" >&2; sleep 30; echo never",
    ))
    .timeout(Duration::from_millis(500));
    let out = run(backend, &id, spec).await;
    // The foreground sleep lasts 30 s: ending well before that is the kill, even on a loaded
    // machine. The background one outlasts the wait below, so only the kill ends it there.
    assert!(start.elapsed() < Duration::from_secs(25), "killed promptly");
    let status = out.exit_status();
    assert!(status.timed_out, "reported as a timeout: {status:?}");
    assert_eq!(status.signal, Some(libc::SIGKILL));
    assert!(out.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let (pid, started) = stderr
        .trim()
        .split_once(' ')
        .filter(|(pid, started)| pid.parse::<u32>().is_ok() && started.parse::<u64>().is_ok())
        .unwrap_or_else(|| panic!("the background sleep's pid and start: {stderr:?}"));
    // The orphaned background sleep is reaped by PID 1 on its own schedule: wait until no
    // process with its pid and start time is left.
    let check = format!("cut -d' ' -f22 /proc/{pid}/stat 2>/dev/null || true");
    let (check, id) = (&check, &id);
    eventually(PATIENCE, "the background sleep died too", || async move {
        let id = id.as_str();
        let left = sh(backend, id, check).await.stdout_lossy();
        holds(left.trim() != started, left)
    })
    .await;
    backend.destroy(id).await.expect("destroy");
}

/// Processes are listed with their tags; attaching replays retained output, then goes live.
pub async fn list_and_attach_processes(backend: &dyn Backend) {
    let id = create(backend, &unique("attach")).await;
    let spec = ProcessSpec::new(Command::sh("echo first; read line; echo got $line"))
        .tag("worker")
        .stdin(true);
    let first = backend.spawn(&id, spec.clone()).await.expect("spawn");
    let pid = first.pid;
    drop(first); // dropping a stream does not kill the process
    let listed = backend.list_processes(&id).await.expect("list");
    let entry = listed.iter().find(|p| p.pid == pid).expect("listed");
    assert_eq!(entry.tag.as_deref(), Some("worker"));
    assert!(entry.exit.is_none(), "still running");
    expect_code(
        backend.spawn(&id, spec).await.map(|s| s.pid),
        ErrorCode::AlreadyExists,
        "a second running process with the same tag",
    );
    let mut attached = backend
        .attach(&id, ProcessSelector::Tag("worker".into()))
        .await
        .expect("attach");
    assert_eq!(attached.pid, pid);
    // The first output, retained or (when the attach came first) live after the marker.
    let mut next = attached.events.next().await;
    if matches!(next, Some(Ok(ProcessEvent::Live))) {
        next = attached.events.next().await;
    }
    match next {
        Some(Ok(ProcessEvent::Stdout(b))) => assert_eq!(b, b"first\n"),
        other => panic!("expected the first output, got {other:?}"),
    }
    backend
        .write_stdin(
            &id,
            ProcessSelector::Tag("worker".into()),
            WriteStdinOptions::new(b"x\n"),
        )
        .await
        .expect("stdin");
    let rest = collect(attached, usize::MAX).await.expect("collect");
    assert_eq!(rest.stdout, b"got x\n");
    // After exit, attach still replays the whole output and the status.
    let late = backend
        .attach(&id, ProcessSelector::Pid(pid))
        .await
        .expect("attach after exit");
    let out = collect(late, usize::MAX).await.expect("collect");
    assert_eq!(out.stdout, b"first\ngot x\n");
    let listed = backend.list_processes(&id).await.expect("list");
    let entry = listed.iter().find(|p| p.pid == pid).expect("still listed");
    assert!(entry.exit.is_some());
    assert!(
        entry.ended_at.is_some_and(|t| t >= entry.started_at),
        "an end time: {entry:?}"
    );
    assert!(out.exit_status().success());
    expect_code(
        backend
            .attach(&id, ProcessSelector::Pid(999_999))
            .await
            .map(|s| s.pid),
        ErrorCode::NotFound,
        "attach to an unknown pid",
    );
    backend.destroy(&id).await.expect("destroy");
}

/// The events of an attach up to its [`ProcessEvent::Live`] marker (which must come, and
/// promptly: it follows the retained history without waiting for the process).
async fn history_of(stream: &mut sandcove::ProcessStream) -> Vec<ProcessEvent> {
    let mut seen = Vec::new();
    loop {
        let next = tokio::time::timeout(PATIENCE, stream.events.next()).await;
        match next {
            Ok(Some(Ok(ProcessEvent::Live))) => return seen,
            Ok(Some(Ok(ProcessEvent::Exit(s)))) => panic!(
                "attach reached the exit {s:?} without a live marker after {}",
                summary(&seen)
            ),
            Ok(Some(Ok(ev))) => seen.push(ev),
            Ok(Some(Err(e))) => panic!("attach failed before its live marker: {e}"),
            Ok(None) => panic!("attach ended before its live marker"),
            Err(_) => panic!(
                "no live marker within {PATIENCE:?}; history so far: {}",
                summary(&seen)
            ),
        }
    }
}

/// A short description of a list of events (for messages; histories can be megabytes).
fn summary(events: &[ProcessEvent]) -> String {
    format!(
        "{} events, {} stdout bytes",
        events.len(),
        stdout_of(events).len()
    )
}

/// Stdout bytes of a list of events.
fn stdout_of(events: &[ProcessEvent]) -> Vec<u8> {
    events
        .iter()
        .filter_map(|e| match e {
            ProcessEvent::Stdout(b) => Some(b.as_slice()),
            _ => None,
        })
        .flatten()
        .copied()
        .collect()
}

/// Attach returns the retained history, then one `Live` marker, then live events; spawn never
/// emits the marker. "Logs so far" is exact whatever the load: megabytes of history all come
/// before the marker, and nothing written later does.
pub async fn attach_marks_where_live_output_starts(backend: &dyn Backend) {
    let id = create(backend, &unique("live")).await;
    // Spawn streams never carry the marker.
    let spawned = backend
        .spawn(&id, ProcessSpec::new(Command::sh("echo hi; echo oops >&2")))
        .await
        .expect("spawn");
    let events: Vec<_> = spawned.events.collect().await;
    assert!(
        events.iter().all(|e| !matches!(e, Ok(ProcessEvent::Live))),
        "spawn emitted a live marker: {events:?}"
    );
    // A process with a lot of history that then waits for input.
    let script = "head -c 3000000 /dev/zero | tr '\\0' a; echo; echo ready; read x; echo after $x";
    let spec = ProcessSpec::new(Command::sh(script))
        .tag("talker")
        .stdin(true);
    let pid = backend.spawn(&id, spec).await.expect("spawn").pid;
    let mut want = vec![b'a'; 3_000_000];
    want.extend_from_slice(b"\nready\n");
    let attached = eventually(PATIENCE, "the history ends with ready", || async {
        let mut stream = backend
            .attach(&id, ProcessSelector::Tag("talker".into()))
            .await
            .map_err(|e| e.to_string())?;
        let history = history_of(&mut stream).await;
        let out = stdout_of(&history);
        if out.ends_with(b"ready\n") {
            Ok(stream)
        } else {
            Err(format!("{} bytes so far", out.len()))
        }
    })
    .await;
    assert_eq!(attached.pid, pid);
    // The retained history was complete (checked once more on a fresh attach).
    let mut again = backend
        .attach(&id, ProcessSelector::Pid(pid))
        .await
        .expect("attach");
    let history = history_of(&mut again).await;
    assert_eq!(
        stdout_of(&history).len(),
        want.len(),
        "whole history before the marker"
    );
    assert!(stdout_of(&history) == want, "history bytes intact");
    drop(again);
    // After the marker: only what happens now.
    backend
        .write_stdin(
            &id,
            ProcessSelector::Pid(pid),
            WriteStdinOptions::new(b"x\n"),
        )
        .await
        .expect("stdin");
    let live = collect(attached, usize::MAX).await.expect("live part");
    assert_eq!(live.stdout, b"after x\n", "live events follow the marker");
    assert!(live.exit_status().success());
    // After the exit: the whole history, the marker, then the exit.
    let mut late = backend
        .attach(&id, ProcessSelector::Pid(pid))
        .await
        .expect("attach after exit");
    let history = history_of(&mut late).await;
    want.extend_from_slice(b"after x\n");
    assert!(stdout_of(&history) == want, "full history after exit");
    let rest: Vec<_> = late.events.collect().await;
    assert!(
        matches!(rest.as_slice(), [Ok(ProcessEvent::Exit(s))] if s.success()),
        "only the exit after the marker: {rest:?}"
    );
    backend.destroy(&id).await.expect("destroy");
}

/// A restart policy brings a failing process back (up to its limit, as one logical process
/// with one final exit); success and API signals end it for good; attach by tag and by the
/// current pid reach the incarnation running now.
pub async fn restart_policy_restarts_failures(backend: &dyn Backend) {
    let id = create(backend, &unique("restart")).await;
    let policy = |max| {
        let mut policy = RestartPolicy::default();
        policy.max_restarts = max;
        policy
    };
    // Fails every time: 1 run + 2 restarts.
    let script = "n=$(cat $HOME/count 2>/dev/null || echo 0); n=$((n+1)); \
                  echo $n > $HOME/count; echo run $n; exit 3";
    let mut spec = ProcessSpec::new(Command::sh(script)).tag("flaky");
    spec.restart = Some(policy(Some(2)));
    let stream = backend.spawn(&id, spec).await.expect("spawn");
    let pid = stream.pid;
    let events: Vec<_> = stream
        .events
        .map(|e| e.expect("event"))
        .collect::<Vec<_>>()
        .await;
    assert_eq!(stdout_of(&events), b"run 1\nrun 2\nrun 3\n", "{events:?}");
    let restarts: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            ProcessEvent::Restarted {
                restarts, previous, ..
            } => Some((*restarts, previous.code)),
            _ => None,
        })
        .collect();
    assert_eq!(restarts, [(1, Some(3)), (2, Some(3))], "{events:?}");
    assert!(
        matches!(events.last(), Some(ProcessEvent::Exit(s)) if s.code == Some(3)),
        "one final exit, last: {events:?}"
    );
    let exits = events
        .iter()
        .filter(|e| matches!(e, ProcessEvent::Exit(_)))
        .count();
    assert_eq!(exits, 1, "one exit for the logical process");
    let info = backend
        .list_processes(&id)
        .await
        .expect("list")
        .into_iter()
        .find(|p| p.pid == pid)
        .expect("listed under its first pid");
    assert_eq!(info.restarts, 2);
    assert_eq!(info.restart, Some(policy(Some(2))));
    assert_ne!(info.current_pid, pid, "a later incarnation ran last");
    assert!(info.exit.is_some_and(|s| s.code == Some(3)));
    assert!(info.ended_at.is_some());
    // Attach replays the restarts in place.
    let mut late = backend
        .attach(&id, ProcessSelector::Tag("flaky".into()))
        .await
        .expect("attach");
    let history = history_of(&mut late).await;
    let shape: Vec<&str> = history
        .iter()
        .map(|e| match e {
            ProcessEvent::Stdout(_) => "out",
            ProcessEvent::Restarted { .. } => "restart",
            _ => "other",
        })
        .collect();
    assert_eq!(shape, ["out", "restart", "out", "restart", "out"]);

    // Success is not restarted.
    let mut spec = ProcessSpec::new(Command::sh("echo fine"));
    spec.restart = Some(policy(None));
    let out = run(backend, &id, spec).await;
    assert_eq!(out.stdout, b"fine\n");
    assert!(out.exit_status().success());

    // First incarnation fails, the second stays up: tag and current pid reach it, and a
    // signal through the API ends it for good (unlimited restarts notwithstanding).
    let script = "if [ -e $HOME/second ]; then echo second; exec sleep 1000; fi; \
                  touch $HOME/second; echo first; exit 1";
    let mut spec = ProcessSpec::new(Command::sh(script)).tag("phoenix");
    spec.restart = Some(policy(None));
    let pid = backend.spawn(&id, spec).await.expect("spawn").pid;
    let current = eventually(PATIENCE, "the second incarnation runs", || async {
        let list = backend
            .list_processes(&id)
            .await
            .map_err(|e| e.to_string())?;
        let p = list.iter().find(|p| p.pid == pid).ok_or("not listed")?;
        if p.restarts == 1 && p.exit.is_none() {
            Ok(p.current_pid)
        } else {
            Err(format!("{p:?}"))
        }
    })
    .await;
    assert_ne!(current, pid);
    let mut by_tag = backend
        .attach(&id, ProcessSelector::Tag("phoenix".into()))
        .await
        .expect("attach by tag");
    let history = eventually(PATIENCE, "the second incarnation wrote", || async {
        let mut s = backend
            .attach(&id, ProcessSelector::Pid(current))
            .await
            .map_err(|e| e.to_string())?;
        let h = history_of(&mut s).await;
        let out = stdout_of(&h);
        if out == b"first\nsecond\n" {
            Ok(h)
        } else {
            Err(String::from_utf8_lossy(&out).into_owned())
        }
    })
    .await;
    assert!(history.iter().any(
        |e| matches!(e, ProcessEvent::Restarted { pid: p, restarts: 1, .. } if *p == current)
    ));
    history_of(&mut by_tag).await;
    backend
        .signal(
            &id,
            ProcessSelector::Tag("phoenix".into()),
            SignalOptions::new(Signal::Kill),
        )
        .await
        .expect("kill");
    let rest = collect(by_tag, usize::MAX).await.expect("rest");
    assert_eq!(rest.exit_status().signal, Some(9), "{rest:?}");
    let info = backend
        .list_processes(&id)
        .await
        .expect("list")
        .into_iter()
        .find(|p| p.pid == pid)
        .expect("listed");
    assert_eq!(info.restarts, 1, "killed through the API: not restarted");
    assert!(info.exit.is_some());

    // A terminal belongs to one incarnation: refused.
    let mut spec = ProcessSpec::new(Command::argv(["true"]));
    spec.restart = Some(policy(None));
    spec.pty = Some(PtySize { cols: 80, rows: 24 });
    expect_code(
        backend.spawn(&id, spec).await.map(|s| s.pid),
        ErrorCode::InvalidArgument,
        "restart with a pty",
    );
    backend.destroy(&id).await.expect("destroy");
}
