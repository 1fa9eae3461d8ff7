//! Issue order and non-blocking operations.
//!
//! Every operation takes a ticket when it is issued and runs when its turn comes, so operations
//! complete in the order they were issued, whichever thread issued them and whether they block
//! or not. Blocking calls run on the caller's thread (no hand-off, which would cost a wake-up per
//! call); non-blocking calls queue to one progress thread per communicator, started on first use.
//! A non-blocking call takes its ticket and its queue position under one lock, so the progress
//! thread never waits for a ticket that sits behind it in its own queue.
//!
//! A waiter runs its operation itself when the progress thread has not started it yet. Handing
//! an operation to another thread and back costs two wake-ups (12.5 us a call, 2 ranks over
//! shared memory, one core each, against 0.3 us blocking; 0.8 us with the waiter running it),
//! which is most of a small allreduce's time in a program that issues and waits at once
//! (torch's functional collectives, tensor-parallel decoding). The progress thread still takes every operation nobody waits for, so operations
//! progress while their caller computes, and two communicators' operations cannot wait on each
//! other through one thread.
//!
//! This module knows nothing of collectives: it orders closures. The communicator passes in what
//! each operation runs.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::peers::Peers;
use crossbeam_channel::{Receiver, Sender};

use crate::{Error, Result};

/// Tickets and turns. The counters are atomics, so that a blocking call whose turn it is takes
/// its ticket and starts with one atomic add, and ends with one store (locks cost a small
/// operation measurably); the lock and condition variable are only for threads that wait.
#[derive(Debug, Default)]
struct Turns {
    /// The next ticket to hand out.
    next: AtomicU64,
    /// The ticket whose operation may run now.
    serving: AtomicU64,
    /// Threads waiting for their turn: a finished turn wakes them only when there are some
    /// (a wake-up is a system call, a large part of a small operation's time). Changed under
    /// `lock`.
    waiting: AtomicUsize,
    lock: Mutex<()>,
    cv: Condvar,
}

impl Turns {
    fn ticket(&self) -> u64 {
        self.next.fetch_add(1, Ordering::SeqCst)
    }

    /// Waits until ticket `t` may run. Returns early with the communicator's error once it has
    /// failed: nothing will run anyway, so order no longer matters.
    fn wait(&self, t: u64, comm: &Peers) -> Result<Turn<'_>> {
        if self.serving.load(Ordering::Acquire) == t {
            return Ok(Turn { turns: self, t });
        }
        let mut g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            // Counted before the look at `serving`, which a finishing turn sets before it looks
            // at `waiting` (both sequentially consistent): either this thread sees the new turn,
            // or that one sees a waiter and notifies under the lock, after this thread sleeps.
            self.waiting.fetch_add(1, Ordering::SeqCst);
            if self.serving.load(Ordering::SeqCst) == t {
                self.waiting.fetch_sub(1, Ordering::SeqCst);
                return Ok(Turn { turns: self, t });
            }
            if let Err(e) = comm.check() {
                self.waiting.fetch_sub(1, Ordering::SeqCst);
                return Err(e);
            }
            // Woken by every finished turn and by abort; the timeout only re-checks the error.
            g = self
                .cv
                .wait_timeout(g, Duration::from_millis(100))
                .unwrap_or_else(|p| p.into_inner())
                .0;
            self.waiting.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Wakes every waiter (after an abort).
    fn wake_all(&self) {
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
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
        let turns = self.turns;
        turns.serving.store(self.t + 1, Ordering::SeqCst);
        if turns.waiting.load(Ordering::SeqCst) > 0 {
            let _g = turns.lock.lock().unwrap_or_else(|p| p.into_inner());
            turns.cv.notify_all();
        }
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// A queued operation, taken by whichever comes first: the progress thread or its waiter.
type Claim = Arc<Mutex<Option<Job>>>;

fn take(claim: &Claim) -> Option<Job> {
    claim.lock().unwrap_or_else(|p| p.into_inner()).take()
}

/// The progress thread of one communicator.
struct Progress {
    tx: Option<Sender<Claim>>,
    handle: Option<JoinHandle<()>>,
}

/// Queue bound: submitting waits when this many operations are outstanding.
const QUEUE: usize = 1024;

impl Progress {
    fn start(rank: usize) -> Result<Progress> {
        let (tx, rx) = crossbeam_channel::bounded::<Claim>(QUEUE);
        let handle = std::thread::Builder::new()
            .name(format!("ccl-progress-{rank}"))
            .spawn(move || {
                for claim in rx {
                    // No yield here to let a waiter come first: measured, it cost 8-10 us a
                    // call (2 ranks, one core each), as the scheduler ran this thread again at
                    // once and switched away again.
                    if let Some(job) = take(&claim) {
                        job();
                    }
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
    /// The operation, while nobody has started it.
    claim: Option<Claim>,
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
        if let Some(job) = self.claim.as_ref().and_then(take) {
            job();
        }
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
        (Request { rx, claim: None }, Completion { tx, value: None })
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
    pub(crate) fn new(comm: Arc<Peers>) -> Order {
        Order {
            comm,
            turns: Arc::default(),
            progress: Mutex::new(None),
        }
    }

    /// Runs `f` on the caller's thread when its turn comes.
    pub(crate) fn blocking<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        // Without the progress lock: this ticket goes into no queue, so a ticket of `submit`
        // taken before it and queued just after it is still run first, by the progress thread,
        // which never waits for this one.
        let t = self.turns.ticket();
        let _turn = self.turns.wait(t, &self.comm)?;
        f()
    }

    /// Queues `f` (which owns `bufs`) to the progress thread; the request returns `bufs`.
    pub(crate) fn submit<B: Send + 'static>(
        &self,
        bufs: B,
        f: impl FnOnce(&mut B) -> Result<()> + Send + 'static,
    ) -> Request<B> {
        let (mut req, done) = Completion::pair();
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
        let claim: Claim = Arc::new(Mutex::new(Some(job)));
        req.claim = Some(claim.clone());
        // A full queue blocks here until the progress thread catches up; a dead thread drops the
        // claim, and the waiter runs the job.
        let _ = tx.send(claim);
        req
    }

    /// Wakes every operation waiting for its turn (after an abort), so it sees the error.
    pub(crate) fn wake_all(&self) {
        self.turns.wake_all();
    }
}
