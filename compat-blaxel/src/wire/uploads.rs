//! The sandbox API's multipart uploads (`/filesystem-multipart/…`), which the TypeScript SDK
//! uses for files over 5 MiB: initiate, parts (a `multipart/form-data` body each), complete
//! (the parts joined in order and written with the facade's `fs.write_binary`), abort.
//!
//! Parts wait in memory until the upload completes, so they are bounded: all uploads in
//! flight together hold at most the listener's upload limit, at most [`MAX_UPLOADS`] are
//! open at once, and an upload left unfinished is dropped after [`UPLOAD_TTL`].

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{FromRequest, Multipart, Path, Query, Request, State};
use axum::response::Response;
use serde::Deserialize;
use serde_json::json;

use super::sandbox_api::{absolute, data, ok_json, parse, sandbox};
use super::{ApiError, Wire};
use crate::errors::SandboxAPIError;

/// Uploads open at once (all sandboxes of the listener).
pub const MAX_UPLOADS: usize = 16;
/// How long an upload may stay unfinished.
pub const UPLOAD_TTL: Duration = Duration::from_secs(30 * 60);

/// One upload in flight.
#[derive(Debug)]
pub(crate) struct Upload {
    sandbox: String,
    path: String,
    parts: BTreeMap<u32, Bytes>,
    started: Instant,
}

/// Every upload in flight, by id.
#[derive(Debug, Default)]
pub(crate) struct Uploads {
    open: HashMap<String, Upload>,
}

impl Uploads {
    fn prune(&mut self) {
        self.open.retain(|_, u| u.started.elapsed() < UPLOAD_TTL);
    }

    fn bytes(&self) -> usize {
        self.open
            .values()
            .flat_map(|u| u.parts.values())
            .map(Bytes::len)
            .sum()
    }
}

fn missing(upload: &str) -> ApiError {
    data(SandboxAPIError::response(
        404,
        format!("upload {upload} not found"),
    ))
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
    sandbox(&wire, &name).await?;
    let path = absolute(&path);
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
            path: path.clone(),
            parts: BTreeMap::new(),
            started: Instant::now(),
        },
    );
    Ok(ok_json(&json!({"uploadId": id, "path": path})))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PartQuery {
    part_number: u32,
}

/// `PUT /filesystem-multipart/{upload}/part?partNumber=N` with a `file` form field.
pub(crate) async fn part(
    State(wire): State<Wire>,
    Path((name, upload)): Path<(String, String)>,
    Query(q): Query<PartQuery>,
    request: Request,
) -> Result<Response, ApiError> {
    let known = {
        let mut uploads = wire.uploads.lock().unwrap_or_else(|e| e.into_inner());
        uploads.prune();
        uploads.open.get(&upload).is_some_and(|u| u.sandbox == name)
    };
    if !known {
        return Err(missing(&upload));
    }
    if q.part_number == 0 || q.part_number > 10_000 {
        return Err(data(SandboxAPIError::response(
            400,
            "partNumber must be between 1 and 10000",
        )));
    }
    let mut form = Multipart::from_request(request, &wire)
        .await
        .map_err(|e| data(SandboxAPIError::response(400, e.body_text())))?;
    let mut file = None;
    while let Some(field) = form
        .next_field()
        .await
        .map_err(|e| data(SandboxAPIError::response(400, e.body_text())))?
    {
        if field.name() == Some("file") {
            file = Some(
                field
                    .bytes()
                    .await
                    .map_err(|e| data(SandboxAPIError::response(400, e.body_text())))?,
            );
        }
    }
    let file =
        file.ok_or_else(|| data(SandboxAPIError::response(400, "the form has no file part")))?;
    let size = file.len();
    let mut uploads = wire.uploads.lock().unwrap_or_else(|e| e.into_inner());
    let held = uploads.bytes();
    let Some(entry) = uploads.open.get_mut(&upload) else {
        return Err(missing(&upload));
    };
    let replaced = entry.parts.get(&q.part_number).map_or(0, Bytes::len);
    if held - replaced + size > wire.config.max_upload_bytes {
        return Err(data(SandboxAPIError::response(
            413,
            format!(
                "uploads in progress would hold more than {} bytes",
                wire.config.max_upload_bytes
            ),
        )));
    }
    entry.parts.insert(q.part_number, file);
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
    let mut numbers: Vec<u32> = request.parts.iter().map(|p| p.part_number).collect();
    numbers.sort_unstable();
    numbers.dedup();
    let mut bytes = Vec::new();
    for n in &numbers {
        let part = entry.parts.get(n).ok_or_else(|| {
            data(SandboxAPIError::response(
                400,
                format!("part {n} was not uploaded"),
            ))
        })?;
        bytes.extend_from_slice(part);
    }
    let instance = sandbox(&wire, &name).await?;
    let done = instance
        .fs
        .write_binary(&entry.path, bytes)
        .await
        .map_err(data)?;
    Ok(ok_json(&done))
}

/// `DELETE /filesystem-multipart/{upload}/abort`.
pub(crate) async fn abort(
    State(wire): State<Wire>,
    Path((name, upload)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let mut uploads = wire.uploads.lock().unwrap_or_else(|e| e.into_inner());
    match uploads.open.get(&upload) {
        Some(u) if u.sandbox == name => {
            uploads.open.remove(&upload);
            Ok(ok_json(&json!({"message": "Upload aborted"})))
        }
        _ => Err(missing(&upload)),
    }
}
