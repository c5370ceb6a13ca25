//! `multipart/form-data` (RFC 7578) as the wire listeners need it: uploads (E2B's envd
//! `/files`, Daytona's toolbox bulk upload, Blaxel's filesystem uploads) parsed by `multer` as
//! they stream, part by part, so no file is ever held whole in memory; and the framing of a
//! multipart download answer.
//!
//! An upload ([`Upload`]) holds, in memory, at most: the bytes between two parts' data (the
//! delimiter and a part's headers, [`MAX_PART_HEAD`]), one chunk of a part's data on its way
//! to the backend, and the text fields it keeps ([`MAX_FORM_BYTES`] for a whole request). Each
//! upload reserves that working set ([`WORKING_SET`]) from one [`UploadBudget`] shared by every
//! listener of a server before it reads a byte, so the memory all uploads hold together is
//! bounded by the budget however many connections trickle uploads; an upload that cannot get
//! its reservation within the budget's wait is refused as busy ([`UploadErrorKind::Busy`]).

use std::fmt;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Longest boundary accepted: RFC 2046 allows 70 characters; some clients send longer ones,
/// and the bound only has to keep the delimiter search small.
pub const MAX_BOUNDARY_LEN: usize = 200;

/// The boundary of a `multipart/form-data` content type (1 to [`MAX_BOUNDARY_LEN`]
/// characters), or `None` for any other content type.
pub fn boundary(content_type: &str) -> Option<String> {
    let (kind, params) = content_type.split_once(';')?;
    if !kind.trim().eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    params.split(';').find_map(|p| {
        let (k, v) = p.trim().split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case("boundary")
            .then(|| v.trim().trim_matches('"').to_string())
            .filter(|b| !b.is_empty() && b.len() <= MAX_BOUNDARY_LEN)
    })
}

/// A `Content-Disposition` parameter value (a bare token, or a quoted string), by
/// case-insensitive name. Parameters are split at the `;` outside quotes, so
/// `filename="a;b"` is `a;b`. In a quoted string `\"` and `\\` stand for `"` and `\` (RFC 2183,
/// as httpx writes them); any other backslash is kept, as HTML5's encoding (fetch's
/// `FormData`) never escapes one.
fn param(header: &str, key: &str) -> Option<String> {
    let mut chars = header.chars().peekable();
    // The disposition type (`form-data`) is a token: it ends at the first `;`.
    chars.by_ref().find(|c| *c == ';')?;
    loop {
        while chars.next_if(|c| c.is_whitespace() || *c == ';').is_some() {}
        chars.peek()?;
        let mut name = String::new();
        while let Some(c) = chars.next_if(|c| *c != '=' && *c != ';') {
            name.push(c);
        }
        let mut value = String::new();
        if chars.next_if_eq(&'=').is_some() {
            while chars.next_if(|c| *c == ' ' || *c == '\t').is_some() {}
            if chars.next_if_eq(&'"').is_some() {
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => value.push(chars.next_if(|c| matches!(c, '"' | '\\')).unwrap_or(c)),
                        c => value.push(c),
                    }
                }
                // Anything after the closing quote, up to the next parameter, is not the value.
                while chars.next_if(|c| *c != ';').is_some() {}
            } else {
                while let Some(c) = chars.next_if(|c| *c != ';') {
                    value.push(c);
                }
                value.truncate(value.trim_end().len());
            }
        }
        if name.trim().eq_ignore_ascii_case(key) {
            return Some(value);
        }
    }
}

/// Most parts accepted in one body: each part becomes a file write, so a body of many tiny
/// parts (a compressed upload expands to the listener's whole limit) would otherwise turn
/// one request into a million writes.
pub const MAX_PARTS: usize = 10_000;

/// Most bytes read between two parts' data: the delimiter line and a part's headers (at
/// most 32 of them). A part whose head does not end within it is refused, so a client cannot
/// make the parser buffer an endless head.
pub const MAX_PART_HEAD: usize = 16 * 1024;

/// Most bytes of text fields (paths, permissions) one upload request keeps in memory, all
/// fields together.
pub const MAX_FORM_BYTES: usize = 1024 * 1024;

/// What one upload request reserves from its [`UploadBudget`] while it runs: its text fields
/// ([`MAX_FORM_BYTES`]), a part head ([`MAX_PART_HEAD`]) and the chunks on their way from the
/// connection through the parser (and a gzip decoder) to the backend, with room to spare.
pub const WORKING_SET: usize = 2 * 1024 * 1024;

/// A server's upload memory unless configured otherwise: [`WORKING_SET`] each for 128
/// uploads at once.
pub const DEFAULT_UPLOAD_MEMORY: usize = 256 * 1024 * 1024;

/// How long an upload waits for its reservation before it is refused as busy.
pub const DEFAULT_BUDGET_WAIT: Duration = Duration::from_secs(10);

/// The memory every upload of a server may hold at once, shared by all its listeners
/// (clones share one budget). Each [`Upload`] reserves [`WORKING_SET`] bytes of it until it
/// ends, whichever way.
#[derive(Clone)]
pub struct UploadBudget {
    semaphore: Arc<Semaphore>,
    total: usize,
    wait: Duration,
}

impl fmt::Debug for UploadBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UploadBudget")
            .field("total", &self.total)
            .field("in_use", &self.in_use())
            .field("wait", &self.wait)
            .finish()
    }
}

impl Default for UploadBudget {
    /// [`DEFAULT_UPLOAD_MEMORY`].
    fn default() -> Self {
        UploadBudget::new(DEFAULT_UPLOAD_MEMORY)
    }
}

impl UploadBudget {
    /// A budget of `bytes` (at least one [`WORKING_SET`]), with [`DEFAULT_BUDGET_WAIT`].
    pub fn new(bytes: usize) -> Self {
        let total = bytes.clamp(WORKING_SET, Semaphore::MAX_PERMITS);
        UploadBudget {
            semaphore: Arc::new(Semaphore::new(total)),
            total,
            wait: DEFAULT_BUDGET_WAIT,
        }
    }

    /// The same budget, with uploads waiting at most `wait` for their reservation.
    pub fn with_wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// The budget, in bytes.
    pub fn total(&self) -> usize {
        self.total
    }

    /// The bytes reserved by uploads running now.
    pub fn in_use(&self) -> usize {
        self.total - self.semaphore.available_permits().min(self.total)
    }

    /// One upload's working set of this budget, held until the returned permit is dropped:
    /// for an upload streamed by other code than [`Upload`] (a signed URL's transfer), so it
    /// counts against the same bound. `Busy` once the budget's wait is over.
    pub async fn reserve_working_set(&self) -> Result<OwnedSemaphorePermit, UploadError> {
        self.reserve().await
    }

    async fn reserve(&self) -> Result<OwnedSemaphorePermit, UploadError> {
        let n = u32::try_from(WORKING_SET).unwrap_or(u32::MAX);
        match tokio::time::timeout(self.wait, self.semaphore.clone().acquire_many_owned(n)).await {
            Ok(Ok(permit)) => Ok(permit),
            _ => Err(UploadError::new(
                UploadErrorKind::Busy,
                format!(
                    "the server's upload memory ({} bytes) is taken by uploads in progress; \
                     retry shortly",
                    self.total
                ),
            )),
        }
    }
}

/// What went wrong with an upload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum UploadErrorKind {
    /// The server's [`UploadBudget`] is taken: retry later.
    Busy,
    /// Over a bound (the upload's size, the text fields').
    TooLarge,
    /// Not a well-formed multipart body, or not the parts this route takes.
    Malformed,
    /// A part this request may not carry (a signed URL's second file, another path).
    Forbidden,
    /// The body broke off (the client went away, stalled, or its encoding is broken).
    Broken,
}

/// An upload refused or cut short. Nothing of a part whose data ends in an error is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadError {
    /// What kind of failure.
    pub kind: UploadErrorKind,
    /// What happened, for the client.
    pub message: String,
}

impl UploadError {
    /// An error of `kind` saying `message`.
    pub fn new(kind: UploadErrorKind, message: impl Into<String>) -> Self {
        UploadError {
            kind,
            message: message.into(),
        }
    }
}

impl fmt::Display for UploadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for UploadError {}

/// Counts what the parser reads between two parts' data (see [`MAX_PART_HEAD`]).
#[derive(Debug, Default)]
struct Meter {
    between_parts: AtomicBool,
    pulled: AtomicUsize,
}

/// The request body on its way to the parser, metered, and handed over one chunk per poll:
/// the parser takes every chunk that is ready before it looks at any, so without the pause
/// it would buffer whatever the connection has ready, part heads included.
struct Metered<S> {
    inner: Pin<Box<S>>,
    meter: Arc<Meter>,
    /// A chunk went out at the last poll: pause once (waking at once) before the next.
    paused: bool,
}

impl<S> Stream for Metered<S>
where
    S: Stream<Item = Result<Bytes, UploadError>>,
{
    type Item = Result<Bytes, UploadError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.paused {
            self.paused = false;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        // Checked only when the parser wants more: what it took already may hold a whole
        // head and data beyond.
        let between = self.meter.between_parts.load(Ordering::Relaxed);
        if between && self.meter.pulled.load(Ordering::Relaxed) >= MAX_PART_HEAD {
            return Poll::Ready(Some(Err(UploadError::new(
                UploadErrorKind::Malformed,
                format!(
                    "multipart: a part's delimiter and headers take more than {MAX_PART_HEAD} \
                     bytes"
                ),
            ))));
        }
        let polled = self.inner.as_mut().poll_next(cx);
        if let Poll::Ready(Some(Ok(chunk))) = &polled {
            self.paused = true;
            if between {
                self.meter.pulled.fetch_add(chunk.len(), Ordering::Relaxed);
            }
        }
        polled
    }
}

/// The upload error a parser error stands for.
fn parse_error(e: multer::Error) -> UploadError {
    match e {
        multer::Error::StreamReadFailed(inner) => match inner.downcast::<UploadError>() {
            Ok(ours) => *ours,
            Err(other) => UploadError::new(
                UploadErrorKind::Broken,
                format!("reading the request body: {other}"),
            ),
        },
        multer::Error::StreamSizeExceeded { limit }
        | multer::Error::FieldSizeExceeded { limit, .. } => UploadError::new(
            UploadErrorKind::TooLarge,
            format!("the upload is larger than {limit} bytes"),
        ),
        other => UploadError::new(UploadErrorKind::Malformed, format!("multipart: {other}")),
    }
}

/// One part of an upload, its data not read yet. Read it to its end ([`Upload::text`],
/// [`Upload::skip`], [`Upload::data`], [`Upload::sole_file`]) before asking for the next.
pub struct Part {
    /// The `name` of its `Content-Disposition`.
    pub name: String,
    /// The `filename`, when it is a file.
    pub filename: Option<String>,
    field: multer::Field<'static>,
}

impl fmt::Debug for Part {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Part")
            .field("name", &self.name)
            .field("filename", &self.filename)
            .finish_non_exhaustive()
    }
}

/// The data of one part as it arrives; an error item (and nothing after it) if the body
/// breaks off or passes a bound before the part ends.
pub type PartData = Pin<Box<dyn Stream<Item = Result<Bytes, UploadError>> + Send>>;

/// One `multipart/form-data` upload being read: its parts, in order, each streamed.
pub struct Upload {
    multipart: multer::Multipart<'static>,
    meter: Arc<Meter>,
    parts: usize,
    form_bytes: usize,
    _reservation: OwnedSemaphorePermit,
}

impl fmt::Debug for Upload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Upload")
            .field("parts", &self.parts)
            .field("form_bytes", &self.form_bytes)
            .finish_non_exhaustive()
    }
}

impl Upload {
    /// Start reading `body`, a request of `content_type` (a `multipart/form-data` with a
    /// boundary) of at most `max_bytes`, once `budget` has the upload's working set. Map the
    /// body's own errors to [`UploadErrorKind::Broken`] (or a bound's kind) before.
    pub async fn start<S>(
        body: S,
        content_type: &str,
        max_bytes: u64,
        budget: &UploadBudget,
    ) -> Result<Upload, UploadError>
    where
        S: Stream<Item = Result<Bytes, UploadError>> + Send + 'static,
    {
        let Some(boundary) = boundary(content_type) else {
            return Err(UploadError::new(
                UploadErrorKind::Malformed,
                "uploads must be multipart/form-data with a boundary",
            ));
        };
        let reservation = budget.reserve().await?;
        let meter = Arc::new(Meter::default());
        let metered = Metered {
            inner: Box::pin(body),
            meter: meter.clone(),
            paused: false,
        };
        let constraints =
            multer::Constraints::new().size_limit(multer::SizeLimit::new().whole_stream(max_bytes));
        Ok(Upload {
            multipart: multer::Multipart::with_constraints(metered, boundary, constraints),
            meter,
            parts: 0,
            form_bytes: 0,
            _reservation: reservation,
        })
    }

    /// The next part, `None` after the closing delimiter. A part without a name, more than
    /// [`MAX_PARTS`] parts, or a body that is not multipart is an error.
    pub async fn next_part(&mut self) -> Result<Option<Part>, UploadError> {
        self.meter.pulled.store(0, Ordering::Relaxed);
        self.meter.between_parts.store(true, Ordering::Relaxed);
        let next = self.multipart.next_field().await.map_err(parse_error);
        self.meter.between_parts.store(false, Ordering::Relaxed);
        let Some(field) = next? else {
            return Ok(None);
        };
        self.parts += 1;
        if self.parts > MAX_PARTS {
            return Err(UploadError::new(
                UploadErrorKind::Malformed,
                format!("multipart: more than {MAX_PARTS} parts"),
            ));
        }
        let disposition = field
            .headers()
            .get("content-disposition")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let Some(name) = param(disposition, "name") else {
            return Err(UploadError::new(
                UploadErrorKind::Malformed,
                "multipart: a part without a name",
            ));
        };
        let filename = param(disposition, "filename");
        Ok(Some(Part {
            name,
            filename,
            field,
        }))
    }

    /// A text field's value, kept in memory: all text fields of one upload together are
    /// bounded by [`MAX_FORM_BYTES`].
    pub async fn text(&mut self, mut part: Part) -> Result<String, UploadError> {
        let mut out = Vec::new();
        while let Some(chunk) = part.field.chunk().await.map_err(parse_error)? {
            self.form_bytes += chunk.len();
            if self.form_bytes > MAX_FORM_BYTES {
                return Err(UploadError::new(
                    UploadErrorKind::TooLarge,
                    format!("the upload's text fields are larger than {MAX_FORM_BYTES} bytes"),
                ));
            }
            out.extend_from_slice(&chunk);
        }
        String::from_utf8(out).map_err(|_| {
            UploadError::new(
                UploadErrorKind::Malformed,
                format!("the form field {:?} is not UTF-8", part.name),
            )
        })
    }

    /// Read past a part, keeping nothing.
    pub async fn skip(&mut self, mut part: Part) -> Result<(), UploadError> {
        while part.field.chunk().await.map_err(parse_error)?.is_some() {}
        Ok(())
    }

    /// A part's data as it arrives, for a backend's write: consume it to its end (or drop
    /// it and give up on the upload) before asking for the next part.
    pub fn data(part: Part) -> PartData {
        Box::pin(futures::stream::unfold(
            Some(part.field),
            |field| async move {
                let mut field = field?;
                match field.chunk().await {
                    Ok(Some(chunk)) => Some((Ok(chunk), Some(field))),
                    Ok(None) => None,
                    Err(e) => Some((Err(parse_error(e)), None)),
                }
            },
        ))
    }

    /// The data of `part`, the one file this upload may carry: the stream ends without an
    /// error only once the rest of the body has been read to its closing delimiter and held
    /// no other part `is_file` accepts (other parts are read past). Another file ends it with
    /// `refuse`'s error instead, so a backend's write of it keeps nothing: no effect.
    pub fn sole_file<F, R>(self, part: Part, is_file: F, refuse: R) -> PartData
    where
        F: Fn(&Part) -> bool + Send + Sync + 'static,
        R: Fn(&Part) -> UploadError + Send + Sync + 'static,
    {
        let rules = Arc::new((is_file, refuse));
        let start = Some((self, Some(part.field)));
        Box::pin(futures::stream::unfold(start, move |state| {
            let rules = rules.clone();
            async move {
                let (mut upload, field) = state?;
                if let Some(mut field) = field {
                    match field.chunk().await {
                        Ok(Some(chunk)) => return Some((Ok(chunk), Some((upload, Some(field))))),
                        Ok(None) => drop(field),
                        Err(e) => return Some((Err(parse_error(e)), None)),
                    }
                }
                // The file's data is in: the rest of the body decides whether it stands.
                loop {
                    match upload.next_part().await {
                        Ok(None) => return None,
                        Ok(Some(part)) if (rules.0)(&part) => {
                            return Some((Err((rules.1)(&part)), None))
                        }
                        Ok(Some(part)) => {
                            if let Err(e) = upload.skip(part).await {
                                return Some((Err(e), None));
                            }
                        }
                        Err(e) => return Some((Err(e), None)),
                    }
                }
            }
        }))
    }
}

/// The files of one multi-file upload, each written under a temporary name beside its
/// destination as its part streams in, and moved into place only once the whole body has
/// been read and found good ([`Staged::commit`]); a failed or broken-off upload removes what
/// it wrote ([`Staged::abort`]) and leaves the destinations as they were. (A single-file
/// upload needs none of this: see [`Upload::sole_file`].)
#[derive(Debug)]
pub struct Staged {
    sandbox: sandcove::Sandbox,
    /// The files written, in order.
    files: Vec<StagedFile>,
}

/// One file of a [`Staged`] upload.
#[derive(Debug)]
struct StagedFile {
    temporary: String,
    destination: String,
    /// Who moves it into place.
    user: Option<String>,
    /// The attributes its write reported, which the move keeps.
    attributes: Option<sandcove::FileAttributes>,
}

impl Staged {
    /// Nothing staged yet in `sandbox`.
    pub fn new(sandbox: sandcove::Sandbox) -> Self {
        Staged {
            sandbox,
            files: Vec::new(),
        }
    }

    /// Write `data` for `destination` (an absolute sandbox path) under a temporary name in
    /// its directory (`.sandcove-upload-…`), with `options` (whose user also moves it into
    /// place; its attributes stay with the file). A destination staged already in this upload
    /// is refused.
    pub async fn write(
        &mut self,
        destination: &str,
        data: sandcove::ByteStream,
        options: sandcove::WriteOptions,
    ) -> sandcove::Result<()> {
        if self.files.iter().any(|f| f.destination == destination) {
            return Err(sandcove::Error::invalid(format!(
                "{destination} is uploaded twice in one request"
            )));
        }
        let name = format!(".sandcove-upload-{}", sandcove::random_id(16));
        let temporary = match destination.rsplit_once('/') {
            Some((dir, _)) => format!("{dir}/{name}"),
            None => name,
        };
        let user = options.user.clone();
        let written = self.sandbox.write_stream(&temporary, data, options).await?;
        self.files.push(StagedFile {
            temporary,
            destination: destination.to_string(),
            user,
            attributes: written.attributes,
        });
        Ok(())
    }

    /// Move every staged file into place, in order; their metadata (with the attributes their
    /// writes reported). A move that fails removes the files not moved yet and is the error.
    pub async fn commit(mut self) -> sandcove::Result<Vec<sandcove::FileStat>> {
        let files = std::mem::take(&mut self.files);
        let mut moved = Vec::with_capacity(files.len());
        let mut rest = files.into_iter();
        while let Some(file) = rest.next() {
            let mut options = sandcove::RenameOptions::default();
            options.user = file.user.clone();
            match self
                .sandbox
                .rename_with(&file.temporary, &file.destination, options)
                .await
            {
                Ok(mut stat) => {
                    stat.attributes = file.attributes;
                    moved.push(stat);
                }
                Err(e) => {
                    self.files = std::iter::once(file).chain(rest).collect();
                    self.abort().await;
                    return Err(e);
                }
            }
        }
        Ok(moved)
    }

    /// Remove every staged file (best effort: a sandbox that is gone takes them with it).
    pub async fn abort(self) {
        for file in &self.files {
            let _ = self.sandbox.remove(&file.temporary).await;
        }
    }
}

/// A request body (axum's, hyper's, …) as an upload's input: its errors become
/// [`UploadErrorKind::Broken`].
pub fn body_stream<S, E>(body: S) -> impl Stream<Item = Result<Bytes, UploadError>> + Send + 'static
where
    S: Stream<Item = Result<Bytes, E>> + Send + 'static,
    E: fmt::Display,
{
    body.map(|chunk| {
        chunk.map_err(|e| {
            UploadError::new(
                UploadErrorKind::Broken,
                format!("reading the request body: {e}"),
            )
        })
    })
}

/// A `filename` parameter value that cannot end the quoted string or the header line.
fn quoted(value: &str) -> String {
    value
        .replace('%', "%25")
        .replace('"', "%22")
        .replace('\r', "%0D")
        .replace('\n', "%0A")
}

/// Append one part to a multipart answer being built.
pub fn push_part(
    out: &mut Vec<u8>,
    boundary: &str,
    name: &str,
    filename: &str,
    content_type: &str,
    data: &[u8],
) {
    out.extend_from_slice(
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{}\"\r\n\
             Content-Type: {content_type}\r\nContent-Length: {}\r\n\r\n",
            quoted(filename),
            data.len()
        )
        .as_bytes(),
    );
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// Close a multipart answer.
pub fn finish(out: &mut Vec<u8>, boundary: &str) {
    out.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `body` as a request body arriving in `chunk`-byte pieces.
    fn pieces(body: &[u8], chunk: usize) -> impl Stream<Item = Result<Bytes, UploadError>> {
        let chunks: Vec<_> = body
            .chunks(chunk)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        futures::stream::iter(chunks)
    }

    /// Every part of `body` (name, filename, data), the data read whole.
    async fn parse(
        body: &[u8],
        boundary: &str,
    ) -> Result<Vec<(String, Option<String>, Vec<u8>)>, UploadError> {
        let budget = UploadBudget::default();
        let content_type = format!("multipart/form-data; boundary={boundary}");
        let mut upload = Upload::start(pieces(body, 61), &content_type, 1 << 30, &budget).await?;
        let mut out = Vec::new();
        while let Some(part) = upload.next_part().await? {
            let (name, filename) = (part.name.clone(), part.filename.clone());
            let mut data = Vec::new();
            let mut stream = Upload::data(part);
            while let Some(chunk) = stream.next().await {
                data.extend_from_slice(&chunk?);
            }
            drop(stream);
            out.push((name, filename, data));
        }
        Ok(out)
    }

    #[tokio::test]
    async fn uploads_parse_strictly_and_answers_parse_back() {
        let body = b"--XyZ\r\nContent-Disposition: form-data; name=\"files[0].path\"\r\n\r\n/a/b.txt\r\n--XyZ\r\nContent-Disposition: form-data; name=\"files[0].file\"; filename=\"b.txt\"\r\nContent-Type: application/octet-stream\r\n\r\nhi\r\nthere\r\n--XyZ--\r\n";
        let parts = parse(body, "XyZ").await.unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].0, "files[0].path");
        assert_eq!(parts[0].2, b"/a/b.txt");
        assert_eq!(parts[1].1.as_deref(), Some("b.txt"));
        assert_eq!(parts[1].2, b"hi\r\nthere");
        assert!(
            parse(&body[..body.len() - 12], "XyZ").await.is_err(),
            "truncated"
        );
        assert!(parse(body, "other").await.is_err());
        assert_eq!(
            boundary("multipart/form-data; boundary=\"abc\"").as_deref(),
            Some("abc")
        );
        assert_eq!(boundary("application/json"), None);
        assert_eq!(
            boundary("multipart/form-data; boundary=abc").as_deref(),
            Some("abc")
        );
        let long = "b".repeat(MAX_BOUNDARY_LEN + 1);
        assert_eq!(
            boundary(&format!("multipart/form-data; boundary={long}")),
            None
        );
        let nameless = b"--B\r\nContent-Disposition: form-data\r\n\r\nx\r\n--B--\r\n";
        let err = parse(nameless, "B").await.unwrap_err();
        assert_eq!(
            err.kind,
            UploadErrorKind::Malformed,
            "a part without a name"
        );

        let mut out = Vec::new();
        push_part(
            &mut out,
            "B",
            "file",
            "/x/\"q\".txt",
            "application/octet-stream",
            b"data",
        );
        finish(&mut out, "B");
        let parts = parse(&out, "B").await.unwrap();
        assert_eq!(parts.len(), 1);
        assert_eq!(parts[0].1.as_deref(), Some("/x/%22q%22.txt"));
        assert_eq!(parts[0].2, b"data");
    }

    #[test]
    fn disposition_parameters_split_outside_quotes() {
        let header = " form-data; name=\"files\"; filename=\"a;b name=c.txt\" ; x=1";
        assert_eq!(param(header, "name").as_deref(), Some("files"));
        assert_eq!(param(header, "filename").as_deref(), Some("a;b name=c.txt"));
        assert_eq!(param(header, "x").as_deref(), Some("1"));
        assert_eq!(param(header, "missing"), None);
        // httpx escapes `"` and `\`; fetch's FormData writes `"` as %22 and leaves `\` alone.
        let escaped = r#"form-data; NAME="f"; filename="q\"x\\y\z.txt""#;
        assert_eq!(param(escaped, "name").as_deref(), Some("f"));
        assert_eq!(
            param(escaped, "filename").as_deref(),
            Some(r#"q"x\y\z.txt"#)
        );
        assert_eq!(
            param("form-data; name=bare ;", "name").as_deref(),
            Some("bare")
        );
        assert_eq!(param("form-data", "name"), None);
        assert_eq!(
            param("form-data; name=\"unterminated", "name").as_deref(),
            Some("unterminated")
        );
    }

    #[tokio::test]
    async fn parts_are_bounded_in_number() {
        let body = |n: usize| {
            let mut out = Vec::new();
            for i in 0..n {
                push_part(&mut out, "B", "file", &format!("/f{i}"), "text/plain", b"x");
            }
            finish(&mut out, "B");
            out
        };
        assert_eq!(parse(&body(MAX_PARTS), "B").await.unwrap().len(), MAX_PARTS);
        let err = parse(&body(MAX_PARTS + 1), "B").await.unwrap_err();
        assert!(err.message.contains("parts"), "{err}");
    }

    /// A part head that never ends (and a preamble that never reaches a delimiter) is
    /// refused at the head bound, not buffered to the body's size.
    #[tokio::test]
    async fn an_endless_part_head_stops_at_its_bound() {
        let mut endless =
            b"--B\r\nContent-Disposition: form-data; name=\"file\"\r\nX-Pad: ".to_vec();
        endless.extend(std::iter::repeat_n(b'a', 4 * MAX_PART_HEAD));
        let err = parse(&endless, "B").await.unwrap_err();
        assert_eq!(err.kind, UploadErrorKind::Malformed, "{err}");
        assert!(err.message.contains("headers take more than"), "{err}");
        let preamble = vec![b'p'; 4 * MAX_PART_HEAD];
        let err = parse(&preamble, "B").await.unwrap_err();
        assert!(err.message.contains("headers take more than"), "{err}");
        // A long file is not a long head, even when its head and much of its data come in
        // one chunk.
        let mut long = Vec::new();
        push_part(
            &mut long,
            "B",
            "file",
            "/big",
            "x",
            &vec![b'd'; 8 * MAX_PART_HEAD],
        );
        push_part(
            &mut long,
            "B",
            "file",
            "/big2",
            "x",
            &vec![b'e'; 8 * MAX_PART_HEAD],
        );
        finish(&mut long, "B");
        assert_eq!(
            parse(&long, "B").await.unwrap()[0].2.len(),
            8 * MAX_PART_HEAD
        );
        let budget = UploadBudget::default();
        let ct = "multipart/form-data; boundary=B";
        let mut upload = Upload::start(pieces(&long, 6 * MAX_PART_HEAD), ct, 1 << 30, &budget)
            .await
            .unwrap();
        let mut sizes = Vec::new();
        while let Some(part) = upload.next_part().await.unwrap() {
            let mut data = Upload::data(part);
            let mut size = 0;
            while let Some(chunk) = data.next().await {
                size += chunk.unwrap().len();
            }
            sizes.push(size);
        }
        assert_eq!(sizes, [8 * MAX_PART_HEAD, 8 * MAX_PART_HEAD]);
    }

    #[tokio::test]
    async fn text_fields_and_the_whole_body_are_bounded() {
        let budget = UploadBudget::default();
        let mut body = Vec::new();
        for i in 0..3 {
            push_part(
                &mut body,
                "B",
                &format!("f{i}"),
                "",
                "text/plain",
                &vec![b't'; MAX_FORM_BYTES / 2],
            );
        }
        finish(&mut body, "B");
        let ct = "multipart/form-data; boundary=B";
        let mut upload = Upload::start(pieces(&body, 4096), ct, 1 << 30, &budget)
            .await
            .unwrap();
        let first = upload.next_part().await.unwrap().unwrap();
        assert_eq!(upload.text(first).await.unwrap().len(), MAX_FORM_BYTES / 2);
        let second = upload.next_part().await.unwrap().unwrap();
        upload.text(second).await.unwrap();
        let third = upload.next_part().await.unwrap().unwrap();
        let err = upload.text(third).await.unwrap_err();
        assert_eq!(err.kind, UploadErrorKind::TooLarge, "{err}");
        // The whole body past the request's bound.
        let mut upload = Upload::start(pieces(&body, 4096), ct, 1000, &budget)
            .await
            .unwrap();
        let err = async {
            let part = upload.next_part().await?.expect("a part");
            upload.skip(part).await
        }
        .await
        .unwrap_err();
        assert_eq!(err.kind, UploadErrorKind::TooLarge, "{err}");
        assert!(err.message.contains("larger than 1000 bytes"), "{err}");
    }

    /// The one file of an upload stands only once the rest of the body holds no other file;
    /// other parts are read past.
    #[tokio::test]
    async fn a_sole_file_ends_in_an_error_if_another_file_follows() {
        let budget = UploadBudget::default();
        let read = |body: Vec<u8>| {
            let budget = budget.clone();
            async move {
                let ct = "multipart/form-data; boundary=B";
                let mut upload = Upload::start(pieces(&body, 5), ct, 1 << 20, &budget).await?;
                let first = loop {
                    let part = upload.next_part().await?.expect("a file part");
                    if part.name == "file" {
                        break part;
                    }
                    upload.skip(part).await?;
                };
                let mut data = Vec::new();
                let mut stream = upload.sole_file(
                    first,
                    |p| p.name == "file",
                    |p| {
                        UploadError::new(
                            UploadErrorKind::Forbidden,
                            format!("second {:?}", p.filename),
                        )
                    },
                );
                while let Some(chunk) = stream.next().await {
                    data.extend_from_slice(&chunk?);
                }
                Ok::<_, UploadError>(data)
            }
        };
        let mut one = Vec::new();
        push_part(&mut one, "B", "note", "", "text/plain", b"skipped");
        push_part(&mut one, "B", "file", "a", "x", b"the file");
        push_part(&mut one, "B", "path", "", "text/plain", b"/ignored");
        finish(&mut one, "B");
        assert_eq!(read(one).await.unwrap(), b"the file");
        let mut two = Vec::new();
        push_part(&mut two, "B", "file", "a", "x", b"first");
        push_part(&mut two, "B", "file", "/etc/evil", "x", b"second");
        finish(&mut two, "B");
        let err = read(two).await.unwrap_err();
        assert_eq!(err.kind, UploadErrorKind::Forbidden);
        assert!(err.message.contains("/etc/evil"), "{err}");
        // A body cut after the file's data (no closing delimiter) is an error too.
        let mut cut = Vec::new();
        push_part(&mut cut, "B", "file", "a", "x", b"data");
        assert!(read(cut).await.is_err());
    }

    /// Each upload holds its working set of the budget until it ends; one that cannot get it
    /// within the wait is refused as busy, and a freed reservation serves the next.
    #[tokio::test]
    async fn uploads_share_one_bounded_budget() {
        let budget = UploadBudget::new(2 * WORKING_SET).with_wait(Duration::from_millis(50));
        assert_eq!(budget.in_use(), 0);
        let ct = "multipart/form-data; boundary=B";
        let a = Upload::start(pieces(b"", 1), ct, 10, &budget)
            .await
            .unwrap();
        let b = Upload::start(pieces(b"", 1), ct, 10, &budget.clone())
            .await
            .unwrap();
        assert_eq!(budget.in_use(), 2 * WORKING_SET);
        let err = Upload::start(pieces(b"", 1), ct, 10, &budget)
            .await
            .unwrap_err();
        assert_eq!(err.kind, UploadErrorKind::Busy, "{err}");
        drop(a);
        assert_eq!(budget.in_use(), WORKING_SET);
        let c = Upload::start(pieces(b"", 1), ct, 10, &budget)
            .await
            .unwrap();
        drop((b, c));
        assert_eq!(budget.in_use(), 0);
        assert_eq!(
            UploadBudget::new(1).total(),
            WORKING_SET,
            "at least one upload fits"
        );
    }
}
