//! Issue order and non-blocking operations.
//!
//! Every operation takes a ticket when it is issued and runs when its turn comes, so operations
//! complete in the order they were issued, whichever thread issued them and whether they block
//! or not. Blocking calls run on the caller's thread (no hand-off, which would cost a wake-up per
//! call); non-blocking calls queue to one progress thread per communicator, started on first use.
//! Ticket and queue position are taken under one lock, so the progress thread never waits for a
//! ticket that sits behind it in its own queue.
//!
//! This module knows nothing of collectives: it orders closures. The communicator passes in what
//! each operation runs.

use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use ccl_core::comm::Peers;
use crossbeam_channel::{Receiver, Sender};

use crate::{Error, Result};

#[derive(Debug, Default)]
struct TurnState {
    /// The next ticket to hand out.
    next: u64,
    /// The ticket whose operation may run now.
    serving: u64,
    /// Threads waiting for their turn: a finished turn wakes them only when there are some
    /// (a wake-up is a system call, a large part of a small operation's time).
    waiting: usize,
}

/// Tickets and turns.
#[derive(Debug, Default)]
struct Turns {
    state: Mutex<TurnState>,
    cv: Condvar,
}

impl Turns {
    fn ticket(&self) -> u64 {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let t = s.next;
        s.next += 1;
        t
    }

    /// Waits until ticket `t` may run. Returns early with the communicator's error once it has
    /// failed: nothing will run anyway, so order no longer matters.
    fn wait(&self, t: u64, comm: &Peers) -> Result<Turn<'_>> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if s.serving == t {
                return Ok(Turn { turns: self, t });
            }
            comm.check()?;
            // Woken by every finished turn and by abort; the timeout only re-checks the error.
            s.waiting += 1;
            s = self
                .cv
                .wait_timeout(s, Duration::from_millis(100))
                .unwrap_or_else(|p| p.into_inner())
                .0;
            s.waiting -= 1;
        }
    }

    /// Wakes every waiter (after an abort).
    fn wake_all(&self) {
        self.cv.notify_all();
    }
}

/// The right to run; the next ticket's turn comes when it is dropped, even on unwinding.
struct Turn<'a> {
    turns: &'a Turns,
    t: u64,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut s = self.turns.state.lock().unwrap_or_else(|p| p.into_inner());
        s.serving = self.t + 1;
        let waiting = s.waiting > 0;
        drop(s);
        if waiting {
            self.turns.cv.notify_all();
        }
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// The progress thread of one communicator.
struct Progress {
    tx: Option<Sender<Job>>,
    handle: Option<JoinHandle<()>>,
}

/// Queue bound: submitting waits when this many operations are outstanding.
const QUEUE: usize = 1024;

impl Progress {
    fn start(rank: usize) -> Result<Progress> {
        let (tx, rx) = crossbeam_channel::bounded::<Job>(QUEUE);
        let handle = std::thread::Builder::new()
            .name(format!("ccl-progress-{rank}"))
            .spawn(move || {
                for job in rx {
                    job();
                }
            })
            .map_err(|e| {
                Error::io(crate::ErrorKind::System, "starting the progress thread", e).rank(rank)
            })?;
        Ok(Progress {
            tx: Some(tx),
            handle: Some(handle),
        })
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        // Closing the queue lets the thread finish what was submitted and exit; every operation
        // has a deadline, so this join ends.
        self.tx.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Issues operations in order: blocking ones on the caller's thread, non-blocking ones on the
/// progress thread, started on first use and stopped (after finishing what was submitted) when
/// this is dropped.
pub(crate) struct Order {
    comm: Arc<Peers>,
    turns: Arc<Turns>,
    progress: Mutex<Option<Progress>>,
}

/// A non-blocking operation in flight: [`wait`](Request::wait) for its result, which hands back
/// the buffers it took.
#[must_use = "a request does nothing unless waited on or tested (the operation runs regardless)"]
pub struct Request<R> {
    /// Receives the one result (a channel of capacity one).
    rx: Receiver<Result<R>>,
}

impl<R> std::fmt::Debug for Request<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Request(done: {})", self.test())
    }
}

impl<R> Request<R> {
    /// Whether the operation has finished (successfully or not).
    pub fn test(&self) -> bool {
        !self.rx.is_empty()
    }

    /// Waits for the operation and returns its buffers, or its error. The wait ends: the
    /// operation itself fails at its deadline (`CCL_TIMEOUT` without progress) or on abort.
    pub fn wait(self) -> Result<R> {
        // The completion always sends before it goes (see its Drop), so the channel is never
        // closed empty; the fallback only keeps this total.
        self.rx.recv().unwrap_or_else(|_| Err(lost()))
    }
}

fn lost() -> Error {
    Error::internal("the operation was lost (its thread panicked)")
}

/// Sends a request its result when dropped, so a job that panics or is dropped unrun still
/// answers its waiter.
struct Completion<R> {
    tx: Sender<Result<R>>,
    value: Option<Result<R>>,
}

impl<R> Completion<R> {
    /// A request and the completion that answers it.
    fn pair() -> (Request<R>, Completion<R>) {
        let (tx, rx) = crossbeam_channel::bounded(1);
        (Request { rx }, Completion { tx, value: None })
    }

    fn finish(mut self, v: Result<R>) {
        self.value = Some(v);
    }
}

impl<R> Drop for Completion<R> {
    fn drop(&mut self) {
        let v = self.value.take().unwrap_or_else(|| Err(lost()));
        // Never full (one send per channel); a request dropped unwaited leaves nobody to tell.
        let _ = self.tx.try_send(v);
    }
}

impl Order {
    /// Orders the operations of the communicator `comm`, whose sticky error ends every wait for a
    /// turn.
    pub fn new(comm: Arc<Peers>) -> Order {
        Order {
            comm,
            turns: Arc::default(),
            progress: Mutex::new(None),
        }
    }

    /// Runs `f` on the caller's thread when its turn comes.
    pub fn blocking<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let t = {
            // Tickets are taken under the progress lock too (see the module docs).
            let _q = self.progress.lock().unwrap_or_else(|p| p.into_inner());
            self.turns.ticket()
        };
        let _turn = self.turns.wait(t, &self.comm)?;
        f()
    }

    /// Queues `f` (which owns `bufs`) to the progress thread; the request returns `bufs`.
    pub fn submit<B: Send + 'static>(
        &self,
        bufs: B,
        f: impl FnOnce(&mut B) -> Result<()> + Send + 'static,
    ) -> Request<B> {
        let (req, done) = Completion::pair();
        let mut q = self.progress.lock().unwrap_or_else(|p| p.into_inner());
        if q.is_none() {
            match Progress::start(self.comm.rank()) {
                Ok(p) => *q = Some(p),
                Err(e) => {
                    done.finish(Err(e));
                    return req;
                }
            }
        }
        let t = self.turns.ticket();
        let (comm, turns) = (self.comm.clone(), self.turns.clone());
        let job: Job = Box::new(move || {
            let mut bufs = bufs;
            let r = match turns.wait(t, &comm) {
                Ok(_turn) => f(&mut bufs),
                Err(e) => Err(e),
            };
            done.finish(r.map(|()| bufs));
        });
        let tx = q
            .as_ref()
            .and_then(|p| p.tx.as_ref())
            .expect("progress thread is running");
        // A full queue blocks here until the progress thread catches up; a dead thread drops the
        // job, whose completion then reports the loss.
        let _ = tx.send(job);
        req
    }

    /// Wakes every operation waiting for its turn (after an abort), so it sees the error.
    pub fn wake_all(&self) {
        self.turns.wake_all();
    }
}
