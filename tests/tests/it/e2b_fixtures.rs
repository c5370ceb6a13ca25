//! Every E2B fixture program against the embedded runtime and against a loopback server.
//! Fixtures that need a capability the runtime lacks are skipped, loudly, until it lands.

use sandcove_tests::{capabilities, check_everywhere, has};

#[test]
fn e2b_quickstart() {
    check_everywhere("e2b_quickstart", env!("CARGO_BIN_EXE_fx_e2b_quickstart"));
}

#[test]
fn e2b_code_interpreter_quickstart() {
    check_everywhere(
        "e2b_code_interpreter_quickstart",
        env!("CARGO_BIN_EXE_fx_e2b_code_interpreter_quickstart"),
    );
}

#[test]
fn e2b_docs_quickstart() {
    check_everywhere(
        "e2b_docs_quickstart",
        env!("CARGO_BIN_EXE_fx_e2b_docs_quickstart"),
    );
}

#[test]
fn e2b_commands() {
    check_everywhere("e2b_commands", env!("CARGO_BIN_EXE_fx_e2b_commands"));
}

#[test]
fn e2b_files() {
    check_everywhere("e2b_files", env!("CARGO_BIN_EXE_fx_e2b_files"));
}

#[test]
fn e2b_envs() {
    check_everywhere("e2b_envs", env!("CARGO_BIN_EXE_fx_e2b_envs"));
}

#[test]
fn e2b_watch() {
    if has(capabilities().watch, "e2b_watch", "watch") {
        check_everywhere("e2b_watch", env!("CARGO_BIN_EXE_fx_e2b_watch"));
    }
}

#[test]
fn e2b_lifecycle() {
    check_everywhere("e2b_lifecycle", env!("CARGO_BIN_EXE_fx_e2b_lifecycle"));
}

#[test]
fn e2b_metadata_list() {
    check_everywhere(
        "e2b_metadata_list",
        env!("CARGO_BIN_EXE_fx_e2b_metadata_list"),
    );
}

#[test]
fn e2b_connect() {
    check_everywhere("e2b_connect", env!("CARGO_BIN_EXE_fx_e2b_connect"));
}

#[test]
fn e2b_get_host() {
    if has(capabilities().previews, "e2b_get_host", "previews") {
        check_everywhere("e2b_get_host", env!("CARGO_BIN_EXE_fx_e2b_get_host"));
    }
}

#[test]
fn e2b_persistence() {
    if has(capabilities().pause, "e2b_persistence", "pause") {
        check_everywhere("e2b_persistence", env!("CARGO_BIN_EXE_fx_e2b_persistence"));
    }
}

#[test]
fn e2b_signed_urls() {
    if has(capabilities().file_urls, "e2b_signed_urls", "file_urls") {
        check_everywhere("e2b_signed_urls", env!("CARGO_BIN_EXE_fx_e2b_signed_urls"));
    }
}
