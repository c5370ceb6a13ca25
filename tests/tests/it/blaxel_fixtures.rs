//! Every Blaxel fixture program against the embedded runtime and against a loopback server.
//! Fixtures that need a capability the runtime lacks are skipped, loudly, until it lands.

use sandcove_tests::{capabilities, check_everywhere, has};

#[test]
fn blaxel_quickstart() {
    check_everywhere(
        "blaxel_quickstart",
        env!("CARGO_BIN_EXE_fx_blaxel_quickstart"),
    );
}

#[test]
fn blaxel_batch_logs() {
    check_everywhere(
        "blaxel_batch_logs",
        env!("CARGO_BIN_EXE_fx_blaxel_batch_logs"),
    );
}

#[test]
fn blaxel_streaming() {
    check_everywhere(
        "blaxel_streaming",
        env!("CARGO_BIN_EXE_fx_blaxel_streaming"),
    );
}

#[test]
fn blaxel_process_management() {
    check_everywhere(
        "blaxel_process_management",
        env!("CARGO_BIN_EXE_fx_blaxel_process_management"),
    );
}

#[test]
fn blaxel_process() {
    check_everywhere("blaxel_process", env!("CARGO_BIN_EXE_fx_blaxel_process"));
}

#[test]
fn blaxel_filesystem() {
    if has(capabilities().watch, "blaxel_filesystem", "watch") {
        check_everywhere(
            "blaxel_filesystem",
            env!("CARGO_BIN_EXE_fx_blaxel_filesystem"),
        );
    }
}

#[test]
fn blaxel_envs() {
    check_everywhere("blaxel_envs", env!("CARGO_BIN_EXE_fx_blaxel_envs"));
}

#[test]
fn blaxel_preview() {
    if has(capabilities().previews, "blaxel_preview", "previews") {
        check_everywhere("blaxel_preview", env!("CARGO_BIN_EXE_fx_blaxel_preview"));
    }
}

#[test]
fn blaxel_private_preview() {
    if has(
        capabilities().previews,
        "blaxel_private_preview",
        "previews",
    ) {
        check_everywhere(
            "blaxel_private_preview",
            env!("CARGO_BIN_EXE_fx_blaxel_private_preview"),
        );
    }
}

#[test]
fn blaxel_snapshot_fork() {
    let caps = capabilities();
    if has(caps.snapshots, "blaxel_snapshot_fork", "snapshots")
        && has(caps.previews, "blaxel_snapshot_fork", "previews")
    {
        check_everywhere(
            "blaxel_snapshot_fork",
            env!("CARGO_BIN_EXE_fx_blaxel_snapshot_fork"),
        );
    }
}

#[test]
fn blaxel_code_interpreter() {
    check_everywhere(
        "blaxel_code_interpreter",
        env!("CARGO_BIN_EXE_fx_blaxel_code_interpreter"),
    );
}
