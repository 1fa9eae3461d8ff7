//! The symbolic executor's model of host memory: the slots the ranks of one host share, and
//! what orders their reads and writes (posts, and the waits that saw them), so a schedule that
//! reads a slot before its owner's post published it fails the check.

use super::*;

impl HostModel {
    pub(super) fn new(n: usize, slot: usize) -> HostModel {
        if slot == 0 {
            return HostModel::default();
        }
        HostModel {
            slots: vec![vec![None; slot]; n],
            posted: vec![0; n],
            post_heard: vec![0; n],
            seen: vec![vec![0; n]; n],
            written: vec![vec![0; slot]; n],
            reads: vec![vec![Vec::new(); slot]; n],
            touched: BTreeMap::new(),
        }
    }

    /// Every rank has posted `count` times.
    pub(super) fn reached(&self, count: u32) -> bool {
        self.posted.iter().all(|&p| p >= u64::from(count))
    }

    /// Rank `r` reads `len` elements of rank `i`'s slot from `off`: each must have been published
    /// to `r` by a post it waited for.
    pub(super) fn read(
        &mut self,
        r: usize,
        i: usize,
        off: usize,
        len: usize,
    ) -> Result<Vec<Slot>, String> {
        let slot = self
            .slots
            .get(i)
            .and_then(|s| s.get(off..off + len))
            .ok_or_else(|| format!("host slot {i} [{off}, +{len}) is outside the slot"))?
            .to_vec();
        for e in off..off + len {
            if r != i && self.seen[r][i] <= self.written[i][e] {
                return Err(format!(
                    "reads element {e} of rank {i}'s host slot before rank {i}'s post that \
                     publishes it (written after its post {}, waited for {})",
                    self.written[i][e], self.seen[r][i]
                ));
            }
            self.reads[i][e].push((r, self.posted[r]));
        }
        Ok(slot)
    }

    /// Rank `r` writes its own slot: every earlier reader of those elements must have posted
    /// since its read, and `r` must have waited for that post.
    pub(super) fn write(
        &mut self,
        r: usize,
        i: usize,
        off: usize,
        v: &[Slot],
    ) -> Result<(), String> {
        if i != r {
            return Err(format!("writes rank {i}'s host slot"));
        }
        if self.slots.get(r).is_none_or(|s| off + v.len() > s.len()) {
            return Err(format!(
                "host slot [{off}, +{}) is outside the slot",
                v.len()
            ));
        }
        for e in off..off + v.len() {
            if let Some(&(q, p)) = self.reads[r][e]
                .iter()
                .find(|&&(q, p)| q != r && self.seen[r][q] <= p)
            {
                return Err(format!(
                    "overwrites element {e} of its host slot before rank {q} posted that it read \
                     it (read after its post {p}, waited for {})",
                    self.seen[r][q]
                ));
            }
            self.reads[r][e].clear();
            self.written[r][e] = self.posted[r];
        }
        self.slots[r][off..off + v.len()].copy_from_slice(v);
        Ok(())
    }
}

impl HostModel {
    pub(super) fn touches(&mut self, owner: usize, b: Buf, off: usize, len: usize) -> &mut [Touch] {
        let v = self.touched.entry((owner, b)).or_default();
        if v.len() < off + len {
            v.resize(
                off + len,
                Touch {
                    writer: (owner, 0),
                    readers: Vec::new(),
                },
            );
        }
        &mut v[off..off + len]
    }

    /// Host rank `r` reads (`write` false) or writes elements of host rank `o`'s buffer `b`. A
    /// read must come after the post that publishes every other rank's write of them; a write
    /// after every other rank that read or wrote them posted, and `r` waited for that post.
    pub(super) fn access_buf(
        &mut self,
        r: usize,
        (o, b): (usize, Buf),
        off: usize,
        len: usize,
        write: bool,
    ) -> Result<(), String> {
        let (seen, posted) = (self.seen[r].clone(), self.posted[r]);
        for (k, t) in self.touches(o, b, off, len).iter_mut().enumerate() {
            let readers: &[(usize, u64)] = if write { &t.readers } else { &[] };
            if let Some(&(q, p)) = std::iter::once(&t.writer)
                .chain(readers)
                .find(|&&(q, p)| q != r && seen[q] <= p)
            {
                let what = if write {
                    format!(
                        "writes element {} of rank {o}'s {b:?} before rank {q} posted that it is done with it",
                        off + k
                    )
                } else {
                    format!(
                        "reads element {} of rank {o}'s {b:?} before rank {q}'s post that publishes its write",
                        off + k
                    )
                };
                return Err(format!(
                    "{what} (accessed after its post {p}, waited for {})",
                    seen[q]
                ));
            }
            if write {
                t.writer = (r, posted);
                t.readers.clear();
            } else {
                t.readers.push((r, posted));
            }
        }
        Ok(())
    }

    /// Every owner gets its buffers back only once every other rank that accessed them posted
    /// after the access and the owner waited for that post.
    pub(super) fn check_handed_back(&self) -> Result<(), String> {
        for (&(o, b), v) in &self.touched {
            for (e, t) in v.iter().enumerate() {
                if let Some(&(q, p)) = std::iter::once(&t.writer)
                    .chain(&t.readers)
                    .find(|&&(q, p)| q != o && self.seen[o][q] <= p)
                {
                    return Err(format!(
                        "rank {o} ends the operation while rank {q} may still access element {e} \
                         of its {b:?} (accessed after its post {p}, waited for {})",
                        self.seen[o][q]
                    ));
                }
            }
        }
        Ok(())
    }
}
