//! `bnn sample --sampler renhd|reld`: replica exchange on a synthetic potential (Luo et al.
//! 2018, Algorithm 2 with the exchange of Algorithm 1).
//!
//! A replica is one of our chains on U/T with (η, a) set from T ([`crate::sampler::replica`]).
//! At the start of each round between exchanges the paper re-draws v ~ N(0, Tε) and resets
//! s = c/T (Algorithm 2, line 3): a replica's sampler is built afresh each round, from its
//! current temperature and a seed of its own for that round.
//!
//! Exchange estimate: U is observed with noise N(0, V) unknown to the sampler, as a
//! minibatch estimate is; the estimate ΔẼ averages k paired evaluations, k = 8 doubling
//! until its estimated variance (sample variance / k) is at most σ*² (Algorithm 1, lines
//! 2–4, with repeated evaluations standing in for a growing minibatch).

use candle_core::{Device, Tensor, Var};
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;

use super::{
    gradient_noise_sd, noise_variance, summarise, PotentialKind, SampleOptions, SampleReport,
};
use crate::driver;
use crate::engine::exchange::{energy_difference, logistic, Compensation};
use crate::error::{Error, Result};
use crate::rng::NoiseKey;
use crate::sampler::ladder::Ladder;
use crate::sampler::replica::replica_params;
use crate::sampler::{self, Kernel};

pub use crate::sampler::replica::ReplicaOptions;

/// First count of paired evaluations of an exchange estimate, and the most it may grow to.
const FIRST_EVALUATIONS: usize = 8;
const MAX_EVALUATIONS: usize = 1 << 16;

/// Runs the replicas; the samples (and the report's statistics) are those of whichever
/// replica holds T₀ = 1 at each step after burn-in.
pub fn run(opts: &SampleOptions) -> Result<(SampleReport, Vec<f32>)> {
    check(opts)?;
    let ladder = new_ladder(opts)?;
    let pot = super::Potential::new(opts.potential, opts.seed);
    // One chain: the T = 1 replica's samples.
    let single = SampleOptions {
        chains: 1,
        ..opts.clone()
    };
    let start = super::start_point(&single, &pot);
    let walk = Walk::new(opts, &pot, &start)?;
    let compensation = Compensation::paper();
    let energies = Energies {
        pot: &pot,
        noise_sd: noise_variance(opts).unwrap_or(0.0).sqrt(),
        compensation: &compensation,
    };
    let mut rounds = Rounds {
        walk,
        ladder,
        rng: rand::rngs::StdRng::seed_from_u64(opts.seed ^ crate::rng::EXCHANGE_STREAM),
        energies,
    };
    driver::drive(&mut rounds, &mut driver::Checkpoints::in_memory())?;
    rounds.walk.report(&single, rounds.ladder)
}

/// The replicas' rounds, as the driver runs them in memory: a round of updates and the
/// exchanges after it a unit, counted in updates.
struct Rounds<'a> {
    walk: Walk<'a>,
    ladder: Ladder,
    /// The exchanges' stream, and the energies they compare.
    rng: rand::rngs::StdRng,
    energies: Energies<'a>,
}

impl driver::Transition for Rounds<'_> {
    fn done(&self) -> u64 {
        self.walk.step as u64
    }

    fn total(&self) -> u64 {
        self.walk.opts.steps as u64
    }

    /// A round and its exchanges, the ladder frozen after burn-in; false when the T = 1
    /// replica diverged.
    fn advance(&mut self) -> Result<bool> {
        if self.walk.step >= self.walk.opts.burnin {
            self.ladder.freeze();
        }
        if !self.walk.round(&self.ladder)? {
            return Ok(false);
        }
        let positions = &self.walk.positions;
        exchange(&mut self.ladder, &mut self.rng, positions, &self.energies)?;
        Ok(true)
    }

    /// Replicas in memory save nothing.
    fn save(&mut self) -> Result<()> {
        Ok(())
    }

    fn folder(&self) -> Option<&std::path::Path> {
        None
    }
}

/// The replicas' walk between exchanges, and what it keeps.
struct Walk<'a> {
    opts: &'a SampleOptions,
    pot: &'a super::Potential,
    /// Each replica's parameters.
    thetas: Vec<Var>,
    /// Each replica's position, read once after each of its updates (an Euler sampler's
    /// init does not move θ, so it stays valid across the rebuild of a round).
    positions: Vec<Vec<f64>>,
    /// The paper's c: RENHD's diffusion or RELD's friction, per unit of h.
    c: f64,
    /// The gradient noise's standard deviation, and the buffer of its standard normals.
    grad_sd: f64,
    z: Vec<f32>,
    /// Updates done.
    step: usize,
    /// The T = 1 replica's positions after burn-in.
    samples: Vec<f32>,
    /// Per temperature index: Σx, Σx² of the first coordinate, and the count, after
    /// burn-in.
    moments: Vec<(f64, f64, usize)>,
    /// The step at which the T = 1 replica left the finite numbers.
    diverged_at: Option<usize>,
}

impl<'a> Walk<'a> {
    fn new(opts: &'a SampleOptions, pot: &'a super::Potential, start: &[f32]) -> Result<Self> {
        let (n, dim) = (opts.replicas.replicas, pot.dim());
        let thetas: Vec<Var> = (0..n)
            .map(|_| Var::from_vec(start.to_vec(), dim, &Device::Cpu))
            .collect::<candle_core::Result<_>>()?;
        // RENHD's replicas are thermostats (c is the diffusion), RELD's Langevin (the
        // friction).
        let c = match opts.sampler.is_thermostat() {
            true => opts.diffusion * opts.h,
            false => opts.friction * opts.h,
        };
        Ok(Walk {
            opts,
            pot,
            thetas,
            positions: vec![start.iter().map(|&v| v as f64).collect(); n],
            c,
            grad_sd: gradient_noise_sd(opts),
            z: vec![0f32; dim],
            step: 0,
            samples: Vec::with_capacity((opts.steps - opts.burnin) * dim),
            moments: vec![(0.0, 0.0, 0); n],
            diverged_at: None,
        })
    }

    /// One round: each replica's sampler built afresh at its temperature, then updates up
    /// to the next exchange. False when the T = 1 replica diverged.
    fn round(&mut self, ladder: &Ladder) -> Result<bool> {
        let (opts, ro) = (self.opts, &self.opts.replicas);
        // Temperatures change only in exchanges, between rounds.
        let temps: Vec<f64> = (0..ro.replicas).map(|r| ladder.temperature_of(r)).collect();
        let epsilon = opts.h * opts.h;
        let mut samplers = (0..ro.replicas)
            .map(|r| {
                let params =
                    replica_params(opts.sampler, ro.thermostat, epsilon, self.c, temps[r])?;
                let seed = crate::rng::replica_round_seed(opts.seed, r, ladder.rounds);
                let theta = std::slice::from_ref(&self.thetas[r]);
                sampler::build_with(params, theta, seed, Kernel::Fused)
            })
            .collect::<Result<Vec<_>>>()?;
        let until = (self.step + ro.exchange_every).min(opts.steps);
        while self.step < until {
            for (r, s) in samplers.iter_mut().enumerate() {
                self.update(r, s.as_mut(), temps[r])?;
            }
            let cold = &self.positions[ladder.holder[0]];
            if cold.iter().any(|v| !v.is_finite()) {
                self.diverged_at = Some(self.step);
                return Ok(false);
            }
            if self.step >= opts.burnin {
                self.keep(ladder);
            }
            self.step += 1;
        }
        Ok(true)
    }

    /// Replica `r`'s update at temperature `t`: the noisy ∇U/T at its position.
    fn update(&mut self, r: usize, s: &mut dyn sampler::Sampler, t: f64) -> Result<()> {
        let dim = self.pot.dim();
        NoiseKey {
            seed: self.opts.seed ^ crate::rng::SYNTHETIC_GRADIENT_STREAM,
            step: self.step as u64,
            param: r as u32,
        }
        .fill(&mut self.z);
        let g: Vec<f32> = (self.pot.gradient(&self.positions[r], &[]).iter())
            .zip(&self.z)
            .map(|(g, &z)| ((g + self.grad_sd * z as f64) / t) as f32)
            .collect();
        let theta = std::slice::from_ref(&self.thetas[r]);
        s.step(theta, &[Tensor::from_vec(g, dim, &Device::Cpu)?])?;
        self.positions[r] = (self.thetas[r].as_tensor().to_vec1::<f32>()?.iter())
            .map(|&v| v as f64)
            .collect();
        Ok(())
    }

    /// Keeps the T = 1 replica's position and each temperature's moments.
    fn keep(&mut self, ladder: &Ladder) {
        // Exact: the positions are f32 values held as f64.
        let cold = &self.positions[ladder.holder[0]];
        self.samples.extend(cold.iter().map(|&v| v as f32));
        for (i, &r) in ladder.holder.iter().enumerate() {
            let x = self.positions[r][0];
            let m = &mut self.moments[i];
            *m = (m.0 + x, m.1 + x * x, m.2 + 1);
        }
    }

    /// The report of the T = 1 replica's samples, with the ladder's swap rates and each
    /// temperature's variance.
    fn report(self, single: &SampleOptions, ladder: Ladder) -> Result<(SampleReport, Vec<f32>)> {
        let dim = self.pot.dim();
        let got = self.samples.len() / dim;
        let mut report = summarise(self.pot, single, &self.samples, got, dim)?;
        report.options = self.opts.clone();
        report.swap_rates = Some(ladder.swap_rates());
        let variance = |&(s, s2, n): &(f64, f64, usize)| {
            let n = n.max(1) as f64;
            s2 / n - (s / n).powi(2)
        };
        report.temperature_variances = Some(self.moments.iter().map(variance).collect());
        report.ladder = Some(ladder);
        if let Some(step) = self.diverged_at {
            tracing::warn!(step, "the T = 1 replica diverged; try a smaller --h");
            report.kl = f64::INFINITY;
            report.diverged_at = self.diverged_at;
        }
        Ok((report, self.samples))
    }
}

/// Refuses options that give no ladder to run.
fn check(opts: &SampleOptions) -> Result<()> {
    let ro = &opts.replicas;
    if opts.h.is_nan() || opts.h <= 0.0 || opts.burnin >= opts.steps || ro.exchange_every == 0 {
        return Err(Error::Config(
            "bnn sample needs --h > 0, --steps > --burnin and --exchange-every ≥ 1".into(),
        ));
    }
    if opts.potential == PotentialKind::GaussianMean {
        return Err(Error::Config(
            "replica exchange needs an energy with known noise: not gaussian-mean".into(),
        ));
    }
    Ok(())
}

/// The ladder of `--ladder τ`, or one adapted from τ = 1.5 (the paper's ladder) towards
/// the target swap rate.
fn new_ladder(opts: &SampleOptions) -> Result<Ladder> {
    let ro = &opts.replicas;
    match ro.ladder {
        Some(tau) => Ladder::geometric(ro.replicas, tau, ro.pairs),
        None => Ladder::geometric(ro.replicas, 1.5, ro.pairs)?.adapting(ro.target_swap_rate),
    }
}

/// The noisy energy of the exchanges: U, its noise's standard deviation, and the
/// compensation of the noise in the test.
struct Energies<'a> {
    pot: &'a super::Potential,
    noise_sd: f64,
    compensation: &'a Compensation,
}

/// The exchanges that end a round: each pair the ladder proposes is swapped by the
/// noise-tolerant test on the replicas' `positions`; then the round ends.
fn exchange(
    ladder: &mut Ladder,
    rng: &mut rand::rngs::StdRng,
    positions: &[Vec<f64>],
    e: &Energies<'_>,
) -> Result<()> {
    for i in ladder.pairs(rng) {
        let (a, b) = (ladder.holder[i], ladder.holder[i + 1]);
        let (t_a, t_b) = (ladder.temperatures[i], ladder.temperatures[i + 1]);
        let (u_a, u_b) = (e.pot.energy(&positions[a]), e.pot.energy(&positions[b]));
        let (delta, variance) = estimate(rng, u_a, u_b, t_a, t_b, e.noise_sd, e.compensation)?;
        let accepted = e.compensation.accept(delta, variance, rng)?;
        ladder.record(i, accepted, logistic(delta));
    }
    ladder.end_round();
    Ok(())
}

/// ΔẼ from k paired noisy evaluations of U at the two replicas, k doubling from 8 until
/// the estimate's variance (sample variance / k) is at most σ*²: (estimate, its variance).
fn estimate<R: Rng>(
    rng: &mut R,
    u_a: f64,
    u_b: f64,
    t_a: f64,
    t_b: f64,
    energy_sd: f64,
    compensation: &Compensation,
) -> Result<(f64, f64)> {
    let mut d: Vec<f64> = Vec::new();
    let mut k = FIRST_EVALUATIONS;
    loop {
        while d.len() < k {
            let noisy = |u: f64, rng: &mut R| u + energy_sd * rng.sample::<f64, _>(StandardNormal);
            let (ua, ub) = (noisy(u_a, rng), noisy(u_b, rng));
            d.push(energy_difference(ua, ub, t_a, t_b));
        }
        let n = d.len() as f64;
        let mean = d.iter().sum::<f64>() / n;
        let var = d.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0) / n;
        if var <= compensation.sigma2 {
            return Ok((mean, var));
        }
        if k >= MAX_EVALUATIONS {
            return Err(Error::Config(format!(
                "exchange: {k} evaluations leave the estimate's variance at {var:.3} > σ*² = {}",
                compensation.sigma2
            )));
        }
        k *= 2;
    }
}
