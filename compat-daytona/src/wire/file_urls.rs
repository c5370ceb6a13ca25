//! Daytona's pre-signed file URLs (`sandbox.download_url` / `upload_url`) as the SDKs make
//! them: the SDK fetches the sandbox's signing key (`GET /api/sandbox/{id}/signing-key`, the
//! server's key required) and signs each URL itself, `v1_` + unpadded base64url of
//! HMAC-SHA256(key, `v1:files:{METHOD}:{path}:{expires}`) (`expires` in seconds since the
//! epoch, `0` for never), then anyone holding the URL `GET`s `{toolboxProxyUrl}/{id}/files/download`
//! or `POST`s a `multipart/form-data` `file` part to `…/files/upload-v2`, with no credential.
//!
//! The key is derived from the server's API key, the sandbox id and a salt kept in the
//! facade's per-sandbox state (outside the sandbox): it survives a restart of the server,
//! differs per sandbox, and `rotate_signing_key` (a fresh salt) ends every URL signed
//! before. A signed request is verified (constant time: sandbox, method, path, expiry)
//! before any effect, turned into a [`FileGrant`], and served by the runtime's one serving
//! code ([`sandcove::file_url::transfer`]) through the file API.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue, Method, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use futures::StreamExt;
use sandcove::file_url::{transfer, BackendFiles, Served};
use sandcove::{FileGrant, FileUrlOperation};
use serde_json::json;

use super::api::query_pairs;
use super::{ApiError, Wire};

/// Label of the derivation, so the key is never the API key nor any other key made from it.
const KEY_LABEL: &str = "sandcove daytona file url signing key";

/// The signature scheme the SDKs write (`v1_` then the tag).
const SIGNATURE_PREFIX: &str = "v1_";

/// The endpoints a signed URL may name under `/toolbox/{id}`, with the method each is
/// signed for and the operation it does.
fn endpoint(tail: &str) -> Option<(Method, FileUrlOperation)> {
    match tail {
        "/files/download" => Some((Method::GET, FileUrlOperation::Read)),
        "/files/upload-v2" => Some((Method::POST, FileUrlOperation::Write)),
        _ => None,
    }
}

/// The signing key of sandbox `id` under `salt` (its rotation), as the SDK is given it.
pub(crate) fn signing_key(api_key: &str, id: &str, salt: &str) -> String {
    let outer = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, api_key.as_bytes());
    let tag = ring::hmac::sign(&outer, format!("{KEY_LABEL}\0{id}\0{salt}").as_bytes());
    tag.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// A fresh salt, for a rotation.
pub(crate) fn new_salt() -> sandcove::Result<String> {
    let mut bytes = [0u8; 16];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
        .map_err(|_| sandcove::Error::backend("no random source for a signing key"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The signature text the SDKs sign.
fn canonical(method: &Method, path: &str, expires: u64) -> String {
    format!("v1:files:{method}:{path}:{expires}")
}

/// Why a signed request was refused (`401`, before any effect).
#[derive(Debug)]
pub(crate) struct Invalid(pub &'static str);

/// The grant of a request aimed at a signed file URL: `Ok(None)` if it is not one (another
/// path, or no `signature` parameter: the ordinary checks then apply), the grant if its
/// signature holds for this sandbox, method, path and time, else why not.
pub(crate) async fn verify(
    wire: &Wire,
    method: &Method,
    uri: &Uri,
) -> Result<Option<FileGrant>, Invalid> {
    let Some(rest) = uri.path().strip_prefix("/toolbox/") else {
        return Ok(None);
    };
    let Some((id, tail)) = rest.split_once('/') else {
        return Ok(None);
    };
    let Some((signed_method, operation)) = endpoint(&format!("/{tail}")) else {
        return Ok(None);
    };
    let mut path = None;
    let mut expires = None;
    let mut signature = None;
    for (k, v) in query_pairs(uri.query().unwrap_or("")) {
        match k.as_str() {
            "path" => path = Some(v),
            "expires" => expires = Some(v),
            "signature" => signature = Some(v),
            _ => {}
        }
    }
    let Some(signature) = signature else {
        return Ok(None);
    };
    let invalid = Invalid("invalid signature for this sandbox file URL");
    if *method != signed_method {
        return Err(Invalid("this signed file URL is for another method"));
    }
    let (Some(path), Some(expires)) = (path, expires) else {
        return Err(invalid);
    };
    let expires: u64 = expires.parse().map_err(|_| Invalid("bad expires"))?;
    let tag = signature
        .strip_prefix(SIGNATURE_PREFIX)
        .and_then(|t| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(t)
                .ok()
        })
        .ok_or(Invalid("invalid signature for this sandbox file URL"))?;
    // The key needs the sandbox's salt: a sandbox that does not exist verifies nothing.
    let sandbox = wire
        .daytona()
        .get(id.to_string())
        .await
        .map_err(|_| Invalid("invalid signature for this sandbox file URL"))?;
    let salt = sandbox.meta.signing_salt.as_deref().unwrap_or_default();
    let key = signing_key(&wire.config.api_key, &sandbox.id, salt);
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key.as_bytes());
    // Constant time (ring compares the tags so).
    ring::hmac::verify(
        &key,
        canonical(&signed_method, &path, expires).as_bytes(),
        &tag,
    )
    .map_err(|_| invalid)?;
    let now = sandcove::now_millis() / 1000;
    if expires != 0 && expires <= now {
        return Err(Invalid("this signed file URL has expired"));
    }
    Ok(Some(FileGrant {
        sandbox: sandbox.id.clone(),
        path: sandbox.ctx.resolve(&path),
        operation,
        user: None,
        expires_at: (expires != 0).then(|| expires.saturating_mul(1000)),
        max_bytes: None,
        nonce: String::new(),
    }))
}

/// Serve `request` under its verified `grant` through the runtime's file-URL code: a
/// download streams the bytes, an upload answers `{}`; a refusal is Daytona's error.
pub(crate) async fn serve(wire: &Wire, grant: &FileGrant, request: Request) -> Response {
    // The signature covered the path as the SDK wrote it, and the grant holds it resolved
    // against the work dir: the query has said its part, so the request goes on without it.
    let (mut parts, body) = request.into_parts();
    parts.uri = Uri::from_static("/");
    let request = Request::from_parts(parts, body);
    let access = BackendFiles(wire.client.backend().clone());
    let max_upload = wire.config.max_upload_bytes as u64;
    match transfer(request, grant, &access, max_upload).await {
        Ok(Served::Read(stream)) => (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            )],
            Body::from_stream(stream.map(|chunk| chunk.map(axum::body::Bytes::from))),
        )
            .into_response(),
        Ok(Served::Written(_)) => Json(json!({})).into_response(),
        Err(e) => ApiError(e.into()).into_response(),
    }
}
