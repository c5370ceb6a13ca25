//! The holder of a size-bounded volume: one process per volume in use, serving its `fuse2fs`
//! mount to the sandboxes that mount it (the why is in `volumes`' module doc).
//!
//! A monitor calls [`attach`] before it clones its agent: under the volume's lock it connects
//! to the holder's socket, starting the holder first when none answers, asks for a directory
//! (the volume's top or a subpath, made if missing) and receives a detached mount of it,
//! which the agent attaches in the sandbox. The monitor keeps the connection for its life.
//! The holder ends when its last connection closes (under the same lock, so a monitor that
//! connected meanwhile is served instead), after unmounting; `fuse2fs` then flushes the
//! image and exits.

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::volumes::{self, IMAGE, LOG, MOUNT_POINT, SOCKET};
use super::{entry, sys};
use sandcove_core::{Error, Result};

/// Env var naming the volume directory a holder serves.
const DIR_ENV: &str = "__SANDCOVE_VOLUME_DIR";
/// Env var naming the holder's end of its readiness socket.
const READY_FD_ENV: &str = "__SANDCOVE_VOLUME_READY_FD";
/// How long a monitor waits for a holder to start (a check of the image, then the mount).
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a new holder waits for its first connection before it ends.
const FIRST_CLIENT_GRACE: Duration = Duration::from_secs(30);
/// The largest request or reply.
const MAX_MESSAGE: usize = 4096;
/// `statfs` type of a FUSE filesystem.
const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;

/// What a monitor asks a holder for.
#[derive(Serialize, Deserialize)]
struct Request {
    /// A directory beneath the volume's top (made if missing), or the top.
    subpath: Option<String>,
    /// The owner of directories made for `subpath`, ids as the holder sees them.
    owner: Option<(u32, u32)>,
}

/// A detached mount of `subpath` of the bounded volume in `dir`, and the connection that keeps
/// the volume's holder serving it: keep it open as long as the sandbox lives.
pub(super) fn attach(
    dir: &Path,
    subpath: Option<&str>,
    owner: Option<(u32, u32)>,
) -> Result<(UnixStream, OwnedFd)> {
    let lock = volumes::open_lock(dir)?;
    sys::lock_exclusive(&lock).map_err(|e| Error::from_io(&e, "volume lock"))?;
    let socket = dir.join(SOCKET);
    let stream = match UnixStream::connect(&socket) {
        Ok(s) => s,
        Err(_) => {
            // None answers: a stale socket of a holder that died is removed, a new one starts.
            let _ = std::fs::remove_file(&socket);
            start(dir)?;
            UnixStream::connect(&socket)
                .map_err(|e| Error::from_io(&e, "connect to the volume's holder"))?
        }
    };
    drop(lock);
    let request = serde_json::to_vec(&Request {
        subpath: subpath.map(String::from),
        owner,
    })
    .map_err(|e| Error::backend(e.to_string()))?;
    let failed = |e: std::io::Error| Error::from_io(&e, "the volume's holder");
    stream
        .set_read_timeout(Some(START_TIMEOUT))
        .map_err(failed)?;
    (&stream).write_all(&request).map_err(failed)?;
    let mut buf = vec![0u8; MAX_MESSAGE];
    let (n, mut fds) = sys::recv_with_fds(stream.as_raw_fd(), &mut buf).map_err(failed)?;
    let reply = String::from_utf8_lossy(&buf[..n]).into_owned();
    match (reply.as_str(), fds.pop()) {
        ("ok", Some(tree)) => Ok((stream, tree)),
        (_, _) if reply.starts_with("subpath:") => Err(Error::invalid(format!(
            "volume subpath {:?} is not a plain directory inside the volume: {}",
            subpath.unwrap_or_default(),
            reply.trim_start_matches("subpath:").trim()
        ))),
        _ => Err(volumes::quota_unavailable(&format!(
            "the volume's holder refused: {}",
            if reply.is_empty() { "it ended" } else { &reply }
        ))),
    }
}

/// Start the holder of the volume in `dir` (detached: it outlives the monitor) and wait until
/// it serves, or report why it could not.
fn start(dir: &Path) -> Result<()> {
    let (ours, theirs) =
        sys::seqpacket_pair().map_err(|e| Error::from_io(&e, "start the volume's holder"))?;
    let theirs_fd = theirs.as_raw_fd();
    let log = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(dir.join(LOG))
        .map_err(|e| Error::from_io(&e, "the volume holder's log"))?;
    let mut cmd = std::process::Command::new("/proc/self/exe");
    cmd.arg0("sandcove-volume")
        .env_clear()
        .env(entry::ROLE_ENV, entry::ROLE_VOLUME)
        .env(DIR_ENV, dir)
        .env(READY_FD_ENV, theirs_fd.to_string())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log);
    // SAFETY: only async-signal-safe syscalls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            sys::cloexec_from(3)?;
            sys::clear_cloexec(theirs_fd)?;
            // Detached: the intermediate process exits at once, the holder is orphaned to
            // the host's reaper in a session of its own.
            if sys::fork()? != 0 {
                sys::exit_now(0);
            }
            sys::setsid()
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| Error::from_io(&e, "start the volume's holder"))?;
    drop(theirs);
    let _ = child.wait();
    let stream = UnixStream::from(ours);
    stream
        .set_read_timeout(Some(START_TIMEOUT))
        .map_err(|e| Error::from_io(&e, "the volume's holder"))?;
    let mut buf = vec![0u8; MAX_MESSAGE];
    let n = (&stream).read(&mut buf).unwrap_or(0);
    match std::str::from_utf8(&buf[..n]) {
        Ok("ok") => Ok(()),
        Ok("") | Err(_) => Err(volumes::quota_unavailable(&format!(
            "the volume's holder did not start (see {})",
            dir.join(LOG).display()
        ))),
        Ok(reason) => Err(volumes::quota_unavailable(reason)),
    }
}

/// Entry point of the re-executed binary in the volume holder role. Never returns.
pub fn main() -> ! {
    let Some(fd) = std::env::var(READY_FD_ENV)
        .ok()
        .and_then(|v| v.parse::<RawFd>().ok())
    else {
        sys::exit_now(2);
    };
    if fd <= 2 || sys::close_fds_except(&[fd]).is_err() {
        sys::exit_now(2);
    }
    // SAFETY: the monitor passed this descriptor to us, open, under this number.
    let ready = unsafe { OwnedFd::from_raw_fd(fd) };
    let _ = sys::set_cloexec(&ready);
    sys::default_signal_dispositions();
    sys::set_process_name("sandcove-volume");
    let Some(dir) = std::env::var_os(DIR_ENV).map(PathBuf::from) else {
        sys::exit_now(2);
    };
    let code = match Holder::start(&dir) {
        Ok(holder) => {
            let _ = sys::send_nosignal(&ready, b"ok");
            drop(ready);
            holder.serve()
        }
        Err(reason) => {
            eprintln!("sandcove volume holder: {reason}");
            let _ = sys::send_nosignal(&ready, reason.as_bytes());
            1
        }
    };
    sys::exit_now(code)
}

/// A serving holder: its volume, `fuse2fs`, the mount's top and the listening socket.
struct Holder {
    dir: PathBuf,
    fuse: std::process::Child,
    /// The mount's top (dropped before unmounting: an open descriptor pins the mount).
    top: Option<OwnedFd>,
    listener: UnixListener,
}

impl Holder {
    /// Take the image, enter private namespaces, check and mount the filesystem, listen.
    fn start(dir: &Path) -> std::result::Result<Holder, String> {
        let image_path = dir.join(IMAGE);
        let image = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&image_path)
            .map_err(|e| format!("open the volume image: {e}"))?;
        // One `fuse2fs` per image: wait for a previous one to be gone.
        sys::lock_exclusive(&image).map_err(|e| format!("lock the volume image: {e}"))?;
        let (uid, gid) = (sys::geteuid(), sys::getegid());
        let root = uid == 0;
        if root {
            sys::unshare(libc::CLONE_NEWNS).map_err(|e| format!("unshare: {e}"))?;
        } else {
            sys::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS)
                .map_err(|e| format!("unshare: {e}"))?;
            let write = |file: &str, text: String| {
                sys::write_proc_file(&format!("/proc/self/{file}"), &text)
                    .map_err(|e| format!("write {file}: {e}"))
            };
            write("setgroups", "deny".into())?;
            write("uid_map", format!("0 {uid} 1\n"))?;
            write("gid_map", format!("0 {gid} 1\n"))?;
        }
        sys::mount(
            None,
            Path::new("/"),
            None,
            libc::MS_REC | libc::MS_PRIVATE,
            None,
        )
        .map_err(|e| format!("make mounts private: {e}"))?;
        let tool = |name: &str| volumes::tool(name).map_err(|e| e.to_string());
        // A holder that died without unmounting leaves the image unclean: repair it first.
        let fsck = std::process::Command::new(tool("e2fsck")?)
            .arg("-p")
            .arg(&image_path)
            .env_clear()
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .status()
            .map_err(|e| format!("e2fsck: {e}"))?;
        // 0: clean; 1: errors corrected. Anything else needs a person.
        if !matches!(fsck.code(), Some(0 | 1)) {
            return Err(format!(
                "the volume's filesystem needs repair (e2fsck -p: {fsck}); run e2fsck -f on {}",
                image_path.display()
            ));
        }
        let mount_point = dir.join(MOUNT_POINT);
        // The kernel checks permissions (`default_permissions`), as for any filesystem, with
        // the caller's capabilities in its user namespace; `fuse2fs`'s own check, which knows
        // only host uids and would refuse a sandbox's root what the kernel allows it, is off
        // (`fakeroot`). As root, every sandbox uid may use the mount (`allow_other`).
        let options = if root {
            "allow_other,default_permissions,fakeroot"
        } else {
            "default_permissions,fakeroot"
        };
        let image_fd = image.as_raw_fd();
        let mut cmd = std::process::Command::new(tool("fuse2fs")?);
        cmd.arg(&image_path)
            .arg(&mount_point)
            .args(["-f", "-o", options])
            .env_clear()
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null());
        // SAFETY: only async-signal-safe syscalls between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                // It keeps the image's lock until it has exited, and ends (flushing, as on
                // an unmount) if the holder dies.
                sys::clear_cloexec(image_fd)?;
                sys::set_parent_death_signal(libc::SIGTERM)
            });
        }
        let mut fuse = cmd.spawn().map_err(|e| format!("start fuse2fs: {e}"))?;
        drop(image);
        let deadline = Instant::now() + START_TIMEOUT;
        let top = loop {
            if let Ok(Some(status)) = fuse.try_wait() {
                return Err(format!("fuse2fs exited ({status}) before mounting"));
            }
            if let Ok(top) = sys::open_dir_path(&mount_point) {
                if sys::fs_type(&top).is_ok_and(|t| t == FUSE_SUPER_MAGIC) {
                    break top;
                }
            }
            if Instant::now() > deadline {
                let _ = fuse.kill();
                return Err("fuse2fs did not mount in time".into());
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let socket = dir.join(SOCKET);
        let _ = std::fs::remove_file(&socket);
        let listener = UnixListener::bind(&socket).map_err(|e| format!("listen: {e}"))?;
        std::fs::set_permissions(&socket, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .map_err(|e| format!("listen: {e}"))?;
        Ok(Holder {
            dir: dir.to_path_buf(),
            fuse,
            top: Some(top),
            listener,
        })
    }

    /// Serve until the last connection closes; the exit code.
    fn serve(mut self) -> i32 {
        use rustix::event::{poll, PollFd, PollFlags, Timespec};
        let mut clients: Vec<UnixStream> = Vec::new();
        let mut idle_since = Some(Instant::now());
        loop {
            if let Ok(Some(status)) = self.fuse.try_wait() {
                eprintln!("sandcove volume holder: fuse2fs exited ({status})");
                let _ = std::fs::remove_file(self.dir.join(SOCKET));
                return 1;
            }
            if clients.is_empty()
                && idle_since.is_some_and(|t| t.elapsed() >= FIRST_CLIENT_GRACE)
                && self.try_stop(&mut clients)
            {
                return 0;
            }
            let mut fds = vec![PollFd::new(&self.listener, PollFlags::IN)];
            fds.extend(clients.iter().map(|c| PollFd::new(c, PollFlags::IN)));
            let tick = Timespec {
                tv_sec: 1,
                tv_nsec: 0,
            };
            if poll(&mut fds, Some(&tick)).is_err() {
                continue;
            }
            let ready: Vec<bool> = fds.iter().map(|f| !f.revents().is_empty()).collect();
            drop(fds);
            // Connections that closed (or sent anything past their request) are done.
            let mut i = clients.len();
            while i > 0 {
                i -= 1;
                if ready[i + 1] {
                    let mut byte = [0u8; 1];
                    if !matches!((&clients[i]).read(&mut byte), Err(ref e) if e.kind() == std::io::ErrorKind::WouldBlock)
                    {
                        clients.swap_remove(i);
                    }
                }
            }
            if ready[0] {
                self.accept_all(&mut clients);
            }
            if clients.is_empty() {
                // The last sandbox ended: stop now, unless one connects meanwhile.
                idle_since = Some(Instant::now() - FIRST_CLIENT_GRACE);
            } else {
                idle_since = None;
            }
        }
    }

    /// Accept and answer every waiting connection.
    fn accept_all(&self, clients: &mut Vec<UnixStream>) {
        let _ = self.listener.set_nonblocking(true);
        while let Ok((stream, _)) = self.listener.accept() {
            if self.answer(&stream).is_ok() {
                let _ = stream.set_nonblocking(true);
                clients.push(stream);
            }
        }
    }

    /// Read one request and send its mount (or why not).
    fn answer(&self, stream: &UnixStream) -> std::io::Result<()> {
        stream.set_nonblocking(false)?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut buf = vec![0u8; MAX_MESSAGE];
        let n = (&*stream).read(&mut buf)?;
        let request: Request = serde_json::from_slice(&buf[..n])
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        let top = self
            .top
            .as_ref()
            .ok_or_else(|| std::io::Error::other("stopping"))?;
        let dir = match &request.subpath {
            None => sys::open_beneath(top, Path::new("."), libc::O_PATH, true),
            Some(sub) => {
                volumes::dirs_beneath(top.as_fd(), Path::new(sub), true, request.owner, true)
            }
        };
        let tree = match dir {
            Ok(dir) => sys::clone_mount(&dir),
            Err(e) => {
                sys::send_with_fds(stream.as_raw_fd(), format!("subpath: {e}").as_bytes(), &[])?;
                return Err(e);
            }
        };
        match tree {
            Ok(tree) => sys::send_with_fds(stream.as_raw_fd(), b"ok", &[tree.as_raw_fd()])?,
            Err(e) => sys::send_with_fds(
                stream.as_raw_fd(),
                format!("cannot copy the mount: {e}").as_bytes(),
                &[],
            )?,
        };
        Ok(())
    }

    /// With no connection left, stop under the volume's lock unless a monitor connected
    /// meanwhile (then serve it). Whether the holder stopped.
    fn try_stop(&mut self, clients: &mut Vec<UnixStream>) -> bool {
        let Ok(lock) = volumes::open_lock(&self.dir) else {
            return false;
        };
        if sys::lock_exclusive(&lock).is_err() {
            return false;
        }
        self.accept_all(clients);
        if !clients.is_empty() {
            return false;
        }
        let _ = std::fs::remove_file(self.dir.join(SOCKET));
        self.top = None;
        let _ = sys::unmount_detach(&self.dir.join(MOUNT_POINT));
        drop(lock);
        // `fuse2fs` ends once no sandbox holds the mount either; past a bound it is told to.
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if matches!(self.fuse.try_wait(), Ok(Some(_))) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = sys::kill(self.fuse.id() as i32, libc::SIGTERM);
        let _ = self.fuse.wait();
        true
    }
}
