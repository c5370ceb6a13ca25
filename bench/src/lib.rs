//! Benchmarks live in `benches/sandcove.rs`: `cargo bench -p sandcove-bench`.
