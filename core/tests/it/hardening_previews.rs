//! Preview URLs under attack by a client that once held access: a token revoked while its
//! request head is on the way, a connection (a streamed answer, an upgraded tunnel, a public
//! preview's streamed answer) kept open after its token is revoked or expires or its preview
//! closed, and a caller minting tokens without end. Each must fail.
//!
//! Runs as root and rootless. Every connection is to a preview listener on 127.0.0.1.

use crate::hardening_common as common;

use sandcove::{Command, ErrorCode, PreviewOptions, PreviewTokenOptions, ProcessSpec};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use common::{eventually, Env, PATIENCE};

/// Port the sandboxed server listens on.
const PORT: u16 = 8000;

/// A server that answers a request asking for an upgrade with `101` and then echoes, and
/// any other with a `200` head followed by a line every 100 ms, forever.
const STREAMER: &str = r#"
import socket, threading, time
def serve(c):
    head = b""
    while b"\r\n\r\n" not in head:
        more = c.recv(4096)
        if not more:
            return
        head += more
    try:
        if b"upgrade: x" in head.lower():
            c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: Upgrade\r\n\r\n")
            while True:
                data = c.recv(4096)
                if not data:
                    return
                c.sendall(data)
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n")
        while True:
            c.sendall(b"tick\n")
            time.sleep(0.1)
    except OSError:
        pass
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 8000))
s.listen(16)
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;

/// A sandbox running [`STREAMER`], or `None` (said loudly) where python3 is missing.
async fn streaming_sandbox(env: &Env, marker: &str) -> Option<String> {
    let id = env.sandbox(marker).await;
    let check = sandcove_conformance::run(
        &*env.backend,
        &id,
        ProcessSpec::new(Command::argv([
            "bash",
            "-c",
            "command -v python3 >/dev/null && echo yes",
        ])),
    )
    .await;
    if check.stdout != b"yes\n" {
        eprintln!("SKIP: python3 is not installed on this host; the preview probe needs it");
        return None;
    }
    let server = env
        .backend
        .spawn(
            &id,
            ProcessSpec::new(Command::argv(["python3", "-c", STREAMER])),
        )
        .await
        .expect("start the streaming server");
    drop(server);
    Some(id)
}

/// Connect to `host`, send `head`, and read until a complete response head arrives (or the
/// connection ends). Returns the stream and what was read.
async fn request(host: &str, head: &str) -> (TcpStream, String) {
    let mut stream = TcpStream::connect(host).await.expect("connect the preview");
    stream
        .write_all(head.as_bytes())
        .await
        .expect("send the head");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        match tokio::time::timeout(PATIENCE, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => panic!("no answer within {PATIENCE:?}"),
        }
    }
    (stream, String::from_utf8_lossy(&got).into_owned())
}

/// Read (and drop) whatever arrives until the peer closes; panics if it never does.
async fn until_closed(stream: &mut TcpStream, what: &str) {
    let mut buf = [0u8; 4096];
    let ended = tokio::time::timeout(PATIENCE, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(
        ended.is_ok(),
        "{what}: the connection was still open after {PATIENCE:?}"
    );
}

/// Wait until the sandboxed server answers through the preview.
async fn wait_for_server(host: &str, auth: &str) {
    eventually(PATIENCE, "the streaming server answers", || async {
        let head = format!("GET /ready HTTP/1.1\r\nHost: x{auth}\r\n\r\n");
        let (_, got) = request(host, &head).await;
        if got.starts_with("HTTP/1.1 200") {
            Ok(())
        } else {
            Err(got)
        }
    })
    .await;
}

/// Attack (fails): open a connection while the token is good, let it be revoked (or the
/// preview closed), then send the request head with it. The token is checked as it is when
/// the head has arrived, so the request is refused and the sandbox never contacted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_revoked_while_the_head_is_in_flight_opens_nothing() {
    let env = Env::new("pv-race");
    // No server in the sandbox: a request that got through would be answered 502.
    let id = env.sandbox("pv-race").await;
    let preview = env
        .backend
        .expose_port(&id, PreviewOptions::new(PORT))
        .await
        .expect("expose");
    let token = preview
        .token
        .clone()
        .expect("a private preview's token")
        .value;
    let header = &preview.token_header;

    let mut early = TcpStream::connect(&preview.host).await.expect("connect");
    early
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n")
        .await
        .expect("start the head");
    // A round trip through the same monitor: the connection above is accepted by now.
    env.backend.list_previews(&id).await.expect("list");
    env.backend
        .revoke_preview_token(&id, PORT, &token)
        .await
        .expect("revoke");
    early
        .write_all(format!("{header}: {token}\r\n\r\n").as_bytes())
        .await
        .expect("finish the head");
    let mut answer = String::new();
    tokio::time::timeout(PATIENCE, early.read_to_string(&mut answer))
        .await
        .expect("an answer")
        .ok();
    assert!(
        answer.starts_with("HTTP/1.1 401"),
        "a token revoked before the head arrived was accepted: {answer:?}"
    );

    // The same with the preview closed (then opened again, with a new token) meanwhile.
    let second = env
        .backend
        .create_preview_token(&id, PORT, PreviewTokenOptions::default())
        .await
        .expect("a second token")
        .value;
    let mut early = TcpStream::connect(&preview.host).await.expect("connect");
    early
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n")
        .await
        .expect("start the head");
    env.backend.list_previews(&id).await.expect("list");
    env.backend.close_preview(&id, PORT).await.expect("close");
    early
        .write_all(format!("{header}: {second}\r\n\r\n").as_bytes())
        .await
        .expect("finish the head");
    let mut answer = String::new();
    tokio::time::timeout(PATIENCE, early.read_to_string(&mut answer))
        .await
        .expect("an answer")
        .ok();
    assert!(
        answer.starts_with("HTTP/1.1 404"),
        "a request on a closed preview was forwarded: {answer:?}"
    );
    env.backend.destroy(&id).await.expect("destroy");
}

/// Attack (fails): keep what a token let through — a streamed answer and an upgraded
/// tunnel — after the token is revoked; keep a public preview's streamed answer after the
/// preview is closed. Each connection is cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoking_or_closing_cuts_the_connections_already_let_through() {
    let env = Env::new("pv-cut");
    let Some(id) = streaming_sandbox(&env, "pv-cut").await else {
        return;
    };
    let preview = env
        .backend
        .expose_port(&id, PreviewOptions::new(PORT))
        .await
        .expect("expose");
    let keep = preview.token.clone().expect("a token").value;
    let header = preview.token_header.clone();
    wait_for_server(&preview.host, &format!("\r\n{header}: {keep}")).await;

    // A streamed answer.
    let doomed = env
        .backend
        .create_preview_token(&id, PORT, PreviewTokenOptions::default())
        .await
        .expect("token")
        .value;
    let (mut stream, got) = request(
        &preview.host,
        &format!("GET /stream HTTP/1.1\r\nHost: x\r\n{header}: {doomed}\r\n\r\n"),
    )
    .await;
    assert!(got.starts_with("HTTP/1.1 200"), "{got:?}");
    // An upgraded tunnel, by another token.
    let doomed_too = env
        .backend
        .create_preview_token(&id, PORT, PreviewTokenOptions::default())
        .await
        .expect("token")
        .value;
    let (mut tunnel, got) = request(
        &preview.host,
        &format!(
            "GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: x\r\nConnection: Upgrade\r\n{header}: {doomed_too}\r\n\r\n"
        ),
    )
    .await;
    assert!(got.starts_with("HTTP/1.1 101"), "{got:?}");
    tunnel.write_all(b"ping").await.expect("tunnel write");
    let mut echo = [0u8; 4];
    tokio::time::timeout(PATIENCE, tunnel.read_exact(&mut echo))
        .await
        .expect("echo in time")
        .expect("echo");
    assert_eq!(&echo, b"ping");
    // A streamed answer by a token that stays: revoking others leaves it alone.
    let (mut kept, got) = request(
        &preview.host,
        &format!("GET /stream HTTP/1.1\r\nHost: x\r\n{header}: {keep}\r\n\r\n"),
    )
    .await;
    assert!(got.starts_with("HTTP/1.1 200"), "{got:?}");

    env.backend
        .revoke_preview_token(&id, PORT, &doomed)
        .await
        .expect("revoke");
    until_closed(&mut stream, "a stream whose token was revoked").await;
    env.backend
        .revoke_preview_token(&id, PORT, &doomed_too)
        .await
        .expect("revoke");
    until_closed(&mut tunnel, "a tunnel whose token was revoked").await;
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(PATIENCE, kept.read(&mut buf))
        .await
        .expect("the kept stream still flows")
        .expect("read");
    assert!(n > 0, "the stream of a live token was cut");
    env.backend.close_preview(&id, PORT).await.expect("close");
    until_closed(&mut kept, "a stream whose preview was closed").await;

    // A public preview's streamed answer ends when the preview closes.
    let preview = env
        .backend
        .expose_port(&id, PreviewOptions::new(PORT).public(true))
        .await
        .expect("expose publicly");
    wait_for_server(&preview.host, "").await;
    let (mut open, got) = request(&preview.host, "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(got.starts_with("HTTP/1.1 200"), "{got:?}");
    env.backend.close_preview(&id, PORT).await.expect("close");
    until_closed(&mut open, "a public preview's stream after it closed").await;
    env.backend.destroy(&id).await.expect("destroy");
}

/// Attack (fails): keep what a short-lived token let through (a streamed answer, an
/// upgraded tunnel) open past the token's expiry. Both are cut once it expires, as at a
/// revocation (the preview's timer signals its connections at each token's expiry; nothing
/// polls); a stream let through by a token without expiry flows on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expiring_token_cuts_the_connections_it_let_through() {
    let env = Env::new("pv-exp");
    let Some(id) = streaming_sandbox(&env, "pv-exp").await else {
        return;
    };
    let preview = env
        .backend
        .expose_port(&id, PreviewOptions::new(PORT))
        .await
        .expect("expose");
    let keep = preview.token.clone().expect("a token").value;
    let header = preview.token_header.clone();
    wait_for_server(&preview.host, &format!("\r\n{header}: {keep}")).await;

    let expires_at = sandcove::now_millis() + 4_000;
    let short = env
        .backend
        .create_preview_token(
            &id,
            PORT,
            PreviewTokenOptions::default().expires_at(expires_at),
        )
        .await
        .expect("a short-lived token")
        .value;
    let (mut stream, got) = request(
        &preview.host,
        &format!("GET /stream HTTP/1.1\r\nHost: x\r\n{header}: {short}\r\n\r\n"),
    )
    .await;
    assert!(got.starts_with("HTTP/1.1 200"), "{got:?}");
    let (mut tunnel, got) = request(
        &preview.host,
        &format!(
            "GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: x\r\nConnection: Upgrade\r\n{header}: {short}\r\n\r\n"
        ),
    )
    .await;
    assert!(got.starts_with("HTTP/1.1 101"), "{got:?}");
    let (mut kept, got) = request(
        &preview.host,
        &format!("GET /stream HTTP/1.1\r\nHost: x\r\n{header}: {keep}\r\n\r\n"),
    )
    .await;
    assert!(got.starts_with("HTTP/1.1 200"), "{got:?}");

    until_closed(&mut stream, "a stream whose token expired").await;
    assert!(
        sandcove::now_millis() >= expires_at,
        "the stream was cut before its token expired"
    );
    until_closed(&mut tunnel, "a tunnel whose token expired").await;
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(PATIENCE, kept.read(&mut buf))
        .await
        .expect("the kept stream still flows")
        .expect("read");
    assert!(n > 0, "the stream of a token without expiry was cut");
    env.backend.destroy(&id).await.expect("destroy");
}

/// Attack (fails): mint preview tokens in a loop. The engine keeps at most
/// `MAX_TOKENS` (1000) live tokens per preview and says so; revoking one makes room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preview_tokens_per_preview_are_bounded() {
    let env = Env::new("pv-cap");
    let id = env.sandbox("pv-cap").await;
    env.backend
        .expose_port(&id, PreviewOptions::new(PORT))
        .await
        .expect("expose");
    let mut made = Vec::new();
    let refused = loop {
        let in_a_minute =
            PreviewTokenOptions::default().expires_at(sandcove::now_millis() + 60_000);
        match env
            .backend
            .create_preview_token(&id, PORT, in_a_minute)
            .await
        {
            Ok(token) => made.push(token.value),
            Err(e) => break e,
        }
        assert!(
            made.len() <= 1000,
            "{} tokens minted for one preview and no refusal",
            made.len()
        );
    };
    assert_eq!(refused.code(), ErrorCode::InvalidArgument, "{refused}");
    assert_eq!(made.len(), 999, "the exposed token and 999 more are live");
    env.backend
        .revoke_preview_token(&id, PORT, &made[0])
        .await
        .expect("revoke one");
    env.backend
        .create_preview_token(&id, PORT, PreviewTokenOptions::default())
        .await
        .expect("room after a revocation");
    env.backend.destroy(&id).await.expect("destroy");
}

/// Attack (fails): expose every port of a sandbox. Each preview is a listener held by the
/// sandbox's monitor (by the serving process, for every Kubernetes sandbox): at most 64
/// ports are exposed at once, the next is refused by name with nothing bound, a port
/// already exposed still takes new settings, and closing one makes room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exposed_ports_per_sandbox_are_bounded() {
    const BOUND: u16 = 64;
    let env = Env::new("pv-ports");
    let id = env.sandbox("pv-ports").await;
    for port in 1..=BOUND {
        env.backend
            .expose_port(&id, PreviewOptions::new(port).public(true))
            .await
            .unwrap_or_else(|e| panic!("expose port {port}: {e}"));
    }
    let refused = env
        .backend
        .expose_port(&id, PreviewOptions::new(BOUND + 1).public(true))
        .await
        .expect_err("a port past the bound is refused");
    assert_eq!(refused.code(), ErrorCode::InvalidArgument, "{refused}");
    assert!(refused.to_string().contains("64"), "{refused}");
    let previews = env.backend.list_previews(&id).await.expect("list");
    assert_eq!(previews.len(), usize::from(BOUND), "nothing more was bound");
    // A settings change of an exposed port is not a new preview.
    env.backend
        .expose_port(&id, PreviewOptions::new(1))
        .await
        .expect("an exposed port takes new settings");
    env.backend.close_preview(&id, 1).await.expect("close one");
    env.backend
        .expose_port(&id, PreviewOptions::new(BOUND + 1).public(true))
        .await
        .expect("room after a close");
    env.backend.destroy(&id).await.expect("destroy");
}

/// A server on port 8001 whose answers a path chooses: `/silent` reads the request and never
/// answers (it notes in `/tmp/silent-closed` when the connection to it ends), `/deaf` reads
/// the head only and never another byte, `/stalled`
/// sends a head announcing 1000 bytes and 4 of them, then nothing; `/slow` answers after
/// 0.5 s and sends 10 000 bytes in ten pieces 0.3 s apart; anything else is `ok`.
const SLOW_SERVER: &str = r#"
import socket, threading, time
def serve(c):
    head = b""
    while b"\r\n\r\n" not in head:
        more = c.recv(4096)
        if not more:
            return
        head += more
    path = head.split(b" ")[1]
    try:
        if path.startswith(b"/silent"):
            while c.recv(4096):
                pass
            with open("/tmp/silent-closed", "a") as f:
                f.write("closed\n")
        elif path.startswith(b"/stalled"):
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\npart")
            while c.recv(4096):
                pass
        elif path.startswith(b"/deaf"):
            time.sleep(3600)
        elif path.startswith(b"/slow"):
            time.sleep(0.5)
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 10000\r\nConnection: close\r\n\r\n")
            for i in range(10):
                time.sleep(0.3)
                c.sendall((b"%d" % i) * 1000)
        else:
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
    except OSError:
        pass
    c.close()
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 8001))
s.listen(16)
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;

/// Read until the peer closes (within [`PATIENCE`], else panic); what arrived.
async fn read_until_closed(stream: &mut TcpStream, what: &str) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let ended = tokio::time::timeout(PATIENCE, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(
        ended.is_ok(),
        "{what}: the connection was still open after {PATIENCE:?}"
    );
    got
}

/// A sandbox (named after `name`) running [`SLOW_SERVER`] behind a private preview of its
/// port 8001 whose answer bounds are 2 s, once the server answers: the environment, the
/// sandbox, the preview and the header line that carries its token. `None`, said so, where
/// the host has no python3.
async fn slow_server_preview(name: &str) -> Option<(Env, String, sandcove::Preview, String)> {
    let mut env = Env::new(name);
    env.local = env.local.clone().with_preview_limits(
        sandcove::backend::local::PreviewLimits::default()
            .answer_timeout_ms(2000)
            .answer_idle_ms(2000),
    );
    env.backend = std::sync::Arc::new(env.local.clone());
    let id = env.sandbox(name).await;
    if !common::has_python(&*env.backend, &id).await {
        eprintln!("SKIP: python3 is not installed on this host; the preview probe needs it");
        return None;
    }
    drop(
        env.backend
            .spawn(
                &id,
                ProcessSpec::new(Command::argv(["python3", "-c", SLOW_SERVER])),
            )
            .await
            .expect("start the server"),
    );
    let preview = env
        .backend
        .expose_port(&id, PreviewOptions::new(8001))
        .await
        .expect("expose");
    let token = preview.token.clone().expect("a token").value;
    let auth = format!("\r\n{}: {token}", preview.token_header);
    eventually(PATIENCE, "the server answers", || async {
        let head = format!("GET /ready HTTP/1.1\r\nHost: x{auth}\r\n\r\n");
        let (_, got) = request(&preview.host, &head).await;
        if got.starts_with("HTTP/1.1 200") {
            Ok(())
        } else {
            Err(got)
        }
    })
    .await;
    Some((env, id, preview, auth))
}

/// Finding: a private preview waited for the sandbox's answer without a bound, so a port
/// that accepted requests and never answered (or stopped halfway) held preview connections,
/// and the connections of whoever forwards to the preview (E2B's `get_host`), for ever. Now
/// the answer's head must come within `answer_timeout_ms` (else `504`, and the sandbox's
/// connection is closed) and no step of its body may take longer than `answer_idle_ms`
/// (else both connections close); a slow answer that keeps coming is delivered whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_previews_answer_is_bounded_and_a_slow_one_delivered() {
    let Some((env, id, preview, auth)) = slow_server_preview("pv-answer").await else {
        return;
    };

    let (mut silent, got) = request(
        &preview.host,
        &format!("GET /silent HTTP/1.1\r\nHost: x{auth}\r\n\r\n"),
    )
    .await;
    assert!(got.starts_with("HTTP/1.1 504 Gateway Timeout"), "{got:?}");
    let rest = read_until_closed(&mut silent, "after the 504").await;
    let text = format!("{got}{}", String::from_utf8_lossy(&rest));
    assert!(text.contains("did not answer within 2000 ms"), "{text}");
    eventually(
        PATIENCE,
        "the sandbox's side of the silent request is closed",
        || async {
            let out = common::bash(&*env.backend, &id, "cat /tmp/silent-closed 2>/dev/null").await;
            if out.stdout == b"closed\n" {
                Ok(())
            } else {
                Err(String::from_utf8_lossy(&out.stdout).into_owned())
            }
        },
    )
    .await;

    let (mut stalled, got) = request(
        &preview.host,
        &format!("GET /stalled HTTP/1.1\r\nHost: x{auth}\r\n\r\n"),
    )
    .await;
    assert!(got.starts_with("HTTP/1.1 200"), "{got:?}");
    let rest = read_until_closed(&mut stalled, "a stalled answer").await;
    let body = format!("{got}{}", String::from_utf8_lossy(&rest));
    assert!(body.ends_with("\r\n\r\npart"), "{body:?}");

    let (mut slow, got) = request(
        &preview.host,
        &format!("GET /slow HTTP/1.1\r\nHost: x{auth}\r\n\r\n"),
    )
    .await;
    assert!(got.starts_with("HTTP/1.1 200"), "{got:?}");
    let mut all = got.into_bytes();
    all.extend(read_until_closed(&mut slow, "a slow answer").await);
    let split = all
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a head")
        + 4;
    let expected: Vec<u8> = (0..10u8).flat_map(|i| vec![b'0' + i; 1000]).collect();
    assert_eq!(all[split..].len(), expected.len(), "the whole body arrived");
    assert!(all[split..] == expected[..], "the body arrived unchanged");
    env.backend.destroy(&id).await.unwrap();
}

/// Red-team pass 6, finding 1: a private preview copied a request's body to the sandbox
/// without a bound, so a port that took the head and never read the body, or a client that
/// announced a body and stopped sending it, held the preview connection (one of the
/// preview's `max_connections`, and through `get_host` one more each time its own bound gave
/// up) for ever. Now a request whose bytes stop moving for `answer_timeout_ms` ends: `504`
/// when the sandbox took none, `408` when the client sent none, and the connection closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_previews_request_body_that_stops_moving_ends_the_connection() {
    let Some((env, id, preview, auth)) = slow_server_preview("pv-request").await else {
        return;
    };

    // The sandbox never reads the 64 MiB the client keeps sending.
    let deaf = TcpStream::connect(&preview.host).await.expect("connect");
    let (mut read, mut write) = deaf.into_split();
    let head = format!(
        "POST /deaf HTTP/1.1\r\nHost: x{auth}\r\nContent-Length: {}\r\n\r\n",
        64 << 20
    );
    let sender = tokio::spawn(async move {
        if write.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        let chunk = vec![b'x'; 64 << 10];
        for _ in 0..1024 {
            if write.write_all(&chunk).await.is_err() {
                return;
            }
        }
    });
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let ended = tokio::time::timeout(PATIENCE, async {
        loop {
            match read.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(
        ended.is_ok(),
        "a body the sandbox never reads: the connection was still open after {PATIENCE:?}"
    );
    // The answer may be lost to the reset that closing on unread bytes sends; when it
    // arrives it says why.
    if !got.is_empty() {
        let text = String::from_utf8_lossy(&got);
        assert!(text.starts_with("HTTP/1.1 504 Gateway Timeout"), "{text:?}");
        assert!(text.contains("did not take the request"), "{text:?}");
    }
    sender.abort();

    // The client announces 100 bytes and sends 10.
    let (mut short, got) = request(
        &preview.host,
        &format!("POST /silent HTTP/1.1\r\nHost: x{auth}\r\nContent-Length: 100\r\n\r\n0123456789"),
    )
    .await;
    assert!(got.starts_with("HTTP/1.1 408 Request Timeout"), "{got:?}");
    let rest = read_until_closed(&mut short, "after the 408").await;
    let text = format!("{got}{}", String::from_utf8_lossy(&rest));
    assert!(text.contains("request body"), "{text}");
    env.backend.destroy(&id).await.unwrap();
}

/// Finding (review of the signed file URLs): the engine's file-URL listener bounded a
/// request's head but not its body, so a holder of an upload URL could send part of a body
/// and stop, keeping a connection slot (and the upload open) for ever. Now a body that brings
/// no byte for `answer_idle_ms` fails the upload, which keeps nothing, and the connection ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_url_upload_that_stops_sending_ends_and_keeps_nothing() {
    let mut env = Env::new("fu-stall");
    env.local = env.local.clone().with_preview_limits(
        sandcove::backend::local::PreviewLimits::default().answer_idle_ms(2000),
    );
    env.backend = std::sync::Arc::new(env.local.clone());
    let id = env.sandbox("fu-stall").await;
    let url = env
        .backend
        .create_file_url(&id, sandcove::FileUrlOptions::write("stalled.bin"))
        .await
        .expect("an upload URL");
    let rest = url.url.strip_prefix("http://").expect("a plain http URL");
    let (host, path) = rest.split_at(rest.find('/').expect("a path"));
    let mut stream = TcpStream::connect(host).await.expect("connect");
    stream
        .write_all(
            format!("PUT {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nten bytes.")
                .as_bytes(),
        )
        .await
        .expect("send part of the body");
    let got = read_until_closed(&mut stream, "a stalled upload").await;
    let text = String::from_utf8_lossy(&got);
    assert!(!text.starts_with("HTTP/1.1 2"), "{text}");
    let listed = common::bash(&*env.backend, &id, "ls stalled.bin 2>&1 || true").await;
    assert!(
        String::from_utf8_lossy(&listed.stdout).contains("No such file"),
        "the stalled upload kept a file: {listed:?}"
    );
}
