//! `upload_url` / `download_url`: URLs that upload or download a file with a plain HTTP
//! request, like E2B's pre-signed envd `/files` URLs.
//!
//! Each is the core's signed file URL ([`sandcove::Sandbox::file_url`]): one path, one
//! operation, one user, an optional expiry, signed and served outside the sandbox by the
//! runtime (the embedded engine's monitor, or `sandcove serve`) through the file API. Nothing
//! runs or listens in the sandbox for it, so it works on any image, and the sandbox's own code
//! cannot answer the URL's holder. A download URL answers `GET` with the file's bytes; an
//! upload URL takes `POST` or `PUT` of a `multipart/form-data` body with one `file` part (as
//! E2B's docs upload) or of the raw bytes.

use std::future::IntoFuture;

use sandcove::FileUrlOptions;

use crate::call::BoxFuture;
use crate::errors::{Result, SandboxException};
use crate::gaps::refuse;
use crate::sandbox::Ctx;

/// Which way a URL transfers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Upload,
    Download,
}

/// The builder of `upload_url(...)` / `download_url(...)`; await it for the URL.
#[derive(Debug)]
#[must_use = "a call does nothing until awaited"]
pub struct FileUrlBuilder {
    ctx: Ctx,
    path: String,
    user: Option<String>,
    expiration: Option<i64>,
    direction: Direction,
}

impl FileUrlBuilder {
    pub(crate) fn upload(ctx: Ctx, path: String) -> Self {
        FileUrlBuilder {
            ctx,
            path,
            user: None,
            expiration: None,
            direction: Direction::Upload,
        }
    }

    pub(crate) fn download(ctx: Ctx, path: String) -> Self {
        FileUrlBuilder {
            direction: Direction::Download,
            ..FileUrlBuilder::upload(ctx, path)
        }
    }

    /// `user=`: the default user only (another user is refused).
    pub fn user(mut self, user: impl crate::OptionalString) -> Self {
        self.user = user.into_optional();
        self
    }

    /// `use_signature_expiration=`: the URL stops working this many seconds from now.
    pub fn use_signature_expiration(mut self, seconds: impl Into<Option<i64>>) -> Self {
        self.expiration = seconds.into();
        self
    }

    async fn run(self) -> Result<String> {
        let ctx = self.ctx;
        if ctx.runtime_user(self.user.as_deref()).is_some() {
            return Err(refuse("file_user"));
        }
        let expires_at = match self.expiration {
            Some(s) if s <= 0 => {
                return Err(SandboxException::invalid_argument(
                    "use_signature_expiration must be a positive number of seconds",
                ))
            }
            Some(s) => Some(sandcove::now_millis().saturating_add((s as u64).saturating_mul(1000))),
            None => None,
        };
        if self.path.is_empty() {
            // E2B's upload URL without a path writes each part to its file name; a signed
            // URL here is for one path, named when it is made.
            let call = match self.direction {
                Direction::Upload => "upload_url",
                Direction::Download => "download_url",
            };
            return Err(SandboxException::invalid_argument(format!(
                "{call} needs a path: a signed URL is for one file"
            )));
        }
        let path = ctx.path(&self.path);
        let mut options = match self.direction {
            Direction::Upload => FileUrlOptions::write(path),
            Direction::Download => FileUrlOptions::read(path),
        };
        if let Some(at) = expires_at {
            options = options.expires_at(at);
        }
        Ok(ctx.core.file_url(options).await?.url)
    }
}

impl IntoFuture for FileUrlBuilder {
    type Output = Result<String>;
    type IntoFuture = BoxFuture<'static, String>;
    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.run())
    }
}
