//! What arrives at the root's listener while it watches: live clients (`ccl-trace --live`,
//! presenting the secret), each answered with every rank's state and the verdict, and ranks that
//! join the root directly (their hub died or left, or they follow the monitor to the standby
//! that took it over). [`live_query`] is a live client's side.

use std::io::Read;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::root::{Client, Link, Watch};
use crate::LOG_SUBSYS;
use crate::timing::{CLIENT_GRACE, ERROR_WORD, LINE_WRITE};
use crate::wire::{self, Frame, FrameKind};
use ccl_core::{ccl_trace, ccl_warn};
use ccl_diag::verdict as diag;

/// Most live clients, and ranks joining after their hub died, served at once (more are
/// dropped).
const MAX_CLIENTS: usize = 1024;

impl Watch<'_> {
    /// Takes the line of a rank whose hub died (or left) as that rank's own, if it presents the
    /// job's secret and the rank is still watched.
    fn adopt(&mut self, c: Client, join: &Frame, after: Vec<Frame>) {
        let rejoin = wire::Rejoin::decode(join);
        let joined = match &rejoin {
            Some(j) => Some((j.secret, j.rank)),
            None => wire::read_join(join),
        };
        let r = match joined {
            Some((secret, r))
                if ccl_core::transport::handshake::secrets_equal(&secret, &self.secret)
                    && r < self.ranks.len()
                    && self.ranks[r].open =>
            {
                r
            }
            Some((secret, r))
                if rejoin.is_some()
                    && ccl_core::transport::handshake::secrets_equal(&secret, &self.secret) =>
            {
                // One of the job's ranks, named dead or gone here: it must not look for another
                // monitor, so it hears why instead of a closed line.
                let why = format!(
                    "rank {r} is no longer watched by the job's monitor at {} (it was named dead or left)",
                    self.addr
                );
                ccl_warn!(None, "bootstrap root {}: {why}", self.addr);
                let mut s = c.stream;
                let _ = s.set_nonblocking(false);
                let _ = wire::write_frame(
                    &mut s,
                    &Frame::error(&why),
                    Instant::now() + LINE_WRITE.get(),
                );
                return;
            }
            _ => {
                ccl_warn!(
                    None,
                    "bootstrap root {}: refused a monitor line from {}: not a watched rank of this job with its secret",
                    self.addr,
                    c.from
                );
                return;
            }
        };
        if let Some(j) = rejoin {
            self.recovery.on_rejoin(r, j.round);
            self.ranks[r].host = j.host;
            self.ranks[r].pid = j.pid;
            // The root that died had named them; the ranks have heard already.
            let n = self.ranks.len();
            for d in j.dead.into_iter().filter(|&d| d < n && d != r) {
                let w = &mut self.ranks[d];
                if w.open && w.link.is_none() {
                    w.open = false;
                    w.quiet = true;
                }
            }
        }
        ccl_trace!(
            None,
            "bootstrap root {}: rank {r} reports here directly now",
            self.addr
        );
        let mut link = Link::new(r, c.stream);
        link.buf = c.buf;
        self.links.push(link);
        let l = self.links.len() - 1;
        let w = &mut self.ranks[r];
        w.link = Some(l);
        w.orphaned = None;
        w.frames.extend(after);
        // What its hub may have taken with it (a rank ignores a notice it already has), and
        // what had no way to it.
        let missed: Vec<Frame> = std::iter::once(self.standby.encode())
            .chain(self.told.iter().cloned())
            .chain(std::mem::take(&mut self.ranks[r].undelivered))
            .collect();
        for f in &missed {
            self.links[l].send(f);
        }
    }

    /// Accepts live clients, and answers each that presents the secret with every rank's state
    /// and the verdict. A client without the secret is dropped unanswered.
    pub(super) fn serve_clients(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((s, from)) if self.clients.len() < MAX_CLIENTS => {
                    let _ = s.set_nonblocking(true);
                    self.clients.push(Client {
                        stream: s,
                        from,
                        buf: Vec::new(),
                        by: Instant::now() + CLIENT_GRACE.get(),
                    });
                }
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        let mut i = 0;
        while i < self.clients.len() {
            let c = &mut self.clients[i];
            let mut chunk = [0u8; 256];
            let mut closed = false;
            loop {
                match (&c.stream).read(&mut chunk) {
                    Ok(0) => {
                        closed = true;
                        break;
                    }
                    Ok(k) if c.buf.len() < 4096 => c.buf.extend_from_slice(&chunk[..k]),
                    Ok(_) => {
                        closed = true;
                        break;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
            let mut frames = wire::take_frames(&mut c.buf)
                .unwrap_or_default()
                .into_iter();
            let Some(frame) = frames.next() else {
                if closed || Instant::now() >= c.by {
                    self.clients.swap_remove(i);
                } else {
                    i += 1;
                }
                continue;
            };
            let c = self.clients.swap_remove(i);
            if matches!(frame.kind, FrameKind::Join | FrameKind::Rejoin) {
                self.adopt(c, &frame, frames.collect());
                continue;
            }
            let ok = wire::query_secret(&frame)
                .is_some_and(|s| ccl_core::transport::handshake::secrets_equal(&s, &self.secret));
            if !ok {
                ccl_warn!(
                    None,
                    "bootstrap root {}: refused a live query from {}: not a query with this job's secret",
                    self.addr,
                    c.from
                );
                continue;
            }
            let views = self.gather(None);
            let text = diag::live_report(&views, self.ranks.len());
            let mut s = c.stream;
            let _ = s.set_nonblocking(false);
            let by = Instant::now() + ERROR_WORD.get();
            let _ = wire::write_frame(
                &mut s,
                &Frame::new(FrameKind::Report, text.into_bytes()),
                by,
            );
        }
    }
}

/// Asks the running job whose rendezvous is at `root` for every rank's state and the verdict
/// (what `ccl-trace --live` prints), presenting `secret`. Nothing stops or slows the job beyond
/// each rank answering one query. A root that refuses the secret closes the connection
/// unanswered: that is an error here, and the caller learns nothing of the job.
pub fn live_query(
    root: SocketAddr,
    secret: &[u8; 32],
    timeout: Duration,
) -> ccl_core::error::Result<String> {
    use ccl_core::error::Error;
    let deadline = Instant::now() + timeout;
    let what = || format!("live query to the job's rendezvous at {root}");
    let mut s = ccl_core::net::connect_by(root, deadline, &what)?;
    wire::write_frame(&mut s, &wire::query(secret), deadline).map_err(|e| e.context(what()))?;
    let f = wire::read_frame(&mut s, deadline, &|| "waiting for the answer".to_string())
        .map_err(|e| {
            Error::remote(format!(
                "{}: no answer ({}): a wrong secret, a job that has not finished connecting or has ended, or another service at that address",
                what(),
                e.message()
            ))
        })?;
    match f.kind {
        FrameKind::Report => Ok(String::from_utf8_lossy(&f.payload).into_owned()),
        k => Err(Error::remote(format!("{}: the root sent {k:?}", what()))),
    }
}
