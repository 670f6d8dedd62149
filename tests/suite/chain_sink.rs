//! A chain in memory: the library's chain hands its samples, metrics lines, diagnostics
//! and states to a sink the caller gives. The run folder is one such sink; in memory the
//! chain gives the same bits, and it resumes from a state it holds in memory.

use bnn::checkpoint;
use bnn::data::{self, Dataset};
use bnn::ensemble::Ensemble;
use bnn::settings::Settings;
use bnn::train::sink::InMemory;
use bnn::train::{self, run_chain_in, EpochRecord, TrainConfig};
use candle_core::{Device, Tensor};

/// Short epochs (20 updates) of SGNHT, a sample every 8 updates after the first epoch,
/// diagnostics every 15 updates.
fn config(run_dir: std::path::PathBuf, epochs: usize) -> TrainConfig {
    let defaults = Settings::default();
    let settings = Settings {
        sampler: bnn::sampler::SamplerKind::Sgnht.defaults(),
        epochs,
        schedule: bnn::schedule::Schedule {
            burnin: 1,
            thin: 8,
            decay_at: vec![1],
            ..defaults.schedule.clone()
        },
        log_every: 15,
        seed: 3,
        ..defaults
    };
    TrainConfig {
        settings,
        run_dir,
        progress: false,
        device: Device::Cpu,
        resume: false,
        command_line: Vec::new(),
    }
}

/// The first 2,000 training and 1,000 test images of the built-in subset.
fn data() -> Dataset {
    let mut ds = data::load_builtin().unwrap();
    for (split, n) in [(&mut ds.train, 2000), (&mut ds.test, 1000)] {
        let dim = split.dim();
        split.images.truncate(n * dim);
        split.labels.truncate(n);
    }
    ds
}

fn bits(t: &Tensor) -> Vec<u32> {
    let v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    v.iter().map(|x| x.to_bits()).collect()
}

/// The records without their wall-clock seconds.
fn untimed(records: &[EpochRecord]) -> Vec<EpochRecord> {
    records
        .iter()
        .map(|r| EpochRecord {
            seconds: 0.0,
            ..r.clone()
        })
        .collect()
}

#[test]
fn a_chain_in_memory_gives_the_run_folders_samples_and_resumes_from_memory() {
    let ds = data();
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let on_disk = train::train(&config(run_dir.clone(), 3), &ds).unwrap();

    let cfg = config(dir.path().join("unused"), 3);
    let (outcome, memory) = run_chain_in(&cfg, &ds, InMemory::default(), false, 3).unwrap();
    assert!(!cfg.run_dir.exists(), "a chain in memory wrote a folder");

    // The same samples, bit for bit, after the same updates.
    let files = checkpoint::list_samples_by_step(&run_dir).unwrap();
    assert_eq!(files.len(), memory.samples.len());
    assert!(files.len() >= 4, "{} samples", files.len());
    for ((step, path), kept) in files.iter().zip(&memory.samples) {
        assert_eq!(*step, kept.step);
        let file = checkpoint::load_sample(path, &Device::Cpu).unwrap();
        for (name, t) in &kept.params {
            assert!(
                bits(&file.tensors[name]) == bits(t),
                "sample {step}, {name} differs"
            );
        }
    }
    // The same metrics lines and ensemble.
    let text = std::fs::read_to_string(run_dir.join("metrics.jsonl")).unwrap();
    let lines: Vec<EpochRecord> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(untimed(&lines), untimed(&memory.metrics));
    let metrics = |e: &Ensemble| e.classes().and_then(|a| a.metrics());
    assert_eq!(metrics(&outcome.test), on_disk.ensemble);
    let diagnostics = std::fs::read_to_string(run_dir.join("diagnostics.jsonl")).unwrap();
    assert_eq!(diagnostics.lines().count(), memory.diagnostics.len());

    // Two epochs in memory, then a third resumed from the state the sink holds: the
    // same samples as the three epochs in one go.
    let (_, after_two) = run_chain_in(
        &config(dir.path().join("unused"), 2),
        &ds,
        InMemory::default(),
        false,
        3,
    )
    .unwrap();
    let (resumed, continued) = run_chain_in(&cfg, &ds, after_two, true, 3).unwrap();
    assert_eq!(continued.samples.len(), memory.samples.len());
    let last = |m: &InMemory| bits(&m.samples.last().unwrap().params[0].1);
    assert!(
        last(&continued) == last(&memory),
        "the resumed chain ends elsewhere"
    );
    assert_eq!(metrics(&resumed.test), metrics(&outcome.test));
    assert_eq!(untimed(&continued.metrics), untimed(&memory.metrics));
}
