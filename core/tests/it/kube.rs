//! The Kubernetes backend against a fake API server (`kube_fake`): the requests it sends on
//! the wire, the watch edge cases (a Pod that never becomes Ready, a Pod deleted behind the
//! backend's back), API errors mapped to the core codes, leases and tokens surviving a
//! restarted server, previews served by the backend's process, and agents reached through
//! the API server's port-forward. No real cluster is involved.

use crate::kube_fake;

use std::collections::BTreeMap;
use std::time::Duration;

use crate::kube_fake::FakeCluster;
use sandcove::backend::kube::AgentReach;
use sandcove::{
    AnnotationUpdate, Backend, Command, ErrorCode, KubeBackend, KubeConfig, ListOptions,
    PreviewOptions, ProcessSpec,
};
use sandcove_conformance::{eventually, holds, http_get, test_options, unique, PATIENCE};

const KEY: [u8; 32] = [7; 32];

fn config(fake: &FakeCluster) -> KubeConfig {
    let mut config = KubeConfig::new("sandcove-test", "sandcove:test", KEY.to_vec());
    config.agent_port = fake.agent_port;
    config.uid = kube_fake::pod_uid();
    config.isolated = false;
    config.volumes = true;
    config.grace = Duration::from_secs(1);
    config.ready_timeout = Duration::from_secs(60);
    config
}

async fn backend(fake: &FakeCluster) -> KubeBackend {
    KubeBackend::with_url(&fake.url, config(fake))
        .await
        .expect("backend")
}

fn pod_name(id: &str) -> String {
    format!("sandcove-{id}")
}

async fn echo(backend: &dyn Backend, id: &str) -> sandcove::Result<Vec<u8>> {
    let stream = backend
        .spawn(id, ProcessSpec::new(Command::sh("echo hi")))
        .await?;
    Ok(sandcove::client::collect(stream, u64::MAX as usize)
        .await?
        .stdout)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_requests_on_the_wire() {
    let fake = FakeCluster::start();
    let backend = backend(&fake).await;
    let mut options = test_options(&unique("wire"));
    options.labels.insert("team".into(), "ml".into());
    options.resources.memory_mib = Some(256);
    options.resources.cpu = Some(0.5);
    let info = backend.create(options).await.expect("create");
    let name = pod_name(&info.id);

    let requests = fake.requests();
    let created = requests
        .iter()
        .find(|r| r.method == "POST" && r.path.ends_with("/namespaces/sandcove-test/pods"))
        .expect("a Pod was created");
    let pod = created.body.as_ref().expect("with a body");
    let container = &pod["spec"]["containers"][0];
    assert_eq!(
        container["securityContext"]["allowPrivilegeEscalation"],
        false
    );
    assert_eq!(
        container["securityContext"]["capabilities"]["drop"],
        serde_json::json!(["ALL"])
    );
    assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(pod["spec"]["automountServiceAccountToken"], false);
    assert_eq!(container["resources"]["limits"]["memory"], "256Mi");
    assert_eq!(container["resources"]["limits"]["cpu"], "500m");
    assert_eq!(pod["metadata"]["labels"]["label.sandcove.dev/team"], "ml");
    // The token is derived, and only its hash is in the Pod.
    let token = sandcove::backend::kube::agent_token(&KEY, &info.id);
    assert!(!pod.to_string().contains(&token));
    assert!(pod
        .to_string()
        .contains(&sandcove::backend::kube::token_sha256(&token)));
    // Readiness came from a watch on that one Pod, not from polling it.
    let watches: Vec<_> = requests
        .iter()
        .filter(|r| r.method == "GET" && r.query.get("watch").map(String::as_str) == Some("true"))
        .collect();
    assert!(!watches.is_empty(), "no watch: {requests:#?}");
    assert_eq!(
        watches[0].query.get("fieldSelector").map(String::as_str),
        Some(format!("metadata.name={name}").as_str())
    );
    let gets_of_the_pod = requests
        .iter()
        .filter(|r| r.method == "GET" && r.path.ends_with(&format!("/pods/{name}")))
        .count();
    assert_eq!(gets_of_the_pod, 0, "create polled the Pod");

    // The egress policies exist before the Pod.
    let policy = requests
        .iter()
        .position(|r| r.method == "POST" && r.path.contains("networkpolicies"))
        .expect("egress policy created");
    let pod_post = requests
        .iter()
        .position(|r| r.method == "POST" && r.path.ends_with("/pods"))
        .unwrap();
    assert!(policy < pod_post);

    // A label filter is a label selector.
    let mut filter = ListOptions::default();
    filter.labels = BTreeMap::from([("team".to_string(), "ml".to_string())]);
    let listed = backend.list(filter).await.expect("list");
    assert_eq!(
        listed.iter().map(|i| i.id.as_str()).collect::<Vec<_>>(),
        [info.id.as_str()]
    );
    let list = fake
        .requests()
        .into_iter()
        .rev()
        .find(|r| r.method == "GET" && r.path.ends_with("/pods") && !r.query.contains_key("watch"))
        .expect("a list");
    assert_eq!(
        list.query.get("labelSelector").map(String::as_str),
        Some("app.kubernetes.io/managed-by=sandcove,label.sandcove.dev/team=ml")
    );

    // The destroy deletes with the grace period and confirms the Pod is gone.
    backend.destroy(&info.id).await.expect("destroy");
    let delete = fake
        .requests()
        .into_iter()
        .find(|r| r.method == "DELETE" && r.path.ends_with(&format!("/pods/{name}")))
        .expect("a delete");
    assert_eq!(
        delete.body,
        Some(serde_json::json!({"gracePeriodSeconds": 1, "propagationPolicy": "Background"}))
    );
    assert!(
        fake.pod(&name).is_none(),
        "destroy returned before the Pod was gone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_pod_never_ready_is_a_timeout_and_deleted() {
    let fake = FakeCluster::start();
    fake.set_unschedulable(true);
    let mut config = config(&fake);
    config.ready_timeout = Duration::from_secs(2);
    let backend = KubeBackend::with_url(&fake.url, config).await.unwrap();
    let e = backend
        .create(test_options(&unique("never")))
        .await
        .expect_err("a Pod that never becomes Ready");
    assert_eq!(e.code(), ErrorCode::Timeout, "{e:?}");
    // Cleanup finished before the error was returned.
    assert_eq!(fake.pod_names(), Vec::<String>::new());
    assert!(fake
        .requests()
        .iter()
        .any(|r| r.method == "DELETE" && r.path.contains("/pods/")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_pod_deleted_behind_our_back_is_not_found() {
    let fake = FakeCluster::start();
    let backend = backend(&fake).await;
    let id = backend
        .create(test_options(&unique("behind")))
        .await
        .expect("create")
        .id;
    assert_eq!(echo(&backend, &id).await.expect("runs"), b"hi\n");
    assert!(fake.delete_pod(&pod_name(&id)).await);
    eventually(PATIENCE, "the sandbox is gone", || {
        let backend = &backend;
        let id = &id;
        async move {
            let get = backend.get(id).await;
            holds(matches!(&get, Err(e) if e.is_not_found()), get)
        }
    })
    .await;
    let e = echo(&backend, &id).await.expect_err("the agent is gone");
    assert!(e.is_not_found(), "{e:?}");
    let e = backend.destroy(&id).await.expect_err("nothing to destroy");
    assert!(e.is_not_found(), "{e:?}");
    assert!(!backend
        .list(ListOptions::default())
        .await
        .unwrap()
        .iter()
        .any(|i| i.id == id));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_api_errors_map_to_core_codes() {
    let fake = FakeCluster::start();
    let backend = backend(&fake).await;
    for (code, reason, want) in [
        (403, "Forbidden", ErrorCode::Unavailable),
        (409, "AlreadyExists", ErrorCode::AlreadyExists),
        (422, "Invalid", ErrorCode::InvalidArgument),
        (500, "InternalError", ErrorCode::Backend),
    ] {
        fake.fail_next("POST", "/pods", code, reason);
        let e = backend
            .create(test_options(&unique("errors")))
            .await
            .expect_err("injected");
        assert_eq!(e.code(), want, "{code}: {e:?}");
    }
    // Nothing was left behind by the failed creates.
    assert_eq!(fake.pod_names(), Vec::<String>::new());

    let id = backend
        .create(test_options(&unique("errors")))
        .await
        .expect("create")
        .id;
    fake.fail_next("GET", &format!("/pods/{}", pod_name(&id)), 404, "NotFound");
    assert_eq!(
        backend.get(&id).await.unwrap_err().code(),
        ErrorCode::NotFound
    );
    fake.fail_next(
        "GET",
        &format!("/pods/{}", pod_name(&id)),
        500,
        "InternalError",
    );
    let e = backend.get(&id).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Backend);
    assert!(e.is_retryable());
    // A concurrent writer (409 Conflict on the replace) is retried, not lost.
    fake.fail_next("PUT", &format!("/pods/{}", pod_name(&id)), 409, "Conflict");
    let annotations = backend
        .update_annotations(&id, AnnotationUpdate::set("k", "v"))
        .await
        .expect("retried past the conflict");
    assert_eq!(annotations.get("k").map(String::as_str), Some("v"));
    assert_eq!(
        backend
            .get(&id)
            .await
            .unwrap()
            .annotations
            .get("k")
            .map(String::as_str),
        Some("v")
    );
    fake.fail_next(
        "DELETE",
        &format!("/pods/{}", pod_name(&id)),
        403,
        "Forbidden",
    );
    assert_eq!(
        backend.destroy(&id).await.unwrap_err().code(),
        ErrorCode::Unavailable
    );
    backend.destroy(&id).await.expect("destroy");
    // Volumes are claims; a missing one is NotFound, a taken name AlreadyExists.
    let name = format!("v-{}", sandcove::random_id(8));
    backend.create_volume(&name).await.expect("volume");
    assert_eq!(
        backend.create_volume(&name).await.unwrap_err().code(),
        ErrorCode::AlreadyExists
    );
    assert_eq!(backend.get_volume(&name).await.unwrap().name, name);
    assert!(backend
        .list_volumes()
        .await
        .unwrap()
        .iter()
        .any(|v| v.name == name));
    backend.delete_volume(&name).await.expect("delete volume");
    assert!(backend.get_volume(&name).await.unwrap_err().is_not_found());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_a_restarted_server_keeps_leases_and_reaches_agents() {
    let fake = FakeCluster::start();
    let first = backend(&fake).await;
    let mut options = test_options(&unique("restart"));
    options.timeout = Some(Duration::from_secs(600));
    let long = first.create(options.clone()).await.expect("create").id;
    options.timeout = Some(Duration::from_secs(4));
    let short = first.create(options).await.expect("create").id;
    drop(first);

    // A new serving process with the same key: it recomputes the tokens and rebuilds the
    // leases from the Pods' annotations.
    let second = backend(&fake).await;
    assert_eq!(echo(&second, &long).await.expect("same token"), b"hi\n");
    // The reaper records the tombstone when the lease ends, then deletes the Pod.
    let tomb = eventually(PATIENCE, "the short lease ends", || {
        let second = &second;
        let short = &short;
        async move {
            let tomb = second
                .tombstone(sandcove::ResourceKind::Sandbox, short)
                .await
                .unwrap();
            tomb.ok_or("no tombstone yet")
        }
    })
    .await;
    eventually(PATIENCE, "the short-lease Pod is deleted", || {
        let name = pod_name(&short);
        let fake = &fake;
        async move { holds(fake.pod(&name).is_none(), name) }
    })
    .await;
    assert!(fake.pod(&pod_name(&long)).is_some());
    assert_eq!(tomb.reason, "its lease ended");

    // A server with another key cannot use the sandbox's agent.
    let mut other = config(&fake);
    other.key = vec![8; 32];
    let stranger = KubeBackend::with_url(&fake.url, other).await.unwrap();
    let e = echo(&stranger, &long).await.expect_err("wrong token");
    assert_eq!(e.code(), ErrorCode::Unauthenticated, "{e:?}");
    second.destroy(&long).await.expect("destroy");
}

/// Start `python3 -m http.server` on `port` in sandbox `id`, serving `text` as its index,
/// and wait until it accepts connections (asked from inside the sandbox).
async fn serve_in_sandbox(backend: &dyn Backend, id: &str, port: u16, text: &str) {
    // Relative to the process's cwd (its home): the fake's Pods map their cwd, not paths in
    // a script.
    let dir = format!("www{port}");
    let script = format!(
        "mkdir -p {dir} && printf %s '{text}' > {dir}/index.html && cd {dir} && \
         exec python3 -m http.server {port} --bind 127.0.0.1"
    );
    drop(
        backend
            .spawn(id, ProcessSpec::new(Command::sh(script)))
            .await
            .expect("start a server"),
    );
    let probe =
        format!("python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}))'");
    eventually(PATIENCE, "the server in the sandbox listens", || {
        let probe = probe.clone();
        async move {
            let stream = backend
                .spawn(id, ProcessSpec::new(Command::sh(probe)))
                .await
                .map_err(|e| e.to_string())?;
            let out = sandcove::client::collect(stream, 1 << 16)
                .await
                .map_err(|e| e.to_string())?;
            holds(out.exit_status().success(), "not yet".to_string())
        }
    })
    .await;
}

/// A loopback port free on this machine a moment ago (the fake's Pods share its network).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A preview served by the backend's own process reaches a real HTTP server started inside
/// the Pod (through an agent tunnel), refuses a request without its token, and closes with
/// the sandbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_previews_reach_the_pod_and_end_with_it() {
    let fake = FakeCluster::start();
    let backend = backend(&fake).await;
    assert!(backend.capabilities().previews);
    let id = backend
        .create(test_options(&unique("preview")))
        .await
        .expect("create")
        .id;
    let port = free_port();
    serve_in_sandbox(&backend, &id, port, "served from the pod").await;
    let mut options = PreviewOptions::default();
    options.port = port;
    let preview = backend.expose_port(&id, options).await.expect("expose");
    assert!(
        preview.url.starts_with("http://127.0.0.1:"),
        "{}",
        preview.url
    );
    let token = preview.token.clone().expect("private").value;
    let (status, _) = http_get(&preview.host, "/", &[]).await.expect("answered");
    assert_eq!(
        status, 401,
        "no token: refused before the sandbox is reached"
    );
    let (status, body) = http_get(
        &preview.host,
        "/",
        &[(preview.token_header.as_str(), token.as_str())],
    )
    .await
    .expect("answered");
    assert_eq!((status, body.as_str()), (200, "served from the pod"));
    assert_eq!(backend.list_previews(&id).await.unwrap().len(), 1);
    backend.destroy(&id).await.expect("destroy");
    // The listener's task ends as the runtime gets to it, just after destroy returns.
    let host = preview.host.clone();
    eventually(
        PATIENCE,
        "the preview's listener closed with its sandbox",
        || {
            let host = host.clone();
            async move {
                let refused = tokio::net::TcpStream::connect(&host).await.is_err();
                holds(refused, format!("{host} still accepts"))
            }
        },
    )
    .await;
}

/// From outside the cluster: every agent connection is a port-forward through the API
/// server (the fake records each), and processes, files and previews work through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_port_forward_reaches_the_agent_through_the_api_server() {
    let fake = FakeCluster::start();
    let mut forwarded = config(&fake);
    forwarded.reach = AgentReach::PortForward;
    let backend = KubeBackend::with_url(&fake.url, forwarded.clone())
        .await
        .expect("backend");
    let id = backend
        .create(test_options(&unique("forward")))
        .await
        .expect("create")
        .id;
    assert_eq!(echo(&backend, &id).await.expect("exec"), b"hi\n");
    let name = pod_name(&id);
    let forwards: Vec<_> = fake
        .requests()
        .into_iter()
        .filter(|r| r.method == "GET" && r.path.ends_with(&format!("/pods/{name}/portforward")))
        .collect();
    // The exec may reuse the first contact's connection (the agent client keeps idle ones).
    assert!(
        !forwards.is_empty(),
        "agent connections go through the API server's port-forward: {forwards:?}"
    );
    for r in &forwards {
        assert_eq!(
            r.query.get("ports"),
            Some(&fake.agent_port.to_string()),
            "{r:?}"
        );
    }
    // A preview's tunnel goes the same way.
    let port = free_port();
    serve_in_sandbox(&backend, &id, port, "forwarded").await;
    let mut options = PreviewOptions::default();
    options.port = port;
    options.public = true;
    let preview = backend.expose_port(&id, options).await.expect("expose");
    let (status, body) = http_get(&preview.host, "/", &[]).await.expect("answered");
    assert_eq!((status, body.as_str()), (200, "forwarded"));
    // The token still decides: another key is refused by the agent, port-forward or not.
    let mut other = forwarded;
    other.key = vec![8; 32];
    let stranger = KubeBackend::with_url(&fake.url, other).await.unwrap();
    let e = echo(&stranger, &id).await.expect_err("wrong token");
    assert_eq!(e.code(), ErrorCode::Unauthenticated, "{e:?}");
    backend.destroy(&id).await.expect("destroy");
    // A deleted Pod's port-forward is refused by the API server: NotFound.
    assert!(echo(&backend, &id).await.unwrap_err().is_not_found());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_another_agent_at_a_gone_pods_address_is_not_found() {
    use sandcove::backend::agent_server::{
        spawn_local_pod_agent, token_sha256_hex, PodAgentConfig,
    };
    let fake = FakeCluster::start();
    let backend = backend(&fake).await;
    let id = backend
        .create(test_options(&unique("reused")))
        .await
        .expect("create")
        .id;
    // The backend now holds this sandbox's agent address.
    assert_eq!(echo(&backend, &id).await.expect("runs"), b"hi\n");
    let name = pod_name(&id);
    let ip: std::net::IpAddr = fake.pod(&name).expect("the Pod")["status"]["podIP"]
        .as_str()
        .expect("a Pod IP")
        .parse()
        .unwrap();
    // The Pod goes behind the backend's back, and its address goes to another sandbox's
    // agent (a Pod IP handed out again), which holds another token.
    assert!(fake.delete_pod(&name).await);
    eventually(PATIENCE, "the Pod is gone", || {
        let (fake, name) = (&fake, &name);
        async move { holds(fake.pod(name).is_none(), name) }
    })
    .await;
    let root = std::env::temp_dir().join(unique("kube-reused-root"));
    std::fs::create_dir_all(root.join("tmp")).unwrap();
    let hash = token_sha256_hex("another sandbox's token");
    let mut bytes = [0u8; 32];
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hash[2 * i..2 * i + 2], 16).unwrap();
    }
    let mut other = PodAgentConfig::new(std::net::SocketAddr::new(ip, fake.agent_port), bytes);
    other.root = Some(root.clone());
    /// The other agent, ended (and its root removed) however the test ends.
    struct Other(std::process::Child, std::path::PathBuf);
    impl Drop for Other {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
            let _ = std::fs::remove_dir_all(&self.1);
        }
    }
    let _other = Other(
        eventually(PATIENCE, "another agent listens at the old address", || {
            let other = other.clone();
            async move {
                tokio::task::spawn_blocking(move || spawn_local_pod_agent(&other).map(|(c, _)| c))
                    .await
                    .unwrap()
            }
        })
        .await,
        root,
    );
    // The sandbox is gone, not "unauthenticated" (which told the caller its credentials were
    // wrong, and kept the stale address for every later call).
    let e = echo(&backend, &id).await.expect_err("not this sandbox");
    assert!(e.is_not_found(), "{e:?}");
    let e = echo(&backend, &id)
        .await
        .expect_err("still not this sandbox");
    assert!(e.is_not_found(), "{e:?}");
}

/// A sandbox of another image: the Pod runs it with the agent copied in by an init
/// container of the sandbox image, and the sandbox works; an image the cluster cannot pull
/// is NotFound and leaves no Pod behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_runs_an_image_with_the_agent_brought_in() {
    let fake = FakeCluster::start();
    let backend = backend(&fake).await;
    assert!(backend.capabilities().images);
    let mut options = test_options(&unique("image"));
    options.template = Some("pullable/python:3.12-slim".into());
    let info = backend.create(options).await.expect("create");
    assert_eq!(info.template, "pullable/python:3.12-slim");
    let pod = fake.pod(&pod_name(&info.id)).expect("its Pod");
    assert_eq!(
        pod["spec"]["containers"][0]["image"],
        "pullable/python:3.12-slim"
    );
    assert_eq!(pod["spec"]["initContainers"][0]["image"], "sandcove:test");
    assert_eq!(echo(&backend, &info.id).await.expect("echo"), b"hi\n");
    backend.destroy(&info.id).await.expect("destroy");

    let mut missing = test_options(&unique("image"));
    missing.template = Some("nowhere/absent:1".into());
    let before = fake.pod_names().len();
    let err = backend.create(missing).await.expect_err("cannot pull");
    assert_eq!(err.code(), ErrorCode::NotFound, "{err}");
    assert!(err.to_string().contains("cannot pull"), "{err}");
    assert_eq!(fake.pod_names().len(), before, "no Pod left behind");
}
