//! Minibatches on the exact posterior: the linear-Gaussian posterior of diabetes
//! (`posterior.rs`) sampled at batch 100 of 353 rows, so that every gradient is a noisy
//! estimate, by each sampler at its default step. Per coordinate the sample variance
//! against Σᵢᵢ and the sample mean against μᵢ; and the configurational temperature the
//! run reports (`diagnostics.jsonl`), which must stay in its band and quiet here, and must
//! leave it and warn at 16× the step.
//!
//! Length: SGLD, the slowest, relaxes the posterior's softest direction (precision
//! λ_min = 6.5) in 1/(η·λ_min) ≈ 11,000 updates at the default η = 1.41·10⁻⁵; 600,000
//! epochs of 3 updates give it about 80 relaxation times per kept sample spacing… see
//! `RUN` for the figures each tolerance rests on.

use std::path::Path;

use crate::common::{bnn, stderr};
use crate::posterior::{diabetes, exact_posterior, moments, samples};

/// What one run gives against the exact posterior.
#[derive(Debug)]
pub(crate) struct Figures {
    /// Sample variance / Σᵢᵢ, smallest and largest over the coordinates.
    pub ratio: (f64, f64),
    /// The largest |sample mean − μᵢ| / √Σᵢᵢ.
    pub mean_error: f64,
    /// θ·∇U/D over the samples, with the exact full-data gradient.
    pub exact_temperature: f64,
    /// The run's own estimate since burn-in (diagnostics.jsonl's last line).
    pub run_temperature: f64,
}

/// The figures of the run in `run` (its samples and diagnostics).
pub(crate) fn figures(run: &Path) -> Figures {
    let (mu, cov) = exact_posterior(run);
    let draws = samples(run);
    let (mean, sample_cov) = moments(&draws);
    let d = mu.len();
    let ratios: Vec<f64> = (0..d).map(|i| sample_cov[i][i] / cov[i][i]).collect();
    let mean_error = (0..d)
        .map(|i| (mean[i] - mu[i]).abs() / cov[i][i].sqrt())
        .fold(0.0, f64::max);
    // ∇U = P(θ − μ) with P = Σ⁻¹: θ·∇U = θᵀP(θ − μ).
    let precision = invert(&cov);
    let exact_temperature = draws
        .iter()
        .map(|t| {
            (0..d)
                .map(|i| {
                    t[i] * (0..d)
                        .map(|j| precision[i][j] * (t[j] - mu[j]))
                        .sum::<f64>()
                })
                .sum::<f64>()
                / d as f64
        })
        .sum::<f64>()
        / draws.len() as f64;
    Figures {
        ratio: (
            ratios.iter().copied().fold(f64::INFINITY, f64::min),
            ratios.iter().copied().fold(0.0, f64::max),
        ),
        mean_error,
        exact_temperature,
        run_temperature: run_temperature(run),
    }
}

/// The configurational temperature since burn-in in the run's last diagnostics line.
fn run_temperature(run: &Path) -> f64 {
    let text = std::fs::read_to_string(run.join("diagnostics.jsonl")).unwrap();
    let last: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    last["configurational"]["since_burnin"]
        .as_f64()
        .unwrap_or_else(|| panic!("no configurational temperature in {last}"))
}

/// Σ⁻¹ by Gauss–Jordan on [Σ | I].
fn invert(a: &[Vec<f64>]) -> Vec<Vec<f64>> {
    let n = a.len();
    let mut m: Vec<Vec<f64>> = (0..n)
        .map(|i| {
            let mut row = a[i].clone();
            row.extend((0..n).map(|j| f64::from(u8::from(i == j))));
            row
        })
        .collect();
    for c in 0..n {
        let p = (c..n)
            .max_by(|&x, &y| m[x][c].abs().total_cmp(&m[y][c].abs()))
            .unwrap();
        m.swap(c, p);
        let pivot = m[c][c];
        m[c].iter_mut().for_each(|x| *x /= pivot);
        let row = m[c].clone();
        for (r, other) in m.iter_mut().enumerate() {
            if r != c {
                let f = other[c];
                other.iter_mut().zip(&row).for_each(|(x, y)| *x -= f * y);
            }
        }
    }
    m.into_iter().map(|r| r[n..].to_vec()).collect()
}

/// Runs `bnn train` on the diabetes posterior at batch 100 with `flags` in `dir`: its
/// folder and stderr.
pub(crate) fn run(dir: &Path, name: &str, flags: &[&str]) -> Option<(std::path::PathBuf, String)> {
    let csv = diabetes()?;
    let csv = csv.to_str().unwrap();
    let base = [
        "train",
        "--csv",
        csv,
        "--target",
        "progression",
        "--hidden",
        "",
        "--noise-std",
        "54",
        "--prior",
        "gaussian",
        "--prior-std",
        "1",
        "--batch-size",
        "100",
        "--out",
        "runs",
        "--run-name",
        name,
    ];
    let out = bnn(dir, &[&base[..], flags].concat());
    let err = stderr(&out);
    assert!(out.status.success(), "{name}: {err}");
    Some((dir.join("runs").join(name), err))
}

#[test]
#[ignore]
fn explore() {
    let epochs = std::env::var("E").unwrap_or("300000".into());
    let burn = std::env::var("B").unwrap_or("30000".into());
    let thin = std::env::var("THIN").unwrap_or("135".into());
    let extra = std::env::var("X").unwrap_or_default();
    for s in std::env::var("S").unwrap_or("sgld".into()).split(',') {
        for seed in std::env::var("SEEDS").unwrap_or("1".into()).split(',') {
            let d = tempfile::tempdir().unwrap();
            let mut flags = vec![
                "--sampler",
                s,
                "--epochs",
                &epochs,
                "--burnin",
                &burn,
                "--thin",
                &thin,
                "--seed",
                seed,
            ];
            flags.extend(extra.split_whitespace());
            let t = std::time::Instant::now();
            let (r, err) = run(d.path(), s, &flags).unwrap();
            let f = figures(&r);
            let warned = err.contains("configurational");
            eprintln!(
                "{s} seed {seed} {extra}: {f:?} warned {warned} {:.1}s",
                t.elapsed().as_secs_f64()
            );
        }
    }
}
