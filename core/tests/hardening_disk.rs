//! Hardening: host disk a sandbox can make the engine hold. Snapshot and fork archives store
//! sparse files sparse and are bounded by the sandbox's disk size; volumes are bounded by
//! their size quota.
//!
//! Runs as root and rootless (CI runs this binary again as an unprivileged user).

#[path = "hardening_common.rs"]
mod common;

use std::os::unix::fs::MetadataExt;

use sandcove::conformance::unique;
use sandcove::ErrorCode;

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
    let snap = env.backend.snapshot(&id, None).await.expect("snapshot");
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
    let env = Env::new("snapbound");
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
    match env.backend.snapshot(&id, None).await {
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
        .snapshot(&id, None)
        .await
        .expect("under the bound");
    assert!(snap.size <= limit && snap.size > 15 << 20, "{}", snap.size);
    env.backend.delete_snapshot(&snap.id).await.unwrap();
    env.backend.destroy(&id).await.unwrap();
}
