//! The products on every path the CPU has: against each other, a naive product, the
//! summation order they promise, and the separate fused update.

use super::*;
use crate::isa::{self, Isa};

/// Runs `f` once per path this CPU has, with the kernels of this thread on it.
fn on_every_path(mut f: impl FnMut(Isa)) {
    for path in Isa::available() {
        isa::with(path, || f(path));
    }
}

/// Whether two results are the same to the bit.
fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.iter().zip(b).all(|(p, q)| p.to_bits() == q.to_bits())
}

/// The portable transpose (tests build transposed operands with it).
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

#[test]
fn packed_transposed_rhs_is_bit_identical_to_a_row_major_copy() {
    on_every_path(|path| {
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
                        same_bits(&x, &y),
                        "{path} {m}x{n}x{k} split_columns {split_columns}"
                    );
                }
            }
        }
    });
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
    on_every_path(|path| {
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
                // B also as the transpose of a row-major matrix (the forward's Wᵀ).
                let mut bt = vec![0f32; n * k];
                transpose_scalar(&b, k, n, &mut bt);
                // A also as the transpose of a row-major matrix (the weight gradient's Δᵀ).
                let mut at = vec![0f32; k * m];
                transpose_scalar(&a, m, k, &mut at);
                let operands = [
                    (Mat::rows(&a, k), Mat::rows(&b, n)),
                    (Mat::rows(&a, k), Mat::transposed(&bt, k)),
                    (Mat::transposed(&at, m), Mat::rows(&b, n)),
                ];
                for ((lhs, rhs), (split_columns, accumulate, addend)) in
                    operands.into_iter().flat_map(|pair| {
                        [
                            (false, false, None),
                            (true, false, None),
                            (false, true, None),
                            (false, false, Some((&w[..], 0.25f32))),
                            (true, false, Some((&w[..], 0.25f32))),
                        ]
                        .map(|o| (pair, o))
                    })
                {
                    let opts = Options {
                        accumulate,
                        split_columns,
                        addend,
                        zeros: Zeros::Unknown,
                        ..Options::default()
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
                            "{path} {m}x{n}x{k}, zeros {zero_frac}, {split_columns} {accumulate}"
                        );
                    }
                }
                if zero_frac == 1.0 {
                    assert_eq!(za.density(), 0.0);
                }
            }
        }
    });
}

#[test]
fn update_in_the_epilogue_is_bit_identical_to_product_then_fused_step() {
    on_every_path(|path| {
        // The weight gradient's layout (lhs = Δᵀ from a row-major Δ, rhs row-major with
        // zeros), shapes of 784-400-400-10 and ragged ones, one and several k blocks; SGLD
        // and the momentum update with Euler and splitting constants.
        use crate::rng::NoiseKey;
        use crate::{cpu, InlineUpdate, StepConsts, Update};
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
                // Reference: the dense gradient stored, then the fused pass.
                let mut grad = vec![0f32; m * n];
                let opts = Options {
                    addend: Some((&theta0, lambda)),
                    zeros: Zeros::Unknown,
                    ..Options::default()
                };
                product(m, n, k, &mut grad, lhs, rhs, opts);
                let (mut theta_ref, mut v_ref) = (theta0.clone(), v0.clone());
                let v_ref_slice: &mut [f32] = if update == Update::Sgld {
                    &mut []
                } else {
                    &mut v_ref
                };
                let sum_ref = cpu::step(
                    update,
                    &mut theta_ref,
                    v_ref_slice,
                    &mut [],
                    &grad,
                    key,
                    consts,
                );
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
                assert!(
                    same_bits(&theta, &theta_ref),
                    "{path} θ {m}x{n}x{k} {update:?}"
                );
                // Σθ·∇ in another order: the same f32 products (the epilogue's ∇ has the
                // stored gradient's roundings), summed in f64, agree to ~1e-15 of Σ|θ·∇|.
                let scale: f64 = theta0
                    .iter()
                    .zip(&grad)
                    .map(|(&t, &g)| (t * g).abs() as f64)
                    .sum();
                assert!(
                    (sum.virial - sum_ref.virial).abs() <= 1e-12 * scale,
                    "{path} virial {} vs {}",
                    sum.virial,
                    sum_ref.virial
                );
                if update == Update::Sgld {
                    assert!(same_bits(&v, &v0) && sum.sum_sq == 0.0);
                } else {
                    assert!(same_bits(&v, &v_ref), "{path} v {m}x{n}x{k} {update:?}");
                    // Σv² in another order: f64 sums of m·n f32 squares agree to ~1e-15.
                    let (sum, sum_ref) = (sum.sum_sq, sum_ref.sum_sq);
                    assert!(
                        (sum - sum_ref).abs() <= 1e-12 * sum_ref,
                        "{sum} vs {sum_ref}"
                    );
                }
            }
        }
    });
}

#[test]
fn skipped_terms_are_never_computed() {
    on_every_path(|path| {
        // An infinite operand facing a zero: the dense product computes 0·∞ = NaN, a
        // product that skips the zero does not (where the kernel skips zeros at all).
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
            assert_eq!(v.is_nan(), j % n == 7, "{path} element {j}: {v}");
        }
    });
}

#[test]
fn nonzero_map_marks_exactly_the_nonzero_entries() {
    on_every_path(|path| {
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
                assert_eq!(
                    z.any(r, c, c + 1),
                    v != 0.0 || v.is_nan(),
                    "{path} ({r}, {c})"
                );
            }
        }
        assert!(z.any(0, 1, 64) && !z.any(0, 1, 63) && z.any(2, 6, 130) && !z.any(1, 0, 129));
        assert!((z.density() - 6.0 / 390.0).abs() < 1e-12);
    });
}

#[test]
fn every_path_equals_a_naive_product() {
    on_every_path(|path| {
        // Ragged sizes hit every edge tile; large ones take the two-thread split. The "nn"
        // layout (rhs row-major) is read in place, the "nt" one (rhs the transpose of a
        // row-major matrix) is packed panel by panel.
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
                            "{path} {label} {m}x{n}x{k}: {x} vs {w}"
                        );
                    }
                }
            }
        }
    });
}

/// The order every path promises: element (i, j) sums its k in blocks of [`nn::KC`], in
/// order within a block by one fused multiply-add each (a·b + c in two roundings where
/// `fused` is false), the blocks added in order.
fn product_in_promised_order(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    b: &[f32],
    fused: bool,
) -> Vec<f32> {
    let mut c = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut total = 0f32;
            for p0 in (0..k).step_by(nn::KC) {
                let mut s = 0f32;
                for p in p0..(p0 + nn::KC).min(k) {
                    let (x, y) = (a[i * k + p], b[p * n + j]);
                    s = if fused { x.mul_add(y, s) } else { x * y + s };
                }
                total = if p0 == 0 { s } else { total + s };
            }
            c[i * n + j] = total;
        }
    }
    c
}

#[test]
fn every_path_sums_in_the_promised_order() {
    // Bit for bit against a scalar model of the order (k blocks of 128, fused
    // multiply-adds), which is what makes avx512 and avx2 give the same samples. The
    // portable path without FMA (x86-64 baseline) rounds a·b and then the sum: the model
    // with two roundings gives its bits instead. Shapes: the first layer of
    // 784-400-400-10 at batch 100 (several k blocks, both thread splits), one of several
    // row blocks of MC rows and several k blocks (400 × 40 × 300), and ragged ones; lhs
    // row-major and transposed, rhs row-major and transposed; with zeros skipped.
    for (m, n, k) in [
        (100, 400, 784),
        (400, 40, 300),
        (37, 70, 129),
        (7, 17, 19),
        (9, 130, 300),
    ] {
        let a = sparse_values(m * k, k, 0.5, 31 + m as u64);
        let b = sparse_values(k * n, n, 0.0, 32 + n as u64);
        let mut bt = vec![0f32; k * n];
        transpose_scalar(&b, k, n, &mut bt);
        let mut at = vec![0f32; m * k];
        transpose_scalar(&a, m, k, &mut at);
        let mut za = NonZero::default();
        za.record(&a, m, k);
        let fused = product_in_promised_order(m, n, k, &a, &b, true);
        let unfused = product_in_promised_order(m, n, k, &a, &b, false);
        on_every_path(|path| {
            let want = if path == Isa::Portable && !PORTABLE_FUSED {
                &unfused
            } else {
                &fused
            };
            let lhs_layouts = [
                ("rows", Mat::rows(&a, k)),
                ("transposed", Mat::transposed(&at, m)),
            ];
            for ((layout, lhs), rhs) in lhs_layouts
                .into_iter()
                .flat_map(|l| [(l, Mat::rows(&b, n)), (l, Mat::transposed(&bt, k))])
            {
                for (split_columns, zeros) in [
                    (false, Zeros::Unknown),
                    (true, Zeros::Unknown),
                    (false, Zeros::Lhs(&za)),
                ] {
                    let opts = Options {
                        split_columns,
                        zeros,
                        ..Options::default()
                    };
                    let mut c = vec![f32::NAN; m * n];
                    product(m, n, k, &mut c, lhs, rhs, opts);
                    let same = c.iter().zip(want).all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(
                        same,
                        "{path} {m}x{n}x{k} lhs {layout} split_columns {split_columns}"
                    );
                }
            }
        });
    }
}

#[test]
fn portable_products_are_within_the_rounding_bound_of_the_fused_ones() {
    // Where the portable path rounds a·b before adding (no FMA on the target), each of
    // its sums differs from the fused one by at most the two recursive sums' error
    // bounds: |ŝ − s| ≤ γ_k Σ|a·b| each, γ_k = k·u/(1 − k·u), u = 2⁻²⁴ (Higham, Accuracy
    // and Stability, §3.1); so |fused − portable| ≤ 2γ_k Σ|a·b|. Checked on the largest
    // product of an MLP step with both paths run; bit-identical where PORTABLE_FUSED.
    let (m, n, k) = (100, 400, 784);
    let a = sparse_values(m * k, k, 0.5, 41);
    let b = sparse_values(k * n, n, 0.0, 42);
    let run = |path| {
        let mut c = vec![0f32; m * n];
        isa::with(path, || {
            matmul(m, n, k, &mut c, false, Mat::rows(&a, k), Mat::rows(&b, n))
        });
        c
    };
    let portable = run(Isa::Portable);
    let best = run(Isa::best());
    let u = f64::from(f32::EPSILON) / 2.0;
    let gamma = k as f64 * u / (1.0 - k as f64 * u);
    let mut worst = 0f64;
    for i in 0..m {
        for j in 0..n {
            let abs: f64 = (0..k)
                .map(|p| (a[i * k + p] as f64 * b[p * n + j] as f64).abs())
                .sum();
            let d = (portable[i * n + j] as f64 - best[i * n + j] as f64).abs();
            assert!(
                d <= 2.0 * gamma * abs,
                "({i}, {j}): {d} > {}",
                2.0 * gamma * abs
            );
            worst = worst.max(d / (gamma * abs).max(f64::MIN_POSITIVE));
        }
    }
    if PORTABLE_FUSED || Isa::best() == Isa::Portable {
        assert_eq!(portable, best);
    }
    assert!(worst.is_finite());
}

#[test]
fn the_update_in_the_epilogue_is_the_same_on_every_path() {
    // Σv² of the update inside the weight gradient's product against a scalar model of
    // the order every path promises (nn::update_body: groups of 16 columns in eight f64
    // lanes, a fixed lane tree, groups then rows in order), bit for bit; and θ, v and Σv²
    // path against path where the products are the same bits. So SGNHT's thermostat,
    // which reads Σv², follows the same trajectory on avx512 and avx2. Shapes of
    // 784-400-400-10's W₁ and ragged ones (n = 4 mod 16, several k blocks).
    use crate::rng::NoiseKey;
    use crate::{InlineUpdate, StepConsts, Update};
    for (m, n, k) in [(400, 784, 100), (13, 36, 300), (10, 400, 100)] {
        let delta = sparse_values(k * m, m, 0.0, 51 + m as u64);
        let x = sparse_values(k * n, n, 0.7, 52 + n as u64);
        let theta0 = sparse_values(m * n, n, 0.0, 53);
        let v0 = sparse_values(m * n, n, 0.0, 54);
        let mut zx = NonZero::default();
        zx.record(&x, k, n);
        let key = NoiseKey {
            seed: 3,
            step: 9,
            param: 1,
        };
        let consts = StepConsts::new(1e-3, 0.1, 0.02);
        let run = |path| {
            let (mut theta, mut v) = (theta0.clone(), v0.clone());
            let (mut scratch, mut rows) = (vec![0f32; m * n], Vec::new());
            let step = InlineUpdate {
                update: Update::Momentum,
                consts,
                key,
                momentum: &mut v,
            };
            let (lhs, rhs) = (Mat::transposed(&delta, m), Mat::rows(&x, n));
            let sum = isa::with(path, || {
                product_then_update(
                    m,
                    n,
                    k,
                    &mut scratch,
                    lhs,
                    rhs,
                    Zeros::Rhs(&zx),
                    &mut theta,
                    0.3,
                    step,
                    &mut rows,
                )
            });
            (theta, v, (sum.sum_sq.to_bits(), sum.virial.to_bits()))
        };
        let mut fused = Vec::new();
        on_every_path(|path| {
            let out = run(path);
            let model: f64 = out
                .1
                .chunks_exact(n)
                .map(|row| {
                    let mut total = 0f64;
                    for group in row.chunks(16) {
                        let mut lanes = [0f64; 8];
                        for (c, &v) in group.iter().enumerate() {
                            lanes[c % 8] += f64::from(v * v);
                        }
                        total += ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6]))
                            + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
                    }
                    total
                })
                .sum();
            assert_eq!(out.2 .0, model.to_bits(), "{path} Σv² at {m}x{n}x{k}");
            if path != Isa::Portable || PORTABLE_FUSED {
                fused.push((path, out));
            }
        });
        for (path, out) in &fused[1..] {
            assert!(
                *out == fused[0].1,
                "{path} against {} at {m}x{n}x{k}",
                fused[0].0
            );
        }
    }
}

#[test]
fn lhs_packing_and_strided_dst_do_not_change_a_bit() {
    on_every_path(|path| {
        // A row-major (packed by register transposes) against the same A given as the
        // transpose of its transpose (packed a masked vector per k); dst inside a wider
        // matrix (a convolution's chunk of images) against a contiguous dst, with the
        // columns outside the chunk untouched.
        for (m, n, k) in [(16, 784, 144), (13, 50, 300), (7, 17, 19), (1, 9, 1)] {
            let a = sparse_values(m * k, k, 0.3, 21 + m as u64);
            let b = sparse_values(k * n, n, 0.0, 22 + k as u64);
            let mut a_t = vec![0f32; k * m];
            transpose_scalar(&a, m, k, &mut a_t);
            for accumulate in [false, true] {
                let opts = Options {
                    accumulate,
                    ..Options::default()
                };
                let (mut x, mut y) = (vec![0.5f32; m * n], vec![0.5f32; m * n]);
                product(m, n, k, &mut x, Mat::rows(&a, k), Mat::rows(&b, n), opts);
                product(
                    m,
                    n,
                    k,
                    &mut y,
                    Mat::transposed(&a_t, m),
                    Mat::rows(&b, n),
                    opts,
                );
                assert!(
                    same_bits(&x, &y),
                    "{path:?} {m}×{n}×{k}: lhs packings differ"
                );
                let (ldc, at) = (n + 5, 3);
                let mut wide = vec![0.5f32; m * ldc];
                let strided = Options {
                    dst_stride: Some(ldc),
                    ..opts
                };
                product(
                    m,
                    n,
                    k,
                    &mut wide[at..],
                    Mat::rows(&a, k),
                    Mat::rows(&b, n),
                    strided,
                );
                for (i, row) in wide.chunks_exact(ldc).enumerate() {
                    let inside = &row[at..at + n];
                    let same = same_bits(inside, &x[i * n..(i + 1) * n]);
                    assert!(same, "{path:?} {m}×{n}×{k}: strided row {i} differs");
                    let outside = row[..at].iter().chain(&row[at + n..]);
                    assert!(
                        outside.into_iter().all(|&v| v == 0.5),
                        "{path:?}: wrote outside"
                    );
                }
            }
        }
    });
}

#[test]
fn transpose_matches_the_scalar_one_on_every_path() {
    on_every_path(|path| {
        // Partial blocks of rows and columns (6-row lhs tiles, odd pixel counts), a source
        // stride wider than its columns, and dst rows wider than the source rows.
        for (rows, cols, stride, ld) in [(6, 128, 128, 6), (16, 784, 800, 16), (7, 13, 20, 9)] {
            let src = sparse_values(rows * stride, stride, 0.0, (rows * cols) as u64);
            let mut dst = vec![-1f32; cols * ld + 3];
            transpose(rows, cols, &src, stride, &mut dst, ld);
            for c in 0..cols {
                for r in 0..ld {
                    let want = if r < rows { src[r * stride + c] } else { -1.0 };
                    assert_eq!(
                        dst[c * ld + r].to_bits(),
                        want.to_bits(),
                        "{path:?} {rows}×{cols} ({r}, {c})"
                    );
                }
            }
            assert!(
                dst[cols * ld..].iter().all(|&v| v == -1.0),
                "{path:?}: wrote past the end"
            );
        }
    });
}

#[test]
fn the_peak_loop_runs_every_multiply_add_it_counts() {
    // Each lane follows x ← x·a + b from 0 for `iters` steps: the loop's sum is that
    // recurrence's value times the lanes it ran on, so a loop the compiler shortened or
    // dropped would give another number.
    let iters = 1000;
    on_every_path(|isa| {
        let (a, b) = (0.999_999f32, 1e-7f32);
        let fused = isa != Isa::Portable || PORTABLE_FUSED;
        let x = (0..iters).fold(0f32, |x, _| if fused { x.mul_add(a, b) } else { x * a + b });
        let lanes = match isa {
            Isa::Avx512 => 16,
            _ => 8,
        };
        let total = peak::fma_chains(isa, iters);
        let expected = x * (peak::CHAINS * lanes) as f32;
        assert!(
            (total - expected).abs() <= 1e-5 * expected,
            "{isa}: {total} vs {expected}"
        );
    });
}

#[test]
fn the_peak_is_positive_and_computed_as_documented() {
    let p = peak(1);
    assert_eq!(p.threads, 1);
    assert!(p.measured_gflop_per_s > 0.0 && p.measured_gflop_per_s.is_finite());
    if let (Some(ghz), Some(computed)) = (p.ghz, p.computed_gflop_per_s) {
        let flops = if p.fused { 2.0 } else { 1.0 };
        assert!(ghz > 0.0 && (computed - ghz * p.lanes as f64 * flops * 2.0).abs() < 1e-9);
    }
}

#[test]
fn block_ks_lists_the_set_bits_of_the_block_in_order() {
    // Words of every density, a full and an empty one, and every block length up to KC
    // (the last block of a k that is not a multiple of 64, or of 8).
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for kc in 1..=nn::KC {
        let words: Vec<u64> = match kc % 4 {
            0 => vec![u64::MAX; 2],
            1 => vec![0; 2],
            2 => vec![next() & next(), next() | next()],
            _ => vec![next(), next() & next() & next()],
        };
        let expected: Vec<u32> = (0..kc)
            .filter(|&p| words[p / 64] >> (p % 64) & 1 == 1)
            .map(|p| p as u32)
            .collect();
        let mut list = vec![u32::MAX; nn::KC];
        let len = nn::block_ks(kc, &mut list, |w| words[w]);
        assert_eq!(&list[..len], &expected[..], "kc {kc}");
    }
}
