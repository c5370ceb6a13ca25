//! Python `sandbox.git`, through the `git` binary inside the sandbox.
//!
//! Credentials never appear on a command line: they reach git through a credential helper
//! that reads two environment variables of that one process.

use std::collections::BTreeMap;

use sandcove::{NetworkPolicy, Output, ProcessSpec};

use crate::ctx::Ctx;
use crate::errors::{Context, DaytonaError, ErrorDetails};
use crate::gaps::gap;
use crate::{awaitable, Result};

/// Python `FileStatus`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileStatus {
    /// `name`: the path.
    pub name: String,
    /// `staging`: index status (`Unmodified`, `Untracked`, `Modified`, `Added`, `Deleted`,
    /// `Renamed`, `Copied`, `Updated but unmerged`).
    pub staging: String,
    /// `worktree`: work tree status (same values).
    pub worktree: String,
    /// `extra`: the original path of a rename or copy, else empty.
    pub extra: String,
}

/// Python `GitStatus`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GitStatus {
    /// `current_branch` (`HEAD` when detached).
    pub current_branch: String,
    /// `file_status`.
    pub file_status: Vec<FileStatus>,
    /// `ahead` of the upstream (`None` without one).
    pub ahead: Option<i64>,
    /// `behind` the upstream (`None` without one).
    pub behind: Option<i64>,
    /// `branch_published`: the branch has an upstream.
    pub branch_published: Option<bool>,
}

/// Python `GitCommitResponse`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitCommitResponse {
    /// `sha` of the new commit.
    pub sha: String,
}

/// Python `ListBranchResponse`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ListBranchResponse {
    /// `branches`: local branch names.
    pub branches: Vec<String>,
}

fn status_word(c: char) -> &'static str {
    match c {
        'M' | 'T' => "Modified",
        'A' => "Added",
        'D' => "Deleted",
        'R' => "Renamed",
        'C' => "Copied",
        'U' => "Updated but unmerged",
        '?' => "Untracked",
        _ => "Unmodified",
    }
}

/// Parse `git status --porcelain=v2 --branch -z`.
pub fn parse_status(out: &str) -> GitStatus {
    let mut st = GitStatus::default();
    let mut fields = out.split('\0').peekable();
    while let Some(rec) = fields.next() {
        if let Some(h) = rec.strip_prefix("# branch.head ") {
            st.current_branch = if h == "(detached)" {
                "HEAD".into()
            } else {
                h.into()
            };
        } else if rec.starts_with("# branch.upstream ") {
            st.branch_published = Some(true);
        } else if let Some(ab) = rec.strip_prefix("# branch.ab ") {
            let mut it = ab.split(' ');
            st.ahead = it
                .next()
                .and_then(|a| a.trim_start_matches('+').parse().ok());
            st.behind = it
                .next()
                .and_then(|b| b.trim_start_matches('-').parse().ok());
        } else if let Some(path) = rec.strip_prefix("? ") {
            st.file_status.push(FileStatus {
                name: path.into(),
                staging: "Untracked".into(),
                worktree: "Untracked".into(),
                extra: String::new(),
            });
        } else if rec.starts_with("1 ") || rec.starts_with("2 ") || rec.starts_with("u ") {
            let n = match &rec[..1] {
                "1" => 8,
                "2" => 9,
                _ => 10,
            };
            let parts: Vec<&str> = rec.splitn(n + 1, ' ').collect();
            let xy: Vec<char> = parts.get(1).unwrap_or(&"..").chars().collect();
            let name = parts.get(n).copied().unwrap_or_default().to_string();
            let extra = if rec.starts_with("2 ") {
                fields.next().unwrap_or_default().to_string()
            } else {
                String::new()
            };
            let (x, y) = (
                xy.first().copied().unwrap_or('.'),
                xy.get(1).copied().unwrap_or('.'),
            );
            let unmerged = rec.starts_with("u ");
            st.file_status.push(FileStatus {
                name,
                staging: if unmerged {
                    "Updated but unmerged"
                } else {
                    status_word(x)
                }
                .into(),
                worktree: if unmerged {
                    "Updated but unmerged"
                } else {
                    status_word(y)
                }
                .into(),
                extra,
            });
        }
    }
    if st.branch_published.is_none() {
        st.branch_published = Some(false);
    }
    st
}

/// Whether a clone source is reachable without a network (a path or `file://`).
pub fn is_local_url(url: &str) -> bool {
    url.starts_with("file://")
        || url.starts_with('/')
        || url.starts_with("./")
        || url.starts_with("../")
        || !(url.contains("://") || (url.contains('@') && url.contains(':')))
}

/// Python `sandbox.git`.
#[derive(Debug, Clone)]
pub struct Git {
    ctx: Ctx,
}

/// Credential helper reading the two variables set for one git process.
const CRED_HELPER: &str =
    "credential.helper=!f() { echo \"username=$DTN_GIT_USER\"; echo \"password=$DTN_GIT_PASS\"; }; f";

impl Git {
    pub(crate) fn new(ctx: Ctx) -> Self {
        Git { ctx }
    }

    async fn git(
        &self,
        cwd: Option<&str>,
        args: Vec<String>,
        creds: Option<(&str, &str)>,
    ) -> Result<Output> {
        let mut argv = vec!["git".to_string()];
        if creds.is_some() {
            argv.push("-c".into());
            argv.push(CRED_HELPER.into());
        }
        argv.extend(args);
        let mut spec = ProcessSpec::new(sandcove::Command::Argv(argv));
        spec.cwd = Some(match cwd {
            Some(c) => self.ctx.resolve(c),
            None => self.ctx.work_dir.to_string(),
        });
        let mut envs = BTreeMap::from([("GIT_TERMINAL_PROMPT".to_string(), "0".to_string())]);
        if let Some((u, p)) = creds {
            envs.insert("DTN_GIT_USER".into(), u.into());
            envs.insert("DTN_GIT_PASS".into(), p.into());
        }
        spec.envs = envs;
        let out = match self.ctx.run(spec).await {
            Ok(o) => o,
            Err(e) if e.is_not_found() && cwd.is_some() => {
                let missing = self.ctx.resolve(cwd.unwrap_or_default());
                match self.ctx.core.stat_with(&missing, Default::default()).await {
                    Err(_) => {
                        return Err(DaytonaError::NotFound(ErrorDetails::new(
                            format!("repository not found: {missing}"),
                            Some(404),
                            Some("GIT_REPO_NOT_FOUND"),
                        )))
                    }
                    Ok(_) => return Err(gap("git binary")),
                }
            }
            Err(e) if e.is_not_found() => return Err(gap("git binary")),
            Err(e) => return Err(e.into()),
        };
        if out.exit_code() == 127 {
            return Err(gap("git binary"));
        }
        if !out.exit_status().success() {
            let msg = out.stderr_lossy().trim().to_string();
            let lower = msg.to_lowercase();
            let (variant, status, code): (fn(ErrorDetails) -> DaytonaError, u16, &str) = if lower
                .contains("not a git repository")
                || lower.contains("does not exist")
                || lower.contains("repository not found")
            {
                (DaytonaError::NotFound, 404, "GIT_REPO_NOT_FOUND")
            } else if lower.contains("already exists") {
                (DaytonaError::Conflict, 409, "GIT_BRANCH_EXISTS")
            } else if lower.contains("did not match any") || lower.contains("not found") {
                (DaytonaError::NotFound, 404, "GIT_BRANCH_NOT_FOUND")
            } else if lower.contains("authentication failed") {
                (DaytonaError::Authentication, 401, "GIT_AUTH_FAILED")
            } else {
                (DaytonaError::BadRequest, 400, "GIT_ERROR")
            };
            return Err(variant(ErrorDetails::new(msg, Some(status), Some(code))));
        }
        Ok(out)
    }

    /// `clone(url, path, branch=None, commit_id=None, username=None, password=None,
    /// insecure_skip_tls=None, depth=None)`. Local paths and `file://` URLs work offline;
    /// network URLs need a sandbox with network access.
    pub fn clone(&self, url: impl Into<String>, path: impl Into<String>) -> CloneBuilder {
        CloneBuilder {
            git: Git {
                ctx: self.ctx.clone(),
            },
            url: url.into(),
            path: path.into(),
            branch: None,
            commit_id: None,
            username: None,
            password: None,
            insecure_skip_tls: None,
            depth: None,
        }
    }

    /// `status(path) -> GitStatus`.
    pub async fn status(&self, path: &str) -> Result<GitStatus> {
        let out = self
            .git(
                Some(path),
                vec![
                    "status".into(),
                    "--porcelain=v2".into(),
                    "--branch".into(),
                    "-z".into(),
                ],
                None,
            )
            .await
            .ctx("Failed to get status: ")?;
        Ok(parse_status(&out.stdout_lossy()))
    }

    /// `add(path, files)`: `["."]` stages everything.
    pub async fn add<S: Into<String>>(
        &self,
        path: &str,
        files: impl IntoIterator<Item = S>,
    ) -> Result<()> {
        let mut args = vec!["add".to_string(), "--".to_string()];
        args.extend(files.into_iter().map(Into::into));
        self.git(Some(path), args, None)
            .await
            .ctx("Failed to add files: ")?;
        Ok(())
    }

    /// `commit(path, message, author, email, allow_empty=False) -> GitCommitResponse`.
    pub fn commit(
        &self,
        path: impl Into<String>,
        message: impl Into<String>,
        author: impl Into<String>,
        email: impl Into<String>,
    ) -> CommitBuilder {
        CommitBuilder {
            git: Git {
                ctx: self.ctx.clone(),
            },
            path: path.into(),
            message: message.into(),
            author: author.into(),
            email: email.into(),
            allow_empty: false,
        }
    }

    /// `branches(path) -> ListBranchResponse`: local branches.
    pub async fn branches(&self, path: &str) -> Result<ListBranchResponse> {
        let out = self
            .git(
                Some(path),
                vec!["branch".into(), "--format=%(refname:short)".into()],
                None,
            )
            .await
            .ctx("Failed to list branches: ")?;
        Ok(ListBranchResponse {
            branches: out.stdout_lossy().lines().map(str::to_owned).collect(),
        })
    }

    /// `create_branch(path, name)`: create the branch and check it out.
    pub async fn create_branch(&self, path: &str, name: &str) -> Result<()> {
        self.git(
            Some(path),
            vec!["checkout".into(), "-b".into(), name.into()],
            None,
        )
        .await
        .ctx("Failed to create branch: ")?;
        Ok(())
    }

    /// `init(path, bare=False, initial_branch=None)`: a new repository at `path` (relative to
    /// the work dir).
    pub async fn init(&self, path: &str, bare: bool, initial_branch: Option<&str>) -> Result<()> {
        let mut args = vec!["init".to_string(), "-q".to_string()];
        if bare {
            args.push("--bare".into());
        }
        if let Some(branch) = initial_branch {
            // One argument, so the name can never be read as another option.
            args.push(format!("--initial-branch={branch}"));
        }
        args.push("--".into());
        args.push(self.ctx.resolve(path));
        self.git(None, args, None)
            .await
            .ctx("Failed to initialize repository: ")?;
        Ok(())
    }

    /// `remote_add(path, name, url)`: add a remote (`fetch=True` fetches it at once;
    /// `overwrite=True` replaces a remote of that name).
    pub async fn remote_add(
        &self,
        path: &str,
        name: &str,
        url: &str,
        fetch: bool,
        overwrite: bool,
    ) -> Result<()> {
        const P: &str = "Failed to add remote: ";
        if overwrite
            && self
                .remotes(path)
                .await
                .ctx(P)?
                .iter()
                .any(|(n, _)| n == name)
        {
            self.git(
                Some(path),
                vec!["remote".into(), "remove".into(), "--".into(), name.into()],
                None,
            )
            .await
            .ctx(P)?;
        }
        let mut args = vec!["remote".to_string(), "add".to_string()];
        if fetch {
            args.push("-f".into());
        }
        args.extend(["--".to_string(), name.to_string(), url.to_string()]);
        self.git(Some(path), args, None).await.ctx(P)?;
        Ok(())
    }

    /// `remotes(path)`: each remote's name and fetch URL.
    pub async fn remotes(&self, path: &str) -> Result<Vec<(String, String)>> {
        let out = self
            .git(Some(path), vec!["remote".into(), "-v".into()], None)
            .await
            .ctx("Failed to list remotes: ")?;
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| {
                let l = l.strip_suffix(" (fetch)")?;
                let (name, url) = l.split_once('\t')?;
                Some((name.to_string(), url.to_string()))
            })
            .collect())
    }

    /// `checkout_branch(path, branch)`.
    pub async fn checkout_branch(&self, path: &str, branch: &str) -> Result<()> {
        self.git(Some(path), vec!["checkout".into(), branch.into()], None)
            .await
            .ctx("Failed to checkout branch: ")?;
        Ok(())
    }

    /// `delete_branch(path, name)`.
    pub async fn delete_branch(&self, path: &str, name: &str) -> Result<()> {
        self.git(
            Some(path),
            vec!["branch".into(), "-D".into(), name.into()],
            None,
        )
        .await
        .ctx("Failed to delete branch: ")?;
        Ok(())
    }

    /// `pull(path, username=None, password=None)`.
    pub fn pull(&self, path: impl Into<String>) -> SyncBuilder {
        SyncBuilder {
            git: Git {
                ctx: self.ctx.clone(),
            },
            path: path.into(),
            username: None,
            password: None,
            push: false,
        }
    }

    /// `push(path, username=None, password=None)`.
    pub fn push(&self, path: impl Into<String>) -> SyncBuilder {
        SyncBuilder {
            push: true,
            ..self.pull(path)
        }
    }
}

/// Builder of [`Git::clone`]; await it.
#[derive(Debug)]
#[must_use = "await the builder to run the call"]
pub struct CloneBuilder {
    git: Git,
    url: String,
    path: String,
    branch: Option<String>,
    commit_id: Option<String>,
    username: Option<String>,
    password: Option<String>,
    insecure_skip_tls: Option<bool>,
    depth: Option<i64>,
}

impl CloneBuilder {
    /// `branch=None`.
    pub fn branch(mut self, branch: impl crate::OptionalString) -> Self {
        self.branch = branch.into_optional();
        self
    }
    /// `commit_id=None`: leaves a detached HEAD at that commit.
    pub fn commit_id(mut self, commit_id: impl crate::OptionalString) -> Self {
        self.commit_id = commit_id.into_optional();
        self
    }
    /// `username=None`.
    pub fn username(mut self, username: impl crate::OptionalString) -> Self {
        self.username = username.into_optional();
        self
    }
    /// `password=None`.
    pub fn password(mut self, password: impl crate::OptionalString) -> Self {
        self.password = password.into_optional();
        self
    }
    /// `insecure_skip_tls=None`.
    pub fn insecure_skip_tls(mut self, skip: impl Into<Option<bool>>) -> Self {
        self.insecure_skip_tls = skip.into();
        self
    }
    /// `depth=None`: shallow clone depth.
    pub fn depth(mut self, depth: impl Into<Option<i64>>) -> Self {
        self.depth = depth.into();
        self
    }

    async fn run(self) -> Result<()> {
        const P: &str = "Failed to clone repository: ";
        let ctx = &self.git.ctx;
        if !is_local_url(&self.url) {
            let info = ctx.core.info().await.ctx(P)?;
            if info.network == NetworkPolicy::None {
                return Err(DaytonaError::Connection(ErrorDetails::new(
                    format!(
                        "{P}{} needs network access, and this sandbox has none (created with \
                         network_block_all=True or on a runtime without isolated internet); clone \
                         from a path or file:// URL inside the sandbox instead",
                        self.url
                    ),
                    None,
                    Some("GIT_TRANSPORT_FAILED"),
                )));
            }
        }
        let mut args = Vec::new();
        if self.insecure_skip_tls == Some(true) {
            args.extend(["-c".to_string(), "http.sslVerify=false".to_string()]);
        }
        args.push("clone".into());
        if let Some(b) = &self.branch {
            args.extend(["--branch".to_string(), b.clone()]);
        }
        if let Some(d) = self.depth {
            if d < 1 {
                return Err(DaytonaError::validation("depth must be at least 1")).ctx(P);
            }
            args.extend(["--depth".to_string(), d.to_string()]);
        }
        args.extend(["--".to_string(), self.url.clone(), ctx.resolve(&self.path)]);
        let creds = match (&self.username, &self.password) {
            (Some(u), Some(p)) => Some((u.as_str(), p.as_str())),
            _ => None,
        };
        self.git.git(None, args, creds).await.ctx(P)?;
        if let Some(c) = &self.commit_id {
            self.git
                .git(
                    Some(&self.path),
                    vec!["checkout".into(), "--detach".into(), c.clone()],
                    None,
                )
                .await
                .ctx(P)?;
        }
        Ok(())
    }
}
awaitable!(CloneBuilder => ());

/// Builder of [`Git::commit`]; await it.
#[derive(Debug)]
#[must_use = "await the builder to run the call"]
pub struct CommitBuilder {
    git: Git,
    path: String,
    message: String,
    author: String,
    email: String,
    allow_empty: bool,
}

impl CommitBuilder {
    /// `allow_empty=False`.
    pub fn allow_empty(mut self, allow: bool) -> Self {
        self.allow_empty = allow;
        self
    }

    async fn run(self) -> Result<GitCommitResponse> {
        const P: &str = "Failed to commit changes: ";
        let mut args = vec![
            "-c".to_string(),
            format!("user.name={}", self.author),
            "-c".to_string(),
            format!("user.email={}", self.email),
            "commit".to_string(),
            "-m".to_string(),
            self.message.clone(),
        ];
        if self.allow_empty {
            args.push("--allow-empty".into());
        }
        self.git.git(Some(&self.path), args, None).await.ctx(P)?;
        let out = self
            .git
            .git(
                Some(&self.path),
                vec!["rev-parse".into(), "HEAD".into()],
                None,
            )
            .await
            .ctx(P)?;
        Ok(GitCommitResponse {
            sha: out.stdout_lossy().trim().to_string(),
        })
    }
}
awaitable!(CommitBuilder => GitCommitResponse);

/// Builder of [`Git::pull`] / [`Git::push`]; await it.
#[derive(Debug)]
#[must_use = "await the builder to run the call"]
pub struct SyncBuilder {
    git: Git,
    path: String,
    username: Option<String>,
    password: Option<String>,
    push: bool,
}

impl SyncBuilder {
    /// `username=None`.
    pub fn username(mut self, username: impl crate::OptionalString) -> Self {
        self.username = username.into_optional();
        self
    }
    /// `password=None`.
    pub fn password(mut self, password: impl crate::OptionalString) -> Self {
        self.password = password.into_optional();
        self
    }

    async fn run(self) -> Result<()> {
        let (verb, prefix) = if self.push {
            ("push", "Failed to push changes: ")
        } else {
            ("pull", "Failed to pull changes: ")
        };
        let creds = match (&self.username, &self.password) {
            (Some(u), Some(p)) => Some((u.as_str(), p.as_str())),
            _ => None,
        };
        self.git
            .git(Some(&self.path), vec![verb.into()], creds)
            .await
            .ctx(prefix)?;
        Ok(())
    }
}
awaitable!(SyncBuilder => ());

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn porcelain_v2_status_is_parsed() {
        let out = "# branch.oid abc\0# branch.head main\0# branch.upstream origin/main\0\
                   # branch.ab +2 -1\x001 .M N... 100644 100644 100644 a a x.txt\x00\
                   1 A. N... 000000 100644 100644 0 a new file.txt\x00\
                   2 R. N... 100644 100644 100644 a a R100 b.txt\0a.txt\0? u.txt\0";
        let st = parse_status(out);
        assert_eq!(st.current_branch, "main");
        assert_eq!((st.ahead, st.behind), (Some(2), Some(1)));
        assert_eq!(st.branch_published, Some(true));
        let names: Vec<_> = st.file_status.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["x.txt", "new file.txt", "b.txt", "u.txt"]);
        assert_eq!(st.file_status[0].worktree, "Modified");
        assert_eq!(st.file_status[0].staging, "Unmodified");
        assert_eq!(st.file_status[1].staging, "Added");
        assert_eq!(st.file_status[2].staging, "Renamed");
        assert_eq!(st.file_status[2].extra, "a.txt");
        assert_eq!(st.file_status[3].staging, "Untracked");
        let fresh = parse_status("# branch.oid (initial)\0# branch.head master\0");
        assert_eq!(fresh.current_branch, "master");
        assert_eq!(fresh.ahead, None);
        assert_eq!(fresh.branch_published, Some(false));
    }

    #[test]
    fn local_sources_are_recognised() {
        for local in ["/home/daytona/repo", "file:///tmp/r", "./r", "repo"] {
            assert!(is_local_url(local), "{local}");
        }
        for remote in [
            "https://github.com/daytonaio/daytona.git",
            "git@github.com:a/b.git",
            "ssh://host/r",
        ] {
            assert!(!is_local_url(remote), "{remote}");
        }
    }
}
