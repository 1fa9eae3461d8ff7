//! Wire formats: the listener's handle, the QP information peers exchange when they connect, and
//! the immediate values that ride on RDMA writes. All decoders take untrusted bytes and return
//! errors, never panic.

use std::net::SocketAddr;

use ccl_core::Result;
use ccl_core::transport::planes::MAX_PLANES;
use ccl_core::transport::{Handle, HandleFormat, decode_addrs, encode_addrs};

/// Handles: how many planes (ports), then the address of the listener's side channel (a TCP
/// socket) on each.
pub const HANDLE: HandleFormat = HandleFormat {
    transport: "ib",
    magic: b"CIB",
    version: 3,
};
/// First bytes of the QP information message (the last byte is the version).
pub const INFO_MAGIC: [u8; 8] = *b"CCLIBQ\x00\x01";
/// Most data QPs per connection (`CCL_IB_QPS_PER_CONN`).
pub const MAX_QPS: usize = 64;
/// Most staging slots (the slot index has 8 bits in the immediate value).
pub const MAX_SLOTS: usize = 256;
/// Largest payload of one write (24 bits of length in the immediate value).
pub const MAX_PIECE: usize = (1 << 24) - 1;

/// Encodes the listener's side-channel address on each plane as an ib handle.
pub fn encode_handles(addrs: &[SocketAddr]) -> Handle {
    HANDLE.encode(&encode_addrs(addrs))
}

/// Decodes a handle from [`encode_handles`]: at least one address, at most [`MAX_PLANES`].
pub fn decode_handles(h: &Handle) -> Result<Vec<SocketAddr>> {
    decode_addrs(&HANDLE, HANDLE.decode(h)?, MAX_PLANES)
}

/// A queue pair's address: number and initial packet sequence number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpAddr {
    pub qpn: u32,
    pub psn: u32,
}

/// What one side of a connection tells the other: how to reach its QPs and where its receive
/// staging ring is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QpInfo {
    /// The sender's rank.
    pub rank: u32,
    /// `ibv_mtu` value of the sender's port `active_mtu`.
    pub mtu: u8,
    pub lid: u16,
    pub gid: [u8; 16],
    pub slots: u16,
    pub slot_size: u32,
    /// Receive ring: address and rkey.
    pub ring_addr: u64,
    pub ring_rkey: u32,
    pub ctrl: QpAddr,
    pub data: Vec<QpAddr>,
}

impl QpInfo {
    /// Encoded length for `nqp` data QPs.
    pub const fn encoded_len(nqp: usize) -> usize {
        8 + 4 + 1 + 1 + 2 + 16 + 2 + 4 + 8 + 4 + 8 + 8 * nqp
    }

    /// Length of the fixed part, which tells how long the rest is.
    pub const HEADER_LEN: usize = 8 + 4 + 1;

    pub fn encode(&self) -> Vec<u8> {
        assert!(
            !self.data.is_empty() && self.data.len() <= MAX_QPS,
            "QP count checked by the config"
        );
        let mut b = Vec::with_capacity(Self::encoded_len(self.data.len()));
        b.extend_from_slice(&INFO_MAGIC);
        b.extend_from_slice(&self.rank.to_le_bytes());
        b.push(self.data.len() as u8);
        b.push(self.mtu);
        b.extend_from_slice(&self.lid.to_le_bytes());
        b.extend_from_slice(&self.gid);
        b.extend_from_slice(&self.slots.to_le_bytes());
        b.extend_from_slice(&self.slot_size.to_le_bytes());
        b.extend_from_slice(&self.ring_addr.to_le_bytes());
        b.extend_from_slice(&self.ring_rkey.to_le_bytes());
        for q in std::iter::once(&self.ctrl).chain(&self.data) {
            b.extend_from_slice(&q.qpn.to_le_bytes());
            b.extend_from_slice(&q.psn.to_le_bytes());
        }
        debug_assert_eq!(b.len(), Self::encoded_len(self.data.len()));
        b
    }

    /// The total message length announced by a header of [`QpInfo::HEADER_LEN`] bytes.
    pub fn len_from_header(h: &[u8]) -> Result<usize, String> {
        if h.len() < Self::HEADER_LEN {
            return Err("short QP information header".into());
        }
        if h[..7] != INFO_MAGIC[..7] {
            return Err("not ccl QP information (bad magic)".into());
        }
        if h[7] != INFO_MAGIC[7] {
            return Err(format!(
                "QP information version {} but this build speaks {} (mixed library versions?)",
                h[7], INFO_MAGIC[7]
            ));
        }
        let nqp = h[12] as usize;
        if nqp == 0 || nqp > MAX_QPS {
            return Err(format!("QP information announces {nqp} data QPs"));
        }
        Ok(Self::encoded_len(nqp))
    }

    pub fn decode(b: &[u8]) -> Result<QpInfo, String> {
        let len = Self::len_from_header(b)?;
        if b.len() != len {
            return Err(format!(
                "QP information of {} bytes, expected {len}",
                b.len()
            ));
        }
        let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        let nqp = b[12] as usize;
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[16..32]);
        let info = QpInfo {
            rank: u32_at(8),
            mtu: b[13],
            lid: u16_at(14),
            gid,
            slots: u16_at(32),
            slot_size: u32_at(34),
            ring_addr: u64_at(38),
            ring_rkey: u32_at(46),
            ctrl: QpAddr {
                qpn: u32_at(50),
                psn: u32_at(54),
            },
            data: (0..nqp)
                .map(|i| QpAddr {
                    qpn: u32_at(58 + 8 * i),
                    psn: u32_at(62 + 8 * i),
                })
                .collect(),
        };
        if !(1..=5).contains(&info.mtu) {
            return Err(format!("QP information with MTU code {}", info.mtu));
        }
        if info.slots < 2 || info.slots as usize > MAX_SLOTS {
            return Err(format!("QP information with {} slots", info.slots));
        }
        if info.slot_size == 0 || info.slot_size as usize > MAX_PIECE {
            return Err(format!("QP information with slot size {}", info.slot_size));
        }
        for q in std::iter::once(&info.ctrl).chain(&info.data) {
            if q.qpn >= 1 << 24 || q.psn >= 1 << 24 {
                return Err(format!(
                    "QP information with QP {:#x} PSN {:#x}",
                    q.qpn, q.psn
                ));
            }
        }
        Ok(info)
    }
}

/// The immediate value of a data write: slot index (8 bits) and payload length (24 bits).
pub fn encode_imm(slot: usize, len: usize) -> u32 {
    debug_assert!(slot < MAX_SLOTS && len <= MAX_PIECE);
    ((slot as u32) << 24) | (len as u32)
}

/// Inverse of [`encode_imm`]: `(slot, len)`.
pub fn decode_imm(imm: u32) -> (usize, usize) {
    ((imm >> 24) as usize, (imm & 0x00ff_ffff) as usize)
}

/// The length field of a write into a granted range instead of a ring slot ([`Grant`]): zero,
/// which no ring write carries; the receiver takes the length from the completion.
pub const DIRECT_LEN: usize = 0;

/// First bytes of a grant (the last is the version).
pub const GRANT_MAGIC: [u8; 4] = *b"CGR\x01";
/// Bytes of an encoded [`Grant`], the payload of a control SEND.
pub const GRANT_LEN: usize = 4 + 8 + 8 + 4 + 4;

/// A receiver's clear-to-send for a range of registered memory: the bytes of its stream from
/// `offset` to `offset + len` may be RDMA-written straight to `addr` onwards (with `rkey`)
/// instead of into the ring. Bytes the sender had already written into the ring when the grant
/// arrived stay there; it writes the rest of the range directly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    pub offset: u64,
    pub addr: u64,
    pub len: u32,
    pub rkey: u32,
}

impl Grant {
    pub fn encode(&self) -> [u8; GRANT_LEN] {
        let mut b = [0u8; GRANT_LEN];
        b[..4].copy_from_slice(&GRANT_MAGIC);
        b[4..12].copy_from_slice(&self.offset.to_le_bytes());
        b[12..20].copy_from_slice(&self.addr.to_le_bytes());
        b[20..24].copy_from_slice(&self.len.to_le_bytes());
        b[24..28].copy_from_slice(&self.rkey.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Grant, String> {
        if b.len() != GRANT_LEN || b[..4] != GRANT_MAGIC {
            return Err(format!(
                "a control message of {} bytes that is not a grant",
                b.len()
            ));
        }
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let g = Grant {
            offset: u64_at(4),
            addr: u64_at(12),
            len: u32_at(20),
            rkey: u32_at(24),
        };
        if g.len == 0 || g.addr.checked_add(g.len as u64).is_none() {
            return Err(format!(
                "a grant of {} bytes at {:#x}, which is empty or wraps",
                g.len, g.addr
            ));
        }
        Ok(g)
    }

    /// First address past the range.
    pub fn end_addr(&self) -> u64 {
        self.addr + self.len as u64
    }

    /// First stream offset past the range.
    pub fn end(&self) -> u64 {
        self.offset + self.len as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grant_round_trip_and_refusals() {
        let g = Grant {
            offset: 1 << 40,
            addr: 0x7f00_1234_5000,
            len: 3 << 20,
            rkey: 0xdead_beef,
        };
        assert_eq!(Grant::decode(&g.encode()), Ok(g));
        assert_eq!(g.end(), (1 << 40) + (3 << 20));
        assert!(Grant::decode(&g.encode()[..GRANT_LEN - 1]).is_err());
        let mut bad = g.encode();
        bad[0] = b'X';
        assert!(Grant::decode(&bad).is_err());
        let empty = Grant { len: 0, ..g };
        assert!(Grant::decode(&empty.encode()).is_err());
        let wraps = Grant {
            addr: u64::MAX - 10,
            ..g
        };
        assert!(Grant::decode(&wraps.encode()).is_err());
    }

    fn info(nqp: usize) -> QpInfo {
        QpInfo {
            rank: 3,
            mtu: 5,
            lid: 0,
            gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 1],
            slots: 16,
            slot_size: 256 << 10,
            ring_addr: 0x7f00_dead_b000,
            ring_rkey: 0x1234,
            ctrl: QpAddr {
                qpn: 0x11,
                psn: 0xabcdef,
            },
            data: (0..nqp)
                .map(|i| QpAddr {
                    qpn: 0x20 + i as u32,
                    psn: i as u32 * 7,
                })
                .collect(),
        }
    }

    #[test]
    fn handle_round_trip_and_garbage() {
        let a: SocketAddr = "192.0.2.1:4567".parse().unwrap();
        let h = encode_handles(&[a]);
        assert_eq!(decode_handles(&h).unwrap(), [a]);
        let a6: SocketAddr = "[fd00::9]:1".parse().unwrap();
        // One address per plane, as many as a handle holds, IPv6 the longest.
        let most = vec![a6; MAX_PLANES];
        assert_eq!(decode_handles(&encode_handles(&most)).unwrap(), most);
        assert_eq!(decode_handles(&encode_handles(&[a, a6])).unwrap(), [a, a6]);
        // A TCP handle is refused with a hint.
        let e = decode_handles(&ccl_core::transport::tcp::encode_handle(a)).unwrap_err();
        assert!(e.to_string().contains("same transport"), "{e}");
        assert!(decode_handles(&HANDLE.encode(b"\x04")).is_err());
        assert!(decode_handles(&HANDLE.encode(b"\x00")).is_err());
        let mut too_many = vec![MAX_PLANES as u8 + 1];
        too_many.extend(std::iter::repeat_n(&encode_addrs(&[a])[1..], MAX_PLANES + 1).flatten());
        let e = decode_handles(&HANDLE.encode(&too_many)).unwrap_err();
        assert!(e.to_string().contains("planes"), "{e}");
    }

    #[test]
    fn qp_info_round_trip() {
        for n in [1, 4, MAX_QPS] {
            let i = info(n);
            let b = i.encode();
            assert_eq!(b.len(), QpInfo::encoded_len(n));
            assert_eq!(
                QpInfo::len_from_header(&b[..QpInfo::HEADER_LEN]).unwrap(),
                b.len()
            );
            assert_eq!(QpInfo::decode(&b).unwrap(), i);
        }
    }

    #[test]
    fn qp_info_garbage_is_refused_without_panic() {
        let good = info(4).encode();
        for n in 0..good.len() {
            assert!(QpInfo::decode(&good[..n]).is_err());
            let _ = QpInfo::len_from_header(&good[..n]);
        }
        let mut long = good.clone();
        long.push(0);
        assert!(QpInfo::decode(&long).is_err());
        for i in 0..good.len() {
            for v in [0u8, 1, 0x40, 0x41, 0xff] {
                let mut c = good.clone();
                c[i] = v;
                let _ = QpInfo::decode(&c);
            }
        }
        let mut c = good.clone();
        c[7] = 9;
        assert!(QpInfo::decode(&c).unwrap_err().contains("version 9"));
        let mut c = good.clone();
        c[12] = 0;
        assert!(QpInfo::decode(&c).is_err());
        let mut c = good;
        c[13] = 9;
        assert!(QpInfo::decode(&c).unwrap_err().contains("MTU"));
    }

    #[test]
    fn imm_round_trip() {
        for (s, l) in [(0, 0), (0, 1), (7, 4096), (255, MAX_PIECE), (128, 1 << 20)] {
            assert_eq!(decode_imm(encode_imm(s, l)), (s, l));
        }
    }
}
