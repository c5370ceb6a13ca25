//! OCI images written by tests, for every package's image tests to share: layers made of files
//! the test names (or a whole root file system's tar, which is then the one layer), an image
//! config with `Env`, `WorkingDir`, `User` and `Cmd`, written as an OCI image layout (what
//! `sandcove image import` takes) or pushed to a registry.
//!
//! [`shell_image`] is the smallest image a sandbox can do work in: the host's own `/bin/sh`
//! and `/bin/bash` with the libraries `ldd` names, a marker file, an environment and a working
//! directory of its own, so a test can tell from inside a sandbox that it runs the image and
//! not the host.
//!
//! ```no_run
//! use sandcove_conformance::images::{shell_image, ImageBuilder};
//! let image = shell_image("marker text").build();
//! image.write_layout(std::path::Path::new("/tmp/layout"));
//! ```

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::json;

/// The OCI media type of an uncompressed layer.
pub const LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
/// The OCI media type of a gzip-compressed layer.
pub const LAYER_TAR_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
/// The OCI media type of an image manifest.
pub const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// The OCI media type of an image config.
pub const CONFIG: &str = "application/vnd.oci.image.config.v1+json";

/// Where [`shell_image`] puts its marker file.
pub const MARKER_PATH: &str = "/etc/sandcove-test-marker";
/// The working directory [`shell_image`] sets.
pub const WORKING_DIR: &str = "/srv/app";
/// The variable [`shell_image`] sets in its `Env`; its value is the marker's text.
pub const MARKER_ENV: &str = "IMAGE_MARKER";

/// `sha256:<hex>` of `bytes`.
pub fn sha256(bytes: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// The host's architecture as OCI names it (`amd64`, `arm64`, …): the store takes images for
/// the host's platform only.
pub fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

/// A layer tar written entry by entry, as root's files (uid and gid 0), with a fixed mtime;
/// a file's missing parent directories are added (mode 0755) before it.
pub struct Layer {
    builder: tar::Builder<Vec<u8>>,
    dirs: BTreeSet<String>,
}

impl Default for Layer {
    fn default() -> Self {
        Layer::new()
    }
}

impl Layer {
    /// An empty layer.
    pub fn new() -> Layer {
        Layer {
            builder: tar::Builder::new(Vec::new()),
            dirs: BTreeSet::new(),
        }
    }

    fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(kind);
        header.set_mode(mode);
        header.set_size(size);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(1_700_000_000);
        header
    }

    /// `path` without its leading `/` (layer names are relative).
    fn relative(path: &str) -> &str {
        path.trim_start_matches('/')
    }

    fn parents(&mut self, path: &str) {
        let mut prefix = String::new();
        let parts: Vec<&str> = path.split('/').collect();
        for part in &parts[..parts.len().saturating_sub(1)] {
            if !prefix.is_empty() {
                prefix.push('/');
            }
            prefix.push_str(part);
            if self.dirs.insert(prefix.clone()) {
                let mut header = Self::header(tar::EntryType::Directory, 0o755, 0);
                self.builder
                    .append_data(&mut header, format!("{prefix}/"), std::io::empty())
                    .expect("a directory entry");
            }
        }
    }

    /// A directory at `path` with `mode`.
    pub fn dir(mut self, path: &str, mode: u32) -> Layer {
        let path = Self::relative(path).trim_end_matches('/');
        self.parents(path);
        if self.dirs.insert(path.to_string()) {
            let mut header = Self::header(tar::EntryType::Directory, mode, 0);
            self.builder
                .append_data(&mut header, format!("{path}/"), std::io::empty())
                .expect("a directory entry");
        }
        self
    }

    /// A regular file at `path` with `mode` holding `content`.
    pub fn file(mut self, path: &str, mode: u32, content: &[u8]) -> Layer {
        let path = Self::relative(path);
        self.parents(path);
        let mut header = Self::header(tar::EntryType::Regular, mode, content.len() as u64);
        self.builder
            .append_data(&mut header, path, content)
            .expect("a file entry");
        self
    }

    /// A symbolic link at `path` to `target`.
    pub fn symlink(mut self, path: &str, target: &str) -> Layer {
        let path = Self::relative(path);
        self.parents(path);
        let mut header = Self::header(tar::EntryType::Symlink, 0o777, 0);
        self.builder
            .append_link(&mut header, path, target)
            .expect("a symlink entry");
        self
    }

    /// The content of the host's file `host` (symlinks followed) at the same path in the
    /// layer, with the host file's permission bits.
    pub fn host_file(self, host: &str) -> Layer {
        use std::os::unix::fs::PermissionsExt;
        let content =
            std::fs::read(host).unwrap_or_else(|e| panic!("cannot read the host's {host}: {e}"));
        let mode = std::fs::metadata(host)
            .map(|m| m.permissions().mode() & 0o7777)
            .unwrap_or(0o755);
        self.file(host, mode, &content)
    }

    /// The host's programs `programs` (absolute paths) with every library `ldd` names for
    /// them, each once, at the paths the host has them (so the dynamic loader finds them
    /// in the image as on the host).
    pub fn host_programs(self, programs: &[&str]) -> Layer {
        let mut files = BTreeSet::new();
        for program in programs {
            files.extend(host_program_files(program));
        }
        files
            .iter()
            .fold(self, |layer, file| layer.host_file(&file.to_string_lossy()))
    }

    /// The uncompressed tar.
    pub fn tar(self) -> Vec<u8> {
        self.builder.into_inner().expect("the layer tar")
    }
}

/// The host's program `program` and every library `ldd` names for it (absolute paths, as the
/// dynamic loader looks them up).
pub fn host_program_files(program: &str) -> Vec<PathBuf> {
    let out = std::process::Command::new("ldd")
        .arg(program)
        .output()
        .unwrap_or_else(|e| panic!("ldd {program}: {e}"));
    let text = String::from_utf8_lossy(&out.stdout);
    let mut files = vec![PathBuf::from(program)];
    for line in text.lines() {
        let path = match line.split_once("=>") {
            Some((_, right)) => right.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(path) = path.filter(|p| p.starts_with('/')) {
            files.push(PathBuf::from(path));
        }
    }
    files
}

/// An image being described: its layers (lowest first) and its config.
#[derive(Clone, Default)]
pub struct ImageBuilder {
    /// (blob, media type, diff id)
    layers: Vec<(Vec<u8>, &'static str, String)>,
    env: Vec<String>,
    working_dir: Option<String>,
    user: Option<String>,
    cmd: Vec<String>,
}

impl ImageBuilder {
    /// An image without layers or config.
    pub fn new() -> ImageBuilder {
        ImageBuilder::default()
    }

    /// A layer made by the test, stored gzip-compressed as registries mostly serve them.
    pub fn layer(self, layer: Layer) -> ImageBuilder {
        self.layer_tar(layer.tar(), true)
    }

    /// A layer from an uncompressed tar (a root file system's tar is a layer as it is),
    /// stored gzip-compressed or as it is.
    pub fn layer_tar(mut self, tar: Vec<u8>, gzip: bool) -> ImageBuilder {
        let diff_id = sha256(&tar);
        let (blob, media_type) = if gzip {
            let mut encoder =
                flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            encoder.write_all(&tar).expect("gzip in memory");
            (encoder.finish().expect("gzip in memory"), LAYER_TAR_GZIP)
        } else {
            (tar, LAYER_TAR)
        };
        self.layers.push((blob, media_type, diff_id));
        self
    }

    /// One `NAME=value` of the config's `Env`.
    pub fn env(mut self, pair: &str) -> ImageBuilder {
        self.env.push(pair.to_string());
        self
    }

    /// The config's `WorkingDir`.
    pub fn working_dir(mut self, dir: &str) -> ImageBuilder {
        self.working_dir = Some(dir.to_string());
        self
    }

    /// The config's `User` (`name`, `uid`, either with `:group`).
    pub fn user(mut self, user: &str) -> ImageBuilder {
        self.user = Some(user.to_string());
        self
    }

    /// The config's `Cmd`.
    pub fn cmd(mut self, argv: &[&str]) -> ImageBuilder {
        self.cmd = argv.iter().map(|s| s.to_string()).collect();
        self
    }

    /// The image's blobs, config and manifest.
    pub fn build(self) -> OciImage {
        let mut config = json!({
            "Env": self.env,
            "Cmd": self.cmd,
        });
        if let Some(dir) = &self.working_dir {
            config["WorkingDir"] = json!(dir);
        }
        if let Some(user) = &self.user {
            config["User"] = json!(user);
        }
        let config = serde_json::to_vec(&json!({
            "architecture": host_arch(),
            "os": "linux",
            "created": "2024-01-02T03:04:05Z",
            "config": config,
            "rootfs": {
                "type": "layers",
                "diff_ids": self.layers.iter().map(|l| l.2.clone()).collect::<Vec<_>>(),
            },
        }))
        .expect("the config as JSON");
        let manifest = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": {"mediaType": CONFIG, "digest": sha256(&config), "size": config.len()},
            "layers": self.layers.iter().map(|(blob, media_type, _)| json!({
                "mediaType": media_type,
                "digest": sha256(blob),
                "size": blob.len(),
            })).collect::<Vec<_>>(),
        }))
        .expect("the manifest as JSON");
        OciImage {
            layers: self.layers.into_iter().map(|(b, t, _)| (b, t)).collect(),
            config,
            manifest,
        }
    }
}

/// An image's bytes: what an OCI layout or a registry holds of it.
#[derive(Clone)]
pub struct OciImage {
    /// The layer blobs (lowest first) and their media types.
    pub layers: Vec<(Vec<u8>, &'static str)>,
    /// The config blob.
    pub config: Vec<u8>,
    /// The manifest.
    pub manifest: Vec<u8>,
}

impl OciImage {
    /// The manifest's digest: the image's identity in a store.
    pub fn digest(&self) -> String {
        sha256(&self.manifest)
    }

    /// Write an OCI image layout of this one image to `dir` (made if missing); its index
    /// names no reference, so an import gives it one (`sandcove image import DIR --tag REF`).
    pub fn write_layout(&self, dir: &Path) {
        let blobs = dir.join("blobs/sha256");
        std::fs::create_dir_all(&blobs).expect("the layout's blob directory");
        let put = |bytes: &[u8]| {
            std::fs::write(blobs.join(&sha256(bytes)["sha256:".len()..]), bytes)
                .expect("a blob of the layout")
        };
        put(&self.config);
        put(&self.manifest);
        for (blob, _) in &self.layers {
            put(blob);
        }
        std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)
            .expect("the layout's oci-layout");
        let index = json!({
            "schemaVersion": 2,
            "manifests": [{"mediaType": MANIFEST, "digest": self.digest(), "size": self.manifest.len()}],
        });
        std::fs::write(
            dir.join("index.json"),
            serde_json::to_vec(&index).expect("the index as JSON"),
        )
        .expect("the layout's index.json");
    }

    /// An `oci-archive` of this one image: its OCI image layout (see
    /// [`OciImage::write_layout`]) as an uncompressed tar, in memory.
    pub fn oci_archive(&self) -> Vec<u8> {
        let mut tar = tar::Builder::new(Vec::new());
        let mut add = |name: &str, bytes: &[u8]| {
            let mut header = tar::Header::new_gnu();
            header.set_size(bytes.len() as u64);
            header.set_mode(0o644);
            header.set_entry_type(tar::EntryType::Regular);
            tar.append_data(&mut header, name, bytes)
                .expect("a tar entry in memory");
        };
        add("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#);
        let index = json!({
            "schemaVersion": 2,
            "manifests": [{"mediaType": MANIFEST, "digest": self.digest(), "size": self.manifest.len()}],
        });
        add(
            "index.json",
            &serde_json::to_vec(&index).expect("the index as JSON"),
        );
        let mut blobs: Vec<&[u8]> = vec![&self.config, &self.manifest];
        blobs.extend(self.layers.iter().map(|(blob, _)| blob.as_slice()));
        for blob in blobs {
            add(
                &format!("blobs/sha256/{}", &sha256(blob)["sha256:".len()..]),
                blob,
            );
        }
        tar.into_inner().expect("the archive in memory")
    }

    /// Push the image to the registry at `host` (`127.0.0.1:5000`, plain HTTP) as
    /// `repository:tag`: every blob in one upload each, then the manifest.
    pub async fn push(&self, host: &str, repository: &str, tag: &str) {
        let client = reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("an HTTP client");
        let mut blobs: Vec<&[u8]> = self.layers.iter().map(|(b, _)| b.as_slice()).collect();
        blobs.push(&self.config);
        for blob in blobs {
            let started = client
                .post(format!("http://{host}/v2/{repository}/blobs/uploads/"))
                .send()
                .await
                .expect("the registry answers");
            assert_eq!(started.status(), 202, "start an upload");
            let location = started.headers()["location"]
                .to_str()
                .expect("an upload location")
                .to_string();
            let location = if location.starts_with('/') {
                format!("http://{host}{location}")
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
                .expect("the registry answers");
            assert_eq!(done.status(), 201, "upload a blob");
        }
        let put = client
            .put(format!("http://{host}/v2/{repository}/manifests/{tag}"))
            .header("Content-Type", MANIFEST)
            .body(self.manifest.clone())
            .send()
            .await
            .expect("the registry answers");
        assert_eq!(put.status(), 201, "push the manifest");
    }
}

/// The smallest image a sandbox does work in, told apart from the host: the host's `/bin/sh`
/// and `/bin/bash` (the shells the facades run commands with) with their libraries, a file
/// at [`MARKER_PATH`] holding `marker` and a newline (writable by every user, so a test can
/// show that a sandbox's write stays in its own layer), `Env` with `PATH` and
/// [`MARKER_ENV`]`=marker`, and [`WORKING_DIR`] as its working directory (a directory in
/// the image). More layers or config can be added to the builder.
pub fn shell_image(marker: &str) -> ImageBuilder {
    let shells: Vec<&str> = ["/bin/sh", "/bin/bash"]
        .into_iter()
        .filter(|p| Path::new(p).exists())
        .collect();
    let layer = Layer::new()
        .host_programs(&shells)
        .file(MARKER_PATH, 0o666, format!("{marker}\n").as_bytes())
        .dir(WORKING_DIR, 0o755);
    ImageBuilder::new()
        .layer(layer)
        .env("PATH=/usr/local/bin:/usr/bin:/bin")
        .env(&format!("{MARKER_ENV}={marker}"))
        .working_dir(WORKING_DIR)
        .cmd(&["/bin/sh"])
}

/// A `docker-registry` (Debian's package of the Distribution registry) on a free loopback
/// port, its storage in a directory of its own removed with it; ended when dropped.
pub struct Registry {
    child: std::process::Child,
    /// `127.0.0.1:PORT`, the registry's host as references name it.
    pub host: String,
    dir: PathBuf,
}

impl Registry {
    /// Start one; `None` where `docker-registry` is not installed. Wait for it with
    /// [`Registry::ready`] before pushing.
    pub fn start() -> Option<Registry> {
        let binary = ["/usr/bin/docker-registry", "/usr/sbin/docker-registry"]
            .into_iter()
            .find(|p| Path::new(p).exists())?;
        let dir = std::env::temp_dir().join(crate::unique("registry"));
        std::fs::create_dir_all(&dir).expect("the registry's directory");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free loopback port")
            .port();
        let config = format!(
            "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  \
             filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n",
            dir.join("data").display()
        );
        std::fs::write(dir.join("config.yml"), config).expect("the registry's config");
        let child = std::process::Command::new(binary)
            .arg("serve")
            .arg(dir.join("config.yml"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start docker-registry");
        Some(Registry {
            child,
            host: format!("127.0.0.1:{port}"),
            dir,
        })
    }

    /// Wait until the registry answers its API's base route.
    pub async fn ready(&self) {
        let http = reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("an HTTP client");
        let url = format!("http://{}/v2/", self.host);
        crate::eventually(crate::PATIENCE, "the registry answers", || async {
            match http.get(&url).send().await {
                Ok(r) if r.status().is_success() => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
