//! A fake Kubernetes API server for the Kubernetes backend's tests: a small in-process HTTP
//! server implementing what `KubeBackend` calls (Pods: create, get, list with a label
//! selector, replace, delete, watch; PersistentVolumeClaims; NetworkPolicies), plus a fake
//! kubelet. No cluster is needed; every layer but the kubelet is real.
//!
//! The kubelet "schedules" a Pod by re-executing the test binary as an in-pod agent
//! (`__SANDCOVE_ROLE=pod-agent`) with the Pod's environment, listening on a loopback address
//! of its own (127.x.y.z: all of 127/8 is loopback on Linux, so every Pod uses the same agent
//! port, as Pods do on their own IPs), with a scratch directory standing for the container's
//! root. It reports that address as the Pod IP and marks the Pod Ready once the agent prints
//! its `listening on` line. Deleting a Pod ends exactly that agent and the processes it
//! started (the process tree under its pid, frozen then killed, as a container's teardown
//! would), then removes the object.
//!
//! A Pod's `portforward` subresource is served too, as the API server and kubelet serve it:
//! a WebSocket of subprotocol `v4.channel.k8s.io` whose first port has channel 0 for data
//! and channel 1 for errors, each channel's first frame the port number (little-endian),
//! every frame prefixed by its channel byte; the fake connects it to the Pod IP's port.
//!
//! Every request is recorded (method, path, query, body) so tests can assert the exact
//! requests sent; the next request matching a method and path fragment can be made to fail
//! with a given status.

use std::collections::{BTreeMap, HashMap};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tokio::io::AsyncBufReadExt;
use tokio::sync::broadcast;

/// One request as the fake saw it.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// HTTP method.
    pub method: String,
    /// Path, without the query.
    pub path: String,
    /// Query parameters, decoded.
    pub query: BTreeMap<String, String>,
    /// The JSON body, if any.
    pub body: Option<Value>,
}

/// A failure to inject: the next request with `method` whose path contains `path` gets
/// `code` with `reason`.
#[derive(Debug, Clone)]
struct Fault {
    method: String,
    path: String,
    code: u16,
    reason: String,
}

#[derive(Default)]
struct Store {
    version: u64,
    pods: BTreeMap<String, Value>,
    claims: BTreeMap<String, Value>,
    policies: BTreeMap<String, Value>,
    /// Every Pod event so far: (resourceVersion, type, object).
    events: Vec<(u64, String, Value)>,
    /// The agent process of each scheduled Pod, by Pod name.
    agents: HashMap<String, tokio::process::Child>,
}

struct State {
    store: Mutex<Store>,
    events: broadcast::Sender<(u64, String, Value)>,
    requests: Mutex<Vec<Recorded>>,
    faults: Mutex<Vec<Fault>>,
    /// When set, Pods are never scheduled (they stay Pending).
    unschedulable: Mutex<bool>,
    agent_port: u16,
    scratch: Scratch,
}

/// The image of the sandbox Pods the tests configure (`KubeConfig::new`'s).
pub const SANDBOX_IMAGE: &str = "sandcove:test";

/// A running fake API server and kubelet. Dropping it kills every agent it started.
pub struct FakeCluster {
    state: Arc<State>,
    /// The API server's base URL (`http://127.0.0.1:PORT`).
    pub url: String,
    /// The agent port every Pod listens on.
    pub agent_port: u16,
}

/// Where the fake's Pods get their filesystems: `<temp>/<prefix>-<pod>`, one directory per
/// Pod, made when it is scheduled and removed when it is deleted (so no directory of the
/// fake's outlives a run whose sandboxes were all destroyed, even a shared fake's, which is
/// never dropped). A dropped fake removes what its Pods left.
#[derive(Debug)]
struct Scratch {
    /// `sandcove-fake-kube-<pid>-<random>`.
    prefix: String,
}

impl Scratch {
    /// The filesystem of Pod `name`.
    fn pod_root(&self, name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("{}-{name}", self.prefix))
    }

    /// Remove every Pod directory left.
    fn remove_all(&self) {
        let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
            return;
        };
        let prefix = format!("{}-", self.prefix);
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
}

impl Drop for FakeCluster {
    fn drop(&mut self) {
        let names: Vec<String> = {
            let store = self.state.store.lock().unwrap();
            store.agents.keys().cloned().collect()
        };
        for name in names {
            let child = self.state.store.lock().unwrap().agents.remove(&name);
            if let Some(child) = child {
                kill_tree(child);
            }
        }
        self.state.scratch.remove_all();
    }
}

/// Remove the Pod directories of earlier test programs that have ended (a Pod of a failed
/// test may never have been deleted).
fn remove_stale_scratch() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix("sandcove-fake-kube-") else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// The uid test Pods run as: 1000 when the tests run as root (the fake kubelet then runs
/// each agent as that user, as `runAsUser` says), else the test's own uid (a rootless kubelet
/// can run nothing else).
pub fn pod_uid() -> i64 {
    let me = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").unwrap());
    if me == 0 {
        1000
    } else {
        i64::from(me)
    }
}

static NEXT_POD: AtomicU32 = AtomicU32::new(1);

/// A loopback address of its own for the next Pod: 127.N.x.y with N from this process's id,
/// so two test programs running at once do not hand out the same addresses.
fn next_pod_ip() -> Ipv4Addr {
    let n = NEXT_POD.fetch_add(1, Ordering::Relaxed);
    let second = 100 + (std::process::id() % 100) as u8;
    Ipv4Addr::new(127, second, (n >> 8) as u8, (n & 0xff) as u8)
}

impl FakeCluster {
    /// Start a fake API server on 127.0.0.1 and its kubelet, on a runtime of their own (so
    /// they outlive the test that started them when shared, see [`FakeCluster::shared`]).
    pub fn start() -> FakeCluster {
        remove_stale_scratch();
        let scratch = Scratch {
            prefix: format!(
                "sandcove-fake-kube-{}-{}",
                std::process::id(),
                sandcove::random_id(8)
            ),
        };
        let agent_port = {
            let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("probe port");
            probe.local_addr().unwrap().port()
        };
        let (events, _) = broadcast::channel(4096);
        let state = Arc::new(State {
            store: Mutex::new(Store::default()),
            events,
            requests: Mutex::new(Vec::new()),
            faults: Mutex::new(Vec::new()),
            unschedulable: Mutex::new(false),
            agent_port,
            scratch,
        });
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the fake API");
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let served = state.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("the fake's runtime");
            runtime.block_on(async move {
                let app = axum::Router::new().fallback(move |request: axum::extract::Request| {
                    let state = served.clone();
                    async move {
                        let (parts, body) = request.into_parts();
                        match axum::body::to_bytes(body, 64 << 20).await {
                            Ok(body) => handle(state, parts, body).await,
                            Err(e) => status(400, "BadRequest", &format!("body: {e}")),
                        }
                    }
                });
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let _ = axum::serve(listener, app).await;
            });
        });
        FakeCluster {
            state,
            url: format!("http://{addr}"),
            agent_port,
        }
    }

    /// One fake shared by every test of this program (never dropped: its agents die with
    /// the program, see `schedule`).
    pub fn shared() -> &'static FakeCluster {
        static SHARED: std::sync::OnceLock<FakeCluster> = std::sync::OnceLock::new();
        SHARED.get_or_init(FakeCluster::start)
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.state.requests.lock().unwrap().clone()
    }

    /// Make the next `method` request whose path contains `path` fail with `code`/`reason`.
    pub fn fail_next(&self, method: &str, path: &str, code: u16, reason: &str) {
        self.state.faults.lock().unwrap().push(Fault {
            method: method.into(),
            path: path.into(),
            code,
            reason: reason.into(),
        });
    }

    /// Stop scheduling Pods (new ones stay Pending, never Ready).
    pub fn set_unschedulable(&self, on: bool) {
        *self.state.unschedulable.lock().unwrap() = on;
    }

    /// The stored Pod named `name`.
    pub fn pod(&self, name: &str) -> Option<Value> {
        self.state.store.lock().unwrap().pods.get(name).cloned()
    }

    /// Names of every stored Pod.
    pub fn pod_names(&self) -> Vec<String> {
        self.state
            .store
            .lock()
            .unwrap()
            .pods
            .keys()
            .cloned()
            .collect()
    }

    /// Delete Pod `name` behind the backend's back (as `kubectl delete pod` would).
    pub async fn delete_pod(&self, name: &str) -> bool {
        delete_pod(&self.state, name, 0).is_some()
    }
}

fn status(code: u16, reason: &str, message: &str) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code,
    });
    (
        StatusCode::from_u16(code).unwrap(),
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn ok(value: &Value) -> Response {
    (
        StatusCode::OK,
        [("content-type", "application/json")],
        value.to_string(),
    )
        .into_response()
}

fn created(value: &Value) -> Response {
    (
        StatusCode::CREATED,
        [("content-type", "application/json")],
        value.to_string(),
    )
        .into_response()
}

fn parse_query(uri: &axum::http::Uri) -> BTreeMap<String, String> {
    uri.query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            let decode = |s: &str| {
                percent_encoding::percent_decode_str(&s.replace('+', " "))
                    .decode_utf8_lossy()
                    .into_owned()
            };
            (decode(k), decode(v))
        })
        .collect()
}

/// Whether `object`'s labels satisfy an equality selector `k=v,k2=v2`.
fn selects(selector: Option<&String>, object: &Value) -> bool {
    let Some(selector) = selector.filter(|s| !s.is_empty()) else {
        return true;
    };
    let labels = &object["metadata"]["labels"];
    selector.split(',').all(|term| match term.split_once('=') {
        Some((k, v)) => labels[k].as_str() == Some(v),
        None => !labels[term].is_null(),
    })
}

/// Whether `object` satisfies a field selector (only `metadata.name=` is supported).
fn fields_select(selector: Option<&String>, object: &Value) -> bool {
    let Some(selector) = selector.filter(|s| !s.is_empty()) else {
        return true;
    };
    selector.split(',').all(|term| match term.split_once('=') {
        Some(("metadata.name", name)) => object["metadata"]["name"].as_str() == Some(name),
        _ => false,
    })
}

fn now_rfc3339() -> String {
    // Seconds are enough for the client; the format is what matters.
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let days = secs / 86400;
    let rem = secs % 86400;
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to a civil date (proleptic Gregorian).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Store a Pod event and publish it.
fn emit(state: &State, store: &mut Store, kind: &str, object: Value) {
    let version = store.version;
    store
        .events
        .push((version, kind.to_string(), object.clone()));
    let _ = state.events.send((version, kind.to_string(), object));
}

fn bump(store: &mut Store, object: &mut Value) {
    store.version += 1;
    object["metadata"]["resourceVersion"] = json!(store.version.to_string());
}

async fn handle(state: Arc<State>, parts: Parts, body: Bytes) -> Response {
    let (method, uri) = (parts.method.clone(), parts.uri.clone());
    let path = uri.path().to_string();
    let query = parse_query(&uri);
    let body_json: Option<Value> = if body.is_empty() {
        None
    } else {
        match serde_json::from_slice(&body) {
            Ok(v) => Some(v),
            Err(e) => return status(400, "BadRequest", &format!("body: {e}")),
        }
    };
    state.requests.lock().unwrap().push(Recorded {
        method: method.to_string(),
        path: path.clone(),
        query: query.clone(),
        body: body_json.clone(),
    });
    {
        let mut faults = state.faults.lock().unwrap();
        if let Some(i) = faults
            .iter()
            .position(|f| f.method == method.as_str() && path.contains(&f.path))
        {
            let f = faults.remove(i);
            return status(
                f.code,
                &f.reason,
                &format!("injected {} {}", f.code, f.reason),
            );
        }
    }
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    if let ["api", "v1", "namespaces", _, "pods", name, "portforward"] = segments.as_slice() {
        return portforward(&state, name, &query, parts);
    }
    // /api/v1/namespaces/NS/KIND[/NAME] or /apis/networking.k8s.io/v1/namespaces/NS/KIND[/NAME]
    let (kind, name) = match segments.as_slice() {
        ["api", "v1", "namespaces", _, kind] => (*kind, None),
        ["api", "v1", "namespaces", _, kind, name] => (*kind, Some(name.to_string())),
        ["apis", "networking.k8s.io", "v1", "namespaces", _, kind] => (*kind, None),
        ["apis", "networking.k8s.io", "v1", "namespaces", _, kind, name] => {
            (*kind, Some(name.to_string()))
        }
        _ => return status(404, "NotFound", &format!("no route {path}")),
    };
    match (kind, method.as_str(), name) {
        ("pods", "GET", None) if query.get("watch").map(String::as_str) == Some("true") => {
            watch_pods(state, query)
        }
        ("pods", "GET", None) => list(&state, "pods", "PodList", &query),
        ("pods", "POST", None) => create_pod(&state, body_json.unwrap_or_default()),
        ("pods", "GET", Some(name)) => get(&state, "pods", &name),
        ("pods", "PUT", Some(name)) => replace_pod(&state, &name, body_json.unwrap_or_default()),
        ("pods", "DELETE", Some(name)) => {
            let grace = body_json
                .as_ref()
                .and_then(|b| b["gracePeriodSeconds"].as_u64())
                .unwrap_or(30);
            match delete_pod(&state, &name, grace) {
                Some(pod) => ok(&pod),
                None => status(404, "NotFound", &format!("pods \"{name}\" not found")),
            }
        }
        ("persistentvolumeclaims", "GET", None) => list(
            &state,
            "persistentvolumeclaims",
            "PersistentVolumeClaimList",
            &query,
        ),
        ("persistentvolumeclaims", "POST", None) => simple_create(
            &state,
            "persistentvolumeclaims",
            body_json.unwrap_or_default(),
        ),
        ("persistentvolumeclaims", "GET", Some(name)) => {
            get(&state, "persistentvolumeclaims", &name)
        }
        ("persistentvolumeclaims", "DELETE", Some(name)) => {
            let mut store = state.store.lock().unwrap();
            match store.claims.remove(&name) {
                Some(claim) => ok(&claim),
                None => status(404, "NotFound", &format!("claim \"{name}\" not found")),
            }
        }
        ("networkpolicies", "GET", None) => {
            list(&state, "networkpolicies", "NetworkPolicyList", &query)
        }
        ("networkpolicies", "POST", None) => {
            simple_create(&state, "networkpolicies", body_json.unwrap_or_default())
        }
        ("networkpolicies", "GET", Some(name)) => get(&state, "networkpolicies", &name),
        _ => status(405, "MethodNotAllowed", &format!("{method} {path}")),
    }
}

fn collection<'a>(store: &'a mut Store, kind: &str) -> &'a mut BTreeMap<String, Value> {
    match kind {
        "pods" => &mut store.pods,
        "persistentvolumeclaims" => &mut store.claims,
        _ => &mut store.policies,
    }
}

fn list(state: &State, kind: &str, list_kind: &str, query: &BTreeMap<String, String>) -> Response {
    let mut store = state.store.lock().unwrap();
    let version = store.version;
    let items: Vec<Value> = collection(&mut store, kind)
        .values()
        .filter(|o| selects(query.get("labelSelector"), o))
        .filter(|o| fields_select(query.get("fieldSelector"), o))
        .cloned()
        .collect();
    ok(&json!({
        "kind": list_kind, "apiVersion": "v1",
        "metadata": {"resourceVersion": version.to_string()},
        "items": items,
    }))
}

fn get(state: &State, kind: &str, name: &str) -> Response {
    let mut store = state.store.lock().unwrap();
    match collection(&mut store, kind).get(name) {
        Some(o) => ok(o),
        None => status(404, "NotFound", &format!("{kind} \"{name}\" not found")),
    }
}

fn stamp(store: &mut Store, object: &mut Value) {
    object["metadata"]["uid"] = json!(sandcove::random_id(16));
    object["metadata"]["creationTimestamp"] = json!(now_rfc3339());
    bump(store, object);
}

fn simple_create(state: &State, kind: &str, mut object: Value) -> Response {
    let Some(name) = object["metadata"]["name"].as_str().map(str::to_string) else {
        return status(422, "Invalid", "metadata.name is required");
    };
    let mut store = state.store.lock().unwrap();
    if collection(&mut store, kind).contains_key(&name) {
        return status(
            409,
            "AlreadyExists",
            &format!("{kind} \"{name}\" already exists"),
        );
    }
    stamp(&mut store, &mut object);
    collection(&mut store, kind).insert(name, object.clone());
    created(&object)
}

fn create_pod(state: &Arc<State>, mut pod: Value) -> Response {
    let Some(name) = pod["metadata"]["name"].as_str().map(str::to_string) else {
        return status(422, "Invalid", "metadata.name is required");
    };
    if pod["spec"]["containers"]
        .as_array()
        .is_none_or(|c| c.len() != 1)
    {
        return status(
            422,
            "Invalid",
            "the fake runs Pods of exactly one container",
        );
    }
    let mut store = state.store.lock().unwrap();
    if store.pods.contains_key(&name) {
        return status(
            409,
            "AlreadyExists",
            &format!("pods \"{name}\" already exists"),
        );
    }
    stamp(&mut store, &mut pod);
    pod["status"] = json!({"phase": "Pending"});
    store.pods.insert(name.clone(), pod.clone());
    emit(state, &mut store, "ADDED", pod.clone());
    drop(store);
    if !*state.unschedulable.lock().unwrap() {
        schedule(state.clone(), name, pod.clone());
    }
    created(&pod)
}

/// The fake kubelet: start the Pod's agent and report it Ready once it listens.
fn schedule(state: Arc<State>, name: String, pod: Value) {
    let ip = next_pod_ip();
    let root = state.scratch.pod_root(&name);
    let container = &pod["spec"]["containers"][0];
    // Images: the sandbox image (what an init container brings the agent from) and those
    // named `pullable/…` can be pulled; any other waits in ErrImagePull, as a kubelet whose
    // registry lacks it. (The agent runs from this host either way: the fake has no images.)
    let pullable = |image: &str| image == SANDBOX_IMAGE || image.starts_with("pullable/");
    let images = pod["spec"]["initContainers"]
        .as_array()
        .into_iter()
        .flatten()
        .chain(std::iter::once(container))
        .filter_map(|c| Some((c["name"].as_str()?, c["image"].as_str()?)))
        .collect::<Vec<_>>();
    if let Some((container_name, image)) = images.iter().find(|(_, image)| !pullable(image)) {
        let mut store = state.store.lock().unwrap();
        let Some(mut pod) = store.pods.get(&name).cloned() else {
            return;
        };
        pod["status"] = json!({
            "phase": "Pending",
            "containerStatuses": [{
                "name": container_name, "image": image, "imageID": "", "ready": false,
                "restartCount": 0,
                "state": {"waiting": {
                    "reason": "ErrImagePull",
                    "message": format!("rpc error: {image}: not found (fake kubelet)"),
                }},
            }],
        });
        bump(&mut store, &mut pod);
        store.pods.insert(name.clone(), pod.clone());
        emit(&state, &mut store, "MODIFIED", pod);
        return;
    }
    let context = |key: &str| {
        container["securityContext"][key]
            .as_u64()
            .or(pod["spec"]["securityContext"][key].as_u64())
    };
    let non_root = container["securityContext"]["runAsNonRoot"].as_bool() == Some(true)
        || pod["spec"]["securityContext"]["runAsNonRoot"].as_bool() == Some(true);
    let me = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").unwrap());
    let uid = context("runAsUser").unwrap_or(u64::from(me)) as u32;
    let gid = context("runAsGroup").unwrap_or(u64::from(uid)) as u32;
    if uid == 0 && non_root {
        set_failed(
            &state,
            &name,
            "container has runAsNonRoot and image will run as root",
        );
        return;
    }
    if me != 0 && uid != me {
        set_failed(
            &state,
            &name,
            &format!("the fake kubelet (uid {me}) can only run Pods as its own uid, not {uid}"),
        );
        return;
    }
    // The container's filesystem: its root and every mount point (emptyDirs), owned by the
    // Pod's user as fsGroup would make them.
    let mut dirs = vec![root.clone()];
    for mount in container["volumeMounts"]
        .as_array()
        .cloned()
        .unwrap_or_default()
    {
        if let Some(path) = mount["mountPath"].as_str() {
            dirs.push(root.join(path.trim_start_matches('/')));
        }
    }
    for dir in &dirs {
        if let Err(e) = std::fs::create_dir_all(dir) {
            panic!("pod directory {}: {e}", dir.display());
        }
        if me == 0 {
            std::os::unix::fs::chown(dir, Some(uid), Some(gid)).expect("chown a pod directory");
        }
    }
    let mut command = tokio::process::Command::new(std::env::current_exe().expect("test binary"));
    command.env_clear();
    if let Ok(path) = std::env::var("PATH") {
        command.env("PATH", path);
    }
    for var in pod["spec"]["containers"][0]["env"]
        .as_array()
        .cloned()
        .unwrap_or_default()
    {
        if let (Some(k), Some(v)) = (var["name"].as_str(), var["value"].as_str()) {
            command.env(k, v);
        }
    }
    // The Pod's own network namespace and filesystem, as far as a test can stand them in.
    command
        .env("__SANDCOVE_ROLE", "pod-agent")
        .env(
            "SANDCOVE_AGENT_LISTEN",
            SocketAddr::from((ip, state.agent_port)).to_string(),
        )
        .env("SANDCOVE_AGENT_ROOT", &root)
        .uid(uid)
        .gid(gid)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true);
    // SAFETY: prctl(2) only, async-signal-safe, between fork and exec: the agent dies with the
    // thread of the fake that started it (a worker living as long as the fake's runtime), so
    // nothing outlives the test program.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            set_failed(&state, &name, &format!("cannot start the agent: {e}"));
            return;
        }
    };
    let stdout = child.stdout.take().expect("piped stdout");
    state
        .store
        .lock()
        .unwrap()
        .agents
        .insert(name.clone(), child);
    tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        loop {
            match lines.next_line().await {
                Ok(Some(line)) if line.starts_with("listening on ") => {
                    let mut store = state.store.lock().unwrap();
                    let Some(mut pod) = store.pods.get(&name).cloned() else {
                        return;
                    };
                    if !pod["metadata"]["deletionTimestamp"].is_null() {
                        return;
                    }
                    pod["status"] = json!({
                        "phase": "Running",
                        "podIP": ip.to_string(),
                        "podIPs": [{"ip": ip.to_string()}],
                        "conditions": [
                            {"type": "Ready", "status": "True"},
                            {"type": "ContainersReady", "status": "True"},
                        ],
                    });
                    bump(&mut store, &mut pod);
                    store.pods.insert(name.clone(), pod.clone());
                    emit(&state, &mut store, "MODIFIED", pod);
                    break;
                }
                Ok(Some(_)) => continue,
                _ => {
                    set_failed(&state, &name, "the agent exited before listening");
                    return;
                }
            }
        }
        // Keep draining, so the agent never blocks on a full pipe.
        while let Ok(Some(_)) = lines.next_line().await {}
    });
}

fn set_failed(state: &State, name: &str, message: &str) {
    let mut store = state.store.lock().unwrap();
    let Some(mut pod) = store.pods.get(name).cloned() else {
        return;
    };
    pod["status"] = json!({"phase": "Failed", "message": message});
    bump(&mut store, &mut pod);
    store.pods.insert(name.to_string(), pod.clone());
    emit(state, &mut store, "MODIFIED", pod);
}

fn replace_pod(state: &State, name: &str, mut pod: Value) -> Response {
    let mut store = state.store.lock().unwrap();
    let Some(current) = store.pods.get(name).cloned() else {
        return status(404, "NotFound", &format!("pods \"{name}\" not found"));
    };
    if pod["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"] {
        return status(
            409,
            "Conflict",
            "the object has been modified; please apply your changes to the latest version",
        );
    }
    if pod["spec"] != current["spec"] {
        return status(422, "Invalid", "pod updates may not change the spec (fake)");
    }
    // Status is not written through the main resource.
    pod["status"] = current["status"].clone();
    for key in ["uid", "creationTimestamp", "deletionTimestamp"] {
        pod["metadata"][key] = current["metadata"][key].clone();
    }
    bump(&mut store, &mut pod);
    store.pods.insert(name.to_string(), pod.clone());
    emit(state, &mut store, "MODIFIED", pod.clone());
    ok(&pod)
}

/// Mark Pod `name` deleting, end its agent, then remove it; returns the Pod as marked.
fn delete_pod(state: &Arc<State>, name: &str, grace: u64) -> Option<Value> {
    let mut store = state.store.lock().unwrap();
    let mut pod = store.pods.get(name).cloned()?;
    if pod["metadata"]["deletionTimestamp"].is_null() {
        pod["metadata"]["deletionTimestamp"] = json!(now_rfc3339());
        pod["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
        bump(&mut store, &mut pod);
        store.pods.insert(name.to_string(), pod.clone());
        emit(state, &mut store, "MODIFIED", pod.clone());
    }
    let child = store.agents.remove(name);
    drop(store);
    let state = state.clone();
    let name = name.to_string();
    tokio::spawn(async move {
        if let Some(child) = child {
            tokio::task::spawn_blocking(move || kill_tree(child))
                .await
                .expect("kill task");
        }
        let mut store = state.store.lock().unwrap();
        if let Some(mut pod) = store.pods.remove(&name) {
            bump(&mut store, &mut pod);
            emit(&state, &mut store, "DELETED", pod);
        }
        let _ = std::fs::remove_dir_all(state.scratch.pod_root(&name));
    });
    Some(pod)
}

/// The pids of `pid`'s children (every thread's).
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for task in tasks.flatten() {
        if let Ok(text) = std::fs::read_to_string(task.path().join("children")) {
            out.extend(
                text.split_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok()),
            );
        }
    }
    out
}

/// End an agent and every process under it, as a container's teardown would: freeze the
/// tree from the agent down until no new process appears, then kill every frozen pid. Only
/// the exact pids found under the agent are signalled.
fn kill_tree(mut child: tokio::process::Child) {
    let Some(root) = child.id() else {
        return;
    };
    let mut frozen: Vec<u32> = Vec::new();
    loop {
        let mut found = false;
        let mut queue = vec![root];
        while let Some(pid) = queue.pop() {
            if !frozen.contains(&pid) {
                // SAFETY: kill(2) with a pid found under our own child and a valid signal.
                unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
                frozen.push(pid);
                found = true;
            }
            queue.extend(children(pid));
        }
        if !found {
            break;
        }
    }
    for pid in frozen.iter().rev() {
        // SAFETY: as above; SIGKILL ends even a stopped process.
        unsafe { libc::kill(*pid as i32, libc::SIGKILL) };
    }
    // Reap the agent itself; its children are reparented and reaped by init.
    let _ = child.start_kill();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A watch: replay the stored events after the requested version, then live ones, filtered,
/// as JSON lines, until the requested timeout.
fn watch_pods(state: Arc<State>, query: BTreeMap<String, String>) -> Response {
    let from: u64 = query
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let timeout = query
        .get("timeoutSeconds")
        .and_then(|v| v.parse().ok())
        .unwrap_or(290u64);
    let (backlog, mut live) = {
        let store = state.store.lock().unwrap();
        let live = state.events.subscribe();
        let backlog: Vec<(u64, String, Value)> = if from == 0 {
            store
                .pods
                .values()
                .map(|p| (store.version, "ADDED".to_string(), p.clone()))
                .collect()
        } else {
            store
                .events
                .iter()
                .filter(|(v, _, _)| *v > from)
                .cloned()
                .collect()
        };
        (backlog, live)
    };
    let labels = query.get("labelSelector").cloned();
    let fields = query.get("fieldSelector").cloned();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(64);
    tokio::spawn(async move {
        let mut last = from;
        let wanted = |object: &Value| {
            selects(labels.as_ref(), object) && fields_select(fields.as_ref(), object)
        };
        for (version, kind, object) in backlog {
            last = last.max(version);
            if wanted(&object) {
                let line = format!("{}\n", json!({"type": kind, "object": object}));
                if tx.send(Ok(Bytes::from(line))).await.is_err() {
                    return;
                }
            }
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout);
        loop {
            let event = tokio::select! {
                _ = tokio::time::sleep_until(deadline) => return,
                _ = tx.closed() => return,
                event = live.recv() => event,
            };
            let (version, kind, object) = match event {
                Ok(event) => event,
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    let line = json!({"type": "ERROR", "object": {
                        "kind": "Status", "apiVersion": "v1", "metadata": {},
                        "status": "Failure", "reason": "Expired", "code": 410,
                        "message": "too old resource version"}});
                    let _ = tx.send(Ok(Bytes::from(format!("{line}\n")))).await;
                    return;
                }
                Err(_) => return,
            };
            if version <= last || !wanted(&object) {
                continue;
            }
            last = version;
            let line = format!("{}\n", json!({"type": kind, "object": object}));
            if tx.send(Ok(Bytes::from(line))).await.is_err() {
                return;
            }
        }
    });
    let body = Body::from_stream(tokio_stream_from(rx));
    (StatusCode::OK, [("content-type", "application/json")], body).into_response()
}

fn tokio_stream_from(
    mut rx: tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// The subprotocol of a port-forward WebSocket.
const PORT_FORWARD_PROTOCOL: &str = "v4.channel.k8s.io";

/// A Pod's `portforward` subresource: upgrade to a WebSocket and connect it to the port at
/// the Pod's IP. One port per request (what the backend asks for).
fn portforward(
    state: &Arc<State>,
    name: &str,
    query: &BTreeMap<String, String>,
    parts: Parts,
) -> Response {
    let ports: Vec<&str> = query
        .get("ports")
        .map(|p| p.split(',').collect())
        .unwrap_or_default();
    let [port] = ports.as_slice() else {
        return status(400, "BadRequest", "the fake forwards exactly one port");
    };
    let Ok(port) = port.parse::<u16>() else {
        return status(400, "BadRequest", &format!("bad port {port:?}"));
    };
    let ip = {
        let store = state.store.lock().unwrap();
        let Some(pod) = store.pods.get(name) else {
            return status(404, "NotFound", &format!("pods \"{name}\" not found"));
        };
        match pod["status"]["podIP"].as_str().map(str::parse::<Ipv4Addr>) {
            Some(Ok(ip)) => ip,
            _ => return status(400, "BadRequest", "the pod is not running"),
        }
    };
    let header = |n: &str| {
        parts
            .headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let Some(key) = header("sec-websocket-key") else {
        return status(400, "BadRequest", "not a WebSocket upgrade");
    };
    let offered = header("sec-websocket-protocol").unwrap_or_default();
    if !offered
        .split(',')
        .any(|p| p.trim() == PORT_FORWARD_PROTOCOL)
    {
        return status(400, "BadRequest", "the v4 channel subprotocol is required");
    }
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    let upgrade = hyper::upgrade::on(axum::http::Request::from_parts(parts, ()));
    let target = SocketAddr::from((ip, port));
    tokio::spawn(async move {
        let Ok(upgraded) = upgrade.await else {
            return;
        };
        let socket = tokio_tungstenite::WebSocketStream::from_raw_socket(
            hyper_util::rt::TokioIo::new(upgraded),
            tokio_tungstenite::tungstenite::protocol::Role::Server,
            None,
        )
        .await;
        forward_port(socket, target).await;
    });
    axum::http::Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header("upgrade", "websocket")
        .header("connection", "Upgrade")
        .header("sec-websocket-accept", accept)
        .header("sec-websocket-protocol", PORT_FORWARD_PROTOCOL)
        .body(Body::empty())
        .unwrap()
}

/// Carry one forwarded port: announce it on both channels, connect to `target`, then copy
/// data frames (channel 0) both ways until either side ends. A failed connection is
/// reported on the error channel (1), as the kubelet reports it.
async fn forward_port<S>(socket: tokio_tungstenite::WebSocketStream<S>, target: SocketAddr)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use futures::{SinkExt, StreamExt};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_tungstenite::tungstenite::Message;
    let (mut sink, mut frames) = socket.split();
    let [lo, hi] = target.port().to_le_bytes();
    for channel in [0u8, 1] {
        if sink
            .send(Message::binary(vec![channel, lo, hi]))
            .await
            .is_err()
        {
            return;
        }
    }
    let tcp = match tokio::net::TcpStream::connect(target).await {
        Ok(tcp) => tcp,
        Err(e) => {
            let mut message = vec![1u8];
            message.extend(format!("error forwarding port {}: {e}", target.port()).bytes());
            let _ = sink.send(Message::binary(message)).await;
            let _ = sink.send(Message::Close(None)).await;
            return;
        }
    };
    let (mut from_pod, mut to_pod) = tcp.into_split();
    // Ends when the client goes away. A write the Pod refuses (it answered and closed, e.g.
    // an upload over its bound) does not end it: the answer still flows out, and what the
    // client still sends is read and dropped.
    let inbound = async {
        let mut open = true;
        while let Some(Ok(message)) = frames.next().await {
            match message {
                Message::Binary(data) if open && data.len() > 1 && data[0] == 0 => {
                    open = to_pod.write_all(&data[1..]).await.is_ok();
                }
                Message::Close(_) => return,
                _ => {}
            }
        }
    };
    let outbound = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match from_pod.read(&mut buf[1..]).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            buf[0] = 0;
            if sink
                .send(Message::binary(buf[..=n].to_vec()))
                .await
                .is_err()
            {
                return;
            }
        }
        let _ = sink.send(Message::Close(None)).await;
    };
    tokio::select! {
        _ = inbound => {}
        _ = outbound => {}
    }
}
