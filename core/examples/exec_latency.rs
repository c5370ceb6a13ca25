//! Time the phases of an `echo hi` round trip on the embedded engine.
//!
//! `cargo run --release -p sandcove --example exec_latency`

use std::time::{Duration, Instant};

use futures::StreamExt;
use sandcove::{Backend, Command, CreateOptions, LocalBackend, ProcessEvent, ProcessSpec};

#[tokio::main(flavor = "current_thread")]
async fn main() -> sandcove::Result<()> {
    let backend = LocalBackend::new()?;
    let id = backend.create(CreateOptions::default()).await?.id;
    let (mut started, mut first, mut exited) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..300 {
        let t = Instant::now();
        let mut stream = backend
            .spawn(&id, ProcessSpec::new(Command::argv(["echo", "hi"])))
            .await?;
        started.push(t.elapsed());
        let mut seen_first = false;
        while let Some(ev) = stream.events.next().await {
            match ev? {
                ProcessEvent::Stdout(_) if !seen_first => {
                    first.push(t.elapsed());
                    seen_first = true;
                }
                ProcessEvent::Exit(_) => break,
                _ => {}
            }
        }
        exited.push(t.elapsed());
    }
    let p50 = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    println!(
        "started {:?}  first byte {:?}  exit {:?}",
        p50(&mut started),
        p50(&mut first),
        p50(&mut exited)
    );
    let t = Instant::now();
    for _ in 0..300 {
        std::process::Command::new("echo").arg("hi").output().ok();
    }
    println!(
        "floor (std::process::Command echo hi) {:?}",
        t.elapsed() / 300
    );
    let mut creates = Vec::new();
    let mut destroys = Vec::new();
    for _ in 0..30 {
        let t = Instant::now();
        let id = backend.create(CreateOptions::default()).await?.id;
        creates.push(t.elapsed());
        let t = Instant::now();
        backend.destroy(&id).await?;
        destroys.push(t.elapsed());
    }
    println!(
        "create {:?}  destroy {:?}",
        p50(&mut creates),
        p50(&mut destroys)
    );
    backend.destroy(&id).await
}
