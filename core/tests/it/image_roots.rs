//! Image roots on the embedded engine: an image's layers (made here, in overlayfs's format, as
//! the image store unpacks them) become a sandbox's root under a writable layer of its own,
//! with the engine's directories and `/etc` files made beneath the root's descriptor whatever
//! the image holds at those paths.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sandcove::backend::local::images::{ImageRoot, ImageSource};
use sandcove::{Backend, Command, CreateOptions, ErrorCode, LocalBackend, ProcessSpec};
use sandcove_conformance::images::host_program_files;
use sandcove_conformance::{run, sh, test_options, unique};

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
}

impl Fixture {
    fn new() -> Fixture {
        let base = std::env::temp_dir().join(unique("image-root"));
        std::fs::create_dir_all(&base).unwrap();
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
        let scratch = Scratch(base.clone());
        let (lower, upper) = (base.join("layer0"), base.join("layer1"));
        // The host's `/bin/sh` with the libraries it loads (the image tests' shared list).
        for file in host_program_files("/bin/sh") {
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
        }
    }

    fn engine(&self) -> Arc<dyn Backend> {
        Arc::new(
            LocalBackend::new()
                .expect("local engine")
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
    let fixture = Fixture::new();
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
    engine.destroy(&id).await.expect("destroy");
}

/// Where the image holds symlinks into the host's tree at paths the engine makes its own
/// (`/etc/hosts`, `/tmp`, `/proc`, `/workspace`), the engine replaces them in the sandbox's
/// layer and never follows them: the host's files stay as they were.
#[tokio::test]
async fn an_image_symlink_never_leads_the_engine_into_the_host() {
    let fixture = Fixture::new();
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

/// Naming an image the source lacks (a plain engine's source is its state directory's image
/// store, which does not hold the test's image), a create is refused before any effect;
/// the host base still works beside images; an image sandbox refuses snapshots (its root's
/// `tar` is the image's, which must not run with the agent's capabilities).
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
    let id = engine.create(fixture.options()).await.expect("create").id;
    let err = engine
        .snapshot(&id, Default::default())
        .await
        .expect_err("no snapshot of an image sandbox");
    assert_eq!(err.code(), ErrorCode::NotSupported, "{err}");
    engine.destroy(&id).await.expect("destroy");
}
