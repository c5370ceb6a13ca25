//! `sandbox.fs` (Python `SandboxFileSystem`). The sandbox's home is `/blaxel`, so Blaxel paths
//! are used as they are; relative paths resolve against `/blaxel`.

use std::sync::{Arc, Mutex};

use futures::StreamExt;
use serde_json::Value;

use crate::errors::{Result, SandboxAPIError};
use crate::models::{
    self, ContentSearchMatch, ContentSearchResponse, CopyResponse, Directory, File, FindMatch,
    FindResponse, SandboxFilesystemFile, Subdirectory, SuccessResponse, WatchEvent,
};
use crate::process::SandboxProcess;
use crate::sandbox::{into_future, Ctx};
use crate::translate::{self, DEFAULT_EXCLUDE_DIRS, HOME};

/// How deep `find` and `grep` descend.
const SEARCH_DEPTH: u32 = 32;

/// `sandbox.fs`.
#[derive(Debug, Clone)]
pub struct SandboxFileSystem {
    ctx: Ctx,
}

/// Content for `write_binary`: bytes, or (as in Python, where a `str` is a local file path)
/// a local path whose bytes are uploaded.
#[derive(Debug, Clone)]
pub enum BinaryContent {
    /// The bytes themselves.
    Bytes(Vec<u8>),
    /// A file on this machine.
    LocalPath(std::path::PathBuf),
}
impl From<Vec<u8>> for BinaryContent {
    fn from(b: Vec<u8>) -> Self {
        BinaryContent::Bytes(b)
    }
}
impl From<&[u8]> for BinaryContent {
    fn from(b: &[u8]) -> Self {
        BinaryContent::Bytes(b.to_vec())
    }
}
impl<const N: usize> From<&[u8; N]> for BinaryContent {
    fn from(b: &[u8; N]) -> Self {
        BinaryContent::Bytes(b.to_vec())
    }
}
impl From<&str> for BinaryContent {
    fn from(p: &str) -> Self {
        BinaryContent::LocalPath(p.into())
    }
}
impl From<&std::path::Path> for BinaryContent {
    fn from(p: &std::path::Path) -> Self {
        BinaryContent::LocalPath(p.into())
    }
}

/// Anything `write_tree` accepts: a list of [`SandboxFilesystemFile`] or a `json!` list of
/// `{"path", "content"}` dicts.
pub trait IntoTreeFiles {
    /// The files, or a `ValueError`.
    fn into_files(self) -> Result<Vec<SandboxFilesystemFile>>;
}
impl IntoTreeFiles for Vec<SandboxFilesystemFile> {
    fn into_files(self) -> Result<Vec<SandboxFilesystemFile>> {
        Ok(self)
    }
}
impl IntoTreeFiles for Value {
    fn into_files(self) -> Result<Vec<SandboxFilesystemFile>> {
        models::from_value(self, "list of SandboxFilesystemFile")
    }
}

/// Builder of `fs.mkdir(path, permissions="0755")`.
#[derive(Debug)]
pub struct MkdirBuilder {
    ctx: Ctx,
    path: String,
    permissions: String,
}
impl MkdirBuilder {
    /// `permissions=`: octal string (default `0755`).
    pub fn permissions(mut self, p: impl Into<String>) -> Self {
        self.permissions = p.into();
        self
    }
    async fn run(self) -> Result<SuccessResponse> {
        let mode = translate::parse_permissions(&self.permissions).ok_or_else(|| {
            SandboxAPIError::response(422, format!("invalid permissions {:?}", self.permissions))
        })?;
        let stat = self
            .ctx
            .core
            .mkdir_with(
                &self.path,
                sandcove::MkdirOptions::default().parents(true).mode(mode),
            )
            .await?;
        Ok(SuccessResponse {
            message: "Directory created successfully".into(),
            path: Some(stat.path),
        })
    }
}
into_future!(MkdirBuilder => SuccessResponse);

/// Builder of `fs.rm(path, recursive=False)`.
#[derive(Debug)]
pub struct RmBuilder {
    ctx: Ctx,
    path: String,
    recursive: bool,
}
impl RmBuilder {
    /// `recursive=`: remove a non-empty directory with its contents.
    pub fn recursive(mut self, r: bool) -> Self {
        self.recursive = r;
        self
    }
    async fn run(self) -> Result<SuccessResponse> {
        let stat = match self.ctx.core.stat(&self.path).await {
            Ok(s) => s,
            Err(e) if e.is_not_found() => {
                return Err(SandboxAPIError::response_from(
                    404,
                    "file or directory not found",
                    e,
                ))
            }
            Err(e) => return Err(e.into()),
        };
        let result = self
            .ctx
            .core
            .remove_with(
                &self.path,
                sandcove::RemoveOptions::default().recursive(self.recursive),
            )
            .await;
        match result {
            Ok(()) => {}
            Err(e @ sandcove::Error::InvalidArgument { .. }) => {
                return Err(SandboxAPIError::response_from(
                    422,
                    format!("directory not empty: {}", self.path),
                    e,
                ))
            }
            Err(e) => return Err(e.into()),
        }
        let message = if stat.kind == sandcove::FileKind::Dir {
            "Directory deleted successfully"
        } else {
            "File deleted successfully"
        };
        Ok(SuccessResponse {
            message: message.into(),
            path: Some(stat.path),
        })
    }
}
into_future!(RmBuilder => SuccessResponse);

/// Builder of `fs.write_tree(files, destination_path=None)`.
#[derive(Debug)]
pub struct WriteTreeBuilder {
    fs: SandboxFileSystem,
    files: Result<Vec<SandboxFilesystemFile>>,
    destination_path: Option<String>,
}
impl WriteTreeBuilder {
    /// `destination_path=`: where the paths are joined (default `/`).
    pub fn destination_path(mut self, p: impl crate::OptionalString) -> Self {
        self.destination_path = p.into_optional();
        self
    }
    async fn run(self) -> Result<Directory> {
        let files = self.files?;
        let dest = self.destination_path.unwrap_or_else(|| "/".into());
        let base = dest.trim_end_matches('/');
        for f in files {
            let path = if f.path.starts_with('/') && base.is_empty() {
                f.path.clone()
            } else {
                format!("{base}/{}", f.path.trim_start_matches('/'))
            };
            self.fs.write(&path, &f.content).await?;
        }
        self.fs.ls(if dest.is_empty() { "/" } else { &dest }).await
    }
}
into_future!(WriteTreeBuilder => Directory);

/// Builder of `fs.cp(source, destination, max_wait=180000)` (ms).
#[derive(Debug)]
pub struct CpBuilder {
    ctx: Ctx,
    source: String,
    destination: String,
    max_wait: i64,
    no_overwrite: bool,
}
impl CpBuilder {
    /// `max_wait=` in ms (default 180000).
    pub fn max_wait(mut self, ms: i64) -> Self {
        self.max_wait = ms;
        self
    }

    /// `no_overwrite=`: copy in one runtime call that never replaces anything; an existing
    /// final target is a 409 `FILE_ALREADY_EXISTS` (Python raises `FileExistsError`).
    pub fn no_overwrite(mut self, no_overwrite: bool) -> Self {
        self.no_overwrite = no_overwrite;
        self
    }

    async fn run(self) -> Result<CopyResponse> {
        if self.no_overwrite {
            return copy_in_runtime(&self.ctx, &self.source, &self.destination, false).await;
        }
        let process = SandboxProcess::new(self.ctx.clone());
        let command = format!(
            "cp -r {} {}",
            translate::shell_quote(&self.source),
            translate::shell_quote(&self.destination)
        );
        let started = process
            .exec(serde_json::json!({ "command": command }))
            .await?;
        let done = process
            .wait(&started.pid)
            .max_wait(self.max_wait)
            .interval(100)
            .await?;
        if done.status == "failed" {
            return Err(SandboxAPIError::exception(format!(
                "Could not copy {} to {} cause: {}",
                self.source, self.destination, done.logs
            )));
        }
        Ok(CopyResponse {
            message: "Files copied".into(),
            source: self.source,
            destination: self.destination,
        })
    }
}
into_future!(CpBuilder => CopyResponse);

/// The error of a copy whose final target exists.
pub(crate) fn file_exists(source: &str, destination: &str) -> SandboxAPIError {
    SandboxAPIError::api(
        409,
        "FILE_ALREADY_EXISTS",
        format!("Could not copy {source} to {destination}: destination already exists"),
    )
}

/// Copy `source` to `destination` with the runtime's copy (streamed beneath the sandbox
/// root, symlinks copied as links), `cp -r` style: an existing destination directory holds
/// the copy under the source's name. Without `overwrite`, nothing that exists is replaced.
pub(crate) async fn copy_in_runtime(
    ctx: &Ctx,
    source: &str,
    destination: &str,
    overwrite: bool,
) -> Result<CopyResponse> {
    if source.is_empty() || destination.is_empty() {
        return Err(SandboxAPIError::value_error(
            "source and destination must be nonempty paths",
        ));
    }
    let from = match ctx.core.stat(source).await {
        Ok(st) => st,
        Err(e) if e.is_not_found() => {
            return Err(SandboxAPIError::api(
                404,
                "FILE_NOT_FOUND",
                format!("Could not copy {source}: no such file or directory"),
            ))
        }
        Err(e) => return Err(e.into()),
    };
    let target = match ctx.core.stat(destination).await {
        Ok(st) if st.kind == sandcove::FileKind::Dir => {
            format!(
                "{}/{}",
                destination.trim_end_matches('/'),
                translate::basename(source)
            )
        }
        Ok(_) => destination.to_string(),
        Err(e) if e.is_not_found() => destination.to_string(),
        Err(e) => return Err(e.into()),
    };
    let mut options = sandcove::CopyOptions::default();
    options.recursive = from.kind == sandcove::FileKind::Dir;
    options.overwrite = overwrite;
    match ctx.core.copy(source, &target, options).await {
        Ok(_) => Ok(CopyResponse {
            message: "Files copied".into(),
            source: source.to_string(),
            destination: destination.to_string(),
        }),
        Err(sandcove::Error::AlreadyExists { .. }) => Err(file_exists(source, destination)),
        Err(e) => Err(e.into()),
    }
}

/// Builder of `fs.find(path, type=None, patterns=None, max_results=None, exclude_dirs=None,
/// exclude_hidden=None)`.
#[derive(Debug)]
pub struct FindBuilder {
    ctx: Ctx,
    path: String,
    r#type: Option<String>,
    patterns: Option<Vec<String>>,
    max_results: Option<i64>,
    exclude_dirs: Option<Vec<String>>,
    exclude_hidden: Option<bool>,
}
impl FindBuilder {
    /// `type=`: `file` (default) or `directory`.
    pub fn r#type(mut self, t: impl crate::OptionalString) -> Self {
        self.r#type = t.into_optional();
        self
    }
    /// `patterns=`: globs matched against base names.
    pub fn patterns<I, S>(mut self, p: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.patterns = Some(p.into_iter().map(Into::into).collect());
        self
    }
    /// `max_results=` (default 20; 0 is unlimited, capped at 1000).
    pub fn max_results(mut self, n: impl Into<Option<i64>>) -> Self {
        self.max_results = n.into();
        self
    }
    /// `exclude_dirs=` (default: node_modules, vendor, .git, dist, build, target, …).
    pub fn exclude_dirs<I, S>(mut self, d: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.exclude_dirs = Some(d.into_iter().map(Into::into).collect());
        self
    }
    /// `exclude_hidden=` (default true).
    pub fn exclude_hidden(mut self, h: impl Into<Option<bool>>) -> Self {
        self.exclude_hidden = h.into();
        self
    }
    async fn run(self) -> Result<FindResponse> {
        let want_dir = match self.r#type.as_deref().unwrap_or("file") {
            "file" => false,
            "directory" => true,
            other => {
                return Err(SandboxAPIError::response(
                    400,
                    format!("type must be file or directory, got {other:?}"),
                ))
            }
        };
        let limit = cap(self.max_results.unwrap_or(20));
        let (base, entries) = walk(
            &self.ctx,
            &self.path,
            self.exclude_dirs.as_deref(),
            self.exclude_hidden.unwrap_or(true),
        )
        .await?;
        let mut matches = Vec::new();
        for e in entries {
            let is_dir = e.kind == sandcove::FileKind::Dir;
            if is_dir != want_dir {
                continue;
            }
            if let Some(p) = &self.patterns {
                if !p.is_empty() && !p.iter().any(|g| translate::glob_match(g, &e.name)) {
                    continue;
                }
            }
            if matches.len() >= limit {
                break;
            }
            matches.push(FindMatch {
                path: translate::relative_to(&e.path, &base),
                type_: if is_dir { "directory" } else { "file" }.into(),
            });
        }
        Ok(FindResponse {
            total: matches.len() as i64,
            matches,
        })
    }
}
into_future!(FindBuilder => FindResponse);

/// Builder of `fs.grep(query, path="/", case_sensitive=None, context_lines=None,
/// max_results=None, file_pattern=None, exclude_dirs=None)`.
#[derive(Debug)]
pub struct GrepBuilder {
    ctx: Ctx,
    query: String,
    path: String,
    case_sensitive: Option<bool>,
    context_lines: Option<i64>,
    max_results: Option<i64>,
    file_pattern: Option<String>,
    exclude_dirs: Option<Vec<String>>,
}
impl GrepBuilder {
    /// `path=` (default `/`, which — as on Blaxel — searches the working directory `/blaxel`).
    pub fn path(mut self, p: impl Into<String>) -> Self {
        self.path = p.into();
        self
    }
    /// `case_sensitive=` (default false).
    pub fn case_sensitive(mut self, c: impl Into<Option<bool>>) -> Self {
        self.case_sensitive = c.into();
        self
    }
    /// `context_lines=`: accepted and ignored, as on Blaxel (`context` is never filled).
    pub fn context_lines(mut self, n: impl Into<Option<i64>>) -> Self {
        self.context_lines = n.into();
        self
    }
    /// `max_results=` (default 100; 0 is unlimited, capped at 1000).
    pub fn max_results(mut self, n: impl Into<Option<i64>>) -> Self {
        self.max_results = n.into();
        self
    }
    /// `file_pattern=`: glob matched against base names.
    pub fn file_pattern(mut self, p: impl crate::OptionalString) -> Self {
        self.file_pattern = p.into_optional();
        self
    }
    /// `exclude_dirs=`.
    pub fn exclude_dirs<I, S>(mut self, d: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.exclude_dirs = Some(d.into_iter().map(Into::into).collect());
        self
    }
    async fn run(self) -> Result<ContentSearchResponse> {
        let _ = self.context_lines;
        let path = match self.path.as_str() {
            "/" | "" | "." => HOME.to_string(),
            p => p.to_string(),
        };
        let limit = cap(self.max_results.unwrap_or(100));
        let case = self.case_sensitive.unwrap_or(false);
        let (base, entries) = walk(&self.ctx, &path, self.exclude_dirs.as_deref(), true).await?;
        let mut matches = Vec::new();
        'files: for e in entries {
            if e.kind != sandcove::FileKind::File {
                continue;
            }
            if let Some(p) = &self.file_pattern {
                if !translate::glob_match(p, &e.name) {
                    continue;
                }
            }
            let Ok(bytes) = self.ctx.core.read_with(&e.path, whole()).await else {
                continue;
            };
            if bytes.contains(&0) {
                continue;
            }
            let text = String::from_utf8_lossy(&bytes);
            for (i, line) in text.lines().enumerate() {
                if let Some(column) = translate::grep_line(line, &self.query, case) {
                    if matches.len() >= limit {
                        break 'files;
                    }
                    matches.push(ContentSearchMatch {
                        path: translate::relative_to(&e.path, &base),
                        line: i as i64 + 1,
                        column,
                        text: line.to_string(),
                        context: None,
                    });
                }
            }
        }
        Ok(ContentSearchResponse {
            query: self.query,
            total: matches.len() as i64,
            matches,
        })
    }
}
into_future!(GrepBuilder => ContentSearchResponse);

/// Builder of `fs.download(src, destination_path, mode=0o644)`.
#[derive(Debug)]
pub struct DownloadBuilder {
    fs: SandboxFileSystem,
    src: String,
    destination_path: String,
    mode: u32,
}
impl DownloadBuilder {
    /// `mode=` of the local file (default `0o644`).
    pub fn mode(mut self, mode: u32) -> Self {
        self.mode = mode;
        self
    }
    async fn run(self) -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let bytes = self.fs.read_binary(&self.src).await?;
        let local_err = |e: std::io::Error| {
            SandboxAPIError::exception(format!("write {}: {e}", self.destination_path))
        };
        tokio::fs::write(&self.destination_path, bytes)
            .await
            .map_err(local_err)?;
        tokio::fs::set_permissions(
            &self.destination_path,
            std::fs::Permissions::from_mode(self.mode),
        )
        .await
        .map_err(local_err)?;
        Ok(())
    }
}
into_future!(DownloadBuilder => ());

/// A watch callback.
pub type WatchCallback = Box<dyn FnMut(WatchEvent) + Send + 'static>;
/// A watch error callback.
pub type ErrorCallback = Box<dyn FnMut(SandboxAPIError) + Send + 'static>;

/// Options of `fs.watch` (the `options` dict): `with_content`, `ignore`. `on_error` is the
/// builder setter.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WatchOptions {
    /// Read the file's text into `event.content` on CREATE and WRITE.
    #[serde(default, alias = "with_content")]
    pub with_content: bool,
    /// Substrings of full paths whose events are dropped.
    #[serde(default)]
    pub ignore: Vec<String>,
}

/// Anything `watch` accepts as `options`: [`WatchOptions`], a `json!` dict, or `None`.
pub trait IntoWatchOptions {
    /// The options, or a `ValueError`.
    fn into_watch_options(self) -> Result<WatchOptions>;
}
impl IntoWatchOptions for WatchOptions {
    fn into_watch_options(self) -> Result<WatchOptions> {
        Ok(self)
    }
}
impl IntoWatchOptions for Option<WatchOptions> {
    fn into_watch_options(self) -> Result<WatchOptions> {
        Ok(self.unwrap_or_default())
    }
}
impl IntoWatchOptions for Value {
    fn into_watch_options(self) -> Result<WatchOptions> {
        if self.is_null() {
            return Ok(WatchOptions::default());
        }
        models::from_value(self, "watch options")
    }
}

/// Builder of `fs.watch(path, callback, options=None)`; yields an [`AsyncWatchHandle`].
pub struct WatchBuilder {
    ctx: Ctx,
    path: String,
    callback: WatchCallback,
    options: Result<WatchOptions>,
    on_error: Option<ErrorCallback>,
}

impl std::fmt::Debug for WatchBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchBuilder")
            .field("path", &self.path)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl WatchBuilder {
    /// `options=`: [`WatchOptions`], a `json!` dict (`with_content`, `ignore`), or `None`. A key
    /// the facade does not know is an error when the builder is awaited.
    pub fn options(mut self, options: impl IntoWatchOptions) -> Self {
        self.options = options.into_watch_options();
        self
    }

    /// `options["on_error"]`: receives errors of the running watch.
    pub fn on_error(mut self, f: impl FnMut(SandboxAPIError) + Send + 'static) -> Self {
        self.on_error = Some(Box::new(f));
        self
    }

    async fn run(self) -> Result<AsyncWatchHandle> {
        let options = self.options?;
        let (path, recursive) = match self.path.strip_suffix("/**") {
            Some(p) => (if p.is_empty() { "/" } else { p }.to_string(), true),
            None => (self.path.clone(), false),
        };
        let stat = self.ctx.core.stat(&path).await?;
        if stat.kind != sandcove::FileKind::Dir {
            return Err(SandboxAPIError::response(400, "path is not a directory"));
        }
        let mut stream = self
            .ctx
            .core
            .watch(
                &path,
                sandcove::WatchOptions::default().recursive(recursive),
            )
            .await?;
        let core = self.ctx.core.clone();
        let mut callback = self.callback;
        let mut on_error = self.on_error;
        let task = tokio::spawn(async move {
            while let Some(item) = stream.next().await {
                let event = match item {
                    Ok(e) => e,
                    Err(e) => {
                        if let Some(f) = &mut on_error {
                            f(e.into());
                        }
                        break;
                    }
                };
                if options
                    .ignore
                    .iter()
                    .any(|i| event.path.contains(i.as_str()))
                {
                    continue;
                }
                let mut op = match event.kind {
                    sandcove::FsEventKind::Create => "CREATE",
                    sandcove::FsEventKind::Write => "WRITE",
                    sandcove::FsEventKind::Remove => "REMOVE",
                    sandcove::FsEventKind::Rename => "RENAME",
                    sandcove::FsEventKind::Chmod => "CHMOD",
                };
                // The side of a rename that exists afterwards is reported as its creation.
                if op == "RENAME" && core.stat(&event.path).await.is_ok() {
                    op = "CREATE";
                }
                let content = if options.with_content && (op == "CREATE" || op == "WRITE") {
                    core.read_with(&event.path, whole())
                        .await
                        .ok()
                        .map(|b| String::from_utf8_lossy(&b).into_owned())
                } else {
                    None
                };
                callback(WatchEvent {
                    op: op.into(),
                    path: translate::parent(&event.path),
                    name: translate::basename(&event.path),
                    content,
                });
            }
        });
        Ok(AsyncWatchHandle {
            task: Arc::new(Mutex::new(Some(task))),
        })
    }
}
into_future!(WatchBuilder => AsyncWatchHandle);

/// A running watch (Python `AsyncWatchHandle`).
#[derive(Debug, Clone)]
pub struct AsyncWatchHandle {
    task: Arc<Mutex<Option<tokio::task::JoinHandle<()>>>>,
}

impl AsyncWatchHandle {
    /// `close()`: no callback fires afterwards.
    pub fn close(&self) {
        if let Some(t) = self.task.lock().unwrap_or_else(|e| e.into_inner()).take() {
            t.abort();
        }
    }

    /// `closed`: whether the watch was closed or ended.
    pub fn closed(&self) -> bool {
        self.task
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_none_or(|t| t.is_finished())
    }
}

fn cap(n: i64) -> usize {
    if n <= 0 {
        1000
    } else {
        n.min(1000) as usize
    }
}

/// Entries under `path` (resolved), skipping excluded and (optionally) hidden directories;
/// returns the resolved base path and the entries sorted by path.
async fn walk(
    ctx: &Ctx,
    path: &str,
    exclude_dirs: Option<&[String]>,
    exclude_hidden: bool,
) -> Result<(String, Vec<sandcove::FileStat>)> {
    let base = ctx.core.stat(path).await?;
    if base.kind != sandcove::FileKind::Dir {
        return Err(SandboxAPIError::response(
            400,
            format!("{path} is not a directory"),
        ));
    }
    let default: Vec<String> = DEFAULT_EXCLUDE_DIRS.iter().map(|s| s.to_string()).collect();
    let exclude = exclude_dirs.unwrap_or(&default);
    let mut entries = ctx.core.list_dir(&base.path, SEARCH_DEPTH).await?;
    entries.retain(|e| {
        let rel = translate::relative_to(&e.path, &base.path);
        let parts: Vec<&str> = rel.split('/').collect();
        let dirs = &parts[..parts.len().saturating_sub(1)];
        if dirs.iter().any(|d| exclude.iter().any(|x| x == d)) {
            return false;
        }
        if e.kind == sandcove::FileKind::Dir && exclude.contains(&e.name) {
            return false;
        }
        !(exclude_hidden && parts.iter().any(|p| p.starts_with('.')))
    });
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    Ok((base.path, entries))
}

fn not_found_read(path: &str, e: sandcove::Error) -> SandboxAPIError {
    SandboxAPIError::response_from(404, format!("stat {path}: no such file or directory"), e)
}

impl SandboxFileSystem {
    pub(crate) fn new(ctx: Ctx) -> Self {
        SandboxFileSystem { ctx }
    }

    /// `fs.mkdir(path, permissions="0755")`: recursive; succeeds if it exists.
    pub fn mkdir(&self, path: &str) -> MkdirBuilder {
        MkdirBuilder {
            ctx: self.ctx.clone(),
            path: path.to_string(),
            permissions: "0755".into(),
        }
    }

    /// `fs.write(path, content)`: text; parents created; mode 0644.
    pub async fn write(&self, path: &str, content: &str) -> Result<SuccessResponse> {
        let stat = self.write_bytes(path, content.as_bytes().to_vec()).await?;
        Ok(SuccessResponse {
            message: "File created/updated successfully".into(),
            path: Some(stat.path),
        })
    }

    /// `fs.write_binary(path, content)`: bytes, or a local file path (Python's `str`).
    pub async fn write_binary(
        &self,
        path: &str,
        content: impl Into<BinaryContent>,
    ) -> Result<SuccessResponse> {
        let bytes = match content.into() {
            BinaryContent::Bytes(b) => b,
            BinaryContent::LocalPath(p) => tokio::fs::read(&p).await.map_err(|e| {
                SandboxAPIError::exception(format!("Failed to write binary: {}: {e}", p.display()))
            })?,
        };
        let stream: sandcove::ByteStream =
            Box::pin(futures::stream::once(async move { Ok(bytes) }));
        self.write_binary_stream(path, stream, None).await
    }

    async fn write_bytes(&self, path: &str, bytes: Vec<u8>) -> Result<sandcove::FileStat> {
        let stream: sandcove::ByteStream =
            Box::pin(futures::stream::once(async move { Ok(bytes) }));
        let options = sandcove::WriteOptions::default()
            .create_parents(true)
            .mode(0o644)
            .append(false);
        Ok(self.ctx.core.write_stream(path, stream, options).await?)
    }

    /// `write_binary` from a stream (the wire's streamed uploads), of at most `max_bytes`
    /// when given: parents created, mode 0644, what was there replaced only once the stream
    /// has ended without an error.
    pub(crate) async fn write_binary_stream(
        &self,
        path: &str,
        data: sandcove::ByteStream,
        max_bytes: Option<u64>,
    ) -> Result<SuccessResponse> {
        let mut options = sandcove::WriteOptions::default()
            .create_parents(true)
            .mode(0o644)
            .append(false);
        options.max_bytes = max_bytes;
        let stat = self.ctx.core.write_stream(path, data, options).await?;
        Ok(SuccessResponse {
            message: "Binary file uploaded successfully".into(),
            path: Some(stat.path),
        })
    }

    /// The core sandbox (the wire's multipart uploads keep their parts in it).
    #[cfg(feature = "wire")]
    pub(crate) fn core(&self) -> &sandcove::Sandbox {
        &self.ctx.core
    }

    /// `fs.write_tree(files, destination_path=None)`: writes each file under the destination
    /// and returns its listing.
    pub fn write_tree(&self, files: impl IntoTreeFiles) -> WriteTreeBuilder {
        WriteTreeBuilder {
            fs: self.clone(),
            files: files.into_files(),
            destination_path: None,
        }
    }

    /// `fs.read(path)`: the file as text (invalid UTF-8 replaced). A directory raises
    /// `Exception("Unsupported file type")`.
    pub async fn read(&self, path: &str) -> Result<String> {
        let bytes = self.read_binary(path).await?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// `fs.read_binary(path)`: exact bytes.
    pub async fn read_binary(&self, path: &str) -> Result<Vec<u8>> {
        match self.ctx.core.read_with(path, whole()).await {
            Ok(b) => Ok(b),
            Err(e) if e.is_not_found() => Err(not_found_read(path, e)),
            Err(e @ sandcove::Error::InvalidArgument { .. })
                if self
                    .ctx
                    .core
                    .stat(path)
                    .await
                    .is_ok_and(|s| s.kind == sandcove::FileKind::Dir) =>
            {
                Err(SandboxAPIError::Exception {
                    message: "Unsupported file type".into(),
                    source: Some(Box::new(e)),
                })
            }
            Err(e) => Err(e.into()),
        }
    }

    /// `fs.download(src, destination_path, mode=0o644)`: copy a sandbox file to this machine.
    pub fn download(&self, src: &str, destination_path: &str) -> DownloadBuilder {
        DownloadBuilder {
            fs: self.clone(),
            src: src.to_string(),
            destination_path: destination_path.to_string(),
            mode: 0o644,
        }
    }

    /// `fs.rm(path, recursive=False)`.
    pub fn rm(&self, path: &str) -> RmBuilder {
        RmBuilder {
            ctx: self.ctx.clone(),
            path: path.to_string(),
            recursive: false,
        }
    }

    /// `fs.ls(path)`: one level, sorted by name; symlinks are files. A file raises
    /// `Exception('{"error": "Directory not found"}')`.
    pub async fn ls(&self, path: &str) -> Result<Directory> {
        let stat = match self.ctx.core.stat(path).await {
            Ok(s) => s,
            Err(e) if e.is_not_found() => return Err(not_found_read(path, e)),
            Err(e) => return Err(e.into()),
        };
        if stat.kind != sandcove::FileKind::Dir {
            return Err(SandboxAPIError::exception(
                r#"{"error": "Directory not found"}"#,
            ));
        }
        let mut entries = self.ctx.core.list_dir(&stat.path, 1).await?;
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        let shown_dir = translate::shown_path(path, &stat.path, &stat.path);
        let mut dir = Directory {
            name: translate::basename(&shown_dir),
            path: shown_dir,
            files: Vec::new(),
            subdirectories: Vec::new(),
        };
        for e in entries {
            let shown = translate::shown_path(path, &stat.path, &e.path);
            if e.kind == sandcove::FileKind::Dir {
                dir.subdirectories.push(Subdirectory {
                    path: shown,
                    name: e.name,
                });
            } else {
                dir.files.push(File {
                    path: shown,
                    name: e.name,
                    permissions: format!("{:o}", e.mode),
                    size: e.size as i64,
                    last_modified: translate::format_rfc3339(e.modified),
                    owner: if e.owner.is_empty() {
                        e.uid.to_string()
                    } else {
                        e.owner
                    },
                    group: if e.group.is_empty() {
                        e.gid.to_string()
                    } else {
                        e.group
                    },
                });
            }
        }
        Ok(dir)
    }

    /// `fs.cp(source, destination, max_wait=180000)`: runs `cp -r` as a process, as Blaxel
    /// does.
    pub fn cp(&self, source: &str, destination: &str) -> CpBuilder {
        CpBuilder {
            ctx: self.ctx.clone(),
            source: source.to_string(),
            destination: destination.to_string(),
            max_wait: 180_000,
            no_overwrite: false,
        }
    }

    /// `fs.find(path, type=None, patterns=None, max_results=None, exclude_dirs=None,
    /// exclude_hidden=None)`: result paths are relative to `path`.
    pub fn find(&self, path: &str) -> FindBuilder {
        FindBuilder {
            ctx: self.ctx.clone(),
            path: path.to_string(),
            r#type: None,
            patterns: None,
            max_results: None,
            exclude_dirs: None,
            exclude_hidden: None,
        }
    }

    /// `fs.grep(query, path="/", …)`: substring search, case-insensitive by default, first
    /// match per line, 1-based line and column.
    pub fn grep(&self, query: &str) -> GrepBuilder {
        GrepBuilder {
            ctx: self.ctx.clone(),
            query: query.to_string(),
            path: "/".into(),
            case_sensitive: None,
            context_lines: None,
            max_results: None,
            file_pattern: None,
            exclude_dirs: None,
        }
    }

    /// `fs.watch(path, callback, options=None)`: events for the directory (recursive when the
    /// path ends with `/**`). `options` has a default, so it is the `.options(...)` setter
    /// ([`WatchOptions`], a dict, or `None`).
    pub fn watch(
        &self,
        path: &str,
        callback: impl FnMut(WatchEvent) + Send + 'static,
    ) -> WatchBuilder {
        WatchBuilder {
            ctx: self.ctx.clone(),
            path: path.to_string(),
            callback: Box::new(callback),
            options: Ok(WatchOptions::default()),
            on_error: None,
        }
    }
}

/// Blaxel's calls hold a file whole: up to the core's largest in-memory bound (a larger file
/// is `FileTooLarge`, 413).
fn whole() -> sandcove::ReadOptions {
    sandcove::ReadOptions::default().max_bytes(sandcove::MAX_MEMORY_FILE_BYTES)
}
