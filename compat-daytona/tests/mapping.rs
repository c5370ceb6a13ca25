//! The gap table in the code and the Daytona section of MAPPING.md list the same features
//! with the same alternatives.

use std::collections::BTreeMap;

fn daytona_section() -> String {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../MAPPING.md"))
        .expect("MAPPING.md at the repository root");
    let start = text.find("\n## Daytona").expect("a Daytona section");
    let rest = &text[start + 1..];
    let end = rest[3..].find("\n## ").map(|i| i + 3).unwrap_or(rest.len());
    rest[..end].to_string()
}

fn documented_gaps() -> BTreeMap<String, String> {
    let section = daytona_section();
    let gaps = section
        .split("\n### Gaps")
        .nth(1)
        .expect("a Gaps subsection in the Daytona section");
    let table = gaps.split("\n### ").next().unwrap_or_default();
    table
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split(" | ").collect();
            (
                cells[0].trim().trim_matches('`').to_string(),
                cells.get(1).unwrap_or(&"").trim().to_string(),
            )
        })
        .collect()
}

#[test]
fn every_gap_in_the_code_is_in_mapping_md_and_back() {
    let documented = documented_gaps();
    let coded: BTreeMap<String, String> = daytona::gaps::GAPS
        .iter()
        .map(|g| (g.feature.to_string(), g.alternative.to_string()))
        .collect();
    assert_eq!(
        documented.keys().collect::<Vec<_>>(),
        coded.keys().collect::<Vec<_>>(),
        "MAPPING.md's Daytona gaps and gaps::GAPS differ"
    );
    for (feature, alternative) in &coded {
        assert_eq!(
            &documented[feature], alternative,
            "alternative of {feature}"
        );
    }
}

#[test]
fn the_section_describes_calls_and_differences() {
    let section = daytona_section();
    for heading in [
        "### Calls",
        "### Gaps",
        "### Differences that are not refusals",
    ] {
        assert!(section.contains(heading), "missing {heading}");
    }
    for call in [
        "process.exec",
        "process.code_run",
        "execute_session_command",
        "fs.upload_file",
        "git.clone",
        "get_preview_link",
        "daytona.volume",
        "daytona.snapshot",
    ] {
        assert!(section.contains(call), "{call} is not mapped");
    }
}
