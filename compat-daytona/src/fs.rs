//! Python `sandbox.fs`: files and folders, upload/download, find/search/replace.
//!
//! Relative paths resolve against the work dir. Find, search and replace walk the tree
//! through the runtime's file API, so they need no tools inside the sandbox and are
//! binary-safe.

use sandcove::{FileKind, FileStat, ListDirOptions, MkdirOptions, RemoveOptions};

use crate::client::with_timeout;
use crate::ctx::Ctx;
use crate::errors::{Context, DaytonaError, ErrorDetails};
use crate::translate;
use crate::{awaitable, Result};

/// Default `timeout` of uploads and downloads, in seconds (as Daytona).
const FILE_TIMEOUT: i64 = 1800;

/// How deep find/search/replace walk.
const WALK_DEPTH: u32 = 64;

/// Python `FileInfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileInfo {
    /// `name`: the base name.
    pub name: String,
    /// `is_dir`.
    pub is_dir: bool,
    /// `size` in bytes.
    pub size: i64,
    /// `mode`: Go-style, e.g. `-rw-r--r--`.
    pub mode: String,
    /// `permissions`: 4-digit octal, e.g. `0644`.
    pub permissions: String,
    /// `owner`: numeric uid as a string.
    pub owner: String,
    /// `group`: numeric gid as a string.
    pub group: String,
    /// `mod_time`: Go `time.String()` format (deprecated in Python).
    pub mod_time: String,
    /// `modified_at`: RFC 3339.
    pub modified_at: String,
    /// `path`: the full path.
    pub path: String,
}

impl From<&FileStat> for FileInfo {
    fn from(s: &FileStat) -> Self {
        FileInfo {
            name: s.name.clone(),
            is_dir: s.kind == FileKind::Dir,
            size: s.size as i64,
            mode: translate::go_mode_string(s.kind, s.mode),
            permissions: format!("{:04o}", s.mode & 0o7777),
            owner: s.uid.to_string(),
            group: s.gid.to_string(),
            mod_time: translate::go_time_string(s.modified),
            modified_at: translate::rfc3339(s.modified),
            path: s.path.clone(),
        }
    }
}

/// Python `Match` (a `find_files` hit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Match {
    /// `file`: the path as walked (relative input stays relative).
    pub file: String,
    /// `line`: 1-based.
    pub line: i64,
    /// `content`: the line.
    pub content: String,
}

/// Python `SearchFilesResponse`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SearchFilesResponse {
    /// `files`: matching paths as walked.
    pub files: Vec<String>,
}

/// Python `ReplaceResult`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplaceResult {
    /// `file`.
    pub file: String,
    /// `success`.
    pub success: bool,
    /// `error`.
    pub error: Option<String>,
}

/// What to upload: bytes, or (for a string, as in Python) a **local** file path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileSource {
    /// Content.
    Bytes(Vec<u8>),
    /// A path on the machine running this program.
    LocalPath(String),
}

impl From<Vec<u8>> for FileSource {
    fn from(v: Vec<u8>) -> Self {
        FileSource::Bytes(v)
    }
}
impl From<&[u8]> for FileSource {
    fn from(v: &[u8]) -> Self {
        FileSource::Bytes(v.to_vec())
    }
}
impl<const N: usize> From<&[u8; N]> for FileSource {
    fn from(v: &[u8; N]) -> Self {
        FileSource::Bytes(v.to_vec())
    }
}
impl From<&str> for FileSource {
    fn from(p: &str) -> Self {
        FileSource::LocalPath(p.to_string())
    }
}
impl From<String> for FileSource {
    fn from(p: String) -> Self {
        FileSource::LocalPath(p)
    }
}

/// Python `FileUpload(source, destination)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileUpload {
    /// `source`: bytes or a local path.
    pub source: FileSource,
    /// `destination` in the sandbox.
    pub destination: String,
}

/// Python `FileDownloadRequest(source, destination=None)`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FileDownloadRequest {
    /// `source` in the sandbox.
    pub source: String,
    /// `destination`: a local path; `None` returns the bytes.
    pub destination: Option<String>,
}

/// `FileDownloadResponse.result`: the local path written, or the bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DownloadResult {
    /// Written to this local path.
    Path(String),
    /// The content.
    Bytes(Vec<u8>),
}

/// Python `FileDownloadErrorDetails`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileDownloadErrorDetails {
    /// `message`.
    pub message: String,
    /// `status_code`.
    pub status_code: Option<i64>,
    /// `error_code`.
    pub error_code: Option<String>,
}

/// Python `FileDownloadResponse`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileDownloadResponse {
    /// `source`.
    pub source: String,
    /// `result`.
    pub result: Option<DownloadResult>,
    /// `error`.
    pub error: Option<String>,
    /// `error_details`.
    pub error_details: Option<FileDownloadErrorDetails>,
}

/// Python `sandbox.fs`.
#[derive(Debug, Clone)]
pub struct FileSystem {
    ctx: Ctx,
}

fn not_found_file(path: &str) -> DaytonaError {
    DaytonaError::NotFound(ErrorDetails::new(
        format!("file not found: {path}"),
        Some(404),
        Some("FILE_NOT_FOUND"),
    ))
}

fn map_file_err(e: sandcove::Error, path: &str) -> DaytonaError {
    if e.is_not_found() {
        not_found_file(path)
    } else {
        e.into()
    }
}

impl FileSystem {
    pub(crate) fn new(ctx: Ctx) -> Self {
        FileSystem { ctx }
    }

    /// `create_folder(path, mode)`: like `mkdir -p` with an octal `mode` string (`"755"`).
    pub async fn create_folder(&self, path: &str, mode: &str) -> Result<()> {
        const P: &str = "Failed to create folder: ";
        let mode = translate::parse_mode(mode).ctx(P)?;
        self.ctx
            .core
            .mkdir_with(
                &self.ctx.resolve(path),
                MkdirOptions::default().parents(true).mode(mode),
            )
            .await
            .ctx(P)?;
        Ok(())
    }

    /// `delete_file(path, recursive=False)`.
    pub fn delete_file(&self, path: impl Into<String>) -> DeleteFileBuilder {
        DeleteFileBuilder {
            fs: self.clone(),
            path: path.into(),
            recursive: false,
        }
    }

    /// `upload_file(file: bytes | local_path: str, remote_path, timeout=1800)`: a `&str` or
    /// `String` first argument is a local path, bytes are content (as in Python).
    pub fn upload_file(
        &self,
        file: impl Into<FileSource>,
        remote_path: impl Into<String>,
    ) -> UploadBuilder {
        UploadBuilder {
            fs: self.clone(),
            files: vec![FileUpload {
                source: file.into(),
                destination: remote_path.into(),
            }],
            prefix: "Failed to upload file: ",
            timeout: FILE_TIMEOUT,
        }
    }

    /// `upload_files(files: list[FileUpload], timeout=1800)`: in order; parents created;
    /// existing files overwritten.
    pub fn upload_files(&self, files: Vec<FileUpload>) -> UploadBuilder {
        UploadBuilder {
            fs: self.clone(),
            files,
            prefix: "Failed to upload files: ",
            timeout: FILE_TIMEOUT,
        }
    }

    /// `download_file(remote_path, timeout=1800) -> bytes`; `.local_path(p)` writes to a
    /// local file instead and returns nothing (Python's second overload).
    pub fn download_file(&self, remote_path: impl Into<String>) -> DownloadBuilder {
        DownloadBuilder {
            fs: self.clone(),
            remote_path: remote_path.into(),
            timeout: FILE_TIMEOUT,
        }
    }

    /// `download_files(files: list[FileDownloadRequest], timeout=1800)`: per-file errors are
    /// returned in the responses, not raised.
    pub fn download_files(&self, files: Vec<FileDownloadRequest>) -> DownloadFilesBuilder {
        DownloadFilesBuilder {
            fs: self.clone(),
            files,
            timeout: FILE_TIMEOUT,
        }
    }

    /// `list_files(path, depth=None) -> list[FileInfo]`: direct children unless `depth` > 1.
    pub fn list_files(&self, path: impl Into<String>) -> ListFilesBuilder {
        ListFilesBuilder {
            fs: self.clone(),
            path: path.into(),
            depth: None,
        }
    }

    /// `get_file_info(path) -> FileInfo`.
    pub async fn get_file_info(&self, path: &str) -> Result<FileInfo> {
        let abs = self.ctx.resolve(path);
        let stat = self
            .ctx
            .core
            .stat_with(&abs, Default::default())
            .await
            .map_err(|e| map_file_err(e, path))
            .ctx("Failed to get file info: ")?;
        Ok(FileInfo::from(&stat))
    }

    /// Every regular file under `path` (or `path` itself), with its path as the caller wrote it.
    async fn walk(&self, path: &str) -> sandcove::Result<Vec<(String, FileStat)>> {
        let abs = self.ctx.resolve(path);
        let root = self.ctx.core.stat_with(&abs, Default::default()).await?;
        if root.kind != FileKind::Dir {
            return Ok(vec![(path.to_string(), root)]);
        }
        let entries = self
            .ctx
            .core
            .list_dir_with(&abs, ListDirOptions::default().depth(WALK_DEPTH))
            .await?;
        let shown_root = path.trim_end_matches('/');
        let mut out: Vec<(String, FileStat)> = entries
            .into_iter()
            .map(|e| {
                let rel = e
                    .path
                    .strip_prefix(abs.trim_end_matches('/'))
                    .unwrap_or(&e.path)
                    .trim_start_matches('/')
                    .to_string();
                let shown = if shown_root.is_empty() || shown_root == "." {
                    rel
                } else {
                    format!("{shown_root}/{rel}")
                };
                (shown, e)
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// `find_files(path, pattern) -> list[Match]`: literal substring per line, recursive;
    /// files with a NUL byte in their first 512 bytes are skipped.
    pub async fn find_files(&self, path: &str, pattern: &str) -> Result<Vec<Match>> {
        const P: &str = "Failed to find files: ";
        let mut out = Vec::new();
        for (shown, stat) in self
            .walk(path)
            .await
            .map_err(|e| map_file_err(e, path))
            .ctx(P)?
        {
            if stat.kind != FileKind::File {
                continue;
            }
            let data = match self.ctx.read(&stat.path).await {
                Ok(d) => d,
                Err(_) => continue,
            };
            if data[..data.len().min(512)].contains(&0) {
                continue;
            }
            let text = String::from_utf8_lossy(&data);
            for (i, line) in text.lines().enumerate() {
                if line.contains(pattern) {
                    out.push(Match {
                        file: shown.clone(),
                        line: i as i64 + 1,
                        content: line.to_string(),
                    });
                }
            }
        }
        Ok(out)
    }

    /// `search_files(path, pattern) -> SearchFilesResponse`: shell glob on base names,
    /// recursive; directories match too.
    pub async fn search_files(&self, path: &str, pattern: &str) -> Result<SearchFilesResponse> {
        const P: &str = "Failed to search files: ";
        let files = self
            .walk(path)
            .await
            .map_err(|e| map_file_err(e, path))
            .ctx(P)?
            .into_iter()
            .filter(|(_, s)| translate::glob_match(pattern, &s.name))
            .map(|(shown, _)| shown)
            .collect();
        Ok(SearchFilesResponse { files })
    }

    /// `replace_in_files(files, pattern, new_value) -> list[ReplaceResult]`: literal
    /// replace-all, one result per file.
    pub async fn replace_in_files(
        &self,
        files: Vec<String>,
        pattern: &str,
        new_value: &str,
    ) -> Result<Vec<ReplaceResult>> {
        let mut out = Vec::new();
        for file in files {
            let abs = self.ctx.resolve(&file);
            let outcome: sandcove::Result<()> = async {
                let data = self.ctx.read(&abs).await?;
                let text = String::from_utf8_lossy(&data).replace(pattern, new_value);
                let stream: sandcove::ByteStream =
                    Box::pin(futures::stream::once(async move { Ok(text.into_bytes()) }));
                self.ctx
                    .core
                    .write_stream(
                        &abs,
                        stream,
                        sandcove::WriteOptions::default()
                            .create_parents(false)
                            .mode(0o644)
                            .append(false),
                    )
                    .await?;
                Ok(())
            }
            .await;
            out.push(ReplaceResult {
                file,
                success: outcome.is_ok(),
                error: outcome.err().map(|e| e.to_string()),
            });
        }
        Ok(out)
    }

    /// `move_files(source, destination)`: the destination must not exist (409) and its
    /// parent must (404). The 409 is decided by the rename itself (`RENAME_NOREPLACE`), so a
    /// destination created meanwhile is never replaced.
    pub async fn move_files(&self, source: &str, destination: &str) -> Result<()> {
        const P: &str = "Failed to move files: ";
        let (src, dst) = (self.ctx.resolve(source), self.ctx.resolve(destination));
        let core = &self.ctx.core;
        core.stat(&src)
            .await
            .map_err(|e| map_file_err(e, source))
            .ctx(P)?;
        let options = sandcove::RenameOptions::default().overwrite(false);
        match core.rename_with(&src, &dst, options).await {
            Ok(_) => Ok(()),
            Err(e) if e.code() == sandcove::ErrorCode::AlreadyExists => {
                Err(DaytonaError::Conflict(ErrorDetails::new(
                    format!("{P}destination already exists: {destination}"),
                    Some(409),
                    Some("CONFLICT"),
                )))
            }
            Err(e) => Err(e).ctx(P),
        }
    }

    /// `set_file_permissions(path, mode=None, owner=None, group=None)`.
    pub fn set_file_permissions(&self, path: impl Into<String>) -> PermissionsBuilder {
        PermissionsBuilder {
            fs: self.clone(),
            path: path.into(),
            mode: None,
            owner: None,
            group: None,
        }
    }

    async fn upload(&self, files: Vec<FileUpload>) -> Result<()> {
        let mut loaded = Vec::with_capacity(files.len());
        for f in files {
            let data = match f.source {
                FileSource::Bytes(b) => b,
                FileSource::LocalPath(p) => tokio::fs::read(&p).await.map_err(|e| {
                    DaytonaError::validation(format!("cannot read local file {p}: {e}"))
                })?,
            };
            loaded.push((self.ctx.resolve(&f.destination), data));
        }
        for (dst, data) in loaded {
            self.ctx.write(&dst, data).await?;
        }
        Ok(())
    }

    /// Where an upload to `destination` lands (the work directory resolves a relative one),
    /// and a staging of uploads into this sandbox (the wire's streamed bulk upload).
    #[cfg(feature = "wire")]
    pub(crate) fn upload_target(&self, destination: &str) -> String {
        self.ctx.resolve(destination)
    }

    /// A staging of streamed uploads into this sandbox (see `upload_target`).
    #[cfg(feature = "wire")]
    pub(crate) fn staging(&self) -> sandcove_compat_support::multipart::Staged {
        sandcove_compat_support::multipart::Staged::new(self.ctx.core.clone())
    }

    /// A download held in memory: up to the core's largest in-memory bound.
    async fn download(&self, remote_path: &str) -> Result<Vec<u8>> {
        let limit = usize::try_from(sandcove::MAX_MEMORY_FILE_BYTES).unwrap_or(usize::MAX);
        self.download_limited(remote_path, limit).await
    }

    /// `download_file`'s bytes, refused past `limit` bytes (the wire holds a download in
    /// memory to frame it).
    pub(crate) async fn download_limited(
        &self,
        remote_path: &str,
        limit: usize,
    ) -> Result<Vec<u8>> {
        if remote_path.is_empty() {
            return Err(DaytonaError::BadRequest(ErrorDetails::new(
                "path is required",
                Some(400),
                Some("INVALID_FILE_PATH"),
            )));
        }
        let abs = self.ctx.resolve(remote_path);
        let stat = self
            .ctx
            .core
            .stat_with(&abs, Default::default())
            .await
            .map_err(|e| map_file_err(e, remote_path))?;
        if stat.kind == FileKind::Dir {
            return Err(DaytonaError::BadRequest(ErrorDetails::new(
                "path points to a directory",
                Some(400),
                Some("INVALID_FILE_PATH"),
            )));
        }
        self.ctx
            .read_limited(&abs, limit)
            .await
            .map_err(|e| map_file_err(e, remote_path))
    }
}

/// Builder of [`FileSystem::delete_file`]; await it.
#[derive(Debug)]
#[must_use = "await the builder to run the call"]
pub struct DeleteFileBuilder {
    fs: FileSystem,
    path: String,
    recursive: bool,
}

impl DeleteFileBuilder {
    /// `recursive=False`: needed for directories.
    pub fn recursive(mut self, recursive: bool) -> Self {
        self.recursive = recursive;
        self
    }

    async fn run(self) -> Result<()> {
        const P: &str = "Failed to delete file: ";
        let abs = self.fs.ctx.resolve(&self.path);
        let core = &self.fs.ctx.core;
        let stat = core
            .stat(&abs)
            .await
            .map_err(|e| map_file_err(e, &self.path))
            .ctx(P)?;
        if stat.kind == FileKind::Dir && !self.recursive {
            return Err(DaytonaError::validation(
                "cannot delete directory without recursive flag",
            ))
            .ctx(P);
        }
        core.remove_with(&abs, RemoveOptions::default().recursive(self.recursive))
            .await
            .ctx(P)
    }
}
awaitable!(DeleteFileBuilder => ());

/// Builder of [`FileSystem::upload_file`] / [`FileSystem::upload_files`]; await it.
#[derive(Debug)]
#[must_use = "await the builder to run the call"]
pub struct UploadBuilder {
    fs: FileSystem,
    files: Vec<FileUpload>,
    prefix: &'static str,
    timeout: i64,
}

impl UploadBuilder {
    /// `timeout=1800` seconds for the whole call (`0` = none).
    pub fn timeout(mut self, seconds: i64) -> Self {
        self.timeout = seconds;
        self
    }

    async fn run(self) -> Result<()> {
        with_timeout(
            "upload_files",
            self.timeout as f64,
            self.fs.upload(self.files),
        )
        .await
        .ctx(self.prefix)
    }
}
awaitable!(UploadBuilder => ());

/// Builder of [`FileSystem::download_file`]; await it for the bytes.
#[derive(Debug)]
#[must_use = "await the builder to run the call"]
pub struct DownloadBuilder {
    fs: FileSystem,
    remote_path: String,
    timeout: i64,
}

impl DownloadBuilder {
    /// `timeout=1800` seconds for the whole call (`0` = none).
    pub fn timeout(mut self, seconds: i64) -> Self {
        self.timeout = seconds;
        self
    }

    /// `local_path`: write the file there; the call then returns nothing.
    pub fn local_path(self, local_path: impl Into<String>) -> DownloadToBuilder {
        DownloadToBuilder {
            inner: self,
            local_path: local_path.into(),
        }
    }

    async fn run(self) -> Result<Vec<u8>> {
        with_timeout(
            "download_file",
            self.timeout as f64,
            self.fs.download(&self.remote_path),
        )
        .await
        .ctx("Failed to download file: ")
    }
}
awaitable!(DownloadBuilder => Vec<u8>);

/// [`DownloadBuilder`] with a local destination; await it.
#[derive(Debug)]
#[must_use = "await the builder to run the call"]
pub struct DownloadToBuilder {
    inner: DownloadBuilder,
    local_path: String,
}

impl DownloadToBuilder {
    async fn run(self) -> Result<()> {
        let data = self.inner.run().await?;
        tokio::fs::write(&self.local_path, data).await.map_err(|e| {
            DaytonaError::new(format!(
                "Failed to download file: cannot write {}: {e}",
                self.local_path
            ))
        })
    }
}
awaitable!(DownloadToBuilder => ());

/// Builder of [`FileSystem::download_files`]; await it.
#[derive(Debug)]
#[must_use = "await the builder to run the call"]
pub struct DownloadFilesBuilder {
    fs: FileSystem,
    files: Vec<FileDownloadRequest>,
    timeout: i64,
}

impl DownloadFilesBuilder {
    /// `timeout=1800` seconds for the whole call (`0` = none).
    pub fn timeout(mut self, seconds: i64) -> Self {
        self.timeout = seconds;
        self
    }

    async fn run(self) -> Result<Vec<FileDownloadResponse>> {
        let seconds = self.timeout as f64;
        with_timeout("download_files", seconds, self.run_inner())
            .await
            .ctx("Failed to download files: ")
    }

    async fn run_inner(self) -> Result<Vec<FileDownloadResponse>> {
        let mut out = Vec::new();
        for req in self.files {
            let got = self.fs.download(&req.source).await;
            let got = match (got, &req.destination) {
                (Ok(data), Some(dst)) => tokio::fs::write(dst, data)
                    .await
                    .map(|_| DownloadResult::Path(dst.clone()))
                    .map_err(|e| DaytonaError::new(format!("cannot write {dst}: {e}"))),
                (Ok(data), None) => Ok(DownloadResult::Bytes(data)),
                (Err(e), _) => Err(e),
            };
            out.push(match got {
                Ok(result) => FileDownloadResponse {
                    source: req.source,
                    result: Some(result),
                    error: None,
                    error_details: None,
                },
                Err(e) => FileDownloadResponse {
                    source: req.source,
                    result: None,
                    error: Some(e.message()),
                    error_details: Some(FileDownloadErrorDetails {
                        message: e.message(),
                        status_code: e.status_code().map(i64::from),
                        error_code: e.code().map(str::to_owned),
                    }),
                },
            });
        }
        Ok(out)
    }
}
awaitable!(DownloadFilesBuilder => Vec<FileDownloadResponse>);

/// Builder of [`FileSystem::list_files`]; await it.
#[derive(Debug)]
#[must_use = "await the builder to run the call"]
pub struct ListFilesBuilder {
    fs: FileSystem,
    path: String,
    depth: Option<i64>,
}

impl ListFilesBuilder {
    /// `depth=None`: levels to list (at least 1).
    pub fn depth(mut self, depth: impl Into<Option<i64>>) -> Self {
        self.depth = depth.into();
        self
    }

    async fn run(self) -> Result<Vec<FileInfo>> {
        const P: &str = "Failed to list files: ";
        let depth = self.depth.unwrap_or(1);
        if depth < 1 {
            return Err(DaytonaError::validation("depth must be at least 1")).ctx(P);
        }
        let entries = self
            .fs
            .ctx
            .core
            .list_dir_with(
                &self.fs.ctx.resolve(&self.path),
                ListDirOptions::default().depth(depth.min(u32::MAX as i64) as u32),
            )
            .await
            .map_err(|e| map_file_err(e, &self.path))
            .ctx(P)?;
        Ok(entries.iter().map(FileInfo::from).collect())
    }
}
awaitable!(ListFilesBuilder => Vec<FileInfo>);

/// Builder of [`FileSystem::set_file_permissions`]; await it.
#[derive(Debug)]
#[must_use = "await the builder to run the call"]
pub struct PermissionsBuilder {
    fs: FileSystem,
    path: String,
    mode: Option<String>,
    owner: Option<String>,
    group: Option<String>,
}

impl PermissionsBuilder {
    /// `mode=None`: octal string.
    pub fn mode(mut self, mode: impl crate::OptionalString) -> Self {
        self.mode = mode.into_optional();
        self
    }
    /// `owner=None`: user name or uid.
    pub fn owner(mut self, owner: impl crate::OptionalString) -> Self {
        self.owner = owner.into_optional();
        self
    }
    /// `group=None`: group name or gid.
    pub fn group(mut self, group: impl crate::OptionalString) -> Self {
        self.group = group.into_optional();
        self
    }

    async fn run(self) -> Result<()> {
        const P: &str = "Failed to set file permissions: ";
        let ctx = &self.fs.ctx;
        let abs = ctx.resolve(&self.path);
        let mode = self
            .mode
            .as_deref()
            .map(translate::parse_mode)
            .transpose()
            .ctx(P)?;
        ctx.core
            .stat_with(&abs, Default::default())
            .await
            .map_err(|e| map_file_err(e, &self.path))
            .ctx(P)?;
        if let Some(mode) = mode {
            ctx.core.chmod(&abs, mode).await.ctx(P)?;
        }
        if self.owner.is_some() || self.group.is_some() {
            let spec = format!(
                "{}{}",
                self.owner.clone().unwrap_or_default(),
                self.group
                    .as_ref()
                    .map(|g| format!(":{g}"))
                    .unwrap_or_default()
            );
            let out = ctx
                .run(sandcove::ProcessSpec::new(sandcove::Command::argv([
                    "chown".to_string(),
                    spec,
                    abs.clone(),
                ])))
                .await
                .ctx(P)?;
            if !out.exit_status().success() {
                return Err(DaytonaError::Forbidden(ErrorDetails::new(
                    format!("{P}{}", out.stderr_lossy().trim()),
                    Some(403),
                    Some("FILE_ACCESS_DENIED"),
                )));
            }
        }
        Ok(())
    }
}
awaitable!(PermissionsBuilder => ());
