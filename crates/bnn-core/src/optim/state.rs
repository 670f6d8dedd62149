//! An optimizer's state between updates: θ, the sampler's state and the prior's
//! precisions. θ is in it because the splitting integrator moves θ by its first half-step
//! when an optimizer is built: a state without θ restores correctly only if θ is loaded
//! *after* building, an order nothing would tell a user.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor, Var};

use crate::error::{Error, Result};
use crate::potential::Prior;
use crate::sampler::state::SavedFile;
use crate::sampler::{from_state, to_state, SamplerState};

/// θ and everything else a sampling optimizer continues from, as plain host data.
#[derive(Debug, Clone)]
pub struct OptimizerState {
    /// θ per var, flat, in the optimizer's var order.
    pub params: Vec<Tensor>,
    /// Momenta, thermostats, step counter and η.
    pub sampler: SamplerState,
    /// λ per var (the Gibbs draws under a Gamma hyper-prior).
    pub prior_precisions: Vec<f64>,
    /// Gibbs draws done (keys the next draw's seed).
    pub prior_draws: u64,
}

impl OptimizerState {
    /// The state of an optimizer on `vars`.
    pub(super) fn of(
        vars: &[Var],
        sampler: SamplerState,
        prior: &Prior,
        prior_draws: u64,
    ) -> Result<Self> {
        let theta: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
        Ok(OptimizerState {
            params: to_state(&theta)?,
            sampler,
            prior_precisions: prior.precisions.clone(),
            prior_draws,
        })
    }

    /// The saved θ in the shapes and on the device of `vars`, checked against them.
    pub(super) fn params_for(&self, vars: &[Var]) -> Result<Vec<Tensor>> {
        let like: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
        from_state(&self.params, &like, "parameter")
    }

    /// The saved λ, one per var.
    pub(super) fn checked_precisions(&self, vars: usize) -> Result<Vec<f64>> {
        if self.prior_precisions.len() != vars {
            return Err(Error::Checkpoint(format!(
                "the saved state has {} prior precisions for {vars} vars",
                self.prior_precisions.len()
            )));
        }
        Ok(self.prior_precisions.clone())
    }

    /// Writes it to one safetensors file: θ as `param/i`, the sampler's tensors and
    /// scalars as [`SamplerState::save`] names them, λ as `prior/precisions`.
    pub fn save(&self, path: &Path) -> Result<()> {
        let mut map: HashMap<String, Tensor> = self.sampler.named_tensors()?;
        for (i, p) in self.params.iter().enumerate() {
            map.insert(format!("param/{i}"), p.clone());
        }
        let lambdas = Tensor::new(self.prior_precisions.as_slice(), &Device::Cpu)?;
        map.insert("prior/precisions".into(), lambdas);
        let draws = Tensor::new(&[self.prior_draws as i64], &Device::Cpu)?;
        map.insert("prior/draws".into(), draws);
        candle_core::safetensors::save(&map, path)?;
        Ok(())
    }

    /// Reads a state written by [`OptimizerState::save`].
    pub fn load(path: &Path) -> Result<Self> {
        let file = SavedFile::read(path, "an optimizer state")?;
        let params = (0..file.count("param"))
            .map(|i| file.get(&format!("param/{i}")))
            .collect::<Result<_>>()?;
        let prior_precisions = file
            .get("prior/precisions")?
            .to_dtype(DType::F64)?
            .to_vec1::<f64>()?;
        let draws = file.get("prior/draws")?.to_vec1::<i64>()?;
        let prior_draws = draws
            .first()
            .and_then(|&d| u64::try_from(d).ok())
            .ok_or_else(|| file.error("`prior/draws` is not a count".into()))?;
        Ok(OptimizerState {
            params,
            sampler: SamplerState::from_file(&file)?,
            prior_precisions,
            prior_draws,
        })
    }
}
