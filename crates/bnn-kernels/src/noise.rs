//! The injected noise of the CPU kernels, a batch of Philox blocks at a time: the Philox
//! words of every block, then Box–Muller over all pairs. Same integer and f32 operations
//! as [`crate::rng::NoiseKey::normals4`] and the kernel header, hence the same bits on
//! every path.
//!
//! Two builds ([`Normals`]): the compiler's vectorisation of plain loops ([`Autovec`]), and
//! for AVX2 a Box–Muller written with intrinsics ([`Avx2`]). The logarithm's 9-step Horner
//! polynomial and the square root after it make one long dependency chain per vector; as
//! the compiler writes the loop (one vector per iteration) the out-of-order core of a Zen 3
//! keeps too few such chains in flight, and Box–Muller took 1.35 ns per normal there, twice
//! Philox's cost. [`Avx2`] runs the radius of both pairs and both angles of 8 blocks side by
//! side, four independent chains in program order.

use crate::rng::{log_unit, sincos_turn, uniform_open0, NoiseKey, M0, M1, W0, W1};

/// How a build turns a batch of Philox counters into normals: `z[b]` are the four
/// normals of block `counters[b]` (elements 4·counters\[b\] ..+4 of the key's tensor).
pub trait Normals {
    /// # Safety
    /// The CPU has the features of the implementation (see each).
    unsafe fn blocks<const B: usize>(key: &NoiseKey, counters: &[u32; B], z: &mut [[f32; 4]; B]);
}

/// Plain loops, vectorised by the compiler for the build they land in (portable, AVX-512).
pub struct Autovec;

impl Normals for Autovec {
    #[inline(always)]
    unsafe fn blocks<const B: usize>(key: &NoiseKey, counters: &[u32; B], z: &mut [[f32; 4]; B]) {
        let mut r = [[0u32; B]; 4];
        philox_words(key, counters, &mut r);
        box_muller_blocks(&r, z);
    }
}

/// Philox as [`Autovec`], Box–Muller by AVX2+FMA intrinsics (`box_muller_avx2`). Needs
/// AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
pub struct Avx2;

#[cfg(target_arch = "x86_64")]
impl Normals for Avx2 {
    #[inline(always)]
    unsafe fn blocks<const B: usize>(key: &NoiseKey, counters: &[u32; B], z: &mut [[f32; 4]; B]) {
        unsafe {
            let mut r = [[0u32; B]; 4];
            philox_words(key, counters, &mut r);
            box_muller_avx2(&r, z);
        }
    }
}

/// `r[w][b]` = word w of Philox-4×32-10 on block `counters[b]` of the key's stream: one
/// loop over blocks, which the compiler vectorises (lanes are blocks).
#[allow(clippy::needless_range_loop)] // index-parallel arrays are what vectorises
#[inline(always)]
fn philox_words<const B: usize>(key: &NoiseKey, counters: &[u32; B], r: &mut [[u32; B]; 4]) {
    let (k0, k1) = (key.seed as u32, (key.seed >> 32) as u32);
    let (c1, c3) = (key.param, (key.step >> 32) as u32);
    let c2 = key.step as u32;
    for b in 0..B {
        let mut c = [counters[b], c1, c2, c3];
        let mut k = [k0, k1];
        for round in 0..10 {
            let p0 = M0 as u64 * c[0] as u64;
            let p1 = M1 as u64 * c[2] as u64;
            c = [
                (p1 >> 32) as u32 ^ c[1] ^ k[0],
                p1 as u32,
                (p0 >> 32) as u32 ^ c[3] ^ k[1],
                p0 as u32,
            ];
            if round < 9 {
                k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
            }
        }
        for w in 0..4 {
            r[w][b] = c[w];
        }
    }
}

/// Box–Muller on the Philox words of each block b: the pairs (r0, r1) → elements 4b,
/// 4b+1 and (r2, r3) → 4b+2, 4b+3, stage by stage over arrays.
#[allow(clippy::needless_range_loop)] // index-parallel arrays are what vectorises
#[inline(always)]
fn box_muller_blocks<const B: usize>(r: &[[u32; B]; 4], z: &mut [[f32; 4]; B]) {
    let mut out = [[0f32; B]; 4];
    for pair in 0..2 {
        for b in 0..B {
            let u1 = uniform_open0(r[2 * pair][b]);
            let u2 = uniform_open0(r[2 * pair + 1][b]);
            let rad = (-2.0 * log_unit(u1)).sqrt();
            let (sn, cs) = sincos_turn(u2);
            out[2 * pair][b] = rad * cs;
            out[2 * pair + 1][b] = rad * sn;
        }
    }
    for b in 0..B {
        for w in 0..4 {
            z[b][w] = out[w][b];
        }
    }
}

/// [`box_muller_blocks`] in AVX2+FMA intrinsics, 8 blocks at a time: the same operations
/// in the same order (an FMA where [`log_unit`] and [`sincos_turn`] have `mul_add`, a
/// rounded multiply and add elsewhere), hence the same bits. Blocks past the last whole 8
/// go through [`box_muller_blocks`]' scalar code.
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn box_muller_avx2<const B: usize>(r: &[[u32; B]; 4], z: &mut [[f32; 4]; B]) {
    unsafe {
        use std::arch::x86_64::*;
        let whole = B / 8 * 8;
        let out = z.as_flattened_mut().as_mut_ptr();
        for b in (0..whole).step_by(8) {
            let word = |w: usize| r[w][b..].as_ptr() as *const __m256i;
            let u = [0, 1, 2, 3];
            let u = u.map(word);
            let [rad0, rad1] = radius2([
                unit8(_mm256_loadu_si256(u[0])),
                unit8(_mm256_loadu_si256(u[2])),
            ]);
            let [(sin0, cos0), (sin1, cos1)] = sincos2([
                unit8(_mm256_loadu_si256(u[1])),
                unit8(_mm256_loadu_si256(u[3])),
            ]);
            let o = [
                _mm256_mul_ps(rad0, cos0),
                _mm256_mul_ps(rad0, sin0),
                _mm256_mul_ps(rad1, cos1),
                _mm256_mul_ps(rad1, sin1),
            ];
            // 4 × 8 (word, block) → 8 × 4 (block, word): pairs of words, then quads, then the
            // 128-bit halves.
            let t0 = _mm256_unpacklo_ps(o[0], o[1]);
            let t1 = _mm256_unpackhi_ps(o[0], o[1]);
            let t2 = _mm256_unpacklo_ps(o[2], o[3]);
            let t3 = _mm256_unpackhi_ps(o[2], o[3]);
            let q0 = _mm256_shuffle_ps::<0x44>(t0, t2); // blocks 0 | 4
            let q1 = _mm256_shuffle_ps::<0xEE>(t0, t2); // blocks 1 | 5
            let q2 = _mm256_shuffle_ps::<0x44>(t1, t3); // blocks 2 | 6
            let q3 = _mm256_shuffle_ps::<0xEE>(t1, t3); // blocks 3 | 7
            let dst = out.add(4 * b);
            _mm256_storeu_ps(dst, _mm256_permute2f128_ps::<0x20>(q0, q1));
            _mm256_storeu_ps(dst.add(8), _mm256_permute2f128_ps::<0x20>(q2, q3));
            _mm256_storeu_ps(dst.add(16), _mm256_permute2f128_ps::<0x31>(q0, q1));
            _mm256_storeu_ps(dst.add(24), _mm256_permute2f128_ps::<0x31>(q2, q3));
        }
        for b in whole..B {
            for pair in 0..2 {
                let rad = (-2.0 * log_unit(uniform_open0(r[2 * pair][b]))).sqrt();
                let (sn, cs) = sincos_turn(uniform_open0(r[2 * pair + 1][b]));
                z[b][2 * pair] = rad * cs;
                z[b][2 * pair + 1] = rad * sn;
            }
        }
    }
}

/// [`uniform_open0`] of 8 words.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn unit8(x: std::arch::x86_64::__m256i) -> std::arch::x86_64::__m256 {
    unsafe {
        use std::arch::x86_64::*;
        let top = _mm256_add_epi32(_mm256_srli_epi32::<8>(x), _mm256_set1_epi32(1));
        _mm256_mul_ps(_mm256_cvtepi32_ps(top), _mm256_set1_ps(1.0 / 16_777_216.0))
    }
}

/// `[f(0), f(1)]` for an expression in `i`, written out: closures would not inherit the
/// caller's target features, and their intrinsics would become calls.
#[cfg(target_arch = "x86_64")]
macro_rules! pair {
    ($i:ident => $e:expr) => {
        [
            {
                let $i = 0;
                $e
            },
            {
                let $i = 1;
                $e
            },
        ]
    };
}

/// √(−2 ln u) of two vectors side by side, [`log_unit`]'s operations on u in (0, 1].
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::excessive_precision)] // Cephes' published digits, as in crate::rng
unsafe fn radius2(u: [std::arch::x86_64::__m256; 2]) -> [std::arch::x86_64::__m256; 2] {
    unsafe {
        use std::arch::x86_64::*;
        let mantissa = _mm256_castsi256_ps(_mm256_set1_epi32(0x007f_ffff));
        // u > 0, so its sign bit is clear and bits >> 23 is the biased exponent.
        let bits = pair!(i => _mm256_castps_si256(u[i]));
        let e0 =
            pair!(i => _mm256_sub_epi32(_mm256_srli_epi32::<23>(bits[i]), _mm256_set1_epi32(126)));
        let m0 = pair!(i => _mm256_or_ps(_mm256_and_ps(u[i], mantissa), _mm256_set1_ps(0.5)));
        let small = pair!(i => _mm256_cmp_ps::<_CMP_LT_OQ>(m0[i], _mm256_set1_ps(0.707_106_77)));
        // e − 1 where small: the all-ones mask is −1.
        let ef =
            pair!(i => _mm256_cvtepi32_ps(_mm256_add_epi32(e0[i], _mm256_castps_si256(small[i]))));
        let m = pair!(i => _mm256_blendv_ps(m0[i], _mm256_add_ps(m0[i], m0[i]), small[i]));
        let x = pair!(i => _mm256_sub_ps(m[i], _mm256_set1_ps(1.0)));
        let z = pair!(i => _mm256_mul_ps(x[i], x[i]));
        let mut y = [_mm256_set1_ps(7.037_683_6e-2); 2];
        for c in [
            -1.151_461_03e-1,
            1.167_699_87e-1,
            -1.242_014_08e-1,
            1.424_932_28e-1,
            -1.666_805_77e-1,
            2.000_071_48e-1,
            -2.499_999_4e-1,
            3.333_333_1e-1,
        ] {
            y = pair!(i => _mm256_fmadd_ps(y[i], x[i], _mm256_set1_ps(c)));
        }
        let y = pair!(i => _mm256_mul_ps(_mm256_mul_ps(y[i], x[i]), z[i]));
        let y = pair!(i => _mm256_fmadd_ps(ef[i], _mm256_set1_ps(-2.121_944_4e-4), y[i]));
        let y = pair!(i => _mm256_fmadd_ps(_mm256_set1_ps(-0.5), z[i], y[i]));
        let ln = pair!(i => _mm256_fmadd_ps(ef[i], _mm256_set1_ps(0.693_359_4), _mm256_add_ps(x[i], y[i])));
        pair!(i => _mm256_sqrt_ps(_mm256_mul_ps(_mm256_set1_ps(-2.0), ln[i])))
    }
}

/// (sin 2πu, cos 2πu) of two vectors side by side, [`sincos_turn`]'s operations.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::excessive_precision)] // Cephes' published digits, as in crate::rng
unsafe fn sincos2(
    u: [std::arch::x86_64::__m256; 2],
) -> [(std::arch::x86_64::__m256, std::arch::x86_64::__m256); 2] {
    unsafe {
        use std::arch::x86_64::*;
        let u4 = pair!(i => _mm256_mul_ps(u[i], _mm256_set1_ps(4.0)));
        let qf = pair!(i => _mm256_floor_ps(_mm256_add_ps(u4[i], _mm256_set1_ps(0.5))));
        // The quadrant's low bits in the low bits of qf + 2²³.
        let q = pair!(i => _mm256_castps_si256(_mm256_add_ps(qf[i], _mm256_set1_ps(8_388_608.0))));
        let a = pair!(i => _mm256_mul_ps(_mm256_sub_ps(u4[i], qf[i]), _mm256_set1_ps(std::f32::consts::FRAC_PI_2)));
        let a2 = pair!(i => _mm256_mul_ps(a[i], a[i]));
        let ps = pair!(i => _mm256_fmadd_ps(
            _mm256_fmadd_ps(a2[i], _mm256_set1_ps(-1.951_529_6e-4), _mm256_set1_ps(8.332_161e-3)),
            a2[i],
            _mm256_set1_ps(-1.666_665_5e-1)
        ));
        let s = pair!(i => _mm256_fmadd_ps(_mm256_mul_ps(a[i], a2[i]), ps[i], a[i]));
        let pc = pair!(i => _mm256_fmadd_ps(
            _mm256_fmadd_ps(a2[i], _mm256_set1_ps(2.443_315_7e-5), _mm256_set1_ps(-1.388_731_6e-3)),
            a2[i],
            _mm256_set1_ps(4.166_664_6e-2)
        ));
        let one_minus =
            pair!(i => _mm256_fmadd_ps(_mm256_set1_ps(-0.5), a2[i], _mm256_set1_ps(1.0)));
        let c = pair!(i => _mm256_fmadd_ps(_mm256_mul_ps(a2[i], a2[i]), pc[i], one_minus[i]));
        // Quadrant q: (sin, cos) = (s, c), (c, −s), (−s, −c), (−c, s): swap where q is odd
        // (blendv reads the sign bit, so q << 31), negate sin where bit 1 is set and cos where
        // bit 0 differs from bit 1.
        let odd = pair!(i => _mm256_castsi256_ps(_mm256_slli_epi32::<31>(q[i])));
        let half = pair!(i => _mm256_srli_epi32::<1>(q[i]));
        let sin_sign = pair!(i => _mm256_castsi256_ps(_mm256_slli_epi32::<31>(half[i])));
        let cos_sign = pair!(i => _mm256_castsi256_ps(_mm256_slli_epi32::<31>(_mm256_xor_si256(q[i], half[i]))));
        pair!(i => (
            _mm256_xor_ps(_mm256_blendv_ps(s[i], c[i], odd[i]), sin_sign[i]),
            _mm256_xor_ps(_mm256_blendv_ps(c[i], s[i], odd[i]), cos_sign[i]),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every build's normals equal the scalar reference's, bit for bit, for a
    /// batch with a vector-sized part and a remainder, keys whose halves and steps reach
    /// past 32 bits, and counters that wrap.
    fn check<N: Normals>() {
        const B: usize = 21;
        for (seed, step, param, first) in [
            (0u64, 0u64, 0u32, 0u32),
            (0x0123_4567_89ab_cdef, 7, 3, 1000),
            (u64::MAX, (1 << 40) + 5, u32::MAX, u32::MAX - 9),
        ] {
            let key = NoiseKey { seed, step, param };
            let counters: [u32; B] = std::array::from_fn(|b| first.wrapping_add(b as u32));
            let mut z = [[0f32; 4]; B];
            // SAFETY: callers pass only words the CPU supports.
            unsafe { N::blocks::<B>(&key, &counters, &mut z) };
            for b in 0..B {
                let want = key.normals4(counters[b]);
                assert_eq!(
                    z[b].map(f32::to_bits),
                    want.map(f32::to_bits),
                    "block {b} of key {key:?}"
                );
            }
        }
    }

    #[test]
    fn autovec_normals_are_the_reference() {
        check::<Autovec>();
    }

    /// The AVX2 build on every machine whose CPU has it (what the kernel paths run).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_normals_are_the_reference() {
        if crate::isa::Isa::available().contains(&crate::isa::Isa::Avx2) {
            check::<Avx2>();
        }
    }
}
