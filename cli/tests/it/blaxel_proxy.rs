//! Blaxel's official Python SDK, unmodified, against `sandcove serve --blaxel` through the
//! listener's HTTPS proxy.
//!
//! The Python SDK's control-plane URL is fixed (`https://api.blaxel.ai/v0`), so it reaches
//! Sandcove the way a user's program does: with `HTTPS_PROXY` (the Blaxel listener, which
//! terminates `CONNECT api.blaxel.ai:443` with a leaf from the Sandcove CA) and
//! `SSL_CERT_DIR` (that CA's hashed directory, then the host's roots), exactly as `sandcove env
//! blaxel` prints them; never a patched SDK. Each test provisions the pinned SDK
//! (`fixtures/python/pins-blaxel-0.4.24.txt`) on first use through the shared harness,
//! starts the built server with a private state directory, runs one program from
//! `fixtures/python/` and compares its output with the `.expected` file beside it. Nothing
//! leaves loopback: the proxy answers for `api.blaxel.ai` itself and refuses other hosts.

use std::process::Command;

use crate::common::bin;
use crate::sdk_harness::{self, assert_expected, run_python, Server};
use sandcove_conformance::images::{shell_image, MARKER_PATH};
use serde_json::Value;

const PINS: &str = "pins-blaxel-0.4.24.txt";
const ANNOUNCE: &str = "Blaxel wire protocol";

fn start() -> Server {
    Server::start("blaxel", ANNOUNCE, &sandcove_conformance::unique("bl-key"))
}

/// The sandboxes of a list answer (a bare array, or a page's `data`).
fn items(list: &Value) -> Vec<Value> {
    list.get("data")
        .unwrap_or(list)
        .as_array()
        .unwrap_or_else(|| panic!("a list of sandboxes: {list}"))
        .clone()
}

/// `GET {origin}{path}` on the listener in plain HTTP with the server's key.
fn get(server: &Server, path: &str) -> (u16, Value) {
    let (status, bytes) = call(server, "GET", path, None);
    let text = String::from_utf8_lossy(&bytes).into_owned();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// One plain-HTTP call to the listener with the server's key: (status, body bytes).
fn call(server: &Server, method: &str, path: &str, body: Option<Value>) -> (u16, Vec<u8>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut request = reqwest::Client::builder()
            .no_proxy()
            .build()
            .unwrap()
            .request(method.parse().unwrap(), format!("{}{path}", server.origin))
            .header("X-Blaxel-Authorization", format!("Bearer {}", server.key))
            .header("X-Blaxel-Workspace", "sandcove")
            .header("Accept", "application/octet-stream, application/json");
        if let Some(body) = body {
            request = request.json(&body);
        }
        let resp = request.send().await.expect("the listener answers");
        let status = resp.status().as_u16();
        (status, resp.bytes().await.unwrap().to_vec())
    })
}

/// `sandcove env blaxel` points the Python SDK at the listener's proxy and at the bundle in
/// the server's state directory, and `sandcove ca` names the same files.
#[test]
fn env_and_ca_name_the_proxy_and_the_bundle() {
    let server = start();
    let vars = server.env().expect("sandcove env blaxel");
    let var = |name: &str| {
        vars.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("{name} in {vars:?}"))
    };
    assert_eq!(var("HTTPS_PROXY"), server.origin);
    let ca_dir = server.state.dir.join("blaxel-ca");
    let bundle = ca_dir.join("bundle.pem").display().to_string();
    let text = std::fs::read_to_string(&bundle).expect("the bundle exists");
    assert!(text.contains("BEGIN CERTIFICATE"), "{bundle}");
    // The hashed directories where the host has hashed roots (this suite's SDK programs
    // then verify through them), else the bundle.
    match sandcove::server::intercept::ssl_cert_dir(&ca_dir) {
        Some(dirs) => {
            assert_eq!(var("SSL_CERT_DIR"), dirs);
            assert!(dirs.starts_with(&format!("{}:", ca_dir.join("certs").display())));
            assert!(!vars.iter().any(|(k, _)| k == "SSL_CERT_FILE"), "{vars:?}");
        }
        None => assert_eq!(var("SSL_CERT_FILE"), bundle),
    }
    assert_eq!(var("BL_API_URL"), format!("{}/v0", server.origin));

    let out = Command::new(bin())
        .arg("ca")
        .env("SANDCOVE_STATE_DIR", &server.state.dir)
        .output()
        .expect("sandcove ca");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains(&bundle), "{stdout}");
    assert!(
        stdout.contains("api.blaxel.ai, run.blaxel.ai, api.blaxel.dev, run.blaxel.dev only"),
        "{stdout}"
    );
    assert!(stdout.contains("rm -r"), "{stdout}");
}

/// The Python README's sandbox quickstart, verbatim: create-if-not-exists with every
/// documented option, get, delete by class, delete by instance. It prints nothing; the
/// sandbox is gone afterwards.
#[test]
fn python_sdk_readme_quickstart_verbatim() {
    let server = start();
    let out = run_python(PINS, "blaxel_quickstart", &server, &[]);
    assert_expected("blaxel_quickstart", &out);
    let (status, list) = get(&server, "/v0/sandboxes");
    assert_eq!(status, 200, "{list}");
    let live: Vec<Value> = items(&list)
        .into_iter()
        .filter(|s| s["metadata"]["name"] == "my-sandbox" && s["status"] != "TERMINATED")
        .filter(|s| s["status"] != "DELETING")
        .collect();
    assert!(
        live.is_empty(),
        "the quickstart deleted its sandbox: {list}"
    );
}

/// The Python README's filesystem snippet, verbatim, on the sandbox it expects
/// (`my-sandbox`, made here first): text and binary files (`./image.png` is beside the
/// program), mkdir, ls, grep, find, watch. It prints nothing; the files are there afterwards.
#[test]
fn python_sdk_readme_filesystem_verbatim() {
    let server = start();
    let (status, body) = call(
        &server,
        "POST",
        "/v0/sandboxes",
        Some(serde_json::json!({"metadata": {"name": "my-sandbox"}})),
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let out = run_python(PINS, "blaxel_readme_filesystem", &server, &[]);
    assert_expected("blaxel_readme_filesystem", &out);
    let (status, config) = call(
        &server,
        "GET",
        "/blaxel-sbx/my-sandbox/filesystem//app/config.json",
        None,
    );
    assert_eq!(status, 200);
    assert_eq!(config, br#"{"key": "value"}"#);
    let (status, image) = call(
        &server,
        "GET",
        "/blaxel-sbx/my-sandbox/filesystem//app/image.png",
        None,
    );
    assert_eq!(status, 200);
    let expected = std::fs::read(sdk_harness::py_fixtures().join("image.png")).unwrap();
    assert_eq!(image, expected, "the binary file arrived unchanged");
    let (status, listing) = get(&server, "/blaxel-sbx/my-sandbox/filesystem//app");
    assert_eq!(status, 200);
    let dirs = listing["subdirectories"].to_string();
    assert!(dirs.contains("uploads"), "{listing}");
}

/// The control plane through the proxy: create with envs, labels and ttl, create if not
/// exists, get, list, label and ttl updates, public and private previews (with a token) that
/// reach a server in the sandbox, the second delete of a name; and streamed (NDJSON) output.
#[test]
fn python_sdk_control_plane_through_the_proxy() {
    let server = start();
    let out = run_python(PINS, "blaxel_control_plane", &server, &[]);
    assert_expected("blaxel_control_plane", &out);
}

/// The sandbox API the control plane's `metadata.url` names: processes (output, a
/// non-zero exit, logs) and files (text, binary, directories, removal, a missing file).
#[test]
fn python_sdk_data_plane_after_the_proxy() {
    let server = start();
    let out = run_python(PINS, "blaxel_data_plane", &server, &[]);
    assert_expected("blaxel_data_plane", &out);
}

/// Large files through the Python SDK's own upload paths: a 3 MiB text file in one JSON
/// request (under the SDK's 5 MiB multipart threshold, over the listener's 1 MiB JSON limit)
/// and a 12 MiB binary file as a multipart upload of 5 MiB parts, each read back equal.
#[test]
fn python_sdk_writes_large_files() {
    let server = start();
    let out = run_python(PINS, "blaxel_large_files", &server, &[]);
    assert_expected("blaxel_large_files", &out);
}

/// What were gaps, as the Python SDK calls them: a full `Sandbox` with
/// `metadata.external_id` and the API client's `get_sandbox_by_external_id`, `stdin` with
/// `write_stdin`/`close_stdin` (409 without an open stdin), `fetch`/`network.fetch` to a
/// server in the sandbox (the SDK's credentials not passed on, a 404 returned), and
/// `archive`/`unarchive`.
#[test]
fn python_sdk_external_ids_stdin_fetch_and_archive() {
    let server = start();
    let out = run_python(PINS, "blaxel_fetch_stdin_archive", &server, &[]);
    assert_expected("blaxel_fetch_stdin_archive", &out);
}

/// Snapshots and fork as the Python SDK calls them through the proxy: `sandbox.snapshots`
/// (create, list, get by name, restore by name, delete by name), the deprecated `snapshot` and
/// `list_snapshots`, fork live and from a snapshot (with envs), the workspace `Snapshot` class
/// (create, get, paged list, fork once the source is deleted, delete in both forms) and the
/// SDK's errors for unknown snapshots, taken names and foreign snapshots.
#[test]
fn python_sdk_snapshots_restore_and_fork() {
    let server = start();
    let out = run_python(PINS, "blaxel_snapshots", &server, &[]);
    assert_expected("blaxel_snapshots", &out);
}

/// A missing sandbox and a foreign host through the proxy: the SDK's own 404, and httpx's
/// `ProxyError` for the refused CONNECT (403).
#[test]
fn python_sdk_bad_input() {
    let server = start();
    let out = run_python(PINS, "blaxel_bad_input", &server, &[]);
    assert_expected("blaxel_bad_input", &out);
}

/// A wrong key: `401` before anything is created.
#[test]
fn python_sdk_wrong_key() {
    let server = start();
    let out = run_python(
        PINS,
        "blaxel_wrong_key",
        &server,
        &[("BL_API_KEY", "not-the-key")],
    );
    assert_expected("blaxel_wrong_key", &out);
    let (status, list) = get(&server, "/v0/sandboxes");
    assert_eq!(status, 200, "{list}");
    assert!(items(&list).is_empty(), "nothing created: {list}");
}

/// A plain-HTTP call that must succeed, with its JSON answer.
fn ok(server: &Server, method: &str, path: &str, body: Option<Value>) -> Value {
    let (status, bytes) = call(server, method, path, body);
    let text = String::from_utf8_lossy(&bytes).into_owned();
    assert_eq!(status, 200, "{method} {path}: {text}");
    serde_json::from_str(&text).unwrap_or(Value::String(text))
}

/// Run `command` in sandbox `name` from the test (to prepare what a README snippet assumes
/// of Blaxel's images) and wait for it to succeed.
fn prepare(server: &Server, name: &str, command: &str) {
    let done = ok(
        server,
        "POST",
        &format!("/blaxel-sbx/{name}/process"),
        Some(serde_json::json!({"command": command, "waitForCompletion": true})),
    );
    assert_eq!(done["exitCode"], 0, "{command}: {done}");
}

/// A GET of `url` (a preview) with `headers`: the status, or `None` when nothing answers.
fn fetch_status(url: &str, headers: &[(&str, &str)]) -> Option<u16> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut request = reqwest::Client::builder()
            .no_proxy()
            .build()
            .unwrap()
            .get(url);
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        Some(request.send().await.ok()?.status().as_u16())
    })
}

/// Preview tokens through the SDK: `tokens.create` (named by the server when the SDK sends no
/// name), `tokens.list` with values, `tokens.create_if_expired` reusing the latest live token,
/// `tokens.delete(name)` after which that token is refused while the other still opens the
/// preview, a second delete (404), and a deleted preview taking its tokens with it.
#[test]
fn python_sdk_preview_tokens_list_and_delete() {
    let server = start();
    let out = run_python(PINS, "blaxel_preview_tokens", &server, &[]);
    assert_expected("blaxel_preview_tokens", &out);
}

/// The Python README's preview snippet, verbatim, on what it assumes of Blaxel's images: a
/// sandbox `my-sandbox` with `python` on its PATH and an `/app` directory (prepared here).
/// It starts a web server, makes the private `preview-3000` and a token with
/// `create_if_expired`; afterwards the token is listed and opens the preview, and deleting it
/// over the wire makes the preview refuse it.
#[test]
fn python_sdk_readme_preview_verbatim() {
    let server = start();
    ok(
        &server,
        "POST",
        "/v0/sandboxes",
        Some(
            serde_json::json!({"metadata": {"name": "my-sandbox"}, "spec": {"runtime": {
            "envs": [{"name": "PATH", "value": "/app/bin:/usr/local/bin:/usr/bin:/bin"}]}}}),
        ),
    );
    prepare(
        &server,
        "my-sandbox",
        "mkdir -p /app/bin && ln -s /usr/bin/python3 /app/bin/python && echo readme > /app/index.txt",
    );
    let out = run_python(PINS, "blaxel_readme_preview", &server, &[]);
    assert_expected("blaxel_readme_preview", &out);
    let preview = ok(
        &server,
        "GET",
        "/v0/sandboxes/my-sandbox/previews/preview-3000",
        None,
    );
    assert_eq!(preview["spec"]["public"], false, "{preview}");
    let url = preview["spec"]["url"].as_str().expect("a URL").to_string();
    let tokens = ok(
        &server,
        "GET",
        "/v0/sandboxes/my-sandbox/previews/preview-3000/tokens",
        None,
    );
    let tokens = tokens.as_array().expect("a list of tokens").clone();
    assert_eq!(tokens.len(), 1, "create_if_expired made one: {tokens:?}");
    let value = tokens[0]["spec"]["token"].as_str().unwrap().to_string();
    let token_name = tokens[0]["metadata"]["name"].as_str().unwrap().to_string();
    let header = [("X-Blaxel-Preview-Token", value.as_str())];
    assert_eq!(fetch_status(&url, &header), Some(200), "the token opens it");
    assert_eq!(fetch_status(&url, &[]), Some(401), "private");
    ok(
        &server,
        "DELETE",
        &format!("/v0/sandboxes/my-sandbox/previews/preview-3000/tokens/{token_name}"),
        None,
    );
    assert_eq!(
        fetch_status(&url, &header),
        Some(401),
        "a deleted token no longer opens the preview"
    );
    let tokens = ok(
        &server,
        "GET",
        "/v0/sandboxes/my-sandbox/previews/preview-3000/tokens",
        None,
    );
    assert_eq!(
        tokens,
        serde_json::json!([]),
        "deleted tokens are not listed"
    );
}

/// The Python README's process snippet, verbatim, on an `/app` with a `build` script
/// (prepared here; Blaxel's images bring their own app). `npm run build` runs to completion;
/// the snippet then kills `build-process`, which has already exited: Blaxel answers that with
/// an error (the SDK raises), and so does Sandcove, so the program ends with the SDK's
/// exception after the build ran. `blaxel_readme_process.expected` is the last line of its
/// stderr.
#[test]
fn python_sdk_readme_process_verbatim() {
    let server = start();
    ok(
        &server,
        "POST",
        "/v0/sandboxes",
        Some(serde_json::json!({"metadata": {"name": "my-sandbox"}})),
    );
    ok(
        &server,
        "PUT",
        "/blaxel-sbx/my-sandbox/filesystem//app/package.json",
        Some(serde_json::json!({ "content": APP_PACKAGE })),
    );
    let out = run_python(PINS, "blaxel_readme_process", &server, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "the kill of an exited process raises: {stderr}"
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "");
    let last = stderr.lines().last().unwrap_or("").to_string() + "\n";
    let expected =
        std::fs::read_to_string(sdk_harness::py_fixtures().join("blaxel_readme_process.expected"))
            .unwrap();
    assert_eq!(last, expected, "{stderr}");
    let (status, built) = call(
        &server,
        "GET",
        "/blaxel-sbx/my-sandbox/filesystem//app/dist.txt",
        None,
    );
    assert_eq!(
        (status, built.as_slice()),
        (200, &b"built"[..]),
        "npm run build ran"
    );
}

/// The `/app/package.json` the README's process snippets assume: `build` writes `dist.txt`.
const APP_PACKAGE: &str = r#"{"name":"app","private":true,"scripts":{"build":"node -e \"require('fs').writeFileSync('dist.txt','built')\""}}"#;

/// `fs.cp`: the plain copy (`cp -r` as a process) and `no_overwrite` (one runtime copy,
/// served at `/filesystem-copy`): a file, a directory into an existing directory, and an
/// existing target refused with the SDK's `FileExistsError`, unchanged.
#[test]
fn python_sdk_copies_files() {
    let server = start();
    let out = run_python(PINS, "blaxel_cp", &server, &[]);
    assert_expected("blaxel_cp", &out);
}

/// Every documented gap a Python program reaches answers the SDK's own error, naming the
/// feature and its alternative.
#[test]
fn python_sdk_gaps_name_the_alternative() {
    let server = start();
    let out = run_python(PINS, "blaxel_gaps", &server, &[]);
    assert_expected("blaxel_gaps", &out);
}

/// `BL_WORKSPACE` naming another workspace: `403 UNAUTHORIZED_WORKSPACE` before anything is
/// created.
#[test]
fn python_sdk_wrong_workspace() {
    let server = start();
    let out = run_python(
        PINS,
        "blaxel_wrong_workspace",
        &server,
        &[("BL_WORKSPACE", "another-workspace")],
    );
    assert_expected("blaxel_wrong_workspace", &out);
    let (status, list) = get(&server, "/v0/sandboxes");
    assert_eq!(status, 200, "{list}");
    assert!(items(&list).is_empty(), "nothing created: {list}");
}

/// `SandboxInstance.create({"image": …})` naming an image imported into the server's store
/// runs that image: its files, environment and working directory; an image that is not
/// stored is the control plane's 404 (the generated client's `UnexpectedStatus`), saying how
/// to store it.
#[test]
fn python_sdk_runs_an_imported_image() {
    let server = start();
    let reference = "test.local/blaxel-sdk:1";
    crate::images::import(
        &server.state.dir,
        &shell_image("blaxel-image-marker").build(),
        reference,
    );
    let out = run_python(
        PINS,
        "blaxel_images",
        &server,
        &[("IMAGE", reference), ("MARKER_PATH", MARKER_PATH)],
    );
    assert_expected("blaxel_images", &out);
}
