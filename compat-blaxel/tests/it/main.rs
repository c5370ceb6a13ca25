//! The facade's integration tests, one module per area, linked into one test binary: one link
//! instead of one per file. The tests that change process-wide state keep a binary of their
//! own: `tests/standby.rs` shortens the quiet period of every sandbox the facade's client makes
//! (an environment variable read when that client is made), and `tests/unreachable_runtime.rs`
//! points the whole program at a server that is not there.

mod common;
mod fs;
mod mirroring;
mod previews_and_interpreter;
mod process;
mod sandbox;
