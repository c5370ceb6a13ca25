//! Saved references on the [`Client`] and [`Sandbox`] surface (the model is
//! [`crate::reference`]).

use crate::reference::{reopen, runtime_of};
use crate::{Error, Reference, Reopened, ResourceKind, Result, Tombstone};

impl crate::Client {
    /// The tombstone of a resource that ended recently (see [`Backend::tombstone`]); for a
    /// sandbox, `id` may also be its unique name. For facades that reconnect by id or name
    /// and want to say "destroyed at …" rather than a bare not-found.
    ///
    /// [`Backend::tombstone`]: crate::Backend::tombstone
    pub async fn tombstone(&self, kind: ResourceKind, id: &str) -> Result<Option<Tombstone>> {
        self.backend().tombstone(kind, id).await
    }

    /// This runtime's identity, the scope of its references (asks the runtime once).
    pub async fn runtime_id(&self) -> Result<String> {
        runtime_of(&self.ready().await?)
    }

    /// Look a saved reference up: its resource's current description, or the typed outcome
    /// listed in the [module docs](crate::reference) (`Forbidden`, `NotFound`, `Destroyed`,
    /// `Conflict`, `Unavailable`). Only reads: never creates, resumes, starts or extends.
    pub async fn reopen(&self, reference: &Reference) -> Result<Reopened> {
        reopen(&**self.backend(), reference).await
    }

    /// [`Client::reopen`](crate::Client::reopen) for a sandbox reference, as a handle. Another kind is
    /// [`Error::Conflict`].
    pub async fn reopen_sandbox(&self, reference: &Reference) -> Result<crate::Sandbox> {
        if reference.kind() != ResourceKind::Sandbox {
            return Err(Error::Conflict {
                what: format!(
                    "reference {reference} names a {}, not a sandbox",
                    reference.kind()
                ),
            });
        }
        match self.reopen(reference).await? {
            Reopened::Sandbox(info) => Ok(self.sandbox(info.id)),
            other => Err(Error::backend(format!(
                "reopen answered {other:?} for a sandbox"
            ))),
        }
    }

    /// A reference to a snapshot this client's runtime reported.
    pub async fn snapshot_reference(&self, snapshot: &crate::SnapshotInfo) -> Result<Reference> {
        Reference::snapshot(&self.runtime_id().await?, &snapshot.id)
    }

    /// A reference to a volume this client's runtime reported.
    pub async fn volume_reference(&self, volume: &crate::VolumeInfo) -> Result<Reference> {
        Reference::volume(&self.runtime_id().await?, &volume.name)
    }

    /// A reference to a sandbox this client's runtime reported (e.g. from [`Client::list`](crate::Client::list)).
    pub async fn sandbox_reference(&self, sandbox: &crate::SandboxInfo) -> Result<Reference> {
        Reference::sandbox(&self.runtime_id().await?, &sandbox.id)
    }
}

impl crate::Sandbox {
    /// A saved reference to this sandbox (see [`crate::reference`]): a later program reopens
    /// it with [`Client::reopen_sandbox`](crate::Client::reopen_sandbox). No I/O; the runtime
    /// must have been reached (any handle a client made from a call has).
    pub fn reference(&self) -> Result<Reference> {
        Reference::sandbox(&runtime_of(&self.backend().capabilities())?, self.id())
    }

    /// A reference to process `pid` of this sandbox (e.g. from [`crate::ProcessInfo::pid`]).
    pub fn process_reference(&self, pid: u32) -> Result<Reference> {
        Reference::process(&runtime_of(&self.backend().capabilities())?, self.id(), pid)
    }

    /// A reference to this sandbox's preview of `port` (e.g. from [`crate::Preview::port`]).
    pub fn preview_reference(&self, port: u16) -> Result<Reference> {
        Reference::preview(
            &runtime_of(&self.backend().capabilities())?,
            self.id(),
            port,
        )
    }
}
