//! Products where one operand's zeros are known, each row of the output over its own
//! non-zero k: the first layer's forward X·Wᵀ ([`product`], zeros of A, a row of X read
//! in place) and its weight gradient Δᵀ·X ([`product_by_columns`], zeros of B, computed
//! as Xᵀ·Δ so that each pixel runs over the images where it is not zero).
//!
//! Why a kernel of its own: the tiles of [`super::nn`] share one list of k among their R
//! rows, so they run over the union of R images' pixels (44% of them for 6 images,
//! against 19% for one) and pack A along that list. Here a tile is one row of C × V
//! vectors, and the row runs over its own non-zero k only: about 2.3× fewer
//! multiply-adds, each with its own load of B (a k block's (KC × V vectors) panel of B
//! stays in L1 while the rows run).
//!
//! The order of summation is the one of `nn` (each element sums the k of a KC block in
//! order from zero, one fused multiply-add per term; blocks added in order; a skipped
//! term is an exact zero), so the bits are those of the dense product.

use super::nn::{Fuse, KC};
use super::simd::Simd;
use super::{balanced, split, Mat, NonZero, Options};
use crate::pool::Disjoint;
use std::cell::RefCell;

/// One k block of a run of rows over one column tile: row `r` of C (at `c + r·ldc`) sums
/// `a[r·lda + p·a_k]·b[p·ldb + ·]` over the p in `lists[starts[r]..starts[r + 1]]`.
#[derive(Clone, Copy)]
pub(super) struct Rows<'a> {
    pub rows: usize,
    pub lists: &'a [u32],
    pub starts: &'a [usize],
    pub a: *const f32,
    pub lda: usize,
    pub a_k: usize,
    pub b: *const f32,
    pub ldb: usize,
    pub c: *mut f32,
    pub ldc: usize,
    pub cols: usize,
    pub store: RowStore,
}

/// What a row does with its sums (the stores of `nn::Store` a forward product uses).
#[derive(Clone, Copy)]
pub(super) enum RowStore {
    Overwrite,
    Accumulate,
    /// C ← sums + scale·w, w laid out like C (row stride `ldc`), at the tile's first element.
    AddScaled(*const f32, f32),
}

/// The rows of one (k block, column tile) of V vectors (`FULL`: no column outside C),
/// two rows at a time: the two rows' terms are interleaved so that each step of the k
/// loop has 2·V independent multiply-add chains instead of V (one row's chain of V
/// sums waits on the multiply-add's latency after every listed k). Each row still sums
/// its own list in order, so the bits are those of one row at a time.
///
/// # Safety
/// The path's features present (inlined into its entry); every (row, listed p, column)
/// inside the operands checked by `product`.
#[inline(always)]
pub(super) unsafe fn rows_body<S: Simd, const V: usize, const FULL: bool>(t: &Rows<'_>) {
    unsafe {
        let mut masks = [S::mask(0); V];
        for (v, m) in masks.iter_mut().enumerate() {
            *m = S::mask(t.cols.saturating_sub(S::LANES * v));
        }
        let list = |r: usize| &t.lists[t.starts[r]..t.starts[r + 1]];
        let mut r = 0;
        while r + 2 <= t.rows {
            let (a0, a1) = (t.a.add(r * t.lda), t.a.add((r + 1) * t.lda));
            let (l0, l1) = (list(r), list(r + 1));
            let (mut acc0, mut acc1) = ([S::zero(); V], [S::zero(); V]);
            for (&p0, &p1) in l0.iter().zip(l1) {
                row_term::<S, V, FULL>(t, &masks, &mut acc0, a0, p0);
                row_term::<S, V, FULL>(t, &masks, &mut acc1, a1, p1);
            }
            let both = l0.len().min(l1.len());
            for &p in &l0[both..] {
                row_term::<S, V, FULL>(t, &masks, &mut acc0, a0, p);
            }
            for &p in &l1[both..] {
                row_term::<S, V, FULL>(t, &masks, &mut acc1, a1, p);
            }
            row_store::<S, V, FULL>(t, &masks, &acc0, r);
            row_store::<S, V, FULL>(t, &masks, &acc1, r + 1);
            r += 2;
        }
        if r < t.rows {
            let a = t.a.add(r * t.lda);
            let mut acc = [S::zero(); V];
            for &p in list(r) {
                row_term::<S, V, FULL>(t, &masks, &mut acc, a, p);
            }
            row_store::<S, V, FULL>(t, &masks, &acc, r);
        }
    }
}

/// acc += a[p]·B[p, tile]: one listed term of a row (`a` the row's first scalar).
///
/// # Safety
/// As [`rows_body`].
#[inline(always)]
unsafe fn row_term<S: Simd, const V: usize, const FULL: bool>(
    t: &Rows<'_>,
    masks: &[S::M; V],
    acc: &mut [S::V; V],
    a: *const f32,
    p: u32,
) {
    unsafe {
        let x = S::splat(*a.add(p as usize * t.a_k));
        let bp = t.b.add(p as usize * t.ldb);
        for v in 0..V {
            // Only a tile's last vector can reach past C's last column.
            let full = FULL || v + 1 < V;
            let b = S::load_part(full, masks[v], bp.wrapping_add(S::LANES * v));
            acc[v] = S::fmadd(x, b, acc[v]);
        }
    }
}

/// Row `r`'s sums into C, as `t.store` says.
///
/// # Safety
/// As [`rows_body`].
#[inline(always)]
unsafe fn row_store<S: Simd, const V: usize, const FULL: bool>(
    t: &Rows<'_>,
    masks: &[S::M; V],
    acc: &[S::V; V],
    r: usize,
) {
    unsafe {
        let out = t.c.add(r * t.ldc);
        for (v, &val) in acc.iter().enumerate() {
            let o = out.wrapping_add(S::LANES * v);
            let val = match t.store {
                RowStore::Overwrite => val,
                RowStore::Accumulate => S::add(val, S::load_part(FULL, masks[v], o)),
                RowStore::AddScaled(w, scale) => {
                    let w = w.wrapping_add(r * t.ldc + S::LANES * v);
                    let w = S::load_part(FULL, masks[v], w);
                    S::add(val, S::mul(S::splat(scale), w))
                }
            };
            S::store_part(FULL, masks[v], o, val)
        }
    }
}

// SAFETY: AddScaled's pointer is a read-only view of an addend that outlives the product,
// shared by its threads as `nn`'s tiles share theirs.
unsafe impl Send for RowStore {}
unsafe impl Sync for RowStore {}

/// Per-thread buffers, reused across calls.
#[derive(Default)]
struct Scratch {
    panel: Vec<f32>,
    lists: Vec<u32>,
    starts: Vec<usize>,
    /// The k block's map transposed ([`Lists::OfColumns`]): KC / 64 words per row of A.
    words: Vec<u64>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
    /// Cᵀ of [`product_by_columns`], on the calling thread.
    static TRANSPOSED: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Where the rows' non-zero k come from.
#[derive(Clone, Copy)]
enum Lists<'a> {
    /// A's own map (m × k).
    OfRows(&'a NonZero),
    /// The map of Aᵀ (k × m): row r of A is column r of it.
    OfColumns(&'a NonZero),
}

impl Lists<'_> {
    /// Each row's non-zero k in `p0..p0 + kc`, relative to p0, rows r0..r1 one after the
    /// other (`starts`, r1 − r0 + 1 entries).
    fn build(
        self,
        (r0, r1): (usize, usize),
        (p0, kc): (usize, usize),
        lists: &mut Vec<u32>,
        starts: &mut Vec<usize>,
        words: &mut Vec<u64>,
    ) {
        lists.resize((r1 - r0) * KC, 0);
        starts.clear();
        starts.push(0);
        let mut len = 0;
        match self {
            Lists::OfRows(z) => {
                for i in r0..r1 {
                    let row = z.row(i);
                    len += super::nn::block_ks(kc, &mut lists[len..], |word| row[p0 / 64 + word]);
                    starts.push(len);
                }
            }
            Lists::OfColumns(z) => {
                // The block's map transposed, 64 × 64 bits at a time, so that a row of A
                // (a column of the map) is its own words and lists as `OfRows` does: a
                // counting sort of the block's bits by column cost as much as the
                // multiply-adds in a batch-1000 weight gradient (12% of its step).
                const W: usize = KC / 64;
                words.clear();
                words.resize((r1 - r0) * W, 0);
                let mut block = [0u64; 64];
                for w in 0..kc.div_ceil(64) {
                    let images = (kc - 64 * w).min(64);
                    for v in r0 / 64..r1.div_ceil(64) {
                        for (q, word) in block.iter_mut().enumerate() {
                            *word = if q < images {
                                z.row(p0 + 64 * w + q)[v]
                            } else {
                                0
                            };
                        }
                        transpose_bits(&mut block);
                        for r in (64 * v).max(r0)..(64 * v + 64).min(r1) {
                            words[(r - r0) * W + w] = block[r - 64 * v];
                        }
                    }
                }
                for row in words.chunks_exact(W) {
                    len += super::nn::block_ks(kc, &mut lists[len..], |word| row[word]);
                    starts.push(len);
                }
            }
        }
    }
}

/// Transposes a 64 × 64 bit matrix in place (bit c of `m[r]` is entry (r, c)): swaps the
/// off-diagonal halves of blocks of 32, 16, …, 1 (Hacker's Delight, 7-3).
fn transpose_bits(m: &mut [u64; 64]) {
    let (mut j, mut mask) = (32, 0x0000_0000_FFFF_FFFFu64);
    while j != 0 {
        let mut k = 0;
        while k < 64 {
            let t = ((m[k] >> j) ^ m[k + j]) & mask;
            m[k + j] ^= t;
            m[k] ^= t << j;
            k = (k + j + 1) & !j;
        }
        j >>= 1;
        mask ^= mask << j;
    }
}

/// C (m × n) = A·B (+ C, or + scale·addend) as `opts` says, every row of A over its own
/// non-zero k (`z`, A's map). Threads split the rows, or the columns where
/// `opts.split_columns`.
///
/// # Safety
/// The path's features present; operand extents checked by the caller; A contiguous
/// along k (`lhs.cs == 1`); rhs contiguous along n or k.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn product<S: Simd>(
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [f32],
    lhs: Mat<'_>,
    rhs: Mat<'_>,
    z: &NonZero,
    threads: usize,
    opts: Options<'_>,
) {
    unsafe {
        let ldc = opts.dst_stride.unwrap_or(n);
        let first = match opts.addend {
            _ if opts.accumulate => RowStore::Accumulate,
            Some((w, scale)) => RowStore::AddScaled(w.as_ptr(), scale),
            None => RowStore::Overwrite,
        };
        let c = Disjoint::new(dst);
        let go = |r0, r1, c0, c1| {
            rows::<S>(
                (n, k),
                (r0, r1, c0, c1),
                lhs,
                rhs,
                Lists::OfRows(z),
                &c,
                ldc,
                first,
            )
        };
        if opts.split_columns {
            split(n, threads, 16, |c0, c1| go(0, m, c0, c1));
        } else {
            split(m, threads, 1, |r0, r1| go(r0, r1, 0, n));
        }
    }
}

/// C = A·B as [`product`] where B's zeros are known (`z`, k × n): Cᵀ = Bᵀ·Aᵀ, each row of
/// Bᵀ (a pixel of the first layer's weight gradient Δᵀ·X) over its own non-zero k (the
/// images where it is not zero), into a transposed copy that is then transposed into C;
/// with `fuse`, θ (and v) are updated from it as `nn` would from its last k block.
///
/// # Safety
/// As [`product`], with A contiguous along m (`lhs.rs == 1`) instead; with `fuse`, n a
/// multiple of 4 and C not strided.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn product_by_columns<S: Simd>(
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [f32],
    lhs: Mat<'_>,
    rhs: Mat<'_>,
    z: &NonZero,
    threads: usize,
    opts: Options<'_>,
    fuse: Option<&Fuse>,
) {
    unsafe {
        let ldc = opts.dst_stride.unwrap_or(n);
        TRANSPOSED.with_borrow_mut(|t| {
            t.resize(n * m, 0.0);
            // Cᵀ starts as what the first k block adds its sums to, transposed: C itself
            // (accumulating), the addend (or θ), or nothing.
            let addend = fuse
                .map(|f| (f.theta as *const f32, f.prior_scale))
                .or(opts.addend.map(|(w, s)| (w.as_ptr(), s)));
            if opts.accumulate {
                transpose::<S>((m, n), (dst.as_ptr(), ldc), (t.as_mut_ptr(), m), threads);
            } else if let Some((w, _)) = addend {
                transpose::<S>((m, n), (w, n), (t.as_mut_ptr(), m), threads);
            }
            let ct = Disjoint::new(&mut t[..]);
            let first = match addend {
                _ if opts.accumulate => RowStore::Accumulate,
                // Cᵀ is its own addend: each element is read just before it is written.
                Some((_, scale)) => RowStore::AddScaled(ct.at(0), scale),
                None => RowStore::Overwrite,
            };
            let (a, b) = (
                Mat {
                    data: rhs.data,
                    rs: rhs.cs,
                    cs: rhs.rs,
                },
                Mat {
                    data: lhs.data,
                    rs: lhs.cs,
                    cs: lhs.rs,
                },
            );
            // Each thread its own columns of B (rows of Cᵀ), cut where the work is even.
            let cuts = column_cuts(z, (k, n), m.div_ceil(S::SPARSE_V * S::LANES), threads);
            crate::pool::run(cuts.len() - 1, &|part| {
                let (r0, r1) = (cuts[part], cuts[part + 1]);
                if r0 < r1 {
                    rows::<S>(
                        (m, k),
                        (r0, r1, 0, m),
                        a,
                        b,
                        Lists::OfColumns(z),
                        &ct,
                        m,
                        first,
                    )
                }
            });
            transpose::<S>((n, m), (t.as_ptr(), m), (dst.as_mut_ptr(), ldc), threads);
        });
        if let Some(f) = fuse {
            super::nn::update_from_dst::<S>(m, n, dst, f, threads);
        }
    }
}

/// Rows of the map sampled for [`column_cuts`]: about this many, evenly spaced.
const SAMPLED_ROWS: usize = 64;

/// Where to cut B's `n` columns (k × n map `z`) into `parts` ranges of about equal work
/// for [`product_by_columns`]: `parts + 1` ascending cuts from 0 to n (a part may be empty).
///
/// A column's work is its non-zero terms (counted on [`SAMPLED_ROWS`] evenly spaced rows
/// of the map, scaled to all k) and, for each k block and each of the `tiles` column tiles
/// of the output, the fixed cost of one row visit (its store and loop exit), taken as
/// [`VISIT_TERMS`] terms. Why not even halves: MNIST's ink is not even. On the first 1000
/// training images the lower 392 pixels hold 77,899 non-zero entries, the upper 70,521,
/// so an even cut left one thread 5% above the mean.
fn column_cuts(z: &NonZero, (k, n): (usize, usize), tiles: usize, parts: usize) -> Vec<usize> {
    let parts = parts.clamp(1, n.div_ceil(8).max(1));
    if parts == 1 {
        return vec![0, n];
    }
    let groups = n.div_ceil(8);
    let step = k.div_ceil(SAMPLED_ROWS).max(1);
    let mut counts = vec![0u64; groups];
    // Eight bytes of a word counted at once (each byte its own popcount, SWAR), summed in
    // byte lanes for up to 31 rows (31 · 8 < 256) before they are spilled.
    let mut lanes = vec![0u64; z.words];
    let spill = |lanes: &mut [u64], counts: &mut [u64]| {
        for (w, l) in lanes.iter_mut().enumerate() {
            for byte in 0..8 {
                if let Some(c) = counts.get_mut(8 * w + byte) {
                    *c += (*l >> (8 * byte)) & 0xff;
                }
            }
            *l = 0;
        }
    };
    for (i, r) in (0..k).step_by(step).enumerate() {
        for (l, &x) in lanes.iter_mut().zip(z.row(r)) {
            let x = x - ((x >> 1) & 0x5555_5555_5555_5555);
            let x = (x & 0x3333_3333_3333_3333) + ((x >> 2) & 0x3333_3333_3333_3333);
            *l += (x + (x >> 4)) & 0x0f0f_0f0f_0f0f_0f0f;
        }
        if i % 31 == 30 {
            spill(&mut lanes, &mut counts);
        }
    }
    spill(&mut lanes, &mut counts);
    // Each group's work, in place of its count.
    let visit = (k.div_ceil(KC) * tiles * VISIT_TERMS) as u64;
    for (g, c) in counts.iter_mut().enumerate() {
        *c = *c * step as u64 + visit * (n.min(8 * g + 8) - 8 * g) as u64;
    }
    let total: u64 = counts.iter().sum();
    let mut cuts = vec![0];
    let mut sum = 0;
    for (g, &w) in counts.iter().enumerate() {
        // Each share that falls inside group g: cut where it falls, the group's work taken
        // as even over its columns (a group of MNIST's is 2% of a half).
        while cuts.len() < parts {
            let share = total * cuts.len() as u64 / parts as u64;
            if sum + w < share {
                break;
            }
            let width = (n.min(8 * g + 8) - 8 * g) as u64;
            let at = 8 * g + ((share - sum) * width).div_ceil(w.max(1)) as usize;
            let last = *cuts.last().unwrap_or(&0);
            cuts.push(at.clamp(last, n));
        }
        sum += w;
    }
    cuts.resize(parts, n);
    cuts.push(n);
    cuts
}

/// The fixed cost of a row visit of [`rows_body`] in multiply-add terms (a store of the
/// row's V vectors and a mispredicted loop exit against a term's ~4 cycles).
const VISIT_TERMS: usize = 4;

/// dst (cols × rows, rows `ld` apart) ← the transpose of src (rows × cols, rows `stride`
/// apart), the rows split between threads.
///
/// # Safety
/// The path's features present; both extents inside their operands.
unsafe fn transpose<S: Simd>(
    (rows, cols): (usize, usize),
    (src, stride): (*const f32, usize),
    (dst, ld): (*mut f32, usize),
    threads: usize,
) {
    let (src, dst) = (src as usize, dst as usize);
    split(rows, threads, 8, |r0, r1| unsafe {
        let d = (dst as *mut f32).add(r0);
        S::transpose(src as *const f32, stride, (r0, r1), 0, cols, d, ld)
    });
}

/// Rows r0..r1, columns c0..c1 of C (n columns; k the length of the sums) on this
/// thread: k blocks, then column tiles (B's panel packed once for all the rows), then rows.
#[allow(clippy::too_many_arguments)]
unsafe fn rows<S: Simd>(
    (n, k): (usize, usize),
    (r0, r1, c0, c1): (usize, usize, usize, usize),
    lhs: Mat<'_>,
    rhs: Mat<'_>,
    lists_of: Lists<'_>,
    c: &Disjoint<f32>,
    ldc: usize,
    first: RowStore,
) {
    unsafe {
        let packed = rhs.cs != 1;
        SCRATCH.with_borrow_mut(|s| {
            let Scratch {
                panel,
                lists,
                starts,
                words,
            } = s;
            let tile_cols = S::SPARSE_V * S::LANES;
            if packed && panel.len() < KC * tile_cols {
                panel.resize(KC * tile_cols, 0.0);
            }
            for p0 in (0..k).step_by(KC) {
                let kc = KC.min(k - p0);
                lists_of.build((r0, r1), (p0, kc), lists, starts, words);
                let mut j = c0;
                // Tiles of whole vectors, balanced: 100 columns → 40, 32, 28, not 48, 48, 4.
                for vectors in balanced((c1 - c0).div_ceil(S::LANES), S::SPARSE_V) {
                    let cols = (S::LANES * vectors).min(c1 - j);
                    let (b, ldb) =
                        super::nn::b_block::<S>(rhs, (p0, kc), (j, cols), panel, tile_cols);
                    let store = match first {
                        _ if p0 > 0 => RowStore::Accumulate,
                        RowStore::AddScaled(w, s) => RowStore::AddScaled(w.add(r0 * n + j), s),
                        other => other,
                    };
                    let t = Rows {
                        rows: r1 - r0,
                        lists,
                        starts,
                        a: lhs.data.as_ptr().add(r0 * lhs.rs + p0 * lhs.cs),
                        lda: lhs.rs,
                        a_k: lhs.cs,
                        b,
                        ldb,
                        c: c.at(r0 * ldc + j),
                        ldc,
                        cols,
                        store,
                    };
                    S::sparse_rows(&t);
                    j += cols;
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{column_cuts, transpose_bits, KC, VISIT_TERMS};
    use crate::gemm::NonZero;

    #[test]
    fn column_cuts_even_out_the_work_of_uneven_columns() {
        // Columns 392.. three times as dense as the ones before (MNIST's halves differ by
        // 10%): even halves would give one part 60% of the terms.
        let (k, n, tiles) = (300, 784, 3);
        let dense = |r: usize, c: usize| {
            let h = (r * 7919 + c * 104_729) % 100;
            if c >= 392 {
                h < 60
            } else {
                h < 20
            }
        };
        let data: Vec<f32> = (0..k * n).map(|i| f32::from(dense(i / n, i % n))).collect();
        let mut z = NonZero::default();
        z.record(&data, k, n);
        let visit = k.div_ceil(KC) * tiles * VISIT_TERMS;
        let work = |c0: usize, c1: usize| -> usize {
            (c0..c1)
                .map(|c| visit + (0..k).filter(|&r| dense(r, c)).count())
                .sum()
        };
        for parts in [2, 3, 4] {
            let cuts = column_cuts(&z, (k, n), tiles, parts);
            assert_eq!(cuts.len(), parts + 1);
            assert_eq!((cuts[0], cuts[parts]), (0, n));
            assert!(cuts.windows(2).all(|w| w[0] < w[1]), "{cuts:?}");
            let mean = work(0, n) as f64 / parts as f64;
            // A cut is placed to a column from counts of groups of 8 (a dense column is
            // 0.5% of a half) and of every 5th row (≈ 1%). Even halves: off by 38%.
            for w in cuts.windows(2) {
                let share = work(w[0], w[1]) as f64 / mean;
                assert!(
                    (share - 1.0).abs() < 0.02,
                    "{parts} parts {cuts:?}: {share}"
                );
            }
        }
        // An empty map: the visits alone, even in columns; fewer groups than parts.
        z.record(&vec![0.0; 10 * 64], 10, 64);
        assert_eq!(column_cuts(&z, (10, 64), 1, 2), vec![0, 32, 64]);
        assert_eq!(column_cuts(&z, (10, 64), 1, 3), vec![0, 22, 43, 64]);
        z.record(&[1.0; 5], 1, 5);
        assert_eq!(column_cuts(&z, (1, 5), 1, 2), vec![0, 5]);
    }

    #[test]
    fn transpose_bits_moves_each_entry_to_its_mirror() {
        // A pattern with no symmetry: entry (r, c) set where (7r + 3c) mod 5 < 2 or r = 2c.
        let set = |r: usize, c: usize| (7 * r + 3 * c) % 5 < 2 || r == 2 * c;
        let mut m = [0u64; 64];
        for (r, word) in m.iter_mut().enumerate() {
            for c in 0..64 {
                *word |= u64::from(set(r, c)) << c;
            }
        }
        transpose_bits(&mut m);
        for (r, &word) in m.iter().enumerate() {
            for c in 0..64 {
                assert_eq!(word >> c & 1 == 1, set(c, r), "entry ({r}, {c})");
            }
        }
    }
}
