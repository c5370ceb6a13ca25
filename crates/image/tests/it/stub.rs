//! A registry stub on loopback that misbehaves on purpose: it stalls, cuts, lies about sizes,
//! serves wrong bytes or malformed manifests, asks for a Bearer token, or stands in as a mirror.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use sandcove_image::{Credential, ImageError, RegistryConfig, Store, StoreOptions};

use crate::support::{
    assert_nothing_partial, sha256, tree, Compression, Layer, TempDir, TestImage,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Blobs {
    Honest,
    /// The first response stops halfway and closes; a `Range` request gets the rest.
    CutOnce,
    /// Every response stops halfway through what it announces.
    AlwaysCut,
    /// Ten bytes, then silence.
    Stall,
    /// Announces and sends more bytes than the descriptor says.
    LongerThanDeclared,
    /// Sends more bytes than the descriptor says without announcing a length.
    UnannouncedExtra,
    /// The right length, one byte changed.
    WrongBytes,
}

struct Stub {
    image: TestImage,
    blobs: Blobs,
    /// `manifests/<key>` overrides: (content type, body).
    manifests: HashMap<String, (String, Vec<u8>)>,
    credential: Option<(String, String)>,
    blob_requests: AtomicUsize,
    range_requests: AtomicUsize,
    port: u16,
}

async fn start(image: TestImage, blobs: Blobs, credential: Option<(&str, &str)>) -> Arc<Stub> {
    start_with(image, blobs, credential, HashMap::new()).await
}

async fn start_with(
    image: TestImage,
    blobs: Blobs,
    credential: Option<(&str, &str)>,
    manifests: HashMap<String, (String, Vec<u8>)>,
) -> Arc<Stub> {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let stub = Arc::new(Stub {
        image,
        blobs,
        manifests,
        credential: credential.map(|(u, p)| (u.to_string(), p.to_string())),
        blob_requests: AtomicUsize::new(0),
        range_requests: AtomicUsize::new(0),
        port: listener.local_addr().unwrap().port(),
    });
    let serving = stub.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serving.clone().serve(stream));
        }
    });
    stub
}

impl Stub {
    fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    async fn serve(self: Arc<Self>, stream: TcpStream) {
        let mut reader = BufReader::new(stream);
        let mut head = Vec::new();
        loop {
            let mut line = String::new();
            // A TLS probe (a ClientHello) is not text: close at once.
            match reader.read_line(&mut line).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            if line == "\r\n" {
                break;
            }
            head.push(line.trim_end().to_string());
        }
        let mut stream = reader.into_inner();
        let Some((method, path)) = head.first().and_then(|l| {
            let mut parts = l.split(' ');
            Some((parts.next()?.to_string(), parts.next()?.to_string()))
        }) else {
            return;
        };
        let header = |name: &str| {
            head.iter().skip(1).find_map(|l| {
                l.split_once(':')
                    .filter(|(n, _)| n.eq_ignore_ascii_case(name))
                    .map(|(_, v)| v.trim().to_string())
            })
        };
        if path.starts_with("/token") {
            let wanted = self.credential.as_ref().map(|(u, p)| {
                format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))
                )
            });
            if header("authorization") == wanted {
                return respond(
                    &mut stream,
                    "200 OK",
                    &[("Content-Type", "application/json")],
                    br#"{"token":"stub-token"}"#,
                    &method,
                )
                .await;
            }
            return respond(&mut stream, "401 Unauthorized", &[], b"", &method).await;
        }
        if self.credential.is_some()
            && header("authorization").as_deref() != Some("Bearer stub-token")
        {
            let challenge = format!(
                r#"Bearer realm="http://{}/token",service="stub",scope="repository:test/app:pull""#,
                self.host()
            );
            return respond(
                &mut stream,
                "401 Unauthorized",
                &[("WWW-Authenticate", &challenge)],
                b"",
                &method,
            )
            .await;
        }
        let Some(rest) = path.strip_prefix("/v2/test/app/") else {
            return respond(
                &mut stream,
                if path == "/v2/" {
                    "200 OK"
                } else {
                    "404 Not Found"
                },
                &[],
                b"",
                &method,
            )
            .await;
        };
        if let Some(key) = rest.strip_prefix("manifests/") {
            if let Some((content_type, body)) = self.manifests.get(key) {
                return respond(
                    &mut stream,
                    "200 OK",
                    &[("Content-Type", content_type)],
                    body,
                    &method,
                )
                .await;
            }
            if key == "v1" || key == self.image.digest() {
                let media_type = self.image.manifest_media_type.clone();
                return respond(
                    &mut stream,
                    "200 OK",
                    &[("Content-Type", &media_type)],
                    &self.image.manifest,
                    &method,
                )
                .await;
            }
            return respond(&mut stream, "404 Not Found", &[], b"", &method).await;
        }
        let Some(digest) = rest.strip_prefix("blobs/") else {
            return respond(&mut stream, "404 Not Found", &[], b"", &method).await;
        };
        if digest == sha256(&self.image.config) {
            return respond(&mut stream, "200 OK", &[], &self.image.config, &method).await;
        }
        let Some((blob, _, _)) = self
            .image
            .layers
            .iter()
            .find(|(b, _, _)| sha256(b) == digest)
        else {
            return respond(&mut stream, "404 Not Found", &[], b"", &method).await;
        };
        self.blob_requests.fetch_add(1, Ordering::SeqCst);
        let start = header("range")
            .and_then(|r| {
                r.strip_prefix("bytes=")
                    .and_then(|r| r.trim_end_matches('-').parse::<usize>().ok())
            })
            .unwrap_or(0);
        if start > 0 {
            self.range_requests.fetch_add(1, Ordering::SeqCst);
        }
        let rest = &blob[start..];
        let status = if start > 0 {
            "206 Partial Content"
        } else {
            "200 OK"
        };
        match self.blobs {
            Blobs::Honest => respond(&mut stream, status, &[], rest, &method).await,
            Blobs::CutOnce if start == 0 => {
                send_partial(&mut stream, status, rest.len(), &rest[..rest.len() / 2]).await
            }
            Blobs::CutOnce => respond(&mut stream, status, &[], rest, &method).await,
            Blobs::AlwaysCut => {
                send_partial(&mut stream, status, rest.len(), &rest[..rest.len() / 2]).await
            }
            Blobs::Stall => {
                send_partial(&mut stream, status, rest.len(), &rest[..10]).await;
                tokio::time::sleep(Duration::from_secs(3600)).await;
            }
            Blobs::LongerThanDeclared => {
                let mut longer = rest.to_vec();
                longer.extend_from_slice(&[0u8; 100]);
                respond(&mut stream, status, &[], &longer, &method).await
            }
            Blobs::UnannouncedExtra => {
                let head = format!("HTTP/1.1 {status}\r\nConnection: close\r\n\r\n");
                let _ = stream.write_all(head.as_bytes()).await;
                let _ = stream.write_all(rest).await;
                let _ = stream.write_all(&[0u8; 100]).await;
                let _ = stream.shutdown().await;
            }
            Blobs::WrongBytes => {
                let mut wrong = rest.to_vec();
                let last = wrong.len() - 1;
                wrong[last] ^= 0xff;
                respond(&mut stream, status, &[], &wrong, &method).await
            }
        }
    }
}

async fn respond(
    stream: &mut TcpStream,
    status: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    method: &str,
) {
    let mut head = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let _ = stream.write_all(head.as_bytes()).await;
    if method != "HEAD" {
        let _ = stream.write_all(body).await;
    }
    let _ = stream.shutdown().await;
}

/// Announces `announced` bytes, sends `sent`, and closes.
async fn send_partial(stream: &mut TcpStream, status: &str, announced: usize, sent: &[u8]) {
    let head =
        format!("HTTP/1.1 {status}\r\nContent-Length: {announced}\r\nConnection: close\r\n\r\n");
    let _ = stream.write_all(head.as_bytes()).await;
    let _ = stream.write_all(sent).await;
    let _ = stream.flush().await;
}

fn test_image() -> TestImage {
    // Incompressible content, so a blob is large enough to cut in half meaningfully.
    let mut noise = vec![0u8; 256 * 1024];
    getrandom::fill(&mut noise).unwrap();
    TestImage::new(vec![(
        Layer::new()
            .file("noise", 0o644, &noise)
            .file("hello", 0o644, b"hi")
            .tar(),
        Compression::Gzip,
    )])
}

fn options(stall: Duration) -> StoreOptions {
    StoreOptions {
        registries: RegistryConfig {
            stall_timeout: stall,
            ..RegistryConfig::default()
        },
        ..StoreOptions::default()
    }
}

async fn pull(
    stub: &Stub,
    options: StoreOptions,
) -> (TempDir, Result<sandcove_image::ImageInfo, ImageError>) {
    let root = TempDir::new("stub");
    let store = Store::open(root.path().join("store"), options).unwrap();
    let result = store
        .pull(&format!("{}/test/app:v1", stub.host()), &|_| {})
        .await;
    (root, result)
}

/// After a refused pull: no layer, no image, nothing partial.
fn assert_empty_store(root: &TempDir) {
    let store = root.path().join("store");
    assert_nothing_partial(&store);
    assert!(
        tree(&store.join("layers")).is_empty(),
        "{:?}",
        tree(&store.join("layers"))
    );
    assert!(tree(&store.join("images")).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_download_is_resumed_with_a_range_request() {
    let stub = start(test_image(), Blobs::CutOnce, None).await;
    let (root, result) = pull(&stub, options(Duration::from_secs(30))).await;
    let info = result.unwrap();
    assert_eq!(info.digest, stub.image.digest());
    assert_eq!(stub.range_requests.load(Ordering::SeqCst), 1);
    let store = Store::open(root.path().join("store"), StoreOptions::default()).unwrap();
    let layers = store.resolve(&info.digest).unwrap().layers;
    assert_eq!(std::fs::read(layers[0].join("hello")).unwrap(), b"hi");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_that_keeps_being_cut_is_a_truncated_error() {
    let stub = start(test_image(), Blobs::AlwaysCut, None).await;
    let (root, result) = pull(&stub, options(Duration::from_secs(30))).await;
    assert!(
        matches!(result, Err(ImageError::Truncated { .. })),
        "{result:?}"
    );
    assert_empty_store(&root);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_download_is_a_stalled_error() {
    let stub = start(test_image(), Blobs::Stall, None).await;
    let (root, result) = pull(&stub, options(Duration::from_secs(1))).await;
    assert!(
        matches!(result, Err(ImageError::Stalled { .. })),
        "{result:?}"
    );
    assert_empty_store(&root);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_sending_more_than_declared_is_refused_at_once() {
    for mode in [Blobs::LongerThanDeclared, Blobs::UnannouncedExtra] {
        let stub = start(test_image(), mode, None).await;
        let (root, result) = pull(&stub, options(Duration::from_secs(30))).await;
        assert!(
            matches!(result, Err(ImageError::SizeMismatch { .. })),
            "{mode:?}: {result:?}"
        );
        assert_eq!(
            stub.blob_requests.load(Ordering::SeqCst),
            1,
            "{mode:?}: not retried"
        );
        assert_empty_store(&root);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blob_with_wrong_bytes_is_a_digest_mismatch() {
    let stub = start(test_image(), Blobs::WrongBytes, None).await;
    let (root, result) = pull(&stub, options(Duration::from_secs(30))).await;
    assert!(
        matches!(result, Err(ImageError::DigestMismatch { .. })),
        "{result:?}"
    );
    assert_empty_store(&root);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_oversized_and_schema1_manifests_are_typed_errors() {
    let image = test_image();
    let mut manifests = HashMap::new();
    manifests.insert(
        "garbage".to_string(),
        (
            "application/vnd.oci.image.manifest.v1+json".to_string(),
            b"{\"schemaVersion\": 2, \"layers\": 7}".to_vec(),
        ),
    );
    manifests.insert(
        "huge".to_string(),
        (
            "application/vnd.oci.image.manifest.v1+json".to_string(),
            vec![b' '; (4 << 20) + 1],
        ),
    );
    manifests.insert(
        "old".to_string(),
        (
            "application/vnd.docker.distribution.manifest.v1+prettyjws".to_string(),
            br#"{"schemaVersion": 1, "fsLayers": []}"#.to_vec(),
        ),
    );
    let stub = start_with(image, Blobs::Honest, None, manifests).await;
    let root = TempDir::new("stub-manifests");
    let store = Store::open(root.path().join("store"), StoreOptions::default()).unwrap();
    let host = stub.host();
    let garbage = store
        .pull(&format!("{host}/test/app:garbage"), &|_| {})
        .await;
    assert!(
        matches!(garbage, Err(ImageError::Malformed { .. })),
        "{garbage:?}"
    );
    let huge = store.pull(&format!("{host}/test/app:huge"), &|_| {}).await;
    assert!(matches!(huge, Err(ImageError::TooLarge { .. })), "{huge:?}");
    let old = store.pull(&format!("{host}/test/app:old"), &|_| {}).await;
    assert!(
        matches!(old, Err(ImageError::Unsupported { .. })),
        "{old:?}"
    );
    assert!(matches!(
        store.pull("UPPER/case", &|_| {}).await,
        Err(ImageError::InvalidReference { .. })
    ));
    assert_empty_store(&root);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bearer_tokens_are_obtained_with_the_configured_credentials() {
    let stub = start(test_image(), Blobs::Honest, Some(("robot", "s3cret"))).await;
    let (root, result) = pull(&stub, options(Duration::from_secs(30))).await;
    assert!(
        matches!(result, Err(ImageError::Unauthorized { .. })),
        "anonymous: {result:?}"
    );
    assert_empty_store(&root);
    let mut with_credentials = options(Duration::from_secs(30));
    with_credentials.registries.credentials.insert(
        stub.host(),
        Credential {
            username: "robot".into(),
            password: "s3cret".into(),
        },
    );
    let (_root, result) = pull(&stub, with_credentials).await;
    assert_eq!(result.unwrap().digest, stub.image.digest());
    let mut wrong = options(Duration::from_secs(30));
    wrong.registries.credentials.insert(
        stub.host(),
        Credential {
            username: "robot".into(),
            password: "guess".into(),
        },
    );
    let (_root, result) = pull(&stub, wrong).await;
    assert!(
        matches!(result, Err(ImageError::Unauthorized { .. })),
        "wrong password: {result:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_serves_a_registry_name() {
    let stub = start(test_image(), Blobs::Honest, None).await;
    let mut options = options(Duration::from_secs(30));
    // `mirror.invalid` itself never resolves: everything must come from the mirror.
    options.registries.mirrors.insert(
        "mirror.invalid".into(),
        vec![format!("http://{}", stub.host())],
    );
    let root = TempDir::new("mirror");
    let store = Store::open(root.path().join("store"), options).unwrap();
    let info = store
        .pull("mirror.invalid/test/app:v1", &|_| {})
        .await
        .unwrap();
    assert_eq!(
        info.references,
        vec!["mirror.invalid/test/app:v1".to_string()]
    );
    // A plain-HTTP mirror on a host that is neither loopback nor listed is refused.
    let mut insecure = StoreOptions::default();
    insecure.registries.mirrors.insert(
        "docker.io".into(),
        vec!["http://mirror.example:5000".into()],
    );
    let store = Store::open(root.path().join("store2"), insecure).unwrap();
    assert!(matches!(
        store.pull("python:3.12", &|_| {}).await,
        Err(ImageError::Malformed { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_pulls_fetch_a_layer_once_and_two_stores_on_one_directory_cooperate() {
    let stub = start(test_image(), Blobs::Honest, None).await;
    let reference = format!("{}/test/app:v1", stub.host());
    let root = TempDir::new("dedup");
    let store = Store::open(root.path().join("store"), options(Duration::from_secs(30))).unwrap();
    let (a, b) = tokio::join!(
        store.pull(&reference, &|_| {}),
        store.pull(&reference, &|_| {})
    );
    assert_eq!(a.unwrap().digest, b.unwrap().digest);
    assert_eq!(
        stub.blob_requests.load(Ordering::SeqCst),
        1,
        "one download for two pulls in one process"
    );

    // Two stores opened on one directory, as two programs would (each its own lock file
    // description): both pulls succeed and the store ends consistent.
    let shared = root.path().join("shared");
    let pulls: Vec<_> = (0..2)
        .map(|_| {
            let store = Store::open(&shared, options(Duration::from_secs(30))).unwrap();
            let reference = reference.clone();
            // Spawned: the pull's future is Send, as a server or an engine needs it to be.
            tokio::spawn(async move {
                let progress = |_: sandcove_image::PullProgress| {};
                store.pull(&reference, &progress).await
            })
        })
        .collect();
    for pull in pulls {
        assert_eq!(pull.await.unwrap().unwrap().digest, stub.image.digest());
    }
    let store = Store::open(&shared, StoreOptions::default()).unwrap();
    assert_eq!(store.list().unwrap().len(), 1);
    assert!(store.resolve(&reference).unwrap().layers[0]
        .join("hello")
        .is_file());
    assert_nothing_partial(&shared);
    let layer_dirs = std::fs::read_dir(shared.join("layers"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .count();
    assert_eq!(layer_dirs, 1);
}
