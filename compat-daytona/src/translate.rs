//! Pure translation between Daytona's vocabulary and the runtime's: paths, env names, command
//! lines, modes, times, globs. No I/O here; everything is table-tested.

use std::time::Duration;

use crate::errors::DaytonaError;

/// Daytona's default OS user.
pub const DAYTONA_USER: &str = "daytona";
/// Daytona's default home and work directory.
pub const DAYTONA_HOME: &str = "/home/daytona";
/// Label that stores the sandbox language, as on Daytona.
pub const LANGUAGE_LABEL: &str = "code-toolbox-language";
/// Prefix of the labels the facade keeps for itself (hidden from `Sandbox.labels`).
pub const META_PREFIX: &str = "sandcove.daytona/";
/// Default auto-stop interval in minutes.
pub const DEFAULT_AUTO_STOP: i64 = 15;
/// Default auto-archive interval in minutes (7 days).
pub const DEFAULT_AUTO_ARCHIVE: i64 = 7 * 24 * 60;
/// Lease given to a sandbox whose auto-stop is disabled (`0`): 30 days.
pub const NEVER_STOP_LEASE: Duration = Duration::from_secs(30 * 24 * 3600);

/// Resolve a Daytona path: absolute paths stay, relative ones (and `.`) are joined to the work
/// dir. No `~` expansion, as on Daytona.
pub fn resolve_path(work_dir: &str, path: &str) -> String {
    if path.starts_with('/') {
        return path.to_string();
    }
    let rest = path.trim_start_matches("./");
    let rest = if rest == "." { "" } else { rest };
    let base = work_dir.trim_end_matches('/');
    if rest.is_empty() {
        if base.is_empty() {
            "/".into()
        } else {
            base.to_string()
        }
    } else {
        format!("{base}/{rest}")
    }
}

/// Daytona's env name rule: `^[A-Za-z_][A-Za-z0-9_]*$`.
pub fn check_env_name(name: &str) -> Result<(), DaytonaError> {
    let mut chars = name.chars();
    let ok = matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(DaytonaError::validation(format!(
            "invalid environment variable name: '{name}'"
        )))
    }
}

/// The script `exec` runs under bash: stderr joins stdout in one pipe first, so `result`
/// holds both in the order they were written, as Daytona's single buffer does.
pub fn exec_script(command: &str) -> String {
    format!("exec 2>&1; {command}")
}

/// Quote one word for a POSIX shell.
pub fn quote(word: &str) -> String {
    sandcove_compat_support::shell::quote(word)
}

/// The shell command `code_run` executes for `language`, as Daytona's daemon builds it: the
/// code travels base64-encoded, argv words are joined with spaces **unquoted**.
pub fn code_run_command(language: &str, code: &str, argv: &[String]) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(code);
    let args = if argv.is_empty() {
        String::new()
    } else {
        format!(" {}", argv.join(" "))
    };
    match language {
        "javascript" => format!("printf '%s' '{b64}' | base64 -d | node -{args}"),
        "typescript" => format!(
            "printf '%s' '{b64}' | base64 -d > /tmp/dtn_$$.ts && npx ts-node -T --ignore-diagnostics 5107 \
             -O '{{\"module\":\"CommonJS\"}}' /tmp/dtn_$$.ts{args}; dtn_ec=$?; rm -f /tmp/dtn_$$.ts; exit $dtn_ec"
        ),
        _ => format!("printf '%s' '{b64}' | base64 -d | python3 -u -{args}"),
    }
}

/// Check a `CodeLanguage` value.
pub fn check_language(language: &str) -> Result<(), DaytonaError> {
    match language {
        "python" | "typescript" | "javascript" => Ok(()),
        other => Err(DaytonaError::validation(format!(
            "Invalid code-toolbox-language: {other}"
        ))),
    }
}

/// The sandbox lease for an auto-stop interval in minutes (`0` = never stop).
pub fn lease_for_auto_stop(minutes: i64) -> Duration {
    if minutes <= 0 {
        NEVER_STOP_LEASE
    } else {
        Duration::from_secs(minutes as u64 * 60)
    }
}

/// Parse Daytona's octal mode string (`"755"`, `"0644"`).
pub fn parse_mode(mode: &str) -> Result<u32, DaytonaError> {
    let trimmed = mode.trim();
    u32::from_str_radix(trimmed, 8)
        .ok()
        .filter(|m| !trimmed.is_empty() && *m <= 0o7777)
        .ok_or_else(|| DaytonaError::validation(format!("invalid mode format: {mode:?}")))
}

/// Go's `FileMode.String()` for a kind and permission bits: `-rw-r--r--`, `drwxr-xr-x`.
pub fn go_mode_string(kind: sandcove::FileKind, mode: u32) -> String {
    let mut s = String::new();
    s.push(match kind {
        sandcove::FileKind::Dir => 'd',
        sandcove::FileKind::Symlink => 'L',
        _ => '-',
    });
    for (i, c) in "rwxrwxrwx".chars().enumerate() {
        s.push(if mode & (1 << (8 - i)) != 0 { c } else { '-' });
    }
    s
}

/// RFC 3339 UTC time for milliseconds since the epoch (`2026-01-02T03:04:05.678Z`).
pub fn rfc3339(millis: u64) -> String {
    sandcove_compat_support::dates::rfc3339_millis(millis)
}

/// Go's `time.String()` in UTC (`2026-01-02 03:04:05.678 +0000 UTC`), Daytona's `mod_time`.
pub fn go_time_string(millis: u64) -> String {
    sandcove_compat_support::dates::go_time_string(millis)
}

/// Shell glob match of a base name: `*`, `?`, `[...]` (with `!`/`^` negation and ranges).
pub fn glob_match(pattern: &str, name: &str) -> bool {
    fn class(p: &[char], c: char) -> Option<(bool, usize)> {
        // p starts after '['; returns (matched, length consumed including ']')
        let mut i = 0;
        let negate = matches!(p.first(), Some('!') | Some('^'));
        if negate {
            i += 1;
        }
        let mut matched = false;
        let start = i;
        while i < p.len() {
            if p[i] == ']' && i > start {
                return Some((matched != negate, i + 1));
            }
            if i + 2 < p.len() && p[i + 1] == '-' && p[i + 2] != ']' {
                if p[i] <= c && c <= p[i + 2] {
                    matched = true;
                }
                i += 3;
            } else {
                if p[i] == c {
                    matched = true;
                }
                i += 1;
            }
        }
        None
    }
    fn go(p: &[char], n: &[char]) -> bool {
        match p.first() {
            None => n.is_empty(),
            Some('*') => (0..=n.len()).any(|k| go(&p[1..], &n[k..])),
            Some('?') => !n.is_empty() && go(&p[1..], &n[1..]),
            Some('[') => match (n.first(), class(&p[1..], *n.first().unwrap_or(&'\0'))) {
                (Some(_), Some((true, len))) => go(&p[1 + len..], &n[1..]),
                (Some(_), Some((false, _))) => false,
                (_, None) => n.first() == Some(&'[') && go(&p[1..], &n[1..]),
                (None, _) => false,
            },
            Some(c) => n.first() == Some(c) && go(&p[1..], &n[1..]),
        }
    }
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    go(&p, &n)
}

/// Daytona's `VolumeMount.mount_path` rules: absolute, not `/`, no `.`/`..` components, not
/// under a system directory.
pub fn check_mount_path(path: &str) -> Result<(), DaytonaError> {
    let bad = |why: &str| {
        Err(DaytonaError::validation(format!(
            "invalid mount path {path:?}: {why}"
        )))
    };
    if !path.starts_with('/') {
        return bad("must be absolute");
    }
    if path.trim_end_matches('/').is_empty() {
        return bad("cannot be /");
    }
    if path.split('/').any(|c| c == "." || c == "..") {
        return bad("cannot contain . or .. components");
    }
    for sys in [
        "/proc", "/sys", "/dev", "/boot", "/etc", "/bin", "/sbin", "/lib", "/lib64",
    ] {
        if path == sys || path.starts_with(&format!("{sys}/")) {
            return bad("cannot be under a system directory");
        }
    }
    Ok(())
}

/// What the host's base system is, as images are compared with it: the local engine runs
/// the host's `/usr` (read-only), so the only image it can truly provide is the host's own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostBase {
    /// Debian's `VERSION_ID` (`12`), from the host's `/etc/os-release`.
    pub debian_version: String,
    /// Debian's `VERSION_CODENAME` (`bookworm`).
    pub codename: String,
    /// The `python3` of the host as `major.minor` (`3.11`), if it has one.
    pub python: Option<String>,
    /// Cores this process may use.
    pub cpus: u64,
    /// The host's memory in GiB (rounded up).
    pub memory_gib: u64,
}

impl HostBase {
    /// `"Debian 12 (bookworm) with python 3.11"`.
    pub fn describe(&self) -> String {
        match &self.python {
            Some(py) => format!(
                "Debian {} ({}) with python {py}",
                self.debian_version, self.codename
            ),
            None => format!("Debian {} ({})", self.debian_version, self.codename),
        }
    }

    /// Image references that name exactly this base, for messages.
    pub fn examples(&self) -> String {
        let mut out = vec![
            format!("debian:{}-slim", self.codename),
            format!("debian:{}", self.debian_version),
        ];
        if let Some(py) = &self.python {
            out.push(format!("python:{py}-slim-{}", self.codename));
        }
        out.join(", ")
    }
}

/// Whether image reference `image` names the host's own base, so a sandbox of the host base
/// *is* that image: `debian:{12|bookworm}[-slim]`, or `python:{major.minor}[-slim]-{codename}`
/// with the host's python (the codename must be in the tag: a bare `python:3.11` follows
/// Docker's current Debian release, not the host's). A registry prefix other than Docker
/// Hub's library, a digest, or a patch version are never the host base.
pub fn denotes_host_base(image: &str, host: &HostBase) -> bool {
    let image = image.trim();
    let image = image
        .strip_prefix("docker.io/library/")
        .or_else(|| image.strip_prefix("library/"))
        .unwrap_or(image);
    if image.contains('@') || image.contains('/') {
        return false;
    }
    let Some((name, tag)) = image.split_once(':') else {
        return false;
    };
    match name {
        "debian" => {
            let tag = tag.strip_suffix("-slim").unwrap_or(tag);
            tag == host.debian_version || tag == host.codename
        }
        "python" => {
            let Some(py) = &host.python else {
                return false;
            };
            let Some(rest) = tag
                .strip_prefix(py.as_str())
                .and_then(|r| r.strip_prefix('-'))
            else {
                return false;
            };
            let rest = rest.strip_prefix("slim-").unwrap_or(rest);
            rest == host.codename
        }
        _ => false,
    }
}

/// The image a Dockerfile is, when it is nothing but one `FROM <image>` line (what the SDKs
/// send for an image given by name); `None` for anything that builds.
pub fn dockerfile_image(dockerfile: &str) -> Option<&str> {
    let mut lines = dockerfile
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'));
    let first = lines.next()?;
    if lines.next().is_some() {
        return None;
    }
    let (keyword, rest) = first.split_once(char::is_whitespace)?;
    if !keyword.eq_ignore_ascii_case("FROM") {
        return None;
    }
    let mut words = rest.split_whitespace();
    let image = words.next()?;
    // `FROM image AS stage` is still that image; other words are not.
    match (words.next(), words.next(), words.next()) {
        (None, _, _) => Some(image),
        (Some(as_), Some(_), None) if as_.eq_ignore_ascii_case("as") => Some(image),
        _ => None,
    }
}

/// Check requested resources (`cpu` cores, `memory` and `disk` GiB, `gpu` count) against what
/// the host has: above it is Daytona's 400 naming the limit; below it is accepted (whether it is
/// enforced is the runtime's, see `MAPPING.md`).
pub fn check_resources(
    cpu: Option<i64>,
    memory: Option<i64>,
    disk: Option<i64>,
    gpu: Option<i64>,
    host: &HostBase,
) -> Result<(), DaytonaError> {
    // The disk is a tmpfs: it lives in the host's memory.
    for (what, value, max, unit) in [
        ("CPU", cpu, host.cpus, " cores"),
        ("Memory", memory, host.memory_gib, "GB"),
        ("Disk", disk, host.memory_gib, "GB"),
        ("GPU", gpu, 0, ""),
    ] {
        let Some(value) = value else { continue };
        if value < 0 || (value == 0 && what != "GPU") {
            return Err(DaytonaError::validation(format!(
                "{what} must be a positive integer, not {value}"
            )));
        }
        if value as u64 > max {
            return Err(DaytonaError::BadRequest(crate::errors::ErrorDetails::new(
                format!(
                    "{what} request {value}{unit} exceeds maximum allowed per sandbox \
                     ({max}{unit}): this host has {max}{unit}"
                ),
                Some(400),
                Some("RESOURCE_LIMIT_EXCEEDED"),
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_resolve_against_the_work_dir() {
        for (path, want) in [
            ("/etc/hosts", "/etc/hosts"),
            ("a.txt", "/home/daytona/a.txt"),
            ("./a/b", "/home/daytona/a/b"),
            (".", "/home/daytona"),
            ("", "/home/daytona"),
            ("workspace/src", "/home/daytona/workspace/src"),
            ("~/x", "/home/daytona/~/x"),
        ] {
            assert_eq!(resolve_path(DAYTONA_HOME, path), want, "{path}");
        }
        assert_eq!(resolve_path("/", "x"), "/x");
    }

    #[test]
    fn env_names_follow_daytona_rules() {
        for ok in ["A", "_x", "CUSTOM_SECRET", "a1"] {
            assert!(check_env_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "1A", "A-B", "A B", "é"] {
            let e = check_env_name(bad).unwrap_err();
            assert!(e.is_validation());
            assert!(e.to_string().contains("invalid environment variable name"));
        }
    }

    #[test]
    fn code_run_builds_the_daemon_command() {
        let cmd = code_run_command("python", "print(1)", &["a".into(), "b c".into()]);
        assert_eq!(
            cmd,
            "printf '%s' 'cHJpbnQoMSk=' | base64 -d | python3 -u - a b c"
        );
        assert!(code_run_command("javascript", "x", &[]).ends_with("node -"));
        assert!(code_run_command("typescript", "x", &[]).contains("ts-node"));
        assert!(check_language("python").is_ok());
        assert!(check_language("ruby").unwrap_err().is_validation());
    }

    #[test]
    fn modes_and_times_render_like_the_daemon() {
        assert_eq!(parse_mode("755").unwrap(), 0o755);
        assert_eq!(parse_mode("0644").unwrap(), 0o644);
        for bad in ["", "9", "rwx", "77777"] {
            assert!(parse_mode(bad).is_err(), "{bad}");
        }
        assert_eq!(
            go_mode_string(sandcove::FileKind::File, 0o644),
            "-rw-r--r--"
        );
        assert_eq!(go_mode_string(sandcove::FileKind::Dir, 0o755), "drwxr-xr-x");
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(1_709_251_200_123), "2024-03-01T00:00:00.123Z");
        assert_eq!(
            go_time_string(951_782_400_000),
            "2000-02-29 00:00:00.000 +0000 UTC"
        );
    }

    #[test]
    fn globs_match_base_names() {
        for (p, n, want) in [
            ("*.json", "config.json", true),
            ("*.json", "config.jsonx", false),
            ("?.txt", "a.txt", true),
            ("?.txt", "ab.txt", false),
            ("[ab]*", "beta", true),
            ("[!ab]*", "beta", false),
            ("[a-c]x", "bx", true),
            ("*", "", true),
            ("exact", "exact", true),
        ] {
            assert_eq!(glob_match(p, n), want, "{p} {n}");
        }
    }

    #[test]
    fn leases_and_mount_paths() {
        assert_eq!(lease_for_auto_stop(15), Duration::from_secs(900));
        assert_eq!(lease_for_auto_stop(0), NEVER_STOP_LEASE);
        assert!(check_mount_path("/home/daytona/volume").is_ok());
        for bad in ["rel", "/", "/etc/x", "/a/../b", "/proc"] {
            assert!(check_mount_path(bad).is_err(), "{bad}");
        }
    }

    fn host() -> HostBase {
        HostBase {
            debian_version: "12".into(),
            codename: "bookworm".into(),
            python: Some("3.11".into()),
            cpus: 4,
            memory_gib: 8,
        }
    }

    #[test]
    fn only_images_naming_the_host_base_denote_it() {
        let h = host();
        for yes in [
            "debian:12",
            "debian:12-slim",
            "debian:bookworm-slim",
            "docker.io/library/debian:bookworm",
            "python:3.11-slim-bookworm",
            "python:3.11-bookworm",
        ] {
            assert!(denotes_host_base(yes, &h), "{yes}");
        }
        for no in [
            "debian:13",
            "debian:trixie-slim",
            "debian",
            "debian:latest",
            "python:3.11",
            "python:3.11-slim",
            "python:3.12-slim-bookworm",
            "python:3.11.9-slim-bookworm",
            "ubuntu:22.04",
            "ghcr.io/x/debian:12",
            "debian@sha256:abc",
            "node:20-bookworm",
        ] {
            assert!(!denotes_host_base(no, &h), "{no}");
        }
    }

    #[test]
    fn a_dockerfile_is_an_image_only_when_it_builds_nothing() {
        assert_eq!(dockerfile_image("FROM debian:12\n"), Some("debian:12"));
        assert_eq!(
            dockerfile_image("\n  from debian:12 AS base\n"),
            Some("debian:12")
        );
        assert_eq!(dockerfile_image("FROM debian:12\nRUN true\n"), None);
        assert_eq!(dockerfile_image("RUN true"), None);
        assert_eq!(dockerfile_image(""), None);
        assert_eq!(dockerfile_image("FROM --platform=x debian:12 y"), None);
    }

    #[test]
    fn resources_above_the_host_are_refused() {
        let h = host();
        assert!(check_resources(Some(4), Some(8), Some(8), Some(0), &h).is_ok());
        assert!(check_resources(None, None, None, None, &h).is_ok());
        for (cpu, mem, disk, gpu) in [
            (Some(5), None, None, None),
            (None, Some(9), None, None),
            (None, None, Some(9), None),
            (None, None, None, Some(1)),
            (Some(0), None, None, None),
            (None, Some(-1), None, None),
        ] {
            let err = check_resources(cpu, mem, disk, gpu, &h).unwrap_err();
            assert!(matches!(err, DaytonaError::BadRequest(_)), "{err:?}");
        }
    }
}
