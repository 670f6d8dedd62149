//! `bnn-core`: Bayesian neural networks by stochastic-gradient MCMC, as parts.
//!
//! Data flow of one training step: a minibatch gathered from the in-memory dataset
//! ([`data`]) goes through the network ([`model`], its hand-written backward in
//! [`backprop`]); the gradient of the scaled negative log-posterior ([`potential`]) drives
//! one update of a [`sampler`]; posterior samples are folded into the Bayesian model
//! average ([`ensemble`], [`metrics`], [`uncertainty`]).
//!
//! The samplers are also [`candle_nn::Optimizer`]s for any candle model
//! ([`sampler::optim`]). This crate sees no run folder, command line, plot or network:
//! those are `bnn-run`'s and the `bnn` binary's.

#![forbid(unsafe_code)]

// The floor below, under the names this crate's modules use (`crate::kernels::gemm`, …).
use bnn_kernels as kernels;
use bnn_kernels::{atomic, error, pool, rng};

pub use bnn_kernels::{Error, Result};

pub mod backprop;
pub mod convergence;
pub mod data;
pub mod ensemble;
pub mod metrics;
pub mod model;
pub mod potential;
pub mod sampler;
pub mod schedule;
pub mod synthetic;
pub mod uncertainty;
