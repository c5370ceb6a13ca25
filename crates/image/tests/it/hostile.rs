//! Hostile layers, imported from an OCI layout (the same unpack a pull runs): each is a
//! typed error, nothing lands outside the store, nothing partial is kept.

use sandcove_image::{ImageError, Store, StoreOptions};

use crate::support::{assert_nothing_partial, tree, Compression, Layer, TempDir, TestImage};

struct Attempt {
    root: TempDir,
    result: Result<Vec<sandcove_image::ImageInfo>, ImageError>,
}

async fn import_image(image: &TestImage, options: StoreOptions) -> Attempt {
    let root = TempDir::new("hostile");
    std::fs::create_dir(root.path().join("outside")).unwrap();
    let layout = root.path().join("layout");
    image.write_oci_layout(&layout, Some("hostile.test/layer:v1"));
    let store = Store::open(root.path().join("store"), options).unwrap();
    let result = store.import(&layout, None).await;
    Attempt { root, result }
}

async fn import_layer(layer: Layer) -> Attempt {
    import_image(
        &TestImage::new(vec![(layer.tar(), Compression::Gzip)]),
        StoreOptions::default(),
    )
    .await
}

/// Nothing outside the store changed, no layer or image was kept.
fn assert_contained(attempt: &Attempt) {
    let root = attempt.root.path();
    let outside = tree(&root.join("outside"));
    assert!(outside.is_empty(), "written outside the layer: {outside:?}");
    let escaped: Vec<String> = tree(root)
        .into_iter()
        .filter(|p| p.ends_with("escape"))
        .collect();
    assert!(escaped.is_empty(), "escaped entries: {escaped:?}");
    let store = root.join("store");
    assert_nothing_partial(&store);
    let layers: Vec<String> = tree(&store.join("layers"));
    assert!(layers.is_empty(), "layers kept: {layers:?}");
    assert!(tree(&store.join("images")).is_empty());
}

fn expect_hostile(attempt: &Attempt, wanted_entry: &str) {
    match &attempt.result {
        Err(ImageError::HostileLayer { entry, reason }) => {
            assert_eq!(entry, wanted_entry, "{reason}");
        }
        other => panic!("expected HostileLayer for {wanted_entry}, got {other:?}"),
    }
    assert_contained(attempt);
}

#[tokio::test]
async fn dot_dot_entries_are_refused() {
    let attempt = import_layer(Layer::new().file("ok", 0o644, b"x").file(
        "../../../../escape",
        0o644,
        b"x",
    ))
    .await;
    expect_hostile(&attempt, "../../../../escape");
    let attempt = import_layer(
        Layer::new()
            .dir("a", 0o755)
            .file("a/../../escape", 0o644, b"x"),
    )
    .await;
    expect_hostile(&attempt, "a/../../escape");
}

#[tokio::test]
async fn absolute_entries_are_refused() {
    let name = format!("/tmp/sandcove-image-absolute-{}-escape", std::process::id());
    let attempt = import_layer(Layer::new().file(&name, 0o644, b"x")).await;
    expect_hostile(&attempt, &name);
    assert!(!std::path::Path::new(&name).exists());
}

#[tokio::test]
async fn entries_beneath_a_symlinked_parent_are_refused() {
    // The symlink points at a real directory outside the store: following it would write there.
    let attempt = import_layer(Layer::new().symlink("up", "../../../../..").file(
        "up/escape",
        0o644,
        b"x",
    ))
    .await;
    expect_hostile(&attempt, "up/escape");
    let attempt = import_layer(
        Layer::new()
            .symlink("abs", "/tmp")
            .file("abs/escape", 0o644, b"x"),
    )
    .await;
    expect_hostile(&attempt, "abs/escape");
}

#[tokio::test]
async fn a_directory_swapped_for_a_symlink_mid_layer_is_refused() {
    // `a` is a directory, then an entry replaces it with a symlink to outside, then an entry
    // writes beneath `a`: the swap is seen when the parent is resolved.
    let attempt = import_layer(
        Layer::new()
            .dir("a", 0o755)
            .file("a/first", 0o644, b"1")
            .symlink("a", "/tmp")
            .file("a/escape", 0o644, b"x"),
    )
    .await;
    expect_hostile(&attempt, "a/escape");
}

#[tokio::test]
async fn hard_links_to_outside_or_to_non_files_are_refused() {
    let attempt =
        import_layer(Layer::new().hardlink("escape-link", "../../../../../etc/passwd")).await;
    expect_hostile(&attempt, "escape-link");
    let attempt = import_layer(Layer::new().hardlink("abs-link", "/etc/passwd")).await;
    expect_hostile(&attempt, "abs-link");
    let attempt = import_layer(Layer::new().hardlink("missing-link", "not-here")).await;
    expect_hostile(&attempt, "missing-link");
    let attempt = import_layer(
        Layer::new()
            .symlink("sym", "/etc/passwd")
            .hardlink("sym-link", "sym"),
    )
    .await;
    expect_hostile(&attempt, "sym-link");
    let attempt = import_layer(Layer::new().dir("d", 0o755).hardlink("dir-link", "d")).await;
    expect_hostile(&attempt, "dir-link");
    let attempt = import_layer(
        Layer::new()
            .symlink("up", "/etc")
            .hardlink("via-link", "up/passwd"),
    )
    .await;
    expect_hostile(&attempt, "via-link");
}

#[tokio::test]
async fn whiteouts_of_dot_dot_are_refused() {
    let attempt = import_layer(Layer::new().file(".wh...", 0o644, b"")).await;
    expect_hostile(&attempt, ".wh...");
}

#[tokio::test]
async fn layers_past_the_entry_bound_are_refused() {
    let mut layer = Layer::new();
    for i in 0..20 {
        layer = layer.file(&format!("f{i}"), 0o644, b"x");
    }
    let options = StoreOptions {
        max_layer_entries: 10,
        ..StoreOptions::default()
    };
    let attempt = import_image(
        &TestImage::new(vec![(layer.tar(), Compression::Gzip)]),
        options,
    )
    .await;
    assert!(
        matches!(attempt.result, Err(ImageError::TooLarge { .. })),
        "{:?}",
        attempt.result
    );
    assert_contained(&attempt);
}

#[tokio::test]
async fn layers_decompressing_past_the_byte_bound_are_refused() {
    // 4 MiB of zeros: a few KiB compressed (a small decompression bomb).
    for compression in [Compression::Gzip, Compression::Zstd] {
        let options = StoreOptions {
            max_layer_bytes: 1 << 20,
            ..StoreOptions::default()
        };
        let image = TestImage::new(vec![(
            Layer::new().file("zeros", 0o644, &vec![0u8; 4 << 20]).tar(),
            compression,
        )]);
        assert!(image.layers[0].0.len() < 1 << 20);
        let attempt = import_image(&image, options).await;
        assert!(
            matches!(attempt.result, Err(ImageError::TooLarge { .. })),
            "{compression:?}: {:?}",
            attempt.result
        );
        assert_contained(&attempt);
    }
}

#[tokio::test]
async fn a_layer_whose_diff_id_differs_from_the_config_is_refused() {
    let mut image = TestImage::new(vec![(
        Layer::new().file("a", 0o644, b"a").tar(),
        Compression::Gzip,
    )]);
    // The config names another tar's diff id; manifest rebuilt so only the diff id lies.
    let other = crate::support::sha256(&Layer::new().file("b", 0o644, b"b").tar());
    let mut config: serde_json::Value = serde_json::from_slice(&image.config).unwrap();
    config["rootfs"]["diff_ids"][0] = other.into();
    image.config = serde_json::to_vec(&config).unwrap();
    let mut manifest: serde_json::Value = serde_json::from_slice(&image.manifest).unwrap();
    manifest["config"]["digest"] = crate::support::sha256(&image.config).into();
    manifest["config"]["size"] = image.config.len().into();
    image.manifest = serde_json::to_vec(&manifest).unwrap();
    let attempt = import_image(&image, StoreOptions::default()).await;
    assert!(
        matches!(attempt.result, Err(ImageError::DigestMismatch { .. })),
        "{:?}",
        attempt.result
    );
    assert_contained(&attempt);
}

#[tokio::test]
async fn a_blob_whose_content_differs_from_its_digest_is_refused() {
    let image = TestImage::new(vec![(
        Layer::new().file("a", 0o644, b"a").tar(),
        Compression::Gzip,
    )]);
    let root = TempDir::new("mismatch");
    let layout = root.path().join("layout");
    image.write_oci_layout(&layout, Some("hostile.test/x:v1"));
    let layer_digest = crate::support::sha256(&image.layers[0].0);
    let blob = layout
        .join("blobs/sha256")
        .join(&layer_digest["sha256:".len()..]);
    let mut bytes = std::fs::read(&blob).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&blob, bytes).unwrap();
    let store = Store::open(root.path().join("store"), StoreOptions::default()).unwrap();
    let result = store.import(&layout, None).await;
    assert!(
        matches!(result, Err(ImageError::DigestMismatch { .. })),
        "{result:?}"
    );
    assert_nothing_partial(&root.path().join("store"));
    assert!(store.list().unwrap().is_empty());
}

#[tokio::test]
async fn malformed_manifests_and_configs_are_refused() {
    let image = TestImage::new(vec![(
        Layer::new().file("a", 0o644, b"a").tar(),
        Compression::Gzip,
    )]);
    // Garbage where the manifest is.
    let mut broken = image.clone();
    broken.manifest = b"{not json".to_vec();
    let attempt = import_image(&broken, StoreOptions::default()).await;
    assert!(
        matches!(attempt.result, Err(ImageError::Malformed { .. })),
        "{:?}",
        attempt.result
    );
    assert_contained(&attempt);
    // A config naming two diff ids for one layer.
    let mut broken = image.clone();
    let mut config: serde_json::Value = serde_json::from_slice(&broken.config).unwrap();
    config["rootfs"]["diff_ids"]
        .as_array_mut()
        .unwrap()
        .push(image.layers[0].2.clone().into());
    broken.config = serde_json::to_vec(&config).unwrap();
    let mut manifest: serde_json::Value = serde_json::from_slice(&broken.manifest).unwrap();
    manifest["config"]["digest"] = crate::support::sha256(&broken.config).into();
    manifest["config"]["size"] = broken.config.len().into();
    broken.manifest = serde_json::to_vec(&manifest).unwrap();
    let attempt = import_image(&broken, StoreOptions::default()).await;
    assert!(
        matches!(attempt.result, Err(ImageError::Malformed { .. })),
        "{:?}",
        attempt.result
    );
    assert_contained(&attempt);
    // A truncated layer blob (digest matching the truncated bytes): the tar ends early.
    let tar = Layer::new().file("big", 0o644, &vec![7u8; 100_000]).tar();
    let truncated = TestImage::new(vec![(tar[..50_000].to_vec(), Compression::None)]);
    let attempt = import_image(&truncated, StoreOptions::default()).await;
    assert!(
        matches!(
            attempt.result,
            Err(ImageError::Malformed { .. }) | Err(ImageError::DigestMismatch { .. })
        ),
        "{:?}",
        attempt.result
    );
    assert_contained(&attempt);
}

/// A PAX sparse file's entry (format 1.0): its map, padded to a block, then its data.
fn sparse_layer(map: &str, real_size: &str, data: &[u8]) -> Layer {
    let mut content = map.as_bytes().to_vec();
    content.resize(content.len().div_ceil(512) * 512, 0);
    content.extend_from_slice(data);
    Layer::new()
        .pax(&[
            ("GNU.sparse.major", "1"),
            ("GNU.sparse.minor", "0"),
            ("GNU.sparse.realsize", real_size),
        ])
        .file("sparse", 0o644, &content)
}

/// A PAX sparse file unpacks with its data at its offsets and its holes never read or
/// written (a 1 TiB file takes a block); a map out of order, past the file's size or longer
/// than the entry is malformed, with nothing kept.
#[tokio::test]
async fn pax_sparse_maps_are_applied_or_refused() {
    use std::os::unix::fs::{FileExt, MetadataExt};
    let attempt = import_layer(sparse_layer(
        "1\n1073741824\n5\n",
        "1099511627776",
        b"hello",
    ))
    .await;
    attempt.result.as_ref().expect("a sparse layer imports");
    let layers = attempt.root.path().join("store/layers");
    let file = std::fs::read_dir(&layers)
        .unwrap()
        .flatten()
        .map(|e| e.path().join("sparse"))
        .find(|p| p.exists())
        .expect("the sparse file");
    let meta = std::fs::metadata(&file).unwrap();
    assert_eq!(meta.len(), 1 << 40, "its apparent size");
    assert!(
        meta.blocks() * 512 <= 1 << 20,
        "its holes: {} blocks",
        meta.blocks()
    );
    let mut buf = [0u8; 5];
    std::fs::File::open(&file)
        .unwrap()
        .read_exact_at(&mut buf, 1 << 30)
        .unwrap();
    assert_eq!(&buf, b"hello");

    for (map, real_size, data) in [
        ("1\n100\n10\n", "50", &b"0123456789"[..]),
        ("2\n100\n5\n0\n5\n", "200", b"helloworld"),
        ("1\n0\n100\n", "200", b"short"),
        ("x\n", "10", b""),
    ] {
        let attempt = import_layer(sparse_layer(map, real_size, data)).await;
        match &attempt.result {
            Err(ImageError::Malformed { .. }) => {}
            other => panic!("{map:?}: expected Malformed, got {other:?}"),
        }
        assert_contained(&attempt);
    }
}

/// A layer of old-format GNU sparse entries (type `S`), each holding one 512-byte block of
/// data at the end of a file of `apparent` bytes: a few blocks of archive declaring holes of
/// any size, which the tar reader hands over as zeros.
fn old_sparse_layer(apparent: &[u64]) -> Vec<u8> {
    let mut tar = Vec::new();
    for (i, &size) in apparent.iter().enumerate() {
        let mut header = tar::Header::new_gnu();
        header.set_path(format!("sparse{i}")).unwrap();
        header.set_entry_type(tar::EntryType::GNUSparse);
        header.set_mode(0o644);
        header.set_mtime(1_700_000_000);
        header.set_size(512);
        let gnu = header.as_gnu_mut().unwrap();
        gnu.set_real_size(size);
        gnu.sparse[0].set_offset(size - 512);
        gnu.sparse[0].set_length(512);
        header.set_cksum();
        tar.extend_from_slice(header.as_bytes());
        tar.extend_from_slice(&[b'x'; 512]);
    }
    tar.extend_from_slice(&[0u8; 1024]);
    tar
}

/// An old-format sparse file's apparent size counts against the layer's byte bound before any
/// of its holes is scanned: a tiny layer declaring a 1 TiB hole is `TooLarge` (never scanned
/// up to the bound and then called malformed), and so are entries each within the bound whose
/// holes together pass it (each used to be bounded alone, so a layer of many could keep an
/// unpack scanning zeros for hours).
#[tokio::test]
async fn old_format_sparse_holes_count_against_the_byte_bound() {
    let image = TestImage::new(vec![(old_sparse_layer(&[1 << 40]), Compression::Gzip)]);
    assert!(image.layers[0].0.len() < 4096, "a tiny layer");
    let attempt = import_image(&image, StoreOptions::default()).await;
    match &attempt.result {
        Err(ImageError::TooLarge { reason, .. }) => {
            assert!(reason.contains("sparse0"), "names the entry: {reason}")
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    assert_contained(&attempt);

    let options = || StoreOptions {
        max_layer_bytes: 64 << 20,
        ..StoreOptions::default()
    };
    let many = TestImage::new(vec![(
        old_sparse_layer(&[48 << 20, 48 << 20, 48 << 20]),
        Compression::Gzip,
    )]);
    let attempt = import_image(&many, options()).await;
    match &attempt.result {
        Err(ImageError::TooLarge { reason, .. }) => {
            assert!(reason.contains("sparse1"), "the second passes: {reason}")
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    assert_contained(&attempt);

    // Within the bound, an old-format sparse file unpacks with its holes kept.
    let one = TestImage::new(vec![(old_sparse_layer(&[48 << 20]), Compression::Gzip)]);
    let attempt = import_image(&one, options()).await;
    attempt
        .result
        .as_ref()
        .expect("a sparse file within the bound");
}

/// The store's bound holds for decompressed bytes, not only the compressed sizes checked
/// before a pull or import starts: a layer that decompresses past the room the store has left
/// is `TooLarge`, with nothing of it kept, while the images already stored stay.
#[tokio::test]
async fn layers_decompressing_past_the_store_room_are_refused() {
    // 4 MiB of zeros each: a few KiB compressed, far within the store's bound that way.
    let zeros = |name: &str| {
        TestImage::new(vec![(
            Layer::new().file(name, 0o644, &vec![0u8; 4 << 20]).tar(),
            Compression::Gzip,
        )])
    };
    let options = |mib: u64| StoreOptions {
        max_store_bytes: Some(mib << 20),
        ..StoreOptions::default()
    };
    let attempt = import_image(&zeros("a"), options(1)).await;
    match &attempt.result {
        Err(ImageError::TooLarge { reason, .. }) => {
            assert!(reason.contains("store"), "the store's bound: {reason}")
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    assert_contained(&attempt);

    // Room for one such layer and not two: the first is stored, the second refused.
    let root = TempDir::new("room");
    let store = Store::open(root.path().join("store"), options(6)).unwrap();
    for (name, image) in [("a", zeros("a")), ("b", zeros("b"))] {
        let layout = root.path().join(format!("layout-{name}"));
        image.write_oci_layout(&layout, Some(&format!("room.test/{name}:v1")));
        let result = store.import(&layout, None).await;
        if name == "a" {
            result.expect("the first fits");
        } else {
            assert!(
                matches!(result, Err(ImageError::TooLarge { .. })),
                "{result:?}"
            );
        }
    }
    let stored: Vec<_> = store
        .list()
        .unwrap()
        .into_iter()
        .flat_map(|i| i.references)
        .collect();
    assert_eq!(stored, ["room.test/a:v1"]);
    assert_nothing_partial(&root.path().join("store"));
    let layers = std::fs::read_dir(root.path().join("store/layers")).unwrap();
    assert_eq!(layers.count(), 2, "one layer and its record");
}
