//! Pure translation functions: durations, dates, names, paths, globs, shell quoting, process
//! status. No I/O; table-tested.

use std::time::Duration;

/// Regions Blaxel names in its code and docs; any other region is refused.
pub const REGIONS: &[&str] = &["us-pdx-1", "eu-lon-1", "us-was-1", "eu-dub-1", "eu-fra-1"];

/// Blaxel's default image.
pub const DEFAULT_IMAGE: &str = "blaxel/base-image:latest";

/// Whether a Blaxel `image` denotes the runtime's host base (the one base it runs):
/// `blaxel/base-image` with any tag, and the code interpreter's `blaxel/jupyter-server`
/// (served by this facade's own interpreter). Every other image is refused.
pub fn is_host_base_image(image: &str) -> bool {
    let name = image.split_once(':').map_or(image, |(n, _)| n);
    name == "blaxel/base-image" || image == "blaxel/jupyter-server"
}

/// Blaxel's default memory, in MB.
pub const DEFAULT_MEMORY: i64 = 4096;

/// Blaxel's home and default working directory.
pub const HOME: &str = "/blaxel";

/// Directories `find` and `grep` skip by default.
pub const DEFAULT_EXCLUDE_DIRS: &[&str] = &[
    "node_modules",
    "vendor",
    ".git",
    "dist",
    "build",
    "target",
    "__pycache__",
    ".venv",
    ".next",
    "coverage",
];

/// Parse a Blaxel duration: `30s`, `5m`, `24h`, `7d`, `2w` (a bare number is seconds).
pub fn parse_duration(text: &str) -> Option<Duration> {
    let t = text.trim();
    if t.is_empty() {
        return None;
    }
    let (num, unit) = match t.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => t.split_at(i),
        None => (t, "s"),
    };
    let n: u64 = num.parse().ok()?;
    let secs = match unit {
        "s" => n,
        "m" => n.checked_mul(60)?,
        "h" => n.checked_mul(3600)?,
        "d" => n.checked_mul(86_400)?,
        "w" => n.checked_mul(7 * 86_400)?,
        _ => return None,
    };
    Some(Duration::from_secs(secs))
}

/// Whether `name` is a valid Blaxel resource name: lowercase letters, digits and `-`, at most
/// 49 characters.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 49
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

// ----- dates -----

/// `Wed, 01 Jan 2023 12:00:00 GMT`, the format of process `startedAt`/`completedAt`.
pub fn format_rfc1123(ms: u64) -> String {
    sandcove_compat_support::dates::rfc1123(ms)
}

/// `2023-01-01T12:00:00.123Z` (RFC 3339, UTC, milliseconds).
pub fn format_rfc3339(ms: u64) -> String {
    sandcove_compat_support::dates::rfc3339_millis(ms)
}

/// Parse an ISO-8601 date-time (`2026-01-02T03:04:05`, optional fraction, optional `Z` or
/// `±HH:MM`; a naive time is UTC, as the Python SDK appends `Z`) into ms since the epoch.
pub fn parse_iso8601(text: &str) -> Option<u64> {
    sandcove_compat_support::dates::parse_iso8601(text)
}

// ----- processes -----

/// Quote `s` for a POSIX shell.
pub fn shell_quote(s: &str) -> String {
    sandcove_compat_support::shell::quote(s)
}

/// Expand `~` to the home and collapse `//` in a working directory.
pub fn expand_working_dir(dir: &str, home: &str) -> String {
    let expanded = if dir == "~" {
        home.to_string()
    } else if let Some(rest) = dir.strip_prefix("~/") {
        format!("{home}/{rest}")
    } else {
        dir.to_string()
    };
    let mut out = String::with_capacity(expanded.len());
    for c in expanded.chars() {
        if c == '/' && out.ends_with('/') {
            continue;
        }
        out.push(c);
    }
    out
}

/// The core restart policy for Blaxel's `max_restarts` (negative is unlimited).
pub fn restart_policy(max_restarts: i64) -> sandcove::RestartPolicy {
    let mut policy = sandcove::RestartPolicy::default();
    policy.max_restarts =
        (max_restarts >= 0).then(|| u32::try_from(max_restarts).unwrap_or(u32::MAX));
    policy
}

/// The line Blaxel prints into a process's output before restart `n` (with its newline).
pub fn restart_line(previous: &sandcove::ExitStatus, n: u32, max: Option<u32>) -> String {
    let shown = max.map_or_else(|| "unlimited".to_string(), |m| m.to_string());
    format!(
        "[Process failed with exit code {}. Attempting restart {n}/{shown}...]\n",
        previous.code_or_signal()
    )
}

/// Blaxel's status and exit code for a process: `mark` is `stopped`/`killed` when the facade
/// stopped or killed it.
pub fn process_status(
    exit: Option<&sandcove::ExitStatus>,
    mark: Option<&str>,
) -> (&'static str, i64) {
    match exit {
        None => ("running", 0),
        Some(e) => {
            let code = match (e.code, e.signal) {
                (Some(c), _) => i64::from(c),
                _ => -1,
            };
            let status = match mark {
                Some("stopped") => "stopped",
                Some("killed") => "killed",
                _ if code == 0 => "completed",
                _ => "failed",
            };
            (status, code)
        }
    }
}

/// Ports listening on a routable address in the text of `/proc/net/tcp` or `tcp6`
/// (loopback-only binds do not count, as on Blaxel).
pub fn routable_listening_ports(proc_net: &str) -> Vec<u16> {
    let mut ports = Vec::new();
    for line in proc_net.lines().skip(1) {
        let cols: Vec<&str> = line.split_whitespace().collect();
        if cols.len() < 4 || cols[3] != "0A" {
            continue;
        }
        let Some((addr, port)) = cols[1].split_once(':') else {
            continue;
        };
        let loopback = addr == "0100007F"
            || addr == "00000000000000000000000001000000"
            || (addr.len() == 8 && addr.ends_with("7F"));
        if loopback {
            continue;
        }
        if let Ok(p) = u16::from_str_radix(port, 16) {
            ports.push(p);
        }
    }
    ports
}

// ----- files -----

/// Whether `name` matches the glob `pattern` (`*`, `?` and `[...]` classes).
pub fn glob_match(pattern: &str, name: &str) -> bool {
    fn rec(p: &[char], n: &[char]) -> bool {
        match p.first() {
            None => n.is_empty(),
            Some('*') => (0..=n.len()).any(|i| rec(&p[1..], &n[i..])),
            Some('?') => !n.is_empty() && rec(&p[1..], &n[1..]),
            Some('[') => {
                let Some(end) = p.iter().skip(1).position(|&c| c == ']').map(|i| i + 1) else {
                    return n.first() == Some(&'[') && rec(&p[1..], &n[1..]);
                };
                let Some(&c) = n.first() else { return false };
                let class = &p[1..end];
                let (negate, class) = match class.first() {
                    Some('!') | Some('^') => (true, &class[1..]),
                    _ => (false, class),
                };
                let mut hit = false;
                let mut i = 0;
                while i < class.len() {
                    if i + 2 < class.len() && class[i + 1] == '-' {
                        hit |= class[i] <= c && c <= class[i + 2];
                        i += 3;
                    } else {
                        hit |= class[i] == c;
                        i += 1;
                    }
                }
                hit != negate && rec(&p[end + 1..], &n[1..])
            }
            Some(&c) => n.first() == Some(&c) && rec(&p[1..], &n[1..]),
        }
    }
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    rec(&p, &n)
}

/// Blaxel's grep rule for one line: plain substring, case-insensitive unless asked; the
/// 1-based column (in characters) of the first match.
pub fn grep_line(line: &str, query: &str, case_sensitive: bool) -> Option<i64> {
    if query.is_empty() {
        return None;
    }
    let at = if case_sensitive {
        line.find(query)?
    } else {
        line.to_lowercase().find(&query.to_lowercase())?
    };
    let prefix = if case_sensitive {
        &line[..at]
    } else {
        // Lowercasing can change byte lengths; count characters in the lowered text instead.
        return Some(line.to_lowercase()[..at].chars().count() as i64 + 1);
    };
    Some(prefix.chars().count() as i64 + 1)
}

/// The path of `entry` (absolute) relative to the directory `base` (absolute).
pub fn relative_to(entry: &str, base: &str) -> String {
    let base = base.trim_end_matches('/');
    entry
        .strip_prefix(base)
        .map(|r| r.trim_start_matches('/').to_string())
        .unwrap_or_else(|| entry.to_string())
}

/// The path Blaxel shows for an entry listed under `input`: absolute for absolute inputs and
/// for `.`, otherwise relative like the input (`ls("src")` → `src/a.txt`).
pub fn shown_path(input: &str, resolved_dir: &str, entry_abs: &str) -> String {
    if input.starts_with('/') || input.is_empty() || input == "." {
        return entry_abs.to_string();
    }
    let rel = relative_to(entry_abs, resolved_dir);
    let base = input.trim_end_matches('/');
    if rel.is_empty() {
        base.to_string()
    } else {
        format!("{base}/{rel}")
    }
}

/// The last component of a path.
pub fn basename(path: &str) -> String {
    let trimmed = path.trim_end_matches('/');
    if trimmed.is_empty() {
        return "/".into();
    }
    trimmed.rsplit('/').next().unwrap_or(trimmed).to_string()
}

/// The parent directory of an absolute path.
pub fn parent(path: &str) -> String {
    let trimmed = path.trim_end_matches('/');
    match trimmed.rfind('/') {
        Some(0) | None => "/".into(),
        Some(i) => trimmed[..i].to_string(),
    }
}

/// Parse an octal permission string such as `"0755"` or `"644"`.
pub fn parse_permissions(text: &str) -> Option<u32> {
    let t = text.trim();
    if t.is_empty() {
        return None;
    }
    u32::from_str_radix(t, 8).ok().filter(|m| *m <= 0o7777)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let table = [
            ("30s", Some(30)),
            ("5m", Some(300)),
            ("24h", Some(86_400)),
            ("7d", Some(604_800)),
            ("2w", Some(1_209_600)),
            ("90", Some(90)),
            ("", None),
            ("5x", None),
            ("h", None),
            ("-5m", None),
        ];
        for (text, secs) in table {
            assert_eq!(parse_duration(text).map(|d| d.as_secs()), secs, "{text}");
        }
    }

    #[test]
    fn dates_format_and_parse() {
        assert_eq!(format_rfc1123(0), "Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(
            format_rfc1123(1_672_574_400_000),
            "Sun, 01 Jan 2023 12:00:00 GMT"
        );
        assert_eq!(
            format_rfc3339(1_672_574_400_123),
            "2023-01-01T12:00:00.123Z"
        );
        let table = [
            ("2023-01-01T12:00:00Z", Some(1_672_574_400_000)),
            ("2023-01-01T12:00:00", Some(1_672_574_400_000)),
            ("2023-01-01T12:00:00.5Z", Some(1_672_574_400_500)),
            ("2023-01-01T14:00:00+02:00", Some(1_672_574_400_000)),
            ("2023-01-01 12:00:00.123456", Some(1_672_574_400_123)),
            ("2024-02-29T00:00:00Z", Some(1_709_164_800_000)),
            ("2023-13-01T00:00:00Z", None),
            ("yesterday", None),
        ];
        for (text, ms) in table {
            assert_eq!(parse_iso8601(text), ms, "{text}");
        }
        for ms in [0u64, 951_782_400_000, 1_709_164_800_000, 4_102_444_800_999] {
            assert_eq!(parse_iso8601(&format_rfc3339(ms)), Some(ms));
        }
    }

    #[test]
    fn names_and_quoting() {
        assert!(valid_name("my-sandbox"));
        assert!(!valid_name("My_Sandbox"));
        assert!(!valid_name(&"a".repeat(50)));
        assert_eq!(shell_quote("/tmp/a"), "/tmp/a");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(expand_working_dir("~/app", "/blaxel"), "/blaxel/app");
        assert_eq!(expand_working_dir("//tmp//x", "/blaxel"), "/tmp/x");
    }

    #[test]
    fn statuses() {
        let exited = |code: Option<i32>, signal: Option<i32>| sandcove::ExitStatus {
            code,
            signal,
            timed_out: false,
        };
        assert_eq!(process_status(None, None), ("running", 0));
        assert_eq!(
            process_status(Some(&exited(Some(0), None)), None),
            ("completed", 0)
        );
        assert_eq!(
            process_status(Some(&exited(Some(42), None)), None),
            ("failed", 42)
        );
        assert_eq!(
            process_status(Some(&exited(None, Some(15))), Some("stopped")),
            ("stopped", -1)
        );
        assert_eq!(
            process_status(Some(&exited(None, Some(9))), Some("killed")),
            ("killed", -1)
        );
        assert_eq!(
            process_status(Some(&exited(None, Some(9))), None),
            ("failed", -1)
        );
    }

    #[test]
    fn listening_ports_skip_loopback() {
        let text = "  sl  local_address rem_address   st\n\
            0: 00000000:0BB8 00000000:0000 0A 0\n\
            1: 0100007F:1F90 00000000:0000 0A 0\n\
            2: 00000000:0050 0100007F:1234 01 0\n";
        assert_eq!(routable_listening_ports(text), [3000]);
        let v6 = "  sl  local_address\n\
            0: 00000000000000000000000000000000:0BB9 00000000000000000000000000000000:0000 0A\n\
            1: 00000000000000000000000001000000:0BBA 00000000000000000000000000000000:0000 0A\n";
        assert_eq!(routable_listening_ports(v6), [3001]);
    }

    #[test]
    fn globs() {
        let table = [
            ("*.md", "README.md", true),
            ("*.md", "README.mdx", false),
            ("a?c", "abc", true),
            ("[ab]*", "beta", true),
            ("[!ab]*", "beta", false),
            ("[a-c]x", "bx", true),
            ("*", "", true),
            ("*.py", "dir/x.py", true),
        ];
        for (p, n, want) in table {
            assert_eq!(glob_match(p, n), want, "{p} {n}");
        }
    }

    #[test]
    fn grep_rules() {
        assert_eq!(grep_line("Hello World", "world", false), Some(7));
        assert_eq!(grep_line("Hello World", "world", true), None);
        assert_eq!(grep_line("héllo world", "WORLD", false), Some(7));
        assert_eq!(grep_line("abcabc", "c", true), Some(3));
        assert_eq!(grep_line("abc", "", false), None);
    }

    #[test]
    fn paths() {
        assert_eq!(relative_to("/app/src/a.txt", "/app"), "src/a.txt");
        assert_eq!(relative_to("/app/src/a.txt", "/app/"), "src/a.txt");
        assert_eq!(shown_path("src", "/blaxel/src", "/blaxel/src/a"), "src/a");
        assert_eq!(shown_path(".", "/blaxel", "/blaxel/a"), "/blaxel/a");
        assert_eq!(shown_path("/app", "/app", "/app/x"), "/app/x");
        assert_eq!(basename("/app/x.txt"), "x.txt");
        assert_eq!(basename("/"), "/");
        assert_eq!(parent("/app/x.txt"), "/app");
        assert_eq!(parent("/x"), "/");
        assert_eq!(parse_permissions("0755"), Some(0o755));
        assert_eq!(parse_permissions("644"), Some(0o644));
        assert_eq!(parse_permissions("9"), None);
    }

    #[test]
    fn restart_policies_and_lines() {
        assert_eq!(restart_policy(3).max_restarts, Some(3));
        assert_eq!(restart_policy(-1).max_restarts, None);
        let failed = sandcove::ExitStatus {
            code: Some(2),
            signal: None,
            timed_out: false,
        };
        assert_eq!(
            restart_line(&failed, 1, Some(3)),
            "[Process failed with exit code 2. Attempting restart 1/3...]\n"
        );
        assert!(restart_line(&failed, 4, None).contains("4/unlimited"));
    }
}
