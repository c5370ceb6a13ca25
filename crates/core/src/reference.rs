//! Saved references: a string naming one resource on one runtime, that a later program turns
//! back into the resource with `Client::reopen`.
//!
//! # Format
//!
//! ```text
//! sandcove:v1:<runtime>:sandbox:<sandbox id>
//! sandcove:v1:<runtime>:snapshot:<snapshot id>
//! sandcove:v1:<runtime>:volume:<volume name>
//! sandcove:v1:<runtime>:process:<sandbox id>:<pid>
//! sandcove:v1:<runtime>:preview:<sandbox id>:<port>
//! ```
//!
//! - `v1` is the format version. A reader refuses any version it does not know with
//!   [`Error::InvalidArgument`] rather than guessing; a later format gets a new version, and
//!   readers of that version keep reading `v1`.
//! - `<runtime>` is the identity of the runtime that holds the resource
//!   ([`Capabilities::runtime_id`](crate::Capabilities::runtime_id)): the embedded engine
//!   mints one per state directory and keeps it there, and a server reports its backend's.
//!   A reference reopened through a client of another runtime is
//!   [`Error::Forbidden`], never looked up there: the same id on another runtime is another
//!   resource.
//! - Every component is 1 to 128 ASCII letters, digits, `-`, `_` or `.`, not starting with
//!   `.`, so `:` only ever separates; a pid or port is a positive decimal number.
//!
//! # Reopen outcomes
//!
//! `Client::reopen` only reads: it never creates, resumes, starts or
//! extends anything. It answers the resource's current description, or one typed error:
//! [`Error::Forbidden`] (another runtime's reference), [`Error::NotFound`] (no such resource
//! and no record of one), [`Error::Destroyed`] (the resource existed and ended recently: its
//! tombstone), [`Error::Conflict`] (the id names a resource of another kind),
//! [`Error::Unavailable`] (the runtime cannot be reached), [`Error::InvalidState`] (a process
//! of a paused or stopped sandbox: reaching it would wake the sandbox).
//!
//! # Tombstones
//!
//! When a sandbox ends (destroyed, its lease or retention over, its monitor gone), a snapshot
//! or volume is deleted, or a preview closed, the engine records a [`Tombstone`] in its state
//! directory: kind, id, when, and why. Tombstones are kept for [`TOMBSTONE_TTL`] and at most
//! [`MAX_TOMBSTONES`] of them (the oldest go first; the embedded engine drops the surplus at
//! most once a minute, so a burst of ends can pass the count until then); past either bound a
//! reference answers plain [`Error::NotFound`]. Processes get no tombstone of their own: a
//! process of an ended sandbox answers that sandbox's tombstone.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{Error, Result, UnixMillis};

/// The first component of every reference.
pub const REFERENCE_SCHEME: &str = "sandcove";
/// The format version this build writes (and the only one it reads).
pub const REFERENCE_VERSION: &str = "v1";
/// How long a tombstone is kept after its resource ended.
pub const TOMBSTONE_TTL: Duration = Duration::from_secs(7 * 24 * 3600);
/// How many tombstones a runtime keeps at most; the oldest are dropped first.
pub const MAX_TOMBSTONES: usize = 4096;
/// The longest component of a reference, in bytes.
pub const MAX_REFERENCE_COMPONENT: usize = 128;

/// What a reference names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ResourceKind {
    /// A sandbox, by id.
    Sandbox,
    /// A process of a sandbox, by pid.
    Process,
    /// A snapshot, by id.
    Snapshot,
    /// A volume, by name.
    Volume,
    /// A preview of a sandbox, by port.
    Preview,
}

impl ResourceKind {
    /// Every kind, in format order.
    pub const ALL: [ResourceKind; 5] = [
        ResourceKind::Sandbox,
        ResourceKind::Process,
        ResourceKind::Snapshot,
        ResourceKind::Volume,
        ResourceKind::Preview,
    ];

    /// The word used in references and on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ResourceKind::Sandbox => "sandbox",
            ResourceKind::Process => "process",
            ResourceKind::Snapshot => "snapshot",
            ResourceKind::Volume => "volume",
            ResourceKind::Preview => "preview",
        }
    }

    /// Whether ids of this kind live inside a sandbox (the reference names the sandbox too).
    pub fn has_parent(self) -> bool {
        matches!(self, ResourceKind::Process | ResourceKind::Preview)
    }
}

impl fmt::Display for ResourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ResourceKind {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        ResourceKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "unknown resource kind {s:?} in a reference (known: sandbox, process, \
                     snapshot, volume, preview)"
                ))
            })
    }
}

/// A versioned, runtime-scoped name of one resource (see the [module docs](self) for the
/// format). Serialized as its string.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Reference {
    runtime: String,
    kind: ResourceKind,
    sandbox: Option<String>,
    id: String,
}

fn valid_component(s: &str) -> bool {
    // Never `.` or `..`: a component may become a URL path segment or a file name.
    !s.is_empty()
        && !s.starts_with('.')
        && s.len() <= MAX_REFERENCE_COMPONENT
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

fn check_component(what: &str, s: &str) -> Result<()> {
    if valid_component(s) {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "{what} {s:?} cannot be part of a reference: it must be 1 to \
             {MAX_REFERENCE_COMPONENT} ASCII letters, digits, '-', '_' or '.', not starting \
             with '.'"
        )))
    }
}

/// Whether `id` can be a runtime identity (a reference component).
pub fn valid_runtime_id(id: &str) -> bool {
    valid_component(id)
}

impl Reference {
    fn build(
        runtime: &str,
        kind: ResourceKind,
        sandbox: Option<&str>,
        id: String,
    ) -> Result<Reference> {
        check_component("runtime id", runtime)?;
        if let Some(s) = sandbox {
            check_component("sandbox id", s)?;
        }
        check_component(&format!("{kind} id"), &id)?;
        Ok(Reference {
            runtime: runtime.to_string(),
            kind,
            sandbox: sandbox.map(str::to_string),
            id,
        })
    }

    /// A sandbox of runtime `runtime`.
    pub fn sandbox(runtime: &str, id: &str) -> Result<Reference> {
        Self::build(runtime, ResourceKind::Sandbox, None, id.to_string())
    }

    /// A snapshot of runtime `runtime`.
    pub fn snapshot(runtime: &str, id: &str) -> Result<Reference> {
        Self::build(runtime, ResourceKind::Snapshot, None, id.to_string())
    }

    /// A volume of runtime `runtime`.
    pub fn volume(runtime: &str, name: &str) -> Result<Reference> {
        Self::build(runtime, ResourceKind::Volume, None, name.to_string())
    }

    /// Process `pid` of a sandbox of runtime `runtime`.
    pub fn process(runtime: &str, sandbox_id: &str, pid: u32) -> Result<Reference> {
        if pid == 0 {
            return Err(Error::invalid("a process reference needs a pid above 0"));
        }
        Self::build(
            runtime,
            ResourceKind::Process,
            Some(sandbox_id),
            pid.to_string(),
        )
    }

    /// The preview of `port` of a sandbox of runtime `runtime`.
    pub fn preview(runtime: &str, sandbox_id: &str, port: u16) -> Result<Reference> {
        if port == 0 {
            return Err(Error::invalid("a preview reference needs a port above 0"));
        }
        Self::build(
            runtime,
            ResourceKind::Preview,
            Some(sandbox_id),
            port.to_string(),
        )
    }

    /// The runtime that holds the resource.
    pub fn runtime(&self) -> &str {
        &self.runtime
    }

    /// What kind of resource it names.
    pub fn kind(&self) -> ResourceKind {
        self.kind
    }

    /// The resource's id within its kind (and sandbox): a sandbox or snapshot id, a volume
    /// name, a pid or a port in decimal.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The sandbox a process or preview belongs to; for a sandbox, its own id; `None` for
    /// snapshots and volumes.
    pub fn sandbox_id(&self) -> Option<&str> {
        match self.kind {
            ResourceKind::Sandbox => Some(&self.id),
            _ => self.sandbox.as_deref(),
        }
    }

    /// The pid of a process reference.
    pub fn pid(&self) -> Option<u32> {
        (self.kind == ResourceKind::Process)
            .then(|| self.id.parse().ok())
            .flatten()
    }

    /// The port of a preview reference.
    pub fn port(&self) -> Option<u16> {
        (self.kind == ResourceKind::Preview)
            .then(|| self.id.parse().ok())
            .flatten()
    }

    /// The key its tombstone is kept under: the id, prefixed by the sandbox for kinds that
    /// live in one (`<sandbox>:<port>`).
    pub fn tombstone_id(&self) -> String {
        match &self.sandbox {
            Some(s) => format!("{s}:{}", self.id),
            None => self.id.clone(),
        }
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{REFERENCE_SCHEME}:{REFERENCE_VERSION}:{}:{}:",
            self.runtime, self.kind
        )?;
        if let Some(s) = &self.sandbox {
            write!(f, "{s}:")?;
        }
        f.write_str(&self.id)
    }
}

impl FromStr for Reference {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        if s.len() > 6 * (MAX_REFERENCE_COMPONENT + 1) {
            return Err(Error::invalid("a reference longer than any valid one"));
        }
        let parts: Vec<&str> = s.split(':').collect();
        if parts.first() != Some(&REFERENCE_SCHEME) || parts.len() < 2 {
            return Err(Error::invalid(format!(
                "{s:?} is not a sandcove reference (they start with \
                 \"{REFERENCE_SCHEME}:{REFERENCE_VERSION}:\")"
            )));
        }
        if parts[1] != REFERENCE_VERSION {
            return Err(Error::invalid(format!(
                "reference format version {:?} is unknown to this build, which reads \
                 {REFERENCE_VERSION} (a newer program wrote it? upgrade this one)",
                parts[1]
            )));
        }
        if parts.len() < 5 {
            return Err(Error::invalid(format!(
                "{s:?} is missing parts: sandcove:{REFERENCE_VERSION}:<runtime>:<kind>:<id>"
            )));
        }
        let kind: ResourceKind = parts[3].parse()?;
        let expected = if kind.has_parent() { 6 } else { 5 };
        if parts.len() != expected {
            return Err(Error::invalid(format!(
                "a {kind} reference has {expected} ':'-separated parts, {s:?} has {}",
                parts.len()
            )));
        }
        let runtime = parts[2];
        let number = |what: &str, text: &str| -> Result<u64> {
            // Canonical decimal only, so one resource has one reference string.
            match text.parse::<u64>() {
                Ok(n) if n > 0 && n.to_string() == text => Ok(n),
                _ => Err(Error::invalid(format!(
                    "{what} {text:?} in a reference must be a positive decimal number"
                ))),
            }
        };
        match kind {
            ResourceKind::Sandbox => Reference::sandbox(runtime, parts[4]),
            ResourceKind::Snapshot => Reference::snapshot(runtime, parts[4]),
            ResourceKind::Volume => Reference::volume(runtime, parts[4]),
            ResourceKind::Process => {
                let pid = u32::try_from(number("pid", parts[5])?)
                    .map_err(|_| Error::invalid(format!("pid {:?} is too large", parts[5])))?;
                Reference::process(runtime, parts[4], pid)
            }
            ResourceKind::Preview => {
                let port = u16::try_from(number("port", parts[5])?)
                    .map_err(|_| Error::invalid(format!("port {:?} is too large", parts[5])))?;
                Reference::preview(runtime, parts[4], port)
            }
        }
    }
}

impl Serialize for Reference {
    fn serialize<S: serde::Serializer>(
        &self,
        serializer: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Reference {
    fn deserialize<D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// The record of a resource that ended: kept by the runtime for [`TOMBSTONE_TTL`] (at most
/// [`MAX_TOMBSTONES`] of them) so a reopen answers [`Error::Destroyed`] instead of a bare
/// not-found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Tombstone {
    /// What ended.
    pub kind: ResourceKind,
    /// Its id ([`Reference::tombstone_id`]: `<sandbox>:<pid or port>` for processes and
    /// previews).
    pub id: String,
    /// When it ended.
    pub ended_at: UnixMillis,
    /// Why, in words: `destroyed`, `its lease ended`, `deleted`, `closed`, ….
    pub reason: String,
    /// A sandbox's unique name ([`CreateOptions::name`](crate::CreateOptions::name)), when
    /// it had one: a vendor that reconnects by name finds the tombstone by it too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl Tombstone {
    /// A tombstone for `kind` `id`, ended now for `reason`.
    pub fn now(kind: ResourceKind, id: impl Into<String>, reason: impl Into<String>) -> Self {
        Tombstone {
            kind,
            id: id.into(),
            ended_at: crate::now_millis(),
            reason: reason.into(),
            name: None,
        }
    }

    /// The same, recording the sandbox's unique name.
    pub fn with_name(mut self, name: Option<String>) -> Self {
        self.name = name;
        self
    }

    /// Whether it is still within [`TOMBSTONE_TTL`] at `now`.
    pub fn is_live(&self, now: UnixMillis) -> bool {
        now.saturating_sub(self.ended_at) <= TOMBSTONE_TTL.as_millis() as u64
    }

    /// The error a reopen answers with.
    pub fn to_error(&self) -> Error {
        Error::Destroyed {
            kind: self.kind.to_string(),
            id: self.id.clone(),
            at: self.ended_at,
            reason: self.reason.clone(),
        }
    }
}

/// What `Client::reopen` found: the resource's current description.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Reopened {
    /// A sandbox (in whatever state it is: reopen never resumes or starts it).
    Sandbox(Box<crate::SandboxInfo>),
    /// A process of a running sandbox.
    Process(crate::ProcessInfo),
    /// A snapshot.
    Snapshot(crate::SnapshotInfo),
    /// A volume.
    Volume(crate::VolumeInfo),
    /// A preview (its token as the runtime reports it).
    Preview(crate::Preview),
}

/// `ms` since the epoch as an RFC 3339 UTC time with milliseconds, for messages.
pub fn format_utc(ms: UnixMillis) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Days since 1970-01-01 to a civil date (proleptic Gregorian), 400-year eras.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
}

/// Look `reference` up on `backend`, reading only (see the [module docs](self)).
pub async fn reopen(backend: &dyn crate::Backend, reference: &Reference) -> Result<Reopened> {
    let caps = backend.ready().await?;
    let Some(here) = caps.runtime_id.as_deref() else {
        return Err(Error::not_supported(
            "reopening references on a runtime that reports no identity (an older server)",
            "upgrade the server, or connect to the sandbox by id",
        ));
    };
    if reference.runtime() != here {
        return Err(Error::Forbidden {
            what: format!(
                "reference {reference} belongs to runtime {:?}, not to this one ({here:?}): \
                 reopen it with a client of the runtime that issued it",
                reference.runtime()
            ),
        });
    }
    let id = reference.id();
    let found = match reference.kind() {
        ResourceKind::Sandbox => backend
            .get(id)
            .await
            .map(|info| Reopened::Sandbox(Box::new(info))),
        ResourceKind::Snapshot => {
            caps.require(crate::Feature::Snapshots)?;
            match backend.list_snapshots().await {
                Ok(all) => all
                    .into_iter()
                    .find(|s| s.id == id)
                    .map(Reopened::Snapshot)
                    .ok_or_else(|| Error::not_found(format!("snapshot {id:?}"))),
                Err(e) => Err(e),
            }
        }
        ResourceKind::Volume => {
            caps.require(crate::Feature::Volumes)?;
            backend.get_volume(id).await.map(Reopened::Volume)
        }
        ResourceKind::Process | ResourceKind::Preview => {
            let sandbox = reference.sandbox_id().unwrap_or_default();
            let info = match backend.get(sandbox).await {
                Ok(info) => info,
                Err(e) if e.is_not_found() => {
                    return Err(gone(backend, ResourceKind::Sandbox, sandbox, e).await)
                }
                Err(e) => return Err(e),
            };
            if reference.kind() == ResourceKind::Process {
                if info.state != crate::SandboxState::Running {
                    // Asking its agent could wake a sandbox created with auto_resume.
                    return Err(Error::InvalidState {
                        id: sandbox.to_string(),
                        state: format!("{:?}", info.state).to_lowercase(),
                        message: "reopen does not wake it to look up a process: resume or \
                                  start it, then reopen"
                            .into(),
                    });
                }
                let pid = reference.pid().unwrap_or_default();
                backend.list_processes(sandbox).await.and_then(|all| {
                    all.into_iter()
                        .find(|p| p.pid == pid)
                        .map(Reopened::Process)
                        .ok_or_else(|| {
                            Error::not_found(format!("process {pid} of sandbox {sandbox:?}"))
                        })
                })
            } else {
                caps.require(crate::Feature::Previews)?;
                let port = reference.port().unwrap_or_default();
                backend.list_previews(sandbox).await.and_then(|all| {
                    all.into_iter()
                        .find(|p| p.port == port)
                        .map(Reopened::Preview)
                        .ok_or_else(|| {
                            Error::not_found(format!(
                                "preview of port {port} of sandbox {sandbox:?}"
                            ))
                        })
                })
            }
        }
    };
    match found {
        Err(e) if e.is_not_found() => {
            let err = gone(backend, reference.kind(), &reference.tombstone_id(), e).await;
            if !err.is_not_found() {
                return Err(err);
            }
            Err(other_kind(backend, &caps, reference).await.unwrap_or(err))
        }
        other => other,
    }
}

/// The tombstone of `kind` `id` as an error, or `missing` when there is none.
async fn gone(backend: &dyn crate::Backend, kind: ResourceKind, id: &str, missing: Error) -> Error {
    match backend.tombstone(kind, id).await {
        Ok(Some(t)) => t.to_error(),
        Ok(None) => missing,
        Err(e) => e,
    }
}

/// A [`Error::Conflict`] when the id of a missing sandbox, snapshot or volume names a live
/// resource of another of those kinds (a reference written by hand, or edited).
async fn other_kind(
    backend: &dyn crate::Backend,
    caps: &crate::Capabilities,
    reference: &Reference,
) -> Option<Error> {
    let id = reference.id();
    let mut found = None;
    if reference.kind() != ResourceKind::Sandbox && backend.get(id).await.is_ok() {
        found = Some(ResourceKind::Sandbox);
    }
    if found.is_none() && reference.kind() != ResourceKind::Snapshot && caps.snapshots {
        if let Ok(all) = backend.list_snapshots().await {
            if all.iter().any(|s| s.id == id) {
                found = Some(ResourceKind::Snapshot);
            }
        }
    }
    if found.is_none()
        && reference.kind() != ResourceKind::Volume
        && caps.volumes
        && backend.get_volume(id).await.is_ok()
    {
        found = Some(ResourceKind::Volume);
    }
    let found = found.filter(|_| !reference.kind().has_parent())?;
    Some(Error::Conflict {
        what: format!(
            "reference {reference} names a {}, but {id:?} is a {found} on this runtime",
            reference.kind()
        ),
    })
}

/// The runtime id `caps` report, or why there is none.
pub fn runtime_of(caps: &crate::Capabilities) -> Result<String> {
    match &caps.runtime_id {
        Some(id) => Ok(id.clone()),
        None if caps.observed_at.is_none() => Err(Error::Unavailable {
            reason: format!(
                "the identity of runtime {} is not known yet: it was not reached",
                caps.backend
            ),
            remedy: "call Client::ready (or any call that reaches the runtime) first".into(),
        }),
        None => Err(Error::not_supported(
            "references on a runtime that reports no identity (an older server)",
            "upgrade the server, or keep the id and connect to it",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_round_trips_through_its_string() {
        let refs = [
            (
                Reference::sandbox("rt-a", "abc").unwrap(),
                "sandcove:v1:rt-a:sandbox:abc",
            ),
            (
                Reference::snapshot("rt-a", "snap-1").unwrap(),
                "sandcove:v1:rt-a:snapshot:snap-1",
            ),
            (
                Reference::volume("rt-a", "data.v2").unwrap(),
                "sandcove:v1:rt-a:volume:data.v2",
            ),
            (
                Reference::process("rt-a", "abc", 42).unwrap(),
                "sandcove:v1:rt-a:process:abc:42",
            ),
            (
                Reference::preview("rt-a", "abc", 8080).unwrap(),
                "sandcove:v1:rt-a:preview:abc:8080",
            ),
        ];
        for (r, text) in refs {
            assert_eq!(r.to_string(), text);
            assert_eq!(text.parse::<Reference>().unwrap(), r);
            let json = serde_json::to_string(&r).unwrap();
            assert_eq!(json, format!("\"{text}\""));
            assert_eq!(serde_json::from_str::<Reference>(&json).unwrap(), r);
        }
        let p: Reference = "sandcove:v1:rt-a:process:abc:42".parse().unwrap();
        assert_eq!(
            (p.pid(), p.sandbox_id(), p.tombstone_id().as_str()),
            (Some(42), Some("abc"), "abc:42")
        );
        let v: Reference = "sandcove:v1:rt-a:preview:abc:8080".parse().unwrap();
        assert_eq!(v.port(), Some(8080));
    }

    #[test]
    fn bad_references_are_invalid_arguments_naming_the_problem() {
        let cases = [
            ("sandcove:v2:rt-a:sandbox:abc", "version \"v2\""),
            ("e2b:v1:rt-a:sandbox:abc", "not a sandcove reference"),
            (
                "sandcove:v1:rt-a:template:abc",
                "unknown resource kind \"template\"",
            ),
            ("sandcove:v1:rt-a:sandbox", "missing parts"),
            ("sandcove:v1:rt-a:sandbox:abc:1", "has 5"),
            ("sandcove:v1:rt-a:process:abc", "has 6"),
            ("sandcove:v1:rt-a:process:abc:0", "positive decimal"),
            ("sandcove:v1:rt-a:process:abc:007", "positive decimal"),
            ("sandcove:v1:rt-a:process:abc:99999999999", "too large"),
            ("sandcove:v1:rt-a:preview:abc:70000", "too large"),
            ("sandcove:v1::sandbox:abc", "runtime id"),
            ("sandcove:v1:rt-a:volume:a/b", "volume id"),
            ("sandcove:v1:rt-a:sandbox:", "sandbox id"),
            ("sandcove:v1:rt-a:volume:..", "volume id"),
            ("sandcove:v1:.:sandbox:abc", "runtime id"),
        ];
        for (text, needle) in cases {
            match text.parse::<Reference>() {
                Err(Error::InvalidArgument { message }) => {
                    assert!(message.contains(needle), "{text}: {message}")
                }
                other => panic!("{text}: expected InvalidArgument, got {other:?}"),
            }
        }
        assert!(serde_json::from_str::<Reference>("\"sandcove:v9:a:sandbox:b\"").is_err());
        let long = format!("sandcove:v1:rt:sandbox:{}", "a".repeat(4000));
        assert!(long.parse::<Reference>().is_err());
    }

    #[test]
    fn tombstones_expire_and_name_the_time_in_words() {
        let t = Tombstone {
            kind: ResourceKind::Sandbox,
            id: "abc".into(),
            ended_at: 1_767_225_600_123,
            reason: "destroyed".into(),
            name: None,
        };
        assert!(t.is_live(t.ended_at + 1000));
        assert!(!t.is_live(t.ended_at + TOMBSTONE_TTL.as_millis() as u64 + 1));
        let msg = t.to_error().to_string();
        assert!(
            msg.contains("destroyed at 2026-01-01T00:00:00.123Z"),
            "{msg}"
        );
        assert_eq!(format_utc(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_utc(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }
}
