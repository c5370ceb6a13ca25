//! The seccomp deny-list applied to every sandbox process.
//!
//! Capabilities are already dropped, so most of these calls would fail anyway; the filter
//! removes the kernel attack surface behind them (new user namespaces, mount APIs, BPF,
//! io_uring, keyrings, module loading). `clone3` answers `ENOSYS` so C libraries fall back to
//! `clone`, whose flags the filter can inspect. (64-bit Linux: syscall numbers are `i64`.)
//!
//! The filter is one classic BPF program laid out by hand: the architecture check, then a
//! binary search over the syscall numbers that have a rule, so a syscall runs a handful of
//! comparisons rather than one per rule. The agent installs it on itself once its setup is
//! done ([`install`]); every process it starts inherits it through `clone` and `execve`, so
//! starting a process installs nothing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use super::sys;

/// One classic BPF instruction, as the kernel reads it.
pub type Insn = libc::sock_filter;

/// `open_tree_attr` (Linux 6.15), which the `libc` crate does not name yet: `open_tree` with
/// mount attributes. Numbers from 424 on are the same on x86_64 and aarch64.
const SYS_OPEN_TREE_ATTR: i64 = 467;

/// Syscalls refused with `EPERM`, whatever their arguments.
const DENIED: &[i64] = &[
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_reboot,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_userfaultfd,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_acct,
    libc::SYS_quotactl,
    // The same quota code as `quotactl`, through a descriptor.
    libc::SYS_quotactl_fd,
    libc::SYS_open_by_handle_at,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_mount_setattr,
    SYS_OPEN_TREE_ATTR,
    libc::SYS_syslog,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
];

/// What the filter does with a syscall number that has a rule (every other one is allowed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rule {
    /// `EPERM`.
    Deny,
    /// `ENOSYS` (`clone3`, whose flags sit in memory the filter cannot read).
    NoSys,
    /// `EPERM` when the flags ask for a new user namespace. `clone` is how threads and
    /// processes are made, so only that is refused.
    Clone,
    /// `EPERM` when setting another process's limits (`pid != 0 && new_limit != NULL`).
    /// Reading any process's limits and setting one's own stay allowed: every sandbox
    /// process shares the agent's uid in a single-uid namespace, and lowering PID 1's limits
    /// would break the sandbox's API.
    Prlimit,
}

// Classic BPF opcodes (linux/bpf_common.h): class | size or operation | source.
/// `BPF_LD | BPF_W | BPF_ABS` (0x00 | 0x00 | 0x20): load a word of `seccomp_data`.
const BPF_LD_W_ABS: u16 = 0x20;
/// `BPF_JMP | BPF_JEQ | BPF_K` (0x05 | 0x10 | 0x00).
const BPF_JMP_JEQ_K: u16 = 0x15;
/// `BPF_JMP | BPF_JGE | BPF_K` (0x05 | 0x30 | 0x00), unsigned.
const BPF_JMP_JGE_K: u16 = 0x35;
/// `BPF_JMP | BPF_JSET | BPF_K` (0x05 | 0x40 | 0x00): jump if `A & k != 0`.
const BPF_JMP_JSET_K: u16 = 0x45;
/// `BPF_RET | BPF_K` (0x06 | 0x00).
const BPF_RET_K: u16 = 0x06;

/// The bit that marks a syscall of x86_64's x32 ABI: the same architecture value, other
/// numbers. Never a valid native number on either supported architecture.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

// Offsets in `struct seccomp_data`: nr (s32), arch (u32), instruction pointer (u64), six u64
// arguments. Both supported architectures are little-endian: an argument's low half first.
const DATA_NR: u32 = 0;
const DATA_ARCH: u32 = 4;
const fn arg_low(i: u32) -> u32 {
    16 + 8 * i
}
const fn arg_high(i: u32) -> u32 {
    arg_low(i) + 4
}

const RET_ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
const RET_KILL: u32 = libc::SECCOMP_RET_KILL_PROCESS;
const RET_EPERM: u32 = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
const RET_ENOSYS: u32 = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;

/// Most rules a leaf of the search compares one by one.
const LEAF: usize = 4;

/// The `AUDIT_ARCH_*` value of an architecture the filter is built for: the ELF machine,
/// 64-bit and little-endian flags.
fn audit_arch(arch: &str) -> Option<u32> {
    const LE64: u32 = 0x8000_0000 | 0x4000_0000;
    match arch {
        "x86_64" => Some(62 | LE64),
        "aarch64" => Some(183 | LE64),
        _ => None,
    }
}

/// The compiled program, built once per agent. A program that fails to build is an error for
/// every caller: no sandbox process runs without it.
pub fn program() -> sandcove_core::Result<&'static [Insn]> {
    static PROGRAM: OnceLock<Result<Vec<Insn>, String>> = OnceLock::new();
    checked(PROGRAM.get_or_init(|| build(std::env::consts::ARCH)))
}

/// The program, or the error that stops sandbox creation.
fn checked(built: &Result<Vec<Insn>, String>) -> sandcove_core::Result<&[Insn]> {
    match built {
        Ok(p) if !p.is_empty() => Ok(p),
        Ok(_) => Err(unavailable("the filter is empty".into())),
        Err(e) => Err(unavailable(e.clone())),
    }
}

fn unavailable(why: String) -> sandcove_core::Error {
    sandcove_core::Error::Unavailable {
        reason: format!("cannot build the sandbox's seccomp filter: {why}"),
        remedy: "run on x86_64 or aarch64 Linux (the architectures the filter is built for)".into(),
    }
}

/// Set once this process runs under the program ([`install`]).
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// Install the program on every thread of the calling process (the agent, once its setup is
/// done); what it starts afterwards inherits it. Sets `no_new_privs` first, which an
/// unprivileged filter needs. An error leaves the agent unable to start processes.
pub fn install() -> sandcove_core::Result<()> {
    let program = program()?;
    sys::set_no_new_privs()
        .and_then(|()| sys::seccomp_filter_all_threads(program))
        .map_err(|e| sandcove_core::Error::Unavailable {
            reason: format!("cannot install the sandbox's seccomp filter: {e}"),
            remedy: "run on Linux with seccomp filters enabled (CONFIG_SECCOMP_FILTER)".into(),
        })?;
    INSTALLED.store(true, Ordering::SeqCst);
    Ok(())
}

/// Fail closed: `Ok` only once [`install`] has succeeded in this process, so a process that
/// would start without the filter is refused instead.
pub fn installed() -> sandcove_core::Result<()> {
    if INSTALLED.load(Ordering::SeqCst) {
        Ok(())
    } else {
        Err(sandcove_core::Error::Unavailable {
            reason: "the agent runs without its seccomp filter; no process is started".into(),
            remedy: "report this: the agent installs the filter before it serves".into(),
        })
    }
}

/// The rules by syscall number, ascending.
fn rules() -> Vec<(u32, Rule)> {
    let mut rules: Vec<(u32, Rule)> = DENIED
        .iter()
        .map(|&nr| (nr as u32, Rule::Deny))
        .chain([
            (libc::SYS_clone as u32, Rule::Clone),
            (libc::SYS_prlimit64 as u32, Rule::Prlimit),
            (libc::SYS_clone3 as u32, Rule::NoSys),
        ])
        .collect();
    rules.sort_unstable_by_key(|&(nr, _)| nr);
    rules
}

/// Where a jump goes before the program is laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    /// The next instruction.
    Next,
    /// An instruction by index.
    At(usize),
    /// The block that carries out a rule.
    Rule(Rule),
    /// The shared `ALLOW` return.
    Allow,
}

/// An instruction whose jump targets are not resolved yet.
struct Op {
    code: u16,
    k: u32,
    jt: Target,
    jf: Target,
}

struct Asm(Vec<Op>);

impl Asm {
    fn stmt(&mut self, code: u16, k: u32) {
        self.0.push(Op {
            code,
            k,
            jt: Target::Next,
            jf: Target::Next,
        });
    }

    fn jump(&mut self, code: u16, k: u32, jt: Target, jf: Target) -> usize {
        self.0.push(Op { code, k, jt, jf });
        self.0.len() - 1
    }

    /// A search over `rules` (ascending, distinct), the syscall number in the accumulator:
    /// halves by `>=` until a leaf, which compares its few numbers and else allows.
    fn search(&mut self, rules: &[(u32, Rule)]) {
        if rules.len() <= LEAF {
            for &(nr, rule) in rules {
                self.jump(BPF_JMP_JEQ_K, nr, Target::Rule(rule), Target::Next);
            }
            self.stmt(BPF_RET_K, RET_ALLOW);
            return;
        }
        let (low, high) = rules.split_at(rules.len() / 2);
        let split = self.jump(BPF_JMP_JGE_K, high[0].0, Target::Next, Target::Next);
        self.search(low);
        self.0[split].jt = Target::At(self.0.len());
        self.search(high);
    }
}

/// Lay out the program for `arch`.
fn build(arch: &str) -> Result<Vec<Insn>, String> {
    let audit = audit_arch(arch).ok_or_else(|| format!("unsupported architecture {arch:?}"))?;
    let mut asm = Asm(Vec::new());
    // Another ABI's syscall numbers mean other calls: such a process is killed.
    asm.stmt(BPF_LD_W_ABS, DATA_ARCH);
    asm.jump(BPF_JMP_JEQ_K, audit, Target::At(3), Target::Next);
    asm.stmt(BPF_RET_K, RET_KILL);
    asm.stmt(BPF_LD_W_ABS, DATA_NR);
    // The x32 ABI shares x86_64's architecture value and has its own numbers, which the
    // search would allow: refused as a kernel built without x32 refuses them.
    asm.jump(
        BPF_JMP_JSET_K,
        X32_SYSCALL_BIT,
        Target::Rule(Rule::NoSys),
        Target::Next,
    );
    let rules = rules();
    if rules.windows(2).any(|w| w[0].0 >= w[1].0) {
        return Err("a syscall number has two rules".into());
    }
    asm.search(&rules);

    // The blocks the search jumps to (jumps go forward only: the argument checks first,
    // then the returns they lead to).
    let mut blocks = Vec::new();
    let mut block = |asm: &mut Asm, target: Target| blocks.push((target, asm.0.len()));
    block(&mut asm, Target::Rule(Rule::Clone));
    asm.stmt(BPF_LD_W_ABS, arg_low(0));
    let newuser = libc::CLONE_NEWUSER as u32;
    asm.jump(
        BPF_JMP_JSET_K,
        newuser,
        Target::Rule(Rule::Deny),
        Target::Allow,
    );
    block(&mut asm, Target::Rule(Rule::Prlimit));
    // The pid is an int: its low half only, as the kernel reads it.
    asm.stmt(BPF_LD_W_ABS, arg_low(0));
    asm.jump(BPF_JMP_JEQ_K, 0, Target::Allow, Target::Next);
    asm.stmt(BPF_LD_W_ABS, arg_low(2));
    asm.jump(BPF_JMP_JEQ_K, 0, Target::Next, Target::Rule(Rule::Deny));
    asm.stmt(BPF_LD_W_ABS, arg_high(2));
    asm.jump(BPF_JMP_JEQ_K, 0, Target::Allow, Target::Rule(Rule::Deny));
    block(&mut asm, Target::Rule(Rule::Deny));
    asm.stmt(BPF_RET_K, RET_EPERM);
    block(&mut asm, Target::Rule(Rule::NoSys));
    asm.stmt(BPF_RET_K, RET_ENOSYS);
    block(&mut asm, Target::Allow);
    asm.stmt(BPF_RET_K, RET_ALLOW);

    let at = |target: Target, from: usize| -> Result<u8, String> {
        let to = match target {
            Target::Next => from + 1,
            Target::At(i) => i,
            other => blocks
                .iter()
                .find(|(t, _)| *t == other)
                .map(|&(_, i)| i)
                .ok_or_else(|| format!("no block for {other:?}"))?,
        };
        to.checked_sub(from + 1)
            .and_then(|d| u8::try_from(d).ok())
            .ok_or_else(|| format!("a jump from {from} to {to} does not fit"))
    };
    let program = asm
        .0
        .iter()
        .enumerate()
        .map(|(i, op)| {
            let jumps = op.code & 0x07 == 0x05;
            Ok(Insn {
                code: op.code,
                jt: if jumps { at(op.jt, i)? } else { 0 },
                jf: if jumps { at(op.jf, i)? } else { 0 },
                k: op.k,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    // The kernel's limit (BPF_MAXINSNS).
    if program.len() > 4096 {
        return Err(format!("{} instructions", program.len()));
    }
    Ok(program)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandcove_core::ErrorCode;

    /// The fields of `struct seccomp_data` a program reads.
    #[derive(Clone, Copy, Debug)]
    struct Data {
        nr: u32,
        arch: u32,
        args: [u64; 6],
    }

    impl Data {
        fn word(&self, offset: u32) -> u32 {
            match offset {
                DATA_NR => self.nr,
                DATA_ARCH => self.arch,
                o if (16..64).contains(&o) && o % 4 == 0 => {
                    let arg = self.args[((o - 16) / 8) as usize];
                    if (o - 16) % 8 == 0 {
                        arg as u32
                    } else {
                        (arg >> 32) as u32
                    }
                }
                o => panic!("load at offset {o}"),
            }
        }
    }

    /// A classic BPF interpreter for what seccomp programs use: absolute word loads, `and`
    /// with a constant, conditional and unconditional jumps, constant returns.
    fn run(program: &[(u16, u8, u8, u32)], data: &Data) -> u32 {
        let mut acc = 0u32;
        let mut pc = 0usize;
        loop {
            let (code, jt, jf, k) = program[pc];
            pc += 1;
            let cond = |c: bool| if c { jt as usize } else { jf as usize };
            match code {
                0x20 => acc = data.word(k),
                0x54 => acc &= k,
                0x05 => pc += k as usize,
                0x15 => pc += cond(acc == k),
                0x25 => pc += cond(acc > k),
                0x35 => pc += cond(acc >= k),
                0x45 => pc += cond(acc & k != 0),
                0x06 => return k,
                _ => panic!("opcode {code:#x} at {}", pc - 1),
            }
        }
    }

    /// What the kernel returns for a stack of filters: the action of highest precedence
    /// (the lowest as a signed number), the newest filter's on a tie.
    fn run_stack(filters: &[Vec<(u16, u8, u8, u32)>], data: &Data) -> u32 {
        let action = |r: u32| (r & libc::SECCOMP_RET_ACTION_FULL) as i32;
        let mut result = RET_ALLOW;
        for f in filters.iter().rev() {
            let r = run(f, data);
            if action(r) < action(result) {
                result = r;
            }
        }
        result
    }

    fn ours() -> Vec<(u16, u8, u8, u32)> {
        program()
            .unwrap()
            .iter()
            .map(|i| (i.code, i.jt, i.jf, i.k))
            .collect()
    }

    /// The two filters seccompiler built before this program replaced them: the deny-list
    /// (with the `clone` and `prlimit64` argument rules) and `clone3` → `ENOSYS`.
    fn oracle() -> Vec<Vec<(u16, u8, u8, u32)>> {
        use seccompiler::{
            BpfProgram, SeccompAction, SeccompCmpArgLen as Len, SeccompCmpOp as Op,
            SeccompCondition as Cond, SeccompFilter, SeccompRule,
        };
        use std::collections::BTreeMap;
        let arch = std::env::consts::ARCH.try_into().unwrap();
        let mut deny: BTreeMap<i64, Vec<SeccompRule>> =
            DENIED.iter().map(|&nr| (nr, Vec::new())).collect();
        let newuser = libc::CLONE_NEWUSER as u64;
        deny.insert(
            libc::SYS_clone,
            vec![SeccompRule::new(vec![Cond::new(
                0,
                Len::Qword,
                Op::MaskedEq(newuser),
                newuser,
            )
            .unwrap()])
            .unwrap()],
        );
        deny.insert(
            libc::SYS_prlimit64,
            vec![SeccompRule::new(vec![
                Cond::new(0, Len::Dword, Op::Ne, 0).unwrap(),
                Cond::new(2, Len::Qword, Op::Ne, 0).unwrap(),
            ])
            .unwrap()],
        );
        let deny = SeccompFilter::new(
            deny,
            SeccompAction::Allow,
            SeccompAction::Errno(libc::EPERM as u32),
            arch,
        )
        .unwrap();
        let clone3 = SeccompFilter::new(
            BTreeMap::from([(libc::SYS_clone3, Vec::new())]),
            SeccompAction::Allow,
            SeccompAction::Errno(libc::ENOSYS as u32),
            arch,
        )
        .unwrap();
        [deny, clone3]
            .into_iter()
            .map(|f| {
                let p: BpfProgram = f.try_into().unwrap();
                p.iter().map(|i| (i.code, i.jt, i.jf, i.k)).collect()
            })
            .collect()
    }

    /// Argument cases that tell the `clone` and `prlimit64` rules apart.
    fn argument_cases() -> Vec<[u64; 6]> {
        let newuser = libc::CLONE_NEWUSER as u64;
        let mut cases = vec![[0; 6]];
        for a0 in [
            0,
            1,
            u64::MAX,
            newuser,
            newuser | libc::CLONE_NEWNS as u64,
            !newuser,
            1 << 32,
            newuser << 32,
            libc::SIGCHLD as u64,
            (libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD) as u64,
        ] {
            for a2 in [0, 1, 1 << 32, u64::MAX, 0x7ffd_0000_1000] {
                cases.push([a0, 0, a2, 0, 0, 0]);
                cases.push([a0, u64::MAX, a2, u64::MAX, u64::MAX, u64::MAX]);
            }
        }
        cases
    }

    #[test]
    fn the_program_compiles_for_this_architecture() {
        let program = program().unwrap();
        assert!(program.len() < 120, "{} instructions", program.len());
    }

    /// For every syscall number (and a foreign architecture, and the argument cases of the
    /// two argument rules), the one program answers as the two filters it replaced did; but
    /// for a number with the x32 bit, which those allowed (so `unshare` through the x32 ABI
    /// passed on a kernel built with it), and which this program answers with `ENOSYS`.
    #[test]
    fn the_program_answers_as_the_filters_it_replaced() {
        let ours = ours();
        let oracle = oracle();
        let native = audit_arch(std::env::consts::ARCH).unwrap();
        // i386 (an x86_64 process may make its syscalls), arm, and nonsense.
        let foreign = [3 | 0x4000_0000, 40 | 0x4000_0000, 0, u32::MAX];
        let numbers = (0..1024u32)
            .chain((0..1024).map(|nr| nr | 0x4000_0000))
            .chain([u32::MAX, 0x8000_0000, 0x7fff_ffff]);
        let mut checked = 0;
        for nr in numbers {
            let special = [libc::SYS_clone, libc::SYS_prlimit64].contains(&(nr as i64));
            let cases = if special {
                argument_cases()
            } else {
                vec![[0; 6], [u64::MAX; 6]]
            };
            for args in cases {
                for arch in std::iter::once(native).chain(foreign) {
                    let data = Data { nr, arch, args };
                    let (new, old) = (run(&ours, &data), run_stack(&oracle, &data));
                    if arch == native && nr & X32_SYSCALL_BIT != 0 {
                        assert_eq!((new, old), (RET_ENOSYS, RET_ALLOW), "{data:x?}");
                    } else {
                        assert_eq!(new, old, "{data:x?}");
                    }
                    checked += 1;
                }
            }
        }
        assert!(checked > 10_000);
    }

    /// Spot checks of the actions themselves, so the test above cannot pass on two equally
    /// wrong programs.
    #[test]
    fn the_program_refuses_what_it_must_and_allows_the_rest() {
        let ours = ours();
        let arch = audit_arch(std::env::consts::ARCH).unwrap();
        let call = |nr: i64, args: [u64; 6]| {
            run(
                &ours,
                &Data {
                    nr: nr as u32,
                    arch,
                    args,
                },
            )
        };
        let newuser = libc::CLONE_NEWUSER as u64;
        assert_eq!(call(libc::SYS_unshare, [0; 6]), RET_EPERM);
        assert_eq!(call(libc::SYS_io_uring_setup, [0; 6]), RET_EPERM);
        assert_eq!(call(libc::SYS_clone3, [0; 6]), RET_ENOSYS);
        assert_eq!(call(libc::SYS_clone, [newuser, 0, 0, 0, 0, 0]), RET_EPERM);
        assert_eq!(
            call(libc::SYS_clone, [libc::SIGCHLD as u64, 0, 0, 0, 0, 0]),
            RET_ALLOW
        );
        assert_eq!(
            call(libc::SYS_prlimit64, [1, 7, 0x1000, 0, 0, 0]),
            RET_EPERM
        );
        assert_eq!(
            call(libc::SYS_prlimit64, [1, 7, 0, 0x1000, 0, 0]),
            RET_ALLOW
        );
        assert_eq!(
            call(libc::SYS_prlimit64, [0, 7, 0x1000, 0, 0, 0]),
            RET_ALLOW
        );
        assert_eq!(call(libc::SYS_read, [0; 6]), RET_ALLOW);
        let data = Data {
            nr: libc::SYS_read as u32,
            arch: 3 | 0x4000_0000,
            args: [0; 6],
        };
        assert_eq!(run(&ours, &data), RET_KILL);
        let x32_unshare = libc::SYS_unshare | X32_SYSCALL_BIT as i64;
        assert_eq!(call(x32_unshare, [0; 6]), RET_ENOSYS);
        assert_eq!(call(-1, [0; 6]), RET_ENOSYS);
    }

    /// The kernel accepts the program, and under it the denied calls are refused while
    /// threads, processes and limits work. Run in a fresh copy of this test binary (one test,
    /// one thread), which installs the program on itself.
    #[test]
    fn the_kernel_enforces_the_program() {
        const CHILD: &str = "SANDCOVE_SECCOMP_TEST_CHILD";
        if std::env::var_os(CHILD).is_some() {
            return enforce_in_this_process();
        }
        let name = format!(
            "{}::the_kernel_enforces_the_program",
            module_path!().split_once("::").unwrap().1
        );
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", &name, "--test-threads=1", "--nocapture"])
            .env(CHILD, "1")
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{text}");
        assert!(text.contains("1 passed"), "{text}");
    }

    fn enforce_in_this_process() {
        install().expect("install");
        installed().expect("installed");
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        assert!(status.contains("Seccomp:\t2"), "{status}");
        let errno = |ret: libc::c_long| {
            if ret == -1 {
                std::io::Error::last_os_error().raw_os_error()
            } else {
                Some(0)
            }
        };
        // SAFETY: syscalls with integer or null arguments, each refused by the filter.
        let refused = unsafe {
            [
                errno(libc::syscall(libc::SYS_unshare, libc::CLONE_NEWUSER)),
                errno(libc::syscall(libc::SYS_unshare, libc::CLONE_NEWNS)),
                errno(libc::syscall(libc::SYS_io_uring_setup, 1, 0)),
                errno(libc::syscall(libc::SYS_keyctl, 0, 0)),
                errno(libc::syscall(libc::SYS_prlimit64, 1, 7, 8, 0)),
            ]
        };
        assert_eq!(refused, [Some(libc::EPERM); 5]);
        // The fd-based twins of refused calls (the same quota code as `quotactl`, the mount
        // API's attribute calls), refused like them. Without the filter each answers its
        // own error here (a bad descriptor, a short attribute size), never EPERM.
        // SAFETY: integer and null arguments; refused before the kernel reads any.
        let twins = unsafe {
            [
                errno(libc::syscall(
                    libc::SYS_quotactl_fd,
                    -1,
                    // QCMD(Q_GETFMT, USRQUOTA): a command that needs no privilege.
                    0x8000_0400u32,
                    0,
                    0,
                )),
                errno(libc::syscall(libc::SYS_mount_setattr, -1, 0, 0, 0, 0)),
                errno(libc::syscall(SYS_OPEN_TREE_ATTR, -1, 0, 0, 0, 0)),
            ]
        };
        assert_eq!(
            twins,
            [Some(libc::EPERM); 3],
            "quotactl_fd, mount_setattr, open_tree_attr"
        );
        // SAFETY: clone3 with a null argument; refused before the kernel reads it.
        let clone3 = unsafe { errno(libc::syscall(libc::SYS_clone3, 0, 0)) };
        assert_eq!(clone3, Some(libc::ENOSYS));
        // A thread (the C library falls back from clone3 to clone) and a process.
        assert_eq!(std::thread::spawn(|| 7).join().unwrap(), 7);
        let status = std::process::Command::new("/bin/sh")
            .args(["-c", "grep -q '^Seccomp:.2' /proc/self/status"])
            .status()
            .unwrap();
        assert!(status.success(), "a child runs under the filter");
        sys::getrlimit(libc::RLIMIT_NOFILE).unwrap();
    }

    /// Fail closed: a program that cannot be built stops sandbox creation with a typed error
    /// (before, the failure became an empty filter list and sandboxes ran unfiltered), and
    /// nothing is started by an agent that did not install it.
    #[test]
    fn a_program_that_fails_to_build_is_an_error_not_an_empty_filter() {
        let built = build("sparc");
        assert!(built.is_err());
        let err = checked(&built).unwrap_err();
        assert_eq!(err.code(), ErrorCode::Unavailable, "{err}");
        let err = checked(&Ok(Vec::new())).unwrap_err();
        assert_eq!(err.code(), ErrorCode::Unavailable, "{err}");
        let err = installed().unwrap_err();
        assert_eq!(err.code(), ErrorCode::Unavailable, "{err}");
    }
}
