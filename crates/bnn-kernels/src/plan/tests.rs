//! Each kernel of the step plan, host-compiled, against a plain Rust reference: rows not
//! a multiple of any block, one chain and several, 2 and 10 classes, labels at the edges,
//! a non-finite loss (the chain halts: no update). Where the reference does the same f32
//! operations in the same order the check is bit for bit; where it is written in f64
//! (the GEMM, the polynomial exp and log against std's) the tolerance says why.

use super::host::{self, HostWorkspace};
use super::*;
use crate::rng::NoiseKey;
use crate::update::{StepConsts, Update};

/// A deterministic stream of values in [-1, 1) (an LCG: no dependency, no seed policy).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn empty() -> Plan {
    Plan {
        buffers: Vec::new(),
        ops: Vec::new(),
    }
}

fn control(k: usize, scale: f32) -> Vec<ChainControl> {
    (0..k)
        .map(|i| ChainControl {
            seed: 11 + i as u64,
            step: 3 + i as u64,
            offset: (2 * i) as u32,
            scale,
            precision: 1.0,
            rescale: 1.0,
            ..ChainControl::default()
        })
        .collect()
}

#[test]
fn the_rust_mirrors_have_the_c_layouts() {
    // No implicit padding (the blocks are copied as bytes): 3 u64, 15 f64, 48 f64 sums,
    // 16 f64 first virials, 4 + 16 + 3 f32 and 5 u32; the table's 32 u64, 17 + 3 u32 and
    // its u64 P.
    assert_eq!(
        std::mem::size_of::<ChainControl>(),
        3 * 8 + 15 * 8 + 48 * 8 + 16 * 8 + 23 * 4 + 5 * 4
    );
    assert_eq!(std::mem::size_of::<TensorTable>(), 32 * 8 + 20 * 4 + 8);
    assert_eq!(
        host::c_layout_sizes(),
        (
            std::mem::size_of::<ChainControl>(),
            std::mem::size_of::<TensorTable>()
        )
    );
}

/// Every transpose pair, leading dimensions wider than the rows, three problems, with
/// and without β = 1. The project's kernel sums in f32 with fused multiply-adds, the
/// reference in f64: |Δ| ≤ 1e-5 on sums of ≤ 13 terms of |a·b| < 1.
#[test]
fn gemm_has_cublas_conventions() {
    let (m, n, k, batch) = (5, 7, 13, 3);
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        for accumulate in [false, true] {
            let (ar, ac) = if ta { (k, m) } else { (m, k) };
            let (br, bc) = if tb { (n, k) } else { (k, n) };
            let (lda, ldb, ldc) = (ar + 2, br + 1, m + 3);
            let (sa, sb, sc) = (lda * ac + 4, ldb * bc, ldc * n + 1);
            let mut plan = empty();
            let a = plan.buffer("a", sa * batch, Elem::F32);
            let b = plan.buffer("b", sb * batch, Elem::F32);
            let c = plan.buffer("c", sc * batch, Elem::F32);
            plan.ops.push(Op::Gemm(Gemm {
                transa: ta,
                transb: tb,
                m,
                n,
                k,
                a: (a.at(0), lda, sa),
                b: (b.at(0), ldb, sb),
                c: (c.at(0), ldc, sc),
                batch,
                accumulate,
            }));
            let mut ws = HostWorkspace::new(&plan);
            let (av, bv, cv) = (
                values(sa * batch, 1),
                values(sb * batch, 2),
                values(sc * batch, 3),
            );
            ws.f32(a).copy_from_slice(&av);
            ws.f32(b).copy_from_slice(&bv);
            ws.f32(c).copy_from_slice(&cv);
            host::run(&plan, &mut ws).unwrap();
            let mut want = cv.clone();
            for i in 0..batch {
                host::reference_gemm(
                    (ta, tb),
                    (m, n, k),
                    &av[i * sa..],
                    lda,
                    &bv[i * sb..],
                    ldb,
                    &mut want[i * sc..],
                    ldc,
                    accumulate,
                );
            }
            for (j, (g, w)) in ws.f32(c).iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-5,
                    "{ta} {tb} {accumulate} [{j}]: {g} vs {w}"
                );
            }
        }
    }
}

#[test]
fn gather_copies_each_chains_rows_at_its_offset() {
    for k in [1usize, 3] {
        let (n, d, b, m) = (9usize, 5usize, 7usize, 11usize);
        let mut plan = empty();
        let x = plan.buffer("x", k * b * d, Elem::F32);
        let data = plan.buffer("data", n * d, Elem::F32);
        let index = plan.buffer("index", k * m, Elem::U32);
        let ctl = plan.buffer("control", k, Elem::Control);
        plan.ops.push(Op::Gather {
            bufs: [x, data, index, ctl],
            dims: [m, b, d, k],
        });
        let mut ws = HostWorkspace::new(&plan);
        let dv = values(n * d, 4);
        ws.f32(data).copy_from_slice(&dv);
        let idx: Vec<u32> = (0..k * m).map(|i| ((i * 7 + 3) % n) as u32).collect();
        ws.u32(index).copy_from_slice(&idx);
        ws.control(ctl).copy_from_slice(&control(k, 1.0));
        host::run(&plan, &mut ws).unwrap();
        let got = ws.f32(x).to_vec();
        for c in 0..k {
            for r in 0..b {
                let row = idx[c * m + 2 * c + r] as usize;
                assert_eq!(&got[(c * b + r) * d..][..d], &dv[row * d..][..d]);
            }
        }
    }
}

/// The activations against std's: relu exactly; sigmoid and tanh through the polynomial
/// exp (2 ulp of e^x) within 3e-7 absolute, a few ulp of outputs below 1.
#[test]
fn bias_and_activation() {
    let (k, b, w, p) = (2usize, 7usize, 5usize, 40usize);
    for act in [Act::Identity, Act::Relu, Act::Sigmoid, Act::Tanh] {
        let mut plan = empty();
        let h = plan.buffer("h", k * b * w, Elem::F32);
        let theta = plan.buffer("θ", k * p, Elem::F32);
        plan.ops.push(Op::BiasAct {
            h,
            bias: theta.at(30),
            dims: [p, b, w, k],
            act,
        });
        let mut ws = HostWorkspace::new(&plan);
        let z: Vec<f32> = values(k * b * w, 5).iter().map(|v| v * 6.0).collect();
        let t = values(k * p, 6);
        ws.f32(h).copy_from_slice(&z);
        ws.f32(theta).copy_from_slice(&t);
        host::run(&plan, &mut ws).unwrap();
        for (e, &got) in ws.f32(h).iter().enumerate() {
            let (c, chain) = (e % w, e / (b * w));
            let x = z[e] + t[chain * p + 30 + c];
            let want = match act {
                Act::Identity => x,
                Act::Relu => x.max(0.0),
                Act::Sigmoid => 1.0 / (1.0 + (-x).exp()),
                Act::Tanh => x.tanh(),
            };
            let tol = if matches!(act, Act::Sigmoid | Act::Tanh) {
                3e-7
            } else {
                0.0
            };
            assert!((got - want).abs() <= tol, "{act:?} [{e}] {got} vs {want}");
        }
    }
}

/// Softmax cross-entropy against f64 softmax: the error within 2e-6·scale of
/// scale·(p − onehot) (the polynomial exp's 2 ulp and f32 sums of ≤ 10 terms), the
/// loss within 2e-6 relative, the hits exact; a label past the classes gives NaN.
#[test]
fn softmax_cross_entropy_rows() {
    for (k, classes) in [(1usize, 2usize), (3, 10), (2, 10)] {
        let (n, b, m, p) = (12usize, 7usize, 12usize, 30usize);
        let mut plan = empty();
        let z = plan.buffer("z", k * b * classes, Elem::F32);
        let delta = plan.buffer("δ", k * b * classes, Elem::F32);
        let loss = plan.buffer("loss", k * b, Elem::F32);
        let hit = plan.buffer("hit", k * b, Elem::F32);
        let labels = plan.buffer("labels", n, Elem::U32);
        let index = plan.buffer("index", k * m, Elem::U32);
        let ctl = plan.buffer("control", k, Elem::Control);
        let theta = plan.buffer("θ", k * p, Elem::F32);
        plan.ops.push(Op::SoftmaxXent {
            bufs: [z, delta, loss, hit, labels, index, ctl],
            bias: theta.at(p - classes),
            dims: [p, m, b, classes, k],
        });
        let mut ws = HostWorkspace::new(&plan);
        let zv: Vec<f32> = values(k * b * classes, 7).iter().map(|v| v * 8.0).collect();
        let tv = values(k * p, 8);
        // Labels at both edges, and one past them (row 11).
        let lv: Vec<u32> = (0..n as u32)
            .map(|i| {
                if i == 11 {
                    classes as u32
                } else {
                    [0, classes as u32 - 1, 1][i as usize % 3]
                }
            })
            .collect();
        let iv: Vec<u32> = (0..k * m).map(|i| ((i * 5 + 1) % (n - 1)) as u32).collect();
        ws.f32(z).copy_from_slice(&zv);
        ws.f32(theta).copy_from_slice(&tv);
        ws.u32(labels).copy_from_slice(&lv);
        ws.u32(index).copy_from_slice(&iv);
        let scale = 60.0;
        ws.control(ctl).copy_from_slice(&control(k, scale));
        // Row 0 of the last chain reads the label past the classes.
        ws.u32(index)[(k - 1) * m + 2 * (k - 1)] = 11;
        let iv = ws.u32(index).to_vec();
        host::run(&plan, &mut ws).unwrap();
        let (dg, lg, hg) = (
            ws.f32(delta).to_vec(),
            ws.f32(loss).to_vec(),
            ws.f32(hit).to_vec(),
        );
        for e in 0..k * b {
            let (chain, r) = (e / b, e % b);
            let y = lv[iv[chain * m + 2 * chain + r] as usize] as usize;
            let logits: Vec<f64> = (0..classes)
                .map(|j| (zv[e * classes + j] + tv[chain * p + p - classes + j]) as f64)
                .collect();
            if y >= classes {
                assert!(lg[e].is_nan(), "a label out of range gives NaN");
                continue;
            }
            let max = logits.iter().copied().fold(f64::MIN, f64::max);
            let sum: f64 = logits.iter().map(|v| (v - max).exp()).sum();
            let want_loss = max + sum.ln() - logits[y];
            assert!(
                (lg[e] as f64 - want_loss).abs() <= 2e-6 * want_loss.abs().max(1.0),
                "loss {e}"
            );
            let arg = (0..classes).fold(0, |a, j| if logits[j] > logits[a] { j } else { a });
            assert_eq!(hg[e], (arg == y) as u8 as f32);
            for j in 0..classes {
                let pj = (logits[j] - max).exp() / sum;
                let want = scale as f64 * (pj - (j == y) as u8 as f64);
                let got = dg[e * classes + j] as f64;
                assert!(
                    (got - want).abs() <= 2e-6 * scale as f64,
                    "δ[{e}][{j}] {got} vs {want}"
                );
            }
        }
    }
}

/// A held-out chunk's softmax: rows r0..r0 + b of a set of n, against f64 softmax within
/// 1e-6 absolute (the polynomial exp's 2 ulp, an f32 sum of ≤ 10 terms, one division);
/// rows outside the chunk untouched; a row whose logits overflow gives NaN, as the CPU's
/// softmax does (e^(∞ − ∞)), which the host then reports as a diverged sample.
#[test]
fn softmax_probabilities_of_a_held_out_chunk() {
    for (k, classes) in [(1usize, 2usize), (3, 10), (2, 10)] {
        let (n, r0, b, p) = (19usize, 5usize, 7usize, 30usize);
        let mut plan = empty();
        let probs = plan.buffer("probs", k * n * classes, Elem::F32);
        let z = plan.buffer("z", k * b * classes, Elem::F32);
        let theta = plan.buffer("θ", k * p, Elem::F32);
        plan.ops.push(Op::SoftmaxProbs {
            bufs: [probs, z],
            bias: theta.at(p - classes),
            dims: [p, n, r0, b, classes, k],
        });
        let mut ws = HostWorkspace::new(&plan);
        let mut zv: Vec<f32> = values(k * b * classes, 9).iter().map(|v| v * 8.0).collect();
        // The last chain's last row overflows.
        zv[(k * b - 1) * classes] = f32::MAX;
        let mut tv = values(k * p, 10);
        tv[(k - 1) * p + p - classes] = f32::MAX;
        ws.f32(z).copy_from_slice(&zv);
        ws.f32(theta).copy_from_slice(&tv);
        ws.f32(probs).fill(-1.0);
        host::run(&plan, &mut ws).unwrap();
        let got = ws.f32(probs).to_vec();
        for chain in 0..k {
            for row in 0..n {
                let out = &got[(chain * n + row) * classes..][..classes];
                if row < r0 || row >= r0 + b {
                    assert!(
                        out.iter().all(|&v| v == -1.0),
                        "row {row} outside the chunk"
                    );
                    continue;
                }
                let e = chain * b + row - r0;
                if chain == k - 1 && row == r0 + b - 1 {
                    assert!(out[0].is_nan(), "overflowing logits give NaN");
                    continue;
                }
                let logits: Vec<f64> = (0..classes)
                    .map(|j| (zv[e * classes + j] + tv[chain * p + p - classes + j]) as f64)
                    .collect();
                let max = logits.iter().copied().fold(f64::MIN, f64::max);
                let sum: f64 = logits.iter().map(|v| (v - max).exp()).sum();
                for j in 0..classes {
                    let want = (logits[j] - max).exp() / sum;
                    let diff = (out[j] as f64 - want).abs();
                    assert!(diff <= 1e-6, "p[{chain}][{row}][{j}] {} vs {want}", out[j]);
                }
            }
        }
    }
}

/// A plain reference of a row's score (`bnn_plan_score_row`), the accumulator's
/// arithmetic written out: first arg-max, ln max(p_y, 10⁻¹²), Brier sum, confidence,
/// finite.
fn score(row: &[f64], y: usize) -> [f64; SCORE] {
    // First maximum that beats every earlier value, -∞ before the first (NaN never wins).
    let (mut best, mut arg) = (f64::NEG_INFINITY, 0);
    for (j, &v) in row.iter().enumerate() {
        if v > best {
            (best, arg) = (v, j);
        }
    }
    let brier: f64 = row
        .iter()
        .enumerate()
        .map(|(j, &v)| {
            let d = v - if j == y { 1.0 } else { 0.0 };
            d * d
        })
        .sum();
    let finite = row.iter().all(|v| v.is_finite());
    [
        (arg == y) as u8 as f64,
        row[y].max(1e-12).ln(),
        brier,
        row[arg],
        finite as u8 as f64,
    ]
}

/// The ensemble's fold and tally against a plain reference over three samples: Σp and
/// ΣH bit for bit (the same f64 additions), each row's scores and the tallies (row order)
/// bit for bit, the sample count; rows not a multiple of any block, one chain and three,
/// 2 and 10 classes, labels 0 and classes − 1, a row of NaN (counted not finite, binned
/// first, as `metrics::evaluate` bins it).
#[test]
fn ensemble_fold_and_tally_match_a_plain_reference() {
    for (k, classes) in [(1usize, 2usize), (3, 10)] {
        let n = 37usize;
        let mut plan = empty();
        let sum = plan.buffer("Σp", k * n * classes, Elem::F64);
        let entropy = plan.buffer("ΣH", k * n, Elem::F64);
        let scores = plan.buffer("scores", k * 2 * n * SCORE, Elem::F64);
        let probs = plan.buffer("probs", k * n * classes, Elem::F32);
        let labels = plan.buffer("labels", n, Elem::U32);
        let samples = plan.buffer("samples", k, Elem::F64);
        let tallies = plan.buffer("tallies", k * 2 * TALLY, Elem::F64);
        plan.ops.push(Op::EnsembleFold {
            bufs: [sum, entropy, scores, probs, labels, samples],
            dims: [n, classes, k],
        });
        plan.ops.push(Op::EnsembleTally {
            bufs: [tallies, samples, scores],
            dims: [n, k],
        });
        let mut ws = HostWorkspace::new(&plan);
        let y: Vec<u32> = (0..n)
            .map(|r| match r % 3 {
                0 => 0,
                1 => classes as u32 - 1,
                _ => (r % classes) as u32,
            })
            .collect();
        ws.u32(labels).copy_from_slice(&y);
        let (mut want_sum, mut want_h) = (vec![0f64; k * n * classes], vec![0f64; k * n]);
        for sample in 0..3u64 {
            // Softmax-like rows: positive, normalised in f32; one exactly 1 (p ln p = 0),
            // and in the second sample chain 0's row 4 all NaN.
            let mut pv: Vec<f32> = values(k * n * classes, 20 + sample)
                .iter()
                .map(|v| (v * 3.0).exp())
                .collect();
            for row in pv.chunks_exact_mut(classes) {
                let s: f32 = row.iter().sum();
                row.iter_mut().for_each(|v| *v /= s);
            }
            pv[5 * classes..6 * classes].fill(0.0);
            pv[5 * classes + 1] = 1.0;
            if sample == 1 {
                pv[4 * classes..5 * classes].fill(f32::NAN);
            }
            ws.f32(probs).copy_from_slice(&pv);
            host::run(&plan, &mut ws).unwrap();
            for (s, &p) in want_sum.iter_mut().zip(&pv) {
                *s += p as f64;
            }
            for (h, row) in want_h.iter_mut().zip(pv.chunks_exact(classes)) {
                let e: f64 = row
                    .iter()
                    .filter(|&&p| p > 0.0)
                    .map(|&p| p as f64 * (p as f64).ln())
                    .sum();
                *h += -e;
            }
            let same = |a: &[f64], b: &[f64]| {
                a.iter()
                    .zip(b)
                    .all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
            };
            let count = (sample + 1) as f64;
            assert_eq!(ws.f64(samples).to_vec(), vec![count; k], "samples counted");
            assert!(
                same(ws.f64(sum), &want_sum),
                "Σp, {k} chains, {classes} classes"
            );
            let got_h = ws.f64(entropy).to_vec();
            assert!(same(&got_h, &want_h), "ΣH");
            let got_scores = ws.f64(scores).to_vec();
            let got_tallies = ws.f64(tallies).to_vec();
            for chain in 0..k {
                for (which, mean) in [(0, false), (1, true)] {
                    let mut t = [0f64; TALLY];
                    for (r, &label) in y.iter().enumerate() {
                        let e = chain * n + r;
                        let row: Vec<f64> = match mean {
                            false => pv[e * classes..][..classes]
                                .iter()
                                .map(|&p| p as f64)
                                .collect(),
                            true => want_sum[e * classes..][..classes]
                                .iter()
                                .map(|s| s / count)
                                .collect(),
                        };
                        let sc = score(&row, label as usize);
                        let at = ((chain * 2 + which) * n + r) * SCORE;
                        assert!(
                            same(&got_scores[at..at + SCORE], &sc),
                            "score of row {r}: {:?} vs {sc:?}",
                            &got_scores[at..at + SCORE]
                        );
                        t[0] += sc[0];
                        t[1] -= sc[1];
                        t[2] += sc[2];
                        t[3] += 1.0 - sc[4];
                        let b = ((sc[3] * ECE_BINS as f64).ceil() as usize).clamp(1, ECE_BINS) - 1;
                        t[4 + b] += 1.0;
                        t[4 + ECE_BINS + b] += sc[3];
                        t[4 + 2 * ECE_BINS + b] += sc[0];
                    }
                    let at = (chain * 2 + which) * TALLY;
                    assert!(
                        same(&got_tallies[at..at + TALLY], &t),
                        "tally {chain} {which}"
                    );
                    // The sample alone has its NaN row in sample 1 only; the ensemble's
                    // mean keeps it from then on.
                    let nan_in = chain == 0 && if mean { sample >= 1 } else { sample == 1 };
                    assert_eq!(t[3], nan_in as u8 as f64, "rows not finite, {which}");
                }
            }
        }
    }
}

/// The error's column sums and the activation's derivative: the same f32 operations in
/// the same order as the reference loop, so bit for bit.
#[test]
fn backward_columns_sum_rows_in_order() {
    let (k, b, w, p) = (3usize, 7usize, 5usize, 50usize);
    for act in [Act::Identity, Act::Relu, Act::Sigmoid, Act::Tanh] {
        let mut plan = empty();
        let delta = plan.buffer("δ", k * b * w, Elem::F32);
        let a = plan.buffer("h", k * b * w, Elem::F32);
        let grad = plan.buffer("∇", k * p, Elem::F32);
        let a_buf = if act == Act::Identity { delta } else { a };
        plan.ops.push(Op::BackwardColumns {
            bufs: [delta, a_buf],
            grad_bias: grad.at(10),
            dims: [p, b, w, k],
            act,
        });
        let mut ws = HostWorkspace::new(&plan);
        let dv = values(k * b * w, 9);
        let av: Vec<f32> = values(k * b * w, 10)
            .iter()
            .map(|v| v.abs() * 0.9)
            .collect();
        ws.f32(delta).copy_from_slice(&dv);
        ws.f32(a).copy_from_slice(&av);
        host::run(&plan, &mut ws).unwrap();
        let (dg, gg) = (ws.f32(delta).to_vec(), ws.f32(grad).to_vec());
        for chain in 0..k {
            for c in 0..w {
                let mut sum = 0f32;
                for r in 0..b {
                    let i = (chain * b + r) * w + c;
                    let (d, x) = (dv[i], av[i]);
                    let want = match act {
                        Act::Identity => d,
                        Act::Relu => {
                            if x > 0.0 {
                                d
                            } else {
                                0.0
                            }
                        }
                        Act::Sigmoid => d * (x * (1.0 - x)),
                        Act::Tanh => d * (1.0 - x * x),
                    };
                    assert_eq!(dg[i].to_bits(), want.to_bits(), "{act:?} δ[{i}]");
                    sum += want;
                }
                assert_eq!(
                    gg[chain * p + 10 + c].to_bits(),
                    sum.to_bits(),
                    "{act:?} ∇b"
                );
            }
        }
    }
}

/// The loss sums: the rows' f32 losses added in f64 in row order; a NaN row halts its
/// chain alone and leaves its epoch sums as they were.
#[test]
fn loss_sums_and_the_halt() {
    let (k, b) = (2usize, 7usize);
    let mut plan = empty();
    let loss = plan.buffer("loss", k * b, Elem::F32);
    let hit = plan.buffer("hit", k * b, Elem::F32);
    let ctl = plan.buffer("control", k, Elem::Control);
    plan.ops.push(Op::ReduceLoss {
        bufs: [loss, hit, ctl],
        dims: [b, k],
        gaussian: false,
    });
    let mut ws = HostWorkspace::new(&plan);
    let mut lv: Vec<f32> = values(k * b, 11).iter().map(|v| v.abs()).collect();
    lv[b + 3] = f32::NAN;
    ws.f32(loss).copy_from_slice(&lv);
    ws.f32(hit).copy_from_slice(&[
        1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0,
    ]);
    ws.control(ctl).copy_from_slice(&control(k, 1.0));
    host::run(&plan, &mut ws).unwrap();
    let c = ws.control(ctl).to_vec();
    let want: f64 = lv[..b].iter().fold(0.0, |a, &v| a + v as f64) / b as f64;
    assert_eq!(c[0].nll.to_bits(), want.to_bits());
    assert_eq!(
        (c[0].halted, c[0].epoch_nll, c[0].epoch_correct),
        (0, want * b as f64, 4.0)
    );
    assert!(c[1].nll.is_nan());
    assert_eq!(
        (c[1].halted, c[1].epoch_nll, c[1].epoch_correct),
        (1, 0.0, 0.0)
    );
}

/// A plan of the fused update and its finish over tensors of `sizes`, K chains, epochs of
/// `u` updates (its η table the last buffer).
fn update_plan(
    sizes: &[usize],
    update: Update,
    k: usize,
    u: usize,
) -> (Plan, [Buf; 8], TensorTable) {
    let table = TensorTable::new(sizes, update.rule()).unwrap();
    let p = table.p as usize;
    let mut plan = empty();
    let theta = plan.buffer("θ", k * p, Elem::F32);
    let grad = plan.buffer("∇", k * p, Elem::F32);
    let tab = plan.buffer("table", 1, Elem::Table);
    let partials = plan.buffer("partials", k * table.chunks() * 3, Elem::F64);
    let ctl = plan.buffer("control", k, Elem::Control);
    let v = plan.buffer("v", k * p, Elem::F32);
    let s1 = plan.buffer("s", k * p, Elem::F32);
    let etas = plan.buffer("η", k * u, Elem::F64);
    let (hv, hs) = update.states();
    plan.ops.push(Op::Update {
        bufs: [theta, grad, tab, partials, ctl],
        states: (hv.then_some(v), hs.then_some(s1)),
        dims: [k, table.chunks()],
    });
    plan.ops.push(Op::Finish {
        bufs: [ctl, partials, tab, etas],
        dims: [4, k, u],
    });
    (plan, [theta, grad, tab, partials, ctl, v, s1, etas], table)
}

/// The fused update of the plan, tensor by tensor, is the header's update of each tensor
/// alone (`crate::host::update`, the CUDA kernels' own element loop) on ∇ + (λ/T)θ, bit
/// for bit in θ, v and αᵢ or Vᵢ, for every rule, tensors of lengths that fill no chunk
/// and several chunks, one chain and three; the sums to 1e-12 relative (tree against
/// element order); a halted chain does not move.
#[test]
fn the_fused_update_is_each_tensors_update() {
    let sizes = [3usize, 1030, 4097, 10];
    let rules = [
        Update::Sgld,
        Update::Momentum,
        Update::Thermostat { splitting: false },
        Update::Thermostat { splitting: true },
        Update::Preconditioned,
    ];
    for update in rules {
        for k in [1usize, 3] {
            // An epoch of one update: the finish keeps η (the table's next is past it).
            let (plan, [theta, grad, tab, _, ctl, v, s1, _], table) =
                update_plan(&sizes, update, k, 1);
            let p = table.p as usize;
            let mut ws = HostWorkspace::new(&plan);
            *ws.table(tab) = table;
            let (t0, g0) = (values(k * p, 12), values(k * p, 13));
            let v0: Vec<f32> = values(k * p, 14).iter().map(|x| x * 0.01).collect();
            let s0: Vec<f32> = values(k * p, 15).iter().map(|x| x.abs() * 0.01).collect();
            ws.f32(theta).copy_from_slice(&t0);
            ws.f32(grad).copy_from_slice(&g0);
            ws.f32(v).copy_from_slice(&v0);
            ws.f32(s1).copy_from_slice(&s0);
            let mut blocks = control(k, 1.0);
            let consts = match update {
                Update::Preconditioned => StepConsts::preconditioned(1e-3, 0.99, 1e-2),
                _ => StepConsts::new(1e-3, 0.1, 0.03),
            };
            for (i, c) in blocks.iter_mut().enumerate() {
                c.consts = [
                    consts.step_size,
                    consts.decay,
                    consts.post,
                    consts.noise_scale,
                ];
                c.prior = [0.5 + i as f32; MAX_TENSORS];
                c.eta = 1e-3;
                c.n_params = p as f64;
            }
            blocks[k - 1].halted = (k > 1) as u32;
            ws.control(ctl).copy_from_slice(&blocks);
            host::run(&plan, &mut ws).unwrap();
            let after = ws.control(ctl).to_vec();
            for chain in 0..k {
                let (mut t, mut vv, mut ss) = (t0.clone(), v0.clone(), s0.clone());
                let halted = blocks[chain].halted == 1;
                for (i, &n) in sizes.iter().enumerate() {
                    let at = chain * p + table.offsets[i] as usize;
                    let r = at..at + n;
                    let g: Vec<f32> = g0[r.clone()]
                        .iter()
                        .zip(&t0[r.clone()])
                        .map(|(&g, &x)| g + blocks[chain].prior[i] * x)
                        .collect();
                    let key = NoiseKey {
                        seed: blocks[chain].seed,
                        step: blocks[chain].step,
                        param: i as u32,
                    };
                    let sums = crate::host::update(
                        update,
                        &mut t[r.clone()],
                        &mut vv[r.clone()],
                        &mut ss[r.clone()],
                        &g,
                        key,
                        consts,
                    );
                    if halted {
                        continue;
                    }
                    let got = after[chain].sums[i];
                    for (j, want) in [sums.sum_sq, sums.sum_thermostat, sums.virial]
                        .iter()
                        .enumerate()
                    {
                        assert!(
                            (got[j] - want).abs() <= 1e-12 * want.abs().max(1e-300),
                            "{update:?} sums {i} {j}"
                        );
                    }
                }
                let span = chain * p..(chain + 1) * p;
                let (want_t, want_v, want_s) = match halted {
                    true => (&t0, &v0, &s0),
                    false => (&t, &vv, &ss),
                };
                let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&ws.f32(theta)[span.clone()]),
                    bits(&want_t[span.clone()]),
                    "{update:?} θ k={chain}"
                );
                assert_eq!(
                    bits(&ws.f32(v)[span.clone()]),
                    bits(&want_v[span.clone()]),
                    "{update:?} v"
                );
                assert_eq!(
                    bits(&ws.f32(s1)[span.clone()]),
                    bits(&want_s[span.clone()]),
                    "{update:?} s"
                );
                assert_eq!(after[chain].step, blocks[chain].step + (!halted) as u64);
            }
        }
    }
}

/// The finish's bookkeeping: SGNHT's α ← α + vᵀv/n − η, the kinetic energy, the offset
/// moved by B, and the next constants as `StepConsts::{new, splitting}` form them.
#[test]
fn finish_moves_the_thermostat_and_forms_the_next_constants() {
    let sizes = [1030usize, 7];
    for splitting in [false, true] {
        let (plan, [theta, grad, tab, _, ctl, v, _, _], table) =
            update_plan(&sizes, Update::Momentum, 1, 1);
        let p = table.p as usize;
        let mut ws = HostWorkspace::new(&plan);
        *ws.table(tab) = table;
        ws.f32(theta).copy_from_slice(&values(p, 16));
        ws.f32(grad).copy_from_slice(&values(p, 17));
        ws.f32(v).copy_from_slice(&values(p, 18));
        let mut c = control(1, 1.0)[0];
        (c.eta, c.eta_v) = (2e-3, 2e-3);
        c.diffusion = 0.05;
        c.thermostat = 0.2;
        c.n_params = p as f64;
        c.sampler = Bookkeeping::Sgnht as u32;
        c.splitting = splitting as u32;
        host::next_consts(&mut c);
        ws.control(ctl)[0] = c;
        host::run(&plan, &mut ws).unwrap();
        let got = ws.control(ctl)[0];
        let sum_sq = got.sums[0][0] + got.sums[1][0];
        let alpha = 0.2 + sum_sq / p as f64 - 2e-3;
        assert_eq!(got.thermostat.to_bits(), alpha.to_bits());
        assert_eq!(got.kinetic, 0.5 * sum_sq / (p as f64 * 2e-3));
        assert_eq!((got.offset, got.step), (c.offset + 4, c.step + 1));
        let sigma = (2.0 * 0.05 * 2e-3f64).sqrt();
        let want = match splitting {
            false => StepConsts::new(2e-3, alpha, sigma),
            true => StepConsts::splitting(2e-3, alpha, sigma),
        };
        assert_eq!(
            got.consts,
            [want.step_size, want.decay, want.post, want.noise_scale]
        );
    }
}

/// The epoch's η table: after each update the finish takes the next update's η from it
/// (not past the epoch's end), forms its constants, and √(η/η_v) as v's factor, which the
/// next update applies before its step as an f32 product: bit for bit the update of v
/// rescaled on the host first (what `Dynamics::set_step_size` does). A chain whose η
/// stays keeps the factor 1.
#[test]
fn the_eta_table_moves_eta_and_rescales_the_momentum() {
    let sizes = [1030usize, 7];
    let (k, u) = (2usize, 3usize);
    let (plan, [theta, grad, tab, _, ctl, v, _, etas], table) =
        update_plan(&sizes, Update::Momentum, k, u);
    let p = table.p as usize;
    let mut ws = HostWorkspace::new(&plan);
    *ws.table(tab) = table;
    ws.f32(theta).copy_from_slice(&values(k * p, 26));
    ws.f32(grad).copy_from_slice(&values(k * p, 27));
    ws.f32(v).copy_from_slice(&values(k * p, 28));
    ws.f64(etas)
        .copy_from_slice(&[1e-3, 4e-3, 2e-3, 1e-3, 1e-3, 1e-3]);
    for c in ws.control(ctl).iter_mut() {
        (c.eta, c.eta_v, c.friction) = (1e-3, 1e-3, 0.1);
        c.n_params = p as f64;
        c.sampler = Bookkeeping::Sghmc as u32;
        host::next_consts(c);
    }
    host::run(&plan, &mut ws).unwrap();
    let [c0, c1] = [ws.control(ctl)[0], ws.control(ctl)[1]];
    assert_eq!((c0.eta, c0.eta_v, c0.rescale), (4e-3, 1e-3, 2.0));
    assert_eq!((c1.eta, c1.rescale), (1e-3, 1.0));
    let want = StepConsts::new(4e-3, 0.1, (2.0 * 0.1 * 4e-3f64).sqrt());
    assert_eq!(
        c0.consts,
        [want.step_size, want.decay, want.post, want.noise_scale]
    );
    // The same state with v rescaled on the host and a factor of 1: the same update.
    let mut host_scaled = ws.clone();
    for x in &mut host_scaled.f32(v)[..p] {
        *x *= c0.rescale;
    }
    host_scaled.control(ctl)[0].rescale = 1.0;
    host::run(&plan, &mut ws).unwrap();
    host::run(&plan, &mut host_scaled).unwrap();
    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    for b in [theta, v] {
        assert_eq!(bits(ws.f32(b)), bits(host_scaled.f32(b)));
    }
    assert_eq!(ws.control(ctl)[0].eta, 2e-3);
    // The epoch's last update: η stays (the next epoch's table is the host's to write).
    host::run(&plan, &mut ws).unwrap();
    assert_eq!(
        (ws.control(ctl)[0].eta, ws.control(ctl)[0].updates),
        (2e-3, 3)
    );
}

/// A Gaussian likelihood's rows: f = z + b, the error (s·τ)·(f − y) and the residual as
/// the CPU's `gaussian_error` forms them (the same f32 operations: bit for bit), then
/// the loss sums: ½τ·Σr² (in f64, row order) + the constant, over B.
#[test]
fn gaussian_rows_and_their_loss() {
    let (k, n, b, m, p) = (2usize, 10usize, 7usize, 12usize, 20usize);
    let mut plan = empty();
    let z = plan.buffer("z", k * b, Elem::F32);
    let delta = plan.buffer("δ", k * b, Elem::F32);
    let loss = plan.buffer("loss", k * b, Elem::F32);
    let hit = plan.buffer("hit", k * b, Elem::F32);
    let targets = plan.buffer("targets", n, Elem::F32);
    let index = plan.buffer("index", k * m, Elem::U32);
    let ctl = plan.buffer("control", k, Elem::Control);
    let theta = plan.buffer("θ", k * p, Elem::F32);
    plan.ops.push(Op::Gaussian {
        bufs: [z, delta, loss, hit, targets, index, ctl],
        bias: theta.at(p - 1),
        dims: [p, m, b, k],
    });
    plan.ops.push(Op::ReduceLoss {
        bufs: [loss, hit, ctl],
        dims: [b, k],
        gaussian: true,
    });
    let mut ws = HostWorkspace::new(&plan);
    let (zv, tv, yv) = (values(k * b, 19), values(k * p, 20), values(n, 21));
    let iv: Vec<u32> = (0..k * m).map(|i| ((i * 3 + 2) % n) as u32).collect();
    ws.f32(z).copy_from_slice(&zv);
    ws.f32(theta).copy_from_slice(&tv);
    ws.f32(targets).copy_from_slice(&yv);
    ws.u32(index).copy_from_slice(&iv);
    let mut blocks = control(k, 8.0);
    for c in &mut blocks {
        c.precision = 2.5;
        c.nll_const = 0.3;
    }
    ws.control(ctl).copy_from_slice(&blocks);
    host::run(&plan, &mut ws).unwrap();
    let (dg, after) = (ws.f32(delta).to_vec(), ws.control(ctl).to_vec());
    for chain in 0..k {
        let mut sse = 0f64;
        for r in 0..b {
            let e = chain * b + r;
            let y = yv[iv[chain * m + 2 * chain + r] as usize];
            let res = (zv[e] + tv[chain * p + p - 1]) - y;
            assert_eq!(dg[e].to_bits(), ((8.0f32 * 2.5f32) * res).to_bits());
            sse += res as f64 * res as f64;
        }
        let want = (0.5 * 2.5 * sse + 0.3) / b as f64;
        assert_eq!(after[chain].nll.to_bits(), want.to_bits());
        assert_eq!(after[chain].epoch_sse, sse);
    }
}
