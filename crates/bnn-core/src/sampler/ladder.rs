//! The temperature ladder of a replica-exchange run: which replica holds which
//! temperature, which pairs try to swap, swap rates, round trips, and (during burn-in)
//! the adaptation of the temperatures to a target swap rate.
//!
//! Replicas swap temperatures, not parameters (see [`crate::engine::exchange`]). Pairs are
//! adjacent temperature indices (i, i+1). Deterministic even/odd alternation (DEO: pairs
//! (0,1), (2,3), … in even rounds, (1,2), (3,4), … in odd ones) moves a replica
//! monotonically up or down the ladder between rejections, which is what makes round trips
//! fast (Syed et al. 2019, "Non-reversible parallel tempering"); Luo et al.'s Algorithm 2
//! picks the pairs at random (line 15), kept as an option: one random adjacent pair.

use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Which pairs try to swap in a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum PairSchedule {
    /// Even pairs in even rounds, odd pairs in odd rounds (Syed et al. 2019).
    Deo,
    /// One adjacent pair drawn at random per round (Luo et al. Algorithm 2, line 15).
    Random,
}

/// Adapting the temperatures to a target swap rate r during burn-in: each gap
/// ρᵢ = log(T_{i+1} − Tᵢ) moves by γₙ(p − r)/r after each try of pair i, p its swap
/// probability, with γₙ = (n + 1)^{−0.6} (a Robbins–Monro step; Atchadé, Roberts &
/// Rosenthal 2011): a pair that swaps more often than the target widens, one that swaps
/// less narrows. The error is relative to r so that a pair that never swaps narrows by up
/// to a factor e per try early on: on the Fashion MLP (d ≈ 8·10⁴) the gaps must fall from
/// the start's 0.01 to about 0.003 within the tens of tries burn-in allows a pair, which
/// the absolute error (p − r, at most 0.3 per unit γ) did not reach. Frozen after
/// burn-in, so that the chain from then on is an ordinary (fixed-ladder) MCMC, at the
/// average of each gap's iterates weighted by try number (Polyak–Ruppert averaging; the
/// weights k/Σk forget the far-off start): burn-in gives a pair only tens of tries, and
/// the last iterate carries the last steps' noise (each γₙ·(p − r)/r with g(ΔẼ) spread
/// ±0.25 around its mean), which the average removes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Adaptation {
    /// Target swap rate of each pair.
    pub target: f64,
    /// Whether adaptation has stopped (after burn-in).
    pub frozen: bool,
}

/// Rounds between two [`LadderSnapshot`]s.
pub const SNAPSHOT_ROUNDS: u64 = 50;

/// The ladder after a round: its temperatures and each pair's counts so far (since the
/// freeze, where it adapts), so that rates over windows of rounds are their differences.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LadderSnapshot {
    /// Round of the exchange.
    pub round: u64,
    /// Temperatures after it.
    pub temperatures: Vec<f64>,
    /// Swap attempts per pair so far.
    pub tries: Vec<u64>,
    /// Swaps per pair so far.
    pub swaps: Vec<u64>,
    /// Sums of the swap probabilities per pair.
    pub probability_sums: Vec<f64>,
}

/// The ladder and its statistics.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Ladder {
    /// T₀ = 1 < T₁ < … < T_{M−1}.
    pub temperatures: Vec<f64>,
    /// `holder[i]`: the replica at temperature index i.
    pub holder: Vec<usize>,
    /// DEO or random pairs.
    pub schedule: PairSchedule,
    /// The adaptation of the temperatures, while on.
    pub adaptation: Option<Adaptation>,
    /// Rounds of exchanges so far.
    pub rounds: u64,
    /// Per pair (i, i+1): tries and swaps; since the ladder froze where it adapts.
    pub tries: Vec<u64>,
    /// Swaps per pair.
    pub swaps: Vec<u64>,
    /// Per pair: the sum of the tries' swap probabilities (same span as `tries`).
    #[serde(default)]
    pub probability_sums: Vec<f64>,
    /// Tries per pair counted for the adaptation's step sizes.
    adapt_tries: Vec<u64>,
    /// Per pair: the try-number-weighted average of log(T_{i+1} − Tᵢ) over the
    /// adaptation's iterates, the gap the ladder freezes at.
    #[serde(default)]
    averaged_log_gaps: Vec<f64>,
    /// Per replica: completed round trips (T₀ → T_{M−1} → T₀), and whether it has reached
    /// the top since it last left the bottom (`None`: not yet at the bottom).
    pub round_trips: Vec<u64>,
    heading_down: Vec<Option<bool>>,
    /// Every [`SNAPSHOT_ROUNDS`] rounds: how the temperatures and the rates moved.
    #[serde(default)]
    pub history: Vec<LadderSnapshot>,
}

impl Ladder {
    /// M rungs T_j = τ^j, j = 0..M−1 (eq. 21, from T₀ = 1 as Algorithm 2 samples at T₀);
    /// replica j starts at temperature index j.
    pub fn geometric(replicas: usize, tau: f64, schedule: PairSchedule) -> Result<Self> {
        if replicas < 2 || !(tau > 1.0 && tau.is_finite()) {
            return Err(Error::Config(format!(
                "--replicas must be at least 2 and --ladder above 1, got {replicas} and {tau}"
            )));
        }
        let pairs = replicas - 1;
        let mut heading_down = vec![None; replicas];
        heading_down[0] = Some(false);
        Ok(Ladder {
            temperatures: (0..replicas).map(|j| tau.powi(j as i32)).collect(),
            holder: (0..replicas).collect(),
            schedule,
            adaptation: None,
            rounds: 0,
            tries: vec![0; pairs],
            swaps: vec![0; pairs],
            probability_sums: vec![0.0; pairs],
            adapt_tries: vec![0; pairs],
            averaged_log_gaps: vec![0.0; pairs],
            round_trips: vec![0; replicas],
            heading_down,
            history: Vec::new(),
        })
    }

    /// Adapts the temperatures to `target` swaps per try until [`Ladder::freeze`].
    pub fn adapting(mut self, target: f64) -> Result<Self> {
        if !(target > 0.0 && target < 1.0) {
            return Err(Error::Config(format!(
                "the target swap rate must be in (0, 1), got {target}"
            )));
        }
        self.adaptation = Some(Adaptation {
            target,
            frozen: false,
        });
        Ok(self)
    }

    /// Ends the adaptation at the averaged gaps (a pair never tried keeps its gap); the
    /// swap statistics start again for the fixed ladder.
    pub fn freeze(&mut self) {
        if let Some(a) = self.adaptation.as_mut() {
            if !a.frozen {
                a.frozen = true;
                for i in 0..self.tries.len() {
                    let tried = self.adapt_tries.get(i).is_some_and(|&n| n > 0);
                    let gap = match self.averaged_log_gaps.get(i) {
                        Some(rho) if tried => rho.exp(),
                        _ => self.temperatures[i + 1] - self.temperatures[i],
                    };
                    let shift = self.temperatures[i] + gap - self.temperatures[i + 1];
                    for t in &mut self.temperatures[i + 1..] {
                        *t += shift;
                    }
                }
                self.tries.iter_mut().for_each(|t| *t = 0);
                self.swaps.iter_mut().for_each(|s| *s = 0);
                self.probability_sums.iter_mut().for_each(|s| *s = 0.0);
            }
        }
    }

    /// M, replicas.
    pub fn replicas(&self) -> usize {
        self.temperatures.len()
    }

    /// The temperature replica `r` holds.
    pub fn temperature_of(&self, r: usize) -> f64 {
        let i = self.holder.iter().position(|&h| h == r).unwrap_or(0);
        self.temperatures[i]
    }

    /// The lower indices i of this round's pairs (i, i+1).
    pub fn pairs<R: Rng>(&self, rng: &mut R) -> Vec<usize> {
        let pairs = self.replicas() - 1;
        match self.schedule {
            PairSchedule::Deo => ((self.rounds % 2) as usize..pairs).step_by(2).collect(),
            PairSchedule::Random => vec![rng.random_range(0..pairs)],
        }
    }

    /// The outcome of pair (i, i+1)'s try: swaps the holders if `accepted`, counts it,
    /// adapts the ladder if it adapts. `probability` is the try's swap probability given
    /// what was measured (for the noisy test, g(ΔẼ)): the adaptation steps on it rather
    /// than on the 0/1 outcome, the same mean with less noise (Rao–Blackwellised), which
    /// matters when burn-in allows a pair only tens of tries.
    pub fn record(&mut self, i: usize, accepted: bool, probability: f64) {
        self.tries[i] += 1;
        if let Some(sum) = self.probability_sums.get_mut(i) {
            *sum += probability;
        }
        if accepted {
            self.swaps[i] += 1;
            self.holder.swap(i, i + 1);
        }
        if let Some(a) = self.adaptation.as_ref().filter(|a| !a.frozen) {
            let n = self.adapt_tries[i];
            self.adapt_tries[i] += 1;
            let gamma = ((n + 1) as f64).powf(-0.6);
            let rho = (self.temperatures[i + 1] - self.temperatures[i]).ln()
                + gamma * (probability.clamp(0.0, 1.0) - a.target) / a.target;
            let shift = self.temperatures[i] + rho.exp() - self.temperatures[i + 1];
            for t in &mut self.temperatures[i + 1..] {
                *t += shift;
            }
            if self.averaged_log_gaps.len() != self.adapt_tries.len() {
                // A state saved before the averaging existed: start it here.
                let t = &self.temperatures;
                self.averaged_log_gaps = t.windows(2).map(|w| (w[1] - w[0]).ln()).collect();
            }
            let weight = 2.0 / (n + 2) as f64; // iterate n + 1 of Σk = (n + 1)(n + 2)/2
            self.averaged_log_gaps[i] += weight * (rho - self.averaged_log_gaps[i]);
        }
    }

    /// Ends a round: counts it and the round trips completed; a snapshot every
    /// [`SNAPSHOT_ROUNDS`].
    pub fn end_round(&mut self) {
        self.rounds += 1;
        if self.rounds.is_multiple_of(SNAPSHOT_ROUNDS) {
            self.history.push(LadderSnapshot {
                round: self.rounds,
                temperatures: self.temperatures.clone(),
                tries: self.tries.clone(),
                swaps: self.swaps.clone(),
                probability_sums: self.probability_sums.clone(),
            });
        }
        let top = self.replicas() - 1;
        let (bottom_holder, top_holder) = (self.holder[0], self.holder[top]);
        if self.heading_down[top_holder] == Some(false) {
            self.heading_down[top_holder] = Some(true);
        }
        if self.heading_down[bottom_holder] == Some(true) {
            self.round_trips[bottom_holder] += 1;
        }
        self.heading_down[bottom_holder] = Some(false);
    }

    /// The mean swap probability of each pair's tries (0 where untried): the rate that
    /// `swap_rates` estimates, with less noise.
    pub fn expected_swap_rates(&self) -> Vec<f64> {
        self.tries
            .iter()
            .zip(&self.probability_sums)
            .map(|(&t, &p)| if t == 0 { 0.0 } else { p / t as f64 })
            .collect()
    }

    /// Swaps per try of each pair (0 where untried).
    pub fn swap_rates(&self) -> Vec<f64> {
        self.tries
            .iter()
            .zip(&self.swaps)
            .map(|(&t, &s)| if t == 0 { 0.0 } else { s as f64 / t as f64 })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn deo_alternates_and_round_trips_are_counted() {
        let mut l = Ladder::geometric(4, 2.0, PairSchedule::Deo).unwrap();
        assert_eq!(l.temperatures, vec![1.0, 2.0, 4.0, 8.0]);
        let mut rng = rand::rngs::StdRng::seed_from_u64(0);
        assert_eq!(l.pairs(&mut rng), vec![0, 2]);
        // Every swap accepted: replica 0 climbs a rung a round to the top (rounds 0–2),
        // waits a round there (the odd round has no pair with the top), and comes down in
        // rounds 4–6.
        for _ in 0..7 {
            for i in l.pairs(&mut rng) {
                l.record(i, true, 1.0);
            }
            l.end_round();
        }
        assert_eq!(l.pairs(&mut rng), vec![1]);
        assert_eq!(l.holder[0], 0, "{:?}", l.holder);
        assert_eq!(l.round_trips[0], 1, "{:?}", l.round_trips);
        assert_eq!(l.swap_rates(), vec![1.0, 1.0, 1.0]);
        assert_eq!(l.temperature_of(0), 1.0);
    }

    /// Pairs whose swap probability falls with the gap (p = e^{−4·gap}, as ΔE grows with
    /// ΔT): the adapted ladder swaps at the target rate on every pair, then freezes.
    #[test]
    fn adaptation_reaches_the_target_rate() {
        let mut l = Ladder::geometric(5, 3.0, PairSchedule::Deo)
            .unwrap()
            .adapting(0.3)
            .unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let p = |l: &Ladder, i: usize| (-4.0 * (l.temperatures[i + 1] - l.temperatures[i])).exp();
        for _ in 0..40_000 {
            for i in l.pairs(&mut rng) {
                let (q, u) = (p(&l, i), rng.random::<f64>());
                l.record(i, u < q, q);
            }
            l.end_round();
        }
        l.freeze();
        let frozen = l.temperatures.clone();
        for _ in 0..40_000 {
            for i in l.pairs(&mut rng) {
                let (q, u) = (p(&l, i), rng.random::<f64>());
                l.record(i, u < q, q);
            }
            l.end_round();
        }
        assert_eq!(l.temperatures, frozen);
        for (i, r) in l.swap_rates().iter().enumerate() {
            assert!(
                (r - 0.3).abs() < 0.03,
                "pair {i}: {r} ({:?})",
                l.temperatures
            );
        }
        assert_eq!(l.temperatures[0], 1.0);
        for (i, r) in l.expected_swap_rates().iter().enumerate() {
            assert!((r - 0.3).abs() < 0.03, "pair {i}: expected {r}");
        }
    }

    /// The swap rate E[g(x)] of a pair whose log swap ratio is x ~ N(−μ, 2μ) (the
    /// Gaussian law detailed balance allows: E[eˣ] = 1), g the logistic function; by
    /// quadrature on ±10 standard deviations.
    fn barker_rate(mu: f64) -> f64 {
        let sd = (2.0 * mu).sqrt();
        let steps = 4000;
        let h = 20.0 * sd / steps as f64;
        (0..=steps)
            .map(|k| {
                let x = -mu - 10.0 * sd + k as f64 * h;
                let z = (x + mu) / sd;
                let w = if k == 0 || k == steps { 0.5 } else { 1.0 };
                w * h * (-0.5 * z * z).exp()
                    / (sd * (2.0 * std::f64::consts::PI).sqrt())
                    / (1.0 + (-x).exp())
            })
            .sum()
    }

    /// What the Fashion MLP's burn-in gives the adaptation: ~30 tries per pair from a start
    /// 5× too narrow, each try's g(ΔẼ) as noisy as under the Gaussian law above with μ
    /// growing as the gap squared (ΔE ≈ Δβ·ΔU, both ∝ the gap). Over 200 seeded burn-ins
    /// the averaged ladder lands nearer the target than the last iterate, and near enough
    /// that a pair's rate is within 0.1 of it in at least 95% of the pairs (the bar
    /// for the run; the remaining misses are what 30 tries cannot resolve).
    #[test]
    fn averaged_gaps_beat_the_last_iterate_on_short_burn_ins() {
        use rand_distr::{Distribution, Normal};
        let k = 400.0; // μ = k·gap²: rate 0.3 near gap 0.06
        let rate = |t: &[f64], i: usize| barker_rate(k * (t[i + 1] - t[i]).powi(2));
        let (mut last_err, mut avg_err, mut avg_within, mut pairs) = (0.0, 0.0, 0, 0);
        for seed in 0..200 {
            let mut l = Ladder::geometric(8, 1.012, PairSchedule::Deo)
                .unwrap()
                .adapting(0.3)
                .unwrap();
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            for _ in 0..60 {
                for i in l.pairs(&mut rng) {
                    let mu = k * (l.temperatures[i + 1] - l.temperatures[i]).powi(2);
                    let x = Normal::new(-mu, (2.0 * mu).sqrt())
                        .unwrap()
                        .sample(&mut rng);
                    let g = 1.0 / (1.0 + (-x).exp());
                    l.record(i, rng.random::<f64>() < g, g);
                }
                l.end_round();
            }
            let last = l.temperatures.clone();
            l.freeze();
            for i in 0..7 {
                last_err += (rate(&last, i) - 0.3).abs();
                let e = (rate(&l.temperatures, i) - 0.3).abs();
                avg_err += e;
                avg_within += usize::from(e < 0.1);
                pairs += 1;
            }
        }
        let (last_err, avg_err) = (last_err / pairs as f64, avg_err / pairs as f64);
        let within = avg_within as f64 / pairs as f64;
        eprintln!("mean |rate − 0.3|: last iterate {last_err:.4}, averaged {avg_err:.4}; within 0.1: {within:.3}");
        assert!(avg_err < last_err, "{avg_err} against {last_err}");
        assert!(within >= 0.95, "{within}");
    }
}
