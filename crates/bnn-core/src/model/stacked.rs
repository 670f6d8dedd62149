//! K networks of one architecture as one computation: every parameter tensor holds the K
//! chains' values along a leading chain axis, (K, …), so that a layer's product is one
//! batched product over the chains (candle's `matmul` on 3-D tensors: one strided-batched
//! GEMM on CUDA) and a convolution one grouped convolution (an MLP, a CNN, a ResNet with
//! its FRN per channel), instead of K streams of small operations. Why K chains and not one wider batch: a posterior wants many independent
//! chains, each with its own minibatch order and noise, and on a GPU the step of one small
//! network is bound by launches, not arithmetic (docs/BENCHMARKS.md, "GPU").
//!
//! Chain k of the stack is the [`Network`] it was built from: [`Stacked::copy_out`] and
//! [`Stacked::copy_in`] move one chain's θ between the two; the samplers update the
//! stacked tensors in place, each chain its row (`bnn_kernels::stacked`).

use candle_core::{Tensor, Var};

use super::{max_pool2, Activation, ConvShape, Network, Param};
use crate::error::{Error, Result};

/// K networks of one architecture, each parameter stacked along a chain axis.
#[derive(Debug, Clone)]
pub struct Stacked {
    /// K, the chains.
    pub chains: usize,
    /// The networks' parameters in their order and names, each shaped (K, …).
    pub params: Vec<Param>,
    activation: Activation,
    convs: Vec<ConvShape>,
    /// A ResNet's layers (its forward is [`super::resnet::ResnetLayout::forward_stacked`]).
    resnet: Option<super::resnet::ResnetLayout>,
}

impl Stacked {
    /// The stack of `nets` (chain k = `nets[k]`), which must share one architecture; a copy
    /// of their parameters on their device.
    pub fn new(nets: &[&Network]) -> Result<Self> {
        let first = *nets
            .first()
            .ok_or_else(|| Error::Config("stacked chains: no network to stack".into()))?;
        if let Some(other) = nets.iter().find(|n| n.spec != first.spec) {
            return Err(Error::Config(format!(
                "stacked chains of different networks: {} and {}",
                first.spec.label(),
                other.spec.label()
            )));
        }
        let mut params = Vec::with_capacity(first.params.len());
        for (t, p) in first.params.iter().enumerate() {
            let parts: Vec<Tensor> = nets
                .iter()
                .map(|n| n.params[t].var.as_tensor())
                .cloned()
                .collect();
            params.push(Param {
                name: p.name.clone(),
                var: Var::from_tensor(&Tensor::stack(&parts, 0)?)?,
            });
        }
        Ok(Stacked {
            chains: nets.len(),
            params,
            activation: first.spec.activation,
            convs: first.convs.clone(),
            resnet: first.resnet.clone(),
        })
    }

    /// The stacked parameters' `Var`s in parameter order.
    pub fn vars(&self) -> Vec<Var> {
        self.params.iter().map(|p| p.var.clone()).collect()
    }

    /// Writes chain k's parameters into `net` (same architecture).
    pub fn copy_out(&self, k: usize, net: &Network) -> Result<()> {
        for (p, q) in self.params.iter().zip(&net.params) {
            q.var.set(&p.var.as_tensor().get(k)?)?;
        }
        Ok(())
    }

    /// Overwrites chain k's parameters with `net`'s (after a restore).
    pub fn copy_in(&self, k: usize, net: &Network) -> Result<()> {
        for (p, q) in self.params.iter().zip(&net.params) {
            let one = q.var.as_tensor().unsqueeze(0)?;
            p.var.as_detached_tensor().slice_set(&one, 0, k)?;
        }
        Ok(())
    }

    fn activate(&self, h: &Tensor) -> Result<Tensor> {
        self.activation.apply(h)
    }

    /// Class logits (K, B, classes) of the K chains, chain k on its own minibatch
    /// `x[k]`: `x` is (K, B, input_dim), a CNN's images row-major. The same operations as
    /// [`Network::forward`] per chain, batched over the chain axis.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if let Some(r) = &self.resnet {
            return r.forward_stacked(&self.params, x);
        }
        let (k, b, _) = x.dims3()?;
        let mut h = x.clone();
        let convs = self.convs.len();
        if let Some(first) = self.convs.first() {
            // (K, B, C·H·W) → (B, K·C, H, W): chain k's channels are group k of a
            // grouped convolution, whose kernels are the chains' own.
            let side = first.in_side;
            h = h
                .reshape((k, b, first.in_channels * side * side))?
                .transpose(0, 1)?
                .contiguous()?
                .reshape((b, k * first.in_channels, side, side))?;
            for (c, shape) in self.convs.iter().enumerate() {
                let w = self.params[2 * c].var.as_tensor();
                let bias = self.params[2 * c + 1].var.as_tensor();
                let (_, c_out, c_in, kh, kw) = w.dims5()?;
                let w = w.reshape((k * c_out, c_in, kh, kw))?;
                let z = h
                    .conv2d(&w, shape.pad, 1, 1, k)?
                    .broadcast_add(&bias.reshape((1, k * c_out, 1, 1))?)?;
                h = max_pool2(&self.activate(&z)?)?;
            }
            // (B, K·C, h, w) → (K, B, C·h·w), the flattening of `Network::forward`.
            let (_, kc, ph, pw) = h.dims4()?;
            h = h
                .reshape((b, k, (kc / k) * ph * pw))?
                .transpose(0, 1)?
                .contiguous()?;
        }
        let layers = self.params.len() / 2 - convs;
        for l in 0..layers {
            let w = self.params[2 * (convs + l)].var.as_tensor();
            let bias = self.params[2 * (convs + l) + 1].var.as_tensor();
            h = h
                .matmul(&w.transpose(1, 2)?)?
                .broadcast_add(&bias.unsqueeze(1)?)?;
            if l + 1 < layers {
                h = self.activate(&h)?;
            }
        }
        Ok(h)
    }
}
