//! The Bayesian model average of a regression, streamed sample by sample: each posterior
//! sample s predicts for test point i a Gaussian N(μₛᵢ, σ²ₛᵢ) (its mean and its noise), and
//! the predictive distribution is their mixture p(y|xᵢ) = (1/S) Σₛ N(y; μₛᵢ, σ²ₛᵢ) — not
//! a Gaussian fitted to it.
//!
//! Every metric streams, so no sample is held: per point the sums Σμ, Σμ², Σσ², the
//! mixture's CDF at the target Σₛ Φ((yᵢ − μₛᵢ)/σₛᵢ), and a running log-sum-exp of the
//! components' log-densities at the target.
//!
//! - RMSE of the ensemble mean μ̄ᵢ = (1/S) Σₛ μₛᵢ;
//! - NLL: −(1/n) Σᵢ log p(yᵢ|xᵢ) of the mixture;
//! - coverage of the central 50/90/95% predictive intervals: the fraction of points whose
//!   mixture CDF at the target lies in [(1 − q)/2, (1 + q)/2] (the target is inside the
//!   central q-interval of a continuous distribution exactly then);
//! - the predictive variance split into aleatoric, the mean of σ², and epistemic, the
//!   variance of the means (law of total variance), each averaged over the points.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The central intervals whose coverage is reported.
pub(crate) const COVERAGE_LEVELS: [f64; 3] = [0.5, 0.9, 0.95];

/// A regression ensemble's metrics on a test set.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RegressionMetrics {
    /// Root mean squared error of the ensemble mean.
    pub rmse: f64,
    /// Mean negative log-likelihood of the targets under the predictive mixture.
    pub nll: f64,
    /// The fraction of targets inside the central 50%, 90% and 95% predictive intervals.
    pub coverage: [f64; 3],
    /// Mean over the points of the mean predicted noise variance, E(σ²).
    pub aleatoric: f64,
    /// Mean over the points of the variance of the predicted means, Var(μ).
    pub epistemic: f64,
}

/// The streaming sums of one test set; plain data, so that a run's saved state holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RegressionAccumulator {
    targets: Vec<f64>,
    samples: usize,
    /// Each sample's own mean NLL on the points, in order (the chains' R̂ of the test
    /// log-likelihood).
    #[serde(default)]
    sample_nll: Vec<f64>,
    /// The last sample's own metrics.
    #[serde(default)]
    pub last_sample: Option<RegressionMetrics>,
    sum_mean: Vec<f64>,
    sum_mean_sq: Vec<f64>,
    sum_var: Vec<f64>,
    sum_cdf: Vec<f64>,
    /// Running log-sum-exp of the log-densities: the largest term and Σ exp(term − largest).
    lse_max: Vec<f64>,
    lse_sum: Vec<f64>,
}

impl RegressionAccumulator {
    /// An empty ensemble for the test targets `targets`.
    pub fn new(targets: &[f64]) -> Self {
        let n = targets.len();
        RegressionAccumulator {
            targets: targets.to_vec(),
            samples: 0,
            sample_nll: Vec::new(),
            last_sample: None,
            sum_mean: vec![0.0; n],
            sum_mean_sq: vec![0.0; n],
            sum_var: vec![0.0; n],
            sum_cdf: vec![0.0; n],
            // Before the first sample the sums are empty and these unread; 0 rather than
            // −∞ keeps the state JSON (which has no infinities).
            lse_max: vec![0.0; n],
            lse_sum: vec![0.0; n],
        }
    }

    /// An empty ensemble for `points` inputs whose targets are not known (a grid to draw
    /// a band on): [`RegressionAccumulator::predictive`] works, `metrics` gives `None`.
    pub fn without_targets(points: usize) -> Self {
        RegressionAccumulator::new(&vec![f64::NAN; points])
    }

    /// The predictive mixture's mean and variance at every point (law of total variance:
    /// the mean of the σ² plus the variance of the μ); empty before the first sample.
    pub fn predictive(&self) -> Vec<(f64, f64)> {
        if self.samples == 0 {
            return Vec::new();
        }
        let s = self.samples as f64;
        (0..self.targets.len())
            .map(|i| {
                let mean = self.sum_mean[i] / s;
                let epistemic = (self.sum_mean_sq[i] / s - mean * mean).max(0.0);
                (mean, self.sum_var[i] / s + epistemic)
            })
            .collect()
    }

    /// Samples added so far.
    pub fn samples(&self) -> usize {
        self.samples
    }

    /// Adds one posterior sample's predictions: the mean and the noise variance at every
    /// test point. Refuses predictions of the wrong length or a variance that is not
    /// positive and finite, leaving the sums as they were.
    pub fn add(&mut self, mean: &[f64], var: &[f64]) -> Result<()> {
        let n = self.targets.len();
        if mean.len() != n || var.len() != n {
            return Err(Error::Config(format!(
                "a prediction of {} means and {} variances for {n} test points",
                mean.len(),
                var.len()
            )));
        }
        // A zero variance is a point mass: its density, and so the NLL, is undefined.
        if let Some(&v) = var.iter().find(|v| !(**v > 0.0 && v.is_finite())) {
            return Err(Error::Invalid {
                name: "a predicted noise variance",
                rule: "positive and finite (σ² of the Gaussian likelihood)".into(),
                value: v,
            });
        }
        if let Some(m) = mean.iter().find(|m| !m.is_finite()) {
            return Err(Error::NotFinite(format!("a predicted mean ({m})")));
        }
        let mut own = RegressionAccumulator::new(&self.targets);
        let first = self.samples == 0;
        for i in 0..n {
            let (m, v, y) = (mean[i], var[i], self.targets[i]);
            own.sum_mean[i] = m;
            own.sum_var[i] = v;
            self.sum_mean[i] += m;
            self.sum_mean_sq[i] += m * m;
            self.sum_var[i] += v;
            let z = (y - m) / v.sqrt();
            self.sum_cdf[i] += normal_cdf(z);
            own.sum_cdf[i] = normal_cdf(z);
            let log_density = -0.5 * (z * z + (2.0 * std::f64::consts::PI * v).ln());
            (own.lse_max[i], own.lse_sum[i]) = (log_density, 1.0);
            if first {
                (self.lse_max[i], self.lse_sum[i]) = (log_density, 1.0);
            } else if log_density > self.lse_max[i] {
                self.lse_sum[i] = self.lse_sum[i] * (self.lse_max[i] - log_density).exp() + 1.0;
                self.lse_max[i] = log_density;
            } else {
                self.lse_sum[i] += (log_density - self.lse_max[i]).exp();
            }
        }
        self.samples += 1;
        own.samples = 1;
        self.last_sample = own.metrics();
        if let Some(m) = self.last_sample {
            self.sample_nll.push(m.nll);
        }
        Ok(())
    }

    /// Each sample's own mean test NLL, in order.
    pub fn sample_nll(&self) -> &[f64] {
        &self.sample_nll
    }

    /// The ensemble of several accumulators' samples on the same points (the chains of a
    /// run): their sums added, in the order given. An error when the points differ.
    pub fn pooled<'a>(
        parts: impl IntoIterator<Item = &'a RegressionAccumulator>,
    ) -> Result<RegressionAccumulator> {
        let mut parts = parts.into_iter();
        let mut all = parts
            .next()
            .ok_or_else(|| Error::Config("no ensemble to pool".into()))?
            .clone();
        for p in parts {
            if p.targets.len() != all.targets.len() {
                return Err(Error::Config(
                    "pooling ensembles of different test sets".into(),
                ));
            }
            if p.samples == 0 {
                continue;
            }
            let add =
                |a: &mut Vec<f64>, b: &Vec<f64>| a.iter_mut().zip(b).for_each(|(a, b)| *a += b);
            if all.samples == 0 {
                (all.lse_max, all.lse_sum) = (p.lse_max.clone(), p.lse_sum.clone());
            } else {
                for i in 0..all.targets.len() {
                    let top = all.lse_max[i].max(p.lse_max[i]);
                    all.lse_sum[i] = all.lse_sum[i] * (all.lse_max[i] - top).exp()
                        + p.lse_sum[i] * (p.lse_max[i] - top).exp();
                    all.lse_max[i] = top;
                }
            }
            add(&mut all.sum_mean, &p.sum_mean);
            add(&mut all.sum_mean_sq, &p.sum_mean_sq);
            add(&mut all.sum_var, &p.sum_var);
            add(&mut all.sum_cdf, &p.sum_cdf);
            all.samples += p.samples;
            all.sample_nll.extend(&p.sample_nll);
            all.last_sample = p.last_sample;
        }
        Ok(all)
    }

    /// The metrics of the samples so far (`None` before the first).
    pub fn metrics(&self) -> Option<RegressionMetrics> {
        let (s, n) = (self.samples as f64, self.targets.len() as f64);
        if self.samples == 0 || self.targets.is_empty() || self.targets[0].is_nan() {
            return None;
        }
        let (mut sq_err, mut nll, mut aleatoric, mut epistemic) = (0.0, 0.0, 0.0, 0.0);
        let mut inside = [0usize; 3];
        for (i, &y) in self.targets.iter().enumerate() {
            let mean = self.sum_mean[i] / s;
            sq_err += (y - mean).powi(2);
            // log p = log((1/S) Σ exp(ℓₛ)) = max + log Σ exp(ℓₛ − max) − log S.
            nll -= self.lse_max[i] + self.lse_sum[i].ln() - s.ln();
            aleatoric += self.sum_var[i] / s;
            epistemic += (self.sum_mean_sq[i] / s - mean * mean).max(0.0);
            let cdf = self.sum_cdf[i] / s;
            for (k, q) in COVERAGE_LEVELS.iter().enumerate() {
                if (0.5 - q / 2.0..=0.5 + q / 2.0).contains(&cdf) {
                    inside[k] += 1;
                }
            }
        }
        Some(RegressionMetrics {
            rmse: (sq_err / n).sqrt(),
            nll: nll / n,
            coverage: inside.map(|c| c as f64 / n),
            aleatoric: aleatoric / n,
            epistemic: epistemic / n,
        })
    }
}

/// Φ(z), the standard normal CDF, as ½·erfc(−z/√2).
pub(crate) fn normal_cdf(z: f64) -> f64 {
    0.5 * libm::erfc(-z / std::f64::consts::SQRT_2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_distr::{Distribution, StandardNormal};

    fn gaussian_nll(y: f64, m: f64, v: f64) -> f64 {
        0.5 * ((y - m).powi(2) / v + (2.0 * std::f64::consts::PI * v).ln())
    }

    /// One sample: the mixture is that Gaussian, so NLL and RMSE are its own, exactly up
    /// to rounding, and there is no epistemic part.
    #[test]
    fn one_sample_is_its_gaussian() {
        let y = [0.3, -1.2, 2.0];
        let (m, v) = ([0.0, -1.0, 1.5], [0.5, 2.0, 1.0]);
        let mut acc = RegressionAccumulator::new(&y);
        acc.add(&m, &v).unwrap();
        let got = acc.metrics().unwrap();
        let nll: f64 = (0..3).map(|i| gaussian_nll(y[i], m[i], v[i])).sum::<f64>() / 3.0;
        let rmse = ((0..3).map(|i| (y[i] - m[i]).powi(2)).sum::<f64>() / 3.0).sqrt();
        assert!((got.nll - nll).abs() < 1e-12, "{} vs {nll}", got.nll);
        assert!((got.rmse - rmse).abs() < 1e-12);
        assert_eq!(got.epistemic, 0.0);
        assert!((got.aleatoric - 3.5 / 3.0).abs() < 1e-12);
    }

    /// Two samples at ±1 with σ² = 0.25: the NLL is the mixture's, not a Gaussian's fitted
    /// to it; the variance splits into 0.25 aleatoric and 1 epistemic.
    #[test]
    fn two_samples_are_their_mixture() {
        let y = [0.0, 1.0, 3.0];
        let mut acc = RegressionAccumulator::new(&y);
        acc.add(&[1.0; 3], &[0.25; 3]).unwrap();
        acc.add(&[-1.0; 3], &[0.25; 3]).unwrap();
        let got = acc.metrics().unwrap();
        let mix = |y: f64| {
            let p = |m: f64| (-gaussian_nll(y, m, 0.25)).exp();
            -(0.5 * p(1.0) + 0.5 * p(-1.0)).ln()
        };
        let nll = (mix(0.0) + mix(1.0) + mix(3.0)) / 3.0;
        assert!((got.nll - nll).abs() < 1e-12, "{} vs {nll}", got.nll);
        assert!((got.epistemic - 1.0).abs() < 1e-12);
        assert!((got.aleatoric - 0.25).abs() < 1e-12);
        // A Gaussian fitted to the mixture (variance 1.25) would give another NLL.
        let fitted = (0..3).map(|i| gaussian_nll(y[i], 0.0, 1.25)).sum::<f64>() / 3.0;
        assert!((got.nll - fitted).abs() > 0.05);
    }

    /// Calibrated predictions cover their nominal fractions: 40,000 targets drawn from
    /// N(0, 1) (seed 4), predicted as N(0, 1) by two identical samples. The tolerance is
    /// 4 binomial standard deviations, √(q(1 − q)/n) ≤ 0.0025.
    #[test]
    fn calibrated_predictions_cover_their_levels() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(4);
        let n = 40_000;
        let y: Vec<f64> = (0..n).map(|_| StandardNormal.sample(&mut rng)).collect();
        let mut acc = RegressionAccumulator::new(&y);
        for _ in 0..2 {
            acc.add(&vec![0.0; n], &vec![1.0; n]).unwrap();
        }
        let got = acc.metrics().unwrap();
        for (c, q) in got.coverage.iter().zip(COVERAGE_LEVELS) {
            assert!((c - q).abs() < 0.01, "coverage {c} of the central {q}");
        }
        // The NLL of N(0, 1) data under N(0, 1): ½ log(2πe) ≈ 1.4189.
        let best = 0.5 * (2.0 * std::f64::consts::PI * std::f64::consts::E).ln();
        assert!((got.nll - best).abs() < 0.02, "{}", got.nll);
        // Over-confident predictions (σ halved) cover less.
        let mut narrow = RegressionAccumulator::new(&y);
        narrow.add(&vec![0.0; n], &vec![0.25; n]).unwrap();
        assert!(narrow.metrics().unwrap().coverage[2] < 0.7);
    }

    /// A target a thousand σ from every component keeps a finite NLL (log-sum-exp), and
    /// bad predictions are refused without touching the sums.
    #[test]
    fn far_targets_stay_finite_and_bad_predictions_are_refused() {
        let mut acc = RegressionAccumulator::new(&[1000.0]);
        acc.add(&[0.0], &[1.0]).unwrap();
        acc.add(&[1.0], &[1.0]).unwrap();
        let nll = acc.metrics().unwrap().nll;
        assert!(nll.is_finite() && nll > 4.9e5, "{nll}");
        let before = acc.clone();
        assert!(acc.add(&[0.0], &[0.0]).is_err());
        assert!(acc.add(&[f64::NAN], &[1.0]).is_err());
        assert!(acc.add(&[0.0, 1.0], &[1.0, 1.0]).is_err());
        assert_eq!(acc, before);
    }
}
