//! `sandbox.files`: the sandbox filesystem. Relative paths resolve against `/home/user`.

use std::collections::BTreeMap;
use std::fmt;
use std::future::IntoFuture;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use sandcove::{
    ByteStream, FileAttributes, FileKind, FileStat, ListDirOptions, MkdirOptions, RemoveOptions,
};

use crate::call::{with_request_timeout, BoxFuture, Call, IntoSeconds};
use crate::errors::{Result, SandboxException};
use crate::sandbox::Ctx;
use crate::translate::{self, py_opt_str, py_str, DateTime};

/// `FileType`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileType {
    /// `FILE = "file"`.
    File,
    /// `DIR = "dir"`.
    Dir,
    /// `SYMLINK = "symlink"`.
    Symlink,
}

impl FileType {
    /// The string value (`"file"`, `"dir"`, `"symlink"`).
    pub fn value(&self) -> &'static str {
        match self {
            FileType::File => "file",
            FileType::Dir => "dir",
            FileType::Symlink => "symlink",
        }
    }

    fn from_kind(kind: FileKind) -> Option<Self> {
        match kind {
            FileKind::File => Some(FileType::File),
            FileKind::Dir => Some(FileType::Dir),
            FileKind::Symlink => Some(FileType::Symlink),
            FileKind::Other => None,
        }
    }
}

impl fmt::Debug for FileType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "<FileType.{}: '{}'>",
            self.value().to_uppercase(),
            self.value()
        )
    }
}

fn py_type(t: &Option<FileType>) -> String {
    t.map(|t| format!("{t:?}")).unwrap_or_else(|| "None".into())
}

fn py_metadata(m: &Option<BTreeMap<String, String>>) -> String {
    m.as_ref()
        .map(translate::py_dict)
        .unwrap_or_else(|| "None".into())
}

/// The extended-attribute namespace E2B's daemon keeps a file's `metadata` in: key `k` is
/// attribute `user.e2b.k`.
pub(crate) const METADATA_ATTRIBUTE_PREFIX: &str = "user.e2b.";

/// E2B's daemon's bound of one file's metadata: every key with its attribute prefix, plus
/// its value, in bytes.
const MAX_METADATA_BYTES: usize = 4096;

/// The longest metadata key E2B's daemon takes: an attribute name is at most 255 bytes.
const MAX_METADATA_KEY_BYTES: usize = 255 - METADATA_ATTRIBUTE_PREFIX.len();

/// Check `metadata=` as the SDK does before it sends anything: keys travel as
/// `X-Metadata-<key>` header names (HTTP token characters), values as header values
/// (printable US-ASCII).
fn check_sdk_metadata(metadata: &[(String, String)]) -> Result<()> {
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    for (key, value) in metadata {
        if key.is_empty() || !key.bytes().all(token) {
            return Err(SandboxException::invalid_argument(format!(
                "Invalid metadata key {}: keys must be non-empty and use only HTTP token \
                 characters (letters, digits and !#$%&'*+-.^_`|~).",
                py_str(key)
            )));
        }
        if !value.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
            return Err(SandboxException::invalid_argument(format!(
                "Invalid metadata value for key {}: values must be printable US-ASCII.",
                py_str(key)
            )));
        }
    }
    Ok(())
}

/// The core attributes a write with E2B `metadata` gets, as E2B's daemon stores it: each key
/// lowercased (the first of keys equal but for case wins, as the daemon reads headers) as
/// `user.e2b.<key>`; keys and values printable US-ASCII, a key at most 246 bytes, all of it
/// at most 4096 bytes, else `InvalidArgumentException` (the daemon's `400`) before anything
/// is written.
pub(crate) fn metadata_attributes(metadata: &[(String, String)]) -> Result<FileAttributes> {
    let invalid =
        |why: String| SandboxException::invalid_argument(format!("invalid metadata: {why}"));
    let printable = |s: &str| s.bytes().all(|b| (0x20..=0x7e).contains(&b));
    let mut attributes = FileAttributes::new();
    let mut total = 0;
    for (key, value) in metadata {
        let key = key.to_ascii_lowercase();
        let name = format!("{METADATA_ATTRIBUTE_PREFIX}{key}");
        if key.is_empty() || attributes.contains_key(&name) {
            continue;
        }
        if key.len() > MAX_METADATA_KEY_BYTES {
            return Err(invalid(format!(
                "metadata key {key:?} exceeds {MAX_METADATA_KEY_BYTES} bytes"
            )));
        }
        if !printable(&key) || !printable(value) {
            return Err(invalid(format!(
                "metadata key {key:?} or its value contains a byte that is not printable ASCII"
            )));
        }
        total += name.len() + value.len();
        attributes.insert(name, value.as_bytes().to_vec());
    }
    if total > MAX_METADATA_BYTES {
        return Err(invalid(format!(
            "total metadata size {total} exceeds {MAX_METADATA_BYTES} bytes"
        )));
    }
    Ok(attributes)
}

/// E2B's `metadata` of an entry: its `user.e2b.*` attributes, prefix stripped (values that
/// are not UTF-8 left out, as E2B's daemon leaves them out); `None` when it has none.
pub(crate) fn metadata_of(attributes: Option<&FileAttributes>) -> Option<BTreeMap<String, String>> {
    let metadata: BTreeMap<String, String> = attributes?
        .iter()
        .filter_map(|(name, value)| {
            let key = name.strip_prefix(METADATA_ATTRIBUTE_PREFIX)?;
            let value = String::from_utf8(value.clone()).ok()?;
            Some((key.to_string(), value))
        })
        .collect();
    (!metadata.is_empty()).then_some(metadata)
}

/// `WriteInfo`: what `write` returns.
#[derive(Clone, PartialEq, Eq)]
pub struct WriteInfo {
    /// `name`.
    pub name: String,
    /// `type`.
    pub r#type: Option<FileType>,
    /// `path` (absolute).
    pub path: String,
    /// `metadata`.
    pub metadata: Option<BTreeMap<String, String>>,
}

impl fmt::Debug for WriteInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "WriteInfo(name={}, type={}, path={}, metadata={})",
            py_str(&self.name),
            py_type(&self.r#type),
            py_str(&self.path),
            py_metadata(&self.metadata)
        )
    }
}

/// `EntryInfo`: a file, directory or symlink.
#[derive(Clone, PartialEq, Eq)]
pub struct EntryInfo {
    /// `name`.
    pub name: String,
    /// `type`.
    pub r#type: Option<FileType>,
    /// `path` (absolute).
    pub path: String,
    /// `size` in bytes.
    pub size: i64,
    /// `mode`: permission bits, e.g. `0o644`.
    pub mode: i64,
    /// `permissions`, e.g. `-rw-r--r--`.
    pub permissions: String,
    /// `owner`.
    pub owner: String,
    /// `group`.
    pub group: String,
    /// `modified_time`.
    pub modified_time: DateTime,
    /// `symlink_target`.
    pub symlink_target: Option<String>,
    /// `metadata`.
    pub metadata: Option<BTreeMap<String, String>>,
    /// What envd's `type` field carries: a link's final target's type (`None` when the link
    /// does not resolve), otherwise `r#type`. The SDK reports `SYMLINK` for a link (envd's
    /// `is_symlink`); older SDKs read this instead.
    pub(crate) wire_type: Option<FileType>,
}

impl EntryInfo {
    pub(crate) fn from_stat(ctx: &Ctx, s: &FileStat) -> EntryInfo {
        EntryInfo {
            name: s.name.clone(),
            r#type: FileType::from_kind(s.kind),
            path: ctx.e2b_path(&s.path),
            size: s.size as i64,
            mode: i64::from(s.mode),
            permissions: translate::permissions_string(s.kind, s.mode),
            owner: s.owner.clone(),
            group: s.group.clone(),
            modified_time: DateTime::from_unix_millis(s.modified),
            symlink_target: s.symlink_target.clone(),
            metadata: metadata_of(s.attributes.as_ref()),
            wire_type: FileType::from_kind(s.kind),
        }
    }
}

/// Most symbolic links followed while resolving one path, as Go's `filepath.EvalSymlinks`
/// (which E2B's daemon uses) allows.
const MAX_LINK_HOPS: usize = 255;

impl EntryInfo {
    /// The entry E2B's daemon reports for `s`. A symbolic link is `SYMLINK`, as the SDK
    /// reports it, with its final target's permission bits and that target's absolute path,
    /// every link on the way resolved (`EvalSymlinks`); envd's `type` field (kept for the
    /// wire) is the target's type. A link that does not resolve (dangling, a loop, a
    /// component `user` may not search) has mode `0`, no target type, and its own path as the
    /// target. Size, times and the permission string stay the link's own, as there; `metadata`
    /// is the target's, as the daemon reads it through the link. `s` carries the entry's
    /// attributes (stat and list are asked for them), which give its `metadata`.
    pub(crate) async fn resolved(ctx: &Ctx, s: &FileStat, user: Option<String>) -> EntryInfo {
        let mut entry = EntryInfo::from_stat(ctx, s);
        if s.kind != FileKind::Symlink {
            return entry;
        }
        match resolve_links(ctx, &s.path, user).await {
            Some((target, st)) => {
                entry.wire_type = FileType::from_kind(st.kind);
                entry.mode = i64::from(st.mode & 0o777);
                entry.symlink_target = Some(ctx.e2b_path(&target));
                entry.metadata = metadata_of(st.attributes.as_ref());
            }
            None => {
                entry.wire_type = None;
                entry.mode = 0;
                entry.symlink_target = Some(entry.path.clone());
            }
        }
        entry
    }

    /// What envd's `type` field carries for this entry (see [`EntryInfo::resolved`]).
    pub(crate) fn wire_type(&self) -> Option<FileType> {
        self.wire_type
    }
}

/// Resolve every symbolic link in the absolute runtime path `path`, component by component
/// (each looked up as `user`, so no link leads where that user could not go): the final
/// path and what is there, or `None` when a component is missing or the links go round.
async fn resolve_links(ctx: &Ctx, path: &str, user: Option<String>) -> Option<(String, FileStat)> {
    let mut pending: std::collections::VecDeque<String> =
        path.split('/').map(str::to_string).collect();
    let mut resolved: Vec<String> = Vec::new();
    let mut last: Option<FileStat> = None;
    let mut hops = 0;
    while let Some(part) = pending.pop_front() {
        match part.as_str() {
            "" | "." => continue,
            ".." => {
                resolved.pop();
                last = None;
                continue;
            }
            _ => {}
        }
        let parent = resolved.join("/");
        let candidate = if parent.is_empty() {
            format!("/{part}")
        } else {
            format!("/{parent}/{part}")
        };
        let mut options = sandcove::StatOptions::default().attributes(true);
        options.user = user.clone();
        let st = ctx.core.stat_with(&candidate, options).await.ok()?;
        if st.kind == FileKind::Symlink {
            hops += 1;
            if hops > MAX_LINK_HOPS {
                return None;
            }
            let target = st.symlink_target?;
            if target.starts_with('/') {
                resolved.clear();
            }
            for piece in target.split('/').rev() {
                pending.push_front(piece.to_string());
            }
            last = None;
        } else {
            resolved.push(part);
            last = Some(st);
        }
    }
    let at = format!("/{}", resolved.join("/"));
    let st = match last {
        Some(st) => st,
        // The path ended at the root or on `..`: look at where it is.
        None => {
            let mut options = sandcove::StatOptions::default().attributes(true);
            options.user = user;
            ctx.core.stat_with(&at, options).await.ok()?
        }
    };
    Some((at, st))
}

impl fmt::Debug for EntryInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "EntryInfo(name={}, type={}, path={}, metadata={}, size={}, mode=0o{:o}, permissions={}, owner={}, group={}, modified_time={:?}, symlink_target={})",
            py_str(&self.name),
            py_type(&self.r#type),
            py_str(&self.path),
            py_metadata(&self.metadata),
            self.size,
            self.mode,
            py_str(&self.permissions),
            py_str(&self.owner),
            py_str(&self.group),
            self.modified_time,
            py_opt_str(self.symlink_target.as_deref()),
        )
    }
}

/// Data for `write`: text, bytes, or a local file (streamed).
pub enum WriteData {
    /// Bytes (text is UTF-8 encoded).
    Bytes(Vec<u8>),
    /// A local file, read in chunks.
    File(std::fs::File),
}

impl fmt::Debug for WriteData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WriteData::Bytes(b) => write!(f, "Bytes({} bytes)", b.len()),
            WriteData::File(_) => f.write_str("File"),
        }
    }
}

impl From<&str> for WriteData {
    fn from(s: &str) -> Self {
        WriteData::Bytes(s.as_bytes().to_vec())
    }
}
impl From<String> for WriteData {
    fn from(s: String) -> Self {
        WriteData::Bytes(s.into_bytes())
    }
}
impl From<&String> for WriteData {
    fn from(s: &String) -> Self {
        WriteData::Bytes(s.as_bytes().to_vec())
    }
}
impl From<Vec<u8>> for WriteData {
    fn from(b: Vec<u8>) -> Self {
        WriteData::Bytes(b)
    }
}
impl From<&[u8]> for WriteData {
    fn from(b: &[u8]) -> Self {
        WriteData::Bytes(b.to_vec())
    }
}
impl<const N: usize> From<&[u8; N]> for WriteData {
    fn from(b: &[u8; N]) -> Self {
        WriteData::Bytes(b.to_vec())
    }
}
impl From<std::fs::File> for WriteData {
    fn from(f: std::fs::File) -> Self {
        WriteData::File(f)
    }
}

impl WriteData {
    fn into_stream(self) -> ByteStream {
        match self {
            WriteData::Bytes(b) => Box::pin(futures::stream::once(async move { Ok(b) })),
            WriteData::File(file) => {
                let file = Arc::new(Mutex::new(file));
                Box::pin(futures::stream::unfold(file, |file| async move {
                    let f = file.clone();
                    let chunk = tokio::task::spawn_blocking(move || {
                        use std::io::Read;
                        let mut buf = vec![0u8; 1 << 20];
                        let n = f
                            .lock()
                            .map_err(|_| sandcove::Error::backend("file lock poisoned"))?
                            .read(&mut buf)
                            .map_err(|e| sandcove::Error::from_io(&e, "local file"))?;
                        buf.truncate(n);
                        Ok::<_, sandcove::Error>(buf)
                    })
                    .await
                    .unwrap_or_else(|e| Err(sandcove::Error::backend(e.to_string())));
                    match chunk {
                        Ok(b) if b.is_empty() => None,
                        other => Some((other, file)),
                    }
                }))
            }
        }
    }
}

/// `WriteEntry`: one file of `write_files`.
#[derive(Debug)]
pub struct WriteEntry {
    /// `path`.
    pub path: String,
    /// `data`.
    pub data: WriteData,
}

impl WriteEntry {
    /// `{"path": path, "data": data}`.
    pub fn new(path: impl Into<String>, data: impl Into<WriteData>) -> Self {
        WriteEntry {
            path: path.into(),
            data: data.into(),
        }
    }
}

/// Output formats of `files.read(..., format=...)`: each marker picks the result type.
pub mod read_format {
    /// `format="text"` (the default): `String`.
    #[derive(Debug, Clone, Copy, Default)]
    pub struct Text;
    /// `format="bytes"`: `Vec<u8>`.
    #[derive(Debug, Clone, Copy, Default)]
    pub struct Bytes;
    /// `format="stream"`: [`FileStreamReader`](super::FileStreamReader).
    #[derive(Debug, Clone, Copy, Default)]
    pub struct Stream;
}

/// Start watching `path` as E2B's `user` (shared by `files.watch_dir` and the wire's watch
/// calls).
pub(crate) async fn open_watch(
    ctx: &Ctx,
    path: &str,
    recursive: bool,
    user: Option<&str>,
) -> Result<sandcove::WatchStream> {
    let common = Common {
        user: user.map(str::to_string),
        request_timeout: None,
    };
    // E2B's daemon chowns a file it creates before writing it: create, chmod, write.
    let mut options = sandcove::WatchOptions::default()
        .recursive(recursive)
        .report_ownership(true);
    options.user = common.file_user(ctx);
    let path = ctx.path_as(path, options.user.as_deref());
    Ok(ctx.core.watch(&path, options).await?)
}

/// A runtime watch event as E2B's, with the entry's info when asked for.
pub(crate) async fn watch_event(
    ctx: &Ctx,
    event: sandcove::FsEvent,
    include_entry: bool,
) -> FilesystemEvent {
    // The runtime reports API writes as E2B does (create, chmod, write; see the watch's
    // options) and never shows its temporary files: events map one to one.
    let entry = if include_entry {
        let options = sandcove::StatOptions::default().attributes(true);
        match ctx.core.stat_with(&event.path, options).await {
            Ok(st) => Some(EntryInfo::resolved(ctx, &st, None).await),
            Err(_) => None,
        }
    } else {
        None
    };
    FilesystemEvent {
        name: event.name,
        r#type: FilesystemEventType::from_kind(event.kind),
        entry,
    }
}

/// Open `path` for reading as E2B's `user` (shared by `files.read` and the wire's
/// `GET /files`).
pub(crate) async fn open_read(ctx: &Ctx, path: &str, user: Option<&str>) -> Result<ByteStream> {
    let (path, options) = read_target(ctx, path, user);
    Ok(ctx.core.read_stream_with(&path, options).await?)
}

/// The core path and read options of reading E2B's `path` as E2B's `user` (a relative path
/// resolves against that user's home, as envd resolves it).
pub(crate) fn read_target(
    ctx: &Ctx,
    path: &str,
    user: Option<&str>,
) -> (String, sandcove::ReadOptions) {
    let common = Common {
        user: user.map(str::to_string),
        request_timeout: None,
    };
    let mut options = sandcove::ReadOptions::default();
    options.user = common.file_user(ctx);
    let path = ctx.path_as(path, options.user.as_deref());
    (path, options)
}

/// Write `data` to `path` as E2B's `user`, creating parent directories, with exactly the
/// given `metadata` attributes (see [`metadata_attributes`]; shared by `files.write` and the
/// wire's `POST /files`).
pub(crate) async fn write_stream(
    ctx: &Ctx,
    path: &str,
    data: ByteStream,
    user: Option<&str>,
    metadata: &FileAttributes,
) -> Result<WriteInfo> {
    let options = write_options(ctx, user, metadata);
    let path = ctx.path_as(path, options.user.as_deref());
    let s = ctx.core.write_stream(&path, data, options).await?;
    Ok(write_info(ctx, &s))
}

/// The core options of a write as E2B's `user`, creating parent directories, giving the file
/// the `metadata` attributes (and no others: E2B's daemon clears the metadata an upload does
/// not name, and a core write lands a new file).
pub(crate) fn write_options(
    ctx: &Ctx,
    user: Option<&str>,
    metadata: &FileAttributes,
) -> sandcove::WriteOptions {
    let common = Common {
        user: user.map(str::to_string),
        request_timeout: None,
    };
    let mut options = sandcove::WriteOptions::default().create_parents(true);
    options.user = common.file_user(ctx);
    options.attributes = metadata.clone();
    options
}

/// `WriteInfo` of a written file: its `metadata` as read back from it.
pub(crate) fn write_info(ctx: &Ctx, s: &sandcove::FileStat) -> WriteInfo {
    WriteInfo {
        name: s.name.clone(),
        r#type: FileType::from_kind(s.kind),
        path: ctx.e2b_path(&s.path),
        metadata: metadata_of(s.attributes.as_ref()),
    }
}

/// `FileStreamReader`: the chunks of a file read with `format="stream"`.
pub struct FileStreamReader {
    inner: Option<ByteStream>,
}

impl fmt::Debug for FileStreamReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileStreamReader")
            .field("open", &self.inner.is_some())
            .finish()
    }
}

impl FileStreamReader {
    /// The next chunk; `None` at the end.
    pub async fn next(&mut self) -> Option<Result<Vec<u8>>> {
        let item = self.inner.as_mut()?.next().await;
        match item {
            None => {
                self.inner = None;
                None
            }
            Some(r) => Some(r.map_err(Into::into)),
        }
    }

    /// `close()`: stop reading.
    pub fn close(&mut self) {
        self.inner = None;
    }
}

/// `sandbox.files` (class `Filesystem`).
#[derive(Debug, Clone)]
pub struct Filesystem {
    pub(crate) ctx: Ctx,
}

/// Options every filesystem call takes: `user=` and `request_timeout=`.
#[derive(Debug, Clone, Default)]
struct Common {
    user: Option<String>,
    request_timeout: Option<f64>,
}

impl Common {
    /// The runtime user an explicit `user=` names (E2B's `user` is the sandbox's default
    /// user); `None` when no user was given: the runtime's file identity, as before.
    /// The runtime then checks that user's permissions and gives it what it creates; an
    /// unknown user is the runtime's error, before anything happens.
    fn file_user(&self, ctx: &Ctx) -> Option<String> {
        self.user
            .as_deref()
            .map(|u| match ctx.runtime_user(Some(u)) {
                None => ctx.user.clone(),
                Some(other) => other,
            })
    }
}

macro_rules! common_setters {
    () => {
        /// `user=`: the Linux user the operation runs as (default `user`).
        pub fn user(mut self, user: impl crate::OptionalString) -> Self {
            self.common.user = user.into_optional();
            self
        }

        /// `request_timeout=`: bounds the call, seconds.
        pub fn request_timeout(mut self, secs: impl IntoSeconds) -> Self {
            self.common.request_timeout = secs.into_seconds();
            self
        }
    };
}

/// A filesystem call with only the common keywords.
#[must_use = "a call does nothing until awaited"]
pub struct FsCall<T> {
    common: Common,
    ctx: Ctx,
    run: Box<dyn FnOnce(Ctx, Common) -> BoxFuture<'static, T> + Send>,
}

impl<T> fmt::Debug for FsCall<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FsCall")
            .field("common", &self.common)
            .finish_non_exhaustive()
    }
}

impl<T: Send + 'static> FsCall<T> {
    fn new<F, Fut>(ctx: &Ctx, f: F) -> Self
    where
        F: FnOnce(Ctx, Common) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<T>> + Send + 'static,
    {
        FsCall {
            common: Common::default(),
            ctx: ctx.clone(),
            run: Box::new(move |ctx, common| Box::pin(f(ctx, common))),
        }
    }

    common_setters!();
}

impl<T: Send + 'static> IntoFuture for FsCall<T> {
    type Output = Result<T>;
    type IntoFuture = BoxFuture<'static, T>;
    fn into_future(self) -> Self::IntoFuture {
        let limit = self.common.request_timeout;
        with_request_timeout((self.run)(self.ctx, self.common), limit)
    }
}

impl Filesystem {
    /// `files.read(path, format="text", user=None, request_timeout=None, gzip=False)`:
    /// text by default; `.format(read_format::Bytes)` for bytes,
    /// `.format(read_format::Stream)` for a stream.
    pub fn read(&self, path: impl Into<String>) -> ReadBuilder<read_format::Text> {
        ReadBuilder {
            ctx: self.ctx.clone(),
            path: path.into(),
            common: Common::default(),
            _format: PhantomData,
        }
    }

    /// `files.write(path, data, user=None, request_timeout=None, gzip=False,
    /// use_octet_stream=None, metadata=None) -> WriteInfo`. Creates parent directories and
    /// replaces an existing file.
    pub fn write(&self, path: impl Into<String>, data: impl Into<WriteData>) -> WriteBuilder {
        WriteBuilder {
            ctx: self.ctx.clone(),
            entries: vec![WriteEntry::new(path, data)],
            common: Common::default(),
            metadata: Vec::new(),
        }
    }

    /// `files.write_files(files, user=None, ...) -> list[WriteInfo]`.
    pub fn write_files(&self, files: Vec<WriteEntry>) -> WriteFilesBuilder {
        WriteFilesBuilder(WriteBuilder {
            ctx: self.ctx.clone(),
            entries: files,
            common: Common::default(),
            metadata: Vec::new(),
        })
    }

    /// `files.list(path, depth=1, user=None, request_timeout=None) -> list[EntryInfo]`: in
    /// the order of E2B's daemon, a depth-first walk reading each directory in byte order of
    /// its names.
    pub fn list(&self, path: impl Into<String>) -> ListBuilder {
        ListBuilder {
            ctx: self.ctx.clone(),
            path: path.into(),
            depth: Some(1),
            common: Common::default(),
        }
    }

    /// `files.exists(path, user=None, request_timeout=None) -> bool`.
    pub fn exists(&self, path: impl Into<String>) -> FsCall<bool> {
        let path = path.into();
        FsCall::new(&self.ctx, move |ctx, common| async move {
            let mut options = sandcove::StatOptions::default();
            options.user = common.file_user(&ctx);
            // `false` only when the path is not there; anything that keeps the question from
            // being answered is raised.
            let path = ctx.path_as(&path, options.user.as_deref());
            Ok(ctx.core.exists_with(&path, options).await?)
        })
    }

    /// `files.get_info(path, user=None, request_timeout=None) -> EntryInfo`, with the
    /// entry's `metadata` (its `user.e2b.*` attributes, however they were set).
    pub fn get_info(&self, path: impl Into<String>) -> FsCall<EntryInfo> {
        let path = path.into();
        FsCall::new(&self.ctx, move |ctx, common| async move {
            let mut options = sandcove::StatOptions::default().attributes(true);
            options.user = common.file_user(&ctx);
            let user = options.user.clone();
            let path = ctx.path_as(&path, user.as_deref());
            let s = ctx.core.stat_with(&path, options).await?;
            Ok(EntryInfo::resolved(&ctx, &s, user).await)
        })
    }

    /// `files.remove(path, user=None, request_timeout=None)`: recursive; a missing path is
    /// not an error.
    pub fn remove(&self, path: impl Into<String>) -> FsCall<()> {
        let path = path.into();
        FsCall::new(&self.ctx, move |ctx, common| async move {
            let mut options = RemoveOptions::default().recursive(true);
            options.user = common.file_user(&ctx);
            let path = ctx.path_as(&path, options.user.as_deref());
            match ctx.core.remove_with(&path, options).await {
                Ok(()) => Ok(()),
                Err(e) if e.is_not_found() => Ok(()),
                Err(e) => Err(e.into()),
            }
        })
    }

    /// `files.rename(old_path, new_path, user=None, request_timeout=None) -> EntryInfo`:
    /// creates the destination's parent directories; as `user`, the engine acts as that
    /// user (the kernel checks its permissions on both directories). The entry keeps its
    /// `metadata`, which the result reports.
    pub fn rename(
        &self,
        old_path: impl Into<String>,
        new_path: impl Into<String>,
    ) -> FsCall<EntryInfo> {
        let (from, to) = (old_path.into(), new_path.into());
        FsCall::new(&self.ctx, move |ctx, common| async move {
            let user = common.file_user(&ctx);
            let from = ctx.path_as(&from, user.as_deref());
            let to = ctx.path_as(&to, user.as_deref());
            let mut stat = sandcove::StatOptions::default().attributes(true);
            stat.user = user.clone();
            // Its attributes, which the rename keeps, are the result's.
            let before = ctx.core.stat_with(&from, stat).await?;
            if let Some((parent, _)) = to.rsplit_once('/') {
                if !parent.is_empty() {
                    let mut mkdir = MkdirOptions::default();
                    mkdir.user = user.clone();
                    ctx.core.mkdir_with(parent, mkdir).await?;
                }
            }
            let mut options = sandcove::RenameOptions::default();
            options.user = user.clone();
            let mut s = ctx.core.rename_with(&from, &to, options).await?;
            s.attributes = before.attributes;
            Ok(EntryInfo::resolved(&ctx, &s, user).await)
        })
    }

    /// `files.make_dir(path, user=None, request_timeout=None) -> bool`: `mkdir -p`; `false`
    /// when the directory exists.
    pub fn make_dir(&self, path: impl Into<String>) -> FsCall<bool> {
        let path = path.into();
        FsCall::new(&self.ctx, move |ctx, common| async move {
            let p = ctx.path_as(&path, common.file_user(&ctx).as_deref());
            match ctx.core.stat_with(&p, Default::default()).await {
                Ok(s) if s.kind == FileKind::Dir => return Ok(false),
                Ok(_) => {
                    return Err(SandboxException::invalid_argument(format!(
                        "path '{path}' already exists and is not a directory"
                    )))
                }
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
            ctx.core
                .mkdir_with(&p, {
                    let mut options = MkdirOptions::default();
                    options.user = common.file_user(&ctx);
                    options
                })
                .await?;
            Ok(true)
        })
    }

    /// `files.watch_dir(path, on_event, on_exit=None, user=None, request_timeout=None,
    /// timeout=60, recursive=False, include_entry=False, allow_network_mounts=False) ->
    /// AsyncWatchHandle` (the async class's streaming form): `on_event` is called with each
    /// event from a background task until the watch ends (`timeout`, an error, or `stop()`).
    /// Needs the runtime's watch.
    pub fn watch_dir(
        &self,
        path: impl Into<String>,
        on_event: impl FnMut(FilesystemEvent) + Send + 'static,
    ) -> WatchBuilder {
        WatchBuilder {
            ctx: self.ctx.clone(),
            path: path.into(),
            on_event: Box::new(on_event),
            on_exit: None,
            timeout: Some(translate::DEFAULT_COMMAND_TIMEOUT),
            recursive: false,
            include_entry: false,
            common: Common::default(),
        }
    }
}

/// The builder of `files.read(...)`; the type parameter is the chosen format.
#[must_use = "a call does nothing until awaited"]
pub struct ReadBuilder<F> {
    ctx: Ctx,
    path: String,
    common: Common,
    _format: PhantomData<F>,
}

impl<F> fmt::Debug for ReadBuilder<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadBuilder")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl<F> ReadBuilder<F> {
    /// `format=`: [`read_format::Text`], [`read_format::Bytes`] or [`read_format::Stream`].
    pub fn format<G>(self, _format: G) -> ReadBuilder<G> {
        ReadBuilder {
            ctx: self.ctx,
            path: self.path,
            common: self.common,
            _format: PhantomData,
        }
    }

    /// `gzip=`: a transfer encoding in E2B; content is identical either way, so it has no
    /// effect here.
    pub fn gzip(self, _gzip: bool) -> Self {
        self
    }

    common_setters!();

    async fn open(ctx: Ctx, path: String, common: Common) -> Result<ByteStream> {
        open_read(&ctx, &path, common.user.as_deref()).await
    }

    /// The whole file in memory: up to the core's largest in-memory bound (a larger file is
    /// `FileTooLarge`, raised as `InvalidArgumentException`; `format="stream"` streams it).
    async fn bytes(ctx: Ctx, path: String, common: Common) -> Result<Vec<u8>> {
        let mut options =
            sandcove::ReadOptions::default().max_bytes(sandcove::MAX_MEMORY_FILE_BYTES);
        options.user = common.file_user(&ctx);
        let path = ctx.path_as(&path, options.user.as_deref());
        Ok(ctx.core.read_with(&path, options).await?)
    }
}

impl IntoFuture for ReadBuilder<read_format::Text> {
    type Output = Result<String>;
    type IntoFuture = BoxFuture<'static, String>;
    fn into_future(self) -> Self::IntoFuture {
        let limit = self.common.request_timeout;
        with_request_timeout(
            Box::pin(async move {
                let b = Self::bytes(self.ctx, self.path, self.common).await?;
                Ok(String::from_utf8_lossy(&b).into_owned())
            }),
            limit,
        )
    }
}

impl IntoFuture for ReadBuilder<read_format::Bytes> {
    type Output = Result<Vec<u8>>;
    type IntoFuture = BoxFuture<'static, Vec<u8>>;
    fn into_future(self) -> Self::IntoFuture {
        let limit = self.common.request_timeout;
        with_request_timeout(
            Box::pin(Self::bytes(self.ctx, self.path, self.common)),
            limit,
        )
    }
}

impl IntoFuture for ReadBuilder<read_format::Stream> {
    type Output = Result<FileStreamReader>;
    type IntoFuture = BoxFuture<'static, FileStreamReader>;
    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let s = Self::open(self.ctx, self.path, self.common).await?;
            Ok(FileStreamReader { inner: Some(s) })
        })
    }
}

/// The builder of `files.write(...)`.
#[must_use = "a call does nothing until awaited"]
#[derive(Debug)]
pub struct WriteBuilder {
    ctx: Ctx,
    entries: Vec<WriteEntry>,
    common: Common,
    metadata: Vec<(String, String)>,
}

impl WriteBuilder {
    common_setters!();

    /// `gzip=`: transfer encoding only; no effect on what is written.
    pub fn gzip(self, _gzip: bool) -> Self {
        self
    }

    /// `use_octet_stream=`: transfer encoding only; no effect on what is written.
    pub fn use_octet_stream(self, _use: bool) -> Self {
        self
    }

    /// `metadata=`: kept on the file as its `user.e2b.<key>` extended attributes (keys
    /// lowercased), and the only metadata it has afterwards; `get_info`, `list` and `rename`
    /// report it, with any a process set. Keys must be HTTP token characters and values
    /// printable US-ASCII (else `InvalidArgumentException`, before anything is written), all
    /// of it at most 4096 bytes. Where the file's filesystem has no user attributes, the
    /// write is refused (`NotSupported`) and nothing is written.
    pub fn metadata<K: Into<String>, V: Into<String>>(
        mut self,
        metadata: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        self.metadata = metadata
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        self
    }

    async fn run(self) -> Result<Vec<WriteInfo>> {
        check_sdk_metadata(&self.metadata)?;
        let metadata = metadata_attributes(&self.metadata)?;
        let ctx = self.ctx;
        let mut out = Vec::with_capacity(self.entries.len());
        for entry in self.entries {
            out.push(
                write_stream(
                    &ctx,
                    &entry.path,
                    entry.data.into_stream(),
                    self.common.user.as_deref(),
                    &metadata,
                )
                .await?,
            );
        }
        Ok(out)
    }
}

impl IntoFuture for WriteBuilder {
    type Output = Result<WriteInfo>;
    type IntoFuture = BoxFuture<'static, WriteInfo>;
    fn into_future(self) -> Self::IntoFuture {
        let limit = self.common.request_timeout;
        with_request_timeout(
            Box::pin(async move {
                let mut infos = self.run().await?;
                infos
                    .pop()
                    .ok_or_else(|| SandboxException::sandbox("nothing was written"))
            }),
            limit,
        )
    }
}

/// The builder of `files.write_files(...)`.
#[must_use = "a call does nothing until awaited"]
#[derive(Debug)]
pub struct WriteFilesBuilder(WriteBuilder);

impl WriteFilesBuilder {
    /// `user=`.
    pub fn user(self, user: impl crate::OptionalString) -> Self {
        WriteFilesBuilder(self.0.user(user))
    }

    /// `request_timeout=`.
    pub fn request_timeout(self, secs: impl IntoSeconds) -> Self {
        WriteFilesBuilder(self.0.request_timeout(secs))
    }

    /// `gzip=`: no effect (transfer encoding).
    pub fn gzip(self, _gzip: bool) -> Self {
        self
    }

    /// `metadata=`: the same metadata on every file (see [`WriteBuilder::metadata`]).
    pub fn metadata<K: Into<String>, V: Into<String>>(
        self,
        metadata: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        WriteFilesBuilder(self.0.metadata(metadata))
    }
}

impl IntoFuture for WriteFilesBuilder {
    type Output = Result<Vec<WriteInfo>>;
    type IntoFuture = BoxFuture<'static, Vec<WriteInfo>>;
    fn into_future(self) -> Self::IntoFuture {
        let limit = self.0.common.request_timeout;
        with_request_timeout(Box::pin(self.0.run()), limit)
    }
}

/// The builder of `files.list(...)`.
#[must_use = "a call does nothing until awaited"]
#[derive(Debug)]
pub struct ListBuilder {
    ctx: Ctx,
    path: String,
    depth: Option<i64>,
    common: Common,
}

impl ListBuilder {
    /// `depth=`: levels to descend (1 = direct children; must be at least 1).
    pub fn depth(mut self, depth: impl Into<Option<i64>>) -> Self {
        self.depth = depth.into();
        self
    }

    common_setters!();
}

impl IntoFuture for ListBuilder {
    type Output = Result<Vec<EntryInfo>>;
    type IntoFuture = BoxFuture<'static, Vec<EntryInfo>>;
    fn into_future(self) -> Self::IntoFuture {
        let limit = self.common.request_timeout;
        with_request_timeout(
            Box::pin(async move {
                let depth = self.depth.unwrap_or(1);
                if depth < 1 {
                    return Err(SandboxException::invalid_argument(
                        "depth should be at least one",
                    ));
                }
                let ctx = self.ctx;
                let user = self.common.file_user(&ctx);
                let listed = ctx
                    .core
                    .list_dir_with(&ctx.path_as(&self.path, user.as_deref()), {
                        let mut options = ListDirOptions::default()
                            .depth(u32::try_from(depth).unwrap_or(u32::MAX))
                            .attributes(true);
                        options.user = user.clone();
                        options
                    })
                    .await?;
                let mut entries: Vec<EntryInfo> = Vec::with_capacity(listed.len());
                // The SDK skips an entry whose `type` it does not know: anything but a file, a
                // directory or a link that resolves to one of them.
                for s in listed.iter().filter(|s| s.kind != FileKind::Other) {
                    let entry = EntryInfo::resolved(&ctx, s, user.clone()).await;
                    if entry.wire_type().is_some() {
                        entries.push(entry);
                    }
                }
                translate::sort_entries(&mut entries, |e| &e.path);
                Ok(entries)
            }),
            limit,
        )
    }
}

/// `FilesystemEventType`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub enum FilesystemEventType {
    /// `CHMOD = "chmod"`.
    Chmod,
    /// `CREATE = "create"`.
    Create,
    /// `REMOVE = "remove"`.
    Remove,
    /// `RENAME = "rename"`.
    Rename,
    /// `WRITE = "write"`.
    Write,
}

impl FilesystemEventType {
    /// The string value, e.g. `"create"`.
    pub fn value(&self) -> &'static str {
        match self {
            FilesystemEventType::Chmod => "chmod",
            FilesystemEventType::Create => "create",
            FilesystemEventType::Remove => "remove",
            FilesystemEventType::Rename => "rename",
            FilesystemEventType::Write => "write",
        }
    }

    fn from_kind(kind: sandcove::FsEventKind) -> Self {
        match kind {
            sandcove::FsEventKind::Create => FilesystemEventType::Create,
            sandcove::FsEventKind::Write => FilesystemEventType::Write,
            sandcove::FsEventKind::Remove => FilesystemEventType::Remove,
            sandcove::FsEventKind::Rename => FilesystemEventType::Rename,
            sandcove::FsEventKind::Chmod => FilesystemEventType::Chmod,
        }
    }
}

impl fmt::Debug for FilesystemEventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "<FilesystemEventType.{}: '{}'>",
            self.value().to_uppercase(),
            self.value()
        )
    }
}

/// `FilesystemEvent`.
#[derive(Clone, PartialEq, Eq)]
pub struct FilesystemEvent {
    /// `name`: path relative to the watched directory.
    pub name: String,
    /// `type`.
    pub r#type: FilesystemEventType,
    /// `entry` (with `include_entry=True`).
    pub entry: Option<EntryInfo>,
}

impl fmt::Debug for FilesystemEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "FilesystemEvent(name={}, type={:?}, entry={})",
            py_str(&self.name),
            self.r#type,
            self.entry
                .as_ref()
                .map(|e| format!("{e:?}"))
                .unwrap_or_else(|| "None".into())
        )
    }
}

/// An `on_event` callback of `files.watch_dir`.
pub type WatchEventHandler = Box<dyn FnMut(FilesystemEvent) + Send + 'static>;

/// An `on_exit` callback of `files.watch_dir`: called once, with the error that ended the
/// watch or `None`.
pub type WatchExitHandler = Box<dyn FnOnce(Option<SandboxException>) + Send + 'static>;

/// The builder of `files.watch_dir(path, on_event, ...)`.
#[must_use = "a call does nothing until awaited"]
pub struct WatchBuilder {
    ctx: Ctx,
    path: String,
    on_event: WatchEventHandler,
    on_exit: Option<WatchExitHandler>,
    timeout: Option<f64>,
    recursive: bool,
    include_entry: bool,
    common: Common,
}

impl fmt::Debug for WatchBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WatchBuilder")
            .field("path", &self.path)
            .field("timeout", &self.timeout)
            .field("recursive", &self.recursive)
            .field("include_entry", &self.include_entry)
            .finish_non_exhaustive()
    }
}

impl WatchBuilder {
    /// `on_exit=`: called once when the watch ends, with the error that ended it (a
    /// `Timeout` when `timeout` passed) or `None`. Not called after `stop()`.
    pub fn on_exit(mut self, f: impl FnOnce(Option<SandboxException>) + Send + 'static) -> Self {
        self.on_exit = Some(Box::new(f));
        self
    }

    /// `timeout=`: how long the watch runs, seconds (default 60; `0` or `None` = no limit).
    pub fn timeout(mut self, timeout: impl IntoSeconds) -> Self {
        self.timeout = timeout.into_seconds();
        self
    }

    /// `recursive=`: include subdirectories.
    pub fn recursive(mut self, recursive: bool) -> Self {
        self.recursive = recursive;
        self
    }

    /// `include_entry=`: attach the entry's `EntryInfo` to each event (when it still exists).
    pub fn include_entry(mut self, include: bool) -> Self {
        self.include_entry = include;
        self
    }

    /// `allow_network_mounts=`: there are no network mounts in a Sandcove sandbox; accepted.
    pub fn allow_network_mounts(self, _allow: bool) -> Self {
        self
    }

    common_setters!();
}

/// `AsyncWatchHandle`: the running watch of `files.watch_dir`; end it with `stop()`.
/// Dropping the handle stops the watch as well.
#[derive(Debug)]
pub struct AsyncWatchHandle {
    // Taken by `stop()`, which waits for the task so no callback outlives the call.
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// The name the sync class gives the handle; here it is the async [`AsyncWatchHandle`].
pub type WatchHandle = AsyncWatchHandle;

impl IntoFuture for WatchBuilder {
    type Output = Result<AsyncWatchHandle>;
    type IntoFuture = BoxFuture<'static, AsyncWatchHandle>;
    fn into_future(self) -> Self::IntoFuture {
        let limit = self.common.request_timeout;
        with_request_timeout(
            Box::pin(async move {
                let ctx = self.ctx;
                let mut stream = open_watch(
                    &ctx,
                    &self.path,
                    self.recursive,
                    self.common.user.as_deref(),
                )
                .await?;
                let include = self.include_entry;
                let mut on_event = self.on_event;
                let on_exit = self.on_exit;
                let deadline =
                    translate::timeout_secs(self.timeout).map(|d| Box::pin(tokio::time::sleep(d)));
                let task = tokio::spawn(async move {
                    let mut deadline = deadline;
                    let ended: Option<SandboxException> = loop {
                        let item = match deadline.as_mut() {
                            Some(sleep) => tokio::select! {
                                item = stream.next() => item,
                                _ = sleep.as_mut() => break Some(SandboxException::timeout(
                                    "context deadline exceeded: the watch's timeout passed",
                                )),
                            },
                            None => stream.next().await,
                        };
                        let event = match item {
                            None => break None,
                            Some(Err(e)) => break Some(e.into()),
                            Some(Ok(ev)) => ev,
                        };
                        on_event(watch_event(&ctx, event, include).await);
                    };
                    // The runtime's watch is released before `on_exit` runs.
                    drop(stream);
                    if let Some(f) = on_exit {
                        f(ended);
                    }
                });
                Ok(AsyncWatchHandle {
                    task: Mutex::new(Some(task)),
                })
            }),
            limit,
        )
    }
}

impl AsyncWatchHandle {
    /// `await handle.stop()`: end the watch; no callback runs after it returns.
    pub fn stop(&self) -> Call<()> {
        let task = self.task.lock().ok().and_then(|mut t| t.take());
        Call::new(async move {
            if let Some(task) = task {
                task.abort();
                // Cancelled (or already finished): either way no callback runs any more.
                let _ = task.await;
            }
            Ok(())
        })
    }
}

impl Drop for AsyncWatchHandle {
    fn drop(&mut self) {
        if let Some(task) = self.task.get_mut().ok().and_then(|t| t.take()) {
            task.abort();
        }
    }
}
