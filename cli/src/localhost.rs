//! Whether names under `.localhost` reach the loopback on this host. E2B's
//! `sandbox.get_host(port)` names a sandbox's port `PORT-ID.localhost:LISTENER-PORT`; curl and
//! browsers resolve every `*.localhost` themselves (RFC 6761), but other programs ask the
//! system's resolver, which does only where a module on the `hosts:` line of
//! `/etc/nsswitch.conf` answers such names: `myhostname` (systemd's nss-myhostname) or
//! `resolve` (systemd-resolved).
//!
//! The answer is read from that line, not from a lookup: a name no module answers goes on to
//! the DNS server the host is configured with, and a check should not send anything there.

/// What to do where the names do not resolve.
pub const REMEDY: &str = "put `myhostname` on the `hosts:` line of /etc/nsswitch.conf, before \
    `dns` (Debian/Ubuntu: sudo apt-get install libnss-myhostname), or reach a port through the \
    listener's address with the `Host` header set to the name get_host returns";

/// Where `nsswitch` (the text of `/etc/nsswitch.conf`) lets `*.localhost` resolve to the
/// loopback: `Ok(module)` naming the module that answers, else `Err(why not)`.
pub fn judge(nsswitch: &str) -> Result<&'static str, String> {
    let line = nsswitch
        .lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .find_map(|l| l.strip_prefix("hosts:"));
    let Some(line) = line else {
        return Err("/etc/nsswitch.conf has no `hosts:` line".into());
    };
    // Action items (`[NOTFOUND=return]`) between the modules do not name a module.
    for module in line.split_whitespace().filter(|t| !t.starts_with('[')) {
        match module {
            "myhostname" => return Ok("myhostname"),
            "resolve" => return Ok("resolve"),
            "dns" => {
                return Err(
                    "the `hosts:` line of /etc/nsswitch.conf asks DNS before any module that \
                     answers *.localhost (myhostname, resolve)"
                        .into(),
                )
            }
            _ => {}
        }
    }
    Err(
        "no module on the `hosts:` line of /etc/nsswitch.conf answers *.localhost \
         (myhostname, resolve)"
            .into(),
    )
}

/// [`judge`] of this host's `/etc/nsswitch.conf` (none: glibc's default, `dns` then
/// `files`).
pub fn this_host() -> Result<&'static str, String> {
    match std::fs::read_to_string("/etc/nsswitch.conf") {
        Ok(text) => judge(&text),
        Err(e) => Err(format!("/etc/nsswitch.conf cannot be read ({e})")),
    }
}

#[cfg(test)]
mod tests {
    use super::judge;

    #[test]
    fn a_module_that_answers_localhost_names_before_dns_resolves_them() {
        for (text, module) in [
            ("hosts: files myhostname dns\n", "myhostname"),
            (
                "hosts:          mymachines resolve [!UNAVAIL=return] files myhostname dns",
                "resolve",
            ),
            (
                "# hosts: dns\nhosts: files mdns4_minimal [NOTFOUND=return] myhostname dns",
                "myhostname",
            ),
        ] {
            assert_eq!(judge(text), Ok(module), "{text}");
        }
    }

    #[test]
    fn dns_first_or_no_such_module_does_not() {
        for text in [
            "hosts: files dns",
            "hosts: files dns myhostname",
            "hosts: files",
            "passwd: files",
            "hosts: files dns # myhostname",
        ] {
            assert!(judge(text).is_err(), "{text}");
        }
    }
}
