//! The step plan on its host executor against the CPU path: K MLP chains on the built-in
//! MNIST subset, 50 updates, every fused sampler (SGLD, pSGLD, SGHMC, SGNHT, mSGNHT with
//! both integrators), K = 1 against one chain of candle's autograd and K = 4 against the
//! four chains stacked (`evaluate_stacked`, the stacked fused step of `--chain-layout
//! stacked`), on 784-100-10 and 784-400-400-10, with a prior precision of its own per
//! tensor and T ≠ 1 in one case.
//!
//! Same noise (Philox keyed alike), so the only differences are summation orders (the
//! plan's GEMMs, its polynomial exp and log in the softmax, the prior's term added in f32
//! in the update where autograd adds it before /T), which stay near 1e-8 of ‖θ‖ over 50
//! updates, until a pre-activation falls within rounding of ReLU's kink and the two
//! trajectories part there: the bars and their figures are at [`all_agree`].

use bnn::engine::planned::{ChainInput, PlannedChains, Resident};
use bnn::model::stacked::Stacked;
use bnn::model::{Activation, ModelSpec, Network};
use bnn::potential::{evaluate_stacked, Potential, Prior, PriorSpec};
use bnn::sampler::{build_with, Integrator, Kernel, Sampler, SamplerKind, SamplerParams};
use candle_core::{Device, Tensor};

pub(super) use crate::common::plan::{order, params, resident, BATCH, ROWS, UPDATES};

fn potential(tensors: usize, temperature: f64, k: usize) -> Potential {
    let mut prior = Prior::new(PriorSpec::DEFAULT, tensors).unwrap();
    prior.precisions = (0..tensors)
        .map(|t| 0.5 + t as f64 + 0.25 * k as f64)
        .collect();
    Potential::new(ROWS, temperature, prior).unwrap()
}

/// K chains' networks and samplers, built twice from the same seeds: one set for the
/// reference, one whose state goes into the plan.
pub(super) struct Chains {
    pub(super) nets: Vec<Network>,
    pub(super) samplers: Vec<Box<dyn Sampler>>,
    potentials: Vec<Potential>,
}

pub(super) fn chains(spec: &ModelSpec, k: usize, p: SamplerParams, temperature: f64) -> Chains {
    let nets: Vec<Network> = (0..k)
        .map(|c| Network::new(spec, 784, 10, 40 + c as u64, &Device::Cpu).unwrap())
        .collect();
    let samplers = nets
        .iter()
        .enumerate()
        .map(|(c, n)| build_with(p, &n.vars(), 900 + c as u64, Kernel::Fused).unwrap())
        .collect();
    let potentials = (0..k)
        .map(|c| potential(nets[0].params.len(), temperature, c))
        .collect();
    Chains {
        nets,
        samplers,
        potentials,
    }
}

/// The minibatch of update u of chain c as tensors.
fn batch(x: &[f32], y: &[u32], c: usize, u: usize) -> (Vec<f32>, Vec<u32>) {
    let rows = &order(c)[u * BATCH..(u + 1) * BATCH];
    let xs = rows
        .iter()
        .flat_map(|&r| x[r * 784..(r + 1) * 784].iter().copied())
        .collect();
    (xs, rows.iter().map(|&r| y[r]).collect())
}

/// The reference, one update at a time: K = 1 by `Potential::evaluate` and the sampler's
/// step; K > 1 stacked. After each update the networks hold θ.
struct Reference {
    chains: Chains,
    stack: Option<Stacked>,
}

impl Reference {
    fn new(chains: Chains) -> Self {
        let stack = (chains.nets.len() > 1)
            .then(|| Stacked::new(&chains.nets.iter().collect::<Vec<_>>()).unwrap());
        Reference { chains, stack }
    }

    fn step(&mut self, x: &[f32], y: &[u32], u: usize) {
        let r = &mut self.chains;
        let Some(stack) = &self.stack else {
            let (xb, yb) = batch(x, y, 0, u);
            let xt = Tensor::from_vec(xb, (BATCH, 784), &Device::Cpu).unwrap();
            let yt = Tensor::from_vec(yb, BATCH, &Device::Cpu).unwrap();
            let eval = r.potentials[0].evaluate(&r.nets[0], &xt, &yt).unwrap();
            r.samplers[0].step(&r.nets[0].vars(), &eval.grads).unwrap();
            return;
        };
        let k = r.nets.len();
        let (mut xs, mut ys) = (Vec::new(), Vec::new());
        for c in 0..k {
            let (xb, yb) = batch(x, y, c, u);
            xs.extend(xb);
            ys.extend(yb);
        }
        let xt = Tensor::from_vec(xs, (k, BATCH, 784), &Device::Cpu).unwrap();
        let yt = Tensor::from_vec(ys, (k, BATCH), &Device::Cpu).unwrap();
        let pots: Vec<&Potential> = r.potentials.iter().collect();
        let eval = evaluate_stacked(&pots, stack, &xt, &yt).unwrap();
        let mut opens: Vec<_> = r
            .samplers
            .iter_mut()
            .map(|s| bnn::kernels::begin(s.as_mut()).unwrap())
            .collect();
        for (t, (p, g)) in stack.params.iter().zip(&eval.grads).enumerate() {
            let mut lent: Vec<_> = opens
                .iter_mut()
                .map(|o| o.lend(t).unwrap().unwrap())
                .collect();
            let sums =
                bnn::kernels::stacked::step(&p.var.as_detached_tensor(), g, &mut lent).unwrap();
            drop(lent);
            for (o, s) in opens.iter_mut().zip(sums) {
                o.lent(t, s).unwrap();
            }
        }
        opens.into_iter().for_each(|o| o.finish().unwrap());
        for c in 0..k {
            stack.copy_out(c, &r.nets[c]).unwrap();
        }
    }
}

fn theta(net: &Network) -> Vec<f32> {
    net.params
        .iter()
        .flat_map(|p| {
            p.var
                .as_tensor()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
        })
        .collect()
}

/// A plan of `r`'s chains, loaded from their networks and samplers as they stand, its
/// epoch the chains' orders.
fn planned(r: &Chains, x: &[f32], y: &[u32], p: SamplerParams) -> PlannedChains {
    let states: Vec<_> = r.samplers.iter().map(|s| s.state().unwrap()).collect();
    let inputs = inputs(r, &states, p);
    let resident = Resident::Classes { x, labels: y };
    let mut plan = PlannedChains::new(&inputs, resident, BATCH, UPDATES * BATCH).unwrap();
    let orders: Vec<Vec<usize>> = (0..r.nets.len()).map(order).collect();
    plan.begin_epoch(&orders.iter().map(|o| o.as_slice()).collect::<Vec<_>>())
        .unwrap();
    plan
}

pub(super) fn inputs<'a>(
    r: &'a Chains,
    states: &'a [bnn::sampler::SamplerState],
    p: SamplerParams,
) -> Vec<ChainInput<'a>> {
    (0..r.nets.len())
        .map(|c| ChainInput {
            net: &r.nets[c],
            params: p,
            state: &states[c],
            seed: 900 + c as u64,
            potential: &r.potentials[c],
        })
        .collect()
}

/// ‖a − b‖/‖b‖.
fn relative(a: &[f32], b: &[f32]) -> f64 {
    let sq = |f: &dyn Fn(usize) -> f64| (0..b.len()).map(f).sum::<f64>().sqrt();
    sq(&|i| (a[i] as f64 - b[i] as f64).powi(2)) / sq(&|i| (b[i] as f64).powi(2))
}

/// Chain c's θ in the plan.
fn plan_theta(plan: &mut PlannedChains, c: usize, probe: &Network) -> Vec<f32> {
    plan.read_theta(c, probe).unwrap();
    theta(probe)
}

/// The figures of one configuration: the worst one-update error in lockstep, and θ's
/// error after 50 free updates, over the chains.
struct Agreement {
    lockstep: f64,
    free: f64,
}

/// 50 updates of the reference, of a plan run freely beside it, and (with `lockstep_on`)
/// of a plan loaded before each update with the reference's state; after each update the
/// lockstep plan's θ against the reference's, and at the end the free plan's θ, v and α,
/// step counter and epoch counts.
fn agree(
    spec: &ModelSpec,
    k: usize,
    (kind, integrator): (SamplerKind, Integrator),
    temperature: f64,
    lockstep_on: bool,
) -> Agreement {
    let (x, y) = resident();
    let p = params(kind, integrator);
    let what = format!(
        "{} K={k} {kind:?} {integrator:?} T={temperature}",
        spec.label()
    );
    let mut r = Reference::new(chains(spec, k, p, temperature));
    let mut free = planned(&r.chains, &x, &y, p);
    let mut lock = planned(&r.chains, &x, &y, p);
    // A network of its own (a clone would share the reference's storage).
    let probe = Network::new(&r.chains.nets[0].spec, 784, 10, 1, &Device::Cpu).unwrap();
    let (mut lockstep, mut errors) = (0f64, vec![Vec::new(); if lockstep_on { k } else { 0 }]);
    for u in 0..UPDATES {
        if lockstep_on {
            let states: Vec<_> = r
                .chains
                .samplers
                .iter()
                .map(|s| s.state().unwrap())
                .collect();
            for (c, input) in inputs(&r.chains, &states, p).iter().enumerate() {
                lock.load(c, input).unwrap();
            }
            lock.run(1).unwrap();
        }
        free.run(1).unwrap();
        r.step(&x, &y, u);
        for c in (0..k).filter(|_| lockstep_on) {
            errors[c].push(relative(
                &plan_theta(&mut lock, c, &probe),
                &theta(&r.chains.nets[c]),
            ));
        }
    }
    for (c, e) in errors.iter_mut().enumerate() {
        e.sort_by(f64::total_cmp);
        let (median, max) = (e[e.len() / 2], e[e.len() - 1]);
        assert!(
            median <= 1e-7,
            "{what} chain {c}: one update's median ‖Δθ‖/‖θ‖ = {median:e}"
        );
        assert!(
            max <= 1e-5,
            "{what} chain {c}: one update's ‖Δθ‖/‖θ‖ = {max:e}"
        );
        lockstep = lockstep.max(max);
    }
    let mut worst_free = 0f64;
    for c in 0..k {
        let e = relative(&plan_theta(&mut free, c, &probe), &theta(&r.chains.nets[c]));
        worst_free = worst_free.max(e);
        let (got, want) = (
            free.state(c).unwrap(),
            r.chains.samplers[c].state().unwrap(),
        );
        assert_eq!(got.clock(), want.clock(), "{what}: the step counter");
        let flat = |ts: &[Tensor]| -> Vec<f32> {
            ts.iter()
                .flat_map(|t| t.to_vec1::<f32>().unwrap())
                .collect()
        };
        if !want.momentum().is_empty() {
            let ev = relative(&flat(got.momentum()), &flat(want.momentum()));
            assert!(ev <= 1e-2, "{what}: ‖Δv‖/‖v‖ = {ev:e}");
        }
        if let (Some(a), Some(b)) = (got.thermostat(), want.thermostat()) {
            assert!(
                (a - b).abs() <= 1e-5 * b.abs().max(1e-3),
                "{what}: thermostat {a} vs {b}"
            );
        }
        let ctl = free.control(c).unwrap();
        assert_eq!((ctl.halted, ctl.updates), (0, UPDATES as u64), "{what}");
    }
    eprintln!(
        "plan = CPU path: {what}: one update {lockstep:.1e}, 50 free updates {worst_free:.1e}"
    );
    Agreement {
        lockstep,
        free: worst_free,
    }
}

/// The bars: a single update from the reference's state (lockstep) within 1e-7 of it at
/// the median over the 50 (measured 1e-9 – 4e-8: an error in the update shows at every
/// one) and within 1e-5 at worst (measured up to 5.9e-7, 1.5e-6 with BNN_ISA=portable,
/// where a pre-activation fell within rounding of ReLU's kink in one row, which then takes
/// the other side in one computation); θ after 50 free updates within 1e-3, v within 1e-2
/// (v is the small difference of big kicks: a kink's one example shows more in it). Free trajectories can part at such a kink: the error steps up at one
/// update (2.7e-9 → 5.9e-7 in one chain) and momentum carries it on (to 4e-5 by update
/// 50), so 1e-5 is asserted only where the activation is smooth
/// ([`plan_with_tanh_stays_within_1e_5_of_the_cpu_path_for_50_free_updates`]); the
/// ReLU runs' figures are printed.
fn all_agree(results: &[(String, Agreement)]) {
    for (what, a) in results {
        assert!(
            a.free <= 1e-3,
            "{what}: θ after 50 updates off by {:e}",
            a.free
        );
        assert!(a.lockstep <= 1e-5, "{what}");
    }
}

const SAMPLERS: [(SamplerKind, Integrator); 7] = [
    (SamplerKind::Sgld, Integrator::Euler),
    (SamplerKind::Psgld, Integrator::Euler),
    (SamplerKind::Sghmc, Integrator::Euler),
    (SamplerKind::Sgnht, Integrator::Euler),
    (SamplerKind::Sgnht, Integrator::Splitting),
    (SamplerKind::Msgnht, Integrator::Euler),
    (SamplerKind::Msgnht, Integrator::Splitting),
];

pub(super) fn mlp(hidden: &[usize], activation: Activation) -> ModelSpec {
    ModelSpec {
        hidden: hidden.to_vec(),
        activation,
        ..ModelSpec::default()
    }
}

/// Each of `samplers` at each K of `chains`; the lockstep check with `lockstep`.
fn run_all(
    spec: &ModelSpec,
    samplers: &[(SamplerKind, Integrator)],
    chains: &[usize],
    lockstep: bool,
) -> Vec<(String, Agreement)> {
    let mut out = Vec::new();
    for &sampler in samplers {
        for &k in chains {
            out.push((
                format!("{sampler:?} K={k}"),
                agree(spec, k, sampler, 1.0, lockstep),
            ));
        }
    }
    out
}

#[test]
fn plan_784_100_10_matches_the_cpu_path_for_every_sampler_one_chain_and_four() {
    let spec = mlp(&[100], Activation::Relu);
    let mut results = run_all(&spec, &SAMPLERS, &[1, 4], true);
    let t = agree(
        &spec,
        4,
        (SamplerKind::Sghmc, Integrator::Splitting),
        0.7,
        true,
    );
    results.push(("SGHMC splitting at T = 0.7".into(), t));
    all_agree(&results);
}

#[test]
fn plan_784_400_400_10_matches_the_cpu_path_for_every_sampler_one_chain_and_four() {
    // SGNHT's splitting integrator is checked on 784-100-10 (the suite's time).
    let samplers: Vec<_> = SAMPLERS
        .into_iter()
        .filter(|s| *s != (SamplerKind::Sgnht, Integrator::Splitting))
        .collect();
    all_agree(&run_all(
        &mlp(&[400, 400], Activation::Relu),
        &samplers,
        &[1, 4],
        true,
    ));
}

/// With a smooth activation nothing parts the trajectories: θ after 50 free updates within
/// 1e-5 of the CPU path, four chains of 784-400-400-10, for the samplers whose ReLU runs
/// parted (all seven passed, 1.9e-8 – 9.2e-7, when written; three kept for the suite's
/// time).
#[test]
fn plan_with_tanh_stays_within_1e_5_of_the_cpu_path_for_50_free_updates() {
    let samplers = [
        (SamplerKind::Sghmc, Integrator::Euler),
        (SamplerKind::Sgnht, Integrator::Euler),
        (SamplerKind::Sgnht, Integrator::Splitting),
    ];
    for (what, a) in run_all(&mlp(&[400, 400], Activation::Tanh), &samplers, &[4], false) {
        assert!(
            a.free <= 1e-5,
            "{what}: θ after 50 free updates off by {:e}",
            a.free
        );
    }
}

/// `bnn bench plan` prints the plan of 784-100-10 at batch 100: at most 14 launches an
/// update for 1 chain and for 64 (the bar; 5L + 3 = 13), no host read inside an
/// epoch, bytes that grow with K, and the test set's prediction at a thinning point.
#[test]
fn bench_plan_prints_thirteen_launches_for_one_chain_and_sixty_four() {
    let dir = tempfile::tempdir().unwrap();
    let out = crate::common::bnn(dir.path(), &["bench", "plan", "--chains", "1,64"]);
    assert!(out.status.success(), "{}", crate::common::stderr(&out));
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for (r, k) in rows.iter().zip([1usize, 64]) {
        assert_eq!(r["launches"], 13, "{r}");
        assert_eq!(r["ops"].as_array().unwrap().len(), 13);
        assert_eq!(r["host_reads_per_update"], 0);
        // The test set's 10,000 rows in chunks of 8,192/K rows, 4 launches a chunk (2
        // GEMMs, bias+ReLU, softmax), the fold and the tally; one read of K × 2 tallies
        // of 49 f64; the sums (K × 10,000 × 11 f64) read only to save and at the end.
        let chunks = 10_000usize.div_ceil(8192 / k);
        assert_eq!(r["prediction_launches"], 4 * chunks + 2, "{r}");
        assert_eq!(r["prediction_read_bytes"], k * 2 * 49 * 8);
        assert_eq!(r["ensemble_sums_bytes"], k * 10_000 * 11 * 8);
    }
    let bytes = |i: usize| rows[i]["bytes_per_update"].as_u64().unwrap();
    assert!(bytes(1) > 60 * bytes(0), "{} vs {}", bytes(1), bytes(0));
}
