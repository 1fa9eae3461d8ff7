//! Socket helpers shared by the bootstrap and the TCP transport: reads and writes bounded by a
//! deadline, and the choice of a local interface address (`CCL_SOCKET_IFNAME`).
//!
//! No function here resolves names: addresses are numeric, so nothing ever asks a DNS server.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use crate::error::{Error, ErrorKind, Result, classify_io};

/// Time left until `deadline`, or a timeout error saying what was being waited for.
pub fn remaining(deadline: Instant, what: impl FnOnce() -> String) -> Result<Duration> {
    let now = Instant::now();
    if now >= deadline {
        return Err(Error::timeout(format!("{} (deadline passed)", what())));
    }
    Ok(deadline - now)
}

/// A blocking stream whose reads and writes can be bounded in time: TCP for the bootstrap and the
/// TCP transport, Unix sockets for the shared-memory transport's set-up.
pub trait TimedStream: Read + Write {
    fn set_read_timeout(&self, d: Option<Duration>) -> io::Result<()>;
    fn set_write_timeout(&self, d: Option<Duration>) -> io::Result<()>;
}

impl TimedStream for TcpStream {
    fn set_read_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        TcpStream::set_read_timeout(self, d)
    }
    fn set_write_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        TcpStream::set_write_timeout(self, d)
    }
}

impl TimedStream for UnixStream {
    fn set_read_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        UnixStream::set_read_timeout(self, d)
    }
    fn set_write_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        UnixStream::set_write_timeout(self, d)
    }
}

/// Reads exactly `buf.len()` bytes from a blocking stream, failing at `deadline`.
pub fn read_exact_by<S: TimedStream + ?Sized>(
    s: &mut S,
    buf: &mut [u8],
    deadline: Instant,
    what: &dyn Fn() -> String,
) -> Result<()> {
    let mut off = 0;
    while off < buf.len() {
        let left = remaining(deadline, what)?;
        s.set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .map_err(|e| Error::io(ErrorKind::System, what(), e))?;
        match s.read(&mut buf[off..]) {
            Ok(0) => {
                return Err(Error::remote(format!(
                    "{}: connection closed after {off} of {} bytes",
                    what(),
                    buf.len()
                )));
            }
            Ok(n) => off += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(e) => return Err(Error::io(classify_io(&e), what(), e)),
        }
    }
    Ok(())
}

/// Writes all of `buf` to a blocking stream, failing at `deadline`.
pub fn write_all_by<S: TimedStream + ?Sized>(
    s: &mut S,
    buf: &[u8],
    deadline: Instant,
    what: &dyn Fn() -> String,
) -> Result<()> {
    let mut off = 0;
    while off < buf.len() {
        let left = remaining(deadline, what)?;
        s.set_write_timeout(Some(left.max(Duration::from_millis(1))))
            .map_err(|e| Error::io(ErrorKind::System, what(), e))?;
        match s.write(&buf[off..]) {
            Ok(0) => return Err(Error::remote(format!("{}: connection closed", what()))),
            Ok(n) => off += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(e) => return Err(Error::io(classify_io(&e), what(), e)),
        }
    }
    Ok(())
}

/// Connects to `addr`, retrying refused connections (the listener may not be up yet) until
/// `deadline`. The error names the address.
pub fn connect_by(
    addr: SocketAddr,
    deadline: Instant,
    what: &dyn Fn() -> String,
) -> Result<TcpStream> {
    connect_with(addr, deadline, what, true)
}

/// Connects to a listener known to be up (its address was published after it started
/// listening): a refused connection means its process is gone, a remote error at once.
pub fn connect_to_listening(
    addr: SocketAddr,
    deadline: Instant,
    what: &dyn Fn() -> String,
) -> Result<TcpStream> {
    connect_with(addr, deadline, what, false)
}

fn connect_with(
    addr: SocketAddr,
    deadline: Instant,
    what: &dyn Fn() -> String,
    retry_refused: bool,
) -> Result<TcpStream> {
    let mut backoff = Duration::from_millis(5);
    loop {
        let left = remaining(deadline, || {
            format!("{}: could not connect to {addr}", what())
        })?;
        match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(5))) {
            Ok(s) => return Ok(s),
            Err(e) if !retry_refused && e.kind() == io::ErrorKind::ConnectionRefused => {
                return Err(Error::io(
                    ErrorKind::Remote,
                    format!(
                        "{}: {addr} refused the connection (did the process exit?)",
                        what()
                    ),
                    e,
                ));
            }
            Err(e) => {
                let retry = matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionRefused
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::WouldBlock
                        | io::ErrorKind::Interrupted
                        | io::ErrorKind::ConnectionReset
                );
                if !retry || Instant::now() + backoff >= deadline {
                    let kind = if retry {
                        ErrorKind::Timeout
                    } else {
                        ErrorKind::System
                    };
                    return Err(Error::io(
                        kind,
                        format!("{}: could not connect to {addr}", what()),
                        e,
                    ));
                }
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_millis(200));
            }
        }
    }
}

/// Whether interface `name` matches a `CCL_SOCKET_IFNAME` spec (NCCL's syntax): a comma-separated
/// list of name prefixes; `=name` matches exactly; a leading `^` turns the list into exclusions.
pub fn ifname_matches(spec: &str, name: &str) -> bool {
    let (exclude, list) = match spec.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, spec),
    };
    let hit = list
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .any(|p| match p.strip_prefix('=') {
            Some(exact) => name == exact,
            None => name.starts_with(p),
        });
    hit != exclude
}

/// An address on a local interface, for a root that remote ranks must reach.
///
/// With `spec` (`CCL_SOCKET_IFNAME`) the first matching interface that is up; without it the first
/// up, non-loopback IPv4 interface (skipping container bridges, as NCCL does), else loopback.
pub fn pick_local_ip(spec: Option<&str>) -> Result<IpAddr> {
    pick_from(spec, &up_addresses()?)
}

/// The planes `spec` (`CCL_SOCKET_IFNAME`) names: every up interface that matches, with one
/// address each (its first IPv4 one, else IPv6), ordered by interface name so that the hosts of
/// a job pair their planes alike (`eth0` with `eth0`). Empty when nothing matches.
pub fn plane_ips(spec: &str) -> Result<Vec<(String, IpAddr)>> {
    let mut planes: Vec<(String, IpAddr)> = Vec::new();
    for (name, ip, _) in up_addresses()? {
        if !ifname_matches(spec, &name) {
            continue;
        }
        match planes.iter_mut().find(|(n, _)| *n == name) {
            Some(p) if p.1.is_ipv6() && ip.is_ipv4() => p.1 = ip,
            Some(_) => {}
            None => planes.push((name, ip)),
        }
    }
    planes.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(planes)
}

/// Every address of every up interface: (interface, address, is loopback).
fn up_addresses() -> Result<Vec<(String, IpAddr, bool)>> {
    let addrs = nix::ifaddrs::getifaddrs()
        .map_err(|e| Error::io(ErrorKind::System, "listing network interfaces", e.into()))?;
    let mut candidates: Vec<(String, IpAddr, bool)> = Vec::new();
    for ifa in addrs {
        let up = ifa.flags.contains(nix::net::if_::InterfaceFlags::IFF_UP);
        let Some(addr) = ifa.address else { continue };
        let ip = if let Some(v4) = addr.as_sockaddr_in() {
            IpAddr::V4(v4.ip())
        } else if let Some(v6) = addr.as_sockaddr_in6() {
            let ip = v6.ip();
            // Link-local IPv6 needs a scope id that a peer on another host cannot use.
            if (ip.segments()[0] & 0xffc0) == 0xfe80 {
                continue;
            }
            IpAddr::V6(ip)
        } else {
            continue;
        };
        if up {
            candidates.push((ifa.interface_name, ip, ip.is_loopback()));
        }
    }
    Ok(candidates)
}

fn pick_from(spec: Option<&str>, candidates: &[(String, IpAddr, bool)]) -> Result<IpAddr> {
    if let Some(spec) = spec {
        // Prefer IPv4 among the matches, then IPv6.
        let mut m: Vec<_> = candidates
            .iter()
            .filter(|(n, _, _)| ifname_matches(spec, n))
            .collect();
        m.sort_by_key(|(_, ip, _)| !ip.is_ipv4());
        return m.first().map(|(_, ip, _)| *ip).ok_or_else(|| {
            let names: Vec<_> = candidates.iter().map(|(n, _, _)| n.as_str()).collect();
            Error::invalid_argument(format!(
                "CCL_SOCKET_IFNAME='{spec}' matches no interface that is up (interfaces: {})",
                names.join(", ")
            ))
        });
    }
    let skip = |n: &str| n.starts_with("docker") || n.starts_with("virbr") || n.starts_with("veth");
    candidates
        .iter()
        .filter(|(n, ip, lo)| !lo && ip.is_ipv4() && !skip(n))
        .chain(candidates.iter().filter(|(n, _, lo)| !lo && !skip(n)))
        .map(|(_, ip, _)| *ip)
        .next()
        .or(Some(IpAddr::V4(Ipv4Addr::LOCALHOST)))
        .ok_or_else(|| Error::internal("no interface"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv6Addr;

    #[test]
    fn ifname_spec() {
        assert!(ifname_matches("eth", "eth0"));
        assert!(!ifname_matches("eth", "ib0"));
        assert!(ifname_matches("ib,eth", "eth1"));
        assert!(ifname_matches("=lo", "lo"));
        assert!(!ifname_matches("=eth", "eth0"));
        assert!(ifname_matches("^docker,lo", "eth0"));
        assert!(!ifname_matches("^docker,lo", "docker0"));
        assert!(!ifname_matches("^docker,lo", "lo"));
    }

    #[test]
    fn picking() {
        let c = vec![
            ("lo".to_string(), IpAddr::V4(Ipv4Addr::LOCALHOST), true),
            (
                "docker0".to_string(),
                IpAddr::V4(Ipv4Addr::new(172, 17, 0, 1)),
                false,
            ),
            (
                "eth0".to_string(),
                IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1)),
                false,
            ),
            (
                "eth0".to_string(),
                IpAddr::V4(Ipv4Addr::new(10, 0, 0, 5)),
                false,
            ),
        ];
        assert_eq!(
            pick_from(None, &c).unwrap(),
            IpAddr::V4(Ipv4Addr::new(10, 0, 0, 5))
        );
        assert_eq!(
            pick_from(Some("=lo"), &c).unwrap(),
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        );
        assert_eq!(
            pick_from(Some("eth"), &c).unwrap(),
            IpAddr::V4(Ipv4Addr::new(10, 0, 0, 5))
        );
        let e = pick_from(Some("ib"), &c).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(e.to_string().contains("CCL_SOCKET_IFNAME='ib'"), "{e}");
        // Only loopback: use it.
        assert_eq!(
            pick_from(None, &c[..1]).unwrap(),
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        );
        // The real machine has at least loopback.
        assert!(pick_local_ip(Some("=lo")).is_ok());
    }

    #[test]
    fn connect_to_closed_port_times_out_naming_address() {
        // Bind then drop to get a port that (very likely) refuses connections.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let t0 = Instant::now();
        let e = connect_by(addr, Instant::now() + Duration::from_millis(300), &|| {
            "test".into()
        })
        .unwrap_err();
        assert!(t0.elapsed() < Duration::from_secs(5));
        assert!(e.to_string().contains(&addr.to_string()), "{e}");
    }
}
