//! `Communicator::split` (NCCL's `ncclCommSplit`, MPI's `MPI_Comm_split`).

use ccl_bootstrap::{UNIQUE_ID_BYTES, UniqueId};

use crate::{Communicator, Error, Result};

/// Wire form of "no color" in the exchange (NCCL's `NCCL_SPLIT_NOCOLOR`).
const NO_COLOR: i64 = -1;

impl Communicator {
    /// Splits into disjoint communicators: ranks passing the same `color` form one, ordered by
    /// `key` then by their rank here; `None` takes part in the call but joins nothing. Every rank
    /// must call it (it is a collective on this communicator). The new communicators have this
    /// one's settings and connect afresh; the rank with the lowest new rank hosts their
    /// rendezvous.
    pub fn split(&self, color: Option<u32>, key: i64) -> Result<Option<Communicator>> {
        let (me, n) = (self.rank(), self.size());
        let mine = [color.map_or(NO_COLOR, i64::from), key];
        let mut all = vec![0i64; 2 * n];
        self.all_gather(&mine, &mut all)?;
        let members = |c: i64| -> Vec<usize> {
            let mut m: Vec<usize> = (0..n).filter(|&r| all[2 * r] == c).collect();
            m.sort_by_key(|&r| (all[2 * r + 1], r));
            m
        };
        // Each group's leader makes a unique id; every rank learns its leader's through one more
        // allgather.
        let my_members = color.map(|c| members(i64::from(c)));
        let leader = my_members.as_ref().map(|m| m[0]);
        let mut id_bytes = [0u8; UNIQUE_ID_BYTES];
        if leader == Some(me) {
            let id = UniqueId::new_at(self.engine.peers.local_ip(), self.config())?;
            id_bytes.copy_from_slice(id.as_bytes());
        }
        let mut ids = vec![0u8; UNIQUE_ID_BYTES * n];
        self.all_gather(&id_bytes, &mut ids)?;
        let (Some(m), Some(l)) = (my_members, leader) else {
            return Ok(None);
        };
        let id = UniqueId::from_bytes(&ids[l * UNIQUE_ID_BYTES..(l + 1) * UNIQUE_ID_BYTES])
            .map_err(|e| {
                Error::internal(format!("split: leader {l} sent a bad unique id: {e}")).rank(me)
            })?;
        let new_rank = m
            .iter()
            .position(|&r| r == me)
            .expect("a rank is a member of its color");
        // The new communicator's ranks stay where they are: its part of this topology (a
        // topology file would name this communicator's ranks).
        let mut config = self.config().clone();
        config.topo_file = None;
        config.topology = Some(self.engine.peers.topology().subset(&m));
        Communicator::init_with_config(&id, new_rank, m.len(), config)
            .map(Some)
            .map_err(|e| e.context(format!("split: joining color {}", color.unwrap_or(0))))
    }
}
