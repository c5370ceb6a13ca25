//! `sandcove env VENDOR` and `sandcove ca`: pointing a vendor's official SDKs at the running
//! server, and where the Blaxel proxy's CA lives.

use std::path::PathBuf;
use std::process::ExitCode;

use sandcove::client::API_KEY_ENV;
use sandcove::server::intercept;

use crate::record;
use crate::serve::{blaxel_ca_dir, BLAXEL_HOSTS, BLAXEL_WORKSPACE};

/// `sandcove ca`.
pub fn ca_command(state_dir: Option<PathBuf>) -> ExitCode {
    let state_dir = state_dir.unwrap_or_else(sandcove::backend::local::default_state_dir);
    let dir = blaxel_ca_dir(&state_dir);
    let bundle = intercept::bundle_path(&dir);
    println!("directory:  {}", dir.display());
    println!(
        "bundle:     {} (SSL_CERT_FILE: the host's public roots, then the Sandcove CA)",
        bundle.display()
    );
    println!("cert:       {}", dir.join("ca").join("cert.pem").display());
    println!(
        "key:        {} (mode 0600)",
        dir.join("ca").join("key.pem").display()
    );
    println!(
        "signs for:  {} only (X.509 name constraints, critical; no IP addresses, no \
         intermediate CAs, TLS server certificates only)",
        BLAXEL_HOSTS.join(", ")
    );
    println!(
        "remove:     stop `sandcove serve`, then rm -r {} (nothing was installed into the \
         system trust store)",
        shell_quote(&dir.display().to_string())
    );
    if bundle.is_file() {
        ExitCode::SUCCESS
    } else {
        eprintln!(
            "sandcove ca: no CA in {} yet: `sandcove serve --blaxel ADDR` creates it",
            dir.display()
        );
        ExitCode::FAILURE
    }
}

/// `sandcove env VENDOR`.
pub fn env_command(vendor: &str, state_dir: Option<PathBuf>) -> ExitCode {
    if vendor == "daytona" {
        return env_daytona(state_dir);
    }
    if vendor == "blaxel" {
        return env_blaxel(state_dir);
    }
    if vendor != "e2b" {
        eprintln!("sandcove env: unknown vendor '{vendor}': use e2b, daytona or blaxel");
        return ExitCode::FAILURE;
    }
    let Ok(Running { key, url, .. }) = running(state_dir, "e2b", "E2B_API_KEY", record::find_e2b)
    else {
        return ExitCode::FAILURE;
    };
    println!("export E2B_API_URL={}", shell_quote(&url));
    println!("export E2B_SANDBOX_URL={}", shell_quote(&url));
    println!("export E2B_API_KEY={}", shell_quote(&key));
    if let Err(why) = crate::localhost::this_host() {
        eprintln!(
            "sandcove env: warning: {why}, so `get_host(port)` names (PORT-ID.localhost) may              not resolve here; {}",
            crate::localhost::REMEDY
        );
    }
    ExitCode::SUCCESS
}

/// What `sandcove env` needs of a running vendor listener.
struct Running {
    /// The server's API key, from the environment.
    key: String,
    /// The listener's origin, from its record.
    url: String,
    /// The state directory the record was found in.
    state_dir: PathBuf,
}

/// The API key and the running `sandcove serve --<vendor>` listener recorded in the state
/// directory; `Err` after saying on stderr what is missing (`sdk_key_var`: the variable the
/// vendor's SDK reads the key from).
fn running(
    state_dir: Option<PathBuf>,
    vendor: &str,
    sdk_key_var: &str,
    find: fn(&std::path::Path) -> std::io::Result<Option<String>>,
) -> Result<Running, ()> {
    let Some(key) = std::env::var(API_KEY_ENV)
        .ok()
        .filter(|k| !k.trim().is_empty())
    else {
        eprintln!(
            "sandcove env: {API_KEY_ENV} is not set: set it to the server's API key (the SDK \
             sends it as {sdk_key_var})"
        );
        return Err(());
    };
    let state_dir = state_dir.unwrap_or_else(sandcove::backend::local::default_state_dir);
    match find(&state_dir) {
        Ok(Some(url)) => Ok(Running {
            key: key.trim().to_string(),
            url,
            state_dir,
        }),
        Ok(None) => {
            eprintln!(
                "sandcove env: no running `sandcove serve --{vendor} ADDR` found in {}; start \
                 one (with the same state directory) first",
                state_dir.display()
            );
            Err(())
        }
        Err(e) => {
            eprintln!("sandcove env: {e}");
            Err(())
        }
    }
}

/// A value as one POSIX shell word.
pub fn shell_quote(value: &str) -> String {
    if !value.is_empty()
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./:@=+,%".contains(&b))
    {
        value.to_string()
    } else {
        format!("'{}'", value.replace('\'', "'\\''"))
    }
}

/// `sandcove env daytona`.
fn env_daytona(state_dir: Option<PathBuf>) -> ExitCode {
    let Ok(Running { key, url, .. }) = running(
        state_dir,
        "daytona",
        "DAYTONA_API_KEY",
        record::find_daytona,
    ) else {
        return ExitCode::FAILURE;
    };
    println!(
        "export DAYTONA_API_URL={}",
        shell_quote(&format!("{url}/api"))
    );
    println!("export DAYTONA_API_KEY={}", shell_quote(&key));
    ExitCode::SUCCESS
}

/// `sandcove env blaxel`.
fn env_blaxel(state_dir: Option<PathBuf>) -> ExitCode {
    let Ok(Running {
        key,
        url,
        state_dir,
    }) = running(state_dir, "blaxel", "BL_API_KEY", record::find_blaxel)
    else {
        return ExitCode::FAILURE;
    };
    // The TypeScript SDK: plain HTTP to this listener for both planes.
    println!("export BL_WORKSPACE={}", shell_quote(BLAXEL_WORKSPACE));
    println!("export BL_API_KEY={}", shell_quote(&key));
    println!("export BL_API_URL={}", shell_quote(&format!("{url}/v0")));
    println!("export BL_RUN_URL={}", shell_quote(&url));
    println!("export BL_DISABLE_H2=1");
    // The Python SDK (fixed https://api.blaxel.ai): through the listener's proxy, trusting
    // the bundle of the host's roots plus the Sandcove CA.
    let bundle = intercept::bundle_path(&blaxel_ca_dir(&state_dir));
    if !bundle.is_file() {
        eprintln!(
            "sandcove env: the Blaxel proxy's CA bundle {} is missing; restart `sandcove serve \
             --blaxel ADDR` to create it",
            bundle.display()
        );
        return ExitCode::FAILURE;
    }
    println!("export HTTPS_PROXY={}", shell_quote(&url));
    // Where the host keeps its roots under hashed names, a directory list: OpenSSL reads it
    // lazily, where a bundle is parsed whole for every TLS context the SDK makes (one per
    // sandbox). `SSL_CERT_FILE` is unset then, as Python's HTTP clients prefer it.
    match intercept::ssl_cert_dir(&blaxel_ca_dir(&state_dir)) {
        Some(dirs) => {
            println!("unset SSL_CERT_FILE");
            println!("export SSL_CERT_DIR={}", shell_quote(&dirs));
        }
        None => println!(
            "export SSL_CERT_FILE={}",
            shell_quote(&bundle.display().to_string())
        ),
    }
    ExitCode::SUCCESS
}
