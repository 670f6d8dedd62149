//! The fused CPU op against (a) the host build of the CUDA kernels' header, bit for bit,
//! and (b) the composed candle-op samplers, to 1e-6 relative with the same noise.

use bnn::engine::dynamics::Dynamics;
use bnn::kernels::{cpu, host, StepConsts, Update};
use bnn::rng::NoiseKey;
use bnn::sampler::{self, Kernel, Sampler, SamplerConfig, SamplerKind};
use candle_core::{Device, Tensor, Var};
use rand::{Rng, SeedableRng};

fn random(n: usize, scale: f32, rng: &mut impl Rng) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-scale..scale)).collect()
}

/// Lengths that cover a partial Philox block, a partial tile, several rayon chunks.
const LENGTHS: [usize; 5] = [1, 7, 257, 4099, 3 * cpu::CHUNK + 5];

#[test]
fn header_normals_equal_rust_normals() {
    for seed in [0u64, 1, 0xdead_beef_cafe] {
        for (step, param) in [(0u64, 0u32), (7, 3), (u64::MAX - 1, 9)] {
            let key = NoiseKey { seed, step, param };
            let mut a = vec![0f32; 1031];
            let mut b = vec![0f32; 1031];
            key.fill(&mut a);
            host::normals(key, &mut b);
            assert_eq!(
                a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                b.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                "seed {seed} step {step} param {param}"
            );
        }
    }
}

#[test]
fn header_step_equals_cpu_op_bit_for_bit() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let cases = [
        (Update::Sgld, StepConsts::new(1e-3, 0.0, (2e-3f64).sqrt())),
        (
            Update::Momentum,
            StepConsts::new(2e-6, 0.1, (2.0 * 0.1 * 2e-6f64).sqrt()),
        ),
        (Update::Momentum, StepConsts::new(0.01, 0.37, 0.05)),
        (Update::Momentum, StepConsts::splitting(2e-6, 0.1, 6e-4)),
    ];
    for (update, c) in cases {
        for n in LENGTHS {
            for seed in [3u64, 99] {
                let key = NoiseKey {
                    seed,
                    step: 12,
                    param: 2,
                };
                let theta = random(n, 1.0, &mut rng);
                let v = random(n, 0.01, &mut rng);
                let g = random(n, 100.0, &mut rng);
                let theta_in = theta.clone();
                let (mut t1, mut v1) = (theta.clone(), v.clone());
                let (mut t2, mut v2) = (theta, v);
                let (m1, m2): (&mut [f32], &mut [f32]) = match update {
                    Update::Sgld => (&mut [], &mut []),
                    Update::Momentum => (&mut v1, &mut v2),
                    Update::Thermostat { .. } | Update::Preconditioned => {
                        unreachable!("tested on their own")
                    }
                };
                let s1 = cpu::step(update, &mut t1, m1, &mut [], &g, key, c);
                let s2 = host::update(update, &mut t2, m2, &mut [], &g, key, c);
                let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&t1),
                    bits(&t2),
                    "{update:?} n={n} seed={seed}: positions"
                );
                assert_eq!(
                    bits(&v1),
                    bits(&v2),
                    "{update:?} n={n} seed={seed}: momenta"
                );
                assert!(
                    (s1.sum_sq - s2.sum_sq).abs() <= 1e-12 * s2.sum_sq.abs().max(1e-30),
                    "Σv²: {s1:?} vs {s2:?}"
                );
                // The virial, a sum of terms of both signs: to rounding of Σ|θ·∇|.
                let scale: f64 = theta_in
                    .iter()
                    .zip(&g)
                    .map(|(&t, &g)| (t * g).abs() as f64)
                    .sum();
                assert!(
                    (s1.virial - s2.virial).abs() <= 1e-12 * scale,
                    "Σθ·∇: {s1:?} vs {s2:?}"
                );
            }
        }
    }
}

/// The header's pSGLD update (the CUDA kernel's element math) against the CPU op's: θ and
/// V bit for bit (√ and ÷ are correctly rounded on both), from V = 0 (the first step,
/// where G = 1/(λ + √(1 − β)|g|)) and from V spread over eight decades, with gradients
/// from 10⁻⁴ to 10⁴ so that λ matters in some elements and not in others.
#[test]
fn header_preconditioned_step_equals_cpu_op_bit_for_bit() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(13);
    for (eta, beta, lambda) in [(1e-4f64, 0.99, 1e-5), (3e-3, 0.9, 1e-2)] {
        let c = StepConsts::preconditioned(eta, beta, lambda);
        for n in LENGTHS {
            for start_at_zero in [true, false] {
                let key = NoiseKey {
                    seed: 5,
                    step: 3,
                    param: 4,
                };
                let theta = random(n, 1.0, &mut rng);
                let g: Vec<f32> = (0..n)
                    .map(|_| rng.random_range(-1f32..1.0) * 10f32.powf(rng.random_range(-4.0..4.0)))
                    .collect();
                let v: Vec<f32> = (0..n)
                    .map(|_| match start_at_zero {
                        true => 0.0,
                        false => 10f32.powf(rng.random_range(-6.0..2.0)),
                    })
                    .collect();
                let (mut t1, mut v1) = (theta.clone(), v.clone());
                let (mut t2, mut v2) = (theta, v);
                let update = Update::Preconditioned;
                let s1 = cpu::step(update, &mut t1, &mut [], &mut v1, &g, key, c);
                let s2 = host::update(update, &mut t2, &mut [], &mut v2, &g, key, c);
                let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                let case = format!("eta={eta} n={n} from zero {start_at_zero}");
                assert!(t1.iter().all(|t| t.is_finite()), "{case}: θ finite");
                assert_eq!(bits(&t1), bits(&t2), "{case}: positions");
                assert_eq!(bits(&v1), bits(&v2), "{case}: second moments");
                assert_eq!((s1.sum_sq, s2.sum_sq), (0.0, 0.0), "{case}: no momentum");
            }
        }
    }
}

/// The header's mSGNHT update (the CUDA kernel's element math) against the CPU op's,
/// Euler and splitting: θ, v and α bit for bit (the splitting's e^{−α/2} by the same
/// polynomial on both), the sums to rounding (summed in another order). Thermostats
/// spread over [−0.5, 2] so that the damping polynomial sees every range it meets.
#[test]
fn header_thermostat_step_equals_cpu_op_bit_for_bit() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    for splitting in [false, true] {
        for (eta, sigma) in [(4e-7f64, (2.0 * 0.01 * 4e-7f64).sqrt()), (0.01, 0.05)] {
            let c = StepConsts::new(eta, 0.0, sigma);
            for n in LENGTHS {
                let key = NoiseKey {
                    seed: 7,
                    step: 40,
                    param: 1,
                };
                let theta = random(n, 1.0, &mut rng);
                let v = random(n, 0.01, &mut rng);
                let g = random(n, 100.0, &mut rng);
                let alpha: Vec<f32> = (0..n).map(|_| rng.random_range(-0.5..2.0)).collect();
                let scale: f64 = theta
                    .iter()
                    .zip(&g)
                    .map(|(&t, &g)| (t * g).abs() as f64)
                    .sum();
                let (mut t1, mut v1, mut a1) = (theta.clone(), v.clone(), alpha.clone());
                let (mut t2, mut v2, mut a2) = (theta, v, alpha);
                let update = Update::Thermostat { splitting };
                let s1 = cpu::step(update, &mut t1, &mut v1, &mut a1, &g, key, c);
                let s2 = host::update(update, &mut t2, &mut v2, &mut a2, &g, key, c);
                let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                let case = format!("splitting={splitting} eta={eta} n={n}");
                assert_eq!(bits(&t1), bits(&t2), "{case}: positions");
                assert_eq!(bits(&v1), bits(&v2), "{case}: momenta");
                assert_eq!(bits(&a1), bits(&a2), "{case}: thermostats");
                for (x, y) in [
                    (s1.sum_sq, s2.sum_sq),
                    (s1.sum_thermostat, s2.sum_thermostat),
                ] {
                    assert!(
                        (x - y).abs() <= 1e-9 * y.abs().max(1e-30),
                        "{case}: {x} vs {y}"
                    );
                }
                assert!(
                    (s1.virial - s2.virial).abs() <= 1e-12 * scale,
                    "{case}: Σθ·∇ {} vs {}",
                    s1.virial,
                    s2.virial
                );
            }
        }
    }
}

/// Runs `f` inside a job of the step's thread pool, where nested parallel regions run
/// their parts one after another on a single thread (`pool`).
fn on_one_thread<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    let f = std::sync::Mutex::new(Some(f));
    let out = std::sync::Mutex::new(None);
    bnn::pool::run(2, &|part| {
        if part == 0 {
            let f = f.lock().unwrap().take().unwrap();
            *out.lock().unwrap() = Some(f());
        }
    });
    out.into_inner().unwrap().unwrap()
}

/// The fused op gives the same bits on one thread as on all of the pool's (2 on the CI
/// machine; with one core both runs are serial and the test cannot tell them apart).
#[test]
fn cpu_op_is_independent_of_thread_count() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(8);
    let n = 5 * cpu::CHUNK + 3;
    let theta = random(n, 1.0, &mut rng);
    let v = random(n, 0.01, &mut rng);
    let g = random(n, 10.0, &mut rng);
    let c = StepConsts::new(1e-4, 0.1, 0.004);
    let key = NoiseKey {
        seed: 1,
        step: 2,
        param: 3,
    };
    let run = || {
        let (mut t, mut m) = (theta.clone(), v.clone());
        let s = cpu::step(Update::Momentum, &mut t, &mut m, &mut [], &g, key, c);
        (t, m, s)
    };
    let (t1, m1, s1) = on_one_thread(run);
    let (t2, m2, s2) = run();
    assert_eq!(t1, t2);
    assert_eq!(m1, m2);
    assert_eq!(s1.sum_sq.to_bits(), s2.sum_sq.to_bits());
    assert_eq!(s1.virial.to_bits(), s2.virial.to_bits());
}

/// Σ of `x` in the order the fused op promises: eight f64 lanes per tile of 256 (then
/// the lanes added), tiles added from zero within each chunk of `cpu::CHUNK`, chunks
/// added in order. Written out here so that a change of the op's split cannot move it.
fn chunk_ordered_sum(x: &[f32]) -> f64 {
    let tile = |t: &[f32]| {
        let mut lanes = [0f64; 8];
        for (i, &v) in t.iter().enumerate() {
            lanes[i % 8] += v as f64;
        }
        lanes.iter().sum::<f64>()
    };
    let chunk = |c: &[f32]| c.chunks(256).fold(0.0, |s, t| s + tile(t));
    x.chunks(cpu::CHUNK).map(chunk).sum()
}

/// Σv², Σα and Σθ·∇ come out in that fixed order, bit for bit, whatever the op's parts (these
/// lengths are split into parts that do not fall on chunk boundaries: 2.4 chunks is four
/// parts on two threads), on the pool and on one thread.
#[test]
fn sums_follow_the_fixed_chunk_order() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(12);
    let c = StepConsts::new(1e-4, 0.1, 0.004);
    let key = NoiseKey {
        seed: 4,
        step: 9,
        param: 1,
    };
    for n in [78_400, 5 * cpu::CHUNK + 3, 2 * cpu::CHUNK + 100] {
        let theta = random(n, 1.0, &mut rng);
        let v = random(n, 0.01, &mut rng);
        let g = random(n, 10.0, &mut rng);
        let alpha: Vec<f32> = (0..n).map(|_| rng.random_range(-0.5..2.0)).collect();
        let momentum = || {
            let (mut t, mut m) = (theta.clone(), v.clone());
            let s = cpu::step(Update::Momentum, &mut t, &mut m, &mut [], &g, key, c);
            (s, m)
        };
        // θ·∇ per element, as the op forms it before the update.
        let products: Vec<f32> = theta.iter().zip(&g).map(|(&t, &g)| t * g).collect();
        let virial = chunk_ordered_sum(&products).to_bits();
        for (s, m) in [momentum(), on_one_thread(momentum)] {
            let squares: Vec<f32> = m.iter().map(|v| v * v).collect();
            let want = chunk_ordered_sum(&squares).to_bits();
            assert_eq!(s.sum_sq.to_bits(), want, "n={n}");
            assert_eq!(s.virial.to_bits(), virial, "n={n}");
        }
        let thermostat = || {
            let (mut t, mut m, mut a) = (theta.clone(), v.clone(), alpha.clone());
            let s = cpu::step(
                Update::Thermostat { splitting: false },
                &mut t,
                &mut m,
                &mut a,
                &g,
                key,
                c,
            );
            (s, m, a)
        };
        for (s, m, a) in [thermostat(), on_one_thread(thermostat)] {
            let squares: Vec<f32> = m.iter().map(|v| v * v).collect();
            let want = chunk_ordered_sum(&squares).to_bits();
            assert_eq!(s.sum_sq.to_bits(), want, "n={n}");
            assert_eq!(s.sum_thermostat.to_bits(), chunk_ordered_sum(&a).to_bits());
            assert_eq!(s.virial.to_bits(), virial, "n={n}");
        }
    }
}

/// The update inside the weight gradient's product (first layer of 784-400-400-10 at
/// batch 100, zero inputs skipped) gives the same θ, v and Σv² on one thread as on all.
#[test]
fn inline_update_is_independent_of_thread_count() {
    use bnn::kernels::gemm::{product_then_update, updates_inline, Mat, NonZero, Zeros};
    use bnn::kernels::InlineUpdate;
    if !updates_inline(784) {
        return; // no AVX-512: the separate pass runs instead (tested above)
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let (m, n, k) = (400, 784, 100);
    let delta = random(k * m, 1.0, &mut rng);
    let x: Vec<f32> = random(k * n, 1.0, &mut rng)
        .into_iter()
        .map(|v| if v.abs() < 0.8 { 0.0 } else { v })
        .collect();
    let mut zx = NonZero::default();
    zx.record(&x, k, n);
    let theta = random(m * n, 0.1, &mut rng);
    let v = random(m * n, 0.01, &mut rng);
    let key = NoiseKey {
        seed: 5,
        step: 6,
        param: 0,
    };
    let run = || {
        let (mut t, mut mo) = (theta.clone(), v.clone());
        let (mut scratch, mut rows) = (vec![0f32; m * n], Vec::new());
        let step = InlineUpdate {
            update: Update::Momentum,
            consts: StepConsts::new(1e-4, 0.1, 0.004),
            key,
            momentum: &mut mo,
        };
        let s = product_then_update(
            m,
            n,
            k,
            &mut scratch,
            Mat::transposed(&delta, m),
            Mat::rows(&x, n),
            Zeros::Rhs(&zx),
            &mut t,
            0.5,
            step,
            &mut rows,
        );
        (t, mo, s)
    };
    let (t1, m1, s1) = on_one_thread(run);
    let (t2, m2, s2) = run();
    assert_eq!(t1, t2);
    assert_eq!(m1, m2);
    assert_eq!(s1.sum_sq.to_bits(), s2.sum_sq.to_bits());
    assert_eq!(s1.virial.to_bits(), s2.virial.to_bits());
}

fn params(rng: &mut impl Rng) -> (Vec<Var>, Vec<Tensor>) {
    let shapes: [&[usize]; 3] = [&[37, 11], &[11], &[4099]];
    let mut ps = Vec::new();
    let mut gs = Vec::new();
    for s in shapes {
        let n: usize = s.iter().product();
        ps.push(
            Var::from_tensor(&Tensor::from_vec(random(n, 1.0, rng), s, &Device::Cpu).unwrap())
                .unwrap(),
        );
        gs.push(Tensor::from_vec(random(n, 1000.0, rng), s, &Device::Cpu).unwrap());
    }
    (ps, gs)
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    let a = a.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let b = b.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
}

fn max_rel_diff(a: &Tensor, b: &Tensor) -> f32 {
    let a = a.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let b = b.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs() / x.abs().max(y.abs()).max(1e-6))
        .fold(0f32, f32::max)
}

/// Five steps of every fusable sampler: fused and composed agree to 1e-6 relative, with the
/// same noise (both draw it from the same Philox stream).
#[test]
fn fused_equals_composed_reference() {
    use bnn::sampler::Integrator::{Euler, Splitting};
    for (kind, friction, diffusion, integrator) in [
        (SamplerKind::Sgld, 0.0, 0.0, Euler),
        (SamplerKind::Sghmc, 0.1, 0.0, Euler),
        (SamplerKind::Sgnht, 0.0, 0.1, Euler),
        (SamplerKind::Sghmc, 0.1, 0.0, Splitting),
        (SamplerKind::Sgnht, 0.0, 0.1, Splitting),
        (SamplerKind::Msgnht, 0.0, 0.1, Euler),
        (SamplerKind::Msgnht, 0.0, 0.1, Splitting),
        (SamplerKind::Psgld, 0.0, 0.0, Euler),
    ] {
        for seed in [0u64, 17, 123_456] {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let config = SamplerConfig {
                kind,
                step_size: 2e-5,
                friction,
                noise_estimate: 0.0,
                diffusion,
                integrator,
                rms_decay: None,
                rms_damping: None,
            }
            .params()
            .unwrap();
            let (pa, grads) = params(&mut rng);
            let pb: Vec<Var> = pa
                .iter()
                .map(|p| Var::from_tensor(&p.as_tensor().copy().unwrap()).unwrap())
                .collect();
            let mut a = sampler::build_with(config, &pa, seed, Kernel::Fused).unwrap();
            let mut b = sampler::build_with(config, &pb, seed, Kernel::Composed).unwrap();
            for _ in 0..5 {
                a.step(&pa, &grads).unwrap();
                b.step(&pb, &grads).unwrap();
            }
            for (x, y) in pa.iter().zip(&pb) {
                if (kind, integrator) == (SamplerKind::Msgnht, Splitting) {
                    // The fused damping e^{−α/2} is a polynomial within 2 ulp of candle's
                    // exp (a libm call per element would not vectorise): v differs by a few
                    // ulp of v (|v| ≲ 0.05 here) per step, which flips the rounding of
                    // θ + v now and then: compare absolutely, at 4 ulp of the parameters'
                    // scale 1 (4.8e-7), not relative to parameters near zero.
                    let d = max_abs_diff(x.as_tensor(), y.as_tensor());
                    assert!(
                        d <= 4.0 * f32::EPSILON,
                        "{kind:?} {integrator:?} seed {seed}: positions differ by {d}"
                    );
                    continue;
                }
                let d = max_rel_diff(x.as_tensor(), y.as_tensor());
                assert!(
                    d <= 1e-6,
                    "{kind:?} {integrator:?} seed {seed}: positions differ by {d}"
                );
            }
            let (da, db) = (a.diagnostics(), b.diagnostics());
            if let (Some(x), Some(y)) = (da.kinetic_energy, db.kinetic_energy) {
                assert!((x - y).abs() <= 1e-5 * y, "{kind:?}: kinetic {x} vs {y}");
            }
            if let (Some(x), Some(y)) = (da.thermostat, db.thermostat) {
                assert!(
                    (x - y).abs() <= 1e-6 * y.abs(),
                    "{kind:?}: thermostat {x} vs {y}"
                );
            }
            assert_eq!(da.thermostat.is_some(), db.thermostat.is_some());
        }
    }
}

#[test]
fn fused_momentum_matches_composed_momentum() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(4);
    let (pa, grads) = params(&mut rng);
    let pb: Vec<Var> = pa
        .iter()
        .map(|p| Var::from_tensor(&p.as_tensor().copy().unwrap()).unwrap())
        .collect();
    let config = SamplerKind::Sghmc.defaults().params().unwrap();
    assert_eq!(config.integrator(), bnn::sampler::Integrator::Euler);
    let mut a = Dynamics::init(config, &pa, 9, Kernel::Fused).unwrap();
    let mut b = Dynamics::init(config, &pb, 9, Kernel::Composed).unwrap();
    for _ in 0..3 {
        a.step(&pa, &grads).unwrap();
        b.step(&pb, &grads).unwrap();
    }
    for (i, p) in pa.iter().enumerate() {
        let d = max_rel_diff(
            &a.momentum_tensor(i, p.as_tensor()).unwrap(),
            &b.momentum_tensor(i, p.as_tensor()).unwrap(),
        );
        assert!(d <= 1e-6, "momentum {i} differs by {d}");
    }
}

/// The stacked op (`kernels::stacked::step`): three chains' rows of one (K, n) tensor,
/// each with its own seed, constants and state, come out as each row stepped alone by
/// the fused op, bit for bit: θ, v, αᵢ and the sums; for every update (n = 40,000 is two
/// chunks, so the rows' pool parts and chunk sums are exercised).
#[test]
fn stacked_rows_step_as_tensors_alone() {
    use bnn::kernels::buffer::StateBuffer;
    use bnn::kernels::{cpu::FusedStepOp, LentUpdate};
    let (k, n) = (3usize, 40_000usize);
    let mut rng = rand::rngs::StdRng::seed_from_u64(41);
    for update in [
        Update::Sgld,
        Update::Momentum,
        Update::Thermostat { splitting: true },
        Update::Thermostat { splitting: false },
        Update::Preconditioned,
    ] {
        let theta = random(k * n, 1.0, &mut rng);
        let grad = random(k * n, 10.0, &mut rng);
        let state = |rng: &mut rand::rngs::StdRng| -> Vec<Vec<f32>> {
            (0..k).map(|_| random(n, 0.01, rng)).collect()
        };
        let (mut v, mut a) = (state(&mut rng), state(&mut rng));
        if update == Update::Preconditioned {
            // Second moments are squares.
            a.iter_mut().flatten().for_each(|x| *x = x.abs());
        }
        let (mut v2, mut a2) = (v.clone(), a.clone());
        let consts: Vec<StepConsts> = (0..k)
            .map(|c| match update {
                Update::Preconditioned => {
                    StepConsts::preconditioned(1e-4, 0.9 + 0.03 * c as f64, 1e-5)
                }
                _ => StepConsts::splitting(1e-4, 0.05 + 0.02 * c as f64, 1e-2),
            })
            .collect();
        let key = |c: usize| NoiseKey {
            seed: 100 + c as u64,
            step: 7,
            param: 2,
        };
        let (momentum, thermostat) = update.states();
        // Stacked.
        let stacked = Tensor::from_vec(theta.clone(), (k, n), &Device::Cpu).unwrap();
        let g = Tensor::from_vec(grad.clone(), (k, n), &Device::Cpu).unwrap();
        let mut vb: Vec<StateBuffer> = v.drain(..).map(StateBuffer::Host).collect();
        let mut ab: Vec<StateBuffer> = a.drain(..).map(StateBuffer::Host).collect();
        let mut lanes: Vec<LentUpdate> = vb
            .iter_mut()
            .zip(ab.iter_mut())
            .enumerate()
            .map(|(c, (v, a))| LentUpdate {
                update,
                consts: consts[c],
                key: key(c),
                momentum: momentum.then_some(v),
                thermostat: thermostat.then_some(a),
            })
            .collect();
        let sums = bnn::kernels::stacked::step(&stacked, &g, &mut lanes).unwrap();
        drop(lanes);
        let stacked = stacked.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        // Each row alone.
        for c in 0..k {
            let rows = c * n..(c + 1) * n;
            let t = Tensor::from_slice(&theta[rows.clone()], n, &Device::Cpu).unwrap();
            let gr = Tensor::from_slice(&grad[rows.clone()], n, &Device::Cpu).unwrap();
            let mut v1 = StateBuffer::Host(std::mem::take(&mut v2[c]));
            let mut a1 = StateBuffer::Host(std::mem::take(&mut a2[c]));
            let op = FusedStepOp::new(LentUpdate {
                update,
                consts: consts[c],
                key: key(c),
                momentum: momentum.then_some(&mut v1),
                thermostat: thermostat.then_some(&mut a1),
            });
            t.inplace_op2(&gr, &op).unwrap();
            let alone = op.sums.get();
            let t = t.to_vec1::<f32>().unwrap();
            assert!(t == stacked[rows], "{update:?}: θ of chain {c}");
            assert_eq!(alone, sums[c], "{update:?}: sums of chain {c}");
            let host = |b: &StateBuffer| b.to_host(&Device::Cpu).unwrap();
            assert!(host(&v1) == host(&vb[c]), "{update:?}: v of chain {c}");
            assert!(host(&a1) == host(&ab[c]), "{update:?}: α of chain {c}");
        }
    }
}
