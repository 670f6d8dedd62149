//! The hand-written MLP backward (src/kernels/mlp.rs) against candle's autograd and
//! against central finite differences.

use bnn::engine::backprop::Backprop;
use bnn::likelihood::Targets;
use bnn::model::{Activation, ModelKind, ModelSpec, Network};
use bnn::potential::pass::Pass;
use bnn::potential::{Potential, Prior, PriorSpec};
use candle_core::{Device, Tensor};
use rand::{Rng, SeedableRng};

const DIM: usize = 9;
const CLASSES: usize = 4;

fn mlp(
    input: usize,
    classes: usize,
    hidden: &[usize],
    activation: Activation,
    seed: u64,
) -> Network {
    let spec = ModelSpec {
        kind: ModelKind::Mlp,
        hidden: hidden.to_vec(),
        activation,
        ..ModelSpec::default()
    };
    Network::new(&spec, input, classes, seed, &Device::Cpu).unwrap()
}

/// A small network on DIM inputs and CLASSES classes.
fn net(hidden: &[usize], activation: Activation, seed: u64) -> Network {
    mlp(DIM, CLASSES, hidden, activation, seed)
}

/// The Gamma(1, 1) hyper-prior of `bnn train`, one precision per tensor of `m`.
fn gamma_prior(m: &Network) -> Prior {
    let spec = PriorSpec::Gamma {
        shape: 1.0,
        rate: 1.0,
    };
    Prior::new(spec, m.params.len()).unwrap()
}

fn batch(rows: usize, seed: u64) -> (Vec<f32>, Vec<u32>) {
    inputs(rows, DIM, seed)
}

/// `rows` uniform inputs of `dim` values in [0, 1) and labels of CLASSES classes.
fn inputs(rows: usize, dim: usize, seed: u64) -> (Vec<f32>, Vec<u32>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let x = (0..rows * dim)
        .map(|_| rng.random_range(0.0..1.0))
        .collect();
    let y = (0..rows)
        .map(|_| rng.random_range(0..CLASSES as u32))
        .collect();
    (x, y)
}

/// A potential with a different prior precision on every tensor and T ≠ 1, so that a
/// mixed-up tensor index or a missing 1/T shows.
fn potential(m: &Network, n_data: usize) -> Potential {
    let mut prior = gamma_prior(m);
    prior.precisions = (0..m.params.len()).map(|i| 0.5 + i as f64).collect();
    Potential::new(n_data, 0.7, prior).unwrap()
}

fn flat(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1().unwrap()
}

fn max_abs(v: &[f32]) -> f32 {
    v.iter().fold(0f32, |m, x| m.max(x.abs()))
}

#[test]
fn custom_backward_equals_autograd() {
    for (hidden, act) in [
        (vec![7, 5], Activation::Relu),
        (vec![6], Activation::Sigmoid),
        (vec![], Activation::Relu),
        (vec![16, 3, 8], Activation::Sigmoid),
        (vec![5, 4], Activation::Tanh),
    ] {
        let m = net(&hidden, act, 3);
        let pot = potential(&m, 1000);
        let mut bp = Backprop::new(&m, 13).unwrap();
        for (rows, seed) in [(13, 1), (5, 2), (40, 3)] {
            let (x, y) = batch(rows, seed);
            let fast = bp
                .evaluate_then(&pot, &m, &x, Targets::Classes(&y), None)
                .unwrap();
            let xt = Tensor::from_slice(&x, (rows, DIM), &Device::Cpu).unwrap();
            let yt = Tensor::from_slice(&y, rows, &Device::Cpu).unwrap();
            let reference = pot.evaluate(&m, &xt, &yt).unwrap();
            assert!(
                (fast.nll - reference.nll).abs() < 1e-5 * reference.nll.max(1.0),
                "{hidden:?}: nll {} vs {}",
                fast.nll,
                reference.nll
            );
            let pred = reference
                .logits
                .argmax(1)
                .unwrap()
                .to_vec1::<u32>()
                .unwrap();
            let hits = pred.iter().zip(&y).filter(|(p, y)| p == y).count();
            assert_eq!(fast.correct, hits, "{hidden:?}");
            for (k, (g, r)) in bp.grads().iter().zip(&reference.grads).enumerate() {
                let (g, r) = (flat(g), flat(r));
                // f32 sums of ≤ 40 terms reordered: agreement to ~1e-6 of the tensor's
                // scale; 1e-5 leaves room and still catches any wrong term.
                let tol = 1e-5 * max_abs(&r).max(1e-3);
                for (i, (a, b)) in g.iter().zip(&r).enumerate() {
                    assert!(
                        (a - b).abs() <= tol,
                        "{hidden:?} {act:?} rows {rows}: tensor {k}[{i}]: {a} vs {b}"
                    );
                }
            }
        }
    }
}

/// The Gaussian likelihood's pass (one output, Δ = s·τ·(f − y)) against autograd on the
/// same potential, for a relu and a tanh network, τ ≠ 1 so that a missing τ shows.
#[test]
fn gaussian_custom_backward_equals_autograd() {
    use bnn::likelihood::{Likelihood, Noise};
    for (hidden, act) in [(vec![7, 5], Activation::Relu), (vec![6], Activation::Tanh)] {
        let m = mlp(DIM, 1, &hidden, act, 4);
        let noise = Noise::Fixed { std: 0.4 };
        let pot = potential(&m, 1000)
            .with_likelihood(Likelihood::Gaussian { noise })
            .unwrap();
        let mut bp = Backprop::new(&m, 13).unwrap();
        let (x, _) = batch(13, 6);
        let y: Vec<f32> = (0..13).map(|i| (i as f32 * 0.37).sin()).collect();
        let fast = bp
            .evaluate_then(&pot, &m, &x, pot.targets(&[], &y), None)
            .unwrap();
        let xt = Tensor::from_slice(&x, (13, DIM), &Device::Cpu).unwrap();
        let yt = Tensor::from_slice(&y, 13, &Device::Cpu).unwrap();
        let reference = pot.evaluate(&m, &xt, &yt).unwrap();
        assert!((fast.nll - reference.nll).abs() < 1e-5 * reference.nll.abs().max(1.0));
        let f = flat(&reference.logits);
        let sse: f64 = f
            .iter()
            .zip(&y)
            .map(|(f, y)| ((f - y) as f64).powi(2))
            .sum();
        assert!((fast.sq_error - sse).abs() < 1e-5 * sse.max(1.0));
        for (k, (g, r)) in bp.grads().iter().zip(&reference.grads).enumerate() {
            let (g, r) = (flat(g), flat(r));
            let tol = 1e-5 * max_abs(&r).max(1e-3);
            for (i, (a, b)) in g.iter().zip(&r).enumerate() {
                assert!((a - b).abs() <= tol, "{act:?}: tensor {k}[{i}]: {a} vs {b}");
            }
        }
    }
}

#[test]
fn custom_forward_equals_model_forward() {
    let m = net(&[12, 6], Activation::Relu, 9);
    let mut bp = Backprop::new(&m, 8).unwrap();
    let (x, _) = batch(21, 4);
    let fast = bp.forward(&m, &x, 21).unwrap().to_vec();
    let xt = Tensor::from_slice(&x, (21, DIM), &Device::Cpu).unwrap();
    let reference = flat(&m.forward(&xt).unwrap());
    assert_eq!(fast.len(), reference.len());
    for (a, b) in fast.iter().zip(&reference) {
        assert!((a - b).abs() < 1e-5, "{a} vs {b}");
    }
}

/// U(θ)/T on the minibatch in f64 from the custom forward's logits:
/// (N/|S|)·Σ −log softmax(z)_y + ½ Σ_t λ_t |θ_t|², all over T.
fn tempered_potential(
    pot: &Potential,
    bp: &mut Backprop,
    m: &Network,
    x: &[f32],
    y: &[u32],
) -> f64 {
    let logits = bp.forward(m, x, y.len()).unwrap().to_vec();
    let mut nll = 0f64;
    for (z, &label) in logits.chunks_exact(CLASSES).zip(y) {
        let max = z.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
        let lse = max + z.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln();
        nll += lse - z[label as usize] as f64;
    }
    let prior: f64 = m
        .params
        .iter()
        .zip(&pot.prior.precisions)
        .map(|(p, l)| {
            0.5 * l
                * flat(p.var.as_tensor())
                    .iter()
                    .map(|&v| (v as f64).powi(2))
                    .sum::<f64>()
        })
        .sum();
    (pot.n_data as f64 / y.len() as f64 * nll + prior) / pot.temperature
}

/// Every gradient element of `m` from the custom backward against the central difference
/// (U(θ + h) − U(θ − h))/2h of the tempered potential on the minibatch (x, y).
fn check_finite_differences(m: &Network, x: &[f32], y: &[u32], h: f32) {
    let pot = potential(m, 20);
    let mut bp = Backprop::new(m, y.len()).unwrap();
    bp.evaluate_then(&pot, m, x, Targets::Classes(y), None)
        .unwrap();
    let grads: Vec<Vec<f32>> = bp.grads().iter().map(flat).collect();
    let mut checked = 0;
    for (t, p) in m.params.iter().enumerate() {
        let base = flat(p.var.as_tensor());
        for i in 0..base.len() {
            let mut at = |delta: f32| {
                let mut v = base.clone();
                v[i] += delta;
                p.var
                    .set(&Tensor::from_slice(&v, p.var.shape(), &Device::Cpu).unwrap())
                    .unwrap();
                tempered_potential(&pot, &mut bp, m, x, y)
            };
            let fd = (at(h) - at(-h)) / (2.0 * h as f64);
            at(0.0);
            let g = grads[t][i] as f64;
            // Central differences: O(h²) truncation plus f32 rounding of U (~1e-7·|U|/h);
            // both are far below 2e-3 here, a wrong factor, sign or pooling window is not.
            assert!(
                (fd - g).abs() <= 2e-3 * fd.abs().max(1.0),
                "{}: {}[{i}]: finite difference {fd} vs backward {g}",
                m.spec.label(),
                p.name
            );
            checked += 1;
        }
    }
    assert_eq!(checked, m.num_params());
}

#[test]
fn custom_backward_matches_finite_differences() {
    for (hidden, act, h) in [
        (vec![3], Activation::Sigmoid, 1e-2f32),
        (vec![4, 3], Activation::Relu, 1e-3f32),
    ] {
        let (x, y) = batch(6, 8);
        check_finite_differences(&net(&hidden, act, 5), &x, &y, h);
    }
}

#[test]
fn repeated_steps_overwrite_rather_than_accumulate() {
    let m = net(&[10], Activation::Relu, 2);
    let pot = potential(&m, 100);
    let mut bp = Backprop::new(&m, 7).unwrap();
    let (x, y) = batch(7, 1);
    bp.evaluate_then(&pot, &m, &x, Targets::Classes(&y), None)
        .unwrap();
    let first: Vec<Vec<f32>> = bp.grads().iter().map(flat).collect();
    let (x2, y2) = batch(7, 2);
    bp.evaluate_then(&pot, &m, &x2, Targets::Classes(&y2), None)
        .unwrap();
    bp.evaluate_then(&pot, &m, &x, Targets::Classes(&y), None)
        .unwrap();
    let again: Vec<Vec<f32>> = bp.grads().iter().map(flat).collect();
    assert_eq!(first, again);
}

#[test]
fn mismatched_inputs_are_errors() {
    let m = net(&[10], Activation::Relu, 2);
    let pot = potential(&m, 100);
    let mut bp = Backprop::new(&m, 7).unwrap();
    let (x, y) = batch(7, 1);
    assert!(bp
        .evaluate_then(&pot, &m, &x[1..], Targets::Classes(&y), None)
        .is_err());
    let bad_label = vec![CLASSES as u32; 7];
    let e = bp
        .evaluate_then(&pot, &m, &x, Targets::Classes(&bad_label), None)
        .unwrap_err();
    assert!(e.to_string().contains("out of range"), "{e}");
    let other = net(&[11], Activation::Relu, 2);
    assert!(bp
        .evaluate_then(&pot, &other, &x, Targets::Classes(&y), None)
        .is_err());
}

/// The flattened gradients of the custom backward and of autograd on (x, y), 784 inputs
/// per row, tensor by tensor, under N = 60,000, T = 1 and a different prior precision on
/// every tensor.
fn both_gradients(m: &Network, x: &[f32], y: &[u32]) -> Vec<(Vec<f32>, Vec<f32>)> {
    let mut prior = gamma_prior(m);
    prior.precisions = (0..m.params.len()).map(|i| 3.0 + 7.0 * i as f64).collect();
    let (pot, rows) = (Potential::new(60_000, 1.0, prior).unwrap(), y.len());
    let mut bp = Backprop::new(m, rows).unwrap();
    bp.evaluate_then(&pot, m, x, Targets::Classes(y), None)
        .unwrap();
    let xt = Tensor::from_slice(x, (rows, 784), &Device::Cpu).unwrap();
    let yt = Tensor::from_slice(y, rows, &Device::Cpu).unwrap();
    let reference = pot.evaluate(m, &xt, &yt).unwrap();
    bp.grads()
        .iter()
        .zip(&reference.grads)
        .map(|(g, r)| (flat(g), flat(r)))
        .collect()
}

fn worst_difference(g: &[f32], r: &[f32]) -> f32 {
    g.iter()
        .zip(r)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max)
}

/// The networks and batch sizes of the benchmarks (784-100-10 and 784-400-400-10 at
/// batch 100 and 1000): sizes that take the parallel split, the k-blocking and every tile
/// width of the matrix kernels.
#[test]
fn custom_backward_equals_autograd_at_full_size() {
    for (hidden, rows) in [
        (vec![100], 100),
        (vec![400, 400], 100),
        (vec![400, 400], 1000),
    ] {
        let m = mlp(784, 10, &hidden, Activation::Relu, 11);
        let mut rng = rand::rngs::StdRng::seed_from_u64(2);
        let x: Vec<f32> = (0..rows * 784)
            .map(|_| rng.random_range(0.0..1.0))
            .collect();
        let y: Vec<u32> = (0..rows).map(|_| rng.random_range(0..10)).collect();
        for (k, (g, r)) in both_gradients(&m, &x, &y).into_iter().enumerate() {
            // Sums of up to 1000 f32 terms in another order: ~1e-5 of the tensor's scale.
            let tol = 1e-4 * max_abs(&r);
            let worst = worst_difference(&g, &r);
            assert!(
                worst <= tol,
                "{hidden:?} batch {rows}: tensor {k} differs by {worst} (tol {tol})"
            );
            let mean_diff: f64 =
                g.iter().zip(&r).map(|(a, b)| (a - b) as f64).sum::<f64>() / g.len() as f64;
            let mean_abs: f64 = r.iter().map(|b| b.abs() as f64).sum::<f64>() / r.len() as f64;
            // No systematic offset either.
            assert!(
                mean_diff.abs() <= 1e-5 * mean_abs.max(1e-6),
                "{hidden:?} tensor {k}: mean offset {mean_diff}"
            );
        }
    }
}

/// Whole training steps (gather, gradient, fused mSGNHT update, splitting) through the
/// custom backward and through autograd, from the same state: after 10 steps on real
/// images the parameters differ by rounding only (measured: ~1e-8 of their scale; over
/// hundreds of steps a ReLU that flips on one path and not the other lets the two chains
/// drift apart, as any two roundings of the same chain do).
#[test]
fn training_steps_agree_between_backward_paths() {
    use bnn::potential::Backward;
    use bnn::sampler::{Kernel, SamplerKind};
    use bnn::train::Stepper;
    let ds = bnn::data::load_builtin().unwrap();
    let mut steppers = Vec::new();
    let mut models = Vec::new();
    for backward in [Backward::Custom, Backward::Autograd] {
        let m = mlp(784, 10, &[400, 400], Activation::Relu, 3);
        let pot = Potential::new(ds.train.len(), 1.0, gamma_prior(&m)).unwrap();
        let config = SamplerKind::Msgnht.defaults().params().unwrap();
        steppers.push(Stepper::new(&m, pot, config, Kernel::Fused, backward, 5, 100).unwrap());
        models.push(m);
    }
    for step in 0..10 {
        let idx: Vec<usize> = (0..100)
            .map(|i| (step * 100 + i * 7) % ds.train.len())
            .collect();
        let a = steppers[0].step(&ds.train, None, &idx, None).unwrap();
        let b = steppers[1].step(&ds.train, None, &idx, None).unwrap();
        assert!(
            (a.nll - b.nll).abs() < 1e-4 * b.nll.max(1.0),
            "step {step}: nll {} vs {}",
            a.nll,
            b.nll
        );
    }
    for (p, q) in models[0].params.iter().zip(&models[1].params) {
        let (x, y) = (flat(p.var.as_tensor()), flat(q.var.as_tensor()));
        let scale = max_abs(&y);
        let worst = x
            .iter()
            .zip(&y)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            worst <= 1e-5 * scale,
            "{}: differs by {worst} (scale {scale})",
            p.name
        );
    }
}

/// Updating each layer as soon as its gradient is ready (the default with the custom
/// backward) gives bit for bit the parameters, momenta and thermostat of the whole-model
/// step after it, for every fused sampler, integrator and a network of three layers.
/// With the weights updated inside their gradient's product (also the default), θ and v
/// stay bit-identical; only Σv² is summed in another order, so the kinetic energy, and
/// SGNHT's thermostat fed by it, agree to rounding.
#[test]
fn layer_by_layer_update_is_bit_identical_to_the_whole_step() {
    use bnn::potential::Backward;
    use bnn::sampler::{Integrator, Kernel, SamplerKind};
    use bnn::train::Stepper;
    let ds = bnn::data::load_builtin().unwrap();
    for (kind, integrator, kernel) in [
        (SamplerKind::Sghmc, Integrator::Euler, Kernel::Fused),
        (SamplerKind::Sgnht, Integrator::Splitting, Kernel::Fused),
        (SamplerKind::Sgld, Integrator::Euler, Kernel::Fused),
        (SamplerKind::Msgnht, Integrator::Splitting, Kernel::Fused),
        (SamplerKind::Psgld, Integrator::Euler, Kernel::Fused),
        // The composed reference samplers take the same per-tensor protocol.
        (SamplerKind::Sghmc, Integrator::Splitting, Kernel::Composed),
        (SamplerKind::Sgnht, Integrator::Euler, Kernel::Composed),
        (SamplerKind::Msgnht, Integrator::Euler, Kernel::Composed),
        (SamplerKind::Sgld, Integrator::Euler, Kernel::Composed),
        (SamplerKind::Psgld, Integrator::Euler, Kernel::Composed),
        (SamplerKind::Momentum, Integrator::Euler, Kernel::Composed),
    ] {
        let mut steppers = Vec::new();
        let mut models = Vec::new();
        // (by layer, inline): the whole step last, the reference.
        for (by_layer, inline) in [(true, true), (true, false), (false, false)] {
            // W₁ (784 × 128) is large enough to be updated inline, W₂ and W₃ are not.
            let m = mlp(784, 10, &[128, 32], Activation::Relu, 6);
            let pot = Potential::new(ds.train.len(), 1.0, gamma_prior(&m)).unwrap();
            let mut config = kind.defaults();
            config.integrator = integrator;
            let config = config.params().unwrap();
            let mut s = Stepper::new(&m, pot, config, kernel, Backward::Custom, 8, 50).unwrap();
            s.by_layer = by_layer;
            s.set_inline_update(inline);
            steppers.push((s, inline));
            models.push(m);
        }
        for step in 0..12 {
            let idx: Vec<usize> = (0..50)
                .map(|i| (step * 50 + i * 13) % ds.train.len())
                .collect();
            let nll: Vec<u64> = steppers
                .iter_mut()
                .map(|(s, _)| s.step(&ds.train, None, &idx, None).unwrap().nll.to_bits())
                .collect();
            if kind != SamplerKind::Sgnht || kernel == Kernel::Composed {
                assert!(nll.iter().all(|&b| b == nll[2]), "{kind:?} step {step}");
            }
        }
        let reference = &models[2];
        for (m, (_, inline)) in models.iter().zip(&steppers).take(2) {
            for (p, q) in m.params.iter().zip(&reference.params) {
                let (x, y) = (flat(p.var.as_tensor()), flat(q.var.as_tensor()));
                let bitwise = x.iter().zip(&y).all(|(a, b)| a.to_bits() == b.to_bits());
                if kind == SamplerKind::Sgnht && *inline && kernel == Kernel::Fused {
                    // α differs in its last bits, so θ may differ at f32 rounding after
                    // 12 steps: 1e-5 of the tensor's scale is a hundred roundings.
                    let scale = y.iter().fold(0f32, |a, v| a.max(v.abs()));
                    let worst = x
                        .iter()
                        .zip(&y)
                        .fold(0f32, |a, (p, q)| a.max((p - q).abs()));
                    assert!(worst <= 1e-5 * scale, "{kind:?} {}: {worst}", p.name);
                } else {
                    assert!(bitwise, "{kind:?} {} inline {inline}", p.name);
                }
            }
        }
        let diag: Vec<_> = steppers
            .iter()
            .map(|(s, _)| s.sampler.diagnostics())
            .collect();
        assert_eq!(
            format!("{:?}", diag[1]),
            format!("{:?}", diag[2]),
            "{kind:?}"
        );
        let close = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) => (a - b).abs() <= 1e-9 * b.abs().max(1e-12),
            (a, b) => a == b,
        };
        assert!(
            close(diag[0].kinetic_energy, diag[2].kinetic_energy),
            "{kind:?} {diag:?}"
        );
        assert!(
            close(diag[0].thermostat, diag[2].thermostat),
            "{kind:?} {diag:?}"
        );
        for (s, _) in &steppers {
            assert_eq!(s.sampler.steps(), 12);
        }
        // W₁ went through the product's epilogue at each of the 12 steps, except for
        // mSGNHT and pSGLD (per-element state: the separate pass) and where not asked for.
        let inline = if matches!(kind, SamplerKind::Msgnht | SamplerKind::Psgld)
            || kernel == Kernel::Composed
            || !bnn::kernels::gemm::updates_inline(784)
        {
            0
        } else {
            12
        };
        assert_eq!(steppers[0].0.inline_updates(), inline, "{kind:?}");
        assert_eq!(steppers[1].0.inline_updates(), 0, "{kind:?}");
    }
    // A tensor stepped twice, or a step finished early, is an error, not a silent skip.
    let m = mlp(784, 10, &[16], Activation::Relu, 1);
    let vars = m.vars();
    let mut s = bnn::sampler::build_with(
        SamplerKind::Sghmc.defaults().params().unwrap(),
        &vars,
        0,
        bnn::sampler::Kernel::Fused,
    )
    .unwrap();
    let g = vars[0].as_tensor().zeros_like().unwrap();
    let mut update = bnn::kernels::begin(s.as_mut()).unwrap();
    update.tensor(0, &vars[0], &g).unwrap();
    assert!(update.tensor(0, &vars[0], &g).is_err());
    assert!(update.finish().is_err());
}

/// Prediction on the CPU goes through the custom forward: the same probabilities as
/// candle's forward and softmax, to f32 rounding.
#[test]
fn cpu_prediction_equals_candle_softmax() {
    let ds = bnn::data::load_builtin().unwrap();
    let m = mlp(784, 10, &[100], Activation::Relu, 4);
    let probs = bnn::ensemble::predict(&m, &ds.test, &Device::Cpu).unwrap();
    assert_eq!(probs.len(), ds.test.len() * 10);
    let (mut x, mut y) = (Vec::new(), Vec::new());
    let idx: Vec<usize> = (0..ds.test.len()).collect();
    ds.test.gather(&idx, &mut x, &mut y);
    let xt = Tensor::from_slice(&x, (idx.len(), 784), &Device::Cpu).unwrap();
    let reference = flat(&candle_nn::ops::softmax_last_dim(&m.forward(&xt).unwrap()).unwrap());
    let worst = probs
        .iter()
        .zip(&reference)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(worst < 1e-5, "probabilities differ by {worst}");
}

// ---- The CNN pass (src/kernels/cnn.rs) ----

/// A CNN on `side`² images with CLASSES classes.
fn cnn(side: usize, conv: &[usize], kernel: usize, hidden: &[usize], act: Activation) -> Network {
    padded_cnn(side, conv, kernel, 0, hidden, act)
}

/// As [`cnn`], `padding` zeros around each convolution's input.
fn padded_cnn(
    side: usize,
    conv: &[usize],
    kernel: usize,
    padding: usize,
    hidden: &[usize],
    act: Activation,
) -> Network {
    let spec = ModelSpec {
        kind: ModelKind::Cnn,
        hidden: hidden.to_vec(),
        activation: act,
        conv: conv.to_vec(),
        kernel_size: kernel,
        padding,
        ..ModelSpec::default()
    };
    Network::new(&spec, side * side, CLASSES, 4, &Device::Cpu).unwrap()
}

/// Shapes that take every path: two convolutions (input error through col2im), odd
/// convolution sides (a row and column outside every pool window), 2×2 and 3×3 kernels,
/// no hidden layer, both activations; batches smaller and larger than the buffers;
/// padding that keeps the side (5×5, 2), that grows it (3×3, 2) and that leaves whole
/// rows of patches in the padding (a 3-pixel second input under a 5×5 kernel, 4).
fn cnn_cases() -> Vec<(usize, Network)> {
    vec![
        (11, cnn(11, &[3, 4], 3, &[5], Activation::Relu)),
        (10, cnn(10, &[2], 3, &[], Activation::Sigmoid)),
        (12, cnn(12, &[3, 2], 2, &[6, 3], Activation::Relu)),
        (13, cnn(13, &[4, 3], 2, &[7], Activation::Sigmoid)),
        (12, padded_cnn(12, &[3, 4], 5, 2, &[5], Activation::Relu)),
        (9, padded_cnn(9, &[2, 3], 3, 2, &[], Activation::Sigmoid)),
        (7, padded_cnn(7, &[2, 2], 5, 4, &[4], Activation::Relu)),
    ]
}

#[test]
fn cnn_backward_equals_autograd() {
    for (side, m) in cnn_cases() {
        let label = m.spec.label();
        let pot = potential(&m, 1000);
        let mut bp = Backprop::new(&m, 9).unwrap();
        for (rows, seed) in [(9, 1), (4, 2), (23, 3)] {
            let (x, y) = inputs(rows, side * side, seed);
            let fast = bp
                .evaluate_then(&pot, &m, &x, Targets::Classes(&y), None)
                .unwrap();
            let xt = Tensor::from_slice(&x, (rows, side * side), &Device::Cpu).unwrap();
            let yt = Tensor::from_slice(&y, rows, &Device::Cpu).unwrap();
            let reference = pot.evaluate(&m, &xt, &yt).unwrap();
            assert!(
                (fast.nll - reference.nll).abs() < 1e-5 * reference.nll.max(1.0),
                "{label}: nll {} vs {}",
                fast.nll,
                reference.nll
            );
            for (k, (g, r)) in bp.grads().iter().zip(&reference.grads).enumerate() {
                let (g, r) = (flat(g), flat(r));
                // Sums of up to a few thousand f32 terms in another order: ~1e-6 of the
                // tensor's scale; 2e-5 leaves room and still catches any wrong term.
                let tol = 2e-5 * max_abs(&r).max(1e-3);
                for (i, (a, b)) in g.iter().zip(&r).enumerate() {
                    assert!(
                        (a - b).abs() <= tol,
                        "{label} rows {rows}: {}[{i}]: {a} vs {b}",
                        m.params[k].name
                    );
                }
            }
        }
        // The forward alone (prediction) gives the model's logits.
        let (x, _) = inputs(17, side * side, 5);
        let fast = bp.forward(&m, &x, 17).unwrap().to_vec();
        let xt = Tensor::from_slice(&x, (17, side * side), &Device::Cpu).unwrap();
        let reference = flat(&m.forward(&xt).unwrap());
        assert_eq!(fast.len(), reference.len());
        for (a, b) in fast.iter().zip(&reference) {
            assert!((a - b).abs() < 1e-5, "{label}: logit {a} vs {b}");
        }
    }
}

#[test]
fn cnn_backward_matches_finite_differences() {
    for (side, m, h) in [
        (9, cnn(9, &[2, 2], 2, &[3], Activation::Sigmoid), 1e-2f32),
        (8, cnn(8, &[2], 3, &[], Activation::Relu), 1e-3f32),
        (11, cnn(11, &[3, 4], 3, &[5], Activation::Relu), 1e-3f32),
        (
            8,
            padded_cnn(8, &[2, 2], 3, 1, &[3], Activation::Sigmoid),
            1e-3f32,
        ),
    ] {
        let (x, y) = inputs(5, side * side, 8);
        check_finite_differences(&m, &x, &y, h);
    }
}

/// The LeNet preset at batch 64 on 28×28 images: the sizes of `bnn bench train`, where
/// the products split over threads and run several k blocks.
#[test]
fn cnn_backward_equals_autograd_at_full_size() {
    let spec = ModelSpec::from_toml_file(std::path::Path::new("models/lenet.toml")).unwrap();
    let m = Network::new(&spec, 784, 10, 11, &Device::Cpu).unwrap();
    let ds = bnn::data::load_builtin().unwrap();
    let idx: Vec<usize> = (0..64).map(|i| i * 37 % ds.train.len()).collect();
    let (mut x, mut y) = (Vec::new(), Vec::new());
    ds.train.gather(&idx, &mut x, &mut y);
    for (k, (g, r)) in both_gradients(&m, &x, &y).into_iter().enumerate() {
        // Sums of up to 36,864 f32 terms in another order.
        let tol = 1e-4 * max_abs(&r);
        let worst = worst_difference(&g, &r);
        assert!(
            worst <= tol,
            "{}: differs by {worst} (tol {tol})",
            m.params[k].name
        );
    }
}
