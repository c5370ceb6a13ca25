//! The gap table in the code matches MAPPING.md's E2B section, every refusal in the code uses a
//! listed gap, and the product stubs refuse before any effect.

use e2b::gaps::GAPS;

#[test]
fn mapping_lists_exactly_the_gaps_of_the_code() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../MAPPING.md"))
        .expect("MAPPING.md");
    if let Err(differences) = sandcove_compat_support::gap::check_mapping(&text, "E2B", GAPS) {
        panic!("{differences}");
    }
}

#[test]
fn every_refusal_in_the_code_is_a_listed_gap_and_every_gap_is_used() {
    let mut used = Vec::new();
    // Every source file, the wire protocol's modules included.
    let mut dirs = vec![std::path::PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/src"
    ))];
    let mut files = Vec::new();
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("a source directory") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().and_then(|e| e.to_str()) == Some("rs") {
                files.push(path);
            }
        }
    }
    for path in files {
        let text = std::fs::read_to_string(&path).expect("source");
        for part in text.split("refuse(\"").skip(1) {
            let key = part.split('"').next().unwrap().to_string();
            used.push((key, path.display().to_string()));
        }
    }
    for (key, file) in &used {
        if key == "mcp" && file.ends_with("gaps.rs") {
            continue; // the unit test's own example
        }
        assert!(
            GAPS.iter().any(|g| g.key == key),
            "{file} refuses unknown gap {key:?}"
        );
    }
    for gap in GAPS {
        assert!(
            used.iter()
                .any(|(k, f)| k == gap.key && !f.ends_with("gaps.rs")),
            "gap {:?} is listed but never raised",
            gap.key
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn product_stubs_refuse() {
    for result in [
        e2b::Volume::create("v").await.map(|_| ()),
        e2b::Volume::list().await.map(|_| ()),
        e2b::Template::exists("t").await.map(|_| ()),
        e2b::Template::build(e2b::Template::new(), "alias").await,
        e2b::Secret::create("k", "v").await.map(|_| ()),
    ] {
        let err = result.unwrap_err();
        assert!(err.is_not_supported(), "{err:?}");
    }
    let sbx = e2b::Sandbox::create().timeout(30).await.expect("create");
    assert!(sbx
        .git
        .clone("https://example.invalid/repo.git")
        .await
        .unwrap_err()
        .is_not_supported());
    assert!(
        !sbx.files.exists("repo").await.expect("exists"),
        "nothing cloned"
    );
    sbx.kill().await.expect("kill");
}
