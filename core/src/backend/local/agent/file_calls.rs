//! File calls. The file API itself is in `files.rs` (every call resolved beneath a descriptor
//! of the sandbox root); here are process working directories and the streaming halves.

use super::*;

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
    let mut file = tokio::fs::File::from_std(file).take(size);
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = file
            .read(&mut buf)
            .await
            .map_err(|e| Error::from_io(&e, path))?;
        if n == 0 {
            break;
        }
        proto::write_frame(stream, &AgentReply::Data, &buf[..n]).await?;
    }
    proto::write_frame(stream, &AgentReply::End, &[]).await
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
    let mut file = tokio::fs::File::from_std(pending.file.try_clone().map_err(|e| {
        pending.discard();
        Error::from_io(&e, path)
    })?);
    // The bound of this write: the caller's, and never past the engine's largest file.
    let limit = options_limit.min(super::super::MAX_FILE_BYTES);
    let result: Result<()> = async {
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
            file.write_all(&body)
                .await
                .map_err(|e| Error::from_io(&e, path))?;
        }
        file.flush().await.map_err(|e| Error::from_io(&e, path))?;
        Ok(())
    }
    .await;
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
