//! `Sandbox`: create, connect, kill, set_timeout, get_info, list, lifecycle gaps and
//! capability-dependent calls, against the embedded runtime.

use crate::common::{assert_not_supported, caps, sandbox, skip, unique};
use e2b::{
    DateTime, Sandbox, SandboxLifecycle, SandboxNetworkOpts, SandboxQuery, SandboxState,
    ALL_TRAFFIC,
};
use sandcove_conformance::{equals, eventually, next_millisecond, PATIENCE};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_gives_e2b_user_home_envs_and_info() {
    let sbx = Sandbox::create()
        .timeout(60)
        .metadata([("userId", "123")])
        .envs([("MY_VAR", "my_value")])
        .api_key("e2b_0123abcd")
        .await
        .expect("create");
    let r = sbx
        .commands
        .run("whoami; pwd; echo $HOME; echo $E2B_SANDBOX $E2B_SANDBOX_ID $E2B_TEMPLATE_ID; echo $MY_VAR; shopt -q login_shell && echo login")
        .await
        .expect("run");
    assert_eq!(
        r.stdout,
        format!(
            "user\n/home/user\n/home/user\ntrue {} base\nmy_value\nlogin\n",
            sbx.sandbox_id
        )
    );
    assert_eq!(sbx.sandbox_domain, "localhost");
    assert_eq!(
        sbx.connection_config.api_key.as_deref(),
        Some("e2b_0123abcd")
    );
    let info = sbx.get_info().await.expect("get_info");
    assert_eq!(info.sandbox_id, sbx.sandbox_id);
    assert_eq!(info.template_id, "base");
    assert_eq!(info.name.as_deref(), Some("base"));
    assert_eq!(info.metadata.get("userId").map(String::as_str), Some("123"));
    assert_eq!(info.state, SandboxState::Running);
    assert_eq!(info.envd_version, "99.99.99");
    assert_eq!(info.sandbox_domain.as_deref(), Some("localhost"));
    assert_eq!(
        info.end_at.unix_millis - info.started_at.unix_millis,
        60_000,
        "the lifetime is the create timeout"
    );
    assert!(info.cpu_count >= 1);
    // The runtime records which vendor made it (what `sandcove ls` shows).
    let core = sandcove::Client::from_env()
        .expect("client")
        .sandbox(sbx.sandbox_id.clone())
        .info()
        .await
        .expect("core info");
    assert_eq!(
        core.annotations.get("e2b/template").map(String::as_str),
        Some("base")
    );
    let shown = format!("{info:?}");
    assert!(
        shown.starts_with(&format!("SandboxInfo(sandbox_id='{}'", sbx.sandbox_id)),
        "{shown}"
    );
    assert!(shown.contains("metadata={'userId': '123'}"), "{shown}");
    // The static form reports the same.
    assert_eq!(
        Sandbox::get_info(sbx.sandbox_id.clone())
            .await
            .expect("static get_info"),
        info
    );
    assert!(sbx.kill().await.expect("kill"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_zero_means_the_default_lifetime() {
    let sbx = Sandbox::create().timeout(0).await.expect("create");
    let info = sbx.get_info().await.expect("info");
    assert_eq!(
        info.end_at.unix_millis - info.started_at.unix_millis,
        300_000
    );
    assert!(Sandbox::kill(sbx.sandbox_id.clone()).await.expect("kill"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_timeout_kill_and_is_running() {
    let sbx = sandbox("lifecycle").await;
    assert!(sbx.is_running().await.expect("is_running"));
    let lifecycle = sbx.get_info().await.expect("info").lifecycle;
    assert_eq!(
        lifecycle,
        Some(e2b::SandboxInfoLifecycle {
            on_timeout: "kill".into(),
            auto_resume: false,
        }),
        "get_info reports the lifecycle"
    );
    let before = DateTime::now().unix_millis;
    sbx.set_timeout(600).await.expect("set_timeout");
    let end = sbx.get_info().await.expect("info").end_at.unix_millis;
    assert!(end >= before + 600_000, "end_at moved to ~600 s from now");
    Sandbox::set_timeout(sbx.sandbox_id.clone(), 30)
        .await
        .expect("static set_timeout");
    let end = sbx.get_info().await.expect("info").end_at.unix_millis;
    assert!(end < before + 600_000, "set_timeout can shorten");
    assert!(sbx.kill().await.expect("kill"));
    assert!(
        !sbx.kill().await.expect("kill again"),
        "kill of a gone sandbox is false"
    );
    assert!(!Sandbox::kill("nosuchsandbox00000000")
        .await
        .expect("kill unknown"));
    assert!(!sbx.is_running().await.expect("is_running after kill"));
    let err = sbx.get_info().await.unwrap_err();
    assert!(err.is_sandbox_not_found() && err.is_not_found(), "{err:?}");
    let err = sbx.set_timeout(10).await.unwrap_err();
    assert!(err.is_sandbox_not_found(), "{err:?}");
    let err = sbx.commands.run("true").await.unwrap_err();
    assert!(err.is_not_found(), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_only_extends_and_unknown_is_not_found() {
    let sbx = Sandbox::create().timeout(100).await.expect("create");
    let again = Sandbox::connect(sbx.sandbox_id.clone())
        .timeout(10)
        .await
        .expect("connect");
    assert_eq!(again.sandbox_id, sbx.sandbox_id);
    let info = again.get_info().await.expect("info");
    assert_eq!(
        info.end_at.unix_millis - info.started_at.unix_millis,
        100_000,
        "a shorter connect timeout does not shorten the lifetime"
    );
    let before = DateTime::now().unix_millis;
    let third = sbx.connect().timeout(500).await.expect("instance connect");
    let end = third.get_info().await.expect("info").end_at.unix_millis;
    assert!(end >= before + 500_000, "a longer connect timeout extends");
    let r = third.commands.run("whoami").await.expect("run");
    assert_eq!(r.stdout.trim(), "user");
    sbx.kill().await.expect("kill");
    let err = Sandbox::connect("nosuchsandbox00000000").await.unwrap_err();
    assert!(err.is_sandbox_not_found(), "{err:?}");
    assert_eq!(
        err.to_string(),
        "Paused sandbox nosuchsandbox00000000 not found"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_filters_by_metadata_and_pages() {
    let tag = unique("list");
    let mut made = Vec::new();
    for i in 0..3 {
        // Each sandbox is created in a later millisecond than the last: the order asserted
        // below is the creation order, not a tie broken by id.
        next_millisecond().await;
        let i = i.to_string();
        made.push(
            Sandbox::create()
                .timeout(60)
                .metadata([("listTest", tag.as_str()), ("n", i.as_str())])
                .await
                .expect("create"),
        );
    }
    let query = SandboxQuery {
        metadata: Some([("listTest".to_string(), tag.clone())].into()),
        ..Default::default()
    };
    // The builder is awaited like every async call; that yields the paginator, unfetched.
    let mut paginator = Sandbox::list().query(query.clone()).await.expect("list");
    assert!(paginator.has_next);
    let all = paginator.next_items().await.expect("next_items");
    assert_eq!(all.len(), 3);
    assert!(!paginator.has_next);
    let ns: Vec<_> = all.iter().map(|i| i.metadata["n"].clone()).collect();
    assert_eq!(ns, ["2", "1", "0"], "newest first");
    assert!(
        all.iter().all(|i| i.sandbox_domain.is_none()),
        "list leaves out the domain"
    );
    let err = paginator.next_items().await.unwrap_err();
    assert_eq!(err.to_string(), "No more items to fetch");
    // Pages of one, oldest first.
    let mut paginator = Sandbox::list().query(query.clone()).limit(1).order("asc");
    let mut seen = Vec::new();
    while paginator.has_next {
        let page = paginator.next_items().await.expect("page");
        assert_eq!(page.len(), 1);
        seen.push(page[0].metadata["n"].clone());
    }
    assert_eq!(seen, ["0", "1", "2"]);
    // Start from a token.
    let mut paginator = Sandbox::list()
        .query(query.clone())
        .limit(2)
        .next_token("2");
    assert_eq!(paginator.next_items().await.expect("page").len(), 1);
    // AND across metadata keys; paused-only finds nothing.
    let narrow = SandboxQuery {
        metadata: Some(
            [
                ("listTest".to_string(), tag.clone()),
                ("n".to_string(), "1".to_string()),
            ]
            .into(),
        ),
        ..Default::default()
    };
    let items = Sandbox::list()
        .query(narrow)
        .next_items()
        .await
        .expect("list");
    assert_eq!(items.len(), 1);
    assert_eq!(items[0].sandbox_id, made[1].sandbox_id);
    let paused = SandboxQuery {
        state: Some(vec![SandboxState::Paused]),
        ..query.clone()
    };
    assert!(Sandbox::list()
        .query(paused)
        .next_items()
        .await
        .expect("list")
        .is_empty());
    let later = SandboxQuery {
        started_after: Some(DateTime::from_unix_millis(u64::MAX / 2)),
        ..query.clone()
    };
    assert!(Sandbox::list()
        .query(later)
        .next_items()
        .await
        .expect("list")
        .is_empty());
    let err = Sandbox::list()
        .order("sideways")
        .next_items()
        .await
        .unwrap_err();
    assert!(err.is_invalid_argument(), "{err:?}");
    let err = Sandbox::list().limit(0).next_items().await.unwrap_err();
    assert!(err.is_invalid_argument(), "{err:?}");
    for s in &made {
        s.kill().await.expect("kill");
    }
    let gone = Sandbox::list()
        .query(query)
        .next_items()
        .await
        .expect("list");
    assert!(gone.is_empty(), "killed sandboxes disappear");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gaps_are_refused_before_any_effect() {
    let tag = unique("gaps");
    let meta = [("gapTest", tag.as_str())];
    let base = || Sandbox::create().timeout(30).metadata(meta);
    assert_not_supported(base().mcp(serde_json::json!({"x": {}})).await, "mcp");
    assert_not_supported(base().iam(serde_json::json!({})).await, "iam");
    // A template the runtime has not stored: where it runs images, E2B's not-found saying
    // how to store it; elsewhere a gap.
    match base().template("my-custom-template").await {
        Err(e) if caps().await.images => assert!(
            e.is_not_found()
                && e.to_string()
                    .contains("template 'my-custom-template' not found"),
            "{e}"
        ),
        other => assert_not_supported(other, "template"),
    }
    let rules = SandboxNetworkOpts {
        allow_out: Some(vec!["1.1.1.1".into()]),
        ..Default::default()
    };
    assert_not_supported(base().network(rules).await, "network rules");
    let private = SandboxNetworkOpts {
        allow_public_traffic: Some(false),
        ..Default::default()
    };
    assert_not_supported(base().network(private).await, "private traffic");
    let lc = SandboxLifecycle {
        on_timeout: Some("pause".into()),
        keep_memory: Some(false),
        auto_resume: Some(true),
    };
    assert!(base()
        .lifecycle(lc)
        .await
        .unwrap_err()
        .is_invalid_argument());
    if !caps().await.volumes {
        assert_not_supported(base().volume_mounts([("/mnt/v", "vol")]).await, "volumes");
    }
    let query = SandboxQuery {
        metadata: Some([("gapTest".to_string(), tag.clone())].into()),
        ..Default::default()
    };
    assert!(
        Sandbox::list()
            .query(query)
            .next_items()
            .await
            .expect("list")
            .is_empty(),
        "no refused create made a sandbox"
    );
    // Invalid lifecycles are InvalidArgument, also before any effect.
    let lc = SandboxLifecycle {
        auto_resume: Some(true),
        ..Default::default()
    };
    assert!(base()
        .lifecycle(lc)
        .await
        .unwrap_err()
        .is_invalid_argument());
    let lc = SandboxLifecycle {
        on_timeout: Some("kill".into()),
        keep_memory: Some(true),
        ..Default::default()
    };
    assert!(base()
        .lifecycle(lc)
        .await
        .unwrap_err()
        .is_invalid_argument());
    // Instance gaps.
    let sbx = sandbox("gaps").await;
    assert_not_supported(sbx.get_mcp_url(), "get_mcp_url");
    assert_not_supported(
        sbx.update_network(SandboxNetworkOpts::default()).await,
        "update_network",
    );
    assert!(
        sbx.is_running().await.expect("still running"),
        "refusals had no effect"
    );
    // A filesystem-only pause keeps the files, ends the processes, and `connect` runs the
    // sandbox again.
    sbx.files
        .write("kept.txt", "files stay")
        .await
        .expect("write");
    sbx.commands
        .run("sleep 600")
        .background(true)
        .await
        .expect("a process to end");
    assert!(sbx.pause().keep_memory(false).await.expect("pause"));
    assert!(!sbx.is_running().await.expect("state"));
    assert_eq!(
        sbx.get_info().await.expect("info").state,
        e2b::SandboxState::Paused
    );
    assert!(!sbx.pause().keep_memory(false).await.expect("pause again"));
    let again = Sandbox::connect(sbx.sandbox_id.clone())
        .await
        .expect("connect");
    assert!(again.is_running().await.expect("running"));
    assert_eq!(
        again.files.read("kept.txt").await.expect("read"),
        "files stay"
    );
    let sleeping = again.commands.list().await.expect("list");
    assert!(
        sleeping.iter().all(|p| !p.args.join(" ").contains("sleep")),
        "processes ended: {sleeping:?}"
    );
    again.kill().await.expect("kill");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_choices_are_applied() {
    let sbx = Sandbox::create()
        .timeout(30)
        .allow_internet_access(false)
        .await
        .expect("create");
    assert_eq!(
        sbx.get_info().await.expect("info").allow_internet_access,
        Some(false)
    );
    let r = sbx
        .commands
        .run("awk -F: 'NR>2 {gsub(/ /, \"\", $1); print $1}' /proc/net/dev")
        .await
        .expect("run");
    assert_eq!(r.stdout.trim(), "lo", "loopback only");
    sbx.kill().await.expect("kill");
    let deny = SandboxNetworkOpts {
        deny_out: Some(vec![ALL_TRAFFIC.into()]),
        ..Default::default()
    };
    let sbx = Sandbox::create()
        .timeout(30)
        .network(deny)
        .await
        .expect("create");
    assert_eq!(
        sbx.get_info().await.expect("info").allow_internet_access,
        Some(false)
    );
    sbx.kill().await.expect("kill");
    // E2B's default is internet access: isolated internet where the runtime has it, else
    // loopback only (never the host's network).
    let sbx = Sandbox::create().timeout(30).await.expect("create");
    assert_eq!(
        sbx.get_info().await.expect("info").allow_internet_access,
        Some(caps().await.internet),
        "E2B's default is internet access where the runtime has it"
    );
    sbx.kill().await.expect("kill");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_and_resume_follow_the_capability() {
    let sbx = sandbox("pause").await;
    if caps().await.pause {
        sbx.commands
            .run("echo kept > state.txt")
            .await
            .expect("run");
        assert!(sbx.pause().await.expect("pause"));
        assert!(
            !Sandbox::pause(sbx.sandbox_id.clone())
                .await
                .expect("pause again"),
            "already paused"
        );
        assert_eq!(
            sbx.get_info().await.expect("info").state,
            SandboxState::Paused
        );
        assert!(!sbx.is_running().await.expect("is_running"));
        let resumed = sbx.connect().await.expect("connect resumes");
        assert!(resumed.is_running().await.expect("is_running"));
        assert_eq!(
            resumed.files.read("state.txt").await.expect("read"),
            "kept\n"
        );
    } else {
        skip("pause / connect-resume", "pause");
        assert_not_supported(sbx.pause().await, "pause");
        assert_not_supported(sbx.beta_pause().await, "beta_pause");
        assert!(sbx.is_running().await.expect("still running"));
        let lc = SandboxLifecycle {
            on_timeout: Some("pause".into()),
            ..Default::default()
        };
        assert_not_supported(
            Sandbox::create().timeout(30).lifecycle(lc).await,
            "on_timeout=pause",
        );
    }
    sbx.kill().await.expect("kill");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_follow_the_capability() {
    let sbx = sandbox("metrics").await;
    if caps().await.metrics {
        let m = sbx.get_metrics().await.expect("metrics");
        assert_eq!(m.len(), 1);
        assert!(m[0].mem_total > 0 && m[0].cpu_count >= 1);
        let none = Sandbox::get_metrics(sbx.sandbox_id.clone())
            .end(DateTime::from_unix_millis(1))
            .await
            .expect("metrics");
        assert!(none.is_empty(), "samples outside the range are left out");
    } else {
        skip("get_metrics", "metrics");
        assert_not_supported(sbx.get_metrics().await, "get_metrics");
    }
    sbx.kill().await.expect("kill");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_host_reaches_the_port_when_previews_exist() {
    let sbx = sandbox("host").await;
    if caps().await.previews {
        let _server = sbx
            .commands
            .run("python3 -m http.server 3000")
            .background(true)
            .timeout(0)
            .await
            .expect("server");
        sbx.files
            .write("hello.txt", "hi from the sandbox")
            .await
            .expect("write");
        let host = sbx.get_host(3000).await.expect("get_host");
        let host = &host;
        let body = eventually(
            PATIENCE,
            "the server in the sandbox answers",
            || async move {
                // A blocking std client: run it off the event loop.
                let host = host.clone();
                tokio::task::spawn_blocking(move || http_get(&host, "/hello.txt"))
                    .await
                    .expect("join")
            },
        )
        .await;
        assert!(body.ends_with("hi from the sandbox"), "{body}");
    } else {
        skip("get_host", "previews");
        assert_not_supported(sbx.get_host(3000).await, "get_host");
    }
    sbx.kill().await.expect("kill");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upload_and_download_urls_work_with_plain_http() {
    let sbx = sandbox("urls").await;
    if caps().await.file_urls {
        let processes = sbx.commands.list().await.expect("list").len();
        let url = sbx
            .upload_url("demo.txt")
            .user("user")
            .use_signature_expiration(10_000)
            .await
            .expect("upload_url");
        let boundary = "XyZbOuNdArY";
        let body = format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"demo.txt\"\r\nContent-Type: application/octet-stream\r\n\r\nuploaded content\r\n--{boundary}--\r\n"
        );
        let reply = http(
            "POST",
            &url,
            &format!("multipart/form-data; boundary={boundary}"),
            body.as_bytes(),
        )
        .expect("POST upload");
        assert_eq!(status_of(&reply), 200, "{reply}");
        assert_eq!(
            sbx.files.read("demo.txt").await.expect("read"),
            "uploaded content"
        );
        let url = sbx.download_url("demo.txt").await.expect("download_url");
        let reply = http("GET", &url, "", b"").expect("GET download");
        assert!(
            status_of(&reply) == 200 && reply.ends_with("\r\n\r\nuploaded content"),
            "{reply}"
        );
        // The URL is the credential: a download URL does not upload, and without its
        // token the runtime refuses the request.
        let reply = http("POST", &url, "application/octet-stream", b"x").expect("POST");
        assert_eq!(status_of(&reply), 403, "{reply}");
        let unsigned = format!("{}/", url.rsplit_once('/').unwrap().0);
        let reply = http("GET", &unsigned, "", b"").expect("GET unsigned");
        assert!(matches!(status_of(&reply), 401 | 404), "{reply}");
        // Nothing ran in the sandbox for any of it (no file server, no python3).
        assert_eq!(sbx.commands.list().await.expect("list").len(), processes);
        let err = sbx.download_url("").await.unwrap_err();
        assert!(err.is_invalid_argument(), "{err:?}");
        let err = sbx.upload_url("").await.unwrap_err();
        assert!(err.is_invalid_argument(), "{err:?}");
    } else {
        skip("upload_url / download_url", "signed file URLs");
        assert_not_supported(sbx.upload_url("demo.txt").await, "upload_url");
    }
    assert_not_supported(
        sbx.download_url("x").user("root").await,
        "download_url as root",
    );
    sbx.kill().await.expect("kill");
}

/// The status code of a whole HTTP reply.
fn status_of(reply: &str) -> u16 {
    reply
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// One HTTP/1.0 request to an `http://host:port/path?query` URL; the whole reply.
fn http(method: &str, url: &str, content_type: &str, body: &[u8]) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let rest = url.strip_prefix("http://").expect("http URL");
    let (host, target) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let mut s = std::net::TcpStream::connect(host)?;
    let mut head = format!(
        "{method} {target} HTTP/1.0\r\nHost: {host}\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !content_type.is_empty() {
        head.push_str(&format!("Content-Type: {content_type}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes())?;
    s.write_all(body)?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

fn http_get(host: &str, path: &str) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(host)?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    if !out.starts_with("HTTP/1.0 200") && !out.starts_with("HTTP/1.1 200") {
        return Err(std::io::Error::other(out));
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_and_fork_follow_the_capability() {
    let sbx = sandbox("snap").await;
    sbx.files.write("f.txt", "v1").await.expect("write");
    if caps().await.snapshots {
        let name = unique("snap");
        let snap = sbx
            .create_snapshot()
            .name(name.clone())
            .await
            .expect("snapshot");
        let listed = sbx.list_snapshots().next_items().await.expect("list");
        assert!(listed.iter().any(|s| s.snapshot_id == snap.snapshot_id));
        let from = Sandbox::create()
            .timeout(30)
            .template(snap.snapshot_id.clone())
            .await
            .expect("create from snapshot");
        assert_eq!(from.files.read("f.txt").await.expect("read"), "v1");
        from.kill().await.expect("kill");
        let forks = sbx.fork().count(2).timeout(30).await.expect("fork");
        assert_eq!(forks.len(), 2);
        for f in forks {
            let f = f.expect("fork");
            assert_eq!(f.files.read("f.txt").await.expect("read"), "v1");
            f.kill().await.expect("kill");
        }
        assert!(Sandbox::delete_snapshot(snap.snapshot_id.clone())
            .await
            .expect("delete"));
        assert!(!Sandbox::delete_snapshot(snap.snapshot_id)
            .await
            .expect("delete again"));
    } else {
        skip("create_snapshot / list_snapshots / fork", "snapshots");
        assert_not_supported(sbx.create_snapshot().await, "create_snapshot");
        assert_not_supported(
            Sandbox::list_snapshots().next_items().await,
            "list_snapshots",
        );
        assert_not_supported(sbx.fork().await, "fork");
    }
    assert!(sbx.fork().count(0).await.unwrap_err().is_invalid_argument());
    sbx.kill().await.expect("kill");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volume_mounts_follow_the_capability() {
    let client = sandcove::Client::from_env().expect("runtime");
    if caps().await.volumes {
        let name = unique("vol").replace('-', "");
        client
            .backend()
            .create_volume(&name)
            .await
            .expect("create volume");
        let sbx = Sandbox::create()
            .timeout(30)
            .volume_mounts([("/mnt/data", name.as_str())])
            .await
            .expect("create with a volume");
        sbx.files
            .write("/mnt/data/kept.txt", "in the volume")
            .await
            .expect("write");
        sbx.kill().await.expect("kill");
        let again = Sandbox::create()
            .timeout(30)
            .volume_mounts([("/mnt/data", name.as_str())])
            .await
            .expect("create with the volume again");
        assert_eq!(
            again.files.read("/mnt/data/kept.txt").await.expect("read"),
            "in the volume"
        );
        again.kill().await.expect("kill");
        client
            .backend()
            .delete_volume(&name)
            .await
            .expect("delete volume");
    } else {
        skip("volume_mounts", "volumes");
        assert_not_supported(
            Sandbox::create()
                .timeout(30)
                .volume_mounts([("/mnt/data", "v")])
                .await,
            "volume_mounts",
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_timeout_pause_pauses_instead_of_killing() {
    let lc = SandboxLifecycle {
        on_timeout: Some("pause".into()),
        auto_resume: Some(false),
        ..Default::default()
    };
    let made = Sandbox::create().timeout(600).lifecycle(lc).await;
    if !caps().await.pause {
        skip("lifecycle on_timeout='pause'", "pause");
        assert_not_supported(made, "on_timeout=pause");
        return;
    }
    let sbx = made.expect("create");
    sbx.files.write("kept.txt", "kept").await.expect("write");
    // The lease is shortened only once the file is written: a slow machine cannot pause first.
    sbx.set_timeout(2).await.expect("set_timeout");
    eventually(PATIENCE, "paused at the end of its lifetime", || async {
        equals(
            sbx.get_info().await.ok().map(|i| i.state),
            Some(SandboxState::Paused),
        )
    })
    .await;
    let resumed = Sandbox::connect(sbx.sandbox_id.clone())
        .timeout(30)
        .await
        .expect("connect resumes");
    assert_eq!(resumed.files.read("kept.txt").await.expect("read"), "kept");
    resumed.kill().await.expect("kill");
}

#[test]
fn public_types_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Sandbox>();
    check::<e2b::SandboxInfo>();
    check::<e2b::CommandResult>();
    check::<e2b::EntryInfo>();
    check::<e2b::SandboxException>();
    check::<e2b::code_interpreter::Sandbox>();
    fn check_send<T: Send>() {}
    check_send::<e2b::CommandHandle>();
    check_send::<e2b::WatchHandle>();
}

/// Finding 9: E2B's default "internet on" never shares the host's network. A listener on the
/// host's 127.0.0.1, bound before the sandbox exists, is not reachable from a sandbox created
/// with the defaults (isolated internet or loopback only, whichever the runtime has).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_network_does_not_reach_host_loopback() {
    let host = std::net::TcpListener::bind("127.0.0.1:0").expect("host listener");
    host.set_nonblocking(true).unwrap();
    let port = host.local_addr().unwrap().port();
    let sbx = sandbox("net-default").await;
    let r = sbx
        .commands
        .run(format!(
            "if command -v python3 >/dev/null; then python3 -c \"import socket; s=socket.socket(); \
             s.settimeout(3); print(s.connect_ex(('127.0.0.1', {port})))\"; else echo no-python; fi"
        ))
        .await
        .expect("run");
    if r.stdout.trim() == "no-python" {
        eprintln!("SKIP: python3 is not installed on this host; socket probe not run");
    } else {
        assert_eq!(
            r.stdout.trim(),
            "111", // ECONNREFUSED: nothing listens on the sandbox's own loopback
            "the host's 127.0.0.1:{port} must not be reachable"
        );
        assert!(host.accept().is_err(), "the host listener got a connection");
    }
    sbx.kill().await.expect("kill");
}

/// A saved id of a sandbox killed recently is still E2B's not-found, saying when it ended;
/// the runtime's reference to it answers the same tombstone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_to_a_killed_sandbox_says_when_it_was_destroyed() {
    let sbx = Sandbox::create().timeout(60).await.expect("create");
    let id = sbx.sandbox_id.clone();
    let reference = sbx.sandcove_reference().expect("reference");
    assert_eq!(reference.id(), id);
    assert!(sbx.kill().await.expect("kill"));
    let err = Sandbox::connect(id.clone()).await.unwrap_err();
    assert!(err.is_sandbox_not_found(), "{err:?}");
    let text = err.to_string();
    assert!(
        text.starts_with(&format!("Paused sandbox {id} not found: ")),
        "{text}"
    );
    assert!(text.contains("destroyed at 20"), "{text}");
    let reopened = sandcove::Client::from_env()
        .expect("client")
        .reopen(&reference)
        .await
        .unwrap_err();
    assert!(reopened.is_destroyed(), "{reopened:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_page_tokens_are_refused_or_end_the_list() {
    // Past usize::MAX less a page: adding the page size overflowed (a panic in a debug
    // build, a wrapped token otherwise).
    for forged in [
        "18446744073709551615",
        "18446744073709551600",
        "+1",
        "1e3",
        &"9".repeat(4096),
    ] {
        let err = Sandbox::list()
            .next_token(forged.to_string())
            .next_items()
            .await
            .expect_err(forged);
        assert!(err.is_invalid_argument(), "{forged}: {err}");
        assert!(err.to_string().len() < 200, "the token is not echoed whole");
        let err = Sandbox::list_snapshots()
            .next_token(forged.to_string())
            .next_items()
            .await
            .expect_err(forged);
        assert!(err.is_invalid_argument(), "{forged}: {err}");
    }
    // The largest offset it accepts is past every list: an empty last page.
    let mut paginator = Sandbox::list().next_token("999999999999999999");
    assert!(paginator.next_items().await.expect("page").is_empty());
    assert!(!paginator.has_next);
    assert_eq!(paginator.next_token, None);
}
