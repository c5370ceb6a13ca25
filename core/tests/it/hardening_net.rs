//! Hardening, networking: what an Internet sandbox (`NetworkPolicy::Internet`) can reach.
//!
//! Sandbox code must not reach the host's loopback services, the cloud metadata endpoint,
//! private or link-local networks, or the host's own subnets. No test here sends a packet
//! anywhere but loopback: reachability of a range is probed with a UDP `connect`, which only
//! asks the sandbox's routing decision and sends nothing; the one TCP probe targets
//! 127.0.0.1. Outbound internet itself cannot be tested (no internet here): the tests check
//! the route table and resolver configuration the sandbox gets instead.
//!
//! Tests that need the helper (`pasta`, Debian package `passt`, and a usable /dev/net/tun;
//! `.ci/run` installs both) skip loudly without it. Runs as root and rootless.

use crate::hardening_common as common;

use std::sync::Arc;
use std::time::Duration;

use sandcove::{Backend, Command, ErrorCode, LocalBackend, NetworkPolicy, ProcessSpec};
use sandcove_conformance::{run, unique};

use common::{
    alive, all_processes, eventually, has_python, monitor_and_agent, python, signal, Env,
};

/// An engine whose `capabilities().internet` is true, or `None` (after saying why loudly).
fn internet_env(tag: &str) -> Option<Env> {
    let env = Env::new(tag);
    if !env.backend.capabilities().internet {
        eprintln!(
            "SKIP: isolated internet is unavailable on this host (install passt, chmod 0666 \
             /dev/net/tun); the Internet-policy tests did not run"
        );
        return None;
    }
    Some(env)
}

async fn internet_sandbox(env: &Env, marker: &str) -> String {
    let mut opts = env.options(marker);
    opts.network = NetworkPolicy::Internet;
    env.create(opts).await
}

/// The probe run inside the sandbox: the routing decision (UDP connect, nothing sent) for
/// each address, a TCP connect to the host listener's port on 127.0.0.1, and the default
/// route and its gateway.
fn probe(port: u16, targets: &[&str]) -> String {
    let targets: Vec<String> = targets.iter().map(|t| format!("{t:?}")).collect();
    format!(
        r#"
import errno, socket, struct
gw = None
for line in open("/proc/net/route").read().splitlines()[1:]:
    f = line.split()
    if f[1] == "00000000" and f[0] != "lo":
        gw = socket.inet_ntoa(struct.pack("<I", int(f[2], 16)))
        print("default via", gw, "dev", f[0])
def route(addr):
    fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_DGRAM)
    try:
        s.connect((addr, 80))
        return "routable"
    except OSError as e:
        return "blocked " + errno.errorcode.get(e.errno, str(e.errno))
    finally:
        s.close()
for addr in [{targets}] + ([gw] if gw else []):
    print("route", addr, route(addr))
s = socket.socket()
s.settimeout(3)
try:
    s.connect(("127.0.0.1", {port})); print("tcp connected")
except Exception as e:
    print("tcp refused", type(e).__name__)
print("interfaces", " ".join(sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").readlines()[2:])))
"#,
        targets = targets.join(", ")
    )
}

/// Finding 9: an Internet sandbox reaches nothing of the host's: a listener on the host's
/// 127.0.0.1 is not reachable (pasta forwards no port and maps no gateway to the host's
/// loopback), and the metadata endpoint, private, link-local, unique-local and the host's
/// own subnets — the gateway included — fail inside the sandbox with ENETUNREACH. The
/// sandbox does get an interface, a default route and a resolver (its internet path).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn internet_sandbox_reaches_no_host_private_or_metadata_address() {
    let Some(env) = internet_env("inet") else {
        return;
    };
    // Bound before the sandbox exists, as a host service would be: pasta's default
    // port detection would forward it into the sandbox's loopback.
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").expect("host listener");
    tcp.set_nonblocking(true).unwrap();
    let id = internet_sandbox(&env, &unique("inet")).await;
    assert_reaches_nothing_of_the_host(&*env.backend, &id, &tcp).await;
}

/// The same of a warm Internet sandbox, claimed from the pool in the shape the Daytona and
/// E2B listeners create (internet, the vendor's user and home): its member was made before
/// the listener existed, and its blocks were in force before it was handed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_internet_sandbox_reaches_no_host_private_or_metadata_address() {
    let Some(env) = internet_env("inet-warm") else {
        return;
    };
    let warm = env.local.clone().with_warm_pool(1);
    let vendor = || {
        let mut opts = env
            .options(&unique("inet-warm"))
            .user("user")
            .home("/home/user");
        opts.network = NetworkPolicy::Internet;
        opts
    };
    // The first create goes cold and has the pool keep its shape warm.
    let first = warm.create(vendor()).await.expect("create").id;
    warm.destroy(&first).await.expect("destroy");
    eventually(common::PATIENCE, "a warm Internet member", || {
        let ready = warm.warm_ready_for(&vendor());
        async move { sandcove_conformance::equals(ready, 1) }
    })
    .await;
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").expect("host listener");
    tcp.set_nonblocking(true).unwrap();
    let claims = warm.warm_claims();
    let id = warm.create(vendor()).await.expect("create").id;
    assert_eq!(warm.warm_claims(), claims + 1, "served by the pool");
    assert_reaches_nothing_of_the_host(&warm, &id, &tcp).await;
    warm.destroy(&id).await.expect("destroy");
    drop(warm);
    env.assert_nothing_left("warm internet sandboxes").await;
}

/// Internet sandbox `id` reaches no host, private or metadata address, nor `tcp` (a
/// listener on the host's loopback), and has its internet path (an interface, a default
/// route, the host's resolvers).
async fn assert_reaches_nothing_of_the_host(
    backend: &dyn Backend,
    id: &str,
    tcp: &std::net::TcpListener,
) {
    let port = tcp.local_addr().unwrap().port();
    assert_eq!(
        backend.get(id).await.expect("info").network,
        NetworkPolicy::Internet
    );
    if !has_python(backend, id).await {
        return;
    }
    let blocked = [
        "169.254.169.254",
        "10.0.0.1",
        "172.16.0.1",
        "192.168.0.1",
        "100.100.100.200",
        "fd00::1",
        "fe80::1",
    ];
    let text = python(backend, id, &probe(port, &blocked)).await;
    for addr in blocked {
        assert!(
            text.contains(&format!("route {addr} blocked ENETUNREACH"))
                // A host without IPv6 gives the sandbox no IPv6 route at all.
                || (addr.contains(':') && text.contains(&format!("route {addr} blocked"))),
            "{addr} must be unreachable from the sandbox: {text}"
        );
    }
    let gw = text
        .lines()
        .find_map(|l| l.strip_prefix("default via "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("the sandbox has a default route: {text}"))
        .to_string();
    assert!(
        text.contains(&format!("route {gw} blocked ENETUNREACH")),
        "the gateway (a host subnet address) must be unreachable: {text}"
    );
    assert!(text.contains("tcp refused"), "{text}");
    assert!(tcp.accept().is_err(), "the host listener got a connection");
    let ifaces = text
        .lines()
        .find_map(|l| l.strip_prefix("interfaces "))
        .unwrap_or_default();
    assert!(
        ifaces.split(' ').any(|i| i != "lo"),
        "an interface besides lo: {text}"
    );
    let resolv = run(
        backend,
        id,
        ProcessSpec::new(Command::argv(["cat", "/etc/resolv.conf"])),
    )
    .await;
    if std::fs::read_to_string("/etc/resolv.conf").is_ok_and(|t| t.contains("nameserver")) {
        assert!(
            resolv.stdout_lossy().contains("nameserver"),
            "the sandbox sees the host's resolvers"
        );
    }
    println!("hardening: Internet sandbox: host loopback, gateway, metadata and private ranges unreachable; default via {gw}");
}

/// The helper of `monitor` (its child other than the agent), waiting for it to show.
async fn helper_of(monitor: u32, agent: u32) -> u32 {
    let what = format!("monitor {monitor} has a networking helper");
    eventually(Duration::from_secs(30), &what, || {
        let found = all_processes()
            .into_iter()
            .find(|p| {
                p.ppid == monitor
                    && p.pid != agent
                    && p.state != 'Z'
                    && std::fs::read(format!("/proc/{}/cmdline", p.pid)).is_ok_and(|c| {
                        // Exactly: its last argument is the agent's pid.
                        c.split(|b| *b == 0)
                            .rfind(|a| !a.is_empty())
                            .is_some_and(|a| a == agent.to_string().as_bytes())
                    })
            })
            .map(|p| p.pid);
        let found = found.ok_or("none yet");
        async move { found }
    })
    .await
}

/// The networking helper goes with its sandbox: on destroy, and when the monitor is killed
/// outright (SIGKILL, no cleanup code runs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destroy_and_a_killed_monitor_leave_no_network_helper() {
    let Some(env) = internet_env("inet-helper") else {
        return;
    };
    let marker = unique("inet-helper");
    let a = internet_sandbox(&env, &marker).await;
    let b = internet_sandbox(&env, &marker).await;
    let (mon_a, agent_a) = monitor_and_agent(&a).await;
    let (mon_b, agent_b) = monitor_and_agent(&b).await;
    let helper_a = helper_of(mon_a, agent_a).await;
    let helper_b = helper_of(mon_b, agent_b).await;

    env.backend.destroy(&a).await.expect("destroy");
    eventually(
        Duration::from_secs(30),
        &format!("the helper {helper_a} outlived its destroyed sandbox"),
        || {
            let gone = sandcove_conformance::holds(!alive(helper_a), helper_a);
            async move { gone }
        },
    )
    .await;

    signal(mon_b, libc::SIGKILL);
    eventually(
        Duration::from_secs(30),
        &format!("the helper {helper_b} outlived its killed monitor"),
        || {
            let gone = sandcove_conformance::holds(!alive(helper_b), helper_b);
            async move { gone }
        },
    )
    .await;
    // The killed monitor's state is collected by the next program's engine.
    let _next = LocalBackend::with_state_dir(&env.dir)
        .expect("the next program's engine")
        .with_warm_pool(0);
    env.assert_nothing_left("internet sandboxes").await;
}

/// Without the helper: `capabilities().internet` is false, an explicit Internet request is
/// `Unavailable` (naming the remedy) before anything is created, and the vendor default
/// degrades to loopback only, never to the host's network.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn internet_without_the_helper_is_unavailable_before_any_effect() {
    let base = Env::new("inet-none");
    let local: LocalBackend = base.local.clone().with_network_helper(None);
    let env = Env {
        backend: Arc::new(local.clone()),
        local,
        dir: base.dir.clone(),
    };
    let caps = env.backend.capabilities();
    assert!(!caps.internet);
    assert_eq!(caps.vendor_internet_default(), NetworkPolicy::None);
    let mut opts = env.options(&unique("inet-none"));
    opts.network = NetworkPolicy::Internet;
    let err = env.backend.create(opts).await.expect_err("no helper");
    assert_eq!(err.code(), ErrorCode::Unavailable, "{err}");
    assert!(err.to_string().contains("passt"), "names the remedy: {err}");
    assert!(env.state_entries().is_empty(), "nothing was created");
    assert!(env.monitors().is_empty());

    // A helper path that is not an executable behaves the same.
    let odd = env
        .local
        .clone()
        .with_network_helper(Some("/dev/null".into()));
    assert!(!odd.capabilities().internet);
    drop(base);
}
