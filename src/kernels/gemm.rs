//! Single-precision matrix products for the MLP's forward and backward, with AVX-512
//! micro-kernels, and the `gemm` crate (candle's CPU matmul) as the fallback.
//!
//! Why our own: the `gemm` crate uses 256-bit kernels on stable Rust (its AVX-512 ones
//! need nightly), about half of what this CPU can do, and it packs both operands, which
//! at batch 100 costs as much as the arithmetic. One kernel takes the three products of
//! an MLP step, C = A·B: a tile of 8 rows × 48 columns keeps 24 vector accumulators, loads
//! 3 vectors of B and broadcasts 8 scalars of A (any strides) per step of k. B is either
//! row-major along n (the weight gradient Δᵀ·X, the input error Δ·W), read in place, or
//! the transpose of a row-major matrix (the forward X·Wᵀ), packed one (128 × 48) panel at
//! a time by an AVX-512 16 × 16 register transpose into a per-thread buffer that stays in
//! L1 while the row tiles run (this replaced transposing all of W every step: −110 µs per
//! forward of 784-400-400-10 at batch 100). (A dot-product kernel for A·Bᵀ was tried first
//! and ran at half the speed.)
//!
//! Edges are handled with masked loads and stores, never by reading or writing outside
//! the operands. Two threads split the output (rows or columns) above
//! [`PARALLEL_MIN_MACS`] multiply-adds.

/// Multiply-adds per thread below which a product is not split further: on 2 cores the
/// fork-join of a second thread costs more than it saves for smaller products. At 10⁶
/// the last layer of 784-400-400-10 (three products of 4·10⁵) ran on one thread while
/// the other waited: 69 µs of its batch-100 step, 45 µs split (timed per parallel region
/// with a throwaway probe).
pub const PARALLEL_MIN_MACS: usize = 200_000;

/// A matrix operand: element (i, j) at `data[i·rs + j·cs]`.
#[derive(Clone, Copy)]
pub struct Mat<'a> {
    pub data: &'a [f32],
    pub rs: usize,
    pub cs: usize,
}

impl<'a> Mat<'a> {
    /// A row-major matrix with `cols` columns.
    pub fn rows(data: &'a [f32], cols: usize) -> Self {
        Mat {
            data,
            rs: cols,
            cs: 1,
        }
    }

    /// The transpose of a row-major matrix with `cols` columns.
    pub fn transposed(data: &'a [f32], cols: usize) -> Self {
        Mat {
            data,
            rs: 1,
            cs: cols,
        }
    }

    /// Offset one past the last element of an (r × c) view.
    fn extent(&self, r: usize, c: usize) -> usize {
        if r == 0 || c == 0 {
            0
        } else {
            (r - 1) * self.rs + (c - 1) * self.cs + 1
        }
    }
}

/// dst (m × n, row-major) ← lhs (m × k) · rhs (k × n), plus the old dst if `accumulate`.
pub fn matmul(
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [f32],
    accumulate: bool,
    lhs: Mat<'_>,
    rhs: Mat<'_>,
) {
    let opts = Options {
        accumulate,
        ..Options::default()
    };
    product(m, n, k, dst, lhs, rhs, opts);
}

/// How [`product`] computes and stores dst = lhs · rhs.
#[derive(Clone, Copy, Default)]
pub struct Options<'a> {
    /// Add the product to the old dst instead of overwriting it.
    pub accumulate: bool,
    /// Threads split the columns of dst (and so of rhs) in two halves of whole vectors,
    /// each packing only its half of a transposed rhs. Otherwise rows when there are
    /// enough of them.
    pub split_columns: bool,
    /// dst ← lhs · rhs + scale · addend, `addend` laid out like dst (the prior term of a
    /// weight gradient, added as the product is stored instead of in a pass of its own).
    pub addend: Option<(&'a [f32], f32)>,
    /// Where an operand's zeros are known, the multiply-adds they would contribute are
    /// skipped (see [`NonZero`]).
    pub zeros: Zeros<'a>,
}

/// Which operand of a product has a [`NonZero`] map.
#[derive(Clone, Copy, Default)]
pub enum Zeros<'a> {
    #[default]
    Unknown,
    /// Of lhs (m × k): a tile of 8 rows of dst runs only over the k where one of its 8
    /// rows of lhs is not zero.
    Lhs(&'a NonZero),
    /// Of rhs (k × n): a tile of up to 48 columns of dst runs only over the k where rhs
    /// is not zero in one of its columns.
    Rhs(&'a NonZero),
}

/// Which entries of a row-major matrix are not zero, one bit per entry (rows padded to
/// whole 64-bit words).
///
/// Why: MNIST's pixels are 81% zeros. In a minibatch of 100, a tile of 8 images has a
/// non-zero pixel in only 47% of the 784 positions, and a block of 48 pixels is blank in
/// 30% of the images; the first layer's forward product and weight gradient skip those
/// multiply-adds. A skipped term is an exact zero (x·w = ±0, and s ± 0 = s), so the
/// result is bit-identical to the dense product for finite operands.
#[derive(Debug, Default, Clone)]
pub struct NonZero {
    bits: Vec<u64>,
    words: usize,
    rows: usize,
    cols: usize,
}

impl NonZero {
    /// Records the non-zero entries of `data` (rows × cols, row-major); NaN counts as
    /// non-zero. Reuses the bitset's memory.
    pub fn record(&mut self, data: &[f32], rows: usize, cols: usize) {
        assert!(data.len() >= rows * cols, "NonZero: data too small");
        let words = cols.div_ceil(64);
        (self.words, self.rows, self.cols) = (words, rows, cols);
        self.bits.clear();
        self.bits.resize(rows * words, 0);
        if cols == 0 {
            return;
        }
        // Large maps on two threads, each its own rows.
        super::pool::halves(&mut self.bits, words, rows * cols, |part, at| {
            let first = at / words;
            for (r, out) in part.chunks_exact_mut(words).enumerate() {
                let row = &data[(first + r) * cols..(first + r + 1) * cols];
                nonzero_words(row, out);
            }
        });
    }

    /// Fraction of entries that are not zero.
    pub fn density(&self) -> f64 {
        let ones: u64 = self.bits.iter().map(|w| w.count_ones() as u64).sum();
        ones as f64 / (self.rows * self.cols).max(1) as f64
    }

    fn row(&self, r: usize) -> &[u64] {
        &self.bits[r * self.words..(r + 1) * self.words]
    }

    /// Whether row `r` has a non-zero entry in columns `c0..c1`.
    fn any(&self, r: usize, c0: usize, c1: usize) -> bool {
        let row = self.row(r);
        let (w0, w1) = (c0 / 64, (c1 - 1) / 64);
        (w0..=w1).any(|w| {
            let lo = if w == w0 { c0 % 64 } else { 0 };
            let hi = if w == w1 { (c1 - 1) % 64 + 1 } else { 64 };
            let mask = (u64::MAX >> (64 - (hi - lo))) << lo;
            row[w] & mask != 0
        })
    }
}

/// Bit i of `words[i / 64]` set where `row[i]` is not zero (or NaN).
fn nonzero_words(row: &[f32], words: &mut [u64]) {
    #[cfg(target_arch = "x86_64")]
    if avx512::available() {
        // SAFETY: AVX-512F present.
        return unsafe { avx512::nonzero_words(row, words) };
    }
    for (w, chunk) in words.iter_mut().zip(row.chunks(64)) {
        *w = chunk
            .iter()
            .enumerate()
            .fold(0, |m, (i, &v)| m | (u64::from(v != 0.0) << i));
    }
}

/// dst (m × n, row-major) ← lhs (m × k) · rhs (k × n), as `opts` says.
#[allow(clippy::too_many_arguments)]
pub fn product(
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [f32],
    lhs: Mat<'_>,
    rhs: Mat<'_>,
    opts: Options<'_>,
) {
    check_operands(m, n, k, dst, lhs, rhs, opts.zeros);
    if let Some((w, _)) = opts.addend {
        assert!(w.len() >= m * n, "matmul: addend too small");
    }
    if m == 0 || n == 0 {
        return;
    }
    // The addend's term, where no kernel adds it while storing: written first, then the
    // product accumulated onto it (the same roundings as the kernel's epilogue).
    let mut accumulate = opts.accumulate;
    let kernel = kernel_for(lhs, rhs);
    let fuse_addend = k > 0 && kernel == Kernel::Nn;
    if let (Some((w, scale)), false) = (opts.addend, fuse_addend) {
        dst[..m * n]
            .iter_mut()
            .zip(&w[..m * n])
            .for_each(|(d, &w)| *d = scale * w);
        accumulate = true;
    }
    if k == 0 {
        if !accumulate {
            dst[..m * n].fill(0.0);
        }
        return;
    }
    let threads = threads_for(m, n, k);
    #[cfg(target_arch = "x86_64")]
    match kernel {
        // SAFETY: extents checked above; the CPU has AVX-512F (checked by kernel_for).
        Kernel::Nn => unsafe {
            let addend = if fuse_addend { opts.addend } else { None };
            let opts = Options {
                accumulate,
                addend,
                ..opts
            };
            avx512::nn(m, n, k, dst, lhs, rhs, threads, opts);
            return;
        },
        Kernel::Fallback => {}
    }
    fallback(m, n, k, dst, accumulate, lhs, rhs, threads);
}

/// Whether [`product_then_update`] can take a product of `n` columns on this CPU (the
/// AVX-512 kernel and the AVX-512 noise of the fused pass; rows of whole Philox blocks
/// of 4 elements).
pub fn updates_inline(n: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    if super::cpu::has_avx512() && avx512::available() {
        return n.is_multiple_of(4);
    }
    let _ = n;
    false
}

/// ∇ = lhs (m × k) · rhs (k × n) + `prior_scale`·θ, the gradient of θ (m × n, row-major),
/// and at once θ (and v) updated from it by `step`, element by element as the product
/// stores its sums: ∇ itself is not stored (`scratch`, m × n, holds the partial sums
/// when k spans several blocks). θ and v end up bit-identical to [`product`] with the
/// addend (θ, `prior_scale`) followed by the fused update of [`super::cpu::step`].
/// Returns Σv² after the update (0 for SGLD), summed per row in order — thread-count
/// independent, though not in the fused pass's chunk order. `row_sums` is scratch.
///
/// # Panics
/// Where [`updates_inline`] is false for `n`, for k = 0, or on operands of the wrong size.
#[allow(clippy::too_many_arguments)]
pub fn product_then_update(
    m: usize,
    n: usize,
    k: usize,
    scratch: &mut [f32],
    lhs: Mat<'_>,
    rhs: Mat<'_>,
    zeros: Zeros<'_>,
    theta: &mut [f32],
    prior_scale: f32,
    step: super::InlineUpdate<'_>,
    row_sums: &mut Vec<f64>,
) -> f64 {
    assert!(
        updates_inline(n),
        "product_then_update: no inline update here"
    );
    assert!(
        matches!(step.update, super::Update::Sgld | super::Update::Momentum),
        "product_then_update: SGLD, SGHMC or SGNHT updates only"
    );
    assert!(
        theta.len() == m * n,
        "product_then_update: θ of the wrong size"
    );
    if step.update == super::Update::Momentum {
        assert!(
            step.momentum.len() == m * n,
            "product_then_update: v of the wrong size"
        );
    }
    // With no k the kernel's k loop, and so the update, would not run at all.
    assert!(k > 0, "product_then_update: an empty product");
    check_operands(m, n, k, scratch, lhs, rhs, zeros);
    row_sums.clear();
    row_sums.resize(m, 0.0);
    if m == 0 || n == 0 {
        return 0.0;
    }
    let fuse = avx512::Fuse {
        theta: theta.as_mut_ptr(),
        momentum: step.momentum.as_mut_ptr(),
        row_sums: row_sums.as_mut_ptr(),
        update: step.update,
        consts: step.consts,
        key: step.key,
        prior_scale,
    };
    let threads = threads_for(m, n, k);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: extents checked above, θ and v are m·n long and borrowed uniquely for the
    // call; the CPU has AVX-512F (updates_inline).
    unsafe {
        let opts = Options {
            zeros,
            ..Options::default()
        };
        avx512::nn_update(m, n, k, scratch, lhs, rhs, threads, opts, &fuse);
    }
    row_sums.iter().sum()
}

/// The hard checks of [`product`] and [`product_then_update`]: everything after them
/// reads and writes through raw pointers.
fn check_operands(
    m: usize,
    n: usize,
    k: usize,
    dst: &[f32],
    lhs: Mat<'_>,
    rhs: Mat<'_>,
    zeros: Zeros<'_>,
) {
    assert!(dst.len() >= m * n, "matmul: destination too small");
    assert!(lhs.data.len() >= lhs.extent(m, k), "matmul: lhs too small");
    assert!(rhs.data.len() >= rhs.extent(k, n), "matmul: rhs too small");
    match zeros {
        Zeros::Unknown => {}
        Zeros::Lhs(z) => assert!(z.rows == m && z.cols == k, "matmul: lhs zeros mismatch"),
        Zeros::Rhs(z) => assert!(z.rows == k && z.cols == n, "matmul: rhs zeros mismatch"),
    }
}

/// Threads for an (m × k)·(k × n) product: at least PARALLEL_MIN_MACS multiply-adds per
/// thread (on a many-core machine a small product does not get split into slivers).
fn threads_for(m: usize, n: usize, k: usize) -> usize {
    super::pool::threads().min((m * n * k / PARALLEL_MIN_MACS).max(1))
}

/// Whether [`product`] skips the zeros of a [`NonZero`] map on this CPU (otherwise
/// recording one is wasted work).
pub fn skips_zeros() -> bool {
    #[cfg(target_arch = "x86_64")]
    if avx512::available() {
        return true;
    }
    false
}

/// Which code computes a product.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kernel {
    /// [`avx512::nn`]: rhs contiguous along n, or along k (the transpose of a row-major
    /// matrix, such as Wᵀ for the forward X·Wᵀ), which the kernel packs panel by panel.
    Nn,
    /// The `gemm` crate.
    Fallback,
}

fn kernel_for(lhs: Mat<'_>, rhs: Mat<'_>) -> Kernel {
    #[cfg(target_arch = "x86_64")]
    if avx512::available() && (rhs.cs == 1 || rhs.rs == 1) {
        return Kernel::Nn;
    }
    let _ = (lhs, rhs);
    Kernel::Fallback
}

/// The `gemm` crate (what candle's CPU matmul calls).
#[allow(clippy::too_many_arguments)]
fn fallback(
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [f32],
    accumulate: bool,
    lhs: Mat<'_>,
    rhs: Mat<'_>,
    threads: usize,
) {
    let parallelism = if threads > 1 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: the caller checked the extents of all three operands against their slices;
    // dst is a unique borrow, so it aliases neither source.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            lhs.data.as_ptr(),
            lhs.cs as isize,
            lhs.rs as isize,
            rhs.data.as_ptr(),
            rhs.cs as isize,
            rhs.rs as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// Runs `part(start, end)` over `parts` even splits of `0..len` (rounded to `align`),
/// in parallel (on [`super::pool`]) when `parts` > 1.
fn split(len: usize, parts: usize, align: usize, part: impl Fn(usize, usize) + Sync) {
    let parts = parts.min(len.div_ceil(align)).max(1);
    if parts == 1 {
        part(0, len);
        return;
    }
    let per = len.div_ceil(parts).div_ceil(align) * align;
    super::pool::run(parts, &|p| {
        let (a, b) = ((p * per).min(len), ((p + 1) * per).min(len));
        if a < b {
            part(a, b)
        }
    });
}

/// The size of tile `t` when `len` is cut into the fewest tiles of at most `max`, as
/// equal as possible (a 50-row block becomes 8,7,7,7,7,7,7 rather than 8,…,8,2: a thin
/// last tile does few FMAs per load).
fn balanced(len: usize, max: usize) -> impl Iterator<Item = usize> {
    let tiles = len.div_ceil(max).max(1);
    let (base, extra) = (len / tiles, len % tiles);
    (0..tiles)
        .map(move |t| base + usize::from(t < extra))
        .filter(|&h| h > 0)
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use std::cell::RefCell;

    use super::super::pool::Disjoint;
    use super::{balanced, split, Mat, Options, Zeros};

    pub fn available() -> bool {
        std::arch::is_x86_feature_detected!("avx512f")
    }

    /// Mask of the first `n` (≤ 16) lanes.
    #[inline(always)]
    fn mask(n: usize) -> __mmask16 {
        if n >= 16 {
            0xFFFF
        } else {
            ((1u32 << n) - 1) as __mmask16
        }
    }

    /// Transpose in 16 × 16 blocks held in registers: unpack pairs of rows, shuffle
    /// within 128-bit lanes, then exchange lanes (partial blocks by masks).
    ///
    /// Source rows `row_range`, source columns `first..end` of `src` (row stride `cols`):
    /// source element (r, c) goes to `dst + (c − first)·ld + r` (with `dst` offset by
    /// −row_range.0 this packs the block into a buffer of row stride `ld`).
    ///
    /// # Safety
    /// AVX-512F present; `src` holds every element (r, c) read, r in `row_range`, c in
    /// `first..end`; every written location is writable and not otherwise accessed
    /// meanwhile.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn transpose(
        src: &[f32],
        rows: usize,
        cols: usize,
        row_range: (usize, usize),
        first: usize,
        end: usize,
        dst: *mut f32,
        ld: usize,
    ) {
        let (s, d) = (src.as_ptr(), dst.wrapping_sub(first * ld));
        let _ = rows;
        for r0 in (row_range.0..row_range.1).step_by(16) {
            let rb = 16.min(row_range.1 - r0);
            for c0 in (first..end).step_by(16) {
                let cb = 16.min(end - c0);
                let load_mask = mask(cb);
                let mut r = [_mm512_setzero_ps(); 16];
                for (i, v) in r.iter_mut().enumerate().take(rb) {
                    *v = _mm512_maskz_loadu_ps(load_mask, s.add((r0 + i) * cols + c0));
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
                let store_mask = mask(rb);
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

    /// Bit i of `words[i / 64]` set where `row[i]` is not zero (or NaN).
    ///
    /// # Safety
    /// AVX-512F present.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn nonzero_words(row: &[f32], words: &mut [u64]) {
        let zero = _mm512_setzero_ps();
        for (w, chunk) in words.iter_mut().zip(row.chunks(64)) {
            let mut word = 0u64;
            for (q, part) in chunk.chunks(16).enumerate() {
                let m = mask(part.len());
                let v = _mm512_maskz_loadu_ps(m, part.as_ptr());
                word |= u64::from(_mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(v, zero) & m) << (16 * q);
            }
            *w = word;
        }
    }

    // ---- C = A·B, B (k × n) row-major along n, A with any strides ----

    const NN_R: usize = 8;
    /// Rows of a tile that skips lhs zeros: the union of fewer images' pixels is sparser
    /// (MNIST, 8 images: 47% of the pixels, 6: 44%, 4: 39%), but fewer rows do fewer FMAs
    /// per load. Measured on the 784→400 forward (`bnn bench gemm`, 3 interleaved rounds):
    /// 8 rows 184–193 µs at batch 100, 6 rows 172–184, 4 rows 193–204.
    const NN_R_LHS_ZEROS: usize = 6;
    const NN_V: usize = 3;
    const NN_KC: usize = 128;
    // Zero-map blocks start on whole 64-bit words.
    const _: () = assert!(NN_KC.is_multiple_of(64));

    /// What a tile does with its sums: store them, add them to C, or add them to
    /// `scale · addend` (an addend laid out like C; the prior term of a weight gradient).
    #[derive(Clone, Copy)]
    pub enum Store {
        Overwrite,
        Accumulate,
        AddScaled(*const f32, f32),
        /// The sums complete the gradient of θ at element offset `at` of C (with the
        /// prior term, or, when `from_dst`, with the partial sums in C): update θ.
        Update {
            fuse: *const Fuse,
            at: usize,
            from_dst: bool,
        },
    }

    /// What [`super::product_then_update`] updates, as raw pointers into its borrows.
    pub struct Fuse {
        pub theta: *mut f32,
        pub momentum: *mut f32,
        /// Σv² of each row of C, accumulated tile by tile in column order.
        pub row_sums: *mut f64,
        pub update: crate::kernels::Update,
        pub consts: crate::kernels::StepConsts,
        pub key: crate::rng::NoiseKey,
        pub prior_scale: f32,
    }

    /// The update of one tile's R rows × V vectors of sums (`cols` valid columns) into θ
    /// and v at element offset `at` (row stride `n`): ∇ = sum + λθ (or + the partial
    /// sums in C), noise for the tile's Philox blocks, then the fused element update in
    /// the kernel header's f32 operations and order.
    ///
    /// # Safety
    /// AVX-512 F, DQ, VL, BW and FMA present (the feature set of the fused pass's AVX-512
    /// build, under which its noise vectorises best); pointers as [`Fuse`] says.
    #[target_feature(enable = "avx512f,avx512dq,avx512vl,avx512bw,avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    unsafe fn update_tile<const R: usize, const V: usize>(
        acc: &[[__m512; V]; R],
        masks: &[__mmask16; V],
        c: *mut f32,
        n: usize,
        f: &Fuse,
        at: usize,
        from_dst: bool,
    ) {
        // The tile's rows are whole Philox blocks (at and n are multiples of 4): block
        // (at + r·n)/4 + b holds elements 4b .. 4b+3 of row r.
        let per_row = 4 * V; // blocks per row of the tile
        let mut counters = [0u32; 8 * 12];
        for r in 0..R {
            let first = ((at + r * n) / 4) as u32;
            for b in 0..per_row {
                counters[r * per_row + b] = first.wrapping_add(b as u32);
            }
        }
        let mut z = [[0f32; 4]; 8 * 12];
        use super::super::cpu::normals_blocks as normals;
        match V {
            3 => normals::<96>(&f.key, &counters, &mut z),
            2 => {
                let (cnt, zz) = (counters.first_chunk::<64>(), z.first_chunk_mut::<64>());
                if let (Some(cnt), Some(zz)) = (cnt, zz) {
                    normals::<64>(&f.key, cnt, zz);
                }
            }
            _ => {
                let (cnt, zz) = (counters.first_chunk::<32>(), z.first_chunk_mut::<32>());
                if let (Some(cnt), Some(zz)) = (cnt, zz) {
                    normals::<32>(&f.key, cnt, zz);
                }
            }
        }
        let z = z.as_flattened();
        let k = f.consts;
        let (eta, sigma) = (_mm512_set1_ps(k.step_size), _mm512_set1_ps(k.noise_scale));
        let (decay, post) = (_mm512_set1_ps(k.decay), _mm512_set1_ps(k.post));
        let lambda = _mm512_set1_ps(f.prior_scale);
        let momentum = f.update == crate::kernels::Update::Momentum;
        for (r, row) in acc.iter().enumerate() {
            let mut sq = _mm512_setzero_pd();
            for (v, &sum) in row.iter().enumerate() {
                let (m, off) = (masks[v], at + r * n + 16 * v);
                let theta = _mm512_maskz_loadu_ps(m, f.theta.add(off));
                // ∇: the roundings of the stored gradient (see Store::AddScaled).
                let g = if from_dst {
                    _mm512_add_ps(sum, _mm512_maskz_loadu_ps(m, c.add(off)))
                } else {
                    _mm512_add_ps(sum, _mm512_mul_ps(lambda, theta))
                };
                let zv = _mm512_maskz_loadu_ps(m, z.as_ptr().add(r * 4 * per_row + 16 * v));
                let kick = _mm512_mul_ps(g, eta);
                let noise = _mm512_mul_ps(zv, sigma);
                if momentum {
                    // bnn_momentum_step: vn = (v·decay − g·η + z·σ)·post; θ += vn.
                    let old = _mm512_maskz_loadu_ps(m, f.momentum.add(off));
                    let vn = _mm512_mul_ps(
                        _mm512_add_ps(_mm512_sub_ps(_mm512_mul_ps(old, decay), kick), noise),
                        post,
                    );
                    _mm512_mask_storeu_ps(f.momentum.add(off), m, vn);
                    _mm512_mask_storeu_ps(f.theta.add(off), m, _mm512_add_ps(theta, vn));
                    let vv = _mm512_maskz_mul_ps(m, vn, vn);
                    sq = _mm512_add_pd(sq, _mm512_cvtps_pd(_mm512_castps512_ps256(vv)));
                    // (The upper eight lanes through an AVX-512F extract.)
                    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(vv)));
                    sq = _mm512_add_pd(sq, _mm512_cvtps_pd(hi));
                } else {
                    // bnn_sgld: θ ← θ − g·η + z·σ.
                    let t = _mm512_add_ps(_mm512_sub_ps(theta, kick), noise);
                    _mm512_mask_storeu_ps(f.theta.add(off), m, t);
                }
            }
            if momentum {
                *f.row_sums.add(at / n + r) += _mm512_reduce_add_pd(sq);
            }
        }
    }

    /// The k a tile runs over: all of `0..k`, or a list of the k whose terms are not all
    /// zero (relative to the tile's first k, ascending).
    #[derive(Clone, Copy)]
    enum Ks<'a> {
        All(usize),
        List(&'a [u32]),
    }

    /// One tile of R rows × (up to) 16·V columns; `cols` masks the last vector(s).
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn nn_tile<const R: usize, const V: usize>(
        ks: Ks<'_>,
        a: *const f32,
        a_rs: usize,
        a_cs: usize,
        b: *const f32,
        ldb: usize,
        c: *mut f32,
        ldc: usize,
        cols: usize,
        store: Store,
    ) {
        let mut masks = [0 as __mmask16; V];
        for (v, m) in masks.iter_mut().enumerate() {
            *m = mask(cols.saturating_sub(16 * v));
        }
        // The epilogue's operands (the addend, or θ and v) are visited 8 rows × 48
        // columns at a time, a pattern the hardware prefetcher does not follow: fetch
        // them now, while the k loop runs.
        let ahead = |base: *const f32| {
            for i in 0..R {
                for v in 0..V {
                    let at = base.wrapping_add(i * ldc + 16 * v) as *const i8;
                    _mm_prefetch::<_MM_HINT_T0>(at);
                }
            }
        };
        match store {
            Store::AddScaled(w, _) => ahead(w),
            Store::Update { fuse, at, .. } => {
                let f = &*fuse;
                ahead(f.theta.wrapping_add(at));
                if f.update == crate::kernels::Update::Momentum {
                    ahead(f.momentum.wrapping_add(at));
                }
            }
            Store::Overwrite | Store::Accumulate => {}
        }
        let mut acc = [[_mm512_setzero_ps(); V]; R];
        let mut rows = [a; R];
        for (i, r) in rows.iter_mut().enumerate() {
            *r = a.add(i * a_rs);
        }
        // One step of k: 3 vectors of B, 8 broadcasts of A, 24 FMAs (a macro, not a
        // closure, so that the accumulators stay in registers).
        macro_rules! step {
            ($p:expr) => {{
                let p: usize = $p;
                let bp = b.add(p * ldb);
                let mut bv = [_mm512_setzero_ps(); V];
                for v in 0..V {
                    bv[v] = _mm512_maskz_loadu_ps(masks[v], bp.wrapping_add(16 * v));
                }
                for i in 0..R {
                    let s = _mm512_set1_ps(*rows[i].add(p * a_cs));
                    for v in 0..V {
                        acc[i][v] = _mm512_fmadd_ps(s, bv[v], acc[i][v]);
                    }
                }
            }};
        }
        match ks {
            Ks::All(k) => {
                for p in 0..k {
                    step!(p)
                }
            }
            Ks::List(list) => {
                // The k of a list jump, which the hardware prefetcher does not follow:
                // fetch B's row and A's elements a few steps ahead.
                const AHEAD: usize = 6;
                for (at, &p) in list.iter().enumerate() {
                    if let Some(&q) = list.get(at + AHEAD) {
                        let q = q as usize;
                        let bq = b.wrapping_add(q * ldb) as *const i8;
                        for v in 0..V {
                            _mm_prefetch::<_MM_HINT_T0>(bq.wrapping_add(64 * v));
                        }
                        _mm_prefetch::<_MM_HINT_T0>(rows[0].wrapping_add(q * a_cs) as *const i8);
                        _mm_prefetch::<_MM_HINT_T0>(rows[R - 1].wrapping_add(q * a_cs) as *const i8);
                    }
                    step!(p as usize)
                }
            }
        }
        if let Store::Update { fuse, at, from_dst } = store {
            update_tile::<R, V>(&acc, &masks, c.wrapping_sub(at), ldc, &*fuse, at, from_dst);
            return;
        }
        for (i, row) in acc.iter().enumerate() {
            let out = c.add(i * ldc);
            for (v, &val) in row.iter().enumerate() {
                let o = out.wrapping_add(16 * v);
                let val = match store {
                    Store::Update { .. } => unreachable!("handled above"),
                    Store::Overwrite => val,
                    Store::Accumulate => _mm512_add_ps(val, _mm512_maskz_loadu_ps(masks[v], o)),
                    Store::AddScaled(w, scale) => {
                        // fl(sum + fl(scale·w)): the same roundings as writing scale·w
                        // first and accumulating onto it.
                        let w = _mm512_maskz_loadu_ps(masks[v], w.wrapping_add(i * ldc + 16 * v));
                        _mm512_add_ps(val, _mm512_mul_ps(_mm512_set1_ps(scale), w))
                    }
                };
                _mm512_mask_storeu_ps(o, masks[v], val);
            }
        }
    }

    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn nn_rows<const V: usize>(
        rows: usize,
        k: Ks<'_>,
        a: *const f32,
        a_rs: usize,
        a_cs: usize,
        b: *const f32,
        ldb: usize,
        c: *mut f32,
        ldc: usize,
        cols: usize,
        store: Store,
    ) {
        let args = (k, a, a_rs, a_cs, b, ldb, c, ldc, cols, store);
        macro_rules! go {
            ($r:literal) => {
                nn_tile::<$r, V>(
                    args.0, args.1, args.2, args.3, args.4, args.5, args.6, args.7, args.8, args.9,
                )
            };
        }
        match rows {
            8 => go!(8),
            7 => go!(7),
            6 => go!(6),
            5 => go!(5),
            4 => go!(4),
            3 => go!(3),
            2 => go!(2),
            _ => go!(1),
        }
    }

    thread_local! {
        /// Per thread: the packed (k block × 48) panel of B when rhs is a transpose.
        static PANEL: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
        /// Per thread: the k lists of its row tiles for one k block (lhs zeros).
        static ROW_TILE_KS: RefCell<(Vec<u32>, Vec<usize>)> =
            const { RefCell::new((Vec::new(), Vec::new())) };
    }

    /// C (m × n) = A·B (+ C), as `opts` says. Threads split the columns of C (or its rows
    /// when it is narrow).
    ///
    /// Every element of C sums its k in blocks of NN_KC (in order within a block, blocks
    /// added in order), whatever the tiling, thread split or skipped zeros: the result
    /// does not depend on them.
    ///
    /// # Safety
    /// AVX-512F present; operand extents (and those of the addend and the zero maps)
    /// checked by the caller; `rhs.cs == 1`.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn nn(
        m: usize,
        n: usize,
        k: usize,
        dst: &mut [f32],
        lhs: Mat<'_>,
        rhs: Mat<'_>,
        threads: usize,
        opts: Options<'_>,
    ) {
        nn_with(m, n, k, dst, lhs, rhs, threads, opts, None)
    }

    /// [`nn`] whose last k block updates θ from the completed gradient (`fuse`; the
    /// prior addend is θ itself, read through the same pointer). Threads split the rows,
    /// so each row's Σv² is summed by one thread in column order.
    ///
    /// # Safety
    /// As [`nn`]; `fuse`'s θ, v (m·n each) and row sums (m) valid and not otherwise
    /// accessed during the call; n a multiple of 4.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn nn_update(
        m: usize,
        n: usize,
        k: usize,
        dst: &mut [f32],
        lhs: Mat<'_>,
        rhs: Mat<'_>,
        threads: usize,
        opts: Options<'_>,
        fuse: &Fuse,
    ) {
        nn_with(m, n, k, dst, lhs, rhs, threads, opts, Some(fuse))
    }

    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn nn_with(
        m: usize,
        n: usize,
        k: usize,
        dst: &mut [f32],
        lhs: Mat<'_>,
        rhs: Mat<'_>,
        threads: usize,
        opts: Options<'_>,
        fuse: Option<&Fuse>,
    ) {
        let (a, a_rs, a_cs) = (lhs.data.as_ptr() as usize, lhs.rs, lhs.cs);
        let (w, scale) = match fuse {
            Some(f) => (f.theta as usize, f.prior_scale),
            None => opts
                .addend
                .map_or((0usize, 0f32), |(w, s)| (w.as_ptr() as usize, s)),
        };
        let fuse = fuse.map(|f| f as *const Fuse as usize);
        let (b, ldb) = (rhs.data.as_ptr() as usize, rhs.rs);
        // rhs = Sᵀ for a row-major S (n × k, rows rhs.cs apart): each (k block × column
        // tile) panel of B is transposed from S into a small buffer before its tiles run,
        // instead of the caller transposing all of S first.
        let packed = rhs.cs != 1;
        let c = Disjoint::new(dst);
        let tile_rows = if matches!(opts.zeros, Zeros::Lhs(_)) {
            NN_R_LHS_ZEROS
        } else {
            NN_R
        };
        let block = |r0: usize, r1: usize, c0: usize, c1: usize| {
            PANEL.with_borrow_mut(|panel| {
                ROW_TILE_KS.with_borrow_mut(|(lists, lens)| {
                    if packed && panel.len() < NN_KC * NN_V * 16 {
                        panel.resize(NN_KC * NN_V * 16, 0.0);
                    }
                    // k in blocks of NN_KC: a (KC × 48) panel of B stays in L1 across the row tiles.
                    for p0 in (0..k).step_by(NN_KC) {
                        let kc = NN_KC.min(k - p0);
                        if let Zeros::Lhs(z) = opts.zeros {
                            // The k of this block where some row of the tile is not zero.
                            lens.clear();
                            lists.resize(NN_KC * (r1 - r0).div_ceil(tile_rows).max(1), 0);
                            let mut i = r0;
                            for (t, rows) in balanced(r1 - r0, tile_rows).enumerate() {
                                let list = &mut lists[t * NN_KC..(t + 1) * NN_KC];
                                lens.push(block_ks(kc, list, |word| {
                                    (i..i + rows).fold(0, |acc, r| acc | z.row(r)[p0 / 64 + word])
                                }));
                                i += rows;
                            }
                        }
                        let mut j = c0;
                        // Column tiles of whole vectors, balanced: 7 vectors → 3, 2, 2.
                        for vectors in balanced((c1 - c0).div_ceil(16), NN_V) {
                            let cols = (16 * vectors).min(c1 - j);
                            let (b_tile, ld_tile) = if packed {
                                // panel[(p − p0)·48 + (r − j)] = S[r, p] for r in j..j+cols.
                                // SAFETY: source rows j..j+cols < n, columns p0..p0+kc ≤ k:
                                // inside the extent of rhs checked by `product`; the writes
                                // land in panel[0..kc·48] (r − j < cols ≤ 48), this thread's
                                // own buffer.
                                transpose(
                                    rhs.data,
                                    n,
                                    rhs.cs,
                                    (j, j + cols),
                                    p0,
                                    p0 + kc,
                                    panel.as_mut_ptr().wrapping_sub(j),
                                    NN_V * 16,
                                );
                                (panel.as_ptr(), NN_V * 16)
                            } else {
                                ((b as *const f32).add(p0 * ldb + j), ldb)
                            };
                            // The k of this block where rhs is not zero in the tile's columns.
                            let mut rhs_list = [0u32; NN_KC];
                            let mut rhs_len = 0;
                            if let Zeros::Rhs(z) = opts.zeros {
                                for p in 0..kc {
                                    if z.any(p0 + p, j, j + cols) {
                                        rhs_list[rhs_len] = p as u32;
                                        rhs_len += 1;
                                    }
                                }
                            }
                            let mut i = r0;
                            for (t, rows) in balanced(r1 - r0, tile_rows).enumerate() {
                                let (ap, bp, cp) = (
                                    (a as *const f32).add(i * a_rs + p0 * a_cs),
                                    b_tile,
                                    c.at(i * n + j),
                                );
                                let acc = if let (Some(f), true) = (fuse, p0 + kc == k) {
                                    Store::Update {
                                        fuse: f as *const Fuse,
                                        at: i * n + j,
                                        from_dst: p0 > 0,
                                    }
                                } else if opts.accumulate || p0 > 0 {
                                    Store::Accumulate
                                } else if w != 0 {
                                    Store::AddScaled(
                                        (w as *const f32).wrapping_add(i * n + j),
                                        scale,
                                    )
                                } else {
                                    Store::Overwrite
                                };
                                let ks = match opts.zeros {
                                    Zeros::Unknown => Ks::All(kc),
                                    Zeros::Lhs(_) => {
                                        Ks::List(&lists[t * NN_KC..t * NN_KC + lens[t]])
                                    }
                                    Zeros::Rhs(_) => Ks::List(&rhs_list[..rhs_len]),
                                };
                                // SAFETY: the tile lies inside the checked extents; masked lanes
                                // beyond `cols` are neither read nor written.
                                unsafe {
                                    match cols.div_ceil(16) {
                                        3 => nn_rows::<3>(
                                            rows, ks, ap, a_rs, a_cs, bp, ld_tile, cp, n, cols, acc,
                                        ),
                                        2 => nn_rows::<2>(
                                            rows, ks, ap, a_rs, a_cs, bp, ld_tile, cp, n, cols, acc,
                                        ),
                                        _ => nn_rows::<1>(
                                            rows, ks, ap, a_rs, a_cs, bp, ld_tile, cp, n, cols, acc,
                                        ),
                                    }
                                }
                                i += rows;
                            }
                            j += cols;
                        }
                    }
                })
            })
        };
        // Rows when each thread gets at least two row tiles (every thread then runs the
        // same column tiles); columns, in whole vectors, otherwise.
        if fuse.is_some() || !opts.split_columns && (m >= 2 * NN_R * threads || threads == 1) {
            split(m, threads, 1, |r0, r1| block(r0, r1, 0, n));
        } else {
            split(n, threads, 16, |c0, c1| block(0, m, c0, c1));
        }
    }

    /// Writes into `list` the k in `0..kc` (a block starting on a whole 64-bit word of the
    /// zero map) whose bit is set in `word(w)`, the block's w-th word; returns how many.
    #[inline]
    fn block_ks(kc: usize, list: &mut [u32], word: impl Fn(usize) -> u64) -> usize {
        let mut len = 0;
        for w in 0..kc.div_ceil(64) {
            let valid = if 64 * (w + 1) <= kc {
                u64::MAX
            } else {
                u64::MAX >> (64 - (kc - 64 * w))
            };
            let mut bits = word(w) & valid;
            while bits != 0 {
                list[len] = (64 * w) as u32 + bits.trailing_zeros();
                len += 1;
                bits &= bits - 1;
            }
        }
        len
    }
}

/// The portable transpose (tests build transposed operands with it).
#[cfg(test)]
fn transpose_scalar(src: &[f32], rows: usize, cols: usize, dst: &mut [f32]) {
    const B: usize = 16;
    for r0 in (0..rows).step_by(B) {
        let r1 = (r0 + B).min(rows);
        for c0 in (0..cols).step_by(B) {
            let c1 = (c0 + B).min(cols);
            for r in r0..r1 {
                let row = &src[r * cols + c0..r * cols + c1];
                for (c, &v) in (c0..c1).zip(row) {
                    dst[c * rows + r] = v;
                }
            }
        }
    }
}

/// GFLOP/s of [`matmul`] and of the `gemm` crate on one product A·B (m × k times k × n;
/// B row-major, or with `rhs_transposed` the transpose of a row-major n × k matrix, as
/// the forward reads W), median of `repeats` (for `bnn bench gemm`).
pub fn bench(m: usize, n: usize, k: usize, rhs_transposed: bool, repeats: usize) -> (f64, f64) {
    let a: Vec<f32> = (0..m * k)
        .map(|i| ((i * 7919) % 1000) as f32 * 1e-3)
        .collect();
    let b: Vec<f32> = (0..k * n)
        .map(|i| ((i * 104_729) % 1000) as f32 * 1e-3)
        .collect();
    let mut c = vec![0f32; m * n];
    let rhs = if rhs_transposed {
        Mat::transposed(&b, k)
    } else {
        Mat::rows(&b, n)
    };
    let lhs = Mat::rows(&a, k);
    let threads = if m * n * k >= PARALLEL_MIN_MACS {
        rayon::current_num_threads()
    } else {
        1
    };
    let mut time = |f: &mut dyn FnMut(&mut [f32])| {
        f(&mut c);
        let mut t: Vec<f64> = (0..repeats)
            .map(|_| {
                let s = std::time::Instant::now();
                f(&mut c);
                s.elapsed().as_secs_f64()
            })
            .collect();
        t.sort_by(f64::total_cmp);
        2.0 * (m * n * k) as f64 / t[t.len() / 2] / 1e9
    };
    let ours = time(&mut |c| matmul(m, n, k, c, false, lhs, rhs));
    let crate_gemm = time(&mut |c| fallback(m, n, k, c, false, lhs, rhs, threads));
    (ours, crate_gemm)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_transposed_rhs_is_bit_identical_to_a_row_major_copy() {
        // rhs given as Sᵀ (packed inside the kernel, 16 × 16 register transposes with
        // ragged edges) against the same values stored row-major; several k blocks,
        // both thread splits, with and without skipped zeros.
        for (m, n, k) in [
            (100, 400, 784),
            (100, 100, 784),
            (13, 50, 300),
            (7, 17, 19),
            (1, 1, 1),
        ] {
            let a = sparse_values(m * k, k, 0.6, 11 + n as u64);
            let s_nk = sparse_values(n * k, k, 0.0, 12 + k as u64); // S: n × k
            let mut b = vec![0f32; k * n]; // B = Sᵀ, row-major k × n
            transpose_scalar(&s_nk, n, k, &mut b);
            let mut za = NonZero::default();
            za.record(&a, m, k);
            for split_columns in [false, true] {
                for zeros in [Zeros::Unknown, Zeros::Lhs(&za)] {
                    let opts = Options {
                        split_columns,
                        zeros,
                        ..Options::default()
                    };
                    let (mut x, mut y) = (vec![0f32; m * n], vec![1f32; m * n]);
                    product(m, n, k, &mut x, Mat::rows(&a, k), Mat::rows(&b, n), opts);
                    product(
                        m,
                        n,
                        k,
                        &mut y,
                        Mat::rows(&a, k),
                        Mat::transposed(&s_nk, k),
                        opts,
                    );
                    assert!(
                        x.iter().zip(&y).all(|(p, q)| p.to_bits() == q.to_bits()),
                        "{m}x{n}x{k} split_columns {split_columns}"
                    );
                }
            }
        }
    }

    /// Values in [−0.5, 0.5) with about `zero_frac` exact zeros, in runs (blank image
    /// borders) and scattered.
    fn sparse_values(len: usize, cols: usize, zero_frac: f64, seed: u64) -> Vec<f32> {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        (0..len)
            .map(|i| {
                let border = (i % cols) < cols / 5 || (i % cols) >= cols - cols / 5;
                if border || next() < zero_frac {
                    0.0
                } else {
                    (next() - 0.5) as f32
                }
            })
            .collect()
    }

    #[test]
    fn skipping_zeros_is_bit_identical_to_the_dense_product() {
        // Shapes of the first layer (batch × 784 × hidden) and ragged ones; k past one
        // block of NN_KC; both thread splits; overwrite, accumulate and the prior addend.
        for (m, n, k) in [
            (100, 100, 784),
            (100, 400, 784),
            (13, 50, 300),
            (37, 70, 129),
        ] {
            for zero_frac in [0.0, 0.6, 1.0] {
                let a = sparse_values(m * k, k, zero_frac, 1 + m as u64);
                let b = sparse_values(k * n, n, zero_frac, 2 + n as u64);
                let w = sparse_values(m * n, n, 0.0, 3);
                let (mut za, mut zb) = (NonZero::default(), NonZero::default());
                za.record(&a, m, k);
                zb.record(&b, k, n);
                let (lhs, rhs) = (Mat::rows(&a, k), Mat::rows(&b, n));
                for (split_columns, accumulate, addend) in [
                    (false, false, None),
                    (true, false, None),
                    (false, true, None),
                    (false, false, Some((&w[..], 0.25f32))),
                ] {
                    let opts = Options {
                        accumulate,
                        split_columns,
                        addend,
                        zeros: Zeros::Unknown,
                    };
                    let mut dense = w.clone();
                    product(m, n, k, &mut dense, lhs, rhs, opts);
                    for zeros in [Zeros::Lhs(&za), Zeros::Rhs(&zb)] {
                        let mut skipping = w.clone();
                        product(m, n, k, &mut skipping, lhs, rhs, Options { zeros, ..opts });
                        let same = dense
                            .iter()
                            .zip(&skipping)
                            .all(|(x, y)| x.to_bits() == y.to_bits());
                        assert!(
                            same,
                            "{m}x{n}x{k}, zeros {zero_frac}, {split_columns} {accumulate}"
                        );
                    }
                }
                if zero_frac == 1.0 {
                    assert_eq!(za.density(), 0.0);
                }
            }
        }
    }

    #[test]
    fn update_in_the_epilogue_is_bit_identical_to_product_then_fused_step() {
        // The weight gradient's layout (lhs = Δᵀ from a row-major Δ, rhs row-major with
        // zeros), shapes of 784-400-400-10 and ragged ones, one and several k blocks; SGLD
        // and the momentum update with Euler and splitting constants.
        use crate::kernels::{cpu, InlineUpdate, StepConsts, Update};
        use crate::rng::NoiseKey;
        if !updates_inline(4) {
            return; // no AVX-512 here: the step takes the separate pass (tested elsewhere)
        }
        for (m, n, k) in [(400, 784, 100), (10, 400, 100), (37, 68, 129), (9, 12, 300)] {
            let delta = sparse_values(k * m, m, 0.0, 21 + m as u64); // k × m
            let x = sparse_values(k * n, n, 0.7, 22 + n as u64);
            let theta0 = sparse_values(m * n, n, 0.0, 23);
            let v0 = sparse_values(m * n, n, 0.0, 24);
            let mut zx = NonZero::default();
            zx.record(&x, k, n);
            let (lhs, rhs) = (Mat::transposed(&delta, m), Mat::rows(&x, n));
            let key = NoiseKey {
                seed: 7,
                step: 3,
                param: 2,
            };
            for (update, consts) in [
                (Update::Sgld, StepConsts::new(1e-3, 0.0, 0.05)),
                (Update::Momentum, StepConsts::new(1e-3, 0.1, 0.02)),
                (Update::Momentum, StepConsts::splitting(1e-3, 0.1, 0.02)),
            ] {
                let lambda = 0.3f32;
                // Reference: the gradient stored, then the fused pass.
                let mut grad = vec![0f32; m * n];
                let opts = Options {
                    addend: Some((&theta0, lambda)),
                    zeros: Zeros::Rhs(&zx),
                    ..Options::default()
                };
                product(m, n, k, &mut grad, lhs, rhs, opts);
                let (mut theta_ref, mut v_ref) = (theta0.clone(), v0.clone());
                let v_ref_slice: &mut [f32] = if update == Update::Sgld {
                    &mut []
                } else {
                    &mut v_ref
                };
                let sum_ref = cpu::step(update, &mut theta_ref, v_ref_slice, &grad, key, consts);
                // In the epilogue.
                let (mut theta, mut v) = (theta0.clone(), v0.clone());
                let mut scratch = vec![0f32; m * n];
                let mut rows = Vec::new();
                let momentum: &mut [f32] = if update == Update::Sgld {
                    &mut []
                } else {
                    &mut v
                };
                let step = InlineUpdate {
                    update,
                    consts,
                    key,
                    momentum,
                };
                let sum = product_then_update(
                    m,
                    n,
                    k,
                    &mut scratch,
                    lhs,
                    rhs,
                    Zeros::Rhs(&zx),
                    &mut theta,
                    lambda,
                    step,
                    &mut rows,
                );
                let same =
                    |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(p, q)| p.to_bits() == q.to_bits());
                assert!(same(&theta, &theta_ref), "θ {m}x{n}x{k} {update:?}");
                if update == Update::Sgld {
                    assert!(same(&v, &v0) && sum == 0.0);
                } else {
                    assert!(same(&v, &v_ref), "v {m}x{n}x{k} {update:?}");
                    // Σv² in another order: f64 sums of m·n f32 squares agree to ~1e-15.
                    assert!(
                        (sum - sum_ref).abs() <= 1e-12 * sum_ref,
                        "{sum} vs {sum_ref}"
                    );
                }
            }
        }
    }

    #[test]
    fn skipped_terms_are_never_computed() {
        // An infinite operand facing a zero: the dense product computes 0·∞ = NaN, a
        // product that skips the zero does not (where the kernel skips zeros at all).
        if !skips_zeros() {
            return;
        }
        let (m, n, k) = (9, 20, 150);
        let mut a = vec![0.5f32; m * k];
        let mut b = vec![0.25f32; k * n];
        for i in 0..m {
            a[i * k + 140] = 0.0; // column 140 of lhs is zero in every row
        }
        b[140 * n..141 * n].fill(f32::INFINITY);
        b[3 * n + 7] = f32::NAN;
        let mut z = NonZero::default();
        z.record(&a, m, k);
        let (lhs, rhs) = (Mat::rows(&a, k), Mat::rows(&b, n));
        let mut c = vec![0f32; m * n];
        product(m, n, k, &mut c, lhs, rhs, Options::default());
        assert!(c.iter().all(|v| v.is_nan()));
        let zeros = Zeros::Lhs(&z);
        product(
            m,
            n,
            k,
            &mut c,
            lhs,
            rhs,
            Options {
                zeros,
                ..Options::default()
            },
        );
        for (j, v) in c.iter().enumerate() {
            // Column 7 meets the NaN at k = 3, where lhs is not zero.
            assert_eq!(v.is_nan(), j % n == 7, "element {j}: {v}");
        }
    }

    #[test]
    fn nonzero_map_marks_exactly_the_nonzero_entries() {
        let (rows, cols) = (3, 130);
        let mut data = vec![0f32; rows * cols];
        for &(r, c) in &[(0, 0), (0, 63), (0, 64), (1, 129), (2, 70)] {
            data[r * cols + c] = 1.0;
        }
        data[2 * cols + 5] = f32::NAN;
        data[cols + 3] = -0.0;
        let mut z = NonZero::default();
        z.record(&data, rows, cols);
        for r in 0..rows {
            for c in 0..cols {
                let v = data[r * cols + c];
                assert_eq!(z.any(r, c, c + 1), v != 0.0 || v.is_nan(), "({r}, {c})");
            }
        }
        assert!(z.any(0, 1, 64) && !z.any(0, 1, 63) && z.any(2, 6, 130) && !z.any(1, 0, 129));
        assert!((z.density() - 6.0 / 390.0).abs() < 1e-12);
    }

    #[test]
    fn kernel_and_fallback_equal_a_naive_product() {
        // Ragged sizes hit every edge tile; large ones take the two-thread split. The "nn"
        // layout (rhs row-major) is read in place, the "nt" one (rhs the transpose of a
        // row-major matrix) is packed panel by panel; both on the AVX-512 kernel where the
        // CPU has it, on the `gemm` crate otherwise.
        for (m, n, k) in [
            (1, 1, 1),
            (5, 7, 3),
            (13, 50, 17),
            (100, 100, 784),
            (37, 300, 129),
        ] {
            let a: Vec<f32> = (0..m * k)
                .map(|i| ((i * 37) % 101) as f32 / 101.0 - 0.5)
                .collect();
            let b: Vec<f32> = (0..k * n)
                .map(|i| ((i * 53) % 97) as f32 / 97.0 - 0.5)
                .collect();
            let mut bt = vec![0f32; k * n];
            transpose_scalar(&b, k, n, &mut bt);
            let mut want = vec![0f64; m * n];
            for i in 0..m {
                for j in 0..n {
                    want[i * n + j] = (0..k)
                        .map(|p| a[i * k + p] as f64 * b[p * n + j] as f64)
                        .sum();
                }
            }
            for (label, rhs) in [("nn", Mat::rows(&b, n)), ("nt", Mat::transposed(&bt, k))] {
                for accumulate in [false, true] {
                    let mut c = vec![1f32; m * n];
                    matmul(m, n, k, &mut c, accumulate, Mat::rows(&a, k), rhs);
                    let base = if accumulate { 1.0 } else { 0.0 };
                    for (x, w) in c.iter().zip(&want) {
                        // f32 sums of ≤ 784 terms of size ≤ 0.25: error ≲ 1e-4.
                        assert!(
                            (*x as f64 - base - w).abs() < 1e-3,
                            "{label} {m}x{n}x{k}: {x} vs {w}"
                        );
                    }
                }
            }
        }
    }
}
