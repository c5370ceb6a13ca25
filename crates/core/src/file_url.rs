//! Signed file URLs: minted by whoever holds a sandbox's runtime, verified and served outside
//! the sandbox, the transfer going through the file API.
//!
//! A URL carries a token: the [`FileGrant`] it allows (sandbox, path, operation, user,
//! expiry, upload bound, a nonce) as unpadded base64url JSON, a `.`, and the HMAC-SHA256 of
//! that text under a key only the URL's issuer holds ([`FileUrlKey`]), checked in constant
//! time. Nothing about a URL is stored: the embedded engine's monitor holds a random key in
//! its memory for the sandbox's life (its URLs end with the sandbox, which takes the
//! listener with it); `sandcove serve` derives its key from its API key, so its URLs survive
//! a restart and end when the sandbox is gone (the file API then answers `NotFound`). No
//! sandbox can read either key.
//!
//! [`serve`] is the one serving code, used by the monitor's listener (hyper, in
//! `sandcove-agent`) and the server's route (axum), both of which see this crate only, and by E2B's wire listener once it has verified E2B's own signature format:
//! it checks the request against the grant (the operation its method asks, the `path` query
//! parameter if any, a multipart upload's file name) before any effect, then streams through a
//! [`FileAccess`], the file API with its path confinement, user checks and bounds. A refusal
//! is an [`Error`] (unknown, tampered or expired token `401 unauthenticated`, another
//! operation or path `403 forbidden`) as a JSON [`ErrorBody`](crate::ErrorBody).

use std::sync::Arc;

use async_trait::async_trait;
use base64::Engine as _;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Method, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};

use crate::wire::status_for;
use crate::{
    now_millis, Backend, ByteStream, Error, FileGrant, FileStat, FileUrlOperation, ReadOptions,
    Result, WriteOptions,
};

/// An error a body may end with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Longest token accepted, in bytes: a grant with the longest path and user, encoded. A
/// longer one is refused before it is decoded.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// Largest upload a URL takes when neither its grant nor the listener bounds it tighter: the
/// file API's own bound.
pub const DEFAULT_MAX_UPLOAD_BYTES: u64 = 4 << 30;

/// Largest `multipart/form-data` part head (its headers), in bytes.
const MAX_PART_HEAD: u64 = 64 * 1024;

/// What the signature covers, before the grant (so a token of another kind never verifies).
const DOMAIN: &[u8] = b"sandcove signed file url v1\0";

/// Unpadded base64url: a token is one URL path segment as it is.
const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// The key URLs are signed with (HMAC-SHA256). Held by the issuer only; never written where a
/// sandbox could read it.
pub struct FileUrlKey(ring::hmac::Key);

impl std::fmt::Debug for FileUrlKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key is deliberately left out.
        f.write_str("FileUrlKey")
    }
}

impl FileUrlKey {
    /// A fresh random key (256 bits from the kernel): URLs valid for this key's holder's life.
    pub fn random() -> Result<Self> {
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret)
            .map_err(|e| Error::backend(format!("no random source for a signing key: {e}")))?;
        Ok(FileUrlKey(ring::hmac::Key::new(
            ring::hmac::HMAC_SHA256,
            &secret,
        )))
    }

    /// The key derived from `secret` (a server's API key) under a label of its own, so it is
    /// never the secret itself nor any other key derived from it.
    pub fn derived_from(secret: &[u8]) -> Self {
        let outer = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret);
        let derived = ring::hmac::sign(&outer, b"sandcove signed file url key");
        FileUrlKey(ring::hmac::Key::new(
            ring::hmac::HMAC_SHA256,
            derived.as_ref(),
        ))
    }

    /// The token of `grant`.
    pub fn sign(&self, grant: &FileGrant) -> String {
        let json = serde_json::to_vec(grant).unwrap_or_default();
        let payload = B64.encode(json);
        let tag = ring::hmac::sign(&self.0, &signed_text(&payload));
        format!("{payload}.{}", B64.encode(tag.as_ref()))
    }

    /// The grant `token` carries, if this key signed it and it has not expired by `now`;
    /// anything else is [`Error::Unauthenticated`], before the grant is read.
    pub fn verify(&self, token: &str, now: u64) -> Result<FileGrant> {
        let invalid = || Error::Unauthenticated {
            message: "invalid signed file URL".into(),
        };
        if token.len() > MAX_TOKEN_BYTES {
            return Err(invalid());
        }
        let (payload, tag) = token.split_once('.').ok_or_else(invalid)?;
        let tag = B64.decode(tag).map_err(|_| invalid())?;
        // Constant time (ring compares the tags so).
        ring::hmac::verify(&self.0, &signed_text(payload), &tag).map_err(|_| invalid())?;
        let json = B64.decode(payload).map_err(|_| invalid())?;
        let grant: FileGrant = serde_json::from_slice(&json).map_err(|_| invalid())?;
        if grant.expires_at.is_some_and(|at| at <= now) {
            return Err(Error::Unauthenticated {
                message: "this signed file URL has expired".into(),
            });
        }
        Ok(grant)
    }
}

fn signed_text(payload: &str) -> Vec<u8> {
    let mut text = DOMAIN.to_vec();
    text.extend_from_slice(payload.as_bytes());
    text
}

/// How a listener moves a grant's bytes: the file API of the sandbox the grant names.
#[async_trait]
pub trait FileAccess: Send + Sync {
    /// The bytes of the grant's path, read as its user.
    async fn read(&self, grant: &FileGrant) -> Result<ByteStream>;

    /// Write `data` to the grant's path as its user (parents created, an existing file
    /// replaced), taking at most `max_bytes`. An error item in `data` ends the write and
    /// keeps nothing.
    async fn write(&self, grant: &FileGrant, data: ByteStream, max_bytes: u64) -> Result<FileStat>;
}

/// The read options of a grant's transfer.
pub fn read_options(grant: &FileGrant) -> ReadOptions {
    ReadOptions {
        user: grant.user.clone(),
        ..Default::default()
    }
}

/// The write options of a grant's transfer of at most `max_bytes`.
pub fn write_options(grant: &FileGrant, max_bytes: u64) -> WriteOptions {
    WriteOptions {
        user: grant.user.clone(),
        max_bytes: Some(max_bytes),
        ..Default::default()
    }
}

/// [`FileAccess`] through a [`Backend`]'s `read_file` and `write_file` (a server's listener:
/// whatever backend it serves).
#[derive(Clone)]
pub struct BackendFiles(pub Arc<dyn Backend>);

#[async_trait]
impl FileAccess for BackendFiles {
    async fn read(&self, grant: &FileGrant) -> Result<ByteStream> {
        self.0
            .read_file(&grant.sandbox, &grant.path, read_options(grant))
            .await
    }

    async fn write(&self, grant: &FileGrant, data: ByteStream, max_bytes: u64) -> Result<FileStat> {
        self.0
            .write_file(
                &grant.sandbox,
                &grant.path,
                data,
                write_options(grant, max_bytes),
            )
            .await
    }
}

/// A signed URL's answer body.
pub type Reply = UnsyncBoxBody<Bytes, BoxError>;

/// What a request through a signed URL did, before it is rendered: the bytes read (to
/// stream), or the file written.
pub enum Served {
    /// A read: the file's bytes.
    Read(ByteStream),
    /// A write: the file now.
    Written(FileStat),
}

/// Serve `request` under `grant` (verified by the caller, which also bound it to its
/// sandbox) through `access`, rendered the native way: a read streams the bytes as
/// `application/octet-stream`, a write answers the new file's [`FileStat`] as JSON, a refusal
/// is its [`Error`]'s status with an `ErrorBody`. Uploads take at most `max_upload` bytes (and
/// the grant's own bound).
pub async fn serve<B>(
    request: Request<B>,
    grant: &FileGrant,
    access: &dyn FileAccess,
    max_upload: u64,
) -> Response<Reply>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    match transfer(request, grant, access, max_upload).await {
        Ok(Served::Read(stream)) => {
            let body = StreamBody::new(stream.map(|chunk| {
                chunk
                    .map(|b| Frame::data(Bytes::from(b)))
                    .map_err(|e| -> BoxError { Box::new(e) })
            }));
            let mut response = Response::new(UnsyncBoxBody::new(body));
            response.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            response
        }
        Ok(Served::Written(stat)) => {
            let json = serde_json::to_vec(&stat).unwrap_or_default();
            let mut response = Response::new(full(json));
            response
                .headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            response
        }
        Err(e) => error_response(&e),
    }
}

/// `error` as a JSON `ErrorBody` with its status.
pub fn error_response(error: &Error) -> Response<Reply> {
    let json = serde_json::to_vec(&error.to_body()).unwrap_or_default();
    let mut response = Response::new(full(json));
    *response.status_mut() =
        StatusCode::from_u16(status_for(error.code())).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn full(bytes: Vec<u8>) -> Reply {
    UnsyncBoxBody::new(Full::new(Bytes::from(bytes)).map_err(|never| match never {}))
}

/// The operation a method asks for: `GET` reads, `PUT` and `POST` write; anything else is
/// refused.
pub fn operation_of(method: &Method) -> Result<FileUrlOperation> {
    match *method {
        Method::GET => Ok(FileUrlOperation::Read),
        Method::PUT | Method::POST => Ok(FileUrlOperation::Write),
        _ => Err(Error::Forbidden {
            what: format!(
                "a signed file URL is read with GET and written with PUT or POST, not {method}"
            ),
        }),
    }
}

/// Check `request` against `grant` and do it: the one transfer every listener uses, which
/// renders its [`Served`] (or error) its own way.
pub async fn transfer<B>(
    request: Request<B>,
    grant: &FileGrant,
    access: &dyn FileAccess,
    max_upload: u64,
) -> Result<Served>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let operation = operation_of(request.method())?;
    let path = query_path(request.uri().query())?;
    grant.check(operation, path.as_deref(), now_millis())?;
    match operation {
        FileUrlOperation::Read => access.read(grant).await.map(Served::Read),
        FileUrlOperation::Write => {
            let limit = grant.max_bytes.map_or(max_upload, |m| m.min(max_upload));
            let content_type = request
                .headers()
                .get(CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            let body = request
                .into_body()
                .into_data_stream()
                .map_err(|e| Error::invalid(format!("reading the upload: {}", e.into())));
            let data: ByteStream = match multer::parse_boundary(&content_type) {
                Ok(boundary) if content_type.starts_with("multipart/form-data") => {
                    sole_file_part(body, boundary, grant, limit).await?
                }
                _ => Box::pin(bounded(body, limit)),
            };
            access.write(grant, data, limit).await.map(Served::Written)
        }
    }
}

/// The `path` query parameter, if the request names one (it must be the grant's).
fn query_path(query: Option<&str>) -> Result<Option<String>> {
    let Some(query) = query else {
        return Ok(None);
    };
    Ok(form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == "path")
        .map(|(_, v)| v.into_owned()))
}

/// `body` as a write's data, ending in an error past `limit` bytes.
fn bounded(
    body: impl futures::Stream<Item = Result<Bytes>> + Send + 'static,
    limit: u64,
) -> impl futures::Stream<Item = Result<Vec<u8>>> + Send + 'static {
    let mut seen = 0u64;
    body.map(move |chunk| {
        let chunk = chunk?;
        seen += chunk.len() as u64;
        if seen > limit {
            return Err(Error::FileTooLarge {
                what: "the upload".into(),
                limit,
                remedy: "upload at most the URL's bound".into(),
            });
        }
        Ok(chunk.to_vec())
    })
}

/// The data of the one `file` part of a `multipart/form-data` upload, streamed. Other parts
/// are skipped; a part naming another path as its file name is refused before anything is
/// written; a second `file` part ends the write in an error, so nothing is kept.
async fn sole_file_part(
    body: impl futures::Stream<Item = Result<Bytes>> + Send + 'static,
    boundary: String,
    grant: &FileGrant,
    limit: u64,
) -> Result<ByteStream> {
    let constraints = multer::Constraints::new().size_limit(
        multer::SizeLimit::new()
            .whole_stream(limit.saturating_add(MAX_PART_HEAD))
            .per_field(limit),
    );
    let mut multipart = multer::Multipart::with_constraints(body, boundary, constraints);
    let malformed = |e: multer::Error| Error::invalid(format!("the multipart upload: {e}"));
    let first = loop {
        match multipart.next_field().await.map_err(malformed)? {
            None => return Err(Error::invalid("the multipart upload has no `file` part")),
            Some(field) if field.name() == Some("file") => break field,
            Some(_) => continue,
        }
    };
    if let Some(other) = first
        .file_name()
        .filter(|f| f.contains('/') && *f != grant.path)
    {
        return Err(Error::Forbidden {
            what: format!(
                "this signed URL writes {} only; the upload names {other}",
                grant.path
            ),
        });
    }
    enum State {
        Part(Box<(multer::Field<'static>, multer::Multipart<'static>)>),
        Done,
    }
    let path = grant.path.clone();
    let stream = futures::stream::unfold(State::Part(Box::new((first, multipart))), move |state| {
        let path = path.clone();
        async move {
            let State::Part(parts) = state else {
                return None;
            };
            let (mut field, mut multipart) = *parts;
            match field.chunk().await {
                Ok(Some(bytes)) => Some((
                    Ok(bytes.to_vec()),
                    State::Part(Box::new((field, multipart))),
                )),
                Ok(None) => {
                    drop(field);
                    // The part ended: the upload stands only if no other file follows.
                    loop {
                        match multipart.next_field().await {
                            Ok(None) => return None,
                            Ok(Some(next)) if next.name() == Some("file") => {
                                let refused = Error::Forbidden {
                                    what: format!(
                                        "this signed URL writes one file, {path}; the upload \
                                         carries another"
                                    ),
                                };
                                return Some((Err(refused), State::Done));
                            }
                            Ok(Some(_)) => continue,
                            Err(e) => {
                                let e = Error::invalid(format!("the multipart upload: {e}"));
                                return Some((Err(e), State::Done));
                            }
                        }
                    }
                }
                Err(e) => {
                    let e = Error::invalid(format!("the multipart upload: {e}"));
                    Some((Err(e), State::Done))
                }
            }
        }
    });
    Ok(Box::pin(stream))
}

/// The token of a request aimed at `prefix/{token}` (its last path segment), if its path is
/// that.
pub fn token_in_path<'a>(path: &'a str, prefix: &str) -> Option<&'a str> {
    let token = path.strip_prefix(prefix)?.strip_prefix('/')?;
    (!token.is_empty() && !token.contains('/')).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FileUrlOptions;

    fn grant() -> FileGrant {
        FileGrant::new(
            "sbx-a",
            &FileUrlOptions::read("/workspace/a.txt").user("user"),
        )
    }

    #[test]
    fn tokens_verify_under_their_key_only() {
        let key = FileUrlKey::random().unwrap();
        let g = grant();
        let token = key.sign(&g);
        assert_eq!(key.verify(&token, now_millis()).unwrap(), g);
        let other = FileUrlKey::random().unwrap();
        assert!(other.verify(&token, now_millis()).is_err(), "another key");
        let derived = FileUrlKey::derived_from(b"api key");
        let t = derived.sign(&g);
        assert!(FileUrlKey::derived_from(b"api key")
            .verify(&t, now_millis())
            .is_ok());
        assert!(FileUrlKey::derived_from(b"other key")
            .verify(&t, now_millis())
            .is_err());
    }

    #[test]
    fn tampered_truncated_and_oversized_tokens_are_refused() {
        let key = FileUrlKey::random().unwrap();
        let token = key.sign(&grant());
        let (payload, tag) = token.split_once('.').unwrap();
        // Another path under the same tag.
        let mut forged = grant();
        forged.path = "/etc/passwd".into();
        let forged_payload = B64.encode(serde_json::to_vec(&forged).unwrap());
        for bad in [
            format!("{forged_payload}.{tag}"),
            format!("{payload}.{}", &tag[1..]),
            payload.to_string(),
            String::new(),
            format!("{payload}.{tag}x"),
            "a".repeat(MAX_TOKEN_BYTES + 1),
        ] {
            let err = key.verify(&bad, now_millis()).unwrap_err();
            assert!(
                matches!(err, Error::Unauthenticated { .. }),
                "{bad}: {err:?}"
            );
        }
    }

    #[test]
    fn expired_tokens_are_refused() {
        let key = FileUrlKey::random().unwrap();
        let mut g = grant();
        g.expires_at = Some(1000);
        let token = key.sign(&g);
        assert!(key.verify(&token, 999).is_ok());
        assert!(matches!(
            key.verify(&token, 1000),
            Err(Error::Unauthenticated { .. })
        ));
    }

    #[test]
    fn a_grant_allows_its_operation_and_path_only() {
        let g = grant();
        let now = now_millis();
        assert!(g.check(FileUrlOperation::Read, None, now).is_ok());
        assert!(g
            .check(FileUrlOperation::Read, Some("/workspace/a.txt"), now)
            .is_ok());
        assert!(matches!(
            g.check(FileUrlOperation::Write, None, now),
            Err(Error::Forbidden { .. })
        ));
        assert!(matches!(
            g.check(FileUrlOperation::Read, Some("/workspace/b.txt"), now),
            Err(Error::Forbidden { .. })
        ));
        assert!(operation_of(&Method::DELETE).is_err());
    }

    #[test]
    fn tokens_are_found_as_the_last_segment() {
        assert_eq!(
            token_in_path("/v1/file-urls/abc.def", "/v1/file-urls"),
            Some("abc.def")
        );
        assert_eq!(token_in_path("/v1/file-urls/", "/v1/file-urls"), None);
        assert_eq!(token_in_path("/v1/file-urls/a/b", "/v1/file-urls"), None);
        assert_eq!(token_in_path("/other/a", "/v1/file-urls"), None);
    }
}
