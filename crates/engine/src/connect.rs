//! Reaching a sandbox: connecting to its monitor's socket, requests the monitor answers, clients of
//! its agent (dialled through the monitor, which hands the connection over), and telling a sandbox
//! that went away from a connection that broke.

use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use async_trait::async_trait;
use sandcove_agent::agent_backend::AgentBackend;
use sandcove_agent::client::{AgentDialer, AgentIo, RemoteAgent};
use sandcove_core::{Error, Result, SandboxInfo};
use tokio::net::UnixStream;

use crate::config::SandboxDir;
use crate::proto::{Hello, MonitorReply, MonitorRequest};
use crate::quiet::QuietStream;
use crate::{proto, sys, LocalBackend, PROTOCOL_VERSION};

impl LocalBackend {
    /// Connect to a sandbox's monitor, or report the sandbox missing.
    pub(crate) async fn connect(&self, id: &str) -> Result<UnixStream> {
        connect_monitor(&self.dir(id)?, id).await
    }

    /// Send a request the monitor answers and read its one reply.
    pub(crate) async fn monitor_call(
        &self,
        id: &str,
        request: MonitorRequest,
    ) -> Result<MonitorReply> {
        self.monitor_call_as(id, request, PROTOCOL_VERSION).await
    }

    /// [`Self::monitor_call`] speaking protocol `version` (only for the requests every version
    /// encodes alike, [`proto::FROZEN_OPS`]).
    pub(crate) async fn monitor_call_as(
        &self,
        id: &str,
        request: MonitorRequest,
        version: u32,
    ) -> Result<MonitorReply> {
        let mut stream = self.connect(id).await?;
        let hello = Hello {
            version,
            request: Some(request),
            while_paused: false,
            token: None,
        };
        let result = async {
            proto::write_frame(&mut stream, &hello, &[]).await?;
            match proto::read_frame::<_, MonitorReply>(&mut stream).await? {
                Some((MonitorReply::Error { error }, _)) => Err(proto::remote_error(&error)),
                Some((reply, _)) => Ok(reply),
                None => Err(Error::not_found(format!("sandbox {id:?}"))),
            }
        }
        .await;
        result.map_err(|e| self.broken_or_gone(id, e))
    }

    /// A monitor request answered with the sandbox's info.
    pub(crate) async fn monitor_info(
        &self,
        id: &str,
        request: MonitorRequest,
    ) -> Result<SandboxInfo> {
        match self.monitor_call(id, request).await? {
            MonitorReply::Info { info } => Ok(*info),
            other => Err(unexpected(&other)),
        }
    }

    /// A client of sandbox `id`'s agent, reached through its monitor's socket.
    pub(crate) fn agent(&self, id: &str) -> Result<RemoteAgent> {
        let dir = self.dir(id)?;
        let dialer = MonitorDialer {
            dir,
            id: id.to_string(),
        };
        Ok(RemoteAgent::without_token(
            id,
            std::sync::Arc::new(dialer),
            self.conns.clone(),
        ))
    }

    /// Whether sandbox `id` no longer exists (its directory is gone or its monitor is dead).
    fn is_gone(&self, id: &str) -> bool {
        match self.dir(id) {
            Ok(dir) => !dir.dir.exists() || !dir.socket().exists() || lock_is_free(&dir.lock()),
            Err(_) => true,
        }
    }

    /// A failed call to sandbox `id`'s monitor or agent, with a broken connection to a sandbox
    /// that went away under it reported as `NotFound`.
    fn broken_or_gone(&self, id: &str, err: Error) -> Error {
        match err {
            Error::Backend { .. } => self.or_gone(id, err),
            other => other,
        }
    }

    /// Turn a connection failure on an existing connection into `NotFound` when the sandbox
    /// went away under it (destroyed, or its lease ended).
    fn or_gone(&self, id: &str, err: Error) -> Error {
        if !err.is_not_found() && self.is_gone(id) {
            Error::not_found(format!("sandbox {id:?}"))
        } else {
            err
        }
    }
}

/// The sandbox-scoped calls [`LocalBackend`]'s [`Backend`](sandcove_core::Backend)
/// implementation passes to the agent, reached through the sandbox's monitor.
#[async_trait]
impl AgentBackend for LocalBackend {
    async fn agent_for(&self, id: &str) -> Result<RemoteAgent> {
        self.agent(id)
    }

    async fn agent_failed(&self, id: &str, error: Error) -> Error {
        self.broken_or_gone(id, error)
    }
}

/// Dials a sandbox's monitor, which hands the connection to the agent.
#[derive(Debug)]
struct MonitorDialer {
    dir: SandboxDir,
    id: String,
}

#[async_trait]
impl AgentDialer for MonitorDialer {
    async fn dial(&self) -> Result<Box<dyn AgentIo>> {
        let stream = connect_monitor(&self.dir, &self.id).await?;
        let quiet = stream
            .into_std()
            .and_then(QuietStream::new)
            .map_err(|e| Error::from_io(&e, "agent connection"))?;
        Ok(Box::new(quiet))
    }
}

/// Connect to a sandbox's monitor, or report the sandbox missing.
async fn connect_monitor(dir: &SandboxDir, id: &str) -> Result<UnixStream> {
    match UnixStream::connect(dir.socket()).await {
        Ok(s) => {
            // This connection is handed to the agent and carries file bodies both ways.
            sys::grow_socket_buffers(&s);
            Ok(s)
        }
        Err(e) => {
            if lock_is_free(&dir.lock()) {
                let _ = std::fs::remove_dir_all(&dir.dir);
                return Err(Error::not_found(format!("sandbox {id:?}")));
            }
            if dir.dir.exists() && !dir.socket().exists() {
                // Being destroyed right now.
                return Err(Error::not_found(format!("sandbox {id:?}")));
            }
            Err(Error::Backend {
                message: format!("cannot reach sandbox {id:?}: {e}"),
                retryable: true,
            })
        }
    }
}

pub(crate) fn lock_is_free(path: &Path) -> bool {
    match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => sys::try_lock_exclusive(f.as_fd()).unwrap_or(false),
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    }
}

pub(crate) fn unexpected(reply: &impl std::fmt::Debug) -> Error {
    Error::backend(format!("protocol error: unexpected reply {reply:?}"))
}

/// The protocol version of the build that created the sandbox in `dir`, from its record (v1
/// for records that predate the field); ours when the record cannot be read, so the monitor
/// answers for itself.
pub(crate) async fn peer_protocol(dir: &SandboxDir) -> u32 {
    let Ok(text) = tokio::fs::read(dir.record()).await else {
        return PROTOCOL_VERSION;
    };
    match serde_json::from_slice::<serde_json::Value>(&text) {
        Ok(record) => record
            .get("protocol")
            .and_then(|v| v.as_u64())
            .and_then(|v| u32::try_from(v).ok())
            .unwrap_or(proto::FIRST_PROTOCOL_VERSION),
        Err(_) => PROTOCOL_VERSION,
    }
}

/// What `list` and `get` say about a sandbox whose monitor speaks protocol `peer`.
pub(crate) fn protocol_note(peer: u32) -> Option<String> {
    (peer != PROTOCOL_VERSION).then(|| {
        format!(
            "created by a Sandcove version speaking engine protocol v{peer} (this one speaks \
             v{PROTOCOL_VERSION}): it can be listed, read and destroyed here, nothing else; \
             recreate it, or use a Sandcove version speaking v{peer}"
        )
    })
}
