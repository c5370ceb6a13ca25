//! The conformance suite against the engine's explicit un-isolated mode (no namespaces: for
//! hosts without user namespaces). Cases about isolation itself check `capabilities()` and
//! skip loudly; everything else must behave as on the isolated engine.

use std::sync::Arc;

use sandcove::{Backend, LocalBackend};

fn unisolated() -> Arc<dyn Backend> {
    let dir = std::env::temp_dir().join(sandcove::conformance::unique("unisolated-state"));
    Arc::new(LocalBackend::unisolated(dir).expect("un-isolated engine"))
}

sandcove::conformance_tests!(async { unisolated() });
