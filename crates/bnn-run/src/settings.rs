//! The hyper-parameters of a run, defined once: what `bnn train`'s flags set (the binary
//! maps its arguments onto [`Settings`]), what `run.json` records and `summary.json`
//! repeats (flattened into both, so their keys are those of older runs), and what
//! `--resume` compares.

use serde::{Deserialize, Serialize};

use crate::data::augment::Augmentation;
use crate::error::{Error, Result};
use crate::likelihood::Likelihood;
use crate::model::ModelSpec;
use crate::potential::{Backward, PriorSpec};
use crate::sampler::replica::ReplicaOptions;
use crate::sampler::{Integrator, Kernel, SamplerConfig, SamplerKind};
use crate::schedule::Schedule;

/// Everything that decides a run's numbers, besides the data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Settings {
    /// The network.
    pub model: ModelSpec,
    /// The sampler and its hyper-parameters.
    pub sampler: SamplerConfig,
    /// Fused kernels (default) or the composed reference (absent in older runs: fused).
    #[serde(default = "fused")]
    pub kernel: Kernel,
    /// Hand-written CPU backward or candle's autograd, as asked for (`auto` included).
    #[serde(default = "auto")]
    pub backward: Backward,
    /// The prior on the parameters.
    pub prior: PriorSpec,
    /// The likelihood: softmax classification (default, not written), or a Gaussian
    /// regression with its noise model (σ in standardised target units).
    #[serde(default, skip_serializing_if = "Likelihood::is_categorical")]
    pub likelihood: Likelihood,
    /// T of the tempered posterior p(θ|D)^{1/T}.
    pub temperature: f64,
    /// Examples per minibatch.
    pub batch_size: usize,
    /// Passes over the training set.
    pub epochs: usize,
    /// Burn-in, thinning and the step-size schedule.
    #[serde(flatten)]
    pub schedule: Schedule,
    /// The run's seed (initialisation, shuffling, noise).
    pub seed: u64,
    /// Save the run's state every this many updates (0: once per epoch), at the end, and
    /// on SIGINT/SIGTERM.
    #[serde(default)]
    pub checkpoint_every: usize,
    /// Write a line of `diagnostics.jsonl` every this many updates (0: at each epoch's
    /// end); see [`crate::train::diagnostics`].
    #[serde(default)]
    pub log_every: usize,
    /// Independent chains run side by side (1: one chain, samples in `RUN/samples/`).
    #[serde(default = "one")]
    pub chains: usize,
    /// How several chains run: apart (each its own model, side by side on the pool) or
    /// stacked (one model with a chain axis, one computation per update); `auto` resolved
    /// when the run starts, so that run.json records which (absent in older runs: apart).
    #[serde(default = "apart")]
    pub chain_layout: ChainLayout,
    /// HMC's trajectory length and target acceptance (`--sampler hmc` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hmc: Option<HmcOptions>,
    /// The ladder and exchanges of `--sampler renhd|reld` (absent for other samplers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<ReplicaOptions>,
    /// p: the fraction of training labels permuted among themselves at each epoch's start
    /// (0: none).
    #[serde(default)]
    pub permute_labels: f64,
    /// Random shifts and/or flips of the training images ([`crate::data::augment`]);
    /// changes the likelihood.
    #[serde(default, skip_serializing_if = "Augmentation::is_none")]
    pub augment: Augmentation,
    /// What a divergence does: stop, or roll back (absent in older runs: stop).
    #[serde(default, skip_serializing_if = "OnDivergence::is_stop")]
    pub on_divergence: OnDivergence,
    /// Halve the step size during burn-in while the configurational temperature is out of
    /// its band ([`crate::train::configurational`]; absent in older runs: no).
    #[serde(default, skip_serializing_if = "is_false")]
    pub adapt_step_size: bool,
    /// SGHMC: estimate β̂ from each update's minibatch (Chen et al. 2014 §3.2) instead of
    /// the fixed `noise_estimate` (absent in older runs: no).
    #[serde(default, skip_serializing_if = "is_false")]
    pub estimate_noise: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// HMC's own settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HmcOptions {
    /// τ: each trajectory takes ⌈τ/ε⌉ leapfrog steps.
    pub trajectory_length: f64,
    /// The acceptance rate the burn-in's dual averaging aims ε at.
    pub target_accept: f64,
    /// A finished run whose samples start the chains (`--init-from`), instead of the
    /// prior's draw: chain k of K takes sample ⌈(k+1)·n/K⌉ of its n (chains pooled in
    /// order), so that the burn-in adapts ε near the typical set instead of descending
    /// to it (Izmailov et al. 2021 start their HMC chains from SGD solutions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_from: Option<std::path::PathBuf>,
}

impl Default for HmcOptions {
    fn default() -> Self {
        HmcOptions {
            trajectory_length: 0.5,
            target_accept: 0.8,
            init_from: None,
        }
    }
}

/// What a run does when a chain diverges (a loss, kinetic energy or parameter that is no
/// longer finite).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum OnDivergence {
    /// Stop with one line naming the step and the tensor; the samples saved so far and the
    /// last saved state stay valid.
    #[default]
    Stop,
    /// Go back to the last saved state, halve the step size, log it and go on; at most
    /// three times per chain (then stop). The halved step size is saved with the state,
    /// so `--resume` continues with it.
    Rollback,
}

/// What a resumed run may change of its recorded [`Settings`]: when it ends and how it is
/// logged, saved and guarded, never what it computes. `None`: as recorded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResumeChanges {
    /// Passes over the training set in all (a finished run may be extended).
    pub epochs: Option<usize>,
    /// Save the state every N updates (0: once per epoch).
    pub checkpoint_every: Option<usize>,
    /// A diagnostics line every N updates (0: at each epoch's end).
    pub log_every: Option<usize>,
    /// What a divergence does.
    pub on_divergence: Option<OnDivergence>,
}

impl ResumeChanges {
    /// `settings` with these changes applied.
    pub fn apply(&self, settings: &mut Settings) {
        settings.epochs = self.epochs.unwrap_or(settings.epochs);
        settings.checkpoint_every = self.checkpoint_every.unwrap_or(settings.checkpoint_every);
        settings.log_every = self.log_every.unwrap_or(settings.log_every);
        settings.on_divergence = self.on_divergence.unwrap_or(settings.on_divergence);
    }
}

impl OnDivergence {
    fn is_stop(&self) -> bool {
        *self == OnDivergence::Stop
    }
}

fn fused() -> Kernel {
    Kernel::Fused
}

fn auto() -> Backward {
    Backward::Auto
}

fn one() -> usize {
    1
}

fn apart() -> ChainLayout {
    ChainLayout::Apart
}

/// How the K chains of a run compute their updates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum ChainLayout {
    /// Stacked where it pays: on a GPU (`--device cuda|metal`) with several chains under
    /// a fused sampler; apart otherwise (the CPU's hand-written pass is
    /// faster per chain than candle's).
    #[default]
    Auto,
    /// Each chain its own network and update, the chains side by side on the thread pool.
    Apart,
    /// One network with a leading chain axis on every parameter: each layer's product one
    /// batched product over the chains, each chain's sampler stepping its slice
    /// ([`crate::model::stacked`]); chain k keeps its seed, minibatch order and noise.
    Stacked,
}

impl ChainLayout {
    /// `auto` decided for a run of `s` on a device that is (`cpu`) or is not the CPU;
    /// `stacked` where it cannot run is an error saying why.
    pub fn resolve(self, s: &Settings, cpu: bool) -> Result<ChainLayout> {
        if self == ChainLayout::Stacked && s.chains < 2 {
            return Err(Error::Config(
                "--chain-layout stacked stacks several chains: give --chains 2 or more".into(),
            ));
        }
        let why_not = Self::why_not_stacked(s);
        match (self, why_not) {
            (ChainLayout::Stacked, Some(why)) => {
                Err(Error::Config(format!("--chain-layout stacked: {why}")))
            }
            (ChainLayout::Auto, None) if !cpu && s.chains > 1 => Ok(ChainLayout::Stacked),
            (ChainLayout::Auto, _) => Ok(ChainLayout::Apart),
            (layout, _) => Ok(layout),
        }
    }

    /// Why the chains of `s` cannot be stacked, if they cannot.
    fn why_not_stacked(s: &Settings) -> Option<String> {
        let kind = s.sampler.kind;
        if !kind.is_dynamics() || s.kernel != Kernel::Fused {
            let kernel = match s.kernel {
                Kernel::Fused => "fused",
                Kernel::Composed => "composed",
            };
            return Some(format!(
                "{} with --kernel {kernel} has no fused update of a chain's slice (sgld, \
                 sghmc, sgnht and msgnht with --kernel fused do)",
                kind.name()
            ));
        }
        if s.on_divergence == OnDivergence::Rollback {
            return Some(
                "--on-divergence rollback rolls one chain back alone; stacked chains move \
                 together"
                    .into(),
            );
        }
        None
    }
}

/// `bnn train`'s defaults: the CLI takes its flags' defaults from here, so that they are
/// defined once. An MLP 784-100-10 (ReLU) sampled by SGHMC (η = 2·10⁻⁶, α = 0.1) under a
/// Gamma(1, 1) hyper-prior on the precisions, 50 epochs of minibatches of 100, η halved
/// from epoch 21 on, a sample every 200 updates after 10 epochs of burn-in.
impl Default for Settings {
    fn default() -> Self {
        Settings {
            model: ModelSpec::default(),
            sampler: SamplerKind::Sghmc.defaults(),
            kernel: Kernel::Fused,
            backward: Backward::Auto,
            prior: PriorSpec::DEFAULT,
            likelihood: Likelihood::Categorical,
            temperature: 1.0,
            batch_size: 100,
            epochs: 50,
            schedule: Schedule {
                decay_at: vec![20],
                decay_factor: 0.5,
                cycles: 0,
                sample_fraction: 0.25,
                poly_gamma: 0.0,
                poly_steps: 1000.0,
                burnin: 10,
                thin: 200,
            },
            seed: 0,
            checkpoint_every: 0,
            log_every: 0,
            chains: 1,
            chain_layout: ChainLayout::Auto,
            hmc: None,
            replicas: None,
            permute_labels: 0.0,
            augment: Augmentation::None,
            on_divergence: OnDivergence::Stop,
            adapt_step_size: false,
            estimate_noise: false,
        }
    }
}

impl Settings {
    /// Updates a table's defaults aim at: 1,000 epochs of Friedman #1's 10,000 rows, about
    /// 15 s on two Zen 3 cores for an MLP 10-50-50-1.
    pub const TABLE_UPDATES: usize = 100_000;

    /// The defaults for a table of `n_train` training rows: minibatches of up to 100 rows,
    /// as many epochs as make [`Settings::TABLE_UPDATES`] updates, the first quarter burn-in,
    /// then 100 samples evenly thinned, a constant step size (no decay: the tables' runs
    /// are short), and the state saved and the diagnostics logged every 2,000 updates
    /// rather than at each of the many short epochs. The step size is the sampler's
    /// default scaled by 60,000/N ([`Settings::scale_step_size`]).
    pub fn for_table(n_train: usize) -> Settings {
        let d = Settings::default();
        let batch_size = n_train.clamp(1, 100);
        let batches = (n_train / batch_size).max(1);
        let mut s = Settings {
            batch_size,
            epochs: Self::TABLE_UPDATES.div_ceil(batches).max(4),
            schedule: Schedule {
                decay_at: Vec::new(),
                ..d.schedule
            },
            checkpoint_every: 2_000,
            log_every: 2_000,
            ..d
        };
        s.fit_table_schedule(n_train, false, false);
        s
    }

    /// Iterations of an HMC run by default (`--epochs` counts iterations for `--sampler
    /// hmc`): 1,000, the first quarter adapting ε, then 100 samples. An iteration costs
    /// about τ/ε + 1 full-batch gradients, so the minibatch samplers' defaults (MNIST's 50
    /// epochs with thinning 200, or a table's 100,000 updates) make no sense for it.
    pub const HMC_ITERATIONS: usize = 1_000;

    /// An HMC run's schedule in iterations, each part unless given by a flag (a preset's
    /// schedule is its own sampler's, in minibatch updates): [`Settings::HMC_ITERATIONS`],
    /// the first quarter burn-in, 100 samples evenly thinned after it.
    pub fn fit_hmc_schedule(&mut self, epochs_given: bool, burnin_given: bool, thin_given: bool) {
        if !epochs_given {
            self.epochs = Self::HMC_ITERATIONS;
        }
        if !burnin_given {
            self.schedule.burnin = self.epochs / 4;
        }
        if !thin_given {
            self.schedule.thin = (self.epochs.saturating_sub(self.schedule.burnin) / 100).max(1);
        }
    }

    /// A table's burn-in (the first quarter of the epochs) and thinning (100 samples after
    /// it) for the epochs and batch size set, each unless given.
    pub fn fit_table_schedule(&mut self, n_train: usize, burnin_given: bool, thin_given: bool) {
        let batches = (n_train / self.batch_size.max(1)).max(1);
        if !burnin_given {
            self.schedule.burnin = self.epochs / 4;
        }
        if !thin_given {
            let sampling = self.epochs.saturating_sub(self.schedule.burnin) * batches;
            self.schedule.thin = (sampling / 100).max(1);
        }
    }

    /// The sampler's step size for N training examples when it is the default one: the
    /// defaults are MNIST's (N = 60,000), and η·N — the step on the mean minibatch loss —
    /// is what carries over to another data set (η·√N for pSGLD:
    /// `SamplerKind::carry_step_size`). A regression's is 24× smaller again: its
    /// likelihood's curvature is the noise precision τ = 1/σ², 10–100 on a standardised
    /// target once the network fits. Measured on Friedman #1 (SGHMC, seed 0, see
    /// docs/BENCHMARKS.md): η·N = 0.12 diverged in the second epoch, 0.01 over-dispersed the
    /// ensemble (95% coverage 0.973), 0.005 gave 0.964.
    pub fn scale_step_size(&mut self, n_train: usize, regression: bool) {
        let reference = bnn_core::optim::params::REFERENCE_DATA_SIZE;
        let per_example = if regression {
            reference / 24.0
        } else {
            reference
        };
        let (kind, eta) = (self.sampler.kind, self.sampler.step_size);
        self.sampler.step_size = kind.carry_step_size(eta, per_example, n_train as f64);
    }

    /// Updates between saved states: `--checkpoint-every`, or an epoch of `batches`
    /// minibatches when it is 0.
    pub fn checkpoint_interval(&self, batches: u64) -> u64 {
        match self.checkpoint_every {
            0 => batches,
            k => k as u64,
        }
    }

    /// Checks every setting, for a training set of `train_examples`; the message names
    /// the flag.
    pub fn validate(&self, train_examples: usize) -> Result<()> {
        self.validate_schedule(train_examples)?;
        self.validate_method()?;
        self.model.validate()?;
        self.sampler.validate().map_err(Error::for_flag)
    }

    /// Checks the minibatches, the epochs, the schedule, the chains and the label noise.
    fn validate_schedule(&self, train_examples: usize) -> Result<()> {
        let bad = |m: String| Err(Error::Config(m));
        if self.batch_size == 0 || self.batch_size > train_examples {
            return bad(format!(
                "--batch-size must be in 1..={train_examples}, got {}",
                self.batch_size
            ));
        }
        if self.epochs == 0 {
            return bad("--epochs must be at least 1".into());
        }
        if self.schedule.burnin >= self.epochs {
            return bad(format!(
                "--burnin {} leaves no epoch to sample in (--epochs {})",
                self.schedule.burnin, self.epochs
            ));
        }
        if !(self.schedule.decay_factor > 0.0 && self.schedule.decay_factor.is_finite()) {
            return bad(format!(
                "--decay-factor must be positive, got {}",
                self.schedule.decay_factor
            ));
        }
        if !(self.schedule.poly_gamma >= 0.0 && self.schedule.poly_steps > 0.0) {
            return bad(format!(
                "--poly-gamma must be ≥ 0 and --poly-steps > 0, got {} and {}",
                self.schedule.poly_gamma, self.schedule.poly_steps
            ));
        }
        if !(self.schedule.sample_fraction > 0.0 && self.schedule.sample_fraction <= 1.0) {
            return bad(format!(
                "--sample-fraction must be in (0, 1], got {}",
                self.schedule.sample_fraction
            ));
        }
        if self.schedule.thin == 0 {
            return bad("--thin must be at least 1".into());
        }
        if self.chains == 0 || self.chains > 1024 {
            return bad(format!("--chains must be in 1..=1024, got {}", self.chains));
        }
        if !(0.0..=1.0).contains(&self.permute_labels) {
            return bad(format!(
                "--permute-labels must be in [0, 1], got {}",
                self.permute_labels
            ));
        }
        Ok(())
    }

    /// Checks the settings that only some methods take: step adaptation, the noise
    /// estimate, rollback, and replica exchange's options.
    fn validate_method(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Config(m));
        let kind = self.sampler.kind;
        if self.adapt_step_size
            && (!kind.is_sampler() || kind.is_replica_exchange() || kind == SamplerKind::Hmc)
        {
            return bad(format!(
                "--adapt-step-size is for the minibatch samplers (sgld, sghmc, sgnht, msgnht), not --sampler {}",
                kind.name()
            ));
        }
        if self.estimate_noise && kind != SamplerKind::Sghmc {
            return bad(format!(
                "--estimate-noise is for --sampler sghmc (its β̂), not {}",
                kind.name()
            ));
        }
        if self.on_divergence == OnDivergence::Rollback && self.replicas.is_some() {
            return bad(format!(
                "--on-divergence rollback is for chains, not for --sampler {}: a replica run stops at a divergence",
                self.sampler.kind.name()
            ));
        }
        match (&self.replicas, self.sampler.kind.is_replica_exchange()) {
            (Some(r), true) => {
                r.validate()?;
                if self.chains > 1 {
                    return bad(format!(
                        "--chains {} with --sampler {}: the replicas are its chains; leave --chains at 1",
                        self.chains,
                        self.sampler.kind.name()
                    ));
                }
            }
            (None, false) => {}
            (Some(_), false) => {
                return bad("replica options are for --sampler renhd or reld".into())
            }
            (None, true) => {
                return bad(format!(
                    "--sampler {} needs its replica options",
                    self.sampler.kind.name()
                ))
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::SamplerKind;

    fn settings() -> Settings {
        Settings {
            prior: PriorSpec::Gaussian { std: 1.0 },
            epochs: 10,
            schedule: crate::schedule::example(),
            ..Settings::default()
        }
    }

    /// HMC counts iterations: 1,000 by default, a quarter burn-in, 100 samples; what a
    /// flag gave stays, and the rest follows it.
    #[test]
    fn hmc_schedules_iterations() {
        let mut s = Settings::for_table(455);
        s.fit_hmc_schedule(false, false, false);
        assert_eq!(
            (s.epochs, s.schedule.burnin, s.schedule.thin),
            (1000, 250, 7)
        );
        let mut s = Settings {
            epochs: 2500,
            ..Settings::default()
        };
        s.fit_hmc_schedule(true, false, false);
        assert_eq!(
            (s.epochs, s.schedule.burnin, s.schedule.thin),
            (2500, 625, 18)
        );
        s.schedule.thin = 1;
        s.fit_hmc_schedule(true, true, true);
        assert_eq!(
            (s.epochs, s.schedule.burnin, s.schedule.thin),
            (2500, 625, 1)
        );
    }

    /// defaults ← preset ← flags: a flag beats the preset, the preset beats the default,
    /// and a preset's sampler settings and chains go only with its own sampler.
    #[test]
    fn layers_stack_defaults_then_preset_then_flags() {
        assert_eq!(
            Settings::resolve(&SettingsLayer::default(), &SettingsLayer::default()),
            Settings::default()
        );
        let preset = SettingsLayer {
            sampler: Some(SamplerKind::Sgnht),
            step_size: Some(5e-7),
            chains: Some(4),
            epochs: Some(30),
            seed: Some(9),
            ..SettingsLayer::default()
        };
        let flags = SettingsLayer {
            epochs: Some(7),
            ..SettingsLayer::default()
        };
        let s = Settings::resolve(&preset, &flags);
        assert_eq!((s.epochs, s.seed, s.chains), (7, 9, 4));
        assert_eq!(
            (s.sampler.kind, s.sampler.step_size),
            (SamplerKind::Sgnht, 5e-7)
        );
        assert_eq!(s.sampler.diffusion, SamplerKind::Sgnht.defaults().diffusion);
        // Another sampler typed: the preset's η and chains stay with its sampler.
        let other = SettingsLayer {
            sampler: Some(SamplerKind::Sgld),
            ..flags
        };
        let s = Settings::resolve(&preset, &other);
        assert_eq!(s.sampler, SamplerKind::Sgld.defaults());
        assert_eq!((s.chains, s.seed), (1, 9));
    }

    /// Burn-in past the end, zero thinning, a bad decay factor, a batch larger than the
    /// data, no chains are refused with the flag's name.
    #[test]
    fn settings_are_validated_by_flag() {
        assert!(settings().validate(1000).is_ok());
        for (edit, flag) in [
            (
                (|c: &mut Settings| c.schedule.burnin = 10) as fn(&mut Settings),
                "--burnin",
            ),
            (|c| c.schedule.thin = 0, "--thin"),
            (|c| c.schedule.decay_factor = 0.0, "--decay-factor"),
            (|c| c.schedule.sample_fraction = 1.5, "--sample-fraction"),
            (|c| c.batch_size = 1001, "--batch-size"),
            (|c| c.chains = 0, "--chains"),
            (|c| c.epochs = 0, "--epochs"),
            (|c| c.permute_labels = 1.5, "--permute-labels"),
            (
                |c| {
                    c.sampler = SamplerKind::Renhd.defaults();
                    c.replicas = Some(ReplicaOptions::default());
                    c.chains = 2;
                },
                "--chains",
            ),
            (
                |c| {
                    c.sampler = SamplerKind::Renhd.defaults();
                    c.replicas = Some(ReplicaOptions {
                        exchange_every: 0,
                        ..Default::default()
                    });
                },
                "--exchange-every",
            ),
        ] {
            let mut c = settings();
            edit(&mut c);
            let e = c.validate(1000).unwrap_err().to_string();
            assert!(e.contains(flag), "{e}");
        }
    }

    /// The settings round-trip through JSON, flattened as run.json and summary.json hold
    /// them; a run.json of before `kernel`, `backward`, `checkpoint_every` and `chains`
    /// existed reads with their defaults.
    #[test]
    fn settings_round_trip_and_old_records_read() {
        let s = settings();
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["burnin"], 2, "the schedule is flattened: {json}");
        let back: Settings = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(back, s);
        let mut old = json;
        let map = old.as_object_mut().unwrap();
        for key in ["kernel", "backward", "checkpoint_every", "chains"] {
            map.remove(key);
        }
        let back: Settings = serde_json::from_value(old).unwrap();
        assert_eq!(
            (back.kernel, back.backward, back.chains),
            (Kernel::Fused, Backward::Auto, 1)
        );
    }
}

/// A preset file: the architecture (`[model]`) and, optionally, training defaults that
/// suit it (`[train]`); flags given on the command line override them, and the run
/// records the merged [`Settings`].
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Preset {
    /// The preset's network.
    pub model: ModelSpec,
    /// Its training defaults (flags typed override them).
    #[serde(default)]
    pub train: SettingsLayer,
}

/// A layer of settings: what a preset's `[train]` table gives, or the flags a user typed;
/// an absent field leaves the layer below. [`Settings::resolve`] stacks them once:
/// defaults ← preset ← flags. Each field is the flag of the same name (`step_size` is
/// `--step-size`, and a preset's key `step_size`): with the feature `cli` these fields
/// are `bnn train`'s flags themselves, their help this documentation, so that a setting
/// is named, typed and described once. No default is written here: the flags show
/// [`Settings`]' `Default` (the binary appends it to each help).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[serde(deny_unknown_fields)]
pub struct SettingsLayer {
    /// Sampler (or MAP baseline).
    #[cfg_attr(feature = "cli", arg(long, value_enum))]
    pub sampler: Option<SamplerKind>,
    /// Update implementation: one fused pass (default) or composed candle ops (reference).
    #[cfg_attr(feature = "cli", arg(long, value_enum))]
    pub kernel: Option<Kernel>,
    /// Gradient implementation: the hand-written CPU backward (custom), candle's autograd
    /// (the reference), or auto (custom on the CPU, autograd elsewhere).
    #[cfg_attr(feature = "cli", arg(long, value_enum))]
    pub backward: Option<Backward>,
    /// η: step size multiplying ∇U (default depends on the sampler).
    #[cfg_attr(feature = "cli", arg(long))]
    pub step_size: Option<f64>,
    /// HMC (`--sampler hmc`): the trajectory length τ; each trajectory takes ⌈τ/ε⌉
    /// leapfrog steps.
    #[cfg_attr(feature = "cli", arg(long))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trajectory_length: Option<f64>,
    /// HMC: the acceptance rate burn-in's dual averaging aims the step size at.
    #[cfg_attr(feature = "cli", arg(long))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_accept: Option<f64>,
    /// HMC: start the chains from a finished run's samples (chain k of K takes the
    /// ⌈(k+1)·n/K⌉-th of its n samples, chains pooled in order) instead of the prior's
    /// draw, e.g. from an SG-MCMC run of the same model and data, so that the burn-in
    /// only adapts ε.
    #[cfg_attr(feature = "cli", arg(long, value_name = "RUN"))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_from: Option<std::path::PathBuf>,
    /// α: friction of sghmc and momentum (momentum coefficient = 1 − α).
    #[cfg_attr(feature = "cli", arg(long))]
    pub friction: Option<f64>,
    /// β̂: gradient-noise estimate of sghmc.
    #[cfg_attr(feature = "cli", arg(long))]
    pub noise_estimate: Option<f64>,
    /// Integrator: euler or splitting (default: splitting for sgnht and msgnht, euler
    /// otherwise).
    #[cfg_attr(feature = "cli", arg(long, value_enum))]
    pub integrator: Option<Integrator>,
    /// a: diffusion of sgnht/msgnht (also the initial thermostat).
    #[cfg_attr(feature = "cli", arg(long))]
    pub diffusion: Option<f64>,
    /// β: psgld's decay of its average V of squared gradients (Li et al. 2016's α).
    #[cfg_attr(feature = "cli", arg(long))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rms_decay: Option<f64>,
    /// λ: psgld's damping of its preconditioner G = 1/(λ + √V), in the units of ∇Ũ (the
    /// paper's λ per example times N).
    #[cfg_attr(feature = "cli", arg(long))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rms_damping: Option<f64>,
    /// The prior: `{ kind = "gaussian", std = 0.1 }` or `{ kind = "gamma", shape = 1.0,
    /// rate = 1.0 }` in a preset; on the command line `--prior`, `--prior-std`,
    /// `--gamma-shape` and `--gamma-rate` (the binary's, which compose this one value).
    #[cfg_attr(feature = "cli", arg(skip))]
    pub prior: Option<PriorSpec>,
    /// Posterior temperature T: samples exp(−U/T).
    #[cfg_attr(feature = "cli", arg(long))]
    pub temperature: Option<f64>,
    /// Minibatch size |S|.
    #[cfg_attr(feature = "cli", arg(long))]
    pub batch_size: Option<usize>,
    /// Passes over the training set.
    #[cfg_attr(feature = "cli", arg(long))]
    pub epochs: Option<usize>,
    /// Epochs before the first sample is kept.
    #[cfg_attr(feature = "cli", arg(long))]
    pub burnin: Option<usize>,
    /// Keep one sample every THIN updates after burn-in.
    #[cfg_attr(feature = "cli", arg(long))]
    pub thin: Option<usize>,
    /// Step decay: multiply η by --decay-factor from these epochs on (default: from the
    /// 21st epoch, as Li et al. 2016 do; `--decay-at` with no value: constant step size).
    #[cfg_attr(feature = "cli", arg(long, value_delimiter = ',', num_args = 0..))]
    pub decay_at: Option<Vec<usize>>,
    /// Factor of each step decay.
    #[cfg_attr(feature = "cli", arg(long))]
    pub decay_factor: Option<f64>,
    /// Cyclical step size: this many cosine cycles over the run (0: none).
    #[cfg_attr(feature = "cli", arg(long))]
    pub cycles: Option<usize>,
    /// With --cycles: keep samples only in this last fraction of each cycle.
    #[cfg_attr(feature = "cli", arg(long))]
    pub sample_fraction: Option<f64>,
    /// Polynomial decay η_t = η·(b/(b + t))^γ: the exponent γ (0: none; Welling & Teh
    /// use 0.55).
    #[cfg_attr(feature = "cli", arg(long))]
    pub poly_gamma: Option<f64>,
    /// Polynomial decay: b, in updates.
    #[cfg_attr(feature = "cli", arg(long))]
    pub poly_steps: Option<f64>,
    /// Seed of initialisation, minibatch order and injected noise.
    #[cfg_attr(feature = "cli", arg(long))]
    pub seed: Option<u64>,
    /// Save the run's state (for --resume) every N updates; 0: once per epoch. It is also
    /// saved at the end and on SIGINT/SIGTERM.
    #[cfg_attr(feature = "cli", arg(long, value_name = "N"))]
    pub checkpoint_every: Option<usize>,
    /// When the chain diverges (a non-finite loss, kinetic energy or parameter): stop, or
    /// roll back to the last saved state with half the step size and go on (at most 3
    /// times per chain; the halved step size is saved with the state for --resume).
    #[cfg_attr(feature = "cli", arg(long, value_enum))]
    pub on_divergence: Option<OnDivergence>,
    /// During burn-in, halve the step size whenever the configurational temperature
    /// θ·∇Ũ/(D·T) stays out of [0.9, 1.1] beyond four standard errors over ten lines of
    /// diagnostics.jsonl (at most four times); the step kept for sampling is logged and
    /// saved with the state. Minibatch samplers only.
    #[cfg_attr(
        feature = "cli",
        arg(long, num_args = 0, default_missing_value = "true")
    )]
    pub adapt_step_size: Option<bool>,
    /// SGHMC: estimate the gradient noise β̂ = ½ηV̂ from each minibatch's per-example
    /// gradients (Chen et al. 2014 §3.2), per parameter tensor, and inject that much less
    /// noise, instead of --noise-estimate; needs the hand-written MLP backward on the CPU.
    #[cfg_attr(
        feature = "cli",
        arg(long, num_args = 0, default_missing_value = "true")
    )]
    pub estimate_noise: Option<bool>,
    /// Record the sampler's diagnostics (minibatch potential energy, kinetic energy per
    /// parameter overall and per tensor, thermostat mean and spread) in
    /// RUN/diagnostics.jsonl every N updates; 0: at each epoch's end.
    #[cfg_attr(feature = "cli", arg(long, value_name = "N"))]
    pub log_every: Option<usize>,
    /// Run K independent chains side by side (seeds derived from --seed; chain 0 has
    /// --seed itself), in `RUN/chain-<k>/`; the ensemble pools them, and the summary adds
    /// each chain's figures, split-R-hat and ESS. A preset's chains go with its sampler
    /// only; replica exchange runs its replicas as its chains.
    #[cfg_attr(feature = "cli", arg(long, value_name = "K"))]
    pub chains: Option<usize>,
    /// How the K chains compute: stacked (one network with a chain axis: one batched
    /// product per layer for all chains, each chain keeping its seed, minibatch order and
    /// noise), apart (each chain its own network), or auto (stacked on a GPU under sgld,
    /// psgld, sghmc, sgnht or msgnht; apart on the CPU).
    #[cfg_attr(feature = "cli", arg(long, value_enum))]
    pub chain_layout: Option<ChainLayout>,
    /// At the start of each epoch, permute the labels of this fraction of the training
    /// examples among themselves (seeded per epoch; Luo et al. §4.2's label noise).
    #[cfg_attr(feature = "cli", arg(long, value_name = "P"))]
    pub permute_labels: Option<f64>,
    /// Augment the training images: random shifts of up to 2 pixels and left–right flips
    /// for Fashion-MNIST (`--augment` alone: shift-flip), or only shifts or only flips.
    /// Changes the likelihood (the cold-posterior debate); off by default.
    #[cfg_attr(
        feature = "cli",
        arg(long, value_enum, num_args = 0..=1, default_missing_value = "shift-flip")
    )]
    pub augment: Option<Augmentation>,
    /// Standardise each pixel with the training set's mean and standard deviation
    /// (floored at 0.1) instead of scaling to [0, 1]; recorded in run.json for `bnn eval`.
    #[cfg_attr(
        feature = "cli",
        arg(long, num_args = 0, default_missing_value = "true")
    )]
    pub standardize: Option<bool>,
}

impl SettingsLayer {
    /// Every field `s` has, as a layer (`standardize` absent: a property of the data, not
    /// of [`Settings`]): resolved over any defaults, it gives `s`'s values back. The CLI
    /// shows `bnn train`'s defaults from it.
    pub fn of(s: &Settings) -> SettingsLayer {
        let (c, sch) = (&s.sampler, &s.schedule);
        SettingsLayer {
            sampler: Some(c.kind),
            step_size: Some(c.step_size),
            trajectory_length: s.hmc.as_ref().map(|h| h.trajectory_length),
            target_accept: s.hmc.as_ref().map(|h| h.target_accept),
            init_from: s.hmc.as_ref().and_then(|h| h.init_from.clone()),
            friction: Some(c.friction),
            diffusion: Some(c.diffusion),
            noise_estimate: Some(c.noise_estimate),
            integrator: Some(c.integrator),
            rms_decay: c.rms_decay,
            rms_damping: c.rms_damping,
            batch_size: Some(s.batch_size),
            epochs: Some(s.epochs),
            burnin: Some(sch.burnin),
            thin: Some(sch.thin),
            decay_at: Some(sch.decay_at.clone()),
            decay_factor: Some(sch.decay_factor),
            prior: Some(s.prior),
            temperature: Some(s.temperature),
            augment: Some(s.augment),
            standardize: None,
            chains: Some(s.chains),
            chain_layout: Some(s.chain_layout),
            kernel: Some(s.kernel),
            backward: Some(s.backward),
            seed: Some(s.seed),
            cycles: Some(sch.cycles),
            sample_fraction: Some(sch.sample_fraction),
            poly_gamma: Some(sch.poly_gamma),
            poly_steps: Some(sch.poly_steps),
            checkpoint_every: Some(s.checkpoint_every),
            log_every: Some(s.log_every),
            permute_labels: Some(s.permute_labels),
            on_divergence: Some(s.on_divergence),
            adapt_step_size: Some(s.adapt_step_size),
            estimate_noise: Some(s.estimate_noise),
        }
    }
}

impl Settings {
    /// The settings of `preset` over the defaults, and of `flags` over both: the one place
    /// where they are stacked. A preset's sampler settings (step size, friction, diffusion,
    /// noise estimate, integrator, pSGLD's β and λ) and its number of chains go with its
    /// sampler: not used when the flags name another. HMC's options are set for `--sampler hmc` only. The
    /// model is the default MLP and there are no replicas: the network comes from the
    /// preset's `[model]` and the replica options from their flags.
    pub fn resolve(preset: &SettingsLayer, flags: &SettingsLayer) -> Settings {
        Settings::resolve_on(Settings::default(), preset, flags)
    }

    /// [`Settings::resolve`] on other defaults than `bnn train`'s (those of a table,
    /// [`Settings::for_table`]).
    pub fn resolve_on(d: Settings, preset: &SettingsLayer, flags: &SettingsLayer) -> Settings {
        let kind = flags.sampler.or(preset.sampler).unwrap_or(d.sampler.kind);
        let with_sampler = preset.sampler.is_none_or(|p| p == kind);
        // flags, else the preset, else the default.
        macro_rules! pick {
            ($field:ident, $default:expr) => {
                flags
                    .$field
                    .clone()
                    .or(preset.$field.clone())
                    .unwrap_or($default)
            };
        }
        // The same for the settings that go with the preset's sampler.
        macro_rules! pick_with_sampler {
            ($field:ident, $default:expr) => {
                flags
                    .$field
                    .or(preset.$field.filter(|_| with_sampler))
                    .unwrap_or($default)
            };
        }
        let sd = kind.defaults();
        // The same for a sampler's optional settings (pSGLD's β and λ).
        let own = |typed: Option<f64>, preset_value: Option<f64>, default: Option<f64>| {
            typed.or(preset_value.filter(|_| with_sampler)).or(default)
        };
        Settings {
            model: d.model,
            sampler: SamplerConfig {
                kind,
                step_size: pick_with_sampler!(step_size, sd.step_size),
                friction: pick_with_sampler!(friction, sd.friction),
                noise_estimate: pick_with_sampler!(noise_estimate, sd.noise_estimate),
                diffusion: pick_with_sampler!(diffusion, sd.diffusion),
                integrator: pick_with_sampler!(integrator, sd.integrator),
                rms_decay: own(flags.rms_decay, preset.rms_decay, sd.rms_decay),
                rms_damping: own(flags.rms_damping, preset.rms_damping, sd.rms_damping),
            },
            kernel: pick!(kernel, d.kernel),
            backward: pick!(backward, d.backward),
            prior: pick!(prior, d.prior),
            // The data decide it (a table's target), not a layer.
            likelihood: d.likelihood,
            temperature: pick!(temperature, d.temperature),
            batch_size: pick!(batch_size, d.batch_size),
            epochs: pick!(epochs, d.epochs),
            schedule: Schedule {
                decay_at: pick!(decay_at, d.schedule.decay_at),
                decay_factor: pick!(decay_factor, d.schedule.decay_factor),
                cycles: pick!(cycles, d.schedule.cycles),
                sample_fraction: pick!(sample_fraction, d.schedule.sample_fraction),
                poly_gamma: pick!(poly_gamma, d.schedule.poly_gamma),
                poly_steps: pick!(poly_steps, d.schedule.poly_steps),
                burnin: pick!(burnin, d.schedule.burnin),
                thin: pick!(thin, d.schedule.thin),
            },
            seed: pick!(seed, d.seed),
            checkpoint_every: pick!(checkpoint_every, d.checkpoint_every),
            log_every: pick!(log_every, d.log_every),
            chains: pick_with_sampler!(chains, d.chains),
            chain_layout: pick!(chain_layout, d.chain_layout),
            hmc: (kind == SamplerKind::Hmc).then(|| {
                let h = HmcOptions::default();
                HmcOptions {
                    trajectory_length: pick!(trajectory_length, h.trajectory_length),
                    target_accept: pick!(target_accept, h.target_accept),
                    init_from: flags.init_from.clone().or(preset.init_from.clone()),
                }
            }),
            replicas: None,
            permute_labels: pick!(permute_labels, d.permute_labels),
            augment: pick!(augment, d.augment),
            on_divergence: pick!(on_divergence, d.on_divergence),
            adapt_step_size: pick!(adapt_step_size, d.adapt_step_size),
            estimate_noise: pick!(estimate_noise, d.estimate_noise),
        }
    }
}

impl Preset {
    /// Reads and checks a preset; errors name the file and the key.
    pub fn from_toml_file(path: &std::path::Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Self::from_toml_str(&text, &path.display().to_string())
    }

    /// Parses and checks the text of a preset; errors name `origin` and the key.
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Self> {
        let preset: Preset = toml::from_str(text).map_err(|e| {
            // toml's messages can run over several lines; the CLI prints one.
            let message = e.message().split_whitespace().collect::<Vec<_>>().join(" ");
            let line = e
                .span()
                .map(|s| {
                    let before = &text.as_bytes()[..s.start.min(text.len())];
                    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
                    format!(" line {line}:")
                })
                .unwrap_or_default();
            Error::Config(format!("{origin}:{line} not a preset: {message}"))
        })?;
        preset
            .model
            .validate()
            .map_err(|e| Error::Config(format!("{origin}: {e}")))?;
        let t = &preset.train;
        let bad = |key: &str, what: &str| {
            Err(Error::Config(format!(
                "{origin}: [train] {key} must be {what}"
            )))
        };
        let positive = |v: Option<f64>| v.is_some_and(|v| !(v > 0.0 && v.is_finite()));
        for (key, v) in [
            ("step_size", t.step_size),
            ("temperature", t.temperature),
            ("decay_factor", t.decay_factor),
        ] {
            if positive(v) {
                return bad(key, "a positive number");
            }
        }
        for (key, v) in [
            ("friction", t.friction),
            ("diffusion", t.diffusion),
            ("noise_estimate", t.noise_estimate),
        ] {
            if v.is_some_and(|v| !(v >= 0.0 && v.is_finite())) {
                return bad(key, "a number ≥ 0");
            }
        }
        for (key, v) in [
            ("batch_size", t.batch_size),
            ("epochs", t.epochs),
            ("thin", t.thin),
            ("chains", t.chains),
        ] {
            if v == Some(0) {
                return bad(key, "at least 1");
            }
        }
        Ok(preset)
    }
}
