//! Where a chain's results go. The chain ([`super::run_chain_in`]) runs the updates and
//! hands each posterior sample, metrics line, diagnostics line and saved state to a
//! [`ChainSink`]; it reads a saved state back from the sink to resume or to roll back.
//! [`RunFolder`] is the sink of `bnn train` (the files of a run folder); [`InMemory`]
//! keeps everything in memory, for a program that wants the samples without a folder.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use candle_core::Tensor;

use super::diagnostics::DiagnosticRecord;
use super::{EpochRecord, HmcRecord};
use crate::checkpoint;
use crate::error::{Error, Result};
use crate::run_state::{Position, RunState};

/// What a chain hands on as it runs.
pub trait ChainSink {
    /// A kept posterior sample: the parameters (by name, in the model's order) after
    /// update `step`, with the metadata a sample file records.
    fn sample(
        &mut self,
        step: u64,
        params: Vec<(String, Tensor)>,
        metadata: BTreeMap<String, String>,
    ) -> Result<()>;
    /// The line of an epoch that ended.
    fn metrics(&mut self, record: &EpochRecord) -> Result<()>;
    /// The line of an HMC iteration that ended (full-batch HMC's chains, whose epochs are
    /// its iterations).
    fn iteration(&mut self, record: &HmcRecord) -> Result<()>;
    /// A line of the sampler's diagnostics (every `log_every` updates and at epochs' ends).
    fn diagnostics(&mut self, record: &DiagnosticRecord) -> Result<()>;
    /// The chain's state at a checkpoint; it replaces the one saved before.
    fn save_state(&mut self, state: &RunState) -> Result<()>;
    /// The state saved last (`names`: the model's parameters in order).
    fn load_state(&mut self, names: &[String]) -> Result<RunState>;
    /// Drops what was handed on after the state `at` (samples of later updates, lines of
    /// later epochs and updates): before a resume or after a rollback, the chain hands them
    /// on again, identically.
    fn discard_after(&mut self, at: &Position) -> Result<()>;
    /// Where the results go, for messages (a folder; a tag for a sink in memory).
    fn location(&self) -> &Path;
}

/// The files of a run folder: `samples/`, `metrics.jsonl`, `diagnostics.jsonl` and
/// `state/chain.safetensors`, each written atomically or appended a line at a time.
#[derive(Debug, Clone)]
pub struct RunFolder {
    /// The folder (a run's, a chain's or a replica's).
    pub dir: PathBuf,
}

impl RunFolder {
    /// The sink of the folder `dir` (which must exist).
    pub fn new(dir: &Path) -> Self {
        RunFolder {
            dir: dir.to_path_buf(),
        }
    }
}

impl ChainSink for RunFolder {
    fn sample(
        &mut self,
        step: u64,
        params: Vec<(String, Tensor)>,
        metadata: BTreeMap<String, String>,
    ) -> Result<()> {
        let path = checkpoint::sample_path(&self.dir, step);
        checkpoint::write_sample_file(&path, &params, &metadata)
    }

    fn metrics(&mut self, record: &EpochRecord) -> Result<()> {
        super::chain::append_line(
            &self.dir.join(crate::checkpoint::files::METRICS),
            &super::chain::to_json(record)?,
        )
    }

    fn iteration(&mut self, record: &HmcRecord) -> Result<()> {
        super::chain::append_line(
            &self.dir.join(crate::checkpoint::files::METRICS),
            &super::chain::to_json(record)?,
        )
    }

    fn diagnostics(&mut self, record: &DiagnosticRecord) -> Result<()> {
        super::chain::append_line(
            &self.dir.join(crate::checkpoint::files::DIAGNOSTICS),
            &super::chain::to_json(record)?,
        )
    }

    fn save_state(&mut self, state: &RunState) -> Result<()> {
        state.save(&self.dir)
    }

    fn load_state(&mut self, names: &[String]) -> Result<RunState> {
        RunState::load(&self.dir, names)
    }

    fn discard_after(&mut self, at: &Position) -> Result<()> {
        super::chain::discard_after(&self.dir, at)
    }

    fn location(&self) -> &Path {
        &self.dir
    }
}

/// A kept posterior sample in memory.
#[derive(Debug, Clone)]
pub struct PosteriorSample {
    /// The update after which it was taken.
    pub step: u64,
    /// θ by name, in the model's order.
    pub params: Vec<(String, Tensor)>,
    /// What a sample file would record with it.
    pub metadata: BTreeMap<String, String>,
}

/// Everything a chain hands on, kept in memory.
#[derive(Debug, Clone, Default)]
pub struct InMemory {
    /// The posterior samples, in order.
    pub samples: Vec<PosteriorSample>,
    /// One record per epoch.
    pub metrics: Vec<EpochRecord>,
    /// One record per HMC iteration.
    pub iterations: Vec<HmcRecord>,
    /// The diagnostics lines.
    pub diagnostics: Vec<DiagnosticRecord>,
    /// The state saved last.
    pub state: Option<RunState>,
}

impl ChainSink for InMemory {
    fn sample(
        &mut self,
        step: u64,
        params: Vec<(String, Tensor)>,
        metadata: BTreeMap<String, String>,
    ) -> Result<()> {
        // The chain's vars change in place at the next update: keep a copy.
        let params = params
            .into_iter()
            .map(|(n, t)| Ok((n, t.copy()?)))
            .collect::<Result<_>>()?;
        self.samples.push(PosteriorSample {
            step,
            params,
            metadata,
        });
        Ok(())
    }

    fn metrics(&mut self, record: &EpochRecord) -> Result<()> {
        self.metrics.push(record.clone());
        Ok(())
    }

    fn iteration(&mut self, record: &HmcRecord) -> Result<()> {
        self.iterations.push(record.clone());
        Ok(())
    }

    fn diagnostics(&mut self, record: &DiagnosticRecord) -> Result<()> {
        self.diagnostics.push(record.clone());
        Ok(())
    }

    fn save_state(&mut self, state: &RunState) -> Result<()> {
        // θ as the chain hands it shares storage with its vars, which the next update
        // changes in place: keep a copy.
        let mut state = state.clone();
        for (_, t) in &mut state.params {
            *t = t.copy()?;
        }
        self.state = Some(state);
        Ok(())
    }

    fn load_state(&mut self, names: &[String]) -> Result<RunState> {
        let state = self
            .state
            .clone()
            .ok_or_else(|| Error::Checkpoint("no state was saved in memory".into()))?;
        let saved: Vec<&String> = state.params.iter().map(|(n, _)| n).collect();
        if saved != names.iter().collect::<Vec<_>>() {
            return Err(Error::Checkpoint(format!(
                "the state in memory has parameters {saved:?}, the model {names:?}"
            )));
        }
        Ok(state)
    }

    fn discard_after(&mut self, at: &Position) -> Result<()> {
        self.samples.retain(|s| s.step <= at.step);
        self.metrics.truncate(at.epoch);
        self.iterations.truncate(at.epoch);
        self.diagnostics.retain(|d| d.step <= at.step);
        Ok(())
    }

    fn location(&self) -> &Path {
        Path::new("(in memory)")
    }
}
