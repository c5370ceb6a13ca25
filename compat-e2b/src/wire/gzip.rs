//! Bounded gzip decoding of uploads sent with `Content-Encoding: gzip` (the SDKs'
//! `files.write(..., gzip=True)`): the decoded bytes count against the same limit as a plain
//! upload, checked while decoding, so a small body that inflates without end (a gzip bomb)
//! stops at the limit instead of filling memory.

use std::io::Write;

use flate2::write::MultiGzDecoder;

/// Input fed to the decoder at a time: DEFLATE inflates at most about 1032:1, so the output
/// held between two limit checks stays near 1 MiB.
const PIECE: usize = 1024;

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

    /// Decode `input`; the bytes it completes.
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

/// Decode a whole gzip body (at most `limit` decoded bytes).
pub(crate) fn gunzip_all(body: &[u8], limit: u64) -> Result<Vec<u8>, String> {
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

    #[test]
    fn a_bomb_stops_at_the_limit() {
        // 16 MiB of zeros packs into about 16 KiB.
        let packed = gzip(&vec![0u8; 16 << 20]);
        assert!(packed.len() < 64 << 10);
        let err = gunzip_all(&packed, 1 << 20).unwrap_err();
        assert!(err.contains("larger than 1048576 bytes"), "{err}");
    }
}
