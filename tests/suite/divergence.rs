//! `--on-divergence rollback`: back to the last saved state with half the step size, at
//! most three times, the halved step size saved for `--resume`.
//!
//! SGD under the N(0, 1) prior on the built-in MNIST subset: at η = 1.25 the loss
//! overflows within ten updates (huge but finite parameters), at η = 0.625 it stays
//! finite (measured: 20 → 10 → 5 → 2.5 all overflow). SGD draws no noise, so a chain
//! rolled back to its first state and run at η/2 is the chain started at η/2.

use crate::common;

use std::path::Path;

use common::{bnn, run_ok, stderr};

const RUN: [&str; 16] = [
    "train",
    "--dataset",
    "mnist-mini",
    "--sampler",
    "sgd",
    "--prior",
    "gaussian",
    "--hidden",
    "8",
    "--burnin",
    "0",
    "--thin",
    "10",
    "--no-progress",
    "--decay-at",
    "--quiet",
];

fn args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    RUN.iter().copied().chain(extra.iter().copied()).collect()
}

/// The tensors of every sample of a run (by name), in step order.
fn sample_tensors(run: &Path) -> Vec<Vec<(String, Vec<f32>)>> {
    bnn::checkpoint::list_samples(run)
        .unwrap()
        .iter()
        .map(|path| {
            let s = bnn::checkpoint::load_sample(path, &candle_core::Device::Cpu).unwrap();
            let mut tensors: Vec<_> = s
                .tensors
                .into_iter()
                .map(|(n, t)| (n, t.flatten_all().unwrap().to_vec1::<f32>().unwrap()))
                .collect();
            tensors.sort_by(|a, b| a.0.cmp(&b.0));
            tensors
        })
        .collect()
}

/// The sample files of a run, as bytes, in step order.
fn sample_bytes(run: &Path) -> Vec<Vec<u8>> {
    bnn::checkpoint::list_samples(run)
        .unwrap()
        .iter()
        .map(|p| std::fs::read(p).unwrap())
        .collect()
}

#[test]
fn rollback_halves_the_step_size_and_resume_keeps_it() {
    let d = tempfile::tempdir().unwrap();
    let runs = d.path().join("checkpoints");
    // A state every 3 updates: the divergence at update 8 goes back to update 6.
    let rollback = [
        "--step-size",
        "1.25",
        "--on-divergence",
        "rollback",
        "--checkpoint-every",
        "3",
    ];
    let mut a = args(&rollback);
    a.extend(["--epochs", "2", "--run-name", "a"]);
    let out = bnn(d.path(), &a);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert_eq!(err.matches("rolled back").count(), 1, "{err}");
    assert!(
        err.contains("in tensor ")
            && err.contains("saved at step 6")
            && err.contains("step size halved to 6.25e-1"),
        "{err}"
    );
    let summary = common::last_json(&out);
    assert_eq!(summary["rollbacks"], 1, "{summary}");
    assert_eq!(summary["samples"], 20);

    // Stopped after its first epoch (the rollback inside it), then resumed: the state
    // carries the halved step size, and the samples are the uninterrupted run's.
    let mut b = args(&rollback);
    b.extend(["--epochs", "1", "--run-name", "b"]);
    run_ok(d.path(), &b);
    let resumed = run_ok(
        d.path(),
        &[
            "train",
            "--resume",
            "checkpoints/b",
            "--epochs",
            "2",
            "--quiet",
        ],
    );
    assert_eq!(resumed["rollbacks"], 1, "{resumed}");
    assert_eq!(sample_bytes(&runs.join("b")), sample_bytes(&runs.join("a")));

    // Rolled back to the first state (the only one saved before the divergence) at
    // η/2: the chain a new run at η/2 gives.
    let first = args(&rollback[..4]);
    let mut a0 = first.clone();
    a0.extend(["--epochs", "2", "--run-name", "a0"]);
    assert_eq!(run_ok(d.path(), &a0)["rollbacks"], 1);
    let c = args(&["--step-size", "0.625", "--epochs", "2", "--run-name", "c"]);
    run_ok(d.path(), &c);
    assert_eq!(
        sample_tensors(&runs.join("c")),
        sample_tensors(&runs.join("a0"))
    );
}

#[test]
fn rollback_stops_after_three_and_keeps_valid_samples() {
    let d = tempfile::tempdir().unwrap();
    let a = args(&[
        "--step-size",
        "20",
        "--on-divergence",
        "rollback",
        "--epochs",
        "2",
        "--run-name",
        "x",
    ]);
    let out = bnn(d.path(), &a);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.matches("rolled back").count(), 3, "{err}");
    let last = err.trim_end().lines().last().unwrap();
    assert!(last.starts_with("bnn: error: "), "{err}");
    assert!(
        last.contains("after 3 rollbacks") && last.contains("in tensor "),
        "{last}"
    );
    assert!(!err.contains("panicked"), "{err}");
    // The state left is the first one (with three rollbacks recorded); no sample of a
    // diverged chain was written.
    for s in sample_tensors(&d.path().join("checkpoints/x")) {
        for (name, v) in s {
            assert!(v.iter().all(|x| x.is_finite()), "{name} is not finite");
        }
    }
}

#[test]
fn replica_runs_refuse_rollback() {
    let d = tempfile::tempdir().unwrap();
    common::fails_with(
        d.path(),
        &[
            "train",
            "--dataset",
            "mnist-mini",
            "--sampler",
            "renhd",
            "--on-divergence",
            "rollback",
        ],
        &["--on-divergence rollback is for chains"],
    );
}
