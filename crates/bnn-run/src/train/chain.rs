//! One chain: the training loop proper. [`run_chain`] reads as the algorithm; a `Walk`
//! over the epochs' minibatches is the transition the one driver ([`crate::driver`]) runs,
//! which saves the state and stops on a signal; [`Chain`] holds the chain's model, its
//! update and its running results, and does each part.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::time::Instant;

use candle_core::Device;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::Serialize;

use super::sink::{ChainSink, RunFolder};
use super::task;
use super::{manifest, EpochRecord, Stepper, TrainConfig};
use crate::checkpoint;
use crate::data::{Dataset, Task};
use crate::driver;
use crate::ensemble::{self, Accumulator, AccumulatorState, Ensemble, Prediction, Sums};
use crate::error::{Error, Result};
use crate::likelihood::Noise;
use crate::model::Network;
use crate::potential::{Backward, Potential, Prior};
use crate::regression::RegressionAccumulator;
use crate::rng;
use crate::run_state::{self, Position, RunState};
use crate::sampler;
use crate::settings::OnDivergence;

/// What one chain leaves for the run's summary.
#[derive(Debug, Clone)]
pub struct ChainOutcome {
    /// The chain's seed.
    pub seed: u64,
    /// Parameters of the model.
    pub num_params: usize,
    /// The ensemble of its samples on the test set (a classifier's or a regression's).
    pub test: Ensemble,
    /// And on the validation set, with `--valid` (a classifier's).
    pub valid: Option<Accumulator>,
    /// Updates done.
    pub steps: u64,
    /// Seconds in updates.
    pub step_seconds: f64,
    /// Seconds of training in all.
    pub train_seconds: f64,
    /// The kinetic energy per parameter at each kept sample (momentum samplers).
    pub kinetic_trace: Vec<f64>,
    /// The backward pass that ran.
    pub backward: Backward,
    /// The step plan's executor, where the plan ran (`host`, `cuda graphs …`).
    pub executor: Option<String>,
    /// Rollbacks after a divergence (`--on-divergence rollback`).
    pub rollbacks: u32,
}

/// One chain in `run_dir` (the run's folder, or a chain's folder of it); `write_manifest`
/// for a single-chain run, whose folder is the run's. A new chain's folder was cleared by
/// `train` (`clear_run`); with `cfg.resume` the chain continues from the state saved
/// there (a chain of a multi-chain run stopped before its first state starts afresh).
pub(super) fn run_chain(
    cfg: &TrainConfig,
    ds: &Dataset,
    run_dir: &Path,
    write_manifest: bool,
    label_seed: u64,
) -> Result<ChainOutcome> {
    std::fs::create_dir_all(checkpoint::samples_dir(run_dir)).map_err(|e| Error::io(run_dir, e))?;
    let resume = cfg.resume && (write_manifest || run_state::state_path(run_dir).exists());
    let sink = RunFolder::new(run_dir);
    let (mut chain, at) = Chain::open(cfg, ds, sink, resume, label_seed)?;
    // The state before the first update, then run.json: from here on the run can be
    // resumed whenever it stops.
    if write_manifest {
        manifest(cfg, ds, chain.model.num_params()).write(run_dir)?;
    }
    chain.run(at)
}

/// One chain of `cfg` on `ds` whose samples, metrics, diagnostics and states go to `sink`
/// (with `resume`, it continues from the state `sink` holds); `label_seed` decides the
/// label noise of `--permute-labels`. Per epoch: a fresh shuffle; per minibatch: the
/// schedule's step size, one update, a sample where the schedule keeps one, and the state
/// where a checkpoint is due or a signal came; at the epoch's end the prior's Gibbs step,
/// the metrics line and a checkpoint if due. Returns the chain's results and the sink.
pub fn run_chain_in<S: ChainSink>(
    cfg: &TrainConfig,
    ds: &Dataset,
    sink: S,
    resume: bool,
    label_seed: u64,
) -> Result<(ChainOutcome, S)> {
    let (mut chain, at) = Chain::open(cfg, ds, sink, resume, label_seed)?;
    let outcome = chain.run(at)?;
    Ok((outcome, chain.sink))
}

/// The sample metadata key of a regression's noise precision τ (standardised units).
pub const NOISE_PRECISION_KEY: &str = "noise_precision";

/// How often `--on-divergence rollback` may roll a chain back.
pub(super) const MAX_ROLLBACKS: u32 = 3;

/// A chain's walk over its epochs' minibatches, as the driver runs it: one update a
/// unit. Before an epoch's first update, a fresh shuffle and the epoch's labels; after its
/// last, the prior's Gibbs step and the metrics line.
struct Walk<'c, 'a, S: ChainSink> {
    chain: &'c mut Chain<'a, S>,
    batches: usize,
    total_steps: u64,
    /// Where the walk stands: the epoch, the minibatch within it, the updates done and
    /// their seconds.
    epoch: usize,
    batch: usize,
    step: u64,
    step_seconds: f64,
    /// Training seconds of the earlier runs of a resumed run, and this run's start.
    seconds_before: f64,
    started: Instant,
    /// The minibatch order: the shuffle stream, and this epoch's order.
    shuffle: rand::rngs::StdRng,
    order: Vec<usize>,
    /// The open epoch, if one is: its running figures, the minibatch this run began it
    /// at, its clock and its bar.
    open: Option<Epoch>,
}

/// The epoch a [`Walk`] is in.
struct Epoch {
    sums: Position,
    first_batch: usize,
    started: Instant,
    bar: Box<dyn crate::progress::ProgressBar>,
}

impl<'c, 'a, S: ChainSink> Walk<'c, 'a, S> {
    /// The walk of `chain` from where `at` says it stands: the shuffles of the epochs
    /// done replayed, and a resumed epoch's figures taken back.
    fn new(chain: &'c mut Chain<'a, S>, at: Position) -> Self {
        let (s, ds) = (&chain.cfg.settings, chain.ds);
        let batches = ds.train.len() / s.batch_size;
        let mut shuffle = rand::rngs::StdRng::seed_from_u64(s.seed ^ rng::SHUFFLE_STREAM);
        let mut order: Vec<usize> = (0..ds.train.len()).collect();
        for _ in 0..at.epoch {
            order.shuffle(&mut shuffle);
        }
        let mut walk = Walk {
            batches,
            total_steps: (batches * s.epochs) as u64,
            epoch: at.epoch,
            batch: at.batch,
            step: at.step,
            step_seconds: at.step_seconds,
            seconds_before: at.train_seconds,
            started: Instant::now(),
            shuffle,
            order,
            open: None,
            chain,
        };
        if at.epoch < s.epochs {
            walk.open = Some(walk.open_epoch(at));
        }
        walk
    }

    /// The chain's saving rule: every `--checkpoint-every` updates (0: every epoch).
    fn checkpoints(&self) -> driver::Checkpoints {
        let s = &self.chain.cfg.settings;
        driver::Checkpoints::every(s.checkpoint_interval(self.batches as u64))
    }

    fn train_seconds(&self) -> f64 {
        self.seconds_before + self.started.elapsed().as_secs_f64()
    }

    /// Opens epoch `self.epoch` with `sums` (a resumed epoch's, or none): its shuffle,
    /// its labels, its clock and its bar.
    fn open_epoch(&mut self, sums: Position) -> Epoch {
        let cfg = self.chain.cfg;
        self.order.shuffle(&mut self.shuffle);
        self.chain.relabel(self.epoch);
        let bar = progress_bar(
            cfg.progress,
            self.batches as u64,
            self.epoch,
            cfg.settings.epochs,
        );
        Epoch {
            sums,
            first_batch: self.batch,
            started: Instant::now(),
            bar,
        }
    }

    /// What the chain leaves for the run's summary.
    fn outcome(self) -> ChainOutcome {
        let train_seconds = self.train_seconds();
        let chain = self.chain;
        ChainOutcome {
            seed: chain.cfg.settings.seed,
            num_params: chain.model.num_params(),
            steps: self.step,
            step_seconds: self.step_seconds,
            train_seconds,
            backward: chain.stepper.backward,
            executor: None,
            test: chain.kept.test.clone(),
            valid: chain.kept.valid.clone(),
            kinetic_trace: std::mem::take(&mut chain.kept.kinetic_trace),
            rollbacks: chain.rollbacks,
        }
    }
}

impl<S: ChainSink> driver::Transition for Walk<'_, '_, S> {
    fn done(&self) -> u64 {
        self.step
    }

    fn total(&self) -> u64 {
        self.total_steps
    }

    /// One update on the next minibatch at the schedule's step size, a sample where the
    /// schedule keeps one; the epoch's end after its last minibatch.
    fn advance(&mut self) -> Result<bool> {
        let cfg = self.chain.cfg;
        let s = &cfg.settings;
        let mut e = match self.open.take() {
            Some(e) => e,
            None => self.open_epoch(Position::default()),
        };
        let (epoch, b) = (self.epoch, self.batch);
        let t0 = Instant::now();
        let eta = s.schedule.step_size_of(
            self.chain.base_step_size(),
            self.step,
            self.total_steps,
            epoch,
        );
        let idx = &self.order[b * s.batch_size..(b + 1) * s.batch_size];
        let diag = self.chain.update(idx, eta, &mut e.sums, self.step, epoch)?;
        self.step += 1;
        let last_of_epoch = b + 1 == self.batches;
        self.chain.watch(self.step, epoch, last_of_epoch, None)?;
        self.step_seconds += t0.elapsed().as_secs_f64();
        if s.schedule.keeps_sample(self.step, self.total_steps, epoch) {
            self.chain.keep_sample(self.step, epoch, eta, diag, None)?;
        }
        if b % 20 == 0 {
            e.bar.set_position(b as u64);
            let images = ((b + 1 - e.first_batch) * s.batch_size) as f64;
            let rate = images / e.started.elapsed().as_secs_f64().max(1e-9);
            let message = progress_message(&e.sums, diag);
            e.bar.set_message(format!("{rate:.0} img/s {message}"));
        }
        self.batch += 1;
        if last_of_epoch {
            e.bar.finish_and_clear();
            self.chain.end_epoch(epoch, self.step, &e.sums, e.started)?;
            (self.epoch, self.batch) = (epoch + 1, 0);
        } else {
            self.open = Some(e);
        }
        Ok(true)
    }

    /// The state mid-epoch with the epoch's figures, or at an epoch's end.
    fn save(&mut self) -> Result<()> {
        let sums = self.open.as_ref().map(|e| e.sums.clone());
        let progress = Position {
            epoch: self.epoch,
            batch: self.batch,
            step: self.step,
            step_seconds: self.step_seconds,
            train_seconds: self.train_seconds(),
            ..sums.unwrap_or_default()
        };
        self.chain.save(progress)
    }

    fn folder(&self) -> Option<&Path> {
        Some(self.chain.sink.location())
    }

    fn stopping(&mut self) {
        if let Some(e) = &self.open {
            e.bar.finish_and_clear();
        }
    }
}

/// Runs `chain` from where `at` says it stands to the end of the run.
fn run_from<S: ChainSink>(chain: &mut Chain<S>, at: Position) -> Result<ChainOutcome> {
    let mut walk = Walk::new(chain, at);
    let mut checkpoints = walk.checkpoints();
    driver::drive(&mut walk, &mut checkpoints)?;
    Ok(walk.outcome())
}

/// A chain's model, its update, its running results, and where it hands them on.
pub(super) struct Chain<'a, S: ChainSink = RunFolder> {
    pub cfg: &'a TrainConfig,
    pub ds: &'a Dataset,
    pub sink: S,
    pub model: Network,
    pub stepper: Stepper,
    pub kept: Kept,
    /// The seed of the run's label noise, and this epoch's labels where there is some.
    label_seed: u64,
    labels: Option<Vec<u8>>,
    /// Watches the sampler: `diagnostics.jsonl` and the warnings.
    pub monitor: super::diagnostics::Monitor,
    /// The mean NLL of the last minibatch.
    pub last_nll: f64,
    /// Times `--on-divergence rollback` went back to the saved state, each halving the
    /// step size; saved with the state.
    pub rollbacks: u32,
    /// Times `--adapt-step-size` halved the step size in burn-in; saved with the state.
    pub step_halvings: u32,
}

/// At most this many halvings by `--adapt-step-size` (a sixteenth of the step): beyond,
/// the step is not what is wrong.
const MAX_STEP_HALVINGS: u32 = 4;

/// The ensembles in a saved state's form: the test classes' sums, the validation set's,
/// and a regression's mixture.
pub(super) type SavedEnsembles = (
    (AccumulatorState, Sums),
    Option<(AccumulatorState, Sums)>,
    Option<RegressionAccumulator>,
);

/// The kept samples' running results: the streaming ensembles on the test and validation
/// sets, and the kinetic energy per parameter at each sample.
pub(super) struct Kept {
    pub test: Ensemble,
    pub valid: Option<Accumulator>,
    pub kinetic_trace: Vec<f64>,
}

impl Kept {
    pub fn new(ds: &Dataset) -> Result<Self> {
        let valid = match ds.valid.as_ref() {
            Some(v) => Some(task::class_ensemble(v, ds.task)?),
            None => None,
        };
        Ok(Kept {
            test: task::ensemble(&ds.test, ds.task)?,
            valid,
            kinetic_trace: Vec::new(),
        })
    }

    /// The ensembles as a saved state left them (a minibatch chain's or an HMC chain's:
    /// the classes' sums, or a regression's mixture); refused where the state and the
    /// data disagree on a validation set or on the task.
    pub fn restore(
        &mut self,
        ds: &Dataset,
        test: (AccumulatorState, Sums),
        valid: Option<(AccumulatorState, Sums)>,
        regression: Option<RegressionAccumulator>,
    ) -> Result<()> {
        let disagree = |what: &str| {
            Err(Error::Checkpoint(format!(
                "the saved state and the data disagree on {what}"
            )))
        };
        self.test = match (ds.task.is_regression(), regression) {
            (true, Some(r)) => Ensemble::Gaussian(r),
            (false, None) => {
                Ensemble::Classes(Accumulator::restore(&ds.test.labels, test.0, test.1)?)
            }
            _ => return disagree("the task"),
        };
        self.valid = match (ds.valid.as_ref(), valid) {
            (Some(v), Some((s, sum))) => Some(Accumulator::restore(&v.labels, s, sum)?),
            (None, None) => None,
            _ => return disagree("a validation set"),
        };
        Ok(())
    }

    /// The ensembles in the saved state's form: the classes' sums (an empty ensemble's
    /// for a regression), the validation set's, and a regression's mixture.
    /// Refused where samples were folded elsewhere and their sums not brought back
    /// ([`Kept::set_sums`]): a state saved then would lose them.
    pub fn saved(&self) -> Result<SavedEnsembles> {
        let behind = self.test.classes().is_some_and(Accumulator::sums_behind)
            || self.valid.as_ref().is_some_and(Accumulator::sums_behind);
        if behind {
            return Err(Error::Config(
                "an ensemble's sums are still where its samples were folded: saving it \
                 would lose them"
                    .into(),
            ));
        }
        let test = match &self.test {
            Ensemble::Classes(a) => a.state(),
            Ensemble::Gaussian(_) => Accumulator::new(&[]).state(),
        };
        let valid = self.valid.as_ref().map(|a| a.state());
        Ok((test, valid, self.test.gaussian().cloned()))
    }

    /// The sums of a classifier's ensembles as they stand where its samples were folded
    /// (the step plan's executor): the test set's, then the validation set's.
    pub fn set_sums(&mut self, test: Sums, valid: Option<Sums>) -> Result<()> {
        if let Ensemble::Classes(a) = &mut self.test {
            a.set_sums(test)?;
        }
        if let (Some(a), Some(v)) = (self.valid.as_mut(), valid) {
            a.set_sums(v)?;
        }
        Ok(())
    }

    /// Samples in the test ensemble.
    pub fn samples(&self) -> usize {
        self.test.samples()
    }

    /// A sample's predictions into the ensembles, its kinetic energy into the trace.
    pub fn add(&mut self, sample: KeptSample) -> Result<()> {
        if let Some(ke) = sample.kinetic_energy {
            self.kinetic_trace.push(ke);
        }
        self.test.add(&sample.test)?;
        match (self.valid.as_mut(), sample.valid.as_ref()) {
            (Some(acc), Some(Prediction::Classes(p))) => acc.add(p)?,
            (Some(acc), Some(Prediction::Folded(f))) => acc.add_folded(f),
            (_, Some(Prediction::Gaussian { .. })) => {
                return Err(Error::Config(
                    "a validation set's predictions are a classifier's".into(),
                ))
            }
            _ => {}
        }
        Ok(())
    }
}

/// What a kept sample adds to the ensembles: its predictions on the test set (class
/// probabilities, or a regression's Gaussians, or probabilities folded where they were
/// computed) and the validation set's, and the kinetic energy per parameter when it was
/// taken.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct KeptSample {
    pub test: Prediction,
    pub valid: Option<Prediction>,
    pub kinetic_energy: Option<f64>,
}

/// A classifier's predictions on the test set and, with `--valid`, the validation set,
/// computed ahead for a sample: class probabilities (one pass over K stacked chains), or
/// already folded into the ensembles where they live (the step plan's).
#[derive(Debug, Clone)]
pub(super) struct Predicted {
    pub test: Prediction,
    pub valid: Option<Prediction>,
}

/// Hands `model`'s parameters after update `step` to `sink` as a sample; its predictions
/// for the ensembles (`predicted` where they were computed ahead).
#[allow(clippy::too_many_arguments)]
pub(super) fn write_sample(
    cfg: &TrainConfig,
    ds: &Dataset,
    sink: &mut dyn ChainSink,
    model: &Network,
    step: u64,
    epoch: usize,
    eta: f64,
    diag: sampler::Diagnostics,
    noise_precision: f64,
    predicted: Option<Predicted>,
) -> Result<KeptSample> {
    // Never write a sample from a diverging chain.
    if let Some(name) = model.first_non_finite()? {
        let what = format!("first in tensor {name}");
        return Err(diverged(step, epoch, ("parameters", f64::NAN), what, eta));
    }
    let mut meta = sample_metadata(cfg, ds, step, epoch, eta)?;
    if ds.task.is_regression() {
        // The sample's σ: `bnn eval` predicts with it (Display round-trips an f64).
        meta.insert(NOISE_PRECISION_KEY.into(), noise_precision.to_string());
    }
    let params: Vec<(String, candle_core::Tensor)> = model
        .params
        .iter()
        .map(|p| (p.name.clone(), p.var.as_detached_tensor()))
        .collect();
    let device = &cfg.device;
    if ds.task.is_regression() {
        sink.sample(step, params, meta)?;
        let (mean, var) =
            task::predict_gaussians(model, &ds.test, ds.task, noise_precision, device)?;
        return Ok(KeptSample {
            test: Prediction::Gaussian { mean, var },
            valid: None,
            kinetic_energy: diag.kinetic_energy,
        });
    }
    let Predicted { test, valid } = match predicted {
        Some(p) => p,
        None => Predicted {
            test: Prediction::Classes(ensemble::predict(model, &ds.test, device)?),
            valid: match ds.valid.as_ref() {
                Some(v) => Some(Prediction::Classes(ensemble::predict(model, v, device)?)),
                None => None,
            },
        },
    };
    // Finite weights so large that the softmax overflows: as diverged as a NaN weight, and
    // the sample is not written.
    if test.has_non_finite() {
        let what = format!(
            "from weights overflowing the softmax, largest in tensor {}",
            largest_tensor(model)?
        );
        return Err(diverged(
            step,
            epoch,
            ("test predictions", f64::NAN),
            what,
            eta,
        ));
    }
    sink.sample(step, params, meta)?;
    Ok(KeptSample {
        test,
        valid,
        kinetic_energy: diag.kinetic_energy,
    })
}

/// The name of the parameter tensor with the largest |θ|.
fn largest_tensor(model: &Network) -> Result<String> {
    let mut best = (f32::NEG_INFINITY, String::new());
    for p in &model.params {
        let m = p.var.as_tensor().abs()?.max_all()?.to_scalar::<f32>()?;
        if m > best.0 {
            best = (m, p.name.clone());
        }
    }
    Ok(best.1)
}

/// A chain's network, initialised from `cfg`'s seed with as many outputs as `ds`'s task
/// asks, and the potential it moves on (prior at its start, `cfg`'s likelihood): what a
/// minibatch chain and an HMC chain both start from.
pub(super) fn model_and_potential(cfg: &TrainConfig, ds: &Dataset) -> Result<(Network, Potential)> {
    let s = &cfg.settings;
    let model = Network::new(
        &s.model,
        ds.train.dim(),
        ds.task.outputs(),
        s.seed,
        &cfg.device,
    )?;
    let prior = Prior::new(s.prior, model.params.len())?;
    let potential =
        Potential::new(ds.train.len(), s.temperature, prior)?.with_likelihood(s.likelihood)?;
    Ok((model, potential))
}

impl<'a, S: ChainSink> Chain<'a, S> {
    /// A chain at its start: the model initialised from `cfg`'s seed, its sampler, no
    /// samples yet; `label_seed`: the run's seed, which decides its label noise.
    pub fn new(cfg: &'a TrainConfig, ds: &'a Dataset, sink: S, label_seed: u64) -> Result<Self> {
        let s = &cfg.settings;
        let (model, potential) = model_and_potential(cfg, ds)?;
        // Built before a saved state is restored: the sampler's init (splitting moves θ
        // by v/2 there) must not undo it.
        let stepper = Stepper::new(
            &model,
            potential,
            s.sampler.params()?,
            s.kernel,
            s.backward,
            s.seed,
            s.batch_size,
        )?;
        let mut stepper = stepper;
        if s.estimate_noise {
            stepper.sampler.estimate_gradient_noise()?;
        }
        let monitor = new_monitor(cfg, &stepper, model.num_params());
        Ok(Chain {
            cfg,
            ds,
            sink,
            model,
            stepper,
            monitor,
            kept: Kept::new(ds)?,
            label_seed,
            labels: None,
            last_nll: f64::NAN,
            rollbacks: 0,
            step_halvings: 0,
        })
    }

    /// The step size the schedule starts from: the run's, halved at each rollback and at
    /// each halving of `--adapt-step-size`.
    pub fn base_step_size(&self) -> f64 {
        let halvings = (self.rollbacks + self.step_halvings) as i32;
        self.cfg.settings.sampler.step_size * 0.5f64.powi(halvings)
    }

    /// After a divergence (`cause`): back to the last saved state, which then records one
    /// more rollback (the step size halved), so that `--resume` continues from here too.
    fn roll_back(&mut self, cause: &Error) -> Result<Position> {
        let rollbacks = self.rollbacks + 1;
        let at = self.restore_saved()?;
        self.sink.discard_after(&at)?;
        self.rollbacks = rollbacks;
        // A fresh watch, but the saved state's configurational sums.
        let sums = std::mem::take(&mut self.monitor.configurational);
        self.monitor = new_monitor(self.cfg, &self.stepper, self.model.num_params());
        self.monitor.configurational = sums;
        self.save(at.clone())?;
        tracing::warn!(
            "{cause} -- rolled back to the state saved at step {} (epoch {}), step size halved \
             to {:e} (rollback {rollbacks} of at most {MAX_ROLLBACKS})",
            at.step,
            at.epoch + 1,
            self.base_step_size(),
        );
        Ok(at)
    }

    /// Where the chain is no longer finite, for a divergence message: the first
    /// parameter tensor, else the first momentum tensor.
    pub(super) fn where_not_finite(&self) -> Result<String> {
        if let Some(name) = self.model.first_non_finite()? {
            return Ok(format!("first in tensor {name}"));
        }
        let state = self.stepper.sampler.state()?;
        for (p, m) in self.model.params.iter().zip(state.momentum()) {
            let s = m.abs()?.sum_all()?.to_scalar::<f32>()?;
            if !s.is_finite() {
                return Ok(format!("first in the momentum of tensor {}", p.name));
            }
        }
        // The loss overflowed from finite parameters: name the largest.
        let mut largest = (0f32, "");
        for p in &self.model.params {
            let m = p.var.as_tensor().abs()?.max_all()?.to_scalar::<f32>()?;
            if m > largest.0 {
                largest = (m, &p.name);
            }
        }
        Ok(format!(
            "every parameter still finite, the largest |θ| {:.3e} in tensor {}",
            largest.0, largest.1
        ))
    }

    /// The labels of epoch `epoch`: the data's, or with `--permute-labels p` a fraction
    /// p of them permuted (the same at every chain and replica of the run, and on resume).
    pub fn relabel(&mut self, epoch: usize) {
        let p = self.cfg.settings.permute_labels;
        self.labels = (p > 0.0).then(|| {
            crate::data::label_noise::permute_labels(
                &self.ds.train.labels,
                p,
                rng::label_noise_seed(self.label_seed, epoch),
            )
        });
    }

    /// Where a chain moved in step with others (replicas, stacked chains) continues from
    /// `at`: its minibatch `order` as its `shuffle` stream left it after the epochs begun,
    /// and the labels of `at`'s epoch where it stopped inside one.
    pub fn replay_to(
        &mut self,
        at: &Position,
        order: &mut [usize],
        shuffle: &mut rand::rngs::StdRng,
    ) {
        let begun = at.epoch + usize::from(at.batch > 0);
        for _ in 0..begun {
            order.shuffle(shuffle);
        }
        if at.batch > 0 {
            self.relabel(at.epoch);
        }
    }

    /// This epoch's training labels.
    pub fn labels(&self) -> Option<&[u8]> {
        self.labels.as_deref()
    }

    /// A new chain (its state handed to the sink before the first update), or with
    /// `resume` the chain as the sink's saved state left it; and where it stands.
    fn open(
        cfg: &'a TrainConfig,
        ds: &'a Dataset,
        sink: S,
        resume: bool,
        label_seed: u64,
    ) -> Result<(Self, Position)> {
        let s = &cfg.settings;
        let mut chain = Chain::new(cfg, ds, sink, label_seed)?;
        let at = if resume {
            let at = chain.restore_saved()?;
            chain.sink.discard_after(&at)?;
            tracing::info!(
                epoch = at.epoch + 1,
                batch = at.batch,
                step = at.step,
                "resuming"
            );
            at
        } else {
            chain.save(Position::default())?;
            Position::default()
        };
        tracing::info!(
            run = %chain.sink.location().display(),
            params = chain.model.num_params(),
            train = ds.train.len(),
            "training {} with {}",
            s.model.label(),
            s.sampler.kind.name()
        );
        Ok((chain, at))
    }

    /// Runs from `at` to the end of the run; with `--on-divergence rollback`, a divergence
    /// goes back to the last saved state with the step size halved (at most
    /// [`MAX_ROLLBACKS`] times).
    fn run(&mut self, mut at: Position) -> Result<ChainOutcome> {
        loop {
            match run_from(self, at) {
                Err(e)
                    if e.is_divergence()
                        && self.cfg.settings.on_divergence == OnDivergence::Rollback =>
                {
                    if self.rollbacks >= MAX_ROLLBACKS {
                        return Err(Error::DivergedAgain {
                            rollbacks: self.rollbacks,
                            cause: Box::new(e),
                        });
                    }
                    at = self.roll_back(&e)?;
                }
                done => return done,
            }
        }
    }

    /// Loads the state the sink saved last into the chain.
    fn restore_saved(&mut self) -> Result<Position> {
        let names: Vec<String> = self.model.params.iter().map(|p| p.name.clone()).collect();
        let state = self.sink.load_state(&names)?;
        self.apply(state)
    }

    /// Loads the state saved in the folder `dir` (θ, sampler, prior, ensembles) into the
    /// chain.
    pub fn restore_from(&mut self, dir: &Path) -> Result<Position> {
        let names: Vec<String> = self.model.params.iter().map(|p| p.name.clone()).collect();
        self.apply(RunState::load(dir, &names)?)
    }

    /// Sets the chain to `state`: θ, the sampler's state, the prior's precisions, the
    /// ensembles; returns where it stood.
    fn apply(&mut self, state: RunState) -> Result<Position> {
        if state.progress.epoch > self.cfg.settings.epochs {
            return Err(Error::Config(format!(
                "--epochs {} is fewer than the {} the run has done",
                self.cfg.settings.epochs, state.progress.epoch
            )));
        }
        for (p, (_, t)) in self.model.params.iter().zip(&state.params) {
            p.var.set(&t.to_device(&self.cfg.device)?)?;
        }
        self.stepper.sampler.restore(&state.sampler)?;
        self.stepper.potential.prior.precisions = state.prior_precisions;
        self.kept
            .restore(self.ds, state.test, state.valid, state.regression)?;
        if let Some(tau) = state.noise_precision {
            self.stepper.potential.noise_precision = tau;
        }
        self.kept.kinetic_trace = state.kinetic_trace;
        self.rollbacks = state.rollbacks;
        self.monitor.configurational = state.configurational;
        self.step_halvings = state.step_halvings;
        Ok(state.progress)
    }

    /// Update `step` (0-based) on the minibatch `idx` with step size `eta`, its figures
    /// added to the epoch's `sums`; a non-finite loss or kinetic energy stops the run.
    pub fn update(
        &mut self,
        idx: &[usize],
        eta: f64,
        sums: &mut Position,
        step: u64,
        epoch: usize,
    ) -> Result<sampler::Diagnostics> {
        self.begin_update(eta, sums)?;
        let augment = self.augment_at(step)?;
        let loss = self
            .stepper
            .step(&self.ds.train, self.labels.as_deref(), idx, augment)?;
        self.end_update(loss, idx.len(), sums, step, epoch)
    }

    /// Before an update with step size `eta`: the epoch's η figures, and η into the
    /// sampler.
    pub fn begin_update(&mut self, eta: f64, sums: &mut Position) -> Result<()> {
        sums.note_step_size(eta);
        if eta != self.stepper.sampler.params().step_size() {
            self.stepper.sampler.set_step_size(eta)?;
        }
        Ok(())
    }

    /// `--augment`'s transformation of update `step`, where the dataset has one.
    pub fn augment_at(&self, step: u64) -> Result<Option<(crate::data::augment::Augment, u64)>> {
        let s = &self.cfg.settings;
        Ok(s.augment
            .for_dataset(&self.ds.name)?
            .map(|aug| (aug, rng::augment_seed(s.seed, step))))
    }

    /// After update `step` on a minibatch of `seen` examples with loss `loss`: its figures
    /// added to the epoch's `sums`; a non-finite loss or kinetic energy stops the run.
    pub fn end_update(
        &mut self,
        loss: crate::backprop::mlp::BatchLoss,
        seen: usize,
        sums: &mut Position,
        step: u64,
        epoch: usize,
    ) -> Result<sampler::Diagnostics> {
        let base = self.base_step_size();
        if !loss.nll.is_finite() {
            let what = self.where_not_finite()?;
            return Err(diverged(step, epoch, ("loss", loss.nll), what, base));
        }
        self.last_nll = loss.nll;
        sums.correct += loss.correct;
        sums.sq_error += loss.sq_error;
        sums.seen += seen;
        sums.nll_sum += loss.nll * seen as f64;
        let diag = self.stepper.sampler.diagnostics();
        if let Some(ke) = diag.kinetic_energy {
            if !ke.is_finite() {
                let what = self.where_not_finite()?;
                return Err(diverged(
                    step + 1,
                    epoch,
                    ("kinetic energy", ke),
                    what,
                    base,
                ));
            }
            sums.ke_sum += ke;
            sums.ke_count += 1;
        }
        // The configurational temperature counts only the epoch's first update: its
        // minibatch comes from a fresh permutation, independent of θ, so its θ·∇̃ is
        // unbiased. The epoch's later minibatches are drawn from what the earlier ones
        // left, which θ has followed, and bias θ·∇̃ upward (configurational.rs).
        if sums.updates == 1 {
            self.monitor
                .add_virials(epoch, self.stepper.sampler.virials());
        }
        Ok(diag)
    }

    /// Keeps the parameters after update `step` as a sample: its file, and its
    /// predictions in the ensembles.
    pub fn keep_sample(
        &mut self,
        step: u64,
        epoch: usize,
        eta: f64,
        diag: sampler::Diagnostics,
        predicted: Option<Predicted>,
    ) -> Result<()> {
        let (cfg, ds) = (self.cfg, self.ds);
        let tau = self.stepper.potential.noise_precision;
        let (sink, model) = (&mut self.sink, &self.model);
        let sample = write_sample(cfg, ds, sink, model, step, epoch, eta, diag, tau, predicted)?;
        self.kept.add(sample)?;
        Ok(())
    }

    /// The end of epoch `epoch`: the prior's Gibbs step and the epoch's line in
    /// `metrics.jsonl`.
    pub fn end_epoch(
        &mut self,
        epoch: usize,
        step: u64,
        sums: &Position,
        started: Instant,
    ) -> Result<()> {
        self.gibbs(epoch, step)?;
        let record = self.epoch_record(epoch, step, sums, started, Some(&self.kept));
        self.sink.metrics(&record)?;
        log_epoch(&record, None);
        self.monitor
            .end_epoch(epoch, record.kinetic_energy, sums.ke_count);
        Ok(())
    }

    /// After update `step` (counted from 1) of epoch `epoch`: a line of
    /// `diagnostics.jsonl` where one is due (`temperature`: a replica's).
    pub fn watch(
        &mut self,
        step: u64,
        epoch: usize,
        last_of_epoch: bool,
        temperature: Option<f64>,
    ) -> Result<()> {
        if !self.monitor.due(step, last_of_epoch) {
            return Ok(());
        }
        let inputs = super::diagnostics::Inputs {
            names: self.model.params.iter().map(|p| p.name.clone()).collect(),
            sampler: self.stepper.sampler.as_ref(),
            prior_energy: self.stepper.potential.prior.energy(&self.model.vars())?,
            n_data: self.ds.train.len(),
            minibatch_nll: self.last_nll,
        };
        let mut record = super::diagnostics::record(step, epoch, inputs)?;
        record.temperature = temperature;
        let tensors: Vec<(String, usize)> = self
            .model
            .params
            .iter()
            .map(|p| (p.name.clone(), p.var.elem_count()))
            .collect();
        self.monitor.fill_configurational(&mut record, &tensors);
        if record.configurational.is_some() {
            self.adapt_step_size(epoch);
        }
        self.sink.diagnostics(&record)?;
        self.monitor.record(record);
        Ok(())
    }

    /// `--adapt-step-size`, in burn-in after a record: halves the step when the block of
    /// records just ended was out of the configurational band.
    fn adapt_step_size(&mut self, epoch: usize) {
        let s = &self.cfg.settings;
        if !s.adapt_step_size || epoch >= s.schedule.burnin {
            return;
        }
        let Some((t, se)) = self.monitor.configurational.burnin_verdict() else {
            return;
        };
        if self.step_halvings >= MAX_STEP_HALVINGS {
            return;
        }
        self.step_halvings += 1;
        tracing::info!(
            "burn-in, epoch {}: configurational temperature {t:.3} ± {se:.3} out of [0.9, 1.1]: step size halved to {:e} ({} of at most {MAX_STEP_HALVINGS})",
            epoch + 1,
            self.base_step_size(),
            self.step_halvings
        );
    }

    /// The prior's Gibbs step at the potential's temperature (samplers only: SGD and
    /// momentum are point estimates, for which the prior is a fixed weight decay, its
    /// initial λ); a parameter that is no longer finite stops the run.
    pub fn gibbs(&mut self, epoch: usize, step: u64) -> Result<()> {
        let s = &self.cfg.settings;
        let gibbs = if s.sampler.kind.is_sampler() {
            let seed = s.seed ^ rng::GIBBS_STREAM ^ epoch as u64;
            self.noise_update(Some(seed)).and_then(|_| {
                self.stepper.potential.prior.gibbs_step(
                    &self.model.vars(),
                    self.stepper.potential.temperature,
                    seed,
                )
            })
        } else if self.model.all_finite()? {
            self.noise_update(None)
        } else {
            Err(Error::NotFinite("a parameter".into()))
        };
        if let Err(Error::NotFinite(what)) = gibbs {
            let what = match self.model.first_non_finite()? {
                Some(name) => format!("tensor {name}"),
                None => what,
            };
            return Err(Error::Exploded {
                step,
                epoch: epoch + 1,
                what,
                suggestion: self.base_step_size() / 4.0,
            });
        }
        gibbs
    }

    /// A regression's noise precision from the training residuals at the current θ
    /// (with a sampled σ only): a Gibbs draw seeded `seed` for a sampler, the conditional's
    /// mode for a point estimate (SGD and momentum fit σ as they fit θ).
    fn noise_update(&mut self, seed: Option<u64>) -> Result<()> {
        let Some(noise @ Noise::Gamma { .. }) = self.stepper.potential.likelihood.noise() else {
            return Ok(());
        };
        let sse = task::training_sse(&self.model, &self.ds.train, &self.cfg.device)?;
        let potential = &mut self.stepper.potential;
        match seed {
            // Its own stream: the weights' Gibbs step keeps the draws it had.
            Some(seed) => potential.noise_gibbs_step(sse, seed ^ rng::NOISE_GIBBS_STREAM),
            None => {
                potential.noise_precision = noise.mode(sse, potential.n_data)?;
                Ok(())
            }
        }
    }

    /// The line of epoch `epoch` in `metrics.jsonl`, with the ensembles of `kept` (none:
    /// no samples).
    pub fn epoch_record(
        &self,
        epoch: usize,
        step: u64,
        sums: &Position,
        started: Instant,
        kept: Option<&Kept>,
    ) -> EpochRecord {
        let diag = self.stepper.sampler.diagnostics();
        // A schedule that changes η within the epoch (cycles, polynomial decay) gives its
        // last and mean step size too.
        let varies = sums.eta_last != sums.eta_first;
        EpochRecord {
            replica: None,
            temperature: None,
            epoch: epoch + 1,
            steps: step,
            train_nll: sums.nll_sum / sums.seen as f64,
            train_accuracy: sums.correct as f64 / sums.seen as f64,
            step_size: sums.eta_first,
            step_size_last: varies.then_some(sums.eta_last),
            step_size_mean: varies.then(|| sums.eta_sum / sums.updates as f64),
            kinetic_energy: (sums.ke_count > 0).then(|| sums.ke_sum / sums.ke_count as f64),
            thermostat: diag.thermostat,
            prior_precisions: self.stepper.potential.prior.precisions.clone(),
            samples: kept.map_or(0, |k| k.samples()),
            test_ensemble: kept.and_then(|k| k.test.classes()?.metrics()),
            test_regression: kept.and_then(|k| k.test.gaussian()?.metrics()),
            train_rmse: match self.ds.task {
                Task::Regression { std, .. } => {
                    Some((sums.sq_error / sums.seen as f64).sqrt() * std)
                }
                Task::Classification { .. } => None,
            },
            noise_std: match self.ds.task {
                Task::Regression { std, .. } => {
                    Some(std / self.stepper.potential.noise_precision.sqrt())
                }
                Task::Classification { .. } => None,
            },
            test_last_sample: kept.and_then(|k| k.test.classes()?.last_sample),
            valid_ensemble: kept.and_then(|k| k.valid.as_ref().and_then(|a| a.metrics())),
            seconds: started.elapsed().as_secs_f64(),
        }
    }

    /// Hands the chain's state as it stands at `progress` to the sink.
    fn save(&mut self, progress: Position) -> Result<()> {
        let state = self.state_at(progress, &self.kept)?;
        self.sink.save_state(&state)
    }

    /// The chain's state as it stands at `progress`, with `kept`'s ensembles.
    pub fn state_at(&self, progress: Position, kept: &Kept) -> Result<RunState> {
        let (test, valid, regression) = kept.saved()?;
        Ok(RunState {
            progress,
            params: self
                .model
                .params
                .iter()
                .map(|p| Ok((p.name.clone(), p.var.as_tensor().to_device(&Device::Cpu)?)))
                .collect::<Result<_>>()?,
            sampler: self.stepper.sampler.state()?,
            prior_precisions: self.stepper.potential.prior.precisions.clone(),
            test,
            valid,
            regression,
            noise_precision: (!self.stepper.potential.likelihood.is_categorical())
                .then_some(self.stepper.potential.noise_precision),
            kinetic_trace: kept.kinetic_trace.clone(),
            rollbacks: self.rollbacks,
            configurational: self.monitor.configurational.clone(),
            step_halvings: self.step_halvings,
        })
    }
}

/// Logs an epoch's line (with the replica's temperature in a replica run).
pub(super) fn log_epoch(record: &EpochRecord, temperature: Option<f64>) {
    tracing::info!(
        epoch = record.epoch,
        temperature,
        nll = format!("{:.4}", record.train_nll),
        // A regression has no accuracy: its training RMSE (target units) instead.
        acc = record
            .train_rmse
            .is_none()
            .then(|| format!("{:.4}", record.train_accuracy)),
        rmse = record.train_rmse.map(|r| format!("{r:.4}")),
        ke = record.kinetic_energy.map(|k| format!("{k:.3}")),
        thermostat = record.thermostat.map(|t| format!("{t:.3e}")),
        samples = record.samples,
        test_ens_acc = record.test_ensemble.map(|m| format!("{:.4}", m.accuracy)),
        secs = format!("{:.1}", record.seconds),
        "epoch done"
    );
}

pub(super) fn append_line(path: &Path, line: &str) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| Error::io(path, e))?;
    writeln!(f, "{line}").map_err(|e| Error::io(path, e))
}

pub(super) fn to_json<T: Serialize>(v: &T) -> Result<String> {
    serde_json::to_string(v).map_err(|e| Error::Checkpoint(format!("serialising JSON: {e}")))
}

/// The metadata stored in each sample file.
fn sample_metadata(
    cfg: &TrainConfig,
    ds: &Dataset,
    step: u64,
    epoch: usize,
    step_size: f64,
) -> Result<BTreeMap<String, String>> {
    Ok(BTreeMap::from([
        ("step".to_string(), step.to_string()),
        ("epoch".to_string(), epoch.to_string()),
        (
            "sampler".to_string(),
            cfg.settings.sampler.kind.name().to_string(),
        ),
        (
            "hyperparameters".to_string(),
            to_json(&cfg.settings.sampler)?,
        ),
        ("prior".to_string(), to_json(&cfg.settings.prior)?),
        (
            "temperature".to_string(),
            cfg.settings.temperature.to_string(),
        ),
        ("step_size".to_string(), step_size.to_string()),
        ("dataset".to_string(), ds.name.clone()),
        ("architecture".to_string(), to_json(&cfg.settings.model)?),
        ("seed".to_string(), cfg.settings.seed.to_string()),
        (
            "bnn_version".to_string(),
            env!("CARGO_PKG_VERSION").to_string(),
        ),
    ]))
}

/// Before a resume: drops what the run wrote after its saved state (samples of later
/// updates, metrics lines of later epochs) and temporary files a kill left behind; they
/// are written again, identically.
pub(super) fn discard_after(run_dir: &Path, at: &Position) -> Result<()> {
    let metrics_path = &run_dir.join(crate::checkpoint::files::METRICS);
    trim_diagnostics(
        &run_dir.join(crate::checkpoint::files::DIAGNOSTICS),
        at.step,
    )?;
    // A replica's folder has no samples of its own.
    let samples = if checkpoint::samples_dir(run_dir).is_dir() {
        checkpoint::list_samples_by_step(run_dir)?
    } else {
        Vec::new()
    };
    for (step, path) in samples {
        if step > at.step {
            std::fs::remove_file(&path).map_err(|e| Error::io(&path, e))?;
        }
    }
    for dir in [
        run_dir.to_path_buf(),
        checkpoint::samples_dir(run_dir),
        run_state::state_path(run_dir)
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default(),
    ] {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') && name.contains(".tmp") {
                let path = entry.path();
                std::fs::remove_file(&path).map_err(|e| Error::io(&path, e))?;
            }
        }
    }
    if metrics_path.exists() {
        let text = std::fs::read_to_string(metrics_path).map_err(|e| Error::io(metrics_path, e))?;
        let kept: String = text
            .lines()
            .take(at.epoch)
            .flat_map(|l| {
                [
                    l, "
",
                ]
            })
            .collect();
        crate::atomic::write_atomic(metrics_path, kept.as_bytes())?;
    }
    Ok(())
}

/// Drops the lines of a `diagnostics.jsonl` written after update `step`.
pub(super) fn trim_diagnostics(path: &Path, step: u64) -> Result<()> {
    if !path.exists() {
        return Ok(());
    }
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let kept: String = text
        .lines()
        .filter(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .ok()
                .and_then(|v| v["step"].as_u64())
                .is_some_and(|s| s <= step)
        })
        .flat_map(|l| [l, "\n"])
        .collect();
    crate::atomic::write_atomic(path, kept.as_bytes())
}

/// A divergence at update `step` of epoch `epoch` (0-based): `quantity` took a
/// non-finite value, shown `what` (where); the step size in use was `step_size`.
pub(super) fn diverged(
    step: u64,
    epoch: usize,
    (quantity, value): (&'static str, f64),
    what: String,
    step_size: f64,
) -> Error {
    Error::Diverged {
        step,
        epoch: epoch + 1,
        quantity,
        value,
        what,
        suggestion: step_size / 4.0,
    }
}

/// The sampler's watch for a chain of `cfg` (fresh at a start, a resume or a rollback).
fn new_monitor(
    cfg: &TrainConfig,
    stepper: &Stepper,
    parameters: usize,
) -> super::diagnostics::Monitor {
    let s = &cfg.settings;
    super::diagnostics::Monitor::new(s.log_every, stepper.sampler.diagnostics().thermostat, "")
        .checking_from(s.schedule.burnin)
        .of_parameters(parameters)
}

fn progress_bar(
    show: bool,
    len: u64,
    epoch: usize,
    epochs: usize,
) -> Box<dyn crate::progress::ProgressBar> {
    crate::progress::bar(show, len, &format!("epoch {}/{}", epoch + 1, epochs))
}

/// The bar's message: the epoch's training NLL and accuracy so far, and the diagnostics.
fn progress_message(sums: &Position, diag: sampler::Diagnostics) -> String {
    let (nll, acc) = (
        sums.nll_sum / sums.seen as f64,
        sums.correct as f64 / sums.seen as f64,
    );
    let mut m = format!("nll {nll:.4} acc {acc:.4}");
    if let Some(ke) = diag.kinetic_energy {
        m.push_str(&format!(" ke/param {ke:.3}"));
    }
    if let Some(t) = diag.thermostat {
        m.push_str(&format!(" thermostat {t:.3e}"));
    }
    m
}
