//! What every human command shares: the runtime and client, one-line errors with a remedy,
//! tables, JSON, durations and times.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use sandcove::client::{API_KEY_ENV, URL_ENV};
use sandcove::{Client, Error, UnixMillis};

/// Exit status of a command that failed (the runtime refused, or was unreachable).
pub const FAILED: u8 = 1;
/// Exit status of a command whose arguments are wrong (as clap uses).
pub const USAGE: u8 = 2;

/// A command's failure: the message (one line, with its remedy) and the exit status.
#[derive(Debug)]
pub struct Failure {
    /// What went wrong and what to do.
    pub message: String,
    /// The exit status.
    pub status: u8,
}

impl Failure {
    /// Wrong arguments (exit 2).
    pub fn usage(message: impl Into<String>) -> Self {
        Failure {
            message: message.into(),
            status: USAGE,
        }
    }

    /// Anything else (exit 1).
    pub fn failed(message: impl Into<String>) -> Self {
        Failure {
            message: message.into(),
            status: FAILED,
        }
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure::failed(describe(&e))
    }
}

/// A command's result: `Ok(status)` is the exit status to end with.
pub type Outcome = Result<u8, Failure>;

/// Print a failure as one line on stderr, prefixed with the command, and give its status.
pub fn finish(command: &str, outcome: Outcome) -> ExitCode {
    match outcome {
        Ok(status) => ExitCode::from(status),
        Err(Failure { message, status }) => {
            // One line, whatever the error text holds (it may quote sandbox-made names).
            let line = terminal_text(&message.replace('\n', " "));
            eprintln!("sandcove {command}: {line}");
            ExitCode::from(status)
        }
    }
}

/// An error as one line with what to do about it. The core's errors name a remedy where
/// they have one (unavailable, not supported); the common others get one here.
pub fn describe(e: &Error) -> String {
    let remote = std::env::var(URL_ENV).ok().filter(|u| !u.is_empty());
    match e {
        Error::NotFound { .. } => format!("{e} (list what exists with `sandcove ls`)"),
        Error::Unauthenticated { .. } => {
            format!("{e} (set {API_KEY_ENV} to the key `sandcove serve` was started with)")
        }
        Error::Backend { .. } | Error::Timeout { .. } if remote.is_some() => format!(
            "{e} (is `sandcove serve` running at {}? check {URL_ENV})",
            remote.unwrap_or_default()
        ),
        _ => e.to_string(),
    }
}

/// A single-threaded async runtime for one command.
pub fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::failed(format!("cannot start the async runtime: {e}")))
}

/// The client the environment selects: the embedded engine, or the server `SANDCOVE_URL`
/// names.
pub fn client() -> Result<Client, Failure> {
    Ok(Client::from_env()?)
}

/// Print `value` as pretty JSON on stdout.
pub fn print_json<T: serde::Serialize + ?Sized>(value: &T) -> Result<(), Failure> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| Failure::failed(format!("cannot encode JSON: {e}")))?;
    println!("{text}");
    Ok(())
}

/// Print a listing: `list` as JSON with `--json`, else one table row per item (`row` gets
/// the item and the current time, for ages and leases left).
pub fn print_listing<T: serde::Serialize>(
    json: bool,
    list: &[T],
    header: &[&str],
    row: impl Fn(&T, UnixMillis) -> Vec<String>,
) -> Result<(), Failure> {
    if json {
        return print_json(list);
    }
    let now = sandcove::now_millis();
    let rows: Vec<Vec<String>> = list.iter().map(|item| row(item, now)).collect();
    print_table(header, &rows);
    Ok(())
}

/// Report what a removing command removed: `{"removed": [...]}` with `--json`, else one name
/// per line.
pub fn print_removed(json: bool, removed: &[String]) -> Result<(), Failure> {
    if json {
        print_json(&serde_json::json!({ "removed": removed }))
    } else {
        removed
            .iter()
            .for_each(|name| println!("{}", terminal_text(name)));
        Ok(())
    }
}

/// Text made safe to print on a terminal: control characters (C0, DEL, C1: escape
/// sequences, carriage returns, bells) and bidirectional overrides are shown as `\u{..}`
/// escapes instead of acting on the terminal. Names, labels, commands and error texts may
/// come from sandboxed code or another client; JSON output stays exact.
pub fn terminal_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        let bidi = matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
        if c.is_control() || bidi {
            out.push_str(&c.escape_unicode().to_string());
        } else {
            out.push(c);
        }
    }
    out
}

/// Print rows under a header, columns padded to their widest cell (the last is not padded).
/// Cells are shown through [`terminal_text`].
pub fn print_table(header: &[&str], rows: &[Vec<String>]) {
    print!("{}", render_table(header, rows));
}

/// The text [`print_table`] prints.
pub fn render_table(header: &[&str], rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|row| row.iter().map(|cell| terminal_text(cell)).collect())
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let last = cells.len().saturating_sub(1);
        let mut text = String::new();
        for (i, cell) in cells.into_iter().enumerate() {
            text.push_str(cell);
            if i < last {
                let pad = widths[i] + 2 - cell.chars().count();
                text.extend(std::iter::repeat_n(' ', pad));
            }
        }
        text.trim_end().to_string()
    };
    let mut out = String::new();
    out.push_str(&line(header.to_vec()));
    out.push('\n');
    for row in &rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
        out.push('\n');
    }
    out
}

/// Parse a duration: `90` (seconds), `30s`, `10m`, `2h`, `1d`, or combinations (`1h30m`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("bad duration {text:?}: use e.g. 90, 30s, 10m, 1h30m");
    let text = text.trim();
    if text.is_empty() {
        return Err(bad());
    }
    if let Ok(secs) = text.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    let mut total: u64 = 0;
    let mut number = String::new();
    for c in text.chars() {
        if c.is_ascii_digit() {
            number.push(c);
            continue;
        }
        let unit = match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86_400,
            _ => return Err(bad()),
        };
        let n: u64 = number.parse().map_err(|_| bad())?;
        number.clear();
        total = n
            .checked_mul(unit)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(bad)?;
    }
    if !number.is_empty() {
        return Err(bad());
    }
    Ok(Duration::from_secs(total))
}

/// A span of milliseconds for humans: `45s`, `12m`, `3h5m`, `2d4h`.
pub fn human_span(millis: u64) -> String {
    let secs = millis / 1000;
    match secs {
        0..60 => format!("{secs}s"),
        60..3600 => format!("{}m", secs / 60),
        3600..86_400 => match (secs % 3600) / 60 {
            0 => format!("{}h", secs / 3600),
            m => format!("{}h{m}m", secs / 3600),
        },
        _ => match (secs % 86_400) / 3600 {
            0 => format!("{}d", secs / 86_400),
            h => format!("{}d{h}h", secs / 86_400),
        },
    }
}

/// Parse `k=v` pairs (labels, environment variables) into a map.
pub fn parse_pairs(what: &str, pairs: &[String]) -> Result<BTreeMap<String, String>, Failure> {
    let mut map = BTreeMap::new();
    for pair in pairs {
        match pair.split_once('=') {
            Some((k, v)) if !k.is_empty() => {
                map.insert(k.to_string(), v.to_string());
            }
            _ => {
                return Err(Failure::usage(format!(
                    "bad {what} {pair:?}: write it as KEY=VALUE"
                )))
            }
        }
    }
    Ok(map)
}

/// Labels as `k=v,k=v`.
pub fn labels_text(labels: &BTreeMap<String, String>) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Whether standard input is a terminal.
pub fn stdin_is_tty() -> bool {
    std::io::IsTerminal::is_terminal(&std::io::stdin())
}

/// Whether standard error is a terminal.
pub fn stderr_is_tty() -> bool {
    std::io::IsTerminal::is_terminal(&std::io::stderr())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names, labels and commands made by sandboxed code or another client cannot drive the
    /// terminal a table is printed on: every control character and bidi override is shown
    /// escaped, plain text (any script) as it is.
    #[test]
    fn tables_print_control_characters_inert() {
        let hostile = "a\u{1b}]0;owned\u{7}\u{1b}[2J\rb\u{9b}31m\u{202e}cba\u{7f}\tx\ny";
        let text = render_table(
            &["NAME", "LABELS"],
            &[vec![hostile.to_string(), "k=Grüße 名前".to_string()]],
        );
        for c in text.chars() {
            assert!(
                c == '\n' || !(c.is_control() || ('\u{202a}'..='\u{2069}').contains(&c)),
                "{c:?} reaches the terminal in {text:?}"
            );
        }
        assert_eq!(text.lines().count(), 2, "{text:?}");
        assert!(text.contains("a\\u{1b}]0;owned\\u{7}"), "{text:?}");
        assert!(text.contains("k=Grüße 名前"), "{text:?}");
        assert_eq!(terminal_text("plain-name_1.txt"), "plain-name_1.txt");
    }

    #[test]
    fn durations_parse_as_written() {
        for (text, secs) in [
            ("90", 90),
            ("30s", 30),
            ("10m", 600),
            ("2h", 7200),
            ("1h30m", 5400),
            ("1d", 86_400),
        ] {
            assert_eq!(
                parse_duration(text),
                Ok(Duration::from_secs(secs)),
                "{text}"
            );
        }
        for bad in ["", "m", "10x", "5m3", "-1", "1.5h"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn spans_read_naturally() {
        assert_eq!(human_span(45_000), "45s");
        assert_eq!(human_span(12 * 60_000), "12m");
        assert_eq!(human_span(3 * 3_600_000 + 5 * 60_000), "3h5m");
        assert_eq!(human_span(2 * 86_400_000), "2d");
    }

    #[test]
    fn pairs_need_a_key_and_an_equals_sign() {
        let map = parse_pairs("label", &["a=1".into(), "b=x=y".into()]).unwrap();
        assert_eq!(map["a"], "1");
        assert_eq!(map["b"], "x=y");
        assert_eq!(
            parse_pairs("label", &["novalue".into()])
                .unwrap_err()
                .status,
            USAGE
        );
        assert!(parse_pairs("label", &["=v".into()]).is_err());
    }
}
