//! Building the sandbox: the root filesystem, mounts, volumes and network, before serving.

use super::*;
use std::os::fd::AsFd;

pub(super) fn unavailable(step: &str, err: std::io::Error) -> Error {
    Error::Unavailable {
        reason: format!("cannot set up the sandbox ({step}): {err}"),
        remedy: "the host must allow unprivileged user namespaces with mount and proc \
                 (sysctl kernel.unprivileged_userns_clone=1 / \
                 kernel.apparmor_restrict_unprivileged_userns=0; in a container, run it with \
                 a seccomp profile that allows unshare and mount); or set \
                 SANDCOVE_ALLOW_UNISOLATED=1 to run without isolation"
            .into(),
    }
}

/// Build the sandbox root: a tmpfs with the host's system directories read-only, a private
/// `/workspace`, `/tmp`, `/proc` and `/dev`, then pivot into it. `volume_trees` are the
/// detached mounts of the bounded volumes, in the order of their mounts. Returns an image
/// sandbox's writable layer (`O_PATH`), which no path reaches after the pivot, and whether
/// it is the whole root (a copied root) rather than overlayfs's upper directory.
pub(super) fn setup_sandbox(
    record: &Record,
    volume_trees: Vec<OwnedFd>,
    net: Option<&Plan>,
) -> Result<Option<(OwnedFd, bool)>> {
    // The engine's locale directory, opened while we still hold the engine's own host uid:
    // the state directory it lies in may be closed to the sandbox's root (see `locale`).
    // Without it, sandboxes read the host's locale files as they are.
    let locale = record
        .locale
        .as_deref()
        .and_then(|dir| sys::open_dir_path(Path::new(dir)).ok());
    // An image's layers, opened likewise, and the host's resolvers for its `/etc/resolv.conf`
    // (the host base shows the host's own).
    let layers = match &record.image {
        Some(image) => Some(super::image_root::open_layers(image)?),
        None => None,
    };
    let resolv_conf = layers.as_ref().and_then(|_| host_resolv_conf());
    // A snapshot's archive for an image sandbox's writable layer, likewise (the engine's
    // snapshot directory is closed to the sandbox's root).
    let restore = match &record.restore_archive {
        Some(path) => Some(
            std::fs::File::open(path)
                .map_err(|e| Error::from_io(&e, "open the snapshot's archive"))?,
        ),
        None => None,
    };
    // Become root of the new user namespace (a no-op in the single-uid mapping).
    become_ns_root().map_err(|e| unavailable("setuid in the user namespace", e))?;
    // Before anything else runs here: this namespace's share of the engine user's inotify,
    // fanotify and namespace budget (see `bounds`). A new namespace has no limit of its own.
    super::super::bounds::apply_user_limits(&record.bounds.user_limits())
        .map_err(|e| unavailable("bound the sandbox's inotify, fanotify and namespaces", e))?;
    let private = libc::MS_REC | libc::MS_PRIVATE;
    sys::mount(None, Path::new("/"), None, private, None)
        .map_err(|e| unavailable("make mounts private", e))?;
    // The new root is a tmpfs mounted over /tmp of this (private) mount namespace: always
    // reachable, unlike the state directory, which an unmapped sandbox root may not traverse.
    let root = PathBuf::from("/tmp");
    // Open the volume sources now: a source under the host's /tmp is hidden once the root
    // tmpfs is mounted there, but a descriptor opened first still reaches it (and belongs to
    // this mount namespace, so it can be bound).
    let mut volume_sources = Vec::new();
    let mut trees = volume_trees.into_iter();
    for m in &record.mounts {
        if m.bounded {
            let tree = trees.next().ok_or_else(|| {
                unavailable(
                    "attach a volume",
                    std::io::Error::other("its holder sent no mount"),
                )
            })?;
            volume_sources.push(tree);
            continue;
        }
        let dir =
            super::volumes::open_source(Path::new(&m.host_path), m.subpath.as_deref(), false, None)
                .map_err(|e| match &m.subpath {
                    Some(sub) => super::volumes::subpath_error(&m.path, sub, e),
                    None => unavailable(&format!("open volume directory {}", m.host_path), e),
                })?;
        volume_sources.push(dir);
    }
    mount_root_tmpfs(
        &root,
        record.disk_mib(),
        record.bounds.inodes_for(record.disk_mib()),
    )
    .map_err(|e| unavailable("mount the sandbox root", e))?;
    // An image's root: its layers under a writable layer kept on that tmpfs (a snapshot's
    // files unpacked into it first).
    let (root, upper) = match &layers {
        Some(layers) => {
            let made = super::image_root::mount(&root, layers, restore, record)?;
            (made.root, Some((made.writable, made.whole_root)))
        }
        None => (root, None),
    };
    let r = |p: &str| root.join(p.trim_start_matches('/'));
    let fs_err = |step: &str| {
        let step = step.to_string();
        move |e: std::io::Error| unavailable(&step, e)
    };

    let hostname = record
        .options
        .hostname
        .clone()
        .unwrap_or_else(|| record.id.chars().take(12).collect());
    match &layers {
        Some(_) => super::image_root::prepare(&root, record, &hostname, resolv_conf.as_deref())?,
        None => host_base(&root, record, &hostname, locale.as_ref())?,
    }

    // Volumes (staged by the monitor where the host path is out of our reach).
    // A mount point may lie inside an earlier volume, whose contents a sandbox wrote: it is
    // made and reached beneath the new root with no symlinks, never by a host path.
    let root_fd = sys::open_dir_path(&root).map_err(fs_err("open the sandbox root"))?;
    for (m, dir) in record.mounts.iter().zip(&volume_sources) {
        let rel = Path::new(m.path.trim_start_matches('/'));
        let shown = |e: std::io::Error| {
            Error::invalid(format!(
                "volume mount path {:?} cannot be made inside the sandbox: {e}",
                m.path
            ))
        };
        // A subpath a sandbox renames while its tree is being attached can vanish under the
        // detached tree (ENOENT at the attach or at a step on the attached mount after it):
        // the caller's subpath is gone, not the runtime.
        let lost = |step: &str, e: std::io::Error| match &m.subpath {
            Some(sub) if e.raw_os_error() == Some(libc::ENOENT) => {
                super::volumes::subpath_error(&m.path, sub, e)
            }
            _ => unavailable(step, e),
        };
        let target =
            super::volumes::dirs_beneath(root_fd.as_fd(), rel, true, None, false).map_err(shown)?;
        if m.bounded {
            sys::attach_mount(dir, &target).map_err(|e| lost("attach a volume", e))?;
        } else {
            sys::mount(
                Some(&sys::fd_path(dir.as_raw_fd())),
                &sys::fd_path(target.as_raw_fd()),
                None,
                libc::MS_BIND | libc::MS_REC,
                None,
            )
            .map_err(|e| unavailable("bind a volume", e))?;
        }
        // Reopened: the descriptor above is the directory under the new mount. Never setuid
        // or device files from a volume (a sandbox writes them, and the volume outlives it);
        // flags the host's mount locks are kept, as the kernel requires.
        let target = sys::open_beneath(root_fd.as_fd(), rel, libc::O_PATH, false).map_err(shown)?;
        let target = sys::fd_path(target.as_raw_fd());
        let keep = sys::locked_mount_flags(&target).map_err(|e| lost("statvfs", e))?;
        let read_only = if m.read_only { libc::MS_RDONLY } else { 0 };
        sys::mount(
            None,
            &target,
            None,
            libc::MS_REMOUNT | libc::MS_BIND | libc::MS_NOSUID | libc::MS_NODEV | read_only | keep,
            None,
        )
        .map_err(|e| lost("remount a volume nosuid and nodev", e))?;
    }

    // /proc of the new PID namespace.
    sys::mount(
        Some(Path::new("proc")),
        &r("proc"),
        Some("proc"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        None,
    )
    .map_err(|e| unavailable("mount /proc", e))?;

    // A minimal /dev: a few host devices bound in, a private devpts and shm.
    sys::mount(
        Some(Path::new("tmpfs")),
        &r("dev"),
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NOEXEC,
        Some(&format!(
            "mode=0755,size=64k,nr_inodes={}",
            super::super::bounds::DEV_INODES
        )),
    )
    .map_err(|e| unavailable("mount /dev", e))?;
    for dev in ["null", "zero", "full", "random", "urandom", "tty"] {
        let host = Path::new("/dev").join(dev);
        if host.exists() {
            let target = r("dev").join(dev);
            std::fs::write(&target, b"").map_err(fs_err("create /dev nodes"))?;
            sys::mount(Some(&host), &target, None, libc::MS_BIND, None)
                .map_err(|e| unavailable("bind /dev nodes", e))?;
        }
    }
    let shm = super::super::bounds::SHM_MIB;
    for d in ["pts", "shm"] {
        std::fs::create_dir_all(r("dev").join(d)).map_err(fs_err("create /dev dirs"))?;
    }
    if sys::mount(
        Some(Path::new("devpts")),
        &r("dev/pts"),
        Some("devpts"),
        libc::MS_NOSUID | libc::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=0620"),
    )
    .is_ok()
    {
        std::os::unix::fs::symlink("pts/ptmx", r("dev/ptmx")).map_err(fs_err("link ptmx"))?;
    }
    sys::mount(
        Some(Path::new("tmpfs")),
        &r("dev/shm"),
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some(&format!(
            "mode=1777,size={shm}m,nr_inodes={}",
            record.bounds.inodes_for(shm),
        )),
    )
    .map_err(|e| unavailable("mount /dev/shm", e))?;
    for (link, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        std::os::unix::fs::symlink(target, r("dev").join(link)).map_err(fs_err("link /dev"))?;
    }

    drop(volume_sources);
    std::env::set_current_dir(&root).map_err(fs_err("enter the sandbox root"))?;
    sys::pivot_root_here().map_err(|e| unavailable("pivot_root", e))?;
    std::env::set_current_dir("/").map_err(fs_err("chdir /"))?;
    let _ = sys::sethostname(&hostname);
    if record.options.network != sandcove_core::NetworkPolicy::Host {
        sys::loopback_up().map_err(|e| unavailable("bring up loopback", e))?;
    }
    match (&record.options.network, net) {
        (sandcove_core::NetworkPolicy::Internet, Some(plan)) => plan.apply().map_err(|e| {
            super::net::unavailable(&format!(
                "cannot block host, link-local and private ranges in the sandbox: {e}"
            ))
        })?,
        // Fail closed: never an Internet sandbox without its blocks.
        (sandcove_core::NetworkPolicy::Internet, None) => {
            return Err(super::net::unavailable(
                "no network plan reached the sandbox",
            ))
        }
        _ => {}
    }
    // The bounding set is emptied once here, for every process the agent will start; its
    // helpers keep their capabilities through the inheritable set (the reasoning is at
    // `sys::empty_bounding_set_keep_inheritable`). Still single-threaded, so no thread keeps
    // the old sets. A failure stops the create.
    sys::empty_bounding_set_keep_inheritable()
        .map_err(|e| unavailable("empty the capability bounding set", e))?;
    // Fail closed: no sandbox starts without its Landlock layer or its seccomp filter. The
    // filter goes last, on the agent itself: nothing the agent does from here on needs a
    // call it refuses, and every process it starts inherits it (with `no_new_privs`, which
    // `install` sets: the one place it is set for an isolated sandbox).
    // The writable layer stays readable to the agent's snapshots (and to nothing else: no
    // sandbox process holds a descriptor or a path to it).
    super::landlock::confine_to_root(
        record.landlock_optional,
        upper.as_ref().map(|(fd, _)| fd.as_fd()),
    )?;
    super::seccomp::install()?;
    Ok(upper)
}

/// The host base's root under `root`: the host's system directories read-only, the engine's
/// directories, the users' homes, and the engine's `/etc` files bound over the host's.
fn host_base(root: &Path, record: &Record, hostname: &str, locale: Option<&OwnedFd>) -> Result<()> {
    let r = |p: &str| root.join(p.trim_start_matches('/'));
    let fs_err = |step: &str| {
        let step = step.to_string();
        move |e: std::io::Error| unavailable(&step, e)
    };
    // Host system directories, read-only. One that is a symlink on the host (`/lib64 ->
    // usr/lib64` on merged-/usr hosts) is not recreated as one: a symlink in the sandbox's
    // root is the sandbox root's to replace, and the agent's `tar`, which keeps the agent's
    // capabilities, finds its loader and libraries through `/lib64` and `/lib`. The
    // directory it leads to is bound instead, a mount point no sandbox process can rename;
    // one leading outside the directories bound here is left out, as it led nowhere.
    const SYSTEM_DIRS: [&str; 9] = [
        "usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "opt",
    ];
    let bound_whole = |d: &str| {
        let host = Path::new("/").join(d);
        std::fs::symlink_metadata(&host).is_ok_and(|m| m.is_dir())
    };
    for d in SYSTEM_DIRS {
        let host = Path::new("/").join(d);
        let Ok(meta) = std::fs::symlink_metadata(&host) else {
            continue;
        };
        if meta.file_type().is_symlink() {
            let Ok(target) = std::fs::canonicalize(&host) else {
                continue;
            };
            let inside = SYSTEM_DIRS
                .iter()
                .any(|s| bound_whole(s) && target.starts_with(Path::new("/").join(s)));
            if inside && target.is_dir() {
                bind_readonly(&target, &r(d))?;
            }
        } else if meta.is_dir() {
            bind_readonly(&host, &r(d))?;
        }
    }
    if let Some(dir) = locale {
        bind_locale(dir, &r(super::super::locale::HOST_LOCALE_DIR))?;
    }
    for d in [
        "workspace",
        "tmp",
        "var/tmp",
        "root",
        "home",
        "run",
        "proc",
        "dev",
        "mnt",
        "srv",
        ".sandcove",
    ] {
        std::fs::create_dir_all(r(d)).map_err(fs_err("create sandbox directories"))?;
    }
    for d in ["tmp", "var/tmp"] {
        std::fs::set_permissions(r(d), std::fs::Permissions::from_mode(0o1777))
            .map_err(fs_err("chmod /tmp"))?;
    }
    std::fs::set_permissions(r("root"), std::fs::Permissions::from_mode(0o700))
        .map_err(fs_err("chmod /root"))?;
    for user in &record.users {
        let home = r(&user.home);
        std::fs::create_dir_all(&home).map_err(fs_err("create a home directory"))?;
        std::os::unix::fs::chown(&home, Some(user.uid), Some(user.gid))
            .map_err(fs_err("chown a home directory"))?;
    }

    // Our own user database, hostname and hosts file over the read-only /etc.
    let etc_files = [
        ("passwd", record.passwd()),
        ("group", record.group()),
        ("hostname", format!("{hostname}\n")),
        (
            "hosts",
            format!("127.0.0.1 localhost {hostname}\n::1 localhost ip6-localhost\n"),
        ),
    ];
    if r("etc").is_dir() {
        for (name, contents) in etc_files {
            let src = r(".sandcove").join(name);
            std::fs::write(&src, contents).map_err(fs_err("write /etc files"))?;
            let dst = r("etc").join(name);
            if dst.exists() {
                sys::mount(Some(&src), &dst, None, libc::MS_BIND, None)
                    .map_err(|e| unavailable("bind /etc files", e))?;
            }
        }
    }
    Ok(())
}

/// The host's `/etc/resolv.conf` (bounded), for an image sandbox's own.
fn host_resolv_conf() -> Option<Vec<u8>> {
    let file = std::fs::File::open("/etc/resolv.conf").ok()?;
    let mut text = Vec::new();
    file.take(64 << 10).read_to_end(&mut text).ok()?;
    Some(text)
}

pub(super) fn become_ns_root() -> std::io::Result<()> {
    // In the range mapping our host uid (root) is unmapped; take uid 0 of the namespace so
    // files we create belong to sandbox root.
    let _ = sys::setrlimit(libc::RLIMIT_CORE, 0);
    if sys::geteuid() != 0 {
        sys::set_all_ids(0, 0)?;
    }
    Ok(())
}

/// Bind the engine's locale directory (`dir`) read-only over `target`, the sandbox's
/// `/usr/lib/locale`, where that is a directory. Every sandbox of the engine shares the
/// directory, so a bind that cannot be made read-only fails the setup.
fn bind_locale(dir: &OwnedFd, target: &Path) -> Result<()> {
    if !target.is_dir() {
        return Ok(());
    }
    let source = sys::fd_path(dir.as_raw_fd());
    sys::mount(Some(&source), target, None, libc::MS_BIND, None)
        .map_err(|e| unavailable("bind the locale directory", e))?;
    let keep = sys::locked_mount_flags(target).map_err(|e| unavailable("statvfs", e))?;
    sys::mount(
        None,
        target,
        None,
        libc::MS_REMOUNT
            | libc::MS_BIND
            | libc::MS_RDONLY
            | libc::MS_NOSUID
            | libc::MS_NODEV
            | libc::MS_NOEXEC
            | keep,
        None,
    )
    .map_err(|e| unavailable("remount the locale directory read-only", e))
}

pub(super) fn bind_readonly(host: &Path, target: &Path) -> Result<()> {
    std::fs::create_dir_all(target).map_err(|e| unavailable("create a mount point", e))?;
    sys::mount(Some(host), target, None, libc::MS_BIND | libc::MS_REC, None)
        .map_err(|e| unavailable("bind a system directory", e))?;
    let keep = sys::locked_mount_flags(host).map_err(|e| unavailable("statvfs", e))?;
    sys::mount(
        None,
        target,
        None,
        libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | libc::MS_NOSUID | keep,
        None,
    )
    .map_err(|e| unavailable("remount a system directory read-only", e))
}

/// Mount the sandbox's root tmpfs at `root`, `disk_mib` MiB large with `inodes` inodes (see
/// `bounds`: without `nr_inodes` empty files would cost the host unbounded kernel memory).
///
/// `huge=within_size` lets the tmpfs keep a file in large folios (up to 2 MiB) where the file
/// covers them: writing 100 MiB allocates, charges and later frees about a hundred folios
/// instead of 25,600 pages (on the benchmark machine it took a fifth of the time it takes
/// with 4 KiB pages), while a small file still takes small pages, so no sandbox pays memory
/// or disk quota for it. Where the kernel has no transparent huge pages the option is
/// refused with `EINVAL`, and the root is mounted without it: the option changes speed, never
/// isolation or limits.
fn mount_root_tmpfs(root: &Path, disk_mib: u64, inodes: u64) -> std::io::Result<()> {
    let flags = libc::MS_NOSUID | libc::MS_NODEV;
    let plain = format!("size={disk_mib}m,nr_inodes={inodes},mode=0755");
    let tmpfs = Some(Path::new("tmpfs"));
    match sys::mount(
        tmpfs,
        root,
        Some("tmpfs"),
        flags,
        Some(&format!("{plain},huge=within_size")),
    ) {
        // `sys::mount` keeps the error's kind, not its errno: `EINVAL` is `InvalidInput`.
        Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
            sys::mount(tmpfs, root, Some("tmpfs"), flags, Some(&plain))
        }
        other => other,
    }
}
