//! A chain of full-batch HMC (`--sampler hmc`, [`crate::hmc`]): the network's potential
//! on the whole training set ([`FullBatch`]: the exact gradient, summed over chunks of
//! the data), `--epochs` iterations of which the first `--burnin` adapt ε (then frozen)
//! and keep no sample, a sample every `--thin` iterations after, into the same sink,
//! ensembles and summary as every sampler's. Each iteration's acceptance, ε, L, ΔH and
//! energy is a line of `metrics.jsonl`; a divergence is counted there, not fatal. The
//! chain's state is saved every few seconds and at a signal ([`super::hmc_state`]), and
//! `--resume` continues it bit for bit.
//!
//! The prior must be fixed (`--prior gaussian`), and so must a regression's noise
//! (`--noise-std`): the Gibbs steps of the Gamma hyper-priors would make it
//! Gibbs-within-HMC, which this reference does not do.

use std::path::Path;
use std::time::Instant;

use candle_core::Tensor;
use serde::{Deserialize, Serialize};

use super::chain::{model_and_potential, write_sample, Kept};
use super::hmc_state::{hmc_state_path, HmcState};
use super::sink::{ChainSink, RunFolder};
use super::{manifest, ChainOutcome, TrainConfig};
use crate::checkpoint;
use crate::data::{Dataset, Split};
use crate::driver;
use crate::error::{Error, Result};
use crate::hmc::{DualAveraging, Energy, Hmc, Transition};
use crate::likelihood::Noise;
use crate::model::Network;
use crate::potential::{Backward, Potential, PriorSpec};
use crate::run_state::Position;
use crate::sampler::Diagnostics;

/// Rows per chunk of the full-batch gradient (bounds the activations' memory).
const CHUNK: usize = 1000;

/// One iteration's line of `metrics.jsonl`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HmcRecord {
    /// The iteration (from 1).
    pub iteration: usize,
    /// Whether it was accepted.
    pub accepted: bool,
    /// min(1, e^{−ΔH}).
    pub accept_prob: f64,
    /// ε.
    pub step_size: f64,
    /// Leapfrog steps L.
    pub steps: usize,
    /// H(end) − H(start).
    pub delta_h: f64,
    /// U at the chain's position after it.
    pub energy: f64,
    /// ΔH above 1000 or not finite (rejected).
    pub divergent: bool,
    /// Divergences so far.
    pub divergences: usize,
    /// Samples kept so far.
    pub samples: usize,
}

/// The tempered potential of `model` on the whole of `split`: U(θ)/T with
/// U = −Σᵢ log p(yᵢ|xᵢ,θ) + Σ_t λ_t|θ_t|²/2, and its exact gradient.
pub struct FullBatch<'a> {
    model: &'a Network,
    split: &'a Split,
    potential: &'a Potential,
    backprop: crate::backprop::Backprop,
    x: Vec<f32>,
    y: Vec<u32>,
    v: Vec<f32>,
}

impl<'a> FullBatch<'a> {
    /// The potential of `model` on `split` (CPU: the hand-written pass).
    pub fn new(model: &'a Network, split: &'a Split, potential: &'a Potential) -> Result<Self> {
        Ok(FullBatch {
            backprop: crate::backprop::Backprop::new(model, CHUNK.min(split.len()))?,
            model,
            split,
            potential,
            x: Vec::new(),
            y: Vec::new(),
            v: Vec::new(),
        })
    }
}

impl Energy for FullBatch<'_> {
    fn energy_grad(&mut self, theta: &[f64], grad: &mut [f64]) -> Result<f64> {
        load_flat(self.model, theta)?;
        grad.iter_mut().for_each(|g| *g = 0.0);
        let no_prior = vec![0.0; self.model.params.len()];
        let mut u = 0.0;
        let rows: Vec<usize> = (0..self.split.len()).collect();
        for chunk in rows.chunks(CHUNK) {
            self.split.gather(chunk, &mut self.x, &mut self.y);
            if !self.potential.likelihood.is_categorical() {
                self.split.gather_values(chunk, &mut self.v);
            }
            let targets = self.potential.targets(&self.y, &self.v);
            let bp = &mut self.backprop;
            let loss =
                bp.targets_then(self.model, &self.x, targets, 1.0, (&no_prior, 0.0), None)?;
            u += loss.nll * chunk.len() as f64;
            let mut at = 0;
            for g in bp.grads() {
                let g = g.flatten_all()?.to_vec1::<f32>()?;
                grad[at..at + g.len()]
                    .iter_mut()
                    .zip(&g)
                    .for_each(|(a, &b)| *a += b as f64);
                at += g.len();
            }
        }
        let mut at = 0;
        for (p, &lambda) in self
            .model
            .params
            .iter()
            .zip(&self.potential.prior.precisions)
        {
            let n = p.var.elem_count();
            for (g, &t) in grad[at..at + n].iter_mut().zip(&theta[at..at + n]) {
                u += 0.5 * lambda * t * t;
                *g += lambda * t;
            }
            at += n;
        }
        let inv_t = self.potential.inverse_temperature();
        grad.iter_mut().for_each(|g| *g *= inv_t);
        Ok(u * inv_t)
    }
}

/// The model's parameters, flat, in the model's order.
fn flat(model: &Network) -> Result<Vec<f64>> {
    let mut out = Vec::with_capacity(model.num_params());
    for p in &model.params {
        let v = p.var.as_tensor().flatten_all()?.to_vec1::<f32>()?;
        out.extend(v.into_iter().map(f64::from));
    }
    Ok(out)
}

/// Sets the model's parameters from `theta` (flat, in the model's order), rounded to the
/// network's f32.
fn load_flat(model: &Network, theta: &[f64]) -> Result<()> {
    let mut at = 0;
    for p in &model.params {
        let n = p.var.elem_count();
        let v: Vec<f32> = theta[at..at + n].iter().map(|&t| t as f32).collect();
        let t = Tensor::from_vec(v, p.var.shape(), p.var.device())?;
        p.var.set(&t)?;
        at += n;
    }
    Ok(())
}

/// Where an HMC chain stands: θ, the sampler and its adaptation, what it kept.
struct HmcChain {
    hmc: Hmc,
    adapt: DualAveraging,
    theta: Vec<f64>,
    kept: Kept,
    iteration: usize,
    divergences: usize,
    gradients: u64,
    /// Seconds of sampling before this process took the chain over.
    seconds_before: f64,
}

impl HmcChain {
    /// A new chain of `cfg` at `model`'s initial θ.
    fn new(cfg: &TrainConfig, ds: &Dataset, model: &Network) -> Result<Self> {
        let s = &cfg.settings;
        let opts = s.hmc.clone().unwrap_or_default();
        Ok(HmcChain {
            hmc: Hmc::new(s.sampler.step_size, opts.trajectory_length, s.seed)?,
            adapt: DualAveraging::new(s.sampler.step_size, opts.target_accept),
            theta: flat(model)?,
            kept: Kept::new(ds)?,
            iteration: 0,
            divergences: 0,
            gradients: 0,
            seconds_before: 0.0,
        })
    }

    /// The chain as `run_dir`'s saved state left it; what was written after that state
    /// (samples, metrics lines) is dropped, to be written again identically.
    fn restore(&mut self, cfg: &TrainConfig, ds: &Dataset, run_dir: &Path) -> Result<()> {
        let state = HmcState::load(run_dir)?;
        if state.iteration > cfg.settings.epochs || state.theta.len() != self.theta.len() {
            return Err(Error::Config(format!(
                "the saved HMC state ({} iterations, {} parameters) does not fit --epochs {} and this model ({} parameters)",
                state.iteration,
                state.theta.len(),
                cfg.settings.epochs,
                self.theta.len()
            )));
        }
        self.kept
            .restore(ds, state.test, state.valid, state.regression)?;
        (self.theta, self.iteration) = (state.theta, state.iteration);
        (self.hmc.step_size, self.adapt) = (state.step_size, state.adapt);
        (self.divergences, self.gradients) = (state.divergences, state.gradients);
        self.seconds_before = state.seconds;
        let at = Position {
            epoch: self.iteration,
            step: self.iteration as u64,
            ..Position::default()
        };
        RunFolder::new(run_dir).discard_after(&at)?;
        tracing::info!(iteration = self.iteration, "resuming HMC");
        Ok(())
    }

    /// Saves the chain's state in `run_dir`.
    fn save(&self, run_dir: &Path, seconds: f64) -> Result<()> {
        let (test, valid, regression) = self.kept.saved()?;
        HmcState {
            iteration: self.iteration,
            theta: self.theta.clone(),
            step_size: self.hmc.step_size,
            adapt: self.adapt.clone(),
            divergences: self.divergences,
            gradients: self.gradients,
            seconds,
            test,
            valid,
            regression,
        }
        .save(run_dir)
    }
}

/// θ of chain k of K from `--init-from`'s run: its sample ⌈(k+1)·n/K⌉ of n (its chains'
/// pooled in order, so that K chains from a run of K take each chain's last sample),
/// loaded into `model` with every name and shape checked.
fn start_from(from: &Path, model: &Network, (k, of): (usize, usize)) -> Result<Vec<f64>> {
    let paths = checkpoint::run_sample_paths(from)?;
    let at = ((k + 1) * paths.len())
        .div_ceil(of.max(1))
        .clamp(1, paths.len())
        - 1;
    let refuse = |e: Error| Error::Config(format!("--init-from {}: {e}", paths[at].display()));
    let sample = checkpoint::load_sample(&paths[at], &candle_core::Device::Cpu).map_err(refuse)?;
    model.load(&sample.tensors).map_err(refuse)?;
    tracing::info!(sample = %paths[at].display(), "HMC chain {k} starts at");
    flat(model)
}

/// The most seconds between two saves of an HMC chain's state, which is saved every
/// `--checkpoint-every` iterations, at the last and at a signal besides: an iteration of
/// a large data set takes seconds, and 2,000 of them would be too long to lose.
const SAVE_EVERY_SECONDS: f64 = 10.0;

/// One iteration of `chain`: a trajectory, then the step size adapted in burn-in or the
/// sample kept after it (every `--thin` iterations).
fn iterate(
    cfg: &TrainConfig,
    ds: &Dataset,
    chain: &mut HmcChain,
    (model, potential): (&Network, &Potential),
    energy: &mut FullBatch<'_>,
    sink: &mut RunFolder,
) -> Result<Transition> {
    let s = &cfg.settings;
    let (burnin, thin) = (s.schedule.burnin, s.schedule.thin.max(1));
    let it = chain.iteration;
    let t = chain.hmc.step(it as u64, &mut chain.theta, energy)?;
    chain.gradients += t.steps as u64 + 1;
    chain.divergences += usize::from(t.divergent);
    chain.iteration += 1;
    if it < burnin {
        chain.hmc.step_size = chain.adapt.update(t.accept_prob);
        if it + 1 == burnin {
            chain.hmc.step_size = chain.adapt.final_step_size();
        }
    } else if (it + 1 - burnin).is_multiple_of(thin) {
        load_flat(model, &chain.theta)?;
        let tau = potential.noise_precision;
        let (step, eps) = (it as u64 + 1, t.step_size);
        let d = Diagnostics::default();
        let sample = write_sample(cfg, ds, sink, model, step, it, eps, d, tau, None)?;
        chain.kept.add(sample)?;
    }
    Ok(t)
}

/// One HMC chain of `cfg` on `ds` in `run_dir`, as [`super::chain::run_chain`] runs a
/// minibatch chain (same files, same outcome, `--resume` from its saved state);
/// `write_manifest` for a single-chain run; `k`: the chain's index and the run's number of
/// chains.
pub(super) fn run_hmc_chain(
    cfg: &TrainConfig,
    ds: &Dataset,
    run_dir: &Path,
    write_manifest: bool,
    k: (usize, usize),
) -> Result<ChainOutcome> {
    let s = &cfg.settings;
    let sampled_noise = matches!(s.likelihood.noise(), Some(Noise::Gamma { .. }));
    if !matches!(s.prior, PriorSpec::Gaussian { .. }) || sampled_noise || !cfg.device.is_cpu() {
        return Err(Error::Config(
            "--sampler hmc needs a fixed prior (--prior gaussian), a regression's fixed noise (--noise-std; no Gibbs step inside HMC) and the CPU".into(),
        ));
    }
    std::fs::create_dir_all(checkpoint::samples_dir(run_dir)).map_err(|e| Error::io(run_dir, e))?;
    let (model, potential) = model_and_potential(cfg, ds)?;
    let mut chain = HmcChain::new(cfg, ds, &model)?;
    let started = Instant::now();
    if cfg.resume && (write_manifest || hmc_state_path(run_dir).exists()) {
        chain.restore(cfg, ds, run_dir)?;
    } else {
        if let Some(from) = s.hmc.as_ref().and_then(|o| o.init_from.as_deref()) {
            chain.theta = start_from(from, &model, k)?;
        }
        chain.save(run_dir, 0.0)?;
    }
    if write_manifest {
        manifest(cfg, ds, model.num_params()).write(run_dir)?;
    }
    let mut walk = Iterations {
        cfg,
        ds,
        chain,
        net: (&model, &potential),
        energy: FullBatch::new(&model, &ds.train, &potential)?,
        sink: RunFolder::new(run_dir),
        started,
    };
    let mut checkpoints =
        driver::Checkpoints::every(s.checkpoint_every as u64).or_every_seconds(SAVE_EVERY_SECONDS);
    driver::drive(&mut walk, &mut checkpoints)?;
    let seconds = walk.seconds();
    let chain = walk.chain;
    if chain.divergences > 0 {
        tracing::warn!(divergences = chain.divergences, "HMC: divergent trajectories (rejected); a smaller --step-size or --target-accept closer to 1 helps");
    }
    Ok(ChainOutcome {
        seed: s.seed,
        num_params: model.num_params(),
        test: chain.kept.test,
        valid: chain.kept.valid,
        steps: chain.gradients,
        step_seconds: seconds,
        train_seconds: seconds,
        kinetic_trace: Vec::new(),
        backward: Backward::Custom,
        executor: None,
        rollbacks: 0,
    })
}

/// An HMC chain's iterations, as the driver runs them: one iteration a unit, its line
/// of `metrics.jsonl` written after it.
struct Iterations<'a> {
    cfg: &'a TrainConfig,
    ds: &'a Dataset,
    chain: HmcChain,
    net: (&'a Network, &'a Potential),
    energy: FullBatch<'a>,
    sink: RunFolder,
    /// When this process took the chain over.
    started: Instant,
}

impl Iterations<'_> {
    /// Seconds of sampling, over this process and the earlier ones.
    fn seconds(&self) -> f64 {
        self.chain.seconds_before + self.started.elapsed().as_secs_f64()
    }
}

impl driver::Transition for Iterations<'_> {
    fn done(&self) -> u64 {
        self.chain.iteration as u64
    }

    fn total(&self) -> u64 {
        self.cfg.settings.epochs as u64
    }

    fn advance(&mut self) -> Result<bool> {
        let (cfg, ds, net) = (self.cfg, self.ds, self.net);
        let chain = &mut self.chain;
        let t = iterate(cfg, ds, chain, net, &mut self.energy, &mut self.sink)?;
        self.sink.iteration(&record(&t, chain))?;
        Ok(true)
    }

    fn save(&mut self) -> Result<()> {
        self.chain.save(self.sink.location(), self.seconds())
    }

    fn folder(&self) -> Option<&Path> {
        Some(self.sink.location())
    }
}

/// The metrics line of the iteration that did `t` and left `chain` as it is.
fn record(t: &Transition, chain: &HmcChain) -> HmcRecord {
    HmcRecord {
        iteration: chain.iteration,
        accepted: t.accepted,
        accept_prob: t.accept_prob,
        step_size: t.step_size,
        steps: t.steps,
        delta_h: t.delta_h,
        energy: t.energy,
        divergent: t.divergent,
        divergences: chain.divergences,
        samples: chain.kept.samples(),
    }
}
