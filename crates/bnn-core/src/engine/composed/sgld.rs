//! Stochastic gradient Langevin dynamics (Welling & Teh 2011), the Euler discretisation of
//! dθ = −∇Ũ(θ) dt + N(0, 2 dt) (Ding et al. 2014, §2):
//!
//! θ ← θ − η ∇Ũ(θ) + N(0, 2η).

use candle_core::{Tensor, Var};

use crate::error::Result;
use crate::sampler::{
    noise_like, virial, Clock, Diagnostics, Sampler, SamplerParams, SamplerState, TensorwiseStep,
};

/// SGLD (Welling and Teh 2011).
#[derive(Debug, Clone)]
pub struct ComposedSgld {
    /// η.
    pub step_size: f64,
    /// Seed of the noise.
    pub seed: u64,
    /// Updates done.
    pub step: u64,
    /// Σθ·∇ per tensor of the last update.
    virials: Vec<f64>,
    /// Number of parameter tensors.
    tensors: usize,
}

impl ComposedSgld {
    /// Starts on `params` with the noise of `seed`.
    pub fn init(step_size: f64, params: &[Var], seed: u64) -> Self {
        ComposedSgld {
            step_size,
            seed,
            step: 0,
            virials: Vec::new(),
            tensors: params.len(),
        }
    }
}

impl TensorwiseStep for ComposedSgld {
    fn tensor_count(&self) -> usize {
        self.tensors
    }

    fn open_update(&mut self) -> Result<()> {
        self.virials.clear();
        self.virials.resize(self.tensor_count(), 0.0);
        Ok(())
    }

    fn step_tensor(&mut self, i: usize, p: &Var, g: &Tensor) -> Result<()> {
        let eta = self.step_size;
        let sigma = (2.0 * eta).sqrt();
        let g = &g.detach(); // keep autograd history out of the sampler state
        self.virials[i] = virial(p.as_tensor(), g)?;
        let z = noise_like(g, self.seed, self.step, i)?;
        let theta = ((p.as_detached_tensor() - (g * eta)?)? + (z * sigma)?)?;
        p.set(&theta)?;
        Ok(())
    }

    fn close_update(&mut self) -> Result<()> {
        self.step += 1;
        Ok(())
    }
}

impl Sampler for ComposedSgld {
    fn params(&self) -> SamplerParams {
        SamplerParams::Sgld {
            step_size: self.step_size,
        }
    }

    fn diagnostics(&self) -> Diagnostics {
        Diagnostics::default()
    }

    fn virials(&self) -> &[f64] {
        &self.virials
    }

    fn state(&self) -> Result<SamplerState> {
        Ok(SamplerState::Sgld(Clock {
            step: self.step,
            step_size: self.step_size,
        }))
    }

    fn restore(&mut self, state: &SamplerState) -> Result<()> {
        let SamplerState::Sgld(clock) = state else {
            return Err(state.refuse("SGLD"));
        };
        self.step = clock.step;
        self.step_size = clock.step_size;
        Ok(())
    }

    fn steps(&self) -> u64 {
        self.step
    }

    fn set_step_size(&mut self, step_size: f64) -> Result<()> {
        self.step_size = step_size;
        Ok(())
    }
}
