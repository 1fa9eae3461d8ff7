use super::halves::{Half, ViaF32, bf16_from_f32, half_order_key};
use super::*;

/// The branch-free conversion must agree with `half` on every rounding case: each upper half
/// combined with low halves just below, at and above the rounding midpoint, plus the extremes.
#[test]
fn bf16_rounding_matches_half() {
    let lows = [0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xC000, 0xFFFF];
    for hi in 0..=0xFFFFu32 {
        for lo in lows {
            let x = f32::from_bits(hi << 16 | lo);
            assert_eq!(
                bf16_from_f32(x).to_bits(),
                bf16::from_f32(x).to_bits(),
                "{:#010x}",
                x.to_bits()
            );
        }
    }
}

/// The two-at-a-time bf16 loops give each element what the element loop gives it, whichever
/// operand starts off a 4-byte boundary, at every length (head, words, tail).
#[test]
fn bf16_word_loops_match_the_element_loop() {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // Mostly ordinary values, some NaNs, infinities, zeros and subnormals.
        let b = x as u16;
        match x >> 60 {
            0 => 0x7FC1 | (b & 0x8000),
            1 => 0x7F80 | (b & 0x8000),
            2 => b & 0x807F,
            _ => b,
        }
    };
    let v: Vec<bf16> = (0..200).map(|_| bf16::from_bits(next())).collect();
    let w: Vec<bf16> = (0..200).map(|_| bf16::from_bits(next())).collect();
    let same = |got: &[bf16], want: &[bf16]| {
        got.iter()
            .zip(want)
            .all(|(g, e)| g.to_bits() == e.to_bits() || (g.is_nan() && e.is_nan()))
    };
    for (oa, ob, od) in [
        (0, 0, 0),
        (1, 1, 1),
        (0, 1, 0),
        (1, 0, 1),
        (1, 1, 0),
        (0, 0, 1),
    ] {
        for n in (0..12).chain([63, 100]) {
            let (a, b) = (&v[oa..oa + n], &w[ob..ob + n]);
            let mut want = a.to_vec();
            apply_inplace::<bf16, ViaF32<Sum>>(&mut want, b, Order::AccFirst);
            let mut acc = vec![bf16::ZERO; n + 1];
            acc[oa..oa + n].copy_from_slice(a);
            bf16::arith_inplace::<Sum>(&mut acc[oa..oa + n], b, Order::AccFirst);
            assert!(same(&acc[oa..oa + n], &want), "inplace {oa} {ob} {n}");
            let mut dst = vec![bf16::ZERO; n + 1];
            bf16::arith_into::<Prod>(&mut dst[od..od + n], a, b);
            let mut prod = a.to_vec();
            apply_inplace::<bf16, ViaF32<Prod>>(&mut prod, b, Order::AccFirst);
            assert!(same(&dst[od..od + n], &prod), "into {oa} {ob} {od} {n}");
        }
    }
}

#[test]
fn half_order_key_is_monotone() {
    // Every non-NaN f16 in increasing order maps to strictly increasing keys.
    let mut v: Vec<f16> = (0..=0xFFFFu16)
        .map(f16::from_bits)
        .filter(|x| !x.is_nan())
        .collect();
    v.sort_by(|a, b| a.total_cmp(b));
    for w in v.windows(2) {
        assert!(half_order_key(w[0].to_bits()) < half_order_key(w[1].to_bits()));
    }
}
