//! The step plan's ensemble (`PlannedChains::predict`): held-out sets resident beside
//! the training set, their rows through the plan's forward part chunk by chunk (every
//! chain reading the same rows), softmax into every chain's probabilities, on the host
//! executor, against `ensemble::predict` of the same θ (the CPU's forward pass). On
//! 784-100-10 at K = 1 (MNIST's 10,000 test rows: two chunks, the last partial) and
//! 784-400-400-10 at K = 3 (four chunks), after 20 updates so that the θ read is the
//! plan's, with a second set of rows that is no multiple of any chunk.
//!
//! Then the ensemble kept there (`PlannedChains::fold`): each sample's metrics alone and
//! the ensemble's after it, and the sums, are `Accumulator::add`'s of the same
//! probabilities bit for bit (the same f64 operations in the same order on the host
//! executor), and a plan restored from the sums continues as the one that kept them.
//!
//! The bar, 2e-6 absolute on every probability: the two compute the same products in
//! other summation orders (784 and 400 terms, about 1e-6 relative on a logit of |z| ≲ 10
//! at worst, far less typically) and e^x by the polynomial against libm (2 ulp); a wrong
//! stride, bias or chunk offset moves probabilities by 1e-2 or more.

use bnn::data::{load_builtin, Split};
use bnn::engine::planned::{HeldOutSet, PlannedChains, Resident};
use bnn::ensemble::{self, Accumulator, Folded};
use bnn::model::Activation;
use bnn::sampler::{Integrator, SamplerKind};
use candle_core::Device;

use super::plan::{chains, inputs, mlp, order, params, resident, BATCH, UPDATES};
use crate::common::plan::test_rows;

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
    let (test, labels) = test_rows();
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
        let sets = [
            HeldOutSet {
                x: &test,
                labels: &labels,
            },
            HeldOutSet {
                x: &x[..rows * 784],
                labels: &y[..rows],
            },
        ];
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

/// The plan's fold against `Accumulator::add` of the plan's own probabilities: three
/// samples of two chains with updates between, on MNIST's test set; every metric and the
/// sums bit for bit; then a fresh plan given the sums (a resumed run's) folds the fourth
/// sample as the first plan does.
#[test]
fn plan_folds_samples_into_ensembles_as_the_accumulator_does() {
    let (test, labels) = test_rows();
    let (x, y) = resident();
    let p = params(SamplerKind::Sghmc, Integrator::Euler);
    let k = 2;
    let r = chains(&mlp(&[100], Activation::Tanh), k, p, 1.0);
    let states: Vec<_> = r.samplers.iter().map(|s| s.state().unwrap()).collect();
    let sets = [HeldOutSet {
        x: &test,
        labels: &labels,
    }];
    let dims = (BATCH, UPDATES * BATCH);
    let data = Resident::Classes { x: &x, labels: &y };
    let open = || {
        let mut plan =
            PlannedChains::on(&inputs(&r, &states, p), data, &sets, dims, &Device::Cpu).unwrap();
        let orders: Vec<Vec<usize>> = (0..k).map(order).collect();
        plan.begin_epoch(&orders.iter().map(|o| o.as_slice()).collect::<Vec<_>>())
            .unwrap();
        plan
    };
    let mut plan = open();
    let mut accs: Vec<Accumulator> = (0..k)
        .map(|_| Accumulator::with_classes(&labels, 10).unwrap())
        .collect();
    for sample in 0..3 {
        plan.run(7).unwrap();
        let probs = plan.predict(0).unwrap();
        let folded: Vec<Folded> = plan
            .fold(0)
            .unwrap()
            .iter()
            .map(Folded::of_tallies)
            .collect();
        for c in 0..k {
            accs[c].add(&probs[c]).unwrap();
            let f = &folded[c];
            assert_eq!(
                Some(f.alone),
                accs[c].last_sample,
                "sample {sample} chain {c} alone"
            );
            assert_eq!(
                Some(&f.ensemble),
                accs[c].history.last(),
                "sample {sample} chain {c}"
            );
            assert_eq!(f.non_finite_rows, 0);
            let sums = accs[c].state().1;
            assert_eq!(
                plan.ensemble_sums(0, c).unwrap(),
                (sums.probability, sums.entropy),
                "sums {c}"
            );
        }
        println!("sample {sample}: ensemble {:?}", folded[0].ensemble);
    }
    let mut resumed = open();
    for (c, acc) in accs.iter().enumerate() {
        let (state, sums) = acc.state();
        resumed
            .restore_ensemble(0, c, (&sums.probability, &sums.entropy), state.samples)
            .unwrap();
        // The same θ: this test compares the ensembles, not the updates.
        plan.read_theta(c, &r.nets[c]).unwrap();
    }
    for (c, input) in inputs(&r, &states, p).iter().enumerate() {
        resumed.load(c, input).unwrap();
    }
    let (a, b) = (plan.fold(0).unwrap(), resumed.fold(0).unwrap());
    assert_eq!(a, b, "the fourth sample, kept on and restored");
    assert_ne!(
        Folded::of_tallies(&a[0]).ensemble,
        accs[0].history[2],
        "the fourth sample moved the ensemble"
    );
}
