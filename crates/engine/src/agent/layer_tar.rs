//! An image sandbox's writable layer as an OCI layer tar, written by the agent itself.
//!
//! A snapshot of an image sandbox holds only what the sandbox changed: overlayfs's upper
//! directory. No program of the image runs for it (in an image's root, `tar` would be the
//! image's own, and the agent's capabilities must never reach it): the agent walks the
//! directory through the descriptor it kept at setup, reaching every entry beneath it with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)` and reading
//! symlinks as text, never following one. overlayfs's own format becomes the OCI layer format
//! the image store unpacks: a whiteout (a 0:0 character device) is a `.wh.NAME` entry, an
//! opaque directory (`user.overlay.opaque=y`) a `.wh..wh..opq` entry in it. A file with holes
//! goes in as a sparse entry (PAX format 1.0) holding its data only, as the host base's
//! `tar --sparse` keeps it.
//!
//! A sandbox file, directory or symlink whose name starts with `.wh.` cannot be archived: the
//! layer format would read it back as a whiteout (or an opaque mark), so it would come back
//! from the snapshot as the removal of another file. The snapshot is refused with an
//! `InvalidInput` error naming it.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags, SeekFrom, Stat};
use rustix::io::Errno;

const RESOLVE: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS)
    .union(ResolveFlags::NO_XDEV);
/// The first entry of a whole root's archive: its root directory's opaque marker.
const ROOT_MARKER: &[u8] = b".wh..wh..opq";
/// The OCI layer format's whiteout prefix: `.wh.NAME` removes `NAME`, `.wh..wh..opq` makes
/// its directory opaque.
const WHITEOUT_PREFIX: &[u8] = b".wh.";
/// overlayfs's opaque-directory mark under `userxattr` (`y`: opaque).
pub(super) const XATTR_OPAQUE: &str = "user.overlay.opaque";
/// Top-level directories of the root that are the engine's, not the sandbox's files (as the
/// host base's export leaves them out).
const EXCLUDED: &[&[u8]] = &[b".sandcove"];

/// Write the layer beneath `upper` (overlayfs's upper directory) to `out` as a tar. With
/// `whole_root` (`upper` is a copied root, see `image_copy`), the tar's first entry marks
/// its root opaque: it is the whole root, nothing of the image's layers under it (see
/// [`is_root_marker`]). Mounts beneath `upper` are never entered.
pub(super) fn write_layer(
    upper: BorrowedFd<'_>,
    whole_root: bool,
    out: impl Write,
) -> io::Result<()> {
    let mut builder = tar::Builder::new(out);
    if whole_root {
        append_marker(&mut builder, ROOT_MARKER)?;
    }
    // Hard links: the path each multiply-linked inode was first archived under.
    let mut first_paths: HashMap<(u64, u64), Vec<u8>> = HashMap::new();
    // Directories still to list, by path beneath the layer (empty: the layer's root).
    let mut pending: Vec<Vec<u8>> = vec![Vec::new()];
    while let Some(rel) = pending.pop() {
        let dir = match open_beneath(upper, &rel, OFlags::RDONLY | OFlags::DIRECTORY) {
            Ok(dir) => dir,
            // Removed or replaced since it was listed (the sandbox is paused, but an export
            // never trusts that): nothing to archive there. A mount point (`/proc`, `/dev`,
            // a volume) is not the sandbox's files either.
            Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP | Errno::XDEV) => continue,
            Err(e) => return Err(e.into()),
        };
        if !rel.is_empty() {
            let stat = rustix::fs::fstat(&dir)?;
            let mut header = header_of(&stat, tar::EntryType::Directory);
            builder.append_data(&mut header, as_path(&rel), io::empty())?;
        }
        if is_opaque(dir.as_fd()) && !(rel.is_empty() && whole_root) {
            append_marker(&mut builder, &join(&rel, b".wh..wh..opq"))?;
        }
        let mut names = list(dir.as_fd())?;
        names.sort();
        for name in names {
            if rel.is_empty() && EXCLUDED.contains(&name.as_slice()) {
                continue;
            }
            let path = join(&rel, &name);
            // In the layer format a `.wh.` name is a whiteout (or an opaque mark), whatever
            // the entry: archived, the sandbox's own file would come back from its snapshot
            // as the removal of another. Refused, naming it, rather than silently dropped.
            if name.starts_with(WHITEOUT_PREFIX) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "{:?} is named `{}…`, which an image layer reads as a whiteout: \
                         rename or remove it to snapshot this sandbox",
                        String::from_utf8_lossy(&path),
                        String::from_utf8_lossy(WHITEOUT_PREFIX),
                    ),
                ));
            }
            let stat = match rustix::fs::statat(&dir, name.as_slice(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(stat) => stat,
                Err(Errno::NOENT) => continue,
                Err(e) => return Err(e.into()),
            };
            match FileType::from_raw_mode(stat.st_mode) {
                FileType::Directory => pending.push(path),
                FileType::RegularFile => {
                    append_file(&mut builder, dir.as_fd(), &name, &path, &mut first_paths)?
                }
                FileType::Symlink => {
                    let target = match rustix::fs::readlinkat(&dir, name.as_slice(), Vec::new()) {
                        Ok(target) => target,
                        Err(Errno::NOENT | Errno::INVAL) => continue,
                        Err(e) => return Err(e.into()),
                    };
                    let mut header = header_of(&stat, tar::EntryType::Symlink);
                    builder.append_link(&mut header, as_path(&path), as_path(target.as_bytes()))?;
                }
                FileType::CharacterDevice if stat.st_rdev == 0 => {
                    let mut whiteout = WHITEOUT_PREFIX.to_vec();
                    whiteout.extend_from_slice(&name);
                    append_marker(&mut builder, &join(&rel, &whiteout))?;
                }
                // Device nodes, fifos and sockets: an image layer never holds them either (the
                // store skips them), so a snapshot does not.
                _ => {}
            }
        }
    }
    builder.into_inner()?.flush()
}

/// Append a regular file: a hard link to an inode archived before, a sparse entry when it has
/// holes, its bytes otherwise.
fn append_file(
    builder: &mut tar::Builder<impl Write>,
    dir: BorrowedFd<'_>,
    name: &[u8],
    path: &[u8],
    first_paths: &mut HashMap<(u64, u64), Vec<u8>>,
) -> io::Result<()> {
    let file = match rustix::fs::openat2(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        RESOLVE,
    ) {
        Ok(file) => file,
        Err(Errno::NOENT | Errno::LOOP | Errno::XDEV) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let stat = rustix::fs::fstat(&file)?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
        return Ok(());
    }
    if stat.st_nlink > 1 {
        let key = (stat.st_dev, stat.st_ino);
        if let Some(first) = first_paths.get(&key) {
            let mut header = header_of(&stat, tar::EntryType::Link);
            return builder.append_link(&mut header, as_path(path), as_path(first));
        }
        first_paths.insert(key, path.to_vec());
    }
    let size = stat.st_size as u64;
    let segments = data_segments(file.as_fd(), size)?;
    let data: u64 = segments.iter().map(|(_, len)| len).sum();
    // Sparse only where it saves something.
    if data == size {
        let mut header = header_of(&stat, tar::EntryType::Regular);
        header.set_size(size);
        let contents = Exactly {
            inner: std::fs::File::from(file),
            remaining: size,
        };
        return builder.append_data(&mut header, as_path(path), contents);
    }
    append_sparse(builder, &stat, path, file, &segments, data)
}

/// A sparse entry in the PAX format 1.0 (as GNU tar writes it): PAX records saying so and
/// giving the real size, then an entry whose data is the map (`count`, then `offset` and
/// `length` per segment, one decimal number per line, padded to a block) and the segments.
/// Unpacking it writes each segment at its offset and never reads the holes, however large
/// the file's apparent size (the old GNU format's reader hands holes over as zeros).
fn append_sparse(
    builder: &mut tar::Builder<impl Write>,
    stat: &Stat,
    path: &[u8],
    file: OwnedFd,
    segments: &[(u64, u64)],
    data: u64,
) -> io::Result<()> {
    let size = stat.st_size as u64;
    let mut records = Vec::new();
    for (key, value) in [
        ("GNU.sparse.major", "1".to_string()),
        ("GNU.sparse.minor", "0".to_string()),
        ("GNU.sparse.realsize", size.to_string()),
    ] {
        records.extend_from_slice(&pax_record(key, &value));
    }
    let mut pax = tar::Header::new_ustar();
    pax.set_entry_type(tar::EntryType::XHeader);
    pax.set_mode(0o644);
    pax.set_size(records.len() as u64);
    builder.append_data(&mut pax, "PaxHeader", &records[..])?;
    let mut map = format!("{}\n", segments.len());
    for (offset, len) in segments {
        map.push_str(&format!("{offset}\n{len}\n"));
    }
    let mut map = map.into_bytes();
    map.resize(map.len().div_ceil(512) * 512, 0);
    let mut header = header_of(stat, tar::EntryType::Regular);
    header.set_size(map.len() as u64 + data);
    let contents = io::Cursor::new(map).chain(Segments {
        file: std::fs::File::from(file),
        segments: segments.to_vec(),
        index: 0,
        done: 0,
    });
    builder.append_data(&mut header, as_path(path), contents)
}

/// One PAX record: `LENGTH KEY=VALUE\n`, its length counting itself.
fn pax_record(key: &str, value: &str) -> Vec<u8> {
    let body = format!(" {key}={value}\n");
    let mut length = body.len() + 1;
    while (length.to_string().len() + body.len()) != length {
        length = length.to_string().len() + body.len();
    }
    format!("{length}{body}").into_bytes()
}

/// The file's data segments `(offset, length)`, found with `SEEK_DATA`/`SEEK_HOLE`; the
/// file's offset is back at its start after.
pub(super) fn data_segments(file: BorrowedFd<'_>, size: u64) -> io::Result<Vec<(u64, u64)>> {
    let mut segments = Vec::new();
    let mut at = 0u64;
    while at < size {
        let start = match rustix::fs::seek(file, SeekFrom::Data(at)) {
            Ok(start) => start,
            Err(Errno::NXIO) => break,
            // No SEEK_DATA here: the whole file is data.
            Err(Errno::INVAL) if segments.is_empty() => return Ok(vec![(0, size)]),
            Err(e) => return Err(e.into()),
        };
        if start >= size {
            break;
        }
        let end = match rustix::fs::seek(file, SeekFrom::Hole(start)) {
            Ok(end) => end.min(size),
            Err(Errno::NXIO) => size,
            Err(e) => return Err(e.into()),
        };
        if end <= start {
            break;
        }
        segments.push((start, end - start));
        at = end;
    }
    // Seeking moved the file's offset: its bytes are read from the start.
    rustix::fs::seek(file, SeekFrom::Start(0))?;
    Ok(segments)
}

/// A sparse file's data segments, read in order with `pread`, each exactly its length (a
/// file that shrank reads as zeros).
struct Segments {
    file: std::fs::File,
    segments: Vec<(u64, u64)>,
    index: usize,
    done: u64,
}

impl Read for Segments {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        use std::os::unix::fs::FileExt;
        while let Some(&(offset, len)) = self.segments.get(self.index) {
            if self.done == len {
                self.index += 1;
                self.done = 0;
                continue;
            }
            let want = buf.len().min((len - self.done) as usize);
            let n = match self.file.read_at(&mut buf[..want], offset + self.done)? {
                0 => {
                    buf[..want].fill(0);
                    want
                }
                n => n,
            };
            self.done += n as u64;
            return Ok(n);
        }
        Ok(0)
    }
}

/// Exactly `remaining` bytes of `inner`: cut where it grew, zeros where it shrank, so the
/// entry is always the size its header says.
struct Exactly<R> {
    inner: R,
    remaining: u64,
}

impl<R: Read> Read for Exactly<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.remaining == 0 {
            return Ok(0);
        }
        let want = buf.len().min(self.remaining as usize);
        let n = match self.inner.read(&mut buf[..want])? {
            0 => {
                buf[..want].fill(0);
                want
            }
            n => n,
        };
        self.remaining -= n as u64;
        Ok(n)
    }
}

/// A GNU header of `kind` with the entry's mode, owner (as the sandbox sees it) and time.
fn header_of(stat: &Stat, kind: tar::EntryType) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(stat.st_mode & 0o7777);
    header.set_uid(u64::from(stat.st_uid));
    header.set_gid(u64::from(stat.st_gid));
    header.set_mtime(stat.st_mtime.max(0) as u64);
    header.set_size(0);
    header
}

/// An empty marker entry (a whiteout or an opaque directory's mark).
fn append_marker(builder: &mut tar::Builder<impl Write>, path: &[u8]) -> io::Result<()> {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Regular);
    header.set_mode(0o644);
    header.set_size(0);
    builder.append_data(&mut header, as_path(path), io::empty())
}

/// Whether `block`, an archive's first 512 bytes, is the header [`write_layer`] begins a whole
/// root's archive with (the root's opaque marker: an empty regular file of that name).
pub(super) fn is_root_marker(block: &[u8; 512]) -> bool {
    let header = tar::Header::from_byte_slice(block);
    header.entry_type() == tar::EntryType::Regular
        && header.size().ok() == Some(0)
        && header.path_bytes().as_ref() == ROOT_MARKER
}

fn open_beneath(root: BorrowedFd<'_>, rel: &[u8], flags: OFlags) -> rustix::io::Result<OwnedFd> {
    let rel: &[u8] = if rel.is_empty() { b"." } else { rel };
    rustix::fs::openat2(root, rel, flags | OFlags::CLOEXEC, Mode::empty(), RESOLVE)
}

pub(super) fn is_opaque(dir: BorrowedFd<'_>) -> bool {
    let mut value = [0u8; 8];
    matches!(
        rustix::fs::fgetxattr(dir, XATTR_OPAQUE, &mut value),
        Ok(1) if value[0] == b'y'
    )
}

pub(super) fn list(dir: BorrowedFd<'_>) -> io::Result<Vec<Vec<u8>>> {
    let mut names = Vec::new();
    let mut listing = rustix::fs::Dir::read_from(dir)?;
    while let Some(entry) = listing.read() {
        let name = entry?.file_name().to_bytes().to_vec();
        if name != b"." && name != b".." {
            names.push(name);
        }
    }
    Ok(names)
}

pub(super) fn join(rel: &[u8], name: &[u8]) -> Vec<u8> {
    if rel.is_empty() {
        return name.to_vec();
    }
    let mut path = rel.to_vec();
    path.push(b'/');
    path.extend_from_slice(name);
    path
}

fn as_path(bytes: &[u8]) -> &Path {
    Path::new(OsStr::from_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A layer written here unpacks, through the image store's hostile-input unpacker, into
    /// the same tree: files, a symlink (never followed), a hard link, a 64 GiB sparse file kept
    /// sparse (its holes neither archived nor read), whiteouts and an opaque directory.
    #[test]
    fn a_written_layer_unpacks_to_the_same_tree() {
        let base = std::env::temp_dir().join(format!(
            "sandcove-layer-tar-{}-{}",
            std::process::id(),
            crate::config::new_id()
        ));
        let (upper, restored) = (base.join("upper"), base.join("restored"));
        std::fs::create_dir_all(upper.join("dir/sub")).unwrap();
        std::fs::create_dir_all(&restored).unwrap();
        std::fs::write(upper.join("dir/file"), "contents\n").unwrap();
        std::fs::set_permissions(
            upper.join("dir/file"),
            std::fs::Permissions::from_mode(0o640),
        )
        .unwrap();
        std::fs::hard_link(upper.join("dir/file"), upper.join("dir/sub/link")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", upper.join("dir/abs")).unwrap();
        let sparse = std::fs::File::create(upper.join("sparse")).unwrap();
        sparse.set_len(64 << 30).unwrap();
        std::os::unix::fs::FileExt::write_at(&sparse, b"middle", 32 << 30).unwrap();
        drop(sparse);
        let status = std::process::Command::new("mknod")
            .arg(upper.join("dir/gone"))
            .args(["c", "0", "0"])
            .status();
        let whiteouts = status.is_ok_and(|s| s.success());
        let opaque = rustix::fs::setxattr(
            upper.join("dir/sub"),
            XATTR_OPAQUE,
            b"y",
            rustix::fs::XattrFlags::empty(),
        )
        .is_ok();
        let upper_fd = rustix::fs::open(
            &upper,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap();
        let mut archive = Vec::new();
        write_layer(upper_fd.as_fd(), false, &mut archive).unwrap();
        assert!(
            archive.len() < 1 << 20,
            "the sparse file's holes are not archived: {} bytes",
            archive.len()
        );
        let restored_fd = rustix::fs::open(
            &restored,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap();
        let limits = sandcove_image::UnpackLimits {
            max_bytes: 1 << 30,
            max_entries: 1000,
            owner: sandcove_image::OwnerMap::Caller,
        };
        sandcove_image::unpack_archive(restored_fd.as_fd(), &archive[..], &limits, "test").unwrap();
        let read = |p: &str| std::fs::read(restored.join(p)).unwrap();
        assert_eq!(read("dir/file"), b"contents\n");
        assert_eq!(read("dir/sub/link"), b"contents\n");
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(restored.join("dir/file")).unwrap();
        assert_eq!((meta.mode() & 0o777, meta.nlink()), (0o640, 2));
        assert_eq!(
            std::fs::read_link(restored.join("dir/abs")).unwrap(),
            Path::new("/etc/passwd")
        );
        let sparse = std::fs::metadata(restored.join("sparse")).unwrap();
        assert_eq!(sparse.len(), 64 << 30);
        assert!(
            sparse.blocks() * 512 < 1 << 20,
            "restored sparse: {}",
            sparse.blocks()
        );
        let mut buf = [0u8; 6];
        std::os::unix::fs::FileExt::read_exact_at(
            &std::fs::File::open(restored.join("sparse")).unwrap(),
            &mut buf,
            32 << 30,
        )
        .unwrap();
        assert_eq!(&buf, b"middle");
        if whiteouts {
            let stat = std::fs::symlink_metadata(restored.join("dir/gone")).unwrap();
            assert_eq!(
                (stat.mode() & libc::S_IFMT, stat.rdev()),
                (libc::S_IFCHR, 0),
                "a whiteout again"
            );
        }
        if opaque {
            let mut value = [0u8; 4];
            let n = rustix::fs::getxattr(restored.join("dir/sub"), XATTR_OPAQUE, &mut value);
            assert_eq!(n.ok(), Some(1), "opaque again");
        }
        let _ = std::fs::remove_dir_all(&base);
    }

    /// A sandbox's own entry named `.wh.…` (a file, an opaque mark's name, a directory) is
    /// never archived as a whiteout: the layer is refused, naming it.
    #[test]
    fn a_sandbox_file_named_like_a_whiteout_is_refused() {
        for (case, made) in [
            ("file", "dir/.wh.passwd"),
            ("opaque mark", ".wh..wh..opq"),
            ("directory", "dir/.wh.sub/inner"),
        ] {
            let upper = std::env::temp_dir().join(format!(
                "sandcove-layer-tar-wh-{}-{}",
                std::process::id(),
                crate::config::new_id()
            ));
            let file = upper.join(made);
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(&file, "mine\n").unwrap();
            std::fs::write(upper.join("other"), "kept\n").unwrap();
            let upper_fd = rustix::fs::open(
                &upper,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .unwrap();
            let err = write_layer(upper_fd.as_fd(), false, io::sink()).unwrap_err();
            let named = made.trim_end_matches("/inner");
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{case}: {err}");
            assert!(err.to_string().contains(named), "{case}: {err}");
            let _ = std::fs::remove_dir_all(&upper);
        }
    }
}
