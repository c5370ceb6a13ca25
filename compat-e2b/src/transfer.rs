//! `upload_url` / `download_url`: URLs that upload or download a file with a plain HTTP
//! request, like E2B's pre-signed envd `/files` URLs.
//!
//! A small file server (`files_server.py`) runs in the sandbox on its loopback port 49983
//! (envd's port), tagged so every program finds the same one; a private preview of that port
//! carries the access token as the `signature` query parameter, so the URL itself is the
//! credential. `use_signature_expiration` issues a separate token that expires.

use std::future::IntoFuture;

use futures::StreamExt;
use sandcove::{Command, PreviewOptions, ProcessEvent, ProcessSpec};

use crate::call::BoxFuture;
use crate::errors::{Result, SandboxException};
use crate::gaps::refuse;
use crate::sandbox::Ctx;
use crate::translate;

/// envd's port, where the file server listens inside the sandbox.
pub const ENVD_PORT: u16 = 49983;
const SERVER_SOURCE: &str = include_str!("files_server.py");
const SERVER_PATH: &str = "/tmp/.e2b-files-server.py";
const SERVER_TAG: &str = "e2b-files-server";

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
        if let Some(s) = self.expiration {
            if s <= 0 {
                return Err(SandboxException::invalid_argument(
                    "use_signature_expiration must be a positive number of seconds",
                ));
            }
        }
        if self.direction == Direction::Download && self.path.is_empty() {
            return Err(SandboxException::invalid_argument(
                "download_url needs a path",
            ));
        }
        ensure_server(&ctx).await?;
        let preview = match ctx
            .core
            .previews()
            .await?
            .into_iter()
            .find(|p| p.port == ENVD_PORT && !p.public)
        {
            Some(p) => p,
            None => {
                ctx.core
                    .expose_port(
                        PreviewOptions::new(ENVD_PORT)
                            .public(false)
                            .token_header("e2b-signature")
                            .token_query("signature"),
                    )
                    .await?
            }
        };
        let (token, expires) = match self.expiration {
            Some(secs) => {
                let at = sandcove::now_millis() + secs as u64 * 1000;
                let t = ctx.core.create_preview_token(ENVD_PORT, Some(at)).await?;
                (t.value, Some(at / 1000))
            }
            None => (
                preview
                    .token
                    .map(|t| t.value)
                    .ok_or_else(|| SandboxException::sandbox("the file preview has no token"))?,
                None,
            ),
        };
        let mut url = format!("{}/files?", preview.url.trim_end_matches('/'));
        if !self.path.is_empty() {
            let user = ctx.runtime_user(self.user.as_deref());
            let path = ctx.path_as(&self.path, user.as_deref());
            url.push_str(&format!("path={}&", percent_encode(&path)));
        }
        url.push_str(&format!(
            "username={}&signature={}",
            percent_encode(self.user.as_deref().unwrap_or(translate::E2B_USER)),
            percent_encode(&token)
        ));
        if let Some(at) = expires {
            url.push_str(&format!("&signature_expiration={at}"));
        }
        Ok(url)
    }
}

impl IntoFuture for FileUrlBuilder {
    type Output = Result<String>;
    type IntoFuture = BoxFuture<'static, String>;
    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.run())
    }
}

/// Start the file server unless it runs; return once it listens.
async fn ensure_server(ctx: &Ctx) -> Result<()> {
    let running = ctx
        .core
        .processes()
        .await?
        .into_iter()
        .any(|p| p.exit.is_none() && p.tag.as_deref() == Some(SERVER_TAG));
    if running {
        return Ok(());
    }
    let data: sandcove::ByteStream = Box::pin(futures::stream::once(async {
        Ok(SERVER_SOURCE.as_bytes().to_vec())
    }));
    ctx.core
        .write_stream(SERVER_PATH, data, sandcove::WriteOptions::default())
        .await?;
    let spec = ProcessSpec::new(Command::argv([
        "python3".to_string(),
        "-u".to_string(),
        SERVER_PATH.to_string(),
        ENVD_PORT.to_string(),
    ]))
    .tag(SERVER_TAG);
    let mut stream = match ctx.core.spawn(spec).await {
        Ok(handle) => handle.into_stream(),
        // Another program started it at the same moment.
        Err(sandcove::Error::AlreadyExists { .. }) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let mut out = Vec::new();
    while let Some(ev) = stream.events.next().await {
        match ev? {
            ProcessEvent::Stdout(b) => {
                out.extend(b);
                if out.windows(5).any(|w| w == b"ready") {
                    return Ok(());
                }
            }
            ProcessEvent::Exit(_) => break,
            _ => {}
        }
    }
    Err(SandboxException::sandbox(
        "the sandbox's file server did not start (python3 is needed)",
    ))
}

/// RFC 3986 percent-encoding of a query value (unreserved characters and `/` kept).
pub fn percent_encode(s: &str) -> String {
    const KEEP: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'.')
        .remove(b'_')
        .remove(b'~')
        .remove(b'/');
    percent_encoding::utf8_percent_encode(s, KEEP).to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(
            super::percent_encode("/home/user/a b&c"),
            "/home/user/a%20b%26c"
        );
        assert_eq!(super::percent_encode("ü"), "%C3%BC");
    }
}
