//! What `bnn train` runs on, beneath the optimizers: the hand-written passes of the
//! built-in networks ([`backprop`]), the SG-MCMC samplers' state and coefficients
//! ([`dynamics`]), lent to the fused kernels or to the composed reference updates they
//! are checked against ([`composed`]), and the noise-tolerant swap
//! test of replica exchange ([`exchange`]). A model of your own needs none of it: the
//! optimizers at the crate root build the right update themselves.

pub mod backprop;
pub mod composed;
pub mod dynamics;
pub mod exchange;
pub mod planned;
