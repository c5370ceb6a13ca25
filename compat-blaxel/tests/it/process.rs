//! `sandbox.process` against the real embedded engine.

use std::sync::{Arc, Mutex};

use crate::common::{sandbox, unique};
use blaxel::{ProcessRequest, ProcessResponseStatus, SandboxInstance};
use sandcove_conformance::{equals, eventually, PATIENCE};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_waits_and_reports_like_blaxel() {
    let sb = sandbox("exec").await;
    let p = sb
        .process
        .exec(json!({"name": "hello-process", "command": "echo 'Hello, World!'", "wait_for_completion": true}))
        .await
        .expect("exec");
    assert_eq!(p.name, "hello-process");
    assert_eq!(p.status, "completed");
    assert_eq!(p.exit_code, 0);
    assert_eq!(p.logs, "Hello, World!\n");
    assert_eq!(p.stdout, "Hello, World!\n");
    assert_eq!(p.command, "echo 'Hello, World!'");
    assert_eq!(p.working_dir, "");
    assert!(p.started_at.ends_with(" GMT"), "{}", p.started_at);
    assert!(p
        .completed_at
        .as_deref()
        .is_some_and(|c| c.ends_with(" GMT")));
    assert!(p.pid.parse::<u32>().is_ok());

    let p = sb
        .process
        .exec(json!({"command": "exit 42", "wait_for_completion": true}))
        .await
        .expect("exec");
    assert_eq!(p.exit_code, 42);
    assert_eq!(p.status, ProcessResponseStatus::Failed);
    assert!(
        p.name.starts_with("proc-") && p.name.len() == 13,
        "{}",
        p.name
    );

    let p = sb
        .process
        .exec(json!({"command": "echo out; echo 'stderr output' >&2", "waitForCompletion": true}))
        .await
        .expect("exec");
    assert_eq!(p.stdout, "out\n");
    assert_eq!(p.stderr, "stderr output\n");
    assert_eq!(p.logs, "out\nstderr output\n");

    sb.fs.mkdir("/tmp/workdir").await.expect("mkdir");
    let p = sb
        .process
        .exec(ProcessRequest {
            command: "pwd; echo $HOME; whoami".into(),
            working_dir: Some("/tmp/workdir".into()),
            wait_for_completion: Some(true),
            ..Default::default()
        })
        .await
        .expect("exec");
    assert_eq!(p.logs, "/tmp/workdir\n/blaxel\nroot\n");
    assert_eq!(p.working_dir, "/tmp/workdir");
    let p = sb
        .process
        .exec(json!({"command": "pwd", "wait_for_completion": true}))
        .await
        .expect("exec");
    assert_eq!(p.logs, "/blaxel\n", "the default working dir is /blaxel");

    let err = sb
        .process
        .exec(json!({"command": "pwd", "working_dir": "/no/such/dir"}))
        .await
        .expect_err("missing working dir");
    assert_eq!(err.status_code(), Some(422));
    assert!(err.to_string().contains("does not exist"), "{err}");
    let err = sb
        .process
        .exec(json!({"command": "true", "cwd": "/"}))
        .await
        .expect_err("unknown key");
    assert!(matches!(err, blaxel::SandboxAPIError::ValueError { .. }));
    sb.delete().await.expect("delete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envs_from_sandbox_and_process() {
    let name = unique("envs");
    let sb = SandboxInstance::create(json!({
        "name": name, "ttl": "5m",
        "envs": [{"name": "NODE_ENV", "value": "test"}, {"name": "DEBUG", "value": "true"}],
    }))
    .await
    .expect("create");
    let p = sb
        .process
        .exec(json!({"command": "echo $NODE_ENV $DEBUG", "wait_for_completion": true}))
        .await
        .unwrap();
    assert_eq!(p.logs, "test true\n");
    let p = sb
        .process
        .exec(json!({"command": "echo $NODE_ENV $FOO", "env": {"FOO": "bar", "NODE_ENV": "x"}, "wait_for_completion": true}))
        .await
        .unwrap();
    assert_eq!(p.logs, "x bar\n");
    // Another client (a fresh lookup) sees the same sandbox envs.
    let again = SandboxInstance::get(&name).await.unwrap();
    let p = again
        .process
        .exec(json!({"command": "echo $NODE_ENV", "wait_for_completion": true}))
        .await
        .unwrap();
    assert_eq!(p.logs, "test\n");
    sb.delete().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_processes_by_name_get_list_stop_kill_wait() {
    let sb = sandbox("bg").await;
    let p = sb
        .process
        .exec(json!({"name": "long-running", "command": "sleep 30"}))
        .await
        .expect("exec");
    assert_eq!(p.status, "running");
    assert_eq!(p.exit_code, 0);
    assert_eq!(p.completed_at.as_deref(), Some(""));
    // A running name cannot be taken.
    let err = sb
        .process
        .exec(json!({"name": "long-running", "command": "true"}))
        .await
        .expect_err("name taken");
    assert_eq!(err.status_code(), Some(400));
    assert!(err.to_string().contains("already exists and is running"));
    // Found by name from another client.
    let other = SandboxInstance::get(&sb.metadata.name).await.unwrap();
    let got = other.process.get("long-running").await.expect("get");
    assert_eq!(got.status, "running");
    assert_eq!(got.pid, p.pid);
    assert_eq!(
        other.process.get(&p.pid).await.unwrap().name,
        "long-running"
    );
    let err = sb
        .process
        .wait("long-running")
        .max_wait(300)
        .interval(100)
        .await
        .expect_err("not finished");
    assert_eq!(err.to_string(), "Process did not finish in time");
    other.process.kill("long-running").await.expect("kill");
    let got = sb
        .process
        .wait("long-running")
        .interval(50)
        .await
        .expect("wait");
    assert_eq!(got.status, "killed");
    assert_eq!(got.exit_code, -1);
    assert!(sb
        .process
        .kill("long-running")
        .await
        .unwrap_err()
        .is_not_found());

    sb.process
        .exec(json!({"name": "stoppable", "command": "sleep 30"}))
        .await
        .unwrap();
    let msg = sb.process.stop("stoppable").await.expect("stop");
    assert_eq!(msg.message, "Process stopped successfully");
    let got = sb.process.wait("stoppable").interval(50).await.unwrap();
    assert_eq!(got.status, "stopped");

    sb.process
        .exec(json!({"name": "done", "command": "echo fin", "wait_for_completion": true}))
        .await
        .unwrap();
    let listed = sb.process.list().await.expect("list");
    let names: Vec<&str> = listed.iter().map(|p| p.name.as_str()).collect();
    for n in ["long-running", "stoppable", "done"] {
        assert!(names.contains(&n), "{n} in {names:?}");
    }
    assert!(
        listed.iter().all(|p| !p.name.starts_with(".blaxel")),
        "internal processes are hidden"
    );
    assert!(sb.process.get("nope").await.unwrap_err().is_not_found());
    sb.delete().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_by_type_and_name_reuse() {
    let sb = sandbox("logs").await;
    sb.process
        .exec(json!({"name": "hello-process", "command": "echo 'Hello, World!'; echo oops >&2"}))
        .await
        .unwrap();
    sb.process.wait("hello-process").interval(50).await.unwrap();
    assert_eq!(
        sb.process.logs("hello-process").await.unwrap(),
        "Hello, World!\noops\n"
    );
    assert_eq!(
        sb.process
            .logs("hello-process")
            .log_type("stdout")
            .await
            .unwrap(),
        "Hello, World!\n"
    );
    assert_eq!(
        sb.process
            .logs("hello-process")
            .log_type("stderr")
            .await
            .unwrap(),
        "oops\n"
    );
    // A finished name may be reused; lookups return the newest.
    sb.process
        .exec(
            json!({"name": "hello-process", "command": "echo second", "wait_for_completion": true}),
        )
        .await
        .unwrap();
    assert_eq!(sb.process.logs("hello-process").await.unwrap(), "second\n");
    sb.delete().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callbacks_and_stream_logs() {
    let sb = sandbox("stream").await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (s1, s2) = (seen.clone(), Arc::new(Mutex::new(Vec::new())));
    let errs = s2.clone();
    let p = sb
        .process
        .exec(json!({"name": "cb", "command": "echo one; echo two >&2; echo three", "wait_for_completion": true}))
        .on_log(move |l| s1.lock().unwrap().push(l))
        .on_stderr(move |l| s2.lock().unwrap().push(l))
        .await
        .expect("exec");
    assert_eq!(p.status, "completed");
    let mut all = seen.lock().unwrap().clone();
    all.sort();
    assert_eq!(all, ["one", "three", "two"]);
    assert_eq!(*errs.lock().unwrap(), ["two"]);

    // Without waiting: callbacks keep coming in the background.
    let lines = Arc::new(Mutex::new(Vec::new()));
    let l2 = lines.clone();
    let p = sb
        .process
        .exec(json!({"name": "bg-cb", "command": "echo a; sleep 0.3; echo b"}))
        .on_stdout(move |l| l2.lock().unwrap().push(l))
        .await
        .expect("exec");
    assert_eq!(p.status, "running");
    sb.process.wait("bg-cb").interval(50).await.unwrap();
    eventually(PATIENCE, "both lines reach the callback", || async {
        equals(
            lines.lock().unwrap().clone(),
            vec!["a".to_string(), "b".into()],
        )
    })
    .await;
    p.close();

    // stream_logs: backlog then live, until the process ends.
    sb.process
        .exec(json!({"name": "stream-test", "command": "for i in 1 2 3; do echo \"msg $i\"; sleep 0.2; done"}))
        .await
        .unwrap();
    let got = Arc::new(Mutex::new(Vec::new()));
    let g = got.clone();
    let handle = sb
        .process
        .stream_logs("stream-test")
        .on_log(move |l| g.lock().unwrap().push(l))
        .await
        .expect("stream_logs");
    sb.process.wait("stream-test").interval(50).await.unwrap();
    handle.wait(10.0).await.unwrap();
    assert!(handle.closed());
    assert_eq!(*got.lock().unwrap(), ["msg 1", "msg 2", "msg 3"]);
    handle.close();

    // After close, nothing more arrives.
    sb.process
        .exec(json!({"name": "closed-stream", "command": "sleep 1; echo late"}))
        .await
        .unwrap();
    let late = Arc::new(Mutex::new(Vec::<String>::new()));
    let l3 = late.clone();
    let h = sb
        .process
        .stream_logs("closed-stream")
        .on_log(move |l| l3.lock().unwrap().push(l))
        .await
        .unwrap();
    h.close();
    assert!(h.closed());
    sb.process.wait("closed-stream").interval(50).await.unwrap();
    assert!(late.lock().unwrap().is_empty());
    sb.delete().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarts_timeouts_and_ports() {
    let sb = sandbox("restart").await;
    let p = sb
        .process
        .exec(json!({"name": "flaky", "command": "echo try; exit 3", "restart_on_failure": true, "max_restarts": 2, "wait_for_completion": true}))
        .await
        .expect("exec");
    assert_eq!(p.status, "failed");
    assert_eq!(p.exit_code, 3);
    assert_eq!(p.restart_count, 2);
    assert!(p.restart_on_failure);
    assert_eq!(p.max_restarts, 2);
    assert_eq!(p.stdout.matches("try").count(), 3);
    assert!(p
        .stdout
        .contains("[Process failed with exit code 3. Attempting restart 1/2...]"));
    let again = sb.process.get("flaky").await.unwrap();
    assert_eq!(again.restart_count, 2);
    assert_eq!(again.pid, p.pid, "the pid is stable across restarts");

    // timeout without keep_alive bounds the wait only.
    let err = sb
        .process
        .exec(json!({"name": "slow", "command": "sleep 5", "wait_for_completion": true, "timeout": 1}))
        .await
        .expect_err("timed out");
    assert_eq!(err.status_code(), Some(422));
    assert_eq!(
        err.as_response_error().unwrap().message(),
        "process timed out after 1 seconds"
    );
    assert_eq!(sb.process.get("slow").await.unwrap().status, "running");
    sb.process.kill("slow").await.unwrap();

    // keep_alive + timeout kills the process.
    let p = sb
        .process
        .exec(json!({"name": "bounded", "command": "sleep 30", "keep_alive": true, "timeout": 1, "wait_for_completion": true}))
        .await
        .expect("exec");
    assert_eq!(p.status, "failed");
    assert_eq!(p.exit_code, -1);
    assert!(p.keep_alive);

    // wait_for_ports returns once the port listens on a routable address.
    let p = sb
        .process
        .exec(json!({"name": "server", "command": "python3 -m http.server 3000 --bind 0.0.0.0", "wait_for_ports": [3000], "timeout": 30}))
        .await
        .expect("exec");
    assert_eq!(p.status, "running");
    let check = sb
        .process
        .exec(json!({"command": "cat /proc/net/tcp | grep -c ':0BB8 00000000:0000 0A'", "wait_for_completion": true}))
        .await
        .unwrap();
    assert_eq!(check.logs.trim(), "1", "port 3000 is listening");
    sb.process.stop("server").await.unwrap();
    sb.delete().await.unwrap();
}
