//! The unique id: the 128-byte token every rank of a communicator passes to its constructor
//! (NCCL's `ncclUniqueId`), naming the root's address and the job's secret.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use ccl_core::error::{Error, ErrorKind, Result};

/// Size of a unique id in bytes (NCCL's `NCCL_UNIQUE_ID_BYTES`).
pub const UNIQUE_ID_BYTES: usize = 128;
const ID_MAGIC: [u8; 8] = *b"CCLUID\0\x01";
const SECRET_OFF: usize = 8;
const FAMILY_OFF: usize = 40;
const PORT_OFF: usize = 42;
const ADDR_OFF: usize = 44;
const CHECK_OFF: usize = 124;

/// The 128-byte token every rank of a communicator passes to its constructor.
///
/// Layout: magic and version (8), secret (32), address family (1), reserved (1), port (2, big
/// endian), address (16), reserved zeros, FNV-1a checksum of bytes 0..124 (4). The checksum and
/// the zero padding catch ids that were truncated or mangled on their way between processes.
#[derive(Clone, PartialEq, Eq)]
pub struct UniqueId {
    bytes: [u8; UNIQUE_ID_BYTES],
}

impl fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the secret.
        write!(f, "UniqueId(root {})", self.root_addr())
    }
}

/// The id's checksum: FNV-1a folded to 32 bits.
fn checksum(b: &[u8]) -> u32 {
    let h = ccl_core::hash::fnv1a(b);
    (h ^ (h >> 32)) as u32
}

/// 32 random bytes from the operating system.
pub fn random_secret() -> Result<[u8; 32]> {
    let mut s = [0u8; 32];
    getrandom::getrandom(&mut s).map_err(|e| {
        Error::new(
            ErrorKind::System,
            format!("cannot get random bytes for the secret: {e}"),
        )
    })?;
    Ok(s)
}

impl UniqueId {
    /// An id naming an existing root at `addr` with `secret`; starts nothing.
    pub fn for_address(addr: SocketAddr, secret: [u8; 32]) -> UniqueId {
        let mut b = [0u8; UNIQUE_ID_BYTES];
        b[..8].copy_from_slice(&ID_MAGIC);
        b[SECRET_OFF..SECRET_OFF + 32].copy_from_slice(&secret);
        b[PORT_OFF..PORT_OFF + 2].copy_from_slice(&addr.port().to_be_bytes());
        match addr.ip() {
            IpAddr::V4(v4) => {
                b[FAMILY_OFF] = 4;
                b[ADDR_OFF..ADDR_OFF + 4].copy_from_slice(&v4.octets());
            }
            IpAddr::V6(v6) => {
                b[FAMILY_OFF] = 6;
                b[ADDR_OFF..ADDR_OFF + 16].copy_from_slice(&v6.octets());
            }
        }
        let c = checksum(&b[..CHECK_OFF]);
        b[CHECK_OFF..].copy_from_slice(&c.to_le_bytes());
        UniqueId { bytes: b }
    }

    /// Parses and validates 128 bytes.
    pub fn from_bytes(b: &[u8]) -> Result<UniqueId> {
        let bad = |why: String| Error::invalid_argument(format!("malformed unique id: {why}"));
        if b.len() != UNIQUE_ID_BYTES {
            return Err(bad(format!(
                "{} bytes, expected {UNIQUE_ID_BYTES}",
                b.len()
            )));
        }
        if b[..7] != ID_MAGIC[..7] {
            return Err(bad("wrong magic (not a ccl unique id)".into()));
        }
        if b[7] != ID_MAGIC[7] {
            return Err(bad(format!(
                "version {} but this build reads version {}",
                b[7], ID_MAGIC[7]
            )));
        }
        let c = u32::from_le_bytes(b[CHECK_OFF..].try_into().expect("4 bytes"));
        if c != checksum(&b[..CHECK_OFF]) {
            return Err(bad(
                "checksum mismatch (the id was altered or truncated in transit)".into(),
            ));
        }
        let (fam, alen) = (b[FAMILY_OFF], if b[FAMILY_OFF] == 4 { 4 } else { 16 });
        if fam != 4 && fam != 6 {
            return Err(bad(format!("unknown address family {fam}")));
        }
        let zero_from = ADDR_OFF + alen;
        if b[FAMILY_OFF + 1] != 0 || b[zero_from..CHECK_OFF].iter().any(|&x| x != 0) {
            return Err(bad("reserved bytes are not zero".into()));
        }
        let mut bytes = [0u8; UNIQUE_ID_BYTES];
        bytes.copy_from_slice(b);
        let id = UniqueId { bytes };
        if id.root_addr().port() == 0 {
            return Err(bad("root port is 0".into()));
        }
        Ok(id)
    }

    /// The raw 128 bytes (what the C ABI's `cclUniqueId` holds).
    pub fn as_bytes(&self) -> &[u8; UNIQUE_ID_BYTES] {
        &self.bytes
    }

    /// Lowercase hex (256 characters), e.g. for `CCL_UNIQUE_ID`.
    pub fn to_hex(&self) -> String {
        self.bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Parses [`UniqueId::to_hex`] output.
    pub fn from_hex(s: &str) -> Result<UniqueId> {
        let s = s.trim();
        if s.len() != 2 * UNIQUE_ID_BYTES || !s.is_ascii() {
            return Err(Error::invalid_argument(format!(
                "malformed unique id: {} hex characters, expected {}",
                s.len(),
                2 * UNIQUE_ID_BYTES
            )));
        }
        let mut b = [0u8; UNIQUE_ID_BYTES];
        for (i, out) in b.iter_mut().enumerate() {
            *out = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| {
                Error::invalid_argument(format!(
                    "malformed unique id: '{}' at position {} is not hex",
                    &s[2 * i..2 * i + 2],
                    2 * i
                ))
            })?;
        }
        UniqueId::from_bytes(&b)
    }

    /// Where the root listens.
    pub fn root_addr(&self) -> SocketAddr {
        let b = &self.bytes;
        let port = u16::from_be_bytes([b[PORT_OFF], b[PORT_OFF + 1]]);
        let ip = if b[FAMILY_OFF] == 4 {
            let o: [u8; 4] = b[ADDR_OFF..ADDR_OFF + 4].try_into().expect("4 bytes");
            IpAddr::V4(Ipv4Addr::from(o))
        } else {
            let o: [u8; 16] = b[ADDR_OFF..ADDR_OFF + 16].try_into().expect("16 bytes");
            IpAddr::V6(Ipv6Addr::from(o))
        };
        SocketAddr::new(ip, port)
    }

    /// The communicator secret.
    pub fn secret(&self) -> [u8; 32] {
        self.bytes[SECRET_OFF..SECRET_OFF + 32]
            .try_into()
            .expect("32 bytes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_round_trips_and_validates() {
        let id = UniqueId::for_address("10.0.0.7:29500".parse().unwrap(), [9; 32]);
        assert_eq!(UniqueId::from_bytes(id.as_bytes()).unwrap(), id);
        assert_eq!(UniqueId::from_hex(&id.to_hex()).unwrap(), id);
        assert_eq!(id.root_addr(), "10.0.0.7:29500".parse().unwrap());
        assert_eq!(id.secret(), [9; 32]);
        let v6 = UniqueId::for_address("[fd00::1]:7".parse().unwrap(), [1; 32]);
        assert_eq!(
            UniqueId::from_bytes(v6.as_bytes()).unwrap().root_addr(),
            "[fd00::1]:7".parse().unwrap()
        );
        assert!(
            !format!("{id:?}").contains("09"),
            "Debug must not print the secret"
        );
    }

    #[test]
    fn malformed_ids_are_refused_with_a_reason() {
        let id = UniqueId::for_address("127.0.0.1:1234".parse().unwrap(), [3; 32]);
        let b = *id.as_bytes();
        let check = |bytes: &[u8], needle: &str| {
            let e = UniqueId::from_bytes(bytes).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument);
            assert!(e.to_string().contains(needle), "{e} lacks {needle}");
        };
        check(&b[..100], "100 bytes");
        check(&[0u8; 128], "magic");
        let mut v = b;
        v[7] = 2;
        check(&v, "version 2");
        let mut c = b;
        c[20] ^= 1;
        check(&c, "checksum");
        // Every single-bit flip is caught (no panic, an error).
        for i in 0..128 {
            for bit in 0..8 {
                let mut f = b;
                f[i] ^= 1 << bit;
                assert!(UniqueId::from_bytes(&f).is_err(), "flip {i}.{bit} accepted");
            }
        }
        assert!(UniqueId::from_hex("zz").is_err());
        assert!(
            UniqueId::from_hex(&"g".repeat(256))
                .unwrap_err()
                .to_string()
                .contains("not hex")
        );
    }
}
