//! `sandcove tls init`: a private CA and a server certificate it signs, for `sandcove serve
//! --tls-cert/--tls-key` and for clients' `SANDCOVE_CA_FILE`.
//!
//! Why a CA and not one self-signed certificate: a self-signed certificate made the usual way
//! (`openssl req -x509`) is a CA certificate, which TLS clients refuse as a server's own. Here
//! the CA signs and clients trust it; the server's certificate is an end entity (`CA:FALSE`,
//! `serverAuth`) naming every host clients use. The directory (mode 0700) holds `ca.pem`
//! (what clients trust), `ca-key.pem` (0600: only `--renew` needs it), `server.pem` and
//! `server-key.pem` (0600). Keys are created with their mode (an exclusive create, never a
//! chmod afterwards) and never overwritten unless `--renew`, which reissues the server's key
//! and certificate under the same CA, so clients keep their `ca.pem`.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use clap::{Args, Subcommand};
use sandcove::server::certificate::check_server_certificate;
use sandcove::server::intercept::{random_serial, replace_file, write_new};

use crate::env::shell_quote;
use crate::out::{self, Failure, Outcome};

/// How long a new CA is valid.
pub const CA_LIFETIME: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// How long a server certificate is valid (never past its CA's end).
pub const SERVER_LIFETIME: Duration = Duration::from_secs(365 * 24 * 3600);
/// Slack on `notBefore` for clients whose clocks run slightly behind.
const CLOCK_SKEW: Duration = Duration::from_secs(300);

/// `sandcove tls …`.
#[derive(Debug, Subcommand)]
pub enum TlsCmd {
    /// Make a private CA and a server certificate signed by it (CA:FALSE, serverAuth, the
    /// hosts as subjectAltNames), then print the `sandcove serve` flags and the
    /// SANDCOVE_CA_FILE line to use.
    ///
    /// Refuses to overwrite existing keys; --renew reissues the server certificate (and its
    /// key) under the CA already there, for new hosts or when it nears its end.
    Init(InitArgs),
}

/// The arguments of `sandcove tls init`.
#[derive(Debug, Args)]
pub struct InitArgs {
    /// A host name or IP address clients reach the server by; repeat for several. Default:
    /// localhost, 127.0.0.1 and this machine's host name.
    #[arg(long = "host", value_name = "NAME|IP")]
    pub hosts: Vec<String>,
    /// Where the files go (default: the directory tls in the state directory,
    /// $SANDCOVE_STATE_DIR, else $XDG_STATE_HOME/sandcove).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Reissue the server certificate and key under the CA already in the directory.
    #[arg(long)]
    pub renew: bool,
}

/// The files of a TLS directory.
struct Files {
    dir: PathBuf,
    ca_cert: PathBuf,
    ca_key: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
}

impl Files {
    fn in_dir(dir: &Path) -> Files {
        Files {
            dir: dir.to_path_buf(),
            ca_cert: dir.join("ca.pem"),
            ca_key: dir.join("ca-key.pem"),
            server_cert: dir.join("server.pem"),
            server_key: dir.join("server-key.pem"),
        }
    }

    fn all(&self) -> [&Path; 4] {
        [
            &self.ca_cert,
            &self.ca_key,
            &self.server_cert,
            &self.server_key,
        ]
    }
}

/// The CA that signs: its key, itself as rcgen needs it, and its end.
struct Ca {
    key: rcgen::KeyPair,
    issuer: rcgen::Certificate,
    not_after: SystemTime,
}

/// `sandcove tls …`, its failure printed as one line prefixed with the command.
pub fn tls(cmd: TlsCmd, json: bool) -> std::process::ExitCode {
    match cmd {
        TlsCmd::Init(args) => out::finish("tls init", init(args, json)),
    }
}

fn init(args: InitArgs, json: bool) -> Outcome {
    let dir = args
        .dir
        .unwrap_or_else(|| sandcove::backend::local::default_state_dir().join("tls"));
    let hosts = if args.hosts.is_empty() {
        default_hosts()
    } else {
        normalize_hosts(&args.hosts).map_err(Failure::usage)?
    };
    let files = Files::in_dir(&dir);
    let now = SystemTime::now();
    let ca = if args.renew {
        load_ca(&files, now)?
    } else {
        if let Some(found) = files
            .all()
            .into_iter()
            .find(|p| p.symlink_metadata().is_ok())
        {
            return Err(Failure::failed(format!(
                "{} exists: refusing to overwrite keys. `sandcove tls init --renew` reissues \
                 the server certificate under the CA in {}; to start over with a new CA, remove \
                 that directory (clients must then trust the new ca.pem)",
                found.display(),
                dir.display()
            )));
        }
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| Failure::failed(format!("create {}: {e}", dir.display())))?;
        create_ca(&files, &hosts, now)?
    };
    let (key_pem, cert_pem, not_after) = issue(&ca, &hosts, now)?;
    let written = if args.renew {
        replace_file(&files.dir, &files.server_key, key_pem.as_bytes(), 0o600)
            .and_then(|()| replace_file(&files.dir, &files.server_cert, cert_pem.as_bytes(), 0o644))
    } else {
        write_new(&files.server_key, key_pem.as_bytes(), 0o600)
            .and_then(|()| write_new(&files.server_cert, cert_pem.as_bytes(), 0o644))
    };
    written.map_err(Failure::from)?;
    report(&files, &hosts, &ca, not_after, args.renew, json)
}

/// localhost, 127.0.0.1 and this machine's host name (when it is a DNS name).
fn default_hosts() -> Vec<String> {
    let mut hosts = vec!["localhost".to_string(), "127.0.0.1".to_string()];
    let uname = rustix::system::uname();
    let name = uname.nodename().to_string_lossy().to_ascii_lowercase();
    if is_dns_name(&name) && !hosts.contains(&name) {
        hosts.push(name);
    }
    hosts
}

/// The hosts as subjectAltNames take them: IP addresses as written, DNS names in lower
/// case, each once; `Err` names one that is neither.
fn normalize_hosts(hosts: &[String]) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for host in hosts {
        let host = host.trim().to_ascii_lowercase();
        let host = match host.parse::<std::net::IpAddr>() {
            Ok(ip) => ip.to_string(),
            Err(_) if is_dns_name(&host) => host,
            Err(_) => {
                return Err(format!(
                    "--host {host:?} is neither an IP address nor a DNS name"
                ))
            }
        };
        if !out.contains(&host) {
            out.push(host);
        }
    }
    Ok(out)
}

/// Whether `name` is a DNS host name (letters, digits and hyphens in dot-separated labels; a
/// leading `*.` wildcard allowed).
fn is_dns_name(name: &str) -> bool {
    let bare = name.strip_prefix("*.").unwrap_or(name);
    !bare.is_empty()
        && name.len() <= 253
        && bare.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
        && bare.parse::<std::net::IpAddr>().is_err()
}

fn serial() -> Result<rcgen::SerialNumber, Failure> {
    Ok(rcgen::SerialNumber::from_slice(&random_serial()?))
}

fn failed(what: &str) -> impl Fn(rcgen::Error) -> Failure + '_ {
    move |e| Failure::failed(format!("{what}: {e}"))
}

/// A new CA, written to `ca-key.pem` (0600) and `ca.pem`.
fn create_ca(files: &Files, hosts: &[String], now: SystemTime) -> Result<Ca, Failure> {
    let key = rcgen::KeyPair::generate().map_err(failed("the CA key"))?;
    let mut params = rcgen::CertificateParams::default();
    let mut name = rcgen::DistinguishedName::new();
    name.push(rcgen::DnType::OrganizationName, "Sandcove");
    let host = hosts.last().map(String::as_str).unwrap_or("localhost");
    name.push(
        rcgen::DnType::CommonName,
        format!("Sandcove private CA ({host})"),
    );
    params.distinguished_name = name;
    // It signs server certificates only: no intermediate CAs below it.
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    params.serial_number = Some(serial()?);
    params.not_before = (now - CLOCK_SKEW).into();
    let not_after = now + CA_LIFETIME;
    params.not_after = not_after.into();
    let issuer = params
        .self_signed(&key)
        .map_err(failed("the CA certificate"))?;
    write_new(&files.ca_key, key.serialize_pem().as_bytes(), 0o600)?;
    write_new(&files.ca_cert, issuer.pem().as_bytes(), 0o644)?;
    Ok(Ca {
        key,
        issuer,
        not_after,
    })
}

/// The CA already in the directory, checked to be a CA, to match its key and to be valid.
fn load_ca(files: &Files, now: SystemTime) -> Result<Ca, Failure> {
    let missing = |e: sandcove::Error| {
        Failure::failed(format!(
            "--renew needs the CA in {} ({e}); run `sandcove tls init` without --renew to make \
             one",
            files.dir.display()
        ))
    };
    let key_pem = sandcove::server::read_secret_file(&files.ca_key, true).map_err(missing)?;
    let cert_pem = sandcove::server::read_secret_file(&files.ca_cert, false).map_err(missing)?;
    let unreadable = |what: &Path, e: &dyn std::fmt::Display| {
        Failure::failed(format!("{}: {e}", what.display()))
    };
    let key_text = String::from_utf8(key_pem).map_err(|e| unreadable(&files.ca_key, &e))?;
    let key = rcgen::KeyPair::from_pem(&key_text).map_err(|e| unreadable(&files.ca_key, &e))?;
    let cert_text = String::from_utf8(cert_pem).map_err(|e| unreadable(&files.ca_cert, &e))?;
    let params = rcgen::CertificateParams::from_ca_cert_pem(&cert_text)
        .map_err(|e| unreadable(&files.ca_cert, &e))?;
    let der = x509_parser::pem::parse_x509_pem(cert_text.as_bytes())
        .map_err(|e| unreadable(&files.ca_cert, &e))?
        .1
        .contents;
    let (_, cert) =
        x509_parser::parse_x509_certificate(&der).map_err(|e| unreadable(&files.ca_cert, &e))?;
    if !cert.is_ca() {
        return Err(Failure::failed(format!(
            "{} is not a CA certificate: remove {} and run `sandcove tls init` for a new CA",
            files.ca_cert.display(),
            files.dir.display()
        )));
    }
    if cert.public_key().raw != key.public_key_der().as_slice() {
        return Err(Failure::failed(format!(
            "{} is not the key of {}: restore the pair, or remove {} and run `sandcove tls \
             init` for a new CA",
            files.ca_key.display(),
            files.ca_cert.display(),
            files.dir.display()
        )));
    }
    let end = cert.validity().not_after.timestamp();
    let not_after = SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(end).unwrap_or(0));
    if not_after <= now {
        return Err(Failure::failed(format!(
            "the CA in {} has expired: remove the directory and run `sandcove tls init` for a \
             new CA (clients must then trust the new ca.pem)",
            files.dir.display()
        )));
    }
    // rcgen signs with the issuer's name and key identifier, both read from the CA on disk.
    let issuer = params
        .self_signed(&key)
        .map_err(|e| unreadable(&files.ca_cert, &e))?;
    Ok(Ca {
        key,
        issuer,
        not_after,
    })
}

/// A new server key and certificate for `hosts`, signed by `ca`: (key PEM, certificate PEM,
/// its end), checked as `sandcove serve` will check it.
fn issue(
    ca: &Ca,
    hosts: &[String],
    now: SystemTime,
) -> Result<(String, String, SystemTime), Failure> {
    let mut params = rcgen::CertificateParams::new(hosts.to_vec())
        .map_err(|e| Failure::usage(format!("--host: {e}")))?;
    let mut name = rcgen::DistinguishedName::new();
    name.push(
        rcgen::DnType::CommonName,
        hosts.first().map(String::as_str).unwrap_or("localhost"),
    );
    params.distinguished_name = name;
    params.is_ca = rcgen::IsCa::ExplicitNoCa;
    params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    params.serial_number = Some(serial()?);
    params.not_before = (now - CLOCK_SKEW).into();
    let not_after = (now + SERVER_LIFETIME).min(ca.not_after);
    params.not_after = not_after.into();
    let key = rcgen::KeyPair::generate().map_err(failed("the server key"))?;
    let cert = params
        .signed_by(&key, &ca.issuer, &ca.key)
        .map_err(failed("the server certificate"))?;
    check_server_certificate(cert.der(), now)
        .map_err(|refusal| Failure::failed(format!("the new server certificate: {refusal}")))?;
    Ok((key.serialize_pem(), cert.pem(), not_after))
}

/// What was made and the lines to use it.
fn report(
    files: &Files,
    hosts: &[String],
    ca: &Ca,
    server_not_after: SystemTime,
    renewed: bool,
    json: bool,
) -> Outcome {
    let path = |p: &Path| p.display().to_string();
    let until = |t: SystemTime| {
        let ms = t
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        sandcove::reference::format_utc(ms)
    };
    let serve = format!(
        "sandcove serve --tls-cert {} --tls-key {}",
        shell_quote(&path(&files.server_cert)),
        shell_quote(&path(&files.server_key))
    );
    let url_host = match hosts.first() {
        Some(h) if h.contains(':') => format!("[{h}]"),
        Some(h) => h.clone(),
        None => "localhost".into(),
    };
    if json {
        out::print_json(&serde_json::json!({
            "dir": path(&files.dir),
            "renewed": renewed,
            "hosts": hosts,
            "ca_cert": path(&files.ca_cert),
            "ca_key": path(&files.ca_key),
            "ca_not_after": until(ca.not_after),
            "server_cert": path(&files.server_cert),
            "server_key": path(&files.server_key),
            "server_not_after": until(server_not_after),
            "serve": ["--tls-cert", path(&files.server_cert), "--tls-key", path(&files.server_key)],
            "env": { sandcove::backend::http::CA_FILE_ENV: path(&files.ca_cert) },
        }))?;
        return Ok(0);
    }
    let made = if renewed {
        "a new server certificate under the existing CA"
    } else {
        "a private CA and a server certificate signed by it"
    };
    println!("sandcove tls init: {made} in {}", files.dir.display());
    println!(
        "  CA certificate      {}  (until {}; what clients trust)",
        path(&files.ca_cert),
        until(ca.not_after)
    );
    println!(
        "  CA key              {}  (mode 0600; only --renew uses it)",
        path(&files.ca_key)
    );
    println!(
        "  server certificate  {}  (for {}; until {})",
        path(&files.server_cert),
        hosts.join(", "),
        until(server_not_after)
    );
    println!(
        "  server key          {}  (mode 0600)",
        path(&files.server_key)
    );
    println!();
    println!("Serve with (add --listen ADDR to serve beyond loopback):");
    println!("  {serve}");
    println!("Clients (elsewhere, copy ca.pem there and name the copy):");
    println!(
        "  export {}={}",
        sandcove::backend::http::CA_FILE_ENV,
        shell_quote(&path(&files.ca_cert))
    );
    println!("  export SANDCOVE_URL=https://{url_host}:8730");
    println!(
        "Vendor SDKs: SSL_CERT_FILE={} (Python), NODE_EXTRA_CA_CERTS={} (Node.js)",
        shell_quote(&path(&files.ca_cert)),
        shell_quote(&path(&files.ca_cert))
    );
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_ip_addresses_or_dns_names() {
        let given =
            |h: &[&str]| normalize_hosts(&h.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(
            given(&[
                "LocalHost",
                "127.0.0.1",
                "::1",
                "localhost",
                "*.dev.example"
            ]),
            Ok(vec![
                "localhost".to_string(),
                "127.0.0.1".into(),
                "::1".into(),
                "*.dev.example".into()
            ])
        );
        for bad in ["", "a b", "-x.example", "x..example", "under_score", "a/b"] {
            assert!(given(&[bad]).is_err(), "{bad:?}");
        }
        let defaults = default_hosts();
        assert_eq!(&defaults[..2], ["localhost", "127.0.0.1"]);
    }
}
