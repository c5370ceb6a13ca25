//! Sessions: one shell per session, state across commands, async commands with input.

use crate::common;

use std::sync::{Arc, Mutex};

use daytona::SessionExecuteRequest;

fn req(command: &str) -> SessionExecuteRequest {
    SessionExecuteRequest {
        command: command.into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn session_state_persists_and_output_is_kept_per_command() {
    let (_d, sb) = common::sandbox().await;
    let p = &sb.process;
    p.create_session("exec-session-1").await.unwrap();
    let s = p.get_session("exec-session-1").await.unwrap();
    assert_eq!(s.session_id, "exec-session-1");
    assert!(s.commands.is_empty());
    let dup = p.create_session("exec-session-1").await.unwrap_err();
    assert!(dup.is_conflict(), "{dup}");

    let c1 = p
        .execute_session_command("exec-session-1", req("export FOO=BAR"))
        .await
        .unwrap();
    assert_eq!(c1.exit_code, Some(0));
    let cmd = p
        .get_session_command("exec-session-1", &c1.cmd_id)
        .await
        .unwrap();
    assert_eq!(cmd.command, "export FOO=BAR");
    assert_eq!(cmd.exit_code, Some(0));

    p.execute_session_command("exec-session-1", req("mkdir -p sub && cd sub"))
        .await
        .unwrap();
    let c2 = p
        .execute_session_command(
            "exec-session-1",
            req("echo $FOO; pwd; echo oops >&2; false"),
        )
        .await
        .unwrap();
    assert_eq!(c2.stdout.as_deref(), Some("BAR\n/home/daytona/sub\n"));
    assert_eq!(c2.stderr.as_deref(), Some("oops\n"));
    assert_eq!(c2.exit_code, Some(1));
    let logs = p
        .get_session_command_logs("exec-session-1", &c2.cmd_id)
        .await
        .unwrap();
    assert_eq!(logs.stdout.as_deref(), Some("BAR\n/home/daytona/sub\n"));
    assert_eq!(logs.stderr.as_deref(), Some("oops\n"));

    // Binary output survives (invalid UTF-8 replaced only when decoded).
    let c3 = p
        .execute_session_command("exec-session-1", req("printf 'a\\0b\\n'; f() { echo fn; }"))
        .await
        .unwrap();
    assert_eq!(c3.stdout.as_deref(), Some("a\0b\n"));
    let c4 = p
        .execute_session_command("exec-session-1", req("f"))
        .await
        .unwrap();
    assert_eq!(c4.stdout.as_deref(), Some("fn\n"), "functions persist");

    // A synchronous command reads end-of-file on stdin.
    let c5 = p
        .execute_session_command("exec-session-1", req("cat; echo after"))
        .timeout(20)
        .await
        .unwrap();
    assert_eq!(c5.stdout.as_deref(), Some("after\n"));

    let sessions = p.list_sessions().await.unwrap();
    assert_eq!(sessions.len(), 1);
    assert_eq!(sessions[0].commands.len(), 6);

    p.delete_session("exec-session-1").await.unwrap();
    assert!(p
        .get_session("exec-session-1")
        .await
        .unwrap_err()
        .is_not_found());
    assert!(p.list_sessions().await.unwrap().is_empty());
    let missing = p
        .execute_session_command("nope", req("true"))
        .await
        .unwrap_err();
    assert!(missing.is_not_found());
    assert!(missing
        .to_string()
        .starts_with("Failed to execute session command: "));
    sb.delete().await.unwrap();
}

#[tokio::test]
async fn async_commands_stream_logs_and_take_input() {
    let (_d, sb) = common::sandbox().await;
    let p = &sb.process;
    p.create_session("s2").await.unwrap();
    let cmd = p
        .execute_session_command(
            "s2",
            SessionExecuteRequest {
                command: "printf 'Enter your name: \\n' && read name && printf 'Hello, %s\\n' \"$name\"; \
                          echo bad >&2; exit_code_is=7; (exit 7)"
                    .into(),
                run_async: Some(true),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(cmd.exit_code, None);
    assert_eq!(cmd.output, None);
    assert_eq!(
        p.get_session_command("s2", &cmd.cmd_id)
            .await
            .unwrap()
            .exit_code,
        None,
        "still waiting for input"
    );

    let out = Arc::new(Mutex::new(String::new()));
    let err = Arc::new(Mutex::new(String::new()));
    let (o, e) = (out.clone(), err.clone());
    let follower = {
        let p = p.clone();
        let id = cmd.cmd_id.clone();
        tokio::spawn(async move {
            p.get_session_command_logs_async(
                "s2",
                &id,
                move |s| o.lock().unwrap().push_str(s),
                move |s| e.lock().unwrap().push_str(s),
            )
            .await
        })
    };
    p.send_session_command_input("s2", &cmd.cmd_id, "Alice")
        .await
        .unwrap();
    follower.await.unwrap().unwrap();
    assert_eq!(*out.lock().unwrap(), "Enter your name: \nHello, Alice\n");
    assert_eq!(*err.lock().unwrap(), "bad\n");
    let done = p.get_session_command("s2", &cmd.cmd_id).await.unwrap();
    assert_eq!(done.exit_code, Some(7));
    let late = p
        .send_session_command_input("s2", &cmd.cmd_id, "again")
        .await
        .unwrap_err();
    assert!(late.is_validation(), "{late}");

    // Another program rebuilds the history by attaching to the session shell.
    daytona::process::forget_sessions();
    let d2 = common::daytona();
    let again = d2.get(sb.id.clone()).await.unwrap();
    let logs = again
        .process
        .get_session_command_logs("s2", &cmd.cmd_id)
        .await
        .unwrap();
    assert_eq!(
        logs.stdout.as_deref(),
        Some("Enter your name: \nHello, Alice\n")
    );
    assert_eq!(logs.stderr.as_deref(), Some("bad\n"));
    let session = again.process.get_session("s2").await.unwrap();
    assert_eq!(session.commands.len(), 1);
    assert_eq!(session.commands[0].exit_code, Some(7));
    assert!(session.commands[0]
        .command
        .starts_with("printf 'Enter your name"));
    let next = again
        .process
        .execute_session_command("s2", req("echo $name"))
        .await
        .unwrap();
    assert_eq!(next.stdout.as_deref(), Some("Alice\n"));
    sb.delete().await.unwrap();
}
