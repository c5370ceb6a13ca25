//! Request shapes: the exact objects and parameters the Kubernetes backend sends, built as
//! data (no API server involved).

use std::collections::BTreeMap;

use serde_json::json;

use super::spec::{self, PodParams, PodRecord};
use super::*;
use sandcove_core::{ErrorCode, Resources};

fn params() -> PodParams {
    PodParams {
        namespace: "sandboxes".into(),
        image: "registry.example/sandcove:1".into(),
        runtime_class: Some("gvisor".into()),
        agent_port: 7711,
        uid: 1000,
        grace_seconds: 5,
        deadline_seconds: 86400,
    }
}

fn record() -> PodRecord {
    PodRecord {
        id: "abc123".into(),
        name: Some("build-7".into()),
        template: "base".into(),
        labels: BTreeMap::from([
            ("team".into(), "ml".into()),
            ("with space".into(), "x".into()),
        ]),
        envs: BTreeMap::from([("GREETING".into(), "hi".into())]),
        resources: {
            let mut options = Resources::default();
            options.cpu = Some(1.5);
            options.memory_mib = Some(512);
            options.disk_mib = Some(2048);
            options
        },
        network: NetworkPolicy::None,
        user: UserInfo {
            name: "user".into(),
            uid: 1000,
            gid: 1000,
            home: "/workspace".into(),
        },
        created_at: 1_000,
        ends_at: 301_000,
        volumes: Vec::new(),
        hostname: None,
        stopped_left_ms: None,
    }
}

#[test]
fn the_pod_is_hardened_and_carries_its_state() {
    let annotations = BTreeMap::from([("vendor/x".to_string(), "1".to_string())]);
    let pod = spec::pod(&params(), &record(), "f00d", &annotations).unwrap();
    let pod = serde_json::to_value(&pod).unwrap();
    let meta = &pod["metadata"];
    assert_eq!(meta["name"], "sandcove-abc123");
    assert_eq!(meta["namespace"], "sandboxes");
    assert_eq!(
        meta["labels"],
        json!({
            "app.kubernetes.io/managed-by": "sandcove",
            "sandcove.dev/sandbox": "abc123",
            "sandcove.dev/network": "none",
            "sandcove.dev/name-hash": spec::label_hash("build-7"),
            // "with space" does not fit a label key: kept only in the record.
            "label.sandcove.dev/team": "ml",
        })
    );
    let recorded: PodRecord = serde_json::from_str(
        meta["annotations"][spec::RECORD_ANNOTATION]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(recorded, record());
    assert_eq!(
        meta["annotations"][spec::ANNOTATIONS_ANNOTATION],
        json!(r#"{"vendor/x":"1"}"#)
    );

    let spec = &pod["spec"];
    assert_eq!(spec["restartPolicy"], "Never");
    assert_eq!(spec["activeDeadlineSeconds"], 86400);
    assert_eq!(spec["automountServiceAccountToken"], false);
    assert_eq!(spec["enableServiceLinks"], false);
    assert_eq!(spec["runtimeClassName"], "gvisor");
    assert_eq!(spec["terminationGracePeriodSeconds"], 5);
    assert_eq!(spec["hostname"], "abc123");
    assert_eq!(
        spec["securityContext"],
        json!({
            "runAsNonRoot": true, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000,
            "seccompProfile": {"type": "RuntimeDefault"},
        })
    );
    let containers = spec["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1);
    let c = &containers[0];
    assert_eq!(c["image"], "registry.example/sandcove:1");
    assert_eq!(c["args"], json!(["agent", "--listen", "0.0.0.0:7711"]));
    assert_eq!(
        c["securityContext"],
        json!({
            "allowPrivilegeEscalation": false,
            "privileged": false,
            "readOnlyRootFilesystem": true,
            "runAsNonRoot": true,
            "runAsUser": 1000,
            "runAsGroup": 1000,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        })
    );
    assert_eq!(
        c["env"],
        json!([
            {"name": "SANDCOVE_AGENT_LISTEN", "value": "0.0.0.0:7711"},
            {"name": "SANDCOVE_AGENT_TOKEN_SHA256", "value": "f00d"},
            {"name": "SANDCOVE_AGENT_SANDBOX", "value": "abc123"},
            {"name": "SANDCOVE_AGENT_USER", "value": "user"},
            {"name": "SANDCOVE_AGENT_HOME", "value": "/workspace"},
            {"name": "SANDCOVE_AGENT_ENVS", "value": r#"{"GREETING":"hi"}"#},
            {"name": "HOME", "value": "/workspace"},
            {"name": "SANDCOVE_AGENT_HELLO_TIMEOUT_MS", "value": "10000"},
            {"name": "SANDCOVE_AGENT_MAX_CONNECTIONS", "value": "256"},
            {"name": "__SANDCOVE_ROLE", "value": ""},
            {"name": "SANDCOVE_AGENT_ROOT", "value": ""},
            {"name": "SANDCOVE_AGENT_MAX_OPEN_FILES", "value": ""},
        ])
    );
    let quantities = json!({"cpu": "1500m", "memory": "512Mi", "ephemeral-storage": "2048Mi"});
    assert_eq!(
        c["resources"],
        json!({"limits": quantities, "requests": quantities})
    );
    assert_eq!(
        c["volumeMounts"],
        json!([
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "home", "mountPath": "/workspace"},
        ])
    );
    assert_eq!(
        spec["volumes"],
        json!([
            {"name": "tmp", "emptyDir": {"sizeLimit": "2048Mi"}},
            {"name": "home", "emptyDir": {"sizeLimit": "2048Mi"}},
        ])
    );
    assert_eq!(c["readinessProbe"]["tcpSocket"]["port"], 7711);
    // The token itself is nowhere in the Pod.
    let token = agent_token(&[7u8; 32], "abc123");
    assert!(!pod.to_string().contains(&token));
}

/// A sandbox of another image: the Pod's container runs that image, named to the agent's
/// binary, which an init container of the sandbox image copies into a read-only `emptyDir`;
/// every container is hardened alike. A kubelet that cannot pull it is a not-found.
#[test]
fn an_image_is_the_container_image_with_the_agent_brought_in() {
    let mut of_image = record();
    of_image.template = "python:3.12-slim".into();
    let pod = spec::pod(&params(), &of_image, "f00d", &BTreeMap::new()).unwrap();
    let pod = serde_json::to_value(&pod).unwrap();
    let spec = &pod["spec"];
    let c = &spec["containers"][0];
    assert_eq!(c["image"], "python:3.12-slim");
    assert_eq!(c["command"], json!(["/.sandcove/sandcove"]));
    assert_eq!(c["args"], json!(["agent", "--listen", "0.0.0.0:7711"]));
    let agent_mount = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == "/.sandcove")
        .expect("the agent's directory is mounted");
    assert_eq!(agent_mount["readOnly"], true);
    let init = &spec["initContainers"][0];
    assert_eq!(init["image"], "registry.example/sandcove:1");
    assert_eq!(
        init["command"],
        json!(["cp", "/usr/local/bin/sandcove", "/.sandcove/sandcove"])
    );
    assert_eq!(init["securityContext"], c["securityContext"]);
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert!(spec["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|v| v["name"] == "sandcove-agent" && v["emptyDir"].is_object()));
    // The host base's Pod has neither.
    let base = spec::pod(&params(), &record(), "f00d", &BTreeMap::new()).unwrap();
    let base = serde_json::to_value(&base).unwrap();
    assert!(base["spec"]["initContainers"].is_null());
    assert!(base["spec"]["containers"][0]["command"].is_null());
    let pulling: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "status": {"containerStatuses": [{
            "name": "sandbox", "image": "python:3.12-slim", "imageID": "", "ready": false,
            "restartCount": 0,
            "state": {"waiting": {"reason": "ImagePullBackOff", "message": "not found"}}
        }]}
    }))
    .unwrap();
    assert_eq!(
        spec::image_pull_failure(&pulling).as_deref(),
        Some("ImagePullBackOff: not found")
    );
}

#[test]
fn volumes_become_claims_mounted_at_their_paths() {
    let mut r = record();
    r.volumes = vec![serde_json::from_value(json!({
        "volume": "data", "path": "/data", "subpath": "run-1", "read_only": true
    }))
    .unwrap()];
    let pod = spec::pod(&params(), &r, "f00d", &BTreeMap::new()).unwrap();
    let pod = serde_json::to_value(&pod).unwrap();
    let claim = spec::claim_name("data");
    assert_eq!(
        pod["spec"]["volumes"][2],
        json!({"name": "vol-0", "persistentVolumeClaim": {"claimName": claim, "readOnly": true}})
    );
    assert_eq!(
        pod["spec"]["containers"][0]["volumeMounts"][2],
        json!({"name": "vol-0", "mountPath": "/data", "subPath": "run-1", "readOnly": true})
    );
    let pvc = serde_json::to_value(spec::volume_claim("sandboxes", "data", 1024, None)).unwrap();
    assert_eq!(pvc["metadata"]["name"], claim);
    assert_eq!(
        pvc["metadata"]["annotations"]["sandcove.dev/volume"],
        "data"
    );
    assert_eq!(pvc["spec"]["accessModes"], json!(["ReadWriteOnce"]));
    assert_eq!(pvc["spec"]["resources"]["requests"]["storage"], "1024Mi");
}

#[test]
fn list_filters_are_label_selectors() {
    let mut options = ListOptions::default();
    assert_eq!(
        spec::list_selector(&options),
        "app.kubernetes.io/managed-by=sandcove"
    );
    options.name = Some("Build_7.".into());
    options.labels = BTreeMap::from([
        ("team".into(), "ml".into()),
        ("odd key!".into(), "v".into()),
        ("k".into(), "-not-a-label-value".into()),
    ]);
    assert_eq!(
        spec::list_selector(&options),
        format!(
            "app.kubernetes.io/managed-by=sandcove,sandcove.dev/name-hash={},\
             label.sandcove.dev/team=ml",
            spec::label_hash("Build_7.")
        )
    );
    assert_eq!(
        spec::list_params(&options).label_selector.as_deref(),
        Some(spec::list_selector(&options).as_str())
    );
}

#[test]
fn destroy_deletes_with_the_grace_period() {
    let params = spec::delete_params(5);
    assert_eq!(params.grace_period_seconds, Some(5));
    assert_eq!(
        serde_json::to_value(&params).unwrap(),
        json!({"gracePeriodSeconds": 5, "propagationPolicy": "Background"})
    );
}

#[test]
fn egress_policies_deny_by_default_and_keep_internet_off_private_ranges() {
    let policies = serde_json::to_value(spec::egress_policies("sandboxes")).unwrap();
    let deny = &policies[0];
    assert_eq!(deny["metadata"]["name"], spec::DENY_EGRESS_POLICY);
    assert_eq!(
        deny["spec"],
        json!({
            "podSelector": {"matchLabels": {
                "app.kubernetes.io/managed-by": "sandcove", "sandcove.dev/network": "none"}},
            "policyTypes": ["Egress"],
            "egress": [],
        })
    );
    let internet = &policies[1];
    assert_eq!(
        internet["spec"]["podSelector"]["matchLabels"]["sandcove.dev/network"],
        "internet"
    );
    let except = &internet["spec"]["egress"][0]["to"][0]["ipBlock"]["except"];
    for private in [
        "10.0.0.0/8",
        "169.254.0.0/16",
        "127.0.0.0/8",
        "192.168.0.0/16",
    ] {
        assert!(
            except.as_array().unwrap().contains(&json!(private)),
            "{private}"
        );
    }
}

#[test]
fn api_statuses_map_to_core_errors() {
    let cases = [
        (400, "BadRequest", ErrorCode::InvalidArgument),
        (401, "Unauthorized", ErrorCode::Unauthenticated),
        (403, "Forbidden", ErrorCode::Unavailable),
        (404, "NotFound", ErrorCode::NotFound),
        (409, "AlreadyExists", ErrorCode::AlreadyExists),
        (409, "Conflict", ErrorCode::Conflict),
        (422, "Invalid", ErrorCode::InvalidArgument),
        (429, "TooManyRequests", ErrorCode::RateLimited),
        (500, "InternalError", ErrorCode::Backend),
        (503, "ServiceUnavailable", ErrorCode::Backend),
    ];
    for (code, reason, want) in cases {
        let e = from_status("sandbox \"x\"", code, reason, "m");
        assert_eq!(e.code(), want, "{code} {reason}: {e:?}");
    }
    assert!(from_status("x", 500, "InternalError", "m").is_retryable());
    assert!(!from_status("x", 422, "Invalid", "m").is_retryable());
}

#[test]
fn tokens_are_derived_per_sandbox_and_only_their_hash_is_sent() {
    let key = [9u8; 32];
    let a = agent_token(&key, "aaaa");
    assert_eq!(
        a,
        agent_token(&key, "aaaa"),
        "a restarted server recomputes it"
    );
    assert_ne!(a, agent_token(&key, "aaab"));
    assert_ne!(a, agent_token(&[8u8; 32], "aaaa"));
    assert_eq!(a.len(), 64);
    assert_eq!(token_sha256(&a).len(), 64);
    assert_ne!(token_sha256(&a), a);
    let mut config = KubeConfig::new("ns", "img", vec![1; 8]);
    assert_eq!(
        config.check().unwrap_err().code(),
        ErrorCode::InvalidArgument
    );
    config.key = vec![1; 32];
    config.uid = 0;
    assert_eq!(
        config.check().unwrap_err().code(),
        ErrorCode::InvalidArgument
    );
}

#[test]
fn pod_state_follows_phase_readiness_and_deletion() {
    let mut pod = spec::pod(&params(), &record(), "f", &BTreeMap::new()).unwrap();
    assert_eq!(spec::state_of(&pod), SandboxState::Starting);
    pod.status = Some(
        serde_json::from_value(json!({"phase": "Running", "podIP": "10.0.0.7",
            "conditions": [{"type": "Ready", "status": "True"}]}))
        .unwrap(),
    );
    assert_eq!(spec::state_of(&pod), SandboxState::Running);
    let info = spec::info_of(&pod).unwrap();
    assert_eq!(info.id, "abc123");
    assert_eq!(info.name.as_deref(), Some("build-7"));
    assert_eq!(info.labels.get("with space").map(String::as_str), Some("x"));
    pod.status.as_mut().unwrap().phase = Some("Failed".into());
    assert_eq!(spec::state_of(&pod), SandboxState::Failed);
    // A Pod whose name does not match its record is not served.
    pod.metadata.name = Some("sandcove-other".into());
    assert!(spec::record_of(&pod).is_none());
}

/// An image's `Env` comes before a container's `env`, so a Pod that sets every variable the
/// in-pod agent reads leaves an image none to set (its hello timeout, connection cap, root):
/// each is in the container's `env`, once, with its value or empty for the default.
#[test]
fn every_agent_variable_is_set_so_an_image_env_sets_none() {
    let mut of_image = record();
    of_image.template = "python:3.12-slim".into();
    for record in [record(), of_image] {
        let pod = spec::pod(&params(), &record, "f00d", &BTreeMap::new()).unwrap();
        let pod = serde_json::to_value(&pod).unwrap();
        let env = pod["spec"]["containers"][0]["env"]
            .as_array()
            .unwrap()
            .clone();
        let role: Vec<_> = env
            .iter()
            .filter(|e| e["name"] == sandcove_agent::pod::ROLE_ENV)
            .collect();
        assert_eq!(role.len(), 1, "the role variable set once: {env:?}");
        assert_eq!(
            role[0]["value"], "",
            "set empty: no role, whatever the image's Env"
        );
        for name in sandcove_agent::pod::CONFIG_ENVS {
            let set: Vec<_> = env.iter().filter(|e| e["name"] == *name).collect();
            assert_eq!(set.len(), 1, "{name} set once: {env:?}");
            assert!(set[0]["value"].is_string(), "{name} has a value: {env:?}");
        }
    }
}
