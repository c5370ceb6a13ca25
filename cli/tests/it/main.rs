//! The command's integration tests, one module per area, linked into one test binary: one
//! link instead of one per file. `tests/upload_memory.rs` keeps a binary of its own: it
//! bounds this process's resident memory growth, which other tests running beside it would
//! add to.

mod agent_command;
mod authorization;
mod blaxel_proxy;
mod blaxel_sdk;
mod blaxel_wire;
mod common;
mod daytona_sdk;
mod daytona_wire;
mod e2b_authorization;
mod e2b_sdk;
mod e2b_wire;
mod http_binary;
mod human;
mod image_conformance;
mod images;
mod kernels;
mod sdk_harness;
mod server_policy;
mod tls;
