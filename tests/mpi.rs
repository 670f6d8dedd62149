//! Chains across MPI ranks (feature `mpi`; `.ci/run` builds it against Debian's Open MPI):
//! `mpirun -n R bnn train --chains K` writes the same sample files, byte for byte, and the
//! same ensemble as `--chains K` in one process; more ranks than chains is refused; a rank
//! killed mid-run stops the others within seconds, naming it, and the run resumes (with
//! another rank count) to the samples of a run never stopped. Replica exchange (RENHD, 4
//! replicas) on 2 and 4 ranks makes the swap decisions and writes the T₀ samples of one
//! process, and resumes on 4 ranks after a rank of 2 is killed. The built-in MNIST subset,
//! one thread per rank (the default under mpirun), on loopback.
#![cfg(feature = "mpi")]

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_bnn");

/// `bnn train` on the built-in subset with `flags`, into `out/name`.
fn args_with(out: &Path, name: &str, flags: &[&str]) -> Vec<String> {
    [
        "train",
        "--dataset",
        "mnist-mini",
        "--offline",
        "--no-progress",
    ]
    .iter()
    .chain(flags)
    .map(|s| s.to_string())
    .chain(["--out".into(), out.display().to_string()])
    .chain(["--run-name".into(), name.into()])
    .collect()
}

fn train_args(out: &Path, name: &str, epochs: &str) -> Vec<String> {
    let flags = [
        "--sampler",
        "sgnht",
        "--chains",
        "4",
        "--epochs",
        epochs,
        "--burnin",
        "1",
    ];
    let more = ["--thin", "20", "--checkpoint-every", "7"];
    args_with(out, name, &[&flags[..], &more[..]].concat())
}

/// `mpirun -n ranks bnn args` (as root where CI runs, oversubscribed on 2 cores, ranks
/// yielding while they wait).
fn mpirun(ranks: usize, args: &[String]) -> Command {
    let mut c = Command::new("mpirun");
    c.args(["--allow-run-as-root", "--oversubscribe"])
        .args(["--mca", "mpi_yield_when_idle", "1"])
        .args(["-n", &ranks.to_string(), BIN])
        .args(args)
        .env("BNN_LOG", "warn")
        .env_remove("RAYON_NUM_THREADS");
    c
}

fn single(args: &[String]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("BNN_LOG", "warn")
        .output()
        .unwrap()
}

fn ok(o: Output, what: &str) -> Output {
    assert!(
        o.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

fn summary(run: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(run.join("summary.json")).unwrap()).unwrap()
}

/// The ensemble `bnn eval` reports on `run`, in one process without MPI.
fn eval_ensemble(run: &Path) -> serde_json::Value {
    let e = ok(
        Command::new(BIN)
            .args(["eval", "--run", run.to_str().unwrap(), "--offline"])
            .env("BNN_LOG", "warn")
            .output()
            .unwrap(),
        "eval",
    );
    let line = String::from_utf8_lossy(&e.stdout);
    let report: serde_json::Value = serde_json::from_str(line.lines().last().unwrap()).unwrap();
    report["ensemble"].clone()
}

/// The sample files in `b/chain` are those in `a/chain`, byte for byte; how many.
fn same_files_in(a: &Path, b: &Path, chain: &str) -> usize {
    let x = bnn::checkpoint::list_samples(&a.join(chain)).unwrap();
    let y = bnn::checkpoint::list_samples(&b.join(chain)).unwrap();
    assert!(!x.is_empty(), "{chain}");
    assert_eq!(x.len(), y.len(), "{chain}");
    for (p, q) in x.iter().zip(&y) {
        assert!(
            std::fs::read(p).unwrap() == std::fs::read(q).unwrap(),
            "{} differs from {}",
            q.display(),
            p.display()
        );
    }
    x.len()
}

/// Every chain's sample files of `b` are those of `a`, byte for byte.
fn same_samples(a: &Path, b: &Path) {
    for k in 0..4 {
        same_files_in(a, b, &format!("chain-{k}"));
    }
}

#[test]
fn chains_on_two_and_three_ranks_equal_one_process() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path();
    ok(single(&train_args(out, "one", "2")), "one process");
    let one = summary(&out.join("one"));
    for ranks in [2, 3] {
        let name = format!("ranks{ranks}");
        let o = ok(
            mpirun(ranks, &train_args(out, &name, "2"))
                .output()
                .unwrap(),
            &name,
        );
        // Rank 0 alone prints the summary.
        let stdout = String::from_utf8_lossy(&o.stdout);
        assert_eq!(stdout.lines().count(), 1, "{stdout}");
        let run = out.join(&name);
        same_samples(&out.join("one"), &run);
        let s = summary(&run);
        assert_eq!(s["ensemble"], one["ensemble"], "{name}");
        assert_eq!(s["samples"], one["samples"]);
        assert_eq!(s["convergence"], one["convergence"]);
        // `bnn eval` in one process, no MPI: the same figures, bit for bit.
        assert_eq!(eval_ensemble(&run), one["ensemble"]);
    }
}

#[test]
fn more_ranks_than_chains_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = train_args(dir.path(), "r", "2");
    let at = args.iter().position(|a| a == "--chains").unwrap();
    args[at + 1] = "2".into();
    let o = mpirun(3, &args).output().unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("3 MPI ranks for 2 chain(s)"), "{err}");
}

/// The pids of `mpirun`'s children with their ranks (from their environment).
fn ranks_of(mpirun: u32) -> Vec<(i32, usize)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // The parent pid is the second field after the command's closing parenthesis.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid != Some(mpirun) {
            continue;
        }
        let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        let rank = env
            .split(|&b| b == 0)
            .filter_map(|v| std::str::from_utf8(v).ok())
            .find_map(|v| v.strip_prefix("OMPI_COMM_WORLD_RANK="))
            .and_then(|r| r.parse().ok());
        if let Some(rank) = rank {
            found.push((pid, rank));
        }
    }
    found
}

/// Once `ready`, SIGKILLs rank 1 of the job `child` (mpirun with stderr piped): the others
/// must stop within 10 s, with a message naming rank 1 and a failing exit.
fn kill_rank_one_when(child: std::process::Child, ready: impl Fn() -> bool) {
    let started = Instant::now();
    while !ready() {
        assert!(started.elapsed() < Duration::from_secs(120), "no state");
        std::thread::sleep(Duration::from_millis(20));
    }
    let victim = ranks_of(child.id())
        .into_iter()
        .find(|&(_, rank)| rank == 1)
        .expect("rank 1 among mpirun's children");
    // SAFETY: signalling a process this test started (through mpirun).
    unsafe { libc::kill(victim.0, libc::SIGKILL) };
    let killed = Instant::now();
    let o = child.wait_with_output().unwrap();
    let took = killed.elapsed();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(took < Duration::from_secs(10), "the others took {took:?}");
    assert!(err.contains("rank 1"), "the message names the rank: {err}");
}

#[test]
fn a_killed_rank_stops_the_others_and_the_run_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path();
    ok(single(&train_args(out, "whole", "4")), "uninterrupted");
    let run = out.join("killed");
    let child = mpirun(2, &train_args(out, "killed", "4"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Kill rank 1 once its chains have saved a state.
    let state = run.join("chain-1/state");
    kill_rank_one_when(child, || state.exists());

    // Resumed as one process, then the samples are the uninterrupted run's.
    let resume = ["train", "--resume", run.to_str().unwrap(), "--no-progress"].map(String::from);
    ok(mpirun(3, &resume).output().unwrap(), "resume on 3 ranks");
    same_samples(&out.join("whole"), &run);
    assert_eq!(
        summary(&run)["ensemble"],
        summary(&out.join("whole"))["ensemble"]
    );
}

/// RENHD with 4 replicas on the built-in subset, label noise so that the replicas differ.
fn replica_args(out: &Path, name: &str) -> Vec<String> {
    let flags = [
        "--sampler",
        "renhd",
        "--replicas",
        "4",
        "--ladder",
        "1.002",
        "--exchange-every",
        "20",
        "--permute-labels",
        "0.2",
        "--epochs",
        "3",
        "--burnin",
        "1",
        "--thin",
        "20",
        "--checkpoint-every",
        "40",
    ];
    args_with(out, name, &flags)
}

/// The lines of a JSON-lines file without their wall times.
fn lines_of(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            v.as_object_mut().unwrap().remove("seconds");
            v
        })
        .collect()
}

/// `b` made the swap decisions and the T₀ samples of `a`: the same ladder (holders, tries,
/// swaps, probabilities, round trips), the same holders round by round, the same sample
/// files byte for byte, every replica's metrics lines and the T₀ chain's, the same ensemble.
fn same_replica_run(a: &Path, b: &Path) {
    let samples = same_files_in(a, b, "chain-0");
    assert!(samples >= 10, "{samples} samples");
    let (sa, sb) = (summary(a), summary(b));
    let (ra, rb) = (&sa["replica_exchange"], &sb["replica_exchange"]);
    assert_eq!(ra["ladder"], rb["ladder"]);
    for key in [
        "gradient_evaluations",
        "exchange_estimates",
        "exchange_examples",
    ] {
        assert_eq!(ra[key], rb[key], "{key}");
    }
    assert_eq!(sa["ensemble"], sb["ensemble"]);
    assert_eq!(sa["samples"], sb["samples"]);
    let rounds = |r: &Path| -> Vec<serde_json::Value> {
        lines_of(&r.join("diagnostics.jsonl"))
            .into_iter()
            .filter(|l| l.get("holder").is_some())
            .collect()
    };
    assert!(!rounds(a).is_empty());
    assert_eq!(rounds(a), rounds(b));
    for j in 0..4 {
        let m = format!("replica-{j}/metrics.jsonl");
        assert_eq!(lines_of(&a.join(&m)), lines_of(&b.join(&m)), "replica {j}");
    }
    let m = "chain-0/metrics.jsonl";
    assert_eq!(lines_of(&a.join(m)), lines_of(&b.join(m)), "the T0 chain");
}

#[test]
fn replicas_on_two_and_four_ranks_equal_one_process() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path();
    ok(single(&replica_args(out, "one")), "one process");
    let one = summary(&out.join("one"));
    let swaps: u64 = one["replica_exchange"]["ladder"]["swaps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_u64().unwrap())
        .sum();
    // Swaps happen, so the equality below covers temperatures that moved between ranks.
    assert!(swaps >= 3, "{swaps} swaps: {}", one["replica_exchange"]);
    assert_eq!(one["replica_exchange"]["exchange_bytes"], 0);
    for ranks in [2, 4] {
        let name = format!("ranks{ranks}");
        let o = ok(
            mpirun(ranks, &replica_args(out, &name)).output().unwrap(),
            &name,
        );
        assert_eq!(String::from_utf8_lossy(&o.stdout).lines().count(), 1);
        let run = out.join(&name);
        same_replica_run(&out.join("one"), &run);
        let rx = &summary(&run)["replica_exchange"];
        let bytes = rx["exchange_bytes"].as_u64().unwrap();
        let rounds = rx["ladder"]["rounds"].as_u64().unwrap();
        // At least the first stage's 256 energies of each side of each try, as f64.
        let tries = rx["exchange_estimates"].as_u64().unwrap();
        assert!(
            bytes >= tries * 2 * 256 * 8,
            "{bytes} bytes for {tries} tries"
        );
        eprintln!(
            "{ranks} ranks: {bytes} bytes of energies over {rounds} exchange rounds ({} per \
             round); {} bytes of T0 predictions",
            bytes / rounds,
            rx["pooled_bytes"]
        );
        assert_eq!(eval_ensemble(&run), one["ensemble"]);
    }
    // More ranks than replicas is refused.
    let o = mpirun(5, &replica_args(out, "five")).output().unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("5 MPI ranks for 4 replica(s)"), "{err}");
}

#[test]
fn a_replica_run_killed_on_two_ranks_resumes_on_four() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path();
    ok(single(&replica_args(out, "whole")), "uninterrupted");
    let run = out.join("killed");
    let child = mpirun(2, &replica_args(out, "killed"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Kill rank 1 once a state past the start is saved.
    let record = run.join("replicas.json");
    kill_rank_one_when(child, || {
        std::fs::read(&record)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|v| v["step"].as_u64())
            .is_some_and(|s| s > 0)
    });
    let resume = ["train", "--resume", run.to_str().unwrap(), "--no-progress"].map(String::from);
    ok(mpirun(4, &resume).output().unwrap(), "resume on 4 ranks");
    same_replica_run(&out.join("whole"), &run);
}
