//! Hardening, the intercepting `CONNECT` proxy (`sandcove::server::intercept`): tunnels only
//! to the configured hosts, a CA whose name constraints really hold for a verifier, a private
//! key that is private from its creation, and the listener's bounds inside a tunnel.
//!
//! Every name used here is under `.test` and only ever reaches the proxy on loopback (the
//! client asks the proxy to connect; nothing resolves it).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::http::header;
use axum::Router;
use rustls::client::danger::ServerCertVerifier;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use sandcove::server::intercept::{SandcoveCa, CA_NAME};
use sandcove::server::{serve_router_intercepting, ConnectionLimits};
use sandcove::ErrorCode;
use sandcove_conformance::{unique, PATIENCE};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const HOSTS: &[&str] = &["api.sandcove.test", "run.sandcove.test"];

/// A fresh CA directory, removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new(tag: &str) -> Dir {
        Dir(std::env::temp_dir().join(unique(&format!("intercept-{tag}"))))
    }
    fn ca(&self) -> PathBuf {
        self.0.join("ca-dir")
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A router that says which host and path it was asked for; `POST /read` reads its body
/// whole, `GET /huge` answers 64 MiB.
fn echo_router() -> Router {
    let huge = || async {
        let chunks = (0..64).map(|_| Ok::<_, std::io::Error>(vec![0u8; 1024 * 1024]));
        axum::body::Body::from_stream(futures::stream::iter(chunks))
    };
    Router::new()
        .route(
            "/read",
            axum::routing::post(|body: axum::body::Bytes| async move { body.len().to_string() }),
        )
        .route("/huge", axum::routing::get(huge))
        .fallback(|request: Request| async move {
            let host = request
                .headers()
                .get(header::HOST)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("-")
                .to_string();
            let query = request.uri().query().unwrap_or("").to_string();
            format!("{host} {} {query}", request.uri().path())
        })
}

fn limits(max_connections: usize, head_timeout: Duration) -> ConnectionLimits {
    ConnectionLimits {
        max_connections,
        head_timeout,
        body_idle_timeout: Duration::from_secs(60),
        write_stall_timeout: Duration::from_secs(60),
        upstream_answer_timeout: Duration::from_secs(60),
        shutdown_grace: Duration::from_secs(1),
        tls: None,
    }
}

/// Serve `echo_router` with the proxy on a loopback port.
async fn start(
    ca: Arc<SandcoveCa>,
    limits: ConnectionLimits,
) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(serve_router_intercepting(
        listener,
        echo_router(),
        limits,
        ca,
        async move {
            let _ = stopped.await;
        },
    ));
    (addr, stop)
}

/// A reqwest client that trusts only `roots` (PEM) and sends https through the proxy.
fn client(proxy: std::net::SocketAddr, roots: &[u8]) -> reqwest::Client {
    let mut builder = reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .proxy(reqwest::Proxy::https(format!("http://{proxy}")).unwrap())
        .timeout(PATIENCE);
    for cert in reqwest::Certificate::from_pem_bundle(roots).expect("PEM roots") {
        builder = builder.add_root_certificate(cert);
    }
    builder.build().unwrap()
}

/// Send `CONNECT target` on a fresh connection; the status line and the connection.
async fn raw_connect(proxy: std::net::SocketAddr, target: &str) -> (String, TcpStream) {
    let mut tcp = TcpStream::connect(proxy).await.unwrap();
    tcp.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let head = read_head(&mut tcp).await;
    (head, tcp)
}

/// Read up to the end of a response head (`\r\n\r\n`), byte by byte so nothing of the tunnel
/// is consumed.
async fn read_head<S: tokio::io::AsyncRead + Unpin>(stream: &mut S) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match tokio::time::timeout(PATIENCE, stream.read(&mut byte)).await {
            Ok(Ok(1)) => head.push(byte[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// TLS over an established tunnel, trusting only `ca`.
async fn tls_over(
    tcp: TcpStream,
    ca: &SandcoveCa,
    sni: &str,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.cert_der()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    connector
        .connect(ServerName::try_from(sni.to_string()).unwrap(), tcp)
        .await
}

#[tokio::test]
async fn intercepted_https_reaches_the_router_with_its_host_and_path() {
    let dir = Dir::new("reach");
    let ca = SandcoveCa::open(dir.ca(), HOSTS).expect("create the CA");
    let (addr, _stop) = start(ca.clone(), limits(16, Duration::from_secs(10))).await;

    // The CA alone as the root.
    let ca_pem = std::fs::read(ca.cert_path()).unwrap();
    let http = client(addr, &ca_pem);
    for host in HOSTS {
        let answer = http
            .get(format!("https://{host}/v0/sandboxes?limit=2"))
            .send()
            .await
            .unwrap_or_else(|e| panic!("{host} through the proxy: {e:?}"));
        assert_eq!(answer.status(), 200);
        assert_eq!(
            answer.text().await.unwrap(),
            format!("{host} /v0/sandboxes limit=2")
        );
    }

    // The bundle as the only roots works too, and carries the host's public roots.
    let bundle = std::fs::read(ca.bundle_path()).unwrap();
    let answer = client(addr, &bundle)
        .get("https://api.sandcove.test/bundle")
        .send()
        .await
        .expect("through the proxy with the bundle");
    assert_eq!(answer.text().await.unwrap(), "api.sandcove.test /bundle ");
    let roots = rustls_pki_types::pem::PemObject::pem_slice_iter(&bundle)
        .collect::<Result<Vec<CertificateDer<'static>>, _>>()
        .expect("the bundle parses");
    assert_eq!(roots.last(), Some(&ca.cert_der()), "the CA comes last");
    if let Some(system) = ca.system_roots() {
        let system = std::fs::read(system).unwrap();
        let count = rustls_pki_types::pem::PemObject::pem_slice_iter(&system)
            .filter(|c: &Result<CertificateDer<'static>, _>| c.is_ok())
            .count();
        assert_eq!(roots.len(), count + 1, "every system root plus the CA");
    } else {
        eprintln!("no system CA bundle on this host: the bundle holds only the Sandcove CA");
    }

    // Plain requests on the same port still reach the router.
    let plain = reqwest::Client::builder().no_proxy().build().unwrap();
    let answer = plain
        .get(format!("http://{addr}/plain"))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.text().await.unwrap(), format!("{addr} /plain "));
}

#[tokio::test]
async fn a_connect_to_a_foreign_host_or_port_is_refused() {
    let dir = Dir::new("foreign");
    let ca = SandcoveCa::open(dir.ca(), HOSTS).expect("create the CA");
    let (addr, _stop) = start(ca.clone(), limits(16, Duration::from_secs(10))).await;

    for target in [
        "evil.test:443",
        "api.sandcove.test:8443",
        "api.sandcove.test:80",
        "127.0.0.1:443",
        "sub.api.sandcove.test:443",
    ] {
        let (head, mut tcp) = raw_connect(addr, target).await;
        assert!(head.starts_with("HTTP/1.1 403"), "{target}: {head}");
        let mut body = vec![0u8; 512];
        let n = tokio::time::timeout(PATIENCE, tcp.read(&mut body))
            .await
            .unwrap()
            .unwrap();
        let body = String::from_utf8_lossy(&body[..n]).into_owned();
        assert!(
            body.contains("refused") && body.contains("NO_PROXY") && body.ends_with('\n'),
            "{target}: a one-line reason: {body:?}"
        );
        assert_eq!(body.lines().count(), 1, "{body:?}");
    }

    // An SDK's HTTP stack sees the refusal as an error, never a response from elsewhere.
    let ca_pem = std::fs::read(ca.cert_path()).unwrap();
    let err = client(addr, &ca_pem)
        .get("https://evil.test/")
        .send()
        .await
        .expect_err("a foreign host through the proxy");
    assert!(err.is_connect(), "{err:?}");

    // A CONNECT inside a tunnel is refused as well.
    let (head, tcp) = raw_connect(addr, "api.sandcove.test:443").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut tls = tls_over(tcp, &ca, "api.sandcove.test").await.unwrap();
    tls.write_all(b"CONNECT evil.test:443 HTTP/1.1\r\nHost: evil.test:443\r\n\r\n")
        .await
        .unwrap();
    let head = read_head(&mut tls).await;
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
}

/// The CA's issuer, rebuilt from its key file as anyone holding the key could.
fn issuer_from_key(ca: &SandcoveCa) -> (rcgen::Certificate, rcgen::KeyPair) {
    let pem = std::fs::read_to_string(ca.key_path()).unwrap();
    let key = rcgen::KeyPair::from_pem(&pem).unwrap();
    let mut params = rcgen::CertificateParams::default();
    let mut name = rcgen::DistinguishedName::new();
    name.push(rcgen::DnType::OrganizationName, "Sandcove");
    name.push(rcgen::DnType::CommonName, CA_NAME);
    params.distinguished_name = name;
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign];
    (params.self_signed(&key).unwrap(), key)
}

fn leaf_for(
    san: rcgen::SanType,
    issuer: &rcgen::Certificate,
    issuer_key: &rcgen::KeyPair,
) -> rcgen::Certificate {
    let mut params = rcgen::CertificateParams::default();
    params.subject_alt_names = vec![san];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    let key = rcgen::KeyPair::generate().unwrap();
    params.signed_by(&key, issuer, issuer_key).unwrap()
}

fn verify(
    ca: &SandcoveCa,
    leaf: &CertificateDer<'static>,
    intermediates: &[CertificateDer<'static>],
    name: &str,
) -> Result<(), rustls::Error> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.cert_der()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier =
        rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .unwrap();
    let name = ServerName::try_from(name.to_string()).unwrap();
    verifier
        .verify_server_cert(leaf, intermediates, &name, &[], UnixTime::now())
        .map(|_| ())
}

#[tokio::test]
async fn the_ca_signs_only_for_its_hosts() {
    let dir = Dir::new("constrained");
    let ca = SandcoveCa::open(dir.ca(), HOSTS).expect("create the CA");
    let (issuer, key) = issuer_from_key(&ca);
    let dns = |n: &str| rcgen::SanType::DnsName(n.try_into().unwrap());

    // Control: a leaf for a permitted name, signed the same way, verifies.
    let good = leaf_for(dns("api.sandcove.test"), &issuer, &key);
    verify(&ca, good.der(), &[], "api.sandcove.test").expect("a permitted name verifies");

    // Anything else signed with the CA's own key fails at the verifier.
    for name in ["evil.test", "sandcove.test", "api.blaxel.ai"] {
        let leaf = leaf_for(dns(name), &issuer, &key);
        let err = verify(&ca, leaf.der(), &[], name).expect_err(name);
        assert!(
            format!("{err:?}").contains("NameConstraintViolation"),
            "{name}: {err:?}"
        );
    }
    let ip = leaf_for(
        rcgen::SanType::IpAddress("127.0.0.1".parse().unwrap()),
        &issuer,
        &key,
    );
    let err = verify(&ca, ip.der(), &[], "127.0.0.1").expect_err("an IP address");
    assert!(
        format!("{err:?}").contains("NameConstraintViolation"),
        "{err:?}"
    );

    // Through an intermediate CA signed with the same key, the constraint still holds.
    let mut params = rcgen::CertificateParams::default();
    let mut name = rcgen::DistinguishedName::new();
    name.push(rcgen::DnType::CommonName, "intermediate");
    params.distinguished_name = name;
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign];
    params.use_authority_key_identifier_extension = true;
    let middle_key = rcgen::KeyPair::generate().unwrap();
    let middle = params.signed_by(&middle_key, &issuer, &key).unwrap();
    let evil = leaf_for(dns("evil.test"), &middle, &middle_key);
    let err = verify(&ca, evil.der(), &[middle.der().clone()], "evil.test")
        .expect_err("a foreign name through an intermediate");
    assert!(
        format!("{err:?}").contains("NameConstraintViolation"),
        "{err:?}"
    );

    // OpenSSL (the Python SDKs' verifier) agrees, and also enforces the path length of 0
    // that webpki leaves to the name constraints: no intermediate at all.
    if let Some(openssl) = openssl() {
        let files = dir.0.join("openssl");
        std::fs::create_dir_all(&files).unwrap();
        let pem = |name: &str, cert: &rcgen::Certificate| {
            let path = files.join(name);
            std::fs::write(&path, cert.pem()).unwrap();
            path
        };
        let good = pem("good.pem", &good);
        let evil_direct = pem(
            "evil-direct.pem",
            &leaf_for(dns("evil.test"), &issuer, &key),
        );
        let through = pem(
            "through.pem",
            &leaf_for(dns("api.sandcove.test"), &middle, &middle_key),
        );
        let middle = pem("middle.pem", &middle);
        let run = |leaf: &PathBuf, untrusted: Option<&PathBuf>| {
            let mut cmd = std::process::Command::new(&openssl);
            cmd.arg("verify").arg("-CAfile").arg(ca.cert_path());
            if let Some(u) = untrusted {
                cmd.arg("-untrusted").arg(u);
            }
            let out = cmd.arg(leaf).output().expect("run openssl");
            (
                out.status.success(),
                String::from_utf8_lossy(&out.stdout).into_owned()
                    + &String::from_utf8_lossy(&out.stderr),
            )
        };
        let (ok, text) = run(&good, None);
        assert!(ok, "openssl: a permitted leaf: {text}");
        let (ok, text) = run(&evil_direct, None);
        assert!(
            !ok && text.contains("subtree"),
            "openssl: a foreign name: {text}"
        );
        let (ok, text) = run(&through, Some(&middle));
        assert!(
            !ok && text.contains("path length"),
            "openssl: an intermediate: {text}"
        );
    } else {
        eprintln!("SKIPPED the OpenSSL half: no openssl binary on PATH");
    }

    // The constraint is marked critical (OID 2.5.29.30, then BOOLEAN TRUE), so a verifier
    // that does not understand it must reject the CA rather than ignore it.
    let der = ca.cert_der();
    let critical = [0x06, 0x03, 0x55, 0x1d, 0x1e, 0x01, 0x01, 0xff];
    assert!(
        der.windows(critical.len()).any(|w| w == critical),
        "critical NameConstraints in the CA certificate"
    );
    // Basic constraints: a CA, path length 0 (SEQUENCE { TRUE, INTEGER 0 }).
    let path_len_zero = [0x30, 0x06, 0x01, 0x01, 0xff, 0x02, 0x01, 0x00];
    assert!(
        der.windows(path_len_zero.len()).any(|w| w == path_len_zero),
        "pathlen 0 in the CA certificate"
    );
}

fn openssl() -> Option<PathBuf> {
    let out = std::process::Command::new("openssl")
        .arg("version")
        .output()
        .ok()?;
    out.status.success().then(|| PathBuf::from("openssl"))
}

#[tokio::test]
async fn the_ca_key_is_private_from_creation_and_a_looser_one_is_refused() {
    let dir = Dir::new("key");
    let ca = SandcoveCa::open(dir.ca(), HOSTS).expect("create the CA");
    let key = std::fs::metadata(ca.key_path()).unwrap();
    assert_eq!(key.mode() & 0o777, 0o600, "key mode");
    let ca_dir = std::fs::metadata(dir.ca()).unwrap();
    assert_eq!(ca_dir.mode() & 0o777, 0o700, "CA directory mode");
    let first = ca.cert_der();

    // Opened again: the same CA, not a new one.
    let again = SandcoveCa::open(dir.ca(), HOSTS).expect("open the CA again");
    assert_eq!(again.cert_der(), first);

    // A key readable by others is refused, never used or silently replaced.
    std::fs::set_permissions(ca.key_path(), std::fs::Permissions::from_mode(0o640)).unwrap();
    let err = SandcoveCa::open(dir.ca(), HOSTS).expect_err("a key readable by the group");
    assert_eq!(err.code(), ErrorCode::PermissionDenied, "{err}");
    std::fs::set_permissions(ca.key_path(), std::fs::Permissions::from_mode(0o600)).unwrap();

    // A CA made for other hosts cannot serve these: an error naming the directory.
    let err = SandcoveCa::open(dir.ca(), &["api.other.test"]).expect_err("other hosts");
    assert_eq!(err.code(), ErrorCode::Unavailable, "{err}");
    assert!(
        err.to_string().contains(&dir.ca().display().to_string()),
        "{err}"
    );
    assert_eq!(
        SandcoveCa::open(dir.ca(), HOSTS).unwrap().cert_der(),
        first,
        "still the same CA"
    );

    // Deleting the directory removes the CA; the next open makes a new one.
    std::fs::remove_dir_all(dir.ca()).unwrap();
    let fresh = SandcoveCa::open(dir.ca(), HOSTS).expect("a new CA");
    assert_ne!(fresh.cert_der(), first);
}

#[tokio::test]
async fn the_listener_bounds_hold_inside_a_tunnel() {
    let dir = Dir::new("bounds");
    let ca = SandcoveCa::open(dir.ca(), HOSTS).expect("create the CA");
    let head_timeout = Duration::from_secs(2);
    let (addr, _stop) = start(ca.clone(), limits(1, head_timeout)).await;

    // An oversized request head inside the tunnel is refused.
    let (head, tcp) = raw_connect(addr, "api.sandcove.test:443").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut tls = tls_over(tcp, &ca, "api.sandcove.test").await.unwrap();
    let big = "x".repeat(1024 * 1024);
    let request = format!("GET /big HTTP/1.1\r\nHost: api.sandcove.test\r\nX-Big: {big}\r\n\r\n");
    // The server may stop reading before all of it is sent.
    let _ = tls.write_all(request.as_bytes()).await;
    let head = read_head(&mut tls).await;
    assert!(head.starts_with("HTTP/1.1 431"), "{head:?}");
    drop(tls);

    // The wrong name inside the tunnel: no handshake.
    let (head, tcp) = raw_connect(addr, "api.sandcove.test:443").await;
    assert!(head.starts_with("HTTP/1.1 200"));
    assert!(
        tls_over(tcp, &ca, "run.sandcove.test").await.is_err(),
        "SNI must match the CONNECT host"
    );

    // An open tunnel holds the only slot: a second connection is not served meanwhile.
    let (head, tcp) = raw_connect(addr, "api.sandcove.test:443").await;
    assert!(head.starts_with("HTTP/1.1 200"));
    let mut tls = tls_over(tcp, &ca, "api.sandcove.test").await.unwrap();
    tls.write_all(b"GET /first HTTP/1.1\r\nHost: api.sandcove.test\r\n\r\n")
        .await
        .unwrap();
    assert!(read_head(&mut tls).await.starts_with("HTTP/1.1 200"));
    let mut second = TcpStream::connect(addr).await.unwrap();
    second
        .write_all(b"GET /second HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut byte = [0u8; 1];
    assert!(
        tokio::time::timeout(Duration::from_millis(500), second.read(&mut byte))
            .await
            .is_err(),
        "a second connection was served while the tunnel held the only slot"
    );

    // The tunnel idles past the head deadline and is closed; then the second is served.
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(PATIENCE, tls.read_to_end(&mut rest)).await;
    assert!(
        closed.is_ok(),
        "an idle tunnel is closed after the head deadline"
    );
    let head = read_head(&mut second).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head:?}");
}

/// The body idle and write-stall bounds hold inside a tunnel: a body that stops coming closes
/// the tunnel, and so does a client that stops reading an answer, freeing its slot of the
/// cap for the next connection.
#[tokio::test]
async fn stalled_bodies_and_readers_are_cut_inside_a_tunnel() {
    let dir = Dir::new("stall");
    let ca = SandcoveCa::open(dir.ca(), HOSTS).expect("create the CA");
    // The head deadline is far away: only the stall bounds can end these tunnels.
    let mut limits = limits(1, PATIENCE * 4);
    limits.body_idle_timeout = Duration::from_millis(300);
    limits.write_stall_timeout = Duration::from_millis(300);
    let (addr, _stop) = start(ca.clone(), limits).await;

    let (head, tcp) = raw_connect(addr, "api.sandcove.test:443").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut tls = tls_over(tcp, &ca, "api.sandcove.test").await.unwrap();
    tls.write_all(
        b"POST /read HTTP/1.1\r\nHost: api.sandcove.test\r\nContent-Length: 1000\r\n\r\nten bytes.",
    )
    .await
    .unwrap();
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(PATIENCE, tls.read_to_end(&mut rest)).await;
    assert!(closed.is_ok(), "a stalled body inside a tunnel closes it");
    assert!(
        !rest.starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&rest)
    );

    let (head, tcp) = raw_connect(addr, "api.sandcove.test:443").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut tls = tls_over(tcp, &ca, "api.sandcove.test").await.unwrap();
    tls.write_all(b"GET /huge HTTP/1.1\r\nHost: api.sandcove.test\r\n\r\n")
        .await
        .unwrap();
    // Never read: once the tunnel is cut, the only slot serves the next connection.
    let mut second = TcpStream::connect(addr).await.unwrap();
    second
        .write_all(b"GET /second HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let head = read_head(&mut second).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head:?}");
    drop(tls);
}
