//! The samplers as [`candle_nn::Optimizer`]s, for any candle model: give the optimizer
//! the model's `Var`s, call `backward_step(&loss)` with the minibatch's *mean* negative
//! log-likelihood, and read posterior samples off the vars between steps.
//!
//! One generic type, [`SgMcmc<P>`], named per sampler by its parameters' type:
//! [`Sgld`], [`Sghmc`], [`Sgnht`], [`Msgnht`] (and the MAP baselines [`Sgd`],
//! [`Momentum`]). Its configuration [`Config<P>`] keeps the dynamics ([`params`]: `lr` and
//! the sampler's own fields) apart from the [`Posterior`] (data size, prior,
//! temperature).
//!
//! The update is the sampler's (the fused pass on the CPU and on CUDA, as `bnn train`
//! runs it) on the gradient of the tempered minibatch potential (Chen et al. 2014 eq. 4,
//! 15):
//!
//! ∇Ũ(θ)/T = (N·∇[(1/|S|) Σ_{i∈S} −log p(yᵢ|xᵢ,θ)] + λθ)/T,
//!
//! with N the training-set size, λ = 1/σ² the prior precision of each var (fixed, or
//! Gibbs-drawn under a Gamma hyper-prior by [`SgMcmc::gibbs_step`]) and T the
//! temperature; η = lr/N multiplies it.
//!
//! **Vars the loss does not reach are an error** (not candle's silent skip): such a var
//! would diffuse under the prior and the noise alone, a sample of nothing the data say.
//!
//! **Saving and restoring.** [`SgMcmc::state`] holds θ with the sampler's state, so a
//! restore continues bit for bit whatever the order of building the optimizer and loading
//! θ (the splitting integrator moves θ by its first half-step when it is built).
//!
//! ```
//! use bnn_core::{Config, Optimizer, Sghmc, SghmcParams};
//! use candle_core::{DType, Device, Tensor};
//! use candle_nn::{linear, loss, Module, VarBuilder, VarMap};
//!
//! # fn main() -> candle_core::Result<()> {
//! let dev = Device::Cpu;
//! let varmap = VarMap::new();
//! let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
//! let (l1, l2) = (linear(4, 8, vb.pp("l1"))?, linear(8, 3, vb.pp("l2"))?);
//! let config = Config {
//!     dynamics: SghmcParams { lr: 0.05, ..Default::default() },
//!     ..Config::new(64)
//! };
//! // The vars by name, so in a fixed order: the order keys each parameter's noise.
//! let mut opt = Sghmc::new(bnn_core::vars_by_name(&varmap)?, config)?;
//! let x = Tensor::randn(0f32, 1.0, (16, 4), &dev)?;
//! let y = Tensor::new(&[0u32, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0], &dev)?;
//! for _ in 0..10 {
//!     let logits = l2.forward(&l1.forward(&x)?.relu()?)?;
//!     opt.backward_step(&loss::cross_entropy(&logits, &y)?)?;
//! }
//! assert_eq!(opt.steps(), 10);
//! # Ok(())
//! # }
//! ```

pub mod params;
mod state;

use candle_core::backprop::GradStore;
use candle_core::{DType, Tensor, Var};

use crate::error::{Error, Result};
use crate::likelihood::GaussianNoise;
use crate::potential::{tempered_gradient, Prior, PriorSpec};
use crate::rng;
use crate::sampler::{build_with, Diagnostics, Kernel, Sampler};
pub use params::*;
pub use state::OptimizerState;

/// The posterior an optimizer samples, apart from the dynamics that sample it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Posterior {
    /// N, the training-set size: the gradient of the minibatch's mean loss is scaled by N.
    pub data_size: usize,
    /// The prior on every var: a fixed N(0, σ²), or N(0, 1/λ) per var with
    /// λ ~ Gamma(shape, rate) drawn by [`SgMcmc::gibbs_step`].
    pub prior: PriorSpec,
    /// T: the optimizer samples exp(−U/T).
    pub temperature: f64,
}

impl Posterior {
    /// A N(0, 1) prior at T = 1 for `data_size` training examples.
    pub fn new(data_size: usize) -> Self {
        Posterior {
            data_size,
            prior: PriorSpec::Gaussian { std: 1.0 },
            temperature: 1.0,
        }
    }
}

/// An optimizer's configuration: the sampler's parameters `P`, the posterior, the seed
/// of the injected noise and the kernel.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Config<P> {
    /// The dynamics: `lr` and the sampler's own fields.
    pub dynamics: P,
    /// What is sampled.
    pub posterior: Posterior,
    /// Seed of the injected noise, of a momentum sampler's initial momenta and of the
    /// Gibbs draws.
    pub seed: u64,
    /// The fused pass (default) or the composed reference.
    pub kernel: Kernel,
}

impl<P: Params> Config<P> {
    /// `P`'s defaults, a N(0, 1) prior at T = 1, seed 0 and the fused kernel for
    /// `data_size` training examples.
    pub fn new(data_size: usize) -> Self {
        Config {
            dynamics: P::default(),
            posterior: Posterior::new(data_size),
            seed: 0,
            kernel: Kernel::Fused,
        }
    }
}

/// A stochastic-gradient MCMC sampler as a [`candle_nn::Optimizer`]; `P` picks the
/// sampler ([`Sgld`], [`Sghmc`], …).
///
/// One sampler's parameters cannot configure another (before, a mismatched configuration
/// was silently replaced by the other's defaults, step size included):
///
/// ```compile_fail
/// use bnn_core::{Config, Optimizer, SghmcParams, Sgnht};
/// let w = candle_core::Var::zeros(1, candle_core::DType::F32, &candle_core::Device::Cpu).unwrap();
/// let _ = Sgnht::new(vec![w], Config::<SghmcParams>::new(10));
/// ```
pub struct SgMcmc<P> {
    vars: Vec<Var>,
    sampler: Box<dyn Sampler>,
    config: Config<P>,
    prior: Prior,
    /// Gibbs draws done: keys the next one's seed.
    draws: u64,
    /// The kinetic energy's moving average over about [`KINETIC_SPAN`] updates, and
    /// whether its warning was given (once per optimizer).
    kinetic_mean: f64,
    warned: bool,
}

/// Updates the kinetic energy's moving average spans; it is first read after five spans,
/// so that the burn-in's transient from a start far from the posterior (potential energy
/// turned into kinetic, damped at the friction's rate: ~1/α = 10 updates per e-fold) has
/// passed and left the average.
const KINETIC_SPAN: f64 = 20.0;

/// Kinetic energy per parameter above which `lr` is too large: ten times the ½ of a
/// sampler at its temperature (Ding et al. eq. 4). `bnn train`'s chains run at 0.45–0.6.
const KINETIC_ALARM: f64 = 5.0;

/// Checks what enters an optimizer: the vars, the posterior and `lr`.
fn check_inputs(vars: &[Var], posterior: &Posterior, lr: f64) -> Result<()> {
    if vars.is_empty() {
        return Err(Error::Config(
            "the optimizer was given no vars to sample".into(),
        ));
    }
    for (i, v) in vars.iter().enumerate() {
        if v.dtype() != DType::F32 {
            return Err(Error::Config(format!(
                "var {i} ({:?}) is {:?}; the samplers update f32 vars",
                v.dims(),
                v.dtype()
            )));
        }
    }
    let invalid = |name, rule: &str, value| {
        Err(Error::Invalid {
            name,
            rule: rule.into(),
            value,
        })
    };
    if !(lr > 0.0 && lr.is_finite()) {
        return invalid("lr", "positive and finite", lr);
    }
    let t = posterior.temperature;
    if !(t > 0.0 && t.is_finite()) {
        return invalid("temperature", "positive and finite", t);
    }
    if posterior.data_size == 0 {
        return invalid("data size", "at least 1", 0.0);
    }
    Ok(())
}

impl<P: Params> SgMcmc<P> {
    /// Builds the sampler on `vars` (the splitting integrator makes its first half-step
    /// here, as in `bnn train`); every input is checked first.
    fn build(vars: Vec<Var>, config: Config<P>) -> Result<Self> {
        check_inputs(&vars, &config.posterior, config.dynamics.lr())?;
        let prior = Prior::new(config.posterior.prior, vars.len())?;
        let sampler_params = config.dynamics.sampler_params(config.posterior.data_size);
        let sampler = build_with(sampler_params, &vars, config.seed, config.kernel)?;
        Ok(SgMcmc {
            vars,
            sampler,
            config,
            prior,
            draws: 0,
            kinetic_mean: 0.5,
            warned: false,
        })
    }

    /// ∇Ũ/T for every var from the gradients in `store` of the minibatch potential's
    /// likelihood part, multiplied by `scale` first where it is given.
    fn potential_gradients(&self, store: &GradStore, scale: Option<f64>) -> Result<Vec<Tensor>> {
        let temperature = self.config.posterior.temperature;
        let reached = self.vars.iter().filter(|v| store.get(v).is_some()).count();
        if reached == 0 {
            return Err(Error::Config(
                "the loss depends on none of the optimizer's vars (a constant?): nothing to step"
                    .into(),
            ));
        }
        let lambdas = &self.prior.precisions;
        self.vars
            .iter()
            .zip(lambdas)
            .enumerate()
            .map(|(i, (v, &lambda))| {
                let g = match (store.get(v), scale) {
                    (Some(g), Some(n)) => (g.detach() * n)?,
                    (Some(g), None) => g.detach(),
                    (None, _) => return Err(unreached(i, v)),
                };
                let prior = (v.as_detached_tensor() * lambda)?;
                tempered_gradient(&g, &prior, temperature)
            })
            .collect()
    }

    /// One update; warns once when the kinetic energy, averaged over about
    /// [`KINETIC_SPAN`] updates, shows `lr` too large for the model (the chain runs on, far
    /// too hot, with no error to tell).
    fn update(&mut self, grads: &[Tensor]) -> Result<()> {
        self.sampler.step(&self.vars, grads)?;
        let Some(k) = self.sampler.diagnostics().kinetic_energy else {
            return Ok(());
        };
        self.kinetic_mean += (k - self.kinetic_mean) / KINETIC_SPAN;
        let settled = self.steps() as f64 >= 5.0 * KINETIC_SPAN;
        match self.kinetic_mean {
            m if !self.warned && settled && (m.is_nan() || m > KINETIC_ALARM) => {
                self.warned = true;
                let lr = self.config().dynamics.lr();
                tracing::warn!(
                    "kinetic energy {m:.3} per parameter (mean of the last ~20 updates, at \
                     update {}), more than 10× its ½ at the right temperature: lr {lr} is too \
                     large for this model; try lr {}",
                    self.steps(),
                    lr / 10.0
                );
            }
            _ => {}
        }
        Ok(())
    }

    /// The vars, in the order that keys their noise.
    pub fn vars(&self) -> &[Var] {
        &self.vars
    }

    /// Updates done.
    pub fn steps(&self) -> u64 {
        self.sampler.steps()
    }

    /// Kinetic energy per parameter (½ at the right temperature) and thermostat, as of
    /// the last update.
    pub fn diagnostics(&self) -> Diagnostics {
        self.sampler.diagnostics()
    }

    /// θ·∇Ũ/(D·T) of the last update over all D elements of the vars (None before the
    /// first, and for SGD and momentum): one draw of the configurational temperature,
    /// whose mean over a chain is 1 when it samples the posterior (E_π[θ·∇U] = D·T, by
    /// integration by parts), whatever the kinetic energy says. Summed in the update's own
    /// pass. One update's value carries the minibatch's noise: average it, and over the
    /// first update of each pass over the data only, where the minibatch is independent
    /// of θ (later ones bias it upward; docs/guide.md, "Choosing a sampler").
    pub fn configurational_temperature(&self) -> Option<f64> {
        let virials = self.sampler.virials();
        let d: usize = self.vars.iter().map(|v| v.elem_count()).sum();
        (!virials.is_empty() && d > 0).then(|| virials.iter().sum::<f64>() / d as f64)
    }

    /// λ per var: fixed for a Gaussian prior, the last Gibbs draws under a Gamma one.
    pub fn prior_precisions(&self) -> &[f64] {
        &self.prior.precisions
    }

    /// The configuration, `lr` as set since.
    pub fn config(&self) -> Config<P> {
        let n = self.config.posterior.data_size;
        let lr = P::lr_of(self.sampler.params().step_size(), n);
        Config {
            dynamics: self.config.dynamics.with_lr(lr),
            ..self.config
        }
    }

    /// One Gibbs step for what the gradient does not move (call it once per epoch, as
    /// `bnn train` does): under a Gamma hyper-prior each var's λ is drawn from its
    /// conditional given θ; with `noise`, a regression's noise precision τ is drawn from
    /// its conditional given the training residuals' sum of squares `sse` over the
    /// posterior's N examples ([`GaussianNoise::gibbs_draw`]). Both at the posterior's
    /// temperature; a no-op for a fixed prior and no noise.
    pub fn gibbs_step(&mut self, noise: Option<(&mut GaussianNoise, f64)>) -> Result<()> {
        let seed = self.config.seed ^ rng::GIBBS_STREAM ^ self.draws;
        let t = self.config.posterior.temperature;
        if let Some((noise, sse)) = noise {
            let n = self.config.posterior.data_size;
            noise.gibbs_draw(sse, n, t, seed ^ rng::NOISE_GIBBS_STREAM)?;
        }
        self.prior.gibbs_step(&self.vars, t, seed)?;
        self.draws += 1;
        Ok(())
    }

    /// θ and the sampler's state between updates, as plain data: restored by
    /// [`SgMcmc::restore`] bit for bit.
    pub fn state(&self) -> Result<OptimizerState> {
        OptimizerState::of(&self.vars, self.sampler.state()?, &self.prior, self.draws)
    }

    /// Continues from `state`, taken from an optimizer of the same configuration on vars
    /// of the same shapes: θ is set and the next update is bit-identical to the saved
    /// one's, in whatever order the optimizer was built and θ loaded.
    /// A state that does not fit (another sampler's, other shapes) is refused with the
    /// optimizer unchanged.
    pub fn restore(&mut self, state: &OptimizerState) -> Result<()> {
        let theta = state.params_for(&self.vars)?;
        let precisions = state.checked_precisions(self.vars.len())?;
        self.sampler.restore(&state.sampler)?;
        for (v, t) in self.vars.iter().zip(&theta) {
            v.set(t)?;
        }
        self.prior.precisions = precisions;
        self.draws = state.prior_draws;
        Ok(())
    }
}

/// The error for var `i`, which the loss does not reach.
fn unreached(i: usize, v: &Var) -> Error {
    Error::Config(format!(
        "var {i} ({:?}) has no gradient: the loss does not depend on it; give the optimizer \
         only the vars the model uses",
        v.dims()
    ))
}

impl<P: Params> candle_nn::Optimizer for SgMcmc<P> {
    type Config = Config<P>;

    fn new(vars: Vec<Var>, config: Config<P>) -> candle_core::Result<Self> {
        Self::build(vars, config).map_err(candle_core::Error::from)
    }

    /// One update from the gradients of the minibatch's *mean* negative log-likelihood.
    fn step(&mut self, grads: &GradStore) -> candle_core::Result<()> {
        let n = self.config.posterior.data_size as f64;
        let grads = self
            .potential_gradients(grads, Some(n))
            .map_err(candle_core::Error::from)?;
        self.update(&grads).map_err(candle_core::Error::from)
    }

    /// One update for `loss`, the minibatch's mean negative log-likelihood: N·loss is
    /// differentiated, as `bnn train` does it.
    fn backward_step(&mut self, loss: &Tensor) -> candle_core::Result<()> {
        let store = (loss * self.config.posterior.data_size as f64)?.backward()?;
        let grads = self
            .potential_gradients(&store, None)
            .map_err(candle_core::Error::from)?;
        self.update(&grads).map_err(candle_core::Error::from)
    }

    /// `lr` = η·N.
    fn learning_rate(&self) -> f64 {
        self.config().dynamics.lr()
    }

    /// Sets `lr` (η = lr/N, [`Params::step_size_of`]); momentum samplers keep the momentum p = v/√η of the
    /// dynamics. A value that is not positive and finite is refused with a logged error
    /// (the trait returns nothing).
    fn set_learning_rate(&mut self, lr: f64) {
        // A negative or NaN η would be taken by every sampler and turn θ into NaN at the
        // next step, with that step returning Ok: refused here, η kept.
        if !(lr > 0.0 && lr.is_finite()) {
            tracing::error!(
                "set_learning_rate({lr}): lr must be positive and finite; it stays {}",
                self.learning_rate()
            );
            return;
        }
        let eta = P::step_size_of(lr, self.config.posterior.data_size);
        if let Err(e) = self.sampler.set_step_size(eta) {
            tracing::error!("set_learning_rate({lr}): {e}");
        }
    }
}
