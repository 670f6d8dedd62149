//! `bnn train`: a new run from the flags (and a preset), or `--resume` of a run.

use std::path::PathBuf;

use bnn::checkpoint::RunManifest;
use bnn::data::{self, LoadOptions};
use bnn::error::{Error, Result};
use bnn::model::ModelSpec;
use bnn::potential::PriorSpec;
use bnn::ranks::Ranks;
use bnn::sampler::SamplerConfig;
use bnn::settings::{ResumeChanges, Settings};
use bnn::train::{self, TrainConfig};

use super::{device_of, json, replica_options};
use crate::cli::{DeviceKind, GivenFlags, PriorKind, TrainArgs};

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

pub(super) fn train_command(
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

/// What `--resume` may be given: the changes to the recorded settings, and where and how
/// the run goes on.
struct ResumeFields {
    changes: ResumeChanges,
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
            changes: ResumeChanges {
                epochs: typed("epochs").then_some(args.epochs),
                checkpoint_every: typed("checkpoint_every").then_some(args.checkpoint_every),
                log_every: typed("log_every").then_some(args.log_every),
                on_divergence: typed("on_divergence").then_some(args.on_divergence),
            },
            data_dir: args.data.data_dir.clone(),
            offline: args.offline,
            device: args.device,
            no_progress: args.no_progress,
        })
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
    fields.changes.apply(&mut settings);
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

/// The settings of `args`: `bnn train`'s defaults ([`Settings`]'s `Default`, which the
/// flags' defaults are), then the preset's values where no flag was typed, then the flags.
fn settings_of(args: &TrainArgs, given: &GivenFlags) -> Result<Settings> {
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
    Ok(Settings {
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
    })
}

/// The training configuration and data of `args` (with its preset's training defaults
/// where the user typed no flag).
fn train_config(
    args: &TrainArgs,
    given: &GivenFlags,
    quiet: bool,
    command_line: Vec<String>,
) -> Result<(TrainConfig, data::Dataset)> {
    let settings = settings_of(args, given)?;
    let args = &with_preset_defaults(args, given)?;
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
            settings.model.label(),
            settings.sampler.kind.name(),
            args.seed
        )
    });
    let cfg = TrainConfig {
        settings,
        run_dir: args.out.join(run_name),
        device: device_of(args.device)?,
        progress: show_progress(args.no_progress, quiet),
        resume: false,
        command_line,
    };
    Ok((cfg, ds))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, FromArgMatches};

    /// The settings of `bnn train` with `flags`, as the program resolves them.
    fn settings_for(flags: &[&str]) -> Settings {
        let argv = ["bnn", "train"].iter().chain(flags);
        let matches = crate::cli::Cli::command()
            .try_get_matches_from(argv)
            .unwrap();
        let given = crate::cli::given_train_flags(&matches);
        let cli = crate::cli::Cli::from_arg_matches(&matches).unwrap();
        let crate::cli::Command::Train(args) = cli.command else {
            panic!("not `bnn train`")
        };
        settings_of(&args, &given).unwrap()
    }

    /// The flags' defaults are `Settings::default()`, defined once: `bnn train` with no
    /// flag resolves to it exactly, and a typed flag changes its field only.
    #[test]
    fn no_flag_resolves_to_the_library_defaults() {
        assert_eq!(settings_for(&[]), Settings::default());
        let typed = settings_for(&["--epochs", "7", "--decay-at"]);
        let defaults = Settings::default();
        let want = Settings {
            epochs: 7,
            schedule: bnn::schedule::Schedule {
                decay_at: Vec::new(),
                ..defaults.schedule.clone()
            },
            ..defaults
        };
        assert_eq!(typed, want);
    }
}
