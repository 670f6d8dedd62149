//! `--backward plan`: the K chains of a run (K ≥ 1) stepped by the step plan
//! ([`crate::engine::planned`]), the MLP's whole update of every chain as one fixed list
//! of launches. The chains are the stacked layout's ([`super::stacked`]): chain k has the
//! seed [`crate::rng::chain_seed`]`(seed, k)`, its own minibatch order, noise, prior,
//! ensembles and folder `RUN/chain-k/`, and their states are saved together into the
//! stacked layout's two slots, so a stopped run resumes bit for bit.
//!
//! The host drives the plan in rounds: the updates between two points where it must look
//! (a sample kept, a diagnostics line, the epoch's end and its Gibbs step, a checkpoint,
//! and about [`ROUND_SECONDS`] of updates, so that a signal and the progress bar are
//! seen) run with no host read (the epoch's first update keeps its virials, which the
//! configurational temperature counts, in the control block for the next look); the
//! schedule's η of each update is in the plan's η table, written where it changed when
//! the round starts. After a round the host reads each chain's control block (its epoch
//! sums, its last loss, whether it halted); where a chain's θ or state is needed, they are
//! read back into its network and sampler, and a Gibbs step's new prior is written back.
//! A classifier's kept samples predict the test (and validation) set by the plan's
//! forward part on its executor, every chain at once, and are folded into the chains'
//! ensembles there: the host reads each sample's metrics and the ensemble's (a few
//! hundred bytes a chain), and the ensembles' sums only before a state is saved and at
//! the end.

use std::time::Instant;

use rand::seq::SliceRandom;

use super::chain::{diverged, ChainOutcome, Kept, Predicted};
use super::stacked::{self, Clock, Lane, Resident as Gathered, Run};
use super::TrainConfig;
use crate::data::Dataset;
use crate::driver;
use crate::engine::planned::{
    self, ChainInput, EpochSums, FoldTallies, HeldOutSet, PlannedChains, Resident,
};
use crate::ensemble::{Accumulator, Folded, Prediction, Sums};
use crate::error::{Error, Result};
use crate::model::Network;
use crate::potential::Backward;
use crate::sampler::Method;
use crate::settings::OnDivergence;

/// A round without a point to look at runs about this long (its length in updates from
/// the last round's rate): the host reads the device about once a second, to move the bar
/// and see a signal or a halted chain. Where rounds end changes no result: the device
/// computes the same updates however they are split (`PlannedChains::set_step_sizes`).
const ROUND_SECONDS: f64 = 1.0;

/// Refuses, before anything is written, a run that the plan cannot step, saying why.
pub(super) fn check(cfg: &TrainConfig, ds: &Dataset, net: &Network) -> Result<()> {
    let s = &cfg.settings;
    let refuse = |why: &str| Err(Error::Config(format!("--backward plan: {why}")));
    if !matches!(s.sampler.method()?, Method::Chain(_)) {
        return refuse("it runs minibatch chains (not hmc or replica exchange)");
    }
    if !Gathered::wanted(cfg, ds)? {
        return refuse(
            "its minibatches are gathered from the training set as loaded (not with \
             --augment or --permute-labels)",
        );
    }
    if s.estimate_noise {
        return refuse("SGHMC's β̂ is not estimated in the plan (drop --estimate-noise)");
    }
    if s.on_divergence == OnDivergence::Rollback {
        return refuse("--on-divergence rollback rolls one chain back alone");
    }
    if s.kernel != crate::sampler::Kernel::Fused {
        return refuse("the plan's update is the fused one (not --kernel composed)");
    }
    planned::supports(net, &s.sampler.params()?)
}

/// `--backward auto` on CUDA: the plan where it runs the run of `cfg` (then logged),
/// candle's autograd where it does not (a CNN or ResNet, a sampler or option the plan
/// lacks: the reason logged at debug level).
pub(super) fn auto_on_cuda(cfg: &TrainConfig, ds: &Dataset) -> Result<Backward> {
    let net = Network::new(
        &cfg.settings.model,
        ds.train.dim(),
        ds.task.outputs(),
        cfg.settings.seed,
        &candle_core::Device::Cpu,
    )?;
    let mut plan = cfg.clone();
    plan.settings.backward = Backward::Plan;
    match check(&plan, ds, &net) {
        Ok(()) => Ok(Backward::Plan),
        Err(why) => {
            tracing::debug!("candle's autograd on CUDA, not the step plan: {why}");
            Ok(Backward::Autograd)
        }
    }
}

/// Runs the K chains of `cfg` on `ds` through the step plan; their outcomes in chain order.
pub(super) fn run_planned(cfg: &TrainConfig, ds: &Dataset) -> Result<Vec<ChainOutcome>> {
    let s = &cfg.settings;
    let batches = (ds.train.len() / s.batch_size) as u64;
    let run = Run {
        cfg,
        ds,
        batches,
        total_steps: batches * s.epochs as u64,
        resident: None,
    };
    let cfgs = stacked::chain_settings(cfg);
    let mut lanes = stacked::new_lanes(&run, &cfgs)?;
    let (step, seconds_before, mut saves) = match cfg.resume {
        true => stacked::restore(&run, &mut lanes)?,
        false => (0, 0.0, 0),
    };
    let mut chains = load(&run, &lanes)?;
    if !step.is_multiple_of(batches) {
        reopen_epoch(&mut chains, &lanes)?;
    }
    let num_params = lanes[0].chain.model.num_params();
    let clock = Clock {
        seconds_before,
        started: Instant::now(),
    };
    if !cfg.resume {
        stacked::save(&run, &lanes, 0, (0.0, 0.0), saves)?;
        saves += 1;
        super::manifest(cfg, ds, num_params).write(&cfg.run_dir)?;
    }
    tracing::info!(
        run = %cfg.run_dir.display(),
        params = num_params,
        train = ds.train.len(),
        launches = chains.plan().ops.len(),
        "training {} chain(s) of {} with {} through the step plan on {:?}",
        lanes.len(),
        s.model.label(),
        s.sampler.kind.name(),
        cfg.device
    );
    let mut checkpoints = driver::Checkpoints::every(s.checkpoint_interval(batches));
    let mut walk = Walk {
        run: &run,
        step_seconds: lanes[0].sums.step_seconds,
        lanes: &mut lanes,
        chains: &mut chains,
        step,
        saves,
        clock: &clock,
        bar: crate::progress::bar(cfg.progress, run.total_steps, "step plan"),
        round_cap: 1,
    };
    driver::drive(&mut walk, &mut checkpoints)?;
    walk.bar.finish_and_clear();
    walk.bring_sums()?;
    let (step, step_seconds) = (walk.step, walk.step_seconds);
    let executor = chains.executor();
    tracing::info!("the step plan ran on {executor}");
    Ok(lanes
        .into_iter()
        .map(|mut l| ChainOutcome {
            seed: l.chain.cfg.settings.seed,
            num_params,
            steps: step,
            step_seconds,
            train_seconds: clock.elapsed(),
            backward: Backward::Plan,
            executor: Some(executor.clone()),
            test: l.chain.kept.test.clone(),
            valid: l.chain.kept.valid.clone(),
            kinetic_trace: std::mem::take(&mut l.chain.kept.kinetic_trace),
            rollbacks: 0,
        })
        .collect())
}

/// The plan of the lanes' chains, loaded with each one's θ, sampler state and potential,
/// and the training set as the plan's resident rows.
fn load(run: &Run, lanes: &[Lane]) -> Result<PlannedChains> {
    let (s, split) = (&run.cfg.settings, &run.ds.train);
    let all: Vec<usize> = (0..split.len()).collect();
    let (mut x, mut labels, mut values) = (Vec::new(), Vec::new(), Vec::new());
    split.gather(&all, &mut x, &mut labels);
    let data = match run.ds.task.is_regression() {
        true => {
            split.gather_values(&all, &mut values);
            Resident::Values { x: &x, y: &values }
        }
        false => Resident::Classes {
            x: &x,
            labels: &labels,
        },
    };
    let states = lanes
        .iter()
        .map(|l| l.chain.stepper.sampler.state())
        .collect::<Result<Vec<_>>>()?;
    let params = s.sampler.params()?;
    let inputs: Vec<ChainInput> = lanes
        .iter()
        .zip(&states)
        .map(|(l, state)| ChainInput {
            net: &l.chain.model,
            params,
            state,
            seed: l.chain.cfg.settings.seed,
            potential: &l.chain.stepper.potential,
        })
        .collect();
    let epoch_rows = run.batches as usize * s.batch_size;
    let held_out = held_out_sets(run);
    let sets: Vec<HeldOutSet> = held_out
        .iter()
        .map(|(x, labels)| HeldOutSet { x, labels })
        .collect();
    let dims = (s.batch_size, epoch_rows);
    let mut chains = PlannedChains::on(&inputs, data, &sets, dims, &run.cfg.device)?;
    // A restored run's ensembles onto the device; a fresh one's are the workspace's zeros
    // (both executors allocate it zeroed).
    for (k, lane) in lanes.iter().enumerate() {
        let kept = class_ensembles(&lane.chain.kept).into_iter().enumerate();
        for (set, acc) in kept.filter(|(_, acc)| acc.samples() > 0) {
            let (state, sums) = acc.state();
            let both = (sums.probability.as_slice(), sums.entropy.as_slice());
            chains.restore_ensemble(set, k, both, state.samples)?;
        }
    }
    Ok(chains)
}

/// A classifier's held-out sets for the plan's ensemble, features and labels: the test
/// set's, then the validation set's where there is one; none for a regression (its
/// Gaussians are candle's).
fn held_out_sets(run: &Run) -> Vec<(Vec<f32>, Vec<u32>)> {
    if run.ds.task.is_regression() {
        return Vec::new();
    }
    let rows = |split: &crate::data::Split| {
        let all: Vec<usize> = (0..split.len()).collect();
        let (mut x, mut labels) = (Vec::new(), Vec::new());
        split.gather(&all, &mut x, &mut labels);
        (x, labels)
    };
    std::iter::once(&run.ds.test)
        .chain(run.ds.valid.as_ref())
        .map(rows)
        .collect()
}

/// A classifier's ensembles in the order of [`held_out_sets`]: the test set's, then the
/// validation set's.
fn class_ensembles(kept: &Kept) -> Vec<&Accumulator> {
    kept.test
        .classes()
        .into_iter()
        .chain(kept.valid.as_ref())
        .collect()
}

/// A run resumed inside an epoch: the epoch reopened with each chain's order, its place
/// and the sums saved with its state.
fn reopen_epoch(chains: &mut PlannedChains, lanes: &[Lane]) -> Result<()> {
    let orders: Vec<&[usize]> = lanes.iter().map(|l| l.order.as_slice()).collect();
    chains.begin_epoch(&orders)?;
    for (k, lane) in lanes.iter().enumerate() {
        let p = &lane.sums;
        let sums = EpochSums {
            updates: p.updates as u64,
            nll: p.nll_sum,
            correct: p.correct as f64,
            sse: p.sq_error,
            kinetic: p.ke_sum,
        };
        chains.resume_epoch(k, &sums)?;
    }
    Ok(())
}

/// The chains' walk through the plan, as the driver runs it: a round of updates a unit.
struct Walk<'p, 'l> {
    run: &'p Run<'p>,
    lanes: &'p mut [Lane<'l>],
    chains: &'p mut PlannedChains,
    /// Updates done, their seconds, and the states saved so far (two slots in turn).
    step: u64,
    step_seconds: f64,
    saves: usize,
    clock: &'p Clock,
    bar: Box<dyn crate::progress::ProgressBar>,
    /// The most updates of a round with no point to look at (see [`ROUND_SECONDS`]).
    round_cap: u64,
}

impl driver::Transition for Walk<'_, '_> {
    fn done(&self) -> u64 {
        self.step
    }

    fn total(&self) -> u64 {
        self.run.total_steps
    }

    fn advance(&mut self) -> Result<bool> {
        let batches = self.run.batches;
        let epoch = (self.step / batches) as usize;
        if self.step.is_multiple_of(batches) {
            self.open_epoch(epoch)?;
        }
        let end = self.round_end(epoch);
        let etas = self.step_sizes(epoch)?;
        let t0 = Instant::now();
        self.chains.run((end - self.step) as usize)?;
        let seconds = t0.elapsed().as_secs_f64();
        self.step_seconds += seconds;
        // The next round's length: a second at this round's rate, growing at most 8× a
        // round from the first round's single update.
        let rate = (end - self.step) as f64 / seconds.max(1e-9);
        self.round_cap = ((rate * ROUND_SECONDS) as u64).clamp(1, 8 * self.round_cap);
        let from = self.step;
        self.step = end;
        self.collect(from, epoch, &etas)?;
        self.after_round(epoch, end.is_multiple_of(batches))?;
        self.bar.set_position(self.step);
        Ok(true)
    }

    /// Every chain's θ, state and ensemble sums read back from the plan, then saved.
    fn save(&mut self) -> Result<()> {
        self.sync()?;
        self.bring_sums()?;
        let seconds = (self.step_seconds, self.clock.elapsed());
        stacked::save(self.run, self.lanes, self.step, seconds, self.saves)?;
        self.saves += 1;
        Ok(())
    }

    fn folder(&self) -> Option<&std::path::Path> {
        Some(&self.run.cfg.run_dir)
    }

    fn stopping(&mut self) {
        self.bar.finish_and_clear();
    }
}

impl Walk<'_, '_> {
    /// Epoch `epoch` begins: each chain's fresh shuffle, its sums from zero, the orders
    /// into the plan's index.
    fn open_epoch(&mut self, epoch: usize) -> Result<()> {
        for lane in self.lanes.iter_mut() {
            lane.order.shuffle(&mut lane.shuffle);
            lane.chain.relabel(epoch);
            lane.sums = Default::default();
            lane.epoch_started = Instant::now();
        }
        let orders: Vec<&[usize]> = self.lanes.iter().map(|l| l.order.as_slice()).collect();
        self.chains.begin_epoch(&orders)
    }

    /// Where the round from `self.step` ends: at the first update after which the host
    /// must look, at most [`Walk::round_cap`] on.
    fn round_end(&self, epoch: usize) -> u64 {
        let (run, s) = (self.run, &self.run.cfg.settings);
        let epoch_end = ((epoch as u64 + 1) * run.batches).min(run.total_steps);
        let every = s.checkpoint_interval(run.batches);
        let last = epoch_end.min(self.step + self.round_cap);
        (self.step + 1..last)
            .find(|&t| {
                t.is_multiple_of(every)
                    || s.schedule.keeps_sample(t, run.total_steps, epoch)
                    || self.lanes.iter().any(|l| l.chain.monitor.due(t, false))
            })
            .unwrap_or(last)
    }

    /// The schedule's η of each update from here to the epoch's end, chain by chain (their
    /// base step sizes may differ after `--adapt-step-size`), written to the plan's table.
    fn step_sizes(&mut self, epoch: usize) -> Result<Vec<Vec<f64>>> {
        let run = self.run;
        let s = &run.cfg.settings;
        let epoch_end = ((epoch as u64 + 1) * run.batches).min(run.total_steps);
        let mut all = Vec::with_capacity(self.lanes.len());
        for (k, lane) in self.lanes.iter().enumerate() {
            let base = lane.chain.base_step_size();
            let etas: Vec<f64> = (self.step..epoch_end)
                .map(|t| s.schedule.step_size_of(base, t, run.total_steps, epoch))
                .collect();
            self.chains.set_step_sizes(k, &etas)?;
            all.push(etas);
        }
        Ok(all)
    }

    /// After the updates `from..self.step`: each chain's epoch sums and last loss from its
    /// control block; a chain that halted on a loss that was not finite stops the run as a
    /// chain of the CPU path does, naming where.
    fn collect(&mut self, from: u64, epoch: usize, etas: &[Vec<f64>]) -> Result<()> {
        let batch = self.run.cfg.settings.batch_size;
        let momentum = self.chains.has_momentum();
        let controls = self.chains.controls()?;
        for ((k, lane), c) in self.lanes.iter_mut().enumerate().zip(controls) {
            let base = lane.chain.base_step_size();
            if c.halted != 0 || !c.kinetic.is_finite() {
                self.chains.read_theta(k, &lane.chain.model)?;
                lane.chain.stepper.sampler.restore(&self.chains.state(k)?)?;
                let what = lane.chain.where_not_finite()?;
                let (at, quantity) = match c.halted != 0 {
                    true => (c.step, ("loss", c.nll)),
                    false => (c.step, ("kinetic energy", c.kinetic)),
                };
                return Err(diverged(at, epoch, quantity, what, base));
            }
            for &eta in &etas[k][..(self.step - from) as usize] {
                lane.sums.note_step_size(eta);
            }
            let e = EpochSums::of(&c);
            let p = &mut lane.sums;
            (p.nll_sum, p.correct, p.sq_error) = (e.nll, e.correct as usize, e.sse);
            p.seen = e.updates as usize * batch;
            (p.ke_sum, p.ke_count) = (e.kinetic, if momentum { e.updates as usize } else { 0 });
            lane.chain.last_nll = c.nll;
            if from.is_multiple_of(self.run.batches) {
                let virials = self.chains.first_virials_of(&c);
                lane.chain.monitor.add_virials(epoch, &virials);
            }
        }
        Ok(())
    }

    /// A classifier's samples: every chain's probabilities of the test set (and the
    /// validation set) by the plan's forward pass, folded into its ensembles there, one
    /// read of the tallies each; none for a regression, whose chains predict their
    /// Gaussians alone.
    fn predicted(&mut self) -> Result<Vec<Predicted>> {
        let ds = self.run.ds;
        if ds.task.is_regression() {
            return Ok(Vec::new());
        }
        let folded = |t: Vec<FoldTallies>| t.iter().map(Folded::of_tallies).collect::<Vec<_>>();
        let test = folded(self.chains.fold(0)?);
        let mut valid = match ds.valid {
            Some(_) => folded(self.chains.fold(1)?).into_iter().map(Some).collect(),
            None => vec![None; test.len()],
        };
        Ok(test
            .into_iter()
            .zip(valid.drain(..))
            .map(|(test, valid)| Predicted {
                test: Prediction::Folded(test),
                valid: valid.map(Prediction::Folded),
            })
            .collect())
    }

    /// Every chain's ensemble sums brought back from the plan's executor, where its
    /// samples were folded (before a state is saved, and at the end).
    fn bring_sums(&mut self) -> Result<()> {
        for (k, lane) in self.lanes.iter_mut().enumerate() {
            let kept = &mut lane.chain.kept;
            let sets = class_ensembles(kept).len();
            let mut sums = (0..sets)
                .map(|set| {
                    let (probability, entropy) = self.chains.ensemble_sums(set, k)?;
                    Ok(Sums {
                        probability,
                        entropy,
                    })
                })
                .collect::<Result<Vec<_>>>()?
                .into_iter();
            if let Some(test) = sums.next() {
                kept.set_sums(test, sums.next())?;
            }
        }
        Ok(())
    }

    /// Each chain's θ and sampler state read back from the plan.
    fn sync(&mut self) -> Result<()> {
        for (k, lane) in self.lanes.iter_mut().enumerate() {
            self.chains.read_theta(k, &lane.chain.model)?;
            let state = self.chains.state(k)?;
            lane.chain.stepper.sampler.restore(&state)?;
        }
        Ok(())
    }

    /// After a round: each chain's diagnostics line where one is due, its sample where the
    /// schedule keeps one, and at the epoch's end its Gibbs step and metrics line, its new
    /// prior written to the plan.
    fn after_round(&mut self, epoch: usize, last_of_epoch: bool) -> Result<()> {
        let (run, step) = (self.run, self.step);
        let keep = run
            .cfg
            .settings
            .schedule
            .keeps_sample(step, run.total_steps, epoch);
        let watch = self
            .lanes
            .iter()
            .any(|l| l.chain.monitor.due(step, last_of_epoch));
        if !(keep || watch || last_of_epoch) {
            return Ok(());
        }
        self.sync()?;
        let mut predicted = match keep {
            true => self.predicted()?.into_iter(),
            false => Vec::new().into_iter(),
        };
        for (k, lane) in self.lanes.iter_mut().enumerate() {
            lane.chain.watch(step, epoch, last_of_epoch, None)?;
            if keep {
                let sampler = &lane.chain.stepper.sampler;
                let (eta, diag) = (sampler.params().step_size(), sampler.diagnostics());
                lane.chain
                    .keep_sample(step, epoch, eta, diag, predicted.next())?;
            }
            if last_of_epoch {
                lane.chain
                    .end_epoch(epoch, step, &lane.sums, lane.epoch_started)?;
                self.chains
                    .set_potential(k, &lane.chain.stepper.potential)?;
            }
        }
        Ok(())
    }
}
