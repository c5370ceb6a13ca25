//! The conformance suite against the engine's explicit un-isolated mode (no namespaces: for
//! hosts without user namespaces). Cases about isolation itself check `capabilities()` and
//! skip loudly; everything else must behave as on the isolated engine.

use std::sync::Arc;

use sandcove::{Backend, LocalBackend};

/// One state directory for every run, beside the isolated engine's (not inside it, so the two
/// modes never list each other's sandboxes): each case destroys what it made, so nothing
/// accumulates.
fn unisolated() -> Arc<dyn Backend> {
    let dir = sandcove::backend::local::default_state_dir().with_extension("unisolated");
    Arc::new(LocalBackend::unisolated(dir).expect("un-isolated engine"))
}

sandcove_conformance::conformance_tests!(async { unisolated() });
