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

use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};

use crate::atomic::write_atomic;
use crate::checkpoint::{decode_tensor, encode_safetensors, open_safetensors};
use crate::ensemble::{AccumulatorState, Sums};
use crate::error::{Error, Result};
use crate::hmc::DualAveraging;
use crate::regression::RegressionAccumulator;

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
        let vector = |v: &[f64]| Tensor::from_slice(v, v.len(), &Device::Cpu);
        let mut tensors = vec![("theta".to_string(), vector(&self.theta)?)];
        for (set, sums) in [("test", Some(&self.test.1)), ("valid", self.valid_sums())] {
            if let Some(sums) = sums {
                tensors.push((format!("ensemble/{set}"), vector(&sums.probability)?));
                tensors.push((format!("ensemble/{set}_entropy"), vector(&sums.entropy)?));
            }
        }
        let json = serde_json::to_string(&scalars)
            .map_err(|e| Error::Checkpoint(format!("serialising the HMC state: {e}")))?;
        let meta = BTreeMap::from([("state".to_string(), json)]);
        write_atomic(
            &hmc_state_path(run_dir),
            &encode_safetensors(&tensors, &meta)?,
        )
    }

    fn valid_sums(&self) -> Option<&Sums> {
        self.valid.as_ref().map(|v| &v.1)
    }

    /// Reads the state file of `run_dir`.
    pub fn load(run_dir: &Path) -> Result<Self> {
        let path = hmc_state_path(run_dir);
        let bytes = std::fs::read(&path).map_err(|e| {
            Error::Checkpoint(format!(
                "{}: cannot read the HMC state ({e}); was {} made by `bnn train --sampler hmc`?",
                path.display(),
                run_dir.display()
            ))
        })?;
        let corrupt =
            |e: String| Error::Checkpoint(format!("{}: corrupt HMC state: {e}", path.display()));
        let checked = open_safetensors(&bytes).map_err(corrupt)?;
        let json = checked
            .metadata
            .get("state")
            .ok_or_else(|| corrupt("no `state` metadata".into()))?;
        let s: Scalars = serde_json::from_str(json).map_err(|e| corrupt(e.to_string()))?;
        if s.version != VERSION {
            return Err(corrupt(format!(
                "format version {}, this bnn reads {VERSION}",
                s.version
            )));
        }
        let vector = |name: &str| -> Result<Vec<f64>> {
            let view = checked
                .tensors
                .tensor(name)
                .map_err(|_| corrupt(format!("no tensor `{name}`")))?;
            let t = decode_tensor(&view, &Device::Cpu)?
                .ok_or_else(|| corrupt(format!("tensor `{name}` is {:?}", view.dtype())))?;
            Ok(t.to_dtype(DType::F64)?.to_vec1::<f64>()?)
        };
        let sums = |set: &str| -> Result<Sums> {
            Ok(Sums {
                probability: vector(&format!("ensemble/{set}"))?,
                entropy: vector(&format!("ensemble/{set}_entropy"))?,
            })
        };
        let valid = match s.valid {
            Some(v) => Some((v, sums("valid")?)),
            None => None,
        };
        Ok(HmcState {
            iteration: s.iteration,
            theta: vector("theta")?,
            step_size: s.step_size,
            adapt: s.adapt,
            divergences: s.divergences,
            gradients: s.gradients,
            seconds: s.seconds,
            test: (s.test, sums("test")?),
            valid,
            regression: s.regression,
        })
    }
}
