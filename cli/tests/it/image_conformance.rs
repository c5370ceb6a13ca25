//! The conformance cases on an image sandbox: the same cases the host base passes
//! (`core/tests`), run on a real Debian image built by the test from Debian's packages
//! ([`debian_rootfs`]) and imported into an engine's store, embedded and over HTTP. A create
//! that names no template gets that image (a [`Layer`] over the engine sets it), so every
//! sandbox a case makes runs the image's root.
//!
//! Left out, with why: the lease-, annotation- and reference-only cases (they never touch a
//! root, so they say nothing more here than on the host base); and
//! `system_directories_are_read_only`: an image's `/usr` is the sandbox's own, writable by
//! its root through the sandbox's writable layer, as on the vendors' images (the host base's
//! system directories are the host's, read-only).
//!
//! Where the image cannot be built (no `mmdebstrap`, no route to Debian's mirror), each case
//! says SKIP loudly and passes, as the Debian image test does.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use sandcove_conformance::images::ImageBuilder;
use sandcove_conformance::sandcove::{self, Backend, CreateOptions, Layer, SandboxInfo};

use crate::images::{debian_rootfs, import, DEBIAN_SUITE};

/// An engine's backend whose creates run `image` unless they name a template or a snapshot.
#[derive(Debug)]
struct OnImage {
    inner: Arc<dyn Backend>,
    image: String,
}

#[async_trait::async_trait]
impl Layer for OnImage {
    fn inner(&self) -> &dyn Backend {
        &*self.inner
    }

    async fn create(&self, mut options: CreateOptions) -> sandcove::Result<SandboxInfo> {
        if options.template.is_none() && options.snapshot.is_none() {
            options.template = Some(self.image.clone());
        }
        let info = self.inner.create(options).await?;
        assert_eq!(info.template, self.image, "the sandbox runs the image");
        Ok(info)
    }
}

/// The state directory holding the imported Debian image and its reference, once per user
/// and image (kept: a fixed, short directory under the temp dir, reused by later runs, its
/// sandboxes each destroyed by its case or at its lease); `Err` with why it cannot be built.
fn image_state() -> &'static Result<(PathBuf, String), String> {
    static STATE: OnceLock<Result<(PathBuf, String), String>> = OnceLock::new();
    STATE.get_or_init(|| {
        use std::os::unix::fs::MetadataExt;
        let rootfs = debian_rootfs()?;
        let layer = std::fs::read(&rootfs).map_err(|e| format!("the rootfs tar: {e}"))?;
        let image = ImageBuilder::new()
            .layer_tar(layer, false)
            .env("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
            .cmd(&["/bin/bash"])
            .build();
        let uid = std::fs::metadata("/proc/self")
            .map_err(|e| e.to_string())?
            .uid();
        let digest = image.digest();
        let short = &digest[digest.len() - 8..];
        let dir = std::env::temp_dir().join(format!("sc-imgconf-{uid}-{short}"));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let reference = format!("test.local/debian-conformance:{DEBIAN_SUITE}");
        import(&dir, &image, &reference);
        Ok((dir, reference))
    })
}

/// The engine on the image's state directory, or `None` (SKIP said) where it cannot be built.
fn engine(case: &str) -> Option<(Arc<dyn Backend>, String)> {
    match image_state() {
        Ok((dir, reference)) => {
            let engine = sandcove::LocalBackend::with_state_dir(dir)
                .expect("the engine on the image's state directory")
                .with_warm_pool(0);
            Some((Arc::new(engine), reference.clone()))
        }
        Err(reason) => {
            eprintln!("SKIP: no Debian image could be built here, {case} did not run on an image: {reason}");
            None
        }
    }
}

macro_rules! on_image {
    ($($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let Some((engine, image)) = super::engine(stringify!($case)) else {
                    return;
                };
                let backend = wrap(engine, image).await;
                sandcove_conformance::$case(&*backend).await;
            }
        )*
    };
}

/// The image's engine, embedded.
mod embedded {
    use super::*;

    /// The engine itself, under the image layer.
    async fn wrap(engine: Arc<dyn Backend>, image: String) -> Arc<dyn Backend> {
        Arc::new(OnImage {
            inner: engine,
            image,
        })
    }

    on_image!(
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
        destroy_ends_background_processes,
        limits_are_applied,
        sandbox_sees_only_its_own_processes,
        pause_stops_and_resume_continues,
        previews_serve_and_guard_private_ports,
        snapshots_and_fork_copy_files_not_processes,
        volumes_outlive_sandboxes,
        watch_reports_changes,
        pty_processes,
        metrics_report_usage,
        stop_ends_processes_keeps_files_and_start_runs_again,
        file_urls_move_one_file_outside_the_sandbox,
    );
}

/// The image's engine over HTTP: a loopback server on it, the image layer on the client.
mod over_http {
    use super::*;

    /// A client of a loopback server serving the engine, under the image layer.
    async fn wrap(engine: Arc<dyn Backend>, image: String) -> Arc<dyn Backend> {
        let client = sandcove_conformance::served(engine).await;
        Arc::new(OnImage {
            inner: Arc::new(client),
            image,
        })
    }

    on_image!(
        argv_and_shell_commands,
        sandbox_and_process_envs,
        default_user_and_home,
        running_as_another_user,
        stdin_write_and_close,
        signals_and_kill_mid_stream,
        file_round_trip_and_metadata,
        directory_operations,
        file_api_cannot_escape,
        pause_stops_and_resume_continues,
        previews_serve_and_guard_private_ports,
        snapshots_and_fork_copy_files_not_processes,
        watch_reports_changes,
        pty_processes,
        stop_ends_processes_keeps_files_and_start_runs_again,
    );
}
