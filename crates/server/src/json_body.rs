//! JSON request bodies, decoded the same way by the native API and every vendor router:
//! a bound on the size, an empty body read as `{}`, and only a JSON object accepted.
//!
//! The routers differ only in how a refusal looks on their wire, so each maps a
//! [`JsonBodyError`] to its vendor's error shape, and nothing else about decoding a body is
//! decided twice.
//!
//! An object is required because serde accepts a struct in its array form too (`[1, "x"]`
//! for `{ "a": 1, "b": "x" }`): no SDK sends that, and accepting it would make a body's
//! meaning depend on the order of a struct's fields.

use serde::de::DeserializeOwned;

/// Why a JSON body was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JsonBodyError {
    /// The body is larger than the route takes (`413`).
    #[error("the request body is larger than {limit} bytes")]
    TooLarge {
        /// The most the route takes, in bytes.
        limit: usize,
    },
    /// The body is not JSON, not an object, or not the object the route takes (`400`).
    #[error("invalid request body: {0}")]
    Malformed(String),
}

impl JsonBodyError {
    /// The HTTP status every router answers this refusal with.
    pub fn status(&self) -> u16 {
        match self {
            JsonBodyError::TooLarge { .. } => 413,
            JsonBodyError::Malformed(_) => 400,
        }
    }
}

/// Decode `body` (at most `limit` bytes; empty or only whitespace reads as `{}`) as a JSON
/// object into `T`.
pub fn decode<T: DeserializeOwned>(body: &[u8], limit: usize) -> Result<T, JsonBodyError> {
    if body.len() > limit {
        return Err(JsonBodyError::TooLarge { limit });
    }
    let text: &[u8] = if body.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        body
    };
    let value: serde_json::Value =
        serde_json::from_slice(text).map_err(|e| JsonBodyError::Malformed(e.to_string()))?;
    if !value.is_object() {
        return Err(JsonBodyError::Malformed("expected a JSON object".into()));
    }
    serde_json::from_value(value).map_err(|e| JsonBodyError::Malformed(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize, PartialEq)]
    struct Body {
        #[serde(default)]
        a: u32,
        #[serde(default)]
        b: String,
    }

    #[test]
    fn an_empty_body_is_the_empty_object() {
        assert_eq!(
            decode::<Body>(b"", 10).unwrap(),
            decode(b" \n", 10).unwrap()
        );
        assert_eq!(
            decode::<Body>(b"", 10).unwrap(),
            Body {
                a: 0,
                b: String::new()
            }
        );
    }

    #[test]
    fn an_object_decodes_and_the_array_form_is_refused() {
        let body: Body = decode(br#"{"a":1,"b":"x"}"#, 100).unwrap();
        assert_eq!((body.a, body.b.as_str()), (1, "x"));
        let refused = decode::<Body>(br#"[1,"x"]"#, 100).unwrap_err();
        assert_eq!(refused.status(), 400, "{refused}");
        let refused = decode::<serde_json::Value>(b"3", 100).unwrap_err();
        assert!(matches!(refused, JsonBodyError::Malformed(_)), "{refused}");
    }

    #[test]
    fn a_body_past_the_limit_is_413_before_it_is_parsed() {
        let refused = decode::<Body>(br#"{"a":1}"#, 6).unwrap_err();
        assert_eq!(refused, JsonBodyError::TooLarge { limit: 6 });
        assert_eq!(refused.status(), 413);
        assert!(decode::<Body>(br#"{"a":1}"#, 7).is_ok());
    }

    #[test]
    fn malformed_json_is_400_with_serdes_reason() {
        let refused = decode::<Body>(b"{", 100).unwrap_err();
        assert_eq!(refused.status(), 400);
        assert!(refused.to_string().starts_with("invalid request body: "));
    }
}
