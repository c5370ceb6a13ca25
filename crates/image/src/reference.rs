//! Image references: parsing and Docker Hub normalisation.

use crate::digest::Digest;
use crate::error::{ImageError, Result};

/// The registry short names (`python:3.12`) resolve to.
pub(crate) const DOCKER_HUB: &str = "docker.io";
/// The host Docker Hub's registry API is served from.
pub(crate) const DOCKER_HUB_API: &str = "registry-1.docker.io";

/// A normalised reference: `registry/repository` with a tag, a digest, or both.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Reference {
    /// `docker.io`, `ghcr.io`, `127.0.0.1:5000`, …
    pub(crate) registry: String,
    /// `library/python`, `org/app`, …
    pub(crate) repository: String,
    pub(crate) tag: Option<String>,
    pub(crate) digest: Option<Digest>,
}

impl Reference {
    /// Parses `[host[:port]/]path[:tag][@sha256:hex]`; a reference with neither tag nor
    /// digest gets `latest`, as Docker does.
    pub(crate) fn parse(text: &str) -> Result<Reference> {
        let invalid = |reason: &str| ImageError::InvalidReference {
            reference: text.to_string(),
            reason: reason.to_string(),
        };
        if text.is_empty() || text.len() > 512 {
            return Err(invalid("empty or longer than 512 characters"));
        }
        let (rest, digest) = match text.split_once('@') {
            Some((rest, digest)) => (
                rest,
                Some(
                    Digest::parse(digest)
                        .map_err(|_| invalid("the digest is not sha256:<64 hex>"))?,
                ),
            ),
            None => (text, None),
        };
        // A tag is the part after the last ':' that is not followed by a '/' (a port is).
        let (name, tag) = match rest.rfind(':') {
            Some(i) if !rest[i + 1..].contains('/') => (&rest[..i], Some(&rest[i + 1..])),
            _ => (rest, None),
        };
        if let Some(tag) = tag {
            let valid = !tag.is_empty()
                && tag.len() <= 128
                && !tag.starts_with(['.', '-'])
                && tag
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
            if !valid {
                return Err(invalid(
                    "the tag must be 1-128 of [A-Za-z0-9_.-], not starting with . or -",
                ));
            }
        }
        let (registry, path) = match name.split_once('/') {
            Some((first, path))
                if first.contains('.') || first.contains(':') || first == "localhost" =>
            {
                (first.to_string(), path.to_string())
            }
            _ => (DOCKER_HUB.to_string(), name.to_string()),
        };
        let registry = match registry.as_str() {
            "index.docker.io" | "registry-1.docker.io" => DOCKER_HUB.to_string(),
            _ => registry,
        };
        let host = registry.split(':').next().unwrap_or("");
        if !registry
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b))
            || (!host.starts_with('[') && host.split('.').any(|label| label.is_empty()))
        {
            return Err(invalid(
                "the registry host has characters a host name cannot",
            ));
        }
        let repository = if registry == DOCKER_HUB && !path.contains('/') {
            format!("library/{path}")
        } else {
            path
        };
        for component in repository.split('/') {
            let valid = !component.is_empty()
                && component
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
                && component
                    .bytes()
                    .next()
                    .is_some_and(|b| b.is_ascii_alphanumeric())
                && component
                    .bytes()
                    .last()
                    .is_some_and(|b| b.is_ascii_alphanumeric());
            if !valid {
                return Err(invalid(
                    "each name component must be lowercase letters, digits and . _ -, starting and ending with a letter or digit",
                ));
            }
        }
        let tag = match (tag, &digest) {
            (Some(tag), _) => Some(tag.to_string()),
            (None, Some(_)) => None,
            (None, None) => Some("latest".to_string()),
        };
        Ok(Reference {
            registry,
            repository,
            tag,
            digest,
        })
    }

    /// `registry/repository`.
    pub(crate) fn name(&self) -> String {
        format!("{}/{}", self.registry, self.repository)
    }

    /// The normalised text: `registry/repository[:tag][@digest]`.
    pub(crate) fn full(&self) -> String {
        let mut text = self.name();
        if let Some(tag) = &self.tag {
            text.push(':');
            text.push_str(tag);
        }
        if let Some(digest) = &self.digest {
            text.push('@');
            text.push_str(digest.as_str());
        }
        text
    }

    /// `registry/repository:tag` when there is a tag (the store's tag key).
    pub(crate) fn tagged(&self) -> Option<String> {
        self.tag
            .as_ref()
            .map(|tag| format!("{}:{tag}", self.name()))
    }

    /// What to ask the registry's manifest endpoint for: the digest if any, else the tag.
    pub(crate) fn manifest_key(&self) -> String {
        match (&self.digest, &self.tag) {
            (Some(digest), _) => digest.to_string(),
            (None, Some(tag)) => tag.clone(),
            (None, None) => "latest".to_string(),
        }
    }

    /// The host the registry API is served from (Docker Hub's differs from its name).
    pub(crate) fn api_host(&self) -> &str {
        if self.registry == DOCKER_HUB {
            DOCKER_HUB_API
        } else {
            &self.registry
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_hub_names_are_normalised() {
        let r = Reference::parse("python:3.12").unwrap();
        assert_eq!(r.full(), "docker.io/library/python:3.12");
        assert_eq!(r.api_host(), "registry-1.docker.io");
        assert_eq!(
            Reference::parse("ubuntu").unwrap().full(),
            "docker.io/library/ubuntu:latest"
        );
        assert_eq!(
            Reference::parse("org/app:v1").unwrap().full(),
            "docker.io/org/app:v1"
        );
        assert_eq!(
            Reference::parse("index.docker.io/library/debian:bookworm")
                .unwrap()
                .full(),
            "docker.io/library/debian:bookworm"
        );
    }

    #[test]
    fn hosts_ports_tags_and_digests_are_split() {
        let r = Reference::parse("127.0.0.1:5000/a/b:v2").unwrap();
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str(), r.tag.as_deref()),
            ("127.0.0.1:5000", "a/b", Some("v2"))
        );
        let r = Reference::parse("localhost:5000/app").unwrap();
        assert_eq!(r.full(), "localhost:5000/app:latest");
        let d = format!("sha256:{}", "a".repeat(64));
        let r = Reference::parse(&format!("ghcr.io/o/app@{d}")).unwrap();
        assert_eq!(r.tag, None);
        assert_eq!(r.manifest_key(), d);
    }

    #[test]
    fn invalid_references_are_refused() {
        for bad in [
            "",
            "Python",
            "a//b",
            "a:",
            "a:-x",
            "a@sha256:12",
            "../x",
            "a/../b",
        ] {
            assert!(
                matches!(
                    Reference::parse(bad),
                    Err(ImageError::InvalidReference { .. })
                ),
                "{bad:?} accepted"
            );
        }
    }
}
