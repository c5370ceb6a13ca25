//! Sandcove's OCI image store: images pulled from any OCI or Docker registry, or imported
//! from an OCI layout, an `oci-archive` or a `docker save` tarball, kept content-addressed,
//! with each layer unpacked once, as hostile input, into a directory the engine stacks as an
//! overlayfs `lowerdir`.
//!
//! # On disk
//!
//! ```text
//! <store>/                      mode 0700
//!   lock                        flock(2) around every change of the records below
//!   blobs/sha256/<hex>          manifests, indexes and configs (layer blobs only while in transit)
//!   layers/<diff-id hex>/       one unpacked layer, overlayfs format (see below)
//!   layers/<diff-id hex>.json   its record: size, entries, skipped device nodes
//!   images/<digest hex>.json    one image: manifest digest, config, layers
//!   tags.json                   `registry/repository:tag` (or `@sha256:…` when pulled by
//!                               digest alone) -> manifest digest
//!   holds.json                  holder (a snapshot) -> the image digest it keeps (synced)
//!   transient-holds.json        holder (a running sandbox) -> the image digest it uses (not
//!                               synced: a crash ends its holders too)
//!   tmp/                        downloads in progress
//! ```
//!
//! Two programs sharing a store cooperate: records change only under the lock, a layer is
//! renamed into place whole (the second program to finish one drops its copy), and a pull
//! whose layer a concurrent `prune` removed fetches it again before recording the image. In one
//! process, concurrent pulls of a layer download it once.
//!
//! # Layer directories
//!
//! The store's file system must support user extended attributes (ext4, xfs, btrfs; tmpfs
//! from Linux 6.6).
//!
//! A whiteout `.wh.NAME` becomes a character device 0:0 named `NAME`, an opaque marker
//! `.wh..wh..opq` the xattr `user.overlay.opaque=y` on its directory (overlayfs mounted with
//! `userxattr`). With [`OwnerMap::Caller`] every file belongs to the store's user and the
//! in-image `uid:gid` is in the xattr [`XATTR_OWNER`] where it is not 0:0 (user xattrs cannot
//! be set on symlinks, so a symlink's in-image owner is not kept); with [`OwnerMap::Shift`]
//! each entry is chowned to `base + id`, and an id at or past `count` becomes `base +`
//! [`OVERFLOW_ID`] (`nobody`, as the kernel shows unmapped ids) rather than refusing images
//! that use high ids. setuid/setgid bits never reach the disk: they are stripped and the
//! in-image mode recorded (octal) in [`XATTR_MODE`]. Device nodes and fifos are not created:
//! they are counted and named in the layer's record ([`LayerDetails::skipped`]). A sparse file
//! keeps its holes: a PAX (format 1.0) sparse entry's segments are written at their offsets,
//! the holes never read; an old-format GNU sparse entry's all-zero blocks are skipped, and
//! since the tar reader hands its holes over as zeros to scan, its holes count against the
//! layer's byte bound, with the stream and the holes of the entries before it, before any is
//! scanned. [`unpack_archive`] applies the same unpacker, without a
//! digest, to other layer-format archives (an image sandbox's snapshot). Extended
//! attributes inside a layer (file capabilities among them) are not applied.
//!
//! # Registry client
//!
//! A small client of the distribution API on the workspace's `reqwest` 0.12, rather than
//! `oci-client`: `oci-client` 0.18 brings `reqwest` 0.13 (a second major in the build), and
//! the store needs control it does not give over the parts that matter here: a byte bound
//! checked while streaming, a resume with `Range` after a cut, a stall timeout, mirrors and
//! the plain-HTTP rule. The protocol used is small: `GET /v2/<name>/manifests/<ref>`,
//! `GET /v2/<name>/blobs/<digest>` and the Bearer/Basic token dance from `WWW-Authenticate`.
//!
//! # Configuration
//!
//! [`RegistryConfig::from_env`] (what [`StoreOptions::default`] uses) reads:
//! - `SANDCOVE_REGISTRIES`: the path of a JSON file, e.g.
//!   `{"mirrors": {"docker.io": ["mirror.internal:5000"]}, "insecure": ["registry.lan:5000"]}`.
//!   `mirrors` maps a registry to endpoints (`host[:port]` or `http(s)://host[:port]`) tried in
//!   order before the registry itself; `insecure` lists hosts that may be reached over plain
//!   HTTP. Registries on a loopback address may use plain HTTP without being listed (as
//!   Docker treats them); no other host ever is.
//! - credentials from `$DOCKER_CONFIG/config.json` (else `~/.docker/config.json`), `auths`
//!   entries with `auth` (base64 `user:password`) or `username`/`password`; credential helpers
//!   (`credsStore`) are not run.
//! - `SANDCOVE_REGISTRY_AUTH`: the same JSON as that file (`{"auths": {"HOST": {"auth":
//!   "…"}}}`), for CI; its entries win over the file's.

mod digest;
mod error;
mod import;
mod manifest;
mod reference;
mod registry;
mod store;
mod unpack;

use std::path::PathBuf;

pub use error::ImageError;
pub use registry::{Credential, RegistryConfig};
pub use store::Store;
pub use unpack::{
    unpack_archive, ArchiveSummary, UnpackLimits, OVERFLOW_ID, XATTR_MODE, XATTR_OWNER,
};

/// The most layers an image may have: a manifest listing more is refused before any layer is
/// fetched (each may unpack to the layer bound; a sandbox's root stacks no more).
pub const MAX_IMAGE_LAYERS: usize = 128;

/// The most bytes an imported archive's files may decompress to in the store's temporary
/// directory (64 GiB), where the room the store's bound leaves is not smaller: past it the
/// import is [`ImageError::TooLarge`] and nothing of it is kept.
pub const MAX_ARCHIVE_BYTES: u64 = 64 << 30;

/// The most entries an imported archive may hold: past it, [`ImageError::TooLarge`]. An
/// archive of [`MAX_ARCHIVE_IMAGES`] images of [`MAX_IMAGE_LAYERS`] layers each holds fewer.
pub const MAX_ARCHIVE_ENTRIES: u64 = 65_536;

/// The most images one imported archive or layout may hold (`docker save`'s manifest.json
/// entries, an OCI index's manifests): more is [`ImageError::TooLarge`] before any file of
/// it is hashed.
pub const MAX_ARCHIVE_IMAGES: usize = 64;

/// How layer files are owned on the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum OwnerMap {
    /// Everything belongs to the store's user (a rootless engine); in-image owners other
    /// than 0:0 are recorded in [`XATTR_OWNER`].
    #[default]
    Caller,
    /// Each entry is chowned to `base + uid`, `base + gid` (an engine running as root, with
    /// sandboxes' user namespaces mapping `0..count` onto `base..base + count`). Needs
    /// `count` > [`OVERFLOW_ID`].
    Shift {
        /// The host id in-image id 0 becomes.
        base: u32,
        /// How many ids are mapped.
        count: u32,
    },
}

/// How a [`Store`] is opened.
#[derive(Clone, Debug)]
pub struct StoreOptions {
    /// Who owns layer files on the host.
    pub owner: OwnerMap,
    /// The bound on one layer's decompressed bytes (default 8 GiB).
    pub max_layer_bytes: u64,
    /// The bound on one layer's entries (default 1 000 000).
    pub max_layer_entries: u64,
    /// Pulls and imports are refused ([`ImageError::TooLarge`]) when the store's size plus
    /// the new layers' compressed sizes would pass this; and as each layer unpacks, its
    /// decompressed bytes are charged against the room left (shared by the unpacks running
    /// at once in this process), so one decompressing past it is `TooLarge` too, with
    /// nothing of it kept.
    pub max_store_bytes: Option<u64>,
    /// Mirrors, plain-HTTP hosts and credentials.
    pub registries: RegistryConfig,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            owner: OwnerMap::Caller,
            max_layer_bytes: 8 << 30,
            max_layer_entries: 1_000_000,
            max_store_bytes: None,
            registries: RegistryConfig::from_env().unwrap_or_else(|e| {
                tracing::warn!("registry configuration ignored: {e}");
                RegistryConfig::default()
            }),
        }
    }
}

/// An image in the store, ready for the engine.
#[derive(Clone, Debug)]
pub struct ResolvedImage {
    /// The normalised reference it was resolved from.
    pub reference: String,
    /// The image's manifest digest.
    pub digest: String,
    /// The unpacked layer directories, lowest first (the order of overlayfs `lowerdir`s is
    /// the reverse).
    pub layers: Vec<PathBuf>,
    /// What the image asks of the process that runs in it.
    pub config: ImageConfig,
}

/// The image config's run settings.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ImageConfig {
    /// `Env`: `NAME=value` lines.
    pub env: Vec<String>,
    /// `WorkingDir`.
    pub working_dir: Option<String>,
    /// `User` (`name`, `uid`, `uid:gid`, …).
    pub user: Option<String>,
    /// `Entrypoint`.
    pub entrypoint: Vec<String>,
    /// `Cmd`.
    pub cmd: Vec<String>,
}

/// An image in a listing.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ImageInfo {
    /// The tags naming it (`docker.io/library/python:3.12`), possibly none.
    pub references: Vec<String>,
    /// The manifest digest.
    pub digest: String,
    /// The unpacked size of its layers, in bytes.
    pub size: u64,
    /// The config's `created` time (RFC 3339), if it has one.
    pub created: Option<String>,
}

/// One layer of an image.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LayerDetails {
    /// The blob's digest as the manifest names it.
    pub digest: String,
    /// The digest of the uncompressed tar (the directory's name).
    pub diff_id: String,
    /// The blob's size.
    pub compressed_size: u64,
    /// The uncompressed tar's size.
    pub unpacked_size: u64,
    /// The tar's entries.
    pub entries: u64,
    /// Device nodes, fifos and entries of unknown types, not created.
    pub skipped: Vec<String>,
}

/// Everything the store knows of an image.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ImageDetails {
    /// Its listing.
    pub info: ImageInfo,
    /// The index it was chosen from, when pulled through one.
    pub index_digest: Option<String>,
    /// The config's digest.
    pub config_digest: String,
    /// `linux/amd64` and so on.
    pub platform: String,
    /// Its run settings.
    pub config: ImageConfig,
    /// Its layers, lowest first.
    pub layers: Vec<LayerDetails>,
    /// How many entries across its layers were skipped (device nodes, fifos).
    pub skipped_entries: usize,
}

/// Where a layer's pull is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerState {
    /// Queued behind other layers.
    Waiting,
    /// Bytes arriving.
    Downloading,
    /// Being unpacked.
    Unpacking,
    /// Unpacked now.
    Done,
    /// Already in the store.
    Cached,
}

/// A pull's progress, reported per layer.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PullProgress {
    /// The layer's blob digest.
    pub layer: String,
    /// Its position in the image, lowest first.
    pub index: usize,
    /// How many layers the image has.
    pub layers: usize,
    /// Where it is.
    pub state: LayerState,
    /// Bytes received.
    pub done: u64,
    /// The blob's size.
    pub total: u64,
}

/// What `prune` removed.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PruneReport {
    /// Digests of the images removed (untagged and not held).
    pub images: Vec<String>,
    /// Diff ids of the layers removed (used by no image left).
    pub layers: Vec<String>,
    /// Bytes freed, approximately (layers' unpacked sizes and blobs).
    pub bytes: u64,
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_store_is_clone_send_and_sync() {
        fn shareable<T: Clone + Send + Sync + 'static>() {}
        shareable::<crate::Store>();
        fn error<T: std::error::Error + Send + Sync + 'static>() {}
        error::<crate::ImageError>();
    }
}

/// Whether an image could be used, as `check` finds it without pulling.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Availability {
    /// In the store.
    Available,
    /// Not in the store; the registry has it.
    Pullable,
    /// Neither known here nor confirmed by a registry (an invalid reference, an unreachable
    /// or refusing registry).
    Unknown,
}
