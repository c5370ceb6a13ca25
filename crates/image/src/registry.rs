//! A small client of the distribution API: manifests and blobs, token auth, mirrors, the
//! plain-HTTP rule, and downloads that are bounded, checked while streaming, resumed after a
//! cut and refused when they stall.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use base64::Engine as _;
use futures::StreamExt;
use serde::Deserialize;
use tokio::io::AsyncWriteExt;

use crate::digest::{Digest, Hasher};
use crate::error::{ImageError, Result};
use crate::manifest::{Descriptor, MAX_DOCUMENT_BYTES};
use crate::reference::{Reference, DOCKER_HUB};

/// A user name and password (or token) for one registry.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential {
    /// The user name.
    pub username: String,
    /// The password or access token.
    pub password: String,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// Registry mirrors, hosts allowed over plain HTTP, and credentials.
#[derive(Clone, Debug)]
pub struct RegistryConfig {
    /// Registry name (`docker.io`, `ghcr.io`, `host:port`) → endpoints tried first, in order
    /// (`host[:port]` or `http(s)://host[:port]`).
    pub mirrors: BTreeMap<String, Vec<String>>,
    /// Hosts (`host` or `host:port`) that may be reached over plain HTTP besides loopback
    /// addresses.
    pub insecure: Vec<String>,
    /// Registry name (or mirror host) → credential.
    pub credentials: BTreeMap<String, Credential>,
    /// How long a download may go without a byte before it is refused (default 30 s).
    pub stall_timeout: Duration,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        RegistryConfig {
            mirrors: BTreeMap::new(),
            insecure: Vec::new(),
            credentials: BTreeMap::new(),
            stall_timeout: Duration::from_secs(30),
        }
    }
}

#[derive(Deserialize, Default)]
struct ConfigFile {
    #[serde(default)]
    mirrors: BTreeMap<String, Vec<String>>,
    #[serde(default)]
    insecure: Vec<String>,
}

#[derive(Deserialize, Default)]
struct DockerConfig {
    #[serde(default)]
    auths: BTreeMap<String, DockerAuth>,
}

#[derive(Deserialize, Default)]
struct DockerAuth {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
}

impl RegistryConfig {
    /// The configuration the environment gives: the file `SANDCOVE_REGISTRIES` names,
    /// credentials from the Docker config file, then `SANDCOVE_REGISTRY_AUTH` (see the crate
    /// docs for the formats).
    pub fn from_env() -> Result<RegistryConfig> {
        let mut config = match std::env::var_os("SANDCOVE_REGISTRIES") {
            Some(path) if !path.is_empty() => RegistryConfig::from_file(Path::new(&path))?,
            _ => RegistryConfig::default(),
        };
        let docker_config = std::env::var_os("DOCKER_CONFIG")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".docker")))
            .map(|dir| dir.join("config.json"));
        if let Some(path) = docker_config {
            if let Ok(bytes) = std::fs::read(&path) {
                config.add_docker_auths(&bytes, &path.display().to_string())?;
            }
        }
        if let Some(json) = std::env::var_os("SANDCOVE_REGISTRY_AUTH") {
            config.add_docker_auths(json.to_string_lossy().as_bytes(), "SANDCOVE_REGISTRY_AUTH")?;
        }
        Ok(config)
    }

    /// Mirrors and insecure hosts from a JSON file (`{"mirrors": {…}, "insecure": […]}`).
    pub fn from_file(path: &Path) -> Result<RegistryConfig> {
        let bytes = std::fs::read(path)
            .map_err(|e| ImageError::io(format!("reading {}", path.display()), e))?;
        let file: ConfigFile = serde_json::from_slice(&bytes).map_err(|e| {
            ImageError::malformed(
                format!("registry configuration {}", path.display()),
                e.to_string(),
            )
        })?;
        Ok(RegistryConfig {
            mirrors: file.mirrors,
            insecure: file.insecure,
            ..RegistryConfig::default()
        })
    }

    /// Adds the `auths` of a Docker config file's JSON; later entries win.
    pub fn add_docker_auths(&mut self, json: &[u8], source: &str) -> Result<()> {
        let parsed: DockerConfig = serde_json::from_slice(json).map_err(|e| {
            ImageError::malformed(format!("credentials in {source}"), e.to_string())
        })?;
        for (key, auth) in parsed.auths {
            let credential = match (auth.auth, auth.username, auth.password) {
                (Some(encoded), _, _) if !encoded.is_empty() => {
                    let decoded = base64::engine::general_purpose::STANDARD
                        .decode(encoded.trim())
                        .ok()
                        .and_then(|b| String::from_utf8(b).ok())
                        .and_then(|s| {
                            s.split_once(':')
                                .map(|(u, p)| (u.to_string(), p.to_string()))
                        });
                    let Some((username, password)) = decoded else {
                        return Err(ImageError::malformed(
                            format!("credentials in {source}"),
                            format!("`auth` of {key} is not base64 user:password"),
                        ));
                    };
                    Credential { username, password }
                }
                (_, Some(username), Some(password)) => Credential { username, password },
                _ => continue,
            };
            self.credentials.insert(registry_key(&key), credential);
        }
        Ok(())
    }

    fn plain_http_allowed(&self, host: &str) -> bool {
        is_loopback(host)
            || self
                .insecure
                .iter()
                .any(|h| h == host || h == host_only(host))
    }
}

/// A Docker config `auths` key (`https://index.docker.io/v1/`, `ghcr.io`, …) as a registry name.
fn registry_key(key: &str) -> String {
    let host = key
        .trim_start_matches("https://")
        .trim_start_matches("http://");
    let host = host.split('/').next().unwrap_or(host);
    match host {
        "index.docker.io" | "registry-1.docker.io" | "docker.io" => DOCKER_HUB.to_string(),
        other => other.to_string(),
    }
}

/// Why a registry's redirect to `to` is not followed, if it is not: past 10 redirects; to
/// plain HTTP unless the chain began over plain HTTP and `to`'s host may be reached so; to an
/// address literal that is unspecified, link-local or private, or loopback unless the chain
/// began on loopback.
fn redirect_refusal(
    rules: &RegistryConfig,
    to: &reqwest::Url,
    first: Option<&reqwest::Url>,
    followed: usize,
) -> Option<String> {
    if followed >= 10 {
        return Some("more than 10 redirects".into());
    }
    let host = to.host_str().unwrap_or("");
    let authority = match to.port() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_string(),
    };
    let began_plain = first.is_some_and(|u| u.scheme() == "http");
    let began_on_loopback = first.and_then(|u| u.host_str()).is_some_and(is_loopback);
    match to.scheme() {
        "https" => {}
        "http"
            if began_plain
                && (rules.plain_http_allowed(&authority) || rules.plain_http_allowed(host)) => {}
        _ => return Some(format!("a redirect to {to} is refused (plain HTTP)")),
    }
    let literal = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = literal.parse::<std::net::IpAddr>() {
        let private = match ip {
            std::net::IpAddr::V4(v4) => {
                v4.is_private() || v4.is_link_local() || v4.is_unspecified() || v4.is_broadcast()
            }
            std::net::IpAddr::V6(v6) => {
                v6.is_unspecified()
                    || (v6.segments()[0] & 0xfe00) == 0xfc00
                    || (v6.segments()[0] & 0xffc0) == 0xfe80
            }
        };
        if private || (ip.is_loopback() && !began_on_loopback) {
            return Some(format!(
                "a redirect to {to} is refused (an address of this host or a private network)"
            ));
        }
    }
    None
}

fn host_only(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match host.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    }
}

fn is_loopback(host: &str) -> bool {
    let h = host_only(host);
    h == "localhost" || h.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Where a request goes: a mirror or the registry itself.
#[derive(Clone, Debug)]
struct Endpoint {
    host: String,
    /// `Some` when the configuration names the scheme.
    scheme: Option<&'static str>,
    plain_allowed: bool,
    is_mirror: bool,
}

pub(crate) struct Client {
    http: reqwest::Client,
    pub(crate) config: RegistryConfig,
    /// `(host, repository)` → the `Authorization` header that worked.
    auth: Mutex<HashMap<(String, String), String>>,
    /// host → the scheme found to answer, for hosts that may use either.
    schemes: Mutex<HashMap<String, &'static str>>,
}

const MANIFEST_ACCEPT: &str = "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.list.v2+json, application/vnd.docker.distribution.manifest.v2+json";
const RESUME_ATTEMPTS: u32 = 3;

impl Client {
    pub(crate) fn new(config: RegistryConfig) -> Result<Client> {
        let rules = config.clone();
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(30))
            // A registry may send blobs elsewhere (a CDN), but never around the plain-HTTP rule
            // nor to an address literal of this host's or a private network (a registry is
            // not a way to reach them).
            .redirect(reqwest::redirect::Policy::custom(move |attempt| {
                let refusal = redirect_refusal(
                    &rules,
                    attempt.url(),
                    attempt.previous().first(),
                    attempt.previous().len(),
                );
                match refusal {
                    None => attempt.follow(),
                    Some(why) => attempt.error(why),
                }
            }))
            .user_agent(concat!("sandcove/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| ImageError::Registry {
                registry: "-".into(),
                reason: format!("HTTP client: {e}"),
            })?;
        Ok(Client {
            http,
            config,
            auth: Mutex::new(HashMap::new()),
            schemes: Mutex::new(HashMap::new()),
        })
    }

    fn endpoints(&self, reference: &Reference) -> Result<Vec<Endpoint>> {
        let mut endpoints = Vec::new();
        for mirror in self
            .config
            .mirrors
            .get(&reference.registry)
            .into_iter()
            .flatten()
        {
            let (scheme, host) = match mirror.split_once("://") {
                Some(("http", host)) => (Some("http"), host),
                Some(("https", host)) => (Some("https"), host),
                Some((other, _)) => {
                    return Err(ImageError::malformed(
                        "registry configuration",
                        format!("mirror {mirror:?}: scheme {other:?}"),
                    ))
                }
                None => (None, mirror.as_str()),
            };
            let host = host.trim_end_matches('/').to_string();
            let plain_allowed = self.config.plain_http_allowed(&host);
            if scheme == Some("http") && !plain_allowed {
                return Err(ImageError::malformed(
                    "registry configuration",
                    format!("mirror {mirror:?} uses plain HTTP but is neither on a loopback address nor listed in `insecure`"),
                ));
            }
            endpoints.push(Endpoint {
                host,
                scheme,
                plain_allowed,
                is_mirror: true,
            });
        }
        let host = reference.api_host().to_string();
        let plain_allowed = self.config.plain_http_allowed(&host)
            || self.config.plain_http_allowed(&reference.registry);
        endpoints.push(Endpoint {
            host,
            scheme: None,
            plain_allowed,
            is_mirror: false,
        });
        Ok(endpoints)
    }

    fn credential(&self, reference: &Reference, endpoint: &Endpoint) -> Option<&Credential> {
        if endpoint.is_mirror {
            self.config.credentials.get(&endpoint.host)
        } else {
            self.config
                .credentials
                .get(&reference.registry)
                .or_else(|| self.config.credentials.get(&endpoint.host))
        }
    }

    /// Sends `GET|HEAD /v2/<repository>/<path>` to the first endpoint that answers it: mirrors
    /// that fail (unreachable, 404, 5xx) give way to the next, the registry's answer is final.
    async fn send(
        &self,
        reference: &Reference,
        path: &str,
        method: reqwest::Method,
        headers: &[(&str, String)],
    ) -> Result<reqwest::Response> {
        let endpoints = self.endpoints(reference)?;
        let mut last_error = None;
        for endpoint in &endpoints {
            match self
                .send_to(reference, endpoint, path, method.clone(), headers)
                .await
            {
                Ok(response)
                    if endpoint.is_mirror
                        && (response.status().is_server_error()
                            || response.status() == reqwest::StatusCode::NOT_FOUND) =>
                {
                    last_error = Some(ImageError::Registry {
                        registry: endpoint.host.clone(),
                        reason: format!("mirror answered {}", response.status()),
                    });
                }
                Ok(response) => return Ok(response),
                Err(e) if endpoint.is_mirror => {
                    tracing::debug!("mirror {} failed: {e}", endpoint.host);
                    last_error = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last_error.unwrap_or_else(|| ImageError::Registry {
            registry: reference.registry.clone(),
            reason: "no endpoint".into(),
        }))
    }

    async fn send_to(
        &self,
        reference: &Reference,
        endpoint: &Endpoint,
        path: &str,
        method: reqwest::Method,
        headers: &[(&str, String)],
    ) -> Result<reqwest::Response> {
        let key = (endpoint.host.clone(), reference.repository.clone());
        let mut authorized = false;
        loop {
            let scheme = self.scheme(endpoint).await?;
            let url = format!(
                "{scheme}://{}/v2/{}/{path}",
                endpoint.host, reference.repository
            );
            let mut request = self.http.request(method.clone(), &url);
            for (name, value) in headers {
                request = request.header(*name, value);
            }
            let cached = self.auth.lock().expect("auth cache").get(&key).cloned();
            if let Some(header) = &cached {
                request = request.header(reqwest::header::AUTHORIZATION, header);
            }
            // A registry that accepts the connection and never answers is a stall too.
            let stall = self.config.stall_timeout;
            let response = tokio::time::timeout(stall, request.send())
                .await
                .map_err(|_| ImageError::Stalled {
                    what: format!("{method} {url}"),
                    seconds: stall.as_secs(),
                })?
                .map_err(|e| self.unreachable(endpoint, e))?;
            if response.status() != reqwest::StatusCode::UNAUTHORIZED {
                if response.status() == reqwest::StatusCode::FORBIDDEN {
                    return Err(ImageError::Unauthorized {
                        registry: endpoint.host.clone(),
                        repository: reference.repository.clone(),
                        reason: "403 Forbidden".into(),
                    });
                }
                return Ok(response);
            }
            if authorized {
                return Err(ImageError::Unauthorized {
                    registry: endpoint.host.clone(),
                    repository: reference.repository.clone(),
                    reason: "the registry refused the token it issued".into(),
                });
            }
            let challenge = response
                .headers()
                .get(reqwest::header::WWW_AUTHENTICATE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            let header = self.authorize(reference, endpoint, &challenge).await?;
            self.auth
                .lock()
                .expect("auth cache")
                .insert(key.clone(), header);
            authorized = true;
        }
    }

    /// The `Authorization` header a `WWW-Authenticate` challenge asks for.
    async fn authorize(
        &self,
        reference: &Reference,
        endpoint: &Endpoint,
        challenge: &str,
    ) -> Result<String> {
        let unauthorized = |reason: String| ImageError::Unauthorized {
            registry: endpoint.host.clone(),
            repository: reference.repository.clone(),
            reason,
        };
        let credential = self.credential(reference, endpoint);
        let (scheme, params) = parse_challenge(challenge);
        match scheme.to_ascii_lowercase().as_str() {
            "basic" => {
                let credential = credential.ok_or_else(|| {
                    unauthorized(
                        "the registry asks for a user name and password and none is configured"
                            .into(),
                    )
                })?;
                Ok(basic(credential))
            }
            "bearer" => {
                let realm = params.get("realm").ok_or_else(|| {
                    unauthorized(format!("Bearer challenge without a realm: {challenge:?}"))
                })?;
                let mut url = reqwest::Url::parse(realm)
                    .map_err(|e| unauthorized(format!("token realm {realm:?}: {e}")))?;
                let realm_host = url.host_str().unwrap_or("").to_string();
                let realm_authority = match url.port() {
                    Some(port) => format!("{realm_host}:{port}"),
                    None => realm_host.clone(),
                };
                // A plain-HTTP realm only for a registry reached over plain HTTP itself:
                // a remote registry must not send its credentials to a loopback port.
                if url.scheme() != "https"
                    && !(url.scheme() == "http"
                        && endpoint.plain_allowed
                        && (self.config.plain_http_allowed(&realm_authority)
                            || self.config.plain_http_allowed(&realm_host)))
                {
                    return Err(unauthorized(format!("token realm {realm:?} is not HTTPS")));
                }
                {
                    let mut query = url.query_pairs_mut();
                    if let Some(service) = params.get("service") {
                        query.append_pair("service", service);
                    }
                    let scope = params
                        .get("scope")
                        .cloned()
                        .unwrap_or_else(|| format!("repository:{}:pull", reference.repository));
                    query.append_pair("scope", &scope);
                }
                let mut request = self.http.get(url);
                if let Some(credential) = credential {
                    request = request.header(reqwest::header::AUTHORIZATION, basic(credential));
                }
                let response = request
                    .send()
                    .await
                    .map_err(|e| unauthorized(format!("token request: {e}")))?;
                if !response.status().is_success() {
                    return Err(unauthorized(format!(
                        "token request answered {}",
                        response.status()
                    )));
                }
                let body = read_bounded(response, 1 << 20, "token").await?;
                #[derive(Deserialize)]
                struct Token {
                    token: Option<String>,
                    access_token: Option<String>,
                }
                let token: Token = serde_json::from_slice(&body)
                    .map_err(|e| unauthorized(format!("token answer: {e}")))?;
                let token = token
                    .token
                    .or(token.access_token)
                    .filter(|t| !t.is_empty())
                    .ok_or_else(|| unauthorized("token answer without a token".into()))?;
                Ok(format!("Bearer {token}"))
            }
            _ => Err(unauthorized(format!("401 with challenge {challenge:?}"))),
        }
    }

    /// The scheme for an endpoint: HTTPS, or plain HTTP where allowed and HTTPS does not answer.
    async fn scheme(&self, endpoint: &Endpoint) -> Result<&'static str> {
        if let Some(scheme) = endpoint.scheme {
            return Ok(scheme);
        }
        if !endpoint.plain_allowed {
            return Ok("https");
        }
        if let Some(scheme) = self
            .schemes
            .lock()
            .expect("scheme cache")
            .get(&endpoint.host)
        {
            return Ok(scheme);
        }
        let probe = self
            .http
            .get(format!("https://{}/v2/", endpoint.host))
            .timeout(Duration::from_secs(10))
            .send()
            .await;
        let scheme = if probe.is_ok() { "https" } else { "http" };
        self.schemes
            .lock()
            .expect("scheme cache")
            .insert(endpoint.host.clone(), scheme);
        Ok(scheme)
    }

    fn unreachable(&self, endpoint: &Endpoint, e: reqwest::Error) -> ImageError {
        ImageError::Registry {
            registry: endpoint.host.clone(),
            reason: format!("unreachable: {e}"),
        }
    }

    /// A manifest or index: its bytes, its content type, and its digest (checked against the
    /// reference's digest when it has one).
    pub(crate) async fn manifest(
        &self,
        reference: &Reference,
        key: &str,
    ) -> Result<(Vec<u8>, Option<String>, Digest)> {
        let response = self
            .send(
                reference,
                &format!("manifests/{key}"),
                reqwest::Method::GET,
                &[("Accept", MANIFEST_ACCEPT.to_string())],
            )
            .await?;
        let status = response.status();
        if status == reqwest::StatusCode::NOT_FOUND {
            return Err(ImageError::NotFound {
                reference: format!("{}@{key}", reference.name()),
            });
        }
        if !status.is_success() {
            return Err(ImageError::Registry {
                registry: reference.registry.clone(),
                reason: format!("manifest {key}: {status}"),
            });
        }
        let content_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let bytes = read_bounded(response, MAX_DOCUMENT_BYTES, &format!("manifest {key}")).await?;
        let digest = Digest::of(&bytes);
        if key.starts_with("sha256:") {
            Digest::parse(key)?.check(&digest, format!("manifest {key}"))?;
        }
        Ok((bytes, content_type, digest))
    }

    /// Whether the registry has the reference's manifest (HEAD), bounded in time.
    pub(crate) async fn has_manifest(&self, reference: &Reference) -> bool {
        let path = format!("manifests/{}", reference.manifest_key());
        let headers = [("Accept", MANIFEST_ACCEPT.to_string())];
        let request = self.send(reference, &path, reqwest::Method::HEAD, &headers);
        matches!(tokio::time::timeout(Duration::from_secs(15), request).await, Ok(Ok(response)) if response.status().is_success())
    }

    /// A small blob (a config), checked against its descriptor.
    pub(crate) async fn small_blob(
        &self,
        reference: &Reference,
        descriptor: &Descriptor,
    ) -> Result<Vec<u8>> {
        let digest = Digest::parse(&descriptor.digest)?;
        if descriptor.size > MAX_DOCUMENT_BYTES {
            return Err(ImageError::TooLarge {
                what: format!("config {digest}"),
                reason: format!("{} bytes, past {MAX_DOCUMENT_BYTES}", descriptor.size),
            });
        }
        let response = self
            .send(
                reference,
                &format!("blobs/{digest}"),
                reqwest::Method::GET,
                &[],
            )
            .await?;
        if !response.status().is_success() {
            return Err(ImageError::Registry {
                registry: reference.registry.clone(),
                reason: format!("blob {digest}: {}", response.status()),
            });
        }
        let bytes = read_bounded(response, descriptor.size, &format!("blob {digest}")).await?;
        if bytes.len() as u64 != descriptor.size {
            return Err(ImageError::SizeMismatch {
                what: format!("blob {digest}"),
                declared: descriptor.size,
                actual: format!("{} bytes", bytes.len()),
            });
        }
        digest.check(&Digest::of(&bytes), format!("blob {digest}"))?;
        Ok(bytes)
    }

    /// Downloads a layer blob into `dest`, checking its size as bytes arrive and its digest at
    /// the end; a cut connection is resumed with a `Range` request, a stall refused.
    pub(crate) async fn download(
        &self,
        reference: &Reference,
        descriptor: &Descriptor,
        dest: &Path,
        progress: &(dyn Fn(u64) + Send + Sync),
    ) -> Result<()> {
        let digest = Digest::parse(&descriptor.digest)?;
        let what = format!("blob {digest}");
        let declared = descriptor.size;
        let mut file = tokio::fs::File::create(dest)
            .await
            .map_err(|e| ImageError::io(format!("creating {}", dest.display()), e))?;
        let mut hasher = Hasher::new();
        let mut received = 0u64;
        let mut fruitless = 0u32;
        let stall = self.config.stall_timeout;
        loop {
            let headers: Vec<(&str, String)> = if received > 0 {
                vec![("Range", format!("bytes={received}-"))]
            } else {
                vec![]
            };
            let response = self
                .send(
                    reference,
                    &format!("blobs/{digest}"),
                    reqwest::Method::GET,
                    &headers,
                )
                .await;
            let response = match response {
                Ok(response) => response,
                Err(ImageError::Registry { .. }) if received > 0 && fruitless < RESUME_ATTEMPTS => {
                    fruitless += 1;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let status = response.status();
            if status == reqwest::StatusCode::OK && received > 0 {
                // The registry ignored the range: start over.
                file.set_len(0)
                    .await
                    .map_err(|e| ImageError::io("restarting a download", e))?;
                file = tokio::fs::File::create(dest)
                    .await
                    .map_err(|e| ImageError::io("restarting a download", e))?;
                hasher = Hasher::new();
                received = 0;
            } else if status == reqwest::StatusCode::NOT_FOUND {
                return Err(ImageError::Registry {
                    registry: reference.registry.clone(),
                    reason: format!("{what} not found in {}", reference.name()),
                });
            } else if !(status == reqwest::StatusCode::OK
                || status == reqwest::StatusCode::PARTIAL_CONTENT)
            {
                return Err(ImageError::Registry {
                    registry: reference.registry.clone(),
                    reason: format!("{what}: {status}"),
                });
            }
            if let Some(length) = response.content_length() {
                if received + length > declared {
                    return Err(ImageError::SizeMismatch {
                        what,
                        declared,
                        actual: format!("the registry announces {} bytes", received + length),
                    });
                }
            }
            let before = received;
            let mut body = response.bytes_stream();
            loop {
                let next = match tokio::time::timeout(stall, body.next()).await {
                    Ok(next) => next,
                    Err(_) => {
                        return Err(ImageError::Stalled {
                            what,
                            seconds: stall.as_secs(),
                        })
                    }
                };
                match next {
                    Some(Ok(chunk)) => {
                        if received + chunk.len() as u64 > declared {
                            return Err(ImageError::SizeMismatch {
                                what,
                                declared,
                                actual: "the registry sent more bytes".into(),
                            });
                        }
                        file.write_all(&chunk).await.map_err(|e| {
                            ImageError::io(format!("writing {}", dest.display()), e)
                        })?;
                        hasher.update(&chunk);
                        received += chunk.len() as u64;
                        progress(received);
                    }
                    Some(Err(e)) => {
                        tracing::debug!("{what}: cut after {received} bytes: {e}");
                        break;
                    }
                    None => break,
                }
            }
            if received == declared {
                break;
            }
            fruitless = if received > before { 0 } else { fruitless + 1 };
            if fruitless >= RESUME_ATTEMPTS {
                return Err(ImageError::Truncated {
                    what,
                    received,
                    declared,
                });
            }
        }
        file.flush()
            .await
            .map_err(|e| ImageError::io("writing a download", e))?;
        file.sync_all()
            .await
            .map_err(|e| ImageError::io("writing a download", e))?;
        digest.check(&hasher.finish(), what)?;
        Ok(())
    }
}

fn basic(credential: &Credential) -> String {
    let raw = format!("{}:{}", credential.username, credential.password);
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(raw)
    )
}

/// `Bearer realm="…",service="…",scope="…"` → (`Bearer`, its parameters).
fn parse_challenge(header: &str) -> (String, HashMap<String, String>) {
    let header = header.trim();
    let (scheme, rest) = header.split_once(' ').unwrap_or((header, ""));
    let mut params = HashMap::new();
    let mut rest = rest.trim();
    while !rest.is_empty() {
        let Some((name, after)) = rest.split_once('=') else {
            break;
        };
        let name = name
            .trim()
            .trim_start_matches(',')
            .trim()
            .to_ascii_lowercase();
        let after = after.trim_start();
        let (value, remainder) = if let Some(quoted) = after.strip_prefix('"') {
            match quoted.find('"') {
                Some(end) => (&quoted[..end], &quoted[end + 1..]),
                None => (quoted, ""),
            }
        } else {
            match after.find(',') {
                Some(end) => (&after[..end], &after[end..]),
                None => (after, ""),
            }
        };
        params.insert(name, value.to_string());
        rest = remainder.trim_start().trim_start_matches(',').trim_start();
    }
    (scheme.to_string(), params)
}

/// A response body, refused past `limit` bytes (at once when the length is announced).
async fn read_bounded(response: reqwest::Response, limit: u64, what: &str) -> Result<Vec<u8>> {
    if response
        .content_length()
        .is_some_and(|length| length > limit)
    {
        return Err(ImageError::TooLarge {
            what: what.to_string(),
            reason: format!(
                "{} bytes announced, past {limit}",
                response.content_length().unwrap_or(0)
            ),
        });
    }
    let mut body = Vec::new();
    let mut stream = response.bytes_stream();
    while let Some(chunk) = tokio::time::timeout(Duration::from_secs(60), stream.next())
        .await
        .map_err(|_| ImageError::Stalled {
            what: what.to_string(),
            seconds: 60,
        })?
    {
        let chunk = chunk.map_err(|e| ImageError::Registry {
            registry: "-".into(),
            reason: format!("{what}: {e}"),
        })?;
        if body.len() as u64 + chunk.len() as u64 > limit {
            return Err(ImageError::TooLarge {
                what: what.to_string(),
                reason: format!("past {limit} bytes"),
            });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirects_keep_to_https_and_off_this_host_and_private_networks() {
        let rules = RegistryConfig::default();
        let url = |u: &str| reqwest::Url::parse(u).unwrap();
        let remote = url("https://registry.example/v2/x/blobs/sha256:00");
        let local = url("http://127.0.0.1:5000/v2/x/blobs/sha256:00");
        let refused = |to: &str, from: &reqwest::Url| {
            redirect_refusal(&rules, &url(to), Some(from), 1).is_some()
        };
        // A CDN over HTTPS: followed.
        assert!(!refused("https://cdn.example/blob", &remote));
        // Plain HTTP, an address of this host or of a private network: refused from a
        // remote registry.
        for to in [
            "http://cdn.example/blob",
            "http://127.0.0.1:8080/",
            "https://127.0.0.1/",
            "https://169.254.169.254/latest/meta-data/",
            "https://10.1.2.3/",
            "https://192.168.0.1/",
            "https://[fd00::1]/",
            "https://[fe80::1]/",
            "https://0.0.0.0/",
        ] {
            assert!(refused(to, &remote), "{to}");
        }
        // A loopback registry may send to loopback, over plain HTTP too.
        assert!(!refused("http://127.0.0.1:5001/blob", &local));
        assert!(!refused("https://localhost:5001/blob", &local));
        assert!(refused("http://cdn.example/blob", &local));
        assert!(
            redirect_refusal(&rules, &url("https://cdn.example/"), Some(&remote), 10).is_some()
        );
    }

    #[test]
    fn challenges_are_parsed() {
        let (scheme, params) = parse_challenge(
            r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/python:pull""#,
        );
        assert_eq!(scheme, "Bearer");
        assert_eq!(params["realm"], "https://auth.docker.io/token");
        assert_eq!(params["service"], "registry.docker.io");
        assert_eq!(params["scope"], "repository:library/python:pull");
    }

    #[test]
    fn plain_http_only_for_loopback_and_listed_hosts() {
        let config = RegistryConfig {
            insecure: vec!["registry.lan:5000".into()],
            ..Default::default()
        };
        assert!(config.plain_http_allowed("127.0.0.1:5000"));
        assert!(config.plain_http_allowed("localhost"));
        assert!(config.plain_http_allowed("[::1]:5000"));
        assert!(config.plain_http_allowed("registry.lan:5000"));
        assert!(!config.plain_http_allowed("registry.lan:5001"));
        assert!(!config.plain_http_allowed("registry-1.docker.io"));
    }

    #[test]
    fn docker_config_auths_are_read() {
        let mut config = RegistryConfig::default();
        let auth = base64::engine::general_purpose::STANDARD.encode("me:secret");
        let json = format!(
            r#"{{"auths":{{"https://index.docker.io/v1/":{{"auth":"{auth}"}},"ghcr.io":{{"username":"u","password":"p"}}}}}}"#
        );
        config.add_docker_auths(json.as_bytes(), "test").unwrap();
        assert_eq!(config.credentials["docker.io"].password, "secret");
        assert_eq!(config.credentials["ghcr.io"].username, "u");
    }
}
