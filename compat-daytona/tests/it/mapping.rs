//! The gap table in the code and the Daytona section of MAPPING.md list the same features
//! with the same alternatives.

fn daytona_section() -> String {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../MAPPING.md"))
        .expect("MAPPING.md at the repository root");
    let start = text.find("\n## Daytona").expect("a Daytona section");
    let rest = &text[start + 1..];
    let end = rest[3..].find("\n## ").map(|i| i + 3).unwrap_or(rest.len());
    rest[..end].to_string()
}

#[test]
fn every_gap_in_the_code_is_in_mapping_md_and_back() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../MAPPING.md"))
        .expect("MAPPING.md at the repository root");
    if let Err(differences) =
        sandcove_compat_support::gap::check_mapping(&text, "Daytona", daytona::gaps::GAPS)
    {
        panic!("{differences}");
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
