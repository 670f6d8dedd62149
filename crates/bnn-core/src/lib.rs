//! `bnn-core`: Bayesian neural networks by stochastic-gradient MCMC, as parts.
//!
//! Data flow of one training step: a minibatch gathered from the in-memory dataset
//! ([`data`]) goes through the network ([`model`], its hand-written backward in
//! [`engine::backprop`]); the gradient of the scaled negative log-posterior ([`potential`]) drives
//! one update of a [`sampler`]; posterior samples are folded into the Bayesian model
//! average ([`ensemble`], [`metrics`], [`uncertainty`]).
//!
//! The samplers are also [`candle_nn::Optimizer`]s for any candle model
//! ([`optim`]). This crate sees no run folder, command line, plot or network:
//! those are `bnn-run`'s and the `bnn` binary's.
//!
//! **Start here.** The types a user of the optimizers needs are at the crate root:
//! the samplers as optimizers ([`Sgld`], [`Sghmc`], [`Sgnht`], [`Msgnht`]; [`Sgd`] and
//! [`Momentum`] as baselines), each with its own parameters ([`SghmcParams`], …) inside a
//! [`Config`] beside the [`Posterior`]; their saved [`OptimizerState`]; the streaming
//! ensembles ([`Accumulator`], [`RegressionAccumulator`]); a regression's
//! [`GaussianNoise`]; the helpers [`vars_by_name`] and [`init_seeded`]; sample files
//! ([`write_sample_file`], [`load_sample`]). What `bnn train` runs on (the hand-written
//! passes, the fused and composed updates, replica exchange) is in [`engine`].
//!
//! A two-layer `candle_nn` model of three classes, sampled by SGHMC as an optimizer, its
//! posterior samples averaged by the streaming ensemble:
//!
//! ```
//! use bnn_core::{init_seeded, vars_by_name, Accumulator, Config, Optimizer, Sghmc};
//! use candle_core::{DType, Device, Tensor};
//! use candle_nn::{linear, loss, ops, Module, VarBuilder, VarMap};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dev = Device::Cpu;
//! let varmap = VarMap::new();
//! let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
//! let (l1, l2) = (linear(2, 16, vb.pp("l1"))?, linear(16, 3, vb.pp("l2"))?);
//! init_seeded(&varmap, 1)?;
//! let model = |x: &Tensor| l2.forward(&l1.forward(x)?.tanh()?);
//! // Three clusters in the plane, one per class.
//! let labels: Vec<u32> = (0..60).map(|i| i % 3).collect();
//! let points: Vec<f32> = labels
//!     .iter()
//!     .enumerate()
//!     .flat_map(|(i, &y)| {
//!         let jitter = (i as f32 * 0.37).sin() * 0.3;
//!         [y as f32 * 2.0 - 2.0 + jitter, (y as f32 - 1.0).abs() + jitter]
//!     })
//!     .collect();
//! let x = Tensor::from_vec(points, (60, 2), &dev)?;
//! let y = Tensor::new(labels.as_slice(), &dev)?;
//!
//! let config = Config { seed: 7, ..Config::new(labels.len()) };
//! let mut sghmc = Sghmc::new(vars_by_name(&varmap)?, config)?;
//! let mut ensemble = Accumulator::with_classes(&labels, 3)?;
//! for step in 1..=200 {
//!     sghmc.backward_step(&loss::cross_entropy(&model(&x)?, &y)?)?;
//!     // After 100 updates of burn-in, a posterior sample every 20.
//!     if step > 100 && step % 20 == 0 {
//!         let p = ops::softmax_last_dim(&model(&x)?)?;
//!         ensemble.add(&p.flatten_all()?.to_vec1()?)?;
//!     }
//! }
//! assert_eq!(ensemble.samples(), 5);
//! let m = ensemble.metrics().expect("five samples");
//! assert!(m.nll.is_finite() && (0.0..=1.0).contains(&m.accuracy));
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]
#![forbid(unsafe_code)]

// The floor below, under the names this crate's modules use (`crate::kernels::gemm`, …).
use bnn_kernels as kernels;
use bnn_kernels::{atomic, error, pool, rng, signals};

pub use bnn_kernels::{Error, Result};

pub mod convergence;
pub mod data;
pub mod driver;
pub mod engine;
pub mod ensemble;
pub mod hmc;
pub mod likelihood;
pub mod metrics;
pub mod model;
pub mod optim;
pub mod potential;
pub mod regression;
pub mod sample_file;
pub mod sampler;
pub mod schedule;
pub mod synthetic;
pub mod uncertainty;
mod varmap;

pub use candle_nn::Optimizer;
pub use data::tabular::load_table;
pub use ensemble::Accumulator;
pub use likelihood::{GaussianNoise, Noise};
pub use metrics::{Label, Metrics};
// Each sampler's optimizer and its parameters (`Sgld`, `SgldParams`, …), from the one file
// that defines them.
pub use optim::params::*;
pub use optim::{Config, OptimizerState, Posterior, SgMcmc};
pub use potential::PriorSpec;
pub use regression::RegressionAccumulator;
pub use sample_file::{load_sample, write_sample_file, Sample};
pub use sampler::{Diagnostics, Integrator, Kernel, SamplerState};
pub use varmap::{init_seeded, vars_by_name};
