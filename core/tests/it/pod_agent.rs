//! The in-pod agent (the Kubernetes backend's sandbox entrypoint) started as a local process
//! from this test binary, served over TCP on 127.0.0.1: the conformance cases about processes,
//! files, watch, PTY and metrics through [`RemoteAgent`], and its front door (token, hello
//! bounds, tunnel, users).
//!
//! Each "sandbox" of the small test backend below is one agent process with a scratch
//! directory standing in for its `/` (the un-isolated mode's root prefix); there is no
//! container here, so isolation itself is not what these tests check.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use sandcove::backend::agent_client::{AgentDialer, AgentIo, RemoteAgent, TcpDialer};
use sandcove::backend::agent_server::{spawn_local_pod_agent, token_sha256_hex, PodAgentConfig};
use sandcove::backend::{Backend, ByteStream, ProcessStream, WatchStream};
use sandcove::*;
use sandcove_conformance::{eventually, unique, PATIENCE};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One agent process.
struct Pod {
    child: std::process::Child,
    addr: SocketAddr,
    agent: RemoteAgent,
    info: SandboxInfo,
    root: PathBuf,
}

/// A minimal backend whose sandboxes are local pod agents: lifecycle is just start and kill;
/// every sandbox-scoped call goes through [`RemoteAgent`].
#[derive(Default)]
struct PodAgents {
    pods: Mutex<HashMap<String, Pod>>,
}

impl std::fmt::Debug for PodAgents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PodAgents")
    }
}

impl Drop for PodAgents {
    fn drop(&mut self) {
        let pods: Vec<Pod> = self
            .pods
            .lock()
            .unwrap()
            .drain()
            .map(|(_, pod)| pod)
            .collect();
        for pod in pods {
            end_pod(pod);
        }
    }
}

/// SIGTERM (the agent ends its processes, as on a Pod deletion), SIGKILL if it lingers; the
/// scratch root removed.
fn end_pod(mut pod: Pod) {
    let pid = pod.child.id() as i32;
    // SAFETY: kill on the pid of a child we have not reaped yet.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        match pod.child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10))
            }
            _ => {
                let _ = pod.child.kill();
                let _ = pod.child.wait();
                break;
            }
        }
    }
    let _ = std::fs::remove_dir_all(&pod.root);
}

fn config(token: &str, root: Option<PathBuf>) -> PodAgentConfig {
    let hash = token_sha256_hex(token);
    let mut bytes = [0u8; 32];
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hash[2 * i..2 * i + 2], 16).unwrap();
    }
    let mut config = PodAgentConfig::new("127.0.0.1:0".parse().unwrap(), bytes);
    config.root = root;
    config
}

/// A scratch directory standing in for a container's `/`, with the `/tmp` a container has.
fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(unique(&format!("pod-{tag}")));
    std::fs::create_dir_all(dir.join("tmp")).unwrap();
    dir
}

fn capabilities() -> Capabilities {
    serde_json::from_value(serde_json::json!({
        "backend": "pod-agent-test",
        "isolated": false,
        "multiple_users": false,
        "persistent_sandboxes": false,
        "host_network": true,
        "process_limit": false,
        "max_file_bytes": 4u64 << 30,
        "output_limit": DEFAULT_OUTPUT_LIMIT,
        "pause": false,
        "previews": false,
        "snapshots": false,
        "volumes": false,
        "watch": true,
        "pty": true,
        "metrics": true,
    }))
    .expect("capabilities")
}

fn unsupported(what: &str) -> Error {
    Error::not_supported(what, "not part of the pod agent test backend")
}

impl PodAgents {
    fn agent(&self, id: &str) -> Result<RemoteAgent> {
        self.pods
            .lock()
            .unwrap()
            .get(id)
            .map(|p| p.agent.clone())
            .ok_or_else(|| Error::not_found(format!("sandbox {id:?}")))
    }
}

#[async_trait]
impl Backend for PodAgents {
    fn capabilities(&self) -> Capabilities {
        capabilities()
    }
    async fn ready(&self) -> Result<Capabilities> {
        Ok(capabilities())
    }
    async fn create(&self, options: CreateOptions) -> Result<SandboxInfo> {
        options.validate()?;
        let id = random_id(20);
        let token = random_id(32);
        let root = scratch("root");
        let mut config = config(&token, Some(root.clone()));
        config.envs = options.envs.clone();
        config.sandbox = id.clone();
        config.user = options.user.clone();
        let home = options.home.clone().unwrap_or_else(|| SANDBOX_HOME.into());
        config.home = home.clone();
        let user = options.user.clone().unwrap_or_else(|| "user".into());
        let (child, addr) = tokio::task::spawn_blocking(move || spawn_local_pod_agent(&config))
            .await
            .unwrap()?;
        let agent = RemoteAgent::new(&id, Arc::new(TcpDialer::new(addr)), token);
        agent.ready().await?;
        let now = now_millis();
        let info: SandboxInfo = serde_json::from_value(serde_json::json!({
            "id": id,
            "name": options.name,
            "state": "running",
            "template": "base",
            "labels": options.labels,
            "envs": options.envs,
            "resources": options.resources,
            "network": options.network,
            // The agent runs as this test's uid: so do its processes and files.
            "user": {"name": user, "uid": my_uid(), "gid": my_gid(), "home": home},
            "created_at": now,
            "ends_at": now + 600_000,
        }))
        .map_err(|e| Error::backend(e.to_string()))?;
        self.pods.lock().unwrap().insert(
            id,
            Pod {
                child,
                addr,
                agent,
                info: info.clone(),
                root,
            },
        );
        Ok(info)
    }
    async fn get(&self, id: &str) -> Result<SandboxInfo> {
        self.pods
            .lock()
            .unwrap()
            .get(id)
            .map(|p| p.info.clone())
            .ok_or_else(|| Error::not_found(format!("sandbox {id:?}")))
    }
    async fn list(&self, _options: ListOptions) -> Result<Vec<SandboxInfo>> {
        Ok(self
            .pods
            .lock()
            .unwrap()
            .values()
            .map(|p| p.info.clone())
            .collect())
    }
    async fn set_timeout(&self, _id: &str, _options: SetTimeoutOptions) -> Result<SandboxInfo> {
        Err(unsupported("set_timeout"))
    }
    async fn set_on_timeout(
        &self,
        _id: &str,
        _options: SetOnTimeoutOptions,
    ) -> Result<SandboxInfo> {
        Err(unsupported("set_on_timeout"))
    }
    async fn set_labels(&self, _id: &str, _options: SetLabelsOptions) -> Result<SandboxInfo> {
        Err(unsupported("set_labels"))
    }
    async fn update_annotations(
        &self,
        _id: &str,
        _update: AnnotationUpdate,
    ) -> Result<BTreeMap<String, String>> {
        Err(unsupported("annotations"))
    }
    async fn destroy(&self, id: &str) -> Result<()> {
        let pod = self.pods.lock().unwrap().remove(id);
        let pod = pod.ok_or_else(|| Error::not_found(format!("sandbox {id:?}")))?;
        tokio::task::spawn_blocking(move || end_pod(pod))
            .await
            .unwrap();
        Ok(())
    }
    async fn spawn(&self, id: &str, spec: ProcessSpec) -> Result<ProcessStream> {
        self.agent(id)?.spawn(spec).await
    }
    async fn attach(&self, id: &str, process: ProcessSelector) -> Result<ProcessStream> {
        self.agent(id)?.attach(process).await
    }
    async fn write_stdin(
        &self,
        id: &str,
        process: ProcessSelector,
        options: WriteStdinOptions,
    ) -> Result<()> {
        self.agent(id)?.write_stdin(process, options).await
    }
    async fn close_stdin(&self, id: &str, process: ProcessSelector) -> Result<()> {
        self.agent(id)?.close_stdin(process).await
    }
    async fn signal(
        &self,
        id: &str,
        process: ProcessSelector,
        options: SignalOptions,
    ) -> Result<()> {
        self.agent(id)?.signal(process, options).await
    }
    async fn list_processes(&self, id: &str) -> Result<Vec<ProcessInfo>> {
        self.agent(id)?.list_processes().await
    }
    async fn read_file(&self, id: &str, path: &str, options: ReadOptions) -> Result<ByteStream> {
        self.agent(id)?.read_file(path, options).await
    }
    async fn write_file(
        &self,
        id: &str,
        path: &str,
        data: ByteStream,
        options: WriteOptions,
    ) -> Result<FileStat> {
        self.agent(id)?.write_file(path, data, options).await
    }
    async fn list_dir(
        &self,
        id: &str,
        path: &str,
        options: ListDirOptions,
    ) -> Result<Vec<FileStat>> {
        self.agent(id)?.list_dir(path, options).await
    }
    async fn stat(&self, id: &str, path: &str, options: StatOptions) -> Result<FileStat> {
        self.agent(id)?.stat(path, options).await
    }
    async fn mkdir(&self, id: &str, path: &str, options: MkdirOptions) -> Result<FileStat> {
        self.agent(id)?.mkdir(path, options).await
    }
    async fn remove(&self, id: &str, path: &str, options: RemoveOptions) -> Result<()> {
        self.agent(id)?.remove(path, options).await
    }
    async fn rename(
        &self,
        id: &str,
        from: &str,
        to: &str,
        options: RenameOptions,
    ) -> Result<FileStat> {
        self.agent(id)?.rename(from, to, options).await
    }
    async fn copy(&self, id: &str, from: &str, to: &str, options: CopyOptions) -> Result<FileStat> {
        self.agent(id)?.copy(from, to, options).await
    }
    async fn chmod(&self, id: &str, path: &str, options: ChmodOptions) -> Result<FileStat> {
        self.agent(id)?.chmod(path, options).await
    }
    async fn pause(&self, _id: &str) -> Result<SandboxInfo> {
        Err(unsupported("pause"))
    }
    async fn resume(&self, _id: &str) -> Result<SandboxInfo> {
        Err(unsupported("pause"))
    }
    async fn stop(&self, _id: &str) -> Result<SandboxInfo> {
        Err(unsupported("stop"))
    }
    async fn start(&self, _id: &str) -> Result<SandboxInfo> {
        Err(unsupported("stop"))
    }
    async fn metrics(&self, id: &str) -> Result<Metrics> {
        self.agent(id)?.metrics().await
    }
    async fn resize_pty(
        &self,
        id: &str,
        process: ProcessSelector,
        options: ResizePtyOptions,
    ) -> Result<()> {
        self.agent(id)?.resize_pty(process, options).await
    }
    async fn watch(&self, id: &str, path: &str, options: WatchOptions) -> Result<WatchStream> {
        self.agent(id)?.watch(path, options).await
    }
    async fn expose_port(&self, _id: &str, _options: PreviewOptions) -> Result<Preview> {
        Err(unsupported("previews"))
    }
    async fn list_previews(&self, _id: &str) -> Result<Vec<Preview>> {
        Err(unsupported("previews"))
    }
    async fn close_preview(&self, _id: &str, _port: u16) -> Result<()> {
        Err(unsupported("previews"))
    }
    async fn create_preview_token(
        &self,
        _id: &str,
        _port: u16,
        _options: PreviewTokenOptions,
    ) -> Result<PreviewToken> {
        Err(unsupported("previews"))
    }
    async fn create_file_url(
        &self,
        _: &str,
        _: sandcove::FileUrlOptions,
    ) -> Result<sandcove::FileUrl> {
        Err(unsupported("file URLs"))
    }
    async fn revoke_preview_token(&self, _id: &str, _port: u16, _token: &str) -> Result<()> {
        Err(unsupported("previews"))
    }
    async fn snapshot(&self, _id: &str, _options: SnapshotOptions) -> Result<SnapshotInfo> {
        Err(unsupported("snapshots"))
    }
    async fn list_snapshots(&self) -> Result<Vec<SnapshotInfo>> {
        Err(unsupported("snapshots"))
    }
    async fn delete_snapshot(&self, _snapshot_id: &str) -> Result<()> {
        Err(unsupported("snapshots"))
    }
    async fn fork(&self, _id: &str, _options: CreateOptions) -> Result<SandboxInfo> {
        Err(unsupported("snapshots"))
    }
    async fn create_volume(&self, _name: &str) -> Result<VolumeInfo> {
        Err(unsupported("volumes"))
    }
    async fn get_volume(&self, _name: &str) -> Result<VolumeInfo> {
        Err(unsupported("volumes"))
    }
    async fn list_volumes(&self) -> Result<Vec<VolumeInfo>> {
        Err(unsupported("volumes"))
    }
    async fn delete_volume(&self, _name: &str) -> Result<()> {
        Err(unsupported("volumes"))
    }
    async fn tombstone(&self, _kind: ResourceKind, _id: &str) -> Result<Option<Tombstone>> {
        Ok(None)
    }
    async fn observe(&self, _operation: &OperationId) -> Result<OperationStatus> {
        Err(unsupported("operation records"))
    }
}

fn my_uid() -> u32 {
    std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").unwrap())
}

fn my_gid() -> u32 {
    std::os::unix::fs::MetadataExt::gid(&std::fs::metadata("/proc/self").unwrap())
}

async fn pods() -> Arc<dyn Backend> {
    Arc::new(PodAgents::default())
}

sandcove_conformance::conformance_tests!(@cases pods();
    argv_and_shell_commands,
    exit_codes_and_stderr,
    output_is_binary_safe,
    large_output_streams_without_loss,
    sandbox_and_process_envs,
    bad_process_input_is_refused,
    missing_binary_is_not_found,
    working_directory,
    default_user_and_home,
    running_as_another_user,
    stdin_write_and_close,
    signals_and_kill_mid_stream,
    process_timeout_kills_the_group,
    list_and_attach_processes,
    attach_marks_where_live_output_starts,
    restart_policy_restarts_failures,
    file_calls_as_a_user,
    file_round_trip_and_metadata,
    large_file_round_trip,
    file_byte_bounds,
    no_clobber_writes_renames_and_copies,
    copy_files_and_trees,
    exists_tells_missing_from_unknown,
    directory_operations,
    file_errors_are_typed,
    failed_uploads_leave_nothing_behind,
    file_api_cannot_escape,
    destroy_ends_background_processes,
    watch_reports_changes,
    pty_processes,
    metrics_report_usage,
);

// ---------------------------------------------------------------------------------------------
// The front door
// ---------------------------------------------------------------------------------------------

/// One agent with a scratch root, ended on drop.
struct OnePod {
    pod: Option<Pod>,
    token: String,
}

impl Drop for OnePod {
    fn drop(&mut self) {
        if let Some(pod) = self.pod.take() {
            end_pod(pod);
        }
    }
}

impl OnePod {
    async fn start(tag: &str, tweak: impl FnOnce(&mut PodAgentConfig) + Send + 'static) -> OnePod {
        let token = random_id(32);
        let root = scratch(tag);
        let mut config = config(&token, Some(root.clone()));
        tweak(&mut config);
        let (child, addr) = tokio::task::spawn_blocking(move || spawn_local_pod_agent(&config))
            .await
            .unwrap()
            .expect("start a pod agent");
        let agent = RemoteAgent::new(tag, Arc::new(TcpDialer::new(addr)), token.clone());
        let info: SandboxInfo = serde_json::from_value(serde_json::json!({
            "id": tag, "state": "running", "template": "base", "labels": {}, "envs": {},
            "resources": {}, "network": "none",
            "user": {"name": "user", "uid": 0, "gid": 0, "home": SANDBOX_HOME},
            "created_at": 0, "ends_at": 0,
        }))
        .unwrap();
        OnePod {
            pod: Some(Pod {
                child,
                addr,
                agent,
                info,
                root,
            }),
            token,
        }
    }
    fn pod(&self) -> &Pod {
        self.pod.as_ref().unwrap()
    }
    fn agent(&self) -> &RemoteAgent {
        &self.pod().agent
    }
    fn with_token(&self, token: &str) -> RemoteAgent {
        RemoteAgent::new(
            "other",
            Arc::new(TcpDialer::new(self.pod().addr)),
            token.to_string(),
        )
    }
    fn root(&self) -> &std::path::Path {
        &self.pod().root
    }
}

/// A raw frame as the protocol lays it out.
fn frame(header: &serde_json::Value) -> Vec<u8> {
    let head = serde_json::to_vec(header).unwrap();
    let mut out = Vec::new();
    out.extend_from_slice(&(head.len() as u32).to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&head);
    out
}

/// Read one reply frame's header from a raw connection (`None` at EOF or a reset).
async fn read_header(sock: &mut tokio::net::TcpStream) -> Option<serde_json::Value> {
    let mut prefix = [0u8; 8];
    sock.read_exact(&mut prefix).await.ok()?;
    let hlen = u32::from_le_bytes(prefix[..4].try_into().unwrap()) as usize;
    let blen = u32::from_le_bytes(prefix[4..].try_into().unwrap()) as usize;
    let mut head = vec![0u8; hlen];
    sock.read_exact(&mut head).await.ok()?;
    let mut body = vec![0u8; blen];
    sock.read_exact(&mut body).await.ok()?;
    serde_json::from_slice(&head).ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_token_is_refused_before_any_effect() {
    let pod = OnePod::start("wrongtoken", |_| {}).await;
    pod.agent()
        .ready()
        .await
        .expect("the right token is accepted");
    let marker = "/workspace/made-by-a-stranger";
    let intruder = pod.with_token("not-the-token");
    let err = intruder
        .write_file(
            marker,
            Box::pin(futures::stream::once(async { Ok(b"x".to_vec()) })),
            WriteOptions::default(),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unauthenticated { .. }), "{err:?}");
    let spec = ProcessSpec::new(Command::sh(format!("echo x > {marker}")));
    let err = intruder.spawn(spec).await.unwrap_err();
    assert!(matches!(err, Error::Unauthenticated { .. }), "{err:?}");
    // Nothing happened: no file, no process.
    assert!(!pod.root().join("workspace/made-by-a-stranger").exists());
    assert!(pod.agent().list_processes().await.unwrap().is_empty());
    // The token is the token itself, not its hash (which a Pod spec shows).
    let hash = token_sha256_hex(&pod.token);
    let err = pod.with_token(&hash).ready().await.unwrap_err();
    assert!(matches!(err, Error::Unauthenticated { .. }), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hello_without_a_token_is_refused() {
    let pod = OnePod::start("notoken", |_| {}).await;
    let mut sock = tokio::net::TcpStream::connect(pod.pod().addr)
        .await
        .unwrap();
    let hello = serde_json::json!({"version": sandcove::backend::local::PROTOCOL_VERSION});
    let mut bytes = frame(&hello);
    bytes.extend(frame(&serde_json::json!({"op": "list_processes"})));
    sock.write_all(&bytes).await.unwrap();
    let reply = read_header(&mut sock).await.expect("a refusal frame");
    assert_eq!(reply["kind"], "error", "{reply}");
    assert_eq!(reply["error"]["code"], "unauthenticated", "{reply}");
    // And the connection ends there: the request was never answered.
    assert!(read_header(&mut sock).await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_hello_is_refused_unread() {
    let pod = OnePod::start("bighello", |_| {}).await;
    let mut sock = tokio::net::TcpStream::connect(pod.pod().addr)
        .await
        .unwrap();
    // A header length far past the hello bound (but within the protocol's frame bound): the
    // agent must refuse from the length alone.
    let mut prefix = Vec::new();
    prefix.extend_from_slice(&(1u32 << 20).to_le_bytes());
    prefix.extend_from_slice(&0u32.to_le_bytes());
    sock.write_all(&prefix).await.unwrap();
    let reply = tokio::time::timeout(PATIENCE, read_header(&mut sock))
        .await
        .expect("answered without waiting for the announced megabyte")
        .expect("a refusal frame");
    assert_eq!(reply["kind"], "error", "{reply}");
    assert!(
        reply["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("hello"),
        "{reply}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_hello_is_dropped() {
    let pod = OnePod::start("slowhello", |c| {
        c.hello_timeout = Duration::from_millis(300);
        c.max_connections = 2;
    })
    .await;
    // Two connections that send half a prefix and stall: they hold every slot, until the
    // hello deadline drops them.
    let mut slow = Vec::new();
    for _ in 0..2 {
        let mut sock = tokio::net::TcpStream::connect(pod.pod().addr)
            .await
            .unwrap();
        sock.write_all(&[1, 0, 0]).await.unwrap();
        slow.push(sock);
    }
    for sock in &mut slow {
        // The agent closes it: EOF (or a reset), never a reply.
        let mut buf = [0u8; 1];
        let got = tokio::time::timeout(PATIENCE, sock.read(&mut buf))
            .await
            .expect("the slow connection is dropped");
        assert!(matches!(got, Ok(0) | Err(_)), "{got:?}");
    }
    // Once they are gone, a real client is served.
    eventually(
        PATIENCE,
        "a client is served after the slow ones",
        || async { pod.agent().ready().await },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_bound_are_refused() {
    let pod = OnePod::start("maxconn", |c| {
        c.max_connections = 1;
        c.hello_timeout = Duration::from_secs(120);
    })
    .await;
    // One served connection (a tunnel, open until dropped) holds the only slot.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let holder = pod.agent().tunnel(port).await.expect("tunnel");
    let (accepted, _) = listener.accept().await.unwrap();
    let err = eventually(PATIENCE, "a second connection is refused", || async {
        match pod.agent().ready().await {
            Err(e @ Error::RateLimited { .. }) => Ok(e),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(err.to_string().contains("at most 1"), "{err}");
    // The tunnel ends once both of its ends have closed.
    drop(holder);
    drop(accepted);
    eventually(PATIENCE, "served once the slot is free", || async {
        pod.agent().ready().await
    })
    .await;
}

/// Open a connection to `addr` from the loopback address `from` and send one byte of a
/// frame prefix, never the rest: a stranger stalling its hello.
async fn stalled_connection(
    from: std::net::Ipv4Addr,
    addr: SocketAddr,
) -> std::io::Result<tokio::net::TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(from.into(), 0))?;
    let mut sock = socket.connect(addr).await?;
    sock.write_all(&[1]).await?;
    Ok(sock)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_stalling_hellos_do_not_keep_the_token_holder_out() {
    let pod = OnePod::start("stallers", |c| {
        c.max_connections = 16;
        // Long enough that no stalled hello times out during the test.
        c.hello_timeout = Duration::from_secs(600);
    })
    .await;
    let addr = pod.pod().addr;
    // Strangers never finish a hello: one on 127.0.0.2 opens 100 connections, twenty more
    // on other loopback addresses open 10 each (all together many times the connection
    // bound). The token holder comes from 127.0.0.1. The strangers push each other out of
    // the waiting pool; none of them holds a served connection's slot.
    let mut strangers = Vec::new();
    let mut peers = vec![(2u8, 100)];
    peers.extend((3..23u8).map(|host| (host, 10)));
    for (host, count) in peers {
        for _ in 0..count {
            if let Ok(sock) =
                stalled_connection(std::net::Ipv4Addr::new(127, 0, 0, host), addr).await
            {
                strangers.push(sock);
            }
        }
    }
    assert!(strangers.len() >= 16, "only {} connected", strangers.len());
    // The token holder is served at once (before the fix the strangers held every slot
    // until their hello deadline, and it was refused as rate limited).
    // (A client that keeps no idle connection: a kept one would hold a slot, protocol v5.)
    let unpooled = pod.agent().clone().with_pool(None);
    for _ in 0..3 {
        let ready = tokio::time::timeout(PATIENCE, unpooled.ready())
            .await
            .expect("answered");
        assert!(ready.is_ok(), "{ready:?}");
    }
    // And it can still hold many connections at once: the strangers took none of them.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut tunnels = Vec::new();
    for _ in 0..16 {
        tunnels.push(pod.agent().tunnel(port).await.expect("a tunnel"));
    }
    let err = pod.agent().ready().await.unwrap_err();
    assert!(matches!(err, Error::RateLimited { .. }), "{err:?}");
    drop(strangers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_reaches_a_server_on_the_agents_loopback() {
    let pod = OnePod::start("tunnel", |_| {}).await;
    // A server listening on 127.0.0.1 only, as a sandboxed program would.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        let mut buf = [0u8; 5];
        sock.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"hello");
        sock.write_all(b"world").await.unwrap();
    });
    let mut io: Box<dyn AgentIo> = pod.agent().tunnel(port).await.expect("tunnel");
    io.write_all(b"hello").await.unwrap();
    let mut buf = [0u8; 5];
    io.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"world");
    server.await.unwrap();
    // Nothing listening: a typed refusal, not a pipe to nowhere.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead_port = closed.local_addr().unwrap().port();
    drop(closed);
    let err = pod.agent().tunnel(dead_port).await.err().expect("refused");
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    // And a stranger gets no tunnel.
    let err = pod
        .with_token("nope")
        .tunnel(port)
        .await
        .err()
        .expect("refused");
    assert!(matches!(err, Error::Unauthenticated { .. }), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_open_files_bound_reaches_every_process() {
    // An agent started with a bound on open files passes it to its processes (the command
    // that starts a pod agent dropped it, so they ran with the default).
    let pod = OnePod::start("nofile", |c| c.max_open_files = Some(123)).await;
    let stream = pod
        .agent()
        .spawn(ProcessSpec::new(Command::sh("ulimit -n")))
        .await
        .expect("spawn");
    let out = sandcove::client::collect(stream, 4096).await.expect("run");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "123\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_inherit_no_new_privs_and_the_filter() {
    // The pod agent sets `no_new_privs` once (installing its seccomp filter); every process
    // it starts inherits both, so none can gain privileges through exec.
    let pod = OnePod::start("nnp", |_| {}).await;
    let stream = pod
        .agent()
        .spawn(ProcessSpec::new(Command::sh(
            "grep -E '^(NoNewPrivs|Seccomp):' /proc/self/status",
        )))
        .await
        .expect("spawn");
    let out = sandcove::client::collect(stream, 4096).await.expect("run");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "NoNewPrivs:\t1\nSeccomp:\t2\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_for_an_unknown_user_is_refused() {
    let pod = OnePod::start("users", |_| {}).await;
    let mut spec = ProcessSpec::new(Command::sh("id -u > /dev/null"));
    spec.user = Some("someone-else".into());
    let err = pod.agent().spawn(spec).await.unwrap_err();
    assert!(matches!(err, Error::NotSupported { .. }), "{err:?}");
    let mut options = StatOptions::default();
    options.user = Some("someone-else".into());
    let err = pod.agent().stat("/workspace", options).await.unwrap_err();
    assert!(matches!(err, Error::NotSupported { .. }), "{err:?}");
    assert!(pod.agent().list_processes().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_requests_are_not_served_by_the_pod_agent() {
    let pod = OnePod::start("lifecycle", |_| {}).await;
    let mut sock = tokio::net::TcpStream::connect(pod.pod().addr)
        .await
        .unwrap();
    let hello = serde_json::json!({
        "version": sandcove::backend::local::PROTOCOL_VERSION,
        "token": pod.token,
        "request": {"op": "destroy"},
    });
    sock.write_all(&frame(&hello)).await.unwrap();
    let reply = read_header(&mut sock).await.expect("a refusal frame");
    assert_eq!(reply["error"]["code"], "not_supported", "{reply}");
    pod.agent().ready().await.expect("still serving");
}

/// A [`TcpDialer`] that counts its dials.
#[derive(Debug)]
struct CountingDialer {
    inner: TcpDialer,
    dials: std::sync::atomic::AtomicUsize,
}

#[async_trait]
impl AgentDialer for CountingDialer {
    async fn dial(&self) -> Result<Box<dyn AgentIo>> {
        self.dials.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.dial().await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_are_reused_and_a_cancelled_stream_does_not_poison_the_pool() {
    let pod = OnePod::start("reuse", |_| {}).await;
    let dialer = Arc::new(CountingDialer {
        inner: TcpDialer::new(pod.pod().addr),
        dials: Default::default(),
    });
    let dials = || dialer.dials.load(std::sync::atomic::Ordering::SeqCst);
    let agent = RemoteAgent::new("reuse", dialer.clone(), pod.token.clone());
    let echo = |text: &str| ProcessSpec::new(Command::argv(["echo", text]));
    // Single replies, a process stream to its exit, a file upload and a file stream to its
    // end: all on the one connection.
    agent.ready().await.expect("ping");
    let out = client::collect(agent.spawn(echo("one")).await.unwrap(), usize::MAX)
        .await
        .unwrap();
    assert_eq!(out.stdout, b"one\n");
    let data: ByteStream = Box::pin(futures::stream::once(async { Ok(b"abc".to_vec()) }));
    agent
        .write_file("/workspace/f", data, WriteOptions::default())
        .await
        .expect("write");
    let read: Vec<u8> = read_all(
        agent
            .read_file("/workspace/f", ReadOptions::default())
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(read, b"abc");
    agent.list_processes().await.expect("list");
    // The upload dials (its data cannot be sent twice); everything else reused.
    assert_eq!(dials(), 2, "one dial for the calls, one for the upload");

    // A stream dropped half-read: its connection is not reused, and the next call sees
    // only its own replies. (A client of its own, so that connection is the only one kept.)
    let agent = RemoteAgent::new("reuse", dialer.clone(), pod.token.clone());
    agent.ready().await.expect("ping");
    assert_eq!(dials(), 3);
    let spec = ProcessSpec::new(Command::sh("echo first; sleep 600"));
    let mut stream = agent.spawn(spec).await.expect("spawn");
    let sleeper = stream.pid;
    let first = stream
        .events
        .next()
        .await
        .expect("an event")
        .expect("output");
    assert!(
        matches!(first, ProcessEvent::Stdout(ref b) if b == b"first\n"),
        "{first:?}"
    );
    drop(stream);
    let before = dials();
    let out = client::collect(agent.spawn(echo("two")).await.unwrap(), usize::MAX)
        .await
        .unwrap();
    assert_eq!(out.stdout, b"two\n");
    assert_eq!(out.status.and_then(|s| s.code), Some(0));
    assert_eq!(
        dials(),
        before + 1,
        "the cancelled stream's connection was dropped"
    );

    // An error reply ends its connection too; the next call dials and is served.
    let err = agent
        .stat("/workspace/missing", StatOptions::default())
        .await
        .expect_err("missing");
    assert!(err.is_not_found(), "{err:?}");
    let before = dials();
    agent.ready().await.expect("ping after an error");
    assert_eq!(dials(), before + 1);
    agent
        .signal(
            ProcessSelector::Pid(sleeper),
            SignalOptions::new(Signal::Kill),
        )
        .await
        .expect("end the sleeper");
}

async fn read_all(mut stream: ByteStream) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(chunk) = stream.next().await {
        out.extend(chunk.expect("chunk"));
    }
    out
}

/// A frame with a body, or only its head when `body` is shorter than `announced`.
fn data_frame(announced: usize, body: &[u8]) -> Vec<u8> {
    let head = serde_json::to_vec(&serde_json::json!({"kind": "data"})).unwrap();
    let mut out = Vec::new();
    out.extend_from_slice(&(head.len() as u32).to_le_bytes());
    out.extend_from_slice(&(announced as u32).to_le_bytes());
    out.extend_from_slice(&head);
    out.extend_from_slice(body);
    out
}

/// A raw connection past the hello, with `request` sent.
async fn raw_request(pod: &OnePod, request: serde_json::Value) -> tokio::net::TcpStream {
    let mut sock = tokio::net::TcpStream::connect(pod.pod().addr)
        .await
        .unwrap();
    let hello = serde_json::json!({
        "version": sandcove::backend::local::PROTOCOL_VERSION,
        "token": pod.token,
    });
    let mut bytes = frame(&hello);
    bytes.extend(frame(&request));
    sock.write_all(&bytes).await.unwrap();
    sock
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_cut_inside_a_frame_leaves_nothing_and_ends_its_connection() {
    let pod = OnePod::start("cutupload", |_| {}).await;
    let write = serde_json::json!({
        "op": "write_file", "path": "/workspace/cut.bin", "options": {},
    });
    // One whole frame, then one announced at a megabyte of which a third arrives before the
    // client stops sending: the agent is inside that frame's body when the bytes end.
    let mut sock = raw_request(&pod, write.clone()).await;
    let mut bytes = data_frame(4096, &[7u8; 4096]);
    bytes.extend(data_frame(1 << 20, &vec![9u8; 350_000]));
    sock.write_all(&bytes).await.unwrap();
    sock.shutdown().await.unwrap();
    let reply = tokio::time::timeout(PATIENCE, read_header(&mut sock))
        .await
        .expect("the agent answers a cut-off upload");
    if let Some(reply) = &reply {
        assert_eq!(
            reply["kind"], "error",
            "only a refusal, never a stat: {reply}"
        );
    }
    assert!(
        tokio::time::timeout(PATIENCE, read_header(&mut sock))
            .await
            .expect("the connection ends")
            .is_none(),
        "nothing follows on that connection"
    );
    // The temporary file was removed before the answer: nothing is left, target or debris.
    let left: Vec<_> = std::fs::read_dir(pod.root().join("workspace"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");

    // The same cut with an existing target keeps its old content, and the agent serves on.
    pod.agent()
        .write_file(
            "/workspace/cut.bin",
            Box::pin(futures::stream::once(async { Ok(b"old".to_vec()) })),
            WriteOptions::default(),
        )
        .await
        .expect("write");
    let mut sock = raw_request(&pod, write).await;
    sock.write_all(&data_frame(1 << 20, &vec![9u8; 200_000]))
        .await
        .unwrap();
    sock.shutdown().await.unwrap();
    while tokio::time::timeout(PATIENCE, read_header(&mut sock))
        .await
        .expect("the connection ends")
        .is_some()
    {}
    let left: Vec<_> = std::fs::read_dir(pod.root().join("workspace"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["cut.bin"], "no temporary file is left");
    let data = read_all(
        pod.agent()
            .read_file("/workspace/cut.bin", ReadOptions::default())
            .await
            .expect("read"),
    )
    .await;
    assert_eq!(data, b"old", "a cut-off overwrite keeps the old content");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_dropped_midway_leaves_the_agent_serving() {
    let pod = OnePod::start("dropread", |_| {}).await;
    let content: Vec<u8> = (0..(8u32 << 20)).map(|i| (i % 251) as u8).collect();
    let chunks: Vec<Result<Vec<u8>>> = content.chunks(1 << 20).map(|c| Ok(c.to_vec())).collect();
    pod.agent()
        .write_file(
            "/workspace/big.bin",
            Box::pin(futures::stream::iter(chunks)),
            WriteOptions::default(),
        )
        .await
        .expect("write");
    // A reader that takes one frame head and goes away while the agent is still sending.
    for _ in 0..3 {
        let mut sock = raw_request(
            &pod,
            serde_json::json!({"op": "read_file", "path": "/workspace/big.bin"}),
        )
        .await;
        let mut prefix = [0u8; 8];
        sock.read_exact(&mut prefix).await.unwrap();
        drop(sock);
    }
    // Every later call is served, with the whole file.
    let again = read_all(
        pod.agent()
            .read_file("/workspace/big.bin", ReadOptions::default())
            .await
            .expect("read"),
    )
    .await;
    assert!(again == content, "the file reads back whole");
    pod.agent().ready().await.expect("still serving");
}
