//! Multivariate stochastic gradient Nosé–Hoover thermostat (mSGNHT; Gan et al. 2015, Li et
//! al. 2016 §2.1 eq. (2)): one thermostat ξ per parameter element, dξ = (p ⊙ p − 1) dt,
//! friction ξ ⊙ p. Euler (mSGNHT-E, Li et al. §2.2) or symmetric splitting (mSGNHT-S,
//! §3). The updates are those of `sgnht.rs` with the thermostat kept element-wise.

use candle_core::Var;

use super::sgnht::ComposedSgnht;
use crate::error::Result;
use crate::sampler::SamplerConfig;

/// mSGNHT with thermostats α = a for every element.
pub fn init(config: SamplerConfig, params: &[Var], seed: u64) -> Result<ComposedSgnht> {
    ComposedSgnht::init(config, params, seed, true)
}
