//! Posterior samples on disk: one safetensors file per sample (tensor names are the
//! model's parameter names; the metadata says where the sample comes from), and the run
//! manifest `run.json`. Every file is written through a temporary name and a rename, so a
//! run cut off at any moment leaves only complete samples behind.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};

use crate::atomic::write_atomic;
use crate::error::{Error, Result};
pub use bnn_core::sample_file::{
    decode_tensor, encode_safetensors, load_sample, open_safetensors, write_sample_file, Checked,
    Sample, CHECKSUM_KEY,
};

/// `run.json`: everything needed to rebuild the model and reread the data of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunManifest {
    /// The `bnn` version that made the run.
    pub bnn_version: String,
    /// The dataset's name.
    pub dataset: String,
    /// Folder the data came from, or `built-in`.
    pub data_source: String,
    /// Training examples held out for validation.
    pub valid: usize,
    /// Training examples used.
    pub train_examples: usize,
    /// Features of an input.
    pub input_dim: usize,
    /// The network's outputs: classes, or 1 for a regression.
    pub num_classes: usize,
    /// What is predicted (absent in image runs: ten classes).
    #[serde(default = "ten_classes", skip_serializing_if = "is_ten_classes")]
    pub task: crate::data::Task,
    /// A table's CSV origin, split and standardisation (absent for images).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<crate::data::tabular::TableOrigin>,
    /// Parameters of the network.
    pub num_params: usize,
    /// The hyper-parameters (flattened: the keys of older runs).
    #[serde(flatten)]
    pub settings: crate::settings::Settings,
    /// The per-pixel input standardisation of `--standardize` (absent: pixels in [0, 1]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standardization: Option<crate::data::Standardization>,
    /// The `bnn train` command line that started the run; `--resume` re-reads it.
    #[serde(default)]
    pub command_line: Vec<String>,
}

fn ten_classes() -> crate::data::Task {
    crate::data::Task::TEN_CLASSES
}

fn is_ten_classes(t: &crate::data::Task) -> bool {
    *t == crate::data::Task::TEN_CLASSES
}

impl RunManifest {
    /// Writes `RUN/run.json` atomically.
    pub fn write(&self, run_dir: &Path) -> Result<()> {
        let json = serde_json::to_string_pretty(self)
            .map_err(|e| Error::Checkpoint(format!("serialising run.json: {e}")))?;
        write_atomic(
            &run_dir.join(crate::checkpoint::files::RUN),
            json.as_bytes(),
        )
    }

    /// Reads `RUN/run.json`.
    pub fn read(run_dir: &Path) -> Result<Self> {
        let path = run_dir.join(crate::checkpoint::files::RUN);
        let text = std::fs::read_to_string(&path).map_err(|e| {
            Error::Checkpoint(format!(
                "{}: cannot read the run manifest ({e}); is {} a folder made by `bnn train`?",
                path.display(),
                run_dir.display()
            ))
        })?;
        serde_json::from_str(&text).map_err(|e| {
            Error::Checkpoint(format!("{}: corrupt run manifest: {e}", path.display()))
        })
    }
}

/// The names of a run folder's files, written once: the writers here and the readers
/// (`bnn inspect`, `bnn plot`, resume) join them to a run's or a chain's folder.
pub mod files {
    /// The run's record: its settings, data and command line ([`super::RunManifest`]).
    pub const RUN: &str = "run.json";
    /// The run's result, written at its end.
    pub const SUMMARY: &str = "summary.json";
    /// A line per epoch of a chain (or replica).
    pub const METRICS: &str = "metrics.jsonl";
    /// A line of the sampler's diagnostics every `log_every` updates.
    pub const DIAGNOSTICS: &str = "diagnostics.jsonl";
}

/// The folder of chain `k` of a multi-chain run.
pub fn chain_dir(run_dir: &Path, k: usize) -> PathBuf {
    run_dir.join(format!("chain-{k}"))
}

/// The chains' folders of a run, in chain order: `chain-0`, `chain-1`, … if there are any,
/// else the run's own folder (a single-chain run).
pub fn chain_dirs(run_dir: &Path) -> Vec<PathBuf> {
    let mut k = 0;
    let mut dirs = Vec::new();
    while chain_dir(run_dir, k).is_dir() {
        dirs.push(chain_dir(run_dir, k));
        k += 1;
    }
    if dirs.is_empty() {
        dirs.push(run_dir.to_path_buf());
    }
    dirs
}

/// Every sample of a run, its chains' in chain order, each chain's in step order; an error
/// if there is none.
pub fn run_sample_paths(run_dir: &Path) -> Result<Vec<PathBuf>> {
    let mut all = Vec::new();
    for chain in chain_dirs(run_dir) {
        all.extend(list_samples(&chain)?);
    }
    if all.is_empty() {
        return Err(Error::Checkpoint(format!(
            "{}: no samples",
            run_dir.display()
        )));
    }
    Ok(all)
}

/// The folder holding the samples of a run.
pub fn samples_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("samples")
}

/// File name of the sample taken after `step` updates.
pub fn sample_path(run_dir: &Path, step: u64) -> PathBuf {
    samples_dir(run_dir).join(format!("sample-{step:08}.safetensors"))
}

/// A state file read back (`RUN/state/*.safetensors`: a chain's state between two
/// updates): checked as [`open_safetensors`] says, the JSON of its `state` metadata at the
/// format version its reader expects, and its tensors decoded on the CPU by name.
pub struct StateFile<S> {
    /// The `state` JSON.
    pub scalars: S,
    tensors: HashMap<String, Option<Tensor>>,
    path: PathBuf,
    what: &'static str,
}

impl<S: serde::de::DeserializeOwned> StateFile<S> {
    /// Reads the `what` (e.g. "run state") at `path`, whose JSON must say `"version":
    /// version`; `hint` follows the reason when the file cannot be read at all.
    pub fn read(path: &Path, what: &'static str, version: u32, hint: &str) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| {
            Error::Checkpoint(format!(
                "{}: cannot read the {what} ({e}); {hint}",
                path.display()
            ))
        })?;
        let corrupt =
            |e: String| Error::Checkpoint(format!("{}: corrupt {what}: {e}", path.display()));
        let checked = open_safetensors(&bytes).map_err(corrupt)?;
        let json = checked
            .metadata
            .get("state")
            .ok_or_else(|| corrupt("no `state` metadata".into()))?;
        let value: serde_json::Value =
            serde_json::from_str(json).map_err(|e| corrupt(e.to_string()))?;
        let found = value.get("version").and_then(serde_json::Value::as_u64);
        if found != Some(u64::from(version)) {
            let found = found.map_or("none".to_string(), |v| v.to_string());
            return Err(corrupt(format!(
                "format version {found}, this bnn reads {version}"
            )));
        }
        let scalars = serde_json::from_value(value).map_err(|e| corrupt(e.to_string()))?;
        let mut tensors = HashMap::new();
        for (name, view) in checked.tensors.tensors() {
            tensors.insert(name, decode_tensor(&view, &Device::Cpu)?);
        }
        Ok(StateFile {
            scalars,
            tensors,
            path: path.to_path_buf(),
            what,
        })
    }
}

impl<S> StateFile<S> {
    /// The error for a file whose content is not what it should be.
    pub fn corrupt(&self, why: &str) -> Error {
        Error::Checkpoint(format!(
            "{}: corrupt {}: {why}",
            self.path.display(),
            self.what
        ))
    }

    /// The tensor `name` (F32 or F64).
    pub fn tensor(&self, name: &str) -> Result<Tensor> {
        match self.tensors.get(name) {
            Some(Some(t)) => Ok(t.clone()),
            Some(None) => Err(self.corrupt(&format!("tensor `{name}` is neither F32 nor F64"))),
            None => Err(self.corrupt(&format!("no tensor `{name}`"))),
        }
    }

    /// The tensor `name`, flat, in f64.
    pub fn vector(&self, name: &str) -> Result<Vec<f64>> {
        Ok(self
            .tensor(name)?
            .flatten_all()?
            .to_dtype(DType::F64)?
            .to_vec1::<f64>()?)
    }
}

/// The sample files of a run, ordered by step.
pub fn list_samples(run_dir: &Path) -> Result<Vec<PathBuf>> {
    Ok(list_samples_by_step(run_dir)?
        .into_iter()
        .map(|(_, p)| p)
        .collect())
}

/// The sample files of a run with the step each was taken after, ordered by step.
pub fn list_samples_by_step(run_dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let dir = samples_dir(run_dir);
    let entries = std::fs::read_dir(&dir)
        .map_err(|e| Error::Checkpoint(format!("{}: cannot list samples ({e})", dir.display())))?;
    let mut found: Vec<(u64, PathBuf)> = Vec::new();
    for entry in entries {
        let path = entry.map_err(|e| Error::io(&dir, e))?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if let Some(step) = name
            .strip_prefix("sample-")
            .and_then(|s| s.strip_suffix(".safetensors"))
            .and_then(|s| s.parse::<u64>().ok())
        {
            found.push((step, path));
        }
    }
    found.sort();
    Ok(found)
}
