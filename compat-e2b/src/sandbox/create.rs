//! Creating and connecting: the builders of `Sandbox.create(...)` (with its `network=` and
//! `lifecycle=` options) and `Sandbox.connect(...)`, and the connect shared with the wire protocol.

use std::collections::BTreeMap;
use std::future::IntoFuture;
use std::marker::PhantomData;

use sandcove::{CreateOptions, NetworkPolicy, TimeoutAction};

use super::{
    whole_seconds, ConnectionConfig, Inner, Sandbox, ALL_TRAFFIC, PRIVATE_TRAFFIC_ANNOTATION,
    SANDBOX_DOMAIN, TEMPLATE_ANNOTATION,
};
use crate::call::{client, with_request_timeout, BoxFuture, IntoSeconds};
use crate::errors::{Result, SandboxException};
use crate::gaps::refuse;
use crate::translate;

/// `network=` of `Sandbox.create`: `SandboxNetworkOpts`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SandboxNetworkOpts {
    /// `allow_out`: CIDRs or hosts allowed out.
    pub allow_out: Option<Vec<String>>,
    /// `deny_out`: CIDRs denied out; `[ALL_TRAFFIC]` alone is supported.
    pub deny_out: Option<Vec<String>>,
    /// `rules`.
    pub rules: Option<Vec<serde_json::Value>>,
    /// `egress_proxy`.
    pub egress_proxy: Option<serde_json::Value>,
    /// `allow_public_traffic`: `True` (the default) is supported.
    pub allow_public_traffic: Option<bool>,
    /// `mask_request_host`.
    pub mask_request_host: Option<String>,
}

/// `lifecycle=` of `Sandbox.create`: `SandboxLifecycle`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxLifecycle {
    /// `on_timeout`: `"kill"` (default) or `"pause"`.
    pub on_timeout: Option<String>,
    /// `keep_memory` of the pause action.
    pub keep_memory: Option<bool>,
    /// `auto_resume`.
    pub auto_resume: Option<bool>,
}

/// The builder of `Sandbox.create(...)`; await it. `S` is the sandbox class it yields.
#[derive(Debug)]
#[must_use = "a call does nothing until awaited"]
pub struct CreateBuilder<S = Sandbox> {
    pub(crate) template: Option<String>,
    timeout: Option<f64>,
    metadata: BTreeMap<String, String>,
    envs: BTreeMap<String, String>,
    secure: Option<bool>,
    allow_internet_access: Option<bool>,
    network: Option<SandboxNetworkOpts>,
    lifecycle: Option<SandboxLifecycle>,
    mcp: bool,
    iam: bool,
    volume_mounts: BTreeMap<String, String>,
    config: ConnectionConfig,
    /// Set by the wire listener, whose port forwarding checks the sandbox's traffic token:
    /// only there can `allow_public_traffic=False` be honoured.
    pub(crate) traffic_checked_by_listener: bool,
    _target: PhantomData<fn() -> S>,
}

impl<S> Default for CreateBuilder<S> {
    fn default() -> Self {
        CreateBuilder {
            template: None,
            timeout: None,
            metadata: BTreeMap::new(),
            envs: BTreeMap::new(),
            secure: None,
            allow_internet_access: None,
            network: None,
            lifecycle: None,
            mcp: false,
            iam: false,
            volume_mounts: BTreeMap::new(),
            config: ConnectionConfig::default(),
            traffic_checked_by_listener: false,
            _target: PhantomData,
        }
    }
}

impl<S> CreateBuilder<S> {
    /// `template=`: `None`/`"base"` is the host's system directories (or the image
    /// [`templates`](crate::templates) maps it to); a snapshot id works too, and on a runtime
    /// with images an image reference or a name the template table maps to one.
    pub fn template(mut self, template: impl crate::OptionalString) -> Self {
        self.template = template.into_optional();
        self
    }

    /// `timeout=`: sandbox lifetime in seconds (default 300; `0` means 300, as in E2B).
    pub fn timeout(mut self, timeout: impl IntoSeconds) -> Self {
        self.timeout = timeout.into_seconds();
        self
    }

    /// `metadata=`: string pairs returned by `list`/`get_info` and filterable.
    pub fn metadata<K: Into<String>, V: Into<String>>(
        mut self,
        metadata: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        self.metadata = metadata
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        self
    }

    /// `envs=`: environment for every command, PTY and code run.
    pub fn envs<K: Into<String>, V: Into<String>>(
        mut self,
        envs: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        self.envs = envs
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        self
    }

    /// `secure=`: accepted; there is no envd access token to protect here (signed URLs are
    /// not supported either way).
    pub fn secure(mut self, secure: bool) -> Self {
        self.secure = Some(secure);
        self
    }

    /// `allow_internet_access=`: `True` is isolated internet access (`NetworkPolicy::Internet`;
    /// `Unavailable` where the runtime lacks it), `False` loopback only; unset, internet where
    /// the runtime has it, else loopback only with one warning.
    pub fn allow_internet_access(mut self, allow: bool) -> Self {
        self.allow_internet_access = Some(allow);
        self
    }

    /// `network=`: only "deny all egress" (`deny_out=[ALL_TRAFFIC]`) and
    /// `allow_public_traffic=True` are supported.
    pub fn network(mut self, network: SandboxNetworkOpts) -> Self {
        self.network = Some(network);
        self
    }

    /// `lifecycle=`: `on_timeout` `"kill"` or `"pause"` (needs the runtime's pause), and
    /// `auto_resume`.
    pub fn lifecycle(mut self, lifecycle: SandboxLifecycle) -> Self {
        self.lifecycle = Some(lifecycle);
        self
    }

    /// `mcp=`: not supported (see MAPPING.md).
    pub fn mcp(mut self, _mcp: serde_json::Value) -> Self {
        self.mcp = true;
        self
    }

    /// `iam=`: not supported (see MAPPING.md).
    pub fn iam(mut self, _iam: serde_json::Value) -> Self {
        self.iam = true;
        self
    }

    /// `volume_mounts=`: mount path → volume name (needs the runtime's volumes).
    pub fn volume_mounts<K: Into<String>, V: Into<String>>(
        mut self,
        mounts: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        self.volume_mounts = mounts
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        self
    }

    /// `api_key=`: accepted and ignored (never sent anywhere).
    pub fn api_key(mut self, api_key: impl crate::OptionalString) -> Self {
        self.config.api_key = api_key.into_optional();
        self
    }

    /// `request_timeout=`: bounds the create call, seconds.
    pub fn request_timeout(mut self, secs: impl IntoSeconds) -> Self {
        self.config.request_timeout = secs.into_seconds();
        self
    }

    /// Validate and translate into core options. Pure apart from the capability and snapshot
    /// look-ups; nothing is created.
    pub(crate) async fn options(&self, client: &sandcove::Client) -> Result<CreateOptions> {
        if self.mcp {
            return Err(refuse("mcp"));
        }
        if self.iam {
            return Err(refuse("iam"));
        }
        let caps = client.ready().await?;
        let mut options = CreateOptions::default()
            .user(translate::E2B_USER)
            .home(translate::E2B_HOME);
        options.labels = self.metadata.clone();
        // Template: the base filesystem, or a snapshot id.
        let template = self
            .template
            .clone()
            .unwrap_or_else(|| translate::DEFAULT_TEMPLATE.into());
        let is_default = template == translate::DEFAULT_TEMPLATE
            || template == crate::code_interpreter::DEFAULT_TEMPLATE;
        let mapped = crate::templates::image_for(&template);
        if let (true, Some(image)) = (is_default, &mapped) {
            // A default template the table maps to an image runs it (where images run).
            if !caps.images {
                return Err(refuse("custom_template"));
            }
            options.template = Some(image.clone());
        } else if !is_default {
            let snapshot = if caps.snapshots {
                client
                    .snapshots()
                    .await?
                    .into_iter()
                    .find(|s| s.id == template || s.name.as_deref() == Some(&template))
            } else {
                None
            };
            match snapshot {
                Some(s) => options.snapshot = Some(s.id),
                None => {
                    // A snapshot this runtime deleted is not found (and says when), not a
                    // custom template.
                    let deleted = if caps.snapshots {
                        client
                            .backend()
                            .tombstone(sandcove::ResourceKind::Snapshot, &template)
                            .await
                            .ok()
                            .flatten()
                    } else {
                        None
                    };
                    match deleted {
                        Some(t) => return Err(t.to_error().into()),
                        // Not a snapshot: an image, mapped by the table or named directly,
                        // where the runtime runs images (it must have it stored).
                        None if caps.images => {
                            options.template = Some(mapped.unwrap_or_else(|| template.clone()))
                        }
                        None => return Err(refuse("custom_template")),
                    }
                }
            }
        }
        // Which vendor made it (and from what), kept outside the sandbox: `sandcove ls`
        // shows the vendor column from it.
        options
            .annotations
            .insert(TEMPLATE_ANNOTATION.into(), template.clone());
        // Lifetime: `timeout or 300`.
        let secs = match self.timeout {
            Some(0.0) => None,
            other => other,
        };
        options.timeout = Some(whole_seconds(secs)?);
        // Envs: E2B's defaults, then the caller's.
        options.envs = translate::default_sandbox_envs(&template);
        options
            .envs
            .extend(self.envs.iter().map(|(k, v)| (k.clone(), v.clone())));
        // Network.
        let mut internet = self.allow_internet_access;
        if let Some(net) = &self.network {
            let deny_all = net.deny_out.as_deref() == Some(&[ALL_TRAFFIC.to_string()][..]);
            let unsupported = net.allow_out.is_some()
                || (net.deny_out.is_some() && !deny_all)
                || net.rules.is_some()
                || net.egress_proxy.is_some()
                || net.mask_request_host.is_some();
            if unsupported {
                return Err(refuse("network_rules"));
            }
            if net.allow_public_traffic == Some(false) {
                if !self.traffic_checked_by_listener {
                    return Err(refuse("private_traffic"));
                }
                // The listener's port forwarding then asks for the traffic token.
                options
                    .annotations
                    .insert(PRIVATE_TRAFFIC_ANNOTATION.into(), "true".into());
            }
            if deny_all {
                internet = Some(false);
            }
        }
        options.network = match internet {
            Some(false) => NetworkPolicy::None,
            // Asked for explicitly: the runtime refuses it (Unavailable) where it cannot.
            Some(true) => NetworkPolicy::Internet,
            // E2B's default is internet access: isolated internet where the runtime has it,
            // else loopback only with a warning. Never the host's network.
            None => caps.vendor_internet_default(),
        };
        // Lifecycle.
        if let Some(lc) = &self.lifecycle {
            let pause = match lc.on_timeout.as_deref() {
                None | Some("kill") => false,
                Some("pause") => true,
                Some(other) => {
                    return Err(SandboxException::invalid_argument(format!(
                        "lifecycle.on_timeout must be 'kill' or 'pause', got '{other}'"
                    )))
                }
            };
            if lc.auto_resume == Some(true) && !pause {
                return Err(SandboxException::invalid_argument(
                    "auto_resume requires on_timeout='pause'",
                ));
            }
            if lc.keep_memory.is_some() && !pause {
                return Err(SandboxException::invalid_argument(
                    "keep_memory can only be given with the pause action",
                ));
            }
            let files_only = lc.keep_memory == Some(false);
            if files_only && lc.auto_resume == Some(true) {
                // The SDK refuses it too: traffic cannot wake what has no memory to restore.
                return Err(SandboxException::invalid_argument(
                    "auto_resume: True is not a valid value with keep_memory=False: a \
                     filesystem-only pause is resumed with Sandbox.connect()",
                ));
            }
            if pause && files_only {
                // A filesystem-only auto-pause is the runtime's stop at the lease's end: files
                // kept, processes ended, reported as paused; `connect` starts it again.
                if !caps.lease_stop {
                    return Err(sandcove::Error::not_supported(
                        "lifecycle auto-pause with keep_memory=False",
                        "this runtime cannot stop a sandbox at its timeout; use \
                         on_timeout='kill' with a longer timeout, or pause(keep_memory=False) \
                         before it",
                    )
                    .into());
                }
                options.on_timeout = TimeoutAction::Stop;
            } else if pause {
                if !caps.pause {
                    return Err(sandcove::Error::not_supported(
                        "lifecycle on_timeout='pause'",
                        "this runtime cannot pause yet; use on_timeout='kill' with a longer timeout",
                    )
                    .into());
                }
                options.on_timeout = TimeoutAction::Pause;
                options.auto_resume = lc.auto_resume.unwrap_or(false);
            }
        }
        // Volumes.
        if !self.volume_mounts.is_empty() {
            if !caps.volumes {
                return Err(sandcove::Error::not_supported(
                    "Sandbox.create(volume_mounts=...)",
                    "this runtime has no volumes yet; copy files in with files.write",
                )
                .into());
            }
            options.volumes = self
                .volume_mounts
                .iter()
                .map(|(path, volume)| sandcove::VolumeMount::new(volume.clone(), path.clone()))
                .collect();
        }
        let _ = self.secure;
        Ok(options)
    }

    /// Create the sandbox `options` (made by [`CreateBuilder::options`]) describe: an image
    /// the runtime does not hold is E2B's 404 "template 'NAME' not found", naming the
    /// template as given and how to store the image.
    pub(crate) async fn create(
        &self,
        client: &sandcove::Client,
        options: CreateOptions,
    ) -> Result<sandcove::SandboxInfo> {
        match client.create_described(options).await {
            Ok((_, info)) => Ok(info),
            Err(sandcove::Error::NotFound { what }) if what.starts_with("image ") => {
                let template = self
                    .template
                    .as_deref()
                    .unwrap_or(translate::DEFAULT_TEMPLATE);
                Err(SandboxException::NotFound {
                    message: format!("template '{template}' not found: {what}"),
                    source: Some(Box::new(sandcove::Error::NotFound { what })),
                })
            }
            Err(e) => Err(e.into()),
        }
    }

    pub(crate) async fn run(self) -> Result<Sandbox> {
        let client = client()?;
        let options = self.options(&client).await?;
        let info = self.create(&client, options).await?;
        let mut config = self.config;
        config.domain = SANDBOX_DOMAIN.into();
        Ok(Sandbox::from_ctx(Inner::from_info(&client, &info), config))
    }
}

impl<S: From<Sandbox> + Send + 'static> IntoFuture for CreateBuilder<S> {
    type Output = Result<S>;
    type IntoFuture = BoxFuture<'static, S>;
    fn into_future(self) -> Self::IntoFuture {
        let limit = self.config.request_timeout;
        with_request_timeout(
            Box::pin(async move { self.run().await.map(S::from) }),
            limit,
        )
    }
}

/// The builder of `Sandbox.connect(...)`; await it. `S` is the sandbox class it yields.
#[derive(Debug)]
#[must_use = "a call does nothing until awaited"]
pub struct ConnectBuilder<S = Sandbox> {
    sandbox_id: String,
    timeout: Option<f64>,
    config: ConnectionConfig,
    _target: PhantomData<fn() -> S>,
}

impl<S> ConnectBuilder<S> {
    pub(crate) fn new(sandbox_id: String, config: ConnectionConfig) -> Self {
        ConnectBuilder {
            sandbox_id,
            timeout: None,
            config,
            _target: PhantomData,
        }
    }

    /// `timeout=`: the sandbox lives at least this many seconds from now (default 300).
    pub fn timeout(mut self, timeout: impl IntoSeconds) -> Self {
        self.timeout = timeout.into_seconds();
        self
    }

    /// `api_key=`: accepted and ignored.
    pub fn api_key(mut self, api_key: impl crate::OptionalString) -> Self {
        self.config.api_key = api_key.into_optional();
        self
    }

    /// `request_timeout=`: bounds the call, seconds.
    pub fn request_timeout(mut self, secs: impl IntoSeconds) -> Self {
        self.config.request_timeout = secs.into_seconds();
        self
    }

    pub(crate) async fn run(self) -> Result<Sandbox> {
        let client = client()?;
        let info = connect_on(&client, &self.sandbox_id, self.timeout).await?;
        let mut config = self.config;
        config.domain = SANDBOX_DOMAIN.into();
        Ok(Sandbox::from_ctx(Inner::from_info(&client, &info), config))
    }
}

/// `Sandbox.connect(id, timeout)` on `client`: resume a paused sandbox and extend (never
/// shorten) its lifetime to `timeout` seconds from now (default 300). Shared by the Rust
/// facade and the wire protocol.
pub(crate) async fn connect_on(
    client: &sandcove::Client,
    sandbox_id: &str,
    timeout: Option<f64>,
) -> Result<sandcove::SandboxInfo> {
    let timeout = whole_seconds(timeout)?;
    let sandbox = client.sandbox(sandbox_id);
    let mut info = match sandbox.info().await {
        Ok(info) => info,
        Err(e) if e.is_not_found() => {
            // A saved id of a sandbox that ended recently says when and why.
            let (e, why) = match client
                .tombstone(sandcove::ResourceKind::Sandbox, sandbox_id)
                .await
            {
                Ok(Some(t)) => {
                    let gone = t.to_error();
                    let why = format!(": {gone}");
                    (gone, why)
                }
                _ => (e, String::new()),
            };
            return Err(SandboxException::SandboxNotFound {
                message: format!("Paused sandbox {sandbox_id} not found{why}"),
                source: Some(Box::new(e)),
            });
        }
        Err(e) => return Err(e.into()),
    };
    match info.state {
        sandcove::SandboxState::Paused => info = sandbox.resume().await?,
        // Paused with keep_memory=False: its files, fresh processes.
        sandcove::SandboxState::Stopped => info = sandbox.start().await?,
        _ => {}
    }
    let wanted = sandcove::now_millis() + timeout.as_millis() as u64;
    if info.ends_at < wanted {
        info = sandbox.set_timeout(timeout).await?;
    }
    Ok(info)
}

impl<S: From<Sandbox> + Send + 'static> IntoFuture for ConnectBuilder<S> {
    type Output = Result<S>;
    type IntoFuture = BoxFuture<'static, S>;
    fn into_future(self) -> Self::IntoFuture {
        let limit = self.config.request_timeout;
        with_request_timeout(
            Box::pin(async move { self.run().await.map(S::from) }),
            limit,
        )
    }
}
