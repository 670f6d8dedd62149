//! `--chain-layout stacked`: K chains as one computation. The chains are the chains of
//! [`super::chain`] — chain k has the seed [`rng::chain_seed`]`(seed, k)`, its own
//! minibatch order, noise stream, prior precisions, ensembles and folder `RUN/chain-k/` —
//! but their parameters live in one [`Stacked`] network with a leading chain axis: each
//! update gathers the K minibatches into one (K, B, D) input, runs one forward and one
//! backward over all chains ([`evaluate_stacked`]), and each chain's fused sampler steps
//! its slice of every stacked tensor in place. So chain k of a stacked run is chain k of a
//! run of the same seed with its chains apart, up to the summation order of the batched
//! products (tests/suite/stacked.rs). Where a chain reads its own θ — a sample, the
//! diagnostics, the prior's Gibbs step, a saved state — its network is brought up to date
//! from the stack first; a restored network is copied into the stack.
//!
//! State: the chains move in step, so their states are saved together, into one of two
//! slots, `RUN/stacked/slot-{0,1}/chain-k/`, then `RUN/stacked.json` (which slot, where
//! the run stands) is replaced atomically, as replica exchange saves its replicas: a kill
//! while a slot is written leaves the other slot and the old record, and every chain
//! resumes from the same update.

use std::path::{Path, PathBuf};
use std::time::Instant;

use candle_core::Tensor;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

use super::chain::{discard_after, Chain, ChainOutcome, Predicted};
use super::sink::RunFolder;
use super::stepper::Batch;
use super::TrainConfig;
use crate::backprop::mlp::BatchLoss;
use crate::checkpoint;
use crate::data::Dataset;
use crate::driver;
use crate::ensemble::{self, Prediction};
use crate::error::{Error, Result};
use crate::model::stacked::Stacked;
use crate::model::Network;
use crate::potential::{evaluate_stacked, Backward, Potential};
use crate::rng;
use crate::run_state::Position;

/// `RUN/stacked.json`: which slot holds the chains' states, and where the run stood.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    slot: usize,
    step: u64,
    train_seconds: f64,
}

/// One chain of the stack and what it carries between updates.
pub(super) struct Lane<'a> {
    pub(super) chain: Chain<'a>,
    pub(super) shuffle: rand::rngs::StdRng,
    pub(super) order: Vec<usize>,
    /// The epoch's running sums.
    pub(super) sums: Position,
    pub(super) epoch_started: Instant,
    /// Its minibatch, where it is gathered on the host.
    batch: Batch,
}

/// The run-wide constants of the loop.
pub(super) struct Run<'a> {
    pub(super) cfg: &'a TrainConfig,
    pub(super) ds: &'a Dataset,
    pub(super) batches: u64,
    pub(super) total_steps: u64,
    /// The training set on the run's device, where minibatches need no host work.
    pub(super) resident: Option<Resident>,
}

/// The training set on the device, each row as [`crate::data::Split::gather`] writes it
/// (scaled or standardised), with its targets: an update then sends the device K·B
/// indices and gathers its minibatches there (`index_select`), instead of sending K·B
/// rows (at K = 64, batch 100, MNIST: 20 MB an update). Not used with `--augment`
/// (images transformed per update on the host) or `--permute-labels` (labels per epoch).
pub(super) struct Resident {
    x: Tensor,
    y: Tensor,
}

impl Resident {
    /// Whether the run's minibatches can be gathered on the device.
    pub(super) fn wanted(cfg: &TrainConfig, ds: &Dataset) -> Result<bool> {
        let s = &cfg.settings;
        Ok(s.permute_labels == 0.0 && s.augment.for_dataset(&ds.name)?.is_none())
    }

    fn of(cfg: &TrainConfig, ds: &Dataset) -> Result<Option<Resident>> {
        if !Self::wanted(cfg, ds)? {
            return Ok(None);
        }
        let split = &ds.train;
        let all: Vec<usize> = (0..split.len()).collect();
        let (mut x, mut y, mut v) = (Vec::new(), Vec::new(), Vec::new());
        split.gather(&all, &mut x, &mut y);
        let device = &cfg.device;
        let y = match ds.task.is_regression() {
            true => {
                split.gather_values(&all, &mut v);
                Tensor::from_vec(v, all.len(), device)?
            }
            false => Tensor::from_vec(y, all.len(), device)?,
        };
        let x = Tensor::from_vec(x, (all.len(), split.dim()), device)?;
        Ok(Some(Resident { x, y }))
    }
}

/// Each chain's own settings: its seed, candle's autograd (the stack's pass is candle's),
/// no bar of its own.
pub(super) fn chain_settings(cfg: &TrainConfig) -> Vec<TrainConfig> {
    (0..cfg.settings.chains)
        .map(|k| {
            let mut c = cfg.clone();
            c.settings.seed = rng::chain_seed(cfg.settings.seed, k);
            c.settings.backward = Backward::Autograd;
            c.progress = false;
            c
        })
        .collect()
}

/// Runs the K chains of `cfg` on `ds` stacked; their outcomes in chain order.
pub(super) fn run_stacked(cfg: &TrainConfig, ds: &Dataset) -> Result<Vec<ChainOutcome>> {
    let s = &cfg.settings;
    let batches = (ds.train.len() / s.batch_size) as u64;
    let plan = Run {
        cfg,
        ds,
        batches,
        total_steps: batches * s.epochs as u64,
        resident: Resident::of(cfg, ds)?,
    };
    let cfgs = chain_settings(cfg);
    let mut lanes = new_lanes(&plan, &cfgs)?;
    let (step, seconds_before, mut saves) = match cfg.resume {
        true => restore(&plan, &mut lanes)?,
        false => (0, 0.0, 0),
    };
    let nets: Vec<_> = lanes.iter().map(|l| &l.chain.model).collect();
    let stack = Stacked::new(&nets)?;
    let num_params = lanes[0].chain.model.num_params();
    let clock = Clock {
        seconds_before,
        started: Instant::now(),
    };
    if !cfg.resume {
        // The state before the first update, then run.json: from here on the run can be
        // resumed whenever it stops.
        save(&plan, &lanes, 0, (0.0, 0.0), saves)?;
        saves += 1;
        super::manifest(cfg, ds, num_params).write(&cfg.run_dir)?;
    }
    tracing::info!(
        run = %cfg.run_dir.display(),
        params = num_params,
        train = ds.train.len(),
        "training {} stacked chains of {} with {} on {:?}",
        lanes.len(),
        s.model.label(),
        s.sampler.kind.name(),
        cfg.device
    );
    let (step, step_seconds) = run_updates(&plan, &mut lanes, &stack, (step, saves), &clock)?;
    Ok(lanes
        .into_iter()
        .map(|mut l| ChainOutcome {
            seed: l.chain.cfg.settings.seed,
            num_params,
            steps: step,
            step_seconds,
            train_seconds: clock.elapsed(),
            backward: Backward::Autograd,
            executor: None,
            test: l.chain.kept.test.clone(),
            valid: l.chain.kept.valid.clone(),
            kinetic_trace: std::mem::take(&mut l.chain.kept.kinetic_trace),
            rollbacks: 0,
        })
        .collect())
}

/// Training seconds: those of the earlier runs of a resumed run, and this one's.
pub(super) struct Clock {
    pub(super) seconds_before: f64,
    pub(super) started: Instant,
}

impl Clock {
    pub(super) fn elapsed(&self) -> f64 {
        self.seconds_before + self.started.elapsed().as_secs_f64()
    }
}

/// A lane per chain settings in `cfgs`, each with its folder made.
pub(super) fn new_lanes<'a>(plan: &Run<'a>, cfgs: &'a [TrainConfig]) -> Result<Vec<Lane<'a>>> {
    let (cfg, ds) = (plan.cfg, plan.ds);
    let mut lanes = Vec::with_capacity(cfgs.len());
    for (k, c) in cfgs.iter().enumerate() {
        let dir = checkpoint::chain_dir(&cfg.run_dir, k);
        std::fs::create_dir_all(checkpoint::samples_dir(&dir)).map_err(|e| Error::io(&dir, e))?;
        lanes.push(Lane {
            chain: Chain::new(c, ds, RunFolder::new(&dir), cfg.settings.seed)?,
            shuffle: rand::rngs::StdRng::seed_from_u64(c.settings.seed ^ rng::SHUFFLE_STREAM),
            order: (0..ds.train.len()).collect(),
            sums: Position::default(),
            epoch_started: Instant::now(),
            batch: Batch::default(),
        });
    }
    Ok(lanes)
}

/// The stacked chains' walk, as the driver runs it: one update of every chain a unit,
/// each chain's epoch begun (a fresh shuffle, its labels) before its first minibatch.
struct Walk<'p, 'l> {
    plan: &'p Run<'p>,
    lanes: &'p mut [Lane<'l>],
    stack: &'p Stacked,
    /// Updates done and their seconds, and the states saved so far (which alternate
    /// between two slots).
    step: u64,
    step_seconds: f64,
    saves: usize,
    clock: &'p Clock,
    bar: Box<dyn crate::progress::ProgressBar>,
}

impl driver::Transition for Walk<'_, '_> {
    fn done(&self) -> u64 {
        self.step
    }

    fn total(&self) -> u64 {
        self.plan.total_steps
    }

    fn advance(&mut self) -> Result<bool> {
        let (plan, stack) = (self.plan, self.stack);
        let epoch = (self.step / plan.batches) as usize;
        let b = self.step % plan.batches;
        if b == 0 {
            for lane in self.lanes.iter_mut() {
                lane.order.shuffle(&mut lane.shuffle);
                lane.chain.relabel(epoch);
                lane.sums = Position::default();
                lane.epoch_started = Instant::now();
            }
        }
        let t0 = Instant::now();
        let diags = update(plan, self.lanes, stack, self.step, epoch)?;
        self.step_seconds += t0.elapsed().as_secs_f64();
        self.step += 1;
        let last_of_epoch = b + 1 == plan.batches;
        after_update(
            plan,
            self.lanes,
            stack,
            self.step,
            epoch,
            last_of_epoch,
            &diags,
        )?;
        if self.step.is_multiple_of(20) || self.step == plan.total_steps {
            self.bar.set_position(self.step);
        }
        Ok(true)
    }

    /// Every chain's parameters copied out of the stack, then saved.
    fn save(&mut self) -> Result<()> {
        sync(self.lanes, self.stack)?;
        let seconds = (self.step_seconds, self.clock.elapsed());
        save(self.plan, self.lanes, self.step, seconds, self.saves)?;
        self.saves += 1;
        Ok(())
    }

    fn folder(&self) -> Option<&std::path::Path> {
        Some(&self.plan.cfg.run_dir)
    }

    fn stopping(&mut self) {
        self.bar.finish_and_clear();
    }
}

/// The updates from `step` to the run's end, the state saved every `--checkpoint-every`
/// updates, at the end and on a signal (then the run stops with an error naming it): the
/// updates done and the seconds spent in them.
fn run_updates(
    plan: &Run,
    lanes: &mut [Lane],
    stack: &Stacked,
    (step, saves): (u64, usize),
    clock: &Clock,
) -> Result<(u64, f64)> {
    let cfg = plan.cfg;
    let mut checkpoints =
        driver::Checkpoints::every(cfg.settings.checkpoint_interval(plan.batches));
    let step_seconds = lanes[0].sums.step_seconds;
    let mut walk = Walk {
        plan,
        lanes,
        stack,
        step,
        step_seconds,
        saves,
        clock,
        bar: crate::progress::bar(cfg.progress, plan.total_steps, "stacked chains"),
    };
    driver::drive(&mut walk, &mut checkpoints)?;
    walk.bar.finish_and_clear();
    Ok((walk.step, walk.step_seconds))
}

/// Refuses a stack of networks like `net` that cannot fit in the device's free memory,
/// before anything is allocated for the chains, in one line naming the need and the room.
pub(super) fn check_memory(cfg: &TrainConfig, ds: &Dataset, net: &Network) -> Result<()> {
    let s = &cfg.settings;
    let resident = match Resident::wanted(cfg, ds)? {
        true => ds.train.len() * (ds.train.dim() + 1),
        false => 0,
    };
    let need = stacked_bytes(net, s.chains, s.batch_size, resident, s.sampler.kind);
    let Some(free) = crate::kernels::memory::free_bytes(&cfg.device) else {
        return Ok(());
    };
    if need > free {
        let gb = |b: u64| b as f64 / 1e9;
        return Err(Error::Config(format!(
            "--chain-layout stacked with --chains {} needs about {:.1} GB on {} (each \
             chain's parameters, \
             momenta and gradients, and the minibatches' activations), and {:.1} GB is free: \
             ask for fewer chains or a smaller --batch-size",
            s.chains,
            gb(need),
            if cfg.device.is_cpu() {
                "the host"
            } else {
                "the device"
            },
            gb(free)
        )));
    }
    Ok(())
}

/// Bytes a stack of `chains` networks like `net` holds, roughly: per chain, its
/// parameters six times (the stack, the chain's own network, the momentum, the gradient,
/// the gradient with the prior's term, the update's copy) and the per-element thermostats
/// of mSGNHT; per example of each chain's minibatch, every layer's output four times
/// (pre-activation, activation and both their gradients); `resident` floats of training
/// data. An estimate to refuse what cannot fit, not an account.
fn stacked_bytes(
    net: &Network,
    chains: usize,
    batch: usize,
    resident: usize,
    kind: crate::sampler::SamplerKind,
) -> u64 {
    let copies = 5 + kind.state_arrays().max(1);
    let per_example: usize = net
        .convs
        .iter()
        .map(|c| c.out_channels * c.conv_side * c.conv_side)
        .chain(net.fc_widths())
        .sum();
    let floats = chains * (copies * net.num_params() + 4 * batch * per_example) + resident;
    4 * floats as u64
}

/// Brings every chain's network up to date from the stack.
fn sync(lanes: &[Lane], stack: &Stacked) -> Result<()> {
    for (k, lane) in lanes.iter().enumerate() {
        stack.copy_out(k, &lane.chain.model)?;
    }
    Ok(())
}

/// The K minibatches at `rows` of the chains' orders, gathered on the host (each chain's
/// labels and augmentation) and sent to the device: (K, B, D) inputs and (K, B) targets.
fn gather_on_host(
    plan: &Run,
    lanes: &mut [Lane],
    rows: std::ops::Range<usize>,
    step: u64,
) -> Result<(Tensor, Tensor)> {
    let split = &plan.ds.train;
    let (k, batch, dim) = (lanes.len(), rows.len(), split.dim());
    let regression = plan.ds.task.is_regression();
    let mut xs = Vec::with_capacity(k * batch * dim);
    let mut ys = Vec::with_capacity(k * batch);
    let mut vs = Vec::new();
    for lane in lanes.iter_mut() {
        let idx = &lane.order[rows.clone()];
        let augment = lane.chain.augment_at(step)?;
        let labels = lane.chain.labels();
        lane.batch
            .gather(split, idx, labels, augment, None, regression);
        xs.extend_from_slice(&lane.batch.x);
        ys.extend_from_slice(&lane.batch.y);
        vs.extend_from_slice(&lane.batch.v);
    }
    let device = &plan.cfg.device;
    let x = Tensor::from_vec(xs, (k, batch, dim), device)?;
    let y = match regression {
        true => Tensor::from_vec(vs, (k, batch), device)?,
        false => Tensor::from_vec(ys, (k, batch), device)?,
    };
    Ok((x, y))
}

/// Update `step` of every chain: each gathers its minibatch (its order, labels and
/// augmentation), one forward and backward over the stack, then each chain's sampler
/// steps its slices. Returns each chain's diagnostics.
fn update(
    plan: &Run,
    lanes: &mut [Lane],
    stack: &Stacked,
    step: u64,
    epoch: usize,
) -> Result<Vec<crate::sampler::Diagnostics>> {
    let s = &plan.cfg.settings;
    let (k, batch, dim) = (lanes.len(), s.batch_size, plan.ds.train.dim());
    let b = (step % plan.batches) as usize;
    for lane in lanes.iter_mut() {
        let eta =
            s.schedule
                .step_size_of(lane.chain.base_step_size(), step, plan.total_steps, epoch);
        lane.chain.begin_update(eta, &mut lane.sums)?;
    }
    let rows = b * batch..(b + 1) * batch;
    let (x, y) = match &plan.resident {
        Some(data) => {
            let idx: Vec<u32> = lanes
                .iter()
                .flat_map(|l| l.order[rows.clone()].iter().map(|&i| i as u32))
                .collect();
            let idx = Tensor::from_vec(idx, k * batch, &plan.cfg.device)?;
            let x = data.x.index_select(&idx, 0)?.reshape((k, batch, dim))?;
            (x, data.y.index_select(&idx, 0)?.reshape((k, batch))?)
        }
        None => gather_on_host(plan, lanes, rows, step)?,
    };
    let potentials: Vec<&Potential> = lanes.iter().map(|l| &l.chain.stepper.potential).collect();
    let eval = evaluate_stacked(&potentials, stack, &x, &y)?;
    if eval.nll.iter().all(|n| n.is_finite()) {
        step_stacked(lanes, stack, &eval.grads)?;
    } else {
        // A chain diverged: nobody moves (the run stops below, naming a tensor of the
        // chain's own network, as a chain apart does).
        sync(lanes, stack)?;
    }
    let mut diags = Vec::with_capacity(k);
    for (c, lane) in lanes.iter_mut().enumerate() {
        let loss = BatchLoss {
            nll: eval.nll[c],
            correct: eval.correct[c],
            sq_error: eval.sq_error[c],
        };
        diags.push(
            lane.chain
                .end_update(loss, batch, &mut lane.sums, step, epoch)?,
        );
    }
    Ok(diags)
}

/// One update of every chain from the stacked gradients: per parameter tensor, each
/// chain's sampler lends its update of that tensor and one fused op moves all K rows of
/// the stack ([`crate::kernels::stacked::step`]; one launch on CUDA).
fn step_stacked(lanes: &mut [Lane], stack: &Stacked, grads: &[Tensor]) -> Result<()> {
    let mut opens = lanes
        .iter_mut()
        .map(|l| crate::kernels::begin(l.chain.stepper.sampler.as_mut()))
        .collect::<Result<Vec<_>>>()?;
    for (t, (p, g)) in stack.params.iter().zip(grads).enumerate() {
        let mut lent = Vec::with_capacity(opens.len());
        for (c, open) in opens.iter_mut().enumerate() {
            lent.push(open.lend(t)?.ok_or_else(|| {
                Error::Config(format!(
                    "chain {c}'s sampler does not lend its update to a stacked step"
                ))
            })?);
        }
        let sums = crate::kernels::stacked::step(&p.var.as_detached_tensor(), g, &mut lent)?;
        drop(lent);
        for (open, sums) in opens.iter_mut().zip(sums) {
            open.lent(t, sums)?;
        }
    }
    opens.into_iter().try_for_each(|o| o.finish())
}

/// After update `step` (counted from 1): each chain's diagnostics line where one is due,
/// its sample where the schedule keeps one, and at the epoch's end its Gibbs step and
/// metrics line; the networks brought up to date first where any of them is needed.
#[allow(clippy::too_many_arguments)]
fn after_update(
    plan: &Run,
    lanes: &mut [Lane],
    stack: &Stacked,
    step: u64,
    epoch: usize,
    last_of_epoch: bool,
    diags: &[crate::sampler::Diagnostics],
) -> Result<()> {
    let s = &plan.cfg.settings;
    let keep = s.schedule.keeps_sample(step, plan.total_steps, epoch);
    let watch = lanes
        .iter()
        .any(|l| l.chain.monitor.due(step, last_of_epoch));
    if !(keep || watch || last_of_epoch) {
        return Ok(());
    }
    sync(lanes, stack)?;
    let mut predicted = match keep {
        true => predict_stacked(plan, lanes, stack)?,
        false => Vec::new(),
    }
    .into_iter();
    for (lane, &diag) in lanes.iter_mut().zip(diags) {
        lane.chain.watch(step, epoch, last_of_epoch, None)?;
        if keep {
            let eta = lane.chain.stepper.sampler.params().step_size();
            lane.chain
                .keep_sample(step, epoch, eta, diag, predicted.next())?;
        }
        if last_of_epoch {
            lane.chain
                .end_epoch(epoch, step, &lane.sums, lane.epoch_started)?;
        }
    }
    Ok(())
}

/// Off the CPU, a classifier's samples predict the test (and validation) set in one pass
/// over the stack for all chains ([`ensemble::predict_stacked`]) instead of K passes;
/// empty where each chain predicts alone (on the CPU, whose own forward pass is faster
/// than candle's, and for a regression's Gaussians).
fn predict_stacked(plan: &Run, lanes: &[Lane], stack: &Stacked) -> Result<Vec<Predicted>> {
    let (ds, device) = (plan.ds, &plan.cfg.device);
    if device.is_cpu() || ds.task.is_regression() {
        return Ok(Vec::new());
    }
    let like = &lanes[0].chain.model;
    let test = ensemble::predict_stacked(stack, like, &ds.test, device)?;
    let mut valid = match &ds.valid {
        Some(v) => ensemble::predict_stacked(stack, like, v, device)?
            .into_iter()
            .map(Some)
            .collect(),
        None => vec![None; test.len()],
    };
    Ok(test
        .into_iter()
        .zip(valid.drain(..))
        .map(|(test, valid)| Predicted {
            test: Prediction::Classes(test),
            valid: valid.map(Prediction::Classes),
        })
        .collect())
}

/// Saves every chain's state at `step`, with the seconds spent in updates and in all,
/// into the next slot, then the record naming it.
pub(super) fn save(
    plan: &Run,
    lanes: &[Lane],
    step: u64,
    (step_seconds, train_seconds): (f64, f64),
    saves: usize,
) -> Result<()> {
    let run_dir = &plan.cfg.run_dir;
    let slot = saves % 2;
    for (k, lane) in lanes.iter().enumerate() {
        let progress = Position {
            epoch: (step / plan.batches) as usize,
            batch: (step % plan.batches) as usize,
            step,
            step_seconds,
            train_seconds,
            ..if step.is_multiple_of(plan.batches) {
                Position::default()
            } else {
                lane.sums.clone()
            }
        };
        lane.chain
            .state_at(progress, &lane.chain.kept)?
            .save(&slot_dir(run_dir, slot, k))?;
    }
    let record = Record {
        slot,
        step,
        train_seconds,
    };
    let json = serde_json::to_string_pretty(&record)
        .map_err(|e| Error::Checkpoint(format!("serialising stacked.json: {e}")))?;
    crate::atomic::write_atomic(&run_dir.join("stacked.json"), json.as_bytes())
}

/// Continues from `RUN/stacked.json` and its slot: every chain's θ, sampler, prior,
/// ensembles, epoch sums and minibatch order; drops what was written after it. Returns
/// the step, the seconds trained before and the saves made.
pub(super) fn restore(plan: &Run, lanes: &mut [Lane]) -> Result<(u64, f64, usize)> {
    let run_dir = &plan.cfg.run_dir;
    let path = run_dir.join("stacked.json");
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    let record: Record = serde_json::from_str(&text)
        .map_err(|e| Error::Checkpoint(format!("{}: corrupt: {e}", path.display())))?;
    for (k, lane) in lanes.iter_mut().enumerate() {
        let at = lane
            .chain
            .restore_from(&slot_dir(run_dir, record.slot, k))?;
        if at.step != record.step {
            return Err(Error::Checkpoint(format!(
                "chain {k}'s saved state is at update {}, the run's at {}",
                at.step, record.step
            )));
        }
        lane.chain
            .replay_to(&at, &mut lane.order, &mut lane.shuffle);
        discard_after(&lane.chain.sink.dir, &at)?;
        lane.sums = at;
    }
    tracing::info!(
        epoch = lanes[0].sums.epoch + 1,
        batch = lanes[0].sums.batch,
        step = record.step,
        "resuming {} stacked chains",
        lanes.len()
    );
    Ok((record.step, record.train_seconds, record.slot + 1))
}

fn slot_dir(run_dir: &Path, slot: usize, k: usize) -> PathBuf {
    run_dir
        .join("stacked")
        .join(format!("slot-{slot}"))
        .join(format!("chain-{k}"))
}
