//! The state of a training run between two updates, saved so that `bnn train --resume`
//! continues bit for bit: the parameters, the sampler's state ([`SamplerState`]), the
//! Gibbs-sampled prior precisions, where the run is (epoch, batch, update), the epoch's
//! running sums and the streaming ensembles. The minibatch order is not stored: it is the
//! seeded shuffle stream, replayed epoch by epoch on resume.
//!
//! One file, `RUN/state/chain.safetensors`: the tensors, and the scalars as JSON in the
//! header's metadata (`state`), written through a temporary name, fsync and rename, then
//! an fsync of the folder, so that at any moment the file is either the previous complete
//! state or the new one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};

use crate::atomic::write_atomic;
use crate::checkpoint::{decode_tensor, encode_safetensors, open_safetensors};
use crate::ensemble::{AccumulatorState, Sums};
use crate::error::{Error, Result};
use crate::regression::RegressionAccumulator;
use crate::sampler::{SamplerState, StateScalars};

/// Format version of the state file.
const VERSION: u32 = 2;

/// The state file of a run.
pub fn state_path(run_dir: &Path) -> PathBuf {
    run_dir.join("state").join("chain.safetensors")
}

/// Where the run stands and its running sums.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    /// The epoch in progress (0-based); `batch` of its minibatches are done.
    pub epoch: usize,
    /// The next minibatch of the epoch.
    pub batch: usize,
    /// Updates done in all.
    pub step: u64,
    /// The epoch's running sums: Σ minibatch NLL·size, correct predictions, examples seen,
    /// Σ kinetic energy and its count.
    pub nll_sum: f64,
    /// Training examples classified right so far this epoch.
    pub correct: usize,
    /// A regression's Σ(f − y)² over the epoch's examples so far (standardised units).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub sq_error: f64,
    /// Training examples seen so far this epoch.
    pub seen: usize,
    /// Sum of the kinetic energies reported this epoch.
    pub ke_sum: f64,
    /// How many.
    pub ke_count: usize,
    /// Updates in the epoch so far, and the step sizes they used: first, last, sum.
    #[serde(default)]
    pub updates: usize,
    /// η at the epoch's first update.
    #[serde(default)]
    pub eta_first: f64,
    /// η at its last.
    #[serde(default)]
    pub eta_last: f64,
    /// Sum of η over its updates.
    #[serde(default)]
    pub eta_sum: f64,
    /// Seconds spent in updates and in all before this state (timings only).
    pub step_seconds: f64,
    /// Seconds of training so far.
    pub train_seconds: f64,
}

/// The JSON part of the file.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Scalars {
    version: u32,
    progress: Progress,
    sampler: StateScalars,
    prior_precisions: Vec<f64>,
    test: AccumulatorState,
    valid: Option<AccumulatorState>,
    #[serde(default)]
    kinetic_trace: Vec<f64>,
    /// Rollbacks after a divergence so far (absent: none).
    #[serde(default)]
    rollbacks: u32,
    /// A regression's test ensemble (absent: a classification).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    regression: Option<RegressionAccumulator>,
    /// A regression's noise precision τ.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    noise_precision: Option<f64>,
}

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

/// Everything a run needs to continue.
#[derive(Debug, Clone)]
pub struct RunState {
    /// Where the run stands and the epoch's sums.
    pub progress: Progress,
    /// The model's parameters by name, in the model's order.
    pub params: Vec<(String, Tensor)>,
    /// The sampler's state.
    pub sampler: SamplerState,
    /// λ per parameter tensor.
    pub prior_precisions: Vec<f64>,
    /// The test ensemble's state and sums; the validation ensemble's, if any.
    pub test: (AccumulatorState, Sums),
    /// The validation ensemble's state, with `--valid`.
    pub valid: Option<(AccumulatorState, Sums)>,
    /// The kinetic energy per parameter at each kept sample (for the chains' diagnostics).
    pub kinetic_trace: Vec<f64>,
    /// Times `--on-divergence rollback` came back to a saved state, each halving the
    /// step size the schedule starts from.
    pub rollbacks: u32,
    /// A regression's test ensemble.
    pub regression: Option<RegressionAccumulator>,
    /// A regression's noise precision τ.
    pub noise_precision: Option<f64>,
}

impl RunState {
    /// Writes the state file atomically (see the module doc).
    pub fn save(&self, run_dir: &Path) -> Result<()> {
        let scalars = Scalars {
            version: VERSION,
            progress: self.progress.clone(),
            sampler: self.sampler.scalars(),
            prior_precisions: self.prior_precisions.clone(),
            test: self.test.0.clone(),
            valid: self.valid.as_ref().map(|v| v.0.clone()),
            kinetic_trace: self.kinetic_trace.clone(),
            rollbacks: self.rollbacks,
            regression: self.regression.clone(),
            noise_precision: self.noise_precision,
        };
        let mut tensors: Vec<(String, Tensor)> = self
            .params
            .iter()
            .map(|(n, t)| (format!("param/{n}"), t.clone()))
            .collect();
        tensors.extend(self.sampler.tensors());
        let sums = |v: &[f64]| Tensor::from_slice(v, v.len(), &Device::Cpu);
        let (test_sums, valid) = (&self.test.1, &self.valid);
        tensors.push(("ensemble/test".into(), sums(&test_sums.probability)?));
        tensors.push(("ensemble/test_entropy".into(), sums(&test_sums.entropy)?));
        if let Some((_, v)) = valid {
            tensors.push(("ensemble/valid".into(), sums(&v.probability)?));
            tensors.push(("ensemble/valid_entropy".into(), sums(&v.entropy)?));
        }
        let json = serde_json::to_string(&scalars)
            .map_err(|e| Error::Checkpoint(format!("serialising the run state: {e}")))?;
        let meta = BTreeMap::from([("state".to_string(), json)]);
        write_atomic(&state_path(run_dir), &encode_safetensors(&tensors, &meta)?)
    }

    /// Reads the state file of `run_dir`; `params` names the model's parameters in order.
    pub fn load(run_dir: &Path, params: &[String]) -> Result<Self> {
        let path = state_path(run_dir);
        let bytes = std::fs::read(&path).map_err(|e| {
            Error::Checkpoint(format!(
                "{}: cannot read the run state ({e}); was {} made by `bnn train` of this version?",
                path.display(),
                run_dir.display()
            ))
        })?;
        let corrupt =
            |e: String| Error::Checkpoint(format!("{}: corrupt run state: {e}", path.display()));
        let checked = open_safetensors(&bytes).map_err(corrupt)?;
        let st = &checked.tensors;
        let json = checked
            .metadata
            .get("state")
            .ok_or_else(|| corrupt("no `state` metadata".into()))?;
        let scalars: Scalars = serde_json::from_str(json).map_err(|e| corrupt(e.to_string()))?;
        if scalars.version != VERSION {
            return Err(corrupt(format!(
                "format version {}, this bnn reads {VERSION}",
                scalars.version
            )));
        }
        let tensor = |name: &str| -> Result<Tensor> {
            let view = st
                .tensor(name)
                .map_err(|_| corrupt(format!("no tensor `{name}`")))?;
            decode_tensor(&view, &Device::Cpu)?
                .ok_or_else(|| corrupt(format!("tensor `{name}` is {:?}", view.dtype())))
        };
        let vector = |name: &str| -> Result<Vec<f64>> {
            Ok(tensor(name)?.to_dtype(DType::F64)?.to_vec1::<f64>()?)
        };
        let sums = |set: &str| -> Result<Sums> {
            Ok(Sums {
                probability: vector(&format!("ensemble/{set}"))?,
                entropy: vector(&format!("ensemble/{set}_entropy"))?,
            })
        };
        let params = params
            .iter()
            .map(|n| Ok((n.clone(), tensor(&format!("param/{n}"))?)))
            .collect::<Result<Vec<_>>>()?;
        let sampler = SamplerState::from_parts(&scalars.sampler, tensor)?;
        let valid = match scalars.valid {
            Some(v) => Some((v, sums("valid")?)),
            None => None,
        };
        Ok(RunState {
            progress: scalars.progress,
            params,
            sampler,
            prior_precisions: scalars.prior_precisions,
            test: (scalars.test, sums("test")?),
            valid,
            kinetic_trace: scalars.kinetic_trace,
            rollbacks: scalars.rollbacks,
            regression: scalars.regression,
            noise_precision: scalars.noise_precision,
        })
    }
}
