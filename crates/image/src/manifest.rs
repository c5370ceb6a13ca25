//! The OCI and Docker v2 documents the store reads: indexes, manifests and image configs.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::digest::Digest;
use crate::error::{ImageError, Result};

pub(crate) const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub(crate) const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub(crate) const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub(crate) const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub(crate) const DOCKER_LAYER_TAR: &str = "application/vnd.docker.image.rootfs.diff.tar";
/// The bound on manifests, indexes and configs: real ones are a few KiB.
pub(crate) const MAX_DOCUMENT_BYTES: u64 = 4 << 20;

/// A content descriptor.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Descriptor {
    #[serde(default)]
    pub(crate) media_type: String,
    pub(crate) digest: String,
    pub(crate) size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) platform: Option<Platform>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) annotations: BTreeMap<String, String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Platform {
    #[serde(default)]
    pub(crate) architecture: String,
    #[serde(default)]
    pub(crate) os: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) variant: Option<String>,
}

/// An OCI image index or a Docker manifest list.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Index {
    #[serde(default)]
    pub(crate) manifests: Vec<Descriptor>,
}

/// An OCI image manifest or a Docker v2 schema 2 manifest.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Manifest {
    pub(crate) schema_version: u32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) media_type: String,
    pub(crate) config: Descriptor,
    pub(crate) layers: Vec<Descriptor>,
}

/// The parts of an image config the store uses.
#[derive(Clone, Debug, Default, Deserialize)]
pub(crate) struct ImageConfigFile {
    #[serde(default)]
    pub(crate) architecture: String,
    #[serde(default)]
    pub(crate) os: String,
    #[serde(default)]
    pub(crate) created: Option<String>,
    #[serde(default)]
    pub(crate) config: Option<RunConfig>,
    pub(crate) rootfs: RootFs,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct RunConfig {
    #[serde(default)]
    pub(crate) env: Option<Vec<String>>,
    #[serde(default)]
    pub(crate) working_dir: Option<String>,
    #[serde(default)]
    pub(crate) user: Option<String>,
    #[serde(default)]
    pub(crate) entrypoint: Option<Vec<String>>,
    #[serde(default)]
    pub(crate) cmd: Option<Vec<String>>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub(crate) struct RootFs {
    #[serde(rename = "type", default)]
    pub(crate) kind: String,
    #[serde(default)]
    pub(crate) diff_ids: Vec<String>,
}

/// What a fetched document turned out to be.
pub(crate) enum Document {
    Index(Index),
    Manifest(Manifest),
}

/// Parses a manifest or index, by its declared media type or, absent one, by its shape.
pub(crate) fn parse_document(bytes: &[u8], content_type: Option<&str>) -> Result<Document> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Probe {
        #[serde(default)]
        schema_version: Option<u32>,
        #[serde(default)]
        media_type: Option<String>,
        #[serde(default)]
        manifests: Option<serde_json::Value>,
    }
    let probe: Probe = serde_json::from_slice(bytes)
        .map_err(|e| ImageError::malformed("manifest", format!("not JSON: {e}")))?;
    if probe.schema_version == Some(1) {
        return Err(ImageError::Unsupported {
            what:
                "Docker schema 1 manifests (deprecated; push the image again with a current tool)"
                    .into(),
        });
    }
    let media_type = probe
        .media_type
        .clone()
        .or_else(|| content_type.map(|c| c.split(';').next().unwrap_or("").trim().to_string()))
        .unwrap_or_default();
    let is_index = media_type == OCI_INDEX
        || media_type == DOCKER_LIST
        || (media_type.is_empty() && probe.manifests.is_some());
    if is_index {
        let index: Index = serde_json::from_slice(bytes)
            .map_err(|e| ImageError::malformed("image index", e.to_string()))?;
        for descriptor in &index.manifests {
            Digest::parse(&descriptor.digest)?;
        }
        return Ok(Document::Index(index));
    }
    if !(media_type == OCI_MANIFEST
        || media_type == DOCKER_MANIFEST
        || media_type.is_empty()
        || media_type.contains("json"))
    {
        return Err(ImageError::Unsupported {
            what: format!("manifest media type {media_type:?}"),
        });
    }
    let manifest: Manifest = serde_json::from_slice(bytes)
        .map_err(|e| ImageError::malformed("image manifest", e.to_string()))?;
    if manifest.schema_version != 2 {
        return Err(ImageError::malformed(
            "image manifest",
            format!("schemaVersion {} (expected 2)", manifest.schema_version),
        ));
    }
    Digest::parse(&manifest.config.digest)?;
    // Each layer may unpack to the layer bound: their number is bounded too, before any is
    // fetched (and a root stacks no more).
    if manifest.layers.len() > crate::MAX_IMAGE_LAYERS {
        return Err(ImageError::TooLarge {
            what: "image manifest".into(),
            reason: format!(
                "{} layers (at most {})",
                manifest.layers.len(),
                crate::MAX_IMAGE_LAYERS
            ),
        });
    }
    for layer in &manifest.layers {
        Digest::parse(&layer.digest)?;
    }
    Ok(Document::Manifest(manifest))
}

/// Parses an image config and checks it against its manifest's layer count.
pub(crate) fn parse_config(
    bytes: &[u8],
    layer_count: usize,
) -> Result<(ImageConfigFile, Vec<Digest>)> {
    let config: ImageConfigFile = serde_json::from_slice(bytes)
        .map_err(|e| ImageError::malformed("image config", e.to_string()))?;
    if !config.rootfs.kind.is_empty() && config.rootfs.kind != "layers" {
        return Err(ImageError::malformed(
            "image config",
            format!("rootfs type {:?} (expected \"layers\")", config.rootfs.kind),
        ));
    }
    let diff_ids = config
        .rootfs
        .diff_ids
        .iter()
        .map(|d| Digest::parse(d))
        .collect::<Result<Vec<_>>>()?;
    if diff_ids.len() != layer_count {
        return Err(ImageError::malformed(
            "image config",
            format!("{} diff ids for {layer_count} layers", diff_ids.len()),
        ));
    }
    Ok((config, diff_ids))
}

/// The host's platform in OCI terms.
pub(crate) fn host_platform() -> (&'static str, &'static str) {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" if cfg!(target_endian = "little") => "ppc64le",
        "loongarch64" => "loong64",
        other => other,
    };
    (arch, "linux")
}

/// Chooses the host platform's manifest in an index (arm64's `v8` variant or none).
pub(crate) fn select_platform(index: &Index) -> Result<&Descriptor> {
    let (arch, os) = host_platform();
    let candidates = index.manifests.iter().filter(|d| {
        d.platform
            .as_ref()
            .is_some_and(|p| p.architecture == arch && p.os == os)
    });
    let mut best: Option<&Descriptor> = None;
    for candidate in candidates {
        let variant = candidate
            .platform
            .as_ref()
            .and_then(|p| p.variant.as_deref());
        let fits = match (arch, variant) {
            (_, None) => true,
            ("arm64", Some("v8")) => true,
            ("arm", Some(v)) => v == "v7",
            _ => false,
        };
        if fits && best.is_none() {
            best = Some(candidate);
        }
    }
    best.ok_or_else(|| ImageError::Unsupported {
        what: format!(
            "no manifest for this host's platform {os}/{arch} in the image index (it has: {})",
            index
                .manifests
                .iter()
                .filter_map(|d| d
                    .platform
                    .as_ref()
                    .map(|p| format!("{}/{}", p.os, p.architecture)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A manifest listing more layers than a root stacks is refused before any is fetched.
    #[test]
    fn a_manifest_with_too_many_layers_is_refused() {
        let digest = format!("sha256:{}", "a".repeat(64));
        let layer = serde_json::json!({
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": digest, "size": 1,
        });
        let manifest = |n: usize| {
            serde_json::to_vec(&serde_json::json!({
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                           "digest": digest, "size": 1},
                "layers": vec![layer.clone(); n],
            }))
            .unwrap()
        };
        assert!(parse_document(&manifest(crate::MAX_IMAGE_LAYERS), None).is_ok());
        assert!(matches!(
            parse_document(&manifest(crate::MAX_IMAGE_LAYERS + 1), None),
            Err(ImageError::TooLarge { .. })
        ));
    }
}
