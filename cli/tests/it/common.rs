//! Starting a server for a test, shared by the test binaries of this package: the built
//! `sandcove serve` as a child process, or a router served in this process.

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
                if let Some(url) = rest
                    .split_whitespace()
                    .find(|w| w.starts_with("http://") || w.starts_with("https://"))
                {
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
    serve_in_process_with(app, test_limits()).await
}

/// [`serve_in_process`] with other connection limits.
pub async fn serve_in_process_with(
    app: axum::Router,
    limits: ConnectionLimits,
) -> (String, tokio::sync::oneshot::Sender<()>) {
    let (listener, url) = loopback_listener().await;
    (url, serve_on(listener, app, limits))
}

/// The connection limits test listeners get unless a test sets others.
pub fn test_limits() -> ConnectionLimits {
    ConnectionLimits {
        max_connections: 64,
        head_timeout: Duration::from_secs(10),
        body_idle_timeout: Duration::from_secs(60),
        write_stall_timeout: Duration::from_secs(60),
        upstream_answer_timeout: Duration::from_secs(60),
        shutdown_grace: Duration::from_secs(1),
        tls: None,
    }
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
    limits: ConnectionLimits,
) -> tokio::sync::oneshot::Sender<()> {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
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
        WireEnv::start_with_warm_pool(0, router).await
    }

    /// [`WireEnv::start`] over an engine keeping `size` warm sandboxes.
    pub async fn start_with_warm_pool(
        size: usize,
        router: impl FnOnce(std::sync::Arc<sandcove::LocalBackend>, String) -> axum::Router,
    ) -> WireEnv {
        let state = sandcove_tests::PrivateState::new();
        let backend = std::sync::Arc::new(
            sandcove::LocalBackend::with_state_dir(&state.dir)
                .expect("engine")
                .with_warm_pool(size),
        );
        let (listener, url) = loopback_listener().await;
        let stop = serve_on(
            listener,
            router(backend.clone(), url.clone()),
            test_limits(),
        );
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

/// One answer read off a [`RawConnection`].
#[derive(Debug)]
pub struct RawAnswer {
    /// The status code.
    pub status: u16,
    /// The head as sent (status line and header lines).
    pub head: String,
    /// The body, de-chunked.
    pub body: Vec<u8>,
}

impl RawAnswer {
    /// Whether the answer tells the client to close the connection.
    pub fn closes(&self) -> bool {
        self.head
            .lines()
            .any(|l| l.to_ascii_lowercase().replace(' ', "") == "connection:close")
    }
}

/// One HTTP/1.1 connection driven byte by byte, so a test decides when each part of a
/// request leaves (a body after its head, a next request on the same connection).
pub struct RawConnection {
    reader: tokio::net::tcp::OwnedReadHalf,
    writer: Option<tokio::net::tcp::OwnedWriteHalf>,
    buffered: Vec<u8>,
}

/// How long a raw answer may take.
const RAW_PATIENCE: Duration = Duration::from_secs(30);

impl RawConnection {
    /// Connect to the listener at `url` (`http://127.0.0.1:PORT`).
    pub async fn connect(url: &str) -> RawConnection {
        let addr = url.trim_start_matches("http://").trim_end_matches('/');
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .expect("connect the listener");
        stream.set_nodelay(true).expect("no delay");
        let (reader, writer) = stream.into_split();
        RawConnection {
            reader,
            writer: Some(writer),
            buffered: Vec::new(),
        }
    }

    /// Send `bytes` now.
    pub async fn send(&mut self, bytes: &[u8]) {
        use tokio::io::AsyncWriteExt;
        let writer = self.writer.as_mut().expect("the sending half");
        let sent = async {
            writer.write_all(bytes).await?;
            writer.flush().await
        };
        if let Err(e) = sent.await {
            panic!("the server closed the connection under this request: {e}");
        }
    }

    /// The sending half, for a task that sends while this one reads.
    pub fn take_writer(&mut self) -> tokio::net::tcp::OwnedWriteHalf {
        self.writer.take().expect("the sending half")
    }

    /// Read more into the buffer; `false` once the peer has closed (or reset) the connection.
    async fn fill(&mut self) -> bool {
        use tokio::io::AsyncReadExt;
        let mut chunk = [0u8; 16 * 1024];
        match tokio::time::timeout(RAW_PATIENCE, self.reader.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => false,
            Ok(Ok(n)) => {
                self.buffered.extend_from_slice(&chunk[..n]);
                true
            }
            Err(_) => panic!("nothing arrived and the connection stayed open for {RAW_PATIENCE:?}"),
        }
    }

    /// Take `n` bytes, reading as needed; `None` if the connection ends first.
    async fn take(&mut self, n: usize) -> Option<Vec<u8>> {
        while self.buffered.len() < n {
            if !self.fill().await {
                return None;
            }
        }
        Some(self.buffered.drain(..n).collect())
    }

    /// Take one CRLF-terminated line (without its CRLF); `None` if the connection ends first.
    async fn line(&mut self) -> Option<String> {
        loop {
            if let Some(at) = self.buffered.windows(2).position(|w| w == b"\r\n") {
                let line: Vec<u8> = self.buffered.drain(..at + 2).collect();
                return Some(String::from_utf8_lossy(&line[..at]).into_owned());
            }
            if !self.fill().await {
                return None;
            }
        }
    }

    /// The next complete answer (interim `1xx` answers skipped), or `None` when the
    /// connection ends before one has arrived whole.
    pub async fn answer(&mut self) -> Option<RawAnswer> {
        loop {
            let status_line = self.line().await?;
            let status: u16 = status_line.split(' ').nth(1)?.parse().ok()?;
            let mut head = status_line.clone();
            let (mut length, mut chunked) = (None, false);
            loop {
                let line = self.line().await?;
                if line.is_empty() {
                    break;
                }
                let lower = line.to_ascii_lowercase();
                if let Some(v) = lower.strip_prefix("content-length:") {
                    length = v.trim().parse::<usize>().ok();
                }
                if lower.starts_with("transfer-encoding:") && lower.contains("chunked") {
                    chunked = true;
                }
                head.push_str("\r\n");
                head.push_str(&line);
            }
            if status < 200 {
                continue;
            }
            let mut body = Vec::new();
            if chunked {
                loop {
                    let size = self.line().await?;
                    let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
                    if size == 0 {
                        while !self.line().await?.is_empty() {}
                        break;
                    }
                    body.extend(self.take(size).await?);
                    self.take(2).await?;
                }
            } else if let Some(n) = length {
                body = self.take(n).await?;
            }
            return Some(RawAnswer { status, head, body });
        }
    }

    /// Read until the peer closes the connection (panics if it stays open and silent past
    /// the patience).
    pub async fn until_closed(&mut self) {
        while self.fill().await {}
    }
}

/// Send a request the listener answers without needing its body, the way that used to cost
/// the connection: the head first, then its body (`body_len` bytes, more than a server
/// reads in one go) as a separate write.
pub async fn send_refused(
    conn: &mut RawConnection,
    method: &str,
    path: &str,
    headers: &str,
    body_len: usize,
) {
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}Content-Type: application/json\r\nContent-Length: {body_len}\r\n\r\n"
    );
    conn.send(head.as_bytes()).await;
    conn.send(&vec![b' '; body_len]).await;
}

/// Send each of `refused` (method, path, extra header lines, expected status) on one
/// connection as [`send_refused`] does, each after the previous answer, then `last` (method,
/// path, header lines, expected status; no body): every answer must arrive on that one
/// connection, and no refusal may say `Connection: close`.
pub async fn refusals_keep_the_connection(
    url: &str,
    refused: &[(&str, &str, &str, u16)],
    last: (&str, &str, &str, u16),
) {
    let mut conn = RawConnection::connect(url).await;
    for (method, path, headers, expected) in refused {
        send_refused(&mut conn, method, path, headers, 32 * 1024).await;
        let answer = conn
            .answer()
            .await
            .unwrap_or_else(|| panic!("{method} {path}: the connection closed without an answer"));
        assert_eq!(
            answer.status,
            *expected,
            "{method} {path}: {}",
            String::from_utf8_lossy(&answer.body)
        );
        assert!(
            !answer.closes(),
            "{method} {path}: a small refused body still closes the connection: {}",
            answer.head
        );
    }
    let (method, path, headers, expected) = last;
    conn.send(format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}\r\n").as_bytes())
        .await;
    let answer = conn.answer().await.unwrap_or_else(|| {
        panic!("{method} {path} after the refusals: the connection was closed under it")
    });
    assert_eq!(
        answer.status,
        expected,
        "{method} {path}: {}",
        String::from_utf8_lossy(&answer.body)
    );
}

/// A refused request whose body is larger than a server reads for a refusal: the answer
/// arrives, says `Connection: close`, and the connection then ends (it is not left hanging).
pub async fn an_oversized_refused_body_closes_cleanly(
    url: &str,
    method: &str,
    path: &str,
    headers: &str,
    expected: u16,
) {
    let mut conn = RawConnection::connect(url).await;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        1024 * 1024
    );
    let mut writer = conn.take_writer();
    // The head, then more body than is read for a refusal (less than announced), sent while
    // the answer is read: the server stops reading, so this write may never finish.
    let sender = tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        let _ = writer.write_all(head.as_bytes()).await;
        let _ = writer.write_all(&vec![b' '; 256 * 1024]).await;
        writer
    });
    let answer = conn
        .answer()
        .await
        .expect("an answer to the oversized refused request");
    assert_eq!(
        answer.status,
        expected,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    assert!(
        answer.closes(),
        "the answer says Connection: close: {}",
        answer.head
    );
    conn.until_closed().await;
    sender.abort();
}

/// Start a `multipart/form-data` upload (boundary `B`) on a raw connection to `url`: the
/// request line (`request`: method and target) and `headers` (each ending in CRLF), a `Content-Length` announcing
/// `announced` body bytes, then `sent` of the body. Dropping the connection breaks the upload
/// off.
pub async fn partial_upload(
    url: &str,
    request: &str,
    headers: &str,
    announced: usize,
    sent: &[u8],
) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let addr = url.trim_start_matches("http://");
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "{request} HTTP/1.1\r\nHost: {addr}\r\n{headers}\
         Content-Type: multipart/form-data; boundary=B\r\nContent-Length: {announced}\r\n\r\n"
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    conn.write_all(sent).await.unwrap();
    conn
}

/// One `multipart/form-data` part (boundary `B`), with a filename when given.
pub fn form_part(name: &str, filename: Option<&str>, data: &[u8]) -> Vec<u8> {
    let mut out = match filename {
        Some(f) => format!(
            "--B\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{f}\"\r\n\r\n"
        ),
        None => format!("--B\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n"),
    }
    .into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    out
}
