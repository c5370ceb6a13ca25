//! Snapshots, forks and volumes.

use super::*;
use sandcove::SnapshotOptions;

/// Snapshots capture files (not processes); sandboxes start from them; fork copies files.
pub async fn snapshots_and_fork_copy_files_not_processes(backend: &dyn Backend) {
    let id = create(backend, &unique("snap")).await;
    if !backend.capabilities().snapshots {
        expect_code(
            backend.snapshot(&id, SnapshotOptions::default()).await,
            ErrorCode::NotSupported,
            "snapshot",
        );
        backend.destroy(&id).await.expect("destroy");
        return;
    }
    write(backend, &id, "project/data.bin", &[0, 1, 2, 255]).await;
    sh(
        backend,
        &id,
        "mkdir -p /tmp/t && echo tmp > /tmp/t/x && chmod 600 project/data.bin",
    )
    .await;
    let marker = unique("snapproc");
    let spec = ProcessSpec::new(Command::bash_login(format!("exec -a {marker} sleep 600")));
    drop(backend.spawn(&id, spec).await.expect("spawn"));
    let snap = backend
        .snapshot(&id, SnapshotOptions::default().name("first"))
        .await
        .expect("snapshot");
    assert_eq!(snap.sandbox_id, id);
    assert!(backend
        .list_snapshots()
        .await
        .expect("list")
        .iter()
        .any(|s| s.id == snap.id));
    assert_eq!(
        backend.get(&id).await.expect("get").state,
        SandboxState::Running,
        "resumed"
    );
    let mut options = test_options(&unique("fromsnap"));
    options.snapshot = Some(snap.id.clone());
    let restored = backend
        .create(options)
        .await
        .expect("create from snapshot")
        .id;
    assert_eq!(
        read(backend, &restored, "project/data.bin")
            .await
            .expect("read"),
        [0, 1, 2, 255]
    );
    assert_eq!(
        sh(
            backend,
            &restored,
            "cat /tmp/t/x; stat -c %a project/data.bin"
        )
        .await
        .stdout,
        b"tmp\n600\n"
    );
    let ps = sh(
        backend,
        &restored,
        &format!("ps -eo args | grep -c '^{marker}' || true"),
    )
    .await;
    assert_eq!(ps.stdout_lossy().trim(), "0", "processes are not copied");
    let forked = backend
        .fork(&id, test_options(&unique("fork")))
        .await
        .expect("fork")
        .id;
    assert_eq!(
        read(backend, &forked, "project/data.bin")
            .await
            .expect("read"),
        [0, 1, 2, 255]
    );
    write(backend, &forked, "project/data.bin", b"changed").await;
    assert_eq!(
        read(backend, &id, "project/data.bin").await.expect("read"),
        [0, 1, 2, 255],
        "a copy"
    );
    backend
        .delete_snapshot(&snap.id)
        .await
        .expect("delete snapshot");
    assert!(backend
        .list_snapshots()
        .await
        .expect("list")
        .iter()
        .all(|s| s.id != snap.id));
    let mut options = test_options("gone-snapshot");
    options.snapshot = Some(snap.id.clone());
    expect_code(
        backend.create(options).await,
        ErrorCode::NotFound,
        "create from a deleted snapshot",
    );
    for sandbox in [&id, &restored, &forked] {
        backend.destroy(sandbox).await.expect("destroy");
    }
}

/// A volume is shared between sandboxes and outlives them; subpaths mount a directory of it.
pub async fn volumes_outlive_sandboxes(backend: &dyn Backend) {
    let name = unique("vol");
    if !backend.capabilities().volumes {
        expect_code(
            backend.create_volume(&name).await,
            ErrorCode::NotSupported,
            "volume",
        );
        expect_code(
            backend.get_volume(&name).await,
            ErrorCode::NotSupported,
            "get volume",
        );
        expect_code(
            backend.list_volumes().await,
            ErrorCode::NotSupported,
            "list volumes",
        );
        expect_code(
            backend.delete_volume(&name).await,
            ErrorCode::NotSupported,
            "delete volume",
        );
        return;
    }
    let vol = backend.create_volume(&name).await.expect("create volume");
    assert_eq!(vol.name, name);
    expect_code(
        backend.create_volume(&name).await,
        ErrorCode::AlreadyExists,
        "twice",
    );
    let mount = |path: &str, subpath: Option<&str>| {
        let mut mount = VolumeMount::new(name.clone(), path);
        mount.subpath = subpath.map(String::from);
        mount
    };
    let mut a = test_options(&unique("vola"));
    a.volumes = vec![mount("/data", None)];
    let a = backend.create(a).await.expect("create a").id;
    assert!(sh(
        backend,
        &a,
        "mkdir -p /data/sub && echo shared > /data/sub/f && echo top > /data/t"
    )
    .await
    .exit_status()
    .success());
    let mut b = test_options(&unique("volb"));
    b.volumes = vec![mount("/mnt/v", None), mount("/mnt/sub", Some("sub"))];
    let b = backend.create(b).await.expect("create b").id;
    assert_eq!(
        sh(backend, &b, "cat /mnt/v/sub/f /mnt/sub/f; ls /mnt/sub")
            .await
            .stdout_lossy(),
        "shared\nshared\nf\n"
    );
    expect_code(
        backend.delete_volume(&name).await,
        ErrorCode::InvalidState,
        "delete while mounted",
    );
    backend.destroy(&a).await.expect("destroy");
    backend.destroy(&b).await.expect("destroy");
    let mut c = test_options(&unique("volc"));
    c.volumes = vec![mount("/data", None)];
    let c = backend.create(c).await.expect("create c").id;
    assert_eq!(
        read(backend, &c, "/data/t").await.expect("read"),
        b"top\n",
        "data outlives its writers"
    );
    backend.destroy(&c).await.expect("destroy");
    assert!(backend
        .list_volumes()
        .await
        .expect("list")
        .iter()
        .any(|v| v.name == name));
    assert!(backend.get_volume(&name).await.expect("get").size >= 11);
    backend.delete_volume(&name).await.expect("delete");
    expect_code(
        backend.get_volume(&name).await,
        ErrorCode::NotFound,
        "deleted",
    );
    let mut d = test_options("missing-volume");
    d.volumes = vec![mount("/data", None)];
    expect_code(
        backend.create(d).await,
        ErrorCode::NotFound,
        "mount a missing volume",
    );
}

/// A snapshot asked to keep processes and memory, where snapshots keep files only, is
/// refused before any effect: no files-only snapshot the caller did not ask for.
pub async fn a_snapshot_asked_to_keep_memory_is_refused_first(backend: &dyn Backend) {
    let id = create(backend, &unique("snapmem")).await;
    let before = backend.list_snapshots().await.map(|s| s.len()).ok();
    let asked = SnapshotOptions::default()
        .name(unique("withmemory"))
        .memory(true);
    expect_code(
        backend.snapshot(&id, asked).await,
        ErrorCode::NotSupported,
        "a snapshot that keeps memory",
    );
    assert_eq!(
        backend.list_snapshots().await.map(|s| s.len()).ok(),
        before,
        "nothing was taken"
    );
    assert_eq!(
        backend.get(&id).await.expect("get").state,
        SandboxState::Running,
        "the sandbox was not paused for it"
    );
    backend.destroy(&id).await.expect("destroy");
}
