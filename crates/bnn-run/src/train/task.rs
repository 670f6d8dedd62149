//! What a chain does differently for a regression: its test ensemble is a Gaussian
//! mixture ([`RegressionAccumulator`]) in the target's own units, and the noise precision
//! τ has a Gibbs step of its own, from the training residuals.

use candle_core::Device;

use crate::data::{Dataset, Split, Task};
use crate::ensemble::{self, Accumulator, Ensemble};
use crate::error::{Error, Result};
use crate::model::Network;
use crate::regression::RegressionAccumulator;

/// A split's targets in the target's own units (standardisation undone).
pub fn targets(split: &Split, task: Task) -> Vec<f64> {
    match task {
        Task::Regression { mean, std } => split
            .values
            .iter()
            .map(|&v| v as f64 * std + mean)
            .collect(),
        Task::Classification { .. } => Vec::new(),
    }
}

/// The test rows' targets of a regression, in the target's units.
pub fn test_targets(ds: &Dataset) -> Vec<f64> {
    targets(&ds.test, ds.task)
}

/// The empty ensemble of a split: the classes' average, or a regression's mixture.
pub fn ensemble(split: &Split, task: Task) -> Result<Ensemble> {
    Ok(match task {
        Task::Classification { classes } => {
            Ensemble::Classes(Accumulator::with_classes(&split.labels, classes)?)
        }
        Task::Regression { .. } => {
            Ensemble::Gaussian(RegressionAccumulator::new(&targets(split, task)))
        }
    })
}

/// The empty class ensemble of a classifier's split (a validation set's).
pub fn class_ensemble(split: &Split, task: Task) -> Result<Accumulator> {
    match task {
        Task::Classification { classes } => Accumulator::with_classes(&split.labels, classes),
        Task::Regression { .. } => Err(Error::Config(
            "a regression is scored on its test rows, not a validation set".into(),
        )),
    }
}

/// One sample's predictive Gaussians on `split` in the target's units: the means
/// f(x)·std + mean and the noise variance std²/τ at every point.
pub fn predict_gaussians(
    model: &Network,
    split: &Split,
    task: Task,
    noise_precision: f64,
    device: &Device,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let Task::Regression { mean, std } = task else {
        return Err(Error::Config(
            "internal: Gaussian predictions of a classifier".into(),
        ));
    };
    let out = ensemble::outputs(model, split, device)?;
    let means = out.iter().map(|&f| f as f64 * std + mean).collect();
    let var = std * std / noise_precision;
    Ok((means, vec![var; out.len()]))
}

/// Σ(f(xᵢ) − yᵢ)² over the training split, in standardised units: what the noise
/// precision's Gibbs conditional reads.
pub fn training_sse(model: &Network, train: &Split, device: &Device) -> Result<f64> {
    let out = ensemble::outputs(model, train, device)?;
    Ok(out
        .iter()
        .zip(&train.values)
        .map(|(&f, &y)| ((f - y) as f64).powi(2))
        .sum())
}

/// The run's data and likelihood agree: a Gaussian likelihood on a regression's data,
/// a softmax on classes.
pub fn check(ds: &Dataset, likelihood: &crate::likelihood::Likelihood) -> Result<()> {
    match (ds.task.is_regression(), likelihood.is_categorical()) {
        (true, true) => Err(Error::Config(format!(
            "{} is a regression: it needs a Gaussian likelihood",
            ds.name
        ))),
        (false, false) => Err(Error::Config(format!(
            "{} holds classes: a Gaussian likelihood is for a regression",
            ds.name
        ))),
        _ if ds.task.is_regression() && ds.valid.is_some() => Err(Error::Config(
            "--valid holds out classification examples; a regression is scored on its test rows"
                .into(),
        )),
        _ => Ok(()),
    }
}
