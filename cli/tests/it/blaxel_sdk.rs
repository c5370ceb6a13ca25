//! Blaxel's official TypeScript SDK (`@blaxel/core`), unmodified, against
//! `sandcove serve --blaxel`.
//!
//! Each test provisions the pinned SDK (`fixtures/js/blaxel/package-lock.json`, `npm ci`,
//! under the build directory) on first use, starts the built `sandcove serve` on free
//! loopback ports with a private state directory, points the SDK at it with exactly the
//! lines `sandcove env blaxel` prints, runs one program from `fixtures/js/blaxel/` and
//! compares its output with the `.expected` file beside it. A machine without `node` or
//! `npm` fails these tests, saying so.

use std::time::Duration;

use crate::sdk_harness::{self, check_node, js_fixtures, node_project, run_node, Server};
use serde_json::Value;

const ANNOUNCE: &str = "Blaxel wire protocol";
const DIR: &str = "blaxel";

/// One call to the Blaxel listener with `key`: (status, JSON body).
fn call(server: &Server, key: &str, method: &str, path: &str) -> (u16, Value) {
    call_with(server, key, method, path, None)
}

/// A call with the server's key that must succeed, with its JSON answer.
fn ok(server: &Server, method: &str, path: &str, body: Value) -> Value {
    let (status, answer) = call_with(server, &server.key, method, path, Some(body));
    assert_eq!(status, 200, "{method} {path}: {answer}");
    answer
}

/// `my-sandbox` with `/app/package.json` and `/app/server.mjs`: what the README's process
/// and preview snippets assume of Blaxel's images (an npm app in `/app`). `build` writes
/// `dist.txt`; `dev -- --port P` serves `hello from the app` on port P.
fn prepare_app(server: &Server) {
    ok(
        server,
        "POST",
        "/v0/sandboxes",
        serde_json::json!({"metadata": {"name": "my-sandbox"}}),
    );
    let package = serde_json::json!({"name": "app", "private": true, "scripts": {
        "build": "node -e \"require('fs').writeFileSync('dist.txt','built')\"",
        "dev": "node server.mjs"}});
    let server_js = "import http from \"node:http\";\n\
        const port = Number(process.argv[process.argv.indexOf(\"--port\") + 1]);\n\
        http.createServer((q, r) => r.end(\"hello from the app\\n\")).listen(port, \"0.0.0.0\");\n";
    for (path, content) in [
        ("/app/package.json", package.to_string()),
        ("/app/server.mjs", server_js.to_string()),
    ] {
        ok(
            server,
            "PUT",
            &format!("/blaxel-sbx/my-sandbox/filesystem/{path}"),
            serde_json::json!({ "content": content }),
        );
    }
}

/// A GET of a preview URL: the status and body, or `None` when nothing answers.
fn fetch(url: &str) -> Option<(u16, String)> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let resp = reqwest::get(url).await.ok()?;
        let status = resp.status().as_u16();
        Some((status, resp.text().await.ok()?))
    })
}

/// `text` with every `http://127.0.0.1:PORT` written `http://127.0.0.1:PORT` (preview URLs
/// take a free port).
fn without_ports(text: &str) -> String {
    const HOST: &str = "http://127.0.0.1:";
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find(HOST) {
        out.push_str(&rest[..at + HOST.len()]);
        rest = &rest[at + HOST.len()..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        out.push_str(if digits > 0 { "PORT" } else { "" });
        rest = &rest[digits..];
    }
    out.push_str(rest);
    out
}

fn expected(name: &str) -> String {
    std::fs::read_to_string(js_fixtures(DIR).join(format!("{name}.expected"))).unwrap()
}

/// One call with an optional JSON body.
fn call_with(
    server: &Server,
    key: &str,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut request = reqwest::Client::new()
            .request(method.parse().unwrap(), format!("{}{path}", server.origin))
            .header("X-Blaxel-Authorization", format!("Bearer {key}"))
            .header("X-Blaxel-Workspace", "sandcove");
        if let Some(body) = body {
            request = request.json(&body);
        }
        let resp = request.send().await.expect("the listener answers");
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    })
}

/// `sandcove env blaxel` points the TypeScript SDK at the listener over plain HTTP, with
/// the SDK's HTTP/2 edge pool off.
#[test]
fn env_prints_the_typescript_variables() {
    let server = Server::start("blaxel", ANNOUNCE, "env-key");
    let vars = server.env().expect("sandcove env blaxel");
    let get = |k: &str| {
        vars.iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("{k} missing from {vars:?}"))
    };
    assert_eq!(get("BL_API_URL"), format!("{}/v0", server.origin));
    assert_eq!(get("BL_RUN_URL"), server.origin);
    assert_eq!(get("BL_API_KEY"), "env-key");
    assert_eq!(get("BL_WORKSPACE"), "sandcove");
    assert_eq!(get("BL_DISABLE_H2"), "1");
    assert!(server.origin.starts_with("http://127.0.0.1:"));
}

/// The TypeScript README's sandbox snippet, verbatim: create (createIfNotExists with image,
/// memory, region, ports, labels, ttl), get, delete by class, then delete through the
/// instance — the second delete of the same name succeeds, as on Blaxel. It prints nothing;
/// the test then checks through the listener that the sandbox is gone.
#[test]
fn typescript_sdk_readme_quickstart_verbatim() {
    let server = Server::start("blaxel", ANNOUNCE, "quickstart-key");
    check_node(DIR, "blaxel_quickstart", &server, Duration::from_secs(120));
    let (status, page) = call(&server, &server.key, "GET", "/v0/sandboxes");
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["data"], Value::Array(vec![]), "deleted: {page}");
    let (status, body) = call(&server, &server.key, "GET", "/v0/sandboxes/my-sandbox");
    assert_eq!(status, 404, "{body}");
}

/// Sandboxes (create with envs, labels and ttl; createIfNotExists; get; list; metadata and
/// ttl updates), processes (exec with name, working dir, env, timeout and waiting; a
/// non-zero exit; NDJSON streaming; background processes; wait, logs, list, get, stop, kill,
/// streamed logs), files (write, read, mkdir, binary write and read, tree writes, cp, rm
/// recursive, watch), previews (public and private with a token, both reaching a server in
/// the sandbox; list, delete) and errors (missing sandbox, file and process; gaps) as the
/// SDK reports them.
#[test]
fn typescript_sdk_sandboxes_processes_files_previews_and_errors() {
    let server = Server::start("blaxel", ANNOUNCE, "basics-key");
    check_node(DIR, "blaxel_basics", &server, Duration::from_secs(300));
}

/// Snapshots and fork as the TypeScript SDK calls them: `sandbox.snapshots` (create through
/// the workspace route, list, get, restore), the deprecated `snapshot`/`listSnapshots`, fork
/// live and from a snapshot (with envs), `Snapshot.get`, the paged `Snapshot.list`, a fork of a
/// snapshot whose source is deleted, deletes, and the 404/409/501 refusals.
#[test]
fn typescript_sdk_snapshots_restore_and_fork() {
    let server = Server::start("blaxel", ANNOUNCE, "snapshots-key");
    check_node(DIR, "blaxel_snapshots", &server, Duration::from_secs(300));
}

/// Large files through the SDK's own upload paths: a 3 MiB text file in one JSON request
/// (under the SDK's 5 MiB multipart threshold, over the listener's 1 MiB JSON limit) and a
/// 70 MiB binary file as a multipart upload of 5 MiB parts (over the 64 MiB the listener
/// once capped uploads at), each read back equal; no part file left behind.
#[test]
fn typescript_sdk_writes_large_files() {
    let server = Server::start("blaxel", ANNOUNCE, "large-files-key");
    check_node(DIR, "blaxel_large_files", &server, Duration::from_secs(300));
}

/// What were gaps, as the TypeScript SDK calls them: `externalId` at creation and
/// `getByExternalId`, `stdin: true` with `writeStdin`/`closeStdin` (409 without an open
/// stdin), `fetch`/`network.fetch` to a server in the sandbox (method, path, query, body and
/// headers passed on, the SDK's credentials not, a 404 returned, no named preview left), and
/// `archive`/`unarchive` (status `ARCHIVED`, files kept, processes ended).
#[test]
fn typescript_sdk_external_ids_stdin_fetch_and_archive() {
    let server = Server::start("blaxel", ANNOUNCE, "fetch-stdin-key");
    check_node(
        DIR,
        "blaxel_fetch_stdin_archive",
        &server,
        Duration::from_secs(300),
    );
}

/// A wrong key is the SDK's 401, and nothing is created.
#[test]
fn typescript_sdk_with_a_wrong_key_is_refused() {
    let server = Server::start("blaxel", ANNOUNCE, "right-key");
    check_node(DIR, "blaxel_wrong_key", &server, Duration::from_secs(120));
    let (status, page) = call(&server, &server.key, "GET", "/v0/sandboxes");
    assert_eq!(status, 200, "{page}");
    assert_eq!(
        page["data"],
        Value::Array(vec![]),
        "nothing created: {page}"
    );
}

/// Preview tokens: create (named `token-<ms>` by the SDK), list with values and expiry
/// flags, delete by name (that token is refused at once, the other still opens the preview
/// by header and by query), a second delete (404), and a deleted preview.
#[test]
fn typescript_sdk_preview_tokens_list_and_delete() {
    let server = Server::start("blaxel", ANNOUNCE, "tokens-key");
    check_node(
        DIR,
        "blaxel_preview_tokens",
        &server,
        Duration::from_secs(180),
    );
}

/// `BL_WORKSPACE` naming another workspace: `403 UNAUTHORIZED_WORKSPACE`, nothing created.
#[test]
fn typescript_sdk_with_a_wrong_workspace_is_refused() {
    let server = Server::start("blaxel", ANNOUNCE, "workspace-key");
    check_node(
        DIR,
        "blaxel_wrong_workspace",
        &server,
        Duration::from_secs(120),
    );
    let (status, page) = call(&server, &server.key, "GET", "/v0/sandboxes");
    assert_eq!(status, 200, "{page}");
    assert_eq!(
        page["data"],
        Value::Array(vec![]),
        "nothing created: {page}"
    );
}

/// Every documented gap a TypeScript program reaches answers the SDK's own error, naming
/// the feature and its alternative.
#[test]
fn typescript_sdk_gaps_name_the_alternative() {
    let server = Server::start("blaxel", ANNOUNCE, "gaps-key");
    check_node(DIR, "blaxel_gaps", &server, Duration::from_secs(180));
}

/// The TypeScript README's preview snippet, verbatim, on the npm app it assumes in `/app`
/// (prepared here): `npm run dev -- --port 3000` with `waitForPorts`, then a public preview
/// whose URL it prints; that URL reaches the app.
#[test]
fn typescript_sdk_readme_preview_verbatim() {
    let server = Server::start("blaxel", ANNOUNCE, "readme-preview-key");
    prepare_app(&server);
    let name = "blaxel_readme_preview";
    let (status, stdout, stderr) = run_node(DIR, name, &server, Duration::from_secs(180), &[]);
    assert!(status.success(), "{stdout}\n{stderr}");
    assert_eq!(without_ports(&stdout), expected(name), "{stderr}");
    let url = stdout.trim();
    assert_eq!(
        fetch(url),
        Some((200, "hello from the app\n".to_string())),
        "the printed URL reaches the app"
    );
}

/// The TypeScript README's process snippet, verbatim, on the npm app it assumes in `/app`
/// (prepared here): `npm run build` runs to completion, then the snippet kills
/// `build-process`, which has already exited. Blaxel answers that with an error and the SDK
/// throws; Sandcove answers the same way, so the program ends with the SDK's error (the
/// `.expected` file is the status and message it carries) after the build ran.
#[test]
fn typescript_sdk_readme_process_verbatim() {
    let server = Server::start("blaxel", ANNOUNCE, "readme-process-key");
    prepare_app(&server);
    let name = "blaxel_readme_process";
    let (status, stdout, stderr) = run_node(DIR, name, &server, Duration::from_secs(180), &[]);
    assert!(
        !status.success(),
        "killing an exited process throws: {stdout}"
    );
    assert_eq!(stdout, "");
    let (code, built) = call(
        &server,
        &server.key,
        "GET",
        "/blaxel-sbx/my-sandbox/filesystem//app/dist.txt",
    );
    assert_eq!(code, 200, "{built}");
    assert_eq!(built["content"], "built", "npm run build ran: {built}");
    let wanted = expected(name);
    assert!(
        stderr.contains(wanted.trim()),
        "the SDK's error for the kill: {stderr}"
    );
}

/// The TypeScript README's filesystem snippet, verbatim, on `my-sandbox` (made here) with
/// `./image.png` beside the program: text and binary files, mkdir, ls, grep, find, watch.
/// It prints nothing; the files are there afterwards.
#[test]
fn typescript_sdk_readme_filesystem_verbatim() {
    let server = Server::start("blaxel", ANNOUNCE, "readme-fs-key");
    ok(
        &server,
        "POST",
        "/v0/sandboxes",
        serde_json::json!({"metadata": {"name": "my-sandbox"}}),
    );
    let image = sdk_harness::py_fixtures().join("image.png");
    std::fs::copy(&image, node_project(DIR).join("image.png")).expect("image.png beside it");
    check_node(
        DIR,
        "blaxel_readme_filesystem",
        &server,
        Duration::from_secs(180),
    );
    let (status, config) = call(
        &server,
        &server.key,
        "GET",
        "/blaxel-sbx/my-sandbox/filesystem//app/config.json",
    );
    assert_eq!(status, 200, "{config}");
    assert_eq!(config["content"], r#"{"key": "value"}"#, "{config}");
    let (status, listing) = call(
        &server,
        &server.key,
        "GET",
        "/blaxel-sbx/my-sandbox/filesystem//app",
    );
    assert_eq!(status, 200, "{listing}");
    let names: Vec<String> = listing["files"]
        .as_array()
        .expect("files")
        .iter()
        .map(|f| f["name"].as_str().unwrap_or("").to_string())
        .collect();
    assert!(names.contains(&"image.png".to_string()), "{listing}");
    assert!(
        listing["subdirectories"].to_string().contains("uploads"),
        "{listing}"
    );
}

/// The TypeScript README's listing snippet, verbatim, over two sandboxes made here: newest
/// first, the same page again through `for await`, then `autoPagingToArray`.
#[test]
fn typescript_sdk_readme_listing_verbatim() {
    let server = Server::start("blaxel", ANNOUNCE, "readme-list-key");
    for name in ["older-sandbox", "newer-sandbox"] {
        ok(
            &server,
            "POST",
            "/v0/sandboxes",
            serde_json::json!({"metadata": {"name": name}}),
        );
    }
    check_node(
        DIR,
        "blaxel_readme_listing",
        &server,
        Duration::from_secs(120),
    );
}
