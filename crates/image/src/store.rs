//! The store: records on disk, the lock, and the operations of the public API.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use serde::{Deserialize, Serialize};

use crate::digest::Digest;
use crate::error::{ImageError, Result};
use crate::manifest::{self, Descriptor, Document, ImageConfigFile, Manifest};
use crate::reference::Reference;
use crate::registry::Client;
use crate::unpack::{self, LayerRecord, StoreRoom, UnpackLimits};
use crate::{
    Availability, ImageConfig, ImageDetails, ImageInfo, LayerDetails, LayerState, OwnerMap,
    PruneReport, PullProgress, ResolvedImage, StoreOptions,
};

/// How many layers a pull fetches at once.
const CONCURRENT_LAYERS: usize = 3;

/// An image store in a directory. Cheap to clone; every clone shares one state.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    dir: PathBuf,
    options: StoreOptions,
    /// Made at the first registry call: opening a store (every engine does) loads no TLS
    /// roots.
    client: std::sync::OnceLock<Client>,
    /// Layers being fetched in this process, by diff id: a second pull of one layer waits
    /// for the first instead of fetching it again.
    inflight: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// The room `max_store_bytes` leaves, charged by every layer unpack as it decompresses.
    room: Option<StoreRoom>,
}

/// One image (`images/<digest hex>.json`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct ImageRecord {
    pub(crate) digest: String,
    #[serde(default)]
    pub(crate) index_digest: Option<String>,
    /// `registry/repository` names it was stored under (for `name@digest` references).
    #[serde(default)]
    pub(crate) repositories: BTreeSet<String>,
    pub(crate) config_digest: String,
    pub(crate) platform: String,
    pub(crate) created: Option<String>,
    pub(crate) config: ImageConfig,
    pub(crate) layers: Vec<LayerRef>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct LayerRef {
    pub(crate) digest: String,
    pub(crate) diff_id: String,
    pub(crate) size: u64,
}

/// What a pull or import hands to [`Store::commit`]: documents to keep and the image.
pub(crate) struct Commit {
    pub(crate) blobs: Vec<Vec<u8>>,
    pub(crate) record: ImageRecord,
    pub(crate) tag: Option<String>,
}

/// Writes a file whole or not at all (a temporary file renamed over it), synced to the disk
/// before the rename.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    write_replacing(path, bytes, true)
}

/// [`write_atomically`], the data synced first only when `durable`: a file whose loss in a
/// crash costs nothing (what it records ends with the machine) skips the `fsync`, which is
/// most of a small write's time.
fn write_replacing(path: &Path, bytes: &[u8], durable: bool) -> Result<()> {
    let temp = path.with_file_name(format!(
        ".{}.{}-{:08x}",
        path.file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("record"),
        std::process::id(),
        unpack::random_u32()
    ));
    let write = || -> std::io::Result<()> {
        let mut file = std::fs::File::create(&temp)?;
        file.write_all(bytes)?;
        if durable {
            file.sync_all()?;
        }
        std::fs::rename(&temp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&temp);
        ImageError::io(format!("writing {}", path.display()), e)
    })
}

fn read_json<T: for<'de> Deserialize<'de> + Default>(path: &Path) -> Result<T> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
            ImageError::malformed(format!("store record {}", path.display()), e.to_string())
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(T::default()),
        Err(e) => Err(ImageError::io(format!("reading {}", path.display()), e)),
    }
}

fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    write_atomically(
        path,
        &serde_json::to_vec_pretty(value).expect("records serialise"),
    )
}

/// Whether a process left a temporary entry named `<prefix><…>-<pid>-<random>` behind:
/// it did when that process is gone.
fn abandoned(name: &str) -> bool {
    let mut parts = name.rsplit('-');
    let _random = parts.next();
    let Some(pid) = parts.next().and_then(|p| p.parse::<i32>().ok()) else {
        return true;
    };
    if pid == std::process::id() as i32 {
        return false;
    }
    // SAFETY: kill with signal 0 only checks whether the process exists.
    let alive = unsafe { libc::kill(pid, 0) } == 0
        || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    !alive
}

/// The lock of the store's records: an exclusive flock(2) on `<store>/lock`, held while the
/// guard lives. Each guard opens the file anew, so it excludes other threads of this
/// process as well as other processes.
struct LockGuard(#[allow(dead_code)] std::fs::File);

impl Store {
    /// Opens (creating if needed) the store in `dir`, mode 0700.
    pub fn open(dir: impl Into<PathBuf>, options: StoreOptions) -> Result<Store> {
        let dir = dir.into();
        if let OwnerMap::Shift { base, count } = options.owner {
            if count <= crate::OVERFLOW_ID || base.checked_add(count).is_none() {
                return Err(ImageError::malformed(
                    "store options",
                    format!(
                        "OwnerMap::Shift needs count > {} and base + count within u32",
                        crate::OVERFLOW_ID
                    ),
                ));
            }
        }
        std::fs::create_dir_all(&dir)
            .map_err(|e| ImageError::io(format!("creating {}", dir.display()), e))?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| ImageError::io(format!("making {} private", dir.display()), e))?;
        for sub in ["blobs/sha256", "layers", "images", "tmp"] {
            let path = dir.join(sub);
            std::fs::create_dir_all(&path)
                .map_err(|e| ImageError::io(format!("creating {}", path.display()), e))?;
        }
        let store = Store {
            inner: Arc::new(Inner {
                dir,
                room: options.max_store_bytes.map(StoreRoom::new),
                options,
                client: std::sync::OnceLock::new(),
                inflight: Mutex::new(HashMap::new()),
            }),
        };
        {
            let _lock = store.lock()?;
            store.remove_abandoned()?;
        }
        Ok(store)
    }

    /// The registry client, made on first use.
    fn client(&self) -> Result<&Client> {
        if let Some(client) = self.inner.client.get() {
            return Ok(client);
        }
        let client = Client::new(self.inner.options.registries.clone())?;
        Ok(self.inner.client.get_or_init(|| client))
    }

    fn lock(&self) -> Result<LockGuard> {
        let path = self.inner.dir.join("lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| ImageError::io(format!("opening {}", path.display()), e))?;
        rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| ImageError::io(format!("locking {}", path.display()), e.into()))?;
        Ok(LockGuard(file))
    }

    fn layers_dir(&self) -> PathBuf {
        self.inner.dir.join("layers")
    }

    fn blob_path(&self, digest: &Digest) -> PathBuf {
        self.inner.dir.join("blobs/sha256").join(digest.hex())
    }

    fn image_path(&self, digest: &Digest) -> PathBuf {
        self.inner
            .dir
            .join("images")
            .join(format!("{}.json", digest.hex()))
    }

    pub(crate) fn temp_path(&self, what: &str) -> PathBuf {
        self.inner.dir.join("tmp").join(format!(
            "{what}-{}-{:08x}",
            std::process::id(),
            unpack::random_u32()
        ))
    }

    /// A fresh path in the store's temporary directory, for an archive received from
    /// elsewhere (a network upload) before [`Store::import`] reads it. The caller removes it;
    /// one left behind by a process that ended is removed when the store is next opened.
    pub fn staging_path(&self) -> PathBuf {
        self.temp_path("received")
    }

    /// The bound on the store's size ([`StoreOptions::max_store_bytes`]), if it has one.
    pub fn max_store_bytes(&self) -> Option<u64> {
        self.inner.options.max_store_bytes
    }

    /// The bytes the store's bound leaves (its bound less its size, counting archives being
    /// received or spooled), if it has a bound: what an archive received from elsewhere may
    /// take before [`Store::import`] reads it. Blocking (it measures the store).
    pub fn room_left(&self) -> Option<u64> {
        self.inner
            .options
            .max_store_bytes
            .map(|limit| limit.saturating_sub(self.usage()))
    }

    /// A place in the store's room ([`StoreRoom`]) where it has a bound, for bytes about to
    /// be written into it: charged by the caller, left when dropped.
    pub(crate) fn enter_room(&self) -> Option<unpack::RoomEntry<'_>> {
        self.inner
            .room
            .as_ref()
            .map(|room| room.enter(|| self.usage()))
    }

    pub(crate) fn limits(&self) -> UnpackLimits {
        UnpackLimits {
            max_bytes: self.inner.options.max_layer_bytes,
            max_entries: self.inner.options.max_layer_entries,
            owner: self.inner.options.owner,
        }
    }

    /// Temporary entries of processes that are gone: partial layers and downloads.
    fn remove_abandoned(&self) -> Result<()> {
        for (dir, prefix) in [
            (self.layers_dir(), ".partial-"),
            (self.inner.dir.join("tmp"), ""),
        ] {
            let entries = std::fs::read_dir(&dir)
                .map_err(|e| ImageError::io(format!("listing {}", dir.display()), e))?;
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with(prefix) && abandoned(&name) {
                    let _ = unpack::remove_path(&entry.path());
                }
            }
        }
        Ok(())
    }

    fn tags(&self) -> Result<BTreeMap<String, String>> {
        read_json(&self.inner.dir.join("tags.json"))
    }

    /// Every hold: the durable ones (`holds.json`) and the live sandboxes' (see
    /// [`Store::hold_transient`]).
    fn holds(&self) -> Result<BTreeMap<String, String>> {
        let mut holds = self.durable_holds()?;
        holds.extend(self.transient_holds());
        Ok(holds)
    }

    fn durable_holds(&self) -> Result<BTreeMap<String, String>> {
        read_json(&self.inner.dir.join("holds.json"))
    }

    /// The transient holds; a file a crash left torn holds none (its holders ended with the
    /// machine).
    fn transient_holds(&self) -> BTreeMap<String, String> {
        read_json(&self.transient_holds_path()).unwrap_or_default()
    }

    fn transient_holds_path(&self) -> PathBuf {
        self.inner.dir.join("transient-holds.json")
    }

    fn image(&self, digest: &Digest) -> Result<Option<ImageRecord>> {
        match std::fs::read(self.image_path(digest)) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| ImageError::malformed("image record", e.to_string())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(ImageError::io("reading an image record", e)),
        }
    }

    fn images(&self) -> Result<Vec<ImageRecord>> {
        let dir = self.inner.dir.join("images");
        let mut images = Vec::new();
        for entry in std::fs::read_dir(&dir)
            .map_err(|e| ImageError::io(format!("listing {}", dir.display()), e))?
            .flatten()
        {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(hex) = name
                .strip_suffix(".json")
                .filter(|_| !name.starts_with('.'))
            {
                if let Ok(digest) = Digest::parse(&format!("sha256:{hex}")) {
                    if let Some(record) = self.image(&digest)? {
                        images.push(record);
                    }
                }
            }
        }
        images.sort_by(|a, b| a.digest.cmp(&b.digest));
        Ok(images)
    }

    /// The image a reference names in the store: a tag, `name@sha256:…`, or a bare `sha256:…`.
    fn find(&self, reference: &str) -> Result<(String, ImageRecord)> {
        let not_found = || ImageError::NotFound {
            reference: reference.to_string(),
        };
        if reference.starts_with("sha256:") {
            let digest = Digest::parse(reference).map_err(|_| ImageError::InvalidReference {
                reference: reference.into(),
                reason: "not sha256:<64 hex>".into(),
            })?;
            return self
                .by_digest(&digest)?
                .map(|r| (reference.to_string(), r))
                .ok_or_else(not_found);
        }
        let parsed = Reference::parse(reference)?;
        if let Some(digest) = &parsed.digest {
            let record = self.by_digest(digest)?.ok_or_else(not_found)?;
            let key = format!("{}@{digest}", parsed.name());
            let name = if self.tags()?.contains_key(&key) {
                key
            } else {
                parsed.full()
            };
            return Ok((name, record));
        }
        let key = parsed.tagged().ok_or_else(not_found)?;
        let digest = self.tags()?.get(&key).cloned().ok_or_else(not_found)?;
        let record = self
            .image(&Digest::parse(&digest)?)?
            .ok_or_else(not_found)?;
        Ok((key, record))
    }

    fn by_digest(&self, digest: &Digest) -> Result<Option<ImageRecord>> {
        if let Some(record) = self.image(digest)? {
            return Ok(Some(record));
        }
        Ok(self
            .images()?
            .into_iter()
            .find(|r| r.index_digest.as_deref() == Some(digest.as_str())))
    }

    fn info(&self, record: &ImageRecord, tags: &BTreeMap<String, String>) -> ImageInfo {
        let layers = self.layers_dir();
        let size = record
            .layers
            .iter()
            .filter_map(|l| Digest::parse(&l.diff_id).ok())
            .filter_map(|d| unpack::read_record(&layers, &d).ok().flatten())
            .map(|r| r.unpacked_bytes)
            .sum();
        ImageInfo {
            references: tags
                .iter()
                .filter(|(_, d)| **d == record.digest)
                .map(|(t, _)| t.clone())
                .collect(),
            digest: record.digest.clone(),
            size,
            created: record.created.clone(),
        }
    }

    /// The image a reference names, with its layer directories; [`ImageError::NotFound`] if it
    /// is not in the store (this never pulls).
    pub fn resolve(&self, reference: &str) -> Result<ResolvedImage> {
        let (name, record) = self.find(reference)?;
        let mut layers = Vec::with_capacity(record.layers.len());
        for layer in &record.layers {
            let path = self.layers_dir().join(Digest::parse(&layer.diff_id)?.hex());
            if !path.is_dir() {
                return Err(ImageError::NotFound {
                    reference: format!(
                        "{reference} (its layer {} was removed; pull it again)",
                        layer.diff_id
                    ),
                });
            }
            layers.push(path);
        }
        Ok(ResolvedImage {
            reference: name,
            digest: record.digest,
            layers,
            config: record.config,
        })
    }

    /// Whether an image is in the store, could be pulled, or neither; never pulls.
    pub async fn check(&self, reference: &str) -> Availability {
        let local = reference.to_string();
        if self
            .blocking(move |store| store.resolve(&local))
            .await
            .is_ok()
        {
            return Availability::Available;
        }
        let Ok(parsed) = Reference::parse(reference) else {
            return Availability::Unknown;
        };
        let Ok(client) = self.client() else {
            return Availability::Unknown;
        };
        if client.has_manifest(&parsed).await {
            Availability::Pullable
        } else {
            Availability::Unknown
        }
    }

    /// Every image in the store.
    pub fn list(&self) -> Result<Vec<ImageInfo>> {
        let tags = self.tags()?;
        Ok(self.images()?.iter().map(|r| self.info(r, &tags)).collect())
    }

    /// Everything the store knows of one image.
    pub fn inspect(&self, reference: &str) -> Result<ImageDetails> {
        let (_, record) = self.find(reference)?;
        let tags = self.tags()?;
        let layers_dir = self.layers_dir();
        let mut layers = Vec::new();
        for layer in &record.layers {
            let layer_record = unpack::read_record(&layers_dir, &Digest::parse(&layer.diff_id)?)?;
            let (unpacked_size, entries, skipped) = layer_record
                .map(|r| (r.unpacked_bytes, r.entries, r.skipped))
                .unwrap_or_default();
            layers.push(LayerDetails {
                digest: layer.digest.clone(),
                diff_id: layer.diff_id.clone(),
                compressed_size: layer.size,
                unpacked_size,
                entries,
                skipped,
            });
        }
        Ok(ImageDetails {
            info: self.info(&record, &tags),
            index_digest: record.index_digest.clone(),
            config_digest: record.config_digest.clone(),
            platform: record.platform.clone(),
            config: record.config.clone(),
            skipped_entries: layers.iter().map(|l| l.skipped.len()).sum(),
            layers,
        })
    }

    /// Removes a tag, and the image when no tag is left and no sandbox holds it; a digest
    /// removes the image and all its tags ([`ImageError::InUse`] while held). Layers stay
    /// until [`Store::prune`].
    pub fn remove(&self, reference: &str) -> Result<()> {
        let _lock = self.lock()?;
        let (name, record) = self.find(reference)?;
        let mut tags = self.tags()?;
        let holds = self.holds()?;
        let holders: Vec<String> = holds
            .iter()
            .filter(|(_, d)| **d == record.digest)
            .map(|(h, _)| h.clone())
            .collect();
        let by_tag = tags.get(&name).is_some_and(|d| *d == record.digest);
        if by_tag {
            tags.remove(&name);
            write_json(&self.inner.dir.join("tags.json"), &tags)?;
            if holders.is_empty() && !tags.values().any(|d| *d == record.digest) {
                self.remove_image(&record)?;
            }
            return Ok(());
        }
        if !holders.is_empty() {
            return Err(ImageError::InUse {
                digest: record.digest,
                holders,
            });
        }
        tags.retain(|_, d| *d != record.digest);
        write_json(&self.inner.dir.join("tags.json"), &tags)?;
        self.remove_image(&record)
    }

    fn remove_image(&self, record: &ImageRecord) -> Result<()> {
        match std::fs::remove_file(self.image_path(&Digest::parse(&record.digest)?)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(ImageError::io("removing an image record", e)),
        }
    }

    /// Removes untagged images no sandbox holds, then every layer and blob no image left uses
    /// (and what crashed processes left behind).
    pub fn prune(&self) -> Result<PruneReport> {
        let _lock = self.lock()?;
        let tags = self.tags()?;
        let holds = self.holds()?;
        let mut report = PruneReport::default();
        let mut kept = Vec::new();
        for record in self.images()? {
            let used = tags.values().any(|d| *d == record.digest)
                || holds.values().any(|d| *d == record.digest);
            if used {
                kept.push(record);
            } else {
                self.remove_image(&record)?;
                report.images.push(record.digest);
            }
        }
        let used_layers: BTreeSet<String> = kept
            .iter()
            .flat_map(|r| {
                r.layers
                    .iter()
                    .filter_map(|l| Digest::parse(&l.diff_id).ok())
                    .map(|d| d.hex().to_string())
            })
            .collect();
        let layers_dir = self.layers_dir();
        for entry in std::fs::read_dir(&layers_dir)
            .map_err(|e| ImageError::io("listing layers", e))?
            .flatten()
        {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            let hex = name.strip_suffix(".json").unwrap_or(&name).to_string();
            if used_layers.contains(&hex) {
                continue;
            }
            if entry.path().is_dir() {
                if let Ok(digest) = Digest::parse(&format!("sha256:{hex}")) {
                    if let Ok(Some(record)) = unpack::read_record(&layers_dir, &digest) {
                        report.bytes += record.unpacked_bytes;
                    }
                    report.layers.push(digest.to_string());
                }
                unpack::remove_path(&entry.path()).map_err(|e| {
                    ImageError::io(format!("removing {}", entry.path().display()), e)
                })?;
            }
        }
        // Layer records whose directories are gone.
        for entry in std::fs::read_dir(&layers_dir)
            .map_err(|e| ImageError::io("listing layers", e))?
            .flatten()
        {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(hex) = name.strip_suffix(".json") {
                if !name.starts_with('.') && !layers_dir.join(hex).is_dir() {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
        let used_blobs: BTreeSet<String> = kept
            .iter()
            .flat_map(|r| {
                [
                    Some(r.digest.clone()),
                    Some(r.config_digest.clone()),
                    r.index_digest.clone(),
                ]
            })
            .flatten()
            .filter_map(|d| Digest::parse(&d).ok().map(|d| d.hex().to_string()))
            .collect();
        let blobs = self.inner.dir.join("blobs/sha256");
        for entry in std::fs::read_dir(&blobs)
            .map_err(|e| ImageError::io("listing blobs", e))?
            .flatten()
        {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !used_blobs.contains(&name) {
                report.bytes += entry.metadata().map(|m| m.len()).unwrap_or(0);
                let _ = std::fs::remove_file(entry.path());
            }
        }
        self.remove_abandoned()?;
        Ok(report)
    }

    /// Marks an image (by digest, or any reference to it) as used by `holder`: `remove` and
    /// `prune` keep it until [`Store::release`]. A holder holds one image.
    pub fn hold(&self, digest: &str, holder: &str) -> Result<()> {
        let _lock = self.lock()?;
        let (_, record) = self.find(digest)?;
        let mut holds = self.durable_holds()?;
        holds.insert(holder.to_string(), record.digest);
        write_json(&self.inner.dir.join("holds.json"), &holds)
    }

    /// [`Store::hold`] for a holder that cannot outlive the machine (a running sandbox): kept
    /// as every hold is by `remove` and `prune`, but written without waiting for the disk, so
    /// a create does not pay an `fsync` for it. A crash may lose it, and with it nothing: its
    /// holder is gone too.
    pub fn hold_transient(&self, digest: &str, holder: &str) -> Result<()> {
        let _lock = self.lock()?;
        let (_, record) = self.find(digest)?;
        let mut holds = self.transient_holds();
        holds.insert(holder.to_string(), record.digest);
        write_replacing(
            &self.transient_holds_path(),
            &serde_json::to_vec(&holds).expect("records serialise"),
            false,
        )
    }

    /// The holders with a hold, and the digest each holds.
    pub fn holds_by_holder(&self) -> Result<BTreeMap<String, String>> {
        let _lock = self.lock()?;
        self.holds()
    }

    /// Ends `holder`'s hold (a no-op if it holds nothing).
    pub fn release(&self, holder: &str) -> Result<()> {
        let _lock = self.lock()?;
        let mut transient = self.transient_holds();
        if transient.remove(holder).is_some() {
            write_replacing(
                &self.transient_holds_path(),
                &serde_json::to_vec(&transient).expect("records serialise"),
                false,
            )?;
        }
        let mut holds = self.durable_holds()?;
        if holds.remove(holder).is_some() {
            write_json(&self.inner.dir.join("holds.json"), &holds)?;
        }
        Ok(())
    }

    /// The store's size as its records count it: unpacked layers and blobs, and the archives
    /// being received ([`Store::staging_path`]) or spooled by an import, which take room
    /// as surely while they last.
    fn usage(&self) -> u64 {
        let layers_dir = self.layers_dir();
        let mut total = 0;
        if let Ok(entries) = std::fs::read_dir(&layers_dir) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if let Some(hex) = name.strip_suffix(".json") {
                    if let Ok(Some(record)) = Digest::parse(&format!("sha256:{hex}"))
                        .and_then(|d| unpack::read_record(&layers_dir, &d))
                    {
                        total += record.unpacked_bytes;
                    }
                }
            }
        }
        if let Ok(entries) = std::fs::read_dir(self.inner.dir.join("blobs/sha256")) {
            total += entries
                .flatten()
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum::<u64>();
        }
        total + self.transient_usage()
    }

    /// The bytes of the staged uploads (`tmp/received-*`) and import spools (`tmp/import-*`,
    /// a directory of files).
    fn transient_usage(&self) -> u64 {
        let Ok(entries) = std::fs::read_dir(self.inner.dir.join("tmp")) else {
            return 0;
        };
        let mut total = 0;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Ok(metadata) = entry.metadata() else {
                continue;
            };
            if name.starts_with("received-") && metadata.is_file() {
                total += metadata.len();
            } else if name.starts_with("import-") && metadata.is_dir() {
                if let Ok(spooled) = std::fs::read_dir(entry.path()) {
                    total += spooled
                        .flatten()
                        .filter_map(|e| e.metadata().ok())
                        .filter(|m| m.is_file())
                        .map(|m| m.len())
                        .sum::<u64>();
                }
            }
        }
        total
    }

    /// Refuses a pull or import whose new layers would take the store past its bound.
    pub(crate) fn check_room(&self, incoming: u64) -> Result<()> {
        if let Some(limit) = self.inner.options.max_store_bytes {
            let used = self.usage();
            if used.saturating_add(incoming) > limit {
                return Err(ImageError::TooLarge {
                    what: "the image store".into(),
                    reason: format!("{used} bytes used + {incoming} bytes to add would pass its bound of {limit}"),
                });
            }
        }
        Ok(())
    }

    pub(crate) fn has_layer(&self, diff_id: &Digest) -> bool {
        self.layers_dir().join(diff_id.hex()).is_dir()
    }

    /// Unpacks a layer blob from a file (blocking: call from a blocking thread).
    pub(crate) fn unpack_file(&self, diff_id: &Digest, blob: &Path) -> Result<LayerRecord> {
        let file = std::fs::File::open(blob)
            .map_err(|e| ImageError::io(format!("opening {}", blob.display()), e))?;
        self.unpack_reader(diff_id, file)
    }

    /// Unpacks a layer blob read from `blob` (blocking). Its decompressed bytes are bounded by
    /// the layer bound and by the room the store's bound has left, whichever is smaller: a
    /// layer decompressing past either is [`ImageError::TooLarge`], with nothing of it kept.
    pub(crate) fn unpack_reader(
        &self,
        diff_id: &Digest,
        blob: impl std::io::Read,
    ) -> Result<LayerRecord> {
        let room = self.enter_room();
        unpack::unpack_layer(
            &self.layers_dir(),
            diff_id,
            std::io::BufReader::with_capacity(1 << 16, blob),
            &self.limits(),
            room.as_ref(),
        )
    }

    /// The in-process lock of one layer's fetch.
    fn inflight(&self, diff_id: &Digest) -> Arc<tokio::sync::Mutex<()>> {
        let mut map = self.inner.inflight.lock().expect("inflight map");
        map.retain(|_, lock| Arc::strong_count(lock) > 1);
        map.entry(diff_id.to_string()).or_default().clone()
    }

    /// Records an image (blocking): under the lock, if every layer is still in place (a
    /// concurrent prune may have removed one); otherwise returns the missing diff ids.
    pub(crate) fn commit(&self, commit: &Commit) -> Result<Vec<Digest>> {
        let _lock = self.lock()?;
        let missing: Vec<Digest> = commit
            .record
            .layers
            .iter()
            .filter_map(|l| Digest::parse(&l.diff_id).ok())
            .filter(|d| !self.has_layer(d))
            .collect();
        if !missing.is_empty() {
            return Ok(missing);
        }
        for blob in &commit.blobs {
            let path = self.blob_path(&Digest::of(blob));
            if !path.exists() {
                write_atomically(&path, blob)?;
            }
        }
        let digest = Digest::parse(&commit.record.digest)?;
        let mut record = commit.record.clone();
        if let Some(existing) = self.image(&digest)? {
            record.repositories.extend(existing.repositories);
            record.index_digest = record.index_digest.or(existing.index_digest);
        }
        write_json(&self.image_path(&digest), &record)?;
        if let Some(tag) = &commit.tag {
            let mut tags = self.tags()?;
            tags.insert(tag.clone(), record.digest.clone());
            write_json(&self.inner.dir.join("tags.json"), &tags)?;
        }
        Ok(Vec::new())
    }

    pub(crate) fn info_of(&self, digest: &str) -> Result<ImageInfo> {
        let record = self
            .image(&Digest::parse(digest)?)?
            .ok_or_else(|| ImageError::NotFound {
                reference: digest.into(),
            })?;
        Ok(self.info(&record, &self.tags()?))
    }

    /// Pulls an image from its registry (or a mirror), with progress per layer. Layers
    /// already in the store are not fetched again; at most three are fetched at once.
    pub async fn pull(
        &self,
        reference: &str,
        progress: &(dyn Fn(PullProgress) + Send + Sync),
    ) -> Result<crate::ImageInfo> {
        let parsed = Reference::parse(reference)?;
        let client = self.client()?;
        let (bytes, content_type, digest) =
            client.manifest(&parsed, &parsed.manifest_key()).await?;
        let mut blobs = Vec::new();
        let (manifest_bytes, manifest_digest, index_digest) =
            match manifest::parse_document(&bytes, content_type.as_deref())? {
                Document::Manifest(_) => (bytes, digest, None),
                Document::Index(index) => {
                    let chosen = manifest::select_platform(&index)?;
                    let (chosen_bytes, _, chosen_digest) =
                        client.manifest(&parsed, &chosen.digest).await?;
                    blobs.push(bytes);
                    (chosen_bytes, chosen_digest, Some(digest))
                }
            };
        let Document::Manifest(manifest) = manifest::parse_document(&manifest_bytes, None)? else {
            return Err(ImageError::malformed(
                "image manifest",
                "an index where a manifest was expected",
            ));
        };
        let config_bytes = client.small_blob(&parsed, &manifest.config).await?;
        let (config, diff_ids) = manifest::parse_config(&config_bytes, manifest.layers.len())?;
        let record = image_record(
            &manifest_digest,
            index_digest.as_ref(),
            &parsed.name(),
            &manifest,
            &config,
            &diff_ids,
        );
        blobs.push(manifest_bytes);
        blobs.push(config_bytes);
        let commit = Arc::new(Commit {
            blobs,
            record,
            // Pulled by digest alone: the `name@digest` reference keeps it, as a tag would.
            tag: parsed.tagged().or_else(|| {
                parsed
                    .digest
                    .as_ref()
                    .map(|d| format!("{}@{d}", parsed.name()))
            }),
        });

        let sizes: Vec<(Digest, u64)> = diff_ids
            .iter()
            .cloned()
            .zip(manifest.layers.iter().map(|l| l.size))
            .collect();
        self.blocking(move |store| {
            let missing = sizes
                .iter()
                .filter(|(d, _)| !store.has_layer(d))
                .map(|(_, size)| size)
                .sum();
            store.check_room(missing)
        })
        .await?;
        let count = manifest.layers.len();
        for (index, layer) in manifest.layers.iter().enumerate() {
            progress(PullProgress {
                layer: layer.digest.clone(),
                index,
                layers: count,
                state: LayerState::Waiting,
                done: 0,
                total: layer.size,
            });
        }
        let mut wanted: Vec<usize> = (0..count).collect();
        for _ in 0..3 {
            let results: Vec<Result<()>> = futures::stream::iter(wanted.iter().copied())
                .map(|index| {
                    self.fetch_layer(
                        &parsed,
                        &manifest.layers[index],
                        &diff_ids[index],
                        index,
                        count,
                        progress,
                    )
                })
                .buffer_unordered(CONCURRENT_LAYERS)
                .collect()
                .await;
            results.into_iter().collect::<Result<Vec<()>>>()?;
            let (store, pending) = (self.clone(), commit.clone());
            let missing = tokio::task::spawn_blocking(move || {
                let missing = store.commit(&pending)?;
                Ok::<_, ImageError>((
                    missing
                        .is_empty()
                        .then(|| store.info_of(&pending.record.digest)),
                    missing,
                ))
            })
            .await
            .map_err(|e| {
                ImageError::io("recording the image", std::io::Error::other(e.to_string()))
            })??;
            let missing = match missing {
                (Some(info), _) => return info,
                (None, missing) => missing,
            };
            wanted = (0..count)
                .filter(|i| missing.contains(&diff_ids[*i]))
                .collect();
        }
        Err(ImageError::Registry {
            registry: parsed.registry,
            reason: "layers kept being pruned while the image was pulled".into(),
        })
    }

    async fn fetch_layer(
        &self,
        reference: &Reference,
        layer: &Descriptor,
        diff_id: &Digest,
        index: usize,
        count: usize,
        progress: &(dyn Fn(PullProgress) + Send + Sync),
    ) -> Result<()> {
        let report = |state, done| {
            progress(PullProgress {
                layer: layer.digest.clone(),
                index,
                layers: count,
                state,
                done,
                total: layer.size,
            })
        };
        let lock = self.inflight(diff_id);
        let _guard = lock.lock().await;
        let wanted = diff_id.clone();
        if self
            .blocking(move |store| Ok(store.has_layer(&wanted)))
            .await?
        {
            report(LayerState::Cached, layer.size);
            return Ok(());
        }
        let temp = self.temp_path("blob");
        let result = async {
            self.client()?
                .download(reference, layer, &temp, &|done| {
                    report(LayerState::Downloading, done)
                })
                .await?;
            report(LayerState::Unpacking, layer.size);
            let store = self.clone();
            let (diff_id, blob) = (diff_id.clone(), temp.clone());
            tokio::task::spawn_blocking(move || store.unpack_file(&diff_id, &blob))
                .await
                .map_err(|e| {
                    ImageError::io("unpacking a layer", std::io::Error::other(e.to_string()))
                })??;
            Ok(())
        }
        .await;
        let _ = tokio::fs::remove_file(&temp).await;
        result?;
        report(LayerState::Done, layer.size);
        Ok(())
    }

    /// Runs store work that makes syscalls on a blocking thread, off the event loop.
    async fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Store) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let store = self.clone();
        tokio::task::spawn_blocking(move || work(&store))
            .await
            .map_err(|e| {
                ImageError::io(
                    "a blocking task of the store",
                    std::io::Error::other(e.to_string()),
                )
            })?
    }

    /// Imports images from an OCI layout directory, an `oci-archive` tar or a `docker save`
    /// tar (gzip or zstd compressed or not); `tag` names the image when the archive holds
    /// exactly one (and replaces the names it carries).
    pub async fn import(&self, path: &Path, tag: Option<&str>) -> Result<Vec<ImageInfo>> {
        let store = self.clone();
        let (path, tag) = (path.to_path_buf(), tag.map(str::to_string));
        tokio::task::spawn_blocking(move || crate::import::import(&store, &path, tag.as_deref()))
            .await
            .map_err(|e| ImageError::io("importing", std::io::Error::other(e.to_string())))?
    }
}

/// The image record of a manifest and its config.
pub(crate) fn image_record(
    digest: &Digest,
    index_digest: Option<&Digest>,
    repository: &str,
    manifest: &Manifest,
    config: &ImageConfigFile,
    diff_ids: &[Digest],
) -> ImageRecord {
    let run = config.config.clone().unwrap_or_default();
    ImageRecord {
        digest: digest.to_string(),
        index_digest: index_digest.map(|d| d.to_string()),
        repositories: [repository.to_string()]
            .into_iter()
            .filter(|r| !r.is_empty())
            .collect(),
        config_digest: manifest.config.digest.clone(),
        platform: format!(
            "{}/{}",
            if config.os.is_empty() {
                "linux"
            } else {
                &config.os
            },
            config.architecture
        ),
        created: config.created.clone(),
        config: ImageConfig {
            env: run.env.unwrap_or_default(),
            working_dir: run.working_dir.filter(|w| !w.is_empty()),
            user: run.user.filter(|u| !u.is_empty()),
            entrypoint: run.entrypoint.unwrap_or_default(),
            cmd: run.cmd.unwrap_or_default(),
        },
        layers: manifest
            .layers
            .iter()
            .zip(diff_ids)
            .map(|(l, d)| LayerRef {
                digest: l.digest.clone(),
                diff_id: d.to_string(),
                size: l.size,
            })
            .collect(),
    }
}
