//! `bnn train --sampler renhd|reld`: replica exchange (Luo et al. 2018, Algorithm 2 with the
//! exchange of Algorithm 1) over chains of [`super::chain`].
//!
//! Replica j is a chain with its own seed ([`rng::chain_seed`]), minibatch order, prior
//! precisions and folder `RUN/replica-j/` (its `metrics.jsonl`); at temperature T it runs
//! the sampler of [`replica_config`] on the potential U/T (the posterior temperature times
//! T). All replicas take the same number of updates, N = `--exchange-every` per round; at
//! the start of each round every replica's sampler is built afresh at the temperature it
//! now holds, which re-draws its momentum v ~ N(0, Tε) and resets its thermostat to c/T
//! (Algorithm 2, line 3). After the round, adjacent pairs of temperatures try to swap
//! (DEO or random pairs, [`Ladder`]) by the noise-tolerant test of eq. 17: the energy
//! difference is estimated on a minibatch shared by the pair, 256 examples doubling until
//! the estimate's variance (with the finite-population correction) is at most σ*², or the
//! whole training set. Temperatures move, parameters never do.
//!
//! The T = 1 samples come from whichever replica holds T₀ when the schedule keeps one,
//! into `RUN/chain-0/samples/` (the layout of a multi-chain run, so `bnn eval` reads it
//! as one); the ensembles of those samples are the run's.
//!
//! State: saved at the end of a round (every `--checkpoint-every` updates or once per
//! epoch, at the end, and on a signal) into one of two slots, `RUN/replicas/slot-{0,1}/`,
//! then `RUN/replicas.json` (the ladder, where the run stands, which slot) is replaced
//! atomically: a kill while a slot is written leaves the other slot and the old record.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

use super::chain::{append_line, diverged, interrupted, to_json, Chain, ChainOutcome, Kept};
use super::{EpochRecord, TrainConfig};
use crate::checkpoint;
use crate::data::Dataset;
use crate::ensemble;
use crate::error::{Error, Result};
use crate::rng;
use crate::run_state::Progress;
use crate::sampler::exchange::{energy_difference, logistic, Compensation};
use crate::sampler::ladder::Ladder;
use crate::sampler::replica::{noise_coefficient, replica_config};
use crate::signals;

/// The first minibatch of an exchange estimate (Algorithm 1 grows it from here).
const FIRST_EXCHANGE_BATCH: usize = 256;

/// What `summary.json` says of the replicas.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReplicaReport {
    /// Temperatures, holders, swap counts and round trips (counted since the ladder froze
    /// where it adapts).
    pub ladder: Ladder,
    pub swap_rates: Vec<f64>,
    /// The mean of g(ΔẼ), each try's swap probability given its estimate, per pair: the
    /// same rate with less noise.
    pub expected_swap_rates: Vec<f64>,
    /// Updates of all replicas together (gradient evaluations).
    pub gradient_evaluations: u64,
    /// Exchange estimates made, and the examples they evaluated (per model).
    pub exchange_estimates: u64,
    pub exchange_examples: u64,
    /// Wall time of the exchanges (their forward passes).
    pub exchange_seconds: f64,
}

/// `RUN/replicas.json`: which slot holds the replicas' state, and the run's own.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    slot: usize,
    step: u64,
    train_seconds: f64,
    report: ReplicaReport,
}

/// A replica's chain and what it carries between rounds.
struct Replica<'a> {
    chain: Chain<'a>,
    shuffle: rand::rngs::StdRng,
    order: Vec<usize>,
    /// The epoch's running sums, and the seconds spent in updates.
    sums: Progress,
    step_seconds: f64,
    epoch_started: Instant,
}

/// The run-wide constants of the replicas' loop.
struct Plan<'a> {
    cfg: &'a TrainConfig,
    ds: &'a Dataset,
    batches: u64,
    total_steps: u64,
    epsilon: f64,
    c: f64,
    cold_dir: PathBuf,
}

/// Runs the replicas of `cfg` on `ds`; the T = 1 chain's outcome and the replicas' report.
pub(super) fn run_replicas(
    cfg: &TrainConfig,
    ds: &Dataset,
) -> Result<(ChainOutcome, ReplicaReport)> {
    let s = &cfg.settings;
    let options = s
        .replicas
        .as_ref()
        .ok_or_else(|| Error::Config("replica exchange without its options".into()))?;
    let run_dir = &cfg.run_dir;
    let m = options.replicas;
    let batches = (ds.train.len() / s.batch_size) as u64;
    let plan = Plan {
        cfg,
        ds,
        batches,
        total_steps: batches * s.epochs as u64,
        epsilon: s.sampler.step_size,
        c: noise_coefficient(&s.sampler),
        cold_dir: checkpoint::chain_dir(run_dir, 0),
    };
    // Each replica's own settings: its seed, and its sampler at T = 1 (rebuilt each round).
    let cfgs: Vec<TrainConfig> = (0..m)
        .map(|j| {
            let mut c = cfg.clone();
            c.settings.seed = rng::chain_seed(s.seed, j);
            c.settings.sampler = replica_config(
                s.sampler.kind,
                options.thermostat,
                plan.epsilon,
                plan.c,
                1.0,
            );
            c.progress = false;
            c
        })
        .collect();
    let dirs: Vec<PathBuf> = (0..m).map(|j| replica_dir(run_dir, j)).collect();
    let mut replicas = Vec::with_capacity(m);
    for (j, (c, dir)) in cfgs.iter().zip(&dirs).enumerate() {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let mut chain = Chain::new(c, ds, dir, s.seed)?;
        chain.monitor = super::diagnostics::Monitor::new(
            s.log_every,
            chain.stepper.sampler.diagnostics().thermostat,
            &format!("replica {j}: "),
        )
        .checking_from(s.schedule.burnin);
        replicas.push(Replica {
            chain,
            shuffle: rand::rngs::StdRng::seed_from_u64(c.settings.seed ^ rng::SHUFFLE_STREAM),
            order: (0..ds.train.len()).collect(),
            sums: Progress::default(),
            step_seconds: 0.0,
            epoch_started: Instant::now(),
        });
    }
    let num_params = replicas[0].chain.model.num_params();
    let mut cold = Kept::new(ds);
    let (mut step, mut report, seconds_before, mut saves) = if cfg.resume {
        restore(&plan, &mut replicas, &mut cold)?
    } else {
        let ladder = match options.ladder {
            Some(tau) => Ladder::geometric(m, tau, options.pairs)?,
            // Swaps need ΔT ≈ O(1/√d) (ΔE grows like √d): start there, then adapt.
            None => Ladder::geometric(m, 1.0 + 3.0 / (num_params as f64).sqrt(), options.pairs)?
                .adapting(options.target_swap_rate)?,
        };
        std::fs::create_dir_all(checkpoint::samples_dir(&plan.cold_dir))
            .map_err(|e| Error::io(&plan.cold_dir, e))?;
        let report = ReplicaReport {
            swap_rates: ladder.swap_rates(),
            expected_swap_rates: ladder.expected_swap_rates(),
            ladder,
            gradient_evaluations: 0,
            exchange_estimates: 0,
            exchange_examples: 0,
            exchange_seconds: 0.0,
        };
        (0, report, 0.0, 0)
    };
    if matches!(s.prior, crate::potential::PriorSpec::Gamma { .. }) {
        // Measured on the Fashion MLP (docs/BENCHMARKS.md, issue 15): the hyper-prior's
        // −(n/2)·log λ terms differ by ~10⁴ nats between replicas, so pairs hardly swap.
        tracing::warn!(
            "replica exchange with --prior gamma: the replicas' energies include the \
             hyper-prior's (n/2)·log λ per tensor, which differs by thousands of nats \
             between replicas of a large network, so few pairs swap; --prior gaussian swaps"
        );
    }
    let started = Instant::now();
    if !cfg.resume {
        // The state before the first update, then run.json: from here on the run can be
        // resumed whenever it stops.
        save(&plan, &replicas, &cold, &report, 0, 0.0, saves)?;
        saves += 1;
    }
    super::manifest(cfg, ds, num_params).write(run_dir)?;
    let state_bytes = replicas[0]
        .chain
        .stepper
        .sampler
        .state()
        .map(|st| {
            st.momentum
                .iter()
                .chain(&st.thermostats)
                .map(|t| t.elem_count())
                .sum::<usize>()
        })
        .unwrap_or(0)
        + num_params;
    tracing::info!(
        run = %run_dir.display(),
        params = num_params,
        "replica exchange: {m} replicas of {} with {} (M copies of the state: {:.1} MB); each \
         epoch costs {m} epochs of gradient evaluations plus the exchange estimates",
        s.model.label(),
        s.sampler.kind.name(),
        (m * state_bytes * 4) as f64 / 1e6
    );
    let every = match s.checkpoint_every {
        0 => batches,
        k => k as u64,
    };
    let burnin_steps = s.schedule.burnin as u64 * batches;
    let compensation = Compensation::paper();
    let bar = super::chain::bar(
        cfg.progress,
        plan.total_steps,
        "replicas [{bar:30}] {pos}/{len} {per_sec} {msg}",
    );
    while step < plan.total_steps {
        let ladder = &mut report.ladder;
        if step >= burnin_steps {
            ladder.freeze();
        }
        let round = ladder.rounds;
        let temps: Vec<f64> = (0..m).map(|r| ladder.temperature_of(r)).collect();
        for (j, r) in replicas.iter_mut().enumerate() {
            let config = replica_config(
                s.sampler.kind,
                options.thermostat,
                plan.epsilon,
                plan.c,
                temps[j],
            );
            r.chain.stepper.potential.temperature = s.temperature * temps[j];
            let seed = rng::replica_round_seed(s.seed, j, round);
            r.chain.stepper.rebuild_sampler(config, s.kernel, seed)?;
        }
        let from = step;
        let until = (step + options.exchange_every as u64).min(plan.total_steps);
        let holder = ladder.holder[0];
        advance_all(&plan, &mut replicas, step, until, &temps, holder, &mut cold)?;
        report.gradient_evaluations += (until - step) * m as u64;
        step = until;
        exchange(&plan, &replicas, &mut report, &compensation)?;
        report.ladder.end_round();
        report.swap_rates = report.ladder.swap_rates();
        report.expected_swap_rates = report.ladder.expected_swap_rates();
        // The exchanges in RUN/diagnostics.jsonl where a record fell in this round.
        let due = match s.log_every as u64 {
            0 => from / plan.batches != step / plan.batches,
            k => from / k != step / k,
        };
        if due {
            let line = serde_json::json!({
                "step": step,
                "round": report.ladder.rounds,
                "temperatures": report.ladder.temperatures,
                "holder": report.ladder.holder,
                "swap_rates": report.swap_rates,
            });
            append_line(&run_dir.join("diagnostics.jsonl"), &line.to_string())?;
        }
        bar.set_position(step);
        bar.set_message(format!(
            "T0 samples {} swap rates {}",
            cold.test.samples(),
            rates(&report.swap_rates)
        ));
        let signal = signals::pending();
        let last = step == plan.total_steps;
        // Due when the round passed a multiple of the checkpoint interval.
        if signal.is_some() || last || from / every < step / every {
            let train_seconds = seconds_before + started.elapsed().as_secs_f64();
            save(&plan, &replicas, &cold, &report, step, train_seconds, saves)?;
            saves += 1;
            if let (Some(signal), false) = (signal, last) {
                bar.finish_and_clear();
                return Err(interrupted(signal, step, run_dir));
            }
        }
    }
    bar.finish_and_clear();
    let step_seconds: f64 = replicas.iter().map(|r| r.step_seconds).sum();
    tracing::info!(
        "replica exchange: swap rates {}, temperatures {}, round trips {:?}",
        rates(&report.swap_rates),
        rates(&report.ladder.temperatures),
        report.ladder.round_trips
    );
    let outcome = ChainOutcome {
        seed: s.seed,
        num_params,
        steps: report.gradient_evaluations,
        step_seconds,
        train_seconds: seconds_before + started.elapsed().as_secs_f64(),
        backward: replicas[0].chain.stepper.backward,
        test: cold.test,
        valid: cold.valid,
        kinetic_trace: cold.kinetic_trace,
        rollbacks: 0,
    };
    Ok((outcome, report))
}

/// A replica lent to a pool thread for a round, and what its round returned.
type Slot<'r, 'a> = Mutex<(&'r mut Replica<'a>, Option<Result<()>>)>;

/// Runs every replica from update `from` to `until` (exclusive) at its temperature
/// `temps[j]`, side by side on the thread pool; `holder` holds T₀ and keeps the samples.
#[allow(clippy::too_many_arguments)]
fn advance_all(
    plan: &Plan,
    replicas: &mut [Replica],
    from: u64,
    until: u64,
    temps: &[f64],
    holder: usize,
    cold: &mut Kept,
) -> Result<()> {
    let cold = Mutex::new(cold);
    let slots: Vec<Slot> = replicas.iter_mut().map(|r| Mutex::new((r, None))).collect();
    crate::pool::run(slots.len(), &|j| {
        let Ok(mut slot) = slots[j].lock() else {
            return;
        };
        let keeper = (j == holder).then_some(&cold);
        let out = advance(plan, slot.0, j, from, until, temps[j], keeper);
        slot.1 = Some(out);
    });
    for (j, slot) in slots.into_iter().enumerate() {
        match slot.into_inner().map(|s| s.1) {
            Ok(Some(Ok(()))) => {}
            Ok(Some(Err(e))) => return Err(e),
            _ => return Err(Error::Config(format!("replica {j} did not report"))),
        }
    }
    Ok(())
}

/// Replica `j` from update `from` to `until` at temperature `t`: per epoch a fresh shuffle
/// (its own) and the run's labels; per update the schedule's ε times T; a sample into the
/// T₀ ensembles where it holds T₀ (`cold`) and the schedule keeps one; at an epoch's end
/// the prior's Gibbs step at its temperature and its line in its `metrics.jsonl`.
fn advance(
    plan: &Plan,
    r: &mut Replica,
    j: usize,
    from: u64,
    until: u64,
    t: f64,
    cold: Option<&Mutex<&mut Kept>>,
) -> Result<()> {
    let s = &plan.cfg.settings;
    let _span = tracing::info_span!("replica", j).entered();
    for step in from..until {
        let epoch = (step / plan.batches) as usize;
        let b = (step % plan.batches) as usize;
        if b == 0 {
            r.order.shuffle(&mut r.shuffle);
            r.chain.relabel(epoch);
            r.sums = Progress::default();
            r.epoch_started = Instant::now();
        }
        let eta = s
            .schedule
            .step_size_of(plan.epsilon, step, plan.total_steps, epoch);
        let idx = &r.order[b * s.batch_size..(b + 1) * s.batch_size];
        let t0 = Instant::now();
        let diag = r.chain.update(idx, t * eta, &mut r.sums, step, epoch)?;
        r.step_seconds += t0.elapsed().as_secs_f64();
        let done = step + 1;
        r.chain
            .watch(done, epoch, b as u64 + 1 == plan.batches, Some(t))?;
        if let Some(cold) = cold {
            if s.schedule.keeps_sample(done, plan.total_steps, epoch) {
                let mut kept = lock(cold)?;
                kept.keep(
                    plan.cfg,
                    plan.ds,
                    &plan.cold_dir,
                    &r.chain.model,
                    done,
                    epoch,
                    eta,
                    diag,
                )?;
            }
        }
        if b as u64 + 1 == plan.batches {
            r.chain.gibbs(epoch, done)?;
            let line = match cold {
                Some(cold) => {
                    let kept = lock(cold)?;
                    r.chain
                        .epoch_record(epoch, done, &r.sums, r.epoch_started, Some(&kept))
                }
                None => r
                    .chain
                    .epoch_record(epoch, done, &r.sums, r.epoch_started, None),
            };
            r.chain.monitor.end_epoch(epoch, line.kinetic_energy);
            let record = ReplicaEpoch {
                replica: j,
                temperature: t,
                record: &line,
            };
            let json = to_json(&record)?;
            append_line(&r.chain.run_dir.join("metrics.jsonl"), &json)?;
            if cold.is_some() {
                // The T₀ chain's line, from whichever replica holds T₀.
                append_line(&plan.cold_dir.join("metrics.jsonl"), &json)?;
                super::chain::log_epoch(&line, Some(t));
            }
        }
    }
    Ok(())
}

/// The T₀ ensembles, for the replica that holds T₀.
fn lock<'m, 'k>(cold: &'m Mutex<&'k mut Kept>) -> Result<std::sync::MutexGuard<'m, &'k mut Kept>> {
    cold.lock()
        .map_err(|_| Error::Config("the T0 ensemble's lock is poisoned".into()))
}

/// A replica's line in its `metrics.jsonl`: the epoch's record, and the temperature it
/// held at the epoch's end.
#[derive(Serialize)]
struct ReplicaEpoch<'a> {
    replica: usize,
    temperature: f64,
    #[serde(flatten)]
    record: &'a EpochRecord,
}

/// The exchange round after the updates: each of the round's pairs of adjacent
/// temperatures tries to swap (eq. 17), the pairs side by side on the thread pool (they are
/// disjoint, and each has its own random stream); the ladder records the outcomes in pair
/// order (and adapts, if it adapts).
fn exchange(
    plan: &Plan,
    replicas: &[Replica],
    report: &mut ReplicaReport,
    compensation: &Compensation,
) -> Result<()> {
    let started = Instant::now();
    let (seed, round) = (plan.cfg.settings.seed, report.ladder.rounds);
    let mut round_rng = rand::rngs::StdRng::seed_from_u64(rng::exchange_round_seed(seed, round));
    let pairs = report.ladder.pairs(&mut round_rng);
    let ladder = &report.ladder;
    // What an estimate reads of each replica (its sampler stays behind: not shareable).
    let views: Vec<View> = replicas
        .iter()
        .map(|r| View {
            model: &r.chain.model,
            prior: &r.chain.stepper.potential.prior,
            labels: r.chain.labels(),
        })
        .collect();
    let tries: Vec<Mutex<Option<Result<Try>>>> = pairs.iter().map(|_| Mutex::new(None)).collect();
    crate::pool::run(pairs.len(), &|k| {
        let i = pairs[k];
        let mut rng = rand::rngs::StdRng::seed_from_u64(rng::exchange_pair_seed(seed, round, i));
        let (a, b) = (&views[ladder.holder[i]], &views[ladder.holder[i + 1]]);
        let (t_a, t_b) = (ladder.temperatures[i], ladder.temperatures[i + 1]);
        let out = estimate(plan, a, b, t_a, t_b, compensation, &mut rng).and_then(
            |(delta, variance, examples)| {
                Ok(Try {
                    accepted: compensation.accept(delta, variance, &mut rng)?,
                    probability: logistic(delta),
                    examples,
                })
            },
        );
        if let Ok(mut slot) = tries[k].lock() {
            *slot = Some(out);
        }
    });
    for (&i, slot) in pairs.iter().zip(tries) {
        let t =
            slot.into_inner().ok().flatten().ok_or_else(|| {
                Error::Config(format!("the exchange of pair {i} did not report"))
            })??;
        report.ladder.record(i, t.accepted, t.probability);
        report.exchange_estimates += 1;
        report.exchange_examples += t.examples as u64;
    }
    report.exchange_seconds += started.elapsed().as_secs_f64();
    Ok(())
}

/// A replica as an exchange sees it.
struct View<'r> {
    model: &'r crate::model::Network,
    prior: &'r crate::potential::Prior,
    labels: Option<&'r [u8]>,
}

/// One pair's try: the test's outcome, the swap probability g(ΔẼ) given the estimate, and
/// the examples it evaluated.
struct Try {
    accepted: bool,
    probability: f64,
    examples: usize,
}

/// ΔẼ of replicas `a` (at `t_a`) and `b` (at `t_b`) on a random minibatch of the training
/// set shared by both (Algorithm 1, lines 2–4): U_a − U_b is N times the mean per-example
/// difference of −log p(y|x, θ) plus the exact difference of the prior energies, over the
/// posterior temperature; the minibatch doubles from 256 until the estimate's variance,
/// (1/T_a − 1/T_b)² N² s²/n (1 − n/N), is at most σ*² (at n = N it is exact). Returns the
/// estimate, its variance and the examples used.
fn estimate(
    plan: &Plan,
    a: &View,
    b: &View,
    t_a: f64,
    t_b: f64,
    compensation: &Compensation,
    rng: &mut rand::rngs::StdRng,
) -> Result<(f64, f64, usize)> {
    let (ds, cfg) = (plan.ds, plan.cfg);
    let n_all = ds.train.len();
    let labels = a.labels;
    let mut order: Vec<usize> = (0..n_all).collect();
    order.shuffle(rng);
    let scale = energy_difference(1.0, 0.0, t_a, t_b) / cfg.settings.temperature;
    let prior = |r: &View| r.prior.energy(&r.model.vars());
    let prior_difference = prior(a)? - prior(b)?;
    let mut d: Vec<f64> = Vec::new();
    let mut n = FIRST_EXCHANGE_BATCH.min(n_all);
    loop {
        let idx = &order[d.len()..n];
        let la = ensemble::example_nll(a.model, &ds.train, labels, idx, &cfg.device)?;
        let lb = ensemble::example_nll(b.model, &ds.train, labels, idx, &cfg.device)?;
        d.extend(la.iter().zip(&lb).map(|(x, y)| x - y));
        let k = d.len() as f64;
        let mean = d.iter().sum::<f64>() / k;
        let var_d = d.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (k - 1.0).max(1.0);
        let total = n_all as f64;
        let delta = scale * (total * mean + prior_difference);
        let variance = scale * scale * total * total * var_d / k * (1.0 - k / total);
        if !delta.is_finite() {
            let what = "in an exchange between two replicas".to_string();
            let energy = ("energy difference", delta);
            return Err(diverged(0, 0, energy, what, cfg.settings.sampler.step_size));
        }
        if variance <= compensation.sigma2 || n == n_all {
            return Ok((delta, variance.max(0.0), n));
        }
        n = (2 * n).min(n_all);
    }
}

/// Saves every replica's state into the next slot, then the record that names it.
fn save(
    plan: &Plan,
    replicas: &[Replica],
    cold: &Kept,
    report: &ReplicaReport,
    step: u64,
    train_seconds: f64,
    saves: usize,
) -> Result<()> {
    let run_dir = &plan.cfg.run_dir;
    let slot = saves % 2;
    let none = Kept::new(plan.ds);
    for (j, r) in replicas.iter().enumerate() {
        let progress = Progress {
            epoch: (step / plan.batches) as usize,
            batch: (step % plan.batches) as usize,
            step,
            step_seconds: r.step_seconds,
            train_seconds,
            ..if step.is_multiple_of(plan.batches) {
                Progress::default()
            } else {
                r.sums.clone()
            }
        };
        // Replica 0's state carries the T₀ ensembles.
        let kept = if j == 0 { cold } else { &none };
        r.chain
            .save_to(&slot_dir(run_dir, slot, j), progress, kept)?;
    }
    let record = Record {
        slot,
        step,
        train_seconds,
        report: report.clone(),
    };
    let json = serde_json::to_string_pretty(&record)
        .map_err(|e| Error::Checkpoint(format!("serialising replicas.json: {e}")))?;
    crate::atomic::write_atomic(&run_dir.join("replicas.json"), json.as_bytes())
}

/// Continues from `RUN/replicas.json` and its slot: every replica's θ, prior, epoch sums
/// and minibatch order; the T₀ ensembles; the ladder. Drops what was written after it.
fn restore(
    plan: &Plan,
    replicas: &mut [Replica],
    cold: &mut Kept,
) -> Result<(u64, ReplicaReport, f64, usize)> {
    let run_dir = &plan.cfg.run_dir;
    let path = run_dir.join("replicas.json");
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    let record: Record = serde_json::from_str(&text)
        .map_err(|e| Error::Checkpoint(format!("{}: corrupt: {e}", path.display())))?;
    if record.step > plan.total_steps {
        return Err(Error::Config(format!(
            "--epochs {} is fewer than the {} the run has done",
            plan.cfg.settings.epochs,
            record.step / plan.batches
        )));
    }
    for (j, r) in replicas.iter_mut().enumerate() {
        let at = r.chain.restore_from(&slot_dir(run_dir, record.slot, j))?;
        if at.step != record.step {
            return Err(Error::Checkpoint(format!(
                "replica {j}'s saved state is at update {}, the run's at {}",
                at.step, record.step
            )));
        }
        // The minibatch orders of the epochs begun: the shuffle stream replayed.
        let begun = at.epoch + usize::from(at.batch > 0);
        for _ in 0..begun {
            r.order.shuffle(&mut r.shuffle);
        }
        if at.batch > 0 {
            r.chain.relabel(at.epoch);
        }
        r.step_seconds = at.step_seconds;
        r.sums = at;
        super::chain::discard_after(r.chain.run_dir, &r.sums)?;
    }
    *cold = std::mem::replace(&mut replicas[0].chain.kept, Kept::new(plan.ds));
    let at = &replicas[0].sums;
    super::chain::discard_after(&plan.cold_dir, at)?;
    super::chain::trim_diagnostics(&run_dir.join("diagnostics.jsonl"), record.step)?;
    tracing::info!(
        epoch = at.epoch + 1,
        batch = at.batch,
        step = at.step,
        "resuming the replicas"
    );
    let saves = record.slot + 1;
    Ok((record.step, record.report, record.train_seconds, saves))
}

fn replica_dir(run_dir: &Path, j: usize) -> PathBuf {
    run_dir.join(format!("replica-{j}"))
}

fn slot_dir(run_dir: &Path, slot: usize, j: usize) -> PathBuf {
    run_dir
        .join("replicas")
        .join(format!("slot-{slot}"))
        .join(format!("replica-{j}"))
}

fn rates(v: &[f64]) -> String {
    let cells: Vec<String> = v.iter().map(|r| format!("{r:.3}")).collect();
    format!("[{}]", cells.join(", "))
}
