//! The f16 and bf16 kernels: staged through f32 in blocks, rounded back to nearest-even.

use super::*;

/// Per-type pieces of the f16/bf16 kernels.
pub(super) trait Half: Element {
    /// Bits of +infinity: a magnitude above it is a NaN.
    const INF_BITS: u16;
    /// The canonical quiet NaN.
    const NAN_BITS: u16;
    fn bits(self) -> u16;
    fn with_bits(bits: u16) -> Self;
    /// `acc = acc (op) src` (or `src (op) acc`) computed in f32.
    fn arith_inplace<O: BinOp<f32>>(acc: &mut [Self], src: &[Self], order: Order);
    /// `dst = a (op) b` computed in f32.
    fn arith_into<O: BinOp<f32>>(dst: &mut [Self], a: &[Self], b: &[Self]);
    /// `x = x / n` computed in f32.
    fn div_f32(x: &mut [Self], n: usize);
}

/// Maps half-precision bits to an integer with the same order as the float values (for non-NaN
/// values): negatives get their magnitude bits flipped, so `-0` lands just below `+0`.
#[inline(always)]
pub(super) fn half_order_key(bits: u16) -> i16 {
    let b = bits as i16;
    b ^ (((b >> 15) as u16) >> 1) as i16
}

#[inline(always)]
fn half_is_nan<H: Half>(x: H) -> bool {
    x.bits() & 0x7FFF > H::INF_BITS
}

macro_rules! half_minmax {
    ($($t:ty),*) => {$(
        impl BinOp<$t> for Min {
            #[inline(always)]
            fn apply(a: $t, b: $t) -> $t {
                // Equal keys mean equal bits, so the tie needs no rule of its own.
                let r = if half_order_key(a.bits()) < half_order_key(b.bits()) { a } else { b };
                if half_is_nan(a) | half_is_nan(b) { <$t>::with_bits(<$t>::NAN_BITS) } else { r }
            }
        }
        impl BinOp<$t> for Max {
            #[inline(always)]
            fn apply(a: $t, b: $t) -> $t {
                let r = if half_order_key(a.bits()) > half_order_key(b.bits()) { a } else { b };
                if half_is_nan(a) | half_is_nan(b) { <$t>::with_bits(<$t>::NAN_BITS) } else { r }
            }
        }
    )*};
}

half_minmax!(f16, bf16);

macro_rules! half_kernel {
    ($($t:ty),*) => {$(
        impl Kernel for $t {
            #[inline(always)]
            fn inplace(op: ReduceOp, acc: &mut [Self], src: &[Self], order: Order) {
                match op.combiner() {
                    ReduceOp::Sum | ReduceOp::Avg => Self::arith_inplace::<Sum>(acc, src, order),
                    ReduceOp::Prod => Self::arith_inplace::<Prod>(acc, src, order),
                    ReduceOp::Min => apply_inplace::<$t, Min>(acc, src, order),
                    ReduceOp::Max => apply_inplace::<$t, Max>(acc, src, order),
                    o @ (ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor) => {
                        no_bitwise_on_floats(o, <$t as Element>::DTYPE)
                    }
                }
            }

            #[inline(always)]
            fn into(op: ReduceOp, dst: &mut [Self], a: &[Self], b: &[Self]) {
                match op.combiner() {
                    ReduceOp::Sum | ReduceOp::Avg => Self::arith_into::<Sum>(dst, a, b),
                    ReduceOp::Prod => Self::arith_into::<Prod>(dst, a, b),
                    ReduceOp::Min => apply_into::<$t, Min>(dst, a, b),
                    ReduceOp::Max => apply_into::<$t, Max>(dst, a, b),
                    o @ (ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor) => {
                        no_bitwise_on_floats(o, <$t as Element>::DTYPE)
                    }
                }
            }

            fn div(x: &mut [Self], n: usize) {
                Self::div_f32(x, n);
            }
        }
    )*};
}

half_kernel!(f16, bf16);

/// f16 arithmetic goes through `half`'s slice conversions, which use F16C when the CPU has it
/// (detected at run time, so the baseline build still runs everywhere). They work a slice at a
/// time, hence the f32 staging blocks.
impl Half for f16 {
    const INF_BITS: u16 = 0x7C00;
    const NAN_BITS: u16 = 0x7E00;

    #[inline(always)]
    fn bits(self) -> u16 {
        self.to_bits()
    }

    #[inline(always)]
    fn with_bits(bits: u16) -> Self {
        f16::from_bits(bits)
    }

    fn arith_inplace<O: BinOp<f32>>(acc: &mut [Self], src: &[Self], order: Order) {
        let mut fa = [0f32; HALF_BLOCK];
        let mut fs = [0f32; HALF_BLOCK];
        for (ac, sc) in acc.chunks_mut(HALF_BLOCK).zip(src.chunks(HALF_BLOCK)) {
            let (fa, fs) = (&mut fa[..ac.len()], &mut fs[..ac.len()]);
            ac.convert_to_f32_slice(fa);
            sc.convert_to_f32_slice(fs);
            apply_inplace::<f32, O>(fa, fs, order);
            ac.convert_from_f32_slice(fa);
        }
    }

    fn arith_into<O: BinOp<f32>>(dst: &mut [Self], a: &[Self], b: &[Self]) {
        let mut fd = [0f32; HALF_BLOCK];
        let mut fa = [0f32; HALF_BLOCK];
        let mut fb = [0f32; HALF_BLOCK];
        for ((dc, ac), bc) in dst
            .chunks_mut(HALF_BLOCK)
            .zip(a.chunks(HALF_BLOCK))
            .zip(b.chunks(HALF_BLOCK))
        {
            let n = dc.len();
            let (fd, fa, fb) = (&mut fd[..n], &mut fa[..n], &mut fb[..n]);
            ac.convert_to_f32_slice(fa);
            bc.convert_to_f32_slice(fb);
            apply_into::<f32, O>(fd, fa, fb);
            dc.convert_from_f32_slice(fd);
        }
    }

    fn div_f32(x: &mut [Self], n: usize) {
        let d = n as f32;
        let mut fx = [0f32; HALF_BLOCK];
        for xc in x.chunks_mut(HALF_BLOCK) {
            let fx = &mut fx[..xc.len()];
            xc.convert_to_f32_slice(fx);
            fx.iter_mut().for_each(|v| *v /= d);
            xc.convert_from_f32_slice(fx);
        }
    }
}

/// bf16 is the upper half of an f32, so both conversions are a few integer operations; done per
/// element inside the loop they vectorize with the arithmetic and need no staging buffers.
/// (`half`'s own bf16 slice conversions are scalar loops with branches.)
impl Half for bf16 {
    const INF_BITS: u16 = 0x7F80;
    const NAN_BITS: u16 = 0x7FC0;

    #[inline(always)]
    fn bits(self) -> u16 {
        self.to_bits()
    }

    #[inline(always)]
    fn with_bits(bits: u16) -> Self {
        bf16::from_bits(bits)
    }

    // Inlined (as every loop here) so that a caller compiled for wider vector units
    // (`ccl_shm::simd`) gets these loops compiled for them too.
    #[inline(always)]
    fn arith_inplace<O: BinOp<f32>>(acc: &mut [Self], src: &[Self], order: Order) {
        let n = acc.len().min(src.len());
        let (acc, src) = (&mut acc[..n], &src[..n]);
        let head = words_from(acc, src);
        apply_inplace::<bf16, ViaF32<O>>(&mut acc[..head], &src[..head], order);
        let pairs = head + (n - head) / 2 * 2;
        let (aw, sw) = (
            as_words_mut(&mut acc[head..pairs]),
            as_words(&src[head..pairs]),
        );
        // `for` loops, not `for_each`: its fold is not inlined into a caller compiled for wider
        // vector units, and ran at the baseline's rate (6 against 24 GB/s with AVX-512).
        match order {
            Order::AccFirst => {
                for (a, &s) in aw.iter_mut().zip(sw) {
                    *a = pair::<O>(*a, s);
                }
            }
            Order::SrcFirst => {
                for (a, &s) in aw.iter_mut().zip(sw) {
                    *a = pair::<O>(s, *a);
                }
            }
        }
        apply_inplace::<bf16, ViaF32<O>>(&mut acc[pairs..], &src[pairs..], order);
    }

    #[inline(always)]
    fn arith_into<O: BinOp<f32>>(dst: &mut [Self], a: &[Self], b: &[Self]) {
        let n = dst.len().min(a.len()).min(b.len());
        let (dst, a, b) = (&mut dst[..n], &a[..n], &b[..n]);
        let head = words_from(dst, a);
        if head != words_from(dst, b) {
            return apply_into::<bf16, ViaF32<O>>(dst, a, b);
        }
        apply_into::<bf16, ViaF32<O>>(&mut dst[..head], &a[..head], &b[..head]);
        let pairs = head + (n - head) / 2 * 2;
        let (dw, aw, bw) = (
            as_words_mut(&mut dst[head..pairs]),
            as_words(&a[head..pairs]),
            as_words(&b[head..pairs]),
        );
        for ((d, &x), &y) in dw.iter_mut().zip(aw).zip(bw) {
            *d = pair::<O>(x, y);
        }
        apply_into::<bf16, ViaF32<O>>(&mut dst[pairs..], &a[pairs..], &b[pairs..]);
    }

    fn div_f32(x: &mut [Self], n: usize) {
        let d = n as f32;
        x.iter_mut()
            .for_each(|v| *v = bf16_from_f32(bf16_to_f32(*v) / d));
    }
}

/// A bf16 operator evaluated in f32 with one rounding back.
pub(super) struct ViaF32<O>(std::marker::PhantomData<O>);

impl<O: BinOp<f32>> BinOp<bf16> for ViaF32<O> {
    #[inline(always)]
    fn apply(a: bf16, b: bf16) -> bf16 {
        bf16_from_f32(O::apply(bf16_to_f32(a), bf16_to_f32(b)))
    }
}

// bf16 arithmetic two elements at a time: a 32-bit word holds two bf16 values, and each is an
// f32 once its 16 bits sit in the word's upper half: the upper element is the word with its lower
// half cleared, the lower one the word shifted up. The results' rounded upper halves go back the
// same way. No widening or narrowing between 16- and 32-bit lanes, which the element loop needs
// and which costs most of its time: on 64 KiB, 13 GB/s against 10.6 with AVX2 and 28.5 against
// 20 with AVX-512 (AMD EPYC family 26). Both elements of a word get the same expression as the
// element loop, so the bits are the same, whatever the byte order.

/// Elements before `x` and `y` both reach a 4-byte boundary, or `x.len()` (all of them, by
/// elements) when they never do together.
#[inline(always)]
fn words_from(x: &[bf16], y: &[bf16]) -> usize {
    let (ax, ay) = (x.as_ptr() as usize % 4, y.as_ptr() as usize % 4);
    match (ax == ay, ax) {
        (true, 0) => 0,
        (true, _) => 1.min(x.len()),
        (false, _) => x.len(),
    }
}

// (An empty slice may start anywhere; bytemuck checks its alignment all the same.)
#[inline(always)]
fn as_words(x: &[bf16]) -> &[u32] {
    if x.is_empty() {
        &[]
    } else {
        bytemuck::cast_slice(x)
    }
}

#[inline(always)]
fn as_words_mut(x: &mut [bf16]) -> &mut [u32] {
    if x.is_empty() {
        &mut []
    } else {
        bytemuck::cast_slice_mut(x)
    }
}

/// `x (op) y` for the two bf16 values in each word.
#[inline(always)]
fn pair<O: BinOp<f32>>(x: u32, y: u32) -> u32 {
    let lo = O::apply(f32::from_bits(x << 16), f32::from_bits(y << 16));
    let hi = O::apply(
        f32::from_bits(x & 0xFFFF_0000),
        f32::from_bits(y & 0xFFFF_0000),
    );
    rounded_upper(hi) | rounded_upper(lo) >> 16
}

#[inline(always)]
fn bf16_to_f32(x: bf16) -> f32 {
    f32::from_bits(u32::from(x.to_bits()) << 16)
}

/// Bit-for-bit `bf16::from_f32` (round to nearest even; a NaN stays a NaN, quieted, with its upper
/// payload), without the branches that keep `half`'s scalar version from vectorizing.
#[inline(always)]
pub(super) fn bf16_from_f32(x: f32) -> bf16 {
    bf16::from_bits((rounded_upper(x) >> 16) as u16)
}

/// `bf16_from_f32(x)` in the upper half of a word whose lower half is zero.
#[inline(always)]
fn rounded_upper(x: f32) -> u32 {
    let b = x.to_bits();
    // Adding 0x7FFF plus the kept LSB carries into bit 16 exactly when the dropped half is above
    // half an ULP, or exactly half and the kept part is odd. Cannot overflow unless `x` is a NaN.
    let rounded = b.wrapping_add(0x7FFF + ((b >> 16) & 1)) & 0xFFFF_0000;
    let quiet_nan = (b | 0x0040_0000) & 0xFFFF_0000;
    if b & 0x7FFF_FFFF > 0x7F80_0000 {
        quiet_nan
    } else {
        rounded
    }
}
