//! `sandcove serve` over TLS and `HttpBackend` over https with a private CA; plain http
//! beyond loopback refused before any connection. Its own binary, because it changes the
//! process environment (`SANDCOVE_CA_FILE`, `SANDCOVE_ALLOW_INSECURE_HTTP`).

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use sandcove::backend::http::{ALLOW_INSECURE_HTTP_ENV, CA_FILE_ENV};
use sandcove::server::{load_tls, LocalServer, ServerConfig};
use sandcove::{Backend, Client, Command, ErrorCode, HttpBackend, LocalBackend, ProcessSpec};
use sandcove_conformance::{test_options, unique};

#[tokio::test(flavor = "current_thread")]
async fn https_with_a_private_ca_and_no_clear_text_beyond_loopback() {
    // A self-signed certificate for the loopback address, made here.
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])
        .expect("a certificate");
    let dir = std::env::temp_dir().join(unique("tls"));
    std::fs::create_dir_all(&dir).unwrap();
    let cert_path = dir.join("cert.pem");
    let key_path = dir.join("key.pem");
    std::fs::write(&cert_path, cert.cert.pem()).unwrap();
    std::fs::write(&key_path, cert.key_pair.serialize_pem()).unwrap();
    std::fs::set_permissions(&key_path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = load_tls(&cert_path, &key_path).expect_err("a key readable by others");
    assert_eq!(err.code(), ErrorCode::PermissionDenied, "{err}");
    std::fs::set_permissions(&key_path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let tls = load_tls(&cert_path, &key_path).expect("load the certificate and key");

    let engine: Arc<dyn Backend> = Arc::new(LocalBackend::new().unwrap());
    let key = unique("key");
    let mut config = ServerConfig::new(key.as_str());
    config.tls = Some(tls);
    let server = LocalServer::start(engine, config).await.expect("serve TLS");
    assert!(
        server.url().starts_with("https://127.0.0.1:"),
        "{}",
        server.url()
    );

    // Without the CA the server is not trusted.
    std::env::remove_var(CA_FILE_ENV);
    let untrusted = HttpBackend::new(&server.url(), &key).unwrap();
    assert!(
        untrusted.refresh_capabilities().await.is_err(),
        "a self-signed server is not trusted by default"
    );

    // With it, a real sandbox command runs over https.
    std::env::set_var(CA_FILE_ENV, &cert_path);
    let backend = HttpBackend::connect(&server.url(), &key)
        .await
        .expect("connect over https");
    let client = Client::new(Arc::new(backend));
    let sandbox = client
        .create(test_options(&unique("tls")))
        .await
        .expect("create");
    let out = sandbox
        .run(ProcessSpec::new(Command::sh("echo over-tls")))
        .await
        .expect("run");
    assert_eq!(out.stdout, b"over-tls\n");
    sandbox.destroy().await.expect("destroy");
    std::env::remove_var(CA_FILE_ENV);

    // Plain http beyond loopback: refused when the backend is built, so nothing is sent
    // (the name does not even need to resolve).
    for url in [
        "http://sandcove.example:1",
        "http://10.0.0.1:8730",
        "http://[fe80::1]:1",
    ] {
        let err = HttpBackend::new(url, &key).expect_err(url);
        assert_eq!(err.code(), ErrorCode::InvalidArgument, "{url}: {err}");
        assert!(
            err.to_string().contains("--tls-cert"),
            "names the remedy: {err}"
        );
        assert!(err.to_string().contains(ALLOW_INSECURE_HTTP_ENV), "{err}");
    }
    std::env::set_var(sandcove::client::URL_ENV, "http://sandcove.example:1");
    std::env::set_var(sandcove::client::API_KEY_ENV, &key);
    assert_eq!(
        Client::from_env().unwrap_err().code(),
        ErrorCode::InvalidArgument
    );
    // Loopback stays allowed, and the explicit opt-in allows the rest.
    for url in [
        "http://127.0.0.1:1",
        "http://127.1.2.3:1",
        "http://[::1]:1",
        "http://localhost:1",
    ] {
        HttpBackend::new(url, &key).unwrap_or_else(|e| panic!("{url}: {e}"));
    }
    std::env::set_var(ALLOW_INSECURE_HTTP_ENV, "1");
    HttpBackend::new("http://sandcove.example:1", &key).expect("explicitly allowed");
    std::env::remove_var(ALLOW_INSECURE_HTTP_ENV);
    std::env::remove_var(sandcove::client::URL_ENV);
    std::env::remove_var(sandcove::client::API_KEY_ENV);
    server.stop().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
