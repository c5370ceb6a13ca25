//! Harness for the end-to-end tests: run a fixture program, compare its output with the
//! expected text in `fixtures/expected/`.
#![forbid(unsafe_code)]

pub mod facade;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

/// Where a fixture's sandboxes live.
#[derive(Debug, Clone)]
pub enum Runtime {
    /// The embedded local engine (no `SANDCOVE_URL`).
    Embedded,
    /// A `sandcove serve` at this URL with this API key.
    Server {
        /// Base URL, e.g. `http://127.0.0.1:8730`.
        url: String,
        /// Its API key.
        api_key: String,
    },
}

/// A `sandcove serve` running in this process on a loopback port (see
/// [`start_loopback_server`]). Dropping it shuts the server down and waits for it; sandboxes
/// it created live on until destroyed or their lease ends, as with any server.
#[derive(Debug)]
pub struct ServerGuard {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for ServerGuard {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Start a server wrapping the embedded engine on `127.0.0.1:0` with a random API key, on a
/// background thread with its own tokio runtime; returns where to reach it and the guard that
/// stops it. Panics if the server cannot start.
pub fn start_loopback_server() -> (Runtime, ServerGuard) {
    start_loopback_server_in(None)
}

/// [`start_loopback_server`] with the engine's state in `state_dir` (default: the user's).
pub fn start_loopback_server_in(state_dir: Option<&Path>) -> (Runtime, ServerGuard) {
    use sandcove::server::{serve, ServerConfig};
    let state_dir = state_dir.map(Path::to_path_buf);
    let api_key = format!("test-{}", sandcove::random_id(20));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (ready, bound) = std::sync::mpsc::channel::<Result<std::net::SocketAddr, String>>();
    let key = api_key.clone();
    let thread = std::thread::Builder::new()
        .name("sandcove-loopback-server".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = ready.send(Err(format!("runtime: {e}")));
                    return;
                }
            };
            runtime.block_on(async move {
                let engine = match &state_dir {
                    Some(dir) => sandcove::LocalBackend::with_state_dir(dir),
                    None => sandcove::LocalBackend::new(),
                };
                let engine = match engine {
                    Ok(engine) => engine,
                    Err(e) => {
                        let _ = ready.send(Err(format!("engine: {e}")));
                        return;
                    }
                };
                let listener = match tokio::net::TcpListener::bind("127.0.0.1:0").await {
                    Ok(l) => l,
                    Err(e) => {
                        let _ = ready.send(Err(format!("bind: {e}")));
                        return;
                    }
                };
                let addr = listener.local_addr().map_err(|e| format!("address: {e}"));
                let _ = ready.send(addr);
                let stopped = async move {
                    let _ = stopped.await;
                };
                if let Err(e) =
                    serve(listener, Arc::new(engine), ServerConfig::new(key), stopped).await
                {
                    eprintln!("loopback server: {e}");
                }
            });
        })
        .expect("spawn the server thread");
    let addr = match bound.recv() {
        Ok(Ok(addr)) => addr,
        Ok(Err(e)) => panic!("loopback server did not start: {e}"),
        Err(_) => panic!("loopback server thread ended before binding"),
    };
    (
        Runtime::Server {
            url: format!("http://{addr}"),
            api_key,
        },
        ServerGuard {
            stop: Some(stop),
            thread: Some(thread),
        },
    )
}

/// The expected output file of fixture `name`.
pub fn expected_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/expected")
        .join(format!("{name}.txt"))
}

/// Run the fixture binary at `exe` on `runtime`; returns its stdout, panicking with its
/// stderr if it fails.
pub fn run_fixture(exe: &str, runtime: &Runtime) -> String {
    run_fixture_in(exe, runtime, None)
}

/// [`run_fixture`] with an embedded runtime's state in `state_dir` (default: the user's).
pub fn run_fixture_in(exe: &str, runtime: &Runtime, state_dir: Option<&Path>) -> String {
    let mut cmd = Command::new(exe);
    cmd.env_remove("SANDCOVE_URL")
        .env_remove("SANDCOVE_API_KEY");
    if let Some(dir) = state_dir {
        cmd.env("SANDCOVE_STATE_DIR", dir);
    }
    if let Runtime::Server { url, api_key } = runtime {
        cmd.env("SANDCOVE_URL", url)
            .env("SANDCOVE_API_KEY", api_key);
    }
    let out = cmd.output().unwrap_or_else(|e| panic!("run {exe}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{exe} failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Whether `actual` matches the expected text, line by line; `{{any}}` matches any text
/// within a line.
pub fn matches_expected(expected: &str, actual: &str) -> Result<(), String> {
    let exp: Vec<&str> = expected.lines().collect();
    let act: Vec<&str> = actual.lines().collect();
    for (i, e) in exp.iter().enumerate() {
        let Some(a) = act.get(i) else {
            return Err(format!("line {}: expected {e:?}, output ended", i + 1));
        };
        let pattern = format!(
            "^{}$",
            e.split("{{any}}")
                .map(regex::escape)
                .collect::<Vec<_>>()
                .join(".*")
        );
        let re = regex::Regex::new(&pattern).map_err(|err| err.to_string())?;
        if !re.is_match(a) {
            return Err(format!("line {}: expected {e:?}, got {a:?}", i + 1));
        }
    }
    if act.len() > exp.len() {
        return Err(format!(
            "unexpected extra output from line {}: {:?}",
            exp.len() + 1,
            &act[exp.len()..]
        ));
    }
    Ok(())
}

/// Run fixture `name` (its binary at `exe`) on `runtime` and assert its output matches.
pub fn check_fixture(name: &str, exe: &str, runtime: &Runtime) {
    check_fixture_in(name, exe, runtime, None)
}

/// [`check_fixture`] with an embedded runtime's state in `state_dir`.
pub fn check_fixture_in(name: &str, exe: &str, runtime: &Runtime, state_dir: Option<&Path>) {
    let expected = std::fs::read_to_string(expected_path(name))
        .unwrap_or_else(|e| panic!("expected output of {name}: {e}"));
    let actual = run_fixture_in(exe, runtime, state_dir);
    if let Err(diff) = matches_expected(&expected, &actual) {
        panic!("{name} on {runtime:?}: {diff}\n--- actual output\n{actual}");
    }
}

/// The capabilities of the embedded runtime (the loopback server wraps the same engine).
pub fn capabilities() -> sandcove::Capabilities {
    sandcove::Client::local()
        .expect("the embedded runtime")
        .capabilities()
}

/// A private engine state directory for one fixture check, so fixtures' fixed sandbox names
/// (as vendor examples use) never meet those of another test run by the same user at the same
/// time. Dropping it ends whatever sandbox a failed fixture left there and removes it.
#[derive(Debug)]
pub struct PrivateState {
    /// The directory (short, under the temp dir: it holds unix sockets).
    pub dir: PathBuf,
}

impl PrivateState {
    /// A new, empty state directory.
    pub fn new() -> PrivateState {
        let id = sandcove::random_id(20);
        let dir = std::env::temp_dir().join(format!("sc-fx-{}", &id[..10]));
        std::fs::create_dir_all(&dir).expect("fixture state directory");
        PrivateState { dir }
    }
}

impl Default for PrivateState {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for PrivateState {
    fn drop(&mut self) {
        if let Ok(engine) = sandcove::LocalBackend::with_state_dir(&self.dir) {
            if let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                runtime.block_on(async {
                    use sandcove::Backend;
                    for sandbox in engine.list(Default::default()).await.unwrap_or_default() {
                        let _ = engine.destroy(&sandbox.id).await;
                    }
                });
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Run fixture `name` (binary `exe`) on the embedded runtime, then on a loopback server, one
/// after the other (fixtures may use fixed sandbox names, as vendor examples do), each with a
/// private state directory.
pub fn check_everywhere(name: &str, exe: &str) {
    let state = PrivateState::new();
    check_fixture_in(name, exe, &Runtime::Embedded, Some(&state.dir));
    drop(state);
    let state = PrivateState::new();
    let (server, _guard) = start_loopback_server_in(Some(&state.dir));
    check_fixture(name, exe, &server);
}

/// Whether to run fixture `name`, which needs capability `what`; says loudly why not.
pub fn has(available: bool, name: &str, what: &str) -> bool {
    if !available {
        eprintln!(
            "SKIPPING {name}: the runtime has no {what} yet (capabilities().{what} == false); \
             this fixture runs by itself once it lands"
        );
    }
    available
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every program in `fixtures/src/bin` is a `[[bin]]` of the fixtures package and an
    /// `fx_` one of this one, each with `test = false`: a program missing here would never be
    /// run, and a test harness of each would be one more large link in every `cargo test`.
    #[test]
    fn every_fixture_program_is_built_once() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
        let read = |p: &str| std::fs::read_to_string(format!("{root}/{p}")).expect(p);
        let blocks = |manifest: &str| -> Vec<String> {
            manifest
                .split("[[bin]]")
                .skip(1)
                .map(|b| b.split("\n\n").next().unwrap_or_default().to_string())
                .collect()
        };
        let (fixtures, ours) = (read("fixtures/Cargo.toml"), read("tests/Cargo.toml"));
        for block in blocks(&fixtures).iter().chain(&blocks(&ours)) {
            assert!(block.contains("test = false"), "[[bin]]{block}");
        }
        let programs = std::fs::read_dir(format!("{root}/fixtures/src/bin")).expect("bins");
        for entry in programs.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(stem) = name.strip_suffix(".rs") else {
                continue;
            };
            assert!(
                fixtures.contains(&format!("name = \"{stem}\"")),
                "{stem} is not a [[bin]] of fixtures/Cargo.toml"
            );
            assert!(
                ours.contains(&format!("name = \"fx_{stem}\"")),
                "{stem} is not an fx_ [[bin]] of tests/Cargo.toml"
            );
        }
    }

    #[test]
    fn the_loopback_server_serves_until_its_guard_drops() {
        let (runtime, guard) = start_loopback_server();
        let Runtime::Server { url, api_key } = runtime.clone() else {
            panic!("a server runtime");
        };
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let backend = sandcove::HttpBackend::connect(&url, &api_key)
                .await
                .expect("connect with the key");
            let client = sandcove::Client::new(Arc::new(backend));
            let sandbox = client.create(Default::default()).await.expect("create");
            let out = sandbox
                .run(sandcove::ProcessSpec::new(sandcove::Command::sh(
                    "echo served",
                )))
                .await
                .expect("run");
            assert_eq!(out.stdout, b"served\n");
            sandbox.destroy().await.expect("destroy");
            let wrong = sandcove::HttpBackend::connect(&url, "wrong").await;
            assert!(wrong.is_err(), "the random key is required");
        });
        drop(guard);
        let after = rt.block_on(sandcove::HttpBackend::connect(&url, &api_key));
        assert!(after.is_err(), "the server is gone after its guard drops");
    }

    #[test]
    fn wildcards_match_within_a_line_only() {
        assert!(matches_expected("id: {{any}}\nok", "id: abc\nok\n").is_ok());
        assert!(matches_expected("id: {{any}}", "id: a\nextra").is_err());
        assert!(matches_expected("a.b", "axb").is_err(), "text is literal");
        assert!(matches_expected("x\ny", "x").is_err());
    }
}
