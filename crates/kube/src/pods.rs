//! Pod bookkeeping: the Pod of a sandbox and the record its annotations hold, replacing it under
//! concurrent writers, watching it until it is ready or gone, deleting it, the namespace's egress
//! policies, and the queries behind `list` and name checks.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::TryStreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{PostParams, WatchEvent, WatchParams};
use sandcove_agent::valid_id;
use sandcove_core::{Error, ListOptions, Result};

use crate::spec::PodRecord;
use crate::{from_status, map_error, sandbox_what, spec, KubeBackend};

impl KubeBackend {
    pub(crate) fn check_id(&self, id: &str) -> Result<String> {
        if valid_id(id) {
            Ok(spec::pod_name(id))
        } else {
            Err(Error::not_found(sandbox_what(id)))
        }
    }

    /// The Pod of sandbox `id` and its record, whatever its lease or deletion say: a Pod
    /// that is missing or not a sandbox's is [`Error::NotFound`].
    pub(crate) async fn fetch_pod(
        &self,
        id: &str,
    ) -> Result<(Pod, PodRecord, BTreeMap<String, String>)> {
        let name = self.check_id(id)?;
        let pod = self
            .inner
            .pods
            .get_opt(&name)
            .await
            .map_err(|e| map_error(&sandbox_what(id), e))?
            .ok_or_else(|| Error::not_found(sandbox_what(id)))?;
        let (record, annotations) =
            spec::record_of(&pod).ok_or_else(|| Error::not_found(sandbox_what(id)))?;
        Ok((pod, record, annotations))
    }

    /// The live Pod of sandbox `id` (a lease that ended or a Pod being deleted is gone).
    pub(crate) async fn live_pod(
        &self,
        id: &str,
    ) -> Result<(Pod, PodRecord, BTreeMap<String, String>)> {
        let (pod, record, annotations) = self.fetch_pod(id).await?;
        if pod.metadata.deletion_timestamp.is_some() {
            return Err(Error::not_found(sandbox_what(id)));
        }
        if record.ends_at <= sandcove_core::now_millis() {
            // Ended now rather than at the reaper's next round, so the tombstone is there
            // as soon as the sandbox is gone.
            self.end_lease(id, record.name).await;
            return Err(Error::not_found(sandbox_what(id)));
        }
        Ok((pod, record, annotations))
    }

    /// Replace the Pod after `change` edits it, retrying when another writer got there first
    /// (the resourceVersion precondition of a replace).
    pub(crate) async fn update_pod<T>(
        &self,
        id: &str,
        mut change: impl FnMut(&mut Pod, &mut PodRecord, &mut BTreeMap<String, String>) -> Result<T>,
    ) -> Result<(Pod, T)> {
        for _ in 0..16 {
            let (mut pod, mut record, mut annotations) = self.live_pod(id).await?;
            let out = change(&mut pod, &mut record, &mut annotations)?;
            let meta_annotations = pod.metadata.annotations.get_or_insert_default();
            meta_annotations.insert(
                spec::RECORD_ANNOTATION.into(),
                serde_json::to_string(&record).map_err(|e| Error::backend(e.to_string()))?,
            );
            meta_annotations.insert(
                spec::ANNOTATIONS_ANNOTATION.into(),
                serde_json::to_string(&annotations).map_err(|e| Error::backend(e.to_string()))?,
            );
            let name = spec::pod_name(id);
            match self
                .inner
                .pods
                .replace(&name, &PostParams::default(), &pod)
                .await
            {
                Ok(pod) => return Ok((pod, out)),
                Err(kube::Error::Api(r)) if r.code == 409 => continue,
                Err(e) => return Err(map_error(&sandbox_what(id), e)),
            }
        }
        Err(Error::Backend {
            message: format!(
                "{} kept changing under concurrent updates",
                sandbox_what(id)
            ),
            retryable: true,
        })
    }

    /// Make sure the namespace's egress policies exist (once per process): a sandbox with
    /// `NetworkPolicy::None` is never created without the policy that confines it.
    pub(crate) async fn ensure_policies(&self) -> Result<()> {
        self.inner
            .policies_ready
            .get_or_try_init(|| async {
                for policy in spec::egress_policies(&self.inner.config.namespace) {
                    let name = policy.metadata.name.clone().unwrap_or_default();
                    match self
                        .inner
                        .policies
                        .create(&PostParams::default(), &policy)
                        .await
                    {
                        Ok(_) => {}
                        Err(kube::Error::Api(r)) if r.code == 409 => {}
                        Err(e) => {
                            return Err(map_error(&format!("network policy {name:?}"), e));
                        }
                    }
                }
                Ok(())
            })
            .await
            .map(|_| ())
    }

    /// Watch Pod `name` from `version` until `done` says what became of it, or `limit`.
    async fn watch_pod<T>(
        &self,
        name: &str,
        mut version: String,
        limit: Duration,
        what: &str,
        mut done: impl FnMut(&WatchEvent<Pod>) -> Option<Result<T>>,
    ) -> Result<T> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let params = WatchParams::default()
                .fields(&format!("metadata.name={name}"))
                .timeout((left.as_secs() as u32).clamp(1, 290));
            let stream = self
                .inner
                .pods
                .watch(&params, &version)
                .await
                .map_err(|e| map_error(what, e))?;
            let mut stream = std::pin::pin!(stream);
            loop {
                let event = match tokio::time::timeout_at(deadline, stream.try_next()).await {
                    Err(_) => {
                        return Err(Error::Timeout {
                            what: format!("{what} ({}s)", limit.as_secs()),
                        })
                    }
                    Ok(Err(e)) => return Err(map_error(what, e)),
                    Ok(Ok(None)) => break,
                    Ok(Ok(Some(event))) => event,
                };
                if let Some(out) = done(&event) {
                    return out;
                }
                match &event {
                    WatchEvent::Added(p) | WatchEvent::Modified(p) | WatchEvent::Deleted(p) => {
                        if let Some(v) = &p.metadata.resource_version {
                            version = v.clone();
                        }
                    }
                    WatchEvent::Bookmark(b) => version = b.metadata.resource_version.clone(),
                    WatchEvent::Error(e) if e.code == 410 => {
                        // Our version is too old: start again from the Pod as it is now.
                        match self.inner.pods.get_opt(name).await {
                            Ok(Some(pod)) => {
                                let event = WatchEvent::Modified(pod);
                                if let Some(out) = done(&event) {
                                    return out;
                                }
                                if let WatchEvent::Modified(pod) = event {
                                    version = pod.metadata.resource_version.unwrap_or_default();
                                }
                            }
                            Ok(None) => {
                                let event = WatchEvent::Deleted(Pod::default());
                                if let Some(out) = done(&event) {
                                    return out;
                                }
                                return Err(Error::not_found(what.to_string()));
                            }
                            Err(e) => return Err(map_error(what, e)),
                        }
                        break;
                    }
                    WatchEvent::Error(e) => {
                        return Err(from_status(what, e.code, &e.reason, &e.message))
                    }
                }
            }
        }
    }

    /// Wait until Pod `name` is Ready (the agent listens).
    pub(crate) async fn wait_ready(&self, id: &str, created: &Pod) -> Result<Pod> {
        let name = spec::pod_name(id);
        let version = created
            .metadata
            .resource_version
            .clone()
            .unwrap_or_default();
        let what = format!("{} becoming ready", sandbox_what(id));
        self.watch_pod(
            &name,
            version,
            self.inner.config.ready_timeout,
            &what,
            |event| match event {
                WatchEvent::Added(pod) | WatchEvent::Modified(pod) => {
                    if spec::is_ready(pod) {
                        Some(Ok(pod.clone()))
                    } else if let Some(why) = spec::image_pull_failure(pod) {
                        Some(Err(Error::not_found(format!(
                            "the image of {}: the cluster cannot pull it ({why})",
                            sandbox_what(id)
                        ))))
                    } else if matches!(spec::phase(pod), Some("Failed") | Some("Succeeded")) {
                        let why = pod
                            .status
                            .as_ref()
                            .and_then(|s| s.message.clone().or(s.reason.clone()))
                            .unwrap_or_default();
                        Some(Err(Error::Backend {
                            message: format!("{} ended while starting: {why}", sandbox_what(id)),
                            retryable: true,
                        }))
                    } else if pod.metadata.deletion_timestamp.is_some() {
                        Some(Err(Error::not_found(format!(
                            "{} (deleted while starting)",
                            sandbox_what(id)
                        ))))
                    } else {
                        None
                    }
                }
                WatchEvent::Deleted(_) => Some(Err(Error::not_found(format!(
                    "{} (deleted while starting)",
                    sandbox_what(id)
                )))),
                _ => None,
            },
        )
        .await
    }

    /// Delete the Pod of `id` and wait until it is gone. `Ok(false)` when there was none.
    pub(crate) async fn delete_pod(&self, id: &str, grace: Duration) -> Result<bool> {
        let name = spec::pod_name(id);
        let what = sandbox_what(id);
        let deleted = match self
            .inner
            .pods
            .delete(&name, &spec::delete_params(grace.as_secs() as u32))
            .await
        {
            Ok(deleted) => deleted,
            Err(kube::Error::Api(r)) if r.code == 404 => return Ok(false),
            Err(e) => return Err(map_error(&what, e)),
        };
        let Some(pod) = deleted.left() else {
            return Ok(true); // Gone at once.
        };
        let version = pod.metadata.resource_version.clone().unwrap_or_default();
        let limit = grace + Duration::from_secs(60);
        let gone = self
            .watch_pod(
                &name,
                version,
                limit,
                &format!("{what} being deleted"),
                |e| matches!(e, WatchEvent::Deleted(_)).then_some(Ok(())),
            )
            .await;
        match gone {
            Ok(()) => Ok(true),
            // Deleted between the delete and the watch.
            Err(e) if e.is_not_found() => Ok(true),
            Err(e) => Err(e),
        }
    }

    /// The sandbox Pods `options`' selectors match (labels that do not fit a selector are
    /// left for the caller to filter).
    pub(crate) async fn pods_matching(&self, options: &ListOptions) -> Result<Vec<Pod>> {
        let pods = self
            .inner
            .pods
            .list(&spec::list_params(options))
            .await
            .map_err(|e| map_error("listing sandbox Pods", e))?;
        Ok(pods.items)
    }

    /// Whether another live sandbox holds `name`.
    pub(crate) async fn name_taken(
        &self,
        name: &str,
        except: Option<&str>,
    ) -> Result<Option<PodRecord>> {
        let mut options = ListOptions::default();
        options.name = Some(name.to_string());
        let pods = self.pods_matching(&options).await?;
        let now = sandcove_core::now_millis();
        let mut holders: Vec<PodRecord> = pods
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter_map(spec::record_of)
            .map(|(r, _)| r)
            .filter(|r| r.name.as_deref() == Some(name) && r.ends_at > now)
            .collect();
        holders.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        Ok(holders.into_iter().find(|r| Some(r.id.as_str()) != except))
    }
}
