//! Point-to-point sends and receives, alone or grouped.
//!
//! A group (NCCL's `ncclGroupStart`/`ncclGroupEnd` around sends and receives) runs all its
//! operations at once as one schedule, so exchanges such as "send to the left, receive from the
//! right" cannot deadlock however large they are. Operations with the same peer match in the
//! order they were added, on both sides.
//!
//! A receive may also take whichever send reaches this rank first ([`Communicator::recv_any`],
//! or [`Communicator::probe`] then receives from the peer it names), as `MPI_ANY_SOURCE` does.

use crate::exec::{ExtraBuf, OpInfo, OpKind};
use ccl_algos::schedule::{Action, Buf, Combine, Region, Schedule};

use crate::engine::Execution;
use crate::{Communicator, DataType, Element, Error, Probed, ReduceOp, Result};

enum Op<'b> {
    Send { peer: usize, buf: &'b [u8] },
    Recv { peer: usize, buf: &'b mut [u8] },
}

/// Sends and receives that run together; see [`Communicator::group`].
pub struct Group<'c, 'b> {
    comm: &'c Communicator,
    ops: Vec<Op<'b>>,
}

impl std::fmt::Debug for Group<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Group({} ops)", self.ops.len())
    }
}

impl<'c, 'b> Group<'c, 'b> {
    fn check_peer(&self, what: &str, peer: usize) -> Result<()> {
        let n = self.comm.size();
        if peer >= n {
            return Err(Error::invalid_argument(format!(
                "{what}: peer {peer} is out of range for {n} ranks"
            ))
            .rank(self.comm.rank()));
        }
        Ok(())
    }

    /// Adds a send of `buf` to `peer`.
    pub fn send<T: Element>(&mut self, buf: &'b [T], peer: usize) -> Result<&mut Self> {
        self.check_peer("send", peer)?;
        self.ops.push(Op::Send {
            peer,
            buf: bytemuck::cast_slice(buf),
        });
        Ok(self)
    }

    /// Adds a receive into `buf` from `peer`; the matching send must have the same byte length.
    pub fn recv<T: Element>(&mut self, buf: &'b mut [T], peer: usize) -> Result<&mut Self> {
        self.check_peer("recv", peer)?;
        self.ops.push(Op::Recv {
            peer,
            buf: bytemuck::cast_slice_mut(buf),
        });
        Ok(self)
    }

    /// Runs every operation of the group and returns when all are done.
    pub fn run(self) -> Result<()> {
        let comm = self.comm;
        comm.order.blocking(|| self.run_in_turn())
    }

    /// [`run`](Group::run), once it is this call's turn among the communicator's operations.
    fn run_in_turn(self) -> Result<()> {
        let me = self.comm.rank();
        let mut sched = Schedule::new("p2p");
        let mut extra: Vec<ExtraBuf<'b>> = Vec::with_capacity(self.ops.len());
        // Sends to oneself are copies, matched with receives from oneself in order.
        let mut self_sends: Vec<&'b [u8]> = Vec::new();
        let mut self_recvs: Vec<&'b mut [u8]> = Vec::new();
        let mut bytes = 0;
        for op in self.ops {
            match op {
                Op::Send { peer, buf } if peer == me => self_sends.push(buf),
                Op::Recv { peer, buf } if peer == me => self_recvs.push(buf),
                Op::Send { peer, buf } => {
                    let i = extra.len() as u16;
                    bytes += buf.len();
                    sched.push(
                        Action::Send {
                            peer,
                            src: Region::new(Buf::Extra(i), 0, buf.len()),
                        },
                        &[],
                        None,
                        0,
                    );
                    extra.push(ExtraBuf::Src(buf));
                }
                Op::Recv { peer, buf } => {
                    let i = extra.len() as u16;
                    sched.push(
                        Action::Recv {
                            peer,
                            dst: Region::new(Buf::Extra(i), 0, buf.len()),
                            combine: Combine::Copy,
                        },
                        &[],
                        None,
                        0,
                    );
                    extra.push(ExtraBuf::Dst(buf));
                }
            }
        }
        if self_sends.len() != self_recvs.len() {
            return Err(Error::invalid_usage(format!(
                "group: {} send(s) to self but {} receive(s) from self",
                self_sends.len(),
                self_recvs.len()
            ))
            .rank(me));
        }
        for (s, r) in self_sends.iter().zip(self_recvs.iter_mut()) {
            if s.len() != r.len() {
                return Err(Error::invalid_argument(format!(
                    "group: a send to self of {} bytes meets a receive from self of {} bytes",
                    s.len(),
                    r.len()
                ))
                .rank(me));
            }
            r.copy_from_slice(s);
        }
        if sched.ops.is_empty() {
            return Ok(());
        }
        let sched = sched.finish();
        let d = OpInfo {
            kind: OpKind::PointToPoint,
            bytes,
            root: 0,
            count: 0,
        };
        self.comm.engine.execute(Execution {
            sched: &sched,
            send: None,
            recv: &mut [],
            extra,
            dtype: DataType::U8,
            op: ReduceOp::Sum,
            info: d,
            local: None,
        })
    }
}

impl Communicator {
    /// Starts a group of sends and receives that run together.
    pub fn group<'b>(&self) -> Group<'_, 'b> {
        Group {
            comm: self,
            ops: Vec::new(),
        }
    }

    /// Sends `buf` to `peer` and returns once the transport has taken all of it. Exchanges in
    /// both directions belong in a [`group`](Communicator::group).
    pub fn send<T: Element>(&self, buf: &[T], peer: usize) -> Result<()> {
        let mut g = self.group();
        g.send(buf, peer)?;
        g.run()
    }

    /// Receives into `buf` from `peer`.
    pub fn recv<T: Element>(&self, buf: &mut [T], peer: usize) -> Result<()> {
        let mut g = self.group();
        g.recv(buf, peer)?;
        g.run()
    }

    /// Waits until some peer's next operation toward this rank is a send (alone or in a
    /// group), and says which peer and how many bytes it sends here; lowest rank first when
    /// several wait. Nothing is received: receive it next with [`recv`](Communicator::recv) or
    /// a group naming that peer (another thread's call in between may take it first).
    ///
    /// A send waits to be found once its header has arrived, which every transport lets go
    /// before the receiver posts anything. Peers whose next operation here is a collective
    /// are passed over. After `CCL_TIMEOUT` with no such send it fails with a timeout that
    /// names what each peer has announced instead; the communicator stays usable.
    pub fn probe(&self) -> Result<Probed> {
        self.order.blocking(|| self.engine.probe())
    }

    /// Receives into `buf` the first send to reach this rank from any peer, and returns that
    /// peer ([`probe`](Communicator::probe), then [`recv`](Communicator::recv)). The send must
    /// have `buf`'s byte length, as for `recv`.
    pub fn recv_any<T: Element>(&self, buf: &mut [T]) -> Result<usize> {
        self.order.blocking(|| {
            let found = self.engine.probe()?;
            let mut g = self.group();
            g.recv(buf, found.peer)?;
            g.run_in_turn()?;
            Ok(found.peer)
        })
    }
}
