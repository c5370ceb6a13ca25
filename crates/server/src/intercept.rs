//! A TLS-intercepting `CONNECT` proxy for a fixed list of host names, with a local CA that can
//! sign for those names only.
//!
//! Some official SDKs cannot be pointed at another host (Blaxel's Python SDK hard-codes
//! `https://api.blaxel.ai`). Their HTTP stacks do honour `HTTPS_PROXY` and `SSL_CERT_FILE`, so
//! a listener served by [`serve_router_intercepting`](super::serve_router_intercepting) answers
//! `CONNECT host:443` for a configured host with `200`, terminates the tunnel with TLS using a
//! leaf certificate for that host, and serves the decrypted HTTP/1.1 requests with the same
//! router, limits and connection cap as plain requests. A `CONNECT` to any other host or port
//! is answered `403` with a one-line reason: this is not an open proxy (users list other hosts
//! in `NO_PROXY`).
//!
//! # The CA ([`SandcoveCa`])
//!
//! - **What it can sign**: its X.509 NameConstraints extension (marked critical) permits only
//!   the configured DNS names (and, as the standard defines a DNS-name subtree, names below
//!   them) and excludes every IPv4 and IPv6 address; its basic constraints allow no
//!   intermediate CA (path length 0) and its extended key usage is TLS server authentication
//!   only. A verifier that enforces these (rustls's webpki, OpenSSL) rejects anything else it
//!   signs, even if its key leaked.
//! - **Where it lives**: in the directory given to [`SandcoveCa::open`] (`sandcove serve`
//!   uses `<state dir>/blaxel-ca`): `ca/key.pem` (the private key, created with mode 0600 by
//!   an exclusive create and refused when group or others may read it), `ca/cert.pem`, and
//!   `bundle.pem` (the host's public roots followed by this CA, for `SSL_CERT_FILE`), and
//!   `certs/` (this CA alone, named by OpenSSL's subject hash, for `SSL_CERT_DIR` beside the
//!   host's hashed roots: see [`ssl_cert_dir`]). Nothing is installed into the system trust
//!   store; deleting the directory removes the CA.
//! - **Lifetime**: the CA is valid for [`CA_LIFETIME`]; it is replaced (key, certificate and
//!   bundle) once it would expire before a leaf minted now, i.e. with fewer than
//!   [`LEAF_LIFETIME`] left, which is checked at open and whenever a leaf is minted. Leaves
//!   are valid for [`LEAF_LIFETIME`], live only in memory and are minted again after
//!   [`LEAF_REFRESH`].
//! - **Public roots**: read from the first of [`SYSTEM_BUNDLES`] that exists (the
//!   distribution's `ca-certificates` bundle), never from `SSL_CERT_FILE` (which may already
//!   point at a bundle of ours).

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::body::Body;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper::body::Incoming;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use time::OffsetDateTime;
use tokio::sync::watch;

use super::upgrade;
use sandcove_core::Error;

/// The CA certificate's common name.
pub const CA_NAME: &str = "Sandcove local interception CA";
/// How long a new CA is valid.
pub const CA_LIFETIME: Duration = Duration::from_secs(90 * 24 * 3600);
/// How long a leaf is valid; the CA is replaced once it has less than this left.
pub const LEAF_LIFETIME: Duration = Duration::from_secs(7 * 24 * 3600);
/// How long a minted leaf is served before it is minted again.
pub const LEAF_REFRESH: Duration = Duration::from_secs(24 * 3600);
/// Where the host's public roots are read from: the first of these that exists (Debian and
/// Ubuntu, Fedora and RHEL, openSUSE, Alpine).
pub const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
];
/// Where the host's public roots are kept one file per certificate under OpenSSL's
/// subject-hash names (`c_rehash`), which `SSL_CERT_DIR` reads lazily: the first of these
/// holding such names is used (Debian and Ubuntu, Fedora and RHEL, openSUSE, Alpine).
pub const SYSTEM_CERT_DIRS: &[&str] = &[
    "/etc/ssl/certs",
    "/etc/pki/ca-trust/extracted/pem/directory-hash",
    "/var/lib/ca-certificates/openssl",
];
/// Largest system bundle read.
const MAX_SYSTEM_BUNDLE: u64 = 8 * 1024 * 1024;
/// Entries of a system certificate directory looked at for a hashed name.
const MAX_DIR_PROBE: usize = 4096;
/// Slack on `not_before` for clocks slightly behind ours.
const CLOCK_SKEW: Duration = Duration::from_secs(3600);

/// The signing material in use (replaced when the CA is renewed).
struct Material {
    key: rcgen::KeyPair,
    /// The CA as rcgen needs it to sign (its name and key identifier).
    issuer: rcgen::Certificate,
    /// The CA certificate exactly as on disk, the trust anchor clients hold.
    der: CertificateDer<'static>,
    /// The end of its validity, read from `der` (verifiers such as webpki do not check a
    /// trust anchor's dates, so this is the one place its expiry is known).
    not_after: SystemTime,
}

/// A minted leaf, ready for the handshake.
struct Leaf {
    config: Arc<rustls::ServerConfig>,
    minted: SystemTime,
}

/// A local CA, name-constrained to a fixed list of host names, that mints one TLS leaf per
/// host on demand (see the module docs for its files and lifetime).
pub struct SandcoveCa {
    dir: PathBuf,
    hosts: Vec<String>,
    system_roots: Option<PathBuf>,
    material: Mutex<Arc<Material>>,
    leaves: Mutex<HashMap<String, Arc<Leaf>>>,
}

impl std::fmt::Debug for SandcoveCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key is deliberately left out.
        f.debug_struct("SandcoveCa")
            .field("dir", &self.dir)
            .field("hosts", &self.hosts)
            .finish_non_exhaustive()
    }
}

impl SandcoveCa {
    /// Load the CA kept in `dir`, creating it (and `dir`, mode 0700) the first time or
    /// replacing it when it is about to expire, and (re)write the bundle. `hosts` are the DNS
    /// names it may sign for; an existing CA that cannot sign for one of them is an error
    /// naming the directory to remove. Does file IO and key generation: call it at startup
    /// or from `spawn_blocking`.
    pub fn open(dir: impl Into<PathBuf>, hosts: &[&str]) -> sandcove_core::Result<Arc<SandcoveCa>> {
        let dir = dir.into();
        let hosts = normalize_hosts(hosts)?;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| Error::from_io(&e, &format!("create {}", dir.display())))?;
        let material = match load(&dir, &hosts)? {
            Some(m) => m,
            None => create(&dir, &hosts)?,
        };
        let ca = SandcoveCa {
            system_roots: SYSTEM_BUNDLES
                .iter()
                .map(PathBuf::from)
                .find(|p| p.is_file()),
            dir,
            hosts,
            material: Mutex::new(Arc::new(material)),
            leaves: Mutex::new(HashMap::new()),
        };
        // Mint every leaf now: this proves the CA can sign for each host (renewing it when
        // it is too close to its end) and keeps key generation off the event loop later.
        for host in ca.hosts.clone() {
            let leaf = ca.mint(&host)?;
            ca.leaves_lock().insert(host, leaf);
        }
        ca.write_bundle()?;
        Ok(Arc::new(ca))
    }

    /// The directory holding the CA and the bundle.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The CA certificate (PEM).
    pub fn cert_path(&self) -> PathBuf {
        self.dir.join("ca").join("cert.pem")
    }

    /// The CA's private key (PEM, mode 0600).
    pub fn key_path(&self) -> PathBuf {
        self.dir.join("ca").join("key.pem")
    }

    /// The bundle for `SSL_CERT_FILE`: the host's public roots, then this CA.
    pub fn bundle_path(&self) -> PathBuf {
        bundle_path(&self.dir)
    }

    /// The system bundle whose roots the bundle carries, if one was found.
    pub fn system_roots(&self) -> Option<&Path> {
        self.system_roots.as_deref()
    }

    /// The host names this CA signs for (lower case).
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    /// Whether `host` (any case) is one of [`SandcoveCa::hosts`].
    pub fn allows(&self, host: &str) -> bool {
        self.hosts.iter().any(|h| h.eq_ignore_ascii_case(host))
    }

    /// The CA certificate clients trust, as DER.
    pub fn cert_der(&self) -> CertificateDer<'static> {
        self.material_now().der.clone()
    }

    /// The TLS configuration serving `host` (HTTP/1.1 only), from the cache or, when the
    /// cached leaf is due, minted again on a blocking thread.
    pub async fn server_config(
        self: &Arc<Self>,
        host: &str,
    ) -> sandcove_core::Result<Arc<rustls::ServerConfig>> {
        if !self.allows(host) {
            return Err(Error::PermissionDenied {
                what: format!(
                    "a certificate for {host}: this CA signs only for {}",
                    self.hosts.join(", ")
                ),
            });
        }
        let host = host.to_ascii_lowercase();
        if let Some(leaf) = self.leaves_lock().get(&host).cloned() {
            let age = SystemTime::now()
                .duration_since(leaf.minted)
                .unwrap_or_default();
            if age < LEAF_REFRESH {
                return Ok(leaf.config.clone());
            }
        }
        let ca = self.clone();
        let leaf = tokio::task::spawn_blocking(move || {
            let leaf = ca.mint(&host)?;
            ca.leaves_lock().insert(host, leaf.clone());
            Ok::<_, Error>(leaf)
        })
        .await
        .map_err(|e| Error::backend(format!("minting a certificate: {e}")))??;
        Ok(leaf.config.clone())
    }

    fn leaves_lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Leaf>>> {
        self.leaves.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn material_now(&self) -> Arc<Material> {
        self.material
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Mint a leaf for `host` (renewing the CA first when it would end before the leaf) and
    /// check it the way a client will, against the CA on disk (blocking).
    fn mint(&self, host: &str) -> sandcove_core::Result<Arc<Leaf>> {
        let mut material = self.material_now();
        if material.not_after < SystemTime::now() + LEAF_LIFETIME {
            // The CA would end before this leaf: renew it (the same check at start-up).
            let renewed = Arc::new(renew(&self.dir, &self.hosts)?);
            *self.material.lock().unwrap_or_else(|p| p.into_inner()) = renewed.clone();
            self.leaves_lock().clear();
            self.write_bundle()?;
            material = renewed;
        }
        let (chain, key) = sign_leaf(&material, host)?;
        if let Err(e) = verify_leaf(&material.der, &chain[0], host, SystemTime::now()) {
            return Err(broken_ca(
                &self.dir,
                &format!("a certificate for {host}: {e}"),
            ));
        }
        let config = leaf_config(chain, key)?;
        Ok(Arc::new(Leaf {
            config,
            minted: SystemTime::now(),
        }))
    }

    /// Write `bundle.pem` (system roots, then the CA) and the CA's hashed entry in `certs/`,
    /// each replaced atomically.
    fn write_bundle(&self) -> sandcove_core::Result<()> {
        let cert = read_bounded(&self.cert_path(), super::MAX_PEM_BYTES)?;
        let hash = openssl_subject_hash(&self.material_now().der).ok_or_else(|| {
            Error::invalid(format!(
                "{}: the CA's subject has no OpenSSL hash form",
                self.cert_path().display()
            ))
        })?;
        let certs = cert_dir_path(&self.dir);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&certs)
            .map_err(|e| Error::from_io(&e, &format!("create {}", certs.display())))?;
        replace_file(&certs, &certs.join(format!("{hash:08x}.0")), &cert, 0o644)?;
        let mut text = Vec::new();
        if let Some(system) = &self.system_roots {
            let roots = read_bounded(system, MAX_SYSTEM_BUNDLE)?;
            let count = CertificateDer::pem_slice_iter(&roots)
                .filter(|c| c.is_ok())
                .count();
            if count == 0 {
                return Err(Error::invalid(format!(
                    "{} holds no PEM certificate",
                    system.display()
                )));
            }
            text.extend_from_slice(&roots);
            if !text.ends_with(b"\n") {
                text.push(b'\n');
            }
        } else {
            tracing::warn!(
                "no system CA bundle found ({}): the bundle holds only the Sandcove CA, so other \
                 HTTPS made with it will not verify",
                SYSTEM_BUNDLES.join(", ")
            );
        }
        text.extend_from_slice(
            format!(
                "# {CA_NAME} (name-constrained to {})\n",
                self.hosts.join(", ")
            )
            .as_bytes(),
        );
        text.extend_from_slice(&cert);
        replace_file(&self.dir, &self.bundle_path(), &text, 0o644)
    }
}

/// Where [`SandcoveCa::open`] on `dir` puts the bundle (without opening anything).
pub fn bundle_path(dir: &Path) -> PathBuf {
    dir.join("bundle.pem")
}

/// Where [`SandcoveCa::open`] on `dir` puts the CA under its hashed name (without opening
/// anything).
pub fn cert_dir_path(dir: &Path) -> PathBuf {
    dir.join("certs")
}

/// The `SSL_CERT_DIR` value that trusts the CA kept in `dir` and the host's public roots:
/// `<dir>/certs:<system dir>`, when the CA's hashed entry exists, the host keeps its roots
/// under hashed names ([`SYSTEM_CERT_DIRS`]) and no path holds the list separator.
///
/// OpenSSL loads a directory's certificates on demand, where `SSL_CERT_FILE` parses the whole
/// bundle each time a TLS context is made: Python SDKs make one per client (Blaxel's, one per
/// sandbox), and parsing the host's ~150 roots took 15–40 ms each time here.
pub fn ssl_cert_dir(dir: &Path) -> Option<String> {
    let ours = cert_dir_path(dir);
    let has_hashed_entry = |d: &Path| {
        std::fs::read_dir(d).is_ok_and(|entries| {
            entries
                .take(MAX_DIR_PROBE)
                .filter_map(|e| e.ok())
                .any(|e| is_hashed_name(&e.file_name().to_string_lossy()))
        })
    };
    if !has_hashed_entry(&ours) {
        return None;
    }
    let system = SYSTEM_CERT_DIRS
        .iter()
        .map(Path::new)
        .find(|d| has_hashed_entry(d))?;
    let value = format!("{}:{}", ours.display(), system.display());
    (value.matches(':').count() == 1).then_some(value)
}

/// `c_rehash`'s names: eight lower-case hex digits, a dot, a decimal sequence number.
fn is_hashed_name(name: &str) -> bool {
    name.split_once('.').is_some_and(|(hash, n)| {
        hash.len() == 8
            && hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
            && !n.is_empty()
            && n.bytes().all(|b| b.is_ascii_digit())
    })
}

/// OpenSSL's subject name hash of a certificate (`X509_subject_name_hash`, the name of its
/// file in a hashed directory): the first four bytes, little-endian, of the SHA-1 of the
/// name's canonical form. The canonical form is each RDN's DER `SET` (no outer `SEQUENCE`),
/// with every string value re-encoded as a `UTF8String` trimmed, with runs of white space
/// made one space, and ASCII lower-cased. Only the string types a CA of ours can carry are
/// handled (ASCII in UTF8String, PrintableString, IA5String or VisibleString); `None`
/// otherwise.
fn openssl_subject_hash(cert_der: &[u8]) -> Option<u32> {
    let (_, certificate, _) = der_element(cert_der).filter(|(tag, _, _)| *tag == 0x30)?;
    let (_, tbs, _) = der_element(certificate).filter(|(tag, _, _)| *tag == 0x30)?;
    let mut rest = tbs;
    if rest.first() == Some(&0xa0) {
        rest = der_element(rest)?.2;
    }
    // serial, signature algorithm, issuer, validity; then the subject.
    for _ in 0..4 {
        rest = der_element(rest)?.2;
    }
    let (_, mut rdns, _) = der_element(rest).filter(|(tag, _, _)| *tag == 0x30)?;
    let mut canon = Vec::new();
    while !rdns.is_empty() {
        let (_, mut set, next) = der_element(rdns).filter(|(tag, _, _)| *tag == 0x31)?;
        rdns = next;
        let mut entries = Vec::new();
        while !set.is_empty() {
            let (_, attribute, next) = der_element(set).filter(|(tag, _, _)| *tag == 0x30)?;
            set = next;
            let (_, oid, value) = der_element(attribute).filter(|(tag, _, _)| *tag == 0x06)?;
            let (tag, text, end) = der_element(value)?;
            if !end.is_empty() || !matches!(tag, 0x0c | 0x13 | 0x16 | 0x1a) || !text.is_ascii() {
                return None;
            }
            let folded = std::str::from_utf8(text)
                .ok()?
                .split([' ', '\t', '\n', '\x0b', '\x0c', '\r'])
                .filter(|w| !w.is_empty())
                .collect::<Vec<_>>()
                .join(" ")
                .to_ascii_lowercase();
            let mut entry = der_encode(0x06, oid);
            entry.extend(der_encode(0x0c, folded.as_bytes()));
            entries.push(der_encode(0x30, &entry));
        }
        // DER orders a SET OF by encoding.
        entries.sort();
        canon.extend(der_encode(0x31, &entries.concat()));
    }
    let digest = ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, &canon);
    let bytes = digest.as_ref();
    Some(u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
}

/// One DER element: `tag`, the definite length, `contents`.
fn der_encode(tag: u8, contents: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = contents.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
    out.extend_from_slice(contents);
    out
}

fn normalize_hosts(hosts: &[&str]) -> sandcove_core::Result<Vec<String>> {
    if hosts.is_empty() {
        return Err(Error::invalid(
            "an intercepting CA needs at least one host name",
        ));
    }
    let mut out = Vec::new();
    for host in hosts {
        let host = host.to_ascii_lowercase();
        match ServerName::try_from(host.as_str()) {
            Ok(ServerName::DnsName(_)) if host.contains('.') && !host.starts_with('*') => {}
            _ => {
                return Err(Error::invalid(format!(
                    "{host:?} is not a DNS host name this CA can be constrained to"
                )))
            }
        }
        if !out.contains(&host) {
            out.push(host);
        }
    }
    Ok(out)
}

fn broken_ca(dir: &Path, what: &str) -> Error {
    Error::Unavailable {
        reason: format!("the Sandcove CA in {} cannot sign {what}", dir.display()),
        remedy: format!(
            "stop the server and remove {} (the next start creates a new CA; restart the \
             programs that use its bundle)",
            dir.display()
        ),
    }
}

fn offset(t: SystemTime) -> OffsetDateTime {
    OffsetDateTime::from(t)
}

/// The CA's parameters; everything a leaf's issuer field and key identifier derive from.
fn ca_params(
    hosts: &[String],
    not_before: SystemTime,
    not_after: SystemTime,
) -> rcgen::CertificateParams {
    let mut params = rcgen::CertificateParams::default();
    let mut name = rcgen::DistinguishedName::new();
    name.push(rcgen::DnType::OrganizationName, "Sandcove");
    name.push(rcgen::DnType::CommonName, CA_NAME);
    params.distinguished_name = name;
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    params.name_constraints = Some(rcgen::NameConstraints {
        permitted_subtrees: hosts
            .iter()
            .map(|h| rcgen::GeneralSubtree::DnsName(h.clone()))
            .collect(),
        // A DNS-only permitted list leaves IP addresses unconstrained: exclude them all.
        excluded_subtrees: vec![
            rcgen::GeneralSubtree::IpAddress(rcgen::CidrSubnet::V4([0; 4], [0; 4])),
            rcgen::GeneralSubtree::IpAddress(rcgen::CidrSubnet::V6([0; 16], [0; 16])),
        ],
    });
    params.not_before = offset(not_before);
    params.not_after = offset(not_after);
    params
}

fn sign_leaf(
    material: &Material,
    host: &str,
) -> sandcove_core::Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
    let now = SystemTime::now();
    let not_after = now + LEAF_LIFETIME;
    let mut params = rcgen::CertificateParams::new(vec![host.to_string()])
        .map_err(|e| Error::invalid(format!("a certificate for {host}: {e}")))?;
    let mut name = rcgen::DistinguishedName::new();
    name.push(rcgen::DnType::CommonName, host);
    params.distinguished_name = name;
    params.is_ca = rcgen::IsCa::ExplicitNoCa;
    params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    params.serial_number = Some(rcgen::SerialNumber::from_slice(&random_serial()?));
    params.not_before = offset(now - Duration::from_secs(300));
    params.not_after = offset(not_after);
    let key = rcgen::KeyPair::generate().map_err(|e| Error::backend(format!("leaf key: {e}")))?;
    let cert = params
        .signed_by(&key, &material.issuer, &material.key)
        .map_err(|e| Error::backend(format!("signing a certificate for {host}: {e}")))?;
    let key_der = PrivateKeyDer::Pkcs8(key.serialize_der().into());
    Ok((vec![cert.der().clone()], key_der))
}

/// Check `leaf` for `host` with rustls's webpki verifier, `ca` as the only root, at `at`.
fn verify_leaf(
    ca: &CertificateDer<'static>,
    leaf: &CertificateDer<'static>,
    host: &str,
    at: SystemTime,
) -> Result<(), rustls::Error> {
    use rustls::client::danger::ServerCertVerifier;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone())?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier =
        rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .map_err(|e| rustls::Error::General(e.to_string()))?;
    let name = ServerName::try_from(host.to_string())
        .map_err(|e| rustls::Error::General(e.to_string()))?;
    let at = UnixTime::since_unix_epoch(
        at.duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default(),
    );
    verifier
        .verify_server_cert(leaf, &[], &name, &[], at)
        .map(|_| ())
}

fn leaf_config(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> sandcove_core::Result<Arc<rustls::ServerConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::backend(format!("TLS setup: {e}")))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| Error::backend(format!("TLS leaf: {e}")))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A random certificate serial number: 16 bytes, positive and non-zero as DER wants.
pub fn random_serial() -> sandcove_core::Result<[u8; 16]> {
    let mut serial = [0u8; 16];
    getrandom::fill(&mut serial).map_err(|e| Error::backend(format!("randomness: {e}")))?;
    // Positive and non-zero as DER INTEGERs must be.
    serial[0] = (serial[0] & 0x7f) | 0x01;
    Ok(serial)
}

/// The CA in `dir/ca`, if there is one. A key readable by others, or files that do not
/// belong together, are errors (never silently replaced).
fn load(dir: &Path, hosts: &[String]) -> sandcove_core::Result<Option<Material>> {
    let key_path = dir.join("ca").join("key.pem");
    let cert_path = dir.join("ca").join("cert.pem");
    let key_pem = match super::read_secret_file(&key_path, true) {
        Ok(pem) => pem,
        Err(e) if e.is_not_found() && !dir.join("ca").exists() => return Ok(None),
        Err(e) => return Err(e),
    };
    let key_text = std::str::from_utf8(&key_pem)
        .map_err(|_| Error::invalid(format!("{} is not PEM", key_path.display())))?;
    let key = rcgen::KeyPair::from_pem(key_text)
        .map_err(|e| Error::invalid(format!("{}: {e}", key_path.display())))?;
    let cert_pem = super::read_secret_file(&cert_path, false)?;
    let der = CertificateDer::from_pem_slice(&cert_pem)
        .map_err(|e| Error::invalid(format!("{}: {e}", cert_path.display())))?
        .into_owned();
    // rcgen signs with the issuer's name and key; its validity is not used for that.
    let now = SystemTime::now();
    let issuer = ca_params(hosts, now, now + CA_LIFETIME)
        .self_signed(&key)
        .map_err(|e| Error::backend(format!("the CA: {e}")))?;
    // Whether the certificate belongs to this key and these hosts is checked by verifying a
    // leaf against it (`SandcoveCa::mint`).
    let not_after = cert_not_after(&der).ok_or_else(|| {
        broken_ca(
            dir,
            &format!("anything: {} has no readable validity", cert_path.display()),
        )
    })?;
    Ok(Some(Material {
        key,
        issuer,
        der,
        not_after,
    }))
}

/// A new CA in a fresh directory, published as `dir/ca` in one rename. When another process
/// published one first, that one is loaded instead.
fn create(dir: &Path, hosts: &[String]) -> sandcove_core::Result<Material> {
    let staged = stage(dir, hosts, SystemTime::now() + CA_LIFETIME)?;
    match std::fs::rename(&staged.0, dir.join("ca")) {
        Ok(()) => Ok(staged.1),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EEXIST | libc::ENOTEMPTY)) => {
            let _ = std::fs::remove_dir_all(&staged.0);
            load(dir, hosts)?.ok_or_else(|| broken_ca(dir, "anything: the CA vanished"))
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&staged.0);
            Err(Error::from_io(
                &e,
                &format!("publish the CA in {}", dir.display()),
            ))
        }
    }
}

/// Replace `dir/ca` with a new CA.
fn renew(dir: &Path, hosts: &[String]) -> sandcove_core::Result<Material> {
    let (staged, material) = stage(dir, hosts, SystemTime::now() + CA_LIFETIME)?;
    let retired = dir.join(format!(".retired-{}", sandcove_core::random_id(12)));
    let current = dir.join("ca");
    let moved = std::fs::rename(&current, &retired);
    if let Err(e) = moved.and_then(|()| std::fs::rename(&staged, &current)) {
        let _ = std::fs::remove_dir_all(&staged);
        return Err(Error::from_io(
            &e,
            &format!("renew the CA in {}", dir.display()),
        ));
    }
    let _ = std::fs::remove_dir_all(&retired);
    tracing::info!("renewed the Sandcove CA in {}", dir.display());
    Ok(material)
}

/// Generate a CA into a new private directory beside `dir/ca`.
fn stage(
    dir: &Path,
    hosts: &[String],
    not_after: SystemTime,
) -> sandcove_core::Result<(PathBuf, Material)> {
    let staged = dir.join(format!(".new-{}", sandcove_core::random_id(12)));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&staged)
        .map_err(|e| Error::from_io(&e, &format!("create {}", staged.display())))?;
    let made = (|| {
        let key = rcgen::KeyPair::generate().map_err(|e| Error::backend(format!("CA key: {e}")))?;
        let now = SystemTime::now();
        let mut params = ca_params(hosts, now - CLOCK_SKEW, not_after);
        params.serial_number = Some(rcgen::SerialNumber::from_slice(&random_serial()?));
        let issuer = params
            .self_signed(&key)
            .map_err(|e| Error::backend(format!("the CA certificate: {e}")))?;
        // The key file is private from its creation: an exclusive create with mode 0600.
        write_new(
            &staged.join("key.pem"),
            key.serialize_pem().as_bytes(),
            0o600,
        )?;
        write_new(&staged.join("cert.pem"), issuer.pem().as_bytes(), 0o644)?;
        let der = issuer.der().clone();
        let not_after = cert_not_after(&der)
            .ok_or_else(|| Error::backend("the new CA certificate has no readable validity"))?;
        Ok(Material {
            key,
            issuer,
            der,
            not_after,
        })
    })();
    match made {
        Ok(material) => Ok((staged, material)),
        Err(e) => {
            let _ = std::fs::remove_dir_all(&staged);
            Err(e)
        }
    }
}

/// One DER element at the start of `input`: (tag, contents, what follows). Short and long
/// definite lengths only, as DER allows.
fn der_element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, &rest[n..])
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

/// A certificate's `notAfter`, read from its DER (`Certificate` → `tbsCertificate` →
/// [version], serial, signature, issuer, `validity`).
fn cert_not_after(der: &[u8]) -> Option<SystemTime> {
    let (_, certificate, _) = der_element(der).filter(|(tag, _, _)| *tag == 0x30)?;
    let (_, tbs, _) = der_element(certificate).filter(|(tag, _, _)| *tag == 0x30)?;
    let mut rest = tbs;
    if rest.first() == Some(&0xa0) {
        rest = der_element(rest)?.2;
    }
    for _ in 0..3 {
        rest = der_element(rest)?.2;
    }
    let (_, validity, _) = der_element(rest).filter(|(tag, _, _)| *tag == 0x30)?;
    let (_, _, after_before) = der_element(validity)?;
    let (tag, text, _) = der_element(after_before)?;
    let digits = std::str::from_utf8(text).ok()?.strip_suffix('Z')?;
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (year, rest) = match (tag, digits.len()) {
        // UTCTime: two-digit years, 1950 to 2049.
        (0x17, 12) => {
            let yy: i32 = digits[..2].parse().ok()?;
            (if yy < 50 { 2000 + yy } else { 1900 + yy }, &digits[2..])
        }
        // GeneralizedTime.
        (0x18, 14) => (digits[..4].parse().ok()?, &digits[4..]),
        _ => return None,
    };
    let field = |i: usize| rest[i..i + 2].parse::<u8>().ok();
    let date =
        time::Date::from_calendar_date(year, time::Month::try_from(field(0)?).ok()?, field(2)?)
            .ok()?;
    let clock = time::Time::from_hms(field(4)?, field(6)?, field(8)?).ok()?;
    Some(
        time::PrimitiveDateTime::new(date, clock)
            .assume_utc()
            .into(),
    )
}

/// Create `path` exclusively with `mode` (never following a link) and write `bytes` durably:
/// a key is private from its first byte, with no window between create and chmod.
pub fn write_new(path: &Path, bytes: &[u8], mode: u32) -> sandcove_core::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| Error::from_io(&e, &format!("create {}", path.display())))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| Error::from_io(&e, &format!("write {}", path.display())))
}

/// Replace `target` (in `dir`) atomically with a new file holding `bytes`, created as
/// [`write_new`] does.
pub fn replace_file(
    dir: &Path,
    target: &Path,
    bytes: &[u8],
    mode: u32,
) -> sandcove_core::Result<()> {
    let temp = dir.join(format!(".write-{}", sandcove_core::random_id(12)));
    write_new(&temp, bytes, mode)?;
    std::fs::rename(&temp, target).map_err(|e| {
        let _ = std::fs::remove_file(&temp);
        Error::from_io(&e, &format!("replace {}", target.display()))
    })
}

fn read_bounded(path: &Path, limit: u64) -> sandcove_core::Result<Vec<u8>> {
    use std::io::Read;
    let file = std::fs::File::open(path)
        .map_err(|e| Error::from_io(&e, &format!("open {}", path.display())))?;
    let mut bytes = Vec::new();
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::from_io(&e, &format!("read {}", path.display())))?;
    if bytes.len() as u64 > limit {
        return Err(Error::invalid(format!(
            "{} is larger than {limit} bytes",
            path.display()
        )));
    }
    Ok(bytes)
}

/// What a listener needs to terminate tunnels: the CA and the connection settings.
pub(super) struct Tunnel {
    pub(super) ca: Arc<SandcoveCa>,
    pub(super) http: hyper::server::conn::http1::Builder,
    pub(super) head_timeout: Duration,
    /// Longest wait for the next byte of a request body inside the tunnel.
    pub(super) body_idle: Duration,
    /// Bounds on answers to requests forwarded to a sandbox port inside the tunnel.
    pub(super) upstream: super::upstream::UpstreamBounds,
}

/// `403` with a one-line reason.
pub(super) fn refuse(reason: String) -> Response {
    (
        StatusCode::FORBIDDEN,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        )],
        format!("{reason}\n"),
    )
        .into_response()
}

/// Answer a `CONNECT`: `200` and a TLS-terminated tunnel served by `app` for a configured
/// host on port 443, `403` for anything else.
pub(super) async fn connect(
    tunnel: Arc<Tunnel>,
    mut request: axum::http::Request<Incoming>,
    app: Router,
) -> Response {
    let target = request.uri().authority().cloned();
    let host = match &target {
        Some(a) if a.port_u16() == Some(443) && tunnel.ca.allows(a.host()) => {
            a.host().to_ascii_lowercase()
        }
        _ => {
            let shown = target
                .as_ref()
                .map(|a| a.as_str().to_string())
                .unwrap_or_else(|| request.uri().to_string());
            return refuse(format!(
                "sandcove: CONNECT {shown} refused: this proxy only serves {} on port 443 (list \
                 other hosts in NO_PROXY)",
                tunnel.ca.hosts().join(", ")
            ));
        }
    };
    let Some(connection) = request.extensions().get::<upgrade::Connection>().cloned() else {
        return refuse("sandcove: CONNECT is served only by the proxy's connection loop".into());
    };
    let config = match tunnel.ca.server_config(&host).await {
        Ok(config) => config,
        Err(e) => {
            tracing::error!("intercepting {host}: {e}");
            return (StatusCode::BAD_GATEWAY, format!("sandcove: {e}\n")).into_response();
        }
    };
    let pending = hyper::upgrade::on(&mut request);
    tokio::spawn(async move {
        let Ok(io) = pending.await else { return };
        let io = hyper_util::rt::TokioIo::new(io);
        // The ClientHello and the handshake share one deadline, like a TLS listener's.
        let handshake = async {
            let start =
                tokio_rustls::LazyConfigAcceptor::new(rustls::server::Acceptor::default(), io)
                    .await
                    .ok()?;
            match start.client_hello().server_name() {
                Some(sni) if !sni.eq_ignore_ascii_case(&host) => return None,
                _ => {}
            }
            start.into_stream(config).await.ok()
        };
        let Ok(Some(stream)) = tokio::time::timeout(tunnel.head_timeout, handshake).await else {
            return;
        };
        let mut stop: watch::Receiver<bool> = connection.stop_signal();
        let service = super::dispatch(
            app,
            connection,
            super::Proxying::InsideTunnel,
            tunnel.body_idle,
            tunnel.upstream,
        );
        let served = tunnel
            .http
            .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
            .with_upgrades();
        tokio::pin!(served);
        tokio::select! {
            _ = served.as_mut() => return,
            _ = stop.wait_for(|stopped| *stopped) => {}
        }
        served.as_mut().graceful_shutdown();
        let _ = served.await;
    });
    Response::new(Body::empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOSTS: &[&str] = &["api.sandcove.test", "run.sandcove.test"];

    /// A self-signed certificate with `names` as its subject.
    fn cert_named(names: &[(rcgen::DnType, &str)]) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::default();
        let mut name = rcgen::DistinguishedName::new();
        for (kind, value) in names {
            name.push(kind.clone(), *value);
        }
        params.distinguished_name = name;
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    /// The hashes `openssl x509 -hash` prints for these subjects (checked once with OpenSSL
    /// 3.0): the CA's own, and one that needs folding (case, runs of white space, ends).
    #[test]
    fn subject_hashes_are_openssls() {
        let ca = cert_named(&[
            (rcgen::DnType::OrganizationName, "Sandcove"),
            (rcgen::DnType::CommonName, CA_NAME),
        ]);
        assert_eq!(openssl_subject_hash(&ca), Some(0xe11d0a73));
        let folded = cert_named(&[
            (rcgen::DnType::OrganizationName, "  Some \t  ORG "),
            (rcgen::DnType::CommonName, "Mixed   Case Name"),
        ]);
        assert_eq!(
            format!("{:08x}", openssl_subject_hash(&folded).unwrap()),
            "228b2bff"
        );
        // Text beyond ASCII is not folded here: no name rather than a wrong one.
        let other = cert_named(&[(rcgen::DnType::CommonName, "Zürich")]);
        assert_eq!(openssl_subject_hash(&other), None);
    }

    #[test]
    fn hashed_names_are_c_rehashs() {
        assert!(is_hashed_name("e11d0a73.0"));
        assert!(is_hashed_name("0123abcd.12"));
        for name in [
            "E11D0A73.0",
            "e11d0a7.0",
            "e11d0a73",
            "e11d0a73.",
            "ca.pem",
            "e11d0a73.r0",
        ] {
            assert!(!is_hashed_name(name), "{name}");
        }
    }

    /// The CA's directory names it under its hash, and `SSL_CERT_DIR` lists it before the
    /// host's hashed roots (where the host has them).
    #[test]
    fn the_ca_is_found_by_its_hash() {
        let tmp =
            std::env::temp_dir().join(format!("sandcove-ca-hash-{}", sandcove_core::random_id(8)));
        std::fs::create_dir(&tmp).unwrap();
        let dir = tmp.join("ca-dir");
        let ca = SandcoveCa::open(&dir, HOSTS).unwrap();
        let hash = openssl_subject_hash(&ca.cert_der()).unwrap();
        let entry = cert_dir_path(&dir).join(format!("{hash:08x}.0"));
        assert_eq!(
            std::fs::read(&entry).unwrap(),
            std::fs::read(ca.cert_path()).unwrap()
        );
        let system = SYSTEM_CERT_DIRS.iter().find(|d| {
            std::fs::read_dir(d).is_ok_and(|mut e| {
                e.any(|e| e.is_ok_and(|e| is_hashed_name(&e.file_name().to_string_lossy())))
            })
        });
        match system {
            Some(system) => assert_eq!(
                ssl_cert_dir(&dir),
                Some(format!("{}:{system}", cert_dir_path(&dir).display()))
            ),
            None => assert_eq!(ssl_cert_dir(&dir), None),
        }
        std::fs::remove_file(&entry).unwrap();
        assert_eq!(
            ssl_cert_dir(&dir),
            None,
            "no entry of ours, no directory list"
        );
        std::fs::remove_dir_all(&tmp).unwrap();
    }

    /// A CA in `dir/ca` that ends at `not_after`, as an older server would have left it.
    fn plant(dir: &Path, not_after: SystemTime) -> CertificateDer<'static> {
        let hosts = normalize_hosts(HOSTS).unwrap();
        std::fs::DirBuilder::new().mode(0o700).create(dir).unwrap();
        let (staged, material) = stage(dir, &hosts, not_after).unwrap();
        std::fs::rename(staged, dir.join("ca")).unwrap();
        material.der
    }

    #[test]
    fn a_ca_close_to_its_end_or_past_it_is_replaced_and_the_bundle_follows() {
        let now = SystemTime::now();
        for (what, not_after) in [
            ("ends in 3 days", now + Duration::from_secs(3 * 24 * 3600)),
            ("ended an hour ago", now - Duration::from_secs(1800)),
        ] {
            let dir = std::env::temp_dir()
                .join(format!("intercept-renew-{}", sandcove_core::random_id(12)));
            let old = plant(&dir, not_after);
            let ca = SandcoveCa::open(&dir, HOSTS).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_ne!(ca.cert_der(), old, "{what}: replaced");
            let on_disk = std::fs::read(ca.cert_path()).unwrap();
            assert_eq!(
                CertificateDer::from_pem_slice(&on_disk).unwrap(),
                ca.cert_der(),
                "{what}: the new CA is on disk"
            );
            let bundle = std::fs::read(ca.bundle_path()).unwrap();
            let roots: Vec<_> = CertificateDer::pem_slice_iter(&bundle)
                .collect::<Result<_, _>>()
                .unwrap();
            assert_eq!(
                roots.last(),
                Some(&ca.cert_der()),
                "{what}: the bundle follows"
            );
            assert!(!roots.contains(&old), "{what}: the old CA left the bundle");
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    #[test]
    fn the_ca_validity_is_read_back_to_the_second() {
        let dir =
            std::env::temp_dir().join(format!("intercept-date-{}", sandcove_core::random_id(12)));
        let end = SystemTime::UNIX_EPOCH + Duration::from_secs(2_000_000_000);
        let der = plant(&dir, end);
        assert_eq!(cert_not_after(&der), Some(end));
        let far = SystemTime::UNIX_EPOCH + Duration::from_secs(4_000_000_000); // 2096
        let der = {
            let _ = std::fs::remove_dir_all(&dir);
            plant(&dir, far)
        };
        assert_eq!(cert_not_after(&der), Some(far), "GeneralizedTime past 2049");
        assert_eq!(
            cert_not_after(&der[..der.len() / 2]),
            None,
            "a truncated certificate"
        );
        assert_eq!(
            cert_not_after(b"\x30\x84\xff\xff\xff\xff"),
            None,
            "a length past the end"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_ca_with_time_left_is_kept() {
        let dir =
            std::env::temp_dir().join(format!("intercept-keep-{}", sandcove_core::random_id(12)));
        let old = plant(
            &dir,
            SystemTime::now() + Duration::from_secs(30 * 24 * 3600),
        );
        let ca = SandcoveCa::open(&dir, HOSTS).unwrap();
        assert_eq!(ca.cert_der(), old);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
