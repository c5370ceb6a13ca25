//! `sandbox.git` through the sandbox's `git` binary, on local repositories only.

use crate::common;

use daytona::CreateSandboxFromSnapshotParams;

#[tokio::test]
async fn clone_status_branches_commit_pull_push() {
    let (_d, sb) = common::sandbox().await;
    let init = sb
        .process
        .exec(
            "git init -q -b main origin && cd origin && echo hi > a.txt && git add a.txt && \
             git -c user.name=T -c user.email=t@e commit -q -m first && echo ok",
        )
        .await
        .unwrap();
    assert_eq!(init.result, "ok\n", "{}", init.result);

    sb.git
        .clone("/home/daytona/origin", "/home/daytona/repo")
        .await
        .unwrap();
    let st = sb.git.status("/home/daytona/repo").await.unwrap();
    assert_eq!(st.current_branch, "main");
    assert_eq!((st.ahead, st.behind), (Some(0), Some(0)));
    assert_eq!(st.branch_published, Some(true));
    assert!(st.file_status.is_empty());

    sb.git
        .clone("file:///home/daytona/origin", "copy2")
        .branch("main".to_string())
        .depth(1)
        .await
        .unwrap();
    assert_eq!(sb.git.status("copy2").await.unwrap().current_branch, "main");
    let first = sb
        .process
        .exec("git -C origin rev-parse HEAD")
        .await
        .unwrap()
        .result
        .trim()
        .to_string();
    sb.git
        .clone("/home/daytona/origin", "pinned")
        .commit_id(first.clone())
        .username("u".to_string())
        .password("p".to_string())
        .insecure_skip_tls(true)
        .await
        .unwrap();
    assert_eq!(
        sb.git.status("pinned").await.unwrap().current_branch,
        "HEAD"
    );
    let head = sb
        .process
        .exec("git -C pinned rev-parse HEAD")
        .await
        .unwrap();
    assert_eq!(head.result.trim(), first);

    sb.fs.upload_file(b"new", "repo/b.txt").await.unwrap();
    sb.fs.upload_file(b"changed", "repo/a.txt").await.unwrap();
    let st = sb.git.status("repo").await.unwrap();
    let mut by_name: Vec<(String, String)> = st
        .file_status
        .iter()
        .map(|f| (f.name.clone(), f.worktree.clone()))
        .collect();
    by_name.sort();
    assert_eq!(
        by_name,
        [
            ("a.txt".to_string(), "Modified".to_string()),
            ("b.txt".to_string(), "Untracked".to_string())
        ]
    );
    sb.git.add("repo", ["."]).await.unwrap();
    let st = sb.git.status("repo").await.unwrap();
    assert!(st
        .file_status
        .iter()
        .any(|f| f.name == "b.txt" && f.staging == "Added"));
    let c = sb
        .git
        .commit("repo", "second", "Ann", "ann@example.com")
        .await
        .unwrap();
    assert_eq!(c.sha.len(), 40);
    assert_eq!(sb.git.status("repo").await.unwrap().ahead, Some(1));
    let empty = sb.git.commit("repo", "nothing", "Ann", "a@e").await;
    assert!(empty.is_err());
    sb.git
        .commit("repo", "nothing", "Ann", "a@e")
        .allow_empty(true)
        .await
        .unwrap();

    sb.git.create_branch("repo", "feature").await.unwrap();
    assert_eq!(
        sb.git.status("repo").await.unwrap().current_branch,
        "feature"
    );
    let mut branches = sb.git.branches("repo").await.unwrap().branches;
    branches.sort();
    assert_eq!(branches, ["feature", "main"]);
    assert!(sb
        .git
        .create_branch("repo", "feature")
        .await
        .unwrap_err()
        .is_conflict());
    sb.git.checkout_branch("repo", "main").await.unwrap();
    sb.git.delete_branch("repo", "feature").await.unwrap();
    assert_eq!(sb.git.branches("repo").await.unwrap().branches, ["main"]);
    assert!(sb
        .git
        .checkout_branch("repo", "nope")
        .await
        .unwrap_err()
        .is_not_found());

    // Push to the (non-bare) origin on another branch, then pull it back.
    sb.process
        .exec("cd origin && git checkout -q -b other")
        .await
        .unwrap();
    sb.git.push("repo").await.unwrap();
    assert_eq!(sb.git.status("repo").await.unwrap().ahead, Some(0));
    sb.git.pull("copy2").await.unwrap();
    let log = sb
        .process
        .exec("git -C copy2 log --format=%s -1 main")
        .await
        .unwrap();
    assert_eq!(log.result, "nothing\n");

    let nope = sb.git.status("not-a-repo").await.unwrap_err();
    assert!(nope.is_not_found(), "{nope}");
    assert!(nope.to_string().starts_with("Failed to get status: "));
    sb.delete().await.unwrap();
}

#[tokio::test]
async fn network_urls_without_network_fail_clearly() {
    let d = common::daytona();
    let sb = d
        .create(CreateSandboxFromSnapshotParams {
            network_block_all: Some(true),
            ..common::short_lived()
        })
        .await
        .unwrap();
    let err = sb
        .git
        .clone("https://github.com/daytonaio/daytona.git", "daytona")
        .await
        .unwrap_err();
    assert!(err.is_connection(), "{err}");
    assert!(err.to_string().contains("needs network access"), "{err}");
    assert!(sb
        .fs
        .list_files("daytona")
        .await
        .unwrap_err()
        .is_not_found());
    sb.delete().await.unwrap();
}
