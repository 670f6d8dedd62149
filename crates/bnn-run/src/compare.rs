//! How close one run's predictive distribution is to a reference run's on the same test
//! set (Izmailov et al. 2021, "What are Bayesian neural network posteriors really
//! like?", §4): for classification the top-1 agreement of the two ensembles' predictions
//! and the total variation ½·Σ_c |p(c|x) − p_ref(c|x)| averaged over the test points; for
//! a regression the 2-Wasserstein distance between the two predictive mixtures, averaged
//! over the points. Each run's own metrics beside.

use std::path::Path;

use candle_core::Device;
use serde::{Deserialize, Serialize};

use crate::checkpoint::{self, RunManifest};
use crate::data::Dataset;
use crate::ensemble::{self, Accumulator};
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::model::Network;
use crate::regression::{RegressionAccumulator, RegressionMetrics};

/// The standard normal's quantiles at (k + ½)/16, k = 0 … 15: each mixture component
/// stands for 16 equally weighted points at its own quantiles (a stratified, deterministic
/// stand-in for draws), so that a run compared with itself gives exactly 0.
const NORMAL_QUANTILES: [f64; 16] = [
    -1.8627318674,
    -1.3180108973,
    -1.0099901692,
    -0.7764217611,
    -0.5791321623,
    -0.4022500653,
    -0.2372021093,
    -0.0784124127,
    0.0784124127,
    0.2372021093,
    0.4022500653,
    0.5791321623,
    0.7764217611,
    1.0099901692,
    1.3180108973,
    1.8627318674,
];

/// Levels at which the two quantile functions are compared: W₂² = ∫₀¹ (F⁻¹ − G⁻¹)² du by
/// the midpoint rule.
const W2_LEVELS: usize = 512;

/// One run against a reference, as `bnn compare` prints it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Comparison {
    /// The run compared.
    pub run: String,
    /// The reference run.
    pub reference: String,
    /// The data both were scored on.
    pub dataset: String,
    /// Test points.
    pub test_points: usize,
    /// Samples in the run's ensemble and in the reference's.
    pub samples: (usize, usize),
    /// Fraction of test points where the two ensembles' arg-max classes agree.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agreement: Option<f64>,
    /// Mean total variation between the two ensembles' class distributions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_variation: Option<f64>,
    /// Mean 2-Wasserstein distance between the predictive mixtures (target units).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wasserstein2: Option<f64>,
    /// Each run's own ensemble metrics (classification).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics: Option<(Metrics, Metrics)>,
    /// Each run's own ensemble metrics (regression).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub regression: Option<(RegressionMetrics, RegressionMetrics)>,
}

/// Refuses two runs whose data differ: another data set, task, table, split, training
/// subset (`--valid`, `--train-limit`: another posterior) or standardisation.
pub fn check_same_data(run: &RunManifest, reference: &RunManifest) -> Result<()> {
    let same = run.dataset == reference.dataset
        && run.task == reference.task
        && (run.train_examples, run.valid) == (reference.train_examples, reference.valid)
        && run.input_dim == reference.input_dim
        && match (&run.table, &reference.table) {
            (Some(a), Some(b)) => a.same_rows(b),
            (a, b) => a.is_none() && b.is_none(),
        }
        && run.standardization == reference.standardization;
    match same {
        true => Ok(()),
        false => Err(Error::Config(format!(
            "the runs were not trained and scored on the same data: {} ({}) against a reference on {} ({}); compare runs of the same data, training subset, split and standardisation",
            run.dataset,
            describe(run),
            reference.dataset,
            describe(reference),
        ))),
    }
}

/// A run's test set in a few words.
fn describe(m: &RunManifest) -> String {
    match &m.table {
        Some(t) => match &t.spec.test_csv {
            Some(f) => format!(
                "{} training rows, test rows of {}",
                m.train_examples,
                f.display()
            ),
            None => format!(
                "{} training rows, a {} split seeded {}",
                m.train_examples, t.spec.test_fraction, t.spec.split_seed
            ),
        },
        None => format!("{} training images", m.train_examples),
    }
}

/// Compares the run in `run_dir` with the reference in `reference_dir` on `ds` (the data
/// of both, from [`crate::eval::load_run_data`]).
pub fn compare(
    run_dir: &Path,
    reference_dir: &Path,
    ds: &Dataset,
    device: &Device,
) -> Result<Comparison> {
    let (a, b) = (
        RunManifest::read(run_dir)?,
        RunManifest::read(reference_dir)?,
    );
    check_same_data(&a, &b)?;
    let mut c = Comparison {
        run: run_dir.display().to_string(),
        reference: reference_dir.display().to_string(),
        dataset: a.dataset.clone(),
        test_points: ds.test.len(),
        samples: (0, 0),
        agreement: None,
        total_variation: None,
        wasserstein2: None,
        metrics: None,
        regression: None,
    };
    if ds.task.is_regression() {
        let (pa, ma) = mixtures(run_dir, &a, ds, device)?;
        let (pb, mb) = mixtures(reference_dir, &b, ds, device)?;
        c.samples = (pa.samples(), pb.samples());
        c.wasserstein2 = Some(mean_w2(&ma, &mb, ds.test.len()));
        c.regression = pa.metrics().zip(pb.metrics());
        return Ok(c);
    }
    let (pa, pb) = (
        classes(run_dir, &a, ds, device)?,
        classes(reference_dir, &b, ds, device)?,
    );
    c.samples = (pa.samples(), pb.samples());
    let k = a.num_classes;
    let (ea, eb) = (pa.mean().unwrap_or_default(), pb.mean().unwrap_or_default());
    let (mut agree, mut tv) = (0usize, 0.0);
    for (p, q) in ea.chunks_exact(k).zip(eb.chunks_exact(k)) {
        agree += usize::from(argmax(p) == argmax(q));
        tv += 0.5 * p.iter().zip(q).map(|(x, y)| (x - y).abs()).sum::<f64>();
    }
    let n = ds.test.len().max(1) as f64;
    c.agreement = Some(agree as f64 / n);
    c.total_variation = Some(tv / n);
    c.metrics = pa.metrics().zip(pb.metrics());
    Ok(c)
}

fn argmax(p: &[f64]) -> usize {
    (0..p.len()).fold(0, |best, j| if p[j] > p[best] { j } else { best })
}

fn network(m: &RunManifest, device: &Device) -> Result<Network> {
    Network::new(&m.settings.model, m.input_dim, m.num_classes, 0, device)
}

/// The run's class ensemble on the test set, every chain's samples pooled.
fn classes(dir: &Path, m: &RunManifest, ds: &Dataset, device: &Device) -> Result<Accumulator> {
    let model = network(m, device)?;
    let mut acc = Accumulator::with_classes(&ds.test.labels, m.num_classes)?;
    for path in checkpoint::run_sample_paths(dir)? {
        let sample = checkpoint::load_sample(&path, device)?;
        model
            .load(&sample.tensors)
            .map_err(|e| Error::Checkpoint(format!("{}: {e}", path.display())))?;
        acc.add(&ensemble::predict(&model, &ds.test, device)?)?;
    }
    Ok(acc)
}

/// A regression run's mixture metrics and its components: per sample, the means and
/// variances at every test point.
type Components = Vec<(Vec<f64>, Vec<f64>)>;

fn mixtures(
    dir: &Path,
    m: &RunManifest,
    ds: &Dataset,
    device: &Device,
) -> Result<(RegressionAccumulator, Components)> {
    let model = network(m, device)?;
    let mut acc = RegressionAccumulator::new(&crate::train::test_targets(ds));
    let mut parts = Vec::new();
    for path in checkpoint::run_sample_paths(dir)? {
        let g = crate::eval::sample_gaussians(&model, &path, &ds.test, ds.task, device)?;
        acc.add(&g.0, &g.1)?;
        parts.push(g);
    }
    Ok((acc, parts))
}

/// Mean over the points of W₂ between the two mixtures: each mixture's quantile function
/// from its components' [`NORMAL_QUANTILES`] points, sorted (W₂ in one dimension is the L²
/// distance between quantile functions), compared at [`W2_LEVELS`] levels.
fn mean_w2(a: &Components, b: &Components, points: usize) -> f64 {
    let support = |parts: &Components, i: usize| {
        let mut v: Vec<f64> = parts
            .iter()
            .flat_map(|(m, s2)| {
                NORMAL_QUANTILES
                    .iter()
                    .map(move |z| m[i] + s2[i].sqrt() * z)
            })
            .collect();
        v.sort_by(f64::total_cmp);
        v
    };
    let at = |v: &[f64], u: f64| v[((u * v.len() as f64) as usize).min(v.len() - 1)];
    let mut total = 0.0;
    for i in 0..points {
        let (x, y) = (support(a, i), support(b, i));
        let sq: f64 = (0..W2_LEVELS)
            .map(|j| (j as f64 + 0.5) / W2_LEVELS as f64)
            .map(|u| (at(&x, u) - at(&y, u)).powi(2))
            .sum::<f64>()
            / W2_LEVELS as f64;
        total += sq.sqrt();
    }
    total / points.max(1) as f64
}

/// The comparison as a table for people (stderr).
pub fn table(c: &Comparison) -> String {
    let mut out = format!(
        "{} against {} on {} ({} test points; {} and {} samples)\n",
        c.run, c.reference, c.dataset, c.test_points, c.samples.0, c.samples.1
    );
    if let (Some(a), Some(tv)) = (c.agreement, c.total_variation) {
        out.push_str(&format!("agreement {a:.4}  total variation {tv:.4}\n"));
    }
    if let Some((m, r)) = &c.metrics {
        out.push_str(&format!(
            "run:       accuracy {:.4}  NLL {:.4}  ECE {:.4}\n",
            m.accuracy, m.nll, m.ece
        ));
        out.push_str(&format!(
            "reference: accuracy {:.4}  NLL {:.4}  ECE {:.4}\n",
            r.accuracy, r.nll, r.ece
        ));
    }
    if let Some(w) = c.wasserstein2 {
        out.push_str(&format!("mean W2 between the predictive mixtures {w:.4}\n"));
    }
    if let Some((m, r)) = &c.regression {
        out.push_str(&format!(
            "run:       RMSE {:.4}  NLL {:.4}  95% coverage {:.4}\n",
            m.rmse, m.nll, m.coverage[2]
        ));
        out.push_str(&format!(
            "reference: RMSE {:.4}  NLL {:.4}  95% coverage {:.4}\n",
            r.rmse, r.nll, r.coverage[2]
        ));
    }
    out
}
