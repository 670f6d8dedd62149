//! `--chain-layout stacked`: K chains as one computation (one network with a chain axis,
//! one batched product per layer, each chain's sampler stepping its slice) give chain k of
//! the same run with its chains apart. On the CPU candle's batched product sums each
//! chain's product in the order of the product alone, so the agreement is bit for bit (the
//! issue's bar is 1e-5 relative; on a GPU, where cuBLAS may pick another order for a
//! batched product, that is the bar). Checked for every fused sampler and both
//! integrators on an MLP, for a CNN and a ResNet (grouped convolutions), and for a
//! regression whose
//! noise precision is Gibbs-sampled per chain; `bnn compare` and `bnn eval` read a stacked
//! run as any other; where stacking cannot run it is refused in one line.

use std::path::Path;

use bnn::checkpoint::{list_samples, load_sample};
use candle_core::Device;

use crate::common::{fails_with, run_ok};

/// `bnn train` of four chains for 50 updates (the built-in subset at batch 200, one
/// epoch), a sample of each chain at update 50; its summary.
fn fifty_updates(cwd: &Path, name: &str, extra: &[&str]) -> serde_json::Value {
    fifty_updates_of(cwd, name, 200, extra)
}

/// [`fifty_updates`] at batch `batch` on the first 50·batch images.
fn fifty_updates_of(cwd: &Path, name: &str, batch: usize, extra: &[&str]) -> serde_json::Value {
    let (batch, limit) = (batch.to_string(), (50 * batch).to_string());
    let base = [
        "train",
        "--dataset",
        "mnist-mini",
        "--offline",
        "--train-limit",
        &limit,
        "--epochs",
        "1",
        "--batch-size",
        &batch,
        "--burnin",
        "0",
        "--thin",
        "50",
        "--chains",
        "4",
        "--no-progress",
        "--out",
        "runs",
        "--run-name",
        name,
    ];
    run_ok(cwd, &[&base[..], extra].concat())
}

/// Every sample file of `a` equals `b`'s, byte for byte; and the θ in them agree to 1e-5
/// relative (max |Δ| over max |θ| per tensor), which bit-identity implies, checked apart
/// so that a failure says by how much. Returns the number of samples compared.
fn same_samples(a: &Path, b: &Path) -> usize {
    let mut compared = 0;
    for chain in bnn::checkpoint::chain_dirs(a) {
        let other = b.join(chain.file_name().unwrap());
        let (xs, ys) = (list_samples(&chain).unwrap(), list_samples(&other).unwrap());
        assert_eq!(xs.len(), ys.len(), "{}", chain.display());
        for (x, y) in xs.iter().zip(&ys) {
            let (tx, ty) = (
                load_sample(x, &Device::Cpu).unwrap().tensors,
                load_sample(y, &Device::Cpu).unwrap().tensors,
            );
            for (name, t) in &tx {
                let u = &ty[name];
                let diff = (t - u).unwrap().abs().unwrap().max_all().unwrap();
                let scale = u.abs().unwrap().max_all().unwrap();
                let rel = diff.to_scalar::<f32>().unwrap() / scale.to_scalar::<f32>().unwrap();
                assert!(rel <= 1e-5, "{} {name}: relative {rel}", x.display());
            }
            assert!(
                std::fs::read(x).unwrap() == std::fs::read(y).unwrap(),
                "{} is not bit-identical to {}",
                x.display(),
                y.display()
            );
            compared += 1;
        }
    }
    compared
}

#[test]
fn stacked_chains_after_fifty_updates_are_the_chains_apart() {
    let d = tempfile::tempdir().unwrap();
    let runs = d.path().join("runs");
    // The training set stays on the device and minibatches are gathered there, but with
    // label noise, which is gathered on the host per chain (the last case).
    let cases: [(&str, &[&str]); 6] = [
        ("sgld", &[]),
        ("sghmc", &[]),
        ("sgnht", &[]),
        ("sgnht", &["--integrator", "euler"]),
        ("msgnht", &[]),
        ("sghmc", &["--permute-labels", "0.3"]),
    ];
    for (i, (sampler, extra)) in cases.iter().enumerate() {
        let common = [&["--sampler", sampler][..], extra].concat();
        let (st, ap) = (format!("st{i}"), format!("ap{i}"));
        let stacked = [&common[..], &["--chain-layout", "stacked"]].concat();
        let summary = fifty_updates(d.path(), &st, &stacked);
        assert_eq!(
            summary["chain_layout"], "stacked",
            "{sampler}: run.json says"
        );
        let apart = [&common[..], &["--backward", "autograd"]].concat();
        fifty_updates(d.path(), &ap, &apart);
        let n = same_samples(&runs.join(&st), &runs.join(&ap));
        assert_eq!(n, 4, "{sampler} {extra:?}: one sample per chain");
        // Four chains, not one four times: chain 1 has its own seed.
        let first = |k: usize| {
            let dir = runs.join(&st).join(format!("chain-{k}"));
            std::fs::read(&list_samples(&dir).unwrap()[0]).unwrap()
        };
        assert_ne!(first(0), first(1), "{sampler}: chains 0 and 1 are the same");
    }
    // `bnn compare` reads a stacked run: against its chains apart, the same predictions.
    let cmp = run_ok(
        d.path(),
        &["compare", "runs/st2", "--reference", "runs/ap2"],
    );
    assert_eq!(cmp["agreement"], 1.0, "{cmp}");
    assert_eq!(cmp["total_variation"], 0.0, "{cmp}");
}

/// A CNN and a ResNet (their chains' convolutions grouped convolutions, FRN per channel)
/// and a regression (τ Gibbs-sampled per chain, the Gaussian likelihood at each chain's
/// own τ).
#[test]
fn stacked_cnn_and_regression_chains_are_the_chains_apart() {
    let d = tempfile::tempdir().unwrap();
    let runs = d.path().join("runs");
    let cnn = "[model]\nkind = \"cnn\"\nconv = [4, 6]\nkernel_size = 3\npadding = 1\n\
               hidden = [16]\nactivation = \"relu\"\n";
    std::fs::write(d.path().join("cnn.toml"), cnn).unwrap();
    let config = ["--config", "cnn.toml", "--sampler", "sghmc"];
    fifty_updates(
        d.path(),
        "cnn-st",
        &[&config[..], &["--chain-layout", "stacked"]].concat(),
    );
    fifty_updates(
        d.path(),
        "cnn-ap",
        &[&config[..], &["--backward", "autograd"]].concat(),
    );
    assert_eq!(same_samples(&runs.join("cnn-st"), &runs.join("cnn-ap")), 4);
    // A small ResNet (a stride-2 stage with its projection shortcut, FRN + TLU, swish) at
    // batch 20: candle's CPU convolutions take a second an update at batch 200.
    let resnet = "[model]\nkind = \"resnet\"\nstages = [4, 8]\nblocks = 1\nnorm = \"frn\"\n\
                  activation = \"swish\"\n";
    std::fs::write(d.path().join("resnet.toml"), resnet).unwrap();
    let config = ["--config", "resnet.toml", "--sampler", "sgnht"];
    let stacked = [&config[..], &["--chain-layout", "stacked"]].concat();
    fifty_updates_of(d.path(), "res-st", 20, &stacked);
    let apart = [&config[..], &["--backward", "autograd"]].concat();
    fifty_updates_of(d.path(), "res-ap", 20, &apart);
    assert_eq!(same_samples(&runs.join("res-st"), &runs.join("res-ap")), 4);

    let toy = [
        "train",
        "--toy",
        "regression-1d",
        "--hidden",
        "10",
        "--sampler",
        "sgnht",
        "--epochs",
        "40",
        "--burnin",
        "20",
        "--thin",
        "20",
        "--chains",
        "3",
        "--no-progress",
        "--out",
        "runs",
    ];
    let st = run_ok(
        d.path(),
        &[
            &toy[..],
            &["--run-name", "toy-st", "--chain-layout", "stacked"],
        ]
        .concat(),
    );
    let ap = run_ok(
        d.path(),
        &[
            &toy[..],
            &["--run-name", "toy-ap", "--backward", "autograd"],
        ]
        .concat(),
    );
    assert!(same_samples(&runs.join("toy-st"), &runs.join("toy-ap")) >= 3);
    assert_eq!(st["regression"], ap["regression"], "the pooled mixture");
}

#[test]
fn stacking_is_refused_where_it_cannot_run() {
    let d = tempfile::tempdir().unwrap();
    let base = [
        "train",
        "--dataset",
        "mnist-mini",
        "--offline",
        "--epochs",
        "1",
        "--burnin",
        "0",
        "--chain-layout",
        "stacked",
    ];
    let cases: [(&[&str], &str); 4] = [
        // 1,024 chains of 41 million parameters: refused before anything is allocated.
        (
            &["--chains", "1024", "--hidden", "6000,6000"],
            "GB is free: ask for fewer chains",
        ),
        (&["--chains", "1"], "--chains 2 or more"),
        (&["--chains", "2", "--sampler", "sgd"], "no fused update"),
        (
            &["--chains", "2", "--on-divergence", "rollback"],
            "rolls one chain back alone",
        ),
    ];
    for (extra, needle) in cases {
        let args = [&base[..], extra].concat();
        fails_with(d.path(), &args, &["--chain-layout stacked", needle]);
    }
}

/// `--device cuda` in a build without CUDA says so and how to get one, in one line.
#[test]
fn a_cuda_device_in_a_build_without_cuda_is_refused_in_one_line() {
    if cfg!(feature = "cuda") {
        return; // this build has CUDA: the GPU check covers it (tests/gpu.rs)
    }
    let d = tempfile::tempdir().unwrap();
    fails_with(
        d.path(),
        &[
            "train",
            "--dataset",
            "mnist-mini",
            "--offline",
            "--device",
            "cuda",
        ],
        &["built without CUDA", "--features cuda"],
    );
}

/// The test-set pass of a sample off the CPU (one batched pass over the stack for all
/// chains, in chunks of eval-batch/K examples) gives each chain the probabilities of
/// candle's pass over that chain alone (in chunks of eval-batch), for an MLP, a CNN and a
/// ResNet. Tolerance 1e-6: the chunks differ in rows, which changes how candle's CPU GEMM
/// blocks a product and so the last bit of some sums (3e-8 measured); a wrong chain or
/// row would be off by far more.
#[test]
fn stacked_predictions_are_each_chains_own() {
    use bnn::ensemble::{predict_stacked, predict_with_candle};
    use bnn::model::{stacked::Stacked, ModelSpec, Network};
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let n = 700;
    let features: Vec<f32> = (0..n * 784).map(|_| rng.random_range(0.0..1.0)).collect();
    let labels: Vec<u8> = (0..n).map(|i| (i % 10) as u8).collect();
    let split = bnn::data::Split::of_table(features, 784, labels, Vec::new());
    let presets = [
        "[model]\nkind = \"mlp\"\nhidden = [30]\nactivation = \"relu\"\n",
        "[model]\nkind = \"cnn\"\nconv = [3]\nkernel_size = 3\npadding = 1\nhidden = [8]\nactivation = \"relu\"\n",
        "[model]\nkind = \"resnet\"\nstages = [4, 8]\nblocks = 1\nnorm = \"frn\"\nactivation = \"swish\"\n",
    ];
    for text in presets {
        let spec = ModelSpec::from_toml_str(text, "test").unwrap();
        let nets: Vec<Network> = (0..3)
            .map(|s| Network::new(&spec, 784, 10, s, &Device::Cpu).unwrap())
            .collect();
        let stack = Stacked::new(&nets.iter().collect::<Vec<_>>()).unwrap();
        let together = predict_stacked(&stack, &nets[0], &split, &Device::Cpu).unwrap();
        for (k, net) in nets.iter().enumerate() {
            let alone = predict_with_candle(net, &split, &Device::Cpu).unwrap();
            assert_eq!(alone.len(), n * 10);
            let worst = alone
                .iter()
                .zip(&together[k])
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(
                worst <= 1e-6,
                "{}: chain {k}: max |Δp| {worst:e}",
                spec.label()
            );
        }
    }
}
