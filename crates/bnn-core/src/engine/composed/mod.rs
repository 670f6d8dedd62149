//! The reference updates, composed from ordinary candle tensor ops (one op per term of
//! the papers' equations): what the fused kernels are checked against noise for noise.
//!
//! SGLD, SGHMC, SGNHT and mSGNHT are one sampler, [`super::dynamics::Dynamics`], which
//! defines each update once by its coefficients ([`crate::kernels::StepConsts`]) and lends
//! it tensor by tensor ([`crate::kernels::LentUpdate`]); [`interpret()`] ([`crate::kernels::update`]) applies a lent
//! update in candle ops, where the fused kernels apply it in one pass (the CPU op, the CUDA
//! kernel, the product's epilogue). The MAP baselines, which have no fused kernel, are
//! [`sgd`].

pub mod sgd;

pub use crate::kernels::update::interpret;
pub use sgd::ComposedSgd;
