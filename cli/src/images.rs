//! `sandcove image`: the embedded engine's image store (`<state dir>/images`): pull, import,
//! list, inspect, remove, prune. A sandbox runs a stored image with `sandcove create --image`
//! (or a vendor SDK naming it).

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Mutex;

use clap::Subcommand;
use sandcove::backend::local::images::{image_error, open_store};
use sandcove::client::URL_ENV;
use sandcove::{ImageLayerState, ImagePullProgress};

use crate::out::{self, Failure, Outcome};

/// `sandcove image …`.
#[derive(Debug, Subcommand)]
pub enum ImageCmd {
    /// Pull an image from its registry (Docker Hub names as Docker reads them:
    /// `python:3.12` is `docker.io/library/python:3.12`). Credentials come from
    /// ~/.docker/config.json or SANDCOVE_REGISTRY_AUTH; mirrors and plain-HTTP registries from
    /// the JSON file SANDCOVE_REGISTRIES names (a registry on a loopback address may be plain
    /// HTTP without it).
    Pull {
        /// The image reference.
        reference: String,
    },
    /// Import images without a registry: an OCI image layout directory, an `oci-archive`
    /// tarball, or a `docker save` / `podman save` tarball. With SANDCOVE_URL, a tarball is
    /// sent to that server's store.
    Import {
        /// The directory or tarball.
        path: PathBuf,
        /// The reference to tag the image with (an archive of one image without a name
        /// needs one to be created by name).
        #[arg(long)]
        tag: Option<String>,
    },
    /// List the stored images: references, digest, size, creation time.
    Ls,
    /// Everything stored of one image, as JSON: config, platform, layers.
    Inspect {
        /// A reference or digest.
        reference: String,
    },
    /// Remove references (the image goes with its last one, unless a live sandbox runs it).
    Rm {
        /// References or digests.
        #[arg(required = true)]
        references: Vec<String>,
    },
    /// Remove what nothing uses: images without a reference that no live sandbox runs,
    /// and every layer and blob no image needs.
    Prune,
}

/// Run an image command.
pub fn image(cmd: ImageCmd, json: bool) -> Outcome {
    if std::env::var(URL_ENV).is_ok_and(|url| !url.is_empty()) {
        return remote(cmd, json);
    }
    let state_dir = sandcove::backend::local::default_state_dir();
    let store = || open_store(&state_dir).map_err(Failure::from);
    match cmd {
        ImageCmd::Import { path, tag } => {
            let store = store()?;
            let images = out::runtime()?
                .block_on(store.import(&path, tag.as_deref()))
                .map_err(|e| Failure::from(image_error(e)))?;
            if json {
                out::print_json(&images)?;
            } else {
                for image in images {
                    println!("{} {}", image.digest, image.references.join(" "));
                }
            }
            Ok(0)
        }
        // The engine's own image calls, as a server's: one code path for both.
        ImageCmd::Inspect { reference } => inspect(&reference),
        ImageCmd::Pull { reference } => pull(&reference, json),
        ImageCmd::Ls => list(json),
        ImageCmd::Rm { references } => remove(references, json),
        ImageCmd::Prune => prune(json),
    }
}

/// An image command against the server `SANDCOVE_URL` names: its store. An import sends an
/// archive file to it; an OCI layout directory needs the server's host.
fn remote(cmd: ImageCmd, json: bool) -> Outcome {
    match cmd {
        ImageCmd::Pull { reference } => pull(&reference, json),
        ImageCmd::Import { path, tag } => {
            if path.is_dir() {
                return Err(Failure::usage(format!(
                    "{} is a directory (an OCI image layout), and {URL_ENV} names a server: \
                     send it as an oci-archive (`tar -cf image.tar -C {} .`, then `sandcove \
                     image import image.tar`), or import it on the server's host",
                    path.display(),
                    path.display()
                )));
            }
            let (client, runtime) = (out::client()?, out::runtime()?);
            let images = runtime.block_on(client.import_image_file(&path, tag.as_deref()))?;
            if json {
                out::print_json(&images)?;
            } else {
                for image in images {
                    println!("{} {}", image.digest, image.references.join(" "));
                }
            }
            Ok(0)
        }
        ImageCmd::Ls => list(json),
        ImageCmd::Rm { references } => remove(references, json),
        ImageCmd::Prune => prune(json),
        ImageCmd::Inspect { reference } => inspect(&reference),
    }
}

/// `sandcove image inspect` through the runtime's image calls (`Client`), the embedded
/// engine's store or the server's: always JSON, `--json` or not (the details nest too deep
/// for a table).
fn inspect(reference: &str) -> Outcome {
    let details = out::runtime()?.block_on(out::client()?.inspect_image(reference))?;
    out::print_json(&details).map(|_| 0)
}

/// `sandcove image ls` through the runtime's image calls (`Client`): the embedded engine's
/// store, or the store of the server `SANDCOVE_URL` names (as `rm` and `prune`).
fn list(json: bool) -> Outcome {
    let list = out::runtime()?.block_on(out::client()?.images())?;
    if json {
        return out::print_json(&list).map(|_| 0);
    }
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|image| listing_row(&image.references, &image.digest, image.size, &image.created))
        .collect();
    out::print_table(&["REFERENCES", "DIGEST", "SIZE", "CREATED"], &rows);
    Ok(0)
}

/// `sandcove image rm`: every reference tried; exit 1 if any could not be removed.
fn remove(references: Vec<String>, json: bool) -> Outcome {
    let (client, runtime) = (out::client()?, out::runtime()?);
    let mut status = 0;
    for reference in references {
        match runtime.block_on(client.remove_image(&reference)) {
            Ok(()) if !json => println!("{reference}"),
            Ok(()) => {}
            Err(e) => {
                eprintln!(
                    "sandcove image rm: {}",
                    out::describe(&e).replace('\n', " ")
                );
                status = out::FAILED;
            }
        }
    }
    Ok(status)
}

/// `sandcove image prune`.
fn prune(json: bool) -> Outcome {
    let report = out::runtime()?.block_on(out::client()?.prune_images())?;
    if json {
        out::print_json(&report)?;
    } else {
        println!(
            "removed {} images, {} layers, {}",
            report.images.len(),
            report.layers.len(),
            human_size(report.bytes)
        );
    }
    Ok(0)
}

/// One row of `sandcove image ls`.
fn listing_row(
    references: &[String],
    digest: &str,
    size: u64,
    created: &Option<String>,
) -> Vec<String> {
    vec![
        if references.is_empty() {
            "-".into()
        } else {
            references.join(", ")
        },
        short_digest(digest),
        human_size(size),
        created.clone().unwrap_or_else(|| "-".into()),
    ]
}

/// Pull through the runtime (the embedded engine's store, or the server's) with a line per
/// layer: redrawn in place on a terminal, else one line each time a layer changes state
/// (never a line per chunk in a log).
fn pull(reference: &str, json: bool) -> Outcome {
    let terminal = std::io::stderr().is_terminal() && !json;
    let board = Mutex::new(Board::default());
    let progress = |p: ImagePullProgress| {
        let mut board = board.lock().unwrap_or_else(|e| e.into_inner());
        board.update(p, terminal);
    };
    let (client, runtime) = (out::client()?, out::runtime()?);
    let info = runtime.block_on(client.pull_image_with_progress(reference, &progress))?;
    if json {
        out::print_json(&info)?;
    } else {
        println!("{} {}", info.digest, info.references.join(" "));
    }
    Ok(0)
}

/// The layers of a pull as last reported, and how many lines are on the terminal.
#[derive(Default)]
struct Board {
    layers: BTreeMap<usize, ImagePullProgress>,
    drawn: usize,
}

impl Board {
    fn update(&mut self, progress: ImagePullProgress, terminal: bool) {
        let changed = self
            .layers
            .get(&progress.index)
            .is_none_or(|old| old.state != progress.state);
        self.layers.insert(progress.index, progress.clone());
        let mut err = std::io::stderr().lock();
        if !terminal {
            if changed {
                let _ = writeln!(err, "{}", line(&progress));
            }
            return;
        }
        if self.drawn > 0 {
            let _ = write!(err, "\x1b[{}A", self.drawn);
        }
        for layer in self.layers.values() {
            let _ = writeln!(err, "\x1b[2K{}", line(layer));
        }
        self.drawn = self.layers.len();
    }
}

/// One layer's line: `layer 2/5 sha256:0123456789ab downloading  12.0 MB / 30.1 MB`.
fn line(p: &ImagePullProgress) -> String {
    let state = match p.state {
        ImageLayerState::Waiting => "waiting",
        ImageLayerState::Downloading => "downloading",
        ImageLayerState::Unpacking => "unpacking",
        ImageLayerState::Done => "done",
        ImageLayerState::Cached => "already stored",
        _ => "in progress",
    };
    let bytes = match p.state {
        ImageLayerState::Downloading => {
            format!("  {} / {}", human_size(p.done), human_size(p.total))
        }
        ImageLayerState::Done | ImageLayerState::Unpacking => {
            format!("  {}", human_size(p.total))
        }
        _ => String::new(),
    };
    format!(
        "layer {}/{} {} {state}{bytes}",
        p.index + 1,
        p.layers,
        short_digest(&p.layer)
    )
}

/// `sha256:` and the first 12 hex digits.
fn short_digest(digest: &str) -> String {
    match digest.split_once(':') {
        Some((algorithm, hex)) => format!("{algorithm}:{}", &hex[..hex.len().min(12)]),
        None => digest.to_string(),
    }
}

/// Bytes in decimal units, one decimal.
fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "kB", "MB", "GB", "TB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1000.0 && unit < UNITS.len() - 1 {
        value /= 1000.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::{human_size, short_digest};

    #[test]
    fn sizes_and_digests_read_short() {
        assert_eq!(human_size(999), "999 B");
        assert_eq!(human_size(12_345_678), "12.3 MB");
        assert_eq!(
            short_digest(&format!("sha256:{}", "a".repeat(64))),
            "sha256:aaaaaaaaaaaa"
        );
    }
}
