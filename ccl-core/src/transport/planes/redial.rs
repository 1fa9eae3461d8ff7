//! A failed plane's connection made again.
//!
//! Both ends must have dropped their side of the failed connection before either sets up the
//! new one (a verbs connection's set-up talks over the plane's side channel, which the old
//! connection reads while it lives). So: the end that saw the plane fail drops its side (on the
//! plane's redial thread: a verbs connection's drop may wait seconds for its sends) and then
//! sends a notice on another plane; the peer, on the notice, fails the plane too, drops its
//! side and sends its own notice; each end starts making the connection once it has sent its
//! notice and received the peer's. Notices name the plane's generation, so a late one is never taken for the next
//! failure. The new connection starts a new generation: its counts start from zero at both ends,
//! and acks name the generation they count.

use super::*;

impl Inner {
    /// Plane `i` just failed (others are left): its connection is put aside and, where the
    /// transport can make it again, dropped on a thread of its own that then makes it again.
    pub(super) fn after_death(&mut self, i: usize) {
        let p = &mut self.planes[i];
        let old = std::mem::replace(&mut p.link, Link::Gone);
        let Some(how) = p.redial.how.take() else {
            return;
        };
        let (me, generation, name, peer) =
            (self.me.clone(), p.generation, p.name.clone(), self.peer);
        let spawned = std::thread::Builder::new()
            .name("ccl-plane-redial".into())
            .spawn(move || redial_thread(me, i, generation, old, how));
        if let Err(e) = spawned {
            ccl_warn!(
                None,
                "{name} to peer {peer} stays failed: no thread to make it again ({e})"
            );
        }
    }

    /// Queues on plane `i` the notice that plane `j` is to be made again.
    pub(super) fn redial_notice(&mut self, i: usize, j: usize) {
        let q = &mut self.planes[j];
        q.redial.due = false;
        q.redial.sent = true;
        let mut head = [0u8; HDR + ACK_MAX];
        let word = u64::from(q.generation) | q.redial.offer << 8;
        head[..HDR].copy_from_slice(&header(REDIAL, j as u8, 0, word));
        self.planes[i].tx = Some(Tx {
            head,
            head_len: HDR,
            off: 0,
            len: 0,
            done: 0,
        });
    }

    /// A plane just failed: a notice it carried may be lost with it, so every notice the peer
    /// has not answered goes again (the peer ignores one it already has).
    pub(super) fn resend_notices(&mut self) {
        for q in &mut self.planes {
            if q.state == State::Dead && q.redial.sent && !q.redial.heard {
                q.redial.sent = false;
                q.redial.due = true;
            }
        }
    }

    /// The peer's notice that plane `j` is to be made again: its generation in the low byte,
    /// the peer's offer above.
    pub(super) fn on_redial(&mut self, j: usize, word: u64) {
        let Some(p) = self.planes.get_mut(j) else {
            return;
        };
        if p.generation != word as u8 || p.redial.heard {
            return;
        }
        p.redial.heard = true;
        p.redial.peer_offer = word >> 8;
        if p.state != State::Dead {
            let e = Error::remote(format!(
                "{} to peer {}: the peer saw it fail and makes it again",
                p.name(),
                self.peer
            ))
            .peer(self.peer);
            // Another plane brought the notice: this is not the last one.
            let _ = self.plane_failed(j, e);
        }
    }

    /// The redial thread's result for plane `i` (of generation `generation`).
    fn redialed(&mut self, i: usize, generation: u8, how: Box<dyn Redial>, r: Result<Remade>) {
        let peer = self.peer;
        if !still_waits(self, i, generation) {
            return;
        }
        let p = &mut self.planes[i];
        let made = r.and_then(|remade| match remade {
            Remade::Socket(s) => {
                s.set_nonblocking(true).map_err(|e| {
                    Error::io(ErrorKind::System, "setting the new socket non-blocking", e)
                })?;
                let s = Arc::new(s);
                Ok((vec![WaitFd::tcp(i, &s)], Link::Tcp(s)))
            }
            Remade::Endpoint(ep) => {
                let fds = WaitFd::of_endpoint(i, &*ep)
                    .map_err(|e| Error::io(ErrorKind::System, "copying its wait descriptors", e))?;
                Ok((fds, Link::Endpoint(ep)))
            }
        });
        let (fds, link) = match made {
            Ok(made) => made,
            Err(e) => {
                ccl_warn!(
                    None,
                    "{} to peer {peer} stays failed: making it again failed ({e})",
                    p.name()
                );
                return;
            }
        };
        let now = Instant::now();
        p.link = link;
        p.state = State::Up;
        p.generation = generation.wrapping_add(1);
        p.read_base = p.read;
        p.tx = None;
        p.sent.clear();
        p.wrote = 0;
        p.peer_read = 0;
        p.moved = now;
        p.heard = now;
        p.suspect = None;
        p.rate = 0.0;
        p.ack_due = false;
        p.ping_due = false;
        p.rx = Rx::Header(0);
        p.redial = Redialing {
            how: Some(how),
            ..Redialing::default()
        };
        self.new_fds.push((i, fds));
        self.redials += 1;
        ccl_warn!(
            None,
            "{} to peer {peer} is made again (connection {}); it takes its share of new frames",
            p.name(),
            p.generation
        );
    }
}

/// Whether plane `i`, failed in its connection of `generation`, still waits to be made again:
/// not when the endpoint failed or is closing, nor once the plane moved on.
fn still_waits(g: &Inner, i: usize, generation: u8) -> bool {
    g.failed.is_none()
        && !g.closing
        && g.planes[i].generation == generation
        && g.planes[i].state == State::Dead
}

fn lock(inner: &Mutex<Inner>) -> std::sync::MutexGuard<'_, Inner> {
    inner.lock().unwrap_or_else(|p| p.into_inner())
}

/// Plane `i`'s way back: drops its failed connection, has the notice (with this end's offer)
/// sent, waits for the peer's, makes the connection again and hands it to the endpoint (if it
/// still exists and the plane still waits for it). Every wait ends soon after the endpoint is
/// dropped, fails or closes.
fn redial_thread(
    me: Weak<Mutex<Inner>>,
    i: usize,
    generation: u8,
    old: Link,
    mut how: Box<dyn Redial>,
) {
    drop(old);
    let offer = how.offer();
    {
        let Some(inner) = me.upgrade() else { return };
        let mut g = lock(&inner);
        if !still_waits(&g, i, generation) {
            return;
        }
        let offer = match offer {
            Ok(offer) => offer,
            Err(e) => {
                let (name, peer) = (g.planes[i].name.clone(), g.peer);
                drop(g);
                ccl_warn!(None, "{name} to peer {peer} stays failed: {e}");
                return;
            }
        };
        g.planes[i].redial.offer = offer;
        if !g.planes[i].redial.sent {
            g.planes[i].redial.due = true;
        }
        drop(g);
        keeper().poke();
    }
    let until = Instant::now() + REDIAL_WAIT;
    let peer_offer = loop {
        let Some(inner) = me.upgrade() else { return };
        let g = lock(&inner);
        if !still_waits(&g, i, generation) || Instant::now() >= until {
            return;
        }
        if g.planes[i].redial.sent && g.planes[i].redial.heard {
            break g.planes[i].redial.peer_offer;
        }
        drop(g);
        drop(inner);
        std::thread::sleep(Duration::from_millis(1));
    };
    let watched = me.clone();
    let call = RedialCall {
        deadline: until,
        offer: peer_offer,
        wanted: Arc::new(move || {
            watched
                .upgrade()
                .is_some_and(|inner| still_waits(&lock(&inner), i, generation))
        }),
    };
    let r = how.redial(call);
    if let Some(inner) = me.upgrade() {
        lock(&inner).redialed(i, generation, how, r);
    }
}
