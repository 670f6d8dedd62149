//! Presets carry training defaults (`[train]`); flags on the command line win, and the
//! run records the merged settings.

use crate::common;

use common::{bnn, stderr};

/// A small MLP preset with training defaults for SGNHT.
const PRESET: &str = r#"
[model]
kind = "mlp"
hidden = [16]
activation = "relu"

[train]
sampler = "sgnht"
step_size = 1e-6
diffusion = 0.05
batch_size = 50
epochs = 2
burnin = 1
thin = 100
decay_at = []
prior = { kind = "gaussian", std = 0.5 }
standardize = true
chains = 2
"#;

fn run_json(dir: &std::path::Path, name: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(dir.join(name).join("run.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn train(dir: &std::path::Path, name: &str, extra: &[&str]) {
    let preset = dir.join("p.toml");
    let out = dir.join("runs");
    let mut args = vec![
        "train",
        "--dataset",
        "mnist-mini",
        "--offline",
        "--no-progress",
        "--config",
        preset.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--run-name",
        name,
    ];
    args.extend(extra);
    let o = bnn(dir, &args);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn preset_defaults_apply_and_flags_override_them() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("p.toml"), PRESET).unwrap();
    let runs = d.path().join("runs");

    train(d.path(), "preset", &[]);
    let r = run_json(&runs, "preset");
    assert_eq!(r["sampler"]["kind"], "sgnht");
    assert_eq!(r["sampler"]["step_size"], 1e-6);
    assert_eq!(r["sampler"]["diffusion"], 0.05);
    assert_eq!(r["batch_size"], 50);
    assert_eq!(r["epochs"], 2);
    assert_eq!(r["burnin"], 1);
    assert_eq!(r["thin"], 100);
    assert_eq!(r["decay_at"], serde_json::json!([]));
    assert_eq!(
        r["prior"],
        serde_json::json!({"kind": "gaussian", "std": 0.5})
    );
    assert!(r["standardization"].is_object(), "{r}");
    assert_eq!(r["chains"], 2);
    assert!(runs.join("preset/chain-1/samples").is_dir());

    // Flags win; another sampler drops the preset's SGNHT settings for its own defaults.
    train(
        d.path(),
        "flags",
        &[
            "--batch-size",
            "25",
            "--sampler",
            "sghmc",
            "--prior",
            "gamma",
        ],
    );
    let r = run_json(&runs, "flags");
    assert_eq!(r["batch_size"], 25);
    assert_eq!(r["sampler"]["kind"], "sghmc");
    assert_eq!(r["sampler"]["step_size"], 2e-6, "SGHMC's own default");
    assert_eq!(r["prior"]["kind"], "gamma");
    assert_eq!(r["chains"], 1, "the preset's chains go with its sampler");
    assert_eq!(
        r["epochs"], 2,
        "the preset's, not given on the command line"
    );
    // A flag equal to the clap default still counts as given.
    train(d.path(), "explicit", &["--epochs", "50", "--burnin", "10"]);
    assert_eq!(run_json(&runs, "explicit")["epochs"], 50);
}

#[test]
fn bad_training_sections_are_one_line_errors() {
    let d = tempfile::tempdir().unwrap();
    let model = "[model]\nkind = \"mlp\"\nhidden = [4]\nactivation = \"relu\"\n";
    let mlp = |line: &str| format!("[model]\nkind = \"mlp\"\nactivation = \"relu\"\n{line}\n");
    let cnn = |line: &str| {
        format!("[model]\nkind = \"cnn\"\nhidden = [8]\nactivation = \"relu\"\n{line}\n")
    };
    let cases = [
        (
            format!("{model}[train]\nbatch_size = 0\n"),
            "batch_size must be at least 1",
        ),
        (
            format!("{model}[train]\nchains = 0\n"),
            "chains must be at least 1",
        ),
        (
            format!("{model}[train]\nstep_size = -1e-6\n"),
            "step_size must be a positive number",
        ),
        (
            format!("{model}[train]\nstepsize = 1e-6\n"),
            "unknown field `stepsize`",
        ),
        (
            format!("{model}[train]\nepochs = \"many\"\n"),
            "not a preset",
        ),
        (
            format!("{model}[train]\nsampler = \"nuts\"\n"),
            "not a preset",
        ),
        // The [model] table: unknown keys, wrong types, zero, negative and absurd sizes.
        (mlp("hidden = [4]\nwidht = 3"), "unknown field `widht`"),
        (mlp("hidden = \"wide\""), "not a preset"),
        (mlp("hidden = [0]"), "hidden widths must be positive"),
        (mlp("hidden = [-3]"), "not a preset"),
        (mlp("hidden = [100000]"), "at most 65536"),
        (mlp("hidden = [4]\nkind = \"mlp\""), "not a preset"),
        (
            cnn("conv = [6, 16]\nkernel_size = 40"),
            "kernel_size 40: at most 31",
        ),
        (cnn("conv = [0, 16]"), "conv"),
        ("[model\nkind = \"mlp\"".to_string(), "line 1: not a preset"),
    ];
    for (text, needle) in cases {
        let train = &text;
        let p = d.path().join("bad.toml");
        std::fs::write(&p, &text).unwrap();
        let o = bnn(
            d.path(),
            &[
                "train",
                "--dataset",
                "mnist-mini",
                "--offline",
                "--config",
                p.to_str().unwrap(),
            ],
        );
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{train}: {err}");
        assert!(
            err.contains("bad.toml") && err.contains(needle),
            "{train}: {err}"
        );
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    }
}
