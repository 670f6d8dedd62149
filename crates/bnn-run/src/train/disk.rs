//! What a run writes, checked against the free space before it starts, and a failed write
//! told with what to do. Every file of a run is written through [`crate::atomic`], so a
//! write that fails leaves the file as it was: earlier samples and the last state stay
//! whole, and the run can go on with `--resume` once there is room.

use std::path::Path;

use crate::data::{Dataset, NUM_CLASSES};
use crate::error::{Error, Result};

use super::TrainConfig;

/// Header room of one safetensors file (names, shapes, metadata), generously.
const HEADER_BYTES: u64 = 16 << 10;
/// Logs (metrics.jsonl, diagnostics.jsonl), run.json, summary.json.
const LOG_BYTES: u64 = 1 << 20;

/// The bytes a run will write, by kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskNeed {
    /// Samples still to write, over all chains.
    pub samples: u64,
    /// Bytes of one sample file.
    pub sample_bytes: u64,
    /// One chain's state file (params, momenta, thermostats, ensemble sums).
    pub state_bytes: u64,
    /// At the peak: the samples, two copies of each chain's state (the old one and its
    /// replacement before the rename), the logs.
    pub total: u64,
}

/// What the run of `cfg` on `ds` with `num_params` parameters per network will write;
/// `existing` samples of a resumed run are on disk already.
pub fn need(cfg: &TrainConfig, ds: &Dataset, num_params: usize, existing: u64) -> DiskNeed {
    let s = &cfg.settings;
    let p = num_params as u64;
    let batches = ds.train.len() / s.batch_size.max(1);
    let chains = s.chains.max(1) as u64;
    let samples = (s.schedule.samples_kept(batches, s.epochs) * chains).saturating_sub(existing);
    let sample_bytes = 4 * p + HEADER_BYTES;
    // Replica exchange keeps every replica's parameters and momenta in its one state.
    let networks = s.replicas.as_ref().map_or(1, |r| r.replicas.max(1)) as u64;
    // θ and the sampler's arrays (momentum, thermostats), f32 each.
    let per_network = 4 * p * (1 + s.sampler.kind.state_arrays() as u64);
    let examples = (ds.test.len() + ds.valid.as_ref().map_or(0, |v| v.len())) as u64;
    let ensemble = 8 * (NUM_CLASSES as u64 + 1) * examples;
    let state_bytes = networks * per_network + ensemble + HEADER_BYTES;
    let total = samples * sample_bytes + 2 * chains * state_bytes + LOG_BYTES;
    DiskNeed {
        samples,
        sample_bytes,
        state_bytes,
        total,
    }
}

fn megabytes(b: u64) -> String {
    format!("{:.1} MB", b as f64 / 1e6)
}

/// Says what the run will write and refuses to start when the file system of `run_dir`
/// has less free space (where the platform can tell).
pub fn check(need: &DiskNeed, run_dir: &Path) -> Result<()> {
    let free = crate::atomic::free_bytes(run_dir);
    tracing::info!(
        "disk: about {} ({} samples of {}, state {}); {} free",
        megabytes(need.total),
        need.samples,
        megabytes(need.sample_bytes),
        megabytes(need.state_bytes),
        free.map_or("unknown".into(), megabytes),
    );
    match free {
        Some(free) if free < need.total => Err(Error::Config(format!(
            "{}: the run needs about {} ({} samples of {}, state {}) but its file system has {} free; \
             make room, keep fewer samples (--thin) or write elsewhere (--out)",
            run_dir.display(),
            megabytes(need.total),
            need.samples,
            megabytes(need.sample_bytes),
            megabytes(need.state_bytes),
            megabytes(free),
        ))),
        _ => Ok(()),
    }
}

/// A write that failed for want of room or permission, told with what to do; other
/// errors as they are.
pub fn explain(e: Error, run_dir: &Path) -> Error {
    use std::io::ErrorKind::*;
    match e {
        Error::Io { path, source }
            if matches!(
                source.kind(),
                StorageFull | FileTooLarge | ReadOnlyFilesystem | PermissionDenied | QuotaExceeded
            ) =>
        {
            let chain0 = crate::checkpoint::chain_dir(run_dir, 0);
            let resumable = [run_dir, chain0.as_path()].iter().any(|d| {
                crate::run_state::state_path(d).exists()
                    || super::hmc_state::hmc_state_path(d).exists()
            });
            let advice = if resumable {
                format!(
                    "make room (or make the folder writable) and continue with `bnn train --resume {}`",
                    run_dir.display()
                )
            } else {
                "nothing resumable was written yet: make room (or make the folder writable), or write elsewhere (--out)".to_string()
            };
            Error::WriteFailed {
                path,
                source,
                advice,
            }
        }
        e => e,
    }
}
