//! E2B template names mapped to images: what `Sandbox.create(template=NAME)` runs.
//!
//! E2B builds a template once and names it; here a template is an image the runtime has
//! stored (pulled or imported), named either directly by its reference or through this table:
//! `SANDCOVE_E2B_TEMPLATES` holds `NAME=IMAGE` pairs separated by commas (a program sets it,
//! or `sandcove serve --e2b-template NAME=IMAGE` installs the table with [`configure`]). The
//! default templates `base` and `code-interpreter-v1` run the host base unless the table maps
//! them to an image.

use std::collections::BTreeMap;
use std::sync::OnceLock;

/// The environment variable holding the table (`NAME=IMAGE,NAME=IMAGE`).
pub const TEMPLATES_ENV: &str = "SANDCOVE_E2B_TEMPLATES";

static TABLE: OnceLock<BTreeMap<String, String>> = OnceLock::new();

/// Parse a table: `NAME=IMAGE` pairs separated by commas or newlines; blank entries skipped.
/// A pair without `=`, or with an empty side, is an error naming it.
pub fn parse(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut table = BTreeMap::new();
    for pair in text
        .split([',', '\n'])
        .map(str::trim)
        .filter(|p| !p.is_empty())
    {
        match pair.split_once('=') {
            Some((name, image)) if !name.trim().is_empty() && !image.trim().is_empty() => {
                table.insert(name.trim().to_string(), image.trim().to_string());
            }
            _ => return Err(format!("template mapping {pair:?} is not NAME=IMAGE")),
        }
    }
    Ok(table)
}

/// Install this process's table (before the first create reads it); `false` if one is
/// already in use.
pub fn configure(table: BTreeMap<String, String>) -> bool {
    TABLE.set(table).is_ok()
}

/// The image template `name` maps to, if the table names it. The table is read from
/// [`TEMPLATES_ENV`] at first use unless [`configure`] installed one; a malformed variable
/// maps nothing (and is reported then, once).
pub fn image_for(name: &str) -> Option<String> {
    TABLE
        .get_or_init(|| match std::env::var(TEMPLATES_ENV) {
            Ok(text) => parse(&text).unwrap_or_else(|e| {
                tracing::warn!("{TEMPLATES_ENV}: {e}; no template is mapped");
                BTreeMap::new()
            }),
            Err(_) => BTreeMap::new(),
        })
        .get(name)
        .cloned()
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn a_table_is_name_image_pairs() {
        let table = parse("base=debian:bookworm-slim, my-py = python:3.12-slim\n").unwrap();
        assert_eq!(table["base"], "debian:bookworm-slim");
        assert_eq!(table["my-py"], "python:3.12-slim");
        assert!(parse("").unwrap().is_empty());
        assert!(parse("base").unwrap_err().contains("\"base\""));
        assert!(parse("=x").is_err());
    }
}
