//! What the three vendor facades (`compat-e2b`, `compat-daytona`, `compat-blaxel`) share, so
//! each rule lives in one place:
//!
//! - [`Gap`]: one refused vendor feature with its alternative, and [`gap::check_mapping`], the
//!   test that a facade's gap table and its MAPPING.md section list the same rows;
//! - [`OptionalString`]: the argument type of an optional string keyword (MIRRORING.md rule 3);
//! - [`dates`]: the vendors' date formats, on the `time` crate;
//! - [`shell`]: POSIX shell quoting, on `shell-escape`;
//! - [`Seconds`]: a seconds keyword as Python takes it (`int`, `float` or `None`), and
//!   [`awaitable!`]: a builder awaited directly (`IntoFuture` over its `async fn run`);
//! - [`multipart`]: the wire listeners' `multipart/form-data` uploads, streamed part by part
//!   on `multer` under one server-wide memory budget (and the answers' multipart framing).
#![forbid(unsafe_code)]

pub mod dates;
pub mod gap;
pub mod multipart;
pub mod shell;

pub use gap::Gap;

/// A string keyword Python also accepts as `None`: `&str`, `String`, `&String`, or
/// `Option<String>`, so `.cwd("/tmp")`, `.cwd(dir)` and `.cwd(None)` all read like the Python
/// call. (There is deliberately no `Option<&str>` form: it would make a bare `None` ambiguous.)
pub trait OptionalString {
    /// The value as `Option<String>`.
    fn into_optional(self) -> Option<String>;
}

impl OptionalString for &str {
    fn into_optional(self) -> Option<String> {
        Some(self.to_string())
    }
}

impl OptionalString for String {
    fn into_optional(self) -> Option<String> {
        Some(self)
    }
}

impl OptionalString for &String {
    fn into_optional(self) -> Option<String> {
        Some(self.clone())
    }
}

impl OptionalString for Option<String> {
    fn into_optional(self) -> Option<String> {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::OptionalString;

    #[test]
    fn every_form_reads_like_the_python_keyword() {
        assert_eq!("a".into_optional(), Some("a".to_string()));
        assert_eq!(String::from("b").into_optional(), Some("b".to_string()));
        assert_eq!((&String::from("c")).into_optional(), Some("c".to_string()));
        assert_eq!(None::<String>.into_optional(), None);
    }
}

/// A number of seconds as Python takes it (`int` or `float`), or `None`:
/// `.timeout(30)`, `.timeout(2.5)` and `.timeout(None)` all read like the Python call.
pub trait Seconds {
    /// The value in seconds; `None` when absent.
    fn into_seconds(self) -> Option<f64>;
}

macro_rules! seconds_from {
    ($($t:ty),*) => {$(
        impl Seconds for $t {
            fn into_seconds(self) -> Option<f64> {
                Some(self as f64)
            }
        }
    )*};
}
seconds_from!(i32, i64, u32, u64, f32, f64);

// Only `Option<f64>`: a second `Option` form would make Python's bare `None` ambiguous.
impl Seconds for Option<f64> {
    fn into_seconds(self) -> Option<f64> {
        self
    }
}

/// Make a builder awaitable: `impl IntoFuture` boxing its `async fn run(self)`, whose
/// output is `$out`. `awaitable!(Builder => Result<T>)`, or for a builder that borrows,
/// `awaitable!(Builder<'a> => Result<T>)`.
#[macro_export]
macro_rules! awaitable {
    ($builder:ident<$lt:lifetime> => $out:ty) => {
        impl<$lt> ::std::future::IntoFuture for $builder<$lt> {
            type Output = $out;
            type IntoFuture = ::std::pin::Pin<
                ::std::boxed::Box<
                    dyn ::std::future::Future<Output = $out> + ::std::marker::Send + $lt,
                >,
            >;
            fn into_future(self) -> Self::IntoFuture {
                ::std::boxed::Box::pin(self.run())
            }
        }
    };
    ($builder:ty => $out:ty) => {
        impl ::std::future::IntoFuture for $builder {
            type Output = $out;
            type IntoFuture = ::std::pin::Pin<
                ::std::boxed::Box<dyn ::std::future::Future<Output = $out> + ::std::marker::Send>,
            >;
            fn into_future(self) -> Self::IntoFuture {
                ::std::boxed::Box::pin(self.run())
            }
        }
    };
}
