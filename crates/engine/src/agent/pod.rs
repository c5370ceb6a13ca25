//! The in-pod agent: this module's agent serving its protocol on TCP, with no namespaces of
//! its own (see `backend::agent_server` for the configuration and what it promises).
//!
//! Every request is served by the same [`handle`] as the embedded agent, beneath the
//! configured root (the un-isolated mode's root prefix), as the agent's own uid. What differs
//! is the front door: anyone who can reach the port can connect, so a connection's first
//! frame must be a small hello carrying the token, read within a deadline, and checked before
//! anything else is read; and only so many connections are served at once.
//!
//! Connections that have not shown the token yet never hold one of the served connections'
//! slots: they wait in a small pool of their own, where a newcomer pushes out the oldest
//! waiting connection of its own peer address (past that peer's share) or of all. So
//! strangers stalling their hellos cannot keep the token holder (the server) out, however
//! many connections they open: its hello arrives with its connection.

use super::*;
use crate::agent_server::PodAgentConfig;
use std::net::IpAddr;
use tokio::net::{TcpListener, TcpStream};

use super::super::config::UidMapping;

/// How long a refusal waits to be written, and then drains what the client sent with its
/// hello (so closing does not reset the connection before the client reads the refusal).
const REFUSAL_WAIT: Duration = Duration::from_secs(1);
/// Most bytes drained from a refused client.
const REFUSAL_DRAIN: usize = 64 * 1024;
/// Most connections waiting to show their token, from every peer together; one more pushes
/// the oldest waiting one out (a token holder's hello arrives with its connection, so it is
/// never the oldest for long).
const MAX_WAITING: usize = 128;
/// Most connections one peer address may have waiting to show their token; one more from it
/// pushes that peer's own oldest waiting one out, so a single stranger cannot fill the pool.
const MAX_WAITING_PER_PEER: usize = 32;

/// The connections waiting to show their token (see [`MAX_WAITING`]).
#[derive(Default)]
struct Waiting {
    next: u64,
    /// By arrival: the peer, and the sender whose drop ends that connection's wait.
    by_age: BTreeMap<u64, (IpAddr, oneshot::Sender<()>)>,
    per_peer: HashMap<IpAddr, usize>,
}

impl Waiting {
    fn forget(&mut self, seq: u64) {
        if let Some((peer, _)) = self.by_age.remove(&seq) {
            if let Some(n) = self.per_peer.get_mut(&peer) {
                *n -= 1;
                if *n == 0 {
                    self.per_peer.remove(&peer);
                }
            }
        }
    }
}

/// A connection's place among the waiting ones, given up when dropped.
struct WaitTicket {
    waiting: Arc<Mutex<Waiting>>,
    seq: u64,
}

impl Drop for WaitTicket {
    fn drop(&mut self) {
        self.waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .forget(self.seq);
    }
}

/// Let a connection from `peer` wait for its hello, first pushing out the peer's own oldest
/// waiting connection when it has its share waiting, else the oldest of all when the pool is
/// full. The receiver resolves when this connection is pushed out in turn.
fn admit(waiting: &Arc<Mutex<Waiting>>, peer: IpAddr) -> (WaitTicket, oneshot::Receiver<()>) {
    let mut w = waiting.lock().unwrap_or_else(|e| e.into_inner());
    let oldest = if w.per_peer.get(&peer).copied().unwrap_or(0) >= MAX_WAITING_PER_PEER {
        w.by_age
            .iter()
            .find(|(_, (p, _))| *p == peer)
            .map(|(seq, _)| *seq)
    } else if w.by_age.len() >= MAX_WAITING {
        w.by_age.keys().next().copied()
    } else {
        None
    };
    if let Some(seq) = oldest {
        // Dropping its sender ends that connection's wait.
        w.forget(seq);
    }
    let seq = w.next;
    w.next += 1;
    let (tx, rx) = oneshot::channel();
    w.by_age.insert(seq, (peer, tx));
    *w.per_peer.entry(peer).or_insert(0) += 1;
    drop(w);
    let ticket = WaitTicket {
        waiting: waiting.clone(),
        seq,
    };
    (ticket, rx)
}

/// Entry point of the pod agent. Never returns.
pub(crate) fn run(config: PodAgentConfig) -> ! {
    sys::set_process_name("sandcove-agent");
    let record = match prepare(&config) {
        Ok(record) => record,
        Err(e) => {
            eprintln!("sandcove agent: {e}");
            sys::exit_now(1);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(16)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sandcove agent: cannot start the runtime: {e}");
            sys::exit_now(1);
        }
    };
    let mut agent = Agent::new(record);
    agent.pod = true;
    if let Err(e) = runtime.block_on(serve_tcp(Arc::new(agent), config)) {
        eprintln!("sandcove agent: {e}");
        sys::exit_now(1);
    }
    sys::exit_now(0)
}

/// Harden the agent itself and build the record it serves: one user (the agent's uid), the
/// configured home and root. Every step that protects something fails closed.
fn prepare(config: &PodAgentConfig) -> Result<Record> {
    let fail = |what: &str, e: std::io::Error| Error::Unavailable {
        reason: format!("the pod agent cannot {what}: {e}"),
        remedy: "run it on Linux 5.9 or newer".into(),
    };
    // Nothing this process inherited reaches the programs it starts.
    sys::cloexec_from(3).map_err(|e| fail("mark inherited descriptors close-on-exec", e))?;
    // Sandbox processes share our uid: keep them from tracing us or reading our memory.
    sys::set_non_dumpable().map_err(|e| fail("become non-dumpable", e))?;
    if std::process::id() != 1 {
        // Orphans of sandbox processes come to us (as they do to PID 1 in a container).
        sys::set_child_subreaper().map_err(|e| fail("become a subreaper", e))?;
    }
    let (uid, gid) = (sys::geteuid(), sys::getegid());
    let name = config
        .user
        .clone()
        .unwrap_or_else(|| super::super::config::DEFAULT_USER_NAME.to_string());
    let mut options = sandcove_core::CreateOptions::default();
    options.envs = config.envs.clone();
    options.resources.max_open_files = config.max_open_files;
    let now = now_millis();
    let record = Record {
        restore_archive: None,
        id: config.sandbox.clone(),
        options,
        users: vec![sandcove_core::UserInfo {
            name,
            uid,
            gid,
            home: config.home.clone(),
        }],
        // One uid: a request for any other user is refused, never run as this one.
        mapping: UidMapping::Single {
            host_uid: uid,
            host_gid: gid,
        },
        created_at: now,
        ends_at: u64::MAX,
        unisolated: true,
        landlock_optional: true,
        cgroup: None,
        notes: BTreeMap::new(),
        mounts: Vec::new(),
        root_prefix: config
            .root
            .as_ref()
            .map(|r| r.to_string_lossy().into_owned()),
        pasta: None,
        preview_limits: Default::default(),
        protocol: proto::PROTOCOL_VERSION,
        pooled: false,
        locale: None,
        bounds: Default::default(),
        // A Pod's root is its container image, which Kubernetes mounts.
        image: None,
        image_root_mode: Default::default(),
    };
    // The home exists before anything runs in it (an emptyDir in a Pod usually; made here
    // otherwise, by the agent, before any sandbox code runs).
    let home = host_path(&record, Path::new(&config.home));
    std::fs::create_dir_all(&home).map_err(|e| Error::from_io(&e, &config.home))?;
    // The deny-list every process gets, installed on the agent once its setup is done and
    // inherited by all it starts: a filter that cannot be built or installed stops the agent.
    // It sets `no_new_privs` first (the one place for the pod agent), so no process it starts
    // can gain privileges through exec (setuid programs, file capabilities).
    super::seccomp::install()?;
    Ok(record)
}

async fn serve_tcp(agent: Arc<Agent>, config: PodAgentConfig) -> Result<()> {
    tokio::spawn(reap_children(agent.clone()));
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|e| Error::from_io(&e, &format!("listen on {}", config.listen)))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::from_io(&e, "listening address"))?;
    {
        use std::io::Write as _;
        let mut out = std::io::stdout().lock();
        writeln!(out, "listening on {addr}")
            .and_then(|()| out.flush())
            .map_err(|e| Error::from_io(&e, "stdout"))?;
    }
    let slots = Arc::new(tokio::sync::Semaphore::new(config.max_connections));
    let waiting = Arc::new(Mutex::new(Waiting::default()));
    let config = Arc::new(config);
    // Deleting a Pod sends SIGTERM to its PID 1, which has no default action for it: end
    // every sandbox process, then exit, instead of waiting out the grace period.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| Error::from_io(&e, "SIGTERM handler"))?;
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = term.recv() => {
                stop_all(&agent).await?;
                return Ok(());
            }
        };
        let (sock, peer) = match accepted {
            Ok(accepted) => accepted,
            // Out of descriptors or memory: wait rather than spin.
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let (ticket, pushed_out) = admit(&waiting, peer.ip().to_canonical());
        let _ = sock.set_nodelay(true);
        let (agent, config, slots) = (agent.clone(), config.clone(), slots.clone());
        tokio::spawn(async move {
            serve_tcp_connection(&agent, &config, &slots, sock, ticket, pushed_out).await;
        });
        // Let the new connection read a hello that is already there before accepting more
        // (one thread serves everything): a burst of token holders waits as little as it can.
        tokio::task::yield_now().await;
    }
}

/// Authenticate one connection (while it holds `ticket` among the waiting ones), then take
/// one of the served connections' `slots` and serve its requests like a handed-off one.
async fn serve_tcp_connection(
    agent: &Arc<Agent>,
    config: &PodAgentConfig,
    slots: &Arc<tokio::sync::Semaphore>,
    mut sock: TcpStream,
    ticket: WaitTicket,
    pushed_out: oneshot::Receiver<()>,
) {
    let hello = tokio::select! {
        hello = tokio::time::timeout(
            config.hello_timeout,
            proto::read_hello_frame(&mut sock, proto::MAX_HELLO),
        ) => hello,
        // Newer connections pushed this one out of the waiting pool: dropped.
        _ = pushed_out => return,
    };
    let head = match hello {
        // Too slow (a slow-loris connection): dropped.
        Err(_elapsed) => return,
        Ok(Ok(Some(head))) => head,
        Ok(Ok(None)) => return,
        Ok(Err(e)) => return refuse(&mut sock, &e).await,
    };
    // The token before anything else: nothing but its presence is looked at first.
    let value: serde_json::Value = serde_json::from_slice(&head).unwrap_or_default();
    let token = value.get("token").and_then(|t| t.as_str());
    if let Err(e) = check_token(token, &config.token_sha256) {
        return refuse(&mut sock, &e).await;
    }
    // A token holder: no longer waiting, and served only within the connection bound.
    drop(ticket);
    let Ok(_slot) = slots.clone().try_acquire_owned() else {
        let err = Error::RateLimited {
            message: format!(
                "the sandbox agent serves at most {} connections at once",
                config.max_connections
            ),
            retry_after_ms: Some(1000),
        };
        return refuse(&mut sock, &err).await;
    };
    let hello = match proto::parse_hello(&head) {
        Ok(hello) => hello,
        Err(e) => return refuse(&mut sock, &e).await,
    };
    if hello.request.is_some() {
        let e = Error::not_supported(
            "sandbox lifecycle requests to the in-pod agent",
            "manage the pod through the Kubernetes backend (sandcove serve --backend kubernetes)",
        );
        return refuse(&mut sock, &e).await;
    }
    // The first request comes within the hello's deadline; later ones reuse the connection
    // (protocol v5) until it idles out.
    let epoch = agent.epoch.subscribe();
    serve_requests(agent, &mut sock, epoch, Some(config.hello_timeout), true).await;
}

/// Whether `token` hashes to `expected`, compared in constant time.
fn check_token(token: Option<&str>, expected: &[u8; 32]) -> Result<()> {
    let Some(token) = token else {
        return Err(Error::Unauthenticated {
            message: "the sandbox agent requires a token in the hello".into(),
        });
    };
    let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    if sandcove_core::secret::secrets_match(digest.as_ref(), expected) {
        Ok(())
    } else {
        Err(Error::Unauthenticated {
            message: "the sandbox agent refused the token".into(),
        })
    }
}

/// Answer `err` and close, reading (within bounds) what the client already sent so the close
/// does not reset the connection before the client reads the answer.
async fn refuse(sock: &mut TcpStream, err: &Error) {
    let answer = async {
        let _ = proto::write_frame(sock, &AgentReply::error(err), &[]).await;
        let _ = sock.shutdown().await;
        let mut buf = vec![0u8; 8192];
        let mut drained = 0;
        while drained < REFUSAL_DRAIN {
            match sock.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => drained += n,
            }
        }
    };
    let _ = tokio::time::timeout(REFUSAL_WAIT, answer).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_token_with_the_configured_hash_passes() {
        let digest = ring::digest::digest(&ring::digest::SHA256, b"right");
        let expected: [u8; 32] = digest.as_ref().try_into().unwrap();
        assert!(check_token(Some("right"), &expected).is_ok());
        for bad in [Some("wrong"), Some(""), Some("right "), None] {
            let err = check_token(bad, &expected).unwrap_err();
            assert!(matches!(err, Error::Unauthenticated { .. }), "{err:?}");
        }
    }
}
