//! The one error type of the image store.

use std::io;

/// What went wrong with an image operation. Every refusal of hostile or broken input has its
/// own variant, so callers (and tests) can tell a bad layer from a bad network.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ImageError {
    /// The reference names no image in the store (or, for a pull, none in the registry).
    #[error("image not found: {reference}")]
    NotFound {
        /// The reference as given.
        reference: String,
    },
    /// The reference is not a valid image reference (`[host[:port]/]name[:tag][@sha256:…]`).
    #[error("invalid image reference {reference:?}: {reason}")]
    InvalidReference {
        /// The reference as given.
        reference: String,
        /// Why it is refused.
        reason: String,
    },
    /// Content did not hash to the digest that named it (a blob, a manifest or a layer's
    /// diff id).
    #[error("digest mismatch for {what}: expected {expected}, got {actual}")]
    DigestMismatch {
        /// What was checked (`blob sha256:…`, `layer diff id`, …).
        what: String,
        /// The digest it should have had.
        expected: String,
        /// The digest it had.
        actual: String,
    },
    /// A blob's size differed from its descriptor's (a registry sending more bytes than
    /// declared is refused at once).
    #[error("size mismatch for {what}: declared {declared} bytes, {actual}")]
    SizeMismatch {
        /// The blob.
        what: String,
        /// The size its descriptor declares.
        declared: u64,
        /// What was received, described.
        actual: String,
    },
    /// A download ended before its declared size, even after resuming it.
    #[error("truncated download of {what}: {received} of {declared} bytes")]
    Truncated {
        /// The blob.
        what: String,
        /// Bytes received.
        received: u64,
        /// Bytes declared.
        declared: u64,
    },
    /// No byte arrived for the stall timeout.
    #[error("download of {what} stalled: no data for {seconds} s")]
    Stalled {
        /// What was being downloaded.
        what: String,
        /// The stall timeout in seconds.
        seconds: u64,
    },
    /// A manifest, index, config or archive is not what it claims to be.
    #[error("malformed {what}: {reason}")]
    Malformed {
        /// What was being read.
        what: String,
        /// Why it is refused.
        reason: String,
    },
    /// A bound was passed: a layer's decompressed bytes or entries, a manifest's size, the
    /// store's size.
    #[error("{what} is too large: {reason}")]
    TooLarge {
        /// What passed the bound.
        what: String,
        /// Which bound and by how much.
        reason: String,
    },
    /// A layer entry would escape or subvert its layer directory; nothing of the layer is
    /// kept.
    #[error("hostile layer entry {entry:?}: {reason}")]
    HostileLayer {
        /// The entry's path as the archive names it.
        entry: String,
        /// What it tried.
        reason: String,
    },
    /// The registry answered with an error or could not be reached.
    #[error("registry {registry}: {reason}")]
    Registry {
        /// The registry host.
        registry: String,
        /// What happened.
        reason: String,
    },
    /// The registry refused the credentials (or their absence).
    #[error("registry {registry} refused access to {repository}: {reason}")]
    Unauthorized {
        /// The registry host.
        registry: String,
        /// The repository.
        repository: String,
        /// The registry's answer.
        reason: String,
    },
    /// A format or feature this store does not handle (schema 1 manifests, no manifest for
    /// this platform, a credential helper, …).
    #[error("unsupported: {what}")]
    Unsupported {
        /// What is not supported.
        what: String,
    },
    /// The image is held by a sandbox and cannot be removed.
    #[error("image {digest} is in use by {holders:?}")]
    InUse {
        /// The image's digest.
        digest: String,
        /// Who holds it.
        holders: Vec<String>,
    },
    /// A file system or network operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        #[source]
        source: io::Error,
    },
}

impl ImageError {
    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Self {
        ImageError::Io {
            context: context.into(),
            source,
        }
    }

    pub(crate) fn malformed(what: impl Into<String>, reason: impl Into<String>) -> Self {
        ImageError::Malformed {
            what: what.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn hostile(entry: impl Into<String>, reason: impl Into<String>) -> Self {
        ImageError::HostileLayer {
            entry: entry.into(),
            reason: reason.into(),
        }
    }
}

/// `Result` with [`ImageError`].
pub type Result<T, E = ImageError> = std::result::Result<T, E>;
