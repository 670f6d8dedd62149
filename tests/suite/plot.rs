//! `bnn plot`: every picture is drawn from a short run and its evaluations, as a PNG of at
//! least 800×600 that decodes and an SVG that parses.

use crate::common;

use std::path::Path;

use common::{bnn, real_data, run_ok, stderr};

/// Decodes `stem.png` and parses `stem.svg` in `dir`.
fn check_picture(dir: &Path, stem: &str) {
    let png = dir.join(format!("{stem}.png"));
    let file = std::fs::File::open(&png).unwrap_or_else(|e| panic!("{}: {e}", png.display()));
    let mut reader = png::Decoder::new(std::io::BufReader::new(file))
        .read_info()
        .unwrap_or_else(|e| panic!("{}: {e}", png.display()));
    let mut pixels = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut pixels).unwrap();
    assert!(
        info.width >= 800 && info.height >= 600,
        "{stem}: {}×{}",
        info.width,
        info.height
    );
    // Not a blank canvas: some pixels are not white.
    assert!(pixels.iter().any(|&b| b < 200), "{stem}.png is blank");
    let svg = std::fs::read_to_string(dir.join(format!("{stem}.svg"))).unwrap();
    let doc = roxmltree::Document::parse(&svg).unwrap_or_else(|e| panic!("{stem}.svg: {e}"));
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    // Titles and axes are text.
    assert!(
        doc.descendants().filter(|n| n.has_tag_name("text")).count() > 5,
        "{stem}.svg"
    );
}

fn written(report: &serde_json::Value) -> Vec<String> {
    report["written"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap().to_string())
        .collect()
}

/// Two chains on the built-in subset, evaluated under rotation and against
/// Fashion-MNIST: learning curves, dynamics, ensemble size, reliability, chains, rotation
/// and out-of-distribution pictures.
#[test]
fn plot_draws_the_pictures_of_a_run_and_its_evaluations() {
    let fashion = real_data("fashion-mnist");
    let d = tempfile::tempdir().unwrap();
    let train = [
        "train",
        "--dataset",
        "mnist-mini",
        "--epochs",
        "3",
        "--burnin",
        "1",
        "--thin",
        "30",
        "--chains",
        "2",
        "--run-name",
        "c",
    ];
    run_ok(d.path(), &train);
    let mut eval = vec!["eval", "--run", "checkpoints/c", "--shift", "rotate"];
    let dir = fashion.as_ref().map(|f| f.to_str().unwrap().to_string());
    if let Some(f) = &dir {
        eval.extend(["--ood-dataset", "fashion-mnist", "--ood-data-dir", f]);
    }
    run_ok(d.path(), &eval);
    let report = run_ok(d.path(), &["plot", "--run", "checkpoints/c"]);
    let out = d.path().join("checkpoints/c/plots");
    let mut stems = vec![
        "learning_curves",
        "dynamics",
        "ensemble_size",
        "reliability",
        "chains",
        "rotation",
    ];
    if dir.is_some() {
        stems.push("ood-fashion-mnist");
    }
    for stem in &stems {
        check_picture(&out, stem);
    }
    assert_eq!(written(&report).len(), 2 * stems.len(), "{report}");
    let skipped = report["skipped"].to_string();
    assert!(skipped.contains("replicas"), "{skipped}");

    // --out elsewhere.
    let report = run_ok(
        d.path(),
        &["plot", "--run", "checkpoints/c", "--out", "pictures"],
    );
    assert!(
        written(&report).iter().all(|p| p.starts_with("pictures/")),
        "{report}"
    );
    check_picture(&d.path().join("pictures"), "chains");
}

/// A replica-exchange run: its ladder, swap rates and temperatures held.
#[test]
fn plot_draws_a_replica_ladder() {
    let d = tempfile::tempdir().unwrap();
    run_ok(
        d.path(),
        &[
            "train",
            "--dataset",
            "mnist-mini",
            "--epochs",
            "2",
            "--burnin",
            "1",
            "--thin",
            "30",
            "--sampler",
            "renhd",
            "--replicas",
            "3",
            "--prior",
            "gaussian",
            "--run-name",
            "r",
        ],
    );
    let report = run_ok(d.path(), &["plot", "--run", "checkpoints/r"]);
    check_picture(&d.path().join("checkpoints/r/plots"), "replicas");
    assert!(report["skipped"]
        .to_string()
        .contains("rotation: no eval/shift-rotate.json"));
}

/// A folder that is no finished run: one line, exit 1, nothing drawn.
#[test]
fn plot_refuses_a_folder_that_is_not_a_run() {
    let d = tempfile::tempdir().unwrap();
    std::fs::create_dir(d.path().join("empty")).unwrap();
    let out = bnn(d.path(), &["plot", "--run", "empty"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("summary.json") && err.contains("finished `bnn train` run"),
        "{err}"
    );
    assert!(!d.path().join("empty/plots").exists());
}

/// `bnn sample --plot DIR`: the double well's histogram against its density.
#[test]
fn sample_draws_its_histogram_against_the_true_density() {
    let d = tempfile::tempdir().unwrap();
    let report = run_ok(
        d.path(),
        &[
            "sample",
            "--potential",
            "double-well",
            "--sampler",
            "sghmc",
            "--steps",
            "20000",
            "--burnin",
            "1000",
            "--plot",
            "pictures",
        ],
    );
    check_picture(&d.path().join("pictures"), "sample");
    // The marginal drawn: densities that integrate to the mass inside the grid.
    let m = &report["marginals"][0];
    let centers = m["centers"].as_array().unwrap();
    let width = centers[1].as_f64().unwrap() - centers[0].as_f64().unwrap();
    for key in ["sampled", "truth"] {
        let mass: f64 = m[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() * width)
            .sum();
        assert!((mass - 1.0).abs() < 0.01, "{key}: {mass}");
    }
}
