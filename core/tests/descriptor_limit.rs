//! An engine raises its program's soft descriptor limit, so one program can hold as many
//! sandboxes as the hard limit allows (issue 18's 1,000-sandbox rows failed rootless at the
//! usual soft limit of 1024). Its own test binary: it changes a process-wide limit.

#![cfg(all(target_os = "linux", feature = "local"))]

fn nofile() -> (u64, u64) {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: rl is a valid, writable rlimit value.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) }, 0);
    (rl.rlim_cur, rl.rlim_max)
}

/// An engine's state directory, removed however the test ends.
struct StateDir(std::path::PathBuf);

impl Drop for StateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn an_engine_raises_the_soft_descriptor_limit_to_the_hard_one() {
    let (_, hard) = nofile();
    assert!(hard > 64, "the hard limit ({hard}) leaves nothing to test");
    let lowered = libc::rlimit {
        rlim_cur: 64,
        rlim_max: hard,
    };
    // SAFETY: lowered is a valid rlimit value with rlim_cur <= rlim_max.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lowered) }, 0);
    assert_eq!(nofile(), (64, hard));

    let dir =
        StateDir(std::env::temp_dir().join(format!("sandcove-nofile-{}", std::process::id())));
    let _engine = sandcove::LocalBackend::with_state_dir(&dir.0).expect("an engine");
    assert_eq!(nofile(), (hard, hard), "the soft limit was not raised");
}
