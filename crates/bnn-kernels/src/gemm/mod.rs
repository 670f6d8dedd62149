//! Single-precision matrix products for the hand-written forward and backward passes:
//! one blocked kernel (`nn`) on three paths — AVX-512, AVX2+FMA and portable Rust
//! (`simd`) — picked by [`crate::isa`], all on the project's thread pool.
//!
//! Why our own: the `gemm` crate (candle's CPU matmul) packs both operands, which at
//! batch 100 costs as much as the arithmetic, runs its AVX-512 kernels only on nightly,
//! and threads with rayon beside our pool. One kernel takes the three products of an MLP
//! step, C = A·B: a tile of R rows × V vectors keeps its sums in registers, loads V
//! vectors of B and broadcasts R scalars of A (any strides) per step of k. B is either
//! row-major along n (the weight gradient Δᵀ·X, the input error Δ·W), read in place, or
//! the transpose of a row-major matrix (the forward X·Wᵀ), packed one (128 × tile) panel
//! at a time by register transposes into a per-thread buffer that stays in L1 while the
//! row tiles run (this replaced transposing all of W every step: −110 µs per forward of
//! 784-400-400-10 at batch 100). (A dot-product kernel for A·Bᵀ was tried first and ran at
//! half the speed.)
//!
//! Every element is summed over k in the same order on every path (blocks of 128, in
//! order, one fused multiply-add per term), so avx512 and avx2 give the same bits; the
//! portable path does too where the target has FMA ([`simd::PORTABLE_FUSED`]). Edges are
//! handled with masked loads and stores, never by reading or writing outside the
//! operands. Two threads split the output (rows or columns) above [`PARALLEL_MIN_MACS`]
//! multiply-adds.

mod nn;
mod peak;
mod simd;
mod sparse;
#[cfg(test)]
mod tests;

pub use peak::{peak, Peak};
pub use simd::PORTABLE_FUSED;

use super::isa::{self, Isa};
use simd::Simd;

/// Multiply-adds per thread below which a product is not split further: on 2 cores the
/// fork-join of a second thread costs more than it saves for smaller products. At 10⁶
/// the last layer of 784-400-400-10 (three products of 4·10⁵) ran on one thread while
/// the other waited: 69 µs of its batch-100 step, 45 µs split (timed per parallel region
/// with a throwaway probe).
pub const PARALLEL_MIN_MACS: usize = 200_000;

/// A matrix operand: element (i, j) at `data[i·rs + j·cs]`.
#[derive(Clone, Copy)]
pub struct Mat<'a> {
    /// The elements.
    pub data: &'a [f32],
    /// Row stride (elements between rows).
    pub rs: usize,
    /// Column stride (elements between columns).
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
    /// Row stride of dst when it is not n: the product fills m rows of n columns inside a
    /// wider matrix (a convolution's output over a chunk of the minibatch's images). Not
    /// with an addend.
    pub dst_stride: Option<usize>,
}

/// Which operand of a product has a [`NonZero`] map.
#[derive(Clone, Copy, Default)]
pub enum Zeros<'a> {
    /// Not known: every k is taken.
    #[default]
    Unknown,
    /// Of lhs (m × k): each row of dst runs only over the k where its row of lhs is not
    /// zero (`sparse`, where lhs is contiguous along k; otherwise a tile of rows over the
    /// k where one of its rows is not zero).
    Lhs(&'a NonZero),
    /// Of rhs (k × n): each column of dst runs only over the k where its column of rhs is
    /// not zero (`sparse`, through the transpose, where lhs is contiguous along m;
    /// otherwise a tile of columns over the k where one of its columns is not zero).
    Rhs(&'a NonZero),
}

/// Which entries of a row-major matrix are not zero, one bit per entry (rows padded to
/// whole 64-bit words).
///
/// Why: MNIST's pixels are 81% zeros (an image has a non-zero pixel in 19% of the 784
/// positions, a tile of 6 images in 44%); the first layer's forward product and weight
/// gradient skip those multiply-adds. A skipped term is an exact zero (x·w = ±0, and
/// s ± 0 = s), so the result is bit-identical to the dense product for finite operands.
#[derive(Debug, Default, Clone, PartialEq)]
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
        let Some(words) = self.reset(data.len(), rows, cols) else {
            return;
        };
        let isa = isa::current();
        // Large maps on two threads, each its own rows.
        crate::pool::halves(&mut self.bits, words, rows * cols, |part, at| {
            let first = at / words;
            for (r, out) in part.chunks_exact_mut(words).enumerate() {
                let row = &data[(first + r) * cols..(first + r + 1) * cols];
                nonzero_words(isa, row, out);
            }
        });
    }

    /// Writes the rows of `data` (rows × cols, row-major) by `fill(r, row)`, on two threads
    /// when large (as [`crate::pool::halves`] cuts them), and records each row's non-zero
    /// entries while the row is in L1: what [`NonZero::record`] gives afterwards, without
    /// its second pass over `data` (3 MB per batch-1000 MNIST minibatch).
    pub fn fill_and_record(
        &mut self,
        data: &mut [f32],
        rows: usize,
        cols: usize,
        fill: impl Fn(usize, &mut [f32]) + Sync,
    ) {
        let Some(words) = self.reset(data.len(), rows, cols) else {
            return;
        };
        let isa = isa::current();
        let bits = crate::pool::Disjoint::new(&mut self.bits);
        crate::pool::halves(&mut data[..rows * cols], cols, rows * cols, |part, at| {
            let first = at / cols;
            for (r, row) in (first..).zip(part.chunks_exact_mut(cols)) {
                fill(r, row);
                // SAFETY: row r's words, inside the bits sized above; each row belongs to
                // one part of the job.
                let out = unsafe { bits.slice(r * words, (r + 1) * words) };
                nonzero_words(isa, row, out);
            }
        });
    }

    /// Clears the map to rows × cols (for data of `len` floats); its words per row, or
    /// none where a row has no columns.
    fn reset(&mut self, len: usize, rows: usize, cols: usize) -> Option<usize> {
        assert!(len >= rows * cols, "NonZero: data too small");
        let words = cols.div_ceil(64);
        (self.words, self.rows, self.cols) = (words, rows, cols);
        self.bits.clear();
        self.bits.resize(rows * words, 0);
        (cols > 0).then_some(words)
    }

    /// (rows, columns) of the last map recorded.
    pub fn shape(&self) -> (usize, usize) {
        (self.rows, self.cols)
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

/// Bit i of `words[i / 64]` set where `row[i]` is not zero (or NaN), on path `isa`.
fn nonzero_words(isa: Isa, row: &[f32], words: &mut [u64]) {
    // SAFETY: each path runs only where the CPU has it (isa::current caps at Isa::best).
    unsafe {
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => simd::Avx512::nonzero_words(row, words),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => simd::Avx2::nonzero_words(row, words),
            _ => simd::Portable::nonzero_words(row, words),
        }
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
    let ldc = opts.dst_stride.unwrap_or(n);
    assert!(ldc >= n, "matmul: dst rows overlap");
    check_operands(m, n, k, Mat::rows(dst, ldc), lhs, rhs, opts.zeros);
    assert!(
        ldc == n || opts.addend.is_none(),
        "matmul: an addend with a dst stride"
    );
    if let Some((w, _)) = opts.addend {
        assert!(w.len() >= m * n, "matmul: addend too small");
    }
    if m == 0 || n == 0 {
        return;
    }
    let mut opts = opts;
    if let (Some((w, scale)), true) = (opts.addend, opts.accumulate) {
        // The kernel adds the addend only to fresh sums: dst += scale·w first, then the
        // product accumulated onto it (the same roundings as a separate addend pass).
        dst[..m * n]
            .iter_mut()
            .zip(&w[..m * n])
            .for_each(|(d, &w)| *d += scale * w);
        opts.addend = None;
    }
    if k == 0 {
        if ldc != n {
            if !opts.accumulate {
                dst.chunks_mut(ldc)
                    .take(m)
                    .for_each(|row| row[..n].fill(0.0));
            }
            return;
        }
        match opts.addend {
            Some((w, scale)) => dst[..m * n]
                .iter_mut()
                .zip(&w[..m * n])
                .for_each(|(d, &w)| *d = scale * w),
            None if !opts.accumulate => dst[..m * n].fill(0.0),
            None => {}
        }
        return;
    }
    if rhs.cs != 1 && rhs.rs != 1 {
        // A general-strided rhs (no caller has one): a row-major copy first.
        let mut copy = vec![0f32; k * n];
        for (p, row) in copy.chunks_exact_mut(n).enumerate() {
            for (j, x) in row.iter_mut().enumerate() {
                *x = rhs.data[p * rhs.rs + j * rhs.cs];
            }
        }
        return product(m, n, k, dst, lhs, Mat::rows(&copy, n), opts);
    }
    // SAFETY: extents checked above; rhs contiguous along n or k.
    unsafe { product_on_current_path(m, n, k, dst, lhs, rhs, opts, None) }
}

/// [`nn::product`] on the path of this thread ([`isa::current`]).
///
/// # Safety
/// As [`nn::product`], but for the CPU features: each path runs only where the CPU has it
/// (`isa::current` caps at `Isa::best`).
#[allow(clippy::too_many_arguments)]
unsafe fn product_on_current_path(
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [f32],
    lhs: Mat<'_>,
    rhs: Mat<'_>,
    opts: Options<'_>,
    fuse: Option<&nn::Fuse>,
) {
    let threads = threads_for(m, n, k);
    let _timing = crate::census::start(|| {
        let census_threads = if crate::pool::free() { threads } else { 1 };
        let shape = census_shape(m, n, k, lhs, rhs, &opts, fuse.is_some());
        (shape, census_threads)
    });
    unsafe {
        match isa::current() {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => nn::product::<simd::Avx512>(m, n, k, dst, lhs, rhs, threads, opts, fuse),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => nn::product::<simd::Avx2>(m, n, k, dst, lhs, rhs, threads, opts, fuse),
            _ => nn::product::<simd::Portable>(m, n, k, dst, lhs, rhs, threads, opts, fuse),
        }
    }
}

/// The census entry of a product.
fn census_shape(
    m: usize,
    n: usize,
    k: usize,
    lhs: Mat<'_>,
    rhs: Mat<'_>,
    opts: &Options<'_>,
    fused: bool,
) -> crate::census::Shape {
    crate::census::Shape {
        kernel: if fused {
            crate::census::Kernel::ProductThenUpdate
        } else {
            crate::census::Kernel::Product
        },
        m,
        n,
        k,
        lhs: crate::census::Layout::of(lhs.rs, lhs.cs),
        rhs: crate::census::Layout::of(rhs.rs, rhs.cs),
        skips_zeros: !matches!(opts.zeros, Zeros::Unknown),
    }
}

/// dst (cols × rows, row-major, rows `ld` apart) ← the transpose of src (rows × cols,
/// rows `src_stride` apart), by register transposes on the current path.
///
/// # Panics
/// On operands too small for the extents.
pub fn transpose(
    rows: usize,
    cols: usize,
    src: &[f32],
    src_stride: usize,
    dst: &mut [f32],
    ld: usize,
) {
    assert!(
        src.len() >= Mat::rows(src, src_stride).extent(rows, cols)
            && dst.len() >= Mat::rows(dst, ld).extent(cols, rows)
            && src_stride >= cols
            && ld >= rows,
        "transpose: operands too small"
    );
    if rows == 0 || cols == 0 {
        return;
    }
    let (s, d) = (src.as_ptr(), dst.as_mut_ptr());
    // SAFETY: rows × cols of src and cols × rows of dst inside the slices (checked above);
    // the path's features are present (isa::current caps at what the CPU has).
    unsafe {
        match isa::current() {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => simd::Avx512::transpose(s, src_stride, (0, rows), 0, cols, d, ld),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => simd::Avx2::transpose(s, src_stride, (0, rows), 0, cols, d, ld),
            _ => simd::Portable::transpose(s, src_stride, (0, rows), 0, cols, d, ld),
        }
    }
}

/// Whether [`product_then_update`] can take a product of `n` columns: rows of whole
/// Philox blocks of 4 elements (every path has the fused epilogue).
pub fn updates_inline(n: usize) -> bool {
    n.is_multiple_of(4)
}

/// ∇ = lhs (m × k) · rhs (k × n) + `prior_scale`·θ, the gradient of θ (m × n, row-major),
/// and at once θ (and v) updated from it by `step`, element by element as the product
/// stores its sums: ∇ itself is not stored (`scratch`, m × n, holds the partial sums
/// when k spans several blocks). θ and v end up bit-identical to [`product`] with the
/// addend (θ, `prior_scale`) followed by the fused update of [`super::cpu::step`].
/// Returns Σv² after the update (0 for SGLD) and Σθ·∇ before it, summed per row in a
/// fixed order (see `nn::update_body`) — the same on every path and thread count, though
/// not in the fused pass's chunk order. `row_sums` is scratch.
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
) -> super::TensorSums {
    assert!(
        updates_inline(n),
        "product_then_update: rows must be whole Philox blocks"
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
    check_operands(m, n, k, Mat::rows(scratch, n), lhs, rhs, zeros);
    assert!(
        rhs.cs == 1 || rhs.rs == 1,
        "product_then_update: rhs must be contiguous along n or k"
    );
    row_sums.clear();
    row_sums.resize(2 * m, 0.0);
    if m == 0 || n == 0 {
        return super::TensorSums::default();
    }
    let fuse = nn::Fuse {
        theta: theta.as_mut_ptr(),
        momentum: step.momentum.as_mut_ptr(),
        row_sums: row_sums.as_mut_ptr(),
        update: step.update,
        consts: step.consts,
        key: step.key,
        prior_scale,
    };
    let opts = Options {
        zeros,
        ..Options::default()
    };
    // SAFETY: extents checked above, θ and v are m·n long and borrowed uniquely for the
    // call, n is a multiple of 4, rhs contiguous along n or k.
    unsafe { product_on_current_path(m, n, k, scratch, lhs, rhs, opts, Some(&fuse)) };
    let (squares, virials) = row_sums
        .chunks_exact(2)
        .fold((0.0, 0.0), |(s, v), r| (s + r[0], v + r[1]));
    super::TensorSums {
        sum_sq: squares,
        sum_thermostat: 0.0,
        virial: virials,
    }
}

/// The hard checks of [`product`] and [`product_then_update`]: everything after them
/// reads and writes through raw pointers.
fn check_operands(
    m: usize,
    n: usize,
    k: usize,
    dst: Mat<'_>,
    lhs: Mat<'_>,
    rhs: Mat<'_>,
    zeros: Zeros<'_>,
) {
    assert!(
        dst.data.len() >= dst.extent(m, n),
        "matmul: destination too small"
    );
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
    crate::pool::threads().min((m * n * k / PARALLEL_MIN_MACS).max(1))
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
    crate::pool::run(parts, &|p| {
        let (a, b) = ((p * per).min(len), ((p + 1) * per).min(len));
        if a < b {
            part(a, b)
        }
    });
}

/// The size of tile `t` when `len` is cut into the fewest tiles of at most `max`, as
/// equal as possible (a 50-row block becomes 8,7,7,7,7,7,7 rather than 8,…,8,2: a thin
/// last tile does few FMAs per load). Larger tiles come first.
fn balanced(len: usize, max: usize) -> impl Iterator<Item = usize> {
    let tiles = len.div_ceil(max).max(1);
    let (base, extra) = (len / tiles, len % tiles);
    (0..tiles)
        .map(move |t| base + usize::from(t < extra))
        .filter(|&h| h > 0)
}

/// GFLOP/s of [`matmul`] (on the current path) and of the `gemm` crate (candle's CPU
/// matmul, on its own rayon threads) on one product A·B (m × k times k × n, each operand
/// row-major or the transpose of a row-major matrix, as `lhs` and `rhs` say; the forward
/// reads W as Bᵀ), median of `repeats` (for `bnn bench gemm`).
pub fn bench(
    m: usize,
    n: usize,
    k: usize,
    lhs: crate::census::Layout,
    rhs: crate::census::Layout,
    repeats: usize,
) -> (f64, f64) {
    use crate::census::Layout;
    let a: Vec<f32> = (0..m * k)
        .map(|i| ((i * 7919) % 1000) as f32 * 1e-3)
        .collect();
    let b: Vec<f32> = (0..k * n)
        .map(|i| ((i * 104_729) % 1000) as f32 * 1e-3)
        .collect();
    let mut c = vec![0f32; m * n];
    let rhs = match rhs {
        Layout::Transposed => Mat::transposed(&b, k),
        Layout::Rows | Layout::Strided => Mat::rows(&b, n),
    };
    let lhs = match lhs {
        Layout::Transposed => Mat::transposed(&a, m),
        Layout::Rows | Layout::Strided => Mat::rows(&a, k),
    };
    let threads = threads_for(m, n, k);
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
    let crate_gemm = time(&mut |c| crate_gemm(m, n, k, c, lhs, rhs, threads));
    (ours, crate_gemm)
}

/// The `gemm` crate's product, for [`bench`] only.
fn crate_gemm(
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [f32],
    lhs: Mat<'_>,
    rhs: Mat<'_>,
    threads: usize,
) {
    let parallelism = if threads > 1 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    assert!(
        dst.len() >= m * n
            && lhs.data.len() >= lhs.extent(m, k)
            && rhs.data.len() >= rhs.extent(k, n)
    );
    // SAFETY: the extents of all three operands are checked against their slices just
    // above; dst is a unique borrow, so it aliases neither source.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            false,
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
