//! The facade conformance cases through compat-daytona (see `sandcove_tests::facade`).
#![forbid(unsafe_code)]

use async_trait::async_trait;
use daytona::{CreateSandboxFromSnapshotParams, Daytona, DaytonaConfig, DaytonaError, Sandbox};
use sandcove_tests::facade::{run_all, Exec, Facade, Failure, Outcome};

struct DaytonaFacade {
    daytona: Daytona,
}

fn failure(e: DaytonaError) -> Failure {
    if e.is_not_found() {
        Failure::NotFound(e.to_string())
    } else {
        Failure::Other(e.to_string())
    }
}

#[async_trait]
impl Facade for DaytonaFacade {
    type Sandbox = Sandbox;

    async fn create(&self, envs: &[(&str, &str)]) -> Outcome<Sandbox> {
        let params = CreateSandboxFromSnapshotParams {
            env_vars: Some(
                envs.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            auto_stop_interval: Some(5),
            ..Default::default()
        };
        self.daytona.create(params).await.map_err(failure)
    }

    fn id(&self, sandbox: &Sandbox) -> String {
        sandbox.id.clone()
    }

    async fn exists(&self, id: &str) -> Outcome<bool> {
        match self.daytona.get(id).await {
            Ok(_) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(failure(e)),
        }
    }

    async fn listed(&self, id: &str) -> Outcome<bool> {
        let mut sandboxes = self.daytona.list(None);
        while let Some(sandbox) = sandboxes.next().await {
            if sandbox.map_err(failure)?.id == id {
                return Ok(true);
            }
        }
        Ok(false)
    }

    async fn kill(&self, sandbox: &Sandbox) -> Outcome<()> {
        self.daytona.delete(sandbox).await.map_err(failure)
    }

    async fn exec(
        &self,
        sandbox: &Sandbox,
        command: &str,
        cwd: Option<&str>,
        envs: &[(&str, &str)],
    ) -> Outcome<Exec> {
        let response = sandbox
            .process
            .exec(command)
            .cwd(cwd.map(str::to_string))
            .env(envs.iter().copied())
            .await
            .map_err(failure)?;
        Ok(Exec {
            exit_code: response.exit_code,
            stdout: response.result,
            stderr: None,
        })
    }

    async fn write(&self, sandbox: &Sandbox, path: &str, data: &[u8]) -> Outcome<()> {
        sandbox.fs.upload_file(data, path).await.map_err(failure)
    }

    async fn read(&self, sandbox: &Sandbox, path: &str) -> Outcome<Vec<u8>> {
        sandbox.fs.download_file(path).await.map_err(failure)
    }

    async fn mkdir(&self, sandbox: &Sandbox, path: &str) -> Outcome<()> {
        sandbox.fs.create_folder(path, "755").await.map_err(failure)
    }

    async fn list(&self, sandbox: &Sandbox, path: &str) -> Outcome<Vec<String>> {
        let mut names: Vec<String> = sandbox
            .fs
            .list_files(path)
            .await
            .map_err(failure)?
            .into_iter()
            .map(|f| f.name)
            .collect();
        names.sort();
        Ok(names)
    }

    async fn rename(&self, sandbox: &Sandbox, from: &str, to: &str) -> Outcome<bool> {
        sandbox
            .fs
            .move_files(from, to)
            .await
            .map(|()| true)
            .map_err(failure)
    }

    async fn remove(&self, sandbox: &Sandbox, path: &str) -> Outcome<()> {
        sandbox.fs.delete_file(path).await.map_err(failure)
    }
}

#[tokio::main]
async fn main() {
    let daytona = Daytona::new(DaytonaConfig {
        api_key: Some("never-sent".into()),
        ..Default::default()
    })
    .expect("a Daytona client on this runtime");
    if !run_all(&DaytonaFacade { daytona }).await {
        std::process::exit(1);
    }
}
