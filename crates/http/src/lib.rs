//! [`HttpBackend`]: the [`Backend`](sandcove_core::Backend) trait over HTTP, talking to a
//! `sandcove serve` (crate `sandcove-server`). The wire contract both sides speak is
//! [`sandcove_core::wire`]; it is re-exported here.
//!
//! # Retries and timeouts
//!
//! Connection failures and `429` (honouring `Retry-After`) are retried for every call whose
//! body can be replayed; `5xx` answers and other transport failures only for idempotent calls
//! (`GET`, `PUT`, `DELETE`, and creates, which carry an [`IDEMPOTENCY_HEADER`] the server
//! remembers so a retried create never makes a second sandbox). Every call with a remote
//! effect (creates, forks, snapshots, volumes, preview tokens, destroys and deletes, process
//! starts, file writes and uploads, mkdir, remove, rename, copy, chmod) carries its
//! [`OperationId`](sandcove_core::OperationId) in that header; when such a request
//! was sent and its answer lost (a broken connection, a timeout waiting for the answer) the
//! call fails with [`Error::OutcomeUnknown`] naming it, and `GET /v1/operations/{op}` (what
//! [`Backend::observe`](sandcove_core::Backend::observe) asks) says what became of it. Control
//! calls have a total timeout; streaming calls time out only while waiting for the response
//! head, never while the stream runs.

#![forbid(unsafe_code)]

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use reqwest::Url;

use sandcove_core::{Capabilities, Error, Result};

/// The wire contract, shared with the server.
pub use sandcove_core::wire::*;

mod backend_impl;
mod certificate;
mod streams;
mod transport;

pub use self::certificate::CertificateProblem;
use self::transport::fetch_capabilities;

/// Timeouts and retry policy of an [`HttpBackend`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct HttpOptions {
    /// Total time for a control call, and the time to wait for the response head of a
    /// streaming call (never applied to the stream itself).
    pub request_timeout: Duration,
    /// Time to establish a connection.
    pub connect_timeout: Duration,
    /// Retries after the first attempt (see the module docs for which failures qualify).
    pub max_retries: u32,
    /// First backoff; doubled per retry up to [`HttpOptions::max_backoff`].
    pub backoff: Duration,
    /// Longest wait between attempts, `Retry-After` included.
    pub max_backoff: Duration,
}

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions {
            request_timeout: Duration::from_secs(120),
            connect_timeout: Duration::from_secs(10),
            max_retries: 4,
            backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(30),
        }
    }
}

/// A [`Backend`](sandcove_core::Backend) served by a remote `sandcove serve`. Cheap to clone.
#[derive(Clone)]
pub struct HttpBackend {
    base: Url,
    api_key: Arc<str>,
    http: reqwest::Client,
    options: HttpOptions,
    caps: Arc<OnceLock<Capabilities>>,
}

/// Env var naming a PEM file of the certificates that alone are trusted to sign the
/// server's certificate: the `ca.pem` `sandcove tls init` makes, another private CA, or the
/// server's own self-signed certificate when that is not a CA certificate (`CA:FALSE`).
/// A certificate the client refuses fails the call with [`CertificateProblem`]'s one line
/// and remedy, never retried.
pub const CA_FILE_ENV: &str = "SANDCOVE_CA_FILE";
/// Env var that, set to `1`, allows plain `http://` to a non-loopback server.
pub const ALLOW_INSECURE_HTTP_ENV: &str = "SANDCOVE_ALLOW_INSECURE_HTTP";
/// Largest CA file read.
const MAX_CA_FILE_BYTES: u64 = 1024 * 1024;

/// Whether `url` names this host's loopback.
fn is_loopback(url: &Url) -> bool {
    let Some(host) = url.host_str() else {
        return false;
    };
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    match bare.parse::<std::net::IpAddr>() {
        Ok(ip) => ip.is_loopback(),
        Err(_) => host.eq_ignore_ascii_case("localhost"),
    }
}

/// The PEM certificates in `path` (bounded read; at least one).
fn load_ca_file(path: &std::path::Path) -> Result<Vec<reqwest::Certificate>> {
    use std::io::Read;
    let what = format!("{CA_FILE_ENV} {}", path.display());
    let file = std::fs::File::open(path).map_err(|e| Error::from_io(&e, &what))?;
    let mut pem = Vec::new();
    file.take(MAX_CA_FILE_BYTES + 1)
        .read_to_end(&mut pem)
        .map_err(|e| Error::from_io(&e, &what))?;
    if pem.len() as u64 > MAX_CA_FILE_BYTES {
        return Err(Error::invalid(format!(
            "{what}: larger than {MAX_CA_FILE_BYTES} bytes"
        )));
    }
    let certs = reqwest::Certificate::from_pem_bundle(&pem)
        .map_err(|e| Error::invalid(format!("{what}: {e}")))?;
    if certs.is_empty() {
        return Err(Error::invalid(format!("{what}: no PEM certificate")));
    }
    Ok(certs)
}

/// The HTTP client: rustls, with only `roots` trusted when given.
fn client(
    options: &HttpOptions,
    roots: Option<&Vec<reqwest::Certificate>>,
) -> Result<reqwest::Client> {
    let mut builder = reqwest::Client::builder()
        .use_rustls_tls()
        .connect_timeout(options.connect_timeout);
    if let Some(roots) = roots {
        builder = builder.tls_built_in_root_certs(false);
        for cert in roots {
            builder = builder.add_root_certificate(cert.clone());
        }
    }
    builder
        .build()
        .map_err(|e| Error::backend(format!("HTTP client: {e}")))
}

impl std::fmt::Debug for HttpBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The API key is deliberately left out.
        f.debug_struct("HttpBackend")
            .field("url", &self.base.as_str())
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl HttpBackend {
    /// A backend for the server at `url` (e.g. `http://127.0.0.1:8730`) with default
    /// [`HttpOptions`]. Nothing is sent yet;
    /// [`Backend::capabilities`](sandcove_core::Backend::capabilities) fetches the server's
    /// capabilities on first use (see [`HttpBackend::connect`] to fetch them up front).
    pub fn new(url: &str, api_key: &str) -> Result<Self> {
        Self::with_options(url, api_key, HttpOptions::default())
    }

    /// Like [`HttpBackend::new`] with explicit timeouts and retry policy.
    ///
    /// An `http://` URL must name a loopback host (`127.0.0.0/8`, `::1`, `localhost`): the
    /// API key would otherwise cross the network in clear text. Anything else needs
    /// `https://`, or [`ALLOW_INSECURE_HTTP_ENV`]`=1` to accept the risk. Over https the
    /// server is verified against the system's roots (`SSL_CERT_FILE` and `SSL_CERT_DIR`
    /// are honoured), or only against the PEM certificates in [`CA_FILE_ENV`] when set.
    pub fn with_options(url: &str, api_key: &str, options: HttpOptions) -> Result<Self> {
        let base =
            Url::parse(url).map_err(|e| Error::invalid(format!("server URL {url:?}: {e}")))?;
        if base.cannot_be_a_base() || base.host().is_none() {
            return Err(Error::invalid(format!("server URL {url:?} has no host")));
        }
        match base.scheme() {
            "https" => {}
            "http" if is_loopback(&base) => {}
            "http" if std::env::var(ALLOW_INSECURE_HTTP_ENV).is_ok_and(|v| v == "1") => {}
            "http" => {
                return Err(Error::invalid(format!(
                    "server URL {url:?}: plain http beyond loopback would send the API key in \
                     clear text; serve TLS (`sandcove serve --tls-cert FILE --tls-key FILE`) and \
                     use https://, or set {ALLOW_INSECURE_HTTP_ENV}=1 to accept the risk"
                )))
            }
            other => {
                return Err(Error::invalid(format!(
                    "server URL {url:?}: scheme {other:?} is not http or https"
                )))
            }
        }
        let roots = match std::env::var_os(CA_FILE_ENV) {
            Some(path) => Some(load_ca_file(std::path::Path::new(&path))?),
            None => None,
        };
        let http = client(&options, roots.as_ref())?;
        Ok(HttpBackend {
            base,
            api_key: api_key.into(),
            http,
            options,
            caps: Arc::new(OnceLock::new()),
        })
    }

    /// Connect to the server at `url`: checks the key and caches the server's capabilities.
    pub async fn connect(url: &str, api_key: &str) -> Result<Self> {
        let backend = Self::new(url, api_key)?;
        backend.refresh_capabilities().await?;
        Ok(backend)
    }

    /// The server's base URL.
    pub fn url(&self) -> &str {
        self.base.as_str()
    }

    /// Fetch the server's capabilities (and cache them if none are cached yet).
    pub async fn refresh_capabilities(&self) -> Result<Capabilities> {
        let caps = fetch_capabilities(self, &self.http).await?;
        let _ = self.caps.set(caps.clone());
        Ok(caps)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_types_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<HttpBackend>();
        check::<HttpOptions>();
    }
}
