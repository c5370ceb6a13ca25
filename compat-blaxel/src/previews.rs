//! `sandbox.previews` (Python `SandboxPreviews`): a named preview is a port of the sandbox
//! exposed on this machine as a URL; private ones need a token, sent in the header
//! `X-Blaxel-Preview-Token` or the query parameter `bl_preview_token`.

use std::time::SystemTime;

use serde_json::Value;

use crate::errors::{Result, SandboxAPIError};
use crate::models::{self, Preview, PreviewMetadata, PreviewSpec};
use crate::sandbox::Ctx;
use crate::state::{self, PreviewRecords, PREVIEW_KEY_PREFIX};
use crate::{gaps, translate};

/// Header carrying a preview token.
pub const TOKEN_HEADER: &str = "X-Blaxel-Preview-Token";
/// Query parameter carrying a preview token.
pub const TOKEN_QUERY: &str = "bl_preview_token";

/// `sandbox.previews`.
#[derive(Debug, Clone)]
pub struct SandboxPreviews {
    ctx: Ctx,
}

/// Anything `previews.create` accepts: a [`Preview`] or a `json!` dict with `metadata` and
/// `spec`.
pub trait IntoPreview {
    /// The preview, or a `ValueError`.
    fn into_preview(self) -> Result<Preview>;
}
impl IntoPreview for Preview {
    fn into_preview(self) -> Result<Preview> {
        Ok(self)
    }
}
impl IntoPreview for Value {
    fn into_preview(self) -> Result<Preview> {
        models::from_value(self, "Preview")
    }
}

/// A preview (Python `SandboxPreview`).
#[derive(Debug, Clone)]
pub struct SandboxPreview {
    /// The preview name.
    pub name: String,
    /// `preview.metadata`.
    pub metadata: PreviewMetadata,
    /// `preview.spec`; `spec.url` is the URL.
    pub spec: PreviewSpec,
    /// The model.
    pub preview: Preview,
    /// Tokens of a private preview.
    pub tokens: SandboxPreviewTokens,
}

/// `preview.tokens` (Python `SandboxPreviewTokens`).
#[derive(Debug, Clone)]
pub struct SandboxPreviewTokens {
    /// The preview name.
    pub preview_name: String,
    /// The sandbox name.
    pub resource_name: String,
    ctx: Ctx,
    port: u16,
}

/// A token (Python `SandboxPreviewToken`).
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxPreviewToken {
    /// The token's name: what `tokens.delete` takes.
    pub name: String,
    /// The secret to send.
    pub value: String,
    /// Expiry as the server words it (RFC 3339).
    pub expires_at: String,
    /// Whether it has expired.
    pub expired: bool,
}

/// Most tokens one preview holds at once (expired ones are dropped when another is made).
pub const MAX_TOKENS_PER_PREVIEW: usize = 100;

/// When a token expires: a `SystemTime` (Python `datetime`) or an ISO-8601 string.
pub trait IntoExpiry {
    /// Ms since the epoch, or a `ValueError`.
    fn into_expiry(self) -> Result<u64>;
}
impl IntoExpiry for SystemTime {
    fn into_expiry(self) -> Result<u64> {
        self.duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .map_err(|_| SandboxAPIError::value_error("expires_at is before 1970"))
    }
}
impl IntoExpiry for &str {
    fn into_expiry(self) -> Result<u64> {
        translate::parse_iso8601(self)
            .ok_or_else(|| SandboxAPIError::value_error(format!("invalid date {self:?}")))
    }
}

fn unexpected(e: sandcove::Error) -> SandboxAPIError {
    SandboxAPIError::from(e).into_unexpected_status()
}

/// The refusal of a token past [`MAX_TOKENS_PER_PREVIEW`] on preview `preview`.
fn too_many_tokens(preview: &str) -> SandboxAPIError {
    SandboxAPIError::UnexpectedStatus {
        status_code: 400,
        content: format!(
            r#"{{"error": "preview {preview} already has {MAX_TOKENS_PER_PREVIEW} live tokens: delete some first"}}"#
        ),
        source: None,
    }
}

fn missing(name: &str) -> SandboxAPIError {
    SandboxAPIError::UnexpectedStatus {
        status_code: 404,
        content: format!(r#"{{"error": "preview {name} not found"}}"#),
        source: None,
    }
}

impl SandboxPreviewTokens {
    /// `tokens.create(expires_at)`: a token valid until `expires_at`, with a generated name.
    pub async fn create(&self, expires_at: impl IntoExpiry) -> Result<SandboxPreviewToken> {
        self.create_named("", expires_at).await
    }

    /// `tokens.create` with the name the TypeScript SDK sends (`token-<ms>`); an empty name
    /// gets a generated one (the Python SDK sends `""`).
    pub async fn create_named(
        &self,
        name: &str,
        expires_at: impl IntoExpiry,
    ) -> Result<SandboxPreviewToken> {
        let at = expires_at.into_expiry()?;
        let name = if name.is_empty() {
            format!(
                "token-{}-{}",
                sandcove::now_millis(),
                state::random_suffix(6)
            )
        } else {
            name.to_string()
        };
        if !translate::valid_name(&name) {
            return Err(SandboxAPIError::UnexpectedStatus {
                status_code: 400,
                content: format!(
                    r#"{{"error": "invalid token name {name:?}: lowercase letters, digits and -, at most 49"}}"#
                ),
                source: None,
            });
        }
        let now = sandcove::now_millis();
        let records = self.records().await?;
        let key = state::token_key(&self.preview_name, &name);
        if records.iter().any(|r| r.name == name) {
            return Err(SandboxAPIError::UnexpectedStatus {
                status_code: 409,
                content: r#"{"error": "Resource already exists"}"#.into(),
                source: None,
            });
        }
        // Expired tokens no longer open anything: their records make room.
        let expired: Vec<String> = records
            .iter()
            .filter(|r| r.expires_at <= now)
            .map(|r| state::token_key(&self.preview_name, &r.name))
            .collect();
        if records.len() - expired.len() >= MAX_TOKENS_PER_PREVIEW {
            return Err(too_many_tokens(&self.preview_name));
        }
        let token = self
            .ctx
            .core
            .create_preview_token(self.port, Some(at))
            .await
            .map_err(unexpected)?;
        let record = state::TokenRecord {
            name: name.clone(),
            value: token.value,
            expires_at: token.expires_at.unwrap_or(at),
        };
        let mut update = sandcove::AnnotationUpdate::set(&key, state::encode(&key, &record)?)
            .expecting(&key, None);
        update.remove = expired;
        if let Err(e) = state::update_annotations(&self.ctx.core, update).await {
            // Unrecorded, the token could never be listed or deleted: take it back.
            let _ = self
                .ctx
                .core
                .revoke_preview_token(self.port, &record.value)
                .await;
            return Err(match e {
                sandcove::Error::Conflict { .. } => SandboxAPIError::UnexpectedStatus {
                    status_code: 409,
                    content: r#"{"error": "Resource already exists"}"#.into(),
                    source: None,
                },
                e => e.into(),
            });
        }
        // Concurrent creates each saw room before any recorded its token: count again now
        // that this one is recorded, and take it back if the preview went past the bound
        // (its value was never handed out).
        let live = self
            .records()
            .await?
            .iter()
            .filter(|r| r.expires_at > sandcove::now_millis())
            .count();
        if live > MAX_TOKENS_PER_PREVIEW {
            let _ = revoke(&self.ctx, self.port, &record).await;
            let _ =
                state::update_annotations(&self.ctx.core, sandcove::AnnotationUpdate::remove(key))
                    .await;
            return Err(too_many_tokens(&self.preview_name));
        }
        Ok(token_of(&record, now))
    }

    /// The token records of this preview.
    async fn records(&self) -> Result<Vec<state::TokenRecord>> {
        let info = self.ctx.core.info().await?;
        let prefix = format!("{}{}/", state::TOKEN_KEY_PREFIX, self.preview_name);
        Ok(
            state::annotations_under::<state::TokenRecord>(&info, &prefix)
                .into_values()
                .collect(),
        )
    }

    /// `tokens.list()`: this preview's tokens (expired ones too, until the next `create`
    /// drops them).
    pub async fn list(&self) -> Result<Vec<SandboxPreviewToken>> {
        let now = sandcove::now_millis();
        Ok(self
            .records()
            .await?
            .iter()
            .map(|r| token_of(r, now))
            .collect())
    }

    /// `tokens.delete(token_name)`: the token stops opening the preview at once; returns it.
    pub async fn delete(&self, token_name: &str) -> Result<SandboxPreviewToken> {
        let record = self
            .records()
            .await?
            .into_iter()
            .find(|r| r.name == token_name)
            .ok_or_else(|| SandboxAPIError::UnexpectedStatus {
                status_code: 404,
                content: format!(r#"{{"error": "preview token {token_name} not found"}}"#),
                source: None,
            })?;
        revoke(&self.ctx, self.port, &record).await?;
        let key = state::token_key(&self.preview_name, &record.name);
        state::update_annotations(&self.ctx.core, sandcove::AnnotationUpdate::remove(key)).await?;
        Ok(token_of(&record, sandcove::now_millis()))
    }
}

/// Revoke `record`'s token in the runtime; one the runtime no longer knows (it expired, or
/// its preview's URL closed) opens nothing already.
async fn revoke(ctx: &Ctx, port: u16, record: &state::TokenRecord) -> Result<()> {
    match ctx.core.revoke_preview_token(port, &record.value).await {
        Ok(()) => Ok(()),
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(unexpected(e)),
    }
}

fn token_of(record: &state::TokenRecord, now: u64) -> SandboxPreviewToken {
    SandboxPreviewToken {
        name: record.name.clone(),
        value: record.value.clone(),
        expires_at: translate::format_rfc3339(record.expires_at),
        expired: record.expires_at <= now,
    }
}

impl SandboxPreviews {
    pub(crate) fn new(ctx: Ctx) -> Self {
        SandboxPreviews { ctx }
    }

    async fn records(&self) -> Result<PreviewRecords> {
        let info = self.ctx.core.info().await?;
        Ok(state::annotations_under(&info, PREVIEW_KEY_PREFIX))
    }

    fn model(&self, mut preview: Preview, live: &sandcove::Preview) -> SandboxPreview {
        preview.metadata.resource_name = Some(self.ctx.name.clone());
        preview.metadata.resource_type = Some("sandbox".into());
        preview.spec.url = Some(live.url.clone());
        preview.spec.public = Some(live.public);
        SandboxPreview {
            name: preview.metadata.name.clone(),
            metadata: preview.metadata.clone(),
            spec: preview.spec.clone(),
            tokens: SandboxPreviewTokens {
                preview_name: preview.metadata.name.clone(),
                resource_name: self.ctx.name.clone(),
                ctx: self.ctx.clone(),
                port: live.port,
            },
            preview,
        }
    }

    /// `previews.create(preview)`: expose `spec.port` (public with `spec.public`).
    pub async fn create(&self, preview: impl IntoPreview) -> Result<SandboxPreview> {
        let preview = preview.into_preview()?;
        let s = &preview.spec;
        if s.prefix_url.is_some() || s.custom_domain.is_some() {
            return Err(gaps::refuse("preview prefix_url/custom_domain"));
        }
        if s.expires.is_some() || s.ttl.is_some() {
            return Err(gaps::refuse("preview expires/ttl"));
        }
        if !translate::valid_name(&preview.metadata.name) {
            return Err(SandboxAPIError::UnexpectedStatus {
                status_code: 400,
                content: format!(
                    r#"{{"error": "invalid preview name {:?}"}}"#,
                    preview.metadata.name
                ),
                source: None,
            });
        }
        let port = match s.port {
            Some(p) if (1..=65535).contains(&p) && p != 80 => p as u16,
            other => {
                return Err(SandboxAPIError::UnexpectedStatus {
                    status_code: 400,
                    content: format!(r#"{{"error": "invalid preview port {other:?}"}}"#),
                    source: None,
                })
            }
        };
        let records = self.records().await?;
        if records.contains_key(&preview.metadata.name) {
            return Err(SandboxAPIError::UnexpectedStatus {
                status_code: 409,
                content: r#"{"error": "Resource already exists"}"#.into(),
                source: None,
            });
        }
        let public = s.public.unwrap_or(false);
        // The runtime has one preview per port: named previews of one port share it, so
        // they must agree on visibility.
        let sharing = records
            .values()
            .find(|p| p.spec.port == Some(i64::from(port)))
            .cloned();
        let request_headers = s.request_headers.clone().unwrap_or_default();
        let response_headers = s.response_headers.clone().unwrap_or_default();
        let live = match sharing {
            Some(other) if other.spec.public.unwrap_or(false) != public => {
                return Err(gaps::refuse("public and private previews of the same port"))
            }
            Some(other)
                if other.spec.request_headers.clone().unwrap_or_default() != request_headers
                    || other.spec.response_headers.clone().unwrap_or_default()
                        != response_headers =>
            {
                return Err(gaps::refuse("previews of the same port with other headers"))
            }
            Some(other) => self.live(&other).await?,
            None => {
                let mut options = sandcove::PreviewOptions::new(port)
                    .public(public)
                    .token_header(TOKEN_HEADER)
                    .token_query(TOKEN_QUERY);
                // Set by the preview proxy on every request it forwards to the port and on
                // every answer (CORS headers, say), as Blaxel's preview gateway does.
                options.request_headers = request_headers;
                options.response_headers = response_headers;
                self.ctx
                    .core
                    .expose_port(options)
                    .await
                    .map_err(|e| match e {
                        e @ sandcove::Error::InvalidArgument { .. } => {
                            SandboxAPIError::UnexpectedStatus {
                                status_code: 400,
                                content: serde_json::json!({ "error": e.to_string() }).to_string(),
                                source: Some(Box::new(e)),
                            }
                        }
                        e => unexpected(e),
                    })?
            }
        };
        // One annotation per name, set only if still absent: two programs creating one name
        // at once cannot both win.
        let key = state::preview_key(&preview.metadata.name);
        let update = sandcove::AnnotationUpdate::set(&key, state::encode(&key, &preview)?)
            .expecting(&key, None);
        match state::update_annotations(&self.ctx.core, update).await {
            Ok(_) => {}
            Err(sandcove::Error::Conflict { .. }) => {
                return Err(SandboxAPIError::UnexpectedStatus {
                    status_code: 409,
                    content: r#"{"error": "Resource already exists"}"#.into(),
                    source: None,
                })
            }
            Err(e) => return Err(e.into()),
        }
        Ok(self.model(preview, &live))
    }

    /// `previews.create_if_not_exists(preview)`: the preview of that name, or a new one.
    pub async fn create_if_not_exists(&self, preview: impl IntoPreview) -> Result<SandboxPreview> {
        let preview = preview.into_preview()?;
        match self.get(&preview.metadata.name).await {
            Ok(p) => Ok(p),
            Err(e) if e.is_not_found() => self.create(preview).await,
            Err(e) => Err(e),
        }
    }

    /// `previews.get(preview_name)`.
    pub async fn get(&self, preview_name: &str) -> Result<SandboxPreview> {
        let records = self.records().await?;
        let preview = records
            .get(preview_name)
            .cloned()
            .ok_or_else(|| missing(preview_name))?;
        let live = self.live(&preview).await?;
        Ok(self.model(preview, &live))
    }

    async fn live(&self, preview: &Preview) -> Result<sandcove::Preview> {
        let port = preview.spec.port.unwrap_or_default();
        self.ctx
            .core
            .previews()
            .await
            .map_err(unexpected)?
            .into_iter()
            .find(|p| i64::from(p.port) == port)
            .ok_or_else(|| missing(&preview.metadata.name))
    }

    /// `previews.list()`.
    pub async fn list(&self) -> Result<Vec<SandboxPreview>> {
        let records = self.records().await?;
        let live = self.ctx.core.previews().await.map_err(unexpected)?;
        Ok(records
            .into_values()
            .filter_map(|p| {
                let l = live
                    .iter()
                    .find(|l| Some(i64::from(l.port)) == p.spec.port)?;
                Some(self.model(p, l))
            })
            .collect())
    }

    /// `previews.delete(preview_name)`: closes the URL (unless another named preview of the
    /// same port still uses it); returns the deleted preview.
    pub async fn delete(&self, preview_name: &str) -> Result<Preview> {
        let mut records = self.records().await?;
        let preview = records
            .remove(preview_name)
            .ok_or_else(|| missing(preview_name))?;
        let port = preview.spec.port.unwrap_or_default() as u16;
        let shared = records
            .values()
            .any(|p| p.spec.port == Some(i64::from(port)));
        // Its tokens go with it (the runtime's tokens belong to the port, which another
        // named preview may still use).
        let info = self.ctx.core.info().await?;
        let prefix = format!("{}{preview_name}/", state::TOKEN_KEY_PREFIX);
        let tokens = state::annotations_under::<state::TokenRecord>(&info, &prefix);
        if shared {
            for record in tokens.values() {
                revoke(&self.ctx, port, record).await?;
            }
        } else {
            match self.ctx.core.close_preview(port).await {
                Ok(()) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(unexpected(e)),
            }
        }
        let mut update = sandcove::AnnotationUpdate::remove(state::preview_key(preview_name));
        update
            .remove
            .extend(tokens.keys().map(|t| state::token_key(preview_name, t)));
        state::update_annotations(&self.ctx.core, update).await?;
        Ok(preview)
    }
}
