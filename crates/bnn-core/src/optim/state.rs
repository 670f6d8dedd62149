//! An optimizer's state between updates: θ, the sampler's state and the prior's
//! precisions. θ is in it because the splitting integrator moves θ by its first half-step
//! when an optimizer is built: a state without θ restores correctly only if θ is loaded
//! *after* building, an order nothing would tell a user.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor, Var};

use crate::error::{Error, Result};
use crate::potential::Prior;
use crate::sampler::{SamplerState, StateScalars};

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
        let params = vars
            .iter()
            .map(|v| Ok(v.as_tensor().flatten_all()?.to_device(&Device::Cpu)?))
            .collect::<Result<_>>()?;
        Ok(OptimizerState {
            params,
            sampler,
            prior_precisions: prior.precisions.clone(),
            prior_draws,
        })
    }

    /// Checks that the saved θ fits `vars`: as many, each of as many values.
    pub(super) fn check_params(&self, vars: &[Var]) -> Result<()> {
        if self.params.len() != vars.len() {
            return Err(Error::Checkpoint(format!(
                "the saved state has {} vars, the optimizer {}",
                self.params.len(),
                vars.len()
            )));
        }
        for (i, (saved, v)) in self.params.iter().zip(vars).enumerate() {
            if saved.elem_count() != v.elem_count() {
                return Err(Error::Checkpoint(format!(
                    "saved var {i} has {} values, the optimizer's {:?}",
                    saved.elem_count(),
                    v.dims()
                )));
            }
        }
        Ok(())
    }

    /// Sets `vars` to the saved θ (checked by [`OptimizerState::check_params`]).
    pub(super) fn set_params(&self, vars: &[Var]) -> Result<()> {
        for (saved, v) in self.params.iter().zip(vars) {
            v.set(&saved.reshape(v.shape())?.to_device(v.device())?)?;
        }
        Ok(())
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
        let bad = |m: String| Error::Checkpoint(format!("{}: {m}", path.display()));
        let map = candle_core::safetensors::load(path, &Device::Cpu)
            .map_err(|e| bad(format!("cannot read an optimizer state ({e})")))?;
        let get = |name: &str| -> Result<Tensor> {
            map.get(name)
                .cloned()
                .ok_or_else(|| bad(format!("no tensor `{name}`")))
        };
        let scalars = StateScalars::from_tensors(&get, &bad)?;
        let sampler = SamplerState::from_parts(&scalars, get)?;
        let count = map.keys().filter(|k| k.starts_with("param/")).count();
        let params = (0..count)
            .map(|i| get(&format!("param/{i}")))
            .collect::<Result<_>>()?;
        let prior_precisions = get("prior/precisions")?
            .to_dtype(DType::F64)?
            .to_vec1::<f64>()?;
        let draws = get("prior/draws")?.to_vec1::<i64>()?;
        let prior_draws = draws
            .first()
            .and_then(|&d| u64::try_from(d).ok())
            .ok_or_else(|| bad("`prior/draws` is not a count".into()))?;
        Ok(OptimizerState {
            params,
            sampler,
            prior_precisions,
            prior_draws,
        })
    }
}
