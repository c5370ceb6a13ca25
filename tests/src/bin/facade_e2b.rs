//! The facade conformance cases through compat-e2b (see `sandcove_tests::facade`).
#![forbid(unsafe_code)]

use async_trait::async_trait;
use e2b::{read_format, Sandbox, SandboxException};
use sandcove_tests::facade::{run_all, Exec, Facade, Failure, Outcome};

struct E2b;

fn failure(e: SandboxException) -> Failure {
    if e.is_not_found() {
        Failure::NotFound(e.to_string())
    } else {
        Failure::Other(e.to_string())
    }
}

#[async_trait]
impl Facade for E2b {
    type Sandbox = Sandbox;

    async fn create(&self, envs: &[(&str, &str)]) -> Outcome<Sandbox> {
        Sandbox::create()
            .timeout(300)
            .envs(envs.iter().copied())
            .await
            .map_err(failure)
    }

    fn id(&self, sandbox: &Sandbox) -> String {
        sandbox.sandbox_id.clone()
    }

    async fn exists(&self, id: &str) -> Outcome<bool> {
        match Sandbox::get_info(id).await {
            Ok(_) => Ok(true),
            Err(e) if e.is_sandbox_not_found() => Ok(false),
            Err(e) => Err(failure(e)),
        }
    }

    async fn listed(&self, id: &str) -> Outcome<bool> {
        let mut pages = Sandbox::list();
        let items = pages.next_items().await.map_err(failure)?;
        Ok(items.iter().any(|s| s.sandbox_id == id))
    }

    async fn kill(&self, sandbox: &Sandbox) -> Outcome<()> {
        sandbox.kill().await.map(drop).map_err(failure)
    }

    async fn exec(
        &self,
        sandbox: &Sandbox,
        command: &str,
        cwd: Option<&str>,
        envs: &[(&str, &str)],
    ) -> Outcome<Exec> {
        let result = match sandbox
            .commands
            .run(command)
            .cwd(cwd.map(str::to_string))
            .envs(envs.iter().copied())
            .await
        {
            Ok(r) => r,
            // E2B raises on a non-zero exit, carrying the whole result.
            Err(SandboxException::CommandExit(exit)) => exit.result(),
            Err(e) => return Err(failure(e)),
        };
        Ok(Exec {
            exit_code: result.exit_code,
            stdout: result.stdout,
            stderr: Some(result.stderr),
        })
    }

    async fn write(&self, sandbox: &Sandbox, path: &str, data: &[u8]) -> Outcome<()> {
        sandbox
            .files
            .write(path, data)
            .await
            .map(drop)
            .map_err(failure)
    }

    async fn read(&self, sandbox: &Sandbox, path: &str) -> Outcome<Vec<u8>> {
        sandbox
            .files
            .read(path)
            .format(read_format::Bytes)
            .await
            .map_err(failure)
    }

    async fn mkdir(&self, sandbox: &Sandbox, path: &str) -> Outcome<()> {
        sandbox
            .files
            .make_dir(path)
            .await
            .map(drop)
            .map_err(failure)
    }

    async fn list(&self, sandbox: &Sandbox, path: &str) -> Outcome<Vec<String>> {
        let mut names: Vec<String> = sandbox
            .files
            .list(path)
            .await
            .map_err(failure)?
            .into_iter()
            .map(|e| e.name)
            .collect();
        names.sort();
        Ok(names)
    }

    async fn rename(&self, sandbox: &Sandbox, from: &str, to: &str) -> Outcome<bool> {
        sandbox
            .files
            .rename(from, to)
            .await
            .map(|_| true)
            .map_err(failure)
    }

    async fn remove(&self, sandbox: &Sandbox, path: &str) -> Outcome<()> {
        sandbox.files.remove(path).await.map_err(failure)
    }
}

#[tokio::main]
async fn main() {
    if !run_all(&E2b).await {
        std::process::exit(1);
    }
}
