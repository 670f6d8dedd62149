//! `bnn bench plan`: the step plan of an MLP's update as a figure — its launches, the
//! bytes each moves, the workspace, and the host reads — for K = 1 and K chains. Nothing
//! is timed: the figures follow from the plan's shapes (`bnn_kernels::plan`).

use serde::Serialize;

use crate::data::NUM_CLASSES;
use crate::engine::planned::update_of;
use crate::error::Result;
use crate::kernels::plan::mlp::{MlpPlan, MlpShape};
use crate::kernels::plan::traffic::Row;
use crate::kernels::plan::{Act, TALLY};
use crate::sampler::SamplerParams;

/// MNIST's training rows: the resident set the plan's gather reads.
const TRAIN_ROWS: usize = 60_000;
/// MNIST's test rows: the held-out set whose probabilities a thinning point computes.
const TEST_ROWS: usize = 10_000;

/// One plan: a network at a batch and a number of chains.
#[derive(Debug, Clone, Serialize)]
pub struct PlanBench {
    /// The widths, input to classes.
    pub widths: Vec<usize>,
    /// B.
    pub batch: usize,
    /// K.
    pub chains: usize,
    /// The sampler's name.
    pub sampler: String,
    /// Launches of one update of all K chains (one per operation).
    pub launches: usize,
    /// Host reads inside an epoch: every operation is a device launch, and the chains'
    /// control blocks (NLL, hits, thermostat, halt flag) are read at the epoch's end and
    /// for a progress line (at most one a second), not per update.
    pub host_reads_per_update: usize,
    /// Reads per epoch: the control blocks, once.
    pub host_reads_per_epoch: usize,
    /// Bytes every operation reads and writes, each operand once, summed.
    pub bytes_per_update: usize,
    /// Bytes of the workspace, allocated once (the resident training and test sets
    /// included).
    pub workspace_bytes: usize,
    /// Launches of a kept sample on the test set, every chain at once: the forward pass
    /// (chunks of K·R ≤ 8,192 rows), the fold of the probabilities into each chain's
    /// ensemble on the device and the tally of the metrics (2 launches).
    pub prediction_launches: usize,
    /// Bytes the host reads then: each chain's tallies, its sample's and its ensemble's
    /// (the probabilities and the sums stay on the device).
    pub prediction_read_bytes: usize,
    /// Bytes of the ensembles' sums, read before a checkpoint and at the end.
    pub ensemble_sums_bytes: usize,
    /// One row per launch.
    pub ops: Vec<Row>,
}

/// The plans of `hidden` at `batch` for each K of `chains` under `sampler`.
pub fn plan(
    hidden: &[usize],
    batch: usize,
    chains: &[usize],
    sampler: SamplerParams,
) -> Result<Vec<PlanBench>> {
    let mut widths = vec![784];
    widths.extend(hidden);
    widths.push(NUM_CLASSES);
    let update = update_of(&sampler)?;
    chains
        .iter()
        .map(|&k| {
            let shape = MlpShape {
                widths: widths.clone(),
                act: Act::Relu,
                batch,
                chains: k,
                rows: TRAIN_ROWS,
                epoch_rows: TRAIN_ROWS / batch * batch,
                update,
                gaussian: false,
                held_out: vec![TEST_ROWS],
            };
            let mlp = MlpPlan::new(shape)?;
            let held = &mlp.held_out[0];
            let ops = mlp.plan.rows();
            Ok(PlanBench {
                widths: widths.clone(),
                batch,
                chains: k,
                sampler: sampler.kind().name().to_string(),
                launches: mlp.plan.launches(),
                host_reads_per_update: 0,
                host_reads_per_epoch: 1,
                bytes_per_update: ops.iter().map(|r| r.bytes).sum(),
                workspace_bytes: mlp.plan.workspace_bytes(),
                prediction_launches: held.ops.len() + held.fold.len(),
                prediction_read_bytes: k * 2 * TALLY * 8,
                ensemble_sums_bytes: k * TEST_ROWS * (NUM_CLASSES + 1) * 8,
                ops,
            })
        })
        .collect()
}
