//! The facade's integration tests, one module per area, linked into one test binary: one link
//! instead of one per file. The tests that change process-wide state keep a binary of their
//! own: `tests/config.rs` sets the `DAYTONA_*` environment, which fills every client's unset
//! settings (`Sandbox.target` among them), and `tests/unreachable_runtime.rs` points the
//! whole program at a server that is not there.

mod common;
mod fs;
mod git;
mod lifecycle;
mod mapping;
mod mirroring;
mod process;
mod runtime_features;
mod sessions;
