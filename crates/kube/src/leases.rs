//! What this process holds for each sandbox: its lease and the reaper that ends leases, the
//! tombstones of what ended, the previews it serves, and forgetting all of it once a sandbox is
//! gone.

use std::sync::{Arc, Weak};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use sandcove_agent::preview::PreviewSet;
use sandcove_core::{Error, ResourceKind, Result, Tombstone, UnixMillis};

use crate::spec::PodRecord;
use crate::{agent, spec, Inner, KubeBackend};

/// How many ended resources the serving process remembers for
/// [`Backend::tombstone`](sandcove_core::Backend::tombstone).
const MAX_TOMBSTONES: usize = 4096;

impl KubeBackend {
    /// Enforce the lease the Pod's record now says.
    pub(crate) fn track_lease(&self, pod: &Pod) {
        if let Some((record, _)) = spec::record_of(pod) {
            self.inner
                .leases
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(record.id, record.ends_at);
            self.inner.wake.notify_one();
        }
    }

    /// Delete a sandbox whose lease ended and leave its tombstone. The tombstone comes
    /// first: from the moment the lease is over the sandbox is gone for every caller, also
    /// while its Pod is still being deleted.
    pub(crate) async fn end_lease(&self, id: &str, name: Option<String>) {
        let buried = self
            .inner
            .tombstones
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|t| t.kind == ResourceKind::Sandbox && t.id == id);
        if !buried {
            self.bury(ResourceKind::Sandbox, id, name, "its lease ended");
        }
        match self.delete_pod(id, self.inner.config.grace).await {
            Ok(_) => self.forget(id),
            Err(e) => {
                tracing::warn!(sandbox = %id, "ending a lease: {e}");
                // Try again shortly, not in a tight loop.
                self.inner
                    .leases
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(id.to_string(), sandcove_core::now_millis() + 5_000);
            }
        }
    }
}

/// The lease enforcer of one backend: sleeps until the earliest lease end (or a change), then
/// deletes every Pod whose lease is over. Holds the backend only while it works, so it ends
/// with the backend.
pub(crate) async fn reaper(inner: Weak<Inner>, wake: Arc<tokio::sync::Notify>) {
    loop {
        let notified = wake.notified();
        let mut notified = std::pin::pin!(notified);
        // Registered before the leases are read, so a change made meanwhile still wakes us.
        notified.as_mut().enable();
        let next = {
            let Some(inner) = inner.upgrade() else {
                return;
            };
            KubeBackend { inner }.end_due_leases().await
        };
        let sleep = match next {
            Some(end) => Duration::from_millis(end.saturating_sub(sandcove_core::now_millis())),
            None => Duration::from_secs(60),
        };
        let _ = tokio::time::timeout(sleep.min(Duration::from_secs(60)), notified).await;
    }
}

impl KubeBackend {
    /// Delete every sandbox whose lease is over; returns the next lease end.
    async fn end_due_leases(&self) -> Option<UnixMillis> {
        let now = sandcove_core::now_millis();
        let due: Vec<String> = self
            .inner
            .leases
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(_, end)| **end <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for id in due {
            let name = match self.live_pod_any_lease(&id).await {
                Ok(record) if record.ends_at > sandcove_core::now_millis() => {
                    // Moved (set_timeout, stop) by another serving process: follow it.
                    self.inner
                        .leases
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(id.clone(), record.ends_at);
                    continue;
                }
                Ok(record) => record.name,
                Err(_) => None,
            };
            self.end_lease(&id, name).await;
        }
        self.inner
            .leases
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .min()
            .copied()
    }

    /// The record of sandbox `id`'s Pod, whatever its lease says.
    async fn live_pod_any_lease(&self, id: &str) -> Result<PodRecord> {
        self.fetch_pod(id).await.map(|(_, record, _)| record)
    }

    pub(crate) fn bury(&self, kind: ResourceKind, id: &str, name: Option<String>, reason: &str) {
        let mut tombstones = self
            .inner
            .tombstones
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if tombstones.len() >= MAX_TOMBSTONES {
            tombstones.pop_front();
        }
        let mut tombstone = Tombstone::now(kind, id, reason);
        tombstone.name = name;
        tombstones.push_back(tombstone);
    }

    /// Drop what this process holds for a sandbox that is gone: its lease, its agent
    /// client, its previews (their listeners close and their connections end).
    pub(crate) fn forget(&self, id: &str) {
        self.inner
            .leases
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
        agent::forget(self, id);
        let previews = self
            .inner
            .previews
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
        if let Some(previews) = previews {
            previews.close_all();
        }
    }

    /// The previews of sandbox `id` this process serves, if any.
    pub(crate) fn previews_of(&self, id: &str) -> Option<Arc<PreviewSet>> {
        self.inner
            .previews
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned()
    }

    /// The previews of `id` when there are none: a [`Error::NotFound`] naming the port.
    pub(crate) fn previews_or_not_found(&self, id: &str, port: u16) -> Result<Arc<PreviewSet>> {
        self.previews_of(id)
            .ok_or_else(|| Error::not_found(format!("preview of port {port}")))
    }
}
