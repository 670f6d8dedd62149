//! The ResNet pass on two threads by halves of the minibatch: each half runs the whole
//! forward and backward of [`super::resnet`] on one thread (its products and per-plane
//! passes, finding the pool busy, stay on that thread), and the two halves' gradients
//! are summed. Samples are independent of each other in a ResNet without batch
//! statistics (FRN normalises each example by itself), so the halves need no exchange
//! until the sum: no fork and join per operation (measured: the wait in `pool::run` was
//! 15% of a ResNet-8 step split operation by operation), and each half's activations
//! are half as large in cache.
//!
//! The minibatch is always cut in two where it has two rows or more, whatever the number
//! of threads (one thread runs the halves one after the other), so that the sums, and so
//! the samples, do not depend on the thread count.

use super::HandPass;
use candle_core::Tensor;
use std::sync::Mutex;

use super::mlp::{prepare_grads, with_data_mut, BatchLoss, CpuView};
use super::resnet::ResnetBackprop;
use crate::error::{Error, Result};
use crate::kernels::TensorwiseStep;
use crate::model::Network;

/// Halves of the minibatch.
const PARTS: usize = 2;

/// The ResNet pass by halves of the minibatch, and the summed gradients.
#[derive(Debug)]
pub struct SplitResnet {
    halves: Vec<Mutex<ResnetBackprop>>,
    logits: Vec<f32>,
    /// ∇Ũ/T per parameter tensor, in the model's order (allocated by the first backward).
    grads: Vec<Tensor>,
}

/// The rows of each part of a minibatch of `rows`.
fn parts(rows: usize) -> Vec<std::ops::Range<usize>> {
    if rows < PARTS {
        return std::iter::once(0..rows).collect();
    }
    let cut = rows.div_ceil(PARTS);
    vec![0..cut, cut..rows]
}

impl SplitResnet {
    /// Buffers for `model` (a ResNet) at minibatches of up to `batch` rows.
    pub fn new(model: &Network, batch: usize) -> Result<Self> {
        let half = batch.div_ceil(PARTS).max(1);
        Ok(SplitResnet {
            halves: (0..PARTS)
                .map(|_| Ok(Mutex::new(ResnetBackprop::new(model, half)?)))
                .collect::<Result<_>>()?,
            logits: Vec::new(),
            grads: Vec::new(),
        })
    }

    /// Runs `f` on each part's pass, its rows and its slice of `x`, side by side.
    fn on_parts<R: Send>(
        &self,
        x: &[f32],
        rows: usize,
        f: impl Fn(&mut ResnetBackprop, std::ops::Range<usize>, &[f32]) -> Result<R> + Sync,
    ) -> Result<Vec<R>> {
        let ranges = parts(rows);
        let dim = x.len().checked_div(rows).unwrap_or(0);
        let out: Vec<Mutex<Option<Result<R>>>> = ranges.iter().map(|_| Mutex::new(None)).collect();
        crate::pool::run(ranges.len(), &|p| {
            let r = ranges[p].clone();
            let result = match self.halves[p].lock() {
                Ok(mut half) => f(&mut half, r.clone(), &x[r.start * dim..r.end * dim]),
                Err(_) => Err(Error::Config("a ResNet half's lock is poisoned".into())),
            };
            if let Ok(mut slot) = out[p].lock() {
                *slot = Some(result);
            }
        });
        out.into_iter()
            .enumerate()
            .map(|(p, slot)| {
                slot.into_inner().ok().flatten().unwrap_or_else(|| {
                    Err(Error::Config(format!("ResNet part {p} did not report")))
                })
            })
            .collect()
    }
}

impl HandPass for SplitResnet {
    /// The gradients of the last backward pass, in the model's order (empty before the
    /// first), overwritten in place by the next.
    fn grads(&self) -> &[Tensor] {
        &self.grads
    }

    /// Forward pass on `rows` images `x`; returns the logits (rows × classes).
    fn forward(&mut self, model: &Network, x: &[f32], rows: usize) -> Result<&[f32]> {
        let logits = self.on_parts(x, rows, |half, r, x| {
            Ok(half.forward(model, x, r.len())?.to_vec())
        })?;
        self.logits.clear();
        logits.iter().for_each(|l| self.logits.extend_from_slice(l));
        Ok(&self.logits)
    }

    /// As [`ResnetBackprop::loss_and_grad_then`]: each half's likelihood gradient at the
    /// whole minibatch's scale, summed, plus the prior's term once; then, given a
    /// sampler's `step`, every tensor updated (the loss finite).
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
    ) -> Result<BatchLoss> {
        let rows = labels.len();
        if x.len() != rows * model.input_dim {
            return Err(Error::Config(format!(
                "a minibatch of {rows} images needs {} inputs, got {}",
                rows * model.input_dim,
                x.len()
            )));
        }
        prepare_grads(model, prior_precision, &mut self.grads)?;
        let no_prior = vec![0.0; prior_precision.len()];
        let losses = self.on_parts(x, rows, |half, r, x| {
            half.loss_and_grad_then(model, x, &labels[r], likelihood_scale, &no_prior, 0.0, None)
        })?;
        let ranges = parts(rows);
        let mut nll = 0.0;
        let mut correct = 0;
        for (loss, r) in losses.iter().zip(&ranges) {
            nll += loss.nll * r.len() as f64;
            correct += loss.correct;
        }
        let halves: Vec<_> = self
            .halves
            .iter()
            .take(ranges.len())
            .map(|h| {
                h.lock()
                    .map_err(|_| Error::Config("a ResNet half's lock is poisoned".into()))
            })
            .collect::<Result<_>>()?;
        for (t, p) in model.params.iter().enumerate() {
            let theta = CpuView::new(p.var.as_tensor(), &p.name)?;
            let theta = theta.slice();
            let lt = (prior_factor * prior_precision[t]) as f32;
            let parts: Vec<CpuView> = halves
                .iter()
                .map(|h| CpuView::new(&h.grads()[t], &p.name))
                .collect::<Result<_>>()?;
            with_data_mut(&self.grads[t], |g| {
                g.iter_mut().zip(theta).for_each(|(g, &th)| *g = lt * th);
                for part in &parts {
                    g.iter_mut().zip(part.slice()).for_each(|(g, &v)| *g += v);
                }
            })?;
        }
        drop(halves);
        if let Some(step) = step.filter(|_| nll.is_finite()) {
            let mut update = crate::kernels::begin(step)?;
            for (t, p) in model.params.iter().enumerate().rev() {
                update.tensor(t, &p.var, &self.grads[t])?;
            }
            update.finish()?;
        }
        Ok(BatchLoss {
            nll: nll / rows.max(1) as f64,
            correct,
            sq_error: 0.0,
        })
    }
}
