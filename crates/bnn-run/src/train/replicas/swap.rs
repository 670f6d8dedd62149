//! An exchange round (Luo et al. 2018, Algorithm 1 with criterion (17)) over replicas that
//! may live on different ranks.
//!
//! Every rank holds the same ladder and runs the same round: the pairs (DEO or random), each
//! pair's random stream, its shared minibatch order, the doubling of the minibatch from 256
//! and the test itself. The only inputs a rank cannot compute are the energies of replicas
//! held elsewhere, so a round goes in stages: at each stage every rank evaluates, for the
//! pairs still estimating, the per-example energies −log p(y|x, θ) of the replicas it holds
//! (and their prior energies at the first stage; a regression's include its noise
//! precision τ, part of its state), and one all-gather gives every rank all of
//! them. Each rank then forms the same estimates and takes the same decisions: temperatures
//! move, parameters never do. In one process nothing is sent and the numbers are the same,
//! so the decisions do not depend on the number of ranks.

use std::sync::Mutex;
use std::time::Instant;

use rand::seq::SliceRandom;
use rand::SeedableRng;

use super::{Plan, Replica, ReplicaReport};
use crate::engine::exchange::{energy_difference, logistic, Compensation};
use crate::ensemble;
use crate::error::{Error, Result};
use crate::ranks::Ranks;
use crate::rng;
use crate::sampler::ladder::Ladder;

/// The first minibatch of an exchange estimate (Algorithm 1 grows it from here).
const FIRST_EXCHANGE_BATCH: usize = 256;

/// One pair's estimate of ΔẼ as it grows.
struct Estimate {
    /// The pair (i, i+1) of temperature indices, and the replicas holding them.
    i: usize,
    a: usize,
    b: usize,
    rng: rand::rngs::StdRng,
    /// The pair's shared minibatch order over the training set.
    order: Vec<usize>,
    /// (1/T_a − 1/T_b) over the posterior temperature: ΔẼ per unit of energy.
    scale: f64,
    prior_difference: f64,
    /// Per-example differences of −log p(y|x, θ) between a and b so far.
    d: Vec<f64>,
    /// The examples the next stage covers: `order[d.len()..n]`.
    n: usize,
    /// ΔẼ, its variance and the examples used, once the estimate is good enough.
    done: Option<(f64, f64, usize)>,
}

/// What a stage asks of a replica: its prior energy, or its per-example energies on
/// `order[from..to]` of estimate `e`.
#[derive(Clone, Copy)]
enum Request {
    Prior {
        replica: usize,
    },
    Energies {
        replica: usize,
        e: usize,
        from: usize,
        to: usize,
    },
}

impl Request {
    fn replica(&self) -> usize {
        match *self {
            Request::Prior { replica } | Request::Energies { replica, .. } => replica,
        }
    }

    fn len(&self) -> usize {
        match *self {
            Request::Prior { .. } => 1,
            Request::Energies { from, to, .. } => to - from,
        }
    }
}

/// Pair `i`'s estimate before its first evaluation: its replicas, its own shuffle of the
/// examples (seeded by the run, the round and the pair), and the scale of ΔẼ.
fn new_estimate(plan: &Plan, ladder: &Ladder, round: u64, i: usize) -> Estimate {
    let seed = plan.cfg.settings.seed;
    let n_all = plan.ds.train.len();
    let mut rng = rand::rngs::StdRng::seed_from_u64(rng::exchange_pair_seed(seed, round, i));
    let mut order: Vec<usize> = (0..n_all).collect();
    order.shuffle(&mut rng);
    let (t_a, t_b) = (ladder.temperatures[i], ladder.temperatures[i + 1]);
    Estimate {
        i,
        a: ladder.holder[i],
        b: ladder.holder[i + 1],
        rng,
        order,
        scale: energy_difference(1.0, 0.0, t_a, t_b) / plan.cfg.settings.temperature,
        prior_difference: 0.0,
        d: Vec::new(),
        n: FIRST_EXCHANGE_BATCH.min(n_all),
        done: None,
    }
}

/// The evaluations the unsettled estimates need next, in the order they are read: the
/// priors (first stage only), then the energies of each pair's two replicas.
fn requests_of(estimates: &[Estimate], first: bool) -> Vec<Request> {
    let mut requests = Vec::new();
    for (k, e) in estimates
        .iter()
        .enumerate()
        .filter(|(_, e)| e.done.is_none())
    {
        if first {
            requests.push(Request::Prior { replica: e.a });
            requests.push(Request::Prior { replica: e.b });
        }
        for replica in [e.a, e.b] {
            let (from, to) = (e.d.len(), e.n);
            requests.push(Request::Energies {
                replica,
                e: k,
                from,
                to,
            });
        }
    }
    requests
}

/// The exchange round after the updates: each of the round's pairs of adjacent
/// temperatures tries to swap (eq. 17); the ladder records the outcomes in pair order (and
/// adapts, if it adapts). `replicas[j]` is `Some` on the rank that holds replica j.
pub(super) fn exchange(
    plan: &Plan,
    replicas: &[Option<Replica>],
    report: &mut ReplicaReport,
    compensation: &Compensation,
    ranks: &Ranks,
) -> Result<()> {
    let started = Instant::now();
    let (seed, round) = (plan.cfg.settings.seed, report.ladder.rounds);
    let mut round_rng = rand::rngs::StdRng::seed_from_u64(rng::exchange_round_seed(seed, round));
    let pairs = report.ladder.pairs(&mut round_rng);
    let mut estimates: Vec<Estimate> = pairs
        .iter()
        .map(|&i| new_estimate(plan, &report.ladder, round, i))
        .collect();
    let n_all = plan.ds.train.len();
    let mut first = true;
    while estimates.iter().any(|e| e.done.is_none()) {
        let requests = requests_of(&estimates, first);
        let mut answers = answer(plan, replicas, &estimates, &requests, ranks, report)?.into_iter();
        for e in estimates.iter_mut().filter(|e| e.done.is_none()) {
            let mut next = || {
                answers
                    .next()
                    .ok_or_else(|| Error::Config("an exchange lost an answer".into()))
            };
            if first {
                e.prior_difference = next()?[0] - next()?[0];
            }
            let (la, lb) = (next()?, next()?);
            e.d.extend(la.iter().zip(&lb).map(|(x, y)| x - y));
            e.done = settled(e, n_all, compensation, plan)?;
            e.n = (2 * e.n).min(n_all);
        }
        first = false;
    }
    for e in &mut estimates {
        let (delta, variance, examples) = e.done.unwrap_or_default();
        let accepted = compensation.accept(delta, variance, &mut e.rng)?;
        report.ladder.record(e.i, accepted, logistic(delta));
        report.exchange_estimates += 1;
        report.exchange_examples += examples as u64;
    }
    report.exchange_seconds += started.elapsed().as_secs_f64();
    Ok(())
}

/// ΔẼ of the pair on the examples so far (Algorithm 1, lines 2–4): U_a − U_b is N times
/// the mean per-example difference plus the exact difference of the prior energies, times
/// the scale; its variance (1/T_a − 1/T_b)² N² s²/n (1 − n/N) with the finite-population
/// correction (0 at n = N). Done once the variance is at most σ*² or every example is in.
fn settled(
    e: &Estimate,
    n_all: usize,
    compensation: &Compensation,
    plan: &Plan,
) -> Result<Option<(f64, f64, usize)>> {
    let k = e.d.len() as f64;
    let mean = e.d.iter().sum::<f64>() / k;
    let var_d = e.d.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (k - 1.0).max(1.0);
    let total = n_all as f64;
    let delta = e.scale * (total * mean + e.prior_difference);
    let variance = e.scale * e.scale * total * total * var_d / k * (1.0 - k / total);
    if !delta.is_finite() {
        let what = "in an exchange between two replicas".to_string();
        let energy = ("energy difference", delta);
        let eta = plan.cfg.settings.sampler.step_size;
        return Err(super::super::chain::diverged(0, 0, energy, what, eta));
    }
    Ok(
        (variance <= compensation.sigma2 || e.d.len() == n_all).then_some((
            delta,
            variance.max(0.0),
            e.d.len(),
        )),
    )
}

/// Every request's numbers, in request order, at every rank: each rank computes those of
/// the replicas it holds (side by side on the pool), then one all-gather.
fn answer(
    plan: &Plan,
    replicas: &[Option<Replica>],
    estimates: &[Estimate],
    requests: &[Request],
    ranks: &Ranks,
    report: &mut ReplicaReport,
) -> Result<Vec<Vec<f64>>> {
    let local: Vec<usize> = (0..requests.len())
        .filter(|&q| replicas[requests[q].replica()].is_some())
        .collect();
    // What a request reads of a replica (its sampler stays behind: not shareable).
    let views: Vec<Option<View>> = replicas
        .iter()
        .map(|r| {
            r.as_ref().map(|r| View {
                model: &r.chain.model,
                potential: &r.chain.stepper.potential,
                labels: r.chain.labels(),
            })
        })
        .collect();
    let results: Vec<Mutex<Option<Result<Vec<f64>>>>> =
        local.iter().map(|_| Mutex::new(None)).collect();
    crate::pool::run(local.len(), &|k| {
        let request = requests[local[k]];
        let out = compute(plan, &views, estimates, request);
        if let Ok(mut slot) = results[k].lock() {
            *slot = Some(out);
        }
    });
    let mut mine = Vec::new();
    for slot in results {
        let numbers = slot
            .into_inner()
            .ok()
            .flatten()
            .ok_or_else(|| Error::Config("an exchange estimate did not report".into()))??;
        mine.extend(numbers);
    }
    if ranks.size() == 1 {
        let mut at = 0;
        return Ok(requests
            .iter()
            .map(|q| {
                at += q.len();
                mine[at - q.len()..at].to_vec()
            })
            .collect());
    }
    let all = ranks.all_gather(&mine);
    report.exchange_bytes += all.iter().map(|v| 8 * v.len() as u64).sum::<u64>();
    // Each rank's numbers are its requests' in request order.
    let mut at = vec![0usize; ranks.size()];
    requests
        .iter()
        .map(|q| {
            let r = ranks.rank_of(q.replica());
            let (from, to) = (at[r], at[r] + q.len());
            at[r] = to;
            all[r].get(from..to).map(<[f64]>::to_vec).ok_or_else(|| {
                Error::Config(format!("rank {r} sent too few energies for an exchange"))
            })
        })
        .collect()
}

/// A replica as an exchange sees it.
struct View<'r> {
    model: &'r crate::model::Network,
    potential: &'r crate::potential::Potential,
    labels: Option<&'r [u8]>,
}

/// One request's numbers, on the rank holding its replica.
fn compute(
    plan: &Plan,
    views: &[Option<View>],
    estimates: &[Estimate],
    request: Request,
) -> Result<Vec<f64>> {
    let v = views[request.replica()]
        .as_ref()
        .ok_or_else(|| Error::Config("an exchange asked a replica of another rank".into()))?;
    // A regression's state is (θ, τ): its energy adds τ's prior and the data's ½ ln τ
    // terms, the density that τ's tempered Gibbs step samples.
    let tau = v.potential.noise_precision;
    match request {
        Request::Prior { .. } => {
            let noise = v
                .potential
                .likelihood
                .noise()
                .map_or(0.0, |n| n.prior_energy(tau));
            Ok(vec![v.potential.prior.energy(&v.model.vars())? + noise])
        }
        Request::Energies { e, from, to, .. } => {
            let idx = &estimates[e].order[from..to];
            let (ds, device) = (plan.ds, &plan.cfg.device);
            match ds.task.is_regression() {
                true => ensemble::example_gaussian_nll(v.model, &ds.train, idx, tau, device),
                false => ensemble::example_nll(v.model, &ds.train, v.labels, idx, device),
            }
        }
    }
}
