//! Minibatches on the exact posterior: the linear-Gaussian posterior of diabetes
//! (`posterior.rs`) sampled at batch 100 of its 354 training rows, so that every gradient
//! is a noisy estimate, by each sampler at its default step. Per coordinate the sample
//! variance against Σᵢᵢ and the sample mean against μᵢ; and the configurational
//! temperature the run reports (`diagnostics.jsonl`), which must stay in its band and
//! quiet here, and must leave it and warn at 16× the step. Each test's comment gives the
//! figures measured at seeds 1–3 that its tolerances rest on.

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

/// Checks one sampler at its default step: `updates` updates (3 a 100-row epoch of
/// 354), a tenth burn-in, 2,000 samples; every coordinate's variance ratio in
/// [0.85, 1.15] and mean within 0.1 sd, the run's configurational temperature in
/// [0.9, 1.1] and no warning about it.
fn check_default_step(name: &str, flags: &[&str], epochs: usize) {
    let d = tempfile::tempdir().unwrap();
    let (e, b, t) = (
        epochs.to_string(),
        (epochs / 10).to_string(),
        // (--thin counts updates, 3 an epoch.)
        (3 * epochs * 9 / 10 / 2000).to_string(),
    );
    let schedule = ["--epochs", &e, "--burnin", &b, "--thin", &t, "--seed", "1"];
    let Some((run, err)) = run(d.path(), name, &[flags, &schedule[..]].concat()) else {
        return;
    };
    let f = figures(&run);
    eprintln!("{name}: {f:?}");
    assert_eq!(samples(&run).len(), 2000);
    assert!(
        f.ratio.0 >= 0.85 && f.ratio.1 <= 1.15,
        "{name}: variance ratios {:?} outside [0.85, 1.15]",
        f.ratio
    );
    assert!(
        f.mean_error <= 0.1,
        "{name}: mean error {} sd",
        f.mean_error
    );
    assert!(
        (0.9..=1.1).contains(&f.run_temperature),
        "{name}: configurational temperature {}",
        f.run_temperature
    );
    assert!(
        !err.contains("configurational temperature"),
        "{name} warned at its default step: {err}"
    );
    // The run's estimate (minibatch gradients at every epoch's start) and the samples'
    // (the exact gradient at the kept positions) estimate one expectation: measured
    // within 0.04 of each other on every row below.
    assert!(
        (f.run_temperature - f.exact_temperature).abs() <= 0.1,
        "{name}: run {} against samples {}",
        f.run_temperature,
        f.exact_temperature
    );
}

// The momentum samplers relax in tens of updates (friction or thermostat α ≈ 0.1 per
// update): 300,000 epochs keep 2,000 nearly independent samples. Measured at seeds 1–3
// (this schedule, variance ratio min–max, mean error, run temperature): SGHMC 0.97–1.11,
// ≤ 0.024 sd, 1.01–1.05; SGNHT-S 0.93–1.06, ≤ 0.024 sd, 0.97–1.01; mSGNHT-S 0.92–1.06,
// ≤ 0.024 sd, 0.97–1.01. The estimates' own spread (2,000 draws: a variance to ±0.03 sd)
// is small beside the 0.15 allowed, which leaves room for the step's bias. The thermostats
// are checked with their default integrator, the splitting: with Euler they run at
// 0.87–1.01 and 0.91–0.95 (seeds 1–3), in band but warned about on two seeds of three
// (docs/BENCHMARKS.md, "Minibatch noise on the exact posterior").

#[test]
fn sghmc_samples_the_exact_posterior_with_minibatches() {
    check_default_step("sghmc", &["--sampler", "sghmc"], 300_000);
}

#[test]
fn sghmc_splitting_samples_the_exact_posterior_with_minibatches() {
    let flags = ["--sampler", "sghmc", "--integrator", "splitting"];
    check_default_step("sghmc-s", &flags, 300_000);
}

#[test]
fn sgnht_samples_the_exact_posterior_with_minibatches() {
    check_default_step("sgnht-s", &["--sampler", "sgnht"], 300_000);
}

#[test]
fn msgnht_samples_the_exact_posterior_with_minibatches() {
    check_default_step("msgnht-s", &["--sampler", "msgnht"], 300_000);
}

/// SGLD has no momentum: it relaxes the softest direction (λ_min = 6.5) in
/// 1/(η·λ_min) ≈ 4,400 updates at its default η = 3.5·10⁻⁵, so it needs 2,000,000
/// epochs (6,000,000 updates, about 1,400 relaxation times) for its variance ratios to be
/// known to a few percent. Measured at seeds 1–3: 0.98–1.04, ≤ 0.047 sd, run
/// temperature 1.01–1.02.
#[test]
fn sgld_samples_the_exact_posterior_with_minibatches() {
    check_default_step("sgld", &["--sampler", "sgld"], 2_000_000);
}

/// At 16× its default step a sampler's configurational temperature leaves [0.9, 1.1]
/// and the run warns: SGNHT too cold while its kinetic energy holds its target (the case
/// the kinetic energy cannot see; measured 0.76 at seed 0), SGLD too hot (it has no
/// kinetic energy to check; measured 1.20).
#[test]
fn sixteen_times_the_step_leaves_the_configurational_band_and_warns() {
    let eta = |kind: bnn::sampler::SamplerKind| {
        // The table default as `bnn train` scales it: η_MNIST · (60,000 / 24) / N.
        16.0 * kind.defaults().step_size * 60_000.0 / 24.0 / 354.0
    };
    for (kind, cold) in [
        (bnn::sampler::SamplerKind::Sgnht, true),
        (bnn::sampler::SamplerKind::Sgld, false),
    ] {
        let d = tempfile::tempdir().unwrap();
        let step = format!("{:e}", eta(kind));
        let flags = [
            "--sampler",
            kind.name(),
            "--step-size",
            &step,
            "--epochs",
            "100000",
            "--burnin",
            "10000",
            "--thin",
            "450",
            "--seed",
            "1",
        ];
        let Some((run, err)) = run(d.path(), kind.name(), &flags) else {
            return;
        };
        let f = figures(&run);
        let t = f.run_temperature;
        eprintln!("{} at 16×: {f:?}", kind.name());
        assert!(!(0.9..=1.1).contains(&t), "{}: {t}", kind.name());
        assert_eq!(t < 1.0, cold, "{}: {t}", kind.name());
        // The samples say the same: the temperature over them, and the coordinates'
        // variances on the same side of 1 (the widest too wide, or the narrowest too
        // narrow).
        assert_eq!(f.exact_temperature < 1.0, cold, "{f:?}");
        match cold {
            true => assert!(f.ratio.0 < 0.9, "{f:?}"),
            false => assert!(f.ratio.1 > 1.1, "{f:?}"),
        }
        let warnings = err.matches("configurational temperature").count();
        assert_eq!(warnings, 1, "{}: {err}", kind.name());
    }
}
