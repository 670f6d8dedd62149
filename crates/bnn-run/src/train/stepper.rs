//! One training update (gather, forward, backward, sampler step) with its reused buffers.

use candle_core::{Device, Var};

use crate::backprop::mlp::BatchLoss;
use crate::data::augment::{self, Augment};
use crate::data::Split;
use crate::error::Result;
use crate::kernels::gemm::NonZero;
use crate::model::Network;
use crate::potential::pass::{pass_for, Pass};
use crate::potential::{Backward, Potential};
use crate::sampler::{self, Kernel, Sampler, SamplerParams, TensorwiseStep};

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
    /// The forward and backward pass (`backward`'s).
    pass: Box<dyn Pass>,
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
        sampler: SamplerParams,
        kernel: Kernel,
        backward: Backward,
        seed: u64,
        batch: usize,
    ) -> Result<Self> {
        let vars = model.vars();
        let device = vars.first().map_or(Device::Cpu, |v| v.device().clone());
        let backward = backward.resolve(&device)?;
        let pass = pass_for(model, batch, backward, &device)?;
        Ok(Stepper {
            model: model.clone(),
            sampler: sampler::build_with(sampler, &vars, seed, kernel)?,
            vars,
            potential,
            backward,
            pass,
            by_layer: true,
            batch: Batch::default(),
        })
    }

    /// With `by_layer`: whether large weight tensors are updated inside their gradient's
    /// product (default) rather than in a pass of their own.
    pub fn set_inline_update(&mut self, on: bool) {
        self.pass.set_inline_update(on);
    }

    /// Weight tensors updated inside their gradient's product so far.
    pub fn inline_updates(&self) -> u64 {
        self.pass.inline_updates()
    }

    /// Replaces the sampler (a replica's, at the start of an exchange round) with a new one
    /// for `params`, its noise keyed by `seed`: momentum re-drawn, thermostat reset.
    pub fn rebuild_sampler(
        &mut self,
        params: SamplerParams,
        kernel: Kernel,
        seed: u64,
    ) -> Result<()> {
        self.sampler = sampler::build_with(params, &self.vars, seed, kernel)?;
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
            None => self.pass.next_input_map(),
            Some(_) => None,
        };
        self.batch
            .gather(split, idx, labels, augment, map, regression);
        let targets = self.potential.targets(&self.batch.y, &self.batch.v);
        // By layer, each tensor is updated as soon as its gradient is ready (while it is
        // in cache); θ and v bit-identical to the whole-model step after the pass.
        let in_pass = self.by_layer && self.pass.updates_in_pass();
        let step: Option<&mut dyn TensorwiseStep> = match in_pass {
            true => Some(self.sampler.as_mut()),
            false => None,
        };
        let (model, x) = (&self.model, &self.batch.x);
        let loss = self
            .pass
            .evaluate_then(&self.potential, model, x, targets, step)?;
        if !in_pass && loss.nll.is_finite() {
            self.sampler.step(&self.vars, self.pass.grads())?;
        }
        Ok(loss)
    }
}
