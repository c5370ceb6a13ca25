//! The conformance suite: behaviour every [`Backend`] must show, as `pub async fn` cases.
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
//! sandcove::conformance_tests!(async {
//!     std::sync::Arc::new(sandcove::LocalBackend::new().unwrap()) as std::sync::Arc<dyn sandcove::Backend>
//! });
//! ```

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt;

use crate::client::collect;
use crate::{
    AnnotationUpdate, Backend, ByteStream, Command, CopyOptions, CreateOptions, ErrorCode,
    FileKind, FsEventKind, ListDirOptions, ListOptions, MkdirOptions, Output, PreviewOptions,
    ProcessEvent, ProcessSelector, ProcessSpec, PtySize, ReadOptions, RemoveOptions, RenameOptions,
    RestartPolicy, SandboxState, Signal, StatOptions, TimeoutAction, VolumeMount, WatchOptions,
    WriteOptions,
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
                let backend: std::sync::Arc<dyn $crate::Backend> = $make.await;
                $crate::conformance::$case($crate::Client::new(backend)).await;
            }
        )*
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let backend: std::sync::Arc<dyn $crate::Backend> = $make.await;
                $crate::conformance::$case(&*backend).await;
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
#[cfg(all(feature = "server", feature = "http"))]
pub async fn served(engine: std::sync::Arc<dyn Backend>) -> crate::HttpBackend {
    let key = unique("key");
    let server =
        crate::server::LocalServer::start(engine, crate::server::ServerConfig::new(key.clone()))
            .await
            .expect("start the server");
    let client = crate::HttpBackend::connect(&server.url(), &key)
        .await
        .expect("connect to the server");
    // Dropping the handle would stop the server; the runtime's end stops it instead.
    std::mem::forget(server);
    client
}

/// A random-enough token for labels and markers.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}-{}", std::process::id(), crate::random_id(20))
}

/// Point this whole program at a `sandcove serve` that cannot be reached (`SANDCOVE_URL` on a
/// loopback port nothing listens on, a placeholder key) and check the core's view of it:
/// capabilities never observed, and a create needing volumes checks as
/// [`CheckStatus::Unavailable`](crate::CheckStatus) saying it "cannot reach" the server, never
/// as unsupported. The facades' unreachable-runtime tests start here and then check their own
/// errors. It sets the process environment: call it from a test binary's only test, before
/// anything reads the runtime.
pub async fn unreachable_runtime() -> crate::Client {
    // A port the kernel chose, released at once: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port();
    std::env::set_var(crate::client::URL_ENV, format!("http://127.0.0.1:{port}"));
    std::env::set_var(crate::client::API_KEY_ENV, "unused-key");
    let client = crate::Client::from_env().expect("a client (nothing sent yet)");
    assert_eq!(client.capabilities().observed_at, None, "never observed");
    let mut options = CreateOptions::default();
    options.volumes.push(VolumeMount::new("data", "/data"));
    match client
        .check_create(&options)
        .await
        .expect("a check answers")
    {
        crate::CheckStatus::Unavailable { reason, .. } => {
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
pub async fn read(backend: &dyn Backend, id: &str, path: &str) -> crate::Result<Vec<u8>> {
    let mut stream = backend.read_file(id, path, Default::default()).await?;
    let mut out = Vec::new();
    while let Some(chunk) = stream.next().await {
        out.extend_from_slice(&chunk?);
    }
    Ok(out)
}

fn expect_code<T: std::fmt::Debug>(result: crate::Result<T>, code: ErrorCode, what: &str) {
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
/// use sandcove::conformance::{equals, eventually, host_process_count, PATIENCE};
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
    let now = crate::now_millis();
    eventually(
        Duration::from_secs(5),
        "the clock passes a millisecond",
        || async { holds(crate::now_millis() > now, now) },
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

/// Create reports what was asked; get and list find it; destroy makes it gone everywhere.
pub async fn create_get_list_destroy(backend: &dyn Backend) {
    let label = unique("lifecycle");
    let mut options = test_options(&label);
    options.envs.insert("GREETING".into(), "hi".into());
    let info = backend.create(options).await.expect("create");
    assert_eq!(info.state, crate::SandboxState::Running);
    assert_eq!(info.labels.get("conformance"), Some(&label));
    assert!(
        info.ends_at > info.created_at,
        "the lease ends after creation"
    );
    let got = backend.get(&info.id).await.expect("get");
    assert_eq!(got.id, info.id);
    assert_eq!(got.envs.get("GREETING").map(String::as_str), Some("hi"));
    let mut filter = ListOptions::default();
    filter.labels = BTreeMap::from([("conformance".to_string(), label.clone())]);
    filter.states = vec![];
    filter.name = None;
    let listed = backend.list(filter.clone()).await.expect("list");
    assert_eq!(listed.iter().map(|i| &i.id).collect::<Vec<_>>(), [&info.id]);
    // Labels can be replaced, and list filters see the new ones.
    let mut relabeled = BTreeMap::from([("conformance".to_string(), label.clone())]);
    relabeled.insert("stage".into(), "two".into());
    let updated = backend
        .set_labels(&info.id, relabeled.clone())
        .await
        .expect("set labels");
    assert_eq!(updated.labels, relabeled);
    let mut by_new = filter.clone();
    by_new.labels.insert("stage".into(), "two".into());
    assert_eq!(backend.list(by_new).await.expect("list").len(), 1);
    assert_eq!(backend.get(&info.id).await.expect("get").labels, relabeled);
    expect_code(
        backend
            .set_labels(&info.id, BTreeMap::from([(String::new(), "x".to_string())]))
            .await,
        ErrorCode::InvalidArgument,
        "an empty label key",
    );
    let mut other = ListOptions::default();
    other.labels = BTreeMap::from([("conformance".to_string(), "no-such-label".to_string())]);
    other.states = vec![];
    other.name = None;
    assert!(backend
        .list(other)
        .await
        .expect("list")
        .iter()
        .all(|i| i.id != info.id));
    backend.destroy(&info.id).await.expect("destroy");
    expect_code(
        backend.get(&info.id).await,
        ErrorCode::NotFound,
        "get after destroy",
    );
    assert!(backend.list(filter).await.expect("list").is_empty());
    expect_code(
        backend.destroy(&info.id).await,
        ErrorCode::NotFound,
        "destroy twice",
    );
}

/// Options for a sandbox named `name`, labelled `label`.
fn named(label: &str, name: &str) -> CreateOptions {
    let mut options = test_options(label);
    options.name = Some(name.to_string());
    options
}

/// Ids of the live sandboxes carrying the conformance label `label`.
async fn ids_labelled(backend: &dyn Backend, label: &str) -> Vec<String> {
    let mut filter = ListOptions::default();
    filter.labels = BTreeMap::from([("conformance".to_string(), label.to_string())]);
    let listed = backend.list(filter).await.expect("list");
    listed.into_iter().map(|i| i.id).collect()
}

/// A name is unique among live sandboxes: a taken name is `AlreadyExists` and creates
/// nothing, a sandbox is found by name, a fork does not inherit its source's name, and the
/// name is free again once its sandbox is destroyed.
pub async fn unique_names(backend: &dyn Backend) {
    let label = unique("names");
    let name = unique("n");
    for bad in [
        "",
        "-lead",
        ".hidden",
        "a/b",
        "sp ace",
        "nul\0",
        &"x".repeat(64),
    ] {
        expect_code(
            backend.create(named(&label, bad)).await,
            ErrorCode::InvalidArgument,
            &format!("the name {bad:?}"),
        );
    }
    assert!(
        ids_labelled(backend, &label).await.is_empty(),
        "a refused name creates nothing"
    );
    let first = backend
        .create(named(&label, &name))
        .await
        .expect("create with a name");
    assert_eq!(first.name.as_deref(), Some(name.as_str()));
    assert_eq!(
        backend.get(&first.id).await.expect("get").name.as_deref(),
        Some(name.as_str())
    );
    expect_code(
        backend.create(named(&label, &name)).await,
        ErrorCode::AlreadyExists,
        "a second create with a live sandbox's name",
    );
    assert_eq!(
        ids_labelled(backend, &label).await,
        std::slice::from_ref(&first.id),
        "the refused create made no sandbox"
    );
    // Get by name: the list filter answers that one sandbox, whatever other filters say.
    let by_name = |n: &str| {
        let mut options = ListOptions::default();
        options.name = Some(n.to_string());
        options
    };
    let found = backend.list(by_name(&name)).await.expect("list by name");
    assert_eq!(found.iter().map(|i| &i.id).collect::<Vec<_>>(), [&first.id]);
    assert!(backend
        .list(by_name(&unique("n")))
        .await
        .expect("list by a free name")
        .is_empty());
    // Names are case-sensitive: another case is another name.
    let upper = name.to_uppercase();
    let other = backend
        .create(named(&label, &upper))
        .await
        .expect("create with the name in upper case");
    assert_eq!(other.name.as_deref(), Some(upper.as_str()));
    let mut forked = None;
    if backend.capabilities().snapshots {
        expect_code(
            backend.fork(&first.id, named(&label, &name)).await,
            ErrorCode::AlreadyExists,
            "a fork taking its source's name",
        );
        let fork = backend
            .fork(&first.id, test_options(&label))
            .await
            .expect("fork");
        assert_eq!(fork.name, None, "a fork does not inherit the name");
        forked = Some(fork.id);
    }
    backend.destroy(&first.id).await.expect("destroy");
    assert!(backend
        .list(by_name(&name))
        .await
        .expect("list by name")
        .is_empty());
    let again = backend
        .create(named(&label, &name))
        .await
        .expect("the name is free once its sandbox is destroyed");
    assert_eq!(again.name.as_deref(), Some(name.as_str()));
    assert_ne!(again.id, first.id);
    for id in [again.id, other.id].into_iter().chain(forked) {
        backend.destroy(&id).await.expect("destroy");
    }
}

/// Creates racing for one name: exactly one wins, the others are `AlreadyExists` and
/// create nothing.
pub async fn concurrent_creates_with_one_name(backend: &dyn Backend) {
    const RACERS: usize = 8;
    let label = unique("race");
    let name = unique("n");
    let results =
        futures::future::join_all((0..RACERS).map(|_| backend.create(named(&label, &name)))).await;
    let mut winners = Vec::new();
    for result in results {
        match result {
            Ok(info) => winners.push(info.id),
            Err(e) if e.code() == ErrorCode::AlreadyExists => {}
            Err(e) => panic!("a racing create failed otherwise: {e}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one create wins: {winners:?}");
    assert_eq!(
        ids_labelled(backend, &label).await,
        winners,
        "the losers created nothing"
    );
    backend.destroy(&winners[0]).await.expect("destroy");
}

/// Unknown and malformed ids are `NotFound` for every call.
pub async fn missing_sandbox_is_not_found(backend: &dyn Backend) {
    for id in ["nosuchsandbox0000000", "../etc", "", "UPPER"] {
        expect_code(backend.get(id).await, ErrorCode::NotFound, "get");
        expect_code(backend.destroy(id).await, ErrorCode::NotFound, "destroy");
        expect_code(
            backend
                .spawn(id, ProcessSpec::new(Command::argv(["true"])))
                .await
                .map(|_| ()),
            ErrorCode::NotFound,
            "spawn",
        );
        expect_code(
            backend.stat(id, "/", Default::default()).await,
            ErrorCode::NotFound,
            "stat",
        );
    }
}

/// `set_timeout` moves the end of the lease to "now + timeout".
pub async fn set_timeout_moves_the_lease(backend: &dyn Backend) {
    let id = create(backend, &unique("lease")).await;
    let before = crate::now_millis();
    let info = backend
        .set_timeout(&id, Duration::from_secs(600))
        .await
        .expect("set_timeout");
    assert!(
        info.ends_at >= before + 599_000 && info.ends_at <= crate::now_millis() + 601_000,
        "ends_at {} not ~600s from now",
        info.ends_at
    );
    assert_eq!(backend.get(&id).await.expect("get").ends_at, info.ends_at);
    expect_code(
        backend
            .set_timeout(&id, Duration::from_secs(10 * 365 * 24 * 3600))
            .await,
        ErrorCode::InvalidArgument,
        "absurd timeout",
    );
    backend.destroy(&id).await.expect("destroy");
}

/// At the end of its lease a sandbox is gone: not found, its processes ended on the host.
pub async fn lease_end_destroys_the_sandbox(backend: &dyn Backend) {
    let id = create(backend, &unique("expire")).await;
    let marker = unique("expiring");
    let spec = ProcessSpec::new(Command::bash_login(format!("exec -a {marker} sleep 600")));
    let _stream = backend.spawn(&id, spec).await.expect("spawn");
    let marker = &marker;
    eventually(PATIENCE, "the sleeping process runs", || async move {
        equals(host_process_count(marker), 1)
    })
    .await;
    // Shorten the lease only now: however slow the machine, the process was seen first.
    backend
        .set_timeout(&id, Duration::from_secs(1))
        .await
        .expect("set_timeout");
    // The lease is what is tested here: wait for its end, then for the sandbox to be gone.
    let err = eventually(PATIENCE, "the sandbox ends with its lease", || async {
        match backend.get(&id).await {
            Ok(info) => Err(format!("still {:?}", info.state)),
            Err(e) => Ok(e),
        }
    })
    .await;
    assert!(err.is_not_found(), "not found after its lease: {err}");
    eventually(
        PATIENCE,
        "no process of the expired sandbox is left on the host",
        || async move { equals(host_process_count(marker), 0) },
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// Processes
// ---------------------------------------------------------------------------------------------

/// Argv runs without a shell; shell scripts run through the named shell.
pub async fn argv_and_shell_commands(backend: &dyn Backend) {
    let id = create(backend, &unique("exec")).await;
    let out = run(
        backend,
        &id,
        ProcessSpec::new(Command::argv(["echo", "a b", "$HOME"])),
    )
    .await;
    assert_eq!(out.stdout, b"a b $HOME\n", "argv is not shell-interpreted");
    assert!(out.exit_status().success());
    let out = sh(backend, &id, "echo one | tr a-z A-Z; echo two").await;
    assert_eq!(out.stdout, b"ONE\ntwo\n");
    let out = run(
        backend,
        &id,
        ProcessSpec::new(Command::bash_login(
            "echo $0; shopt -q login_shell && echo login",
        )),
    )
    .await;
    assert_eq!(out.stdout_lossy(), "/bin/bash\nlogin\n");
    backend.destroy(&id).await.expect("destroy");
}

/// Exit codes come back; stderr is separate from stdout.
pub async fn exit_codes_and_stderr(backend: &dyn Backend) {
    let id = create(backend, &unique("exit")).await;
    let out = sh(backend, &id, "echo out; echo err >&2; exit 3").await;
    assert_eq!(out.stdout, b"out\n");
    assert_eq!(out.stderr, b"err\n");
    assert_eq!(out.exit_status().code, Some(3));
    assert!(!out.truncated);
    let out = sh(backend, &id, "kill -TERM $$").await;
    assert_eq!(out.exit_status().signal, Some(libc::SIGTERM));
    assert_eq!(out.exit_code(), 128 + libc::SIGTERM);
    backend.destroy(&id).await.expect("destroy");
}

/// NUL bytes and invalid UTF-8 arrive exactly as written.
pub async fn output_is_binary_safe(backend: &dyn Backend) {
    let id = create(backend, &unique("binary")).await;
    let out = sh(
        backend,
        &id,
        r"printf 'a\000b\377\303\050c'; printf '\000' >&2",
    )
    .await;
    assert_eq!(out.stdout, [b'a', 0, b'b', 0xff, 0xc3, 0x28, b'c']);
    assert_eq!(out.stderr, [0]);
    backend.destroy(&id).await.expect("destroy");
}

/// 10 MB of output arrive complete and in order.
pub async fn large_output_streams_without_loss(backend: &dyn Backend) {
    let id = create(backend, &unique("bigout")).await;
    let n = 10 * 1024 * 1024;
    let out = sh(
        backend,
        &id,
        &format!("seq 1 2000000 | head -c {n}; echo done >&2"),
    )
    .await;
    assert_eq!(out.stdout.len(), n, "every byte arrives");
    let expected: Vec<u8> = (1..=2_000_000u32)
        .flat_map(|i| format!("{i}\n").into_bytes())
        .take(n)
        .collect();
    assert!(out.stdout == expected, "bytes arrive in order, unchanged");
    assert_eq!(out.stderr, b"done\n");
    backend.destroy(&id).await.expect("destroy");
}

/// Sandbox envs reach every process; a process's own value wins.
pub async fn sandbox_and_process_envs(backend: &dyn Backend) {
    let mut options = test_options(&unique("envs"));
    options.envs.insert("SHARED".into(), "sandbox".into());
    options.envs.insert("OVERRIDE".into(), "sandbox".into());
    let id = backend.create(options).await.expect("create").id;
    let spec = ProcessSpec::new(Command::sh("echo $SHARED $OVERRIDE $ONLY"))
        .env("OVERRIDE", "process")
        .env("ONLY", "x y");
    assert_eq!(
        run(backend, &id, spec).await.stdout,
        b"sandbox process x y\n"
    );
    backend.destroy(&id).await.expect("destroy");
    let mut bad = test_options("bad-env");
    bad.envs.insert("A=B".into(), "x".into());
    expect_code(
        backend.create(bad).await,
        ErrorCode::InvalidArgument,
        "create with an invalid env name",
    );
}

/// Empty argv, NUL bytes and bad env names are refused before anything runs.
pub async fn bad_process_input_is_refused(backend: &dyn Backend) {
    let id = create(backend, &unique("badinput")).await;
    let cases = [
        ProcessSpec::new(Command::Argv(vec![])),
        ProcessSpec::new(Command::argv([""])),
        ProcessSpec::new(Command::argv(["echo", "a\0b"])),
        ProcessSpec::new(Command::argv(["true"])).env("", "x"),
        ProcessSpec::new(Command::argv(["true"])).env("A=B", "x"),
        ProcessSpec::new(Command::argv(["true"])).env("NUL\0", "x"),
        ProcessSpec::new(Command::argv(["true"])).env("V", "a\0b"),
        ProcessSpec::new(Command::argv(["true"])).cwd("/tmp\0x"),
    ];
    for spec in cases {
        let shown = format!("{spec:?}");
        expect_code(
            backend.spawn(&id, spec).await.map(|_| ()),
            ErrorCode::InvalidArgument,
            &shown,
        );
    }
    assert!(
        backend.list_processes(&id).await.expect("list").is_empty(),
        "nothing was started"
    );
    backend.destroy(&id).await.expect("destroy");
}

/// A missing program is a `NotFound` error at once, not a hang or a 127.
pub async fn missing_binary_is_not_found(backend: &dyn Backend) {
    let id = create(backend, &unique("nobin")).await;
    let start = Instant::now();
    let result = backend
        .spawn(
            &id,
            ProcessSpec::new(Command::argv(["no-such-program-xyz"])),
        )
        .await;
    expect_code(
        result.map(|s| s.pid),
        ErrorCode::NotFound,
        "missing program",
    );
    // Generous for a loaded machine, yet far below a hang.
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "refused promptly"
    );
    backend.destroy(&id).await.expect("destroy");
}

/// The default cwd is the home; a cwd can be chosen; a missing one is `NotFound`.
pub async fn working_directory(backend: &dyn Backend) {
    let id = create(backend, &unique("cwd")).await;
    let root = process_root(backend, &id, "/workspace", "working_directory").await;
    assert_eq!(
        sh(backend, &id, "pwd").await.stdout_lossy(),
        format!("{root}/workspace\n")
    );
    let spec = ProcessSpec::new(Command::argv(["pwd"])).cwd("/tmp");
    assert_eq!(
        run(backend, &id, spec).await.stdout_lossy(),
        format!("{root}/tmp\n")
    );
    backend
        .mkdir(&id, "sub/dir", MkdirOptions::default())
        .await
        .expect("mkdir");
    let spec = ProcessSpec::new(Command::argv(["pwd"])).cwd("sub/dir");
    assert_eq!(
        run(backend, &id, spec).await.stdout_lossy(),
        format!("{root}/workspace/sub/dir\n"),
        "relative cwd resolves against the home"
    );
    let spec = ProcessSpec::new(Command::argv(["pwd"])).cwd("/no/such/dir");
    expect_code(
        backend.spawn(&id, spec).await.map(|s| s.pid),
        ErrorCode::NotFound,
        "missing cwd",
    );
    backend.destroy(&id).await.expect("destroy");
}

/// `whoami` prints the configured default user; HOME is the workspace.
pub async fn default_user_and_home(backend: &dyn Backend) {
    let id = create(backend, &unique("home")).await;
    let root = process_root(backend, &id, "/workspace", "default_user_and_home").await;
    if backend.capabilities().isolated {
        let out = sh(backend, &id, "whoami; echo $HOME; pwd").await;
        assert_eq!(out.stdout_lossy(), "user\n/workspace\n/workspace\n");
    } else {
        // Without a user namespace processes run as the host user that runs the sandbox's
        // agent (the engine's, or a Pod's): the uid the backend reports.
        skipped(
            "default_user_and_home",
            "un-isolated processes run as the host user: checking the uid, not the name",
        );
        let uid = backend.get(&id).await.expect("get").user.uid;
        let out = sh(backend, &id, "id -u; echo $HOME; pwd").await;
        assert_eq!(
            out.stdout_lossy(),
            format!("{uid}\n{root}/workspace\n{root}/workspace\n")
        );
    }
    backend.destroy(&id).await.expect("destroy");
    // A vendor-style user and home: both are what processes and file calls see.
    let mut options = test_options(&unique("user"));
    options.user = Some("alice".into());
    options.home = Some("/home/alice".into());
    let info = backend.create(options).await.expect("create");
    assert_eq!(info.user.name, "alice");
    assert_eq!(info.user.home, "/home/alice");
    let root = process_root(backend, &info.id, "/home/alice", "default_user_and_home").await;
    if backend.capabilities().isolated {
        let out = sh(backend, &info.id, "whoami; echo $HOME $USER; id -un; pwd").await;
        assert_eq!(
            out.stdout_lossy(),
            "alice\n/home/alice alice\nalice\n/home/alice\n"
        );
    } else {
        let out = sh(backend, &info.id, "echo $HOME $USER; pwd").await;
        assert_eq!(
            out.stdout_lossy(),
            format!("{root}/home/alice alice\n{root}/home/alice\n")
        );
    }
    write(backend, &info.id, "notes.txt", b"x").await;
    let stat = backend
        .stat(&info.id, "notes.txt", Default::default())
        .await
        .expect("stat");
    assert_eq!(stat.path, "/home/alice/notes.txt");
    assert_eq!(stat.owner, "alice");
    backend.destroy(&info.id).await.expect("destroy");
    for bad in ["relative", "/usr/x", "/", "/home/../etc"] {
        let mut options = test_options("bad-home");
        options.home = Some(bad.into());
        expect_code(
            backend.create(options).await,
            ErrorCode::InvalidArgument,
            bad,
        );
    }
}

/// Another user works where several uids are mappable, and is refused where not.
pub async fn running_as_another_user(backend: &dyn Backend) {
    let id = create(backend, &unique("root")).await;
    let spec = ProcessSpec::new(Command::sh("whoami; id -u")).user("root");
    if backend.capabilities().multiple_users {
        let out = run(backend, &id, spec).await;
        assert_eq!(out.stdout_lossy(), "root\n0\n");
        let out = sh(backend, &id, "id -u").await;
        assert_ne!(out.stdout_lossy(), "0\n", "the default user is not root");
    } else {
        expect_code(
            backend.spawn(&id, spec).await.map(|s| s.pid),
            ErrorCode::NotSupported,
            "run as root without multiple uids",
        );
    }
    let spec = ProcessSpec::new(Command::argv(["true"])).user("nosuchuser");
    let result = backend.spawn(&id, spec).await.map(|s| s.pid);
    assert!(
        matches!(&result, Err(e) if matches!(e.code(), ErrorCode::InvalidArgument | ErrorCode::NotSupported)),
        "unknown user: {result:?}"
    );
    backend.destroy(&id).await.expect("destroy");
}

/// Bytes written to stdin reach the process; closing stdin ends `cat`.
pub async fn stdin_write_and_close(backend: &dyn Backend) {
    let id = create(backend, &unique("stdin")).await;
    let spec = ProcessSpec::new(Command::argv(["cat"])).stdin(true);
    let stream = backend.spawn(&id, spec).await.expect("spawn");
    let sel = ProcessSelector::Pid(stream.pid);
    backend
        .write_stdin(&id, sel.clone(), b"hello \x00\xff".to_vec())
        .await
        .expect("write stdin");
    backend
        .write_stdin(&id, sel.clone(), b"world".to_vec())
        .await
        .expect("write stdin");
    backend.close_stdin(&id, sel.clone()).await.expect("close");
    let out = tokio::time::timeout(PATIENCE, collect(stream, usize::MAX))
        .await
        .expect("cat ends after stdin closes")
        .expect("collect");
    assert_eq!(out.stdout, b"hello \x00\xffworld");
    assert!(out.exit_status().success());
    // Without stdin enabled, the process reads EOF and writing is refused.
    let out = run(backend, &id, ProcessSpec::new(Command::argv(["cat"]))).await;
    assert!(out.stdout.is_empty() && out.exit_status().success());
    let stream = backend
        .spawn(&id, ProcessSpec::new(Command::argv(["sleep", "30"])))
        .await
        .expect("spawn");
    expect_code(
        backend
            .write_stdin(&id, ProcessSelector::Pid(stream.pid), b"x".to_vec())
            .await,
        ErrorCode::InvalidArgument,
        "stdin not enabled",
    );
    backend.destroy(&id).await.expect("destroy");
}

/// Signals reach the process group; a process killed mid-stream reports the signal and the
/// output it wrote before.
pub async fn signals_and_kill_mid_stream(backend: &dyn Backend) {
    let id = create(backend, &unique("signal")).await;
    let mut stream = backend
        .spawn(
            &id,
            ProcessSpec::new(Command::sh(
                "echo started; while true; do echo tick; sleep 0.05; done",
            )),
        )
        .await
        .expect("spawn");
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("tick") {
        match stream.events.next().await {
            Some(Ok(ProcessEvent::Stdout(b))) => seen.extend(b),
            other => panic!("expected output, got {other:?}"),
        }
    }
    backend
        .signal(&id, ProcessSelector::Pid(stream.pid), Signal::Kill)
        .await
        .expect("kill");
    let rest = collect(stream, usize::MAX).await.expect("collect");
    seen.extend(rest.stdout);
    assert!(seen.starts_with(b"started\ntick\n"));
    assert_eq!(rest.status.and_then(|s| s.signal), Some(libc::SIGKILL));
    // Signalling a finished process is NotFound.
    let out = sh(backend, &id, "true").await;
    expect_code(
        backend
            .signal(&id, ProcessSelector::Pid(out.pid), Signal::Term)
            .await,
        ErrorCode::NotFound,
        "signal a finished process",
    );
    backend.destroy(&id).await.expect("destroy");
}

/// A process timeout kills the whole group and says so.
pub async fn process_timeout_kills_the_group(backend: &dyn Backend) {
    let id = create(backend, &unique("ptimeout")).await;
    let start = Instant::now();
    // The background sleep names itself on stderr by pid and start time (field 22 of its
    // stat), so the check below finds exactly it: without isolation `ps` would show every
    // `sleep` on the host.
    let spec = ProcessSpec::new(Command::sh(
        "sleep 600 & echo \"$! $(cut -d' ' -f22 /proc/$!/stat)\" >&2; sleep 30; echo never",
    ))
    .timeout(Duration::from_millis(500));
    let out = run(backend, &id, spec).await;
    // The foreground sleep lasts 30 s: ending well before that is the kill, even on a loaded
    // machine. The background one outlasts the wait below, so only the kill ends it there.
    assert!(start.elapsed() < Duration::from_secs(25), "killed promptly");
    let status = out.exit_status();
    assert!(status.timed_out, "reported as a timeout: {status:?}");
    assert_eq!(status.signal, Some(libc::SIGKILL));
    assert!(out.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let (pid, started) = stderr
        .trim()
        .split_once(' ')
        .filter(|(pid, started)| pid.parse::<u32>().is_ok() && started.parse::<u64>().is_ok())
        .unwrap_or_else(|| panic!("the background sleep's pid and start: {stderr:?}"));
    // The orphaned background sleep is reaped by PID 1 on its own schedule: wait until no
    // process with its pid and start time is left.
    let check = format!("cut -d' ' -f22 /proc/{pid}/stat 2>/dev/null || true");
    let (check, id) = (&check, &id);
    eventually(PATIENCE, "the background sleep died too", || async move {
        let id = id.as_str();
        let left = sh(backend, id, check).await.stdout_lossy();
        holds(left.trim() != started, left)
    })
    .await;
    backend.destroy(id).await.expect("destroy");
}

/// Processes are listed with their tags; attaching replays retained output, then goes live.
pub async fn list_and_attach_processes(backend: &dyn Backend) {
    let id = create(backend, &unique("attach")).await;
    let spec = ProcessSpec::new(Command::sh("echo first; read line; echo got $line"))
        .tag("worker")
        .stdin(true);
    let first = backend.spawn(&id, spec.clone()).await.expect("spawn");
    let pid = first.pid;
    drop(first); // dropping a stream does not kill the process
    let listed = backend.list_processes(&id).await.expect("list");
    let entry = listed.iter().find(|p| p.pid == pid).expect("listed");
    assert_eq!(entry.tag.as_deref(), Some("worker"));
    assert!(entry.exit.is_none(), "still running");
    expect_code(
        backend.spawn(&id, spec).await.map(|s| s.pid),
        ErrorCode::AlreadyExists,
        "a second running process with the same tag",
    );
    let mut attached = backend
        .attach(&id, ProcessSelector::Tag("worker".into()))
        .await
        .expect("attach");
    assert_eq!(attached.pid, pid);
    // The first output, retained or (when the attach came first) live after the marker.
    let mut next = attached.events.next().await;
    if matches!(next, Some(Ok(ProcessEvent::Live))) {
        next = attached.events.next().await;
    }
    match next {
        Some(Ok(ProcessEvent::Stdout(b))) => assert_eq!(b, b"first\n"),
        other => panic!("expected the first output, got {other:?}"),
    }
    backend
        .write_stdin(&id, ProcessSelector::Tag("worker".into()), b"x\n".to_vec())
        .await
        .expect("stdin");
    let rest = collect(attached, usize::MAX).await.expect("collect");
    assert_eq!(rest.stdout, b"got x\n");
    // After exit, attach still replays the whole output and the status.
    let late = backend
        .attach(&id, ProcessSelector::Pid(pid))
        .await
        .expect("attach after exit");
    let out = collect(late, usize::MAX).await.expect("collect");
    assert_eq!(out.stdout, b"first\ngot x\n");
    let listed = backend.list_processes(&id).await.expect("list");
    let entry = listed.iter().find(|p| p.pid == pid).expect("still listed");
    assert!(entry.exit.is_some());
    assert!(
        entry.ended_at.is_some_and(|t| t >= entry.started_at),
        "an end time: {entry:?}"
    );
    assert!(out.exit_status().success());
    expect_code(
        backend
            .attach(&id, ProcessSelector::Pid(999_999))
            .await
            .map(|s| s.pid),
        ErrorCode::NotFound,
        "attach to an unknown pid",
    );
    backend.destroy(&id).await.expect("destroy");
}

/// The events of an attach up to its [`ProcessEvent::Live`] marker (which must come, and
/// promptly: it follows the retained history without waiting for the process).
async fn history_of(stream: &mut crate::ProcessStream) -> Vec<ProcessEvent> {
    let mut seen = Vec::new();
    loop {
        let next = tokio::time::timeout(PATIENCE, stream.events.next()).await;
        match next {
            Ok(Some(Ok(ProcessEvent::Live))) => return seen,
            Ok(Some(Ok(ProcessEvent::Exit(s)))) => panic!(
                "attach reached the exit {s:?} without a live marker after {}",
                summary(&seen)
            ),
            Ok(Some(Ok(ev))) => seen.push(ev),
            Ok(Some(Err(e))) => panic!("attach failed before its live marker: {e}"),
            Ok(None) => panic!("attach ended before its live marker"),
            Err(_) => panic!(
                "no live marker within {PATIENCE:?}; history so far: {}",
                summary(&seen)
            ),
        }
    }
}

/// A short description of a list of events (for messages; histories can be megabytes).
fn summary(events: &[ProcessEvent]) -> String {
    format!(
        "{} events, {} stdout bytes",
        events.len(),
        stdout_of(events).len()
    )
}

/// Stdout bytes of a list of events.
fn stdout_of(events: &[ProcessEvent]) -> Vec<u8> {
    events
        .iter()
        .filter_map(|e| match e {
            ProcessEvent::Stdout(b) => Some(b.as_slice()),
            _ => None,
        })
        .flatten()
        .copied()
        .collect()
}

/// Attach returns the retained history, then one `Live` marker, then live events; spawn never
/// emits the marker. "Logs so far" is exact whatever the load: megabytes of history all come
/// before the marker, and nothing written later does.
pub async fn attach_marks_where_live_output_starts(backend: &dyn Backend) {
    let id = create(backend, &unique("live")).await;
    // Spawn streams never carry the marker.
    let spawned = backend
        .spawn(&id, ProcessSpec::new(Command::sh("echo hi; echo oops >&2")))
        .await
        .expect("spawn");
    let events: Vec<_> = spawned.events.collect().await;
    assert!(
        events.iter().all(|e| !matches!(e, Ok(ProcessEvent::Live))),
        "spawn emitted a live marker: {events:?}"
    );
    // A process with a lot of history that then waits for input.
    let script = "head -c 3000000 /dev/zero | tr '\\0' a; echo; echo ready; read x; echo after $x";
    let spec = ProcessSpec::new(Command::sh(script))
        .tag("talker")
        .stdin(true);
    let pid = backend.spawn(&id, spec).await.expect("spawn").pid;
    let mut want = vec![b'a'; 3_000_000];
    want.extend_from_slice(b"\nready\n");
    let attached = eventually(PATIENCE, "the history ends with ready", || async {
        let mut stream = backend
            .attach(&id, ProcessSelector::Tag("talker".into()))
            .await
            .map_err(|e| e.to_string())?;
        let history = history_of(&mut stream).await;
        let out = stdout_of(&history);
        if out.ends_with(b"ready\n") {
            Ok(stream)
        } else {
            Err(format!("{} bytes so far", out.len()))
        }
    })
    .await;
    assert_eq!(attached.pid, pid);
    // The retained history was complete (checked once more on a fresh attach).
    let mut again = backend
        .attach(&id, ProcessSelector::Pid(pid))
        .await
        .expect("attach");
    let history = history_of(&mut again).await;
    assert_eq!(
        stdout_of(&history).len(),
        want.len(),
        "whole history before the marker"
    );
    assert!(stdout_of(&history) == want, "history bytes intact");
    drop(again);
    // After the marker: only what happens now.
    backend
        .write_stdin(&id, ProcessSelector::Pid(pid), b"x\n".to_vec())
        .await
        .expect("stdin");
    let live = collect(attached, usize::MAX).await.expect("live part");
    assert_eq!(live.stdout, b"after x\n", "live events follow the marker");
    assert!(live.exit_status().success());
    // After the exit: the whole history, the marker, then the exit.
    let mut late = backend
        .attach(&id, ProcessSelector::Pid(pid))
        .await
        .expect("attach after exit");
    let history = history_of(&mut late).await;
    want.extend_from_slice(b"after x\n");
    assert!(stdout_of(&history) == want, "full history after exit");
    let rest: Vec<_> = late.events.collect().await;
    assert!(
        matches!(rest.as_slice(), [Ok(ProcessEvent::Exit(s))] if s.success()),
        "only the exit after the marker: {rest:?}"
    );
    backend.destroy(&id).await.expect("destroy");
}

/// A restart policy brings a failing process back (up to its limit, as one logical process
/// with one final exit); success and API signals end it for good; attach by tag and by the
/// current pid reach the incarnation running now.
pub async fn restart_policy_restarts_failures(backend: &dyn Backend) {
    let id = create(backend, &unique("restart")).await;
    let policy = |max| {
        let mut policy = RestartPolicy::default();
        policy.max_restarts = max;
        policy
    };
    // Fails every time: 1 run + 2 restarts.
    let script = "n=$(cat $HOME/count 2>/dev/null || echo 0); n=$((n+1)); \
                  echo $n > $HOME/count; echo run $n; exit 3";
    let mut spec = ProcessSpec::new(Command::sh(script)).tag("flaky");
    spec.restart = Some(policy(Some(2)));
    let stream = backend.spawn(&id, spec).await.expect("spawn");
    let pid = stream.pid;
    let events: Vec<_> = stream
        .events
        .map(|e| e.expect("event"))
        .collect::<Vec<_>>()
        .await;
    assert_eq!(stdout_of(&events), b"run 1\nrun 2\nrun 3\n", "{events:?}");
    let restarts: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            ProcessEvent::Restarted {
                restarts, previous, ..
            } => Some((*restarts, previous.code)),
            _ => None,
        })
        .collect();
    assert_eq!(restarts, [(1, Some(3)), (2, Some(3))], "{events:?}");
    assert!(
        matches!(events.last(), Some(ProcessEvent::Exit(s)) if s.code == Some(3)),
        "one final exit, last: {events:?}"
    );
    let exits = events
        .iter()
        .filter(|e| matches!(e, ProcessEvent::Exit(_)))
        .count();
    assert_eq!(exits, 1, "one exit for the logical process");
    let info = backend
        .list_processes(&id)
        .await
        .expect("list")
        .into_iter()
        .find(|p| p.pid == pid)
        .expect("listed under its first pid");
    assert_eq!(info.restarts, 2);
    assert_eq!(info.restart, Some(policy(Some(2))));
    assert_ne!(info.current_pid, pid, "a later incarnation ran last");
    assert!(info.exit.is_some_and(|s| s.code == Some(3)));
    assert!(info.ended_at.is_some());
    // Attach replays the restarts in place.
    let mut late = backend
        .attach(&id, ProcessSelector::Tag("flaky".into()))
        .await
        .expect("attach");
    let history = history_of(&mut late).await;
    let shape: Vec<&str> = history
        .iter()
        .map(|e| match e {
            ProcessEvent::Stdout(_) => "out",
            ProcessEvent::Restarted { .. } => "restart",
            _ => "other",
        })
        .collect();
    assert_eq!(shape, ["out", "restart", "out", "restart", "out"]);

    // Success is not restarted.
    let mut spec = ProcessSpec::new(Command::sh("echo fine"));
    spec.restart = Some(policy(None));
    let out = run(backend, &id, spec).await;
    assert_eq!(out.stdout, b"fine\n");
    assert!(out.exit_status().success());

    // First incarnation fails, the second stays up: tag and current pid reach it, and a
    // signal through the API ends it for good (unlimited restarts notwithstanding).
    let script = "if [ -e $HOME/second ]; then echo second; exec sleep 1000; fi; \
                  touch $HOME/second; echo first; exit 1";
    let mut spec = ProcessSpec::new(Command::sh(script)).tag("phoenix");
    spec.restart = Some(policy(None));
    let pid = backend.spawn(&id, spec).await.expect("spawn").pid;
    let current = eventually(PATIENCE, "the second incarnation runs", || async {
        let list = backend
            .list_processes(&id)
            .await
            .map_err(|e| e.to_string())?;
        let p = list.iter().find(|p| p.pid == pid).ok_or("not listed")?;
        if p.restarts == 1 && p.exit.is_none() {
            Ok(p.current_pid)
        } else {
            Err(format!("{p:?}"))
        }
    })
    .await;
    assert_ne!(current, pid);
    let mut by_tag = backend
        .attach(&id, ProcessSelector::Tag("phoenix".into()))
        .await
        .expect("attach by tag");
    let history = eventually(PATIENCE, "the second incarnation wrote", || async {
        let mut s = backend
            .attach(&id, ProcessSelector::Pid(current))
            .await
            .map_err(|e| e.to_string())?;
        let h = history_of(&mut s).await;
        let out = stdout_of(&h);
        if out == b"first\nsecond\n" {
            Ok(h)
        } else {
            Err(String::from_utf8_lossy(&out).into_owned())
        }
    })
    .await;
    assert!(history.iter().any(
        |e| matches!(e, ProcessEvent::Restarted { pid: p, restarts: 1, .. } if *p == current)
    ));
    history_of(&mut by_tag).await;
    backend
        .signal(&id, ProcessSelector::Tag("phoenix".into()), Signal::Kill)
        .await
        .expect("kill");
    let rest = collect(by_tag, usize::MAX).await.expect("rest");
    assert_eq!(rest.exit_status().signal, Some(9), "{rest:?}");
    let info = backend
        .list_processes(&id)
        .await
        .expect("list")
        .into_iter()
        .find(|p| p.pid == pid)
        .expect("listed");
    assert_eq!(info.restarts, 1, "killed through the API: not restarted");
    assert!(info.exit.is_some());

    // A terminal belongs to one incarnation: refused.
    let mut spec = ProcessSpec::new(Command::argv(["true"]));
    spec.restart = Some(policy(None));
    spec.pty = Some(PtySize { cols: 80, rows: 24 });
    expect_code(
        backend.spawn(&id, spec).await.map(|s| s.pid),
        ErrorCode::InvalidArgument,
        "restart with a pty",
    );
    backend.destroy(&id).await.expect("destroy");
}

/// File calls as a user get that user's permissions and ownership; an unknown user is refused
/// before anything happens; where the sandbox has one uid, other users are `NotSupported`.
pub async fn file_calls_as_a_user(backend: &dyn Backend) {
    let id = create(backend, &unique("fileuser")).await;
    let info = backend.get(&id).await.expect("get");
    let me = info.user.name.clone();
    let read_as = |path: &'static str, user: &str| {
        let mut options = ReadOptions::default();
        options.user = Some(user.to_string());
        let id = id.clone();
        async move {
            let stream = backend.read_file(&id, path, options).await?;
            let chunks: Vec<_> = stream.collect().await;
            chunks
                .into_iter()
                .collect::<crate::Result<Vec<_>>>()
                .map(|c| c.concat())
        }
    };
    let write_as = |path: &'static str, data: &'static [u8], user: &str, mode: Option<u32>| {
        let mut options = WriteOptions::default();
        options.user = Some(user.to_string());
        options.mode = mode;
        let id = id.clone();
        async move {
            let body: ByteStream = Box::pin(futures::stream::iter([Ok(data.to_vec())]));
            backend.write_file(&id, path, body, options).await
        }
    };
    let list_as = |path: &'static str, user: &str| {
        let mut options = ListDirOptions::default();
        options.depth = 1;
        options.user = Some(user.to_string());
        let id = id.clone();
        async move { backend.list_dir(&id, path, options).await }
    };
    let stat_as = |path: &'static str, user: &str| {
        let mut options = StatOptions::default();
        options.user = Some(user.to_string());
        let id = id.clone();
        async move { backend.stat(&id, path, options).await }
    };
    // Unknown users: refused before any effect.
    let result = write_as("/workspace/ghost.txt", b"x", "nosuchuser", None).await;
    assert!(
        matches!(&result, Err(e) if matches!(e.code(), ErrorCode::InvalidArgument | ErrorCode::NotSupported)),
        "unknown user: {result:?}"
    );
    expect_code(
        backend
            .stat(&id, "/workspace/ghost.txt", StatOptions::default())
            .await,
        ErrorCode::NotFound,
        "nothing written for an unknown user",
    );
    // The default user by name works everywhere.
    let st = write_as("/workspace/mine.txt", b"mine", &me, None)
        .await
        .expect("write as the default user");
    assert_eq!((st.uid, st.owner.as_str()), (info.user.uid, me.as_str()));
    assert_eq!(
        read_as("/workspace/mine.txt", &me).await.expect("read"),
        b"mine"
    );
    assert_eq!(
        stat_as("/workspace/mine.txt", &me).await.expect("stat").uid,
        info.user.uid
    );
    list_as("/workspace", &me).await.expect("list");
    if !backend.capabilities().multiple_users {
        expect_code(
            read_as("/workspace/mine.txt", "root").await,
            ErrorCode::NotSupported,
            "a second user without multiple uids",
        );
        backend.destroy(&id).await.expect("destroy");
        return;
    }
    assert_ne!(info.user.uid, 0, "the default user is not root here");
    // A root-only file.
    let st = write_as("/workspace/secret", b"s3cret", "root", Some(0o600))
        .await
        .expect("write as root");
    assert_eq!((st.uid, st.mode), (0, 0o600), "owned by root: {st:?}");
    expect_code(
        read_as("/workspace/secret", &me).await,
        ErrorCode::PermissionDenied,
        "reading a root-only file as the user",
    );
    assert_eq!(
        read_as("/workspace/secret", "root")
            .await
            .expect("root reads"),
        b"s3cret"
    );
    // The user's identity never outlives its call: calls without a user, interleaved, keep
    // the file API's own identity.
    for round in 0..8 {
        expect_code(
            read_as("/workspace/secret", &me).await,
            ErrorCode::PermissionDenied,
            "as the user, again",
        );
        let stream = backend
            .read_file(&id, "/workspace/secret", ReadOptions::default())
            .await
            .unwrap_or_else(|e| panic!("round {round}: a call without a user failed: {e}"));
        let got: Vec<_> = stream.collect().await;
        assert!(
            matches!(got.as_slice(), [Ok(b)] if b == b"s3cret"),
            "round {round}: {got:?}"
        );
    }
    // Replacing it as the user is refused too, and leaves it as it was.
    expect_code(
        write_as("/workspace/secret", b"mine now", &me, None).await,
        ErrorCode::PermissionDenied,
        "overwriting a root-only file as the user",
    );
    assert_eq!(
        read_as("/workspace/secret", "root")
            .await
            .expect("root reads"),
        b"s3cret"
    );
    // A directory only root may enter.
    let mut dir = MkdirOptions::default();
    dir.parents = true;
    dir.mode = Some(0o700);
    dir.user = Some("root".into());
    backend
        .mkdir(&id, "/workspace/private", dir)
        .await
        .expect("mkdir as root");
    write_as("/workspace/private/inner.txt", b"in", "root", None)
        .await
        .expect("write inside as root");
    expect_code(
        list_as("/workspace/private", &me).await,
        ErrorCode::PermissionDenied,
        "listing a 0700 root directory as the user",
    );
    expect_code(
        stat_as("/workspace/private/inner.txt", &me).await,
        ErrorCode::PermissionDenied,
        "stat beneath a 0700 root directory as the user",
    );
    expect_code(
        write_as("/workspace/private/new.txt", b"n", &me, None).await,
        ErrorCode::PermissionDenied,
        "creating a file in a 0700 root directory as the user",
    );
    let names: Vec<_> = list_as("/workspace/private", "root")
        .await
        .expect("root lists")
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, ["inner.txt"], "nothing created by the refused write");
    // What the user creates is the user's, parents included.
    let st = write_as("/workspace/made/by/me.txt", b"x", &me, None)
        .await
        .expect("write with parents as the user");
    assert_eq!(st.uid, info.user.uid);
    let parent = backend
        .stat(&id, "/workspace/made/by", StatOptions::default())
        .await
        .expect("stat parent");
    assert_eq!(
        parent.uid, info.user.uid,
        "created parents belong to the user"
    );
    // Directories too: made as the user (the kernel checks the user's permissions), so none
    // appears where the user may not write, and the ones made are the user's.
    let mkdir_as = |path: &'static str, user: &str| {
        let mut options = MkdirOptions::default();
        options.user = Some(user.to_string());
        let id = id.clone();
        async move { backend.mkdir(&id, path, options).await }
    };
    expect_code(
        mkdir_as("/workspace/private/sub", &me).await,
        ErrorCode::PermissionDenied,
        "mkdir in a 0700 root directory as the user",
    );
    expect_code(
        mkdir_as("/workspace/private/a/b", &me).await,
        ErrorCode::PermissionDenied,
        "mkdir with parents in a 0700 root directory as the user",
    );
    let names: Vec<_> = list_as("/workspace/private", "root")
        .await
        .expect("root lists")
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(
        names,
        ["inner.txt"],
        "nothing created by the refused mkdirs"
    );
    let st = mkdir_as("/workspace/mydir/nested", &me)
        .await
        .expect("mkdir with parents as the user");
    assert_eq!((st.uid, st.owner.as_str()), (info.user.uid, me.as_str()));
    let parent = backend
        .stat(&id, "/workspace/mydir", StatOptions::default())
        .await
        .expect("stat the made parent");
    assert_eq!(parent.uid, info.user.uid, "made parents are the user's");
    // Removing as the user: refused where the user may not write, allowed in its own places.
    let remove_as = |path: &'static str, user: &str| {
        let mut options = RemoveOptions::default();
        options.recursive = true;
        options.user = Some(user.to_string());
        let id = id.clone();
        async move { backend.remove(&id, path, options).await }
    };
    expect_code(
        remove_as("/workspace/private/inner.txt", &me).await,
        ErrorCode::PermissionDenied,
        "removing from a 0700 root directory as the user",
    );
    backend
        .stat(&id, "/workspace/private/inner.txt", StatOptions::default())
        .await
        .expect("the refused remove left the file");
    remove_as("/workspace/mydir", &me)
        .await
        .expect("remove the user's own tree as the user");
    expect_code(
        backend
            .stat(&id, "/workspace/mydir", StatOptions::default())
            .await,
        ErrorCode::NotFound,
        "the user's tree is gone",
    );
    // Watching as the user: a directory the user may not read is refused, not watched blind.
    if backend.capabilities().watch {
        let watch_as = |path: &'static str, user: &str| {
            let mut options = WatchOptions::default();
            options.recursive = false;
            options.user = Some(user.to_string());
            let id = id.clone();
            async move { backend.watch(&id, path, options).await.map(drop) }
        };
        expect_code(
            watch_as("/workspace/private", &me).await,
            ErrorCode::PermissionDenied,
            "watching a 0700 root directory as the user",
        );
        watch_as("/workspace/made", &me)
            .await
            .expect("watch the user's own directory as the user");
        watch_as("/workspace/private", "root")
            .await
            .expect("root watches it");
    }
    // The processes agree: the same file is unreadable to the user's processes.
    let out = sh(backend, &id, "cat /workspace/secret").await;
    assert!(
        !out.exit_status().success(),
        "a user process cannot read it either"
    );
    backend.destroy(&id).await.expect("destroy");
}

// ---------------------------------------------------------------------------------------------
// Files
// ---------------------------------------------------------------------------------------------

/// Bytes written come back identical; stat reports kind, size, mode and owner.
pub async fn file_round_trip_and_metadata(backend: &dyn Backend) {
    let id = create(backend, &unique("files")).await;
    let data: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
    write(backend, &id, "data/blob.bin", &data).await;
    assert_eq!(
        read(backend, &id, "data/blob.bin").await.expect("read"),
        data
    );
    assert_eq!(
        read(backend, &id, "/workspace/data/blob.bin")
            .await
            .expect("read"),
        data,
        "relative paths resolve against the home"
    );
    let stat = backend
        .stat(&id, "data/blob.bin", Default::default())
        .await
        .expect("stat");
    assert_eq!(stat.kind, FileKind::File);
    assert_eq!(stat.size, 100_000);
    assert_eq!(stat.path, "/workspace/data/blob.bin");
    assert_eq!(stat.name, "blob.bin");
    let info = backend.get(&id).await.expect("get");
    assert_eq!(
        stat.owner, info.user.name,
        "files belong to the default user"
    );
    // The sandbox's processes see the same bytes.
    let out = sh(
        backend,
        &id,
        "wc -c < data/blob.bin; od -An -tu1 -j255 -N2 data/blob.bin",
    )
    .await;
    assert_eq!(
        out.stdout_lossy().split_whitespace().collect::<Vec<_>>(),
        ["100000", "255", "0"]
    );
    // Append, empty files, and chmod.
    backend
        .write_file(&id, "data/blob.bin", bytes_stream(b"tail".to_vec()), {
            let mut options = WriteOptions::default();
            options.append = true;
            options
        })
        .await
        .expect("append");
    assert_eq!(
        backend
            .stat(&id, "data/blob.bin", Default::default())
            .await
            .expect("stat")
            .size,
        100_004
    );
    write(backend, &id, "empty", b"").await;
    assert!(read(backend, &id, "empty").await.expect("read").is_empty());
    let stat = backend.chmod(&id, "empty", 0o640).await.expect("chmod");
    assert_eq!(stat.mode, 0o640);
    assert_eq!(sh(backend, &id, "stat -c %a empty").await.stdout, b"640\n");
    // Symlinks are reported, not followed.
    sh(backend, &id, "ln -s data/blob.bin link").await;
    let stat = backend
        .stat(&id, "link", Default::default())
        .await
        .expect("stat link");
    assert_eq!(stat.kind, FileKind::Symlink);
    assert_eq!(stat.symlink_target.as_deref(), Some("data/blob.bin"));
    backend.destroy(&id).await.expect("destroy");
}

/// A 50 MB file written in chunks reads back identical.
pub async fn large_file_round_trip(backend: &dyn Backend) {
    let id = create(backend, &unique("bigfile")).await;
    let size = 50 * 1024 * 1024;
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let data: Vec<u8> = (0..size)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    let chunks: Vec<crate::Result<Vec<u8>>> =
        data.chunks(3_000_001).map(|c| Ok(c.to_vec())).collect();
    let stream: ByteStream = Box::pin(futures::stream::iter(chunks));
    let stat = backend
        .write_file(&id, "/tmp/big.bin", stream, WriteOptions::default())
        .await
        .expect("write 50 MB");
    assert_eq!(stat.size, size as u64);
    let back = read(backend, &id, "/tmp/big.bin").await.expect("read");
    assert_eq!(back.len(), data.len());
    assert!(back == data, "50 MB read back identical");
    backend.destroy(&id).await.expect("destroy");
}

/// Byte bounds: a read over its `max_bytes` is `FileTooLarge` before any byte is sent, a
/// write over its bound is `FileTooLarge` with nothing kept (an existing file unchanged), and
/// the backend reports a real largest file.
pub async fn file_byte_bounds(backend: &dyn Backend) {
    let caps = backend.capabilities();
    assert!(
        caps.max_file_bytes < u64::MAX && caps.max_file_bytes >= crate::MAX_MEMORY_FILE_BYTES,
        "a real largest file is reported: {}",
        caps.max_file_bytes
    );
    let id = create(backend, &unique("bounds")).await;
    let two_mib = vec![b'z'; 2 << 20];
    write(backend, &id, "big.bin", &two_mib).await;
    let started = Instant::now();
    let refused = backend
        .read_file(&id, "big.bin", ReadOptions::default().max_bytes(1 << 20))
        .await;
    match refused {
        Err(crate::Error::FileTooLarge { limit, .. }) => assert_eq!(limit, 1 << 20),
        Err(e) => panic!("a read over its bound: expected FileTooLarge, got {e:?}"),
        Ok(_) => panic!("a read over its bound was served"),
    }
    assert!(started.elapsed() < PATIENCE, "refused promptly");
    let back = backend
        .read_file(&id, "big.bin", ReadOptions::default().max_bytes(2 << 20))
        .await
        .expect("a read at its bound");
    let chunks: Vec<_> = back.collect().await;
    let back: Vec<u8> = chunks
        .into_iter()
        .collect::<crate::Result<Vec<_>>>()
        .expect("read")
        .concat();
    assert!(back == two_mib, "a read at its bound is whole");
    // A write over its bound, in several chunks: refused, nothing kept.
    write(backend, &id, "kept.bin", b"original").await;
    for target in ["kept.bin", "new.bin"] {
        let chunks: Vec<crate::Result<Vec<u8>>> = (0..4).map(|_| Ok(vec![1u8; 400_000])).collect();
        let result = backend
            .write_file(
                &id,
                target,
                Box::pin(futures::stream::iter(chunks)),
                WriteOptions::default().max_bytes(1 << 20),
            )
            .await;
        expect_code(result, ErrorCode::FileTooLarge, "a write over its bound");
    }
    assert_eq!(
        names_in(backend, &id, "/workspace").await,
        ["big.bin", "kept.bin"],
        "nothing kept from refused writes"
    );
    assert_eq!(
        read(backend, &id, "kept.bin").await.expect("read"),
        b"original"
    );
    // At the bound exactly, a write lands.
    let stat = backend
        .write_file(
            &id,
            "exact.bin",
            bytes_stream(vec![2u8; 1 << 20]),
            WriteOptions::default().max_bytes(1 << 20),
        )
        .await
        .expect("a write at its bound");
    assert_eq!(stat.size, 1 << 20);
    backend.destroy(&id).await.expect("destroy");
}

/// `overwrite: false` on write, rename and copy: anything at the destination (a file, a
/// symlink) is refused with `AlreadyExists` and left as it was; concurrent no-clobber writes of
/// one new name have exactly one winner (the check is atomic, not a look before the act).
pub async fn no_clobber_writes_renames_and_copies(backend: &dyn Backend) {
    let id = create(backend, &unique("noclobber")).await;
    let keep = WriteOptions::default().overwrite(false);
    write(backend, &id, "a.txt", b"original").await;
    let result = backend
        .write_file(&id, "a.txt", bytes_stream(b"new".to_vec()), keep.clone())
        .await;
    expect_code(
        result,
        ErrorCode::AlreadyExists,
        "no-clobber write over a file",
    );
    let result = backend
        .write_file(
            &id,
            "a.txt",
            bytes_stream(b"new".to_vec()),
            keep.clone().append(true),
        )
        .await;
    expect_code(result, ErrorCode::AlreadyExists, "no-clobber append");
    assert_eq!(
        read(backend, &id, "a.txt").await.expect("read"),
        b"original"
    );
    // A symlink at the name is something there: not followed, not replaced.
    let out = sh(backend, &id, "ln -s /tmp/elsewhere \"$HOME/link\"").await;
    assert_eq!(out.exit_code(), 0, "{out:?}");
    let result = backend
        .write_file(&id, "link", bytes_stream(b"new".to_vec()), keep.clone())
        .await;
    expect_code(
        result,
        ErrorCode::AlreadyExists,
        "no-clobber write over a symlink",
    );
    expect_code(
        backend
            .stat(&id, "/tmp/elsewhere", StatOptions::default())
            .await,
        ErrorCode::NotFound,
        "the link's target was not created",
    );
    let stat = backend
        .write_file(
            &id,
            "fresh.txt",
            bytes_stream(b"fresh".to_vec()),
            keep.clone(),
        )
        .await
        .expect("no-clobber write of a new name");
    assert_eq!(stat.size, 5);
    // Eight no-clobber writes of one new name at once: exactly one lands (a look before
    // the landing would let several through).
    let racers = (0..8u8).map(|n| {
        // Paced chunks keep every upload open at once (the pauses shape the window in which
        // all eight have begun and none has landed; nothing waits on them).
        let chunks = futures::stream::iter(0..4).then(move |_| async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok(vec![n; 25_000])
        });
        backend.write_file(
            &id,
            "race.txt",
            Box::pin(chunks),
            WriteOptions::default().overwrite(false),
        )
    });
    let results = futures::future::join_all(racers).await;
    let won = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(won, 1, "exactly one no-clobber write wins: {results:?}");
    for r in results.iter().filter_map(|r| r.as_ref().err()) {
        assert_eq!(r.code(), ErrorCode::AlreadyExists, "the losers: {r}");
    }
    let data = read(backend, &id, "race.txt").await.expect("read");
    assert!(
        data.len() == 100_000 && data.iter().all(|b| *b == data[0]),
        "the winner's bytes, whole"
    );
    // Rename.
    write(backend, &id, "b.txt", b"bee").await;
    let result = backend
        .rename(
            &id,
            "b.txt",
            "a.txt",
            RenameOptions::default().overwrite(false),
        )
        .await;
    expect_code(result, ErrorCode::AlreadyExists, "no-clobber rename");
    assert_eq!(
        read(backend, &id, "a.txt").await.expect("read"),
        b"original"
    );
    assert_eq!(read(backend, &id, "b.txt").await.expect("read"), b"bee");
    backend
        .rename(
            &id,
            "b.txt",
            "c.txt",
            RenameOptions::default().overwrite(false),
        )
        .await
        .expect("no-clobber rename to a new name");
    // Copy.
    let result = backend
        .copy(
            &id,
            "c.txt",
            "a.txt",
            CopyOptions::default().overwrite(false),
        )
        .await;
    expect_code(result, ErrorCode::AlreadyExists, "no-clobber copy");
    assert_eq!(
        read(backend, &id, "a.txt").await.expect("read"),
        b"original"
    );
    backend
        .copy(&id, "c.txt", "a.txt", CopyOptions::default())
        .await
        .expect("an overwriting copy");
    assert_eq!(read(backend, &id, "a.txt").await.expect("read"), b"bee");
    assert_eq!(
        names_in(backend, &id, "/workspace").await,
        ["a.txt", "c.txt", "fresh.txt", "link", "race.txt"],
        "no temporary files left"
    );
    // A rename (and a copy) as a user acts as that user: a 0700 root directory is closed to
    // the default user, open to root.
    if backend.capabilities().multiple_users {
        let me = backend.get(&id).await.expect("get").user.name;
        let mut spec = ProcessSpec::new(Command::sh(
            "mkdir -p /srv/vault && touch /srv/vault/in && chmod 700 /srv/vault",
        ));
        spec.user = Some("root".into());
        let out = run(backend, &id, spec).await;
        assert_eq!(out.exit_code(), 0, "{out:?}");
        let as_me = RenameOptions::default().user(me.clone());
        expect_code(
            backend
                .rename(&id, "/srv/vault/in", "/tmp/out", as_me.clone())
                .await,
            ErrorCode::PermissionDenied,
            "a rename out of a root-only directory as the default user",
        );
        expect_code(
            backend
                .copy(
                    &id,
                    "/srv/vault/in",
                    "/tmp/out",
                    CopyOptions::default().user(me.clone()),
                )
                .await,
            ErrorCode::PermissionDenied,
            "a copy out of a root-only directory as the default user",
        );
        let st = backend
            .rename(
                &id,
                "/srv/vault/in",
                "/srv/vault/in2",
                RenameOptions::default().user("root"),
            )
            .await
            .expect("a rename as root");
        assert_eq!(st.path, "/srv/vault/in2");
    }
    backend.destroy(&id).await.expect("destroy");
}

/// `copy`: a file (content and mode), a tree (nested files, symlinks copied as links,
/// modes), refusals (a directory without `recursive`, a directory into itself, a missing
/// source) leaving nothing behind, and a copy as another user owned by that user.
pub async fn copy_files_and_trees(backend: &dyn Backend) {
    let id = create(backend, &unique("copy")).await;
    let setup = sh(
        backend,
        &id,
        "set -e; cd \"$HOME\"; mkdir -p src/deep/er; printf one > src/one.txt; \
         chmod 751 src/one.txt; printf two > src/deep/er/two.txt; chmod 700 src/deep; \
         ln -s ../one.txt src/deep/link; ln -s /etc/hostname src/abs; \
         head -c 3000000 /dev/urandom > src/big.bin",
    )
    .await;
    assert_eq!(setup.exit_code(), 0, "{setup:?}");
    let st = backend
        .copy(&id, "src/one.txt", "one-copy.txt", CopyOptions::default())
        .await
        .expect("copy a file");
    assert_eq!((st.kind, st.mode, st.size), (FileKind::File, 0o751, 3));
    assert_eq!(
        read(backend, &id, "one-copy.txt").await.expect("read"),
        b"one"
    );
    expect_code(
        backend
            .copy(&id, "src", "dst", CopyOptions::default())
            .await,
        ErrorCode::InvalidArgument,
        "a directory without recursive",
    );
    expect_code(
        backend
            .copy(&id, "nope", "dst", CopyOptions::default().recursive(true))
            .await,
        ErrorCode::NotFound,
        "a missing source",
    );
    expect_code(
        backend
            .copy(
                &id,
                "src",
                "src/deep/inner",
                CopyOptions::default().recursive(true),
            )
            .await,
        ErrorCode::InvalidArgument,
        "a directory into itself",
    );
    let st = backend
        .copy(&id, "src", "dst", CopyOptions::default().recursive(true))
        .await
        .expect("copy a tree");
    assert_eq!(st.kind, FileKind::Dir);
    let check = sh(
        backend,
        &id,
        "cd \"$HOME\"; cmp src/big.bin dst/big.bin && cat dst/deep/er/two.txt && \
         readlink dst/deep/link && readlink dst/abs && stat -c %a dst/deep dst/one.txt && \
         ls -A dst && ls -A dst/deep",
    )
    .await;
    assert_eq!(
        check.stdout_lossy(),
        "two../one.txt\n/etc/hostname\n700\n751\nabs\nbig.bin\ndeep\none.txt\ner\nlink\n",
        "the tree copied: {check:?}"
    );
    assert_eq!(
        names_in(backend, &id, "/workspace").await,
        ["dst", "one-copy.txt", "src"],
        "no temporary entries left by the refused copies"
    );
    // Overwriting merges into an existing directory and replaces its files.
    write(backend, &id, "dst/one.txt", b"changed").await;
    write(backend, &id, "dst/extra.txt", b"extra").await;
    backend
        .copy(&id, "src", "dst", CopyOptions::default().recursive(true))
        .await
        .expect("merge a tree");
    assert_eq!(
        read(backend, &id, "dst/one.txt").await.expect("read"),
        b"one"
    );
    assert_eq!(
        read(backend, &id, "dst/extra.txt").await.expect("read"),
        b"extra"
    );
    if backend.capabilities().multiple_users {
        let st = backend
            .copy(
                &id,
                "src/one.txt",
                "/tmp/as-root.txt",
                CopyOptions::default().user("root"),
            )
            .await
            .expect("copy as root");
        assert_eq!((st.uid, st.owner.as_str()), (0, "root"));
        let info = backend.get(&id).await.expect("get");
        let st = backend
            .copy(&id, "src/one.txt", "/tmp/as-me.txt", CopyOptions::default())
            .await
            .expect("copy as the default");
        assert_eq!(st.uid, info.user.uid, "a copy belongs to the acting user");
    }
    backend.destroy(&id).await.expect("destroy");
}

/// `exists` says `false` only for a path that is not there (missing, or under a file); a
/// sandbox that is gone is an error, never `false`.
pub async fn exists_tells_missing_from_unknown(backend: &dyn Backend) {
    let id = create(backend, &unique("exists")).await;
    let exists =
        |path: &'static str| crate::client::exists(backend, &id, path, StatOptions::default());
    write(backend, &id, "file", b"x").await;
    assert!(exists("file").await.expect("exists"));
    assert!(!exists("nope").await.expect("a missing path"));
    assert!(
        !exists("file/under").await.expect("a path under a file"),
        "a path under a file is not there"
    );
    expect_code(
        backend
            .stat(&id, "file/under", StatOptions::default())
            .await,
        ErrorCode::NotFound,
        "stat under a file",
    );
    if backend.capabilities().multiple_users {
        let info = backend.get(&id).await.expect("get");
        let mut spec = ProcessSpec::new(Command::sh(
            "mkdir -p /srv/closed && touch /srv/closed/x && chmod 700 /srv/closed",
        ));
        spec.user = Some("root".into());
        let out = run(backend, &id, spec).await;
        assert_eq!(out.exit_code(), 0, "{out:?}");
        let as_me = StatOptions::default().user(info.user.name.clone());
        let result = crate::client::exists(backend, &id, "/srv/closed/x", as_me).await;
        expect_code(
            result,
            ErrorCode::PermissionDenied,
            "a path the user cannot search",
        );
    }
    backend.destroy(&id).await.expect("destroy");
    let gone = crate::client::exists(backend, &id, "file", StatOptions::default()).await;
    expect_code(
        gone,
        ErrorCode::NotFound,
        "a destroyed sandbox is not 'no such file'",
    );
    let gone = crate::client::exists(backend, &id, "nope", StatOptions::default()).await;
    assert!(gone.is_err(), "a destroyed sandbox: {gone:?}");
}

/// mkdir (with parents), list with depth, rename, remove (recursive), exists.
pub async fn directory_operations(backend: &dyn Backend) {
    let id = create(backend, &unique("dirs")).await;
    backend
        .mkdir(&id, "a/b/c", MkdirOptions::default())
        .await
        .expect("mkdir -p");
    write(backend, &id, "a/top.txt", b"1").await;
    write(backend, &id, "a/b/mid.txt", b"22").await;
    write(backend, &id, "a/b/c/deep.txt", b"333").await;
    let names = |entries: Vec<crate::FileStat>| -> Vec<String> {
        entries.into_iter().map(|e| e.path).collect()
    };
    let one = backend
        .list_dir(&id, "a", {
            let mut options = ListDirOptions::default();
            options.depth = 1;
            options.user = None;
            options
        })
        .await
        .expect("list");
    assert_eq!(names(one), ["/workspace/a/b", "/workspace/a/top.txt"]);
    let all = names(
        backend
            .list_dir(&id, "a", {
                let mut options = ListDirOptions::default();
                options.depth = 3;
                options.user = None;
                options
            })
            .await
            .expect("list"),
    );
    for p in [
        "/workspace/a/b/c",
        "/workspace/a/b/mid.txt",
        "/workspace/a/b/c/deep.txt",
    ] {
        assert!(all.contains(&p.to_string()), "{p} in {all:?}");
    }
    expect_code(
        backend
            .mkdir(&id, "a/b", {
                let mut options = MkdirOptions::default();
                options.parents = false;
                options
            })
            .await,
        ErrorCode::AlreadyExists,
        "mkdir of an existing dir without parents",
    );
    backend
        .rename(&id, "a/top.txt", "a/moved.txt", Default::default())
        .await
        .expect("rename");
    assert!(backend
        .stat(&id, "a/top.txt", Default::default())
        .await
        .is_err());
    assert_eq!(read(backend, &id, "a/moved.txt").await.expect("read"), b"1");
    expect_code(
        backend
            .remove(&id, "a", {
                let mut options = RemoveOptions::default();
                options.recursive = false;
                options
            })
            .await,
        ErrorCode::InvalidArgument,
        "non-recursive remove of a non-empty dir",
    );
    backend
        .remove(&id, "a", {
            let mut options = RemoveOptions::default();
            options.recursive = true;
            options
        })
        .await
        .expect("remove -r");
    expect_code(
        backend.stat(&id, "a", Default::default()).await,
        ErrorCode::NotFound,
        "removed",
    );
    assert_eq!(
        sh(backend, &id, "ls -A \"$HOME\" | wc -l").await.stdout,
        b"0\n"
    );
    backend.destroy(&id).await.expect("destroy");
}

/// Missing files, directories read as files and bad paths give typed errors.
pub async fn file_errors_are_typed(backend: &dyn Backend) {
    let id = create(backend, &unique("fileerr")).await;
    expect_code(
        read(backend, &id, "nope.txt").await,
        ErrorCode::NotFound,
        "read missing",
    );
    expect_code(
        read(backend, &id, "/tmp").await,
        ErrorCode::InvalidArgument,
        "read a dir",
    );
    expect_code(
        read(backend, &id, "a\0b").await,
        ErrorCode::InvalidArgument,
        "NUL path",
    );
    expect_code(
        read(backend, &id, "").await,
        ErrorCode::InvalidArgument,
        "empty path",
    );
    expect_code(
        backend
            .list_dir(&id, "nope", ListDirOptions::default())
            .await,
        ErrorCode::NotFound,
        "list missing",
    );
    write(backend, &id, "file", b"x").await;
    expect_code(
        backend
            .list_dir(&id, "file", ListDirOptions::default())
            .await,
        ErrorCode::InvalidArgument,
        "list a file",
    );
    expect_code(
        backend
            .write_file(
                &id,
                "/tmp",
                bytes_stream(b"x".to_vec()),
                WriteOptions::default(),
            )
            .await,
        ErrorCode::InvalidArgument,
        "write over a directory",
    );
    expect_code(
        backend.remove(&id, "nope", RemoveOptions::default()).await,
        ErrorCode::NotFound,
        "remove missing",
    );
    // A data stream that fails part-way: the write fails promptly, nothing is left behind,
    // and the sandbox keeps working.
    let failing: ByteStream = Box::pin(futures::stream::iter(vec![
        Ok(vec![7u8; 300_000]),
        Err(crate::Error::invalid("the source broke")),
    ]));
    let result = tokio::time::timeout(
        PATIENCE,
        backend.write_file(&id, "partial.bin", failing, WriteOptions::default()),
    )
    .await
    .expect("an aborted upload returns promptly");
    assert!(result.is_err(), "an aborted upload is an error: {result:?}");
    let leftover = sh(backend, &id, "ls -A \"$HOME\"").await.stdout_lossy();
    assert_eq!(leftover, "file\n", "no partial or temporary file is left");
    assert_eq!(sh(backend, &id, "echo alive").await.stdout, b"alive\n");
    backend.destroy(&id).await.expect("destroy");
}

/// An upload whose source fails part-way leaves nothing behind, and the cleanup is finished
/// by the time the error is returned: a listing made at once shows no temporary file, over
/// new and existing targets, many times over.
pub async fn failed_uploads_leave_nothing_behind(backend: &dyn Backend) {
    let id = create(backend, &unique("debris")).await;
    write(backend, &id, "kept.bin", b"original").await;
    for round in 0..30 {
        let target = if round % 2 == 0 {
            "kept.bin"
        } else {
            "new.bin"
        };
        let failing: ByteStream = Box::pin(futures::stream::iter(vec![
            Ok(vec![round as u8; 200_000]),
            Ok(vec![round as u8; 200_000]),
            Err(crate::Error::invalid("the source broke")),
        ]));
        let result = tokio::time::timeout(
            Duration::from_secs(20),
            backend.write_file(&id, target, failing, WriteOptions::default()),
        )
        .await
        .expect("an aborted upload returns promptly");
        assert!(
            result.is_err(),
            "round {round}: an aborted upload is an error"
        );
        let names = names_in(backend, &id, "/workspace").await;
        assert_eq!(
            names,
            ["kept.bin"],
            "round {round}: debris after a failed upload"
        );
    }
    assert_eq!(
        read(backend, &id, "kept.bin").await.expect("read"),
        b"original",
        "a failed overwrite leaves the old content"
    );
    backend.destroy(&id).await.expect("destroy");
}

/// `..` chains and symlinks pointing out never reach host files.
pub async fn file_api_cannot_escape(backend: &dyn Backend) {
    let id = create(backend, &unique("escape")).await;
    let marker = unique("escape-marker");
    let host_target = std::env::temp_dir().join(&marker);
    // A `..` chain resolves inside the sandbox.
    let path = format!("../../../../../../..{}", host_target.display());
    write(backend, &id, &path, b"inside").await;
    assert!(!host_target.exists(), "a `..` write created a host file");
    assert_eq!(
        read(backend, &id, &host_target.to_string_lossy())
            .await
            .expect("read"),
        b"inside",
        "it landed inside the sandbox"
    );
    // A symlink to a host-only file does not reach it.
    let host_only = std::env::current_dir().expect("cwd").join("Cargo.toml");
    if host_only.exists() {
        sh(
            backend,
            &id,
            &format!("ln -s {} hostlink", host_only.display()),
        )
        .await;
        expect_code(
            read(backend, &id, "hostlink").await,
            ErrorCode::NotFound,
            "host-only file",
        );
    }
    // An absolute symlink to /etc/passwd: reads the sandbox's own, writes fail, the host's
    // file is untouched.
    let host_passwd = std::fs::read("/etc/passwd").unwrap_or_default();
    sh(backend, &id, "ln -s /etc/passwd pw").await;
    let isolated = backend.capabilities().isolated;
    let result = read(backend, &id, "pw").await;
    if isolated {
        let inside = result.expect("read through symlink");
        assert_ne!(inside, host_passwd, "the sandbox has its own user database");
    } else {
        // The link resolves beneath the host directory standing for the sandbox root, which
        // holds no system directories: there is no /etc/passwd to read.
        skipped(
            "file_api_cannot_escape",
            "un-isolated, the sandbox root has no /etc: the link leads nowhere",
        );
        expect_code(
            result,
            ErrorCode::NotFound,
            "read through a symlink into /etc",
        );
    }
    let result = backend
        .write_file(
            &id,
            "pw",
            bytes_stream(b"owned\n".to_vec()),
            WriteOptions::default(),
        )
        .await;
    expect_code(
        result,
        if isolated {
            ErrorCode::PermissionDenied
        } else {
            ErrorCode::NotFound
        },
        "write through a symlink into /etc",
    );
    assert_eq!(
        std::fs::read("/etc/passwd").unwrap_or_default(),
        host_passwd
    );
    let result = backend
        .write_file(
            &id,
            "/etc/passwd",
            bytes_stream(b"owned\n".to_vec()),
            WriteOptions::default(),
        )
        .await;
    if isolated {
        assert!(result.is_err(), "writing /etc/passwd in the sandbox fails");
    } else {
        // Un-isolated, /etc in the sandbox root is an ordinary directory of that root.
        result.expect("write /etc/passwd beneath the sandbox root");
        assert_eq!(
            read(backend, &id, "/etc/passwd").await.expect("read"),
            b"owned\n"
        );
    }
    assert_eq!(
        std::fs::read("/etc/passwd").unwrap_or_default(),
        host_passwd
    );
    backend.destroy(&id).await.expect("destroy");
}

/// Host system directories are read-only inside the sandbox.
pub async fn system_directories_are_read_only(backend: &dyn Backend) {
    let id = create(backend, &unique("ro")).await;
    let isolated = backend.capabilities().isolated;
    if isolated {
        let out = sh(
            backend,
            &id,
            "touch /usr/x 2>&1; echo $?; touch /etc/x 2>&1; echo $?",
        )
        .await;
        let text = out.stdout_lossy();
        assert!(
            !text.contains("\n0\n") && !text.starts_with("0\n"),
            "{text}"
        );
    } else {
        // Never tried: un-isolated processes write wherever the host user may.
        skipped(
            "system_directories_are_read_only",
            "un-isolated processes see the host's system directories as the host user does",
        );
    }
    let result = backend
        .write_file(
            &id,
            "/usr/x",
            bytes_stream(b"x".to_vec()),
            WriteOptions::default(),
        )
        .await;
    if isolated {
        expect_code(result, ErrorCode::PermissionDenied, "write under /usr");
    } else {
        // The file API works beneath the host directory standing for the sandbox root,
        // where /usr is an ordinary directory: the write lands there, never in the host's.
        result.expect("write /usr/x beneath the sandbox root");
        assert_eq!(read(backend, &id, "/usr/x").await.expect("read"), b"x");
    }
    assert!(!std::path::Path::new("/usr/x").exists());
    // /tmp and the home are writable (un-isolated: the sandbox's, beneath its host root).
    let root = process_root(
        backend,
        &id,
        "/workspace",
        "system_directories_are_read_only",
    )
    .await;
    assert!(sh(backend, &id, &format!("touch {root}/tmp/x ~/y"))
        .await
        .exit_status()
        .success());
    backend.destroy(&id).await.expect("destroy");
}

/// Destroy ends every process of the sandbox, background ones included.
pub async fn destroy_ends_background_processes(backend: &dyn Backend) {
    let id = create(backend, &unique("bgkill")).await;
    let marker = unique("bg");
    for _ in 0..3 {
        let spec = ProcessSpec::new(Command::bash_login(format!(
            "(exec -a {marker} sleep 600) & exec -a {marker} sleep 600"
        )));
        drop(backend.spawn(&id, spec).await.expect("spawn"));
    }
    let marker = &marker;
    eventually(PATIENCE, "six sleepers run", || async move {
        equals(host_process_count(marker), 6)
    })
    .await;
    backend.destroy(&id).await.expect("destroy");
    eventually(
        PATIENCE,
        "no process of the destroyed sandbox is left on the host",
        || async move { equals(host_process_count(marker), 0) },
    )
    .await;
}

/// The process and open-file limits apply inside.
pub async fn limits_are_applied(backend: &dyn Backend) {
    let mut options = test_options(&unique("limits"));
    options.resources.max_processes = Some(300);
    options.resources.max_open_files = Some(512);
    let process_limit = backend.capabilities().process_limit;
    if !process_limit {
        expect_code(
            backend.create(options.clone()).await,
            ErrorCode::NotSupported,
            "a process limit the backend cannot enforce",
        );
        options.resources.max_processes = None;
    }
    let id = backend.create(options).await.expect("create").id;
    let out = run(
        backend,
        &id,
        ProcessSpec::new(Command::bash_login("ulimit -u; ulimit -n")),
    )
    .await;
    let out = out.stdout_lossy();
    if process_limit {
        assert_eq!(out, "300\n512\n");
    } else {
        assert_eq!(out.lines().nth(1), Some("512"), "open files: {out:?}");
    }
    backend.destroy(&id).await.expect("destroy");
}

/// Inside, `ps` shows only the sandbox's own processes.
pub async fn sandbox_sees_only_its_own_processes(backend: &dyn Backend) {
    let id = create(backend, &unique("pidns")).await;
    if backend.capabilities().isolated {
        let out = sh(backend, &id, "ls /proc | grep -c '^[0-9]*$'").await;
        let count: u32 = out.stdout_lossy().trim().parse().unwrap_or(999);
        assert!(count <= 4, "sandbox sees {count} processes");
        let out = sh(backend, &id, "cat /proc/1/comm").await;
        assert_eq!(out.stdout_lossy().trim(), "sandcove-agent");
    } else {
        skipped(
            "sandbox_sees_only_its_own_processes",
            "un-isolated processes share the host's process table",
        );
    }
    backend.destroy(&id).await.expect("destroy");
}

// ---------------------------------------------------------------------------------------------
// Lifecycle beyond create/destroy (pause, leases, previews, snapshots, volumes, watch, pty)
// ---------------------------------------------------------------------------------------------

/// Read stdout until `pred` holds on everything seen so far (or [`PATIENCE`] passes).
async fn read_until(
    stream: &mut crate::ProcessStream,
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

/// A counter loop stops printing while paused and continues from where it stopped.
pub async fn pause_stops_and_resume_continues(backend: &dyn Backend) {
    let id = create(backend, &unique("pause")).await;
    let spec = ProcessSpec::new(Command::sh(
        "i=0; while true; do echo $i; i=$((i+1)); sleep 0.02; done",
    ));
    if !backend.capabilities().pause {
        expect_code(backend.pause(&id).await, ErrorCode::NotSupported, "pause");
        backend.destroy(&id).await.expect("destroy");
        return;
    }
    let mut stream = backend.spawn(&id, spec).await.expect("spawn");
    let mut seen = Vec::new();
    read_until(&mut stream, &mut seen, |s| s.lines().count() >= 5).await;
    let info = backend.pause(&id).await.expect("pause");
    assert_eq!(info.state, SandboxState::Paused);
    assert_eq!(
        backend.get(&id).await.expect("get").state,
        SandboxState::Paused
    );
    // Whatever was in flight arrives; then silence. Time is the subject here: output written
    // before the pause may still be relayed, so drain until a full second passes without any
    // (bounded), then a further second must stay silent.
    let drain_until = Instant::now() + PATIENCE;
    while let Ok(next) = tokio::time::timeout(Duration::from_secs(1), stream.events.next()).await {
        match next {
            Some(Ok(ProcessEvent::Stdout(b))) => seen.extend(b),
            other => panic!("expected output or silence while paused, got {other:?}"),
        }
        assert!(
            Instant::now() < drain_until,
            "output never stops while paused"
        );
    }
    let quiet = tokio::time::timeout(Duration::from_secs(1), stream.events.next()).await;
    assert!(quiet.is_err(), "no output while paused, got {quiet:?}");
    expect_code(
        backend
            .spawn(&id, ProcessSpec::new(Command::argv(["true"])))
            .await
            .map(|s| s.pid),
        ErrorCode::InvalidState,
        "exec in a paused sandbox",
    );
    let last: u64 = String::from_utf8_lossy(&seen)
        .lines()
        .last()
        .and_then(|l| l.parse().ok())
        .expect("a number");
    let info = backend.resume(&id).await.expect("resume");
    assert_eq!(info.state, SandboxState::Running);
    read_until(&mut stream, &mut seen, |s| {
        s.lines().count() as u64 > last + 5
    })
    .await;
    let numbers: Vec<u64> = String::from_utf8_lossy(&seen)
        .lines()
        .filter_map(|l| l.parse().ok())
        .collect();
    assert!(
        numbers.windows(2).all(|w| w[1] == w[0] + 1),
        "the counter continues where it stopped: {numbers:?}"
    );
    backend.destroy(&id).await.expect("destroy");
}

/// `on_timeout: Pause` pauses instead of destroying; resuming starts a new lease.
pub async fn lease_end_can_pause(backend: &dyn Backend) {
    let mut options = test_options(&unique("leasepause"));
    options.on_timeout = TimeoutAction::Pause;
    if !backend.capabilities().pause {
        expect_code(
            backend.create(options).await,
            ErrorCode::NotSupported,
            "a lease that pauses without pause",
        );
        return;
    }
    let id = backend.create(options).await.expect("create").id;
    sh(backend, &id, "echo kept > /workspace/f").await;
    // A short lease only once the file is written, so a slow machine cannot pause it first.
    backend
        .set_timeout(&id, Duration::from_secs(1))
        .await
        .expect("set_timeout");
    eventually(PATIENCE, "paused at the end of the lease", || async {
        let state = backend.get(&id).await.map(|i| i.state);
        holds(matches!(state, Ok(SandboxState::Paused)), state)
    })
    .await;
    let info = backend.resume(&id).await.expect("resume");
    assert!(info.ends_at > crate::now_millis(), "a new lease");
    assert_eq!(sh(backend, &id, "cat /workspace/f").await.stdout, b"kept\n");
    backend.destroy(&id).await.expect("destroy");
}

/// A sandbox created with `auto_resume` resumes when work arrives.
pub async fn auto_resume_on_request(backend: &dyn Backend) {
    let mut options = test_options(&unique("autoresume"));
    options.auto_resume = true;
    if !backend.capabilities().pause {
        expect_code(
            backend.create(options).await,
            ErrorCode::NotSupported,
            "auto_resume without pause",
        );
        return;
    }
    let id = backend.create(options).await.expect("create").id;
    backend.pause(&id).await.expect("pause");
    assert_eq!(sh(backend, &id, "echo awake").await.stdout, b"awake\n");
    assert_eq!(
        backend.get(&id).await.expect("get").state,
        SandboxState::Running
    );
    backend.destroy(&id).await.expect("destroy");
}

/// A raw HTTP/1.1 GET: `(status, body)`; `None` when the connection is refused.
pub async fn http_get(host: &str, target: &str, headers: &[(&str, &str)]) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(host).await.ok()?;
    let mut request = format!("GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    for (k, v) in headers {
        request.push_str(&format!("{k}: {v}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = Vec::new();
    tokio::time::timeout(PATIENCE, stream.read_to_end(&mut response))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text.split(' ').nth(1)?.parse().ok()?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((status, body))
}

async fn start_http_server(backend: &dyn Backend, id: &str, port: u16, text: &str) {
    write(
        backend,
        id,
        &format!("/tmp/www{port}/index.html"),
        text.as_bytes(),
    )
    .await;
    let spec = ProcessSpec::new(Command::argv([
        "python3",
        "-m",
        "http.server",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
    ]))
    .cwd(format!("/tmp/www{port}"));
    drop(backend.spawn(id, spec).await.expect("start a server"));
    let probe = format!(
        "for i in $(seq 600); do python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}))' 2>/dev/null && exit 0; sleep 0.1; done; exit 1"
    );
    assert!(
        sh(backend, id, &probe).await.exit_status().success(),
        "server on {port} is up"
    );
}

/// A loopback port that was free on the host a moment ago (the kernel's choice, so parallel
/// runs do not pick the same one).
fn free_host_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// A server in the sandbox answers through its preview URL; private previews need a live
/// token; sandboxes using the same port do not clash.
pub async fn previews_serve_and_guard_private_ports(backend: &dyn Backend) {
    let id = create(backend, &unique("preview")).await;
    // Un-isolated sandboxes share the host's network: each server needs a port free on the
    // host, and two cannot both serve the same one.
    let isolated = backend.capabilities().isolated;
    let port = if isolated { 8000 } else { free_host_port() };
    let mut options = PreviewOptions::default();
    options.port = port;
    options.token_header = "X-Test-Token".into();
    options.token_query = "test_token".into();
    if !backend.capabilities().previews {
        expect_code(
            backend.expose_port(&id, options).await,
            ErrorCode::NotSupported,
            "expose",
        );
        backend.destroy(&id).await.expect("destroy");
        return;
    }
    start_http_server(backend, &id, port, "hello from the sandbox").await;
    let private = backend.expose_port(&id, options).await.expect("expose");
    assert!(
        private.url.starts_with("http://127.0.0.1:"),
        "{}",
        private.url
    );
    let token = private
        .token
        .clone()
        .expect("a private preview has a token")
        .value;
    let (status, _) = http_get(&private.host, "/", &[]).await.expect("answered");
    assert_eq!(status, 401, "no token: refused");
    let (status, _) = http_get(&private.host, "/", &[("X-Test-Token", "wrong")])
        .await
        .expect("answered");
    assert_eq!(status, 401, "wrong token: refused");
    let (status, body) = http_get(&private.host, "/", &[("x-test-token", &token)])
        .await
        .expect("answered");
    assert_eq!((status, body.as_str()), (200, "hello from the sandbox"));
    let (status, body) = http_get(&private.host, &format!("/?test_token={token}"), &[])
        .await
        .expect("answered");
    assert_eq!((status, body.as_str()), (200, "hello from the sandbox"));
    // Extra tokens with an expiry: one far enough ahead that no request outlives it, and one
    // whose expiry is the subject (refused once it has passed, never before).
    let long = backend
        .create_preview_token(&id, port, Some(crate::now_millis() + 600_000))
        .await
        .expect("token");
    let (status, _) = http_get(&private.host, "/", &[("X-Test-Token", &long.value)])
        .await
        .expect("answered");
    assert_eq!(status, 200, "an unexpired extra token is accepted");
    // A revoked token stops working at once; the others keep working.
    backend
        .revoke_preview_token(&id, port, &long.value)
        .await
        .expect("revoke");
    let (status, _) = http_get(&private.host, "/", &[("X-Test-Token", &long.value)])
        .await
        .expect("answered");
    assert_eq!(status, 401, "a revoked token is refused");
    let (status, _) = http_get(&private.host, "/", &[("X-Test-Token", &token)])
        .await
        .expect("answered");
    assert_eq!(status, 200, "revoking one token leaves the others");
    expect_code(
        backend.revoke_preview_token(&id, port, &long.value).await,
        ErrorCode::NotFound,
        "revoking a token twice",
    );
    let expires_at = crate::now_millis() + 1_000;
    let short = backend
        .create_preview_token(&id, port, Some(expires_at))
        .await
        .expect("token");
    let host = &private.host;
    let short = &short.value;
    eventually(PATIENCE, "an expired token is refused", || async move {
        let (status, _) = http_get(host, "/", &[("X-Test-Token", short)])
            .await
            .ok_or("no answer")?;
        // The server checked the token at some moment before the answer came back: a refusal
        // answered before the expiry is certainly early; one answered later may be on time.
        let answered_at = crate::now_millis();
        match status {
            401 if answered_at < expires_at => {
                panic!(
                    "token refused {} ms before its expiry",
                    expires_at - answered_at
                )
            }
            401 if answered_at == expires_at => Err("refused at the expiry millisecond: ask again"),
            401 => Ok(()),
            200 => Err("still accepted"),
            _ => panic!("unexpected status {status}"),
        }
    })
    .await;
    // A second sandbox serving the same port, exposed publicly.
    let other = create(backend, &unique("preview2")).await;
    let other_port = if isolated {
        port
    } else {
        skipped(
            "previews_serve_and_guard_private_ports",
            "un-isolated sandboxes share the host's ports: the second one serves another port",
        );
        free_host_port()
    };
    start_http_server(backend, &other, other_port, "the other one").await;
    let public = backend
        .expose_port(&other, {
            let mut options = PreviewOptions::default();
            options.port = other_port;
            options.public = true;
            options
        })
        .await
        .expect("expose public");
    assert!(public.token.is_none());
    let (status, body) = http_get(&public.host, "/", &[]).await.expect("answered");
    assert_eq!((status, body.as_str()), (200, "the other one"));
    assert_eq!(backend.list_previews(&id).await.expect("list").len(), 1);
    backend.close_preview(&id, port).await.expect("close");
    assert!(
        http_get(&private.host, "/", &[("X-Test-Token", &token)])
            .await
            .is_none(),
        "closed"
    );
    expect_code(
        backend.close_preview(&id, port).await,
        ErrorCode::NotFound,
        "close twice",
    );
    backend.destroy(&id).await.expect("destroy");
    backend.destroy(&other).await.expect("destroy");
    assert!(
        http_get(&public.host, "/", &[]).await.is_none(),
        "gone with its sandbox"
    );
}

/// Snapshots capture files (not processes); sandboxes start from them; fork copies files.
pub async fn snapshots_and_fork_copy_files_not_processes(backend: &dyn Backend) {
    let id = create(backend, &unique("snap")).await;
    if !backend.capabilities().snapshots {
        expect_code(
            backend.snapshot(&id, None).await,
            ErrorCode::NotSupported,
            "snapshot",
        );
        backend.destroy(&id).await.expect("destroy");
        return;
    }
    write(backend, &id, "project/data.bin", &[0, 1, 2, 255]).await;
    sh(
        backend,
        &id,
        "mkdir -p /tmp/t && echo tmp > /tmp/t/x && chmod 600 project/data.bin",
    )
    .await;
    let marker = unique("snapproc");
    let spec = ProcessSpec::new(Command::bash_login(format!("exec -a {marker} sleep 600")));
    drop(backend.spawn(&id, spec).await.expect("spawn"));
    let snap = backend
        .snapshot(&id, Some("first".into()))
        .await
        .expect("snapshot");
    assert_eq!(snap.sandbox_id, id);
    assert!(backend
        .list_snapshots()
        .await
        .expect("list")
        .iter()
        .any(|s| s.id == snap.id));
    assert_eq!(
        backend.get(&id).await.expect("get").state,
        SandboxState::Running,
        "resumed"
    );
    let mut options = test_options(&unique("fromsnap"));
    options.snapshot = Some(snap.id.clone());
    let restored = backend
        .create(options)
        .await
        .expect("create from snapshot")
        .id;
    assert_eq!(
        read(backend, &restored, "project/data.bin")
            .await
            .expect("read"),
        [0, 1, 2, 255]
    );
    assert_eq!(
        sh(
            backend,
            &restored,
            "cat /tmp/t/x; stat -c %a project/data.bin"
        )
        .await
        .stdout,
        b"tmp\n600\n"
    );
    let ps = sh(
        backend,
        &restored,
        &format!("ps -eo args | grep -c '^{marker}' || true"),
    )
    .await;
    assert_eq!(ps.stdout_lossy().trim(), "0", "processes are not copied");
    let forked = backend
        .fork(&id, test_options(&unique("fork")))
        .await
        .expect("fork")
        .id;
    assert_eq!(
        read(backend, &forked, "project/data.bin")
            .await
            .expect("read"),
        [0, 1, 2, 255]
    );
    write(backend, &forked, "project/data.bin", b"changed").await;
    assert_eq!(
        read(backend, &id, "project/data.bin").await.expect("read"),
        [0, 1, 2, 255],
        "a copy"
    );
    backend
        .delete_snapshot(&snap.id)
        .await
        .expect("delete snapshot");
    assert!(backend
        .list_snapshots()
        .await
        .expect("list")
        .iter()
        .all(|s| s.id != snap.id));
    let mut options = test_options("gone-snapshot");
    options.snapshot = Some(snap.id.clone());
    expect_code(
        backend.create(options).await,
        ErrorCode::NotFound,
        "create from a deleted snapshot",
    );
    for sandbox in [&id, &restored, &forked] {
        backend.destroy(sandbox).await.expect("destroy");
    }
}

/// A volume is shared between sandboxes and outlives them; subpaths mount a directory of it.
pub async fn volumes_outlive_sandboxes(backend: &dyn Backend) {
    let name = unique("vol");
    if !backend.capabilities().volumes {
        expect_code(
            backend.create_volume(&name).await,
            ErrorCode::NotSupported,
            "volume",
        );
        expect_code(
            backend.get_volume(&name).await,
            ErrorCode::NotSupported,
            "get volume",
        );
        expect_code(
            backend.list_volumes().await,
            ErrorCode::NotSupported,
            "list volumes",
        );
        expect_code(
            backend.delete_volume(&name).await,
            ErrorCode::NotSupported,
            "delete volume",
        );
        return;
    }
    let vol = backend.create_volume(&name).await.expect("create volume");
    assert_eq!(vol.name, name);
    expect_code(
        backend.create_volume(&name).await,
        ErrorCode::AlreadyExists,
        "twice",
    );
    let mount = |path: &str, subpath: Option<&str>| {
        let mut mount = VolumeMount::new(name.clone(), path);
        mount.subpath = subpath.map(String::from);
        mount
    };
    let mut a = test_options(&unique("vola"));
    a.volumes = vec![mount("/data", None)];
    let a = backend.create(a).await.expect("create a").id;
    assert!(sh(
        backend,
        &a,
        "mkdir -p /data/sub && echo shared > /data/sub/f && echo top > /data/t"
    )
    .await
    .exit_status()
    .success());
    let mut b = test_options(&unique("volb"));
    b.volumes = vec![mount("/mnt/v", None), mount("/mnt/sub", Some("sub"))];
    let b = backend.create(b).await.expect("create b").id;
    assert_eq!(
        sh(backend, &b, "cat /mnt/v/sub/f /mnt/sub/f; ls /mnt/sub")
            .await
            .stdout_lossy(),
        "shared\nshared\nf\n"
    );
    expect_code(
        backend.delete_volume(&name).await,
        ErrorCode::InvalidState,
        "delete while mounted",
    );
    backend.destroy(&a).await.expect("destroy");
    backend.destroy(&b).await.expect("destroy");
    let mut c = test_options(&unique("volc"));
    c.volumes = vec![mount("/data", None)];
    let c = backend.create(c).await.expect("create c").id;
    assert_eq!(
        read(backend, &c, "/data/t").await.expect("read"),
        b"top\n",
        "data outlives its writers"
    );
    backend.destroy(&c).await.expect("destroy");
    assert!(backend
        .list_volumes()
        .await
        .expect("list")
        .iter()
        .any(|v| v.name == name));
    assert!(backend.get_volume(&name).await.expect("get").size >= 11);
    backend.delete_volume(&name).await.expect("delete");
    expect_code(
        backend.get_volume(&name).await,
        ErrorCode::NotFound,
        "deleted",
    );
    let mut d = test_options("missing-volume");
    d.volumes = vec![mount("/data", None)];
    expect_code(
        backend.create(d).await,
        ErrorCode::NotFound,
        "mount a missing volume",
    );
}

/// A watch reports creates, writes, chmods, renames and removes; dropping it stops it.
pub async fn watch_reports_changes(backend: &dyn Backend) {
    let id = create(backend, &unique("watch")).await;
    backend
        .mkdir(&id, "w/sub", MkdirOptions::default())
        .await
        .expect("mkdir");
    let mut options = WatchOptions::default();
    options.recursive = true;
    if !backend.capabilities().watch {
        expect_code(
            backend.watch(&id, "w", options).await.map(drop),
            ErrorCode::NotSupported,
            "watch",
        );
        backend.destroy(&id).await.expect("destroy");
        return;
    }
    let mut events = backend
        .watch(&id, "w", options.clone())
        .await
        .expect("watch");
    sh(
        backend,
        &id,
        "cd w && echo a > f && chmod 600 f && mv f g && echo deep > sub/d && rm g",
    )
    .await;
    let mut seen = Vec::new();
    let want = [
        (FsEventKind::Create, "f"),
        (FsEventKind::Write, "f"),
        (FsEventKind::Chmod, "f"),
        (FsEventKind::Rename, "f"),
        (FsEventKind::Rename, "g"),
        (FsEventKind::Create, "sub/d"),
        (FsEventKind::Remove, "g"),
    ];
    while !want.iter().all(|w| seen.contains(&(w.0, w.1.to_string()))) {
        match tokio::time::timeout(PATIENCE, events.next()).await {
            Ok(Some(Ok(ev))) => {
                assert!(ev.path.starts_with("/workspace/w/"), "{ev:?}");
                seen.push((ev.kind, ev.name));
            }
            other => panic!("expected events {want:?}, saw {seen:?}, then {other:?}"),
        }
    }
    // Writes through the file API read as writes: a create and a write for a new file, a
    // write for an existing one, and never the engine's temporary file.
    write(backend, &id, "w/api.txt", b"1").await;
    write(backend, &id, "w/api.txt", b"2").await;
    let mut api_events = Vec::new();
    while api_events
        .iter()
        .filter(|k| **k == FsEventKind::Write)
        .count()
        < 2
    {
        match tokio::time::timeout(PATIENCE, events.next()).await {
            Ok(Some(Ok(ev))) => {
                assert!(
                    !ev.name.contains(".sandcove-"),
                    "temporary file shown: {ev:?}"
                );
                if ev.name == "api.txt" {
                    api_events.push(ev.kind);
                }
            }
            other => panic!("expected API write events, saw {api_events:?}, then {other:?}"),
        }
    }
    assert_eq!(
        api_events,
        [FsEventKind::Create, FsEventKind::Write, FsEventKind::Write]
    );
    // Files made in a directory before its watch was added are reported too.
    sh(
        backend,
        &id,
        "mkdir -p w/new/deeper && echo x > w/new/deeper/f",
    )
    .await;
    let want = ["new", "new/deeper", "new/deeper/f"];
    let mut created: Vec<String> = Vec::new();
    while !want.iter().all(|w| created.iter().any(|c| c == w)) {
        match tokio::time::timeout(PATIENCE, events.next()).await {
            Ok(Some(Ok(ev))) if ev.kind == FsEventKind::Create => created.push(ev.name),
            Ok(Some(Ok(_))) => {}
            other => panic!("expected creates of {want:?}, saw {created:?}, then {other:?}"),
        }
    }
    expect_code(
        backend.watch(&id, "nope", options.clone()).await.map(drop),
        ErrorCode::NotFound,
        "watch missing",
    );
    drop(events);
    backend.destroy(&id).await.expect("destroy");
}

/// A process on a terminal: a tty, its size, resize, input and exit status.
pub async fn pty_processes(backend: &dyn Backend) {
    let id = create(backend, &unique("pty")).await;
    let mut spec = ProcessSpec::new(Command::argv(["bash", "--norc", "--noprofile", "-i"]));
    spec.pty = Some(PtySize { cols: 80, rows: 24 });
    if !backend.capabilities().pty {
        expect_code(
            backend.spawn(&id, spec).await.map(|s| s.pid),
            ErrorCode::NotSupported,
            "pty",
        );
        backend.destroy(&id).await.expect("destroy");
        return;
    }
    let mut stream = backend.spawn(&id, spec).await.expect("spawn on a pty");
    let sel = ProcessSelector::Pid(stream.pid);
    let mut seen = Vec::new();
    backend
        .write_stdin(
            &id,
            sel.clone(),
            b"tty; stty size; echo MARK$((40+2))\n".to_vec(),
        )
        .await
        .expect("input");
    read_until(&mut stream, &mut seen, |s| s.contains("MARK42")).await;
    let text = String::from_utf8_lossy(&seen).into_owned();
    assert!(text.contains("/dev/pts/"), "{text}");
    assert!(text.contains("24 80"), "{text}");
    backend
        .resize_pty(
            &id,
            sel.clone(),
            PtySize {
                cols: 100,
                rows: 30,
            },
        )
        .await
        .expect("resize");
    backend
        .write_stdin(&id, sel.clone(), b"stty size; exit 7\n".to_vec())
        .await
        .expect("input");
    let rest = collect(stream, usize::MAX).await.expect("collect");
    assert!(
        String::from_utf8_lossy(&rest.stdout).contains("30 100"),
        "{:?}",
        rest.stdout_lossy()
    );
    assert_eq!(rest.exit_status().code, Some(7));
    let plain = backend
        .spawn(&id, ProcessSpec::new(Command::argv(["sleep", "5"])))
        .await
        .expect("spawn");
    expect_code(
        backend
            .resize_pty(
                &id,
                ProcessSelector::Pid(plain.pid),
                PtySize { cols: 1, rows: 1 },
            )
            .await,
        ErrorCode::InvalidArgument,
        "resize without a pty",
    );
    backend.destroy(&id).await.expect("destroy");
}

/// Metrics report memory, disk and CPU figures.
pub async fn metrics_report_usage(backend: &dyn Backend) {
    let id = create(backend, &unique("metrics")).await;
    if !backend.capabilities().metrics {
        expect_code(
            backend.metrics(&id).await,
            ErrorCode::NotSupported,
            "metrics",
        );
        backend.destroy(&id).await.expect("destroy");
        return;
    }
    let mut stream = backend
        .spawn(
            &id,
            ProcessSpec::new(Command::sh(
                "head -c 20000000 /dev/zero > /tmp/z; echo written; sleep 30",
            )),
        )
        .await
        .expect("spawn");
    // Wait for the write to be done (the process says so), not for a guessed time.
    read_until(&mut stream, &mut Vec::new(), |s| s.contains("written")).await;
    let m = eventually(PATIENCE, "metrics count the 20 MB written", || async {
        let m = backend.metrics(&id).await.expect("metrics");
        if m.disk_used >= 20_000_000 {
            Ok(m)
        } else {
            Err(m)
        }
    })
    .await;
    assert!(m.mem_used > 0, "{m:?}");
    assert!(m.mem_total >= m.mem_used, "{m:?}");
    assert!(m.cpu_count >= 1);
    assert!(m.disk_total >= m.disk_used, "{m:?}");
    // Where no container gives the agent its own `/tmp` (a pod agent run on a host, as the
    // tests do), the file would outlive the sandbox.
    sh(backend, &id, "rm -f /tmp/z").await;
    backend.destroy(&id).await.expect("destroy");
}

// ---------------------------------------------------------------------------------------------
// Annotations and stop/start
// ---------------------------------------------------------------------------------------------

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Annotations given at create are reported by get and list; an update sets and removes
/// keys at once and answers the new map.
pub async fn annotations_set_get_remove(backend: &dyn Backend) {
    let label = unique("annot");
    let mut options = test_options(&label);
    options.annotations = map(&[("vendor/a", "1"), ("vendor/b", "two")]);
    let info = backend.create(options).await.expect("create");
    assert_eq!(
        info.annotations,
        map(&[("vendor/a", "1"), ("vendor/b", "two")])
    );
    let id = info.id;
    let mut update = AnnotationUpdate::set("vendor/c", "{\"json\": [1, 2]}");
    update.remove.push("vendor/a".into());
    update.remove.push("vendor/absent".into());
    let now = backend
        .update_annotations(&id, update)
        .await
        .expect("update");
    let want = map(&[("vendor/b", "two"), ("vendor/c", "{\"json\": [1, 2]}")]);
    assert_eq!(now, want);
    assert_eq!(backend.get(&id).await.expect("get").annotations, want);
    let listed = backend
        .list({
            let mut options = ListOptions::default();
            options.labels = BTreeMap::from([("conformance".to_string(), label)]);
            options
        })
        .await
        .expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].annotations, want);
    // An expectation that holds applies; one that does not changes nothing.
    let cas = AnnotationUpdate::set("vendor/b", "three").expecting("vendor/b", Some("two".into()));
    assert_eq!(
        backend
            .update_annotations(&id, cas)
            .await
            .expect("cas")
            .get("vendor/b")
            .map(String::as_str),
        Some("three")
    );
    let stale = AnnotationUpdate::set("vendor/b", "four").expecting("vendor/b", Some("two".into()));
    expect_code(
        backend.update_annotations(&id, stale).await,
        ErrorCode::Conflict,
        "a compare-and-set on a stale value",
    );
    let absent = AnnotationUpdate::set("vendor/b", "five").expecting("vendor/b", None);
    expect_code(
        backend.update_annotations(&id, absent).await,
        ErrorCode::Conflict,
        "an expected-absent key that exists",
    );
    assert_eq!(
        backend
            .get(&id)
            .await
            .expect("get")
            .annotations
            .get("vendor/b")
            .map(String::as_str),
        Some("three")
    );
    backend.destroy(&id).await.expect("destroy");
    expect_code(
        backend
            .update_annotations(&id, AnnotationUpdate::set("k", "v"))
            .await,
        ErrorCode::NotFound,
        "annotations of a destroyed sandbox",
    );
}

/// Annotations are read and changed while the sandbox is paused (where pausing is
/// supported) and while it is stopped, without resuming or starting it.
pub async fn annotations_readable_while_paused_or_stopped(backend: &dyn Backend) {
    let mut options = test_options(&unique("annotpause"));
    options.annotations = map(&[("k", "v")]);
    let id = backend.create(options).await.expect("create").id;
    if backend.capabilities().pause {
        backend.pause(&id).await.expect("pause");
        let info = backend.get(&id).await.expect("get");
        assert_eq!(info.annotations, map(&[("k", "v")]));
        let now = backend
            .update_annotations(&id, AnnotationUpdate::set("paused", "yes"))
            .await
            .expect("update while paused");
        assert_eq!(now, map(&[("k", "v"), ("paused", "yes")]));
        assert_eq!(
            backend.get(&id).await.expect("get").state,
            SandboxState::Paused,
            "an annotation update does not resume"
        );
        backend.resume(&id).await.expect("resume");
    }
    backend.stop(&id).await.expect("stop");
    backend
        .update_annotations(&id, AnnotationUpdate::set("stopped", "yes"))
        .await
        .expect("update while stopped");
    let info = backend.get(&id).await.expect("get");
    assert_eq!(
        info.state,
        SandboxState::Stopped,
        "an update does not start"
    );
    assert_eq!(
        info.annotations.get("stopped").map(String::as_str),
        Some("yes")
    );
    assert_eq!(info.annotations.get("k").map(String::as_str), Some("v"));
    backend.destroy(&id).await.expect("destroy");
}

/// Nothing inside the sandbox holds or reaches the annotations: their values appear in no
/// file sandboxed code can read, and code that rewrites and deletes files everywhere it can
/// write leaves them as they were.
pub async fn annotations_are_out_of_reach_of_sandboxed_code(backend: &dyn Backend) {
    let secret = unique("annotvalue");
    let mut options = test_options(&unique("annotreach"));
    options.annotations = map(&[("record", &secret)]);
    let id = backend.create(options).await.expect("create").id;
    backend
        .update_annotations(&id, AnnotationUpdate::set("later", &secret))
        .await
        .expect("update");
    if backend.capabilities().isolated {
        // Every writable place: clobber, then delete, everything there.
        let vandal = "for d in / /tmp /var/tmp /dev/shm /run \"$HOME\" /workspace; do \
                        find \"$d\" -xdev -type f -writable 2>/dev/null | \
                          while read -r f; do printf garbage > \"$f\"; done; \
                        printf garbage > \"$d/.sandcove-annotations.json\" 2>/dev/null; \
                      done; \
                      rm -rf /tmp/* /tmp/.[!.]* /workspace/* /workspace/.[!.]* 2>/dev/null; true";
        sh(backend, &id, vandal).await;
        // The sandbox's own filesystems (not the read-only host directories bound in).
        let found = sh(
            backend,
            &id,
            &format!(
                "for d in / /tmp /var/tmp /dev/shm /run \"$HOME\" /workspace; do \
                   find \"$d\" -xdev -type f -readable -exec grep -lsF -- '{secret}' {{}} + ; \
                 done 2>/dev/null | head -5; true"
            ),
        )
        .await;
        assert_eq!(
            found.stdout_lossy().trim(),
            "",
            "an annotation value is readable inside the sandbox"
        );
    } else {
        // Un-isolated sandbox processes share the host's files: no vandalism here.
        println!("annotations_are_out_of_reach_of_sandboxed_code: un-isolated backend, in-sandbox part skipped");
    }
    assert_eq!(
        backend.get(&id).await.expect("get").annotations,
        map(&[("later", &secret), ("record", &secret)])
    );
    backend.destroy(&id).await.expect("destroy");
}

/// A fork starts with a copy of its source's annotations, the fork's own on top; later
/// changes to either do not reach the other.
pub async fn fork_copies_annotations(backend: &dyn Backend) {
    let mut options = test_options(&unique("annotfork"));
    options.annotations = map(&[("a", "1"), ("b", "2")]);
    let id = backend.create(options).await.expect("create").id;
    let mut fork_options = test_options(&unique("annotforked"));
    fork_options.annotations = map(&[("b", "3"), ("c", "4")]);
    if !backend.capabilities().snapshots {
        expect_code(
            backend.fork(&id, fork_options).await,
            ErrorCode::NotSupported,
            "fork",
        );
        backend.destroy(&id).await.expect("destroy");
        return;
    }
    let forked = backend.fork(&id, fork_options).await.expect("fork");
    let want = map(&[("a", "1"), ("b", "3"), ("c", "4")]);
    assert_eq!(forked.annotations, want, "what fork answers");
    assert_eq!(
        backend.get(&forked.id).await.expect("get").annotations,
        want
    );
    backend
        .update_annotations(&id, AnnotationUpdate::set("a", "changed"))
        .await
        .expect("update source");
    assert_eq!(
        backend.get(&forked.id).await.expect("get").annotations,
        want,
        "a copy, not a link"
    );
    // A fork whose own annotations would overflow the bounds is refused before it is made.
    let mut too_many = test_options(&unique("annotforkbad"));
    too_many.annotations = (0..crate::MAX_ANNOTATIONS - 1)
        .map(|i| (format!("k{i}"), String::new()))
        .collect();
    expect_code(
        backend.fork(&id, too_many).await,
        ErrorCode::InvalidArgument,
        "a fork over the annotation count",
    );
    for sandbox in [&id, &forked.id] {
        backend.destroy(sandbox).await.expect("destroy");
    }
}

/// Out-of-bounds annotations are `InvalidArgument`: at create nothing is made, on update
/// nothing changes.
pub async fn annotation_bounds_are_refused_with_nothing_changed(backend: &dyn Backend) {
    let big = "x".repeat(crate::MAX_ANNOTATION_VALUE + 1);
    let long_key = "k".repeat(crate::MAX_ANNOTATION_KEY + 1);
    let many: BTreeMap<String, String> = (0..=crate::MAX_ANNOTATIONS)
        .map(|i| (format!("k{i}"), String::new()))
        .collect();
    let bulky: BTreeMap<String, String> =
        (0..crate::MAX_ANNOTATIONS_BYTES / crate::MAX_ANNOTATION_VALUE + 1)
            .map(|i| (format!("k{i}"), "y".repeat(crate::MAX_ANNOTATION_VALUE)))
            .collect();
    let bad_maps: Vec<(&str, BTreeMap<String, String>)> = vec![
        ("an empty key", map(&[("", "v")])),
        ("a key with a space", map(&[("a b", "v")])),
        ("a key with a NUL", map(&[("a\0b", "v")])),
        ("a non-ASCII key", map(&[("clé", "v")])),
        (
            "a key too long",
            BTreeMap::from([(long_key.clone(), "v".to_string())]),
        ),
        (
            "a value too large",
            BTreeMap::from([("k".to_string(), big.clone())]),
        ),
        ("a value with a NUL", map(&[("k", "a\0b")])),
        ("too many keys", many.clone()),
        ("too many bytes", bulky.clone()),
    ];
    let label = unique("annotbounds");
    for (what, annotations) in &bad_maps {
        let mut options = test_options(&label);
        options.annotations = annotations.clone();
        expect_code(
            backend.create(options).await,
            ErrorCode::InvalidArgument,
            &format!("create with {what}"),
        );
    }
    assert!(
        ids_labelled(backend, &label).await.is_empty(),
        "a refused create makes nothing"
    );
    let mut options = test_options(&label);
    options.annotations = map(&[("keep", "me")]);
    let id = backend.create(options).await.expect("create").id;
    for (what, annotations) in &bad_maps {
        let mut update = AnnotationUpdate::default();
        update.set = annotations.clone();
        expect_code(
            backend.update_annotations(&id, update).await,
            ErrorCode::InvalidArgument,
            &format!("update with {what}"),
        );
    }
    expect_code(
        backend
            .update_annotations(&id, AnnotationUpdate::remove("bad key"))
            .await,
        ErrorCode::InvalidArgument,
        "removing a malformed key",
    );
    // Bounds hold on the result too: keys that are fine one by one, too many together.
    let half: BTreeMap<String, String> = (0..crate::MAX_ANNOTATIONS / 2 + 1)
        .map(|i| (format!("k{i}"), String::new()))
        .collect();
    backend
        .update_annotations(&id, {
            let mut options = AnnotationUpdate::default();
            options.set = half;
            options
        })
        .await
        .expect("half the allowed keys");
    let other_half: BTreeMap<String, String> = (0..crate::MAX_ANNOTATIONS / 2 + 1)
        .map(|i| (format!("j{i}"), String::new()))
        .collect();
    expect_code(
        backend
            .update_annotations(&id, {
                let mut options = AnnotationUpdate::default();
                options.set = other_half;
                options
            })
            .await,
        ErrorCode::InvalidArgument,
        "an update overflowing the count",
    );
    let after = backend.get(&id).await.expect("get").annotations;
    assert_eq!(after.get("keep").map(String::as_str), Some("me"));
    assert_eq!(
        after.len(),
        crate::MAX_ANNOTATIONS / 2 + 2,
        "the refused update changed nothing"
    );
    backend.destroy(&id).await.expect("destroy");
}

/// Programs updating one record with compare-and-set never lose each other's writes: each
/// increments a shared counter several times (re-reading and retrying on `Conflict`) and the
/// counter ends at the total.
pub async fn concurrent_annotation_updates_lose_nothing(backend: &dyn Backend) {
    const WRITERS: usize = 6;
    const EACH: usize = 5;
    let id = create(backend, &unique("annotcas")).await;
    let mut conflicts = 0usize;
    let writers = (0..WRITERS).map(|w| {
        let id = id.clone();
        async move {
            let mut conflicts = 0usize;
            for _ in 0..EACH {
                loop {
                    let current = backend.get(&id).await.expect("get").annotations;
                    let old = current.get("counter").cloned();
                    let n: usize = old.as_deref().map_or(0, |v| v.parse().expect("a number"));
                    let mut update = AnnotationUpdate::set("counter", (n + 1).to_string())
                        .expecting("counter", old);
                    update
                        .set
                        .insert(format!("writer/{w}"), (n + 1).to_string());
                    match backend.update_annotations(&id, update).await {
                        Ok(_) => break,
                        Err(e) if e.code() == ErrorCode::Conflict => conflicts += 1,
                        Err(e) => panic!("update: {e}"),
                    }
                }
            }
            conflicts
        }
    });
    for c in futures::future::join_all(writers).await {
        conflicts += c;
    }
    let annotations = backend.get(&id).await.expect("get").annotations;
    assert_eq!(
        annotations.get("counter").map(String::as_str),
        Some((WRITERS * EACH).to_string().as_str()),
        "no increment lost ({conflicts} conflicts retried)"
    );
    for w in 0..WRITERS {
        assert!(
            annotations.contains_key(&format!("writer/{w}")),
            "writer {w}"
        );
    }
    backend.destroy(&id).await.expect("destroy");
}

/// Stop ends every process (a tagged marker by its exact pid, and a background child),
/// keeps files, refuses work until started; start runs again with the same files, and new
/// processes work. Stop and start are idempotent; pause, resume and start refuse the states
/// they do not apply to.
pub async fn stop_ends_processes_keeps_files_and_start_runs_again(backend: &dyn Backend) {
    let id = create(backend, &unique("stop")).await;
    write(backend, &id, "kept/file.txt", b"still here").await;
    let marker = unique("stopmark");
    let child = unique("stopchild");
    let spec = ProcessSpec::new(Command::bash_login(format!(
        "(exec -a {child} sleep 600) & exec -a {marker} sleep 600"
    )))
    .tag("stop-marker");
    let stream = backend.spawn(&id, spec).await.expect("spawn");
    let pid = stream.pid;
    drop(stream);
    let local = backend.capabilities().isolated;
    if local {
        eventually(PATIENCE, "marker and child run", || async {
            equals(
                (host_process_count(&marker), host_process_count(&child)),
                (1, 1),
            )
        })
        .await;
    }
    let info = backend.stop(&id).await.expect("stop");
    assert_eq!(info.state, SandboxState::Stopped);
    assert_eq!(
        backend.get(&id).await.expect("get").state,
        SandboxState::Stopped
    );
    if local {
        // Already gone when stop returns: no waiting.
        assert_eq!(
            (host_process_count(&marker), host_process_count(&child)),
            (0, 0),
            "every process ended by the time stop returned"
        );
    }
    assert_eq!(
        backend.stop(&id).await.expect("stop again").state,
        SandboxState::Stopped
    );
    expect_code(
        backend
            .spawn(&id, ProcessSpec::new(Command::argv(["true"])))
            .await
            .map(|s| s.pid),
        ErrorCode::InvalidState,
        "spawn while stopped",
    );
    expect_code(
        read(backend, &id, "kept/file.txt").await,
        ErrorCode::InvalidState,
        "a file read while stopped",
    );
    expect_code(
        backend.resume(&id).await,
        ErrorCode::InvalidState,
        "resume while stopped",
    );
    if backend.capabilities().snapshots {
        // Files of a stopped sandbox are consistent (nothing runs): a fork copies them.
        let forked = backend
            .fork(&id, test_options(&unique("stopfork")))
            .await
            .expect("fork a stopped sandbox");
        assert_eq!(
            read(backend, &forked.id, "kept/file.txt")
                .await
                .expect("read the fork"),
            b"still here"
        );
        assert_eq!(
            backend.get(&id).await.expect("get").state,
            SandboxState::Stopped,
            "forking does not start the source"
        );
        backend.destroy(&forked.id).await.expect("destroy the fork");
    }
    if backend.capabilities().pause {
        expect_code(
            backend.pause(&id).await,
            ErrorCode::InvalidState,
            "pause while stopped",
        );
    }
    let info = backend.start(&id).await.expect("start");
    assert_eq!(info.state, SandboxState::Running);
    assert_eq!(
        backend.start(&id).await.expect("start again").state,
        SandboxState::Running
    );
    assert_eq!(
        read(backend, &id, "kept/file.txt").await.expect("read"),
        b"still here"
    );
    let processes = backend.list_processes(&id).await.expect("list processes");
    let marker_info = processes
        .iter()
        .find(|p| p.pid == pid)
        .unwrap_or_else(|| panic!("pid {pid} listed: {processes:?}"));
    assert_eq!(marker_info.tag.as_deref(), Some("stop-marker"));
    let exit = marker_info.exit.expect("the marker ended");
    assert_eq!(exit.signal, Some(9), "killed by the stop: {exit:?}");
    assert!(marker_info.ended_at.is_some());
    assert!(
        processes.iter().all(|p| p.exit.is_some()),
        "no process runs after a stop: {processes:?}"
    );
    assert_eq!(sh(backend, &id, "echo again").await.stdout, b"again\n");
    if backend.capabilities().pause {
        backend.pause(&id).await.expect("pause");
        expect_code(
            backend.start(&id).await,
            ErrorCode::InvalidState,
            "start while paused",
        );
        // Stopping a paused sandbox ends its frozen processes too.
        let frozen = unique("frozen");
        let spec = ProcessSpec::new(Command::bash_login(format!("exec -a {frozen} sleep 600")));
        backend.resume(&id).await.expect("resume");
        drop(backend.spawn(&id, spec).await.expect("spawn"));
        if local {
            eventually(PATIENCE, "the frozen marker runs", || async {
                equals(host_process_count(&frozen), 1)
            })
            .await;
        }
        backend.pause(&id).await.expect("pause");
        assert_eq!(
            backend.stop(&id).await.expect("stop paused").state,
            SandboxState::Stopped
        );
        if local {
            assert_eq!(host_process_count(&frozen), 0, "frozen processes ended");
        }
        backend.start(&id).await.expect("start");
    }
    backend.destroy(&id).await.expect("destroy");
}

/// The lease does not run while a sandbox is stopped: a sandbox stopped with a few seconds
/// left outlives that time, and start gives it back what it had left.
pub async fn stop_pauses_the_lease(backend: &dyn Backend) {
    const LEASE: Duration = Duration::from_secs(10);
    let mut options = test_options(&unique("stoplease"));
    options.timeout = Some(LEASE);
    let info = backend.create(options).await.expect("create");
    let id = info.id;
    let left_before = info.ends_at.saturating_sub(crate::now_millis());
    backend.stop(&id).await.expect("stop");
    // Time passing is the subject: wait until the original lease has ended.
    let original_end = info.ends_at + 1000;
    eventually(PATIENCE, "the original lease has passed", || async {
        holds(crate::now_millis() > original_end, crate::now_millis())
    })
    .await;
    let stopped = backend
        .get(&id)
        .await
        .expect("a stopped sandbox outlives its lease");
    assert_eq!(stopped.state, SandboxState::Stopped);
    let started = backend.start(&id).await.expect("start");
    let left_after = started.ends_at.saturating_sub(crate::now_millis());
    assert!(
        left_after + 3000 >= left_before && left_after <= left_before + 500,
        "start gives back the time left at stop: {left_before} ms before, {left_after} ms after"
    );
    backend.destroy(&id).await.expect("destroy");
}

/// `check_create` and `check_snapshot` answer from the capabilities alone: a request the
/// runtime can serve is supported with what will hold, an image it cannot provide or a
/// feature it lacks is unsupported with the alternative, and nothing is created by any
/// check. `create` runs the same check first: the refused image creates nothing either.
pub async fn check_create_evaluates_without_allocating(client: crate::Client) {
    use crate::CheckStatus;
    let label = unique("check");
    let caps = client.ready().await.expect("capabilities");
    assert!(
        caps.observed_at.is_some(),
        "capabilities say when they were observed"
    );
    let options = test_options(&label);
    let guarantees = match client.check_create(&options).await.expect("check") {
        CheckStatus::Supported(g) => g,
        other => panic!("a plain create is supported: {other:?}"),
    };
    assert_eq!(guarantees.isolated, caps.isolated);
    assert_eq!(guarantees.network_isolated, caps.isolated);
    assert_eq!(guarantees.lease, Some(Duration::from_secs(600)));
    assert!(guarantees.observed_at.is_some());
    for base in [None, Some(""), Some("base")] {
        let mut o = options.clone();
        o.template = base.map(str::to_string);
        assert!(
            client.check_create(&o).await.expect("check").is_supported(),
            "{base:?} is the host base"
        );
    }
    let mut image = options.clone();
    image.template = Some("myorg/custom-ml:1.2".into());
    match client.check_create(&image).await.expect("check") {
        CheckStatus::Unsupported {
            feature,
            alternative,
        } => {
            assert!(feature.contains("myorg/custom-ml:1.2"), "{feature}");
            assert!(
                alternative.contains("host"),
                "names what runs: {alternative}"
            );
            assert!(
                alternative.contains("snapshot"),
                "names a way: {alternative}"
            );
        }
        other => panic!("an image the runtime lacks: {other:?}"),
    }
    expect_code(
        client.create(image).await.map(|s| s.id().to_string()),
        ErrorCode::NotSupported,
        "create with an image the runtime lacks",
    );
    let mut limited = options.clone();
    limited.resources.memory_mib = Some(64);
    match client.check_create(&limited).await.expect("check") {
        CheckStatus::Supported(g) if caps.memory_limit => {
            assert_eq!(g.limits_enforced, [crate::Feature::MemoryLimit.name()]);
        }
        CheckStatus::Unsupported { feature, .. } if !caps.memory_limit => {
            assert_eq!(feature, crate::Feature::MemoryLimit.name());
        }
        other => panic!(
            "a memory limit (enforced: {}): {other:?}",
            caps.memory_limit
        ),
    }
    match client.check_snapshot().await.expect("check") {
        CheckStatus::Supported(g) if caps.snapshots => {
            let preserves = g.snapshot_preserves.expect("what a snapshot keeps");
            assert!(preserves.contains("files"), "{preserves}");
            assert!(preserves.contains("not its processes"), "{preserves}");
        }
        CheckStatus::Unsupported { .. } if !caps.snapshots => {}
        other => panic!("snapshots ({}): {other:?}", caps.snapshots),
    }
    let mut bad = options.clone();
    bad.timeout = Some(Duration::ZERO);
    expect_code(
        client.check_create(&bad).await,
        ErrorCode::InvalidArgument,
        "a zero lease",
    );
    let made = client
        .list(ListOptions::default().label("conformance", label.clone()))
        .await
        .expect("list");
    assert!(made.is_empty(), "no check created anything: {made:?}");
}

/// `renew` reports the bounds and the lease it resolved; a zero lease and one past the
/// maximum are refused before any effect, leaving the lease as it was.
pub async fn leases_report_their_bounds_and_refuse_zero(client: crate::Client) {
    let sandbox = client
        .create(test_options(&unique("lease-bounds")))
        .await
        .expect("create");
    let before = sandbox.info().await.expect("info").ends_at;
    for refused in [
        Duration::ZERO,
        Duration::from_millis(999),
        crate::MAX_SANDBOX_TIMEOUT * 2,
    ] {
        match sandbox.set_timeout(refused).await {
            Err(crate::Error::InvalidArgument { message }) => {
                assert!(message.contains("at least"), "{message}");
            }
            other => panic!("lease {refused:?}: {other:?}"),
        }
    }
    assert_eq!(sandbox.info().await.expect("info").ends_at, before);
    let renewal = sandbox
        .renew(Duration::from_millis(120_500))
        .await
        .expect("renew");
    let bounds = renewal.bounds;
    assert_eq!(
        bounds,
        client.capabilities().lease.expect("reported bounds")
    );
    assert!(
        bounds.min_ms >= 1 && bounds.min_ms <= bounds.max_ms,
        "{bounds:?}"
    );
    assert!(renewal.resolved >= renewal.requested);
    assert_eq!(renewal.resolved.as_millis() as u64 % bounds.step_ms, 0);
    let now = crate::now_millis();
    let ends = renewal.info.ends_at;
    assert!(
        ends <= now + renewal.resolved.as_millis() as u64 && ends + 60_000 > now + 120_500,
        "the lease ends about {} ms from now, not {} ms",
        renewal.resolved.as_millis(),
        ends.saturating_sub(now)
    );
    sandbox.destroy().await.expect("destroy");
}

/// A failing process is data (`Ok` with its status); `expect_success` turns it into an error
/// that keeps the output; a signal death names the signal.
pub async fn exits_are_data_and_checked_runs_keep_the_output(client: crate::Client) {
    let sandbox = client
        .create(test_options(&unique("exits")))
        .await
        .expect("create");
    let out = sandbox
        .run("echo out; echo err >&2; exit 3")
        .await
        .expect("a failing process is still Ok");
    assert_eq!(out.exit_code(), 3);
    match sandbox
        .run("echo out; echo err >&2; exit 3")
        .expect_success()
        .await
    {
        Err(crate::RunError::Failed(out)) => {
            assert_eq!(out.stdout, b"out\n");
            assert_eq!(out.stderr, b"err\n");
            assert_eq!(out.exit_code(), 3);
        }
        other => panic!("exit 3, checked: {other:?}"),
    }
    let err = sandbox
        .run("echo before; kill -KILL $$")
        .expect_success()
        .await
        .expect_err("a signal death fails the check");
    let out = err.output().expect("the output is kept");
    assert_eq!(out.stdout, b"before\n");
    assert_eq!(out.exit_status().signal_name(), Some("SIGKILL"));
    assert!(err.to_string().contains("SIGKILL"), "{err}");
    let ok = sandbox
        .run("echo fine")
        .expect_success()
        .await
        .expect("success passes the check");
    assert_eq!(ok.stdout, b"fine\n");
    sandbox.destroy().await.expect("destroy");
}

/// A fork's envs are added over its source's: the source's stay, the fork's win.
pub async fn fork_adds_envs_over_the_sources(client: crate::Client) {
    let options = test_options(&unique("fork-envs"))
        .env("FROM_SOURCE", "s")
        .env("SHARED", "source");
    let source = client.create(options).await.expect("create");
    let fork_options = test_options(&unique("fork-envs-child"))
        .env("SHARED", "fork")
        .env("FROM_FORK", "f");
    if !client.capabilities().snapshots {
        expect_code(
            source.fork(fork_options).await.map(|s| s.id().to_string()),
            ErrorCode::NotSupported,
            "fork",
        );
        source.destroy().await.expect("destroy");
        return;
    }
    let (fork, info) = source.fork_described(fork_options).await.expect("fork");
    let expected: BTreeMap<String, String> =
        [("FROM_FORK", "f"), ("FROM_SOURCE", "s"), ("SHARED", "fork")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
    for key in expected.keys() {
        assert_eq!(
            info.envs.get(key),
            expected.get(key),
            "{key} in {:?}",
            info.envs
        );
    }
    let out = fork
        .run("echo \"$FROM_SOURCE,$SHARED,$FROM_FORK\"")
        .await
        .expect("run");
    assert_eq!(out.stdout_lossy(), "s,fork,f\n");
    fork.destroy().await.expect("destroy");
    source.destroy().await.expect("destroy");
}

/// Preview token lifetimes are bounded, and the token (header or query parameter) is
/// checked and removed before the request reaches the sandboxed server, which echoes what it
/// received.
pub async fn preview_tokens_are_bounded_and_never_reach_the_sandbox(backend: &dyn Backend) {
    let id = create(backend, &unique("preview-strip")).await;
    let port = if backend.capabilities().isolated {
        8001
    } else {
        free_host_port()
    };
    let mut options = PreviewOptions::default();
    options.port = port;
    options.token_header = "X-Echo-Token".into();
    options.token_query = "echo_token".into();
    if !backend.capabilities().previews {
        expect_code(
            backend.expose_port(&id, options).await,
            ErrorCode::NotSupported,
            "expose",
        );
        backend.destroy(&id).await.expect("destroy");
        return;
    }
    let mut zero = options.clone();
    zero.token_ttl = Some(Duration::ZERO);
    expect_code(
        backend.expose_port(&id, zero).await,
        ErrorCode::InvalidArgument,
        "ttl 0",
    );
    let mut long = options.clone();
    long.token_ttl = Some(crate::validate::MAX_PREVIEW_TOKEN_TTL * 2);
    expect_code(
        backend.expose_port(&id, long).await,
        ErrorCode::InvalidArgument,
        "ttl 2 weeks",
    );
    let script = format!(
        "import http.server\n\
         class H(http.server.BaseHTTPRequestHandler):\n\
         \x20   def do_GET(self):\n\
         \x20       body = (self.requestline + '\\n' + str(self.headers)).encode()\n\
         \x20       self.send_response(200)\n\
         \x20       self.send_header('Content-Length', str(len(body)))\n\
         \x20       self.end_headers()\n\
         \x20       self.wfile.write(body)\n\
         http.server.HTTPServer(('127.0.0.1', {port}), H).serve_forever()\n"
    );
    // Relative to its cwd: an un-isolated sandbox maps its cwd, not paths in an argv.
    write(
        backend,
        &id,
        &format!("/tmp/echo{port}/echo.py"),
        script.as_bytes(),
    )
    .await;
    let spec =
        ProcessSpec::new(Command::argv(["python3", "echo.py"])).cwd(format!("/tmp/echo{port}"));
    drop(
        backend
            .spawn(&id, spec)
            .await
            .expect("start the echo server"),
    );
    let probe = format!(
        "for i in $(seq 600); do python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}))' 2>/dev/null && exit 0; sleep 0.1; done; exit 1"
    );
    assert!(
        sh(backend, &id, &probe).await.exit_status().success(),
        "echo server is up"
    );
    let preview = backend.expose_port(&id, options).await.expect("expose");
    let token = preview
        .token
        .clone()
        .expect("a private preview has a token")
        .value;
    let now = crate::now_millis();
    expect_code(
        backend
            .create_preview_token(&id, port, Some(now.saturating_sub(1)))
            .await,
        ErrorCode::InvalidArgument,
        "an expiry already past",
    );
    expect_code(
        backend
            .create_preview_token(&id, port, Some(now + 8 * 24 * 3600 * 1000))
            .await,
        ErrorCode::InvalidArgument,
        "an expiry past a week",
    );
    let (status, body) = http_get(
        &preview.host,
        &format!("/echo?keep=1&echo_token={token}&also=2"),
        &[("X-Kept", "yes")],
    )
    .await
    .expect("answered");
    assert_eq!(status, 200, "{body}");
    assert!(
        body.starts_with("GET /echo?keep=1&also=2 HTTP/1.1"),
        "{body}"
    );
    assert!(body.contains("X-Kept: yes"), "{body}");
    assert!(
        !body.contains(&token),
        "the query token reached the sandbox: {body}"
    );
    let (status, body) = http_get(&preview.host, "/echo", &[("X-Echo-Token", &token)])
        .await
        .expect("answered");
    assert_eq!(status, 200, "{body}");
    assert!(body.starts_with("GET /echo HTTP/1.1"), "{body}");
    assert!(
        !body.contains(&token),
        "the header token reached the sandbox: {body}"
    );
    assert!(
        !body.to_ascii_lowercase().contains("x-echo-token"),
        "{body}"
    );
    backend.destroy(&id).await.expect("destroy");
}

// ---------------------------------------------------------------------------------------------
// Warm and cold creates
// ---------------------------------------------------------------------------------------------

/// What a caller can observe of a fresh sandbox, from inside and out, with its id and name
/// replaced by placeholders.
async fn fresh_view(
    backend: &dyn Backend,
    options: CreateOptions,
    lease: Duration,
) -> (String, crate::SandboxInfo) {
    let asked_name = options.name.clone().expect("the case names its sandboxes");
    let before = crate::now_millis();
    let info = backend.create(options).await.expect("create");
    let after = crate::now_millis();
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
                  echo --; ls -la / /workspace | awk '{print $1, $3, $4, $NF}'";
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

/// A sandbox `first` hands out (with the local engine: a warm-pool member it claims) matches
/// one `second` creates cold with the same options, in everything a caller sees: name, envs,
/// labels, user, lease, annotations, a `/tmp` and `/workspace` nothing wrote to, no process
/// run before, its hostname, users, groups, limits and files. The default user is another
/// than the member's (`alice`), so the claim changes the user database.
pub async fn claimed_sandbox_matches_a_cold_one(first: &dyn Backend, second: &dyn Backend) {
    claimed_matches_cold(first, second, Some("alice")).await
}

/// [`claimed_sandbox_matches_a_cold_one`] with the default user left unset: the member's own
/// users, which a claim keeps.
pub async fn claimed_sandbox_with_the_default_user_matches_a_cold_one(
    first: &dyn Backend,
    second: &dyn Backend,
) {
    claimed_matches_cold(first, second, None).await
}

async fn claimed_matches_cold(first: &dyn Backend, second: &dyn Backend, user: Option<&str>) {
    let lease = Duration::from_secs(321);
    let marker = unique("claim");
    let options = |name: &str| {
        let mut o = test_options(&marker)
            .env("CLAIM_A", "1")
            .env("CLAIM_B", "two words")
            .annotation("claim", "yes")
            .timeout(lease);
        o.name = Some(name.to_string());
        o.user = user.map(str::to_string);
        o
    };
    let (warm_view, warm_info) = fresh_view(first, options(&unique("warm")), lease).await;
    let (cold_view, cold_info) = fresh_view(second, options(&unique("cold")), lease).await;
    assert_eq!(warm_info, cold_info, "what get() says");
    assert_eq!(warm_view, cold_view, "what a process sees");
    assert!(warm_view.contains("\nCLAIM_B=two words\n"), "{warm_view}");
    if let Some(user) = user {
        assert!(warm_view.starts_with(&format!("{user}\n")), "{warm_view}");
    }
}

/// Expect `result` to be the tombstone of `kind` `id`, with its time and reason in words.
fn assert_destroyed<T: std::fmt::Debug>(
    result: crate::Result<T>,
    kind: &str,
    id: &str,
    reason: &str,
) {
    match result {
        Err(e @ crate::Error::Destroyed { .. }) => {
            let text = e.to_string();
            let crate::Error::Destroyed {
                kind: k,
                id: i,
                at,
                reason: r,
            } = e
            else {
                unreachable!()
            };
            assert_eq!((k.as_str(), i.as_str()), (kind, id), "{text}");
            assert!(r.contains(reason), "{text}");
            let now = crate::now_millis();
            assert!(at <= now && now - at < 600_000, "ended just now: {text}");
            assert!(text.contains("destroyed at 20"), "{text}");
        }
        other => panic!("expected the tombstone of {kind} {id:?}, got {other:?}"),
    }
}

/// Saved references name each kind of resource, reopen it while it lives, and answer the
/// typed outcome otherwise: another runtime's reference is `Forbidden`, an unknown id
/// `NotFound`, an id of another kind `Conflict`, and a resource that ended a `Destroyed`
/// tombstone (distinct from `NotFound`) naming when and why.
pub async fn references_reopen_or_say_what_became_of_them(client: crate::Client) {
    use crate::{Error, Reference, Reopened};
    let caps = client.ready().await.expect("capabilities");
    let runtime = client
        .runtime_id()
        .await
        .expect("the runtime has an identity");
    assert_eq!(caps.runtime_id.as_deref(), Some(runtime.as_str()));
    let (sandbox, _) = client
        .create_described(test_options(&unique("refs")))
        .await
        .expect("create");
    let id = sandbox.id().to_string();
    let r = sandbox.reference().expect("reference");
    assert_eq!(r.to_string(), format!("sandcove:v1:{runtime}:sandbox:{id}"));
    let saved: Reference = r.to_string().parse().expect("parses back");
    match client.reopen(&saved).await.expect("reopen") {
        Reopened::Sandbox(info) => assert_eq!(info.id, id),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        client.reopen_sandbox(&saved).await.expect("reopen").id(),
        id
    );
    assert_eq!(
        client
            .sandbox_reference(&sandbox.info().await.unwrap())
            .await
            .unwrap(),
        r
    );

    // A process, also after it ended (the sandbox still lists it).
    let handle = sandbox.spawn("exit 3").await.expect("spawn");
    let pr = handle.reference().expect("process reference");
    assert_eq!(pr, sandbox.process_reference(handle.pid()).unwrap());
    let pid = handle.pid();
    handle.wait().await.expect("wait");
    match client
        .reopen(&pr.to_string().parse().unwrap())
        .await
        .expect("reopen")
    {
        Reopened::Process(p) => {
            assert_eq!(p.pid, pid);
            assert!(p.exit.is_some(), "{p:?}");
        }
        other => panic!("{other:?}"),
    }
    let missing_pid = Reference::process(&runtime, &id, 999_999).unwrap();
    let e = client.reopen(&missing_pid).await.unwrap_err();
    assert!(e.is_not_found(), "{e:?}");

    // Another runtime's reference is refused without being looked up; an unknown id is
    // plainly not found.
    let foreign = Reference::sandbox("rt-another-runtime", &id).unwrap();
    match client.reopen(&foreign).await {
        Err(Error::Forbidden { what }) => assert!(what.contains("rt-another-runtime"), "{what}"),
        other => panic!("expected Forbidden, got {other:?}"),
    }
    let never = Reference::sandbox(&runtime, &unique("never")).unwrap();
    let e = client.reopen(&never).await.unwrap_err();
    assert!(e.is_not_found(), "{e:?}");

    // A preview, closed: its tombstone.
    if caps.previews {
        let mut options = PreviewOptions::default();
        options.port = 8080;
        sandbox.expose_port(options).await.expect("expose");
        let vr = sandbox.preview_reference(8080).unwrap();
        match client.reopen(&vr).await.expect("reopen") {
            Reopened::Preview(p) => assert_eq!(p.port, 8080),
            other => panic!("{other:?}"),
        }
        sandbox.close_preview(8080).await.expect("close");
        assert_destroyed(
            client.reopen(&vr).await,
            "preview",
            &format!("{id}:8080"),
            "closed",
        );
    }

    // A snapshot, deleted: its tombstone. An id of another kind is a conflict.
    let as_snapshot = Reference::snapshot(&runtime, &id).unwrap();
    if caps.snapshots {
        let snap = sandbox.snapshot(None).await.expect("snapshot");
        let sr = client.snapshot_reference(&snap).await.unwrap();
        match client.reopen(&sr).await.expect("reopen") {
            Reopened::Snapshot(s) => assert_eq!(s.id, snap.id),
            other => panic!("{other:?}"),
        }
        match client.reopen(&as_snapshot).await {
            Err(Error::Conflict { what }) => assert!(what.contains("is a sandbox"), "{what}"),
            other => panic!("expected Conflict, got {other:?}"),
        }
        client.delete_snapshot(&snap.id).await.expect("delete");
        assert_destroyed(client.reopen(&sr).await, "snapshot", &snap.id, "deleted");
    } else {
        let e = client.reopen(&as_snapshot).await.unwrap_err();
        assert_eq!(e.code(), ErrorCode::NotSupported, "{e:?}");
    }

    // A volume, deleted: its tombstone.
    if caps.volumes {
        let name = format!("refs-{}", crate::random_id(12));
        let vol = client.create_volume(&name).await.expect("volume");
        let vr = client.volume_reference(&vol).await.unwrap();
        match client.reopen(&vr).await.expect("reopen") {
            Reopened::Volume(v) => assert_eq!(v.name, name),
            other => panic!("{other:?}"),
        }
        client.delete_volume(&name).await.expect("delete");
        assert_destroyed(client.reopen(&vr).await, "volume", &name, "deleted");
    }

    // The sandbox, destroyed: its tombstone, also for what lived in it; and never NotFound.
    sandbox.destroy().await.expect("destroy");
    assert_destroyed(client.reopen(&saved).await, "sandbox", &id, "destroyed");
    assert_destroyed(client.reopen(&pr).await, "sandbox", &id, "destroyed");
    assert!(client
        .reopen_sandbox(&saved)
        .await
        .unwrap_err()
        .is_destroyed());
    match client.reopen_sandbox(&pr).await {
        Err(Error::Conflict { .. }) => {}
        other => panic!("a process reference is not a sandbox: {other:?}"),
    }
}

/// A sandbox whose lease ended leaves a tombstone saying so.
pub async fn references_to_a_sandbox_whose_lease_ended_are_destroyed(client: crate::Client) {
    let mut options = test_options(&unique("refs-lease"));
    options.timeout = Some(Duration::from_secs(1));
    let sandbox = client.create(options).await.expect("create");
    let r = sandbox.reference().expect("reference");
    let id = sandbox.id().to_string();
    eventually(Duration::from_secs(30), "the lease ends", || {
        let client = client.clone();
        let id = id.clone();
        async move {
            match client.backend().get(&id).await {
                Err(e) if e.is_not_found() => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
    assert_destroyed(client.reopen(&r).await, "sandbox", &id, "its lease ended");
}

/// Reopen only reads: a paused sandbox (even one that resumes on any request) stays paused
/// with the same lease, and a process in it is not looked up by waking it.
pub async fn reopen_never_resumes_or_extends(client: crate::Client) {
    use crate::Reopened;
    let caps = client.ready().await.expect("capabilities");
    let mut options = test_options(&unique("refs-paused"));
    options.auto_resume = caps.pause;
    let sandbox = client.create(options).await.expect("create");
    let handle = sandbox.spawn("sleep 300").await.expect("spawn");
    let pr = handle.reference().expect("process reference");
    let r = sandbox.reference().expect("reference");
    if caps.pause {
        sandbox.pause().await.expect("pause");
    }
    let before = sandbox.info().await.expect("info");
    let expected = if caps.pause {
        SandboxState::Paused
    } else {
        SandboxState::Running
    };
    assert_eq!(before.state, expected);
    match client.reopen(&r).await.expect("reopen") {
        Reopened::Sandbox(info) => {
            assert_eq!(info.state, expected);
            assert_eq!(info.ends_at, before.ends_at, "the lease is unchanged");
        }
        other => panic!("{other:?}"),
    }
    let process = client.reopen(&pr).await;
    if caps.pause {
        match process {
            Err(crate::Error::InvalidState { state, .. }) => assert_eq!(state, "paused"),
            other => panic!("a paused sandbox's process: {other:?}"),
        }
    } else {
        assert!(matches!(process, Ok(Reopened::Process(_))), "{process:?}");
    }
    let after = sandbox.info().await.expect("info");
    assert_eq!(after.state, expected, "reopen woke the sandbox");
    assert_eq!(after.ends_at, before.ends_at, "reopen moved the lease");
    sandbox.destroy().await.expect("destroy");
}
