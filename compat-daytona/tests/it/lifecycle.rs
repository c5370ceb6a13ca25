//! `Daytona` and `Sandbox` lifecycle: create params, fields, labels, list, get, stop/start,
//! intervals, errors.

use crate::common;

use daytona::{
    CreateSandboxFromImageParams, CreateSandboxFromSnapshotParams, Daytona, DaytonaConfig,
    ListSandboxesQuery, SandboxListSortDirection, SandboxListSortField, SandboxState,
};
use futures::StreamExt;

#[tokio::test]
async fn create_defaults_and_fields() {
    let d = Daytona::new(DaytonaConfig {
        api_key: Some("YOUR_API_KEY".into()),
        target: Some("eu".into()),
        organization_id: Some("org-1".into()),
        ..Default::default()
    })
    .unwrap();
    let sb = d
        .create(CreateSandboxFromSnapshotParams {
            env_vars: Some([("GREETING".to_string(), "hi there".to_string())].into()),
            labels: Some([("env".to_string(), "dev".to_string())].into()),
            ..common::short_lived()
        })
        .timeout(60)
        .await
        .unwrap();
    assert_eq!(sb.state, Some(SandboxState::Started));
    assert_eq!(sb.user, "daytona");
    assert_eq!(sb.name, sb.id);
    assert_eq!(sb.target, "eu");
    assert_eq!(sb.organization_id, "org-1");
    assert_eq!(sb.labels["code-toolbox-language"], "python");
    assert_eq!(sb.labels["env"], "dev");
    assert_eq!(
        sb.labels.len(),
        2,
        "internal labels are hidden: {:?}",
        sb.labels
    );
    assert_eq!(sb.env.as_ref().unwrap()["GREETING"], "hi there");
    assert_eq!(sb.auto_stop_interval, Some(2.0));
    assert_eq!(sb.auto_delete_interval, Some(-1.0));
    assert_eq!((sb.cpu, sb.memory, sb.disk), (1.0, 1.0, 3.0));
    assert!(sb.created_at.as_deref().unwrap().ends_with('Z'));
    assert_eq!(sb.get_user_home_dir().await.unwrap(), "/home/daytona");
    assert_eq!(sb.get_work_dir().await.unwrap(), "/home/daytona");
    let r = sb.process.exec("echo $GREETING").await.unwrap();
    assert_eq!(r.result, "hi there\n");
    assert_eq!(sb.sandcove_reference().unwrap().id(), sb.id);
    d.delete(&sb).await.unwrap();
    let gone = d.get(sb.id.clone()).await.unwrap_err();
    assert!(gone.is_not_found(), "{gone}");
    assert!(gone.to_string().starts_with("Failed to get sandbox: "));
    // Deleted recently: still Daytona's not-found, saying when (by id and by name).
    assert!(gone.to_string().contains("destroyed at 20"), "{gone}");
    let by_name = d.get(sb.name.clone()).await.unwrap_err();
    assert!(by_name.is_not_found(), "{by_name}");
    assert!(by_name.to_string().contains("destroyed at 20"), "{by_name}");
    assert!(d.get("").await.unwrap_err().is_validation());
}

#[tokio::test]
async fn create_validates_like_daytona() {
    let d = common::daytona();
    let bad_lang = d
        .create(CreateSandboxFromSnapshotParams {
            language: Some("ruby".into()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(bad_lang.is_validation());
    assert_eq!(
        bad_lang.to_string(),
        "Failed to create sandbox: Invalid code-toolbox-language: ruby"
    );
    let neg = d
        .create(CreateSandboxFromSnapshotParams {
            auto_stop_interval: Some(-1),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(neg
        .to_string()
        .contains("auto_stop_interval must be a non-negative integer"));
    assert!(d
        .create(None)
        .timeout(-1)
        .await
        .unwrap_err()
        .is_validation());
    let bad_env = d
        .create(CreateSandboxFromSnapshotParams {
            env_vars: Some([("A B".to_string(), "x".to_string())].into()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(bad_env.is_validation());
    let bad_mount = d
        .create(CreateSandboxFromSnapshotParams {
            volumes: Some(vec![daytona::VolumeMount {
                volume_id: "v".into(),
                mount_path: "/etc/x".into(),
                subpath: None,
            }]),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(bad_mount.is_validation());
    let marker: std::collections::HashMap<String, String> =
        [("refused".to_string(), format!("r{}", std::process::id()))].into();
    // An image this engine has not stored: Daytona's not-found, saying how to store it.
    let absent = d
        .create(CreateSandboxFromImageParams {
            image: "python:3.12".into(),
            labels: Some(marker.clone()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(
        absent.is_not_found()
            && absent
                .to_string()
                .contains("sandcove image pull python:3.12"),
        "{absent}"
    );
    for err in [
        d.create(CreateSandboxFromSnapshotParams {
            network_allow_list: Some("10.0.0.0/8".into()),
            labels: Some(marker.clone()),
            ..Default::default()
        })
        .await
        .unwrap_err(),
        d.create(CreateSandboxFromSnapshotParams {
            linked_sandbox: Some("x".into()),
            labels: Some(marker.clone()),
            ..Default::default()
        })
        .await
        .unwrap_err(),
    ] {
        assert!(err.is_not_supported(), "{err}");
    }
    let made: Vec<_> = d
        .list(ListSandboxesQuery {
            labels: Some(marker),
            ..Default::default()
        })
        .collect()
        .await;
    assert!(made.is_empty(), "a refused create made no sandbox");
}

#[tokio::test]
async fn labels_list_get_by_name() {
    let d = common::daytona();
    let tag = format!("t{}", std::process::id());
    let mut a = d
        .create(CreateSandboxFromSnapshotParams {
            name: Some(format!("{tag}-a")),
            labels: Some([("suite".to_string(), tag.clone())].into()),
            ..common::short_lived()
        })
        .await
        .unwrap();
    // `b` is created in a later millisecond than `a`: the order asserted below is the
    // creation order, not a tie broken by id.
    sandcove_conformance::next_millisecond().await;
    let b = d
        .create(CreateSandboxFromSnapshotParams {
            name: Some(format!("{tag}-b")),
            labels: Some([("suite".to_string(), tag.clone())].into()),
            ..common::short_lived()
        })
        .await
        .unwrap();
    let dup = d
        .create(CreateSandboxFromSnapshotParams {
            name: Some(format!("{tag}-a")),
            ..common::short_lived()
        })
        .await
        .unwrap_err();
    assert!(dup.is_conflict(), "{dup}");

    let by_name = d
        .get(format!("{tag}-b"))
        .request_timeout(30.0)
        .await
        .unwrap();
    assert_eq!(by_name.id, b.id);

    let set = a
        .set_labels([("suite", tag.as_str()), ("public", "true")])
        .await
        .unwrap();
    assert_eq!(set.len(), 2);
    assert_eq!(a.labels["public"], "true");
    let again = d.get(a.id.clone()).await.unwrap();
    assert_eq!(again.labels, a.labels, "replaced, language label dropped");

    let query = ListSandboxesQuery {
        limit: Some(1),
        labels: Some([("suite".to_string(), tag.clone())].into()),
        states: Some(vec![SandboxState::STARTED]),
        sort: Some(SandboxListSortField::CREATEDAT),
        order: Some(SandboxListSortDirection::DESC),
        ..Default::default()
    };
    let ids: Vec<String> = d.list(query.clone()).map(|r| r.unwrap().id).collect().await;
    assert_eq!(
        ids,
        [b.id.clone(), a.id.clone()],
        "newest first, over pages"
    );
    let asc: Vec<String> = d
        .list(ListSandboxesQuery {
            order: Some(SandboxListSortDirection::ASC),
            ..query.clone()
        })
        .map(|r| r.unwrap().id)
        .collect()
        .await;
    assert_eq!(asc, [a.id.clone(), b.id.clone()]);
    let only_public: Vec<String> = d
        .list(ListSandboxesQuery {
            labels: Some([("public".to_string(), "true".to_string())].into()),
            name: Some(tag.to_uppercase()),
            ..Default::default()
        })
        .map(|r| r.unwrap().id)
        .collect()
        .await;
    assert_eq!(only_public, [a.id.clone()]);
    let bad: Vec<_> = d
        .list(ListSandboxesQuery {
            limit: Some(0),
            ..Default::default()
        })
        .collect()
        .await;
    assert!(bad[0].as_ref().unwrap_err().is_validation());
    a.delete().await.unwrap();
    b.delete().await.unwrap();
}

#[tokio::test]
async fn stop_start_archive_and_intervals() {
    let (d, mut sb) = common::sandbox().await;
    sb.fs.upload_file(b"kept", "state.txt").await.unwrap();
    sb.process.create_session("bg").await.unwrap();
    assert_eq!(sb.state, Some(SandboxState::Started));
    // As in Python, the call updates the object it was given: no `refresh_data()` needed.
    d.stop(&mut sb).await.unwrap();
    assert_eq!(sb.state, Some(SandboxState::Stopped));
    sb.wait_for_sandbox_stop().await.unwrap();
    // That the session is gone at once after stop is checked by
    // `a_stopped_sandbox_has_no_sessions`.
    let listed: Vec<_> = d
        .list(ListSandboxesQuery {
            states: Some(vec![SandboxState::STOPPED]),
            id: Some(sb.id.clone()),
            ..Default::default()
        })
        .collect()
        .await;
    assert_eq!(listed.len(), 1);
    sb.archive().await.unwrap();
    sb.refresh_data().await.unwrap();
    assert_eq!(sb.state, Some(SandboxState::Archived));
    d.start(&mut sb).timeout(30).await.unwrap();
    assert_eq!(sb.state, Some(SandboxState::Started));
    sb.wait_for_sandbox_start().timeout(10).await.unwrap();
    // A shared handle works as Python's object: the sandbox's state changes for every
    // handle of it (this one's fields until its refresh, the other's at once).
    let other = sb.clone();
    d.stop(&other).await.unwrap();
    assert_eq!(
        other.state,
        Some(SandboxState::Started),
        "a shared handle is not rewritten"
    );
    sb.refresh_data().await.unwrap();
    assert_eq!(sb.state, Some(SandboxState::Stopped));
    d.start(&sb).await.unwrap();
    let mut seen = other.clone();
    seen.refresh_data().await.unwrap();
    assert_eq!(seen.state, Some(SandboxState::Started));
    // The instance forms update the object as well.
    sb.stop().await.unwrap();
    assert_eq!(sb.state, Some(SandboxState::Stopped));
    sb.start().await.unwrap();
    assert_eq!(sb.state, Some(SandboxState::Started));
    assert_eq!(sb.fs.download_file("state.txt").await.unwrap(), b"kept");
    assert!(
        sb.archive().await.unwrap_err().is_validation(),
        "only when stopped"
    );
    let timeout = sb.wait_for_sandbox_stop().timeout(1).await.unwrap_err();
    assert!(timeout.is_timeout());
    assert_eq!(
        timeout.to_string(),
        "Function 'wait_for_sandbox_stop' exceeded timeout of 1 seconds."
    );

    sb.set_autostop_interval(5).await.unwrap();
    assert!(sb
        .set_autostop_interval(-1)
        .await
        .unwrap_err()
        .is_validation());
    sb.set_auto_archive_interval(60).await.unwrap();
    sb.set_auto_delete_interval(0).await.unwrap();
    sb.refresh_activity().await.unwrap();
    sb.refresh_data().await.unwrap();
    assert_eq!(
        (
            sb.auto_stop_interval,
            sb.auto_archive_interval,
            sb.auto_delete_interval
        ),
        (Some(5.0), Some(60.0), Some(0.0))
    );
    sb.delete().timeout(30).await.unwrap();
}

#[tokio::test]
async fn gaps_refuse_before_any_effect() {
    let (_d, sb) = common::sandbox().await;
    let gaps = [
        sb.resize(daytona::Resources::default()).await.unwrap_err(),
        sb.recover().await.unwrap_err(),
        sb.update_network_settings().await.unwrap_err(),
        sb.create_lsp_server("python", ".").unwrap_err(),
        sb.create_ssh_access().await.unwrap_err(),
        sb.revoke_ssh_access("t").await.unwrap_err(),
        sb.validate_ssh_access("t").await.unwrap_err(),
        sb.rotate_signing_key().await.unwrap_err(),
        sb.expire_signed_preview_url(3000, "t").await.unwrap_err(),
        sb.code_interpreter.run_code("1").await.unwrap_err(),
        sb.computer_use.start().await.unwrap_err(),
        sb.process.create_pty_session("p").await.unwrap_err(),
        sb.process.list_pty_sessions().await.unwrap_err(),
        sb.process.get_entrypoint_session().await.unwrap_err(),
    ];
    for e in gaps {
        assert!(e.is_not_supported(), "{e}");
        assert!(e.to_string().contains("instead"), "{e}");
    }
    sb.delete().await.unwrap();
}

/// Stop ends every process, so the moment `stop` has returned no session answers: the
/// stopped sandbox refuses toolbox calls, and once started again no session is found, listed
/// or asked about, however far the facade's own reading of the session streams lags. Session `bg`
/// has a command running; session `held` started a job in its own process group that keeps
/// the shell's output open, so the runtime records the shell's end only after its drain pause:
/// that makes the window in which stale session state could answer wide in every round (it
/// showed about 1 run in 5 with `bg` alone).
#[tokio::test]
async fn a_stopped_sandbox_has_no_sessions() {
    use daytona::SessionExecuteRequest;
    for round in 0..4 {
        let (d, mut sb) = common::sandbox().await;
        sb.process.create_session("bg").await.unwrap();
        let running = sb
            .process
            .execute_session_command(
                "bg",
                SessionExecuteRequest {
                    command: "sleep 300".into(),
                    run_async: Some(true),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        sb.process.create_session("held").await.unwrap();
        let job = sb
            .process
            .execute_session_command(
                "held",
                SessionExecuteRequest {
                    command: "set -m; sleep 300 & set +m\n\
                              read -r _ _ _ _ job _ < /proc/$!/stat\n\
                              read -r _ _ _ _ shell _ < /proc/$$/stat\n\
                              [ \"$job\" != \"$shell\" ]"
                        .into(),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(job.exit_code, Some(0), "the job has its own group: {job:?}");
        assert_eq!(sb.process.list_sessions().await.unwrap().len(), 2);

        d.stop(&mut sb).await.unwrap();
        // As on Daytona, a stopped sandbox refuses toolbox calls: no stale session answers.
        for id in ["bg", "held"] {
            let found = sb.process.get_session(id).await;
            assert!(
                matches!(&found, Err(e) if e.to_string().contains("stopped")),
                "round {round}: session {id} of a stopped sandbox: {found:?}"
            );
        }
        let listed = sb.process.list_sessions().await;
        assert!(
            matches!(&listed, Err(e) if e.to_string().contains("stopped")),
            "round {round}: {listed:?}"
        );
        sb.refresh_data().await.unwrap();
        assert_eq!(sb.state, Some(SandboxState::Stopped));
        // Started again, the sessions are gone: their shells ended with the stop.
        d.start(&mut sb).await.unwrap();
        for id in ["bg", "held"] {
            let found = sb.process.get_session(id).await;
            assert!(
                matches!(&found, Err(e) if e.is_not_found()),
                "round {round}: session {id} after a stop: {found:?}"
            );
        }
        let cmd = sb.process.get_session_command("bg", &running.cmd_id).await;
        assert!(
            matches!(&cmd, Err(e) if e.is_not_found()),
            "round {round}: a command of a stopped sandbox: {cmd:?}"
        );
        let listed = sb.process.list_sessions().await.unwrap();
        assert!(listed.is_empty(), "round {round}: {listed:?}");
        d.stop(&mut sb).await.unwrap();
        sb.refresh_data().await.unwrap();
        assert_eq!(sb.state, Some(SandboxState::Stopped));
        sb.delete().timeout(30).await.unwrap();
    }
}

/// The facade's state lives outside the sandbox (runtime annotations and the runtime's own
/// state): code in the sandbox that forges the file where the facade once kept its record,
/// then clobbers and deletes everything under `/tmp`, changes neither the labels, the
/// intervals, the state nor the sessions the facade reports.
#[tokio::test]
async fn sandbox_code_cannot_rewrite_facade_state() {
    use daytona::SessionExecuteRequest;
    let (d, mut sb) = common::sandbox().await;
    sb.set_labels([("team", "a")]).await.unwrap();
    sb.set_autostop_interval(7).await.unwrap();
    sb.process.create_session("s1").await.unwrap();
    let forged = r#"{"labels":{"team":"evil"},"stopped":true,"archived":true,"public":true,"auto_stop_interval":99}"#;
    let script = format!(
        "printf '%s' '{forged}' > /tmp/.sandcove-daytona.json; \
         find /tmp -type f -exec sh -c 'printf garbage > \"$1\"' _ {{}} \\; ; \
         rm -rf /tmp/.daytona-sessions; printf '%s' '{forged}' > /tmp/.sandcove-daytona.json; \
         echo done"
    );
    let out = sb.process.exec(script).await.unwrap();
    assert_eq!(out.exit_code, 0, "{out:?}");
    sb.refresh_data().await.unwrap();
    let labels: Vec<_> = sb.labels.iter().collect();
    assert_eq!(labels, [(&"team".to_string(), &"a".to_string())]);
    assert_eq!(sb.state, Some(SandboxState::Started));
    assert_eq!(sb.auto_stop_interval, Some(7.0));
    assert!(!sb.public);
    let sessions = sb.process.list_sessions().await.unwrap();
    assert_eq!(
        sessions
            .iter()
            .map(|s| s.session_id.as_str())
            .collect::<Vec<_>>(),
        ["s1"]
    );
    let ran = sb
        .process
        .execute_session_command(
            "s1",
            SessionExecuteRequest {
                command: "echo still-mine".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(ran.stdout.as_deref().map(str::trim), Some("still-mine"));
    // A stopped sandbox reads stopped from the runtime, whatever a file said before.
    d.stop(&mut sb).await.unwrap();
    sb.refresh_data().await.unwrap();
    assert_eq!(sb.state, Some(SandboxState::Stopped));
    sb.delete().timeout(30).await.unwrap();
}
