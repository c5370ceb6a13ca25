//! Images end to end through the built `sandcove`: images written by the test (the shared
//! builder of `sandcove_conformance::images`) are imported with `sandcove image import` into a
//! state directory, then run with `sandcove create --image` and `sandcove exec`, against the
//! embedded engine and through a loopback `sandcove serve` (`SANDCOVE_URL`) on that state
//! directory; and a real Debian image, built by the test from Debian's packages with
//! `mmdebstrap`, runs a program the host lacks.
//!
//! The official SDKs' image programs (Daytona, E2B, Blaxel) live with each vendor's SDK
//! tests and import their images with [`import`].

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sandcove_conformance::images::{
    host_arch, sha256, shell_image, ImageBuilder, Layer, OciImage, MARKER_ENV, MARKER_PATH,
    WORKING_DIR,
};
use sandcove_conformance::unique;
use sandcove_tests::PrivateState;

use crate::common::{bin, ServeChild};
use crate::sdk_harness::{fingerprint, sdk_root};

/// A directory removed when dropped.
pub struct Scratch(pub PathBuf);

impl Scratch {
    /// A fresh directory under the temp dir.
    pub fn new(what: &str) -> Scratch {
        let dir = std::env::temp_dir().join(unique(what));
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn show(out: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Write `image` as an OCI layout and import it with `sandcove image import --tag
/// reference` into the image store of the state directory `state_dir` (where a server
/// running on that directory finds it).
pub fn import(state_dir: &Path, image: &OciImage, reference: &str) {
    let layout = Scratch::new("layout");
    image.write_layout(&layout.0);
    let out = Command::new(bin())
        .args(["image", "import"])
        .arg(&layout.0)
        .args(["--tag", reference])
        .env("SANDCOVE_STATE_DIR", state_dir)
        .env_remove("SANDCOVE_URL")
        .output()
        .expect("run sandcove image import");
    assert!(
        out.status.success(),
        "sandcove image import: {}",
        show(&out)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&image.digest()),
        "the import prints the image's digest: {stdout}"
    );
}

/// `sandcove image ls` of the state directory `state_dir`'s store (image commands act on the
/// store of the host they run on, never through a server).
fn image_ls(state_dir: &Path) -> String {
    let out = Command::new(bin())
        .args(["image", "ls"])
        .env("SANDCOVE_STATE_DIR", state_dir)
        .env_remove("SANDCOVE_URL")
        .output()
        .expect("run sandcove image ls");
    assert!(out.status.success(), "sandcove image ls: {}", show(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Where `sandcove` commands send their work: a private state directory, used directly or
/// through a `sandcove serve` started on it. Images are imported into that directory either
/// way, as an operator does on the server's host.
struct Target {
    env: Vec<(&'static str, OsString)>,
    server: Option<std::process::Child>,
    state: PrivateState,
}

impl Target {
    fn embedded() -> Target {
        let state = PrivateState::new();
        Target {
            env: vec![("SANDCOVE_STATE_DIR", state.dir.clone().into())],
            server: None,
            state,
        }
    }

    fn served() -> Target {
        Target::served_with(&[])
    }

    /// [`Target::served`] with `envs` added to the server's environment.
    fn served_with(envs: &[(&str, &OsStr)]) -> Target {
        let state = PrivateState::new();
        let key = unique("key");
        let mut server_env = vec![("SANDCOVE_API_KEY", OsStr::new(&key))];
        server_env.extend_from_slice(envs);
        let serve = ServeChild::start(
            &[
                "--listen",
                "127.0.0.1:0",
                "--state-dir",
                state.dir.to_str().unwrap(),
            ],
            &server_env,
            &[],
            "sandcove serve: listening on",
        )
        .expect("the server announces its listener");
        let (child, url) = serve.drain_stderr();
        Target {
            env: vec![
                ("SANDCOVE_URL", url.into()),
                ("SANDCOVE_API_KEY", key.into()),
                // Anything reaching the embedded engine by mistake lands in a directory
                // without the image, so the checks below would fail.
                (
                    "SANDCOVE_STATE_DIR",
                    std::env::temp_dir().join(unique("none")).into(),
                ),
            ],
            server: Some(child),
            state,
        }
    }

    /// Run `sandcove ARGS`.
    fn run(&self, args: &[&str]) -> Output {
        let mut command = Command::new(bin());
        command
            .args(args)
            .env_remove("SANDCOVE_URL")
            .env_remove("SANDCOVE_API_KEY");
        for (k, v) in &self.env {
            command.env(k, v);
        }
        command.output().expect("run sandcove")
    }

    /// Run `sandcove ARGS`, expect success; its stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(out.status.success(), "sandcove {args:?}: {}", show(&out));
        String::from_utf8(out.stdout).expect("UTF-8 output")
    }

    /// A sandbox running `image`.
    fn create(&self, image: &str) -> String {
        let id = self
            .ok(&["create", "--timeout", "10m", "--image", image])
            .trim()
            .to_string();
        assert!(
            !id.is_empty() && !id.contains(char::is_whitespace),
            "{id:?}"
        );
        id
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        if let Some(mut server) = self.server.take() {
            let _ = server.kill();
            let _ = server.wait();
        }
    }
}

/// An imported image is the sandbox's root: its marker file, its `Env`, its working
/// directory; the host's files are not there; the sandbox's writes stay in its own layer (a
/// second sandbox of the image sees the image as imported); an image that is not stored is
/// refused before anything is created, saying how to get it.
fn an_imported_image_runs(t: &Target) {
    let marker = unique("marker");
    let reference = "test.local/shell:1";
    import(&t.state.dir, &shell_image(&marker).build(), reference);
    let listed = image_ls(&t.state.dir);
    assert!(listed.contains(reference), "{listed}");

    let id = t.create(reference);
    let out = t.ok(&[
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        &format!("read line < {MARKER_PATH}; echo $line; echo ${MARKER_ENV}; pwd; test -e /etc/debian_version || echo no-host-files; echo changed > {MARKER_PATH}"),
    ]);
    assert_eq!(
        out,
        format!("{marker}\n{marker}\n{WORKING_DIR}\nno-host-files\n")
    );
    let other = t.create(reference);
    let out = t.ok(&[
        "exec",
        &other,
        "--",
        "sh",
        "-c",
        &format!("read line < {MARKER_PATH}; echo $line"),
    ]);
    assert_eq!(
        out,
        format!("{marker}\n"),
        "the first sandbox's write stayed its own"
    );
    t.ok(&["kill", &id, &other]);

    let out = t.run(&["create", "--image", "test.local/absent:1"]);
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "image test.local/absent:1 (not stored here: pull it with `sandcove image pull"
        ) && stderr.contains("not found"),
        "{stderr}"
    );
    let listed = t.ok(&["--json", "ls"]);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&listed).unwrap(),
        serde_json::json!([]),
        "nothing left running or created"
    );
}

#[test]
fn an_imported_image_runs_embedded() {
    an_imported_image_runs(&Target::embedded());
}

#[test]
fn an_imported_image_runs_through_the_server() {
    an_imported_image_runs(&Target::served());
}

/// An image pushed to a registry on loopback is pulled with `sandcove image pull` (plain
/// HTTP, as for any loopback registry) and runs.
#[test]
fn a_pulled_image_runs() {
    let Some(registry) = sandcove_conformance::images::Registry::start() else {
        eprintln!("SKIP: docker-registry is not installed (Debian package docker-registry); the pull test did not run");
        return;
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        registry.ready().await;
        shell_image("pulled-marker")
            .build()
            .push(&registry.host, "sandcove/pulled", "1")
            .await;
    });
    let t = Target::embedded();
    let reference = format!("{}/sandcove/pulled:1", registry.host);
    t.ok(&["image", "pull", &reference]);
    let id = t.create(&reference);
    let out = t.ok(&[
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        &format!("read line < {MARKER_PATH}; echo $line; echo ${MARKER_ENV}"),
    ]);
    assert_eq!(out, "pulled-marker\npulled-marker\n");
    t.ok(&["kill", &id]);
}

/// A pull through a server (`SANDCOVE_URL`) reports each layer as the embedded engine's
/// does: `sandcove image pull`, its stderr not a terminal, prints a line each time a layer
/// changes state, each layer ends `done`, and the image runs.
#[test]
fn a_pull_through_the_server_reports_each_layer_then_runs() {
    let Some(registry) = sandcove_conformance::images::Registry::start() else {
        eprintln!("SKIP: docker-registry is not installed (Debian package docker-registry); the pull test did not run");
        return;
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let image = shell_image("served-pull-marker")
        .layer(Layer::new().file("/extra/notes", 0o644, b"a second layer\n"))
        .build();
    runtime.block_on(async {
        registry.ready().await;
        image.push(&registry.host, "sandcove/served", "1").await;
    });
    let t = Target::served();
    let reference = format!("{}/sandcove/served:1", registry.host);
    let out = t.run(&["image", "pull", &reference]);
    assert!(out.status.success(), "{}", show(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains(&image.digest()), "{stdout}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    for index in 1..=2 {
        let layer: Vec<&str> = stderr
            .lines()
            .filter(|l| l.starts_with(&format!("layer {index}/2 ")))
            .collect();
        assert!(
            layer.last().is_some_and(|l| l.contains(" done ")),
            "layer {index} reported, ending done: {stderr}"
        );
    }
    let id = t.create(&reference);
    let out = t.ok(&[
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        &format!("read line < {MARKER_PATH}; echo $line; read notes < /extra/notes; echo $notes"),
    ]);
    assert_eq!(out, "served-pull-marker\na second layer\n");
    t.ok(&["kill", &id]);
}

/// `sandcove image import` of an `oci-archive` through a server sends the archive to the
/// server's store, where a sandbox runs it.
#[test]
fn an_archive_imported_through_the_server_runs() {
    let t = Target::served();
    let marker = unique("archived");
    let image = shell_image(&marker).build();
    let scratch = Scratch::new("archive");
    let archive = scratch.0.join("image.tar");
    std::fs::write(&archive, image.oci_archive()).expect("write the archive");
    let reference = "test.local/archived:1";
    let out = t.ok(&[
        "image",
        "import",
        archive.to_str().unwrap(),
        "--tag",
        reference,
    ]);
    assert!(out.contains(&image.digest()), "{out}");
    assert!(
        image_ls(&t.state.dir).contains(reference),
        "stored in the server's store"
    );
    let id = t.create(reference);
    let out = t.ok(&[
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        &format!("read line < {MARKER_PATH}; echo $line"),
    ]);
    assert_eq!(out, format!("{marker}\n"));
    t.ok(&["kill", &id]);
    // A malformed archive is a typed error naming the archive, never the server's own path
    // for it.
    let junk = scratch.0.join("junk.tar");
    std::fs::write(&junk, b"not a tar archive at all").expect("write the junk");
    let out = t.run(&["image", "import", junk.to_str().unwrap()]);
    assert!(!out.status.success(), "{}", show(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let state = t.state.dir.to_string_lossy();
    assert!(
        !stderr.contains(state.as_ref()),
        "no server path in the error: {stderr}"
    );
}

/// Bytes that do not compress (xorshift), so an archive holding them is at least this big.
fn incompressible(len: usize) -> Vec<u8> {
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// An archive larger than the server's store bound (`SANDCOVE_IMAGE_STORE_MAX_MIB`) is
/// refused as it arrives, with `FileTooLarge`, and leaves nothing: no image, no file in the
/// store's temporary directory.
#[test]
fn an_oversized_import_through_the_server_is_refused_and_leaves_nothing() {
    let t = Target::served_with(&[("SANDCOVE_IMAGE_STORE_MAX_MIB", OsStr::new("1"))]);
    let image = ImageBuilder::new()
        .layer_tar(
            Layer::new()
                .file("/big", 0o644, &incompressible(3 << 20))
                .tar(),
            true,
        )
        .build();
    let scratch = Scratch::new("oversized");
    let archive = scratch.0.join("image.tar");
    std::fs::write(&archive, image.oci_archive()).expect("write the archive");
    let out = t.run(&[
        "image",
        "import",
        archive.to_str().unwrap(),
        "--tag",
        "test.local/oversized:1",
    ]);
    assert!(!out.status.success(), "{}", show(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "the image archive is larger than {} bytes",
            1 << 20
        )),
        "FileTooLarge, naming the archive and the bound: {stderr}"
    );
    assert!(
        !image_ls(&t.state.dir).contains("oversized"),
        "nothing imported"
    );
    let tmp = sandcove::backend::local::images::store_dir(&t.state.dir).join("tmp");
    let left: Vec<_> = std::fs::read_dir(&tmp)
        .map(|entries| entries.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(
        left.is_empty(),
        "nothing left in {}: {left:?}",
        tmp.display()
    );
}

/// `sandcove image inspect` through a server answers with the server's store's record of an
/// image: its config's `Env`, `WorkingDir`, `User` and `Cmd`, its platform and its layers,
/// lowest first; the very JSON the same command prints on the server's host. A reference
/// the store lacks is `NotFound`, typed as such across the wire.
#[test]
fn an_image_inspected_through_the_server_shows_its_config_and_layers() {
    let t = Target::served();
    let lower = Layer::new().file("/etc/lower", 0o644, b"lower\n").tar();
    let upper = Layer::new().file("/etc/upper", 0o644, b"upper\n").tar();
    let image = ImageBuilder::new()
        .layer_tar(lower.clone(), true)
        .layer_tar(upper.clone(), false)
        .env("PATH=/usr/bin:/bin")
        .env("GREETING=hello there")
        .working_dir("/srv/inspected")
        .user("1000:1000")
        .cmd(&["/bin/sh", "-c", "echo hi"])
        .build();
    let reference = "test.local/inspected:1";
    import(&t.state.dir, &image, reference);

    let served = t.ok(&["image", "inspect", reference]);
    let details: serde_json::Value = serde_json::from_str(&served).expect("inspect prints JSON");
    assert_eq!(details["info"]["digest"], image.digest(), "{served}");
    assert_eq!(
        details["info"]["references"],
        serde_json::json!([reference])
    );
    assert_eq!(details["info"]["created"], "2024-01-02T03:04:05Z");
    assert_eq!(details["config_digest"], sha256(&image.config));
    assert_eq!(details["platform"], format!("linux/{}", host_arch()));
    assert_eq!(
        details["config"],
        serde_json::json!({
            "env": ["PATH=/usr/bin:/bin", "GREETING=hello there"],
            "working_dir": "/srv/inspected",
            "user": "1000:1000",
            "entrypoint": [],
            "cmd": ["/bin/sh", "-c", "echo hi"],
        })
    );
    let layers = details["layers"].as_array().expect("a list of layers");
    assert_eq!(layers.len(), 2, "{served}");
    for ((layer, (blob, _)), tar) in layers.iter().zip(&image.layers).zip([&lower, &upper]) {
        assert_eq!(layer["digest"], sha256(blob), "{served}");
        assert_eq!(layer["diff_id"], sha256(tar), "{served}");
        assert_eq!(layer["compressed_size"], blob.len(), "{served}");
        assert!(layer["entries"].as_u64().unwrap() >= 2, "{served}");
    }
    assert_eq!(details["skipped_entries"], 0);

    // On the server's host, without `SANDCOVE_URL`: the same store, the same answer.
    let out = Command::new(bin())
        .args(["image", "inspect", reference])
        .env("SANDCOVE_STATE_DIR", &t.state.dir)
        .env_remove("SANDCOVE_URL")
        .output()
        .expect("run sandcove image inspect");
    assert!(out.status.success(), "{}", show(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), served);

    let out = t.run(&["image", "inspect", "test.local/absent:1"]);
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("image test.local/absent:1 (not stored here")
            // What the CLI adds to a `NotFound` alone.
            && stderr.contains("(list what exists with `sandcove ls`)"),
        "{stderr}"
    );
}

/// The Debian release the real image is built from.
pub const DEBIAN_SUITE: &str = "bookworm";
/// What it holds: GNU `hello` (a program hosts lack), what a shell session needs, and what
/// the conformance cases run on an image call (`image_conformance`): bash, Python, `ps`, `ss`
/// and `ip`, `nc`, `mount`.
const DEBIAN_PACKAGES: &[&str] = &[
    "base-files",
    "dash",
    "bash",
    "coreutils",
    "diffutils",
    "hello",
    "findutils",
    "grep",
    "sed",
    "procps",
    "iproute2",
    "netcat-openbsd",
    "python3",
    "mount",
    "util-linux",
];

/// The Debian mirror this host's apt uses for the suite (its `/etc/apt/sources.list*`), else
/// Debian's own redirector.
fn debian_mirror() -> String {
    let mut files = vec![PathBuf::from("/etc/apt/sources.list")];
    if let Ok(entries) = std::fs::read_dir("/etc/apt/sources.list.d") {
        let mut more: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        more.sort();
        files.extend(more);
    }
    for file in files {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        let name = file.to_string_lossy();
        if name.ends_with(".sources") {
            // deb822 stanzas: `URIs:` and `Suites:` of one stanza.
            for stanza in text.split("\n\n") {
                let field = |key: &str| {
                    stanza
                        .lines()
                        .find_map(|l| l.strip_prefix(key))
                        .map(|v| v.split_whitespace().map(str::to_string).collect::<Vec<_>>())
                        .unwrap_or_default()
                };
                if field("Suites:").iter().any(|s| s == DEBIAN_SUITE) {
                    if let Some(uri) = field("URIs:").into_iter().next() {
                        return uri;
                    }
                }
            }
        } else if name.ends_with(".list") {
            // One-line entries: `deb [options] URI SUITE COMPONENTS…`.
            for line in text.lines() {
                let mut words = line.split_whitespace().filter(|w| !w.starts_with('['));
                if words.next() != Some("deb") {
                    continue;
                }
                let (uri, suite) = (words.next(), words.next());
                if let (Some(uri), Some(DEBIAN_SUITE)) = (uri, suite) {
                    return uri.to_string();
                }
            }
        }
    }
    "http://deb.debian.org/debian".to_string()
}

/// The root file system tar of a small Debian made by `mmdebstrap` (packages extracted, no
/// maintainer scripts run: nothing here needs them, and it needs no chroot), built once per
/// package list, suite and mirror, and kept where this user's SDKs are provisioned; `Err`
/// with the reason where it cannot be built (no `mmdebstrap`, or no route to the mirror).
pub fn debian_rootfs() -> Result<PathBuf, String> {
    debian_rootfs_with(&[])
}

/// [`debian_rootfs`] with `extra` packages besides the base list, built once per list.
pub fn debian_rootfs_with(extra: &[&str]) -> Result<PathBuf, String> {
    type Built = std::sync::Arc<std::sync::OnceLock<Result<PathBuf, String>>>;
    static BUILT: std::sync::Mutex<Vec<(Vec<String>, Built)>> = std::sync::Mutex::new(Vec::new());
    let key: Vec<String> = extra.iter().map(|p| p.to_string()).collect();
    let cell = {
        let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
        match built.iter().find(|(k, _)| *k == key) {
            Some((_, cell)) => cell.clone(),
            None => {
                let cell = Built::default();
                built.push((key, cell.clone()));
                cell
            }
        }
    };
    cell.get_or_init(|| build_debian_rootfs(extra)).clone()
}

fn build_debian_rootfs(extra: &[&str]) -> Result<PathBuf, String> {
    match Command::new("mmdebstrap").arg("--version").output() {
        Ok(out) if out.status.success() => {}
        other => {
            return Err(format!(
                "mmdebstrap is not installed (Debian package mmdebstrap): {other:?}"
            ))
        }
    }
    let mirror = debian_mirror();
    // apt's proxy on this host, which mmdebstrap's own apt configuration does not read.
    let proxy = Command::new("apt-config")
        .args(["shell", "PROXY", "Acquire::http::Proxy"])
        .output()
        .ok()
        .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
        .and_then(|text| {
            let value = text.trim().strip_prefix("PROXY=")?.trim_matches('\'');
            (!value.is_empty()).then(|| value.to_string())
        });
    let mut args = vec![
        "--quiet".to_string(),
        "--variant=extract".to_string(),
        format!(
            "--include={}",
            DEBIAN_PACKAGES
                .iter()
                .chain(extra)
                .copied()
                .collect::<Vec<_>>()
                .join(",")
        ),
        // Documentation and translations: a third of the size, nothing the test runs.
        "--dpkgopt=path-exclude=/usr/share/doc/*".to_string(),
        "--dpkgopt=path-exclude=/usr/share/man/*".to_string(),
        "--dpkgopt=path-exclude=/usr/share/info/*".to_string(),
        "--dpkgopt=path-exclude=/usr/share/locale/*".to_string(),
    ];
    if let Some(proxy) = &proxy {
        args.push(format!("--aptopt=Acquire::http::Proxy \"{proxy}\""));
    }
    let key = fingerprint(format!("{args:?} {DEBIAN_SUITE} {mirror}").as_bytes());
    let dir = sdk_root();
    let tar = dir.join(format!("debian-{DEBIAN_SUITE}-{key}.tar"));
    if tar.exists() {
        return Ok(tar);
    }
    // One build at a time for this user: another test program building the same tar is
    // waited for.
    let lock = std::fs::File::create(dir.join(format!(".lock-debian-{key}")))
        .map_err(|e| format!("the build lock: {e}"))?;
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)
        .map_err(|e| format!("the build lock: {e}"))?;
    if tar.exists() {
        return Ok(tar);
    }
    let partial = dir.join(format!(".debian-{key}-{}.tar", std::process::id()));
    let out = Command::new("mmdebstrap")
        .args(&args)
        .arg(DEBIAN_SUITE)
        .arg(&partial)
        .arg(&mirror)
        .output()
        .map_err(|e| format!("mmdebstrap: {e}"))?;
    if !out.status.success() {
        let _ = std::fs::remove_file(&partial);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(8).collect();
        return Err(format!(
            "mmdebstrap {DEBIAN_SUITE} from {mirror} failed ({}): {}",
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        ));
    }
    std::fs::rename(&partial, &tar).map_err(|e| format!("keeping the tar: {e}"))?;
    Ok(tar)
}

/// The content of `name` (`./etc/debian_version`) in the tar at `path`.
fn file_in_tar(path: &Path, name: &str) -> Option<Vec<u8>> {
    let file = std::fs::File::open(path).ok()?;
    let mut archive = tar::Archive::new(file);
    for entry in archive.entries().ok()? {
        let mut entry = entry.ok()?;
        let entry_name = entry.path().ok()?.to_string_lossy().into_owned();
        if entry_name.trim_start_matches("./") == name.trim_start_matches("./") {
            let mut content = Vec::new();
            std::io::Read::read_to_end(&mut entry, &mut content).ok()?;
            return Some(content);
        }
    }
    None
}

/// A real Debian image, built by the test from Debian's packages: its root file system's
/// tar is the image's one layer; imported, it runs GNU `hello` (which the host lacks) and
/// shows its own `/etc/debian_version`. Where the image cannot be built here (no
/// `mmdebstrap`, no route to Debian's mirror), the test says SKIP loudly and passes.
fn a_debian_image_runs_a_program_the_host_lacks(t: &Target) {
    let rootfs = match debian_rootfs() {
        Ok(tar) => tar,
        Err(reason) => {
            eprintln!("SKIP: no Debian image could be built here, the Debian image test did not run: {reason}");
            return;
        }
    };
    if host_has("hello") {
        eprintln!(
            "WARNING: this host has a `hello` program: the Debian image test still runs the \
             image's, but it no longer shows a program only the image has"
        );
    }
    let layer = std::fs::read(&rootfs).expect("the root file system's tar");
    let image = ImageBuilder::new()
        .layer_tar(layer, false)
        .env("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        .cmd(&["/bin/sh"])
        .build();
    let reference = format!("test.local/debian-hello:{DEBIAN_SUITE}");
    import(&t.state.dir, &image, &reference);
    let id = t.create(&reference);
    assert_eq!(t.ok(&["exec", &id, "--", "hello"]), "Hello, world!\n");
    assert_eq!(
        t.ok(&["exec", &id, "--", "sh", "-c", "command -v hello"]),
        "/usr/bin/hello\n"
    );
    let version = t.ok(&["exec", &id, "--", "cat", "/etc/debian_version"]);
    let in_image = file_in_tar(&rootfs, "etc/debian_version").expect("the tar's debian_version");
    assert_eq!(version.as_bytes(), in_image, "the image's own release file");
    assert!(
        version.starts_with("12."),
        "bookworm is Debian 12: {version}"
    );
    t.ok(&["kill", &id]);
}

/// Whether `program` is on this process's PATH.
fn host_has(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}

#[test]
fn a_debian_image_runs_a_program_the_host_lacks_embedded() {
    a_debian_image_runs_a_program_the_host_lacks(&Target::embedded());
}

#[test]
fn a_debian_image_runs_a_program_the_host_lacks_through_the_server() {
    a_debian_image_runs_a_program_the_host_lacks(&Target::served());
}
