//! Images as sandbox roots.
//!
//! A sandbox created with a template other than the host base ([`is_host_base`]) runs an
//! image: the engine asks its [`ImageSource`] for the image's unpacked layers and mounts them
//! read-only, lowest first, under a writable layer of the sandbox's own (overlayfs, mounted by
//! the agent inside the sandbox's user and mount namespaces with `userxattr`; the writable
//! layer lies on the sandbox's root tmpfs, so the disk limit bounds it). The engine then shapes
//! the merged root as it shapes the host base: `/proc`, `/dev`, `/tmp`, the workspace, the
//! users' homes, and its own `/etc/hostname`, `/etc/hosts` and `/etc/resolv.conf`, with the
//! sandbox's users added to the image's `/etc/passwd` and `/etc/group`. Every one of those
//! steps reaches the image's paths beneath the root's descriptor with no symlinks followed:
//! an image's contents are untrusted, and until the agent pivots into the root the host's
//! tree is what an absolute symlink would name.
//!
//! The sandbox's default user is the create's `user`, else the one the image's `User` names
//! ([`ImageRoot::default_user`]), else the engine's. (An image create is never served by the
//! warm pool, whose members run the host base, so this is decided by the cold create only.)
//!
//! The layer directories are in overlayfs's own format (whiteouts as 0:0 character devices,
//! opaque directories marked `user.overlay.opaque`), as the image store unpacks them.
//!
//! Where overlayfs cannot be mounted (or the operator chose so, [`IMAGE_ROOT_ENV`]), the
//! agent copies the layers into a directory of the root tmpfs instead ([`ImageRootMode`]):
//! the same root, bounded by the sandbox's disk; its snapshots hold the whole root, an OCI
//! layer tar whose first entry marks its root opaque, and a sandbox made from one runs that
//! root as it is (under overlayfs or not).
//!
//! A snapshot of an image sandbox is its writable layer as an OCI layer tar, written by the
//! agent (never by a program of the image), and the image's reference and digest; a sandbox
//! made from it runs that image with the archive unpacked, as hostile input, into its own
//! writable layer (see the engine's `snapshots` module).
//!
//! [`is_host_base`]: sandcove_core::capability::is_host_base

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use sandcove_core::{Error, Result};
use sandcove_image::{ImageError, OwnerMap, Store, StoreOptions};

/// Where the engine finds images: the image store, or a test's own layers. Which images are in
/// use is the engine's to say ([`LocalBackend::images_in_use`]), from the records of its live
/// sandboxes and the metadata of its snapshots, so a sandbox that ends without its client (at
/// its lease, in its monitor) never leaves a stale claim behind. An image sandbox's snapshot
/// holds its image under the snapshot's id ([`ImageSource::hold`]) until it is deleted.
///
/// [`LocalBackend::images_in_use`]: crate::LocalBackend::images_in_use
pub trait ImageSource: Send + Sync + std::fmt::Debug {
    /// The image `reference` names, unpacked, or [`Error::NotFound`] when it is not stored
    /// here (the engine never pulls on its own).
    ///
    /// [`Error::NotFound`]: sandcove_core::Error::NotFound
    fn resolve(&self, reference: &str) -> Result<ImageRoot>;

    /// The references of the images stored here (as [`ImageSource::resolve`] takes them),
    /// which the engine's capabilities list as templates.
    fn references(&self) -> Vec<String>;

    /// Keep `digest`'s image while the sandbox `holder` may use it (its remove and prune
    /// leave it). Called before the sandbox starts, once its staging directory exists (so a
    /// prune never takes it for a sandbox that is gone); the default keeps nothing.
    fn hold(&self, digest: &str, holder: &str) -> Result<()> {
        let _ = (digest, holder);
        Ok(())
    }

    /// [`ImageSource::hold`] for a sandbox, whose hold cannot outlive the machine (a store
    /// may keep it without waiting for the disk). The default is [`ImageSource::hold`].
    fn hold_for_sandbox(&self, digest: &str, holder: &str) -> Result<()> {
        self.hold(digest, holder)
    }

    /// The sandbox `holder` no longer uses its image (destroyed). The default does nothing.
    fn release(&self, holder: &str) {
        let _ = holder;
    }
}

/// One image, unpacked: what a sandbox's root is made of, kept in its record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageRoot {
    /// The reference the sandbox was created with, as given.
    pub reference: String,
    /// The image's manifest digest (`sha256:…`).
    pub digest: String,
    /// The unpacked layer directories on the host, lowest first.
    pub layers: Vec<PathBuf>,
    /// The image's environment (`NAME=value`), under the sandbox's own envs.
    #[serde(default)]
    pub env: Vec<String>,
    /// The image's working directory: where processes start when the call names none.
    #[serde(default)]
    pub working_dir: Option<String>,
    /// The image's `User` (`name`, `uid`, either with `:group`): the sandbox's default user
    /// when the create names none (see [`ImageRoot::default_user`]).
    #[serde(default)]
    pub user: Option<String>,
    /// The image's entrypoint and command, recorded for the facades; never run implicitly.
    #[serde(default)]
    pub entrypoint: Vec<String>,
    /// See [`ImageRoot::entrypoint`].
    #[serde(default)]
    pub cmd: Vec<String>,
}

impl ImageRoot {
    /// The image's environment as name/value pairs (entries without `=` are skipped, as a
    /// runtime would).
    pub fn env_pairs(&self) -> impl Iterator<Item = (&str, &str)> {
        self.env.iter().filter_map(|kv| kv.split_once('='))
    }

    /// The name of the sandbox's default user as the image's `User` decides it, for a create
    /// that names no `user` (a create's own `user` always wins):
    /// - `root` or uid `0` (any `:group`): root;
    /// - a name: the default user takes that name (its uid stays the engine's default user's,
    ///   and the image's `/etc/passwd` line of that name gives way to the sandbox's);
    /// - a non-zero uid, or no `User`: `None`, the engine's default user.
    ///
    /// The group part is not applied (a sandbox user's group is its own). A name the create's
    /// `user` could not be either is `InvalidArgument`, saying to name a user at create.
    pub fn default_user(&self) -> Result<Option<String>> {
        let Some(user) = self.user.as_deref() else {
            return Ok(None);
        };
        let name = user.split(':').next().unwrap_or_default().trim();
        if name.is_empty() {
            return Ok(None);
        }
        if name == "root" {
            return Ok(Some("root".into()));
        }
        if name.bytes().all(|b| b.is_ascii_digit()) {
            // A uid has no name to give the default user; 0 is root whatever it is called.
            return Ok(name.bytes().all(|b| b == b'0').then(|| "root".to_string()));
        }
        let valid = name.len() <= 32
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
        if !valid {
            return Err(Error::invalid(format!(
                "image {}'s User {user:?} is not a user name a sandbox can have (1-32 \
                 letters, digits, '-', '_' or '.'): name the sandbox's user at create",
                self.reference
            )));
        }
        Ok(Some(name.to_string()))
    }
}

/// How an image sandbox's root is composed from the image's layers.
///
/// The engine does not probe ahead: under [`ImageRootMode::Auto`] each create's agent tries
/// overlayfs (one mount call, cheap where it fails) and copies the layers where the mount is
/// refused, so a host whose kernel gains or loses overlayfs in user namespaces needs no
/// restart. [`ImageRootMode::host_default`] says which of the two this host is expected to
/// use (the capabilities' and `sandcove doctor`'s answer; [`probe`] tells for sure).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ImageRootMode {
    /// overlayfs where the sandbox's namespaces can mount it, else a copy.
    #[default]
    Auto,
    /// overlayfs only: where it cannot be mounted, the create fails (`Unavailable`).
    Overlay,
    /// The layers copied, lowest first, into a directory on the sandbox's root tmpfs (so the
    /// disk limit bounds the image as it bounds what the sandbox writes): whiteouts delete,
    /// opaque directories clear, files, directories and symlinks are copied with their modes
    /// and owners (hard links within a layer become copies). Creates are slower and each
    /// sandbox's disk holds the whole image; an image larger than the disk is
    /// `InvalidArgument`, naming the disk size. A snapshot of such a sandbox holds its whole
    /// root (not only what it changed), and a sandbox made from it runs that root as a copy.
    Copy,
}

/// The environment variable choosing how image roots are composed: `overlay`, `copy`, or
/// `auto` (unset: auto). See [`ImageRootMode`].
pub const IMAGE_ROOT_ENV: &str = "SANDCOVE_IMAGE_ROOT";

impl ImageRootMode {
    /// The mode [`IMAGE_ROOT_ENV`] names ([`ImageRootMode::Auto`] when unset or empty); any
    /// other value is `InvalidArgument`.
    pub fn from_env() -> Result<ImageRootMode> {
        match std::env::var(IMAGE_ROOT_ENV) {
            Err(_) => Ok(ImageRootMode::Auto),
            Ok(text) => match text.trim() {
                "" | "auto" => Ok(ImageRootMode::Auto),
                "overlay" => Ok(ImageRootMode::Overlay),
                "copy" => Ok(ImageRootMode::Copy),
                other => Err(Error::invalid(format!(
                    "{IMAGE_ROOT_ENV}={other:?}: expected `overlay`, `copy` or `auto`"
                ))),
            },
        }
    }

    /// The mode's name: `auto`, `overlay` or `copy`.
    pub fn as_str(self) -> &'static str {
        match self {
            ImageRootMode::Auto => "auto",
            ImageRootMode::Overlay => "overlay",
            ImageRootMode::Copy => "copy",
        }
    }

    /// What this setting amounts to on this host: `Overlay` or `Copy` as forced, and under
    /// `Auto` overlay where the kernel has overlayfs and mounts it in user namespaces (Linux
    /// 5.11 or later with `overlay` in `/proc/filesystems`), copy otherwise. An expectation:
    /// a create under `Auto` still copies where its mount is refused.
    pub fn host_default(self) -> ImageRootMode {
        match self {
            ImageRootMode::Auto if overlay_expected() => ImageRootMode::Overlay,
            ImageRootMode::Auto => ImageRootMode::Copy,
            forced => forced,
        }
    }
}

/// Whether this kernel should mount overlayfs in a user namespace with `userxattr`.
fn overlay_expected() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut numbers = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let version = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
    let listed = std::fs::read_to_string("/proc/filesystems")
        .map(|text| {
            text.lines()
                .any(|l| l.split_whitespace().last() == Some("overlay"))
        })
        .unwrap_or(false);
    version >= (5, 11) && listed
}

/// The most layers one root stacks: overlayfs takes 500 lower layers at most, and the mount
/// options naming them must fit one page.
pub const MAX_LAYERS: usize = 128;

/// The environment variable bounding the image store (MiB): a pull or import that would take
/// it past this is refused before it starts. Unset: the file system's space is the bound.
pub const STORE_MAX_MIB_ENV: &str = "SANDCOVE_IMAGE_STORE_MAX_MIB";

/// The directory of an engine's image store: `<state dir>/images`.
pub fn store_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("images")
}

/// The image store of the engine keeping state in `state_dir`, with layer files owned as this
/// process's sandboxes see them: shifted into the sandboxes' uid range when the engine runs
/// as root, the caller's own otherwise (see [`OwnerMap`]). Every program sharing the state
/// directory shares the store (its records are locked).
pub fn open_store(state_dir: &Path) -> Result<Store> {
    let owner = match crate::config::UidMapping::for_host(crate::sys::geteuid(), 0) {
        crate::config::UidMapping::Range => OwnerMap::Shift {
            base: crate::config::HOST_ID_BASE,
            count: crate::config::HOST_ID_COUNT,
        },
        crate::config::UidMapping::Single { .. } => OwnerMap::Caller,
    };
    let max_store_bytes = match std::env::var(STORE_MAX_MIB_ENV) {
        Ok(text) => Some(
            text.trim()
                .parse::<u64>()
                .ok()
                .and_then(|mib| mib.checked_mul(1 << 20))
                .ok_or_else(|| {
                    Error::invalid(format!(
                        "{STORE_MAX_MIB_ENV}={text:?} is not a number of MiB"
                    ))
                })?,
        ),
        Err(_) => None,
    };
    let options = StoreOptions {
        owner,
        max_store_bytes,
        ..StoreOptions::default()
    };
    Store::open(store_dir(state_dir), options).map_err(image_error)
}

/// A store's pull progress as the core's.
pub fn pull_progress(p: sandcove_image::PullProgress) -> sandcove_core::ImagePullProgress {
    use sandcove_core::ImageLayerState as Core;
    use sandcove_image::LayerState;
    let state = match p.state {
        LayerState::Waiting => Core::Waiting,
        LayerState::Downloading => Core::Downloading,
        LayerState::Unpacking => Core::Unpacking,
        LayerState::Done => Core::Done,
        LayerState::Cached => Core::Cached,
    };
    sandcove_core::ImagePullProgress::new(p.layer, p.index, p.layers, state, p.done, p.total)
}

/// An archive received for an import, in the store's temporary directory; removed when
/// dropped.
pub(crate) struct StagedArchive(PathBuf);

impl StagedArchive {
    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for StagedArchive {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Write `archive` to a file in `store`'s temporary directory as it arrives (never whole in
/// memory), refusing it once it passes the room the store's bound ([`STORE_MAX_MIB_ENV`])
/// leaves: the received file takes that room while it lasts, and an archive that does not
/// fit in it cannot be imported. A stream that fails, or passes the bound, leaves no file
/// behind.
pub(crate) async fn stage_archive(
    store: &Store,
    mut archive: sandcove_core::ByteStream,
) -> Result<StagedArchive> {
    use futures::StreamExt;
    use tokio::io::AsyncWriteExt;
    let bound = store.max_store_bytes();
    let measured = store.clone();
    let room = tokio::task::spawn_blocking(move || measured.room_left())
        .await
        .map_err(|e| Error::backend(format!("measuring the image store: {e}")))?;
    let staged = StagedArchive(store.staging_path());
    let mut file = tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(staged.path())
        .await
        .map_err(|e| Error::from_io(&e, "create a file for the image archive"))?;
    let mut received: u64 = 0;
    while let Some(chunk) = archive.next().await {
        let chunk = chunk?;
        received = received.saturating_add(chunk.len() as u64);
        if let Some(room) = room.filter(|room| received > *room) {
            return Err(Error::FileTooLarge {
                what: "the image archive".into(),
                limit: room,
                remedy: format!(
                    "the image store is bounded to {} bytes ({STORE_MAX_MIB_ENV} of the \
                     runtime), which leaves {room}: import a smaller archive, remove unused \
                     images, or raise the bound",
                    bound.unwrap_or_default()
                ),
            });
        }
        file.write_all(&chunk)
            .await
            .map_err(|e| Error::from_io(&e, "write the image archive"))?;
    }
    file.flush()
        .await
        .map_err(|e| Error::from_io(&e, "write the image archive"))?;
    Ok(staged)
}

/// An import's error as the core's, naming no path of this host: the staged upload becomes
/// "the uploaded archive", and any other path in the store (its spool, its layers) is named
/// relative to "the image store". Callers over HTTP see the error; the state directory's
/// place is none of their business.
pub(crate) fn import_error(err: ImageError, staged: &Path, store_dir: &Path) -> Error {
    let staged = staged.to_string_lossy();
    let store_dir = store_dir.to_string_lossy();
    let hide = |text: &str| {
        text.replace(staged.as_ref(), "the uploaded archive")
            .replace(store_dir.as_ref(), "the image store")
    };
    let mut body = image_error(err).to_body();
    body.message = hide(&body.message);
    for value in body.fields.values_mut() {
        if let serde_json::Value::String(text) = value {
            *text = hide(text);
        }
    }
    Error::from_body(&body)
}

/// An image store error as the core's: a missing image is `NotFound` with how to get it;
/// bad input is `InvalidArgument`; the rest says what failed.
pub fn image_error(err: ImageError) -> Error {
    match err {
        ImageError::NotFound { reference } => Error::not_found(format!(
            "image {reference} (not stored here: pull it with `sandcove image pull \
             {reference}` or import it with `sandcove image import`)"
        )),
        e @ (ImageError::InvalidReference { .. } | ImageError::InUse { .. }) => {
            Error::invalid(e.to_string())
        }
        e @ ImageError::Unauthorized { .. } => Error::Unauthenticated {
            message: e.to_string(),
        },
        e @ ImageError::Unsupported { .. } => Error::NotSupported {
            feature: e.to_string(),
            alternative: "use an image for this host's platform in a supported format".into(),
        },
        e @ (ImageError::Registry { .. } | ImageError::Stalled { .. } | ImageError::Io { .. }) => {
            Error::Unavailable {
                reason: e.to_string(),
                remedy: "check the registry's address and the network, then retry".into(),
            }
        }
        e => Error::invalid(e.to_string()),
    }
}

/// The engine's own image source: its state directory's store, opened at first use (an
/// engine that never runs an image never touches it).
pub(crate) struct StoreSource {
    state_dir: PathBuf,
    store: OnceLock<Store>,
}

impl std::fmt::Debug for StoreSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreSource")
            .field("dir", &store_dir(&self.state_dir))
            .finish()
    }
}

impl StoreSource {
    pub(crate) fn new(state_dir: &Path) -> StoreSource {
        StoreSource {
            state_dir: state_dir.to_path_buf(),
            store: OnceLock::new(),
        }
    }

    fn store(&self) -> Result<&Store> {
        if let Some(store) = self.store.get() {
            return Ok(store);
        }
        let store = open_store(&self.state_dir)?;
        Ok(self.store.get_or_init(|| store))
    }
}

impl ImageSource for StoreSource {
    fn resolve(&self, reference: &str) -> Result<ImageRoot> {
        let image = self.store()?.resolve(reference).map_err(image_error)?;
        Ok(ImageRoot {
            reference: reference.to_string(),
            digest: image.digest,
            layers: image.layers,
            env: image.config.env,
            working_dir: image.config.working_dir.filter(|d| !d.is_empty()),
            user: image.config.user.filter(|u| !u.is_empty()),
            entrypoint: image.config.entrypoint,
            cmd: image.config.cmd,
        })
    }

    fn references(&self) -> Vec<String> {
        // Not opened just to list: no store directory, no images.
        if self.store.get().is_none() && !store_dir(&self.state_dir).is_dir() {
            return Vec::new();
        }
        let Ok(store) = self.store() else {
            return Vec::new();
        };
        let mut out: Vec<String> = store
            .list()
            .unwrap_or_default()
            .into_iter()
            .flat_map(|image| image.references)
            .collect();
        // Docker Hub's library images answer to their short names too.
        let short: Vec<String> = out
            .iter()
            .filter_map(|r| r.strip_prefix("docker.io/library/").map(str::to_string))
            .collect();
        out.extend(short);
        out
    }

    fn hold(&self, digest: &str, holder: &str) -> Result<()> {
        self.store()?.hold(digest, holder).map_err(image_error)
    }

    fn hold_for_sandbox(&self, digest: &str, holder: &str) -> Result<()> {
        self.store()?
            .hold_transient(digest, holder)
            .map_err(image_error)
    }

    fn release(&self, holder: &str) {
        // Every destroy comes here: one that held nothing (a host-base sandbox, which its
        // create never holds for) costs a read or two, no lock. A hold is written before its
        // sandbox starts, so it is there to be seen by then.
        let dir = store_dir(&self.state_dir);
        let named = |file: &str| {
            std::fs::read(dir.join(file))
                .is_ok_and(|text| text.windows(holder.len()).any(|w| w == holder.as_bytes()))
        };
        if !named("transient-holds.json") && !named("holds.json") {
            return;
        }
        if let Ok(store) = self.store() {
            if let Err(e) = store.release(holder) {
                tracing::warn!("image store: cannot release {holder}'s hold: {e}");
            }
        }
    }
}

/// Whether this host can run images, and how it composes their roots: a sandbox of a
/// one-layer image made here is created and destroyed, with overlayfs first (unless the
/// engine's mode is `copy`), then, where that fails and the mode allows, with the layers
/// copied. `Ok` is the mode that worked (`Overlay` or `Copy`); `Err` says why none did, as the
/// create said it. For `sandcove doctor`.
pub async fn probe(engine: &crate::LocalBackend) -> Result<ImageRootMode> {
    let tries: &[ImageRootMode] = match engine.image_root_mode() {
        ImageRootMode::Auto => &[ImageRootMode::Overlay, ImageRootMode::Copy],
        ImageRootMode::Overlay => &[ImageRootMode::Overlay],
        ImageRootMode::Copy => &[ImageRootMode::Copy],
    };
    let mut failed = None;
    for &mode in tries {
        match probe_with(&engine.clone().with_image_root_mode(mode)).await {
            Ok(()) => return Ok(mode),
            // The first failure says most (why overlayfs cannot be used).
            Err(e) => {
                failed.get_or_insert(e);
            }
        }
    }
    Err(failed.unwrap_or_else(|| Error::backend("no image root mode to probe")))
}

/// One probe sandbox created and destroyed by `engine`.
async fn probe_with(engine: &crate::LocalBackend) -> Result<()> {
    use sandcove_core::Backend;
    let dir = engine.state_dir().join(format!(
        ".image-probe-{}-{}",
        std::process::id(),
        sandcove_agent::new_id()
    ));
    let layer = dir.join("layer");
    let made = (|| -> std::io::Result<()> {
        std::fs::create_dir_all(layer.join("etc"))?;
        std::fs::write(layer.join("etc/probe"), b"image root\n")?;
        if crate::sys::geteuid() == 0 {
            // As the store does for an engine running as root: in the sandboxes' id range.
            let base = crate::config::HOST_ID_BASE;
            for path in [&dir, &layer, &layer.join("etc"), &layer.join("etc/probe")] {
                std::os::unix::fs::lchown(path, Some(base), Some(base))?;
            }
        }
        Ok(())
    })();
    let outcome = match made {
        Err(e) => Err(Error::from_io(&e, "make a probe image")),
        Ok(()) => {
            let root = ImageRoot {
                reference: "sandcove.local/probe:1".into(),
                digest: format!("sha256:{}", "0".repeat(64)),
                layers: vec![layer.clone()],
                env: Vec::new(),
                working_dir: None,
                user: None,
                entrypoint: Vec::new(),
                cmd: Vec::new(),
            };
            let probing = engine
                .clone()
                .with_images(std::sync::Arc::new(ProbeImage(root)));
            let mut options = sandcove_core::CreateOptions::default();
            options.template = Some("sandcove.local/probe:1".into());
            options.timeout = Some(std::time::Duration::from_secs(60));
            match probing.create(options).await {
                Ok(info) => probing.destroy(&info.id).await,
                Err(e) => Err(e),
            }
        }
    };
    let _ = std::fs::remove_dir_all(&dir);
    outcome
}

/// The probe's one image.
#[derive(Debug)]
struct ProbeImage(ImageRoot);

impl ImageSource for ProbeImage {
    fn resolve(&self, _reference: &str) -> Result<ImageRoot> {
        Ok(self.0.clone())
    }

    fn references(&self) -> Vec<String> {
        vec![self.0.reference.clone()]
    }
}

#[cfg(test)]
mod tests {
    use super::ImageRoot;

    #[tokio::test]
    async fn an_upload_is_staged_against_the_room_left_not_the_whole_bound() {
        let dir = std::env::temp_dir().join(format!(
            "sandcove-stage-room-{}-{}",
            std::process::id(),
            crate::sys::geteuid()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let options = sandcove_image::StoreOptions {
            max_store_bytes: Some(1 << 20),
            ..sandcove_image::StoreOptions::default()
        };
        let store = sandcove_image::Store::open(&dir, options).unwrap();
        // Another upload under way takes 600 KiB of the 1 MiB.
        let other = store.staging_path();
        std::fs::write(&other, vec![0u8; 600 << 10]).unwrap();
        let chunks: Vec<sandcove_core::Result<Vec<u8>>> =
            (0..6).map(|_| Ok(vec![1u8; 100 << 10])).collect();
        let result = super::stage_archive(&store, Box::pin(futures::stream::iter(chunks))).await;
        match result {
            Err(sandcove_core::Error::FileTooLarge { limit, .. }) => {
                assert_eq!(limit, (1 << 20) - (600 << 10))
            }
            other => panic!("{:?}", other.map(|s| s.path().to_path_buf())),
        }
        std::fs::remove_file(&other).unwrap();
        let left: Vec<_> = std::fs::read_dir(dir.join("tmp")).unwrap().collect();
        assert!(left.is_empty(), "the refused upload is removed: {left:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_import_error_names_no_path_of_the_store() {
        let store_dir = std::path::Path::new("/srv/state/images");
        let staged = store_dir.join("tmp/received-1-0000abcd");
        let spool = store_dir.join("tmp/import-1-0000beef/3");
        for err in [
            sandcove_image::ImageError::Io {
                context: format!("opening {}", spool.display()),
                source: std::io::Error::other("gone"),
            },
            sandcove_image::ImageError::Malformed {
                what: format!("image archive {}", staged.display()),
                reason: "bad tar".into(),
            },
        ] {
            let text = super::import_error(err, &staged, store_dir).to_string();
            assert!(!text.contains("/srv/state"), "{text}");
        }
        let text = super::import_error(
            sandcove_image::ImageError::Io {
                context: format!("opening {}", spool.display()),
                source: std::io::Error::other("gone"),
            },
            &staged,
            store_dir,
        )
        .to_string();
        assert!(text.contains("the image store/tmp/import-"), "{text}");
    }

    fn with_user(user: Option<&str>) -> ImageRoot {
        ImageRoot {
            reference: "test.local/user:1".into(),
            digest: format!("sha256:{}", "0".repeat(64)),
            layers: Vec::new(),
            env: Vec::new(),
            working_dir: None,
            user: user.map(str::to_string),
            entrypoint: Vec::new(),
            cmd: Vec::new(),
        }
    }

    #[test]
    fn the_image_user_decides_the_default_user() {
        let decided = |user: Option<&str>| with_user(user).default_user().unwrap();
        for root in ["root", "0", "root:root", "0:0", "0:1000", "000"] {
            assert_eq!(decided(Some(root)), Some("root".into()), "{root}");
        }
        for (user, name) in [
            ("node", "node"),
            ("app:app", "app"),
            ("www-data:33", "www-data"),
        ] {
            assert_eq!(decided(Some(user)), Some(name.into()), "{user}");
        }
        for engine_default in ["1000", "1000:1000", "65534", ":staff"] {
            assert_eq!(decided(Some(engine_default)), None, "{engine_default}");
        }
        assert_eq!(with_user(None).default_user().unwrap(), None);
        for bad in ["a b", "x/y", &"n".repeat(33)] {
            let err = with_user(Some(bad)).default_user().expect_err(bad);
            assert_eq!(
                err.code(),
                sandcove_core::ErrorCode::InvalidArgument,
                "{bad}"
            );
        }
    }
}
