//! POSIX shell quoting for command lines the facades build from vendor arguments.

/// `word` quoted for a POSIX shell, so the shell passes it through as exactly one argument.
pub fn quote(word: &str) -> String {
    shell_escape::unix::escape(word.into()).into_owned()
}

#[cfg(test)]
mod tests {
    use super::quote;

    #[test]
    fn quoted_words_survive_the_shell() {
        for word in ["plain", "", "it's", "a b", "$(x)", "`y`", "*", "\\", "\n"] {
            let out = std::process::Command::new("sh")
                .arg("-c")
                .arg(format!("printf %s {}", quote(word)))
                .output()
                .expect("sh runs");
            assert_eq!(String::from_utf8_lossy(&out.stdout), word, "{word:?}");
        }
    }
}
