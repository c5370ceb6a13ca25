//! Watching files, terminals and metrics.

use super::*;
use sandcove::{ResizePtyOptions, WriteStdinOptions};

/// A watch reports creates, writes, chmods, renames and removes; dropping it stops it.
pub async fn watch_reports_changes(backend: &dyn Backend) {
    let id = create(backend, &unique("watch")).await;
    backend
        .mkdir(&id, "w/sub", MkdirOptions::default())
        .await
        .expect("mkdir");
    let mut options = WatchOptions::default();
    options.recursive = true;
    if !backend.capabilities().watch {
        expect_code(
            backend.watch(&id, "w", options).await.map(drop),
            ErrorCode::NotSupported,
            "watch",
        );
        backend.destroy(&id).await.expect("destroy");
        return;
    }
    let mut events = backend
        .watch(&id, "w", options.clone())
        .await
        .expect("watch");
    sh(
        backend,
        &id,
        "cd w && echo a > f && chmod 600 f && mv f g && echo deep > sub/d && rm g",
    )
    .await;
    let mut seen = Vec::new();
    let want = [
        (FsEventKind::Create, "f"),
        (FsEventKind::Write, "f"),
        (FsEventKind::Chmod, "f"),
        (FsEventKind::Rename, "f"),
        (FsEventKind::Rename, "g"),
        (FsEventKind::Create, "sub/d"),
        (FsEventKind::Remove, "g"),
    ];
    while !want.iter().all(|w| seen.contains(&(w.0, w.1.to_string()))) {
        match tokio::time::timeout(PATIENCE, events.next()).await {
            Ok(Some(Ok(ev))) => {
                assert!(ev.path.starts_with("/workspace/w/"), "{ev:?}");
                seen.push((ev.kind, ev.name));
            }
            other => panic!("expected events {want:?}, saw {seen:?}, then {other:?}"),
        }
    }
    // Writes through the file API read as writes: a create and a write for a new file, a
    // write for an existing one, and never the engine's temporary file.
    write(backend, &id, "w/api.txt", b"1").await;
    write(backend, &id, "w/api.txt", b"2").await;
    let mut api_events = Vec::new();
    while api_events
        .iter()
        .filter(|k| **k == FsEventKind::Write)
        .count()
        < 2
    {
        match tokio::time::timeout(PATIENCE, events.next()).await {
            Ok(Some(Ok(ev))) => {
                assert!(
                    !ev.name.contains(".sandcove-"),
                    "temporary file shown: {ev:?}"
                );
                if ev.name == "api.txt" {
                    api_events.push(ev.kind);
                }
            }
            other => panic!("expected API write events, saw {api_events:?}, then {other:?}"),
        }
    }
    assert_eq!(
        api_events,
        [FsEventKind::Create, FsEventKind::Write, FsEventKind::Write]
    );
    // Asked for, a file an API write creates shows its ownership being set between the
    // two, as E2B's daemon reports it; an overwrite is still one write. Recursively too.
    let mut owned = backend
        .watch(&id, "w", options.clone().report_ownership(true))
        .await
        .expect("watch reporting ownership");
    write(backend, &id, "w/sub/owned.txt", b"1").await;
    write(backend, &id, "w/sub/owned.txt", b"2").await;
    let mut owned_events = Vec::new();
    while owned_events
        .iter()
        .filter(|k| **k == FsEventKind::Write)
        .count()
        < 2
    {
        match tokio::time::timeout(PATIENCE, owned.next()).await {
            Ok(Some(Ok(ev))) if ev.name == "sub/owned.txt" => owned_events.push(ev.kind),
            Ok(Some(Ok(_))) => {}
            other => panic!("expected API write events, saw {owned_events:?}, then {other:?}"),
        }
    }
    assert_eq!(
        owned_events,
        [
            FsEventKind::Create,
            FsEventKind::Chmod,
            FsEventKind::Write,
            FsEventKind::Write
        ]
    );
    drop(owned);
    // Files made in a directory before its watch was added are reported too.
    sh(
        backend,
        &id,
        "mkdir -p w/new/deeper && echo x > w/new/deeper/f",
    )
    .await;
    let want = ["new", "new/deeper", "new/deeper/f"];
    let mut created: Vec<String> = Vec::new();
    while !want.iter().all(|w| created.iter().any(|c| c == w)) {
        match tokio::time::timeout(PATIENCE, events.next()).await {
            Ok(Some(Ok(ev))) if ev.kind == FsEventKind::Create => created.push(ev.name),
            Ok(Some(Ok(_))) => {}
            other => panic!("expected creates of {want:?}, saw {created:?}, then {other:?}"),
        }
    }
    expect_code(
        backend.watch(&id, "nope", options.clone()).await.map(drop),
        ErrorCode::NotFound,
        "watch missing",
    );
    drop(events);
    backend.destroy(&id).await.expect("destroy");
}

/// A process on a terminal: a tty, its size, resize, input and exit status.
pub async fn pty_processes(backend: &dyn Backend) {
    let id = create(backend, &unique("pty")).await;
    let mut spec = ProcessSpec::new(Command::argv(["bash", "--norc", "--noprofile", "-i"]));
    spec.pty = Some(PtySize { cols: 80, rows: 24 });
    if !backend.capabilities().pty {
        expect_code(
            backend.spawn(&id, spec).await.map(|s| s.pid),
            ErrorCode::NotSupported,
            "pty",
        );
        backend.destroy(&id).await.expect("destroy");
        return;
    }
    let mut stream = backend.spawn(&id, spec).await.expect("spawn on a pty");
    let sel = ProcessSelector::Pid(stream.pid);
    let mut seen = Vec::new();
    backend
        .write_stdin(
            &id,
            sel.clone(),
            WriteStdinOptions::new(b"tty; stty size; echo MARK$((40+2))\n"),
        )
        .await
        .expect("input");
    read_until(&mut stream, &mut seen, |s| s.contains("MARK42")).await;
    let text = String::from_utf8_lossy(&seen).into_owned();
    assert!(text.contains("/dev/pts/"), "{text}");
    assert!(text.contains("24 80"), "{text}");
    backend
        .resize_pty(
            &id,
            sel.clone(),
            ResizePtyOptions::new(PtySize {
                cols: 100,
                rows: 30,
            }),
        )
        .await
        .expect("resize");
    backend
        .write_stdin(
            &id,
            sel.clone(),
            WriteStdinOptions::new(b"stty size; exit 7\n"),
        )
        .await
        .expect("input");
    let rest = collect(stream, usize::MAX).await.expect("collect");
    assert!(
        String::from_utf8_lossy(&rest.stdout).contains("30 100"),
        "{:?}",
        rest.stdout_lossy()
    );
    assert_eq!(rest.exit_status().code, Some(7));
    let plain = backend
        .spawn(&id, ProcessSpec::new(Command::argv(["sleep", "5"])))
        .await
        .expect("spawn");
    expect_code(
        backend
            .resize_pty(
                &id,
                ProcessSelector::Pid(plain.pid),
                ResizePtyOptions::new(PtySize { cols: 1, rows: 1 }),
            )
            .await,
        ErrorCode::InvalidArgument,
        "resize without a pty",
    );
    backend.destroy(&id).await.expect("destroy");
}

/// Metrics report memory, disk and CPU figures.
pub async fn metrics_report_usage(backend: &dyn Backend) {
    let id = create(backend, &unique("metrics")).await;
    if !backend.capabilities().metrics {
        expect_code(
            backend.metrics(&id).await,
            ErrorCode::NotSupported,
            "metrics",
        );
        backend.destroy(&id).await.expect("destroy");
        return;
    }
    let mut stream = backend
        .spawn(
            &id,
            ProcessSpec::new(Command::sh(
                "head -c 20000000 /dev/zero > /tmp/z; echo written; sleep 30",
            )),
        )
        .await
        .expect("spawn");
    // Wait for the write to be done (the process says so), not for a guessed time.
    read_until(&mut stream, &mut Vec::new(), |s| s.contains("written")).await;
    let m = eventually(PATIENCE, "metrics count the 20 MB written", || async {
        let m = backend.metrics(&id).await.expect("metrics");
        if m.disk_used >= 20_000_000 {
            Ok(m)
        } else {
            Err(m)
        }
    })
    .await;
    assert!(m.mem_used > 0, "{m:?}");
    assert!(m.mem_total >= m.mem_used, "{m:?}");
    assert!(m.cpu_count >= 1);
    assert!(m.disk_total >= m.disk_used, "{m:?}");
    // Where no container gives the agent its own `/tmp` (a pod agent run on a host, as the
    // tests do), the file would outlive the sandbox.
    sh(backend, &id, "rm -f /tmp/z").await;
    backend.destroy(&id).await.expect("destroy");
}

// ---------------------------------------------------------------------------------------------
// Annotations and stop/start
// ---------------------------------------------------------------------------------------------
