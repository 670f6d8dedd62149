//! `bnn sample`: the samplers on synthetic potentials whose answer is known, through the
//! same sampler code as the networks, with gradient noise of known size that the sampler
//! does not know: ∇Ũ(θ) = ∇U(θ) + N(0, 2B/h) (Ding et al. 2014 §3: h f̃ = h f + N(0, 2hB)).
//!
//! Flags are in the papers' physical units: step h (η = h²), friction C (α = C·h),
//! diffusion A (a = A·h); the reported thermostat is ξ = α/h.

use candle_core::{Device, Tensor, Var};
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

use crate::driver;
use crate::error::{Error, Result};
use crate::rng::NoiseKey;
use crate::sampler::{self, Integrator, Kernel, SamplerConfig, SamplerKind};

pub mod replicas;

/// The synthetic targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum PotentialKind {
    /// U = (θ+4)(θ+1)(θ−1)(θ−3)/14 + 0.5 (Ding et al. Fig. 1; Li et al. Fig. 1).
    DoubleWell,
    /// U = −2θ² + θ⁴ (Chen et al. §4.1; reproduction report).
    Quartic,
    /// Posterior of μ given 100 draws from N(0, 1), flat prior, minibatches of 10; the
    /// gradient noise is the real minibatch noise (Ding et al. §5.1).
    GaussianMean,
    /// 2-D mixture of 5 Gaussians (σ = 0.5) at radius 4, isolated modes (RENHD §4.1;
    /// the paper does not give positions, these are ours).
    Gmm5,
    /// U = θ²/2: the standard normal, whose tempered versions N(0, T) are known exactly.
    Gaussian,
}

impl PotentialKind {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            PotentialKind::DoubleWell => "double-well",
            PotentialKind::Quartic => "quartic",
            PotentialKind::GaussianMean => "gaussian-mean",
            PotentialKind::Gmm5 => "gmm5",
            PotentialKind::Gaussian => "gaussian",
        }
    }
}

const GMM_RADIUS: f64 = 4.0;
const GMM_SIGMA: f64 = 0.5;
/// The variance of the noise on gmm5's U and ∇U (Luo et al. §4.1).
const GMM_NOISE_VARIANCE: f64 = 0.25;
const GM_N: usize = 100;
const GM_BATCH: usize = 10;

/// A potential with its data (for `gaussian-mean`).
pub struct Potential {
    /// Which potential.
    pub kind: PotentialKind,
    data: Vec<f64>,
}

impl Potential {
    /// The potential `kind` (its random parts drawn from `seed`).
    pub fn new(kind: PotentialKind, seed: u64) -> Self {
        let data = if kind == PotentialKind::GaussianMean {
            let mut rng =
                rand::rngs::StdRng::seed_from_u64(seed ^ crate::rng::SYNTHETIC_DATA_STREAM);
            (0..GM_N)
                .map(|_| {
                    rand_distr::Distribution::<f64>::sample(&rand_distr::StandardNormal, &mut rng)
                })
                .collect()
        } else {
            Vec::new()
        };
        Potential { kind, data }
    }

    /// Dimension of θ.
    pub fn dim(&self) -> usize {
        if self.kind == PotentialKind::Gmm5 {
            2
        } else {
            1
        }
    }

    pub(crate) fn modes() -> impl Iterator<Item = (f64, f64)> {
        (0..5).map(|k| {
            let t = std::f64::consts::TAU * k as f64 / 5.0;
            (GMM_RADIUS * t.cos(), GMM_RADIUS * t.sin())
        })
    }

    /// U at a point (the full-data potential).
    pub fn energy(&self, x: &[f64]) -> f64 {
        match self.kind {
            PotentialKind::DoubleWell => {
                let t = x[0];
                (t + 4.0) * (t + 1.0) * (t - 1.0) * (t - 3.0) / 14.0 + 0.5
            }
            PotentialKind::Quartic => -2.0 * x[0] * x[0] + x[0].powi(4),
            PotentialKind::Gaussian => 0.5 * x[0] * x[0],
            PotentialKind::GaussianMean => self.data.iter().map(|d| 0.5 * (x[0] - d).powi(2)).sum(),
            PotentialKind::Gmm5 => {
                let s2 = GMM_SIGMA * GMM_SIGMA;
                let p: f64 = Self::modes()
                    .map(|(mx, my)| {
                        (-((x[0] - mx).powi(2) + (x[1] - my).powi(2)) / (2.0 * s2)).exp()
                    })
                    .sum();
                -(p.max(1e-300)).ln()
            }
        }
    }

    /// ∇U at a point; for `gaussian-mean`, the minibatch estimate over `batch`.
    pub fn gradient(&self, x: &[f64], batch: &[usize]) -> Vec<f64> {
        match self.kind {
            PotentialKind::DoubleWell => {
                let t = x[0];
                // d/dθ of (θ+4)(θ+1)(θ−1)(θ−3) = (θ+4)(θ²−1)(θ−3): product rule.
                let (a, b, c) = (t + 4.0, t * t - 1.0, t - 3.0);
                vec![(b * c + a * 2.0 * t * c + a * b) / 14.0]
            }
            PotentialKind::Quartic => vec![-4.0 * x[0] + 4.0 * x[0].powi(3)],
            PotentialKind::Gaussian => vec![x[0]],
            PotentialKind::GaussianMean => {
                let s: f64 = batch.iter().map(|&i| x[0] - self.data[i]).sum();
                vec![s * GM_N as f64 / batch.len() as f64]
            }
            PotentialKind::Gmm5 => {
                let s2 = GMM_SIGMA * GMM_SIGMA;
                let (mut w, mut gx, mut gy) = (0.0, 0.0, 0.0);
                for (mx, my) in Self::modes() {
                    let e = (-((x[0] - mx).powi(2) + (x[1] - my).powi(2)) / (2.0 * s2)).exp();
                    w += e;
                    gx += e * (x[0] - mx) / s2;
                    gy += e * (x[1] - my) / s2;
                }
                let w = w.max(1e-300);
                vec![gx / w, gy / w]
            }
        }
    }

    /// The box on which densities are compared.
    pub fn range(&self) -> (f64, f64) {
        match self.kind {
            PotentialKind::DoubleWell => (-6.0, 5.0),
            PotentialKind::Quartic => (-2.5, 2.5),
            PotentialKind::Gaussian => (-8.0, 8.0),
            PotentialKind::GaussianMean => {
                let mean = self.data.iter().sum::<f64>() / GM_N as f64;
                let sd = 1.0 / (GM_N as f64).sqrt();
                (mean - 8.0 * sd, mean + 8.0 * sd)
            }
            PotentialKind::Gmm5 => (-6.5, 6.5),
        }
    }

    /// The exact posterior of `gaussian-mean`: N(x̄, 1/N).
    pub fn gaussian_mean_truth(&self) -> (f64, f64) {
        (
            self.data.iter().sum::<f64>() / GM_N as f64,
            1.0 / GM_N as f64,
        )
    }
}

/// Options of one `bnn sample` run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SampleOptions {
    /// The target.
    pub potential: PotentialKind,
    /// The sampler.
    pub sampler: SamplerKind,
    /// Its integrator.
    pub integrator: Integrator,
    /// Physical step h.
    pub h: f64,
    /// Friction C (SGHMC): α = C·h.
    pub friction: f64,
    /// Diffusion A (SGNHT, mSGNHT): a = A·h; also the initial thermostat.
    pub diffusion: f64,
    /// Gradient-noise level B (unknown to the sampler); ignored by `gaussian-mean`.
    pub noise: f64,
    /// SGHMC's noise estimate B̂ (β̂ = B̂·h); B̂ = C injects no noise at all.
    pub noise_estimate: f64,
    /// Updates per chain.
    pub steps: usize,
    /// Updates discarded first.
    pub burnin: usize,
    /// Independent chains run side by side (one tensor; a scalar thermostat is shared).
    pub chains: usize,
    /// Histogram bins.
    pub bins: usize,
    /// Seed of everything random.
    pub seed: u64,
    /// Replica exchange (`--sampler renhd|reld`): rungs, ladder, exchanges.
    #[serde(default)]
    pub replicas: replicas::ReplicaOptions,
    /// Noise N(0, V) on U and on each coordinate of ∇U, unknown to the sampler, instead of
    /// the gradient noise of `noise`; `None`: 0.25 for `gmm5` (Luo et al. §4.1), the
    /// gradient noise of `noise` otherwise.
    #[serde(default)]
    pub noise_variance: Option<f64>,
}

/// What `bnn sample` reports.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SampleReport {
    /// The options it ran with.
    pub options: SampleOptions,
    /// Samples kept.
    pub samples: usize,
    /// KL(sample histogram ‖ true density) on the grid, samples outside it included as one
    /// more bin.
    pub kl: f64,
    /// Fraction of samples outside the grid (not in the KL).
    pub outside: f64,
    /// Sample mean per coordinate.
    pub mean: Vec<f64>,
    /// The target's mean.
    pub true_mean: Vec<f64>,
    /// Sample variance per coordinate.
    pub var: Vec<f64>,
    /// The target's variance.
    pub true_var: Vec<f64>,
    /// Largest error of the mean.
    pub mean_error: f64,
    /// Largest relative error of the variance.
    pub var_error: f64,
    /// Mean kinetic energy per dimension (½ at the right temperature).
    pub kinetic_energy: Option<f64>,
    /// Mean thermostat ξ = α/h.
    pub thermostat: Option<f64>,
    /// Integrated autocorrelation time of the first coordinate (batch means), in steps.
    pub iat: f64,
    /// Effective sample size of the first coordinate.
    pub ess: f64,
    /// The step at which the position became non-finite; the statistics then cover
    /// the samples before it and the KL is infinite (`null` in JSON).
    pub diverged_at: Option<usize>,
    /// `gmm5`: the fraction of samples nearest each mode (true weight 0.2 each), and the
    /// largest deviation from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode_mass: Option<Vec<f64>>,
    /// Largest error of a mode's probability mass (GMM targets).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_mode_mass_error: Option<f64>,
    /// Replica exchange: the ladder and its swap statistics, swaps per try of each pair
    /// (pair i: temperatures i and i+1), and the variance of the first coordinate at each
    /// temperature after burn-in (exp(−U/T) has T·σ² for a Gaussian U).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ladder: Option<crate::sampler::ladder::Ladder>,
    /// Swap rates of adjacent pairs (replica exchange).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swap_rates: Option<Vec<f64>>,
    /// Variance of each replica's temperature over the run (replica exchange).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature_variances: Option<Vec<f64>>,
    /// Each coordinate's marginal on the grid: the samples' histogram against the true
    /// density (what `bnn sample --plot` draws).
    #[serde(default)]
    pub marginals: Vec<Marginal>,
}

/// One coordinate's marginal on the grid, as densities (integrating to the mass inside).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Marginal {
    /// Bin centres.
    pub centers: Vec<f64>,
    /// Sampled density per bin.
    pub sampled: Vec<f64>,
    /// True density per bin.
    pub truth: Vec<f64>,
}

/// Runs the sampler; returns the report and the kept samples (steps × chains × dim).
pub fn run(opts: &SampleOptions) -> Result<(SampleReport, Vec<f32>)> {
    if opts.sampler.is_replica_exchange() {
        return replicas::run(opts);
    }
    check_options(opts)?;
    let pot = Potential::new(opts.potential, opts.seed);
    let dim = pot.dim();
    check_grid(opts, dim)?;
    let mut walk = Walk::new(opts, &pot)?;
    driver::drive(&mut walk, &mut driver::Checkpoints::in_memory())?;
    let n = opts.chains * dim;
    let samples = walk.samples;
    if let Some(step) = walk.diverged_at {
        tracing::warn!(
            step,
            "the chain diverged (non-finite position); try a smaller --h"
        );
        let report = SampleReport {
            kl: f64::INFINITY,
            diverged_at: walk.diverged_at,
            ..summarise(&pot, opts, &samples, samples.len() / n, dim)?
        };
        return Ok((report, samples));
    }
    let report = summarise(&pot, opts, &samples, opts.steps - opts.burnin, dim)?;
    let (ke, xi, count) = walk.diagnostics;
    let report = SampleReport {
        kinetic_energy: ke.map(|k| k / count as f64),
        thermostat: xi.map(|x| x / count as f64),
        ..report
    };
    Ok((report, samples))
}

/// The chains' walk, as the driver runs it in memory: one update of every chain a unit,
/// the positions after burn-in kept.
struct Walk<'a> {
    opts: &'a SampleOptions,
    /// Every chain's position (chain after chain), its sampler and its noisy gradient.
    params: [Var; 1],
    sampler: Box<dyn sampler::Sampler>,
    gradients: NoisyGradient<'a>,
    step: usize,
    /// The positions after burn-in (steps × chains × dim).
    samples: Vec<f32>,
    /// After burn-in: the sums of the kinetic energy and of ξ where the sampler has
    /// them, and the updates summed.
    diagnostics: (Option<f64>, Option<f64>, usize),
    /// The update at which a chain left the finite numbers.
    diverged_at: Option<usize>,
}

impl<'a> Walk<'a> {
    fn new(opts: &'a SampleOptions, pot: &'a Potential) -> Result<Self> {
        let n = opts.chains * pot.dim();
        let theta = Var::from_vec(start_point(opts, pot), n, &Device::Cpu)?;
        let params = [theta];
        let chain = sampler_config(opts).params()?;
        Ok(Walk {
            opts,
            sampler: sampler::build_with(chain, &params, opts.seed, Kernel::Fused)?,
            params,
            gradients: NoisyGradient::new(opts, pot),
            step: 0,
            samples: Vec::with_capacity((opts.steps - opts.burnin) * n),
            diagnostics: (None, None, 0),
            diverged_at: None,
        })
    }
}

impl driver::Transition for Walk<'_> {
    fn done(&self) -> u64 {
        self.step as u64
    }

    fn total(&self) -> u64 {
        self.opts.steps as u64
    }

    /// One update; false when a chain left the finite numbers.
    fn advance(&mut self) -> Result<bool> {
        let (opts, step) = (self.opts, self.step);
        let theta = self.params[0].as_tensor();
        let x: Vec<f32> = theta.to_vec1()?;
        let g = self.gradients.at(&x, step as u64);
        let g = Tensor::from_vec(g, x.len(), &Device::Cpu)?;
        self.sampler.step(&self.params, &[g])?;
        let now: Vec<f32> = self.params[0].as_tensor().to_vec1()?;
        if now.iter().any(|v| !v.is_finite()) {
            self.diverged_at = Some(step);
            return Ok(false);
        }
        if step >= opts.burnin {
            self.samples.extend(now);
            let diag = self.sampler.diagnostics();
            let (ke, xi, count) = &mut self.diagnostics;
            if let Some(k) = diag.kinetic_energy {
                *ke = Some(ke.unwrap_or(0.0) + k);
            }
            if let Some(t) = diag.thermostat {
                *xi = Some(xi.unwrap_or(0.0) + t / opts.h);
            }
            *count += 1;
        }
        self.step += 1;
        Ok(true)
    }

    /// A chain in memory saves nothing.
    fn save(&mut self) -> Result<()> {
        Ok(())
    }

    fn folder(&self) -> Option<&std::path::Path> {
        None
    }
}

/// Refuses options that give no chain to run.
fn check_options(opts: &SampleOptions) -> Result<()> {
    if opts.h.is_nan()
        || opts.h <= 0.0
        || opts.steps == 0
        || opts.chains == 0
        || opts.bins < 2
        || opts.burnin >= opts.steps
    {
        return Err(Error::Config(
            "bnn sample needs --h > 0, --steps > --burnin, --chains ≥ 1 and --bins ≥ 2".into(),
        ));
    }
    Ok(())
}

/// Refuses a histogram grid too large to hold.
fn check_grid(opts: &SampleOptions, dim: usize) -> Result<()> {
    if opts
        .bins
        .checked_pow(dim as u32)
        .is_none_or(|cells| cells > 4_000_000)
    {
        return Err(Error::Config(format!(
            "--bins {} makes a grid of more than 4,000,000 cells in {dim} dimensions",
            opts.bins
        )));
    }
    Ok(())
}

/// The sampler's v-form settings from the continuous-time ones: η = h², α = C·h,
/// β̂ = B̂·h, a = A·h (Chen et al. 2014 eq. 15; Ding et al. 2014 Alg. 2).
fn sampler_config(opts: &SampleOptions) -> SamplerConfig {
    SamplerConfig {
        kind: opts.sampler,
        step_size: opts.h * opts.h,
        friction: opts.friction * opts.h,
        noise_estimate: opts.noise_estimate * opts.h,
        diffusion: opts.diffusion * opts.h,
        integrator: opts.integrator,
        rms_decay: None,
        rms_damping: None,
    }
}

/// Every chain starts at the same point in the box: the first mode or the middle.
fn start_point(opts: &SampleOptions, pot: &Potential) -> Vec<f32> {
    let (dim, (lo, hi)) = (pot.dim(), pot.range());
    (0..opts.chains * dim)
        .map(|i| match (opts.potential, i % dim) {
            (PotentialKind::Gmm5, 0) => GMM_RADIUS as f32,
            (PotentialKind::Gmm5, _) => 0.0,
            _ => ((lo + hi) / 2.0) as f32,
        })
        .collect()
}

/// ∇Ũ of every chain: the potential's gradient on a fresh random minibatch
/// (`gaussian-mean`), or the exact gradient plus N(0, V) noise (the others).
struct NoisyGradient<'a> {
    opts: &'a SampleOptions,
    pot: &'a Potential,
    noise_sd: f64,
    rng: rand::rngs::StdRng,
    z: Vec<f32>,
}

impl<'a> NoisyGradient<'a> {
    fn new(opts: &'a SampleOptions, pot: &'a Potential) -> Self {
        NoisyGradient {
            opts,
            pot,
            noise_sd: gradient_noise_sd(opts),
            rng: rand::rngs::StdRng::seed_from_u64(opts.seed ^ crate::rng::SYNTHETIC_NOISE_STREAM),
            z: vec![0f32; opts.chains * pot.dim()],
        }
    }

    /// The gradients at the chains' positions `x` (chain after chain) at update `step`.
    fn at(&mut self, x: &[f32], step: u64) -> Vec<f32> {
        let (opts, dim) = (self.opts, self.pot.dim());
        let minibatch = opts.potential == PotentialKind::GaussianMean;
        // A fresh random minibatch every step (independent across steps, so the
        // gradient noise is white, as the samplers' theory assumes).
        let batch: Vec<usize> = if minibatch {
            rand::seq::index::sample(&mut self.rng, GM_N, GM_BATCH).into_vec()
        } else {
            Vec::new()
        };
        NoiseKey {
            seed: opts.seed ^ crate::rng::SYNTHETIC_GRADIENT_STREAM,
            step,
            param: 0,
        }
        .fill(&mut self.z);
        let mut g = vec![0f32; x.len()];
        for c in 0..opts.chains {
            let xc: Vec<f64> = x[c * dim..(c + 1) * dim]
                .iter()
                .map(|&v| v as f64)
                .collect();
            let gc = self.pot.gradient(&xc, &batch);
            for d in 0..dim {
                let injected = if minibatch {
                    0.0
                } else {
                    self.noise_sd * self.z[c * dim + d] as f64
                };
                g[c * dim + d] = (gc[d] + injected) as f32;
            }
        }
        g
    }
}

/// V of the noise N(0, V) on U and ∇U: `--noise-variance`, else for `gmm5` Luo et al.'s
/// 0.25 (§4.1); `None`: the gradient noise of `--noise` alone.
fn noise_variance(opts: &SampleOptions) -> Option<f64> {
    opts.noise_variance
        .or((opts.potential == PotentialKind::Gmm5).then_some(GMM_NOISE_VARIANCE))
}

/// The standard deviation of the noise on each coordinate of ∇U: √V (see
/// [`noise_variance`]), else √(2B/h).
fn gradient_noise_sd(opts: &SampleOptions) -> f64 {
    noise_variance(opts).map_or((2.0 * opts.noise / opts.h).sqrt(), f64::sqrt)
}

/// The fraction of 2-D `samples` nearest each of gmm5's modes, and the largest deviation
/// from the true weights (equal: 0.2).
pub(crate) fn mode_masses(samples: &[f32]) -> (Vec<f64>, f64) {
    let modes: Vec<(f64, f64)> = Potential::modes().collect();
    let mut counts = vec![0usize; modes.len()];
    for p in samples.chunks_exact(2) {
        let (x, y) = (p[0] as f64, p[1] as f64);
        let nearest = (0..modes.len())
            .min_by(|&a, &b| {
                let d = |k: usize| (x - modes[k].0).powi(2) + (y - modes[k].1).powi(2);
                d(a).total_cmp(&d(b))
            })
            .unwrap_or(0);
        counts[nearest] += 1;
    }
    let n = (samples.len() / 2).max(1) as f64;
    let mass: Vec<f64> = counts.iter().map(|&c| c as f64 / n).collect();
    let worst = mass
        .iter()
        .map(|m| (m - 1.0 / modes.len() as f64).abs())
        .fold(0.0, f64::max);
    (mass, worst)
}

/// Grid truth, histogram KL, moments, IAT.
#[allow(clippy::needless_range_loop)] // d indexes several per-dimension arrays at once
fn summarise(
    pot: &Potential,
    opts: &SampleOptions,
    samples: &[f32],
    kept: usize,
    dim: usize,
) -> Result<SampleReport> {
    let grid = Grid::new(pot, opts.bins, dim);
    let truth = grid.truth(pot);
    let (true_mean, true_var) = if opts.potential == PotentialKind::GaussianMean {
        let (m, v) = pot.gaussian_mean_truth();
        (vec![m], vec![v])
    } else {
        grid.moments(&truth)
    };
    let hist = grid.histogram(samples);
    let kl = hist.kl_from(&truth);
    let marginals = (0..dim).map(|d| grid.marginal(d, &hist, &truth)).collect();
    let (mean, var) = sample_moments(samples, dim);
    let largest_gap = |a: &[f64], b: &[f64]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f64::max)
    };
    let (mean_error, var_error) = (largest_gap(&mean, &true_mean), largest_gap(&var, &true_var));
    // IAT of the first coordinate of the first chain, by batch means over ~√n batches.
    let stride = opts.chains * dim;
    let series: Vec<f64> = (0..kept).map(|t| samples[t * stride] as f64).collect();
    let iat = batch_means_iat(&series);
    let masses = (opts.potential == PotentialKind::Gmm5).then(|| mode_masses(samples));
    let total = hist.total;
    Ok(SampleReport {
        options: opts.clone(),
        samples: total,
        kl,
        outside: 1.0 - hist.inside as f64 / total.max(1) as f64,
        mean,
        true_mean,
        var,
        true_var,
        mean_error,
        var_error,
        kinetic_energy: None,
        thermostat: None,
        iat,
        ess: opts.chains as f64 * kept as f64 / iat,
        diverged_at: None,
        mode_mass: masses.as_ref().map(|m| m.0.clone()),
        max_mode_mass_error: masses.map(|m| m.1),
        ladder: None,
        swap_rates: None,
        temperature_variances: None,
        marginals,
    })
}

/// The potential's box cut into `bins` cells per coordinate, `bins^dim` in all; cell `c`
/// has index `(c / bins^d) % bins` along coordinate `d`.
struct Grid {
    lo: f64,
    width: f64,
    bins: usize,
    dim: usize,
    cells: usize,
}

/// Samples counted per cell, and how many fell inside the box of how many.
struct Histogram {
    counts: Vec<f64>,
    inside: usize,
    total: usize,
}

impl Grid {
    fn new(pot: &Potential, bins: usize, dim: usize) -> Self {
        let (lo, hi) = pot.range();
        Grid {
            lo,
            width: (hi - lo) / bins as f64,
            bins,
            dim,
            cells: bins.pow(dim as u32),
        }
    }

    fn center(&self, k: usize) -> f64 {
        self.lo + (k as f64 + 0.5) * self.width
    }

    /// The index of cell `c` along coordinate `d`.
    fn index(&self, c: usize, d: usize) -> usize {
        (c / self.bins.pow(d as u32)) % self.bins
    }

    /// The true probability of each cell (midpoint rule), normalised.
    fn truth(&self, pot: &Potential) -> Vec<f64> {
        let energies: Vec<f64> = (0..self.cells)
            .map(|c| {
                let x: Vec<f64> = (0..self.dim)
                    .map(|d| self.center(self.index(c, d)))
                    .collect();
                pot.energy(&x)
            })
            .collect();
        let emin = energies.iter().cloned().fold(f64::INFINITY, f64::min);
        let mut p: Vec<f64> = energies.iter().map(|e| (-(e - emin)).exp()).collect();
        let z: f64 = p.iter().sum();
        p.iter_mut().for_each(|v| *v /= z);
        p
    }

    /// Mean and variance per coordinate of the cells' probabilities `p`.
    fn moments(&self, p: &[f64]) -> (Vec<f64>, Vec<f64>) {
        let mut mean = vec![0f64; self.dim];
        let mut var = vec![0f64; self.dim];
        for (c, pc) in p.iter().enumerate() {
            for (d, m) in mean.iter_mut().enumerate() {
                *m += pc * self.center(self.index(c, d));
            }
        }
        for (c, pc) in p.iter().enumerate() {
            for (d, v) in var.iter_mut().enumerate() {
                *v += pc * (self.center(self.index(c, d)) - mean[d]).powi(2);
            }
        }
        (mean, var)
    }

    /// The samples (`dim` values each) counted per cell.
    fn histogram(&self, samples: &[f32]) -> Histogram {
        let mut counts = vec![0f64; self.cells];
        let (mut inside, mut total) = (0usize, 0usize);
        for point in samples.chunks_exact(self.dim) {
            total += 1;
            let mut cell = 0;
            let mut ok = true;
            for (d, &v) in point.iter().enumerate() {
                let k = ((v as f64 - self.lo) / self.width).floor();
                if !(0.0..self.bins as f64).contains(&k) {
                    ok = false;
                    break;
                }
                cell += (k as usize) * self.bins.pow(d as u32);
            }
            if ok {
                counts[cell] += 1.0;
                inside += 1;
            }
        }
        Histogram {
            counts,
            inside,
            total,
        }
    }

    /// Coordinate `d`'s marginal: the cells summed over the other coordinates, as
    /// densities.
    fn marginal(&self, d: usize, hist: &Histogram, p: &[f64]) -> Marginal {
        let (mut sampled, mut truth) = (vec![0f64; self.bins], vec![0f64; self.bins]);
        for (c, (qc, pc)) in hist.counts.iter().zip(p).enumerate() {
            let k = self.index(c, d);
            sampled[k] += qc / (hist.total.max(1) as f64 * self.width);
            truth[k] += pc / self.width;
        }
        Marginal {
            centers: (0..self.bins).map(|k| self.center(k)).collect(),
            sampled,
            truth,
        }
    }
}

impl Histogram {
    /// KL(sampled ‖ true) over the cells. Samples outside the box count as one more bin
    /// whose true mass is taken as 1e-12 (every box holds all but a negligible tail of its
    /// target).
    fn kl_from(&self, p: &[f64]) -> f64 {
        let n = self.total.max(1) as f64;
        let outside_mass = (self.total - self.inside) as f64 / n;
        let inside: f64 = self
            .counts
            .iter()
            .zip(p)
            .filter(|(qc, _)| **qc > 0.0)
            .map(|(qc, pc)| {
                let qn = qc / n;
                qn * (qn / pc.max(1e-300)).ln()
            })
            .sum::<f64>();
        inside
            + if outside_mass > 0.0 {
                outside_mass * (outside_mass / 1e-12).ln()
            } else {
                0.0
            }
    }
}

/// Mean and (population) variance per coordinate of the samples.
fn sample_moments(samples: &[f32], dim: usize) -> (Vec<f64>, Vec<f64>) {
    let count = (samples.len() / dim) as f64;
    let mut mean = vec![0f64; dim];
    for point in samples.chunks_exact(dim) {
        for d in 0..dim {
            mean[d] += point[d] as f64 / count;
        }
    }
    let mut var = vec![0f64; dim];
    for point in samples.chunks_exact(dim) {
        for d in 0..dim {
            var[d] += (point[d] as f64 - mean[d]).powi(2) / count;
        }
    }
    (mean, var)
}

/// τ ≈ b·Var(batch means)/Var(x) with batches of b = ⌊√n⌋ steps.
pub(crate) fn batch_means_iat(x: &[f64]) -> f64 {
    let n = x.len();
    let b = ((n as f64).sqrt() as usize).max(1);
    let k = n / b;
    if k < 2 {
        return 1.0;
    }
    let mean = x[..k * b].iter().sum::<f64>() / (k * b) as f64;
    let var = x[..k * b].iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (k * b) as f64;
    if var == 0.0 {
        return n as f64;
    }
    let bm: Vec<f64> = x[..k * b]
        .chunks_exact(b)
        .map(|c| c.iter().sum::<f64>() / b as f64)
        .collect();
    let vb = bm.iter().map(|m| (m - mean).powi(2)).sum::<f64>() / (k - 1) as f64;
    (b as f64 * vb / var).max(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    #[test]
    fn gradients_match_finite_differences() {
        for kind in [
            PotentialKind::DoubleWell,
            PotentialKind::Quartic,
            PotentialKind::Gmm5,
            PotentialKind::GaussianMean,
        ] {
            let p = Potential::new(kind, 1);
            let all: Vec<usize> = (0..GM_N).collect();
            let x: Vec<f64> = (0..p.dim()).map(|d| 0.37 + 0.9 * d as f64).collect();
            let g = p.gradient(&x, &all);
            for d in 0..p.dim() {
                let (mut a, mut b) = (x.clone(), x.clone());
                a[d] += 1e-6;
                b[d] -= 1e-6;
                let fd = (p.energy(&a) - p.energy(&b)) / 2e-6;
                assert!(
                    (fd - g[d]).abs() < 1e-5 * fd.abs().max(1.0),
                    "{kind:?} d{d}: {fd} vs {}",
                    g[d]
                );
            }
        }
    }

    #[test]
    fn iat_of_independent_and_correlated_series() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let white: Vec<f64> = (0..40_000).map(|_| rng.random::<f64>() - 0.5).collect();
        let t = batch_means_iat(&white);
        assert!(t < 1.3, "white noise IAT {t}");
        // AR(1) with φ = 0.9: τ = (1 + φ)/(1 − φ) = 19.
        let mut x = 0.0;
        let ar: Vec<f64> = (0..400_000)
            .map(|_| {
                x = 0.9 * x + rng.random::<f64>() - 0.5;
                x
            })
            .collect();
        let t = batch_means_iat(&ar);
        assert!((t - 19.0).abs() < 3.0, "AR(1) IAT {t}");
    }
}
