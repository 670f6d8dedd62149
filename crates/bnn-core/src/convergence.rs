//! Convergence diagnostics across chains: split-R̂ and the effective sample size of a
//! scalar traced in every chain (Gelman et al., *Bayesian Data Analysis*, 3rd ed.: §11.4
//! for B, W, var⁺ and R̂ of split chains, §11.5 for the variogram V_t, the
//! autocorrelations ρ_t summed by Geyer's initial positive sequence, and n_eff).

use serde::{Deserialize, Serialize};

/// R̂ and ESS of one traced quantity.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Convergence {
    /// Split-R̂: near 1 when the chains agree; above ~1.01–1.1 they have not mixed.
    pub rhat: f64,
    /// Effective number of independent draws in all chains together.
    pub ess: f64,
    /// Draws per chain used (the shortest chain's, even) and chains.
    pub draws_per_chain: usize,
    /// Chains the statistic is over.
    pub chains: usize,
    /// Each chain's mean over its draws used: where R̂ is high, which chains stand apart
    /// (e.g. a chain held in a mode of lower likelihood). Absent in older summaries.
    #[serde(default)]
    pub chain_means: Vec<f64>,
}

/// Split-R̂ and ESS of `chains` (one trace each, in draw order). `None` with fewer than
/// two chains of four draws (BDA3 splits each chain in halves; a half needs two draws for
/// a variance).
pub fn diagnose(chains: &[Vec<f64>]) -> Option<Convergence> {
    let n = chains.iter().map(Vec::len).min()? / 2 * 2;
    if chains.len() < 2 || n < 4 {
        return None;
    }
    // Each chain's first n draws in two halves: 2K sequences of m draws.
    let m = n / 2;
    let seqs: Vec<&[f64]> = chains.iter().flat_map(|c| [&c[..m], &c[m..n]]).collect();
    let big_m = seqs.len() as f64;
    let mf = m as f64;
    let means: Vec<f64> = seqs.iter().map(|s| s.iter().sum::<f64>() / mf).collect();
    let grand = means.iter().sum::<f64>() / big_m;
    // B = n/(m−1) Σ (ψ̄.j − ψ̄..)² (n draws per sequence, m sequences), W = the mean of the
    // within-sequence variances.
    let between = mf / (big_m - 1.0) * means.iter().map(|x| (x - grand).powi(2)).sum::<f64>();
    let within = seqs
        .iter()
        .zip(&means)
        .map(|(s, mu)| s.iter().map(|x| (x - mu).powi(2)).sum::<f64>() / (mf - 1.0))
        .sum::<f64>()
        / big_m;
    // var⁺ = (n−1)/n W + B/n; R̂ = √(var⁺/W).
    let var_plus = (mf - 1.0) / mf * within + between / mf;
    if within <= 0.0 || !var_plus.is_finite() {
        return None;
    }
    let rhat = (var_plus / within).sqrt();
    // ρ_t = 1 − V_t/(2 var⁺), V_t the mean squared difference at lag t over
    // all sequences; summed while the sums of consecutive pairs stay positive (Geyer).
    let variogram = |t: usize| -> f64 {
        seqs.iter()
            .map(|s| (t..m).map(|i| (s[i] - s[i - t]).powi(2)).sum::<f64>())
            .sum::<f64>()
            / (big_m * (mf - t as f64))
    };
    let rho = |t: usize| 1.0 - variogram(t) / (2.0 * var_plus);
    let mut sum = 0.0;
    let mut t = 1;
    while t + 1 < m {
        let pair = rho(t) + rho(t + 1);
        if pair < 0.0 {
            break;
        }
        sum += pair;
        t += 2;
    }
    let ess = (big_m * mf / (1.0 + 2.0 * sum)).min(big_m * mf * (big_m * mf).log10());
    Some(Convergence {
        rhat,
        ess,
        draws_per_chain: n,
        chains: chains.len(),
        chain_means: chains
            .iter()
            .map(|c| c[..n].iter().sum::<f64>() / n as f64)
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_distr::StandardNormal;

    fn ar1(rng: &mut rand::rngs::StdRng, phi: f64, n: usize, offset: f64) -> Vec<f64> {
        let mut x: f64 = rng.sample::<f64, _>(StandardNormal) / (1.0 - phi * phi).sqrt();
        (0..n)
            .map(|_| {
                x = phi * x + rng.sample::<f64, _>(StandardNormal);
                x + offset
            })
            .collect()
    }

    /// Independent draws: R̂ ≈ 1 and ESS ≈ the number of draws. Four chains of 2000
    /// (seed 1): R̂'s sampling spread is ~1/√(8000), so 1.01 is a loose bound; ESS within
    /// 15% (the ρ sum of white noise is a few hundredths).
    #[test]
    fn independent_chains() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let chains: Vec<Vec<f64>> = (0..4).map(|_| ar1(&mut rng, 0.0, 2000, 0.0)).collect();
        let c = diagnose(&chains).unwrap();
        assert!((c.rhat - 1.0).abs() < 0.01, "{c:?}");
        assert!((c.ess / 8000.0 - 1.0).abs() < 0.15, "{c:?}");
    }

    /// AR(1) with φ = 0.8: ESS = N(1 − φ)/(1 + φ) = 8000/9 ≈ 889; within 25% (seed 2).
    #[test]
    fn correlated_chains() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(2);
        let chains: Vec<Vec<f64>> = (0..4).map(|_| ar1(&mut rng, 0.8, 2000, 0.0)).collect();
        let c = diagnose(&chains).unwrap();
        assert!((c.ess / (8000.0 / 9.0) - 1.0).abs() < 0.25, "{c:?}");
        assert!(c.rhat < 1.02, "{c:?}");
    }

    /// Chains stuck in different places: R̂ far above 1 (means 0 and 3 with unit spread:
    /// var⁺/W ≈ 1 + 9/4·… ≫ 1.1).
    #[test]
    fn chains_that_disagree() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let chains = vec![ar1(&mut rng, 0.5, 500, 0.0), ar1(&mut rng, 0.5, 500, 3.0)];
        let c = diagnose(&chains).unwrap();
        assert!(c.rhat > 1.5, "{c:?}");
        // AR(1) means over 500 draws of φ = 0.5: sd √3/√500 ≈ 0.08, so 0.4 is 5 sd.
        assert!(c.chain_means[0].abs() < 0.4 && (c.chain_means[1] - 3.0).abs() < 0.4);
        assert!(diagnose(&chains[..1]).is_none());
        assert!(diagnose(&[vec![1.0, 2.0], vec![1.0, 2.0]]).is_none());
    }
}
