//! The vendor-doc shapes of MIRRORING.md rules 1-3, written as ported Python would be.
//!
//! These functions are only compiled (they are never run: the behaviour is covered by the
//! other suites); each line is a shape that once did not compile against this facade.

use e2b::{PtySize, Sandbox, SandboxQuery};

/// Rule 1: the async class. `AsyncFilesystem.watch_dir(path, on_event, ...)`,
/// `AsyncPty.create(size, on_data, ...)` / `connect(pid, on_data)`,
/// `AsyncCommands.connect(pid, on_stdout=..., on_stderr=...)`, and `AsyncSandbox.list()`
/// whose paginator is awaited like every other call.
#[allow(dead_code)]
async fn rule_1_async_class(sandbox: &Sandbox) -> Result<(), e2b::SandboxException> {
    let handle = sandbox
        .files
        .watch_dir("/home/user", |event| println!("{event:?}"))
        .on_exit(|err| println!("{err:?}"))
        .timeout(0)
        .recursive(true)
        .await?;
    handle.stop().await?;

    let terminal = sandbox
        .pty
        .create(PtySize::new(24, 80), |data| println!("{data:?}"))
        .cwd("/tmp")
        .await?;
    let again = sandbox
        .pty
        .connect(terminal.pid, |data| println!("{data:?}"))
        .await?;
    again.kill().await?;

    let mut process = sandbox
        .commands
        .connect(1)
        .on_stdout(|line| print!("{line}"))
        .on_stderr(|line| eprint!("{line}"))
        .await?;
    process.wait().await?;

    let mut paginator = Sandbox::list()
        .query(SandboxQuery {
            metadata: Some([("env".to_string(), "dev".to_string())].into()),
            ..Default::default()
        })
        .await?;
    while paginator.has_next {
        println!("{:?}", paginator.next_items().await?);
    }
    let mut snapshots = Sandbox::list_snapshots().await?;
    snapshots.next_items().await?;
    // Python's `Sandbox.list(query=None)`.
    Sandbox::list().query(None).next_items().await?;
    Ok(())
}

#[test]
fn the_vendor_shapes_compile() {
    // Naming the functions is enough: this file compiles only if every shape does.
    let _ = rule_1_async_class;
}
