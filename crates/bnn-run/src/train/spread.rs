//! Chains spread over the ranks of an MPI job (`mpirun -n R bnn train --chains K`).
//!
//! Chain k runs on rank k mod R with the seed it has in one process
//! ([`crate::rng::chain_seed`]) and writes `RUN/chain-k/` on the file system every rank
//! sees, so its samples are the same bytes whatever R is. When a rank's chains end it sends
//! their outcomes (the ensemble's per-example sums among them) to rank 0, which puts every
//! chain back in the order k and pools them as one process does: the summary does not
//! depend on R either. Only scalars and these sums cross between ranks, never parameters.

use serde::{Deserialize, Serialize};

use super::chain::ChainOutcome;
use crate::data::Dataset;
use crate::ensemble::{Accumulator, AccumulatorState, Ensemble, Sums};
use crate::error::{Error, Result};
use crate::potential::Backward;
use crate::ranks::Ranks;

/// A chain's outcome as plain data; JSON with exact floats (`float_roundtrip`).
#[derive(Serialize, Deserialize)]
struct Sent {
    k: usize,
    seed: u64,
    num_params: usize,
    steps: u64,
    step_seconds: f64,
    train_seconds: f64,
    kinetic_trace: Vec<f64>,
    backward: Backward,
    rollbacks: u32,
    test: (AccumulatorState, Vec<f64>, Vec<f64>),
    valid: Option<(AccumulatorState, Vec<f64>, Vec<f64>)>,
}

fn sums_of(a: &Accumulator) -> (AccumulatorState, Vec<f64>, Vec<f64>) {
    let (state, sums) = a.state();
    (state, sums.probability, sums.entropy)
}

/// Every rank's chains at rank 0, in the order k (`None` on the other ranks).
pub(super) fn gather(
    ranks: &Ranks,
    ds: &Dataset,
    mut mine: Vec<(usize, ChainOutcome)>,
) -> Result<Option<Vec<ChainOutcome>>> {
    if ranks.size() == 1 {
        // One process: its chains are all there is, nothing to encode.
        mine.sort_by_key(|(k, _)| *k);
        return Ok(Some(mine.into_iter().map(|(_, c)| c).collect()));
    }
    let sent: Vec<Sent> =
        mine.into_iter()
            .map(|(k, c)| {
                // A regression runs on one rank (`train_on` refuses more).
                let test = c.test.classes().ok_or_else(|| {
                    Error::Config("a regression's chains do not cross ranks".into())
                })?;
                Ok(Sent {
                    k,
                    seed: c.seed,
                    num_params: c.num_params,
                    steps: c.steps,
                    step_seconds: c.step_seconds,
                    train_seconds: c.train_seconds,
                    kinetic_trace: c.kinetic_trace,
                    backward: c.backward,
                    rollbacks: c.rollbacks,
                    test: sums_of(test),
                    valid: c.valid.as_ref().map(sums_of),
                })
            })
            .collect::<Result<_>>()?;
    let bytes = serde_json::to_vec(&sent)
        .map_err(|e| Error::Config(format!("rank {}: chains not encoded: {e}", ranks.rank())))?;
    let Some(all) = ranks.gather(bytes) else {
        return Ok(None);
    };
    let mut chains = Vec::new();
    for (rank, bytes) in all.iter().enumerate() {
        let sent: Vec<Sent> = serde_json::from_slice(bytes)
            .map_err(|e| Error::Config(format!("rank {rank}: its chains arrived garbled: {e}")))?;
        for s in sent {
            let restore = |(state, probability, entropy), labels: &[u8]| {
                Accumulator::restore(
                    labels,
                    state,
                    Sums {
                        probability,
                        entropy,
                    },
                )
            };
            let valid = match (s.valid, &ds.valid) {
                (Some(v), Some(split)) => Some(restore(v, &split.labels)?),
                _ => None,
            };
            let outcome = ChainOutcome {
                seed: s.seed,
                num_params: s.num_params,
                test: Ensemble::Classes(restore(s.test, &ds.test.labels)?),
                valid,
                steps: s.steps,
                step_seconds: s.step_seconds,
                train_seconds: s.train_seconds,
                kinetic_trace: s.kinetic_trace,
                backward: s.backward,
                executor: None,
                rollbacks: s.rollbacks,
            };
            chains.push((s.k, outcome));
        }
    }
    chains.sort_by_key(|(k, _)| *k);
    Ok(Some(chains.into_iter().map(|(_, c)| c).collect()))
}
