//! The facade conformance cases through compat-blaxel (see `sandcove_tests::facade`).
#![forbid(unsafe_code)]

use async_trait::async_trait;
use blaxel::{SandboxAPIError, SandboxInstance};
use sandcove_tests::facade::{run_all, Exec, Facade, Failure, Outcome};
use serde_json::json;

struct Blaxel;

fn failure(e: SandboxAPIError) -> Failure {
    if e.is_not_found() {
        Failure::NotFound(e.to_string())
    } else {
        Failure::Other(e.to_string())
    }
}

#[async_trait]
impl Facade for Blaxel {
    type Sandbox = SandboxInstance;

    async fn create(&self, envs: &[(&str, &str)]) -> Outcome<SandboxInstance> {
        let envs: Vec<_> = envs
            .iter()
            .map(|(name, value)| json!({"name": name, "value": value}))
            .collect();
        SandboxInstance::create(json!({"envs": envs, "ttl": "10m"}))
            .await
            .map_err(failure)
    }

    fn id(&self, sandbox: &SandboxInstance) -> String {
        sandbox.metadata.name.clone()
    }

    async fn exists(&self, id: &str) -> Outcome<bool> {
        match SandboxInstance::get(id).await {
            Ok(_) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(failure(e)),
        }
    }

    async fn listed(&self, id: &str) -> Outcome<bool> {
        let page = SandboxInstance::list().await.map_err(failure)?;
        Ok(page.data.iter().any(|s| s.metadata.name == id))
    }

    async fn kill(&self, sandbox: &SandboxInstance) -> Outcome<()> {
        SandboxInstance::delete(&sandbox.metadata.name)
            .await
            .map(drop)
            .map_err(failure)
    }

    async fn exec(
        &self,
        sandbox: &SandboxInstance,
        command: &str,
        cwd: Option<&str>,
        envs: &[(&str, &str)],
    ) -> Outcome<Exec> {
        let env: serde_json::Map<String, serde_json::Value> = envs
            .iter()
            .map(|(k, v)| (k.to_string(), json!(v)))
            .collect();
        let mut request = json!({
            "command": command,
            "env": env,
            "wait_for_completion": true,
        });
        if let Some(cwd) = cwd {
            request["working_dir"] = json!(cwd);
        }
        let process = sandbox.process.exec(request).await.map_err(failure)?;
        Ok(Exec {
            exit_code: process.exit_code,
            stdout: process.stdout,
            stderr: Some(process.stderr),
        })
    }

    async fn write(&self, sandbox: &SandboxInstance, path: &str, data: &[u8]) -> Outcome<()> {
        sandbox
            .fs
            .write_binary(path, data.to_vec())
            .await
            .map(drop)
            .map_err(failure)
    }

    async fn read(&self, sandbox: &SandboxInstance, path: &str) -> Outcome<Vec<u8>> {
        sandbox.fs.read_binary(path).await.map_err(failure)
    }

    async fn mkdir(&self, sandbox: &SandboxInstance, path: &str) -> Outcome<()> {
        sandbox.fs.mkdir(path).await.map(drop).map_err(failure)
    }

    async fn list(&self, sandbox: &SandboxInstance, path: &str) -> Outcome<Vec<String>> {
        let listing = sandbox.fs.ls(path).await.map_err(failure)?;
        let mut names: Vec<String> = listing
            .files
            .into_iter()
            .map(|f| f.name)
            .chain(listing.subdirectories.into_iter().map(|d| d.name))
            .collect();
        names.sort();
        Ok(names)
    }

    /// Blaxel's file system API has no rename (`cp` then `rm` is the SDK's way).
    async fn rename(&self, _: &SandboxInstance, _: &str, _: &str) -> Outcome<bool> {
        Ok(false)
    }

    async fn remove(&self, sandbox: &SandboxInstance, path: &str) -> Outcome<()> {
        sandbox.fs.rm(path).await.map(drop).map_err(failure)
    }
}

#[tokio::main]
async fn main() {
    if !run_all(&Blaxel).await {
        std::process::exit(1);
    }
}
