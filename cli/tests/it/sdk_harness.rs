//! What the official-SDK tests (E2B and Daytona) need: provisioning pinned SDKs once per user
//! (under the build directory when this user can write there, else in a private directory of the
//! user's in the temp dir, as CI's rootless pass needs), a `sandcove serve` child process
//! with one vendor listener, its `sandcove env` lines, and running one program against it
//! with its output compared to an `.expected` file.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use sandcove_tests::PrivateState;

use crate::common::{bin, ServeChild};

/// The repository's `fixtures/`, or `SANDCOVE_TEST_FIXTURES` when set (a copy readable by
/// the user of CI's rootless pass).
pub fn fixtures_root() -> PathBuf {
    std::env::var_os("SANDCOVE_TEST_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures"))
}

/// `fixtures/python`.
pub fn py_fixtures() -> PathBuf {
    fixtures_root().join("python")
}

/// Where this user's SDKs (and the image tests' Debian root file system) are provisioned:
/// under the build directory when this user can
/// write there, else a private directory of this user in the temp dir (refused when someone
/// else made it or others may write it, since the tests run what it holds).
pub fn sdk_root() -> PathBuf {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let uid = std::fs::metadata("/proc/self").expect("/proc/self").uid();
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("sdk-uid{uid}"));
    if std::fs::create_dir_all(&target).is_ok()
        && std::fs::write(target.join(".writable"), b"").is_ok()
    {
        return target;
    }
    let tmp = std::env::temp_dir().join(format!("sandcove-sdk-uid{uid}"));
    match std::fs::create_dir(&tmp) {
        Ok(()) => std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o700))
            .expect("make the SDK directory private"),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => panic!("cannot create {}: {e}", tmp.display()),
    }
    let meta = std::fs::symlink_metadata(&tmp).expect("the SDK directory");
    assert!(
        meta.is_dir() && meta.uid() == uid && meta.mode() & 0o022 == 0,
        "refusing to use {}: not a directory of uid {uid} that only it can write",
        tmp.display()
    );
    tmp
}

/// A `python3` this user can run, with the venv module: the one on PATH, else the system's.
fn python3() -> PathBuf {
    let mut tried = Vec::new();
    for candidate in ["python3", "/usr/bin/python3"] {
        match Command::new(candidate)
            .args(["-c", "import venv, ensurepip"])
            .output()
        {
            Ok(out) if out.status.success() => return PathBuf::from(candidate),
            other => tried.push(format!("{candidate}: {other:?}")),
        }
    }
    panic!(
        "no usable python3 ({}): the official-SDK tests need python3 (3.9 or newer, with the \
         venv module) on PATH or at /usr/bin/python3",
        tried.join("; ")
    )
}

/// A short, stable fingerprint of some bytes, so a changed pin gets a fresh install.
pub fn fingerprint(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// Build `dir` once: `fill` populates a private directory, which is then renamed into place.
/// One build at a time per directory: tests that need it meanwhile (this program's, run in
/// parallel, or another program's) wait for that build instead of downloading and building
/// the same packages again.
pub fn provision(dir: &Path, fill: impl FnOnce(&Path)) {
    if dir.join(".complete").exists() {
        return;
    }
    let root = dir.parent().expect("a parent directory");
    std::fs::create_dir_all(root).expect("the SDK directory");
    let name = dir.file_name().unwrap().to_string_lossy();
    let lock = std::fs::File::create(root.join(format!(".lock-{name}")))
        .expect("the provisioning lock file");
    // Held until this function returns (the descriptor closes), the install renamed in place.
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)
        .expect("the provisioning lock");
    if dir.join(".complete").exists() {
        return;
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let tmp = root.join(format!(".tmp-{name}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&tmp).expect("a private build directory");
    fill(&tmp);
    std::fs::write(tmp.join(".complete"), b"").expect("the completion marker");
    if std::fs::rename(&tmp, dir).is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
        assert!(
            dir.join(".complete").exists(),
            "could not install {}",
            dir.display()
        );
    }
}

/// The virtualenv holding the pinned packages of `fixtures/python/<pins>`, built once.
pub fn venv(pins: &str) -> PathBuf {
    let pin_file = py_fixtures().join(pins);
    let bytes = std::fs::read(&pin_file).expect("the pin file");
    let stem = pins.trim_end_matches(".txt");
    let python = python3();
    let mut key = bytes.clone();
    key.extend_from_slice(python.as_os_str().as_encoded_bytes());
    let dir = sdk_root().join(format!("py-{stem}-{}", fingerprint(&key)));
    provision(&dir, |tmp| {
        let status = Command::new(&python)
            .args(["-m", "venv"])
            .arg(tmp)
            .status()
            .expect("python3 -m venv");
        assert!(status.success(), "python3 -m venv {} failed", tmp.display());
        let out = Command::new(tmp.join("bin/python"))
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "-r",
            ])
            .arg(&pin_file)
            .output()
            .expect("pip install");
        assert!(
            out.status.success(),
            "pip install -r {} failed:\n{}",
            pin_file.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    });
    dir
}

/// A `sandcove serve` child process with one vendor listener and a private state directory.
pub struct Server {
    child: Child,
    /// The vendor listener's origin.
    pub origin: String,
    /// The server's API key.
    pub key: String,
    /// The vendor (`daytona`, `e2b`).
    pub vendor: String,
    /// The server's state directory.
    pub state: PrivateState,
}

impl Server {
    /// Start `sandcove serve --<vendor> 127.0.0.1:0` with API key `key`. `announce` is how
    /// the server names the listener on stderr (`Daytona wire protocol`).
    pub fn start(vendor: &str, announce: &str, key: &str) -> Server {
        Server::start_with(vendor, announce, key, &[])
    }

    /// [`Server::start`] with more `sandcove serve` arguments (`--tls-cert …`).
    pub fn start_with(vendor: &str, announce: &str, key: &str, more: &[&str]) -> Server {
        let state = PrivateState::new();
        let flag = format!("--{vendor}");
        let mut args = vec!["--listen", "127.0.0.1:0", &flag, "127.0.0.1:0"];
        args.extend_from_slice(more);
        let native = ServeChild::start(
            &args,
            &[
                ("SANDCOVE_API_KEY", key.as_ref()),
                ("SANDCOVE_STATE_DIR", state.dir.as_os_str()),
            ],
            &[],
            "sandcove serve: listening on",
        )
        .expect("the server announces its native listener");
        let ServeChild {
            child,
            mut stderr,
            url: native,
        } = native;
        // The vendor listener is announced next.
        let prefix = format!("sandcove serve: {announce} on ");
        let mut origin = None;
        for _ in 0..6 {
            let mut line = String::new();
            if stderr.read_line(&mut line).unwrap_or(0) == 0 {
                break;
            }
            if let Some(url) = line.trim().strip_prefix(&prefix) {
                origin = Some(url.to_string());
                break;
            }
        }
        let (child, _) = ServeChild {
            child,
            stderr,
            url: native,
        }
        .drain_stderr();
        Server {
            child,
            origin: origin.expect("the server announces its vendor listener"),
            key: key.to_string(),
            vendor: vendor.to_string(),
            state,
        }
    }

    /// `sandcove env <vendor>` for this server: the variables, from its `export` lines.
    pub fn env(&self) -> Result<Vec<(String, String)>, String> {
        let out = Command::new(bin())
            .args(["env", &self.vendor])
            .env("SANDCOVE_API_KEY", &self.key)
            .env("SANDCOVE_STATE_DIR", &self.state.dir)
            .output()
            .expect("sandcove env");
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.strip_prefix("export "))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.trim_matches('\'').to_string()))
            .collect())
    }

    /// Stop with SIGTERM, as Ctrl-C would, and wait for the exit.
    pub fn stop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(30) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Run `fixtures/python/<name>.py` with the venv of `pins` and exactly the variables
/// `server`'s `sandcove env` prints (plus `extra`), from the fixtures directory.
pub fn run_python(pins: &str, name: &str, server: &Server, extra: &[(&str, &str)]) -> Output {
    let venv = venv(pins);
    let vars = server.env().expect("sandcove env");
    let mut cmd = Command::new(venv.join("bin/python"));
    cmd.arg(py_fixtures().join(format!("{name}.py")))
        .current_dir(py_fixtures())
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", std::env::var_os("HOME").unwrap_or_default())
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("SDK_TEST_TAG", format!("{name}-{}", std::process::id()));
    for (k, v) in &vars {
        cmd.env(k, v);
    }
    for (k, v) in extra {
        cmd.env(k, v);
    }
    cmd.output().expect("run the program")
}

/// Assert that `out` is a success whose stdout is `fixtures/python/<name>.expected`.
pub fn assert_expected(name: &str, out: &Output) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{name}.py failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let expected = std::fs::read_to_string(py_fixtures().join(format!("{name}.expected")))
        .expect("the expected output");
    assert_eq!(stdout, expected, "{name}.py printed something else");
}

/// `fixtures/js/<dir>`.
pub fn js_fixtures(dir: &str) -> PathBuf {
    fixtures_root().join("js").join(dir)
}

/// A directory holding `node_modules` for `fixtures/js/<dir>/package-lock.json`, built once
/// with `npm ci`.
pub fn node_project(dir: &str) -> PathBuf {
    let lock = std::fs::read(js_fixtures(dir).join("package-lock.json")).expect("the lock file");
    let manifest = std::fs::read(js_fixtures(dir).join("package.json")).expect("package.json");
    let mut both = lock.clone();
    both.extend_from_slice(&manifest);
    let project = sdk_root().join(format!("js-{dir}-{}", fingerprint(&both)));
    provision(&project, |tmp| {
        for tool in ["node", "npm"] {
            match Command::new(tool).arg("--version").output() {
                Ok(out) if out.status.success() => {}
                other => panic!(
                    "{tool} is missing ({other:?}): the official JavaScript SDK tests need \
                     node (18 or newer) and npm on PATH"
                ),
            }
        }
        std::fs::write(tmp.join("package.json"), &manifest).unwrap();
        std::fs::write(tmp.join("package-lock.json"), &lock).unwrap();
        let out = Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund", "--ignore-scripts"])
            .current_dir(tmp)
            .output()
            .expect("npm ci");
        assert!(
            out.status.success(),
            "npm ci failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
    project
}

/// Run `fixtures/js/<dir>/<name>.mjs` with the pinned SDK and exactly the variables
/// `server`'s `sandcove env` prints; assert it succeeds, ends by itself within `limit`, and
/// prints `<name>.expected`.
pub fn check_node(dir: &str, name: &str, server: &Server, limit: Duration) {
    check_node_with(dir, name, server, limit, &[]);
}

/// Run `fixtures/js/<dir>/<name>.mjs` as [`check_node`] does (plus `extra` variables) and
/// return how it ended and what it printed (stdout, stderr), without judging either.
pub fn run_node(
    dir: &str,
    name: &str,
    server: &Server,
    limit: Duration,
    extra: &[(&str, &str)],
) -> (std::process::ExitStatus, String, String) {
    let project = node_project(dir);
    // ES modules resolve packages from their own directory upwards: run a copy placed in
    // the provisioned project.
    let program = project.join(format!("{name}.mjs"));
    std::fs::copy(js_fixtures(dir).join(format!("{name}.mjs")), &program)
        .expect("copy the program");
    let vars = server.env().expect("sandcove env");
    let mut cmd = Command::new("node");
    cmd.arg(&program)
        .current_dir(&project)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", std::env::var_os("HOME").unwrap_or_default())
        .env("SDK_TEST_TAG", format!("js-{name}-{}", std::process::id()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in &vars {
        cmd.env(k, v);
    }
    for (k, v) in extra {
        cmd.env(k, v);
    }
    let started = Instant::now();
    let mut child = cmd.spawn().expect("run node");
    // Read both pipes on threads so a chatty program never blocks on a full pipe.
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out_thread = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = std::io::Read::read_to_end(&mut stdout, &mut v);
        v
    });
    let err_thread = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = std::io::Read::read_to_end(&mut stderr, &mut v);
        v
    });
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for node") {
            break status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{name}.mjs did not end by itself within {limit:?} (an open socket?)");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stdout = String::from_utf8_lossy(&out_thread.join().unwrap()).into_owned();
    let stderr = String::from_utf8_lossy(&err_thread.join().unwrap()).into_owned();
    (status, stdout, stderr)
}

/// [`check_node`] with `extra` variables for the program.
pub fn check_node_with(
    dir: &str,
    name: &str,
    server: &Server,
    limit: Duration,
    extra: &[(&str, &str)],
) {
    let (status, stdout, stderr) = run_node(dir, name, server, limit, extra);
    assert!(
        status.success(),
        "{name}.mjs failed ({status}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    let expected = std::fs::read_to_string(js_fixtures(dir).join(format!("{name}.expected")))
        .expect("the expected output");
    assert_eq!(stdout, expected, "{name}.mjs printed something else");
}
