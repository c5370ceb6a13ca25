//! Starting a server for a test, shared by the test binaries of this package: the built
//! `sandcove serve` as a child process, or a router served in this process.

#![allow(dead_code)] // Each test binary uses the part it needs.

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStderr, Command, Stdio};
use std::time::Duration;

use sandcove::server::{serve_router, ConnectionLimits};

/// The built `sandcove` binary, or `SANDCOVE_TEST_BIN` when set: a test binary copied
/// elsewhere and run as another user (CI's rootless pass) is given a copy it can run.
pub fn bin() -> std::ffi::OsString {
    std::env::var_os("SANDCOVE_TEST_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_sandcove").into())
}

/// A `sandcove serve` child process, started with `args` and `envs`, and the URL of the
/// listener it announced on stderr.
pub struct ServeChild {
    /// The process.
    pub child: Child,
    /// The rest of its stderr, unread.
    pub stderr: BufReader<ChildStderr>,
    /// The announced URL.
    pub url: String,
}

impl ServeChild {
    /// Start `sandcove serve ARGS` with `envs` added (and `remove` taken out of) its
    /// environment; wait for the stderr line starting with `announce` and take the URL in
    /// it. `None` when the process ended without announcing it.
    pub fn start(
        args: &[&str],
        envs: &[(&str, &std::ffi::OsStr)],
        remove: &[&str],
        announce: &str,
    ) -> Option<ServeChild> {
        let mut command = Command::new(bin());
        command.arg("serve").args(args).stderr(Stdio::piped());
        for (k, v) in envs {
            command.env(k, v);
        }
        for k in remove {
            command.env_remove(k);
        }
        let mut child = command.spawn().expect("start sandcove serve");
        let mut stderr = BufReader::new(child.stderr.take().expect("stderr"));
        // The announcements are the first lines; a handful is plenty.
        for _ in 0..8 {
            let mut line = String::new();
            if stderr.read_line(&mut line).unwrap_or(0) == 0 {
                break;
            }
            if let Some(rest) = line.trim().strip_prefix(announce) {
                if let Some(url) = rest.split_whitespace().find(|w| w.starts_with("http://")) {
                    let url = url.to_string();
                    return Some(ServeChild { child, stderr, url });
                }
            }
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    }

    /// Keep reading stderr on a thread, so the server never blocks on a full pipe.
    pub fn drain_stderr(self) -> (Child, String) {
        let ServeChild {
            child,
            mut stderr,
            url,
        } = self;
        std::thread::spawn(move || {
            let mut sink = String::new();
            while stderr.read_line(&mut sink).unwrap_or(0) > 0 {
                sink.clear();
            }
        });
        (child, url)
    }
}

/// Serve `app` on a free loopback port in this process, with the server's connection limits;
/// its URL, and the sender whose drop stops it.
pub async fn serve_in_process(app: axum::Router) -> (String, tokio::sync::oneshot::Sender<()>) {
    let (listener, url) = loopback_listener().await;
    (url, serve_on(listener, app))
}

/// A listener on a free loopback port, and its URL.
async fn loopback_listener() -> (tokio::net::TcpListener, String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let url = format!("http://{}", listener.local_addr().expect("its address"));
    (listener, url)
}

/// Serve `app` on `listener` with the server's connection limits until the returned sender
/// is dropped.
fn serve_on(
    listener: tokio::net::TcpListener,
    app: axum::Router,
) -> tokio::sync::oneshot::Sender<()> {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let limits = ConnectionLimits {
        max_connections: 64,
        head_timeout: Duration::from_secs(10),
        shutdown_grace: Duration::from_secs(1),
        tls: None,
    };
    tokio::spawn(serve_router(listener, app, limits, async move {
        let _ = stopped.await;
    }));
    stop
}

/// A vendor wire router served in this process over the embedded engine with a private
/// state directory; dropping it stops the listener and cleans the state up.
pub struct WireEnv {
    /// The listener's URL.
    pub url: String,
    /// A client for it.
    pub http: reqwest::Client,
    /// The engine behind the router.
    pub backend: std::sync::Arc<sandcove::LocalBackend>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    state: Option<sandcove_tests::PrivateState>,
}

impl WireEnv {
    /// Serve the router `router` makes from the engine and the listener's own URL (which
    /// vendor answers embed).
    pub async fn start(
        router: impl FnOnce(std::sync::Arc<sandcove::LocalBackend>, String) -> axum::Router,
    ) -> WireEnv {
        let state = sandcove_tests::PrivateState::new();
        let backend = std::sync::Arc::new(
            sandcove::LocalBackend::with_state_dir(&state.dir).expect("engine"),
        );
        let (listener, url) = loopback_listener().await;
        let stop = serve_on(listener, router(backend.clone(), url.clone()));
        WireEnv {
            url,
            http: reqwest::Client::new(),
            backend,
            stop: Some(stop),
            state: Some(state),
        }
    }
}

impl Drop for WireEnv {
    fn drop(&mut self) {
        drop(self.stop.take());
        // The state's cleanup runs its own runtime: not on this runtime's thread.
        let state = self.state.take();
        let _ = std::thread::spawn(move || drop(state)).join();
    }
}
