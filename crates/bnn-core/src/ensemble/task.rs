//! One ensemble type over either task: a classifier's streamed average of class
//! probabilities ([`Accumulator`]) or a regression's streamed Gaussian mixture
//! ([`RegressionAccumulator`]), so that a chain, the pooling of chains and the summary
//! handle a test set's ensemble without asking which task it is.

use super::{Accumulator, Folded};
use crate::error::{Error, Result};
use crate::regression::RegressionAccumulator;

/// The streamed Bayesian model average on one set of examples.
#[derive(Debug, Clone)]
pub enum Ensemble {
    /// Σₖ pₖ(y|x) over the samples: a classifier's.
    Classes(Accumulator),
    /// The mixture (1/K) Σₖ N(μₖ(x), σₖ²): a regression's.
    Gaussian(RegressionAccumulator),
}

/// One posterior sample's predictions on the ensemble's examples.
#[derive(Debug, Clone, PartialEq)]
pub enum Prediction {
    /// Class probabilities, row-major examples × classes.
    Classes(Vec<f32>),
    /// Class probabilities already folded into the ensemble's sums where they live.
    Folded(Folded),
    /// A Gaussian per example: its means and variances.
    Gaussian {
        /// μₖ(xᵢ).
        mean: Vec<f64>,
        /// σₖ²(xᵢ).
        var: Vec<f64>,
    },
}

impl Prediction {
    /// Some prediction is not finite (a diverged sample's softmax overflowed).
    pub fn has_non_finite(&self) -> bool {
        match self {
            Prediction::Classes(p) => p.iter().any(|v| !v.is_finite()),
            Prediction::Folded(f) => f.non_finite_rows > 0,
            Prediction::Gaussian { mean, var } => mean.iter().chain(var).any(|v| !v.is_finite()),
        }
    }
}

impl Ensemble {
    /// Adds one sample's predictions; an error when they are of the other task.
    pub fn add(&mut self, p: &Prediction) -> Result<()> {
        match (self, p) {
            (Ensemble::Classes(a), Prediction::Classes(probs)) => a.add(probs),
            (Ensemble::Classes(a), Prediction::Folded(f)) => {
                a.add_folded(f);
                Ok(())
            }
            (Ensemble::Gaussian(a), Prediction::Gaussian { mean, var }) => a.add(mean, var),
            _ => Err(Error::Config(
                "a sample's predictions are of the other task than its ensemble".into(),
            )),
        }
    }

    /// Samples added so far.
    pub fn samples(&self) -> usize {
        match self {
            Ensemble::Classes(a) => a.samples(),
            Ensemble::Gaussian(a) => a.samples(),
        }
    }

    /// Each sample's own mean NLL on the examples, in the order added.
    pub fn sample_nll(&self) -> &[f64] {
        match self {
            Ensemble::Classes(a) => a.sample_nll(),
            Ensemble::Gaussian(a) => a.sample_nll(),
        }
    }

    /// The classifier's ensemble, if it is one.
    pub fn classes(&self) -> Option<&Accumulator> {
        match self {
            Ensemble::Classes(a) => Some(a),
            Ensemble::Gaussian(_) => None,
        }
    }

    /// The regression's ensemble, if it is one.
    pub fn gaussian(&self) -> Option<&RegressionAccumulator> {
        match self {
            Ensemble::Gaussian(a) => Some(a),
            Ensemble::Classes(_) => None,
        }
    }

    /// The ensemble of several chains' samples on the same examples, their sums added in
    /// the order given; an error when they are empty or of different tasks.
    pub fn pooled<'a>(parts: impl IntoIterator<Item = &'a Ensemble>) -> Result<Ensemble> {
        let parts: Vec<&Ensemble> = parts.into_iter().collect();
        let mixed = || Error::Config("pooling ensembles of different tasks".into());
        match parts.first() {
            None => Err(Error::Config("no chains to pool".into())),
            Some(Ensemble::Classes(_)) => {
                let each = parts.iter().map(|e| e.classes().ok_or_else(mixed));
                let each = each.collect::<Result<Vec<_>>>()?;
                Ok(Ensemble::Classes(Accumulator::pooled(each)?))
            }
            Some(Ensemble::Gaussian(_)) => {
                let each = parts.iter().map(|e| e.gaussian().ok_or_else(mixed));
                let each = each.collect::<Result<Vec<_>>>()?;
                Ok(Ensemble::Gaussian(RegressionAccumulator::pooled(each)?))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each task's predictions reach its own accumulator, the other task's are refused,
    /// and pooling adds the samples of the chains or refuses mixed tasks.
    #[test]
    fn one_type_adds_and_pools_either_task() {
        let mut classes = Ensemble::Classes(Accumulator::new(&[0, 1]));
        let probs = Prediction::Classes(vec![0.1; 20]);
        classes.add(&probs).unwrap();
        let mut gaussian = Ensemble::Gaussian(RegressionAccumulator::new(&[0.5, -1.0]));
        let normal = Prediction::Gaussian {
            mean: vec![0.0, -1.0],
            var: vec![1.0, 1.0],
        };
        gaussian.add(&normal).unwrap();
        assert!(classes.add(&normal).is_err() && gaussian.add(&probs).is_err());
        assert_eq!((classes.samples(), gaussian.samples()), (1, 1));
        assert!(classes.classes().is_some() && classes.gaussian().is_none());
        let two = Ensemble::pooled([&gaussian, &gaussian]).unwrap();
        assert_eq!((two.samples(), two.sample_nll().len()), (2, 2));
        assert!(Ensemble::pooled([&classes, &gaussian]).is_err());
        assert!(Ensemble::pooled(std::iter::empty()).is_err());
    }
}
