//! Each sampler's own hyper-parameters, in candle's manner (`ParamsAdamW`): one plain
//! type per sampler with `Default`, so that the parameters of one sampler cannot reach
//! another (a compile error, not a silent replacement by defaults).
//!
//! **The step size `lr`** is ε = η·N, the step on the gradient of the minibatch's *mean*
//! negative log-likelihood, as an optimiser's learning rate is; the papers' η = h²
//! (Chen et al. 2014 eq. 15, Ding et al. 2014 Alg. 2), which multiplies the gradient of
//! the full-data potential U = N·mean + prior, is lr/N. So one `lr` means the same drift
//! on a subset of a data set and on all of it (the posterior narrows with N through the
//! injected noise √(2αη), as it should). The defaults are `bnn train`'s on MNIST:
//! η·60,000. pSGLD, whose preconditioner takes out the gradient's scale, is the exception:
//! its lr is η ([`PsgldParams`]).

use super::SgMcmc;
use crate::sampler::{Integrator, SamplerKind, SamplerParams};

/// The data size the defaults of [`SamplerKind::defaults`] are tuned for (MNIST's 60,000
/// training images): the default `lr` is that η times this.
pub const REFERENCE_DATA_SIZE: f64 = 60_000.0;

/// The default lr of `kind`: its default η at [`REFERENCE_DATA_SIZE`].
fn default_lr(kind: SamplerKind) -> f64 {
    kind.defaults().step_size * REFERENCE_DATA_SIZE
}

/// A sampler's hyper-parameters as an optimizer takes them.
pub trait Params: Copy + std::fmt::Debug + Default + Send + 'static {
    /// The sampler they drive.
    const KIND: SamplerKind;
    /// ε = η·N, the step on the mean loss's gradient.
    fn lr(&self) -> f64;
    /// The same with ε = `lr`.
    fn with_lr(self, lr: f64) -> Self;
    /// The sampler's parameters in the papers' variables for N = `data_size` examples:
    /// η = [`Params::step_size_of`] `lr`, the other fields as given.
    fn sampler_params(&self, data_size: usize) -> SamplerParams;
    /// η for `lr` on N = `data_size` examples: lr/N, the step on the mean loss's gradient
    /// made a step on ∇U's.
    fn step_size_of(lr: f64, data_size: usize) -> f64 {
        lr / data_size as f64
    }
    /// `lr` for η on N examples, the inverse of [`Params::step_size_of`]: η·N.
    fn lr_of(step_size: f64, data_size: usize) -> f64 {
        step_size * data_size as f64
    }
}

/// The parameters of a sampler whose only hyper-parameter is its step.
macro_rules! lr_params {
    ($(#[$doc:meta])* $name:ident, $kind:expr, $variant:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq)]
        pub struct $name {
            /// ε = η·N.
            pub lr: f64,
        }

        impl Default for $name {
            fn default() -> Self {
                $name {
                    lr: default_lr($kind),
                }
            }
        }

        impl Params for $name {
            const KIND: SamplerKind = $kind;
            fn lr(&self) -> f64 {
                self.lr
            }
            fn with_lr(self, lr: f64) -> Self {
                $name { lr }
            }
            fn sampler_params(&self, n: usize) -> SamplerParams {
                SamplerParams::$variant {
                    step_size: Self::step_size_of(self.lr, n),
                }
            }
        }
    };
}

lr_params!(
    /// SGLD (Welling & Teh 2011): θ ← θ − η∇Ũ + √(2η)·z.
    SgldParams,
    SamplerKind::Sgld,
    Sgld
);

/// SGLD as an optimizer (Welling & Teh 2011).
///
/// ```
/// use bnn_core::{Config, Optimizer, Sgld, SgldParams};
/// # fn main() -> candle_core::Result<()> {
/// let w = candle_core::Var::zeros(3, candle_core::DType::F32, &candle_core::Device::Cpu)?;
/// let config = Config { dynamics: SgldParams { lr: 0.01 }, ..Config::new(100) };
/// let mut sgld = Sgld::new(vec![w.clone()], config)?;
/// // A Gaussian likelihood centred on 1: the mean loss ½(w − 1)².
/// sgld.backward_step(&((w.as_tensor() - 1.0)?.sqr()?.sum_all()? * 0.5)?)?;
/// assert_eq!(sgld.steps(), 1);
/// # Ok(())
/// # }
/// ```
pub type Sgld = SgMcmc<SgldParams>;

/// pSGLD (Li, Chen, Carlson & Carin 2016): SGLD with RMSprop's diagonal preconditioner
/// G = 1/(λ + √V), V ← βV + (1 − β)∇Ũ⊙∇Ũ; θ ← θ − ηG∇Ũ + √(2ηG)·z
/// ([`SamplerParams::Psgld`]).
///
/// **Its `lr` is η itself**, RMSprop's learning rate: G ≈ 1/|∇Ũ| takes the gradient's scale
/// out of the drift, so the step on the mean loss and on ∇U are the same step in θ (for
/// the other samplers lr = η·N).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PsgldParams {
    /// ε = η, the drift's step in θ.
    pub lr: f64,
    /// β in [0, 1), the decay of the second moments V (the paper's α = 0.99).
    pub decay: f64,
    /// λ > 0, the preconditioner's damping, in the units of ∇Ũ = N·∇(mean loss) + prior:
    /// the paper's 10⁻⁵ on the mean gradient is 10⁻⁵·N here (the default, 0.6, is it at
    /// MNIST's N; [`crate::sampler::params::PSGLD_DAMPING`]).
    pub damping: f64,
}

impl Default for PsgldParams {
    fn default() -> Self {
        PsgldParams {
            lr: crate::sampler::params::PSGLD_STEP_SIZE,
            decay: crate::sampler::params::PSGLD_DECAY,
            damping: crate::sampler::params::PSGLD_DAMPING,
        }
    }
}

impl Params for PsgldParams {
    const KIND: SamplerKind = SamplerKind::Psgld;
    fn lr(&self) -> f64 {
        self.lr
    }
    fn with_lr(self, lr: f64) -> Self {
        PsgldParams { lr, ..self }
    }
    fn sampler_params(&self, n: usize) -> SamplerParams {
        SamplerParams::Psgld {
            step_size: Self::step_size_of(self.lr, n),
            decay: self.decay,
            damping: self.damping,
        }
    }
    /// η = lr: the preconditioner makes the step independent of the gradient's scale.
    fn step_size_of(lr: f64, _data_size: usize) -> f64 {
        lr
    }
    fn lr_of(step_size: f64, _data_size: usize) -> f64 {
        step_size
    }
}

/// pSGLD as an optimizer (Li et al. 2016): SGLD preconditioned by RMSprop.
///
/// ```
/// use bnn_core::{Config, Optimizer, Psgld, PsgldParams};
/// # fn main() -> candle_core::Result<()> {
/// let w = candle_core::Var::zeros(3, candle_core::DType::F32, &candle_core::Device::Cpu)?;
/// let config = Config { dynamics: PsgldParams { lr: 1e-3, ..Default::default() }, ..Config::new(100) };
/// let mut psgld = Psgld::new(vec![w.clone()], config)?;
/// psgld.backward_step(&((w.as_tensor() - 1.0)?.sqr()?.sum_all()? * 0.5)?)?;
/// assert_eq!(psgld.state()?.sampler.family(), "pSGLD");
/// # Ok(())
/// # }
/// ```
pub type Psgld = SgMcmc<PsgldParams>;
lr_params!(
    /// SGD on U, the MAP baseline: θ ← θ − η∇Ũ.
    SgdParams,
    SamplerKind::Sgd,
    Sgd
);

/// SGD on U, the MAP baseline.
///
/// ```
/// use bnn_core::{Config, Optimizer, Sgd};
/// # fn main() -> candle_core::Result<()> {
/// let w = candle_core::Var::zeros(1, candle_core::DType::F32, &candle_core::Device::Cpu)?;
/// let mut sgd = Sgd::new(vec![w.clone()], Config::new(1))?;
/// sgd.backward_step(&((w.as_tensor() - 1.0)?.sqr()?.sum_all()? * 0.5)?)?;
/// assert!(w.as_tensor().to_vec1::<f32>()?[0] > 0.0);
/// # Ok(())
/// # }
/// ```
pub type Sgd = SgMcmc<SgdParams>;

/// SGHMC (Chen et al. 2014, eq. 15): v ← v − η∇Ũ − αv + √(2(α − β̂)η)·z; θ ← θ + v.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SghmcParams {
    /// ε = η·N.
    pub lr: f64,
    /// α = ξ·h, the friction, in [0, 1] (0 is Chen et al.'s naive SGHMC).
    pub friction: f64,
    /// β̂, the gradient-noise estimate subtracted from the injected noise, in [0, α].
    pub noise_estimate: f64,
    /// Euler (the paper's update) or the symmetric splitting.
    pub integrator: Integrator,
}

impl Default for SghmcParams {
    fn default() -> Self {
        let d = SamplerKind::Sghmc.defaults();
        SghmcParams {
            lr: default_lr(SamplerKind::Sghmc),
            friction: d.friction,
            noise_estimate: d.noise_estimate,
            integrator: d.integrator,
        }
    }
}

impl Params for SghmcParams {
    const KIND: SamplerKind = SamplerKind::Sghmc;
    fn lr(&self) -> f64 {
        self.lr
    }
    fn with_lr(self, lr: f64) -> Self {
        SghmcParams { lr, ..self }
    }
    fn sampler_params(&self, n: usize) -> SamplerParams {
        SamplerParams::Sghmc {
            step_size: Self::step_size_of(self.lr, n),
            friction: self.friction,
            noise_estimate: self.noise_estimate,
            integrator: self.integrator,
        }
    }
}

/// SGHMC as an optimizer (Chen et al. 2014).
///
/// ```
/// use bnn_core::{Config, Integrator, Optimizer, Sghmc, SghmcParams};
/// # fn main() -> candle_core::Result<()> {
/// let w = candle_core::Var::zeros(3, candle_core::DType::F32, &candle_core::Device::Cpu)?;
/// let dynamics = SghmcParams { friction: 0.05, integrator: Integrator::Splitting, ..Default::default() };
/// let mut sghmc = Sghmc::new(vec![w.clone()], Config { dynamics, ..Config::new(100) })?;
/// sghmc.backward_step(&((w.as_tensor() - 1.0)?.sqr()?.sum_all()? * 0.5)?)?;
/// assert_eq!(sghmc.config().dynamics.friction, 0.05);
/// # Ok(())
/// # }
/// ```
pub type Sghmc = SgMcmc<SghmcParams>;

/// The thermostat samplers' parameters: SGNHT (Ding et al. 2014, Alg. 2, one scalar
/// thermostat α ← α + vᵀv/n − η) and mSGNHT (Li et al. 2016, eq. 2, one per element).
macro_rules! thermostat_params {
    ($(#[$doc:meta])* $name:ident, $kind:expr, $variant:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq)]
        pub struct $name {
            /// ε = η·N.
            pub lr: f64,
            /// a = A·h, the injected noise's diffusion (also the thermostat's start), ≥ 0.
            pub diffusion: f64,
            /// The symmetric splitting (default, Li et al. 2016 §3) or Euler.
            pub integrator: Integrator,
        }

        impl Default for $name {
            fn default() -> Self {
                let d = $kind.defaults();
                $name {
                    lr: default_lr($kind),
                    diffusion: d.diffusion,
                    integrator: d.integrator,
                }
            }
        }

        impl Params for $name {
            const KIND: SamplerKind = $kind;
            fn lr(&self) -> f64 {
                self.lr
            }
            fn with_lr(self, lr: f64) -> Self {
                $name { lr, ..self }
            }
            fn sampler_params(&self, n: usize) -> SamplerParams {
                SamplerParams::$variant {
                    step_size: Self::step_size_of(self.lr, n),
                    diffusion: self.diffusion,
                    integrator: self.integrator,
                }
            }
        }
    };
}

thermostat_params!(
    /// SGNHT (Ding et al. 2014): one scalar thermostat α ← α + vᵀv/n − η.
    SgnhtParams,
    SamplerKind::Sgnht,
    Sgnht
);

/// SGNHT as an optimizer (Ding et al. 2014), the splitting integrator by default.
///
/// ```
/// use bnn_core::{Config, Optimizer, Sgnht};
/// # fn main() -> candle_core::Result<()> {
/// let w = candle_core::Var::zeros(3, candle_core::DType::F32, &candle_core::Device::Cpu)?;
/// let mut sgnht = Sgnht::new(vec![w.clone()], Config::new(100))?;
/// sgnht.backward_step(&((w.as_tensor() - 1.0)?.sqr()?.sum_all()? * 0.5)?)?;
/// // The thermostat α = ξ·h, reported after each update.
/// assert!(sgnht.diagnostics().thermostat.is_some());
/// # Ok(())
/// # }
/// ```
pub type Sgnht = SgMcmc<SgnhtParams>;
thermostat_params!(
    /// mSGNHT (Li et al. 2016, eq. 2): one thermostat per element, α ← α + v⊙v − η.
    MsgnhtParams,
    SamplerKind::Msgnht,
    Msgnht
);

/// mSGNHT as an optimizer (Li et al. 2016): a thermostat per element.
///
/// ```
/// use bnn_core::{Config, Msgnht, MsgnhtParams, Optimizer};
/// # fn main() -> candle_core::Result<()> {
/// let w = candle_core::Var::zeros(3, candle_core::DType::F32, &candle_core::Device::Cpu)?;
/// let config = Config { dynamics: MsgnhtParams { diffusion: 0.2, ..Default::default() }, ..Config::new(100) };
/// let mut msgnht = Msgnht::new(vec![w.clone()], config)?;
/// msgnht.backward_step(&((w.as_tensor() - 1.0)?.sqr()?.sum_all()? * 0.5)?)?;
/// assert_eq!(msgnht.state()?.sampler.family(), "mSGNHT");
/// # Ok(())
/// # }
/// ```
pub type Msgnht = SgMcmc<MsgnhtParams>;

/// SGD with momentum on U, a MAP baseline: v ← (1 − α)v − η∇Ũ; θ ← θ + v.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MomentumParams {
    /// ε = η·N.
    pub lr: f64,
    /// α, in (0, 1].
    pub friction: f64,
}

impl Default for MomentumParams {
    fn default() -> Self {
        MomentumParams {
            lr: default_lr(SamplerKind::Momentum),
            friction: SamplerKind::Momentum.defaults().friction,
        }
    }
}

impl Params for MomentumParams {
    const KIND: SamplerKind = SamplerKind::Momentum;
    fn lr(&self) -> f64 {
        self.lr
    }
    fn with_lr(self, lr: f64) -> Self {
        MomentumParams { lr, ..self }
    }
    fn sampler_params(&self, n: usize) -> SamplerParams {
        SamplerParams::Momentum {
            step_size: Self::step_size_of(self.lr, n),
            friction: self.friction,
        }
    }
}

/// SGD with momentum on U, a MAP baseline.
///
/// ```
/// use bnn_core::{Config, Momentum, MomentumParams, Optimizer};
/// # fn main() -> candle_core::Result<()> {
/// let w = candle_core::Var::zeros(1, candle_core::DType::F32, &candle_core::Device::Cpu)?;
/// let config = Config { dynamics: MomentumParams { lr: 0.1, friction: 0.5 }, ..Config::new(1) };
/// let mut momentum = Momentum::new(vec![w.clone()], config)?;
/// momentum.backward_step(&((w.as_tensor() - 1.0)?.sqr()?.sum_all()? * 0.5)?)?;
/// assert_eq!(momentum.steps(), 1);
/// # Ok(())
/// # }
/// ```
pub type Momentum = SgMcmc<MomentumParams>;
