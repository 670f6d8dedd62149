//! C = A·B for B (k × n) row-major along n, or the transpose of a row-major matrix
//! (packed panel by panel), A with any strides: the one product of every path, generic
//! over its vectors ([`Simd`]).
//!
//! A tile of R rows × V vectors of C keeps its R·V sums in registers; one step of k loads
//! V vectors of B, broadcasts R scalars of A and does R·V fused multiply-adds. k runs in
//! blocks of [`KC`], so that a (KC × tile) panel of B stays in L1 across the row tiles.
//!
//! Every element of C sums its k in blocks of KC (in order within a block, each by one
//! fused multiply-add; blocks added in order), whatever the path, tiling, thread split or
//! skipped zeros: the result does not depend on them (the portable path on a target
//! without FMA rounds a·b first: see `simd::Portable`).

use std::cell::RefCell;

use super::simd::{Simd, MAX_BLOCKS};
use super::{balanced, split, Mat, Options, Zeros};
use crate::pool::Disjoint;

/// The k block. Zero-map blocks start on whole 64-bit words.
pub(super) const KC: usize = 128;
const _: () = assert!(KC.is_multiple_of(64));

/// Columns of the widest tile (AVX-512: 3 × 16), which sizes the packed panel.
const MAX_TILE_COLS: usize = 48;

/// What a tile does with its sums: store them, add them to C, or add them to
/// `scale · addend` (an addend laid out like C; the prior term of a weight gradient).
#[derive(Clone, Copy)]
pub(super) enum Store {
    Overwrite,
    Accumulate,
    AddScaled(*const f32, f32),
    /// The sums complete the gradient of θ at element offset `at` of C (with the prior
    /// term, or, when `from_dst`, with the partial sums in C): update θ.
    Update {
        fuse: *const Fuse,
        at: usize,
        from_dst: bool,
    },
}

/// What [`super::product_then_update`] updates, as raw pointers into its borrows.
pub(super) struct Fuse {
    pub theta: *mut f32,
    pub momentum: *mut f32,
    /// Σv² and Σθ·∇ of each row of C (two per row), accumulated in column order (see
    /// [`update_body`]).
    pub row_sums: *mut f64,
    pub update: crate::Update,
    pub consts: crate::StepConsts,
    pub key: crate::rng::NoiseKey,
    pub prior_scale: f32,
}

/// The k a tile runs over: all of `0..k`, or a list of the k whose terms are not all
/// zero (relative to the tile's first k, ascending).
#[derive(Clone, Copy)]
pub(super) enum Ks<'a> {
    All(usize),
    /// The k where one of the tile's rows of A is not zero; A is packed with only these
    /// (the q-th entry's scalars at q·R).
    Lhs(&'a [u32]),
    /// The k where B is not zero in one of the tile's columns; A is packed whole.
    Rhs(&'a [u32]),
}

/// One tile's operands: A packed (R scalars per k, see [`Ks`]), B at its k and first
/// column, C at its first element; `cols` valid columns.
#[derive(Clone, Copy)]
pub(super) struct Tile<'a> {
    pub ks: Ks<'a>,
    pub a: *const f32,
    pub b: *const f32,
    pub ldb: usize,
    /// B is read in place (not a packed panel in L1): prefetch the rows a list jumps to.
    pub prefetch_b: bool,
    pub c: *mut f32,
    pub ldc: usize,
    pub cols: usize,
    pub store: Store,
}

/// A finished tile's update: `cols` valid columns of C's element offset `at` (row stride
/// `n`); `c` is C's first element.
pub(super) struct UpdateTile {
    pub fuse: *const Fuse,
    pub c: *mut f32,
    pub n: usize,
    pub at: usize,
    pub cols: usize,
    pub from_dst: bool,
}

/// One tile of R rows × V vectors (`FULL`: no column of them outside the matrix).
///
/// # Safety
/// The path's features present (this is inlined into its entry); operands as [`Tile`]
/// says, inside the extents checked by `product`.
#[inline(always)]
pub(super) unsafe fn tile_body<S: Simd, const R: usize, const V: usize, const FULL: bool>(
    t: &Tile<'_>,
) {
    unsafe {
        let mut masks = [S::mask(0); V];
        for (v, m) in masks.iter_mut().enumerate() {
            *m = S::mask(t.cols.saturating_sub(S::LANES * v));
        }
        // The epilogue's operands (the addend, or θ and v) are visited a tile at a time, a
        // pattern the hardware prefetcher does not follow: fetch them while the k loop runs.
        let ahead = |base: *const f32| {
            for i in 0..R {
                for v in 0..V {
                    S::prefetch(base.wrapping_add(i * t.ldc + S::LANES * v));
                }
            }
        };
        match t.store {
            Store::AddScaled(w, _) => ahead(w),
            Store::Update { fuse, at, .. } => {
                let f = &*fuse;
                ahead(f.theta.wrapping_add(at));
                if f.update == crate::Update::Momentum {
                    ahead(f.momentum.wrapping_add(at));
                }
            }
            // C itself, read (or written) once the k loop ends: a tile of a large product
            // is out of L2 by then, and its rows are `ldc` apart.
            Store::Overwrite | Store::Accumulate => ahead(t.c),
        }
        let mut acc = [[S::zero(); V]; R];
        // One step of k: V vectors of B (row `pb`), R broadcasts of A (packed entry `pa`),
        // R·V FMAs (a macro, not a closure, so that the sums stay in registers).
        macro_rules! step {
            ($pa:expr, $pb:expr) => {{
                let (pa, pb): (usize, usize) = ($pa, $pb);
                let ap = t.a.add(pa * R);
                let bp = t.b.add(pb * t.ldb);
                let mut bv = [S::zero(); V];
                for v in 0..V {
                    bv[v] = S::load_part(FULL, masks[v], bp.wrapping_add(S::LANES * v));
                }
                for i in 0..R {
                    let s = S::splat(*ap.add(i));
                    for v in 0..V {
                        acc[i][v] = S::fmadd(s, bv[v], acc[i][v]);
                    }
                }
            }};
        }
        // The k of a list jump, which the hardware prefetcher does not follow: fetch the row
        // of B a few steps ahead where B is read in place.
        const AHEAD: usize = 6;
        let ahead_b = |list: &[u32], at: usize| {
            if let (true, Some(&q)) = (t.prefetch_b, list.get(at + AHEAD)) {
                let bq = t.b.wrapping_add(q as usize * t.ldb);
                for v in 0..V {
                    S::prefetch(bq.wrapping_add(S::LANES * v));
                }
            }
        };
        match t.ks {
            Ks::All(k) => {
                for p in 0..k {
                    step!(p, p)
                }
            }
            Ks::Lhs(list) => {
                for (q, &p) in list.iter().enumerate() {
                    ahead_b(list, q);
                    step!(q, p as usize)
                }
            }
            Ks::Rhs(list) => {
                for (q, &p) in list.iter().enumerate() {
                    ahead_b(list, q);
                    step!(p as usize, p as usize)
                }
            }
        }
        if let Store::Update { fuse, at, from_dst } = t.store {
            let u = UpdateTile {
                fuse,
                c: t.c.wrapping_sub(at),
                n: t.ldc,
                at,
                cols: t.cols,
                from_dst,
            };
            // A copy: were the sums' own address to escape, the k loop would store them to
            // the stack at every step (seen in the AVX2 build: half the speed).
            let sums = acc;
            S::update::<R, V>(&sums, &u);
            return;
        }
        for (i, row) in acc.iter().enumerate() {
            let out = t.c.add(i * t.ldc);
            for (v, &val) in row.iter().enumerate() {
                let o = out.wrapping_add(S::LANES * v);
                let load = |p: *const f32| S::load_part(FULL, masks[v], p);
                let val = match t.store {
                    Store::Update { .. } => unreachable!("handled above"),
                    Store::Overwrite => val,
                    Store::Accumulate => S::add(val, load(o)),
                    Store::AddScaled(w, scale) => {
                        // fl(sum + fl(scale·w)): the same roundings as writing scale·w first
                        // and accumulating onto it.
                        let w = load(w.wrapping_add(i * t.ldc + S::LANES * v));
                        S::add(val, S::mul(S::splat(scale), w))
                    }
                };
                S::store_part(FULL, masks[v], o, val)
            }
        }
    }
}

/// Σ of eight f64 lanes in one fixed order, the same on every path.
#[inline(always)]
fn reduce8(l: &[f64; 8]) -> f64 {
    ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))
}

/// The update of one finished tile of R rows × V vectors of sums into θ and v: ∇ = sum +
/// λθ (or + the partial sums in C), noise for the tile's Philox blocks, then the fused
/// element update in the kernel header's f32 operations and order.
///
/// Σv² of a row, and Σθ·∇ (θ before the update: the virial), are each summed in groups of
/// 16 columns: lane i of eight f64 lanes takes columns i and i + 8 of the group, in that
/// order, the lanes are added by [`reduce8`], and each group's sum is added to the row's
/// total in column order. Column tiles start on multiples of 16 columns and hold whole
/// groups (but the row's last), so this order, and the sums, are the same on every path
/// and tiling.
///
/// # Safety
/// The path's features present; pointers as [`Fuse`] says; the tile's rows are whole
/// Philox blocks (`at` and `n` multiples of 4).
#[inline(always)]
pub(super) unsafe fn update_body<S: Simd, const R: usize, const V: usize>(
    acc: &[[S::V; V]; R],
    u: &UpdateTile,
) {
    unsafe {
        let f = &*u.fuse;
        let (n, at) = (u.n, u.at);
        debug_assert!((at % n).is_multiple_of(16) && R * V * S::LANES / 4 <= MAX_BLOCKS);
        let mut masks = [S::mask(0); V];
        for (v, m) in masks.iter_mut().enumerate() {
            *m = S::mask(u.cols.saturating_sub(S::LANES * v));
        }
        // Block (at + r·n)/4 + b holds elements 4b .. 4b+3 of row r.
        let per_row = V * S::LANES / 4;
        let mut counters = [0u32; MAX_BLOCKS];
        for r in 0..R {
            let first = ((at + r * n) / 4) as u32;
            for b in 0..per_row {
                counters[r * per_row + b] = first.wrapping_add(b as u32);
            }
        }
        let mut z = [[0f32; 4]; MAX_BLOCKS];
        S::normals(&f.key, &counters, &mut z, R * per_row);
        let z = z.as_flattened();
        let k = f.consts;
        let (eta, sigma) = (S::splat(k.step_size), S::splat(k.noise_scale));
        let (decay, post) = (S::splat(k.decay), S::splat(k.post));
        let lambda = S::splat(f.prior_scale);
        let momentum = f.update == crate::Update::Momentum;
        let col0 = at % n;
        // Locals, not reads through `f`: the stores through θ and v could alias it, which
        // made the compiler reload the pointers at every vector.
        let (theta_at, momentum_at, c_at) =
            (f.theta.add(at), f.momentum.wrapping_add(at), u.c.add(at));
        let sums_at = f.row_sums.add(2 * (at / n));
        for (r, row) in acc.iter().enumerate() {
            let (mut lanes, mut virial_lanes) = ([0f64; 8], [0f64; 8]);
            let (mut row_sum, mut row_virial) = (*sums_at.add(2 * r), *sums_at.add(2 * r + 1));
            for (v, &sum) in row.iter().enumerate() {
                let (m, off) = (masks[v], r * n + S::LANES * v);
                let full = u.cols >= S::LANES * (v + 1);
                let load = |p: *const f32| S::load_part(full, m, p);
                let store = |p: *mut f32, x| S::store_part(full, m, p, x);
                let theta = load(theta_at.add(off));
                // ∇: the roundings of the stored gradient (see Store::AddScaled).
                let g = if u.from_dst {
                    S::add(sum, load(c_at.add(off)))
                } else {
                    S::add(sum, S::mul(lambda, theta))
                };
                let zv = S::load(z.as_ptr().add(r * 4 * per_row + S::LANES * v));
                let kick = S::mul(g, eta);
                let noise = S::mul(zv, sigma);
                let tg = S::mul(theta, g);
                S::add_squares(&mut virial_lanes, if full { tg } else { S::keep(m, tg) });
                if momentum {
                    // bnn_momentum_step: vn = (v·decay − g·η + z·σ)·post; θ += vn.
                    let old = load(momentum_at.add(off));
                    let vn = S::mul(S::add(S::sub(S::mul(old, decay), kick), noise), post);
                    store(momentum_at.add(off), vn);
                    store(theta_at.add(off), S::add(theta, vn));
                    let vv = S::mul(vn, vn);
                    S::add_squares(&mut lanes, if full { vv } else { S::keep(m, vv) });
                } else {
                    // bnn_sgld: θ ← θ − g·η + z·σ.
                    store(theta_at.add(off), S::add(S::sub(theta, kick), noise));
                }
                let end = col0 + S::LANES * (v + 1);
                if end.is_multiple_of(16) || end >= n {
                    row_sum += reduce8(&lanes);
                    row_virial += reduce8(&virial_lanes);
                    (lanes, virial_lanes) = ([0.0; 8], [0.0; 8]);
                }
            }
            // Unreachable with the tilings of `product` (see above), but nothing is lost.
            if lanes != [0.0; 8] || virial_lanes != [0.0; 8] {
                row_sum += reduce8(&lanes);
                row_virial += reduce8(&virial_lanes);
            }
            *sums_at.add(2 * r) = row_sum;
            *sums_at.add(2 * r + 1) = row_virial;
        }
    }
}

/// θ (and v) updated from a completed gradient in C (m × n, row-major), as the last k
/// block of [`product`] updates them from its sums and C: in the product's tiles (the
/// noise is drawn a tile's Philox blocks at a time), each row by one thread and from the
/// left (the order of Σv², see [`update_body`]).
///
/// # Safety
/// The path's features present; C and `fuse`'s θ, v and row sums of m·n (m) elements;
/// n a multiple of 4.
pub(super) unsafe fn update_from_dst<S: Simd>(
    m: usize,
    n: usize,
    dst: &mut [f32],
    fuse: &Fuse,
    threads: usize,
) {
    unsafe {
        let (c, fuse) = (dst.as_mut_ptr() as usize, fuse as *const Fuse as usize);
        let width = S::TILE_V * S::LANES;
        split(m, threads, S::TILE_R, |r0, r1| {
            for i in (r0..r1).step_by(S::TILE_R) {
                for c0 in (0..n).step_by(width) {
                    let u = UpdateTile {
                        fuse: fuse as *const Fuse,
                        c: c as *mut f32,
                        n,
                        at: i * n + c0,
                        cols: width.min(n - c0),
                        from_dst: true,
                    };
                    match S::TILE_V {
                        3 => update_rows::<S, 3>(S::TILE_R.min(r1 - i), &u),
                        2 => update_rows::<S, 2>(S::TILE_R.min(r1 - i), &u),
                        _ => update_rows::<S, 1>(S::TILE_R.min(r1 - i), &u),
                    }
                }
            }
        });
    }
}

/// [`Simd::update`] of `rows` rows with sums of −0 (−0 + g = g for every g; +0 would turn
/// a −0 gradient into +0).
#[inline(always)]
unsafe fn update_rows<S: Simd, const V: usize>(rows: usize, u: &UpdateTile) {
    unsafe {
        macro_rules! go {
            ($r:literal) => {
                S::update::<$r, V>(&[[S::splat(-0.0); V]; $r], u)
            };
        }
        match rows {
            1 => go!(1),
            2 => go!(2),
            3 => go!(3),
            4 => go!(4),
            5 => go!(5),
            6 => go!(6),
            7 => go!(7),
            _ => go!(8),
        }
    }
}

/// Rows of A per block: the column tiles of a k block sweep the rows in blocks of about
/// this many, so that A's (MC × KC) block (96 KiB) stays in L2 while they do. Without it a
/// k block of a batch-1000 product swept all 1000 rows (500 KiB) per column tile.
const MC: usize = 192;

/// Per-thread buffers of [`product`], reused across calls.
#[derive(Default)]
struct Scratch {
    /// The packed (k block × tile) panel of B when rhs is a transpose.
    panel: Vec<f32>,
    /// The row tiles of the thread's rows: (first row, rows).
    tiles: Vec<(usize, usize)>,
    /// The k lists of the row tiles for one k block (lhs zeros), KC apart, and their lengths.
    lists: Vec<u32>,
    lens: Vec<usize>,
    /// A's rows of one block of row tiles for one k block, packed tile by tile (R
    /// scalars per k), and where each tile's part starts.
    a_packed: Vec<f32>,
    a_at: Vec<usize>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// C (m × n) = A·B (+ C), as `opts` says, on path `S`; with `fuse`, the last k block
/// updates θ from the completed gradient instead of storing it (the prior addend is θ
/// itself, read through the same pointer), threads split the rows, and each row's Σv² is
/// summed by one thread in column order. Otherwise threads split the columns of C (or its
/// rows when it is tall enough).
///
/// # Safety
/// The path's features present; operand extents (and those of the addend, the zero maps
/// and `fuse`'s θ, v and row sums) checked by the caller; rhs contiguous along n
/// (`rhs.cs == 1`) or along k (`rhs.rs == 1`); with `fuse`, n a multiple of 4.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn product<S: Simd>(
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
    unsafe {
        match (opts.zeros, fuse) {
            // Rows of A in place, each over its own non-zero k (see `sparse`).
            (Zeros::Lhs(z), None) if lhs.cs == 1 => {
                return super::sparse::product::<S>(m, n, k, dst, lhs, rhs, z, threads, opts);
            }
            // Columns of B (pixels of a weight gradient), each over its own non-zero k.
            (Zeros::Rhs(z), _) if lhs.rs == 1 && (fuse.is_none() || opts.dst_stride.is_none()) => {
                return super::sparse::product_by_columns::<S>(
                    m, n, k, dst, lhs, rhs, z, threads, opts, fuse,
                );
            }
            _ => {}
        }
        let (a, a_rs, a_cs) = (lhs.data.as_ptr() as usize, lhs.rs, lhs.cs);
        let (w, scale) = match fuse {
            Some(f) => (f.theta as usize, f.prior_scale),
            None => opts
                .addend
                .map_or((0usize, 0f32), |(w, s)| (w.as_ptr() as usize, s)),
        };
        let fuse = fuse.map(|f| f as *const Fuse as usize);
        // rhs = Sᵀ for a row-major S (n × k, rows rhs.cs apart): each (k block × column tile)
        // panel of B is transposed from S into a small buffer before its tiles run, instead
        // of the caller transposing all of S first.
        let packed = rhs.cs != 1;
        let ldc = opts.dst_stride.unwrap_or(n);
        debug_assert!(fuse.is_none() || ldc == n);
        let c = Disjoint::new(dst);
        let tile_rows = if matches!(opts.zeros, Zeros::Lhs(_)) {
            S::TILE_R_LHS_ZEROS
        } else {
            S::TILE_R
        };
        let tile_cols = S::TILE_V * S::LANES;
        let lhs_zeros = matches!(opts.zeros, Zeros::Lhs(_));
        let block = |r0: usize, r1: usize, c0: usize, c1: usize| {
            SCRATCH.with_borrow_mut(|scratch| {
                let Scratch {
                    panel,
                    tiles,
                    lists,
                    lens,
                    a_packed,
                    a_at,
                } = scratch;
                if packed && panel.len() < KC * MAX_TILE_COLS {
                    panel.resize(KC * MAX_TILE_COLS, 0.0);
                }
                tiles.clear();
                let mut i = r0;
                for rows in balanced(r1 - r0, tile_rows) {
                    tiles.push((i, rows));
                    i += rows;
                }
                if lhs_zeros {
                    lens.resize(tiles.len(), 0);
                    lists.resize(KC * tiles.len().max(1), 0);
                }
                // Row tiles in even blocks of at most about MC rows (see MC), each block
                // over all k blocks before the next: its rows of C (MC × n) stay in L2
                // from one k block to the next instead of passing through L3.
                let mut t0 = 0;
                for per_block in balanced(tiles.len(), (MC / tile_rows).max(1)) {
                    let t1 = t0 + per_block;
                    for p0 in (0..k).step_by(KC) {
                        let kc = KC.min(k - p0);
                        if let Zeros::Lhs(z) = opts.zeros {
                            // The k of this block where some row of the tile is not zero.
                            for (t, &(i, rows)) in tiles.iter().enumerate().take(t1).skip(t0) {
                                let list = &mut lists[t * KC..(t + 1) * KC];
                                lens[t] = block_ks(kc, list, |word| {
                                    (i..i + rows).fold(0, |acc, r| acc | z.row(r)[p0 / 64 + word])
                                });
                            }
                        }
                        // A's rows of these tiles for this k block, packed: the k loop then
                        // reads R consecutive scalars per step through one pointer (with lhs
                        // zeros, only the k of the tile's list).
                        a_at.clear();
                        let mut len = 0;
                        for (t, &(_, rows)) in tiles.iter().enumerate().take(t1).skip(t0) {
                            a_at.push(len);
                            len += rows * if lhs_zeros { lens[t] } else { kc };
                        }
                        if a_packed.len() < len {
                            a_packed.resize(len, 0.0);
                        }
                        for (t, &(i, rows)) in tiles.iter().enumerate().take(t1).skip(t0) {
                            let out = &mut a_packed[a_at[t - t0]..];
                            let a = (a as *const f32).add(i * a_rs + p0 * a_cs);
                            if lhs_zeros {
                                for (q, &p) in lists[t * KC..t * KC + lens[t]].iter().enumerate() {
                                    for r in 0..rows {
                                        out[q * rows + r] = *a.add(r * a_rs + p as usize * a_cs);
                                    }
                                }
                            } else if a_cs == 1 {
                                // Rows of A along k (the im2col matrix of a convolution's
                                // weight gradient): by register transposes, where the scalar
                                // copy was 13% of a ResNet-20 step.
                                // SAFETY: rows i..i+rows, columns p0..p0+kc of A (`a` is at
                                // (i, p0)), inside the extent checked by `product`; the writes land in
                                // out[0..kc·rows], this thread's own buffer.
                                S::transpose(a, a_rs, (0, rows), 0, kc, out.as_mut_ptr(), rows);
                            } else if a_rs == 1 {
                                // Columns of A contiguous (the transpose of a row-major
                                // matrix, Δᵀ of a weight gradient): `rows` floats per k, one
                                // vector each (see `pack_columns_body`), where the scalar copy
                                // with its bounds checks was 2–3% of a batch-1000 784-400-400
                                // step.
                                debug_assert!(out.len() >= kc * rows);
                                // SAFETY: columns p0..p0+kc of rows i..i+rows of A, inside
                                // the extent checked by `product`; out holds kc·rows floats.
                                S::pack_columns(a, a_cs, rows, kc, out.as_mut_ptr());
                            } else {
                                for r in 0..rows {
                                    let row = a.add(r * a_rs);
                                    for p in 0..kc {
                                        out[p * rows + r] = *row.add(p * a_cs);
                                    }
                                }
                            }
                        }
                        let mut j = c0;
                        // Column tiles of whole vectors, balanced: 7 vectors of 16 → 3, 2, 2.
                        for vectors in balanced((c1 - c0).div_ceil(S::LANES), S::TILE_V) {
                            let cols = (S::LANES * vectors).min(c1 - j);
                            let (b_tile, ld_tile) =
                                b_block::<S>(rhs, (p0, kc), (j, cols), panel, tile_cols);
                            // The k of this block where rhs is not zero in the tile's columns.
                            let mut rhs_list = [0u32; KC];
                            let mut rhs_len = 0;
                            if let Zeros::Rhs(z) = opts.zeros {
                                for p in 0..kc {
                                    if z.any(p0 + p, j, j + cols) {
                                        rhs_list[rhs_len] = p as u32;
                                        rhs_len += 1;
                                    }
                                }
                            }
                            for (t, &(i, rows)) in tiles.iter().enumerate().take(t1).skip(t0) {
                                let store = if let (Some(f), true) = (fuse, p0 + kc == k) {
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
                                    Zeros::Lhs(_) => Ks::Lhs(&lists[t * KC..t * KC + lens[t]]),
                                    Zeros::Rhs(_) => Ks::Rhs(&rhs_list[..rhs_len]),
                                };
                                let tile = Tile {
                                    ks,
                                    a: a_packed.as_ptr().add(a_at[t - t0]),
                                    b: b_tile,
                                    ldb: ld_tile,
                                    // (After the block's first row tile, the rows of B a list
                                    // visits are in L1.)
                                    prefetch_b: !packed && t == t0,
                                    c: c.at(i * ldc + j),
                                    ldc,
                                    cols,
                                    store,
                                };
                                let full = cols == S::LANES * vectors;
                                // SAFETY: the tile lies inside the checked extents; masked
                                // lanes beyond `cols` are neither read nor written.
                                match vectors {
                                    3 => S::tile::<3>(rows, full, &tile),
                                    2 => S::tile::<2>(rows, full, &tile),
                                    _ => S::tile::<1>(rows, full, &tile),
                                }
                            }
                            j += cols;
                        }
                    }
                    t0 = t1;
                }
            })
        };
        // Rows when each thread gets at least two row tiles (every thread then runs the same
        // column tiles); columns, in whole groups of 16, otherwise.
        if fuse.is_some() || !opts.split_columns && (m >= 2 * S::TILE_R * threads || threads == 1) {
            split(m, threads, 1, |r0, r1| block(r0, r1, 0, n));
        } else {
            split(n, threads, 16, |c0, c1| block(0, m, c0, c1));
        }
    }
}

/// B's (kc × cols) block at row p0, column j, and its row stride: read in place where
/// rhs is row-major along n, else packed into `panel` (rows `ld` apart) by transposing
/// rows j..j+cols, columns p0..p0+kc of S, the row-major matrix whose transpose B is.
///
/// # Safety
/// The path's features present; the block inside rhs's extent checked by `product`;
/// `panel` at least kc·ld long when packing.
#[inline(always)]
pub(super) unsafe fn b_block<S: Simd>(
    rhs: Mat<'_>,
    (p0, kc): (usize, usize),
    (j, cols): (usize, usize),
    panel: &mut [f32],
    ld: usize,
) -> (*const f32, usize) {
    unsafe {
        if rhs.cs == 1 {
            return (rhs.data.as_ptr().add(p0 * rhs.rs + j), rhs.rs);
        }
        debug_assert!(panel.len() >= kc * ld && cols <= ld);
        let (s, ld_s) = (rhs.data.as_ptr(), rhs.cs);
        S::transpose(s, ld_s, (j, j + cols), p0, p0 + kc, panel.as_mut_ptr(), ld);
        (panel.as_ptr(), ld)
    }
}

/// `rows` (≤ the path's lanes) floats at each `src + p·ld`, p < kc, to `dst + p·rows`:
/// one masked load per p, and a whole-vector store wherever it stays inside the kc·rows
/// floats (its extra lanes land on the next p's, which overwrites them): a masked store
/// is microcoded on AMD Zen (see `store_first`).
///
/// # Safety
/// The path's features present (inlined into its entry); both ranges inside their buffers.
#[inline(always)]
pub(super) unsafe fn pack_columns_body<S: Simd>(
    src: *const f32,
    ld: usize,
    rows: usize,
    kc: usize,
    dst: *mut f32,
) {
    debug_assert!(rows <= S::LANES);
    unsafe {
        let mask = S::mask(rows);
        for p in 0..kc {
            let v = S::load_part(false, mask, src.add(p * ld));
            let whole = p * rows + S::LANES <= kc * rows;
            S::store_part(whole, mask, dst.add(p * rows), v);
        }
    }
}

/// Writes into `list` the k in `0..kc` (a block starting on a whole 64-bit word of the
/// zero map) whose bit is set in `word(w)`, the block's w-th word; returns how many.
#[inline]
pub(super) fn block_ks(kc: usize, list: &mut [u32], word: impl Fn(usize) -> u64) -> usize {
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
