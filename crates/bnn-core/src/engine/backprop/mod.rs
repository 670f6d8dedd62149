//! The hand-written forward and backward passes of the networks on the CPU (the MLP's and
//! the CNN's), on the project's product kernel ([`crate::kernels::gemm`]) and thread pool.
//! Model side: they need the network, which the kernels must not see.

pub mod cnn;
pub mod mlp;
pub mod resnet;
pub mod resnet_split;

/// The hand-written CPU forward and backward pass of a network: the MLP's or the CNN's.
#[derive(Debug)]
pub enum Backprop {
    /// The MLP's pass.
    Mlp(mlp::MlpBackprop),
    /// The CNN's pass.
    Cnn(cnn::CnnBackprop),
    /// Boxed: its buffers' bookkeeping is larger than the others'.
    Resnet(Box<resnet_split::SplitResnet>),
}

impl Backprop {
    /// Buffers for `model` at minibatches of up to `batch` rows.
    pub fn new(model: &crate::model::Network, batch: usize) -> crate::error::Result<Self> {
        Ok(if model.resnet.is_some() {
            Backprop::Resnet(Box::new(resnet_split::SplitResnet::new(model, batch)?))
        } else if model.convs.is_empty() {
            Backprop::Mlp(mlp::MlpBackprop::new(model, batch)?)
        } else {
            Backprop::Cnn(cnn::CnnBackprop::new(model, batch)?)
        })
    }

    /// The gradients of the last backward pass, in the model's order.
    pub fn grads(&self) -> &[candle_core::Tensor] {
        match self {
            Backprop::Mlp(b) => b.grads(),
            Backprop::Cnn(b) => b.grads(),
            Backprop::Resnet(b) => b.grads(),
        }
    }

    /// Whether the MLP's large weight tensors are updated inside their gradient's product
    /// ([`mlp::MlpBackprop::inline_update`]; the CNN never does).
    pub fn set_inline_update(&mut self, on: bool) {
        if let Backprop::Mlp(b) = self {
            b.inline_update = on;
        }
    }

    /// Weight tensors updated inside their gradient's product so far.
    pub fn inline_updates(&self) -> u64 {
        match self {
            Backprop::Mlp(b) => b.inline_updates,
            Backprop::Cnn(_) | Backprop::Resnet(_) => 0,
        }
    }

    /// Logits of `rows` inputs `x` (row-major).
    pub fn forward(
        &mut self,
        model: &crate::model::Network,
        x: &[f32],
        rows: usize,
    ) -> crate::error::Result<&[f32]> {
        match self {
            Backprop::Mlp(b) => b.forward(model, x, rows),
            Backprop::Cnn(b) => b.forward(model, x, rows),
            Backprop::Resnet(b) => b.forward(model, x, rows),
        }
    }

    /// Loss and gradients of a minibatch and, given a sampler's `step`, its update tensor
    /// by tensor ([`mlp::MlpBackprop::loss_and_grad_then`]).
    #[allow(clippy::too_many_arguments)]
    pub fn loss_and_grad_then(
        &mut self,
        model: &crate::model::Network,
        x: &[f32],
        labels: &[u32],
        likelihood_scale: f64,
        prior_precision: &[f64],
        prior_factor: f64,
        step: Option<&mut dyn crate::kernels::TensorwiseStep>,
    ) -> crate::error::Result<mlp::BatchLoss> {
        match self {
            Backprop::Mlp(b) => b.loss_and_grad_then(
                model,
                x,
                labels,
                likelihood_scale,
                prior_precision,
                prior_factor,
                step,
            ),
            Backprop::Cnn(b) => b.loss_and_grad_then(
                model,
                x,
                labels,
                likelihood_scale,
                prior_precision,
                prior_factor,
                step,
            ),
            Backprop::Resnet(b) => b.loss_and_grad_then(
                model,
                x,
                labels,
                likelihood_scale,
                prior_precision,
                prior_factor,
                step,
            ),
        }
    }

    /// The first layer's zero map for the next minibatch's gather to record
    /// ([`mlp::MlpBackprop::next_input_map`]); none where the pass keeps no map (the
    /// convolutional networks).
    pub fn next_input_map(&mut self) -> Option<&mut crate::kernels::gemm::NonZero> {
        match self {
            Backprop::Mlp(b) => Some(b.next_input_map()),
            _ => None,
        }
    }

    /// [`Backprop::loss_and_grad_then`] for any task's targets; real-valued targets (a
    /// Gaussian likelihood) need the MLP's pass.
    pub fn targets_then(
        &mut self,
        model: &crate::model::Network,
        x: &[f32],
        targets: crate::likelihood::Targets<'_>,
        likelihood_scale: f64,
        prior: (&[f64], f64),
        step: Option<&mut dyn crate::kernels::TensorwiseStep>,
    ) -> crate::error::Result<mlp::BatchLoss> {
        use crate::likelihood::Targets;
        match (self, targets) {
            (Backprop::Mlp(b), t) => b.targets_then(model, x, t, likelihood_scale, prior, step),
            (b, Targets::Classes(labels)) => {
                b.loss_and_grad_then(model, x, labels, likelihood_scale, prior.0, prior.1, step)
            }
            (_, Targets::Values { .. }) => Err(crate::error::Error::Config(
                "regression runs on an MLP (--hidden); the convolutional networks classify images"
                    .into(),
            )),
        }
    }
}
