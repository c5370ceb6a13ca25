//! Every Daytona fixture program against the embedded runtime and against a loopback server.
//! Fixtures that need a capability the runtime lacks are skipped, loudly, until it lands.

use sandcove_tests::{capabilities, check_everywhere, has};

#[test]
fn daytona_quickstart() {
    check_everywhere(
        "daytona_quickstart",
        env!("CARGO_BIN_EXE_fx_daytona_quickstart"),
    );
}

#[test]
fn daytona_getting_started() {
    check_everywhere(
        "daytona_getting_started",
        env!("CARGO_BIN_EXE_fx_daytona_getting_started"),
    );
}

#[test]
fn daytona_shell_exec() {
    check_everywhere(
        "daytona_shell_exec",
        env!("CARGO_BIN_EXE_fx_daytona_shell_exec"),
    );
}

#[test]
fn daytona_file_operations() {
    check_everywhere(
        "daytona_file_operations",
        env!("CARGO_BIN_EXE_fx_daytona_file_operations"),
    );
}

#[test]
fn daytona_git() {
    check_everywhere("daytona_git", env!("CARGO_BIN_EXE_fx_daytona_git"));
}

#[test]
fn daytona_sessions() {
    check_everywhere(
        "daytona_sessions",
        env!("CARGO_BIN_EXE_fx_daytona_sessions"),
    );
}

#[test]
fn daytona_preview() {
    if has(capabilities().previews, "daytona_preview", "previews") {
        check_everywhere("daytona_preview", env!("CARGO_BIN_EXE_fx_daytona_preview"));
    }
}

#[test]
fn daytona_labels_list() {
    check_everywhere(
        "daytona_labels_list",
        env!("CARGO_BIN_EXE_fx_daytona_labels_list"),
    );
}

#[test]
fn daytona_volumes() {
    if has(capabilities().volumes, "daytona_volumes", "volumes") {
        check_everywhere("daytona_volumes", env!("CARGO_BIN_EXE_fx_daytona_volumes"));
    }
}

#[test]
fn daytona_code_run_params() {
    check_everywhere(
        "daytona_code_run_params",
        env!("CARGO_BIN_EXE_fx_daytona_code_run_params"),
    );
}
