//! Harness for the end-to-end tests: run a fixture program, compare its output with the
//! expected text in `fixtures/expected/`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Where a fixture's sandboxes live.
#[derive(Debug, Clone)]
pub enum Runtime {
    /// The embedded local engine (no `SANDCOVE_URL`).
    Embedded,
    /// A `sandcove serve` at this URL with this API key.
    Server {
        /// Base URL, e.g. `http://127.0.0.1:8730`.
        url: String,
        /// Its API key.
        api_key: String,
    },
}

/// The expected output file of fixture `name`.
pub fn expected_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/expected")
        .join(format!("{name}.txt"))
}

/// Run the fixture binary at `exe` on `runtime`; returns its stdout, panicking with its
/// stderr if it fails.
pub fn run_fixture(exe: &str, runtime: &Runtime) -> String {
    let mut cmd = Command::new(exe);
    cmd.env_remove("SANDCOVE_URL")
        .env_remove("SANDCOVE_API_KEY");
    if let Runtime::Server { url, api_key } = runtime {
        cmd.env("SANDCOVE_URL", url)
            .env("SANDCOVE_API_KEY", api_key);
    }
    let out = cmd.output().unwrap_or_else(|e| panic!("run {exe}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{exe} failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Whether `actual` matches the expected text, line by line; `{{any}}` matches any text
/// within a line.
pub fn matches_expected(expected: &str, actual: &str) -> Result<(), String> {
    let exp: Vec<&str> = expected.lines().collect();
    let act: Vec<&str> = actual.lines().collect();
    for (i, e) in exp.iter().enumerate() {
        let Some(a) = act.get(i) else {
            return Err(format!("line {}: expected {e:?}, output ended", i + 1));
        };
        let pattern = format!(
            "^{}$",
            e.split("{{any}}")
                .map(regex::escape)
                .collect::<Vec<_>>()
                .join(".*")
        );
        let re = regex::Regex::new(&pattern).map_err(|err| err.to_string())?;
        if !re.is_match(a) {
            return Err(format!("line {}: expected {e:?}, got {a:?}", i + 1));
        }
    }
    if act.len() > exp.len() {
        return Err(format!(
            "unexpected extra output from line {}: {:?}",
            exp.len() + 1,
            &act[exp.len()..]
        ));
    }
    Ok(())
}

/// Run fixture `name` (its binary at `exe`) on `runtime` and assert its output matches.
pub fn check_fixture(name: &str, exe: &str, runtime: &Runtime) {
    let expected = std::fs::read_to_string(expected_path(name))
        .unwrap_or_else(|e| panic!("expected output of {name}: {e}"));
    let actual = run_fixture(exe, runtime);
    if let Err(diff) = matches_expected(&expected, &actual) {
        panic!("{name} on {runtime:?}: {diff}\n--- actual output\n{actual}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards_match_within_a_line_only() {
        assert!(matches_expected("id: {{any}}\nok", "id: abc\nok\n").is_ok());
        assert!(matches_expected("id: {{any}}", "id: a\nextra").is_err());
        assert!(matches_expected("a.b", "axb").is_err(), "text is literal");
        assert!(matches_expected("x\ny", "x").is_err());
    }
}
