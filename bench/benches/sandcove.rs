//! Sandcove against the floor and its peers, side by side in one run.
//!
//! `cargo bench -p sandcove-bench` (add `-- --quick` for a shorter run, `-- --scale` for the
//! 1,000-sandbox rows, which need a few GiB of memory, `-- --files` for the files rows
//! alone, `-- --images` for the pull rows against skopeo + umoci and the 100 sandboxes of
//! one image: Debian's docker-registry, skopeo and umoci installed; `-- --create-images` for
//! the image create rows alone). Every latency row is sampled once per round, rounds interleave all rows, so a
//! noisy neighbour slows every row alike and the ratios to the floor stay meaningful.
//! Nothing here asserts a timing.
#![forbid(unsafe_code)]

#[path = "parts/images.rs"]
mod images;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use sandcove::{
    Backend, ByteStream, Command, CreateOptions, HttpBackend, LocalBackend, ProcessEvent,
    ProcessSpec, WriteOptions,
};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

struct Row {
    name: &'static str,
    what: String,
    samples: Vec<Duration>,
}

impl Row {
    fn new(name: &'static str, what: impl Into<String>) -> Self {
        Row {
            name,
            what: what.into(),
            samples: Vec::new(),
        }
    }

    fn pct(&self, p: f64) -> Duration {
        let mut s = self.samples.clone();
        s.sort();
        if s.is_empty() {
            return Duration::ZERO;
        }
        let i = ((s.len() as f64 - 1.0) * p).round() as usize;
        s[i]
    }
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1000.0)
}

fn short_options() -> CreateOptions {
    CreateOptions::default().timeout(Duration::from_secs(600))
}

/// Time `echo hi` to its first output byte and its exit.
async fn echo(backend: &dyn Backend, id: &str) -> Result<Duration, BoxError> {
    let start = Instant::now();
    let mut stream = backend
        .spawn(id, ProcessSpec::new(Command::argv(["echo", "hi"])))
        .await?;
    while let Some(ev) = stream.events.next().await {
        if let ProcessEvent::Exit(_) = ev? {
            break;
        }
    }
    Ok(start.elapsed())
}

/// `echo hi` through E2B's wire protocol: `process.Process/Start` over Connect (JSON
/// envelopes), read to the end of the stream, as E2B's SDKs do.
async fn echo_e2b_wire(wire: &E2bWire) -> Result<Duration, BoxError> {
    let payload = serde_json::to_vec(&serde_json::json!({
        "process": {"cmd": "echo", "args": ["hi"]},
        "stdin": false,
    }))?;
    let mut body = vec![0u8];
    body.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    body.extend_from_slice(&payload);
    let start = Instant::now();
    let r = wire
        .http
        .post(format!("{}/process.Process/Start", wire.url))
        .header("E2b-Sandbox-Id", &wire.id)
        .header("E2b-Sandbox-Port", "49983")
        .header("X-Access-Token", &wire.token)
        .header("Connect-Protocol-Version", "1")
        .header("Content-Type", "application/connect+json")
        .body(body)
        .send()
        .await?;
    let bytes = r.bytes().await?;
    let elapsed = start.elapsed();
    // The last envelope must be the end of stream (flag 2) with no error, after an exit 0.
    let text = String::from_utf8_lossy(&bytes);
    if !text.contains("\"exitCode\"") && !text.contains("\"exited\":true") {
        return Err(format!("no end event in {text}").into());
    }
    if text.contains("\"error\"") {
        return Err(format!("the stream ended with an error: {text}").into());
    }
    Ok(elapsed)
}

/// A sandbox made through the E2B listener, and what reaching its envd takes.
struct E2bWire {
    http: reqwest::Client,
    url: String,
    key: String,
    id: String,
    token: String,
}

/// The official Python SDK's `commands.run("echo hi")`, 100 calls, in milliseconds; `None`
/// (with the reason) when no Python with the pinned SDK is found.
fn python_sdk_samples(url: &str, key: &str) -> Result<Vec<Duration>, String> {
    const PROGRAM: &str = r#"
from e2b import Sandbox
import time

sbx = Sandbox.create(timeout=600)
try:
    sbx.commands.run("echo hi")
    for _ in range(100):
        t = time.perf_counter()
        sbx.commands.run("echo hi")
        print(time.perf_counter() - t)
finally:
    sbx.kill()
"#;
    let python = match std::env::var_os("SANDCOVE_BENCH_PYTHON") {
        Some(p) => std::path::PathBuf::from(p),
        None => bench_venv("pins-e2b-2.63.0.txt")
            .map_err(|e| format!("skipped: cannot provision the pinned e2b SDK: {e}"))?
            .join("bin/python"),
    };
    let out = std::process::Command::new(&python)
        .args(["-c", PROGRAM])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", std::env::var_os("HOME").unwrap_or_default())
        .env("E2B_API_URL", url)
        .env("E2B_SANDBOX_URL", url)
        .env("E2B_API_KEY", key)
        .output()
        .map_err(|e| format!("{}: {e}", python.display()))?;
    seconds_per_line(&out, "Python")
}

/// The connection limits of the bench's vendor listeners.
fn listener_limits() -> sandcove::server::ConnectionLimits {
    sandcove::server::ConnectionLimits {
        max_connections: 64,
        head_timeout: Duration::from_secs(10),
        body_idle_timeout: Duration::from_secs(60),
        write_stall_timeout: Duration::from_secs(60),
        upstream_answer_timeout: Duration::from_secs(60),
        shutdown_grace: Duration::from_secs(1),
        tls: None,
    }
}

/// The samples a timing program printed (seconds, one per line), or why it failed.
fn seconds_per_line(out: &std::process::Output, sdk: &str) -> Result<Vec<Duration>, String> {
    if !out.status.success() {
        return Err(format!(
            "the {sdk} SDK program failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            l.trim()
                .parse::<f64>()
                .map(Duration::from_secs_f64)
                .map_err(|e| format!("{l:?}: {e}"))
        })
        .collect()
}

/// An SDK install the official-SDK tests provisioned under the build directory (any user's
/// `sdk…` directory), by the name's prefix.
fn provisioned(prefix: &str) -> Option<std::path::PathBuf> {
    let tmp = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::read_dir(tmp)
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|d| {
            d.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("sdk"))
        })
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flatten()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
                && p.join(".complete").exists()
        })
}

/// How many `create()` calls each official Daytona SDK makes.
const DAYTONA_CREATES: usize = 20;

/// `create()` through an official Daytona SDK against the Daytona listener at `api`
/// (`…/api`), `DAYTONA_CREATES` times after one warm-up, each sandbox deleted after it is
/// timed; `Err` says why the row was skipped.
fn daytona_sdk_creates(language: &str, api: &str, key: &str) -> Result<Vec<Duration>, String> {
    const PYTHON: &str = r#"
import sys, time
from daytona import Daytona
d = Daytona()
d.delete(d.create())
for _ in range(int(sys.argv[1])):
    t = time.perf_counter()
    sb = d.create()
    print(time.perf_counter() - t, flush=True)
    d.delete(sb)
"#;
    const NODE: &str = r#"
import { Daytona } from '@daytonaio/sdk'
const d = new Daytona()
await (await d.create()).delete()
for (let i = 0; i < Number(process.argv[2]); i++) {
  const t = performance.now()
  const sb = await d.create()
  console.log((performance.now() - t) / 1000)
  await sb.delete()
}
"#;
    let mut cmd = if language == "python" {
        let venv = bench_venv("pins-daytona-0.226.1.txt")
            .map_err(|e| format!("skipped: cannot provision the pinned daytona SDK: {e}"))?;
        let mut c = std::process::Command::new(venv.join("bin/python"));
        c.args(["-c", PYTHON, &DAYTONA_CREATES.to_string()]);
        c
    } else {
        let project = provisioned("js-daytona-").ok_or(
            "skipped: no node project with the pinned @daytonaio/sdk (run `cargo test -p \
             sandcove-cli --test it -- daytona_sdk::` once to provision it)",
        )?;
        // An ES module resolves packages from its own directory: write it into the project.
        let program = project.join(format!("bench-create-{}.mjs", std::process::id()));
        std::fs::write(&program, NODE).map_err(|e| e.to_string())?;
        let mut c = std::process::Command::new("node");
        c.arg(&program)
            .arg(DAYTONA_CREATES.to_string())
            .current_dir(&project);
        c
    };
    let out = cmd
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", std::env::var_os("HOME").unwrap_or_default())
        .env("DAYTONA_API_URL", api)
        .env("DAYTONA_API_KEY", key)
        .output()
        .map_err(|e| format!("{language}: {e}"));
    if language != "python" {
        if let Some(project) = provisioned("js-daytona-") {
            let _ = std::fs::remove_file(
                project.join(format!("bench-create-{}.mjs", std::process::id())),
            );
        }
    }
    let out = out?;
    seconds_per_line(&out, language)
}

/// Sandboxes each official Python SDK makes, uses and deletes in the `sdk-cycle` rows.
const SDK_CYCLES: usize = 20;

/// A virtualenv with the pinned packages of `fixtures/python/<pins>`, made by the bench under
/// its build directory the first time (from PyPI, as the tests provision theirs).
fn bench_venv(pins: &str) -> Result<std::path::PathBuf, String> {
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/python");
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("bench-sdk")
        .join(pins.trim_end_matches(".txt"));
    if dir.join(".complete").exists() {
        return Ok(dir);
    }
    let _ = std::fs::remove_dir_all(&dir);
    let run = |cmd: &mut std::process::Command| -> Result<(), String> {
        let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{cmd:?} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    };
    run(std::process::Command::new("python3")
        .args(["-m", "venv"])
        .arg(&dir))?;
    run(std::process::Command::new(dir.join("bin/pip"))
        .args(["install", "--quiet", "--disable-pip-version-check", "-r"])
        .arg(fixtures.join(pins)))?;
    std::fs::write(dir.join(".complete"), b"").map_err(|e| e.to_string())?;
    Ok(dir)
}

/// Each vendor's official Python SDK making a sandbox, running `echo hi` in it to its end and
/// deleting it, `SDK_CYCLES` times after one warm-up: seconds per cycle, one line each.
const SDK_CYCLE_PROGRAMS: [(&str, &str, &str); 3] = [
    (
        "e2b",
        "pins-e2b-2.63.0.txt",
        r#"
import sys, time
from e2b import Sandbox
def cycle():
    sb = Sandbox.create()
    sb.commands.run("echo hi")
    sb.kill()
cycle()
for _ in range(int(sys.argv[1])):
    t = time.perf_counter(); cycle(); print(time.perf_counter() - t, flush=True)
"#,
    ),
    (
        "daytona",
        "pins-daytona-0.226.1.txt",
        r#"
import sys, time
from daytona import Daytona
d = Daytona()
def cycle():
    sb = d.create()
    sb.process.exec("echo hi")
    d.delete(sb)
cycle()
for _ in range(int(sys.argv[1])):
    t = time.perf_counter(); cycle(); print(time.perf_counter() - t, flush=True)
"#,
    ),
    (
        "blaxel",
        "pins-blaxel-0.4.24.txt",
        r#"
import asyncio, os, sys, time
from blaxel.core import SandboxInstance
async def cycle(n):
    sb = await SandboxInstance.create({"name": f"bench-{os.getpid()}-{n}"})
    await sb.process.exec({"command": "echo hi", "wait_for_completion": True})
    await SandboxInstance.delete(sb.metadata.name)
async def main():
    await cycle(-1)
    for n in range(int(sys.argv[1])):
        t = time.perf_counter(); await cycle(n); print(time.perf_counter() - t, flush=True)
asyncio.run(main())
"#,
    ),
];

/// One vendor's `sdk-cycle` samples, with `vars` (what `sandcove env VENDOR` prints) as the
/// program's only environment besides `PATH` and `HOME`; `Err` says why the row was skipped.
fn sdk_cycles(vendor: &str, vars: &[(String, String)]) -> Result<Vec<Duration>, String> {
    let (_, pins, program) = SDK_CYCLE_PROGRAMS
        .iter()
        .find(|(v, _, _)| *v == vendor)
        .ok_or("no program")?;
    let venv = bench_venv(pins).map_err(|e| format!("skipped: cannot provision {pins}: {e}"))?;
    let out = std::process::Command::new(venv.join("bin/python"))
        .args(["-c", program, &SDK_CYCLES.to_string()])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", std::env::var_os("HOME").unwrap_or_default())
        .env("NO_PROXY", "127.0.0.1,localhost")
        .envs(vars.iter().map(|(k, v)| (k, v)))
        .output()
        .map_err(|e| format!("{vendor}: {e}"))?;
    seconds_per_line(&out, vendor)
}

/// `POST /api/sandbox` on the Daytona listener, timed to its answer (what the SDK's
/// `create()` waits for at least), then deleted.
async fn daytona_wire_create(
    http: &reqwest::Client,
    api: &str,
    key: &str,
) -> Result<Duration, BoxError> {
    let start = Instant::now();
    let created: serde_json::Value = http
        .post(format!("{api}/sandbox"))
        .bearer_auth(key)
        .json(&serde_json::json!({}))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let took = start.elapsed();
    let id = created["id"].as_str().unwrap_or_default();
    http.delete(format!("{api}/sandbox/{id}"))
        .bearer_auth(key)
        .send()
        .await?
        .error_for_status()?;
    Ok(took)
}

/// Create → first byte of `echo hi` → destroy.
async fn create_cycle(backend: &dyn Backend) -> Result<Duration, BoxError> {
    create_cycle_with(backend, short_options()).await
}

/// [`create_cycle`] with `options`.
async fn create_cycle_with(
    backend: &dyn Backend,
    options: CreateOptions,
) -> Result<Duration, BoxError> {
    let start = Instant::now();
    let id = backend.create(options).await?.id;
    let mut stream = backend
        .spawn(&id, ProcessSpec::new(Command::argv(["echo", "hi"])))
        .await?;
    while let Some(ev) = stream.events.next().await {
        if let ProcessEvent::Stdout(_) = ev? {
            break;
        }
    }
    let elapsed = start.elapsed();
    drop(stream);
    backend.destroy(&id).await?;
    Ok(elapsed)
}

fn floor() -> Duration {
    let start = Instant::now();
    let status = std::process::Command::new("true").status();
    let d = start.elapsed();
    assert!(status.map(|s| s.success()).unwrap_or(false));
    d
}

/// The exec row's program without a sandbox: `echo hi` with its output piped and read to
/// the end, then waited for. Not a target's denominator (the floor is): it tells how much of
/// the exec row is the program itself. Its environment is only `LANG=C`, so the row does not
/// depend on the locale this program was started with (a `C.UTF-8` read from locale files
/// costs tens of system calls; sandbox processes read it from an archive). The program is
/// found along `PATH` once, beforehand: with a changed environment the standard library
/// cannot use `posix_spawn` for a name it must look up, and falls back to `fork`.
fn floor_echo() -> Duration {
    static ECHO: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    let echo = ECHO.get_or_init(|| {
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .map(|dir| dir.join("echo"))
            .find(|p| p.is_file())
            .expect("echo along PATH")
    });
    let start = Instant::now();
    let out = std::process::Command::new(echo)
        .arg("hi")
        .env_clear()
        .env("LANG", "C")
        .output();
    let d = start.elapsed();
    assert!(out
        .map(|o| o.status.success() && o.stdout == b"hi\n")
        .unwrap_or(false));
    d
}

fn bwrap_available() -> bool {
    std::process::Command::new("bwrap")
        .args(["--version"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// bwrap one-shot with a comparable isolation set: user, mount, pid, ipc, uts and net
/// namespaces, read-only system directories, private /tmp, /proc and /dev.
fn bwrap() -> Duration {
    let start = Instant::now();
    let status = std::process::Command::new("bwrap")
        .args([
            "--unshare-all",
            "--die-with-parent",
            "--ro-bind",
            "/usr",
            "/usr",
            "--symlink",
            "usr/bin",
            "/bin",
            "--symlink",
            "usr/lib",
            "/lib",
            "--symlink",
            "usr/lib64",
            "/lib64",
            "--ro-bind",
            "/etc",
            "/etc",
            "--tmpfs",
            "/tmp",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "true",
        ])
        .status();
    let d = start.elapsed();
    assert!(status.map(|s| s.success()).unwrap_or(false), "bwrap ran");
    d
}

async fn write_read(backend: &dyn Backend, id: &str, bytes: usize) -> Result<Duration, BoxError> {
    let data = vec![0x5au8; bytes];
    // The chunks are the caller's data, made before the clock starts: the row times the
    // transfer, not this program copying its buffer into fresh chunks (for 100 MiB that copy
    // and its page faults were a large share of the row).
    let chunks: Vec<sandcove::Result<Vec<u8>>> =
        data.chunks(1 << 20).map(|c| Ok(c.to_vec())).collect();
    let start = Instant::now();
    let stream: ByteStream = Box::pin(futures::stream::iter(chunks));
    backend
        .write_file(id, "/tmp/bench.bin", stream, WriteOptions::default())
        .await?;
    let mut read = backend
        .read_file(id, "/tmp/bench.bin", Default::default())
        .await?;
    let mut n = 0;
    while let Some(chunk) = read.next().await {
        n += chunk?.len();
    }
    assert_eq!(n, bytes);
    Ok(start.elapsed())
}

/// Resident (RSS) and proportional (PSS, shared pages split between their users) memory in
/// kB of the monitors and agents of sandboxes `ids` (a monitor holds its sandbox's
/// `sandboxes/<id>/lock` open; its agent is its child named `sandcove-agent`, whose memory
/// only root may read), from `smaps_rollup`, and how many processes that is.
fn memory_kb_of(ids: &[String]) -> (u64, u64, usize) {
    let needles: Vec<String> = ids
        .iter()
        .map(|id| format!("/sandboxes/{id}/lock"))
        .collect();
    let stat_of = |p: &std::path::Path| -> Option<(String, u32)> {
        let stat = std::fs::read_to_string(p.join("stat")).ok()?;
        let (open, close) = (stat.find('(')?, stat.rfind(')')?);
        let ppid = stat[close + 1..].split_whitespace().nth(1)?.parse().ok()?;
        Some((stat[open + 1..close].to_string(), ppid))
    };
    let procs: Vec<(std::path::PathBuf, u32, String, u32)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_str()?.parse().ok()?;
            let (comm, ppid) = stat_of(&e.path())?;
            Some((e.path(), pid, comm, ppid))
        })
        .collect();
    let monitors: Vec<u32> = procs
        .iter()
        .filter(|(path, _, comm, _)| {
            comm == "sandcove-mon"
                && std::fs::read_dir(path.join("fd"))
                    .into_iter()
                    .flatten()
                    .flatten()
                    .filter_map(|fd| std::fs::read_link(fd.path()).ok())
                    .any(|file| {
                        let file = file.to_string_lossy();
                        needles.iter().any(|n| file.ends_with(n.as_str()))
                    })
        })
        .map(|(_, pid, _, _)| *pid)
        .collect();
    let (mut rss, mut pss) = (0, 0);
    let mut count = 0;
    for (p, pid, comm, ppid) in &procs {
        let ours = monitors.contains(pid) || (comm == "sandcove-agent" && monitors.contains(ppid));
        if !ours {
            continue;
        }
        let rollup = std::fs::read_to_string(p.join("smaps_rollup")).unwrap_or_default();
        let field = |name: &str| {
            rollup
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        };
        if let (Some(r), Some(p)) = (field("Rss:"), field("Pss:")) {
            rss += r;
            pss += p;
            count += 1;
        }
    }
    (rss, pss, count)
}

/// `MemAvailable` of the host, kB.
fn mem_available_kb() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("MemAvailable:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// `--scale`: 1,000 sandboxes created concurrently with one command each, then destroyed;
/// then 1,000 idle sandboxes held at once, with the host memory they take.
async fn scale_rows(local: Arc<dyn Backend>) {
    const N: usize = 1000;
    let start = Instant::now();
    let tasks: Vec<_> = (0..N)
        .map(|_| {
            let backend = local.clone();
            tokio::spawn(async move {
                let t = Instant::now();
                let id = backend.create(short_options()).await?.id;
                let ran = echo(&*backend, &id).await;
                backend.destroy(&id).await?;
                ran?;
                Ok::<Duration, BoxError>(t.elapsed())
            })
        })
        .collect();
    let mut per = Row::new("scale", "");
    let mut errors: std::collections::BTreeMap<String, usize> = Default::default();
    for t in tasks {
        match t.await {
            Ok(Ok(d)) => per.samples.push(d),
            Ok(Err(e)) => *errors.entry(e.to_string()).or_default() += 1,
            Err(e) => *errors.entry(e.to_string()).or_default() += 1,
        }
    }
    let wall = start.elapsed();
    println!(
        "scale: {N} sandboxes concurrently (create, one command, destroy): wall {} ms, \
         per-sandbox p50 {} ms, p99 {} ms, failures {} {errors:?}",
        wall.as_millis(),
        ms(per.pct(0.5)),
        ms(per.pct(0.99)),
        errors.values().sum::<usize>(),
    );

    let before = mem_available_kb();
    let start = Instant::now();
    let tasks: Vec<_> = (0..N)
        .map(|_| {
            let backend = local.clone();
            tokio::spawn(async move { backend.create(short_options()).await.map(|i| i.id) })
        })
        .collect();
    let mut held = Vec::new();
    let mut failures = 0;
    for t in tasks {
        match t.await {
            Ok(Ok(id)) => held.push(id),
            _ => failures += 1,
        }
    }
    let made = start.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (rss, pss, count) = memory_kb_of(&held);
    let taken = before.saturating_sub(mem_available_kb());
    println!(
        "scale: {} idle sandboxes held at once ({failures} failed; made in {} ms): RSS {} MiB, \
         PSS {} MiB ({count} processes), host MemAvailable down {} MiB ({:.0} kB per sandbox)",
        held.len(),
        made.as_millis(),
        rss / 1024,
        pss / 1024,
        taken / 1024,
        taken as f64 / held.len().max(1) as f64,
    );
    let destroys: Vec<_> = held
        .into_iter()
        .map(|id| {
            let backend = local.clone();
            tokio::spawn(async move { backend.destroy(&id).await })
        })
        .collect();
    for d in destroys {
        let _ = d.await;
    }
}

/// Waits (untimed, polling every `poll`, 200 polls at most) until the engine's warm pool of
/// two is full, so no timed row runs beside a pool member being made.
async fn wait_for_warm_pool(engine: &LocalBackend, poll: Duration) {
    for _ in 0..200 {
        if engine.warm_ready() == 2 {
            break;
        }
        tokio::time::sleep(poll).await;
    }
}

/// The files rows: 1 MiB and 100 MiB written then read back, embedded and over HTTP
/// alternately, in one sandbox; each row is the median transfer as write + read bytes per
/// second.
async fn files_rows(
    local: &dyn Backend,
    http: &dyn Backend,
    sandbox: &str,
    quick: bool,
) -> Result<Vec<(&'static str, f64, f64)>, BoxError> {
    let mut throughput = Vec::new();
    for (label, bytes, reps) in [
        ("1 MiB", 1usize << 20, if quick { 5 } else { 20 }),
        // Nine, not three: the median of three moved by a fifth between runs of one binary.
        ("100 MiB", 100 << 20, if quick { 1 } else { 9 }),
    ] {
        let mut embedded = Vec::new();
        let mut over_http = Vec::new();
        for _ in 0..reps {
            embedded.push(write_read(local, sandbox, bytes).await?);
            over_http.push(write_read(http, sandbox, bytes).await?);
        }
        // Decimal megabytes (10^6 bytes), as the issue's GB/s targets count: the column
        // was labelled MB/s but counted MiB (2^20 bytes), 4.9 % short.
        let mbps = |v: &[Duration]| {
            let mut v = v.to_vec();
            v.sort();
            let med = v[v.len() / 2];
            2.0 * bytes as f64 / 1e6 / med.as_secs_f64()
        };
        throughput.push((label, mbps(&embedded), mbps(&over_http)));
    }
    Ok(throughput)
}

fn print_files_rows(throughput: &[(&str, f64, f64)]) {
    println!("| files (write + read, 10^6 bytes/s) | embedded MB/s | HTTP MB/s |");
    println!("|---|---:|---:|");
    for (label, e, h) in throughput {
        println!("| write + read {label} | {e:.0} | {h:.0} |");
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), BoxError> {
    let quick = std::env::args().any(|a| a == "--quick");
    let rounds = if quick { 30 } else { 200 };
    let scale = std::env::args().any(|a| a == "--scale");
    let files_only = std::env::args().any(|a| a == "--files");
    if std::env::args().any(|a| a == "--create-images") {
        // `--create-images`: only the image create rows (and their host-base twin).
        println!("Sandcove benchmark — the image create rows only");
        println!();
        let cold_engine = LocalBackend::new()?.with_warm_pool(0);
        return images::create_rows(&cold_engine, (rounds / 4).max(10)).await;
    }
    // The default state directory: the facade finds its runtime the same way. `local` keeps
    // a warm pool of two (the default, set explicitly so the environment cannot change the
    // row); `cold` is the same engine without one, for the cold-create row.
    let warm_engine = LocalBackend::new()?.with_warm_pool(2);
    let local: Arc<dyn Backend> = Arc::new(warm_engine.clone());
    let cold: Arc<dyn Backend> = Arc::new(LocalBackend::new()?.with_warm_pool(0));

    // A loopback server over the same engine.
    let key = "bench-key".to_string();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(sandcove::server::serve(
        listener,
        local.clone(),
        sandcove::server::ServerConfig::new(key.clone()),
        async move {
            let _ = stop_rx.await;
        },
    ));
    let http: Arc<dyn Backend> = Arc::new(HttpBackend::connect(&url, &key).await?);

    if files_only {
        // `--files`: only the files rows, in a sandbox used for nothing else.
        let sandbox = local.create(short_options()).await?.id;
        // That create starts the warm pool filling: let it fill before timing anything.
        wait_for_warm_pool(&warm_engine, Duration::from_millis(50)).await;
        write_read(&*local, &sandbox, 1 << 20).await?;
        write_read(&*http, &sandbox, 1 << 20).await?;
        let throughput = files_rows(&*local, &*http, &sandbox, quick).await?;
        println!("Sandcove benchmark — the files rows only");
        println!();
        print_files_rows(&throughput);
        local.destroy(&sandbox).await?;
        let _ = stop_tx.send(());
        let _ = server.await;
        return Ok(());
    }

    // E2B's wire protocol over the same engine, as `sandcove serve --e2b` serves it.
    let e2b_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let e2b_url = format!("http://{}", e2b_listener.local_addr()?);
    let (e2b_stop_tx, e2b_stop_rx) = tokio::sync::oneshot::channel::<()>();
    let e2b_server = tokio::spawn(sandcove::server::serve_router(
        e2b_listener,
        e2b::wire::router(local.clone(), e2b::wire::WireConfig::new(key.clone())),
        listener_limits(),
        async move {
            let _ = e2b_stop_rx.await;
        },
    ));
    let wire_http = reqwest::Client::new();
    let created: serde_json::Value = wire_http
        .post(format!("{e2b_url}/v2/sandboxes"))
        .header("X-API-KEY", &key)
        .json(&serde_json::json!({"templateID": "base", "timeout": 600}))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let wire = E2bWire {
        http: wire_http,
        url: e2b_url.clone(),
        key: key.clone(),
        id: created["sandboxID"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        token: created["envdAccessToken"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    };

    let exec_sandbox = local.create(short_options()).await?.id;
    let facade = e2b::Sandbox::create().timeout(600).await?;
    let facade_core_id = facade.sandbox_id.clone();

    let has_bwrap = bwrap_available();
    let mut rows = vec![
        Row::new("floor", "std::process::Command running `true`"),
        Row::new(
            "peer",
            if has_bwrap {
                "bwrap one-shot running `true` (all namespaces, ro /usr /etc, tmpfs /tmp, /proc, /dev)"
            } else {
                "bwrap not installed: skipped"
            },
        ),
        Row::new(
            "create",
            "create → first byte of `echo hi` → destroy (embedded, warm pool of 2)",
        ),
        Row::new(
            "exec",
            "`echo hi` round trip in an existing sandbox (embedded)",
        ),
        Row::new(
            "exec-http",
            "`echo hi` round trip through HttpBackend ↔ loopback server",
        ),
        Row::new("facade", "e2b `commands.run(\"echo hi\")`"),
        Row::new("facade-core", "the core call that `commands.run` makes"),
        Row::new(
            "e2b-wire",
            "`echo hi` via `process.Process/Start` on the E2B listener (Rust client, Connect JSON)",
        ),
        Row::new(
            "create-cold",
            "create → first byte of `echo hi` → destroy (embedded, no pool: namespaces and root built while the caller waits)",
        ),
        Row::new(
            "floor-echo",
            "std::process::Command running `echo hi` (LANG=C), output piped and read (the exec row's program, no sandbox)",
        ),
    ];
    // Warm up every path once.
    floor();
    floor_echo();
    echo(&*local, &exec_sandbox).await?;
    echo(&*http, &exec_sandbox).await?;
    echo_e2b_wire(&wire).await?;
    facade.commands.run("echo hi").await?;
    // The pool starts filling at the first create; let it fill before sampling.
    create_cycle(&*local).await?;
    create_cycle(&*cold).await?;
    wait_for_warm_pool(&warm_engine, Duration::from_millis(50)).await;
    let claims_before = warm_engine.warm_claims();
    for round in 0..rounds {
        // The rows that make and end namespaces come first: the bwrap one-shot, then a
        // create. Their cleanup in the kernel may still run when the next row starts, so
        // the floor and the exec row take turns at being that next row (two rounds each
        // way, so warm and cold creates precede both alike). Before, the exec row always
        // came right after the create and the floor never did.
        if has_bwrap {
            rows[1].samples.push(bwrap());
        }
        // Creation is the slowest row: sample it every other round to keep the run short.
        // Warm and cold alternate; after a warm one the round waits for the pool to refill.
        if round % 2 == 0 {
            rows[2].samples.push(create_cycle(&*local).await?);
            // The claimed member's replacement is made in the background shortly after the
            // claim; wait (untimed) until it is ready, so no later row, the next cold
            // create included, is timed against that create running beside it.
            wait_for_warm_pool(&warm_engine, Duration::from_millis(5)).await;
        } else {
            rows[8].samples.push(create_cycle(&*cold).await?);
        }
        if round % 4 < 2 {
            rows[0].samples.push(floor());
            rows[3].samples.push(echo(&*local, &exec_sandbox).await?);
        } else {
            rows[3].samples.push(echo(&*local, &exec_sandbox).await?);
            rows[0].samples.push(floor());
        }
        rows[9].samples.push(floor_echo());
        rows[4].samples.push(echo(&*http, &exec_sandbox).await?);
        // The facade row and its core call take turns going first, as the floor and exec
        // rows do: whichever follows the HTTP row shares the CPUs with that call's ending.
        for facade_first in [round % 2 == 0, round % 2 == 1] {
            if facade_first {
                let start = Instant::now();
                facade.commands.run("echo hi").await?;
                rows[5].samples.push(start.elapsed());
            } else {
                let start = Instant::now();
                let spec = ProcessSpec::new(Command::bash_login("echo hi"))
                    .env("E2B_SANDBOX", "true")
                    .env("E2B_SANDBOX_ID", facade_core_id.clone())
                    .timeout(Duration::from_secs(60));
                let stream = local.spawn(&facade_core_id, spec).await?;
                sandcove::client::collect(stream, sandcove::DEFAULT_OUTPUT_LIMIT).await?;
                rows[6].samples.push(start.elapsed());
            }
        }
        rows[7].samples.push(echo_e2b_wire(&wire).await?);
    }

    let warm_hits = warm_engine.warm_claims() - claims_before;
    let warm_samples = rows[2].samples.len();

    // The official Python SDK against the same listener: its own client, its own loop.
    let (py_url, py_key) = (wire.url.clone(), wire.key.clone());
    let python = tokio::task::spawn_blocking(move || python_sdk_samples(&py_url, &py_key)).await?;

    let throughput = files_rows(&*local, &*http, &exec_sandbox, quick).await?;

    // Fan-out: 100 sandboxes created concurrently, one command each, all destroyed.
    let fan = 100;
    let start = Instant::now();
    let tasks: Vec<_> = (0..fan)
        .map(|_| {
            let backend = local.clone();
            tokio::spawn(async move {
                let t = Instant::now();
                let id = backend.create(short_options()).await?.id;
                echo(&*backend, &id).await?;
                backend.destroy(&id).await?;
                Ok::<Duration, BoxError>(t.elapsed())
            })
        })
        .collect();
    let mut per = Row::new("fan-out", "");
    let mut failures = 0;
    for t in tasks {
        match t.await? {
            Ok(d) => per.samples.push(d),
            Err(_) => failures += 1,
        }
    }
    let fan_wall = start.elapsed();

    // Idle memory: 20 idle sandboxes, resident memory of their monitors and agents.
    let idle_n = 20;
    let mut idle = Vec::new();
    for _ in 0..idle_n {
        idle.push(local.create(short_options()).await?.id);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (rss_kb, pss_kb, count) = memory_kb_of(&idle);
    let per_sandbox_kb = rss_kb as f64 / idle_n as f64;
    let per_sandbox_pss = pss_kb as f64 / idle_n as f64;
    for id in idle {
        local.destroy(&id).await?;
    }

    let floor_p50 = rows[0].pct(0.5);
    println!("Sandcove benchmark — {rounds} interleaved rounds");
    println!();
    println!("| row | p50 ms | p95 ms | p99 ms | p50 / floor | what |");
    println!("|---|---:|---:|---:|---:|---|");
    for row in &rows {
        if row.samples.is_empty() {
            println!("| {} | – | – | – | – | {} |", row.name, row.what);
            continue;
        }
        println!(
            "| {} | {} | {} | {} | {:.2}× | {} |",
            row.name,
            ms(row.pct(0.5)),
            ms(row.pct(0.95)),
            ms(row.pct(0.99)),
            row.pct(0.5).as_secs_f64() / floor_p50.as_secs_f64(),
            row.what
        );
    }
    println!();
    let ratio =
        |a: usize, b: usize| rows[a].pct(0.5).as_secs_f64() / rows[b].pct(0.5).as_secs_f64();
    println!("| ratio | value | target |");
    println!("|---|---:|---:|");
    println!("| create (warm) / floor | {:.2}× | ≤ 3× |", ratio(2, 0));
    println!("| create-cold / floor | {:.2}× | – |", ratio(8, 0));
    println!("| exec / floor | {:.2}× | ≤ 1.5× |", ratio(3, 0));
    println!("| exec / floor-echo | {:.2}× | – |", ratio(3, 9));
    println!("| facade / its core call | {:.3}× | ≤ 1.05× |", ratio(5, 6));
    println!("| exec-http / exec | {:.2}× | ≤ 2× |", ratio(4, 3));
    println!("| e2b-wire / exec-http | {:.2}× | ≤ 1.5× |", ratio(7, 4));
    if has_bwrap {
        println!(
            "| create-cold / bwrap one-shot | {:.2}× | ≤ 1.0× |",
            ratio(8, 1)
        );
    }
    println!();
    print_files_rows(&throughput);
    println!();
    println!(
        "fan-out: {fan} sandboxes concurrently (create, one command, destroy): wall {} ms, \
         per-sandbox p50 {} ms, p99 {} ms, failures {failures}",
        fan_wall.as_millis(),
        ms(per.pct(0.5)),
        ms(per.pct(0.99)),
    );
    println!(
        "idle: {per_sandbox_kb:.0} kB RSS, {per_sandbox_pss:.0} kB PSS per idle sandbox (monitor + agent, smaps_rollup: {count} processes for {idle_n} sandboxes)"
    );
    println!(
        "warm pool: {warm_hits} of {warm_samples} warm-row creates were claimed from the pool"
    );
    if scale {
        scale_rows(local.clone()).await;
    }
    println!();
    let cold_engine = LocalBackend::new()?.with_warm_pool(0);
    images::create_rows(&cold_engine, (rounds / 4).max(10)).await?;
    if std::env::args().any(|a| a == "--images") {
        println!();
        images::pull_rows(&cold_engine, if quick { 2 } else { 5 }).await?;
    }

    match &python {
        Ok(samples) => {
            let mut py = Row::new("python-sdk", "");
            py.samples = samples.clone();
            println!(
                "python-sdk: official `e2b` 2.63.0 `commands.run(\"echo hi\")` over the E2B \
                 listener, {} calls: p50 {} ms, p95 {} ms, p99 {} ms",
                py.samples.len(),
                ms(py.pct(0.5)),
                ms(py.pct(0.95)),
                ms(py.pct(0.99)),
            );
        }
        Err(why) => println!("python-sdk: {why}"),
    }

    // Daytona: the listener's create answer against the SDKs' create() end to end. The
    // difference is the SDK's own work; a wait that polled would add its poll interval.
    let daytona_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let daytona_origin = format!("http://{}", daytona_listener.local_addr()?);
    let daytona_api = format!("{daytona_origin}/api");
    let (daytona_stop_tx, daytona_stop_rx) = tokio::sync::oneshot::channel::<()>();
    let daytona_server = tokio::spawn(sandcove::server::serve_router(
        daytona_listener,
        daytona::wire::router(
            local.clone(),
            daytona::wire::WireConfig::new(key.clone(), daytona_origin.clone()),
        ),
        listener_limits(),
        async move {
            let _ = daytona_stop_rx.await;
        },
    ));
    let daytona_http = reqwest::Client::new();
    daytona_wire_create(&daytona_http, &daytona_api, &key).await?;
    let mut daytona_wire = Row::new("daytona-wire-create", "");
    let claims = warm_engine.warm_claims();
    for _ in 0..DAYTONA_CREATES {
        daytona_wire
            .samples
            .push(daytona_wire_create(&daytona_http, &daytona_api, &key).await?);
    }
    println!(
        "daytona-wire-create: `POST /api/sandbox` answered (Rust client), {} calls: p50 {} ms, p95 {} ms; {} claimed from the warm pool",
        daytona_wire.samples.len(),
        ms(daytona_wire.pct(0.5)),
        ms(daytona_wire.pct(0.95)),
        warm_engine.warm_claims() - claims,
    );
    for (language, label) in [
        ("python", "daytona==0.226.1"),
        ("node", "@daytonaio/sdk@0.218.0"),
    ] {
        let (api, k) = (daytona_api.clone(), key.clone());
        let lang = language.to_string();
        match tokio::task::spawn_blocking(move || daytona_sdk_creates(&lang, &api, &k)).await? {
            Ok(samples) => {
                let mut row = Row::new("daytona-sdk-create", "");
                row.samples = samples;
                println!(
                    "daytona-sdk-create ({language}): official `{label}` `create()` end to end, {} calls: p50 {} ms, p95 {} ms",
                    row.samples.len(),
                    ms(row.pct(0.5)),
                    ms(row.pct(0.95)),
                );
            }
            Err(why) => println!("daytona-sdk-create ({language}): {why}"),
        }
    }

    // The three vendors' official Python SDKs, create → first command to its end → delete,
    // each through its listener exactly as `sandcove env VENDOR` points it (Blaxel's through
    // the listener's HTTPS proxy and the Sandcove CA, as `sandcove serve --blaxel` serves it).
    let blaxel_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let blaxel_origin = format!("http://{}", blaxel_listener.local_addr()?);
    let ca_dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("bench-blaxel-ca-{}", std::process::id()));
    let ca = sandcove::server::intercept::SandcoveCa::open(
        &ca_dir,
        &["api.blaxel.ai", "run.blaxel.ai"],
    )?;
    let mut blaxel_config = blaxel::wire::WireConfig::new(key.clone(), blaxel_origin.clone());
    blaxel_config.workspace = "sandcove".into();
    let (blaxel_stop_tx, blaxel_stop_rx) = tokio::sync::oneshot::channel::<()>();
    let blaxel_server = tokio::spawn(sandcove::server::serve_router_intercepting(
        blaxel_listener,
        blaxel::wire::router(local.clone(), blaxel_config),
        listener_limits(),
        ca,
        async move {
            let _ = blaxel_stop_rx.await;
        },
    ));
    let pair = |k: &str, v: &str| (k.to_string(), v.to_string());
    let trust = match sandcove::server::intercept::ssl_cert_dir(&ca_dir) {
        Some(dirs) => pair("SSL_CERT_DIR", &dirs),
        None => pair(
            "SSL_CERT_FILE",
            &sandcove::server::intercept::bundle_path(&ca_dir)
                .display()
                .to_string(),
        ),
    };
    let vendors = [
        (
            "e2b",
            vec![
                pair("E2B_API_URL", &e2b_url),
                pair("E2B_SANDBOX_URL", &e2b_url),
                pair("E2B_API_KEY", &key),
            ],
        ),
        (
            "daytona",
            vec![
                pair("DAYTONA_API_URL", &daytona_api),
                pair("DAYTONA_API_KEY", &key),
            ],
        ),
        (
            "blaxel",
            vec![
                pair("BL_WORKSPACE", "sandcove"),
                pair("BL_API_KEY", &key),
                pair("HTTPS_PROXY", &blaxel_origin),
                trust,
            ],
        ),
    ];
    for (vendor, vars) in vendors {
        let claims = warm_engine.warm_claims();
        match tokio::task::spawn_blocking(move || sdk_cycles(vendor, &vars)).await? {
            Ok(samples) => {
                let mut row = Row::new("sdk-cycle", "");
                row.samples = samples;
                println!(
                    "sdk-cycle ({vendor}): official Python SDK create → `echo hi` to its end → \
                     delete, {} cycles: p50 {} ms, p95 {} ms; {} of the {} creates (warm-up \
                     included) claimed from the warm pool",
                    row.samples.len(),
                    ms(row.pct(0.5)),
                    ms(row.pct(0.95)),
                    warm_engine.warm_claims() - claims,
                    row.samples.len() + 1,
                );
            }
            Err(why) => println!("sdk-cycle ({vendor}): {why}"),
        }
    }
    let _ = blaxel_stop_tx.send(());
    let _ = blaxel_server.await;
    let _ = std::fs::remove_dir_all(&ca_dir);

    let _ = daytona_stop_tx.send(());
    let _ = daytona_server.await;

    let _ = wire
        .http
        .delete(format!("{}/sandboxes/{}", wire.url, wire.id))
        .header("X-API-KEY", &wire.key)
        .send()
        .await;
    let _ = e2b_stop_tx.send(());
    let _ = e2b_server.await;
    facade.kill().await?;
    local.destroy(&exec_sandbox).await?;
    let _ = stop_tx.send(());
    let _ = server.await;
    Ok(())
}
