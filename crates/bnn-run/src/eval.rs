//! `bnn eval`: streams every saved sample of a run through the test (and validation) set
//! and reports the Bayesian model average, exactly as the in-training accumulator did;
//! in the same pass, optionally, through an out-of-distribution test set (how well
//! uncertainty tells it apart) and through the test set rotated (accuracy and calibration
//! under shift), Ovadia et al. 2019's protocols. Memory stays flat in the number of
//! samples: each set keeps running sums, and the last sample's prediction for the
//! single-sample scores.

use std::path::{Path, PathBuf};

use candle_core::Device;
use serde::{Deserialize, Serialize};

use crate::checkpoint::{self, RunManifest};
use crate::data::{self, shift, Dataset, LoadOptions, Split, NUM_CLASSES};
use crate::ensemble::{self, Accumulator, EnsembleAfter};
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::model::Network;
use crate::regression::{RegressionAccumulator, RegressionMetrics};
use crate::uncertainty::{self, Detection, Uncertainty};

/// What `bnn eval` prints.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EvalReport {
    /// The run evaluated.
    pub run_dir: String,
    /// Its dataset.
    pub dataset: String,
    /// Samples in the ensemble.
    pub samples: usize,
    /// The ensemble's test metrics.
    pub ensemble: Option<Metrics>,
    /// Entropies, mutual information, per-class accuracy, accuracy-vs-coverage.
    #[serde(default)]
    pub uncertainty: Option<Uncertainty>,
    /// The last sample's own test metrics.
    pub last_sample: Option<Metrics>,
    /// A regression's ensemble on the test rows (RMSE, mixture NLL, coverage, variance
    /// split).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regression: Option<RegressionMetrics>,
    /// A regression's last sample alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regression_last_sample: Option<RegressionMetrics>,
    /// The ensemble's validation metrics (with `--valid`).
    pub valid_ensemble: Option<Metrics>,
    /// Test accuracy and NLL of the ensemble of the first k samples, for each k (of the
    /// first chain, in a multi-chain run).
    pub progress: Vec<EnsembleAfter>,
    /// Out-of-distribution detection (`--ood-dataset`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ood: Option<OodReport>,
    /// Accuracy and calibration under rotation (`--shift rotate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shift: Option<ShiftReport>,
}

/// An out-of-distribution test set.
#[derive(Debug, Clone)]
pub struct OodSet {
    /// The dataset's name.
    pub dataset: String,
    /// Where it was read.
    pub source: String,
    /// Its test split, standardised as the run's data.
    pub test: Split,
}

/// What else `bnn eval` runs the samples through.
#[derive(Debug, Clone, Default)]
pub struct Extras {
    /// An out-of-distribution test set, to tell apart from the run's.
    pub ood: Option<OodSet>,
    /// Rotate the test set by each of these angles (degrees).
    pub rotations: Vec<f64>,
}

/// Scores of telling in- from out-of-distribution test images apart.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OodScores {
    /// By predictive entropy H[p(y|x)].
    pub entropy: Detection,
    /// By 1 − max_k p(k|x) (a confident prediction: in distribution).
    pub max_probability: Detection,
    /// By mutual information; only an ensemble has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mutual_information: Option<Detection>,
}

/// Histogram of per-example predictive entropy, in and out of distribution.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EntropyHistogram {
    /// Bin edges in nats, from 0 to ln(classes).
    pub edges: Vec<f64>,
    /// Examples per entropy bin, in-distribution.
    pub inside: Vec<usize>,
    /// Examples per entropy bin, out-of-distribution.
    pub outside: Vec<usize>,
}

/// `--ood-dataset`: how well uncertainty separates the run's test set from another's.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OodReport {
    /// The run's dataset.
    pub in_dataset: String,
    /// The out-of-distribution dataset.
    pub ood_dataset: String,
    /// Where it was read from.
    pub ood_data_source: String,
    /// Samples in the ensemble.
    pub samples: usize,
    /// Out of distribution is the positive class of AUPR.
    pub ensemble: OodScores,
    /// The last sample alone.
    pub single_sample: OodScores,
    /// Mean predictive entropy and mutual information of the ensemble, in and out.
    pub mean_entropy_in: f64,
    /// Mean predictive entropy out of distribution.
    pub mean_entropy_out: f64,
    /// Mean mutual information in distribution.
    pub mean_mutual_information_in: f64,
    /// Mean mutual information out of distribution.
    pub mean_mutual_information_out: f64,
    /// The ensemble's predictive entropies, both sets.
    pub ensemble_entropy_histogram: EntropyHistogram,
}

/// One angle of `--shift rotate`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ShiftPoint {
    /// Rotation in degrees.
    pub angle: f64,
    /// The ensemble's metrics on the rotated test set.
    pub ensemble: Metrics,
    /// The last sample's.
    pub single_sample: Metrics,
    /// Mean predictive entropy.
    pub mean_predictive_entropy: f64,
    /// Mean mutual information.
    pub mean_mutual_information: f64,
}

/// `--shift rotate`: the test set rotated by 0°…180°.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ShiftReport {
    /// The shift (`rotate`).
    pub shift: String,
    /// Samples in the ensemble.
    pub samples: usize,
    /// One point per amount of shift.
    pub points: Vec<ShiftPoint>,
}

/// Bins of [`EntropyHistogram`].
pub const ENTROPY_BINS: usize = 30;

/// Reloads the data a run was trained on: the folder recorded in `run.json` unless
/// `data_dir` overrides it.
pub fn load_run_data(
    manifest: &RunManifest,
    data_dir: Option<PathBuf>,
    offline: bool,
) -> Result<Dataset> {
    if let Some(origin) = &manifest.table {
        // A table is rebuilt from its record: the same file, split and standardisation.
        let ds = data::tabular::load(&origin.spec)?;
        origin.check_same_split(&ds)?;
        if ds.train.len() != manifest.train_examples || ds.train.dim() != manifest.input_dim {
            return Err(Error::Data(format!(
                "{}: {} training rows of {} features, but the run was trained on {} of {}",
                origin.spec.csv.display(),
                ds.train.len(),
                ds.train.dim(),
                manifest.train_examples,
                manifest.input_dim
            )));
        }
        return Ok(ds);
    }
    let recorded = PathBuf::from(&manifest.data_source);
    let data_dir = data_dir
        .or_else(|| (manifest.data_source != "built-in" && recorded.is_dir()).then_some(recorded));
    let opts = LoadOptions {
        data_dir,
        offline,
        mirror: None,
        valid: manifest.valid,
        train_limit: Some(manifest.train_examples),
        builtin_fallback: false,
    };
    let mut ds = data::load(&manifest.dataset, &opts)?;
    ds.set_standardization(manifest.standardization.clone())?;
    if ds.train.len() != manifest.train_examples || ds.train.dim() != manifest.input_dim {
        return Err(Error::Data(format!(
            "the data found ({} training examples of dimension {}) is not what the run was trained on ({} of dimension {})",
            ds.train.len(),
            ds.train.dim(),
            manifest.train_examples,
            manifest.input_dim
        )));
    }
    Ok(ds)
}

/// The test split of dataset `name` as an out-of-distribution set for the run of
/// `manifest`: standardised as the run's data, of the same image size.
pub fn load_ood_data(
    manifest: &RunManifest,
    name: &str,
    data_dir: Option<PathBuf>,
    offline: bool,
) -> Result<OodSet> {
    let opts = LoadOptions {
        data_dir,
        offline,
        mirror: None,
        valid: 0,
        train_limit: None,
        builtin_fallback: false,
    };
    let mut ds = data::load(name, &opts)?;
    if ds.test.dim() != manifest.input_dim {
        return Err(Error::Data(format!(
            "--ood-dataset {name}: images of {} pixels, the run's have {}",
            ds.test.dim(),
            manifest.input_dim
        )));
    }
    ds.set_standardization(manifest.standardization.clone())?;
    Ok(OodSet {
        dataset: ds.name.clone(),
        source: ds.source.clone(),
        test: ds.test,
    })
}

/// What a classification run's samples are evaluated on.
struct Splits<'a> {
    ds: &'a Dataset,
    ood: Option<&'a Split>,
    rotated: &'a [Split],
    num_classes: usize,
}

/// One chain's ensembles on each split, and its last sample's predictions (test, OOD).
struct ChainEval {
    test: Accumulator,
    valid: Option<Accumulator>,
    ood: Option<Accumulator>,
    rotated: Vec<Accumulator>,
    last_test: Vec<f32>,
    last_ood: Vec<f32>,
}

/// Evaluates the samples of the chain in `dir` (of the run in `run_dir`) on `on`.
fn evaluate_chain(
    run_dir: &Path,
    dir: &Path,
    model: &Network,
    device: &Device,
    on: &Splits<'_>,
) -> Result<ChainEval> {
    let paths = checkpoint::list_samples(dir)?;
    if paths.is_empty() {
        return Err(Error::Checkpoint(format!(
            "{}: no samples (sample-*.safetensors) in {}",
            run_dir.display(),
            checkpoint::samples_dir(dir).display()
        )));
    }
    let (ds, k) = (on.ds, on.num_classes);
    let mut e = ChainEval {
        test: Accumulator::with_classes(&ds.test.labels, k)?,
        valid: match ds.valid.as_ref() {
            Some(v) => Some(Accumulator::with_classes(&v.labels, k)?),
            None => None,
        },
        ood: on.ood.map(|o| Accumulator::new(&o.labels)),
        rotated: on
            .rotated
            .iter()
            .map(|r| Accumulator::new(&r.labels))
            .collect(),
        last_test: Vec::new(),
        last_ood: Vec::new(),
    };
    for path in &paths {
        let sample = checkpoint::load_sample(path, device)?;
        model
            .load(&sample.tensors)
            .map_err(|err| Error::Checkpoint(format!("{}: {err}", path.display())))?;
        e.last_test = ensemble::predict(model, &ds.test, device)?;
        e.test.add(&e.last_test)?;
        if let (Some(acc), Some(v)) = (e.valid.as_mut(), ds.valid.as_ref()) {
            acc.add(&ensemble::predict(model, v, device)?)?;
        }
        if let (Some(acc), Some(o)) = (e.ood.as_mut(), on.ood) {
            e.last_ood = ensemble::predict(model, o, device)?;
            acc.add(&e.last_ood)?;
        }
        for (acc, split) in e.rotated.iter_mut().zip(on.rotated) {
            acc.add(&ensemble::predict(model, split, device)?)?;
        }
    }
    Ok(e)
}

/// The rotated test sets' report (none without rotations): each angle's pooled
/// ensemble, from the chains' accumulators `per_angle`.
fn shift_report(
    angles: &[f64],
    per_angle: &[Vec<Accumulator>],
    samples: usize,
) -> Result<Option<ShiftReport>> {
    if angles.is_empty() {
        return Ok(None);
    }
    Ok(Some(ShiftReport {
        shift: "rotate".into(),
        samples,
        points: angles
            .iter()
            .zip(per_angle)
            .map(|(&angle, accs)| shift_point(angle, &Accumulator::pooled(accs)?))
            .collect::<Result<_>>()?,
    }))
}

/// Evaluates every sample of the run in `run_dir` on `ds` (and on what `extras` asks).
pub fn evaluate_run(
    run_dir: &Path,
    manifest: &RunManifest,
    ds: &Dataset,
    device: &Device,
    extras: &Extras,
) -> Result<EvalReport> {
    let device = device.clone();
    let model = Network::new(
        &manifest.settings.model,
        manifest.input_dim,
        manifest.num_classes,
        0,
        &device,
    )?;
    if ds.task.is_regression() {
        return evaluate_regression(run_dir, manifest, ds, &model, &device);
    }
    let rotated: Vec<Split> = extras
        .rotations
        .iter()
        .map(|&a| shift::rotated(&ds.test, a))
        .collect();
    // Chain by chain, then pooled in chain order, as training pools them.
    let (mut tests, mut valids) = (Vec::new(), Vec::new());
    let (mut oods, mut rotations) = (Vec::new(), vec![Vec::new(); rotated.len()]);
    let (mut last_test, mut last_ood) = (Vec::new(), Vec::new());
    let on = Splits {
        ds,
        ood: extras.ood.as_ref().map(|o| &o.test),
        rotated: &rotated,
        num_classes: manifest.num_classes,
    };
    for dir in checkpoint::chain_dirs(run_dir) {
        let chain = evaluate_chain(run_dir, &dir, &model, &device, &on)?;
        tests.push(chain.test);
        valids.extend(chain.valid);
        oods.extend(chain.ood);
        for (all, acc) in rotations.iter_mut().zip(chain.rotated) {
            all.push(acc);
        }
        (last_test, last_ood) = (chain.last_test, chain.last_ood);
    }
    let test = Accumulator::pooled(&tests)?;
    let valid = match valids.is_empty() {
        true => None,
        false => Some(Accumulator::pooled(&valids)?),
    };
    let ood = match &extras.ood {
        Some(o) => Some(ood_report(
            &manifest.dataset,
            &o.dataset,
            &o.source,
            (&test, &Accumulator::pooled(&oods)?),
            (&last_test, &last_ood),
        )?),
        None => None,
    };
    let shift = shift_report(&extras.rotations, &rotations, test.samples())?;
    Ok(EvalReport {
        run_dir: run_dir.display().to_string(),
        dataset: manifest.dataset.clone(),
        samples: test.samples(),
        ensemble: test.metrics(),
        uncertainty: test.uncertainty(),
        last_sample: test.last_sample,
        regression: None,
        regression_last_sample: None,
        valid_ensemble: valid.as_ref().and_then(|a| a.metrics()),
        progress: test.progress(),
        ood,
        shift,
    })
}

/// The regression sample at `path` loaded into `model`: its predictive Gaussians on
/// `split` (means, and its recorded noise σ²), in the target's units.
pub fn sample_gaussians(
    model: &Network,
    path: &Path,
    split: &Split,
    task: data::Task,
    device: &Device,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let sample = checkpoint::load_sample(path, device)?;
    let bad = |e: String| Error::Checkpoint(format!("{}: {e}", path.display()));
    model
        .load(&sample.tensors)
        .map_err(|e| bad(e.to_string()))?;
    let tau = sample
        .metadata
        .get(crate::train::NOISE_PRECISION_KEY)
        .and_then(|t| t.parse::<f64>().ok())
        .ok_or_else(|| bad("no noise precision in a regression's sample".into()))?;
    crate::train::predict_gaussians(model, split, task, tau, device)
}

/// [`evaluate_run`] for a regression: every sample's Gaussians (its mean, its recorded
/// noise σ) on the test rows, chain by chain, pooled.
fn evaluate_regression(
    run_dir: &Path,
    manifest: &RunManifest,
    ds: &Dataset,
    model: &Network,
    device: &Device,
) -> Result<EvalReport> {
    let mut chains = Vec::new();
    for dir in checkpoint::chain_dirs(run_dir) {
        let mut acc = RegressionAccumulator::new(&crate::train::test_targets(ds));
        for path in checkpoint::list_samples(&dir)? {
            let (mean, var) = sample_gaussians(model, &path, &ds.test, ds.task, device)?;
            acc.add(&mean, &var)?;
        }
        chains.push(acc);
    }
    let all = RegressionAccumulator::pooled(&chains)?;
    Ok(EvalReport {
        run_dir: run_dir.display().to_string(),
        dataset: manifest.dataset.clone(),
        samples: all.samples(),
        ensemble: None,
        uncertainty: None,
        last_sample: None,
        regression: all.metrics(),
        regression_last_sample: all.last_sample,
        valid_ensemble: None,
        progress: Vec::new(),
        ood: None,
        shift: None,
    })
}

/// Writes `report` into `run_dir/eval/`: `in_distribution.json`, and `ood-<dataset>.json`
/// and `shift-rotate.json` where asked for (what `bnn plot` reads). Returns the paths.
pub fn write_report(run_dir: &Path, report: &EvalReport) -> Result<Vec<PathBuf>> {
    let dir = run_dir.join("eval");
    std::fs::create_dir_all(&dir)
        .map_err(|e| Error::Checkpoint(format!("cannot create {}: {e}", dir.display())))?;
    let in_distribution = EvalReport {
        ood: None,
        shift: None,
        ..report.clone()
    };
    let mut written = vec![put_json(&dir, "in_distribution.json", &in_distribution)?];
    if let Some(o) = &report.ood {
        written.push(put_json(&dir, &format!("ood-{}.json", o.ood_dataset), o)?);
    }
    if let Some(s) = &report.shift {
        written.push(put_json(&dir, &format!("shift-{}.json", s.shift), s)?);
    }
    Ok(written)
}

/// Writes `value` as pretty JSON to `dir/name`, atomically.
fn put_json<T: Serialize>(dir: &Path, name: &str, value: &T) -> Result<PathBuf> {
    let path = dir.join(name);
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| Error::Checkpoint(format!("serialising {}: {e}", path.display())))?;
    crate::atomic::write_atomic(&path, text.as_bytes())?;
    Ok(path)
}

/// One angle's ensemble and single-sample figures.
fn shift_point(angle: f64, acc: &Accumulator) -> Result<ShiftPoint> {
    let none = || Error::Checkpoint("no samples to evaluate".into());
    let u = acc.uncertainty().ok_or_else(none)?;
    Ok(ShiftPoint {
        angle,
        ensemble: acc.metrics().ok_or_else(none)?,
        single_sample: acc.last_sample.ok_or_else(none)?,
        mean_predictive_entropy: u.predictive_entropy,
        mean_mutual_information: u.mutual_information,
    })
}

/// Detection scores from the ensembles of the in- and out-of-distribution sets and from
/// the last sample's predictions on both.
fn ood_report(
    in_dataset: &str,
    ood_dataset: &str,
    source: &str,
    (inside, outside): (&Accumulator, &Accumulator),
    (last_in, last_out): (&[f32], &[f32]),
) -> Result<OodReport> {
    let none = || Error::Checkpoint("no samples to evaluate".into());
    let (h_in, mi_in) = inside.example_scores().ok_or_else(none)?;
    let (h_out, mi_out) = outside.example_scores().ok_or_else(none)?;
    let doubt = |mean: Vec<f64>| -> Vec<f64> {
        mean.chunks_exact(NUM_CLASSES)
            .map(|r| 1.0 - r.iter().copied().fold(f64::NEG_INFINITY, f64::max))
            .collect()
    };
    let single = |probs: &[f32]| -> (Vec<f64>, Vec<f64>) {
        let rows = probs.chunks_exact(NUM_CLASSES);
        let h = rows.clone().map(uncertainty::entropy_f32).collect();
        let d = rows
            .map(|r| 1.0 - r.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64)
            .collect();
        (h, d)
    };
    let ((sh_in, sd_in), (sh_out, sd_out)) = (single(last_in), single(last_out));
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let top = (NUM_CLASSES as f64).ln();
    let edges: Vec<f64> = (0..=ENTROPY_BINS)
        .map(|b| top * b as f64 / ENTROPY_BINS as f64)
        .collect();
    let histogram = |v: &[f64]| {
        let mut counts = vec![0usize; ENTROPY_BINS];
        for &h in v {
            let b = ((h / top * ENTROPY_BINS as f64) as usize).min(ENTROPY_BINS - 1);
            counts[b] += 1;
        }
        counts
    };
    Ok(OodReport {
        in_dataset: in_dataset.to_string(),
        ood_dataset: ood_dataset.to_string(),
        ood_data_source: source.to_string(),
        samples: inside.samples(),
        ensemble: OodScores {
            entropy: uncertainty::detection(&h_in, &h_out),
            max_probability: uncertainty::detection(
                &doubt(inside.mean().ok_or_else(none)?),
                &doubt(outside.mean().ok_or_else(none)?),
            ),
            mutual_information: Some(uncertainty::detection(&mi_in, &mi_out)),
        },
        single_sample: OodScores {
            entropy: uncertainty::detection(&sh_in, &sh_out),
            max_probability: uncertainty::detection(&sd_in, &sd_out),
            mutual_information: None,
        },
        mean_entropy_in: mean(&h_in),
        mean_entropy_out: mean(&h_out),
        mean_mutual_information_in: mean(&mi_in),
        mean_mutual_information_out: mean(&mi_out),
        ensemble_entropy_histogram: EntropyHistogram {
            inside: histogram(&h_in),
            outside: histogram(&h_out),
            edges,
        },
    })
}
