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
//! The layer directories are in overlayfs's own format (whiteouts as 0:0 character devices,
//! opaque directories marked `user.overlay.opaque`), as the image store unpacks them.
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
    /// The image's user, recorded (the sandbox's default user is the create's `user`).
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

    fn release(&self, holder: &str) {
        // Every destroy comes here: one that held nothing (a host-base sandbox, which its
        // create never holds for) costs one read, no lock. A hold is written before its
        // sandbox starts, so it is there to be seen by then.
        let holds = store_dir(&self.state_dir).join("holds.json");
        match std::fs::read(&holds) {
            Ok(text) if text.windows(holder.len()).any(|w| w == holder.as_bytes()) => {}
            _ => return,
        }
        if let Ok(store) = self.store() {
            if let Err(e) = store.release(holder) {
                tracing::warn!("image store: cannot release {holder}'s hold: {e}");
            }
        }
    }
}

/// Whether this host can run images: a sandbox of a one-layer image made here is created
/// (its root mounted as every image's is) and destroyed. `Err` says why not, as the create
/// said it. For `sandcove doctor`.
pub async fn probe(engine: &crate::LocalBackend) -> Result<()> {
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
