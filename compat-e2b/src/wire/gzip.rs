//! Bounded gzip decoding of uploads sent with `Content-Encoding: gzip` (the SDKs'
//! `files.write(..., gzip=True)`): the decoded bytes count against the same limit as a plain
//! upload, checked while decoding, so a small body that inflates without end (a gzip bomb)
//! stops at the limit instead of filling memory.

use std::io::Write;

use flate2::write::MultiGzDecoder;

/// Input fed to the decoder at a time: DEFLATE inflates at most about 1032:1, so the output
/// held between two limit checks (and handed on at once by [`gunzip_stream`]) stays near
/// 256 KiB.
const PIECE: usize = 256;

/// A gzip decoder that fails once more than `limit` bytes have come out.
pub(crate) struct Gunzip {
    decoder: MultiGzDecoder<Vec<u8>>,
    produced: u64,
    limit: u64,
    saw_input: bool,
}

impl Gunzip {
    /// A decoder allowing `limit` decoded bytes.
    pub(crate) fn new(limit: u64) -> Self {
        Gunzip {
            decoder: MultiGzDecoder::new(Vec::new()),
            produced: 0,
            limit,
            saw_input: false,
        }
    }

    fn take(&mut self) -> Result<Vec<u8>, String> {
        let out = std::mem::take(self.decoder.get_mut());
        self.produced += out.len() as u64;
        if self.produced > self.limit {
            return Err(format!(
                "the upload is larger than {} bytes once decompressed",
                self.limit
            ));
        }
        Ok(out)
    }

    /// Decode `input`; the bytes it completes (all of them: callers holding a large input
    /// feed it in pieces, as [`gunzip_stream`] does).
    pub(crate) fn push(&mut self, input: &[u8]) -> Result<Vec<u8>, String> {
        self.saw_input |= !input.is_empty();
        let mut out = Vec::new();
        for piece in input.chunks(PIECE) {
            self.decoder
                .write_all(piece)
                .map_err(|e| format!("invalid gzip data: {e}"))?;
            out.extend_from_slice(&self.take()?);
        }
        Ok(out)
    }

    /// The input ended: the last bytes, or an error when the gzip stream was cut short (its
    /// trailer, with the checksum, must be there).
    pub(crate) fn finish(mut self) -> Result<Vec<u8>, String> {
        self.decoder
            .try_finish()
            .map_err(|e| format!("invalid gzip data: {e}"))?;
        // Even an empty file compresses to a header and a trailer: a gzip upload without a
        // single byte is malformed.
        if !self.saw_input {
            return Err("invalid gzip data: the body is empty".to_string());
        }
        self.take()
    }
}

/// `raw` (gzip bytes) decoded as it arrives, at most `limit` decoded bytes, each item the
/// output of one piece of input (about 256 KiB at most, however far a chunk inflates); a
/// stream cut short or malformed ends with an error made by `error`, so nothing partial is
/// kept.
pub(crate) fn gunzip_stream<E>(
    raw: impl futures::Stream<Item = Result<axum::body::Bytes, E>> + Send + 'static,
    limit: u64,
    error: fn(String) -> E,
) -> impl futures::Stream<Item = Result<axum::body::Bytes, E>> + Send + 'static
where
    E: Send + 'static,
{
    use futures::StreamExt;
    struct State<S> {
        raw: std::pin::Pin<Box<S>>,
        decoder: Gunzip,
        pending: axum::body::Bytes,
    }
    let start = State {
        raw: Box::pin(raw),
        decoder: Gunzip::new(limit),
        pending: axum::body::Bytes::new(),
    };
    futures::stream::unfold(Some(start), move |state| async move {
        let mut state = state?;
        loop {
            if !state.pending.is_empty() {
                let piece = state.pending.split_to(state.pending.len().min(PIECE));
                match state.decoder.push(&piece) {
                    Ok(out) if out.is_empty() => continue,
                    Ok(out) => return Some((Ok(axum::body::Bytes::from(out)), Some(state))),
                    Err(why) => return Some((Err(error(why)), None)),
                }
            }
            match state.raw.next().await {
                Some(Ok(chunk)) => state.pending = chunk,
                Some(Err(e)) => return Some((Err(e), None)),
                None => {
                    return match state.decoder.finish() {
                        Ok(last) if last.is_empty() => None,
                        Ok(last) => Some((Ok(axum::body::Bytes::from(last)), None)),
                        Err(why) => Some((Err(error(why)), None)),
                    }
                }
            }
        }
    })
}

/// Decode a whole gzip body (at most `limit` decoded bytes).
#[cfg(test)]
fn gunzip_all(body: &[u8], limit: u64) -> Result<Vec<u8>, String> {
    let mut decoder = Gunzip::new(limit);
    let mut out = decoder.push(body)?;
    out.extend_from_slice(&decoder.finish()?);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::write::GzEncoder;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn decodes_within_the_limit_and_checks_the_trailer() {
        let data = b"hello gzip ".repeat(1000);
        let packed = gzip(&data);
        assert_eq!(gunzip_all(&packed, data.len() as u64).unwrap(), data);
        // Fed in odd-sized chunks, the same bytes come out.
        let mut d = Gunzip::new(1 << 20);
        let mut out = Vec::new();
        for chunk in packed.chunks(7) {
            out.extend(d.push(chunk).unwrap());
        }
        out.extend(d.finish().unwrap());
        assert_eq!(out, data);
        // Cut short (no trailer), not gzip at all, empty: errors.
        assert!(gunzip_all(&packed[..packed.len() - 4], 1 << 20).is_err());
        assert!(gunzip_all(b"plain text, not gzip", 1 << 20).is_err());
        assert!(gunzip_all(b"", 1 << 20).is_err());
    }

    /// However far one chunk of input inflates, the stream hands the output on in pieces
    /// of about 256 KiB at most, and stops at the limit.
    #[tokio::test]
    async fn the_stream_holds_little_at_a_time() {
        use futures::StreamExt;
        let packed = gzip(&vec![0u8; 16 << 20]);
        let raw = futures::stream::iter([Ok::<_, String>(axum::body::Bytes::from(packed))]);
        let mut decoded = Box::pin(gunzip_stream(raw, 16 << 20, |why| why));
        let (mut total, mut largest) = (0, 0);
        while let Some(piece) = decoded.next().await {
            let piece = piece.unwrap();
            total += piece.len();
            largest = largest.max(piece.len());
        }
        assert_eq!(total, 16 << 20);
        assert!(largest <= 300 * 1024, "{largest}");
        let packed = gzip(&vec![0u8; 4 << 20]);
        let raw = futures::stream::iter([Ok::<_, String>(axum::body::Bytes::from(packed))]);
        let ends: Vec<_> = gunzip_stream(raw, 1 << 20, |why| why).collect().await;
        let err = ends.last().unwrap().as_ref().unwrap_err();
        assert!(err.contains("larger than 1048576 bytes"), "{err}");
    }

    #[test]
    fn a_bomb_stops_at_the_limit() {
        // 16 MiB of zeros packs into about 16 KiB.
        let packed = gzip(&vec![0u8; 16 << 20]);
        assert!(packed.len() < 64 << 10);
        let err = gunzip_all(&packed, 1 << 20).unwrap_err();
        assert!(err.contains("larger than 1048576 bytes"), "{err}");
    }
}
