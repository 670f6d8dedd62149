//! `bnn data fetch` and the library's fetch against an HTTP server on 127.0.0.1.

use crate::common;

use std::collections::HashMap;

use bnn::data::{fetch, registry};
use common::{bnn, last_json, mini_dir, real_data, serve, stderr};

fn mini_files(prefix: &str) -> HashMap<String, Vec<u8>> {
    registry::MNIST_MINI
        .files
        .iter()
        .map(|f| {
            let body = std::fs::read(mini_dir().join(format!("{}.gz", f.name))).unwrap();
            (format!("{prefix}/{}.gz", f.name), body)
        })
        .collect()
}

/// The library's fetch with the transport the `bnn` program installs.
fn http_fetch(
    spec: &registry::DatasetSpec,
    mirrors: &[String],
    dir: &std::path::Path,
) -> bnn::Result<usize> {
    fetch::install_transport(bnn::http::get);
    fetch::fetch(spec, mirrors, dir)
}

#[test]
fn fetches_verifies_and_skips_present_files() {
    let server = serve(mini_files("/m"));
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("mnist-mini");
    let n = http_fetch(
        &registry::MNIST_MINI,
        &[format!("{}/m", server.base)],
        &target,
    )
    .unwrap();
    assert_eq!(n, 4);
    assert_eq!(
        fetch::verify(&registry::MNIST_MINI, &target).unwrap().len(),
        4
    );
    // Everything present and valid: nothing is downloaded again.
    let n = http_fetch(
        &registry::MNIST_MINI,
        &[format!("{}/m", server.base)],
        &target,
    )
    .unwrap();
    assert_eq!(n, 0);
    assert_eq!(server.requests.lock().unwrap().len(), 4);
}

#[test]
fn falls_back_to_the_next_mirror() {
    let server = serve(mini_files("/good"));
    let dir = tempfile::tempdir().unwrap();
    let mirrors = [
        format!("{}/missing", server.base),
        format!("{}/good", server.base),
    ];
    let n = http_fetch(&registry::MNIST_MINI, &mirrors, dir.path()).unwrap();
    assert_eq!(n, 4);
    let reqs = server.requests.lock().unwrap();
    assert!(reqs.iter().any(|r| r.starts_with("/missing/")));
}

#[test]
fn rejects_wrong_content_and_leaves_nothing_behind() {
    let mut files = mini_files("/m");
    // Same gzip framing, different content: one label changed.
    let key = "/m/train-labels-idx1-ubyte.gz".to_string();
    let mut raw = bnn::data::idx::from_bytes(&files[&key], "x")
        .unwrap()
        .encode();
    raw[100] = (raw[100] + 1) % 10;
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut enc, &raw).unwrap();
    files.insert(key, enc.finish().unwrap());
    let server = serve(files);
    let dir = tempfile::tempdir().unwrap();
    let e = http_fetch(
        &registry::MNIST_MINI,
        &[format!("{}/m", server.base)],
        dir.path(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("train-labels-idx1-ubyte") && e.contains("SHA-256"),
        "{e}"
    );
    assert!(!dir.path().join("train-labels-idx1-ubyte.gz").exists());
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
}

#[test]
fn unreachable_mirror_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    // Port 9 (discard) on loopback: nothing listens there.
    let out = bnn(
        dir.path(),
        &[
            "data",
            "fetch",
            "--dataset",
            "fashion-mnist",
            "--data-dir",
            "d",
            "--mirror",
            "http://127.0.0.1:9",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.starts_with(
            "bnn: error: could not download train-images-idx3-ubyte.gz of fashion-mnist"
        ),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// The CLI path with the canonical checksums: serve the shared MNIST files, fetch them
/// with `bnn data fetch --mirror`, verify them, and let `bnn train` fetch by itself.
#[test]
fn cli_fetch_of_the_real_dataset() {
    let Some(src) = real_data("mnist") else {
        return;
    };
    let files: HashMap<String, Vec<u8>> = registry::MNIST
        .files
        .iter()
        .map(|f| {
            (
                format!("/mnist/{}.gz", f.name),
                std::fs::read(src.join(format!("{}.gz", f.name))).unwrap(),
            )
        })
        .collect();
    let server = serve(files);
    let dir = tempfile::tempdir().unwrap();
    let mirror = format!("{}/mnist", server.base);
    let out = bnn(
        dir.path(),
        &["data", "fetch", "--dataset", "mnist", "--mirror", &mirror],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let j = last_json(&out);
    assert_eq!(j["downloaded"], 4);
    assert_eq!(j["dir"], "data/mnist");
    let out = bnn(dir.path(), &["data", "verify", "--dataset", "mnist"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(last_json(&out)["verified"], true);

    // `bnn train` downloads what it lacks into --data-dir, then trains.
    let out = bnn(
        dir.path(),
        &[
            "train",
            "--dataset",
            "mnist",
            "--data-dir",
            "elsewhere",
            "--mirror",
            &mirror,
            "--epochs",
            "2",
            "--burnin",
            "1",
            "--batch-size",
            "1000",
            "--hidden",
            "20",
            "--thin",
            "30",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let j = last_json(&out);
    assert_eq!(j["dataset"], "mnist");
    assert_eq!(j["data_source"], "elsewhere");
    assert!(dir
        .path()
        .join("elsewhere/t10k-labels-idx1-ubyte.gz")
        .is_file());
}
