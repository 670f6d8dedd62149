//! The minibatch potential: likelihood scaled by N/|S|, Gaussian prior, temperature.

use bnn::model::{Activation, ModelKind, ModelSpec, Network};
use bnn::potential::{Potential, Prior, PriorSpec};
use candle_core::{Device, Tensor};

fn tiny() -> Network {
    let spec = ModelSpec {
        kind: ModelKind::Mlp,
        hidden: vec![3],
        activation: Activation::Sigmoid,
        ..ModelSpec::default()
    };
    Network::new(&spec, 4, 5, 7, &Device::Cpu).unwrap()
}

/// ∇ of −log p(y|x,θ) for one example, by candle's autograd.
fn single_example_grads(m: &Network, x: &[f32], y: u32) -> Vec<Vec<f32>> {
    let xt = Tensor::from_slice(x, (1, 4), &Device::Cpu).unwrap();
    let yt = Tensor::new(&[y], &Device::Cpu).unwrap();
    let loss = candle_nn::loss::cross_entropy(&m.forward(&xt).unwrap(), &yt).unwrap();
    let g = loss.backward().unwrap();
    m.params
        .iter()
        .map(|p| {
            g.get(&p.var)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap()
        })
        .collect()
}

#[test]
fn gradient_is_n_over_batch_times_sum_plus_prior_over_temperature() {
    let m = tiny();
    let xs = [
        [0.1f32, 0.5, -0.3, 0.9],
        [1.0, -1.0, 0.25, 0.0],
        [0.0, 0.3, 0.3, -0.6],
    ];
    let ys = [2u32, 4, 0];
    let (n, t, std) = (50usize, 2.0, 0.5);
    let pot = Potential::new(
        n,
        t,
        Prior::new(PriorSpec::Gaussian { std }, m.params.len()).unwrap(),
    )
    .unwrap();
    let x = Tensor::from_slice(&xs.concat(), (3, 4), &Device::Cpu).unwrap();
    let y = Tensor::new(&ys, &Device::Cpu).unwrap();
    let eval = pot.evaluate(&m, &x, &y).unwrap();

    let per_example: Vec<_> = xs
        .iter()
        .zip(ys)
        .map(|(x, y)| single_example_grads(&m, x, y))
        .collect();
    let lambda = 1.0 / (std * std);
    for (k, p) in m.params.iter().enumerate() {
        let theta: Vec<f32> = p.var.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
        let got: Vec<f32> = eval.grads[k].flatten_all().unwrap().to_vec1().unwrap();
        for i in 0..theta.len() {
            let sum: f64 = per_example.iter().map(|g| g[k][i] as f64).sum();
            // (N/|S|)·Σ∇(−log p) + λθ, divided by T.
            let want = ((n as f64 / 3.0) * sum + lambda * theta[i] as f64) / t;
            assert!(
                (got[i] as f64 - want).abs() <= 1e-4 * want.abs().max(1e-2),
                "{}[{i}]: {} vs {want}",
                p.name,
                got[i]
            );
        }
    }
    // The reported NLL is the minibatch mean, unscaled.
    let logp = candle_nn::ops::log_softmax(&m.forward(&x).unwrap(), 1).unwrap();
    let lp: Vec<Vec<f32>> = logp.to_vec2().unwrap();
    let mean = -(0..3).map(|i| lp[i][ys[i] as usize] as f64).sum::<f64>() / 3.0;
    assert!((eval.nll - mean).abs() < 1e-5);
}

#[test]
fn finite_difference_of_the_potential() {
    // U(θ) = N·mean(−log p) + λ/2·Σθ²; check one weight's gradient by central differences.
    let m = tiny();
    let x = Tensor::from_slice(
        &[0.2f32, -0.4, 0.6, 0.8, -0.1, 0.3, 0.5, 0.7],
        (2, 4),
        &Device::Cpu,
    )
    .unwrap();
    let y = Tensor::new(&[1u32, 3], &Device::Cpu).unwrap();
    let n = 10usize;
    let pot = Potential::new(
        n,
        1.0,
        Prior::new(PriorSpec::Gaussian { std: 1.0 }, m.params.len()).unwrap(),
    )
    .unwrap();
    let g = pot.evaluate(&m, &x, &y).unwrap().grads[0]
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    let u = |m: &Network| -> f64 {
        let nll = candle_nn::loss::cross_entropy(&m.forward(&x).unwrap(), &y).unwrap();
        let prior: f64 = m
            .params
            .iter()
            .map(|p| {
                p.var
                    .as_tensor()
                    .sqr()
                    .unwrap()
                    .sum_all()
                    .unwrap()
                    .to_scalar::<f32>()
                    .unwrap() as f64
            })
            .sum();
        n as f64 * nll.to_scalar::<f32>().unwrap() as f64 + 0.5 * prior
    };
    let w = &m.params[0].var;
    let base: Vec<f32> = w.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
    let h = 1e-2f32;
    for i in [0usize, 5, 11] {
        let mut plus = base.clone();
        plus[i] += h;
        w.set(&Tensor::from_slice(&plus, w.shape(), &Device::Cpu).unwrap())
            .unwrap();
        let up = u(&m);
        let mut minus = base.clone();
        minus[i] -= h;
        w.set(&Tensor::from_slice(&minus, w.shape(), &Device::Cpu).unwrap())
            .unwrap();
        let um = u(&m);
        let fd = (up - um) / (2.0 * h as f64);
        assert!(
            (fd - g[i] as f64).abs() < 2e-2 * fd.abs().max(1.0),
            "weight {i}: fd {fd} vs {}",
            g[i]
        );
    }
}

#[test]
fn gamma_gibbs_step_tracks_weight_scale() {
    // With Σθ² = s over n elements, Gamma(a + n/2, b + s/2) has mean ≈ n/s for large n.
    let m = tiny();
    let mut prior = Prior::new(
        PriorSpec::Gamma {
            shape: 1.0,
            rate: 1.0,
        },
        m.params.len(),
    )
    .unwrap();
    let big = Tensor::ones((200, 50), candle_core::DType::F32, &Device::Cpu).unwrap();
    let v = candle_core::Var::from_tensor(&(big * 0.1).unwrap()).unwrap();
    prior.precisions = vec![1.0];
    prior.gibbs_step(&[v], 1.0, 3).unwrap();
    // n = 10⁴, s = 100: shape 5001, rate 51 → mean 98.1, sd 1.4.
    assert!(
        (prior.precisions[0] - 98.06).abs() < 7.0,
        "{}",
        prior.precisions[0]
    );
}

#[test]
fn gamma_gibbs_step_reports_overflowing_parameters() {
    // |θ| = 1e20 is finite in f32 but θ² is not: a blown-up chain, reported as such
    // (train turns it into a "diverged, try a smaller step size" error).
    let mut prior = Prior::new(
        PriorSpec::Gamma {
            shape: 1.0,
            rate: 1.0,
        },
        1,
    )
    .unwrap();
    let huge = Tensor::ones((4, 4), candle_core::DType::F32, &Device::Cpu).unwrap();
    let v = candle_core::Var::from_tensor(&(huge * 1e20).unwrap()).unwrap();
    let err = prior.gibbs_step(&[v], 1.0, 3).unwrap_err();
    assert!(matches!(err, bnn::error::Error::NotFinite(_)), "{err}");
    assert_eq!(
        prior.precisions,
        vec![1.0],
        "a failed step leaves λ as it was"
    );
}
