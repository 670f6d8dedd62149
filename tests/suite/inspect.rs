//! `bnn inspect`: a run folder and one sample file, as a table and as JSON; a file that
//! is no sample gets one line and exit 1.

use crate::common;

use common::{bnn, fails_with, last_json, stderr, stdout};

#[test]
fn inspect_shows_a_run_and_a_sample() {
    let d = tempfile::tempdir().unwrap();
    let train = bnn(
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
            "--run-name",
            "r",
        ],
    );
    assert!(train.status.success(), "{}", stderr(&train));
    let s = last_json(&train);

    let out = bnn(d.path(), &["inspect", "--run", "checkpoints/r", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let info = last_json(&out);
    assert_eq!(info["samples"], s["samples"]);
    assert_eq!(info["steps"], s["steps"]);
    assert_eq!(info["num_params"], s["num_params"]);
    assert_eq!(info["model"], "mlp-100-relu");
    assert_eq!(info["ensemble"], s["ensemble"]);
    assert_eq!(info["settings"]["thin"], 30);
    let first = &info["first_sample"];
    assert_eq!(first["parameters"], s["num_params"]);
    assert_eq!(first["tensors"][0]["name"], "fc1.weight");
    assert_eq!(first["tensors"][0]["shape"], serde_json::json!([100, 784]));
    assert_eq!(first["tensors"][0]["dtype"], "F32");
    let samples = info["samples"].as_u64().unwrap();
    let each = first["bytes"].as_u64().unwrap();
    assert_eq!(info["sample_bytes"].as_u64().unwrap(), samples * each);
    assert!(info["total_bytes"].as_u64().unwrap() > info["sample_bytes"].as_u64().unwrap());

    let table = bnn(d.path(), &["inspect", "--run", "checkpoints/r"]);
    assert!(table.status.success(), "{}", stderr(&table));
    let text = stdout(&table);
    assert!(
        text.contains("model        mlp-100-relu (79510 parameters)"),
        "{text}"
    );
    assert!(text.contains(&format!("samples      {samples}")), "{text}");
    assert!(text.contains("fc2.bias"), "{text}");

    let path = first["path"].as_str().unwrap();
    let file = bnn(d.path(), &["inspect", "--file", path]);
    assert!(file.status.success(), "{}", stderr(&file));
    let text = stdout(&file);
    assert!(
        text.contains("parameters  79510") && text.contains("metadata    sampler = sghmc"),
        "{text}"
    );
}

#[test]
fn inspect_rejects_files_that_are_no_samples() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("notes.txt"), "not a tensor file\n").unwrap();
    std::fs::write(d.path().join("empty.safetensors"), "").unwrap();
    for name in ["notes.txt", "empty.safetensors"] {
        fails_with(
            d.path(),
            &["inspect", "--file", name],
            &[name, "not a safetensors sample"],
        );
    }
    fails_with(d.path(), &["inspect", "--run", "nowhere"], &["nowhere"]);
}
