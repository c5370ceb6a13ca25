//! A locale archive for sandboxes on hosts that have none.
//!
//! Every sandbox process starts with `LANG=C.UTF-8`, and glibc looks a locale up in
//! `/usr/lib/locale/locale-archive` first: one open and one mapping serve every category. A
//! host without that file (Debian and its derivatives without the `locales` package ship
//! `C.utf8` as a directory only) makes each process read `locale.alias`, then try each of the
//! twelve categories under the name as given, fail, and open and map its file under the
//! normalised name: about fifty system calls, a fifth of an `echo`'s whole run in a sandbox
//! (BENCHMARKS.md, "locale pass").
//!
//! So the engine builds, once per host locale set, an archive of the host's own compiled
//! locales with the host's own `localedef`, next to copies of those directories, in
//! `<state dir>/locale/<key>/`. Each sandbox binds that directory read-only over its
//! `/usr/lib/locale` (see `agent::setup`): the same locales under the same names, found in
//! one lookup. A host that already has an archive is left as it is; any failure here only
//! means sandboxes read the host's directories as before.

use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Where glibc keeps compiled locales (the same path inside a sandbox).
pub(super) const HOST_LOCALE_DIR: &str = "/usr/lib/locale";

/// Where `localedef` may be; looked up at these paths only, not along the engine's `PATH`.
const LOCALEDEF: &[&str] = &[
    "/usr/bin/localedef",
    "/usr/sbin/localedef",
    "/bin/localedef",
];

/// A host locale tree larger than this is not copied (compiled locales are about 400 KiB each;
/// hosts with many of them have an archive already).
const MAX_COPY_BYTES: u64 = 32 << 20;

/// Entries of the host tree past this count are not copied either.
const MAX_ENTRIES: usize = 4096;

/// The directory to bind over each sandbox's `/usr/lib/locale`, made if needed, or `None`
/// where the host's own serves (it has an archive, no locales, or no `localedef`) or it could
/// not be made; the reason is logged.
pub(super) fn prepare(state_dir: &Path) -> Option<PathBuf> {
    let localedef = LOCALEDEF.iter().map(Path::new).find(|p| p.is_file())?;
    match prepare_from(
        Path::new(HOST_LOCALE_DIR),
        &state_dir.join("locale"),
        localedef,
    ) {
        Ok(dir) => dir,
        Err(e) => {
            tracing::warn!("sandboxes read the host's locale files one by one: {e}");
            None
        }
    }
}

/// One entry of the host's locale tree, relative to it.
struct Entry {
    rel: PathBuf,
    kind: Kind,
}

enum Kind {
    Dir,
    File,
    Link(PathBuf),
}

/// [`prepare`] from the locale tree `host` into `<cache>/<key>`, with `localedef`.
fn prepare_from(host: &Path, cache: &Path, localedef: &Path) -> io::Result<Option<PathBuf>> {
    if !host.is_dir() || host.join("locale-archive").symlink_metadata().is_ok() {
        return Ok(None);
    }
    let mut entries = Vec::new();
    let mut key = ring::digest::Context::new(&ring::digest::SHA256);
    // The archive's format is the host glibc's: a new `localedef` makes a new key.
    let meta = std::fs::metadata(localedef)?;
    key.update(format!("{} {:?}\n", meta.len(), meta.modified()?).as_bytes());
    walk(host, Path::new(""), &mut entries, &mut key, &mut 0)?;
    // Compiled locales are the top-level directories with a character set.
    let locales: Vec<&Path> = entries
        .iter()
        .filter(|e| matches!(e.kind, Kind::Dir) && e.rel.components().count() == 1)
        .map(|e| e.rel.as_path())
        .filter(|rel| host.join(rel).join("LC_CTYPE").is_file())
        .collect();
    if locales.is_empty() {
        return Ok(None);
    }
    let key: String = key
        .finish()
        .as_ref()
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect();
    let dest = cache.join(&key);
    if dest.join("locale-archive").is_file() {
        return Ok(Some(dest));
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(cache)?;
    // Engines of one program, and other programs, may prepare at once: each in a directory
    // of its own, and only the one it created is removed.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nonce = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = cache.join(format!(".tmp-{}-{nonce}", std::process::id()));
    std::fs::DirBuilder::new().mode(0o755).create(&tmp)?;
    let built = build(host, &tmp, &entries, &locales, localedef);
    let placed = built.and_then(|()| match std::fs::rename(&tmp, &dest) {
        Ok(()) => Ok(()),
        // Another engine on this state directory made the same one first.
        Err(_) if dest.join("locale-archive").is_file() => Ok(()),
        Err(e) => Err(e),
    });
    let _ = std::fs::remove_dir_all(&tmp);
    placed.map(|()| Some(dest))
}

/// Record every entry under `dir` (which is `host`/`rel`) into `entries` and the key,
/// refusing trees past [`MAX_COPY_BYTES`] or [`MAX_ENTRIES`].
fn walk(
    dir: &Path,
    rel: &Path,
    entries: &mut Vec<Entry>,
    key: &mut ring::digest::Context,
    bytes: &mut u64,
) -> io::Result<()> {
    let mut names: Vec<_> = std::fs::read_dir(dir)?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<io::Result<_>>()?;
    names.sort();
    for name in names {
        let path = dir.join(&name);
        let rel = rel.join(&name);
        let meta = path.symlink_metadata()?;
        let kind = if meta.is_dir() {
            Kind::Dir
        } else if meta.is_file() {
            *bytes += meta.len();
            Kind::File
        } else if meta.file_type().is_symlink() {
            Kind::Link(std::fs::read_link(&path)?)
        } else {
            continue;
        };
        if *bytes > MAX_COPY_BYTES || entries.len() >= MAX_ENTRIES {
            return Err(io::Error::other(format!(
                "the host's {HOST_LOCALE_DIR} is too large to copy"
            )));
        }
        key.update(format!("{rel:?} {} {:?}\n", meta.len(), meta.modified()?).as_bytes());
        entries.push(Entry {
            rel: rel.clone(),
            kind,
        });
        if meta.is_dir() {
            walk(&path, &rel, entries, key, bytes)?;
        }
    }
    Ok(())
}

/// Copy the host tree into the new directory `tmp` (directories 0755, files 0644) and add
/// the archive of `locales` made by `localedef`.
fn build(
    host: &Path,
    tmp: &Path,
    entries: &[Entry],
    locales: &[&Path],
    localedef: &Path,
) -> io::Result<()> {
    // Created with a umask in force: the modes are set explicitly.
    std::fs::set_permissions(tmp, std::fs::Permissions::from_mode(0o755))?;
    for entry in entries {
        let to = tmp.join(&entry.rel);
        match &entry.kind {
            Kind::Dir => {
                std::fs::DirBuilder::new().mode(0o755).create(&to)?;
                std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755))?;
            }
            Kind::File => {
                std::fs::copy(host.join(&entry.rel), &to)?;
                std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o644))?;
            }
            Kind::Link(target) => std::os::unix::fs::symlink(target, &to)?,
        }
    }
    // `localedef --prefix=P` writes P/usr/lib/locale/locale-archive.
    let prefix = tmp.join(".build");
    let archive_dir = prefix.join(HOST_LOCALE_DIR.trim_start_matches('/'));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&archive_dir)?;
    let out = std::process::Command::new(localedef)
        .arg(format!("--prefix={}", prefix.display()))
        .arg("--add-to-archive")
        .args(locales.iter().map(|rel| host.join(rel)))
        .env_clear()
        .stdin(std::process::Stdio::null())
        .output()?;
    if !out.status.success() {
        let said = String::from_utf8_lossy(&out.stderr);
        return Err(io::Error::other(format!(
            "{} failed ({}): {}",
            localedef.display(),
            out.status,
            said.trim()
        )));
    }
    let archive = tmp.join("locale-archive");
    std::fs::rename(archive_dir.join("locale-archive"), &archive)?;
    std::fs::set_permissions(&archive, std::fs::Permissions::from_mode(0o644))?;
    std::fs::remove_dir_all(&prefix)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A copy of the host's `C.utf8` as a host locale tree under `dir`, or `None` where the
    /// host has no such locale or no `localedef` (the test has nothing to check then).
    fn host_tree(dir: &Path) -> Option<(PathBuf, &'static Path)> {
        let source = Path::new(HOST_LOCALE_DIR).join("C.utf8");
        let localedef = LOCALEDEF.iter().map(Path::new).find(|p| p.is_file())?;
        if !source.join("LC_CTYPE").is_file() {
            return None;
        }
        let tree = dir.join("host");
        let copy = |from: &Path, to: &Path| {
            std::fs::create_dir_all(to).unwrap();
            for e in std::fs::read_dir(from).unwrap() {
                let e = e.unwrap();
                if e.file_type().unwrap().is_dir() {
                    let sub = to.join(e.file_name());
                    std::fs::create_dir_all(&sub).unwrap();
                    for f in std::fs::read_dir(e.path()).unwrap() {
                        let f = f.unwrap();
                        std::fs::copy(f.path(), sub.join(f.file_name())).unwrap();
                    }
                } else {
                    std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
                }
            }
        };
        copy(&source, &tree.join("C.utf8"));
        std::os::unix::fs::symlink("C.utf8", tree.join("C.UTF-8")).unwrap();
        Some((tree, localedef))
    }

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "sandcove-locale-test-{name}-{}-{}",
            std::process::id(),
            sandcove_core::now_millis()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn an_archive_is_made_once_beside_copies_of_the_host_locales() {
        let dir = temp_dir("made");
        let Some((host, localedef)) = host_tree(&dir) else {
            return;
        };
        let cache = dir.join("cache");
        let made = prepare_from(&host, &cache, localedef)
            .expect("prepared")
            .expect("a directory");
        let archive = made.join("locale-archive");
        let listed = std::process::Command::new(localedef)
            .arg("--list-archive")
            .arg(&archive)
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&listed.stdout).trim(), "C.utf8");
        assert!(made.join("C.utf8/LC_CTYPE").is_file());
        assert!(made.join("C.utf8/LC_MESSAGES/SYS_LC_MESSAGES").is_file());
        assert_eq!(
            std::fs::read_link(made.join("C.UTF-8")).unwrap(),
            Path::new("C.utf8")
        );
        for (path, mode) in [(&made, 0o755), (&archive, 0o644)] {
            let meta = std::fs::metadata(path).unwrap();
            assert_eq!(meta.permissions().mode() & 0o7777, mode, "{path:?}");
        }
        assert!(!made.join(".build").exists());
        // The same host tree finds the same directory and makes nothing new.
        let modified = std::fs::metadata(&archive).unwrap().modified().unwrap();
        let again = prepare_from(&host, &cache, localedef).unwrap().unwrap();
        assert_eq!(again, made);
        assert_eq!(
            std::fs::metadata(&archive).unwrap().modified().unwrap(),
            modified
        );
        let names: Vec<_> = std::fs::read_dir(&cache).unwrap().collect();
        assert_eq!(names.len(), 1, "no temporary directory is left");
        // A changed host tree makes another.
        std::fs::write(host.join("C.utf8/LC_NAME"), b"changed").unwrap();
        let other = prepare_from(&host, &cache, localedef).unwrap().unwrap();
        assert_ne!(other, made);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_host_with_an_archive_or_without_locales_is_left_alone() {
        let dir = temp_dir("alone");
        let Some((host, localedef)) = host_tree(&dir) else {
            return;
        };
        let cache = dir.join("cache");
        std::fs::write(host.join("locale-archive"), b"").unwrap();
        assert!(prepare_from(&host, &cache, localedef).unwrap().is_none());
        assert!(prepare_from(&dir.join("missing"), &cache, localedef)
            .unwrap()
            .is_none());
        let empty = dir.join("empty");
        std::fs::create_dir(&empty).unwrap();
        assert!(prepare_from(&empty, &cache, localedef).unwrap().is_none());
        assert!(!cache.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_failing_localedef_leaves_nothing() {
        let dir = temp_dir("fails");
        let Some((host, _)) = host_tree(&dir) else {
            return;
        };
        let cache = dir.join("cache");
        let err = prepare_from(&host, &cache, Path::new("/bin/false")).unwrap_err();
        assert!(err.to_string().contains("failed"), "{err}");
        assert_eq!(std::fs::read_dir(&cache).unwrap().count(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
