//! Python `daytona.snapshot` (`SnapshotService`) and the declarative `Image` builder.
//!
//! Snapshots here are taken from sandboxes (`sandbox.create_snapshot(name)`); building one
//! from an image is a gap. `Image` still renders its Dockerfile so ported code compiles and
//! can print it.

use sandcove::{Client, SnapshotInfo};

use crate::client::{ImageSource, Resources};
use crate::errors::{Context, DaytonaError, ErrorDetails};
use crate::gaps::gap;
use crate::translate::{self, quote};
use crate::{awaitable, Result};

/// Python `Snapshot`.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// `id`.
    pub id: String,
    /// `organization_id` (empty).
    pub organization_id: String,
    /// `general`: false (snapshots are the user's own).
    pub general: bool,
    /// `name` (the id when none was given).
    pub name: String,
    /// `image_name` (empty: taken from a sandbox).
    pub image_name: String,
    /// `state`: always `active`.
    pub state: String,
    /// `size` in GiB.
    pub size: Option<f64>,
    /// `entrypoint`.
    pub entrypoint: Option<Vec<String>>,
    /// `cpu`.
    pub cpu: f64,
    /// `gpu`.
    pub gpu: f64,
    /// `mem` in GiB.
    pub mem: f64,
    /// `disk` in GiB.
    pub disk: f64,
    /// `error_reason`.
    pub error_reason: Option<String>,
    /// `created_at` (RFC 3339).
    pub created_at: String,
    /// `updated_at` (RFC 3339).
    pub updated_at: String,
    /// `last_used_at`.
    pub last_used_at: Option<String>,
}

impl From<SnapshotInfo> for Snapshot {
    fn from(s: SnapshotInfo) -> Self {
        Snapshot {
            name: s.name.clone().unwrap_or_else(|| s.id.clone()),
            id: s.id,
            organization_id: String::new(),
            general: false,
            image_name: String::new(),
            state: "active".into(),
            size: Some(s.size as f64 / (1024.0 * 1024.0 * 1024.0)),
            entrypoint: None,
            cpu: 1.0,
            gpu: 0.0,
            mem: 1.0,
            disk: 3.0,
            error_reason: None,
            created_at: translate::rfc3339(s.created_at),
            updated_at: translate::rfc3339(s.created_at),
            last_used_at: None,
        }
    }
}

/// The snapshot a sandbox is created from when none is named: the host's toolchain,
/// read-only. It is listed, got and named like Daytona's default snapshot (`general`,
/// `active`, never deleted), so code that lists snapshots and creates from one it finds
/// works; `create(snapshot="host")` is the same as naming none.
pub const DEFAULT_SNAPSHOT: &str = "host";

/// The [`DEFAULT_SNAPSHOT`] as a `Snapshot`.
pub(crate) fn default_snapshot() -> Snapshot {
    Snapshot {
        id: DEFAULT_SNAPSHOT.into(),
        organization_id: String::new(),
        general: true,
        name: DEFAULT_SNAPSHOT.into(),
        image_name: DEFAULT_SNAPSHOT.into(),
        state: "active".into(),
        size: None,
        entrypoint: None,
        cpu: 1.0,
        gpu: 0.0,
        mem: 1.0,
        disk: 3.0,
        error_reason: None,
        created_at: translate::rfc3339(0),
        updated_at: translate::rfc3339(0),
        last_used_at: None,
    }
}

/// Python `PaginatedSnapshots`.
#[derive(Debug, Clone, PartialEq)]
pub struct PaginatedSnapshots {
    /// `items` of this page.
    pub items: Vec<Snapshot>,
    /// `total` count.
    pub total: i64,
    /// `page` (from 1).
    pub page: i64,
    /// `total_pages`.
    pub total_pages: i64,
}

/// Python `CreateSnapshotParams`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CreateSnapshotParams {
    /// `name`.
    pub name: String,
    /// `image`: a name or an [`Image`].
    pub image: ImageSource,
    /// `resources`.
    pub resources: Option<Resources>,
    /// `entrypoint`.
    pub entrypoint: Option<Vec<String>>,
    /// `region_id`.
    pub region_id: Option<String>,
}

/// Python `Image`: a declarative Dockerfile builder. Each call appends lines.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Image {
    lines: Vec<String>,
}

impl Image {
    /// `Image.base(image)`: `FROM <image>`.
    pub fn base(image: &str) -> Image {
        Image {
            lines: vec![format!("FROM {image}")],
        }
    }

    /// `Image.debian_slim(python_version=None)`: a slim Python base (3.9–3.13).
    pub fn debian_slim(python_version: Option<&str>) -> Result<Image> {
        let full = match python_version.unwrap_or("3.12") {
            "3.9" => "3.9.22",
            "3.10" => "3.10.17",
            "3.11" => "3.11.12",
            "3.12" => "3.12.10",
            "3.13" => "3.13.3",
            other => {
                return Err(DaytonaError::validation(format!(
                    "Unsupported Python version: {other}"
                )))
            }
        };
        Ok(Image {
            lines: vec![
                format!("FROM python:{full}-slim-bookworm"),
                "RUN apt-get update".into(),
                "RUN apt-get install -y gcc gfortran build-essential".into(),
                "RUN pip install --upgrade pip".into(),
                "RUN echo 'debconf debconf/frontend select Noninteractive' | debconf-set-selections"
                    .into(),
            ],
        })
    }

    /// `.pip_install(*packages)`: sorted, shell-quoted.
    pub fn pip_install<S: AsRef<str>>(mut self, packages: impl IntoIterator<Item = S>) -> Image {
        let mut pk: Vec<String> = packages.into_iter().map(|p| quote(p.as_ref())).collect();
        pk.sort();
        self.lines
            .push(format!("RUN python -m pip install {}", pk.join(" ")));
        self
    }

    /// `.run_commands(*commands)`: one `RUN` per command.
    pub fn run_commands<S: AsRef<str>>(mut self, commands: impl IntoIterator<Item = S>) -> Image {
        for c in commands {
            self.lines.push(format!("RUN {}", c.as_ref()));
        }
        self
    }

    /// `.env(dict)`: `ENV K=<quoted value>`.
    pub fn env<K: AsRef<str>, V: AsRef<str>>(
        mut self,
        vars: impl IntoIterator<Item = (K, V)>,
    ) -> Image {
        for (k, v) in vars {
            self.lines
                .push(format!("ENV {}={}", k.as_ref(), quote(v.as_ref())));
        }
        self
    }

    /// `.workdir(path)`.
    pub fn workdir(mut self, path: &str) -> Image {
        self.lines.push(format!("WORKDIR {path}"));
        self
    }

    /// `.entrypoint(list)`.
    pub fn entrypoint<S: AsRef<str>>(mut self, argv: impl IntoIterator<Item = S>) -> Image {
        let items: Vec<String> = argv.into_iter().map(|s| s.as_ref().to_string()).collect();
        self.lines.push(format!(
            "ENTRYPOINT {}",
            serde_json::to_string(&items).unwrap_or_default()
        ));
        self
    }

    /// `.cmd(list)`.
    pub fn cmd<S: AsRef<str>>(mut self, argv: impl IntoIterator<Item = S>) -> Image {
        let items: Vec<String> = argv.into_iter().map(|s| s.as_ref().to_string()).collect();
        self.lines.push(format!(
            "CMD {}",
            serde_json::to_string(&items).unwrap_or_default()
        ));
        self
    }

    /// `.add_local_file(local, remote)`: `COPY` from the build context.
    pub fn add_local_file(mut self, local: &str, remote: &str) -> Image {
        let name = std::path::Path::new(local)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let remote = if remote.ends_with('/') {
            format!("{remote}{name}")
        } else {
            remote.to_string()
        };
        self.lines.push(format!("COPY {local} {remote}"));
        self
    }

    /// `.dockerfile() -> str`.
    pub fn dockerfile(&self) -> String {
        let mut s = self.lines.join("\n");
        s.push('\n');
        s
    }
}

/// Python `SnapshotService`.
#[derive(Debug, Clone)]
pub struct SnapshotService {
    client: Client,
}

impl SnapshotService {
    pub(crate) fn new(client: Client) -> Self {
        SnapshotService { client }
    }

    /// `list(page=None, limit=None) -> PaginatedSnapshots`.
    pub fn list(&self) -> ListSnapshotsBuilder {
        ListSnapshotsBuilder {
            service: self.clone(),
            page: None,
            limit: None,
        }
    }

    /// `get(name) -> Snapshot`: by name or id.
    pub fn get(&self, name: impl Into<String>) -> GetSnapshotBuilder {
        GetSnapshotBuilder {
            service: self.clone(),
            name: name.into(),
        }
    }

    /// `delete(snapshot)`; the default snapshot cannot be deleted (`403`, as a general
    /// snapshot on Daytona).
    pub async fn delete(&self, snapshot: &Snapshot) -> Result<()> {
        if snapshot.id == DEFAULT_SNAPSHOT {
            return Err(DaytonaError::Forbidden(ErrorDetails::new(
                format!("Failed to delete snapshot: the default snapshot {DEFAULT_SNAPSHOT:?} cannot be deleted"),
                Some(403),
                Some("FORBIDDEN"),
            )));
        }
        self.client
            .delete_snapshot(&snapshot.id)
            .await
            .ctx("Failed to delete snapshot: ")
    }

    /// `create(params, *, on_logs=None, timeout=0)`: building from an image is a gap.
    pub async fn create(&self, _params: CreateSnapshotParams) -> Result<Snapshot> {
        Err(gap("snapshot.create from an image"))
    }

    /// `activate(snapshot) -> Snapshot`: snapshots never go inactive here; returns it as is.
    pub async fn activate(&self, snapshot: &Snapshot) -> Result<Snapshot> {
        Ok(snapshot.clone())
    }
}

/// Builder of [`SnapshotService::list`]; await it.
#[derive(Debug)]
#[must_use = "await the builder to run the call"]
pub struct ListSnapshotsBuilder {
    service: SnapshotService,
    page: Option<i64>,
    limit: Option<i64>,
}

impl ListSnapshotsBuilder {
    /// `page=None` (from 1).
    pub fn page(mut self, page: impl Into<Option<i64>>) -> Self {
        self.page = page.into();
        self
    }
    /// `limit=None` (page size, default 100).
    pub fn limit(mut self, limit: impl Into<Option<i64>>) -> Self {
        self.limit = limit.into();
        self
    }

    async fn run(self) -> Result<PaginatedSnapshots> {
        const P: &str = "Failed to list snapshots: ";
        let (page, limit) = (self.page.unwrap_or(1), self.limit.unwrap_or(100));
        if page < 1 || limit < 1 {
            return Err(DaytonaError::validation(
                "page and limit must be at least 1",
            ))
            .ctx(P);
        }
        let mut all = self.service.client.snapshots().await.ctx(P)?;
        all.sort_by_key(|s| std::cmp::Reverse(s.created_at));
        // Newest first; the default snapshot, oldest of all, last.
        let all: Vec<Snapshot> = all
            .into_iter()
            .map(Snapshot::from)
            .chain([default_snapshot()])
            .collect();
        let total = all.len() as i64;
        let items = all
            .into_iter()
            .skip(((page - 1) * limit) as usize)
            .take(limit as usize)
            .collect();
        Ok(PaginatedSnapshots {
            items,
            total,
            page,
            total_pages: (total + limit - 1) / limit,
        })
    }
}
awaitable!(ListSnapshotsBuilder => PaginatedSnapshots);

/// Builder of [`SnapshotService::get`]; await it.
#[derive(Debug)]
#[must_use = "await the builder to run the call"]
pub struct GetSnapshotBuilder {
    service: SnapshotService,
    name: String,
}

impl GetSnapshotBuilder {
    async fn run(self) -> Result<Snapshot> {
        const P: &str = "Failed to get snapshot: ";
        if self.name == DEFAULT_SNAPSHOT {
            return Ok(default_snapshot());
        }
        let all = self.service.client.snapshots().await.ctx(P)?;
        all.into_iter()
            .find(|s| s.id == self.name || s.name.as_deref() == Some(self.name.as_str()))
            .map(Snapshot::from)
            .ok_or_else(|| {
                DaytonaError::NotFound(ErrorDetails::new(
                    format!("{P}snapshot {} not found", self.name),
                    Some(404),
                    Some("NOT_FOUND"),
                ))
            })
    }
}
awaitable!(GetSnapshotBuilder => Snapshot);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_render_dockerfiles() {
        let img = Image::debian_slim(Some("3.12"))
            .unwrap()
            .pip_install(["pandas", "numpy"])
            .workdir("/home/daytona")
            .env([("MY_ENV_VAR", "My Environment Variable")])
            .add_local_file("file_example.txt", "/home/daytona/workspace/");
        let df = img.dockerfile();
        assert!(df.starts_with("FROM python:3.12.10-slim-bookworm\n"));
        assert!(df.contains("RUN python -m pip install numpy pandas\n"));
        assert!(df.contains("ENV MY_ENV_VAR='My Environment Variable'\n"));
        assert!(df.contains("COPY file_example.txt /home/daytona/workspace/file_example.txt\n"));
        assert!(Image::debian_slim(Some("2.7")).unwrap_err().is_validation());
        assert_eq!(
            Image::base("alpine").cmd(["sh"]).dockerfile(),
            "FROM alpine\nCMD [\"sh\"]\n"
        );
    }
}
