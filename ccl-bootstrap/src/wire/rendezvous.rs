//! The rendezvous's frames: a rank's hello to the root, and the requests and blocks of the
//! allgather among the ranks.

use std::net::SocketAddr;

use ccl_core::error::{Error, Result};
use ccl_core::transport::{decode_addr, encode_addr};

use super::codec::{Frame, FrameKind, decode_blobs, encode_blobs};

/// Most ranks a root admits (a sanity bound on the size a hello may claim).
pub const MAX_RANKS: usize = 1 << 20;

const HELLO_MAGIC: [u8; 8] = *b"CCLBOOT2";
const GATHER_MAGIC: [u8; 8] = *b"CCLGATH1";

/// A rank's first message to the root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    pub secret: [u8; 32],
    pub rank: usize,
    pub size: usize,
    /// Where this rank listens for the others' allgather requests (none when alone).
    pub listen: Option<SocketAddr>,
}

impl Hello {
    pub fn encode(&self) -> Frame {
        let mut p = Vec::with_capacity(48 + 19);
        p.extend_from_slice(&HELLO_MAGIC);
        p.extend_from_slice(&self.secret);
        p.extend_from_slice(&(self.rank as u32).to_le_bytes());
        p.extend_from_slice(&(self.size as u32).to_le_bytes());
        if let Some(a) = self.listen {
            p.extend_from_slice(&encode_addr(a));
        }
        Frame::new(FrameKind::Hello, p)
    }

    pub fn decode(f: &Frame) -> std::result::Result<Hello, String> {
        if f.kind != FrameKind::Hello {
            return Err(format!("expected a hello, got {:?}", f.kind));
        }
        let p = &f.payload;
        if p.len() < 48 || p[..8] != HELLO_MAGIC {
            return Err("not a ccl bootstrap hello (or one of another version)".into());
        }
        let listen = match &p[48..] {
            [] => None,
            a => Some(decode_addr(a).ok_or("a hello with a malformed listening address")?),
        };
        Ok(Hello {
            secret: p[8..40].try_into().expect("32 bytes"),
            rank: u32::from_le_bytes(p[40..44].try_into().expect("4 bytes")) as usize,
            size: u32::from_le_bytes(p[44..48].try_into().expect("4 bytes")) as usize,
            listen,
        })
    }
}

/// A rank's request to another for its block of one allgather step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatherAsk {
    pub secret: [u8; 32],
    pub rank: usize,
    pub round: u32,
    pub step: u32,
}

impl GatherAsk {
    pub fn encode(&self) -> Frame {
        let mut p = Vec::with_capacity(52);
        p.extend_from_slice(&GATHER_MAGIC);
        p.extend_from_slice(&self.secret);
        p.extend_from_slice(&(self.rank as u32).to_le_bytes());
        p.extend_from_slice(&self.round.to_le_bytes());
        p.extend_from_slice(&self.step.to_le_bytes());
        Frame::new(FrameKind::Gather, p)
    }

    pub fn decode(f: &Frame) -> std::result::Result<GatherAsk, String> {
        let p = &f.payload;
        if f.kind != FrameKind::Gather || p.len() != 52 || p[..8] != GATHER_MAGIC {
            return Err(format!("not a ccl allgather request ({:?})", f.kind));
        }
        let u32_at = |o: usize| u32::from_le_bytes(p[o..o + 4].try_into().expect("4 bytes"));
        Ok(GatherAsk {
            secret: p[8..40].try_into().expect("32 bytes"),
            rank: u32_at(40) as usize,
            round: u32_at(44),
            step: u32_at(48),
        })
    }
}

/// One allgather step's answer: the records asked for and, while the steps go on, where the
/// asker's partner of the next step listens (the answering rank's own partner of this step).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    pub next: Option<SocketAddr>,
    pub records: Vec<Vec<u8>>,
}

impl Block {
    pub fn encode(&self) -> Frame {
        let addr = self.next.map(encode_addr).unwrap_or_default();
        let mut p = vec![addr.len() as u8];
        p.extend_from_slice(&addr);
        p.extend_from_slice(&encode_blobs(&self.records));
        Frame::new(FrameKind::Block, p)
    }

    pub fn decode(p: &[u8]) -> Result<Block> {
        let bad = || Error::remote("malformed bootstrap allgather block");
        let (&n, rest) = p.split_first().ok_or_else(bad)?;
        let (addr, rest) = rest.split_at_checked(n as usize).ok_or_else(bad)?;
        let next = match addr {
            [] => None,
            a => Some(decode_addr(a).ok_or_else(bad)?),
        };
        Ok(Block {
            next,
            records: decode_blobs(rest)?,
        })
    }
}
