//! What outlives sandboxes: `snapshot ls|create|rm` and `volume ls|create|rm`.

use clap::Subcommand;

use crate::out::{self, Outcome};

/// `sandcove snapshot …`.
#[derive(Debug, Subcommand)]
pub enum SnapshotCmd {
    /// List snapshots.
    Ls,
    /// Snapshot a sandbox's files (it is paused meanwhile); prints the snapshot's id. Start
    /// a sandbox from it with the native API (`CreateOptions::snapshot`).
    Create {
        /// The sandbox.
        id: String,
        /// A name for the snapshot.
        #[arg(long)]
        name: Option<String>,
    },
    /// Delete snapshots.
    Rm {
        /// The snapshots.
        #[arg(required = true, value_name = "SNAPSHOT")]
        ids: Vec<String>,
    },
}

/// `sandcove volume …`.
#[derive(Debug, Subcommand)]
pub enum VolumeCmd {
    /// List volumes.
    Ls,
    /// Create a named volume; prints its name.
    Create {
        /// The volume's name.
        name: String,
    },
    /// Delete volumes.
    Rm {
        /// The volumes.
        #[arg(required = true, value_name = "NAME")]
        names: Vec<String>,
    },
}

/// `sandcove snapshot …`.
pub fn snapshot(cmd: SnapshotCmd, json: bool) -> Outcome {
    let client = out::client()?;
    let runtime = out::runtime()?;
    match cmd {
        SnapshotCmd::Ls => {
            let mut list = runtime.block_on(client.snapshots())?;
            list.sort_by_key(|s| s.created_at);
            out::print_listing(
                json,
                &list,
                &["ID", "NAME", "SANDBOX", "AGE", "SIZE"],
                |s, now| {
                    vec![
                        s.id.clone(),
                        s.name.clone().unwrap_or_else(|| "-".into()),
                        s.sandbox_id.clone(),
                        out::human_span(now.saturating_sub(s.created_at)),
                        s.size.to_string(),
                    ]
                },
            )?;
        }
        SnapshotCmd::Create { id, name } => {
            let info = runtime.block_on(async { client.sandbox(id).snapshot(name).await })?;
            if json {
                out::print_json(&info)?;
            } else {
                println!("{}", info.id);
            }
            if let Some(error) = &info.source_resume_error {
                eprintln!(
                    "sandcove snapshot: taken, but the sandbox did not resume: {error} (try \
                     `sandcove resume {}`)",
                    info.sandbox_id
                );
                return Ok(out::FAILED);
            }
        }
        SnapshotCmd::Rm { ids } => {
            for id in &ids {
                runtime.block_on(client.delete_snapshot(id))?;
            }
            out::print_removed(json, &ids)?;
        }
    }
    Ok(0)
}

/// `sandcove volume …`.
pub fn volume(cmd: VolumeCmd, json: bool) -> Outcome {
    let client = out::client()?;
    let runtime = out::runtime()?;
    match cmd {
        VolumeCmd::Ls => {
            let mut list = runtime.block_on(client.volumes())?;
            list.sort_by(|a, b| a.name.cmp(&b.name));
            out::print_listing(json, &list, &["NAME", "AGE", "SIZE"], |v, now| {
                vec![
                    v.name.clone(),
                    out::human_span(now.saturating_sub(v.created_at)),
                    v.size.to_string(),
                ]
            })?;
        }
        VolumeCmd::Create { name } => {
            let info = runtime.block_on(client.create_volume(&name))?;
            if json {
                out::print_json(&info)?;
            } else {
                println!("{}", info.name);
            }
        }
        VolumeCmd::Rm { names } => {
            for name in &names {
                runtime.block_on(client.delete_volume(name))?;
            }
            out::print_removed(json, &names)?;
        }
    }
    Ok(0)
}
