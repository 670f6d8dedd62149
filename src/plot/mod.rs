//! `bnn plot`: the pictures of a run, from what training and `bnn eval` wrote
//! (`metrics.jsonl`, `summary.json`, `eval/*.json`, the chains' and replicas' folders):
//! learning curves, ensemble size, reliability, sampler dynamics, chains, replicas,
//! rotation and out-of-distribution entropy. Each is a PNG and an SVG; a picture whose
//! data the run lacks is skipped with the reason.

pub mod render;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::eval::{EvalReport, OodReport, ShiftReport};
use crate::train::{ChainDiagnostics, EpochRecord, ReplicaReport};
use render::{Corner, Figure, Mark, Panel, Series};

/// What `bnn plot` prints.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PlotReport {
    pub run_dir: String,
    pub out_dir: String,
    /// Files written, PNG and SVG of each picture.
    pub written: Vec<String>,
    /// Pictures not drawn, each with why (and what to run to get it).
    pub skipped: Vec<String>,
}

/// What the pictures need of `summary.json` (which flattens the settings into it, so
/// that its whole type does not read back: the settings' `chains` count and the per-chain
/// list share a key).
#[derive(Debug, Clone, Deserialize)]
struct SummaryView {
    #[serde(default)]
    ensemble: Option<crate::metrics::Metrics>,
    #[serde(default)]
    uncertainty: Option<crate::uncertainty::Uncertainty>,
    #[serde(default)]
    progress: Vec<crate::ensemble::EnsembleAfter>,
    #[serde(default)]
    convergence: Option<ChainDiagnostics>,
    #[serde(default)]
    replica_exchange: Option<ReplicaReport>,
}

/// Draws every picture the run in `run_dir` has data for into `out` (default
/// `run_dir/plots`).
pub fn plot_run(run_dir: &Path, out: Option<&Path>) -> Result<PlotReport> {
    let summary: SummaryView = read_json(&run_dir.join(crate::checkpoint::files::SUMMARY))
        .map_err(|e| {
            Error::Checkpoint(format!(
                "{e}; is {} a finished `bnn train` run?",
                run_dir.display()
            ))
        })?;
    let out_dir = out.map_or_else(|| run_dir.join("plots"), Path::to_path_buf);
    std::fs::create_dir_all(&out_dir)
        .map_err(|e| Error::Checkpoint(format!("cannot create {}: {e}", out_dir.display())))?;
    let eval_dir = run_dir.join("eval");
    let evaluated: Option<EvalReport> = optional_json(&eval_dir.join("in_distribution.json"))?;
    let chains = crate::checkpoint::chain_dirs(run_dir);
    let manifest = crate::checkpoint::RunManifest::read(run_dir)?;
    let hmc = manifest.settings.sampler.kind == crate::sampler::SamplerKind::Hmc;

    let mut p = Pictures::default();
    p.training(&chains, hmc)?;
    p.ensemble(&summary, evaluated.as_ref());
    p.chains(&chains, &summary, hmc)?;
    match &summary.replica_exchange {
        Some(r) => p.figures.push(replicas(r, run_dir)?),
        None => p
            .skipped
            .push("replicas: not a replica-exchange run (`--sampler renhd|reld`)".into()),
    }
    p.evaluations(&eval_dir)?;
    match regression_band(run_dir)? {
        Ok(f) => p.figures.push(f),
        Err(why) => p.skipped.push(format!("regression_band: {why}")),
    }
    let mut written = Vec::new();
    for f in &p.figures {
        for path in render::write(f, &out_dir)? {
            written.push(path.display().to_string());
        }
    }
    Ok(PlotReport {
        run_dir: run_dir.display().to_string(),
        out_dir: out_dir.display().to_string(),
        written,
        skipped: p.skipped,
    })
}

/// The pictures a run has data for, and why each other one is not drawn.
#[derive(Default)]
struct Pictures {
    figures: Vec<Figure>,
    skipped: Vec<String>,
}

impl Pictures {
    /// The learning curves and the sampler's dynamics, from the first chain's lines.
    fn training(&mut self, chains: &[PathBuf], hmc: bool) -> Result<()> {
        if hmc {
            // Its metrics.jsonl has a line per iteration (acceptance, ε, ΔH), not per epoch.
            self.skipped.push(
                "learning_curves, dynamics: an HMC run (metrics.jsonl: one line per iteration)"
                    .into(),
            );
            return Ok(());
        }
        let epochs = read_epochs(&chains[0].join(crate::checkpoint::files::METRICS))?;
        self.figures.push(learning_curves(&epochs));
        let diagnostics_path = chains[0].join(crate::checkpoint::files::DIAGNOSTICS);
        let watched: Vec<crate::train::diagnostics::DiagnosticRecord> =
            match diagnostics_path.is_file() {
                true => read_jsonl(&diagnostics_path)?,
                false => Vec::new(),
            };
        self.figures.push(dynamics(&epochs, &watched));
        Ok(())
    }

    /// The ensemble's size curve and reliability, from `bnn eval`'s report if there is
    /// one, else from the summary.
    fn ensemble(&mut self, summary: &SummaryView, evaluated: Option<&EvalReport>) {
        let progress = match evaluated {
            Some(e) if !e.progress.is_empty() => e.progress.clone(),
            _ => summary.progress.clone(),
        };
        match progress.is_empty() {
            true => self
                .skipped
                .push("ensemble_size: the run kept no samples".into()),
            false => self.figures.push(ensemble_size(&progress)),
        }
        match evaluated
            .and_then(|e| e.uncertainty.clone())
            .or(summary.uncertainty.clone())
        {
            Some(u) => self
                .figures
                .push(reliability(&u.reliability, summary.ensemble.map(|m| m.ece))),
            None => self.skipped.push(
                "reliability: no uncertainty in summary.json; run `bnn eval --run RUN`".into(),
            ),
        }
    }

    /// Each chain's trace, for a run of several minibatch chains.
    fn chains(&mut self, chains: &[PathBuf], summary: &SummaryView, hmc: bool) -> Result<()> {
        if summary.replica_exchange.is_some() {
            // Its chain-0 is the T = 1 samples, not a chain of its own.
            self.skipped
                .push("chains: a replica-exchange run (see replicas)".into());
        } else if hmc {
            self.skipped
                .push("chains: an HMC run (its R-hat is in summary.json)".into());
        } else if chains.len() > 1 {
            let traces = chains
                .iter()
                .map(|d| read_epochs(&d.join(crate::checkpoint::files::METRICS)))
                .collect::<Result<Vec<_>>>()?;
            self.figures.push(chain_traces(&traces, summary));
        } else {
            self.skipped
                .push("chains: a single-chain run (`--chains K` draws each chain)".into());
        }
        Ok(())
    }

    /// What `bnn eval` wrote: the rotated test sets and each out-of-distribution set.
    fn evaluations(&mut self, eval_dir: &Path) -> Result<()> {
        match optional_json::<ShiftReport>(&eval_dir.join("shift-rotate.json"))? {
            Some(s) => self.figures.push(rotation(&s)),
            None => self.skipped.push(
                "rotation: no eval/shift-rotate.json; run `bnn eval --run RUN --shift rotate`"
                    .into(),
            ),
        }
        let mut oods = Vec::new();
        if let Ok(entries) = std::fs::read_dir(eval_dir) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with("ood-") && name.ends_with(".json") {
                    oods.push(e.path());
                }
            }
        }
        oods.sort();
        if oods.is_empty() {
            self.skipped.push(
                "ood: no eval/ood-*.json; run `bnn eval --run RUN --ood-dataset NAME`".into(),
            );
        }
        for path in oods {
            self.figures.push(ood(&read_json::<OodReport>(&path)?));
        }
        Ok(())
    }
}

/// A panel of the predictive mean `centre` on `grid` with its ±2σ band (σ = `sd`) over
/// the training `data`.
fn band_panel(
    title: &str,
    grid: &[f64],
    (centre, sd): (&[f64], &[f64]),
    data: &[(f64, f64)],
) -> Panel {
    let upper = grid
        .iter()
        .zip(centre.iter().zip(sd))
        .map(|(&x, (c, d))| (x, c + 2.0 * d));
    let lower = grid
        .iter()
        .zip(centre.iter().zip(sd))
        .map(|(&x, (c, d))| (x, c - 2.0 * d));
    let shade: Vec<(f64, f64)> = upper
        .collect::<Vec<_>>()
        .into_iter()
        .chain(lower.rev())
        .collect();
    let line: Vec<(f64, f64)> = grid.iter().copied().zip(centre.iter().copied()).collect();
    panel(
        title,
        "x",
        "y",
        vec![
            Series::new("±2σ", shade, Mark::Band),
            Series::new("predictive mean", line, Mark::Line),
            Series::new("training data", data.to_vec(), Mark::Points),
        ],
    )
}

/// The 1-D regression picture: the training data, the ensemble's predictive mean and its
/// ±2σ band, beside the last sample's mean and ±2σ of its own noise; or why not.
fn regression_band(run_dir: &Path) -> Result<std::result::Result<Figure, String>> {
    let manifest = crate::checkpoint::RunManifest::read(run_dir)?;
    let one_feature = manifest
        .table
        .as_ref()
        .is_some_and(|t| t.features.len() == 1);
    if !manifest.task.is_regression() || !one_feature {
        return Ok(Err(
            "not a regression on one feature (`--toy regression-1d`)".into(),
        ));
    }
    let ds = crate::eval::load_run_data(&manifest, None, true)?;
    let (crate::data::Task::Regression { mean, std }, Some(origin)) = (ds.task, &ds.table) else {
        return Ok(Err("the data is not a regression".into()));
    };
    let (m, s) = (origin.feature_mean[0], origin.feature_std[0]);
    let data: Vec<(f64, f64)> = ds
        .train
        .features
        .iter()
        .zip(&ds.train.values)
        .map(|(&x, &y)| (x as f64 * s + m, y as f64 * std + mean))
        .collect();
    let (lo, hi) = data
        .iter()
        .fold((f64::MAX, f64::MIN), |a, p| (a.0.min(p.0), a.1.max(p.0)));
    let reach = (hi - lo) / 2.0;
    let grid = crate::band::grid(lo - reach, hi + reach, 241);
    let band = crate::band::band(run_dir, &manifest, &grid, &candle_core::Device::Cpu)?;
    // The numbers behind the picture, for another program.
    let json = serde_json::to_string(&band)
        .map_err(|e| Error::Checkpoint(format!("serialising the band: {e}")))?;
    let out = run_dir.join("eval").join("regression_band.json");
    std::fs::create_dir_all(run_dir.join("eval")).map_err(|e| Error::io(&out, e))?;
    crate::atomic::write_atomic(&out, json.as_bytes())?;
    let panel_of =
        |title: &str, centre: &[f64], sd: &[f64]| band_panel(title, &grid, (centre, sd), &data);
    // One y range for both, so that the two bands compare by eye.
    let edges = |m: &[f64], sd: &[f64]| -> Vec<f64> {
        m.iter()
            .zip(sd)
            .flat_map(|(m, s)| [m - 2.0 * s, m + 2.0 * s])
            .collect()
    };
    let mut all = edges(&band.mean, &band.std);
    all.extend(edges(&band.sample_mean, &band.sample_std));
    let (y0, y1) = all
        .iter()
        .fold((f64::MAX, f64::MIN), |a, &v| (a.0.min(v), a.1.max(v)));
    let pad = 0.05 * (y1 - y0);
    Ok(Ok(Figure {
        name: "regression_band".into(),
        title: format!("Predictive band ({} samples)", band.samples),
        panels: vec![
            panel_of("ensemble (Bayesian model average)", &band.mean, &band.std)
                .y_range(y0 - pad, y1 + pad),
            panel_of(
                "last sample alone (its noise σ)",
                &band.sample_mean,
                &band.sample_std,
            )
            .y_range(y0 - pad, y1 + pad),
        ],
    }))
}

/// `bnn sample --plot DIR`: each coordinate's sampled histogram against the true
/// density, as `DIR/sample.png` and `DIR/sample.svg`.
pub fn plot_sample(report: &crate::synthetic::SampleReport, dir: &Path) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::Checkpoint(format!("cannot create {}: {e}", dir.display())))?;
    let o = &report.options;
    let panels = report
        .marginals
        .iter()
        .enumerate()
        .map(|(d, m)| {
            let width = match m.centers.as_slice() {
                [a, b, ..] => b - a,
                _ => 1.0,
            };
            let points = |v: &[f64]| m.centers.iter().copied().zip(v.iter().copied()).collect();
            panel(
                &format!("Coordinate {}", d + 1),
                &format!("x{}", d + 1),
                "density",
                vec![
                    Series::new("samples", points(&m.sampled), Mark::Bars(width)),
                    Series::new("true density", points(&m.truth), Mark::Line),
                ],
            )
        })
        .collect();
    let figure = Figure {
        name: "sample".into(),
        title: format!(
            "{} with {}: {} samples, KL {:.4}",
            o.potential.name(),
            o.sampler.name(),
            report.samples,
            report.kl
        ),
        panels,
    };
    render::write(&figure, dir)
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Checkpoint(format!("cannot read {}: {e}", path.display())))?;
    serde_json::from_str(&text)
        .map_err(|e| Error::Checkpoint(format!("{}: not what bnn writes: {e}", path.display())))
}

fn optional_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Option<T>> {
    match path.is_file() {
        true => read_json(path).map(Some),
        false => Ok(None),
    }
}

fn read_jsonl<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Vec<T>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Checkpoint(format!("cannot read {}: {e}", path.display())))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l)
                .map_err(|e| Error::Checkpoint(format!("{} line {}: {e}", path.display(), i + 1)))
        })
        .collect()
}

fn read_epochs(path: &Path) -> Result<Vec<EpochRecord>> {
    read_jsonl(path)
}

fn panel(title: &str, x: &str, y: &str, series: Vec<Series>) -> Panel {
    Panel {
        title: title.into(),
        x_label: x.into(),
        y_label: y.into(),
        series,
        ..Panel::default()
    }
}

/// A panel over epochs, samples or indices: whole-number ticks.
fn count_panel(title: &str, x: &str, y: &str, series: Vec<Series>) -> Panel {
    panel(title, x, y, series).integer_x()
}

fn per_epoch(epochs: &[EpochRecord], f: impl Fn(&EpochRecord) -> Option<f64>) -> Vec<(f64, f64)> {
    epochs
        .iter()
        .filter_map(|e| f(e).map(|v| (e.epoch as f64, v)))
        .collect()
}

fn learning_curves(epochs: &[EpochRecord]) -> Figure {
    // Dots only where they can be told apart (a table's run has thousands of epochs).
    let mark = match epochs.len() > 200 {
        true => Mark::Line,
        false => Mark::LinePoints,
    };
    let loss = per_epoch(epochs, |e| Some(e.train_nll));
    let second = match epochs.iter().any(|e| e.train_rmse.is_some()) {
        true => regression_curves(epochs, mark),
        false => {
            let ens = per_epoch(epochs, |e| e.test_ensemble.map(|m| 100.0 * m.accuracy));
            let last = per_epoch(epochs, |e| e.test_last_sample.map(|m| 100.0 * m.accuracy));
            let train = per_epoch(epochs, |e| Some(100.0 * e.train_accuracy));
            count_panel(
                "Accuracy",
                "epoch",
                "accuracy (%)",
                vec![
                    Series::new("test: ensemble so far", ens, mark),
                    Series::new("test: last sample", last, mark),
                    Series::new("training minibatches", train, Mark::Line),
                ],
            )
        }
    };
    Figure {
        name: "learning_curves".into(),
        title: "Learning curves".into(),
        panels: vec![
            count_panel(
                "Training loss (minibatch NLL per example)",
                "epoch",
                "NLL",
                vec![Series::new("", loss, mark)],
            ),
            second.legend_at(Corner::UpperRight),
        ],
    }
}

/// A regression's second panel: the test ensemble's RMSE and 95% coverage so far, the
/// minibatches' RMSE and the noise σ, in the target's units.
fn regression_curves(epochs: &[EpochRecord], mark: Mark) -> Panel {
    let ens = per_epoch(epochs, |e| e.test_regression.map(|m| m.rmse));
    let train = per_epoch(epochs, |e| e.train_rmse);
    let sigma = per_epoch(epochs, |e| e.noise_std);
    count_panel(
        "RMSE and noise σ (target units)",
        "epoch",
        "RMSE, σ",
        vec![
            Series::new("test: ensemble RMSE so far", ens, mark),
            Series::new("training minibatches' RMSE", train, Mark::Line),
            Series::new("noise σ", sigma, Mark::Dashed),
        ],
    )
}

fn dynamics(
    epochs: &[EpochRecord],
    watched: &[crate::train::diagnostics::DiagnosticRecord],
) -> Figure {
    let mut panels = vec![count_panel(
        "Kinetic energy per parameter (epoch mean)",
        "epoch",
        "kinetic energy",
        vec![Series::new(
            "",
            per_epoch(epochs, |e| e.kinetic_energy),
            Mark::LinePoints,
        )],
    )];
    if epochs.iter().any(|e| e.thermostat.is_some()) {
        panels.push(count_panel(
            "Thermostat ξ (end of epoch)",
            "epoch",
            "ξ",
            vec![Series::new(
                "",
                per_epoch(epochs, |e| e.thermostat),
                Mark::LinePoints,
            )],
        ));
    }
    if let Some(first) = watched.first() {
        let per_tensor = first
            .kinetic_per_tensor
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let points = watched
                    .iter()
                    .filter_map(|r| {
                        r.kinetic_per_tensor
                            .get(i)
                            .map(|k| (r.step as f64, k.kinetic_energy))
                    })
                    .collect();
                Series::new(&t.tensor, points, Mark::Line)
            })
            .collect();
        panels.push(panel(
            "Kinetic energy per parameter of each tensor",
            "update",
            "kinetic energy",
            per_tensor,
        ));
    }
    if let Some(p) = configurational_panel(watched) {
        panels.push(p);
    }
    panels.push(count_panel(
        "Step size η",
        "epoch",
        "log10 η",
        vec![Series::new(
            "",
            per_epoch(epochs, |e| {
                Some(e.step_size_mean.unwrap_or(e.step_size).log10())
            }),
            Mark::LinePoints,
        )],
    ));
    Figure {
        name: "dynamics".into(),
        title: "Sampler dynamics".into(),
        panels,
    }
}

/// θ·∇Ũ/(D·T) against the update: each record's interval (dots), the mean since burn-in
/// overall and per tensor (lines), and 1, where a correct sampler's mean sits (dashed).
fn configurational_panel(watched: &[crate::train::diagnostics::DiagnosticRecord]) -> Option<Panel> {
    let with: Vec<_> = watched
        .iter()
        .filter_map(|r| Some((r.step as f64, r.configurational.as_ref()?)))
        .collect();
    let (first, _) = with.first()?;
    let last = with.last().map_or(*first, |w| w.0);
    let mut series = vec![
        Series::new(
            "each record's interval",
            with.iter().map(|(x, c)| (*x, c.temperature)).collect(),
            Mark::Points,
        ),
        Series::new(
            "since burn-in",
            with.iter()
                .filter_map(|(x, c)| Some((*x, c.since_burnin?)))
                .collect(),
            Mark::Line,
        ),
    ];
    if let Some((_, c)) = with.last().filter(|(_, c)| c.per_tensor.len() > 1) {
        for (i, t) in c.per_tensor.iter().enumerate() {
            let points = with
                .iter()
                .filter_map(|(x, c)| Some((*x, c.per_tensor.get(i)?.since_burnin?)))
                .collect();
            series.push(Series::new(
                &format!("{} since burn-in", t.tensor),
                points,
                Mark::Line,
            ));
        }
    }
    series.push(Series::new(
        "1 (a correct sampler)",
        vec![(*first, 1.0), (last, 1.0)],
        Mark::Dashed,
    ));
    Some(panel(
        "Configurational temperature θ·∇Ũ/(D·T)",
        "update",
        "θ·∇Ũ/(D·T)",
        series,
    ))
}

fn ensemble_size(progress: &[crate::ensemble::EnsembleAfter]) -> Figure {
    let acc = progress
        .iter()
        .map(|p| (p.samples as f64, 100.0 * p.accuracy))
        .collect();
    let nll = progress.iter().map(|p| (p.samples as f64, p.nll)).collect();
    Figure {
        name: "ensemble_size".into(),
        title: "Bayesian model average vs. number of samples (test set)".into(),
        panels: vec![
            count_panel(
                "Accuracy",
                "samples averaged",
                "accuracy (%)",
                vec![Series::new("", acc, Mark::LinePoints)],
            ),
            count_panel(
                "NLL",
                "samples averaged",
                "NLL",
                vec![Series::new("", nll, Mark::LinePoints)],
            ),
        ],
    }
}

fn reliability(bins: &[crate::uncertainty::ReliabilityBin], ece: Option<f64>) -> Figure {
    let width = 1.0 / bins.len().max(1) as f64;
    let centre = |b: &crate::uncertainty::ReliabilityBin| b.upper - width / 2.0;
    let used: Vec<_> = bins.iter().filter(|b| b.count > 0).collect();
    let total: usize = bins.iter().map(|b| b.count).sum();
    let acc = used.iter().map(|b| (centre(b), b.accuracy)).collect();
    let conf = used.iter().map(|b| (centre(b), b.confidence)).collect();
    let share = used
        .iter()
        .map(|b| (centre(b), 100.0 * b.count as f64 / total.max(1) as f64))
        .collect();
    let diagram = panel(
        "Accuracy per confidence bin",
        "confidence (top-class probability)",
        "accuracy",
        vec![
            Series::new("accuracy in bin", acc, Mark::Bars(0.9 * width)),
            Series::new("mean confidence in bin", conf, Mark::LinePoints),
            Series::new(
                "perfect calibration",
                vec![(0.0, 0.0), (1.0, 1.0)],
                Mark::Dashed,
            ),
        ],
    )
    .y_range(0.0, 1.02)
    .legend_at(Corner::UpperLeft);
    Figure {
        name: "reliability".into(),
        title: match ece {
            Some(e) => format!("Reliability of the ensemble (test set, ECE {:.4})", e),
            None => "Reliability of the ensemble (test set)".into(),
        },
        panels: vec![
            diagram,
            panel(
                "Predictions per bin",
                "confidence (top-class probability)",
                "share of test set (%)",
                vec![Series::new("", share, Mark::Bars(0.9 * width))],
            ),
        ],
    }
}

fn chain_traces(traces: &[Vec<EpochRecord>], summary: &SummaryView) -> Figure {
    let series = |f: &dyn Fn(&EpochRecord) -> Option<f64>| -> Vec<Series> {
        traces
            .iter()
            .enumerate()
            .map(|(k, t)| Series::new(&format!("chain {k}"), per_epoch(t, f), Mark::LinePoints))
            .collect()
    };
    let show = |c: Option<&crate::convergence::Convergence>| {
        c.map_or("n/a".to_string(), |c| format!("{:.3}", c.rhat))
    };
    let (ll, ke) = summary.convergence.as_ref().map_or((None, None), |d| {
        (d.test_log_likelihood.as_ref(), d.kinetic_energy.as_ref())
    });
    Figure {
        name: "chains".into(),
        title: format!(
            "{} chains: split R-hat of test log-likelihood {}, of kinetic energy {}",
            traces.len(),
            show(ll),
            show(ke)
        ),
        panels: vec![
            count_panel(
                "Training loss",
                "epoch",
                "NLL",
                series(&|e| Some(e.train_nll)),
            ),
            count_panel(
                "Test NLL of the last sample",
                "epoch",
                "NLL",
                series(&|e| e.test_last_sample.map(|m| m.nll)),
            ),
            count_panel(
                "Kinetic energy per parameter",
                "epoch",
                "kinetic energy",
                series(&|e| e.kinetic_energy),
            ),
        ],
    }
}

fn replicas(r: &ReplicaReport, run_dir: &Path) -> Result<Figure> {
    let rates = r
        .swap_rates
        .iter()
        .enumerate()
        .map(|(i, &s)| (i as f64, s))
        .collect();
    let ladder = r
        .ladder
        .temperatures
        .iter()
        .enumerate()
        .map(|(i, &t)| (i as f64, t.log10()))
        .collect();
    let mut held = Vec::new();
    let mut j = 0;
    loop {
        let path: PathBuf = run_dir
            .join(format!("replica-{j}"))
            .join(crate::checkpoint::files::METRICS);
        if !path.is_file() {
            break;
        }
        let points = read_epochs(&path)?
            .iter()
            .filter_map(|l| l.temperature.map(|t| (l.epoch as f64, t.log10())))
            .collect();
        held.push(Series::new(
            &format!("replica {j}"),
            points,
            Mark::LinePoints,
        ));
        j += 1;
    }
    let rate_panel = count_panel(
        "Swap rate of each pair (i, i+1)",
        "pair i",
        "swaps / tries",
        vec![Series::new("", rates, Mark::Bars(0.7))],
    )
    .y_range(0.0, 1.0);
    Ok(Figure {
        name: "replicas".into(),
        title: format!(
            "Replica exchange: {} temperatures, {} rounds",
            r.ladder.temperatures.len(),
            r.ladder.rounds
        ),
        panels: vec![
            rate_panel,
            count_panel(
                "Ladder",
                "temperature index i",
                "log10 Tᵢ",
                vec![Series::new("", ladder, Mark::LinePoints)],
            ),
            count_panel("Temperature held (end of epoch)", "epoch", "log10 T", held),
        ],
    })
}

fn rotation(s: &ShiftReport) -> Figure {
    let of = |f: &dyn Fn(&crate::eval::ShiftPoint) -> f64| -> Vec<(f64, f64)> {
        s.points.iter().map(|p| (p.angle, f(p))).collect()
    };
    let pair = |f: &dyn Fn(&crate::metrics::Metrics) -> f64| {
        vec![
            Series::new("ensemble", of(&|p| f(&p.ensemble)), Mark::LinePoints),
            Series::new(
                "last sample",
                of(&|p| f(&p.single_sample)),
                Mark::LinePoints,
            ),
        ]
    };
    Figure {
        name: "rotation".into(),
        title: format!("Rotated test images ({} samples)", s.samples),
        panels: vec![
            panel(
                "Accuracy",
                "rotation (degrees)",
                "accuracy (%)",
                pair(&|m| 100.0 * m.accuracy),
            ),
            panel("NLL", "rotation (degrees)", "NLL", pair(&|m| m.nll))
                .legend_at(Corner::LowerRight),
            panel("ECE", "rotation (degrees)", "ECE", pair(&|m| m.ece))
                .legend_at(Corner::LowerRight),
        ],
    }
}

fn ood(o: &OodReport) -> Figure {
    let h = &o.ensemble_entropy_histogram;
    let width = h.edges.get(1).copied().unwrap_or(1.0) - h.edges.first().copied().unwrap_or(0.0);
    let share = |counts: &[usize]| -> Vec<(f64, f64)> {
        let n: usize = counts.iter().sum();
        counts
            .iter()
            .zip(&h.edges)
            .map(|(&c, &lo)| (lo + width / 2.0, 100.0 * c as f64 / n.max(1) as f64))
            .collect()
    };
    Figure {
        name: format!("ood-{}", o.ood_dataset),
        title: format!(
            "{} (in) vs. {} (out): AUROC by entropy {:.3} ensemble, {:.3} one sample",
            o.in_dataset, o.ood_dataset, o.ensemble.entropy.auroc, o.single_sample.entropy.auroc
        ),
        panels: vec![panel(
            "Predictive entropy of the ensemble",
            "entropy (nats)",
            "share of test images (%)",
            vec![
                Series::new(
                    &format!("{} (in)", o.in_dataset),
                    share(&h.inside),
                    Mark::Bars(0.9 * width),
                ),
                Series::new(
                    &format!("{} (out)", o.ood_dataset),
                    share(&h.outside),
                    Mark::Bars(0.9 * width),
                ),
            ],
        )],
    }
}
