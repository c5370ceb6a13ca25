//! The server's own policy: what any client of `sandcove serve` may ask of its backend,
//! decided in one place for every listener (the native API and each vendor wire listener
//! are built over the same [`PolicyBackend`]).
//!
//! - **Admin-only create options** are refused with [`Error::Forbidden`] before anything is
//!   made unless the operator allowed them: today that is [`NetworkPolicy::Host`] (the
//!   sandbox would share the host's network, loopback services and cloud metadata endpoint
//!   included), allowed by [`ServerPolicy::allow_host_network`]. Capabilities still say what
//!   the runtime *can* do; the policy says what this server's clients *may*.
//! - **Live sandboxes** are capped at [`ServerPolicy::max_sandboxes`]: a create or fork that
//!   would pass the cap is [`Error::Forbidden`] before anything is made. Creates and forks
//!   are admitted one at a time against the live sandboxes (as the backend lists them) plus
//!   the admitted ones still under way, so concurrent creates cannot overshoot; a create that
//!   finds the cap reached only by creates still under way waits for them to end, then
//!   decides on the exact count. A sandbox made by another program on the same engine counts
//!   once it is listed.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tokio::sync::Notify;

use sandcove_core::{
    Backend, CreateOptions, Error, Layer, ListOptions, NetworkPolicy, Result, SandboxInfo,
};

/// Live sandboxes a server allows unless told otherwise (`sandcove serve --max-sandboxes`).
pub const DEFAULT_MAX_SANDBOXES: usize = 1000;

/// What a server's clients may ask for, beyond what the backend can do.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerPolicy {
    /// Whether a create or fork may ask for [`NetworkPolicy::Host`]. Off by default: with it,
    /// anyone holding the API key runs code with the host's network.
    pub allow_host_network: bool,
    /// Most live sandboxes (running, paused, stopped or failed, until destroyed or their
    /// lease ends) at once; creates and forks past it are refused. At least 1.
    pub max_sandboxes: usize,
}

impl Default for ServerPolicy {
    /// Host network refused, at most [`DEFAULT_MAX_SANDBOXES`] live sandboxes.
    fn default() -> Self {
        ServerPolicy {
            allow_host_network: false,
            max_sandboxes: DEFAULT_MAX_SANDBOXES,
        }
    }
}

impl ServerPolicy {
    /// The refusal of a create (or fork) asking for an option this server keeps to its
    /// operator, or `Ok`.
    pub fn check_create(&self, options: &CreateOptions) -> Result<()> {
        if options.network == NetworkPolicy::Host && !self.allow_host_network {
            return Err(Error::Forbidden {
                what: "the host's network (NetworkPolicy::Host) is not allowed on this server: \
                       its operator starts it with --allow-host-network to allow it; use the \
                       isolated internet policy instead"
                    .into(),
            });
        }
        Ok(())
    }
}

/// Creates and forks admitted and not finished yet.
#[derive(Debug, Default)]
struct Admissions {
    /// Held while one create is being admitted (list, count, reserve), so admissions are
    /// decided one at a time.
    deciding: tokio::sync::Mutex<()>,
    /// Admitted creates under way.
    pending: Mutex<usize>,
    /// Woken whenever a create under way ends.
    ended: Notify,
}

/// One admitted create under way; dropping it (the create ended, whichever way) frees its
/// place.
struct Admitted(Arc<Admissions>);

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut pending = self.0.pending.lock().unwrap_or_else(|e| e.into_inner());
        *pending = pending.saturating_sub(1);
        drop(pending);
        self.0.ended.notify_waiters();
    }
}

/// A [`Backend`] under a [`ServerPolicy`]: every call goes to the inner backend, creates and
/// forks once the policy admits them.
pub struct PolicyBackend {
    inner: Arc<dyn Backend>,
    policy: ServerPolicy,
    admissions: Arc<Admissions>,
}

impl std::fmt::Debug for PolicyBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyBackend")
            .field("inner", &self.inner)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl PolicyBackend {
    /// `inner` under `policy` (a `max_sandboxes` of 0 is taken as 1).
    pub fn new(inner: Arc<dyn Backend>, policy: ServerPolicy) -> Self {
        let mut policy = policy;
        policy.max_sandboxes = policy.max_sandboxes.max(1);
        PolicyBackend {
            inner,
            policy,
            admissions: Arc::default(),
        }
    }

    /// The policy in force.
    pub fn policy(&self) -> &ServerPolicy {
        &self.policy
    }

    /// Check `options`, then take a place under the cap (see the module doc).
    async fn admit(&self, options: &CreateOptions) -> Result<Admitted> {
        self.policy.check_create(options)?;
        let max = self.policy.max_sandboxes;
        loop {
            let ended = self.admissions.ended.notified();
            tokio::pin!(ended);
            // Registered before the count is read, so an end in between still wakes us.
            ended.as_mut().enable();
            {
                let _deciding = self.admissions.deciding.lock().await;
                // Under way first, then listed: a create that ends in between is counted
                // twice (refusing early, never late), never missed.
                let pending = *self
                    .admissions
                    .pending
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                let live = self.inner.list(ListOptions::default()).await?.len();
                if live + pending < max {
                    *self
                        .admissions
                        .pending
                        .lock()
                        .unwrap_or_else(|e| e.into_inner()) += 1;
                    return Ok(Admitted(self.admissions.clone()));
                }
                if pending == 0 {
                    return Err(Error::Forbidden {
                        what: format!(
                            "this server's limit of {max} live sandboxes is reached \
                             (--max-sandboxes): destroy a sandbox first"
                        ),
                    });
                }
            }
            // The cap is reached counting creates still under way, some of which may be
            // listed already: decide again once one has ended.
            ended.await;
        }
    }
}

#[async_trait]
impl Layer for PolicyBackend {
    fn inner(&self) -> &dyn Backend {
        &*self.inner
    }

    async fn create(&self, options: CreateOptions) -> Result<SandboxInfo> {
        let _admitted = self.admit(&options).await?;
        self.inner.create(options).await
    }

    async fn fork(&self, id: &str, options: CreateOptions) -> Result<SandboxInfo> {
        let _admitted = self.admit(&options).await?;
        self.inner.fork(id, options).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_network_is_the_operators() {
        let host = CreateOptions::default().network(NetworkPolicy::Host);
        let refused = ServerPolicy::default().check_create(&host).unwrap_err();
        assert!(matches!(refused, Error::Forbidden { .. }), "{refused}");
        assert!(refused.to_string().contains("--allow-host-network"));
        let allowed = ServerPolicy {
            allow_host_network: true,
            ..ServerPolicy::default()
        };
        allowed.check_create(&host).unwrap();
        for network in [NetworkPolicy::None, NetworkPolicy::Internet] {
            ServerPolicy::default()
                .check_create(&CreateOptions::default().network(network))
                .unwrap();
        }
    }
}
