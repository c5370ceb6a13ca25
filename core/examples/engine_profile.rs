//! Time the embedded engine's cold create, file throughput and exec, for profiling one
//! change against another (run two builds alternately; compare their ratios).
//!
//! `cargo run --release -p sandcove --example engine_profile -- [create|cold|files|http-files|exec|warm|hold] [rounds]`
//!
//! `http-files` is `files` through `HttpBackend` and a loopback server over the same engine.
//!
//! `exec` and `warm` (create from a warm pool of 2 → first byte of `echo hi`, the bench's
//! warm row; destroy untimed) take a floor sample (`std::process::Command` running `true`)
//! before each round and print both p50s and their ratio, as the bench does.
//! `ENGINE_PROFILE_ARGV="true"` makes `exec` run another command (split at spaces), to
//! tell the program's share from the round trip's.

use std::time::{Duration, Instant};

use futures::StreamExt;
use std::sync::Arc;

use sandcove::{
    Backend, ByteStream, Command, CreateOptions, HttpBackend, LocalBackend, ProcessEvent,
    ProcessSpec, WriteOptions,
};

/// The benchmark's bwrap one-shot: user, mount, pid, ipc, uts and net namespaces,
/// read-only system directories, private /tmp, /proc and /dev, running `true`.
const BWRAP_ARGS: &[&str] = &[
    "--unshare-all",
    "--die-with-parent",
    "--ro-bind",
    "/usr",
    "/usr",
    "--symlink",
    "usr/bin",
    "/bin",
    "--symlink",
    "usr/lib",
    "/lib",
    "--symlink",
    "usr/lib64",
    "/lib64",
    "--ro-bind",
    "/etc",
    "/etc",
    "--tmpfs",
    "/tmp",
    "--proc",
    "/proc",
    "--dev",
    "/dev",
    "true",
];

fn floor() -> Duration {
    let t = Instant::now();
    let status = std::process::Command::new("true").status();
    let d = t.elapsed();
    assert!(status.map(|s| s.success()).unwrap_or(false));
    d
}

fn p50(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// 100 MiB written in 1 MiB chunks and read back, `rounds` times in one sandbox.
async fn files(backend: &dyn Backend, rounds: usize) -> sandcove::Result<()> {
    let id = backend.create(CreateOptions::default()).await?.id;
    let bytes = 100usize << 20;
    let data = vec![0x5au8; bytes];
    let mut samples = Vec::new();
    let (mut writes, mut reads) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let chunks: Vec<sandcove::Result<Vec<u8>>> =
            data.chunks(1 << 20).map(|c| Ok(c.to_vec())).collect();
        let stream: ByteStream = Box::pin(futures::stream::iter(chunks));
        let t = Instant::now();
        backend
            .write_file(&id, "/tmp/bench.bin", stream, WriteOptions::default())
            .await?;
        writes.push(t.elapsed());
        let r = Instant::now();
        let mut read = backend
            .read_file(&id, "/tmp/bench.bin", Default::default())
            .await?;
        let mut n = 0;
        while let Some(chunk) = read.next().await {
            n += chunk?.len();
        }
        reads.push(r.elapsed());
        samples.push(t.elapsed());
        assert_eq!(n, bytes);
    }
    backend.destroy(&id).await?;
    let d = p50(&mut samples);
    println!(
        "files: 100 MiB write + read p50 {d:?} = {:.0} MB/s",
        200.0 * 1.048576 / d.as_secs_f64()
    );
    let (w, r) = (p50(&mut writes), p50(&mut reads));
    println!("files: write p50 {w:?}, read p50 {r:?}");
    Ok(())
}

fn main() -> sandcove::Result<()> {
    let what = std::env::args().nth(1).unwrap_or_else(|| "create".into());
    let rounds: usize = std::env::args()
        .nth(2)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20);
    // The HTTP row runs client and server side by side, as a program serving others would.
    let runtime = if what == "http-files" {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    };
    runtime
        .map_err(|e| sandcove::Error::from_io(&e, "runtime"))?
        .block_on(run(what, rounds))
}

async fn run(what: String, rounds: usize) -> sandcove::Result<()> {
    let backend = LocalBackend::new()?.with_warm_pool(0);
    let mut samples = Vec::new();
    let mut floors = Vec::new();
    match what.as_str() {
        "create" => {
            for _ in 0..rounds {
                let t = Instant::now();
                let id = backend.create(CreateOptions::default()).await?.id;
                samples.push(t.elapsed());
                backend.destroy(&id).await?;
            }
        }
        "files" => return files(&backend, rounds).await,
        "http-files" => {
            let key = "profile-key".to_string();
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .map_err(|e| sandcove::Error::from_io(&e, "bind"))?;
            let url = format!(
                "http://{}",
                listener
                    .local_addr()
                    .map_err(|e| sandcove::Error::from_io(&e, "bind"))?
            );
            let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
            let engine: Arc<dyn Backend> = Arc::new(backend);
            let server = tokio::spawn(sandcove::server::serve(
                listener,
                engine,
                sandcove::server::ServerConfig::new(key.clone()),
                async move {
                    let _ = stop_rx.await;
                },
            ));
            let http = HttpBackend::connect(&url, &key).await?;
            let result = files(&http, rounds).await;
            let _ = stop_tx.send(());
            let _ = server.await;
            return result;
        }
        "exec" => {
            let id = backend.create(CreateOptions::default()).await?.id;
            let argv: Vec<String> = std::env::var("ENGINE_PROFILE_ARGV")
                .unwrap_or_else(|_| "echo hi".into())
                .split_whitespace()
                .map(String::from)
                .collect();
            for _ in 0..rounds {
                floors.push(floor());
                let t = Instant::now();
                let mut stream = backend
                    .spawn(&id, ProcessSpec::new(Command::argv(argv.clone())))
                    .await?;
                while let Some(ev) = stream.events.next().await {
                    if let ProcessEvent::Exit(_) = ev? {
                        break;
                    }
                }
                samples.push(t.elapsed());
            }
            backend.destroy(&id).await?;
        }
        "cold" => {
            // The cold-create row against its peer, alternating round by round:
            // create → first byte of `echo hi` (then destroy, untimed), and a bwrap one-shot
            // with a comparable isolation set (the benchmark's `peer` row).
            let mut peer = Vec::new();
            for _ in 0..rounds {
                let t = Instant::now();
                let status = std::process::Command::new("bwrap")
                    .args(BWRAP_ARGS)
                    .status()
                    .expect("bwrap runs");
                peer.push(t.elapsed());
                assert!(status.success(), "bwrap ran");
                let t = Instant::now();
                let id = backend.create(CreateOptions::default()).await?.id;
                let mut stream = backend
                    .spawn(&id, ProcessSpec::new(Command::argv(["echo", "hi"])))
                    .await?;
                while let Some(ev) = stream.events.next().await {
                    if let ProcessEvent::Stdout(_) = ev? {
                        break;
                    }
                }
                samples.push(t.elapsed());
                drop(stream);
                backend.destroy(&id).await?;
            }
            let (ours, theirs) = (p50(&mut samples), p50(&mut peer));
            println!(
                "cold: create → first byte p50 {ours:?}, bwrap one-shot p50 {theirs:?}, ratio {:.3} over {rounds}",
                ours.as_secs_f64() / theirs.as_secs_f64()
            );
            return Ok(());
        }
        "warm" => {
            let backend = LocalBackend::new()?.with_warm_pool(2);
            // The pool starts filling at the first create.
            let first = backend.create(CreateOptions::default()).await?.id;
            backend.destroy(&first).await?;
            for _ in 0..rounds {
                // Each claim starts a refill: wait for it, as the bench's alternating rows do.
                while backend.warm_ready() < 2 {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                floors.push(floor());
                let t = Instant::now();
                let id = backend.create(CreateOptions::default()).await?.id;
                let mut stream = backend
                    .spawn(&id, ProcessSpec::new(Command::argv(["echo", "hi"])))
                    .await?;
                while let Some(ev) = stream.events.next().await {
                    if let ProcessEvent::Stdout(_) = ev? {
                        break;
                    }
                }
                samples.push(t.elapsed());
                drop(stream);
                backend.destroy(&id).await?;
            }
        }
        "hold" => {
            // One idle sandbox for `rounds` seconds, to read its processes' smaps.
            let id = backend.create(CreateOptions::default()).await?.id;
            println!("holding {id}");
            tokio::time::sleep(Duration::from_secs(rounds as u64)).await;
            return backend.destroy(&id).await;
        }
        other => panic!("unknown measurement {other:?}"),
    }
    let p = p50(&mut samples);
    if floors.is_empty() {
        println!("{what}: p50 {p:?} over {rounds}");
    } else {
        let f = p50(&mut floors);
        let ratio = p.as_secs_f64() / f.as_secs_f64();
        println!("{what}: p50 {p:?}, floor p50 {f:?}, ratio {ratio:.2} over {rounds}");
    }
    Ok(())
}
