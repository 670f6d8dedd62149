//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod plan;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

/// A minimal HTTP/1.1 server on 127.0.0.1 serving fixed bodies by path; other paths get 404.
/// Records the paths requested.
pub struct Server {
    pub base: String,
    pub requests: Arc<Mutex<Vec<String>>>,
}

pub fn serve(files: HashMap<String, Vec<u8>>) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    let base = format!("http://{}", listener.local_addr().unwrap());
    let requests = Arc::new(Mutex::new(Vec::new()));
    let log = requests.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut line = String::new();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            if reader.read_line(&mut line).is_err() {
                continue;
            }
            // Drain the headers.
            loop {
                let mut h = String::new();
                if reader.read_line(&mut h).is_err() || h == "\r\n" || h.is_empty() {
                    break;
                }
            }
            let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
            log.lock().unwrap().push(path.clone());
            let _ = match files.get(&path) {
                Some(body) => stream
                    .write_all(
                        format!(
                            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                            body.len()
                        )
                        .as_bytes(),
                    )
                    .and_then(|_| stream.write_all(body)),
                None => stream.write_all(
                    b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                ),
            };
        }
    });
    Server { base, requests }
}

/// The repository's built-in subset folder.
pub fn mini_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data/mnist-mini")
}

/// The shared data folder (`$BNN_DATA_DIR`), if any. Fails the test when
/// `BNN_REQUIRE_DATA=1` and the folder or the dataset is missing; otherwise says loudly
/// that the real-data part is not run.
pub fn real_data(dataset: &str) -> Option<PathBuf> {
    let required = std::env::var("BNN_REQUIRE_DATA").is_ok_and(|v| v == "1");
    let dir = std::env::var_os("BNN_DATA_DIR").map(|d| PathBuf::from(d).join(dataset));
    match dir {
        Some(d)
            if d.join("train-images-idx3-ubyte.gz").is_file()
                || d.join("train-images-idx3-ubyte").is_file() =>
        {
            Some(d)
        }
        other => {
            assert!(
                !required,
                "BNN_REQUIRE_DATA=1 but {dataset} is not under BNN_DATA_DIR ({other:?})"
            );
            eprintln!("NOTE: {dataset} not found under BNN_DATA_DIR; the real-data part of this test did not run");
            None
        }
    }
}

/// Runs the `bnn` binary in `cwd` with a clean data environment.
pub fn bnn(cwd: &std::path::Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_bnn"))
        .args(args)
        .current_dir(cwd)
        .env_remove("BNN_DATA_DIR")
        .env("BNN_LOG", "warn")
        .output()
        .expect("run bnn")
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The last line of stdout, parsed as JSON.
pub fn last_json(o: &Output) -> serde_json::Value {
    let out = stdout(o);
    let line = out
        .lines()
        .last()
        .unwrap_or_else(|| panic!("no stdout; stderr: {}", stderr(o)));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("last line is not JSON ({e}): {line}"))
}

/// Runs `bnn args` in `cwd`, asserting that it succeeds; its last JSON line.
pub fn run_ok(cwd: &std::path::Path, args: &[&str]) -> serde_json::Value {
    let out = bnn(cwd, args);
    assert!(out.status.success(), "bnn {args:?}: {}", stderr(&out));
    last_json(&out)
}

/// Runs `bnn args` in `cwd`, asserting exit 1 and one line on stderr containing each of
/// `needles`.
pub fn fails_with(cwd: &std::path::Path, args: &[&str], needles: &[&str]) {
    let out = bnn(cwd, args);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "bnn {args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "bnn {args:?}: {err}");
    for n in needles {
        assert!(err.contains(n), "bnn {args:?}: no `{n}` in {err}");
    }
}

/// One epoch of the default MLP on the MNIST folder `mnist` (600 updates, a sample every
/// 100), seed `seed`, as run `name`; its summary.
pub fn short_mnist_run(
    cwd: &std::path::Path,
    mnist: &std::path::Path,
    seed: u64,
    name: &str,
) -> serde_json::Value {
    let seed = seed.to_string();
    run_ok(
        cwd,
        &[
            "train",
            "--dataset",
            "mnist",
            "--data-dir",
            mnist.to_str().unwrap(),
            "--epochs",
            "1",
            "--burnin",
            "0",
            "--thin",
            "100",
            "--seed",
            &seed,
            "--run-name",
            name,
        ],
    )
}

/// `bytes` gzipped.
pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}
