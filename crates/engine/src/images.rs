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
//! [`is_host_base`]: sandcove_core::capability::is_host_base

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use sandcove_core::Result;

/// Where the engine finds images: the image store, or a test's own layers. Which images are in
/// use is the engine's to say ([`LocalBackend::images_in_use`]), from the records of its live
/// sandboxes, so a sandbox that ends without its client (at its lease, in its monitor) never
/// leaves a stale claim behind.
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
