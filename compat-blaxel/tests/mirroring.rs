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

#[test]
fn the_vendor_shapes_compile() {
    // Naming the functions is enough: this file compiles only if every shape does.
    let _ = rule_3_defaulted_parameters_are_setters;
    let _ = rule_3_optional_strings;
}
