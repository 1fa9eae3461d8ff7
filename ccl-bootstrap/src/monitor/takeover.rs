//! How the job's monitor survives the death of its process. The root names standby ranks
//! (outside its process, listening) and tells every rank; when a rank's line to the root closes
//! without a goodbye, its monitor thread (`Relay::failover`) joins the first standby that
//! answers, and the standby that finds itself first takes the monitor over: it runs a watch of
//! its own on its listener (`Watch::took_over`), where every rank starts cut off and joins it
//! (the tree becomes a star).

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::root::{Client, Watch, Watched};
use super::thread::{Line, Relay};
use super::tree::Tree;
use crate::LOG_SUBSYS;
use crate::timing::{ADOPT_GRACE, CLIENT_GRACE, CONNECT_GRACE};
use crate::wire::{self, Frame, FrameKind};
use ccl_core::{ccl_info, ccl_trace, ccl_warn};

/// Whether process `pid` of this host still runs (a zombie, waiting for its parent to reap
/// it, has ended).
pub(super) fn alive(pid: u32) -> bool {
    ccl_core::log::process_state(pid).is_some_and(|s| !matches!(s, 'Z' | 'X'))
}

/// A rank taking the job's monitor over after the root's process died (see `Relay::failover`).
pub(crate) struct Takeover {
    pub(crate) size: usize,
    /// The rank taking over.
    pub(crate) rank: usize,
    /// The ranks that died with the monitor's process: named dead at once.
    pub(crate) lost: Vec<usize>,
    /// The ranks the old monitor had named dead already.
    pub(crate) dead: Vec<usize>,
    pub(crate) standby: wire::Standby,
    pub(crate) secret: [u8; 32],
    pub(crate) timeout: Duration,
    pub(crate) spawn_root: super::recovery::SpawnRoot,
    /// Every rank's host and process id, if the communicator gave them.
    pub(crate) roster: Option<Vec<(String, u32)>>,
    /// Lines of ranks that asked already, with what they sent.
    pub(crate) clients: Vec<(TcpStream, Vec<u8>)>,
}

impl Takeover {
    /// Runs the job's monitor on `listener`, on a thread of its own, until every rank has gone.
    pub(crate) fn spawn(self, listener: TcpListener) -> std::io::Result<()> {
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        std::thread::Builder::new()
            .name("ccl-monitor-root".into())
            .spawn(move || Watch::took_over(self, &listener, addr).run())?;
        Ok(())
    }
}

impl<'a> Watch<'a> {
    /// The watch of a rank that takes the monitor over: every rank starts cut off and joins it
    /// (the tree becomes a star); those that do not within the timeout (at most
    /// [`ADOPT_GRACE`]) are named dead.
    fn took_over(t: Takeover, listener: &'a TcpListener, addr: SocketAddr) -> Watch<'a> {
        let n = t.size;
        let now = Instant::now();
        let mut ranks: Vec<Watched> = (0..n)
            .map(|r| {
                let (host, pid) = t
                    .roster
                    .as_ref()
                    .and_then(|ro| ro.get(r).cloned())
                    .unwrap_or_default();
                let mut w = Watched::new(host, pid, None);
                w.orphaned = Some(now);
                w.lost_hub = usize::MAX;
                w
            })
            .collect();
        for &d in t.dead.iter().filter(|&&d| d < n) {
            ranks[d].open = false;
            ranks[d].quiet = true;
        }
        let why = format!(
            "its process, which ran the job's monitor, ended (rank {} runs the monitor now)",
            t.rank
        );
        for &d in t.lost.iter().filter(|&&d| d < n) {
            ranks[d].open = false;
            ranks[d].quiet = false;
            ranks[d].why = Some(why.clone());
        }
        // The monitor's ranks had all left before its process ended: the job is ending, and a
        // rank that does not join has most likely left too. It is not named.
        let ending = t.lost.is_empty();
        let gone = |r: &usize| t.lost.contains(r) || t.dead.contains(r);
        let standby = wire::Standby {
            ranks: t
                .standby
                .ranks
                .iter()
                .filter(|(r, _)| !gone(r))
                .copied()
                .collect(),
            with_root: vec![t.rank],
            left: Vec::new(),
        };
        let culprit = t.lost.iter().copied().find(|&d| d < n);
        // The death that moved the monitor is the job's first failure; without one (the root's
        // process ended after its ranks left) the first failure gets a verdict of its own.
        let verdict = culprit.map(|d| {
            let dead = format!("rank {d} ({}:{})", ranks[d].host, ranks[d].pid);
            let line = ccl_diag::culprit::died_with_monitor(&dead, t.rank);
            (line, Some(d))
        });
        let clients = t
            .clients
            .into_iter()
            .filter_map(|(stream, buf)| {
                let from = stream.peer_addr().ok()?;
                let _ = stream.set_nonblocking(true);
                Some(Client {
                    stream,
                    from,
                    buf,
                    by: now + CLIENT_GRACE.get(),
                })
            })
            .collect();
        ccl_info!(
            None,
            "bootstrap: rank {} took the job's monitor over at {addr} (the root's process died)",
            t.rank
        );
        Watch {
            ranks,
            links: Vec::new(),
            tree: Tree::new(n, n),
            settled: true,
            told: Vec::new(),
            listener,
            secret: t.secret,
            addr,
            clients,
            verdict,
            recent: None,
            query_id: 0,
            recovery: super::recovery::Recovery::new(n, addr, t.timeout, t.spawn_root),
            standby,
            adopt_grace: ADOPT_GRACE.get().min(t.timeout),
            took_over: Some(t.rank),
            ending,
        }
    }
}

/// Whether connecting failed because nothing listens there any more (the process ended).
fn refused(e: &ccl_core::Error) -> bool {
    e.os_error()
        .is_some_and(|o| o.kind() == std::io::ErrorKind::ConnectionRefused)
}

impl Relay {
    /// After the root's line closed: moves this rank's monitor line to the first standby rank
    /// that answers (taking the monitor over itself when it is that rank). False when no
    /// standby is known or none is left.
    ///
    /// Only hard evidence passes a standby by: a refused connection, or a line that closes
    /// before the standby answers (its process ended). A standby that takes the connection but
    /// does not answer (stopped) is waited for until the timeout, then this rank gives up: every
    /// rank then fails saying so, rather than some following one monitor and some another.
    pub(super) fn failover(&mut self) -> bool {
        let me = self.s.rank;
        let Some(sb) = self
            .s
            .standby
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        else {
            return false;
        };
        // This rank's hub role ends: its ranks' lines close, and they fail over too.
        self.children.clear();
        self.unjoined.clear();
        self.gathering = None;
        let (lost, mut dead) = self.lost(&sb);
        dead.extend(&lost);
        for &(c, addr) in &sb.ranks {
            if dead.contains(&c) {
                continue;
            }
            if c == me {
                // A rank that is leaving runs no monitor (the others pass it by too).
                if !self.leaving && self.take_over(Vec::new()) {
                    return true;
                }
                continue;
            }
            match self.rejoin(c, addr, &dead) {
                Some(Ok(line)) => {
                    self.switch_up(line, c, addr);
                    return true;
                }
                Some(Err(())) => return false,
                None => dead.push(c),
            }
        }
        ccl_warn!(
            Some(me),
            "monitor: the job's monitor is gone and no standby rank took it over"
        );
        false
    }

    /// The ranks that died with the monitor this rank followed (those that ran in its process
    /// and had not left), and the ranks that are gone already (the monitor said they died, or
    /// they left before its process ended).
    fn lost(&self, sb: &wire::Standby) -> (Vec<usize>, Vec<usize>) {
        // The monitor this rank followed sent its own list (a standby's names itself).
        let (lost, left): (Vec<usize>, Vec<usize>) =
            sb.with_root.iter().partition(|r| !sb.left.contains(r));
        let mut dead = self.s.dead();
        dead.extend(left);
        (lost, dead)
    }

    /// Joins standby `c` at `addr`: the line once `c` answered; `None` when `c` is gone (try
    /// the next one); `Err` when it took the connection but never answered.
    fn rejoin(
        &self,
        c: usize,
        addr: std::net::SocketAddr,
        dead: &[usize],
    ) -> Option<Result<Line, ()>> {
        let me = self.s.rank;
        let join = wire::Rejoin {
            secret: self.s.secret,
            rank: me,
            pid: std::process::id(),
            dead: dead.to_vec(),
            round: self
                .s
                .outcome
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            host: ccl_core::log::hostname().to_string(),
        };
        // Only a refused connection says the standby is gone; anything else (a full accept
        // queue, a slow host) is tried again until the timeout.
        let until = Instant::now() + self.s.timeout;
        let what = || format!("monitor: joining standby rank {c} at {addr}");
        let mut s = loop {
            let by = (Instant::now() + CONNECT_GRACE.get()).min(until);
            let joined = ccl_core::net::connect_to_listening(addr, by, &what).and_then(|mut s| {
                let _ = s.set_nodelay(true);
                wire::write_frame(&mut s, &join.encode(), by)?;
                Ok(s)
            });
            match joined {
                Ok(s) => break s,
                Err(e) if refused(&e) => {
                    ccl_trace!(Some(me), "{e}");
                    return None;
                }
                Err(e) if Instant::now() >= until => {
                    ccl_warn!(
                        Some(me),
                        "monitor: the job's root died and standby rank {c} could not be reached within {:?}: {e}",
                        self.s.timeout
                    );
                    return Some(Err(()));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        };
        // The standby's first frame says it took this rank on.
        let first = wire::read_frame(&mut s, until, &|| {
            format!("waiting for standby rank {c} at {addr} to take the job's monitor over")
        });
        match first {
            // The monitor runs there, and no longer counts this rank among the job's: moving on
            // to another standby would start a second monitor.
            Ok(f) if f.kind == FrameKind::Error => {
                ccl_warn!(
                    Some(me),
                    "monitor: rank {c}, which runs the job's monitor now, refused this rank: {}",
                    String::from_utf8_lossy(&f.payload)
                );
                Some(Err(()))
            }
            Ok(f) => {
                let line = Line::new(s);
                self.s.handle(f);
                Some(Ok(line))
            }
            Err(e) if e.kind() == ccl_core::ErrorKind::Timeout => {
                ccl_warn!(
                    Some(me),
                    "monitor: the job's root died and standby rank {c} took this rank's line but did not answer within {:?} (stopped?): {e}",
                    self.s.timeout
                );
                Some(Err(()))
            }
            Err(e) => {
                ccl_trace!(Some(me), "monitor: standby rank {c} is gone: {e}");
                None
            }
        }
    }

    /// Makes `line`, to the monitor that rank `c` runs at `addr`, this rank's line up.
    fn switch_up(&mut self, line: Line, c: usize, addr: std::net::SocketAddr) {
        let Ok(w) = line.stream.try_clone() else {
            return;
        };
        *self.s.writer.lock().unwrap_or_else(|p| p.into_inner()) = w;
        self.up = line;
        self.up_is_root = true;
        self.old = None;
        self.s.hub.store(usize::MAX, Ordering::Release);
        *self.s.root.lock().unwrap_or_else(|p| p.into_inner()) = addr;
        self.s.moved_to.store(c, Ordering::Release);
        self.s.epoch.fetch_add(1, Ordering::AcqRel);
        let _ = self.s.wake.write(1);
        if self.leaving {
            // Here only to say what this rank was told: it has left.
            self.s.send(&Frame::new(FrameKind::Bye, Vec::new()));
        }
        ccl_info!(
            Some(self.s.rank),
            "monitor: the job's monitor ended with its process; rank {c} at {addr} runs it now"
        );
    }

    /// Runs the job's monitor here, on this rank's listener, for the ranks whose root died
    /// (`first`: the lines of those that asked already, with what they sent), and joins it.
    pub(super) fn take_over(&mut self, first: Vec<(Line, Vec<Frame>)>) -> bool {
        let me = self.s.rank;
        let Some(listener) = self.listener.take() else {
            return false;
        };
        let Ok(addr) = listener.local_addr() else {
            return false;
        };
        let sb = self
            .s
            .standby
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .unwrap_or_default();
        let (lost, dead) = self.lost(&sb);
        self.children.clear();
        self.unjoined.clear();
        self.gathering = None;
        // Lines to this listener that have not said who they are yet go to the monitor too:
        // closing them would tell their ranks this one had died.
        let pending = std::mem::take(&mut self.joiners)
            .into_iter()
            .map(|(line, _)| (line, Vec::new()));
        let clients = first
            .into_iter()
            .chain(pending)
            .map(|(line, frames)| {
                let mut buf: Vec<u8> = frames.iter().flat_map(|f| f.encode()).collect();
                buf.extend(line.buf);
                (line.stream, buf)
            })
            .collect();
        let t = Takeover {
            size: self.s.size,
            rank: me,
            lost,
            dead,
            standby: sb,
            secret: self.s.secret,
            timeout: self.s.timeout,
            spawn_root: self.s.spawn_root,
            roster: self.s.roster.get().cloned(),
            clients,
        };
        if let Err(e) = t.spawn(listener) {
            ccl_warn!(Some(me), "monitor: cannot take the job's monitor over: {e}");
            return false;
        }
        // This rank reports to the monitor it runs like every other rank.
        match self.rejoin(me, addr, &[]) {
            Some(Ok(line)) => {
                self.switch_up(line, me, addr);
                true
            }
            _ => false,
        }
    }
}
