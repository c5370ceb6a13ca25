//! The gap table in the code matches MAPPING.md's E2B section, every refusal in the code uses a
//! listed gap, and the product stubs refuse before any effect.

use e2b::gaps::GAPS;

fn e2b_section() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../MAPPING.md");
    let text = std::fs::read_to_string(path).expect("MAPPING.md");
    let start = text.find("\n## E2B\n").expect("an E2B section");
    let rest = &text[start + 1..];
    let end = rest[3..].find("\n## ").map(|i| i + 3).unwrap_or(rest.len());
    rest[..end].to_string()
}

#[test]
fn mapping_lists_exactly_the_gaps_of_the_code() {
    let section = e2b_section();
    let gaps = section
        .split("### Gaps")
        .nth(1)
        .expect("a Gaps subsection")
        .split("\n### ")
        .next()
        .unwrap()
        .to_string();
    let rows: Vec<(String, String, String)> = gaps
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<String> = l
                .trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().replace("\\|", "|"))
                .collect();
            (
                cells[0].trim_matches('`').to_string(),
                cells[1].clone(),
                cells[2].clone(),
            )
        })
        .collect();
    let listed: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    let coded: Vec<&str> = GAPS.iter().map(|g| g.key).collect();
    assert_eq!(listed, coded, "MAPPING.md's E2B gaps and gaps::GAPS differ");
    for (row, gap) in rows.iter().zip(GAPS) {
        assert_eq!(row.1, gap.feature, "feature of {}", gap.key);
        assert_eq!(row.2, gap.alternative, "alternative of {}", gap.key);
    }
}

#[test]
fn every_refusal_in_the_code_is_a_listed_gap_and_every_gap_is_used() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src");
    let mut used = Vec::new();
    for entry in std::fs::read_dir(dir).expect("src") {
        let path = entry.expect("entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("rs") {
            continue;
        }
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
