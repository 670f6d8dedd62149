//! What each CLI command does, in terms of the library.

use std::path::PathBuf;

use crate::cli::{
    BenchCommand, Command, DataCommand, DeviceKind, GivenFlags, PriorKind, ReplicaArgs, ShiftKind,
    TrainArgs,
};
use bnn::checkpoint::RunManifest;
use bnn::data::{self, registry, LoadOptions};
use bnn::error::{Error, Result};
use bnn::model::ModelSpec;
use bnn::potential::PriorSpec;
use bnn::ranks::Ranks;
use bnn::sampler::replica::ReplicaOptions;
use bnn::sampler::SamplerConfig;

use bnn::settings::Settings;
use bnn::train::{self, TrainConfig};

/// Runs a parsed command (`given`: the flags of `bnn train` the user typed); returns the
/// JSON document to print last on stdout.
pub fn run(command: Command, given: &GivenFlags, quiet: bool, ranks: &Ranks) -> Result<String> {
    // A bad BNN_ISA is a user error, reported before anything runs.
    bnn::kernels::isa::cap_from_env()?;
    tracing::debug!("CPU kernels: {}", bnn::kernels::isa::selected());
    if ranks.size() > 1 && !matches!(command, Command::Train(_)) {
        return Err(Error::Config(format!(
            "{} MPI ranks: only `bnn train` runs across ranks; run this command as one process",
            ranks.size()
        )));
    }
    match command {
        Command::Train(args) => train_command(*args, given, quiet, ranks),
        Command::Eval(args) => {
            let manifest = RunManifest::read(&args.run)?;
            let ds = bnn::eval::load_run_data(&manifest, args.data_dir, args.offline)?;
            let device = device_of(args.device)?;
            let extras = bnn::eval::Extras {
                ood: match &args.ood_dataset {
                    Some(name) => Some(bnn::eval::load_ood_data(
                        &manifest,
                        name,
                        args.ood_data_dir.clone(),
                        args.offline,
                    )?),
                    None => None,
                },
                rotations: match args.shift {
                    Some(ShiftKind::Rotate) => bnn::data::shift::rotation_angles(),
                    None => Vec::new(),
                },
            };
            let report = bnn::eval::evaluate_run(&args.run, &manifest, &ds, &device, &extras)?;
            for path in bnn::eval::write_report(&args.run, &report)? {
                tracing::info!("wrote {}", path.display());
            }
            json(&report)
        }
        Command::Plot(args) => {
            let report = bnn::plot::plot_run(&args.run, args.out.as_deref())?;
            for s in &report.skipped {
                tracing::info!("not drawn: {s}");
            }
            tracing::info!("{} files in {}", report.written.len(), report.out_dir);
            json(&report)
        }
        Command::Predict(args) => {
            let manifest = RunManifest::read(&args.run)?;
            let mut inputs = bnn::predict::read_pictures(&manifest, &args.images)?;
            if let (Some(file), Some(i)) = (&args.idx, args.index) {
                inputs.push(bnn::predict::read_idx_image(&manifest, file, i)?);
            }
            if inputs.is_empty() {
                return Err(Error::Config(
                    "bnn predict needs an IMAGE file or --idx FILE --index I".into(),
                ));
            }
            for input in &inputs {
                if !input.notes.is_empty() {
                    eprintln!("note: {}: {}", input.name, input.notes.join("; "));
                }
            }
            let device = device_of(args.device)?;
            let predictions = bnn::predict::predict(&args.run, &manifest, &inputs, &device)?;
            match args.json {
                true => json(&predictions),
                false => Ok(bnn::predict::table(&predictions).trim_end().to_string()),
            }
        }
        Command::Inspect(args) => match (&args.run, &args.file) {
            (Some(run), _) => {
                let info = bnn::inspect::inspect_run(run)?;
                match args.json {
                    true => json(&info),
                    false => Ok(bnn::inspect::run_table(&info).trim_end().to_string()),
                }
            }
            (None, Some(file)) => {
                let info = bnn::inspect::inspect_file(file)?;
                match args.json {
                    true => json(&info),
                    false => Ok(bnn::inspect::file_table(&info).trim_end().to_string()),
                }
            }
            (None, None) => Err(Error::Config(
                "bnn inspect needs --run RUN or --file SAMPLE".into(),
            )),
        },
        Command::Data(DataCommand::Fetch { data, mirror }) => {
            let spec = spec_of(&data.dataset)?;
            let dir = data::download_dir(&spec, data.data_dir.as_deref());
            let mirrors: Vec<String> = match mirror {
                Some(m) => vec![m],
                None => spec.mirrors.iter().map(|s| s.to_string()).collect(),
            };
            let downloaded = data::fetch::fetch(&spec, &mirrors, &dir)?;
            data::fetch::verify(&spec, &dir)?;
            json(&serde_json::json!({
                "dataset": spec.name, "dir": dir.display().to_string(),
                "downloaded": downloaded, "verified": true
            }))
        }
        Command::Sample(a) => {
            let opts = bnn::synthetic::SampleOptions {
                potential: a.potential,
                sampler: a.sampler,
                integrator: a.integrator.unwrap_or(a.sampler.default_integrator()),
                h: a.h,
                friction: a.friction,
                diffusion: a.diffusion,
                noise: a.noise,
                noise_estimate: a.noise_estimate,
                steps: a.steps,
                burnin: a.burnin,
                chains: a.chains,
                bins: a.bins,
                seed: a.seed,
                replicas: replica_options(&a.replicas)?,
                noise_variance: a.noise_variance,
            };
            let (report, samples) = bnn::synthetic::run(&opts)?;
            if let Some(path) = &a.csv {
                let dim = report.mean.len();
                let mut text = String::new();
                for row in samples.chunks_exact(dim) {
                    let cells: Vec<String> = row.iter().map(|v| v.to_string()).collect();
                    text.push_str(&cells.join(","));
                    text.push('\n');
                }
                bnn::atomic::write_atomic(path, text.as_bytes())?;
            }
            if let Some(dir) = &a.plot {
                for p in bnn::plot::plot_sample(&report, dir)? {
                    tracing::info!("wrote {}", p.display());
                }
            }
            json(&report)
        }
        Command::Bench(BenchCommand::Step {
            sampler,
            sizes,
            repeats,
        }) => {
            if !sampler.is_sampler() || sizes.contains(&0) || repeats == 0 {
                return Err(Error::Config(
                    "bench step needs sgld, sghmc or sgnht, positive sizes and repeats".into(),
                ));
            }
            json(&bnn::bench::step(sampler, &sizes, repeats)?)
        }
        Command::Bench(BenchCommand::Gemm { repeats }) => {
            let mut rows = Vec::new();
            // (m, n, k): forward (X·Wᵀ, W read in place), weight gradient and input error
            // of the MNIST MLPs.
            for batch in [100, 1000] {
                for (m, n, k, transposed, what) in [
                    (batch, 100, 784, true, "forward 784→100"),
                    (batch, 400, 784, true, "forward 784→400"),
                    (batch, 400, 400, true, "forward 400→400"),
                    (100, 784, batch, false, "weight grad 100×784"),
                    (400, 784, batch, false, "weight grad 400×784"),
                    (400, 400, batch, false, "weight grad 400×400"),
                    (batch, 400, 400, false, "input error 400×400"),
                ] {
                    let (ours, crate_gemm) =
                        bnn::kernels::gemm::bench(m, n, k, transposed, repeats.max(1));
                    rows.push(serde_json::json!({
                        "product": what, "batch": batch, "m": m, "n": n, "k": k,
                        "bnn_gflop_per_s": ours, "gemm_crate_gflop_per_s": crate_gemm,
                    }));
                }
            }
            let skipping = bnn::bench::zero_skipping(repeats.max(1))?;
            json(&serde_json::json!({ "products": rows, "first_layer_zero_skipping": skipping }))
        }
        Command::Bench(BenchCommand::Train {
            hidden,
            batch,
            cnn_batch,
            config,
            sampler,
            integrator,
            backward,
            kernel,
            repeats,
            steps,
            chains,
        }) => {
            let presets = config
                .iter()
                .map(|p| bnn::model::ModelSpec::from_toml_file(p))
                .collect::<Result<Vec<_>>>()?;
            let cnn_batches = cnn_batch
                .split(',')
                .filter(|b| !b.trim().is_empty())
                .map(|b| {
                    b.trim().parse::<usize>().map_err(|_| {
                        Error::Config(format!(
                            "--cnn-batch: `{b}` is not a batch size (e.g. \"64\")"
                        ))
                    })
                })
                .collect::<Result<Vec<usize>>>()?;
            let hidden = hidden
                .split(';')
                .filter(|net| !net.trim().is_empty())
                .map(|net| {
                    net.split(',')
                        .filter(|w| !w.trim().is_empty())
                        .map(|w| {
                            w.trim()
                                .parse::<usize>()
                                .ok()
                                .filter(|&w| w > 0)
                                .ok_or_else(|| {
                                    Error::Config(format!(
                                    "--hidden: `{w}` is not a positive width (e.g. \"100;400,400\")"
                                ))
                                })
                        })
                        .collect::<Result<Vec<usize>>>()
                })
                .collect::<Result<Vec<_>>>()?;
            let sizes = || batch.iter().chain(&cnn_batches);
            if sizes().any(|&b| b == 0 || b > 10_000) || repeats == 0 || steps == 0 || chains == 0 {
                return Err(Error::Config(
                    "bench train needs batches in 1..=10000 and positive repeats, steps and chains"
                        .into(),
                ));
            }
            let opts = bnn::bench::TrainBenchOptions {
                hidden,
                batches: batch,
                cnn_batches,
                presets,
                samplers: sampler,
                integrator,
                backward,
                kernel,
                repeats,
                steps,
                chains,
            };
            json(&bnn::bench::train(&opts)?)
        }
        Command::Data(DataCommand::Verify { data }) => {
            let spec = spec_of(&data.dataset)?;
            let dirs = data::candidate_dirs(&spec, data.data_dir.as_deref());
            let dir = dirs
                .iter()
                .find(|d| data::is_complete(&spec, d))
                .ok_or_else(|| Error::Data(data::missing_message(&spec, &dirs, "")))?;
            let files = data::fetch::verify(&spec, dir)?;
            json(&serde_json::json!({
                "dataset": spec.name, "dir": dir.display().to_string(), "verified": true,
                "files": files.iter().map(|p| p.display().to_string()).collect::<Vec<_>>()
            }))
        }
    }
}

/// The replica-exchange options of the flags.
fn replica_options(a: &ReplicaArgs) -> Result<ReplicaOptions> {
    Ok(ReplicaOptions {
        replicas: a.replicas,
        ladder: ladder_of(&a.ladder)?,
        target_swap_rate: a.target_swap_rate,
        exchange_every: a.exchange_every,
        pairs: a.pairs,
        thermostat: a.replica_thermostat,
    })
}

/// `--ladder`: `auto` (adapted during burn-in) or τ > 1.
fn ladder_of(text: &str) -> Result<Option<f64>> {
    if text == "auto" {
        return Ok(None);
    }
    match text.parse::<f64>() {
        Ok(tau) if tau > 1.0 && tau.is_finite() => Ok(Some(tau)),
        _ => Err(Error::Config(format!(
            "--ladder must be `auto` or a number above 1, got `{text}`"
        ))),
    }
}

/// The candle device for `--device`; a build without that backend says how to get it.
fn device_of(kind: DeviceKind) -> Result<candle_core::Device> {
    match kind {
        DeviceKind::Cpu => Ok(candle_core::Device::Cpu),
        DeviceKind::Cuda => candle_core::Device::new_cuda(0).map_err(|e| {
            Error::Config(format!(
                "--device cuda: {e} (build with `cargo build --release --features cuda` on a machine with CUDA)"
            ))
        }),
        DeviceKind::Metal => candle_core::Device::new_metal(0).map_err(|e| {
            Error::Config(format!(
                "--device metal: {e} (build with `cargo build --release --features metal` on macOS)"
            ))
        }),
    }
}

fn json<T: serde::Serialize>(v: &T) -> Result<String> {
    serde_json::to_string(v).map_err(|e| Error::Config(format!("serialising output: {e}")))
}

fn spec_of(name: &str) -> Result<registry::DatasetSpec> {
    registry::lookup(name).ok_or_else(|| {
        let known: Vec<_> = registry::ALL.iter().map(|d| d.name).collect();
        Error::Config(format!(
            "unknown dataset `{name}`; known datasets: {}",
            known.join(", ")
        ))
    })
}

/// Builds the model spec: the preset of `--config` (or the default MLP-100), then
/// `--hidden` and `--activation` on top.
fn model_spec(args: &TrainArgs) -> Result<ModelSpec> {
    let mut spec = match &args.config {
        Some(path) => ModelSpec::from_toml_file(path)?,
        None => ModelSpec::default(),
    };
    if let Some(h) = &args.hidden {
        spec.hidden = h.clone();
    }
    if let Some(a) = args.activation {
        spec.activation = a;
    }
    spec.validate()?;
    Ok(spec)
}

fn sampler_config(args: &TrainArgs) -> SamplerConfig {
    let d = args.sampler.defaults();
    SamplerConfig {
        kind: args.sampler,
        step_size: args.step_size.unwrap_or(d.step_size),
        friction: args.friction.unwrap_or(d.friction),
        noise_estimate: args.noise_estimate.unwrap_or(d.noise_estimate),
        diffusion: args.diffusion.unwrap_or(d.diffusion),
        integrator: args.integrator.unwrap_or(d.integrator),
    }
}

fn train_command(
    args: TrainArgs,
    given: &GivenFlags,
    quiet: bool,
    ranks: &Ranks,
) -> Result<String> {
    // Kept in run.json as a record of how the run was made (never parsed again).
    let command_line: Vec<String> = std::env::args().collect();
    if let Some(run_dir) = args.resume.clone() {
        let fields = ResumeFields::of(&args, given)?;
        return resume_command(&run_dir, &command_line, fields, quiet, ranks);
    }
    let cfg_and_data = train_config(&args, given, quiet, command_line)?;
    run_training(cfg_and_data, ranks)
}

/// The run; its summary as JSON from rank 0, nothing from the other ranks of an MPI job.
fn run_training((cfg, ds): (TrainConfig, data::Dataset), ranks: &Ranks) -> Result<String> {
    bnn::signals::install();
    match train::train_on(&cfg, &ds, ranks)? {
        Some(summary) => json(&summary),
        None => Ok(String::new()),
    }
}

/// What `--resume` may change: when and how the run goes on, never what it computes.
/// `None`: as recorded.
struct ResumeFields {
    epochs: Option<usize>,
    checkpoint_every: Option<usize>,
    log_every: Option<usize>,
    on_divergence: Option<bnn::settings::OnDivergence>,
    data_dir: Option<PathBuf>,
    offline: bool,
    device: DeviceKind,
    no_progress: bool,
}

impl ResumeFields {
    /// The flags of `bnn train` that may go with `--resume` (clap's ids: field names).
    const FLAGS: [&'static str; 9] = [
        "resume",
        "epochs",
        "checkpoint_every",
        "log_every",
        "on_divergence",
        "data_dir",
        "offline",
        "device",
        "no_progress",
    ];

    /// The resume fields of `args`; a typed flag outside them is refused, by name.
    fn of(args: &TrainArgs, given: &GivenFlags) -> Result<Self> {
        let global = ["quiet", "verbose"];
        if let Some(id) = given
            .iter()
            .find(|id| !Self::FLAGS.contains(&id.as_str()) && !global.contains(&id.as_str()))
        {
            return Err(Error::Config(format!(
                "--{} cannot be given with --resume: a resumed run keeps its recorded settings (start a new run to change them); with --resume only {} may be given",
                id.replace('_', "-"),
                Self::FLAGS[1..]
                    .iter()
                    .map(|f| format!("--{}", f.replace('_', "-")))
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        let typed = |id: &str| given.contains(id);
        Ok(ResumeFields {
            epochs: typed("epochs").then_some(args.epochs),
            checkpoint_every: typed("checkpoint_every").then_some(args.checkpoint_every),
            log_every: typed("log_every").then_some(args.log_every),
            on_divergence: typed("on_divergence").then_some(args.on_divergence),
            data_dir: args.data.data_dir.clone(),
            offline: args.offline,
            device: args.device,
            no_progress: args.no_progress,
        })
    }

    /// `settings` with these fields applied.
    fn apply(&self, settings: &mut Settings) {
        settings.epochs = self.epochs.unwrap_or(settings.epochs);
        settings.checkpoint_every = self.checkpoint_every.unwrap_or(settings.checkpoint_every);
        settings.log_every = self.log_every.unwrap_or(settings.log_every);
        settings.on_divergence = self.on_divergence.unwrap_or(settings.on_divergence);
    }
}

/// `bnn train --resume RUN_DIR [flags]`: the run's settings from its `run.json`, with the
/// resume fields applied; its data found as `bnn eval` finds it.
fn resume_command(
    run_dir: &std::path::Path,
    command_line: &[String],
    fields: ResumeFields,
    quiet: bool,
    ranks: &Ranks,
) -> Result<String> {
    let recorded = RunManifest::read(run_dir)?;
    let mut settings = recorded.settings.clone();
    fields.apply(&mut settings);
    let ds = bnn::eval::load_run_data(&recorded, fields.data_dir.clone(), fields.offline)?;
    // The record: the command that started the run and the new flags after it.
    let new_flags = command_line
        .iter()
        .skip_while(|a| a.as_str() != "train")
        .skip(1)
        .cloned();
    let cfg = TrainConfig {
        settings,
        run_dir: run_dir.to_path_buf(),
        device: device_of(fields.device)?,
        progress: show_progress(fields.no_progress, quiet),
        resume: true,
        command_line: recorded
            .command_line
            .iter()
            .cloned()
            .chain(new_flags)
            .collect(),
    };
    run_training((cfg, ds), ranks)
}

/// A progress bar unless asked not to or stderr is not a terminal.
fn show_progress(no_progress: bool, quiet: bool) -> bool {
    !no_progress && !quiet && std::io::IsTerminal::is_terminal(&std::io::stderr())
}

/// `args` with the `[train]` defaults of its `--config` preset wherever the user did not
/// type the flag. The preset's sampler settings (step size, friction,
/// diffusion, noise estimate, integrator) and its number of chains go with its sampler:
/// not used when the command line names another.
fn with_preset_defaults(args: &TrainArgs, given: &GivenFlags) -> Result<TrainArgs> {
    let mut a = args.clone();
    let Some(path) = &args.config else {
        return Ok(a);
    };
    let t = bnn::settings::Preset::from_toml_file(path)?.train;
    let free = |id: &str| !given.contains(id);
    let set = |v: &mut usize, id: &str, p: Option<usize>| {
        if let (Some(p), true) = (p, free(id)) {
            *v = p;
        }
    };
    let preset_sampler = t.sampler.unwrap_or(a.sampler);
    if free("sampler") {
        a.sampler = preset_sampler;
    }
    if a.sampler == preset_sampler {
        a.step_size = a.step_size.or(t.step_size);
        a.friction = a.friction.or(t.friction);
        a.diffusion = a.diffusion.or(t.diffusion);
        a.noise_estimate = a.noise_estimate.or(t.noise_estimate);
        a.integrator = a.integrator.or(t.integrator);
        set(&mut a.chains, "chains", t.chains);
    }
    set(&mut a.batch_size, "batch_size", t.batch_size);
    set(&mut a.epochs, "epochs", t.epochs);
    set(&mut a.burnin, "burnin", t.burnin);
    set(&mut a.thin, "thin", t.thin);
    if let (Some(d), true) = (t.decay_at, free("decay_at")) {
        a.decay_at = d;
    }
    if let (Some(f), true) = (t.decay_factor, free("decay_factor")) {
        a.decay_factor = f;
    }
    if let (Some(v), true) = (t.temperature, free("temperature")) {
        a.temperature = v;
    }
    if let (Some(v), true) = (t.augment, free("augment")) {
        a.augment = Some(v);
    }
    if let (Some(v), true) = (t.standardize, free("standardize")) {
        a.standardize = v;
    }
    let prior_free = ["prior", "prior_std", "gamma_shape", "gamma_rate"]
        .iter()
        .all(|id| free(id));
    match (t.prior, prior_free) {
        (Some(PriorSpec::Gaussian { std }), true) => {
            a.prior = PriorKind::Gaussian;
            a.prior_std = std;
        }
        (Some(PriorSpec::Gamma { shape, rate }), true) => {
            a.prior = PriorKind::Gamma;
            a.gamma_shape = shape;
            a.gamma_rate = rate;
        }
        _ => {}
    }
    Ok(a)
}

/// The training configuration and data of `args` (with its preset's training defaults
/// where the user typed no flag).
fn train_config(
    args: &TrainArgs,
    given: &GivenFlags,
    quiet: bool,
    command_line: Vec<String>,
) -> Result<(TrainConfig, data::Dataset)> {
    let args = &with_preset_defaults(args, given)?;
    let model = model_spec(args)?;
    let sampler = sampler_config(args);
    sampler.validate()?;
    let prior = match args.prior {
        PriorKind::Gaussian => PriorSpec::Gaussian {
            std: args.prior_std,
        },
        PriorKind::Gamma => PriorSpec::Gamma {
            shape: args.gamma_shape,
            rate: args.gamma_rate,
        },
    };
    bnn::potential::Prior::new(prior, 1)?;
    let opts = LoadOptions {
        data_dir: args.data.data_dir.clone(),
        offline: args.offline,
        mirror: args.mirror.clone(),
        valid: args.valid,
        builtin_fallback: true,
    };
    let mut ds = data::load(&args.data.dataset, &opts)?;
    if args.standardize {
        let s = data::Standardization::of(&ds.train, data::Standardization::DEFAULT_FLOOR)?;
        ds.set_standardization(Some(s))?;
    }
    let run_name = args.run_name.clone().unwrap_or_else(|| {
        format!(
            "{}-{}-{}-seed{}",
            ds.name,
            model.label(),
            sampler.kind.name(),
            args.seed
        )
    });
    let run_dir: PathBuf = args.out.join(run_name);
    let cfg = TrainConfig {
        settings: Settings {
            model,
            sampler,
            kernel: args.kernel,
            backward: args.backward,
            prior,
            temperature: args.temperature,
            batch_size: args.batch_size,
            epochs: args.epochs,
            schedule: bnn::schedule::Schedule {
                burnin: args.burnin,
                thin: args.thin,
                decay_at: args.decay_at.clone(),
                decay_factor: args.decay_factor,
                cycles: args.cycles,
                sample_fraction: args.sample_fraction,
                poly_gamma: args.poly_gamma,
                poly_steps: args.poly_steps,
            },
            seed: args.seed,
            checkpoint_every: args.checkpoint_every,
            log_every: args.log_every,
            chains: args.chains,
            replicas: if sampler.kind.is_replica_exchange() {
                Some(replica_options(&args.replicas)?)
            } else {
                None
            },
            permute_labels: args.permute_labels,
            augment: args.augment.unwrap_or_default(),
            on_divergence: args.on_divergence,
        },
        run_dir,
        device: device_of(args.device)?,
        progress: show_progress(args.no_progress, quiet),
        resume: false,
        command_line,
    };
    Ok((cfg, ds))
}
