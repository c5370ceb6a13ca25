//! Watching a directory tree for changes (inotify).

use super::*;
use std::os::fd::AsFd;

pub(super) const WATCH_MASK: u32 = libc::IN_CREATE
    | libc::IN_MODIFY
    | libc::IN_CLOSE_WRITE
    | libc::IN_DELETE
    | libc::IN_MOVED_FROM
    | libc::IN_MOVED_TO
    | libc::IN_ATTRIB
    | libc::IN_DELETE_SELF
    | libc::IN_ONLYDIR;

/// Directories under watch: watch descriptor → root-relative path.
pub(super) type Watched = HashMap<i32, PathBuf>;

/// The caller's error when the sandbox's inotify share (see `bounds`) is used up: a typed
/// `RateLimited`, which is what E2B answers such a `resource_exhausted` with, naming the limit
/// and what frees it; `None` for any other failure.
pub(super) fn exhausted(e: &std::io::Error, record: &Record) -> Option<Error> {
    let (what, limit) = match e.raw_os_error() {
        // `inotify_init1`: the per-user instance count (or the agent's descriptors).
        Some(libc::EMFILE | libc::ENFILE) => ("instances", record.bounds.inotify_instances),
        // `inotify_add_watch`: the per-user watch count.
        Some(libc::ENOSPC) => ("watches", record.bounds.inotify_watches),
        _ => return None,
    };
    Some(Error::RateLimited {
        message: format!(
            "the sandbox's inotify {what} are used up ({limit} for each of its users, its \
             processes' and its watches' together): end a watch, or a process watching files"
        ),
        retry_after_ms: None,
    })
}

/// Add a watch on a held directory (through our own `/proc/self/fd`, so the watch lands on
/// that directory, never on what a path names now) and, when `recursive`, on every directory
/// below it (opened by descriptor, no links, not into /proc). Returns the entries found below
/// (for reporting what was created before the watch existed). Running out of watches is an
/// error (a watch silently blind to part of its tree would report nothing there); any other
/// directory that cannot be watched (gone, unreadable) is left out.
pub(super) fn watch_tree(
    inotify: std::os::fd::RawFd,
    top: OwnedFd,
    rel: PathBuf,
    recursive: bool,
    dirs: &mut Watched,
) -> std::io::Result<Vec<(PathBuf, bool)>> {
    let mut found = Vec::new();
    let mut queue = VecDeque::from([(top, rel)]);
    while let Some((dir, rel)) = queue.pop_front() {
        let by_fd = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()));
        match sys::inotify_add_watch(inotify, &by_fd, WATCH_MASK) {
            Ok(wd) => {
                dirs.insert(wd, rel.clone());
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => return Err(e),
            Err(_) => {}
        }
        if !recursive {
            continue;
        }
        let Ok(read) = std::fs::read_dir(&by_fd) else {
            continue;
        };
        let mut names: Vec<_> = read.flatten().map(|e| e.file_name()).collect();
        names.sort();
        for name in names {
            let child = rel.join(&name);
            // Not following a final symlink: `by_fd` is the held directory itself.
            let written = std::fs::symlink_metadata(by_fd.join(&name))
                .is_ok_and(|m| m.is_file() && m.len() > 0);
            if let Some(sub) = files::open_subdir(&dir, &name) {
                queue.push_back((sub, child.clone()));
            }
            found.push((child, written));
        }
    }
    Ok(found)
}

/// Watch a directory with inotify, streaming events until the client goes away.
pub(super) async fn watch(
    agent: &Arc<Agent>,
    stream: &mut impl Conn,
    path: &str,
    options: WatchOptions,
) -> Result<()> {
    let fd = sys::inotify_init().map_err(|e| {
        exhausted(&e, &agent.record()).unwrap_or_else(|| Error::from_io(&e, "inotify"))
    })?;
    let (rec, p, raw) = (agent.record(), path.to_string(), fd.as_raw_fd());
    let recursive = options.recursive;
    // Resolving and scanning touch the filesystem: off the event loop, as the caller's user
    // if one is named (the kernel then checks that user may search and read the directory).
    // (`fd` outlives the closure: it is awaited here.)
    let (root, mut dirs) = as_user(&agent.record(), options.user.clone(), move || {
        let sandbox_root = files::open_root(&rec)?;
        let (top, rel) = files::open_dir(&sandbox_root, &rec, &p)?;
        // The top directory must be watched: a failure (no permission, no watches left) is
        // the caller's error, not a watch that never reports anything.
        let by_fd = PathBuf::from(format!("/proc/self/fd/{}", top.as_raw_fd()));
        let refused =
            |e: std::io::Error| exhausted(&e, &rec).unwrap_or_else(|| Error::from_io(&e, &p));
        sys::inotify_add_watch(raw, &by_fd, WATCH_MASK).map_err(refused)?;
        let mut dirs = Watched::new();
        watch_tree(raw, top, rel.clone(), recursive, &mut dirs).map_err(refused)?;
        Ok((rel, dirs))
    })
    .await?;
    let fd = sys::async_fd(fd).map_err(|e| Error::from_io(&e, "inotify"))?;
    done(stream).await?;
    let (mut rd, mut wr) = tokio::io::split(&mut *stream);
    let mut buf = vec![0u8; 64 * 1024];
    let mut probe = [0u8; 1];
    // API writes in flight: target path → whether the target existed when the write began.
    let mut api_writes: HashMap<PathBuf, bool> = HashMap::new();
    let event_of = |changed: &Path, kind: FsEventKind| FsEvent {
        path: files::encode_name(Path::new("/").join(changed).as_os_str()),
        name: changed
            .strip_prefix(&root)
            .map(|p| files::encode_name(p.as_os_str()))
            .unwrap_or_default(),
        kind,
    };
    loop {
        tokio::select! {
            // The client closing its side ends the watch.
            r = rd.read(&mut probe) => {
                if matches!(r, Ok(0) | Err(_)) {
                    return Ok(());
                }
            }
            ready = fd.readable() => {
                let Ok(mut guard) = ready else { return Ok(()) };
                let n = match guard.try_io(|f| sys::read_fd(f.as_fd(), &mut buf)) {
                    Ok(Ok(n)) => n,
                    Ok(Err(_)) => return Ok(()),
                    Err(_would_block) => continue,
                };
                for ev in sys::parse_inotify(&buf[..n]) {
                    let Some(dir) = dirs.get(&ev.wd).cloned() else { continue };
                    let full = if ev.name.is_empty() { dir.clone() } else { dir.join(&ev.name) };
                    // An API write goes through a temporary file renamed over its target: hide
                    // the temporary file, and report the landing as what it is for the target
                    // (a create and a write, or a write).
                    if let Some((target, existed)) = files::temp_target(&ev.name) {
                        let target = dir.join(target);
                        if ev.mask & libc::IN_CREATE != 0 {
                            api_writes.insert(target, existed);
                        } else if ev.mask & libc::IN_DELETE != 0 {
                            api_writes.remove(&target);
                        }
                        continue;
                    }
                    let landed = if ev.mask & libc::IN_MOVED_TO != 0 {
                        api_writes.remove(&full)
                    } else {
                        None
                    };
                    if let Some(existed) = landed {
                        let kinds: &[FsEventKind] = match (existed, options.report_ownership) {
                            (true, _) => &[FsEventKind::Write],
                            (false, false) => &[FsEventKind::Create, FsEventKind::Write],
                            (false, true) => {
                                &[FsEventKind::Create, FsEventKind::Chmod, FsEventKind::Write]
                            }
                        };
                        for &kind in kinds {
                            let event = event_of(&full, kind);
                            if proto::write_frame(&mut wr, &AgentReply::FsEvent { event }, &[]).await.is_err() {
                                return Ok(());
                            }
                        }
                        continue;
                    }
                    let kind = if ev.mask & libc::IN_CREATE != 0 {
                        FsEventKind::Create
                    } else if ev.mask & (libc::IN_MODIFY | libc::IN_CLOSE_WRITE) != 0 {
                        if ev.mask & libc::IN_CLOSE_WRITE != 0 {
                            // A write is already reported on modify; close adds nothing.
                            continue;
                        }
                        FsEventKind::Write
                    } else if ev.mask & (libc::IN_DELETE | libc::IN_DELETE_SELF) != 0 {
                        FsEventKind::Remove
                    } else if ev.mask & (libc::IN_MOVED_FROM | libc::IN_MOVED_TO) != 0 {
                        FsEventKind::Rename
                    } else if ev.mask & libc::IN_ATTRIB != 0 {
                        FsEventKind::Chmod
                    } else {
                        continue;
                    };
                    let mut changes = vec![(full.clone(), kind)];
                    if options.recursive
                        && ev.mask & libc::IN_ISDIR != 0
                        && ev.mask & (libc::IN_CREATE | libc::IN_MOVED_TO) != 0
                    {
                        // Watch the new directory, then report what was already created in it
                        // before the watch existed (a `mkdir -p a/b && touch a/b/f` race).
                        // Opened beneath its watched parent without following links, off the
                        // event loop.
                        let (rec, name, raw) = (agent.record(), ev.name.clone(), fd.as_raw_fd());
                        let (parent, new_rel) = (dir.clone(), full.clone());
                        let user = options.user.clone();
                        let scanned = as_user(&agent.record(), user, move || {
                            let sandbox_root = files::open_root(&rec)?;
                            let parent = files::open_dir(
                                &sandbox_root,
                                &rec,
                                &files::encode_name(Path::new("/").join(&parent).as_os_str()),
                            )?;
                            let mut added = Watched::new();
                            let found = match files::open_subdir(&parent.0, &name) {
                                Some(sub) => watch_tree(raw, sub, new_rel, true, &mut added)
                                    .map_err(|e| exhausted(&e, &rec)
                                        .unwrap_or_else(|| Error::from_io(&e, "inotify")))?,
                                None => Vec::new(),
                            };
                            Ok((added, found))
                        })
                        .await;
                        // Out of watches: the stream ends with the typed error, never blind
                        // to the new directory without saying so.
                        if let Err(error @ Error::RateLimited { .. }) = &scanned {
                            let reply = AgentReply::error(error);
                            let _ = proto::write_frame(&mut wr, &reply, &[]).await;
                            return Ok(());
                        }
                        if let Ok((added, found)) = scanned {
                            dirs.extend(added);
                            for (path, written) in found {
                                // An API write caught mid-way: remember it like one seen live,
                                // so its landing is reported as a create and a write.
                                let name = path.file_name().unwrap_or_default();
                                if let Some((target, existed)) = files::temp_target(name) {
                                    let parent = path.parent().unwrap_or(Path::new(""));
                                    api_writes.insert(parent.join(target), existed);
                                    continue;
                                }
                                changes.push((path.clone(), FsEventKind::Create));
                                if written {
                                    changes.push((path, FsEventKind::Write));
                                }
                            }
                        }
                    }
                    for (changed, kind) in changes {
                        let event = event_of(&changed, kind);
                        if proto::write_frame(&mut wr, &AgentReply::FsEvent { event }, &[]).await.is_err() {
                            return Ok(());
                        }
                    }
                }
            }
        }
    }
}
