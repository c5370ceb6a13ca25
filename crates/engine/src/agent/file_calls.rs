//! File calls. The file API itself is in `files.rs` (every call resolved beneath a descriptor
//! of the sandbox root); here are process working directories and the streaming halves.

use super::*;
use std::io::Write as _;
use std::os::fd::OwnedFd;

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
    options: sandcove_core::ReadOptions,
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
    // The whole stream is sent from one blocking thread (one pool hop per call, not per
    // frame), spliced file → pipe → socket where the kernel can, so the bytes never pass
    // through the agent's memory; the event loop does not touch the connection meanwhile.
    let sock = SyncSock::of(&*stream)?;
    let shown = path.to_string();
    blocking(move || {
        let mut mover = Mover::new(true);
        send_file(&mut mover, &file, &sock, size, &shown)
    })
    .await
}

/// Largest file chunk in one frame: the protocol's largest body.
const FILE_FRAME: usize = proto::MAX_BODY;

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
    let file = match pending.file.try_clone() {
        Ok(file) => file,
        Err(e) => {
            pending.discard();
            return Err(Error::from_io(&e, path));
        }
    };
    // The bound of this write: the caller's, and never past the engine's largest file.
    let limit = options_limit.min(super::super::MAX_FILE_BYTES);
    // The whole upload is received on one blocking thread (one pool hop per call), each
    // frame's body spliced socket → pipe → file where the kernel can. The thread has ended
    // before the result is acted on, so the temporary file is never discarded under a
    // running write.
    let received = match SyncSock::of(&*stream) {
        Ok(sock) => {
            let shown = path.to_string();
            blocking(move || {
                let mut mover = Mover::new(!sys::is_append(&file).unwrap_or(true));
                receive_file(&mut mover, &sock, &file, limit, &shown)
            })
            .await
        }
        Err(e) => Err(e),
    };
    let (rec, p) = (agent.record(), path.to_string());
    let stat = as_user(&agent.record(), user, move || match received {
        Ok(()) => pending.finish(&rec, &p),
        Err(e) => {
            pending.discard();
            Err(e)
        }
    })
    .await?;
    proto::write_frame(stream, &AgentReply::Stat { stat }, &[]).await
}

/// Longest wait of a file call's thread for its connection to move a byte either way. The
/// peer may be a remote client (the in-pod agent serves a token holder over TCP): one that
/// stops sending an upload or stops reading a download would otherwise hold one of the
/// agent's blocking threads, and the upload's temporary file, for ever.
const STALL_LIMIT: Duration = Duration::from_secs(60);

/// A connection's socket driven from a blocking thread. It stays non-blocking (the flag is
/// shared with the event loop's copy), so a call that would block waits with `poll`, at
/// most its stall limit each time.
struct SyncSock(OwnedFd, Duration);

impl SyncSock {
    fn of(stream: &impl Conn) -> Result<SyncSock> {
        sys::dup_cloexec(stream.as_fd())
            .map(|fd| SyncSock(fd, STALL_LIMIT))
            .map_err(|e| sock_err(&e))
    }

    /// Wait for the socket; past the stall limit the connection is cut (both ways: the
    /// caller's error reply then fails at once instead of waiting on the same peer) and the
    /// call fails.
    fn wait(&self, writable: bool) -> Result<()> {
        sys::wait_ready(&self.0, writable, self.1).map_err(|e| {
            if e.kind() == std::io::ErrorKind::TimedOut {
                self.cut();
            }
            sock_err(&e)
        })
    }

    /// Read some bytes (at least one); the end of the stream is an error here.
    fn read_some(&self, buf: &mut [u8]) -> Result<usize> {
        match self.read_or_end(buf)? {
            0 => Err(upload_cut()),
            n => Ok(n),
        }
    }

    /// Read some bytes; zero at the end of the stream.
    fn read_or_end(&self, buf: &mut [u8]) -> Result<usize> {
        loop {
            match sys::read_fd(&self.0, buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => self.wait(false)?,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(sock_err(&e)),
            }
        }
    }

    fn read_exact(&self, mut buf: &mut [u8]) -> Result<()> {
        while !buf.is_empty() {
            let n = self.read_some(buf)?;
            buf = &mut buf[n..];
        }
        Ok(())
    }

    fn write_all(&self, mut buf: &[u8]) -> Result<()> {
        while !buf.is_empty() {
            match sys::write_fd(&self.0, buf) {
                Ok(n) => buf = &buf[n..],
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => self.wait(true)?,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(sock_err(&e)),
            }
        }
        Ok(())
    }

    /// End the connection both ways after a failure in the middle of a frame: the peer
    /// then sees a cut-off frame (an error), never stray bytes taken for the next frame.
    fn cut(&self) {
        let _ = sys::shutdown_both(&self.0);
    }
}

fn sock_err(e: &std::io::Error) -> Error {
    Error::Backend {
        message: format!("sandbox connection: {e}"),
        retryable: false,
    }
}

fn upload_cut() -> Error {
    Error::backend("connection to the sandbox closed unexpectedly")
}

/// Whether `splice` cannot be used between these descriptors at all (a filesystem or a
/// socket without splice support, a file opened for appending, a kernel without it): the
/// bytes then go through a buffer instead.
fn splice_unsupported(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP | libc::EBADF)
    )
}

/// How bytes move between a file and a socket: spliced through a pipe (the kernel moves or
/// copies pages, nothing lands in the agent's memory), or through one reused buffer where
/// splice is not available.
enum Mover {
    Splice {
        read: OwnedFd,
        write: OwnedFd,
        capacity: usize,
    },
    Copy {
        buf: Vec<u8>,
    },
}

impl Mover {
    fn new(splice: bool) -> Mover {
        if splice {
            if let Ok((read, write, capacity)) = sys::splice_pipe(FILE_FRAME) {
                return Mover::Splice {
                    read,
                    write,
                    capacity: capacity.min(FILE_FRAME),
                };
            }
        }
        Mover::copy()
    }

    fn copy() -> Mover {
        Mover::Copy {
            buf: vec![0; FILE_FRAME],
        }
    }

    /// Move exactly `n` bytes from the socket to the file (one frame's body).
    fn socket_to_file(
        &mut self,
        sock: &SyncSock,
        file: &std::fs::File,
        mut n: usize,
        path: &str,
    ) -> Result<()> {
        while n > 0 {
            match self {
                Mover::Splice {
                    read,
                    write,
                    capacity,
                } => {
                    // The pipe is empty here (each batch goes to the file before the next
                    // one is taken), so a splice that would block is waiting for the socket.
                    let got = match sys::splice(&sock.0, &*write, n.min(*capacity), true) {
                        Ok(0) => return Err(upload_cut()),
                        Ok(got) => got,
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            sock.wait(false)?;
                            continue;
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        Err(e) if splice_unsupported(&e) => {
                            *self = Mover::copy();
                            continue;
                        }
                        Err(e) => return Err(sock_err(&e)),
                    };
                    pipe_to_file(read, file, got, path)?;
                    n -= got;
                }
                Mover::Copy { buf } => {
                    let want = n.min(buf.len());
                    let got = sock.read_some(&mut buf[..want])?;
                    (&*file)
                        .write_all(&buf[..got])
                        .map_err(|e| Error::from_io(&e, path))?;
                    n -= got;
                }
            }
        }
        Ok(())
    }

    /// Take the file's next bytes, at most `max`, ready to be sent: in the pipe, or at the
    /// start of the buffer. Zero: the file ends here.
    fn fill_from_file(&mut self, file: &std::fs::File, max: usize, path: &str) -> Result<usize> {
        loop {
            match self {
                Mover::Splice {
                    write, capacity, ..
                } => match sys::splice(file, &*write, max.min(*capacity), false) {
                    Ok(got) => return Ok(got),
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) if splice_unsupported(&e) => *self = Mover::copy(),
                    Err(e) => return Err(Error::from_io(&e, path)),
                },
                Mover::Copy { buf } => {
                    let want = max.min(buf.len());
                    let mut got = 0;
                    while got < want {
                        match (&*file).read(&mut buf[got..want]) {
                            Ok(0) => break,
                            Ok(n) => got += n,
                            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                            Err(e) => return Err(Error::from_io(&e, path)),
                        }
                    }
                    return Ok(got);
                }
            }
        }
    }

    /// Send the `n` bytes [`Mover::fill_from_file`] took.
    fn send_filled(&mut self, sock: &SyncSock, mut n: usize) -> Result<()> {
        match self {
            Mover::Splice { read, .. } => {
                while n > 0 {
                    // The pipe holds the bytes, so a splice that would block is waiting
                    // for room in the socket.
                    match sys::splice(&*read, &sock.0, n, true) {
                        Ok(0) => return Err(upload_cut()),
                        Ok(sent) => n -= sent,
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => sock.wait(true)?,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) if splice_unsupported(&e) => {
                            // Not spliceable into this socket: through a buffer, from the
                            // pipe, and by buffer from now on.
                            let mut buf = vec![0; n];
                            read_exact_fd(read, &mut buf).map_err(|e| sock_err(&e))?;
                            sock.write_all(&buf)?;
                            *self = Mover::copy();
                            return Ok(());
                        }
                        Err(e) => return Err(sock_err(&e)),
                    }
                }
                Ok(())
            }
            Mover::Copy { buf } => sock.write_all(&buf[..n]),
        }
    }
}

/// Move `n` bytes waiting in a pipe into the file (a blocking write, on this thread).
fn pipe_to_file(read: &OwnedFd, file: &std::fs::File, mut n: usize, path: &str) -> Result<()> {
    while n > 0 {
        match sys::splice(read, file, n, false) {
            Ok(0) => return Err(Error::backend("a pipe ended early")),
            Ok(moved) => n -= moved,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if splice_unsupported(&e) => {
                let mut buf = vec![0; n];
                read_exact_fd(read, &mut buf).map_err(|e| Error::from_io(&e, path))?;
                return (&*file)
                    .write_all(&buf)
                    .map_err(|e| Error::from_io(&e, path));
            }
            Err(e) => return Err(Error::from_io(&e, path)),
        }
    }
    Ok(())
}

fn read_exact_fd(fd: &OwnedFd, mut buf: &mut [u8]) -> std::io::Result<()> {
    while !buf.is_empty() {
        match sys::read_fd(fd, buf) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => buf = &mut buf[n..],
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Stream `size` bytes of `file` as `Data` frames and an `End`, stopping early if the file
/// shrank. A failure after a frame's header went out cuts the connection (see
/// [`SyncSock::cut`]); one before it leaves the connection at a frame boundary, for the error
/// reply.
fn send_file(
    mover: &mut Mover,
    file: &std::fs::File,
    sock: &SyncSock,
    size: u64,
    path: &str,
) -> Result<()> {
    let mut left = size;
    while left > 0 {
        let want = left.min(FILE_FRAME as u64) as usize;
        let got = mover.fill_from_file(file, want, path)?;
        if got == 0 {
            // The file shrank under us: it ends here.
            break;
        }
        let sent = proto::frame_head(&AgentReply::Data, got)
            .and_then(|head| sock.write_all(&head))
            .and_then(|()| mover.send_filled(sock, got));
        if let Err(e) = sent {
            sock.cut();
            return Err(e);
        }
        left -= got as u64;
    }
    sock.write_all(&proto::frame_head(&AgentReply::End, 0)?)
}

/// Receive an upload's `Data` frames up to `End` into `file`, each counted against `limit`
/// before any of its bytes is taken from the socket.
fn receive_file(
    mover: &mut Mover,
    sock: &SyncSock,
    file: &std::fs::File,
    limit: u64,
    path: &str,
) -> Result<()> {
    let mut total = 0u64;
    loop {
        let mut prefix = [0u8; 8];
        let first = sock.read_or_end(&mut prefix)?;
        if first == 0 {
            return Err(Error::backend("upload ended before its end marker"));
        }
        sock.read_exact(&mut prefix[first..])?;
        let (hlen, blen) = proto::parse_prefix(&prefix)?;
        let mut head = vec![0u8; hlen];
        sock.read_exact(&mut head)?;
        match proto::parse_header::<AgentReply>(&head)? {
            AgentReply::Data => {
                total = total.saturating_add(blen as u64);
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
                mover.socket_to_file(sock, file, blen, path)?;
            }
            AgentReply::End => {
                // Taken whole, so the next request on this connection starts at a frame.
                sock.read_exact(&mut vec![0u8; blen])?;
                return Ok(());
            }
            other => {
                return Err(Error::backend(format!(
                    "protocol error: unexpected {other:?} in an upload"
                )))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream as StdUnixStream;

    const SHORT: Duration = Duration::from_millis(200);
    const PATIENCE: Duration = Duration::from_secs(30);

    /// A file call's socket with a short stall limit, and its peer (blocking).
    fn pair() -> (SyncSock, StdUnixStream) {
        let (ours, peer) = StdUnixStream::pair().expect("socketpair");
        ours.set_nonblocking(true).expect("non-blocking");
        peer.set_read_timeout(Some(PATIENCE)).expect("read timeout");
        (SyncSock(OwnedFd::from(ours), SHORT), peer)
    }

    fn scratch(name: &str) -> (PathBuf, std::fs::File) {
        let path = std::env::temp_dir().join(format!("{name}-{}", sandcove_core::random_id(12)));
        let file = std::fs::File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .expect("scratch file");
        (path, file)
    }

    /// `call`'s result, run on a thread of its own; a panic if it has not ended in time
    /// (a call that never ends is the failure these tests look for).
    fn ends<T: Send + 'static>(call: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(call());
        });
        rx.recv_timeout(PATIENCE)
            .expect("the file call still waits on a stalled peer")
    }

    /// What the peer reads until the end of the stream; panics if the stream does not end.
    fn read_to_end(peer: &mut StdUnixStream) -> usize {
        let mut total = 0;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match peer.read(&mut buf) {
                Ok(0) => return total,
                Ok(n) => total += n,
                Err(e) => panic!("the connection was not cut: {e}"),
            }
        }
    }

    #[test]
    fn an_upload_whose_client_stops_sending_fails_and_its_connection_is_cut() {
        for splice in [true, false] {
            let (sock, mut peer) = pair();
            let (path, file) = scratch("stalled-upload");
            // A data frame announcing 1000 bytes, of which 10 come; then nothing, the peer
            // still connected.
            let mut sent = proto::frame_head(&AgentReply::Data, 1000).expect("head");
            sent.extend_from_slice(&[7u8; 10]);
            peer.write_all(&sent).expect("send");
            let result = ends(move || {
                let mut mover = if splice {
                    Mover::new(true)
                } else {
                    Mover::copy()
                };
                receive_file(&mut mover, &sock, &file, u64::MAX, "stalled")
            });
            let err = result.expect_err("a stalled upload fails");
            assert!(err.to_string().contains("no progress"), "{err}");
            assert_eq!(
                read_to_end(&mut peer),
                0,
                "splice {splice}: cut, nothing sent"
            );
            let _ = std::fs::remove_file(path);
        }
    }

    #[test]
    fn a_download_whose_client_stops_reading_fails_and_its_connection_is_cut() {
        for splice in [true, false] {
            let (sock, mut peer) = pair();
            let (path, mut file) = scratch("stalled-download");
            // Far more than the socket buffers hold.
            let size = 16 * 1024 * 1024;
            file.write_all(&vec![1u8; size]).expect("fill");
            let file = std::fs::File::open(&path).expect("reopen");
            let result = ends(move || {
                let mut mover = if splice {
                    Mover::new(true)
                } else {
                    Mover::copy()
                };
                send_file(&mut mover, &file, &sock, size as u64, "stalled")
            });
            let err = result.expect_err("a stalled download fails");
            assert!(err.to_string().contains("no progress"), "{err}");
            let read = read_to_end(&mut peer);
            assert!(read < size, "splice {splice}: cut short ({read} bytes)");
            let _ = std::fs::remove_file(path);
        }
    }
}
