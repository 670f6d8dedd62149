//! One training update (gather, forward, backward, sampler step) with its reused buffers.

use candle_core::{Device, Tensor, Var};

use crate::backprop::mlp::BatchLoss;
use crate::backprop::Backprop;
use crate::data::augment::{self, Augment};
use crate::data::Split;
use crate::error::Result;
use crate::kernels::gemm::NonZero;
use crate::model::Network;
use crate::potential::{Backward, Potential};
use crate::sampler::{self, Kernel, Sampler, SamplerConfig, TensorwiseStep};

/// One training update (minibatch gather, forward, backward, sampler step) with the
/// buffers it reuses; shared by [`super::train`] and `bnn bench train`.
pub struct Stepper {
    model: Network,
    vars: Vec<Var>,
    /// The potential whose gradient drives the sampler.
    pub potential: Potential,
    /// The sampler.
    pub sampler: Box<dyn Sampler>,
    /// The gradient implementation in use (`auto` resolved).
    pub backward: Backward,
    backprop: Option<Backprop>,
    /// With the custom backward: update each layer as soon as its gradient is ready
    /// (default), instead of after the whole backward.
    pub by_layer: bool,
    batch: Batch,
}

/// A minibatch's host buffers, reused from update to update.
#[derive(Debug, Default)]
pub(super) struct Batch {
    /// The inputs, row-major.
    pub x: Vec<f32>,
    /// The labels.
    pub y: Vec<u32>,
    /// A regression's targets.
    pub v: Vec<f32>,
}

impl Batch {
    /// The examples `idx` of `split`: augmented with the seed given (`--augment`), else
    /// recording the first layer's zero map into `map` where given; `labels` in place of
    /// the split's where given (label noise); with `regression`, the split's values as
    /// targets.
    pub fn gather(
        &mut self,
        split: &Split,
        idx: &[usize],
        labels: Option<&[u8]>,
        augment: Option<(Augment, u64)>,
        map: Option<&mut NonZero>,
        regression: bool,
    ) {
        match (augment, map) {
            (Some((aug, seed)), _) => {
                augment::gather_augmented(split, idx, aug, seed, &mut self.x, &mut self.y)
            }
            // The first layer's zero map made as the rows are written, while each is in
            // L1, rather than by the forward pass reading the minibatch again.
            (None, Some(map)) => split.gather_recording(idx, &mut self.x, &mut self.y, map),
            (None, None) => split.gather(idx, &mut self.x, &mut self.y),
        }
        if let Some(labels) = labels {
            for (y, &i) in self.y.iter_mut().zip(idx) {
                *y = labels[i] as u32;
            }
        }
        if regression {
            split.gather_values(idx, &mut self.v);
        }
    }
}

impl Stepper {
    /// A stepper for `model` (whose parameters it updates in place) on minibatches of
    /// `batch` examples.
    pub fn new(
        model: &Network,
        potential: Potential,
        sampler: SamplerConfig,
        kernel: Kernel,
        backward: Backward,
        seed: u64,
        batch: usize,
    ) -> Result<Self> {
        let vars = model.vars();
        let device = vars.first().map_or(Device::Cpu, |v| v.device().clone());
        let backward = backward.resolve(&device)?;
        let backprop = match backward {
            Backward::Custom => Some(Backprop::new(model, batch)?),
            _ => None,
        };
        Ok(Stepper {
            model: model.clone(),
            sampler: sampler::build_with(sampler, &vars, seed, kernel)?,
            vars,
            potential,
            backward,
            backprop,
            by_layer: true,
            batch: Batch::default(),
        })
    }

    /// With `by_layer`: whether large weight tensors are updated inside their gradient's
    /// product (default) rather than in a pass of their own.
    pub fn set_inline_update(&mut self, on: bool) {
        if let Some(bp) = self.backprop.as_mut() {
            bp.set_inline_update(on);
        }
    }

    /// Weight tensors updated inside their gradient's product so far.
    pub fn inline_updates(&self) -> u64 {
        self.backprop.as_ref().map_or(0, |bp| bp.inline_updates())
    }

    /// Replaces the sampler (a replica's, at the start of an exchange round) with a new one
    /// for `config`, its noise keyed by `seed`: momentum re-drawn, thermostat reset.
    pub fn rebuild_sampler(
        &mut self,
        config: SamplerConfig,
        kernel: Kernel,
        seed: u64,
    ) -> Result<()> {
        self.sampler = sampler::build_with(config, &self.vars, seed, kernel)?;
        Ok(())
    }

    /// One update on the examples `idx` of `split`, with `labels` in place of the split's
    /// where given (label noise), the images augmented with the seed given (`--augment`).
    /// A regression reads the split's values as targets. Returns the minibatch loss; when
    /// it is not finite the parameters are left as they were.
    pub fn step(
        &mut self,
        split: &Split,
        labels: Option<&[u8]>,
        idx: &[usize],
        augment: Option<(Augment, u64)>,
    ) -> Result<BatchLoss> {
        let regression = !self.potential.likelihood.is_categorical();
        // With --augment the forward pass makes the zero map (of the shifted images).
        let map = match augment {
            None => self.backprop.as_mut().and_then(|bp| bp.next_input_map()),
            Some(_) => None,
        };
        self.batch
            .gather(split, idx, labels, augment, map, regression);
        if let Some(bp) = self.backprop.as_mut() {
            let targets = self.potential.targets(&self.batch.y, &self.batch.v);
            if self.by_layer {
                // Each layer is updated as soon as its gradient is ready (while it is in
                // cache); θ and v bit-identical to the whole-model step below.
                let step: &mut dyn TensorwiseStep = self.sampler.as_mut();
                return self.potential.evaluate_targets_then(
                    bp,
                    &self.model,
                    &self.batch.x,
                    targets,
                    Some(step),
                );
            }
            let loss = self.potential.evaluate_targets_then(
                bp,
                &self.model,
                &self.batch.x,
                targets,
                None,
            )?;
            if loss.nll.is_finite() {
                self.sampler.step(&self.vars, bp.grads())?;
            }
            return Ok(loss);
        }
        let device = self.vars[0].device();
        let x = Tensor::from_slice(&self.batch.x, (idx.len(), split.dim()), device)?;
        let y = match regression {
            true => Tensor::from_slice(&self.batch.v, idx.len(), device)?,
            false => Tensor::from_slice(&self.batch.y, idx.len(), device)?,
        };
        let eval = self.potential.evaluate(&self.model, &x, &y)?;
        if eval.nll.is_finite() {
            self.sampler.step(&self.vars, &eval.grads)?;
        }
        if regression {
            let f = eval.logits.flatten_all()?.to_vec1::<f32>()?;
            let sq_error = f
                .iter()
                .zip(&self.batch.v)
                .map(|(f, y)| ((f - y) as f64).powi(2))
                .sum();
            return Ok(BatchLoss {
                nll: eval.nll,
                correct: 0,
                sq_error,
            });
        }
        let pred = eval.logits.argmax(1)?.to_vec1::<u32>()?;
        let correct = pred
            .iter()
            .zip(&self.batch.y)
            .filter(|(p, y)| p == y)
            .count();
        Ok(BatchLoss {
            nll: eval.nll,
            correct,
            sq_error: 0.0,
        })
    }
}
