//! Fused sampler steps: one pass over each parameter buffer updates position, momentum
//! and injected noise together, with the kinetic-energy reduction computed in the same
//! pass.
//!
//! Layout and soundness: a candle in-place op has one mutable destination. The
//! destination here is the parameter itself, through `Var::as_detached_tensor()`, which
//! shares the `Var`'s storage (candle takes the storage's write lock for the op). The
//! gradient is a distinct read-only source. The momentum is not a candle tensor: it is
//! the sampler's own buffer, lent to the op for the duration of one call through a
//! `RefCell<&mut [f32]>`, so it is mutated through a unique borrow, never through a shared
//! reference. Per update and parameter element the CPU op reads θ, v, g once and writes
//! θ, v once (5 × 4 bytes, one pass); SGLD reads θ, g and writes θ (3 × 4 bytes). With
//! the hand-written backward, large weight tensors skip the pass: the same element update
//! runs in their gradient's product ([`InlineUpdate`], [`gemm::product_then_update`]).
//!
//! The element math is that of `kernels/sampler_math.h` (shared with the CUDA kernels)
//! written in Rust with the same f32 operations in the same order, so that the two agree
//! bit for bit (tested in `tests/suite/kernel_equivalence.rs`).

pub mod buffer;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod elementwise;
pub mod gemm;
#[doc(hidden)]
pub mod host;
pub mod isa;
pub mod noise;

use candle_core::{Tensor, Var};

use crate::error::{Error, Result};

/// Which element update a fused op applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Update {
    /// θ ← θ − ηg + σz.
    Sgld,
    /// v ← (1 − α)v − ηg + σz; θ ← θ + v (SGHMC, SGNHT).
    Momentum,
    /// mSGNHT, one thermostat αᵢ per element (Li et al. 2016 eq. 2 in v-form):
    /// v ← (1 − αᵢ)v − ηg + σz (Euler) or v ← dᵢ(dᵢv − ηg + σz) with dᵢ = e^{−αᵢ/2}
    /// (splitting B–O–B); then θ ← θ + v and αᵢ ← αᵢ + vᵢ² − η. CPU only.
    Thermostat { splitting: bool },
}

/// A sampler update applied by the weight-gradient product as it stores each element of
/// the gradient ([`gemm::product_then_update`]) instead of writing ∇ and updating θ in a
/// pass of its own. Why: on the CPU that pass is memory-bound (it reads θ, v, ∇ and
/// writes θ, v after the product wrote ∇ and read θ for the prior term); in the epilogue
/// only v is extra. Same element math as the fused op, so the same bits.
pub struct InlineUpdate<'a> {
    /// [`Update::Sgld`] or [`Update::Momentum`].
    pub update: Update,
    pub consts: StepConsts,
    pub key: crate::rng::NoiseKey,
    /// v of the tensor (empty for SGLD).
    pub momentum: &'a mut [f32],
}

/// One sampler update of every parameter tensor, split by tensor: [`TensorwiseStep::begin`],
/// then for every parameter tensor t, in any order, either [`TensorwiseStep::tensor`] with
/// θ_t and its final ∇_t, or, where [`TensorwiseStep::inline`] gives an update, that update
/// applied inside ∇_t's product followed by [`TensorwiseStep::updated`]; then
/// [`TensorwiseStep::finish`]. The result does not depend on the order of the tensors.
///
/// The one protocol between gradients and samplers: every sampler implements it
/// (`sampler::Sampler` builds its whole-model step on it), the hand-written backward
/// drives it layer by layer while each gradient is still in cache. It lives on this floor
/// because the backward (model side) and the samplers must not see each other.
pub trait TensorwiseStep {
    /// Opens one update.
    fn begin(&mut self) -> Result<()>;
    /// Updates θ_t (`param`) in place from its gradient.
    fn tensor(&mut self, t: usize, param: &Var, grad: &Tensor) -> Result<()>;
    /// The update of tensor t for the weight-gradient product to apply as it stores the
    /// gradient ([`gemm::product_then_update`]), where the sampler can; the caller then
    /// reports Σv² through [`TensorwiseStep::updated`] instead of calling `tensor`. θ and v
    /// come out bit-identical; Σv² is summed in another order.
    fn inline(&mut self, t: usize) -> Result<Option<InlineUpdate<'_>>> {
        let _ = t;
        Ok(None)
    }
    /// Tensor t was updated inline; `sum_sq` = Σv² after the update.
    fn updated(&mut self, t: usize, sum_sq: f64) -> Result<()> {
        let _ = sum_sq;
        Err(Error::Config(format!(
            "sampler: tensor {t} updated inline without an inline update"
        )))
    }
    /// Closes the update: an error unless every tensor was updated exactly once.
    fn finish(&mut self) -> Result<()>;
}

/// Constants of one update in f32, as the kernels use them (`bnn_step_consts`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepConsts {
    /// η.
    pub step_size: f32,
    /// Momentum kept before the kick: 1 − α (Euler) or e^{−α/2} (splitting B).
    pub decay: f32,
    /// Momentum kept after the kick: 1 (Euler) or e^{−α/2} (splitting B).
    pub post: f32,
    /// σ of the injected noise.
    pub noise_scale: f32,
}

impl StepConsts {
    /// The Euler update: v ← (1 − α)v − ηg + σz.
    pub fn new(step_size: f64, friction: f64, noise_scale: f64) -> Self {
        StepConsts {
            step_size: step_size as f32,
            decay: (1.0 - friction) as f32,
            post: 1.0,
            noise_scale: noise_scale as f32,
        }
    }

    /// The splitting update B–O–B: v ← e^{−α/2}(e^{−α/2} v − ηg + σz).
    pub fn splitting(step_size: f64, friction: f64, noise_scale: f64) -> Self {
        let damp = (-friction / 2.0).exp() as f32;
        StepConsts {
            step_size: step_size as f32,
            decay: damp,
            post: damp,
            noise_scale: noise_scale as f32,
        }
    }
}
