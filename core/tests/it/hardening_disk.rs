//! Hardening: host disk a sandbox can make the engine hold. Snapshot and fork archives store
//! sparse files sparse and are bounded by the sandbox's disk size; volumes are bounded by
//! their size quota.
//!
//! Runs as root and rootless (CI runs this binary again as an unprivileged user).

use crate::hardening_common as common;

use std::os::unix::fs::MetadataExt;

use sandcove::ErrorCode;
use sandcove::SnapshotOptions;
use sandcove_conformance::unique;

use common::{bash, Env};

/// Bytes of host disk a file takes (its allocated blocks, not its apparent size).
fn allocated(path: &std::path::Path) -> u64 {
    std::fs::metadata(path)
        .map(|m| m.blocks() * 512)
        .unwrap_or_else(|e| panic!("stat {}: {e}", path.display()))
}

/// The snapshot archives in the engine's state directory.
fn archives(env: &Env) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir(env.dir.join("snapshots")) else {
        return Vec::new();
    };
    entries.flatten().map(|e| e.path()).collect()
}

/// A 3 GiB sparse file in a 32 MiB sandbox: its snapshot archive takes a few MiB of host
/// disk, not 3 GiB (the root tmpfs keeps the 5 bytes written in a 2 MiB folio), and a fork and a sandbox restored from the snapshot have the file with
/// its apparent size, its data and its holes (reading as zeros, taking no space).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sparse_files_are_snapshotted_and_forked_sparse() {
    let env = Env::new("sparse");
    let mut opts = env.options(&unique("sparse"));
    opts.resources.disk_mib = Some(32);
    let id = env.create(opts).await;
    let made = bash(
        &*env.backend,
        &id,
        "truncate -s 3G /workspace/f && \
         printf hello | dd of=/workspace/f bs=1 seek=2147483648 conv=notrunc status=none && \
         echo made",
    )
    .await;
    assert_eq!(made.stdout_lossy(), "made\n", "{made:?}");

    let started = std::time::Instant::now();
    let snap = env
        .backend
        .snapshot(&id, SnapshotOptions::default())
        .await
        .expect("snapshot");
    let tar = env.dir.join("snapshots").join(format!("{}.tar", snap.id));
    assert!(
        snap.size < 4 << 20,
        "a sparse file is archived sparse: {} bytes",
        snap.size
    );
    assert!(
        allocated(&tar) < 4 << 20,
        "the archive takes {} bytes of host disk",
        allocated(&tar)
    );

    let check = "stat -c %s /workspace/f; du -k /workspace/f | cut -f1; \
                 dd if=/workspace/f bs=1 skip=2147483648 count=5 status=none; echo; \
                 dd if=/workspace/f bs=1M skip=1000 count=4 status=none | tr -d '\\0' | wc -c";
    let expect = |what: &str, out: sandcove::Output| {
        let text = out.stdout_lossy();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{what}: {out:?}");
        assert_eq!(lines[0], "3221225472", "{what}: apparent size kept");
        let kib: u64 = lines[1].parse().unwrap();
        assert!(kib <= 4096, "{what}: the holes take no space ({kib} KiB)");
        assert_eq!(lines[2], "hello", "{what}: the data kept");
        assert_eq!(lines[3], "0", "{what}: holes read as zeros");
    };
    let mut restored = env.options(&unique("sparse-restored"));
    restored.resources.disk_mib = Some(32);
    restored.snapshot = Some(snap.id.clone());
    let restored = env.create(restored).await;
    expect("restored", bash(&*env.backend, &restored, check).await);
    let mut forked = env.options(&unique("sparse-fork"));
    forked.resources.disk_mib = Some(32);
    let forked = env.backend.fork(&id, forked).await.expect("fork").id;
    expect("forked", bash(&*env.backend, &forked, check).await);
    println!(
        "hardening: a 3 GiB sparse file snapshotted into {} bytes ({} allocated) in {:?}; \
         restored and forked sparse",
        snap.size,
        allocated(&tar),
        started.elapsed()
    );
    env.backend.delete_snapshot(&snap.id).await.unwrap();
    for sandbox in [&id, &restored, &forked] {
        env.backend.destroy(sandbox).await.unwrap();
    }
}

/// A snapshot larger than its sandbox's disk size allows (its disk nearly full, and many
/// empty files whose archive headers the disk bound does not count) is refused with
/// `FileTooLarge` naming the bound; no archive or partial file is left, the sandbox runs on,
/// and a fork of it is refused the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_over_the_disk_bound_is_refused_and_leaves_nothing() {
    const DISK_MIB: u64 = 16;
    // Inodes enough for the empty files (the default bound, 64 per MiB, would stop them).
    let env = Env::new("snapbound");
    let mut bounds = env.local.sandbox_bounds();
    bounds.inodes_per_mib = 1024;
    let env = env.with_bounds(bounds);
    let mut opts = env.options(&unique("snapbound"));
    opts.resources.disk_mib = Some(DISK_MIB);
    let id = env.create(opts).await;
    // 15 MiB of data and 12,000 empty files (6 MB of tar headers): over 16 + 2 MiB.
    let made = bash(
        &*env.backend,
        &id,
        "head -c 15M /dev/urandom > /workspace/data && mkdir /workspace/many && \
         cd /workspace/many && seq 12000 | xargs touch && echo made",
    )
    .await;
    assert_eq!(made.stdout_lossy(), "made\n", "{made:?}");
    let limit = (DISK_MIB << 20) + (2 << 20);
    match env.backend.snapshot(&id, SnapshotOptions::default()).await {
        Err(sandcove::Error::FileTooLarge { limit: l, what, .. }) => {
            assert_eq!(l, limit, "the bound named");
            assert!(what.contains(&id), "{what}");
        }
        other => panic!("a snapshot over the disk bound: {other:?}"),
    }
    assert_eq!(
        archives(&env),
        Vec::<std::path::PathBuf>::new(),
        "nothing left"
    );
    assert!(env.backend.list_snapshots().await.unwrap().is_empty());
    let fork = env
        .backend
        .fork(&id, env.options(&unique("snapbound-fork")))
        .await;
    assert_eq!(
        fork.map(|i| i.id).unwrap_err().code(),
        ErrorCode::FileTooLarge
    );
    assert_eq!(
        archives(&env),
        Vec::<std::path::PathBuf>::new(),
        "nothing left"
    );
    // The source was resumed and still works; under the bound it snapshots again.
    let out = bash(&*env.backend, &id, "rm -r /workspace/many && echo ok").await;
    assert_eq!(out.stdout_lossy(), "ok\n", "{out:?}");
    let snap = env
        .backend
        .snapshot(&id, SnapshotOptions::default())
        .await
        .expect("under the bound");
    assert!(snap.size <= limit && snap.size > 15 << 20, "{}", snap.size);
    env.backend.delete_snapshot(&snap.id).await.unwrap();
    env.backend.destroy(&id).await.unwrap();
}

/// Pids of live processes holding `file` open (a volume's holder and its `fuse2fs` hold the
/// volume's image).
fn holding(file: &std::path::Path) -> Vec<u32> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for p in procs.flatten() {
        let Ok(pid) = p.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')
                    .map(|(_, rest)| rest.trim_start().starts_with('Z'))
            })
            .unwrap_or(true);
        if zombie {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        if fds
            .flatten()
            .filter_map(|fd| std::fs::read_link(fd.path()).ok())
            .any(|f| f == file)
        {
            out.push(pid);
        }
    }
    out
}

/// An engine whose new volumes have a quota of `mib` MiB.
fn env_with_volume_quota(tag: &str, mib: u64) -> Env {
    let mut env = Env::new(tag);
    env.local = env.local.clone().with_volume_size_mib(mib).expect("quota");
    env.backend = std::sync::Arc::new(env.local.clone());
    env
}

/// A volume of 16 MiB mounted in a sandbox of 16 MiB: writing 64 MiB into it fails with
/// `ENOSPC` inside, the host disk it takes stays within its quota, and what fits is kept:
/// shared with a second sandbox and read back by a third after both ended (its holder and
/// `fuse2fs` gone in between). Deleting it leaves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_is_bounded_by_its_quota() {
    const QUOTA_MIB: u64 = 16;
    let env = env_with_volume_quota("volquota", QUOTA_MIB);
    let name = "q";
    let info = env
        .backend
        .create_volume(name)
        .await
        .expect("create volume");
    assert_eq!(info.size_limit, Some(QUOTA_MIB << 20));
    let image = std::fs::canonicalize(env.dir.join("volumes").join(name).join("image")).unwrap();
    let mount = |path: &str| sandcove::VolumeMount::new(name, path);
    let mut a = env.options(&unique("volquota-a"));
    a.resources.disk_mib = Some(16);
    a.volumes = vec![mount("/data")];
    let a = env.create(a).await;
    let out = bash(
        &*env.backend,
        &a,
        "echo kept > /data/kept && mkdir /data/sub && echo deep > /data/sub/f; \
         dd if=/dev/zero of=/data/big bs=1M count=64 2>&1 | grep -o 'No space left on device'; \
         echo rc=${PIPESTATUS[0]}; df -k /data | tail -1 | awk '{print \"size_kib=\" $2}'",
    )
    .await;
    let text = out.stdout_lossy();
    assert!(text.contains("No space left on device"), "{out:?}");
    assert!(text.contains("rc=1"), "{out:?}");
    let kib: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("size_kib="))
        .expect("df")
        .parse()
        .unwrap();
    assert!(kib <= QUOTA_MIB * 1024, "the volume shows {kib} KiB");
    assert!(
        allocated(&image) <= QUOTA_MIB << 20,
        "the image takes {} bytes of host disk",
        allocated(&image)
    );
    // Shared with a second sandbox (a subpath of it too), while the first runs.
    let mut b = env.options(&unique("volquota-b"));
    b.volumes = vec![mount("/v"), {
        let mut m = mount("/sub");
        m.subpath = Some("sub".into());
        m
    }];
    let b = env.create(b).await;
    let out = bash(
        &*env.backend,
        &b,
        "cat /v/kept /sub/f; rm /v/big && echo freed",
    )
    .await;
    assert_eq!(out.stdout_lossy(), "kept\ndeep\nfreed\n", "{out:?}");
    env.backend.destroy(&a).await.unwrap();
    env.backend.destroy(&b).await.unwrap();
    common::eventually(common::PATIENCE, "the holder and fuse2fs end", || async {
        let left = holding(&image);
        common::holds(
            left.is_empty(),
            format!("processes {left:?} hold the image"),
        )
    })
    .await;
    // The data outlives them; a new holder serves it.
    let mut c = env.options(&unique("volquota-c"));
    c.volumes = vec![mount("/data")];
    let c = env.create(c).await;
    let out = bash(&*env.backend, &c, "cat /data/kept /data/sub/f; ls /data").await;
    assert_eq!(out.stdout_lossy(), "kept\ndeep\nkept\nsub\n", "{out:?}");
    env.backend.destroy(&c).await.unwrap();
    common::eventually(common::PATIENCE, "the holder ends again", || async {
        let left = holding(&image);
        common::holds(
            left.is_empty(),
            format!("processes {left:?} hold the image"),
        )
    })
    .await;
    env.backend.delete_volume(name).await.expect("delete");
    assert!(!env.dir.join("volumes").join(name).exists());
    env.assert_nothing_left("after the volume test").await;
}

/// The quota's bounds: a size outside 8 MiB to 1 TiB is refused.
#[test]
fn a_volume_quota_out_of_bounds_is_refused() {
    let env = Env::new("volbounds");
    for mib in [0, 7, (1 << 20) + 1] {
        let err = env.local.clone().with_volume_size_mib(mib).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument, "{mib}: {err}");
    }
    assert!(env.local.clone().with_volume_size_mib(8).is_ok());
}

/// A volume made before quotas (a plain `data/` directory, no image) still mounts and keeps
/// its files; it says it has no quota.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_made_before_quotas_still_mounts_unbounded() {
    let env = Env::new("vollegacy");
    let dir = env.dir.join("volumes").join("old");
    std::fs::create_dir_all(dir.join("data")).unwrap();
    std::fs::write(dir.join("data").join("f"), b"from before\n").unwrap();
    std::fs::write(
        dir.join("meta.json"),
        br#"{"name":"old","created_at":1700000000000}"#,
    )
    .unwrap();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        // As the engine made them: writable by the default sandbox user.
        let id = 0x7000_0000 + 1000;
        std::os::unix::fs::chown(dir.join("data"), Some(id), Some(id)).unwrap();
    }
    let info = env.backend.get_volume("old").await.expect("get");
    assert_eq!(info.size_limit, None);
    let mut opts = env.options(&unique("vollegacy"));
    opts.volumes = vec![sandcove::VolumeMount::new("old", "/data")];
    let id = env.create(opts).await;
    let out = bash(
        &*env.backend,
        &id,
        "cat /data/f && echo more > /data/g && echo ok",
    )
    .await;
    assert_eq!(out.stdout_lossy(), "from before\nok\n", "{out:?}");
    env.backend.destroy(&id).await.unwrap();
    env.backend.delete_volume("old").await.expect("delete");
}
