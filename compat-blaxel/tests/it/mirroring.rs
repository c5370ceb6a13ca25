//! The vendor-doc shapes of MIRRORING.md rules 1-3, written as ported Python would be.
//!
//! These functions are only compiled (they are never run: the behaviour is covered by the
//! other suites); each shape once did not compile against this facade.

use blaxel::{CodeInterpreter, SandboxInstance};
use serde_json::json;

/// Rule 3: a parameter with a default is a setter, so `fs.watch(path, callback)` needs no
/// third argument and `options=` is `.options(...)`.
#[allow(dead_code)]
async fn rule_3_defaulted_parameters_are_setters(sandbox: &SandboxInstance) -> blaxel::Result<()> {
    let handle = sandbox
        .fs
        .watch("/blaxel/app", |event| println!("{event:?}"))
        .await?;
    handle.close();
    let handle = sandbox
        .fs
        .watch("/blaxel/app/**", |event| println!("{event:?}"))
        .options(json!({"with_content": true, "ignore": ["node_modules", ".git"]}))
        .await?;
    handle.close();
    Ok(())
}

/// Rule 3: optional strings take a `&str` (or a `String`) and a bare `None`.
#[allow(dead_code)]
async fn rule_3_optional_strings(
    sandbox: &SandboxInstance,
    ci: &CodeInterpreter,
) -> blaxel::Result<()> {
    let dir = String::from("/blaxel/app");
    sandbox
        .fs
        .write_tree(json!([{"path": "a.txt", "content": "a"}]))
        .destination_path("/blaxel/app")
        .await?;
    sandbox
        .fs
        .write_tree(json!([{"path": "/b.txt", "content": "b"}]))
        .destination_path(None)
        .await?;
    sandbox.fs.find(&dir).r#type("file").await?;
    sandbox.fs.find(&dir).r#type(None).await?;
    sandbox.fs.grep("TODO").file_pattern("*.py").await?;
    sandbox.fs.grep("TODO").file_pattern(None).await?;
    SandboxInstance::list().cursor("next").await?;
    SandboxInstance::list().cursor(None).await?;
    SandboxInstance::update_ttl("my-sandbox", "24h").await?;
    SandboxInstance::update_ttl("my-sandbox", None).await?;
    sandbox.snapshot().name("before-upgrade").await?;
    sandbox.snapshot().name(None).await?;
    sandbox
        .fork("copy")
        .snapshot_id("snap")
        .prefix(None)
        .await?;
    ci.run_code("1 + 1").language("python").await?;
    ci.run_code("1 + 1").language(None).await?;
    ci.create_code_context()
        .cwd("/blaxel")
        .language("python")
        .await?;
    ci.create_code_context().cwd(dir).language(None).await?;
    Ok(())
}

/// Snapshots as Python writes them: `sandbox.snapshots.create(name=None)`, the workspace
/// `Snapshot` class with `Snapshot.delete(id)` and `snapshot.delete()` sharing a name (rule 5),
/// model attributes read through the wrapper, and fork keywords as setters.
#[allow(dead_code)]
async fn snapshots_read_as_python(sandbox: &SandboxInstance) -> blaxel::Result<()> {
    let snap = sandbox.snapshots.create().name("before").await?;
    sandbox.snapshots.create().name(None).await?;
    println!("{} {} {}", snap.name, snap.id, snap.status);
    sandbox.snapshots.get("before").await?;
    sandbox.snapshots.restore("before").await?;
    sandbox.restore(&snap.id).await?;
    let made =
        blaxel::Snapshot::create(json!({"source": {"name": "my-sandbox"}, "name": "s"})).await?;
    made.fork("copy")
        .envs([blaxel::Env {
            name: "A".into(),
            value: "1".into(),
            secret: None,
        }])
        .await?;
    made.delete().await?;
    blaxel::Snapshot::delete("snap-1").await?;
    let page = blaxel::Snapshot::list().limit(10).cursor(None).await?;
    println!("{} {:?}", page.has_more, page.next_cursor);
    sandbox
        .fork("copy")
        .lifecycle(json!({"expiration_policies": [{"type": "ttl-max-age", "value": "1h", "action": "delete"}]}))
        .await?;
    Ok(())
}

#[test]
fn the_vendor_shapes_compile() {
    // Naming the functions is enough: this file compiles only if every shape does.
    let _ = rule_3_defaulted_parameters_are_setters;
    let _ = rule_3_optional_strings;
}
