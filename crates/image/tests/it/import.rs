//! Importing without a registry: an OCI layout directory, an `oci-archive`, a `docker save`.

use sandcove_image::{ImageError, Store, StoreOptions};

use crate::support::{
    assert_nothing_partial, check_rich_layers, compress, rich_layers, tar_directory, Compression,
    TempDir, TestImage,
};

fn rich_image() -> TestImage {
    let layers = rich_layers();
    TestImage::new(vec![
        (layers[0].clone(), Compression::Gzip),
        (layers[1].clone(), Compression::Zstd),
    ])
}

#[tokio::test]
async fn an_oci_layout_directory_is_imported_under_its_ref_name() {
    let root = TempDir::new("import-layout");
    let image = rich_image();
    image.write_oci_layout(
        &root.path().join("layout"),
        Some("example.test/tools/app:1.0"),
    );
    let store = Store::open(root.path().join("store"), StoreOptions::default()).unwrap();
    let infos = store
        .import(&root.path().join("layout"), None)
        .await
        .unwrap();
    assert_eq!(infos.len(), 1);
    assert_eq!(
        infos[0].references,
        vec!["example.test/tools/app:1.0".to_string()]
    );
    assert_eq!(infos[0].digest, image.digest());
    let resolved = store.resolve("example.test/tools/app:1.0").unwrap();
    check_rich_layers(&resolved.layers);
    assert_eq!(
        resolved.config.env,
        vec![
            "PATH=/usr/bin:/bin".to_string(),
            "GREETING=hello".to_string()
        ]
    );
    assert_eq!(resolved.config.working_dir.as_deref(), Some("/work"));
    assert_eq!(resolved.config.user.as_deref(), Some("1000:1000"));
    assert_eq!(resolved.config.entrypoint, vec!["/entry".to_string()]);
    let details = store.inspect(&image.digest()).unwrap();
    assert_eq!(details.skipped_entries, 2, "{:?}", details.layers);
    assert!(details.layers[0].skipped.iter().any(|s| s == "dev-null"));
    // Importing again reuses the layers.
    let again = store
        .import(
            &root.path().join("layout"),
            Some("example.test/tools/app:again"),
        )
        .await
        .unwrap();
    assert_eq!(again[0].digest, image.digest());
    assert_eq!(store.list().unwrap().len(), 1);
}

#[tokio::test]
async fn an_oci_archive_is_imported_under_the_tag_given() {
    let root = TempDir::new("import-archive");
    let image = rich_image();
    let layout = root.path().join("layout");
    image.write_oci_layout(&layout, Some("latest"));
    tar_directory(&layout, &root.path().join("image.tar"));
    let store = Store::open(root.path().join("store"), StoreOptions::default()).unwrap();
    let infos = store
        .import(
            &root.path().join("image.tar"),
            Some("localhost/imported:v1"),
        )
        .await
        .unwrap();
    assert_eq!(
        infos[0].references,
        vec!["localhost/imported:v1".to_string()]
    );
    check_rich_layers(&store.resolve("localhost/imported:v1").unwrap().layers);
    assert!(
        root.path()
            .join("store/tmp")
            .read_dir()
            .unwrap()
            .next()
            .is_none(),
        "the spool is removed"
    );
}

#[tokio::test]
async fn a_docker_save_tarball_with_uncompressed_layers_is_imported() {
    let root = TempDir::new("import-docker");
    let layers = rich_layers();
    let image = TestImage::new(vec![
        (layers[0].clone(), Compression::None),
        (layers[1].clone(), Compression::None),
    ]);
    image.docker_save(&root.path().join("saved.tar"), "myapp:2", &layers);
    let store = Store::open(root.path().join("store"), StoreOptions::default()).unwrap();
    let infos = store
        .import(&root.path().join("saved.tar"), None)
        .await
        .unwrap();
    assert_eq!(
        infos[0].references,
        vec!["docker.io/library/myapp:2".to_string()]
    );
    let resolved = store.resolve("myapp:2").unwrap();
    check_rich_layers(&resolved.layers);
    assert_eq!(resolved.config.cmd, vec!["/bin/sh".to_string()]);
}

#[tokio::test]
async fn an_archive_that_is_neither_format_is_refused() {
    let root = TempDir::new("import-neither");
    std::fs::create_dir(root.path().join("empty")).unwrap();
    let store = Store::open(root.path().join("store"), StoreOptions::default()).unwrap();
    let result = store.import(&root.path().join("empty"), None).await;
    assert!(
        matches!(result, Err(ImageError::Malformed { .. })),
        "{result:?}"
    );
}

#[tokio::test]
async fn remove_hold_and_prune_keep_what_is_used() {
    let root = TempDir::new("prune");
    let image = rich_image();
    image.write_oci_layout(&root.path().join("layout"), Some("example.test/app:1"));
    let store = Store::open(root.path().join("store"), StoreOptions::default()).unwrap();
    store
        .import(&root.path().join("layout"), None)
        .await
        .unwrap();
    let resolved = store.resolve("example.test/app:1").unwrap();
    store.hold(&resolved.digest, "sandbox-1").unwrap();
    store.remove("example.test/app:1").unwrap();
    assert!(matches!(
        store.resolve("example.test/app:1"),
        Err(ImageError::NotFound { .. })
    ));
    // Untagged but held: prune keeps it and its layers; removing it by digest is refused.
    let report = store.prune().unwrap();
    assert!(
        report.images.is_empty() && report.layers.is_empty(),
        "{report:?}"
    );
    assert!(store.resolve(&resolved.digest).is_ok());
    assert!(matches!(
        store.remove(&resolved.digest),
        Err(ImageError::InUse { .. })
    ));
    store.release("sandbox-1").unwrap();
    let report = store.prune().unwrap();
    assert_eq!(report.images, vec![resolved.digest.clone()]);
    assert_eq!(report.layers.len(), 2);
    assert!(
        resolved.layers.iter().all(|l| !l.exists()),
        "layers (with a read-only directory) removed"
    );
    assert!(store.list().unwrap().is_empty());
}

/// A running sandbox's hold (transient: not synced) keeps its image from `remove` and `prune`
/// as a snapshot's does; both are listed, each released alone; a transient record a crash
/// left torn holds nothing and breaks nothing.
#[tokio::test]
async fn transient_holds_keep_images_as_durable_ones_do() {
    let root = TempDir::new("transient");
    let image = rich_image();
    image.write_oci_layout(&root.path().join("layout"), Some("example.test/app:1"));
    let store = Store::open(root.path().join("store"), StoreOptions::default()).unwrap();
    store
        .import(&root.path().join("layout"), None)
        .await
        .unwrap();
    let digest = store.resolve("example.test/app:1").unwrap().digest;
    store.hold_transient(&digest, "sandbox-1").unwrap();
    store.hold(&digest, "snapshot-1").unwrap();
    let holds = store.holds_by_holder().unwrap();
    assert_eq!(holds.get("sandbox-1"), Some(&digest));
    assert_eq!(holds.get("snapshot-1"), Some(&digest));
    assert!(matches!(
        store.remove(&digest),
        Err(ImageError::InUse { .. })
    ));
    store.release("snapshot-1").unwrap();
    assert!(
        matches!(store.remove(&digest), Err(ImageError::InUse { .. })),
        "the sandbox's hold alone keeps it"
    );
    assert!(store.prune().unwrap().images.is_empty());
    // A crash mid-write: the transient record is torn; it holds nothing, and the store works.
    std::fs::write(root.path().join("store/transient-holds.json"), b"{\"sandb").unwrap();
    assert!(store.holds_by_holder().unwrap().is_empty());
    store.hold_transient(&digest, "sandbox-2").unwrap();
    store.release("sandbox-2").unwrap();
    store.remove(&digest).unwrap();
}

#[tokio::test]
async fn the_store_bound_refuses_an_import_that_would_pass_it() {
    let root = TempDir::new("bound");
    let image = rich_image();
    image.write_oci_layout(&root.path().join("layout"), Some("example.test/app:1"));
    let options = StoreOptions {
        max_store_bytes: Some(100),
        ..StoreOptions::default()
    };
    let store = Store::open(root.path().join("store"), options).unwrap();
    let result = store.import(&root.path().join("layout"), None).await;
    assert!(
        matches!(result, Err(ImageError::TooLarge { .. })),
        "{result:?}"
    );
    assert!(store.list().unwrap().is_empty());
}

#[tokio::test]
async fn the_store_root_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let root = TempDir::new("private");
    Store::open(root.path().join("store"), StoreOptions::default()).unwrap();
    let mode = std::fs::metadata(root.path().join("store"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700);
}

#[tokio::test]
async fn shifted_ownership_chowns_each_entry_beneath_the_base() {
    use std::os::unix::fs::MetadataExt;
    if !rustix::process::geteuid().is_root() {
        eprintln!(
            "SKIP: OwnerMap::Shift chowns files, which needs root; this test runs as root in CI"
        );
        return;
    }
    let root = TempDir::new("shift");
    let base = 0x7000_0000u32;
    let layers = rich_layers();
    let extra = crate::support::Layer::new()
        .owned_file("high-id", 0o644, 70_000, 70_000, b"h")
        .tar();
    let image = TestImage::new(vec![
        (layers[0].clone(), Compression::Gzip),
        (extra, Compression::Gzip),
    ]);
    image.write_oci_layout(&root.path().join("layout"), Some("example.test/shift:1"));
    let options = StoreOptions {
        owner: sandcove_image::OwnerMap::Shift { base, count: 65536 },
        ..StoreOptions::default()
    };
    let store = Store::open(root.path().join("store"), options).unwrap();
    store
        .import(&root.path().join("layout"), None)
        .await
        .unwrap();
    let layers = store.resolve("example.test/shift:1").unwrap().layers;
    let owner = |path: &std::path::Path| {
        let meta = std::fs::symlink_metadata(path).unwrap();
        (meta.uid(), meta.gid())
    };
    assert_eq!(
        owner(&layers[0]),
        (base, base),
        "the layer root is in-image root's"
    );
    assert_eq!(
        owner(&layers[0].join("home-file")),
        (base + 1000, base + 1000)
    );
    assert_eq!(owner(&layers[0].join("etc/hostname")), (base, base));
    assert_eq!(
        owner(&layers[0].join("etc/link")),
        (base, base),
        "symlinks are chowned too"
    );
    assert_eq!(
        std::fs::metadata(layers[0].join("setuid-tool"))
            .unwrap()
            .mode()
            & 0o7777,
        0o755
    );
    assert_eq!(
        crate::support::xattr(&layers[0].join("home-file"), "user.sandcove.owner"),
        None
    );
    let overflow = base + sandcove_image::OVERFLOW_ID;
    assert_eq!(
        owner(&layers[1].join("high-id")),
        (overflow, overflow),
        "ids past the count become nobody"
    );
}

/// Cross-check with another implementation: `umoci unpack --rootless` (Debian package umoci)
/// of the same layer gives the same files, contents, link targets and permission bits.
#[tokio::test]
async fn the_unpack_agrees_with_umoci() {
    use std::os::unix::fs::MetadataExt;
    let Some(umoci) = ["/usr/bin/umoci", "/usr/sbin/umoci"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
    else {
        eprintln!("SKIP: umoci is not installed (Debian package umoci); the cross-check needs it");
        return;
    };
    let root = TempDir::new("umoci");
    let layer = rich_layers()[0].clone();
    let image = TestImage::new(vec![(layer, Compression::Gzip)]);
    let layout = root.path().join("layout");
    image.write_oci_layout(&layout, Some("v1"));
    let bundle = root.path().join("bundle");
    let output = std::process::Command::new(umoci)
        .args(["unpack", "--rootless", "--image"])
        .arg(format!("{}:v1", layout.display()))
        .arg(&bundle)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "umoci: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let store = Store::open(root.path().join("store"), StoreOptions::default()).unwrap();
    store
        .import(&layout, Some("localhost/cross:check"))
        .await
        .unwrap();
    let ours = &store.resolve("localhost/cross:check").unwrap().layers[0];
    let theirs = bundle.join("rootfs");
    let listed = |dir: &std::path::Path| -> Vec<String> {
        crate::support::tree(dir)
            .into_iter()
            .filter(|p| {
                let t = std::fs::symlink_metadata(dir.join(p)).unwrap().file_type();
                t.is_file() || t.is_dir() || t.is_symlink()
            })
            .collect()
    };
    // Device nodes: umoci, rootless, leaves empty files where we create nothing.
    let skipped = store.inspect("localhost/cross:check").unwrap().layers[0]
        .skipped
        .clone();
    assert_eq!(skipped, vec!["dev-null".to_string(), "pipe".to_string()]);
    let theirs_listed: Vec<String> = listed(&theirs)
        .into_iter()
        .filter(|p| !skipped.contains(p))
        .collect();
    assert_eq!(listed(ours), theirs_listed);
    for path in listed(ours) {
        let (a, b) = (ours.join(&path), theirs.join(&path));
        let (ma, mb) = (
            std::fs::symlink_metadata(&a).unwrap(),
            std::fs::symlink_metadata(&b).unwrap(),
        );
        assert_eq!(ma.file_type(), mb.file_type(), "{path}");
        if ma.is_symlink() {
            assert_eq!(
                std::fs::read_link(&a).unwrap(),
                std::fs::read_link(&b).unwrap(),
                "{path}"
            );
            continue;
        }
        // Permission bits agree; setuid/setgid are ours to strip (umoci keeps them).
        assert_eq!(ma.mode() & 0o1777, mb.mode() & 0o1777, "{path}");
        if ma.is_file() {
            assert_eq!(
                std::fs::read(&a).unwrap(),
                std::fs::read(&b).unwrap(),
                "{path}"
            );
            assert_eq!(ma.mtime(), mb.mtime(), "{path}");
        }
    }
}

#[tokio::test]
async fn pax_ids_and_times_are_honoured_and_ids_past_32_bits_become_nobody() {
    use std::os::unix::fs::MetadataExt;
    let root = TempDir::new("pax");
    let layer = crate::support::Layer::new()
        .pax(&[
            ("uid", "100000000"),
            ("gid", "100000001"),
            ("mtime", "1600000000.5"),
        ])
        .file("big-ids", 0o644, b"b")
        .pax(&[("uid", "4294967296"), ("gid", "0")])
        .file("too-big", 0o644, b"t")
        .tar();
    let image = TestImage::new(vec![(layer, Compression::None)]);
    image.write_oci_layout(&root.path().join("layout"), Some("example.test/pax:1"));
    let store = Store::open(root.path().join("store"), StoreOptions::default()).unwrap();
    store
        .import(&root.path().join("layout"), None)
        .await
        .unwrap();
    let layer = &store.resolve("example.test/pax:1").unwrap().layers[0];
    assert_eq!(
        crate::support::xattr(&layer.join("big-ids"), "user.sandcove.owner").as_deref(),
        Some("100000000:100000001")
    );
    assert_eq!(
        std::fs::metadata(layer.join("big-ids")).unwrap().mtime(),
        1_600_000_000
    );
    assert_eq!(
        crate::support::xattr(&layer.join("too-big"), "user.sandcove.owner").as_deref(),
        Some("65534:0")
    );
}

/// A layout directory's files are opened beneath it with no symlink followed: a layer blob,
/// an `index.json` or a `blobs` directory that is a symlink (here to a copy of what it should
/// be, so following it would import the image) is a `Malformed` error naming the file, and
/// nothing is stored. A fifo in the layout's place of a blob is refused without hanging.
#[tokio::test]
async fn a_layout_directory_is_read_beneath_it_with_no_symlink_followed() {
    let image = rich_image();
    let blob_name = |bytes: &[u8]| crate::support::sha256(bytes)["sha256:".len()..].to_string();
    let layer = blob_name(&image.layers[0].0);
    // (what is replaced, how it is named in the error)
    let cases: [(&str, &str); 3] = [
        ("layer", "blobs/sha256/"),
        ("index", "index.json"),
        ("blobs", "blobs/sha256/"),
    ];
    for (case, named) in cases {
        let root = TempDir::new("import-symlink");
        let layout = root.path().join("layout");
        image.write_oci_layout(&layout, Some("example.test/link:1"));
        let elsewhere = root.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        let relink = |relative: &str| {
            let inside = layout.join(relative);
            let outside = elsewhere.join(relative.replace('/', "-"));
            std::fs::rename(&inside, &outside).unwrap();
            std::os::unix::fs::symlink(&outside, &inside).unwrap();
        };
        match case {
            "layer" => relink(&format!("blobs/sha256/{layer}")),
            "index" => relink("index.json"),
            _ => relink("blobs"),
        }
        let store = Store::open(root.path().join("store"), StoreOptions::default()).unwrap();
        let result = store.import(&layout, None).await;
        match &result {
            Err(ImageError::Malformed { reason, .. }) => {
                assert!(
                    reason.contains(named) && reason.contains("symlink"),
                    "{case}: {reason}"
                )
            }
            other => panic!("{case}: expected Malformed, got {other:?}"),
        }
        assert!(store.list().unwrap().is_empty(), "{case}: nothing stored");
    }

    let root = TempDir::new("import-fifo");
    let layout = root.path().join("layout");
    image.write_oci_layout(&layout, Some("example.test/fifo:1"));
    let blob = layout.join(format!("blobs/sha256/{layer}"));
    std::fs::remove_file(&blob).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &blob,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    let store = Store::open(root.path().join("store"), StoreOptions::default()).unwrap();
    let result = store.import(&layout, None).await;
    assert!(
        matches!(&result, Err(ImageError::Malformed { reason, .. }) if reason.contains("not a regular file")),
        "{result:?}"
    );
}

/// A tar of `files` (name, content), compressed as asked.
fn archive_of(files: &[(&str, &[u8])], compression: Compression) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (name, bytes) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        builder.append_data(&mut header, name, *bytes).unwrap();
    }
    compress(&builder.into_inner().unwrap(), compression)
}

#[tokio::test]
async fn an_archive_decompressing_past_the_room_left_is_refused_and_its_spool_removed() {
    let root = TempDir::new("spool-room");
    // 4 MiB of zeros compress to a few KiB: only the spool's decompressed bytes pass the bound.
    let zeros = vec![0u8; 4 << 20];
    let archive = root.path().join("bomb.tar.gz");
    std::fs::write(
        &archive,
        archive_of(&[("filler", &zeros), ("more", &zeros)], Compression::Gzip),
    )
    .unwrap();
    assert!(std::fs::metadata(&archive).unwrap().len() < 1 << 20);
    let options = StoreOptions {
        max_store_bytes: Some(2 << 20),
        ..StoreOptions::default()
    };
    let store = Store::open(root.path().join("store"), options).unwrap();
    let result = store.import(&archive, None).await;
    assert!(
        matches!(&result, Err(ImageError::TooLarge { reason, .. }) if reason.contains("room")),
        "{result:?}"
    );
    assert_nothing_partial(&root.path().join("store"));
}

#[tokio::test]
async fn a_staged_upload_counts_against_the_room_left() {
    let root = TempDir::new("staged-room");
    let options = StoreOptions {
        max_store_bytes: Some(1 << 20),
        ..StoreOptions::default()
    };
    let store = Store::open(root.path().join("store"), options).unwrap();
    assert_eq!(store.room_left(), Some(1 << 20));
    std::fs::write(store.staging_path(), vec![0u8; 4096]).unwrap();
    assert_eq!(store.room_left(), Some((1 << 20) - 4096));
    let unbounded = Store::open(root.path().join("other"), StoreOptions::default()).unwrap();
    assert_eq!(unbounded.room_left(), None);
}

#[tokio::test]
async fn a_docker_save_listing_too_many_layers_or_images_is_refused_before_hashing() {
    let root = TempDir::new("docker-counts");
    let store = Store::open(root.path().join("store"), StoreOptions::default()).unwrap();
    // The files named are missing: only a check made before any is opened refuses as TooLarge.
    let too_many_layers = serde_json::json!([{
        "Config": "missing.json",
        "Layers": vec!["missing.tar"; sandcove_image::MAX_IMAGE_LAYERS + 1],
    }]);
    let one_image = serde_json::json!({"Config": "missing.json", "Layers": ["missing.tar"]});
    let too_many_images =
        serde_json::Value::Array(vec![one_image; sandcove_image::MAX_ARCHIVE_IMAGES + 1]);
    for (case, manifest) in [("layers", too_many_layers), ("images", too_many_images)] {
        let archive = root.path().join(format!("{case}.tar"));
        let manifest = serde_json::to_vec(&manifest).unwrap();
        std::fs::write(
            &archive,
            archive_of(&[("manifest.json", &manifest)], Compression::None),
        )
        .unwrap();
        let result = store.import(&archive, None).await;
        assert!(
            matches!(result, Err(ImageError::TooLarge { .. })),
            "{case}: {result:?}"
        );
    }
    assert_nothing_partial(&root.path().join("store"));
}

#[tokio::test]
async fn an_oci_index_listing_too_many_images_is_refused_before_reading_them() {
    let root = TempDir::new("oci-counts");
    let layout = root.path().join("layout");
    std::fs::create_dir(&layout).unwrap();
    let missing = serde_json::json!({
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": format!("sha256:{}", "ab".repeat(32)),
        "size": 100,
    });
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": vec![missing; sandcove_image::MAX_ARCHIVE_IMAGES + 1],
    });
    std::fs::write(
        layout.join("index.json"),
        serde_json::to_vec(&index).unwrap(),
    )
    .unwrap();
    std::fs::write(
        layout.join("oci-layout"),
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .unwrap();
    let store = Store::open(root.path().join("store"), StoreOptions::default()).unwrap();
    let result = store.import(&layout, None).await;
    assert!(
        matches!(result, Err(ImageError::TooLarge { .. })),
        "{result:?}"
    );
}
