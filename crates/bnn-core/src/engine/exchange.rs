//! Replica exchange with a test that tolerates minibatch noise (Luo et al. 2018,
//! "Replica-exchange Nosé–Hoover dynamics for Bayesian learning on large datasets", §2.2,
//! Theorem 2, Algorithm 1, eqs. (7)–(18)), and the temperature ladder it runs on.
//!
//! A pair of replicas at temperatures T_j < T_k swaps with Barker's probability
//! 1/(1 + e^{−ΔE}), ΔE = (U(θ_j) − U(θ_k))(1/T_j − 1/T_k), i.e. when z_L + ΔE > 0 with z_L
//! standard logistic (eq. 11). Eq. (7) writes the estimate with log-likelihoods, which is
//! −ΔE: a sign slip; here the estimate ΔẼ is taken of the energy U. With a minibatch,
//! ΔẼ = ΔE + N(0, σ²) (eq. 8); once σ² ≤ σ*², Gaussian noise of variance σ*² − σ² brings
//! the error to exactly N(0, σ*²), and z_L is split as z_C + N(0, σ*²), z_C drawn from the
//! compensation density q̂_C of eqs. (9)/(16) (criterion (17)).
//!
//! Nothing large moves in an exchange: replicas swap temperatures (indices into the
//! ladder), never parameters, so the same protocol later works across processes.

use rand::Rng;
use rand_distr::StandardNormal;

use crate::error::{Error, Result};

/// The compensation density q̂_C(z) = Σ_{n<N} (−1)ⁿ/(λⁿ n!) Hₙ(λσ*²/4) g^{(2n+1)}(z) of eq.
/// (16), g the logistic function and Hₙ the physicists' Hermite polynomials (generating
/// function e^{2xt−t²}, as eq. 15 needs). Its CDF is the same series over g^{(2n)} (the
/// n = 0 term: g itself), so draws are exact by inverting it.
///
/// Eq. (18) checked against eq. (16): with σ*² = 0.2, λ = 10 (x = λσ*²/4 = 0.5: H₀ = 1,
/// H₁ = 2x = 1, H₂ = 4x² − 2 = −1), three terms give g′ − 0.1 g‴ − 0.005 g⁽⁵⁾, and in powers
/// of g (g′ = g − g², g‴ = g − 7g² + 12g³ − 6g⁴, g⁽⁵⁾ = g − 31g² + 180g³ − 390g⁴ + 360g⁵ −
/// 120g⁶): 0.895g − 0.145g² − 2.1g³ + 2.55g⁴ − 1.8g⁵ + 0.6g⁶, the paper's coefficients
/// exactly (tested). It integrates to 1 (every term past the first integrates to 0), is
/// even, and is non-negative for these settings (checked on construction). It is not an
/// exact deconvolution: q̂_C ∗ N(0, σ*²) misses the logistic density by up to 1.8e-3 at 0
/// (of 0.25), and the acceptance probability it gives misses Barker's by up to 1.0e-3
/// (measured in the tests).
#[derive(Debug, Clone)]
pub struct Compensation {
    /// σ*²: the total variance of the noisy estimate the density compensates.
    pub sigma2: f64,
    /// cₙ = (−1)ⁿ/(λⁿ n!) Hₙ(λσ*²/4).
    coeffs: Vec<f64>,
    /// g^{(k)} as a polynomial in g (coefficient of gⁱ at i), k = 0..2N.
    derivatives: Vec<Vec<f64>>,
}

/// The paper's settings (§3): σ*² = 0.2, λ = 10, three terms.
pub(crate) const SIGMA2: f64 = 0.2;
/// The paper's kernel bandwidth of q̂_C.
pub(crate) const BANDWIDTH: f64 = 10.0;
/// Terms of the series of q̂_C.
pub(crate) const TERMS: usize = 3;

impl Compensation {
    /// q̂_C for total variance `sigma2`, bandwidth `lambda`, `terms` terms of the series;
    /// an error if the truncated series goes negative (it is then no density).
    pub fn new(sigma2: f64, lambda: f64, terms: usize) -> Result<Self> {
        if !(sigma2 > 0.0 && lambda > 0.0 && terms >= 1) {
            return Err(Error::Config(format!(
                "compensation density: need σ*² > 0, λ > 0 and a term, got {sigma2}, {lambda}, {terms}"
            )));
        }
        let x = lambda * sigma2 / 4.0;
        let mut hermite = vec![1.0, 2.0 * x];
        for n in 1..terms {
            hermite.push(2.0 * x * hermite[n] - 2.0 * n as f64 * hermite[n - 1]);
        }
        let mut factorial = 1.0;
        let coeffs = (0..terms)
            .map(|n| {
                if n > 0 {
                    factorial *= n as f64;
                }
                let sign = if n % 2 == 0 { 1.0 } else { -1.0 };
                sign / (lambda.powi(n as i32) * factorial) * hermite[n]
            })
            .collect();
        // d/dz P(g) = P′(g)·g′ = P′(g)·(g − g²).
        let mut derivatives = vec![vec![0.0, 1.0]];
        for k in 0..2 * terms {
            let p = &derivatives[k];
            let mut next = vec![0.0; p.len() + 1];
            for (i, &a) in p.iter().enumerate().skip(1) {
                next[i] += i as f64 * a;
                next[i + 1] -= i as f64 * a;
            }
            derivatives.push(next);
        }
        let c = Compensation {
            sigma2,
            coeffs,
            derivatives,
        };
        // The density in g is a polynomial on g ∈ (0, 1): check it there, finely.
        let lowest = (1..100_000)
            .map(|i| c.pdf_at_g(i as f64 / 100_000.0))
            .fold(f64::INFINITY, f64::min);
        if lowest < 0.0 {
            return Err(Error::Config(format!(
                "compensation density with σ*² = {sigma2}, λ = {lambda}, {terms} terms goes \
                 negative ({lowest:.3e}); use a smaller σ*² or another bandwidth"
            )));
        }
        Ok(c)
    }

    /// The paper's q̂_C (eq. 18).
    pub fn paper() -> Self {
        Self::new(SIGMA2, BANDWIDTH, TERMS).expect("the paper's q̂_C is a density (tested)")
    }

    /// q̂_C as a polynomial in g (coefficient of gⁱ at i): eq. (18)'s form.
    pub fn in_powers_of_g(&self) -> Vec<f64> {
        let mut out = vec![0.0; 2 * self.coeffs.len() + 2];
        for (n, c) in self.coeffs.iter().enumerate() {
            for (i, a) in self.derivatives[2 * n + 1].iter().enumerate() {
                out[i] += c * a;
            }
        }
        out
    }

    fn pdf_at_g(&self, g: f64) -> f64 {
        self.coeffs
            .iter()
            .enumerate()
            .map(|(n, c)| c * horner(&self.derivatives[2 * n + 1], g))
            .sum()
    }

    /// The density of q̂_C at `z`.
    pub fn pdf(&self, z: f64) -> f64 {
        self.pdf_at_g(logistic(z))
    }

    /// The distribution function of q̂_C at `z`.
    pub(crate) fn cdf(&self, z: f64) -> f64 {
        let g = logistic(z);
        self.coeffs
            .iter()
            .enumerate()
            .map(|(n, c)| c * horner(&self.derivatives[2 * n], g))
            .sum()
    }

    /// The z with CDF(z) = u, by bisection (exact to ~1e-12 in z): a draw for u ~ U(0, 1).
    pub fn quantile(&self, u: f64) -> f64 {
        let (mut lo, mut hi) = (-60.0, 60.0);
        for _ in 0..60 {
            let mid = 0.5 * (lo + hi);
            if self.cdf(mid) < u {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        0.5 * (lo + hi)
    }

    /// A draw from q̂_C.
    pub fn sample<R: Rng>(&self, rng: &mut R) -> f64 {
        self.quantile(rng.random::<f64>())
    }

    /// Criterion (17) (Algorithm 1, lines 5–7): swap when z_C + z_N + ΔẼ > 0, for an estimate
    /// `delta` of ΔE whose variance `variance` is at most σ*².
    pub fn accept<R: Rng>(&self, delta: f64, variance: f64, rng: &mut R) -> Result<bool> {
        if !(variance >= 0.0 && variance <= self.sigma2 && delta.is_finite()) {
            return Err(Error::Config(format!(
                "exchange: the estimate {delta} has variance {variance}, above σ*² = {}",
                self.sigma2
            )));
        }
        let z_n = (self.sigma2 - variance).sqrt() * rng.sample::<f64, _>(StandardNormal);
        Ok(self.sample(rng) + z_n + delta > 0.0)
    }
}

fn horner(p: &[f64], x: f64) -> f64 {
    p.iter().rev().fold(0.0, |acc, &a| acc * x + a)
}

/// g(z) = 1/(1 + e^{−z}), accurate in both tails.
pub fn logistic(z: f64) -> f64 {
    if z >= 0.0 {
        1.0 / (1.0 + (-z).exp())
    } else {
        let e = z.exp();
        e / (1.0 + e)
    }
}

/// ΔE of a pair (eq. 7 with the energy U, see the module note): positive favours the
/// swap of the configurations at temperatures `t_j` and `t_k`.
pub fn energy_difference(u_j: f64, u_k: f64, t_j: f64, t_k: f64) -> f64 {
    (u_j - u_k) * (1.0 / t_j - 1.0 / t_k)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn paper_coefficients_follow_from_the_series() {
        let p = Compensation::paper().in_powers_of_g();
        let eq18 = [0.0, 0.895, -0.145, -2.1, 2.55, -1.8, 0.6];
        for (i, (a, b)) in p.iter().zip(eq18).enumerate() {
            assert!((a - b).abs() < 1e-12, "g^{i}: {a} vs {b}");
        }
        assert!(p[7..].iter().all(|a| a.abs() < 1e-12));
    }

    #[test]
    fn density_integrates_to_one_is_even_and_matches_its_cdf() {
        let q = Compensation::paper();
        let h = 1e-3;
        let total: f64 = (-40_000..40_000)
            .map(|i| q.pdf((i as f64 + 0.5) * h) * h)
            .sum();
        assert!((total - 1.0).abs() < 1e-9, "{total}");
        for z in [0.1, 0.7, 2.0, 5.0, 12.0] {
            assert!((q.pdf(z) - q.pdf(-z)).abs() < 1e-15, "{z}");
            let numeric = (q.cdf(z + 1e-5) - q.cdf(z - 1e-5)) / 2e-5;
            assert!((numeric - q.pdf(z)).abs() < 1e-7, "{z}");
        }
        assert!((q.cdf(0.0) - 0.5).abs() < 1e-15);
        assert!((q.quantile(q.cdf(1.3)) - 1.3).abs() < 1e-9);
    }

    /// q̂_C ∗ N(0, σ*²) against the logistic density on [−10, 10]: the truncated series is
    /// not exact. Measured: 1.83e-3 at z = 0 (the logistic density is 0.25 there); and the
    /// acceptance probability it gives, Pr[z_C + z_N > −ΔE], against Barker's g(ΔE): 1.03e-3
    /// at worst (bounds 2e-3 and 1.2e-3).
    #[test]
    fn convolution_with_the_gaussian_is_close_to_logistic() {
        let q = Compensation::paper();
        let s2 = q.sigma2;
        let h = 2e-3;
        let (mut worst_pdf, mut worst_cdf) = (0f64, 0f64);
        for i in -100..=100 {
            let x = i as f64 * 0.1;
            let (mut pdf, mut cdf) = (0.0, 0.0);
            for k in -15_000..15_000 {
                let z = (k as f64 + 0.5) * h;
                let w = (-(x - z).powi(2) / (2.0 * s2)).exp()
                    / (2.0 * std::f64::consts::PI * s2).sqrt();
                pdf += q.pdf(z) * w * h;
                cdf += q.cdf(z) * w * h;
            }
            let g = logistic(x);
            worst_pdf = worst_pdf.max((pdf - g * (1.0 - g)).abs());
            worst_cdf = worst_cdf.max((cdf - g).abs());
        }
        eprintln!("density error {worst_pdf:.3e}, acceptance error {worst_cdf:.3e}");
        assert!(worst_pdf < 2e-3, "density error {worst_pdf}");
        assert!(worst_cdf < 1.2e-3, "acceptance error {worst_cdf}");
    }

    /// Kolmogorov–Smirnov: 20 000 draws (seed 7) against the CDF. The 1% critical value
    /// of D is 1.63/√n = 0.0115.
    #[test]
    fn draws_follow_the_density() {
        let q = Compensation::paper();
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut x: Vec<f64> = (0..20_000).map(|_| q.sample(&mut rng)).collect();
        x.sort_by(f64::total_cmp);
        let n = x.len() as f64;
        let d = x
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let f = q.cdf(v);
                (f - i as f64 / n).abs().max(((i + 1) as f64 / n - f).abs())
            })
            .fold(0f64, f64::max);
        assert!(d < 1.63 / n.sqrt(), "KS D = {d}");
    }

    /// The noisy test accepts with Barker's probability: ΔẼ = ΔE + N(0, v), v < σ*²,
    /// 40 000 tries (seed 3) for each ΔE; 3 standard errors plus the series' 1.2e-3.
    #[test]
    fn noisy_test_accepts_with_barkers_probability() {
        let q = Compensation::paper();
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for (delta, v) in [(-2.0f64, 0.05f64), (0.0, 0.1), (0.7, 0.19), (3.0, 0.0)] {
            let tries = 40_000;
            let mut yes = 0;
            for _ in 0..tries {
                let est = delta + v.sqrt() * rng.sample::<f64, _>(StandardNormal);
                yes += q.accept(est, v, &mut rng).unwrap() as usize;
            }
            let p = logistic(delta);
            let rate = yes as f64 / tries as f64;
            let se = (p * (1.0 - p) / tries as f64).sqrt();
            assert!(
                (rate - p).abs() < 3.0 * se + 1.2e-3,
                "ΔE {delta}: {rate} vs {p}"
            );
        }
        assert!(q.accept(0.0, 0.3, &mut rng).is_err());
    }
}
