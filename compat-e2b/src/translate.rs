//! Pure translation between E2B's conventions and the core's: paths, envs, exit statuses,
//! permission strings, text decoding and Python-style printing. No I/O here.

use std::collections::BTreeMap;
use std::fmt;

use sandcove::{ExitStatus, FileKind};

/// E2B's default user.
pub const E2B_USER: &str = "user";
/// E2B's home directory and default working directory.
pub const E2B_HOME: &str = "/home/user";
/// E2B's default template.
pub const DEFAULT_TEMPLATE: &str = "base";
/// E2B's default sandbox lifetime, seconds.
pub const DEFAULT_SANDBOX_TIMEOUT: u64 = 300;
/// E2B's default command timeout, seconds.
pub const DEFAULT_COMMAND_TIMEOUT: f64 = 60.0;
/// The envd version Sandcove reports, high enough that no feature gate trips.
pub const ENVD_VERSION: &str = "99.99.99";
/// The team id reported in `E2B_TEAM_ID`: there are no teams here.
pub const TEAM_ID: &str = "local";

/// A point in time, UTC, printed the way Python prints a tz-aware `datetime`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DateTime {
    /// Milliseconds since the Unix epoch.
    pub unix_millis: u64,
}

impl DateTime {
    /// From milliseconds since the epoch.
    pub fn from_unix_millis(unix_millis: u64) -> Self {
        DateTime { unix_millis }
    }

    /// The current time.
    pub fn now() -> Self {
        DateTime::from_unix_millis(sandcove::now_millis())
    }

    /// Seconds since the epoch (Python's `timestamp()`).
    pub fn timestamp(&self) -> f64 {
        self.unix_millis as f64 / 1000.0
    }

    /// `(year, month, day, hour, minute, second, microsecond)`.
    pub fn parts(&self) -> (i64, u32, u32, u32, u32, u32, u32) {
        let t = sandcove_compat_support::dates::utc(self.unix_millis);
        (
            i64::from(t.year()),
            u32::from(u8::from(t.month())),
            u32::from(t.day()),
            u32::from(t.hour()),
            u32::from(t.minute()),
            u32::from(t.second()),
            t.microsecond(),
        )
    }
}

impl fmt::Display for DateTime {
    /// Python's `str(datetime)`: `2024-10-15 21:13:07.311000+00:00`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (y, mo, d, h, mi, s, us) = self.parts();
        write!(f, "{y:04}-{mo:02}-{d:02} {h:02}:{mi:02}:{s:02}")?;
        if us != 0 {
            write!(f, ".{us:06}")?;
        }
        f.write_str("+00:00")
    }
}

impl fmt::Debug for DateTime {
    /// Python's `repr(datetime)`: `datetime.datetime(2024, 10, 15, 21, 13, 7, 311000, tzinfo=tzutc())`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (y, mo, d, h, mi, s, us) = self.parts();
        write!(f, "datetime.datetime({y}, {mo}, {d}, {h}, {mi}, {s}")?;
        if us != 0 {
            write!(f, ", {us}")?;
        }
        f.write_str(", tzinfo=tzutc())")
    }
}

/// Python's `repr(str)`: single quotes unless the text contains one and no double quote.
pub fn py_str(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// `repr` of an optional string: the string's repr or `None`.
pub fn py_opt_str(s: Option<&str>) -> String {
    s.map(py_str).unwrap_or_else(|| "None".into())
}

/// `repr` of a list of strings: `['a', 'b']`.
pub fn py_list(items: &[String]) -> String {
    let inner: Vec<String> = items.iter().map(|s| py_str(s)).collect();
    format!("[{}]", inner.join(", "))
}

/// `repr` of a str→str dict: `{'k': 'v'}`.
pub fn py_dict(map: &BTreeMap<String, String>) -> String {
    let inner: Vec<String> = map
        .iter()
        .map(|(k, v)| format!("{}: {}", py_str(k), py_str(v)))
        .collect();
    format!("{{{}}}", inner.join(", "))
}

/// The permission string E2B's daemon reports: Go's `FileMode.String()`, e.g.
/// `-rw-r--r--`, `drwxr-xr-x`, `Lrwxrwxrwx` for a link, and set-user-ID, set-group-ID and
/// sticky as leading letters (`urwxr-xr-x`, `dtrwxrwxrwx`), not `ls`'s `s`/`t`.
pub fn permissions_string(kind: FileKind, mode: u32) -> String {
    let mut s = String::with_capacity(12);
    match kind {
        FileKind::Dir => s.push('d'),
        FileKind::Symlink => s.push('L'),
        FileKind::Other => s.push('?'),
        FileKind::File => {}
    }
    for (bit, c) in [(0o4000, 'u'), (0o2000, 'g'), (0o1000, 't')] {
        if mode & bit != 0 {
            s.push(c);
        }
    }
    if s.is_empty() {
        s.push('-');
    }
    for (i, c) in "rwxrwxrwx".chars().enumerate() {
        s.push(if mode & (0o400 >> i) != 0 { c } else { '-' });
    }
    s
}

/// The name Go (envd) gives a signal in `signal: <name>`.
pub fn signal_name(signal: i32) -> String {
    match signal {
        1 => "hangup".into(),
        2 => "interrupt".into(),
        3 => "quit".into(),
        6 => "aborted".into(),
        9 => "killed".into(),
        10 => "user defined signal 1".into(),
        11 => "segmentation fault".into(),
        12 => "user defined signal 2".into(),
        13 => "broken pipe".into(),
        14 => "alarm clock".into(),
        15 => "terminated".into(),
        n => format!("signal {n}"),
    }
}

/// E2B's `(exit_code, error)` for an exit status: the code and `None` on success; the code
/// and `exit status N` on failure; `-1` and `signal: <name>` when a signal ended it.
pub fn exit_fields(status: &ExitStatus) -> (i64, Option<String>) {
    match (status.code, status.signal) {
        (Some(0), _) => (0, None),
        (Some(code), _) => (i64::from(code), Some(format!("exit status {code}"))),
        (None, Some(sig)) => (-1, Some(format!("signal: {}", signal_name(sig)))),
        (None, None) => (-1, Some("unknown exit status".into())),
    }
}

/// A path as the runtime should see it: `~` and empty paths mean the home, and E2B's
/// `/home/user` is translated onto the sandbox's home when that differs. Relative paths stay
/// relative (the runtime resolves them against the home, as E2B does).
pub fn to_runtime_path(path: &str, home: &str) -> String {
    if path.is_empty() || path == "~" {
        return home.to_string();
    }
    if let Some(rest) = path.strip_prefix("~/") {
        return format!("{}/{rest}", home.trim_end_matches('/'));
    }
    if home != E2B_HOME {
        if path == E2B_HOME {
            return home.to_string();
        }
        if let Some(rest) = path.strip_prefix("/home/user/") {
            return format!("{}/{rest}", home.trim_end_matches('/'));
        }
    }
    path.to_string()
}

/// A path reported by the runtime, as E2B reports it (the inverse of [`to_runtime_path`]).
pub fn to_e2b_path(path: &str, home: &str) -> String {
    if home == E2B_HOME {
        return path.to_string();
    }
    if path == home {
        return E2B_HOME.to_string();
    }
    match path.strip_prefix(home.trim_end_matches('/')) {
        Some(rest) if rest.starts_with('/') => format!("{E2B_HOME}{rest}"),
        _ => path.to_string(),
    }
}

/// E2B's default variables set sandbox-wide at creation (the sandbox id is added per process,
/// see [`process_envs`]).
pub fn default_sandbox_envs(template: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("E2B_SANDBOX".to_string(), "true".to_string()),
        ("E2B_TEAM_ID".to_string(), TEAM_ID.to_string()),
        ("E2B_TEMPLATE_ID".to_string(), template.to_string()),
    ])
}

/// The per-process envs to send: `E2B_SANDBOX_ID` (unless the sandbox's own envs set it),
/// then the command's envs, which win.
pub fn process_envs(
    sandbox_envs: &BTreeMap<String, String>,
    sandbox_id: &str,
    command_envs: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut envs = BTreeMap::new();
    if !sandbox_envs.contains_key("E2B_SANDBOX_ID") {
        envs.insert("E2B_SANDBOX_ID".to_string(), sandbox_id.to_string());
    }
    envs.extend(command_envs.iter().map(|(k, v)| (k.clone(), v.clone())));
    envs
}

/// Sort entries as E2B's daemon lists them: the order of a depth-first walk that reads each
/// directory in byte order of its names (a directory, then what is beneath it, then its next
/// sibling), by comparing paths component by component.
pub fn sort_entries<T>(items: &mut [T], path: impl Fn(&T) -> &str) {
    items.sort_by(|a, b| path(a).split('/').cmp(path(b).split('/')));
}

/// Seconds (Python float) as a timeout: `None` or `0` mean no limit.
pub fn timeout_secs(secs: Option<f64>) -> Option<std::time::Duration> {
    match secs {
        Some(s) if s > 0.0 && s.is_finite() => Some(std::time::Duration::from_secs_f64(s)),
        _ => None,
    }
}

/// Incremental UTF-8 decoding with U+FFFD replacement: a multi-byte character split across
/// chunks is decoded whole.
#[derive(Debug, Default, Clone)]
pub struct Utf8Decoder {
    pending: Vec<u8>,
}

impl Utf8Decoder {
    /// Decode a chunk; an incomplete trailing sequence is kept for the next chunk.
    pub fn decode(&mut self, chunk: &[u8]) -> String {
        self.pending.extend_from_slice(chunk);
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(std::str::from_utf8(&rest[..valid]).unwrap_or_default());
                    match e.error_len() {
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            rest = &rest[valid + bad..];
                        }
                        None => {
                            rest = &rest[valid..];
                            break;
                        }
                    }
                }
            }
        }
        self.pending = rest.to_vec();
        out
    }

    /// Flush: an incomplete sequence left at the end becomes U+FFFD.
    pub fn finish(&mut self) -> String {
        if self.pending.is_empty() {
            String::new()
        } else {
            self.pending.clear();
            "\u{FFFD}".to_string()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datetimes_print_like_python() {
        let t = DateTime::from_unix_millis(1_729_026_787_311);
        assert_eq!(t.to_string(), "2024-10-15 21:13:07.311000+00:00");
        assert_eq!(
            format!("{t:?}"),
            "datetime.datetime(2024, 10, 15, 21, 13, 7, 311000, tzinfo=tzutc())"
        );
        let epoch = DateTime::from_unix_millis(0);
        assert_eq!(epoch.to_string(), "1970-01-01 00:00:00+00:00");
        let leap = DateTime::from_unix_millis(951_782_400_000); // 2000-02-29
        assert_eq!(leap.parts().0..=leap.parts().0, 2000..=2000);
        assert_eq!((leap.parts().1, leap.parts().2), (2, 29));
    }

    #[test]
    fn python_reprs() {
        assert_eq!(py_str("hello world\n"), "'hello world\\n'");
        assert_eq!(py_str("it's"), "\"it's\"");
        assert_eq!(py_str("a'b\""), "'a\\'b\"'");
        assert_eq!(py_list(&["x\n".into(), "y".into()]), "['x\\n', 'y']");
        assert_eq!(py_list(&[]), "[]");
        let m = BTreeMap::from([("userId".to_string(), "123".to_string())]);
        assert_eq!(py_dict(&m), "{'userId': '123'}");
        assert_eq!(py_opt_str(None), "None");
    }

    #[test]
    fn permission_strings() {
        let table = [
            (FileKind::File, 0o644, "-rw-r--r--"),
            (FileKind::Dir, 0o755, "drwxr-xr-x"),
            (FileKind::Symlink, 0o777, "Lrwxrwxrwx"),
            (FileKind::Dir, 0o1777, "dtrwxrwxrwx"),
            (FileKind::File, 0o4755, "urwxr-xr-x"),
            (FileKind::File, 0o2644, "grw-r--r--"),
            (FileKind::File, 0o6000, "ug---------"),
        ];
        for (kind, mode, want) in table {
            assert_eq!(permissions_string(kind, mode), want, "{mode:o}");
        }
    }

    #[test]
    fn exit_statuses_become_e2b_fields() {
        let st = |code, signal| ExitStatus {
            code,
            signal,
            timed_out: false,
        };
        assert_eq!(exit_fields(&st(Some(0), None)), (0, None));
        assert_eq!(
            exit_fields(&st(Some(3), None)),
            (3, Some("exit status 3".into()))
        );
        assert_eq!(
            exit_fields(&st(None, Some(9))),
            (-1, Some("signal: killed".into()))
        );
        assert_eq!(
            exit_fields(&st(None, Some(15))),
            (-1, Some("signal: terminated".into()))
        );
    }

    #[test]
    fn paths_translate_both_ways() {
        let table = [
            ("", "/home/user", "/home/user"),
            ("~", "/home/user", "/home/user"),
            ("~/a/b", "/home/user", "/home/user/a/b"),
            ("rel.txt", "/home/user", "rel.txt"),
            ("/home/user/x", "/home/user", "/home/user/x"),
            ("/home/user/x", "/workspace", "/workspace/x"),
            ("/home/user", "/workspace", "/workspace"),
            ("/home/username", "/workspace", "/home/username"),
            ("/etc/hosts", "/workspace", "/etc/hosts"),
        ];
        for (input, home, want) in table {
            assert_eq!(to_runtime_path(input, home), want, "{input} with {home}");
        }
        assert_eq!(to_e2b_path("/workspace/x", "/workspace"), "/home/user/x");
        assert_eq!(to_e2b_path("/workspace", "/workspace"), "/home/user");
        assert_eq!(to_e2b_path("/workspacex", "/workspace"), "/workspacex");
        assert_eq!(to_e2b_path("/home/user/x", "/home/user"), "/home/user/x");
    }

    #[test]
    fn envs_layer_defaults_sandbox_and_command() {
        let defaults = default_sandbox_envs("base");
        assert_eq!(defaults["E2B_SANDBOX"], "true");
        assert_eq!(defaults["E2B_TEMPLATE_ID"], "base");
        let sandbox = BTreeMap::from([("MY_VAR".to_string(), "my_value".to_string())]);
        let cmd = BTreeMap::from([("MY_VAR".to_string(), "123".to_string())]);
        let envs = process_envs(&sandbox, "sbx1", &cmd);
        assert_eq!(envs["E2B_SANDBOX_ID"], "sbx1");
        assert_eq!(envs["MY_VAR"], "123", "the command's value wins");
        let pinned = BTreeMap::from([("E2B_SANDBOX_ID".to_string(), "mine".to_string())]);
        assert!(!process_envs(&pinned, "sbx1", &BTreeMap::new()).contains_key("E2B_SANDBOX_ID"));
    }

    #[test]
    fn entries_sort_as_a_walk_in_byte_order() {
        let mut items = vec![
            "/d/b.txt", "/d/a-c", "/d/Zed", "/d/a/z", "/d/a", "/d/A.txt", "/d/a/b",
        ];
        sort_entries(&mut items, |p| p);
        assert_eq!(
            items,
            ["/d/A.txt", "/d/Zed", "/d/a", "/d/a/b", "/d/a/z", "/d/a-c", "/d/b.txt"]
        );
    }

    #[test]
    fn timeouts_zero_means_none() {
        assert_eq!(timeout_secs(Some(0.0)), None);
        assert_eq!(timeout_secs(None), None);
        assert_eq!(
            timeout_secs(Some(1.5)),
            Some(std::time::Duration::from_millis(1500))
        );
    }

    #[test]
    fn utf8_decoding_is_incremental_with_replacement() {
        let mut d = Utf8Decoder::default();
        let euro = "€".as_bytes();
        assert_eq!(d.decode(&euro[..1]), "");
        assert_eq!(d.decode(&euro[1..]), "€");
        assert_eq!(d.decode(b"a\xffb"), "a\u{FFFD}b");
        assert_eq!(d.decode(&euro[..2]), "");
        assert_eq!(d.finish(), "\u{FFFD}");
    }
}
