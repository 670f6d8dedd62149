//! MAP baselines: SGD, θ ← θ − η∇Ũ(θ), and SGD with momentum in the same v-form as SGHMC
//! without noise (Chen et al. 2014, §3.3): v ← (1 − α) v − η∇Ũ(θ), θ ← θ + v.

use candle_core::{Tensor, Var};

use crate::error::Result;
use crate::sampler::{
    from_state, to_state, Clock, Diagnostics, SamplerParams, SamplerState, SghmcState,
    TensorwiseStep,
};

/// SGD and SGD with momentum: the MAP baselines.
#[derive(Debug, Clone)]
pub struct ComposedSgd {
    /// Its hyper-parameters: SGD's or momentum's.
    pub params: SamplerParams,
    /// Updates done.
    pub step: u64,
    /// Present for `momentum`, starting at zero.
    pub momentum: Option<Vec<Tensor>>,
    /// Number of parameter tensors.
    tensors: usize,
}

impl ComposedSgd {
    /// SGD with η = `step_size`, or momentum with α = `friction`, on `params` (momentum
    /// zero).
    pub fn init(step_size: f64, friction: Option<f64>, params: &[Var]) -> Result<Self> {
        let sampler = match friction {
            Some(friction) => SamplerParams::Momentum {
                step_size,
                friction,
            },
            None => SamplerParams::Sgd { step_size },
        };
        let momentum = if friction.is_some() {
            Some(
                params
                    .iter()
                    .map(|p| p.as_detached_tensor().zeros_like())
                    .collect::<candle_core::Result<Vec<_>>>()?,
            )
        } else {
            None
        };
        Ok(ComposedSgd {
            params: sampler,
            step: 0,
            momentum,
            tensors: params.len(),
        })
    }
}

impl TensorwiseStep for ComposedSgd {
    fn tensor_count(&self) -> usize {
        self.tensors
    }

    fn open_update(&mut self) -> Result<()> {
        Ok(())
    }

    fn step_tensor(&mut self, i: usize, p: &Var, g: &Tensor) -> Result<()> {
        let eta = self.params.step_size();
        let g = &g.detach(); // keep autograd history out of the sampler state
        let delta = match &mut self.momentum {
            Some(m) => {
                // α, from the one place it is kept: momentum's parameters.
                let friction = self.params.map_baseline().and_then(|(_, f)| f);
                m[i] = ((&m[i] * (1.0 - friction.unwrap_or(0.0)))? - (g * eta)?)?;
                m[i].clone()
            }
            None => (g * -eta)?,
        };
        p.set(&(p.as_detached_tensor() + delta)?)?;
        Ok(())
    }

    fn close_update(&mut self) -> Result<()> {
        self.step += 1;
        Ok(())
    }
}

impl crate::sampler::Sampler for ComposedSgd {
    fn params(&self) -> SamplerParams {
        self.params
    }

    fn diagnostics(&self) -> Diagnostics {
        Diagnostics::default()
    }

    fn state(&self) -> Result<SamplerState> {
        let clock = Clock {
            step: self.step,
            step_size: self.params.step_size(),
        };
        Ok(match &self.momentum {
            None => SamplerState::Sgld(clock),
            Some(m) => SamplerState::Sghmc(SghmcState {
                clock,
                momentum: to_state(m)?,
                kinetic: 0.0,
            }),
        })
    }

    fn restore(&mut self, state: &SamplerState) -> Result<()> {
        let clock = match (&mut self.momentum, state) {
            (None, SamplerState::Sgld(clock)) => *clock,
            (Some(m), SamplerState::Sghmc(s)) => {
                *m = from_state(&s.momentum, m, "momentum")?;
                s.clock
            }
            (None, _) => return Err(state.refuse("SGD")),
            (Some(_), _) => return Err(state.refuse("momentum")),
        };
        self.step = clock.step;
        self.params = self.params.with_step_size(clock.step_size);
        Ok(())
    }

    fn steps(&self) -> u64 {
        self.step
    }

    fn set_step_size(&mut self, step_size: f64) -> Result<()> {
        self.params = self.params.with_step_size(step_size);
        Ok(())
    }
}
