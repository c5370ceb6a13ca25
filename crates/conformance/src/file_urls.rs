//! Signed file URLs: a plain HTTP client moves one file of one sandbox, and nothing else.

use super::*;
use sandcove::{FileUrlOperation, FileUrlOptions};

/// A `PATH` without any directory holding `python3`: what the sandbox's own processes see.
const NO_PYTHON_PATH: &str = "/nonexistent";

/// A plain HTTP client's answer: its status and body, or `None` when the connection was
/// refused or cut (a destroyed sandbox's listener is gone).
async fn send(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    body: Option<(&str, Vec<u8>)>,
) -> Option<(u16, Vec<u8>)> {
    let mut request = http.request(method, url);
    if let Some((content_type, bytes)) = body {
        request = request.header("content-type", content_type).body(bytes);
    }
    let response = request.send().await.ok()?;
    let status = response.status().as_u16();
    let bytes = response.bytes().await.ok()?;
    Some((status, bytes.to_vec()))
}

/// Upload through a write URL and download through a read URL with a plain HTTP client
/// (reqwest on loopback), raw and multipart; refused before any effect: another operation,
/// another path (query or multipart file name), a tampered or expired token, too large an
/// upload, a destroyed sandbox's URL; another sandbox's URL never reaches this sandbox's
/// files. Nothing is spawned in the sandbox (its processes are the same before and after,
/// and it runs with `python3` off its `PATH`) and nothing listens inside it.
pub async fn file_urls_move_one_file_outside_the_sandbox(backend: &dyn Backend) {
    let mut options = test_options(&unique("file-urls"));
    options.envs = BTreeMap::from([("PATH".to_string(), NO_PYTHON_PATH.to_string())]);
    let id = backend.create(options).await.expect("create").id;
    if !backend.capabilities().file_urls {
        expect_code(
            backend
                .create_file_url(&id, FileUrlOptions::read("a.txt"))
                .await,
            ErrorCode::NotSupported,
            "file URLs",
        );
        backend.destroy(&id).await.expect("destroy");
        return;
    }
    let other = create(backend, &unique("file-urls-other")).await;
    write(backend, &id, "/workspace/mine.txt", b"this sandbox's").await;
    write(backend, &other, "/workspace/mine.txt", b"the other's").await;
    let before: Vec<u32> = pids(backend, &id).await;

    // Options no URL can be made of.
    for (bad, what) in [
        (FileUrlOptions::read(""), "an empty path"),
        (
            FileUrlOptions::read("a").expires_at(sandcove::now_millis() - 1),
            "an expiry in the past",
        ),
        (
            FileUrlOptions::read("a").expires_at(sandcove::now_millis() + 30 * 24 * 3600 * 1000),
            "an expiry past the bound",
        ),
    ] {
        expect_code(
            backend.create_file_url(&id, bad).await,
            ErrorCode::InvalidArgument,
            what,
        );
    }

    let http = reqwest::Client::new();
    let data: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
    let put = backend
        .create_file_url(&id, FileUrlOptions::write("up/data.bin"))
        .await
        .expect("a write URL");
    assert_eq!(put.operation, FileUrlOperation::Write);
    let (status, body) = send(
        &http,
        reqwest::Method::PUT,
        &put.url,
        Some(("application/octet-stream", data.clone())),
    )
    .await
    .expect("PUT answered");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(read(backend, &id, "up/data.bin").await.expect("read"), data);

    let get = backend
        .create_file_url(&id, FileUrlOptions::read("up/data.bin"))
        .await
        .expect("a read URL");
    let (status, body) = send(&http, reqwest::Method::GET, &get.url, None)
        .await
        .expect("GET answered");
    assert_eq!(status, 200);
    assert_eq!(body, data, "the download is the file");

    // A multipart upload (what an HTML form or `requests.post(files=…)` sends).
    let boundary = "conformanceboundary";
    let form = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"note\"\r\n\r\nignored\r\n\
         --{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"form.txt\"\r\n\r\n\
         from a form\r\n--{boundary}--\r\n"
    );
    let content_type = format!("multipart/form-data; boundary={boundary}");
    let form_url = backend
        .create_file_url(&id, FileUrlOptions::write("form.txt"))
        .await
        .expect("a write URL");
    let (status, _) = send(
        &http,
        reqwest::Method::POST,
        &form_url.url,
        Some((&content_type, form.clone().into_bytes())),
    )
    .await
    .expect("POST answered");
    assert_eq!(status, 200);
    assert_eq!(
        read(backend, &id, "form.txt").await.expect("read"),
        b"from a form"
    );

    // Refused before any effect: another operation, another path.
    let refusals: Vec<Refusal> = vec![
        (
            reqwest::Method::PUT,
            get.url.clone(),
            Some(("application/octet-stream", b"overwritten".to_vec())),
            &[403],
            "a read URL does not write",
        ),
        (
            reqwest::Method::POST,
            get.url.clone(),
            Some((&content_type, form.clone().into_bytes())),
            &[403],
            "a read URL does not take a form",
        ),
        (
            reqwest::Method::GET,
            put.url.clone(),
            None,
            &[403],
            "a write URL does not read",
        ),
        (
            reqwest::Method::GET,
            format!("{}?path=/workspace/mine.txt", get.url),
            None,
            &[403],
            "a read URL names one path",
        ),
        (
            reqwest::Method::DELETE,
            get.url.clone(),
            None,
            // A router may answer an unrouted method itself.
            &[403, 405],
            "no other method",
        ),
        (
            reqwest::Method::GET,
            tampered(&get.url),
            None,
            &[401],
            "a tampered token",
        ),
        (
            reqwest::Method::PUT,
            tampered(&put.url),
            Some(("application/octet-stream", b"overwritten".to_vec())),
            &[401],
            "a tampered write token",
        ),
    ];
    for (method, url, body, wanted, what) in refusals {
        let (status, text) = send(&http, method, &url, body)
            .await
            .unwrap_or_else(|| panic!("{what}: answered"));
        assert!(
            wanted.contains(&status),
            "{what}: {status} {}",
            String::from_utf8_lossy(&text)
        );
    }
    // The form names another path as its file name: refused, nothing written there.
    let elsewhere = form.replace("filename=\"form.txt\"", "filename=\"/workspace/mine.txt\"");
    let (status, _) = send(
        &http,
        reqwest::Method::POST,
        &form_url.url,
        Some((&content_type, elsewhere.into_bytes())),
    )
    .await
    .expect("answered");
    assert_eq!(status, 403, "a form naming another path");
    // Two files where the URL writes one: nothing kept.
    let second = backend
        .create_file_url(&id, FileUrlOptions::write("two.txt"))
        .await
        .expect("a write URL");
    let two = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\n\r\none\r\n\
         --{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"b\"\r\n\r\ntwo\r\n\
         --{boundary}--\r\n"
    );
    let (status, _) = send(
        &http,
        reqwest::Method::POST,
        &second.url,
        Some((&content_type, two.into_bytes())),
    )
    .await
    .expect("answered");
    assert!(status >= 400, "two files: {status}");
    // A bounded upload: one byte more is refused, nothing kept.
    let small = backend
        .create_file_url(&id, FileUrlOptions::write("small.txt").max_bytes(10))
        .await
        .expect("a bounded write URL");
    let (status, _) = send(
        &http,
        reqwest::Method::PUT,
        &small.url,
        Some(("application/octet-stream", b"eleven byte".to_vec())),
    )
    .await
    .expect("answered");
    assert_eq!(status, 413, "past the URL's bound");
    for (path, what) in [("two.txt", "two files"), ("small.txt", "too large")] {
        expect_code(
            read(backend, &id, path).await,
            ErrorCode::NotFound,
            &format!("{what}: nothing kept"),
        );
    }
    assert_eq!(
        read(backend, &id, "/workspace/mine.txt")
            .await
            .expect("read"),
        b"this sandbox's",
        "the refusals changed nothing"
    );
    assert_eq!(read(backend, &id, "up/data.bin").await.expect("read"), data);

    // Another sandbox's URL reaches that sandbox's files only, wherever it is presented.
    let theirs = backend
        .create_file_url(&other, FileUrlOptions::read("/workspace/mine.txt"))
        .await
        .expect("the other's read URL");
    let token = theirs.url.rsplit('/').next().expect("a token");
    let ours_origin = get.url.rsplit_once('/').expect("a path").0;
    let (status, body) = send(
        &http,
        reqwest::Method::GET,
        &format!("{ours_origin}/{token}"),
        None,
    )
    .await
    .expect("answered");
    assert!(
        status == 401 || (status == 200 && body == b"the other's"),
        "another sandbox's URL: {status} {}",
        String::from_utf8_lossy(&body)
    );

    // An expiring URL works until it expires, then is refused.
    let soon = backend
        .create_file_url(
            &id,
            FileUrlOptions::read("/workspace/mine.txt").expires_at(sandcove::now_millis() + 1500),
        )
        .await
        .expect("an expiring URL");
    assert!(soon.expires_at.is_some());
    eventually(Duration::from_secs(30), "the URL expires", || async {
        match send(&http, reqwest::Method::GET, &soon.url, None).await {
            Some((401, _)) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;

    // Nothing ran in the sandbox for any of this, and nothing listens in it.
    assert_eq!(pids(backend, &id).await, before, "no process was started");
    if backend.capabilities().isolated {
        let listening = run(
            backend,
            &id,
            ProcessSpec::new(Command::argv([
                "/bin/cat",
                "/proc/net/tcp",
                "/proc/net/tcp6",
            ])),
        )
        .await;
        let listens = String::from_utf8_lossy(&listening.stdout)
            .lines()
            .skip(1)
            .filter(|l| l.split_whitespace().nth(3) == Some("0A"))
            .count();
        assert_eq!(listens, 0, "nothing listens in the sandbox");
    } else {
        skipped(
            "file_urls_move_one_file_outside_the_sandbox",
            "an un-isolated sandbox shares the host's network: its sockets are the host's",
        );
    }

    // A destroyed sandbox's URLs stop working.
    backend.destroy(&id).await.expect("destroy");
    match send(&http, reqwest::Method::GET, &get.url, None).await {
        None => {}
        Some((status, _)) => assert!(
            status == 404 || status == 401 || status == 410,
            "a destroyed sandbox's URL: {status}"
        ),
    }
    if let Some((status, _)) = send(
        &http,
        reqwest::Method::PUT,
        &put.url,
        Some(("application/octet-stream", b"late".to_vec())),
    )
    .await
    {
        assert!(status >= 400, "a destroyed sandbox's write URL: {status}");
    }
    backend.destroy(&other).await.expect("destroy the other");
}

/// A request that must be refused: method, URL, body, the statuses allowed, why.
type Refusal<'a> = (
    reqwest::Method,
    String,
    Option<(&'a str, Vec<u8>)>,
    &'static [u16],
    &'static str,
);

/// The sandbox's processes, by pid.
async fn pids(backend: &dyn Backend, id: &str) -> Vec<u32> {
    let mut pids: Vec<u32> = backend
        .list_processes(id)
        .await
        .expect("list processes")
        .into_iter()
        .filter(|p| p.exit.is_none())
        .map(|p| p.pid)
        .collect();
    pids.sort();
    pids
}

/// `url` with one character of its token's signed part changed.
fn tampered(url: &str) -> String {
    let (base, token) = url.rsplit_once('/').expect("a token");
    let mut bytes = token.as_bytes().to_vec();
    bytes[2] = if bytes[2] == b'A' { b'B' } else { b'A' };
    format!("{base}/{}", String::from_utf8(bytes).expect("ASCII"))
}
