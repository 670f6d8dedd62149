//! A fixed seed gives bit-identical samples whatever the thread count: every pass splits
//! its work over threads by rows or channels, never by the terms of one sum, so the
//! order of every floating-point addition is fixed by the shapes alone.

use crate::common;

use common::stderr;

/// Trains `args` on the built-in subset with `threads` threads as run `name` in `cwd`;
/// the bytes of every sample file, in step order.
fn samples(cwd: &std::path::Path, threads: usize, name: &str, args: &[&str]) -> Vec<Vec<u8>> {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_bnn"))
        .args([
            "train",
            "--dataset",
            "mnist-mini",
            "--offline",
            "--no-progress",
        ])
        .args(["--run-name", name])
        .args(args)
        .current_dir(cwd)
        .env("RAYON_NUM_THREADS", threads.to_string())
        .env("BNN_LOG", "warn")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let run = cwd.join("checkpoints").join(name);
    bnn::checkpoint::list_samples(&run)
        .unwrap()
        .iter()
        .map(|p| std::fs::read(p).unwrap())
        .collect()
}

/// MLP, LeNet-style CNN (padded) and a narrow ResNet, each with 1 and 2 threads: the same
/// sample files, byte for byte (tensors, metadata and checksum).
#[test]
fn samples_do_not_depend_on_the_thread_count() {
    let d = tempfile::tempdir().unwrap();
    let cnn = d.path().join("cnn.toml");
    std::fs::write(
        &cnn,
        "[model]\nkind = \"cnn\"\nconv = [4, 8]\nkernel_size = 5\npadding = 2\nhidden = [32]\nactivation = \"relu\"\n",
    )
    .unwrap();
    let resnet = d.path().join("resnet.toml");
    std::fs::write(
        &resnet,
        "[model]\nkind = \"resnet\"\nstages = [4, 8, 8]\nblocks = 1\nactivation = \"swish\"\n",
    )
    .unwrap();
    let common = ["--epochs", "2", "--burnin", "1", "--batch-size", "100"];
    let cases: [(&str, Vec<&str>); 3] = [
        ("mlp", vec!["--hidden", "64", "--thin", "50"]),
        (
            "cnn",
            vec!["--config", cnn.to_str().unwrap(), "--thin", "50"],
        ),
        (
            "resnet",
            vec![
                "--config",
                resnet.to_str().unwrap(),
                "--thin",
                "50",
                "--augment",
            ],
        ),
    ];
    for (name, extra) in cases {
        let args: Vec<&str> = common.iter().copied().chain(extra).collect();
        let one = samples(d.path(), 1, &format!("{name}-1"), &args);
        let two = samples(d.path(), 2, &format!("{name}-2"), &args);
        assert_eq!(
            one.len(),
            2,
            "{name}: 100 updates after burn-in, one kept every 50"
        );
        assert!(one == two, "{name}: samples differ between 1 and 2 threads");
    }
}
