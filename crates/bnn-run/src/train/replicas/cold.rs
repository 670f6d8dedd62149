//! The T₀ chain of a replica run, kept at rank 0 whichever replica (on whichever rank)
//! holds T₀.
//!
//! During a round the holder writes its samples into `RUN/chain-0/samples/` itself (the file
//! system every rank sees) and evaluates them; what it adds to the T₀ chain's ensembles and
//! to its `metrics.jsonl` is queued as [`Event`]s. At the round's end rank 0 takes the queue
//! (from another rank: JSON, with the predictions after it as raw f32 bytes) and replays it
//! in order: the ensembles sum the samples in the order one process does, whatever the
//! number of ranks, and each epoch's line carries the ensembles as they stood at that
//! epoch's end. Parameters never leave their rank; a sample's predictive probabilities do
//! (pooled evaluation).

use serde::{Deserialize, Serialize};

use super::super::chain::{log_epoch, Kept, KeptSample};
use super::super::sink::{ChainSink, RunFolder};
use super::super::EpochRecord;
use crate::ensemble::Prediction;
use crate::error::{Error, Result};
use crate::ranks::Ranks;

/// What the replica holding T₀ did, in order.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Event {
    /// A sample kept: its predictions and kinetic energy.
    Sample(KeptSample),
    /// An epoch ended: its line without the ensembles (filled in at rank 0).
    Epoch(Box<EpochRecord>),
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
        false => encode(&mine).map_err(|e| Error::Config(format!("rank {}: {e}", ranks.rank())))?,
    };
    let Some(all) = ranks.gather(bytes) else {
        return Ok(0);
    };
    let mut sent = 0;
    for (rank, bytes) in all.iter().enumerate().filter(|(_, b)| !b.is_empty()) {
        let events = decode(bytes).map_err(|e| Error::Config(format!("rank {rank}: {e}")))?;
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
            Event::Sample(sample) => cold.add(sample)?,
            Event::Epoch(mut r) => {
                r.samples = cold.samples();
                let classes = cold.test.classes();
                r.test_ensemble = classes.and_then(|a| a.metrics());
                r.test_regression = cold.test.gaussian().and_then(|a| a.metrics());
                r.test_last_sample = classes.and_then(|a| a.last_sample);
                r.valid_ensemble = cold.valid.as_ref().and_then(|a| a.metrics());
                RunFolder::new(cold_dir).metrics(&r)?;
                log_epoch(&r, r.temperature);
            }
        }
    }
    Ok(())
}

/// An event as sent: a sample's predictions travel after the JSON, as raw f32 bytes.
#[derive(Serialize, Deserialize)]
enum Sent {
    Sample {
        test: usize,
        valid: Option<usize>,
        kinetic_energy: Option<f64>,
    },
    Epoch(Box<EpochRecord>),
}

/// `events` as bytes: the JSON's length (8 bytes, little-endian), the JSON of what they
/// are, then every sample's test and validation probabilities as little-endian f32, in
/// order (exact, and 4 bytes each).
fn encode(events: &[Event]) -> Result<Vec<u8>> {
    let mut floats: Vec<&[f32]> = Vec::new();
    let sent: Vec<Sent> = events
        .iter()
        .map(|e| match e {
            Event::Sample(k) => {
                // A regression runs in one process (`train` refuses ranks for it).
                let Prediction::Classes(test) = &k.test else {
                    return Err(Error::Config(
                        "a regression's predictions do not cross ranks".into(),
                    ));
                };
                let valid = match &k.valid {
                    None => None,
                    Some(Prediction::Classes(v)) => Some(v.as_slice()),
                    Some(_) => {
                        return Err(Error::Config("only class probabilities cross ranks".into()))
                    }
                };
                floats.push(test);
                floats.extend(valid);
                Ok(Sent::Sample {
                    test: test.len(),
                    valid: valid.map(<[f32]>::len),
                    kinetic_energy: k.kinetic_energy,
                })
            }
            Event::Epoch(line) => Ok(Sent::Epoch(line.clone())),
        })
        .collect::<Result<_>>()?;
    let json = serde_json::to_vec(&sent)
        .map_err(|e| Error::Config(format!("T0 events not encoded: {e}")))?;
    let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
    bytes.extend(json);
    for v in floats {
        bytes.extend(v.iter().flat_map(|x| x.to_le_bytes()));
    }
    Ok(bytes)
}

/// The events [`encode`] wrote; an error, never a misreading, on anything else.
fn decode(bytes: &[u8]) -> Result<Vec<Event>> {
    let garbled = |what: &str| Error::Config(format!("T0 events arrived garbled: {what}"));
    let (len, rest) = bytes
        .split_first_chunk::<8>()
        .ok_or_else(|| garbled("no length"))?;
    let len = usize::try_from(u64::from_le_bytes(*len)).map_err(|_| garbled("length"))?;
    let json = rest.get(..len).ok_or_else(|| garbled("short JSON"))?;
    let sent: Vec<Sent> = serde_json::from_slice(json).map_err(|e| garbled(&e.to_string()))?;
    let payload = &rest[len..];
    if payload.len() % 4 != 0 {
        return Err(garbled("a partial f32"));
    }
    let mut floats = payload
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    let mut take = |n: usize| -> Result<Vec<f32>> {
        let v: Vec<f32> = floats.by_ref().take(n).collect();
        (v.len() == n)
            .then_some(v)
            .ok_or_else(|| garbled("too few f32s"))
    };
    let mut events = Vec::with_capacity(sent.len());
    for s in sent {
        events.push(match s {
            Sent::Sample {
                test,
                valid,
                kinetic_energy,
            } => Event::Sample(KeptSample {
                test: Prediction::Classes(take(test)?),
                valid: valid.map(&mut take).transpose()?.map(Prediction::Classes),
                kinetic_energy,
            }),
            Sent::Epoch(line) => Event::Epoch(line),
        });
    }
    match floats.next() {
        Some(_) => Err(garbled("f32s left over")),
        None => Ok(events),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_cross_as_the_same_bits() {
        let sample = |valid| {
            Event::Sample(KeptSample {
                test: Prediction::Classes(vec![
                    0.1,
                    f32::MIN_POSITIVE / 3.0,
                    1.0 - f32::EPSILON,
                    7e-38,
                ]),
                valid,
                kinetic_energy: Some(0.51),
            })
        };
        let line: EpochRecord = serde_json::from_value(serde_json::json!({
            "replica": 2, "temperature": 1.5, "epoch": 3, "steps": 90, "train_nll": 0.25,
            "train_accuracy": 0.9, "step_size": 1e-6, "kinetic_energy": null,
            "thermostat": null, "prior_precisions": [1.0], "samples": 0,
            "test_ensemble": null, "test_last_sample": null, "valid_ensemble": null,
            "seconds": 0.5
        }))
        .unwrap();
        let events = vec![
            sample(Some(Prediction::Classes(vec![0.25, 0.75]))),
            Event::Epoch(Box::new(line)),
            sample(None),
        ];
        let bytes = encode(&events).unwrap();
        assert_eq!(decode(&bytes).unwrap(), events);
        // Cut short, or with an f32 too many, it is refused rather than misread.
        assert!(decode(&bytes[..bytes.len() - 4]).is_err());
        let mut longer = bytes.clone();
        longer.extend([0; 4]);
        assert!(decode(&longer).is_err());
        assert!(decode(&bytes[..5]).is_err());
    }
}
