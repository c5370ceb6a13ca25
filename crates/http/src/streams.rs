//! Frame streams: a streamed answer decoded into frames, and those frames into process events,
//! file chunks or filesystem events; and the other way, an upload's bytes sent as frames, with
//! the error of a source that failed kept for the caller.

use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use sandcove_core::wire::body::PullEvent;
use sandcove_core::wire::{frame, PID_HEADER, UPLOAD_CLEANUP_WAIT};
use sandcove_core::{
    ByteStream, Error, ErrorBody, FsEvent, ImagePullProgress, ImageSummary, ProcessEvent,
    ProcessStream, Result, WatchStream,
};

use crate::transport::error_chain;
use crate::HttpBackend;

impl HttpBackend {
    pub(crate) async fn process_stream(
        &self,
        response: reqwest::Response,
    ) -> Result<ProcessStream> {
        let pid = response
            .headers()
            .get(PID_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u32>().ok())
            .ok_or_else(|| {
                Error::backend(format!("process stream without a {PID_HEADER} header"))
            })?;
        Ok(ProcessStream {
            pid,
            events: Box::pin(process_events(frames(response))),
        })
    }
}

/// One decoded frame, or the reason the body broke off.
type Frame = Result<(u8, Vec<u8>)>;

/// The frames of a streamed response. A transport failure, or a body ending inside a frame,
/// yields an error item; a clean end of body just ends the stream (the caller knows whether
/// its terminal frame came).
pub(crate) fn frames(response: reqwest::Response) -> impl Stream<Item = Frame> + Send {
    frames_within(response, frame::MAX_PAYLOAD)
}

/// [`frames`] refusing any frame over `max_payload` bytes (an error item ends the stream).
pub(crate) fn frames_within(
    response: reqwest::Response,
    max_payload: usize,
) -> impl Stream<Item = Frame> + Send {
    struct State<S> {
        body: S,
        decoder: frame::Decoder,
        done: bool,
    }
    let state = State {
        body: Box::pin(response.bytes_stream()),
        decoder: frame::Decoder::with_max_payload(max_payload),
        done: false,
    };
    futures::stream::unfold(state, |mut st| async move {
        if st.done {
            return None;
        }
        loop {
            match st.decoder.next_frame() {
                Ok(Some(f)) => return Some((Ok(f), st)),
                Ok(None) => {}
                Err(e) => {
                    st.done = true;
                    return Some((Err(Error::backend(format!("bad frame stream: {e}"))), st));
                }
            }
            match st.body.next().await {
                Some(Ok(chunk)) => st.decoder.push(&chunk),
                Some(Err(e)) => {
                    st.done = true;
                    return Some((Err(cut(&format!(": {}", error_chain(&e)))), st));
                }
                None => {
                    st.done = true;
                    if st.decoder.pending() > 0 {
                        return Some((Err(cut(" inside a frame")), st));
                    }
                    return None;
                }
            }
        }
    })
}

fn cut(how: &str) -> Error {
    Error::Backend {
        message: format!("stream from the server was cut{how}"),
        retryable: true,
    }
}

fn frame_error(payload: &[u8]) -> Error {
    match serde_json::from_slice::<ErrorBody>(payload) {
        Ok(body) => Error::from_body(&body),
        Err(e) => Error::backend(format!("undecodable error frame: {e}")),
    }
}

/// Frames → process events, ending after `Exit`; anything else ends with an error.
fn process_events(
    frames: impl Stream<Item = Frame> + Send + 'static,
) -> impl Stream<Item = Result<ProcessEvent>> + Send {
    let frames = Box::pin(frames);
    futures::stream::unfold(Some(frames), |state| async move {
        let mut frames = state?;
        let item = match frames.next().await {
            None => Err(cut(" before the process exited")),
            Some(Err(e)) => Err(e),
            Some(Ok((frame::STDOUT, bytes))) => Ok(ProcessEvent::Stdout(bytes)),
            Some(Ok((frame::STDERR, bytes))) => Ok(ProcessEvent::Stderr(bytes)),
            Some(Ok((frame::JSON, json))) => serde_json::from_slice::<ProcessEvent>(&json)
                .map_err(|e| Error::backend(format!("undecodable process event: {e}"))),
            Some(Ok((frame::ERROR, body))) => Err(frame_error(&body)),
            Some(Ok((kind, _))) => Err(Error::backend(format!(
                "unexpected frame {:?} in a process stream",
                kind as char
            ))),
        };
        let next = match &item {
            Ok(ProcessEvent::Exit(_)) | Err(_) => None,
            Ok(_) => Some(frames),
        };
        Some((item, next))
    })
}

/// Frames → file chunks, ending at the end frame; anything else ends with an error.
pub(crate) fn download(frames: impl Stream<Item = Frame> + Send + 'static) -> ByteStream {
    let frames = Box::pin(frames);
    Box::pin(futures::stream::unfold(Some(frames), |state| async move {
        let mut frames = state?;
        match frames.next().await {
            None => Some((Err(cut(" before the end of the file")), None)),
            Some(Err(e)) => Some((Err(e), None)),
            Some(Ok((frame::DATA, bytes))) => Some((Ok(bytes), Some(frames))),
            Some(Ok((frame::END, _))) => None,
            Some(Ok((frame::ERROR, body))) => Some((Err(frame_error(&body)), None)),
            Some(Ok((kind, _))) => Some((
                Err(Error::backend(format!(
                    "unexpected frame {:?} in a download",
                    kind as char
                ))),
                None,
            )),
        }
    }))
}

/// Frames → filesystem events; a stream ending without the end frame ends with an error.
pub(crate) fn watch_events(frames: impl Stream<Item = Frame> + Send + 'static) -> WatchStream {
    let frames = Box::pin(frames);
    Box::pin(futures::stream::unfold(Some(frames), |state| async move {
        let mut frames = state?;
        match frames.next().await {
            None => Some((Err(cut(" while watching")), None)),
            Some(Err(e)) => Some((Err(e), None)),
            Some(Ok((frame::JSON, json))) => match serde_json::from_slice::<FsEvent>(&json) {
                Ok(ev) => Some((Ok(ev), Some(frames))),
                Err(e) => Some((
                    Err(Error::backend(format!("undecodable watch event: {e}"))),
                    None,
                )),
            },
            Some(Ok((frame::END, _))) => None,
            Some(Ok((frame::ERROR, body))) => Some((Err(frame_error(&body)), None)),
            Some(Ok((kind, _))) => Some((
                Err(Error::backend(format!(
                    "unexpected frame {:?} in a watch",
                    kind as char
                ))),
                None,
            )),
        }
    }))
}

/// The largest frame of an image pull's stream: one progress report or the pulled image's
/// summary (a server sending more is broken, and is not buffered for).
const MAX_PULL_EVENT: usize = 64 * 1024;

/// Reads an image pull's frame stream (see `sandcove_core::wire::body::PullEvent`): each
/// progress report goes to `progress`; the stream's `pulled` event is the answer. An error
/// frame, an oversized or undecodable frame, or a stream that ends before `pulled` is an
/// error.
pub(crate) async fn pull_events(
    response: reqwest::Response,
    progress: &(dyn Fn(ImagePullProgress) + Send + Sync),
) -> Result<ImageSummary> {
    let mut frames = Box::pin(frames_within(response, MAX_PULL_EVENT));
    loop {
        match frames.next().await {
            None => return Err(cut(" before the image was stored")),
            Some(Err(e)) => return Err(e),
            Some(Ok((frame::JSON, json))) => match serde_json::from_slice::<PullEvent>(&json) {
                Ok(PullEvent::Progress(report)) => progress(report),
                Ok(PullEvent::Pulled(image)) => return Ok(image),
                Err(e) => return Err(Error::backend(format!("undecodable pull event: {e}"))),
            },
            Some(Ok((frame::ERROR, body))) => return Err(frame_error(&body)),
            Some(Ok((kind, _))) => {
                return Err(Error::backend(format!(
                    "unexpected frame {:?} in an image pull",
                    kind as char
                )))
            }
        }
    }
}

/// The error of an upload's source stream, kept for the caller while the body carries an
/// abandon frame to the server.
#[derive(Default)]
pub(crate) struct Abandon {
    error: std::sync::Mutex<Option<Error>>,
    failed: tokio::sync::Notify,
}

impl Abandon {
    fn set(&self, error: Error) {
        *self.error.lock().unwrap_or_else(|e| e.into_inner()) = Some(error);
        self.failed.notify_one();
    }

    pub(crate) fn take(&self) -> Option<Error> {
        self.error.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// Completes a bounded while after the source failed: the server answers an abandoned
    /// upload within [`UPLOAD_CLEANUP_WAIT`]; the margin covers the answer's transit.
    pub(crate) async fn deadline(&self) {
        self.failed.notified().await;
        tokio::time::sleep(UPLOAD_CLEANUP_WAIT + Duration::from_secs(5)).await;
    }
}

/// The upload body: the source's bytes as `d` frames, then `x`; or, when the source fails,
/// `!` with its error (kept in `abandon`) and the end of the body.
pub(crate) fn upload_frames(
    data: ByteStream,
    abandon: Arc<Abandon>,
) -> impl Stream<Item = std::result::Result<bytes::Bytes, std::convert::Infallible>> + Send + 'static
{
    futures::stream::unfold(Some(data), move |data| {
        let abandon = abandon.clone();
        async move {
            let mut data = data?;
            let pieces: Vec<bytes::Bytes> = match data.next().await {
                None => return Some((vec![frame::encode(frame::END, b"").into()], None)),
                Some(Err(e)) => {
                    let body = serde_json::to_vec(&e.to_body()).expect("an ErrorBody serialises");
                    abandon.set(e);
                    return Some((vec![frame::encode(frame::ERROR, &body).into()], None));
                }
                // A chunk crosses without a copy: each frame's head, then its share of the
                // bytes (a chunk larger than a frame, such as a whole file, is sliced).
                Some(Ok(bytes)) => {
                    let bytes = bytes::Bytes::from(bytes);
                    let mut pieces = Vec::new();
                    let mut at = 0;
                    while at < bytes.len() {
                        let end = bytes.len().min(at + frame::UPLOAD_MAX_PAYLOAD);
                        let head = frame::head(frame::DATA, end - at);
                        pieces.push(bytes::Bytes::copy_from_slice(&head));
                        pieces.push(bytes.slice(at..end));
                        at = end;
                    }
                    pieces
                }
            };
            Some((pieces, Some(data)))
        }
    })
    .flat_map(|pieces| futures::stream::iter(pieces.into_iter().map(Ok)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chunk larger than an upload frame (a whole file handed over at once) is sent as
    /// frames within the server's bound, slices of the caller's buffer, in order.
    #[tokio::test]
    async fn a_large_chunk_is_sent_as_bounded_frames_in_order() {
        let big: Vec<u8> = (0..(5 * frame::UPLOAD_MAX_PAYLOAD / 2))
            .map(|i| (i % 251) as u8)
            .collect();
        let chunks = vec![big.clone(), b"tail".to_vec(), Vec::new()];
        let data: ByteStream = Box::pin(futures::stream::iter(chunks.into_iter().map(Ok)));
        let pieces: Vec<bytes::Bytes> = upload_frames(data, Arc::new(Abandon::default()))
            .map(|p| p.unwrap())
            .collect()
            .await;
        let mut decoder = frame::Decoder::with_max_payload(frame::UPLOAD_MAX_PAYLOAD);
        for piece in &pieces {
            decoder.push(piece);
        }
        let mut sent = Vec::new();
        let mut kinds = Vec::new();
        while let Some((kind, payload)) = decoder.next_frame().unwrap() {
            assert!(payload.len() <= frame::UPLOAD_MAX_PAYLOAD);
            kinds.push(kind);
            sent.extend_from_slice(&payload);
        }
        assert_eq!(kinds.last(), Some(&frame::END));
        assert_eq!(kinds.iter().filter(|k| **k == frame::DATA).count(), 4);
        let mut expected = big;
        expected.extend_from_slice(b"tail");
        assert_eq!(sent, expected);
    }

    #[test]
    fn frames_survive_any_chunking() {
        let mut wire = frame::encode(frame::STDOUT, &[0, 0xff, 1]);
        wire.extend(frame::encode(frame::JSON, b"{}"));
        wire.extend(frame::encode(frame::END, b""));
        for split in 1..wire.len() {
            let mut d = frame::Decoder::default();
            let mut got = Vec::new();
            for chunk in wire.chunks(split) {
                d.push(chunk);
                while let Some(f) = d.next_frame().unwrap() {
                    got.push(f);
                }
            }
            assert_eq!(
                got,
                [
                    (frame::STDOUT, vec![0, 0xff, 1]),
                    (frame::JSON, b"{}".to_vec()),
                    (frame::END, vec![])
                ]
            );
            assert_eq!(d.pending(), 0);
        }
        let mut d = frame::Decoder::default();
        d.push(&[frame::DATA, 0xff, 0xff, 0xff, 0xff]);
        assert!(d.next_frame().is_err(), "oversized frames are refused");
    }
}
