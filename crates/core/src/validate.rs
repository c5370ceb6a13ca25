//! Checks every backend makes the same way, on the types themselves: the embedded engine runs
//! them before any effect, and the HTTP backend before sending anything, so bad input gets the
//! same [`Error::InvalidArgument`](crate::Error) wherever it is refused.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use crate::{
    CreateOptions, Error, FileAttributes, PreviewOptions, ProcessSpec, Result, WriteOptions,
};

/// The longest lease a sandbox can have (`CreateOptions::timeout`, `set_timeout`).
pub const MAX_SANDBOX_TIMEOUT: Duration = Duration::from_secs(365 * 24 * 3600);

/// The longest timeout a process can have (`ProcessSpec::timeout`).
pub const MAX_PROCESS_TIMEOUT: Duration = Duration::from_secs(365 * 24 * 3600);

/// The shortest lifetime a preview token can be given: a second, the shortest any vendor
/// documents (Daytona's signed preview URLs); a vendor facade applies its own tighter bounds.
pub const MIN_PREVIEW_TOKEN_TTL: Duration = Duration::from_secs(1);

/// The longest lifetime a preview token with an expiry can be given: a week. (A token without
/// one lasts as long as its sandbox.)
pub const MAX_PREVIEW_TOKEN_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// The most extended attributes one write sets ([`WriteOptions::attributes`]), and the most
/// one entry reports ([`FileStat::attributes`](crate::FileStat)).
pub const MAX_FILE_ATTRIBUTES: usize = 64;

/// The longest name of an extended attribute, `user.` included, in bytes: the kernel's own
/// bound (`XATTR_NAME_MAX`).
pub const MAX_FILE_ATTRIBUTE_NAME_BYTES: usize = 255;

/// The most bytes of extended attributes (names and values together) one write sets, and one
/// entry reports. Filesystems keep less: ext4 fits all of a file's attributes in one block
/// (usually 4 KiB), and refuses more with an [`Error::Io`] of errno `ENOSPC`.
pub const MAX_FILE_ATTRIBUTE_BYTES: usize = 16 * 1024;

/// The namespace every attribute name the file API sets or reports is in: the one the kernel
/// lets a file's owner (and anyone with write permission on it) set.
pub const USER_ATTRIBUTE_PREFIX: &str = "user.";

/// System directories a sandbox's home may not be, or be under.
const RESERVED_DIRS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/proc",
    "/dev", "/tmp",
];

impl CreateOptions {
    /// Refuse options no backend can honour: bad envs or labels, a malformed name, hostname,
    /// user or home, a lease over [`MAX_SANDBOX_TIMEOUT`], `auto_resume` with a lease that
    /// stops, a zero resource limit.
    /// (Whether a backend supports a template or a resource is its own check.)
    pub fn validate(&self) -> Result<()> {
        validate_envs(&self.envs)?;
        validate_labels(&self.labels)?;
        crate::check_annotations(&self.annotations)?;
        if let Some(name) = &self.name {
            if !crate::valid_sandbox_name(name) {
                return Err(invalid_sandbox_name(name));
            }
        }
        if let Some(t) = self.timeout {
            validate_sandbox_timeout(t)?;
        }
        if self.on_timeout == crate::TimeoutAction::Stop && self.auto_resume {
            return Err(Error::invalid(
                "auto_resume resumes a paused sandbox; one its lease stopped is run again with \
                 start",
            ));
        }
        let r = &self.resources;
        if r.disk_mib == Some(0) || r.max_processes == Some(0) || r.max_open_files == Some(0) {
            return Err(Error::invalid("resource limits must be positive"));
        }
        for (what, value) in [("hostname", &self.hostname), ("user", &self.user)] {
            if let Some(v) = value {
                let ok = !v.is_empty()
                    && v.len() <= 32
                    && v.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
                if !ok {
                    return Err(Error::invalid(format!(
                        "{what} {v:?} must be 1-32 letters, digits, '-', '_' or '.'"
                    )));
                }
            }
        }
        if let Some(home) = &self.home {
            let p = Path::new(home);
            let trimmed = home.trim_end_matches('/');
            if !p.is_absolute()
                || home.contains('\0')
                || home.split('/').any(|c| c == "..")
                || trimmed.is_empty()
                || RESERVED_DIRS.iter().any(|r| p.starts_with(r))
            {
                return Err(Error::invalid(format!(
                    "home {home:?} must be an absolute path outside the system directories"
                )));
            }
        }
        Ok(())
    }
}

/// Most headers a preview sets on requests, and on answers.
pub const MAX_PREVIEW_HEADERS: usize = 32;

/// Longest value of a header a preview sets, in bytes.
pub const MAX_PREVIEW_HEADER_VALUE: usize = 4096;

/// Headers a preview may not set: they frame the connection or the message (hop-by-hop,
/// RFC 9110 §7.6.1; `Host`, `Content-Length`), which the proxy itself decides.
const PREVIEW_RESERVED_HEADERS: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
];

impl PreviewOptions {
    /// Refuse settings no proxy can honour: more than [`MAX_PREVIEW_HEADERS`] request or
    /// answer headers, a header name that is not an HTTP token or is one the proxy decides
    /// (hop-by-hop, `Host`, `Content-Length`, the token header), a value with a control
    /// character or longer than [`MAX_PREVIEW_HEADER_VALUE`].
    pub fn validate(&self) -> Result<()> {
        for (which, headers) in [
            ("request", &self.request_headers),
            ("response", &self.response_headers),
        ] {
            if headers.len() > MAX_PREVIEW_HEADERS {
                return Err(Error::invalid(format!(
                    "a preview sets at most {MAX_PREVIEW_HEADERS} {which} headers"
                )));
            }
            for (name, value) in headers {
                let token = !name.is_empty()
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
                if !token {
                    return Err(Error::invalid(format!(
                        "preview {which} header name {name:?} is not an HTTP token"
                    )));
                }
                let lower = name.to_ascii_lowercase();
                if PREVIEW_RESERVED_HEADERS.contains(&lower.as_str())
                    || lower == self.token_header.to_ascii_lowercase()
                {
                    return Err(Error::invalid(format!(
                        "preview {which} header {name:?} is set by the proxy itself"
                    )));
                }
                if value.len() > MAX_PREVIEW_HEADER_VALUE
                    || value.bytes().any(|b| (b < 0x20 && b != b'\t') || b == 0x7f)
                {
                    return Err(Error::invalid(format!(
                        "preview {which} header {name:?} has a value longer than \
                         {MAX_PREVIEW_HEADER_VALUE} bytes or with a control character"
                    )));
                }
            }
        }
        Ok(())
    }
}

impl ProcessSpec {
    /// Refuse a process no backend can start: an empty program, NUL bytes in argv, envs, cwd,
    /// user or tag, an empty cwd, a timeout over [`MAX_PROCESS_TIMEOUT`], a restart policy
    /// with a pty.
    pub fn validate(&self) -> Result<()> {
        if self.restart.is_some() && self.pty.is_some() {
            return Err(Error::invalid(
                "a restart policy cannot be combined with a pty (a terminal belongs to one \
                 incarnation)",
            ));
        }
        let argv = self.command.to_argv();
        if argv.is_empty() || argv[0].is_empty() {
            return Err(Error::invalid(
                "empty command: argv needs at least a program",
            ));
        }
        if let Some(i) = argv.iter().position(|a| a.contains('\0')) {
            return Err(Error::invalid(format!("argument {i} contains a NUL byte")));
        }
        validate_envs(&self.envs)?;
        for (what, value) in [("cwd", &self.cwd), ("user", &self.user), ("tag", &self.tag)] {
            if value.as_deref().is_some_and(|v| v.contains('\0')) {
                return Err(Error::invalid(format!("{what} contains a NUL byte")));
            }
        }
        if self.cwd.as_deref() == Some("") {
            return Err(Error::invalid("cwd is empty"));
        }
        if let Some(t) = self.timeout {
            if t > MAX_PROCESS_TIMEOUT {
                return Err(Error::invalid(format!(
                    "process timeout of {}s exceeds the maximum of {}s (omit it for no timeout)",
                    t.as_secs(),
                    MAX_PROCESS_TIMEOUT.as_secs()
                )));
            }
        }
        Ok(())
    }
}

impl WriteOptions {
    /// Refuse a write no backend can honour: attributes outside the `user.` namespace, a name
    /// that is empty after `user.`, holds a NUL byte or is longer than
    /// [`MAX_FILE_ATTRIBUTE_NAME_BYTES`], more than [`MAX_FILE_ATTRIBUTES`] of them, or more
    /// than [`MAX_FILE_ATTRIBUTE_BYTES`] of names and values together.
    pub fn validate(&self) -> Result<()> {
        validate_file_attributes(&self.attributes)
    }
}

/// See [`WriteOptions::validate`].
pub fn validate_file_attributes(attributes: &FileAttributes) -> Result<()> {
    if attributes.len() > MAX_FILE_ATTRIBUTES {
        return Err(Error::invalid(format!(
            "{} extended attributes: at most {MAX_FILE_ATTRIBUTES} can be set on a file",
            attributes.len()
        )));
    }
    let mut total = 0usize;
    for (name, value) in attributes {
        let ok = name
            .strip_prefix(USER_ATTRIBUTE_PREFIX)
            .is_some_and(|rest| !rest.is_empty())
            && !name.contains('\0')
            && name.len() <= MAX_FILE_ATTRIBUTE_NAME_BYTES;
        if !ok {
            return Err(Error::invalid(format!(
                "extended attribute name {name:?}: a name is `user.` and then 1 or more \
                 characters, no NUL byte, at most {MAX_FILE_ATTRIBUTE_NAME_BYTES} bytes in all \
                 (the file API sets attributes in the user namespace only)"
            )));
        }
        total += name.len() + value.len();
    }
    if total > MAX_FILE_ATTRIBUTE_BYTES {
        return Err(Error::invalid(format!(
            "{total} bytes of extended attributes (names and values): at most \
             {MAX_FILE_ATTRIBUTE_BYTES} can be set on a file"
        )));
    }
    Ok(())
}

/// Whether `name` is a portable environment variable name (`[A-Za-z_][A-Za-z0-9_]*`).
pub fn is_portable_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Env names must be portable names (a letter or `_`, then letters, digits and `_`): a
/// shell, which every vendor's commands run under, drops any other name from the environment
/// it passes on, so such a variable would silently never arrive. Values without NUL.
pub fn validate_envs(envs: &BTreeMap<String, String>) -> Result<()> {
    for (k, v) in envs {
        if !is_portable_env_name(k) {
            return Err(Error::invalid(format!(
                "invalid environment variable name {k:?}: a name is a letter or '_', then \
                 letters, digits and '_' (no process would receive this one)"
            )));
        }
        if v.contains('\0') {
            return Err(Error::invalid(format!(
                "environment variable {k} has a NUL byte in its value"
            )));
        }
    }
    Ok(())
}

/// Label keys must be non-empty; keys and values without NUL.
pub fn validate_labels(labels: &BTreeMap<String, String>) -> Result<()> {
    if labels
        .iter()
        .any(|(k, v)| k.is_empty() || k.contains('\0') || v.contains('\0'))
    {
        return Err(Error::invalid(
            "label keys must be non-empty, and labels must not contain NUL bytes",
        ));
    }
    Ok(())
}

/// A lease must be within the engine's [`LeaseBounds`](crate::capability::LeaseBounds):
/// at least a second (zero is refused), at most [`MAX_SANDBOX_TIMEOUT`].
pub fn validate_sandbox_timeout(timeout: Duration) -> Result<()> {
    crate::capability::LeaseBounds::engine()
        .resolve(timeout)
        .map(|_| ())
}

/// A private preview's token lifetime ([`PreviewOptions::token_ttl`](crate::PreviewOptions))
/// must be within [`MIN_PREVIEW_TOKEN_TTL`] and [`MAX_PREVIEW_TOKEN_TTL`].
pub fn validate_token_ttl(ttl: Option<Duration>) -> Result<()> {
    match ttl {
        Some(t) if !(MIN_PREVIEW_TOKEN_TTL..=MAX_PREVIEW_TOKEN_TTL).contains(&t) => {
            Err(Error::invalid(format!(
                "a preview token lifetime of {:.3}s is outside {}s to {}s",
                t.as_secs_f64(),
                MIN_PREVIEW_TOKEN_TTL.as_secs(),
                MAX_PREVIEW_TOKEN_TTL.as_secs()
            )))
        }
        _ => Ok(()),
    }
}

/// A preview token's expiry (ms since the epoch) must be in the future and at most
/// [`MAX_PREVIEW_TOKEN_TTL`] ahead of `now`.
pub fn validate_token_expiry(
    expires_at: Option<crate::UnixMillis>,
    now: crate::UnixMillis,
) -> Result<()> {
    let Some(at) = expires_at else {
        return Ok(());
    };
    let max = now.saturating_add(MAX_PREVIEW_TOKEN_TTL.as_millis() as u64);
    if at <= now || at > max {
        return Err(Error::invalid(format!(
            "a preview token must expire in the future and at most {}s from now (expires_at \
             {at} is {})",
            MAX_PREVIEW_TOKEN_TTL.as_secs(),
            if at <= now {
                "already past"
            } else {
                "too far ahead"
            }
        )));
    }
    Ok(())
}

/// The error for a sandbox name outside the accepted form.
pub fn invalid_sandbox_name(name: &str) -> Error {
    Error::invalid(format!(
        "sandbox name {name:?} must be 1-{} ASCII letters, digits, '-', '_' or '.', \
         starting with a letter or digit",
        crate::MAX_SANDBOX_NAME
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Command, ErrorCode};

    fn refused(r: Result<()>) -> bool {
        matches!(r, Err(e) if e.code() == ErrorCode::InvalidArgument)
    }

    #[test]
    fn bad_create_options_are_refused_and_good_ones_pass() {
        assert!(CreateOptions::default().validate().is_ok());
        let with = |f: fn(&mut CreateOptions)| {
            let mut o = CreateOptions::default();
            f(&mut o);
            o.validate()
        };
        for name in ["A=B", "A-B", "1X", "=", "", "A\0", "a.b", "é"] {
            let mut o = CreateOptions::default();
            o.envs.insert(name.into(), "x".into());
            assert!(refused(o.validate()), "{name:?}");
            let mut s = ProcessSpec::new(Command::sh("true"));
            s.envs.insert(name.into(), "x".into());
            assert!(refused(s.validate()), "{name:?}");
        }
        for name in ["A", "_", "a_1", "PATH", "_X9"] {
            let mut o = CreateOptions::default();
            o.envs.insert(name.into(), "x".into());
            assert!(o.validate().is_ok(), "{name:?}");
        }
        assert!(refused(with(|o| {
            o.labels.insert(String::new(), "x".into());
        })));
        assert!(refused(with(|o| o.name = Some("-x".into()))));
        assert!(refused(with(|o| o.timeout = Some(MAX_SANDBOX_TIMEOUT * 2))));
        assert!(refused(with(|o| o.resources.max_processes = Some(0))));
        assert!(refused(with(|o| o.hostname = Some("a b".into()))));
        for home in ["rel", "/", "/usr/x", "/tmp", "/a/../etc", "//"] {
            let o = CreateOptions {
                home: Some(home.into()),
                ..Default::default()
            };
            assert!(refused(o.validate()), "{home:?}");
        }
        assert!(with(|o| o.home = Some("/srv/me".into())).is_ok());
    }

    #[test]
    fn file_attributes_are_bounded_and_in_the_user_namespace() {
        let with = |pairs: &[(&str, usize)]| {
            let mut o = WriteOptions::default();
            for (name, len) in pairs {
                o.attributes.insert(name.to_string(), vec![b'v'; *len]);
            }
            o.validate()
        };
        assert!(with(&[]).is_ok());
        assert!(with(&[("user.origin", 10), ("user.e2b.k", 0)]).is_ok());
        for name in [
            "origin",
            "user.",
            "trusted.x",
            "security.selinux",
            "user.a\0b",
            "USER.x",
        ] {
            assert!(refused(with(&[(name, 1)])), "{name:?}");
        }
        let longest = format!("user.{}", "n".repeat(MAX_FILE_ATTRIBUTE_NAME_BYTES - 5));
        assert!(with(&[(&longest, 1)]).is_ok());
        assert!(refused(with(&[(&format!("{longest}n"), 1)])));
        assert!(refused(with(&[("user.big", MAX_FILE_ATTRIBUTE_BYTES)])));
        assert!(with(&[("user.big", MAX_FILE_ATTRIBUTE_BYTES - 8)]).is_ok());
        let many: Vec<String> = (0..=MAX_FILE_ATTRIBUTES)
            .map(|i| format!("user.{i}"))
            .collect();
        let many: Vec<(&str, usize)> = many.iter().map(|n| (n.as_str(), 1)).collect();
        assert!(refused(with(&many)));
        assert!(with(&many[1..]).is_ok());
    }

    #[test]
    fn bad_process_specs_are_refused_and_good_ones_pass() {
        assert!(ProcessSpec::new(Command::sh("true")).validate().is_ok());
        assert!(refused(ProcessSpec::new(Command::argv([""])).validate()));
        assert!(refused(
            ProcessSpec::new(Command::argv(["a", "b\0"])).validate()
        ));
        let mut s = ProcessSpec::new(Command::sh("true"));
        s.cwd = Some(String::new());
        assert!(refused(s.validate()));
        let mut s = ProcessSpec::new(Command::sh("true"));
        s.timeout = Some(MAX_PROCESS_TIMEOUT * 2);
        assert!(refused(s.validate()));
    }
}
