//! The facade's integration tests, one module per area, linked into one test binary: one link
//! instead of one per file. A test that changes process-wide state keeps a binary of its own
//! (`tests/unreachable_runtime.rs` points the whole program at a server that is not there).

mod code_interpreter;
mod commands;
mod common;
mod files;
mod gaps;
mod mirroring;
mod pty;
mod sandbox_api;
