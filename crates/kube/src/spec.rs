//! The Kubernetes objects [`KubeBackend`](super::KubeBackend) sends, built as plain data
//! before anything is sent (and table-tested as such): the sandbox Pod, its labels and
//! annotations, the selectors of `list`, the delete options, the egress policies and volume
//! claims. No I/O here.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities as KubeCaps, Container, ContainerPort, EmptyDirVolumeSource, EnvVar,
    PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeClaimVolumeSource, Pod,
    PodSecurityContext, PodSpec, Probe, ResourceRequirements, SeccompProfile, SecurityContext,
    TCPSocketAction, Volume, VolumeMount as KubeVolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy as KubeNetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyPeer,
    NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{DeleteParams, ListParams, PropagationPolicy};
use serde::{Deserialize, Serialize};

use sandcove_core::{
    Error, NetworkPolicy, Resources, Result, SandboxInfo, SandboxState, TimeoutAction, UnixMillis,
    UserInfo, VolumeMount,
};

/// `app.kubernetes.io/managed-by` on everything this backend creates.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "sandcove");
/// The label carrying a Pod's sandbox id.
pub const SANDBOX_LABEL: &str = "sandcove.dev/sandbox";
/// The label carrying a hash of a sandbox's unique name (names may not be label values).
pub const NAME_LABEL: &str = "sandcove.dev/name-hash";
/// The label saying which egress policy applies (`none` or `internet`).
pub const NETWORK_LABEL: &str = "sandcove.dev/network";
/// The prefix of the sandbox's own labels, as Kubernetes labels.
pub const USER_LABEL_PREFIX: &str = "label.sandcove.dev/";
/// The annotation holding the sandbox's record ([`PodRecord`], JSON).
pub const RECORD_ANNOTATION: &str = "sandcove.dev/record";
/// The annotation holding the sandbox's own annotations (JSON object).
pub const ANNOTATIONS_ANNOTATION: &str = "sandcove.dev/annotations";
/// The annotation of a volume claim holding the volume's name.
pub const VOLUME_ANNOTATION: &str = "sandcove.dev/volume";
/// The label of a volume claim marking it as a Sandcove volume.
pub const VOLUME_LABEL: &str = "sandcove.dev/volume";
/// The container's name in every sandbox Pod.
pub const CONTAINER: &str = "sandbox";
/// The init container that brings the agent into a sandbox running another image.
pub const AGENT_INIT_CONTAINER: &str = "sandcove-agent";
/// Where the agent's static binary is mounted in a sandbox running another image (an
/// `emptyDir` the init container fills from the sandbox image, read-only in the sandbox).
pub const AGENT_DIR: &str = "/.sandcove";
/// Where the sandbox image keeps the static `sandcove` binary (deploy/Containerfile).
pub const AGENT_IN_IMAGE: &str = "/usr/local/bin/sandcove";
/// The namespace-wide policy denying all egress to Pods labelled `network=none`.
pub const DENY_EGRESS_POLICY: &str = "sandcove-deny-egress";
/// The namespace-wide policy letting Pods labelled `network=internet` reach the public
/// internet only (no private, loopback or link-local ranges; DNS on port 53).
pub const INTERNET_EGRESS_POLICY: &str = "sandcove-internet-egress";
/// Environment of the in-pod agent: the address it listens on.
pub const ENV_LISTEN: &str = sandcove_agent::pod::LISTEN_ENV;
/// Environment of the in-pod agent: hex SHA-256 of its token (never the token itself).
pub const ENV_TOKEN_SHA256: &str = sandcove_agent::pod::TOKEN_SHA256_ENV;
/// Environment of the in-pod agent: the sandbox id.
pub const ENV_SANDBOX: &str = sandcove_agent::pod::SANDBOX_ENV;
/// Environment of the in-pod agent: the sandbox-wide environment of every process (JSON).
pub const ENV_ENVS: &str = sandcove_agent::pod::ENVS_ENV;
/// Environment of the in-pod agent: `RLIMIT_NOFILE` of every process.
pub const ENV_MAX_OPEN_FILES: &str = sandcove_agent::pod::MAX_OPEN_FILES_ENV;
/// Environment of the in-pod agent: the user name it reports.
pub const ENV_USER: &str = sandcove_agent::pod::USER_ENV;
/// Environment of the in-pod agent: the home and default working directory.
pub const ENV_HOME: &str = sandcove_agent::pod::HOME_ENV;

/// What a Pod needs beyond the sandbox's own options: the deployment's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct PodParams {
    /// The namespace.
    pub namespace: String,
    /// The image (whose entrypoint is `sandcove agent --listen`).
    pub image: String,
    /// `runtimeClassName` (gVisor, Kata), if any.
    pub runtime_class: Option<String>,
    /// The agent's TCP port.
    pub agent_port: u16,
    /// The uid and gid the container runs as (never 0).
    pub uid: i64,
    /// Seconds the kubelet gives the agent between SIGTERM and SIGKILL.
    pub grace_seconds: u32,
    /// `activeDeadlineSeconds`: the hard ceiling on the Pod's life, enforced by the kubelet
    /// even when no Sandcove server is running.
    pub deadline_seconds: i64,
}

/// The sandbox's state kept in the Pod's annotations: enough for any serving process (a
/// restarted one included) to answer `get`/`list`, rebuild the lease and serve calls.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PodRecord {
    /// The sandbox id.
    pub id: String,
    /// The unique name, if any.
    #[serde(default)]
    pub name: Option<String>,
    /// Template name: `base` (the configured sandbox image), or the image reference the
    /// sandbox's container runs (the agent brought in by an init container).
    pub template: String,
    /// The sandbox's labels, all of them (only some fit Kubernetes labels).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Sandbox-wide environment, applied to every process the backend starts.
    #[serde(default)]
    pub envs: BTreeMap<String, String>,
    /// Resources in force.
    #[serde(default)]
    pub resources: Resources,
    /// Network policy in force.
    #[serde(default)]
    pub network: NetworkPolicy,
    /// The default user.
    pub user: UserInfo,
    /// Creation time (ms).
    pub created_at: UnixMillis,
    /// Lease end (ms).
    pub ends_at: UnixMillis,
    /// Volumes mounted.
    #[serde(default)]
    pub volumes: Vec<VolumeMount>,
    /// The Pod's hostname, if one was asked for (else a prefix of the id).
    #[serde(default)]
    pub hostname: Option<String>,
    /// Set while the sandbox is stopped: the lease time it had left, in ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_left_ms: Option<u64>,
}

/// The Pod name of sandbox `id`.
pub fn pod_name(id: &str) -> String {
    format!("sandcove-{id}")
}

/// The sandbox id of a Pod name made by [`pod_name`].
pub fn sandbox_id(pod: &str) -> Option<&str> {
    pod.strip_prefix("sandcove-")
        .filter(|id| sandcove_agent::valid_id(id))
}

/// Hex of the first 20 bytes of SHA-256(`text`): a label value standing for any string.
pub fn label_hash(text: &str) -> String {
    hex(&ring::digest::digest(&ring::digest::SHA256, text.as_bytes()).as_ref()[..20])
}

/// Lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether `s` is a Kubernetes label name (the part after a prefix) or, with `empty_ok`, a
/// label value: at most 63 of `[A-Za-z0-9-_.]`, starting and ending with a letter or digit.
pub fn is_label_part(s: &str, empty_ok: bool) -> bool {
    if s.is_empty() {
        return empty_ok;
    }
    let b = s.as_bytes();
    b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// The Kubernetes label standing for a sandbox label, when the key and value fit label
/// syntax; other labels live only in the record (and are filtered on after the list).
pub fn user_label(key: &str, value: &str) -> Option<(String, String)> {
    (is_label_part(key, false) && is_label_part(value, true))
        .then(|| (format!("{USER_LABEL_PREFIX}{key}"), value.to_string()))
}

/// Every Kubernetes label of a sandbox Pod.
pub fn pod_labels(record: &PodRecord) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([
        (MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string()),
        (SANDBOX_LABEL.to_string(), record.id.clone()),
        (
            NETWORK_LABEL.to_string(),
            network_label(&record.network).to_string(),
        ),
    ]);
    if let Some(name) = &record.name {
        labels.insert(NAME_LABEL.to_string(), label_hash(name));
    }
    labels.extend(record.labels.iter().filter_map(|(k, v)| user_label(k, v)));
    labels
}

/// The value of [`NETWORK_LABEL`] for a policy.
pub fn network_label(network: &NetworkPolicy) -> &'static str {
    match network {
        NetworkPolicy::Internet => "internet",
        _ => "none",
    }
}

/// The label selector of a `list`: every managed sandbox, narrowed by the name and by each
/// filter label that fits label syntax (the rest is filtered on afterwards).
pub fn list_selector(options: &sandcove_core::ListOptions) -> String {
    let mut terms = vec![format!("{}={}", MANAGED_BY.0, MANAGED_BY.1)];
    if let Some(name) = &options.name {
        terms.push(format!("{NAME_LABEL}={}", label_hash(name)));
    }
    for (k, v) in &options.labels {
        if let Some((key, value)) = user_label(k, v) {
            terms.push(format!("{key}={value}"));
        }
    }
    terms.join(",")
}

/// The list parameters of a `list` (see [`list_selector`]).
pub fn list_params(options: &sandcove_core::ListOptions) -> ListParams {
    ListParams::default().labels(&list_selector(options))
}

/// The delete options of a destroy: the grace period, foreground-free (a Pod owns nothing).
pub fn delete_params(grace_seconds: u32) -> DeleteParams {
    DeleteParams {
        grace_period_seconds: Some(grace_seconds),
        propagation_policy: Some(PropagationPolicy::Background),
        ..DeleteParams::default()
    }
}

/// The container's resources: requests equal to limits (a guaranteed share), from the
/// sandbox's CPU, memory and disk.
pub fn resources(r: &Resources) -> Option<ResourceRequirements> {
    let mut limits = BTreeMap::new();
    if let Some(cpu) = r.cpu {
        limits.insert(
            "cpu".to_string(),
            Quantity(format!("{}m", (cpu * 1000.0).ceil() as u64)),
        );
    }
    if let Some(mib) = r.memory_mib {
        limits.insert("memory".to_string(), Quantity(format!("{mib}Mi")));
    }
    if let Some(mib) = r.disk_mib {
        limits.insert(
            "ephemeral-storage".to_string(),
            Quantity(format!("{mib}Mi")),
        );
    }
    (!limits.is_empty()).then(|| ResourceRequirements {
        requests: Some(limits.clone()),
        limits: Some(limits),
        ..Default::default()
    })
}

/// The volume name inside the Pod of the `i`th mount.
fn mount_volume(i: usize) -> String {
    format!("vol-{i}")
}

/// The claim name of Sandcove volume `name`.
pub fn claim_name(name: &str) -> String {
    format!("sandcove-vol-{}", label_hash(name))
}

/// The sandbox Pod, hardened: non-root, no privilege escalation, every capability dropped,
/// the runtime's default seccomp profile, a read-only root with `emptyDir`s for `/tmp` and the
/// home, no service-account token, no service links, the lease's hard ceiling as
/// `activeDeadlineSeconds`.
pub fn pod(
    params: &PodParams,
    record: &PodRecord,
    token_sha256: &str,
    annotations: &BTreeMap<String, String>,
) -> Result<Pod> {
    let record_json = serde_json::to_string(record)
        .map_err(|e| Error::backend(format!("sandbox record: {e}")))?;
    let annotations_json = serde_json::to_string(annotations)
        .map_err(|e| Error::backend(format!("sandbox annotations: {e}")))?;
    let envs_json = serde_json::to_string(&record.envs)
        .map_err(|e| Error::backend(format!("sandbox envs: {e}")))?;
    let home = record.user.home.clone();
    let size_limit = record
        .resources
        .disk_mib
        .map(|mib| Quantity(format!("{mib}Mi")));
    let mut volumes = vec![
        Volume {
            name: "tmp".into(),
            empty_dir: Some(EmptyDirVolumeSource {
                size_limit: size_limit.clone(),
                ..Default::default()
            }),
            ..Default::default()
        },
        Volume {
            name: "home".into(),
            empty_dir: Some(EmptyDirVolumeSource {
                size_limit,
                ..Default::default()
            }),
            ..Default::default()
        },
    ];
    let mut mounts = vec![
        KubeVolumeMount {
            name: "tmp".into(),
            mount_path: "/tmp".into(),
            ..Default::default()
        },
        KubeVolumeMount {
            name: "home".into(),
            mount_path: home.clone(),
            ..Default::default()
        },
    ];
    for (i, mount) in record.volumes.iter().enumerate() {
        volumes.push(Volume {
            name: mount_volume(i),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim_name(&mount.volume),
                read_only: Some(mount.read_only),
            }),
            ..Default::default()
        });
        mounts.push(KubeVolumeMount {
            name: mount_volume(i),
            mount_path: mount.path.clone(),
            sub_path: mount.subpath.clone(),
            read_only: Some(mount.read_only),
            ..Default::default()
        });
    }
    let env = |name: &str, value: String| EnvVar {
        name: name.into(),
        value: Some(value),
        ..Default::default()
    };
    let mut envs = vec![
        env(ENV_LISTEN, format!("0.0.0.0:{}", params.agent_port)),
        env(ENV_TOKEN_SHA256, token_sha256.to_string()),
        env(ENV_SANDBOX, record.id.clone()),
        env(ENV_USER, record.user.name.clone()),
        env(ENV_HOME, home.clone()),
        env(ENV_ENVS, envs_json),
        env("HOME", home.clone()),
    ];
    // Every other variable the agent reads is set too (empty: its default), after the
    // image's `Env` as a container's `env` is: an image's `Env` configures none of them.
    envs.extend([
        env(
            sandcove_agent::pod::HELLO_TIMEOUT_ENV,
            sandcove_agent::pod::DEFAULT_HELLO_TIMEOUT
                .as_millis()
                .to_string(),
        ),
        env(
            sandcove_agent::pod::MAX_CONNECTIONS_ENV,
            sandcove_agent::pod::DEFAULT_MAX_CONNECTIONS.to_string(),
        ),
        // The container's own `/`.
        env(sandcove_agent::pod::ROLE_ENV, String::new()),
        env(sandcove_agent::pod::ROOT_ENV, String::new()),
        env(
            ENV_MAX_OPEN_FILES,
            record
                .resources
                .max_open_files
                .map(|n| n.to_string())
                .unwrap_or_default(),
        ),
    ]);
    // A sandbox of another image runs that image, with the agent's static binary copied
    // in by an init container of the sandbox image (an `emptyDir`, read-only in the sandbox).
    let own_image = (!sandcove_core::capability::is_host_base(Some(&record.template)))
        .then(|| record.template.clone());
    let mut init_containers = Vec::new();
    if own_image.is_some() {
        volumes.push(Volume {
            name: "sandcove-agent".into(),
            empty_dir: Some(EmptyDirVolumeSource {
                size_limit: Some(Quantity("128Mi".into())),
                ..Default::default()
            }),
            ..Default::default()
        });
        mounts.push(KubeVolumeMount {
            name: "sandcove-agent".into(),
            mount_path: AGENT_DIR.into(),
            read_only: Some(true),
            ..Default::default()
        });
        init_containers.push(Container {
            name: AGENT_INIT_CONTAINER.into(),
            image: Some(params.image.clone()),
            command: Some(vec![
                "cp".into(),
                AGENT_IN_IMAGE.into(),
                format!("{AGENT_DIR}/sandcove"),
            ]),
            volume_mounts: Some(vec![KubeVolumeMount {
                name: "sandcove-agent".into(),
                mount_path: AGENT_DIR.into(),
                ..Default::default()
            }]),
            security_context: Some(hardened(params.uid)),
            ..Default::default()
        });
    }
    let container = Container {
        name: CONTAINER.into(),
        image: Some(own_image.clone().unwrap_or_else(|| params.image.clone())),
        // The sandbox image's entrypoint is the `sandcove` binary; another image gets it
        // named. The agent's port is the one this backend dials, and the environment
        // configures the rest.
        command: own_image
            .as_ref()
            .map(|_| vec![format!("{AGENT_DIR}/sandcove")]),
        args: Some(vec![
            "agent".into(),
            "--listen".into(),
            format!("0.0.0.0:{}", params.agent_port),
        ]),
        env: Some(envs),
        working_dir: Some(home),
        ports: Some(vec![ContainerPort {
            name: Some("agent".into()),
            container_port: i32::from(params.agent_port),
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        readiness_probe: Some(Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::Int(i32::from(params.agent_port)),
                ..Default::default()
            }),
            period_seconds: Some(1),
            ..Default::default()
        }),
        resources: resources(&record.resources),
        security_context: Some(hardened(params.uid)),
        volume_mounts: Some(mounts),
        ..Default::default()
    };
    Ok(Pod {
        metadata: ObjectMeta {
            name: Some(pod_name(&record.id)),
            namespace: Some(params.namespace.clone()),
            labels: Some(pod_labels(record)),
            annotations: Some(BTreeMap::from([
                (RECORD_ANNOTATION.to_string(), record_json),
                (ANNOTATIONS_ANNOTATION.to_string(), annotations_json),
            ])),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![container],
            init_containers: (!init_containers.is_empty()).then_some(init_containers),
            restart_policy: Some("Never".into()),
            active_deadline_seconds: Some(params.deadline_seconds),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            hostname: Some(
                record
                    .hostname
                    .clone()
                    .unwrap_or_else(|| record.id.chars().take(12).collect()),
            ),
            runtime_class_name: params.runtime_class.clone(),
            termination_grace_period_seconds: Some(i64::from(params.grace_seconds)),
            security_context: Some(PodSecurityContext {
                run_as_non_root: Some(true),
                run_as_user: Some(params.uid),
                run_as_group: Some(params.uid),
                fs_group: Some(params.uid),
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".into(),
                    localhost_profile: None,
                }),
                ..Default::default()
            }),
            volumes: Some(volumes),
            ..Default::default()
        }),
        status: None,
    })
}

/// Every container's security context: never root, no privilege, no capability, a
/// read-only root filesystem, the runtime's default seccomp profile.
fn hardened(uid: i64) -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        privileged: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        run_as_user: Some(uid),
        run_as_group: Some(uid),
        capabilities: Some(KubeCaps {
            drop: Some(vec!["ALL".into()]),
            add: None,
        }),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            localhost_profile: None,
        }),
        ..Default::default()
    }
}

/// The record and annotations a Pod carries, or `None` for a Pod that is not a well-formed
/// sandbox Pod (never served, never trusted).
pub fn record_of(pod: &Pod) -> Option<(PodRecord, BTreeMap<String, String>)> {
    let annotations = pod.metadata.annotations.as_ref()?;
    let record: PodRecord = serde_json::from_str(annotations.get(RECORD_ANNOTATION)?).ok()?;
    if pod.metadata.name.as_deref().and_then(sandbox_id) != Some(record.id.as_str()) {
        return None;
    }
    let own = match annotations.get(ANNOTATIONS_ANNOTATION) {
        Some(text) => serde_json::from_str(text).ok()?,
        None => BTreeMap::new(),
    };
    Some((record, own))
}

/// Whether the Pod's container is ready (the agent is listening).
pub fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Why the kubelet cannot pull one of the Pod's images (`ErrImagePull`, `ImagePullBackOff`,
/// `InvalidImageName`, with its message), if that is where a container waits.
pub fn image_pull_failure(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    let statuses = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten());
    for container in statuses {
        let waiting = container.state.as_ref().and_then(|s| s.waiting.as_ref());
        if let Some(waiting) = waiting {
            let reason = waiting.reason.as_deref().unwrap_or_default();
            if matches!(
                reason,
                "ErrImagePull" | "ImagePullBackOff" | "InvalidImageName"
            ) {
                let message = waiting.message.as_deref().unwrap_or_default();
                return Some(format!("{reason}: {message}"));
            }
        }
    }
    None
}

/// The Pod's phase (`Pending`, `Running`, `Succeeded`, `Failed`), if reported.
pub fn phase(pod: &Pod) -> Option<&str> {
    pod.status.as_ref().and_then(|s| s.phase.as_deref())
}

/// The sandbox state a Pod stands for.
pub fn state_of(pod: &Pod) -> SandboxState {
    if pod.metadata.deletion_timestamp.is_some() {
        return SandboxState::Destroyed;
    }
    match phase(pod) {
        Some("Failed") | Some("Succeeded") => SandboxState::Failed,
        Some("Running") if is_ready(pod) => SandboxState::Running,
        _ => SandboxState::Starting,
    }
}

/// What the backend reports about a sandbox Pod.
pub fn info_of(pod: &Pod) -> Option<SandboxInfo> {
    let (record, annotations) = record_of(pod)?;
    let state = match state_of(pod) {
        SandboxState::Running if record.stopped_left_ms.is_some() => SandboxState::Stopped,
        other => other,
    };
    Some(SandboxInfo {
        id: record.id,
        name: record.name,
        state,
        template: record.template,
        labels: record.labels,
        envs: record.envs,
        resources: record.resources,
        network: record.network,
        user: record.user,
        created_at: record.created_at,
        ends_at: record.ends_at,
        on_timeout: TimeoutAction::Destroy,
        auto_resume: false,
        volumes: record.volumes,
        snapshot: None,
        annotations,
        note: None,
        source_resume_error: None,
        working_dir: None,
    })
}

/// The namespace-wide egress policies: [`DENY_EGRESS_POLICY`] (no egress at all for
/// `network=none`) and [`INTERNET_EGRESS_POLICY`] (public addresses only for
/// `network=internet`). Ingress is left to the deployment (see `deploy/`), which admits the
/// serving process to the agent port.
pub fn egress_policies(namespace: &str) -> Vec<KubeNetworkPolicy> {
    let meta = |name: &str| ObjectMeta {
        name: Some(name.into()),
        namespace: Some(namespace.into()),
        labels: Some(BTreeMap::from([(
            MANAGED_BY.0.to_string(),
            MANAGED_BY.1.to_string(),
        )])),
        ..Default::default()
    };
    let selecting = |value: &str| LabelSelector {
        match_labels: Some(BTreeMap::from([
            (MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string()),
            (NETWORK_LABEL.to_string(), value.to_string()),
        ])),
        ..Default::default()
    };
    let block = |cidr: &str, except: &[&str]| NetworkPolicyPeer {
        ip_block: Some(IPBlock {
            cidr: cidr.into(),
            except: Some(except.iter().map(|s| s.to_string()).collect()),
        }),
        ..Default::default()
    };
    let dns = ["UDP", "TCP"]
        .iter()
        .map(|p| NetworkPolicyPort {
            port: Some(IntOrString::Int(53)),
            protocol: Some(p.to_string()),
            ..Default::default()
        })
        .collect();
    vec![
        KubeNetworkPolicy {
            metadata: meta(DENY_EGRESS_POLICY),
            spec: Some(NetworkPolicySpec {
                pod_selector: Some(selecting("none")),
                policy_types: Some(vec!["Egress".into()]),
                egress: Some(vec![]),
                ..Default::default()
            }),
        },
        KubeNetworkPolicy {
            metadata: meta(INTERNET_EGRESS_POLICY),
            spec: Some(NetworkPolicySpec {
                pod_selector: Some(selecting("internet")),
                policy_types: Some(vec!["Egress".into()]),
                egress: Some(vec![
                    NetworkPolicyEgressRule {
                        to: Some(vec![
                            block(
                                "0.0.0.0/0",
                                &[
                                    "0.0.0.0/8",
                                    "10.0.0.0/8",
                                    "100.64.0.0/10",
                                    "127.0.0.0/8",
                                    "169.254.0.0/16",
                                    "172.16.0.0/12",
                                    "192.168.0.0/16",
                                ],
                            ),
                            block("::/0", &["::1/128", "fc00::/7", "fe80::/10"]),
                        ]),
                        ports: None,
                    },
                    // Name resolution through the cluster's resolver.
                    NetworkPolicyEgressRule {
                        to: None,
                        ports: Some(dns),
                    },
                ]),
                ..Default::default()
            }),
        },
    ]
}

/// The claim of a Sandcove volume: `ReadWriteOnce`, the configured size, the name in an
/// annotation (claim names are hashes, so any volume name fits).
pub fn volume_claim(
    namespace: &str,
    name: &str,
    size_mib: u64,
    storage_class: Option<&str>,
) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(claim_name(name)),
            namespace: Some(namespace.into()),
            labels: Some(BTreeMap::from([
                (MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string()),
                (VOLUME_LABEL.to_string(), "true".to_string()),
            ])),
            annotations: Some(BTreeMap::from([(
                VOLUME_ANNOTATION.to_string(),
                name.to_string(),
            )])),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_string(),
                    Quantity(format!("{size_mib}Mi")),
                )])),
                ..Default::default()
            }),
            storage_class_name: storage_class.map(str::to_string),
            ..Default::default()
        }),
        status: None,
    }
}

/// The label selector of the volume list.
pub fn volume_selector() -> String {
    format!("{}={},{VOLUME_LABEL}=true", MANAGED_BY.0, MANAGED_BY.1)
}
