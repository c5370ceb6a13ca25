//! Importing images without a registry: an OCI image layout directory, an `oci-archive` tar,
//! or a `docker save` / `podman save` tar.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use crate::digest::{Digest, HashingReader};
use crate::error::{ImageError, Result};
use crate::manifest::{
    self, Descriptor, Document, Manifest, DOCKER_LAYER_TAR, DOCKER_MANIFEST, MAX_DOCUMENT_BYTES,
};
use crate::reference::Reference;
use crate::store::{image_record, Commit, Store};
use crate::ImageInfo;

/// The files of a layout or archive, by their path inside it.
struct Files {
    root: Option<PathBuf>,
    spooled: HashMap<String, PathBuf>,
    /// The spool directory, removed when the import ends.
    spool: Option<PathBuf>,
}

impl Drop for Files {
    fn drop(&mut self) {
        if let Some(spool) = &self.spool {
            let _ = crate::unpack::remove_path(spool);
        }
    }
}

/// `./a/b` → `a/b`; `None` for names with `..` or absolute ones.
fn clean(name: &str) -> Option<String> {
    if name.starts_with('/') {
        return None;
    }
    let mut parts = Vec::new();
    for part in name.split('/') {
        match part {
            "" | "." => continue,
            ".." => return None,
            other => parts.push(other),
        }
    }
    Some(parts.join("/"))
}

impl Files {
    fn path(&self, name: &str) -> Result<PathBuf> {
        let missing = || {
            ImageError::malformed(
                "image archive",
                format!("it names {name:?}, which it does not hold"),
            )
        };
        let name = clean(name).ok_or_else(missing)?;
        match &self.root {
            Some(root) => {
                let path = root.join(&name);
                if path.is_file() {
                    Ok(path)
                } else {
                    Err(missing())
                }
            }
            None => self.spooled.get(&name).cloned().ok_or_else(missing),
        }
    }

    fn has(&self, name: &str) -> bool {
        self.path(name).is_ok()
    }

    fn document(&self, name: &str) -> Result<Vec<u8>> {
        let path = self.path(name)?;
        let file =
            std::fs::File::open(&path).map_err(|e| ImageError::io(format!("opening {name}"), e))?;
        let mut bytes = Vec::new();
        file.take(MAX_DOCUMENT_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| ImageError::io(format!("reading {name}"), e))?;
        if bytes.len() as u64 > MAX_DOCUMENT_BYTES {
            return Err(ImageError::TooLarge {
                what: name.to_string(),
                reason: format!("past {MAX_DOCUMENT_BYTES} bytes"),
            });
        }
        Ok(bytes)
    }

    fn blob(&self, digest: &Digest) -> Result<Vec<u8>> {
        let bytes = self.document(&format!("blobs/sha256/{}", digest.hex()))?;
        digest.check(&Digest::of(&bytes), format!("blob {digest}"))?;
        Ok(bytes)
    }
}

/// Copies every regular file of a tar (compressed or not) into a spool directory of the
/// store, each under a number: the archive's names never become paths.
fn spool(store: &Store, path: &Path) -> Result<Files> {
    let spool_dir = store.temp_path("import");
    std::fs::create_dir(&spool_dir)
        .map_err(|e| ImageError::io(format!("creating {}", spool_dir.display()), e))?;
    let mut files = Files {
        root: None,
        spooled: HashMap::new(),
        spool: Some(spool_dir.clone()),
    };
    let archive_file = std::fs::File::open(path)
        .map_err(|e| ImageError::io(format!("opening {}", path.display()), e))?;
    let mut archive = tar::Archive::new(crate::unpack::decompress(archive_file)?);
    let limit = store.limits().max_bytes;
    let bad = |e: std::io::Error| {
        ImageError::malformed(format!("image archive {}", path.display()), e.to_string())
    };
    for (number, entry) in archive.entries().map_err(bad)?.enumerate() {
        let mut entry = entry.map_err(bad)?;
        if !matches!(
            entry.header().entry_type(),
            tar::EntryType::Regular | tar::EntryType::Continuous
        ) {
            continue;
        }
        let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let Some(name) = clean(&name) else { continue };
        if entry.size() > limit {
            return Err(ImageError::TooLarge {
                what: format!("{name} in {}", path.display()),
                reason: format!("past {limit} bytes"),
            });
        }
        let target = spool_dir.join(number.to_string());
        let mut out =
            std::fs::File::create(&target).map_err(|e| ImageError::io("spooling an archive", e))?;
        std::io::copy(&mut entry, &mut out).map_err(bad)?;
        out.flush()
            .map_err(|e| ImageError::io("spooling an archive", e))?;
        files.spooled.insert(name, target);
    }
    Ok(files)
}

/// One image found in the input, ready to store.
struct Found {
    manifest: Manifest,
    manifest_bytes: Vec<u8>,
    config_bytes: Vec<u8>,
    /// The layers' files, in the manifest's order.
    layer_files: Vec<PathBuf>,
    /// Whether the layer files must match the manifest's digests (OCI), or the manifest was
    /// made here from them (`docker save`).
    names: Vec<String>,
}

pub(crate) fn import(store: &Store, path: &Path, tag: Option<&str>) -> Result<Vec<ImageInfo>> {
    let tag = tag.map(Reference::parse).transpose()?;
    let metadata = std::fs::metadata(path)
        .map_err(|e| ImageError::io(format!("reading {}", path.display()), e))?;
    let files = if metadata.is_dir() {
        Files {
            root: Some(path.to_path_buf()),
            spooled: HashMap::new(),
            spool: None,
        }
    } else {
        spool(store, path)?
    };
    let found = if files.has("manifest.json") {
        docker_save(&files)?
    } else if files.has("index.json") {
        oci_layout(&files)?
    } else {
        return Err(ImageError::malformed(
            format!("image archive {}", path.display()),
            "neither an OCI layout (index.json) nor a docker save archive (manifest.json)",
        ));
    };
    if tag.is_some() && found.len() != 1 {
        return Err(ImageError::malformed(
            "import",
            format!("a tag was given for an archive of {} images", found.len()),
        ));
    }
    let mut infos = Vec::new();
    for image in found {
        infos.push(store_image(store, image, tag.as_ref())?);
    }
    Ok(infos)
}

fn store_image(store: &Store, image: Found, tag: Option<&Reference>) -> Result<ImageInfo> {
    let (config, diff_ids) =
        manifest::parse_config(&image.config_bytes, image.manifest.layers.len())?;
    let config_digest = Digest::of(&image.config_bytes);
    Digest::parse(&image.manifest.config.digest)?.check(&config_digest, "image config")?;
    let missing: u64 = image
        .manifest
        .layers
        .iter()
        .zip(&diff_ids)
        .filter(|(_, d)| !store.has_layer(d))
        .map(|(l, _)| l.size)
        .sum();
    store.check_room(missing)?;
    let names: Vec<Reference> = match tag {
        Some(tag) => vec![tag.clone()],
        None => image
            .names
            .iter()
            .filter_map(|n| Reference::parse(n).ok())
            .collect(),
    };
    let digest = Digest::of(&image.manifest_bytes);
    let repository = names.first().map(|n| n.name()).unwrap_or_default();
    let record = image_record(
        &digest,
        None,
        &repository,
        &image.manifest,
        &config,
        &diff_ids,
    );
    for attempt in 0..3 {
        for ((layer, diff_id), file) in image
            .manifest
            .layers
            .iter()
            .zip(&diff_ids)
            .zip(&image.layer_files)
        {
            if store.has_layer(diff_id) {
                continue;
            }
            let expected = Digest::parse(&layer.digest)?;
            let mut reader = HashingReader::new(
                std::fs::File::open(file).map_err(|e| ImageError::io("opening a layer", e))?,
            );
            std::io::copy(&mut reader, &mut std::io::sink())
                .map_err(|e| ImageError::io("reading a layer", e))?;
            expected.check(&reader.hasher.finish(), format!("layer blob {expected}"))?;
            store.unpack_file(diff_id, file)?;
        }
        let mut all_tags: Vec<Option<String>> = names.iter().map(|n| n.tagged()).collect();
        if all_tags.is_empty() {
            all_tags.push(None);
        }
        let mut missing = Vec::new();
        for tag in all_tags {
            let commit = Commit {
                blobs: vec![image.manifest_bytes.clone(), image.config_bytes.clone()],
                record: record.clone(),
                tag,
            };
            missing = store.commit(&commit)?;
            if !missing.is_empty() {
                break;
            }
        }
        if missing.is_empty() {
            return store.info_of(&record.digest);
        }
        tracing::debug!("import attempt {attempt}: layers pruned meanwhile: {missing:?}");
    }
    Err(ImageError::malformed(
        "import",
        "layers kept being pruned while the image was imported",
    ))
}

fn docker_save(files: &Files) -> Result<Vec<Found>> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct Entry {
        config: String,
        #[serde(default)]
        repo_tags: Option<Vec<String>>,
        layers: Vec<String>,
    }
    let entries: Vec<Entry> = serde_json::from_slice(&files.document("manifest.json")?)
        .map_err(|e| ImageError::malformed("docker save manifest.json", e.to_string()))?;
    let mut found = Vec::new();
    for entry in entries {
        let config_bytes = files.document(&entry.config)?;
        let mut layers = Vec::new();
        let mut layer_files = Vec::new();
        for layer in &entry.layers {
            let file = files.path(layer)?;
            let (digest, size, media_type) = describe_layer(&file)?;
            layers.push(Descriptor {
                media_type,
                digest: digest.to_string(),
                size,
                platform: None,
                annotations: Default::default(),
            });
            layer_files.push(file);
        }
        // `docker save` has no manifest: one is made from the config and the layer files, as
        // other tools do, so the image has a manifest digest like a pulled one.
        let manifest = Manifest {
            schema_version: 2,
            media_type: DOCKER_MANIFEST.to_string(),
            config: Descriptor {
                media_type: "application/vnd.docker.container.image.v1+json".into(),
                digest: Digest::of(&config_bytes).to_string(),
                size: config_bytes.len() as u64,
                platform: None,
                annotations: Default::default(),
            },
            layers,
        };
        let manifest_bytes = serde_json::to_vec(&manifest).expect("a manifest serialises");
        found.push(Found {
            manifest,
            manifest_bytes,
            config_bytes,
            layer_files,
            names: entry.repo_tags.unwrap_or_default(),
        });
    }
    Ok(found)
}

/// A layer file's digest, size and media type (by its first bytes).
fn describe_layer(file: &Path) -> Result<(Digest, u64, String)> {
    let mut reader = HashingReader::new(
        std::fs::File::open(file).map_err(|e| ImageError::io("opening a layer", e))?,
    );
    let mut head = [0u8; 4];
    let n = reader
        .read(&mut head)
        .map_err(|e| ImageError::io("reading a layer", e))?;
    std::io::copy(&mut reader, &mut std::io::sink())
        .map_err(|e| ImageError::io("reading a layer", e))?;
    let media_type = if head[..n].starts_with(&[0x1f, 0x8b]) {
        "application/vnd.docker.image.rootfs.diff.tar.gzip"
    } else if head[..n].starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        "application/vnd.oci.image.layer.v1.tar+zstd"
    } else {
        DOCKER_LAYER_TAR
    };
    let size = reader.count;
    Ok((reader.hasher.finish(), size, media_type.to_string()))
}

fn oci_layout(files: &Files) -> Result<Vec<Found>> {
    let index_bytes = files.document("index.json")?;
    let Document::Index(index) = manifest::parse_document(&index_bytes, Some(manifest::OCI_INDEX))?
    else {
        return Err(ImageError::malformed(
            "OCI layout index.json",
            "not an image index",
        ));
    };
    let mut found = Vec::new();
    for descriptor in &index.manifests {
        let name = descriptor
            .annotations
            .get("io.containerd.image.name")
            .or_else(|| {
                descriptor
                    .annotations
                    .get("org.opencontainers.image.ref.name")
            })
            .filter(|n| n.contains('/') || n.contains(':'))
            .cloned();
        let mut chosen = descriptor.clone();
        let mut bytes = files.blob(&Digest::parse(&chosen.digest)?)?;
        // A nested index (a multi-platform image): the host's platform.
        if let Document::Index(nested) = manifest::parse_document(&bytes, Some(&chosen.media_type))?
        {
            chosen = manifest::select_platform(&nested)?.clone();
            bytes = files.blob(&Digest::parse(&chosen.digest)?)?;
        }
        let Document::Manifest(manifest) =
            manifest::parse_document(&bytes, Some(&chosen.media_type))?
        else {
            return Err(ImageError::malformed(
                "OCI layout",
                "an index nested in an index nested in index.json",
            ));
        };
        let config_bytes = files.blob(&Digest::parse(&manifest.config.digest)?)?;
        let layer_files = manifest
            .layers
            .iter()
            .map(|l| files.path(&format!("blobs/sha256/{}", Digest::parse(&l.digest)?.hex())))
            .collect::<Result<Vec<_>>>()?;
        found.push(Found {
            manifest,
            manifest_bytes: bytes,
            config_bytes,
            layer_files,
            names: name.into_iter().collect(),
        });
    }
    Ok(found)
}
