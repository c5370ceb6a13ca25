//! `sandbox.pty`: interactive terminals running `/bin/bash -i -l`. Needs the runtime's pty.

use std::collections::BTreeMap;
use std::future::IntoFuture;

use sandcove::{Command, ProcessSelector, ProcessSpec};

use crate::call::{BoxFuture, Call, IntoSeconds};
use crate::commands::{kill_pid, pid_u32, send_stdin, CommandHandle, ConnectBuilder};
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
    /// `pty.create(size, user=None, cwd=None, envs=None, timeout=60, request_timeout=None)
    /// -> CommandHandle`: output arrives as the third item when iterating, or via
    /// `wait().on_pty(...)`.
    pub fn create(&self, size: PtySize) -> PtyCreateBuilder {
        PtyCreateBuilder {
            ctx: self.ctx.clone(),
            size,
            user: None,
            cwd: None,
            envs: BTreeMap::new(),
            timeout: Some(translate::DEFAULT_COMMAND_TIMEOUT),
        }
    }

    /// `pty.connect(pid, timeout=60, request_timeout=None) -> CommandHandle`.
    pub fn connect(&self, pid: i64) -> ConnectBuilder {
        ConnectBuilder::pty(self.ctx.clone(), pid)
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
            ctx.backend
                .resize_pty(&ctx.id, ProcessSelector::Pid(pid), size.core()?)
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
#[derive(Debug)]
#[must_use = "a call does nothing until awaited"]
pub struct PtyCreateBuilder {
    ctx: Ctx,
    size: PtySize,
    user: Option<String>,
    cwd: Option<String>,
    envs: BTreeMap<String, String>,
    timeout: Option<f64>,
}

impl PtyCreateBuilder {
    /// `user=`.
    pub fn user(mut self, user: impl Into<String>) -> Self {
        self.user = Some(user.into());
        self
    }

    /// `cwd=`.
    pub fn cwd(mut self, cwd: impl Into<String>) -> Self {
        self.cwd = Some(cwd.into());
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
        Box::pin(async move {
            let ctx = self.ctx;
            let mut envs = BTreeMap::from([
                ("TERM".to_string(), "xterm-256color".to_string()),
                ("LANG".to_string(), "C.UTF-8".to_string()),
                ("LC_ALL".to_string(), "C.UTF-8".to_string()),
            ]);
            envs.extend(self.envs);
            let spec = ProcessSpec {
                command: Command::argv(["/bin/bash", "-i", "-l"]),
                cwd: self
                    .cwd
                    .as_deref()
                    .filter(|c| !c.is_empty())
                    .map(|c| ctx.path(c)),
                envs: translate::process_envs(&ctx.envs, &ctx.id, &envs),
                user: ctx.runtime_user(self.user.as_deref()),
                tag: None,
                stdin: true,
                timeout: translate::timeout_secs(self.timeout),
                pty: Some(self.size.core()?),
            };
            let stream = ctx.backend.spawn(&ctx.id, spec).await?;
            Ok(CommandHandle::new(ctx, stream, true, None))
        })
    }
}
