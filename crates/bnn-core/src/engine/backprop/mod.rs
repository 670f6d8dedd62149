//! The hand-written forward and backward passes of the networks on the CPU ([`HandPass`]:
//! the MLP's, the CNN's, the ResNet's), on the project's product kernel
//! ([`crate::kernels::gemm`]) and thread pool. The training step sees them, and candle's
//! autograd, as one `potential::pass::Pass`.
//! Model side: they need the network, which the kernels must not see.

pub mod cnn;
pub mod mlp;
pub mod resnet;
pub mod resnet_split;

use candle_core::Tensor;

use crate::error::{Error, Result};
use crate::kernels::gemm::NonZero;
use crate::kernels::TensorwiseStep;
use crate::likelihood::Targets;
use crate::model::Network;
use mlp::BatchLoss;

/// A hand-written CPU forward and backward pass, with its reused buffers: the MLP's, the
/// CNN's or the ResNet's. [`Backprop::new`] picks the one of a model; the training step
/// sees it as a `potential::pass::Pass`.
pub trait HandPass: std::fmt::Debug + Send {
    /// The gradients of the last backward pass, in the model's order (empty before the
    /// first), overwritten in place by the next.
    fn grads(&self) -> &[Tensor];

    /// Logits of `rows` inputs `x` (row-major), rows × classes.
    fn forward(&mut self, model: &Network, x: &[f32], rows: usize) -> Result<&[f32]>;

    /// The first layer's zero map for the next minibatch's gather to record; none where
    /// the pass keeps no map (the convolutional networks).
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

    /// Forward and backward pass on a minibatch of class `labels`: the mean NLL and the
    /// correct count; ∇ = `likelihood_scale`·Σᵢ∇(−log p(yᵢ|xᵢ,θ)) +
    /// `prior_factor`·`prior_precision[t]`·θ_t into [`HandPass::grads`]. Given a sampler's
    /// `step`, one whole update of it: each parameter tensor t is updated
    /// ([`OpenUpdate::tensor`](crate::kernels::OpenUpdate::tensor)) as soon as ∇_t is final
    /// and the pass no longer reads θ_t (last layer first), while ∇_t is still in cache;
    /// the MLP's large weight tensors inside ∇_t's product where the sampler gives their
    /// update ([`OpenUpdate::inline`](crate::kernels::OpenUpdate::inline)). No update is
    /// made when the loss is not finite (the parameters then stay as they were).
    #[allow(clippy::too_many_arguments)]
    fn loss_and_grad_then(
        &mut self,
        model: &Network,
        x: &[f32],
        labels: &[u32],
        likelihood_scale: f64,
        prior_precision: &[f64],
        prior_factor: f64,
        step: Option<&mut dyn TensorwiseStep>,
    ) -> Result<BatchLoss>;

    /// [`HandPass::loss_and_grad_then`] for any task's targets; `prior` is (λ per tensor,
    /// factor). Real-valued targets (a Gaussian likelihood) need the MLP's pass.
    fn targets_then(
        &mut self,
        model: &Network,
        x: &[f32],
        targets: Targets<'_>,
        likelihood_scale: f64,
        prior: (&[f64], f64),
        step: Option<&mut dyn TensorwiseStep>,
    ) -> Result<BatchLoss> {
        match targets {
            Targets::Classes(labels) => {
                self.loss_and_grad_then(model, x, labels, likelihood_scale, prior.0, prior.1, step)
            }
            Targets::Values { .. } => Err(Error::Config(
                "regression runs on an MLP (--hidden); the convolutional networks classify images"
                    .into(),
            )),
        }
    }
}

/// The hand-written pass of a model, chosen by its kind; it derefs to [`HandPass`].
#[derive(Debug)]
pub struct Backprop(Box<dyn HandPass>);

impl Backprop {
    /// Buffers for `model` at minibatches of up to `batch` rows.
    pub fn new(model: &Network, batch: usize) -> Result<Self> {
        Ok(Backprop(if model.resnet.is_some() {
            Box::new(resnet_split::SplitResnet::new(model, batch)?)
        } else if model.convs.is_empty() {
            Box::new(mlp::MlpBackprop::new(model, batch)?)
        } else {
            Box::new(cnn::CnnBackprop::new(model, batch)?)
        }))
    }
}

impl std::ops::Deref for Backprop {
    type Target = dyn HandPass;
    fn deref(&self) -> &Self::Target {
        self.0.as_ref()
    }
}

impl std::ops::DerefMut for Backprop {
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.0.as_mut()
    }
}
