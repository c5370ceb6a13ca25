//! Pulls from a real registry on loopback: Debian's `docker-registry` (the Distribution
//! registry), started by the tests with images they build and push themselves.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use serde_json::json;

use sandcove_image::{Availability, ImageError, LayerState, PullProgress, Store, StoreOptions};

use crate::support::{
    check_rich_layers, eventually, host_arch, rich_layers, sha256, Compression, ImageSpec, Layer,
    TempDir, TestImage,
};

/// A `docker-registry` on 127.0.0.1 with a free port and its storage in a temporary directory.
pub struct Registry {
    child: Child,
    pub host: String,
    _dir: TempDir,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn registry_binary() -> Option<PathBuf> {
    ["/usr/bin/docker-registry", "/usr/sbin/docker-registry"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

impl Registry {
    /// Starts one, or prints a SKIP line and returns `None` where the package is absent.
    pub async fn start() -> Option<Registry> {
        let Some(binary) = registry_binary() else {
            eprintln!("SKIP: docker-registry is not installed (Debian package docker-registry); the registry pull tests need it");
            return None;
        };
        let dir = TempDir::new("registry");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let config = format!(
            "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n",
            dir.path().join("data").display()
        );
        std::fs::write(dir.path().join("config.yml"), config).unwrap();
        let child = Command::new(binary)
            .arg("serve")
            .arg(dir.path().join("config.yml"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let registry = Registry {
            child,
            host: format!("127.0.0.1:{port}"),
            _dir: dir,
        };
        let url = format!("http://{}/v2/", registry.host);
        let client = reqwest::Client::new();
        eventually(
            Duration::from_secs(30),
            "the registry answers /v2/",
            || async {
                match client.get(&url).send().await {
                    Ok(r) if r.status().is_success() => Ok(()),
                    Ok(r) => Err(format!("{}", r.status())),
                    Err(e) => Err(e.to_string()),
                }
            },
        )
        .await;
        Some(registry)
    }

    /// Pushes an image's blobs and manifest under `repository:tag` (the test's own pusher).
    pub async fn push(&self, repository: &str, tag: &str, image: &TestImage) {
        for (blob, _, _) in &image.layers {
            self.push_blob(repository, blob).await;
        }
        self.push_blob(repository, &image.config).await;
        self.push_manifest(repository, tag, &image.manifest_media_type, &image.manifest)
            .await;
    }

    pub async fn push_blob(&self, repository: &str, blob: &[u8]) {
        let client = reqwest::Client::new();
        let started = client
            .post(format!(
                "http://{}/v2/{repository}/blobs/uploads/",
                self.host
            ))
            .send()
            .await
            .unwrap();
        assert_eq!(started.status(), 202, "{:?}", started.text().await);
        let location = started.headers()["location"].to_str().unwrap().to_string();
        let location = if location.starts_with('/') {
            format!("http://{}{location}", self.host)
        } else {
            location
        };
        let separator = if location.contains('?') { '&' } else { '?' };
        let done = client
            .put(format!("{location}{separator}digest={}", sha256(blob)))
            .header("Content-Type", "application/octet-stream")
            .body(blob.to_vec())
            .send()
            .await
            .unwrap();
        assert_eq!(done.status(), 201, "{:?}", done.text().await);
    }

    pub async fn push_manifest(
        &self,
        repository: &str,
        reference: &str,
        media_type: &str,
        manifest: &[u8],
    ) {
        let response = reqwest::Client::new()
            .put(format!(
                "http://{}/v2/{repository}/manifests/{reference}",
                self.host
            ))
            .header("Content-Type", media_type)
            .body(manifest.to_vec())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 201, "{:?}", response.text().await);
    }
}

fn rich_image() -> TestImage {
    let layers = rich_layers();
    TestImage::new(vec![
        (layers[0].clone(), Compression::Gzip),
        (layers[1].clone(), Compression::Zstd),
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_pushed_to_a_real_registry_is_pulled_with_every_kind_of_entry() {
    let Some(registry) = Registry::start().await else {
        return;
    };
    let image = rich_image();
    registry.push("test/rich", "v1", &image).await;
    let root = TempDir::new("pull");
    let store = Store::open(root.path().join("store"), StoreOptions::default()).unwrap();
    let reference = format!("{}/test/rich:v1", registry.host);
    let seen = Mutex::new(Vec::<PullProgress>::new());
    let info = store
        .pull(&reference, &|p| seen.lock().unwrap().push(p))
        .await
        .unwrap();
    assert_eq!(info.digest, image.digest());
    assert_eq!(info.references, vec![reference.clone()]);
    assert_eq!(info.created.as_deref(), Some("2024-01-02T03:04:05Z"));
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    for index in 0..2 {
        let states: Vec<LayerState> = seen
            .iter()
            .filter(|p| p.index == index)
            .map(|p| p.state)
            .collect();
        assert_eq!(states.first(), Some(&LayerState::Waiting), "{states:?}");
        assert!(
            states.contains(&LayerState::Downloading) && states.contains(&LayerState::Unpacking),
            "{states:?}"
        );
        assert_eq!(states.last(), Some(&LayerState::Done), "{states:?}");
        let last = seen.iter().rfind(|p| p.index == index).unwrap();
        assert_eq!(
            (last.done, last.total),
            (
                image.layers[index].0.len() as u64,
                image.layers[index].0.len() as u64
            )
        );
    }
    let resolved = store.resolve(&reference).unwrap();
    assert_eq!(resolved.digest, image.digest());
    check_rich_layers(&resolved.layers);
    assert_eq!(
        resolved.config.env,
        vec![
            "PATH=/usr/bin:/bin".to_string(),
            "GREETING=hello".to_string()
        ]
    );
    assert_eq!(store.check(&reference).await, Availability::Available);
    crate::support::assert_nothing_partial(&root.path().join("store"));

    // Again: every layer is already there.
    let seen = Mutex::new(Vec::<PullProgress>::new());
    store
        .pull(&reference, &|p| seen.lock().unwrap().push(p))
        .await
        .unwrap();
    let states: Vec<LayerState> = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|p| p.state != LayerState::Waiting)
        .map(|p| p.state)
        .collect();
    assert_eq!(states, vec![LayerState::Cached, LayerState::Cached]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn indexes_docker_manifests_and_concurrent_pulls() {
    let Some(registry) = Registry::start().await else {
        return;
    };
    let rich = rich_image();
    // A Docker v2 manifest with a gzip layer shared with the rich image, and an uncompressed one.
    let extra = Layer::new().file("docker-only", 0o644, b"d").tar();
    let docker = TestImage::with(
        vec![
            (rich_layers()[0].clone(), Compression::Gzip),
            (extra, Compression::None),
        ],
        ImageSpec {
            docker_media_types: true,
            ..ImageSpec::default()
        },
    );
    registry.push("test/multi", "docker", &docker).await;
    registry.push("test/multi", "rich", &rich).await;
    // An OCI index: the rich image for this host, the Docker one for another platform.
    let other_arch = if host_arch() == "s390x" {
        "riscv64"
    } else {
        "s390x"
    };
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {"mediaType": docker.manifest_media_type, "digest": docker.digest(), "size": docker.manifest.len(), "platform": {"architecture": other_arch, "os": "linux"}},
            {"mediaType": rich.manifest_media_type, "digest": rich.digest(), "size": rich.manifest.len(), "platform": {"architecture": host_arch(), "os": "linux"}},
        ],
    }))
    .unwrap();
    registry
        .push_manifest(
            "test/multi",
            "v1",
            "application/vnd.oci.image.index.v1+json",
            &index,
        )
        .await;

    let root = TempDir::new("pull-multi");
    let store = Store::open(root.path().join("store"), StoreOptions::default()).unwrap();
    let multi = format!("{}/test/multi:v1", registry.host);
    let docker_ref = format!("{}/test/multi:docker", registry.host);
    assert_eq!(store.check(&multi).await, Availability::Pullable);
    assert_eq!(
        store
            .check(&format!("{}/test/multi:absent", registry.host))
            .await,
        Availability::Unknown
    );
    // Two pulls of one image at once, and a third sharing a layer: all succeed, one copy each.
    let quiet = |_: PullProgress| {};
    let (a, b, c) = tokio::join!(
        store.pull(&multi, &quiet),
        store.pull(&multi, &quiet),
        store.pull(&docker_ref, &quiet)
    );
    let (a, b, c) = (a.unwrap(), b.unwrap(), c.unwrap());
    assert_eq!(a.digest, rich.digest(), "the host's platform is chosen");
    assert_eq!(b.digest, rich.digest());
    assert_eq!(c.digest, docker.digest());
    let details = store.inspect(&multi).unwrap();
    assert_eq!(
        details.index_digest.as_deref(),
        Some(sha256(&index).as_str())
    );
    // The index digest names the image too.
    assert_eq!(
        store
            .resolve(&format!("{}/test/multi@{}", registry.host, sha256(&index)))
            .unwrap()
            .digest,
        rich.digest()
    );
    let docker_layers = store.resolve(&docker_ref).unwrap().layers;
    assert_eq!(
        docker_layers[0],
        store.resolve(&multi).unwrap().layers[0],
        "a shared layer is unpacked once"
    );
    assert!(docker_layers[1].join("docker-only").is_file());
    let layer_dirs = std::fs::read_dir(root.path().join("store/layers"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .count();
    assert_eq!(layer_dirs, 3);
    let missing = store
        .pull(&format!("{}/test/multi:absent", registry.host), &quiet)
        .await;
    assert!(
        matches!(missing, Err(ImageError::NotFound { .. })),
        "{missing:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_pulled_by_digest_is_kept_by_that_reference() {
    let Some(registry) = Registry::start().await else {
        return;
    };
    let image = TestImage::new(vec![(
        Layer::new().file("pinned", 0o644, b"p").tar(),
        Compression::Zstd,
    )]);
    registry.push("test/pinned", "v1", &image).await;
    let root = TempDir::new("pull-digest");
    let store = Store::open(root.path().join("store"), StoreOptions::default()).unwrap();
    let pinned = format!("{}/test/pinned@{}", registry.host, image.digest());
    let info = store.pull(&pinned, &|_| {}).await.unwrap();
    assert_eq!(info.references, vec![pinned.clone()]);
    assert!(
        store.prune().unwrap().images.is_empty(),
        "a digest reference is not dangling"
    );
    assert!(store.resolve(&pinned).unwrap().layers[0]
        .join("pinned")
        .is_file());
    store.remove(&pinned).unwrap();
    assert!(matches!(
        store.resolve(&pinned),
        Err(ImageError::NotFound { .. })
    ));
    assert_eq!(store.prune().unwrap().layers.len(), 1);
}
