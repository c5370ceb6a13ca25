//! `multipart/form-data` (RFC 7578) as the wire listeners need it (E2B's envd uploads,
//! Daytona's toolbox uploads and downloads): parsing an upload held in memory (bounded by the
//! caller, which reads at most its listener's limit), and framing a download answer.

/// One part of a multipart body.
#[derive(Debug, PartialEq, Eq)]
pub struct Part<'a> {
    /// The `name` of its `Content-Disposition`.
    pub name: String,
    /// The `filename`, when it is a file.
    pub filename: Option<String>,
    /// The content.
    pub data: &'a [u8],
}

/// Longest boundary accepted: RFC 2046 allows 70 characters; some clients send longer ones,
/// and the bound only has to keep the delimiter search small.
pub const MAX_BOUNDARY_LEN: usize = 200;

/// The boundary of a `multipart/form-data` content type (1 to [`MAX_BOUNDARY_LEN`]
/// characters), or `None` for any other content type.
pub fn boundary(content_type: &str) -> Option<String> {
    let (kind, params) = content_type.split_once(';')?;
    if !kind.trim().eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    params.split(';').find_map(|p| {
        let (k, v) = p.trim().split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case("boundary")
            .then(|| v.trim().trim_matches('"').to_string())
            .filter(|b| !b.is_empty() && b.len() <= MAX_BOUNDARY_LEN)
    })
}

/// Where `needle` first occurs in `haystack`, in time linear in both (a window-by-window
/// compare costs the needle's length at every byte: close to a second on the event loop for
/// a 64 MiB body and a long boundary).
fn position(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    memchr::memmem::find(haystack, needle)
}

/// A `Content-Disposition` parameter value (a bare token, or a quoted string), by
/// case-insensitive name. Parameters are split at the `;` outside quotes, so
/// `filename="a;b"` is `a;b`. In a quoted string `\"` and `\\` stand for `"` and `\` (RFC 2183,
/// as httpx writes them); any other backslash is kept, as HTML5's encoding (fetch's
/// `FormData`) never escapes one.
fn param(header: &str, key: &str) -> Option<String> {
    let mut chars = header.chars().peekable();
    // The disposition type (`form-data`) is a token: it ends at the first `;`.
    chars.by_ref().find(|c| *c == ';')?;
    loop {
        while chars.next_if(|c| c.is_whitespace() || *c == ';').is_some() {}
        chars.peek()?;
        let mut name = String::new();
        while let Some(c) = chars.next_if(|c| *c != '=' && *c != ';') {
            name.push(c);
        }
        let mut value = String::new();
        if chars.next_if_eq(&'=').is_some() {
            while chars.next_if(|c| *c == ' ' || *c == '\t').is_some() {}
            if chars.next_if_eq(&'"').is_some() {
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => value.push(chars.next_if(|c| matches!(c, '"' | '\\')).unwrap_or(c)),
                        c => value.push(c),
                    }
                }
                // Anything after the closing quote, up to the next parameter, is not the value.
                while chars.next_if(|c| *c != ';').is_some() {}
            } else {
                while let Some(c) = chars.next_if(|c| *c != ';') {
                    value.push(c);
                }
                value.truncate(value.trim_end().len());
            }
        }
        if name.trim().eq_ignore_ascii_case(key) {
            return Some(value);
        }
    }
}

/// Most parts accepted in one body: each part becomes a file write, so a body of many tiny
/// parts (a compressed upload expands to the listener's whole limit) would otherwise turn
/// one request into a million writes.
pub const MAX_PARTS: usize = 10_000;

/// Every part of `body`, strictly: a body that does not follow the format (no closing
/// delimiter, a part without headers or without a name) or holds more than [`MAX_PARTS`]
/// parts is an error, never a partial upload. The parts borrow from `body`: nothing is copied.
pub fn parse<'a>(body: &'a [u8], boundary: &str) -> Result<Vec<Part<'a>>, String> {
    let delimiter = format!("--{boundary}");
    let start = position(body, delimiter.as_bytes()).ok_or("no boundary in the body")?;
    let mut rest = &body[start + delimiter.len()..];
    let separator = format!("\r\n--{boundary}");
    let mut parts = Vec::new();
    loop {
        if rest.starts_with(b"--") {
            return Ok(parts);
        }
        if parts.len() == MAX_PARTS {
            return Err(format!("more than {MAX_PARTS} parts"));
        }
        rest = rest
            .strip_prefix(b"\r\n")
            .ok_or("a delimiter line does not end in CRLF")?;
        let head_end = position(rest, b"\r\n\r\n").ok_or("unterminated part headers")?;
        let head = std::str::from_utf8(&rest[..head_end]).map_err(|_| "non-UTF-8 headers")?;
        let content = &rest[head_end + 4..];
        let end = position(content, separator.as_bytes()).ok_or("unterminated part")?;
        let mut name = None;
        let mut filename = None;
        for line in head.split("\r\n") {
            let (k, v) = line.split_once(':').ok_or("a part header without ':'")?;
            if k.trim().eq_ignore_ascii_case("content-disposition") {
                name = param(v, "name");
                filename = param(v, "filename");
            }
        }
        parts.push(Part {
            name: name.ok_or("a part without a name")?,
            filename,
            data: &content[..end],
        });
        rest = &content[end + separator.len()..];
    }
}

/// A `filename` parameter value that cannot end the quoted string or the header line.
fn quoted(value: &str) -> String {
    value
        .replace('%', "%25")
        .replace('"', "%22")
        .replace('\r', "%0D")
        .replace('\n', "%0A")
}

/// Append one part to a multipart answer being built.
pub fn push_part(
    out: &mut Vec<u8>,
    boundary: &str,
    name: &str,
    filename: &str,
    content_type: &str,
    data: &[u8],
) {
    out.extend_from_slice(
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{}\"\r\n\
             Content-Type: {content_type}\r\nContent-Length: {}\r\n\r\n",
            quoted(filename),
            data.len()
        )
        .as_bytes(),
    );
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// Close a multipart answer.
pub fn finish(out: &mut Vec<u8>, boundary: &str) {
    out.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uploads_parse_strictly_and_answers_parse_back() {
        let body = b"--XyZ\r\nContent-Disposition: form-data; name=\"files[0].path\"\r\n\r\n/a/b.txt\r\n--XyZ\r\nContent-Disposition: form-data; name=\"files[0].file\"; filename=\"b.txt\"\r\nContent-Type: application/octet-stream\r\n\r\nhi\r\nthere\r\n--XyZ--\r\n";
        let parts = parse(body, "XyZ").unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].name, "files[0].path");
        assert_eq!(parts[0].data, b"/a/b.txt");
        assert_eq!(parts[1].filename.as_deref(), Some("b.txt"));
        assert_eq!(parts[1].data, b"hi\r\nthere");
        assert!(parse(&body[..body.len() - 12], "XyZ").is_err(), "truncated");
        assert!(parse(body, "other").is_err());
        assert_eq!(
            boundary("multipart/form-data; boundary=\"abc\"").as_deref(),
            Some("abc")
        );
        assert_eq!(boundary("application/json"), None);
        assert_eq!(
            boundary("multipart/form-data; boundary=abc").as_deref(),
            Some("abc")
        );
        let long = "b".repeat(MAX_BOUNDARY_LEN + 1);
        assert_eq!(
            boundary(&format!("multipart/form-data; boundary={long}")),
            None
        );
        let nameless = b"--B\r\nContent-Disposition: form-data\r\n\r\nx\r\n--B--\r\n";
        assert!(parse(nameless, "B").is_err(), "a part without a name");

        let mut out = Vec::new();
        push_part(
            &mut out,
            "B",
            "file",
            "/x/\"q\".txt",
            "application/octet-stream",
            b"data",
        );
        finish(&mut out, "B");
        let parts = parse(&out, "B").unwrap();
        assert_eq!(parts.len(), 1);
        assert_eq!(parts[0].filename.as_deref(), Some("/x/%22q%22.txt"));
        assert_eq!(parts[0].data, b"data");
    }

    #[test]
    fn disposition_parameters_split_outside_quotes() {
        let header = " form-data; name=\"files\"; filename=\"a;b name=c.txt\" ; x=1";
        assert_eq!(param(header, "name").as_deref(), Some("files"));
        assert_eq!(param(header, "filename").as_deref(), Some("a;b name=c.txt"));
        assert_eq!(param(header, "x").as_deref(), Some("1"));
        assert_eq!(param(header, "missing"), None);
        // httpx escapes `"` and `\`; fetch's FormData writes `"` as %22 and leaves `\` alone.
        let escaped = r#"form-data; NAME="f"; filename="q\"x\\y\z.txt""#;
        assert_eq!(param(escaped, "name").as_deref(), Some("f"));
        assert_eq!(
            param(escaped, "filename").as_deref(),
            Some(r#"q"x\y\z.txt"#)
        );
        assert_eq!(
            param("form-data; name=bare ;", "name").as_deref(),
            Some("bare")
        );
        assert_eq!(param("form-data", "name"), None);
        assert_eq!(
            param("form-data; name=\"unterminated", "name").as_deref(),
            Some("unterminated")
        );
    }

    #[test]
    fn parts_are_bounded_in_number() {
        let body = |n: usize| {
            let mut out = Vec::new();
            for i in 0..n {
                push_part(&mut out, "B", "file", &format!("/f{i}"), "text/plain", b"x");
            }
            finish(&mut out, "B");
            out
        };
        assert_eq!(parse(&body(MAX_PARTS), "B").unwrap().len(), MAX_PARTS);
        // Tiny parts by the hundred thousand (a few MiB, a few KiB gzipped): refused whole.
        let err = parse(&body(100_000), "B").unwrap_err();
        assert!(err.contains("parts"), "{err}");
        assert!(parse(&body(MAX_PARTS + 1), "B").is_err());
    }
}
