//! Stochastic gradient Nosé–Hoover thermostats: SGNHT with one scalar thermostat (Ding et
//! al. 2014, eqs. (5)–(6), Algorithm 1) and mSGNHT with one thermostat per parameter
//! element (mSGNHT; Gan et al. 2015, Li et al. 2016 §2.1, eq. (2): dξ = (p ⊙ p − 1) dt,
//! friction ξ ⊙ p), each with the Euler or the symmetric splitting integrator.
//!
//! Variables in the reformulation u = p·h, η = h², α = ξ·h, a = A·h of Ding et al. §5.2 /
//! App. F (Algorithm 2); n is the number of parameters and ⊙ the element-wise product.
//!
//! Euler (Ding et al. Alg. 2; Li et al. §2.2):
//!
//! u ← u − α u − η ∇Ũ(θ) + √(2aη) z,   θ ← θ + u,   α ← α + uᵀu/n − η
//! (mSGNHT: α ← α + u ⊙ u − η, element-wise, and α u element-wise).
//!
//! Symmetric splitting A–B–O–B–A (Li et al. §3), the gradient taken once per step at the
//! half-step position θ_{t+1/2}:
//!
//! A (h/2): θ ← θ + u/2,  α ← α + (u⊙u − η)/2;   B (h/2): u ← exp(−α/2) ⊙ u;
//! O (h):   u ← u − η ∇Ũ(θ_{t+1/2}) + √(2aη) z;   B (h/2);   A (h/2).
//!
//! The closing A of one step and the opening A of the next use the same u, so they are
//! applied together as one A (h) at the end of `step`; `init` applies the very first A
//! (h/2). Between steps the parameters therefore sit at half-step positions, where the
//! next gradient is evaluated and where samples are taken. The thermostat starts at α₀ = a.

use candle_core::{Tensor, Var};

use crate::error::Result;
use crate::sampler::{
    from_state, init_momentum, kinetic_energy, noise_like, to_state, virial, Clock, Diagnostics,
    Integrator, MsgnhtState, Sampler, SamplerParams, SamplerState, SgnhtState, TensorwiseStep,
};

/// α: one scalar for SGNHT, or one tensor per parameter tensor for mSGNHT.
#[derive(Debug, Clone)]
pub enum Thermostat {
    /// SGNHT's one ξ for all parameters.
    Scalar(f64),
    /// mSGNHT's ξᵢ per element, per parameter tensor.
    PerElement(Vec<Tensor>),
}

/// SGNHT (Ding et al. 2014) and mSGNHT (Li et al. 2016) with the composed update.
#[derive(Debug, Clone)]
pub struct ComposedSgnht {
    /// Its hyper-parameters: SGNHT's or mSGNHT's.
    pub params: SamplerParams,
    /// a.
    diffusion: f64,
    /// Seed of the noise.
    pub seed: u64,
    /// Updates done.
    pub step: u64,
    /// Σθ·∇ per tensor of the last update.
    virials: Vec<f64>,
    /// u = p·h, one tensor per parameter tensor.
    pub momentum: Vec<Tensor>,
    /// The thermostat(s).
    pub thermostat: Thermostat,
    kinetic: f64,
}

impl ComposedSgnht {
    /// Momenta start at u ~ N(0, η) (p ~ N(0, I)); the thermostat at α = a; with the
    /// splitting integrator the first A (h/2) half-step is applied here.
    pub fn init(sampler: SamplerParams, params: &[Var], seed: u64) -> Result<Self> {
        let (per_element, diffusion) = match sampler {
            SamplerParams::Sgnht { diffusion, .. } => (false, diffusion),
            SamplerParams::Msgnht { diffusion, .. } => (true, diffusion),
            SamplerParams::Sgld { .. }
            | SamplerParams::Sghmc { .. }
            | SamplerParams::Sgd { .. }
            | SamplerParams::Momentum { .. } => {
                return Err(crate::error::Error::Config(format!(
                    "{} has no thermostat",
                    sampler.kind().name()
                )))
            }
        };
        let eta = sampler.step_size();
        let momentum = init_momentum(params, eta, seed)?;
        let kinetic = kinetic_energy(&momentum, eta)?;
        let thermostat = if per_element {
            Thermostat::PerElement(
                momentum
                    .iter()
                    .map(|u| (u.ones_like()? * diffusion).map_err(Into::into))
                    .collect::<Result<Vec<_>>>()?,
            )
        } else {
            Thermostat::Scalar(diffusion)
        };
        let mut s = ComposedSgnht {
            params: sampler,
            diffusion,
            seed,
            step: 0,
            virials: Vec::new(),
            momentum,
            thermostat,
            kinetic,
        };
        if sampler.integrator() == Integrator::Splitting {
            for (i, p) in params.iter().enumerate() {
                s.drift_tensor(i, p, 0.5)?;
            }
            s.drift_scalar(0.5)?;
        }
        Ok(s)
    }

    /// A (fraction·h) of tensor i: θ ← θ + f·u and, per element, α ← α + f·(u⊙u − η).
    fn drift_tensor(&mut self, i: usize, p: &Var, fraction: f64) -> Result<()> {
        let u = &self.momentum[i];
        p.set(&(p.as_detached_tensor() + (u * fraction)?)?)?;
        if let Thermostat::PerElement(alphas) = &mut self.thermostat {
            let eta = self.params.step_size();
            alphas[i] = (&alphas[i] + ((u.sqr()? - eta)? * fraction)?)?;
        }
        Ok(())
    }

    /// The rest of A (fraction·h) once every tensor has drifted: the kinetic energy and
    /// the scalar thermostat α ← α + f·(uᵀu/n − η).
    fn drift_scalar(&mut self, fraction: f64) -> Result<()> {
        let eta = self.params.step_size();
        self.kinetic = kinetic_energy(&self.momentum, eta)?;
        if let Thermostat::Scalar(alpha) = &mut self.thermostat {
            // uᵀu/n = 2η·K, with K the kinetic energy per parameter.
            *alpha += fraction * (2.0 * eta * self.kinetic - eta);
        }
        Ok(())
    }

    /// B (h/2): u ← exp(−α/2) ⊙ u.
    fn friction_half(&self, i: usize, u: &Tensor) -> Result<Tensor> {
        Ok(match &self.thermostat {
            Thermostat::Scalar(alpha) => (u * (-alpha / 2.0).exp())?,
            Thermostat::PerElement(alphas) => (u * (&alphas[i] * -0.5)?.exp()?)?,
        })
    }

    /// The Euler friction term: (1 − α) ⊙ u.
    fn friction_euler(&self, i: usize, u: &Tensor) -> Result<Tensor> {
        Ok(match &self.thermostat {
            Thermostat::Scalar(alpha) => (u * (1.0 - alpha))?,
            Thermostat::PerElement(alphas) => (u - (u * &alphas[i])?)?,
        })
    }

    /// Mean thermostat value (for mSGNHT, over all elements).
    pub fn mean_thermostat(&self) -> Result<f64> {
        Ok(match &self.thermostat {
            Thermostat::Scalar(alpha) => *alpha,
            Thermostat::PerElement(alphas) => {
                let mut sum = 0f64;
                let mut n = 0usize;
                for a in alphas {
                    sum += a.sum_all()?.to_scalar::<f32>()? as f64;
                    n += a.elem_count();
                }
                sum / n as f64
            }
        })
    }
}

impl TensorwiseStep for ComposedSgnht {
    fn tensor_count(&self) -> usize {
        self.momentum.len()
    }

    fn open_update(&mut self) -> Result<()> {
        self.virials.clear();
        self.virials.resize(self.tensor_count(), 0.0);
        Ok(())
    }

    /// Euler: u ← (1 − α)u − η∇ + √(2aη)z; splitting: B (h/2), O (h), B (h/2). Then θ
    /// and the per-element α drift: Euler's θ ← θ + u, α ← α + (u⊙u − η), which is also
    /// splitting's merged A (h).
    fn step_tensor(&mut self, i: usize, p: &Var, g: &Tensor) -> Result<()> {
        let eta = self.params.step_size();
        let sigma = (2.0 * self.diffusion * eta).sqrt();
        let g = &g.detach(); // keep autograd history out of the sampler state
        self.virials[i] = virial(p.as_tensor(), g)?;
        let z = noise_like(g, self.seed, self.step, i)?;
        let u = &self.momentum[i];
        let u = if self.params.integrator() == Integrator::Splitting {
            let u = self.friction_half(i, u)?;
            let u = ((u - (g * eta)?)? + (z * sigma)?)?;
            self.friction_half(i, &u)?
        } else {
            ((self.friction_euler(i, u)? - (g * eta)?)? + (z * sigma)?)?
        };
        self.momentum[i] = u;
        self.drift_tensor(i, p, 1.0)
    }

    fn close_update(&mut self) -> Result<()> {
        self.drift_scalar(1.0)?;
        self.step += 1;
        Ok(())
    }
}

impl Sampler for ComposedSgnht {
    fn params(&self) -> SamplerParams {
        self.params
    }

    fn diagnostics(&self) -> Diagnostics {
        Diagnostics {
            kinetic_energy: Some(self.kinetic),
            thermostat: self.mean_thermostat().ok(),
        }
    }

    fn virials(&self) -> &[f64] {
        &self.virials
    }

    fn state(&self) -> Result<SamplerState> {
        let clock = Clock {
            step: self.step,
            step_size: self.params.step_size(),
        };
        let momentum = to_state(&self.momentum)?;
        Ok(match &self.thermostat {
            Thermostat::Scalar(alpha) => SamplerState::Sgnht(SgnhtState {
                clock,
                momentum,
                thermostat: *alpha,
                kinetic: self.kinetic,
            }),
            Thermostat::PerElement(alphas) => SamplerState::Msgnht(MsgnhtState {
                clock,
                momentum,
                thermostats: to_state(alphas)?,
                mean_thermostat: self.mean_thermostat()?,
                kinetic: self.kinetic,
            }),
        })
    }

    fn restore(&mut self, state: &SamplerState) -> Result<()> {
        let (clock, momentum, kinetic) = match (&mut self.thermostat, state) {
            (Thermostat::Scalar(alpha), SamplerState::Sgnht(s)) => {
                *alpha = s.thermostat;
                (s.clock, &s.momentum, s.kinetic)
            }
            (Thermostat::PerElement(alphas), SamplerState::Msgnht(s)) => {
                *alphas = from_state(&s.thermostats, alphas, "thermostat")?;
                (s.clock, &s.momentum, s.kinetic)
            }
            (Thermostat::Scalar(_), _) => return Err(state.refuse("SGNHT")),
            (Thermostat::PerElement(_), _) => return Err(state.refuse("mSGNHT")),
        };
        self.momentum = from_state(momentum, &self.momentum, "momentum")?;
        self.kinetic = kinetic;
        self.step = clock.step;
        self.params = self.params.with_step_size(clock.step_size);
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
