//! The 1-D regression picture's numbers: on a grid of inputs, the ensemble's predictive
//! mean and standard deviation (the Gaussian mixture's, aleatoric and epistemic together)
//! beside those of the last sample alone (its mean and its own noise σ). `bnn plot` draws
//! them; a test checks that the ensemble's band widens away from the data.

use std::path::Path;

use candle_core::Device;
use serde::{Deserialize, Serialize};

use crate::checkpoint::{self, RunManifest};
use crate::data::{Split, Task};
use crate::error::{Error, Result};
use crate::model::Network;
use crate::regression::RegressionAccumulator;

/// The predictive band of a run with one input feature.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Band {
    /// The grid, in the feature's units.
    pub x: Vec<f64>,
    /// The ensemble's predictive mean at each x (the target's units).
    pub mean: Vec<f64>,
    /// Its predictive standard deviation: √(E σ² + Var μ) over the samples.
    pub std: Vec<f64>,
    /// The last sample's mean.
    pub sample_mean: Vec<f64>,
    /// The last sample's noise σ.
    pub sample_std: Vec<f64>,
    /// Samples in the ensemble.
    pub samples: usize,
}

impl Band {
    /// The ensemble's σ at the grid point nearest `x`.
    pub fn std_at(&self, x: f64) -> f64 {
        let nearest = (0..self.x.len())
            .min_by(|&a, &b| (self.x[a] - x).abs().total_cmp(&(self.x[b] - x).abs()));
        nearest.map_or(f64::NAN, |i| self.std[i])
    }
}

/// `points` evenly spaced from `lo` to `hi`.
pub fn grid(lo: f64, hi: f64, points: usize) -> Vec<f64> {
    let step = (hi - lo) / (points.max(2) - 1) as f64;
    (0..points.max(2)).map(|i| lo + step * i as f64).collect()
}

/// The band of the regression run in `run_dir` on the grid `x` (every chain's samples).
pub fn band(run_dir: &Path, manifest: &RunManifest, x: &[f64], device: &Device) -> Result<Band> {
    let origin = manifest.table.as_ref().filter(|t| t.features.len() == 1);
    let (Some(origin), Task::Regression { .. }) = (origin, manifest.task) else {
        return Err(Error::Config(format!(
            "{}: a band needs a regression on one input feature (such as --toy regression-1d)",
            run_dir.display()
        )));
    };
    let model = Network::new(&manifest.settings.model, 1, 1, 0, device)?;
    // The grid has no targets: zeros stand in for them (only the inputs are read).
    let split = Split::of_table(origin.standardise(x), 1, Vec::new(), vec![0.0; x.len()]);
    let mut all = RegressionAccumulator::without_targets(x.len());
    let mut last = (Vec::new(), Vec::new());
    for dir in checkpoint::chain_dirs(run_dir) {
        for path in checkpoint::list_samples(&dir)? {
            last = crate::eval::sample_gaussians(&model, &path, &split, manifest.task, device)?;
            all.add(&last.0, &last.1)?;
        }
    }
    let predictive = all.predictive();
    if predictive.is_empty() {
        return Err(Error::Checkpoint(format!(
            "{}: no samples",
            run_dir.display()
        )));
    }
    Ok(Band {
        x: x.to_vec(),
        mean: predictive.iter().map(|p| p.0).collect(),
        std: predictive.iter().map(|p| p.1.sqrt()).collect(),
        sample_mean: last.0,
        sample_std: last.1.iter().map(|v| v.sqrt()).collect(),
        samples: all.samples(),
    })
}
