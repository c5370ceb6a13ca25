//! The server's TLS certificate, refused by this client's verifier (rustls with webpki), named
//! in one line with its fix. Without this, a user sees a debug dump such as
//! `invalid peer certificate: Other(OtherError(CaUsedAsEndEntity))`, which names neither the
//! certificate's mistake nor the command that repairs it.

use sandcove_core::Error;

use crate::CA_FILE_ENV;

/// What is wrong with the server's certificate, as this client's verifier saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CertificateProblem {
    /// The server presents a CA certificate (basicConstraints `CA:TRUE`) as its own, as the
    /// usual self-signed `openssl req -x509` recipe makes.
    CaUsedAsEndEntity,
    /// The certificate does not name the host the client dialled.
    NameMismatch {
        /// The host in the URL.
        expected: String,
        /// The names the certificate carries (its subjectAltName entries).
        presented: Vec<String>,
    },
    /// The certificate's validity has ended.
    Expired {
        /// When it ended, ms since the epoch, when the verifier said.
        not_after: Option<u64>,
    },
    /// The certificate's validity has not started (often a wrong clock).
    NotYetValid {
        /// When it starts, ms since the epoch, when the verifier said.
        not_before: Option<u64>,
    },
    /// No trusted CA signed it (a private CA this client was not given).
    UnknownIssuer,
    /// The certificate is not for TLS servers (its extendedKeyUsage lacks serverAuth).
    NotForServers,
    /// Any other refusal, in the verifier's words.
    Other {
        /// What the verifier said.
        detail: String,
    },
}

impl std::fmt::Display for CertificateProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CertificateProblem::CaUsedAsEndEntity => f.write_str(
                "is a CA certificate (basicConstraints CA:TRUE), which TLS clients refuse as a \
                 server's own certificate",
            ),
            CertificateProblem::NameMismatch {
                expected,
                presented,
            } if presented.is_empty() => write!(
                f,
                "is not valid for {expected}: it names no host (no subjectAltName)"
            ),
            CertificateProblem::NameMismatch {
                expected,
                presented,
            } => write!(
                f,
                "is not valid for {expected}: it names only {}",
                presented.join(", ")
            ),
            CertificateProblem::Expired {
                not_after: Some(ms),
            } => write!(
                f,
                "expired at {}",
                sandcove_core::reference::format_utc(*ms)
            ),
            CertificateProblem::Expired { not_after: None } => f.write_str("has expired"),
            CertificateProblem::NotYetValid {
                not_before: Some(ms),
            } => write!(
                f,
                "is not valid before {} (is one of the clocks wrong?)",
                sandcove_core::reference::format_utc(*ms)
            ),
            CertificateProblem::NotYetValid { not_before: None } => {
                f.write_str("is not valid yet (is one of the clocks wrong?)")
            }
            CertificateProblem::UnknownIssuer => {
                f.write_str("is signed by a CA this client does not trust")
            }
            CertificateProblem::NotForServers => f.write_str(
                "is not for TLS servers (its extendedKeyUsage does not include serverAuth)",
            ),
            CertificateProblem::Other { detail } => write!(f, "was refused: {detail}"),
        }
    }
}

impl CertificateProblem {
    /// What to do about it, in one sentence.
    pub fn remedy(&self) -> String {
        match self {
            CertificateProblem::CaUsedAsEndEntity => "on the server, run `sandcove tls init` and \
                 serve the certificate it makes, or reissue yours with \
                 `basicConstraints=critical,CA:FALSE`"
                .into(),
            CertificateProblem::NameMismatch { expected, .. } => format!(
                "connect with a name the certificate lists, or reissue it for this one (on the \
                 server: `sandcove tls init --renew --host {expected}`)"
            ),
            CertificateProblem::Expired { .. } => "on the server, run `sandcove tls init \
                 --renew` (or renew your certificate) and restart `sandcove serve`"
                .into(),
            CertificateProblem::NotYetValid { .. } => {
                "set the clock of this machine or of the server right".into()
            }
            CertificateProblem::UnknownIssuer => format!(
                "set {CA_FILE_ENV} to the CA certificate that signed it (the `ca.pem` that \
                 `sandcove tls init` made on the server), or check that it holds that CA"
            ),
            CertificateProblem::NotForServers => {
                "on the server, run `sandcove tls init`, or reissue the certificate with \
                 `extendedKeyUsage=serverAuth`"
                    .into()
            }
            CertificateProblem::Other { .. } => "on the server, run `sandcove tls init` and \
                 serve the certificate it makes"
                .into(),
        }
    }

    /// The certificate problem behind `err` (a `reqwest` error, or anything whose source chain
    /// holds a rustls certificate error), if that is what failed.
    pub fn find(err: &(dyn std::error::Error + 'static)) -> Option<CertificateProblem> {
        let mut next = Some(err);
        while let Some(e) = next {
            if let Some(tls) = e.downcast_ref::<rustls::Error>() {
                return from_rustls(tls);
            }
            next = match e.downcast_ref::<std::io::Error>() {
                // `io::Error::source` skips the error it wraps (reqwest nests two io errors
                // around rustls's): descend into that one itself.
                Some(io) => io
                    .get_ref()
                    .map(|inner| inner as &(dyn std::error::Error + 'static)),
                None => e.source(),
            };
        }
        None
    }

    /// This problem with the certificate of the server at `origin`, as the client's error.
    pub fn into_error(self, origin: &str) -> Error {
        Error::Unavailable {
            reason: format!("the TLS certificate of {origin} {self}"),
            remedy: self.remedy(),
        }
    }
}

fn ms(t: rustls::pki_types::UnixTime) -> u64 {
    t.as_secs().saturating_mul(1000)
}

/// A subjectAltName entry as webpki shows it (`DnsName("localhost")`, `IpAddress(127.0.0.1)`)
/// as the name alone; anything else unchanged.
fn plain_name(shown: &str) -> String {
    shown
        .strip_prefix("DnsName(\"")
        .and_then(|rest| rest.strip_suffix("\")"))
        .or_else(|| {
            shown
                .strip_prefix("IpAddress(")
                .and_then(|rest| rest.strip_suffix(')'))
        })
        .unwrap_or(shown)
        .to_string()
}

/// The problem a rustls error names, if it is about the peer's certificate.
fn from_rustls(e: &rustls::Error) -> Option<CertificateProblem> {
    use rustls::CertificateError as C;
    let rustls::Error::InvalidCertificate(cert) = e else {
        return None;
    };
    Some(match cert {
        C::Other(other) => match other.0.downcast_ref::<webpki::Error>() {
            Some(webpki::Error::CaUsedAsEndEntity) => CertificateProblem::CaUsedAsEndEntity,
            _ => CertificateProblem::Other {
                detail: other.0.to_string(),
            },
        },
        C::NotValidForNameContext {
            expected,
            presented,
        } => CertificateProblem::NameMismatch {
            expected: expected.to_str().into_owned(),
            presented: presented.iter().map(|name| plain_name(name)).collect(),
        },
        C::NotValidForName => CertificateProblem::NameMismatch {
            expected: String::new(),
            presented: Vec::new(),
        },
        C::ExpiredContext { not_after, .. } => CertificateProblem::Expired {
            not_after: Some(ms(*not_after)),
        },
        C::Expired => CertificateProblem::Expired { not_after: None },
        C::NotValidYetContext { not_before, .. } => CertificateProblem::NotYetValid {
            not_before: Some(ms(*not_before)),
        },
        C::NotValidYet => CertificateProblem::NotYetValid { not_before: None },
        C::UnknownIssuer => CertificateProblem::UnknownIssuer,
        C::InvalidPurpose | C::InvalidPurposeContext { .. } => CertificateProblem::NotForServers,
        other => CertificateProblem::Other {
            detail: other.to_string(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::{ServerName, UnixTime};
    use rustls::CertificateError as C;
    use std::sync::Arc;
    use std::time::Duration;

    fn other(e: webpki::Error) -> rustls::Error {
        rustls::Error::InvalidCertificate(C::Other(rustls::OtherError(Arc::new(e))))
    }

    #[test]
    fn each_refusal_becomes_one_line_with_its_fix() {
        let at = |s| UnixTime::since_unix_epoch(Duration::from_secs(s));
        let cases = [
            (
                other(webpki::Error::CaUsedAsEndEntity),
                CertificateProblem::CaUsedAsEndEntity,
                "sandcove tls init",
            ),
            (
                rustls::Error::InvalidCertificate(C::NotValidForNameContext {
                    expected: ServerName::try_from("10.0.0.7").unwrap().to_owned(),
                    presented: vec![
                        "DnsName(\"localhost\")".into(),
                        "IpAddress(127.0.0.1)".into(),
                        "DirectoryName".into(),
                    ],
                }),
                CertificateProblem::NameMismatch {
                    expected: "10.0.0.7".into(),
                    presented: vec![
                        "localhost".into(),
                        "127.0.0.1".into(),
                        "DirectoryName".into(),
                    ],
                },
                "--host 10.0.0.7",
            ),
            (
                rustls::Error::InvalidCertificate(C::ExpiredContext {
                    time: at(2_000_000_000),
                    not_after: at(1_700_000_000),
                }),
                CertificateProblem::Expired {
                    not_after: Some(1_700_000_000_000),
                },
                "--renew",
            ),
            (
                rustls::Error::InvalidCertificate(C::NotValidYetContext {
                    time: at(1_700_000_000),
                    not_before: at(2_000_000_000),
                }),
                CertificateProblem::NotYetValid {
                    not_before: Some(2_000_000_000_000),
                },
                "clock",
            ),
            (
                rustls::Error::InvalidCertificate(C::UnknownIssuer),
                CertificateProblem::UnknownIssuer,
                CA_FILE_ENV,
            ),
            (
                rustls::Error::InvalidCertificate(C::InvalidPurpose),
                CertificateProblem::NotForServers,
                "serverAuth",
            ),
        ];
        for (tls, expected, fix) in cases {
            // As reqwest delivers it: in an io::Error in an io::Error down the chain.
            let wrapped = std::io::Error::other(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                tls.clone(),
            ));
            let found = CertificateProblem::find(&wrapped);
            assert_eq!(found.as_ref(), Some(&expected), "{tls}");
            let error = expected.into_error("https://10.0.0.7:8730");
            let line = error.to_string();
            assert!(!line.contains('\n'), "one line: {line}");
            assert!(!line.contains("OtherError"), "no debug dump: {line}");
            assert!(line.contains("https://10.0.0.7:8730"), "{line}");
            assert!(line.contains(fix), "the fix ({fix}) in: {line}");
        }
        assert_eq!(
            CertificateProblem::find(&std::io::Error::other("connection refused")),
            None
        );
        assert_eq!(
            CertificateProblem::find(&std::io::Error::other(rustls::Error::DecryptError)),
            None,
            "a TLS failure that is not the certificate's"
        );
    }
}
