//! The operation header: 48 bytes a rank sends before its first data to a peer in every
//! operation, so that ranks calling different operations (another collective, count, type,
//! operator, root or algorithm, or a send of the wrong size) get an error describing both calls
//! instead of corrupt data or a hang.
//!
//! Layout (little endian): magic `CH`, version, kind ([`Collective::id`], or [`KIND_P2P`] for
//! send/recv), data type, operator, algorithm ([`Algo::id`]), reserved, root (u32), reserved
//! (u32), channel sequence (u64), count (u64), bytes for this peer (u64), and the time the sender
//! entered the operation (u64 microseconds since the epoch; the slow-rank report compares it with
//! the receiver's).
//!
//! The channel sequence counts headers on one direction of one pair of ranks. It is per pair
//! because point-to-point traffic legitimately differs from rank to rank; any correct program
//! sends the same number of operations each way between two ranks.

use ccl_core::{DataType, ReduceOp};

use ccl_algos::algo::{Algo, Collective};

pub(super) const HEADER_LEN: usize = 48;
const MAGIC: [u8; 2] = *b"CH";
/// Version 2: kind 7 became gather (point-to-point moved to 255), collectives with a count per
/// rank carry a fingerprint of their counts as the count.
const VERSION: u8 = 2;
/// Kind of a group of sends and receives (beyond every [`Collective::id`]).
pub(super) const KIND_P2P: u8 = 0xff;
const _: () = assert!(Collective::from_id(KIND_P2P).is_none());

/// A peer's header that does not match this rank's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(super) enum HeaderError {
    #[error(
        "not an operation header: the streams are out of step (an earlier operation moved a different number of bytes on one side)"
    )]
    NotAHeader,
    #[error(
        "operation header version {0} but this build speaks {VERSION} (mixed library versions?)"
    )]
    Version(u8),
    #[error("operation header with reserved bytes set")]
    Reserved,
    #[error(
        "operations out of step: this is operation {mine} between the two ranks here, {theirs} on the peer (one side called more operations)"
    )]
    OutOfStep { mine: u64, theirs: u64 },
    /// Both calls, described.
    #[error("mismatched calls: {0}")]
    Mismatch(String),
}

/// What one operation looks like to one peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Header {
    /// `Collective::id`, or [`KIND_P2P`].
    pub kind: u8,
    pub dtype: u8,
    pub op: u8,
    /// `Algo::id`.
    pub algo: u8,
    pub root: u32,
    pub seq: u64,
    pub count: u64,
    /// Bytes of data the sender sends to this peer in this operation.
    pub bytes: u64,
    /// When the sender entered the operation (microseconds since the epoch); not compared.
    pub entry_us: u64,
}

impl Header {
    pub(super) fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[..2].copy_from_slice(&MAGIC);
        b[2] = VERSION;
        b[3] = self.kind;
        b[4] = self.dtype;
        b[5] = self.op;
        b[6] = self.algo;
        b[8..12].copy_from_slice(&self.root.to_le_bytes());
        b[16..24].copy_from_slice(&self.seq.to_le_bytes());
        b[24..32].copy_from_slice(&self.count.to_le_bytes());
        b[32..40].copy_from_slice(&self.bytes.to_le_bytes());
        b[40..48].copy_from_slice(&self.entry_us.to_le_bytes());
        b
    }

    /// Parses a header; anything else means the two ranks' streams are out of step.
    pub(super) fn decode(b: &[u8; HEADER_LEN]) -> Result<Header, HeaderError> {
        if b[..2] != MAGIC {
            return Err(HeaderError::NotAHeader);
        }
        if b[2] != VERSION {
            return Err(HeaderError::Version(b[2]));
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        if b[7] != 0 || u32_at(12) != 0 {
            return Err(HeaderError::Reserved);
        }
        Ok(Header {
            kind: b[3],
            dtype: b[4],
            op: b[5],
            algo: b[6],
            root: u32_at(8),
            seq: u64_at(16),
            count: u64_at(24),
            bytes: u64_at(32),
            entry_us: u64_at(40),
        })
    }

    /// "allreduce of 1024 x float (sum, ring)" and the like.
    pub(super) fn describe(&self) -> String {
        if self.kind == KIND_P2P {
            return format!("send/recv of {} bytes", self.bytes);
        }
        let coll = Collective::from_id(self.kind).map_or_else(
            || format!("collective #{}", self.kind),
            |c| c.name().to_string(),
        );
        let dtype = DataType::from_u8(self.dtype)
            .map_or_else(|| format!("type #{}", self.dtype), |d| d.name().to_string());
        let algo = Algo::from_id(self.algo).map_or_else(
            || format!("algorithm #{}", self.algo),
            |a| a.name().to_string(),
        );
        let c = Collective::from_id(self.kind);
        let mut s = if c.is_some_and(Collective::per_rank) {
            // The count of these is a fingerprint of the counts array (0 for alltoallv, whose
            // pairs compare bytes instead).
            match self.count {
                0 => format!("{coll} of {dtype} ({algo}"),
                f => format!("{coll} of {dtype} (counts #{f:016x}, {algo}"),
            }
        } else {
            format!("{coll} of {} x {dtype} ({algo}", self.count)
        };
        if c.is_some_and(Collective::reduces) {
            let op = ReduceOp::from_u8(self.op)
                .map_or_else(|| format!("op #{}", self.op), |o| o.name().to_string());
            s.push_str(&format!(", {op}"));
        }
        if c.is_some_and(Collective::rooted) {
            s.push_str(&format!(", root {}", self.root));
        }
        s.push(')');
        s
    }

    /// The operation as one word, for ranks that meet in host memory rather than on a wire
    /// (never 0, which means "none yet"): the collective, type, op, the low 8 bits of the root
    /// and the low 32 of the count. Two calls that differ in any of those differ here.
    pub(super) fn host_desc(&self) -> u64 {
        1 << 63
            | u64::from(self.kind & 0x7F) << 56
            | u64::from(self.dtype) << 48
            | u64::from(self.op) << 40
            | u64::from(self.root as u8) << 32
            | (self.count & 0xFFFF_FFFF)
    }

    /// What [`host_desc`](Header::host_desc) keeps of a header, for messages.
    pub(super) fn from_host_desc(d: u64, algo: u8) -> Header {
        Header {
            kind: (d >> 56) as u8 & 0x7F,
            dtype: (d >> 48) as u8,
            op: (d >> 40) as u8,
            algo,
            root: u32::from((d >> 32) as u8),
            seq: 0,
            count: d & 0xFFFF_FFFF,
            bytes: 0,
            entry_us: 0,
        }
    }

    /// Compares the peer's header with what this rank expects from it.
    pub(super) fn check(mine: &Header, theirs: &Header) -> Result<(), HeaderError> {
        if mine.seq != theirs.seq {
            return Err(HeaderError::OutOfStep {
                mine: mine.seq,
                theirs: theirs.seq,
            });
        }
        let same_call = mine.kind == theirs.kind
            && mine.dtype == theirs.dtype
            && mine.op == theirs.op
            && mine.root == theirs.root
            && mine.count == theirs.count
            && mine.algo == theirs.algo;
        if !same_call || mine.bytes != theirs.bytes {
            return Err(HeaderError::Mismatch(format!(
                "this rank called {}{}, the peer called {}{}",
                mine.describe(),
                if mine.kind == KIND_P2P {
                    String::new()
                } else {
                    format!(" expecting {} bytes", mine.bytes)
                },
                theirs.describe(),
                if theirs.kind == KIND_P2P {
                    String::new()
                } else {
                    format!(" sending {} bytes", theirs.bytes)
                },
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h() -> Header {
        Header {
            kind: 0,
            dtype: DataType::F32 as u8,
            op: ReduceOp::Sum as u8,
            algo: 0,
            root: 0,
            seq: 3,
            count: 1024,
            bytes: 2048,
            entry_us: 1_700_000_000_000_000,
        }
    }

    #[test]
    fn round_trip_and_checks() {
        let a = h();
        assert_eq!(Header::decode(&a.encode()).unwrap(), a);
        assert!(Header::check(&a, &a).is_ok());
        let e = Header::check(&a, &Header { count: 512, ..a })
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("allreduce of 1024 x float (ring, sum)")
                && e.contains("allreduce of 512 x float"),
            "{e}"
        );
        let e = Header::check(&a, &Header { seq: 4, ..a })
            .unwrap_err()
            .to_string();
        assert!(e.contains("out of step"), "{e}");
        let b = Header {
            kind: Collective::Broadcast.id(),
            root: 2,
            ..a
        };
        assert!(b.describe().contains("root 2"), "{}", b.describe());
        let p = Header {
            kind: KIND_P2P,
            bytes: 77,
            ..a
        };
        assert_eq!(p.describe(), "send/recv of 77 bytes");
        assert!(
            Header::check(&p, &Header { bytes: 78, ..p })
                .unwrap_err()
                .to_string()
                .contains("78 bytes")
        );
    }

    /// Ids travel in headers between ranks, so they may never change.
    #[test]
    fn wire_ids_are_fixed() {
        let colls: Vec<u8> = Collective::ALL.iter().map(|c| c.id()).collect();
        assert_eq!(colls, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]);
        assert_eq!(Collective::Gather.id(), 7);
        assert_eq!(Collective::AllToAllV.id(), 11);
        assert_eq!(KIND_P2P, 0xff);
        assert_eq!(Collective::AllReduce.id(), 0);
        assert_eq!(Collective::Barrier.id(), 6);
        assert_eq!(Algo::Ring.id(), 0);
        assert_eq!(Algo::RecursiveDoubling.id(), 1);
        assert_eq!(Algo::Pairwise.id(), 2);
        assert_eq!(Algo::Tree.id(), 3);
        assert_eq!(Algo::HalvingDoubling.id(), 4);
        assert_eq!(Algo::Hierarchical.id(), 5);
        assert_eq!(Algo::Shm.id(), 6);
        assert_eq!(Algo::HierShm.id(), 7);
        for a in Algo::ALL {
            assert_eq!(Algo::from_id(a.id()), Some(a));
        }
        assert_eq!(Algo::from_id(8), None);
    }

    #[test]
    fn garbage_never_panics() {
        let good = h().encode();
        assert!(Header::decode(&[0u8; HEADER_LEN]).is_err());
        let mut x: u64 = 0x1234_5678_9abc_def1;
        for _ in 0..50_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let mut b = good;
            b[(x % HEADER_LEN as u64) as usize] = (x >> 8) as u8;
            if let Ok(d) = Header::decode(&b) {
                let _ = d.describe();
                let _ = Header::check(&h(), &d);
            }
            let mut r = [0u8; HEADER_LEN];
            for (i, v) in r.iter_mut().enumerate() {
                *v = (x >> (i % 8 * 8)) as u8;
            }
            let _ = Header::decode(&r);
        }
    }
}
