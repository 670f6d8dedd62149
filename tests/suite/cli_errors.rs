//! Bad input gets one clear line on stderr and a non-zero exit, never a panic.

use crate::common;

use common::{bnn, mini_dir, stderr};

fn one_line_error(out: &std::process::Output, needle: &str) {
    assert_eq!(out.status.code(), Some(1), "stderr: {}", stderr(out));
    let err = stderr(out);
    assert!(err.starts_with("bnn: error: "), "{err}");
    assert!(err.contains(needle), "expected `{needle}` in: {err}");
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "more than one line: {err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn unknown_dataset() {
    let d = tempfile::tempdir().unwrap();
    one_line_error(
        &bnn(d.path(), &["train", "--dataset", "imagenet"]),
        "unknown dataset `imagenet`",
    );
}

#[test]
fn unknown_sampler_and_bad_numbers_are_usage_errors() {
    let d = tempfile::tempdir().unwrap();
    for args in [
        &["train", "--sampler", "nuts"][..],
        &["train", "--epochs", "many"],
        &["train", "--hidden", "10,x"],
        &["train", "--activation", "softplus"],
        &["train", "--sampler", "renhd", "--ladder", "0.9"],
        &["sample", "--potential", "gmm5", "--ladder", "fast"],
    ] {
        let out = bnn(d.path(), args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = stderr(&out);
        assert!(err.starts_with("error: invalid value"), "{args:?}: {err}");
        if args.contains(&"--ladder") {
            assert!(
                err.contains("--ladder must be `auto` or a number above 1"),
                "{err}"
            );
        }
    }
}

#[test]
fn bad_flag_values() {
    let d = tempfile::tempdir().unwrap();
    let cases: [(&[&str], &str); 12] = [
        (
            &["--augment", "flip"],
            "--augment flip on mnist-mini: a mirrored digit is not the same digit",
        ),
        (&["--step-size=-1"], "--step-size must be positive"),
        (
            &["--friction", "1.5"],
            "--friction must be in [0, 1] for sghmc",
        ),
        (
            &["--sampler", "momentum", "--friction", "0"],
            "--friction must be in (0, 1] for momentum",
        ),
        (
            &["--sampler", "sgnht", "--diffusion=-1"],
            "--diffusion must be non-negative",
        ),
        (
            &["--epochs", "2", "--burnin", "2"],
            "--burnin 2 leaves no epoch",
        ),
        (&["--batch-size", "0"], "--batch-size must be in"),
        (&["--temperature", "0"], "--temperature must be positive"),
        (&["--hidden", "0"], "hidden widths must be positive"),
        (
            &["--sampler", "renhd", "--chains", "2"],
            "--chains 2 with --sampler renhd",
        ),
        (
            &["--sampler", "reld", "--replicas", "1"],
            "--replicas must be at least 2",
        ),
        (
            &["--permute-labels", "2"],
            "--permute-labels must be in [0, 1]",
        ),
    ];
    for (extra, needle) in cases {
        let mut args = vec!["train", "--dataset", "mnist-mini"];
        args.extend_from_slice(extra);
        one_line_error(&bnn(d.path(), &args), needle);
    }
    one_line_error(
        &bnn(
            d.path(),
            &["train", "--dataset", "mnist-mini", "--valid", "10000"],
        ),
        "--valid 10000 leaves no training data",
    );
    one_line_error(
        &bnn(d.path(), &["train", "--config", "nope.toml"]),
        "nope.toml",
    );
}

/// `bnn sample` replica flags out of range are one-line errors.
#[test]
fn bad_replica_flags() {
    let d = tempfile::tempdir().unwrap();
    for (extra, needle) in [
        (&["--replicas", "1"][..], "--replicas must be at least 2"),
        (&["--exchange-every", "0"], "--exchange-every ≥ 1"),
    ] {
        let mut args = vec![
            "sample",
            "--potential",
            "gmm5",
            "--sampler",
            "renhd",
            "--steps",
            "100",
            "--burnin",
            "10",
        ];
        args.extend_from_slice(extra);
        one_line_error(&bnn(d.path(), &args), needle);
    }
}

/// Without the `cuda` feature, asking for the GPU is a clear error, not a panic.
#[cfg(not(feature = "cuda"))]
#[test]
fn gpu_device_without_the_feature() {
    let d = tempfile::tempdir().unwrap();
    one_line_error(
        &bnn(
            d.path(),
            &["train", "--dataset", "mnist-mini", "--device", "cuda"],
        ),
        "--features cuda",
    );
}

/// Without the `mpi` feature, a `bnn` started by an MPI launcher for several processes
/// refuses to run (each copy would train every chain into the same folder).
#[cfg(not(feature = "mpi"))]
#[test]
fn mpi_launch_without_the_feature() {
    let d = tempfile::tempdir().unwrap();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_bnn"))
        .args(["train", "--dataset", "mnist-mini", "--offline"])
        .current_dir(d.path())
        .env("OMPI_COMM_WORLD_SIZE", "2")
        .env("OMPI_COMM_WORLD_RANK", "0")
        .output()
        .unwrap();
    one_line_error(&o, "--features mpi");
    assert!(!d.path().join("checkpoints").exists(), "nothing is written");
}

#[test]
fn missing_data_says_what_to_do() {
    let d = tempfile::tempdir().unwrap();
    std::fs::create_dir(d.path().join("empty")).unwrap();
    let out = bnn(
        d.path(),
        &[
            "train",
            "--dataset",
            "fashion-mnist",
            "--data-dir",
            "empty",
            "--offline",
        ],
    );
    one_line_error(&out, "dataset fashion-mnist not found");
    let err = stderr(&out);
    for hint in [
        "bnn data fetch --dataset fashion-mnist",
        "BNN_DATA_DIR",
        "apt install dataset-fashion-mnist",
        "--offline",
    ] {
        assert!(err.contains(hint), "missing hint `{hint}`: {err}");
    }
}

fn copy_mini(to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(mini_dir()).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, to.join(p.file_name().unwrap())).unwrap();
    }
}

#[test]
fn corrupt_and_truncated_idx_files() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("mm");
    copy_mini(&dir);
    // Not gzip and not IDX.
    std::fs::write(
        dir.join("train-labels-idx1-ubyte.gz"),
        b"hello world, not idx",
    )
    .unwrap();
    let out = bnn(
        d.path(),
        &[
            "train",
            "--dataset",
            "mnist-mini",
            "--data-dir",
            "mm",
            "--offline",
        ],
    );
    one_line_error(&out, "not a valid IDX file: bad magic number");

    // A gzip stream cut in half.
    copy_mini(&dir);
    let p = dir.join("t10k-images-idx3-ubyte.gz");
    let bytes = std::fs::read(&p).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() / 2]).unwrap();
    let out = bnn(
        d.path(),
        &[
            "train",
            "--dataset",
            "mnist-mini",
            "--data-dir",
            "mm",
            "--offline",
        ],
    );
    one_line_error(&out, "corrupt gzip stream");

    // A raw IDX file missing its last bytes.
    copy_mini(&dir);
    let raw = bnn::data::idx::read_file(&dir.join("train-labels-idx1-ubyte.gz"))
        .unwrap()
        .encode();
    std::fs::remove_file(dir.join("train-labels-idx1-ubyte.gz")).unwrap();
    std::fs::write(dir.join("train-labels-idx1-ubyte"), &raw[..raw.len() - 7]).unwrap();
    let out = bnn(
        d.path(),
        &[
            "train",
            "--dataset",
            "mnist-mini",
            "--data-dir",
            "mm",
            "--offline",
        ],
    );
    one_line_error(
        &out,
        "truncated: 9993 data bytes, the header [10000] says 10000",
    );

    // Well-formed files of another dataset are named, not trained on under the wrong name.
    copy_mini(&dir);
    let out = bnn(
        d.path(),
        &[
            "train",
            "--dataset",
            "mnist",
            "--data-dir",
            "mm",
            "--offline",
        ],
    );
    one_line_error(
        &out,
        "is not the canonical mnist train-images-idx3-ubyte (it is mnist-mini/train-images-idx3-ubyte)",
    );

    // `bnn data verify` catches content that parses but is not the canonical file.
    std::fs::remove_file(dir.join("train-labels-idx1-ubyte.gz")).unwrap();
    let mut changed = raw.clone();
    changed[100] = (changed[100] + 1) % 10;
    std::fs::write(dir.join("train-labels-idx1-ubyte"), &changed).unwrap();
    let out = bnn(
        d.path(),
        &[
            "data",
            "verify",
            "--dataset",
            "mnist-mini",
            "--data-dir",
            "mm",
        ],
    );
    one_line_error(&out, "does not match the canonical");
}

fn train_on_mm(root: &std::path::Path) -> std::process::Output {
    bnn(
        root,
        &[
            "train",
            "--dataset",
            "mnist-mini",
            "--data-dir",
            "mm",
            "--offline",
        ],
    )
}

fn gzip(parts: &[&[u8]], zeros: usize) -> Vec<u8> {
    use std::io::Write;
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    for p in parts {
        enc.write_all(p).unwrap();
    }
    let block = vec![0u8; 1 << 20];
    for _ in 0..zeros >> 20 {
        enc.write_all(&block).unwrap();
    }
    enc.finish().unwrap()
}

/// IDX headers that lie: a gzip bomb behind a valid header (the reader stops one byte
/// past the declared size), dimensions past what any dataset declares (refused before
/// reading on), and dimensions larger than the file.
#[test]
fn hostile_idx_headers() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("mm");
    copy_mini(&dir);
    let images = dir.join("train-images-idx3-ubyte.gz");
    let valid = bnn::data::idx::read_file(&images).unwrap();
    // 256 MiB of zeros behind the valid header and data, in well under 1 MiB of gzip
    // more than the file itself.
    let bomb = gzip(&[&valid.encode()], 256 << 20);
    let original = std::fs::metadata(&images).unwrap().len() as usize;
    assert!(bomb.len() < original + (1 << 20), "{}", bomb.len());
    std::fs::write(&images, &bomb).unwrap();
    let started = std::time::Instant::now();
    let out = train_on_mm(d.path());
    one_line_error(
        &out,
        "more data than the 7840000 bytes the header [10000, 28, 28] announces",
    );
    // Inflating all 256 MiB takes seconds; stopping at the declared size, milliseconds.
    assert!(
        started.elapsed().as_secs_f64() < 5.0,
        "{:?}",
        started.elapsed()
    );

    // A header declaring 70 000 images of 256×256: 4.3 GiB, refused before any data.
    std::fs::write(
        &images,
        gzip(
            &[&[0, 0, 8, 3, 0, 1, 0x11, 0x70, 0, 0, 1, 0, 0, 0, 1, 0]],
            0,
        ),
    )
    .unwrap();
    one_line_error(&train_on_mm(d.path()), "declare more than the 1024 MiB");

    // A raw file whose header declares more images than it holds.
    copy_mini(&dir);
    std::fs::remove_file(&images).unwrap();
    let mut lying = valid.encode();
    lying[4..8].copy_from_slice(&60_000u32.to_be_bytes());
    std::fs::write(dir.join("train-images-idx3-ubyte"), &lying).unwrap();
    one_line_error(
        &train_on_mm(d.path()),
        "truncated: 7840000 data bytes, the header [60000, 28, 28] says 47040000",
    );
}

#[test]
fn missing_and_corrupt_checkpoints() {
    let d = tempfile::tempdir().unwrap();
    one_line_error(
        &bnn(d.path(), &["eval", "--run", "nowhere"]),
        "cannot read the run manifest",
    );

    let out = bnn(
        d.path(),
        &[
            "train",
            "--dataset",
            "mnist-mini",
            "--hidden",
            "8",
            "--epochs",
            "2",
            "--burnin",
            "1",
            "--batch-size",
            "500",
            "--thin",
            "10",
            "--run-name",
            "r",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let run = d.path().join("checkpoints/r");
    let samples = bnn::checkpoint::list_samples(&run).unwrap();
    assert_eq!(samples.len(), 2);
    std::fs::write(&samples[1], b"\x08\x00\x00\x00\x00\x00\x00\x00{garbage").unwrap();
    one_line_error(
        &bnn(d.path(), &["eval", "--run", "checkpoints/r"]),
        "corrupt sample",
    );

    std::fs::write(run.join("run.json"), "{ not json").unwrap();
    one_line_error(
        &bnn(d.path(), &["eval", "--run", "checkpoints/r"]),
        "corrupt run manifest",
    );
}

/// Damaged or doctored sample and state files: a value changed after writing (the
/// checksum), a NaN written with a fresh checksum, a tensor of the wrong shape, a cut
/// file; each named with its problem, exit 1, nothing else touched.
#[test]
fn hostile_sample_and_state_files() {
    use bnn::checkpoint::{encode_safetensors, load_sample};
    use std::collections::BTreeMap;
    let d = tempfile::tempdir().unwrap();
    let out = bnn(
        d.path(),
        &[
            "train",
            "--dataset",
            "mnist-mini",
            "--hidden",
            "8",
            "--epochs",
            "2",
            "--burnin",
            "1",
            "--batch-size",
            "500",
            "--thin",
            "10",
            "--run-name",
            "r",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let run = d.path().join("checkpoints/r");
    let samples = bnn::checkpoint::list_samples(&run).unwrap();
    let path = &samples[1];
    let original = std::fs::read(path).unwrap();
    let eval = || bnn(d.path(), &["eval", "--run", "checkpoints/r"]);
    assert!(eval().status.success());

    // One bias overwritten with NaN in place (the issue's case): the checksum catches it.
    let sample = load_sample(path, &candle_core::Device::Cpu).unwrap();
    let bias = &sample.tensors["fc1.bias"];
    let at = original
        .windows(4)
        .position(|w| w == bias.to_vec1::<f32>().unwrap()[0].to_le_bytes())
        .unwrap();
    let mut doctored = original.clone();
    doctored[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(path, &doctored).unwrap();
    one_line_error(&eval(), "checksum mismatch");

    // The same NaN in a file whose checksum was recomputed: the values are checked too.
    let encode = |name: &str, t: candle_core::Tensor| {
        let mut tensors: Vec<(String, candle_core::Tensor)> = sample
            .tensors
            .iter()
            .map(|(n, t)| (n.clone(), t.clone()))
            .collect();
        tensors.sort_by(|a, b| a.0.cmp(&b.0));
        tensors.iter_mut().find(|(n, _)| n == name).unwrap().1 = t;
        let meta: BTreeMap<String, String> = sample.metadata.clone().into_iter().collect();
        encode_safetensors(&tensors, &meta).unwrap()
    };
    let mut values = bias.to_vec1::<f32>().unwrap();
    values[3] = f32::INFINITY;
    let inf = candle_core::Tensor::new(values.as_slice(), &candle_core::Device::Cpu).unwrap();
    std::fs::write(path, encode("fc1.bias", inf)).unwrap();
    one_line_error(&eval(), "tensor `fc1.bias` holds inf at element 3");

    // A tensor of another shape than the architecture's.
    let short =
        candle_core::Tensor::zeros(5, candle_core::DType::F32, &candle_core::Device::Cpu).unwrap();
    std::fs::write(path, encode("fc1.bias", short)).unwrap();
    one_line_error(
        &eval(),
        "parameter `fc1.bias` has shape [5] in the checkpoint but [8] in the model",
    );

    // Cut short.
    std::fs::write(path, &original[..original.len() - 9]).unwrap();
    one_line_error(&eval(), "corrupt sample");
    std::fs::write(path, &original).unwrap();
    assert!(eval().status.success());

    // The run state, one byte of its data flipped: --resume refuses it by name.
    let state = bnn::run_state::state_path(&run);
    let mut bytes = std::fs::read(&state).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&state, &bytes).unwrap();
    one_line_error(
        &bnn(
            d.path(),
            &["train", "--resume", "checkpoints/r", "--epochs", "3"],
        ),
        "corrupt run state: checksum mismatch",
    );
}

#[test]
fn divergence_stops_at_once_and_keeps_valid_samples() {
    let d = tempfile::tempdir().unwrap();
    // SGD with η = 5 under the N(0, 1) prior multiplies θ by (1 − ηλ) = −4 every step
    // through the prior term alone: the parameters overflow f32 within ~60 steps.
    let out = bnn(
        d.path(),
        &[
            "train",
            "--dataset",
            "mnist-mini",
            "--sampler",
            "sgd",
            "--step-size",
            "5",
            "--prior",
            "gaussian",
            "--hidden",
            "8",
            "--epochs",
            "2",
            "--burnin",
            "0",
            "--thin",
            "1",
            "--run-name",
            "div",
        ],
    );
    one_line_error(&out, "became non-finite");
    let err = stderr(&out);
    assert!(
        err.contains("at step") && err.contains("--step-size 1.25e0") && err.contains("in tensor "),
        "{err}"
    );
    let run = d.path().join("checkpoints/div");
    for path in bnn::checkpoint::list_samples(&run).unwrap() {
        let s = bnn::checkpoint::load_sample(&path, &candle_core::Device::Cpu).unwrap();
        for (name, t) in s.tensors {
            let sum = t
                .abs()
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap();
            assert!(sum.is_finite(), "{}: {name} is not finite", path.display());
        }
    }
}

#[test]
fn cnn_that_does_not_fit_the_images_and_bad_cnn_batches() {
    let d = tempfile::tempdir().unwrap();
    let preset = d.path().join("deep.toml");
    std::fs::write(
        &preset,
        "[model]\nkind = \"cnn\"\nconv = [6, 16, 32]\nkernel_size = 5\nhidden = []\nactivation = \"relu\"\n",
    )
    .unwrap();
    let args = [
        "train",
        "--dataset",
        "mnist-mini",
        "--config",
        preset.to_str().unwrap(),
    ];
    one_line_error(&bnn(d.path(), &args), "convolution 3");
    one_line_error(
        &bnn(d.path(), &["bench", "train", "--cnn-batch", "x"]),
        "--cnn-batch: `x` is not a batch size",
    );
}
