//! C = A·B where A's zeros are known and A's rows are contiguous along k: the forward
//! product X·Wᵀ of a first layer fed MNIST's pixels (81% zeros).
//!
//! Why a kernel of its own: the tiles of [`super::nn`] share one list of k among their R
//! rows, so they run over the union of R images' pixels (44% of them for 6 images,
//! against 19% for one) and pack A along that list. Here a tile is one row of C × V
//! vectors, and the row runs over its own non-zero k only, reading A in place: about 2.3×
//! fewer multiply-adds, each with its own load of B (a k block's (KC × V vectors) panel
//! of B stays in L1 while the rows run).
//!
//! The order of summation is the one of `nn` (each element sums the k of a KC block in
//! order from zero, one fused multiply-add per term; blocks added in order; a skipped
//! term is an exact zero), so the bits are those of the dense product.

use super::nn::KC;
use super::simd::Simd;
use super::{split, Mat, NonZero, Options};
use crate::pool::Disjoint;
use std::cell::RefCell;

/// Columns of a tile: V vectors, as many as keep V sums, the broadcast and the loads in
/// registers (AVX2: 6 × 8, AVX-512: 3 × 16), and make a (KC × tile) panel of 24 KiB.
pub(super) const TILE_COLS: usize = 48;

/// One k block of a run of rows over one column tile: row `r` of C (at `c + r·ldc`) sums
/// `a[r·lda + p]·b[p·ldb + ·]` over the p in `lists[starts[r]..starts[r + 1]]`.
#[derive(Clone, Copy)]
pub(super) struct Rows<'a> {
    pub rows: usize,
    pub lists: &'a [u32],
    pub starts: &'a [usize],
    pub a: *const f32,
    pub lda: usize,
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

/// The rows of one (k block, column tile) of V vectors (`FULL`: no column outside C).
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
        for r in 0..t.rows {
            let a = t.a.add(r * t.lda);
            let mut acc = [S::zero(); V];
            for &p in &t.lists[t.starts[r]..t.starts[r + 1]] {
                let x = S::splat(*a.add(p as usize));
                let bp = t.b.add(p as usize * t.ldb);
                for v in 0..V {
                    let b = S::load_part(FULL, masks[v], bp.wrapping_add(S::LANES * v));
                    acc[v] = S::fmadd(x, b, acc[v]);
                }
            }
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
}

/// Per-thread buffers, reused across calls.
#[derive(Default)]
struct Scratch {
    panel: Vec<f32>,
    lists: Vec<u32>,
    starts: Vec<usize>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
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
        debug_assert!(lhs.cs == 1);
        let a = lhs.data.as_ptr() as usize;
        let (w, scale) = opts
            .addend
            .map_or((0usize, 0f32), |(w, s)| (w.as_ptr() as usize, s));
        let packed = rhs.cs != 1;
        let ldc = opts.dst_stride.unwrap_or(n);
        let c = Disjoint::new(dst);
        let block = |r0: usize, r1: usize, c0: usize, c1: usize| {
            SCRATCH.with_borrow_mut(|s| {
                let Scratch {
                    panel,
                    lists,
                    starts,
                } = s;
                if packed && panel.len() < KC * TILE_COLS {
                    panel.resize(KC * TILE_COLS, 0.0);
                }
                let rows = r1 - r0;
                lists.resize(rows * KC, 0);
                for p0 in (0..k).step_by(KC) {
                    let kc = KC.min(k - p0);
                    // Each row's non-zero k of this block, one after the other.
                    starts.clear();
                    starts.push(0);
                    let mut len = 0;
                    for i in r0..r1 {
                        let row = z.row(i);
                        len +=
                            super::nn::block_ks(kc, &mut lists[len..], |word| row[p0 / 64 + word]);
                        starts.push(len);
                    }
                    let store = if opts.accumulate || p0 > 0 {
                        RowStore::Accumulate
                    } else if w != 0 {
                        RowStore::AddScaled((w as *const f32).wrapping_add(r0 * n + c0), scale)
                    } else {
                        RowStore::Overwrite
                    };
                    let mut j = c0;
                    while j < c1 {
                        let cols = TILE_COLS.min(c1 - j);
                        let (b, ldb) = if packed {
                            // SAFETY: rows j..j+cols of S (B = Sᵀ), columns p0..p0+kc:
                            // inside rhs's checked extent; into this thread's panel.
                            S::transpose(
                                rhs.data.as_ptr(),
                                rhs.cs,
                                (j, j + cols),
                                p0,
                                p0 + kc,
                                panel.as_mut_ptr(),
                                TILE_COLS,
                            );
                            (panel.as_ptr(), TILE_COLS)
                        } else {
                            (rhs.data.as_ptr().add(p0 * rhs.rs + j), rhs.rs)
                        };
                        let store = match store {
                            RowStore::AddScaled(w, s) => RowStore::AddScaled(w.add(j - c0), s),
                            other => other,
                        };
                        let t = Rows {
                            rows,
                            lists,
                            starts,
                            a: (a as *const f32).add(r0 * lhs.rs + p0),
                            lda: lhs.rs,
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
        };
        if opts.split_columns {
            split(n, threads, 16, |c0, c1| block(0, m, c0, c1));
        } else {
            split(m, threads, 1, |r0, r1| block(r0, r1, 0, n));
        }
    }
}
