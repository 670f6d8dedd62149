//! The training loop: seeded shuffled minibatches, one sampler update per minibatch,
//! burn-in and thinning, samples to disk and into the streaming ensemble, per-epoch
//! metrics, and a summary.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use candle_core::{Device, Tensor, Var};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

use crate::backprop::mlp::BatchLoss;
use crate::backprop::Backprop;
use crate::checkpoint::{self, RunManifest};
use crate::convergence::{self, Convergence};
use crate::data::{Dataset, Split, NUM_CLASSES};
use crate::ensemble::{self, Accumulator};
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::model::Network;
use crate::potential::{Backward, Potential, Prior};
use crate::run_state::{self, Progress, RunState};
use crate::sampler::{self, Kernel, Sampler, SamplerConfig, TensorwiseStep};
use crate::settings::Settings;
use crate::signals;

/// Everything a training run needs besides the data: its settings and where and how it
/// runs.
#[derive(Debug, Clone)]
pub struct TrainConfig {
    pub settings: Settings,
    /// Folder of this run (`checkpoints/<run>`).
    pub run_dir: PathBuf,
    /// Show a progress bar.
    pub progress: bool,
    /// Where parameters, minibatches and sampler state live.
    pub device: Device,
    /// Continue the run in `run_dir` from its saved state.
    pub resume: bool,
    /// The command line that started the run (recorded in `run.json` for `--resume`).
    pub command_line: Vec<String>,
}

/// One line of `metrics.jsonl`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EpochRecord {
    pub epoch: usize,
    pub steps: u64,
    /// Mean minibatch negative log-likelihood per example.
    pub train_nll: f64,
    /// Accuracy on the minibatches as they were seen.
    pub train_accuracy: f64,
    /// η of the epoch's first update; where the schedule changes it within the epoch
    /// (`--cycles`, `--poly-gamma`), also its last and its mean over the epoch.
    pub step_size: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_size_last: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_size_mean: Option<f64>,
    pub kinetic_energy: Option<f64>,
    pub thermostat: Option<f64>,
    pub prior_precisions: Vec<f64>,
    pub samples: usize,
    pub test_ensemble: Option<Metrics>,
    pub test_last_sample: Option<Metrics>,
    pub valid_ensemble: Option<Metrics>,
    pub seconds: f64,
}

/// `summary.json`, also the last line `bnn train` prints.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Summary {
    pub dataset: String,
    pub data_source: String,
    /// Pixels standardised per pixel (`--standardize`) rather than scaled to [0, 1].
    pub standardized_inputs: bool,
    /// The run's settings, as in `run.json`.
    #[serde(flatten)]
    pub settings: Settings,
    /// The network in short (`mlp-784-100-10-relu`, ...).
    pub model_label: String,
    pub num_params: usize,
    /// The CPU kernel path (`avx512`, `avx2` or `portable`; see `kernels::isa`).
    #[serde(default)]
    pub isa: String,
    /// The gradient implementation used (`custom` or `autograd`: `auto` resolved).
    pub backward_used: Backward,
    pub samples: usize,
    /// Bayesian model average over the kept samples, on the test set.
    pub ensemble: Option<Metrics>,
    /// The last kept sample alone, on the test set.
    pub last_sample: Option<Metrics>,
    pub valid_ensemble: Option<Metrics>,
    pub steps: u64,
    /// Wall time of the whole loop, evaluation and checkpoints included.
    pub train_seconds: f64,
    /// Updates per second of the training step alone (gather, forward, backward, update);
    /// with several chains, summed over them.
    pub steps_per_second: f64,
    /// Each chain's own figures (runs of several chains).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chains: Vec<ChainSummary>,
    /// Split-R̂ and ESS across the chains (runs of several chains).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub convergence: Option<ChainDiagnostics>,
    pub run_dir: String,
}

/// One chain of a multi-chain run in `summary.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChainSummary {
    pub chain: usize,
    pub seed: u64,
    pub samples: usize,
    pub ensemble: Option<Metrics>,
    pub last_sample: Option<Metrics>,
    pub valid_ensemble: Option<Metrics>,
    pub steps_per_second: f64,
}

/// Convergence across chains: of the test log-likelihood of each sample alone, and of the
/// kinetic energy per parameter at each sample (momentum samplers); `None` where there are
/// too few samples.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChainDiagnostics {
    pub test_log_likelihood: Option<Convergence>,
    pub kinetic_energy: Option<Convergence>,
}

fn append_line(path: &Path, line: &str) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| Error::io(path, e))?;
    writeln!(f, "{line}").map_err(|e| Error::io(path, e))
}

fn to_json<T: Serialize>(v: &T) -> Result<String> {
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

/// Seed of the shuffling stream, apart from the noise and initialisation streams.
const SHUFFLE_STREAM: u64 = 0x5348_5546_464c_4500;
/// Seed of the prior's Gibbs steps.
const GIBBS_STREAM: u64 = 0x4749_4242_5300_0000;

/// One training update (minibatch gather, forward, backward, sampler step) with the
/// buffers it reuses; shared by [`train`] and `bnn bench train`.
pub struct Stepper {
    model: Network,
    vars: Vec<Var>,
    pub potential: Potential,
    pub sampler: Box<dyn Sampler>,
    /// The gradient implementation in use (`auto` resolved).
    pub backward: Backward,
    backprop: Option<Backprop>,
    /// With the custom backward: update each layer as soon as its gradient is ready
    /// (default), instead of after the whole backward.
    pub by_layer: bool,
    xbuf: Vec<f32>,
    ybuf: Vec<u32>,
}

impl Stepper {
    /// A stepper for `model` (whose parameters it updates in place) on minibatches of
    /// `batch` examples.
    pub fn new(
        model: &Network,
        potential: Potential,
        sampler: SamplerConfig,
        kernel: Kernel,
        backward: Backward,
        seed: u64,
        batch: usize,
    ) -> Result<Self> {
        let vars = model.vars();
        let device = vars.first().map_or(Device::Cpu, |v| v.device().clone());
        let backward = backward.resolve(&device)?;
        let backprop = match backward {
            Backward::Custom => Some(Backprop::new(model, batch)?),
            _ => None,
        };
        Ok(Stepper {
            model: model.clone(),
            sampler: sampler::build_with(sampler, &vars, seed, kernel)?,
            vars,
            potential,
            backward,
            backprop,
            by_layer: true,
            xbuf: Vec::new(),
            ybuf: Vec::new(),
        })
    }

    /// With `by_layer`: whether large weight tensors are updated inside their gradient's
    /// product (default) rather than in a pass of their own.
    pub fn set_inline_update(&mut self, on: bool) {
        if let Some(bp) = self.backprop.as_mut() {
            bp.set_inline_update(on);
        }
    }

    /// Weight tensors updated inside their gradient's product so far.
    pub fn inline_updates(&self) -> u64 {
        self.backprop.as_ref().map_or(0, |bp| bp.inline_updates())
    }

    /// One update on the examples `idx` of `split`. Returns the minibatch loss; when it is
    /// not finite the parameters are left as they were.
    pub fn step(&mut self, split: &Split, idx: &[usize]) -> Result<BatchLoss> {
        split.gather(idx, &mut self.xbuf, &mut self.ybuf);
        if let Some(bp) = self.backprop.as_mut() {
            if self.by_layer {
                // Each layer is updated as soon as its gradient is ready (while it is in
                // cache); θ and v bit-identical to the whole-model step below.
                let step: &mut dyn TensorwiseStep = self.sampler.as_mut();
                return self.potential.evaluate_fast_then(
                    bp,
                    &self.model,
                    &self.xbuf,
                    &self.ybuf,
                    Some(step),
                );
            }
            let loss = self
                .potential
                .evaluate_fast(bp, &self.model, &self.xbuf, &self.ybuf)?;
            if loss.nll.is_finite() {
                self.sampler.step(&self.vars, bp.grads())?;
            }
            return Ok(loss);
        }
        let device = self.vars[0].device();
        let x = Tensor::from_slice(&self.xbuf, (idx.len(), split.dim()), device)?;
        let y = Tensor::from_slice(&self.ybuf, idx.len(), device)?;
        let eval = self.potential.evaluate(&self.model, &x, &y)?;
        if eval.nll.is_finite() {
            self.sampler.step(&self.vars, &eval.grads)?;
        }
        let pred = eval.logits.argmax(1)?.to_vec1::<u32>()?;
        let correct = pred.iter().zip(&self.ybuf).filter(|(p, y)| p == y).count();
        Ok(BatchLoss {
            nll: eval.nll,
            correct,
        })
    }
}

/// What `run.json` records of a run of `cfg` on `ds`.
pub fn manifest(cfg: &TrainConfig, ds: &Dataset, num_params: usize) -> RunManifest {
    RunManifest {
        bnn_version: env!("CARGO_PKG_VERSION").to_string(),
        dataset: ds.name.clone(),
        data_source: ds.source.clone(),
        valid: ds.valid.as_ref().map_or(0, |v| v.len()),
        train_examples: ds.train.len(),
        input_dim: ds.train.dim(),
        num_classes: NUM_CLASSES,
        num_params,
        settings: cfg.settings.clone(),
        standardization: ds.train.standardization.as_deref().cloned(),
        command_line: cfg.command_line.clone(),
    }
}

/// Trains on `ds` and returns the summary (also written to `summary.json`). With
/// `cfg.resume` it continues the run in `cfg.run_dir` from its saved state, bit for bit.
/// With `cfg.settings.chains` = K > 1, K independent chains run side by side on the thread pool
/// (one chain per pool thread), each in `RUN/chain-<k>/` with its own seed
/// ([`rng::chain_seed`]); the ensemble pools every chain's samples.
pub fn train(cfg: &TrainConfig, ds: &Dataset) -> Result<Summary> {
    cfg.settings.validate(ds.train.len())?;
    let run_dir = &cfg.run_dir;
    if cfg.settings.chains <= 1 {
        let chain = run_chain(cfg, ds, run_dir, true)?;
        return finish(cfg, ds, vec![chain]);
    }
    std::fs::create_dir_all(run_dir).map_err(|e| Error::io(run_dir, e))?;
    if !cfg.resume {
        // A new run under this name: nothing of an earlier one (of either layout) stays.
        let old_manifest = run_dir.join("run.json");
        for old in [
            old_manifest,
            run_dir.join("summary.json"),
            run_dir.join("metrics.jsonl"),
        ] {
            if old.exists() {
                std::fs::remove_file(&old).map_err(|e| Error::io(&old, e))?;
            }
        }
        for old in [checkpoint::samples_dir(run_dir), run_dir.join("state")] {
            if old.exists() {
                std::fs::remove_dir_all(&old).map_err(|e| Error::io(&old, e))?;
            }
        }
    }
    // run.json first: a chain stopped before its first state starts afresh on resume.
    manifest(
        cfg,
        ds,
        Network::new(
            &cfg.settings.model,
            ds.train.dim(),
            NUM_CLASSES,
            cfg.settings.seed,
            &Device::Cpu,
        )?
        .num_params(),
    )
    .write(run_dir)?;
    let results: Vec<std::sync::Mutex<Option<Result<ChainOutcome>>>> = (0..cfg.settings.chains)
        .map(|_| std::sync::Mutex::new(None))
        .collect();
    crate::pool::run(cfg.settings.chains, &|k| {
        let mut chain_cfg = cfg.clone();
        chain_cfg.settings.seed = crate::rng::chain_seed(cfg.settings.seed, k);
        chain_cfg.progress = false;
        let _span = tracing::info_span!("chain", k).entered();
        let out = run_chain(&chain_cfg, ds, &checkpoint::chain_dir(run_dir, k), false);
        if let Ok(mut slot) = results[k].lock() {
            *slot = Some(out);
        }
    });
    let mut chains = Vec::with_capacity(cfg.settings.chains);
    let mut first_error = None;
    for (k, slot) in results.into_iter().enumerate() {
        match slot.into_inner().ok().flatten() {
            Some(Ok(c)) => chains.push(c),
            Some(Err(e)) => {
                // A stop by signal is reported only if no chain failed otherwise.
                let replace = match (&first_error, &e) {
                    (None, _) => true,
                    (Some(Error::Interrupted { .. }), e) => !matches!(e, Error::Interrupted { .. }),
                    _ => false,
                };
                if replace {
                    first_error = Some(match e {
                        Error::Interrupted { signal, step, .. } => Error::Interrupted {
                            signal,
                            step,
                            run_dir: run_dir.clone(),
                        },
                        e => Error::Checkpoint(format!("chain {k}: {e}")),
                    });
                }
            }
            None => return Err(Error::Config(format!("chain {k} did not report"))),
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    finish(cfg, ds, chains)
}

/// What one chain leaves for the run's summary.
struct ChainOutcome {
    seed: u64,
    num_params: usize,
    test: Accumulator,
    valid: Option<Accumulator>,
    steps: u64,
    step_seconds: f64,
    train_seconds: f64,
    /// The kinetic energy per parameter at each kept sample (momentum samplers).
    kinetic_trace: Vec<f64>,
    backward: Backward,
}

/// One chain in `run_dir` (the run's folder, or a chain's folder of it); `write_manifest`
/// for a single-chain run, whose folder is the run's.
fn run_chain(
    cfg: &TrainConfig,
    ds: &Dataset,
    run_dir: &Path,
    write_manifest: bool,
) -> Result<ChainOutcome> {
    let device = cfg.device.clone();
    std::fs::create_dir_all(checkpoint::samples_dir(run_dir)).map_err(|e| Error::io(run_dir, e))?;
    let dim = ds.train.dim();
    let model = Network::new(
        &cfg.settings.model,
        dim,
        NUM_CLASSES,
        cfg.settings.seed,
        &device,
    )?;
    let vars = model.vars();
    let metrics_path = run_dir.join("metrics.jsonl");
    // A chain of a multi-chain run stopped before its first state starts afresh.
    let resume = cfg.resume && (write_manifest || run_state::state_path(run_dir).exists());
    let saved = if resume {
        let names: Vec<String> = model.params.iter().map(|p| p.name.clone()).collect();
        let state = RunState::load(run_dir, &names)?;
        if state.progress.epoch > cfg.settings.epochs {
            return Err(Error::Config(format!(
                "--epochs {} is fewer than the {} the run has done",
                cfg.settings.epochs, state.progress.epoch
            )));
        }
        discard_after(run_dir, &metrics_path, &state.progress)?;
        Some(state)
    } else {
        // A rerun under the same name starts afresh: old samples must not join the
        // ensemble. run.json goes first, so that a kill in between leaves no folder that
        // looks resumable.
        let old_manifest = run_dir.join("run.json");
        for old in [
            old_manifest,
            metrics_path.clone(),
            run_state::state_path(run_dir),
        ] {
            if old.exists() {
                std::fs::remove_file(&old).map_err(|e| Error::io(&old, e))?;
            }
        }
        for old in checkpoint::list_samples(run_dir)? {
            std::fs::remove_file(&old).map_err(|e| Error::io(&old, e))?;
        }
        None
    };

    let prior = Prior::new(cfg.settings.prior, model.params.len())?;
    let potential = Potential::new(ds.train.len(), cfg.settings.temperature, prior)?;
    let mut stepper = Stepper::new(
        &model,
        potential,
        cfg.settings.sampler,
        cfg.settings.kernel,
        cfg.settings.backward,
        cfg.settings.seed,
        cfg.settings.batch_size,
    )?;
    let backward = stepper.backward;
    let mut test_acc = Accumulator::new(&ds.test.labels);
    let mut valid_acc = ds.valid.as_ref().map(|v| Accumulator::new(&v.labels));
    let mut at = Progress::default();
    let mut kinetic_trace = Vec::new();
    if let Some(state) = saved {
        kinetic_trace = state.kinetic_trace;
        // After the sampler's init (splitting moves θ by v/2 there): the saved θ and state.
        for (var, (_, t)) in vars.iter().zip(&state.params) {
            var.set(&t.to_device(&device)?)?;
        }
        stepper.sampler.restore(&state.sampler)?;
        stepper.potential.prior.precisions = state.prior_precisions;
        test_acc = Accumulator::restore(&ds.test.labels, state.test.0, state.test.1)?;
        valid_acc = match (ds.valid.as_ref(), state.valid) {
            (Some(v), Some((s, sum))) => Some(Accumulator::restore(&v.labels, s, sum)?),
            (None, None) => None,
            _ => {
                return Err(Error::Checkpoint(
                    "the saved state and the data disagree on a validation set".into(),
                ))
            }
        };
        at = state.progress;
        tracing::info!(
            epoch = at.epoch + 1,
            batch = at.batch,
            step = at.step,
            "resuming"
        );
    }
    let mut shuffle_rng = rand::rngs::StdRng::seed_from_u64(cfg.settings.seed ^ SHUFFLE_STREAM);

    let n = ds.train.len();
    let batches_per_epoch = n / cfg.settings.batch_size;
    let total_steps = (batches_per_epoch * cfg.settings.epochs) as u64;
    let every = match cfg.settings.checkpoint_every {
        0 => batches_per_epoch as u64,
        k => k as u64,
    };
    let schedule = &cfg.settings.schedule;
    let mut order: Vec<usize> = (0..n).collect();
    // The minibatch order of the epochs done: the shuffle stream replayed.
    for _ in 0..at.epoch {
        order.shuffle(&mut shuffle_rng);
    }
    let started = Instant::now();
    let (seconds_before, mut step_seconds) = (at.train_seconds, at.step_seconds);
    let mut step = at.step;
    tracing::info!(
        run = %run_dir.display(),
        params = model.num_params(),
        train = n,
        "training {} with {}",
        cfg.settings.model.label(),
        cfg.settings.sampler.kind.name()
    );

    // Saves the state at `epoch`, `batch` with the epoch's sums so far.
    let save = |stepper: &Stepper,
                test_acc: &Accumulator,
                valid_acc: &Option<Accumulator>,
                kinetic_trace: &[f64],
                progress: Progress|
     -> Result<()> {
        let (ts, tsum) = test_acc.state();
        RunState {
            progress,
            params: model
                .params
                .iter()
                .map(|p| Ok((p.name.clone(), p.var.as_tensor().to_device(&Device::Cpu)?)))
                .collect::<Result<_>>()?,
            sampler: stepper.sampler.state()?,
            prior_precisions: stepper.potential.prior.precisions.clone(),
            test: (ts, tsum.to_vec()),
            valid: valid_acc.as_ref().map(|a| {
                let (s, sum) = a.state();
                (s, sum.to_vec())
            }),
            kinetic_trace: kinetic_trace.to_vec(),
        }
        .save(run_dir)
    };

    if !resume {
        // The state before the first update, then run.json: from here on the run can be
        // resumed whenever it stops.
        save(
            &stepper,
            &test_acc,
            &valid_acc,
            &kinetic_trace,
            Progress::default(),
        )?;
    }
    if write_manifest {
        manifest(cfg, ds, model.num_params()).write(run_dir)?;
    }

    for epoch in at.epoch..cfg.settings.epochs {
        let epoch_start = Instant::now();
        order.shuffle(&mut shuffle_rng);
        let resumed = epoch == at.epoch;
        let first_batch = if resumed { at.batch } else { 0 };
        let bar = progress_bar(
            cfg.progress,
            batches_per_epoch as u64,
            epoch,
            cfg.settings.epochs,
        );
        let mut sums = if resumed {
            at.clone()
        } else {
            Progress::default()
        };
        for (b, idx) in order
            .chunks_exact(cfg.settings.batch_size)
            .enumerate()
            .skip(first_batch)
        {
            let t0 = Instant::now();
            let eta =
                schedule.step_size_of(cfg.settings.sampler.step_size, step, total_steps, epoch);
            if sums.updates == 0 {
                sums.eta_first = eta;
            }
            sums.eta_last = eta;
            sums.eta_sum += eta;
            sums.updates += 1;
            if eta != stepper.sampler.config().step_size {
                stepper.sampler.set_step_size(eta)?;
            }
            let loss = stepper.step(&ds.train, idx)?;
            if !loss.nll.is_finite() {
                return Err(diverged(
                    step,
                    epoch,
                    loss.nll,
                    cfg.settings.sampler.step_size,
                ));
            }
            step += 1;
            step_seconds += t0.elapsed().as_secs_f64();

            sums.correct += loss.correct;
            sums.seen += idx.len();
            sums.nll_sum += loss.nll * idx.len() as f64;
            let diag = stepper.sampler.diagnostics();
            if let Some(ke) = diag.kinetic_energy {
                if !ke.is_finite() {
                    return Err(diverged(step, epoch, ke, cfg.settings.sampler.step_size));
                }
                sums.ke_sum += ke;
                sums.ke_count += 1;
            }

            if schedule.keeps_sample(step, total_steps, epoch) {
                // Never write a sample from a diverging chain.
                if !model.all_finite()? {
                    return Err(diverged(
                        step,
                        epoch,
                        f64::NAN,
                        cfg.settings.sampler.step_size,
                    ));
                }
                let meta = sample_metadata(cfg, ds, step, epoch, eta)?;
                checkpoint::save_sample(run_dir, step, &model, meta)?;
                if let Some(ke) = diag.kinetic_energy {
                    kinetic_trace.push(ke);
                }
                test_acc.add(&ensemble::predict(&model, &ds.test, &device)?);
                if let (Some(acc), Some(v)) = (valid_acc.as_mut(), ds.valid.as_ref()) {
                    acc.add(&ensemble::predict(&model, v, &device)?);
                }
            }
            if b % 20 == 0 {
                bar.set_position(b as u64);
                bar.set_message(progress_message(
                    sums.nll_sum / sums.seen as f64,
                    sums.correct as f64 / sums.seen as f64,
                    diag,
                ));
            }
            // Mid-epoch checkpoints; one due at the epoch's last update waits for the
            // epoch's end (the prior's Gibbs step and the metrics line).
            let signal = signals::pending();
            if b + 1 < batches_per_epoch && (signal.is_some() || step.is_multiple_of(every)) {
                let progress = Progress {
                    epoch,
                    batch: b + 1,
                    step,
                    step_seconds,
                    train_seconds: seconds_before + started.elapsed().as_secs_f64(),
                    ..sums.clone()
                };
                save(&stepper, &test_acc, &valid_acc, &kinetic_trace, progress)?;
                if let Some(signal) = signal {
                    bar.finish_and_clear();
                    return Err(interrupted(signal, step, run_dir));
                }
            }
        }
        bar.finish_and_clear();
        // The prior's precisions are resampled for the samplers only: SGD and momentum are
        // point estimates, for which the prior is a fixed weight decay (its initial λ).
        let gibbs = if cfg.settings.sampler.kind.is_sampler() {
            stepper.potential.prior.gibbs_step(
                &vars,
                cfg.settings.temperature,
                cfg.settings.seed ^ GIBBS_STREAM ^ epoch as u64,
            )
        } else if model.all_finite()? {
            Ok(())
        } else {
            Err(Error::NotFinite("a parameter".into()))
        };
        if let Err(Error::NotFinite(what)) = gibbs {
            return Err(Error::Exploded {
                step,
                epoch: epoch + 1,
                what,
                suggestion: cfg.settings.sampler.step_size / 4.0,
            });
        }
        gibbs?;
        let diag = stepper.sampler.diagnostics();
        let record = EpochRecord {
            epoch: epoch + 1,
            steps: step,
            train_nll: sums.nll_sum / sums.seen as f64,
            train_accuracy: sums.correct as f64 / sums.seen as f64,
            step_size: sums.eta_first,
            // A schedule that changes η within the epoch (cycles, polynomial decay).
            step_size_last: (sums.eta_last != sums.eta_first).then_some(sums.eta_last),
            step_size_mean: (sums.eta_last != sums.eta_first)
                .then(|| sums.eta_sum / sums.updates as f64),
            kinetic_energy: (sums.ke_count > 0).then(|| sums.ke_sum / sums.ke_count as f64),
            thermostat: diag.thermostat,
            prior_precisions: stepper.potential.prior.precisions.clone(),
            samples: test_acc.samples(),
            test_ensemble: test_acc.metrics(),
            test_last_sample: test_acc.last_sample,
            valid_ensemble: valid_acc.as_ref().and_then(|a| a.metrics()),
            seconds: epoch_start.elapsed().as_secs_f64(),
        };
        append_line(&metrics_path, &to_json(&record)?)?;
        tracing::info!(
            epoch = epoch + 1,
            nll = format!("{:.4}", record.train_nll),
            acc = format!("{:.4}", record.train_accuracy),
            ke = record.kinetic_energy.map(|k| format!("{k:.3}")),
            thermostat = record.thermostat.map(|t| format!("{t:.3e}")),
            samples = record.samples,
            test_ens_acc = record.test_ensemble.map(|m| format!("{:.4}", m.accuracy)),
            secs = format!("{:.1}", record.seconds),
            "epoch done"
        );
        let signal = signals::pending();
        let last = epoch + 1 == cfg.settings.epochs;
        if signal.is_some() || step.is_multiple_of(every) || last {
            let progress = Progress {
                epoch: epoch + 1,
                batch: 0,
                step,
                step_seconds,
                train_seconds: seconds_before + started.elapsed().as_secs_f64(),
                ..Progress::default()
            };
            save(&stepper, &test_acc, &valid_acc, &kinetic_trace, progress)?;
            if let (Some(signal), false) = (signal, last) {
                return Err(interrupted(signal, step, run_dir));
            }
        }
    }

    Ok(ChainOutcome {
        seed: cfg.settings.seed,
        num_params: model.num_params(),
        test: test_acc,
        valid: valid_acc,
        steps: step,
        step_seconds,
        train_seconds: seconds_before + started.elapsed().as_secs_f64(),
        kinetic_trace,
        backward,
    })
}

/// The run's summary from its chains (pooled when there are several; then also each
/// chain's figures and the convergence diagnostics), written to `summary.json`.
fn finish(cfg: &TrainConfig, ds: &Dataset, chains: Vec<ChainOutcome>) -> Result<Summary> {
    let run_dir = &cfg.run_dir;
    let num_params = chains.first().map_or(0, |c| c.num_params);
    let test = Accumulator::pooled(chains.iter().map(|c| &c.test))?;
    let valid = match chains.first().and_then(|c| c.valid.as_ref()) {
        Some(_) => Some(Accumulator::pooled(
            chains.iter().filter_map(|c| c.valid.as_ref()),
        )?),
        None => None,
    };
    let several = chains.len() > 1;
    let per_chain: Vec<ChainSummary> = if several {
        chains
            .iter()
            .enumerate()
            .map(|(k, c)| ChainSummary {
                chain: k,
                seed: c.seed,
                samples: c.test.samples(),
                ensemble: c.test.metrics(),
                last_sample: c.test.last_sample,
                valid_ensemble: c.valid.as_ref().and_then(|a| a.metrics()),
                steps_per_second: c.steps as f64 / c.step_seconds.max(1e-9),
            })
            .collect()
    } else {
        Vec::new()
    };
    let convergence = several.then(|| {
        // The test log-likelihood of each sample alone, and the kinetic energy at it.
        let loglik: Vec<Vec<f64>> = chains
            .iter()
            .map(|c| c.test.sample_nll().iter().map(|n| -n).collect())
            .collect();
        let kinetic: Vec<Vec<f64>> = chains.iter().map(|c| c.kinetic_trace.clone()).collect();
        ChainDiagnostics {
            test_log_likelihood: convergence::diagnose(&loglik),
            kinetic_energy: convergence::diagnose(&kinetic),
        }
    });
    if let Some(d) = &convergence {
        let show = |c: Option<Convergence>| {
            c.map_or("n/a (too few samples)".to_string(), |c| {
                format!("R-hat {:.3}, ESS {:.0}", c.rhat, c.ess)
            })
        };
        tracing::info!(
            "{} chains: test log-likelihood per sample: {}; kinetic energy: {}",
            chains.len(),
            show(d.test_log_likelihood),
            show(d.kinetic_energy)
        );
    }
    let steps: u64 = chains.iter().map(|c| c.steps).sum();
    let summary = Summary {
        dataset: ds.name.clone(),
        data_source: ds.source.clone(),
        standardized_inputs: ds.train.standardization.is_some(),
        settings: cfg.settings.clone(),
        model_label: cfg.settings.model.label(),
        num_params,
        isa: crate::kernels::isa::current().name().to_string(),
        backward_used: chains.first().map_or(cfg.settings.backward, |c| c.backward),
        samples: test.samples(),
        ensemble: test.metrics(),
        last_sample: test.last_sample,
        valid_ensemble: valid.as_ref().and_then(|a| a.metrics()),
        steps,
        train_seconds: chains.iter().map(|c| c.train_seconds).fold(0.0, f64::max),
        // Summed over chains: the aggregate throughput.
        steps_per_second: chains
            .iter()
            .map(|c| c.steps as f64 / c.step_seconds.max(1e-9))
            .sum(),
        chains: per_chain,
        convergence,
        run_dir: run_dir.display().to_string(),
    };
    let json = serde_json::to_string_pretty(&summary)
        .map_err(|e| Error::Checkpoint(format!("serialising summary: {e}")))?;
    crate::atomic::write_atomic(&run_dir.join("summary.json"), json.as_bytes())?;
    Ok(summary)
}

fn interrupted(signal: i32, step: u64, run_dir: &Path) -> Error {
    Error::Interrupted {
        signal,
        step,
        run_dir: run_dir.to_path_buf(),
    }
}

/// Before a resume: drops what the run wrote after its saved state (samples of later
/// updates, metrics lines of later epochs) and temporary files a kill left behind; they
/// are written again, identically.
fn discard_after(run_dir: &Path, metrics_path: &Path, at: &Progress) -> Result<()> {
    for (step, path) in checkpoint::list_samples_by_step(run_dir)? {
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

fn diverged(step: u64, epoch: usize, loss: f64, step_size: f64) -> Error {
    Error::Diverged {
        step,
        epoch: epoch + 1,
        loss,
        suggestion: step_size / 4.0,
    }
}

fn progress_bar(show: bool, len: u64, epoch: usize, epochs: usize) -> indicatif::ProgressBar {
    if !show {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(len);
    let style = indicatif::ProgressStyle::with_template(
        "epoch {prefix} [{bar:30}] {pos}/{len} {per_sec} {msg}",
    )
    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
    .progress_chars("=> ");
    bar.set_style(style);
    bar.set_prefix(format!("{}/{}", epoch + 1, epochs));
    bar
}

fn progress_message(nll: f64, acc: f64, diag: sampler::Diagnostics) -> String {
    let mut m = format!("nll {nll:.4} acc {acc:.4}");
    if let Some(ke) = diag.kinetic_energy {
        m.push_str(&format!(" ke/param {ke:.3}"));
    }
    if let Some(t) = diag.thermostat {
        m.push_str(&format!(" thermostat {t:.3e}"));
    }
    m
}
