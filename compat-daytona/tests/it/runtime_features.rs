//! Calls that depend on runtime capabilities (previews, volumes, snapshots, fork, pause): when
//! the capability is there they must work; when it is not, the facade raises NotSupported.

use crate::common;

use daytona::{CreateSandboxFromSnapshotParams, Sandbox, VolumeMount};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn capabilities() -> sandcove::Capabilities {
    let client = sandcove::Client::from_env().expect("runtime");
    client.ready().await.expect("capabilities")
}

/// A plain HTTP/1.1 GET; returns the status line and body.
async fn http_get(url: &str, headers: &[(&str, &str)]) -> std::io::Result<(u16, String)> {
    http_request("GET", url, headers, b"").await
}

/// A plain HTTP/1.1 request with `body`; returns the status line and body.
async fn http_request(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<(u16, String)> {
    let rest = url.strip_prefix("http://").expect("http url");
    let (host, path) = match rest.find(['/', '?']) {
        Some(i) if rest[i..].starts_with('?') => (&rest[..i], format!("/{}", &rest[i..])),
        Some(i) => (&rest[..i], rest[i..].to_string()),
        None => (rest, "/".to_string()),
    };
    let mut s = tokio::net::TcpStream::connect(host).await?;
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).await?;
    s.write_all(body).await?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    Ok((status, body))
}

async fn serve(sb: &Sandbox, port: u16) {
    sb.fs
        .upload_file(b"hello from the sandbox\n", "www/index.html")
        .await
        .unwrap();
    sb.process.create_session("web").await.unwrap();
    sb.process
        .execute_session_command(
            "web",
            daytona::SessionExecuteRequest {
                command: format!("cd www && python3 -m http.server {port} --bind 127.0.0.1"),
                run_async: Some(true),
                ..Default::default()
            },
        )
        .await
        .unwrap();
}

/// GET until the server in the sandbox answers (it needs a moment to start).
async fn get_when_up(url: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let what = format!("the preview at {url} answers");
    sandcove_conformance::eventually(sandcove_conformance::PATIENCE, &what, || async {
        match http_get(url, headers).await {
            Ok((status, body)) if status != 502 && status != 0 => Ok((status, body)),
            other => Err(format!("{other:?}")),
        }
    })
    .await
}

#[tokio::test]
async fn preview_links_serve_with_their_token() {
    let (_d, sb) = common::sandbox().await;
    if !capabilities().await.previews {
        let e = sb.get_preview_link(3000).await.unwrap_err();
        assert!(e.is_not_supported(), "{e}");
        sb.delete().await.unwrap();
        return;
    }
    serve(&sb, 3000).await;
    let preview = sb.get_preview_link(3000).await.unwrap();
    assert_eq!(preview.sandbox_id, sb.id);
    assert!(!preview.token.is_empty());
    let (status, body) = get_when_up(
        &preview.url,
        &[("x-daytona-preview-token", preview.token.as_str())],
    )
    .await;
    assert_eq!((status, body.as_str()), (200, "hello from the sandbox\n"));
    let (refused, _) = http_get(&preview.url, &[]).await.unwrap();
    assert!(matches!(refused, 401 | 403), "without a token: {refused}");
    let again = sb.get_preview_link(3000).await.unwrap();
    assert_eq!(again.token, preview.token, "the link is stable");

    let signed = sb
        .create_signed_preview_url(3000)
        .expires_in_seconds(3600)
        .await
        .unwrap();
    assert_eq!(signed.port, 3000);
    let (status, body) = http_get(&signed.url, &[]).await.unwrap();
    assert_eq!((status, body.as_str()), (200, "hello from the sandbox\n"));
    assert!(sb
        .create_signed_preview_url(3000)
        .expires_in_seconds(0)
        .await
        .unwrap_err()
        .is_validation());
    sb.delete().await.unwrap();

    // A public sandbox needs no token.
    let d = common::daytona();
    let public = d
        .create(CreateSandboxFromSnapshotParams {
            public: Some(true),
            ..common::short_lived()
        })
        .await
        .unwrap();
    assert!(public.public);
    serve(&public, 8080).await;
    let link = public.get_preview_link(8080).await.unwrap();
    let (status, _) = get_when_up(&link.url, &[]).await;
    assert_eq!(status, 200);
    public.delete().await.unwrap();
}

#[tokio::test]
async fn volumes_are_shared_between_sandboxes() {
    let d = common::daytona();
    let name = format!("dtn-vol-{}", std::process::id());
    if !capabilities().await.volumes {
        let e = d.volume.get(name.clone()).create(true).await.unwrap_err();
        assert!(e.is_not_supported(), "{e}");
        return;
    }
    assert!(d.volume.get(name.clone()).await.unwrap_err().is_not_found());
    let direct = d.volume.create(&format!("{name}-direct")).await.unwrap();
    assert!(d
        .volume
        .create(&direct.name)
        .await
        .unwrap_err()
        .is_conflict());
    d.volume.delete(&direct).await.unwrap();
    let volume = d.volume.get(name.clone()).create(true).await.unwrap();
    assert_eq!(
        (volume.id.as_str(), volume.state.as_str()),
        (name.as_str(), "ready")
    );
    assert!(d
        .volume
        .list()
        .await
        .unwrap()
        .iter()
        .any(|v| v.name == name));
    let mount = |path: &str, subpath: Option<&str>| CreateSandboxFromSnapshotParams {
        volumes: Some(vec![VolumeMount {
            volume_id: volume.id.clone(),
            mount_path: path.into(),
            subpath: subpath.map(str::to_owned),
        }]),
        ..common::short_lived()
    };
    let sb1 = d.create(mount("/home/daytona/volume", None)).await.unwrap();
    sb1.fs
        .create_folder("/home/daytona/volume/new-dir", "755")
        .await
        .unwrap();
    sb1.fs
        .upload_file(b"Hello, World!", "/home/daytona/volume/new-file.txt")
        .await
        .unwrap();
    let sb2 = d
        .create(mount("/home/daytona/my-files", None))
        .await
        .unwrap();
    let mut names: Vec<String> = sb2
        .fs
        .list_files("/home/daytona/my-files")
        .await
        .unwrap()
        .into_iter()
        .map(|f| f.name)
        .collect();
    names.sort();
    assert_eq!(names, ["new-dir", "new-file.txt"]);
    assert_eq!(
        sb2.fs
            .download_file("/home/daytona/my-files/new-file.txt")
            .await
            .unwrap(),
        b"Hello, World!"
    );
    let sb3 = d
        .create(mount("/home/daytona/alice", Some("users/alice")))
        .await
        .unwrap();
    sb3.fs
        .upload_file(b"hers", "/home/daytona/alice/note.txt")
        .await
        .unwrap();
    assert_eq!(
        sb1.fs
            .download_file("/home/daytona/volume/users/alice/note.txt")
            .await
            .unwrap(),
        b"hers"
    );
    for sb in [sb1, sb2, sb3] {
        sb.delete().await.unwrap();
    }
    d.volume.delete(&volume).await.unwrap();
    assert!(d.volume.get(name).await.unwrap_err().is_not_found());
}

#[tokio::test]
async fn snapshots_fork_and_pause() {
    let (d, mut sb) = common::sandbox().await;
    if !capabilities().await.snapshots {
        assert!(sb
            .create_snapshot("s")
            .await
            .unwrap_err()
            .is_not_supported());
        assert!(sb.fork().await.unwrap_err().is_not_supported());
    } else {
        sb.fs.upload_file(b"v1", "data.txt").await.unwrap();
        let name = format!("dtn-snap-{}", std::process::id());
        sb.create_snapshot(&name).await.unwrap();
        let snap = d.snapshot.get(name.clone()).await.unwrap();
        assert_eq!(
            (snap.name.as_str(), snap.state.as_str()),
            (name.as_str(), "active")
        );
        assert_eq!(d.snapshot.activate(&snap).await.unwrap(), snap);
        let page = d.snapshot.list().limit(1000).await.unwrap();
        assert!(page.items.iter().any(|s| s.id == snap.id));
        assert!(d.snapshot.list().page(0).await.unwrap_err().is_validation());
        let from = d
            .create(CreateSandboxFromSnapshotParams {
                snapshot: Some(name.clone()),
                ..common::short_lived()
            })
            .await
            .unwrap();
        assert_eq!(from.fs.download_file("data.txt").await.unwrap(), b"v1");
        assert_eq!(from.snapshot.as_deref(), Some(name.as_str()));
        from.delete().await.unwrap();
        let fork = sb.fork().await.unwrap();
        assert_ne!(fork.id, sb.id);
        assert_eq!(fork.fs.download_file("data.txt").await.unwrap(), b"v1");
        fork.delete().await.unwrap();
        d.snapshot.delete(&snap).await.unwrap();
        assert!(d.snapshot.get(name).await.unwrap_err().is_not_found());
    }
    // The default snapshot: listed, got by name, what a plain create names, never deleted.
    let listed = d.snapshot.list().limit(1000).await.unwrap();
    let default = listed.items.last().expect("the default snapshot is listed");
    assert_eq!(
        (
            default.name.as_str(),
            default.general,
            default.state.as_str()
        ),
        (daytona::DEFAULT_SNAPSHOT, true, "active")
    );
    assert_eq!(
        &d.snapshot.get(daytona::DEFAULT_SNAPSHOT).await.unwrap(),
        default
    );
    assert_eq!(sb.snapshot.as_deref(), Some(daytona::DEFAULT_SNAPSHOT));
    let err = d.snapshot.delete(default).await.unwrap_err();
    assert!(
        matches!(err, daytona::DaytonaError::Forbidden(_)),
        "{err:?}"
    );
    let err = sb
        .create_snapshot(daytona::DEFAULT_SNAPSHOT)
        .await
        .unwrap_err();
    assert!(matches!(err, daytona::DaytonaError::Conflict(_)), "{err:?}");
    let image = daytona::CreateSnapshotParams {
        name: "img".into(),
        image: "python:3.12".into(),
        ..Default::default()
    };
    assert!(d
        .snapshot
        .create(image)
        .await
        .unwrap_err()
        .is_not_supported());

    if capabilities().await.pause {
        sb.pause().await.unwrap();
        sb.refresh_data().await.unwrap();
        assert_eq!(sb.state, Some(daytona::SandboxState::Paused));
        sb.start().await.unwrap();
        assert_eq!(sb.state, Some(daytona::SandboxState::Started));
        assert_eq!(sb.process.exec("echo up").await.unwrap().result, "up\n");
    } else {
        assert!(sb.pause().await.unwrap_err().is_not_supported());
    }
    sb.delete().await.unwrap();
}

/// Finding 9: Daytona's default (network not blocked) never shares the host's network. A
/// listener on the host's 127.0.0.1, bound before the sandbox exists, is not reachable from a
/// sandbox created with the defaults (isolated internet or loopback only).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_network_does_not_reach_host_loopback() {
    let host = std::net::TcpListener::bind("127.0.0.1:0").expect("host listener");
    host.set_nonblocking(true).unwrap();
    let port = host.local_addr().unwrap().port();
    let (_d, sb) = common::sandbox().await;
    let r = sb
        .process
        .exec(format!(
            "if command -v python3 >/dev/null; then python3 -c \"import socket; s=socket.socket(); \
             s.settimeout(3); print(s.connect_ex(('127.0.0.1', {port})))\"; else echo no-python; fi"
        ))
        .await
        .unwrap();
    if r.result.trim() == "no-python" {
        eprintln!("SKIP: python3 is not installed on this host; socket probe not run");
    } else {
        // 111 is ECONNREFUSED: nothing listens on the sandbox's own loopback.
        assert_eq!(r.result.trim(), "111", "host 127.0.0.1:{port} reached");
        assert!(host.accept().is_err(), "the host listener got a connection");
    }
    sb.delete().await.unwrap();
}

/// `upload_url` / `download_url`: the runtime's signed file URLs, used with a plain HTTP
/// client and no credential; a relative path is under the work dir as for `fs`; a download
/// URL does not upload, a tampered token is refused, nothing runs in the sandbox for them.
#[tokio::test]
async fn upload_and_download_urls_work_with_plain_http() {
    if !capabilities().await.file_urls {
        return;
    }
    let (_d, sb) = common::sandbox().await;
    let sessions = sb.process.list_sessions().await.unwrap().len();
    let up = sb
        .upload_url("urls/demo.txt")
        .ttl_seconds(600)
        .await
        .unwrap();
    let boundary = "XyZbOuNdArY";
    let body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"demo.txt\"\r\n\
         Content-Type: application/octet-stream\r\n\r\nuploaded content\r\n--{boundary}--\r\n"
    );
    let content_type = format!("multipart/form-data; boundary={boundary}");
    let (status, reply) = http_request(
        "POST",
        &up,
        &[("Content-Type", content_type.as_str())],
        body.as_bytes(),
    )
    .await
    .unwrap();
    assert_eq!(status, 200, "{reply}");
    assert_eq!(
        sb.fs.download_file("urls/demo.txt").await.unwrap(),
        b"uploaded content"
    );
    let down = sb.download_url("urls/demo.txt").await.unwrap();
    let (status, reply) = http_get(&down, &[]).await.unwrap();
    // The body may come chunked.
    assert!(
        status == 200 && reply.contains("uploaded content"),
        "{status} {reply}"
    );
    let forever = sb
        .download_url("urls/demo.txt")
        .ttl_seconds(0)
        .await
        .unwrap();
    assert_eq!(http_get(&forever, &[]).await.unwrap().0, 200);

    let (status, _) = http_request("POST", &down, &[], b"x").await.unwrap();
    assert_eq!(status, 403, "a download URL does not upload");
    let tampered = format!("{}x", down.trim_end_matches(|c| c != '.'));
    let (status, _) = http_get(&tampered, &[]).await.unwrap();
    assert_eq!(status, 401, "a tampered token");
    assert_eq!(
        sb.fs.download_file("urls/demo.txt").await.unwrap(),
        b"uploaded content"
    );
    assert_eq!(sb.process.list_sessions().await.unwrap().len(), sessions);

    assert!(sb.download_url("").await.unwrap_err().is_validation());
    let too_long = sb.download_url("x").ttl_seconds(8 * 24 * 3600).await;
    assert!(too_long.is_err(), "more than 7 days");
    assert!(sb
        .rotate_signing_key()
        .await
        .unwrap_err()
        .to_string()
        .contains("ttl_seconds"));
    sb.delete().await.unwrap();
}
