//! `bnn`: Bayesian neural networks trained by stochastic-gradient MCMC on candle.
//!
//! The library is three crates, floor by floor: `bnn-kernels` (errors, noise, pool,
//! kernels) → `bnn-core` (data, models, potentials, samplers, the ensemble) → `bnn-run`
//! (the training loop over a run folder, checkpoints, evaluation, MPI ranks). This crate
//! is the `bnn` program: its command line, plots, `predict`, `inspect`, `bench` and the
//! HTTP transport for downloads; it re-exports the three floors under one name.

pub use bnn_kernels as kernels;
pub use bnn_kernels::{alloc, atomic, error, pool, rng, signals};
pub use bnn_kernels::{Error, Result};

pub use bnn_core::{convergence, data, driver, engine, ensemble, hmc, metrics, model, potential};
pub use bnn_core::{likelihood, regression, sampler, schedule, synthetic, uncertainty};

pub use bnn_run::{band, checkpoint, compare, eval, progress, ranks, run_state, settings, train};

pub mod bench;
pub mod http;
pub mod inspect;
pub mod picture;
pub mod plot;
pub mod predict;
pub mod terminal;
