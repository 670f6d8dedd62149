//! The samplers as [`candle_nn::Optimizer`]s, for any candle model: give the optimizer
//! the model's `Var`s, call `backward_step(&loss)` with the minibatch's mean negative
//! log-likelihood, and read posterior samples off the vars between steps.
//!
//! The update is the sampler's (the fused pass on the CPU and on CUDA, as `bnn train`
//! runs it) on the gradient of the tempered minibatch potential (Chen et al. 2014 eq. 4,
//! 15):
//!
//! ∇Ũ(θ)/T = (N·∇[(1/|S|) Σ_{i∈S} −log p(yᵢ|xᵢ,θ)] + λθ)/T,
//!
//! with N the training-set size (`data_size`: the likelihood scale N/|S| of a summed loss
//! is N for a mean), λ = 1/σ² the precision of a fixed N(0, σ²) prior on every parameter
//! and T the temperature. η (`learning_rate`) multiplies it, as in every sampler here
//! (η = h², Chen et al. eq. 15).
//!
//! ```
//! use bnn_core::sampler::optim::{OptimizerConfig, Sghmc};
//! use candle_core::{DType, Device, Tensor};
//! use candle_nn::{linear, loss, Module, Optimizer, VarBuilder, VarMap};
//!
//! # fn main() -> candle_core::Result<()> {
//! let dev = Device::Cpu;
//! let varmap = VarMap::new();
//! let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
//! let (l1, l2) = (linear(4, 8, vb.pp("l1"))?, linear(8, 3, vb.pp("l2"))?);
//! // In a fixed order: the order keys each parameter's noise stream.
//! let vars = ["l1.weight", "l1.bias", "l2.weight", "l2.bias"]
//!     .map(|n| varmap.data().lock().unwrap()[n].clone())
//!     .to_vec();
//! let mut opt = Sghmc::new(vars, OptimizerConfig::new(64))?;
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

use candle_core::backprop::GradStore;
use candle_core::{Tensor, Var};

use super::{build_with, Kernel, Sampler, SamplerConfig, SamplerKind, SamplerState};

/// How an optimizer samples: the sampler and its hyper-parameters, and the potential.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OptimizerConfig {
    /// The sampler's hyper-parameters. The optimizer types ([`Sghmc`], …) replace a
    /// configuration of another kind by their own defaults; [`SgMcmc`] takes it as given.
    pub sampler: SamplerConfig,
    /// N, the training-set size: the gradient of the minibatch's mean loss is scaled by N.
    pub data_size: usize,
    /// λ = 1/σ² of the N(0, σ²) prior on every parameter; 0 is a flat prior.
    pub prior_precision: f64,
    /// T: the optimizer samples exp(−U/T).
    pub temperature: f64,
    /// Seed of the injected noise (and of a momentum sampler's initial momenta).
    pub seed: u64,
    /// The fused pass (default) or the composed reference.
    pub kernel: Kernel,
}

impl OptimizerConfig {
    /// SGHMC's defaults (η = 2e-6, α = 0.1; another optimizer type takes its own), a
    /// N(0, 1) prior, T = 1, seed 0, the fused kernel, for `data_size` training examples.
    pub fn new(data_size: usize) -> Self {
        OptimizerConfig {
            sampler: SamplerKind::Sghmc.defaults(),
            data_size,
            prior_precision: 1.0,
            temperature: 1.0,
            seed: 0,
            kernel: Kernel::Fused,
        }
    }

    /// The same with the sampler's own defaults for `kind`.
    pub fn for_kind(kind: SamplerKind, data_size: usize) -> Self {
        OptimizerConfig {
            sampler: kind.defaults(),
            ..OptimizerConfig::new(data_size)
        }
    }
}

/// Any sampler of this crate as a [`candle_nn::Optimizer`] (`config.sampler.kind` picks
/// it); [`Sgld`], [`Sghmc`], [`Sgnht`], [`Msgnht`], [`Sgd`] and [`Momentum`] fix the kind.
pub struct SgMcmc {
    vars: Vec<Var>,
    sampler: Box<dyn Sampler>,
    config: OptimizerConfig,
}

fn candle_error(e: crate::error::Error) -> candle_core::Error {
    candle_core::Error::wrap(e)
}

impl SgMcmc {
    /// Builds the sampler on `vars` (the splitting integrator makes its first half-step
    /// here, as in `bnn train`).
    pub fn with_config(vars: Vec<Var>, config: OptimizerConfig) -> candle_core::Result<Self> {
        let bad = |m: String| candle_error(crate::error::Error::Config(m));
        if !(config.temperature > 0.0 && config.temperature.is_finite()) {
            return Err(bad(format!(
                "temperature must be positive, got {}",
                config.temperature
            )));
        }
        if !(config.prior_precision >= 0.0 && config.prior_precision.is_finite()) {
            return Err(bad(format!(
                "prior precision must be ≥ 0, got {}",
                config.prior_precision
            )));
        }
        if config.data_size == 0 {
            return Err(bad("data size must be positive".into()));
        }
        // A replica-exchange kind is refused by `build_with`: a ladder, not one chain.
        let sampler =
            build_with(config.sampler, &vars, config.seed, config.kernel).map_err(candle_error)?;
        Ok(SgMcmc {
            vars,
            sampler,
            config,
        })
    }

    /// ∇Ũ/T for every var from the gradients in `store` of the minibatch potential's
    /// likelihood part, multiplied by `scale` first where it is given; a var the loss does
    /// not reach has a zero one.
    fn potential_gradients(
        &self,
        store: &GradStore,
        scale: Option<f64>,
    ) -> candle_core::Result<Vec<Tensor>> {
        let inv_t = 1.0 / self.config.temperature;
        self.vars
            .iter()
            .map(|v| {
                let g = match (store.get(v), scale) {
                    (Some(g), Some(n)) => (g.detach() * n)?,
                    (Some(g), None) => g.detach(),
                    (None, _) => v.zeros_like()?,
                };
                // As `Potential::evaluate` forms it, so that both paths give the same bits.
                let g = (g + (v.as_detached_tensor() * self.config.prior_precision)?)?;
                g * inv_t
            })
            .collect()
    }

    fn update(&mut self, grads: &[Tensor]) -> candle_core::Result<()> {
        self.sampler.step(&self.vars, grads).map_err(candle_error)
    }

    /// The vars, in the order that keys their noise.
    pub fn vars(&self) -> &[Var] {
        &self.vars
    }

    /// Updates done.
    pub fn steps(&self) -> u64 {
        self.sampler.steps()
    }

    /// The sampler's state as plain data (momenta, thermostats, step counter, η).
    pub fn state(&self) -> candle_core::Result<SamplerState> {
        self.sampler.state().map_err(candle_error)
    }

    /// Continues from `state`, taken from an optimizer of the same configuration on vars
    /// of the same shapes: the next update is bit-identical to the saved one's.
    pub fn restore(&mut self, state: &SamplerState) -> candle_core::Result<()> {
        self.sampler.restore(state).map_err(candle_error)
    }

    /// The configuration it was built with (η as set since).
    pub fn config(&self) -> OptimizerConfig {
        OptimizerConfig {
            sampler: self.sampler.config(),
            ..self.config
        }
    }
}

impl candle_nn::Optimizer for SgMcmc {
    type Config = OptimizerConfig;

    fn new(vars: Vec<Var>, config: OptimizerConfig) -> candle_core::Result<Self> {
        SgMcmc::with_config(vars, config)
    }

    /// One update from the gradients of the minibatch's *mean* negative log-likelihood.
    fn step(&mut self, grads: &GradStore) -> candle_core::Result<()> {
        let grads = self.potential_gradients(grads, Some(self.config.data_size as f64))?;
        self.update(&grads)
    }

    /// One update for `loss`, the minibatch's mean negative log-likelihood: N·loss is
    /// differentiated, as `bnn train` does it.
    fn backward_step(&mut self, loss: &Tensor) -> candle_core::Result<()> {
        let store = (loss * self.config.data_size as f64)?.backward()?;
        let grads = self.potential_gradients(&store, None)?;
        self.update(&grads)
    }

    /// η.
    fn learning_rate(&self) -> f64 {
        self.sampler.config().step_size
    }

    /// Sets η; momentum samplers keep the momentum p = v/√η of the dynamics. A value that
    /// is not positive and finite is refused with a logged error (the trait returns
    /// nothing).
    fn set_learning_rate(&mut self, lr: f64) {
        // A negative or NaN η would be taken by every sampler and turn θ into NaN at the
        // next step, with that step returning Ok: refused here, η kept.
        if !(lr > 0.0 && lr.is_finite()) {
            tracing::error!(
                "set_learning_rate({lr}): the step size must be positive and finite; it stays {}",
                self.learning_rate()
            );
            return;
        }
        if let Err(e) = self.sampler.set_step_size(lr) {
            tracing::error!("set_learning_rate({lr}): {e}");
        }
    }
}

/// An optimizer type that fixes the sampler of [`SgMcmc`].
macro_rules! sampler_optimizer {
    ($(#[$doc:meta])* $name:ident, $kind:expr) => {
        $(#[$doc])*
        pub struct $name(pub SgMcmc);

        impl std::ops::Deref for $name {
            type Target = SgMcmc;
            fn deref(&self) -> &SgMcmc {
                &self.0
            }
        }

        impl std::ops::DerefMut for $name {
            fn deref_mut(&mut self) -> &mut SgMcmc {
                &mut self.0
            }
        }

        impl candle_nn::Optimizer for $name {
            type Config = OptimizerConfig;

            /// Builds it with `config`; a sampler configuration of another kind is
            /// replaced by this type's defaults (η, friction, diffusion, integrator).
            fn new(vars: Vec<Var>, mut config: OptimizerConfig) -> candle_core::Result<Self> {
                if config.sampler.kind != $kind {
                    config.sampler = $kind.defaults();
                }
                SgMcmc::with_config(vars, config).map($name)
            }
            fn step(&mut self, grads: &GradStore) -> candle_core::Result<()> {
                self.0.step(grads)
            }
            fn backward_step(&mut self, loss: &Tensor) -> candle_core::Result<()> {
                self.0.backward_step(loss)
            }
            fn learning_rate(&self) -> f64 {
                self.0.learning_rate()
            }
            fn set_learning_rate(&mut self, lr: f64) {
                self.0.set_learning_rate(lr)
            }
        }
    };
}

sampler_optimizer!(
    /// SGLD (Welling & Teh 2011): θ ← θ − η∇Ũ + √(2η)·z.
    Sgld,
    SamplerKind::Sgld
);
sampler_optimizer!(
    /// SGHMC (Chen et al. 2014, eq. 15): v ← v − η∇Ũ − αv + √(2(α − β̂)η)·z; θ ← θ + v.
    Sghmc,
    SamplerKind::Sghmc
);
sampler_optimizer!(
    /// SGNHT (Ding et al. 2014, Alg. 2) with a scalar thermostat α ← α + vᵀv/n − η.
    Sgnht,
    SamplerKind::Sgnht
);
sampler_optimizer!(
    /// mSGNHT (Li et al. 2016, eq. 2): one thermostat per element, α ← α + v⊙v − η.
    Msgnht,
    SamplerKind::Msgnht
);
sampler_optimizer!(
    /// SGD on U: the MAP baseline, θ ← θ − η∇Ũ.
    Sgd,
    SamplerKind::Sgd
);
sampler_optimizer!(
    /// SGD with momentum on U: v ← (1 − α)v − η∇Ũ; θ ← θ + v.
    Momentum,
    SamplerKind::Momentum
);
