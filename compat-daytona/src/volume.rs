//! Python `daytona.volume` (`VolumeService`) over the runtime's named volumes.

use sandcove::{Client, VolumeInfo};

use crate::errors::{Context, DaytonaError};
use crate::translate;
use crate::{awaitable, Result};

/// Python `Volume`. The id is the volume name (names are unique here).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Volume {
    /// `id` (equal to `name`).
    pub id: String,
    /// `name`.
    pub name: String,
    /// `organization_id` (empty).
    pub organization_id: String,
    /// `state`: always `ready` (volumes are usable as soon as they exist).
    pub state: String,
    /// `created_at` (RFC 3339).
    pub created_at: String,
    /// `updated_at` (RFC 3339).
    pub updated_at: String,
    /// `last_used_at`.
    pub last_used_at: Option<String>,
    /// `error_reason`.
    pub error_reason: Option<String>,
}

impl From<VolumeInfo> for Volume {
    fn from(v: VolumeInfo) -> Self {
        Volume {
            id: v.name.clone(),
            name: v.name,
            organization_id: String::new(),
            state: "ready".into(),
            created_at: translate::rfc3339(v.created_at),
            updated_at: translate::rfc3339(v.created_at),
            last_used_at: None,
            error_reason: None,
        }
    }
}

/// Python `VolumeService`.
#[derive(Debug, Clone)]
pub struct VolumeService {
    client: Client,
}

impl VolumeService {
    pub(crate) fn new(client: Client) -> Self {
        VolumeService { client }
    }

    /// `list() -> list[Volume]`.
    pub async fn list(&self) -> Result<Vec<Volume>> {
        let v = self
            .client
            .volumes()
            .await
            .ctx("Failed to list volumes: ")?;
        Ok(v.into_iter().map(Volume::from).collect())
    }

    /// `get(name, create=False) -> Volume`: with `create=True` a missing volume is created.
    pub fn get(&self, name: impl Into<String>) -> GetVolumeBuilder {
        GetVolumeBuilder {
            service: self.clone(),
            name: name.into(),
            create: false,
        }
    }

    /// `create(name) -> Volume`.
    pub async fn create(&self, name: &str) -> Result<Volume> {
        let v = self
            .client
            .create_volume(name)
            .await
            .ctx("Failed to create volume: ")?;
        Ok(v.into())
    }

    /// `delete(volume)`.
    pub async fn delete(&self, volume: &Volume) -> Result<()> {
        self.client
            .delete_volume(&volume.name)
            .await
            .ctx("Failed to delete volume: ")
    }
}

/// Builder of [`VolumeService::get`]; await it.
#[derive(Debug)]
#[must_use = "await the builder to run the call"]
pub struct GetVolumeBuilder {
    service: VolumeService,
    name: String,
    create: bool,
}

impl GetVolumeBuilder {
    /// `create=False`: create the volume when it does not exist.
    pub fn create(mut self, create: bool) -> Self {
        self.create = create;
        self
    }

    async fn run(self) -> Result<Volume> {
        const P: &str = "Failed to get volume: ";
        match self.service.client.volume(&self.name).await {
            Ok(v) => Ok(v.into()),
            Err(e) if e.is_not_found() && self.create => self
                .service
                .create(&self.name)
                .await
                .map_err(|e| e.prefixed(P)),
            Err(e) => Err(DaytonaError::from(e)).ctx(P),
        }
    }
}
awaitable!(GetVolumeBuilder => Volume);
