//! What a rank's threads and its monitor thread share: the line up the monitor tree, what the
//! root said (notices, revocation, shrink answers), the hooks the communicator sets, and how a
//! frame from the root is handled. `thread` runs the thread; `rank` is the rank's side.

use std::collections::VecDeque;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use nix::sys::eventfd::EventFd;

use super::tree::Tree;
use crate::LOG_SUBSYS;
use crate::timing::LINE_WRITE;
use crate::wire::{self, Frame, FrameKind, Notice};
use ccl_core::error::ErrorKind;
use ccl_core::{ccl_trace, ccl_warn};
use ccl_diag::digest::Digest;

/// Describes this rank for a state query ([`ccl_diag::verdict::encode`]d).
pub(crate) type StateSource = Box<dyn Fn() -> Vec<u8> + Send + Sync>;

/// Called on the monitor thread with each failure notice as it arrives.
pub(crate) type NoticeHook = Box<dyn Fn(&Notice) + Send + Sync>;

/// What a rank does when another asks it to connect (with the asker's rank).
pub(crate) type ConnectHook = Box<dyn Fn(usize) + Send + Sync>;

/// What the rank's threads and its monitor thread share.
pub(crate) struct Shared {
    /// This rank's line up the monitor tree (to the root, or to its hub).
    pub(crate) writer: Mutex<TcpStream>,
    pub(crate) rank: usize,
    pub(crate) size: usize,
    /// Where the job's monitor runs: the root, or the standby rank that took it over.
    pub(crate) root: Mutex<SocketAddr>,
    pub(crate) secret: [u8; 32],
    pub(crate) timeout: Duration,
    pub(crate) tree: Tree,
    /// Where the monitor moves when the root's process dies, once the root has said.
    pub(crate) standby: Mutex<Option<wire::Standby>>,
    /// The rank whose process runs the monitor since the last takeover (`usize::MAX`: the
    /// first root's).
    pub(crate) moved_to: AtomicUsize,
    /// The monitor running in this rank's process has passed this rank's goodbye on.
    pub(crate) bye_heard: AtomicBool,
    /// Takeovers this rank has followed: an answer awaited from an earlier root never comes.
    pub(crate) epoch: AtomicU32,
    /// Shrink rounds decided by the root of an epoch (each root counts from 0): `(epoch,
    /// rounds)`.
    pub(crate) shrink_round: Mutex<(u32, u32)>,
    /// The test's stand-in for this rank's process dying: its monitor thread ends at once.
    #[cfg(test)]
    pub(crate) vanished: AtomicBool,
    /// This rank's part in the last shrink round decided (kept by the monitor thread, so that
    /// what it tells a standby matches every frame it read).
    pub(crate) outcome: Mutex<Option<wire::Outcome>>,
    /// Every rank's host and process id, when the communicator has said: a monitor taken over
    /// names at once a rank of its own host whose process has ended.
    pub(crate) roster: OnceLock<Vec<(String, u32)>>,
    /// Starts a root for a shrunk communicator beside a monitor this rank takes over.
    pub(crate) spawn_root: super::recovery::SpawnRoot,
    pub(crate) notices: Mutex<VecDeque<Notice>>,
    /// Readable once a notice arrived or the root's connection closed.
    pub(crate) wake: EventFd,
    /// Readable once the monitor is dropped: ends the thread.
    pub(crate) stop: EventFd,
    pub(crate) root_gone: AtomicBool,
    /// The hub this rank reports through (`usize::MAX`: the root itself).
    pub(crate) hub: AtomicUsize,
    /// Acknowledgements from the root (it is alive and working on a report of ours).
    pub(crate) acks: AtomicU64,
    pub(crate) state: OnceLock<StateSource>,
    pub(crate) on_notice: OnceLock<NoticeHook>,
    pub(crate) on_connect: OnceLock<ConnectHook>,
    /// Requests to connect that came before the hook was set (the asker finished set-up first).
    pub(crate) early_connects: Mutex<Vec<usize>>,
    pub(crate) recovery: Mutex<Recovery>,
}

/// What the root said about revoking and shrinking, and which ranks it reported failed.
#[derive(Debug, Default)]
pub(crate) struct Recovery {
    pub(crate) failed: std::collections::BTreeSet<usize>,
    pub(crate) revoked: Option<Notice>,
    /// Answers to a shrink request or outcome (or an error frame), in order, each with the
    /// epoch (see [`Shared::epoch`]) of the root that sent it.
    pub(crate) answers: VecDeque<(u32, Frame)>,
    /// The error the root failed the job with while the ranks set up (a rank left during a
    /// round), or refused a shrink request with.
    pub(crate) root_error: Option<String>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").field("rank", &self.rank).finish()
    }
}

impl Shared {
    pub(crate) fn handle(&self, f: Frame) {
        match f.kind {
            FrameKind::Notice => {
                if let Ok(n) = Notice::decode(&f.payload) {
                    // The root sends again what a hub that died may have taken with it.
                    let known = self
                        .notices
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .iter()
                        .any(|k| k.rank == n.rank && k.died == n.died && k.message == n.message);
                    if known {
                        return;
                    }
                    // A rank whose error only echoes another's failure did not fail itself.
                    if n.died || !n.message.starts_with(ErrorKind::Remote.as_str()) {
                        self.recovery().failed.insert(n.rank);
                    }
                    if let Some(hook) = self.on_notice.get() {
                        hook(&n);
                    }
                    self.notices
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push_back(n);
                    let _ = self.wake.write(1);
                }
            }
            FrameKind::StateQuery => {
                let mut reply = f.payload.get(..4).unwrap_or(&[0; 4]).to_vec();
                // Nothing to say while the communicator is being dropped: no answer.
                let body = self.state.get().map(|src| src()).unwrap_or_default();
                if !body.is_empty() {
                    reply.extend(body);
                    self.send(&Frame::new(FrameKind::StateReply, reply));
                }
            }
            FrameKind::DigestQuery => {
                // A rank with no ranks below it answers for itself at once.
                if let Some((id, _)) = wire::read_digest_query(&f.payload)
                    && let Some(d) = self.own_digest()
                {
                    self.send(&wire::digest_reply(id, &d));
                }
            }
            FrameKind::ConnectMe => {
                let Some(from) = wire::rank_of(&f.payload) else {
                    return;
                };
                let mut early = self
                    .early_connects
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                match self.on_connect.get() {
                    Some(hook) => {
                        drop(early);
                        hook(from);
                    }
                    None => early.push(from),
                }
            }
            FrameKind::Verdict => {
                ccl_warn!(Some(self.rank), "{}", String::from_utf8_lossy(&f.payload));
            }
            FrameKind::Ack => {
                self.acks.fetch_add(1, Ordering::AcqRel);
            }
            FrameKind::Revoked => {
                if let Ok(n) = Notice::decode(&f.payload) {
                    self.recovery().revoked.get_or_insert(n);
                    let _ = self.wake.write(1);
                }
            }
            FrameKind::Error => {
                let msg = String::from_utf8_lossy(&f.payload).into_owned();
                let epoch = self.epoch.load(Ordering::Acquire);
                let mut r = self.recovery();
                r.root_error.get_or_insert(msg);
                r.answers.push_back((epoch, f));
                drop(r);
                let _ = self.wake.write(1);
            }
            FrameKind::Standby => match wire::Standby::decode(&f.payload, self.size) {
                Ok(sb) => {
                    if sb.left.contains(&self.rank) {
                        self.bye_heard.store(true, Ordering::Release);
                    }
                    *self.standby.lock().unwrap_or_else(|p| p.into_inner()) = Some(sb);
                }
                Err(e) => ccl_warn!(Some(self.rank), "monitor: {e}"),
            },
            FrameKind::Shrunk | FrameKind::Commit => {
                self.note_outcome(&f);
                let epoch = self.epoch.load(Ordering::Acquire);
                self.recovery().answers.push_back((epoch, f));
                let _ = self.wake.write(1);
            }
            k => ccl_trace!(Some(self.rank), "monitor: ignored {k:?} from the root"),
        }
    }

    /// The digest of this rank's own view; none while the communicator is being dropped.
    pub(crate) fn own_digest(&self) -> Option<Digest> {
        let body = self.state.get().map(|src| src()).unwrap_or_default();
        if body.is_empty() {
            return None;
        }
        match ccl_diag::verdict::decode(&body) {
            Ok(mut v) => {
                v.rank = self.rank;
                Some(Digest::of(&[v]))
            }
            Err(why) => {
                ccl_warn!(Some(self.rank), "monitor: this rank's own state: {why}");
                None
            }
        }
    }

    /// Keeps this rank's part in the round a `Shrunk` decision or a `Commit` verdict is about.
    fn note_outcome(&self, f: &Frame) {
        let mut o = self.outcome.lock().unwrap_or_else(|p| p.into_inner());
        match f.kind {
            FrameKind::Shrunk => {
                if let Ok(d) = wire::ShrinkDecision::decode(&f.payload, self.size) {
                    *o = Some(wire::Outcome {
                        id: d.id,
                        members: d.members,
                        committed: false,
                    });
                }
            }
            FrameKind::Commit => match wire::read_round_flag(&f.payload) {
                Ok((_, true)) => {
                    if let Some(o) = o.as_mut() {
                        o.committed = true;
                    }
                }
                Ok((_, false)) => *o = None,
                Err(_) => {}
            },
            _ => {}
        }
    }

    /// Whether this rank was told to use a shrunk communicator: its monitor line must tell a
    /// standby so if the monitor dies, even after the communicator was dropped.
    pub(crate) fn committed(&self) -> bool {
        self.outcome
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_some_and(|o| o.committed)
    }

    /// Shrink rounds the current root has decided.
    pub(crate) fn round(&self) -> u32 {
        let (epoch, round) = *self.shrink_round.lock().unwrap_or_else(|p| p.into_inner());
        if epoch == self.epoch.load(Ordering::Acquire) {
            round
        } else {
            0
        }
    }

    /// Where the job's monitor runs now.
    pub(crate) fn root(&self) -> SocketAddr {
        *self.root.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The ranks the root said died.
    pub(crate) fn dead(&self) -> Vec<usize> {
        let n = self.notices.lock().unwrap_or_else(|p| p.into_inner());
        n.iter().filter(|n| n.died).map(|n| n.rank).collect()
    }

    pub(crate) fn recovery(&self) -> std::sync::MutexGuard<'_, Recovery> {
        self.recovery.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sends `f` up this rank's line (see [`write_within`]).
    pub(crate) fn send(&self, f: &Frame) {
        let s = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        write_within(&s, &f.encode());
    }
}

/// Writes `bytes` to a non-blocking monitor line. Small frames fit the socket buffer; a reader
/// that does not read gets a short grace, then the rest is dropped (a monitor thread must not
/// hang on one line).
pub(crate) fn write_within(s: &TcpStream, bytes: &[u8]) {
    use std::io::Write;
    let until = Instant::now() + LINE_WRITE.get();
    let mut off = 0;
    while off < bytes.len() && Instant::now() < until {
        match (&*s).write(&bytes[off..]) {
            Ok(k) => {
                wire::count_out(k);
                off += k
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}
