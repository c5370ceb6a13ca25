//! The awaitable builder shared by calls whose only keywords are the connection options.

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::OnceLock;

use crate::errors::{Result, SandboxException};

/// A boxed future of a facade result.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T>> + Send + 'a>>;

/// A number of seconds, as Python accepts it (`int` or `float`; `None` where allowed): the
/// facades' shared `Seconds`.
pub use sandcove_compat_support::Seconds as IntoSeconds;

/// A string keyword Python also accepts as `None` (MIRRORING.md rule 3), shared by the facades.
pub use sandcove_compat_support::OptionalString;

/// A call awaited directly (`IntoFuture`), with E2B's connection keywords as setters.
///
/// Nothing runs until it is awaited.
#[must_use = "a call does nothing until awaited"]
pub struct Call<T> {
    fut: BoxFuture<'static, T>,
    request_timeout: Option<f64>,
}

impl<T> std::fmt::Debug for Call<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Call")
            .field("request_timeout", &self.request_timeout)
            .finish_non_exhaustive()
    }
}

impl<T: Send + 'static> Call<T> {
    pub(crate) fn new(fut: impl Future<Output = Result<T>> + Send + 'static) -> Self {
        Call {
            fut: Box::pin(fut),
            request_timeout: None,
        }
    }

    /// `request_timeout=`: bound the whole call (seconds; `0` or `None` = no bound). Expiry
    /// raises `TimeoutException`.
    pub fn request_timeout(mut self, secs: impl IntoSeconds) -> Self {
        self.request_timeout = secs.into_seconds();
        self
    }

    /// `api_key=`: accepted so ported code compiles, and ignored: vendor credentials are
    /// never sent anywhere.
    pub fn api_key(self, _api_key: impl Into<String>) -> Self {
        self
    }
}

impl<T: Send + 'static> IntoFuture for Call<T> {
    type Output = Result<T>;
    type IntoFuture = BoxFuture<'static, T>;

    fn into_future(self) -> Self::IntoFuture {
        with_request_timeout(self.fut, self.request_timeout)
    }
}

/// Bound a future by `request_timeout` seconds (`None`/`0` = unbounded).
pub(crate) fn with_request_timeout<'a, T: Send + 'a>(
    fut: BoxFuture<'a, T>,
    request_timeout: Option<f64>,
) -> BoxFuture<'a, T> {
    match crate::translate::timeout_secs(request_timeout) {
        None => fut,
        Some(limit) => Box::pin(async move {
            tokio::time::timeout(limit, fut).await.unwrap_or_else(|_| {
                Err(SandboxException::timeout(
                    "Request timed out — the 'request_timeout' option can be used to increase this timeout",
                ))
            })
        }),
    }
}

/// The runtime client the environment selects (`sandcove::Client::from_env()`), made once
/// per program.
pub(crate) fn client() -> Result<sandcove::Client> {
    static CLIENT: OnceLock<sandcove::Client> = OnceLock::new();
    if let Some(c) = CLIENT.get() {
        return Ok(c.clone());
    }
    let made = sandcove::Client::from_env()?;
    Ok(CLIENT.get_or_init(|| made).clone())
}
