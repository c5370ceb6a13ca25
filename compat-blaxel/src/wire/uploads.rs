//! The sandbox API's multipart uploads (`/filesystem-multipart/…`), which both SDKs use for
//! files over 5 MiB, in parts of 5 MiB (the last one shorter): initiate, parts (a
//! `multipart/form-data` body each), complete (the parts joined in order and written as the
//! facade's `fs.write_binary` writes), abort.
//!
//! Nothing of an upload is held in memory: each part streams into a file of its own in the
//! sandbox (under [`PARTS_DIR`], as Blaxel's own sandbox API keeps them in its temp
//! directory), and `complete` streams those files, in order, into the destination, which is
//! replaced only once all of it is written; the part files are then removed, as they are on
//! abort and when an upload left unfinished is dropped after [`UPLOAD_TTL`].
//!
//! **Limits.** A part may be as large as the upload limit, and an upload's parts together
//! (a part sent again counts once) at most the upload limit as well:
//! [`WireConfig::max_upload_bytes`](super::WireConfig::max_upload_bytes), which
//! `sandcove serve --max-upload-bytes` sets (default 4 GiB). A part past what is left is
//! `413` and keeps nothing. Part numbers run from 1 to [`MAX_PART_NUMBER`], and at most
//! [`MAX_UPLOADS`] uploads are open at once. Memory stays bounded by the server's upload
//! budget whatever the sizes (see `sandcove_compat_support::multipart`).

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{Path, Query, Request, State};
use axum::http::header;
use axum::response::Response;
use futures::StreamExt;
use sandcove_compat_support::multipart::{self, Upload as Form, UploadError, UploadErrorKind};
use serde::Deserialize;
use serde_json::json;

use super::sandbox_api::{data, ok_json, parse, sandbox, user_path};
use super::{ApiError, Wire};
use crate::errors::SandboxAPIError;

/// The highest part number (S3's bound, which Blaxel's API follows).
pub const MAX_PART_NUMBER: u32 = 10_000;
/// Uploads open at once (all sandboxes of the listener).
pub const MAX_UPLOADS: usize = 16;
/// How long an upload may stay unfinished.
pub const UPLOAD_TTL: Duration = Duration::from_secs(30 * 60);
/// Where, inside a sandbox, the parts of its uploads wait (one directory per upload).
pub const PARTS_DIR: &str = "/tmp/.sandcove-multipart";

/// One upload in flight.
#[derive(Debug)]
pub(crate) struct Upload {
    sandbox: String,
    /// The sandbox, to write and remove the part files.
    core: sandcove::Sandbox,
    path: String,
    /// Part number → its size; the data is in [`Upload::part_file`].
    parts: BTreeMap<u32, u64>,
    started: Instant,
    /// The directory of its part files.
    dir: String,
}

impl Upload {
    fn part_file(&self, n: u32) -> String {
        format!("{}/{n}", self.dir)
    }

    /// Remove the part files, on a task of their own (pruning happens under a lock).
    fn discard(self) {
        tokio::spawn(async move {
            let _ = self.core.remove_all(&self.dir).await;
        });
    }
}

/// Every upload in flight, by id.
#[derive(Debug, Default)]
pub(crate) struct Uploads {
    open: HashMap<String, Upload>,
}

impl Uploads {
    fn prune(&mut self) {
        let expired: Vec<String> = self
            .open
            .iter()
            .filter(|(_, u)| u.started.elapsed() >= UPLOAD_TTL)
            .map(|(id, _)| id.clone())
            .collect();
        for id in expired {
            if let Some(upload) = self.open.remove(&id) {
                upload.discard();
            }
        }
    }
}

fn missing(upload: &str) -> ApiError {
    data(SandboxAPIError::response(
        404,
        format!("upload {upload} not found"),
    ))
}

/// The data plane's error for an upload's failure.
fn upload_error(e: UploadError) -> ApiError {
    let status = match e.kind {
        UploadErrorKind::Busy => 429,
        UploadErrorKind::TooLarge => 413,
        UploadErrorKind::Forbidden => 403,
        _ => 400,
    };
    data(SandboxAPIError::response(status, e.message))
}

/// The core error of an upload's failure inside a write (which it ends, keeping nothing).
pub(crate) fn upload_core_error(e: UploadError) -> sandcove::Error {
    match e.kind {
        UploadErrorKind::Busy => sandcove::Error::RateLimited {
            message: e.message,
            retry_after_ms: Some(1000),
        },
        UploadErrorKind::TooLarge => sandcove::Error::FileTooLarge {
            what: "the upload".into(),
            limit: 0,
            remedy: e.message,
        },
        UploadErrorKind::Forbidden => sandcove::Error::Forbidden { what: e.message },
        _ => sandcove::Error::invalid(e.message),
    }
}

/// The one `file` part of a `multipart/form-data` request, as the stream a write takes: it
/// ends without an error only if no other `file` part follows (other fields are read past),
/// so a write of it keeps nothing otherwise. `max_bytes` bounds the whole body.
pub(crate) async fn sole_file(
    wire: &Wire,
    request: Request,
    max_bytes: u64,
) -> Result<sandcove::ByteStream, ApiError> {
    let content_type = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let body = multipart::body_stream(request.into_body().into_data_stream());
    let mut form = Form::start(body, &content_type, max_bytes, &wire.config.upload_memory)
        .await
        .map_err(upload_error)?;
    let file = loop {
        match form.next_part().await.map_err(upload_error)? {
            Some(part) if part.name == "file" => break part,
            Some(part) => form.skip(part).await.map_err(upload_error)?,
            None => {
                return Err(data(SandboxAPIError::response(
                    400,
                    "the form has no file part",
                )))
            }
        }
    };
    let stream = form.sole_file(
        file,
        |part| part.name == "file",
        |_| {
            UploadError::new(
                UploadErrorKind::Malformed,
                "the form has more than one file part",
            )
        },
    );
    Ok(Box::pin(stream.map(|chunk| {
        chunk.map(|b| b.to_vec()).map_err(upload_core_error)
    })))
}

/// `POST /filesystem-multipart/initiate/{path}` `{permissions}` → `{uploadId, path}`.
pub(crate) async fn initiate(
    State(wire): State<Wire>,
    Path((name, path)): Path<(String, String)>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let body = parse(&wire, &body)?;
    let permissions = body.get("permissions").and_then(|p| p.as_str());
    if permissions.is_some_and(|p| p != "0644") {
        return Err(data(SandboxAPIError::response(
            400,
            "files are written with mode 0644; change it with process.exec (chmod)",
        )));
    }
    // The sandbox must exist now, not only at the end.
    let instance = sandbox(&wire, &name).await?;
    let path = user_path(&path);
    let id = format!("upload-{}", crate::state::random_suffix(16));
    let mut uploads = wire.uploads.lock().unwrap_or_else(|e| e.into_inner());
    uploads.prune();
    if uploads.open.len() >= MAX_UPLOADS {
        return Err(data(SandboxAPIError::response(
            429,
            format!("{MAX_UPLOADS} uploads are in progress; finish or abort one first"),
        )));
    }
    uploads.open.insert(
        id.clone(),
        Upload {
            sandbox: name,
            core: instance.fs.core().clone(),
            path: path.clone(),
            parts: BTreeMap::new(),
            started: Instant::now(),
            dir: format!("{PARTS_DIR}/{id}"),
        },
    );
    Ok(ok_json(&json!({"uploadId": id, "path": path})))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PartQuery {
    part_number: u32,
}

/// `PUT /filesystem-multipart/{upload}/part?partNumber=N` with a `file` form field: the
/// field streams into the part's file in the sandbox.
pub(crate) async fn part(
    State(wire): State<Wire>,
    Path((name, upload)): Path<(String, String)>,
    Query(q): Query<PartQuery>,
    request: Request,
) -> Result<Response, ApiError> {
    // Where the part goes, and how much room the upload has left for it.
    let (core, file, room) = {
        let mut uploads = wire.uploads.lock().unwrap_or_else(|e| e.into_inner());
        uploads.prune();
        match uploads.open.get(&upload) {
            Some(u) if u.sandbox == name => {
                let others: u64 = u
                    .parts
                    .iter()
                    .filter(|(n, _)| **n != q.part_number)
                    .map(|(_, size)| size)
                    .sum();
                let room = wire.config.max_upload_bytes.saturating_sub(others);
                (u.core.clone(), u.part_file(q.part_number), room)
            }
            _ => return Err(missing(&upload)),
        }
    };
    if q.part_number == 0 || q.part_number > MAX_PART_NUMBER {
        return Err(data(SandboxAPIError::response(
            400,
            format!("partNumber must be between 1 and {MAX_PART_NUMBER}"),
        )));
    }
    let max_body = wire
        .config
        .max_upload_bytes
        .saturating_add(multipart::MAX_FORM_BYTES as u64);
    let stream = sole_file(&wire, request, max_body).await?;
    let options = sandcove::WriteOptions::default()
        .create_parents(true)
        .max_bytes(room);
    let written = match core.write_stream(&file, stream, options).await {
        Ok(stat) => stat,
        Err(sandcove::Error::FileTooLarge { .. }) => {
            return Err(data(SandboxAPIError::response(
                413,
                format!(
                    "the upload's parts would be larger than {} bytes",
                    wire.config.max_upload_bytes
                ),
            )))
        }
        Err(e) => return Err(data(e)),
    };
    let size = written.size;
    let recorded = {
        let mut uploads = wire.uploads.lock().unwrap_or_else(|e| e.into_inner());
        uploads
            .open
            .get_mut(&upload)
            .map(|entry| entry.parts.insert(q.part_number, size))
            .is_some()
    };
    if !recorded {
        // Completed or aborted meanwhile: its directory is gone, or going.
        let _ = core.remove(&file).await;
        return Err(missing(&upload));
    }
    Ok(ok_json(&json!({
        "partNumber": q.part_number,
        "etag": format!("part-{}-{size}", q.part_number),
        "size": size,
    })))
}

/// `POST /filesystem-multipart/{upload}/complete` `{parts: [{partNumber, etag}]}`: the
/// named parts, in order, become the file.
pub(crate) async fn complete(
    State(wire): State<Wire>,
    Path((name, upload)): Path<(String, String)>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let body = parse(&wire, &body)?;
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct PartInfo {
        part_number: u32,
        #[serde(default)]
        #[allow(dead_code)]
        etag: Option<String>,
    }
    #[derive(Deserialize)]
    struct Complete {
        #[serde(default)]
        parts: Vec<PartInfo>,
    }
    let request: Complete = serde_json::from_value(body)
        .map_err(|e| data(SandboxAPIError::response(400, format!("invalid body: {e}"))))?;
    let entry = {
        let mut uploads = wire.uploads.lock().unwrap_or_else(|e| e.into_inner());
        match uploads.open.get(&upload) {
            Some(u) if u.sandbox == name => uploads.open.remove(&upload),
            _ => None,
        }
    }
    .ok_or_else(|| missing(&upload))?;
    let result = assemble(
        &wire,
        &name,
        &entry,
        request.parts.iter().map(|p| p.part_number),
    )
    .await;
    // The parts are spent either way (as they were when held in memory).
    let _ = entry.core.remove_all(&entry.dir).await;
    result
}

/// Stream the part files `numbers` (in order, each once) into the upload's destination.
async fn assemble(
    wire: &Wire,
    name: &str,
    entry: &Upload,
    numbers: impl Iterator<Item = u32>,
) -> Result<Response, ApiError> {
    let mut numbers: Vec<u32> = numbers.collect();
    numbers.sort_unstable();
    numbers.dedup();
    if let Some(n) = numbers.iter().find(|n| !entry.parts.contains_key(n)) {
        return Err(data(SandboxAPIError::response(
            400,
            format!("part {n} was not uploaded"),
        )));
    }
    let instance = sandbox(wire, name).await?;
    let core = entry.core.clone();
    let files: Vec<String> = numbers.iter().map(|n| entry.part_file(*n)).collect();
    // One part file open at a time, read as it is written out.
    let joined = futures::stream::iter(files)
        .then(move |file| {
            let core = core.clone();
            async move {
                match core.read_stream(&file).await {
                    Ok(stream) => stream,
                    Err(e) => Box::pin(futures::stream::once(async move { Err(e) })),
                }
            }
        })
        .flatten();
    let limit = wire.config.max_upload_bytes;
    let done = instance
        .fs
        .write_binary_stream(&entry.path, Box::pin(joined), Some(limit))
        .await
        .map_err(data)?;
    Ok(ok_json(&done))
}

/// `DELETE /filesystem-multipart/{upload}/abort`.
pub(crate) async fn abort(
    State(wire): State<Wire>,
    Path((name, upload)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let entry = {
        let mut uploads = wire.uploads.lock().unwrap_or_else(|e| e.into_inner());
        match uploads.open.get(&upload) {
            Some(u) if u.sandbox == name => uploads.open.remove(&upload),
            _ => None,
        }
    }
    .ok_or_else(|| missing(&upload))?;
    let _ = entry.core.remove_all(&entry.dir).await;
    Ok(ok_json(&json!({"message": "Upload aborted"})))
}
