//! What each CLI command does, in terms of the library.

mod bench;
mod train;

use crate::cli::{
    Command, CompareArgs, DataArgs, DataCommand, DeviceKind, EvalArgs, GivenFlags, InspectArgs,
    PlotArgs, PredictArgs, SampleArgs, ShiftKind,
};
use bnn::checkpoint::RunManifest;
use bnn::data::{self, registry};
use bnn::error::{Error, Result};
use bnn::ranks::Ranks;

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
        Command::Train(args) => train::train_command(*args, given, quiet, ranks),
        Command::Eval(args) => eval_command(args),
        Command::Compare(args) => compare_command(args),
        Command::Plot(args) => plot_command(args),
        Command::Predict(args) => predict_command(args),
        Command::Inspect(args) => inspect_command(args),
        Command::Data(DataCommand::Fetch { data, mirror }) => fetch_command(data, mirror),
        Command::Data(DataCommand::Verify { data }) => verify_command(data),
        Command::Sample(a) => sample_command(a),
        Command::Bench(b) => bench::bench_command(b),
    }
}

/// `bnn compare`: a run against a reference on the same test set.
fn compare_command(args: CompareArgs) -> Result<String> {
    let (run, reference) = (
        RunManifest::read(&args.run)?,
        RunManifest::read(&args.reference)?,
    );
    bnn::compare::check_same_data(&run, &reference)?;
    let ds = bnn::eval::load_run_data(&run, args.data_dir, args.offline)?;
    let c = bnn::compare::compare(&args.run, &args.reference, &ds, &candle_core::Device::Cpu)?;
    eprint!("{}", bnn::compare::table(&c));
    json(&c)
}

/// `bnn eval`: the run's ensemble again from its sample files, with the extras asked for.
fn eval_command(args: EvalArgs) -> Result<String> {
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

/// `bnn plot`: the run's pictures.
fn plot_command(args: PlotArgs) -> Result<String> {
    let report = bnn::plot::plot_run(&args.run, args.out.as_deref())?;
    for s in &report.skipped {
        tracing::info!("not drawn: {s}");
    }
    tracing::info!("{} files in {}", report.written.len(), report.out_dir);
    json(&report)
}

/// `bnn predict`: the ensemble's class probabilities for pictures or IDX images.
fn predict_command(args: PredictArgs) -> Result<String> {
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

/// `bnn inspect`: a run or a sample file, as a table or JSON.
fn inspect_command(args: InspectArgs) -> Result<String> {
    match (&args.run, &args.file) {
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
    }
}

/// `bnn data fetch`: downloads and verifies a dataset.
fn fetch_command(data: DataArgs, mirror: Option<String>) -> Result<String> {
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

/// `bnn data verify`: checks a dataset's files against the registry.
fn verify_command(data: DataArgs) -> Result<String> {
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

/// `bnn sample`: a sampler on a synthetic potential.
fn sample_command(a: SampleArgs) -> Result<String> {
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
        replicas: a.replicas.options(),
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

/// The candle device for `--device`; a build without that backend says how to get it.
fn device_of(kind: DeviceKind) -> Result<candle_core::Device> {
    match kind {
        DeviceKind::Cpu => Ok(candle_core::Device::Cpu),
        DeviceKind::Cuda if !cfg!(feature = "cuda") => Err(Error::Config(
            "--device cuda: this bnn was built without CUDA; build it with `cargo build \
             --release --features cuda` on a machine with the CUDA toolkit"
                .into(),
        )),
        DeviceKind::Cuda => candle_core::Device::new_cuda(0).map_err(|e| {
            let said = e.to_string();
            Error::Config(format!(
                "--device cuda: no usable CUDA GPU 0 ({}); `nvidia-smi` should list one",
                said.lines().next().unwrap_or_default()
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
