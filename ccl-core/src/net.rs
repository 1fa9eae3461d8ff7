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
    for a in up_addresses()? {
        if !ifname_matches(spec, &a.name) {
            continue;
        }
        match planes.iter_mut().find(|(n, _)| *n == a.name) {
            Some(p) if p.1.is_ipv6() && a.ip.is_ipv4() => p.1 = a.ip,
            Some(_) => {}
            None => planes.push((a.name, a.ip)),
        }
    }
    planes.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(planes)
}

/// One address of a local interface, with its network's prefix length.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpAddr {
    pub name: String,
    pub ip: IpAddr,
    pub loopback: bool,
    pub prefix: u8,
}

impl UpAddr {
    /// Whether `peer` is on this address's network (reached over this interface's link, not
    /// routed), and not this very address.
    pub fn on_link(&self, peer: IpAddr) -> bool {
        let bits = |ip: IpAddr| -> u128 {
            match ip {
                IpAddr::V4(v4) => u128::from(u32::from(v4)) << 96,
                IpAddr::V6(v6) => u128::from(v6),
            }
        };
        if self.ip.is_ipv4() != peer.is_ipv4() || self.ip == peer || self.prefix == 0 {
            return false;
        }
        let mask = u128::MAX << (128 - u32::from(self.prefix.min(128)));
        bits(self.ip) & mask == bits(peer) & mask
    }
}

/// Container and VM bridges and their ports: never the address a remote rank reaches (the
/// default pick of the rendezvous's interface skips them, as NCCL does).
const BRIDGES: [&str; 3] = ["docker", "virbr", "veth"];
/// ...and, for planes, more kinds of virtual networks that every host may have alike.
const VIRTUAL: [&str; 6] = ["br-", "cni", "flannel", "cali", "vxlan", "lxc"];

fn bridge(name: &str) -> bool {
    BRIDGES.iter().any(|p| name.starts_with(p))
}

/// Interfaces that are never a network plane to another host.
fn virtual_bridge(name: &str) -> bool {
    bridge(name) || VIRTUAL.iter().any(|p| name.starts_with(p))
}

/// Planes found without `CCL_SOCKET_IFNAME`: the interface of `primary` (the address this
/// rank reached the rendezvous from) first, then every other up interface with an address of
/// the same family that is not loopback nor a virtual bridge and whose link speed (as the
/// kernel reports it: `/sys/class/net/NAME/speed`; where it reports none, no other interface
/// is taken) is the primary's, by name; at most `max`, an
/// address each. One (or none, when `primary` is loopback or on no interface) means one plane.
pub fn auto_planes(primary: IpAddr, max: usize) -> Result<Vec<UpAddr>> {
    Ok(choose_auto_planes(
        primary,
        &up_addresses()?,
        max,
        &link_speed,
    ))
}

/// Planes among other ports' addresses (verbs ports' RoCE addresses, in the order their ports
/// were chosen) found without a setting: for each of `ips`, its interface's address when
/// [`auto_planes`] of `primary` (the first port's address) would take that interface and no
/// earlier one of `ips` is on it; else `None`. The first element is `primary`'s own.
pub fn plane_interfaces(primary: IpAddr, ips: &[IpAddr]) -> Result<Vec<Option<UpAddr>>> {
    Ok(choose_plane_interfaces(
        primary,
        ips,
        &up_addresses()?,
        &link_speed,
    ))
}

fn choose_plane_interfaces(
    primary: IpAddr,
    ips: &[IpAddr],
    up: &[UpAddr],
    speed: &dyn Fn(&str) -> Option<i64>,
) -> Vec<Option<UpAddr>> {
    let like = choose_auto_planes(primary, up, usize::MAX, speed);
    let mut taken: Vec<&str> = Vec::new();
    std::iter::once(&primary)
        .chain(ips)
        .map(|ip| {
            let a = up.iter().find(|a| a.ip == *ip)?;
            if !like.iter().any(|l| l.name == a.name) || taken.contains(&a.name.as_str()) {
                return None;
            }
            taken.push(&a.name);
            Some(a.clone())
        })
        .collect()
}

fn link_speed(name: &str) -> Option<i64> {
    let s = std::fs::read_to_string(format!("/sys/class/net/{name}/speed")).ok()?;
    s.trim().parse().ok().filter(|&v: &i64| v > 0)
}

fn choose_auto_planes(
    primary: IpAddr,
    up: &[UpAddr],
    max: usize,
    speed: &dyn Fn(&str) -> Option<i64>,
) -> Vec<UpAddr> {
    let Some(first) = up.iter().find(|a| a.ip == primary && !a.loopback) else {
        return Vec::new();
    };
    // Links whose speed the kernel does not know (virtual NICs, dummies) are not known to be
    // alike: no plane beside such a primary, and none such beside another.
    let pace = speed(&first.name);
    let mut others: Vec<&UpAddr> = Vec::new();
    for a in up {
        if pace.is_none()
            || a.loopback
            || a.name == first.name
            || a.ip.is_ipv4() != primary.is_ipv4()
            || virtual_bridge(&a.name)
            || others.iter().any(|o| o.name == a.name)
            || speed(&a.name) != pace
        {
            continue;
        }
        others.push(a);
    }
    others.sort_by(|a, b| a.name.cmp(&b.name));
    std::iter::once(first)
        .chain(others)
        .take(max)
        .cloned()
        .collect()
}

/// Every address of every up interface.
fn up_addresses() -> Result<Vec<UpAddr>> {
    let addrs = nix::ifaddrs::getifaddrs()
        .map_err(|e| Error::io(ErrorKind::System, "listing network interfaces", e.into()))?;
    let mut candidates: Vec<UpAddr> = Vec::new();
    for ifa in addrs {
        let up = ifa.flags.contains(nix::net::if_::InterfaceFlags::IFF_UP);
        let Some(addr) = ifa.address else { continue };
        let (ip, prefix) = if let Some(v4) = addr.as_sockaddr_in() {
            let mask = ifa
                .netmask
                .as_ref()
                .and_then(|m| m.as_sockaddr_in())
                .map_or(32, |m| u32::from(m.ip()).count_ones());
            (IpAddr::V4(v4.ip()), mask as u8)
        } else if let Some(v6) = addr.as_sockaddr_in6() {
            let ip = v6.ip();
            // Link-local IPv6 needs a scope id that a peer on another host cannot use.
            if (ip.segments()[0] & 0xffc0) == 0xfe80 {
                continue;
            }
            let mask = ifa
                .netmask
                .as_ref()
                .and_then(|m| m.as_sockaddr_in6())
                .map_or(128, |m| u128::from(m.ip()).count_ones());
            (IpAddr::V6(ip), mask as u8)
        } else {
            continue;
        };
        if up {
            candidates.push(UpAddr {
                name: ifa.interface_name,
                ip,
                loopback: ip.is_loopback(),
                prefix,
            });
        }
    }
    Ok(candidates)
}

fn pick_from(spec: Option<&str>, candidates: &[UpAddr]) -> Result<IpAddr> {
    if let Some(spec) = spec {
        // Prefer IPv4 among the matches, then IPv6.
        let mut m: Vec<_> = candidates
            .iter()
            .filter(|a| ifname_matches(spec, &a.name))
            .collect();
        m.sort_by_key(|a| !a.ip.is_ipv4());
        return m.first().map(|a| a.ip).ok_or_else(|| {
            let names: Vec<_> = candidates.iter().map(|a| a.name.as_str()).collect();
            Error::invalid_argument(format!(
                "CCL_SOCKET_IFNAME='{spec}' matches no interface that is up (interfaces: {})",
                names.join(", ")
            ))
        });
    }
    let skip = bridge;
    candidates
        .iter()
        .filter(|a| !a.loopback && a.ip.is_ipv4() && !skip(&a.name))
        .chain(candidates.iter().filter(|a| !a.loopback && !skip(&a.name)))
        .map(|a| a.ip)
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

    fn up(name: &str, ip: IpAddr, loopback: bool) -> UpAddr {
        UpAddr {
            name: name.into(),
            ip,
            loopback,
            prefix: if ip.is_ipv4() { 24 } else { 64 },
        }
    }

    fn v4(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(a, b, c, d))
    }

    #[test]
    fn on_link_is_the_same_network_and_not_the_address_itself() {
        let a = up("p0", v4(10, 77, 1, 1), false);
        assert!(a.on_link(v4(10, 77, 1, 2)));
        assert!(!a.on_link(v4(10, 77, 2, 2)), "another /24");
        assert!(
            !a.on_link(v4(10, 77, 1, 1)),
            "itself (a bridge every host has alike)"
        );
        assert!(!a.on_link(IpAddr::V6(Ipv6Addr::LOCALHOST)));
        let wide = UpAddr {
            prefix: 16,
            ..a.clone()
        };
        assert!(wide.on_link(v4(10, 77, 200, 9)));
        let v6 = up(
            "p1",
            IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 1, 0, 0, 0, 1)),
            false,
        );
        assert!(v6.on_link(IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 1, 0, 0, 0, 9))));
        assert!(!v6.on_link(IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 2, 0, 0, 0, 9))));
    }

    #[test]
    fn auto_planes_are_the_primarys_peers() {
        let c = vec![
            up("lo", IpAddr::V4(Ipv4Addr::LOCALHOST), true),
            up("mgmt0", v4(192, 168, 0, 5), false),
            up("docker0", v4(172, 17, 0, 1), false),
            up("p1", v4(10, 77, 2, 1), false),
            up("p1", v4(10, 77, 3, 1), false),
            up("p0", v4(10, 77, 1, 1), false),
            up(
                "p2",
                IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 1, 0, 0, 0, 1)),
                false,
            ),
        ];
        let speed = |n: &str| match n {
            "mgmt0" => Some(1000),
            "docker0" | "lo" => None,
            _ => Some(100_000),
        };
        let names = |v: Vec<UpAddr>| v.into_iter().map(|a| (a.name, a.ip)).collect::<Vec<_>>();
        // The primary first; the other port of its speed and family once; not the slower
        // management port, the bridge, loopback or the IPv6-only port.
        assert_eq!(
            names(choose_auto_planes(v4(10, 77, 1, 1), &c, 4, &speed)),
            [
                ("p0".into(), v4(10, 77, 1, 1)),
                ("p1".into(), v4(10, 77, 2, 1))
            ]
        );
        assert_eq!(choose_auto_planes(v4(10, 77, 1, 1), &c, 1, &speed).len(), 1);
        // A primary on the management port has no sibling of its speed: one plane.
        assert_eq!(
            choose_auto_planes(v4(192, 168, 0, 5), &c, 4, &speed).len(),
            1
        );
        // Links of unknown speed are not known to be alike.
        let unknown = |n: &str| (n == "p0").then_some(100_000);
        assert_eq!(
            choose_auto_planes(v4(10, 77, 1, 1), &c, 4, &unknown).len(),
            1
        );
        assert_eq!(
            choose_auto_planes(v4(10, 77, 2, 1), &c, 4, &|_: &str| None).len(),
            1
        );
        // Loopback, or an address on no interface: none (one plane, as before).
        assert!(choose_auto_planes(IpAddr::V4(Ipv4Addr::LOCALHOST), &c, 4, &speed).is_empty());
        assert!(choose_auto_planes(v4(1, 2, 3, 4), &c, 4, &speed).is_empty());
    }

    #[test]
    fn other_ports_are_planes_where_their_interfaces_would_be() {
        let c = vec![
            up("mgmt0", v4(192, 168, 0, 5), false),
            up("p0", v4(10, 77, 1, 1), false),
            up("p1", v4(10, 77, 2, 1), false),
            up("p1", v4(10, 77, 3, 1), false),
            up("p3", v4(10, 77, 4, 1), false),
        ];
        let speed = |n: &str| match n {
            "mgmt0" => Some(1000),
            _ => Some(100_000),
        };
        let names =
            |v: Vec<Option<UpAddr>>| v.into_iter().map(|a| a.map(|a| a.name)).collect::<Vec<_>>();
        // The second port of p1 shares an interface with the first (one plane per link), the
        // management port is slower, an address on no interface is no plane.
        assert_eq!(
            names(choose_plane_interfaces(
                v4(10, 77, 1, 1),
                &[
                    v4(10, 77, 2, 1),
                    v4(10, 77, 3, 1),
                    v4(192, 168, 0, 5),
                    v4(1, 2, 3, 4),
                    v4(10, 77, 4, 1)
                ],
                &c,
                &speed
            )),
            [
                Some("p0".into()),
                Some("p1".into()),
                None,
                None,
                None,
                Some("p3".into())
            ]
        );
        // A primary on no interface: nothing (one plane).
        assert_eq!(
            names(choose_plane_interfaces(
                v4(9, 9, 9, 9),
                &[v4(10, 77, 2, 1)],
                &c,
                &speed
            )),
            [None, None]
        );
    }

    #[test]
    fn picking() {
        let c = vec![
            up("lo", IpAddr::V4(Ipv4Addr::LOCALHOST), true),
            up("docker0", IpAddr::V4(Ipv4Addr::new(172, 17, 0, 1)), false),
            up(
                "eth0",
                IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1)),
                false,
            ),
            up("eth0", IpAddr::V4(Ipv4Addr::new(10, 0, 0, 5)), false),
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
