//! The vector operations of the three kernel paths behind one trait, so that the product
//! ([`super::nn`]) is written once.
//!
//! Each path's entry points ([`Simd::tile`], [`Simd::update`]) are functions compiled
//! with that path's target features; everything they call is `#[inline(always)]`, so the
//! generic code is compiled for the features of the entry it lands in. The paths differ
//! in width and register budget: AVX-512 keeps an 8 × 48 tile in 24 of its 32 registers,
//! AVX2 a 6 × 16 tile in 12 of its 16 (the BLIS shape for Zen and Haswell), portable a
//! 4 × 16 tile of 8-lane arrays. They do not differ in arithmetic: every element is summed
//! over k in the same order by the same fused multiply-add (see [`Portable`] for its
//! exception).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::nn::{Tile, UpdateTile};
use super::sparse::Rows;
use crate::noise::{self, Normals};
use crate::rng::NoiseKey;

/// Philox blocks of the largest update tile (AVX-512's 8 rows × 48 columns / 4).
pub(super) const MAX_BLOCKS: usize = 96;

/// One kernel path's vectors and entry points.
///
/// # Safety
/// Every `unsafe fn` here needs the path's CPU features (checked by the caller through
/// [`crate::isa::Isa::supported`]) and pointers valid for the lanes it touches
/// (masked lanes are neither read nor written).
pub(super) trait Simd: Copy + 'static {
    /// f32 lanes per vector.
    const LANES: usize;
    /// Rows of a product tile.
    const TILE_R: usize;
    /// Vectors per row of a product tile.
    const TILE_V: usize;
    /// Rows of a tile that skips lhs zeros (see `nn`).
    const TILE_R_LHS_ZEROS: usize;
    /// Most vectors of a tile of `sparse` (one row; at most 6, the widest arm of
    /// [`Simd::sparse_rows`], checked at compile time; its rows run two at a time, so
    /// 2·SPARSE_V sums are held). On AVX2, 8 and 13 (100 columns in one tile) measured no
    /// faster on the first layer's products than 6.
    const SPARSE_V: usize;
    type V: Copy;
    type M: Copy;

    /// The first `n` lanes (all of them for n ≥ LANES).
    unsafe fn mask(n: usize) -> Self::M;
    unsafe fn zero() -> Self::V;
    unsafe fn splat(x: f32) -> Self::V;
    unsafe fn load(p: *const f32) -> Self::V;
    /// Lanes outside `m` read as 0 and are not touched in memory.
    unsafe fn load_masked(m: Self::M, p: *const f32) -> Self::V;
    unsafe fn store(p: *mut f32, v: Self::V);
    unsafe fn store_masked(p: *mut f32, m: Self::M, v: Self::V);
    /// A whole vector where `full`, else the lanes in `m` (plain loads where they can be:
    /// masked ones cost more, masked stores much more on AMD).
    #[inline(always)]
    unsafe fn load_part(full: bool, m: Self::M, p: *const f32) -> Self::V {
        unsafe {
            if full {
                Self::load(p)
            } else {
                Self::load_masked(m, p)
            }
        }
    }
    /// [`Simd::load_part`]'s store.
    #[inline(always)]
    unsafe fn store_part(full: bool, m: Self::M, p: *mut f32, v: Self::V) {
        unsafe {
            if full {
                Self::store(p, v)
            } else {
                Self::store_masked(p, m, v)
            }
        }
    }
    /// a·b + c.
    unsafe fn fmadd(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn sub(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V;
    /// v with the lanes outside `m` set to 0.
    unsafe fn keep(m: Self::M, v: Self::V) -> Self::V;
    /// `lanes[i] += v[8b + i]` for each group b of eight lanes of v, in order.
    unsafe fn add_squares(lanes: &mut [f64; 8], v: Self::V);
    unsafe fn prefetch(p: *const f32);
    /// The normals of the first `count` (≤ this path's tile) Philox blocks of `counters`.
    unsafe fn normals(
        key: &NoiseKey,
        counters: &[u32; MAX_BLOCKS],
        z: &mut [[f32; 4]; MAX_BLOCKS],
        count: usize,
    );

    /// One product tile of `rows` (≤ TILE_R) rows and V vectors; `full` when every
    /// column of the V vectors is inside the matrix.
    unsafe fn tile<const V: usize>(rows: usize, full: bool, t: &Tile<'_>);
    /// The rows of one (k block, column tile) of the sparse-lhs product
    /// ([`super::sparse::rows_body`]), V = ⌈cols / LANES⌉ vectors.
    unsafe fn sparse_rows(t: &Rows<'_>);
    /// The sampler update of a finished tile ([`super::nn::update_body`]).
    unsafe fn update<const R: usize, const V: usize>(acc: &[[Self::V; V]; R], u: &UpdateTile);
    /// `rows` (≤ LANES) floats at each `src + p·ld`, p < kc, to `dst + p·rows`
    /// ([`super::nn::pack_columns_body`]).
    unsafe fn pack_columns(src: *const f32, ld: usize, rows: usize, kc: usize, dst: *mut f32);
    /// Source rows `row_range`, columns `first..end` of `src` (row stride `cols`):
    /// element (r, c) to `dst + (c − first)·ld + r − row_range.0`. Where `ld` is the
    /// number of rows (columns back to back), nothing outside the block's
    /// (end − first)·ld floats is written.
    #[allow(clippy::too_many_arguments)]
    unsafe fn transpose(
        src: *const f32,
        cols: usize,
        row_range: (usize, usize),
        first: usize,
        end: usize,
        dst: *mut f32,
        ld: usize,
    );
    /// Bit i of `words[i / 64]` set where `row[i]` is not zero (or NaN).
    unsafe fn nonzero_words(row: &[f32], words: &mut [u64]);
    /// [`super::peak::CHAINS`] register-only chains of `iters` multiply-adds (the peak).
    unsafe fn fma_chains(iters: usize) -> f32;
}

/// The row dispatch of [`Simd::tile`] and the entry of [`Simd::update`] for one path:
/// both compiled with its target features.
macro_rules! entries {
    ($isa:ident, [$($feature:literal)?], rows [$($r:literal),*], blocks $blocks:literal, words $words:ty) => {
        unsafe fn tile<const V: usize>(rows: usize, full: bool, t: &Tile<'_>) { unsafe {
            $(#[target_feature(enable = $feature)])?
            unsafe fn go<const R: usize, const V: usize, const FULL: bool>(t: &Tile<'_>) { unsafe {
                super::nn::tile_body::<$isa, R, V, FULL>(t)
            }}
            match (rows, full) {
                $(
                    ($r, true) => go::<$r, V, true>(t),
                    ($r, false) => go::<$r, V, false>(t),
                )*
                _ => unreachable!("a tile of {rows} rows"),
            }
        }}

        unsafe fn sparse_rows(t: &Rows<'_>) { unsafe {
            $(#[target_feature(enable = $feature)])?
            unsafe fn go<const V: usize, const FULL: bool>(t: &Rows<'_>) { unsafe {
                super::sparse::rows_body::<$isa, V, FULL>(t)
            }}
            let v = t.cols.div_ceil(Self::LANES);
            let full = t.cols == v * Self::LANES;
            match (v.min(Self::SPARSE_V), full) {
                (6, true) => go::<6, true>(t),
                (6, false) => go::<6, false>(t),
                (5, true) => go::<5, true>(t),
                (5, false) => go::<5, false>(t),
                (4, true) => go::<4, true>(t),
                (4, false) => go::<4, false>(t),
                (3, true) => go::<3, true>(t),
                (3, false) => go::<3, false>(t),
                (2, true) => go::<2, true>(t),
                (2, false) => go::<2, false>(t),
                (1, true) => go::<1, true>(t),
                (1, false) => go::<1, false>(t),
                _ => unreachable!("a sparse tile of {} columns", t.cols),
            }
        }}

        unsafe fn update<const R: usize, const V: usize>(
            acc: &[[Self::V; V]; R],
            u: &UpdateTile,
        ) { unsafe {
            // Out of line: the noise is a long stretch of code that would otherwise sit in
            // every tile's k loop function.
            $(#[target_feature(enable = $feature)])?
            #[inline(never)]
            unsafe fn go<const R: usize, const V: usize>(acc: &[[<$isa as Simd>::V; V]; R], u: &UpdateTile) { unsafe {
                super::nn::update_body::<$isa, R, V>(acc, u)
            }}
            go::<R, V>(acc, u)
        }}

        unsafe fn pack_columns(src: *const f32, ld: usize, rows: usize, kc: usize, dst: *mut f32) { unsafe {
            $(#[target_feature(enable = $feature)])?
            unsafe fn go(src: *const f32, ld: usize, rows: usize, kc: usize, dst: *mut f32) { unsafe {
                super::nn::pack_columns_body::<$isa>(src, ld, rows, kc, dst)
            }}
            go(src, ld, rows, kc, dst)
        }}

        unsafe fn fma_chains(iters: usize) -> f32 { unsafe {
            $(#[target_feature(enable = $feature)])?
            #[inline(never)]
            unsafe fn go(iters: usize) -> f32 { unsafe {
                super::peak::fma_body::<$isa>(iters)
            }}
            go(iters)
        }}

        #[inline(always)]
        unsafe fn normals(
            key: &NoiseKey,
            counters: &[u32; MAX_BLOCKS],
            z: &mut [[f32; 4]; MAX_BLOCKS],
            count: usize,
        ) { unsafe {
            debug_assert!(count <= $blocks);
            let (c, z) = (counters.first_chunk::<$blocks>(), z.first_chunk_mut::<$blocks>());
            if let (Some(c), Some(z)) = (c, z) {
                <$words>::blocks::<$blocks>(key, c, z);
            }
        }}
    };
}

/// AVX-512F (with DQ, VL, BW and FMA for the noise, as the fused pass's 512-bit build).
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(super) struct Avx512;

#[cfg(target_arch = "x86_64")]
impl Simd for Avx512 {
    const LANES: usize = 16;
    const TILE_R: usize = 8;
    const TILE_V: usize = 3;
    /// The union of fewer images' pixels is sparser (MNIST, 8 images: 47% of the pixels,
    /// 6: 44%, 4: 39%), but fewer rows do fewer FMAs per load. Measured on the 784→400
    /// forward (`bnn bench gemm`, 3 interleaved rounds, Xeon): 8 rows 184–193 µs at batch
    /// 100, 6 rows 172–184, 4 rows 193–204.
    const TILE_R_LHS_ZEROS: usize = 6;
    const SPARSE_V: usize = 3;
    type V = __m512;
    type M = __mmask16;

    #[inline(always)]
    unsafe fn mask(n: usize) -> __mmask16 {
        if n >= 16 {
            0xFFFF
        } else {
            ((1u32 << n) - 1) as __mmask16
        }
    }
    #[inline(always)]
    unsafe fn zero() -> __m512 {
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> __m512 {
        unsafe { _mm512_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m512 {
        unsafe { _mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn load_masked(m: __mmask16, p: *const f32) -> __m512 {
        unsafe { _mm512_maskz_loadu_ps(m, p) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m512) {
        unsafe { _mm512_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn store_masked(p: *mut f32, m: __mmask16, v: __m512) {
        unsafe { _mm512_mask_storeu_ps(p, m, v) }
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m512, b: __m512, c: __m512) -> __m512 {
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn add(a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_add_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn sub(a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_sub_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn mul(a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn keep(m: __mmask16, v: __m512) -> __m512 {
        unsafe { _mm512_maskz_mov_ps(m, v) }
    }
    #[inline(always)]
    unsafe fn add_squares(lanes: &mut [f64; 8], v: __m512) {
        unsafe {
            let lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
            // (The upper eight lanes through an AVX-512F extract.)
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
            let l = _mm512_add_pd(_mm512_loadu_pd(lanes.as_ptr()), lo);
            _mm512_storeu_pd(lanes.as_mut_ptr(), _mm512_add_pd(l, _mm512_cvtps_pd(hi)));
        }
    }
    #[inline(always)]
    unsafe fn prefetch(p: *const f32) {
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(p as *const i8);
        }
    }

    entries!(Avx512, ["avx512f,avx512dq,avx512vl,avx512bw,avx2,fma"], rows [1, 2, 3, 4, 5, 6, 7, 8], blocks 96, words noise::Autovec);

    /// In 16 × 16 blocks held in registers: unpack pairs of rows, shuffle within 128-bit
    /// lanes, then exchange lanes (partial blocks by masks).
    #[target_feature(enable = "avx512f")]
    unsafe fn transpose(
        src: *const f32,
        cols: usize,
        row_range: (usize, usize),
        first: usize,
        end: usize,
        dst: *mut f32,
        ld: usize,
    ) {
        unsafe {
            let d = dst.wrapping_sub(first * ld).wrapping_sub(row_range.0);
            for r0 in (row_range.0..row_range.1).step_by(16) {
                let rb = 16.min(row_range.1 - r0);
                for c0 in (first..end).step_by(16) {
                    let cb = 16.min(end - c0);
                    let load_mask = Self::mask(cb);
                    let mut r = [_mm512_setzero_ps(); 16];
                    for (i, v) in r.iter_mut().enumerate().take(rb) {
                        *v = _mm512_maskz_loadu_ps(load_mask, src.add((r0 + i) * cols + c0));
                    }
                    // Pairs of rows: t[2p] = a0 b0 a1 b1 | ..., t[2p+1] = a2 b2 a3 b3 | ...
                    let mut t = [_mm512_setzero_ps(); 16];
                    for p in 0..8 {
                        t[2 * p] = _mm512_unpacklo_ps(r[2 * p], r[2 * p + 1]);
                        t[2 * p + 1] = _mm512_unpackhi_ps(r[2 * p], r[2 * p + 1]);
                    }
                    // Quads of rows: u[4g + e] holds, in lane L, column 4L + e of rows 4g..4g+3.
                    let mut u = [_mm512_setzero_ps(); 16];
                    for g in 0..4 {
                        let (t0, t1, t2, t3) = (t[4 * g], t[4 * g + 1], t[4 * g + 2], t[4 * g + 3]);
                        u[4 * g] = _mm512_shuffle_ps::<0x44>(t0, t2);
                        u[4 * g + 1] = _mm512_shuffle_ps::<0xEE>(t0, t2);
                        u[4 * g + 2] = _mm512_shuffle_ps::<0x44>(t1, t3);
                        u[4 * g + 3] = _mm512_shuffle_ps::<0xEE>(t1, t3);
                    }
                    // Lanes across the four quads: output row 4L + e = lane L of u[e], u[4+e],
                    // u[8+e], u[12+e].
                    let store_mask = Self::mask(rb);
                    for e in 0..4 {
                        let s0 = _mm512_shuffle_f32x4::<0x44>(u[e], u[4 + e]);
                        let s1 = _mm512_shuffle_f32x4::<0xEE>(u[e], u[4 + e]);
                        let s2 = _mm512_shuffle_f32x4::<0x44>(u[8 + e], u[12 + e]);
                        let s3 = _mm512_shuffle_f32x4::<0xEE>(u[8 + e], u[12 + e]);
                        let out = [
                            _mm512_shuffle_f32x4::<0x88>(s0, s2),
                            _mm512_shuffle_f32x4::<0xDD>(s0, s2),
                            _mm512_shuffle_f32x4::<0x88>(s1, s3),
                            _mm512_shuffle_f32x4::<0xDD>(s1, s3),
                        ];
                        for (lane, v) in out.iter().enumerate() {
                            let c = 4 * lane + e;
                            if c < cb {
                                let at = d.wrapping_add((c0 + c) * ld + r0);
                                _mm512_mask_storeu_ps(at, store_mask, *v);
                            }
                        }
                    }
                }
            }
        }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn nonzero_words(row: &[f32], words: &mut [u64]) {
        unsafe {
            let zero = _mm512_setzero_ps();
            for (w, chunk) in words.iter_mut().zip(row.chunks(64)) {
                let mut word = 0u64;
                for (q, part) in chunk.chunks(16).enumerate() {
                    let m = Self::mask(part.len());
                    let v = _mm512_maskz_loadu_ps(m, part.as_ptr());
                    word |= u64::from(_mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(v, zero) & m) << (16 * q);
                }
                *w = word;
            }
        }
    }
}

/// The first `n` (< 8) lanes of `v` to `at`, by 4-, 2- and 1-lane stores: a masked store
/// (`vmaskmovps`) is microcoded on AMD Zen, and packing the lhs of a weight gradient,
/// 6-row tiles, by masked stores made the transposes 8% of a ResNet-20 step.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn store_first(at: *mut f32, v: __m256, n: usize) {
    unsafe {
        let (mut at, mut n) = (at, n);
        let mut part = _mm256_castps256_ps128(v);
        if n >= 4 {
            _mm_storeu_ps(at, part);
            part = _mm256_extractf128_ps::<1>(v);
            (at, n) = (at.add(4), n - 4);
        }
        if n >= 2 {
            _mm_store_sd(at as *mut f64, _mm_castps_pd(part));
            part = _mm_movehl_ps(part, part);
            (at, n) = (at.add(2), n - 2);
        }
        if n == 1 {
            _mm_store_ss(at, part);
        }
    }
}

/// AVX2 with FMA.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(super) struct Avx2;

#[cfg(target_arch = "x86_64")]
impl Simd for Avx2 {
    const LANES: usize = 8;
    const TILE_R: usize = 6;
    const TILE_V: usize = 2;
    const TILE_R_LHS_ZEROS: usize = 6;
    const SPARSE_V: usize = 6;
    type V = __m256;
    type M = __m256i;

    #[inline(always)]
    unsafe fn mask(n: usize) -> __m256i {
        unsafe {
            let n = n.min(8) as i32;
            _mm256_cmpgt_epi32(
                _mm256_set1_epi32(n),
                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
            )
        }
    }
    #[inline(always)]
    unsafe fn zero() -> __m256 {
        unsafe { _mm256_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> __m256 {
        unsafe { _mm256_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m256 {
        unsafe { _mm256_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn load_masked(m: __m256i, p: *const f32) -> __m256 {
        unsafe { _mm256_maskload_ps(p, m) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m256) {
        unsafe { _mm256_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn store_masked(p: *mut f32, m: __m256i, v: __m256) {
        unsafe { _mm256_maskstore_ps(p, m, v) }
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m256, b: __m256, c: __m256) -> __m256 {
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn add(a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_add_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn sub(a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_sub_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn mul(a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn keep(m: __m256i, v: __m256) -> __m256 {
        unsafe { _mm256_and_ps(v, _mm256_castsi256_ps(m)) }
    }
    #[inline(always)]
    unsafe fn add_squares(lanes: &mut [f64; 8], v: __m256) {
        unsafe {
            let p = lanes.as_mut_ptr();
            let lo = _mm256_add_pd(
                _mm256_loadu_pd(p),
                _mm256_cvtps_pd(_mm256_castps256_ps128(v)),
            );
            let hi = _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(v));
            _mm256_storeu_pd(p, lo);
            _mm256_storeu_pd(p.add(4), _mm256_add_pd(_mm256_loadu_pd(p.add(4)), hi));
        }
    }
    #[inline(always)]
    unsafe fn prefetch(p: *const f32) {
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(p as *const i8);
        }
    }

    entries!(Avx2, ["avx2,fma"], rows [1, 2, 3, 4, 5, 6], blocks 24, words noise::Avx2);

    /// In 8 × 8 blocks held in registers: unpack pairs of rows, shuffle quads within
    /// 128-bit lanes, then exchange the lanes (partial blocks by masks).
    #[target_feature(enable = "avx2,fma")]
    unsafe fn transpose(
        src: *const f32,
        cols: usize,
        row_range: (usize, usize),
        first: usize,
        end: usize,
        dst: *mut f32,
        ld: usize,
    ) {
        unsafe {
            let d = dst.wrapping_sub(first * ld).wrapping_sub(row_range.0);
            // (One block of rows: a later block's extra lanes would land on this one's.)
            let packed = ld == row_range.1 - row_range.0 && ld <= 8;
            for r0 in (row_range.0..row_range.1).step_by(8) {
                let rb = 8.min(row_range.1 - r0);
                for c0 in (first..end).step_by(8) {
                    let cb = 8.min(end - c0);
                    let load_mask = Self::mask(cb);
                    let mut r = [_mm256_setzero_ps(); 8];
                    for (i, v) in r.iter_mut().enumerate().take(rb) {
                        let p = src.add((r0 + i) * cols + c0);
                        *v = if cb == 8 {
                            _mm256_loadu_ps(p)
                        } else {
                            _mm256_maskload_ps(p, load_mask)
                        };
                    }
                    // t[2p] = a0 b0 a1 b1 | a4 b4 a5 b5, t[2p+1] = a2 b2 a3 b3 | a6 b6 a7 b7.
                    let mut t = [_mm256_setzero_ps(); 8];
                    for p in 0..4 {
                        t[2 * p] = _mm256_unpacklo_ps(r[2 * p], r[2 * p + 1]);
                        t[2 * p + 1] = _mm256_unpackhi_ps(r[2 * p], r[2 * p + 1]);
                    }
                    // u[4g + e] = column e (low lane) and e + 4 (high lane) of rows 4g..4g+3.
                    let mut u = [_mm256_setzero_ps(); 8];
                    for g in 0..2 {
                        let (t0, t1, t2, t3) = (t[4 * g], t[4 * g + 1], t[4 * g + 2], t[4 * g + 3]);
                        u[4 * g] = _mm256_shuffle_ps::<0x44>(t0, t2);
                        u[4 * g + 1] = _mm256_shuffle_ps::<0xEE>(t0, t2);
                        u[4 * g + 2] = _mm256_shuffle_ps::<0x44>(t1, t3);
                        u[4 * g + 3] = _mm256_shuffle_ps::<0xEE>(t1, t3);
                    }
                    for c in 0..cb {
                        let (e, lane) = (c % 4, c / 4);
                        let v = if lane == 0 {
                            _mm256_permute2f128_ps::<0x20>(u[e], u[4 + e])
                        } else {
                            _mm256_permute2f128_ps::<0x31>(u[e], u[4 + e])
                        };
                        let at = d.wrapping_add((c0 + c) * ld + r0);
                        // Where the columns are packed back to back (ld = the rows), a
                        // whole store that stays inside the block lands its extra lanes
                        // on later columns, which are stored after it: a 6-row tile of
                        // A then takes one store per k, not a 4- and a 2-lane store.
                        let inside = packed && (c0 + c - first) * ld + 8 <= (end - first) * ld;
                        if rb == 8 || inside {
                            _mm256_storeu_ps(at, v);
                        } else {
                            store_first(at, v, rb);
                        }
                    }
                }
            }
        }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn nonzero_words(row: &[f32], words: &mut [u64]) {
        unsafe {
            let zero = _mm256_setzero_ps();
            for (w, chunk) in words.iter_mut().zip(row.chunks(64)) {
                let mut word = 0u64;
                for (q, part) in chunk.chunks(8).enumerate() {
                    let v = if part.len() == 8 {
                        _mm256_loadu_ps(part.as_ptr())
                    } else {
                        _mm256_maskload_ps(part.as_ptr(), Self::mask(part.len()))
                    };
                    let bits = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_NEQ_UQ>(v, zero)) as u64;
                    word |= (bits & ((1u64 << part.len()) - 1)) << (8 * q);
                }
                *w = word;
            }
        }
    }
}

/// Plain Rust over 8-lane arrays, which the compiler vectorises for the target (two SSE
/// registers on x86-64, two NEON registers on aarch64).
///
/// Its multiply-add is fused ([`f32::mul_add`]) where the compilation target has the
/// instruction ([`PORTABLE_FUSED`]: aarch64, or x86-64 built with FMA); there the
/// products are the same bits as the AVX2 and AVX-512 ones. On the x86-64 baseline (no
/// FMA instruction) `mul_add` would be a libm call per multiply-add, ~20× slower, so it
/// is a·b + c in two roundings: the products then differ in the last bits (tested within
/// a bound in the kernel tests).
#[derive(Clone, Copy)]
pub(super) struct Portable;

/// Whether the portable products use fused multiply-adds (see `Portable`).
pub const PORTABLE_FUSED: bool = cfg!(any(target_arch = "aarch64", target_feature = "fma"));

type Lanes = [f32; 8];

#[inline(always)]
fn lanewise(a: Lanes, b: Lanes, f: impl Fn(f32, f32) -> f32) -> Lanes {
    std::array::from_fn(|i| f(a[i], b[i]))
}

impl Simd for Portable {
    const LANES: usize = 8;
    const TILE_R: usize = 4;
    const TILE_V: usize = 2;
    const TILE_R_LHS_ZEROS: usize = 4;
    const SPARSE_V: usize = 6;
    type V = Lanes;
    type M = usize;

    #[inline(always)]
    unsafe fn mask(n: usize) -> usize {
        n.min(8)
    }
    #[inline(always)]
    unsafe fn zero() -> Lanes {
        [0.0; 8]
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> Lanes {
        [x; 8]
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Lanes {
        unsafe { std::ptr::read_unaligned(p as *const Lanes) }
    }
    #[inline(always)]
    unsafe fn load_masked(m: usize, p: *const f32) -> Lanes {
        unsafe {
            let mut v = [0.0; 8];
            for (i, x) in v.iter_mut().enumerate().take(m) {
                *x = *p.add(i);
            }
            v
        }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: Lanes) {
        unsafe { std::ptr::write_unaligned(p as *mut Lanes, v) }
    }
    #[inline(always)]
    unsafe fn store_masked(p: *mut f32, m: usize, v: Lanes) {
        unsafe {
            for (i, &x) in v.iter().enumerate().take(m) {
                *p.add(i) = x;
            }
        }
    }
    #[inline(always)]
    unsafe fn fmadd(a: Lanes, b: Lanes, c: Lanes) -> Lanes {
        std::array::from_fn(|i| {
            if PORTABLE_FUSED {
                a[i].mul_add(b[i], c[i])
            } else {
                a[i] * b[i] + c[i]
            }
        })
    }
    #[inline(always)]
    unsafe fn add(a: Lanes, b: Lanes) -> Lanes {
        lanewise(a, b, |x, y| x + y)
    }
    #[inline(always)]
    unsafe fn sub(a: Lanes, b: Lanes) -> Lanes {
        lanewise(a, b, |x, y| x - y)
    }
    #[inline(always)]
    unsafe fn mul(a: Lanes, b: Lanes) -> Lanes {
        lanewise(a, b, |x, y| x * y)
    }
    #[inline(always)]
    unsafe fn keep(m: usize, v: Lanes) -> Lanes {
        std::array::from_fn(|i| if i < m { v[i] } else { 0.0 })
    }
    #[inline(always)]
    unsafe fn add_squares(lanes: &mut [f64; 8], v: Lanes) {
        for (l, x) in lanes.iter_mut().zip(v) {
            *l += x as f64;
        }
    }
    #[inline(always)]
    unsafe fn prefetch(p: *const f32) {
        unsafe {
            #[cfg(target_arch = "x86_64")]
            _mm_prefetch::<_MM_HINT_T0>(p as *const i8);
            #[cfg(not(target_arch = "x86_64"))]
            let _ = p;
        }
    }

    entries!(Portable, [], rows [1, 2, 3, 4], blocks 16, words noise::Autovec);

    /// In 8 × 8 blocks, element by element (the blocks keep both sides in L1).
    unsafe fn transpose(
        src: *const f32,
        cols: usize,
        row_range: (usize, usize),
        first: usize,
        end: usize,
        dst: *mut f32,
        ld: usize,
    ) {
        unsafe {
            for r0 in (row_range.0..row_range.1).step_by(8) {
                let r1 = (r0 + 8).min(row_range.1);
                for c0 in (first..end).step_by(8) {
                    for c in c0..(c0 + 8).min(end) {
                        let out = dst.add((c - first) * ld);
                        for r in r0..r1 {
                            *out.add(r - row_range.0) = *src.add(r * cols + c);
                        }
                    }
                }
            }
        }
    }

    unsafe fn nonzero_words(row: &[f32], words: &mut [u64]) {
        for (w, chunk) in words.iter_mut().zip(row.chunks(64)) {
            *w = chunk
                .iter()
                .enumerate()
                .fold(0, |m, (i, &v)| m | (u64::from(v != 0.0) << i));
        }
    }
}

// The widest tile `sparse_rows` dispatches is 6 vectors.
#[cfg(target_arch = "x86_64")]
const _: () = assert!(<Avx512 as Simd>::SPARSE_V <= 6 && <Avx2 as Simd>::SPARSE_V <= 6);
const _: () = assert!(<Portable as Simd>::SPARSE_V <= 6);
