//! candle's autograd as a [`Pass`]: the reference gradient, and the one off the CPU.
//! [`Potential::evaluate`] differentiates the likelihood term; the prior's λθ is added
//! analytically.

use candle_core::{Device, Tensor};

use super::mlp::BatchLoss;
use super::Pass;
use crate::error::Result;
use crate::kernels::TensorwiseStep;
use crate::likelihood::Targets;
use crate::model::Network;
use crate::potential::Potential;

/// Autograd on `device`, with the gradients and logits of its last pass.
#[derive(Debug)]
pub struct Autograd {
    device: Device,
    grads: Vec<Tensor>,
    logits: Vec<f32>,
}

impl Autograd {
    /// The pass on `device` (where the model's parameters are).
    pub fn new(device: &Device) -> Self {
        Autograd {
            device: device.clone(),
            grads: Vec::new(),
            logits: Vec::new(),
        }
    }
}

impl Pass for Autograd {
    fn grads(&self) -> &[Tensor] {
        &self.grads
    }

    fn forward(&mut self, model: &Network, x: &[f32], rows: usize) -> Result<&[f32]> {
        let xt = Tensor::from_slice(x, (rows, model.input_dim), &self.device)?;
        self.logits = model.forward(&xt)?.flatten_all()?.to_vec1::<f32>()?;
        Ok(&self.logits)
    }

    /// The gradient only: the sampler steps on it after ([`Pass::updates_in_pass`]).
    fn evaluate_then(
        &mut self,
        potential: &Potential,
        model: &Network,
        x: &[f32],
        targets: Targets<'_>,
        _step: Option<&mut dyn TensorwiseStep>,
    ) -> Result<BatchLoss> {
        let rows = targets.len();
        let xt = Tensor::from_slice(x, (rows, model.input_dim), &self.device)?;
        let yt = match targets {
            Targets::Classes(labels) => Tensor::from_slice(labels, rows, &self.device)?,
            Targets::Values { y, .. } => Tensor::from_slice(y, rows, &self.device)?,
        };
        let eval = potential.evaluate(model, &xt, &yt)?;
        self.grads = eval.grads;
        match targets {
            Targets::Values { y, .. } => {
                let f = eval.logits.flatten_all()?.to_vec1::<f32>()?;
                let sq_error = f.iter().zip(y).map(|(f, y)| ((f - y) as f64).powi(2)).sum();
                Ok(BatchLoss {
                    nll: eval.nll,
                    correct: 0,
                    sq_error,
                })
            }
            Targets::Classes(labels) => {
                let pred = eval.logits.argmax(1)?.to_vec1::<u32>()?;
                let correct = pred.iter().zip(labels).filter(|(p, y)| p == y).count();
                Ok(BatchLoss {
                    nll: eval.nll,
                    correct,
                    sq_error: 0.0,
                })
            }
        }
    }

    fn updates_in_pass(&self) -> bool {
        false
    }
}
