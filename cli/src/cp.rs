//! `sandcove cp SRC DST`: files and directories between this host and a sandbox, either
//! direction (`ID:/path` names a sandbox path).
//!
//! Names read from a sandbox are sandbox-controlled: each is checked to be one plain path
//! component before it is joined to a host path, host files are created without following
//! a symlink at their name, and only directories and regular files are copied (symlinks and
//! special files are reported and skipped).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use clap::Args;
use futures::StreamExt;
use sandcove::{ByteStream, FileKind, MkdirOptions, Sandbox, WriteOptions};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::out::{self, Failure, Outcome};

/// Transfers at least this large show progress (when stderr is a terminal).
const PROGRESS_FROM: u64 = 16 * 1024 * 1024;
/// The chunk a host file is read in.
const CHUNK: usize = 256 * 1024;

/// `sandcove cp`.
#[derive(Debug, Args)]
pub struct CpArgs {
    /// What to copy: a host path, or ID:/path in a sandbox.
    pub src: String,
    /// Where to: a host path, or ID:/path in a sandbox. An existing directory receives SRC
    /// under its own name.
    pub dst: String,
}

/// One side of a copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A path on this host.
    Host(PathBuf),
    /// A path in a sandbox.
    Sandbox {
        /// The sandbox.
        id: String,
        /// The path inside it.
        path: String,
    },
}

/// Parse `ID:/path` (a sandbox path) or anything else (a host path; write `./a:b` for a host
/// name with a colon).
pub fn parse_location(text: &str) -> Location {
    match text.split_once(':') {
        Some((id, path)) if !id.is_empty() && !id.contains('/') && !id.starts_with('.') => {
            Location::Sandbox {
                id: id.to_string(),
                path: if path.is_empty() { "." } else { path }.to_string(),
            }
        }
        _ => Location::Host(PathBuf::from(text)),
    }
}

/// Whether a name read from a sandbox can be joined to a host path as one component.
fn plain_component(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\0'])
}

/// The last component of a sandbox path (`None` for `/`).
fn sandbox_basename(path: &str) -> Option<&str> {
    path.trim_end_matches('/')
        .rsplit('/')
        .next()
        .filter(|n| plain_component(n))
}

/// Bytes copied, with a progress line on stderr for large transfers to a terminal.
struct Progress {
    done: AtomicU64,
    total: u64,
    shown: bool,
}

impl Progress {
    fn new(total: u64) -> Arc<Progress> {
        Arc::new(Progress {
            done: AtomicU64::new(0),
            total,
            shown: total >= PROGRESS_FROM && out::stderr_is_tty(),
        })
    }

    fn add(&self, n: u64) {
        let before = self.done.fetch_add(n, Ordering::Relaxed);
        // About every 4 MiB.
        if self.shown && (before >> 22) != ((before + n) >> 22) {
            let done = before + n;
            let pct = done.saturating_mul(100) / self.total.max(1);
            let mut err = std::io::stderr();
            let _ = write!(err, "\r{} / {} MiB ({pct}%)", done >> 20, self.total >> 20);
            let _ = err.flush();
        }
    }

    fn finish(&self) {
        if self.shown {
            eprintln!();
        }
    }
}

/// What a copy did.
#[derive(Default)]
struct Tally {
    files: u64,
    dirs: u64,
    skipped: Vec<String>,
}

/// `sandcove cp SRC DST`.
pub fn cp(args: CpArgs, json: bool) -> Outcome {
    let (src, dst) = (parse_location(&args.src), parse_location(&args.dst));
    let client = out::client()?;
    let mut tally = Tally::default();
    let runtime = out::runtime()?;
    let progress = match (&src, &dst) {
        (Location::Host(from), Location::Sandbox { id, path }) => {
            let sandbox = client.sandbox(id.clone());
            runtime.block_on(async {
                let target =
                    sandbox_target(&sandbox, path, from.file_name().and_then(|n| n.to_str()))
                        .await?;
                let progress = Progress::new(host_size(from));
                upload(&sandbox, from, &target, &progress, &mut tally).await?;
                Ok::<_, Failure>(progress)
            })?
        }
        (Location::Sandbox { id, path }, Location::Host(to)) => {
            let sandbox = client.sandbox(id.clone());
            runtime.block_on(async {
                let target = match (to.is_dir(), sandbox_basename(path)) {
                    (true, Some(name)) => to.join(name),
                    _ => to.clone(),
                };
                let progress = Progress::new(sandbox_size(&sandbox, path).await);
                download(&sandbox, path, &target, &progress, &mut tally).await?;
                Ok::<_, Failure>(progress)
            })?
        }
        (Location::Host(_), Location::Host(_)) => {
            return Err(Failure::usage(
                "neither side is in a sandbox: write one as ID:/path",
            ))
        }
        (Location::Sandbox { .. }, Location::Sandbox { .. }) => {
            return Err(Failure::usage(
                "both sides are in sandboxes: copy through the host (two `sandcove cp`), or \
                 within one sandbox with `sandcove exec ID -- cp -r SRC DST`",
            ))
        }
    };
    progress.finish();
    for path in &tally.skipped {
        eprintln!(
            "sandcove cp: skipped {} (not a regular file or directory)",
            out::terminal_text(path)
        );
    }
    let bytes = progress.done.load(Ordering::Relaxed);
    if json {
        out::print_json(&json!({
            "bytes": bytes, "files": tally.files, "dirs": tally.dirs, "skipped": tally.skipped,
        }))?;
    }
    Ok(0)
}

/// Where a copy into the sandbox lands: inside `path` when it is an existing directory.
async fn sandbox_target(
    sandbox: &Sandbox,
    path: &str,
    name: Option<&str>,
) -> Result<String, Failure> {
    match (sandbox.stat(path).await, name) {
        (Ok(stat), Some(name)) if stat.kind == FileKind::Dir => {
            Ok(format!("{}/{name}", path.trim_end_matches('/')))
        }
        (Ok(_), _) | (Err(sandcove::Error::NotFound { .. }), _) => Ok(path.to_string()),
        (Err(e), _) => Err(e.into()),
    }
}

/// The total size of regular files under a host path (for the progress line).
fn host_size(path: &Path) -> u64 {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::read_dir(path)
            .map(|entries| entries.flatten().map(|e| host_size(&e.path())).sum())
            .unwrap_or(0),
        Ok(m) if m.is_file() => m.len(),
        _ => std::fs::metadata(path).map(|m| m.len()).unwrap_or(0),
    }
}

/// The total size of a sandbox path (a file's size; directories are counted as they go).
async fn sandbox_size(sandbox: &Sandbox, path: &str) -> u64 {
    match sandbox.stat(path).await {
        Ok(stat) if stat.kind == FileKind::File => stat.size,
        _ => 0,
    }
}

/// Copy a host file or directory tree to `target` in the sandbox.
async fn upload(
    sandbox: &Sandbox,
    from: &Path,
    target: &str,
    progress: &Arc<Progress>,
    tally: &mut Tally,
) -> Result<(), Failure> {
    let meta = tokio::fs::metadata(from)
        .await
        .map_err(|e| Failure::failed(format!("{}: {e}", from.display())))?;
    if meta.is_file() {
        let file = tokio::fs::File::open(from)
            .await
            .map_err(|e| Failure::failed(format!("{}: {e}", from.display())))?;
        let counter = progress.clone();
        let stream: ByteStream = Box::pin(futures::stream::unfold(file, move |mut file| {
            let counter = counter.clone();
            async move {
                let mut buf = vec![0u8; CHUNK];
                match file.read(&mut buf).await {
                    Ok(0) => None,
                    Ok(n) => {
                        buf.truncate(n);
                        counter.add(n as u64);
                        Some((Ok(buf), file))
                    }
                    Err(e) => Some((
                        Err(sandcove::Error::from_io(&e, "reading the host file")),
                        file,
                    )),
                }
            }
        }));
        let mut options = WriteOptions::default();
        options.mode = Some(std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777);
        sandbox.write_stream(target, stream, options).await?;
        tally.files += 1;
        return Ok(());
    }
    if !meta.is_dir() {
        tally.skipped.push(from.display().to_string());
        return Ok(());
    }
    let mut mkdir = MkdirOptions::default();
    mkdir.parents = true;
    sandbox.mkdir_with(target, mkdir).await?;
    tally.dirs += 1;
    let mut entries = tokio::fs::read_dir(from)
        .await
        .map_err(|e| Failure::failed(format!("{}: {e}", from.display())))?;
    let mut children = Vec::new();
    while let Some(entry) = entries
        .next_entry()
        .await
        .map_err(|e| Failure::failed(format!("{}: {e}", from.display())))?
    {
        children.push(entry);
    }
    children.sort_by_key(|e| e.file_name());
    for entry in children {
        let path = entry.path();
        let kind = entry
            .file_type()
            .await
            .map_err(|e| Failure::failed(format!("{}: {e}", path.display())))?;
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            tally.skipped.push(path.display().to_string());
            continue;
        };
        if kind.is_symlink() || !(kind.is_file() || kind.is_dir()) {
            tally.skipped.push(path.display().to_string());
            continue;
        }
        let child = format!("{}/{name}", target.trim_end_matches('/'));
        Box::pin(upload(sandbox, &path, &child, progress, tally)).await?;
    }
    Ok(())
}

/// Copy a sandbox file or directory tree to `target` on this host.
async fn download(
    sandbox: &Sandbox,
    path: &str,
    target: &Path,
    progress: &Arc<Progress>,
    tally: &mut Tally,
) -> Result<(), Failure> {
    let stat = sandbox.stat(path).await?;
    let host_err = |e: std::io::Error| Failure::failed(format!("{}: {e}", target.display()));
    match stat.kind {
        FileKind::File => {
            let mut stream = sandbox.read_stream(path).await?;
            // O_NOFOLLOW: never write through a symlink standing at the target's name.
            let file = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(stat.mode & 0o777)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(target)
                .map_err(host_err)?;
            let mut file = tokio::fs::File::from_std(file);
            while let Some(chunk) = stream.next().await {
                let chunk = chunk?;
                progress.add(chunk.len() as u64);
                file.write_all(&chunk).await.map_err(host_err)?;
            }
            file.flush().await.map_err(host_err)?;
            tally.files += 1;
        }
        FileKind::Dir => {
            match std::fs::create_dir(target) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let real_dir = std::fs::symlink_metadata(target)
                        .map(|m| m.is_dir())
                        .unwrap_or(false);
                    if !real_dir {
                        return Err(Failure::failed(format!(
                            "{}: exists and is not a directory",
                            target.display()
                        )));
                    }
                }
                Err(e) => return Err(host_err(e)),
            }
            tally.dirs += 1;
            let mut entries = sandbox.list_dir(path, 1).await?;
            entries.sort_by(|a, b| a.name.cmp(&b.name));
            for entry in entries {
                let child = format!("{}/{}", path.trim_end_matches('/'), entry.name);
                if !plain_component(&entry.name) {
                    tally.skipped.push(child);
                    continue;
                }
                if !matches!(entry.kind, FileKind::File | FileKind::Dir) {
                    tally.skipped.push(child);
                    continue;
                }
                Box::pin(download(
                    sandbox,
                    &child,
                    &target.join(&entry.name),
                    progress,
                    tally,
                ))
                .await?;
            }
        }
        _ => tally.skipped.push(path.to_string()),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_parse_by_their_colon() {
        assert_eq!(
            parse_location("abc:/workspace/x"),
            Location::Sandbox {
                id: "abc".into(),
                path: "/workspace/x".into()
            }
        );
        assert_eq!(
            parse_location("abc:"),
            Location::Sandbox {
                id: "abc".into(),
                path: ".".into()
            }
        );
        for host in ["/tmp/a", "./a:b", "dir/a:b", "plain", ":x"] {
            assert_eq!(parse_location(host), Location::Host(host.into()), "{host}");
        }
    }

    #[test]
    fn only_plain_names_join_host_paths() {
        for bad in ["", ".", "..", "a/b", "a\0b"] {
            assert!(!plain_component(bad), "{bad:?}");
        }
        assert!(plain_component("..a"));
        assert_eq!(sandbox_basename("/workspace/dir/"), Some("dir"));
        assert_eq!(sandbox_basename("/"), None);
    }
}
