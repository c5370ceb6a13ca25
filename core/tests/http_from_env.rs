//! `Client::from_env` picks the HTTP backend when `SANDCOVE_URL` is set. One test in its own
//! binary, because it changes the process environment.

use sandcove::client::{API_KEY_ENV, URL_ENV};
use sandcove::{Backend, Client, ErrorCode};
use wiremock::matchers::{header, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

#[tokio::test(flavor = "current_thread")]
async fn the_environment_selects_the_runtime() {
    let server = MockServer::start().await;
    let caps = sandcove::LocalBackend::new().unwrap().capabilities();
    Mock::given(method("GET"))
        .and(path("/v1/capabilities"))
        .and(header("authorization", "Bearer env-key"))
        .respond_with(ResponseTemplate::new(200).set_body_json(caps))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/v1/sandboxes/abc"))
        .respond_with(ResponseTemplate::new(404))
        .mount(&server)
        .await;

    std::env::set_var(URL_ENV, server.uri());
    std::env::set_var(API_KEY_ENV, "env-key");
    let client = Client::from_env().expect("an HTTP client");
    assert_eq!(client.capabilities().backend, "http+unknown", "no I/O yet");
    assert!(client.connect("abc").await.unwrap_err().is_not_found());
    assert_eq!(
        client.capabilities().backend,
        "http+local",
        "learned by connect"
    );

    std::env::remove_var(API_KEY_ENV);
    let err = Client::from_env().unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unauthenticated, "{err}");

    std::env::set_var(URL_ENV, "ftp://nowhere");
    std::env::set_var(API_KEY_ENV, "k");
    assert_eq!(
        Client::from_env().unwrap_err().code(),
        ErrorCode::InvalidArgument
    );

    std::env::remove_var(URL_ENV);
    std::env::remove_var(API_KEY_ENV);
    let client = Client::from_env().expect("the embedded engine");
    assert_eq!(client.capabilities().backend, "local");
}
