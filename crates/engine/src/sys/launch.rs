//! Starting a program: [`spawn`] runs a prepared [`SpawnPlan`] in a child that shares the caller's
//! memory until `execve`, on a stack of its own, making only async-signal-safe syscalls.

use super::process::KERNEL_LAST_SIGNAL;
use super::{cvt, kernel_default_signal, kernel_signal_handler, page_size};
use std::ffi::CString;
use std::io;
use std::os::fd::RawFd;

/// Everything a child started by [`spawn`] needs, built before the clone so the child only
/// makes syscalls on memory prepared for it (no allocation, no locks, no global state).
pub struct SpawnPlan {
    /// Paths `execve` tries in order: the program itself if it names a path, else one per
    /// entry of the environment's `PATH`, as `execvp` searches them.
    candidates: Vec<CString>,
    /// Kept alive for the pointer arrays below.
    _strings: Vec<CString>,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    /// `argv` for running a candidate that is a script without `#!` with `/bin/sh`, as
    /// `execvp` does; slot 1 takes the candidate's path in the child.
    sh_argv: Vec<*const libc::c_char>,
    stdio: [RawFd; 3],
    cwd: RawFd,
}

impl SpawnPlan {
    /// A plan to run `argv` with exactly the environment `envs`, stdin/stdout/stderr from
    /// `stdio`, in the directory open at `cwd`. `NUL` bytes anywhere are refused.
    pub fn new<'a>(
        argv: &[String],
        envs: impl IntoIterator<Item = (&'a String, &'a String)>,
        stdio: [RawFd; 3],
        cwd: RawFd,
    ) -> io::Result<SpawnPlan> {
        let nul = || {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "nul byte found in provided data",
            )
        };
        let c = |s: &[u8]| CString::new(s).map_err(|_| nul());
        let program = argv
            .first()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "empty argv"))?;
        let mut strings = Vec::with_capacity(argv.len() + 16);
        for a in argv {
            strings.push(c(a.as_bytes())?);
        }
        let mut path = None;
        for (k, v) in envs {
            let mut kv = Vec::with_capacity(k.len() + v.len() + 1);
            kv.extend_from_slice(k.as_bytes());
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            strings.push(c(&kv)?);
            if k == "PATH" {
                path = Some(v.clone());
            }
        }
        // execvp's search: a name with a slash is used as is; otherwise each entry of PATH
        // (the C library's default when unset), an empty entry meaning the working directory.
        let candidates = if program.contains('/') {
            vec![c(program.as_bytes())?]
        } else if program.is_empty() {
            Vec::new()
        } else {
            let path = path.unwrap_or_else(|| "/bin:/usr/bin".into());
            let mut out = Vec::new();
            for dir in path.split(':') {
                let full = if dir.is_empty() {
                    program.clone()
                } else {
                    format!("{}/{program}", dir.trim_end_matches('/'))
                };
                out.push(c(full.as_bytes())?);
            }
            out
        };
        let argc = argv.len();
        let mut ptrs: Vec<*const libc::c_char> = strings.iter().map(|s| s.as_ptr()).collect();
        let envp_part = ptrs.split_off(argc);
        let mut argv_ptrs = ptrs;
        argv_ptrs.push(std::ptr::null());
        let mut envp = envp_part;
        envp.push(std::ptr::null());
        let mut sh_argv = Vec::with_capacity(argc + 2);
        sh_argv.push(c"/bin/sh".as_ptr());
        sh_argv.push(std::ptr::null());
        sh_argv.extend_from_slice(&argv_ptrs[1..]);
        Ok(SpawnPlan {
            candidates,
            _strings: strings,
            argv: argv_ptrs,
            envp,
            sh_argv,
            stdio,
            cwd,
        })
    }
}

/// What the child of [`spawn`] shares with its parent: the plan, the hook, and the error.
struct SpawnShared<'a, F> {
    plan: &'a mut SpawnPlan,
    pre_exec: F,
    /// The signal mask to restore just before `execve` (the parent thread's).
    mask: libc::sigset_t,
    /// The errno that stopped the child before or at `execve`; 0 if it reached the program.
    error: std::sync::atomic::AtomicI32,
}

/// Start `plan` in a child that shares the caller's memory until it calls `execve`
/// (`clone(CLONE_VM | CLONE_VFORK)`, as `posix_spawn` does), instead of copying the whole
/// caller with `fork`. In the child, in this order: signal handlers reset (see below), the
/// plan's stdio on 0–2, `fchdir` to its directory, `pre_exec`, the caller's signal mask
/// restored, then `execve` of each candidate (`execvp`'s rules). Returns the child's pid once
/// it runs the program; any failure on the way is returned as its `errno`, the child exited
/// and reaped.
///
/// `pre_exec` runs in that child: it must only make async-signal-safe raw syscalls (no
/// allocation, no locks, no C library calls that act on all threads such as `setuid`), and
/// return an error to stop the spawn.
pub fn spawn<F: FnMut() -> io::Result<()>>(plan: &mut SpawnPlan, pre_exec: F) -> io::Result<u32> {
    let spare = SPARE_STACK.lock().unwrap_or_else(|e| e.into_inner()).take();
    let stack = match spare {
        Some(stack) => stack,
        None => ChildStack::new()?,
    };
    let result = spawn_on(&stack, plan, pre_exec);
    // The child has exec'd or exited: the stack is free for the next spawn.
    let mut slot = SPARE_STACK.lock().unwrap_or_else(|e| e.into_inner());
    if slot.is_none() {
        *slot = Some(stack);
    }
    result
}

/// The stack of a [`spawn`] child: a private mapping whose lowest page is a guard.
struct ChildStack {
    base: *mut libc::c_void,
    len: usize,
}

// SAFETY: a plain mapping, used by one spawn at a time (it is taken out of `SPARE_STACK`).
unsafe impl Send for ChildStack {}

/// One stack kept for the next spawn. A fresh one for each spawn cost a mapping, the split
/// of it that its guard page makes, and a zeroed page for each page the child touched.
/// Spawns at once each take a stack; one is kept.
static SPARE_STACK: std::sync::Mutex<Option<ChildStack>> = std::sync::Mutex::new(None);

impl ChildStack {
    const SIZE: usize = 64 * 1024;

    fn new() -> io::Result<Self> {
        let page = page_size() as usize;
        let len = Self::SIZE + page;
        // SAFETY: a fresh private anonymous mapping; the lowest page becomes a guard below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let stack = ChildStack { base, len };
        // SAFETY: the first page of our own mapping.
        cvt(unsafe { libc::mprotect(base, page, libc::PROT_NONE) })?;
        Ok(stack)
    }

    /// The top of the stack, 16-byte aligned (the mapping is page-aligned).
    fn top(&self) -> *mut libc::c_void {
        // SAFETY: one past the end of our own mapping.
        unsafe { (self.base as *mut u8).add(self.len) as *mut libc::c_void }
    }
}

impl Drop for ChildStack {
    fn drop(&mut self) {
        // SAFETY: our own mapping, no longer used (no child runs on it).
        unsafe { libc::munmap(self.base, self.len) };
    }
}

/// [`spawn`] with the child running on `stack`.
fn spawn_on<F: FnMut() -> io::Result<()>>(
    stack: &ChildStack,
    plan: &mut SpawnPlan,
    pre_exec: F,
) -> io::Result<u32> {
    // Block every signal across the clone: a handler of the parent must never run in the
    // child, which shares its memory. The child restores this mask just before `execve`.
    // SAFETY: sigset_t is plain data (all zeroes is a valid value), filled by sigfillset and
    // pthread_sigmask through valid pointers.
    let mask = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut mask: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        let rc = libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut mask);
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        mask
    };
    let mut shared = SpawnShared {
        plan,
        pre_exec,
        mask,
        error: std::sync::atomic::AtomicI32::new(0),
    };
    // SAFETY: the child runs `spawn_child` on `stack`, which no one else uses meanwhile,
    // with a pointer to `shared`, which outlives it: CLONE_VFORK suspends this thread until
    // the child has called execve or exited. CLONE_VM without CLONE_FILES or CLONE_SIGHAND:
    // the child has its own descriptor table and signal dispositions.
    let pid = unsafe {
        libc::clone(
            spawn_child::<F>,
            stack.top(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            &mut shared as *mut SpawnShared<F> as *mut libc::c_void,
        )
    };
    let clone_error = io::Error::last_os_error();
    // SAFETY: restores the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &shared.mask, std::ptr::null_mut()) };
    if pid == -1 {
        return Err(clone_error);
    }
    match shared.error.load(std::sync::atomic::Ordering::SeqCst) {
        0 => Ok(pid as u32),
        errno => {
            // The child has exited (CLONE_VFORK returned); collect it unless the reaper did.
            let _ = rustix::process::waitpid(
                rustix::process::Pid::from_raw(pid),
                rustix::process::WaitOptions::empty(),
            );
            Err(io::Error::from_raw_os_error(errno))
        }
    }
}

/// The child of [`spawn`]. Never returns to the caller's code: it execs or exits.
extern "C" fn spawn_child<F: FnMut() -> io::Result<()>>(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `SpawnShared` the parent keeps alive while suspended.
    let shared = unsafe { &mut *(arg as *mut SpawnShared<F>) };
    let errno = match child_steps(shared) {
        Ok(never) => match never {},
        Err(e) => e.raw_os_error().unwrap_or(libc::EINVAL),
    };
    shared
        .error
        .store(errno.max(1), std::sync::atomic::Ordering::SeqCst);
    // SAFETY: _exit is async-signal-safe and ends only this child.
    unsafe { libc::_exit(127) }
}

fn child_steps<F: FnMut() -> io::Result<()>>(
    shared: &mut SpawnShared<'_, F>,
) -> io::Result<std::convert::Infallible> {
    // SAFETY: raw syscalls on integers and on memory of the plan, prepared before the clone.
    unsafe {
        // Handlers go back to the default: one running here would run on the parent's
        // memory (an ignored signal stays ignored across exec, as with fork). SIGPIPE, which
        // the Rust runtime ignores, goes back to the default as `std::process` does.
        for sig in 1..=KERNEL_LAST_SIGNAL {
            let Some(handler) = kernel_signal_handler(sig) else {
                continue; // SIGKILL/SIGSTOP, or past this kernel's last signal
            };
            if handler != libc::SIG_DFL && (handler != libc::SIG_IGN || sig == libc::SIGPIPE) {
                kernel_default_signal(sig)?;
            }
        }
        let plan = &mut *shared.plan;
        for (target, &fd) in plan.stdio.iter().enumerate() {
            let target = target as libc::c_int;
            if fd == target {
                // Already in place: only its close-on-exec flag must go.
                cvt(libc::fcntl(fd, libc::F_SETFD, 0))?;
            } else {
                loop {
                    match cvt(libc::dup2(fd, target)) {
                        Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                        r => {
                            r?;
                            break;
                        }
                    }
                }
            }
        }
        cvt(libc::fchdir(plan.cwd))?;
        (shared.pre_exec)()?;
        let rc = libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &shared.mask as *const libc::sigset_t,
            std::ptr::null_mut::<libc::sigset_t>(),
            8,
        );
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        // execvp's rules: go on past a candidate that is missing or not executable by us
        // (reporting EACCES if one was), stop at any other error; a file the kernel cannot
        // execute is run by /bin/sh.
        let mut eacces = false;
        let mut last = libc::ENOENT;
        for cand in &plan.candidates {
            libc::execve(cand.as_ptr(), plan.argv.as_ptr(), plan.envp.as_ptr());
            let e = *libc::__errno_location();
            if e == libc::ENOEXEC {
                plan.sh_argv[1] = cand.as_ptr();
                libc::execve(
                    c"/bin/sh".as_ptr(),
                    plan.sh_argv.as_ptr(),
                    plan.envp.as_ptr(),
                );
                return Err(io::Error::last_os_error());
            }
            match e {
                libc::EACCES => eacces = true,
                libc::ENOENT | libc::ESTALE | libc::ENOTDIR | libc::ENODEV | libc::ETIMEDOUT => {}
                _ => return Err(io::Error::from_raw_os_error(e)),
            }
            last = e;
        }
        Err(io::Error::from_raw_os_error(if eacces {
            libc::EACCES
        } else {
            last
        }))
    }
}
