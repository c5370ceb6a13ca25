//! The workspace's layering, checked over the crate graph `cargo metadata` reports: each
//! crate may depend only on the crates below it, so an arrow that runs the wrong way fails
//! here (and, for the crates themselves, does not compile).
//!
//! ```text
//! sandcove-core  <-  sandcove-agent  <-  sandcove-engine  ->  sandcove-image (stands alone)
//!       ^                  ^
//!       |                  +------------  sandcove-kube
//!       +---  sandcove-http, sandcove-server
//! sandcove (the umbrella) re-exports them; the facades depend on the umbrella and take its
//! server only through their `wire` feature.
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use serde_json::Value;

/// The workspace crates each runtime crate may depend on (normal dependencies).
const ALLOWED: &[(&str, &[&str])] = &[
    ("sandcove-core", &[]),
    ("sandcove-agent", &["sandcove-core"]),
    (
        "sandcove-engine",
        &["sandcove-core", "sandcove-agent", "sandcove-image"],
    ),
    ("sandcove-http", &["sandcove-core"]),
    ("sandcove-server", &["sandcove-core"]),
    ("sandcove-kube", &["sandcove-core", "sandcove-agent"]),
    // The image store stands alone: the engine runs images from it (the CLI reaches it
    // through the engine).
    ("sandcove-image", &[]),
    (
        "sandcove",
        &[
            "sandcove-core",
            "sandcove-agent",
            "sandcove-engine",
            "sandcove-http",
            "sandcove-server",
            "sandcove-kube",
        ],
    ),
    ("sandcove-conformance", &["sandcove"]),
    ("sandcove-compat-support", &["sandcove"]),
    ("sandcove-interpreter", &["sandcove"]),
    (
        "compat-e2b",
        &[
            "sandcove",
            "sandcove-compat-support",
            "sandcove-interpreter",
        ],
    ),
    ("compat-daytona", &["sandcove", "sandcove-compat-support"]),
    (
        "compat-blaxel",
        &[
            "sandcove",
            "sandcove-compat-support",
            "sandcove-interpreter",
        ],
    ),
];

/// Crates no runtime crate may reach, even through others: what each must build without.
const NEVER_REACHES: &[(&str, &[&str])] = &[
    ("sandcove-kube", &["sandcove-engine", "sandcove-server"]),
    ("sandcove-http", &["sandcove-engine", "sandcove-server"]),
    ("sandcove-server", &["sandcove-http", "sandcove-engine"]),
    ("sandcove-engine", &["sandcove-http", "sandcove-server"]),
];

struct Workspace {
    /// Each workspace package's normal dependencies on other workspace packages.
    deps: BTreeMap<String, BTreeSet<String>>,
    /// The raw metadata of each workspace package.
    packages: BTreeMap<String, Value>,
}

fn workspace() -> Workspace {
    let out = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: Value = serde_json::from_slice(&out.stdout).expect("metadata is JSON");
    let packages: BTreeMap<String, Value> = meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|p| (p["name"].as_str().unwrap().to_string(), p.clone()))
        .collect();
    let deps = packages
        .iter()
        .map(|(name, p)| {
            let on: BTreeSet<String> = p["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| d["kind"].is_null())
                .map(|d| d["name"].as_str().unwrap().to_string())
                .filter(|d| packages.contains_key(d))
                .collect();
            (name.clone(), on)
        })
        .collect();
    Workspace { deps, packages }
}

#[test]
fn each_crate_depends_only_on_the_layers_below_it() {
    let ws = workspace();
    let mut wrong = Vec::new();
    for (name, allowed) in ALLOWED {
        let deps = ws
            .deps
            .get(*name)
            .unwrap_or_else(|| panic!("{name} is not in the workspace"));
        for dep in deps {
            if !allowed.contains(&dep.as_str()) {
                wrong.push(format!("{name} -> {dep}"));
            }
        }
    }
    assert!(wrong.is_empty(), "arrows that run the wrong way: {wrong:?}");
}

#[test]
fn runtime_crates_never_reach_what_they_must_build_without() {
    let ws = workspace();
    for (name, never) in NEVER_REACHES {
        let mut reached = BTreeSet::new();
        let mut todo = vec![name.to_string()];
        while let Some(next) = todo.pop() {
            for dep in ws.deps.get(&next).into_iter().flatten() {
                if reached.insert(dep.clone()) {
                    todo.push(dep.clone());
                }
            }
        }
        for forbidden in *never {
            assert!(
                !reached.contains(*forbidden),
                "{name} reaches {forbidden} (through {reached:?})"
            );
        }
    }
}

/// A facade used as a plain Rust dependency builds without the HTTP server: its `sandcove`
/// dependency takes no default features and not `server`, which only `wire` adds.
#[test]
fn facades_take_the_server_only_with_their_wire_feature() {
    let ws = workspace();
    for facade in ["compat-e2b", "compat-daytona", "compat-blaxel"] {
        let p = &ws.packages[facade];
        let dep = p["dependencies"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["name"] == "sandcove" && d["kind"].is_null())
            .unwrap_or_else(|| panic!("{facade} depends on sandcove"));
        assert_eq!(dep["uses_default_features"], false, "{facade}: {dep}");
        let features: Vec<&str> = dep["features"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f.as_str().unwrap())
            .collect();
        assert!(!features.contains(&"server"), "{facade}: {features:?}");
        let feature_map = p["features"].as_object().unwrap();
        let enables_server = |feature: &str| {
            feature_map[feature]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f == "sandcove/server")
        };
        assert!(enables_server("wire"), "{facade}: wire adds the server");
        for default in feature_map["default"].as_array().unwrap() {
            let default = default.as_str().unwrap();
            assert!(
                default != "wire" && !enables_server(default),
                "{facade}: default feature {default} adds the server"
            );
        }
    }
}

/// The umbrella's default features are what `cargo add sandcove` expects: the engine, the
/// client and the server; its workspace dependency takes none, so members choose.
#[test]
fn the_umbrella_keeps_its_defaults() {
    let ws = workspace();
    let features = ws.packages["sandcove"]["features"].as_object().unwrap();
    let default: BTreeSet<&str> = features["default"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    assert_eq!(default, BTreeSet::from(["local", "http", "server"]));
}
