//! Image roots on the embedded engine: an image's layers (made here, in overlayfs's format, as
//! the image store unpacks them) become a sandbox's root under a writable layer of its own,
//! with the engine's directories and `/etc` files made beneath the root's descriptor whatever
//! the image holds at those paths.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sandcove::backend::local::images::{ImageRoot, ImageRootMode, ImageSource};
use sandcove::{
    Backend, ByteStream, Command, CreateOptions, ErrorCode, LocalBackend, MkdirOptions,
    ProcessSpec, RemoveOptions, WriteOptions,
};
use sandcove_conformance::images::{host_program_files, shell_image, Layer};
use sandcove_conformance::{names_in, read, run, sh, test_options, unique};

/// The uid the engine's root maps sandbox root to (its `HOST_ID_BASE`): as the store does when
/// the engine runs as root, layer files are owned by it.
const HOST_ID_BASE: u32 = 0x7000_0000;

/// Images made by a test: one reference, its layers.
#[derive(Debug)]
struct TestImages {
    reference: String,
    root: ImageRoot,
}

impl ImageSource for TestImages {
    fn resolve(&self, reference: &str) -> sandcove::Result<ImageRoot> {
        if reference == self.reference {
            Ok(self.root.clone())
        } else {
            Err(sandcove::Error::not_found(format!("image {reference:?}")))
        }
    }

    fn references(&self) -> Vec<String> {
        vec![self.reference.clone()]
    }
}

/// A directory removed at the end of the test.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Copy a host file into `layer` at its own path (its content, not its name: the layer owns
/// the copy).
fn copy_in(layer: &Path, host: &str) {
    let dest = layer.join(host.trim_start_matches('/'));
    std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
    std::fs::copy(std::fs::canonicalize(host).unwrap(), &dest).unwrap();
}

/// A whiteout in overlayfs's format: a 0:0 character device.
fn whiteout(path: &Path) {
    let status = std::process::Command::new("mknod")
        .arg(path)
        .args(["c", "0", "0"])
        .status()
        .expect("mknod");
    assert!(status.success(), "mknod a whiteout");
}

/// Own every entry under `dir` as the engine's mapped root would see the store's files.
fn chown_tree(dir: &Path, uid: u32) {
    std::os::unix::fs::lchown(dir, Some(uid), Some(uid)).unwrap();
    if std::fs::symlink_metadata(dir).unwrap().is_dir() {
        for entry in std::fs::read_dir(dir).unwrap() {
            chown_tree(&entry.unwrap().path(), uid);
        }
    }
}

/// A two-layer image with hostile entries where the engine makes its own, plus a `sentinel`
/// host file and an `outside` host directory those entries name.
struct Fixture {
    scratch: Scratch,
    reference: String,
    root: ImageRoot,
    /// How its engines compose the root.
    mode: ImageRootMode,
}

impl Fixture {
    /// The fixture with its engines composing roots as the host allows (overlayfs here).
    fn new() -> Fixture {
        Fixture::with_mode(ImageRootMode::Auto)
    }

    fn with_mode(mode: ImageRootMode) -> Fixture {
        let base = std::env::temp_dir().join(unique("image-root"));
        std::fs::create_dir_all(&base).unwrap();
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
        let scratch = Scratch(base.clone());
        let (lower, upper) = (base.join("layer0"), base.join("layer1"));
        // A shell, and `truncate` and `tail` for sparse files (with the libraries they load:
        // the image tests' shared list).
        for file in ["/bin/sh", "/usr/bin/truncate", "/usr/bin/tail"]
            .into_iter()
            .flat_map(host_program_files)
        {
            copy_in(&lower, &file.to_string_lossy());
        }
        let w = |layer: &Path, path: &str, text: &str| {
            let p = layer.join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        };
        w(
            &lower,
            "etc/passwd",
            "root:x:0:0:root:/root:/bin/sh\nimg:x:4242:4242::/nonexistent:/bin/sh\n",
        );
        w(&lower, "data/keep", "kept\n");
        w(&lower, "data/gone", "deleted by the next layer\n");
        w(&lower, "opq/old", "hidden by an opaque directory\n");
        w(&lower, "etc/motd", "lower\n");
        // As the store leaves a setuid program: the bit stripped on disk, the image's mode
        // recorded aside.
        w(&lower, "bin/tool", "#!/bin/sh\n");
        std::fs::set_permissions(
            lower.join("bin/tool"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        let tool =
            std::ffi::CString::new(lower.join("bin/tool").to_string_lossy().as_bytes()).unwrap();
        // SAFETY: valid C strings and a value buffer of the given length.
        let set = unsafe {
            libc::setxattr(
                tool.as_ptr(),
                c"user.sandcove.mode".as_ptr(),
                b"4755".as_ptr().cast(),
                4,
                0,
            )
        };
        assert_eq!(set, 0, "record the setuid mode");
        // Writable by the sandbox's default user (not root when the engine runs as root).
        for (path, mode) in [("data", 0o777), ("data/keep", 0o666)] {
            std::fs::set_permissions(lower.join(path), std::fs::Permissions::from_mode(mode))
                .unwrap();
        }
        // Where the engine makes its own: symlinks to the host's tree, which it must never
        // follow (until the pivot, an absolute name is the host's).
        std::fs::write(base.join("sentinel"), "host file\n").unwrap();
        std::fs::create_dir(base.join("outside")).unwrap();
        std::os::unix::fs::symlink(base.join("sentinel"), lower.join("etc/hosts")).unwrap();
        std::os::unix::fs::symlink(base.join("outside"), lower.join("tmp")).unwrap();
        std::os::unix::fs::symlink("/", lower.join("proc")).unwrap();
        std::os::unix::fs::symlink(base.join("outside"), lower.join("workspace")).unwrap();
        // The upper layer: a whiteout, an opaque directory, a changed file.
        std::fs::create_dir_all(upper.join("data")).unwrap();
        whiteout(&upper.join("data/gone"));
        // A directory's attributes are its topmost layer's.
        std::fs::set_permissions(upper.join("data"), std::fs::Permissions::from_mode(0o777))
            .unwrap();
        std::fs::create_dir_all(upper.join("opq")).unwrap();
        w(&upper, "opq/new", "upper\n");
        w(&upper, "etc/motd", "upper\n");
        let opq = std::ffi::CString::new(upper.join("opq").to_string_lossy().as_bytes()).unwrap();
        // SAFETY: valid C strings and a value buffer of the given length.
        let set = unsafe {
            libc::setxattr(
                opq.as_ptr(),
                c"user.overlay.opaque".as_ptr(),
                b"y".as_ptr().cast(),
                1,
                0,
            )
        };
        assert_eq!(set, 0, "mark the opaque directory");
        if unsafe { libc::geteuid() } == 0 {
            chown_tree(&lower, HOST_ID_BASE);
            chown_tree(&upper, HOST_ID_BASE);
        }
        let reference = format!("test.local/{}:latest", unique("img"));
        let root = ImageRoot {
            reference: reference.clone(),
            digest: format!("sha256:{}", "ab".repeat(32)),
            layers: vec![lower, upper],
            env: vec!["FOO=from-image".into(), "PATH=/bin:/usr/bin".into()],
            working_dir: Some("/data".into()),
            user: None,
            entrypoint: vec![],
            cmd: vec!["/bin/sh".into()],
        };
        Fixture {
            scratch,
            reference,
            root,
            mode,
        }
    }

    fn engine(&self) -> Arc<dyn Backend> {
        Arc::new(
            LocalBackend::new()
                .expect("local engine")
                .with_image_root_mode(self.mode)
                .with_images(Arc::new(TestImages {
                    reference: self.reference.clone(),
                    root: self.root.clone(),
                })),
        )
    }

    fn options(&self) -> CreateOptions {
        let mut options = test_options("image-root");
        options.template = Some(self.reference.clone());
        options
    }
}

/// The image's files, with its whiteouts and opaque directories applied, its environment and
/// working directory, under the engine's own directories and `/etc` files.
#[tokio::test]
async fn an_image_is_the_sandbox_root() {
    image_is_the_sandbox_root(Fixture::new()).await;
}

/// As [`an_image_is_the_sandbox_root`], with the layers copied instead of overlaid.
#[tokio::test]
async fn a_copied_image_is_the_sandbox_root() {
    image_is_the_sandbox_root(Fixture::with_mode(ImageRootMode::Copy)).await;
}

async fn image_is_the_sandbox_root(fixture: Fixture) {
    let engine = fixture.engine();
    let id = engine.create(fixture.options()).await.expect("create").id;
    let out = sh(
        &*engine,
        &id,
        "echo $FOO; pwd; for f in /data/* /opq/*; do echo $f; done; read l < /etc/motd; echo $l",
    )
    .await;
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "from-image\n/data\n/data/keep\n/opq/new\nupper\n",
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The image's users stay; the sandbox's are added.
    let out = sh(
        &*engine,
        &id,
        "while read l; do case $l in img:*|user:*|root:*) echo $l;; esac; done < /etc/passwd",
    )
    .await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("img:x:4242:4242:"), "{text}");
    assert!(
        text.contains("user:x:") || text.contains("root:x:0:0"),
        "{text}"
    );
    // Written in the sandbox's own layer, never in the image's.
    let out = sh(
        &*engine,
        &id,
        "echo new > /data/keep && echo made > /data/new && read l < /data/keep && echo $l",
    )
    .await;
    assert_eq!(
        out.stdout,
        b"new\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lower = &fixture.root.layers[0];
    assert_eq!(
        std::fs::read_to_string(lower.join("data/keep")).unwrap(),
        "kept\n"
    );
    assert!(!lower.join("data/new").exists() && !fixture.root.layers[1].join("data/new").exists());
    // A caller's envs win over the image's.
    let mut spec = ProcessSpec::new(Command::sh("echo $FOO"));
    spec.envs.insert("FOO".into(), "from-call".into());
    assert_eq!(run(&*engine, &id, spec).await.stdout, b"from-call\n");
    // The store's setuid program: its bit stays stripped, whichever way the root is made.
    let tool = engine
        .stat(&id, "/bin/tool", Default::default())
        .await
        .expect("stat");
    assert_eq!(tool.mode & 0o7777, 0o755);
    engine.destroy(&id).await.expect("destroy");
}

/// Where the image holds symlinks into the host's tree at paths the engine makes its own
/// (`/etc/hosts`, `/tmp`, `/proc`, `/workspace`), the engine replaces them in the sandbox's
/// layer and never follows them: the host's files stay as they were.
#[tokio::test]
async fn an_image_symlink_never_leads_the_engine_into_the_host() {
    symlink_never_leads_into_the_host(Fixture::new()).await;
}

/// As [`an_image_symlink_never_leads_the_engine_into_the_host`], the layers copied: the copy
/// writes the symlinks as they are and never follows one.
#[tokio::test]
async fn a_copied_image_symlink_never_leads_the_engine_into_the_host() {
    symlink_never_leads_into_the_host(Fixture::with_mode(ImageRootMode::Copy)).await;
}

async fn symlink_never_leads_into_the_host(fixture: Fixture) {
    let engine = fixture.engine();
    let id = engine.create(fixture.options()).await.expect("create").id;
    let base = &fixture.scratch.0;
    assert_eq!(
        std::fs::read_to_string(base.join("sentinel")).unwrap(),
        "host file\n"
    );
    assert_eq!(std::fs::read_dir(base.join("outside")).unwrap().count(), 0);
    let out = sh(
        &*engine,
        &id,
        "read l < /etc/hosts; echo $l; test -d /tmp && ! test -L /tmp && echo tmp-dir; \
         test -r /proc/self/status && echo proc; echo x > /workspace/f && echo ws",
    )
    .await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("127.0.0.1 localhost"), "{text}");
    assert!(text.contains("tmp-dir\nproc\nws\n"), "{text}");
    assert_eq!(std::fs::read_dir(base.join("outside")).unwrap().count(), 0);
    // The image's layers are untouched: the symlinks are still there.
    let lower = &fixture.root.layers[0];
    assert!(std::fs::symlink_metadata(lower.join("tmp"))
        .unwrap()
        .is_symlink());
    assert_eq!(
        std::fs::symlink_metadata(lower.join("data/keep"))
            .unwrap()
            .uid(),
        std::fs::symlink_metadata(lower).unwrap().uid()
    );
    engine.destroy(&id).await.expect("destroy");
}

/// Naming an image the source (or the engine's own store) lacks, a create is refused before
/// any effect; the host base still works beside images.
#[tokio::test]
async fn image_creates_refuse_what_they_cannot_run() {
    let fixture = Fixture::new();
    let engine = fixture.engine();
    let mut missing = fixture.options();
    missing.template = Some("test.local/absent:1".into());
    let err = engine.create(missing).await.expect_err("no such image");
    assert_eq!(err.code(), ErrorCode::NotFound, "{err}");
    let plain = LocalBackend::new().expect("local engine");
    let err = plain
        .create(fixture.options())
        .await
        .expect_err("not in the engine's own image store");
    assert_eq!(err.code(), ErrorCode::NotFound, "{err}");
    let host = engine
        .create(test_options("image-root-host"))
        .await
        .expect("host base");
    assert_eq!(sh(&*engine, &host.id, "echo ok").await.stdout, b"ok\n");
    engine.destroy(&host.id).await.expect("destroy");
}

/// Write `data` to `path` of sandbox `id`, its parents made.
async fn put(engine: &dyn Backend, id: &str, path: &str, data: &[u8]) {
    let body: ByteStream = Box::pin(futures::stream::once({
        let data = data.to_vec();
        async move { Ok(data) }
    }));
    let mut options = WriteOptions::default();
    options.create_parents = true;
    engine
        .write_file(id, path, body, options)
        .await
        .unwrap_or_else(|e| panic!("write {path}: {e}"));
}

/// The fixture's options as its root user (who may change the image's `/etc`).
fn as_root(mut options: CreateOptions) -> CreateOptions {
    options.user = Some("root".into());
    options
}

/// What [`an_image_sandbox_snapshots_and_forks_with_its_writable_layer`] changed, seen in
/// sandbox `id`: written and changed files there, the deleted file and the replaced
/// directory's old entries gone, the image's own files intact.
async fn assert_changed_view(engine: &dyn Backend, id: &str) {
    let text = |bytes: Vec<u8>| String::from_utf8_lossy(&bytes).into_owned();
    let file = |path: &'static str| async move { read(engine, id, path).await.map(text) };
    assert_eq!(file("/data/new").await.unwrap(), "made\n");
    assert_eq!(file("/data/keep").await.unwrap(), "changed\n");
    assert_eq!(
        file("/workspace/deep/file").await.unwrap(),
        "in the workspace\n"
    );
    let gone = read(engine, id, "/etc/motd").await.expect_err("deleted");
    assert_eq!(gone.code(), ErrorCode::NotFound, "{gone}");
    // The directory made anew hides the image's entries (an opaque directory).
    assert_eq!(
        names_in(engine, id, "/opq").await,
        vec!["again".to_string()]
    );
    // The image's files: its users (and the sandbox's), its shell, its whiteout.
    assert!(file("/etc/passwd")
        .await
        .unwrap()
        .contains("img:x:4242:4242:"));
    assert_eq!(sh(engine, id, "echo ok").await.stdout, b"ok\n");
    let whiteout = read(engine, id, "/data/gone")
        .await
        .expect_err("whited out");
    assert_eq!(whiteout.code(), ErrorCode::NotFound, "{whiteout}");
}

/// A snapshot of an image sandbox holds its writable layer and its image: a sandbox created
/// from it, and a fork, run the same image with the same files (written, changed, deleted,
/// a directory replaced), the image's layers untouched. A template that disagrees with the
/// snapshot's image is `InvalidArgument`; an image no longer there is `NotFound`, named.
#[tokio::test]
async fn an_image_sandbox_snapshots_and_forks_with_its_writable_layer() {
    snapshots_and_forks(Fixture::new()).await;
}

/// As [`an_image_sandbox_snapshots_and_forks_with_its_writable_layer`], the layers copied:
/// the snapshot holds the whole root, and the sandboxes made from it run that root.
#[tokio::test]
async fn a_copied_image_sandbox_snapshots_and_forks_with_its_root() {
    snapshots_and_forks(Fixture::with_mode(ImageRootMode::Copy)).await;
}

async fn snapshots_and_forks(fixture: Fixture) {
    let engine = fixture.engine();
    let id = engine
        .create(as_root(fixture.options()))
        .await
        .expect("create")
        .id;
    put(&*engine, &id, "/data/new", b"made\n").await;
    put(&*engine, &id, "/data/keep", b"changed\n").await;
    put(&*engine, &id, "/workspace/deep/file", b"in the workspace\n").await;
    engine
        .remove(&id, "/etc/motd", RemoveOptions::default())
        .await
        .expect("remove an image file");
    let mut recursive = RemoveOptions::default();
    recursive.recursive = true;
    engine
        .remove(&id, "/opq", recursive)
        .await
        .expect("remove an image directory");
    engine
        .mkdir(&id, "/opq", MkdirOptions::default())
        .await
        .expect("make it anew");
    put(&*engine, &id, "/opq/again", b"again\n").await;
    assert_changed_view(&*engine, &id).await;

    let snap = engine
        .snapshot(&id, Default::default())
        .await
        .expect("snapshot an image sandbox");
    let mut from = as_root(test_options("image-root-restored"));
    from.snapshot = Some(snap.id.clone());
    let restored = engine.create(from).await.expect("create from the snapshot");
    assert_eq!(restored.template, fixture.reference);
    assert_changed_view(&*engine, &restored.id).await;
    let fork = engine
        .fork(&id, as_root(test_options("image-root-fork")))
        .await
        .expect("fork an image sandbox");
    assert_eq!(fork.template, fixture.reference);
    assert_changed_view(&*engine, &fork.id).await;
    // The image's layers were never written.
    let (lower, upper) = (&fixture.root.layers[0], &fixture.root.layers[1]);
    assert_eq!(
        std::fs::read_to_string(lower.join("data/keep")).unwrap(),
        "kept\n"
    );
    assert_eq!(
        std::fs::read_to_string(upper.join("etc/motd")).unwrap(),
        "upper\n"
    );
    assert!(!lower.join("data/new").exists() && !upper.join("data/new").exists());

    // A template naming something else than the snapshot's image.
    let mut other = test_options("image-root-restored");
    other.snapshot = Some(snap.id.clone());
    other.template = Some("base".into());
    let err = engine.create(other).await.expect_err("disagrees");
    assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
    // An engine whose images lack the snapshot's.
    let elsewhere: Arc<dyn Backend> = Arc::new(
        LocalBackend::new()
            .expect("engine")
            .with_image_root_mode(fixture.mode)
            .with_images(Arc::new(TestImages {
                reference: "test.local/other:1".into(),
                root: fixture.root.clone(),
            })),
    );
    let mut again = test_options("image-root-restored");
    again.snapshot = Some(snap.id.clone());
    let err = elsewhere.create(again).await.expect_err("image gone");
    assert_eq!(err.code(), ErrorCode::NotFound, "{err}");
    assert!(err.to_string().contains(&fixture.reference), "{err}");

    for sandbox in [&id, &restored.id, &fork.id] {
        engine.destroy(sandbox).await.expect("destroy");
    }
    engine.delete_snapshot(&snap.id).await.expect("delete");
}

/// A sandbox file named `.wh.NAME` would come back from the snapshot's layer as a whiteout
/// hiding the image's `NAME`: the snapshot (and a fork) is refused as `InvalidArgument` naming
/// it, and once it is renamed the snapshot is taken and restores the image's file intact.
#[tokio::test]
async fn an_image_sandbox_file_named_like_a_whiteout_is_refused_by_its_snapshot() {
    let fixture = Fixture::new();
    let engine = fixture.engine();
    let id = engine
        .create(as_root(fixture.options()))
        .await
        .expect("create")
        .id;
    put(&*engine, &id, "/data/.wh.keep", b"mine\n").await;
    let err = engine
        .snapshot(&id, Default::default())
        .await
        .expect_err("a snapshot with a .wh. file");
    assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
    assert!(err.to_string().contains("data/.wh.keep"), "{err}");
    let err = engine
        .fork(&id, as_root(test_options("image-root-wh-fork")))
        .await
        .expect_err("a fork with a .wh. file");
    assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
    // Renamed (the image has no `mv`: removed and written anew).
    engine
        .remove(&id, "/data/.wh.keep", RemoveOptions::default())
        .await
        .expect("remove it");
    put(&*engine, &id, "/data/wh.keep", b"mine\n").await;
    let snap = engine
        .snapshot(&id, Default::default())
        .await
        .expect("snapshot once renamed");
    let mut from = as_root(test_options("image-root-wh-restored"));
    from.snapshot = Some(snap.id.clone());
    let restored = engine.create(from).await.expect("restore").id;
    let read = |path: &'static str| read(&*engine, &restored, path);
    assert_eq!(
        read("/data/keep").await.expect("the image's file"),
        b"kept\n"
    );
    assert_eq!(
        read("/data/wh.keep").await.expect("the renamed file"),
        b"mine\n"
    );
    for sandbox in [&id, &restored] {
        engine.destroy(sandbox).await.expect("destroy");
    }
    engine.delete_snapshot(&snap.id).await.expect("delete");
}

/// A 3 GiB sparse file in a 32 MiB image sandbox: its snapshot is archived sparse (a few MiB,
/// within the archive bound), and a 32 MiB sandbox restored from it, and a fork, have the file
/// with its apparent size and its data (its holes kept: written out they would not fit).
#[tokio::test]
async fn an_image_sandbox_snapshot_keeps_sparse_files_sparse() {
    let fixture = Fixture::new();
    let engine = fixture.engine();
    let small = |mut options: CreateOptions| {
        options.resources.disk_mib = Some(32);
        as_root(options)
    };
    let id = engine
        .create(small(fixture.options()))
        .await
        .expect("create")
        .id;
    let made = sh(
        &*engine,
        &id,
        "truncate -s 3G /workspace/f && echo hello >> /workspace/f && echo made",
    )
    .await;
    assert_eq!(
        made.stdout,
        b"made\n",
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let snap = engine
        .snapshot(&id, Default::default())
        .await
        .expect("snapshot");
    assert!(snap.size < 4 << 20, "archived sparse: {} bytes", snap.size);
    let mut from = small(test_options("image-root-sparse"));
    from.snapshot = Some(snap.id.clone());
    let restored = engine.create(from).await.expect("restore").id;
    let fork = engine
        .fork(&id, small(test_options("image-root-sparse")))
        .await
        .expect("fork")
        .id;
    for sandbox in [&restored, &fork] {
        let stat = engine
            .stat(sandbox, "/workspace/f", Default::default())
            .await
            .expect("stat");
        assert_eq!(stat.size, (3 << 30) + 6, "apparent size kept");
        let tail = sh(&*engine, sandbox, "tail -c 6 /workspace/f").await;
        assert_eq!(tail.stdout, b"hello\n", "the data kept");
    }
    for sandbox in [&id, &restored, &fork] {
        engine.destroy(sandbox).await.expect("destroy");
    }
    engine.delete_snapshot(&snap.id).await.expect("delete");
}

/// One entry of a hand-made archive: its name, kind, link target and contents.
type RawEntry<'a> = (&'a [u8], tar::EntryType, &'a [u8], &'a [u8]);

/// A plain tar for a hand-made snapshot archive: entries with any name (`..` and absolute
/// ones too, which `tar::Builder` refuses), written header by header.
fn raw_tar(entries: &[RawEntry<'_>]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, kind, link, data) in entries {
        let mut header = tar::Header::new_gnu();
        header.as_old_mut().name[..name.len()].copy_from_slice(name);
        header.as_old_mut().linkname[..link.len()].copy_from_slice(link);
        header.set_entry_type(*kind);
        header.set_mode(0o644);
        header.set_size(data.len() as u64);
        if *kind == tar::EntryType::Char {
            header.set_device_major(1).unwrap();
            header.set_device_minor(3).unwrap();
        }
        header.set_cksum();
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.resize(out.len() + 1024, 0);
    out
}

/// A snapshot archive is a sandbox's output, so hostile input: restored into a new image
/// sandbox, entries named with `..`, absolute names and entries beneath a symlink are refused
/// (`InvalidArgument`, no sandbox made) with nothing written outside, and a device node is
/// never made.
#[tokio::test]
async fn a_hostile_snapshot_archive_is_refused_with_nothing_outside() {
    let fixture = Fixture::new();
    let base = &fixture.scratch.0;
    let state = base.join("state");
    let engine: Arc<dyn Backend> = Arc::new(
        LocalBackend::with_state_dir(&state)
            .expect("engine")
            .with_images(Arc::new(TestImages {
                reference: fixture.reference.clone(),
                root: fixture.root.clone(),
            })),
    );
    let outside = base.join("outside");
    let absolute = format!("{}/absolute", outside.display());
    let outside_name = outside.to_string_lossy().into_owned();
    let file = tar::EntryType::Regular;
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "dot-dot",
            raw_tar(&[(b"../../../../../outside/escaped", file, b"", b"x\n")]),
        ),
        (
            "absolute",
            raw_tar(&[(absolute.as_bytes(), file, b"", b"x\n")]),
        ),
        (
            "symlinked-parent",
            raw_tar(&[
                (
                    b"link",
                    tar::EntryType::Symlink,
                    outside_name.as_bytes(),
                    b"",
                ),
                (b"link/through", file, b"", b"x\n"),
            ]),
        ),
    ];
    std::fs::create_dir_all(state.join("snapshots")).unwrap();
    let snapshot = |name: &str, archive: &[u8]| {
        let id = format!("snap-hostile-{name}");
        let meta = serde_json::json!({
            "id": id, "name": null, "sandbox_id": "made-by-hand", "created_at": 1,
            "size": archive.len(),
            "image": {"reference": fixture.reference, "digest": fixture.root.digest},
        });
        let dir = state.join("snapshots");
        std::fs::write(dir.join(format!("{id}.tar")), archive).unwrap();
        std::fs::write(dir.join(format!("{id}.json")), meta.to_string()).unwrap();
        id
    };
    for (name, archive) in &cases {
        let mut options = test_options("image-root-hostile");
        options.snapshot = Some(snapshot(name, archive));
        let err = engine.create(options).await.expect_err(name);
        assert_eq!(err.code(), ErrorCode::InvalidArgument, "{name}: {err}");
        assert!(err.to_string().contains("hostile"), "{name}: {err}");
        assert_eq!(
            std::fs::read_dir(&outside).unwrap().count(),
            0,
            "{name}: nothing outside"
        );
        assert!(!base.join("escaped").exists() && !Path::new("/outside").exists());
    }
    assert_eq!(
        std::fs::read_to_string(base.join("sentinel")).unwrap(),
        "host file\n"
    );
    // A device node in the archive is skipped: the sandbox is made without it.
    let mut options = test_options("image-root-hostile");
    options.snapshot = Some(snapshot(
        "device",
        &raw_tar(&[
            (b"data/mem", tar::EntryType::Char, b"", b""),
            (b"data/plain", file, b"", b"plain\n"),
        ]),
    ));
    let id = engine.create(options).await.expect("create").id;
    assert_eq!(
        read(&*engine, &id, "/data/plain").await.unwrap(),
        b"plain\n"
    );
    let err = engine
        .stat(&id, "/data/mem", Default::default())
        .await
        .expect_err("no device node");
    assert_eq!(err.code(), ErrorCode::NotFound, "{err}");
    engine.destroy(&id).await.expect("destroy");
}

/// SHA-256 of `bytes` as an OCI digest.
fn sha256(bytes: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// An OCI image layout in `dir` of a one-layer image holding `/hello`.
fn write_small_layout(dir: &Path) {
    let mut layer = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Regular);
    header.set_mode(0o644);
    header.set_size(6);
    layer
        .append_data(&mut header, "hello", &b"hello\n"[..])
        .unwrap();
    let layer = layer.into_inner().unwrap();
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": arch, "os": "linux",
        "config": {},
        "rootfs": {"type": "layers", "diff_ids": [sha256(&layer)]},
    }))
    .unwrap();
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": sha256(&config), "size": config.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": sha256(&layer), "size": layer.len()}],
    }))
    .unwrap();
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    for blob in [&layer, &config, &manifest] {
        std::fs::write(blobs.join(&sha256(blob)["sha256:".len()..]), blob).unwrap();
    }
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    let index = serde_json::json!({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": sha256(&manifest), "size": manifest.len(),
    }]});
    std::fs::write(dir.join("index.json"), index.to_string()).unwrap();
}

/// A snapshot keeps its image in the engine's store: with its tag removed and the sandbox
/// gone, a prune leaves it and a create from the snapshot still runs it; once the snapshot is
/// deleted, a prune removes it.
#[tokio::test]
async fn a_snapshot_holds_its_image_against_prune() {
    let base = std::env::temp_dir().join(unique("image-snap-prune"));
    std::fs::create_dir_all(&base).unwrap();
    let _scratch = Scratch(base.clone());
    let state = base.join("state");
    let engine: Arc<dyn Backend> = Arc::new(LocalBackend::with_state_dir(&state).expect("engine"));
    let store = sandcove::backend::local::images::open_store(&state).expect("store");
    write_small_layout(&base.join("layout"));
    let tag = format!("test.local/{}:1", unique("snap"));
    let imported = store
        .import(&base.join("layout"), Some(&tag))
        .await
        .expect("import");
    let digest = imported[0].digest.clone();
    let stored = || {
        store
            .list()
            .expect("list")
            .iter()
            .any(|image| image.digest == digest)
    };

    let mut options = as_root(test_options("image-snap-prune"));
    options.template = Some(tag.clone());
    let id = engine.create(options).await.expect("create").id;
    put(&*engine, &id, "/workspace/kept", b"kept\n").await;
    let snap = engine
        .snapshot(&id, Default::default())
        .await
        .expect("snapshot");
    engine.destroy(&id).await.expect("destroy");
    engine.remove_image(&tag).await.expect("remove the tag");
    engine.prune_images().await.expect("prune");
    assert!(stored(), "the snapshot keeps its image");

    let mut from = as_root(test_options("image-snap-prune"));
    from.snapshot = Some(snap.id.clone());
    let restored = engine.create(from).await.expect("create from the snapshot");
    assert_eq!(
        read(&*engine, &restored.id, "/workspace/kept")
            .await
            .unwrap(),
        b"kept\n"
    );
    assert_eq!(
        read(&*engine, &restored.id, "/hello").await.unwrap(),
        b"hello\n"
    );
    engine.destroy(&restored.id).await.expect("destroy");

    engine.delete_snapshot(&snap.id).await.expect("delete");
    engine.prune_images().await.expect("prune");
    assert!(!stored(), "nothing keeps it any more");
}

/// With a warm pool, a create naming an image has the pool keep a member of that image, and
/// the next create of it is a claim that matches a cold one: the image's files, env and
/// working directory, the claimer's envs, name and user table. A member of an image is never
/// handed to a create of another image or of the host base.
#[tokio::test]
async fn the_warm_pool_keeps_members_per_image() {
    use sandcove_conformance::{equals, eventually};
    use std::time::Duration;
    let fixture = Fixture::new();
    let warm = LocalBackend::new()
        .expect("local engine")
        .with_images(Arc::new(TestImages {
            reference: fixture.reference.clone(),
            root: fixture.root.clone(),
        }))
        .with_warm_pool(1);
    let options = fixture.options();
    // The first create of the image goes cold and has the pool keep one of it.
    let first = warm.create(options.clone()).await.expect("create");
    warm.destroy(&first.id).await.expect("destroy");
    eventually(Duration::from_secs(60), "an image member ready", || async {
        equals(warm.warm_ready_for(&options), 1)
    })
    .await;
    assert_eq!(
        warm.warm_ready_for(&test_options("host")),
        0,
        "not a host-base member"
    );
    let claims = warm.warm_claims();
    let mut claimer = options.clone();
    claimer.name = Some(unique("warm-image"));
    claimer.envs.insert("FROM_CREATE".into(), "yes".into());
    let info = warm.create(claimer.clone()).await.expect("claim");
    assert_eq!(warm.warm_claims(), claims + 1, "served by the pool");
    assert_eq!(info.name, claimer.name);
    assert_eq!(info.template, fixture.reference);
    assert_eq!(info.working_dir.as_deref(), Some("/data"));
    let script = "echo $FOO $FROM_CREATE; pwd; read l < /etc/motd; echo $l; \
                  while read l; do case $l in img:*) echo $l;; esac; done < /etc/passwd; \
                  test -e /data/gone || echo whiteout";
    let out = sh(&warm, &info.id, script).await;
    let cold = fixture.engine();
    let cold_id = cold
        .create(claimer.clone().name(unique("cold-image")))
        .await;
    let cold_id = cold_id.expect("cold create").id;
    let cold_out = sh(&*cold, &cold_id, script).await;
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "from-image yes\n/data\nupper\nimg:x:4242:4242::/nonexistent:/bin/sh\nwhiteout\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, cold_out.stdout, "warm and cold agree");
    let whoami = "while read k v rest; do [ \"$k\" = Uid: ] && echo $v; done < /proc/self/status; \
                  echo $HOME $USER";
    assert_eq!(
        sh(&warm, &info.id, whoami).await.stdout,
        sh(&*cold, &cold_id, whoami).await.stdout
    );
    // The host base is not served by the image's member (the pool refills with one of the
    // image: the newest create's shape).
    eventually(
        Duration::from_secs(60),
        "the image member made again",
        || async { equals(warm.warm_ready_for(&options), 1) },
    )
    .await;
    let claims = warm.warm_claims();
    let host = warm.create(test_options("host")).await.expect("host base");
    assert_eq!(warm.warm_claims(), claims, "the host base goes cold");
    assert_eq!(
        sh(&warm, &host.id, "test -e /data/keep || echo host")
            .await
            .stdout,
        b"host\n"
    );
    for (engine, id) in [
        (&warm as &dyn Backend, &info.id),
        (&warm, &host.id),
        (&*cold, &cold_id),
    ] {
        engine.destroy(id).await.expect("destroy");
    }
}

/// The image's `User` decides the default user of a create that names none: a name is the
/// default user's (with the engine's uid for it), `0` is root, another uid is the engine's
/// default user; a create's `user` wins. Seen from inside (`whoami`, `id -u`) and in the
/// sandbox's info.
#[tokio::test]
async fn the_image_user_is_the_default_user() {
    let base = std::env::temp_dir().join(unique("image-user"));
    std::fs::create_dir_all(&base).unwrap();
    let _scratch = Scratch(base.clone());
    let state = base.join("state");
    let engine: Arc<dyn Backend> = Arc::new(LocalBackend::with_state_dir(&state).expect("engine"));
    let store = sandcove::backend::local::images::open_store(&state).expect("store");
    // Under a uid range (an engine running as root) the default user has uid 1000; rootless,
    // the one mapped uid 0 is every user's.
    let user_uid = if unsafe { libc::geteuid() } == 0 {
        1000
    } else {
        0
    };
    let mut references = Vec::new();
    for (image_user, tag) in [("node:node", "named"), ("0:0", "root"), ("4242", "uid")] {
        let layout = base.join(tag);
        shell_image("image user")
            .layer(Layer::new().host_programs(&["/usr/bin/id", "/usr/bin/whoami"]))
            .user(image_user)
            .build()
            .write_layout(&layout);
        let reference = format!("test.local/{}:{tag}", unique("user"));
        store
            .import(&layout, Some(&reference))
            .await
            .expect("import");
        references.push(reference);
    }
    let cases = [
        (&references[0], None, "node", user_uid),
        (&references[1], None, "root", 0),
        (&references[2], None, "user", user_uid),
        (&references[0], Some("alice"), "alice", user_uid),
        (&references[1], Some("bob"), "bob", user_uid),
    ];
    for (reference, create_user, name, uid) in cases {
        let mut options = test_options("image-user");
        options.template = Some(reference.clone());
        options.user = create_user.map(str::to_string);
        let info = engine.create(options).await.expect("create");
        assert_eq!((info.user.name.as_str(), info.user.uid), (name, uid));
        let out = sh(&*engine, &info.id, "whoami; id -u").await;
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!("{name}\n{uid}\n"),
            "{reference} as {create_user:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        engine.destroy(&info.id).await.expect("destroy");
    }
}

/// Copied, an image larger than the sandbox's disk does not fit: the create is
/// `InvalidArgument` naming the disk, and nothing is left running.
#[tokio::test]
async fn a_copied_image_larger_than_the_disk_is_refused() {
    let fixture = Fixture::with_mode(ImageRootMode::Copy);
    let big = fixture.root.layers[1].join("big");
    std::fs::write(&big, vec![7u8; 24 << 20]).unwrap();
    if unsafe { libc::geteuid() } == 0 {
        std::os::unix::fs::lchown(&big, Some(HOST_ID_BASE), Some(HOST_ID_BASE)).unwrap();
    }
    let engine = fixture.engine();
    let mut options = fixture.options();
    options.resources.disk_mib = Some(16);
    let err = engine.create(options).await.expect_err("does not fit");
    assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
    assert!(err.to_string().contains("16 MiB"), "{err}");
    // With room for it, the same image runs.
    let mut options = fixture.options();
    options.resources.disk_mib = Some(64);
    let id = engine.create(options).await.expect("create").id;
    let out = sh(&*engine, &id, "test -s /big && echo big").await;
    assert_eq!(out.stdout, b"big\n");
    engine.destroy(&id).await.expect("destroy");
}

/// Copied, a sparse file of an image stays sparse: a file of 1 GiB apparent size and a few
/// bytes of data fits a disk of 32 MiB, and reads back as it is.
#[tokio::test]
async fn a_copied_image_keeps_its_sparse_files_sparse() {
    use std::os::unix::fs::FileExt;
    let fixture = Fixture::with_mode(ImageRootMode::Copy);
    let sparse = fixture.root.layers[1].join("sparse");
    let file = std::fs::File::create(&sparse).unwrap();
    file.write_all_at(b"sparse-start\n", 0).unwrap();
    file.write_all_at(b"sparse-end\n", (1 << 30) - 11).unwrap();
    drop(file);
    if unsafe { libc::geteuid() } == 0 {
        std::os::unix::fs::lchown(&sparse, Some(HOST_ID_BASE), Some(HOST_ID_BASE)).unwrap();
    }
    let engine = fixture.engine();
    let mut options = fixture.options();
    options.resources.disk_mib = Some(32);
    let id = engine.create(options).await.expect("create").id;
    let out = sh(
        &*engine,
        &id,
        "tail -c 11 /sparse; read line < /sparse; echo $line",
    )
    .await;
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "sparse-end\nsparse-start\n"
    );
    engine.destroy(&id).await.expect("destroy");
}
