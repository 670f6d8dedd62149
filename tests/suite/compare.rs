//! `bnn compare`: a run against a reference on the same test set — itself gives agreement
//! 1 and distance 0, another chain a small positive distance — and runs on different data
//! or splits refused in one line.

use crate::common::{fails_with, run_ok};
use std::path::Path;

fn train(dir: &std::path::Path, name: &str, extra: &[&str]) {
    let base = ["train", "--out", "runs", "--run-name", name];
    run_ok(dir, &[&base[..], extra].concat());
}

#[test]
fn compare_measures_agreement_and_distance_and_refuses_other_data() {
    let d = tempfile::tempdir().unwrap();
    let mut text = String::from("a,b,class\n");
    for i in 0..200 {
        let (a, b) = ((i * 37 % 101) as f64 / 101.0, (i * 53 % 97) as f64 / 97.0);
        text.push_str(&format!("{a},{b},{}\n", u8::from(a + b > 1.0)));
    }
    std::fs::write(d.path().join("t.csv"), text).unwrap();
    let table = [
        "--csv", "t.csv", "--target", "class", "--epochs", "200", "--burnin", "50", "--thin", "30",
    ];
    train(
        d.path(),
        "a",
        &[&table[..], &["--split-seed", "1", "--seed", "1"]].concat(),
    );
    train(
        d.path(),
        "b",
        &[&table[..], &["--split-seed", "1", "--seed", "2"]].concat(),
    );
    train(
        d.path(),
        "other",
        &[&table[..], &["--split-seed", "2"]].concat(),
    );
    let cmp = |run: &str, reference: &str| {
        let (r, f) = (format!("runs/{run}"), format!("runs/{reference}"));
        run_ok(d.path(), &["compare", &r, "--reference", &f])
    };
    let same = cmp("a", "a");
    assert_eq!(same["agreement"], 1.0);
    assert_eq!(same["total_variation"], 0.0);
    let two = cmp("b", "a");
    let tv = two["total_variation"].as_f64().unwrap();
    // Two chains of one posterior: close, not identical.
    assert!(tv > 0.0 && tv < 0.2, "{two}");
    assert!(two["agreement"].as_f64().unwrap() > 0.8, "{two}");
    fails_with(
        d.path(),
        &["compare", "runs/other", "--reference", "runs/a"],
        &["not trained and scored on the same data", "split seeded 2"],
    );

    // A regression: W₂ between the mixtures, 0 against itself.
    let toy = [
        "--toy",
        "regression-1d",
        "--epochs",
        "400",
        "--burnin",
        "100",
        "--thin",
        "30",
    ];
    train(
        d.path(),
        "r1",
        &[&toy[..], &["--seed", "0", "--split-seed", "0"]].concat(),
    );
    train(
        d.path(),
        "r2",
        &[&toy[..], &["--seed", "1", "--split-seed", "0"]].concat(),
    );
    assert_eq!(cmp("r1", "r1")["wasserstein2"], 0.0);
    let w = cmp("r2", "r1")["wasserstein2"].as_f64().unwrap();
    assert!(w > 0.0 && w < 0.5, "{w}");
    fails_with(
        d.path(),
        &["compare", "runs/r1", "--reference", "runs/a"],
        &["not trained and scored on the same data"],
    );
}

/// `--train-limit N` trains on the first N training images: run.json records N as the
/// run's training examples, `bnn eval` rereads that subset, and `bnn compare` refuses a
/// reference trained on another subset (another posterior); 0 is refused, as are more
/// images than there are. On a table it keeps the first rows after the split, likewise.
#[test]
fn train_limit_keeps_the_first_images_and_compare_refuses_another_subset() {
    let d = tempfile::tempdir().unwrap();
    // Two epochs, one of burn-in, every sample kept.
    let short = [
        "--epochs",
        "2",
        "--burnin",
        "1",
        "--thin",
        "1",
        "--no-progress",
    ];
    let images = [&["--dataset", "mnist-mini"][..], &short].concat();
    train(
        d.path(),
        "small",
        &[&images[..], &["--train-limit", "500"]].concat(),
    );
    train(d.path(), "full", &images);
    check_subset(d.path(), ("small", "full"), 500, "500 training images");
    let summary = read_json(&d.path().join("runs/small/summary.json"));
    // 500 images in minibatches of 100: 5 updates per epoch.
    assert_eq!(summary["steps"], 10);
    for n in ["0", "1000000"] {
        fails_with(
            d.path(),
            &[&["train"][..], &images, &["--train-limit", n]].concat(),
            &[&format!("--train-limit {n}"), "training examples"],
        );
    }
    let toy = [&["--toy", "regression-1d"][..], &short].concat();
    let limited = [&toy[..], &["--train-limit", "10", "--batch-size", "10"]].concat();
    train(d.path(), "toy-10", &limited);
    train(d.path(), "toy", &toy);
    let manifest = check_subset(d.path(), ("toy-10", "toy"), 10, "10 training rows");
    assert_eq!(manifest["table"]["train_limit"], 10);
    fails_with(
        d.path(),
        &[&["train"][..], &toy, &["--train-limit", "1"]].concat(),
        &["--train-limit 1", "training rows; give 2 to"],
    );
}

fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Run `small` of a training subset: run.json records its `n` examples, `bnn eval`
/// rereads them, and `bnn compare` against `full` refuses, naming the subset (`words`).
fn check_subset(dir: &Path, (small, full): (&str, &str), n: u64, words: &str) -> serde_json::Value {
    let manifest = read_json(&dir.join(format!("runs/{small}/run.json")));
    assert_eq!(manifest["train_examples"], n);
    run_ok(dir, &["eval", "--run", &format!("runs/{small}")]);
    let (run, reference) = (format!("runs/{small}"), format!("runs/{full}"));
    fails_with(
        dir,
        &["compare", &run, "--reference", &reference],
        &["not trained and scored on the same data", words],
    );
    manifest
}
