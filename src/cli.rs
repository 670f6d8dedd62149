//! Command-line definitions (clap). Nothing here does work: `commands` runs them.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use bnn::data::tabular::TaskKind;
use bnn::model::Activation;
use bnn::potential::Backward;
use bnn::sampler::ladder::PairSchedule;
use bnn::sampler::replica::{ReplicaOptions, ReplicaThermostat};
use bnn::sampler::{Integrator, Kernel, SamplerKind};
use bnn::settings::{HmcOptions, Settings, SettingsLayer};

use bnn::synthetic::PotentialKind;

/// The command line: [`Cli`] with the help of each flag of `bnn train` (and of the replica
/// flags of `bnn sample`) that has no value of its own ending in the default it takes,
/// read from the library's one definition of it ([`Settings`]' `Default`,
/// [`ReplicaOptions`]' and [`HmcOptions`]'), keyed by the flag's id (its field name).
pub fn command() -> clap::Command {
    use serde_json::{json, to_value, Value};
    let object = |v: Value| match v {
        Value::Object(m) => m,
        _ => serde_json::Map::new(),
    };
    let mut replicas = object(to_value(ReplicaOptions::default()).unwrap_or_default());
    if let Some(t) = replicas.remove("thermostat") {
        replicas.insert("replica_thermostat".into(), t);
    }
    let mut train = object(to_value(SettingsLayer::of(&Settings::default())).unwrap_or_default());
    // The sampler's own settings take the sampler's defaults (`SamplerKind::defaults`),
    // and augmenting is off unless asked for: no single default to show.
    let per_sampler = [
        "step_size",
        "friction",
        "diffusion",
        "noise_estimate",
        "integrator",
    ];
    for id in per_sampler.iter().chain(&["augment"]) {
        train.remove(*id);
    }
    train.extend(object(to_value(HmcOptions::default()).unwrap_or_default()));
    train.extend(replicas.clone());
    train.extend(object(json!({
        "prior_std": bnn::potential::PriorSpec::DEFAULT_STD,
        "gamma_shape": bnn::potential::PriorSpec::DEFAULT_SHAPE,
        "gamma_rate": bnn::potential::PriorSpec::DEFAULT_RATE,
        "rms_decay": bnn::sampler::params::PSGLD_DECAY,
        "rms_damping": bnn::sampler::params::PSGLD_DAMPING,
    })));
    <Cli as clap::CommandFactory>::command()
        .mut_subcommand("train", |c| with_defaults(c, &train))
        .mut_subcommand("sample", |c| with_defaults(c, &replicas))
}

/// `cmd` with `[default: …]` after the help of each argument `defaults` has a value for
/// (a switch's `false` and an absent value are not shown).
fn with_defaults(
    mut cmd: clap::Command,
    defaults: &serde_json::Map<String, serde_json::Value>,
) -> clap::Command {
    use serde_json::Value;
    let shown = |v: &Value| match v {
        Value::Null | Value::Bool(false) | Value::Object(_) => None,
        Value::String(s) => Some(s.clone()),
        Value::Array(a) => Some(
            a.iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(","),
        ),
        other => Some(other.to_string()),
    };
    let ids: Vec<String> = cmd
        .get_arguments()
        .map(|a| a.get_id().to_string())
        .collect();
    for id in ids {
        let Some(value) = defaults.get(&id).and_then(shown) else {
            continue;
        };
        cmd = cmd.mut_arg(id, |a| {
            let help = a.get_help().map(ToString::to_string).unwrap_or_default();
            let long = a.get_long_help().map(ToString::to_string);
            let a = a.help(format!("{help} [default: {value}]"));
            match long {
                Some(l) => a.long_help(format!("{l}\n\n[default: {value}]")),
                None => a,
            }
        });
    }
    cmd
}

#[derive(Debug, Parser)]
#[command(
    name = "bnn",
    version,
    about = "Bayesian neural networks trained by stochastic-gradient MCMC",
    long_about = "Trains Bayesian neural networks by stochastic-gradient MCMC (SGLD, SGHMC, SGNHT), \
keeps posterior samples as safetensors checkpoints and evaluates the Bayesian model average.",
    // A flag given twice takes its last value.
    args_override_self = true
)]
pub struct Cli {
    /// More logging (-v: debug, -vv: trace).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Only errors and the final JSON.
    #[arg(short, long, global = true)]
    pub quiet: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Train a Bayesian neural network and keep posterior samples.
    Train(Box<TrainArgs>),
    /// Evaluate the Bayesian ensemble of a finished run's samples.
    Eval(EvalArgs),
    /// Draw a run's pictures (PNG and SVG) into RUN/plots: learning curves, ensemble size,
    /// reliability, sampler dynamics, chains, replicas, and what `bnn eval` wrote
    /// (rotation, out-of-distribution entropy).
    Plot(PlotArgs),
    /// Show what a run folder or a sample file holds: architecture, sampler,
    /// hyper-parameters, samples, tensors, sizes on disk, metrics (a table, or --json).
    Inspect(InspectArgs),
    /// Classify images with a run's ensemble: PNG/JPEG files (any size, grey or colour) or
    /// an image of an IDX file; class probabilities, entropy and mutual information.
    Predict(PredictArgs),
    /// Compare a run's predictive distribution with a reference run's on the same test set:
    /// top-1 agreement and total variation (classification), or the mean 2-Wasserstein
    /// distance between the predictive mixtures (regression); JSON last, a table on stderr.
    Compare(CompareArgs),
    /// Download or verify datasets.
    #[command(subcommand)]
    Data(DataCommand),
    /// Run a sampler on a synthetic potential with known answer and injected gradient noise.
    Sample(SampleArgs),
    /// Micro-benchmarks (JSON on stdout).
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Debug, Args)]
pub struct SampleArgs {
    /// Target distribution.
    #[arg(long, value_enum)]
    pub potential: PotentialKind,
    #[arg(long, value_enum, default_value_t = SamplerKind::Sgnht)]
    pub sampler: SamplerKind,
    /// Default: splitting for sgnht and msgnht, euler otherwise.
    #[arg(long, value_enum)]
    pub integrator: Option<Integrator>,
    /// Physical step size h (η = h²).
    #[arg(long, default_value_t = 0.01)]
    pub h: f64,
    // The papers' continuous-time parameters, named apart from `bnn train`'s per-step
    // --friction α, --diffusion a and --noise-estimate β̂ (α = C·h, a = A·h, β̂ = B̂·h).
    /// Friction C of sghmc in continuous time (`bnn train --friction` is α = C·h).
    #[arg(long = "friction-c", default_value_t = 1.0)]
    pub friction: f64,
    /// Diffusion A of sgnht/msgnht in continuous time (`bnn train --diffusion` is a =
    /// A·h); 0: all noise from the gradient.
    #[arg(long = "diffusion-a", default_value_t = 0.0)]
    pub diffusion: f64,
    /// Gradient-noise level B: ∇Ũ = ∇U + N(0, 2B/h), unknown to the sampler.
    #[arg(long, default_value_t = 1.0)]
    pub noise: f64,
    /// SGHMC's estimate B̂ of the noise in continuous time (`bnn train --noise-estimate`
    /// is β̂ = B̂·h); B̂ = C injects no noise.
    #[arg(long = "noise-estimate-b", default_value_t = 0.0)]
    pub noise_estimate: f64,
    #[arg(long, default_value_t = 1_000_000)]
    pub steps: usize,
    #[arg(long, default_value_t = 10_000)]
    pub burnin: usize,
    /// Independent chains simulated side by side.
    #[arg(long, default_value_t = 1)]
    pub chains: usize,
    /// Histogram bins per dimension for the KL divergence.
    #[arg(long, default_value_t = 100)]
    pub bins: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Write the kept samples as CSV (one row per step and chain).
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Draw each coordinate's histogram against the true density into DIR/sample.png and
    /// DIR/sample.svg.
    #[arg(long, value_name = "DIR")]
    pub plot: Option<PathBuf>,
    /// Noise N(0, V) on U and on each coordinate of ∇U, unknown to the sampler (replaces
    /// --noise; Luo et al. §4.1 use 0.25).
    #[arg(long)]
    pub noise_variance: Option<f64>,
    #[command(flatten)]
    pub replicas: ReplicaArgs,
}

/// The replica-exchange flags of `bnn sample` and `bnn train` (renhd and reld only); an
/// absent flag takes [`ReplicaOptions`]' default.
#[derive(Debug, Clone, Args)]
pub struct ReplicaArgs {
    /// renhd/reld: rungs of the temperature ladder, T₀ = 1 included.
    #[arg(long)]
    pub replicas: Option<usize>,
    /// renhd/reld: τ of the ladder T_j = τ^j, or `auto` to adapt it during burn-in.
    #[arg(long, value_parser = ladder)]
    pub ladder: Option<Ladder>,
    /// renhd/reld with --ladder auto: the swap rate per pair to aim at.
    #[arg(long)]
    pub target_swap_rate: Option<f64>,
    /// renhd/reld: updates between exchange rounds (N of Algorithm 2).
    #[arg(long)]
    pub exchange_every: Option<usize>,
    /// renhd/reld: deo (even/odd alternation) or random (one adjacent pair per round).
    #[arg(long, value_enum)]
    pub pairs: Option<PairSchedule>,
    /// renhd: one scalar thermostat per replica (the paper's) or one per parameter.
    #[arg(long, value_enum)]
    pub replica_thermostat: Option<ReplicaThermostat>,
}

impl ReplicaArgs {
    /// The options these flags give, each absent one at its default.
    pub fn options(&self) -> ReplicaOptions {
        let d = ReplicaOptions::default();
        ReplicaOptions {
            replicas: self.replicas.unwrap_or(d.replicas),
            ladder: self.ladder.map_or(d.ladder, |l| l.0),
            target_swap_rate: self.target_swap_rate.unwrap_or(d.target_swap_rate),
            exchange_every: self.exchange_every.unwrap_or(d.exchange_every),
            pairs: self.pairs.unwrap_or(d.pairs),
            thermostat: self.replica_thermostat.unwrap_or(d.thermostat),
        }
    }
}

/// `--ladder`'s value: τ of a fixed geometric ladder, or `None` for `auto`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ladder(pub Option<f64>);

/// Parses `--ladder`: `auto` or τ > 1.
fn ladder(text: &str) -> Result<Ladder, String> {
    if text == "auto" {
        return Ok(Ladder(None));
    }
    match text.parse::<f64>() {
        Ok(tau) if tau > 1.0 && tau.is_finite() => Ok(Ladder(Some(tau))),
        _ => Err(format!(
            "--ladder must be `auto` or a number above 1, got `{text}`"
        )),
    }
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Time one sampler update, fused versus composed, against a copy of the same bytes.
    Step {
        /// Sampler to time (sgld, sghmc or sgnht).
        #[arg(long, value_enum, default_value_t = SamplerKind::Sghmc)]
        sampler: SamplerKind,
        /// Parameter counts.
        #[arg(long, value_delimiter = ',', default_values_t = [100_000usize, 1_000_000, 10_000_000])]
        sizes: Vec<usize>,
        /// Timed repetitions per measurement (the median is reported).
        #[arg(long, default_value_t = 15)]
        repeats: usize,
    },
    /// GFLOP/s of every matrix product and direct convolution of the MLP, LeNet and
    /// ResNet steps against the measured FMA peak (and the `gemm` crate, what candle's CPU
    /// matmul uses).
    Gemm {
        /// Timed repetitions per product (the median is reported).
        #[arg(long, default_value_t = 51)]
        repeats: usize,
        /// Models whose steps to take apart, comma-separated: mlp-100, mlp-400-400 (batch
        /// 100 and 1000), lenet (64), resnet8, resnet20 (128). Default: all.
        #[arg(long, value_delimiter = ',')]
        models: Vec<String>,
    },
    /// The step plan of an MLP's update (the GPU step): launches, the bytes each moves and
    /// the host reads, for each number of chains. JSON, one object per K.
    Plan {
        /// Hidden widths, comma-separated.
        #[arg(long, value_delimiter = ',', default_values_t = [100usize])]
        hidden: Vec<usize>,
        /// Minibatch size.
        #[arg(long, default_value_t = 100)]
        batch: usize,
        /// Chains stepped together.
        #[arg(long, value_delimiter = ',', default_values_t = [1usize, 64])]
        chains: Vec<usize>,
        /// Sampler.
        #[arg(long, value_enum, default_value_t = SamplerKind::Sgnht)]
        sampler: SamplerKind,
    },
    /// Steps per second of the full training step (gather, forward, backward, update).
    Train {
        /// Hidden widths of each MLP, `;`-separated (e.g. "100;400,400"); "" for none.
        #[arg(long, default_value = "100;400,400")]
        hidden: String,
        /// Minibatch sizes.
        #[arg(long, value_delimiter = ',', default_values_t = [100usize, 1000])]
        batch: Vec<usize>,
        /// Minibatch sizes of the LeNet-style CNN (models/lenet.toml); "" for none.
        #[arg(long, default_value = "64")]
        cnn_batch: String,
        /// Architecture presets (TOML) to time at each --batch, besides the MLPs of
        /// --hidden and the CNN (e.g. `--hidden "" --cnn-batch "" --batch 128 --config
        /// models/resnet8.toml`).
        #[arg(long)]
        config: Vec<PathBuf>,
        /// Samplers.
        #[arg(long, value_enum, value_delimiter = ',', default_values = ["sghmc", "sgnht"])]
        sampler: Vec<SamplerKind>,
        /// Integrator (Euler: the updates of bench/pytorch_reference.py).
        #[arg(long, value_enum, default_value_t = Integrator::Euler)]
        integrator: Integrator,
        #[arg(long, value_enum, default_value_t = Backward::Auto)]
        backward: Backward,
        #[arg(long, value_enum, default_value_t = Kernel::Fused)]
        kernel: Kernel,
        /// Timed repeats (the median is reported), after one warm-up repeat.
        #[arg(long, default_value_t = 7)]
        repeats: usize,
        /// Updates per repeat at batch 100 (scaled by 100/batch).
        #[arg(long, default_value_t = 200)]
        steps: usize,
        /// Chains stepped side by side, as `bnn train --chains` (rates summed over them).
        #[arg(long, default_value_t = 1)]
        chains: usize,
    },
}

/// Where a command computes: the CPU unless `--device` says otherwise (the default of
/// every command's `--device`, defined here once).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum DeviceKind {
    /// The CPU, with the hand-written kernels.
    #[default]
    Cpu,
    /// The first CUDA GPU (needs a build with `--features cuda`).
    Cuda,
    /// The first Metal GPU (needs a build with `--features metal`).
    Metal,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PriorKind {
    /// Gamma hyper-prior on each tensor's precision, resampled by Gibbs every epoch.
    Gamma,
    /// N(0, σ²) on every parameter, σ = --prior-std.
    Gaussian,
}

#[derive(Debug, Clone, Args)]
pub struct DataArgs {
    /// Dataset: mnist, fashion-mnist or mnist-mini (the built-in subset).
    #[arg(long, default_value = "mnist")]
    pub dataset: String,
    /// Folder holding the dataset's four IDX files (else $BNN_DATA_DIR/<dataset>,
    /// ./data/<dataset>, and system folders are searched).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
}

/// A table of your own (or a built-in toy) in place of an image data set.
#[derive(Debug, Clone, Args)]
pub struct TableArgs {
    /// Train on a CSV table (a header row, numeric cells; gzipped or plain) instead of
    /// --dataset; its features and a regression's target are standardised with the
    /// training rows' statistics (recorded in run.json, undone at prediction).
    #[arg(long, conflicts_with = "toy", requires = "target")]
    pub csv: Option<PathBuf>,
    /// The column of --csv to predict.
    #[arg(long, requires = "csv")]
    pub target: Option<String>,
    /// What the target is (auto: classes when every target is an integer 0 … 99, else a
    /// regression).
    #[arg(long, value_enum, default_value = "auto")]
    pub task: TaskKind,
    /// The test rows from this CSV file (same columns) instead of a split of --csv.
    #[arg(long, requires = "csv", conflicts_with = "test_fraction")]
    pub test_csv: Option<PathBuf>,
    /// The fraction of --csv's rows held out as the test set (a seeded split, recorded in
    /// run.json).
    #[arg(long, default_value_t = 0.2)]
    pub test_fraction: f64,
    /// The seed of that split (default: --seed).
    #[arg(long)]
    pub split_seed: Option<u64>,
    /// A built-in toy instead of --dataset or --csv: regression-1d, y = sin(3x) + N(0, 0.1²)
    /// on x ∈ [−1, −0.3] ∪ [0.3, 1] (seeded with --split-seed or --seed).
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(bnn::data::toy::TOYS))]
    pub toy: Option<String>,
    /// A regression's noise σ, fixed, in the target's units (default: sampled, with a
    /// Gamma(1, 1) prior on the precision 1/σ² of the standardised target, Gibbs-updated
    /// each epoch).
    #[arg(long)]
    pub noise_std: Option<f64>,
}

#[derive(Debug, Clone, Args)]
pub struct TrainArgs {
    #[command(flatten)]
    pub data: DataArgs,
    #[command(flatten)]
    pub table: TableArgs,
    /// Never download; fail (or use the built-in subset for mnist) when data is missing.
    #[arg(long)]
    pub offline: bool,
    /// Base URL to download the dataset from instead of the canonical mirrors.
    #[arg(long)]
    pub mirror: Option<String>,
    /// Hold out the last N training images as a validation set (the papers use 10000).
    #[arg(long, default_value_t = 0)]
    pub valid: usize,
    /// Train on the first N training images (after --valid's hold-out) or table rows
    /// (in file order, after the split; standardised by their own statistics) only, e.g.
    /// a subset small enough for a full-batch HMC reference; the test set is unchanged.
    #[arg(long, value_name = "N")]
    pub train_limit: Option<usize>,

    /// Architecture preset (TOML), e.g. models/mlp-400-400.toml; its `[train]` table,
    /// if any, sets the defaults of the training flags (flags given here win; with
    /// another --sampler, its sampler settings are not used).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Hidden layer widths, e.g. 100 or 400,400 (overrides the preset); "" for none (a
    /// linear model: linear or logistic regression).
    #[arg(long, value_parser = widths)]
    pub hidden: Option<Widths>,
    /// Activation (overrides the preset).
    #[arg(long, value_enum)]
    pub activation: Option<Activation>,

    /// Prior on the weights (default: gamma; gaussian when only --prior-std is given).
    #[arg(long, value_enum)]
    pub prior: Option<PriorKind>,
    /// σ of the Gaussian prior N(0, σ²).
    #[arg(long)]
    pub prior_std: Option<f64>,
    /// Shape of the Gamma hyper-prior on precisions (--prior gamma).
    #[arg(long)]
    pub gamma_shape: Option<f64>,
    /// Rate of the Gamma hyper-prior on precisions (--prior gamma).
    #[arg(long)]
    pub gamma_rate: Option<f64>,
    // The run's settings: the settings layer's own flags (sampler, schedule, chains…),
    // each absent unless typed, so that a preset's value shows through.
    #[command(flatten)]
    pub settings: SettingsLayer,
    /// Folder that holds runs.
    #[arg(long, default_value = "checkpoints")]
    pub out: PathBuf,
    /// Name of this run's folder (default: <dataset>-<model>-<sampler>-seed<seed>).
    #[arg(long)]
    pub run_name: Option<String>,
    /// No progress bar.
    #[arg(long)]
    pub no_progress: bool,
    /// Continue the run in this folder from its last saved state, with its recorded
    /// settings; only --epochs, --checkpoint-every, --log-every, --on-divergence,
    /// --data-dir, --offline, --device and --no-progress may be given with it.
    #[arg(long, value_name = "RUN_DIR")]
    pub resume: Option<PathBuf>,
    #[command(flatten)]
    pub replicas: ReplicaArgs,
    /// Device for parameters, minibatches and sampler state.
    #[arg(long, value_enum, default_value_t)]
    pub device: DeviceKind,
}

#[derive(Debug, Args)]
pub struct CompareArgs {
    /// The run to compare.
    pub run: PathBuf,
    /// The reference run (e.g. a long HMC run) on the same data, split and standardisation.
    #[arg(long)]
    pub reference: PathBuf,
    /// Read image data from this folder instead of the one recorded in run.json.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Never download.
    #[arg(long)]
    pub offline: bool,
}

#[derive(Debug, Args)]
pub struct EvalArgs {
    /// The run folder, e.g. checkpoints/mnist-mlp-100-relu-sghmc-seed0.
    #[arg(long)]
    pub run: PathBuf,
    /// Read the data from this folder instead of the one recorded in run.json.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Never download.
    #[arg(long)]
    pub offline: bool,
    /// Device to evaluate on.
    #[arg(long, value_enum, default_value_t)]
    pub device: DeviceKind,
    /// Also score telling this dataset's test images (out of distribution) from the run's
    /// by predictive entropy, max probability and mutual information: AUROC and AUPR, for
    /// the ensemble and the last sample alone (e.g. fashion-mnist for an MNIST run).
    #[arg(long, value_name = "NAME")]
    pub ood_dataset: Option<String>,
    /// Folder of the out-of-distribution dataset (otherwise found as for training).
    #[arg(long, value_name = "DIR", requires = "ood_dataset")]
    pub ood_data_dir: Option<PathBuf>,
    /// Also evaluate under distribution shift: `rotate` turns the test images by 0°–180°
    /// in 15° steps (accuracy, NLL, ECE per angle, ensemble and last sample).
    #[arg(long, value_enum)]
    pub shift: Option<ShiftKind>,
}

#[derive(Debug, Args)]
pub struct PlotArgs {
    /// The run folder.
    #[arg(long)]
    pub run: PathBuf,
    /// Write the pictures here instead of RUN/plots.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["run", "file"])))]
pub struct InspectArgs {
    /// A run folder.
    #[arg(long)]
    pub run: Option<PathBuf>,
    /// One sample file (RUN/samples/sample-*.safetensors).
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct PredictArgs {
    /// The run folder whose samples predict.
    #[arg(long)]
    pub run: PathBuf,
    /// PNG or JPEG files.
    #[arg(value_name = "IMAGE")]
    pub images: Vec<PathBuf>,
    /// An IDX images file (e.g. t10k-images-idx3-ubyte.gz) to take an image from.
    #[arg(long, value_name = "FILE", requires = "index")]
    pub idx: Option<PathBuf>,
    /// Which image of --idx (from 0).
    #[arg(long, value_name = "I", requires = "idx")]
    pub index: Option<usize>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Device to predict on.
    #[arg(long, value_enum, default_value_t)]
    pub device: DeviceKind,
}

/// A distribution shift of `bnn eval --shift`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ShiftKind {
    /// Rotate the test images about their centre, bilinear.
    Rotate,
}

#[derive(Debug, Subcommand)]
pub enum DataCommand {
    /// Download a dataset's four IDX files and verify their content.
    Fetch {
        #[command(flatten)]
        data: DataArgs,
        /// Base URL to download from instead of the canonical mirrors.
        #[arg(long)]
        mirror: Option<String>,
    },
    /// Check a dataset folder's files against the canonical checksums.
    Verify {
        #[command(flatten)]
        data: DataArgs,
    },
}

/// The ids of the flags of `bnn train` (its field names) that the user typed, as opposed
/// to those that took their defaults: read from the one parse of the command line.
pub type GivenFlags = std::collections::BTreeSet<String>;

/// The flags typed after `bnn train` in `matches` (empty for another command).
pub fn given_train_flags(matches: &clap::ArgMatches) -> GivenFlags {
    let Some(train) = matches.subcommand_matches("train") else {
        return GivenFlags::new();
    };
    train
        .ids()
        .filter(|id| {
            train.value_source(id.as_str()) == Some(clap::parser::ValueSource::CommandLine)
        })
        .map(|id| id.to_string())
        .collect()
}

/// The hidden layers' widths of `--hidden` (one value: clap would take a `Vec` as many).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Widths(pub Vec<usize>);

/// `--hidden`'s value: comma-separated widths, or nothing at all (no hidden layer).
fn widths(text: &str) -> Result<Widths, String> {
    if text.trim().is_empty() {
        return Ok(Widths(Vec::new()));
    }
    text.split(',')
        // A zero width parses: the model's check refuses it in its own words.
        .map(|w| {
            w.trim()
                .parse::<usize>()
                .map_err(|_| format!("`{w}` is not a width (e.g. 100 or 400,400, or \"\")"))
        })
        .collect::<Result<_, _>>()
        .map(Widths)
}
