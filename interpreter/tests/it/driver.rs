//! The code-context driver against the embedded engine and, through a loopback server, over
//! HTTP: every case runs on both.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use sandcove::{Backend, CreateOptions, ErrorCode, LocalBackend};
use sandcove_conformance::eventually;
use sandcove_interpreter::{
    mime, CellError, CellResult, ContextOptions, Event, Execution, Interpreter, RunOptions,
};

async fn local() -> Arc<dyn Backend> {
    Arc::new(LocalBackend::new().expect("local engine"))
}

async fn served() -> Arc<dyn Backend> {
    let engine = Arc::new(LocalBackend::new().expect("local engine"));
    Arc::new(sandcove_conformance::served(engine).await)
}

/// A fresh sandbox (with a lease, so a failed test leaves nothing for long) and its
/// interpreter.
async fn sandbox(backend: Arc<dyn Backend>) -> (Interpreter, Cleanup) {
    let options = CreateOptions::default().timeout(Duration::from_secs(300));
    let info = backend.create(options).await.expect("create a sandbox");
    (
        Interpreter::new(backend.clone(), info.id.clone()),
        Cleanup(backend, info.id),
    )
}

struct Cleanup(Arc<dyn Backend>, String);

impl Cleanup {
    async fn destroy(self) {
        self.0.destroy(&self.1).await.expect("destroy");
    }
}

/// Every event of a run, and the error it ended with, if any.
async fn drain(mut run: Execution) -> (Vec<Event>, Option<sandcove::Error>) {
    let mut events = Vec::new();
    while let Some(item) = run.next_event().await {
        match item {
            Ok(e) => events.push(e),
            Err(e) => return (events, Some(e)),
        }
    }
    (events, None)
}

/// Run a cell that must end normally.
async fn run(ctx: &sandcove_interpreter::Context, code: &str) -> Vec<Event> {
    let (events, err) = drain(ctx.run(code, RunOptions::new()).await.expect("run")).await;
    assert!(err.is_none(), "{code:?}: {err:?} after {events:?}");
    assert_eq!(events.last(), Some(&Event::End), "{events:?}");
    events
}

fn out(events: &[Event]) -> Vec<u8> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Stdout(c) => Some(c.data.clone()),
            _ => None,
        })
        .flatten()
        .collect()
}

fn err_out(events: &[Event]) -> Vec<u8> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Stderr(c) => Some(c.data.clone()),
            _ => None,
        })
        .flatten()
        .collect()
}

fn results(events: &[Event]) -> Vec<CellResult> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Result(r) => Some(r.clone()),
            _ => None,
        })
        .collect()
}

fn main_text(events: &[Event]) -> Option<String> {
    results(events)
        .into_iter()
        .find(|r| r.is_main_result)
        .and_then(|r| r.text().map(str::to_string))
}

fn error(events: &[Event]) -> Option<CellError> {
    events.iter().find_map(|e| match e {
        Event::Error(err) => Some(err.clone()),
        _ => None,
    })
}

fn count(events: &[Event]) -> Option<u64> {
    events.iter().find_map(|e| match e {
        Event::ExecutionCount(n) => Some(*n),
        _ => None,
    })
}

/// Kinds of events, in order, for order assertions.
fn kinds(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .map(|e| match e {
            Event::Stdout(c) => format!("stdout {}", String::from_utf8_lossy(&c.data).trim()),
            Event::Stderr(c) => format!("stderr {}", String::from_utf8_lossy(&c.data).trim()),
            Event::Result(r) => format!(
                "result {} {}",
                r.text().unwrap_or_default(),
                if r.is_main_result { "main" } else { "display" }
            ),
            Event::Error(e) => format!("error {}", e.name),
            Event::ExecutionCount(_) => "count".into(),
            Event::End => "end".into(),
            other => format!("{other:?}"),
        })
        .collect()
}

// ----- the cases -----

async fn state_persists_and_events_stream_in_order(backend: Arc<dyn Backend>) {
    let (interp, cleanup) = sandbox(backend).await;
    let ctx = interp
        .create_context(ContextOptions::new())
        .await
        .expect("context");
    let first = run(&ctx, "x = 1").await;
    assert_eq!(main_text(&first), None, "no trailing expression, no result");
    let events = run(
        &ctx,
        "import sys\nprint('out')\nprint('err', file=sys.stderr)\ndisplay(10)\nprint('more')\nx += 1\nx",
    )
    .await;
    assert_eq!(
        kinds(&events),
        [
            "stdout out",
            "stderr err",
            "result 10 display",
            "stdout more",
            "result 2 main",
            "count",
            "end"
        ]
    );
    assert_eq!(count(&events), Some(count(&first).unwrap() + 1));
    let events = run(
        &ctx,
        "def f(a):\n    return a * 3\nimport math\nf(x) + math.floor(0.5)",
    )
    .await;
    assert_eq!(main_text(&events).as_deref(), Some("6"));
    assert_eq!(
        main_text(&run(&ctx, "'text'").await).as_deref(),
        Some("'text'")
    );
    // Rich representations travel by MIME type.
    let events = run(
        &ctx,
        "class Rich:\n    def _repr_html_(self): return '<b>hi</b>'\n    def _repr_json_(self): return {'a': [1]}\n    def _repr_png_(self): return b'\\x89PNG'\nRich()",
    )
    .await;
    let r = &results(&events)[0];
    assert_eq!(r.get_str(mime::HTML), Some("<b>hi</b>"));
    assert_eq!(r.data[mime::JSON], serde_json::json!({"a": [1]}));
    assert_eq!(r.get_str(mime::PNG), Some("iVBORw=="));
    assert!(r.text().unwrap().contains("Rich object"));
    // Per-run envs apply to that run only.
    let envs = BTreeMap::from([("RUN_VAR".to_string(), "yes".to_string())]);
    let (events, e) = drain(
        ctx.run(
            "import os; print(os.environ.get('RUN_VAR'))",
            RunOptions::new().envs(envs),
        )
        .await
        .unwrap(),
    )
    .await;
    assert!(e.is_none());
    assert_eq!(out(&events), b"yes\n");
    let events = run(&ctx, "import os; print(os.environ.get('RUN_VAR'))").await;
    assert_eq!(out(&events), b"None\n");
    cleanup.destroy().await;
}

async fn errors_have_name_value_and_a_cell_traceback(backend: Arc<dyn Backend>) {
    let (interp, cleanup) = sandbox(backend).await;
    let ctx = interp
        .create_context(ContextOptions::new())
        .await
        .expect("context");
    let events = run(&ctx, "print('a')\ndef g():\n    return 1/0\ng()").await;
    assert_eq!(
        kinds(&events),
        ["stdout a", "error ZeroDivisionError", "count", "end"]
    );
    let e = error(&events).unwrap();
    assert_eq!(e.value, "division by zero");
    assert!(
        e.traceback.starts_with("Traceback")
            && e.traceback.contains("File \"<cell>\", line 3, in g")
            && !e.traceback.contains("sandcove-driver"),
        "{}",
        e.traceback
    );
    let e = error(&run(&ctx, "def broken(:").await).unwrap();
    assert_eq!(e.name, "SyntaxError");
    let e = error(&run(&ctx, "raise SystemExit(3)").await).unwrap();
    assert_eq!(
        e.name, "SystemExit",
        "exit() in a cell does not end the context"
    );
    let e = error(
        &run(
            &ctx,
            "class Bad:\n    def __repr__(self): raise ValueError('no repr')\nBad()",
        )
        .await,
    )
    .unwrap();
    assert_eq!(
        (e.name.as_str(), e.value.as_str()),
        ("ValueError", "no repr")
    );
    assert_eq!(main_text(&run(&ctx, "1 + 1").await).as_deref(), Some("2"));
    cleanup.destroy().await;
}

async fn interrupt_raises_keyboard_interrupt_and_keeps_state(backend: Arc<dyn Backend>) {
    let (interp, cleanup) = sandbox(backend).await;
    let ctx = interp
        .create_context(ContextOptions::new())
        .await
        .expect("context");
    run(&ctx, "kept = 41").await;
    let mut exec = ctx
        .run(
            "import time\nprint('ready', flush=True)\nwhile True:\n    time.sleep(0.05)",
            RunOptions::new(),
        )
        .await
        .unwrap();
    let first = exec.next_event().await.unwrap().unwrap();
    assert_eq!(kinds(&[first]), ["stdout ready"], "the cell runs");
    ctx.interrupt().await.expect("interrupt");
    let (events, e) = drain(exec).await;
    assert!(e.is_none(), "{e:?}");
    assert_eq!(error(&events).unwrap().name, "KeyboardInterrupt");
    assert_eq!(events.last(), Some(&Event::End));
    assert_eq!(
        main_text(&run(&ctx, "kept + 1").await).as_deref(),
        Some("42")
    );
    // Interrupting an idle context does nothing to it.
    ctx.interrupt().await.expect("interrupt while idle");
    assert_eq!(main_text(&run(&ctx, "kept").await).as_deref(), Some("41"));
    cleanup.destroy().await;
}

async fn a_timeout_interrupts_and_a_deaf_cell_is_killed(backend: Arc<dyn Backend>) {
    let (interp, cleanup) = sandbox(backend).await;
    let ctx = interp
        .create_context(ContextOptions::new())
        .await
        .expect("context");
    run(&ctx, "kept = 41").await;
    let started = std::time::Instant::now();
    let (events, e) = drain(
        ctx.run(
            "import time; time.sleep(60)",
            RunOptions::new().timeout(Duration::from_millis(500)),
        )
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(e.expect("timeout").code(), ErrorCode::Timeout, "{events:?}");
    assert!(started.elapsed() < Duration::from_secs(30));
    assert_eq!(
        main_text(&run(&ctx, "kept + 1").await).as_deref(),
        Some("42")
    );
    // A cell that ignores SIGINT is killed after the grace; the context is then gone.
    let (_, e) = drain(
        ctx.run(
            "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(60)",
            RunOptions::new()
                .timeout(Duration::from_millis(300))
                .interrupt_grace(Duration::from_millis(300)),
        )
        .await
        .unwrap(),
    )
    .await;
    let e = e.expect("timeout");
    assert_eq!(e.code(), ErrorCode::Timeout);
    assert!(e.to_string().contains("killed"), "{e}");
    assert!(ctx.ended());
    let e = ctx.run("kept", RunOptions::new()).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Backend);
    assert!(e.to_string().contains("has ended"), "{e}");
    // To other programs the context is gone.
    assert_eq!(
        interp.context(ctx.id()).await.unwrap_err().code(),
        ErrorCode::NotFound
    );
    ctx.restart().await.expect("restart");
    let e = error(&run(&ctx, "kept").await).expect("fresh state");
    assert_eq!(e.name, "NameError");
    cleanup.destroy().await;
}

async fn restart_clears_state_and_delete_ends_the_context(backend: Arc<dyn Backend>) {
    let (interp, cleanup) = sandbox(backend).await;
    let ctx = interp
        .create_context(ContextOptions::new().id("work").cwd("/tmp"))
        .await
        .expect("context");
    assert_eq!(ctx.info().cwd, "/tmp");
    run(&ctx, "mine = 1").await;
    let early = interp.context("work").await.expect("found");
    assert_eq!(main_text(&run(&early, "mine").await).as_deref(), Some("1"));
    let before = ctx.info().pid;
    ctx.restart().await.expect("restart");
    // A handle made before the restart follows the context to its new interpreter.
    let events = run(&early, "'mine' in globals()").await;
    assert_eq!(main_text(&events).as_deref(), Some("False"));
    assert_eq!(count(&events), Some(1), "the count starts again");
    assert_ne!(ctx.info().pid, before);
    let events = run(&ctx, "import os\n('mine' in globals(), os.getcwd())").await;
    assert_eq!(main_text(&events).as_deref(), Some("(False, '/tmp')"));
    assert_eq!(count(&events), Some(2));
    // Another handle sees the restarted context.
    let other = interp.context("work").await.expect("found");
    run(&other, "mine = 2").await;
    assert_eq!(main_text(&run(&ctx, "mine").await).as_deref(), Some("2"));
    ctx.delete().await.expect("delete");
    assert!(interp
        .list_contexts()
        .await
        .unwrap()
        .iter()
        .all(|c| c.id != "work"));
    assert_eq!(
        interp.context("work").await.unwrap_err().code(),
        ErrorCode::NotFound
    );
    assert_eq!(
        ctx.run("1", RunOptions::new()).await.unwrap_err().code(),
        ErrorCode::NotFound
    );
    cleanup.destroy().await;
}

async fn output_is_bytes_unchanged(backend: Arc<dyn Backend>) {
    let (interp, cleanup) = sandbox(backend).await;
    let ctx = interp
        .create_context(ContextOptions::new())
        .await
        .expect("context");
    let events = run(
        &ctx,
        "import os, sys, subprocess\nsys.stdout.buffer.write(b'\\xff\\x00bin\\n')\nos.write(1, b'\\xfe raw\\n')\nsubprocess.run(['sh', '-c', 'printf \"sub\\\\n\"; printf \"e\\\\200\\\\n\" >&2'])\nprint('\\udcff')",
    )
    .await;
    assert_eq!(out(&events), b"\xff\x00bin\n\xfe raw\nsub\n\xff\n");
    assert_eq!(err_out(&events), b"e\x80\n");
    // Large output crosses in bounded frames, complete and in order.
    let events = run(
        &ctx,
        "import sys\nfor i in range(40000): sys.stdout.write('%07d\\n' % i)",
    )
    .await;
    let text = out(&events);
    assert_eq!(text.len(), 40000 * 8);
    assert!(text.starts_with(b"0000000\n0000001\n") && text.ends_with(b"0039999\n"));
    // A huge result is cut to fit one frame, not lost.
    let events = run(&ctx, "'y' * (6 << 20)").await;
    let t = main_text(&events).expect("a shortened result");
    assert!(t.len() >= 1 << 20 && t.len() < 4 << 20, "{}", t.len());
    cleanup.destroy().await;
}

async fn printed_frames_cannot_forge_results(backend: Arc<dyn Backend>) {
    let (interp, cleanup) = sandbox(backend).await;
    let ctx = interp
        .create_context(ContextOptions::new())
        .await
        .expect("context");
    // Steal the token of a finished run (by digging into the driver), then replay frames with
    // it, and with guesses, on stdout, stderr and every other fd the interpreter holds.
    run(
        &ctx,
        "import sys\nstolen = sys.modules['__main__']._S.token\nprint('x')",
    )
    .await;
    let events = run(
        &ctx,
        r#"import os, json
fake = [json.dumps({"t": t, **extra}) for t, extra in [
    ("result", {"data": {"text/plain": "'forged'"}, "main": True}),
    ("error", {"name": "Forged", "value": "", "traceback": ""}),
    ("count", {"n": 999}),
    ("end", {}),
]]
for token in [stolen, "0" * 32, ""]:
    for f in fake:
        line = ("\n" + token + " " + f + "\n").encode()
        print(line.decode(), end="")
        for fd in [int(n) for n in os.listdir("/proc/self/fd")]:
            try:
                os.write(fd, line)
            except OSError:
                pass
print("done")
'real'"#,
    )
    .await;
    assert_eq!(main_text(&events).as_deref(), Some("'real'"));
    assert_eq!(results(&events).len(), 1, "{:?}", kinds(&events));
    assert_eq!(error(&events), None);
    assert_ne!(count(&events), Some(999));
    assert!(String::from_utf8_lossy(&out(&events)).ends_with("done\n"));
    assert_eq!(
        events.iter().filter(|e| **e == Event::End).count(),
        1,
        "one end, the real one"
    );
    // The context still works.
    assert_eq!(main_text(&run(&ctx, "6 * 7").await).as_deref(), Some("42"));
    cleanup.destroy().await;
}

async fn a_queued_run_that_times_out_never_runs(backend: Arc<dyn Backend>) {
    let (interp, cleanup) = sandbox(backend).await;
    let ctx = interp
        .create_context(ContextOptions::new().id("q"))
        .await
        .expect("context");
    let other = interp.context("q").await.expect("second handle");
    let mut slow = ctx
        .run(
            "import time\nprint('busy', flush=True)\ntime.sleep(3)\n'slow done'",
            RunOptions::new(),
        )
        .await
        .unwrap();
    assert_eq!(
        kinds(&[slow.next_event().await.unwrap().unwrap()]),
        ["stdout busy"]
    );
    let (_, e) = drain(
        other
            .run(
                "queued = True",
                RunOptions::new().timeout(Duration::from_millis(300)),
            )
            .await
            .unwrap(),
    )
    .await;
    let e = e.expect("timed out in the queue");
    assert_eq!(e.code(), ErrorCode::Timeout);
    assert!(e.to_string().contains("never started"), "{e}");
    let (events, e) = drain(slow).await;
    assert!(e.is_none(), "the running cell is not interrupted: {e:?}");
    assert_eq!(main_text(&events).as_deref(), Some("'slow done'"));
    let events = run(&ctx, "'queued' in globals()").await;
    assert_eq!(main_text(&events).as_deref(), Some("False"));
    cleanup.destroy().await;
}

async fn bad_requests_are_refused_before_any_effect(backend: Arc<dyn Backend>) {
    let (interp, cleanup) = sandbox(backend.clone()).await;
    let err = interp
        .create_context(ContextOptions::new().language("r"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotSupported);
    let err = interp
        .create_context(ContextOptions::new().id("a:b"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    // Only the capability probe ran (it asks the sandbox's python3 for Jupyter kernels).
    let listed = backend.list_processes(&cleanup.1).await.unwrap();
    assert!(
        listed.iter().all(|p| p.exit.is_some()
            && p.tag
                .as_deref()
                .is_some_and(|t| t.starts_with("sandcove-interpreter:probe-"))),
        "no context was started: {listed:?}"
    );
    let ctx = interp
        .create_context(ContextOptions::new().id("one"))
        .await
        .unwrap();
    let err = interp
        .create_context(ContextOptions::new().id("one"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::AlreadyExists);
    let envs = BTreeMap::from([("A=B".to_string(), "v".to_string())]);
    let err = ctx
        .run("1", RunOptions::new().envs(envs))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    // get_or_create reaches the same context; list shows it once.
    let same = interp
        .get_or_create_context(ContextOptions::new().id("one"))
        .await
        .unwrap();
    run(&ctx, "v = 5").await;
    assert_eq!(main_text(&run(&same, "v").await).as_deref(), Some("5"));
    let listed = eventually(Duration::from_secs(10), "one context listed", || async {
        let l = interp.list_contexts().await.map_err(|e| e.to_string())?;
        if l.len() == 1 {
            Ok(l)
        } else {
            Err(format!("{l:?}"))
        }
    })
    .await;
    assert_eq!(
        (listed[0].id.as_str(), listed[0].language.as_str()),
        ("one", "python")
    );
    cleanup.destroy().await;
}

macro_rules! on_every_backend {
    ($($case:ident),* $(,)?) => {
        mod embedded {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(super::local().await).await;
                }
            )*
        }
        mod over_http {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(super::served().await).await;
                }
            )*
        }
    };
}

on_every_backend!(
    state_persists_and_events_stream_in_order,
    errors_have_name_value_and_a_cell_traceback,
    interrupt_raises_keyboard_interrupt_and_keeps_state,
    a_timeout_interrupts_and_a_deaf_cell_is_killed,
    restart_clears_state_and_delete_ends_the_context,
    output_is_bytes_unchanged,
    printed_frames_cannot_forge_results,
    a_queued_run_that_times_out_never_runs,
    bad_requests_are_refused_before_any_effect,
);
