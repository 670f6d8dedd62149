//! Stochastic gradient Nosé–Hoover thermostat with one scalar thermostat (Ding et al.
//! 2014, eqs. (5)–(6), Algorithm 1), in the reformulation u = p·h, η = h², α = ξ·h,
//! a = A·h that they use for networks (§5.2, App. F Algorithm 2):
//!
//! u ← u − α u − η ∇Ũ(θ) + √(2aη) N(0, I),
//! θ ← θ + u,
//! α ← α + uᵀu/n − η,
//!
//! with α₀ = a (ξ₀ = A in Algorithm 1). The last line is eq. (6) times h²: the thermostat
//! grows while the kinetic energy per parameter exceeds ½ and shrinks while it is below.

use candle_core::{Tensor, Var};

use super::{
    check_lengths, init_momentum, kinetic_energy, noise_like, Diagnostics, Sampler, SamplerConfig,
};
use crate::error::Result;

#[derive(Debug, Clone)]
pub struct Sgnht {
    pub config: SamplerConfig,
    pub seed: u64,
    pub step: u64,
    /// u = p·h, one tensor per parameter tensor.
    pub momentum: Vec<Tensor>,
    /// α = ξ·h, shared by all parameters.
    pub thermostat: f64,
    kinetic: f64,
}

impl Sgnht {
    /// Momenta start at u ~ N(0, η) (p ~ N(0, I)); the thermostat at α = a.
    pub fn init(config: SamplerConfig, params: &[Var], seed: u64) -> Result<Self> {
        let momentum = init_momentum(params, config.step_size, seed)?;
        let kinetic = kinetic_energy(&momentum, config.step_size)?;
        Ok(Sgnht {
            config,
            seed,
            step: 0,
            momentum,
            thermostat: config.diffusion,
            kinetic,
        })
    }
}

impl Sampler for Sgnht {
    fn config(&self) -> SamplerConfig {
        self.config
    }

    fn step(&mut self, params: &[Var], grads: &[Tensor]) -> Result<()> {
        check_lengths(params, grads)?;
        let eta = self.config.step_size;
        let alpha = self.thermostat;
        let sigma = (2.0 * self.config.diffusion * eta).sqrt();
        for (i, (p, g)) in params.iter().zip(grads).enumerate() {
            let g = &g.detach(); // keep autograd history out of the sampler state
            let z = noise_like(g, self.seed, self.step, i)?;
            let u = &self.momentum[i];
            let u = (((u * (1.0 - alpha))? - (g * eta)?)? + (z * sigma)?)?;
            p.set(&(p.as_detached_tensor() + &u)?)?;
            self.momentum[i] = u;
        }
        // uᵀu/n = 2η·K, with K the kinetic energy per parameter.
        self.kinetic = kinetic_energy(&self.momentum, eta)?;
        self.thermostat += 2.0 * eta * self.kinetic - eta;
        self.step += 1;
        Ok(())
    }

    fn diagnostics(&self) -> Diagnostics {
        Diagnostics {
            kinetic_energy: Some(self.kinetic),
            thermostat: Some(self.thermostat),
        }
    }

    fn steps(&self) -> u64 {
        self.step
    }

    fn set_step_size(&mut self, step_size: f64) -> Result<()> {
        super::rescale_momentum(&mut self.momentum, self.config.step_size, step_size)?;
        self.config.step_size = step_size;
        Ok(())
    }
}
