//! The conformance cases that have a meaning in every vendor's SDK, run through each facade.
//!
//! `sandcove_conformance` proves each backend behaves; these cases prove each facade
//! translates that behaviour the same way: what a command prints and returns, how envs and the
//! working directory reach it, what a file holds after a round trip between the file API and a
//! process, how directories are listed, what a missing file or sandbox raises. Each facade
//! implements [`Facade`] with its vendor's own calls (in `src/bin/facade_*.rs`); [`run_all`]
//! prints one line per case, and the test compares that with one expected file shared by the
//! three facades, on the embedded engine and over HTTP.

use async_trait::async_trait;

/// What a command left behind, as the vendor's SDK reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exec {
    /// The exit code.
    pub exit_code: i64,
    /// Standard output (Daytona reports stdout and stderr combined, in the order written).
    pub stdout: String,
    /// Standard error, where the vendor reports it apart from stdout.
    pub stderr: Option<String>,
}

/// How a vendor call failed, in the terms the cases care about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The vendor's not-found error (the file or sandbox does not exist).
    NotFound(String),
    /// Any other error, with the facade's message.
    Other(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::NotFound(m) => write!(f, "not found: {m}"),
            Failure::Other(m) => write!(f, "{m}"),
        }
    }
}

/// A facade's answer.
pub type Outcome<T> = std::result::Result<T, Failure>;

/// One vendor facade, seen through the calls every sandbox SDK has. Paths are absolute
/// sandbox paths; the facade passes them to its vendor calls unchanged.
#[async_trait]
pub trait Facade: Sync {
    /// The vendor's sandbox handle.
    type Sandbox: Send + Sync;
    /// Creates a sandbox whose processes all see `envs`.
    async fn create(&self, envs: &[(&str, &str)]) -> Outcome<Self::Sandbox>;
    /// The id (or name) the vendor's get/list/delete calls take.
    fn id(&self, sandbox: &Self::Sandbox) -> String;
    /// Whether the vendor's get call finds the sandbox (its not-found error is `Ok(false)`).
    async fn exists(&self, id: &str) -> Outcome<bool>;
    /// Whether the vendor's list call shows the sandbox.
    async fn listed(&self, id: &str) -> Outcome<bool>;
    /// Ends the sandbox.
    async fn kill(&self, sandbox: &Self::Sandbox) -> Outcome<()>;
    /// Runs a shell command to its end, in `cwd` when given, with `envs` added.
    async fn exec(
        &self,
        sandbox: &Self::Sandbox,
        command: &str,
        cwd: Option<&str>,
        envs: &[(&str, &str)],
    ) -> Outcome<Exec>;
    /// Writes a file (binary-safe), creating what the vendor's call creates.
    async fn write(&self, sandbox: &Self::Sandbox, path: &str, data: &[u8]) -> Outcome<()>;
    /// Reads a file (binary-safe).
    async fn read(&self, sandbox: &Self::Sandbox, path: &str) -> Outcome<Vec<u8>>;
    /// Makes a directory.
    async fn mkdir(&self, sandbox: &Self::Sandbox, path: &str) -> Outcome<()>;
    /// The names directly inside a directory, sorted.
    async fn list(&self, sandbox: &Self::Sandbox, path: &str) -> Outcome<Vec<String>>;
    /// Renames a file; `Ok(false)` when the vendor's SDK has no such call.
    async fn rename(&self, sandbox: &Self::Sandbox, from: &str, to: &str) -> Outcome<bool>;
    /// Removes a file.
    async fn remove(&self, sandbox: &Self::Sandbox, path: &str) -> Outcome<()>;
}

/// A case's verdict: `Err` says what was seen instead.
type Verdict = std::result::Result<(), String>;

fn check(ok: bool, seen: impl std::fmt::Debug) -> Verdict {
    if ok {
        Ok(())
    } else {
        Err(format!("saw {seen:?}"))
    }
}

fn failed(e: Failure) -> String {
    format!("call failed: {e}")
}

/// Runs every case through `facade`, printing `case: ok` or `case: FAILED …` per line;
/// returns whether all passed. Cases share one sandbox except the lifecycle case.
pub async fn run_all<F: Facade>(facade: &F) -> bool {
    let mut all_ok = true;
    let mut report = |case: &str, verdict: Verdict| {
        match &verdict {
            Ok(()) => println!("{case}: ok"),
            Err(why) => println!("{case}: FAILED {why}"),
        }
        all_ok &= verdict.is_ok();
    };

    report("lifecycle", lifecycle(facade).await);

    let sandbox = match facade.create(&[("SANDBOX_LEVEL", "from-create")]).await {
        Ok(s) => s,
        Err(e) => {
            report("create", Err(failed(e)));
            return false;
        }
    };
    report(
        "exit codes and streams",
        exit_codes_and_streams(facade, &sandbox).await,
    );
    report("envs", envs(facade, &sandbox).await);
    report(
        "working directory",
        working_directory(facade, &sandbox).await,
    );
    report(
        "files and processes see the same bytes",
        files_and_processes_agree(facade, &sandbox).await,
    );
    report("directories", directories(facade, &sandbox).await);
    report("missing file", missing_file(facade, &sandbox).await);
    report("large output", large_output(facade, &sandbox).await);
    if let Err(e) = facade.kill(&sandbox).await {
        report("kill", Err(failed(e)));
    }
    all_ok
}

/// Create, find by get and list, kill, then neither finds it.
async fn lifecycle<F: Facade>(facade: &F) -> Verdict {
    let sandbox = facade.create(&[]).await.map_err(failed)?;
    let id = facade.id(&sandbox);
    let seen = (
        facade.exists(&id).await.map_err(failed)?,
        facade.listed(&id).await.map_err(failed)?,
    );
    check(seen == (true, true), ("before kill", seen))?;
    facade.kill(&sandbox).await.map_err(failed)?;
    let seen = (
        facade.exists(&id).await.map_err(failed)?,
        facade.listed(&id).await.map_err(failed)?,
    );
    check(seen == (false, false), ("after kill", seen))
}

/// A failing command's exit code and both streams reach the caller.
async fn exit_codes_and_streams<F: Facade>(facade: &F, sandbox: &F::Sandbox) -> Verdict {
    let out = facade
        .exec(sandbox, "echo out; echo err >&2; exit 3", None, &[])
        .await
        .map_err(failed)?;
    check(out.exit_code == 3, &out)?;
    match &out.stderr {
        Some(stderr) => check(out.stdout == "out\n" && stderr == "err\n", &out),
        // Combined in the order written.
        None => check(out.stdout == "out\nerr\n", &out),
    }?;
    let ok = facade
        .exec(sandbox, "true", None, &[])
        .await
        .map_err(failed)?;
    check(ok.exit_code == 0, &ok)
}

/// Envs given at create reach every command; a command's own envs add to and override them.
async fn envs<F: Facade>(facade: &F, sandbox: &F::Sandbox) -> Verdict {
    let out = facade
        .exec(sandbox, "echo \"$SANDBOX_LEVEL\"", None, &[])
        .await
        .map_err(failed)?;
    check(out.stdout == "from-create\n", &out)?;
    let out = facade
        .exec(
            sandbox,
            "echo \"$SANDBOX_LEVEL $COMMAND_LEVEL\"",
            None,
            &[
                ("SANDBOX_LEVEL", "overridden"),
                ("COMMAND_LEVEL", "it's $HOME"),
            ],
        )
        .await
        .map_err(failed)?;
    // Values are literal: no quoting or expansion on the way in.
    check(out.stdout == "overridden it's $HOME\n", &out)
}

/// A command runs in the directory asked for.
async fn working_directory<F: Facade>(facade: &F, sandbox: &F::Sandbox) -> Verdict {
    facade
        .mkdir(sandbox, "/tmp/work dir")
        .await
        .map_err(failed)?;
    let out = facade
        .exec(sandbox, "pwd", Some("/tmp/work dir"), &[])
        .await
        .map_err(failed)?;
    check(out.stdout == "/tmp/work dir\n", &out)
}

/// Every byte value survives the file API, and a process sees exactly what was written (and
/// the file API exactly what a process wrote).
async fn files_and_processes_agree<F: Facade>(facade: &F, sandbox: &F::Sandbox) -> Verdict {
    let every_byte: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
    facade
        .write(sandbox, "/tmp/bytes.bin", &every_byte)
        .await
        .map_err(failed)?;
    let back = facade
        .read(sandbox, "/tmp/bytes.bin")
        .await
        .map_err(failed)?;
    check(back == every_byte, ("read back", back.len()))?;
    let out = facade
        .exec(
            sandbox,
            "od -An -v -tx1 /tmp/bytes.bin | tr -d ' \\n'",
            None,
            &[],
        )
        .await
        .map_err(failed)?;
    let hex: String = every_byte.iter().map(|b| format!("{b:02x}")).collect();
    check(out.stdout == hex, ("the process sees", &out))?;
    facade
        .exec(
            sandbox,
            "printf 'from a process\\000\\377' > /tmp/by-process.bin",
            None,
            &[],
        )
        .await
        .map_err(failed)?;
    let read = facade
        .read(sandbox, "/tmp/by-process.bin")
        .await
        .map_err(failed)?;
    check(read == b"from a process\0\xff", read)
}

/// Make a directory, list it, rename and remove inside it.
async fn directories<F: Facade>(facade: &F, sandbox: &F::Sandbox) -> Verdict {
    facade.mkdir(sandbox, "/tmp/tree").await.map_err(failed)?;
    facade
        .write(sandbox, "/tmp/tree/a.txt", b"a")
        .await
        .map_err(failed)?;
    facade
        .mkdir(sandbox, "/tmp/tree/sub")
        .await
        .map_err(failed)?;
    let names = facade.list(sandbox, "/tmp/tree").await.map_err(failed)?;
    check(names == ["a.txt", "sub"], ("listed", &names))?;
    let file = if facade
        .rename(sandbox, "/tmp/tree/a.txt", "/tmp/tree/b.txt")
        .await
        .map_err(failed)?
    {
        let names = facade.list(sandbox, "/tmp/tree").await.map_err(failed)?;
        check(names == ["b.txt", "sub"], ("after rename", &names))?;
        "/tmp/tree/b.txt"
    } else {
        "/tmp/tree/a.txt"
    };
    facade.remove(sandbox, file).await.map_err(failed)?;
    let names = facade.list(sandbox, "/tmp/tree").await.map_err(failed)?;
    check(names == ["sub"], ("after remove", &names))
}

/// Reading a file that is not there is the vendor's not-found error, and creates nothing.
async fn missing_file<F: Facade>(facade: &F, sandbox: &F::Sandbox) -> Verdict {
    match facade.read(sandbox, "/tmp/not-there.txt").await {
        Err(Failure::NotFound(_)) => {}
        other => return Err(format!("expected not found, saw {other:?}")),
    }
    let names = facade.list(sandbox, "/tmp").await.map_err(failed)?;
    check(!names.iter().any(|n| n == "not-there.txt"), names)
}

/// A mebibyte of output arrives whole.
async fn large_output<F: Facade>(facade: &F, sandbox: &F::Sandbox) -> Verdict {
    let out = facade
        .exec(sandbox, "head -c 1048576 /dev/zero | tr '\\0' x", None, &[])
        .await
        .map_err(failed)?;
    check(
        out.exit_code == 0 && out.stdout.len() == 1 << 20 && out.stdout.bytes().all(|b| b == b'x'),
        (out.exit_code, out.stdout.len()),
    )
}
