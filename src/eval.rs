//! `bnn eval`: streams every saved sample of a run through the test (and validation) set
//! and reports the Bayesian model average, exactly as the in-training accumulator did.

use std::path::{Path, PathBuf};

use candle_core::Device;
use serde::{Deserialize, Serialize};

use crate::checkpoint::{self, RunManifest};
use crate::data::{self, Dataset, LoadOptions, NUM_CLASSES};
use crate::ensemble::{self, Accumulator, Progress};
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::model::Network;

/// What `bnn eval` prints.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EvalReport {
    pub run_dir: String,
    pub dataset: String,
    pub samples: usize,
    pub ensemble: Option<Metrics>,
    pub last_sample: Option<Metrics>,
    pub valid_ensemble: Option<Metrics>,
    /// Test accuracy and NLL of the ensemble of the first k samples, for each k (of the
    /// first chain, in a multi-chain run).
    pub progress: Vec<Progress>,
}

/// Reloads the data a run was trained on: the folder recorded in `run.json` unless
/// `data_dir` overrides it.
pub fn load_run_data(
    manifest: &RunManifest,
    data_dir: Option<PathBuf>,
    offline: bool,
) -> Result<Dataset> {
    let recorded = PathBuf::from(&manifest.data_source);
    let data_dir = data_dir
        .or_else(|| (manifest.data_source != "built-in" && recorded.is_dir()).then_some(recorded));
    let opts = LoadOptions {
        data_dir,
        offline,
        mirror: None,
        valid: manifest.valid,
        builtin_fallback: false,
    };
    let mut ds = data::load(&manifest.dataset, &opts)?;
    ds.set_standardization(manifest.standardization.clone())?;
    if ds.train.len() != manifest.train_examples || ds.train.dim() != manifest.input_dim {
        return Err(Error::Data(format!(
            "the data found ({} training examples of dimension {}) is not what the run was trained on ({} of dimension {})",
            ds.train.len(),
            ds.train.dim(),
            manifest.train_examples,
            manifest.input_dim
        )));
    }
    Ok(ds)
}

/// Evaluates every sample of the run in `run_dir` on `ds`.
pub fn evaluate_run(
    run_dir: &Path,
    manifest: &RunManifest,
    ds: &Dataset,
    device: &Device,
) -> Result<EvalReport> {
    let device = device.clone();
    let model = Network::new(
        &manifest.settings.model,
        manifest.input_dim,
        NUM_CLASSES,
        0,
        &device,
    )?;
    // Chain by chain, then pooled in chain order, as training pools them.
    let (mut tests, mut valids) = (Vec::new(), Vec::new());
    for dir in checkpoint::chain_dirs(run_dir) {
        let paths = checkpoint::list_samples(&dir)?;
        if paths.is_empty() {
            return Err(Error::Checkpoint(format!(
                "{}: no samples (sample-*.safetensors) in {}",
                run_dir.display(),
                checkpoint::samples_dir(&dir).display()
            )));
        }
        let mut test = Accumulator::new(&ds.test.labels);
        let mut valid = ds.valid.as_ref().map(|v| Accumulator::new(&v.labels));
        for path in &paths {
            let sample = checkpoint::load_sample(path, &device)?;
            model
                .load(&sample.tensors)
                .map_err(|e| Error::Checkpoint(format!("{}: {e}", path.display())))?;
            test.add(&ensemble::predict(&model, &ds.test, &device)?);
            if let (Some(acc), Some(v)) = (valid.as_mut(), ds.valid.as_ref()) {
                acc.add(&ensemble::predict(&model, v, &device)?);
            }
        }
        tests.push(test);
        valids.extend(valid);
    }
    let test = Accumulator::pooled(&tests)?;
    let valid = match valids.is_empty() {
        true => None,
        false => Some(Accumulator::pooled(&valids)?),
    };
    Ok(EvalReport {
        run_dir: run_dir.display().to_string(),
        dataset: manifest.dataset.clone(),
        samples: test.samples(),
        ensemble: test.metrics(),
        last_sample: test.last_sample,
        valid_ensemble: valid.as_ref().and_then(|a| a.metrics()),
        progress: test.progress(),
    })
}
