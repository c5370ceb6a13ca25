//! `e2b::code_interpreter`, against the embedded runtime (python3 from the host).

use std::sync::{Arc, Mutex};

use e2b::code_interpreter::Sandbox;

async fn sandbox() -> Sandbox {
    Sandbox::create().timeout(120).await.expect("create")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_persists_and_the_last_expression_is_the_text() {
    let sbx = sandbox().await;
    sbx.run_code("x = 1").await.expect("run");
    let execution = sbx.run_code("x+=1; x").await.expect("run");
    assert_eq!(execution.text.as_deref(), Some("2"));
    assert_eq!(execution.results.len(), 1);
    assert!(execution.results[0].is_main_result);
    let e = sbx
        .run_code("def f(a):\n    return a * 3\nimport math\nf(x) + math.floor(0.5)")
        .await
        .expect("run");
    assert_eq!(e.text.as_deref(), Some("6"));
    let e = sbx.run_code("'text'").await.expect("run");
    assert_eq!(
        e.text.as_deref(),
        Some("'text'"),
        "the repr, as Jupyter shows it"
    );
    let e = sbx.run_code("y = 5").await.expect("run");
    assert_eq!(e.text, None, "no trailing expression, no text");
    assert!(e.execution_count.is_some());
    // The base sandbox's calls work on the code-interpreter sandbox.
    let r = sbx.commands.run("whoami").await.expect("run");
    assert_eq!(r.stdout, "user\n");
    sbx.kill().await.expect("kill");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_errors_callbacks_and_envs() {
    let sbx = sandbox().await;
    let e = sbx.run_code("print('hello world')").await.expect("run");
    assert_eq!(
        format!("{:?}", e.logs),
        "Logs(stdout: ['hello world\\n'], stderr: [])"
    );
    let e = sbx
        .run_code("import sys; print('a'); print('b', file=sys.stderr); 1/0")
        .await
        .expect("errors in code do not raise");
    assert_eq!(e.logs.stdout, ["a\n"]);
    assert_eq!(e.logs.stderr, ["b\n"]);
    let err = e.error.expect("error");
    assert_eq!(
        (err.name.as_str(), err.value.as_str()),
        ("ZeroDivisionError", "division by zero")
    );
    assert!(
        err.traceback.contains("<cell>") && !err.traceback.contains("e2b-code-interpreter"),
        "{}",
        err.traceback
    );
    let e = sbx.run_code("def broken(:").await.expect("run");
    assert_eq!(e.error.expect("syntax error").name, "SyntaxError");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (s1, s2, s3, s4) = (seen.clone(), seen.clone(), seen.clone(), seen.clone());
    sbx.run_code("import sys; print('out'); print('err', file=sys.stderr); 7")
        .on_stdout(move |m| s1.lock().unwrap().push(format!("stdout {}", m.line.trim())))
        .on_stderr(move |m| {
            s2.lock()
                .unwrap()
                .push(format!("stderr {m}").trim().to_string())
        })
        .on_result(move |r| s3.lock().unwrap().push(format!("result {r:?}")))
        .await
        .expect("run");
    sbx.run_code("raise ValueError('v')")
        .on_error(move |e| s4.lock().unwrap().push(format!("error {}", e.name)))
        .await
        .expect("run");
    assert_eq!(
        *seen.lock().unwrap(),
        [
            "stdout out",
            "stderr err",
            "result Result(7)",
            "error ValueError"
        ]
    );
    let e = sbx
        .run_code("import os; print(os.environ.get('MY_VAR'))")
        .envs([("MY_VAR", "my_value")])
        .await
        .expect("run");
    assert_eq!(e.logs.stdout, ["my_value\n"]);
    let e = sbx
        .run_code("import os; print(os.environ.get('MY_VAR'))")
        .await
        .expect("run");
    assert_eq!(
        e.logs.stdout,
        ["None\n"],
        "envs apply to that execution only"
    );
    sbx.kill().await.expect("kill");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_interrupts_and_the_context_survives() {
    let sbx = sandbox().await;
    sbx.run_code("kept = 41").await.expect("run");
    let err = sbx
        .run_code("import time; time.sleep(30)")
        .timeout(1)
        .await
        .unwrap_err();
    assert!(err.is_timeout(), "{err:?}");
    let e = sbx.run_code("kept + 1").await.expect("run after timeout");
    assert_eq!(e.text.as_deref(), Some("42"));
    sbx.kill().await.expect("kill");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn code_contexts_are_isolated_listed_restarted_and_removed() {
    let sbx = sandbox().await;
    sbx.run_code("shared = 'default'").await.expect("run");
    sbx.files.make_dir("work").await.expect("mkdir");
    let ctx = sbx
        .create_code_context()
        .cwd("/home/user/work")
        .await
        .expect("context");
    assert_eq!(
        (ctx.language.as_str(), ctx.cwd.as_str()),
        ("python", "/home/user/work")
    );
    let e = sbx
        .run_code("import os; os.getcwd()")
        .context(&ctx)
        .await
        .expect("run");
    assert_eq!(e.text.as_deref(), Some("'/home/user/work'"));
    let e = sbx
        .run_code("'shared' in globals()")
        .context(&ctx)
        .await
        .expect("run");
    assert_eq!(
        e.text.as_deref(),
        Some("False"),
        "contexts do not share state"
    );
    sbx.run_code("mine = 1")
        .context(ctx.id.as_str())
        .await
        .expect("run by id");
    let listed = sbx.list_code_contexts().await.expect("list");
    assert!(listed.contains(&ctx), "{listed:?}");
    assert!(listed.iter().any(|c| c.id == "default"));
    // Another program (here: another handle) finds the context and its state.
    let other = Sandbox::connect(sbx.sandbox_id.clone())
        .await
        .expect("connect");
    let e = other
        .run_code("mine")
        .context(&ctx)
        .await
        .expect("run from another handle");
    assert_eq!(e.text.as_deref(), Some("1"));
    sbx.restart_code_context(&ctx).await.expect("restart");
    let e = sbx
        .run_code("'mine' in globals()")
        .context(&ctx)
        .await
        .expect("run");
    assert_eq!(e.text.as_deref(), Some("False"), "restart clears state");
    sbx.remove_code_context(ctx.clone()).await.expect("remove");
    let err = sbx.run_code("1").context(&ctx).await.unwrap_err();
    assert!(err.is_not_found(), "{err:?}");
    assert!(!sbx.list_code_contexts().await.expect("list").contains(&ctx));
    let err = sbx
        .run_code("1")
        .language("python")
        .context(&ctx)
        .await
        .unwrap_err();
    assert!(err.is_invalid_argument(), "{err:?}");
    let err = sbx.run_code("1").language("r").await.unwrap_err();
    assert!(err.is_not_supported(), "{err:?}");
    let err = sbx
        .create_code_context()
        .language("java")
        .await
        .unwrap_err();
    assert!(err.is_not_supported(), "{err:?}");
    sbx.kill().await.expect("kill");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_code_interpreter_template_is_reported() {
    let sbx = sandbox().await;
    let r = sbx
        .commands
        .run("echo $E2B_TEMPLATE_ID")
        .await
        .expect("run");
    assert_eq!(r.stdout, "code-interpreter-v1\n");
    sbx.kill().await.expect("kill");
}

/// A cell that prints without end cannot grow the program's memory with it: the execution
/// keeps at most 64 MiB of output and says so once, while the callback still sees every byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_output_kept_in_an_execution_is_bounded() {
    let sbx = sandbox().await;
    let streamed = Arc::new(Mutex::new(0usize));
    let counter = streamed.clone();
    let execution = sbx
        .run_code("import sys\nfor _ in range(72):\n    sys.stdout.write('x' * (1 << 20))\n    sys.stdout.flush()")
        .on_stdout(move |m| *counter.lock().unwrap() += m.line.len())
        .timeout(300)
        .await
        .expect("run");
    let kept: usize = execution.logs.stdout.iter().map(String::len).sum();
    assert!(kept <= 64 << 20, "kept {kept} bytes");
    assert!(kept >= 60 << 20, "a prefix is kept: {kept} bytes");
    let notes = execution
        .logs
        .stderr
        .iter()
        .filter(|l| l.contains("was not kept"))
        .count();
    assert_eq!(notes, 1, "one note: {:?}", execution.logs.stderr);
    assert_eq!(
        *streamed.lock().unwrap(),
        72 << 20,
        "the callback saw everything"
    );
    sbx.kill().await.expect("kill");
}
