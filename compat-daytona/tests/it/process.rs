//! `sandbox.process.exec` and `code_run` against the embedded engine.

use crate::common;

use daytona::{CodeRunParams, CreateSandboxFromSnapshotParams};

#[tokio::test]
async fn exec_runs_through_a_shell_and_combines_output() {
    let (_d, sb) = common::sandbox().await;
    let r = sb.process.exec("echo 'Hello, World!'").await.unwrap();
    assert_eq!(r.exit_code, 0);
    assert_eq!(r.result, "Hello, World!\n");
    assert_eq!(r.artifacts.as_ref().unwrap().stdout, r.result);

    let r = sb
        .process
        .exec("echo out; echo err >&2; echo out2; exit 3")
        .await
        .unwrap();
    assert_eq!(r.exit_code, 3);
    assert_eq!(
        r.result, "out\nerr\nout2\n",
        "one buffer, in the order written"
    );

    let r = sb.process.exec("no-such-command-xyz").await.unwrap();
    assert_eq!(r.exit_code, 127);
    assert!(r.result.contains("command not found"), "{}", r.result);

    let r = sb.process.exec("pwd; whoami; echo $HOME").await.unwrap();
    assert_eq!(r.result, "/home/daytona\ndaytona\n/home/daytona\n");
    sb.delete().await.unwrap();
}

#[tokio::test]
async fn exec_cwd_env_and_timeout() {
    let (_d, sb) = common::sandbox().await;
    sb.process.exec("mkdir -p workspace/src").await.unwrap();
    let r = sb.process.exec("pwd").cwd("workspace/src").await.unwrap();
    assert_eq!(r.result, "/home/daytona/workspace/src\n");
    let r = sb.process.exec("pwd").cwd(None).await.unwrap();
    assert_eq!(r.result, "/home/daytona\n", "None is the work dir");

    let r = sb
        .process
        .exec("echo \"$CUSTOM_SECRET\"")
        .env([("CUSTOM_SECRET", "DAYTONA with spaces $x")])
        .await
        .unwrap();
    assert_eq!(r.result, "DAYTONA with spaces $x\n");

    let bad = sb
        .process
        .exec("true")
        .env([("A-B", "1")])
        .await
        .unwrap_err();
    assert!(bad.is_validation(), "{bad}");
    assert!(bad.to_string().starts_with("Failed to execute command: "));

    let r = sb
        .process
        .exec("pwd")
        .cwd("/no/such/dir".to_string())
        .await
        .unwrap();
    assert_eq!(r.exit_code, -1);
    assert!(
        r.result.contains("no such file or directory"),
        "{}",
        r.result
    );

    let r = sb
        .process
        .exec("sleep 1; echo done")
        .timeout(30)
        .await
        .unwrap();
    assert_eq!(r.result, "done\n");

    let err = sb
        .process
        .exec("sleep 30 & sleep 30; echo never")
        .timeout(1)
        .await
        .unwrap_err();
    assert!(err.is_timeout(), "{err}");
    assert_eq!(err.status_code(), Some(408));
    assert_eq!(err.code(), Some("PROCESS_EXECUTION_TIMEOUT"));
    // The whole process group was killed: no sleeper is left behind.
    // Orphans are reaped by PID 1 on its own schedule: wait for them to be gone.
    let sb = &sb;
    sandcove_conformance::eventually(
        sandcove_conformance::PATIENCE,
        "no sleeper is left",
        || async move {
            let r = sb.process.exec("pgrep -x sleep | wc -l").await.unwrap();
            sandcove_conformance::equals(r.result.trim().to_string(), "0".to_string())
        },
    )
    .await;

    assert!(sb.process.exec("   ").await.unwrap_err().is_validation());
    sb.delete().await.unwrap();
}

#[tokio::test]
async fn code_run_uses_the_sandbox_language_and_params() {
    let (_d, sb) = common::sandbox().await;
    let r = sb
        .process
        .code_run("print(\"Hello World!\")")
        .await
        .unwrap();
    assert_eq!((r.exit_code, r.result.as_str()), (0, "Hello World!\n"));

    let r = sb
        .process
        .code_run("import sys, os; print(sys.argv[1:], os.environ[\"X\"])")
        .params(CodeRunParams {
            argv: Some(vec!["a".into(), "b".into()]),
            env: Some([("X".to_string(), "1".to_string())].into()),
        })
        .await
        .unwrap();
    assert_eq!(r.result, "['a', 'b'] 1\n");

    let r = sb.process.code_run("invalid python code").await.unwrap();
    assert_eq!(r.exit_code, 1);
    assert!(r.result.contains("SyntaxError"), "{}", r.result);

    let err = sb
        .process
        .code_run("import time; time.sleep(30)")
        .timeout(1)
        .await
        .unwrap_err();
    assert!(err.is_timeout());
    sb.delete().await.unwrap();

    let d = common::daytona();
    let js = d
        .create(CreateSandboxFromSnapshotParams {
            language: Some("javascript".into()),
            ..common::short_lived()
        })
        .await
        .unwrap();
    assert_eq!(js.labels["code-toolbox-language"], "javascript");
    let r = js
        .process
        .code_run("console.log(process.argv.slice(2).join(','))")
        .params(CodeRunParams {
            argv: Some(vec!["x".into(), "y".into()]),
            env: None,
        })
        .await
        .unwrap();
    assert_eq!(r.result, "x,y\n", "{r:?}");
    js.delete().await.unwrap();
}
