//! The constructor hook that turns a re-executed copy of any program linking `sandcove` into
//! the spawner of sandbox monitors (or an in-pod agent), before that program's `main` runs.

use super::{spawner, sys};

/// Env var carrying the role of a re-executed process (empty: none, as a Pod sets it).
pub(super) const ROLE_ENV: &str = sandcove_agent::pod::ROLE_ENV;
/// The monitor spawner's role (see `spawner`).
pub(super) const ROLE_SPAWNER: &str = "spawner";
/// A bounded volume's holder (see `volume_holder`).
pub(super) const ROLE_VOLUME: &str = "volume";

/// Runs before `main` (glibc calls `.init_array` entries with argc, argv and envp).
#[used]
#[link_section = ".init_array"]
static ENTRY: extern "C" fn(libc::c_int, *const *const libc::c_char, *const *const libc::c_char) =
    entry;

extern "C" fn entry(
    _argc: libc::c_int,
    _argv: *const *const libc::c_char,
    _envp: *const *const libc::c_char,
) {
    let Some(role) = std::env::var_os(ROLE_ENV) else {
        return;
    };
    // Not inherited by anything the role starts.
    // SAFETY: we are before `main`, single-threaded: nothing else reads the environment.
    unsafe { std::env::remove_var(ROLE_ENV) };
    if role.is_empty() {
        // No role: the program itself (a Pod's agent sets the variable empty, so its image's
        // `Env` cannot name one).
        return;
    }
    sys::ignore_sigpipe();
    if role == ROLE_SPAWNER {
        spawner::main();
    }
    if role == ROLE_VOLUME {
        super::volume_holder::main();
    }
    if role == crate::agent_server::ROLE_POD_AGENT {
        match crate::agent_server::PodAgentConfig::from_env() {
            Ok(config) => crate::agent_server::run_pod_agent(config),
            Err(e) => {
                eprintln!("sandcove agent: {e}");
                sys::exit_now(2);
            }
        }
    }
    // Before main, in a helper process with no log subscriber: stderr is all there is.
    eprintln!("sandcove: unknown role {role:?}");
    sys::exit_now(2);
}

/// Reference the hook so the linker keeps the object file that holds it, whatever the
/// program uses of this crate.
pub(super) fn ensure_linked() {
    std::hint::black_box(&ENTRY);
}
