//! Privileges: the capability sets of the agent and of each sandbox process, `no_new_privs`,
//! installing seccomp and Landlock restrictions, and a thread's own filesystem identity.

use super::cvt;
use std::io;
use std::os::fd::RawFd;

/// The capability sets of the calling thread, as `capget`/`capset` take them (version 3: two
/// 32-bit words per set, low word first).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

const CAP_HEADER_V3: CapHeader = CapHeader {
    version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
    pid: 0,
};

/// Empty the calling thread's capability bounding set, keeping every capability it holds
/// reachable through `execve` for its own helpers as uid 0. Run once by the agent,
/// single-threaded, before any thread or process exists that would keep the old sets
/// (bounding and inheritable sets are per thread and copied at `clone`).
///
/// Why this is enough, and why it weakens nothing:
///
/// - For a uid-0 `execve` the kernel gives P' = (P(I) & F(I)) | (F(P) & bounding) | ambient,
///   with F(I) = F(P) = all. With an empty bounding set that is exactly the caller's
///   inheritable set. So the inheritable set is raised to the permitted set first (the
///   kernel refuses an inheritable capability outside the bounding set, so the order
///   matters), and the agent's helpers (`tar` for snapshots, run as the sandbox's root from
///   the read-only host `/usr`) keep the capabilities they had. `no_new_privs` (set by the
///   seccomp install) caps P' at the caller's permitted set, which is unchanged.
/// - A sandbox process (`harden_child`) sets its inheritable, permitted and effective sets to
///   zero and clears the ambient set. With I = 0, A = 0 and the bounding set inherited empty,
///   every `execve` it or its descendants make yields P' = 0: as uid 0, as a setuid-root
///   program, or as a program with file capabilities (the host directories are also
///   mounted `nosuid`, and `no_new_privs` forbids any gain). Nothing can refill the
///   inheritable set either: `capset` may only add an inheritable capability that is in the
///   bounding set (empty) and in the permitted set (empty), and the bounding set can only
///   shrink.
/// - Before, each sandbox process emptied its own bounding set (41 `PR_CAPBSET_DROP` calls, a
///   credential copy each); the result at its `execve` is the same, now reached once.
/// - Processes the agent starts without `harden_child` are its helpers only (`tar`, whose
///   argument list the agent builds and which reads no program from the sandbox); they
///   held every capability before through the full bounding set and hold the same now.
///
/// Async-signal-safe.
pub fn empty_bounding_set_keep_inheritable() -> io::Result<()> {
    let header = CAP_HEADER_V3;
    let mut data = [CapData::default(); 2];
    // SAFETY: `header` and `data` are valid for the call; v3 reads two `CapData` entries.
    cvt(unsafe { libc::syscall(libc::SYS_capget, &header, data.as_mut_ptr()) } as libc::c_int)?;
    for set in &mut data {
        set.inheritable = set.permitted;
    }
    // SAFETY: as above; the kernel reads two entries.
    cvt(unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) } as libc::c_int)?;
    for cap in 0..=63 {
        // SAFETY: a plain prctl on integers.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) } == -1 {
            match io::Error::last_os_error().raw_os_error() {
                Some(libc::EINVAL) => break, // past the last capability this kernel knows
                _ => return Err(io::Error::last_os_error()),
            }
        }
    }
    Ok(())
}

/// Everything a freshly forked child does before `exec` to become an unprivileged sandbox
/// process. Only async-signal-safe syscalls: it runs between fork and exec.
///
/// It relies on what the agent set up once for every process it starts: an empty bounding set
/// (see [`empty_bounding_set_keep_inheritable`]; checked here, fail closed) and
/// `no_new_privs` with the seccomp filter (`seccomp::install`; checked before the spawn).
pub fn harden_child(uid: u32, gid: u32, nproc: u64, nofile: u64) -> io::Result<()> {
    // SAFETY: each call is a plain syscall on integers or on stack values valid for the call.
    unsafe {
        // The agent empties the bounding set all at once or fails its setup, so one
        // capability still in it means this line of threads never went through that.
        const CAP_CHOWN: libc::c_ulong = 0;
        if cvt(libc::prctl(libc::PR_CAPBSET_READ, CAP_CHOWN, 0, 0, 0))? != 0 {
            return Err(io::Error::from_raw_os_error(libc::EPERM));
        }
        cvt(libc::setsid())?;
        let nproc_rl = libc::rlimit {
            rlim_cur: nproc,
            rlim_max: nproc,
        };
        cvt(libc::setrlimit(libc::RLIMIT_NPROC, &nproc_rl))?;
        let nofile_rl = libc::rlimit {
            rlim_cur: nofile,
            rlim_max: nofile,
        };
        cvt(libc::setrlimit(libc::RLIMIT_NOFILE, &nofile_rl))?;
        // setgroups is denied in a single-uid namespace; there are no groups to drop then.
        // Raw syscalls, not the C library's wrappers: in a child that shares its parent's
        // memory (see `spawn`), those would try to change every thread of the parent too.
        let groups: [libc::gid_t; 0] = [];
        if libc::syscall(libc::SYS_setgroups, 0, groups.as_ptr()) == -1
            && *libc::__errno_location() != libc::EPERM
        {
            return Err(io::Error::last_os_error());
        }
        cvt(libc::syscall(libc::SYS_setresgid, gid, gid, gid) as libc::c_int)?;
        cvt(libc::syscall(libc::SYS_setresuid, uid, uid, uid) as libc::c_int)?;
        // Then the ambient, effective, permitted and inheritable sets. The inheritable set
        // is the agent's full one until here: clearing it is what keeps a uid-0 exec from
        // regaining it, so a failure stops the start.
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        );
        let header = CAP_HEADER_V3;
        let data = [CapData::default(); 2];
        cvt(libc::syscall(libc::SYS_capset, &header, data.as_ptr()) as libc::c_int)?;
    }
    Ok(())
}

/// Set `no_new_privs` on the calling thread (required before an unprivileged Landlock or
/// seccomp restriction). Async-signal-safe.
pub fn set_no_new_privs() -> io::Result<()> {
    // SAFETY: a plain prctl on integers.
    cvt(unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) }).map(drop)
}

/// `seccomp(SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC)`: install a classic BPF
/// program on every thread of the calling process (so no thread is left unfiltered); what
/// they start later inherits it. Needs `no_new_privs` or `CAP_SYS_ADMIN`.
pub fn seccomp_filter_all_threads(program: &[libc::sock_filter]) -> io::Result<()> {
    let len =
        u16::try_from(program.len()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let prog = libc::sock_fprog {
        len,
        filter: program.as_ptr().cast_mut(),
    };
    // SAFETY: `prog` points at `program`, alive for the call; the kernel copies it.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            libc::SECCOMP_FILTER_FLAG_TSYNC,
            &prog as *const libc::sock_fprog,
        )
    };
    match ret {
        0 => Ok(()),
        -1 => Err(io::Error::last_os_error()),
        // With TSYNC, a positive value is the id of a thread that could not be synchronized.
        _ => Err(io::Error::from_raw_os_error(libc::ESRCH)),
    }
}

/// `landlock_restrict_self(2)`: enforce the ruleset `ruleset` on the calling thread and what
/// it starts. Async-signal-safe.
pub fn landlock_restrict_self(ruleset: RawFd) -> io::Result<()> {
    // SAFETY: a plain syscall on integers.
    let ret = unsafe { libc::syscall(libc::SYS_landlock_restrict_self, ruleset, 0u32) };
    cvt(ret as libc::c_int).map(drop)
}

/// Give the calling thread, and only it, the filesystem identity of `uid`/`gid` with no
/// supplementary groups, so the kernel checks that user's permissions on every later path
/// lookup and new files are that user's.
///
/// Raw syscalls on purpose: the kernel keeps credentials per thread, and the libc wrappers
/// (`setgroups` here) would broadcast the change to every thread of the process. Moving the
/// fs uid from 0 to another uid also drops the thread's effective filesystem capabilities
/// (`CAP_DAC_OVERRIDE`, `CAP_FOWNER`, …). The change cannot be undone safely by the caller:
/// run this only on a dedicated thread that ends after its work. Each step is checked: an
/// identity that did not fully take is an error, never a thread running as root.
pub fn set_thread_fs_identity(uid: u32, gid: u32) -> io::Result<()> {
    let none: *const libc::gid_t = std::ptr::null();
    // SAFETY: setgroups with a count of 0 reads nothing through the (null) list pointer.
    let ret = unsafe { libc::syscall(libc::SYS_setgroups, 0usize, none) };
    if ret == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: setfsgid/setfsuid take an integer and return the previous id; they cannot
    // fail in a way that touches memory. A call with -1 (never valid) changes nothing and
    // returns the current id, which is how the change is verified.
    let (fsgid, fsuid) = unsafe {
        libc::syscall(libc::SYS_setfsgid, gid);
        let fsgid = libc::syscall(libc::SYS_setfsgid, u32::MAX) as u32;
        libc::syscall(libc::SYS_setfsuid, uid);
        let fsuid = libc::syscall(libc::SYS_setfsuid, u32::MAX) as u32;
        (fsgid, fsuid)
    };
    if (fsuid, fsgid) != (uid, gid) {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("could not take the identity {uid}:{gid} (got {fsuid}:{fsgid})"),
        ));
    }
    Ok(())
}
