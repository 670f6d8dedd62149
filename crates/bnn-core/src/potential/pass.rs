//! The training step's one view of a forward and backward pass: [`Pass`], over the
//! hand-written CPU passes ([`Backprop`]) and candle's autograd ([`Autograd`], the
//! reference, and the pass off the CPU), each evaluating ∇Ũ(θ)/T of a [`Potential`].

use candle_core::{Device, Tensor};

use super::{Backward, Potential};
use crate::engine::backprop::mlp::BatchLoss;
use crate::engine::backprop::{Backprop, HandPass};
use crate::error::Result;
use crate::kernels::gemm::NonZero;
use crate::kernels::TensorwiseStep;
use crate::likelihood::Targets;
use crate::model::Network;

/// A forward and backward pass of a network: a hand-written CPU pass ([`Backprop`], any
/// [`HandPass`]) or candle's autograd ([`Autograd`], on any device). [`pass_for`] picks
/// the one `--backward` names; the training step calls only this.
pub trait Pass: std::fmt::Debug + Send {
    /// The gradients of the last backward pass, in the model's order (empty before the
    /// first), overwritten by the next.
    fn grads(&self) -> &[Tensor];

    /// ∇Ũ(θ)/T of `potential` on the minibatch `x` with `targets` into [`Pass::grads`]:
    /// the likelihood's gradient at N/(|S|·T), the prior's λθ/T. Given a sampler's `step`
    /// and a pass that [`updates_in_pass`](Pass::updates_in_pass), its update too, each
    /// tensor as soon as its gradient is final ([`HandPass::loss_and_grad_then`]); no
    /// update when the loss is not finite.
    fn evaluate_then(
        &mut self,
        potential: &Potential,
        model: &Network,
        x: &[f32],
        targets: Targets<'_>,
        step: Option<&mut dyn TensorwiseStep>,
    ) -> Result<BatchLoss>;

    /// Whether [`Pass::evaluate_then`] can update the parameters tensor by tensor (the
    /// hand-written passes); otherwise the sampler steps on [`Pass::grads`] after it.
    fn updates_in_pass(&self) -> bool {
        true
    }

    /// The first layer's zero map for the next minibatch's gather to record; none where
    /// the pass keeps no map (the convolutional networks, autograd).
    fn next_input_map(&mut self) -> Option<&mut NonZero> {
        None
    }

    /// Whether large weight tensors are updated inside their gradient's product (the
    /// MLP's; the others never are).
    fn set_inline_update(&mut self, _on: bool) {}

    /// Weight tensors updated inside their gradient's product so far.
    fn inline_updates(&self) -> u64 {
        0
    }
}

/// [`Pass::evaluate_then`] of a hand-written pass: the likelihood's sum scaled by
/// N/(|S|·T) ([`Potential::likelihood_scale`]), the prior's λ by 1/T.
fn evaluate_by_hand<P: HandPass + ?Sized>(
    pass: &mut P,
    potential: &Potential,
    model: &Network,
    x: &[f32],
    targets: Targets<'_>,
    step: Option<&mut dyn TensorwiseStep>,
) -> Result<BatchLoss> {
    let prior = (
        &potential.prior.precisions[..],
        potential.inverse_temperature(),
    );
    let scale = potential.likelihood_scale(targets.len());
    pass.targets_then(model, x, targets, scale, prior, step)
}

impl Pass for Backprop {
    fn grads(&self) -> &[Tensor] {
        HandPass::grads(&**self)
    }

    fn evaluate_then(
        &mut self,
        potential: &Potential,
        model: &Network,
        x: &[f32],
        targets: Targets<'_>,
        step: Option<&mut dyn TensorwiseStep>,
    ) -> Result<BatchLoss> {
        evaluate_by_hand(&mut **self, potential, model, x, targets, step)
    }

    fn next_input_map(&mut self) -> Option<&mut NonZero> {
        HandPass::next_input_map(&mut **self)
    }

    fn set_inline_update(&mut self, on: bool) {
        HandPass::set_inline_update(&mut **self, on)
    }

    fn inline_updates(&self) -> u64 {
        HandPass::inline_updates(&**self)
    }
}

/// The pass `backward` names for `model` on `device` (`auto`: the hand-written one on the
/// CPU, autograd elsewhere), with buffers for minibatches of up to `batch` rows.
pub fn pass_for(
    model: &Network,
    batch: usize,
    backward: Backward,
    device: &Device,
) -> Result<Box<dyn Pass>> {
    match backward.resolve(device)? {
        Backward::Custom => Ok(Box::new(Backprop::new(model, batch)?)),
        Backward::Autograd | Backward::Auto => Ok(Box::new(Autograd::new(device))),
        Backward::Plan => Err(crate::error::Error::Config(
            "--backward plan runs a chain's whole update as the step plan, not as a pass".into(),
        )),
    }
}

/// Autograd on `device`, with the gradients of its last pass.
#[derive(Debug)]
pub struct Autograd {
    device: Device,
    grads: Vec<Tensor>,
}

impl Autograd {
    /// The pass on `device` (where the model's parameters are).
    pub fn new(device: &Device) -> Self {
        Autograd {
            device: device.clone(),
            grads: Vec::new(),
        }
    }
}

impl Pass for Autograd {
    fn grads(&self) -> &[Tensor] {
        &self.grads
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
        let (correct, sq_error) = match targets {
            Targets::Values { y, .. } => {
                let f = eval.logits.flatten_all()?.to_vec1::<f32>()?;
                (
                    0,
                    f.iter().zip(y).map(|(f, y)| ((f - y) as f64).powi(2)).sum(),
                )
            }
            Targets::Classes(labels) => {
                let pred = eval.logits.argmax(1)?.to_vec1::<u32>()?;
                (pred.iter().zip(labels).filter(|(p, y)| p == y).count(), 0.0)
            }
        };
        Ok(BatchLoss {
            nll: eval.nll,
            correct,
            sq_error,
        })
    }

    fn updates_in_pass(&self) -> bool {
        false
    }
}
