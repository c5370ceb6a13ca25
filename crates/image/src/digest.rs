//! SHA-256 digests (`sha256:<64 hex>`), the only algorithm the store accepts.

use std::io::{self, Read};

use crate::error::{ImageError, Result};

/// A validated `sha256:<hex>` digest.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Digest(String);

impl Digest {
    pub(crate) fn parse(text: &str) -> Result<Digest> {
        let hex = text.strip_prefix("sha256:").ok_or_else(|| {
            ImageError::malformed("digest", format!("{text:?} is not a sha256 digest"))
        })?;
        if hex.len() != 64
            || !hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(ImageError::malformed(
                "digest",
                format!("{text:?} is not sha256 followed by 64 lowercase hex digits"),
            ));
        }
        Ok(Digest(text.to_string()))
    }

    pub(crate) fn of(bytes: &[u8]) -> Digest {
        let mut hasher = Hasher::new();
        hasher.update(bytes);
        hasher.finish()
    }

    /// The 64 hex digits, used as file names.
    pub(crate) fn hex(&self) -> &str {
        &self.0["sha256:".len()..]
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }

    pub(crate) fn check(&self, actual: &Digest, what: impl Into<String>) -> Result<()> {
        if self == actual {
            Ok(())
        } else {
            Err(ImageError::DigestMismatch {
                what: what.into(),
                expected: self.0.clone(),
                actual: actual.0.clone(),
            })
        }
    }
}

impl std::fmt::Display for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// An incremental SHA-256.
#[derive(Clone)]
pub(crate) struct Hasher(ring::digest::Context);

impl Hasher {
    pub(crate) fn new() -> Hasher {
        Hasher(ring::digest::Context::new(&ring::digest::SHA256))
    }

    pub(crate) fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes)
    }

    pub(crate) fn finish(self) -> Digest {
        let mut text = String::with_capacity(71);
        text.push_str("sha256:");
        for byte in self.0.finish().as_ref() {
            text.push_str(&format!("{byte:02x}"));
        }
        Digest(text)
    }
}

/// A reader that hashes and counts what passes through it.
pub(crate) struct HashingReader<R> {
    pub(crate) inner: R,
    pub(crate) hasher: Hasher,
    pub(crate) count: u64,
}

impl<R: Read> HashingReader<R> {
    pub(crate) fn new(inner: R) -> Self {
        HashingReader {
            inner,
            hasher: Hasher::new(),
            count: 0,
        }
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_checked_and_computed() {
        let empty = Digest::of(b"");
        assert_eq!(
            empty.as_str(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(Digest::parse(empty.as_str()).unwrap(), empty);
        assert!(Digest::parse("sha256:E3B0").is_err());
        assert!(Digest::parse("sha512:00").is_err());
        assert!(Digest::parse(
            "sha256:../../etc/passwd000000000000000000000000000000000000000000000000000"
        )
        .is_err());
    }
}
