//! A unix stream the event loop watches for reading only.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};

use super::sys;

/// A connected, non-blocking unix stream registered with the runtime for readability only.
///
/// Tokio registers its sockets for reading and writing alike, and the kernel wakes a waiting
/// event loop whenever the peer drains the socket ("write space"), whether or not anything
/// waits to write. On the engine's request/answer connections that is a pointless wake-up
/// of one side for every frame the other side reads: on a small machine, a context switch
/// that often preempts the very process the call waits for. Here a write goes straight to
/// the socket; only one that finds the socket full registers a duplicate descriptor for
/// writability, and that registration ends with the next write that goes through (a bulk
/// transfer pays two `epoll_ctl` calls per wait for space, a small frame none).
#[derive(Debug)]
pub(crate) struct QuietStream {
    read: AsyncFd<UnixStream>,
    write: Option<AsyncFd<OwnedFd>>,
}

impl QuietStream {
    /// Take over `stream`, made non-blocking here.
    pub(crate) fn new(stream: UnixStream) -> io::Result<QuietStream> {
        stream.set_nonblocking(true)?;
        // SAFETY: the AsyncFd owns the stream, so its descriptor stays open (and is not
        // reused) for as long as it is registered, and closes only after deregistration.
        let read = unsafe { AsyncFd::register_with_interest(stream, Interest::READABLE) }?;
        Ok(QuietStream { read, write: None })
    }
}

impl AsFd for QuietStream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.read.get_ref().as_fd()
    }
}

impl AsyncRead for QuietStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            let mut guard = ready!(self.read.poll_read_ready(cx))?;
            // Read into the buffer's unfilled part as it is, never zeroing it first: callers
            // read file data into spare capacity (see `proto::read_frame`), and zeroing what
            // is left of a 1 MiB body before each partial read cost a few percent of a
            // transfer.
            // SAFETY: `read` only writes initialized bytes; nothing here de-initializes any.
            let unfilled = unsafe { buf.unfilled_mut() };
            let read = |s: &AsyncFd<UnixStream>| {
                rustix::io::read(s.get_ref(), &mut *unfilled)
                    .map(|(filled, _)| filled.len())
                    .map_err(io::Error::from)
            };
            match guard.try_io(read) {
                Ok(Ok(n)) => {
                    // SAFETY: the read just wrote these `n` bytes.
                    unsafe { buf.assume_init(n) };
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl AsyncWrite for QuietStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        loop {
            match sys::send_nosignal(this.read.get_ref().as_fd(), buf) {
                Ok(n) => {
                    this.write = None;
                    return Poll::Ready(Ok(n));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
            let write = match &mut this.write {
                Some(write) => write,
                None => {
                    // Registered after the failed send: space freed in between is reported
                    // at once (epoll checks readiness when a descriptor is added).
                    let dup = sys::dup_cloexec(this.read.get_ref())?;
                    // SAFETY: as in `new`: the AsyncFd owns the duplicate.
                    let write =
                        unsafe { AsyncFd::register_with_interest(dup, Interest::WRITABLE) }?;
                    this.write.insert(write)
                }
            };
            ready!(write.poll_write_ready(cx))?.clear_ready();
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.read.get_ref().shutdown(std::net::Shutdown::Write))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Frames both ways, and a transfer far larger than the socket's buffers (so writes wait
    /// for space through the duplicate registration, then go on without it).
    #[tokio::test]
    async fn carries_small_frames_and_bulk_transfers_both_ways() {
        let (a, b) = UnixStream::pair().expect("socketpair");
        let (mut a, mut b) = (QuietStream::new(a).unwrap(), QuietStream::new(b).unwrap());
        a.write_all(b"ping").await.unwrap();
        let mut word = [0u8; 4];
        b.read_exact(&mut word).await.unwrap();
        assert_eq!(&word, b"ping");

        let bulk: Vec<u8> = (0..(16usize << 20)).map(|i| (i % 251) as u8).collect();
        let expected = bulk.clone();
        let writer = tokio::spawn(async move {
            b.write_all(&bulk).await.unwrap();
            b.shutdown().await.unwrap();
            b
        });
        let mut got = Vec::new();
        a.read_to_end(&mut got).await.unwrap();
        assert_eq!(got.len(), expected.len());
        assert!(got == expected, "bulk bytes arrive in order, unchanged");
        let b = writer.await.unwrap();
        assert!(
            b.write.is_none(),
            "the write registration ends with the last write"
        );
    }

    /// The event masks this process's epoll instances hold for descriptor `fd`.
    fn epoll_masks(fd: i32) -> Vec<u32> {
        let mut masks = Vec::new();
        for entry in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
            let is_epoll = std::fs::read_link(entry.path())
                .is_ok_and(|t| t.to_string_lossy().contains("eventpoll"));
            if !is_epoll {
                continue;
            }
            let info = format!("/proc/self/fdinfo/{}", entry.file_name().to_string_lossy());
            let Ok(text) = std::fs::read_to_string(info) else {
                continue;
            };
            for line in text.lines() {
                let mut words = line.split_whitespace();
                if words.next() == Some("tfd:") && words.next() == Some(&fd.to_string()) {
                    let events = words.nth(1).unwrap_or_default();
                    masks.push(u32::from_str_radix(events, 16).unwrap());
                }
            }
        }
        masks
    }

    /// What makes the stream quiet: its descriptor is watched for reading, never for
    /// writing, so a peer draining the socket wakes nobody.
    #[tokio::test(flavor = "current_thread")]
    async fn the_socket_is_watched_for_reading_only() {
        use std::os::fd::AsRawFd;
        let (a, _b) = UnixStream::pair().expect("socketpair");
        let a = QuietStream::new(a).unwrap();
        // (One epoll instance may be listed under two descriptors: the runtime keeps a dup.)
        let masks = epoll_masks(a.as_fd().as_raw_fd());
        assert!(!masks.is_empty(), "registered");
        for mask in masks {
            assert_ne!(mask & libc::EPOLLIN as u32, 0, "{mask:x}");
            assert_eq!(mask & libc::EPOLLOUT as u32, 0, "{mask:x}");
        }
    }

    /// A write to a peer that has gone is an error (no `SIGPIPE`), and a read sees the end.
    #[tokio::test]
    async fn a_gone_peer_is_an_error_or_the_end() {
        let (a, b) = UnixStream::pair().expect("socketpair");
        let mut a = QuietStream::new(a).unwrap();
        drop(b);
        let mut byte = [0u8; 1];
        assert_eq!(a.read(&mut byte).await.unwrap(), 0);
        let err = a.write_all(b"x").await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
    }
}
