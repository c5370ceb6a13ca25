//! What the server checks of its own TLS certificate before it listens: the refusals every
//! client's verifier (rustls's webpki, OpenSSL, browsers) would make of the certificate itself,
//! whoever signed it. A server that starts with such a certificate only fails later, on every
//! client, with an error that names neither the certificate nor the fix (the usual self-signed
//! `openssl req -x509` recipe makes a CA certificate, which clients refuse as a server's own).
//!
//! Whether clients trust the issuer, and whether the names match the one they dial, depends
//! on each client; the client side (`sandcove-http`) explains those.

use std::time::SystemTime;

use x509_parser::prelude::{FromDer, X509Certificate};

/// Why clients would refuse a certificate as a server's own, whatever CA they trust.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CertificateRefusal {
    /// A CA certificate (basicConstraints `CA:TRUE`): webpki refuses it as an end entity
    /// (`CaUsedAsEndEntity`).
    CaCertificate,
    /// No subjectAltName: clients match the host they dial there only, never the CN.
    NoSubjectAltName,
    /// An extendedKeyUsage without `serverAuth`: the certificate is not for TLS servers.
    NotForServers,
    /// Past its `notAfter`.
    Expired {
        /// The end of its validity, seconds since the epoch.
        not_after: i64,
    },
    /// Before its `notBefore`.
    NotYetValid {
        /// The start of its validity, seconds since the epoch.
        not_before: i64,
    },
    /// Not a DER X.509 certificate this parser reads.
    Unreadable {
        /// The parser's words.
        reason: String,
    },
}

impl std::fmt::Display for CertificateRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CertificateRefusal::CaCertificate => f.write_str(
                "it is a CA certificate (basicConstraints CA:TRUE), which TLS clients refuse \
                 as a server's own certificate",
            ),
            CertificateRefusal::NoSubjectAltName => f.write_str(
                "it names no host in a subjectAltName extension, the only place TLS clients \
                 look for the host they connect to",
            ),
            CertificateRefusal::NotForServers => f.write_str(
                "its extendedKeyUsage does not include serverAuth, so TLS clients refuse it \
                 for a server",
            ),
            CertificateRefusal::Expired { not_after } => {
                write!(f, "it expired on {}", utc(*not_after))
            }
            CertificateRefusal::NotYetValid { not_before } => write!(
                f,
                "it is not valid before {} (is this machine's clock right?)",
                utc(*not_before)
            ),
            CertificateRefusal::Unreadable { reason } => {
                write!(f, "it is not a readable X.509 certificate ({reason})")
            }
        }
    }
}

impl CertificateRefusal {
    /// What to do about it, in one sentence.
    pub fn remedy(&self) -> &'static str {
        match self {
            CertificateRefusal::CaCertificate => {
                "run `sandcove tls init` for a private CA and a server certificate signed by \
                 it, or reissue yours with `basicConstraints=critical,CA:FALSE`"
            }
            CertificateRefusal::NoSubjectAltName => {
                "run `sandcove tls init --host NAME`, or reissue yours with \
                 `subjectAltName=DNS:NAME,IP:ADDRESS` naming every host clients use"
            }
            CertificateRefusal::NotForServers => {
                "run `sandcove tls init`, or reissue yours with `extendedKeyUsage=serverAuth`"
            }
            CertificateRefusal::Expired { .. } => {
                "run `sandcove tls init --renew` to reissue the server certificate under the \
                 same CA, or renew yours"
            }
            CertificateRefusal::NotYetValid { .. } => {
                "set this machine's clock right, or reissue the certificate (`sandcove tls \
                 init --renew`)"
            }
            CertificateRefusal::Unreadable { .. } => {
                "give a PEM certificate chain with the server's certificate first (`sandcove \
                 tls init` makes one)"
            }
        }
    }
}

/// Check `der`, a server's own certificate (the first of its chain), at `at`: `Err` with the
/// reason clients would refuse it. Checked in the order a reader fixes them: what the
/// certificate is, then its names, then its dates.
pub fn check_server_certificate(der: &[u8], at: SystemTime) -> Result<(), CertificateRefusal> {
    let unreadable = |reason: String| CertificateRefusal::Unreadable { reason };
    let (_, cert) = X509Certificate::from_der(der).map_err(|e| unreadable(e.to_string()))?;
    let ca = cert
        .basic_constraints()
        .map_err(|e| unreadable(format!("basicConstraints: {e}")))?
        .is_some_and(|b| b.value.ca);
    if ca {
        return Err(CertificateRefusal::CaCertificate);
    }
    let names = cert
        .subject_alternative_name()
        .map_err(|e| unreadable(format!("subjectAltName: {e}")))?
        .map_or(0, |san| san.value.general_names.len());
    if names == 0 {
        return Err(CertificateRefusal::NoSubjectAltName);
    }
    let server_auth = cert
        .extended_key_usage()
        .map_err(|e| unreadable(format!("extendedKeyUsage: {e}")))?
        .is_none_or(|eku| eku.value.server_auth || eku.value.any);
    if !server_auth {
        return Err(CertificateRefusal::NotForServers);
    }
    let now = match at.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(_) => 0,
    };
    let validity = cert.validity();
    let not_before = validity.not_before.timestamp();
    let not_after = validity.not_after.timestamp();
    if now > not_after {
        return Err(CertificateRefusal::Expired { not_after });
    }
    if now < not_before {
        return Err(CertificateRefusal::NotYetValid { not_before });
    }
    Ok(())
}

/// `seconds` since the epoch as `2025-01-31 12:00:00 UTC`.
fn utc(seconds: i64) -> String {
    let format =
        time::macros::format_description!("[year]-[month]-[day] [hour]:[minute]:[second] UTC");
    time::OffsetDateTime::from_unix_timestamp(seconds)
        .ok()
        .and_then(|t| t.format(&format).ok())
        .unwrap_or_else(|| format!("{seconds} s after the epoch"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn signed(configure: impl FnOnce(&mut rcgen::CertificateParams)) -> Vec<u8> {
        let mut params =
            rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
                .unwrap();
        params.is_ca = rcgen::IsCa::ExplicitNoCa;
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let now = SystemTime::now();
        params.not_before = (now - Duration::from_secs(60)).into();
        params.not_after = (now + Duration::from_secs(3600)).into();
        configure(&mut params);
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn each_mistake_is_named_and_a_good_certificate_passes() {
        let now = SystemTime::now();
        let hour = Duration::from_secs(3600);
        // What each certificate must give: `Ok`, or a refusal the predicate accepts.
        type Expected = Result<(), fn(&CertificateRefusal) -> bool>;
        let cases: Vec<(&str, Vec<u8>, Expected)> = vec![
            ("a server certificate", signed(|_| {}), Ok(())),
            (
                "no basicConstraints at all",
                signed(|p| p.is_ca = rcgen::IsCa::NoCa),
                Ok(()),
            ),
            (
                "a CA certificate",
                signed(|p| p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained)),
                Err(|r| *r == CertificateRefusal::CaCertificate),
            ),
            (
                "no subjectAltName",
                signed(|p| p.subject_alt_names.clear()),
                Err(|r| *r == CertificateRefusal::NoSubjectAltName),
            ),
            (
                "client authentication only",
                signed(|p| {
                    p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth]
                }),
                Err(|r| *r == CertificateRefusal::NotForServers),
            ),
            (
                "expired",
                signed(|p| {
                    p.not_before = (now - 3 * hour).into();
                    p.not_after = (now - hour).into();
                }),
                Err(|r| matches!(r, CertificateRefusal::Expired { .. })),
            ),
            (
                "not yet valid",
                signed(|p| {
                    p.not_before = (now + hour).into();
                    p.not_after = (now + 3 * hour).into();
                }),
                Err(|r| matches!(r, CertificateRefusal::NotYetValid { .. })),
            ),
            (
                "not a certificate",
                b"\x30\x03\x02\x01\x01".to_vec(),
                Err(|r| matches!(r, CertificateRefusal::Unreadable { .. })),
            ),
        ];
        for (what, der, expected) in cases {
            let got = check_server_certificate(&der, now);
            match (expected, got) {
                (Ok(()), Ok(())) => {}
                (Err(is), Err(refusal)) => {
                    assert!(is(&refusal), "{what}: {refusal:?}");
                    let line = format!("{refusal} ({})", refusal.remedy());
                    assert!(!line.contains('\n'), "{what}: one line: {line}");
                }
                (expected, got) => panic!("{what}: expected {}, got {got:?}", expected.is_ok()),
            }
        }
    }

    #[test]
    fn dates_are_shown_in_utc() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        let expired = CertificateRefusal::Expired {
            not_after: 1_700_000_000,
        };
        assert_eq!(expired.to_string(), "it expired on 2023-11-14 22:13:20 UTC");
    }
}
