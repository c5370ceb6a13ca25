//! The code interpreter on real Jupyter kernels: a Debian image with `python3-ipykernel` and
//! `python3-jupyter-client`, built by the test from Debian's packages ([`debian_rootfs_with`])
//! and imported into an engine's store; contexts on it run ipykernel through the kernel
//! driver. (The built-in driver, on the host base without Jupyter, is covered by the
//! interpreter crate's own tests.)
//!
//! Where the image cannot be built (no `mmdebstrap`, no route to Debian's mirror), the test
//! says SKIP loudly and passes, as the other Debian image tests do.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sandcove_conformance::images::ImageBuilder;
use sandcove_conformance::sandcove::{self, Backend, CreateOptions, ErrorCode};
use sandcove_interpreter::{mime, ContextOptions, Event, Execution, Interpreter, RunOptions};

use crate::images::{debian_rootfs_with, import, DEBIAN_SUITE};

/// What the image adds to the base Debian list: the kernel and the reference client.
const KERNEL_PACKAGES: &[&str] = &["python3-ipykernel", "python3-jupyter-client"];

/// The state directory holding the imported kernel image and its reference, once per user
/// and image (kept under the temp dir and reused by later runs); `Err` with why it cannot be
/// built.
fn image_state() -> &'static Result<(PathBuf, String), String> {
    static STATE: OnceLock<Result<(PathBuf, String), String>> = OnceLock::new();
    STATE.get_or_init(|| {
        use std::os::unix::fs::MetadataExt;
        let rootfs = debian_rootfs_with(KERNEL_PACKAGES)?;
        let layer = std::fs::read(&rootfs).map_err(|e| format!("the rootfs tar: {e}"))?;
        let image = ImageBuilder::new()
            .layer_tar(layer, false)
            .env("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
            .cmd(&["/bin/bash"])
            .build();
        let uid = std::fs::metadata("/proc/self")
            .map_err(|e| e.to_string())?
            .uid();
        let digest = image.digest();
        let short = &digest[digest.len() - 8..];
        let dir = std::env::temp_dir().join(format!("sc-kernels-{uid}-{short}"));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let reference = format!("test.local/debian-kernels:{DEBIAN_SUITE}");
        import(&dir, &image, &reference);
        Ok((dir, reference))
    })
}

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

async fn run(ctx: &sandcove_interpreter::Context, code: &str) -> Vec<Event> {
    let (events, err) = drain(ctx.run(code, RunOptions::new()).await.expect("run")).await;
    assert!(err.is_none(), "{code:?}: {err:?} after {events:?}");
    assert_eq!(events.last(), Some(&Event::End), "{events:?}");
    events
}

fn stream(events: &[Event], stdout: bool) -> String {
    let bytes: Vec<u8> = events
        .iter()
        .filter_map(|e| match (e, stdout) {
            (Event::Stdout(c), true) | (Event::Stderr(c), false) => Some(c.data.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

fn main_text(events: &[Event]) -> Option<String> {
    events.iter().find_map(|e| match e {
        Event::Result(r) if r.is_main_result => r.text().map(str::to_string),
        _ => None,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_contexts_run_ipykernel_on_an_image_with_jupyter() {
    let (dir, image) = match image_state() {
        Ok(state) => state.clone(),
        Err(reason) => {
            eprintln!("SKIP: no Debian image with Jupyter could be built here, the kernel test did not run: {reason}");
            return;
        }
    };
    let engine: Arc<dyn Backend> = Arc::new(
        sandcove::LocalBackend::with_state_dir(&dir)
            .expect("the engine on the image's state directory")
            .with_warm_pool(0),
    );
    let info = engine
        .create(
            CreateOptions::default()
                .template(image)
                .timeout(Duration::from_secs(600)),
        )
        .await
        .expect("create a sandbox on the image");
    let interp = Interpreter::new(engine.clone(), info.id.clone());

    let caps = interp.capabilities().await.expect("capabilities");
    assert!(caps.jupyter, "{caps:?}");
    assert!(caps.kernels.iter().any(|k| k.name == "python3"), "{caps:?}");
    assert_eq!(interp.languages().await.unwrap(), ["python"]);
    let err = interp
        .create_context(ContextOptions::new().language("r"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotSupported);
    assert!(err.to_string().contains("IRkernel"), "{err}");

    let ctx = interp
        .create_context(ContextOptions::new().cwd("/tmp"))
        .await
        .expect("a kernel context");
    assert_eq!(ctx.info().kernel.as_deref(), Some("python3"));
    assert_eq!(ctx.language(), "python");
    let listed = interp.list_contexts().await.unwrap();
    assert!(
        listed
            .iter()
            .any(|c| c.id == ctx.id() && c.kernel.as_deref() == Some("python3")),
        "{listed:?}"
    );

    // State between cells, stdout then stderr in order, the count, a str's repr as text.
    run(&ctx, "x = 41").await;
    let events = run(
        &ctx,
        "import sys\nprint('one'); sys.stdout.flush()\nprint('two', file=sys.stderr); sys.stderr.flush()\nx + 1",
    )
    .await;
    assert_eq!(stream(&events, true), "one\n");
    assert_eq!(stream(&events, false), "two\n");
    assert_eq!(main_text(&events).as_deref(), Some("42"));
    assert!(events.contains(&Event::ExecutionCount(2)), "{events:?}");
    let events = run(&ctx, "'supertest'").await;
    assert_eq!(main_text(&events).as_deref(), Some("'supertest'"));

    // IPython: shell escapes and magics.
    let events = run(&ctx, "!echo hi").await;
    assert!(stream(&events, true).contains("hi"), "{events:?}");
    let events = run(&ctx, "%pwd").await;
    assert_eq!(main_text(&events).as_deref(), Some("'/tmp'"));

    // An error with its name, value and traceback.
    let events = run(&ctx, "1/0").await;
    let error = events
        .iter()
        .find_map(|e| match e {
            Event::Error(err) => Some(err.clone()),
            _ => None,
        })
        .expect("an error event");
    assert_eq!(error.name, "ZeroDivisionError");
    assert_eq!(error.value, "division by zero");
    assert!(error.traceback.contains("ZeroDivisionError"), "{error:?}");

    // Rich display: HTML, not the main result.
    let events = run(
        &ctx,
        "from IPython.display import HTML, display\ndisplay(HTML('<b>bold</b>'))",
    )
    .await;
    let shown = events
        .iter()
        .find_map(|e| match e {
            Event::Result(r) if !r.is_main_result => Some(r.clone()),
            _ => None,
        })
        .expect("a display result");
    assert_eq!(shown.get_str(mime::HTML), Some("<b>bold</b>"));

    // Per-run envs hold for that run only.
    let events = ctx
        .run(
            "import os; os.environ.get('RUN_ONLY')",
            RunOptions::new().envs([("RUN_ONLY".to_string(), "yes".to_string())].into()),
        )
        .await
        .unwrap()
        .finish()
        .await
        .unwrap();
    assert_eq!(main_text(&events).as_deref(), Some("'yes'"));
    let events = run(&ctx, "os.environ.get('RUN_ONLY')").await;
    assert_eq!(main_text(&events), None, "None shows no result");

    // A timeout interrupts the kernel; the state survives.
    let (_, err) = drain(
        ctx.run(
            "import time\nwhile True: time.sleep(0.05)",
            RunOptions::new().timeout(Duration::from_secs(2)),
        )
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(err.map(|e| e.code()), Some(ErrorCode::Timeout));
    let events = run(&ctx, "x").await;
    assert_eq!(main_text(&events).as_deref(), Some("41"), "state survived");

    // A restart starts a fresh kernel, and the old one ends with its driver.
    let events = run(&ctx, "os.getpid()").await;
    let old_kernel = main_text(&events).expect("the kernel's pid");
    ctx.restart().await.expect("restart");
    let events = run(&ctx, "'x' in globals()").await;
    assert_eq!(main_text(&events).as_deref(), Some("False"));
    let gone = format!(
        "import os, time\n\
         def gone(pid):\n    \
             try:\n        return open(f'/proc/{{pid}}/stat').read().split(')')[-1].split()[0] in 'ZX'\n    \
             except OSError:\n        return True\n\
         deadline = time.monotonic() + 30\n\
         while not gone({old_kernel}) and time.monotonic() < deadline:\n    time.sleep(0.05)\n\
         gone({old_kernel})"
    );
    let events = run(&ctx, &gone).await;
    assert_eq!(
        main_text(&events).as_deref(),
        Some("True"),
        "the old kernel ended"
    );

    ctx.delete().await.expect("delete");
    engine.destroy(&info.id).await.expect("destroy");
}
