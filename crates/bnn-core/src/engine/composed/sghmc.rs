//! Stochastic gradient Hamiltonian Monte Carlo with friction (Chen et al. 2014), in the
//! v-form of their eq. (15) (reproduction report, "The Core Algorithms"):
//!
//! v ← v − η ∇Ũ(θ) − α v + N(0, 2(α − β̂)η),
//! θ ← θ + v,
//!
//! with step size η, friction α and gradient-noise estimate β̂ (β̂ = 0 by default, the
//! usual choice). Without the noise term this is SGD with momentum 1 − α.
//!
//! SGHMC-S, the symmetric splitting integrator (Chen, Ding & Carin 2015; the scheme of Li
//! et al. 2016 §3 with a constant friction): B (h/2) u ← e^{−α/2} u, O (h)
//! u ← u − η∇Ũ + √(2(α − β̂)η) z, B (h/2), then A (h) θ ← θ + u. As for the thermostats,
//! `init` applies the first A (h/2), so gradients are taken at half-step positions.

use candle_core::{Tensor, Var};

use crate::error::Result;
use crate::sampler::{
    from_state, init_momentum, kinetic_energy, noise_like, to_state, virial, Clock, Diagnostics,
    Integrator, Sampler, SamplerParams, SamplerState, SghmcState, TensorwiseStep,
};

/// SGHMC (Chen et al. 2014) with the composed update.
#[derive(Debug, Clone)]
pub struct ComposedSghmc {
    /// Its hyper-parameters (SGHMC's).
    pub params: SamplerParams,
    /// α and β̂.
    friction: f64,
    noise_estimate: f64,
    /// Seed of the noise.
    pub seed: u64,
    /// Updates done.
    pub step: u64,
    /// Σθ·∇ per tensor of the last update.
    virials: Vec<f64>,
    /// v = p·h, one tensor per parameter tensor.
    pub momentum: Vec<Tensor>,
    kinetic: f64,
    /// β̂ estimated from each update's minibatch, and this update's noise scales.
    estimate_noise: bool,
    noise_scales: Vec<Option<f64>>,
}

impl ComposedSghmc {
    /// Momenta start at v ~ N(0, η).
    pub fn init(sampler: SamplerParams, params: &[Var], seed: u64) -> Result<Self> {
        let SamplerParams::Sghmc {
            step_size,
            friction,
            noise_estimate,
            integrator,
        } = sampler
        else {
            return Err(crate::error::Error::Config(format!(
                "{} is not sghmc",
                sampler.kind().name()
            )));
        };
        let momentum = init_momentum(params, step_size, seed)?;
        let kinetic = kinetic_energy(&momentum, step_size)?;
        if integrator == Integrator::Splitting {
            for (p, v) in params.iter().zip(&momentum) {
                p.set(&(p.as_detached_tensor() + (v * 0.5)?)?)?;
            }
        }
        Ok(ComposedSghmc {
            params: sampler,
            friction,
            noise_estimate,
            seed,
            step: 0,
            virials: Vec::new(),
            momentum,
            kinetic,
            estimate_noise: false,
            noise_scales: Vec::new(),
        })
    }
}

impl TensorwiseStep for ComposedSghmc {
    fn tensor_count(&self) -> usize {
        self.momentum.len()
    }

    fn open_update(&mut self) -> Result<()> {
        self.virials.clear();
        self.virials.resize(self.tensor_count(), 0.0);
        self.noise_scales.clear();
        self.noise_scales.resize(self.tensor_count(), None);
        Ok(())
    }

    fn wants_gradient_noise(&self) -> bool {
        self.estimate_noise
    }

    /// Tensor t's noise scale with β̂ estimated, as the fused update's.
    fn gradient_noise(&mut self, t: usize, trace: f64) -> Result<()> {
        let elements = self.momentum[t].elem_count();
        let (eta, alpha) = (self.params.step_size(), self.friction);
        let scale = crate::sampler::estimated_noise_scale(eta, alpha, trace, elements);
        self.noise_scales[t] = Some(scale);
        Ok(())
    }

    fn step_tensor(&mut self, i: usize, p: &Var, g: &Tensor) -> Result<()> {
        let (eta, alpha, beta) = (self.params.step_size(), self.friction, self.noise_estimate);
        let sigma = match (
            self.estimate_noise,
            self.noise_scales.get(i).copied().flatten(),
        ) {
            (false, _) => (2.0 * (alpha - beta) * eta).sqrt(),
            (true, Some(scale)) => scale,
            (true, None) => return Err(crate::sampler::noise_not_reported(i)),
        };
        let g = &g.detach(); // keep autograd history out of the sampler state
        self.virials[i] = virial(p.as_tensor(), g)?;
        let z = noise_like(g, self.seed, self.step, i)?;
        let v = &self.momentum[i];
        let v = if self.params.integrator() == Integrator::Splitting {
            let damp = (-alpha / 2.0).exp();
            ((((v * damp)? - (g * eta)?)? + (z * sigma)?)? * damp)?
        } else {
            (((v * (1.0 - alpha))? - (g * eta)?)? + (z * sigma)?)?
        };
        p.set(&(p.as_detached_tensor() + &v)?)?;
        self.momentum[i] = v;
        Ok(())
    }

    fn close_update(&mut self) -> Result<()> {
        self.kinetic = kinetic_energy(&self.momentum, self.params.step_size())?;
        self.step += 1;
        Ok(())
    }
}

impl Sampler for ComposedSghmc {
    fn params(&self) -> SamplerParams {
        self.params
    }

    fn diagnostics(&self) -> Diagnostics {
        Diagnostics {
            kinetic_energy: Some(self.kinetic),
            thermostat: None,
        }
    }

    fn virials(&self) -> &[f64] {
        &self.virials
    }

    fn estimate_gradient_noise(&mut self) -> Result<()> {
        crate::sampler::only_sghmc_estimates_noise(self.params.kind())?;
        self.estimate_noise = true;
        Ok(())
    }

    fn state(&self) -> Result<SamplerState> {
        Ok(SamplerState::Sghmc(SghmcState {
            clock: Clock {
                step: self.step,
                step_size: self.params.step_size(),
            },
            momentum: to_state(&self.momentum)?,
            kinetic: self.kinetic,
        }))
    }

    fn restore(&mut self, state: &SamplerState) -> Result<()> {
        let SamplerState::Sghmc(s) = state else {
            return Err(state.refuse("SGHMC"));
        };
        self.momentum = from_state(&s.momentum, &self.momentum, "momentum")?;
        self.kinetic = s.kinetic;
        self.step = s.clock.step;
        self.params = self.params.with_step_size(s.clock.step_size);
        Ok(())
    }

    fn steps(&self) -> u64 {
        self.step
    }

    fn set_step_size(&mut self, step_size: f64) -> Result<()> {
        crate::sampler::rescale_momentum(&mut self.momentum, self.params.step_size(), step_size)?;
        self.params = self.params.with_step_size(step_size);
        Ok(())
    }
}
