//! Helpers shared by the hardening suites (`hardening*.rs`): a private engine per test that
//! cleans up after itself, host-side process and mount inspection, canary files whose every
//! byte and timestamp is checked afterwards, and a small deterministic path generator.
//!
//! The hardening modules of this test binary name it `common`; the suites that keep a binary
//! of their own include it with `#[path = "it/hardening_common.rs"] mod common;`. Its own
//! tests live in `hardening.rs`.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sandcove::{Backend, Command, CreateOptions, LocalBackend, Output, ProcessSpec};
pub use sandcove_conformance::{
    equals, eventually, holds, host_process_count, host_processes_named, PATIENCE,
};
use sandcove_conformance::{run, unique};

/// Label every hardening sandbox carries (with the test's own marker as its value).
pub const LABEL: &str = "hardening";

/// A private engine: its own state directory under the temp dir. Dropping it ends every
/// sandbox still alive there (SIGTERM to their monitors, SIGKILL if that is not enough) and
/// removes the directory, so a failed test leaves nothing behind.
pub struct Env {
    /// The engine as a trait object.
    pub backend: Arc<dyn Backend>,
    /// The engine itself.
    pub local: LocalBackend,
    /// Its state directory.
    pub dir: PathBuf,
}

impl Env {
    /// A fresh engine with a private state directory.
    pub fn new(tag: &str) -> Env {
        let dir = std::env::temp_dir().join(unique(&format!("hc-{tag}")));
        Env::at(dir)
    }

    /// An engine over an existing (or new) state directory, as another program would open it.
    pub fn at(dir: PathBuf) -> Env {
        // No warm pool: these suites account for every sandbox and process of their state
        // directory (claimed sandboxes are covered by the conformance suite).
        let local = LocalBackend::with_state_dir(&dir)
            .expect("start the local engine")
            .with_warm_pool(0);
        Env {
            backend: Arc::new(local.clone()),
            local,
            dir,
        }
    }

    /// The same engine, bounding its sandboxes by `bounds` instead of the host's defaults.
    pub fn with_bounds(mut self, bounds: sandcove::backend::local::SandboxBounds) -> Env {
        self.local = self
            .local
            .clone()
            .with_sandbox_bounds(bounds)
            .expect("bounds");
        self.backend = Arc::new(self.local.clone());
        self
    }

    /// Create options for a test sandbox: labelled, with a short lease.
    pub fn options(&self, marker: &str) -> CreateOptions {
        CreateOptions::default()
            .timeout(Duration::from_secs(90))
            .label(LABEL, marker)
    }

    /// Create a sandbox with [`Env::options`].
    pub async fn sandbox(&self, marker: &str) -> String {
        self.create(self.options(marker)).await
    }

    /// Create a sandbox with explicit options.
    pub async fn create(&self, options: CreateOptions) -> String {
        self.backend
            .create(options)
            .await
            .unwrap_or_else(|e| panic!("create a sandbox: {e}"))
            .id
    }

    /// Names in the state directory's `sandboxes/`.
    pub fn state_entries(&self) -> Vec<String> {
        state_entries(&self.dir)
    }

    /// Pids of the monitors serving sandboxes of this state directory.
    pub fn monitors(&self) -> Vec<u32> {
        monitors_of(&self.dir)
    }

    /// Pids of every engine process (monitors and agents) of this state directory.
    pub fn engine_processes(&self) -> Vec<u32> {
        engine_processes_of(&self.dir)
    }

    /// Wait (bounded) until no monitor, no state entry and no mount of this engine is left.
    pub async fn assert_nothing_left(&self, what: &str) {
        eventually(PATIENCE, what, || async {
            let processes = self.engine_processes();
            let entries = self.state_entries();
            let mounted = host_mounts_mention(&self.dir.to_string_lossy());
            holds(
                processes.is_empty() && entries.is_empty() && !mounted,
                format!(
                    "left behind engine processes {processes:?}, state entries {entries:?}, \
                     mounts: {mounted}"
                ),
            )
        })
        .await;
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        terminate_monitors(&self.dir);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// End every monitor of state directory `dir` and wait (bounded) for them to go.
pub fn terminate_monitors(dir: &Path) {
    for pid in monitors_of(dir) {
        signal(pid, libc::SIGTERM);
    }
    let start = Instant::now();
    while !engine_processes_of(dir).is_empty() && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    for pid in engine_processes_of(dir) {
        signal(pid, libc::SIGKILL);
    }
}

/// Names in `<dir>/sandboxes/`.
pub fn state_entries(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir.join("sandboxes")) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Send `sig` to host process `pid` (errors ignored: it may be gone already).
pub fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) takes plain integers.
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

/// Whether host process `pid` exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    proc_stat(pid).is_some_and(|s| s.state != 'Z')
}

/// The fields of `/proc/<pid>/stat` the suites use.
#[derive(Debug, Clone)]
pub struct ProcStat {
    /// Pid.
    pub pid: u32,
    /// Command name (`comm`).
    pub comm: String,
    /// State letter.
    pub state: char,
    /// Parent pid.
    pub ppid: u32,
}

/// Parse `/proc/<pid>/stat`.
pub fn proc_stat(pid: u32) -> Option<ProcStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text[open + 1..close].to_string();
    let mut rest = text[close + 1..].split_whitespace();
    let state = rest.next()?.chars().next()?;
    let ppid = rest.next()?.parse().ok()?;
    Some(ProcStat {
        pid,
        comm,
        state,
        ppid,
    })
}

/// Every host process.
pub fn all_processes() -> Vec<ProcStat> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(proc_stat)
        .collect()
}

/// Live (non-zombie) descendants of host process `root`.
pub fn descendants(root: u32) -> Vec<u32> {
    let procs = all_processes();
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        for p in &procs {
            if p.ppid == parent && p.state != 'Z' && !found.contains(&p.pid) {
                found.push(p.pid);
            }
        }
        i += 1;
    }
    found.remove(0);
    found
}

/// Pids of the monitors whose sandbox lives under state directory `dir`.
pub fn monitors_of(dir: &Path) -> Vec<u32> {
    only_monitors(engine_processes_of(dir))
}

/// Pids of every engine process (monitors, and the agents they clone) whose sandbox lives
/// under state directory `dir`.
pub fn engine_processes_of(dir: &Path) -> Vec<u32> {
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let under = dir.join("sandboxes");
    engine_processes_holding(|file| file.starts_with(&under))
}

/// Pid of the monitor of sandbox `id` (under any state directory).
pub fn monitor_of(id: &str) -> Option<u32> {
    only_monitors(engine_processes_holding(|file| {
        file.file_name().is_some_and(|n| n == "lock")
            && file
                .parent()
                .and_then(Path::file_name)
                .is_some_and(|n| n == id)
            && file
                .parent()
                .and_then(Path::parent)
                .and_then(Path::file_name)
                .is_some_and(|n| n == "sandboxes")
    }))
    .into_iter()
    .next()
}

fn only_monitors(pids: Vec<u32>) -> Vec<u32> {
    pids.into_iter()
        .filter(|p| proc_stat(*p).is_some_and(|s| s.comm == "sandcove-mon"))
        .collect()
}

/// Live monitors holding an open file for which `pred` holds, and the agents they cloned.
/// Every monitor holds its sandbox's `<state dir>/sandboxes/<id>/lock` for its life, which
/// identifies it exactly (its environment does not: monitors are forks of one spawner per
/// program); an agent is the monitor's child named `sandcove-agent` (it dies with it).
fn engine_processes_holding(pred: impl Fn(&Path) -> bool) -> Vec<u32> {
    let processes = all_processes();
    let mut out: Vec<u32> = Vec::new();
    for p in &processes {
        if p.state == 'Z' || p.comm != "sandcove-mon" {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(format!("/proc/{}/fd", p.pid)) else {
            continue;
        };
        if fds
            .flatten()
            .filter_map(|fd| std::fs::read_link(fd.path()).ok())
            .any(|file| pred(&file))
        {
            out.push(p.pid);
        }
    }
    let agents: Vec<u32> = processes
        .iter()
        .filter(|p| p.state != 'Z' && p.comm == "sandcove-agent" && out.contains(&p.ppid))
        .map(|p| p.pid)
        .collect();
    out.extend(agents);
    out
}

/// The agent (`sandcove-agent`, PID 1 of the sandbox) under monitor `monitor`.
pub fn agent_of(monitor: u32) -> Option<u32> {
    all_processes()
        .into_iter()
        .find(|p| p.ppid == monitor && p.comm == "sandcove-agent" && p.state != 'Z')
        .map(|p| p.pid)
}

/// Monitor and agent pids of sandbox `id`, waiting (bounded) for both to show.
pub async fn monitor_and_agent(id: &str) -> (u32, u32) {
    let what = format!("the monitor and agent of sandbox {id} show");
    eventually(PATIENCE, &what, || async {
        let monitor = monitor_of(id).ok_or("no monitor")?;
        let agent = agent_of(monitor).ok_or("no agent")?;
        Ok::<_, &str>((monitor, agent))
    })
    .await
}

/// Whether this process's mount table mentions `needle` (a sandbox mount leaking to the host
/// would).
pub fn host_mounts_mention(needle: &str) -> bool {
    std::fs::read_to_string("/proc/self/mountinfo").is_ok_and(|t| t.contains(needle))
}

/// Resident memory of this process, KiB.
pub fn rss_kib() -> u64 {
    let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// A host process (`sleep`) named `marker` (its exact `argv[0]`); killed on drop.
pub struct HostSleeper {
    /// The child.
    pub child: std::process::Child,
}

impl HostSleeper {
    /// Start `sleep 600` on the host under the name `marker`.
    pub fn start(marker: &str) -> HostSleeper {
        let child = std::process::Command::new("bash")
            .args(["-c", &format!("exec -a {marker} sleep 600")])
            .stdin(std::process::Stdio::null())
            .spawn()
            .expect("start a host sleep");
        // Until bash has exec'd, the child is still named `bash`: a caller that looks the
        // sleeper up by name right away must find it.
        let argv0 = format!("/proc/{}/cmdline", child.id());
        let deadline = Instant::now() + PATIENCE;
        while !std::fs::read(&argv0)
            .is_ok_and(|c| c.split(|b| *b == 0).next() == Some(marker.as_bytes()))
        {
            assert!(
                Instant::now() < deadline,
                "the host sleeper never took the name {marker}"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        HostSleeper { child }
    }

    /// Its host pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it still runs.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for HostSleeper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a canary entry looked like when planted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprint {
    kind: &'static str,
    mode: u32,
    mtime_ns: i128,
    ctime_ns: i128,
    content: Vec<u8>,
}

/// Host files and directories nobody may touch, fingerprinted (kind, mode, times, bytes,
/// symlink targets) so any change, creation or removal beneath them is seen.
pub struct Canaries {
    /// Roots watched.
    pub roots: Vec<PathBuf>,
    before: BTreeMap<PathBuf, Fingerprint>,
}

impl Canaries {
    /// Plant a canary tree under each of `roots` (created if missing) and fingerprint it.
    pub fn plant(roots: &[PathBuf]) -> Canaries {
        for root in roots {
            std::fs::create_dir_all(root.join("dir/sub")).unwrap();
            std::fs::write(root.join("secret"), b"host secret: must stay unread").unwrap();
            std::fs::write(root.join("dir/inner"), b"inner").unwrap();
            std::fs::write(root.join("dir/sub/deep"), b"deep").unwrap();
            let _ = std::os::unix::fs::symlink("secret", root.join("link"));
        }
        let mut c = Canaries {
            roots: roots.to_vec(),
            before: BTreeMap::new(),
        };
        c.before = c.fingerprint();
        c
    }

    fn fingerprint(&self) -> BTreeMap<PathBuf, Fingerprint> {
        let mut out = BTreeMap::new();
        for root in &self.roots {
            walk(root, &mut out);
        }
        out
    }

    /// Panic naming every entry that changed, appeared or vanished.
    pub fn assert_unchanged(&self, what: &str) {
        let diffs = self.changes();
        assert!(diffs.is_empty(), "{what}: host canaries touched: {diffs:?}");
    }

    /// Every entry that changed, appeared or vanished since planting.
    pub fn changes(&self) -> Vec<String> {
        let now = self.fingerprint();
        let mut diffs = Vec::new();
        for (path, fp) in &self.before {
            match now.get(path) {
                None => diffs.push(format!("removed {}", path.display())),
                Some(n) if n != fp => diffs.push(format!("changed {}", path.display())),
                _ => {}
            }
        }
        for path in now.keys() {
            if !self.before.contains_key(path) {
                diffs.push(format!("created {}", path.display()));
            }
        }
        diffs
    }

    /// How many entries are watched.
    pub fn count(&self) -> usize {
        self.before.len()
    }
}

fn walk(path: &Path, out: &mut BTreeMap<PathBuf, Fingerprint>) {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return;
    };
    let ft = meta.file_type();
    let (kind, content) = if ft.is_symlink() {
        (
            "symlink",
            std::fs::read_link(path)
                .map(|t| t.into_os_string().into_encoded_bytes())
                .unwrap_or_default(),
        )
    } else if ft.is_dir() {
        ("dir", Vec::new())
    } else {
        ("file", std::fs::read(path).unwrap_or_default())
    };
    out.insert(
        path.to_path_buf(),
        Fingerprint {
            kind,
            mode: meta.mode(),
            mtime_ns: meta.mtime() as i128 * 1_000_000_000 + meta.mtime_nsec() as i128,
            ctime_ns: meta.ctime() as i128 * 1_000_000_000 + meta.ctime_nsec() as i128,
            content,
        },
    );
    if ft.is_dir() {
        if let Ok(entries) = std::fs::read_dir(path) {
            for e in entries.flatten() {
                walk(&e.path(), out);
            }
        }
    }
}

/// A small deterministic generator (xorshift64*): the same seed gives the same cases on every
/// run and machine, so a failing case can be replayed from its printed seed and index.
pub struct Gen(u64);

impl Gen {
    /// A generator from `seed` (0 is replaced by a fixed odd constant).
    pub fn new(seed: u64) -> Gen {
        Gen(if seed == 0 {
            0x9E37_79B9_7F4A_7C15
        } else {
            seed
        })
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// One of `items`.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// A path built from `components` (1 to 8 of them), absolute or relative.
    pub fn path(&mut self, components: &[&str]) -> String {
        let n = 1 + self.below(8);
        let parts: Vec<&str> = (0..n).map(|_| *self.pick(components)).collect();
        let joined = parts.join("/");
        if self.below(2) == 0 {
            format!("/{joined}")
        } else {
            joined
        }
    }
}

/// Run a bash script inside sandbox `id` and collect its output.
pub async fn bash(backend: &dyn Backend, id: &str, script: &str) -> Output {
    run(
        backend,
        id,
        ProcessSpec::new(Command::argv(["bash", "-c", script])),
    )
    .await
}

/// A one-chunk upload source.
pub fn bytes(data: &[u8]) -> sandcove::ByteStream {
    let data = data.to_vec();
    Box::pin(futures::stream::once(async move { Ok(data) }))
}

/// Read a whole file of sandbox `id` through the file API.
pub async fn read_all(backend: &dyn Backend, id: &str, path: &str) -> sandcove::Result<Vec<u8>> {
    use futures::StreamExt;
    let mut stream = backend.read_file(id, path, Default::default()).await?;
    let mut out = Vec::new();
    while let Some(chunk) = stream.next().await {
        out.extend_from_slice(&chunk?);
    }
    Ok(out)
}

/// Send raw protocol frames (JSON headers, empty bodies) to a sandbox's monitor socket, as a
/// client of another version or a buggy one would, and return the header of the first frame
/// answered (`None` if the connection closes without one).
pub async fn raw_exchange(
    state_dir: &Path,
    id: &str,
    frames: &[serde_json::Value],
) -> Option<serde_json::Value> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let sock = state_dir.join("sandboxes").join(id).join("sock");
    let mut stream = tokio::net::UnixStream::connect(&sock)
        .await
        .unwrap_or_else(|e| panic!("connect to {}: {e}", sock.display()));
    let mut out = Vec::new();
    for frame in frames {
        let head = serde_json::to_vec(frame).expect("encode a frame header");
        out.extend_from_slice(&(head.len() as u32).to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&head);
    }
    stream.write_all(&out).await.expect("send the frames");
    let mut prefix = [0u8; 8];
    tokio::time::timeout(PATIENCE, stream.read_exact(&mut prefix))
        .await
        .expect("an answer in time")
        .ok()?;
    let hlen = u32::from_le_bytes(prefix[..4].try_into().unwrap()) as usize;
    assert!(hlen < 1 << 20, "a sane header length, got {hlen}");
    let mut head = vec![0u8; hlen];
    stream.read_exact(&mut head).await.expect("the header");
    Some(serde_json::from_slice(&head).expect("a JSON header"))
}

/// Whether the sandbox can run `python3` (the socket probes need it); says SKIP when not.
pub async fn has_python(backend: &dyn Backend, id: &str) -> bool {
    let out = bash(backend, id, "command -v python3 >/dev/null && echo yes").await;
    if out.stdout != b"yes\n" {
        eprintln!("SKIP: python3 is not installed on this host; socket probes not run");
        return false;
    }
    true
}

/// Runs a Python probe in the sandbox and returns its stdout; the probe must succeed.
pub async fn python(backend: &dyn Backend, id: &str, script: &str) -> String {
    let out = run(
        backend,
        id,
        ProcessSpec::new(Command::argv(["python3", "-c", script])),
    )
    .await;
    assert!(
        out.exit_status().success(),
        "probe failed: {}",
        out.stderr_lossy()
    );
    out.stdout_lossy()
}
