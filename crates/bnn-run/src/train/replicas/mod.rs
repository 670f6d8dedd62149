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
//! Across MPI ranks (`mpirun -n R`, feature `mpi`) replica j runs on rank j mod R, in its
//! own folder on the file system every rank sees; each rank holds the whole ladder and
//! takes the same exchange decisions from energies all-gathered at each round ([`swap`]),
//! and rank 0 keeps the T₀ chain's ensembles ([`cold`]). The samples, swap decisions and
//! summary do not depend on R.
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

use super::chain::{append_line, write_sample, Chain, ChainOutcome, Kept};
use super::sink::ChainSink;
use super::sink::RunFolder;
use super::EpochRecord;
use super::TrainConfig;
use crate::checkpoint;
use crate::data::Dataset;
use crate::driver;
use crate::engine::exchange::Compensation;
use crate::error::{Error, Result};
use crate::ranks::Ranks;
use crate::rng;
use crate::run_state::Position;
use crate::sampler::ladder::Ladder;
use crate::sampler::replica::{epsilon_and_c, replica_params, ReplicaOptions};
use crate::sampler::Method;
use crate::signals;

mod cold;
mod swap;

use cold::Event;

/// What `summary.json` says of the replicas.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReplicaReport {
    /// Temperatures, holders, swap counts and round trips (counted since the ladder froze
    /// where it adapts).
    pub ladder: Ladder,
    /// Swap rate of each adjacent pair.
    pub swap_rates: Vec<f64>,
    /// The mean of g(ΔẼ), each try's swap probability given its estimate, per pair: the
    /// same rate with less noise.
    pub expected_swap_rates: Vec<f64>,
    /// Updates of all replicas together (gradient evaluations).
    pub gradient_evaluations: u64,
    /// Exchange estimates made, and the examples they evaluated (per model).
    pub exchange_estimates: u64,
    /// Examples the exchange estimates read.
    pub exchange_examples: u64,
    /// Wall time of the exchanges (their forward passes).
    pub exchange_seconds: f64,
    /// Across MPI ranks: the bytes of energies the ranks contributed to the exchanges'
    /// all-gathers, summed over ranks (each reaches the R − 1 others); 0 in one process.
    #[serde(default)]
    pub exchange_bytes: u64,
    /// Across MPI ranks: the bytes of T₀ samples' predictions and epoch lines sent to
    /// rank 0 (pooled evaluation); 0 in one process.
    #[serde(default)]
    pub pooled_bytes: u64,
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
    sums: Position,
    step_seconds: f64,
    epoch_started: Instant,
    /// What it did for the T₀ chain this round, where it holds T₀.
    events: Vec<Event>,
}

/// The run-wide constants of the replicas' loop.
struct Plan<'a> {
    cfg: &'a TrainConfig,
    ds: &'a Dataset,
    options: &'a ReplicaOptions,
    batches: u64,
    total_steps: u64,
    epsilon: f64,
    c: f64,
    cold_dir: PathBuf,
}

/// Where the replicas' loop stands: the update count, the report, the seconds of earlier
/// runs of a resumed run, the states saved, and when this run started.
struct Progress {
    step: u64,
    report: ReplicaReport,
    seconds_before: f64,
    saves: usize,
    started: Instant,
}

impl Progress {
    /// Training seconds so far, over this run and the earlier ones.
    fn train_seconds(&self) -> f64 {
        self.seconds_before + self.started.elapsed().as_secs_f64()
    }
}

/// Runs the replicas of `cfg` on `ds`, replica j on rank j mod R; at rank 0 the T = 1
/// chain's outcome and the replicas' report (`None` on the other ranks).
pub(super) fn run_replicas(
    cfg: &TrainConfig,
    ds: &Dataset,
    ranks: &Ranks,
) -> Result<Option<(ChainOutcome, ReplicaReport)>> {
    let s = &cfg.settings;
    let options = s
        .replicas
        .as_ref()
        .ok_or_else(|| Error::Config("replica exchange without its options".into()))?;
    let batches = (ds.train.len() / s.batch_size) as u64;
    let Method::ReplicaExchange { replica, .. } = s.sampler.method()? else {
        return Err(Error::Config(format!(
            "{} runs no replicas",
            s.sampler.kind.name()
        )));
    };
    let (epsilon, c) = epsilon_and_c(&replica);
    let plan = Plan {
        cfg,
        ds,
        options,
        batches,
        total_steps: batches * s.epochs as u64,
        epsilon,
        c,
        cold_dir: checkpoint::chain_dir(&cfg.run_dir, 0),
    };
    let (cfgs, dirs) = replica_settings(&plan)?;
    let mut replicas = new_replicas(&plan, &cfgs, &dirs, &ranks.dealt(options.replicas))?;
    let first = replicas
        .iter()
        .flatten()
        .next()
        .ok_or_else(|| Error::Config(format!("rank {} holds no replica", ranks.rank())))?;
    let num_params = first.chain.model.num_params();
    let backward = first.chain.stepper.backward;
    let state_floats = sampler_floats(first) + num_params;
    let mut cold = Kept::new(ds)?;
    let mut progress = begin(&plan, &mut replicas, &mut cold, num_params, ranks)?;
    if ranks.is_root() {
        super::manifest(cfg, ds, num_params).write(&cfg.run_dir)?;
        announce(&plan, num_params, state_floats, ranks.size());
    }
    run_rounds(&plan, &mut replicas, &mut cold, &mut progress, ranks)?;
    // Wall time in updates, over every replica of every rank (in rank order).
    let local: f64 = replicas.iter().flatten().map(|r| r.step_seconds).sum();
    let step_seconds: f64 = ranks.all_gather(&[local]).iter().flatten().sum();
    if !ranks.is_root() {
        return Ok(None);
    }
    log_summary(&progress.report);
    let outcome = ChainOutcome {
        seed: s.seed,
        num_params,
        steps: progress.report.gradient_evaluations,
        step_seconds,
        train_seconds: progress.train_seconds(),
        backward,
        executor: None,
        test: cold.test,
        valid: cold.valid,
        kinetic_trace: cold.kinetic_trace,
        rollbacks: 0,
    };
    Ok(Some((outcome, progress.report)))
}

/// The loop's start: a resumed run's saved state, or a new run's folders and the state
/// before the first update (from then on the run can be resumed whenever it stops).
fn begin(
    plan: &Plan,
    replicas: &mut [Option<Replica>],
    cold: &mut Kept,
    num_params: usize,
    ranks: &Ranks,
) -> Result<Progress> {
    if plan.cfg.resume {
        let (step, report, seconds_before, saves) = restore(plan, replicas, cold, ranks)?;
        return Ok(Progress {
            step,
            report,
            seconds_before,
            saves,
            started: Instant::now(),
        });
    }
    std::fs::create_dir_all(checkpoint::samples_dir(&plan.cold_dir))
        .map_err(|e| Error::io(&plan.cold_dir, e))?;
    let report = new_report(plan.options, num_params)?;
    let started = Instant::now();
    save(plan, replicas, cold, &report, 0, 0.0, 0, ranks)?;
    Ok(Progress {
        step: 0,
        report,
        seconds_before: 0.0,
        saves: 1,
        started,
    })
}

/// The replicas' walk, as the driver runs it: a round of updates of every replica and
/// the exchanges after it a unit, counted in updates.
struct Rounds<'p, 'r> {
    plan: &'p Plan<'p>,
    replicas: &'p mut [Option<Replica<'r>>],
    cold: &'p mut Kept,
    p: &'p mut Progress,
    ranks: &'p Ranks,
    compensation: Compensation,
    bar: Box<dyn crate::progress::ProgressBar>,
}

impl driver::Transition for Rounds<'_, '_> {
    fn done(&self) -> u64 {
        self.p.step
    }

    fn total(&self) -> u64 {
        self.plan.total_steps
    }

    /// A round, the exchanges after it and its line in the log.
    fn advance(&mut self) -> Result<bool> {
        let (plan, ranks) = (self.plan, self.ranks);
        let from = self.p.step;
        let p = &mut *self.p;
        p.step = run_round(plan, self.replicas, &mut p.report, self.cold, p.step, ranks)?;
        swap::exchange(
            plan,
            self.replicas,
            &mut p.report,
            &self.compensation,
            ranks,
        )?;
        let report = &mut p.report;
        report.ladder.end_round();
        report.swap_rates = report.ladder.swap_rates();
        report.expected_swap_rates = report.ladder.expected_swap_rates();
        if ranks.is_root() {
            log_round(plan, report, from, p.step)?;
        }
        self.bar.set_position(p.step);
        self.bar.set_message(format!(
            "T0 samples {} swap rates {}",
            self.cold.samples(),
            rates(&report.swap_rates)
        ));
        Ok(true)
    }

    fn save(&mut self) -> Result<()> {
        let (plan, p) = (self.plan, &mut *self.p);
        let seconds = p.train_seconds();
        save(
            plan,
            self.replicas,
            self.cold,
            &p.report,
            p.step,
            seconds,
            p.saves,
            self.ranks,
        )?;
        p.saves += 1;
        Ok(())
    }

    fn folder(&self) -> Option<&std::path::Path> {
        Some(&self.plan.cfg.run_dir)
    }

    /// Every rank stops at the same round when any of them was signalled (SIGTERM's
    /// number on a rank that was not).
    fn signal(&self) -> Result<Option<i32>> {
        let signal = signals::pending();
        Ok(self
            .ranks
            .any(signal.is_some())
            .then(|| signal.unwrap_or(15)))
    }

    fn stopping(&mut self) {
        self.bar.finish_and_clear();
    }
}

/// The rounds to the run's end: updates, exchanges, their log, and the state saved when a
/// round passed a multiple of the checkpoint interval, at the end, or on a signal (then
/// the run stops with an error naming it).
fn run_rounds(
    plan: &Plan,
    replicas: &mut [Option<Replica>],
    cold: &mut Kept,
    p: &mut Progress,
    ranks: &Ranks,
) -> Result<()> {
    let s = &plan.cfg.settings;
    let mut checkpoints = driver::Checkpoints::every(s.checkpoint_interval(plan.batches));
    let show = plan.cfg.progress && ranks.is_root();
    let mut rounds = Rounds {
        plan,
        replicas,
        cold,
        p,
        ranks,
        compensation: Compensation::paper(),
        bar: crate::progress::bar(show, plan.total_steps, "replicas"),
    };
    driver::drive(&mut rounds, &mut checkpoints)?;
    rounds.bar.finish_and_clear();
    Ok(())
}

/// Each replica's own settings — its seed, and its sampler at T = 1 (rebuilt each
/// round) — and its folder.
fn replica_settings(plan: &Plan) -> Result<(Vec<TrainConfig>, Vec<PathBuf>)> {
    let (cfg, s) = (plan.cfg, &plan.cfg.settings);
    let cold = replica_params(
        s.sampler.kind,
        plan.options.thermostat,
        plan.epsilon,
        plan.c,
        1.0,
    )?
    .record();
    Ok((0..plan.options.replicas)
        .map(|j| {
            let mut c = cfg.clone();
            c.settings.seed = rng::chain_seed(s.seed, j);
            c.settings.sampler = cold;
            c.progress = false;
            (c, replica_dir(&cfg.run_dir, j))
        })
        .unzip())
}

/// This rank's replicas (`mine`), each a chain of `cfgs[j]` in `dirs[j]`; `None` for the
/// other ranks' replicas.
fn new_replicas<'r>(
    plan: &Plan<'r>,
    cfgs: &'r [TrainConfig],
    dirs: &'r [PathBuf],
    mine: &[usize],
) -> Result<Vec<Option<Replica<'r>>>> {
    let s = &plan.cfg.settings;
    let mut replicas: Vec<Option<Replica>> = (0..cfgs.len()).map(|_| None).collect();
    for &j in mine {
        let (c, dir) = (&cfgs[j], &dirs[j]);
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let mut chain = Chain::new(c, plan.ds, RunFolder::new(dir), s.seed)?;
        chain.monitor = super::diagnostics::Monitor::new(
            s.log_every,
            chain.stepper.sampler.diagnostics().thermostat,
            &format!("replica {j}: "),
        )
        .checking_from(s.schedule.burnin);
        replicas[j] = Some(Replica {
            chain,
            shuffle: rand::rngs::StdRng::seed_from_u64(c.settings.seed ^ rng::SHUFFLE_STREAM),
            order: (0..plan.ds.train.len()).collect(),
            sums: Position::default(),
            step_seconds: 0.0,
            epoch_started: Instant::now(),
            events: Vec::new(),
        });
    }
    Ok(replicas)
}

/// Floats of a replica's sampler state (momenta and thermostats).
fn sampler_floats(replica: &Replica) -> usize {
    let state = replica.chain.stepper.sampler.state();
    state.map_or(0, |st| {
        st.momentum()
            .iter()
            .chain(st.thermostats())
            .map(|t| t.elem_count())
            .sum()
    })
}

/// The run's last log line: swap rates, temperatures, round trips, bytes sent.
fn log_summary(report: &ReplicaReport) {
    tracing::info!(
        "replica exchange: swap rates {}, temperatures {}, round trips {:?}, {} bytes of \
         energies and {} of T0 predictions sent between ranks",
        rates(&report.swap_rates),
        rates(&report.ladder.temperatures),
        report.ladder.round_trips,
        report.exchange_bytes,
        report.pooled_bytes
    );
}

/// The report of a new run: its ladder, fixed (`--ladder τ`) or adapting from
/// ΔT ≈ 3/√d, and no swaps yet.
fn new_report(options: &ReplicaOptions, num_params: usize) -> Result<ReplicaReport> {
    let m = options.replicas;
    let ladder = match options.ladder {
        Some(tau) => Ladder::geometric(m, tau, options.pairs)?,
        // Swaps need ΔT ≈ O(1/√d) (ΔE grows like √d): start there, then adapt.
        None => Ladder::geometric(m, 1.0 + 3.0 / (num_params as f64).sqrt(), options.pairs)?
            .adapting(options.target_swap_rate)?,
    };
    Ok(ReplicaReport {
        swap_rates: ladder.swap_rates(),
        expected_swap_rates: ladder.expected_swap_rates(),
        ladder,
        gradient_evaluations: 0,
        exchange_estimates: 0,
        exchange_examples: 0,
        exchange_seconds: 0.0,
        exchange_bytes: 0,
        pooled_bytes: 0,
    })
}

/// The run's first log lines: what runs where, and the warning of a Gamma hyper-prior.
fn announce(plan: &Plan, num_params: usize, state_floats: usize, processes: usize) {
    let (s, m) = (&plan.cfg.settings, plan.options.replicas);
    if matches!(s.prior, crate::potential::PriorSpec::Gamma { .. }) {
        // Measured on the Fashion MLP (docs/BENCHMARKS.md, issue 15): the hyper-prior's
        // −(n/2)·log λ terms differ by ~10⁴ nats between replicas, so pairs hardly swap.
        tracing::warn!(
            "replica exchange with --prior gamma: the replicas' energies include the \
             hyper-prior's (n/2)·log λ per tensor, which differs by thousands of nats \
             between replicas of a large network, so few pairs swap; --prior gaussian swaps"
        );
    }
    tracing::info!(
        run = %plan.cfg.run_dir.display(),
        params = num_params,
        "replica exchange: {m} replicas of {} with {} on {processes} process(es) (M copies \
         of the state: {:.1} MB); each epoch costs {m} epochs of gradient evaluations plus \
         the exchange estimates",
        s.model.label(),
        s.sampler.kind.name(),
        (m * state_floats * 4) as f64 / 1e6
    );
}

/// One round's updates from `step`: every replica's sampler rebuilt at the temperature it
/// holds (Algorithm 2, line 3), N updates each, the T₀ holder's samples settled on rank 0.
/// Returns the step the round ends at.
fn run_round(
    plan: &Plan,
    replicas: &mut [Option<Replica>],
    report: &mut ReplicaReport,
    cold: &mut Kept,
    step: u64,
    ranks: &Ranks,
) -> Result<u64> {
    let (s, options) = (&plan.cfg.settings, plan.options);
    let ladder = &mut report.ladder;
    if step >= s.schedule.burnin as u64 * plan.batches {
        ladder.freeze();
    }
    let round = ladder.rounds;
    let temps: Vec<f64> = (0..options.replicas)
        .map(|r| ladder.temperature_of(r))
        .collect();
    for (j, r) in replicas.iter_mut().enumerate() {
        let Some(r) = r else { continue };
        let params = replica_params(
            s.sampler.kind,
            options.thermostat,
            plan.epsilon,
            plan.c,
            temps[j],
        )?;
        r.chain.stepper.potential.temperature = s.temperature * temps[j];
        let seed = rng::replica_round_seed(s.seed, j, round);
        r.chain.stepper.rebuild_sampler(params, s.kernel, seed)?;
    }
    let until = (step + options.exchange_every as u64).min(plan.total_steps);
    let holder = ladder.holder[0];
    advance_all(plan, replicas, step, until, &temps, holder)?;
    let events = replicas[holder]
        .as_mut()
        .map(|r| std::mem::take(&mut r.events))
        .unwrap_or_default();
    report.pooled_bytes += cold::settle(ranks, events, cold, &plan.cold_dir)?;
    report.gradient_evaluations += (until - step) * options.replicas as u64;
    Ok(until)
}

/// The exchanges in `RUN/diagnostics.jsonl` where a record fell in the round from `from`
/// to `step`.
fn log_round(plan: &Plan, report: &ReplicaReport, from: u64, step: u64) -> Result<()> {
    let due = match plan.cfg.settings.log_every as u64 {
        0 => from / plan.batches != step / plan.batches,
        k => from / k != step / k,
    };
    if !due {
        return Ok(());
    }
    let line = serde_json::json!({
        "step": step,
        "round": report.ladder.rounds,
        "temperatures": report.ladder.temperatures,
        "holder": report.ladder.holder,
        "swap_rates": report.swap_rates,
    });
    append_line(
        &plan.cfg.run_dir.join(crate::checkpoint::files::DIAGNOSTICS),
        &line.to_string(),
    )
}

/// A replica lent to a pool thread for a round, and what its round returned.
type Slot<'r, 'a> = Mutex<(usize, &'r mut Replica<'a>, Option<Result<()>>)>;

/// Runs this rank's replicas from update `from` to `until` (exclusive) at their
/// temperatures `temps[j]`, side by side on the thread pool; `holder` holds T₀ and keeps
/// the samples.
fn advance_all(
    plan: &Plan,
    replicas: &mut [Option<Replica>],
    from: u64,
    until: u64,
    temps: &[f64],
    holder: usize,
) -> Result<()> {
    let slots: Vec<Slot> = replicas
        .iter_mut()
        .enumerate()
        .filter_map(|(j, r)| r.as_mut().map(|r| Mutex::new((j, r, None))))
        .collect();
    crate::pool::run(slots.len(), &|k| {
        let Ok(mut slot) = slots[k].lock() else {
            return;
        };
        let j = slot.0;
        let out = advance(plan, slot.1, j, from, until, temps[j], j == holder);
        slot.2 = Some(out);
    });
    for slot in slots {
        match slot.into_inner().map(|s| (s.0, s.2)) {
            Ok((_, Some(Ok(())))) => {}
            Ok((_, Some(Err(e)))) => return Err(e),
            Ok((j, None)) => return Err(Error::Config(format!("replica {j} did not report"))),
            Err(_) => return Err(Error::Config("a replica's lock is poisoned".into())),
        }
    }
    Ok(())
}

/// Replica `j` from update `from` to `until` at temperature `t`: per epoch a fresh shuffle
/// (its own) and the run's labels; per update the schedule's ε times T; where it holds T₀
/// (`cold`) and the schedule keeps a sample, the sample's file and its predictions for the
/// T₀ ensembles; at an epoch's end the prior's Gibbs step at its temperature and its line
/// in its `metrics.jsonl` (and, holding T₀, the T₀ chain's line, settled at rank 0).
fn advance(
    plan: &Plan,
    r: &mut Replica,
    j: usize,
    from: u64,
    until: u64,
    t: f64,
    cold: bool,
) -> Result<()> {
    let s = &plan.cfg.settings;
    let _span = tracing::info_span!("replica", j).entered();
    for step in from..until {
        let epoch = (step / plan.batches) as usize;
        let b = (step % plan.batches) as usize;
        if b == 0 {
            r.order.shuffle(&mut r.shuffle);
            r.chain.relabel(epoch);
            r.sums = Position::default();
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
        if cold && s.schedule.keeps_sample(done, plan.total_steps, epoch) {
            let (cfg, mut cold_folder) = (plan.cfg, RunFolder::new(&plan.cold_dir));
            let model = &r.chain.model;
            let sample = write_sample(
                cfg,
                plan.ds,
                &mut cold_folder,
                model,
                done,
                epoch,
                eta,
                diag,
                r.chain.stepper.potential.noise_precision,
                None,
            )?;
            r.events.push(Event::Sample(sample));
        }
        if b as u64 + 1 == plan.batches {
            r.chain.gibbs(epoch, done)?;
            let record = r
                .chain
                .epoch_record(epoch, done, &r.sums, r.epoch_started, None);
            r.chain
                .monitor
                .end_epoch(epoch, record.kinetic_energy, r.sums.ke_count);
            let line = EpochRecord {
                replica: Some(j),
                temperature: Some(t),
                ..record
            };
            r.chain.sink.metrics(&line)?;
            if cold {
                r.events.push(Event::Epoch(Box::new(line)));
            }
        }
    }
    Ok(())
}

/// Saves this rank's replicas' state into the next slot; once every rank's are written,
/// rank 0 writes the record that names the slot.
#[allow(clippy::too_many_arguments)]
fn save(
    plan: &Plan,
    replicas: &[Option<Replica>],
    cold: &Kept,
    report: &ReplicaReport,
    step: u64,
    train_seconds: f64,
    saves: usize,
    ranks: &Ranks,
) -> Result<()> {
    let run_dir = &plan.cfg.run_dir;
    let slot = saves % 2;
    let none = Kept::new(plan.ds)?;
    for (j, r) in replicas.iter().enumerate() {
        let Some(r) = r else { continue };
        let progress = Position {
            epoch: (step / plan.batches) as usize,
            batch: (step % plan.batches) as usize,
            step,
            step_seconds: r.step_seconds,
            train_seconds,
            ..if step.is_multiple_of(plan.batches) {
                Position::default()
            } else {
                r.sums.clone()
            }
        };
        // Replica 0's state (at rank 0) carries the T₀ ensembles.
        let kept = if j == 0 { cold } else { &none };
        r.chain
            .state_at(progress, kept)?
            .save(&slot_dir(run_dir, slot, j))?;
    }
    ranks.barrier();
    if ranks.is_root() {
        let record = Record {
            slot,
            step,
            train_seconds,
            report: report.clone(),
        };
        let json = serde_json::to_string_pretty(&record)
            .map_err(|e| Error::Checkpoint(format!("serialising replicas.json: {e}")))?;
        crate::atomic::write_atomic(&run_dir.join("replicas.json"), json.as_bytes())?;
    }
    // No rank goes on (or stops) before the record is in place.
    ranks.barrier();
    Ok(())
}

/// Continues from `RUN/replicas.json` and its slot: every replica's θ, prior, epoch sums
/// and minibatch order (this rank's); the T₀ ensembles (rank 0); the ladder. Drops what
/// was written after it. Any number of ranks resumes any run: a replica's state is its
/// own.
fn restore(
    plan: &Plan,
    replicas: &mut [Option<Replica>],
    cold: &mut Kept,
    ranks: &Ranks,
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
        let Some(r) = r else { continue };
        let at = r.chain.restore_from(&slot_dir(run_dir, record.slot, j))?;
        if at.step != record.step {
            return Err(Error::Checkpoint(format!(
                "replica {j}'s saved state is at update {}, the run's at {}",
                at.step, record.step
            )));
        }
        r.chain.replay_to(&at, &mut r.order, &mut r.shuffle);
        r.step_seconds = at.step_seconds;
        r.sums = at;
        super::chain::discard_after(&r.chain.sink.dir, &r.sums)?;
    }
    if let Some(r0) = replicas.first_mut().and_then(Option::as_mut) {
        // Rank 0: replica 0's state carries the T₀ ensembles.
        *cold = std::mem::replace(&mut r0.chain.kept, Kept::new(plan.ds)?);
        super::chain::discard_after(&plan.cold_dir, &r0.sums)?;
        super::chain::trim_diagnostics(
            &run_dir.join(crate::checkpoint::files::DIAGNOSTICS),
            record.step,
        )?;
        tracing::info!(
            epoch = r0.sums.epoch + 1,
            batch = r0.sums.batch,
            step = r0.sums.step,
            "resuming the replicas on {} process(es)",
            ranks.size()
        );
    }
    // Rank 0 has dropped the T₀ chain's later samples before a replica writes new ones.
    ranks.barrier();
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
