//! Unpacking a layer tar as hostile input, into overlayfs format.
//!
//! Every entry is created beneath the layer directory's fd: each parent is reached with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`, files are created
//! `O_CREAT | O_EXCL | O_NOFOLLOW`, and metadata is set through the fd held (for symlinks, with
//! `AT_SYMLINK_NOFOLLOW` on the parent's fd). No path is ever followed by name, so neither a
//! `..`, an absolute name, a symlinked parent nor a name swapped mid-unpack reaches outside.
//! The layer is built in a temporary directory beside its final place and renamed there only
//! when complete and its diff id checked.

use std::cell::Cell;
use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::rc::Rc;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags, Timespec, Timestamps, XattrFlags};
use rustix::io::Errno;
use serde::{Deserialize, Serialize};

use crate::digest::{Digest, Hasher};
use crate::error::{ImageError, Result};
use crate::OwnerMap;

/// Marks an overlayfs opaque directory when the overlay is mounted with `userxattr`.
pub(crate) const XATTR_OPAQUE: &str = "user.overlay.opaque";
/// The in-image `uid:gid` of an entry not owned by 0:0 ([`OwnerMap::Caller`]).
pub const XATTR_OWNER: &str = "user.sandcove.owner";
/// The in-image mode (octal) of an entry whose setuid/setgid bits were stripped on disk.
pub const XATTR_MODE: &str = "user.sandcove.mode";
/// The id that in-image ids at or past an [`OwnerMap::Shift`]'s count become: `nobody`, as
/// the kernel shows ids a user namespace does not map.
pub const OVERFLOW_ID: u32 = 65534;

const WHITEOUT_PREFIX: &[u8] = b".wh.";
const OPAQUE_MARKER: &[u8] = b".wh..wh..opq";
const RESOLVE: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);

/// The bounds and ownership an unpack applies (a layer's, or [`unpack_archive`]'s).
#[derive(Clone, Debug)]
pub struct UnpackLimits {
    /// The most bytes the (decompressed) tar stream may hold: past it, [`ImageError::TooLarge`].
    pub max_bytes: u64,
    /// The most entries the tar may hold: past it, [`ImageError::TooLarge`].
    pub max_entries: u64,
    /// How entries are owned on disk.
    pub owner: OwnerMap,
}

/// What [`unpack_archive`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ArchiveSummary {
    /// The tar stream's size.
    pub bytes: u64,
    /// Its entries.
    pub entries: u64,
    /// Device nodes, fifos and entries of unknown type: not created, named here.
    pub skipped: Vec<String>,
}

/// Unpacks a tar in the OCI layer format (`.wh.` whiteouts, `.wh..wh..opq` opaque markers)
/// into the directory `root`, in overlayfs's format, as hostile input, exactly as a layer is
/// unpacked (see the module's documentation: beneath `root`, no symlink followed, no device
/// node made, setuid and setgid stripped, `limits` enforced) but with no digest to check: the
/// writable layer of a sandbox restored from a snapshot, whose archive a sandbox wrote. An
/// error leaves what was unpacked so far in `root`; the caller discards it. `what` names the
/// archive in errors.
pub fn unpack_archive(
    root: BorrowedFd<'_>,
    archive: impl Read,
    limits: &UnpackLimits,
    what: &str,
) -> Result<ArchiveSummary> {
    let record = Unpacker::new(root, limits).run(what, None, archive, None)?;
    Ok(ArchiveSummary {
        bytes: record.unpacked_bytes,
        entries: record.entries,
        skipped: record.skipped,
    })
}

/// What the store records of an unpacked layer (`layers/<diff-id hex>.json`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct LayerRecord {
    pub(crate) diff_id: String,
    /// The decompressed tar stream's size.
    pub(crate) unpacked_bytes: u64,
    pub(crate) entries: u64,
    /// Device nodes, fifos and entries of unknown type: not created, named here.
    pub(crate) skipped: Vec<String>,
}

/// Unpacks `blob` (gzip, zstd or plain tar, recognised by its first bytes) into
/// `<layers_dir>/<diff_id hex>/`, or returns the record of the layer already there. Its
/// decompressed bytes are charged to `room`, the store's, where the store has a bound: the
/// unpack's byte bound is the smaller of the layer's and the room the store has left.
pub(crate) fn unpack_layer(
    layers_dir: &Path,
    diff_id: &Digest,
    blob: impl Read,
    limits: &UnpackLimits,
    room: Option<&RoomEntry<'_>>,
) -> Result<LayerRecord> {
    if let Some(record) = read_record(layers_dir, diff_id)? {
        return Ok(record);
    }
    let layers = open_dir(layers_dir)?;
    let temp = format!(
        ".partial-{}-{}-{:08x}",
        diff_id.hex(),
        std::process::id(),
        random_u32()
    );
    rustix::fs::mkdirat(&layers, temp.as_str(), Mode::from_raw_mode(0o700)).map_err(|e| {
        ImageError::io(
            format!("creating {}", layers_dir.join(&temp).display()),
            e.into(),
        )
    })?;
    let outcome = (|| {
        let root = rustix::fs::openat2(
            &layers,
            temp.as_str(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            RESOLVE,
        )
        .map_err(|e| ImageError::io("opening the layer's temporary directory", e.into()))?;
        let what = format!("layer {diff_id}");
        let record = Unpacker::new(root.as_fd(), limits).run(&what, Some(diff_id), blob, room)?;
        write_record(layers_dir, diff_id, &record)?;
        match rustix::fs::renameat(&layers, temp.as_str(), &layers, diff_id.hex()) {
            Ok(()) => Ok(record),
            // Another process placed the same layer first: its copy is as good as ours.
            Err(Errno::EXIST) | Err(Errno::NOTEMPTY) => {
                let _ = remove_beneath(layers.as_fd(), temp.as_bytes());
                Ok(record)
            }
            Err(e) => Err(ImageError::io(
                "moving the unpacked layer into place",
                e.into(),
            )),
        }
    })();
    if outcome.is_err() {
        let _ = remove_beneath(layers.as_fd(), temp.as_bytes());
    }
    outcome
}

fn record_path(layers_dir: &Path, diff_id: &Digest) -> std::path::PathBuf {
    layers_dir.join(format!("{}.json", diff_id.hex()))
}

/// The record of a layer whose directory is in place, if it is.
pub(crate) fn read_record(layers_dir: &Path, diff_id: &Digest) -> Result<Option<LayerRecord>> {
    if !layers_dir.join(diff_id.hex()).is_dir() {
        return Ok(None);
    }
    match std::fs::read(record_path(layers_dir, diff_id)) {
        Ok(bytes) => Ok(serde_json::from_slice(&bytes).ok()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ImageError::io("reading a layer record", e)),
    }
}

fn write_record(layers_dir: &Path, diff_id: &Digest, record: &LayerRecord) -> Result<()> {
    let bytes = serde_json::to_vec_pretty(record).expect("a layer record serialises");
    crate::store::write_atomically(&record_path(layers_dir, diff_id), &bytes)
}

pub(crate) fn random_u32() -> u32 {
    let mut bytes = [0u8; 4];
    getrandom::fill(&mut bytes).expect("the kernel's random source");
    u32::from_ne_bytes(bytes)
}

fn open_dir(path: &Path) -> Result<OwnedFd> {
    rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| ImageError::io(format!("opening {}", path.display()), e.into()))
}

/// Which byte bound an unpack passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Passed {
    /// The layer's own ([`UnpackLimits::max_bytes`]): its stream, or its stream and the
    /// holes its old-format sparse files declare.
    Layer,
    /// The room the store's bound left ([`StoreRoom`]).
    Store,
}

/// The room a store bound (`max_store_bytes`) leaves, shared by the layer unpacks of one
/// store running at once in this process: every decompressed byte is charged as it is read,
/// and an unpack that would take the store past its bound stops there. The store's size is
/// measured when an unpack starts with none other under way, and the bytes every unpack
/// reads from then on are added to it until none is under way again (a layer finished
/// meanwhile is counted once, by its bytes; a refused one too, which only errs on the safe
/// side), so unpacks running together can never share out more than the room there was.
pub(crate) struct StoreRoom {
    limit: u64,
    state: std::sync::Mutex<RoomState>,
}

#[derive(Default)]
struct RoomState {
    /// Unpacks under way.
    active: usize,
    /// The store's size when the first of them started, plus every byte charged since.
    used: u64,
}

/// An unpack's place in a [`StoreRoom`]: charges it, and leaves it when dropped.
pub(crate) struct RoomEntry<'r> {
    room: &'r StoreRoom,
}

impl StoreRoom {
    /// The room under a store bound of `limit` bytes.
    pub(crate) fn new(limit: u64) -> StoreRoom {
        StoreRoom {
            limit,
            state: std::sync::Mutex::new(RoomState::default()),
        }
    }

    /// Starts an unpack; `usage` (the store's size on disk) is measured when no other unpack
    /// is under way.
    pub(crate) fn enter(&self, usage: impl FnOnce() -> u64) -> RoomEntry<'_> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.active == 0 {
            state.used = usage();
        }
        state.active += 1;
        RoomEntry { room: self }
    }

    /// The store's bound.
    pub(crate) fn limit(&self) -> u64 {
        self.limit
    }
}

impl RoomEntry<'_> {
    /// The store's bound (see [`StoreRoom::limit`]).
    pub(crate) fn limit(&self) -> u64 {
        self.room.limit
    }
}

impl RoomEntry<'_> {
    /// Charges `bytes`; `false` once the store's size would pass its bound.
    pub(crate) fn charge(&self, bytes: u64) -> bool {
        let mut state = self.room.state.lock().unwrap_or_else(|e| e.into_inner());
        state.used = state.used.saturating_add(bytes);
        state.used <= self.room.limit
    }
}

impl Drop for RoomEntry<'_> {
    fn drop(&mut self) {
        let mut state = self.room.state.lock().unwrap_or_else(|e| e.into_inner());
        state.active -= 1;
    }
}

/// A reader that stops with an error once more than `limit` bytes passed (or the store's
/// room is used up), and hashes them.
struct Bounded<'r, R> {
    inner: R,
    hasher: Hasher,
    /// Bytes read so far (shared with the unpacker, which counts sparse holes against the
    /// same bound).
    count: Rc<Cell<u64>>,
    limit: u64,
    room: Option<&'r RoomEntry<'r>>,
    passed: Rc<Cell<Option<Passed>>>,
}

impl<R: Read> Read for Bounded<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        let count = self.count.get() + n as u64;
        self.count.set(count);
        if count > self.limit {
            self.passed.set(Some(Passed::Layer));
            return Err(io::Error::other(
                "the layer's decompressed size bound was passed",
            ));
        }
        if self.room.is_some_and(|room| !room.charge(n as u64)) {
            self.passed.set(Some(Passed::Store));
            return Err(io::Error::other("the image store's size bound was passed"));
        }
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

/// zstd streams of one or more frames.
struct Zstd<R: Read> {
    decoder: Option<ruzstd::decoding::StreamingDecoder<R, ruzstd::decoding::FrameDecoder>>,
}

impl<R: BufRead> Read for Zstd<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let Some(decoder) = self.decoder.as_mut() else {
                return Ok(0);
            };
            let n = decoder.read(buf)?;
            if n > 0 || buf.is_empty() {
                return Ok(n);
            }
            let mut inner = self.decoder.take().expect("present").into_inner();
            if inner.fill_buf()?.is_empty() {
                return Ok(0);
            }
            self.decoder = Some(
                ruzstd::decoding::StreamingDecoder::new(inner)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?,
            );
        }
    }
}

/// The blob decompressed, by its magic bytes: gzip, zstd, or an uncompressed tar.
pub(crate) fn decompress<'a>(blob: impl Read + 'a) -> Result<Box<dyn Read + 'a>> {
    let mut reader = BufReader::with_capacity(1 << 16, blob);
    let head = reader
        .fill_buf()
        .map_err(|e| ImageError::io("reading a layer", e))?
        .to_vec();
    if head.starts_with(&[0x1f, 0x8b]) {
        Ok(Box::new(flate2::bufread::MultiGzDecoder::new(reader)))
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        let decoder = ruzstd::decoding::StreamingDecoder::new(reader)
            .map_err(|e| ImageError::malformed("zstd layer", e.to_string()))?;
        Ok(Box::new(Zstd {
            decoder: Some(decoder),
        }))
    } else if head.starts_with(b"BZh") || head.starts_with(&[0xfd, b'7', b'z', b'X', b'Z']) {
        Err(ImageError::Unsupported {
            what: "bzip2 and xz layers (gzip, zstd and plain tar are)".into(),
        })
    } else {
        Ok(Box::new(reader))
    }
}

/// A directory's mode and time, applied once every entry beneath it is in place (a read-only
/// directory could not take its entries otherwise).
struct DirMeta {
    mode: u32,
    mtime: Option<u64>,
}

struct Unpacker<'a> {
    root: BorrowedFd<'a>,
    limits: &'a UnpackLimits,
    dirs: HashMap<Vec<u8>, DirMeta>,
    skipped: Vec<String>,
    /// The decompressed bytes read so far (the [`Bounded`] reader's count).
    stream: Rc<Cell<u64>>,
    /// The holes old-format sparse entries declared so far: counted with the stream against
    /// the byte bound, since the tar reader hands them over as zeros to scan.
    holes: u64,
}

/// An entry's path split into validated components (no `.`, `..`, empty or absolute).
fn components<'p>(path: &'p [u8], shown: &str) -> Result<Vec<&'p [u8]>> {
    if path.starts_with(b"/") {
        return Err(ImageError::hostile(shown, "absolute path"));
    }
    let mut parts = Vec::new();
    for part in path.split(|&b| b == b'/') {
        match part {
            b"" | b"." => continue,
            b".." => return Err(ImageError::hostile(shown, "path contains `..`")),
            _ => parts.push(part),
        }
    }
    Ok(parts)
}

fn io_err(entry: &str, what: &str, e: Errno) -> ImageError {
    ImageError::io(format!("layer entry {entry:?}: {what}"), e.into())
}

impl<'a> Unpacker<'a> {
    fn new(root: BorrowedFd<'a>, limits: &'a UnpackLimits) -> Self {
        Unpacker {
            root,
            limits,
            dirs: HashMap::new(),
            skipped: Vec::new(),
            stream: Rc::new(Cell::new(0)),
            holes: 0,
        }
    }

    /// Unpacks `blob`, `what` in errors; checks the decompressed stream against `diff_id`
    /// where there is one, and charges it to the store's room where there is one.
    fn run(
        mut self,
        what: &str,
        diff_id: Option<&Digest>,
        blob: impl Read,
        room: Option<&RoomEntry<'_>>,
    ) -> Result<LayerRecord> {
        let passed = Rc::new(Cell::new(None));
        let max_bytes = self.limits.max_bytes;
        let store_limit = room.map(|r| r.room.limit());
        let too_large = |bound: Passed| ImageError::TooLarge {
            what: what.to_string(),
            reason: match bound {
                Passed::Layer => format!("decompresses past {max_bytes} bytes"),
                Passed::Store => format!(
                    "decompresses past the room the image store's bound of {} bytes leaves",
                    store_limit.unwrap_or_default()
                ),
            },
        };
        let bounded = Bounded {
            inner: decompress(blob)?,
            hasher: Hasher::new(),
            count: self.stream.clone(),
            limit: max_bytes,
            room,
            passed: passed.clone(),
        };
        if let OwnerMap::Shift { .. } = self.limits.owner {
            self.set_owner_and_mode_xattr(self.root, ".", 0, 0, 0o755, true)?;
        }
        let mut archive = tar::Archive::new(bounded);
        let mut entries = 0u64;
        let read_error = |e: io::Error| match passed.get() {
            Some(bound) => too_large(bound),
            None => ImageError::malformed(what, format!("tar: {e}")),
        };
        for entry in archive.entries().map_err(read_error)? {
            let mut entry = entry.map_err(read_error)?;
            entries += 1;
            if entries > self.limits.max_entries {
                return Err(ImageError::TooLarge {
                    what: what.to_string(),
                    reason: format!("holds more than {} entries", self.limits.max_entries),
                });
            }
            self.entry(&mut entry)
                .map_err(|e| match (e, passed.get()) {
                    (ImageError::Io { .. }, Some(bound)) => too_large(bound),
                    (ImageError::TooLarge { reason, .. }, _) => ImageError::TooLarge {
                        what: what.to_string(),
                        reason,
                    },
                    (ImageError::Io { context, source }, None)
                        if source.kind() == io::ErrorKind::UnexpectedEof
                            || source.kind() == io::ErrorKind::InvalidData =>
                    {
                        ImageError::malformed(what, format!("{context}: {source}"))
                    }
                    (other, _) => other,
                })?;
        }
        // The diff id covers the whole decompressed stream, the tar's end padding included.
        let mut rest = archive.into_inner();
        io::copy(&mut rest, &mut io::sink()).map_err(read_error)?;
        let actual = rest.hasher.finish();
        if let Some(diff_id) = diff_id {
            diff_id.check(&actual, "layer diff id (the decompressed layer)")?;
        }
        self.apply_dir_metadata()?;
        Ok(LayerRecord {
            diff_id: diff_id.map(Digest::to_string).unwrap_or_default(),
            unpacked_bytes: rest.count.get(),
            entries,
            skipped: self.skipped,
        })
    }

    /// Counts an old-format GNU sparse entry's holes against the byte bound, with the stream
    /// read so far and the holes of the entries before it, before a byte of it is scanned:
    /// the tar reader hands its holes over as zeros, so scanning them takes time in
    /// proportion to the apparent size, which a few header bytes can declare.
    fn count_holes<R: Read>(&mut self, entry: &tar::Entry<'_, R>, shown: &str) -> Result<()> {
        // For an old-format sparse entry the reader's size is the apparent one, and the
        // header's entry size the data the archive holds.
        let apparent = entry.size();
        let stored = entry
            .header()
            .entry_size()
            .map_err(|e| ImageError::malformed("layer entry", format!("{shown:?}: size: {e}")))?;
        self.holes = self.holes.saturating_add(apparent.saturating_sub(stored));
        let counted = self.stream.get().saturating_add(self.holes);
        if counted > self.limits.max_bytes {
            // `what` is the archive's, filled in by `run`.
            return Err(ImageError::TooLarge {
                what: String::new(),
                reason: format!(
                    "the apparent size of its sparse file {shown:?} takes it past {} bytes \
                     (an old-format sparse file's holes count as its data)",
                    self.limits.max_bytes
                ),
            });
        }
        Ok(())
    }

    fn entry<R: Read>(&mut self, entry: &mut tar::Entry<'_, R>) -> Result<()> {
        let raw_path = entry.path_bytes().into_owned();
        let shown = String::from_utf8_lossy(&raw_path).into_owned();
        let kind = entry.header().entry_type();
        if matches!(
            kind,
            tar::EntryType::XGlobalHeader
                | tar::EntryType::XHeader
                | tar::EntryType::GNULongName
                | tar::EntryType::GNULongLink
        ) {
            return Ok(());
        }
        let parts = components(&raw_path, &shown)?;
        let header = entry.header();
        let mode = header
            .mode()
            .map_err(|e| ImageError::malformed("layer entry", format!("{shown:?}: mode: {e}")))?;
        let mut uid = header.uid().unwrap_or(0);
        let mut gid = header.gid().unwrap_or(0);
        let mut mtime = header.mtime().ok();
        // A PAX sparse file (format 1.0): its map heads its data; `(major, minor, real size)`.
        let mut sparse: (Option<String>, Option<String>, Option<String>) = (None, None, None);
        // PAX records carry ids and times too large for the header's fields.
        if let Ok(Some(extensions)) = entry.pax_extensions() {
            for extension in extensions.flatten() {
                let value = extension.value().ok().map(str::trim);
                match extension.key() {
                    Ok("uid") => uid = value.and_then(|v| v.parse().ok()).unwrap_or(uid),
                    Ok("gid") => gid = value.and_then(|v| v.parse().ok()).unwrap_or(gid),
                    Ok("GNU.sparse.major") => sparse.0 = value.map(str::to_string),
                    Ok("GNU.sparse.minor") => sparse.1 = value.map(str::to_string),
                    Ok("GNU.sparse.realsize") => sparse.2 = value.map(str::to_string),
                    Ok("mtime") => {
                        let seconds = value
                            .and_then(|v| v.split('.').next())
                            .and_then(|v| v.parse().ok());
                        mtime = seconds.or(mtime);
                    }
                    _ => {}
                }
            }
        }
        // Ids past 32 bits are nobody's, never truncated onto another id.
        let uid = u64::from(u32::try_from(uid).unwrap_or(OVERFLOW_ID));
        let gid = u64::from(u32::try_from(gid).unwrap_or(OVERFLOW_ID));
        let Some((name, parent_parts)) = parts.split_last() else {
            // `./`: the layer's root directory.
            if kind == tar::EntryType::Directory {
                self.set_owner_and_mode_xattr(
                    self.root, &shown, uid as u32, gid as u32, mode, true,
                )?;
                self.dirs.insert(
                    Vec::new(),
                    DirMeta {
                        mode: strip(mode),
                        mtime,
                    },
                );
            }
            return Ok(());
        };
        let name: &[u8] = name;
        let parent = self.parent(parent_parts, &shown)?;

        if name == OPAQUE_MARKER {
            return rustix::fs::fsetxattr(&parent, XATTR_OPAQUE, b"y", XattrFlags::empty())
                .map_err(|e| io_err(&shown, "marking the directory opaque", e));
        }
        if let Some(hidden) = name.strip_prefix(WHITEOUT_PREFIX) {
            if hidden.starts_with(WHITEOUT_PREFIX) {
                // Other `.wh..wh.` metadata (aufs hard-link dirs): not part of the image.
                return Ok(());
            }
            if hidden.is_empty() || hidden == b"." || hidden == b".." {
                return Err(ImageError::hostile(
                    &shown,
                    "whiteout of `.`, `..` or nothing",
                ));
            }
            self.clear(&parent, hidden, &shown)?;
            return rustix::fs::mknodat(
                &parent,
                hidden,
                FileType::CharacterDevice,
                Mode::empty(),
                rustix::fs::makedev(0, 0),
            )
            .map_err(|e| io_err(&shown, "creating the whiteout", e));
        }

        match kind {
            tar::EntryType::Directory => {
                let existing = rustix::fs::statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW);
                match existing {
                    Ok(stat) if FileType::from_raw_mode(stat.st_mode) == FileType::Directory => {}
                    Ok(_) => {
                        self.clear(&parent, name, &shown)?;
                        self.mkdir(&parent, name, &shown)?;
                    }
                    Err(Errno::NOENT) => self.mkdir(&parent, name, &shown)?,
                    Err(e) => return Err(io_err(&shown, "examining", e)),
                }
                let dir = rustix::fs::openat2(
                    &parent,
                    name,
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                    Mode::empty(),
                    RESOLVE,
                )
                .map_err(|e| resolve_err(&shown, e))?;
                self.set_owner_and_mode_xattr(
                    dir.as_fd(),
                    &shown,
                    uid as u32,
                    gid as u32,
                    mode,
                    true,
                )?;
                let key = parts.join(&b'/');
                self.dirs.insert(
                    key,
                    DirMeta {
                        mode: strip(mode),
                        mtime,
                    },
                );
                Ok(())
            }
            tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse => {
                if kind == tar::EntryType::GNUSparse {
                    self.count_holes(entry, &shown)?;
                }
                // A PAX sparse entry's real size. Its holes are never read or scanned (each
                // segment is written at its offset), so it is not counted against the byte
                // bound (a sandbox's 3 GiB sparse file restores within a 36 MiB archive
                // bound); it must be a size a file can have.
                let pax_sparse = match (&sparse.0, &sparse.1) {
                    (Some(major), Some(minor))
                        if kind == tar::EntryType::Regular && major == "1" && minor == "0" =>
                    {
                        let real_size = sparse
                            .2
                            .as_deref()
                            .and_then(|v| v.parse::<u64>().ok())
                            .filter(|&n| i64::try_from(n).is_ok())
                            .ok_or_else(|| {
                                ImageError::malformed(
                                    "layer entry",
                                    format!(
                                        "{shown:?}: a sparse file without a valid \
                                         GNU.sparse.realsize"
                                    ),
                                )
                            })?;
                        Some(real_size)
                    }
                    _ => None,
                };
                self.clear(&parent, name, &shown)?;
                let file = rustix::fs::openat(
                    &parent,
                    name,
                    OFlags::WRONLY
                        | OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o600),
                )
                .map_err(|e| io_err(&shown, "creating the file", e))?;
                let mut out = std::fs::File::from(file);
                let written = match (kind, pax_sparse) {
                    (_, Some(real_size)) => copy_sparse_map(entry, &mut out, real_size),
                    (tar::EntryType::GNUSparse, _) => {
                        copy_sparse(entry, &mut out, self.limits.max_bytes)
                    }
                    _ => io::copy(entry, &mut out),
                };
                written
                    .map_err(|e| ImageError::io(format!("layer entry {shown:?}: writing"), e))?;
                let fd = out.as_fd();
                self.set_owner_and_mode_xattr(fd, &shown, uid as u32, gid as u32, mode, false)?;
                rustix::fs::fchmod(fd, Mode::from_raw_mode(strip(mode)))
                    .map_err(|e| io_err(&shown, "setting the mode", e))?;
                if let Some(mtime) = mtime {
                    rustix::fs::futimens(fd, &times(mtime))
                        .map_err(|e| io_err(&shown, "setting the time", e))?;
                }
                Ok(())
            }
            tar::EntryType::Symlink => {
                let target = entry
                    .link_name_bytes()
                    .ok_or_else(|| {
                        ImageError::malformed(
                            "layer entry",
                            format!("{shown:?}: symlink without a target"),
                        )
                    })?
                    .into_owned();
                if target.is_empty() {
                    return Err(ImageError::malformed(
                        "layer entry",
                        format!("{shown:?}: symlink with an empty target"),
                    ));
                }
                self.clear(&parent, name, &shown)?;
                // The target is stored as text and never followed here; inside the sandbox it
                // resolves within the sandbox's root.
                rustix::fs::symlinkat(target.as_slice(), &parent, name)
                    .map_err(|e| io_err(&shown, "creating the symlink", e))?;
                if let OwnerMap::Shift { .. } = self.limits.owner {
                    let (u, g) = self.shifted(uid as u32, gid as u32);
                    rustix::fs::chownat(
                        &parent,
                        name,
                        Some(rustix::fs::Uid::from_raw(u)),
                        Some(rustix::fs::Gid::from_raw(g)),
                        AtFlags::SYMLINK_NOFOLLOW,
                    )
                    .map_err(|e| io_err(&shown, "changing the symlink's owner", e))?;
                }
                if let Some(mtime) = mtime {
                    rustix::fs::utimensat(&parent, name, &times(mtime), AtFlags::SYMLINK_NOFOLLOW)
                        .map_err(|e| io_err(&shown, "setting the symlink's time", e))?;
                }
                Ok(())
            }
            tar::EntryType::Link => {
                let target = entry
                    .link_name_bytes()
                    .ok_or_else(|| {
                        ImageError::malformed(
                            "layer entry",
                            format!("{shown:?}: hard link without a target"),
                        )
                    })?
                    .into_owned();
                let target_parts = components(&target, &shown).map_err(|_| {
                    ImageError::hostile(&shown, "hard link to a path outside the layer")
                })?;
                let Some((target_name, target_parent_parts)) = target_parts.split_last() else {
                    return Err(ImageError::hostile(&shown, "hard link to the layer's root"));
                };
                if target_parts == parts {
                    return Ok(());
                }
                let target_parent = self.existing_dir(target_parent_parts).map_err(|reason| {
                    ImageError::hostile(&shown, format!("hard link target: {reason}"))
                })?;
                match rustix::fs::statat(&target_parent, *target_name, AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(stat) if FileType::from_raw_mode(stat.st_mode) == FileType::RegularFile => {}
                    Ok(_) => {
                        return Err(ImageError::hostile(
                            &shown,
                            "hard link to something other than a regular file",
                        ))
                    }
                    Err(Errno::NOENT) => {
                        return Err(ImageError::hostile(
                            &shown,
                            "hard link to a file not in this layer",
                        ))
                    }
                    Err(e) => return Err(io_err(&shown, "examining the hard link's target", e)),
                }
                self.clear(&parent, name, &shown)?;
                rustix::fs::linkat(
                    &target_parent,
                    *target_name,
                    &parent,
                    name,
                    AtFlags::empty(),
                )
                .map_err(|e| io_err(&shown, "creating the hard link", e))
            }
            tar::EntryType::Char | tar::EntryType::Block | tar::EntryType::Fifo => {
                // Device nodes and fifos are never created from an image (a device node would
                // be a door to the host's hardware); recorded so `inspect` can say so.
                self.skipped.push(shown);
                Ok(())
            }
            other => {
                self.skipped.push(format!(
                    "{shown} (tar entry type {:?})",
                    other.as_byte() as char
                ));
                Ok(())
            }
        }
    }

    fn mkdir(&mut self, parent: &OwnedFd, name: &[u8], shown: &str) -> Result<()> {
        rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(0o700))
            .map_err(|e| io_err(shown, "creating the directory", e))
    }

    /// Removes an earlier entry of this name in this layer (a later entry replaces it).
    fn clear(&mut self, parent: &OwnedFd, name: &[u8], shown: &str) -> Result<()> {
        match remove_beneath(parent.as_fd(), name) {
            Ok(()) | Err(Errno::NOENT) => Ok(()),
            Err(e) => Err(io_err(shown, "replacing an earlier entry", e)),
        }
    }

    /// The entry's parent directory, created (mode 0755 in the image) where the layer did
    /// not name it; refused if any component is a symlink or not a directory.
    fn parent(&mut self, parts: &[&[u8]], shown: &str) -> Result<OwnedFd> {
        let joined = if parts.is_empty() {
            b".".to_vec()
        } else {
            parts.join(&b'/')
        };
        for _ in 0..8 {
            match rustix::fs::openat2(
                self.root,
                joined.as_slice(),
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
                RESOLVE,
            ) {
                Ok(fd) => return Ok(fd),
                Err(Errno::AGAIN) => continue,
                Err(Errno::NOENT) => return self.create_parents(parts, shown),
                Err(e) => return Err(resolve_err(shown, e)),
            }
        }
        Err(ImageError::hostile(
            shown,
            "the parent directory kept changing while it was resolved",
        ))
    }

    fn create_parents(&mut self, parts: &[&[u8]], shown: &str) -> Result<OwnedFd> {
        let mut current = rustix::fs::openat2(
            self.root,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            RESOLVE,
        )
        .map_err(|e| resolve_err(shown, e))?;
        for (depth, part) in parts.iter().enumerate() {
            let open = |dir: &OwnedFd| {
                rustix::fs::openat2(
                    dir,
                    *part,
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                    Mode::empty(),
                    RESOLVE,
                )
            };
            current = match open(&current) {
                Ok(fd) => fd,
                Err(Errno::NOENT) => {
                    match rustix::fs::mkdirat(&current, *part, Mode::from_raw_mode(0o700)) {
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(e) => return Err(io_err(shown, "creating a parent directory", e)),
                    }
                    let fd = open(&current).map_err(|e| resolve_err(shown, e))?;
                    if let OwnerMap::Shift { .. } = self.limits.owner {
                        self.set_owner_and_mode_xattr(fd.as_fd(), shown, 0, 0, 0o755, true)?;
                    }
                    self.dirs
                        .entry(parts[..=depth].join(&b'/'))
                        .or_insert(DirMeta {
                            mode: 0o755,
                            mtime: None,
                        });
                    fd
                }
                Err(e) => return Err(resolve_err(shown, e)),
            };
        }
        Ok(current)
    }

    /// A directory that must already exist in this layer (a hard link's target's parent).
    fn existing_dir(&self, parts: &[&[u8]]) -> std::result::Result<OwnedFd, String> {
        let joined = if parts.is_empty() {
            b".".to_vec()
        } else {
            parts.join(&b'/')
        };
        rustix::fs::openat2(
            self.root,
            joined.as_slice(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            RESOLVE,
        )
        .map_err(|e| match e {
            Errno::NOENT => "not in this layer".to_string(),
            Errno::LOOP => "a parent directory is a symlink".to_string(),
            Errno::XDEV => "resolves outside the layer".to_string(),
            other => other.to_string(),
        })
    }

    fn shifted(&self, uid: u32, gid: u32) -> (u32, u32) {
        match self.limits.owner {
            OwnerMap::Caller => (uid, gid),
            OwnerMap::Shift { base, count } => {
                let map = |id: u32| base + if id < count { id } else { OVERFLOW_ID };
                (map(uid), map(gid))
            }
        }
    }

    /// Applies the in-image owner (chown when shifting, else the owner xattr where not 0:0)
    /// and records a stripped setuid/setgid mode. Before the final chmod: user xattrs need
    /// write permission on the inode.
    fn set_owner_and_mode_xattr(
        &self,
        fd: BorrowedFd<'_>,
        shown: &str,
        uid: u32,
        gid: u32,
        mode: u32,
        is_dir: bool,
    ) -> Result<()> {
        let _ = is_dir;
        if mode & 0o6000 != 0 {
            rustix::fs::fsetxattr(
                fd,
                XATTR_MODE,
                format!("{:o}", mode & 0o7777).as_bytes(),
                XattrFlags::empty(),
            )
            .map_err(|e| io_err(shown, "recording the mode", e))?;
        }
        match self.limits.owner {
            OwnerMap::Caller => {
                if (uid, gid) != (0, 0) {
                    rustix::fs::fsetxattr(
                        fd,
                        XATTR_OWNER,
                        format!("{uid}:{gid}").as_bytes(),
                        XattrFlags::empty(),
                    )
                    .map_err(|e| io_err(shown, "recording the owner", e))?;
                }
            }
            OwnerMap::Shift { .. } => {
                let (u, g) = self.shifted(uid, gid);
                rustix::fs::fchown(
                    fd,
                    Some(rustix::fs::Uid::from_raw(u)),
                    Some(rustix::fs::Gid::from_raw(g)),
                )
                .map_err(|e| io_err(shown, "changing the owner", e))?;
            }
        }
        Ok(())
    }

    /// Directories' modes and times, deepest first, once every entry is in place.
    fn apply_dir_metadata(&mut self) -> Result<()> {
        self.dirs.entry(Vec::new()).or_insert(DirMeta {
            mode: 0o755,
            mtime: None,
        });
        let mut dirs: Vec<_> = self.dirs.drain().collect();
        dirs.sort_by_key(|(path, _)| {
            std::cmp::Reverse(
                path.iter().filter(|&&b| b == b'/').count() + usize::from(!path.is_empty()),
            )
        });
        for (path, meta) in dirs {
            let shown = String::from_utf8_lossy(&path).into_owned();
            let target: &[u8] = if path.is_empty() { b"." } else { &path };
            let dir = rustix::fs::openat2(
                self.root,
                target,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
                RESOLVE,
            );
            let dir = match dir {
                Ok(dir) => dir,
                // Replaced by a later entry (or whited out): nothing to apply.
                Err(Errno::NOENT) | Err(Errno::NOTDIR) | Err(Errno::LOOP) => continue,
                Err(e) => return Err(resolve_err(&shown, e)),
            };
            rustix::fs::fchmod(&dir, Mode::from_raw_mode(meta.mode))
                .map_err(|e| io_err(&shown, "setting the mode", e))?;
            if let Some(mtime) = meta.mtime {
                rustix::fs::futimens(&dir, &times(mtime))
                    .map_err(|e| io_err(&shown, "setting the time", e))?;
            }
        }
        Ok(())
    }
}

/// Copies an old-format GNU sparse entry's contents (the tar reader hands its holes over as
/// zeros) leaving every all-zero block a hole: a file whose apparent size is far larger than
/// its data costs only its data on disk. Its apparent size was counted against the unpack's
/// byte bound before (`Unpacker::count_holes`), as scanning the holes takes time in proportion
/// to it; `limit` stops the scan all the same.
fn copy_sparse(from: &mut impl Read, to: &mut std::fs::File, limit: u64) -> io::Result<u64> {
    use std::io::{Seek, SeekFrom, Write};
    const BLOCK: usize = 1 << 16;
    let zeros = vec![0u8; BLOCK];
    let mut buf = vec![0u8; BLOCK];
    let mut total = 0u64;
    loop {
        let n = from.read(&mut buf)?;
        if n == 0 {
            break;
        }
        // A slice comparison (memcmp): a hole of gigabytes is scanned in well under a second.
        if buf[..n] == zeros[..n] {
            to.seek(SeekFrom::Current(n as i64))?;
        } else {
            to.write_all(&buf[..n])?;
        }
        total += n as u64;
        if total > limit {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a sparse file's apparent size passes {limit} bytes"),
            ));
        }
    }
    to.set_len(total)?;
    Ok(total)
}

/// The most data segments a PAX sparse map may list (each holds at least one byte of data
/// and takes a few bytes of map, so the archive's byte bound holds long before this).
const MAX_SPARSE_SEGMENTS: u64 = 1 << 24;

/// Copies a PAX sparse entry (format 1.0: the map, `count` then `offset` and `length` per
/// segment, one decimal number per line, padded to a block, then the segments' data) into
/// `to`, writing each segment at its offset and leaving the rest holes: the holes are never
/// read or scanned, whatever the file's apparent size. A map out of order, past the real size
/// or longer than the entry is `InvalidData`.
fn copy_sparse_map(
    from: &mut impl Read,
    to: &mut std::fs::File,
    real_size: u64,
) -> io::Result<u64> {
    use std::io::{Seek, SeekFrom};
    let bad =
        |what: &str| io::Error::new(io::ErrorKind::InvalidData, format!("sparse map: {what}"));
    let mut consumed = 0u64;
    let mut number = |from: &mut dyn Read| -> io::Result<u64> {
        let mut digits = Vec::new();
        loop {
            let mut byte = [0u8; 1];
            from.read_exact(&mut byte)?;
            consumed += 1;
            match byte[0] {
                b'\n' => break,
                b'0'..=b'9' if digits.len() < 20 => digits.push(byte[0]),
                _ => return Err(bad("not a decimal number per line")),
            }
        }
        std::str::from_utf8(&digits)
            .ok()
            .and_then(|d| d.parse().ok())
            .ok_or_else(|| bad("not a number"))
    };
    let count = number(from)?;
    if count > MAX_SPARSE_SEGMENTS {
        return Err(bad("too many segments"));
    }
    let mut segments = Vec::new();
    let mut end = 0u64;
    for _ in 0..count {
        let offset = number(from)?;
        let length = number(from)?;
        let stop = offset
            .checked_add(length)
            .filter(|&stop| offset >= end && stop <= real_size)
            .ok_or_else(|| bad("segments out of order or past the file's size"))?;
        end = stop;
        segments.push((offset, length));
    }
    let padding = (512 - consumed % 512) % 512;
    io::copy(&mut from.by_ref().take(padding), &mut io::sink())?;
    let mut written = 0u64;
    for (offset, length) in segments {
        to.seek(SeekFrom::Start(offset))?;
        let n = io::copy(&mut from.by_ref().take(length), to)?;
        if n != length {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "a sparse file's data ends before its map does",
            ));
        }
        written += n;
    }
    to.set_len(real_size)?;
    Ok(written)
}

/// The mode on disk: permission and sticky bits only; setuid and setgid never.
fn strip(mode: u32) -> u32 {
    mode & 0o1777
}

fn times(mtime: u64) -> Timestamps {
    let at = Timespec {
        tv_sec: mtime.min(i64::MAX as u64) as i64,
        tv_nsec: 0,
    };
    Timestamps {
        last_access: at,
        last_modification: at,
    }
}

fn resolve_err(shown: &str, e: Errno) -> ImageError {
    match e {
        Errno::LOOP => ImageError::hostile(shown, "a parent directory is a symlink"),
        Errno::XDEV => ImageError::hostile(shown, "resolves outside the layer"),
        Errno::NOTDIR => ImageError::hostile(shown, "a parent is not a directory"),
        other => io_err(shown, "resolving the parent directory", other),
    }
}

/// Removes `name` beneath `dir` (a whole tree if it is a directory) without following any
/// symlink; directories the store made unreadable are opened up first.
pub(crate) fn remove_beneath(dir: BorrowedFd<'_>, name: &[u8]) -> std::result::Result<(), Errno> {
    let stat = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::Directory {
        return rustix::fs::unlinkat(dir, name, AtFlags::empty());
    }
    let open = || {
        rustix::fs::openat2(
            dir,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            RESOLVE,
        )
    };
    let child = match open() {
        Ok(fd) => fd,
        Err(Errno::ACCESS) => {
            rustix::fs::chmodat(dir, name, Mode::from_raw_mode(0o700), AtFlags::empty())?;
            open()?
        }
        Err(e) => return Err(e),
    };
    if stat.st_mode & 0o700 != 0o700 {
        rustix::fs::fchmod(&child, Mode::from_raw_mode(0o700))?;
    }
    let mut names = Vec::new();
    let mut listing = rustix::fs::Dir::read_from(&child)?;
    while let Some(entry) = listing.read() {
        let entry = entry?;
        let entry_name = entry.file_name().to_bytes();
        if entry_name != b"." && entry_name != b".." {
            names.push(entry_name.to_vec());
        }
    }
    for entry_name in names {
        match remove_beneath(child.as_fd(), &entry_name) {
            Ok(()) | Err(Errno::NOENT) => {}
            Err(e) => return Err(e),
        }
    }
    rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR)
}

/// Removes a path inside the store (a layer, a temporary directory) with [`remove_beneath`].
pub(crate) fn remove_path(path: &Path) -> io::Result<()> {
    let parent = path.parent().ok_or_else(|| io::Error::other("no parent"))?;
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::other("no name"))?;
    let dir = rustix::fs::open(
        parent,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    use std::os::unix::ffi::OsStrExt;
    match remove_beneath(dir.as_fd(), name.as_bytes()) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(e.into()),
    }
}
