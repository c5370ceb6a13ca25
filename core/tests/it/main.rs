//! The engine's integration tests, one module per area, linked into one test binary: one link
//! instead of one per file. The Kubernetes backend's modules need its feature (on in a
//! workspace build, where the CLI enables it; else `--features kubernetes`).
//!
//! The suites that change or measure process-wide state keep a binary of their own, since
//! every test here shares this process:
//! - `descriptor_limit` lowers the process's soft `RLIMIT_NOFILE`;
//! - `hardening_fds` plants leaked descriptors, a secret in the environment and ignored
//!   signals in the process, and lowers its hard `RLIMIT_NOFILE`;
//! - `hardening_faults` bounds the growth of the process's resident memory while a sandbox
//!   streams 1 GiB, which any test running beside it would add to;
//! - `hardening_load` runs 200 sandboxes at once with nothing else competing;
//! - `http_from_env` and `http_tls` set `SANDCOVE_URL`, `SANDCOVE_CA_FILE` and the like,
//!   which every client made meanwhile would read;
//! - `monitor_spawner` sets `no_new_privs` on the process;
//! - `redteam`: every sandbox's agent is the test program run again, and in a program the
//!   size of this one the out-of-memory killer of `memory_limit_covers_socket_buffers` picks
//!   the agent rather than the sandbox's process (see `redteam.rs`).

mod client_surface;
mod hardening;
mod hardening_bounds;
mod hardening_common;
mod hardening_copy;
mod hardening_disk;
mod hardening_escapes;
mod hardening_files;
mod hardening_http;
mod hardening_intercept;
mod hardening_net;
mod hardening_previews;
mod http_client;
mod http_conformance;
mod http_operations;
mod http_server;
mod http_upload;
mod image_roots;
#[cfg(feature = "kubernetes")]
mod kube;
#[cfg(feature = "kubernetes")]
mod kube_conformance;
#[cfg(feature = "kubernetes")]
mod kube_fake;
mod local_engine;
mod passthrough_common;
mod pod_agent;
mod unisolated_conformance;
