//! What a replica-exchange run is made of, besides the ladder and the exchange test: its
//! settings, and the sampler each replica runs at its temperature.
//!
//! A replica at temperature T targets exp(−U/T). Algorithm 2 of Luo et al. 2018 runs it as
//! SGNHT with the thermostat held at T·ε (s ← s + vᵀv/d − Tε, noise N(0, 2cε), so s settles
//! at c/T). That is exactly our SGNHT at unit temperature on the potential U/T with step
//! size η = T·ε and diffusion a = c/T: with u = v, its update u ← u − αu − η∇(U/T) +
//! N(0, 2aη) is v ← v − sv − ε∇U + N(0, 2cε), and its thermostat α ← α + uᵀu/d − η is the
//! paper's. So a replica is one of our chains with its gradient divided by T and (η, a) set
//! from T, and the fused kernels serve unchanged. RELD's Langevin replica is SGHMC with the
//! constant friction α = c/T (the same noise 2cε). With a thermostat per parameter
//! ([`ReplicaThermostat::PerParameter`]) the replica is mSGNHT instead: each element's
//! kinetic energy is held at Tε, where a scalar thermostat holds only their mean.

use serde::{Deserialize, Serialize};

use super::ladder::PairSchedule;
#[cfg(doc)]
use super::Method;
use super::{SamplerKind, SamplerParams};
use crate::error::{Error, Result};

/// The thermostat of a RENHD replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum ReplicaThermostat {
    /// One scalar s_j per replica (the paper's Algorithm 2).
    #[default]
    Scalar,
    /// One thermostat per parameter element (mSGNHT, Gan et al. 2015).
    PerParameter,
}

/// The replica-exchange settings (`--replicas`, `--ladder`, ...).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplicaOptions {
    /// M: rungs, T₀ = 1 included.
    pub replicas: usize,
    /// τ of the geometric ladder T_j = τ^j; `None`: adapt during burn-in (`--ladder auto`).
    pub ladder: Option<f64>,
    /// The swap rate the adapted ladder aims at.
    pub target_swap_rate: f64,
    /// N: updates of every replica between exchange rounds.
    pub exchange_every: usize,
    /// Which pairs try to swap each round.
    pub pairs: PairSchedule,
    /// RENHD's thermostat (RELD has none).
    #[serde(default)]
    pub thermostat: ReplicaThermostat,
}

impl Default for ReplicaOptions {
    /// The paper's: N = 200 (§4), M = 7 and τ = 1.5 (§4.1); DEO pairs; scalar thermostat.
    fn default() -> Self {
        ReplicaOptions {
            replicas: 7,
            ladder: Some(1.5),
            target_swap_rate: 0.3,
            exchange_every: 200,
            pairs: PairSchedule::Deo,
            thermostat: ReplicaThermostat::Scalar,
        }
    }
}

impl ReplicaOptions {
    /// Checks the options; the message names the flag.
    pub fn validate(&self) -> Result<()> {
        if self.replicas < 2 || self.replicas > 1024 {
            return Err(Error::Config(format!(
                "--replicas must be at least 2 (and at most 1024), got {}",
                self.replicas
            )));
        }
        if let Some(tau) = self.ladder {
            if !(tau > 1.0 && tau.is_finite()) {
                return Err(Error::Config(format!(
                    "--ladder must be `auto` or a number above 1, got {tau}"
                )));
            }
        }
        if !(self.target_swap_rate > 0.0 && self.target_swap_rate < 1.0) {
            return Err(Error::Config(format!(
                "--target-swap-rate must be in (0, 1), got {}",
                self.target_swap_rate
            )));
        }
        if self.exchange_every == 0 {
            return Err(Error::Config("--exchange-every must be at least 1".into()));
        }
        Ok(())
    }
}

/// A replica's sampler at temperature `t`: RENHD's SGNHT (or mSGNHT) with η = T·ε and
/// a = c/T, RELD's SGHMC with η = T·ε and α = c/T (module note), Euler as in Algorithm 2.
pub fn replica_params(
    kind: SamplerKind,
    thermostat: ReplicaThermostat,
    epsilon: f64,
    c: f64,
    t: f64,
) -> Result<SamplerParams> {
    let per_element = thermostat == ReplicaThermostat::PerParameter;
    SamplerParams::replica(kind, per_element, t * epsilon, c / t)
}

/// ε and c of a replica-exchange run ([`Method::ReplicaExchange`]'s replica at T = 1):
/// c is RENHD's diffusion, RELD's friction.
pub fn epsilon_and_c(replica: &SamplerParams) -> (f64, f64) {
    (replica.step_size(), replica.replica_c())
}
