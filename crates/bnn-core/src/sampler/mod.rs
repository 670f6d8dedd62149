//! Stochastic-gradient samplers (and two optimisers as MAP baselines) behind one trait.
//!
//! Every sampler is written in the "v-form" of Chen et al. 2014 eq. (15), which Ding et
//! al. 2014 use for their networks (App. F, Algorithm 2): with the physical step h, the
//! momentum p and the friction ξ of the continuous dynamics, the code works with
//!
//! - `step_size` η = h²,
//! - `momentum` v = p·h (u in Ding et al.),
//! - `friction` α = ξ·h (the SGNHT `thermostat` is this α),
//! - `diffusion` a = A·h,
//!
//! so that η multiplies the gradient of the full-data potential U directly. The kinetic
//! energy per parameter reported in diagnostics is ½·pᵀp/n = ½·vᵀv/(n·η), which a sampler
//! at the right temperature keeps near ½ (Ding et al. eq. 4).
//!
//! Each update is defined once, by its coefficients, in [`crate::engine::dynamics`]: the
//! fused kernels apply it, the composed reference interprets it in candle ops. Noise comes
//! from [`crate::rng`], keyed by (seed, step, parameter index, element index), so a run
//! is reproducible and the kernels can be compared with the reference noise for noise.

pub mod ladder;
pub mod params;
pub mod replica;
pub mod state;

use candle_core::{Tensor, Var};
use serde::{Deserialize, Serialize};

use crate::engine::composed;
use crate::engine::dynamics::Dynamics;
use crate::error::{Error, Result};
pub use crate::kernels::TensorwiseStep;
use crate::rng::NoiseKey;
pub use params::{Integrator, Method, SamplerConfig, SamplerKind, SamplerParams};
pub use state::{Clock, MsgnhtState, SamplerState, SghmcState, SgnhtState, StateScalars};

/// What a sampler reports about its state.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Diagnostics {
    /// ½·pᵀp/n with p = v/√η; `None` for samplers without momentum.
    pub kinetic_energy: Option<f64>,
    /// The SGNHT thermostat α = ξ·h.
    pub thermostat: Option<f64>,
}

/// Refuses an estimated gradient noise (β̂) for any sampler but SGHMC.
pub(crate) fn only_sghmc_estimates_noise(kind: SamplerKind) -> Result<()> {
    match kind {
        SamplerKind::Sghmc => Ok(()),
        other => Err(Error::Config(format!(
            "an estimated gradient noise (β̂) is for sghmc, not {}",
            other.name()
        ))),
    }
}

/// SGHMC's injected-noise scale with β̂ estimated from tensor's gradient noise: Chen et al.
/// 2014 eq. (15) with B̂ = ½ηV̂ (§3.2), in v-form β̂ = ½·η·V̂ with V̂ = `trace` / `elements`
/// (the mean over the tensor's elements of the minibatch gradient's variance), and the
/// noise √(2(α − β̂)η) — none once β̂ reaches α, the gradient's noise alone then being
/// more than the friction removes.
pub(crate) fn estimated_noise_scale(eta: f64, alpha: f64, trace: f64, elements: usize) -> f64 {
    let beta = 0.5 * eta * trace / elements.max(1) as f64;
    (2.0 * (alpha - beta).max(0.0) * eta).sqrt()
}

/// The error of an update whose backward did not report a tensor's gradient noise
/// ([`Sampler::estimate_gradient_noise`]).
pub(crate) fn noise_not_reported(t: usize) -> Error {
    Error::Config(format!(
        "sghmc with an estimated noise: the backward pass did not report the gradient noise of parameter tensor {t}; the estimate needs the per-example gradients of the hand-written MLP backward on the CPU (not autograd, a CNN or a GPU)"
    ))
}

/// Flat host copies of `tensors` (a state's form).
pub(crate) fn to_state(tensors: &[Tensor]) -> Result<Vec<Tensor>> {
    tensors
        .iter()
        .map(|t| Ok(t.flatten_all()?.to_device(&candle_core::Device::Cpu)?))
        .collect()
}

/// `saved` (a state's flat tensors) in the shapes and on the device of `like`.
pub(crate) fn from_state(saved: &[Tensor], like: &[Tensor], what: &str) -> Result<Vec<Tensor>> {
    if saved.len() != like.len() {
        return Err(Error::Checkpoint(format!(
            "the saved state has {} {what} tensors, the sampler {}",
            saved.len(),
            like.len()
        )));
    }
    saved
        .iter()
        .zip(like)
        .map(|(s, l)| {
            if s.elem_count() != l.elem_count() {
                return Err(Error::Checkpoint(format!(
                    "a saved {what} tensor has {} values, the sampler's {}",
                    s.elem_count(),
                    l.elem_count()
                )));
            }
            Ok(s.reshape(l.shape())?.to_device(l.device())?)
        })
        .collect()
}

/// One update rule: a configuration, a state built by `init` from the parameters, and the
/// update, given ∇Ũ(θ) per parameter tensor, through the per-tensor protocol
/// [`TensorwiseStep`] that every sampler implements.
pub trait Sampler: TensorwiseStep + Send {
    /// The hyper-parameters it runs with (η as it is now).
    fn params(&self) -> SamplerParams;
    /// One update of all parameters from their gradients (same order): the per-tensor
    /// protocol in parameter order.
    fn step(&mut self, params: &[Var], grads: &[Tensor]) -> Result<()> {
        check_lengths(params, grads)?;
        let mut update = crate::kernels::begin(self)?;
        for (t, (p, g)) in params.iter().zip(grads).enumerate() {
            update.tensor(t, p, g)?;
        }
        update.finish()
    }
    /// Kinetic energy and thermostat as of the last update.
    fn diagnostics(&self) -> Diagnostics;
    /// The virial Σθ·∇ of each parameter tensor in the last update: θ where its gradient
    /// was evaluated (before the update), ∇ the gradient the update was given (of Ũ/T).
    /// Summed over the tensors and divided by their D elements, it is the configurational
    /// temperature, whose expectation under the posterior is 1 (E_π[θ·∇U] = D·T, by
    /// integration by parts): a check of the positions where the kinetic energy checks
    /// the momenta. Empty before the first update, and for SGD and momentum.
    fn virials(&self) -> &[f64] {
        &[]
    }
    /// SGHMC: estimate β̂ from each update's minibatch (Chen et al. 2014 §3.2: B̂ = ½ηV̂,
    /// V̂ the empirical Fisher of the minibatch's per-example gradients, which the backward
    /// reports per tensor through [`TensorwiseStep::gradient_noise`]) instead of the fixed
    /// `noise_estimate`. An error for the other samplers.
    fn estimate_gradient_noise(&mut self) -> Result<()> {
        only_sghmc_estimates_noise(self.params().kind())?;
        Err(Error::Config(
            "this sghmc update cannot estimate its gradient noise".into(),
        ))
    }
    /// The state between updates, as plain data.
    fn state(&self) -> Result<SamplerState>;
    /// Continues from `state` (taken from a sampler of the same configuration on the same
    /// parameter shapes): the next update is bit-identical to the one the saved sampler
    /// would have made.
    fn restore(&mut self, state: &SamplerState) -> Result<()>;
    /// Number of updates done so far.
    fn steps(&self) -> u64;
    /// Changes the step size η (for a schedule). Momentum samplers rescale v = p·h by
    /// √(η'/η), so that the momentum p of the continuous dynamics is unchanged.
    fn set_step_size(&mut self, step_size: f64) -> Result<()>;
}

/// How a sampler's update is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Kernel {
    /// One fused pass per parameter tensor ([`crate::kernels`]); SGD and momentum, which
    /// have no fused kernel, fall back to the composed version.
    Fused,
    /// Ordinary candle tensor ops: the reference implementation, the same update's
    /// coefficients interpreted term by term ([`crate::engine::composed::interpret()`]).
    Composed,
}

/// Builds the sampler of `sampler` for `params` with the chosen kernel, its noise keyed
/// by `seed`.
pub fn build_with(
    sampler: SamplerParams,
    params: &[Var],
    seed: u64,
    kernel: Kernel,
) -> Result<Box<dyn Sampler>> {
    sampler.validate()?;
    Ok(match sampler.map_baseline() {
        // The MAP baselines have no fused kernel: composed whatever the kernel.
        Some((step_size, friction)) => {
            Box::new(composed::ComposedSgd::init(step_size, friction, params)?)
        }
        // One definition of each update ([`Dynamics`]), applied by the fused kernels on the
        // CPU and on CUDA or interpreted in candle ops.
        None => Box::new(Dynamics::init(sampler, params, seed, kernel)?),
    })
}

/// Builds the composed (reference) sampler of `sampler` for `params`, its noise keyed by
/// `seed` ([`build_with`] with [`Kernel::Composed`]).
pub fn build(sampler: SamplerParams, params: &[Var], seed: u64) -> Result<Box<dyn Sampler>> {
    build_with(sampler, params, seed, Kernel::Composed)
}

/// A replica-exchange sampler is a ladder of chains, HMC a full-batch trajectory: neither
/// is one minibatch update rule.
pub(crate) fn not_one_chain(kind: SamplerKind) -> Error {
    if kind == SamplerKind::Hmc {
        return Error::Config(
            "hmc takes full-batch trajectories, not minibatch updates (see bnn_core::hmc)".into(),
        );
    }
    Error::Config(format!(
        "{} runs replicas, each a {} chain: build those (see synthetic::replicas)",
        kind.name(),
        kind.replica_kind().name()
    ))
}

/// A tensor of standard normals shaped like `like`, from the noise stream of parameter
/// `param` at step `step`.
pub(crate) fn noise_like(like: &Tensor, seed: u64, step: u64, param: usize) -> Result<Tensor> {
    let param = param as u32;
    NoiseKey { seed, step, param }.normals_like(like)
}

pub use crate::rng::INIT_STREAM;

/// Initial momenta v ~ N(0, η), i.e. p ~ N(0, I) as in Ding et al. Alg. 1.
pub(crate) fn init_momentum(params: &[Var], step_size: f64, seed: u64) -> Result<Vec<Tensor>> {
    params
        .iter()
        .enumerate()
        .map(|(i, p)| Ok((noise_like(p.as_tensor(), seed, INIT_STREAM, i)? * step_size.sqrt())?))
        .collect()
}

/// ½·Σv²/(n·η): the kinetic energy per parameter of the momentum p = v/√η.
pub fn kinetic_energy(momentum: &[Tensor], step_size: f64) -> Result<f64> {
    let mut sum = 0f64;
    let mut n = 0usize;
    for v in momentum {
        sum += v.sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
        n += v.elem_count();
    }
    Ok(0.5 * sum / (n as f64 * step_size))
}

pub(crate) fn check_lengths(params: &[Var], grads: &[Tensor]) -> Result<()> {
    if params.len() != grads.len() {
        return Err(Error::Config(format!(
            "{} gradients for {} parameters",
            grads.len(),
            params.len()
        )));
    }
    Ok(())
}
