//! The hand-written ResNet pass (src/backprop/resnet.rs) against candle's autograd on the
//! same weights (the device path, `ResnetLayout::forward`) and against central finite
//! differences, which check candle's strided convolution backward too.

use bnn::engine::backprop::Backprop;
use bnn::likelihood::Targets;
use bnn::model::resnet::Norm;
use bnn::model::{Activation, ModelKind, ModelSpec, Network};
use bnn::potential::pass::Pass;
use bnn::potential::{Potential, Prior, PriorSpec};
use candle_core::{Device, Tensor};
use rand::{Rng, SeedableRng};

const CLASSES: usize = 10;

fn spec(stages: &[usize], blocks: usize, norm: Norm, activation: Activation) -> ModelSpec {
    ModelSpec {
        kind: ModelKind::Resnet,
        hidden: Vec::new(),
        activation,
        stages: stages.to_vec(),
        blocks,
        norm,
        ..ModelSpec::default()
    }
}

/// Random weights everywhere, FRN's γ, β, τ included (their start, 1, 0, 0, would leave
/// τ's gradient and TLU's threshold untested), from `seed`.
fn network(spec: &ModelSpec, image: [usize; 3], seed: u64) -> Network {
    let m = Network::for_images(spec, image, CLASSES, seed, &Device::Cpu).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed + 100);
    for p in &m.params {
        if p.name.contains(".frn.") {
            let (lo, hi) = match &p.name {
                n if n.ends_with("gamma") => (0.5, 1.5),
                _ => (-0.3, 0.3),
            };
            let v: Vec<f32> = (0..p.var.elem_count())
                .map(|_| rng.random_range(lo..hi))
                .collect();
            p.var
                .set(&Tensor::from_vec(v, p.var.shape(), &Device::Cpu).unwrap())
                .unwrap();
        }
    }
    m
}

/// Images in [0, 1) with a blank border (as MNIST's: exact zeros reach the padding and
/// the first convolution) and labels.
fn images(rows: usize, image: [usize; 3], seed: u64) -> (Vec<f32>, Vec<u32>) {
    let [c, h, w] = image;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut x = Vec::with_capacity(rows * c * h * w);
    for _ in 0..rows * c {
        for y in 0..h {
            for xx in 0..w {
                let inside = y > 0 && xx > 0 && y + 1 < h && xx + 1 < w;
                x.push(if inside {
                    rng.random_range(0.0..1.0)
                } else {
                    0.0
                });
            }
        }
    }
    let y = (0..rows)
        .map(|_| rng.random_range(0..CLASSES as u32))
        .collect();
    (x, y)
}

/// A potential with a different prior precision on every tensor and T ≠ 1.
fn potential(m: &Network) -> Potential {
    let spec = PriorSpec::Gamma {
        shape: 1.0,
        rate: 1.0,
    };
    let mut prior = Prior::new(spec, m.params.len()).unwrap();
    prior.precisions = (0..m.params.len()).map(|i| 0.5 + i as f64).collect();
    Potential::new(1000, 0.7, prior).unwrap()
}

fn flat(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1().unwrap()
}

fn max_abs(v: &[f32]) -> f32 {
    v.iter().fold(0f32, |m, x| m.max(x.abs()))
}

/// Every tensor's gradient from the hand-written pass within 1e-4 of autograd's,
/// relative to the tensor's largest gradient (the bar); the loss and the logits
/// of the forward alone as well.
fn check_against_autograd(m: &Network, image: [usize; 3], rows: &[usize]) {
    let label = m.spec.label();
    let pot = potential(m);
    let dim: usize = image.iter().product();
    let mut bp = Backprop::new(m, rows[0]).unwrap();
    for (i, &n) in rows.iter().enumerate() {
        let (x, y) = images(n, image, 7 + i as u64);
        let fast = bp
            .evaluate_then(&pot, m, &x, Targets::Classes(&y), None)
            .unwrap();
        let xt = Tensor::from_slice(&x, (n, dim), &Device::Cpu).unwrap();
        let yt = Tensor::from_slice(&y, n, &Device::Cpu).unwrap();
        let reference = pot.evaluate(m, &xt, &yt).unwrap();
        assert!(
            (fast.nll - reference.nll).abs() < 1e-5 * reference.nll.max(1.0),
            "{label} batch {n}: nll {} vs {}",
            fast.nll,
            reference.nll
        );
        for (k, (g, r)) in bp.grads().iter().zip(&reference.grads).enumerate() {
            let (g, r) = (flat(g), flat(r));
            let scale = max_abs(&r).max(1e-6);
            let worst = g
                .iter()
                .zip(&r)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(
                worst <= 1e-4 * scale,
                "{label} batch {n}: {} differs by {worst} (largest gradient {scale})",
                m.params[k].name
            );
        }
        let logits = bp.forward(m, &x, n).unwrap().to_vec();
        let reference = flat(&m.forward(&xt).unwrap());
        let scale = max_abs(&reference).max(1.0);
        for (a, b) in logits.iter().zip(&reference) {
            assert!((a - b).abs() <= 1e-5 * scale, "{label}: logit {a} vs {b}");
        }
    }
}

/// ResNet-8 and ResNet-20 layouts at small widths on 28×28 MNIST-sized images (strides
/// 28 → 14 → 7, odd sides at the last stage), FRN and no normalisation, both
/// activations, batches 1 and 32 (and 5, smaller than the buffers). At batch 32 a
/// stage-1 convolution runs in 6 chunks of images per half (3 images fit its 384 KiB, the
/// last chunk one image), so the chunked products and their sums are checked too.
#[test]
fn resnet_backward_equals_autograd() {
    let image = [1, 28, 28];
    for (stages, blocks, norm, act) in [
        ([4, 6, 8], 1, Norm::Frn, Activation::Swish),
        ([4, 6, 8], 1, Norm::Frn, Activation::Relu),
        ([3, 5, 6], 1, Norm::None, Activation::Relu),
        ([3, 4, 5], 3, Norm::Frn, Activation::Swish),
    ] {
        let m = network(&spec(&stages, blocks, norm, act), image, 3);
        check_against_autograd(&m, image, &[32, 1, 5]);
    }
}

/// Three-channel images of another size (3×11×9): the layout takes the shape from the
/// data, not from MNIST. Odd sides, and then sides of both parities (11×9 → 6×5 → 3×3),
/// whose stride-2 convolution candle's autograd differentiates only with the model's
/// appended zero column (`even_out_parity`; without it: "shape mismatch in add").
#[test]
fn resnet_on_colour_images_of_another_shape() {
    let image = [3, 11, 9];
    let m = network(&spec(&[4, 5, 3], 2, Norm::Frn, Activation::Swish), image, 5);
    check_against_autograd(&m, image, &[6, 1]);
}

/// Central differences of the tempered potential on three coordinates of every tensor:
/// both passes agree with the derivative itself, not only with each other. On a smooth
/// network: TLU's thresholds far below (τ = −5: the kink of every element near τ bends
/// the function so that, measured, the differences of a random-τ FRN network still move
/// by 5% between h = 1e-3 and 1e-4, converging to the gradient) and swish, with and
/// without FRN. ReLU's kinks are left to the comparison with autograd.
#[test]
fn resnet_backward_matches_finite_differences() {
    for (norm, act) in [
        (Norm::Frn, Activation::Swish),
        (Norm::None, Activation::Swish),
    ] {
        finite_differences(norm, act);
    }
}

fn finite_differences(norm: Norm, act: Activation) {
    let image = [1, 9, 9];
    let m = network(&spec(&[2, 3], 1, norm, act), image, 9);
    for p in m.params.iter().filter(|p| p.name.ends_with(".tau")) {
        let low = Tensor::full(-5f32, p.var.shape(), &Device::Cpu).unwrap();
        p.var.set(&low).unwrap();
    }
    let pot = potential(&m);
    let (x, y) = images(3, image, 11);
    let mut bp = Backprop::new(&m, 3).unwrap();
    bp.evaluate_then(&pot, &m, &x, Targets::Classes(&y), None)
        .unwrap();
    let grads: Vec<Vec<f32>> = bp.grads().iter().map(flat).collect();
    // Ũ/T = (N/n·Σ NLL + Σ λ‖θ‖²/2)/T, the NLL in f64 from the logits (the f32 loss's
    // rounding, ~1e-7 of U ≈ 3,000, would be 0.015 of a difference over 2h).
    let energy = |m: &Network| -> f64 {
        let mut bp = Backprop::new(m, 3).unwrap();
        let logits = bp.forward(m, &x, y.len()).unwrap().to_vec();
        let mut nll = 0f64;
        for (z, &label) in logits.chunks_exact(CLASSES).zip(&y) {
            let max = z.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
            let lse = max + z.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln();
            nll += lse - z[label as usize] as f64;
        }
        let prior: f64 = m
            .params
            .iter()
            .zip(&pot.prior.precisions)
            .map(|(p, &l)| {
                let sq: f64 = flat(p.var.as_tensor())
                    .iter()
                    .map(|&v| (v as f64).powi(2))
                    .sum();
                0.5 * l * sq
            })
            .sum();
        (pot.n_data as f64 / y.len() as f64 * nll + prior) / pot.temperature
    };
    // Central differences: O(h²) truncation on this smooth network, plus the forward's f32
    // rounding of Ũ (~1e-4 absolute here) over 2h: h = 1e-3 left 0.08 of error on a
    // gradient of 3.9 (measured), 3e-3 a third of that.
    let h = 3e-3f32;
    for (k, p) in m.params.iter().enumerate() {
        let mut values = flat(p.var.as_tensor());
        for i in [0, values.len() / 2, values.len() - 1] {
            let old = values[i];
            let mut at = |v: f32| {
                values[i] = v;
                p.var
                    .set(&Tensor::from_slice(&values, p.var.shape(), &Device::Cpu).unwrap())
                    .unwrap();
                energy(&m)
            };
            let numeric = (at(old + h) - at(old - h)) / (2.0 * h as f64);
            at(old);
            let analytic = grads[k][i] as f64;
            assert!(
                (numeric - analytic).abs() <= 2e-2 * analytic.abs().max(1.0),
                "{}: {}[{i}]: finite difference {numeric} vs {analytic}",
                m.spec.label(),
                p.name
            );
        }
    }
}
