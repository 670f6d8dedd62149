//! The step plan's ensemble (`PlannedChains::predict`): held-out sets resident beside
//! the training set, their rows through the plan's forward part chunk by chunk (every
//! chain reading the same rows), softmax into every chain's probabilities, on the host
//! executor, against `ensemble::predict` of the same θ (the CPU's forward pass). On
//! 784-100-10 at K = 1 (MNIST's 10,000 test rows: two chunks, the last partial) and
//! 784-400-400-10 at K = 3 (four chunks), after 20 updates so that the θ read is the
//! plan's, with a second set of rows that is no multiple of any chunk.
//!
//! The bar, 2e-6 absolute on every probability: the two compute the same products in
//! other summation orders (784 and 400 terms, about 1e-6 relative on a logit of |z| ≲ 10
//! at worst, far less typically) and e^x by the polynomial against libm (2 ulp); a wrong
//! stride, bias or chunk offset moves probabilities by 1e-2 or more.

use bnn::data::{load_builtin, Split};
use bnn::engine::planned::{PlannedChains, Resident};
use bnn::ensemble;
use bnn::model::Activation;
use bnn::sampler::{Integrator, SamplerKind};
use candle_core::Device;

use super::plan::{chains, inputs, mlp, order, params, resident, BATCH, UPDATES};

/// The largest |a − b|.
fn worst(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn plan_predicts_the_cpu_forward_passs_probabilities_of_held_out_rows() {
    let ds = load_builtin().unwrap();
    let all: Vec<usize> = (0..ds.test.len()).collect();
    let (mut test, mut labels) = (Vec::new(), Vec::new());
    ds.test.gather(&all, &mut test, &mut labels);
    let (x, y) = resident();
    // A second set: 1,234 training rows as a table split of their features.
    let rows = 1234;
    let labels8: Vec<u8> = y[..rows].iter().map(|&l| l as u8).collect();
    let part = Split::of_table(x[..rows * 784].to_vec(), 784, labels8, Vec::new());
    let p = params(SamplerKind::Sgnht, Integrator::Euler);
    for (hidden, k) in [(&[100][..], 1usize), (&[400, 400][..], 3)] {
        let r = chains(&mlp(hidden, Activation::Relu), k, p, 1.0);
        let states: Vec<_> = r.samplers.iter().map(|s| s.state().unwrap()).collect();
        let data = Resident::Classes { x: &x, labels: &y };
        let sets: [&[f32]; 2] = [&test, &x[..rows * 784]];
        let dims = (BATCH, UPDATES * BATCH);
        let mut plan =
            PlannedChains::on(&inputs(&r, &states, p), data, &sets, dims, &Device::Cpu).unwrap();
        let orders: Vec<Vec<usize>> = (0..k).map(order).collect();
        plan.begin_epoch(&orders.iter().map(|o| o.as_slice()).collect::<Vec<_>>())
            .unwrap();
        plan.run(20).unwrap();
        for (set, split) in [(0, &ds.test), (1, &part)] {
            let got = plan.predict(set).unwrap();
            assert_eq!(got.len(), k);
            for (c, probs) in got.iter().enumerate() {
                plan.read_theta(c, &r.nets[c]).unwrap();
                let want = ensemble::predict(&r.nets[c], split, &Device::Cpu).unwrap();
                let err = worst(probs, &want);
                println!("{hidden:?} K={k} set {set} chain {c}: worst |Δp| {err:e}");
                assert!(err <= 2e-6, "{hidden:?} K={k} set {set} chain {c}: {err}");
            }
        }
    }
}
