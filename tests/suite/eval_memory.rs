//! `bnn eval` streams over the samples: its peak memory does not grow with their number.

use crate::common;

use common::stderr;

/// Peak resident set (KiB) of `bnn args` in `cwd`, from the kernel's accounting of that
/// one child (wait4), so that no other process of the test counts. One rayon thread:
/// with two, which thread's malloc arena serves an allocation depends on timing, and the
/// peak of the same command spread 54-64 MB (CI failed on that noise, +12%).
// The child is reaped by wait4, which clippy does not see.
#[allow(clippy::zombie_processes)]
fn peak_rss_kib(cwd: &std::path::Path, args: &[&str]) -> i64 {
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_bnn"))
        .args(args)
        .current_dir(cwd)
        .env("BNN_LOG", "warn")
        .env("RAYON_NUM_THREADS", "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value of the plain C struct; wait4 fills it
    // for the child just spawned, which is reaped here and not waited for again.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as i32);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "bnn {args:?} failed"
    );
    usage.ru_maxrss
}

/// 100 samples of the default MLP (each 318 KB on disk, 31 MB in all) against the first
/// 10 of them: the peak memory of `bnn eval` differs by less than 20%. Each is the least
/// of three runs, since a peak can only be inflated by noise (allocator fragmentation),
/// never lowered. Measured on one thread, Zen 3, five runs of the test: 51.3-51.6 MB
/// with 10, 48.7-54.5 MB with 100 (at most +6.4%). Holding the samples, or one
/// prediction matrix per sample, would add 28 MB or more to a peak of 52 MB (+55%), so
/// 20% keeps a wide margin on both sides.
#[test]
fn eval_memory_is_flat_in_the_number_of_samples() {
    let d = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_bnn"))
        .args([
            "train",
            "--dataset",
            "mnist-mini",
            "--offline",
            "--no-progress",
        ])
        .args([
            "--epochs",
            "2",
            "--burnin",
            "1",
            "--batch-size",
            "100",
            "--thin",
            "1",
        ])
        .args(["--run-name", "many"])
        .current_dir(d.path())
        .env("BNN_LOG", "warn")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let many = d.path().join("checkpoints/many");
    let samples = bnn::checkpoint::list_samples(&many).unwrap();
    assert_eq!(samples.len(), 100);

    let few = d.path().join("checkpoints/few");
    std::fs::create_dir_all(bnn::checkpoint::samples_dir(&few)).unwrap();
    std::fs::copy(many.join("run.json"), few.join("run.json")).unwrap();
    for s in &samples[..10] {
        let to = bnn::checkpoint::samples_dir(&few).join(s.file_name().unwrap());
        std::fs::copy(s, to).unwrap();
    }
    let eval = |run: &str| {
        (0..3)
            .map(|_| peak_rss_kib(d.path(), &["eval", "--run", run, "--offline"]))
            .min()
            .unwrap()
    };
    let (ten, hundred) = (eval("checkpoints/few"), eval("checkpoints/many"));
    let growth = hundred as f64 / ten as f64 - 1.0;
    eprintln!("bnn eval peak RSS: {ten} KiB with 10 samples, {hundred} KiB with 100");
    assert!(
        growth < 0.20,
        "peak RSS {ten} KiB with 10 samples, {hundred} KiB with 100 (+{:.1}%)",
        100.0 * growth
    );
}
