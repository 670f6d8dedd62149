//! `bnn-kernels`, the ground floor of `bnn`: the errors, the noise streams, the thread
//! pool, the cache-line allocator, atomic file writes and signal handling, and the compute
//! kernels (the matrix products, the fused sampler steps, their SIMD paths, the CUDA and
//! Metal shims). Every `unsafe` block of the project lives in this crate.
//!
//! Fused sampler steps: one pass over each parameter buffer updates position, momentum
//! and injected noise together, with the kinetic-energy and virial reductions computed in
//! the same pass ([`TensorSums`]).
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

#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod alloc;
pub mod atomic;
pub mod error;
pub mod pool;
pub mod rng;
pub mod signals;

pub mod buffer;
pub mod census;
pub mod conv;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod elementwise;
pub mod gemm;
#[doc(hidden)]
pub mod host;
pub mod isa;
pub mod memory;
pub mod noise;
pub mod plan;
pub mod stacked;
pub mod update;

use candle_core::{Tensor, Var};

pub use error::{Error, Result};
pub use update::{StepConsts, Update};

/// What one tensor's fused update sums in its pass: Σv² and Σα after it, and the virial
/// Σθ·∇ at the point where ∇ was evaluated (θ before the update). The virial is what the
/// configurational temperature θ·∇Ũ/D is made of (E_π[θ·∇U] = D·T for any posterior, by
/// integration by parts): summed in the pass that already reads θ and ∇, it costs no
/// pass of its own.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TensorSums {
    /// Σv² after the update (0 for SGLD).
    pub sum_sq: f64,
    /// Σα after the update (mSGNHT; else 0).
    pub sum_thermostat: f64,
    /// Σθ·∇ with θ before the update.
    pub virial: f64,
}

impl std::ops::Add for TensorSums {
    type Output = TensorSums;
    fn add(self, o: TensorSums) -> TensorSums {
        TensorSums {
            sum_sq: self.sum_sq + o.sum_sq,
            sum_thermostat: self.sum_thermostat + o.sum_thermostat,
            virial: self.virial + o.virial,
        }
    }
}

/// A sampler update applied by the weight-gradient product as it stores each element of
/// the gradient ([`gemm::product_then_update`]) instead of writing ∇ and updating θ in a
/// pass of its own. Why: on the CPU that pass is memory-bound (it reads θ, v, ∇ and
/// writes θ, v after the product wrote ∇ and read θ for the prior term); in the epilogue
/// only v is extra. Same element math as the fused op, so the same bits.
pub struct InlineUpdate<'a> {
    /// [`Update::Sgld`] or [`Update::Momentum`].
    pub update: Update,
    /// η, the noise scale and the other constants of this step.
    pub consts: StepConsts,
    /// The Philox key of this tensor's noise (seed, step, parameter index).
    pub key: crate::rng::NoiseKey,
    /// v of the tensor (empty for SGLD).
    pub momentum: &'a mut [f32],
}

/// One tensor's fused update as its sampler lends it for one call of a kernel: the
/// element update, its constants and noise key, and the sampler's own state buffers of
/// that tensor (a unique borrow for the call; see the crate's note on soundness).
pub struct LentUpdate<'a> {
    /// Which element update.
    pub update: Update,
    /// η, the noise scale and the other constants of this step.
    pub consts: StepConsts,
    /// The Philox key of this tensor's noise (seed, step, parameter index).
    pub key: crate::rng::NoiseKey,
    /// v of the tensor; `None` for SGLD.
    pub momentum: Option<&'a mut buffer::StateBuffer>,
    /// The rule's per-element state of the tensor: mSGNHT's thermostats αᵢ or pSGLD's
    /// second moments Vᵢ ([`Update::states`]); `None` for the other rules.
    pub thermostat: Option<&'a mut buffer::StateBuffer>,
}

/// One sampler update of every parameter tensor, split by tensor: [`begin`] opens it and
/// returns an [`OpenUpdate`]; then for every parameter tensor t, in any order, either
/// [`OpenUpdate::tensor`] with θ_t and its final ∇_t, or, where [`OpenUpdate::inline`]
/// gives an update, that update applied inside ∇_t's product followed by
/// [`OpenUpdate::updated`]; then [`OpenUpdate::finish`], which consumes it. The result
/// does not depend on the order of the tensors.
///
/// The one protocol between gradients and samplers: every sampler implements it
/// (`sampler::Sampler` builds its whole-model step on it), the hand-written backward
/// drives it layer by layer while each gradient is still in cache. It lives on this floor
/// because the backward (model side) and the samplers must not see each other.
///
/// The methods here are what a sampler provides; callers go through [`begin`], whose
/// guard holds the sampler for the update: a second update cannot begin, nor the state
/// be read, before `finish`, and nothing can be stepped after it (the borrow checker
/// says so). What the types cannot hold — each tensor exactly once, every tensor by the
/// end — the guard checks, once for every sampler.
pub trait TensorwiseStep {
    /// How many parameter tensors an update covers.
    fn tensor_count(&self) -> usize;
    /// Prepares one update (called by [`begin`]).
    fn open_update(&mut self) -> Result<()>;
    /// Updates θ_t (`param`) in place from its gradient.
    fn step_tensor(&mut self, t: usize, param: &Var, grad: &Tensor) -> Result<()>;
    /// Tensor t's update lent for one call of a kernel that updates several samplers'
    /// tensors at once ([`stacked::step`]: chain k's slice of a stacked parameter for every
    /// chain k), where the sampler can lend it; the caller then reports the sums through
    /// [`OpenUpdate::lent`]. Same element math as [`TensorwiseStep::step_tensor`], so the
    /// same bits.
    fn lend_update(&mut self, t: usize) -> Result<Option<LentUpdate<'_>>> {
        let _ = t;
        Ok(None)
    }
    /// Tensor t was updated through its lent update, with these sums.
    fn lent_done(&mut self, t: usize, sums: TensorSums) -> Result<()> {
        let _ = sums;
        Err(Error::Config(format!(
            "sampler: tensor {t} reported through a lent update it did not lend"
        )))
    }
    /// The update of tensor t for the weight-gradient product to apply as it stores the
    /// gradient ([`gemm::product_then_update`]), where the sampler can; the caller then
    /// reports the sums through [`OpenUpdate::updated`] instead of stepping the tensor. θ
    /// and v come out bit-identical; the sums are summed in another order.
    fn inline_update(&mut self, t: usize) -> Result<Option<InlineUpdate<'_>>> {
        let _ = t;
        Ok(None)
    }
    /// Tensor t was updated inline, with these sums (Σα = 0: no thermostats inline).
    fn inline_done(&mut self, t: usize, sums: TensorSums) -> Result<()> {
        let _ = sums;
        Err(Error::Config(format!(
            "sampler: tensor {t} updated inline without an inline update"
        )))
    }
    /// Whether the sampler subtracts an estimate of the minibatch gradient's noise from
    /// the noise it injects (SGHMC's β̂ = ½ηV̂, Chen et al. 2014 §3.2): a backward that can
    /// form V̂ then reports it per tensor through [`OpenUpdate::gradient_noise`] before
    /// the tensor's update.
    fn wants_gradient_noise(&self) -> bool {
        false
    }
    /// Tensor t's tr V̂: the trace, over its elements, of the covariance of this update's
    /// minibatch gradient (of Ũ/T), from the minibatch's per-example gradients.
    fn gradient_noise(&mut self, t: usize, trace: f64) -> Result<()> {
        let _ = (t, trace);
        Ok(())
    }
    /// Completes the update once every tensor is done (called by [`OpenUpdate::finish`]).
    fn close_update(&mut self) -> Result<()>;
    /// Drops an update left unfinished (an error part-way): what `open_update` prepared.
    fn abandon_update(&mut self) {}
}

/// Opens one update of `step`: the guard through which its tensors are stepped.
pub fn begin<S: TensorwiseStep + ?Sized>(step: &mut S) -> Result<OpenUpdate<'_, S>> {
    step.open_update()?;
    let done = vec![false; step.tensor_count()];
    Ok(OpenUpdate {
        step,
        done,
        closed: false,
    })
}

/// An update in progress (see [`TensorwiseStep`]); dropped without [`OpenUpdate::finish`],
/// it is abandoned and the parameters stay as far as it went.
#[must_use = "an update must be finished"]
pub struct OpenUpdate<'a, S: TensorwiseStep + ?Sized> {
    step: &'a mut S,
    done: Vec<bool>,
    closed: bool,
}

impl<S: TensorwiseStep + ?Sized> OpenUpdate<'_, S> {
    /// Checks that tensor `t` may still be stepped.
    fn check(&self, t: usize) -> Result<()> {
        match self.done.get(t) {
            Some(false) => Ok(()),
            _ => Err(Error::Config(format!(
                "sampler: parameter tensor {t} stepped twice or out of range"
            ))),
        }
    }

    /// Updates θ_t in place from its final gradient.
    pub fn tensor(&mut self, t: usize, param: &Var, grad: &Tensor) -> Result<()> {
        self.check(t)?;
        self.step.step_tensor(t, param, grad)?;
        self.done[t] = true;
        Ok(())
    }

    /// Tensor t's update, lent for a kernel that updates it beside other samplers'
    /// tensors ([`TensorwiseStep::lend_update`]), if the sampler lends it.
    pub fn lend(&mut self, t: usize) -> Result<Option<LentUpdate<'_>>> {
        self.check(t)?;
        self.step.lend_update(t)
    }

    /// Tensor t was updated through its lent update, with these sums.
    pub fn lent(&mut self, t: usize, sums: TensorSums) -> Result<()> {
        self.check(t)?;
        self.step.lent_done(t, sums)?;
        self.done[t] = true;
        Ok(())
    }

    /// Whether the sampler wants the minibatch gradient's noise
    /// ([`TensorwiseStep::wants_gradient_noise`]).
    pub fn wants_gradient_noise(&self) -> bool {
        self.step.wants_gradient_noise()
    }

    /// Tensor t's tr V̂ for this update, before t is updated.
    pub fn gradient_noise(&mut self, t: usize, trace: f64) -> Result<()> {
        self.check(t)?;
        self.step.gradient_noise(t, trace)
    }

    /// Tensor t's update for its gradient's product to apply, if the sampler has one.
    pub fn inline(&mut self, t: usize) -> Result<Option<InlineUpdate<'_>>> {
        self.check(t)?;
        self.step.inline_update(t)
    }

    /// Tensor t was updated inline, with these sums.
    pub fn updated(&mut self, t: usize, sums: TensorSums) -> Result<()> {
        self.check(t)?;
        self.step.inline_done(t, sums)?;
        self.done[t] = true;
        Ok(())
    }

    /// Closes the update: an error unless every tensor was updated exactly once.
    pub fn finish(mut self) -> Result<()> {
        if !self.done.iter().all(|&d| d) {
            return Err(Error::Config(
                "sampler: an update ended before every parameter tensor was updated".into(),
            ));
        }
        self.closed = true;
        self.step.close_update()
    }
}

impl<S: TensorwiseStep + ?Sized> Drop for OpenUpdate<'_, S> {
    fn drop(&mut self) {
        if !self.closed {
            self.step.abandon_update();
        }
    }
}
