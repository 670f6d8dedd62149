//! A full disk or a read-only folder stops a run with one clear line and leaves every
//! earlier sample and the resumable state whole; `--resume` then ends with the samples of
//! a run that never stopped. The file systems are small tmpfs mounts, which needs root
//! (CI runs as root; elsewhere, `unshare -rm cargo test --release --test disk`): root
//! ignores permission bits, so a read-only folder has to be a read-only mount.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::stderr;

/// A tmpfs of `megabytes` at a fresh folder, unmounted on drop.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn new(megabytes: usize) -> Self {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        assert!(
            root,
            "tests/disk.rs mounts tmpfs file systems and needs root; run it as root or under `unshare -rm`"
        );
        let dir = tempfile::tempdir().unwrap();
        mount(&[
            "-t",
            "tmpfs",
            "-o",
            &format!("size={megabytes}m"),
            "tmpfs",
            dir.path().to_str().unwrap(),
        ]);
        Tmpfs { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn remount(&self, options: &str) {
        mount(&["-o", options, self.path().to_str().unwrap()]);
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

fn mount(args: &[&str]) {
    let out = Command::new("mount").args(args).output().unwrap();
    assert!(out.status.success(), "mount {args:?}: {}", stderr(&out));
}

/// Six epochs of the default MLP on the built-in subset, a sample every 20 updates from
/// epoch 2 on: 25 samples of 318 KB and a 1.5 MB state.
const RUN: [&str; 14] = [
    "train",
    "--dataset",
    "mnist-mini",
    "--offline",
    "--no-progress",
    "--epochs",
    "6",
    "--burnin",
    "1",
    "--thin",
    "20",
    "--run-name",
    "r",
    "--seed=3",
];

fn bnn(cwd: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_bnn"));
    c.args(args).current_dir(cwd).env("BNN_LOG", "warn");
    c
}

fn sample_files(run: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    bnn::checkpoint::list_samples(run)
        .unwrap()
        .into_iter()
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            (PathBuf::from(p.file_name().unwrap()), bytes)
        })
        .collect()
}

/// The samples of the run that never stopped.
fn reference() -> Vec<(PathBuf, Vec<u8>)> {
    let d = tempfile::tempdir().unwrap();
    let out = bnn(d.path(), &RUN).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let files = sample_files(&d.path().join("checkpoints/r"));
    assert_eq!(files.len(), 25);
    files
}

/// Starts the run on `fs`, waits for its first sample, calls `strike`, and returns the
/// failed run's stderr after checking that it failed with one line, that every sample
/// it left loads (checksums and values), and that its state loads.
fn run_until_struck(fs: &Tmpfs, strike: impl FnOnce()) -> String {
    let run = fs.path().join("checkpoints/r");
    let child = bnn(fs.path(), &RUN)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let samples = bnn::checkpoint::samples_dir(&run);
    let started = std::time::Instant::now();
    while std::fs::read_dir(&samples).map_or(0, |d| d.count()) == 0 {
        assert!(started.elapsed().as_secs() < 60, "no sample after 60 s");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    strike();
    let out = child.wait_with_output().unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let left = bnn::checkpoint::list_samples(&run).unwrap();
    assert!(
        !left.is_empty() && left.len() < 25,
        "{} samples",
        left.len()
    );
    for p in &left {
        bnn::checkpoint::load_sample(p, &candle_core::Device::Cpu).unwrap();
    }
    let names: Vec<String> = bnn::model::Network::new(
        &bnn::model::ModelSpec::default(),
        784,
        10,
        0,
        &candle_core::Device::Cpu,
    )
    .unwrap()
    .params
    .iter()
    .map(|p| p.name.clone())
    .collect();
    bnn::run_state::RunState::load(&run, &names).unwrap();
    err
}

fn resume_and_compare(fs: &Tmpfs, reference: &[(PathBuf, Vec<u8>)]) {
    let out = bnn(fs.path(), &["train", "--resume", "checkpoints/r"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let files = sample_files(&fs.path().join("checkpoints/r"));
    assert!(files == reference, "the resumed run's samples differ");
}

#[test]
fn full_disk_and_read_only_folder_stop_cleanly_and_resume() {
    let reference = reference();

    // Too small from the start: refused before anything is written.
    let small = Tmpfs::new(3);
    let out = bnn(small.path(), &RUN).output().unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("the run needs about") && err.contains("(25 samples of 0.3 MB"),
        "{err}"
    );
    assert!(!small.path().join("checkpoints/r").exists());

    // Room at the start, filled by another writer after the first sample.
    let fs = Tmpfs::new(16);
    let filler = fs.path().join("filler");
    let err = run_until_struck(&fs, || {
        use std::io::Write;
        let mut f = std::fs::File::create(&filler).unwrap();
        let block = vec![0u8; 1 << 16];
        while f.write_all(&block).is_ok() {}
    });
    assert!(err.contains("No space left on device"), "{err}");
    assert!(
        err.contains("continue with `bnn train --resume checkpoints/r`"),
        "{err}"
    );
    std::fs::remove_file(&filler).unwrap();
    resume_and_compare(&fs, &reference);
    drop(fs);

    // The folder turns read-only after the first sample.
    let fs = Tmpfs::new(16);
    let err = run_until_struck(&fs, || fs.remount("remount,ro"));
    assert!(err.contains("Read-only file system"), "{err}");
    fs.remount("remount,rw");
    resume_and_compare(&fs, &reference);
}
