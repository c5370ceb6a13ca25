//! The sandbox lifecycle from a terminal: `ls`, `info`, `create`, `kill`, `pause`, `resume`,
//! `set-timeout`.

use clap::{Args, ValueEnum};
use sandcove::{CreateOptions, ListOptions, NetworkPolicy, SandboxInfo};
use serde_json::json;

use crate::out::{self, Failure, Outcome};

/// `sandcove ls`.
#[derive(Debug, Args)]
pub struct LsArgs {
    /// Only sandboxes with this label (KEY=VALUE; repeat to require several).
    #[arg(long = "label", value_name = "KEY=VALUE")]
    pub labels: Vec<String>,
}

/// `sandcove create`.
#[derive(Debug, Args)]
pub struct CreateArgs {
    /// A unique name (letters, digits, `-`, `_`, `.`).
    #[arg(long)]
    pub name: Option<String>,
    /// A label (KEY=VALUE; repeatable).
    #[arg(long = "label", value_name = "KEY=VALUE")]
    pub labels: Vec<String>,
    /// A sandbox-wide environment variable (KEY=VALUE; repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE")]
    pub envs: Vec<String>,
    /// The lease: the sandbox ends this long after creation unless renewed (`90`, `30s`,
    /// `10m`, `1h`). Default: the runtime's.
    #[arg(long, value_name = "DURATION", value_parser = out::parse_duration)]
    pub timeout: Option<std::time::Duration>,
    /// Network access: `none` (loopback only, the default) or `internet` (user-mode
    /// networking; the host's own addresses stay unreachable).
    #[arg(long, value_enum, default_value_t = Network::None)]
    pub network: Network,
    /// The image the sandbox's root is made of (a reference such as `python:3.12-slim`,
    /// stored first with `sandcove image pull` or `import`). Default: the host base.
    #[arg(long, value_name = "REFERENCE")]
    pub image: Option<String>,
}

/// The network policies a human may pick (sharing the host's network is for programs that
/// opt in knowingly, not a flag).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Network {
    /// Loopback only.
    None,
    /// Outbound internet through user-mode networking.
    Internet,
}

/// `sandcove kill`.
#[derive(Debug, Args)]
pub struct KillArgs {
    /// The sandboxes to destroy.
    #[arg(value_name = "ID")]
    pub ids: Vec<String>,
    /// Destroy every sandbox (with --label: every sandbox carrying those labels).
    #[arg(long, conflicts_with = "ids")]
    pub all: bool,
    /// With --all: only sandboxes with this label (KEY=VALUE; repeatable).
    #[arg(long = "label", value_name = "KEY=VALUE", requires = "all")]
    pub labels: Vec<String>,
}

/// Which vendor's facade made a sandbox, read from the records facades keep on it; `-` for
/// one made through the native API (or by a facade that keeps no record).
pub fn vendor(info: &SandboxInfo) -> &'static str {
    let keys = || info.annotations.keys().chain(info.labels.keys());
    for (vendor, prefixes) in [
        ("blaxel", ["blaxel/", "blaxel."]),
        ("daytona", ["daytona/", "sandcove.daytona/"]),
        ("e2b", ["e2b/", "e2b."]),
    ] {
        if keys().any(|k| prefixes.iter().any(|p| k.starts_with(p))) {
            return vendor;
        }
    }
    "-"
}

fn state_name(info: &SandboxInfo) -> String {
    serde_json::to_value(info.state)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| format!("{:?}", info.state))
}

/// `sandcove ls`.
pub fn ls(args: LsArgs, json: bool) -> Outcome {
    let mut options = ListOptions::default();
    options.labels = out::parse_pairs("label", &args.labels)?;
    let client = out::client()?;
    let mut list = out::runtime()?.block_on(client.list(options))?;
    list.sort_by_key(|info| info.created_at);
    out::print_listing(
        json,
        &list,
        &[
            "ID",
            "NAME",
            "VENDOR",
            "STATE",
            "AGE",
            "LEASE LEFT",
            "LABELS",
        ],
        |info, now| {
            vec![
                info.id.clone(),
                info.name.clone().unwrap_or_else(|| "-".into()),
                vendor(info).into(),
                state_name(info),
                out::human_span(now.saturating_sub(info.created_at)),
                out::human_span(info.ends_at.saturating_sub(now)),
                out::labels_text(&info.labels),
            ]
        },
    )?;
    Ok(0)
}

/// `sandcove info ID`.
pub fn info(id: &str, json: bool) -> Outcome {
    let client = out::client()?;
    let info = out::runtime()?.block_on(async { client.sandbox(id).info().await })?;
    if json {
        out::print_json(&info)?;
        return Ok(0);
    }
    print_info(&info);
    Ok(0)
}

fn print_info(info: &SandboxInfo) {
    let now = sandcove::now_millis();
    let field = |k: &str, v: String| {
        println!("{:<11} {}", format!("{k}:"), out::terminal_text(&v));
    };
    field("id", info.id.clone());
    field("name", info.name.clone().unwrap_or_else(|| "-".into()));
    field("vendor", vendor(info).into());
    field("state", state_name(info));
    field("template", info.template.clone());
    field("age", out::human_span(now.saturating_sub(info.created_at)));
    field(
        "lease left",
        out::human_span(info.ends_at.saturating_sub(now)),
    );
    field(
        "network",
        serde_json::to_value(&info.network)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default(),
    );
    field("user", info.user.name.clone());
    field("labels", out::labels_text(&info.labels));
    field(
        "envs",
        info.envs.keys().cloned().collect::<Vec<_>>().join(","),
    );
    if let Some(snapshot) = &info.snapshot {
        field("snapshot", snapshot.clone());
    }
    for volume in &info.volumes {
        field("volume", format!("{} at {}", volume.volume, volume.path));
    }
    if let Some(note) = &info.note {
        field("note", note.clone());
    }
}

/// `sandcove create`: prints the new sandbox's id.
pub fn create(args: CreateArgs, json: bool) -> Outcome {
    let mut options = CreateOptions::default();
    options.name = args.name;
    options.labels = out::parse_pairs("label", &args.labels)?;
    options.envs = out::parse_pairs("env", &args.envs)?;
    options.timeout = args.timeout;
    options.template = args.image;
    options.network = match args.network {
        Network::None => NetworkPolicy::None,
        Network::Internet => NetworkPolicy::Internet,
    };
    let client = out::client()?;
    let (_, info) = out::runtime()?.block_on(client.create_described(options))?;
    if json {
        out::print_json(&info)?;
    } else {
        println!("{}", info.id);
    }
    Ok(0)
}

/// `sandcove kill`: destroys each sandbox named (or every one matching `--all --label`);
/// exit 1 if any could not be destroyed, after trying all.
pub fn kill(args: KillArgs, json: bool) -> Outcome {
    if args.ids.is_empty() && !args.all {
        return Err(Failure::usage(
            "name the sandboxes to destroy (ID…), or use --all [--label KEY=VALUE]",
        ));
    }
    let client = out::client()?;
    let runtime = out::runtime()?;
    let ids = if args.all {
        let mut options = ListOptions::default();
        options.labels = out::parse_pairs("label", &args.labels)?;
        runtime
            .block_on(client.list(options))?
            .into_iter()
            .map(|info| info.id)
            .collect()
    } else {
        args.ids
    };
    let mut killed = Vec::new();
    let mut failed = Vec::new();
    for id in ids {
        match runtime.block_on(client.sandbox(id.clone()).destroy()) {
            Ok(()) => killed.push(id),
            Err(e) => failed.push((id, out::describe(&e))),
        }
    }
    if json {
        let failed: Vec<_> = failed
            .iter()
            .map(|(id, error)| json!({"id": id, "error": error}))
            .collect();
        out::print_json(&json!({"killed": killed, "failed": failed}))?;
    } else {
        for id in &killed {
            println!("{id}");
        }
    }
    match failed.as_slice() {
        [] => Ok(0),
        [(id, error)] => Err(Failure::failed(format!("{id}: {error}"))),
        many => {
            for (id, error) in many {
                eprintln!("sandcove kill: {id}: {}", out::terminal_text(error));
            }
            Err(Failure::failed(format!(
                "{} sandboxes could not be destroyed",
                many.len()
            )))
        }
    }
}

/// Which lifecycle change `pause`, `resume` and `set-timeout` make.
pub enum Change {
    /// Freeze.
    Pause,
    /// Thaw.
    Resume,
    /// A new lease, counted from now.
    Timeout(std::time::Duration),
}

/// `sandcove pause|resume|set-timeout ID`: prints the id and the new state (or lease).
pub fn change(id: &str, change: Change, json: bool) -> Outcome {
    let client = out::client()?;
    let sandbox = client.sandbox(id);
    let info = out::runtime()?.block_on(async {
        match change {
            Change::Pause => sandbox.pause().await,
            Change::Resume => sandbox.resume().await,
            Change::Timeout(timeout) => sandbox.set_timeout(timeout).await,
        }
    })?;
    if json {
        out::print_json(&info)?;
    } else {
        let left = info.ends_at.saturating_sub(sandcove::now_millis());
        println!(
            "{} {} (lease left {})",
            info.id,
            state_name(&info),
            out::human_span(left)
        );
    }
    Ok(0)
}
