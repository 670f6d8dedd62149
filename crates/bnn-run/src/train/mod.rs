//! The training loop: seeded shuffled minibatches, one sampler update per minibatch,
//! burn-in and thinning, samples to disk and into the streaming ensemble, per-epoch
//! metrics, and a summary.

mod chain;
pub mod configurational;
pub mod diagnostics;
pub mod disk;
mod hmc;
pub mod hmc_state;
mod planned;
pub use hmc::{FullBatch, HmcRecord};
mod replicas;
pub mod sink;
mod spread;
mod stacked;
mod stepper;
mod task;
pub use task::{predict_gaussians, test_targets};

pub use replicas::ReplicaReport;

pub use stepper::Stepper;

use std::path::PathBuf;

use candle_core::Device;
use serde::{Deserialize, Serialize};

use crate::checkpoint::{self, RunManifest};
use crate::convergence::{self, Convergence};
use crate::data::Dataset;
use crate::ensemble::{Accumulator, Ensemble};
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::model::Network;
use crate::potential::Backward;
use crate::ranks::Ranks;
use crate::regression::RegressionMetrics;
use crate::sampler::Method;
use crate::settings::{ChainLayout, Settings};
use chain::run_chain;
pub use chain::{run_chain_in, ChainOutcome, NOISE_PRECISION_KEY};

/// Everything a training run needs besides the data: its settings and where and how it
/// runs.
#[derive(Debug, Clone)]
pub struct TrainConfig {
    /// What the run computes.
    pub settings: Settings,
    /// Folder of this run (`checkpoints/<run>`).
    pub run_dir: PathBuf,
    /// Show a progress bar.
    pub progress: bool,
    /// Where parameters, minibatches and sampler state live.
    pub device: Device,
    /// Continue the run in `run_dir` from its saved state.
    pub resume: bool,
    /// The command line that started the run (recorded in `run.json` for `--resume`).
    pub command_line: Vec<String>,
}

/// One line of `metrics.jsonl`: a chain's epoch, or a replica's (with which replica and
/// the temperature it held).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpochRecord {
    /// Replica exchange: the replica whose line this is (absent in a chain's lines).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<usize>,
    /// Replica exchange: the temperature that replica held at the epoch's end (in the T₀
    /// chain's lines: the one its sample came from; absent in a chain's lines).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// The epoch (from 1).
    pub epoch: usize,
    /// Updates done by its end.
    pub steps: u64,
    /// Mean minibatch negative log-likelihood per example.
    pub train_nll: f64,
    /// Accuracy on the minibatches as they were seen.
    pub train_accuracy: f64,
    /// η of the epoch's first update; where the schedule changes it within the epoch
    /// (`--cycles`, `--poly-gamma`), also its last and its mean over the epoch.
    pub step_size: f64,
    /// η at the epoch's last update.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_size_last: Option<f64>,
    /// Mean η over the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_size_mean: Option<f64>,
    /// Mean kinetic energy per parameter.
    pub kinetic_energy: Option<f64>,
    /// The thermostat at the epoch's end.
    pub thermostat: Option<f64>,
    /// λ per parameter tensor.
    pub prior_precisions: Vec<f64>,
    /// Samples kept so far.
    pub samples: usize,
    /// The ensemble's test metrics so far.
    pub test_ensemble: Option<Metrics>,
    /// A regression's: the ensemble's test metrics so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_regression: Option<RegressionMetrics>,
    /// A regression's RMSE on the epoch's minibatches as they were seen (target units).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub train_rmse: Option<f64>,
    /// A regression's noise σ at the epoch's end (target units).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub noise_std: Option<f64>,
    /// The last sample's test metrics.
    pub test_last_sample: Option<Metrics>,
    /// The ensemble's validation metrics so far.
    pub valid_ensemble: Option<Metrics>,
    /// Seconds the epoch took.
    pub seconds: f64,
}

/// `summary.json`, also the last line `bnn train` prints.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Summary {
    /// The dataset's name.
    pub dataset: String,
    /// Where it was read from (`built-in` for the bundled subset).
    pub data_source: String,
    /// Pixels standardised per pixel (`--standardize`) rather than scaled to [0, 1].
    pub standardized_inputs: bool,
    /// The run's settings, as in `run.json`.
    #[serde(flatten)]
    pub settings: Settings,
    /// The network in short (`mlp-784-100-10-relu`, ...).
    pub model_label: String,
    /// Parameters of the network.
    pub num_params: usize,
    /// The CPU kernel path (`avx512`, `avx2` or `portable`; see `kernels::isa`).
    #[serde(default)]
    pub isa: String,
    /// The gradient implementation used (`custom` or `autograd`: `auto` resolved).
    pub backward_used: Backward,
    /// Where `backward_used` is `plan`: which executor ran it (`host`, `cuda graphs (…)`,
    /// or `cuda eager (…)` with why capture failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub executor: Option<String>,
    /// Samples in the ensemble.
    pub samples: usize,
    /// Bayesian model average over the kept samples, on the test set.
    pub ensemble: Option<Metrics>,
    /// The ensemble's entropies, mutual information, per-class accuracy and
    /// accuracy-vs-coverage on the test set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uncertainty: Option<crate::uncertainty::Uncertainty>,
    /// The last kept sample alone, on the test set.
    pub last_sample: Option<Metrics>,
    /// A regression's ensemble on the test set (in the target's units): RMSE of the mean,
    /// NLL of the Gaussian mixture, coverage of the central 50/90/95% intervals and the
    /// predictive variance split into aleatoric and epistemic parts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regression: Option<RegressionMetrics>,
    /// A regression's last sample alone, on the test set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regression_last_sample: Option<RegressionMetrics>,
    /// The ensemble's validation metrics.
    pub valid_ensemble: Option<Metrics>,
    /// Test accuracy and NLL of the ensemble of the first k samples, for each k (of the
    /// first chain, in a multi-chain run), as `bnn eval` reports it.
    #[serde(default)]
    pub progress: Vec<crate::ensemble::EnsembleAfter>,
    /// Updates done.
    pub steps: u64,
    /// Rollbacks after a divergence, over all chains (`--on-divergence rollback`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rollbacks: u32,
    /// Wall time of the whole loop, evaluation and checkpoints included.
    pub train_seconds: f64,
    /// Updates per second of the training step alone (gather, forward, backward, update);
    /// with several chains, summed over them.
    pub steps_per_second: f64,
    /// Each chain's own figures (runs of several chains).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chains: Vec<ChainSummary>,
    /// Split-R̂ and ESS across the chains (runs of several chains).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub convergence: Option<ChainDiagnostics>,
    /// The ladder, swap rates and round trips (replica-exchange runs); the samples are
    /// those of the T = 1 temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica_exchange: Option<ReplicaReport>,
    /// The run folder.
    pub run_dir: String,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// One chain of a multi-chain run in `summary.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChainSummary {
    /// The chain's index.
    pub chain: usize,
    /// Its seed.
    pub seed: u64,
    /// Its samples.
    pub samples: usize,
    /// Its ensemble's test metrics.
    pub ensemble: Option<Metrics>,
    /// Its last sample's.
    pub last_sample: Option<Metrics>,
    /// Its ensemble's validation metrics.
    pub valid_ensemble: Option<Metrics>,
    /// A regression's: its ensemble's test metrics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regression: Option<RegressionMetrics>,
    /// Its updates per second.
    pub steps_per_second: f64,
}

/// Convergence across chains: of the test log-likelihood of each sample alone, and of the
/// kinetic energy per parameter at each sample (momentum samplers); `None` where there are
/// too few samples.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChainDiagnostics {
    /// Split-R̂ and ESS of the samples' test log-likelihood.
    pub test_log_likelihood: Option<Convergence>,
    /// Split-R̂ and ESS of the kinetic energy.
    pub kinetic_energy: Option<Convergence>,
}

/// What `run.json` records of a run of `cfg` on `ds`.
pub fn manifest(cfg: &TrainConfig, ds: &Dataset, num_params: usize) -> RunManifest {
    RunManifest {
        bnn_version: env!("CARGO_PKG_VERSION").to_string(),
        dataset: ds.name.clone(),
        data_source: ds.source.clone(),
        valid: ds.valid.as_ref().map_or(0, |v| v.len()),
        train_examples: ds.train.len(),
        input_dim: ds.train.dim(),
        num_classes: ds.task.outputs(),
        task: ds.task,
        table: ds.table.clone(),
        num_params,
        settings: cfg.settings.clone(),
        standardization: ds.train.standardization.as_deref().cloned(),
        command_line: cfg.command_line.clone(),
    }
}

/// Trains on `ds` and returns the summary (also written to `summary.json`). With
/// `cfg.resume` it continues the run in `cfg.run_dir` from its saved state, bit for bit.
/// With `cfg.settings.chains` = K > 1, K independent chains run side by side on the thread pool
/// (one chain per pool thread), each in `RUN/chain-<k>/` with its own seed
/// ([`crate::rng::chain_seed`]); the ensemble pools every chain's samples.
pub fn train(cfg: &TrainConfig, ds: &Dataset) -> Result<Summary> {
    train_on(cfg, ds, &Ranks::single())?
        .ok_or_else(|| Error::Config("one process is rank 0 and has the summary".into()))
}

/// [`train`] on the ranks of an MPI job: chain k on rank k mod R (`spread`); rank 0
/// writes the run's files besides the chains' and returns the summary, the other ranks
/// `None`. With one rank, [`train`].
pub fn train_on(cfg: &TrainConfig, ds: &Dataset, ranks: &Ranks) -> Result<Option<Summary>> {
    cfg.settings.validate(ds.train.len())?;
    // How the chains run, decided once: run.json records `stacked` or `apart`.
    let mut resolved = cfg.clone();
    if cfg.settings.backward == Backward::Auto && cfg.device.is_cuda() {
        // On CUDA an MLP runs through the step plan where it can; otherwise candle.
        resolved.settings.backward = planned::auto_on_cuda(cfg, ds)?;
    }
    let plan = resolved.settings.backward == Backward::Plan;
    // The step plan steps its chains together, one or several: the stacked layout's files.
    resolved.settings.chain_layout = match plan {
        true => ChainLayout::Stacked,
        false => (cfg.settings.chain_layout).resolve(&cfg.settings, cfg.device.is_cpu())?,
    };
    let cfg = &resolved;
    if cfg.settings.chain_layout == ChainLayout::Stacked && ranks.size() > 1 {
        return Err(Error::Config(
            "--chain-layout stacked runs its chains in one process: start one rank, or use \
             --chain-layout apart across MPI ranks"
                .into(),
        ));
    }
    cfg.settings.augment.for_dataset(&ds.name)?;
    task::check(ds, &cfg.settings.likelihood)?;
    // The T₀ chain's events cross ranks as class probabilities only (replicas::cold).
    if ds.task.is_regression() && ranks.size() > 1 {
        return Err(Error::Config(
            "a regression runs its chains and replicas in one process (no MPI ranks)".into(),
        ));
    }
    // What the ranks share out: chains, or the replicas of a replica exchange.
    let (items, what, flag) = match &cfg.settings.replicas {
        Some(r) if cfg.settings.sampler.kind.is_replica_exchange() => {
            (r.replicas, "replica(s)", "--replicas")
        }
        _ => (cfg.settings.chains, "chain(s)", "--chains"),
    };
    if ranks.size() > items {
        return Err(Error::Config(format!(
            "{} MPI ranks for {items} {what}: each rank needs one; start at most {items} \
             ranks or ask for {flag} {} or more",
            ranks.size(),
            ranks.size()
        )));
    }
    let run_dir = &cfg.run_dir;
    let net = Network::new(
        &cfg.settings.model,
        ds.train.dim(),
        ds.task.outputs(),
        cfg.settings.seed,
        &Device::Cpu,
    )?;
    let num_params = net.num_params();
    // Before the disk is checked or anything allocated for the chains.
    if plan {
        cfg.settings.backward.resolve(&cfg.device)?;
        planned::check(cfg, ds, &net)?;
    } else if cfg.settings.chain_layout == ChainLayout::Stacked {
        stacked::check_memory(cfg, ds, &net)?;
    }
    drop(net);
    // Rank 0 alone clears, checks the disk and writes run.json; the others start after it.
    if ranks.is_root() {
        if !cfg.resume {
            clear_run(run_dir)?;
        }
        let existing = match cfg.resume {
            true => existing_samples(run_dir),
            false => 0,
        };
        disk::check(&disk::need(cfg, ds, num_params, existing), run_dir)?;
    }
    ranks.barrier();
    train_checked(cfg, ds, num_params, ranks).map_err(|e| disk::explain(e.explained(), run_dir))
}

/// Sample files already in `run_dir` (any layout).
fn existing_samples(run_dir: &std::path::Path) -> u64 {
    let mut dirs = checkpoint::chain_dirs(run_dir);
    dirs.push(run_dir.to_path_buf());
    dirs.iter()
        .map(|d| checkpoint::list_samples(d).map_or(0, |s| s.len() as u64))
        .sum()
}

fn train_checked(
    cfg: &TrainConfig,
    ds: &Dataset,
    num_params: usize,
    ranks: &Ranks,
) -> Result<Option<Summary>> {
    let run_dir = &cfg.run_dir;
    if cfg.settings.sampler.kind.is_replica_exchange() {
        let Some((cold, report)) = replicas::run_replicas(cfg, ds, ranks)? else {
            return Ok(None);
        };
        return finish(cfg, ds, vec![cold], Some(report)).map(Some);
    }
    if cfg.settings.backward == Backward::Plan {
        let chains = planned::run_planned(cfg, ds)?;
        return finish(cfg, ds, chains, None).map(Some);
    }
    if cfg.settings.chains <= 1 {
        let chain = match cfg.settings.sampler.method()? {
            Method::Hmc { .. } => hmc::run_hmc_chain(cfg, ds, run_dir, true, (0, 1))?,
            Method::Chain(_) | Method::ReplicaExchange { .. } => {
                run_chain(cfg, ds, run_dir, true, cfg.settings.seed)?
            }
        };
        return finish(cfg, ds, vec![chain], None).map(Some);
    }
    if cfg.settings.chain_layout == ChainLayout::Stacked {
        let chains = stacked::run_stacked(cfg, ds)?;
        return finish(cfg, ds, chains, None).map(Some);
    }
    if ranks.is_root() {
        std::fs::create_dir_all(run_dir).map_err(|e| Error::io(run_dir, e))?;
        // run.json first: a chain stopped before its first state starts afresh on resume.
        manifest(cfg, ds, num_params).write(run_dir)?;
    }
    ranks.barrier();
    let mine = run_chains(cfg, ds, &ranks.dealt(cfg.settings.chains))?;
    let Some(chains) = spread::gather(ranks, ds, mine)? else {
        return Ok(None);
    };
    if chains.len() != cfg.settings.chains {
        return Err(Error::Config(format!(
            "{} of {} chains reported",
            chains.len(),
            cfg.settings.chains
        )));
    }
    finish(cfg, ds, chains, None).map(Some)
}

/// The chains `ks` of a run of several, side by side on the pool; their outcomes with k.
fn run_chains(cfg: &TrainConfig, ds: &Dataset, ks: &[usize]) -> Result<Vec<(usize, ChainOutcome)>> {
    let run_dir = &cfg.run_dir;
    let results: Vec<std::sync::Mutex<Option<Result<ChainOutcome>>>> =
        ks.iter().map(|_| std::sync::Mutex::new(None)).collect();
    crate::pool::run(ks.len(), &|i| {
        let k = ks[i];
        let mut chain_cfg = cfg.clone();
        chain_cfg.settings.seed = crate::rng::chain_seed(cfg.settings.seed, k);
        chain_cfg.progress = false;
        let _span = tracing::info_span!("chain", k).entered();
        let dir = checkpoint::chain_dir(run_dir, k);
        let out = match cfg.settings.sampler.method() {
            Err(e) => Err(e),
            Ok(Method::Hmc { .. }) => {
                hmc::run_hmc_chain(&chain_cfg, ds, &dir, false, (k, cfg.settings.chains))
            }
            Ok(Method::Chain(_) | Method::ReplicaExchange { .. }) => {
                run_chain(&chain_cfg, ds, &dir, false, cfg.settings.seed)
            }
        };
        if let Ok(mut slot) = results[i].lock() {
            *slot = Some(out);
        }
    });
    let mut chains = Vec::with_capacity(ks.len());
    let mut first_error = None;
    for (&k, slot) in ks.iter().zip(results) {
        match slot.into_inner().ok().flatten() {
            Some(Ok(c)) => chains.push((k, c)),
            Some(Err(e)) => {
                // A stop by signal is reported only if no chain failed otherwise.
                let replace = match (&first_error, &e) {
                    (None, _) => true,
                    (Some(Error::Interrupted { .. }), e) => !matches!(e, Error::Interrupted { .. }),
                    _ => false,
                };
                if replace {
                    first_error = Some(match e {
                        Error::Interrupted { signal, step, .. } => Error::Interrupted {
                            signal,
                            step,
                            run_dir: run_dir.clone(),
                        },
                        e => Error::Checkpoint(format!(
                            "chain {k}: {}",
                            disk::explain(e.explained(), run_dir)
                        )),
                    });
                }
            }
            None => return Err(Error::Config(format!("chain {k} did not report"))),
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(chains),
    }
}

/// A new run under an existing name: nothing of an earlier run of any layout (one chain,
/// several, replicas) stays to be mistaken for part of this one. run.json goes first, so
/// that a kill in between leaves no folder that looks resumable.
fn clear_run(run_dir: &std::path::Path) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(run_dir) else {
        return Ok(());
    };
    let manifest = run_dir.join(crate::checkpoint::files::RUN);
    if manifest.exists() {
        std::fs::remove_file(&manifest).map_err(|e| Error::io(&manifest, e))?;
    }
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        let ours_file = [
            crate::checkpoint::files::SUMMARY,
            crate::checkpoint::files::METRICS,
            "replicas.json",
            crate::checkpoint::files::DIAGNOSTICS,
            "stacked.json",
        ]
        .contains(&name.as_str());
        // `eval/` and `plots/` describe the earlier run's samples.
        let ours_dir = ["samples", "state", "replicas", "stacked", "eval", "plots"]
            .contains(&name.as_str())
            || name.starts_with("chain-")
            || name.starts_with("replica-");
        if ours_file {
            std::fs::remove_file(&path).map_err(|e| Error::io(&path, e))?;
        } else if ours_dir && path.is_dir() {
            std::fs::remove_dir_all(&path).map_err(|e| Error::io(&path, e))?;
        }
    }
    Ok(())
}

/// Chain `k`'s own figures, for the summary of a run of several.
fn chain_summary((k, c): (usize, &ChainOutcome)) -> ChainSummary {
    ChainSummary {
        chain: k,
        seed: c.seed,
        samples: c.test.samples(),
        ensemble: c.test.classes().and_then(|a| a.metrics()),
        regression: c.test.gaussian().and_then(|r| r.metrics()),
        last_sample: c.test.classes().and_then(|a| a.last_sample),
        valid_ensemble: c.valid.as_ref().and_then(|a| a.metrics()),
        steps_per_second: c.steps as f64 / c.step_seconds.max(1e-9),
    }
}

/// Split-R̂ and ESS of the chains' per-sample test log-likelihood and kinetic energy,
/// logged.
fn chain_diagnostics(chains: &[ChainOutcome]) -> ChainDiagnostics {
    // The test log-likelihood of each sample alone, and the kinetic energy at it.
    let loglik: Vec<Vec<f64>> = chains
        .iter()
        .map(|c| c.test.sample_nll().iter().map(|n| -n).collect())
        .collect();
    let kinetic: Vec<Vec<f64>> = chains.iter().map(|c| c.kinetic_trace.clone()).collect();
    let d = ChainDiagnostics {
        test_log_likelihood: convergence::diagnose(&loglik),
        kinetic_energy: convergence::diagnose(&kinetic),
    };
    let show = |c: &Option<Convergence>| {
        c.as_ref().map_or("n/a (too few samples)".to_string(), |c| {
            let means: Vec<String> = c.chain_means.iter().map(|m| format!("{m:.4}")).collect();
            format!(
                "R-hat {:.3}, ESS {:.0}, chain means {}",
                c.rhat,
                c.ess,
                means.join(", ")
            )
        })
    };
    tracing::info!(
        "{} chains: test log-likelihood per sample: {}; kinetic energy: {}",
        chains.len(),
        show(&d.test_log_likelihood),
        show(&d.kinetic_energy)
    );
    d
}

/// The run's summary from its chains (pooled when there are several; then also each
/// chain's figures and the convergence diagnostics), written to `summary.json`.
fn finish(
    cfg: &TrainConfig,
    ds: &Dataset,
    chains: Vec<ChainOutcome>,
    replica_exchange: Option<ReplicaReport>,
) -> Result<Summary> {
    let run_dir = &cfg.run_dir;
    let num_params = chains.first().map_or(0, |c| c.num_params);
    let test = Ensemble::pooled(chains.iter().map(|c| &c.test))?;
    let (classes, regression) = (test.classes(), test.gaussian());
    let valid = match chains.first().and_then(|c| c.valid.as_ref()) {
        Some(_) => Some(Accumulator::pooled(
            chains.iter().filter_map(|c| c.valid.as_ref()),
        )?),
        None => None,
    };
    let several = chains.len() > 1;
    let per_chain: Vec<ChainSummary> = match several {
        true => chains.iter().enumerate().map(chain_summary).collect(),
        false => Vec::new(),
    };
    let convergence = several.then(|| chain_diagnostics(&chains));
    let steps: u64 = chains.iter().map(|c| c.steps).sum();
    let summary = Summary {
        dataset: ds.name.clone(),
        data_source: ds.source.clone(),
        standardized_inputs: ds.train.standardization.is_some(),
        settings: cfg.settings.clone(),
        model_label: cfg.settings.model.label(),
        num_params,
        isa: crate::kernels::isa::current().name().to_string(),
        backward_used: chains.first().map_or(cfg.settings.backward, |c| c.backward),
        executor: chains.first().and_then(|c| c.executor.clone()),
        samples: test.samples(),
        ensemble: classes.and_then(|a| a.metrics()),
        uncertainty: classes.and_then(|a| a.uncertainty()),
        last_sample: classes.and_then(|a| a.last_sample),
        regression: regression.and_then(|r| r.metrics()),
        regression_last_sample: regression.and_then(|r| r.last_sample),
        valid_ensemble: valid.as_ref().and_then(|a| a.metrics()),
        progress: classes.map_or(Vec::new(), |a| a.progress()),
        steps,
        rollbacks: chains.iter().map(|c| c.rollbacks).sum(),
        train_seconds: chains.iter().map(|c| c.train_seconds).fold(0.0, f64::max),
        // Summed over chains: the aggregate throughput.
        steps_per_second: chains
            .iter()
            .map(|c| c.steps as f64 / c.step_seconds.max(1e-9))
            .sum(),
        chains: per_chain,
        convergence,
        replica_exchange,
        run_dir: run_dir.display().to_string(),
    };
    let json = serde_json::to_string_pretty(&summary)
        .map_err(|e| Error::Checkpoint(format!("serialising summary: {e}")))?;
    crate::atomic::write_atomic(
        &run_dir.join(crate::checkpoint::files::SUMMARY),
        json.as_bytes(),
    )?;
    Ok(summary)
}
