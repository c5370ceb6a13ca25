//! Importing images without a registry: an OCI image layout directory, an `oci-archive` tar,
//! or a `docker save` / `podman save` tar.

use std::collections::HashMap;
use std::io::{Read, Seek, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use crate::digest::{Digest, HashingReader};
use crate::error::{ImageError, Result};
use crate::manifest::{
    self, Descriptor, Document, Manifest, DOCKER_LAYER_TAR, DOCKER_MANIFEST, MAX_DOCUMENT_BYTES,
};
use crate::reference::Reference;
use crate::store::{image_record, Commit, Store};
use crate::unpack::RoomEntry;
use crate::{
    ImageInfo, MAX_ARCHIVE_BYTES, MAX_ARCHIVE_ENTRIES, MAX_ARCHIVE_IMAGES, MAX_IMAGE_LAYERS,
};

/// The files of a layout or archive, by their path inside it.
struct Files<'s> {
    /// A layout directory (its path for errors, and its descriptor): every file of it is
    /// opened beneath that descriptor with no symlink followed.
    root: Option<(PathBuf, OwnedFd)>,
    spooled: HashMap<String, PathBuf>,
    /// The spool directory, removed when the import ends.
    spool: Option<PathBuf>,
    /// The spool's place in the store's room, held until the import ends: the layers
    /// unpacked meanwhile are charged on top of the spooled bytes, which take room as long.
    room: Option<RoomEntry<'s>>,
}

impl Drop for Files<'_> {
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

/// How the files of a layout directory are reached beneath it: no symlink, magic link or
/// `..` followed, so a layout cannot make any other file the importing user can read (an SSH
/// key, another user's layer) part of an image.
const RESOLVE: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);

impl Files<'_> {
    /// A layout directory's files, beneath its descriptor.
    fn directory(path: &Path) -> Result<Files<'static>> {
        let dir = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| ImageError::io(format!("opening {}", path.display()), e.into()))?;
        Ok(Files {
            root: Some((path.to_path_buf(), dir)),
            spooled: HashMap::new(),
            spool: None,
            room: None,
        })
    }

    fn missing(name: &str) -> ImageError {
        ImageError::malformed(
            "image archive",
            format!("it names {name:?}, which it does not hold"),
        )
    }

    /// Opens the regular file `name` of the layout or archive; `Ok(None)` when there is none.
    /// In a layout directory, a name reached through a symlink is [`ImageError::Malformed`].
    fn try_open(&self, name: &str) -> Result<Option<std::fs::File>> {
        let Some(name) = clean(name) else {
            return Ok(None);
        };
        let Some((dir_path, dir)) = &self.root else {
            return match self.spooled.get(&name) {
                Some(path) => std::fs::File::open(path)
                    .map(Some)
                    .map_err(|e| ImageError::io(format!("opening {name}"), e)),
                None => Ok(None),
            };
        };
        let refused = |reason: &str| {
            ImageError::malformed(
                format!("OCI layout {}", dir_path.display()),
                format!("{name:?} {reason}"),
            )
        };
        // Non-blocking: a fifo planted in the layout must not hang the import on its open.
        let file = match rustix::fs::openat2(
            dir,
            name.as_str(),
            OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
            RESOLVE,
        ) {
            Ok(fd) => fd,
            Err(Errno::NOENT) | Err(Errno::NOTDIR) => return Ok(None),
            Err(Errno::LOOP) => {
                return Err(refused(
                    "is reached through a symlink (a layout's files are read beneath it, \
                     never through one)",
                ))
            }
            Err(Errno::XDEV) => return Err(refused("resolves outside the layout")),
            Err(e) => {
                return Err(ImageError::io(
                    format!("opening {name} in {}", dir_path.display()),
                    e.into(),
                ))
            }
        };
        let stat = rustix::fs::fstat(&file)
            .map_err(|e| ImageError::io(format!("examining {name}"), e.into()))?;
        if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
            return Err(refused("is not a regular file"));
        }
        Ok(Some(std::fs::File::from(file)))
    }

    /// Opens the regular file `name`; one the layout or archive does not hold is
    /// [`ImageError::Malformed`].
    fn open(&self, name: &str) -> Result<std::fs::File> {
        self.try_open(name)?.ok_or_else(|| Self::missing(name))
    }

    fn has(&self, name: &str) -> Result<bool> {
        Ok(self.try_open(name)?.is_some())
    }

    fn document(&self, name: &str) -> Result<Vec<u8>> {
        let file = self.open(name)?;
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
/// store, each under a number: the archive's names never become paths. The decompressed bytes
/// written are bounded by [`MAX_ARCHIVE_BYTES`] and charged to the room the store's bound
/// leaves, as a layer unpack's are; the entries by [`MAX_ARCHIVE_ENTRIES`].
fn spool<'s>(store: &'s Store, path: &Path) -> Result<Files<'s>> {
    spool_bounded(store, path, MAX_ARCHIVE_BYTES, MAX_ARCHIVE_ENTRIES)
}

fn spool_bounded<'s>(
    store: &'s Store,
    path: &Path,
    max_bytes: u64,
    max_entries: u64,
) -> Result<Files<'s>> {
    let spool_dir = store.temp_path("import");
    std::fs::create_dir(&spool_dir)
        .map_err(|e| ImageError::io("creating the import's spool in the image store", e))?;
    // From here the spool is removed however the import ends.
    let mut files = Files {
        root: None,
        spooled: HashMap::new(),
        spool: Some(spool_dir.clone()),
        room: store.enter_room(),
    };
    let archive_file = std::fs::File::open(path)
        .map_err(|e| ImageError::io(format!("opening {}", path.display()), e))?;
    let mut archive = tar::Archive::new(crate::unpack::decompress(archive_file)?);
    let layer_limit = store.limits().max_bytes;
    let what = || format!("image archive {}", path.display());
    let bad = |e: std::io::Error| ImageError::malformed(what(), e.to_string());
    let spool_error = |e: std::io::Error| ImageError::io("spooling an archive", e);
    let mut total: u64 = 0;
    let mut buf = vec![0u8; 1 << 16];
    for (number, entry) in archive.entries().map_err(bad)?.enumerate() {
        // Every entry counts, written or not: each costs a header's parse.
        if number as u64 >= max_entries {
            return Err(ImageError::TooLarge {
                what: what(),
                reason: format!("holds more than {max_entries} entries"),
            });
        }
        let mut entry = entry.map_err(bad)?;
        if !matches!(
            entry.header().entry_type(),
            tar::EntryType::Regular | tar::EntryType::Continuous
        ) {
            continue;
        }
        let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let Some(name) = clean(&name) else { continue };
        if entry.size() > layer_limit {
            return Err(ImageError::TooLarge {
                what: format!("{name} in {}", what()),
                reason: format!("past {layer_limit} bytes"),
            });
        }
        let target = spool_dir.join(number.to_string());
        let mut out = std::fs::File::create(&target).map_err(spool_error)?;
        loop {
            let n = entry.read(&mut buf).map_err(bad)?;
            if n == 0 {
                break;
            }
            total += n as u64;
            if total > max_bytes {
                return Err(ImageError::TooLarge {
                    what: what(),
                    reason: format!("its files decompress past {max_bytes} bytes"),
                });
            }
            if let Some(room) = &files.room {
                if !room.charge(n as u64) {
                    return Err(ImageError::TooLarge {
                        what: what(),
                        reason: format!(
                            "its files decompress past the room the image store's bound of \
                             {} bytes leaves",
                            room.limit()
                        ),
                    });
                }
            }
            out.write_all(&buf[..n]).map_err(spool_error)?;
        }
        out.flush().map_err(spool_error)?;
        files.spooled.insert(name, target);
    }
    Ok(files)
}

/// One image found in the input, ready to store.
struct Found {
    manifest: Manifest,
    manifest_bytes: Vec<u8>,
    config_bytes: Vec<u8>,
    /// The names of the layers' files in the layout or archive, in the manifest's order.
    layer_files: Vec<String>,
    /// Whether the layer files must match the manifest's digests (OCI), or the manifest was
    /// made here from them (`docker save`).
    names: Vec<String>,
}

pub(crate) fn import(store: &Store, path: &Path, tag: Option<&str>) -> Result<Vec<ImageInfo>> {
    let tag = tag.map(Reference::parse).transpose()?;
    let metadata = std::fs::metadata(path)
        .map_err(|e| ImageError::io(format!("reading {}", path.display()), e))?;
    let files = if metadata.is_dir() {
        Files::directory(path)?
    } else {
        spool(store, path)?
    };
    let found = if files.has("manifest.json")? {
        docker_save(&files)?
    } else if files.has("index.json")? {
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
        infos.push(store_image(store, &files, image, tag.as_ref())?);
    }
    Ok(infos)
}

fn store_image(
    store: &Store,
    files: &Files,
    image: Found,
    tag: Option<&Reference>,
) -> Result<ImageInfo> {
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
            // One open file is checked, then unpacked: never a name resolved twice.
            let mut reader = HashingReader::new(files.open(file)?);
            std::io::copy(&mut reader, &mut std::io::sink())
                .map_err(|e| ImageError::io("reading a layer", e))?;
            expected.check(&reader.hasher.finish(), format!("layer blob {expected}"))?;
            let mut blob = reader.inner;
            blob.seek(std::io::SeekFrom::Start(0))
                .map_err(|e| ImageError::io("reading a layer", e))?;
            store.unpack_reader(diff_id, blob)?;
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
    // Every count is checked before any file is hashed: a manifest listing one file a
    // million times must not hash it a million times.
    check_image_count(entries.len(), "docker save manifest.json")?;
    for entry in &entries {
        if entry.layers.len() > MAX_IMAGE_LAYERS {
            return Err(ImageError::TooLarge {
                what: "docker save manifest.json".into(),
                reason: format!(
                    "an image of {} layers (at most {MAX_IMAGE_LAYERS})",
                    entry.layers.len()
                ),
            });
        }
    }
    // Each layer file is described once, however many images or times name it.
    let mut described: HashMap<String, (Digest, u64, String)> = HashMap::new();
    let mut found = Vec::new();
    for entry in entries {
        let config_bytes = files.document(&entry.config)?;
        let mut layers = Vec::new();
        let mut layer_files = Vec::new();
        for layer in &entry.layers {
            let key = clean(layer).unwrap_or_else(|| layer.clone());
            let (digest, size, media_type) = match described.get(&key) {
                Some(description) => description.clone(),
                None => {
                    let description = describe_layer(files.open(layer)?)?;
                    described.insert(key, description.clone());
                    description
                }
            };
            layers.push(Descriptor {
                media_type,
                digest: digest.to_string(),
                size,
                platform: None,
                annotations: Default::default(),
            });
            layer_files.push(layer.clone());
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

/// Refuses an archive or layout of more than [`MAX_ARCHIVE_IMAGES`] images.
fn check_image_count(images: usize, what: &str) -> Result<()> {
    if images > MAX_ARCHIVE_IMAGES {
        return Err(ImageError::TooLarge {
            what: what.into(),
            reason: format!("it lists {images} images (at most {MAX_ARCHIVE_IMAGES})"),
        });
    }
    Ok(())
}

/// A layer file's digest, size and media type (by its first bytes).
fn describe_layer(file: std::fs::File) -> Result<(Digest, u64, String)> {
    let mut reader = HashingReader::new(file);
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
    check_image_count(index.manifests.len(), "OCI layout index.json")?;
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
            .map(|l| Ok(format!("blobs/sha256/{}", Digest::parse(&l.digest)?.hex())))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn store(root: &Path) -> Store {
        Store::open(root.join("store"), crate::StoreOptions::default()).unwrap()
    }

    fn archive(path: &Path, files: &[(&str, usize)]) {
        let mut builder = tar::Builder::new(Vec::new());
        for (name, size) in files {
            let mut header = tar::Header::new_gnu();
            header.set_size(*size as u64);
            header.set_mode(0o644);
            header.set_entry_type(tar::EntryType::Regular);
            builder
                .append_data(&mut header, name, &vec![7u8; *size][..])
                .unwrap();
        }
        std::fs::write(path, builder.into_inner().unwrap()).unwrap();
    }

    fn temp_root(what: &str) -> PathBuf {
        let root = std::env::temp_dir().join(format!(
            "sandcove-image-{what}-{}-{:08x}",
            std::process::id(),
            crate::unpack::random_u32()
        ));
        std::fs::create_dir_all(&root).unwrap();
        root
    }

    fn spool_is_empty(root: &Path) -> bool {
        std::fs::read_dir(root.join("store/tmp"))
            .unwrap()
            .next()
            .is_none()
    }

    #[test]
    fn the_spool_bounds_the_archive_s_total_bytes_and_entries_and_is_removed() {
        let root = temp_root("spool-bounds");
        let store = store(&root);
        let path = root.join("a.tar");
        archive(&path, &[("a", 600), ("b", 600), ("c", 1)]);
        // Each file is under the bound; together they pass it.
        let result = spool_bounded(&store, &path, 1000, 100).map(|_| ());
        assert!(
            matches!(&result, Err(ImageError::TooLarge { reason, .. }) if reason.contains("1000 bytes")),
            "{result:?}"
        );
        assert!(spool_is_empty(&root));
        let result = spool_bounded(&store, &path, 10_000, 2).map(|_| ());
        assert!(
            matches!(&result, Err(ImageError::TooLarge { reason, .. }) if reason.contains("2 entries")),
            "{result:?}"
        );
        assert!(spool_is_empty(&root));
        let files = spool_bounded(&store, &path, 1201, 3).unwrap();
        assert_eq!(files.spooled.len(), 3);
        drop(files);
        assert!(spool_is_empty(&root));
        let _ = std::fs::remove_dir_all(&root);
    }
}
