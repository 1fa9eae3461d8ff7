//! FNV-1a, the one hash the library uses for fingerprints, ids and checksums: values that ranks
//! compare with each other, so every rank must compute them the same way. None of them guards
//! against an adversary (the secret does that); they catch mistakes (mismatched settings, a
//! mangled id).

/// A running FNV-1a hash (64 bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fnv1a(u64);

/// FNV-1a's offset basis.
const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
/// FNV-1a's prime.
const PRIME: u64 = 0x0100_0000_01b3;

impl Default for Fnv1a {
    fn default() -> Self {
        Fnv1a::new()
    }
}

impl Fnv1a {
    pub const fn new() -> Fnv1a {
        Fnv1a(OFFSET)
    }

    /// A hash started from another basis: `seed` is mixed into the offset, for several
    /// independent lanes over the same input.
    pub const fn seeded(seed: u64) -> Fnv1a {
        Fnv1a(OFFSET ^ seed)
    }

    pub fn bytes(mut self, b: &[u8]) -> Fnv1a {
        for &x in b {
            self.0 = (self.0 ^ u64::from(x)).wrapping_mul(PRIME);
        }
        self
    }

    /// Takes a whole word in one step (not byte by byte): faster, and good enough for
    /// fingerprints of small integers.
    pub fn word(mut self, w: u64) -> Fnv1a {
        self.0 = (self.0 ^ w).wrapping_mul(PRIME);
        self
    }

    pub const fn finish(self) -> u64 {
        self.0
    }

    /// The hash with a final mix (MurmurHash3's), so that inputs that differ in few bits differ
    /// in many bits of the result.
    pub const fn finish_mixed(self) -> u64 {
        let mut h = self.0;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^ (h >> 33)
    }
}

/// FNV-1a of `b`.
pub fn fnv1a(b: &[u8]) -> u64 {
    Fnv1a::new().bytes(b).finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_published_values() {
        // Test vectors of the FNV reference: "" and "a" and "foobar".
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
        assert_eq!(
            Fnv1a::new().bytes(b"foo").bytes(b"bar").finish(),
            fnv1a(b"foobar")
        );
        assert_ne!(Fnv1a::seeded(1).bytes(b"a").finish(), fnv1a(b"a"));
    }
}
