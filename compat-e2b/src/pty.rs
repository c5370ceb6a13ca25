//! `sandbox.pty`: interactive terminals running `/bin/bash -i -l`. Needs the runtime's pty.

use std::collections::BTreeMap;
use std::fmt;
use std::future::IntoFuture;

use sandcove::{Command, ProcessSelector, ProcessSpec};

use crate::call::{with_request_timeout, BoxFuture, Call, IntoSeconds};
use crate::commands::{kill_pid, pid_u32, send_stdin, CommandHandle, ConnectBuilder, PtyHandler};
use crate::errors::{Result, SandboxException};
use crate::sandbox::Ctx;
use crate::translate;

/// `PtySize(rows, cols)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PtySize {
    /// `rows`.
    pub rows: i64,
    /// `cols`.
    pub cols: i64,
}

impl PtySize {
    /// `PtySize(rows, cols)`.
    pub fn new(rows: i64, cols: i64) -> Self {
        PtySize { rows, cols }
    }

    fn core(self) -> Result<sandcove::PtySize> {
        let dim = |v: i64, what: &str| {
            u16::try_from(v).ok().filter(|v| *v > 0).ok_or_else(|| {
                SandboxException::invalid_argument(format!("invalid pty {what} {v}"))
            })
        };
        Ok(sandcove::PtySize {
            rows: dim(self.rows, "rows")?,
            cols: dim(self.cols, "cols")?,
        })
    }
}

/// `sandbox.pty` (class `Pty`).
#[derive(Debug, Clone)]
pub struct Pty {
    pub(crate) ctx: Ctx,
}

impl Pty {
    /// `pty.create(size, on_data, user=None, cwd=None, envs=None, timeout=60,
    /// request_timeout=None) -> CommandHandle` (the async class's shape): `on_data` is called
    /// with the terminal's raw bytes as the handle is iterated or waited on; the bytes are
    /// also the third item when iterating.
    pub fn create(
        &self,
        size: PtySize,
        on_data: impl FnMut(Vec<u8>) + Send + 'static,
    ) -> PtyCreateBuilder {
        PtyCreateBuilder {
            ctx: self.ctx.clone(),
            size,
            on_data: Box::new(on_data),
            user: None,
            cwd: None,
            envs: BTreeMap::new(),
            timeout: Some(translate::DEFAULT_COMMAND_TIMEOUT),
            request_timeout: None,
        }
    }

    /// `pty.connect(pid, on_data, timeout=60, request_timeout=None) -> CommandHandle` (the
    /// async class's shape: `on_data` comes second).
    pub fn connect(
        &self,
        pid: i64,
        on_data: impl FnMut(Vec<u8>) + Send + 'static,
    ) -> ConnectBuilder {
        ConnectBuilder::pty(self.ctx.clone(), pid, Box::new(on_data))
    }

    /// `pty.send_stdin(pid, data, request_timeout=None)`: write to the terminal.
    pub fn send_stdin(&self, pid: i64, data: impl AsRef<[u8]>) -> Call<()> {
        send_stdin(self.ctx.clone(), pid, data.as_ref().to_vec())
    }

    /// `pty.resize(pid, size, request_timeout=None)`.
    pub fn resize(&self, pid: i64, size: PtySize) -> Call<()> {
        let ctx = self.ctx.clone();
        Call::new(async move {
            let pid = pid_u32(pid)?;
            ctx.core
                .resize_pty(ProcessSelector::Pid(pid), size.core()?)
                .await?;
            Ok(())
        })
    }

    /// `pty.kill(pid, request_timeout=None) -> bool`: `false` if no such process.
    pub fn kill(&self, pid: i64) -> Call<bool> {
        kill_pid(self.ctx.clone(), pid)
    }
}

/// The builder of `pty.create(...)`.
#[must_use = "a call does nothing until awaited"]
pub struct PtyCreateBuilder {
    ctx: Ctx,
    size: PtySize,
    on_data: PtyHandler,
    user: Option<String>,
    cwd: Option<String>,
    envs: BTreeMap<String, String>,
    timeout: Option<f64>,
    request_timeout: Option<f64>,
}

impl fmt::Debug for PtyCreateBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PtyCreateBuilder")
            .field("size", &self.size)
            .field("cwd", &self.cwd)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl PtyCreateBuilder {
    /// `request_timeout=`: bounds the start call, seconds.
    pub fn request_timeout(mut self, secs: impl IntoSeconds) -> Self {
        self.request_timeout = secs.into_seconds();
        self
    }

    /// `user=`.
    pub fn user(mut self, user: impl crate::OptionalString) -> Self {
        self.user = user.into_optional();
        self
    }

    /// `cwd=`.
    pub fn cwd(mut self, cwd: impl crate::OptionalString) -> Self {
        self.cwd = cwd.into_optional();
        self
    }

    /// `envs=`: override the defaults `TERM=xterm-256color`, `LANG`/`LC_ALL=C.UTF-8`.
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

    /// `timeout=`: the terminal is killed after this many seconds (default 60; `0` = none).
    pub fn timeout(mut self, timeout: impl IntoSeconds) -> Self {
        self.timeout = timeout.into_seconds();
        self
    }
}

impl IntoFuture for PtyCreateBuilder {
    type Output = Result<CommandHandle>;
    type IntoFuture = BoxFuture<'static, CommandHandle>;
    fn into_future(self) -> Self::IntoFuture {
        let limit = self.request_timeout;
        let start = Box::pin(async move {
            let ctx = self.ctx;
            let mut envs = BTreeMap::from([
                ("TERM".to_string(), "xterm-256color".to_string()),
                ("LANG".to_string(), "C.UTF-8".to_string()),
                ("LC_ALL".to_string(), "C.UTF-8".to_string()),
            ]);
            envs.extend(self.envs);
            let mut spec = ProcessSpec::new(Command::argv(["/bin/bash", "-i", "-l"]));
            spec.user = ctx.runtime_user(self.user.as_deref());
            spec.cwd = ctx.cwd_as(self.cwd.as_deref(), spec.user.as_deref());
            spec.envs = translate::process_envs(&ctx.envs, &ctx.id, &envs);
            spec.stdin = true;
            spec.timeout = translate::timeout_secs(self.timeout);
            spec.pty = Some(self.size.core()?);
            let stream = ctx.core.spawn(spec).await?.into_stream();
            let mut handle = CommandHandle::new(ctx, stream, true, None);
            handle.on_pty = Some(self.on_data);
            Ok(handle.pump_in_background())
        });
        with_request_timeout(start, limit)
    }
}
