//! A run's method as a type: [`SamplerParams`], one variant per minibatch update rule with
//! only its own hyper-parameters, and [`Method`], which says how a run goes (one chain of
//! such a rule, replicas of one on a ladder, or full-batch HMC).
//!
//! [`SamplerConfig`] stays the flat record that `run.json`, presets and the flags write
//! (every field of every sampler, so that older runs read back unchanged); it is turned
//! into these types once, by [`SamplerConfig::method`] and [`SamplerConfig::params`], which
//! refuse what does not belong to the sampler named (the splitting integrator for SGLD,
//! say). Everything that steps reads the typed form, so SGLD cannot see a friction.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The sampler families of the CLI.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum SamplerKind {
    /// Stochastic gradient Langevin dynamics (Welling & Teh 2011).
    Sgld,
    /// Stochastic gradient HMC with friction (Chen et al. 2014).
    Sghmc,
    /// Stochastic gradient Nosé–Hoover thermostat, scalar thermostat (Ding et al. 2014).
    Sgnht,
    /// SGNHT with one thermostat per parameter element (Gan et al. 2015; Li et al. 2016).
    Msgnht,
    /// Preconditioned SGLD (Li, Chen, Carlson & Carin 2016): SGLD with RMSprop's diagonal
    /// preconditioner.
    Psgld,
    /// Plain SGD on U (MAP baseline).
    Sgd,
    /// SGD with momentum on U (MAP baseline).
    Momentum,
    /// Replica-exchange Nosé–Hoover dynamics (Luo et al. 2018): SGNHT (Euler) replicas on
    /// a temperature ladder, swapped by a noise-tolerant test ([`crate::engine::exchange`], [`super::ladder`]).
    Renhd,
    /// Replica-exchange Langevin dynamics: the same ladder and exchanges with Langevin
    /// (SGHMC, constant friction) replicas (Luo et al. §4.2's baseline).
    Reld,
    /// Full-batch Hamiltonian Monte Carlo with a Metropolis–Hastings correction
    /// ([`crate::hmc`]): the reference the stochastic-gradient samplers are measured
    /// against; its step size adapts in burn-in. Not a minibatch update rule.
    Hmc,
}

impl SamplerKind {
    /// The name as typed (`sghmc`) and recorded in `run.json`.
    pub fn name(self) -> &'static str {
        match self {
            SamplerKind::Sgld => "sgld",
            SamplerKind::Psgld => "psgld",
            SamplerKind::Sghmc => "sghmc",
            SamplerKind::Sgnht => "sgnht",
            SamplerKind::Msgnht => "msgnht",
            SamplerKind::Sgd => "sgd",
            SamplerKind::Momentum => "momentum",
            SamplerKind::Renhd => "renhd",
            SamplerKind::Reld => "reld",
            SamplerKind::Hmc => "hmc",
        }
    }

    /// Arrays of one value per parameter that its state keeps besides θ: none for SGLD,
    /// SGD and HMC (whose momentum is drawn afresh each trajectory), the momentum p for
    /// SGHMC, SGNHT, momentum and the replicas' samplers, and mSGNHT's thermostat ξ per
    /// element besides; pSGLD's second moment V.
    pub fn state_arrays(self) -> usize {
        match self {
            SamplerKind::Sgld | SamplerKind::Sgd | SamplerKind::Hmc => 0,
            SamplerKind::Psgld
            | SamplerKind::Sghmc
            | SamplerKind::Sgnht
            | SamplerKind::Momentum
            | SamplerKind::Renhd
            | SamplerKind::Reld => 1,
            SamplerKind::Msgnht => 2,
        }
    }

    /// Whether its friction is a thermostat ξ driven by the kinetic energy, with the
    /// diffusion a as its noise (SGNHT, mSGNHT and RENHD's replicas), rather than a
    /// constant friction (SGHMC, RELD's replicas, momentum) or none.
    pub fn is_thermostat(self) -> bool {
        match self {
            SamplerKind::Sgnht | SamplerKind::Msgnht | SamplerKind::Renhd => true,
            SamplerKind::Sgld
            | SamplerKind::Psgld
            | SamplerKind::Sghmc
            | SamplerKind::Sgd
            | SamplerKind::Momentum
            | SamplerKind::Reld
            | SamplerKind::Hmc => false,
        }
    }

    /// Whether it runs replicas on a temperature ladder.
    pub fn is_replica_exchange(self) -> bool {
        self.replica_kind() != self
    }

    /// The sampler each replica runs: SGNHT for RENHD, SGHMC for RELD; itself otherwise.
    pub fn replica_kind(self) -> SamplerKind {
        match self {
            SamplerKind::Renhd => SamplerKind::Sgnht,
            SamplerKind::Reld => SamplerKind::Sghmc,
            SamplerKind::Sgld
            | SamplerKind::Psgld
            | SamplerKind::Sghmc
            | SamplerKind::Sgnht
            | SamplerKind::Msgnht
            | SamplerKind::Sgd
            | SamplerKind::Momentum
            | SamplerKind::Hmc => self,
        }
    }

    /// Splitting for the thermostat samplers (Li et al. 2016), Euler otherwise.
    pub fn default_integrator(self) -> Integrator {
        match self {
            SamplerKind::Sgnht | SamplerKind::Msgnht => Integrator::Splitting,
            SamplerKind::Sgld
            | SamplerKind::Psgld
            | SamplerKind::Sghmc
            | SamplerKind::Sgd
            | SamplerKind::Momentum
            | SamplerKind::Renhd
            | SamplerKind::Reld
            | SamplerKind::Hmc => Integrator::Euler,
        }
    }

    /// Whether it is one of the samplers of [`crate::engine::dynamics`] (fused on the CPU
    /// and on CUDA, and so stackable as K chains in one op): not a MAP baseline, replica
    /// exchange or HMC.
    pub fn is_dynamics(self) -> bool {
        match self {
            SamplerKind::Sgld
            | SamplerKind::Psgld
            | SamplerKind::Sghmc
            | SamplerKind::Sgnht
            | SamplerKind::Msgnht => true,
            SamplerKind::Sgd
            | SamplerKind::Momentum
            | SamplerKind::Renhd
            | SamplerKind::Reld
            | SamplerKind::Hmc => false,
        }
    }

    /// Its step size for a data set of `to` examples from a step size tuned on `from`: η·N
    /// carries over (the step on the mean loss) for a sampler whose drift is η∇Ũ, η·√N
    /// for pSGLD, whose drift ηG∇Ũ is a step in θ (G ≈ 1/|∇Ũ|) and so must shrink with
    /// the posterior's width, ∝ 1/√N.
    pub fn carry_step_size(self, step_size: f64, from: f64, to: f64) -> f64 {
        let ratio = from / to.max(1.0);
        match self {
            SamplerKind::Psgld => step_size * ratio.sqrt(),
            SamplerKind::Sgld
            | SamplerKind::Sghmc
            | SamplerKind::Sgnht
            | SamplerKind::Msgnht
            | SamplerKind::Sgd
            | SamplerKind::Momentum
            | SamplerKind::Renhd
            | SamplerKind::Reld
            | SamplerKind::Hmc => step_size * ratio,
        }
    }

    /// Whether it draws posterior samples (as opposed to optimising).
    pub fn is_sampler(self) -> bool {
        !matches!(self, SamplerKind::Sgd | SamplerKind::Momentum)
    }

    /// Default hyper-parameters, tuned for the MNIST MLPs at batch 100 (see README).
    pub fn defaults(self) -> SamplerConfig {
        let base = SamplerConfig {
            kind: self,
            step_size: 1e-6,
            friction: 0.0,
            noise_estimate: 0.0,
            diffusion: 0.0,
            integrator: self.default_integrator(),
            rms_decay: None,
            rms_damping: None,
        };
        match self {
            SamplerKind::Sgld => SamplerConfig {
                step_size: 5e-6,
                ..base
            },
            // pSGLD's η multiplies G·∇Ũ with G ≈ 1/|∇Ũ| elementwise: a step in θ itself.
            SamplerKind::Psgld => SamplerConfig {
                step_size: PSGLD_STEP_SIZE,
                rms_decay: Some(PSGLD_DECAY),
                rms_damping: Some(PSGLD_DAMPING),
                ..base
            },
            SamplerKind::Sghmc => SamplerConfig {
                step_size: 2e-6,
                friction: 0.1,
                ..base
            },
            // RENHD's c is its diffusion, RELD's its friction (at T = 1).
            SamplerKind::Sgnht | SamplerKind::Msgnht | SamplerKind::Renhd => SamplerConfig {
                step_size: 2e-6,
                diffusion: 0.1,
                ..base
            },
            SamplerKind::Reld => SamplerConfig {
                step_size: 2e-6,
                friction: 0.1,
                ..base
            },
            // Without momentum's 1/α amplification, SGD needs a larger η to move as far.
            SamplerKind::Sgd => SamplerConfig {
                step_size: 1e-5,
                ..base
            },
            SamplerKind::Momentum => SamplerConfig {
                step_size: 2e-6,
                friction: 0.1,
                ..base
            },
            // HMC's ε is its first leapfrog step (burn-in adapts it): on the full-data
            // potential, whose curvature is N times a minibatch mean's.
            SamplerKind::Hmc => SamplerConfig {
                step_size: 1e-3,
                ..base
            },
        }
    }
}

/// How the continuous dynamics is discretised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Integrator {
    /// First order: the papers' original updates (Chen et al. eq. 15; Ding et al. Alg. 2).
    Euler,
    /// Second-order symmetric splitting A–B–O–B–A (Li et al. 2016 §3).
    Splitting,
}

/// A sampler's hyper-parameters as one flat record, every sampler's fields in it: what
/// `run.json`, presets and the flags write, read as the sampler it names by
/// [`SamplerConfig::method`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SamplerConfig {
    /// Which sampler.
    pub kind: SamplerKind,
    /// η = h²: multiplies the gradient of U.
    pub step_size: f64,
    /// α = ξ·h: friction (SGHMC, momentum); initial thermostat for SGNHT is `diffusion`.
    pub friction: f64,
    /// β̂: estimate of the gradient-noise variance term, subtracted from the injected
    /// noise (SGHMC; Chen et al. eq. 15).
    pub noise_estimate: f64,
    /// a = A·h: diffusion of SGNHT (Ding et al. Alg. 2).
    pub diffusion: f64,
    /// Euler or symmetric splitting (SGHMC, SGNHT, mSGNHT).
    #[serde(default = "euler")]
    pub integrator: Integrator,
    /// β: pSGLD's decay of its second-moment average V (absent: [`PSGLD_DECAY`]; other
    /// samplers have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rms_decay: Option<f64>,
    /// λ: pSGLD's damping of its preconditioner G = 1/(λ + √V), in ∇Ũ's units (absent:
    /// [`PSGLD_DAMPING`]; other samplers have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rms_damping: Option<f64>,
}

fn euler() -> Integrator {
    Integrator::Euler
}

/// A minibatch sampler (or MAP baseline) and its hyper-parameters, in the v-form variables
/// of the module note of [`crate::sampler`]: η = h², α = ξ·h, β̂ = B̂·h, a = A·h.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SamplerParams {
    /// SGLD (Welling & Teh 2011): θ ← θ − η∇Ũ + √(2η)·z.
    Sgld {
        /// η.
        step_size: f64,
    },
    /// pSGLD (Li, Chen, Carlson & Carin 2016, Alg. 1): SGLD preconditioned by RMSprop's
    /// diagonal G = 1/(λ + √V), V ← βV + (1 − β)∇Ũ⊙∇Ũ, θ ← θ − ηG∇Ũ + √(2ηG)·z. The
    /// paper's Γ(θ) = ∇·G term is omitted, as in its experiments (§3: it is of order
    /// (1 − β) and the paper drops it); V starts at 0 as in Algorithm 1.
    ///
    /// V is formed from the gradient the sampler is given (of Ũ = N·mean + prior, over T),
    /// where the paper forms it from the mean likelihood gradient ḡ: so G here is the
    /// paper's over N (λ in ∇Ũ's units: the paper's λ·N), and η = ε·N/2 for the paper's
    /// ε. Since G ≈ 1/|∇Ũ|, η is a step in θ whatever the data size.
    Psgld {
        /// η.
        step_size: f64,
        /// β in [0, 1): the second moments' decay (the paper's α, 0.99).
        decay: f64,
        /// λ > 0: the preconditioner's damping, in ∇Ũ's units (the paper's 10⁻⁵ is on the
        /// mean gradient: 10⁻⁵·N here).
        damping: f64,
    },
    /// SGHMC (Chen et al. 2014, eq. 15): v ← v − η∇Ũ − αv + √(2(α − β̂)η)·z; θ ← θ + v.
    Sghmc {
        /// η.
        step_size: f64,
        /// α, in [0, 1] (0 is Chen et al.'s naive SGHMC, §3.1).
        friction: f64,
        /// β̂, in [0, α]: the gradient noise subtracted from the injected noise.
        noise_estimate: f64,
        /// Euler (the paper's update) or the symmetric splitting.
        integrator: Integrator,
    },
    /// SGNHT (Ding et al. 2014, Alg. 2): one scalar thermostat α ← α + vᵀv/n − η.
    Sgnht {
        /// η.
        step_size: f64,
        /// a ≥ 0: the injected noise's diffusion, and the thermostat's start.
        diffusion: f64,
        /// The symmetric splitting (Li et al. 2016 §3) or Euler.
        integrator: Integrator,
    },
    /// mSGNHT (Li et al. 2016, eq. 2): one thermostat per element, α ← α + v⊙v − η.
    Msgnht {
        /// η.
        step_size: f64,
        /// a ≥ 0.
        diffusion: f64,
        /// The symmetric splitting or Euler.
        integrator: Integrator,
    },
    /// SGD on U (MAP baseline): θ ← θ − η∇Ũ.
    Sgd {
        /// η.
        step_size: f64,
    },
    /// SGD with momentum on U (MAP baseline): v ← (1 − α)v − η∇Ũ; θ ← θ + v.
    Momentum {
        /// η.
        step_size: f64,
        /// α, in (0, 1].
        friction: f64,
    },
}

/// pSGLD's default η on the MNIST MLPs at batch 100 ([`SamplerKind::defaults`]): the
/// best validation NLL of 784-400-400-10 (seed 0, the last 10,000 training images held
/// out) among 3·10⁻⁴ … 10⁻² (docs/BENCHMARKS.md, "pSGLD against SGLD").
pub const PSGLD_STEP_SIZE: f64 = 1e-3;
/// pSGLD's β, Li et al. 2016's α = 0.99: V averages the last ~100 squared gradients.
pub const PSGLD_DECAY: f64 = 0.99;
/// pSGLD's λ in the units of ∇Ũ: Li et al. 2016's 10⁻⁵ on the mean likelihood gradient,
/// times MNIST's N = 60,000. Why not 10⁻⁵ itself: a weight the data never reach (a border
/// pixel's) has a gradient of the prior's size alone, so G = 1/(λ + √V) lets it diffuse
/// by √(2η/λ) per update; at λ = 10⁻⁵ those weights wander off and the Gamma hyper-prior's
/// draw widens every weight's prior (MNIST 784-400-400-10, seed 0, η = 10⁻³: validation
/// NLL 0.089 at λ = 10⁻⁵, 0.078 at 0.6).
pub const PSGLD_DAMPING: f64 = 0.6;

/// How a run goes: the one place where the kinds are sorted into methods, so that a new
/// kind is placed here and every dispatch on a run follows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Method {
    /// Minibatch updates of one chain (or K chains apart or stacked).
    Chain(SamplerParams),
    /// Replicas on a temperature ladder, swapped by a noise-tolerant test (Luo et al.
    /// 2018): RENHD's SGNHT or RELD's SGHMC replicas.
    ReplicaExchange {
        /// RENHD or RELD.
        kind: SamplerKind,
        /// The replica's sampler at T = 1 (ε, and c as its diffusion or friction; Euler as
        /// in the paper's Algorithm 2); [`super::replica::replica_params`] sets it for a
        /// rung's T.
        replica: SamplerParams,
    },
    /// Full-batch HMC with a Metropolis–Hastings correction ([`crate::hmc`]).
    Hmc {
        /// ε of the first leapfrog step (burn-in adapts it).
        step_size: f64,
    },
}

impl SamplerKind {
    /// The fields of the [`SamplerConfig`] record that this kind reads besides `step_size`
    /// and `integrator` (the rest it ignores): what a flag or a preset may set for it.
    pub fn own_fields(self) -> &'static [&'static str] {
        match self {
            SamplerKind::Sghmc => &["friction", "noise_estimate"],
            SamplerKind::Momentum | SamplerKind::Reld => &["friction"],
            SamplerKind::Sgnht | SamplerKind::Msgnht | SamplerKind::Renhd => &["diffusion"],
            SamplerKind::Psgld => &["rms_decay", "rms_damping"],
            SamplerKind::Sgld | SamplerKind::Sgd | SamplerKind::Hmc => &[],
        }
    }
}

impl SamplerParams {
    /// Which sampler.
    pub fn kind(&self) -> SamplerKind {
        match self {
            SamplerParams::Sgld { .. } => SamplerKind::Sgld,
            SamplerParams::Psgld { .. } => SamplerKind::Psgld,
            SamplerParams::Sghmc { .. } => SamplerKind::Sghmc,
            SamplerParams::Sgnht { .. } => SamplerKind::Sgnht,
            SamplerParams::Msgnht { .. } => SamplerKind::Msgnht,
            SamplerParams::Sgd { .. } => SamplerKind::Sgd,
            SamplerParams::Momentum { .. } => SamplerKind::Momentum,
        }
    }

    /// η.
    pub fn step_size(&self) -> f64 {
        match *self {
            SamplerParams::Sgld { step_size }
            | SamplerParams::Psgld { step_size, .. }
            | SamplerParams::Sghmc { step_size, .. }
            | SamplerParams::Sgnht { step_size, .. }
            | SamplerParams::Msgnht { step_size, .. }
            | SamplerParams::Sgd { step_size }
            | SamplerParams::Momentum { step_size, .. } => step_size,
        }
    }

    /// The same with η = `eta`.
    pub fn with_step_size(mut self, eta: f64) -> Self {
        match &mut self {
            SamplerParams::Sgld { step_size }
            | SamplerParams::Psgld { step_size, .. }
            | SamplerParams::Sghmc { step_size, .. }
            | SamplerParams::Sgnht { step_size, .. }
            | SamplerParams::Msgnht { step_size, .. }
            | SamplerParams::Sgd { step_size }
            | SamplerParams::Momentum { step_size, .. } => *step_size = eta,
        }
        self
    }

    /// The integrator: Euler for the samplers that have no other.
    pub fn integrator(&self) -> Integrator {
        match *self {
            SamplerParams::Sghmc { integrator, .. }
            | SamplerParams::Sgnht { integrator, .. }
            | SamplerParams::Msgnht { integrator, .. } => integrator,
            SamplerParams::Sgld { .. }
            | SamplerParams::Psgld { .. }
            | SamplerParams::Sgd { .. }
            | SamplerParams::Momentum { .. } => Integrator::Euler,
        }
    }

    /// The default hyper-parameters of `kind` ([`SamplerKind::defaults`]); an error for a
    /// kind that is not one minibatch update rule.
    pub fn defaults(kind: SamplerKind) -> Result<Self> {
        kind.defaults().params()
    }

    /// Checks the hyper-parameters; an [`Error::Invalid`] names the quantity in the
    /// library's words (the `bnn` binary names its flag).
    pub fn validate(&self) -> Result<()> {
        self.validate_as(self.kind().name())
    }

    /// [`SamplerParams::validate`] with the rules naming `name` (a replica's run).
    fn validate_as(&self, name: &str) -> Result<()> {
        let invalid = |name, rule: String, value| Err(Error::Invalid { name, rule, value });
        let eta = self.step_size();
        if !(eta > 0.0 && eta.is_finite()) {
            return invalid("step size", "positive and finite".into(), eta);
        }
        match *self {
            // SGHMC with α = 0 is Chen et al.'s "naive SGHMC" (§3.1): no friction and no
            // injected noise; allowed, to reproduce how it fails.
            SamplerParams::Sghmc {
                friction,
                noise_estimate,
                ..
            } => {
                if !(0.0..=1.0).contains(&friction) {
                    return invalid("friction", format!("in [0, 1] for {name}"), friction);
                }
                if !(noise_estimate >= 0.0 && noise_estimate <= friction) {
                    let rule = format!("in [0, friction={friction}]");
                    return invalid("noise estimate", rule, noise_estimate);
                }
            }
            SamplerParams::Momentum { friction, .. } => {
                if !(f64::MIN_POSITIVE..=1.0).contains(&friction) {
                    return invalid("friction", format!("in (0, 1] for {name}"), friction);
                }
            }
            // a = 0 is allowed: all the noise then comes from the gradient (Ding et al.
            // Fig. 1, A = 0), which the thermostat absorbs.
            SamplerParams::Sgnht { diffusion, .. } | SamplerParams::Msgnht { diffusion, .. } => {
                if !(diffusion >= 0.0 && diffusion.is_finite()) {
                    return invalid("diffusion", format!("non-negative for {name}"), diffusion);
                }
            }
            SamplerParams::Psgld { decay, damping, .. } => {
                if !(0.0..1.0).contains(&decay) {
                    return invalid("rms decay", format!("in [0, 1) for {name}"), decay);
                }
                if !(damping > 0.0 && damping.is_finite()) {
                    return invalid("rms damping", format!("positive for {name}"), damping);
                }
            }
            SamplerParams::Sgld { .. } | SamplerParams::Sgd { .. } => {}
        }
        Ok(())
    }

    /// A MAP baseline's (η, friction): SGD's (η, none) and momentum's (η, α); `None` for
    /// the samplers of [`crate::engine::dynamics`].
    pub fn map_baseline(&self) -> Option<(f64, Option<f64>)> {
        match *self {
            SamplerParams::Sgd { step_size } => Some((step_size, None)),
            SamplerParams::Momentum {
                step_size,
                friction,
            } => Some((step_size, Some(friction))),
            SamplerParams::Sgld { .. }
            | SamplerParams::Psgld { .. }
            | SamplerParams::Sghmc { .. }
            | SamplerParams::Sgnht { .. }
            | SamplerParams::Msgnht { .. } => None,
        }
    }

    /// The sampler a replica of `kind` runs ([`SamplerKind::replica_kind`]), Euler as in
    /// Luo et al.'s Algorithm 2, with η = `step_size` and c = `c` as its diffusion
    /// (RENHD's SGNHT, or mSGNHT with `per_element` thermostats) or its friction (RELD's
    /// SGHMC); an error for a kind that runs no replicas.
    pub fn replica(kind: SamplerKind, per_element: bool, step_size: f64, c: f64) -> Result<Self> {
        let integrator = Integrator::Euler;
        Ok(match kind {
            SamplerKind::Reld => SamplerParams::Sghmc {
                step_size,
                friction: c,
                noise_estimate: 0.0,
                integrator,
            },
            SamplerKind::Renhd if per_element => SamplerParams::Msgnht {
                step_size,
                diffusion: c,
                integrator,
            },
            SamplerKind::Renhd => SamplerParams::Sgnht {
                step_size,
                diffusion: c,
                integrator,
            },
            SamplerKind::Sgld
            | SamplerKind::Psgld
            | SamplerKind::Sghmc
            | SamplerKind::Sgnht
            | SamplerKind::Msgnht
            | SamplerKind::Sgd
            | SamplerKind::Momentum
            | SamplerKind::Hmc => {
                return Err(Error::Config(format!("{} runs no replicas", kind.name())))
            }
        })
    }

    /// c of a replica's sampler: its friction (SGHMC, momentum) or diffusion (SGNHT,
    /// mSGNHT); 0 for a sampler that has neither.
    pub fn replica_c(&self) -> f64 {
        match *self {
            SamplerParams::Sghmc { friction, .. } | SamplerParams::Momentum { friction, .. } => {
                friction
            }
            SamplerParams::Sgnht { diffusion, .. } | SamplerParams::Msgnht { diffusion, .. } => {
                diffusion
            }
            SamplerParams::Sgld { .. }
            | SamplerParams::Psgld { .. }
            | SamplerParams::Sgd { .. } => 0.0,
        }
    }

    /// The flat record of these parameters (the fields another sampler has at their
    /// defaults' zero): what `run.json` writes.
    pub fn record(&self) -> SamplerConfig {
        let base = SamplerConfig {
            kind: self.kind(),
            step_size: self.step_size(),
            friction: 0.0,
            noise_estimate: 0.0,
            diffusion: 0.0,
            integrator: self.integrator(),
            rms_decay: None,
            rms_damping: None,
        };
        match *self {
            SamplerParams::Sghmc {
                friction,
                noise_estimate,
                ..
            } => SamplerConfig {
                friction,
                noise_estimate,
                ..base
            },
            SamplerParams::Momentum { friction, .. } => SamplerConfig { friction, ..base },
            SamplerParams::Sgnht { diffusion, .. } | SamplerParams::Msgnht { diffusion, .. } => {
                SamplerConfig { diffusion, ..base }
            }
            SamplerParams::Psgld { decay, damping, .. } => SamplerConfig {
                rms_decay: Some(decay),
                rms_damping: Some(damping),
                ..base
            },
            SamplerParams::Sgld { .. } | SamplerParams::Sgd { .. } => base,
        }
    }
}

impl SamplerConfig {
    /// The record read as the run's method: the sampler it names with only that sampler's
    /// fields, checked. An error for the splitting integrator where it does not apply.
    pub fn method(&self) -> Result<Method> {
        let c = *self;
        let euler_only = || c.euler_only();
        let step_size = c.step_size;
        let params = match c.kind {
            SamplerKind::Sghmc => SamplerParams::Sghmc {
                step_size,
                friction: c.friction,
                noise_estimate: c.noise_estimate,
                integrator: c.integrator,
            },
            SamplerKind::Sgnht => SamplerParams::Sgnht {
                step_size,
                diffusion: c.diffusion,
                integrator: c.integrator,
            },
            SamplerKind::Msgnht => SamplerParams::Msgnht {
                step_size,
                diffusion: c.diffusion,
                integrator: c.integrator,
            },
            SamplerKind::Sgld => euler_only().map(|_| SamplerParams::Sgld { step_size })?,
            SamplerKind::Psgld => euler_only().map(|_| SamplerParams::Psgld {
                step_size,
                decay: c.rms_decay.unwrap_or(PSGLD_DECAY),
                damping: c.rms_damping.unwrap_or(PSGLD_DAMPING),
            })?,
            SamplerKind::Sgd => euler_only().map(|_| SamplerParams::Sgd { step_size })?,
            SamplerKind::Momentum => euler_only().map(|_| SamplerParams::Momentum {
                step_size,
                friction: c.friction,
            })?,
            // c is RENHD's diffusion and RELD's friction (at T = 1).
            SamplerKind::Renhd => return c.replica_exchange(c.diffusion),
            SamplerKind::Reld => return c.replica_exchange(c.friction),
            SamplerKind::Hmc => {
                euler_only()?;
                if !(step_size > 0.0 && step_size.is_finite()) {
                    return Err(Error::Invalid {
                        name: "step size",
                        rule: "positive and finite".into(),
                        value: step_size,
                    });
                }
                return Ok(Method::Hmc { step_size });
            }
        };
        params.validate()?;
        Ok(Method::Chain(params))
    }

    /// The record read as one minibatch update rule ([`SamplerConfig::method`]'s chain); an
    /// error for replica exchange and HMC, which are not one.
    pub fn params(&self) -> Result<SamplerParams> {
        match self.method()? {
            Method::Chain(p) => Ok(p),
            Method::ReplicaExchange { .. } | Method::Hmc { .. } => {
                Err(super::not_one_chain(self.kind))
            }
        }
    }

    /// An error for the splitting integrator (for a kind that has only Euler).
    fn euler_only(&self) -> Result<()> {
        match self.integrator {
            Integrator::Euler => Ok(()),
            Integrator::Splitting => Err(Error::Config(format!(
                "the splitting integrator applies to sghmc, sgnht and msgnht, not {}",
                self.kind.name()
            ))),
        }
    }

    /// The record read as replica exchange with c = `c` (at T = 1).
    fn replica_exchange(&self, c: f64) -> Result<Method> {
        self.euler_only()?;
        let replica = SamplerParams::replica(self.kind, false, self.step_size, c)?;
        replica.validate_as(self.kind.name())?;
        Ok(Method::ReplicaExchange {
            kind: self.kind,
            replica,
        })
    }

    /// Checks the record as [`SamplerConfig::method`] reads it.
    pub fn validate(&self) -> Result<()> {
        self.method().map(|_| ())
    }
}
