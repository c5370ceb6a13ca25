//! The conformance suite (filled below).
