//! Several planes: the connector's side (a connection per plane, named by a token, then a
//! commit saying which connected) and the listener's (planes grouped by peer and token until
//! the commit says the set is complete), each set made one [`Striped`] endpoint.

use super::*;

/// Connections to a listener with several planes: after the handshake the connector says which
/// endpoint and plane the connection is ([`PathHeader`]).
pub(super) const PLANES_MAGIC: Magic = Magic {
    hello: *b"CCLTCP\x01P",
    ack: *b"CCLTCP\x01Q",
};
/// Once one plane to a peer connected, how long each other plane may take.
const PLANE_GRACE: Duration = Duration::from_secs(2);

/// What a connection to a listener with several planes says after the handshake: which of the
/// connector's endpoints it belongs to (a token), which plane it is, and whether it is the
/// first that connected (the one that will carry the [`Commit`]).
struct PathHeader {
    token: u64,
    plane: u32,
    primary: bool,
}

impl PathHeader {
    const LEN: usize = 20;
    const MAGIC: [u8; 4] = *b"CCLP";

    fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[..4].copy_from_slice(&Self::MAGIC);
        b[4..8].copy_from_slice(&(self.plane | (u32::from(self.primary) << 31)).to_le_bytes());
        b[8..16].copy_from_slice(&self.token.to_le_bytes());
        b[16..20].copy_from_slice(&(MAX_PLANES as u32).to_le_bytes());
        b
    }

    fn decode(b: &[u8; Self::LEN]) -> Option<PathHeader> {
        let word = u32::from_le_bytes(b[4..8].try_into().ok()?);
        let plane = word & !(1 << 31);
        (b[..4] == Self::MAGIC && (plane as usize) < MAX_PLANES).then(|| PathHeader {
            token: u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
            plane,
            primary: word >> 31 == 1,
        })
    }
}

/// Sent on the first plane once the connector tried every plane: which of them connected.
const COMMIT_LEN: usize = 12;
const COMMIT_MAGIC: [u8; 4] = *b"CCLC";

/// A token that no other endpoint of this process shares (the listener groups a peer's planes
/// by it).
fn next_token(rank: usize) -> u64 {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let n = COUNT.fetch_add(1, Ordering::Relaxed);
    (u64::from(std::process::id()) << 32) ^ ((rank as u64) << 20) ^ n
}

impl TcpTransport {
    /// A connection on each plane both ranks have, striped ([`Striped`]). A plane that does
    /// not connect within [`PLANE_GRACE`] of the first one is left out (logged); the endpoint
    /// fails only when none connects by `deadline`.
    pub(super) fn connect_planes(
        &self,
        ctx: &ConnectContext,
        peer: usize,
        addrs: &[SocketAddr],
        deadline: Instant,
    ) -> Result<Box<dyn Endpoint>> {
        let planes = self.pairing(ctx, addrs)?;
        let token = next_token(ctx.rank);
        let plane = |i: usize, primary: bool, until: Instant| -> Result<PlaneConn> {
            let mut s = connect_stream(ctx, peer, addrs[i], &PLANES_MAGIC, until)?;
            let h = PathHeader {
                token,
                plane: i as u32,
                primary,
            };
            let what = || format!("TCP plane {i} to peer {peer} at {}", addrs[i]);
            net::write_all_by(&mut s, &h.encode(), until, &what)
                .map_err(|e| e.rank(ctx.rank).peer(peer))?;
            let local = s
                .local_addr()
                .map_err(|e| Error::io(ErrorKind::System, what(), e).rank(ctx.rank))?;
            Ok(PlaneConn {
                plane: i,
                stream: s,
                local,
                remote: addrs[i],
            })
        };
        // The first plane: each in turn, a grace each, until one connects or the deadline.
        let mut conns: Vec<PlaneConn> = Vec::with_capacity(planes.len());
        let mut errors: Vec<Option<Error>> = planes.iter().map(|_| None).collect();
        while conns.is_empty() {
            for (&i, slot) in planes.iter().zip(errors.iter_mut()) {
                match plane(i, true, deadline.min(Instant::now() + PLANE_GRACE)) {
                    Ok(c) => {
                        conns.push(c);
                        break;
                    }
                    Err(e) => *slot = Some(e),
                }
            }
            let timed_out = errors
                .iter()
                .flatten()
                .any(|e| e.kind() == ErrorKind::Timeout);
            if conns.is_empty() && (Instant::now() >= deadline || !timed_out) {
                let all: Vec<String> = planes
                    .iter()
                    .zip(&errors)
                    .filter_map(|(i, e)| e.as_ref().map(|e| format!("plane {i}: {e}")))
                    .collect();
                return Err(Error::remote(format!(
                    "TCP connect to peer {peer}: no plane connected ({})",
                    all.join("; ")
                ))
                .rank(ctx.rank)
                .peer(peer));
            }
        }
        let first = conns[0].plane;
        for &i in planes.iter().filter(|&&i| i != first) {
            match plane(i, false, deadline.min(Instant::now() + PLANE_GRACE)) {
                Ok(c) => conns.push(c),
                Err(e) => ccl_warn!(
                    Some(ctx.rank),
                    "TCP plane {i} to peer {peer} at {} did not connect ({e}); the connection \
                     goes on the other planes",
                    addrs[i]
                ),
            }
        }
        let mask: u64 = conns.iter().map(|c| 1u64 << c.plane).sum();
        let mut commit = [0u8; COMMIT_LEN];
        commit[..4].copy_from_slice(&COMMIT_MAGIC);
        commit[4..].copy_from_slice(&mask.to_le_bytes());
        let what = || format!("TCP connect to peer {peer}");
        net::write_all_by(&mut conns[0].stream, &commit, deadline, &what)
            .map_err(|e| e.rank(ctx.rank).peer(peer))?;
        plane_endpoint_set(&self.build, ctx, peer, conns, (token, false), deadline)
    }
}

/// The planes of one connecting endpoint, as they arrive.
pub(super) struct Group {
    peer: usize,
    token: u64,
    conns: Vec<PlaneConn>,
    /// Index in `conns` of the plane that carries the commit.
    primary: Option<usize>,
    commit: [u8; COMMIT_LEN],
    got: usize,
    since: Instant,
    /// The commit's plane closed or sent something else.
    broken: bool,
}

impl Group {
    /// The planes the connector says connected, once it said so.
    fn mask(&self) -> Option<u64> {
        (self.got == COMMIT_LEN)
            .then(|| u64::from_le_bytes(self.commit[4..].try_into().expect("8 bytes")))
    }

    fn complete(&self) -> bool {
        let have: u64 = self.conns.iter().map(|c| 1u64 << c.plane).sum();
        self.mask().is_some_and(|m| m & !have == 0)
    }
}

impl TcpListenerImpl {
    /// Accepts planes until one peer's set is complete. The caller's deadline bounds the wait
    /// for a first plane; a set begun is completed (or dropped, logged) within the
    /// communicator's timeout.
    pub(super) fn accept_planes(
        &mut self,
        deadline: Instant,
    ) -> Result<(usize, Box<dyn Endpoint>)> {
        let rank = self.ctx.rank;
        loop {
            if let Some(k) = self.groups.iter().position(Group::complete) {
                let g = self.groups.swap_remove(k);
                let until = Instant::now() + self.ctx.config.timeout;
                let ep = plane_endpoint_set(
                    &self.build,
                    &self.ctx,
                    g.peer,
                    g.conns,
                    (g.token, true),
                    until,
                )?;
                return Ok((g.peer, ep));
            }
            let until = if self.groups.is_empty() {
                deadline
            } else {
                Instant::now() + Duration::from_millis(20)
            };
            let TcpListenerImpl {
                ctx,
                listeners,
                acceptor,
                ..
            } = self;
            let fds: Vec<BorrowedFd<'_>> = listeners.iter().map(|l| l.as_fd()).collect();
            let got = acceptor.accept_any(ctx, &fds, |l| accept_from(&listeners[l]), until);
            match got {
                Ok((peer, stream, from)) => {
                    if let Err(e) = self.add_plane(peer, stream, &from) {
                        ccl_warn!(
                            Some(rank),
                            "TCP transport: dropped a plane from peer {peer} at {from}: {e}"
                        );
                    }
                }
                Err(e) if e.kind() == ErrorKind::Timeout && !self.groups.is_empty() => {}
                Err(e) => return Err(e),
            }
            self.read_commits();
        }
    }

    fn add_plane(&mut self, peer: usize, stream: TcpStream, from: &str) -> Result<()> {
        let until = Instant::now() + self.ctx.config.timeout;
        let mut s = self.finish(stream, from, peer, &PLANES_MAGIC, until)?;
        let mut b = [0u8; PathHeader::LEN];
        let what = || format!("TCP plane from peer {peer} at {from}");
        net::read_exact_by(&mut s, &mut b, until, &what)?;
        let h = PathHeader::decode(&b)
            .ok_or_else(|| Error::remote(format!("{}: bad plane header", what())).peer(peer))?;
        let sys = |e| Error::io(ErrorKind::System, what(), e);
        let conn = PlaneConn {
            plane: h.plane as usize,
            local: s.local_addr().map_err(sys)?,
            remote: s.peer_addr().map_err(sys)?,
            stream: s,
        };
        let k = match self
            .groups
            .iter()
            .position(|g| g.peer == peer && g.token == h.token)
        {
            Some(k) => k,
            None => {
                self.groups.push(Group {
                    peer,
                    token: h.token,
                    conns: Vec::new(),
                    primary: None,
                    commit: [0; COMMIT_LEN],
                    got: 0,
                    since: Instant::now(),
                    broken: false,
                });
                self.groups.len() - 1
            }
        };
        let g = &mut self.groups[k];
        if h.primary {
            conn.stream.set_nonblocking(true).map_err(sys)?;
            g.primary = Some(g.conns.len());
        }
        g.conns.push(conn);
        Ok(())
    }

    /// Reads what arrived of each set's commit; drops sets that took longer than the timeout.
    fn read_commits(&mut self) {
        let rank = self.ctx.rank;
        let timeout = self.ctx.config.timeout;
        self.groups.retain_mut(|g| {
            if let Some(p) = g.primary
                && g.got < COMMIT_LEN
            {
                match (&g.conns[p].stream).read(&mut g.commit[g.got..]) {
                    Ok(0) => g.broken = true,
                    Ok(n) => g.got += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => g.broken = true,
                }
                if g.got == COMMIT_LEN && g.commit[..4] != COMMIT_MAGIC {
                    g.broken = true;
                }
            }
            let keep = !g.broken && g.since.elapsed() < timeout;
            if !keep {
                ccl_warn!(
                    Some(rank),
                    "TCP transport: dropped {} plane(s) from peer {} whose set did not complete \
                     ({})",
                    g.conns.len(),
                    g.peer,
                    if g.broken {
                        "its first plane closed or sent garbage"
                    } else {
                        "timeout"
                    }
                );
            }
            keep
        });
    }
}
