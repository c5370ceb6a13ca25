//! The image rows: a sandbox of a stored image against one of the host base, a pull against
//! `skopeo copy` + `umoci unpack --rootless` of the same image, and what 100 sandboxes of one
//! image hold beyond the first.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sandcove::backend::local::images::open_store;
use sandcove::backend::local::sandcove_image::{Store, StoreOptions};
use sandcove::{Backend, LocalBackend};
use sandcove_conformance::images::{shell_image, ImageBuilder, Layer, Registry};

use futures::StreamExt;
use sandcove::{Command, CreateOptions, ProcessEvent, ProcessSpec};

use super::{ms, short_options, BoxError, Row};

/// The reference the create rows' image is imported under.
const CREATE_IMAGE: &str = "bench.local/echo:1";

/// A directory removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(what: &str) -> Scratch {
        let dir = std::env::temp_dir().join(sandcove_conformance::unique(what));
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Import the create rows' image (the host's `sh` and `echo` with their libraries) into the
/// engine's store.
async fn import_echo_image(engine: &LocalBackend) -> Result<(), BoxError> {
    let scratch = Scratch::new("bench-image");
    let layout = scratch.0.join("layout");
    shell_image("bench")
        .layer(Layer::new().host_programs(&["/bin/echo"]))
        .build()
        .write_layout(&layout);
    open_store(engine.state_dir())?
        .import(&layout, Some(CREATE_IMAGE))
        .await?;
    Ok(())
}

/// One create → first byte of `echo hi` → destroy, timed as the create rows time it (the
/// destroy is not timed), split into the create call and the `echo` to its first byte.
async fn timed_cycle(
    backend: &LocalBackend,
    options: CreateOptions,
) -> Result<(Duration, Duration), BoxError> {
    let start = Instant::now();
    let id = backend.create(options).await?.id;
    let created = start.elapsed();
    let mut stream = backend
        .spawn(&id, ProcessSpec::new(Command::argv(["echo", "hi"])))
        .await?;
    while let Some(ev) = stream.events.next().await {
        if let ProcessEvent::Stdout(_) = ev? {
            break;
        }
    }
    let elapsed = start.elapsed();
    drop(stream);
    backend.destroy(&id).await?;
    Ok((elapsed, created))
}

/// A create row with its create-call part kept apart.
struct CreateRow {
    row: Row,
    create_calls: Row,
}

impl CreateRow {
    fn new(name: &'static str, what: &str) -> CreateRow {
        CreateRow {
            row: Row::new(name, what),
            create_calls: Row::new(name, ""),
        }
    }

    async fn sample(
        &mut self,
        backend: &LocalBackend,
        options: CreateOptions,
    ) -> Result<(), BoxError> {
        let (all, create) = timed_cycle(backend, options).await?;
        self.row.samples.push(all);
        self.create_calls.samples.push(create);
        Ok(())
    }
}

/// The create rows: the host base and a stored image, both cold (images are never pooled),
/// taking turns, `rounds` each. Printed as a table with their ratio.
pub async fn create_rows(cold: &LocalBackend, rounds: usize) -> Result<(), BoxError> {
    import_echo_image(cold).await?;
    let image_options = || {
        let mut options = short_options();
        options.template = Some(CREATE_IMAGE.into());
        options
    };
    let mut host = CreateRow::new(
        "create-cold",
        "create → first byte of `echo hi` → destroy, host base, no pool",
    );
    let mut image = CreateRow::new(
        "create-image",
        "the same from a stored image (the host's sh and echo: 2 layers), no pool",
    );
    timed_cycle(cold, short_options()).await?;
    timed_cycle(cold, image_options()).await?;
    for round in 0..rounds {
        if round % 2 == 0 {
            host.sample(cold, short_options()).await?;
            image.sample(cold, image_options()).await?;
        } else {
            image.sample(cold, image_options()).await?;
            host.sample(cold, short_options()).await?;
        }
    }
    println!("| row | p50 ms | p95 ms | create call p50 ms | what |");
    println!("|---|---:|---:|---:|---|");
    for row in [&host, &image] {
        println!(
            "| {} | {} | {} | {} | {} |",
            row.row.name,
            ms(row.row.pct(0.5)),
            ms(row.row.pct(0.95)),
            ms(row.create_calls.pct(0.5)),
            row.row.what
        );
    }
    println!(
        "| create-image / create-cold | {:.2}× | | | target ≤ 1.2× |",
        image.row.pct(0.5).as_secs_f64() / host.row.pct(0.5).as_secs_f64()
    );
    let _ = open_store(cold.state_dir())?.remove(CREATE_IMAGE);
    Ok(())
}

/// Bytes that do not compress (xorshift), so the image's size on the wire is its size.
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

fn run(program: &str, args: &[&str]) -> Result<(), String> {
    let out = std::process::Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn du_bytes(dir: &Path) -> u64 {
    let out = std::process::Command::new("du")
        .args(["-sb"])
        .arg(dir)
        .output();
    out.ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|t| t.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// `--images`: pull + unpack of a ~100 MB four-layer image from a loopback registry into an
/// empty store, against `skopeo copy` + `umoci unpack --rootless` of the same image (Debian's
/// packages), `rounds` each, taking turns; then 100 sandboxes of one image.
pub async fn pull_rows(engine: &LocalBackend, rounds: usize) -> Result<(), BoxError> {
    let Some(registry) = Registry::start() else {
        println!(
            "pull rows: docker-registry is not installed (Debian package docker-registry): skipped"
        );
        return Ok(());
    };
    registry.ready().await;
    let mut builder = ImageBuilder::new();
    for i in 0..4u64 {
        let layer = Layer::new().file(
            &format!("/data/layer-{i}.bin"),
            0o644,
            &noise(25 << 20, 0x5eed + i),
        );
        builder = builder.layer_tar(layer.tar(), true);
    }
    builder.build().push(&registry.host, "bench/big", "1").await;
    let reference = format!("{}/bench/big:1", registry.host);
    let peers = ["skopeo", "umoci"].iter().all(|p| {
        std::process::Command::new(p)
            .arg("--version")
            .output()
            .is_ok()
    });
    let mut ours = Row::new("pull", "sandcove: pull + unpack into an empty store");
    let mut peer = Row::new(
        "pull-peer",
        "skopeo copy (docker:// → oci:) + umoci unpack --rootless",
    );
    for round in 0..rounds {
        for ours_first in [round % 2 == 0, round % 2 == 1] {
            if ours_first {
                let scratch = Scratch::new("bench-store");
                let store = Store::open(scratch.0.join("store"), StoreOptions::default())?;
                let start = Instant::now();
                store.pull(&reference, &|_| {}).await?;
                ours.samples.push(start.elapsed());
            } else if peers {
                let scratch = Scratch::new("bench-peer");
                let oci = scratch.0.join("oci");
                let bundle = scratch.0.join("bundle");
                let start = Instant::now();
                run(
                    "skopeo",
                    &[
                        "copy",
                        "--quiet",
                        "--src-tls-verify=false",
                        &format!("docker://{reference}"),
                        &format!("oci:{}:1", oci.display()),
                    ],
                )?;
                run(
                    "umoci",
                    &[
                        "unpack",
                        "--rootless",
                        "--image",
                        &format!("{}:1", oci.display()),
                        &bundle.display().to_string(),
                    ],
                )?;
                peer.samples.push(start.elapsed());
            }
        }
    }
    println!("| row | p50 ms | what |");
    println!("|---|---:|---|");
    println!("| {} | {} | {} |", ours.name, ms(ours.pct(0.5)), ours.what);
    if peers {
        println!("| {} | {} | {} |", peer.name, ms(peer.pct(0.5)), peer.what);
        println!(
            "| pull / pull-peer | {:.2}× | target ≤ 0.5× |",
            ours.pct(0.5).as_secs_f64() / peer.pct(0.5).as_secs_f64()
        );
    } else {
        println!("| pull-peer | – | skopeo or umoci not installed: skipped |");
    }

    // 100 sandboxes of one image: what each holds beyond the first (the layers are shared).
    import_echo_image(engine).await?;
    let store_bytes = du_bytes(&engine.state_dir().join("images"));
    let mut options = short_options();
    options.template = Some(CREATE_IMAGE.into());
    let n = 100;
    let first = engine.create(options.clone()).await?.id;
    let disk_before = du_bytes(engine.state_dir());
    let (_, pss_first, _) = super::memory_kb_of(std::slice::from_ref(&first));
    let mut ids = vec![first];
    for _ in 1..n {
        ids.push(engine.create(options.clone()).await?.id);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let disk_after = du_bytes(engine.state_dir());
    let (_, pss_all, _) = super::memory_kb_of(&ids);
    for id in &ids {
        engine.destroy(id).await?;
    }
    println!(
        "{n} sandboxes of one image: the store holds its layers once ({store_bytes} bytes); \
         per sandbox beyond the first: {:.0} bytes of state-directory disk, {:.0} kB PSS \
         (the first: {pss_first} kB)",
        (disk_after.saturating_sub(disk_before)) as f64 / (n - 1) as f64,
        (pss_all.saturating_sub(pss_first)) as f64 / (n - 1) as f64,
    );
    let _ = open_store(engine.state_dir())?.remove(CREATE_IMAGE);
    Ok(())
}
