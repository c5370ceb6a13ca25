//! Processes from a terminal: `exec`, `shell`, `logs`, `ps`.

use std::future::IntoFuture;
use std::io::Write;
use std::os::fd::AsFd;

use clap::Args;
use sandcove::{
    Command, ExitStatus, ProcessEvent, ProcessHandle, ProcessSelector, ProcessSpec, PtySize,
};
use serde_json::json;

use crate::out::{self, Failure, Outcome};

/// `sandcove exec`.
#[derive(Debug, Args)]
pub struct ExecArgs {
    /// The sandbox.
    pub id: String,
    /// Give the process a terminal (its stdout and stderr arrive merged; with a terminal on
    /// this side, it is put in raw mode and resizes follow).
    #[arg(short = 't', long)]
    pub tty: bool,
    /// Working directory inside the sandbox.
    #[arg(short = 'w', long)]
    pub cwd: Option<String>,
    /// An environment variable for the process (KEY=VALUE; repeatable).
    #[arg(short = 'e', long = "env", value_name = "KEY=VALUE")]
    pub envs: Vec<String>,
    /// Run as this user.
    #[arg(short = 'u', long)]
    pub user: Option<String>,
    /// Tag the process (find it again with `sandcove logs ID TAG`).
    #[arg(long)]
    pub tag: Option<String>,
    /// The command and its arguments (run as given, no shell).
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// `sandcove logs`.
#[derive(Debug, Args)]
pub struct LogsArgs {
    /// The sandbox.
    pub id: String,
    /// The process: its pid, or the tag it was started with.
    pub process: String,
    /// Keep following the output until the process ends.
    #[arg(short = 'f', long)]
    pub follow: bool,
}

/// The exit status a command ends with for a process that ended with `status`: its code, or
/// 128 + the signal number (as shells report it).
pub fn exit_byte(status: &ExitStatus) -> u8 {
    match (status.code, status.signal) {
        (Some(code), _) => u8::try_from(code.rem_euclid(256)).unwrap_or(1),
        (None, Some(signal)) => u8::try_from((128 + signal).min(255)).unwrap_or(255),
        (None, None) => 1,
    }
}

/// `sandcove exec ID -- CMD…`: stdin forwarded, stdout and stderr passed through, the exit
/// status passed on.
pub fn exec(args: ExecArgs, json: bool) -> Outcome {
    let mut spec = ProcessSpec::new(Command::argv(args.command));
    spec.cwd = args.cwd;
    spec.envs = out::parse_pairs("env", &args.envs)?;
    spec.user = args.user;
    spec.tag = args.tag;
    spec.stdin = !json;
    if args.tty {
        spec.pty = Some(terminal_size().unwrap_or(PtySize { cols: 80, rows: 24 }));
    }
    let client = out::client()?;
    let sandbox = client.sandbox(args.id);
    let runtime = out::runtime()?;
    if json {
        // Collected, then one JSON document; no stdin.
        let output = runtime.block_on(sandbox.run(spec).into_future())?;
        let status = output.exit_status();
        out::print_json(&json!({
            "pid": output.pid,
            "exit": status,
            "stdout": String::from_utf8_lossy(&output.stdout),
            "stderr": String::from_utf8_lossy(&output.stderr),
            "truncated": output.truncated,
        }))?;
        return Ok(exit_byte(&status));
    }
    runtime.block_on(async {
        let handle = sandbox.spawn(spec).await?;
        interact(handle, args.tty).await
    })
}

/// `sandcove shell ID`: an interactive login shell on a terminal.
pub fn shell(id: &str) -> Outcome {
    let mut spec = ProcessSpec::new(Command::sh(
        "if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi",
    ));
    spec.stdin = true;
    spec.pty = Some(terminal_size().unwrap_or(PtySize { cols: 80, rows: 24 }));
    let client = out::client()?;
    let sandbox = client.sandbox(id);
    out::runtime()?.block_on(async {
        let handle = sandbox.spawn(spec).await?;
        interact(handle, true).await
    })
}

/// The size of the terminal on stdin, if stdin is one.
fn terminal_size() -> Option<PtySize> {
    let size = rustix::termios::tcgetwinsize(std::io::stdin().as_fd()).ok()?;
    (size.ws_col > 0 && size.ws_row > 0).then_some(PtySize {
        cols: size.ws_col,
        rows: size.ws_row,
    })
}

/// Raw mode on this side's terminal for as long as it lives; the previous mode comes back
/// on drop (also when the command fails).
struct RawMode {
    saved: rustix::termios::Termios,
}

impl RawMode {
    fn enter() -> Option<RawMode> {
        let stdin = std::io::stdin();
        let saved = rustix::termios::tcgetattr(stdin.as_fd()).ok()?;
        let mut raw = saved.clone();
        raw.make_raw();
        rustix::termios::tcsetattr(stdin.as_fd(), rustix::termios::OptionalActions::Now, &raw)
            .ok()?;
        Some(RawMode { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = rustix::termios::tcsetattr(
            std::io::stdin().as_fd(),
            rustix::termios::OptionalActions::Now,
            &self.saved,
        );
    }
}

/// Forward this side's stdin to the process, its output to this side, and (with a pty)
/// window size changes; the process's exit status as the command's.
async fn interact(mut handle: ProcessHandle, pty: bool) -> Outcome {
    let raw = if pty && out::stdin_is_tty() {
        RawMode::enter()
    } else {
        None
    };
    // Stdin is read on a thread of its own: a blocked terminal read must never hold up the
    // event loop, nor the exit once the process has ended.
    let (stdin_tx, mut stdin_rx) = tokio::sync::mpsc::channel::<Vec<u8>>(8);
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match std::io::Read::read(&mut std::io::stdin(), &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if stdin_tx.blocking_send(buf[..n].to_vec()).is_err() {
                        break;
                    }
                }
            }
        }
    });
    let mut winch = if pty {
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change()).ok()
    } else {
        None
    };
    let mut stdin_open = true;
    let mut stdout = std::io::stdout();
    let mut stderr = std::io::stderr();
    let status = loop {
        tokio::select! {
            event = handle.next_event() => match event {
                Some(Ok(ProcessEvent::Stdout(bytes))) => {
                    let _ = stdout.write_all(&bytes);
                    let _ = stdout.flush();
                }
                Some(Ok(ProcessEvent::Stderr(bytes))) => {
                    let _ = stderr.write_all(&bytes);
                    let _ = stderr.flush();
                }
                Some(Ok(ProcessEvent::Exit(status))) => break status,
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    drop(raw);
                    return Err(e.into());
                }
                None => {
                    drop(raw);
                    return Err(Failure::failed("the process's stream ended without an exit status"));
                }
            },
            chunk = stdin_rx.recv(), if stdin_open => match chunk {
                Some(bytes) => {
                    // A process that already closed its stdin is not an error here.
                    let _ = handle.write_stdin(bytes).await;
                }
                None => {
                    stdin_open = false;
                    if !pty {
                        let _ = handle.close_stdin().await;
                    }
                }
            },
            Some(()) = async { match winch.as_mut() { Some(s) => s.recv().await, None => None } } => {
                if let Some(size) = terminal_size() {
                    let _ = handle.resize_pty(size).await;
                }
            }
        }
    };
    drop(raw);
    Ok(exit_byte(&status))
}

/// `sandcove logs ID PID|TAG [-f]`: the output retained so far (and with `-f`, what follows
/// until the process ends).
pub fn logs(args: LogsArgs, json: bool) -> Outcome {
    let selector = match args.process.parse::<u32>() {
        Ok(pid) => ProcessSelector::Pid(pid),
        Err(_) => ProcessSelector::Tag(args.process),
    };
    let client = out::client()?;
    let sandbox = client.sandbox(args.id);
    out::runtime()?.block_on(async {
        let mut handle = sandbox.attach(selector).await?;
        let mut stdout = std::io::stdout();
        let mut stderr = std::io::stderr();
        let mut exit = None;
        while let Some(event) = handle.next_event().await {
            let (stream, bytes) = match event? {
                ProcessEvent::Stdout(bytes) => ("stdout", bytes),
                ProcessEvent::Stderr(bytes) => ("stderr", bytes),
                ProcessEvent::Live if !args.follow => {
                    // History ends here; an ended process's exit follows at once, but a
                    // running one's would block, so ask the process list instead.
                    if json {
                        let pid = handle.pid();
                        exit = sandbox
                            .processes()
                            .await?
                            .into_iter()
                            .find(|p| p.pid == pid)
                            .and_then(|p| p.exit);
                    }
                    break;
                }
                ProcessEvent::Exit(status) => {
                    exit = Some(status);
                    break;
                }
                _ => continue,
            };
            if json {
                let line = json!({"stream": stream, "data": String::from_utf8_lossy(&bytes)});
                let _ = writeln!(stdout, "{line}");
            } else if stream == "stdout" {
                let _ = stdout.write_all(&bytes);
            } else {
                let _ = stderr.write_all(&bytes);
            }
        }
        if let (true, Some(status)) = (json, exit) {
            let _ = writeln!(stdout, "{}", json!({ "exit": status }));
        }
        let _ = stdout.flush();
        Ok(0)
    })
}

/// `sandcove ps ID`: the processes started through the API.
pub fn ps(id: &str, json: bool) -> Outcome {
    let client = out::client()?;
    let mut list = out::runtime()?.block_on(async { client.sandbox(id).processes().await })?;
    list.sort_by_key(|p| p.pid);
    out::print_listing(
        json,
        &list,
        &["PID", "TAG", "STATE", "AGE", "COMMAND"],
        |p, now| {
            let state = match &p.exit {
                None => "running".to_string(),
                Some(status) => match (status.code, status.signal_name()) {
                    (Some(code), _) => format!("exited {code}"),
                    (None, Some(signal)) => format!("killed {signal}"),
                    (None, None) => "ended".into(),
                },
            };
            vec![
                p.pid.to_string(),
                p.tag.clone().unwrap_or_else(|| "-".into()),
                state,
                out::human_span(now.saturating_sub(p.started_at)),
                p.argv.join(" "),
            ]
        },
    )?;
    Ok(0)
}
