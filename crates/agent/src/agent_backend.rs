//! The sandbox-scoped calls a runtime passes to the sandbox's agent, written once for every
//! runtime that drives agents (the embedded engine and the Kubernetes backend).
//!
//! A runtime implements [`AgentBackend`]'s two hooks, how it reaches a sandbox's agent
//! ([`agent_for`](AgentBackend::agent_for)) and what a failed call to it means
//! ([`agent_failed`](AgentBackend::agent_failed)), and its [`Backend`] implementation answers
//! each of these calls with the provided method of the same name:
//!
//! ```ignore
//! async fn stat(&self, id: &str, path: &str, options: StatOptions) -> Result<FileStat> {
//!     AgentBackend::stat(self, id, path, options).await
//! }
//! ```
//!
//! What a runtime does beyond the agent's answer (the engine's own bound on a written file)
//! stays in its [`Backend`] implementation, around the call.
//!
//! [`Backend`]: sandcove_core::Backend

use async_trait::async_trait;
use sandcove_core::{
    ByteStream, ChmodOptions, CopyOptions, Error, FileStat, ListDirOptions, Metrics, MkdirOptions,
    ProcessInfo, ProcessSelector, ProcessSpec, ProcessStream, ReadOptions, RemoveOptions,
    RenameOptions, ResizePtyOptions, Result, SignalOptions, StatOptions, WatchOptions, WatchStream,
    WriteOptions, WriteStdinOptions,
};

use crate::client::RemoteAgent;

/// A runtime whose sandboxes' processes and files are served by their agents: each provided
/// method is the [`Backend`](sandcove_core::Backend) call of the same name, passed to the
/// sandbox's agent ([`RemoteAgent`]) with its failure reported through
/// [`agent_failed`](AgentBackend::agent_failed).
#[async_trait]
pub trait AgentBackend: Send + Sync {
    /// The client of sandbox `id`'s agent, or why it cannot be reached now (a missing sandbox
    /// is [`Error::NotFound`], one that runs no processes [`Error::InvalidState`]). Its
    /// errors are returned as they are.
    async fn agent_for(&self, id: &str) -> Result<RemoteAgent>;

    /// What a call to sandbox `id`'s agent that failed with `error` is reported as: a broken
    /// connection to a sandbox that went away under it is [`Error::NotFound`], not a
    /// connection error.
    async fn agent_failed(&self, id: &str, error: Error) -> Error;

    /// An agent call's `result`, a failure passed through
    /// [`agent_failed`](AgentBackend::agent_failed).
    async fn agent_result<T: Send>(&self, id: &str, result: Result<T>) -> Result<T> {
        match result {
            Err(error) => Err(self.agent_failed(id, error).await),
            ok => ok,
        }
    }

    /// [`Backend::spawn`](sandcove_core::Backend::spawn): `spec` validated here, before any
    /// effect.
    async fn spawn(&self, id: &str, spec: ProcessSpec) -> Result<ProcessStream> {
        spec.validate()?;
        let agent = self.agent_for(id).await?;
        self.agent_result(id, agent.spawn(spec).await).await
    }

    /// [`Backend::attach`](sandcove_core::Backend::attach).
    async fn attach(&self, id: &str, process: ProcessSelector) -> Result<ProcessStream> {
        let agent = self.agent_for(id).await?;
        self.agent_result(id, agent.attach(process).await).await
    }

    /// [`Backend::write_stdin`](sandcove_core::Backend::write_stdin).
    async fn write_stdin(
        &self,
        id: &str,
        process: ProcessSelector,
        options: WriteStdinOptions,
    ) -> Result<()> {
        let agent = self.agent_for(id).await?;
        self.agent_result(id, agent.write_stdin(process, options).await)
            .await
    }

    /// [`Backend::close_stdin`](sandcove_core::Backend::close_stdin).
    async fn close_stdin(&self, id: &str, process: ProcessSelector) -> Result<()> {
        let agent = self.agent_for(id).await?;
        self.agent_result(id, agent.close_stdin(process).await)
            .await
    }

    /// [`Backend::signal`](sandcove_core::Backend::signal).
    async fn signal(
        &self,
        id: &str,
        process: ProcessSelector,
        options: SignalOptions,
    ) -> Result<()> {
        let agent = self.agent_for(id).await?;
        self.agent_result(id, agent.signal(process, options).await)
            .await
    }

    /// [`Backend::list_processes`](sandcove_core::Backend::list_processes).
    async fn list_processes(&self, id: &str) -> Result<Vec<ProcessInfo>> {
        let agent = self.agent_for(id).await?;
        self.agent_result(id, agent.list_processes().await).await
    }

    /// [`Backend::read_file`](sandcove_core::Backend::read_file).
    async fn read_file(&self, id: &str, path: &str, options: ReadOptions) -> Result<ByteStream> {
        let agent = self.agent_for(id).await?;
        self.agent_result(id, agent.read_file(path, options).await)
            .await
    }

    /// [`Backend::write_file`](sandcove_core::Backend::write_file).
    async fn write_file(
        &self,
        id: &str,
        path: &str,
        data: ByteStream,
        options: WriteOptions,
    ) -> Result<FileStat> {
        let agent = self.agent_for(id).await?;
        self.agent_result(id, agent.write_file(path, data, options).await)
            .await
    }

    /// [`Backend::list_dir`](sandcove_core::Backend::list_dir).
    async fn list_dir(
        &self,
        id: &str,
        path: &str,
        options: ListDirOptions,
    ) -> Result<Vec<FileStat>> {
        let agent = self.agent_for(id).await?;
        self.agent_result(id, agent.list_dir(path, options).await)
            .await
    }

    /// [`Backend::stat`](sandcove_core::Backend::stat).
    async fn stat(&self, id: &str, path: &str, options: StatOptions) -> Result<FileStat> {
        let agent = self.agent_for(id).await?;
        self.agent_result(id, agent.stat(path, options).await).await
    }

    /// [`Backend::mkdir`](sandcove_core::Backend::mkdir).
    async fn mkdir(&self, id: &str, path: &str, options: MkdirOptions) -> Result<FileStat> {
        let agent = self.agent_for(id).await?;
        self.agent_result(id, agent.mkdir(path, options).await)
            .await
    }

    /// [`Backend::remove`](sandcove_core::Backend::remove).
    async fn remove(&self, id: &str, path: &str, options: RemoveOptions) -> Result<()> {
        let agent = self.agent_for(id).await?;
        self.agent_result(id, agent.remove(path, options).await)
            .await
    }

    /// [`Backend::rename`](sandcove_core::Backend::rename).
    async fn rename(
        &self,
        id: &str,
        from: &str,
        to: &str,
        options: RenameOptions,
    ) -> Result<FileStat> {
        let agent = self.agent_for(id).await?;
        self.agent_result(id, agent.rename(from, to, options).await)
            .await
    }

    /// [`Backend::copy`](sandcove_core::Backend::copy).
    async fn copy(&self, id: &str, from: &str, to: &str, options: CopyOptions) -> Result<FileStat> {
        let agent = self.agent_for(id).await?;
        self.agent_result(id, agent.copy(from, to, options).await)
            .await
    }

    /// [`Backend::chmod`](sandcove_core::Backend::chmod).
    async fn chmod(&self, id: &str, path: &str, options: ChmodOptions) -> Result<FileStat> {
        let agent = self.agent_for(id).await?;
        self.agent_result(id, agent.chmod(path, options).await)
            .await
    }

    /// [`Backend::metrics`](sandcove_core::Backend::metrics).
    async fn metrics(&self, id: &str) -> Result<Metrics> {
        let agent = self.agent_for(id).await?;
        self.agent_result(id, agent.metrics().await).await
    }

    /// [`Backend::resize_pty`](sandcove_core::Backend::resize_pty).
    async fn resize_pty(
        &self,
        id: &str,
        process: ProcessSelector,
        options: ResizePtyOptions,
    ) -> Result<()> {
        let agent = self.agent_for(id).await?;
        self.agent_result(id, agent.resize_pty(process, options).await)
            .await
    }

    /// [`Backend::watch`](sandcove_core::Backend::watch).
    async fn watch(&self, id: &str, path: &str, options: WatchOptions) -> Result<WatchStream> {
        let agent = self.agent_for(id).await?;
        self.agent_result(id, agent.watch(path, options).await)
            .await
    }
}
