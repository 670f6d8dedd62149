//! The likelihood p(y | x, θ) of a task, and what the backward pass needs of it: the
//! minibatch's negative log-likelihood and the output error Δ_L = ∂(−log p)/∂f.
//!
//! - **Classification** (`Categorical`): p(y = c | x, θ) = softmax(f(x))_c over any number of
//!   classes (the network's outputs); the loss is in [`crate::engine::backprop::mlp`].
//! - **Regression** (`Gaussian`): y ~ N(f(x), σ²) with one output, in the standardised
//!   target's units. −log p = ½τ(f − y)² − ½ log τ + ½ log 2π with τ = 1/σ² the noise
//!   precision, so Δ = τ·(f − y) per example.
//!
//! σ is either fixed (`--noise-std`) or sampled: a Gamma(a, b) prior on τ, Gibbs-updated
//! from its conditional Gamma(a + N/2, b + SSE/2) exactly as the weight precisions are
//! ([`crate::potential::Prior::gibbs_step`]). Why a conjugate Gibbs step and not a log-σ
//! output unit: the conditional is exact and costs one forward pass over the training set
//! per epoch; it needs no second output whose gradient the samplers would have to mix with
//! the weights' (a log-σ unit's scale differs by orders of magnitude from a weight's, which
//! a single step size serves badly); and a homoscedastic σ is what the tabular data sets
//! assume (Friedman #1's noise is N(0, 1) everywhere).

use rand::SeedableRng;
use rand_distr::Distribution;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// ½ log 2π: the Gaussian's normalising constant per example.
pub const HALF_LOG_2PI: f64 = 0.918_938_533_204_672_8;

/// The likelihood of the task.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Likelihood {
    /// Softmax over the network's outputs: classification with as many classes as outputs.
    #[default]
    Categorical,
    /// y ~ N(f(x), σ²): regression with one output.
    Gaussian {
        /// How σ is set.
        noise: Noise,
    },
}

impl Likelihood {
    /// Whether this is classification (the default, not written in `run.json`).
    pub fn is_categorical(&self) -> bool {
        matches!(self, Likelihood::Categorical)
    }

    /// The Gaussian's noise model, for regression.
    pub fn noise(&self) -> Option<Noise> {
        match self {
            Likelihood::Categorical => None,
            Likelihood::Gaussian { noise } => Some(*noise),
        }
    }
}

/// The observation noise σ of a Gaussian likelihood, in standardised target units.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Noise {
    /// σ fixed.
    Fixed {
        /// σ.
        std: f64,
    },
    /// τ = 1/σ² ~ Gamma(shape, rate), Gibbs-sampled once per epoch.
    Gamma {
        /// The Gamma's shape a.
        shape: f64,
        /// The Gamma's rate b.
        rate: f64,
    },
}

impl Noise {
    /// The default noise model: τ ~ Gamma(1, 1), a weak prior (mean σ = 1 standardised
    /// unit, the target's own spread) that N/2 data terms outweigh at once.
    pub const DEFAULT: Noise = Noise::Gamma {
        shape: 1.0,
        rate: 1.0,
    };

    /// The starting precision τ: 1/σ² when fixed, the prior's mean a/b when sampled; an
    /// error for a parameter that is not positive and finite.
    pub fn initial_precision(&self) -> Result<f64> {
        let ok = |v: f64| v > 0.0 && v.is_finite();
        match *self {
            Noise::Fixed { std } if ok(std) => Ok(1.0 / (std * std)),
            Noise::Gamma { shape, rate } if ok(shape) && ok(rate) => Ok(shape / rate),
            _ => Err(Error::Config(format!(
                "invalid noise model {self:?}: its parameters must be positive"
            ))),
        }
    }

    /// The mode of τ's conditional given `sse` over `n` examples, (a − 1 + n/2)/(b + SSE/2):
    /// the MAP estimate a point-estimate run (SGD) fits σ by; 1/σ² for a fixed σ.
    pub fn mode(&self, sse: f64, n: usize) -> Result<f64> {
        match *self {
            Noise::Fixed { .. } => self.initial_precision(),
            Noise::Gamma { shape, rate } if sse.is_finite() => {
                Ok((shape - 1.0 + n as f64 / 2.0) / (rate + sse / 2.0))
            }
            Noise::Gamma { .. } => Err(Error::NotFinite(format!(
                "the training residuals' sum of squares ({sse})"
            ))),
        }
    }

    /// −log p(τ) up to a constant: (1 − a) ln τ + bτ for τ ~ Gamma(a, b), 0 for a fixed σ.
    /// With the data's ½τ(f − y)² − ½ ln τ per example it is the τ part of the energy whose
    /// tempered density [`Noise::gibbs_draw`] samples (what a replica exchange compares).
    pub fn prior_energy(&self, tau: f64) -> f64 {
        match *self {
            Noise::Fixed { .. } => 0.0,
            Noise::Gamma { shape, rate } => (1.0 - shape) * tau.ln() + rate * tau,
        }
    }

    /// A draw of τ from its conditional given the training residuals' sum of squares `sse`
    /// over `n` examples, at temperature T: Gamma(shape = (a − 1 + n/2)/T + 1, rate =
    /// (b + SSE/2)/T), the usual Gamma(a + n/2, b + SSE/2) at T = 1 (the same tempering as
    /// the weight precisions'). `None` for a fixed σ.
    pub fn gibbs_draw(
        &self,
        sse: f64,
        n: usize,
        temperature: f64,
        seed: u64,
    ) -> Result<Option<f64>> {
        let Noise::Gamma { shape, rate } = *self else {
            return Ok(None);
        };
        if !sse.is_finite() {
            return Err(Error::NotFinite(format!(
                "the training residuals' sum of squares ({sse})"
            )));
        }
        let k = (shape - 1.0 + n as f64 / 2.0) / temperature + 1.0;
        let r = (rate + sse / 2.0) / temperature;
        let g = rand_distr::Gamma::new(k, 1.0 / r)
            .map_err(|e| Error::Config(format!("Gibbs step for the noise precision: {e}")))?;
        Ok(Some(g.sample(&mut rand::rngs::StdRng::seed_from_u64(seed))))
    }
}

/// A regression's Gaussian likelihood for a model of the user's own (the optimizer path):
/// y ~ N(f(x), 1/τ) with τ fixed or Gibbs-drawn under a Gamma prior, as `bnn train` samples
/// it. The noise model and the τ in force are plain data; [`GaussianNoise::nll`] is the
/// minibatch's mean negative log-likelihood an optimizer's `backward_step` takes, and
/// `SgMcmc::gibbs_step` draws τ once per epoch.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GaussianNoise {
    /// Fixed σ, or τ ~ Gamma(a, b).
    pub model: Noise,
    /// τ = 1/σ² in force.
    pub precision: f64,
}

impl GaussianNoise {
    /// τ at its start: 1/σ² when fixed, the Gamma prior's mean a/b when sampled.
    pub fn new(model: Noise) -> Result<Self> {
        Ok(GaussianNoise {
            model,
            precision: model.initial_precision()?,
        })
    }

    /// σ = 1/√τ in force.
    pub fn std(&self) -> f64 {
        1.0 / self.precision.sqrt()
    }

    /// The mean over the minibatch of −log N(y | f, 1/τ) = ½τ(f − y)² − ½ log τ + ½ log 2π,
    /// for predictions and targets of the same shape.
    pub fn nll(
        &self,
        prediction: &candle_core::Tensor,
        target: &candle_core::Tensor,
    ) -> candle_core::Result<candle_core::Tensor> {
        let half_sq = ((prediction - target)?.sqr()?.mean_all()? * (0.5 * self.precision))?;
        half_sq + (HALF_LOG_2PI - 0.5 * self.precision.ln())
    }

    /// Draws τ from its conditional given the training residuals' sum of squares `sse`
    /// over `n` examples at temperature T ([`Noise::gibbs_draw`]); a fixed σ stays.
    pub fn gibbs_draw(&mut self, sse: f64, n: usize, temperature: f64, seed: u64) -> Result<()> {
        if let Some(tau) = self.model.gibbs_draw(sse, n, temperature, seed)? {
            self.precision = tau;
        }
        Ok(())
    }
}

/// The targets of a minibatch, as the likelihood reads them.
#[derive(Debug, Clone, Copy)]
pub enum Targets<'a> {
    /// Class indices.
    Classes(&'a [u32]),
    /// Real values (standardised) with the noise precision τ in force.
    Values {
        /// y.
        y: &'a [f32],
        /// τ = 1/σ².
        precision: f64,
    },
}

impl Targets<'_> {
    /// Examples in the minibatch.
    pub fn len(&self) -> usize {
        match self {
            Targets::Classes(c) => c.len(),
            Targets::Values { y, .. } => y.len(),
        }
    }

    /// Whether the minibatch is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Gaussian NLL over one output per row: returns Σᵢ −log N(yᵢ; fᵢ, 1/τ) and the sum of
/// squared residuals Σ(fᵢ − yᵢ)², and writes Δᵢ = `scale`·τ·(fᵢ − yᵢ) into `delta`.
pub(crate) fn gaussian_error(
    out: &[f32],
    y: &[f32],
    precision: f64,
    scale: f32,
    delta: &mut [f32],
) -> Result<(f64, f64)> {
    if out.len() != y.len() || delta.len() != y.len() {
        return Err(Error::Config(format!(
            "a Gaussian likelihood needs one output per example: {} outputs for {} targets",
            out.len(),
            y.len()
        )));
    }
    let mut sse = 0f64;
    let g = scale * precision as f32;
    for ((d, &f), &t) in delta.iter_mut().zip(out).zip(y) {
        let r = f - t;
        sse += (r as f64) * (r as f64);
        *d = g * r;
    }
    let n = y.len() as f64;
    let nll = 0.5 * precision * sse + n * (HALF_LOG_2PI - 0.5 * precision.ln());
    Ok((nll, sse))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn noise_prior_energy_is_minus_the_gamma_log_density() {
        // Gamma(3, 2): ln p(τ) = 3 ln 2 − ln Γ(3) + 2 ln τ − 2τ, Γ(3) = 2.
        let gamma = Noise::Gamma {
            shape: 3.0,
            rate: 2.0,
        };
        let log_density = |t: f64| 3.0 * 2f64.ln() - 2f64.ln() + 2.0 * t.ln() - 2.0 * t;
        for (a, b) in [(0.5, 1.5), (2.0, 0.1)] {
            let energy = gamma.prior_energy(a) - gamma.prior_energy(b);
            let want = log_density(b) - log_density(a);
            assert!((energy - want).abs() < 1e-12, "{energy} vs {want}");
        }
        assert_eq!(Noise::Fixed { std: 0.3 }.prior_energy(11.1), 0.0);
    }

    #[test]
    fn gaussian_error_is_the_derivative_of_its_nll() {
        let (y, tau, s) = ([0.5f32, -1.0, 2.0], 4.0, 3.0f32);
        let f = [0.2f32, -0.5, 2.5];
        let mut d = [0f32; 3];
        let (nll, sse) = gaussian_error(&f, &y, tau, s, &mut d).unwrap();
        assert!((sse - (0.09 + 0.25 + 0.25)).abs() < 1e-6);
        let by_hand: f64 = f
            .iter()
            .zip(&y)
            .map(|(&f, &y)| {
                let r = (f - y) as f64;
                0.5 * tau * r * r - 0.5 * tau.ln() + HALF_LOG_2PI
            })
            .sum();
        assert!((nll - by_hand).abs() < 1e-9);
        // Central difference of the NLL in f₁, times the scale.
        let h = 1e-3f32;
        let at = |v: f32| {
            let mut g = f;
            g[1] = v;
            gaussian_error(&g, &y, tau, 1.0, &mut [0f32; 3]).unwrap().0
        };
        let slope = (at(f[1] + h) - at(f[1] - h)) / (2.0 * h as f64);
        assert!(
            (d[1] as f64 - s as f64 * slope).abs() < 1e-3,
            "{} {slope}",
            d[1]
        );
        assert!(gaussian_error(&f, &y[..2], tau, s, &mut d).is_err());
    }

    /// The Gibbs draw's mean is the conditional's (a + n/2)/(b + SSE/2): 2,000 draws of a
    /// Gamma of shape 52 have a relative standard error of 1/√52/√2000 ≈ 0.31%; 1% is
    /// 3.2 s.e. (seeded, so the test is deterministic; it fails for a shape or rate off by
    /// one of its terms, a 2% change or more).
    #[test]
    fn noise_gibbs_draws_follow_the_conjugate_conditional() {
        let noise = Noise::Gamma {
            shape: 2.0,
            rate: 1.0,
        };
        let (n, sse) = (100, 40.0);
        let mean: f64 = (0..2000)
            .map(|k| noise.gibbs_draw(sse, n, 1.0, k).unwrap().unwrap())
            .sum::<f64>()
            / 2000.0;
        let want = (2.0 + 50.0) / (1.0 + 20.0);
        assert!((mean / want - 1.0).abs() < 0.01, "{mean} vs {want}");
        assert_eq!(
            Noise::Fixed { std: 0.5 }
                .gibbs_draw(1.0, 1, 1.0, 0)
                .unwrap(),
            None
        );
        assert_eq!(Noise::Fixed { std: 0.5 }.initial_precision().unwrap(), 4.0);
        assert!(Noise::Fixed { std: 0.0 }.initial_precision().is_err());
        assert!(noise.gibbs_draw(f64::NAN, n, 1.0, 0).is_err());
    }
}
