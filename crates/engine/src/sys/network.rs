//! Sandbox networking: what the user-mode networking helper needs, and the routing-policy rules
//! installed over rtnetlink.

use super::{cvt, openat2, RESOLVE_NO_MAGICLINKS};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

/// Whether `/dev/net/tun` opens read-write for this user (what `pasta` needs). Opening the
/// clone device without `TUNSETIFF` creates nothing.
pub fn tun_usable() -> io::Result<()> {
    openat2(
        rustix::fs::CWD,
        Path::new("/dev/net/tun"),
        libc::O_RDWR,
        0,
        RESOLVE_NO_MAGICLINKS,
    )
    .map(drop)
}

/// Make `cmd` receive SIGKILL when the calling thread dies, and hand it `fd` as descriptor 3
/// (cleared of close-on-exec), all between fork and exec.
pub fn helper_command(cmd: &mut std::process::Command, fd: RawFd) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs between fork and exec and only makes async-signal-safe
    // syscalls on integers (prctl, dup2, fcntl).
    unsafe {
        cmd.pre_exec(move || {
            cvt(libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ))?;
            if fd == 3 {
                let flags = cvt(libc::fcntl(3, libc::F_GETFD))?;
                cvt(libc::fcntl(3, libc::F_SETFD, flags & !libc::FD_CLOEXEC))?;
            } else {
                cvt(libc::dup2(fd, 3))?;
            }
            Ok(())
        });
    }
}

/// Wait up to `timeout_ms` for `fd` to become readable (or hung up): `Ok(false)` on timeout.
pub fn poll_readable(fd: RawFd, timeout_ms: i32) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: pfd is one valid pollfd for the duration of the call.
        let ret = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
        if ret >= 0 {
            return Ok(ret > 0);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// What a routing-policy rule does with the traffic it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleAction {
    /// Fail locally with `ENETUNREACH`: the packet never leaves the network namespace.
    Unreachable,
    /// Route through the main table as usual (an exception placed before the blocks).
    LookupMain,
}

/// The kernel's rtnetlink ABI for rules (linux/fib_rules.h, linux/netlink.h).
mod nl {
    pub const RTM_NEWRULE: u16 = 32;
    pub const NLMSG_ERROR: u16 = 2;
    pub const NLM_F_REQUEST: u16 = 0x1;
    pub const NLM_F_ACK: u16 = 0x4;
    pub const NLM_F_EXCL: u16 = 0x200;
    pub const NLM_F_CREATE: u16 = 0x400;
    pub const FRA_DST: u16 = 1;
    pub const FRA_PRIORITY: u16 = 6;
    pub const FRA_TABLE: u16 = 15;
    pub const FRA_IP_PROTO: u16 = 22;
    pub const FRA_DPORT_RANGE: u16 = 24;
    pub const FR_ACT_TO_TBL: u8 = 1;
    pub const FR_ACT_UNREACHABLE: u8 = 7;
    pub const RT_TABLE_MAIN: u32 = 254;
}

/// One routing-policy rule for [`add_rules`]: destination prefix, optional protocol and
/// destination port, priority and action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Destination prefix address.
    pub dst: std::net::IpAddr,
    /// Destination prefix length.
    pub len: u8,
    /// Only this IP protocol and destination port (e.g. UDP 53), if set.
    pub proto_port: Option<(u8, u16)>,
    /// Rule priority (lower is consulted first).
    pub priority: u32,
    /// What to do with matching traffic.
    pub action: RuleAction,
}

/// The `RTM_NEWRULE` request for `rule` (pure: built as data before anything is sent).
pub fn rule_message(rule: &Rule, seq: u32) -> Vec<u8> {
    fn attr(buf: &mut Vec<u8>, kind: u16, data: &[u8]) {
        let len = 4 + data.len();
        buf.extend_from_slice(&(len as u16).to_ne_bytes());
        buf.extend_from_slice(&kind.to_ne_bytes());
        buf.extend_from_slice(data);
        while buf.len() % 4 != 0 {
            buf.push(0);
        }
    }
    let (family, addr): (u8, Vec<u8>) = match rule.dst {
        std::net::IpAddr::V4(a) => (libc::AF_INET as u8, a.octets().to_vec()),
        std::net::IpAddr::V6(a) => (libc::AF_INET6 as u8, a.octets().to_vec()),
    };
    let action = match rule.action {
        RuleAction::Unreachable => nl::FR_ACT_UNREACHABLE,
        RuleAction::LookupMain => nl::FR_ACT_TO_TBL,
    };
    let mut body = Vec::with_capacity(64);
    // struct fib_rule_hdr: family, dst_len, src_len, tos, table, res1, res2, action, flags.
    body.extend_from_slice(&[family, rule.len, 0, 0, 0, 0, 0, action]);
    body.extend_from_slice(&0u32.to_ne_bytes());
    attr(&mut body, nl::FRA_DST, &addr);
    attr(&mut body, nl::FRA_PRIORITY, &rule.priority.to_ne_bytes());
    if rule.action == RuleAction::LookupMain {
        attr(&mut body, nl::FRA_TABLE, &nl::RT_TABLE_MAIN.to_ne_bytes());
    }
    if let Some((proto, port)) = rule.proto_port {
        attr(&mut body, nl::FRA_IP_PROTO, &[proto]);
        let mut range = port.to_ne_bytes().to_vec();
        range.extend_from_slice(&port.to_ne_bytes());
        attr(&mut body, nl::FRA_DPORT_RANGE, &range);
    }
    let flags = nl::NLM_F_REQUEST | nl::NLM_F_ACK | nl::NLM_F_CREATE | nl::NLM_F_EXCL;
    let mut msg = Vec::with_capacity(16 + body.len());
    msg.extend_from_slice(&((16 + body.len()) as u32).to_ne_bytes());
    msg.extend_from_slice(&nl::RTM_NEWRULE.to_ne_bytes());
    msg.extend_from_slice(&flags.to_ne_bytes());
    msg.extend_from_slice(&seq.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
    msg.extend(body);
    msg
}

/// Install routing-policy rules in this network namespace over rtnetlink, each acknowledged;
/// the first refusal is returned (needs `CAP_NET_ADMIN` over the namespace).
pub fn add_rules(rules: &[Rule]) -> io::Result<()> {
    // SAFETY: a plain netlink socket; owned by OwnedFd below.
    let sock = cvt(unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )
    })?;
    // SAFETY: socket() returned a fresh fd.
    let sock = unsafe { OwnedFd::from_raw_fd(sock) };
    let mut buf = vec![0u8; 8192];
    for (i, rule) in rules.iter().enumerate() {
        let seq = i as u32 + 1;
        let msg = rule_message(rule, seq);
        // SAFETY: msg is a valid buffer of msg.len() bytes; the kernel is the default
        // destination of an unbound netlink socket's send.
        let sent = unsafe {
            libc::send(
                sock.as_raw_fd(),
                msg.as_ptr() as *const libc::c_void,
                msg.len(),
                0,
            )
        };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        loop {
            // SAFETY: buf is a valid writable buffer of buf.len() bytes.
            let n = unsafe {
                libc::recv(
                    sock.as_raw_fd(),
                    buf.as_mut_ptr() as *mut libc::c_void,
                    buf.len(),
                    0,
                )
            };
            if n < 0 {
                let err = io::Error::last_os_error();
                if err.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(err);
            }
            match parse_ack(&buf[..n as usize], seq) {
                Some(0) => break,
                Some(errno) => return Err(io::Error::from_raw_os_error(errno)),
                None => continue,
            }
        }
    }
    Ok(())
}

/// The errno of the acknowledgement for `seq` in a netlink reply (0 = success), if it is one.
fn parse_ack(reply: &[u8], seq: u32) -> Option<i32> {
    let mut off = 0;
    while off + 16 <= reply.len() {
        let len = u32::from_ne_bytes(reply[off..off + 4].try_into().ok()?) as usize;
        let kind = u16::from_ne_bytes(reply[off + 4..off + 6].try_into().ok()?);
        let got = u32::from_ne_bytes(reply[off + 8..off + 12].try_into().ok()?);
        if len < 16 || off + len > reply.len() {
            return None;
        }
        if kind == nl::NLMSG_ERROR && got == seq && len >= 20 {
            let err = i32::from_ne_bytes(reply[off + 16..off + 20].try_into().ok()?);
            return Some(-err);
        }
        off += (len + 3) & !3;
    }
    None
}
