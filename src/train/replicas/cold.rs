//! The T₀ chain of a replica run, kept at rank 0 whichever replica (on whichever rank)
//! holds T₀.
//!
//! During a round the holder writes its samples into `RUN/chain-0/samples/` itself (the file
//! system every rank sees) and evaluates them; what it adds to the T₀ chain's ensembles and
//! to its `metrics.jsonl` is queued as [`Event`]s. At the round's end rank 0 takes the queue
//! (sent as exact-float JSON from another rank) and replays it in order: the ensembles sum
//! the samples in the order one process does, whatever the number of ranks, and each
//! epoch's line carries the ensembles as they stood at that epoch's end. Parameters never
//! leave their rank; a sample's predictive probabilities do (pooled evaluation).

use serde::{Deserialize, Serialize};

use super::super::chain::{append_line, log_epoch, to_json, Kept, KeptSample};
use super::super::EpochRecord;
use crate::error::{Error, Result};
use crate::ranks::Ranks;

/// What the replica holding T₀ did, in order.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) enum Event {
    /// A sample kept: its predictions and kinetic energy.
    Sample(KeptSample),
    /// An epoch ended: its line without the ensembles (filled in at rank 0).
    Epoch(Box<ReplicaEpoch>),
}

/// A replica's line in its `metrics.jsonl` (and the T₀ chain's): the epoch's record, and
/// the temperature it held at the epoch's end.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct ReplicaEpoch {
    pub replica: usize,
    pub temperature: f64,
    #[serde(flatten)]
    pub record: EpochRecord,
}

/// Brings this round's events to rank 0 (`mine`: this rank's, empty where it does not hold
/// T₀) and replays them into `cold` and `cold_dir/metrics.jsonl` there. Returns the bytes
/// that crossed between ranks.
pub(super) fn settle(
    ranks: &Ranks,
    mine: Vec<Event>,
    cold: &mut Kept,
    cold_dir: &std::path::Path,
) -> Result<u64> {
    if ranks.size() == 1 {
        replay(mine, cold, cold_dir)?;
        return Ok(0);
    }
    let bytes = match mine.is_empty() {
        true => Vec::new(),
        false => serde_json::to_vec(&mine).map_err(|e| {
            Error::Config(format!(
                "rank {}: T0 samples not encoded: {e}",
                ranks.rank()
            ))
        })?,
    };
    let Some(all) = ranks.gather(bytes) else {
        return Ok(0);
    };
    let mut sent = 0;
    for (rank, bytes) in all.iter().enumerate().filter(|(_, b)| !b.is_empty()) {
        let events: Vec<Event> = serde_json::from_slice(bytes).map_err(|e| {
            Error::Config(format!("rank {rank}: its T0 samples arrived garbled: {e}"))
        })?;
        if rank != 0 {
            sent += bytes.len() as u64;
        }
        replay(events, cold, cold_dir)?;
    }
    Ok(sent)
}

fn replay(events: Vec<Event>, cold: &mut Kept, cold_dir: &std::path::Path) -> Result<()> {
    for event in events {
        match event {
            Event::Sample(sample) => cold.add(sample),
            Event::Epoch(mut line) => {
                let r = &mut line.record;
                r.samples = cold.test.samples();
                r.test_ensemble = cold.test.metrics();
                r.test_last_sample = cold.test.last_sample;
                r.valid_ensemble = cold.valid.as_ref().and_then(|a| a.metrics());
                append_line(&cold_dir.join("metrics.jsonl"), &to_json(&line)?)?;
                log_epoch(&line.record, Some(line.temperature));
            }
        }
    }
    Ok(())
}
