//! Receiving from any source: finding a peer whose next operation toward this rank is a send.
//!
//! Every operation puts its header on the wire before its data, whether or not the receiver
//! has started the matching call, and between operations each peer's stream stands at a
//! header. So the peers whose streams start with a point-to-point header are exactly the ones
//! whose sends to this rank wait to be received. The probe reads those headers (never data)
//! into [`ExecState::early`]; the next operation that expects a header from that peer starts
//! from it (`Run::queue_headers`) and checks it as if it had just arrived. Reading one header
//! ahead therefore changes nothing on the wire, and a header that turns out to open a
//! collective simply waits there for the collective.

use super::*;

/// A peer's header read ahead of its operation, and how much of it has arrived.
#[derive(Debug)]
pub(super) struct Early {
    pub peer: usize,
    pub header: [u8; HEADER_LEN],
    pub got: usize,
}

/// A send waiting to be received, found by [`Communicator::probe`](crate::Communicator::probe).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Probed {
    /// The sending peer.
    pub peer: usize,
    /// How many bytes its operation sends to this rank (all its sends to this rank in its group).
    pub bytes: usize,
}

/// What a peer's stream says about its next operation toward this rank.
enum Next {
    /// Nothing whole has arrived yet.
    Unknown,
    /// A point-to-point send of this many bytes.
    Send(usize),
    /// Another operation (described only if the probe fails: it is read on every pass).
    Other(Header),
}

impl ExecState {
    /// Takes the header read ahead from `peer`, if any.
    pub(super) fn take_early(&mut self, peer: usize) -> Option<Early> {
        let i = self.early.iter().position(|e| e.peer == peer)?;
        Some(self.early.swap_remove(i))
    }

    /// Reads what has arrived of `peer`'s next header into [`ExecState::early`] and says what
    /// it announces.
    fn read_early(&mut self, links: &mut Links, peer: usize) -> Result<Next> {
        let i = match self.early.iter().position(|e| e.peer == peer) {
            Some(i) => i,
            None => {
                self.early.push(Early {
                    peer,
                    header: [0; HEADER_LEN],
                    got: 0,
                });
                self.early.len() - 1
            }
        };
        let e = &mut self.early[i];
        if e.got < HEADER_LEN {
            let (got, want) = (e.got, HEADER_LEN - e.got);
            let into = &mut e.header;
            // A message-based transport lends one message at a time: take only header bytes.
            let mut taken = 0;
            let k = links
                .get(peer)?
                .recv_with(want, &mut |b: &[u8]| {
                    let t = b.len().min(want - taken);
                    into[got + taken..got + taken + t].copy_from_slice(&b[..t]);
                    taken += t;
                    t
                })
                .map_err(|e| {
                    e.peer(peer).context(format!(
                        "receiving from any source: reading peer {peer}'s next operation header"
                    ))
                })?;
            e.got += k;
        }
        if e.got == 0 {
            self.early.swap_remove(i);
            return Ok(Next::Unknown);
        }
        if e.got < HEADER_LEN {
            return Ok(Next::Unknown);
        }
        let h = Header::decode(&e.header).map_err(|m| {
            Error::invalid_usage(format!("with peer {peer}: {m}"))
                .peer(peer)
                .context("receiving from any source")
        })?;
        Ok(if h.kind == KIND_P2P {
            Next::Send(h.bytes as usize)
        } else {
            Next::Other(h)
        })
    }
}

/// Waits until some peer's next operation toward this rank is a send (of a group of sends and
/// receives), and returns it, lowest rank first when several are. The send stays to be
/// received. Fails after `CCL_TIMEOUT` with no such send, naming what each peer has announced
/// instead; the streams stay in step, so a failed probe leaves the communicator usable.
pub(crate) fn probe(comm: &Peers, links: &mut Links, st: &mut ExecState) -> Result<Probed> {
    comm.check()?;
    let me = comm.rank();
    let timeout = comm.config().timeout;
    let spin = comm.spin_window();
    let yields = shares_cpus(comm, st);
    let start = Instant::now();
    let recv = Interest {
        send: false,
        recv: true,
    };
    let mut waits: Vec<(usize, Interest)> = Vec::new();
    let mut others: Vec<(usize, Header)> = Vec::new();
    loop {
        comm.check_aborted()?;
        // A peer that sends to this rank for the first time connects first (`CCL_CONNECT=lazy`).
        comm.adopt_connections(links);
        waits.clear();
        others.clear();
        for peer in 0..links.endpoints.len() {
            if peer == me || !links.has(peer) {
                continue;
            }
            match st.read_early(links, peer)? {
                Next::Send(bytes) => return Ok(Probed { peer, bytes }),
                Next::Other(what) => others.push((peer, what)),
                Next::Unknown => waits.push((peer, recv)),
            }
        }
        let waited = start.elapsed();
        if waited >= timeout {
            return Err(no_sender(me, waited, &others, &waits));
        }
        if waited < spin {
            if yields {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
            continue;
        }
        comm.block(links, &waits, None, timeout - waited, true, || {})?;
    }
}

/// The error of a probe that found no send for `waited`.
fn no_sender(
    me: usize,
    waited: Duration,
    others: &[(usize, Header)],
    silent: &[(usize, Interest)],
) -> Error {
    let mut what = format!(
        "receiving from any source: no peer sent to rank {me} within {:.1} s",
        waited.as_secs_f64()
    );
    for (p, op) in others {
        let _ = write!(
            what,
            "; peer {p}'s next operation here is {}",
            op.describe()
        );
    }
    if !silent.is_empty() {
        // Hundreds of ranks would drown the message: the first few say enough.
        let list: Vec<String> = silent.iter().take(8).map(|(p, _)| p.to_string()).collect();
        let more = silent.len().saturating_sub(list.len());
        let _ = write!(what, "; nothing arrived from peer(s) {}", list.join(", "));
        if more > 0 {
            let _ = write!(what, " and {more} more");
        }
    }
    what.push_str(" (peers never connected to this rank have sent nothing to it)");
    Error::timeout(what).rank(me)
}
