//! Who may do what: one authorization model for every listener.
//!
//! A request proves at most one [`Credential`]: the listener's credential check (one function
//! per listener, run before routing) reads the headers, verifies what they carry and records
//! the widest credential they prove. A credential that is presented and wrong is refused there
//! and then (`401`): it never falls back to a narrower one.
//!
//! Every route of every listener is declared with the [`Principal`]s it accepts, through
//! [`Routes`]: the router is built from those declarations, so a route cannot be served
//! without one, and each route checks the request's credential against its own declaration
//! before its handler runs ([`RouteAuth::decide`]). A sandbox-scoped credential (a sandbox's
//! token, a signed URL, a traffic token) reaches a route only when the route accepts that kind
//! *and* addresses the credential's own sandbox (a `{id}` in the path, or the sandbox the
//! listener's check bound it to), so it never reaches the control plane or another sandbox.
//!
//! The same table is what the authorization matrix tests walk (every route × every kind of
//! credential) and what `SECURITY.md`'s table is generated from ([`markdown`]).

use std::sync::Arc;

use axum::extract::{RawPathParams, Request, State};
use axum::handler::Handler;
use axum::http::Method;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{on, MethodFilter, MethodRouter};
use axum::Router;

/// A kind of credential, from widest to narrowest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Principal {
    /// The server's API key: the operator. Every route, every sandbox.
    ServerKey,
    /// A sandbox-scoped token (E2B's `envdAccessToken`): that sandbox's data plane only.
    SandboxToken,
    /// E2B's `trafficAccessToken`: one sandbox's ports and code interpreter.
    TrafficToken,
    /// A preview token: one port of one sandbox.
    PreviewToken,
    /// A signed URL: one sandbox, one path, one operation, until its expiry.
    SignedUrl,
    /// No credential at all.
    Anonymous,
}

impl Principal {
    /// Every kind, widest first.
    pub const ALL: [Principal; 6] = [
        Principal::ServerKey,
        Principal::SandboxToken,
        Principal::TrafficToken,
        Principal::PreviewToken,
        Principal::SignedUrl,
        Principal::Anonymous,
    ];

    /// Whether a credential of this kind is bound to one sandbox.
    pub fn is_sandbox_scoped(self) -> bool {
        matches!(
            self,
            Principal::SandboxToken
                | Principal::TrafficToken
                | Principal::PreviewToken
                | Principal::SignedUrl
        )
    }

    /// The name used in the tables of `SECURITY.md`.
    pub fn name(self) -> &'static str {
        match self {
            Principal::ServerKey => "server key",
            Principal::SandboxToken => "sandbox token",
            Principal::TrafficToken => "traffic token",
            Principal::PreviewToken => "preview token",
            Principal::SignedUrl => "signed URL",
            Principal::Anonymous => "none",
        }
    }
}

/// Only the server key.
pub const SERVER_KEY: &[Principal] = &[Principal::ServerKey];

/// What a request proved, recorded by its listener's credential check as a request extension.
/// A request without one is anonymous.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    /// Its kind.
    pub principal: Principal,
    /// The sandbox a sandbox-scoped credential is bound to.
    pub sandbox: Option<String>,
}

impl Credential {
    /// The server's key.
    pub fn server_key() -> Self {
        Credential {
            principal: Principal::ServerKey,
            sandbox: None,
        }
    }

    /// No credential.
    pub fn anonymous() -> Self {
        Credential {
            principal: Principal::Anonymous,
            sandbox: None,
        }
    }

    /// A credential of a sandbox-scoped kind, bound to sandbox `id`.
    pub fn for_sandbox(principal: Principal, id: impl Into<String>) -> Self {
        Credential {
            principal,
            sandbox: Some(id.into()),
        }
    }
}

/// Why a route refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No credential this route accepts was presented (`401`).
    Unauthenticated,
    /// A valid credential was presented, but not one of a kind or a scope this route
    /// accepts (`403`).
    Forbidden,
}

/// One route's declaration: the single source of its router entry, its check, the matrix
/// tests and the documentation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteAuth {
    /// The method, or `None` for any (a forwarded request, a `CONNECT`).
    pub method: Option<Method>,
    /// The path as routed (`/sandboxes/{id}`), or a description of what is matched for a
    /// route served before routing (`Host: {port}-{id}.<domain>`).
    pub path: String,
    /// The kinds of credential it accepts.
    pub accepts: &'static [Principal],
}

impl RouteAuth {
    /// Whether this route lets `credential` through, for a request addressing sandbox
    /// `target` (its path's `{id}`, where it has one).
    pub fn decide(&self, credential: &Credential, target: Option<&str>) -> Result<(), Refusal> {
        let refusal = if credential.principal == Principal::Anonymous {
            Refusal::Unauthenticated
        } else {
            Refusal::Forbidden
        };
        if !self.accepts.contains(&credential.principal) {
            return Err(refusal);
        }
        if credential.principal.is_sandbox_scoped() {
            // Bound to one sandbox: it must say which, and a path naming a sandbox must
            // name that one.
            let Some(own) = credential.sandbox.as_deref() else {
                return Err(refusal);
            };
            if target.is_some_and(|t| t != own) {
                return Err(refusal);
            }
        }
        Ok(())
    }

    /// The method as written in tables (`*` for any).
    pub fn method_name(&self) -> &str {
        self.method.as_ref().map_or("*", Method::as_str)
    }
}

/// How a listener answers a refusal, in its vendor's error shape.
pub type Refuse = fn(&RouteAuth, Refusal) -> Response;

/// A router built together with its authorization table: each route is added with the
/// principals it accepts, and only so.
pub struct Routes<S> {
    router: Router<S>,
    table: Vec<RouteAuth>,
    refuse: Refuse,
}

impl<S> Routes<S>
where
    S: Clone + Send + Sync + 'static,
{
    /// An empty set of routes whose refusals `refuse` renders.
    pub fn new(refuse: Refuse) -> Self {
        Routes {
            router: Router::new(),
            table: Vec::new(),
            refuse,
        }
    }

    /// Serve `handler` for `method path`, to requests whose credential is one of `accepts`.
    pub fn route<H, T>(
        self,
        method: Method,
        path: &'static str,
        accepts: &'static [Principal],
        handler: H,
    ) -> Self
    where
        H: Handler<T, S>,
        T: 'static,
    {
        let filter = MethodFilter::try_from(method.clone()).expect("a standard method");
        self.method_route(method, path, accepts, on(filter, handler))
    }

    /// As [`route`](Self::route), for a handler already made into a method router (which
    /// must serve only `method`).
    pub fn method_route(
        mut self,
        method: Method,
        path: &'static str,
        accepts: &'static [Principal],
        handler: MethodRouter<S>,
    ) -> Self {
        let declared = RouteAuth {
            method: Some(method),
            path: path.to_string(),
            accepts,
        };
        let guard = Arc::new((declared.clone(), self.refuse));
        self.table.push(declared);
        self.router = self.router.route(
            path,
            handler.layer(middleware::from_fn_with_state(guard, check)),
        );
        self
    }

    /// Declare a route the listener serves before routing (port forwarding by `Host`, a
    /// `CONNECT` tunnel): it is in the table, and the listener's own code applies
    /// [`RouteAuth::decide`] to it.
    pub fn declare(
        mut self,
        method: Option<Method>,
        path: &str,
        accepts: &'static [Principal],
    ) -> Self {
        self.table.push(RouteAuth {
            method,
            path: path.to_string(),
            accepts,
        });
        self
    }

    /// Serve `other` under `prefix`, its declarations with it.
    pub fn nest(mut self, prefix: &str, other: Routes<S>) -> Self {
        self.table.extend(other.table.into_iter().map(|mut r| {
            r.path = format!("{prefix}{}", r.path);
            r
        }));
        self.router = self.router.nest(prefix, other.router);
        self
    }

    /// Serve `other`'s routes too.
    pub fn merge(mut self, other: Routes<S>) -> Self {
        self.table.extend(other.table);
        self.router = self.router.merge(other.router);
        self
    }

    /// The declarations so far.
    pub fn table(&self) -> &[RouteAuth] {
        &self.table
    }

    /// The router and its table.
    pub fn into_parts(self) -> (Router<S>, Vec<RouteAuth>) {
        (self.router, self.table)
    }
}

/// The check in front of every declared route.
async fn check(
    State(guard): State<Arc<(RouteAuth, Refuse)>>,
    params: Result<RawPathParams, axum::extract::rejection::RawPathParamsRejection>,
    request: Request,
    next: Next,
) -> Response {
    let (declared, refuse) = &*guard;
    let anonymous = Credential::anonymous();
    let credential = request
        .extensions()
        .get::<Credential>()
        .unwrap_or(&anonymous);
    let target = params.as_ref().ok().and_then(|p| {
        p.iter()
            .find(|(name, _)| *name == "id")
            .map(|(_, value)| value)
    });
    match declared.decide(credential, target) {
        Ok(()) => next.run(request).await,
        Err(refusal) => refuse(declared, refusal),
    }
}

/// The previews' table (and the engine's file-URL listener's): each exposed port is a listener of its own (the engine's monitor or
/// the Kubernetes backend's serving process holds it), so a preview token is bound to one
/// port of one sandbox by where it is presented; a private preview checks it on every
/// request before the sandbox is contacted, a public one asks for nothing.
pub fn preview_table() -> Vec<RouteAuth> {
    vec![
        RouteAuth {
            method: None,
            path: "a private preview's listener (any path)".into(),
            accepts: &[Principal::PreviewToken],
        },
        RouteAuth {
            method: None,
            path: "a public preview's listener (any path)".into(),
            accepts: &[Principal::Anonymous],
        },
        // The embedded engine's file-URL listener (one per sandbox, held by its monitor): the
        // token in the path is the credential, checked against the monitor's key and bound to
        // its own sandbox before the file API is touched.
        RouteAuth {
            method: Some(Method::GET),
            path: "the engine's file-URL listener: /files/{token}".into(),
            accepts: &[Principal::SignedUrl],
        },
        RouteAuth {
            method: Some(Method::PUT),
            path: "the engine's file-URL listener: /files/{token}".into(),
            accepts: &[Principal::SignedUrl],
        },
        RouteAuth {
            method: Some(Method::POST),
            path: "the engine's file-URL listener: /files/{token}".into(),
            accepts: &[Principal::SignedUrl],
        },
    ]
}

/// Constant-time equality of a presented secret with the expected one (see
/// [`sandcove_core::secret::secrets_match`]).
pub use sandcove_core::secret::secrets_match as keys_match;

/// A listener's table as Markdown: one row per route, the principals it accepts.
pub fn markdown(table: &[RouteAuth]) -> String {
    let mut out = String::from("| method | route | accepts |\n|---|---|---|\n");
    for route in table {
        let accepts: Vec<&str> = route.accepts.iter().map(|p| p.name()).collect();
        out.push_str(&format!(
            "| {} | `{}` | {} |\n",
            route.method_name(),
            route.path,
            accepts.join(", ")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(accepts: &'static [Principal]) -> RouteAuth {
        RouteAuth {
            method: Some(Method::GET),
            path: "/x/{id}".into(),
            accepts,
        }
    }

    #[test]
    fn a_route_admits_only_what_it_declares() {
        let key_only = route(SERVER_KEY);
        assert_eq!(
            key_only.decide(&Credential::server_key(), Some("a")),
            Ok(())
        );
        assert_eq!(
            key_only.decide(&Credential::anonymous(), None),
            Err(Refusal::Unauthenticated)
        );
        for p in Principal::ALL.into_iter().filter(|p| p.is_sandbox_scoped()) {
            assert_eq!(
                key_only.decide(&Credential::for_sandbox(p, "a"), Some("a")),
                Err(Refusal::Forbidden),
                "{p:?} on a server-key route"
            );
        }
    }

    #[test]
    fn a_sandbox_credential_reaches_only_its_own_sandbox() {
        let data = route(&[Principal::ServerKey, Principal::SandboxToken]);
        let a = Credential::for_sandbox(Principal::SandboxToken, "a");
        assert_eq!(data.decide(&a, Some("a")), Ok(()));
        assert_eq!(data.decide(&a, None), Ok(()), "bound by the listener");
        assert_eq!(data.decide(&a, Some("b")), Err(Refusal::Forbidden));
        let unbound = Credential {
            principal: Principal::SandboxToken,
            sandbox: None,
        };
        assert_eq!(data.decide(&unbound, Some("a")), Err(Refusal::Forbidden));
        assert_eq!(
            data.decide(
                &Credential::for_sandbox(Principal::SignedUrl, "a"),
                Some("a")
            ),
            Err(Refusal::Forbidden),
            "a kind the route does not accept"
        );
    }
}
