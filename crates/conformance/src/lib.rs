//! The conformance suite (crate `sandcove-conformance`): behaviour every [`Backend`] must
//! show, as `pub async fn` cases, split by concern into modules and re-exported here.
//!
//! Each case creates what it needs, asserts, and destroys it; a failed assertion panics with a
//! message naming the expectation. Cases read [`Backend::capabilities`] and check the refusal
//! (`NotSupported`) where a capability is missing, so the suite runs unchanged against every
//! backend. Host-side checks (no stray processes, host files untouched) assume the backend runs
//! its sandboxes on this machine, as the embedded engine and a loopback server do.
//!
//! [`conformance_tests!`](crate::conformance_tests) expands to one `#[tokio::test]` per case:
//!
//! ```ignore
//! sandcove_conformance::conformance_tests!(async {
//!     std::sync::Arc::new(sandcove::LocalBackend::new().unwrap()) as std::sync::Arc<dyn sandcove::Backend>
//! });
//! ```
#![forbid(unsafe_code)]

/// The umbrella crate, for the paths [`conformance_tests!`] expands to.
#[doc(hidden)]
pub use sandcove;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt;

use sandcove::client::collect;
use sandcove::{
    AnnotationUpdate, Backend, ByteStream, Command, CopyOptions, CreateOptions, ErrorCode,
    FileKind, FsEventKind, ListDirOptions, ListOptions, MkdirOptions, NetworkPolicy, Output,
    PreviewOptions, ProcessEvent, ProcessSelector, ProcessSpec, PtySize, ReadOptions,
    RemoveOptions, RenameOptions, RestartPolicy, SandboxState, Signal, StatOptions, TimeoutAction,
    VolumeMount, WatchOptions, WriteOptions,
};

/// Expand to one `#[tokio::test]` per conformance case. `$make` is an expression evaluating
/// to a future of `Arc<dyn Backend>` (evaluated afresh for each test).
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        $crate::conformance_tests!(@cases $make;
            create_get_list_destroy,
            unique_names,
            concurrent_creates_with_one_name,
            missing_sandbox_is_not_found,
            set_timeout_moves_the_lease,
            lease_end_destroys_the_sandbox,
            argv_and_shell_commands,
            exit_codes_and_stderr,
            output_is_binary_safe,
            large_output_streams_without_loss,
            sandbox_and_process_envs,
            bad_process_input_is_refused,
            missing_binary_is_not_found,
            working_directory,
            default_user_and_home,
            running_as_another_user,
            stdin_write_and_close,
            signals_and_kill_mid_stream,
            process_timeout_kills_the_group,
            list_and_attach_processes,
            attach_marks_where_live_output_starts,
            restart_policy_restarts_failures,
            file_calls_as_a_user,
            file_round_trip_and_metadata,
            file_attributes,
            large_file_round_trip,
            file_byte_bounds,
            no_clobber_writes_renames_and_copies,
            copy_files_and_trees,
            exists_tells_missing_from_unknown,
            directory_operations,
            file_errors_are_typed,
            failed_uploads_leave_nothing_behind,
            file_api_cannot_escape,
            system_directories_are_read_only,
            destroy_ends_background_processes,
            limits_are_applied,
            sandbox_sees_only_its_own_processes,
            pause_stops_and_resume_continues,
            lease_end_can_pause,
            lease_end_action_can_change,
            lease_end_can_stop,
            a_snapshot_asked_to_keep_memory_is_refused_first,
            auto_resume_on_request,
            previews_serve_and_guard_private_ports,
            snapshots_and_fork_copy_files_not_processes,
            volumes_outlive_sandboxes,
            watch_reports_changes,
            pty_processes,
            metrics_report_usage,
            annotations_set_get_remove,
            annotations_readable_while_paused_or_stopped,
            annotations_are_out_of_reach_of_sandboxed_code,
            fork_copies_annotations,
            annotation_bounds_are_refused_with_nothing_changed,
            concurrent_annotation_updates_lose_nothing,
            stop_ends_processes_keeps_files_and_start_runs_again,
            stop_pauses_the_lease,
            preview_tokens_are_bounded_and_never_reach_the_sandbox,
            file_urls_move_one_file_outside_the_sandbox,
        );
        $crate::conformance_tests!(@client_cases $make;
            check_create_evaluates_without_allocating,
            leases_report_their_bounds_and_refuse_zero,
            exits_are_data_and_checked_runs_keep_the_output,
            fork_adds_envs_over_the_sources,
            references_reopen_or_say_what_became_of_them,
            references_to_a_sandbox_whose_lease_ended_are_destroyed,
            reopen_never_resumes_or_extends,
        );
    };
    (@client_cases $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let backend: std::sync::Arc<dyn $crate::sandcove::Backend> = $make.await;
                $crate::$case($crate::sandcove::Client::new(backend)).await;
            }
        )*
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let backend: std::sync::Arc<dyn $crate::sandcove::Backend> = $make.await;
                $crate::$case(&*backend).await;
            }
        )*
    };
}

/// Options for a test sandbox: a bounded lease so a failed test cleans up after itself (long
/// enough for a slow case on a loaded machine), and a label so tests running in parallel can
/// tell their sandboxes apart.
pub fn test_options(label: &str) -> CreateOptions {
    let mut options = CreateOptions::default();
    options.timeout = Some(Duration::from_secs(600));
    options.labels = BTreeMap::from([("conformance".to_string(), label.to_string())]);
    options
}

/// The names directly inside `dir` of a sandbox, in the backend's order.
pub async fn names_in(backend: &dyn Backend, id: &str, dir: &str) -> Vec<String> {
    let mut options = ListDirOptions::default();
    options.depth = 1;
    backend
        .list_dir(id, dir, options)
        .await
        .expect("list the directory")
        .into_iter()
        .map(|e| e.name)
        .collect()
}

/// A client of a fresh loopback server (`127.0.0.1:0`, a random key) serving `engine`: the
/// way every suite runs its cases "over HTTP". The server task belongs to the calling test's
/// runtime and ends with it.
pub async fn served(engine: std::sync::Arc<dyn Backend>) -> sandcove::HttpBackend {
    let key = unique("key");
    let server = sandcove::server::LocalServer::start(
        engine,
        sandcove::server::ServerConfig::new(key.clone()),
    )
    .await
    .expect("start the server");
    let client = sandcove::HttpBackend::connect(&server.url(), &key)
        .await
        .expect("connect to the server");
    // Dropping the handle would stop the server; the runtime's end stops it instead.
    std::mem::forget(server);
    client
}

/// A random-enough token for labels and markers.
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        sandcove::random_id(20)
    )
}

/// Point this whole program at a `sandcove serve` that cannot be reached (`SANDCOVE_URL` on a
/// loopback port nothing listens on, a placeholder key) and check the core's view of it:
/// capabilities never observed, and a create needing volumes checks as
/// [`CheckStatus::Unavailable`](sandcove::CheckStatus) saying it "cannot reach" the server, never
/// as unsupported. The facades' unreachable-runtime tests start here and then check their own
/// errors. It sets the process environment: call it from a test binary's only test, before
/// anything reads the runtime.
pub async fn unreachable_runtime() -> sandcove::Client {
    // A port the kernel chose, released at once: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port();
    std::env::set_var(
        sandcove::client::URL_ENV,
        format!("http://127.0.0.1:{port}"),
    );
    std::env::set_var(sandcove::client::API_KEY_ENV, "unused-key");
    let client = sandcove::Client::from_env().expect("a client (nothing sent yet)");
    assert_eq!(client.capabilities().observed_at, None, "never observed");
    let mut options = CreateOptions::default();
    options.volumes.push(VolumeMount::new("data", "/data"));
    match client
        .check_create(&options)
        .await
        .expect("a check answers")
    {
        sandcove::CheckStatus::Unavailable { reason, .. } => {
            assert!(reason.contains("cannot reach"), "{reason}")
        }
        other => panic!("unreachable server: {other:?}"),
    }
    client
}

async fn create(backend: &dyn Backend, label: &str) -> String {
    backend
        .create(test_options(label))
        .await
        .unwrap_or_else(|e| panic!("create a sandbox: {e}"))
        .id
}

/// Run a shell script to completion.
pub async fn sh(backend: &dyn Backend, id: &str, script: &str) -> Output {
    run(backend, id, ProcessSpec::new(Command::sh(script))).await
}

/// Run a spec to completion, panicking on errors.
pub async fn run(backend: &dyn Backend, id: &str, spec: ProcessSpec) -> Output {
    let shown = format!("{:?}", spec.command);
    let stream = backend
        .spawn(id, spec)
        .await
        .unwrap_or_else(|e| panic!("spawn {shown}: {e}"));
    collect(stream, usize::MAX)
        .await
        .unwrap_or_else(|e| panic!("collect {shown}: {e}"))
}

fn bytes_stream(data: Vec<u8>) -> ByteStream {
    Box::pin(futures::stream::once(async move { Ok(data) }))
}

async fn write(backend: &dyn Backend, id: &str, path: &str, data: &[u8]) {
    backend
        .write_file(
            id,
            path,
            bytes_stream(data.to_vec()),
            WriteOptions::default(),
        )
        .await
        .unwrap_or_else(|e| panic!("write {path}: {e}"));
}

/// Read a whole file of sandbox `id` through the file API, its chunks joined.
pub async fn read(backend: &dyn Backend, id: &str, path: &str) -> sandcove::Result<Vec<u8>> {
    let mut stream = backend.read_file(id, path, Default::default()).await?;
    let mut out = Vec::new();
    while let Some(chunk) = stream.next().await {
        out.extend_from_slice(&chunk?);
    }
    Ok(out)
}

fn expect_code<T: std::fmt::Debug>(result: sandcove::Result<T>, code: ErrorCode, what: &str) {
    match result {
        Err(e) if e.code() == code => {}
        other => panic!("{what}: expected {code:?}, got {other:?}"),
    }
}

/// Say loudly that part of `case` does not apply to this backend, and why.
fn skipped(case: &str, why: &str) {
    eprintln!("SKIPPED: {case}: {why}");
}

/// Where processes of sandbox `id` see the sandbox root: `""` on an isolated backend. Without
/// isolation they see the host directory standing for it, found here from `pwd` in the home
/// (which must end with `home`); path checks then compare beneath it, and say so loudly.
async fn process_root(backend: &dyn Backend, id: &str, home: &str, case: &str) -> String {
    if backend.capabilities().isolated {
        return String::new();
    }
    let pwd = sh(backend, id, "pwd").await.stdout_lossy();
    let root = pwd
        .strip_suffix(&format!("{home}\n"))
        .filter(|root| root.starts_with('/'))
        .unwrap_or_else(|| panic!("un-isolated, pwd {pwd:?} is not a host path ending in {home}"))
        .to_string();
    skipped(
        case,
        &format!("un-isolated processes see host paths: sandbox paths are checked beneath {root}"),
    );
    root
}

/// Pids of the host processes whose `argv[0]` is exactly `name` (as `exec -a NAME` sets it).
///
/// Exact, never a substring: a script that merely mentions a marker (and every short-lived
/// shell forked while it runs, such as the one `/etc/profile` starts for `$(id -u)`) is not
/// counted. Zombies are left out: they are dead, only not yet reaped.
pub fn host_processes_named(name: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                return false;
            };
            let argv0 = cmdline.split(|b| *b == 0).next().unwrap_or_default();
            argv0 == name.as_bytes() && !is_zombie(*pid)
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// How many host processes are named exactly `name` (see [`host_processes_named`]).
pub fn host_process_count(name: &str) -> usize {
    host_processes_named(name).len()
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let after = s.rfind(')')?;
            s[after + 1..].split_whitespace().next().map(|st| st == "Z")
        })
        .unwrap_or(false)
}

/// How long a condition may take to come true: generous, because a loaded 2-core machine
/// running many suites at once can delay any single step by seconds.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// Poll `check` until it returns `Ok`, or panic once `limit` has passed.
///
/// The last evaluation *is* the assertion: the value returned is the one `check` observed
/// when it succeeded (never a recount), and the panic names `what` and the last `Err` seen.
/// The one waiting helper of every suite; use it instead of sleeping for a condition.
///
/// ```no_run
/// # async fn demo(marker: &str) {
/// use sandcove_conformance::{equals, eventually, host_process_count, PATIENCE};
/// let n = eventually(PATIENCE, "two sleepers run", || async {
///     equals(host_process_count(marker), 2)
/// })
/// .await;
/// assert_eq!(n, 2);
/// # }
/// ```
pub async fn eventually<T, E, F, Fut>(limit: Duration, what: &str, mut check: F) -> T
where
    E: std::fmt::Debug,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let start = Instant::now();
    loop {
        let last = match check().await {
            Ok(value) => return value,
            Err(e) => e,
        };
        if start.elapsed() >= limit {
            panic!("{what}: not true after {limit:?}; last seen: {last:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `Ok(seen)` when `seen == wanted`, else an `Err` naming both: the usual [`eventually`] check.
pub fn equals<T: PartialEq + std::fmt::Debug>(seen: T, wanted: T) -> Result<T, String> {
    if seen == wanted {
        Ok(seen)
    } else {
        Err(format!("{seen:?}, wanted {wanted:?}"))
    }
}

/// Returns once the clock has passed the millisecond it was called in. Creation times are
/// milliseconds and listings order ties by id, so a test that asserts a creation order waits
/// on this between creates (a warm create can take less than a millisecond).
pub async fn next_millisecond() {
    let now = sandcove::now_millis();
    eventually(
        Duration::from_secs(5),
        "the clock passes a millisecond",
        || async { holds(sandcove::now_millis() > now, now) },
    )
    .await;
}

/// `Ok(())` when `ok`, else an `Err` carrying `seen` (what was observed instead).
pub fn holds<S: std::fmt::Debug>(ok: bool, seen: S) -> Result<(), S> {
    if ok {
        Ok(())
    } else {
        Err(seen)
    }
}

// ---------------------------------------------------------------------------------------------
// Lifecycle
// ---------------------------------------------------------------------------------------------

/// Read stdout until `pred` holds on everything seen so far (or [`PATIENCE`] passes).
async fn read_until(
    stream: &mut sandcove::ProcessStream,
    seen: &mut Vec<u8>,
    pred: impl Fn(&str) -> bool,
) {
    let deadline = Instant::now() + PATIENCE;
    while !pred(&String::from_utf8_lossy(seen)) {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.events.next()).await {
            Ok(Some(Ok(ProcessEvent::Stdout(b)))) => seen.extend(b),
            Ok(Some(Ok(_))) => {}
            other => panic!(
                "waiting for output, got {other:?}; saw {:?}",
                String::from_utf8_lossy(seen)
            ),
        }
    }
}

/// Ids of the live sandboxes carrying the conformance label `label`.
async fn ids_labelled(backend: &dyn Backend, label: &str) -> Vec<String> {
    let mut filter = ListOptions::default();
    filter.labels = BTreeMap::from([("conformance".to_string(), label.to_string())]);
    let listed = backend.list(filter).await.expect("list");
    listed.into_iter().map(|i| i.id).collect()
}

/// What a caller can observe of a fresh sandbox, from inside and out, with its id and name
/// replaced by placeholders.
async fn fresh_view(
    backend: &dyn Backend,
    options: CreateOptions,
    lease: Duration,
) -> (String, sandcove::SandboxInfo) {
    let asked_name = options.name.clone().expect("the case names its sandboxes");
    let before = sandcove::now_millis();
    let info = backend.create(options).await.expect("create");
    let after = sandcove::now_millis();
    let id = info.id.clone();
    // The lease and the creation time start at this create, not when a pool made it.
    assert!(
        (before..=after).contains(&info.created_at),
        "created_at {} outside the create call [{before}, {after}]",
        info.created_at
    );
    assert_eq!(info.ends_at - info.created_at, lease.as_millis() as u64);
    assert_eq!(info.name.as_deref(), Some(asked_name.as_str()));
    assert_eq!(info.state, SandboxState::Running);
    let got = backend.get(&id).await.expect("get");
    assert_eq!(
        (got.created_at, got.ends_at),
        (info.created_at, info.ends_at)
    );
    assert_eq!(got.envs, info.envs);
    let listed = backend
        .list(ListOptions::default())
        .await
        .expect("list")
        .into_iter()
        .filter(|s| s.id == id)
        .count();
    assert_eq!(listed, 1, "listed once");
    // Nothing ran in it before this caller.
    assert_eq!(
        backend.list_processes(&id).await.expect("processes"),
        vec![],
        "a fresh sandbox has run nothing"
    );
    let script = "id -un; id -u; id -g; id -Gn; echo \"$HOME\"; pwd; hostname; \
                  echo --; printenv | sort; \
                  echo --; ls -A /tmp /var/tmp /workspace /dev/shm 2>&1; \
                  echo --; cat /etc/passwd /etc/group /etc/hostname /etc/hosts; \
                  echo --; for p in /proc/[0-9]*; do read -r c < $p/comm; echo \"$c\"; done; \
                  echo --; ulimit -a; umask; \
                  echo --; ls -la / /workspace | awk '{print $1, $3, $4, $NF}'; \
                  echo --; ls -lan /home \"$HOME\" | awk '{print $1, $3, $4, $NF}'; \
                  echo --; tail -n +3 /proc/net/dev | cut -d: -f1 | sort";
    let out = sh(backend, &id, script).await;
    assert_eq!(out.exit_code(), 0, "{}", out.stderr_lossy());
    let hostname: String = id.chars().take(12).collect();
    let view = out
        .stdout_lossy()
        .replace(&id, "<id>")
        .replace(&hostname, "<hostname>")
        .replace(&asked_name, "<name>");
    let mut info = got;
    info.id = "<id>".into();
    info.name = Some("<name>".into());
    info.created_at = 0;
    info.ends_at = 0;
    backend.destroy(&id).await.expect("destroy");
    (view, info)
}

/// A loopback port that was free on the host a moment ago (the kernel's choice, so parallel
/// runs do not pick the same one).
fn free_host_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

mod annotations;
mod client;
mod file_urls;
mod files;
pub mod images;
mod isolation;
mod lifecycle;
mod observe;
mod pause;
mod preview_tokens;
mod previews;
mod processes;
mod references;
mod snapshots;
mod stop_start;
mod warm_pool;

pub use self::annotations::*;
pub use self::client::*;
pub use self::file_urls::*;
pub use self::files::*;
pub use self::isolation::*;
pub use self::lifecycle::*;
pub use self::observe::*;
pub use self::pause::*;
pub use self::preview_tokens::*;
pub use self::previews::*;
pub use self::processes::*;
pub use self::references::*;
pub use self::snapshots::*;
pub use self::stop_start::*;
pub use self::warm_pool::*;
