//! Direct 3×3 convolutions at stride 1 with one pixel of zero padding (the ResNet's
//! "same" convolutions): the forward pass, and the backward's input error and weight
//! gradient ([`weight_grad`]).
//!
//! Why not im2col + product here: at 16–32 channels the im2col matrix is nine copies of
//! the input, written and read again for a product whose k is only 9·C; and the input
//! error's product Wᵀ·∂Z has k = C_out (16) and writes a nine-times-larger matrix that
//! col2im then folds back. Measured with `perf` on a ResNet-8 step (AMD EPYC Zen 3, one
//! thread): im2col 13%, the forward product 18%, the input error's product 21% and col2im
//! 11%. Here a tile keeps its sums in registers over all C_in·9 terms and reads the
//! input in place from a zero-padded copy (one copy of the input, not nine).
//!
//! A tile is P pixels × 16 output channels: each step of (c, i, j) loads two vectors of
//! 8 channels' weights and broadcasts the P pixels' inputs. So any P pixels of a chunk
//! of images make a tile, with no lanes past a row's end (planes of 7, 14 and 28 are no
//! multiple of 8: vectors of 8 pixels computed 64 outputs for 49 on a 7 × 7 plane), and
//! no load straddles a cache line. The sums of a run of tiles are then transposed into
//! the channels' planes. Against tiles of 4 channels × 2 vectors of 8 pixels: 1.2–1.6×
//! on 32 and 64 channels, 1.1× on 16 (docs/BENCHMARKS.md).
//!
//! The input error of a stride-1 "same" convolution is the same operation on ∂Z with the
//! weights flipped and transposed: `∂a[c][y][x] = Σ_{o,i,j} W[o][c][2−i][2−j]·∂Zₚ[o][y+i][x+j]`
//! (∂Zₚ padded like the input).
//!
//! Arithmetic: each output element sums its C_in·9 terms in the order (c, i, j), one
//! fused multiply-add each on avx2 and avx512 (the same bits on both) and on the portable
//! path where the target has FMA, whatever the thread split.

use super::ops::copy_short;
use super::ConvGeometry;
use crate::census::{self, Layout};
use crate::isa::{self, Isa};
use crate::pool::{self, Disjoint};

/// Floats per vector (the weight gradient's lanes of output pixels; the convolutions'
/// vectors of output channels).
const LANES: usize = 8;
/// Output channels per block of a convolution: two vectors.
const OC: usize = 2 * LANES;
/// Pixels per convolution tile: P·2 = 12 sums, beside 2 weight vectors and a broadcast
/// (15 of the 16 registers), give the FMA pipes' latency some slack. Alone on data in L1
/// (Zen 3), the old tile's 8 sums ran at 0.73–0.80 of the peak, these 12 at 0.81–0.87.
const P: usize = 6;
/// Pixels per run: the tiles of a run stage their sums (RUN × OC, 3 KiB), which one
/// transpose then writes into the channels' planes.
const RUN: usize = 8 * P;
/// Bytes of padded input a chunk of images holds, to stay in L2 while every block of
/// output channels reads it (512 KiB per core on Zen 3).
const PADDED_BYTES: usize = 256 << 10;

/// Which map of the weights a [`conv`] applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// z = W ⋆ a: C_in channels in, C_out out.
    Forward,
    /// ∂a = Wᵀ ⋆ ∂Z with the kernel flipped: C_out channels in, C_in out.
    Adjoint,
}

/// Whether [`conv`] and [`weight_grad`] compute convolution `g`: 3×3, stride 1, padding 1.
pub fn applies(g: &ConvGeometry) -> bool {
    g.kernel == 3 && g.stride == 1 && g.pad == 1 && (g.in_h, g.in_w) == (g.out_h, g.out_w)
}

/// Channels (in, out) of `g` in `direction`.
fn channels(g: &ConvGeometry, direction: Direction) -> (usize, usize) {
    match direction {
        Direction::Forward => (g.in_channels, g.out_channels),
        Direction::Adjoint => (g.out_channels, g.in_channels),
    }
}

/// Floats of the padded plane of one image channel.
fn padded_plane(g: &ConvGeometry) -> usize {
    (g.in_h + 2) * (g.in_w + 2)
}

/// Images per chunk of the padded copy in `direction` (see [`PADDED_BYTES`]).
fn chunk_images(g: &ConvGeometry, direction: Direction, rows: usize) -> usize {
    let per_image = channels(g, direction).0 * padded_plane(g) * std::mem::size_of::<f32>();
    (PADDED_BYTES / per_image.max(1)).clamp(1, rows.max(1))
}

/// Floats of the padded buffer [`conv`] needs for `g` at `rows` images: the chunk's
/// planes (the tiles read single pixels, none past the last plane's end).
pub fn padded_len(g: &ConvGeometry, direction: Direction, rows: usize) -> usize {
    channels(g, direction).0 * chunk_images(g, direction, rows) * padded_plane(g)
}

/// Floats of the packed weights [`conv`] needs for `g`.
pub fn packed_len(g: &ConvGeometry) -> usize {
    // Both directions: blocks of the wider side's channels × the other side's, bounded
    // by the wider side squared.
    let widest = g.in_channels.max(g.out_channels);
    widest.div_ceil(OC) * OC * widest * 9
}

/// `out` (=, or += with `accumulate`) the convolution of `input` (C × B planes of H × W,
/// channel-major, B = `rows`) by the weights `w` (C_out × C_in × 3 × 3) of `g` in
/// `direction`. `padded` and `packed` are scratch of [`padded_len`] and [`packed_len`].
#[allow(clippy::too_many_arguments)]
pub fn conv(
    input: &[f32],
    g: &ConvGeometry,
    direction: Direction,
    rows: usize,
    w: &[f32],
    padded: &mut [f32],
    packed: &mut [f32],
    out: &mut [f32],
    accumulate: bool,
) {
    let (c_in, c_out) = channels(g, direction);
    let kernel = match direction {
        Direction::Forward => census::Kernel::DirectForward,
        Direction::Adjoint => census::Kernel::DirectAdjoint,
    };
    let _timing = census_entry(kernel, c_out, rows * g.out_plane(), c_in * 9, Layout::Rows);
    debug_assert!(applies(g));
    let (h, wd) = (g.in_h, g.in_w);
    let plane = h * wd;
    assert!(
        input.len() >= c_in * rows * plane
            && out.len() >= c_out * rows * plane
            && w.len() >= g.in_channels * g.out_channels * 9,
        "direct convolution: buffers too small"
    );
    let blocks = c_out.div_ceil(OC);
    let packed = &mut packed[..blocks * OC * c_in * 9];
    pack(w, g, direction, packed);
    let packed = &*packed;
    let op = Disjoint::new(out);
    padded_chunks(input, g, direction, rows, padded, |padded, b0, images| {
        // The chunk's pixels (image, y, x) in order: channel o's outputs for them are one
        // run of `pixels` floats from (o·B + b₀)·H·W.
        let pixels = images * plane;
        let runs = pixels.div_ceil(RUN);
        let work = c_out * pixels * c_in * 9;
        let run_items = |range: std::ops::Range<usize>| {
            // A run's sums, pixel-major, then channel-major (reused across the items).
            let (mut stage, mut channels) = ([0f32; RUN * OC], [0f32; OC * RUN]);
            for item in range {
                let (block, run) = (item / runs, item % runs);
                let (o0, q0) = (block * OC, run * RUN);
                let len = RUN.min(pixels - q0);
                let weights = &packed[block * OC * c_in * 9..][..OC * c_in * 9];
                run_tiles(padded, images, c_in, h, wd, weights, q0, len, &mut stage);
                // stage[p][o] → channels[o][p]
                crate::gemm::transpose(len, OC, &stage, OC, &mut channels, RUN);
                for (o, sums) in channels
                    .chunks_exact(RUN)
                    .take(OC.min(c_out - o0))
                    .enumerate()
                {
                    let start = ((o0 + o) * rows + b0) * plane + q0;
                    // SAFETY: pixels q0..q0 + len of this chunk in channel o0 + o belong to
                    // this item alone (items are split between the parts, whole), inside
                    // `out` (checked above).
                    let dst = unsafe { op.slice(start, start + len) };
                    if accumulate {
                        dst.iter_mut().zip(sums).for_each(|(d, s)| *d += s);
                    } else {
                        dst.copy_from_slice(&sums[..len]);
                    }
                }
            }
        };
        split_items(blocks * runs, work, &run_items);
    });
}

/// Calls `f(padded, b₀, images)` for each chunk of images (see [`PADDED_BYTES`]) of the
/// input of `g` in `direction`, with `padded` that chunk zero-padded.
fn padded_chunks(
    input: &[f32],
    g: &ConvGeometry,
    direction: Direction,
    rows: usize,
    padded: &mut [f32],
    mut f: impl FnMut(&[f32], usize, usize),
) {
    let c_in = channels(g, direction).0;
    let pplane = padded_plane(g);
    let per = chunk_images(g, direction, rows);
    for b0 in (0..rows).step_by(per) {
        let images = per.min(rows - b0);
        let padded = &mut padded[..c_in * images * pplane];
        pad(input, rows, g.in_h, g.in_w, b0, images, padded);
        f(padded, b0, images);
    }
}

/// Times a direct convolution for the census as its im2col product C (m × n) = A (m × k,
/// the weights, row-major)·B (k × n, `rhs`), on the threads it runs on: two where the
/// pool is free and the work is large enough to split (as [`split_items`] decides per
/// chunk of images), one inside a part of a job.
fn census_entry(
    kernel: census::Kernel,
    m: usize,
    n: usize,
    k: usize,
    rhs: Layout,
) -> Option<census::Timing> {
    census::start(|| {
        let shape = census::Shape {
            kernel,
            m,
            n,
            k,
            lhs: Layout::Rows,
            rhs,
            skips_zeros: false,
        };
        let large = m * n * k >= pool::PARALLEL_MIN_ELEMENTS * 16;
        let threads = if large && pool::free() {
            pool::threads().min(2)
        } else {
            1
        };
        (shape, threads)
    })
}

/// Runs `f` on two halves of `items` (blocks of output channels × runs of pixels, or ×
/// lanes) on the pool (on this thread when the work is small): each part writes only
/// its items' outputs.
fn split_items(items: usize, work: usize, f: &(dyn Fn(std::ops::Range<usize>) + Sync)) {
    if work < pool::PARALLEL_MIN_ELEMENTS * 16 || items < 2 || pool::threads() < 2 {
        f(0..items);
    } else {
        let cut = items.div_ceil(2);
        pool::run(2, &|p| f(if p == 0 { 0..cut } else { cut..items }));
    }
}

/// packed[((block·C_in' + c)·9 + t)·OC + r] = the weight from input channel c to output
/// channel block·OC + r at tap t = 3i + j in `direction` (0 past the last channel).
fn pack(w: &[f32], g: &ConvGeometry, direction: Direction, packed: &mut [f32]) {
    let (c_in, c_out) = channels(g, direction);
    for (q, p) in packed.iter_mut().enumerate() {
        let r = q % OC;
        let t = q / OC % 9;
        let c = q / (OC * 9) % c_in;
        let o = q / (OC * 9 * c_in) * OC + r;
        *p = if o >= c_out {
            0.0
        } else {
            match direction {
                Direction::Forward => w[(o * g.in_channels + c) * 9 + t],
                // Output channel o is the layer's input channel; input c its output.
                Direction::Adjoint => w[(c * g.in_channels + o) * 9 + (8 - t)],
            }
        };
    }
}

/// padded[(c·images + b)·(H+2)·(W+2) + (y+1)·(W+2) + x + 1] = input[c][b₀ + b][y][x],
/// zero on the border.
fn pad(
    input: &[f32],
    rows: usize,
    h: usize,
    w: usize,
    b0: usize,
    images: usize,
    padded: &mut [f32],
) {
    let (pw, pplane) = (w + 2, (h + 2) * (w + 2));
    let plane = h * w;
    for (q, dst) in padded.chunks_exact_mut(pplane).enumerate() {
        let (c, b) = (q / images, q % images);
        let src = &input[(c * rows + b0 + b) * plane..][..plane];
        dst[..pw].fill(0.0);
        dst[(h + 1) * pw..].fill(0.0);
        for (y, line) in src.chunks_exact(w).enumerate() {
            let row = &mut dst[(y + 1) * pw..][..pw];
            row[0] = 0.0;
            row[pw - 1] = 0.0;
            copy_short(&mut row[1..=w], line);
        }
    }
}

/// The sums of pixels `q0..q0 + len` of a chunk (in the order image, y, x) for one block
/// of OC output channels into `stage` (pixel-major, OC per pixel): `src` the chunk's
/// padded planes (channel c of image b at (c·images + b)·(H+2)·(W+2)), `weights` the
/// block's packed weights (C_in·9·OC). A last tile of fewer than P pixels repeats its
/// last pixel; rows of `stage` past `len` are left undefined.
#[allow(clippy::too_many_arguments)]
fn run_tiles(
    src: &[f32],
    images: usize,
    c_in: usize,
    h: usize,
    w: usize,
    weights: &[f32],
    q0: usize,
    len: usize,
    stage: &mut [f32; RUN * OC],
) {
    let (pw, plane) = (w + 2, h * w);
    let pplane = (h + 2) * pw;
    let c_stride = images * pplane;
    // The last pixel's tap (2, 2) of the last channel.
    let reach = (c_in - 1) * c_stride + (images - 1) * pplane + (h + 1) * pw + w + 1;
    assert!(
        src.len() > reach
            && weights.len() >= c_in * 9 * OC
            && len <= RUN
            && q0 + len <= images * plane,
        "direct convolution: operands too small"
    );
    let fast = cfg!(target_arch = "x86_64") && isa::current() >= Isa::Avx2;
    // Pixel q0 as (image, y, x), then stepped along without division.
    let (mut b, mut y, mut x) = (q0 / plane, q0 % plane / w, q0 % w);
    for t0 in (0..len).step_by(P) {
        let count = P.min(len - t0);
        // Each pixel's input at tap (0, 0) of channel 0.
        let mut at = [0usize; P];
        for a in at.iter_mut().take(count) {
            *a = b * pplane + y * pw + x;
            x += 1;
            if x == w {
                (x, y) = (0, y + 1);
                if y == h {
                    (y, b) = (0, b + 1);
                }
            }
        }
        for p in count..P {
            at[p] = at[count - 1];
        }
        let out = &mut stage[t0 * OC..][..P * OC];
        if fast {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the path is at most what the CPU has (`isa::current`); every pixel
            // lies in the chunk, so every read is at most `reach` < src.len(), and
            // C_in·9·OC ≤ weights.len() (asserted); `out` holds P·OC floats.
            unsafe {
                tile_avx2(
                    src.as_ptr(),
                    c_stride,
                    c_in,
                    pw,
                    weights.as_ptr(),
                    at,
                    out.as_mut_ptr(),
                )
            };
        } else {
            tile_portable(src, c_stride, c_in, pw, weights, at, out);
        }
    }
}

/// One tile's sums: for each of P pixels and OC output channels, Σ over c, then taps
/// (i, j), of input × weight, one fused multiply-add each (the avx512 path runs this
/// too: the same bits as avx2); written to `out` as P rows of OC.
///
/// # Safety
/// AVX2 and FMA present; reads of `src` up to (C_in − 1)·`c_stride` + max(`at`) +
/// 2·`pw` + 2 and of `weights` up to C_in·9·OC inside their buffers; `out` holds P·OC.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2(
    src: *const f32,
    c_stride: usize,
    c_in: usize,
    pw: usize,
    weights: *const f32,
    at: [usize; P],
    out: *mut f32,
) {
    unsafe {
        use std::arch::x86_64::*;
        let mut acc = [[_mm256_setzero_ps(); 2]; P];
        let mut from: [*const f32; P] = std::array::from_fn(|p| src.add(at[p]));
        let mut wc = weights;
        for _ in 0..c_in {
            for i in 0..3 {
                for j in 0..3 {
                    let off = i * pw + j;
                    let wt = wc.add((i * 3 + j) * OC);
                    let wv = [_mm256_loadu_ps(wt), _mm256_loadu_ps(wt.add(LANES))];
                    for (acc, from) in acc.iter_mut().zip(&from) {
                        let a = _mm256_broadcast_ss(&*from.add(off));
                        for (s, &wv) in acc.iter_mut().zip(&wv) {
                            *s = _mm256_fmadd_ps(a, wv, *s);
                        }
                    }
                }
            }
            // (Wrapping: past the last channel the pointers leave the buffer unread.)
            for f in from.iter_mut() {
                *f = f.wrapping_add(c_stride);
            }
            wc = wc.add(9 * OC);
        }
        for (p, acc) in acc.iter().enumerate() {
            for (v, &a) in acc.iter().enumerate() {
                _mm256_storeu_ps(out.add(p * OC + v * LANES), a);
            }
        }
    }
}

/// [`tile_avx2`] in plain Rust for the portable path (a·b + c rounded twice where the
/// target has no FMA, as the portable products do).
fn tile_portable(
    src: &[f32],
    c_stride: usize,
    c_in: usize,
    pw: usize,
    weights: &[f32],
    at: [usize; P],
    out: &mut [f32],
) {
    let mut acc = [[0f32; OC]; P];
    for c in 0..c_in {
        let s = &src[c * c_stride..];
        for t in 0..9 {
            let off = t / 3 * pw + t % 3;
            let wt = &weights[(c * 9 + t) * OC..][..OC];
            for (acc, &at) in acc.iter_mut().zip(&at) {
                let a = s[at + off];
                for (s, &wt) in acc.iter_mut().zip(wt) {
                    *s = fma(a, wt, *s);
                }
            }
        }
    }
    for (dst, acc) in out.chunks_exact_mut(OC).zip(&acc) {
        dst.copy_from_slice(acc);
    }
}

/// a·b + c, fused where the target has FMA (as the portable products).
#[inline(always)]
fn fma(a: f32, b: f32, c: f32) -> f32 {
    if crate::gemm::PORTABLE_FUSED {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// Floats of the per-lane partial sums [`weight_grad`] needs for `g`.
pub fn partial_len(g: &ConvGeometry) -> usize {
    g.out_channels.div_ceil(OC) * OC * g.in_channels * 9 * LANES
}

/// Floats of ∂Z transposed to pixel-major (OC channels a block, and one block more)
/// that [`weight_grad`] needs for `g` at `rows` images: one chunk of images.
pub fn wide_len(g: &ConvGeometry, rows: usize) -> usize {
    let images = chunk_images(g, Direction::Forward, rows);
    (g.out_channels.div_ceil(OC) + 1) * OC * images * g.out_plane()
}

/// (c, tap) terms per weight-gradient tile: 6 terms × 2 vectors of channels = 12 sums.
const TERMS: usize = 6;

/// ∇W of convolution `g` into `wg` (C_out × C_in × 3 × 3, W's order): `∇W[o][c][i][j] =
/// Σ_{b,y,x} ∂Z[o][b][y][x]·aₚ[c][b][y+i][x+j]`, from its input `input` (C_in × B planes)
/// and `dz` (C_out × B planes). `padded`, `partial` and `wide` are scratch of
/// [`padded_len`] (forward), [`partial_len`] and [`wide_len`].
///
/// Each weight sums its terms in 8 lanes: pixel x into lane x mod 8, in the order
/// images, rows, x; then the lanes in order, the same bits whatever the thread split.
/// A tile holds 16 output channels (two vectors, ∂Z transposed to pixel-major) × 6 of
/// the (c, i, j) terms for one lane, and broadcasts each pixel's 6 inputs: no lanes past
/// a row's end, and no load straddles a cache line.
#[allow(clippy::too_many_arguments)]
pub fn weight_grad(
    input: &[f32],
    dz: &[f32],
    g: &ConvGeometry,
    rows: usize,
    padded: &mut [f32],
    partial: &mut [f32],
    wide: &mut [f32],
    wg: &mut [f32],
) {
    // ∇W = ∂Z (C_out × B·H·W) times the transposed im2col matrix (B·H·W × C_in·9).
    let (m, n, k) = (g.out_channels, g.in_channels * 9, rows * g.out_plane());
    let _timing = census_entry(
        census::Kernel::DirectWeightGrad,
        m,
        n,
        k,
        Layout::Transposed,
    );
    debug_assert!(applies(g));
    let (c_in, c_out) = (g.in_channels, g.out_channels);
    let (h, w) = (g.in_h, g.in_w);
    let plane = h * w;
    let blocks = c_out.div_ceil(OC);
    let terms = c_in * 9;
    let stride = terms * LANES * OC;
    assert!(
        input.len() >= c_in * rows * plane
            && dz.len() >= c_out * rows * plane
            && wg.len() >= c_out * terms
            && partial.len() >= blocks * stride
            && wide.len() >= wide_len(g, rows),
        "direct weight gradient: buffers too small"
    );
    let partial = &mut partial[..blocks * stride];
    partial.fill(0.0);
    let (pw, pplane) = (w + 2, padded_plane(g));
    let pp = Disjoint::new(partial);
    padded_chunks(
        input,
        g,
        Direction::Forward,
        rows,
        padded,
        |padded, b0, images| {
            let pixels = images * plane;
            // Each lane's pixels in order: `order` lists the chunk's pixels q lane by lane
            // (lane l from starts[l]), `inputs` the input of each one's tap (0, 0) of
            // channel 0. (Every entry is a pixel of the chunk, as lane_weight_sums requires.)
            let mut starts = [0usize; LANES + 1];
            for x in 0..w {
                starts[x % LANES + 1] += images * h;
            }
            for l in 0..LANES {
                starts[l + 1] += starts[l];
            }
            let (mut order, mut inputs) = (vec![0u32; pixels], vec![0u32; pixels]);
            let mut next = starts;
            for b in 0..images {
                for y in 0..h {
                    for x in 0..w {
                        let at = &mut next[x % LANES];
                        order[*at] = (b * plane + y * w + x) as u32;
                        inputs[*at] = (b * pplane + y * pw + x) as u32;
                        *at += 1;
                    }
                }
            }
            // ∂Z of the chunk, pixel-major in lane order: wide[(block·pixels + n)·OC + o']
            // for the n-th pixel of `order` (0 past C_out). The slot after the last block
            // first holds each block in the pixels' own order.
            let wide = &mut wide[..(blocks + 1) * pixels * OC];
            let (lane_major, natural) = wide.split_at_mut(blocks * pixels * OC);
            for block in 0..blocks {
                let valid = OC.min(c_out - block * OC);
                if valid < OC {
                    natural.fill(0.0);
                }
                let src = &dz[(block * OC * rows + b0) * plane..];
                crate::gemm::transpose(valid, pixels, src, rows * plane, natural, OC);
                let dst = &mut lane_major[block * pixels * OC..][..pixels * OC];
                for (d, &q) in dst.chunks_exact_mut(OC).zip(&order) {
                    d.copy_from_slice(&natural[q as usize * OC..][..OC]);
                }
            }
            let lane_major = &*lane_major;
            let work = c_out * pixels * terms;
            let run_items = |range: std::ops::Range<usize>| {
                for item in range {
                    let (block, lane) = (item / LANES, item % LANES);
                    let (first, end) = (starts[lane], starts[lane + 1]);
                    let dz = &lane_major[(block * pixels + first) * OC..][..(end - first) * OC];
                    // SAFETY: the sums of (block, lane) belong to this item alone (items
                    // are split between the parts, whole), inside `partial`.
                    let at = (block * LANES + lane) * terms * OC;
                    let sums = unsafe { pp.slice(at, at + terms * OC) };
                    for t0 in (0..terms).step_by(TERMS) {
                        let count = TERMS.min(terms - t0);
                        let tap = |t: usize| {
                            let (c, t) = (t / 9, t % 9);
                            c * images * pplane + t / 3 * pw + t % 3
                        };
                        let offsets: [usize; TERMS] =
                            std::array::from_fn(|k| tap(t0 + k.min(count - 1)));
                        lane_weight_sums(
                            padded,
                            images,
                            h,
                            w,
                            c_in,
                            &inputs[first..end],
                            dz,
                            offsets,
                            count,
                            &mut sums[t0 * OC..][..count * OC],
                        );
                    }
                }
            };
            split_items(blocks * LANES, work, &run_items);
        },
    );
    // wg[o][t] = Σ over the lanes in order.
    for (block, lanes) in partial.chunks_exact(stride).enumerate() {
        for o in 0..OC.min(c_out - block * OC) {
            for t in 0..terms {
                wg[(block * OC + o) * terms + t] =
                    (0..LANES).map(|l| lanes[(l * terms + t) * OC + o]).sum();
            }
        }
    }
}

/// Adds to `sums` (term k at k·OC, OC channels) the terms of one lane's pixels for
/// `count` (c, i, j) terms at input offsets `offsets`: pixel n (input offset
/// `inputs[n]`, ∂Z row `dz[n·OC..]`) adds ∂Z[n][o]·src[offset + inputs[n]], one fused
/// multiply-add each, in the pixels' order.
#[allow(clippy::too_many_arguments)]
fn lane_weight_sums(
    src: &[f32],
    images: usize,
    h: usize,
    w: usize,
    c_in: usize,
    inputs: &[u32],
    dz: &[f32],
    offsets: [usize; TERMS],
    count: usize,
    sums: &mut [f32],
) {
    let (pw, pplane) = (w + 2, (h + 2) * (w + 2));
    // The last term's reach: tap (2, 2) of the last channel from the last pixel.
    let reach = (c_in - 1) * images * pplane + (images - 1) * pplane + (h + 1) * pw + w + 1;
    // Every input is a pixel's of the chunk (at most the last pixel's), as the lists are
    // built: checked there, not once per tile.
    let last = (images - 1) * pplane + (h - 1) * pw + w - 1;
    assert!(
        src.len() > reach
            && offsets.iter().all(|&o| o + last <= reach)
            && dz.len() >= inputs.len() * OC
            && (1..=TERMS).contains(&count)
            && sums.len() >= count * OC,
        "direct weight gradient: operands too small"
    );
    debug_assert!(inputs.iter().all(|&at| at as usize <= last));
    if cfg!(target_arch = "x86_64") && isa::current() >= Isa::Avx2 {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the path is at most what the CPU has (`isa::current`); every read lies
        // inside the operands: the extents asserted above, and each input a pixel's of
        // the chunk, as `weight_grad` builds the lists.
        unsafe {
            let (s, d, out) = (src.as_ptr(), dz.as_ptr(), sums.as_mut_ptr());
            match count {
                TERMS => lane_sums_avx2::<TERMS>(s, inputs, d, offsets, out),
                _ => lane_sums_avx2::<3>(s, inputs, d, offsets, out),
            }
        };
        return;
    }
    for (k, &off) in offsets.iter().enumerate().take(count) {
        let sums = &mut sums[k * OC..][..OC];
        for (&at, d) in inputs.iter().zip(dz.chunks_exact(OC)) {
            let x = src[off + at as usize];
            for (s, &d) in sums.iter_mut().zip(d) {
                *s = fma(x, d, *s);
            }
        }
    }
}

/// [`lane_weight_sums`] on AVX2 for T terms (T·2 sums in registers over the lane's
/// pixels).
///
/// # Safety
/// AVX2 and FMA present; operands as [`lane_weight_sums`] checks them, T its count.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn lane_sums_avx2<const T: usize>(
    src: *const f32,
    inputs: &[u32],
    dz: *const f32,
    offsets: [usize; TERMS],
    sums: *mut f32,
) {
    unsafe {
        use std::arch::x86_64::*;
        let mut acc: [[__m256; 2]; T] = std::array::from_fn(|k| {
            let at = sums.add(k * OC);
            [_mm256_loadu_ps(at), _mm256_loadu_ps(at.add(LANES))]
        });
        let from: [*const f32; T] = std::array::from_fn(|k| src.add(offsets[k]));
        let mut d = dz;
        for &off in inputs {
            let dv = [_mm256_loadu_ps(d), _mm256_loadu_ps(d.add(LANES))];
            for (acc, from) in acc.iter_mut().zip(&from) {
                let x = _mm256_broadcast_ss(&*from.add(off as usize));
                for (s, &dv) in acc.iter_mut().zip(&dv) {
                    *s = _mm256_fmadd_ps(x, dv, *s);
                }
            }
            d = d.add(OC);
        }
        for (k, acc) in acc.iter().enumerate() {
            let at = sums.add(k * OC);
            _mm256_storeu_ps(at, acc[0]);
            _mm256_storeu_ps(at.add(LANES), acc[1]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::PORTABLE_FUSED;

    /// Deterministic values in [−0.5, 0.5).
    fn values(len: usize, seed: usize) -> Vec<f32> {
        (0..len)
            .map(|i| ((i * 7919 + seed * 104_729) % 1000) as f32 * 1e-3 - 0.5)
            .collect()
    }

    /// The three passes of `g` at `rows` images on `isa`, on this thread: forward, input
    /// error, weight gradient.
    fn passes(g: &ConvGeometry, rows: usize, isa: Isa) -> [Vec<f32>; 3] {
        let (ci, co, plane) = (g.in_channels, g.out_channels, g.out_plane());
        let (x, dz, w) = (
            values(ci * rows * plane, 1),
            values(co * rows * plane, 2),
            values(co * ci * 9, 3),
        );
        let padded_len = [Direction::Forward, Direction::Adjoint]
            .map(|d| padded_len(g, d, rows))
            .into_iter()
            .max()
            .unwrap_or(0);
        let mut padded = vec![0f32; padded_len];
        let mut packed = vec![0f32; packed_len(g)];
        let (mut partial, mut wide) = (vec![0f32; partial_len(g)], vec![0f32; wide_len(g, rows)]);
        let (mut z, mut err, mut wg) = (
            vec![0f32; co * rows * plane],
            vec![0f32; ci * rows * plane],
            vec![0f32; co * ci * 9],
        );
        // Held pool: every part runs on this thread, which `isa::with` sets.
        pool::serially(|| {
            isa::with(isa, || {
                conv(
                    &x,
                    g,
                    Direction::Forward,
                    rows,
                    &w,
                    &mut padded,
                    &mut packed,
                    &mut z,
                    false,
                );
                conv(
                    &dz,
                    g,
                    Direction::Adjoint,
                    rows,
                    &w,
                    &mut padded,
                    &mut packed,
                    &mut err,
                    false,
                );
                weight_grad(
                    &x,
                    &dz,
                    g,
                    rows,
                    &mut padded,
                    &mut partial,
                    &mut wide,
                    &mut wg,
                );
            })
        });
        [z, err, wg]
    }

    /// A convolution split between two threads (by blocks of channels and runs of
    /// pixels) writes the bits it writes on one: each output is one tile's sum. 40
    /// channels (two whole blocks and a part), 14 × 14, 24 images (two chunks), onto
    /// what `out` holds.
    #[test]
    fn a_split_convolution_gives_the_bits_of_one_thread() {
        let g = ConvGeometry::new(40, 40, 3, 1, [14, 14]);
        let rows = 24;
        let plane = g.out_plane();
        assert!(40 * rows * plane * 40 * 9 >= pool::PARALLEL_MIN_ELEMENTS * 16);
        let (x, w) = (values(40 * rows * plane, 1), values(40 * 40 * 9, 3));
        let run = |serial: bool| {
            let mut padded = vec![0f32; padded_len(&g, Direction::Adjoint, rows)];
            let mut packed = vec![0f32; packed_len(&g)];
            let mut out = vec![1f32; 40 * rows * plane];
            let mut go = || {
                for d in [Direction::Forward, Direction::Adjoint] {
                    conv(
                        &x,
                        &g,
                        d,
                        rows,
                        &w,
                        &mut padded,
                        &mut packed,
                        &mut out,
                        true,
                    );
                }
            };
            if serial {
                pool::serially(go)
            } else {
                go()
            }
            out
        };
        assert!(run(true) == run(false));
    }

    /// The same passes in f64, straight from the definitions.
    fn reference(g: &ConvGeometry, rows: usize) -> [Vec<f64>; 3] {
        let (ci, co, h, w) = (g.in_channels, g.out_channels, g.in_h, g.in_w);
        let plane = h * w;
        let (x, dz, wt) = (
            values(ci * rows * plane, 1),
            values(co * rows * plane, 2),
            values(co * ci * 9, 3),
        );
        let at = |v: &[f32], c: usize, b: usize, y: isize, xx: isize| -> f64 {
            if y < 0 || xx < 0 || y >= h as isize || xx >= w as isize {
                0.0
            } else {
                v[(c * rows + b) * plane + y as usize * w + xx as usize] as f64
            }
        };
        let mut z = vec![0f64; co * rows * plane];
        let mut err = vec![0f64; ci * rows * plane];
        let mut wg = vec![0f64; co * ci * 9];
        for o in 0..co {
            for c in 0..ci {
                for b in 0..rows {
                    for y in 0..h {
                        for xx in 0..w {
                            for t in 0..9 {
                                let (i, j) = ((t / 3) as isize - 1, (t % 3) as isize - 1);
                                let (yy, xs) = (y as isize + i, xx as isize + j);
                                let k = wt[(o * ci + c) * 9 + t] as f64;
                                let out = |ch: usize| (ch * rows + b) * plane + y * w + xx;
                                z[out(o)] += k * at(&x, c, b, yy, xs);
                                // ∂a[c][y][x] = Σ W[o][c][2−i'][2−j']·∂Z[o][y+i][x+j].
                                let flipped = wt[(o * ci + c) * 9 + 8 - t] as f64;
                                err[out(c)] += flipped * at(&dz, o, b, yy, xs);
                                wg[(o * ci + c) * 9 + t] +=
                                    at(&dz, o, b, y as isize, xx as isize) * at(&x, c, b, yy, xs);
                            }
                        }
                    }
                }
            }
        }
        [z, err, wg]
    }

    /// The direct passes agree with their definitions, and the portable path gives the
    /// AVX2 path's bits where it fuses its multiply-adds. Planes of 7, 14 and 28 (one
    /// vector with a lane spare, two overlapping, four), channels that are no multiple
    /// of the 4 of a block, and at 28 × 28 ten images in three chunks (4, 4, 2), whose
    /// weight-gradient sums run over the images of a chunk at once.
    #[test]
    fn direct_passes_match_their_definitions_and_agree_across_paths() {
        for (ci, co, hw, rows) in [(3, 5, 7, 3), (6, 4, 14, 2), (16, 6, 28, 10)] {
            let g = ConvGeometry::new(ci, co, 3, 1, [hw, hw]);
            let (ours, portable) = (passes(&g, rows, Isa::Avx2), passes(&g, rows, Isa::Portable));
            let want = reference(&g, rows);
            for (path, passes) in [("avx2", &ours), ("portable", &portable)] {
                for (pass, (got, want)) in passes.iter().zip(&want).enumerate() {
                    // f32 sums of at most 16·9·280 terms of size ≤ 0.25, against f64.
                    let scale = want.iter().fold(1.0f64, |m, v| m.max(v.abs()));
                    for (q, (&a, &b)) in got.iter().zip(want).enumerate() {
                        assert!(
                            (a as f64 - b).abs() <= 1e-4 * scale,
                            "{path} {ci}→{co} {hw}×{hw}, pass {pass}, element {q}: {a} vs {b}"
                        );
                    }
                }
            }
            if PORTABLE_FUSED || !Isa::Avx2.supported() {
                assert!(ours == portable, "{ci}→{co} {hw}×{hw}: paths differ");
            }
        }
    }
}
