//! The client as a [`Backend`]: each call checked where the server would refuse it, then sent to
//! its route with the retry policy its effect allows.

use std::sync::Arc;

use async_trait::async_trait;
use reqwest::Method;
use sandcove_core::wire::{body, FILE_URLS_SEGMENT, FRAMES_CONTENT_TYPE, IDEMPOTENCY_HEADER};
use sandcove_core::{
    Backend, ByteStream, Capabilities, ChmodOptions, CopyOptions, CreateOptions, Error, FileStat,
    FileUrl, FileUrlOptions, ListDirOptions, ListOptions, Metrics, MkdirOptions, Preview,
    PreviewOptions, PreviewToken, PreviewTokenOptions, ProcessInfo, ProcessSelector, ProcessSpec,
    ProcessStream, ReadOptions, RemoveOptions, RenameOptions, ResizePtyOptions, Result,
    SandboxInfo, SetLabelsOptions, SetTimeoutOptions, SignalOptions, SnapshotInfo, SnapshotOptions,
    StatOptions, VolumeInfo, WatchOptions, WatchStream, WriteOptions, WriteStdinOptions,
};

use crate::streams::{download, frames, pull_events, upload_frames, watch_events, Abandon};
use crate::transport::{
    decode_json, outcome_lost, read_error, to_json, transport_error, unknown_capabilities, Payload,
    Req, Retry,
};
use crate::HttpBackend;

#[async_trait]
impl Backend for HttpBackend {
    /// The server's backend's capabilities (named `http+<backend>`). Fetched by
    /// [`HttpBackend::connect`]; otherwise fetched here on first use, blocking the calling
    /// thread for one request. While the server cannot be reached, nothing optional is
    /// reported, with `observed_at: None` (no evidence, not "no feature": see
    /// `Client::check_create`), and the next call asks again.
    fn capabilities(&self) -> Capabilities {
        self.caps
            .get()
            .cloned()
            .unwrap_or_else(unknown_capabilities)
    }

    async fn ready(&self) -> Result<Capabilities> {
        match self.caps.get() {
            Some(caps) => Ok(caps.clone()),
            None => self.refresh_capabilities().await,
        }
    }

    async fn create(&self, options: CreateOptions) -> Result<SandboxInfo> {
        options.validate()?;
        self.create_call(self.url_for(&["sandboxes"])?, &options)
            .await
    }

    async fn get(&self, id: &str) -> Result<SandboxInfo> {
        let url = self.sandbox_url(id, &[])?;
        self.call(Method::GET, url, &[], None::<&()>, Retry::Idempotent)
            .await
    }

    async fn list(&self, options: ListOptions) -> Result<Vec<SandboxInfo>> {
        let filter = String::from_utf8(to_json(&options)?).expect("JSON is UTF-8");
        let url = self.url_for(&["sandboxes"])?;
        self.call(
            Method::GET,
            url,
            &[("filter", filter)],
            None::<&()>,
            Retry::Idempotent,
        )
        .await
    }

    async fn set_timeout(&self, id: &str, options: SetTimeoutOptions) -> Result<SandboxInfo> {
        sandcove_core::validate::validate_sandbox_timeout(options.timeout)?;
        let url = self.sandbox_url(id, &["timeout"])?;
        let body = body::SetTimeout {
            timeout: options.timeout.as_secs_f64(),
        };
        self.call(Method::PUT, url, &[], Some(&body), Retry::Idempotent)
            .await
    }

    async fn set_on_timeout(
        &self,
        id: &str,
        options: sandcove_core::SetOnTimeoutOptions,
    ) -> Result<SandboxInfo> {
        let url = self.sandbox_url(id, &["on-timeout"])?;
        let body = body::SetOnTimeout {
            on_timeout: options.on_timeout,
        };
        self.call(Method::PUT, url, &[], Some(&body), Retry::Idempotent)
            .await
    }

    async fn set_labels(&self, id: &str, options: SetLabelsOptions) -> Result<SandboxInfo> {
        sandcove_core::validate::validate_labels(&options.labels)?;
        let url = self.sandbox_url(id, &["labels"])?;
        let body = body::SetLabels {
            labels: options.labels,
        };
        self.call(Method::PUT, url, &[], Some(&body), Retry::Idempotent)
            .await
    }

    async fn update_annotations(
        &self,
        id: &str,
        update: sandcove_core::AnnotationUpdate,
    ) -> Result<std::collections::BTreeMap<String, String>> {
        update.validate()?;
        let url = self.sandbox_url(id, &["annotations"])?;
        // Not replayed after it may have run: a repeated compare-and-set would fail.
        self.call(Method::POST, url, &[], Some(&update), Retry::Unsafe)
            .await
    }

    async fn destroy(&self, id: &str) -> Result<()> {
        self.delete_call(self.sandbox_url(id, &[])?, &[]).await
    }

    async fn spawn(&self, id: &str, spec: ProcessSpec) -> Result<ProcessStream> {
        spec.validate()?;
        let url = self.sandbox_url(id, &["processes"])?;
        // The operation id lets a server answer a replayed start by attaching to the process
        // the first one started; the call is still not retried blindly here.
        let key = sandcove_core::OperationId::current_or_new();
        let response = self
            .send(Req {
                method: Method::POST,
                url,
                query: &[],
                payload: Payload::Json(to_json(&spec)?),
                idempotency_key: Some(key.as_str()),
                retry: Retry::Unsafe,
                stream: true,
            })
            .await?;
        self.process_stream(response).await
    }

    async fn attach(&self, id: &str, process: ProcessSelector) -> Result<ProcessStream> {
        let url = self.sandbox_url(id, &["processes", "attach"])?;
        let response = self
            .send(Req {
                method: Method::GET,
                url,
                query: &selector_query(&process),
                payload: Payload::None,
                idempotency_key: None,
                retry: Retry::Idempotent,
                stream: true,
            })
            .await?;
        self.process_stream(response).await
    }

    async fn write_stdin(
        &self,
        id: &str,
        process: ProcessSelector,
        options: WriteStdinOptions,
    ) -> Result<()> {
        let url = self.sandbox_url(id, &["processes", "stdin"])?;
        self.call_unit(
            Method::POST,
            url,
            &selector_query(&process),
            Payload::Raw(options.data),
            Retry::Unsafe,
        )
        .await
    }

    async fn close_stdin(&self, id: &str, process: ProcessSelector) -> Result<()> {
        let url = self.sandbox_url(id, &["processes", "stdin", "close"])?;
        self.call_unit(
            Method::POST,
            url,
            &selector_query(&process),
            Payload::None,
            Retry::Unsafe,
        )
        .await
    }

    async fn signal(
        &self,
        id: &str,
        process: ProcessSelector,
        options: SignalOptions,
    ) -> Result<()> {
        let url = self.sandbox_url(id, &["processes", "signal"])?;
        let body = to_json(&body::SignalBody {
            signal: options.signal,
        })?;
        self.call_unit(
            Method::POST,
            url,
            &selector_query(&process),
            Payload::Json(body),
            Retry::Unsafe,
        )
        .await
    }

    async fn list_processes(&self, id: &str) -> Result<Vec<ProcessInfo>> {
        let url = self.sandbox_url(id, &["processes"])?;
        self.call(Method::GET, url, &[], None::<&()>, Retry::Idempotent)
            .await
    }

    async fn read_file(&self, id: &str, path: &str, options: ReadOptions) -> Result<ByteStream> {
        let url = self.sandbox_url(id, &["files"])?;
        let mut query = with_user(vec![("path", path.to_string())], options.user);
        if let Some(limit) = options.max_bytes {
            query.push(("max_bytes", limit.to_string()));
        }
        let response = self
            .send(Req {
                method: Method::GET,
                url,
                query: &query,
                payload: Payload::None,
                idempotency_key: None,
                retry: Retry::Idempotent,
                stream: true,
            })
            .await?;
        Ok(download(frames(response)))
    }

    async fn write_file(
        &self,
        id: &str,
        path: &str,
        data: ByteStream,
        options: WriteOptions,
    ) -> Result<FileStat> {
        let url = self.sandbox_url(id, &["files"])?;
        options.validate()?;
        let options = String::from_utf8(to_json(&options)?).expect("JSON is UTF-8");
        // The operation id lets the server answer a repeat of this write (same path, options
        // and content) with the first outcome instead of writing again.
        let key = sandcove_core::OperationId::current_or_new();
        // A streamed body cannot be replayed, so uploads are never retried. When the source
        // fails, the body ends with an abandon frame rather than being cut, so the server's
        // answer tells us its backend has discarded the partial file.
        let abandon = Arc::new(Abandon::default());
        let body = reqwest::Body::wrap_stream(upload_frames(data, abandon.clone()));
        let send = self
            .http
            .put(url.clone())
            .bearer_auth(&*self.api_key)
            .query(&[("path", path.to_string()), ("options", options)])
            .header(reqwest::header::CONTENT_TYPE, FRAMES_CONTENT_TYPE)
            .header(IDEMPOTENCY_HEADER, key.as_str())
            .body(body)
            .send();
        let sent = tokio::select! {
            sent = send => Some(sent),
            () = abandon.deadline() => None,
        };
        // The caller's own error wins, whatever the server made of the abandoned body; it
        // is returned only now, after the server's answer (or the bounded wait for it).
        if let Some(error) = abandon.take() {
            return Err(error);
        }
        match sent {
            Some(Ok(response)) if response.status().is_success() => decode_json(response)
                .await
                .map_err(|e| outcome_lost(e, Some(key.as_str()))),
            Some(Ok(response)) => Err(read_error(response, self.options.request_timeout).await),
            // Nothing reached the server: nothing was written.
            Some(Err(e)) if e.is_connect() || e.is_builder() => {
                Err(transport_error(&e, &Method::PUT, &url))
            }
            Some(Err(e)) => Err(outcome_lost(
                transport_error(&e, &Method::PUT, &url),
                Some(key.as_str()),
            )),
            // The deadline runs only after the source failed, whose error was taken above.
            None => Err(Error::backend("the upload was abandoned")),
        }
    }

    async fn list_dir(
        &self,
        id: &str,
        path: &str,
        options: ListDirOptions,
    ) -> Result<Vec<FileStat>> {
        let url = self.sandbox_url(id, &["files", "list"])?;
        let mut query = with_user(
            vec![
                ("path", path.to_string()),
                ("depth", options.depth.to_string()),
            ],
            options.user,
        );
        if options.attributes {
            query.push(("attributes", "true".to_string()));
        }
        self.call(Method::GET, url, &query, None::<&()>, Retry::Idempotent)
            .await
    }

    async fn stat(&self, id: &str, path: &str, options: StatOptions) -> Result<FileStat> {
        let url = self.sandbox_url(id, &["files", "stat"])?;
        let mut query = with_user(vec![("path", path.to_string())], options.user);
        if options.attributes {
            query.push(("attributes", "true".to_string()));
        }
        self.call(Method::GET, url, &query, None::<&()>, Retry::Idempotent)
            .await
    }

    async fn mkdir(&self, id: &str, path: &str, options: MkdirOptions) -> Result<FileStat> {
        let url = self.sandbox_url(id, &["files", "mkdir"])?;
        let body = body::Mkdir {
            path: path.to_string(),
            options,
        };
        self.op_call(Method::POST, url, &[], Payload::Json(to_json(&body)?))
            .await
    }

    async fn remove(&self, id: &str, path: &str, options: RemoveOptions) -> Result<()> {
        let url = self.sandbox_url(id, &["files"])?;
        let query = with_user(
            vec![
                ("path", path.to_string()),
                ("recursive", options.recursive.to_string()),
            ],
            options.user,
        );
        self.delete_call(url, &query).await
    }

    async fn rename(
        &self,
        id: &str,
        from: &str,
        to: &str,
        options: RenameOptions,
    ) -> Result<FileStat> {
        let url = self.sandbox_url(id, &["files", "rename"])?;
        let body = body::Rename {
            from: from.to_string(),
            to: to.to_string(),
            options,
        };
        self.op_call(Method::POST, url, &[], Payload::Json(to_json(&body)?))
            .await
    }

    async fn copy(&self, id: &str, from: &str, to: &str, options: CopyOptions) -> Result<FileStat> {
        let url = self.sandbox_url(id, &["files", "copy"])?;
        let body = body::Copy {
            from: from.to_string(),
            to: to.to_string(),
            options,
        };
        self.op_call(Method::POST, url, &[], Payload::Json(to_json(&body)?))
            .await
    }

    async fn chmod(&self, id: &str, path: &str, options: ChmodOptions) -> Result<FileStat> {
        let url = self.sandbox_url(id, &["files", "chmod"])?;
        let body = body::Chmod {
            path: path.to_string(),
            mode: options.mode,
        };
        self.op_call(Method::POST, url, &[], Payload::Json(to_json(&body)?))
            .await
    }

    async fn pause(&self, id: &str) -> Result<SandboxInfo> {
        let url = self.sandbox_url(id, &["pause"])?;
        self.call(Method::POST, url, &[], None::<&()>, Retry::Unsafe)
            .await
    }

    async fn resume(&self, id: &str) -> Result<SandboxInfo> {
        let url = self.sandbox_url(id, &["resume"])?;
        self.call(Method::POST, url, &[], None::<&()>, Retry::Unsafe)
            .await
    }

    async fn stop(&self, id: &str) -> Result<SandboxInfo> {
        let url = self.sandbox_url(id, &["stop"])?;
        // Stopping a stopped sandbox changes nothing: safe to replay.
        self.call(Method::POST, url, &[], None::<&()>, Retry::Idempotent)
            .await
    }

    async fn start(&self, id: &str) -> Result<SandboxInfo> {
        let url = self.sandbox_url(id, &["start"])?;
        self.call(Method::POST, url, &[], None::<&()>, Retry::Idempotent)
            .await
    }

    async fn metrics(&self, id: &str) -> Result<Metrics> {
        let url = self.sandbox_url(id, &["metrics"])?;
        self.call(Method::GET, url, &[], None::<&()>, Retry::Idempotent)
            .await
    }

    async fn resize_pty(
        &self,
        id: &str,
        process: ProcessSelector,
        options: ResizePtyOptions,
    ) -> Result<()> {
        let url = self.sandbox_url(id, &["processes", "resize"])?;
        self.call_unit(
            Method::POST,
            url,
            &selector_query(&process),
            Payload::Json(to_json(&options.size)?),
            Retry::Idempotent,
        )
        .await
    }

    async fn watch(&self, id: &str, path: &str, options: WatchOptions) -> Result<WatchStream> {
        let url = self.sandbox_url(id, &["files", "watch"])?;
        let mut query = vec![
            ("path", path.to_string()),
            ("recursive", options.recursive.to_string()),
        ];
        if options.report_ownership {
            query.push(("report_ownership", "true".to_string()));
        }
        let query = with_user(query, options.user);
        let response = self
            .send(Req {
                method: Method::GET,
                url,
                query: &query,
                payload: Payload::None,
                idempotency_key: None,
                retry: Retry::Idempotent,
                stream: true,
            })
            .await?;
        Ok(watch_events(frames(response)))
    }

    async fn expose_port(&self, id: &str, options: PreviewOptions) -> Result<Preview> {
        let url = self.sandbox_url(id, &["previews"])?;
        self.call(Method::POST, url, &[], Some(&options), Retry::Unsafe)
            .await
    }

    async fn list_previews(&self, id: &str) -> Result<Vec<Preview>> {
        let url = self.sandbox_url(id, &["previews"])?;
        self.call(Method::GET, url, &[], None::<&()>, Retry::Idempotent)
            .await
    }

    async fn close_preview(&self, id: &str, port: u16) -> Result<()> {
        let port = port.to_string();
        let url = self.sandbox_url(id, &["previews", &port])?;
        self.call_unit(Method::DELETE, url, &[], Payload::None, Retry::Idempotent)
            .await
    }

    async fn create_preview_token(
        &self,
        id: &str,
        port: u16,
        options: PreviewTokenOptions,
    ) -> Result<PreviewToken> {
        let port = port.to_string();
        let url = self.sandbox_url(id, &["previews", &port, "tokens"])?;
        let body = body::NewToken {
            expires_at: options.expires_at,
        };
        self.create_call(url, &body).await
    }

    async fn create_file_url(&self, id: &str, options: FileUrlOptions) -> Result<FileUrl> {
        options.validate(sandcove_core::now_millis())?;
        let url = self.sandbox_url(id, &[FILE_URLS_SEGMENT])?;
        // Minting changes nothing on the server (the URL is stored nowhere): safe to retry.
        let mut minted: FileUrl = self
            .call(Method::POST, url, &[], Some(&options), Retry::Idempotent)
            .await?;
        // The server answers its route's path; the origin is the one this client reaches it at.
        let token = minted
            .url
            .rsplit('/')
            .next()
            .filter(|t| !t.is_empty())
            .ok_or_else(|| Error::backend("the server answered a file URL without a token"))?
            .to_string();
        minted.url = self.url_for(&[FILE_URLS_SEGMENT, &token])?.to_string();
        Ok(minted)
    }

    async fn revoke_preview_token(&self, id: &str, port: u16, token: &str) -> Result<()> {
        let port = port.to_string();
        let url = self.sandbox_url(id, &["previews", &port, "tokens", "revoke"])?;
        let body = body::RevokeToken {
            token: token.to_string(),
        };
        // Not replayed after a possible effect: a second revoke of the same token would
        // answer NotFound for a revoke that worked.
        self.call_unit(
            Method::POST,
            url,
            &[],
            Payload::Json(to_json(&body)?),
            Retry::Unsafe,
        )
        .await
    }

    async fn snapshot(&self, id: &str, options: SnapshotOptions) -> Result<SnapshotInfo> {
        let url = self.sandbox_url(id, &["snapshots"])?;
        let body = body::NewSnapshot {
            name: options.name,
            memory: options.memory,
        };
        self.create_call(url, &body).await
    }

    async fn list_snapshots(&self) -> Result<Vec<SnapshotInfo>> {
        let url = self.url_for(&["snapshots"])?;
        self.call(Method::GET, url, &[], None::<&()>, Retry::Idempotent)
            .await
    }

    async fn delete_snapshot(&self, snapshot_id: &str) -> Result<()> {
        self.delete_call(self.url_for(&["snapshots", snapshot_id])?, &[])
            .await
    }

    async fn fork(&self, id: &str, options: CreateOptions) -> Result<SandboxInfo> {
        options.validate()?;
        let url = self.sandbox_url(id, &["fork"])?;
        self.create_call(url, &options).await
    }

    async fn create_volume(&self, name: &str) -> Result<VolumeInfo> {
        let url = self.url_for(&["volumes"])?;
        self.create_call(
            url,
            &body::NewVolume {
                name: name.to_string(),
            },
        )
        .await
    }

    async fn get_volume(&self, name: &str) -> Result<VolumeInfo> {
        let url = self.url_for(&["volumes", name])?;
        self.call(Method::GET, url, &[], None::<&()>, Retry::Idempotent)
            .await
    }

    async fn list_volumes(&self) -> Result<Vec<VolumeInfo>> {
        let url = self.url_for(&["volumes"])?;
        self.call(Method::GET, url, &[], None::<&()>, Retry::Idempotent)
            .await
    }

    async fn delete_volume(&self, name: &str) -> Result<()> {
        self.delete_call(self.url_for(&["volumes", name])?, &[])
            .await
    }

    async fn list_images(&self) -> Result<Vec<sandcove_core::ImageSummary>> {
        let url = self.url_for(&["images"])?;
        self.call(Method::GET, url, &[], None::<&()>, Retry::Idempotent)
            .await
    }

    async fn pull_image(&self, reference: &str) -> Result<sandcove_core::ImageSummary> {
        // Pulling again stores nothing twice: a retried pull only finishes the first.
        let url = self.url_for(&["images", "pull"])?;
        let body = body::ImageReference {
            reference: reference.to_string(),
        };
        self.call(Method::POST, url, &[], Some(&body), Retry::Idempotent)
            .await
    }

    async fn pull_image_with_progress(
        &self,
        reference: &str,
        progress: &(dyn Fn(sandcove_core::ImagePullProgress) + Send + Sync),
    ) -> Result<sandcove_core::ImageSummary> {
        // The same route as `pull_image`, asked for frames: the server streams each layer's
        // progress, then the image.
        let url = self.url_for(&["images", "pull"])?;
        let body = to_json(&body::ImageReference {
            reference: reference.to_string(),
        })?;
        let response = self
            .send(Req {
                method: Method::POST,
                url,
                query: &[],
                payload: Payload::Json(body),
                idempotency_key: None,
                retry: Retry::Idempotent,
                stream: true,
            })
            .await?;
        pull_events(response, progress).await
    }

    async fn import_image(
        &self,
        archive: ByteStream,
        tag: Option<&str>,
    ) -> Result<Vec<sandcove_core::ImageSummary>> {
        let url = self.url_for(&["images", "import"])?;
        let query: Vec<(&str, String)> = tag.map(|t| ("tag", t.to_string())).into_iter().collect();
        // As an upload (see `write_file`): never retried, and a failing source abandons the
        // body with an error frame, answered once the server has discarded what it received.
        let abandon = Arc::new(Abandon::default());
        let body = reqwest::Body::wrap_stream(upload_frames(archive, abandon.clone()));
        let send = self
            .http
            .post(url.clone())
            .bearer_auth(&*self.api_key)
            .query(&query)
            .header(reqwest::header::CONTENT_TYPE, FRAMES_CONTENT_TYPE)
            .body(body)
            .send();
        let sent = tokio::select! {
            sent = send => Some(sent),
            () = abandon.deadline() => None,
        };
        if let Some(error) = abandon.take() {
            return Err(error);
        }
        match sent {
            Some(Ok(response)) if response.status().is_success() => decode_json(response)
                .await
                .map_err(|e| outcome_lost(e, None)),
            Some(Ok(response)) => Err(read_error(response, self.options.request_timeout).await),
            Some(Err(e)) if e.is_connect() || e.is_builder() => {
                Err(transport_error(&e, &Method::POST, &url))
            }
            Some(Err(e)) => Err(outcome_lost(transport_error(&e, &Method::POST, &url), None)),
            None => Err(Error::backend("the import was abandoned")),
        }
    }

    async fn image_availability(
        &self,
        reference: &str,
    ) -> Result<sandcove_core::ImageAvailability> {
        let url = self.url_for(&["images", "check"])?;
        let body = body::ImageReference {
            reference: reference.to_string(),
        };
        self.call(Method::POST, url, &[], Some(&body), Retry::Idempotent)
            .await
    }

    async fn inspect_image(&self, reference: &str) -> Result<sandcove_core::ImageDetails> {
        let url = self.url_for(&["images", "inspect"])?;
        let body = body::ImageReference {
            reference: reference.to_string(),
        };
        // A read: safe to repeat.
        self.call(Method::POST, url, &[], Some(&body), Retry::Idempotent)
            .await
    }

    async fn remove_image(&self, reference: &str) -> Result<()> {
        let url = self.url_for(&["images", "remove"])?;
        let body = body::ImageReference {
            reference: reference.to_string(),
        };
        let payload = crate::transport::Payload::Json(
            serde_json::to_vec(&body).map_err(|e| Error::invalid(e.to_string()))?,
        );
        self.call_unit(Method::POST, url, &[], payload, Retry::Unsafe)
            .await
    }

    async fn prune_images(&self) -> Result<sandcove_core::ImagePruneReport> {
        let url = self.url_for(&["images", "prune"])?;
        self.call(Method::POST, url, &[], None::<&()>, Retry::Idempotent)
            .await
    }

    async fn observe(
        &self,
        operation: &sandcove_core::OperationId,
    ) -> Result<sandcove_core::OperationStatus> {
        let url = self.url_for(&["operations", operation.as_str()])?;
        self.call(Method::GET, url, &[], None::<&()>, Retry::Idempotent)
            .await
    }

    async fn tombstone(
        &self,
        kind: sandcove_core::ResourceKind,
        id: &str,
    ) -> Result<Option<sandcove_core::Tombstone>> {
        let url = self.url_for(&["tombstones", kind.as_str(), id])?;
        self.call(Method::GET, url, &[], None::<&()>, Retry::Idempotent)
            .await
    }
}

/// A file call's query with the `user` parameter when one is named.
fn with_user(
    mut query: Vec<(&'static str, String)>,
    user: Option<String>,
) -> Vec<(&'static str, String)> {
    if let Some(user) = user {
        query.push(("user", user));
    }
    query
}

/// Query parameters naming a process.
fn selector_query(process: &ProcessSelector) -> Vec<(&'static str, String)> {
    match process {
        ProcessSelector::Pid(pid) => vec![("pid", pid.to_string())],
        ProcessSelector::Tag(tag) => vec![("tag", tag.clone())],
    }
}
