//! Internet access for a sandbox ([`NetworkPolicy::Internet`](sandcove_core::NetworkPolicy::Internet)).
//!
//! The sandbox keeps its own network namespace. The monitor wires it out with `pasta` (Debian
//! package `passt`, what rootless Podman uses): user-mode networking that terminates the
//! sandbox's connections and opens ordinary sockets on the host, so it needs no privileges.
//! `pasta` is told not to map its gateway address to the host's loopback (`--no-map-gw`) and
//! to forward no port in either direction (`-t/-u/-T/-U none`): by default it would let the
//! sandbox reach services bound on the host's loopback. It dies with the monitor
//! (parent-death signal), so destroy leaves no helper behind.
//!
//! Before any sandbox code runs, the agent installs routing-policy rules in the sandbox's
//! namespace that make loopback, link-local, private and special-purpose ranges, and the
//! subnets the host is attached to, unreachable: a `connect` there fails inside the sandbox
//! with `ENETUNREACH`, nothing is sent. Only port 53 of the host's own resolvers is let
//! through, so names resolve. Sandbox processes run without capabilities and cannot change
//! the rules.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::AsFd;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::sys::{self, Rule, RuleAction};
use sandcove_core::capability::INTERNET_REMEDY;
use sandcove_core::{Error, Result};

/// Env var naming the `pasta` binary to use; set but empty, the engine has none (and
/// [`Capabilities::internet`](sandcove_core::Capabilities::internet) is `false`).
pub const PASTA_ENV: &str = "SANDCOVE_PASTA";

/// How long `pasta` may take to configure the sandbox's interface.
const HELPER_READY: Duration = Duration::from_secs(10);

/// Priority of the exceptions (resolvers' port 53); the blocks come right after.
const ALLOW_PRIORITY: u32 = 100;
/// Priority of the blocks: before the main table (32766), after the local table (0).
const BLOCK_PRIORITY: u32 = 200;

/// Ranges no Internet sandbox may reach, whatever the host: "this network", private,
/// shared (carrier-grade NAT, also cloud-internal services), loopback, link-local (instance
/// metadata), IETF and benchmarking blocks, multicast and reserved.
const BLOCKED_V4: &[(Ipv4Addr, u8)] = &[
    (Ipv4Addr::new(0, 0, 0, 0), 8),
    (Ipv4Addr::new(10, 0, 0, 0), 8),
    (Ipv4Addr::new(100, 64, 0, 0), 10),
    (Ipv4Addr::new(127, 0, 0, 0), 8),
    (Ipv4Addr::new(169, 254, 0, 0), 16),
    (Ipv4Addr::new(172, 16, 0, 0), 12),
    (Ipv4Addr::new(192, 0, 0, 0), 24),
    (Ipv4Addr::new(192, 168, 0, 0), 16),
    (Ipv4Addr::new(198, 18, 0, 0), 15),
    (Ipv4Addr::new(224, 0, 0, 0), 4),
    (Ipv4Addr::new(240, 0, 0, 0), 4),
];

/// The IPv6 counterparts: unspecified and loopback, IPv4-mapped, NAT64 and 6to4 (which embed
/// IPv4 addresses), unique-local, link-local, site-local and multicast.
const BLOCKED_V6: &[(Ipv6Addr, u8)] = &[
    (Ipv6Addr::UNSPECIFIED, 128),
    (Ipv6Addr::LOCALHOST, 128),
    (Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0, 0), 96),
    (Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0, 0), 96),
    (Ipv6Addr::new(0x64, 0xff9b, 1, 0, 0, 0, 0, 0), 48),
    (Ipv6Addr::new(0x2002, 0, 0, 0, 0, 0, 0, 0), 16),
    (Ipv6Addr::new(0xfc00, 0, 0, 0, 0, 0, 0, 0), 7),
    (Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0), 10),
    (Ipv6Addr::new(0xfec0, 0, 0, 0, 0, 0, 0, 0), 10),
    (Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0), 8),
];

/// The helper this process would use: `$SANDCOVE_PASTA` when set (empty: none), else `pasta`
/// in the usual system directories.
pub fn find_pasta() -> Option<PathBuf> {
    if let Some(v) = std::env::var_os(PASTA_ENV) {
        return (!v.is_empty()).then(|| PathBuf::from(v));
    }
    ["/usr/bin/pasta", "/usr/sbin/pasta", "/usr/local/bin/pasta"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

/// Whether `helper` can give sandboxes internet here: it is an executable file and
/// `/dev/net/tun` opens for this user. The error says what is missing.
pub fn probe(helper: Option<&Path>) -> std::result::Result<PathBuf, String> {
    use std::os::unix::fs::PermissionsExt;
    let Some(helper) = helper else {
        return Err("the user-mode networking helper `pasta` is not installed".into());
    };
    match std::fs::metadata(helper) {
        Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => {}
        _ => {
            return Err(format!(
                "the user-mode networking helper {} is not an executable file",
                helper.display()
            ))
        }
    }
    sys::tun_usable().map_err(|e| format!("/dev/net/tun cannot be opened by this user: {e}"))?;
    // Absolute (the monitor runs it from another working directory), but not resolved:
    // the binary picks its mode from the name it is run by (`pasta` vs `passt`).
    std::path::absolute(helper).map_err(|e| format!("{}: {e}", helper.display()))
}

/// The error for an Internet request this engine cannot honour.
pub fn unavailable(reason: &str) -> Error {
    Error::Unavailable {
        reason: format!("isolated internet access is unavailable: {reason}"),
        remedy: format!(
            "{INTERNET_REMEDY}; or create the sandbox with NetworkPolicy::None (loopback only)"
        ),
    }
}

/// What the agent installs in an Internet sandbox's namespace, computed on the host side
/// (where the host's routes and resolvers are visible) before the agent is cloned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// The rules, exceptions first.
    pub rules: Vec<Rule>,
}

impl Plan {
    /// The plan for this host: the fixed ranges, the host's attached subnets (from the
    /// routing tables in `/proc/net`), and port 53 of the host's non-loopback resolvers.
    pub fn for_host() -> Plan {
        let read = |p: &str| read_bounded(Path::new(p)).unwrap_or_default();
        let mut subnets = parse_ipv4_routes(&read("/proc/net/route"));
        subnets.extend(parse_ipv6_routes(&read("/proc/net/ipv6_route")));
        let resolvers = parse_resolvers(&read("/etc/resolv.conf"));
        Plan::new(&subnets, &resolvers)
    }

    /// The plan blocking the fixed ranges plus `subnets`, with port 53 of `resolvers` open.
    pub fn new(subnets: &[(IpAddr, u8)], resolvers: &[IpAddr]) -> Plan {
        let mut rules = Vec::new();
        for r in resolvers.iter().filter(|r| !r.is_loopback()) {
            let len = if r.is_ipv4() { 32 } else { 128 };
            for proto in [libc::IPPROTO_UDP as u8, libc::IPPROTO_TCP as u8] {
                rules.push(Rule {
                    dst: *r,
                    len,
                    proto_port: Some((proto, 53)),
                    priority: ALLOW_PRIORITY,
                    action: RuleAction::LookupMain,
                });
            }
        }
        let fixed = BLOCKED_V4
            .iter()
            .map(|(a, l)| (IpAddr::V4(*a), *l))
            .chain(BLOCKED_V6.iter().map(|(a, l)| (IpAddr::V6(*a), *l)));
        let mut blocked: Vec<(IpAddr, u8)> = Vec::new();
        for (addr, len) in fixed.chain(subnets.iter().copied()) {
            if !blocked.contains(&(addr, len)) {
                blocked.push((addr, len));
            }
        }
        rules.extend(blocked.into_iter().map(|(dst, len)| Rule {
            dst,
            len,
            proto_port: None,
            priority: BLOCK_PRIORITY,
            action: RuleAction::Unreachable,
        }));
        Plan { rules }
    }

    /// In the agent, before any sandbox process exists: install the rules.
    pub fn apply(&self) -> std::io::Result<()> {
        sys::add_rules(&self.rules)
    }
}

/// Read at most 1 MiB of a host file (routing tables, resolver configuration).
fn read_bounded(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(1 << 20)
        .read_to_string(&mut text)?;
    Ok(text)
}

/// Destinations of the non-default IPv4 routes in `/proc/net/route` (other than `lo`'s).
pub fn parse_ipv4_routes(text: &str) -> Vec<(IpAddr, u8)> {
    let mut out = Vec::new();
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 8 || f[0] == "lo" {
            continue;
        }
        // Addresses are printed as the native-endian value of the network-order word.
        let (Ok(dst), Ok(mask)) = (u32::from_str_radix(f[1], 16), u32::from_str_radix(f[7], 16))
        else {
            continue;
        };
        let len = mask.count_ones() as u8;
        if len == 0 {
            continue;
        }
        out.push((IpAddr::V4(Ipv4Addr::from(dst.to_ne_bytes())), len));
    }
    out
}

/// Destinations of the non-default IPv6 routes in `/proc/net/ipv6_route` (other than `lo`'s).
pub fn parse_ipv6_routes(text: &str) -> Vec<(IpAddr, u8)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 10 || f[9] == "lo" || f[0].len() != 32 {
            continue;
        }
        let (Ok(dst), Ok(len)) = (u128::from_str_radix(f[0], 16), u8::from_str_radix(f[1], 16))
        else {
            continue;
        };
        if len == 0 || len > 128 {
            continue;
        }
        out.push((IpAddr::V6(Ipv6Addr::from(dst)), len));
    }
    out
}

/// The `nameserver` addresses of a `resolv.conf`.
pub fn parse_resolvers(text: &str) -> Vec<IpAddr> {
    text.lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            (words.next() == Some("nameserver"))
                .then(|| words.next()?.split('%').next()?.parse().ok())?
        })
        .collect()
}

/// The running helper; it is killed when the thread that started it (the monitor's main
/// thread) ends, whichever way the monitor goes.
pub struct Helper {
    child: std::process::Child,
}

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Start `pasta` for the namespaces of `agent_pid` and wait (bounded) until it has
/// configured the interface, routes included: it writes its pid file (our pipe) only then.
pub fn start_helper(helper: &Path, agent_pid: libc::pid_t) -> Result<Helper> {
    let (ready_read, ready_write) = sys::pipe()?;
    let mut cmd = std::process::Command::new(helper);
    cmd.args(["--config-net", "--no-map-gw", "--foreground", "--quiet"])
        .args(["-t", "none", "-u", "none", "-T", "none", "-U", "none"])
        .args(["--pid", "/proc/self/fd/3"]);
    if sys::geteuid() == 0 {
        // As root pasta insists on a user to run as; it must stay the owner of the
        // sandbox's user namespace to join it. It drops its capabilities itself.
        cmd.args(["--runas", "0:0"]);
    }
    cmd.arg(agent_pid.to_string())
        .env_clear()
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null());
    sys::helper_command(&mut cmd, ready_write.as_raw_fd());
    let child = cmd
        .spawn()
        .map_err(|e| unavailable(&format!("cannot start {}: {e}", helper.display())))?;
    drop(ready_write);
    let mut helper_proc = Helper { child };
    let ready = sys::poll_readable(ready_read.as_raw_fd(), HELPER_READY.as_millis() as i32)?;
    let mut buf = [0u8; 32];
    let n = if ready {
        sys::read_fd(ready_read.as_fd(), &mut buf)?
    } else {
        0
    };
    if n == 0 {
        let status = match helper_proc.child.try_wait() {
            Ok(Some(s)) => format!("it exited ({s})"),
            _ => "it did not configure the sandbox's interface in time".into(),
        };
        // Drop kills and reaps it.
        drop(helper_proc);
        return Err(unavailable(&format!(
            "{} failed to wire out the sandbox: {status}; see the monitor log",
            helper.display()
        )));
    }
    Ok(helper_proc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_and_resolvers_parse() {
        let v4 =
            "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
                  eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
                  eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
                  lo\t0000007F\t00000000\t0001\t0\t0\t0\t000000FF\t0\t0\t0\n";
        let got = parse_ipv4_routes(v4);
        if cfg!(target_endian = "little") {
            assert_eq!(got, vec![("192.0.2.0".parse().unwrap(), 24)]);
        }
        let v6 = "fd000000000000000000000000000000 40 00000000000000000000000000000000 00 \
                  00000000000000000000000000000000 00000100 00000001 00000000 00000001 eth0\n\
                  00000000000000000000000000000000 00 00000000000000000000000000000000 00 \
                  fd000000000000000000000000000001 00000400 00000001 00000000 00000003 eth0\n\
                  00000000000000000000000000000001 80 00000000000000000000000000000000 00 \
                  00000000000000000000000000000000 00000000 00000001 00000000 80200001 lo\n";
        assert_eq!(parse_ipv6_routes(v6), vec![("fd00::".parse().unwrap(), 64)]);
        let conf =
            "# c\nnameserver 10.255.255.53\nsearch x\nnameserver fe80::1%eth0\nnameserver bad\n";
        assert_eq!(
            parse_resolvers(conf),
            vec![
                "10.255.255.53".parse::<IpAddr>().unwrap(),
                "fe80::1".parse().unwrap()
            ]
        );
    }

    #[test]
    fn plan_puts_resolver_exceptions_first_and_blocks_metadata_and_private_ranges() {
        let plan = Plan::new(
            &[("192.0.2.0".parse().unwrap(), 24)],
            &["10.0.0.2".parse().unwrap(), "127.0.0.53".parse().unwrap()],
        );
        let first = &plan.rules[0];
        assert_eq!(first.action, RuleAction::LookupMain);
        assert_eq!(first.dst, "10.0.0.2".parse::<IpAddr>().unwrap());
        assert_eq!(first.proto_port, Some((libc::IPPROTO_UDP as u8, 53)));
        assert_eq!(
            plan.rules
                .iter()
                .filter(|r| r.action == RuleAction::LookupMain)
                .count(),
            2,
            "UDP and TCP 53 of the one non-loopback resolver"
        );
        let blocked = |a: &str| {
            let a: IpAddr = a.parse().unwrap();
            plan.rules.iter().any(|r| {
                r.action == RuleAction::Unreachable && r.proto_port.is_none() && {
                    match (r.dst, a) {
                        (IpAddr::V4(p), IpAddr::V4(a)) => {
                            let m = u32::MAX.checked_shl(32 - r.len as u32).unwrap_or(0);
                            u32::from(p) & m == u32::from(a) & m
                        }
                        (IpAddr::V6(p), IpAddr::V6(a)) => {
                            let m = u128::MAX.checked_shl(128 - r.len as u32).unwrap_or(0);
                            u128::from(p) & m == u128::from(a) & m
                        }
                        _ => false,
                    }
                }
            })
        };
        for a in [
            "169.254.169.254",
            "10.1.2.3",
            "172.31.0.1",
            "192.168.1.1",
            "100.100.100.200",
            "192.0.2.1",
            "fd00::1",
            "fe80::1",
            "::ffff:10.0.0.1",
        ] {
            assert!(blocked(a), "{a} must be blocked");
        }
        for a in ["1.1.1.1", "2606:4700::1111", "172.32.0.1"] {
            assert!(!blocked(a), "{a} must stay reachable");
        }
        assert!(plan
            .rules
            .iter()
            .all(|r| r.priority < 32766 && r.priority > 0));
    }

    #[test]
    fn rule_message_is_well_formed() {
        let msg = sys::rule_message(
            &Rule {
                dst: "10.0.0.2".parse().unwrap(),
                len: 32,
                proto_port: Some((17, 53)),
                priority: 100,
                action: RuleAction::LookupMain,
            },
            7,
        );
        assert_eq!(msg.len() % 4, 0);
        assert_eq!(
            u32::from_ne_bytes(msg[0..4].try_into().unwrap()) as usize,
            msg.len()
        );
        assert_eq!(u16::from_ne_bytes(msg[4..6].try_into().unwrap()), 32);
        assert_eq!(u32::from_ne_bytes(msg[8..12].try_into().unwrap()), 7);
        // fib_rule_hdr: AF_INET, /32, action "to table".
        assert_eq!(&msg[16..19], &[libc::AF_INET as u8, 32, 0]);
        assert_eq!(msg[23], 1);
    }
}
