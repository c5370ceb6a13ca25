//! The seccomp deny-list applied to every sandbox process.
//!
//! Capabilities are already dropped, so most of these calls would fail anyway; the filter
//! removes the kernel attack surface behind them (new user namespaces, mount APIs, BPF,
//! io_uring, keyrings, module loading). `clone3` answers `ENOSYS` so C libraries fall back to
//! `clone`, whose flags the filter can inspect. (64-bit Linux: syscall numbers are `i64`.)

use std::collections::BTreeMap;
use std::sync::OnceLock;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule,
};

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
    libc::SYS_open_by_handle_at,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_syslog,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
];

/// The compiled filters, built once per agent (before any fork), applied in each child.
/// A filter that fails to build is an error for every caller, never an empty list: no
/// sandbox process runs without it.
pub fn filters() -> crate::Result<&'static [BpfProgram]> {
    static FILTERS: OnceLock<Result<Vec<BpfProgram>, String>> = OnceLock::new();
    checked(FILTERS.get_or_init(|| build(std::env::consts::ARCH).map_err(|e| e.to_string())))
}

/// The filters, or the error that stops sandbox creation.
fn checked(built: &Result<Vec<BpfProgram>, String>) -> crate::Result<&[BpfProgram]> {
    match built {
        Ok(f) if !f.is_empty() => Ok(f),
        Ok(_) => Err(unavailable("the filter list is empty".into())),
        Err(e) => Err(unavailable(e.clone())),
    }
}

fn unavailable(why: String) -> crate::Error {
    crate::Error::Unavailable {
        reason: format!("cannot build the sandbox's seccomp filter: {why}"),
        remedy: "run on x86_64 or aarch64 Linux (the architectures the filter is built for)".into(),
    }
}

fn build(arch: &str) -> Result<Vec<BpfProgram>, seccompiler::Error> {
    let arch = arch.try_into().map_err(seccompiler::Error::Backend)?;
    let mut deny: BTreeMap<i64, Vec<SeccompRule>> =
        DENIED.iter().map(|&nr| (nr, Vec::new())).collect();
    // clone is how threads and processes are made: refuse only a new user namespace.
    let newuser = libc::CLONE_NEWUSER as u64;
    deny.insert(
        libc::SYS_clone,
        vec![SeccompRule::new(vec![SeccompCondition::new(
            0,
            SeccompCmpArgLen::Qword,
            SeccompCmpOp::MaskedEq(newuser),
            newuser,
        )
        .map_err(seccompiler::Error::Backend)?])
        .map_err(seccompiler::Error::Backend)?],
    );
    // prlimit64 may read any process's limits and set the caller's own; setting another
    // process's is refused: every sandbox process shares the agent's uid in a single-uid
    // namespace, and lowering PID 1's limits would break the sandbox's API.
    deny.insert(
        libc::SYS_prlimit64,
        vec![SeccompRule::new(vec![
            SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, 0)
                .map_err(seccompiler::Error::Backend)?,
            SeccompCondition::new(2, SeccompCmpArgLen::Qword, SeccompCmpOp::Ne, 0)
                .map_err(seccompiler::Error::Backend)?,
        ])
        .map_err(seccompiler::Error::Backend)?],
    );
    let deny = SeccompFilter::new(
        deny,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(seccompiler::Error::Backend)?;
    let clone3 = SeccompFilter::new(
        BTreeMap::from([(libc::SYS_clone3, Vec::new())]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )
    .map_err(seccompiler::Error::Backend)?;
    Ok(vec![deny.try_into()?, clone3.try_into()?])
}

/// Install the filters in the calling (freshly forked) process. Allocation-free. An empty
/// list is refused: the caller must have had [`filters`] succeed.
pub fn apply(filters: &[BpfProgram]) -> std::io::Result<()> {
    if filters.is_empty() {
        return Err(std::io::Error::from_raw_os_error(libc::EPERM));
    }
    for f in filters {
        seccompiler::apply_filter(f).map_err(|_| std::io::Error::from_raw_os_error(libc::EPERM))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::ErrorCode;

    #[test]
    fn the_filters_compile_for_this_architecture() {
        assert_eq!(super::filters().unwrap().len(), 2);
    }

    /// Fail closed: a filter that cannot be built stops sandbox creation with a typed error
    /// (before, the failure became an empty filter list and sandboxes ran unfiltered).
    #[test]
    fn a_filter_that_fails_to_build_is_an_error_not_an_empty_list() {
        let built = super::build("sparc").map_err(|e| e.to_string());
        assert!(built.is_err());
        let err = super::checked(&built).unwrap_err();
        assert_eq!(err.code(), ErrorCode::Unavailable, "{err}");
        let err = super::checked(&Ok(Vec::new())).unwrap_err();
        assert_eq!(err.code(), ErrorCode::Unavailable, "{err}");
        assert!(
            super::apply(&[]).is_err(),
            "an empty filter list was applied"
        );
    }
}
