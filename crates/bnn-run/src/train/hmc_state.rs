//! The state of an HMC chain between two iterations, saved so that `bnn train --resume`
//! continues it bit for bit: the position θ in f64, ε and the dual averaging's state,
//! the counts, and the streaming ensembles. The momenta and accept draws are not stored:
//! iteration i draws from its own seeded stream ([`crate::rng::hmc_iteration_seed`]).
//!
//! One file, `RUN/state/hmc.safetensors` (θ and the ensembles' sums as tensors, the rest
//! as JSON in the header's metadata), written atomically like the minibatch chains'
//! `chain.safetensors` ([`crate::run_state`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};

use crate::atomic::write_atomic;
use crate::checkpoint::{encode_safetensors, StateFile};
use crate::ensemble::{AccumulatorState, Sums};
use crate::error::{Error, Result};
use crate::hmc::DualAveraging;
use crate::regression::RegressionAccumulator;
use crate::run_state::{ensemble_sums, ensemble_tensors};

/// Format version of the file.
const VERSION: u32 = 1;

/// The state file of an HMC chain in `run_dir`.
pub fn hmc_state_path(run_dir: &Path) -> PathBuf {
    run_dir.join("state").join("hmc.safetensors")
}

/// The JSON part of the file.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Scalars {
    version: u32,
    iteration: usize,
    step_size: f64,
    adapt: DualAveraging,
    divergences: usize,
    gradients: u64,
    seconds: f64,
    test: AccumulatorState,
    valid: Option<AccumulatorState>,
    regression: Option<RegressionAccumulator>,
}

/// Everything an HMC chain needs to continue after `iteration` iterations.
#[derive(Debug, Clone)]
pub struct HmcState {
    /// Iterations done.
    pub iteration: usize,
    /// θ, flat in the model's order.
    pub theta: Vec<f64>,
    /// ε in use (adapting in burn-in, frozen after).
    pub step_size: f64,
    /// The dual averaging of log ε.
    pub adapt: DualAveraging,
    /// Divergent trajectories so far.
    pub divergences: usize,
    /// Gradient evaluations of the full-data potential so far.
    pub gradients: u64,
    /// Seconds of sampling so far.
    pub seconds: f64,
    /// The test ensemble's state and sums.
    pub test: (AccumulatorState, Sums),
    /// The validation ensemble's, with `--valid`.
    pub valid: Option<(AccumulatorState, Sums)>,
    /// A regression's test ensemble.
    pub regression: Option<RegressionAccumulator>,
}

impl HmcState {
    /// Writes the state file of `run_dir` atomically.
    pub fn save(&self, run_dir: &Path) -> Result<()> {
        let scalars = Scalars {
            version: VERSION,
            iteration: self.iteration,
            step_size: self.step_size,
            adapt: self.adapt.clone(),
            divergences: self.divergences,
            gradients: self.gradients,
            seconds: self.seconds,
            test: self.test.0.clone(),
            valid: self.valid.as_ref().map(|v| v.0.clone()),
            regression: self.regression.clone(),
        };
        let theta = Tensor::from_slice(&self.theta, self.theta.len(), &Device::Cpu)?;
        let mut tensors = vec![("theta".to_string(), theta)];
        tensors.extend(ensemble_tensors("test", &self.test.1)?);
        if let Some((_, v)) = &self.valid {
            tensors.extend(ensemble_tensors("valid", v)?);
        }
        let json = serde_json::to_string(&scalars)
            .map_err(|e| Error::Checkpoint(format!("serialising the HMC state: {e}")))?;
        let meta = BTreeMap::from([("state".to_string(), json)]);
        write_atomic(
            &hmc_state_path(run_dir),
            &encode_safetensors(&tensors, &meta)?,
        )
    }

    /// Reads the state file of `run_dir`.
    pub fn load(run_dir: &Path) -> Result<Self> {
        let hint = format!(
            "was {} made by `bnn train --sampler hmc`?",
            run_dir.display()
        );
        let file: StateFile<Scalars> =
            StateFile::read(&hmc_state_path(run_dir), "HMC state", VERSION, &hint)?;
        let theta = file.vector("theta")?;
        let test = ensemble_sums(&file, "test")?;
        let valid = match file.scalars.valid.is_some() {
            true => Some(ensemble_sums(&file, "valid")?),
            false => None,
        };
        let s = file.scalars;
        Ok(HmcState {
            iteration: s.iteration,
            theta,
            step_size: s.step_size,
            adapt: s.adapt,
            divergences: s.divergences,
            gradients: s.gradients,
            seconds: s.seconds,
            test: (s.test, test),
            valid: s.valid.zip(valid),
            regression: s.regression,
        })
    }
}
