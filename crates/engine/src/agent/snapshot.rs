//! Filesystem export and import for snapshots and forks: through the host's `tar` in a
//! host-base sandbox, by the agent itself for an image sandbox's writable layer.

use super::*;

/// Paths excluded from filesystem export: mounts of host or kernel filesystems and the
/// agent's own files. (`--one-file-system` already keeps tar out of other mounts.)
pub(super) const EXPORT_EXCLUDES: &[&str] = &[
    "./proc",
    "./dev",
    "./usr",
    "./bin",
    "./sbin",
    "./lib",
    "./lib32",
    "./lib64",
    "./libx32",
    "./etc",
    "./opt",
    "./.sandcove",
];

/// A helper program the agent runs for itself (with its own privileges inside the sandbox).
pub(super) struct Tool {
    pub(super) pid: u32,
    pub(super) stdin: Option<tokio::net::unix::pipe::Sender>,
    pub(super) stdout: tokio::net::unix::pipe::Receiver,
    pub(super) stderr: tokio::net::unix::pipe::Receiver,
    pub(super) exit: oneshot::Receiver<ExitStatus>,
}

/// Start a tool. It is registered with the sandbox reaper before this returns, and the reaper
/// runs on this same single-threaded runtime, so its exit status cannot be missed.
pub(super) fn spawn_tool(agent: &Agent, argv: &[String], with_stdin: bool) -> Result<Tool> {
    let mut cmd = std::process::Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .env_clear()
        .env("PATH", DEFAULT_PATH)
        .current_dir("/")
        .stdin(if with_stdin {
            std::process::Stdio::piped()
        } else {
            std::process::Stdio::null()
        })
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    // SAFETY: one async-signal-safe syscall between fork and exec.
    unsafe {
        cmd.pre_exec(|| sys::cloexec_from(3));
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| Error::from_io(&e, &format!("start {}", argv[0])))?;
    let (tx, exit) = oneshot::channel();
    agent
        .procs
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .exit_waiters
        .insert(child.id(), tx);
    let pipe_err = |e: std::io::Error| Error::from_io(&e, "tool pipe");
    let stdin = match child.stdin.take() {
        Some(s) => Some(
            tokio::net::unix::pipe::Sender::from_owned_fd(OwnedFd::from(s)).map_err(pipe_err)?,
        ),
        None => None,
    };
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| Error::backend("tool stdout"))?;
    let stderr = child
        .stderr
        .take()
        .ok_or_else(|| Error::backend("tool stderr"))?;
    Ok(Tool {
        pid: child.id(),
        stdin,
        stdout: tokio::net::unix::pipe::Receiver::from_owned_fd(OwnedFd::from(stdout))
            .map_err(pipe_err)?,
        stderr: tokio::net::unix::pipe::Receiver::from_owned_fd(OwnedFd::from(stderr))
            .map_err(pipe_err)?,
        exit,
    })
}

/// Kill a tool and wait until it is reaped (bounded), so an error answered after this leaves
/// no tool running.
pub(super) async fn end_tool(pid: u32, exit: oneshot::Receiver<ExitStatus>) {
    let _ = sys::kill(pid as i32, libc::SIGKILL);
    let _ = tokio::time::timeout(Duration::from_secs(10), exit).await;
}

/// Collect a tool's stderr in the background (so it never blocks on a full pipe).
pub(super) fn drain(
    mut pipe: tokio::net::unix::pipe::Receiver,
) -> tokio::task::JoinHandle<Vec<u8>> {
    tokio::spawn(async move {
        let mut text = Vec::new();
        let _ = pipe.read_to_end(&mut text).await;
        text
    })
}

/// Stream a tar of the sandbox's own filesystem (the tmpfs root) to the client. Sparse files
/// go in sparse (`--sparse`: their holes found with `SEEK_HOLE`, stored as a map), so a file
/// with a large apparent size costs the host only the data it holds; `tar -x` restores the
/// holes.
pub(super) async fn export_fs(agent: &Agent, stream: &mut impl Conn) -> Result<()> {
    let mut argv: Vec<String> = [
        "tar",
        "-C",
        "/",
        "--one-file-system",
        "--numeric-owner",
        "--sparse",
        "-cf",
        "-",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    argv.extend(EXPORT_EXCLUDES.iter().map(|e| format!("--exclude={e}")));
    argv.push(".".into());
    let mut tool = spawn_tool(agent, &argv, false)?;
    let errors = drain(tool.stderr);
    let mut buf = vec![0u8; CHUNK];
    let copied: Result<()> = async {
        loop {
            let n = tool
                .stdout
                .read(&mut buf)
                .await
                .map_err(|e| Error::from_io(&e, "snapshot"))?;
            if n == 0 {
                return Ok(());
            }
            proto::write_frame(stream, &AgentReply::Data, &buf[..n]).await?;
        }
    }
    .await;
    if let Err(e) = copied {
        // The client went away (or the pipe broke): end tar before answering.
        end_tool(tool.pid, tool.exit).await;
        return Err(e);
    }
    let status = tool
        .exit
        .await
        .map_err(|_| Error::backend("tar vanished"))?;
    let text = errors.await.unwrap_or_default();
    // tar exits 1 when a file changed while it was read; the archive is still complete.
    if !matches!(status.code, Some(0 | 1)) {
        return Err(Error::backend(format!(
            "tar failed ({status:?}): {}",
            String::from_utf8_lossy(&text).trim()
        )));
    }
    proto::write_frame(stream, &AgentReply::End, &[]).await
}

/// Unpack a tar streamed by the client into the sandbox root.
pub(super) async fn import_fs(agent: &Agent, stream: &mut impl Conn) -> Result<()> {
    let argv: Vec<String> = [
        "tar",
        "-C",
        "/",
        "--numeric-owner",
        "--same-permissions",
        "-xf",
        "-",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut tool = spawn_tool(agent, &argv, true)?;
    let errors = drain(tool.stderr);
    let mut input = tool
        .stdin
        .take()
        .ok_or_else(|| Error::backend("tar stdin"))?;
    let mut out = tool.stdout;
    let sink = tokio::spawn(async move {
        let mut ignored = Vec::new();
        let _ = out.read_to_end(&mut ignored).await;
    });
    let fed: Result<()> = async {
        while let Some(chunk) = read_data_frame(stream).await? {
            input
                .write_all(&chunk)
                .await
                .map_err(|e| Error::from_io(&e, "restore"))?;
        }
        Ok(())
    }
    .await;
    drop(input);
    if let Err(e) = fed {
        // The archive broke off: end tar before answering, so nothing keeps unpacking.
        end_tool(tool.pid, tool.exit).await;
        let _ = sink.await;
        return Err(e);
    }
    let status = tool
        .exit
        .await
        .map_err(|_| Error::backend("tar vanished"))?;
    let _ = sink.await;
    let text = errors.await.unwrap_or_default();
    if !status.success() {
        return Err(Error::backend(format!(
            "restoring the snapshot failed ({status:?}): {}",
            String::from_utf8_lossy(&text).trim()
        )));
    }
    done(stream).await
}

/// Stream an image sandbox's writable layer to the client as an OCI layer tar, written by the
/// agent itself (see [`super::layer_tar`]): no program of the image runs for it.
pub(super) async fn export_layer(agent: &Agent, stream: &mut impl Conn) -> Result<()> {
    let upper = agent
        .upper
        .as_ref()
        .ok_or_else(|| Error::backend("the image sandbox's writable layer was not kept"))?
        .try_clone()
        .map_err(|e| Error::from_io(&e, "snapshot"))?;
    let whole_root = agent.upper_is_root;
    let (chunks, mut received) = mpsc::channel::<Vec<u8>>(4);
    let writer = tokio::task::spawn_blocking(move || {
        let out = ChunkWriter {
            chunks,
            pending: Vec::with_capacity(CHUNK),
        };
        super::layer_tar::write_layer(upper.as_fd(), whole_root, out)
    });
    let copied: Result<()> = async {
        while let Some(chunk) = received.recv().await {
            proto::write_frame(stream, &AgentReply::Data, &chunk).await?;
        }
        Ok(())
    }
    .await;
    // Closing the channel ends a writer still running (the client went away).
    drop(received);
    let written = writer
        .await
        .map_err(|e| Error::backend(format!("snapshot task failed: {e}")))?;
    copied?;
    written.map_err(|e| Error::from_io(&e, "snapshot of the image sandbox's layer"))?;
    proto::write_frame(stream, &AgentReply::End, &[]).await
}

/// A `Write` handing `CHUNK`-sized pieces to the async side; fails once that side is gone.
struct ChunkWriter {
    chunks: mpsc::Sender<Vec<u8>>,
    pending: Vec<u8>,
}

impl ChunkWriter {
    fn send(&mut self) -> std::io::Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::replace(&mut self.pending, Vec::with_capacity(CHUNK));
        self.chunks
            .blocking_send(chunk)
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::BrokenPipe))
    }
}

impl std::io::Write for ChunkWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = buf.len().min(CHUNK - self.pending.len());
        self.pending.extend_from_slice(&buf[..n]);
        if self.pending.len() == CHUNK {
            self.send()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send()
    }
}
