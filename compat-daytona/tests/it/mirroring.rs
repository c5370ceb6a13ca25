//! The vendor-doc shapes of MIRRORING.md rules 1-3, written as ported Python would be.
//!
//! These functions are only compiled (they are never run: the behaviour is covered by the
//! other suites, `stop_start_archive_and_intervals` for the state); each shape once did not
//! compile against this facade.

use daytona::{Daytona, Sandbox, SandboxState};

/// Rules 1-2: `daytona.stop(sandbox)` / `sandbox.start()` update the object passed in, as the
/// Python object is updated in place; its `state` is then read without a refresh.
#[allow(dead_code)]
async fn rule_1_calls_update_the_sandbox(
    daytona: &Daytona,
    sandbox: &mut Sandbox,
) -> daytona::Result<()> {
    daytona.stop(&mut *sandbox).await?;
    assert_eq!(sandbox.state, Some(SandboxState::Stopped));
    daytona.start(&mut *sandbox).timeout(60).await?;
    sandbox.stop().timeout(60).await?;
    sandbox.start().await?;
    sandbox.wait_for_sandbox_start().await?;
    Ok(())
}

/// Python passes the object, which Rust code often holds shared: `daytona.stop(&sandbox)`
/// changes the sandbox, read through any handle once refreshed.
#[allow(dead_code)]
async fn rule_1_calls_take_a_shared_sandbox(
    daytona: &Daytona,
    sandbox: &Sandbox,
) -> daytona::Result<()> {
    daytona.stop(sandbox).await?;
    daytona.start(sandbox).timeout(60).await?;
    let mut again = sandbox.clone();
    again.refresh_data().await?;
    Ok(())
}

/// Rule 3: optional strings take a `&str` (or a `String`) and a bare `None`.
#[allow(dead_code)]
async fn rule_3_optional_strings(sandbox: &Sandbox) -> daytona::Result<()> {
    sandbox.process.exec("ls").cwd("/tmp").await?;
    sandbox.process.exec("ls").cwd(None).await?;
    sandbox
        .git
        .clone("https://example.invalid/repo.git", "repo")
        .branch(None)
        .username(None)
        .password(None)
        .await?;
    sandbox
        .fs
        .set_file_permissions("a.txt")
        .mode("644")
        .owner(None)
        .await?;
    Ok(())
}

#[test]
fn the_vendor_shapes_compile() {
    // Naming the functions is enough: this file compiles only if every shape does.
    let _ = rule_1_calls_update_the_sandbox;
    let _ = rule_3_optional_strings;
}
