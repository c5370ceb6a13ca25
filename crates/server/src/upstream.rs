//! Requests a listener forwards to a port inside a sandbox (E2B's `get_host`): the bounds on
//! the sandbox's answer each listener sets.
//!
//! The sandbox is the other end there, and a port that never answers, or stops halfway, would
//! otherwise hold the client's connection, and its slot of the listener's cap, for as long as
//! it likes. The connection loop of [`serve_router`](super::serve_router) puts the listener's
//! [`UpstreamBounds`] (its `upstream_answer_timeout` and body idle bound) in every request's
//! extensions; a handler that forwards reads them with [`of`] and hands them to the one
//! bounded forwarding there is, `sandcove_agent::forward` (the preview listeners' too; this
//! crate may not depend on the agent crate, so the handler, which sees both through the
//! umbrella, joins them).
//!
//! On such a listener, a client slow to take the answer is the write-stall bound's business
//! (`stall`), and upgraded connections (WebSockets) keep
//! [`upgrade`](super::upgrade)'s idle limit.

pub use sandcove_core::listen::{UpstreamBounds, DEFAULT_ANSWER_TIMEOUT};

/// The bounds of the listener `request` came through; the defaults for a request that did not
/// come through [`serve_router`](super::serve_router) or [`serve`](super::serve).
pub fn of<B>(request: &axum::http::Request<B>) -> UpstreamBounds {
    request
        .extensions()
        .get::<UpstreamBounds>()
        .copied()
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn requests_from_elsewhere_get_the_defaults() {
        let mut request = axum::http::Request::new(());
        assert_eq!(of(&request), UpstreamBounds::default());
        let short = UpstreamBounds::new(Duration::from_millis(5), Duration::from_millis(7));
        request.extensions_mut().insert(short);
        assert_eq!(of(&request), short);
    }
}
