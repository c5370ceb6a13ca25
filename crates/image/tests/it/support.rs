//! Helpers: temporary directories, layers and images written by the tests, OCI layouts,
//! archives, and the waiting helper.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::json;

/// Poll `check` until it returns `Ok`, or panic once `limit` has passed (the repository's
/// `eventually`, which lives in a crate this one must not depend on).
pub async fn eventually<T, E, F, Fut>(limit: Duration, what: &str, mut check: F) -> T
where
    E: std::fmt::Debug,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let start = Instant::now();
    loop {
        let last = match check().await {
            Ok(value) => return value,
            Err(e) => e,
        };
        if start.elapsed() >= limit {
            panic!("{what}: not true after {limit:?}; last seen: {last:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A directory removed (whatever modes its tree has) when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(what: &str) -> TempDir {
        let mut random = [0u8; 6];
        getrandom::fill(&mut random).unwrap();
        let name: String = random.iter().map(|b| format!("{b:02x}")).collect();
        let path = std::env::temp_dir().join(format!("sandcove-image-{what}-{name}"));
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

fn open_up(path: &Path) {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if meta.is_dir() {
            let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700));
            if let Ok(entries) = std::fs::read_dir(path) {
                for entry in entries.flatten() {
                    open_up(&entry.path());
                }
            }
        }
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        open_up(&self.0);
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn sha256(bytes: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// A layer tar written entry by entry; names are written raw, so hostile ones can be made.
pub struct Layer {
    builder: tar::Builder<Vec<u8>>,
}

impl Default for Layer {
    fn default() -> Self {
        Layer::new()
    }
}

impl Layer {
    pub fn new() -> Layer {
        Layer {
            builder: tar::Builder::new(Vec::new()),
        }
    }

    fn header(name: &str, kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
        let mut header = tar::Header::new_ustar();
        let bytes = name.as_bytes();
        assert!(bytes.len() <= 100, "test names fit the ustar name field");
        header.as_old_mut().name[..bytes.len()].copy_from_slice(bytes);
        header.set_entry_type(kind);
        header.set_mode(mode);
        header.set_size(size);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(1_700_000_000);
        header
    }

    fn append(mut self, mut header: tar::Header, data: &[u8]) -> Layer {
        header.set_cksum();
        self.builder.append(&header, data).unwrap();
        self
    }

    pub fn dir(self, name: &str, mode: u32) -> Layer {
        let header = Self::header(name, tar::EntryType::Directory, mode, 0);
        self.append(header, &[])
    }

    pub fn file(self, name: &str, mode: u32, content: &[u8]) -> Layer {
        self.owned_file(name, mode, 0, 0, content)
    }

    pub fn owned_file(self, name: &str, mode: u32, uid: u64, gid: u64, content: &[u8]) -> Layer {
        let mut header = Self::header(name, tar::EntryType::Regular, mode, content.len() as u64);
        header.set_uid(uid);
        header.set_gid(gid);
        self.append(header, content)
    }

    fn link(self, name: &str, kind: tar::EntryType, target: &str) -> Layer {
        let mut header = Self::header(name, kind, 0o777, 0);
        let bytes = target.as_bytes();
        header.as_old_mut().linkname[..bytes.len()].copy_from_slice(bytes);
        self.append(header, &[])
    }

    pub fn symlink(self, name: &str, target: &str) -> Layer {
        self.link(name, tar::EntryType::Symlink, target)
    }

    pub fn hardlink(self, name: &str, target: &str) -> Layer {
        self.link(name, tar::EntryType::Link, target)
    }

    pub fn special(self, name: &str, kind: tar::EntryType) -> Layer {
        let header = Self::header(name, kind, 0o666, 0);
        self.append(header, &[])
    }

    /// A PAX extended header for the next entry (`key=value` records).
    pub fn pax(self, records: &[(&str, &str)]) -> Layer {
        let mut data = Vec::new();
        for (key, value) in records {
            let body = format!(" {key}={value}\n");
            // The record's length counts its own digits.
            let mut length = body.len() + 1;
            while format!("{length}{body}").len() != length {
                length += 1;
            }
            data.extend_from_slice(format!("{length}{body}").as_bytes());
        }
        let header = Self::header(
            "PaxHeader",
            tar::EntryType::XHeader,
            0o644,
            data.len() as u64,
        );
        self.append(header, &data)
    }

    pub fn tar(self) -> Vec<u8> {
        self.builder.into_inner().unwrap()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

pub fn compress(tar: &[u8], compression: Compression) -> Vec<u8> {
    match compression {
        Compression::None => tar.to_vec(),
        Compression::Gzip => {
            let mut encoder =
                flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            encoder.write_all(tar).unwrap();
            encoder.finish().unwrap()
        }
        Compression::Zstd => {
            ruzstd::encoding::compress_to_vec(tar, ruzstd::encoding::CompressionLevel::Fastest)
        }
    }
}

/// An image made by a test: blobs, config and manifest.
#[derive(Clone)]
pub struct TestImage {
    /// (blob, media type, diff id)
    pub layers: Vec<(Vec<u8>, String, String)>,
    pub config: Vec<u8>,
    pub manifest: Vec<u8>,
    pub manifest_media_type: String,
}

pub struct ImageSpec {
    pub docker_media_types: bool,
    pub env: Vec<String>,
    pub cmd: Vec<String>,
}

impl Default for ImageSpec {
    fn default() -> Self {
        ImageSpec {
            docker_media_types: false,
            env: vec!["PATH=/usr/bin:/bin".into(), "GREETING=hello".into()],
            cmd: vec!["/bin/sh".into()],
        }
    }
}

pub fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

impl TestImage {
    pub fn new(layers: Vec<(Vec<u8>, Compression)>) -> TestImage {
        TestImage::with(layers, ImageSpec::default())
    }

    pub fn with(layers: Vec<(Vec<u8>, Compression)>, spec: ImageSpec) -> TestImage {
        let layers: Vec<(Vec<u8>, String, String)> = layers
            .into_iter()
            .map(|(tar, compression)| {
                let media_type = match (spec.docker_media_types, compression) {
                    (true, Compression::Gzip) => {
                        "application/vnd.docker.image.rootfs.diff.tar.gzip"
                    }
                    (true, _) => "application/vnd.docker.image.rootfs.diff.tar",
                    (false, Compression::None) => "application/vnd.oci.image.layer.v1.tar",
                    (false, Compression::Gzip) => "application/vnd.oci.image.layer.v1.tar+gzip",
                    (false, Compression::Zstd) => "application/vnd.oci.image.layer.v1.tar+zstd",
                };
                (
                    compress(&tar, compression),
                    media_type.to_string(),
                    sha256(&tar),
                )
            })
            .collect();
        let config = serde_json::to_vec(&json!({
            "architecture": host_arch(),
            "os": "linux",
            "created": "2024-01-02T03:04:05Z",
            "config": {"Env": spec.env, "Cmd": spec.cmd, "Entrypoint": ["/entry"], "WorkingDir": "/work", "User": "1000:1000"},
            "rootfs": {"type": "layers", "diff_ids": layers.iter().map(|l| l.2.clone()).collect::<Vec<_>>()},
        }))
        .unwrap();
        let (manifest_type, config_type) = if spec.docker_media_types {
            (
                "application/vnd.docker.distribution.manifest.v2+json",
                "application/vnd.docker.container.image.v1+json",
            )
        } else {
            (
                "application/vnd.oci.image.manifest.v1+json",
                "application/vnd.oci.image.config.v1+json",
            )
        };
        let mut image = TestImage {
            layers,
            config,
            manifest: Vec::new(),
            manifest_media_type: manifest_type.to_string(),
        };
        image.manifest = image.manifest_json(config_type);
        image
    }

    fn manifest_json(&self, config_type: &str) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": self.manifest_media_type,
            "config": {"mediaType": config_type, "digest": sha256(&self.config), "size": self.config.len()},
            "layers": self.layers.iter().map(|(blob, media_type, _)| json!({"mediaType": media_type, "digest": sha256(blob), "size": blob.len()})).collect::<Vec<_>>(),
        }))
        .unwrap()
    }

    pub fn digest(&self) -> String {
        sha256(&self.manifest)
    }

    /// Writes an OCI image layout; `name` goes in the ref-name annotation.
    pub fn write_oci_layout(&self, dir: &Path, name: Option<&str>) {
        let blobs = dir.join("blobs/sha256");
        std::fs::create_dir_all(&blobs).unwrap();
        let put = |bytes: &[u8]| {
            std::fs::write(blobs.join(&sha256(bytes)["sha256:".len()..]), bytes).unwrap()
        };
        put(&self.config);
        put(&self.manifest);
        for (blob, _, _) in &self.layers {
            put(blob);
        }
        std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
        let mut descriptor = json!({"mediaType": self.manifest_media_type, "digest": self.digest(), "size": self.manifest.len()});
        if let Some(name) = name {
            descriptor["annotations"] = json!({"org.opencontainers.image.ref.name": name});
        }
        std::fs::write(
            dir.join("index.json"),
            serde_json::to_vec(&json!({"schemaVersion": 2, "manifests": [descriptor]})).unwrap(),
        )
        .unwrap();
    }

    /// A `docker save` tarball: `<n>/layer.tar` (uncompressed), `<hex>.json`, manifest.json.
    pub fn docker_save(&self, path: &Path, repo_tag: &str, uncompressed_layers: &[Vec<u8>]) {
        let mut builder = tar::Builder::new(Vec::new());
        let mut add = |name: &str, bytes: &[u8]| {
            let mut header = tar::Header::new_gnu();
            header.set_size(bytes.len() as u64);
            header.set_mode(0o644);
            header.set_entry_type(tar::EntryType::Regular);
            builder.append_data(&mut header, name, bytes).unwrap();
        };
        let config_name = format!("{}.json", &sha256(&self.config)["sha256:".len()..]);
        add(&config_name, &self.config);
        let mut layer_names = Vec::new();
        for (i, layer) in uncompressed_layers.iter().enumerate() {
            let name = format!("layer{i}/layer.tar");
            add(&name, layer);
            layer_names.push(name);
        }
        let manifest =
            json!([{"Config": config_name, "RepoTags": [repo_tag], "Layers": layer_names}]);
        add("manifest.json", &serde_json::to_vec(&manifest).unwrap());
        std::fs::write(path, builder.into_inner().unwrap()).unwrap();
    }
}

/// A tar of a directory's files (an `oci-archive` of a layout).
pub fn tar_directory(dir: &Path, out: &Path) {
    let mut builder = tar::Builder::new(Vec::new());
    builder.append_dir_all(".", dir).unwrap();
    std::fs::write(out, builder.into_inner().unwrap()).unwrap();
}

/// Every path under `dir` (relative), sorted.
pub fn tree(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for entry in entries.flatten() {
                let path = entry.path();
                out.push(path.strip_prefix(base).unwrap().display().to_string());
                if std::fs::symlink_metadata(&path)
                    .map(|m| m.is_dir())
                    .unwrap_or(false)
                {
                    walk(base, &path, out);
                }
            }
        }
    }
    walk(dir, dir, &mut out);
    out.sort();
    out
}

pub fn xattr(path: &Path, name: &str) -> Option<String> {
    let mut buf = vec![0u8; 256];
    match rustix::fs::lgetxattr(path, name, &mut buf) {
        Ok(n) => Some(String::from_utf8_lossy(&buf[..n]).into_owned()),
        Err(_) => None,
    }
}

/// Asserts the store holds nothing partial: no temporary layer, no download, no record
/// without its layer.
pub fn assert_nothing_partial(store_dir: &Path) {
    let layers: Vec<String> = tree(&store_dir.join("layers"));
    assert!(
        layers.iter().all(|p| !p.starts_with(".partial")),
        "partial layers left: {layers:?}"
    );
    let tmp = tree(&store_dir.join("tmp"));
    assert!(tmp.is_empty(), "temporary files left: {tmp:?}");
}

/// The two layers of the image most tests use: every kind of entry, then whiteouts.
pub fn rich_layers() -> Vec<Vec<u8>> {
    let lower = Layer::new()
        .dir("etc", 0o755)
        .file("etc/hostname", 0o644, b"sandcove\n")
        .owned_file("home-file", 0o640, 1000, 1000, b"owned by 1000")
        .file("setuid-tool", 0o4755, b"#!/bin/sh\n")
        .dir("shared", 0o2775)
        .symlink("etc/link", "/etc/hostname")
        .hardlink("etc/hard", "etc/hostname")
        .file("doomed", 0o644, b"deleted by the upper layer")
        .dir("opaque", 0o755)
        .file("opaque/old", 0o644, b"hidden by the opaque marker")
        .dir("readonly", 0o555)
        .file("readonly/inside", 0o444, b"r")
        .special("dev-null", tar::EntryType::Char)
        .special("pipe", tar::EntryType::Fifo)
        .tar();
    let upper = Layer::new()
        .file(".wh.doomed", 0o644, b"")
        .file("opaque/.wh..wh..opq", 0o644, b"")
        .file("opaque/new", 0o644, b"new")
        .file("implicit/parent/file", 0o644, b"parents not in the tar")
        .tar();
    vec![lower, upper]
}

/// Checks the unpacked rich layers (rootless ownership: files are the caller's).
pub fn check_rich_layers(layers: &[PathBuf]) {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    assert_eq!(layers.len(), 2);
    let (lower, upper) = (&layers[0], &layers[1]);
    assert_eq!(
        std::fs::read(lower.join("etc/hostname")).unwrap(),
        b"sandcove\n"
    );
    let setuid = std::fs::metadata(lower.join("setuid-tool")).unwrap();
    assert_eq!(setuid.mode() & 0o7777, 0o755, "setuid stripped on disk");
    assert_eq!(
        xattr(&lower.join("setuid-tool"), "user.sandcove.mode").as_deref(),
        Some("4755")
    );
    let shared = std::fs::metadata(lower.join("shared")).unwrap();
    assert_eq!(shared.mode() & 0o7777, 0o775, "setgid stripped on disk");
    assert_eq!(
        xattr(&lower.join("shared"), "user.sandcove.mode").as_deref(),
        Some("2775")
    );
    assert_eq!(
        xattr(&lower.join("home-file"), "user.sandcove.owner").as_deref(),
        Some("1000:1000")
    );
    assert_eq!(
        xattr(&lower.join("etc/hostname"), "user.sandcove.owner"),
        None,
        "0:0 is not recorded"
    );
    let me = rustix::process::geteuid().as_raw();
    assert_eq!(
        std::fs::metadata(lower.join("home-file")).unwrap().uid(),
        me,
        "files are the caller's"
    );
    assert_eq!(
        std::fs::read_link(lower.join("etc/link")).unwrap(),
        Path::new("/etc/hostname")
    );
    assert_eq!(
        std::fs::metadata(lower.join("etc/hard")).unwrap().ino(),
        std::fs::metadata(lower.join("etc/hostname")).unwrap().ino(),
        "hard link shares the inode"
    );
    assert_eq!(
        std::fs::metadata(lower.join("readonly")).unwrap().mode() & 0o7777,
        0o555
    );
    assert_eq!(
        std::fs::metadata(lower.join("readonly/inside"))
            .unwrap()
            .mode()
            & 0o7777,
        0o444
    );
    assert_eq!(
        std::fs::metadata(lower).unwrap().mode() & 0o7777,
        0o755,
        "the layer root is 0755"
    );
    assert_eq!(
        std::fs::metadata(lower.join("setuid-tool"))
            .unwrap()
            .mtime(),
        1_700_000_000
    );
    assert!(
        !lower.join("dev-null").exists() && !lower.join("pipe").exists(),
        "device nodes and fifos are not created"
    );
    let whiteout = std::fs::symlink_metadata(upper.join("doomed")).unwrap();
    assert!(
        whiteout.file_type().is_char_device() && whiteout.rdev() == 0,
        "a whiteout is a 0:0 char device"
    );
    assert_eq!(
        xattr(&upper.join("opaque"), "user.overlay.opaque").as_deref(),
        Some("y")
    );
    assert!(!upper.join("opaque/.wh..wh..opq").exists());
    assert!(!upper.join("opaque/old").exists());
    assert_eq!(std::fs::read(upper.join("opaque/new")).unwrap(), b"new");
    assert_eq!(
        std::fs::metadata(upper.join("implicit/parent"))
            .unwrap()
            .mode()
            & 0o7777,
        0o755
    );
}
