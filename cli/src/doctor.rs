//! `sandcove doctor`: what this host supports, each missing piece with its remedy; exit 1
//! when sandboxes cannot be created.
//!
//! The decisive check is a real one: a sandbox is created, runs `true` and is destroyed.
//! The others explain why that fails or which optional features are missing; what the
//! runtime itself knows (user-mode networking, cgroup limits) comes from its capabilities
//! and its create check, not from probes of our own.

use serde::Serialize;
use std::time::Duration;

use sandcove::client::URL_ENV;
use sandcove::{CheckStatus, Command, CreateOptions, NetworkPolicy, ProcessSpec};

use crate::out::{self, Outcome};

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Level {
    /// Present.
    Ok,
    /// Missing, but sandboxes work without it (a feature is unavailable).
    Warn,
    /// Missing, and sandboxes cannot be created.
    Fail,
}

/// One check's result.
#[derive(Debug, Serialize)]
struct Check {
    name: &'static str,
    status: Level,
    detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    remedy: Option<String>,
}

fn check(
    name: &'static str,
    status: Level,
    detail: impl Into<String>,
    remedy: Option<String>,
) -> Check {
    Check {
        name,
        status,
        detail: detail.into(),
        remedy,
    }
}

fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// User namespaces: the kernel's switches that decide whether this user may create them.
fn user_namespaces() -> Check {
    let name = "user namespaces";
    match read_trimmed("/proc/sys/user/max_user_namespaces").as_deref() {
        None => {
            return check(
                name,
                Level::Fail,
                "the kernel has no user namespaces (/proc/sys/user/max_user_namespaces is missing)",
                Some("use a kernel built with CONFIG_USER_NS".into()),
            )
        }
        Some("0") => {
            return check(
                name,
                Level::Fail,
                "disabled: user.max_user_namespaces = 0",
                Some("sudo sysctl -w user.max_user_namespaces=15000".into()),
            )
        }
        _ => {}
    }
    let root = rustix::process::geteuid().is_root();
    if !root {
        if read_trimmed("/proc/sys/kernel/unprivileged_userns_clone").as_deref() == Some("0") {
            return check(
                name,
                Level::Fail,
                "unprivileged user namespaces are disabled (kernel.unprivileged_userns_clone = 0)",
                Some("sudo sysctl -w kernel.unprivileged_userns_clone=1".into()),
            );
        }
        if read_trimmed("/proc/sys/kernel/apparmor_restrict_unprivileged_userns").as_deref()
            == Some("1")
        {
            return check(
                name,
                Level::Fail,
                "AppArmor restricts unprivileged user namespaces \
                 (kernel.apparmor_restrict_unprivileged_userns = 1)",
                Some(
                    "sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0, or an \
                     AppArmor profile granting `userns` to the sandcove binary"
                        .into(),
                ),
            );
        }
    }
    check(name, Level::Ok, "available", None)
}

/// Seccomp filters (the kernel reports the field only when it supports them).
fn seccomp() -> Check {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    if status.lines().any(|l| l.starts_with("Seccomp:")) {
        check("seccomp", Level::Ok, "available", None)
    } else {
        check(
            "seccomp",
            Level::Fail,
            "the kernel does not report seccomp support",
            Some("use a kernel built with CONFIG_SECCOMP_FILTER".into()),
        )
    }
}

/// `python3` on PATH, which the code interpreters run.
fn python3() -> Check {
    let found = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("python3"))
            .find(|p| {
                std::fs::metadata(p)
                    .map(|m| {
                        m.is_file()
                            && std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111
                                != 0
                    })
                    .unwrap_or(false)
            })
    });
    match found {
        Some(path) => check("python3", Level::Ok, path.display().to_string(), None),
        None => check(
            "python3",
            Level::Warn,
            "not found on PATH: code interpreters (run_code) are unavailable",
            Some("install python3 (Debian/Ubuntu: sudo apt-get install python3)".into()),
        ),
    }
}

/// Whether E2B's `get_host(port)` names (`PORT-ID.localhost:PORT`) reach the loopback for
/// programs that use the system's resolver.
fn localhost_names() -> Check {
    match crate::localhost::this_host() {
        Ok(module) => check(
            "localhost names",
            Level::Ok,
            format!("*.localhost resolves to the loopback (nss module {module})"),
            None,
        ),
        Err(why) => check(
            "localhost names",
            Level::Warn,
            format!(
                "{why}: E2B's get_host(port) names reach the listener only from programs that                  resolve *.localhost themselves (curl, browsers)"
            ),
            Some(crate::localhost::REMEDY.into()),
        ),
    }
}

/// `sandcove doctor`.
/// Whether this host's engine can run images, and how: a sandbox of a one-layer image,
/// created and destroyed (its root overlayfs mounted in the sandbox's own user namespace,
/// else the layers copied, as the engine's mode allows).
fn image_roots(rt: &tokio::runtime::Runtime) -> Check {
    use sandcove::backend::local::images::{ImageRootMode, IMAGE_ROOT_ENV};
    let probed = sandcove::LocalBackend::new()
        .and_then(|engine| rt.block_on(sandcove::backend::local::images::probe(&engine)));
    match probed {
        Ok(ImageRootMode::Copy) => check(
            "images",
            Level::Ok,
            format!(
                "image roots are copied into each sandbox's disk (overlayfs unavailable, or \
                 {IMAGE_ROOT_ENV}=copy): creates are slower, the image counts against the \
                 disk, snapshots hold the whole root"
            ),
            None,
        ),
        Ok(_) => check(
            "images",
            Level::Ok,
            "image roots mount (overlayfs in a user namespace)",
            None,
        ),
        Err(e) => check(
            "images",
            Level::Warn,
            format!("sandboxes cannot run images here: {}", out::describe(&e)),
            Some(
                "Linux 5.11 or later with overlayfs (mountable in user namespaces, with \
                 userxattr) and user xattrs on the state directory's file system; the host \
                 base still runs"
                    .into(),
            ),
        ),
    }
}

pub fn doctor(json: bool) -> Outcome {
    let mut checks = vec![user_namespaces(), seccomp()];
    let runtime_name = match std::env::var(URL_ENV).ok().filter(|u| !u.is_empty()) {
        Some(url) => format!("server {url}"),
        None => format!(
            "embedded engine (state in {})",
            sandcove::backend::local::default_state_dir().display()
        ),
    };
    let rt = out::runtime()?;
    let client = match out::client() {
        Ok(client) => Some(client),
        Err(failure) => {
            checks.push(check("runtime", Level::Fail, failure.message, None));
            None
        }
    };
    let mut can_create = false;
    if let Some(client) = &client {
        match rt.block_on(client.ready()) {
            Ok(caps) => {
                checks.push(if caps.memory_limit {
                    check(
                        "cgroup limits",
                        Level::Ok,
                        "memory and CPU limits are enforced",
                        None,
                    )
                } else {
                    check(
                        "cgroup limits",
                        Level::Warn,
                        "no writable cgroup: memory and CPU limits are refused (pids are still \
                         bounded per sandbox)",
                        Some(
                            "run under a delegated cgroup v2 subtree (e.g. `systemd-run --user \
                             --scope -p Delegate=yes sandcove …`), or as root on cgroup v1"
                                .into(),
                        ),
                    )
                });
                if !caps.isolated {
                    checks.push(check(
                        "isolation",
                        Level::Warn,
                        "sandboxes run WITHOUT isolation from this host (explicit opt-in)",
                        Some("run on a host with user namespaces".into()),
                    ));
                }
            }
            Err(e) => checks.push(check("runtime", Level::Fail, out::describe(&e), None)),
        }
        let mut internet = CreateOptions::default();
        internet.network = NetworkPolicy::Internet;
        checks.push(match rt.block_on(client.check_create(&internet)) {
            Ok(CheckStatus::Supported(_)) => check(
                "user-mode networking",
                Level::Ok,
                "internet access available (pasta)",
                None,
            ),
            Ok(CheckStatus::Unavailable { reason, remedy }) => {
                check("user-mode networking", Level::Warn, reason, Some(remedy))
            }
            Ok(CheckStatus::Unsupported {
                feature,
                alternative,
            }) => check(
                "user-mode networking",
                Level::Warn,
                format!("not supported: {feature}"),
                Some(alternative),
            ),
            Ok(other) => check(
                "user-mode networking",
                Level::Warn,
                format!("{other:?}"),
                None,
            ),
            Err(e) => check("user-mode networking", Level::Warn, out::describe(&e), None),
        });
        // The decisive check: a real sandbox, a real process.
        let mut options = CreateOptions::default();
        options.timeout = Some(Duration::from_secs(60));
        options.labels.insert("sandcove.doctor".into(), "1".into());
        let created = rt.block_on(async {
            let sandbox = client.create(options).await?;
            let ran = sandbox.run(ProcessSpec::new(Command::argv(["true"]))).await;
            let destroyed = sandbox.destroy().await;
            let status = ran?.exit_status();
            destroyed?;
            if status.success() {
                Ok(())
            } else {
                Err(sandcove::Error::Backend {
                    message: format!("`true` in a new sandbox ended with {status:?}"),
                    retryable: false,
                })
            }
        });
        checks.push(match created {
            Ok(()) => {
                can_create = true;
                check(
                    "create a sandbox",
                    Level::Ok,
                    "created one, ran `true`, destroyed it",
                    None,
                )
            }
            Err(e) => check("create a sandbox", Level::Fail, out::describe(&e), None),
        });
    }
    // Images, on this host's engine (a server answers for its own host).
    if can_create && std::env::var(URL_ENV).map_or(true, |u| u.is_empty()) {
        checks.push(image_roots(&rt));
    }
    checks.push(python3());
    checks.push(localhost_names());
    if json {
        out::print_json(&serde_json::json!({
            "runtime": runtime_name,
            "can_create": can_create,
            "checks": checks,
        }))?;
    } else {
        println!("runtime: {runtime_name}");
        for c in &checks {
            let mark = match c.status {
                Level::Ok => "ok  ",
                Level::Warn => "warn",
                Level::Fail => "FAIL",
            };
            println!("{mark}  {:<21} {}", c.name, c.detail);
            if let Some(remedy) = &c.remedy {
                println!("      {:<21} remedy: {remedy}", "");
            }
        }
        println!(
            "{}",
            if can_create {
                "sandboxes can be created here"
            } else {
                "sandboxes CANNOT be created here: see the remedies above"
            }
        );
    }
    Ok(if can_create { 0 } else { out::FAILED })
}
