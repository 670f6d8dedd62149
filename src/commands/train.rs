//! `bnn train`: a new run from the flags (and a preset), or `--resume` of a run.

use std::path::PathBuf;

use bnn::checkpoint::RunManifest;
use bnn::data::tabular::{self, TableSpec, TaskKind};
use bnn::data::{self, LoadOptions};
use bnn::error::{Error, Result};
use bnn::likelihood::{Likelihood, Noise};
use bnn::model::ModelSpec;
use bnn::potential::PriorSpec;
use bnn::ranks::Ranks;
use bnn::settings::{Preset, ResumeChanges, Settings, SettingsLayer};
use bnn::train::{self, TrainConfig};

use super::{device_of, json};
use crate::cli::{DeviceKind, GivenFlags, PriorKind, TrainArgs};

/// The network: the preset's (or the default MLP-100), then `--hidden` and `--activation`
/// on top.
fn model_spec(args: &TrainArgs, preset: Option<ModelSpec>) -> Result<ModelSpec> {
    let mut spec = preset.unwrap_or_default();
    if let Some(h) = &args.hidden {
        spec.hidden = h.0.clone();
    }
    if let Some(a) = args.activation {
        spec.activation = a;
    }
    spec.validate()?;
    Ok(spec)
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

/// The clap id of the flag of field `$a.$path` (its last name), the path checked by the
/// compiler against `$a`'s type, so that renaming a field cannot leave a stale id behind.
macro_rules! flag_id {
    ($a:ident . $($path:ident).+) => {{
        let _ = &$a.$($path).+;
        flag_id!(@last $($path).+)
    }};
    (@last $last:ident) => {
        stringify!($last)
    };
    (@last $first:ident . $($rest:ident).+) => {
        flag_id!(@last $($rest).+)
    };
}

impl ResumeFields {
    /// The flags of `bnn train` that may go with `--resume` (clap's ids: field names),
    /// `--resume` itself first.
    fn flags(a: &TrainArgs) -> [&'static str; 9] {
        [
            flag_id!(a.resume),
            flag_id!(a.settings.epochs),
            flag_id!(a.settings.checkpoint_every),
            flag_id!(a.settings.log_every),
            flag_id!(a.settings.on_divergence),
            flag_id!(a.data.data_dir),
            flag_id!(a.offline),
            flag_id!(a.device),
            flag_id!(a.no_progress),
        ]
    }

    /// The resume fields of `args`; a typed flag outside them is refused, by name.
    fn of(args: &TrainArgs, given: &GivenFlags) -> Result<Self> {
        let flags = Self::flags(args);
        let global = ["quiet", "verbose"];
        // clap also reports a flattened group (`TableArgs`) whose flag was typed: the flag
        // itself is reported by its own id.
        let group = |id: &str| id.starts_with(|c: char| c.is_ascii_uppercase());
        if let Some(id) = given.iter().find(|id| {
            !flags.contains(&id.as_str()) && !global.contains(&id.as_str()) && !group(id)
        }) {
            return Err(Error::Config(format!(
                "--{} cannot be given with --resume: a resumed run keeps its recorded settings (start a new run to change them); with --resume only {} may be given",
                id.replace('_', "-"),
                flags[1..]
                    .iter()
                    .map(|f| format!("--{}", f.replace('_', "-")))
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        Ok(ResumeFields {
            changes: ResumeChanges {
                epochs: args.settings.epochs,
                checkpoint_every: args.settings.checkpoint_every,
                log_every: args.settings.log_every,
                on_divergence: args.settings.on_divergence,
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

/// The defaults of `--toy regression-1d`, built in.
const REGRESSION_1D_PRESET: &str = include_str!("../../models/regression-1d.toml");

/// `args`' preset: `--config`'s, else a toy's built-in one, else none.
fn preset_of(args: &TrainArgs) -> Result<Option<Preset>> {
    match (&args.config, &args.table.toy) {
        (Some(path), _) => Ok(Some(Preset::from_toml_file(path)?)),
        (None, Some(_)) => Ok(Some(Preset::from_toml_str(
            REGRESSION_1D_PRESET,
            "models/regression-1d.toml (built in)",
        )?)),
        (None, None) => Ok(None),
    }
}

/// What the command line asks for, read once: the preset's `[train]` layer, the flags'
/// layer over it, and the network (the preset's `[model]` under `--hidden` and
/// `--activation`).
struct Layers {
    preset: SettingsLayer,
    flags: SettingsLayer,
    model: ModelSpec,
}

impl Layers {
    fn of(args: &TrainArgs) -> Result<Self> {
        let (model, preset) = match preset_of(args)? {
            Some(p) => (Some(p.model), p.train),
            None => (None, SettingsLayer::default()),
        };
        Ok(Layers {
            preset,
            flags: flag_layer(args),
            model: model_spec(args, model)?,
        })
    }

    /// Whether the flags or the preset set the field `f` reads.
    fn sets<T>(&self, f: impl Fn(&SettingsLayer) -> &Option<T>) -> bool {
        f(&self.flags).is_some() || f(&self.preset).is_some()
    }
}

/// The flags, as a layer of settings: a flag not given is absent, so that a preset's
/// value shows through. Only the prior is composed here, from its four flags.
fn flag_layer(a: &TrainArgs) -> SettingsLayer {
    SettingsLayer {
        prior: prior_flags(a),
        ..a.settings.clone()
    }
}

/// The prior the prior flags give, if any is given: `--prior` (else gaussian when only
/// `--prior-std` is given, else gamma), each parameter not given at its default.
fn prior_flags(a: &TrainArgs) -> Option<PriorSpec> {
    let gamma_given = a.gamma_shape.is_some() || a.gamma_rate.is_some();
    let kind = match a.prior {
        Some(kind) => kind,
        None if a.prior_std.is_some() && !gamma_given => PriorKind::Gaussian,
        None if a.prior_std.is_some() || gamma_given => PriorKind::Gamma,
        None => return None,
    };
    Some(match kind {
        PriorKind::Gaussian => PriorSpec::Gaussian {
            std: a.prior_std.unwrap_or(PriorSpec::DEFAULT_STD),
        },
        PriorKind::Gamma => PriorSpec::Gamma {
            shape: a.gamma_shape.unwrap_or(PriorSpec::DEFAULT_SHAPE),
            rate: a.gamma_rate.unwrap_or(PriorSpec::DEFAULT_RATE),
        },
    })
}

/// The settings of `args`, resolved once on the defaults `d` (`bnn train`'s,
/// [`Settings`]'s `Default`, or a table's, [`Settings::for_table`]): the preset over
/// them, the flags over both ([`Settings::resolve_on`]); the replicas and HMC's options
/// from their flags.
fn settings_on(d: Settings, args: &TrainArgs, layers: &Layers) -> Result<Settings> {
    let d = Settings {
        model: layers.model.clone(),
        ..d
    };
    let resolved = Settings::resolve_on(d, &layers.preset, &layers.flags);
    refuse_foreign_flags(resolved.sampler.kind, &layers.flags)?;
    resolved.sampler.validate().map_err(bnn::Error::for_flag)?;
    bnn::potential::Prior::new(resolved.prior, 1)?;
    let replicas = resolved
        .sampler
        .kind
        .is_replica_exchange()
        .then(|| args.replicas.options());
    let mut settings = Settings {
        replicas,
        ..resolved
    };
    if settings.hmc.is_some() {
        let f = &layers.flags;
        settings.fit_hmc_schedule(f.epochs.is_some(), f.burnin.is_some(), f.thin.is_some());
    }
    Ok(settings)
}

/// A sampler flag typed for a sampler that has no such parameter (`--friction` with
/// sgnht, `--trajectory-length` with anything but hmc) is an error, not a value recorded
/// and never used.
fn refuse_foreign_flags(kind: bnn::sampler::SamplerKind, flags: &SettingsLayer) -> Result<()> {
    // A field's flag id and whether it was typed.
    macro_rules! given {
        ($field:ident) => {
            (flag_id!(flags.$field), flags.$field.is_some())
        };
    }
    let typed = [
        given!(friction),
        given!(diffusion),
        given!(noise_estimate),
        given!(rms_decay),
        given!(rms_damping),
    ];
    let hmc_only = [
        given!(trajectory_length),
        given!(target_accept),
        given!(init_from),
    ];
    let hmc = kind == bnn::sampler::SamplerKind::Hmc;
    if let Some((field, _)) = hmc_only.iter().find(|(_, given)| *given && !hmc) {
        return Err(Error::Config(format!(
            "--{} is for --sampler hmc, not {}",
            field.replace('_', "-"),
            kind.name()
        )));
    }
    for (field, given) in typed {
        if given && !kind.own_fields().contains(&field) {
            let own: Vec<String> = kind
                .own_fields()
                .iter()
                .map(|f| format!("--{}", f.replace('_', "-")))
                .collect();
            let own = match own.is_empty() {
                true => "only --step-size".to_string(),
                false => format!("--step-size and {}", own.join(", ")),
            };
            return Err(Error::Config(format!(
                "--{} does not apply to {}, which takes {own}",
                field.replace('_', "-"),
                kind.name()
            )));
        }
    }
    Ok(())
}

/// The table (or toy) `args` names, if any: where it is, its target and its split.
fn table_spec(args: &TrainArgs, seed: u64) -> Option<TableSpec> {
    let t = &args.table;
    let (csv, target, task) = match (&t.toy, &t.csv) {
        (Some(toy), _) => (
            PathBuf::from(format!("{}{toy}", tabular::TOY_PREFIX)),
            "y".to_string(),
            TaskKind::Regression,
        ),
        (None, Some(csv)) => (csv.clone(), t.target.clone().unwrap_or_default(), t.task),
        (None, None) => return None,
    };
    Some(TableSpec {
        csv,
        target,
        task,
        test_csv: t.test_csv.clone(),
        test_fraction: t.test_fraction,
        split_seed: t.split_seed.unwrap_or(seed),
        train_limit: args.train_limit,
    })
}

/// The settings and data of a table run: the table's defaults under the preset and the
/// flags, the step size scaled to its size unless one was given, and for a regression
/// the Gaussian likelihood (σ fixed by `--noise-std`, in the target's units, or sampled).
fn table_config(
    args: &TrainArgs,
    given: &GivenFlags,
    layers: &Layers,
    spec: &TableSpec,
) -> Result<(Settings, data::Dataset)> {
    if given.contains("dataset") || args.data.data_dir.is_some() {
        return Err(Error::Config(
            "--csv and --toy replace --dataset and --data-dir; give one or the other".into(),
        ));
    }
    if args.valid > 0 || args.settings.standardize.is_some() || args.settings.augment.is_some() {
        return Err(Error::Config(
            "--valid, --standardize and --augment are for images; a table's features are always standardised and it is scored on its test rows".into(),
        ));
    }
    let ds = tabular::load(spec)?;
    let n = ds.train.len();
    let mut settings = settings_on(Settings::for_table(n), args, layers)?;
    // HMC's ε is a leapfrog step on the full-data potential, adapted in burn-in: not a
    // minibatch step to scale.
    let hmc = settings.sampler.kind == bnn::sampler::SamplerKind::Hmc;
    if !layers.sets(|l| &l.step_size) && !hmc {
        settings.scale_step_size(n, ds.task.is_regression());
    }
    // Burn-in and thinning follow the epochs asked for, unless given themselves.
    let burnin_given = layers.sets(|l| &l.burnin);
    let thin_given = layers.sets(|l| &l.thin);
    if !hmc {
        settings.fit_table_schedule(n, burnin_given, thin_given);
    }
    // The toy's noise is known: fixed at its truth unless told otherwise.
    let toy_noise = args
        .table
        .toy
        .as_ref()
        .map(|_| data::toy::REGRESSION_1D_NOISE);
    settings.likelihood = match (ds.task, args.table.noise_std.or(toy_noise)) {
        (data::Task::Regression { std, .. }, Some(sigma)) => Likelihood::Gaussian {
            noise: Noise::Fixed { std: sigma / std },
        },
        (data::Task::Regression { .. }, None) => Likelihood::Gaussian {
            noise: Noise::DEFAULT,
        },
        (data::Task::Classification { .. }, Some(_)) => {
            return Err(Error::Config(
                "--noise-std is for a regression; this table's target holds classes".into(),
            ))
        }
        (data::Task::Classification { .. }, None) => Likelihood::Categorical,
    };
    Ok((settings, ds))
}

/// The training configuration and data of `args` (with its preset's training defaults
/// where the user typed no flag).
fn train_config(
    args: &TrainArgs,
    given: &GivenFlags,
    quiet: bool,
    command_line: Vec<String>,
) -> Result<(TrainConfig, data::Dataset)> {
    let layers = Layers::of(args)?;
    let seed = layers.flags.seed.or(layers.preset.seed);
    let (settings, ds) = match table_spec(args, seed.unwrap_or(Settings::default().seed)) {
        Some(spec) => table_config(args, given, &layers, &spec)?,
        None => image_config(args, &layers)?,
    };
    let run_name = args.run_name.clone().unwrap_or_else(|| {
        format!(
            "{}-{}-{}-seed{}",
            ds.name,
            settings.model.label(),
            settings.sampler.kind.name(),
            settings.seed
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

/// The settings and data of an image run.
fn image_config(args: &TrainArgs, layers: &Layers) -> Result<(Settings, data::Dataset)> {
    let settings = settings_on(Settings::default(), args, layers)?;
    // A property of the data, set by the flag or the preset.
    let standardize = layers.flags.standardize.or(layers.preset.standardize);
    let opts = LoadOptions {
        data_dir: args.data.data_dir.clone(),
        offline: args.offline,
        mirror: args.mirror.clone(),
        valid: args.valid,
        train_limit: args.train_limit,
        builtin_fallback: true,
    };
    let mut ds = data::load(&args.data.dataset, &opts)?;
    if standardize.unwrap_or(false) {
        let s = data::Standardization::of(&ds.train, data::Standardization::DEFAULT_FLOOR)?;
        ds.set_standardization(Some(s))?;
    }
    Ok((settings, ds))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::FromArgMatches;

    /// The settings of `bnn train` with `flags`, as the program resolves them.
    fn settings_for(flags: &[&str]) -> Settings {
        try_settings_for(flags).unwrap()
    }

    /// [`settings_for`], or the error it gives.
    fn try_settings_for(flags: &[&str]) -> Result<Settings> {
        let argv = ["bnn", "train"].iter().chain(flags);
        let matches = crate::cli::command().try_get_matches_from(argv).unwrap();
        let cli = crate::cli::Cli::from_arg_matches(&matches).unwrap();
        let crate::cli::Command::Train(args) = cli.command else {
            panic!("not `bnn train`")
        };
        settings_on(Settings::default(), &args, &Layers::of(&args).unwrap())
    }

    /// A sampler flag its sampler does not read is refused, naming what it takes; the
    /// sampler's own flags pass.
    #[test]
    fn a_flag_of_another_sampler_is_refused() {
        for (flags, needle) in [
            (
                &["--sampler", "sgnht", "--friction", "0.3"][..],
                "--friction does not apply to sgnht, which takes --step-size and --diffusion",
            ),
            (
                &["--sampler", "sgld", "--diffusion", "0.1"][..],
                "--diffusion does not apply to sgld, which takes only --step-size",
            ),
            (
                &["--sampler", "momentum", "--noise-estimate", "0.01"][..],
                "--noise-estimate does not apply to momentum",
            ),
            (
                &["--sampler", "sghmc", "--rms-decay", "0.9"][..],
                "--rms-decay does not apply to sghmc",
            ),
            (
                &["--sampler", "sgld", "--trajectory-length", "1"][..],
                "--trajectory-length is for --sampler hmc, not sgld",
            ),
        ] {
            let e = try_settings_for(flags).unwrap_err().to_string();
            assert!(e.contains(needle), "{flags:?}: {e}");
        }
        let s = settings_for(&[
            "--sampler",
            "sghmc",
            "--friction",
            "0.2",
            "--noise-estimate",
            "0.01",
        ]);
        assert_eq!((s.sampler.friction, s.sampler.noise_estimate), (0.2, 0.01));
        assert_eq!(
            settings_for(&["--sampler", "reld", "--friction", "0.3"])
                .sampler
                .friction,
            0.3
        );
        assert_eq!(
            settings_for(&["--sampler", "renhd", "--diffusion", "0.3"])
                .sampler
                .diffusion,
            0.3
        );
        // pSGLD's β and λ reach its update; absent, they are the defaults.
        let psgld = |flags: &[&str]| settings_for(flags).sampler.params().unwrap();
        let typed = [
            "--sampler",
            "psgld",
            "--rms-decay",
            "0.9",
            "--rms-damping",
            "1e-5",
        ];
        let want = bnn::sampler::SamplerParams::Psgld {
            step_size: bnn::sampler::params::PSGLD_STEP_SIZE,
            decay: 0.9,
            damping: 1e-5,
        };
        assert_eq!(psgld(&typed), want);
        assert_eq!(
            psgld(&["--sampler", "psgld"]),
            bnn::sampler::SamplerParams::defaults(bnn::sampler::SamplerKind::Psgld).unwrap()
        );
        // HMC's options reach its settings.
        let hmc = settings_for(&["--sampler", "hmc", "--trajectory-length", "2"]).hmc;
        assert_eq!(hmc.map(|h| h.trajectory_length), Some(2.0));
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

    /// The prior's flags: each parameter not given takes its default, and `--prior-std`
    /// alone asks for the Gaussian prior (it used to be dropped for the Gamma default).
    #[test]
    fn prior_flags_fill_in_their_defaults() {
        let prior = |flags: &[&str]| settings_for(flags).prior;
        assert_eq!(prior(&[]), PriorSpec::DEFAULT);
        assert_eq!(
            prior(&["--prior-std", "0.5"]),
            PriorSpec::Gaussian { std: 0.5 }
        );
        assert_eq!(
            prior(&["--prior", "gaussian"]),
            PriorSpec::Gaussian {
                std: PriorSpec::DEFAULT_STD
            }
        );
        assert_eq!(
            prior(&["--gamma-shape", "2"]),
            PriorSpec::Gamma {
                shape: 2.0,
                rate: PriorSpec::DEFAULT_RATE
            }
        );
        // Named, the kind wins over a parameter of the other kind.
        assert_eq!(
            prior(&["--prior", "gamma", "--prior-std", "0.5"]),
            PriorSpec::DEFAULT
        );
    }

    /// The replica flags fill in `ReplicaOptions`' defaults, and `--ladder auto` is the
    /// adapting ladder.
    #[test]
    fn replica_flags_fill_in_their_defaults() {
        let s = settings_for(&["--sampler", "renhd", "--ladder", "auto", "--replicas", "4"]);
        let want = bnn::sampler::replica::ReplicaOptions {
            replicas: 4,
            ladder: None,
            ..Default::default()
        };
        assert_eq!(s.replicas, Some(want));
        assert_eq!(settings_for(&["--sampler", "sghmc"]).replicas, None);
    }
}
