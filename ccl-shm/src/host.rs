//! Memory every rank of one host maps: a slot of data per rank and a counter each rank bumps
//! when its slot (or its share of the others') is ready.
//!
//! This is what the intra-host collectives run on: a rank copies its input into its slot and
//! posts; once every rank has posted, each reads the others' slots directly (reducing its share,
//! or copying results out), then posts again. No byte goes through a pipe: a collective among
//! the ranks of a host reads every input where it lies.
//!
//! Counters only grow. A rank waiting for the others first spins (the caller does, polling
//! [`HostSegment::reached`]), then raises its sleep flag and looks once more before it sleeps
//! on its eventfd; a rank that posts then wakes every rank whose flag is up. The same pattern as
//! the rings (`crate::ring`), with sequentially consistent accesses on both sides instead of
//! fences: the post's read-modify-write is a full barrier already (x86: a locked add, no
//! further fence), and no wake-up is lost.
//!
//! What moves between CPUs per operation: each rank's counter (one cache line, written by its
//! owner only), the data, and nothing else while nobody sleeps: the sleep flags are only read,
//! and an operation announced as before leaves its line alone. A program whose post leaves a
//! mark beside its data ([`HostProgram::with_mark`]) is waited for by its marks: the counter's
//! line then stays with its owner, and the data comes with the look that sees the mark.
//!
//! Which rank may write which bytes when is the schedule's business: the symbolic checker of
//! `ccl-algos` verifies that no schedule reads a slot before its owner posted the write, or
//! writes a slot before every reader posted that it is done.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use ccl_core::reduce::{Kernels, finish_avg};
use ccl_core::transport::program::{CallBuf, HostCall, HostProgram, HostStep, Stop, mark_word};
use ccl_core::{Error, ReduceOp, Result};
use crossbeam_utils::CachePadded;

use crate::mem::{Mapping, MemFile, PAGE};
use crate::wake::{drain, new_eventfd, signal};

const MAGIC: [u8; 8] = *b"CCLHOST1";

/// One rank's counters.
#[repr(C)]
struct RankFlags {
    /// How many times the rank has posted.
    posted: CachePadded<AtomicU64>,
    /// The operation the rank is in (a fingerprint; 0 = none yet), for mismatch checks: one
    /// place for even and one for odd operations, as a rank can be one operation ahead.
    desc: CachePadded<[AtomicU64; 2]>,
    /// While the rank sleeps waiting for others' posts: [`ANY_POST`], or [`ALL_POSTED`] plus
    /// the count every rank must reach; 0 while it is awake.
    sleeping: CachePadded<AtomicU64>,
}

/// A sleep flag: wake the rank at any post.
const ANY_POST: u64 = 1;
/// A sleep flag of `ALL_POSTED + c`: wake the rank once every rank of the host has posted `c`
/// times. A rank that posts wakes only the sleepers it completes, not every sleeper at every
/// post: with many ranks per CPU, waking all of them at each of the host's posts made a host
/// of 256 ranks on 2 CPUs spend most of a minute in wake-ups.
const ALL_POSTED: u64 = 2;

/// Where things are in the file.
#[derive(Clone, Copy, Debug)]
struct Layout {
    ranks: usize,
    slot: usize,
    flags_at: usize,
    data_at: usize,
    len: usize,
}

impl Layout {
    fn new(ranks: usize, slot: usize) -> Result<Layout> {
        let flag_bytes = ranks
            .checked_mul(std::mem::size_of::<RankFlags>())
            .ok_or_else(|| Error::invalid_argument("too many ranks on one host"))?;
        let flags_at = PAGE;
        let data_at = flags_at + flag_bytes.div_ceil(PAGE) * PAGE;
        let len = slot
            .checked_mul(ranks)
            .and_then(|d| d.checked_add(data_at))
            .ok_or_else(|| Error::invalid_argument("host segment too large"))?;
        if slot == 0 || slot % PAGE != 0 {
            return Err(Error::internal(format!(
                "host slot of {slot} bytes is not whole pages"
            )));
        }
        Ok(Layout {
            ranks,
            slot,
            flags_at,
            data_at,
            len,
        })
    }
}

/// What the creating rank hands each other rank of its host: the file, every rank's eventfd,
/// and the receiver's index.
#[derive(Debug)]
pub struct HostShare<'a> {
    pub file: BorrowedFd<'a>,
    pub events: Vec<BorrowedFd<'a>>,
    pub ranks: usize,
    pub slot: usize,
}

/// One rank's view of its host's segment.
#[derive(Debug)]
pub struct HostSegment {
    file: MemFile,
    map: Mapping,
    layout: Layout,
    /// This rank's index among the ranks of the host.
    me: usize,
    /// Every rank's eventfd, written to wake it.
    events: Vec<OwnedFd>,
}

impl HostSegment {
    /// Creates the segment of `ranks` ranks with `slot` bytes each, as rank 0 of the host.
    pub fn create(ranks: usize, slot: usize) -> Result<HostSegment> {
        let layout = Layout::new(ranks, slot)?;
        let file = MemFile::create("ccl-host", layout.len, "CCL_SHM_SLOT_SIZE")?;
        let events = (0..ranks)
            .map(|_| new_eventfd())
            .collect::<Result<Vec<_>>>()?;
        let seg = HostSegment::map(file, layout, 0, events)?;
        let mut head = [0u8; 24];
        head[..8].copy_from_slice(&MAGIC);
        head[8..16].copy_from_slice(&(ranks as u64).to_le_bytes());
        head[16..].copy_from_slice(&(slot as u64).to_le_bytes());
        // SAFETY: the header lies in the first page, mapped read-write; nobody else has the file
        // yet.
        unsafe { std::ptr::copy_nonoverlapping(head.as_ptr(), seg.map.ptr().as_ptr(), 24) };
        Ok(seg)
    }

    /// What to pass to another rank of the host.
    pub fn share(&self) -> HostShare<'_> {
        HostShare {
            file: self.file.fd(),
            events: self.events.iter().map(|e| e.as_fd()).collect(),
            ranks: self.layout.ranks,
            slot: self.layout.slot,
        }
    }

    /// Opens a segment another rank created, as rank `me` of the host.
    pub fn open(
        file: OwnedFd,
        events: Vec<OwnedFd>,
        ranks: usize,
        slot: usize,
        me: usize,
    ) -> Result<HostSegment> {
        if me >= ranks || events.len() != ranks || ranks > 4096 {
            return Err(Error::remote(format!(
                "host segment set-up for rank {me} of {ranks} with {} eventfds",
                events.len()
            )));
        }
        let layout = Layout::new(ranks, slot)?;
        let file = MemFile::open(file, layout.len)?;
        let seg = HostSegment::map(file, layout, me, events)?;
        let mut head = [0u8; 24];
        // SAFETY: the first page is mapped; its creator wrote the header before sharing the file
        // and never writes it again.
        unsafe { std::ptr::copy_nonoverlapping(seg.map.ptr().as_ptr(), head.as_mut_ptr(), 24) };
        let n = u64::from_le_bytes(head[8..16].try_into().expect("8"));
        let s = u64::from_le_bytes(head[16..].try_into().expect("8"));
        if head[..8] != MAGIC || n != ranks as u64 || s != slot as u64 {
            return Err(Error::remote(
                "the host memory file is not this host's segment",
            ));
        }
        Ok(seg)
    }

    fn map(file: MemFile, layout: Layout, me: usize, events: Vec<OwnedFd>) -> Result<HostSegment> {
        // Each rank touches its own slot and the first pages of the others' in most operations:
        // page tables fill as it does.
        let map = Mapping::on_touch(&file, 0, layout.len)?;
        Ok(HostSegment {
            file,
            map,
            layout,
            me,
            events,
        })
    }

    /// Ranks on the host.
    pub fn ranks(&self) -> usize {
        self.layout.ranks
    }

    /// This rank's index among them.
    pub fn me(&self) -> usize {
        self.me
    }

    /// Bytes of each rank's slot.
    pub fn slot_len(&self) -> usize {
        self.layout.slot
    }

    fn flags(&self, r: usize) -> &RankFlags {
        assert!(r < self.layout.ranks, "host rank {r} out of range");
        // SAFETY: `flags_at + r * size` lies in the mapped flags area (sized for every rank in
        // `Layout::new`), aligned for `RankFlags` (a page boundary plus multiples of its size,
        // itself a multiple of its alignment); the file started zeroed, which is its initial
        // state, and stays mapped while `self` lives. Only atomics are accessed through it.
        unsafe {
            &*self
                .map
                .ptr()
                .as_ptr()
                .add(self.layout.flags_at + r * std::mem::size_of::<RankFlags>())
                .cast::<RankFlags>()
        }
    }

    /// How many times rank `r` has posted.
    pub fn posted(&self, r: usize) -> u64 {
        self.flags(r).posted.load(Ordering::Acquire)
    }

    /// The operation fingerprint rank `r` announced last for operation number `op` (or
    /// `op - 2`, ...).
    pub fn desc(&self, r: usize, op: u64) -> u64 {
        self.flags(r).desc[(op % 2) as usize].load(Ordering::Acquire)
    }

    /// Announces operation number `op` that this rank is entering (before its first post in
    /// it). The same operation as two before leaves the line as it is, so the others' copies of
    /// it stay valid.
    pub fn announce(&self, op: u64, desc: u64) {
        let d = &self.flags(self.me).desc[(op % 2) as usize];
        if d.load(Ordering::Relaxed) != desc {
            d.store(desc, Ordering::Release);
        }
    }

    /// Publishes that everything this rank wrote before is ready (its counter grows by one).
    /// Wakes nobody: a release store lets the rank go on while its writes drain to the other
    /// CPUs, where a locked add, and the look at the sleep flags it would order, waits for them
    /// (2 ranks, 2 KiB: about 0.1 us a call, `scripts/peers/host_floor.c`). A rank that posted
    /// calls [`wake`](HostSegment::wake) before it waits for anything and when it leaves the
    /// operation.
    pub fn post(&self) {
        let f = self.flags(self.me);
        // Only this rank writes its counter.
        let n = f.posted.load(Ordering::Relaxed);
        f.posted.store(n + 1, Ordering::Release);
    }

    /// Wakes the ranks that sleep waiting for posts. The fence orders this rank's posts before
    /// its look at their sleep flags, as [`arm`](HostSegment::arm) orders a sleeper's flag
    /// before its look at the posts: one of the two sees the other's store, so a rank never
    /// sleeps through a post that was followed by a `wake`.
    pub fn wake(&self) {
        std::sync::atomic::fence(Ordering::SeqCst);
        self.wake_seen();
    }

    /// Wakes the ranks whose sleep flags this rank sees raised, with no fence: cheap enough for
    /// every wait that need not block, so that a rank asleep since before this rank's post is
    /// not left sleeping through the rest of the operation (the fenced [`wake`] comes after).
    ///
    /// [`wake`]: HostSegment::wake
    pub fn wake_seen(&self) {
        // The fewest posts of any rank, read once and only if a sleeper waits for all: a
        // sleeper's target is complete once this reaches it. The last of the posters a sleeper
        // waits for sees every earlier post after its fence (see `wake`), so it wakes the
        // sleeper; a wake-up missed anyway costs the sleeper its wait's recheck, not a hang.
        let mut least = None;
        for r in 0..self.layout.ranks {
            let s = self.flags(r).sleeping.load(Ordering::SeqCst);
            if s == 0 || r == self.me {
                continue;
            }
            if s >= ALL_POSTED && *least.get_or_insert_with(|| self.least_posted()) < s - ALL_POSTED
            {
                continue;
            }
            self.wake_rank(r);
        }
    }

    /// The fewest posts of any rank of the host.
    fn least_posted(&self) -> u64 {
        (0..self.layout.ranks)
            .map(|r| self.flags(r).posted.load(Ordering::SeqCst))
            .min()
            .unwrap_or(0)
    }

    /// Wakes rank `r` if it still sleeps. Out of line: a rank that finds nobody asleep (the
    /// usual case with a CPU per rank) runs a loop of loads with nothing to save around it.
    #[cold]
    #[inline(never)]
    fn wake_rank(&self, r: usize) {
        if self.flags(r).sleeping.swap(0, Ordering::SeqCst) != 0 {
            signal(&self.events[r]);
        }
    }

    /// Whether every rank of the host has posted at least `count` times: the look a wait takes
    /// before anything else, in one call.
    pub fn all_posted(&self, count: u64) -> bool {
        for r in 0..self.layout.ranks {
            if self.flags(r).posted.load(Ordering::Acquire) < count {
                return false;
            }
        }
        true
    }

    /// The first other rank whose fingerprint for operation `op` is not `desc`, with its
    /// fingerprint.
    pub fn first_unlike(&self, op: u64, desc: u64) -> Option<(usize, u64)> {
        for r in 0..self.layout.ranks {
            let d = self.desc(r, op);
            if d != desc && r != self.me {
                return Some((r, d));
            }
        }
        None
    }

    /// Whether every rank in `ranks` has posted at least `count` times.
    pub fn reached(&self, ranks: impl IntoIterator<Item = usize>, count: u64) -> bool {
        ranks
            .into_iter()
            .all(|r| self.flags(r).posted.load(Ordering::SeqCst) >= count)
    }

    /// Raises this rank's sleep flag unless `ranks` have reached `count` by now; returns whether
    /// the caller may sleep (on [`wait_fd`](HostSegment::wait_fd)).
    pub fn arm(&self, ranks: impl IntoIterator<Item = usize> + Clone, count: u64) -> bool {
        self.arm_flag(ranks, count, ANY_POST)
    }

    /// [`arm`](HostSegment::arm) for every rank of the host: only the post that completes
    /// `count` wakes this rank.
    pub fn arm_all(&self, count: u64) -> bool {
        self.arm_flag(0..self.layout.ranks, count, ALL_POSTED + count)
    }

    fn arm_flag(
        &self,
        ranks: impl IntoIterator<Item = usize> + Clone,
        count: u64,
        flag: u64,
    ) -> bool {
        // Whoever waits for this rank's posts must know of them before it sleeps.
        self.wake();
        drain(&self.events[self.me]);
        let s = &self.flags(self.me).sleeping;
        s.store(flag, Ordering::SeqCst);
        if self.reached(ranks, count) {
            s.store(0, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// Readable when another rank posted while this one slept.
    pub fn wait_fd(&self) -> BorrowedFd<'_> {
        self.events[self.me].as_fd()
    }

    /// Rank `r`'s slot. The bytes may change under the caller unless the schedule's posts and
    /// waits order every write of them before this read (the symbolic checker's job).
    pub fn slot(&self, r: usize) -> &[u8] {
        assert!(r < self.layout.ranks, "host rank {r} out of range");
        // SAFETY: the slot lies inside the mapping (`Layout::new` sized it), which lives as long
        // as `&self`. Other processes write slots, so this is memory shared across processes:
        // the schedules order every write of a slot before its reads through posts and waits
        // (release/acquire on the counters), which the symbolic checker verifies for every
        // schedule, so no bytes change while this borrow is read.
        unsafe {
            std::slice::from_raw_parts(
                self.map
                    .ptr()
                    .as_ptr()
                    .add(self.layout.data_at + r * self.layout.slot),
                self.layout.slot,
            )
        }
    }

    /// This rank's own slot, to write.
    pub fn my_slot(&mut self) -> &mut [u8] {
        let at = self.layout.data_at + self.me * self.layout.slot;
        // SAFETY: inside the mapping as for `slot`; only this rank writes its slot, `&mut self`
        // makes this the only borrow of it in this process, and the schedules make other ranks
        // read it only after this rank posted the write and write it again only after every
        // reader posted that it is done.
        unsafe { std::slice::from_raw_parts_mut(self.map.ptr().as_ptr().add(at), self.layout.slot) }
    }

    /// Runs `prog` from step `from` (`HostMemory::run`), with the reduce kernels `k`: its
    /// regions are checked against the buffers and slots once, so each step is a copy or a
    /// reduction between slices and, for posts and waits, a look at the counters.
    pub fn run(
        &mut self,
        prog: &HostProgram,
        from: usize,
        call: &mut HostCall<'_>,
        k: &Kernels,
    ) -> Result<Stop> {
        if let Some(why) = prog.misfit(call, self.layout.ranks, self.layout.slot) {
            return Err(Error::internal(why));
        }
        if from == 0 {
            call.base = self.posted(self.me);
        }
        let (dtype, op) = (call.dtype, call.op);
        let mut announced = false;
        for (at, step) in prog.steps().iter().enumerate().skip(from) {
            match *step {
                HostStep::CopyIn { src, from, to, len } => {
                    let s = match src {
                        // `misfit` refused a program that reads the send buffer in place.
                        CallBuf::Send => call.send.unwrap_or_default(),
                        CallBuf::Recv => &*call.recv,
                    };
                    self.my_slot()[to..to + len].copy_from_slice(&s[from..from + len]);
                }
                HostStep::CopyOut {
                    slot,
                    from,
                    to,
                    len,
                } => call.recv[to..to + len]
                    .copy_from_slice(&self.slot(usize::from(slot))[from..from + len]),
                HostStep::CopyLocal {
                    src: CallBuf::Send,
                    from,
                    to,
                    len,
                } => call.recv[to..to + len]
                    .copy_from_slice(&call.send.unwrap_or_default()[from..from + len]),
                HostStep::CopyLocal {
                    src: CallBuf::Recv,
                    from,
                    to,
                    len,
                } => call.recv.copy_within(from..from + len, to),
                HostStep::Fused { to, len, a, b } => (k.into)(
                    dtype,
                    op,
                    &mut call.recv[to..to + len],
                    &self.slot(usize::from(a.0))[a.1..a.1 + len],
                    &self.slot(usize::from(b.0))[b.1..b.1 + len],
                ),
                HostStep::ReduceOut {
                    to,
                    len,
                    slot,
                    from,
                    order,
                } => (k.inplace)(
                    dtype,
                    op,
                    &mut call.recv[to..to + len],
                    &self.slot(usize::from(slot))[from..from + len],
                    order,
                ),
                HostStep::FinishAvg { at, len } => {
                    if op == ReduceOp::Avg {
                        finish_avg(dtype, &mut call.recv[at..at + len], call.world);
                    }
                }
                HostStep::Post => {
                    if !announced {
                        self.announce(call.host_op, call.desc);
                        announced = true;
                    }
                    if let Some(m) = prog.mark() {
                        let word = mark_word(self.posted(self.me) + 1, call.desc);
                        self.mark(self.me, m).store(word, Ordering::Release);
                    }
                    self.post();
                }
                HostStep::Wait { count } => {
                    if let Some(stop) = self.wait_step(prog.mark(), call, count, at) {
                        return Ok(stop);
                    }
                }
            }
        }
        Ok(Stop::Done)
    }

    /// A program's wait (step `at`) for `count` posts of every rank in this operation, at the
    /// marks at byte `mark` of the slots if the program leaves them: `None` once the posts are
    /// in and every rank is in this call, else where the run stops.
    #[inline(always)]
    fn wait_step(
        &self,
        mark: Option<usize>,
        call: &HostCall<'_>,
        count: u32,
        at: usize,
    ) -> Option<Stop> {
        // Only the ranks seen asleep are woken while this one polls: the fenced wake would
        // first wait for this rank's writes to reach the other CPUs, and the last post may
        // come meanwhile. It comes before the run stops here, or when the operation ends; a
        // rank that went to sleep unseen sleeps at most as long as this rank polls.
        self.wake_seen();
        let target = call.base + u64::from(count);
        let seen = match mark {
            Some(m) => {
                let word = mark_word(target, call.desc);
                self.poll(call.spin, || self.all_marked(m, word))
            }
            None => self.poll(call.spin, || self.all_posted(target)),
        };
        if !seen {
            self.wake();
            return Some(Stop::Blocked { at });
        }
        if count > 0 {
            let (rank, desc) = self.first_unlike(call.host_op, call.desc)?;
            return Some(Stop::Unlike { at, rank, desc });
        }
        None
    }

    /// Whether `done` holds now or within `polls` more looks.
    #[inline(always)]
    fn poll(&self, polls: u32, done: impl Fn() -> bool) -> bool {
        if done() {
            return true;
        }
        for _ in 0..polls {
            std::hint::spin_loop();
            if done() {
                return true;
            }
        }
        false
    }

    /// The word at byte `at` of rank `r`'s slot, where a program's post leaves its mark
    /// ([`HostProgram::with_mark`]).
    fn mark(&self, r: usize, at: usize) -> &AtomicU64 {
        assert!(
            r < self.layout.ranks && at % 8 == 0 && at + 8 <= self.layout.slot,
            "no mark at byte {at} of host rank {r}'s slot"
        );
        // SAFETY: inside rank `r`'s slot (checked just above), which the mapping holds while
        // `&self` lives, and 8-aligned (slots start on page boundaries), as `AtomicU64`
        // needs. While a program with a mark runs, every rank accesses this word only through
        // atomics; data of other programs may cover it, ordered by posts and waits like any
        // slot byte, and a mark is compared whole with the one expected, so no data passes
        // for it.
        unsafe {
            &*self
                .map
                .ptr()
                .as_ptr()
                .add(self.layout.data_at + r * self.layout.slot + at)
                .cast::<AtomicU64>()
        }
    }

    /// Whether every other rank's mark at byte `at` of its slot is `word`.
    fn all_marked(&self, at: usize, word: u64) -> bool {
        (0..self.layout.ranks)
            .all(|r| r == self.me || self.mark(r, at).load(Ordering::Acquire) == word)
    }

    /// This rank's slot to write and rank `i`'s to read, at once (`i` is another rank).
    pub fn slot_pair(&mut self, i: usize) -> (&mut [u8], &[u8]) {
        assert!(
            i < self.layout.ranks && i != self.me,
            "host rank {i} is not another rank"
        );
        let base = self.map.ptr().as_ptr();
        let (mine, theirs) = (
            self.layout.data_at + self.me * self.layout.slot,
            self.layout.data_at + i * self.layout.slot,
        );
        // SAFETY: two distinct slots (`i != me`), so the two slices do not overlap; both lie in
        // the mapping, which `&mut self` keeps alive for the borrows. The rules of `my_slot` and
        // `slot` hold for each.
        unsafe {
            (
                std::slice::from_raw_parts_mut(base.add(mine), self.layout.slot),
                std::slice::from_raw_parts(base.add(theirs), self.layout.slot),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rank `me` of `ranks` with `slot`-byte slots, opening what `sh` shares.
    fn open(sh: &HostShare<'_>, ranks: usize, slot: usize, me: usize) -> Result<HostSegment> {
        let events = sh
            .events
            .iter()
            .map(|e| e.try_clone_to_owned().unwrap())
            .collect();
        HostSegment::open(
            sh.file.try_clone_to_owned().unwrap(),
            events,
            ranks,
            slot,
            me,
        )
    }

    /// Rank `r`'s program: its 2 floats into its slot at `at[r]`, a post, a wait, and the sum
    /// of slot 0 at `at[0]` and slot 1 at `at[1]` out.
    fn sum_of_two(at: [usize; 2], r: usize) -> HostProgram {
        HostProgram::new(vec![
            HostStep::CopyIn {
                src: CallBuf::Send,
                from: 0,
                to: at[r],
                len: 8,
            },
            HostStep::Post,
            HostStep::Wait { count: 1 },
            HostStep::Fused {
                to: 0,
                len: 8,
                a: (0, at[0]),
                b: (1, at[1]),
            },
        ])
    }

    /// A float sum of 2 ranks from `send` into `recv`.
    fn call<'a>(send: &'a [u8], recv: &'a mut [u8], host_op: u64, desc: u64) -> HostCall<'a> {
        HostCall {
            send: Some(send),
            recv,
            dtype: ccl_core::DataType::F32,
            op: ReduceOp::Sum,
            world: 2,
            host_op,
            desc,
            base: 0,
            spin: 10,
        }
    }

    fn floats(x: [f32; 2]) -> Vec<u8> {
        x.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    #[test]
    fn ranks_see_each_others_slots_and_posts() {
        let mut a = HostSegment::create(3, PAGE).unwrap();
        let sh = a.share();
        let mut b = open(&sh, sh.ranks, sh.slot, 1).unwrap();
        let c = open(&sh, sh.ranks, sh.slot, 2).unwrap();
        b.my_slot()[..3].copy_from_slice(b"bee");
        b.post();
        assert!(c.reached([1], 1) && !c.reached([0, 1], 1));
        assert_eq!(&a.slot(1)[..3], b"bee");
        // Rank 2 sleeps on ranks 0 and 1; rank 0's post wakes it.
        assert!(c.arm([0, 1], 1));
        a.my_slot()[0] = 1;
        a.post();
        a.wake();
        let mut fds = [nix::poll::PollFd::new(
            c.wait_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        assert_eq!(
            nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(5000u16)).unwrap(),
            1
        );
        assert!(c.reached([0, 1], 1));
        assert!(!c.arm([0, 1], 1), "nothing to wait for");
        a.announce(0, 77);
        a.announce(1, 78);
        assert_eq!((c.desc(0, 0), c.desc(0, 1), c.desc(0, 2)), (77, 78, 77));
    }

    #[test]
    fn two_ranks_run_a_program_that_stops_at_a_wait_and_goes_on_from_it() {
        let mut a = HostSegment::create(2, PAGE).unwrap();
        let mut b = open(&a.share(), 2, PAGE, 1).unwrap();
        // Rank r copies its 2 floats to its slot at 64 r.
        let prog = |r: usize| sum_of_two([0, 64], r);
        let f = floats;
        let (xa, xb) = (f([1.0, 2.0]), f([10.0, 20.0]));
        let (mut ra, mut rb) = ([0u8; 8], [0u8; 8]);
        let k = Kernels::BASELINE;
        let mut ca = call(&xa, &mut ra, 0, 7);
        assert_eq!(
            a.run(&prog(0), 0, &mut ca, &k).unwrap(),
            Stop::Blocked { at: 2 }
        );
        assert_eq!(ca.base, 0);
        let mut cb = call(&xb, &mut rb, 0, 7);
        assert_eq!(b.run(&prog(1), 0, &mut cb, &k).unwrap(), Stop::Done);
        assert_eq!(a.run(&prog(0), 3, &mut ca, &k).unwrap(), Stop::Done);
        assert_eq!(&ca.recv[..], &f([11.0, 22.0])[..]);
        assert_eq!(&cb.recv[..], &f([11.0, 22.0])[..]);
        // The next operation: rank 1 in another one is found at the wait.
        let (mut ra, mut rb) = ([0u8; 8], [0u8; 8]);
        let (mut ca, mut cb) = (call(&xa, &mut ra, 1, 7), call(&xb, &mut rb, 1, 8));
        assert_eq!(
            b.run(&prog(1), 0, &mut cb, &k).unwrap(),
            Stop::Blocked { at: 2 }
        );
        assert_eq!(cb.base, 1);
        let unlike = Stop::Unlike {
            at: 2,
            rank: 1,
            desc: 8,
        };
        assert_eq!(a.run(&prog(0), 0, &mut ca, &k).unwrap(), unlike);
        // Buffers too small for the program: an error before any step.
        let mut short = [0u8; 4];
        let e = a.run(&prog(0), 0, &mut call(&xa, &mut short, 1, 7), &k);
        assert!(e.unwrap_err().to_string().contains("receive bytes"));
        assert_eq!(a.posted(0), 2, "the refused run posted nothing");
    }

    #[test]
    fn a_post_leaves_a_mark_beside_its_data_and_a_wait_looks_for_the_marks() {
        let mut a = HostSegment::create(2, PAGE).unwrap();
        let mut b = open(&a.share(), 2, PAGE, 1).unwrap();
        // Every rank copies its 2 floats to the start of its slot, and marks byte 8 (both
        // ranks' programs are the same).
        let prog = sum_of_two([0, 0], 0).with_mark(8);
        let f = floats;
        let (xa, xb) = (f([1.0, 2.0]), f([10.0, 20.0]));
        let k = Kernels::BASELINE;
        let (mut ra, mut rb) = ([0u8; 8], [0u8; 8]);
        let (mut ca, mut cb) = (call(&xa, &mut ra, 0, 7), call(&xb, &mut rb, 0, 7));
        assert_eq!(
            a.run(&prog, 0, &mut ca, &k).unwrap(),
            Stop::Blocked { at: 2 }
        );
        assert_eq!(b.slot(0)[8..16], mark_word(1, 7).to_le_bytes());
        assert_eq!(a.posted(0), 1, "the counter is posted too");
        assert_eq!(b.run(&prog, 0, &mut cb, &k).unwrap(), Stop::Done);
        assert_eq!(a.run(&prog, 3, &mut ca, &k).unwrap(), Stop::Done);
        assert_eq!(&ca.recv[..], &f([11.0, 22.0])[..]);
        assert_eq!(&cb.recv[..], &f([11.0, 22.0])[..]);
        // A post without the mark (the counter only) does not end a wait for marks; the
        // counters, which a blocked wait then counts, have it.
        b.my_slot()[..8].copy_from_slice(&xb);
        b.post();
        let mut ra = [0u8; 8];
        let mut ca = call(&xa, &mut ra, 1, 7);
        assert_eq!(
            a.run(&prog, 0, &mut ca, &k).unwrap(),
            Stop::Blocked { at: 2 }
        );
        assert!(a.reached([1], 2));
        // Nor does the mark of another operation's post (a rank in another call), nor what
        // data left at the place.
        let (mut ra, mut rb) = ([0u8; 8], [0u8; 8]);
        let (mut ca, mut cb) = (call(&xa, &mut ra, 2, 7), call(&xb, &mut rb, 2, 8));
        assert_eq!(
            b.run(&prog, 0, &mut cb, &k).unwrap(),
            Stop::Blocked { at: 2 }
        );
        assert_eq!(
            a.run(&prog, 0, &mut ca, &k).unwrap(),
            Stop::Blocked { at: 2 }
        );
        assert_eq!(a.first_unlike(2, 7), Some((1, 8)));
        b.my_slot()[8..16].copy_from_slice(&[0xff; 8]);
        assert!(!a.all_marked(8, mark_word(3, 7)));
    }

    #[test]
    fn a_foreign_or_mismatched_segment_is_refused() {
        let a = HostSegment::create(2, PAGE).unwrap();
        let sh = a.share();
        assert!(open(&sh, 2, 2 * PAGE, 1).is_err());
        assert!(open(&sh, 2, PAGE, 2).is_err());
    }
}
