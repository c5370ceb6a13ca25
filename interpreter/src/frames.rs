//! The driver's frames: pure parsing of what the driver writes on its stdout.
//!
//! Every frame is one line `<token> <json>`, where the token is the random value the host chose
//! for the run being read. Lines are cut at `\n`, each at most [`MAX_FRAME_BYTES`]; a longer
//! line is dropped as it streams past (never accumulated), and a line without the current
//! token is ignored whatever it contains.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde::Deserialize;

use crate::{CellError, CellResult, Event, OutputChunk};

/// Longest frame line the host keeps in memory; longer lines are dropped as they stream past.
pub const MAX_FRAME_BYTES: usize = 4 << 20;

/// Cuts a byte stream into lines of at most [`MAX_FRAME_BYTES`].
#[derive(Debug, Default)]
pub(crate) struct LineBuffer {
    buf: Vec<u8>,
    /// Inside a line that grew past the limit: skip to its end.
    discarding: bool,
}

impl LineBuffer {
    /// Add bytes; complete lines (without their `\n`) are appended to `out`.
    pub(crate) fn push(&mut self, mut bytes: &[u8], out: &mut Vec<Vec<u8>>) {
        while !bytes.is_empty() {
            let (part, rest, ended) = match bytes.iter().position(|b| *b == b'\n') {
                Some(i) => (&bytes[..i], &bytes[i + 1..], true),
                None => (bytes, &[][..], false),
            };
            bytes = rest;
            if !self.discarding {
                if self.buf.len() + part.len() > MAX_FRAME_BYTES {
                    self.buf = Vec::new();
                    self.discarding = true;
                } else {
                    self.buf.extend_from_slice(part);
                }
            }
            if ended {
                if !self.discarding && !self.buf.is_empty() {
                    out.push(std::mem::take(&mut self.buf));
                }
                self.discarding = false;
            }
        }
    }

    /// Bytes held for the current unfinished line.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.buf.len()
    }
}

/// A frame of the run being read.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Frame {
    /// The driver began executing the run.
    Start,
    /// The run was dropped from the driver's queue before it started (after a cancel).
    Cancelled,
    /// Something the run produced.
    Event(Event),
}

#[derive(Deserialize)]
#[serde(tag = "t", rename_all = "lowercase")]
enum Raw {
    Start,
    Cancelled,
    Stdout {
        data: String,
        ts: Option<i64>,
    },
    Stderr {
        data: String,
        ts: Option<i64>,
    },
    Result {
        data: BTreeMap<String, serde_json::Value>,
        main: bool,
    },
    Error {
        name: String,
        value: String,
        traceback: String,
    },
    Count {
        n: u64,
    },
    End,
}

/// The frame a line carries for the run with `token`, or `None` when the line is not a
/// well-formed frame of that run.
pub(crate) fn parse(line: &[u8], token: &str) -> Option<Frame> {
    let body = line.strip_prefix(token.as_bytes())?.strip_prefix(b" ")?;
    let raw: Raw = serde_json::from_slice(body).ok()?;
    let chunk = |data: String, ts: Option<i64>| -> Option<OutputChunk> {
        let data = base64::engine::general_purpose::STANDARD
            .decode(data.as_bytes())
            .ok()?;
        Some(OutputChunk {
            data,
            timestamp_ns: ts,
        })
    };
    Some(match raw {
        Raw::Start => Frame::Start,
        Raw::Cancelled => Frame::Cancelled,
        Raw::Stdout { data, ts } => Frame::Event(Event::Stdout(chunk(data, ts)?)),
        Raw::Stderr { data, ts } => Frame::Event(Event::Stderr(chunk(data, ts)?)),
        Raw::Result { data, main } => Frame::Event(Event::Result(CellResult {
            data,
            is_main_result: main,
        })),
        Raw::Error {
            name,
            value,
            traceback,
        } => Frame::Event(Event::Error(CellError {
            name,
            value,
            traceback,
        })),
        Raw::Count { n } => Frame::Event(Event::ExecutionCount(n)),
        Raw::End => Frame::Event(Event::End),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(chunks: &[&[u8]]) -> (Vec<Vec<u8>>, LineBuffer) {
        let mut buf = LineBuffer::default();
        let mut out = Vec::new();
        for c in chunks {
            buf.push(c, &mut out);
        }
        (out, buf)
    }

    #[test]
    fn lines_are_cut_at_newlines_across_chunks() {
        let (out, buf) = lines(&[b"\nab", b"c\nd", b"\n\nef"]);
        assert_eq!(out, [b"abc".to_vec(), b"d".to_vec()]);
        assert_eq!(buf.held(), 2);
    }

    #[test]
    fn an_overlong_line_is_dropped_without_being_held() {
        let big = vec![b'x'; 1 << 20];
        let mut buf = LineBuffer::default();
        let mut out = Vec::new();
        for _ in 0..12 {
            buf.push(&big, &mut out);
            assert!(buf.held() <= MAX_FRAME_BYTES, "held {}", buf.held());
        }
        buf.push(b"tail\nnext\n", &mut out);
        assert_eq!(out, [b"next".to_vec()], "the overlong line is gone whole");
        assert_eq!(buf.held(), 0);
    }

    #[test]
    fn only_the_current_token_parses() {
        let line = br#"abc {"t":"count","n":3}"#;
        assert_eq!(
            parse(line, "abc"),
            Some(Frame::Event(Event::ExecutionCount(3)))
        );
        assert_eq!(parse(line, "abd"), None);
        assert_eq!(parse(line, "ab"), None, "a prefix of the token is not it");
        assert_eq!(parse(br#"abc {"t":"count"}"#, "abc"), None);
        assert_eq!(parse(br#"abc {"t":"stdout","data":"%%"}"#, "abc"), None);
        assert_eq!(
            parse(br#"abc {"t":"stdout","data":"/w==","ts":5}"#, "abc"),
            Some(Frame::Event(Event::Stdout(OutputChunk {
                data: vec![0xff],
                timestamp_ns: Some(5)
            })))
        );
    }
}
