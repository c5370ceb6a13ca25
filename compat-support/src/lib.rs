//! What the three vendor facades (`compat-e2b`, `compat-daytona`, `compat-blaxel`) share, so
//! each rule lives in one place:
//!
//! - [`Gap`]: one refused vendor feature with its alternative, and [`gap::check_mapping`], the
//!   test that a facade's gap table and its MAPPING.md section list the same rows;
//! - [`OptionalString`]: the argument type of an optional string keyword (MIRRORING.md rule 3);
//! - [`dates`]: the vendors' date formats, on the `time` crate;
//! - [`shell`]: POSIX shell quoting, on `shell-escape`;
//! - [`multipart`]: the one strict `multipart/form-data` parser (and answer framing) of the
//!   wire listeners.
#![forbid(unsafe_code)]

pub mod dates;
pub mod gap;
pub mod multipart;
pub mod shell;

pub use gap::Gap;

/// A string keyword Python also accepts as `None`: `&str`, `String`, `&String`, or
/// `Option<String>`, so `.cwd("/tmp")`, `.cwd(dir)` and `.cwd(None)` all read like the Python
/// call. (There is deliberately no `Option<&str>` form: it would make a bare `None` ambiguous.)
pub trait OptionalString {
    /// The value as `Option<String>`.
    fn into_optional(self) -> Option<String>;
}

impl OptionalString for &str {
    fn into_optional(self) -> Option<String> {
        Some(self.to_string())
    }
}

impl OptionalString for String {
    fn into_optional(self) -> Option<String> {
        Some(self)
    }
}

impl OptionalString for &String {
    fn into_optional(self) -> Option<String> {
        Some(self.clone())
    }
}

impl OptionalString for Option<String> {
    fn into_optional(self) -> Option<String> {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::OptionalString;

    #[test]
    fn every_form_reads_like_the_python_keyword() {
        assert_eq!("a".into_optional(), Some("a".to_string()));
        assert_eq!(String::from("b").into_optional(), Some("b".to_string()));
        assert_eq!((&String::from("c")).into_optional(), Some("c".to_string()));
        assert_eq!(None::<String>.into_optional(), None);
    }
}
