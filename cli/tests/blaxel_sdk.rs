//! Blaxel's official TypeScript SDK (`@blaxel/core`), unmodified, against
//! `sandcove serve --blaxel`.
//!
//! Each test provisions the pinned SDK (`fixtures/js/blaxel/package-lock.json`, `npm ci`,
//! under the build directory) on first use, starts the built `sandcove serve` on free
//! loopback ports with a private state directory, points the SDK at it with exactly the
//! lines `sandcove env blaxel` prints, runs one program from `fixtures/js/blaxel/` and
//! compares its output with the `.expected` file beside it. A machine without `node` or
//! `npm` fails these tests, saying so.

mod common;
mod sdk_harness;

use std::time::Duration;

use sdk_harness::{check_node, Server};
use serde_json::Value;

const ANNOUNCE: &str = "Blaxel wire protocol";
const DIR: &str = "blaxel";

/// One call to the Blaxel listener with `key`: (status, JSON body).
fn call(server: &Server, key: &str, method: &str, path: &str) -> (u16, Value) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let resp = reqwest::Client::new()
            .request(method.parse().unwrap(), format!("{}{path}", server.origin))
            .header("X-Blaxel-Authorization", format!("Bearer {key}"))
            .header("X-Blaxel-Workspace", "sandcove")
            .send()
            .await
            .expect("the listener answers");
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
