//! The conformance cases with a vendor meaning, through each facade: one expected output for
//! all three, on the embedded engine and over HTTP (see `sandcove_tests::facade`).

use sandcove_tests::check_everywhere;

#[test]
fn through_compat_e2b() {
    check_everywhere("facade_conformance", env!("CARGO_BIN_EXE_facade_e2b"));
}

#[test]
fn through_compat_daytona() {
    check_everywhere("facade_conformance", env!("CARGO_BIN_EXE_facade_daytona"));
}

#[test]
fn through_compat_blaxel() {
    check_everywhere("facade_conformance", env!("CARGO_BIN_EXE_facade_blaxel"));
}
