//! Regression and tables of one's own through the command line: bad CSV refused in one
//! line, a k-class table and a regression trained, evaluated again and resumed bit for
//! bit, and the 1-D toy's band widening away from the data.

use std::path::Path;

use crate::common::{fails_with, gzip, run_ok};

#[test]
fn bad_csv_input_gets_one_line_and_exit_1() {
    let d = tempfile::tempdir().unwrap();
    let write = |name: &str, bytes: &[u8]| {
        std::fs::write(d.path().join(name), bytes).unwrap();
        name.to_string()
    };
    // Ten bytes of CSV whose gzip trailer declares 2 GB (ISIZE = 2³¹).
    let mut lying = gzip(b"a,y\n10,20\n");
    let n = lying.len();
    lying[n - 4..].copy_from_slice(&(1u32 << 31).to_le_bytes());
    let cases = [
        (
            write("text.csv", b"a,y\n1,2\nfoo,3\n"),
            "line 3, column 1 (`a`): `foo` is not a number",
        ),
        (
            write("ragged.csv", b"a,y\n1,2\n3\n"),
            "line 3 has 1 cells, the header 2",
        ),
        (write("empty.csv", b""), "empty: no header row"),
        (
            write("notarget.csv", b"a,b\n1,2\n"),
            "no column `y` to predict",
        ),
        (
            write("nan.csv", b"a,y\n1,2\nNaN,3\n"),
            "`NaN` is not a finite number",
        ),
        (
            write("missing.csv", b"a,y\n1,2\n,3\n"),
            "empty (a missing value)",
        ),
        (write("lying.csv.gz", &lying), "cannot read"),
    ];
    for (file, needle) in cases {
        let out = d.path().join("runs");
        let args = [
            "train",
            "--csv",
            &file,
            "--target",
            "y",
            "--out",
            out.to_str().unwrap(),
        ];
        fails_with(d.path(), &args, &[&file, needle]);
    }
    // --noise-std is for a regression; --valid is for images.
    let classes = write("classes.csv", b"a,y\n1,0\n2,1\n3,0\n4,1\n5,0\n");
    fails_with(
        d.path(),
        &[
            "train",
            "--csv",
            &classes,
            "--target",
            "y",
            "--noise-std",
            "1",
        ],
        &["--noise-std is for a regression"],
    );
    fails_with(
        d.path(),
        &["train", "--csv", &classes, "--target", "y", "--valid", "1"],
        &["--valid, --standardize and --augment are for images"],
    );
}

/// A three-class table whose class is which third of the line a + b the row lies in.
fn three_classes(dir: &Path) -> String {
    let mut text = String::from("a,b,noise,class\n");
    for i in 0..300 {
        let (a, b) = ((i * 37 % 101) as f64 / 101.0, (i * 53 % 97) as f64 / 97.0);
        let class = ((a + b) / 2.0 * 3.0).floor().min(2.0);
        text.push_str(&format!("{a},{b},{},{class}\n", (i * 17 % 13) as f64));
    }
    std::fs::write(dir.join("three.csv"), text).unwrap();
    "three.csv".into()
}

#[test]
fn a_k_class_table_trains_and_evaluates_on_its_recorded_split() {
    let d = tempfile::tempdir().unwrap();
    let csv = three_classes(d.path());
    let common = [
        "--csv",
        &csv,
        "--target",
        "class",
        "--out",
        "runs",
        "--run-name",
        "t",
    ];
    let fast = [
        "--epochs",
        "400",
        "--burnin",
        "100",
        "--thin",
        "30",
        "--split-seed",
        "3",
    ];
    let s = run_ok(d.path(), &[&["train"][..], &common, &fast].concat());
    let acc = s["ensemble"]["accuracy"].as_f64().unwrap();
    // 60 test rows of a rule two features decide: a chance classifier gets ⅓.
    assert!(acc > 0.85, "{s}");
    let run = d.path().join("runs/t");
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("run.json")).unwrap()).unwrap();
    assert_eq!(manifest["num_classes"], 3);
    assert_eq!(manifest["task"]["kind"], "classification");
    assert_eq!(manifest["table"]["test_rows"].as_array().unwrap().len(), 60);
    // `bnn eval` rebuilds the same split from run.json and gets the same ensemble.
    let e = run_ok(d.path(), &["eval", "--run", run.to_str().unwrap()]);
    assert_eq!(e["ensemble"], s["ensemble"]);
    // Another split seed draws other rows.
    let other = run_ok(
        d.path(),
        &[
            &["train"][..],
            &common,
            &fast[..4],
            &["--split-seed", "4", "--run-name", "u"],
        ]
        .concat(),
    );
    let rows = |name: &str| {
        let m: serde_json::Value = serde_json::from_slice(
            &std::fs::read(d.path().join("runs").join(name).join("run.json")).unwrap(),
        )
        .unwrap();
        m["table"]["test_rows"].clone()
    };
    assert_ne!(rows("t"), rows("u"), "{other}");
}

/// The regression-1d toy with its built-in defaults: the ensemble's predictive σ at x = 0
/// (the gap) and at x = ±1.5 (beyond the data) is at least 3× its mean σ on the data
/// (measured 4.7–6.9× on seeds 0–2, docs/BENCHMARKS.md); the picture is drawn as PNG of
/// at least 800×600 and SVG; `bnn eval` gives the training summary's metrics exactly.
#[test]
fn the_toy_regression_band_widens_away_from_the_data() {
    let d = tempfile::tempdir().unwrap();
    let s = run_ok(
        d.path(),
        &[
            "train",
            "--toy",
            "regression-1d",
            "--out",
            "runs",
            "--run-name",
            "toy",
        ],
    );
    assert_eq!(s["samples"], 100);
    let run = d.path().join("runs/toy");
    let e = run_ok(d.path(), &["eval", "--run", run.to_str().unwrap()]);
    assert_eq!(e["regression"], s["regression"]);
    let p = run_ok(d.path(), &["plot", "--run", run.to_str().unwrap()]);
    let written: Vec<String> = serde_json::from_value(p["written"].clone()).unwrap();
    let png = written
        .iter()
        .find(|w| w.ends_with("regression_band.png"))
        .expect("the band");
    assert!(written.iter().any(|w| w.ends_with("regression_band.svg")));
    let bytes = std::fs::read(png).unwrap();
    let dim = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
    assert!(dim(16) >= 800 && dim(20) >= 600, "{}×{}", dim(16), dim(20));

    let band: bnn::band::Band =
        serde_json::from_slice(&std::fs::read(run.join("eval/regression_band.json")).unwrap())
            .unwrap();
    let on_data: Vec<f64> = band
        .x
        .iter()
        .zip(&band.std)
        .filter(|(x, _)| (0.3..=1.0).contains(&x.abs()))
        .map(|(_, s)| *s)
        .collect();
    let data_sd = on_data.iter().sum::<f64>() / on_data.len() as f64;
    for x in [0.0, -1.5, 1.5] {
        let ratio = band.std_at(x) / data_sd;
        assert!(
            ratio >= 3.0,
            "σ at x = {x} is {ratio:.2}× the σ on the data"
        );
    }
    // The last sample alone has no epistemic part: its band is its noise, 0.1 everywhere.
    assert!(band.sample_std.iter().all(|&s| (s - 0.1).abs() < 1e-9));
}

/// Runs `args(name, epochs)` to 120 epochs in one go, and to 60 then resumed to 120:
/// the summaries' `regression` and the sample files under `samples` must be the same.
/// Returns the whole run's summary.
fn resumes_to_the_whole_run(
    d: &Path,
    args: impl Fn(&str, &str) -> Vec<String>,
    samples: &str,
) -> serde_json::Value {
    let run = |v: Vec<String>| run_ok(d, &v.iter().map(String::as_str).collect::<Vec<_>>());
    let whole = run(args("whole", "120"));
    run(args("part", "60"));
    let part = d.join("runs/part");
    let resume = [
        "train",
        "--resume",
        part.to_str().unwrap(),
        "--epochs",
        "120",
    ];
    let resumed = run_ok(d, &resume);
    assert_eq!(resumed["regression"], whole["regression"]);
    let files = |run: &str| {
        let dir = d.join("runs").join(run).join(samples);
        let mut names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        names.sort();
        names
            .iter()
            .map(|p| std::fs::read(p).unwrap())
            .collect::<Vec<_>>()
    };
    assert!(!files("whole").is_empty());
    assert_eq!(files("whole"), files("part"));
    whole
}

/// A regression stopped and resumed gives the samples and ensemble of the run done in
/// one go, bit for bit (the mixture's sums are in the saved state).
#[test]
fn a_regression_resumes_bit_for_bit() {
    let d = tempfile::tempdir().unwrap();
    let args = |name: &str, epochs: &str| {
        let v = [
            "train",
            "--toy",
            "regression-1d",
            "--noise-std",
            "0.3",
            "--epochs",
            epochs,
            "--burnin",
            "20",
            "--thin",
            "10",
            "--out",
            "runs",
            "--run-name",
            name,
        ];
        v.map(String::from).to_vec()
    };
    let whole = resumes_to_the_whole_run(d.path(), args, "samples");
    assert_eq!(whole["samples"], 10);
}

/// Replica exchange on a regression with σ sampled (each replica's τ is part of the state
/// the exchange compares): the T₀ chain's mixture is the run's, `bnn eval` gives it bit
/// for bit, and a run stopped at 60 epochs and resumed to 120 gives the samples and
/// ensemble of the run done in one go (the noise precisions are in the saved state).
#[test]
fn a_regression_runs_replica_exchange_and_resumes() {
    let d = tempfile::tempdir().unwrap();
    let mut text = String::from("x1,x2,y\n");
    for i in 0..200 {
        let (a, b) = ((i * 37 % 101) as f64 / 101.0, (i * 53 % 97) as f64 / 97.0);
        let y = (3.0 * a).sin() + b * b + 0.1 * ((i * 17 % 13) as f64 / 13.0 - 0.5);
        text.push_str(&format!("{a},{b},{y}\n"));
    }
    std::fs::write(d.path().join("reg.csv"), text).unwrap();
    let args = |name: &str, epochs: &str| {
        let v = [
            "train",
            "--csv",
            "reg.csv",
            "--target",
            "y",
            "--hidden",
            "20",
            "--sampler",
            "renhd",
            "--replicas",
            "3",
            "--batch-size",
            "40",
            // 160 training rows: 4 updates an epoch, so rounds of 20 updates end at the
            // stop after 60 epochs as they do in the whole run.
            "--exchange-every",
            "20",
            "--epochs",
            epochs,
            "--burnin",
            "20",
            "--thin",
            "40",
            "--out",
            "runs",
            "--run-name",
            name,
        ];
        v.map(String::from).to_vec()
    };
    let whole = resumes_to_the_whole_run(d.path(), args, "chain-0/samples");
    let rmse = whole["regression"]["rmse"].as_f64().unwrap();
    assert!(rmse.is_finite() && rmse > 0.0, "{whole}");
    let dir = d.path().join("runs/whole");
    let eval = run_ok(d.path(), &["eval", "--run", dir.to_str().unwrap()]);
    assert_eq!(eval["regression"], whole["regression"]);
}
