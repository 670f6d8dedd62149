//! A chain of full-batch HMC (`--sampler hmc`, [`crate::hmc`]): the network's potential
//! on the whole training set ([`FullBatch`]: the exact gradient, summed over chunks of
//! the data), `--epochs` iterations of which the first `--burnin` adapt ε (then frozen)
//! and keep no sample, a sample every `--thin` iterations after, into the same sink,
//! ensembles and summary as every sampler's. Each iteration's acceptance, ε, L, ΔH and
//! energy is a line of `metrics.jsonl`; a divergence is counted there, not fatal.
//!
//! The prior must be fixed (`--prior gaussian`): the Gamma hyper-prior's Gibbs step would
//! make it Gibbs-within-HMC, which this reference does not do.

use std::path::Path;
use std::time::Instant;

use candle_core::Tensor;
use serde::{Deserialize, Serialize};

use super::chain::{append_line, model_and_potential, to_json, write_sample, Kept};
use super::sink::RunFolder;
use super::{manifest, ChainOutcome, TrainConfig};
use crate::checkpoint;
use crate::data::{Dataset, Split};
use crate::error::{Error, Result};
use crate::hmc::{DualAveraging, Energy, Hmc};
use crate::model::Network;
use crate::potential::{Backward, Potential, PriorSpec};
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
    fn energy_grad(&mut self, theta: &[f32], grad: &mut [f64]) -> Result<f64> {
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
                u += 0.5 * lambda * (t as f64) * (t as f64);
                *g += lambda * t as f64;
            }
            at += n;
        }
        let inv_t = 1.0 / self.potential.temperature;
        grad.iter_mut().for_each(|g| *g *= inv_t);
        Ok(u * inv_t)
    }
}

/// The model's parameters, flat, in the model's order.
fn flat(model: &Network) -> Result<Vec<f32>> {
    let mut out = Vec::with_capacity(model.num_params());
    for p in &model.params {
        out.extend(p.var.as_tensor().flatten_all()?.to_vec1::<f32>()?);
    }
    Ok(out)
}

/// Sets the model's parameters from `theta` (flat, in the model's order).
fn load_flat(model: &Network, theta: &[f32]) -> Result<()> {
    let mut at = 0;
    for p in &model.params {
        let n = p.var.elem_count();
        let t = Tensor::from_slice(&theta[at..at + n], p.var.shape(), p.var.device())?;
        p.var.set(&t)?;
        at += n;
    }
    Ok(())
}

/// One HMC chain of `cfg` on `ds` in `run_dir`, as [`super::chain::run_chain`] runs a
/// minibatch chain (same files, same outcome); `write_manifest` for a single-chain run.
pub(super) fn run_hmc_chain(
    cfg: &TrainConfig,
    ds: &Dataset,
    run_dir: &Path,
    write_manifest: bool,
) -> Result<ChainOutcome> {
    let s = &cfg.settings;
    if cfg.resume {
        return Err(Error::Config(
            "an HMC run cannot be resumed (its chain keeps no state file); start it again".into(),
        ));
    }
    if !matches!(s.prior, PriorSpec::Gaussian { .. }) || !cfg.device.is_cpu() {
        return Err(Error::Config(
            "--sampler hmc needs a fixed prior (--prior gaussian; no Gibbs step inside HMC) and the CPU".into(),
        ));
    }
    let started = Instant::now();
    std::fs::create_dir_all(checkpoint::samples_dir(run_dir)).map_err(|e| Error::io(run_dir, e))?;
    let (model, potential) = model_and_potential(cfg, ds)?;
    if write_manifest {
        manifest(cfg, ds, model.num_params()).write(run_dir)?;
    }
    let opts = s.hmc.unwrap_or_default();
    let mut hmc = Hmc::new(
        s.sampler.step_size,
        opts.trajectory_length,
        s.seed ^ crate::rng::HMC_STREAM,
    )?;
    let mut adapt = DualAveraging::new(s.sampler.step_size, opts.target_accept);
    let mut energy = FullBatch::new(&model, &ds.train, &potential)?;
    let mut theta = flat(&model)?;
    let mut sink = RunFolder::new(run_dir);
    let mut kept = Kept::new(ds)?;
    let (burnin, thin) = (s.schedule.burnin, s.schedule.thin.max(1));
    let (mut divergences, mut gradients) = (0usize, 0u64);
    let metrics = run_dir.join("metrics.jsonl");
    for it in 0..s.epochs {
        let t = hmc.step(&mut theta, &mut energy)?;
        gradients += t.steps as u64 + 1;
        divergences += usize::from(t.divergent);
        if it < burnin {
            hmc.step_size = adapt.update(t.accept_prob);
            if it + 1 == burnin {
                hmc.step_size = adapt.final_step_size();
            }
        } else if (it + 1 - burnin).is_multiple_of(thin) {
            load_flat(&model, &theta)?;
            let tau = potential.noise_precision;
            let sample = write_sample(
                cfg,
                ds,
                &mut sink,
                &model,
                it as u64 + 1,
                it,
                t.step_size,
                Diagnostics::default(),
                tau,
            )?;
            kept.add(sample)?;
        }
        let record = HmcRecord {
            iteration: it + 1,
            accepted: t.accepted,
            accept_prob: t.accept_prob,
            step_size: t.step_size,
            steps: t.steps,
            delta_h: t.delta_h,
            energy: t.energy,
            divergent: t.divergent,
            divergences,
            samples: kept.samples(),
        };
        append_line(&metrics, &to_json(&record)?)?;
    }
    if divergences > 0 {
        tracing::warn!(divergences, "HMC: divergent trajectories (rejected); a smaller --step-size or --target-accept closer to 1 helps");
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(ChainOutcome {
        seed: s.seed,
        num_params: model.num_params(),
        test: kept.test,
        valid: kept.valid,
        regression: kept.regression,
        steps: gradients,
        step_seconds: seconds,
        train_seconds: seconds,
        kinetic_trace: Vec::new(),
        backward: Backward::Custom,
        rollbacks: 0,
    })
}
