//! Comparing secrets: the one constant-time comparison every credential check uses (the
//! server's key, E2B's tokens and signatures, preview tokens, the in-pod agent's token).

/// Whether a presented secret equals the expected one, in time that depends only on the
/// expected secret's length (never on where the bytes differ). An empty expected secret
/// matches nothing, so an unset key can never be "presented".
pub fn secrets_match(presented: &[u8], expected: &[u8]) -> bool {
    if expected.is_empty() {
        return false;
    }
    let mut diff = (presented.len() != expected.len()) as u8;
    for (i, e) in expected.iter().enumerate() {
        let p = presented.get(i).copied().unwrap_or(0);
        diff |= p ^ e;
    }
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_match_in_full_only() {
        assert!(secrets_match(b"secret", b"secret"));
        assert!(!secrets_match(b"secreT", b"secret"));
        assert!(!secrets_match(b"secre", b"secret"));
        assert!(!secrets_match(b"secret!", b"secret"));
        assert!(!secrets_match(b"", b""));
        assert!(!secrets_match(b"x", b""));
    }
}
