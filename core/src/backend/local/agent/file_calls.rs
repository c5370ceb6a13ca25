//! File calls. The file API itself is in `files.rs` (every call resolved beneath a descriptor
//! of the sandbox root); here are process working directories and the streaming halves.

use super::*;
use std::io::Write as _;

/// The agent-side path for a sandbox path (relative paths start at the default home).
///
/// Isolated, that is the path itself: the agent's root is the sandbox root. Un-isolated (the
/// explicit opt-in), sandbox paths live under a host directory; `..` is clamped there, and the
/// directory actually entered is resolved beneath it by the file API (symlinks included).
pub(super) fn resolve(record: &Record, path: &str) -> Result<PathBuf> {
    if path.is_empty() {
        return Err(Error::invalid("empty path"));
    }
    if path.contains('\0') {
        return Err(Error::invalid("path contains a NUL byte"));
    }
    let p = Path::new(path);
    let full = if p.is_absolute() {
        p.to_path_buf()
    } else {
        Path::new(&record.default_user().home).join(p)
    };
    Ok(host_path(record, &full))
}

/// Map an absolute sandbox path onto the agent's filesystem.
pub(super) fn host_path(record: &Record, sandbox_path: &Path) -> PathBuf {
    let Some(prefix) = &record.root_prefix else {
        return sandbox_path.to_path_buf();
    };
    let mut parts: Vec<&std::ffi::OsStr> = Vec::new();
    for c in sandbox_path.components() {
        match c {
            std::path::Component::Normal(n) => parts.push(n),
            std::path::Component::ParentDir => {
                parts.pop();
            }
            _ => {}
        }
    }
    parts
        .iter()
        .fold(PathBuf::from(prefix), |acc, p| acc.join(p))
}

/// Read a regular file and stream it, ending at the size it had when opened (a file that
/// keeps growing, or lies about its end, is cut there).
pub(super) async fn read_file(
    agent: &Arc<Agent>,
    stream: &mut impl Conn,
    path: &str,
    options: crate::ReadOptions,
) -> Result<()> {
    let (rec, p) = (agent.record(), path.to_string());
    // Opening can block (a lease held by sandbox code), so it runs off the event loop; as a
    // user, the open is where the kernel checks that user's permissions.
    let (file, size) = as_user(&agent.record(), options.user, move || {
        files::open_for_read(&rec, &p)
    })
    .await?;
    // Refused before any byte is sent: the caller keeps it in memory.
    if let Some(limit) = options.max_bytes.filter(|&limit| size > limit) {
        return Err(Error::file_too_large(path, limit));
    }
    // Read off the event loop a frame at a time, into one buffer that travels to the
    // blocking pool and back: no copy beyond the kernel's, one pool hop per frame.
    let file = Arc::new(file);
    let mut left = size;
    let mut buf = Vec::with_capacity(FILE_FRAME);
    while left > 0 {
        let want = left.min(FILE_FRAME as u64) as usize;
        let f = file.clone();
        let shown = path.to_string();
        buf = blocking(move || {
            buf.resize(want, 0);
            let mut got = 0;
            while got < want {
                match (&*f).read(&mut buf[got..]) {
                    Ok(0) => break,
                    Ok(n) => got += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(Error::from_io(&e, &shown)),
                }
            }
            buf.truncate(got);
            Ok(buf)
        })
        .await?;
        if buf.is_empty() {
            // The file shrank under us: it ends here.
            break;
        }
        left -= buf.len() as u64;
        proto::write_frame(stream, &AgentReply::Data, &buf).await?;
    }
    proto::write_frame(stream, &AgentReply::End, &[]).await
}

/// Largest file chunk in one frame: the protocol's largest body.
const FILE_FRAME: usize = proto::MAX_BODY;

/// The result of a write on the blocking pool.
async fn joined(write: tokio::task::JoinHandle<Result<()>>) -> Result<()> {
    write
        .await
        .map_err(|e| Error::backend(format!("agent task failed: {e}")))?
}

/// Write a file from an upload: into a fresh temporary file beside the target, renamed over
/// it at the end, so a cut-off upload never leaves a half-written file in place (an append
/// writes in place). On failure the temporary file is removed before the error is returned.
pub(super) async fn write_file(
    agent: &Arc<Agent>,
    stream: &mut impl Conn,
    path: &str,
    options: WriteOptions,
) -> Result<()> {
    let (rec, p) = (agent.record(), path.to_string());
    let user = options.user.clone();
    let options_limit = options.max_bytes.unwrap_or(u64::MAX);
    let pending = as_user(&agent.record(), user.clone(), move || {
        files::begin_write(&rec, &p, &options)
    })
    .await?;
    let file = Arc::new(pending.file.try_clone().map_err(|e| {
        pending.discard();
        Error::from_io(&e, path)
    })?);
    // The bound of this write: the caller's, and never past the engine's largest file.
    let limit = options_limit.min(super::super::MAX_FILE_BYTES);
    // Each frame is written on the blocking pool while the next one is received; at most
    // one write is in flight, and it has ended before the result is acted on (the
    // temporary file is never discarded under a running write).
    let mut in_flight: Option<tokio::task::JoinHandle<Result<()>>> = None;
    let received: Result<()> = async {
        let mut total = 0u64;
        while let Some(body) = read_data_frame(stream).await? {
            total = total.saturating_add(body.len() as u64);
            if total > limit {
                let remedy = if limit < super::super::MAX_FILE_BYTES {
                    "the bound the call set (max_bytes); raise it or leave it unset"
                } else {
                    "the engine's largest file (Capabilities::max_file_bytes); split it"
                };
                return Err(Error::FileTooLarge {
                    what: path.to_string(),
                    limit,
                    remedy: remedy.into(),
                });
            }
            if let Some(write) = in_flight.take() {
                joined(write).await?;
            }
            let (f, shown) = (file.clone(), path.to_string());
            in_flight = Some(tokio::task::spawn_blocking(move || {
                (&*f)
                    .write_all(&body)
                    .map_err(|e| Error::from_io(&e, &shown))
            }));
        }
        Ok(())
    }
    .await;
    let written = match in_flight.take() {
        Some(write) => joined(write).await,
        None => Ok(()),
    };
    let result = received.and(written);
    drop(file);
    let (rec, p) = (agent.record(), path.to_string());
    let stat = as_user(&agent.record(), user, move || match result {
        Ok(()) => pending.finish(&rec, &p),
        Err(e) => {
            pending.discard();
            Err(e)
        }
    })
    .await?;
    proto::write_frame(stream, &AgentReply::Stat { stat }, &[]).await
}
