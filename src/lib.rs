//! `bnn`: Bayesian neural networks trained by stochastic-gradient MCMC on candle.
//!
//! Data flow of one training step: a minibatch gathered from the in-memory dataset
//! ([`data`]) goes through the network ([`model`]); the gradient of the scaled negative
//! log-posterior ([`potential`]) drives one update of a [`sampler`]; after burn-in, every
//! `thin` updates the parameters are saved as a posterior sample ([`checkpoint`]) and
//! folded into the Bayesian model average ([`ensemble`], [`metrics`]).

pub mod alloc;
pub mod atomic;
pub mod backprop;
pub mod bench;
pub mod checkpoint;
pub mod convergence;
pub mod data;
pub mod ensemble;
pub mod error;
pub mod eval;
pub mod inspect;
pub mod kernels;
pub mod metrics;
pub mod model;
pub mod plot;
pub mod pool;
pub mod potential;
pub mod predict;
pub mod ranks;
pub mod rng;
pub mod run_state;
pub mod sampler;
pub mod schedule;
pub mod settings;
pub mod signals;
pub mod synthetic;
pub mod train;
pub mod uncertainty;

pub use error::{Error, Result};
