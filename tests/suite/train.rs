//! Short real-data runs: accuracy, reproducibility, and `bnn eval` against the in-training
//! ensemble.

use crate::common;

use common::{bnn, last_json, real_data, stderr};
use serde_json::Value;

const METRICS: [&str; 4] = ["accuracy", "nll", "ece", "brier"];

fn train(cwd: &std::path::Path, extra: &[&str]) -> Value {
    let mut args = vec!["train", "--no-progress"];
    args.extend_from_slice(extra);
    let out = bnn(cwd, &args);
    assert!(
        out.status.success(),
        "bnn {args:?} failed: {}",
        stderr(&out)
    );
    last_json(&out)
}

/// The built-in subset (10,000 real MNIST training images, 1,000 held out): SGHMC with the
/// default hyper-parameters for 10 epochs (900 updates). Measured with seed 3: ensemble
/// 91.5% test, 92.0% validation. Chance is 10%; a sampler with a wrong sign or scale stays
/// far below 90% or diverges.
#[test]
fn builtin_subset_run_is_accurate_reproducible_and_evaluable() {
    let d = tempfile::tempdir().unwrap();
    let args = [
        "--dataset",
        "mnist-mini",
        "--epochs",
        "10",
        "--burnin",
        "5",
        "--thin",
        "25",
        "--valid",
        "1000",
        "--seed",
        "3",
    ];
    let mut a = args.to_vec();
    a.extend(["--run-name", "a"]);
    let s1 = train(d.path(), &a);
    assert_eq!(s1["dataset"], "mnist-mini");
    // 90 updates per epoch; samples at steps 475, 500, ..., 900 after the 450 of burn-in.
    assert_eq!(s1["samples"], 18);
    let ens = s1["ensemble"]["accuracy"].as_f64().unwrap();
    assert!(ens >= 0.90, "ensemble accuracy {ens}");
    assert!(s1["valid_ensemble"]["accuracy"].as_f64().unwrap() >= 0.90);
    let run = d.path().join("checkpoints/a");
    for f in ["run.json", "metrics.jsonl", "summary.json"] {
        assert!(run.join(f).is_file(), "{f} missing");
    }
    let lines = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    assert_eq!(lines.lines().count(), 10);

    // Same seed, another folder: the same metrics and the same sample files, bit for bit.
    let mut b = args.to_vec();
    b.extend(["--run-name", "b"]);
    let s2 = train(d.path(), &b);
    for m in METRICS {
        assert_eq!(s1["ensemble"][m], s2["ensemble"][m], "{m}");
        assert_eq!(s1["last_sample"][m], s2["last_sample"][m], "{m}");
    }
    let files_a = bnn::checkpoint::list_samples(&run).unwrap();
    let files_b = bnn::checkpoint::list_samples(&d.path().join("checkpoints/b")).unwrap();
    assert_eq!(files_a.len(), files_b.len());
    for (x, y) in files_a.iter().zip(&files_b) {
        assert_eq!(
            std::fs::read(x).unwrap(),
            std::fs::read(y).unwrap(),
            "{}",
            x.display()
        );
    }

    // `bnn eval` on the saved samples gives exactly the in-training ensemble.
    let out = bnn(d.path(), &["eval", "--run", "checkpoints/a"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let e = last_json(&out);
    assert_eq!(e["samples"], s1["samples"]);
    for m in METRICS {
        assert_eq!(e["ensemble"][m], s1["ensemble"][m], "{m}");
        assert_eq!(e["last_sample"][m], s1["last_sample"][m], "{m}");
        assert_eq!(e["valid_ensemble"][m], s1["valid_ensemble"][m], "{m}");
    }
    let progress = e["progress"].as_array().unwrap();
    assert_eq!(progress.len(), 18);
    assert_eq!(
        progress.last().unwrap()["accuracy"],
        s1["ensemble"]["accuracy"]
    );

    // A different seed gives a different chain.
    let mut c = args.to_vec();
    let seed = c.iter().position(|a| *a == "--seed").unwrap();
    c[seed + 1] = "4";
    c.extend(["--run-name", "c"]);
    let s3 = train(d.path(), &c);
    assert_ne!(s1["ensemble"]["nll"], s3["ensemble"]["nll"]);
}

/// Every sampler runs on real data with its defaults and beats chance by far after three
/// short epochs (300 updates on the built-in subset). Measured: 86–90% for all five.
#[test]
fn every_sampler_learns() {
    let d = tempfile::tempdir().unwrap();
    for sampler in ["sgld", "sghmc", "sgnht", "sgd", "momentum"] {
        let s = train(
            d.path(),
            &[
                "--dataset",
                "mnist-mini",
                "--sampler",
                sampler,
                "--epochs",
                "2",
                "--burnin",
                "1",
                "--thin",
                "50",
                "--hidden",
                "50",
                "--run-name",
                sampler,
            ],
        );
        let acc = s["ensemble"]["accuracy"].as_f64().unwrap();
        assert!(acc >= 0.83, "{sampler}: ensemble accuracy {acc}");
    }
}

/// Full MNIST from the shared data folder, 50k/10k split: two epochs of the default SGHMC.
#[test]
fn full_mnist_short_run() {
    let Some(dir) = real_data("mnist") else {
        return;
    };
    let d = tempfile::tempdir().unwrap();
    let s = train(
        d.path(),
        &[
            "--dataset",
            "mnist",
            "--data-dir",
            dir.to_str().unwrap(),
            "--valid",
            "10000",
            "--epochs",
            "2",
            "--burnin",
            "1",
        ],
    );
    assert_eq!(s["dataset"], "mnist");
    let ens = s["ensemble"]["accuracy"].as_f64().unwrap();
    assert!(ens >= 0.96, "ensemble accuracy {ens}");
    assert!(s["valid_ensemble"]["accuracy"].as_f64().unwrap() >= 0.96);
}

/// With no data anywhere and no network, `bnn train` falls back to the built-in subset and
/// says so in one line.
#[test]
fn no_data_falls_back_to_builtin_subset() {
    let d = tempfile::tempdir().unwrap();
    let out = bnn(
        d.path(),
        &[
            "train",
            "--offline",
            "--epochs",
            "2",
            "--burnin",
            "1",
            "--hidden",
            "16",
            "--batch-size",
            "500",
            "--thin",
            "10",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("training on the built-in subset"), "{err}");
    let s = last_json(&out);
    assert_eq!(s["dataset"], "mnist-mini");
    assert_eq!(s["data_source"], "built-in");
}

/// Trains with `args` once per backward path (run names `custom` and `autograd` in `dir`);
/// returns both summaries.
fn train_both_backwards(dir: &std::path::Path, args: &[&str]) -> [Value; 2] {
    ["custom", "autograd"].map(|backward| {
        let mut a = args.to_vec();
        a.extend(["--backward", backward, "--run-name", backward]);
        let s = train(dir, &a);
        assert_eq!(s["backward"], backward);
        s
    })
}

/// The two paths' ensemble accuracies agree within a point, and the custom one is ≥ 85%.
fn assert_trains_alike(runs: &[Value; 2]) {
    let acc = runs
        .each_ref()
        .map(|s| s["ensemble"]["accuracy"].as_f64().unwrap());
    assert!(acc[0] >= 0.85, "custom backward: accuracy {}", acc[0]);
    assert!(
        (acc[0] - acc[1]).abs() <= 0.01,
        "custom {} vs autograd {}",
        acc[0],
        acc[1]
    );
}

/// The hand-written CPU backward (the default) and candle's autograd train alike: same
/// seed, same noise, the gradients differ only by f32 rounding, so the two chains stay
/// close over 270 updates. Measured: 91.22% for both. 1 point of accuracy is far below
/// what a wrong gradient (sign, scale, prior or temperature term) costs.
#[test]
fn custom_backward_trains_like_autograd() {
    let d = tempfile::tempdir().unwrap();
    let runs = train_both_backwards(
        d.path(),
        &[
            "--dataset",
            "mnist-mini",
            "--epochs",
            "3",
            "--burnin",
            "1",
            "--thin",
            "30",
            "--temperature",
            "0.5",
        ],
    );
    assert_trains_alike(&runs);
}

/// `--standardize`: the per-pixel statistics go into run.json, `bnn eval` applies them
/// and reproduces the in-training ensemble exactly, and the chain differs from the one on
/// [0, 1] pixels. Three epochs on the built-in subset (270 updates), seed 5.
#[test]
fn standardized_run_is_recorded_and_evaluable() {
    let d = tempfile::tempdir().unwrap();
    let args = [
        "--dataset",
        "mnist-mini",
        "--epochs",
        "3",
        "--burnin",
        "1",
        "--thin",
        "30",
        "--valid",
        "1000",
        "--seed",
        "5",
    ];
    let mut a = args.to_vec();
    a.extend(["--standardize", "--run-name", "std"]);
    let s = train(d.path(), &a);
    assert_eq!(s["standardized_inputs"], true);
    let ens = s["ensemble"]["accuracy"].as_f64().unwrap();
    assert!(ens >= 0.85, "ensemble accuracy {ens}");

    let manifest: Value = serde_json::from_str(
        &std::fs::read_to_string(d.path().join("checkpoints/std/run.json")).unwrap(),
    )
    .unwrap();
    let st = &manifest["standardization"];
    assert_eq!(st["mean"].as_array().unwrap().len(), 784);
    assert_eq!(st["std"].as_array().unwrap().len(), 784);
    // The corner pixel is blank in every image: mean 0, deviation at the floor.
    assert_eq!(st["mean"][0], 0.0);
    assert!((st["std"][0].as_f64().unwrap() - 0.1).abs() < 1e-7);

    let out = bnn(d.path(), &["eval", "--run", "checkpoints/std"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let e = last_json(&out);
    for m in METRICS {
        assert_eq!(e["ensemble"][m], s["ensemble"][m], "{m}");
        assert_eq!(e["valid_ensemble"][m], s["valid_ensemble"][m], "{m}");
    }

    let mut b = args.to_vec();
    b.extend(["--run-name", "unit"]);
    let u = train(d.path(), &b);
    assert_eq!(u["standardized_inputs"], false);
    assert_ne!(u["ensemble"]["nll"], s["ensemble"]["nll"]);
}

/// A CNN from a preset file trains on real images with the hand-written backward and with
/// candle's autograd alike (same seed and noise; gradients differ by rounding, and by how a
/// tie in a pooling window is split), and `bnn eval` reproduces its ensemble from the
/// saved samples. Two epochs on the built-in subset (180 updates), seed 2. Measured:
/// 92.89% with both.
#[test]
fn cnn_trains_like_autograd_and_is_evaluable() {
    let d = tempfile::tempdir().unwrap();
    let preset = d.path().join("small-cnn.toml");
    std::fs::write(
        &preset,
        "[model]\nkind = \"cnn\"\nconv = [4, 8]\nkernel_size = 5\nhidden = [32]\nactivation = \"relu\"\n",
    )
    .unwrap();
    let runs = train_both_backwards(
        d.path(),
        &[
            "--dataset",
            "mnist-mini",
            "--config",
            preset.to_str().unwrap(),
            "--epochs",
            "2",
            "--burnin",
            "1",
            "--thin",
            "15",
            "--seed",
            "2",
        ],
    );
    assert_eq!(runs[0]["model_label"], "cnn5-c4-c8-32-relu");
    let out = bnn(d.path(), &["eval", "--run", "checkpoints/custom"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let e = last_json(&out);
    for m in METRICS {
        assert_eq!(e["ensemble"][m], runs[0]["ensemble"][m], "{m}");
    }
    assert_trains_alike(&runs);
}

/// `bnn bench train` times the LeNet preset (and no MLP with `--hidden ""`): one JSON row
/// per sampler with the step's FLOP as counted by hand for batch 8: convolutions
/// 2·8·2·(6·25·24²) + 2·8·3·(16·150·8²), fully connected 2·8·3·(256·120 + 120·84 + 84·10).
#[test]
fn bench_train_runs_the_cnn() {
    let d = tempfile::tempdir().unwrap();
    let out = bnn(
        d.path(),
        &[
            "bench",
            "train",
            "--hidden",
            "",
            "--cnn-batch",
            "8",
            "--repeats",
            "1",
            "--steps",
            "10",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let rows = last_json(&out);
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 2, "{rows:?}");
    let flop = 2.0 * 8.0 * 2.0 * (6.0 * 25.0 * 784.0)
        + 2.0 * 8.0 * 3.0 * (16.0 * 150.0 * 196.0)
        + 2.0 * 8.0 * 3.0 * (784.0 * 120.0 + 120.0 * 84.0 + 84.0 * 10.0);
    for row in rows {
        assert_eq!(row["model"], "cnn5p2-c6-c16-120-84-relu");
        assert_eq!(row["batch"], 8);
        assert_eq!(row["backward"], "custom");
        assert_eq!(row["flop_per_step"].as_f64().unwrap(), flop);
        assert!(row["steps_per_second"].as_f64().unwrap() > 0.0);
    }
}

/// `bnn bench gemm`: a census of the kernels of real steps. For the MLP 784-100-10 at
/// batch 100 and 1000 and LeNet at 64, each product of the step once per step, with
/// the layouts the passes use (the forward reads W transposed and skips the first
/// layer's zero pixels; the weight gradients read Δ transposed), the measured FMA peak
/// of the thread count it ran on and its fraction of it, and the zero-skipping rows. (No
/// bound on the fraction: the suite's other tests share the cores, and a peak timed while
/// they run can read below a product timed while they did not.) An unknown model is
/// refused in one line.
#[test]
fn bench_gemm_reports_each_product_of_the_steps_against_its_peak() {
    let d = tempfile::tempdir().unwrap();
    let out = bnn(
        d.path(),
        &[
            "bench",
            "gemm",
            "--repeats",
            "1",
            "--models",
            "mlp-100,lenet",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let report = last_json(&out);
    let peaks = report["peak"].as_array().unwrap();
    let products = report["products"].as_array().unwrap();
    for row in products {
        let peak = peaks
            .iter()
            .find(|p| p["threads"] == row["threads"])
            .unwrap_or_else(|| panic!("no peak for {row}"));
        let fraction = row["fraction_of_measured_peak"].as_f64().unwrap();
        let ours = row["bnn_gflop_per_s"].as_f64().unwrap();
        let measured = peak["measured_gflop_per_s"].as_f64().unwrap();
        assert!(
            (fraction - ours / measured).abs() <= 1e-12 * fraction,
            "{row}"
        );
        assert!(fraction.is_finite() && fraction > 0.0, "{row}");
        assert!(row["in_step_gflop_per_s"].as_f64().unwrap() > 0.0, "{row}");
        assert_eq!(row["calls_per_step"], 1.0, "{row}");
    }
    let shapes = |model: &str, batch: u64| -> Vec<(String, u64, u64, u64)> {
        products
            .iter()
            .filter(|r| r["model"] == model && r["batch"] == batch)
            .map(|r| {
                let n = |f: &str| r[f].as_u64().unwrap();
                (
                    r["product"].as_str().unwrap().to_string(),
                    n("m"),
                    n("k"),
                    n("n"),
                )
            })
            .collect()
    };
    for batch in [100, 1000] {
        let mlp = shapes("mlp-100", batch);
        // Forward of each layer, then the backward: ∇W₂ = Δ₂ᵀ·H, the input error Δ₂·W₂,
        // ∇W₁ = Δ₁ᵀ·X (skipping zeros).
        let want = [
            ("A·Bᵀ, skipping zeros", batch, 784, 100),
            ("A·Bᵀ", batch, 100, 10),
            ("Aᵀ·B", 10, batch, 100),
            ("A·B", batch, 10, 100),
            ("Aᵀ·B, skipping zeros", 100, batch, 784),
        ];
        let want: Vec<_> = want
            .iter()
            .map(|&(p, m, k, n)| (p.to_string(), m, k, n))
            .collect();
        assert_eq!(mlp, want, "batch {batch}");
    }
    // LeNet's two convolutions are products with their im2col matrices (k = C_in·5²).
    let lenet = shapes("lenet", 64);
    assert!(
        lenet.contains(&("A·B".into(), 6, 25, 64 * 28 * 28)),
        "{lenet:?}"
    );
    assert!(
        lenet.contains(&("A·B".into(), 16, 150, 64 * 14 * 14)),
        "{lenet:?}"
    );
    assert!(!report["first_layer_zero_skipping"]
        .as_array()
        .unwrap()
        .is_empty());
    let bad = bnn(d.path(), &["bench", "gemm", "--models", "vgg"]);
    assert!(!bad.status.success());
    let err = stderr(&bad);
    assert!(
        err.contains("no model `vgg`") && err.trim().lines().count() == 1,
        "{err}"
    );
}

/// metrics.jsonl records the step size actually used: under `--cycles` (η changes every
/// update) the epoch's first, last and mean; under the default step decay one value per
/// epoch, halved from `--decay-at` on, and no range.
#[test]
fn metrics_record_the_step_sizes_used() {
    let d = tempfile::tempdir().unwrap();
    let lines = |name: &str| -> Vec<Value> {
        std::fs::read_to_string(
            d.path()
                .join("checkpoints")
                .join(name)
                .join("metrics.jsonl"),
        )
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
    };
    let base = [
        "--dataset",
        "mnist-mini",
        "--offline",
        "--epochs",
        "4",
        "--burnin",
        "1",
    ];
    let mut args = base.to_vec();
    args.extend(["--cycles", "1", "--run-name", "cyc"]);
    train(d.path(), &args);
    let eta = 2e-6; // SGHMC's default
    for (e, m) in lines("cyc").iter().enumerate() {
        let first = m["step_size"].as_f64().unwrap();
        let last = m["step_size_last"]
            .as_f64()
            .expect("a range under --cycles");
        let mean = m["step_size_mean"].as_f64().unwrap();
        // One cosine cycle over 400 updates: η falls within every epoch.
        assert!(
            first > mean && mean > last,
            "epoch {e}: {first} {mean} {last}"
        );
        if e == 0 {
            assert_eq!(first, eta);
        }
    }
    let mut args = base.to_vec();
    args.extend(["--decay-at", "2", "--run-name", "dec"]);
    train(d.path(), &args);
    for (e, m) in lines("dec").iter().enumerate() {
        let want = if e < 2 { eta } else { eta * 0.5 };
        assert_eq!(m["step_size"].as_f64().unwrap(), want, "epoch {e}");
        assert!(m.get("step_size_last").is_none());
    }
}

/// SGD and momentum are point estimates: the prior is a fixed weight decay (no Gibbs step;
/// the Gamma prior's mean λ = shape/rate = 1 every epoch), while a sampler's precisions are
/// resampled every epoch.
#[test]
fn map_baselines_keep_a_fixed_weight_decay() {
    let d = tempfile::tempdir().unwrap();
    let precisions = |sampler: &str| -> Vec<Vec<f64>> {
        let args = [
            "--dataset",
            "mnist-mini",
            "--offline",
            "--epochs",
            "3",
            "--burnin",
            "1",
            "--sampler",
            sampler,
            "--run-name",
            sampler,
        ];
        train(d.path(), &args);
        std::fs::read_to_string(
            d.path()
                .join("checkpoints")
                .join(sampler)
                .join("metrics.jsonl"),
        )
        .unwrap()
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            v["prior_precisions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        })
        .collect()
    };
    for map in ["sgd", "momentum"] {
        for epoch in precisions(map) {
            assert!(epoch.iter().all(|&l| l == 1.0), "{map}: {epoch:?}");
        }
    }
    let sampled = precisions("sghmc");
    assert!(sampled.iter().flatten().any(|&l| l != 1.0), "{sampled:?}");
}

/// A ResNet from a preset file (narrow, so that it runs in seconds) trains on the built-in
/// subset with `--augment` and the preset's own `[train]` table, and `bnn eval` reproduces
/// the in-training ensemble to the bit: augmentation touches only the training images, and
/// the hand-written forward at evaluation is the one used in training. Measured: 80.47%
/// (seed 0; chance is 10%).
#[test]
fn resnet_run_is_evaluable_exactly() {
    let d = tempfile::tempdir().unwrap();
    let preset = d.path().join("tiny-resnet.toml");
    std::fs::write(
        &preset,
        "[model]\nkind = \"resnet\"\nstages = [4, 8, 8]\nblocks = 1\nnorm = \"frn\"\n\
         activation = \"swish\"\n[train]\nsampler = \"sghmc\"\nstep_size = 3e-5\n\
         batch_size = 50\nepochs = 2\nburnin = 0\nthin = 80\n",
    )
    .unwrap();
    let run = train(
        d.path(),
        &[
            "--dataset",
            "mnist-mini",
            "--config",
            preset.to_str().unwrap(),
            "--augment",
            "--run-name",
            "r",
        ],
    );
    assert_eq!(run["batch_size"], 50);
    assert_eq!(run["augment"], "shift-flip", "--augment alone");
    assert_eq!(run["samples"], 5, "400 updates, one kept every 80");
    let acc = run["ensemble"]["accuracy"].as_f64().unwrap();
    assert!(
        acc > 0.5,
        "a ResNet that learns nothing in 400 updates: {acc}"
    );
    let out = bnn(d.path(), &["eval", "--run", "checkpoints/r"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let e = last_json(&out);
    for m in METRICS {
        assert_eq!(e["ensemble"][m], run["ensemble"][m], "{m}");
    }
}

/// `--log-every N`: a line of `diagnostics.jsonl` every N updates with the minibatch
/// potential energy, the kinetic energy overall and per tensor (in parameter order) and
/// mSGNHT's thermostat mean and spread; mSGNHT holds every tensor near ½ (measured, seed
/// 0, after burn-in: 0.50–0.61, the 10-element fc2.bias 0.39–0.52) and does not warn. SGHMC with 1/10 of the default
/// friction heats the output layer (fc2.weight 1.9 per parameter at epoch 2) while the
/// overall mean, dominated by fc1.weight, stays in the band: one warning, naming the
/// tensor, once three epochs after burn-in have been seen.
#[test]
fn diagnostics_are_logged_and_a_hot_tensor_warns() {
    let d = tempfile::tempdir().unwrap();
    let run = |epochs: &str, extra: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_bnn"))
            .args([
                "train",
                "--dataset",
                "mnist-mini",
                "--epochs",
                epochs,
                "--burnin",
                "1",
            ])
            .args(["--thin", "30", "--no-progress"])
            .args(extra)
            .current_dir(d.path())
            .env_remove("BNN_DATA_DIR")
            .env("BNN_LOG", "warn")
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        (last_json(&out), stderr(&out))
    };
    let (s, err) = run(
        "3",
        &[
            "--sampler",
            "msgnht",
            "--step-size",
            "4e-7",
            "--log-every",
            "25",
            "--run-name",
            "m",
        ],
    );
    assert!(!err.contains("out of"), "{err}");
    let text = std::fs::read_to_string(d.path().join("checkpoints/m/diagnostics.jsonl")).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len() as u64, s["steps"].as_u64().unwrap() / 25);
    for (k, l) in lines.iter().enumerate() {
        assert_eq!(l["step"], 25 * (k as u64 + 1));
        assert!(l["potential_energy"].as_f64().unwrap().is_finite());
        let names: Vec<&str> = l["kinetic_per_tensor"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["tensor"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]);
        assert!(l["thermostat_spread"].as_f64().unwrap() > 0.0, "{l}");
    }

    // A tensor is judged on its mean over the epochs after burn-in, from the third on.
    let (_, err) = run("5", &["--friction", "0.01", "--run-name", "hot"]);
    let warnings: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("kinetic energy per parameter out of"))
        .collect();
    assert_eq!(warnings.len(), 1, "{err}");
    assert!(
        warnings[0].contains("fc2.weight") && !warnings[0].contains("overall"),
        "{err}"
    );
    // Once per epoch by default: one line per epoch.
    let text = std::fs::read_to_string(d.path().join("checkpoints/hot/diagnostics.jsonl")).unwrap();
    assert_eq!(text.lines().count(), 5);
}

/// The first command a new user runs (`bnn train`, no flags, no data, downloads failing)
/// is quiet: no warning, one line saying it uses the built-in subset; with `-v` the
/// download attempts show, each with its URL.
#[test]
fn first_run_is_quiet_and_says_why_at_v() {
    let d = tempfile::tempdir().unwrap();
    // A mirror that refuses at once stands for a machine without network.
    let mirror = "http://127.0.0.1:9";
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_bnn"))
            .args(args)
            .current_dir(d.path())
            .env_remove("BNN_DATA_DIR")
            .env_remove("BNN_LOG")
            .env("NO_COLOR", "1")
            .output()
            .expect("run bnn")
    };
    let out = run(&["train", "--mirror", mirror]);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(!err.contains("WARN"), "the default run warned:\n{err}");
    assert!(
        !err.contains(mirror),
        "download attempts shown without -v:\n{err}"
    );
    let fallback: Vec<_> = err
        .lines()
        .filter(|l| l.contains("built-in subset"))
        .collect();
    assert_eq!(fallback.len(), 1, "{err}");
    assert_eq!(last_json(&out)["dataset"], "mnist-mini");

    let out = run(&[
        "-v", "train", "--mirror", mirror, "--epochs", "1", "--burnin", "0",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.lines()
            .any(|l| l.contains("downloading") && l.contains(mirror)),
        "-v does not show the download attempts:\n{err}"
    );
}
