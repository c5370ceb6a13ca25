//! `sandcove tls init`, then `sandcove serve` with what it printed and clients through it (the
//! native API through the Rust HTTP backend with `SANDCOVE_CA_FILE`, and E2B's official
//! Python SDK with `SSL_CERT_FILE`); and each certificate mistake, named in one line by the
//! client and, where the certificate itself is at fault, refused by `serve` at start.

use std::ffi::OsStr;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use sandcove_conformance::{eventually, unique};
use sandcove_tests::PrivateState;

use crate::common::{bin, serve_in_process_with, test_limits, ServeChild};
use crate::http_binary::runnable;
use crate::sdk_harness::{assert_expected, run_python, Server};

/// The native listener's announcement.
const LISTENING: &str = "sandcove serve: listening on";

/// A private directory that is removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(unique(tag));
        std::fs::create_dir(&dir).expect("a scratch directory");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `sandcove ARGS` with `envs`, to the end.
fn sandcove(args: &[&str], envs: &[(&str, &OsStr)]) -> Output {
    let mut command = Command::new(bin());
    command.args(args).stdin(Stdio::null());
    for (k, v) in envs {
        command.env(k, v);
    }
    command.output().expect("run sandcove")
}

/// What `sandcove tls init` printed: the `serve` flags and the `SANDCOVE_CA_FILE` value.
fn printed(stdout: &str) -> (Vec<String>, String) {
    let flags = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("sandcove serve "))
        .expect("the serve line")
        .split_whitespace()
        .map(str::to_string)
        .collect::<Vec<_>>();
    let ca = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("export SANDCOVE_CA_FILE="))
        .expect("the SANDCOVE_CA_FILE line")
        .to_string();
    (flags, ca)
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// `sandcove ls` through the server at `url`, trusting `ca_file` only.
fn ls_through(url: &str, key: &str, ca_file: &Path) -> Output {
    sandcove(
        &["ls"],
        &[
            ("SANDCOVE_URL", OsStr::new(url)),
            ("SANDCOVE_API_KEY", OsStr::new(key)),
            ("SANDCOVE_CA_FILE", ca_file.as_os_str()),
        ],
    )
}

#[test]
fn tls_init_then_serve_and_the_native_client_through_it() {
    if !runnable() {
        return;
    }
    let state = PrivateState::new();
    let key = unique("tls-key");
    let in_state = [("SANDCOVE_STATE_DIR", state.dir.as_os_str())];
    let made = sandcove(&["tls", "init"], &in_state);
    let stdout = String::from_utf8_lossy(&made.stdout).into_owned();
    assert!(
        made.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&made.stderr)
    );
    // The default directory is under the state directory; the keys are private.
    let dir = state.dir.join("tls");
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&dir.join("ca-key.pem")), 0o600);
    assert_eq!(mode(&dir.join("server-key.pem")), 0o600);
    for host in ["localhost", "127.0.0.1"] {
        assert!(stdout.contains(host), "default host {host}: {stdout}");
    }
    let (flags, ca_file) = printed(&stdout);
    assert_eq!(
        flags,
        [
            "--tls-cert",
            &dir.join("server.pem").display().to_string(),
            "--tls-key",
            &dir.join("server-key.pem").display().to_string()
        ]
    );
    assert_eq!(Path::new(&ca_file), dir.join("ca.pem"));

    // Keys are never overwritten without --renew.
    let before = std::fs::read(dir.join("server-key.pem")).unwrap();
    let again = sandcove(&["tls", "init"], &in_state);
    assert_eq!(again.status.code(), Some(1));
    let refusal = String::from_utf8_lossy(&again.stderr);
    assert!(
        refusal.contains("--renew") && refusal.trim().lines().count() == 1,
        "{refusal}"
    );
    assert_eq!(std::fs::read(dir.join("server-key.pem")).unwrap(), before);

    // Served with exactly the printed flags, reached by both default names.
    let serve = |flags: &[String]| {
        let mut args: Vec<&str> = flags.iter().map(String::as_str).collect();
        args.extend(["--listen", "127.0.0.1:0", "--warm-pool", "0"]);
        ServeChild::start(
            &args,
            &[
                ("SANDCOVE_API_KEY", OsStr::new(&key)),
                ("SANDCOVE_STATE_DIR", state.dir.as_os_str()),
            ],
            &[],
            LISTENING,
        )
        .expect("the server announces its listener")
        .drain_stderr()
    };
    let (mut child, url) = serve(&flags);
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    let by_name = url.replace("127.0.0.1", "localhost");
    for url in [&url, &by_name] {
        let listed = ls_through(url, &key, Path::new(&ca_file));
        assert!(
            listed.status.success(),
            "sandcove ls through {url}: {}",
            String::from_utf8_lossy(&listed.stderr)
        );
    }
    let _ = child.kill();
    let _ = child.wait();

    // --renew: a new server certificate and key under the same CA, which clients keep.
    let ca_before = std::fs::read(&ca_file).unwrap();
    let cert_before = std::fs::read(dir.join("server.pem")).unwrap();
    let renewed = sandcove(
        &["tls", "init", "--renew", "--host", "127.0.0.1"],
        &in_state,
    );
    assert!(
        renewed.status.success(),
        "{}",
        String::from_utf8_lossy(&renewed.stderr)
    );
    assert_eq!(std::fs::read(&ca_file).unwrap(), ca_before, "the same CA");
    assert_ne!(std::fs::read(dir.join("server.pem")).unwrap(), cert_before);
    assert_ne!(std::fs::read(dir.join("server-key.pem")).unwrap(), before);
    assert_eq!(mode(&dir.join("server-key.pem")), 0o600);
    let (flags, _) = printed(&String::from_utf8_lossy(&renewed.stdout));
    let (mut child, url) = serve(&flags);
    let listed = ls_through(&url, &key, Path::new(&ca_file));
    assert!(
        listed.status.success(),
        "after --renew: {}",
        String::from_utf8_lossy(&listed.stderr)
    );
    // Renewed for 127.0.0.1 only: `localhost` is now a name mismatch, said so.
    let listed = ls_through(
        &url.replace("127.0.0.1", "localhost"),
        &key,
        Path::new(&ca_file),
    );
    let said = String::from_utf8_lossy(&listed.stderr);
    assert!(
        !listed.status.success() && said.contains("is not valid for localhost"),
        "{said}"
    );
    let _ = child.kill();
    let _ = child.wait();
}

/// E2B's official Python SDK over HTTPS: `SSL_CERT_FILE` names the CA `tls init` made.
#[test]
fn e2b_python_sdk_over_https_with_the_private_ca() {
    if !runnable() {
        return;
    }
    let scratch = Scratch::new("tls-e2b");
    let made = sandcove(
        &["tls", "init", "--dir", &scratch.0.display().to_string()],
        &[],
    );
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let (flags, ca_file) = printed(&String::from_utf8_lossy(&made.stdout));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let server = Server::start_with("e2b", "E2B wire protocol", &unique("tls-e2b-key"), &flags);
    assert!(server.origin.starts_with("https://"), "{}", server.origin);
    let out = run_python(
        "pins-e2b-2.63.0.txt",
        "e2b_quickstart",
        &server,
        &[("SSL_CERT_FILE", &ca_file)],
    );
    assert_expected("e2b_quickstart", &out);
}

/// A key pair and a certificate made for a test, written as PEM files.
struct Made {
    cert: PathBuf,
    key: PathBuf,
    der: Vec<u8>,
    key_der: Vec<u8>,
}

/// A CA for the tests.
struct TestCa {
    key: rcgen::KeyPair,
    cert: rcgen::Certificate,
}

impl TestCa {
    fn new(name: &str) -> TestCa {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::default();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        let cert = params.self_signed(&key).unwrap();
        TestCa { key, cert }
    }
}

const HOUR: Duration = Duration::from_secs(3600);

/// Server certificate parameters as `tls init` makes them, for `names`, valid from `from`
/// to `to`.
fn leaf_params(names: &[&str], from: SystemTime, to: SystemTime) -> rcgen::CertificateParams {
    let mut params =
        rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .unwrap();
    params.is_ca = rcgen::IsCa::ExplicitNoCa;
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    params.not_before = from.into();
    params.not_after = to.into();
    params
}

/// Write `cert` and `key` as `<name>.pem` and `<name>-key.pem` (0600) in `dir`.
fn write(dir: &Path, name: &str, cert: &rcgen::Certificate, key: &rcgen::KeyPair) -> Made {
    let cert_path = dir.join(format!("{name}.pem"));
    let key_path = dir.join(format!("{name}-key.pem"));
    std::fs::write(&cert_path, cert.pem()).unwrap();
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&key_path)
        .unwrap();
    std::io::Write::write_all(&mut file, key.serialize_pem().as_bytes()).unwrap();
    Made {
        cert: cert_path,
        key: key_path,
        der: cert.der().to_vec(),
        key_der: key.serialize_der(),
    }
}

/// `sandcove serve` with `made`: `Err(stderr)` when it refused to start (it must, within the
/// limit), `Ok` when it announced its listener (then it is stopped).
async fn serve_with(made: &Made, state: &Path) -> Result<(), String> {
    let mut child = tokio::process::Command::new(bin())
        .arg("serve")
        .args(["--listen", "127.0.0.1:0", "--warm-pool", "0", "--tls-cert"])
        .arg(&made.cert)
        .arg("--tls-key")
        .arg(&made.key)
        .env("SANDCOVE_API_KEY", "tls-test-key")
        .env("SANDCOVE_STATE_DIR", state)
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start sandcove serve");
    let mut stderr = tokio::io::BufReader::new(child.stderr.take().unwrap());
    let mut said = String::new();
    loop {
        let mut line = String::new();
        let read = tokio::io::AsyncBufReadExt::read_line(&mut stderr, &mut line)
            .await
            .unwrap_or(0);
        if read == 0 {
            break;
        }
        if line.starts_with(LISTENING) {
            let _ = child.kill().await;
            return Ok(());
        }
        said.push_str(&line);
    }
    let status = eventually(Duration::from_secs(30), "serve exits", || {
        let status = child.try_wait();
        async move {
            status
                .map_err(|e| e.to_string())?
                .ok_or_else(|| "running".to_string())
        }
    })
    .await;
    assert_eq!(status.code(), Some(2), "{said}");
    Err(said)
}

/// A TLS listener in this process serving `made` whatever it is (as `serve` would not).
async fn listener_serving(made: &Made) -> (String, tokio::sync::oneshot::Sender<()>) {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![made.der.clone().into()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(made.key_der.clone().into()),
        )
        .unwrap();
    let mut limits = test_limits();
    limits.tls = Some(Arc::new(config));
    let (url, stop) = serve_in_process_with(axum::Router::new(), limits).await;
    (url.replace("http://", "https://"), stop)
}

#[test]
fn each_certificate_mistake_is_named_by_the_client_and_refused_by_serve() {
    if !runnable() {
        return;
    }
    let scratch = Scratch::new("tls-mistakes");
    // Outside the runtime: its cleanup runs a runtime of its own.
    let state = PrivateState::new();
    tokio::runtime::Runtime::new()
        .expect("a runtime")
        .block_on(check_mistakes(&scratch.0, &state.dir));
}

/// The body of [`each_certificate_mistake_is_named_by_the_client_and_refused_by_serve`]:
/// certificates made in `dir`, servers with state directory `state`.
async fn check_mistakes(dir: &Path, state: &Path) {
    let now = SystemTime::now();
    let ca = TestCa::new("trusted test CA");
    let stranger = TestCa::new("untrusted test CA");
    let ca_file = dir.join("ca.pem");
    std::fs::write(&ca_file, ca.cert.pem()).unwrap();
    let valid = (now - HOUR, now + HOUR);
    let signed = |name: &str, params: rcgen::CertificateParams, by: &TestCa| {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &by.cert, &by.key).unwrap();
        write(dir, name, &cert, &key)
    };

    // The usual `openssl req -x509` recipe: a self-signed CA certificate with the right
    // names, given to the client as its own CA file.
    let self_signed_ca = {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = leaf_params(&["localhost", "127.0.0.1"], valid.0, valid.1);
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).unwrap();
        write(dir, "self-signed-ca", &cert, &key)
    };
    let mismatch = signed(
        "mismatch",
        leaf_params(&["elsewhere.test"], valid.0, valid.1),
        &ca,
    );
    let expired = signed(
        "expired",
        leaf_params(&["127.0.0.1"], now - 3 * HOUR, now - HOUR),
        &ca,
    );
    let unknown = signed(
        "unknown",
        leaf_params(&["127.0.0.1"], valid.0, valid.1),
        &stranger,
    );
    let no_san = signed("no-san", leaf_params(&[], valid.0, valid.1), &ca);
    let not_yet = signed(
        "not-yet",
        leaf_params(&["127.0.0.1"], now + HOUR, now + 3 * HOUR),
        &ca,
    );

    // The client's line: (certificate, CA file, what it must say).
    let client_cases: [(&str, &Made, &Path, &[&str]); 4] = [
        (
            "a CA certificate as the server's",
            &self_signed_ca,
            &self_signed_ca.cert,
            &["is a CA certificate", "sandcove tls init", "CA:FALSE"],
        ),
        (
            "a name mismatch",
            &mismatch,
            &ca_file,
            &[
                "is not valid for 127.0.0.1: it names only elsewhere.test",
                "--host 127.0.0.1",
            ],
        ),
        (
            "an expired certificate",
            &expired,
            &ca_file,
            &["expired at", "sandcove tls init --renew"],
        ),
        (
            "an unknown issuer",
            &unknown,
            &ca_file,
            &[
                "signed by a CA this client does not trust",
                "SANDCOVE_CA_FILE",
            ],
        ),
    ];
    for (what, made, trusted, says) in client_cases {
        let (url, stop) = listener_serving(made).await;
        let url_for_ls = url.clone();
        let trusted = trusted.to_path_buf();
        let out = tokio::task::spawn_blocking(move || ls_through(&url_for_ls, "k", &trusted))
            .await
            .unwrap();
        drop(stop);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{what}: {stderr}");
        assert_eq!(
            stderr.trim().lines().count(),
            1,
            "{what}: one line: {stderr}"
        );
        assert!(
            stderr.contains(&format!("the TLS certificate of {url}")),
            "{what}: names the server: {stderr}"
        );
        for said in says {
            assert!(stderr.contains(said), "{what}: says {said:?}: {stderr}");
        }
        assert!(!stderr.contains("OtherError"), "{what}: {stderr}");
    }

    // What `serve` refuses at start, and what it serves (the client decides those).
    let serve_cases: [(&str, &Made, Option<&str>); 6] = [
        (
            "a CA certificate",
            &self_signed_ca,
            Some("it is a CA certificate"),
        ),
        ("no subjectAltName", &no_san, Some("subjectAltName")),
        ("an expired certificate", &expired, Some("it expired on")),
        (
            "a certificate not yet valid",
            &not_yet,
            Some("not valid before"),
        ),
        ("a name mismatch", &mismatch, None),
        ("an unknown issuer", &unknown, None),
    ];
    for (what, made, refusal) in serve_cases {
        let outcome = serve_with(made, state).await;
        match (refusal, outcome) {
            (Some(says), Err(stderr)) => {
                assert_eq!(
                    stderr.trim().lines().count(),
                    1,
                    "{what}: one line: {stderr}"
                );
                assert!(stderr.contains(says), "{what}: says {says:?}: {stderr}");
                assert!(
                    stderr.contains("sandcove tls init"),
                    "{what}: the remedy: {stderr}"
                );
            }
            (None, Ok(())) => {}
            (expected, got) => panic!("{what}: expected refusal {expected:?}, got {got:?}"),
        }
    }
}
