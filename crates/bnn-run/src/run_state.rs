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

use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};

use crate::atomic::write_atomic;
use crate::checkpoint::{encode_safetensors, StateFile};
use crate::ensemble::{AccumulatorState, Sums};
use crate::error::{Error, Result};
use crate::regression::RegressionAccumulator;
use crate::sampler::{SamplerState, StateScalars};
use crate::train::configurational::ConfigurationalSums;

/// Format version of the state file.
const VERSION: u32 = 2;

/// The state file of a run.
pub fn state_path(run_dir: &Path) -> PathBuf {
    run_dir.join("state").join("chain.safetensors")
}

/// Where the run stands and its running sums.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Position {
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

impl Position {
    /// An update of the epoch with step size `eta`: its η figures and its count.
    pub fn note_step_size(&mut self, eta: f64) {
        if self.updates == 0 {
            self.eta_first = eta;
        }
        self.eta_last = eta;
        self.eta_sum += eta;
        self.updates += 1;
    }
}

/// The JSON part of the file.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Scalars {
    version: u32,
    progress: Position,
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
    /// The configurational temperature's running sums.
    #[serde(default)]
    configurational: ConfigurationalSums,
    /// Halvings of the step by `--adapt-step-size` so far.
    #[serde(default)]
    step_halvings: u32,
}

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

/// Everything a run needs to continue.
#[derive(Debug, Clone)]
pub struct RunState {
    /// Where the run stands and the epoch's sums.
    pub progress: Position,
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
    /// The configurational temperature's running sums (`diagnostics.jsonl`).
    pub configurational: ConfigurationalSums,
    /// Times `--adapt-step-size` halved the step size in burn-in.
    pub step_halvings: u32,
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
            configurational: self.configurational.clone(),
            step_halvings: self.step_halvings,
        };
        let mut tensors: Vec<(String, Tensor)> = self
            .params
            .iter()
            .map(|(n, t)| (format!("param/{n}"), t.clone()))
            .collect();
        tensors.extend(self.sampler.tensors());
        tensors.extend(ensemble_tensors("test", &self.test.1)?);
        if let Some((_, v)) = &self.valid {
            tensors.extend(ensemble_tensors("valid", v)?);
        }
        let json = serde_json::to_string(&scalars)
            .map_err(|e| Error::Checkpoint(format!("serialising the run state: {e}")))?;
        let meta = BTreeMap::from([("state".to_string(), json)]);
        write_atomic(&state_path(run_dir), &encode_safetensors(&tensors, &meta)?)
    }

    /// Reads the state file of `run_dir`; `params` names the model's parameters in order.
    pub fn load(run_dir: &Path, params: &[String]) -> Result<Self> {
        let hint = format!(
            "was {} made by `bnn train` of this version?",
            run_dir.display()
        );
        let file: StateFile<Scalars> =
            StateFile::read(&state_path(run_dir), "run state", VERSION, &hint)?;
        let tensor = |name: &str| file.tensor(name);
        let params = params
            .iter()
            .map(|n| Ok((n.clone(), tensor(&format!("param/{n}"))?)))
            .collect::<Result<Vec<_>>>()?;
        let sampler = SamplerState::from_parts(&file.scalars.sampler, tensor)?;
        let test = ensemble_sums(&file, "test")?;
        let valid = match file.scalars.valid.is_some() {
            true => Some(ensemble_sums(&file, "valid")?),
            false => None,
        };
        let scalars = file.scalars;
        Ok(RunState {
            progress: scalars.progress,
            params,
            sampler,
            prior_precisions: scalars.prior_precisions,
            test: (scalars.test, test),
            valid: scalars.valid.zip(valid),
            kinetic_trace: scalars.kinetic_trace,
            rollbacks: scalars.rollbacks,
            regression: scalars.regression,
            noise_precision: scalars.noise_precision,
            configurational: scalars.configurational,
            step_halvings: scalars.step_halvings,
        })
    }
}

/// The tensors that hold the ensemble sums of `set` ("test", "valid") in a state file.
pub(crate) fn ensemble_tensors(set: &str, sums: &Sums) -> Result<[(String, Tensor); 2]> {
    let vector = |v: &[f64]| Tensor::from_slice(v, v.len(), &Device::Cpu);
    Ok([
        (format!("ensemble/{set}"), vector(&sums.probability)?),
        (format!("ensemble/{set}_entropy"), vector(&sums.entropy)?),
    ])
}

/// The ensemble sums of `set` read back from a state file ([`ensemble_tensors`]).
pub(crate) fn ensemble_sums<S>(file: &StateFile<S>, set: &str) -> Result<Sums> {
    Ok(Sums {
        probability: file.vector(&format!("ensemble/{set}"))?,
        entropy: file.vector(&format!("ensemble/{set}_entropy"))?,
    })
}
