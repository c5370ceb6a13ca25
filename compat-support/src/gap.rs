//! One refused vendor feature, and the check that keeps a facade's gap table and MAPPING.md in
//! step.
//!
//! Each facade keeps its own table of [`Gap`]s and turns one into its vendor's NotSupported
//! error; the table's rows are the rows of the `### Gaps` table in the facade's section of
//! MAPPING.md, which [`check_mapping`] compares.

use std::collections::BTreeMap;

/// One refused feature.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gap {
    /// Stable key used in the code and as the first column of MAPPING.md's row.
    pub key: &'static str,
    /// The vendor call or option, as a user of the vendor's SDK writes it.
    pub feature: &'static str,
    /// What to do instead.
    pub alternative: &'static str,
}

/// The gap with this key in `table`.
pub fn find<'t>(table: &'t [Gap], key: &str) -> Option<&'t Gap> {
    table.iter().find(|g| g.key == key)
}

/// The rows of the `### Gaps` table in the `## {vendor}` section of MAPPING.md's text, each a
/// list of cells (backticks around the first cell and `\|` escapes removed).
pub fn mapping_rows(mapping: &str, vendor: &str) -> Result<Vec<Vec<String>>, String> {
    let heading = format!("\n## {vendor}\n");
    let start = mapping
        .find(&heading)
        .ok_or_else(|| format!("MAPPING.md has no `## {vendor}` section"))?;
    let section = &mapping[start + heading.len()..];
    let section = &section[..section.find("\n## ").unwrap_or(section.len())];
    let gaps = section
        .split("\n### Gaps")
        .nth(1)
        .ok_or_else(|| format!("the {vendor} section has no `### Gaps` table"))?;
    let gaps = &gaps[..gaps.find("\n### ").unwrap_or(gaps.len())];
    Ok(gaps
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            l.trim()
                .trim_matches('|')
                .split(" | ")
                .enumerate()
                .map(|(i, c)| {
                    let c = c.trim().replace("\\|", "|");
                    if i == 0 {
                        c.trim_matches('`').to_string()
                    } else {
                        c
                    }
                })
                .collect()
        })
        .collect())
}

/// Compare `table` with the `### Gaps` table of the `## {vendor}` section of MAPPING.md.
///
/// A row is `| \`key\` | feature | alternative |`, or `| \`key\` | alternative |` where the key
/// names the feature itself. Every gap must have exactly one row with the same cells and every
/// row a gap; keys must be unique. The error lists every difference.
pub fn check_mapping(mapping: &str, vendor: &str, table: &[Gap]) -> Result<(), String> {
    let rows = mapping_rows(mapping, vendor)?;
    let mut problems = Vec::new();
    let mut coded: BTreeMap<&str, &Gap> = BTreeMap::new();
    for gap in table {
        if coded.insert(gap.key, gap).is_some() {
            problems.push(format!("key {:?} appears twice in the code", gap.key));
        }
    }
    let mut listed = BTreeMap::new();
    for row in &rows {
        if listed.insert(row[0].clone(), row.clone()).is_some() {
            problems.push(format!("key {:?} appears twice in MAPPING.md", row[0]));
        }
    }
    for (key, gap) in &coded {
        let Some(row) = listed.get(*key) else {
            problems.push(format!("gap {key:?} is not in MAPPING.md"));
            continue;
        };
        let expected: Vec<&str> = match row.len() {
            2 => vec![gap.key, gap.alternative],
            3 => vec![gap.key, gap.feature, gap.alternative],
            n => {
                problems.push(format!("row {key:?} has {n} cells, not 2 or 3"));
                continue;
            }
        };
        if row.iter().map(String::as_str).ne(expected.iter().copied()) {
            problems.push(format!(
                "row {key:?} differs:\n  MAPPING.md {row:?}\n  code       {expected:?}"
            ));
        }
    }
    for key in listed.keys() {
        if !coded.contains_key(key.as_str()) {
            problems.push(format!(
                "MAPPING.md lists {key:?}, which the code does not refuse"
            ));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!("{vendor} gaps: {}", problems.join("\n")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "# Mapping\n\n## Acme\n\n### Calls\n\n| `x` | no |\n\n### Gaps\n\n\
        | key | feature | alternative |\n|---|---|---|\n\
        | `mcp` | create(mcp=...) | start it yourself |\n\
        | `net` | network={a\\|b} | loopback |\n\n### Other\n\n| `zzz` | ignored | here |\n\n\
        ## Other\n\n### Gaps\n\n| `only` | elsewhere |\n";

    const TABLE: &[Gap] = &[
        Gap {
            key: "mcp",
            feature: "create(mcp=...)",
            alternative: "start it yourself",
        },
        Gap {
            key: "net",
            feature: "network={a|b}",
            alternative: "loopback",
        },
    ];

    #[test]
    fn an_equal_table_passes_and_lookup_finds_keys() {
        check_mapping(DOC, "Acme", TABLE).unwrap();
        assert_eq!(find(TABLE, "net").unwrap().alternative, "loopback");
        assert!(find(TABLE, "nope").is_none());
        let two_columns = [Gap {
            key: "only",
            feature: "only",
            alternative: "elsewhere",
        }];
        check_mapping(DOC, "Other", &two_columns).unwrap();
    }

    #[test]
    fn every_kind_of_difference_is_reported() {
        let changed = [
            Gap {
                key: "mcp",
                feature: "create(mcp=...)",
                alternative: "start it yourselves",
            },
            Gap {
                key: "new",
                feature: "new()",
                alternative: "none",
            },
        ];
        let err = check_mapping(DOC, "Acme", &changed).unwrap_err();
        assert!(err.contains("row \"mcp\" differs"), "{err}");
        assert!(err.contains("gap \"new\" is not in MAPPING.md"), "{err}");
        assert!(err.contains("MAPPING.md lists \"net\""), "{err}");
        assert!(check_mapping(DOC, "Missing", TABLE).is_err());
        assert!(check_mapping("## Acme\n", "Acme", TABLE).is_err());
    }
}
