//! `bnn-run`: runs of `bnn-core`'s samplers over a run folder. The training loop
//! ([`train`]: chains, replicas, resume after a kill), posterior-sample files and saved
//! states ([`checkpoint`], [`run_state`]), evaluation of a run's ensemble ([`eval`]), the
//! settings of a run ([`settings`]) and MPI ranks ([`ranks`]).

#![warn(missing_docs)]
#![forbid(unsafe_code)]

// The floors below, under the names this crate's modules use (`crate::data`, …).
use bnn_core::engine::backprop;
use bnn_core::{convergence, data, driver, engine, ensemble, metrics, model, potential, sampler};
use bnn_core::{hmc, likelihood, regression, schedule, uncertainty};
use bnn_kernels as kernels;
use bnn_kernels::{atomic, error, pool, rng, signals};

pub use bnn_kernels::{Error, Result};

pub mod band;
pub mod checkpoint;
pub mod compare;
pub mod eval;
pub mod progress;
pub mod ranks;
pub mod run_state;
pub mod settings;
pub mod train;
