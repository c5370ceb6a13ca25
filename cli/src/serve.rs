//! `sandcove serve`: the native API, plus one listener per vendor wire protocol asked for.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use sandcove::client::API_KEY_ENV;
use sandcove::server::intercept::SandcoveCa;
use sandcove::server::{self, ConnectionLimits, PolicyBackend, ServerConfig, ServerPolicy};
use sandcove::{Backend, LocalBackend};
use sandcove_compat_support::multipart::UploadBudget;

use crate::record;

// The arguments of `sandcove serve` (its help text is the variant's doc in `main.rs`).
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on. Beyond loopback, serve TLS (--tls-cert, --tls-key).
    #[arg(long, default_value = "127.0.0.1:8730")]
    pub listen: SocketAddr,
    /// A file holding the API key (first line; the file must not be readable by group
    /// or others). Alternative to SANDCOVE_API_KEY.
    #[arg(long, value_name = "PATH")]
    pub api_key_file: Option<PathBuf>,
    /// Refused: a key on the command line is visible to every local user.
    #[arg(long, hide = true, value_name = "KEY")]
    pub api_key: Option<String>,
    /// PEM certificate chain (leaf first): serve HTTPS. Needs --tls-key.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert (mode 0600 or stricter).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// The engine's state directory (default: $SANDCOVE_STATE_DIR, else
    /// $XDG_STATE_HOME/sandcove).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Largest JSON or stdin request body, in bytes.
    #[arg(long, default_value_t = 1024 * 1024)]
    pub max_body_bytes: usize,
    /// Largest file upload, in bytes.
    #[arg(long, default_value_t = 4 * 1024 * 1024 * 1024)]
    pub max_upload_bytes: u64,
    /// Memory all multipart uploads of the vendor listeners may hold at once, in bytes.
    /// Uploads stream into the sandbox; each holds a working set of 2 MiB of this while it
    /// runs, and one that finds it taken for 10 s is refused (429) instead.
    #[arg(long, value_name = "BYTES", default_value_t = sandcove_compat_support::multipart::DEFAULT_UPLOAD_MEMORY)]
    pub upload_memory_bytes: usize,
    /// The engine's largest file in one write, in bytes (1 to 4 GiB); a larger write is
    /// refused with FileTooLarge.
    #[arg(long, default_value_t = sandcove::backend::local::MAX_FILE_BYTES)]
    pub max_file_bytes: u64,
    /// The size quota of each new volume, in MiB (8 to 1048576): a sandbox's write past it
    /// fails with ENOSPC (on Kubernetes, each volume's storage request).
    #[arg(long, value_name = "MIB", default_value_t = sandcove::backend::local::DEFAULT_VOLUME_SIZE_MIB)]
    pub volume_size_mib: u64,
    /// Sandboxes the engine keeps created ahead, in the shapes of its recent creates
    /// (loopback-only or internet, as the vendor listeners create by default), claimed by the
    /// next creates (0 turns the pool off, at most 64). Default: SANDCOVE_WARM_POOL, else 2.
    #[arg(long, value_name = "N")]
    pub warm_pool: Option<usize>,
    #[command(flatten)]
    pub sandbox_bounds: crate::bounds::SandboxBoundArgs,
    /// Connections served at once; more wait until one closes.
    #[arg(long, default_value_t = 512)]
    pub max_connections: usize,
    /// Let clients create sandboxes sharing the host's network (`"network": "host"`):
    /// everything the host can reach, its loopback services and cloud metadata included.
    /// Off by default: such a create is refused (403) on every listener.
    #[arg(long)]
    pub allow_host_network: bool,
    /// Most live sandboxes at once, on every listener together (this server has one API
    /// key, so this is also the bound per key); a create or fork past it is refused (403).
    #[arg(long, value_name = "N", default_value_t = sandcove::server::policy::DEFAULT_MAX_SANDBOXES)]
    pub max_sandboxes: usize,
    /// Milliseconds a client gets for its TLS handshake and each request head, and a
    /// WebSocket that authenticates after opening (Daytona's event socket) for that.
    #[arg(long, default_value_t = 10_000)]
    pub head_timeout_ms: u64,
    /// Milliseconds a request body being read (an upload, stdin) may bring no byte; then
    /// the request fails and its connection is closed.
    #[arg(long, default_value_t = 60_000)]
    pub body_idle_timeout_ms: u64,
    /// Milliseconds a sandbox port may take, after the last byte of a request a listener
    /// forwards to it (E2B's get_host), for the head of its answer; then the client gets
    /// 504. The answer's body is then held to --body-idle-timeout-ms between bytes.
    #[arg(long, default_value_t = 60_000)]
    pub upstream_answer_timeout_ms: u64,
    /// Milliseconds a write to a client that stopped reading (a download, a followed log)
    /// may make no progress; then the connection is cut.
    #[arg(long, default_value_t = 60_000)]
    pub write_stall_timeout_ms: u64,
    /// Also serve E2B's wire protocol (control plane and envd) on this address, for
    /// E2B's official Python and TypeScript SDKs (see `sandcove env e2b`). Same engine,
    /// same API key (sent by the SDKs as X-API-KEY), same TLS settings.
    #[arg(long, value_name = "ADDR")]
    pub e2b: Option<SocketAddr>,
    /// E2B: the image a template name runs (NAME=IMAGE; repeatable), for
    /// `Sandbox.create(template=NAME)`; `base` and `code-interpreter-v1` run the host base
    /// unless mapped. A template that is not mapped names an image directly. Also read from
    /// SANDCOVE_E2B_TEMPLATES (NAME=IMAGE,...) when no flag is given.
    #[arg(long = "e2b-template", value_name = "NAME=IMAGE")]
    pub e2b_templates: Vec<String>,
    /// Also serve Daytona's wire protocol (the `/api` control plane and the toolbox) on
    /// this address, for Daytona's official Python and TypeScript SDKs (see `sandcove env
    /// daytona`). Same engine, same API key (sent by the SDKs as Authorization: Bearer),
    /// same TLS settings.
    #[arg(long, value_name = "ADDR")]
    pub daytona: Option<SocketAddr>,
    /// Also serve Blaxel's wire protocol (the `/v0` control plane and every sandbox's
    /// sandbox API) on this address, for Blaxel's official TypeScript SDK (see `sandcove
    /// env blaxel`). Same engine, same API key (sent by the SDKs as
    /// X-Blaxel-Authorization: Bearer), plain HTTP.
    ///
    /// The same port is an HTTPS proxy for the Python SDK, whose URL is fixed:
    /// `CONNECT api.blaxel.ai:443` (and run.blaxel.ai, api.blaxel.dev, run.blaxel.dev) is
    /// answered with TLS from a local CA that can sign for those four names only, and
    /// served by the same router; any other CONNECT is refused (403). The CA is created
    /// once in <state dir>/blaxel-ca (see `sandcove ca`).
    #[arg(long, value_name = "ADDR")]
    pub blaxel: Option<SocketAddr>,
    /// Where sandboxes run: `local` (the embedded engine on this machine) or `kubernetes`
    /// (one Pod per sandbox in --namespace; the cluster from KUBECONFIG, ~/.kube/config or
    /// the in-cluster service account). See docs/kubernetes.md.
    #[arg(long, value_enum, default_value_t = BackendChoice::Local)]
    pub backend: BackendChoice,
    /// Kubernetes: the namespace sandbox Pods, volume claims and network policies live in.
    #[arg(long, default_value = "sandcove", env = "SANDCOVE_KUBE_NAMESPACE")]
    pub namespace: String,
    /// Kubernetes: the sandbox image, whose entrypoint is `sandcove agent --listen`
    /// (deploy/Containerfile).
    #[arg(long, value_name = "IMAGE", env = "SANDCOVE_KUBE_IMAGE")]
    pub kube_image: Option<String>,
    /// Kubernetes: the runtimeClassName of sandbox Pods (e.g. gvisor or kata) for isolation
    /// stronger than the default container runtime's.
    #[arg(long, value_name = "NAME", env = "SANDCOVE_KUBE_RUNTIME_CLASS")]
    pub runtime_class: Option<String>,
    /// Kubernetes: the agent's TCP port in every sandbox Pod.
    #[arg(long, default_value_t = sandcove::backend::kube::DEFAULT_AGENT_PORT)]
    pub kube_agent_port: u16,
    /// Kubernetes: a file holding the backend key (at least 32 bytes; mode 0600 or stricter)
    /// from which every sandbox's agent token is derived. Alternative to SANDCOVE_KUBE_KEY.
    /// Keep it stable: a server restarted with another key cannot reach existing sandboxes.
    #[arg(long, value_name = "PATH")]
    pub kube_key_file: Option<PathBuf>,
    /// Kubernetes: the API server URL instead of the usual configuration (e.g.
    /// http://127.0.0.1:8001 of `kubectl proxy`).
    #[arg(long, value_name = "URL")]
    pub kube_api_url: Option<String>,
    /// Kubernetes: the longest a sandbox may live, in seconds (its Pod's
    /// activeDeadlineSeconds; no lease may end later).
    #[arg(long, default_value_t = 24 * 3600)]
    pub kube_max_lifetime_secs: u64,
    /// Kubernetes: how this server reaches each sandbox's agent: `pod-ip` (it runs inside
    /// the cluster, the deploy/ setup) or `port-forward` (through the API server's Pod
    /// port-forward, for a server outside the cluster; needs `pods/portforward`).
    #[arg(long, value_enum, default_value_t = KubeReach::PodIp)]
    pub kube_reach: KubeReach,
    /// Kubernetes: the address preview listeners bind. 127.0.0.1 by default (previews
    /// reachable on this machine only); 0.0.0.0 in a cluster where a Service of your own
    /// publishes them.
    #[arg(long, value_name = "IP", default_value = "127.0.0.1")]
    pub kube_preview_bind: std::net::IpAddr,
    /// Kubernetes: the host name preview URLs carry (with each preview's port), when
    /// clients reach this server by a name rather than the bound address.
    #[arg(long, value_name = "HOST")]
    pub kube_preview_host: Option<String>,
}

/// How `sandcove serve --backend kubernetes` reaches sandbox agents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KubeReach {
    /// At each Pod's IP: the server runs inside the cluster.
    PodIp,
    /// Through the API server's Pod port-forward: the server runs outside the cluster.
    PortForward,
}

/// Where `sandcove serve` runs sandboxes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendChoice {
    /// The embedded engine on this machine.
    Local,
    /// Pods of a Kubernetes cluster.
    Kubernetes,
}

/// The environment variable holding the Kubernetes backend key.
pub const KUBE_KEY_ENV: &str = "SANDCOVE_KUBE_KEY";

/// The Kubernetes backend key from `--kube-key-file` or the environment, which is then
/// scrubbed; at least 32 bytes.
fn kube_key(file: Option<PathBuf>) -> Result<Vec<u8>, String> {
    let from_env = std::env::var(KUBE_KEY_ENV).ok();
    std::env::remove_var(KUBE_KEY_ENV);
    let key = match (file, from_env) {
        (Some(_), Some(_)) => {
            return Err(format!(
                "both {KUBE_KEY_ENV} and --kube-key-file are set: choose one"
            ))
        }
        (Some(path), None) => {
            let bytes = server::read_secret_file(&path, true).map_err(|e| e.to_string())?;
            let text = String::from_utf8_lossy(&bytes);
            text.lines()
                .next()
                .unwrap_or_default()
                .trim()
                .as_bytes()
                .to_vec()
        }
        (None, Some(key)) => key.trim().as_bytes().to_vec(),
        (None, None) => Vec::new(),
    };
    if key.len() < sandcove::backend::kube::MIN_KEY_BYTES {
        return Err(format!(
            "the Kubernetes backend needs a key of at least {} bytes in {KUBE_KEY_ENV} or \
             --kube-key-file PATH (e.g. `head -c 32 /dev/urandom | base64`)",
            sandcove::backend::kube::MIN_KEY_BYTES
        ));
    }
    Ok(key)
}

/// The API key from `--api-key-file` or the environment, which is then scrubbed.
fn api_key(file: Option<PathBuf>, on_command_line: bool) -> Result<String, String> {
    // Read (and remove) the variable first, so it never outlives this point whatever else
    // fails. The process is still single-threaded here.
    let from_env = std::env::var(API_KEY_ENV).ok();
    std::env::remove_var(API_KEY_ENV);
    if on_command_line {
        return Err(format!(
            "--api-key is not accepted: the command line is visible to every local user. \
             Set {API_KEY_ENV} or use --api-key-file PATH"
        ));
    }
    let key = match (file, from_env) {
        (Some(_), Some(_)) => {
            return Err(format!(
                "both {API_KEY_ENV} and --api-key-file are set: choose one"
            ))
        }
        (Some(path), None) => {
            let bytes = server::read_secret_file(&path, true).map_err(|e| e.to_string())?;
            let text = String::from_utf8(bytes)
                .map_err(|_| format!("{}: the key is not UTF-8", path.display()))?;
            text.lines().next().unwrap_or_default().trim().to_string()
        }
        (None, Some(key)) => key.trim().to_string(),
        (None, None) => String::new(),
    };
    if key.is_empty() {
        return Err(format!(
            "the API key is empty; set {API_KEY_ENV} or use --api-key-file PATH"
        ));
    }
    Ok(key)
}

/// `sandcove serve`.
pub fn run(args: ServeArgs) -> ExitCode {
    let ServeArgs {
        listen,
        api_key_file,
        api_key: on_command_line,
        tls_cert,
        tls_key,
        state_dir,
        max_body_bytes,
        max_upload_bytes,
        upload_memory_bytes,
        max_file_bytes,
        volume_size_mib,
        warm_pool,
        sandbox_bounds,
        max_connections,
        allow_host_network,
        max_sandboxes,
        head_timeout_ms,
        body_idle_timeout_ms,
        upstream_answer_timeout_ms,
        write_stall_timeout_ms,
        e2b,
        e2b_templates,
        daytona,
        blaxel,
        backend: backend_choice,
        namespace,
        kube_image,
        runtime_class,
        kube_agent_port,
        kube_key_file,
        kube_api_url,
        kube_max_lifetime_secs,
        kube_reach,
        kube_preview_bind,
        kube_preview_host,
    } = args;
    if blaxel.is_some() && (tls_cert.is_some() || tls_key.is_some()) {
        eprintln!(
            "sandcove serve: --blaxel serves plain HTTP only (the SDK's sandbox URLs \
                     point at it); serve it on a loopback address without --tls-cert"
        );
        return ExitCode::from(2);
    }
    let api_key = match api_key(api_key_file, on_command_line.is_some()) {
        Ok(key) => key,
        Err(message) => {
            eprintln!("sandcove serve: {message}");
            return ExitCode::from(2);
        }
    };
    let tls = match (tls_cert, tls_key) {
        (Some(cert), Some(key)) => match server::load_tls(&cert, &key) {
            Ok(tls) => Some(tls),
            Err(e) => {
                eprintln!("sandcove serve: {e}");
                return ExitCode::from(2);
            }
        },
        _ => None,
    };
    for addr in std::iter::once(listen)
        .chain(e2b)
        .chain(daytona)
        .chain(blaxel)
    {
        if tls.is_none() && !addr.ip().is_loopback() {
            eprintln!(
                "sandcove serve: WARNING: plain HTTP on {addr}: the API key crosses the \
                         network in clear text; serve TLS with --tls-cert and --tls-key"
            );
        }
    }
    let state_dir = state_dir.unwrap_or_else(sandcove::backend::local::default_state_dir);
    // The Kubernetes backend's settings, checked before anything starts.
    let kube = match backend_choice {
        BackendChoice::Local => None,
        BackendChoice::Kubernetes => {
            let key = match kube_key(kube_key_file) {
                Ok(key) => key,
                Err(message) => {
                    eprintln!("sandcove serve: {message}");
                    return ExitCode::from(2);
                }
            };
            let Some(image) = kube_image else {
                eprintln!(
                    "sandcove serve: --backend kubernetes needs --kube-image (the sandbox \
                     image, see deploy/Containerfile)"
                );
                return ExitCode::from(2);
            };
            let mut config = sandcove::KubeConfig::new(namespace, image, key);
            config.runtime_class = runtime_class;
            config.agent_port = kube_agent_port;
            config.max_lifetime = Duration::from_secs(kube_max_lifetime_secs.max(1));
            config.max_file_bytes = max_file_bytes;
            config.volume_size_mib = volume_size_mib;
            config.reach = match kube_reach {
                KubeReach::PodIp => sandcove::backend::kube::AgentReach::PodIp,
                KubeReach::PortForward => sandcove::backend::kube::AgentReach::PortForward,
            };
            config.preview_bind = kube_preview_bind;
            config.preview_host = kube_preview_host;
            Some((config, kube_api_url))
        }
    };
    // The embedded engine starts before the async runtime, as it always has.
    let chosen = match kube {
        None => Ok(build_engine(
            &state_dir,
            max_file_bytes,
            volume_size_mib,
            warm_pool,
            &sandbox_bounds,
        )),
        Some(kube) => Err(kube),
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sandcove serve: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let built: sandcove::Result<Arc<dyn Backend>> = match chosen {
        Ok(engine) => engine.map(|e| Arc::new(e) as Arc<dyn Backend>),
        Err((config, url)) => runtime.block_on(async move {
            let backend = match url {
                Some(url) => sandcove::KubeBackend::with_url(&url, config).await?,
                None => sandcove::KubeBackend::connect(config).await?,
            };
            Ok(Arc::new(backend) as Arc<dyn Backend>)
        }),
    };
    let backend: Arc<dyn Backend> = match built {
        Ok(backend) => backend,
        Err(e) => {
            eprintln!("sandcove serve: {e}");
            return ExitCode::FAILURE;
        }
    };
    if max_sandboxes == 0 {
        eprintln!("sandcove serve: --max-sandboxes must be at least 1");
        return ExitCode::from(2);
    }
    // The server's policy, under every listener: the native API and each vendor wire get
    // this one backend, so what a client may ask is decided in one place.
    let mut policy = ServerPolicy::default();
    policy.allow_host_network = allow_host_network;
    policy.max_sandboxes = max_sandboxes;
    let backend: Arc<dyn Backend> = Arc::new(PolicyBackend::new(backend, policy));

    // The Blaxel proxy's CA: created or loaded (file IO, key generation) before the
    // event loop starts.
    let blaxel_ca = match blaxel {
        Some(_) => match SandcoveCa::open(blaxel_ca_dir(&state_dir), BLAXEL_HOSTS) {
            Ok(ca) => Some(ca),
            Err(e) => {
                eprintln!("sandcove serve: the Blaxel proxy's CA: {e}");
                return ExitCode::FAILURE;
            }
        },
        None => None,
    };
    // Blaxel's standby quiet period (SANDCOVE_BLAXEL_STANDBY_MS), as the Rust facade reads
    // it; a bad value stops here rather than being ignored.
    let blaxel_standby = match blaxel::standby::standby_after() {
        Ok(quiet) => quiet,
        Err(e) => {
            eprintln!("sandcove serve: {e}");
            return ExitCode::from(2);
        }
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut config = ServerConfig::new(api_key.clone());
    config.max_body_bytes = max_body_bytes;
    config.max_upload_bytes = max_upload_bytes;
    config.max_connections = max_connections;
    config.head_timeout = Duration::from_millis(head_timeout_ms);
    config.body_idle_timeout = Duration::from_millis(body_idle_timeout_ms);
    config.upstream_answer_timeout = Duration::from_millis(upstream_answer_timeout_ms);
    config.write_stall_timeout = Duration::from_millis(write_stall_timeout_ms);
    config.tls = tls;
    if !e2b_templates.is_empty() {
        match e2b::templates::parse(&e2b_templates.join(",")) {
            Ok(table) => {
                e2b::templates::configure(table);
            }
            Err(e) => {
                eprintln!("sandcove serve: --e2b-template: {e}");
                return ExitCode::from(2);
            }
        }
    }
    // One set of counters for the native API and every vendor listener: one scrape.
    let metrics = config.metrics.clone();
    let limits = ConnectionLimits::from(&config);
    let daytona_key = api_key.clone();
    let blaxel_key = api_key.clone();
    // One budget of upload memory for every vendor listener.
    let upload_memory = UploadBudget::new(upload_memory_bytes);
    let mut wire = e2b::wire::WireConfig::new(api_key);
    wire.max_body_bytes = max_body_bytes;
    wire.max_upload_bytes = max_upload_bytes;
    // Multipart uploads stream as octet-stream ones do: one bound for both.
    wire.max_multipart_bytes = usize::try_from(max_upload_bytes).unwrap_or(usize::MAX);
    wire.upload_memory = upload_memory.clone();
    let result = runtime.block_on(async move {
                let listener = tokio::net::TcpListener::bind(listen).await?;
                let native = listener.local_addr()?;
                let e2b_listener = match e2b {
                    Some(addr) => Some(tokio::net::TcpListener::bind(addr).await?),
                    None => None,
                };
                let daytona_listener = match daytona {
                    Some(addr) => Some(tokio::net::TcpListener::bind(addr).await?),
                    None => None,
                };
                let blaxel_listener = match blaxel {
                    Some(addr) => Some(tokio::net::TcpListener::bind(addr).await?),
                    None => None,
                };
                let mut listeners = record::Listeners {
                    pid: std::process::id(),
                    native: format!("{scheme}://{native}"),
                    e2b: None,
                    daytona: None,
                    blaxel: None,
                };
                // One shutdown signal, fanned out to every listener.
                let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
                let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
                    let _ = rx.wait_for(|s| *s).await;
                };
                let mut tasks = Vec::new();
                if let Some(l) = e2b_listener {
                    let addr = l.local_addr()?;
                    listeners.e2b = Some(format!("{scheme}://{addr}"));
                    let app = server::observe_listener(e2b::wire::router(backend.clone(), wire), "e2b", &metrics);
                    tasks.push(tokio::spawn(server::serve_router(
                        l,
                        app,
                        limits.clone(),
                        stopped(stop_rx.clone()),
                    )));
                }
                if let Some(l) = daytona_listener {
                    let addr = l.local_addr()?;
                    let origin = format!("{scheme}://{addr}");
                    listeners.daytona = Some(origin.clone());
                    let mut config = daytona::wire::WireConfig::new(daytona_key, origin);
                    config.max_body_bytes = max_body_bytes;
                    config.max_upload_bytes = daytona_upload_cap(max_upload_bytes);
                    config.pre_auth_timeout = Duration::from_millis(head_timeout_ms);
                    config.upload_memory = upload_memory.clone();
                    let app = server::observe_listener(daytona::wire::router(backend.clone(), config), "daytona", &metrics);
                    tasks.push(tokio::spawn(server::serve_router(
                        l,
                        app,
                        limits.clone(),
                        stopped(stop_rx.clone()),
                    )));
                }
                if let (Some(l), Some(ca)) = (blaxel_listener, blaxel_ca.clone()) {
                    let addr = l.local_addr()?;
                    // Plain HTTP: the origin of every sandbox's `metadata.url`.
                    let origin = format!("http://{addr}");
                    listeners.blaxel = Some(origin.clone());
                    let mut config = blaxel::wire::WireConfig::new(blaxel_key, origin);
                    config.standby_after = blaxel_standby;
                    config.workspace = BLAXEL_WORKSPACE.to_string();
                    config.max_body_bytes = max_body_bytes;
                    // Uploads stream into the sandbox: the server's limit. A file read into a
                    // JSON answer is held in memory: capped as the Daytona listener's are.
                    config.max_upload_bytes = max_upload_bytes;
                    config.max_inline_file_bytes = daytona_upload_cap(max_upload_bytes);
                    config.upload_memory = upload_memory.clone();
                    let app = server::observe_listener(blaxel::wire::router(backend.clone(), config), "blaxel", &metrics);
                    tasks.push(tokio::spawn(server::serve_router_intercepting(
                        l,
                        app,
                        limits.clone(),
                        ca,
                        stopped(stop_rx.clone()),
                    )));
                }
                // Recorded before announced: whoever reads the announcement finds the record.
                let record = record::write(&state_dir, &listeners)?;
                eprintln!(
                    "sandcove serve: listening on {scheme}://{native} (Ctrl-C to stop; sandboxes outlive the server)"
                );
                if let Some(e2b) = &listeners.e2b {
                    eprintln!("sandcove serve: E2B wire protocol on {e2b}");
                }
                if let Some(daytona) = &listeners.daytona {
                    eprintln!("sandcove serve: Daytona wire protocol on {daytona}");
                }
                if let Some(blaxel) = &listeners.blaxel {
                    eprintln!("sandcove serve: Blaxel wire protocol on {blaxel}");
                    if let Some(ca) = &blaxel_ca {
                        eprintln!(
                            "sandcove serve: Blaxel HTTPS proxy on the same port for {} \
                             (CA bundle {})",
                            ca.hosts().join(", "),
                            ca.bundle_path().display()
                        );
                    }
                }
                let native_task = tokio::spawn(server::serve(
                    listener,
                    backend,
                    config,
                    stopped(stop_rx.clone()),
                ));
                server::shutdown_signal().await;
                let _ = stop_tx.send(true);
                let mut result = native_task
                    .await
                    .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())));
                for task in tasks {
                    let r = task
                        .await
                        .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())));
                    if result.is_ok() {
                        result = r;
                    }
                }
                record::remove(&record);
                result
            });
    match result {
        Ok(()) => {
            eprintln!("sandcove serve: stopped; live sandboxes keep running until their lease ends or they are destroyed");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("sandcove serve: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The embedded engine of `sandcove serve`, with its file bound, volume quota, sandbox
/// bounds and warm pool.
fn build_engine(
    state_dir: &std::path::Path,
    max_file_bytes: u64,
    volume_size_mib: u64,
    warm_pool: Option<usize>,
    bounds: &crate::bounds::SandboxBoundArgs,
) -> sandcove::Result<LocalBackend> {
    LocalBackend::with_state_dir(state_dir)
        .and_then(|engine| engine.with_max_file_bytes(max_file_bytes))
        .and_then(|engine| engine.with_volume_size_mib(volume_size_mib))
        .and_then(|engine| {
            let bounds = bounds.apply(engine.sandbox_bounds());
            engine.with_sandbox_bounds(bounds)
        })
        .map(|engine| {
            let size = warm_pool.unwrap_or_else(|| {
                sandcove::backend::local::warm_pool_size_from_env_or(
                    sandcove::backend::local::SERVER_WARM_POOL,
                )
            });
            engine.with_warm_pool(size)
        })
}

/// The upload and download cap of the Daytona listener (and of the Blaxel listener's files
/// read into JSON answers): the server's upload limit, but never more than 64 MiB, since
/// those downloads are framed in memory (uploads stream).
fn daytona_upload_cap(max_upload_bytes: u64) -> usize {
    usize::try_from(max_upload_bytes.min(64 * 1024 * 1024)).unwrap_or(usize::MAX)
}

/// The workspace name of the Blaxel listener (one server is one workspace).
pub const BLAXEL_WORKSPACE: &str = "sandcove";

/// The hosts Blaxel's SDKs reach over HTTPS, which the Blaxel listener's proxy intercepts
/// and its CA may sign for (and nothing else).
pub const BLAXEL_HOSTS: &[&str] = &[
    "api.blaxel.ai",
    "run.blaxel.ai",
    "api.blaxel.dev",
    "run.blaxel.dev",
];

/// Where the Blaxel proxy's CA and bundle live.
pub fn blaxel_ca_dir(state_dir: &std::path::Path) -> PathBuf {
    state_dir.join("blaxel-ca")
}
